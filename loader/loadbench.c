/*
 * loadbench.c - the input side alone, for `ringtrain loadbench`: the loader
 * filling its ring and a consumer that takes every batch as it comes and
 * does nothing with it, timed from the loader's start and from its first
 * batch, with the ring's waits, the loader's stage times and, if asked, a
 * digest of every batch in order. Measures only; the command prints.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "common/common.h"
#include "loader/loadbench.h"

struct rt_batch_digest {
    XXH3_state_t *xs;
};

int rt_batch_digest_create(struct rt_batch_digest **out)
{
    struct rt_batch_digest *d = rt_calloc(1, sizeof(*d), "batch digest");
    if (!d)
        return -ENOMEM;
    if (!(d->xs = XXH3_createState()) || XXH3_64bits_reset(d->xs) == XXH_ERROR) {
        rt_batch_digest_destroy(d);
        return rt_errf(-ENOMEM, "cannot create the digest state");
    }
    *out = d;
    return 0;
}

void rt_batch_digest_destroy(struct rt_batch_digest *d)
{
    if (!d)
        return;
    XXH3_freeState(d->xs);
    free(d);
}

void rt_batch_digest_add(struct rt_batch_digest *d, const struct rt_batch *b, uint32_t c, uint32_t h, uint32_t w)
{
    XXH3_64bits_update(d->xs, b->images, (size_t)b->batch * c * h * w);
    XXH3_64bits_update(d->xs, b->labels, sizeof(int32_t) * b->batch);
    XXH3_64bits_update(d->xs, b->ids, sizeof(uint64_t) * b->batch);
}

void rt_batch_digest_hex(const struct rt_batch_digest *d, char hex[17])
{
    snprintf(hex, 17, "%016llx", (unsigned long long)XXH3_64bits_digest(d->xs));
}

/* Takes every batch, noting the first's arrival and the worst epoch-boundary wait. 0 or -errno. */
static int drain(struct rt_loader *L, uint64_t start_epoch, uint32_t c, uint32_t h, uint32_t w,
                 struct rt_batch_digest *dg, struct rt_loadbench_result *r, uint64_t *t_first,
                 uint64_t *first_images)
{
    struct rt_batch *b;
    for (;;) {
        uint64_t tw = rt_now_ns();
        int more = rt_loader_next(L, &b);
        if (more <= 0)
            return more;
        tw = rt_now_ns() - tw;
        if (b->step == 0 && b->epoch > start_epoch && tw > r->boundary_wait_max_ns)
            r->boundary_wait_max_ns = tw;
        if (!*t_first) {
            *t_first = rt_now_ns();
            *first_images = b->valid;
        }
        if (dg)
            rt_batch_digest_add(dg, b, c, h, w);
        rt_loader_release(L, b);
    }
}

static void summarise(struct rt_loader *L, struct rt_ring *ring, uint64_t t0, uint64_t t_first, uint64_t first_images,
                      struct rt_loadbench_result *r)
{
    const uint64_t t1 = rt_now_ns();
    rt_loader_stats(L, &r->st);
    rt_ring_wait_stats(ring, &r->prod, &r->cons);
    r->ring_bytes = rt_ring_bytes(ring);
    r->ring_locked = rt_ring_locked(ring);
    r->images = r->st.images;
    r->batches = r->st.batches;
    r->wall_s = (double)(t1 - t0) * 1e-9;
    r->steady_s = t_first ? (double)(t1 - t_first) * 1e-9 : 0;
    r->images_per_s = r->wall_s > 0 ? (double)r->images / r->wall_s : 0;
    r->steady_images_per_s = r->steady_s > 0 ? (double)(r->images - first_images) / r->steady_s : 0;
}

int rt_loadbench_run(const struct rt_dataset *ds, const struct rt_loadbench_opts *o, struct rt_loadbench_result *r)
{
    if (!ds || !o || !r)
        return rt_errf(-EINVAL, "loadbench: no dataset, options or result");
    const struct rt_dataset_info *info = rt_dataset_info(ds);
    const struct rt_loader_opts *lo = &o->lo;
    struct rt_ring *ring = NULL;
    struct rt_loader *L = NULL;
    struct rt_batch_digest *dg = NULL;
    uint64_t t_first = 0, first_images = 0;
    memset(r, 0, sizeof(*r));
    r->workers = lo->workers;
    uint32_t h, w;
    int rc = rt_loader_image_shape(info, lo->image_size, &h, &w);
    if (rc < 0)
        return rc;
    struct rt_ring_opts ro = {.slots = o->ring_slots ? o->ring_slots : (uint32_t)RT_MAX(lo->workers + 2, 4),
                              .batch = lo->batch, .channels = info->channels, .height = h, .width = w,
                              .pin = o->pin};
    r->ring_slots = ro.slots;
    if (o->digest && (rc = rt_batch_digest_create(&dg)) < 0)
        return rc;
    const uint64_t t0 = rt_now_ns();
    rc = rt_ring_create(&ro, &ring);
    if (rc == 0)
        rc = rt_loader_create(ds, lo, ring, &L);
    if (rc == 0)
        rc = drain(L, lo->start_epoch, info->channels, h, w, dg, r, &t_first, &first_images);
    if (rc == 0) {
        summarise(L, ring, t0, t_first, first_images, r);
        if (dg)
            rt_batch_digest_hex(dg, r->digest);
    }
    rt_loader_destroy(L);
    rt_ring_destroy(ring);
    rt_batch_digest_destroy(dg);
    return rc;
}
