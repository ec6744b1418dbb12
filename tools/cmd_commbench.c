/*
 * cmd_commbench.c - `ringtrain commbench`: nccl-tests' all_reduce_perf for
 * this stack. It all-reduces (sum of floats, in place) messages of growing
 * size on the two paths training uses -- rt_comm_allreduce (host memory, MPI
 * through the comm thread: validation metrics) and the gradient bucketer
 * (one bucket of the message size: begin, ready, finish; through NCCL over
 * device memory on GPUs) -- and prints nccl-tests' columns: time per
 * iteration averaged over iterations and ranks, algbw = size / time,
 * busbw = algbw * 2(n-1)/n, and #wrong, the elements whose sum came back
 * wrong. Then whether a gradient bucket of --bucket-mb reaches the bandwidth
 * the link gives at any size.
 *
 * Every size is checked, as nccl-tests checks: rank r holds
 * (r % 16 + 1) * (i % 7 + 1) at element i, small integers whose sum over the
 * ranks is exact in floats in any order of summation (up to some 280,000
 * ranks), and the buffer is filled again before every iteration (outside the
 * timed part), so that after the last one every element must equal the sum
 * exactly. A wrong element anywhere makes the exit code 1.
 *
 * It measures; it does not tune. Only the library's public calls are used:
 * what it times is what training runs. Only rank 0 prints.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/common.h"
#include "compute/compute.h"
#include "tools/cli.h"

#define CB_TILE (7 * 4096)                     /* floats: whole periods of the pattern */
#define CB_MAX_BYTES ((uint64_t)4 << 30)       /* the bucketer's limit for one tensor (2^30 floats) */
#define CB_MAX_SIZES 64
#define CB_REACH 0.8                           /* "reaches the link's bandwidth": this share of the best busbw */
#define CB_HOST_LEN 64

enum cb_path { CB_COMM = 0, CB_BUCKETER, CB_NPATHS };
static const char *const cb_path_names[CB_NPATHS] = {"comm", "bucketer"};

struct cb_config {
    uint64_t min_bytes, max_bytes;   /* multiples of 4 */
    uint64_t factor, warmup, iters;
    uint64_t bucket_bytes;           /* the gradient bucket the last line judges */
    double bucket_mb;
    unsigned paths;                  /* bit 1 << enum cb_path */
    enum train_device device;
    const char *json;                /* NULL: none; "-": the last line of stdout */
    int corrupt;                     /* test hook, see cb_plant_fault() */
};

/* One line of the table: a path at one size, over all ranks. */
struct cb_row {
    enum cb_path path;
    uint64_t bytes;
    double time_us, max_time_us;     /* per iteration: the mean over ranks, and the slowest rank's */
    double algbw, busbw;             /* GB/s (1e9 bytes), from the mean time */
    uint64_t wrong;                  /* elements that came back wrong, summed over ranks */
};

struct cb_bench {
    const struct cb_config *cfg;
    struct rt_comm *c;
    int rank, world;
    struct rt_backend *be;           /* the bucketer's GPU in NCCL mode, else NULL */
    struct rt_nccl *nccl;
    float *host;                     /* max_bytes: the comm path's buffer (and the bucketer's on the CPU) */
    float *dev, *dev_pattern;        /* NCCL mode, max_bytes each: the bucketer's buffer, this rank's pattern */
    float pattern[CB_TILE];          /* this rank's values for elements 0.. (period 7) */
    float expect[CB_TILE];           /* their sums over the ranks */
    uint64_t step;
    FILE *json;                      /* rank 0 with --json FILE */
    char cpu[128];
    char *hosts;                     /* world x CB_HOST_LEN: each rank's host name */
};

static void commbench_help(void)
{
    printf("Usage: ringtrain commbench [options]\n"
           "  or:  mpirun -np N ringtrain commbench [options]\n\n"
           "Measures the all-reduce (sum of floats, in place) as nccl-tests' all_reduce_perf does, on the\n"
           "paths training uses, over message sizes from --min-bytes to --max-bytes: warm-up iterations,\n"
           "then timed ones. time: per iteration, averaged over the iterations, then over the ranks\n"
           "(maxtime: the slowest rank's); algbw = size / time; busbw = algbw * 2(n-1)/n, what each\n"
           "rank's link carries (0 for one rank). Every size is checked: rank r holds (r%%16+1)*(i%%7+1)\n"
           "at element i, whose sum is exact in floats; after the last timed iteration every element is\n"
           "compared and #wrong counts the wrong ones over all ranks (any: exit 1). The last line says\n"
           "whether a gradient bucket of --bucket-mb reaches %.0f%% of the best busbw measured. Only rank 0\n"
           "prints. Alone it is one rank; under mpirun -np N (or srun --mpi=pmix), N ranks.\n\n"
           "Options:\n"
           "  --path P          comm, bucketer or both (default both). comm: rt_comm_allreduce, host memory,\n"
           "                    MPI through the comm thread (what validation metrics use). bucketer: the\n"
           "                    gradient bucketer with one bucket of the message size: begin, ready, finish\n"
           "                    (what gradients use; it also OR-s the step's control word, as every step does)\n"
           "  --device D        auto (default: the GPU when there is one and NCCL loads), cpu or cuda:\n"
           "                    where the bucketer's buffer lives; on cuda it all-reduces device memory\n"
           "                    through NCCL, one GPU per rank. The comm path is host memory either way.\n"
           "  --min-bytes S     smallest message (default 1K); sizes take K, M, G (powers of 1024)\n"
           "  --max-bytes S     largest message (default 256M, at most 4G)\n"
           "  --factor F        each size is F times the one before (default 2)\n"
           "  --warmup N        untimed iterations per size (default 5)\n"
           "  --iters N         timed iterations per size (default 20)\n"
           "  --bucket-mb MB    the gradient bucket size to judge, in MiB (default 25, as train's\n"
           "                    --bucket-cap-mb); measured as a size of its own when inside the range\n"
           "  --json [FILE]     the header and one object per path and size as JSON, to FILE, or as the\n"
           "                    last line of stdout (times in us, bandwidths in GB/s)\n"
           "  -h, --help        print this help\n\n"
           "Examples:\n"
           "  $ ringtrain commbench --max-bytes 1M\n"
           "  $ mpirun -np 2 ringtrain commbench --path bucketer --json bench.json\n",
           100 * CB_REACH);
}

/* ---- options ----------------------------------------------------------------------------- */

static int parse_bytes(const char *opt, const char *s, uint64_t *out)
{
    uint64_t v;
    if (rt_parse_size(s, &v) < 0 || v < sizeof(float) || v > CB_MAX_BYTES)
        return cli_usage_error("commbench", "%s needs a size from 4 to 4G such as 1K, 25M or 256M, got '%s'", opt, s);
    *out = v / sizeof(float) * sizeof(float); /* whole floats, as nccl-tests rounds to its element type */
    return 0;
}

static int parse_count(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (cli_parse_u64("commbench", opt, s, out))
        return RT_EXIT_USAGE;
    if (*out < lo || *out > hi)
        return cli_usage_error("commbench", "%s must be in %" PRIu64 "..%" PRIu64, opt, lo, hi);
    return 0;
}

/* Returns 0, RT_EXIT_OK + 1 for --help (printed), or RT_EXIT_USAGE (printed). */
static int parse_options(int argc, char **argv, struct cb_config *c)
{
    enum { O_MIN = 256, O_MAX, O_FACTOR, O_WARMUP, O_ITERS, O_PATH, O_DEVICE, O_BUCKET, O_JSON, O_HELP };
    static const struct option opts[] = {
        {"min-bytes", required_argument, NULL, O_MIN},   {"max-bytes", required_argument, NULL, O_MAX},
        {"factor", required_argument, NULL, O_FACTOR},   {"warmup", required_argument, NULL, O_WARMUP},
        {"iters", required_argument, NULL, O_ITERS},     {"path", required_argument, NULL, O_PATH},
        {"device", required_argument, NULL, O_DEVICE},   {"bucket-mb", required_argument, NULL, O_BUCKET},
        {"json", optional_argument, NULL, O_JSON},       {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0}};
    *c = (struct cb_config){.min_bytes = 1024, .max_bytes = (uint64_t)256 << 20, .factor = 2, .warmup = 5,
                            .iters = 20, .bucket_mb = 25, .paths = (1u << CB_COMM) | (1u << CB_BUCKETER),
                            .device = DEVICE_AUTO};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case O_MIN:
            if (parse_bytes("--min-bytes", optarg, &c->min_bytes))
                return RT_EXIT_USAGE;
            break;
        case O_MAX:
            if (parse_bytes("--max-bytes", optarg, &c->max_bytes))
                return RT_EXIT_USAGE;
            break;
        case O_FACTOR:
            if (parse_count("--factor", optarg, 2, 1024, &c->factor))
                return RT_EXIT_USAGE;
            break;
        case O_WARMUP:
            if (parse_count("--warmup", optarg, 0, 1000000, &c->warmup))
                return RT_EXIT_USAGE;
            break;
        case O_ITERS:
            if (parse_count("--iters", optarg, 1, 1000000, &c->iters))
                return RT_EXIT_USAGE;
            break;
        case O_PATH:
            if (!strcmp(optarg, "comm"))
                c->paths = 1u << CB_COMM;
            else if (!strcmp(optarg, "bucketer"))
                c->paths = 1u << CB_BUCKETER;
            else if (!strcmp(optarg, "both"))
                c->paths = (1u << CB_COMM) | (1u << CB_BUCKETER);
            else
                return cli_usage_error("commbench", "--path must be comm, bucketer or both, not '%s'", optarg);
            break;
        case O_DEVICE:
            if (train_device_parse(optarg, &c->device) < 0)
                return cli_usage_error("commbench", "%s", rt_errmsg());
            break;
        case O_BUCKET: {
            char *end;
            c->bucket_mb = strtod(optarg, &end);
            if (!*optarg || *end || !(c->bucket_mb > 0) || c->bucket_mb > 4096)
                return cli_usage_error("commbench", "--bucket-mb needs MiB in (0, 4096], got '%s'", optarg);
            break;
        }
        case O_JSON:
            /* `--json FILE` as well as `--json=FILE`: the command takes no other argument, so a word after
             * --json that is not an option is its file ("-": stdout). */
            if (!optarg && optind < argc && (argv[optind][0] != '-' || !strcmp(argv[optind], "-")))
                optarg = argv[optind++];
            c->json = optarg ? optarg : "-";
            break;
        case 'h':
        case O_HELP: commbench_help(); return RT_EXIT_OK + 1;
        default: return cli_usage_error("commbench", "unknown option");
        }
    }
    if (optind < argc)
        return cli_usage_error("commbench", "unexpected argument '%s'", argv[optind]);
    if (c->min_bytes > c->max_bytes)
        return cli_usage_error("commbench", "--min-bytes (%" PRIu64 ") is above --max-bytes (%" PRIu64 ")",
                               c->min_bytes, c->max_bytes);
    c->bucket_bytes = (uint64_t)(c->bucket_mb * 1048576.0) / sizeof(float) * sizeof(float);
    if (c->bucket_bytes < sizeof(float))
        return cli_usage_error("commbench", "--bucket-mb %g is less than one float", c->bucket_mb);
    /* The planted fault of the test (tests/test_commbench.sh); read once, here, never in the timed loop. */
    const char *v = getenv("RINGTRAIN_TEST_COMMBENCH_CORRUPT");
    c->corrupt = v && *v && strcmp(v, "0");
    return 0;
}

/* The sizes to measure, ascending: min, min * factor, ... up to max, and the bucket size when it lies inside
 * [min, max] and is not one of them already. Returns how many. */
static int cb_sizes(const struct cb_config *c, uint64_t *out)
{
    int n = 0;
    for (uint64_t s = c->min_bytes; n < CB_MAX_SIZES - 1; s *= c->factor) {
        out[n++] = s;
        if (s > c->max_bytes / c->factor)
            break;
    }
    const uint64_t b = c->bucket_bytes;
    if (b < c->min_bytes || b > c->max_bytes)
        return n;
    int at = 0;
    while (at < n && out[at] < b)
        at++;
    if (at < n && out[at] == b)
        return n;
    memmove(out + at + 1, out + at, (size_t)(n - at) * sizeof(*out));
    out[at] = b;
    return n + 1;
}

/* ---- set-up ------------------------------------------------------------------------------ */

/*
 * Every rank's `rc` for a step some ranks may fail alone (memory, a GPU), so that all of them stop at the
 * same point instead of leaving peers inside the next collective. Returns rc when this rank failed (its
 * message stands), -ECANCELED naming the lowest failing rank when another one did, else 0.
 */
static int cb_agree(struct rt_comm *c, int rank, int rc)
{
    int32_t first = rc < 0 ? rank : INT32_MAX;
    rt_comm_allreduce(c, &first, 1, RT_COMM_I32, RT_RED_MIN, "commbench: agreeing on set-up errors");
    if (rc < 0)
        return rc;
    if (first != INT32_MAX)
        return rt_errf(-ECANCELED, "rank %d failed (see its message)", (int)first);
    return 0;
}

/* The "model name" of /proc/cpuinfo, or "unknown". */
static void cpu_model(char *buf, size_t len)
{
    snprintf(buf, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10))
            continue;
        const char *v = strchr(line, ':');
        if (!v)
            continue;
        v += strspn(v + 1, " \t") + 1;
        snprintf(buf, len, "%.*s", (int)strcspn(v, "\n"), v);
        break;
    }
    fclose(f);
}

/*
 * Whether the bucketer runs in NCCL mode: --device cuda, or auto when every rank has a GPU and NCCL loads
 * (and only when the bucketer path is measured). Collective. Returns 0 with *gpu set, or -ENODEV when cuda
 * was asked for and this rank cannot, -ECANCELED when another rank cannot.
 */
static int cb_choose_device(struct cb_bench *B, int *gpu)
{
    struct rt_backend_probe p;
    const int built = rt_backend_probe(RT_BACKEND_CUDA, &p) == 0;
    const int nccl = built && rt_nccl_available();
    int32_t all = built && p.devices > 0 && nccl;
    char why[320];
    if (!built)
        snprintf(why, sizeof(why), "%s", p.detail);
    else if (p.devices <= 0)
        snprintf(why, sizeof(why), "no usable GPU (%s)", p.detail);
    else
        snprintf(why, sizeof(why), "NCCL does not load here (the GPU all-reduce needs libnccl)");
    const int mine = all;
    rt_errclear();
    rt_comm_allreduce(B->c, &all, 1, RT_COMM_I32, RT_RED_MIN, "commbench: the device");
    *gpu = 0;
    if (B->cfg->device == DEVICE_CPU || !(B->cfg->paths & (1u << CB_BUCKETER)))
        return 0;
    if (B->cfg->device == DEVICE_AUTO || all) {
        *gpu = all;
        return 0;
    }
    if (!mine)
        return rt_errf(-ENODEV, "--device cuda: %s", why);
    return rt_errf(-ECANCELED, "--device cuda: another rank has no usable GPU with NCCL (see its message)");
}

/* NCCL mode: this rank's GPU, the bucketer's buffer and the pattern on it, the communicator. Collective. */
static int cb_open_gpu(struct cb_bench *B)
{
    const struct rt_rank_info *ri = rt_comm_info(B->c);
    const size_t bytes = B->cfg->max_bytes;
    int rc = train_open_backend(DEVICE_CUDA, ri->local_rank, ri->local_world, 1, &B->be);
    if (rc == 0) {
        const struct rt_ops *ops = rt_backend_ops(B->be);
        struct rt_stream *s = rt_backend_stream(B->be);
        B->dev = ops->alloc(B->be, bytes);
        B->dev_pattern = B->dev ? ops->alloc(B->be, bytes) : NULL;
        if (!B->dev_pattern)
            rc = rt_errf(-ENOMEM, "--device cuda: %zu MiB of device memory: %s", bytes >> 20, rt_errmsg());
        for (size_t off = 0; rc == 0 && off < bytes / sizeof(float); off += CB_TILE)
            ops->upload(s, B->dev_pattern + off, B->pattern,
                        RT_MIN((size_t)CB_TILE, bytes / sizeof(float) - off) * sizeof(float));
        if (rc == 0)
            ops->sync(s);
    }
    if ((rc = cb_agree(B->c, B->rank, rc)) < 0)
        return rc;
    rc = B->world > 1 ? rt_nccl_create(B->c, rt_backend_device(B->be), &B->nccl)
                      : rt_nccl_create_local(B->c, rt_backend_device(B->be), &B->nccl);
    if (rc < 0 && B->world > 1) {
        /* The other ranks may be inside the set-up already, waiting for this one: end the job. */
        char msg[600];
        snprintf(msg, sizeof(msg), "commbench: NCCL set-up failed: %s", rt_errmsg());
        rt_comm_abort(B->c, RT_EXIT_FAIL, msg);
    }
    return rc;
}

/* Everything the run needs before the first message: the device, memory, the pattern, the header's facts. */
static int cb_open(struct cb_bench *B, int *gpu)
{
    const struct cb_config *cfg = B->cfg;
    const struct rt_rank_info *ri = rt_comm_info(B->c);
    B->rank = ri->rank;
    B->world = ri->world;
    int32_t sum = 0;
    for (int r = 0; r < B->world; r++)
        sum += r % 16 + 1;
    for (int i = 0; i < CB_TILE; i++) {
        B->pattern[i] = (float)((B->rank % 16 + 1) * (i % 7 + 1));
        B->expect[i] = (float)(sum * (i % 7 + 1));
    }
    cpu_model(B->cpu, sizeof(B->cpu));

    int rc = 0;
    const uint64_t avail = rt_mem_available(), need = cfg->max_bytes * (uint64_t)RT_MAX(ri->local_world, 1);
    if (avail && need > avail / 10 * 9)
        rc = rt_errf(-ENOMEM, "--max-bytes %" PRIu64 ": %d rank%s on this node need %.1f GiB of host memory, "
                              "%.1f GiB is available",
                     cfg->max_bytes, ri->local_world, ri->local_world == 1 ? "" : "s", (double)need / (1 << 30),
                     (double)avail / (1 << 30));
    if (rc == 0 && !(B->host = rt_malloc(cfg->max_bytes, "the message buffer")))
        rc = -ENOMEM;
    if (rc == 0 && !(B->hosts = rt_calloc((size_t)B->world, CB_HOST_LEN, "host names")))
        rc = -ENOMEM;
    if (rc == 0 && B->rank == 0 && cfg->json && strcmp(cfg->json, "-") && !(B->json = fopen(cfg->json, "w")))
        rc = rt_errf(-errno, "--json %s: %s", cfg->json, strerror(errno));
    if ((rc = cb_agree(B->c, B->rank, rc)) < 0)
        return rc;

    char me[CB_HOST_LEN] = "";
    if (gethostname(me, sizeof(me) - 1) < 0)
        snprintf(me, sizeof(me), "?");
    if (B->world > 1)
        rt_comm_allgather(B->c, me, B->hosts, CB_HOST_LEN, "commbench: host names");
    else
        memcpy(B->hosts, me, CB_HOST_LEN);

    if ((rc = cb_choose_device(B, gpu)) < 0)
        return rc;
    return *gpu ? cb_open_gpu(B) : 0;
}

static void cb_close(struct cb_bench *B)
{
    if (!B)
        return;
    /* NCCL's stream work is over (rt_nccl_destroy waits for it) before the memory it reduced goes. */
    rt_nccl_destroy(B->nccl);
    if (B->be) {
        const struct rt_ops *ops = rt_backend_ops(B->be);
        ops->free(B->be, B->dev);
        ops->free(B->be, B->dev_pattern);
    }
    rt_backend_destroy(B->be);
    if (B->json)
        fclose(B->json);
    free(B->host);
    free(B->hosts);
    free(B);
}

/* ---- one path at one size ---------------------------------------------------------------- */

/* Rank r's values in the first `count` floats of `buf`. NCCL mode copies them on the device; either way they
 * are in place when this returns (the timed part starts after it). */
static void cb_fill(struct cb_bench *B, float *buf, int on_dev, size_t count)
{
    if (on_dev) {
        const struct rt_ops *ops = rt_backend_ops(B->be);
        ops->copy(rt_backend_stream(B->be), buf, B->dev_pattern, count * sizeof(float));
        ops->sync(rt_backend_stream(B->be));
        return;
    }
    for (size_t off = 0; off < count; off += CB_TILE)
        memcpy(buf + off, B->pattern, RT_MIN((size_t)CB_TILE, count - off) * sizeof(float));
}

/* The elements of the first `count` floats of `buf` that are not the exact sum over the ranks. */
static uint64_t cb_check(struct cb_bench *B, const float *buf, int on_dev, size_t count)
{
    if (on_dev) {
        rt_backend_ops(B->be)->download(rt_backend_stream(B->be), B->host, buf, count * sizeof(float));
        buf = B->host;
    }
    uint64_t wrong = 0;
    for (size_t off = 0; off < count; off += CB_TILE) {
        const size_t n = RT_MIN((size_t)CB_TILE, count - off);
        for (size_t i = 0; i < n; i++)
            wrong += buf[off + i] != B->expect[i]; /* NaN is wrong too */
    }
    return wrong;
}

/* The test hook (RINGTRAIN_TEST_COMMBENCH_CORRUPT): the last rank spoils one element of the reduced buffer,
 * as a broken all-reduce would, so that the test can see the check fail. Outside the timed part. */
static void cb_plant_fault(struct cb_bench *B, float *buf, int on_dev, size_t count)
{
    if (!B->cfg->corrupt || B->rank != B->world - 1)
        return;
    const float bad = -1.0f; /* no sum of the pattern is negative */
    if (on_dev) {
        rt_backend_ops(B->be)->upload(rt_backend_stream(B->be), buf + count / 2, &bad, sizeof(bad));
        rt_backend_ops(B->be)->sync(rt_backend_stream(B->be));
    } else {
        buf[count / 2] = bad;
    }
}

/* One all-reduce of `count` floats at `buf` on path p, as training issues it. 0 or -errno. */
static int cb_allreduce(struct cb_bench *B, enum cb_path p, struct rt_bucketer *bk, float *buf, size_t count)
{
    if (p == CB_COMM) {
        rt_comm_allreduce(B->c, buf, count, RT_COMM_F32, RT_RED_SUM, "the commbench all-reduce");
        return 0;
    }
    uint32_t flags;
    rt_bucketer_begin(bk, B->step++);
    rt_bucketer_ready(bk, count);
    return rt_bucketer_finish(bk, 0, &flags, NULL);
}

/* Path p at `bytes`: warm-up, timed iterations, the check after the last one, the ranks' figures. Collective. */
static int cb_measure(struct cb_bench *B, enum cb_path p, uint64_t bytes, struct cb_row *row)
{
    const struct cb_config *cfg = B->cfg;
    const size_t count = bytes / sizeof(float);
    const int on_dev = p == CB_BUCKETER && B->nccl;
    float *buf = on_dev ? B->dev : B->host;
    struct rt_bucketer *bk = NULL;
    int rc = 0;
    if (p == CB_BUCKETER) {
        /* One tensor, caps at the message size: one bucket, the whole message in one all-reduce. */
        const struct rt_bucket_tensor t = {"commbench", 0, count};
        const struct rt_bucket_opts o = {.cap_bytes = bytes, .first_cap_bytes = bytes, .nccl = B->nccl,
                                         .stream = B->be ? rt_backend_native_stream(B->be) : NULL};
        rc = rt_bucketer_create(B->c, buf, count, &t, 1, &o, &bk);
        if (rc == 0 && rt_bucketer_count(bk) != 1)
            rc = rt_errf(-EPROTO, "the bucketer cut %" PRIu64 " bytes into %d buckets, not one", bytes,
                         rt_bucketer_count(bk));
        if ((rc = cb_agree(B->c, B->rank, rc)) < 0) {
            rt_bucketer_destroy(bk);
            return rc;
        }
    }
    uint64_t timed_ns = 0;
    for (uint64_t it = 0; it < cfg->warmup + cfg->iters && rc == 0; it++) {
        cb_fill(B, buf, on_dev, count);
        if (it == cfg->warmup)
            rt_comm_barrier(B->c, -1, "commbench: the start of the timed iterations");
        const uint64_t t0 = rt_now_ns();
        rc = cb_allreduce(B, p, bk, buf, count);
        if (it >= cfg->warmup)
            timed_ns += rt_now_ns() - t0;
    }
    rt_bucketer_destroy(bk);
    if (rc < 0)
        return rt_errf(rc, "%s path, %" PRIu64 " bytes: %s", cb_path_names[p], bytes, rt_errmsg());
    cb_plant_fault(B, buf, on_dev, count);
    uint64_t wrong = cb_check(B, buf, on_dev, count);
    double mean_us = (double)timed_ns * 1e-3 / (double)cfg->iters, max_us = mean_us;
    rt_comm_allreduce(B->c, &mean_us, 1, RT_COMM_F64, RT_RED_SUM, "commbench: the ranks' times");
    rt_comm_allreduce(B->c, &max_us, 1, RT_COMM_F64, RT_RED_MAX, "commbench: the slowest rank's time");
    rt_comm_allreduce(B->c, &wrong, 1, RT_COMM_U64, RT_RED_SUM, "commbench: the wrong elements");
    row->path = p;
    row->bytes = bytes;
    row->time_us = mean_us / B->world;
    row->max_time_us = max_us;
    row->algbw = row->time_us > 0 ? (double)bytes / (row->time_us * 1e3) : 0;
    row->busbw = row->algbw * 2.0 * (B->world - 1) / B->world;
    row->wrong = wrong;
    return 0;
}

/* ---- printing ---------------------------------------------------------------------------- */

/* nccl-tests' time field: fewer decimals as the time grows, seven columns. */
static void time_text(double us, char *buf, size_t len)
{
    if (us >= 10000.0)
        snprintf(buf, len, "%7.0f", us);
    else if (us >= 100.0)
        snprintf(buf, len, "%7.1f", us);
    else
        snprintf(buf, len, "%7.2f", us);
}

/* The distinct host names, comma-separated, and how many. */
static int host_list(const struct cb_bench *B, char *buf, size_t len)
{
    int n = 0;
    size_t o = 0;
    buf[0] = 0;
    for (int r = 0; r < B->world; r++) {
        const char *h = B->hosts + (size_t)r * CB_HOST_LEN;
        int seen = 0;
        for (int q = 0; q < r && !seen; q++)
            seen = !strcmp(h, B->hosts + (size_t)q * CB_HOST_LEN);
        if (seen)
            continue;
        n++;
        if (o < len)
            o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? "," : "", h);
    }
    return n;
}

static const char *path_what(const struct cb_bench *B, enum cb_path p)
{
    if (p == CB_COMM)
        return "rt_comm_allreduce -- host memory, MPI through the comm thread (validation metrics)";
    return B->nccl ? "the gradient bucketer, one bucket -- device memory, NCCL on its comm stream (gradients)"
                   : "the gradient bucketer, one bucket -- host memory, MPI through the comm thread (gradients)";
}

/* The header, on rank 0; the rank table is collective. */
static void print_header(struct cb_bench *B)
{
    const struct cb_config *cfg = B->cfg;
    char *table = NULL;
    size_t table_len = 0;
    FILE *mem = B->rank == 0 ? open_memstream(&table, &table_len) : NULL;
    rt_comm_print_ranks(B->c, mem ? mem : stdout, 1, B->nccl ? "cuda" : "cpu");
    if (mem)
        fclose(mem);
    if (B->rank != 0)
        return;
    char hosts[512];
    const int nhosts = host_list(B, hosts, sizeof(hosts));
    printf("# ringtrain commbench: all_reduce, sum of float, in place\n");
    printf("# ranks %d hosts %d (%s) minBytes %" PRIu64 " maxBytes %" PRIu64 " step: %" PRIu64
           "(factor) warmup iters: %" PRIu64 " iters: %" PRIu64 " validation: 1\n",
           B->world, nhosts, hosts, cfg->min_bytes, cfg->max_bytes, cfg->factor, cfg->warmup, cfg->iters);
    printf("# collectives: %s; CPU: %s\n", rt_comm_backend(B->c), B->cpu);
    if (B->nccl)
        printf("# GPU: %s; %s\n", rt_backend_describe(B->be), rt_nccl_describe(B->nccl));
    else
        printf("# GPU: none used (the bucketer reduces host memory over MPI)\n");
    printf("#\n# Using ranks\n");
    for (char *line = table, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        printf("# %s\n", line);
    }
    free(table);
    if (B->world == 1)
        printf("# one rank: nothing crosses a link, busbw is 0 (run it under mpirun -np N or srun)%s\n",
               B->nccl ? "" : "; over MPI the all-reduce\n# of one rank returns at once: time is the call's overhead");
    fflush(stdout);
}

static void print_table_head(const struct cb_bench *B, enum cb_path p)
{
    if (B->rank != 0)
        return;
    printf("#\n# path %s: %s\n", cb_path_names[p], path_what(B, p));
    printf("#%72s\n", "in-place");
    printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s\n", "size", "count", "type", "redop", "root", "time",
           "algbw", "busbw", "#wrong", "maxtime");
    printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
           "(GB/s)", "", "(us)");
    fflush(stdout);
}

static void print_row(const struct cb_bench *B, const struct cb_row *r)
{
    if (B->rank != 0)
        return;
    char t[32], mt[32];
    time_text(r->time_us, t, sizeof(t));
    time_text(r->max_time_us, mt, sizeof(mt));
    printf("%12" PRIu64 "  %12" PRIu64 "  %8s  %6s  %6d  %7s  %6.2f  %6.2f  %6" PRIu64 "  %7s\n", r->bytes,
           r->bytes / sizeof(float), "float", "sum", -1, t, r->algbw, r->busbw, r->wrong, mt);
    fflush(stdout);
}

static double avg_busbw(const struct cb_row *rows, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += rows[i].busbw;
    return n ? s / n : 0;
}

static uint64_t total_wrong(const struct cb_row *rows, int n)
{
    uint64_t w = 0;
    for (int i = 0; i < n; i++)
        w += rows[i].wrong;
    return w;
}

/* What the last line says about the gradient bucket size. */
struct cb_verdict {
    int measured;             /* the bucket size is one of the rows */
    enum cb_path path;        /* the bucketer's when it was measured, else comm's */
    double busbw, best;       /* GB/s: at the bucket size, the best at any size on that path */
    uint64_t best_bytes;
    uint64_t lo, hi;          /* the smallest and the largest size at CB_REACH of the best (0: none) */
    double fraction;
    int reaches;
};

static void make_verdict(const struct cb_bench *B, const struct cb_row *rows, int n, struct cb_verdict *v)
{
    memset(v, 0, sizeof(*v));
    v->path = (B->cfg->paths & (1u << CB_BUCKETER)) ? CB_BUCKETER : CB_COMM;
    for (int i = 0; i < n; i++) {
        const struct cb_row *r = &rows[i];
        if (r->path != v->path)
            continue;
        if (r->busbw > v->best) {
            v->best = r->busbw;
            v->best_bytes = r->bytes;
        }
        if (r->bytes == B->cfg->bucket_bytes) {
            v->measured = 1;
            v->busbw = r->busbw;
        }
    }
    for (int i = 0; i < n && v->best > 0; i++)
        if (rows[i].path == v->path && rows[i].busbw >= CB_REACH * v->best) {
            v->lo = v->lo ? RT_MIN(v->lo, rows[i].bytes) : rows[i].bytes;
            v->hi = RT_MAX(v->hi, rows[i].bytes);
        }
    v->fraction = v->best > 0 ? v->busbw / v->best : 0;
    v->reaches = v->measured && v->best > 0 && v->fraction >= CB_REACH;
}

static void print_verdict(const struct cb_bench *B, const struct cb_verdict *v)
{
    const double mib = (double)B->cfg->bucket_bytes / 1048576.0;
    if (B->rank != 0)
        return;
    printf("#\n");
    if (B->world == 1)
        printf("# bucket %g MiB: one rank, no link to measure (busbw is 0 at every size); run it under mpirun -np N "
               "or srun to see whether it reaches the link's bandwidth\n",
               mib);
    else if (!v->measured)
        printf("# bucket %g MiB (%" PRIu64 " B): not measured, outside --min-bytes..--max-bytes; the best busbw on "
               "the %s path was %.2f GB/s at %" PRIu64 " B\n",
               mib, B->cfg->bucket_bytes, cb_path_names[v->path], v->best, v->best_bytes);
    else if (v->reaches)
        printf("# bucket %g MiB (%" PRIu64 " B, %s path): busbw %.2f GB/s = %.0f%% of the best measured, %.2f GB/s "
               "at %" PRIu64 " B: yes, a %g MiB bucket reaches the link's bandwidth here\n",
               mib, B->cfg->bucket_bytes, cb_path_names[v->path], v->busbw, 100 * v->fraction, v->best,
               v->best_bytes, mib);
    else {
        char hint[160] = "";
        if (v->lo > B->cfg->bucket_bytes)
            snprintf(hint, sizeof(hint), "; larger buckets would: --bucket-cap-mb %g", (double)v->lo / 1048576.0);
        printf("# bucket %g MiB (%" PRIu64 " B, %s path): busbw %.2f GB/s = %.0f%% of the best measured, %.2f GB/s "
               "at %" PRIu64 " B: no, a %g MiB bucket does not reach the link's bandwidth here (%.0f%% of it or more "
               "at %" PRIu64 "..%" PRIu64 " B%s)\n",
               mib, B->cfg->bucket_bytes, cb_path_names[v->path], v->busbw, 100 * v->fraction, v->best,
               v->best_bytes, mib, 100 * CB_REACH, v->lo, v->hi, hint);
    }
    fflush(stdout);
}

/* The JSON document: the header's facts, one object per path and size, the averages and the verdict. */
static int write_json(const struct cb_bench *B, const struct cb_row *rows, int n, const struct cb_verdict *v)
{
    const struct cb_config *cfg = B->cfg;
    json_t *o = json_object(), *res = json_array(), *hosts = json_array(), *avg = json_object(),
           *bucket = json_object();
    char list[512];
    const int nhosts = host_list(B, list, sizeof(list));
    for (char *save = NULL, *h = strtok_r(list, ",", &save); h; h = strtok_r(NULL, ",", &save))
        json_array_append_new(hosts, json_string(h));
    json_object_set_new(o, "command", json_string("commbench"));
    json_object_set_new(o, "collective", json_string("all_reduce"));
    json_object_set_new(o, "type", json_string("float"));
    json_object_set_new(o, "redop", json_string("sum"));
    json_object_set_new(o, "in_place", json_true());
    json_object_set_new(o, "ranks", json_integer(B->world));
    json_object_set_new(o, "hosts", json_integer(nhosts));
    json_object_set_new(o, "host_names", hosts);
    json_object_set_new(o, "collectives", json_string(rt_comm_backend(B->c)));
    json_object_set_new(o, "cpu", json_string(B->cpu));
    json_object_set_new(o, "device", json_string(B->nccl ? "cuda" : "cpu"));
    json_object_set_new(o, "gpu", B->nccl ? json_string(rt_backend_describe(B->be)) : json_null());
    json_object_set_new(o, "nccl", B->nccl ? json_string(rt_nccl_describe(B->nccl)) : json_null());
    json_object_set_new(o, "min_bytes", json_integer((json_int_t)cfg->min_bytes));
    json_object_set_new(o, "max_bytes", json_integer((json_int_t)cfg->max_bytes));
    json_object_set_new(o, "factor", json_integer((json_int_t)cfg->factor));
    json_object_set_new(o, "warmup", json_integer((json_int_t)cfg->warmup));
    json_object_set_new(o, "iters", json_integer((json_int_t)cfg->iters));
    for (int i = 0; i < n; i++) {
        const struct cb_row *r = &rows[i];
        json_t *e = json_object();
        json_object_set_new(e, "path", json_string(cb_path_names[r->path]));
        json_object_set_new(e, "backend", json_string(r->path == CB_BUCKETER && B->nccl ? "NCCL" : "MPI"));
        json_object_set_new(e, "size", json_integer((json_int_t)r->bytes));
        json_object_set_new(e, "count", json_integer((json_int_t)(r->bytes / sizeof(float))));
        json_object_set_new(e, "time_us", json_real(r->time_us));
        json_object_set_new(e, "max_time_us", json_real(r->max_time_us));
        json_object_set_new(e, "algbw", json_real(r->algbw));
        json_object_set_new(e, "busbw", json_real(r->busbw));
        json_object_set_new(e, "wrong", json_integer((json_int_t)r->wrong));
        json_array_append_new(res, e);
    }
    json_object_set_new(o, "results", res);
    for (int p = 0; p < CB_NPATHS; p++) {
        if (!(cfg->paths & (1u << p)))
            continue;
        double s = 0;
        int k = 0;
        for (int i = 0; i < n; i++)
            if (rows[i].path == (enum cb_path)p) {
                s += rows[i].busbw;
                k++;
            }
        json_object_set_new(avg, cb_path_names[p], json_real(k ? s / k : 0));
    }
    json_object_set_new(o, "avg_busbw", avg);
    json_object_set_new(bucket, "bytes", json_integer((json_int_t)cfg->bucket_bytes));
    json_object_set_new(bucket, "path", json_string(cb_path_names[v->path]));
    json_object_set_new(bucket, "measured", json_boolean(v->measured));
    json_object_set_new(bucket, "busbw", v->measured ? json_real(v->busbw) : json_null());
    json_object_set_new(bucket, "best_busbw", json_real(v->best));
    json_object_set_new(bucket, "best_size", json_integer((json_int_t)v->best_bytes));
    json_object_set_new(bucket, "fraction", v->measured && v->best > 0 ? json_real(v->fraction) : json_null());
    json_object_set_new(bucket, "reaches", json_boolean(v->reaches));
    json_object_set_new(o, "bucket", bucket);
    json_object_set_new(o, "wrong", json_integer((json_int_t)total_wrong(rows, n)));

    FILE *f = B->json ? B->json : stdout;
    int rc = json_dumpf(o, f, JSON_COMPACT) == 0 && fputc('\n', f) != EOF && fflush(f) == 0 ? 0 : -EIO;
    json_decref(o);
    if (rc < 0)
        return rt_errf(rc, "--json %s: cannot write", cfg->json);
    return 0;
}

/* ---- the run ----------------------------------------------------------------------------- */

/* Every path over every size, printed as it goes. Returns 0 or -errno; *wrong: the wrong elements. */
static int cb_run(struct cb_bench *B, uint64_t *wrong)
{
    uint64_t sizes[CB_MAX_SIZES];
    const int ns = cb_sizes(B->cfg, sizes);
    struct cb_row rows[CB_NPATHS * CB_MAX_SIZES];
    int n = 0;
    print_header(B);
    for (int p = 0; p < CB_NPATHS; p++) {
        if (!(B->cfg->paths & (1u << p)))
            continue;
        print_table_head(B, (enum cb_path)p);
        const int first = n;
        for (int i = 0; i < ns; i++, n++) {
            int rc = cb_measure(B, (enum cb_path)p, sizes[i], &rows[n]);
            if (rc < 0)
                return rc;
            print_row(B, &rows[n]);
        }
        const uint64_t w = total_wrong(rows + first, n - first);
        if (B->rank == 0) {
            printf("# Wrong values         : %" PRIu64 " %s\n", w, w ? "FAILED" : "OK");
            printf("# Avg bus bandwidth    : %g (%s)\n", avg_busbw(rows + first, n - first), cb_path_names[p]);
        }
    }
    struct cb_verdict v;
    make_verdict(B, rows, n, &v);
    print_verdict(B, &v);
    *wrong = total_wrong(rows, n);
    if (B->rank == 0 && *wrong) {
        fflush(stdout);
        fprintf(stderr, "error: %" PRIu64 " element%s of the all-reduce came back wrong (#wrong above)\n", *wrong,
                *wrong == 1 ? "" : "s");
    }
    return B->rank == 0 && B->cfg->json ? write_json(B, rows, n, &v) : 0;
}

int cmd_commbench(int argc, char **argv)
{
    struct cb_config cfg;
    int rc = parse_options(argc, argv, &cfg);
    if (rc)
        return rc == RT_EXIT_OK + 1 ? RT_EXIT_OK : rc;

    struct rt_comm *c;
    if (rt_comm_create(NULL, &c) < 0)
        return cli_fail();
    const struct rt_rank_info *ri = rt_comm_info(c);
    struct cb_bench *B = rt_calloc(1, sizeof(*B), "commbench");
    rc = cb_agree(c, ri->rank, B ? 0 : -ENOMEM);
    uint64_t wrong = 0;
    int gpu = 0;
    if (rc == 0) {
        B->cfg = &cfg;
        B->c = c;
        rc = cb_open(B, &gpu);
    }
    if (rc == 0)
        rc = cb_run(B, &wrong);
    /* A write error of rank 0's JSON is the only failure one rank can have here alone; agree on it so that
     * every rank exits with the same code. */
    rc = cb_agree(c, ri->rank, rc);
    if (rc == -ECANCELED && ri->rank == 0)
        fprintf(stderr, "error: %s\n", rt_errmsg());
    else if (rc < 0 && rc != -ECANCELED && ri->world > 1)
        fprintf(stderr, "error: [%d/%d] %s\n", ri->rank, ri->world, rt_errmsg());
    else if (rc < 0 && rc != -ECANCELED)
        fprintf(stderr, "error: %s\n", rt_errmsg());
    cb_close(B);
    rt_comm_destroy(c);
    return rc < 0 || wrong ? RT_EXIT_FAIL : RT_EXIT_OK;
}
