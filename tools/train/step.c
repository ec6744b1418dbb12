/*
 * step.c - one micro-batch through forward and backward, and at an update's
 * last micro-batch the gradient reduction and the optimizer step (with loss
 * scaling's unscale-and-skip and global-norm clipping). train.h states each
 * call's contract; this file keeps their order and nothing else.
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

/* Set by the SIGTERM/SIGUSR1 handler loop.c installs; read once per update. */
volatile sig_atomic_t train_stop_signal;

int train_at_update(const struct train *T)
{
    return (T->pos.micro + 1) % T->cfg.grad_accum == 0;
}

/* Names the first non-finite tensor of the last step, or `fallback`. */
static const char *first_nonfinite(struct train *T, char *buf, size_t len, const char *fallback)
{
    rt_model_find_nonfinite(T->model, buf, len);
    return buf[0] ? buf : fallback;
}

/* The micro-batch's options: the global mean loss's gradient, scaled for loss scaling; its dropout stream. */
static struct rt_step_opts step_opts(const struct train *T, const struct train_batch *b)
{
    const float scale = T->scaling ? T->scaler.scale : 1.0f;
    /* Every rank's batch is full (the sampler drops the last partial one), so
     * the sum of the ranks' gradients scaled this way is the mean over all. */
    return (struct rt_step_opts){
        .mode = RT_TRAIN, .label_smoothing = T->cfg.label_smoothing,
        .grad_scale = 1.0f / ((float)b->valid * (float)T->world * (float)T->cfg.grad_accum) * scale,
        .dropout_offset = (T->pos.micro * (uint64_t)T->world + (uint64_t)T->rank) << 32,
        .mean = T->mean, .std = T->std, .input_ticket = b->ticket};
}

int train_forward_backward(struct train *T, const struct train_batch *b)
{
    const int last = train_at_update(T);
    if (T->pos.micro % T->cfg.grad_accum == 0)
        rt_model_zero_grads(T->model);
    struct rt_step_opts so = step_opts(T, b);
    if (last) {
        /* Accumulation micro-batches before the last reduce nothing. */
        rt_bucketer_begin(T->bucketer, T->pos.update);
        so.grads_ready = rt_bucketer_ready;
        so.grads_ready_arg = T->bucketer;
    }
    rt_comm_set_phase(T->comm, T->pos.update, RT_PHASE_COMPUTE);
    fault_before_compute(T);
    T->step_loss = (struct rt_loss_stats){0};
    profile_model_opts(T, &so);
    const uint64_t t0 = rt_trace_begin();
    if (rt_model_step(T->model, &so, (int)T->cfg.batch, b->images, b->labels, &T->step_loss) < 0)
        return -1;
    rt_trace_end(t0, RT_TRACE_COMPUTE, "forward+backward", NULL);
    if (!isfinite(T->step_loss.loss_sum) && !T->nonfinite[0]) {
        char where[160];
        snprintf(T->nonfinite, sizeof(T->nonfinite),
                 "the loss became %s at epoch %" PRIu64 " step %" PRIu64 " (optimizer step %" PRIu64
                 ")%s; first non-finite tensor: %s",
                 isnan(T->step_loss.loss_sum) ? "NaN" : "infinite", T->pos.epoch + 1, T->pos.batch, T->pos.update,
                 T->world > 1 ? " on this rank" : "", first_nonfinite(T, where, sizeof(where), "the loss itself"));
    }
    return 0;
}

/* This rank's bits of the control word. */
static uint32_t control_word(const struct train *T)
{
    const int sig = train_stop_signal;
    return (sig ? CTL_STOP : 0u) | (T->nonfinite[0] ? CTL_NONFINITE : 0u) | (sig == SIGTERM ? CTL_SIGTERM : 0u) |
           (sig == SIGUSR1 ? CTL_SIGUSR1 : 0u);
}

int train_reduce(struct train *T)
{
    uint32_t all = 0;
    rt_comm_set_phase(T->comm, T->pos.update, RT_PHASE_GRAD_WAIT);
    const uint64_t t0 = rt_trace_begin();
    if (rt_bucketer_finish(T->bucketer, control_word(T), &all, &T->step_comm_ns) < 0)
        return -1;
    rt_trace_end(t0, RT_TRACE_COMM, "all-reduce wait", NULL);
    T->ctl = all;
    if (all & CTL_NONFINITE) {
        if (T->nonfinite[0])
            return rt_errf(-ERANGE, "%s. Lower --lr or set --clip-grad-norm", T->nonfinite);
        return rt_errf(-ERANGE, "another rank's loss became non-finite at optimizer step %" PRIu64
                                " (its message names the tensor)", T->pos.update);
    }
    rt_comm_set_phase(T->comm, T->pos.update, RT_PHASE_OPTIM);
    return 0;
}

/*
 * Loss scaling after the update's gradients are summed over the ranks (so
 * every rank sees the same overflow and takes the same decision): unscale,
 * check, and update the scale. Returns 0 to apply the update, 1 to skip
 * it, -1 to stop (the message names the first non-finite tensor).
 */
static int unscale(struct train *T)
{
    fault_before_unscale(T);
    const float used = T->scaler.scale;
    int found = rt_optim_unscale(T->opt, rt_model_grads(T->model), rt_model_param_count(T->model), 1.0f / used);
    const enum rt_scaler_verdict v = rt_scaler_update(&T->scaler, found);
    if (v == RT_SCALER_APPLY)
        return 0;
    if (v == RT_SCALER_SKIP) {
        if (T->root)
            rt_info("step %" PRIu64 ": gradients overflowed at loss scale %g: update skipped, scale now %g",
                    T->pos.update, (double)used, (double)T->scaler.scale);
        return 1;
    }
    char where[160];
    const char *first = first_nonfinite(T, where, sizeof(where), "(not found)");
    if (v == RT_SCALER_STOP_SKIPS)
        return rt_errf(-ERANGE, "%u optimizer steps in a row overflowed (step %" PRIu64 ", loss scale now %g); "
                                "first non-finite tensor: %s. The run diverged: lower --lr, set --clip-grad-norm, "
                                "or use --amp bf16",
                       T->scaler.skips_in_row, T->pos.update, (double)T->scaler.scale, first);
    return rt_errf(-ERANGE, "the loss scale collapsed to %g at step %" PRIu64 " (gradients overflow even unscaled); "
                            "first non-finite tensor: %s. Lower --lr, set --clip-grad-norm, or use --amp bf16",
                   (double)T->scaler.scale, T->pos.update, first);
}

static int clip(struct train *T)
{
    float norm = rt_clip_grad_norm(T->opt, rt_model_grads(T->model), rt_model_param_count(T->model),
                                   T->cfg.clip_grad_norm);
    if (isfinite(norm))
        return 0;
    char where[160];
    return rt_errf(-ERANGE, "the gradient norm became non-finite at optimizer step %" PRIu64
                            "; first non-finite tensor: %s",
                   T->pos.update, first_nonfinite(T, where, sizeof(where), "(not found)"));
}

static int update(struct train *T)
{
    if (T->scaling) {
        int r = unscale(T);
        if (r)
            return r < 0 ? -1 : 0;
    }
    if (T->cfg.clip_grad_norm > 0 && clip(T) < 0)
        return -1;
    /* The schedule counts applied updates: one skipped by loss scaling does not advance it. */
    rt_optim_step(T->opt, rt_model_params(T->model), rt_model_grads(T->model),
                  rt_sched_lr(&T->sched, (uint64_t)rt_optim_steps(T->opt)));
    return 0;
}

int train_update(struct train *T)
{
    /* Timed on the compute stream for the step profile (the marks' gap before is the all-reduce's). */
    rt_timeline_mark(T->prof.tl, "optimizer start", MARK_OPTIM_START);
    const uint64_t t0 = rt_trace_begin();
    const int rc = update(T);
    rt_trace_end(t0, RT_TRACE_OPTIM, "optimizer", NULL);
    rt_timeline_mark(T->prof.tl, "optimizer", MARK_OPTIM_END);
    return rc;
}

void train_advance(struct train *T, const struct train_batch *b)
{
    const int last = train_at_update(T);
    T->pos.micro++;
    if (last)
        T->pos.update++;
    meter_step(&T->meter, &T->step_loss, b->valid, last ? T->step_comm_ns : 0);
    T->pos.batch++;
}

enum train_stop step_stop_before_start(struct train *T)
{
    int32_t bits = (int32_t)control_word(T);
    /* Each bit on its own (MAX of 0/1 is their OR): a signal's kind is named in the report. */
    int32_t v[3] = {!!(bits & CTL_STOP), !!(bits & CTL_SIGTERM), !!(bits & CTL_SIGUSR1)};
    rt_comm_allreduce(T->comm, v, 3, RT_COMM_I32, RT_RED_MAX, "the stop check before the first step");
    T->ctl = (v[0] ? CTL_STOP : 0u) | (v[1] ? CTL_SIGTERM : 0u) | (v[2] ? CTL_SIGUSR1 : 0u);
    return v[0] ? STOP_SIGNAL : STOP_DONE;
}

enum train_stop step_stop_requested(const struct train *T)
{
    if (T->cfg.max_updates && T->pos.update >= T->cfg.max_updates)
        return STOP_STEPS;
    return T->ctl & CTL_STOP ? STOP_SIGNAL : STOP_DONE;
}
