/*
 * input.c - the step's input side: the loader filling its ring, each batch's
 * copy to the device started one step ahead, the slot given back once the
 * copy has read it; or, with --synthetic-data, one random batch uploaded once
 * and used for every micro-batch (compute measured alone).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/trace.h"
#include "loader/loadbench.h"
#include "tools/train/driver.h"

/* Bytes of one batch's images, as a ring slot and the synthetic batch hold them. */
static size_t batch_bytes(const struct train *T)
{
    return (size_t)T->cfg.batch * T->c * T->h * T->w;
}

/* The synthetic batch's labels follow its images at this offset, as a ring slot's do at theirs (ring.h). */
static size_t syn_labels_offset(const struct train *T)
{
    return (batch_bytes(T) + 63) & ~(size_t)63;
}

static void *ring_host_alloc(size_t bytes, void *ctx)
{
    return rt_backend_host_alloc(ctx, bytes);
}

static void ring_host_free(void *p, size_t bytes, void *ctx)
{
    (void)bytes;
    rt_backend_host_free(ctx, p);
}

static int start_loader(struct train *T)
{
    const struct train_cfg *c = &T->cfg;
    struct rt_loader_opts lo = {
        .batch = c->batch,
        .accum = c->grad_accum,
        .world = (uint32_t)T->world,
        .rank = (uint32_t)T->rank,
        .seed = c->seed,
        .shuffle = c->shuffle,
        .last = RT_LAST_DROP,
        .workers = c->workers > 0 ? c->workers : 1,
        .epochs = c->epochs,
        .start_epoch = T->pos.epoch,
        .start_step = T->pos.batch,
        .on_batch = T->faults.loader_delay_ms ? train_faults_loader_batch : NULL,
        .on_batch_ctx = &T->faults,
    };
    /* The augmentation and crop are the loader's rule (--aug, or its default for the data). */
    int rc = rt_loader_opts_for(T->info, RT_SPLIT_TRAIN, c->aug_default ? NULL : &c->aug, c->image_size, &lo);
    if (rc < 0)
        return rc;
    char ops[160];
    rt_aug_describe(&lo.aug, ops, sizeof(ops));
    if (T->info->height == 0) /* variable-size images: the crop is the loader's, the pad none */
        snprintf(T->in.augment, sizeof(T->in.augment), "%s(%u)%s%s",
                 lo.crop == RT_CROP_RANDOM ? "RandomResizedCrop" : "Resize + CenterCrop", T->h,
                 strcmp(ops, "none") ? "," : "", strcmp(ops, "none") ? ops : "");
    else
        snprintf(T->in.augment, sizeof(T->in.augment), "%s", ops);
    struct rt_ring_opts ro = {.slots = (uint32_t)RT_MAX(lo.workers + 2, 4), .batch = c->batch, .channels = T->c,
                              .height = T->h, .width = T->w, .pin = c->pin};
    /* On a GPU the slots are cudaHostAlloc memory: each batch's copy to the device is a DMA on the copy
     * stream, overlapping the step before it. */
    if (rt_backend_kind_of(T->be) == RT_BACKEND_CUDA && c->pin != RT_PIN_OFF) {
        T->in.host_mem = (struct rt_ring_allocator){.name = "cudaHostAlloc", .locks = 1, .alloc = ring_host_alloc,
                                                    .free = ring_host_free, .ctx = T->be};
        ro.allocator = &T->in.host_mem;
    }
    if ((rc = rt_ring_create(&ro, &T->in.ring)) < 0 ||
        (rc = rt_loader_create(T->ds, &lo, T->in.ring, &T->in.loader)) < 0)
        return rc;
    T->in.batches_per_epoch = rt_loader_steps_per_epoch(T->in.loader);
    if (T->in.batches_per_epoch == 0)
        return rt_errf(-EINVAL,
                       "the training split has %" PRIu64 " records: fewer than one batch of %u for each of %d ranks",
                       T->info->split[RT_SPLIT_TRAIN].records, c->batch, T->world);
    return 0;
}

/* Random images and labels, each rank its own, uploaded once in one block (the labels after the images). */
static int make_synthetic(struct train *T)
{
    struct train_input *in = &T->in;
    const size_t n = batch_bytes(T), off = syn_labels_offset(T);
    const uint32_t B = T->cfg.batch;
    in->syn_images = rt_calloc(1, off + B * sizeof(int32_t), "synthetic batch");
    if (!in->syn_images)
        return -ENOMEM;
    in->syn_labels = (int32_t *)(void *)(in->syn_images + off);
    struct rt_rng r;
    rt_rng_init(&r, T->cfg.seed, 0x5e7u + (uint64_t)T->rank);
    for (size_t i = 0; i < n; i++)
        in->syn_images[i] = (uint8_t)rt_rng_u32(&r);
    for (uint32_t i = 0; i < B; i++)
        in->syn_labels[i] = (int32_t)rt_rng_below(&r, T->classes);
    uint64_t records = T->info ? T->info->split[RT_SPLIT_TRAIN].records : 50000;
    in->batches_per_epoch = RT_MAX(records / ((uint64_t)B * (uint64_t)T->world), 1);
    in->syn_dev = rt_backend_input_upload(T->be, in->syn_images, off + B * sizeof(int32_t), &in->syn_ticket);
    return 0;
}

uint64_t input_updates_per_epoch(const struct train *T)
{
    return (T->in.batches_per_epoch + T->cfg.grad_accum - 1) / T->cfg.grad_accum;
}

int input_create(struct train *T)
{
    if (T->cfg.synthetic)
        return make_synthetic(T);
    const int rc = T->cfg.batch_digest ? rt_batch_digest_create(&T->in.digest) : 0;
    return rc < 0 ? rc : start_loader(T);
}

void input_labels(const struct rt_batch *slot, int32_t *labels)
{
    for (uint32_t i = 0; i < slot->batch; i++)
        labels[i] = slot->ids[i] == RT_PAD_ID ? -1 : slot->labels[i];
}

/* Where a slot's labels lie from its images: ring.h keeps them in the slot's one block, after the images. */
static size_t slot_labels_offset(const struct rt_batch *slot)
{
    return (size_t)((const uint8_t *)(const void *)slot->labels - slot->images);
}

/*
 * The loader's next batch, its copy to the device started: the images and the labels after them in one copy
 * from the slot (page-locked on a GPU), the padding samples' labels made -1 in place first. The time issuing
 * the copy into *copy_ns. 1, 0 at the end of the data, -errno.
 */
static int fetch(struct train *T, struct train_inflight *f, uint64_t *copy_ns)
{
    int r = rt_loader_next(T->in.loader, &f->slot);
    if (r > 0) {
        struct rt_batch *s = f->slot;
        input_labels(s, s->labels);
        const size_t off = slot_labels_offset(s);
        const uint64_t t0 = rt_now_ns();
        f->dev = rt_backend_input_upload(T->be, s->images, off + s->batch * sizeof(int32_t), &f->ticket);
        f->labels_dev = (const int32_t *)(const void *)(f->dev + off);
        const uint64_t t1 = rt_now_ns();
        *copy_ns += t1 - t0;
        if (rt_trace_live())
            rt_trace_span(RT_TRACE_COPY, "h2d copy (issue)", NULL, t0, t1);
    }
    return r;
}

/* Gives a slot (NULL is fine) back to the ring once the copy `ticket` has read it; the wait for the copy
 * into *copy_ns. */
static void give_back(struct train *T, struct rt_batch *slot, uint64_t ticket, uint64_t *copy_ns)
{
    if (!slot)
        return;
    const uint64_t t0 = rt_now_ns();
    rt_backend_input_wait(T->be, ticket);
    const uint64_t t1 = rt_now_ns();
    *copy_ns += t1 - t0;
    if (rt_trace_live())
        rt_trace_span(RT_TRACE_COPY, "h2d copy (wait)", NULL, t0, t1);
    rt_loader_release(T->in.loader, slot);
}

int train_input_next(struct train *T, struct train_batch *b)
{
    struct train_input *in = &T->in;
    *b = (struct train_batch){.t_start = rt_now_ns()};
    if (T->cfg.synthetic) {
        b->images = in->syn_dev;
        b->labels = in->syn_labels;
        b->labels_dev = (const int32_t *)(const void *)(in->syn_dev + syn_labels_offset(T));
        b->valid = T->cfg.batch;
        b->ticket = in->syn_ticket;
        b->t_ready = b->t_start;
        return 1;
    }
    rt_comm_set_phase(T->comm, T->pos.update, RT_PHASE_DATA);
    if (faults_data_ended(T))
        return 0;
    if (!in->next.slot) {
        int r = fetch(T, &in->next, &b->copy_issue_ns);
        if (r <= 0)
            return r;
    }
    struct train_inflight cur = in->next;
    in->next.slot = NULL;
    /* The next batch's copy overlaps this step (none after the run's last batch). */
    int r = fetch(T, &in->next, &b->copy_issue_ns);
    if (r < 0) {
        give_back(T, cur.slot, cur.ticket, &b->copy_wait_ns); /* the step will not run: its slot goes back now */
        return r;
    }
    /* (Training drops the last partial batch: no padding sample had its label changed by the copy's set-up.) */
    if (in->digest)
        rt_batch_digest_add(in->digest, cur.slot, T->c, T->h, T->w);
    b->images = cur.dev;
    b->labels = cur.slot->labels;
    b->labels_dev = cur.labels_dev;
    b->valid = cur.slot->valid;
    b->ticket = cur.ticket;
    b->slot = cur.slot;
    b->t_ready = rt_now_ns();
    return 1;
}

void train_input_release(struct train *T, struct train_batch *b)
{
    give_back(T, b->slot, b->ticket, &b->copy_wait_ns);
    b->slot = NULL;
}

void input_destroy(struct train *T)
{
    struct train_input *in = &T->in;
    uint64_t unused = 0;
    if (in->loader)
        give_back(T, in->next.slot, in->next.ticket, &unused); /* fetched for a step that did not run */
    rt_loader_destroy(in->loader);
    rt_ring_destroy(in->ring);
    rt_batch_digest_destroy(in->digest);
    free(in->syn_images);
    *in = (struct train_input){0};
}
