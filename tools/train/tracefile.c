/*
 * tracefile.c - `train --trace FILE`: the recorder's life in the driver.
 * Started before the loader's threads so that they are named; opened for the
 * window of optimizer steps (--trace-steps); at the end every rank renders
 * its events on rank 0's clock, and then either rank 0 writes one file,
 * receiving the ranks' parts one at a time (merged), or every rank writes its
 * own part to FILE.rankNNNNN.json (rank), which `ringtrain trace merge`
 * (tools/cmd_trace.c) joins later into the file the merged path writes.
 *
 * Clocks: each rank reads its clock just after the run's last collective
 * (train_finish's); the ranks leave a collective within microseconds of each
 * other, so rank 0's reading minus a rank's is that rank's offset. Rank 0
 * broadcasts its reading and its recorder's start (the file's time base):
 * that is all a rank needs to render its part, whichever way it is written.
 * The "run end" mark on every rank sits at that moment.
 *
 * A part file is a whole Chrome trace of its own (it opens in Perfetto alone,
 * on rank 0's clock) whose "otherData" holds what the merge needs: the world,
 * the step window, the part's own event counts, and "part":
 * {"ranks": [r], "run": id, "shift_ns", "base_ns"} -- the ranks it holds, the
 * run it belongs to (rank 0's clock readings, the same in every part), and
 * the offset already applied to its times. Its events are rendered exactly
 * as the merged path renders them, so a merge that copies them in rank order
 * writes the same bytes.
 *
 * Also the GPU's counters (NVML), which go to the trace as counters and to
 * the epoch line.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "common/trace.h"
#include "tools/train/driver.h"

/*
 * When --trace-split auto writes one file per rank instead of one for the job:
 *   - more than 16 ranks (two nodes of 8 GPUs): the merged file is gathered
 *     through rank 0 one rank at a time while every other rank waits, so its
 *     cost grows with the world; one file per rank is written by all ranks at
 *     once. Past 16 ranks of 10 or more tracks each, one timeline is also past
 *     what one reads in one window; `trace merge --partial` joins the ranks
 *     in question.
 *   - or about 256 MiB of JSON in all: chrome://tracing reads a file as one
 *     JavaScript string, which V8 caps at 2^29 - 24 characters (512 MiB), and
 *     the Perfetto UI holds the file and its parse in one tab; 256 MiB leaves
 *     room for the estimate below being short.
 * One rank writes one file either way: its part would be the whole trace.
 * The size is estimated before anything is rendered, from the events recorded
 * over all ranks: RENDERED_EVENT_BYTES per event. The files of
 * tests/test_trace_run.sh's runs hold 96 (1 rank, the whole run) and 118
 * (2 ranks, steps 2:6) bytes per event, the track names included; 160 leaves
 * room for longer labels and the buckets' async spans, which are written as
 * two events, so that the estimate errs towards splitting.
 */
#define SPLIT_AUTO_RANKS 16
#define SPLIT_AUTO_BYTES ((uint64_t)256 << 20)
#define RENDERED_EVENT_BYTES 160

int tracefile_create(struct train *T)
{
    const struct train_cfg *c = &T->cfg;
    if (!c->trace)
        return 0;
    char host[64] = "?", name[128];
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = 0;
    snprintf(name, sizeof(name), "rank %d (%s)", T->rank, host);
    struct rt_trace_opts o = {.cap_bytes = (size_t)(c->trace_mb * 1048576.0), .pid = T->rank, .process = name};
    const int rc = rt_trace_create(&o, &T->tr.rec);
    if (rc < 0)
        return rc;
    rt_trace_thread_name("training", 0);
    return 0;
}

void tracefile_window(struct train *T, uint64_t update, int begin)
{
    const struct train_cfg *c = &T->cfg;
    if (!T->tr.rec)
        return;
    if (begin)
        rt_trace_set_recording(T->tr.rec, c->trace_all || (update >= c->trace_first && update < c->trace_last));
    else if (!c->trace_all && update >= c->trace_last)
        rt_trace_set_recording(T->tr.rec, 0);
}

/*
 * A trace file, written beside its final name and renamed when whole. The
 * temporary file is a new one of a name nobody can predict
 * (rt_file_create_temp), so a link planted beside the trace is never written
 * through; the rename replaces whatever the final name was, a link included.
 */
struct trace_out {
    FILE *f;
    const char *path;
    char tmp[4200];
};

static int out_open(struct trace_out *o, const char *path)
{
    int fd, made = rt_file_create_temp(path, o->tmp, sizeof(o->tmp), &fd);
    o->path = path;
    o->f = NULL;
    if (made < 0)
        return rt_errf(made, "cannot write the trace: %s", rt_errmsg());
    o->f = fdopen(fd, "w");
    if (!o->f) {
        const int e = errno;
        close(fd);
        unlink(o->tmp);
        return rt_errf(-e, "cannot write the trace %s: %s", o->tmp, strerror(e));
    }
    return 0;
}

/* Closes the file and renames it to its final name when rc is 0 (else removes it). Returns rc, or the
 * error of the close or the rename. */
static int out_close(struct trace_out *o, int rc)
{
    if (fclose(o->f) != 0 && !rc)
        rc = rt_errf(-EIO, "writing the trace %s: %s", o->tmp, strerror(errno));
    if (!rc && rename(o->tmp, o->path) != 0)
        rc = rt_errf(-errno, "renaming %s to %s: %s", o->tmp, o->path, strerror(errno));
    if (rc)
        unlink(o->tmp);
    return rc;
}

/* Rank 0, merged: the whole file, its own part first, then each rank's as it receives them. */
static int write_merged(struct train *T, uint64_t base, const struct rt_trace_stats *sum, const char *window)
{
    struct trace_out o;
    int rc = out_open(&o, T->cfg.trace);
    if (rc < 0)
        return rc;
    rc = rt_trace_write_head(o.f);
    if (!rc)
        rc = rt_trace_render(T->tr.rec, o.f, 0, 0, base);
    for (int r = 1; r < T->world; r++) {
        uint64_t len = 0;
        rt_comm_gather_one(T->comm, r, &len, sizeof(len), "the trace's size");
        char *buf = len ? malloc(len) : NULL;
        if (len && !buf) {
            /* The caller ends the job: rank r waits to send. */
            out_close(&o, -ENOMEM);
            return rt_errf(-ENOMEM, "out of memory for rank %d's trace (%" PRIu64 " bytes)", r, len);
        }
        rt_comm_gather_one(T->comm, r, buf, len, "the trace");
        if (!rc && len && fwrite(buf, 1, len, o.f) != len)
            rc = rt_errf(-EIO, "writing the trace %s: %s", o.tmp, strerror(errno));
        free(buf);
    }
    if (!rc)
        rc = rt_trace_write_tail(o.f, T->world, window, sum);
    return out_close(&o, rc);
}

/* Another rank, merged: its part, rendered on rank 0's clock, sent when rank 0 asks for it. */
static int send_part(struct train *T, int64_t shift, uint64_t base)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int rc = f ? rt_trace_render(T->tr.rec, f, 1, shift, base) : rt_errf(-ENOMEM, "no memory for the trace");
    if (f && fclose(f) != 0 && !rc)
        rc = rt_errf(-ENOMEM, "no memory for the trace");
    uint64_t n = rc ? 0 : (uint64_t)len;
    /* Rank 0 waits for this part whatever happened here: an empty part keeps the order. */
    for (int r = 1; r < T->world; r++) {
        rt_comm_gather_one(T->comm, r, &n, sizeof(n), "the trace's size");
        rt_comm_gather_one(T->comm, r, r == T->rank ? buf : NULL, r == T->rank ? n : 0, "the trace");
    }
    free(buf);
    return rc;
}

/*
 * Rank `rank`'s part file: `path` with ".rankNNNNN" before its extension (the
 * last dot of the file's name, not of a directory's): trace.json ->
 * trace.rank00007.json, trace -> trace.rank00007. rank < 0: the shell pattern
 * of them all, trace.rank*.json. Returns 0 or -ENAMETOOLONG.
 */
static int part_path(const char *path, int rank, char *out, size_t len)
{
    const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
    const char *dot = strrchr(name, '.');
    if (!dot || dot == name)
        dot = name + strlen(name);
    char num[16];
    if (rank < 0)
        snprintf(num, sizeof(num), "*");
    else
        snprintf(num, sizeof(num), "%05d", rank);
    const int n = snprintf(out, len, "%.*s.rank%s%s", (int)(dot - path), path, num, dot);
    if (n < 0 || (size_t)n >= len)
        return rt_errf(-ENAMETOOLONG, "the trace's name %s is too long for its per-rank files", path);
    return 0;
}

/* Every rank, split: its part as a file of its own (see the top of this file). */
static int write_own(struct train *T, const char *path, int64_t shift, uint64_t base,
                     const struct rt_trace_stats *st, const char *window, const uint64_t clock0[2])
{
    struct trace_out o;
    int rc = out_open(&o, path);
    if (rc < 0)
        return rc;
    rc = rt_trace_write_head(o.f);
    if (!rc)
        rc = rt_trace_render(T->tr.rec, o.f, 0, shift, base);
    if (!rc) {
        /* rt_trace_write_tail's members, then the part's. */
        fprintf(o.f,
                "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"tool\":\"ringtrain\",\"world\":%d,"
                "\"step_window\":\"%s\",\"events\":%" PRIu64 ",\"dropped_events\":%" PRIu64 ",\"event_bytes\":%" PRIu64
                ",\"cap_bytes\":%" PRIu64 ",\n\"part\":{\"ranks\":[%d],\"run\":\"%" PRIx64 "-%" PRIx64
                "\",\"shift_ns\":%" PRId64 ",\"base_ns\":%" PRIu64 "}}}\n",
                T->world, window, st->events, st->dropped, st->bytes, st->cap_bytes, T->rank, clock0[1], clock0[0],
                shift, base);
        if (ferror(o.f))
            rc = rt_errf(-EIO, "writing the trace %s: %s", o.tmp, strerror(errno));
    }
    return out_close(&o, rc);
}

/* `s` for a shell line: as it is when it holds nothing a shell reads, else in single quotes. Where `glob`,
 * the "*" of a part pattern stays outside the quotes. */
static void shell_word(FILE *f, const char *s, int glob)
{
    if (strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+./:@%,=*") == strlen(s)) {
        fputs(s, f);
        return;
    }
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'')
            fputs("'\\''", f);
        else if (glob && *s == '*')
            fputs("'*'", f);
        else
            fputc(*s, f);
    }
    fputc('\'', f);
}

/* Every rank, split: each writes its part; rank 0 says where they are and how to merge them. */
static int write_split(struct train *T, int64_t shift, uint64_t base, const struct rt_trace_stats *st,
                       const struct rt_trace_stats *sum, const char *window, const uint64_t clock0[2],
                       const char *why)
{
    char path[4200];
    int rc = part_path(T->cfg.trace, T->rank, path, sizeof(path));
    if (!rc)
        rc = write_own(T, path, shift, base, st, window, clock0);
    struct stat sb;
    /* How the ranks fared, for rank 0's line: failures, and the files' bytes. */
    uint64_t v[2] = {rc ? 1 : 0, !rc && stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0};
    rt_comm_allreduce(T->comm, v, 2, RT_COMM_U64, RT_RED_SUM, "the trace files");
    if (rc < 0)
        return rc;
    T->tr.file_bytes = v[1];
    T->tr.files = T->world;
    part_path(T->cfg.trace, -1, T->tr.pattern, sizeof(T->tr.pattern));
    if (!T->root)
        return 0;
    if (v[0])
        return rt_errf(-EIO, "%" PRIu64 " of %d ranks could not write their trace files (their messages above)",
                       v[0], T->world);
    char first[4200], last[4200], pattern[4200];
    part_path(T->cfg.trace, 0, first, sizeof(first));
    part_path(T->cfg.trace, T->world - 1, last, sizeof(last));
    part_path(T->cfg.trace, -1, pattern, sizeof(pattern));
    printf("trace: %d files, one per rank%s: %s to %s (%.1f MB in all, %" PRIu64 " events from %d rank%s, "
           "optimizer steps %s); event memory %.1f of %.0f MiB per rank, %" PRIu64 " events dropped%s\n",
           T->world, why, first, last, (double)v[1] / 1e6, sum->events, T->world, T->world > 1 ? "s" : "", window,
           (double)st->bytes / 1048576.0, (double)st->cap_bytes / 1048576.0, sum->dropped,
           sum->dropped ? " (the cap was reached: raise --trace-mb or narrow --trace-steps)" : "");
    printf("trace: to merge them into one file: ringtrain trace merge -o ");
    shell_word(stdout, T->cfg.trace, 0);
    fputc(' ', stdout);
    shell_word(stdout, pattern, 1);
    fputc('\n', stdout);
    fflush(stdout);
    return 0;
}

int tracefile_finish(struct train *T, uint64_t t_end)
{
    struct train_trace *t = &T->tr;
    if (!t->rec)
        return 0;
    rt_trace_set_recording(t->rec, 0);
    rt_trace_mark(RT_TRACE_STEP, "run end", t_end);
    /* The loader's threads record nothing more once they are gone. */
    input_destroy(T);
    /* Rank 0's end and start: every rank's offset and the file's base (a broadcast, whatever the world). */
    uint64_t clock0[2] = {t_end, rt_trace_created_ns(t->rec)};
    rt_comm_broadcast(T->comm, clock0, sizeof(clock0), 0, "the trace's clocks");
    const uint64_t base = clock0[1];
    const int64_t shift = (int64_t)(clock0[0] - t_end);
    struct rt_trace_stats st, sum;
    rt_trace_get_stats(t->rec, &st);
    uint64_t v[3] = {st.events, st.dropped, st.bytes};
    rt_comm_allreduce(T->comm, v, 3, RT_COMM_U64, RT_RED_SUM, "the trace's counts");
    sum = (struct rt_trace_stats){.events = v[0], .dropped = v[1], .bytes = v[2], .cap_bytes = st.cap_bytes};
    char window[64];
    if (T->cfg.trace_all)
        snprintf(window, sizeof(window), "all");
    else
        snprintf(window, sizeof(window), "%" PRIu64 ":%" PRIu64, T->cfg.trace_first, T->cfg.trace_last);
    /* Every rank decides alike: the world and the summed counts are the same everywhere. */
    enum train_trace_split mode = T->cfg.trace_split;
    char why[96] = "";
    const uint64_t estimate = sum.events * RENDERED_EVENT_BYTES;
    if (mode == TRACE_SPLIT_AUTO) {
        mode = TRACE_SPLIT_MERGED;
        if (T->world > SPLIT_AUTO_RANKS) {
            mode = TRACE_SPLIT_RANK;
            snprintf(why, sizeof(why), " (more than %d ranks)", SPLIT_AUTO_RANKS);
        } else if (T->world > 1 && estimate > SPLIT_AUTO_BYTES) {
            mode = TRACE_SPLIT_RANK;
            snprintf(why, sizeof(why), " (about %.0f MB in one file: past %.0f MB)", (double)estimate / 1e6,
                     (double)SPLIT_AUTO_BYTES / 1e6);
        }
    }
    if (mode == TRACE_SPLIT_RANK)
        return write_split(T, shift, base, &st, &sum, window, clock0, why);
    const int rc = T->root ? write_merged(T, base, &sum, window) : send_part(T, shift, base);
    if (rc < 0)
        return rc;
    if (T->root) {
        struct stat sb;
        t->file_bytes = stat(T->cfg.trace, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        printf("trace: %s (%.1f MB, %" PRIu64 " events from %d rank%s, optimizer steps %s); event memory %.1f of "
               "%.0f MiB per rank, %" PRIu64 " events dropped%s\n",
               T->cfg.trace, (double)t->file_bytes / 1e6, sum.events, T->world, T->world > 1 ? "s" : "", window,
               (double)st.bytes / 1048576.0, (double)st.cap_bytes / 1048576.0, sum.dropped,
               sum.dropped ? " (the cap was reached: raise --trace-mb or narrow --trace-steps)" : "");
        fflush(stdout);
    }
    return 0;
}

/* The sampler thread's readings as the trace's counters (no-ops unless recording). */
static void gpu_sample(void *ctx, const struct rt_nvml_reading *r)
{
    static __thread int named;
    (void)ctx;
    if (!named) {
        rt_trace_thread_name("gpu counters (NVML)", 8);
        named = 1;
    }
    const uint64_t t = (uint64_t)(r->t_s * 1e9);
    if (r->valid_mask & RT_NVML_UTIL)
        rt_trace_counter("gpu utilisation %", r->util_gpu_pct, t);
    if (r->valid_mask & RT_NVML_MEM)
        rt_trace_counter("gpu memory used GiB", (double)r->mem_used_bytes / 1073741824.0, t);
    if (r->valid_mask & RT_NVML_POWER)
        rt_trace_counter("gpu power W", r->power_w, t);
    if (r->valid_mask & RT_NVML_SM_CLOCK)
        rt_trace_counter("gpu SM clock MHz", r->sm_clock_mhz, t);
}

void tracefile_gpu_create(struct train *T)
{
    const char *bus = rt_backend_pci_bus_id(T->be);
    if (!bus)
        return;
    struct rt_nvml_sampler_opts o = {.pci_bus_id = bus, .period_ms = 1000, .on_sample = gpu_sample};
    if (rt_nvml_sampler_create(&o, &T->gpu) < 0)
        T->gpu = NULL; /* no NVML here: no counters, and nothing said */
}

void tracefile_gpu_destroy(struct train *T)
{
    rt_nvml_sampler_destroy(T->gpu);
    T->gpu = NULL;
}

void tracefile_destroy(struct train *T)
{
    rt_trace_destroy(T->tr.rec);
    T->tr.rec = NULL;
}
