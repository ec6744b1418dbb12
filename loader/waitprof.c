/*
 * waitprof.c - the input side's verdict from a consumer's per-step timings
 * (waitprof.h): the medians of its waits and steps, the trainer's threshold,
 * and the evidence and advice in the trainer's words, with the knobs of a
 * consumer that is not the trainer (a Python loader's `workers=`, a
 * DataLoader's num_workers, ringtrain.stage()).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "loader/waitprof.h"

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
    v->input_bound = v->share >= RT_INPUT_BOUND_SHARE;
    if (v->input_bound) {
        /* What the model alone would do, from the step without its wait: not when the wait is (nearly) all of
         * the step, where the difference is below the clock's resolution. */
        char alone[112] = "; the rest of the step is too short to say how fast the model alone would run";
        char target[160] = "`ringtrain loadbench DIR` shows what ringtrain's loader delivers on this data";
        if (own > 0.01 * step && images_per_step) {
            const double rate = images_per_step / (own * 1e-9);
            snprintf(alone, sizeof(alone), "; the model alone would run at about %.0f img/s", rate);
            snprintf(target, sizeof(target),
                     "`ringtrain loadbench DIR --target %.0f` shows whether ringtrain's loader can feed the model",
                     rate);
        } else if (own > 0.01 * step) {
            snprintf(alone, sizeof(alone), "; the model's own work takes %.1f ms of it", own * 1e-6);
        }
        const int now = RT_MAX(workers, 0), more = RT_MAX(workers, 1) * 2;
        snprintf(v->limit, sizeof(v->limit), "input");
        snprintf(v->evidence, sizeof(v->evidence), "the step waits %.1f ms of %.1f ms for data (%.0f%%)%s",
                 wait * 1e-6, step * 1e-6, 100 * v->share, alone);
        snprintf(v->advice, sizeof(v->advice),
                 "more loader workers (workers=%d of ringtrain.Loader, or num_workers=%d of a DataLoader; now %d)%s; "
                 "%s",
                 more, more, now,
                 staged ? "" : "; stage the data to node-local disk (ringtrain.stage(), or `ringtrain stage`)",
                 target);
    } else {
        snprintf(v->limit, sizeof(v->limit), "compute");
        snprintf(v->evidence, sizeof(v->evidence),
                 "the step waits %.1f ms of %.1f ms for data (%.0f%%); the other %.1f ms are the consumer's own "
                 "work (model, optimizer, communication)",
                 wait * 1e-6, step * 1e-6, 100 * v->share, (own > 0 ? own : 0) * 1e-6);
        snprintf(v->advice, sizeof(v->advice),
                 "the model is the limit here, not the input: a faster loader would not shorten the step; "
                 "torch.profiler shows where the step's own time goes");
    }
    snprintf(v->text, sizeof(v->text), "verdict: %s-bound: %s\n  try: %s", v->limit, v->evidence, v->advice);
    return 0;
}
