/*
 * verdict.c - what limits a run (verdict.h): the thresholds' rules for a
 * training step and for the loader's stages, the medians of a consumer's
 * own timings, and the sentences every caller shares.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "loader/loader.h"
#include "loader/verdict.h"
#include "staging/ring.h"

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The lower median: the value at rank ceil(n / 2) of the sorted values (n > 0). 0 or -ENOMEM. */
static int median(const uint64_t *v, size_t n, double *out)
{
    uint64_t *s = rt_malloc(n * sizeof(*s), "step timings");
    if (!s)
        return -ENOMEM;
    memcpy(s, v, n * sizeof(*s));
    qsort(s, n, sizeof(*s), cmp_u64);
    *out = (double)s[(n + 1) / 2 - 1];
    free(s);
    return 0;
}

enum rt_limit rt_step_limit(const struct rt_step_shares *s)
{
    if (s->data >= RT_INPUT_BOUND_SHARE)
        return RT_LIMIT_INPUT;
    if (s->comm >= RT_COMM_BOUND_SHARE)
        return s->comm_least < RT_COMM_BOUND_SHARE || s->imbalance >= RT_STRAGGLER_RATIO ? RT_LIMIT_SLOWER_RANK
                                                                                         : RT_LIMIT_COMM;
    return s->host >= RT_HOST_BOUND_SHARE ? RT_LIMIT_HOST : RT_LIMIT_COMPUTE;
}

const char *rt_limit_word(enum rt_limit l)
{
    switch (l) {
    case RT_LIMIT_INPUT: return "input";
    case RT_LIMIT_COMM: return "communication";
    case RT_LIMIT_HOST: return "host";
    case RT_LIMIT_SLOWER_RANK:
    case RT_LIMIT_COMPUTE: break;
    }
    return "compute";
}

double rt_verdict_alone(double step_ns, double wait_ns, double images_per_step, char *buf, size_t len)
{
    /* Not when the wait is (nearly) all of the step: the difference is below the clock's resolution. */
    const double own = step_ns - wait_ns;
    if (!(own > 0.01 * step_ns)) {
        snprintf(buf, len, "; the rest of the step is too short to say how fast the model alone would run");
        return 0;
    }
    if (images_per_step <= 0) {
        snprintf(buf, len, "; the model's own work takes %.1f ms of it", own * 1e-6);
        return 0;
    }
    const double rate = images_per_step / (own * 1e-9);
    snprintf(buf, len, "; the model alone would run at about %.0f img/s", rate);
    return rate;
}

void rt_verdict_text(const char *limit, const char *evidence, const char *advice, char *buf, size_t len)
{
    snprintf(buf, len, "verdict: %s-bound: %s\n  try: %s", limit, evidence, advice);
}

int rt_input_verdict(const uint64_t *wait_ns, size_t nwait, const uint64_t *step_ns, size_t nstep,
                     uint32_t images_per_step, int workers, int staged, struct rt_input_verdict *v)
{
    if (!nwait || !nstep || !wait_ns || !step_ns || !v)
        return rt_errf(-EINVAL, "input verdict: no step timings (%zu waits, %zu steps)", nwait, nstep);
    memset(v, 0, sizeof(*v));
    int rc = median(wait_ns, nwait, &v->wait_p50_ns);
    if (rc == 0)
        rc = median(step_ns, nstep, &v->step_p50_ns);
    if (rc < 0)
        return rc;
    const double wait = v->wait_p50_ns, step = v->step_p50_ns, own = step - wait;
    v->share = step > 0 ? wait / step : 0;
    const enum rt_limit l = rt_step_limit(&(struct rt_step_shares){.data = v->share});
    v->input_bound = l == RT_LIMIT_INPUT;
    snprintf(v->limit, sizeof(v->limit), "%s", rt_limit_word(l));
    if (v->input_bound) {
        char alone[112], target[160] = "`ringtrain loadbench DIR` shows what ringtrain's loader delivers on this data";
        const double rate = rt_verdict_alone(step, wait, images_per_step, alone, sizeof(alone));
        if (rate > 0)
            snprintf(target, sizeof(target),
                     "`ringtrain loadbench DIR --target %.0f` shows whether ringtrain's loader can feed the model",
                     rate);
        const int now = RT_MAX(workers, 0), more = RT_MAX(workers, 1) * 2;
        snprintf(v->evidence, sizeof(v->evidence), "the step waits %.1f ms of %.1f ms for data (%.0f%%)%s",
                 wait * 1e-6, step * 1e-6, 100 * v->share, alone);
        snprintf(v->advice, sizeof(v->advice),
                 "more loader workers (workers=%d of ringtrain.Loader, or num_workers=%d of a DataLoader; now %d)%s; "
                 "%s",
                 more, more, now,
                 staged ? "" : "; stage the data to node-local disk (ringtrain.stage(), or `ringtrain stage`)",
                 target);
    } else {
        snprintf(v->evidence, sizeof(v->evidence),
                 "the step waits %.1f ms of %.1f ms for data (%.0f%%); the other %.1f ms are the consumer's own "
                 "work (model, optimizer, communication)",
                 wait * 1e-6, step * 1e-6, 100 * v->share, (own > 0 ? own : 0) * 1e-6);
        snprintf(v->advice, sizeof(v->advice),
                 "the model is the limit here, not the input: a faster loader would not shorten the step; "
                 "torch.profiler shows where the step's own time goes");
    }
    rt_verdict_text(v->limit, v->evidence, v->advice, v->text, sizeof(v->text));
    return 0;
}

int rt_loader_alone_verdict(const uint64_t *wait_ns, size_t nwait, uint32_t images_per_step,
                            struct rt_input_verdict *v)
{
    if (!nwait || !wait_ns || !v)
        return rt_errf(-EINVAL, "input verdict: no step timings (%zu waits)", nwait);
    memset(v, 0, sizeof(*v));
    const int rc = median(wait_ns, nwait, &v->wait_p50_ns);
    if (rc < 0)
        return rc;
    v->step_p50_ns = v->wait_p50_ns;
    v->share = 1;
    snprintf(v->limit, sizeof(v->limit), "none");
    char rate[96] = "";
    if (images_per_step && v->wait_p50_ns > 0)
        snprintf(rate, sizeof(rate), ": the loader alone delivers about %.0f img/s",
                 images_per_step / (v->wait_p50_ns * 1e-9));
    snprintf(v->evidence, sizeof(v->evidence),
             "the loop did no work of its own, so each step is its wait for data (median %.3f ms)%s",
             v->wait_p50_ns * 1e-6, rate);
    snprintf(v->advice, sizeof(v->advice),
             "time the training step itself -- ringtrain.profile(loader, body=step) or ringtrain.Profiler(loader) "
             "in the training loop -- to see whether the input limits it");
    snprintf(v->text, sizeof(v->text), "verdict: no limit measured: %s\n  try: %s", v->evidence, v->advice);
    return 0;
}

/* ---- the loader's stages ------------------------------------------------------------------------------- */

static const char *const stage_names[RT_STAGE_N][2] = {
    [RT_STAGE_IO] = {"io", "io"},
    [RT_STAGE_CHECKSUM] = {"checksum", "checksum"},
    [RT_STAGE_DECOMPRESS] = {"decompress", "decompress"},
    [RT_STAGE_DECODE] = {"decode", "decode"},
    [RT_STAGE_AUGMENT] = {"augment", "augment"},
    [RT_STAGE_SLOT_WAIT] = {"slot wait", "slot_wait"},
    [RT_STAGE_RING_WAIT] = {"ring wait", "ring_wait"},
    [RT_STAGE_IDLE] = {"idle", "idle"},
};

const char *rt_stage_name(enum rt_stage s, int key)
{
    return (unsigned)s < RT_STAGE_N ? stage_names[s][!!key] : "?";
}

static double share_of(uint64_t ns, double of_s)
{
    return of_s > 0 ? (double)ns * 1e-9 / of_s : 0;
}

void rt_stage_shares(const struct rt_loader_stats *s, const struct rt_wait_stats *prod,
                     const struct rt_wait_stats *cons, double wall_s, double share[RT_STAGE_N])
{
    const double pool = wall_s * s->workers;
    share[RT_STAGE_IO] = share_of(s->io_busy_ns, wall_s);
    share[RT_STAGE_CHECKSUM] = share_of(s->checksum_ns, pool);
    share[RT_STAGE_DECOMPRESS] = share_of(s->decompress_ns, pool);
    share[RT_STAGE_DECODE] = share_of(s->decode_ns, pool);
    share[RT_STAGE_AUGMENT] = share_of(s->augment_ns, pool);
    share[RT_STAGE_SLOT_WAIT] = share_of(prod->total_ns, wall_s);
    share[RT_STAGE_RING_WAIT] = share_of(cons->total_ns, wall_s);
    share[RT_STAGE_IDLE] = share_of(s->worker_idle_ns, pool);
}

void rt_stage_limit(const double share[RT_STAGE_N], char *buf, size_t len)
{
    /* The busiest of the stages that do work: where the workers spend most time, unless reads keep the wall
     * clock busy longer. */
    enum rt_stage top = RT_STAGE_IO;
    for (int i = RT_STAGE_IO + 1; i <= RT_STAGE_AUGMENT; i++)
        if (share[i] > share[top])
            top = (enum rt_stage)i;
    if (share[RT_STAGE_RING_WAIT] < RT_CONSUMER_WAIT_SHARE)
        snprintf(buf, len, "limited by the consumer: it waited for batches only %.0f%% of the time",
                 100 * share[RT_STAGE_RING_WAIT]);
    else if (share[RT_STAGE_IDLE] >= RT_WORKERS_IDLE_SHARE && top != RT_STAGE_IO)
        snprintf(buf, len, "workers idle %.0f%% of the time; limited by reads or planning (io busy %.0f%%)",
                 100 * share[RT_STAGE_IDLE], 100 * share[RT_STAGE_IO]);
    else
        snprintf(buf, len, "limited by %s (%.0f%% of %s time)", rt_stage_name(top, 0), 100 * share[top],
                 top == RT_STAGE_IO ? "wall" : "worker");
}
