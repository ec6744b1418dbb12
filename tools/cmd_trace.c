/*
 * cmd_trace.c - `ringtrain trace merge -o OUT FILE...`: joins the per-rank
 * files of `train --trace FILE --trace-split rank` into the one file the
 * merged path writes: the same events, each rank's under its own pid and
 * tids, already on rank 0's clock, in rank order, and the same "otherData"
 * with the ranks' counts summed (rt_trace_write_tail).
 *
 * The part files' layout is tools/train/tracefile.c's (see its top): the
 * head `{"traceEvents":[` on a line of its own, the events one per line,
 * then "\n],\n" and a small tail whose "otherData.part" names the ranks and
 * the run. A JSON string never holds a raw newline (the writer escapes
 * control characters), so the last "\n],\n" of a file is where its events
 * end. The merge reads each file's tail first (the last 64 KiB), checks that
 * the files make up one run, then copies each file's events to the output
 * in blocks: memory stays at one block and the files' tails, however large
 * the parts.
 *
 * It does not check the events themselves (tools/check_trace.py does) and
 * shifts no clocks: the parts were rendered on rank 0's clock.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "common/trace.h"
#include "tools/cli.h"

#define PART_HEAD "{\"traceEvents\":[\n"
#define PART_END "\n],\n"
#define TAIL_MAX (64 * 1024)
#define COPY_BLOCK (1 << 20)

/* One input file: where its events are and what its tail says. */
struct part {
    const char *path;
    uint64_t begin, end;        /* the events: bytes [begin, end) */
    int *ranks, nranks;
    int world;
    char run[64], window[64];
    struct rt_trace_stats st;
};

static void usage(FILE *f)
{
    fprintf(f, "Usage: ringtrain trace merge -o OUT FILE...\n\n"
               "Joins the per-rank trace files of `ringtrain train --trace FILE` (written with --trace-split rank,\n"
               "or auto past 16 ranks or about 256 MB of trace: FILE.rankNNNNN.json) into one Chrome trace, the\n"
               "file one merged by rank 0 would be: every rank's events on rank 0's clock, in rank order. The files\n"
               "are copied one at a time, never held in memory whole. Every rank of the run is needed once,\n"
               "unless --partial.\n\n"
               "Options:\n"
               "  -o, --output OUT  the merged trace (written beside itself, renamed into place when whole)\n"
               "  --partial         join the ranks given even when others are missing (a few ranks of a large job)\n"
               "  -h, --help        print this help\n\n"
               "Examples:\n"
               "  $ mpirun -np 32 ringtrain train --data data/cifar10 --steps 20 --trace run.json\n"
               "  $ ringtrain trace merge -o run.json run.rank*.json\n"
               "  $ ringtrain trace merge --partial -o first8.json run.rank0000[0-7].json\n");
}

/* An unsigned count from the tail's otherData. */
static int tail_count(json_t *od, const char *key, const char *path, uint64_t *out)
{
    json_t *v = json_object_get(od, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return rt_errf(-EINVAL, "%s: otherData.%s is not a count", path, key);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* What the tail (the text after the events' "\n]") says, into p. */
static int parse_tail(struct part *p, const char *tail)
{
    json_error_t jerr;
    json_t *doc = json_loads(tail, 0, &jerr);
    if (!doc)
        return rt_errf(-EINVAL, "%s: the end of the file is not a trace's (%s)", p->path, jerr.text);
    int rc = 0;
    json_t *od = json_object_get(doc, "otherData"), *part = json_object_get(od, "part");
    json_t *ranks = json_object_get(part, "ranks"), *run = json_object_get(part, "run");
    json_t *world = json_object_get(od, "world"), *window = json_object_get(od, "step_window");
    if (!json_is_object(od) || !json_is_string(json_object_get(od, "tool")) ||
        strcmp(json_string_value(json_object_get(od, "tool")), "ringtrain")) {
        rc = rt_errf(-EINVAL, "%s: not a trace of `ringtrain train --trace` (no otherData.tool \"ringtrain\")",
                     p->path);
    } else if (!json_is_object(part)) {
        rc = rt_errf(-EINVAL, "%s: one trace for the whole run already (no otherData.part): only the per-rank "
                              "files of --trace-split rank are merged", p->path);
    } else if (!json_is_array(ranks) || !json_array_size(ranks) || !json_is_string(run) || !json_is_integer(world) ||
               json_integer_value(world) < 1 || json_integer_value(world) > 1 << 24 || !json_is_string(window)) {
        rc = rt_errf(-EINVAL, "%s: otherData.part needs ranks, run, and otherData a world and a step_window",
                     p->path);
    }
    if (!rc) {
        p->world = (int)json_integer_value(world);
        snprintf(p->run, sizeof(p->run), "%s", json_string_value(run));
        snprintf(p->window, sizeof(p->window), "%s", json_string_value(window));
        p->nranks = (int)json_array_size(ranks);
        p->ranks = rt_calloc((size_t)p->nranks, sizeof(*p->ranks), "a trace part's ranks");
        rc = p->ranks ? 0 : -ENOMEM;
        for (int i = 0; !rc && i < p->nranks; i++) {
            json_t *r = json_array_get(ranks, (size_t)i);
            if (!json_is_integer(r) || json_integer_value(r) < 0 || json_integer_value(r) >= p->world)
                rc = rt_errf(-EINVAL, "%s: otherData.part.ranks[%d] is not a rank of a world of %d", p->path, i,
                             p->world);
            else
                p->ranks[i] = (int)json_integer_value(r);
        }
    }
    if (!rc)
        rc = tail_count(od, "events", p->path, &p->st.events);
    if (!rc)
        rc = tail_count(od, "dropped_events", p->path, &p->st.dropped);
    if (!rc)
        rc = tail_count(od, "event_bytes", p->path, &p->st.bytes);
    if (!rc)
        rc = tail_count(od, "cap_bytes", p->path, &p->st.cap_bytes);
    json_decref(doc);
    return rc;
}

/* Reads a part's head and tail: where its events lie, and its otherData. */
static int part_open(struct part *p)
{
    FILE *f = fopen(p->path, "rb");
    if (!f)
        return rt_errf(-errno, "cannot read %s: %s", p->path, strerror(errno));
    int rc = 0;
    char head[sizeof(PART_HEAD)] = "", *buf = NULL;
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        rc = rt_errf(-errno, "%s: %s", p->path, strerror(errno));
        goto out;
    }
    const uint64_t size = (uint64_t)sb.st_size, hl = strlen(PART_HEAD);
    if (size < hl + strlen(PART_END) || fread(head, 1, hl, f) != hl || memcmp(head, PART_HEAD, hl)) {
        rc = rt_errf(-EINVAL, "%s: not a trace of `ringtrain train --trace` (it does not start with %.16s)",
                     p->path, PART_HEAD);
        goto out;
    }
    const uint64_t n = RT_MIN(size - hl, (uint64_t)TAIL_MAX), at = size - n;
    /* "{" before the tail's members makes it a JSON object of its own. */
    buf = rt_calloc(1, n + 2, "a trace file's tail");
    if (!buf) {
        rc = -ENOMEM;
        goto out;
    }
    if (fseeko(f, (off_t)at, SEEK_SET) != 0 || fread(buf + 1, 1, n, f) != n) {
        rc = rt_errf(-EIO, "reading %s: %s", p->path, ferror(f) ? strerror(errno) : "shorter than it was");
        goto out;
    }
    char *end = NULL;
    for (char *s = buf + 1; (s = strstr(s, PART_END)); s++)
        end = s;
    if (!end) {
        rc = rt_errf(-EINVAL, "%s: no end of the events (\"\\n],\") in its last %" PRIu64 " bytes: cut short?",
                     p->path, n);
        goto out;
    }
    p->begin = hl;
    p->end = at + (uint64_t)(end - (buf + 1));
    char *tail = end + 2; /* from the "," after "]" */
    *tail = '{';
    rc = parse_tail(p, tail);
out:
    free(buf);
    fclose(f);
    return rc;
}

/* Appends a part's events to `out`, in blocks. */
static int part_copy(const struct part *p, FILE *out, char *block)
{
    FILE *f = fopen(p->path, "rb");
    if (!f)
        return rt_errf(-errno, "cannot read %s: %s", p->path, strerror(errno));
    int rc = 0;
    if (fseeko(f, (off_t)p->begin, SEEK_SET) != 0)
        rc = rt_errf(-EIO, "reading %s: %s", p->path, strerror(errno));
    for (uint64_t left = p->end - p->begin; !rc && left;) {
        const size_t n = (size_t)RT_MIN(left, (uint64_t)COPY_BLOCK);
        if (fread(block, 1, n, f) != n)
            rc = rt_errf(-EIO, "reading %s: %s", p->path, ferror(f) ? strerror(errno) : "it changed while read");
        else if (fwrite(block, 1, n, out) != n)
            rc = rt_errf(-EIO, "writing the merged trace: %s", strerror(errno));
        left -= n;
    }
    fclose(f);
    return rc;
}

static int by_first_rank(const void *a, const void *b)
{
    const struct part *x = a, *y = b;
    return (x->ranks[0] > y->ranks[0]) - (x->ranks[0] < y->ranks[0]);
}

/* "3, 5-7": the ranks whose `have` is `want`, for a message. */
static void rank_list(const int *have, int world, int want, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = 0;
    for (int r = 0; r < world && at < len; r++) {
        if ((have[r] > 0) != want || (r > 0 && (have[r - 1] > 0) == want))
            continue;
        int e = r;
        while (e + 1 < world && (have[e + 1] > 0) == want)
            e++;
        int n = e > r ? snprintf(buf + at, len - at, "%s%d-%d", at ? ", " : "", r, e)
                      : snprintf(buf + at, len - at, "%s%d", at ? ", " : "", r);
        at += n > 0 ? (size_t)n : 0;
    }
}

/* The parts make up one run: the same run, world and window; no rank twice; every rank unless partial. */
static int parts_check(struct part *ps, int n, int partial, int *covered)
{
    const struct part *a = &ps[0];
    for (int i = 1; i < n; i++) {
        const struct part *p = &ps[i];
        if (strcmp(p->run, a->run) || p->world != a->world || strcmp(p->window, a->window))
            return rt_errf(-EINVAL, "%s and %s are from different runs (run %s, %d ranks, steps %s against run %s, "
                                    "%d ranks, steps %s): an earlier run's files left beside these?",
                           a->path, p->path, a->run, a->world, a->window, p->run, p->world, p->window);
    }
    int *owner = malloc((size_t)a->world * sizeof(*owner));
    if (!owner)
        return rt_errf(-ENOMEM, "no memory for %d ranks", a->world);
    for (int r = 0; r < a->world; r++)
        owner[r] = -1;
    int rc = 0;
    *covered = 0;
    for (int i = 0; !rc && i < n; i++)
        for (int k = 0; !rc && k < ps[i].nranks; k++) {
            const int r = ps[i].ranks[k];
            if (owner[r] >= 0)
                rc = rt_errf(-EINVAL, "rank %d is in both %s and %s", r, ps[owner[r]].path, ps[i].path);
            owner[r] = i;
            ++*covered;
        }
    if (!rc && !partial && *covered < a->world) {
        char missing[256];
        for (int r = 0; r < a->world; r++)
            owner[r] = owner[r] >= 0;
        rank_list(owner, a->world, 0, missing, sizeof(missing));
        rc = rt_errf(-ENOENT, "the run had %d ranks and no file was given for rank%s %s: give every rank's file, "
                              "or --partial for those given",
                     a->world, a->world - *covered > 1 ? "s" : "", missing);
    }
    free(owner);
    return rc;
}

/* The merged file, written beside `out` and renamed into place when whole. */
static int write_merged(const char *out, const struct part *ps, int n, const struct rt_trace_stats *sum)
{
    char tmp[4200];
    int fd, rc = rt_file_create_temp(out, tmp, sizeof(tmp), &fd);
    if (rc < 0)
        return rt_errf(rc, "cannot write the merged trace: %s", rt_errmsg());
    FILE *f = fdopen(fd, "w");
    char *block = malloc(COPY_BLOCK);
    if (!f || !block) {
        if (f)
            fclose(f);
        else
            close(fd);
        free(block);
        unlink(tmp);
        return rt_errf(-ENOMEM, "no memory to merge the trace");
    }
    rc = rt_trace_write_head(f);
    int wrote = 0;
    for (int i = 0; !rc && i < n; i++) {
        if (ps[i].end == ps[i].begin)
            continue;
        /* As the merged path joins the ranks' parts: ",\n" between them. */
        if (wrote && fputs(",\n", f) == EOF)
            rc = rt_errf(-EIO, "writing %s: %s", tmp, strerror(errno));
        if (!rc)
            rc = part_copy(&ps[i], f, block);
        wrote = 1;
    }
    if (!rc)
        rc = rt_trace_write_tail(f, ps[0].world, ps[0].window, sum);
    free(block);
    if (fclose(f) != 0 && !rc)
        rc = rt_errf(-EIO, "writing %s: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, out) != 0)
        rc = rt_errf(-errno, "renaming %s to %s: %s", tmp, out, strerror(errno));
    if (rc)
        unlink(tmp);
    return rc;
}

static int merge(const char *out, char **files, int n, int partial)
{
    struct part *ps = rt_calloc((size_t)n, sizeof(*ps), "the trace parts");
    if (!ps)
        return -ENOMEM;
    int rc = 0, covered = 0;
    for (int i = 0; !rc && i < n; i++) {
        ps[i].path = files[i];
        rc = part_open(&ps[i]);
    }
    if (!rc)
        rc = parts_check(ps, n, partial, &covered);
    struct rt_trace_stats sum = {0};
    if (!rc) {
        qsort(ps, (size_t)n, sizeof(*ps), by_first_rank);
        for (int i = 0; i < n; i++) {
            sum.events += ps[i].st.events;
            sum.dropped += ps[i].st.dropped;
            sum.bytes += ps[i].st.bytes;
        }
        /* The merged path states rank 0's cap: every rank has the same (--trace-mb). */
        sum.cap_bytes = ps[0].st.cap_bytes;
        rc = write_merged(out, ps, n, &sum);
    }
    if (!rc) {
        struct stat sb;
        const double mb = stat(out, &sb) == 0 ? (double)sb.st_size / 1e6 : 0;
        printf("trace: %s (%.1f MB, %" PRIu64 " events from %d of %d rank%s, %d file%s, optimizer steps %s)%s\n", out,
               mb, sum.events, covered, ps[0].world, ps[0].world > 1 ? "s" : "", n, n > 1 ? "s" : "", ps[0].window,
               sum.dropped ? "; events were dropped in the run (its --trace-mb was reached)" : "");
    }
    for (int i = 0; i < n; i++)
        free(ps[i].ranks);
    free(ps);
    return rc;
}

int cmd_trace(int argc, char **argv)
{
    enum { O_PARTIAL = 256 };
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        {"partial", no_argument, NULL, O_PARTIAL},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    const char *out = NULL;
    int partial = 0, ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'o': out = optarg; break;
        case O_PARTIAL: partial = 1; break;
        case 'h': usage(stdout); return RT_EXIT_OK;
        default: usage(stderr); return RT_EXIT_USAGE;
        }
    }
    if (optind >= argc)
        return cli_usage_error("trace", "what to do? ringtrain trace merge -o OUT FILE...");
    if (strcmp(argv[optind], "merge"))
        return cli_usage_error("trace", "unknown action '%s' (merge)", argv[optind]);
    optind++;
    if (!out)
        return cli_usage_error("trace", "merge needs -o OUT, the file to write");
    if (optind >= argc)
        return cli_usage_error("trace", "merge needs the per-rank files (FILE.rankNNNNN.json ...)");
    return merge(out, argv + optind, argc - optind, partial) < 0 ? cli_fail() : RT_EXIT_OK;
}
