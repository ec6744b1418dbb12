/*
 * step.c - the step: one update, read the way llm.c's training loop reads.
 * An update is the micro-batches of train_step_size() through forward and
 * backward (the gradients accumulating), then the gradients' reduction over
 * the ranks and the optimizer step (with loss scaling's unscale-and-skip and
 * global-norm clipping). train.h states each call's contract; this file keeps
 * their order. Observation (meters, the step profile, the progress bar, the
 * trace window) sits behind watch.c's three hooks; the epoch and the stop
 * checks are the loop's (loop.c). The position moves here and nowhere else
 * (train_advance), the epoch's end's move included.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "common/trace.h"
#include "tools/train/driver.h"

void train_advance(struct train *T, enum train_move m)
{
    switch (m) {
    case MOVE_MICRO:
        T->pos.batch++;
        T->pos.micro++;
        break;
    case MOVE_UPDATE:
        T->pos.update++;
        break;
    case MOVE_EPOCH:
        T->pos.epoch++;
        T->pos.batch = 0;
        break;
    }
}

int train_step(struct train *T)
{
    const uint32_t n = train_step_size(T);
    int r;
    watch_update_begin(T);
    for (uint32_t i = 0; i < n; i++)
        if ((r = train_step_micro(T, i, n)) < 0)
            return r;
    if ((r = train_step_reduce(T)) < 0 || (r = train_step_apply(T)) < 0)
        return r;
    watch_update_end(T);
    return 0;
}

int train_step_micro(struct train *T, uint32_t i, uint32_t n)
{
    struct train_batch b;
    int r = train_input_next(T, &b);
    if (r < 0)
        return r;
    /* The loader was made for the run's epochs from this position: an end before the epoch's is a bug. */
    if (r == 0)
        return rt_errf(-EIO, "the data ended at micro-batch %" PRIu64 " of epoch %" PRIu64 ", which has %" PRIu64
                             ": the loader gave fewer batches than the run's position expects",
                       T->pos.batch, T->pos.epoch + 1, T->in.batches_per_epoch);
    faults_sample_log(T, &b, i);
    r = train_step_forward_backward(T, &b, i, n);
    train_input_release(T, &b);
    if (r < 0)
        return r;
    watch_micro_end(T, &b);
    return 0;
}

/*
 * An update never spans two epochs. With the global order (--shuffle exact or
 * none) every update is whole: the sampler leaves out the epoch's last
 * N mod G records. With --shuffle window, whose ranks deal blocks, the last
 * update of an epoch that --grad-accum does not divide is short (as a
 * PyTorch loop that steps on the epoch's last batch). So every epoch's end,
 * validation and checkpoint come after a whole update, with no gradients
 * half-accumulated to carry or save.
 */
uint32_t train_step_size(const struct train *T)
{
    const uint64_t left = T->in.batches_per_epoch - T->pos.batch;
    return (uint32_t)RT_MIN((uint64_t)T->cfg.grad_accum, RT_MAX(left, 1));
}

/*
 * The micro-batch's options: the update's mean loss's gradient, scaled for loss scaling; its dropout stream,
 * keyed by the micro-batch's global place (update, then micro-batch m = i x world + rank of the sampler's
 * dealing), not by the rank: a run resumed on another world size that keeps the micro-batches draws the same
 * masks for them.
 */
static struct rt_step_opts step_opts(const struct train *T, const struct train_batch *b, uint32_t i, uint32_t n)
{
    /* Every rank's batch is full (the sampler drops the last partial one), so
     * the sum of the ranks' gradients scaled this way is the mean over the
     * update's samples, a short update's included. The loss scale multiplies
     * it on the device (the product rounded to float, as it was on the host). */
    return (struct rt_step_opts){
        .mode = RT_TRAIN, .label_smoothing = T->cfg.label_smoothing,
        .grad_scale = 1.0f / ((float)b->valid * (float)T->world * (float)n), .loss_scale = late_scale_dev(T),
        .dropout_stream = (T->pos.update * T->cfg.grad_accum + i) * (uint64_t)T->world + (uint64_t)T->rank,
        .mean = T->mean, .std = T->std, .input_ticket = b->ticket, .labels_dev = b->labels_dev};
}

/* This micro-batch as a graph (--cuda-graph): after the warm-up, while the model has not refused. */
static int graph_wanted(const struct train *T)
{
    return T->graph_on && steady_update(T, T->pos.update);
}

/* The first time the model refuses (a failed capture): one line saying why, and eager from then on (graph_on 0:
 * this runs no more). */
static void graph_check(struct train *T)
{
    const char *why = rt_model_graph_status(T->model, NULL, NULL);
    if (!why)
        return;
    T->graph_on = 0;
    T->graph_why = why;
    if (T->root)
        rt_info("cuda graph: the steps stay op by op from update %" PRIu64 ": %s", T->pos.update, why);
}

int train_step_forward_backward(struct train *T, const struct train_batch *b, uint32_t i, uint32_t n)
{
    if (i == 0) {
        rt_model_zero_grads(T->model);
        late_begin(T);
    }
    struct rt_step_opts so = step_opts(T, b, i, n);
    if (i + 1 == n) {
        /* Only the update's last micro-batch reduces: the others just accumulate. */
        rt_bucketer_begin(T->bucketer, T->pos.update);
        so.grads_ready = rt_bucketer_ready;
        so.grads_ready_arg = T->bucketer;
    }
    rt_comm_set_phase(T->comm, T->pos.update, RT_PHASE_COMPUTE);
    faults_before_compute(T);
    profile_model_opts(T, &so);
    faults_step_opts(T, &so);
    /* The loss sums stay on the device: late.c reads them a step late (the non-finite check with them). */
    so.stats_dev = late_stats_dev(T, i);
    /* A graph has no marks inside: the profile sees its forward and backward as one span, after it. */
    const int graph = graph_wanted(T);
    if (graph) {
        so.graph = 1;
        so.timeline = NULL;
    }
    const uint64_t t0 = rt_trace_begin();
    const int rc = rt_model_step(T->model, &so, (int)T->cfg.batch, b->images, b->labels, NULL);
    if (rc < 0)
        return rc;
    if (graph) {
        rt_timeline_mark(T->prof.tl, "forward+backward (graph)", MARK_GRAPH);
        graph_check(T);
    }
    rt_trace_end(t0, RT_TRACE_COMPUTE, "forward+backward", NULL);
    late_micro_done(T);
    train_advance(T, MOVE_MICRO);
    return 0;
}

int step_nonfinite_error(const struct train *T)
{
    if (T->nonfinite[0])
        return rt_errf(-ERANGE, "%s. Lower --lr or set --clip-grad-norm", T->nonfinite);
    /* Read a step late: the update before this one. */
    return rt_errf(-ERANGE, "another rank's loss became non-finite at optimizer step %" PRIu64
                            " (its message names the tensor)", T->pos.update - 1);
}

uint32_t step_control_word(const struct train *T)
{
    const int sig = loop_stop_signal;
    return (sig ? CTL_STOP : 0u) | (T->nonfinite[0] ? CTL_NONFINITE : 0u) | (sig == SIGTERM ? CTL_SIGTERM : 0u) |
           (sig == SIGUSR1 ? CTL_SIGUSR1 : 0u);
}

int train_step_reduce(struct train *T)
{
    uint32_t all = 0;
    /* The update before this one, now that this one's forward and backward are queued behind it: its loss
     * (a non-finite one goes into this update's control word) and its gradient norm. */
    int rc = late_collect_previous(T);
    if (rc < 0)
        return rc;
    rt_comm_set_phase(T->comm, T->pos.update, RT_PHASE_GRAD_WAIT);
    const uint64_t t0 = rt_trace_begin();
    rc = rt_bucketer_finish(T->bucketer, step_control_word(T), &all, &T->step_comm_ns);
    if (rc < 0)
        return rc;
    rt_trace_end(t0, RT_TRACE_COMM, "all-reduce wait", NULL);
    T->ctl = all;
    if (all & CTL_NONFINITE)
        return step_nonfinite_error(T);
    rt_comm_set_phase(T->comm, T->pos.update, RT_PHASE_OPTIM);
    return 0;
}

/*
 * Loss scaling after the update's gradients are summed over the ranks (so every rank sees the same overflow and
 * takes the same decision), on the device: unscale, check, update the scale and skip the update if it overflowed
 * (late.c). First the host takes its verdict on the update before, read a step late: the step count and the
 * learning rate below are then those of the applied updates, and a run that overflows too often stops here.
 */
static int unscale(struct train *T)
{
    faults_before_unscale(T);
    const int r = late_scaler(T);
    if (r < 0)
        return r;
    late_unscale(T);
    return 0;
}

static int apply(struct train *T)
{
    if (T->scaling) {
        const int r = unscale(T);
        if (r < 0)
            return r;
    }
    /* Clipping decides on the device; late.c reads the norm a step late and stops the run if it was not finite. */
    if (T->cfg.clip_grad_norm > 0)
        late_norm(T, rt_clip_grad_norm_async(T->opt, T->cfg.clip_grad_norm));
    /* The schedule counts applied updates: one skipped by loss scaling does not advance it (an overflow of this
     * update skips it on the device; the count is taken back when it is read, before the next update). With
     * --lr-head the classifier, laid out first, is a group of its own. */
    const uint64_t applied = (uint64_t)rt_optim_steps(T->opt);
    rt_optim_step_groups(T->opt, rt_sched_lr(&T->sched, applied), rt_sched_lr(&T->sched_head, applied));
    return 0;
}

int train_step_apply(struct train *T)
{
    /* Timed on the compute stream for the step profile (the marks' gap before is the all-reduce's). */
    rt_timeline_mark(T->prof.tl, "optimizer start", MARK_OPTIM_START);
    const uint64_t t0 = rt_trace_begin();
    const int rc = apply(T);
    rt_trace_end(t0, RT_TRACE_OPTIM, "optimizer", NULL);
    rt_timeline_mark(T->prof.tl, "optimizer", MARK_OPTIM_END);
    if (rc == 0) {
        late_commit(T);
        train_advance(T, MOVE_UPDATE);
    }
    return rc;
}
