/*
 * late.c - what an update leaves on the device, read a step late, so that
 * the host never waits for the stream inside a step: each micro-batch's loss
 * sums (rt_step_opts.stats_dev) and, with --clip-grad-norm, the squared
 * gradient norm (rt_clip_grad_norm_async).
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
 * The meters see each micro-batch's loss in the same order as before, so
 * every figure, checkpoint and digest is the same bit for bit.
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
    uint32_t pad_[3];
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
    for (int i = 0; i < 2; i++) {
        struct train_late_slot *s = &L->slot[i];
        /* Page-locked on a GPU (a DMA that needs no staging), ordinary memory on the CPU. */
        if (rt_backend_kind_of(T->be) == RT_BACKEND_CUDA && (s->host = rt_backend_host_alloc(T->be, host_bytes(T))))
            s->pinned = 1;
        else if (!(s->host = rt_calloc(1, host_bytes(T), "late results")))
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
    L->dev = NULL;
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
    if (s->clipped && !isfinite(h->norm_sq)) {
        char where[160];
        /* The gradients were all-reduced before clipping: every rank sees this at the same update. */
        return rt_errf(-ERANGE, "the gradient norm became non-finite at optimizer step %" PRIu64
                                "; first non-finite tensor: %s",
                       s->update, first_nonfinite(T, where, sizeof(where), "(not found)"));
    }
    return 0;
}

int late_collect_previous(struct train *T)
{
    return collect(T, &T->late.slot[(T->pos.update & 1u) ^ 1u]);
}

int late_flush(struct train *T)
{
    /* At most one is pending outside a step; the older first all the same. */
    struct train_late_slot *a = &T->late.slot[0], *b = &T->late.slot[1];
    if (a->pending && b->pending && b->update < a->update) {
        struct train_late_slot *t = a;
        a = b;
        b = t;
    }
    int rc = collect(T, a);
    const int rc2 = collect(T, b);
    profile_flush(T); /* the step profile's timeline, read late the same way */
    return rc < 0 ? rc : rc2;
}
