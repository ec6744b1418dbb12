/*
 * late.c - what an update leaves on the device, read a step late, so that
 * the host never waits for the stream inside a step: each micro-batch's loss
 * sums (rt_step_opts.stats_dev), with --clip-grad-norm the squared gradient
 * norm (rt_clip_grad_norm_async), and with loss scaling the overflow flag
 * and the scale after it: the scale lives on the device (late_scale_dev),
 * where the unscale, the scale's update and the skipped update are decided
 * (PyTorch's _amp_update_scale_); the host replays rt_scaler_update a step
 * later for its messages, its stop rules and the optimizer's step count.
 *
 * Two slots, used by updates in turn. Update k's ops write into slot k % 2;
 * after its optimizer step, late_commit() queues their copy into page-locked
 * host memory and records an event. Update k+1 reads slot k (late_collect,
 * from train_step_reduce) once its own forward and backward are queued:
 * the event it waits for then has a whole update's work behind it, so the
 * stream never runs dry (rt_backend_host_waits does not count it). A log
 * line, the epoch's end, a checkpoint or a caller asking for the last loss
 * reads what is pending at once (late_flush): those are the host waits a
 * run still makes, outside its steady steps.
 *
 * What reading late changes, and its bound: a non-finite loss or gradient
 * norm of update k stops the run at update k+1's reduction instead of k's
 * (one update later; the optimizer of update k has run by then, and no
 * checkpoint is written after it), and the tensor the message names is the
 * first non-finite one when the loss is read, a step after it became so.
 * Loss scaling's verdict on update k is taken at update k+1's optimizer
 * step, before it is issued (late_scaler): a skipped update k is taken back
 * from the optimizer's step count there, so update k+1's learning rate and
 * Adam step are those of the applied updates, exactly as before; a stop
 * (too many skips, a collapsed scale) ends the run there, naming the first
 * non-finite tensor of update k+1's gradients. The meters see each
 * micro-batch's loss in the same order as before, so every figure,
 * checkpoint and digest is the same bit for bit.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "tools/train/driver.h"

/* The update in slot `i` of the late reader: its micro-batches' sums and its squared norm, on the host. */
struct late_host {
    float norm_sq;
    float found, scale;         /* loss scaling: the overflow flag, the scale after the update */
    uint32_t pad_;
    struct rt_loss_stats micro[];
};

static size_t host_bytes(const struct train *T)
{
    return sizeof(struct late_host) + (size_t)T->cfg.grad_accum * sizeof(struct rt_loss_stats);
}

int late_create(struct train *T)
{
    struct train_late *L = &T->late;
    const struct rt_ops *ops = rt_backend_ops(T->be);
    const size_t per = T->cfg.grad_accum;
    if (!(L->dev = ops->alloc(T->be, 2 * per * sizeof(struct rt_loss_stats))))
        return -ENOMEM;
    if (T->scaling) {
        /* The scale and its growth count, from the host's state (a resumed run's included). */
        if (!(L->scale_dev = ops->alloc(T->be, 2 * sizeof(float))))
            return -ENOMEM;
        const float st[2] = {T->scaler.scale, (float)T->scaler.good};
        ops->upload(rt_backend_stream(T->be), L->scale_dev, st, sizeof(st));
    }
    for (int i = 0; i < 2; i++) {
        struct train_late_slot *s = &L->slot[i];
        /* Page-locked on a GPU (a DMA that needs no staging), ordinary memory on the CPU. */
        if (rt_backend_kind_of(T->be) == RT_BACKEND_CUDA && (s->host = rt_backend_host_alloc(T->be, host_bytes(T))))
            s->pinned = 1;
        else if (!(s->host = rt_malloc(host_bytes(T), "late results")))
            return -ENOMEM;
        memset(s->host, 0, host_bytes(T));
        const int rc = rt_event_create(T->be, &s->ready);
        if (rc < 0)
            return rc;
    }
    return 0;
}

void late_destroy(struct train *T)
{
    struct train_late *L = &T->late;
    for (int i = 0; i < 2; i++) {
        struct train_late_slot *s = &L->slot[i];
        /* A copy may still be queued into the host memory (a run that ended in an error). */
        if (s->pending && s->ready)
            rt_event_synchronize(s->ready);
        rt_event_destroy(s->ready);
        if (s->pinned)
            rt_backend_host_free(T->be, s->host);
        else
            free(s->host);
        s->host = NULL;
        s->ready = NULL;
        s->pending = 0;
    }
    if (L->dev && T->be)
        rt_backend_ops(T->be)->free(T->be, L->dev);
    if (L->scale_dev && T->be)
        rt_backend_ops(T->be)->free(T->be, L->scale_dev);
    L->dev = NULL;
    L->scale_dev = NULL;
}

static struct train_late_slot *slot_of(struct train *T, uint64_t update)
{
    return &T->late.slot[update & 1u];
}

struct rt_loss_stats *late_stats_dev(struct train *T, uint32_t i)
{
    return T->late.dev + (size_t)(T->pos.update & 1u) * T->cfg.grad_accum + i;
}

void late_norm(struct train *T, const float *norm_sq_dev)
{
    struct train_late_slot *s = slot_of(T, T->pos.update);
    struct late_host *h = s->host;
    rt_backend_ops(T->be)->download_async(rt_backend_stream(T->be), &h->norm_sq, norm_sq_dev, sizeof(float));
    s->clipped = 1;
}

void late_begin(struct train *T)
{
    struct train_late_slot *s = slot_of(T, T->pos.update);
    s->update = T->pos.update;
    s->epoch = T->pos.epoch;
    s->batch0 = T->pos.batch;
    s->n = 0;
    s->clipped = 0;
    s->scaled = 0;
}

const float *late_scale_dev(const struct train *T)
{
    return T->late.scale_dev;
}

/*
 * Loss scaling's end of an update, all queued: unscale with the device's scale, update the scale, skip the
 * optimizer step on an overflow (rt_optim_skip_if), and copy the flag and the new scale out.
 */
void late_unscale(struct train *T)
{
    struct train_late_slot *s = slot_of(T, T->pos.update);
    struct late_host *h = s->host;
    const struct rt_ops *ops = rt_backend_ops(T->be);
    struct rt_stream *st = rt_backend_stream(T->be);
    float *sc = T->late.scale_dev;
    const float *found = rt_optim_unscale_async(T->opt, sc);
    ops->scaler_update(st, sc, sc + 1, found, T->scaler.growth, T->scaler.backoff, (int)T->scaler.growth_interval);
    rt_optim_skip_if(T->opt, found);
    ops->download_async(st, &h->found, found, sizeof(float));
    ops->download_async(st, &h->scale, sc, sizeof(float));
    s->scaled = 1;
}

void late_micro_done(struct train *T)
{
    slot_of(T, T->pos.update)->n++;
}

void late_commit(struct train *T)
{
    struct train_late_slot *s = slot_of(T, T->pos.update);
    struct late_host *h = s->host;
    struct rt_stream *st = rt_backend_stream(T->be);
    rt_backend_ops(T->be)->download_async(st, h->micro, late_stats_dev(T, 0), s->n * sizeof(struct rt_loss_stats));
    rt_event_record(s->ready, st);
    s->pending = 1;
}

/* Names the first non-finite tensor now, or `fallback`. */
static const char *first_nonfinite(struct train *T, char *buf, size_t len, const char *fallback)
{
    rt_model_find_nonfinite(T->model, buf, len);
    return buf[0] ? buf : fallback;
}

/* Reads slot s: each micro-batch's sums into the meters in order, the checks. 0, or -ERANGE (the norm). */
static int collect(struct train *T, struct train_late_slot *s)
{
    if (!s->pending)
        return 0;
    rt_event_synchronize(s->ready);
    s->pending = 0;
    const struct late_host *h = s->host;
    for (uint32_t i = 0; i < s->n; i++) {
        const struct rt_loss_stats *st = &h->micro[i];
        meter_loss(&T->meter, st);
        T->step_loss = *st;
        if (!isfinite(st->loss_sum) && !T->nonfinite[0]) {
            char where[160];
            snprintf(T->nonfinite, sizeof(T->nonfinite),
                     "the loss became %s at epoch %" PRIu64 " micro-batch %" PRIu64 " (optimizer step %" PRIu64
                     ")%s; first non-finite tensor: %s",
                     isnan(st->loss_sum) ? "NaN" : "infinite", s->epoch + 1, s->batch0 + i, s->update,
                     T->world > 1 ? " on this rank" : "", first_nonfinite(T, where, sizeof(where), "the loss itself"));
        }
    }
    if (s->scaled)
        s->verdict_due = 1; /* late_scaler, at the next optimizer step: after its gradients' fault point */
    /* A skipped update's norm is that of the overflowed gradients: nothing was clipped or applied. */
    if (s->clipped && !(s->scaled && h->found != 0.0f) && !isfinite(h->norm_sq)) {
        char where[160];
        /* The gradients were all-reduced before clipping: every rank sees this at the same update. */
        return rt_errf(-ERANGE, "the gradient norm became non-finite at optimizer step %" PRIu64
                                "; first non-finite tensor: %s",
                       s->update, first_nonfinite(T, where, sizeof(where), "(not found)"));
    }
    return 0;
}

/* Replays the host's rt_scaler_update for slot s: its messages, the stop rules, the step count. 0 or -ERANGE. */
static int scaler_verdict(struct train *T, struct train_late_slot *s)
{
    s->verdict_due = 0;
    const struct late_host *h = s->host;
    const float used = T->scaler.scale;
    const enum rt_scaler_verdict v = rt_scaler_update(&T->scaler, h->found != 0.0f);
    if (T->scaler.scale != h->scale)
        return rt_errf(-EPROTO, "loss scaling: the device's scale %g after optimizer step %" PRIu64
                                " is not the host's %g (a bug)", (double)h->scale, s->update,
                       (double)T->scaler.scale);
    if (v == RT_SCALER_APPLY)
        return 0;
    /* The update was not applied: the optimizer counted it when it was issued. */
    rt_optim_set_steps(T->opt, rt_optim_steps(T->opt) - 1);
    if (v == RT_SCALER_SKIP) {
        if (T->root)
            rt_info("step %" PRIu64 ": gradients overflowed at loss scale %g: update skipped, scale now %g",
                    s->update, (double)used, (double)T->scaler.scale);
        return 0;
    }
    char where[160];
    const char *first = first_nonfinite(T, where, sizeof(where), "(not found)");
    if (v == RT_SCALER_STOP_SKIPS)
        return rt_errf(-ERANGE, "%u optimizer steps in a row overflowed (step %" PRIu64 ", loss scale now %g); "
                                "first non-finite tensor: %s. The run diverged: lower --lr, set --clip-grad-norm, "
                                "or use --amp bf16",
                       T->scaler.skips_in_row, s->update, (double)T->scaler.scale, first);
    return rt_errf(-ERANGE, "the loss scale collapsed to %g at step %" PRIu64 " (gradients overflow even unscaled); "
                            "first non-finite tensor: %s. Lower --lr, set --clip-grad-norm, or use --amp bf16",
                   (double)T->scaler.scale, s->update, first);
}

/* The two slots, the older update's first. */
static void in_order(struct train *T, struct train_late_slot **a, struct train_late_slot **b)
{
    const int second_older = T->late.slot[1].update < T->late.slot[0].update;
    *a = &T->late.slot[second_older];
    *b = &T->late.slot[!second_older];
}

int late_scaler(struct train *T)
{
    struct train_late_slot *a, *b;
    in_order(T, &a, &b);
    int rc = a->verdict_due ? scaler_verdict(T, a) : 0;
    if (rc == 0 && b->verdict_due)
        rc = scaler_verdict(T, b);
    return rc;
}

int late_collect_previous(struct train *T)
{
    return collect(T, &T->late.slot[(T->pos.update & 1u) ^ 1u]);
}

int late_flush(struct train *T)
{
    /* At most one is pending outside a step; the older first all the same. */
    struct train_late_slot *a, *b;
    in_order(T, &a, &b);
    int rc = collect(T, a);
    const int rc2 = collect(T, b);
    profile_flush(T); /* the step profile's timeline, read late the same way */
    const int rc3 = late_scaler(T);
    return rc < 0 ? rc : rc2 < 0 ? rc2 : rc3;
}
