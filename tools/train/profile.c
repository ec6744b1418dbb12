/*
 * profile.c - the step profile and its verdict: where each optimizer step's
 * time goes (data wait, copy, forward, backward, exposed communication,
 * optimizer, the rest), p50 and p99 over the run, and what limits the run
 * with the next thing to try. Also the trace's step spans: the step on the
 * training thread, and the compute stream's layers from the timeline.
 *
 * Forward, backward and the optimizer are timed on the compute stream (a
 * timeline: CUDA events on a GPU, the host clock on the CPU), the rest on the
 * host. The timeline is read after the update, when the host has waited for
 * the stream anyway (the loss download, the all-reduce); on a GPU reading the
 * optimizer's end waits for it, which the next step would have done at its
 * loss download.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/common.h"
#include "common/trace.h"
#include "tools/train/driver.h"

static const char *const phase_names[PROF_N] = {"data wait", "copy", "forward", "backward",
                                                "exposed comm", "optimizer", "rest", "step"};
static const char *const phase_keys[PROF_N] = {"data", "copy", "forward", "backward",
                                               "comm", "optimizer", "rest", "step"};

/* Bin 0 holds times under 1 us; bin b >= 1 holds [1 us * 1.02^(b-1), 1 us * 1.02^b). */
static int bin_of(uint64_t ns)
{
    if (ns < 1000)
        return 0;
    int b = 1 + (int)floor(log((double)ns / 1000.0) / log(1.02));
    return RT_MIN(b, PROF_BINS - 1);
}

static double bin_value(int b)
{
    return b == 0 ? 0.0 : 1000.0 * pow(1.02, (double)b - 0.5);
}

static double percentile(const uint32_t *h, uint64_t n, double q)
{
    if (!n)
        return 0;
    const uint64_t rank = (uint64_t)ceil(q * (double)n);
    uint64_t seen = 0;
    for (int b = 0; b < PROF_BINS; b++)
        if ((seen += h[b]) >= RT_MAX(rank, 1))
            return bin_value(b);
    return bin_value(PROF_BINS - 1);
}

int profile_create(struct train *T)
{
    struct train_profile *p = &T->prof;
    p->hist = rt_calloc(PROF_N, sizeof(*p->hist), "step profile");
    p->hist_all = rt_calloc(PROF_N, sizeof(*p->hist_all), "step profile");
    if (!p->hist || !p->hist_all)
        return -1;
    /* Per-layer marks only while tracing: each layer's forward and backward, per micro-batch. */
    const int per_micro = T->tr.rec ? 2 * RT_MAX(rt_model_node_count(T->model), 1) + 8 : 6;
    return rt_timeline_create(T->be, per_micro * (int)T->cfg.grad_accum + 4, &p->tl) < 0 ? -1 : 0;
}

void profile_destroy(struct train *T)
{
    rt_timeline_destroy(T->prof.tl);
    free(T->prof.hist);
    free(T->prof.hist_all);
    T->prof.tl = NULL;
    T->prof.hist = T->prof.hist_all = NULL;
}

void profile_step_begin(struct train *T)
{
    struct train_profile *p = &T->prof;
    if (T->pos.micro % T->cfg.grad_accum)
        return;
    trace_window(T, T->pos.update, 1);
    memset(p->cur, 0, sizeof(p->cur));
    p->t_step0 = T->meter.t_start;
    /* The stream is idle: the last step's end read its timeline. With tracing the anchor is exact. */
    rt_timeline_start(p->tl, rt_backend_stream(T->be), rt_trace_live());
    p->per_layer = rt_trace_live();
}

void profile_data_ready(struct train *T, uint64_t t_start, uint64_t t_data)
{
    struct train_profile *p = &T->prof;
    const uint64_t wait = t_data - t_start;
    /* The next batch's copy is issued inside the wait: it counts as copy. */
    p->cur[PROF_DATA] += wait > p->copy_in_wait ? wait - p->copy_in_wait : 0;
    p->copy_in_wait = 0;
    if (rt_trace_live())
        rt_trace_span(RT_TRACE_STEP, "data wait", NULL, t_start, t_data);
}

void profile_model_opts(struct train *T, struct rt_step_opts *so)
{
    rt_timeline_mark(T->prof.tl, "start", MARK_MICRO);
    so->timeline = T->prof.tl;
    so->per_layer = T->prof.per_layer;
}

/* Adds the timeline's device phases to p->cur; with tracing, the compute stream's spans. */
static void device_phases(struct train *T)
{
    struct train_profile *p = &T->prof;
    const struct rt_timeline_mark *m;
    const int n = rt_timeline_read(p->tl, &m);
    const int track = p->per_layer ? rt_trace_track("compute stream", 1) : -1;
    uint64_t prev = 0, fwd0 = 0, bwd0 = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t t = m[i].ns, d = prev && t > prev ? t - prev : 0;
        switch (m[i].kind) {
        case MARK_MICRO:
            fwd0 = t;
            break;
        case RT_MARK_INPUT:
        case RT_MARK_LAYER_FWD:
            p->cur[PROF_FORWARD] += d;
            rt_trace_span_on(track, RT_TRACE_COMPUTE, "fwd", m[i].label, prev, t);
            break;
        case RT_MARK_FORWARD:
            p->cur[PROF_FORWARD] += d;
            rt_trace_span_on(track, RT_TRACE_COMPUTE, "loss", NULL, prev, t);
            rt_trace_span_on(track, RT_TRACE_COMPUTE, "forward", NULL, fwd0, t);
            bwd0 = t;
            break;
        case RT_MARK_LAYER_BWD:
            p->cur[PROF_BACKWARD] += d;
            rt_trace_span_on(track, RT_TRACE_COMPUTE, "bwd", m[i].label, prev, t);
            break;
        case RT_MARK_BACKWARD:
            p->cur[PROF_BACKWARD] += d;
            rt_trace_span_on(track, RT_TRACE_COMPUTE, "backward", NULL, bwd0, t);
            break;
        case MARK_OPTIM_END:
            p->cur[PROF_OPTIM] += d;
            rt_trace_span_on(track, RT_TRACE_OPTIM, "optimizer", NULL, prev, t);
            break;
        default: /* MARK_OPTIM_START: the gap before it is the wait for the all-reduce */
            break;
        }
        prev = t;
    }
}

void profile_step_end(struct train *T)
{
    struct train_profile *p = &T->prof;
    device_phases(T);
    const uint64_t now = rt_now_ns();
    p->cur[PROF_COMM] = T->step_comm_ns;
    p->cur[PROF_STEP] = now - p->t_step0;
    uint64_t parts = 0;
    for (int k = 0; k < PROF_REST; k++)
        parts += p->cur[k];
    p->cur[PROF_REST] = p->cur[PROF_STEP] > parts ? p->cur[PROF_STEP] - parts : 0;
    for (int k = 0; k < PROF_N; k++) {
        const int b = bin_of(p->cur[k]);
        p->hist_all[k][b]++;
        if (p->steps_all >= PROF_WARMUP)
            p->hist[k][b]++;
    }
    if (p->steps_all++ >= PROF_WARMUP)
        p->steps++;
    if (rt_trace_live()) {
        char label[24];
        snprintf(label, sizeof(label), "%" PRIu64, T->pos.update - 1);
        rt_trace_span(RT_TRACE_STEP, "step", label, p->t_step0, now);
        const double imgs = (double)T->cfg.batch * T->cfg.grad_accum * T->world;
        rt_trace_counter("images/s", imgs / ((double)p->cur[PROF_STEP] * 1e-9), now);
        if (T->scaling)
            rt_trace_counter("loss scale", (double)T->scaler.scale, now);
    }
    trace_window(T, T->pos.update, 0);
}

void profile_stats(const struct train *T, struct prof_stats *out)
{
    const struct train_profile *p = &T->prof;
    const int steady = p->steps > 0;
    uint32_t(*h)[PROF_BINS] = steady ? p->hist : p->hist_all;
    out->steps = steady ? p->steps : p->steps_all;
    out->warm = !steady;
    for (int k = 0; k < PROF_N; k++) {
        out->p50[k] = percentile(h[k], out->steps, 0.50);
        out->p99[k] = percentile(h[k], out->steps, 0.99);
    }
}

/* ---- the verdict ------------------------------------------------------------------ */

/*
 * What limits the run, from the p50s: the input when the slowest rank waits
 * for data 15 % of its step or more; communication when the all-reduce left
 * exposed is 15 % or more on every rank -- where it is so on some ranks only,
 * or the ranks' forward + backward differ by half the wait or more, the wait
 * is for the slowest rank's compute, not for the link (in lock-step data
 * parallelism the rank that finishes backward last waits least); the host
 * when the time outside the measured phases (and the copy) is 25 % or more;
 * else compute. Thresholds are where fixing the phase pays more than the
 * run-to-run noise of these machines.
 */
struct rank_p50 {
    double data, step, comm, compute; /* ns; compute: forward + backward */
};

static double share_of(double part, double step)
{
    return step > 0 ? part / step : 0;
}

static void verdict(struct train *T, const struct prof_stats *st, const struct rank_p50 *ranks)
{
    struct prof_verdict *p = &T->verdict;
    const struct train_cfg *c = &T->cfg;
    const double step = st->p50[PROF_STEP] > 0 ? st->p50[PROF_STEP] : 1;
    int worst = 0, slow = 0, fast = 0, least = 0; /* most data wait; most and least compute; least comm wait */
    for (int r = 1; r < T->world; r++) {
        const struct rank_p50 *k = &ranks[r];
        if (share_of(k->data, k->step) > share_of(ranks[worst].data, ranks[worst].step))
            worst = r;
        if (k->compute > ranks[slow].compute)
            slow = r;
        if (k->compute < ranks[fast].compute)
            fast = r;
        if (share_of(k->comm, k->step) < share_of(ranks[least].comm, ranks[least].step))
            least = r;
    }
    const double imbalance = ranks[slow].compute - ranks[fast].compute;
    const double least_comm = share_of(ranks[least].comm, ranks[least].step);
    const double worst_data = share_of(ranks[worst].data, ranks[worst].step), worst_step = ranks[worst].step;
    const double comm = st->p50[PROF_COMM] / step, rest = (st->p50[PROF_REST] + st->p50[PROF_COPY]) / step;
    const double compute = (st->p50[PROF_FORWARD] + st->p50[PROF_BACKWARD] + st->p50[PROF_OPTIM]) / step;
    const double imgs = (double)c->batch * c->grad_accum * T->world;
    if (worst_data >= 0.15) {
        snprintf(p->limit, sizeof(p->limit), "input");
        snprintf(p->evidence, sizeof(p->evidence),
                 "rank %d waits %.1f ms for data in a %.1f ms step (%.0f%%); the model alone would run at about "
                 "%.0f img/s",
                 worst, ranks[worst].data * 1e-6, worst_step * 1e-6, 100 * worst_data,
                 imgs / ((worst_step - ranks[worst].data) * 1e-9));
        snprintf(p->advice, sizeof(p->advice),
                 "more loader workers (--workers %d; now %d)%s; `ringtrain loadbench DIR --target FILE.json` with "
                 "this run's --json output shows whether the loader can feed the model",
                 RT_MAX(c->workers, 1) * 2, RT_MAX(c->workers, 1),
                 c->stage_to ? "" : "; stage the data to node-local disk (--stage-to $TMPDIR, or `ringtrain stage`)");
    } else if (comm >= 0.15 && (least_comm < 0.15 || imbalance >= 0.5 * st->p50[PROF_COMM])) {
        snprintf(p->limit, sizeof(p->limit), "compute");
        snprintf(p->evidence, sizeof(p->evidence),
                 "the all-reduce wait here (%.1f ms, %.0f%% of the step) is for a slower rank: rank %d waits %.0f%%; "
                 "forward + backward take %.1f ms on rank %d and %.1f ms on rank %d",
                 st->p50[PROF_COMM] * 1e-6, 100 * comm, least, 100 * least_comm, ranks[slow].compute * 1e-6, slow,
                 ranks[fast].compute * 1e-6, fast);
        snprintf(p->advice, sizeof(p->advice),
                 "give every rank the same cores and device (ranks sharing cores, or a busy node, run out of step); "
                 "`ringtrain ranks` shows each rank's CPUs");
    } else if (comm >= 0.15) {
        snprintf(p->limit, sizeof(p->limit), "communication");
        snprintf(p->evidence, sizeof(p->evidence),
                 "the all-reduce left %.1f ms of a %.1f ms step exposed (%.0f%%) over %d buckets, on every rank (%.0f%% "
                 "at least)",
                 st->p50[PROF_COMM] * 1e-6, step * 1e-6, 100 * comm, rt_bucketer_count(T->bucketer),
                 100 * least_comm);
        if (c->no_overlap)
            snprintf(p->advice, sizeof(p->advice), "drop --no-overlap so buckets reduce while backward runs");
        else
            snprintf(p->advice, sizeof(p->advice),
                     "another bucket size (--bucket-cap-mb %g and %g; now %g); `ringtrain commbench` shows what the link "
                     "carries at each size; a larger --batch-size or --grad-accum sends less per image",
                     c->bucket_cap_mb / 2, c->bucket_cap_mb * 2, c->bucket_cap_mb);
    } else if (rest >= 0.25) {
        snprintf(p->limit, sizeof(p->limit), "host");
        snprintf(p->evidence, sizeof(p->evidence),
                 "%.1f ms of a %.1f ms step (%.0f%%) is spent outside data, compute and communication",
                 (st->p50[PROF_REST] + st->p50[PROF_COPY]) * 1e-6, step * 1e-6, 100 * rest);
        snprintf(p->advice, sizeof(p->advice),
                 "leave cores to the loader and the comm thread (--threads %d; now %d); a larger --batch-size spreads "
                 "the per-step work; look at the trace's training thread between the phases",
                 RT_MAX(c->threads - 1, 1), c->threads);
    } else {
        snprintf(p->limit, sizeof(p->limit), "compute");
        snprintf(p->evidence, sizeof(p->evidence),
                 "forward %.1f + backward %.1f + optimizer %.1f ms are %.0f%% of a %.1f ms step; data wait %.0f%%, "
                 "exposed comm %.0f%%",
                 st->p50[PROF_FORWARD] * 1e-6, st->p50[PROF_BACKWARD] * 1e-6, st->p50[PROF_OPTIM] * 1e-6,
                 100 * compute, step * 1e-6, 100 * worst_data, 100 * comm);
        snprintf(p->advice, sizeof(p->advice), "%s",
                 rt_backend_kind_of(T->be) == RT_BACKEND_CUDA
                     ? "16-bit activations (--amp bf16 or fp16) or a larger --batch-size to fill the GPU"
                     : "the model is the limit here: more ranks (each with its cores), a smaller model, or a GPU");
    }
}

void profile_report(struct train *T)
{
    struct prof_stats st;
    profile_stats(T, &st);
    const struct rank_p50 mine = {st.p50[PROF_DATA], st.p50[PROF_STEP], st.p50[PROF_COMM],
                                  st.p50[PROF_FORWARD] + st.p50[PROF_BACKWARD]};
    struct rank_p50 *ranks = rt_calloc((size_t)T->world, sizeof(*ranks), "step profiles");
    if (!ranks)
        return;
    rt_comm_allgather(T->comm, &mine, ranks, sizeof(mine), "the ranks' step profiles");
    verdict(T, &st, ranks);
    free(ranks);
    T->verdict.have = 1;
    T->verdict.st = st;
    if (!T->root || !st.steps)
        return;
    report_clear_bar(T);
    const double step = st.p50[PROF_STEP] > 0 ? st.p50[PROF_STEP] : 1;
    printf("step profile (rank 0, %" PRIu64 " optimizer steps%s), ms:\n", st.steps,
           st.warm ? ", warm-up included: the run was short" : " after the first 3");
    printf("  %-13s %9s %9s %6s\n", "phase", "p50", "p99", "share");
    for (int k = 0; k < PROF_N; k++)
        printf("  %-13s %9.3f %9.3f %5.0f%%\n", phase_names[k], st.p50[k] * 1e-6, st.p99[k] * 1e-6,
               k == PROF_STEP ? 100.0 : 100 * st.p50[k] / step);
    printf("verdict: %s-bound: %s\n  try: %s\n", T->verdict.limit, T->verdict.evidence, T->verdict.advice);
    fflush(stdout);
}

/* The profile and verdict as members of the --json summary (report.c). */
void profile_json(const struct train *T, json_t *o)
{
    if (!T->verdict.have)
        return;
    const struct prof_stats *st = &T->verdict.st;
    json_t *ph = json_object();
    for (int k = 0; k < PROF_N; k++)
        json_object_set_new(ph, phase_keys[k],
                            json_pack("{s:f, s:f}", "p50_ms", st->p50[k] * 1e-6, "p99_ms", st->p99[k] * 1e-6));
    json_object_set_new(o, "profile", json_pack("{s:I, s:b, s:o}", "steps", (json_int_t)st->steps, "warmup_included",
                                                st->warm, "phases", ph));
    json_object_set_new(o, "verdict", json_pack("{s:s, s:s, s:s}", "limit", T->verdict.limit, "evidence",
                                                T->verdict.evidence, "try", T->verdict.advice));
}
