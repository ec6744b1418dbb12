/*
 * cmd_loadbench.c - `ringtrain loadbench DATA`: runs the loader and the
 * batch ring with no compute behind them and reports what the input
 * pipeline can deliver: images/s, each stage's throughput and share of
 * time, batch-wait percentiles, scaling over worker counts, a one-line
 * verdict, an optional digest of every batch, and an optional JSON line.
 * Option parsing and printing only; the measurement is the loader's
 * rt_loadbench_run (loader/loadbench.h).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/common.h"
#include "loader/loadbench.h"
#include "loader/loader.h"
#include "loader/verdict.h"
#include "staging/ring.h"
#include "tools/cli.h"

#define MAX_WORKER_RUNS 32

struct lb_config {
    const char *data;
    struct rt_loader_opts lo;
    int worker_list[MAX_WORKER_RUNS];
    int nruns;
    uint32_t ring_slots;       /* 0 = workers + 2, at least 4 */
    enum rt_pin pin;
    double target;
    int digest, json;
    const char *aug;           /* --aug as given, NULL: the loader's default */
    int last;                  /* enum rt_last_batch, -1: the split's default */
    uint32_t image_size;
};

/* The per-rank rate of a `train --json` run: the last JSON line of `path`, its steady images/s (else its
 * images/s) over its world size. Says which on stdout. 0, or -errno with rt_errmsg() set. */
static int target_from_train(const char *path, double *out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return rt_errf(-errno, "not a number, and cannot open it as a train --json file: %s", strerror(errno));
    char *line = NULL, *last = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0)
        if (line[0] == '{') {
            free(last);
            last = strdup(line);
        }
    free(line);
    fclose(f);
    json_t *o = last ? json_loads(last, 0, NULL) : NULL;
    free(last);
    if (!o)
        return rt_errf(-EINVAL, "no JSON summary line in it (the output of `ringtrain train --json`)");
    json_t *ips = json_object_get(o, "steady_images_per_s");
    if (!json_is_number(ips))
        ips = json_object_get(o, "images_per_s");
    const json_int_t world = json_integer_value(json_object_get(o, "world_size"));
    const char *model = json_string_value(json_object_get(o, "model"));
    if (!json_is_number(ips) || world < 1) {
        json_decref(o);
        return rt_errf(-EINVAL, "its JSON line has no images_per_s and world_size: not `ringtrain train --json`");
    }
    *out = json_number_value(ips) / (double)world;
    printf("target: %.0f img/s per rank, the rate %s trained at on %d rank%s (%s)\n", *out, model ? model : "the model",
           (int)world, world > 1 ? "s" : "", path);
    json_decref(o);
    return 0;
}

/* --workers N or a list of counts to measure scaling over. */
static int parse_workers(const char *cmd, const char *s, void *cfg)
{
    struct lb_config *c = cfg;
    char buf[256], *save = NULL;
    snprintf(buf, sizeof(buf), "%s", s);
    c->nruns = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        long v = strtol(tok, &end, 10);
        if (*end || v < 1 || v > 1024 || c->nruns == MAX_WORKER_RUNS)
            return cli_usage_error(cmd, "--workers takes N or a list like 1,2,4 (1..1024), not '%s'", s);
        c->worker_list[c->nruns++] = (int)v;
    }
    return c->nruns ? 0 : cli_usage_error(cmd, "--workers needs a value");
}

/* --target: images per second, or the file of a `train --json` run whose rate the pipeline must feed. */
static int parse_target(const char *cmd, const char *arg, void *cfg)
{
    struct lb_config *c = cfg;
    char *end;
    c->target = strtod(arg, &end);
    if (*end && target_from_train(arg, &c->target) < 0)
        return cli_usage_error(cmd, "--target %s: %s", arg, rt_errmsg());
    if (!(c->target > 0))
        return cli_usage_error(cmd, "--target needs images per second or a train --json file, not '%s'", arg);
    return 0;
}

static const struct cli_choice splits[] = {
    {"train", RT_SPLIT_TRAIN, 0}, {"val", RT_SPLIT_VAL, 0}, {"test", RT_SPLIT_TEST, 0}, {NULL, 0, 0}};
static const struct cli_choice lasts[] = {{"drop", RT_LAST_DROP, 0}, {"pad", RT_LAST_PAD, 0}, {NULL, 0, 0}};
static const struct cli_choice ios[] = {{"auto", RT_IO_AUTO, 0}, {"uring", RT_IO_URING, 0},
                                        {"pread", RT_IO_PREAD, 0}, {"io_uring", RT_IO_URING, 1}, {NULL, 0, 0}};

#define F(member) CLI_FIELD(struct lb_config, member)
static const struct cli_opt loadbench_opts[] = {
    {.name = "batch-size", .arg = "B", .kind = CLI_UINT, F(lo.batch), .lo = 1, .hi = 1u << 20,
     .help = "samples per batch (default 256)"},
    {.name = "workers", .arg = "N|LIST", .kind = CLI_CUSTOM, .custom = parse_workers,
     .help = "decode/augment threads, or a comma list to measure scaling, e.g. 1,2,4\n"
             "(default: the CPUs this process may use)"},
    {.name = "epochs", .arg = "E", .kind = CLI_UINT, F(lo.epochs), .lo = 1, .hi = 1000000,
     .help = "epochs to run (default 3)"},
    {.name = "split", .arg = "S", .kind = CLI_CHOICE, F(lo.split), .choices = splits,
     .help = "train (default), val or test"},
    {.name = "aug", .arg = "SPEC", .kind = CLI_STR, F(aug),
     .help = "none, or a comma list of crop[=PAD], reflect, flip, alternate-flip,\n"
             "brightness=V, contrast=V, saturation=V, jitter=V, erase[=P[:SMIN:SMAX\n"
             "[:RMIN:RMAX]]], cutout=SIZE, crop-scale=SMIN:SMAX, crop-ratio=RMIN:RMAX,\n"
             "as train's --aug (default: train's --\n"
             "crop,flip for the train split of 3-channel data, none for val/test\n"
             "and other data)"},
    {.name = "image-size", .arg = "S", .kind = CLI_UINT, F(image_size), .lo = 1, .hi = 4096,
     .help = "datasets packed with --max-side: the S x S images the loader makes,\n"
             "RandomResizedCrop(S) + flip for train with crop, else Resize + CenterCrop"},
    {.name = "shuffle", .arg = "MODE", .kind = CLI_CHOICE, F(lo.shuffle), .choices = cli_shuffle_choices,
     .help = "exact (default: uniform, split held in RAM after the first read),\n"
             "window (stream blocks, shuffle within windows) or none"},
    {.name = "window-blocks", .arg = "K", .kind = CLI_UINT, F(lo.window_blocks), .lo = 1, .hi = 1u << 20,
     .help = "blocks per window with --shuffle window (default 64)"},
    {.name = "last", .arg = "drop|pad", .kind = CLI_CHOICE, F(last), .choices = lasts,
     .help = "last-batch policy (default drop for train, pad otherwise)"},
    {.name = "world", .arg = "W", .kind = CLI_UINT, F(lo.world), .lo = 1, .hi = 1u << 20,
     .help = "act as one rank of W (the sampler's share of the data; default 1)"},
    {.name = "rank", .arg = "R", .kind = CLI_UINT, F(lo.rank), .flags = CLI_CLAMP,
     .help = "which rank, 0 to W-1 (default 0)"},
    {.name = "grad-accum", .arg = "K", .kind = CLI_UINT, F(lo.accum), .lo = 1, .hi = 1u << 20,
     .help = "micro-batches per rank per update, as train's: which batches a rank\n"
             "gets of the epoch's global order (default 1)"},
    {.name = "seed", .arg = "S", .kind = CLI_UINT, F(lo.seed), .help = "shuffle and augmentation seed (default 0)"},
    {.name = "io", .arg = "auto|uring|pread", .kind = CLI_CHOICE, F(lo.io), .choices = ios,
     .help = "I/O engine (default auto: io_uring, else a pread pool)"},
    {.name = "queue-depth", .arg = "Q", .kind = CLI_UINT, F(lo.queue_depth), .lo = 1, .hi = 4096,
     .help = "reads in flight (default 32)"},
    {.name = "direct", .kind = CLI_FLAG, F(lo.direct), .help = "O_DIRECT reads (bypass the page cache)"},
    {.name = "ring-slots", .arg = "N", .kind = CLI_UINT, F(ring_slots), .lo = 2, .hi = 1024,
     .help = "batch slots in the ring (default workers + 2, at least 4)"},
    {.name = "pin", .kind = CLI_SET, F(pin), .set = RT_PIN_ON,
     .help = "require page-locked ring memory: stop with the fix when `ulimit -l` is\n"
             "too low (default: locked where allowed, else pageable and said)"},
    {.name = "no-pin", .kind = CLI_SET, F(pin), .set = RT_PIN_OFF, .help = "pageable ring memory"},
    {.name = "target", .arg = "IMG_PER_S|FILE", .kind = CLI_CUSTOM, .custom = parse_target,
     .help = "say whether the pipeline can feed this rate, or the rate a model\n"
             "trained at per rank: FILE is `ringtrain train --json` output (its last\n"
             "JSON line; steady images/s over the ranks)"},
    {.name = "digest", .kind = CLI_FLAG, F(digest),
     .help = "print one hex digest over every batch (images, labels, ids) in order"},
    {.name = "json", .kind = CLI_FLAG, F(json), .help = "end with one line holding a JSON summary"},
    CLI_HELP_ROW,
};
#undef F

static const struct cli_cmd loadbench_cli = {
    .name = "loadbench",
    .head = "Usage: ringtrain loadbench DATA [options]\n\n"
            "Runs the loader (reads, decompression, decode, augmentation) into the batch ring with no\n"
            "compute behind it, and reports images/s, each stage's throughput and share of time, the\n"
            "batch-wait percentiles, scaling over worker counts, and a verdict naming the limiting stage.\n\n"
            "Options:\n",
    .tail = "\nExamples:\n"
            "  $ ringtrain loadbench data/cifar10 --workers 1,2 --epochs 3 --target 50000 --digest\n"
            "  $ ringtrain loadbench data/cifar10 --workers 1 --epochs 1 --target run.out\n",
    .opts = loadbench_opts,
    .nopts = RT_ARRAY_LEN(loadbench_opts),
    .col = 28,
};

/* A stage's row of the report: its time, share and rate. */
struct stage_line {
    const char *name;
    double busy_s;     /* thread-seconds spent */
    double share;      /* of the run's worker (or wall) time */
    double rate;       /* per-core rate in the stage's unit */
    const char *unit;
};

static double per_s(double amount, uint64_t ns) { return ns ? amount / ((double)ns * 1e-9) : 0; }

/* The rows in rt_stage order (loader/verdict.h): the shares rt_stage_shares gave, the busy time and rate here. */
static void stage_lines(const struct rt_loadbench_result *r, const double share[RT_STAGE_N],
                        struct stage_line lines[RT_STAGE_N])
{
    const struct rt_loader_stats *s = &r->st;
    const struct {
        uint64_t ns;
        double amount;      /* what the rate counts (0: no rate) */
        const char *unit;
    } m[RT_STAGE_N] = {
        [RT_STAGE_IO] = {s->io_busy_ns, (double)s->io_bytes / 1e6, "MB/s"},
        [RT_STAGE_CHECKSUM] = {s->checksum_ns, (double)s->io_bytes / 1e6, "MB/s/core"},
        [RT_STAGE_DECOMPRESS] = {s->decompress_ns, (double)s->raw_bytes / 1e6, "MB/s/core"},
        [RT_STAGE_DECODE] = {s->decode_ns, (double)s->decoded_images, "img/s/core"},
        [RT_STAGE_AUGMENT] = {s->augment_ns, (double)s->images, "img/s/core"},
        [RT_STAGE_SLOT_WAIT] = {r->prod.total_ns, 0, ""},
        [RT_STAGE_RING_WAIT] = {r->cons.total_ns, 0, ""},
        [RT_STAGE_IDLE] = {s->worker_idle_ns, 0, ""},
    };
    for (int i = 0; i < RT_STAGE_N; i++)
        lines[i] = (struct stage_line){rt_stage_name((enum rt_stage)i, 0), (double)m[i].ns * 1e-9, share[i],
                                       m[i].amount > 0 ? per_s(m[i].amount, m[i].ns) : 0, m[i].unit};
}

/* The engine's stage verdict (rt_stage_limit), and with --target whether the loader can feed it. */
static void verdict(const struct lb_config *c, const struct rt_loadbench_result *r, const double share[RT_STAGE_N],
                    char *buf, size_t len)
{
    char what[256];
    rt_stage_limit(share, what, sizeof(what));
    if (c->target > 0) {
        const double have = r->steady_images_per_s;
        snprintf(buf, len, "%s; %s --target %.0f img/s (steady %.0f img/s, %.2fx)", what,
                 have >= c->target ? "can feed" : "CANNOT feed", c->target, have, have / c->target);
    } else {
        snprintf(buf, len, "%s", what);
    }
}

static double ms(uint64_t ns) { return (double)ns * 1e-6; }

static void print_json(const struct lb_config *c, const struct rt_loadbench_result *res, int nruns,
                       const struct stage_line lines[RT_STAGE_N])
{
    const struct rt_loadbench_result *r = &res[nruns - 1];
    printf("{\"images_per_s\":%.1f,\"end_to_end_images_per_s\":%.1f,\"workers\":%d,\"batch_size\":%" PRIu32
           ",\"epochs\":%" PRIu64 ",\"images\":%" PRIu64 ",\"batches\":%" PRIu64 ",\"wall_s\":%.4f"
           ",\"shuffle\":\"%s\",\"io\":\"%s\",\"queue_depth\":%" PRIu32 ",\"cpus\":%d,\"load_s\":%.4f"
           ",\"batch_wait_ms\":{\"p50\":%.4f,\"p99\":%.4f,\"max\":%.4f,\"epoch_start_max\":%.4f},\"stages\":{",
           r->steady_images_per_s, r->images_per_s, r->workers, c->lo.batch, c->lo.epochs, r->images, r->batches,
           r->wall_s, rt_shuffle_name(c->lo.shuffle), r->st.io_kind, r->st.queue_depth, rt_cpus_available(),
           (double)r->st.load_ns * 1e-9, ms(r->cons.p50_ns), ms(r->cons.p99_ns), ms(r->cons.max_ns),
           ms(r->boundary_wait_max_ns));
    for (int i = 0; i < RT_STAGE_N; i++)
        printf("%s\"%s\":{\"busy_s\":%.4f,\"share\":%.4f,\"rate\":%.1f,\"unit\":\"%s\"}", i ? "," : "",
               rt_stage_name((enum rt_stage)i, 1), lines[i].busy_s, lines[i].share, lines[i].rate, lines[i].unit);
    printf("},\"scaling\":[");
    for (int i = 0; i < nruns; i++)
        printf("%s{\"workers\":%d,\"images_per_s\":%.1f}", i ? "," : "", res[i].workers, res[i].steady_images_per_s);
    printf("]");
    if (c->digest)
        printf(",\"digest\":\"%s\"", r->digest);
    printf("}\n");
}

/* The rules between loadbench's options and its operand, once all are read; the defaults that follow from
 * them. 0, or RT_EXIT_USAGE after the message. *asked is the parsed --aug, when given. */
static int loadbench_check(int argc, char **argv, struct lb_config *c, struct rt_aug *asked)
{
    if (optind != argc - 1)
        return cli_usage_error("loadbench", optind == argc ? "DATA is required" : "exactly one DATA directory, please");
    if (c->lo.rank >= c->lo.world)
        return cli_usage_error("loadbench", "--rank must be below --world");
    c->data = argv[optind];
    if (c->aug && cli_parse_aug("loadbench", c->aug, asked))
        return RT_EXIT_USAGE;
    c->lo.last = c->last >= 0 ? (enum rt_last_batch)c->last
                              : c->lo.split == RT_SPLIT_TRAIN ? RT_LAST_DROP : RT_LAST_PAD;
    if (!c->nruns) {
        c->worker_list[0] = rt_cpus_available();
        c->nruns = 1;
    }
    return 0;
}

/* The line that says what is measured: the data, its shape, and the loader's options. */
static void print_setup(const struct lb_config *c, const struct rt_dataset_info *info)
{
    char augs[128], shape[64];
    rt_aug_describe(&c->lo.aug, augs, sizeof(augs));
    if (info->height)
        snprintf(shape, sizeof(shape), "%" PRIu32 "x%" PRIu32 "x%" PRIu32, info->channels, info->height, info->width);
    else
        snprintf(shape, sizeof(shape), "%" PRIu32 "x(own sizes, median %" PRIu32 "x%" PRIu32 ") -> %" PRIu32
                 "x%" PRIu32 "x%" PRIu32 " by %s", info->channels, info->size_median[0], info->size_median[1],
                 info->channels, c->image_size, c->image_size,
                 c->lo.crop == RT_CROP_RANDOM ? "RandomResizedCrop" : "Resize+CenterCrop");
    printf("loadbench: %s (%s split, %" PRIu64 " records, %s, %s codec), batch %" PRIu32
           ", %" PRIu64 " epoch%s, shuffle %s, last batch %s, aug %s, rank %" PRIu32 "/%" PRIu32 ", %d CPUs\n",
           c->data, rt_split_name(c->lo.split), info->split[c->lo.split].records, shape, rt_codec_name(info->codec),
           c->lo.batch, c->lo.epochs, c->lo.epochs == 1 ? "" : "s",
           rt_shuffle_name(c->lo.shuffle), c->lo.last == RT_LAST_PAD ? "pad" : "drop", augs, c->lo.rank, c->lo.world,
           rt_cpus_available());
    fflush(stdout);
}

/* The I/O engine and ring of the last run, then a row per worker count: rates, speedup, batch waits. */
static void print_runs(const struct lb_config *c, const struct rt_loadbench_result *res)
{
    const struct rt_loadbench_result *r = &res[c->nruns - 1];
    printf("io: %s, queue depth %" PRIu32 "%s%s%s; ring %" PRIu32 " slots, %.1f MiB %s\n", r->st.io_kind,
           r->st.queue_depth, r->st.fixed_files ? ", registered files" : "",
           r->st.fixed_buffers ? ", registered buffers" : "", r->st.direct ? ", O_DIRECT" : "", r->ring_slots,
           (double)r->ring_bytes / (1 << 20), r->ring_locked ? "page-locked" : "pageable");
    if (r->st.load_ns)
        printf("first read: %.3f s for the whole split (%.0f img/s, %.0f MB/s stored), then served from RAM\n",
               (double)r->st.load_ns * 1e-9, per_s((double)r->st.decoded_images, r->st.load_ns),
               per_s((double)r->st.io_bytes / 1e6, r->st.load_ns));
    printf("\n%7s %12s %12s %12s %8s   %s\n", "workers", "img/s", "steady img/s", "per worker", "speedup",
           "batch wait p50 / p99 / max (ms)");
    for (int i = 0; i < c->nruns; i++) {
        const struct rt_loadbench_result *x = &res[i];
        printf("%7d %12.0f %12.0f %12.0f %7.2fx   %.3f / %.3f / %.3f\n", x->workers, x->images_per_s,
               x->steady_images_per_s, x->steady_images_per_s / x->workers,
               res[0].steady_images_per_s > 0 ? x->steady_images_per_s / res[0].steady_images_per_s : 0,
               ms(x->cons.p50_ns), ms(x->cons.p99_ns), ms(x->cons.max_ns));
    }
    if (c->lo.epochs > 1)
        printf("epoch boundaries: first batch of epochs 2..%" PRIu64 " waited at most %.3f ms (steady p99 %.3f ms)\n",
               c->lo.epochs, ms(r->boundary_wait_max_ns), ms(r->cons.p99_ns));
}

/* The last run's stages and verdict, the digest and the JSON line. RT_EXIT_FAIL when the worker counts gave
 * different digests, else RT_EXIT_OK. */
static int print_stages(const struct lb_config *c, const struct rt_loadbench_result *res)
{
    const struct rt_loadbench_result *r = &res[c->nruns - 1];
    struct stage_line lines[RT_STAGE_N];
    double share[RT_STAGE_N];
    rt_stage_shares(&r->st, &r->prod, &r->cons, r->wall_s, share);
    stage_lines(r, share, lines);
    printf("\nstages (%d workers, %.2f s wall, %" PRIu64 " batches, %" PRIu64 " images):\n", r->workers, r->wall_s,
           r->batches, r->images);
    printf("  %-11s %10s %8s %16s\n", "stage", "busy s", "share", "rate");
    for (int i = 0; i < RT_STAGE_N; i++) {
        char rate[48] = "";
        if (lines[i].rate > 0)
            snprintf(rate, sizeof(rate), "%.0f %s", lines[i].rate, lines[i].unit);
        printf("  %-11s %10.3f %7.1f%% %16s\n", lines[i].name, lines[i].busy_s, 100 * lines[i].share, rate);
    }
    printf("  (io, slot wait -- the loader waiting for a free ring slot -- and ring wait -- the consumer waiting\n"
           "   for a batch -- are shares of wall time; the others of worker time = wall x workers)\n");
    char vbuf[512];
    verdict(c, r, share, vbuf, sizeof(vbuf));
    printf("verdict: %s\n", vbuf);
    int rc = RT_EXIT_OK;
    if (c->digest) {
        int same = 1;
        for (int i = 1; i < c->nruns; i++)
            same &= !strcmp(res[i].digest, res[0].digest);
        printf("digest: %s%s\n", r->digest,
               c->nruns > 1 ? (same ? " (identical for every worker count)" : " (DIFFERS between worker counts)") : "");
        if (!same)
            rc = RT_EXIT_FAIL;
    }
    if (c->json)
        print_json(c, res, c->nruns, lines);
    return rc;
}

/* The runs over ds, one per worker count, and their report. A CLI exit code. */
static int loadbench_run(struct lb_config *c, struct rt_dataset *ds, const struct rt_aug *asked)
{
    const struct rt_dataset_info *info = rt_dataset_info(ds);
    /* The augmentation and crop: --aug, or the loader's default for the split and data (train's). */
    if (rt_loader_opts_for(info, c->lo.split, asked, c->image_size, &c->lo) < 0)
        return cli_usage_error("loadbench", "%s", rt_errmsg());
    print_setup(c, info);
    struct rt_loadbench_result res[MAX_WORKER_RUNS];
    for (int i = 0; i < c->nruns; i++) {
        struct rt_loadbench_opts lo = {.lo = c->lo, .ring_slots = c->ring_slots, .pin = c->pin, .digest = c->digest};
        lo.lo.workers = c->worker_list[i];
        if (rt_loadbench_run(ds, &lo, &res[i]) < 0)
            return cli_fail();
    }
    print_runs(c, res);
    return print_stages(c, res);
}

int cmd_loadbench(int argc, char **argv)
{
    struct lb_config c = {.lo = {.batch = 256, .epochs = 3, .split = RT_SPLIT_TRAIN, .world = 1}, .pin = RT_PIN_AUTO,
                          .last = -1};
    struct rt_aug asked;
    struct rt_dataset *ds;
    int rc = cli_opts_parse(&loadbench_cli, argc, argv, &c);
    if (rc != CLI_PARSED)
        return rc;
    if (loadbench_check(argc, argv, &c, &asked))
        return RT_EXIT_USAGE;
    if (rt_dataset_open(c.data, &ds) < 0)
        return cli_fail();
    rc = loadbench_run(&c, ds, c.aug ? &asked : NULL);
    rt_dataset_close(ds);
    return rc;
}
