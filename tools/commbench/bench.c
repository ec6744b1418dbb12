/*
 * bench.c - the all-reduce measurement behind `ringtrain commbench`
 * (commbench.h): set-up (memory, the device choice, NCCL), then per path and
 * size the fill, the all-reduce through rt_comm_allreduce or the gradient
 * bucketer, the timing and the check. It prints nothing; the command does.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/common.h"
#include "compute/compute.h"
#include "tools/commbench/commbench.h"

#define CB_TILE (7 * 4096) /* floats: whole periods of the pattern */
#define CB_HOST_LEN 64

struct commbench {
    struct commbench_config cfg;
    struct rt_comm *c;
    struct commbench_info info;
    struct rt_backend *be;           /* the bucketer's GPU in NCCL mode, else NULL */
    struct rt_nccl *nccl;
    float *host;                     /* max_bytes: the comm path's buffer (and the bucketer's on the CPU) */
    float *dev, *dev_pattern;        /* NCCL mode, max_bytes each: the bucketer's buffer, this rank's pattern */
    float pattern[CB_TILE];          /* this rank's values for elements 0.. (period 7) */
    float expect[CB_TILE];           /* their sums over the ranks */
    uint64_t step;
    char *hosts;                     /* world x CB_HOST_LEN: each rank's host name */
};

static const char *const path_names[COMMBENCH_NPATHS] = {"comm", "bucketer"};

const char *commbench_path_name(enum commbench_path p)
{
    return (unsigned)p < COMMBENCH_NPATHS ? path_names[p] : "?";
}

void commbench_config_default(struct commbench_config *c)
{
    *c = (struct commbench_config){.min_bytes = 1024, .max_bytes = (uint64_t)256 << 20, .factor = 2, .warmup = 5,
                                   .iters = 20, .bucket_bytes = (uint64_t)25 << 20,
                                   .paths = (1u << COMMBENCH_COMM) | (1u << COMMBENCH_BUCKETER),
                                   .device = DEVICE_AUTO};
    commbench_faults_none(&c->faults);
}

int commbench_config_check(const struct commbench_config *c)
{
    const uint64_t f = sizeof(float);
    if (c->min_bytes < f || c->min_bytes % f || c->max_bytes % f || c->max_bytes > COMMBENCH_MAX_BYTES ||
        c->min_bytes > c->max_bytes)
        return rt_errf(-EINVAL, "commbench: sizes %" PRIu64 "..%" PRIu64 " bytes: whole floats from 4 to 4G, "
                                "the smallest first", c->min_bytes, c->max_bytes);
    if (c->factor < 2)
        return rt_errf(-EINVAL, "commbench: factor %" PRIu64 ": at least 2", c->factor);
    if (c->iters < 1)
        return rt_errf(-EINVAL, "commbench: no timed iteration");
    if (c->bucket_bytes < f || c->bucket_bytes % f)
        return rt_errf(-EINVAL, "commbench: a bucket of %" PRIu64 " bytes is not whole floats", c->bucket_bytes);
    if (!c->paths || c->paths >> COMMBENCH_NPATHS)
        return rt_errf(-EINVAL, "commbench: paths 0x%x name no path or an unknown one", c->paths);
    if (c->device != DEVICE_AUTO && c->device != DEVICE_CPU && c->device != DEVICE_CUDA)
        return rt_errf(-EINVAL, "commbench: unknown device %d", (int)c->device);
    return 0;
}

int commbench_sizes(const struct commbench_config *c, uint64_t *out)
{
    int n = 0;
    for (uint64_t s = c->min_bytes; n < COMMBENCH_MAX_SIZES - 1; s *= c->factor) {
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

int commbench_agree(struct rt_comm *c, int rc)
{
    const int rank = rt_comm_info(c)->rank;
    int32_t first = rc < 0 ? rank : INT32_MAX;
    rt_comm_allreduce(c, &first, 1, RT_COMM_I32, RT_RED_MIN, "commbench: agreeing on set-up errors");
    if (rc < 0)
        return rc;
    if (first != INT32_MAX)
        return rt_errf(-ECANCELED, "rank %d failed (see its message)", (int)first);
    return 0;
}

/* ---- set-up ------------------------------------------------------------------------------ */

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

/* The distinct host names of B->hosts, comma-separated, and how many, into the info. */
static void host_list(struct commbench *B)
{
    struct commbench_info *in = &B->info;
    const size_t len = sizeof(in->hosts);
    size_t o = 0;
    in->nhosts = 0;
    in->hosts[0] = 0;
    for (int r = 0; r < in->world; r++) {
        const char *h = B->hosts + (size_t)r * CB_HOST_LEN;
        int seen = 0;
        for (int q = 0; q < r && !seen; q++)
            seen = !strcmp(h, B->hosts + (size_t)q * CB_HOST_LEN);
        if (seen)
            continue;
        in->nhosts++;
        if (o < len)
            o += (size_t)snprintf(in->hosts + o, len - o, "%s%s", o ? "," : "", h);
    }
}

/*
 * Whether the bucketer runs in NCCL mode: device cuda, or auto when every rank has a GPU and NCCL loads (and
 * only when the bucketer path is measured). Collective. Returns 0 with *gpu set, or -ENODEV when cuda was asked
 * for and this rank cannot, -ECANCELED when another rank cannot.
 */
static int choose_device(struct commbench *B, int *gpu)
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
    if (B->cfg.device == DEVICE_CPU || !(B->cfg.paths & (1u << COMMBENCH_BUCKETER)))
        return 0;
    if (B->cfg.device == DEVICE_AUTO || all) {
        *gpu = all;
        return 0;
    }
    if (!mine)
        return rt_errf(-ENODEV, "--device cuda: %s", why);
    return rt_errf(-ECANCELED, "--device cuda: another rank has no usable GPU with NCCL (see its message)");
}

static const char *env_get(void *ctx, const char *name)
{
    (void)ctx;
    return getenv(name);
}

/* A CUDA backend on the GPU rt_gpu_preflight picks for this rank, as train's --device cuda does (its note on
 * Slurm's per-task binding printed by the node's first rank). 0, or -errno naming --device cuda. */
static int open_backend(struct commbench *B)
{
    const struct rt_rank_info *ri = rt_comm_info(B->c);
    struct rt_backend_probe p;
    struct rt_backend_opts bo = {.kind = RT_BACKEND_CUDA};
    char note[1024];
    int rc = rt_backend_probe(RT_BACKEND_CUDA, &p);
    if (rc == 0 && rt_gpu_preflight(p.devices, ri->local_rank, RT_MAX(ri->local_world, 1), env_get, NULL,
                                    &bo.device, note, sizeof(note)) < 0)
        rc = -ENODEV;
    if (rc == 0 && note[0] && ri->local_rank == 0)
        rt_info("%s", note);
    if (rc == 0)
        rc = rt_backend_create(&bo, &B->be);
    return rc < 0 ? rt_errf(rc, "--device cuda: %s", rt_errmsg()) : 0;
}

/* NCCL mode: this rank's GPU, the bucketer's buffer and the pattern on it, the communicator. Collective. */
static int open_gpu(struct commbench *B)
{
    const size_t bytes = B->cfg.max_bytes;
    int rc = open_backend(B);
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
    if ((rc = commbench_agree(B->c, rc)) < 0)
        return rc;
    rc = B->info.world > 1 ? rt_nccl_create(B->c, rt_backend_device(B->be), &B->nccl)
                           : rt_nccl_create_local(B->c, rt_backend_device(B->be), &B->nccl);
    if (rc < 0 && B->info.world > 1) {
        /* The other ranks may be inside the set-up already, waiting for this one: end the job. */
        char msg[600];
        snprintf(msg, sizeof(msg), "commbench: NCCL set-up failed: %s", rt_errmsg());
        rt_comm_abort(B->c, EXIT_FAILURE, msg); /* the command's failure code, 1 */
    }
    if (rc == 0) {
        B->info.nccl = 1;
        B->info.gpu = rt_backend_describe(B->be);
        B->info.nccl_line = rt_nccl_describe(B->nccl);
    }
    return rc;
}

/* Everything the run needs before the first message: memory, the pattern, the header's facts, the device. */
static int open_run(struct commbench *B)
{
    const struct commbench_config *cfg = &B->cfg;
    const struct rt_rank_info *ri = rt_comm_info(B->c);
    const int rank = ri->rank, world = ri->world;
    B->info.rank = rank;
    B->info.world = world;
    B->info.collectives = rt_comm_backend(B->c);
    int32_t sum = 0;
    for (int r = 0; r < world; r++)
        sum += r % 16 + 1;
    for (int i = 0; i < CB_TILE; i++) {
        B->pattern[i] = (float)((rank % 16 + 1) * (i % 7 + 1));
        B->expect[i] = (float)(sum * (i % 7 + 1));
    }
    cpu_model(B->info.cpu, sizeof(B->info.cpu));

    int rc = 0;
    const uint64_t avail = rt_mem_available(), need = cfg->max_bytes * (uint64_t)RT_MAX(ri->local_world, 1);
    if (avail && need > avail / 10 * 9)
        rc = rt_errf(-ENOMEM, "--max-bytes %" PRIu64 ": %d rank%s on this node need %.1f GiB of host memory, "
                              "%.1f GiB is available",
                     cfg->max_bytes, ri->local_world, ri->local_world == 1 ? "" : "s", (double)need / (1 << 30),
                     (double)avail / (1 << 30));
    if (rc == 0 && !(B->host = rt_malloc(cfg->max_bytes, "the message buffer")))
        rc = -ENOMEM;
    if (rc == 0 && !(B->hosts = rt_calloc((size_t)world, CB_HOST_LEN, "host names")))
        rc = -ENOMEM;
    if ((rc = commbench_agree(B->c, rc)) < 0)
        return rc;

    char me[CB_HOST_LEN] = "";
    if (gethostname(me, sizeof(me) - 1) < 0)
        snprintf(me, sizeof(me), "?");
    if (world > 1)
        rt_comm_allgather(B->c, me, B->hosts, CB_HOST_LEN, "commbench: host names");
    else
        memcpy(B->hosts, me, CB_HOST_LEN);
    host_list(B);

    int gpu;
    if ((rc = choose_device(B, &gpu)) < 0)
        return rc;
    return gpu ? open_gpu(B) : 0;
}

int commbench_open(struct rt_comm *c, const struct commbench_config *cfg, struct commbench **out)
{
    *out = NULL;
    int rc = commbench_config_check(cfg); /* the same config on every rank: all of them return here */
    if (rc < 0)
        return rc;
    struct commbench *B = rt_calloc(1, sizeof(*B), "commbench");
    rc = commbench_agree(c, B ? 0 : -ENOMEM);
    if (rc == 0) {
        B->cfg = *cfg;
        B->c = c;
        rc = open_run(B);
    }
    if (rc < 0) {
        commbench_close(B);
        return rc;
    }
    *out = B;
    return 0;
}

const struct commbench_info *commbench_info(const struct commbench *b)
{
    return &b->info;
}

void commbench_close(struct commbench *B)
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
    free(B->host);
    free(B->hosts);
    free(B);
}

/* ---- one path at one size ---------------------------------------------------------------- */

/* Rank r's values in the first `count` floats of `buf`. NCCL mode copies them on the device; either way they
 * are in place when this returns (the timed part starts after it). */
static void fill(struct commbench *B, float *buf, int on_dev, size_t count)
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
static uint64_t check(struct commbench *B, const float *buf, int on_dev, size_t count)
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

/* Named point: after the timed iterations, before the check, the planted fault spoils one element of the
 * reduced buffer (config .faults), as a broken all-reduce would. Outside the timed part. */
static void faults_after_reduce(struct commbench *B, float *buf, int on_dev, size_t count)
{
    size_t at;
    if (!commbench_faults_spoils(&B->cfg.faults, B->info.rank, B->info.world, count, &at))
        return;
    const float bad = -1.0f; /* no sum of the pattern is negative */
    if (on_dev) {
        rt_backend_ops(B->be)->upload(rt_backend_stream(B->be), buf + at, &bad, sizeof(bad));
        rt_backend_ops(B->be)->sync(rt_backend_stream(B->be));
    } else {
        buf[at] = bad;
    }
}

/* One all-reduce of `count` floats at `buf` on path p, as training issues it. 0 or -errno. */
static int allreduce(struct commbench *B, enum commbench_path p, struct rt_bucketer *bk, float *buf, size_t count)
{
    if (p == COMMBENCH_COMM) {
        rt_comm_allreduce(B->c, buf, count, RT_COMM_F32, RT_RED_SUM, "the commbench all-reduce");
        return 0;
    }
    uint32_t flags;
    rt_bucketer_begin(bk, B->step++);
    rt_bucketer_ready(bk, count);
    return rt_bucketer_finish(bk, 0, &flags, NULL);
}

int commbench_measure(struct commbench *B, enum commbench_path p, uint64_t bytes, struct commbench_row *row)
{
    const struct commbench_config *cfg = &B->cfg;
    if ((unsigned)p >= COMMBENCH_NPATHS || bytes < sizeof(float) || bytes % sizeof(float) || bytes > cfg->max_bytes)
        return rt_errf(-EINVAL, "commbench: path %d at %" PRIu64 " bytes: no such path, or not whole floats up to "
                                "the config's %" PRIu64, (int)p, bytes, cfg->max_bytes);
    const size_t count = bytes / sizeof(float);
    const int on_dev = p == COMMBENCH_BUCKETER && B->nccl;
    float *buf = on_dev ? B->dev : B->host;
    struct rt_bucketer *bk = NULL;
    int rc = 0;
    if (p == COMMBENCH_BUCKETER) {
        /* One tensor, caps at the message size: one bucket, the whole message in one all-reduce. */
        const struct rt_bucket_tensor t = {"commbench", 0, count};
        const struct rt_bucket_opts o = {.cap_bytes = bytes, .first_cap_bytes = bytes, .nccl = B->nccl,
                                         .stream = B->be ? rt_backend_native_stream(B->be) : NULL};
        rc = rt_bucketer_create(B->c, buf, count, &t, 1, &o, &bk);
        if (rc == 0 && rt_bucketer_count(bk) != 1)
            rc = rt_errf(-EPROTO, "the bucketer cut %" PRIu64 " bytes into %d buckets, not one", bytes,
                         rt_bucketer_count(bk));
        if ((rc = commbench_agree(B->c, rc)) < 0) {
            rt_bucketer_destroy(bk);
            return rc;
        }
    }
    uint64_t timed_ns = 0;
    for (uint64_t it = 0; it < cfg->warmup + cfg->iters && rc == 0; it++) {
        fill(B, buf, on_dev, count);
        if (it == cfg->warmup)
            rt_comm_barrier(B->c, -1, "commbench: the start of the timed iterations");
        const uint64_t t0 = rt_now_ns();
        rc = allreduce(B, p, bk, buf, count);
        if (it >= cfg->warmup)
            timed_ns += rt_now_ns() - t0;
    }
    rt_bucketer_destroy(bk);
    if (rc < 0)
        return rt_errf(rc, "%s path, %" PRIu64 " bytes: %s", path_names[p], bytes, rt_errmsg());
    faults_after_reduce(B, buf, on_dev, count);
    uint64_t wrong = check(B, buf, on_dev, count);
    const int world = B->info.world;
    double mean_us = (double)timed_ns * 1e-3 / (double)cfg->iters, max_us = mean_us;
    rt_comm_allreduce(B->c, &mean_us, 1, RT_COMM_F64, RT_RED_SUM, "commbench: the ranks' times");
    rt_comm_allreduce(B->c, &max_us, 1, RT_COMM_F64, RT_RED_MAX, "commbench: the slowest rank's time");
    rt_comm_allreduce(B->c, &wrong, 1, RT_COMM_U64, RT_RED_SUM, "commbench: the wrong elements");
    row->path = p;
    row->bytes = bytes;
    row->time_us = mean_us / world;
    row->max_time_us = max_us;
    row->algbw = row->time_us > 0 ? (double)bytes / (row->time_us * 1e3) : 0;
    row->busbw = row->algbw * 2.0 * (world - 1) / world;
    row->wrong = wrong;
    return 0;
}

/* ---- what the rows say ------------------------------------------------------------------- */

void commbench_verdict(const struct commbench_config *cfg, const struct commbench_row *rows, int n,
                       struct commbench_verdict *v)
{
    memset(v, 0, sizeof(*v));
    v->path = (cfg->paths & (1u << COMMBENCH_BUCKETER)) ? COMMBENCH_BUCKETER : COMMBENCH_COMM;
    for (int i = 0; i < n; i++) {
        const struct commbench_row *r = &rows[i];
        if (r->path != v->path)
            continue;
        if (r->busbw > v->best) {
            v->best = r->busbw;
            v->best_bytes = r->bytes;
        }
        if (r->bytes == cfg->bucket_bytes) {
            v->measured = 1;
            v->busbw = r->busbw;
        }
    }
    for (int i = 0; i < n && v->best > 0; i++)
        if (rows[i].path == v->path && rows[i].busbw >= COMMBENCH_REACH * v->best) {
            v->lo = v->lo ? RT_MIN(v->lo, rows[i].bytes) : rows[i].bytes;
            v->hi = RT_MAX(v->hi, rows[i].bytes);
        }
    v->fraction = v->best > 0 ? v->busbw / v->best : 0;
    v->reaches = v->measured && v->best > 0 && v->fraction >= COMMBENCH_REACH;
}
