/*
 * loadbench.h - the input side alone, for `ringtrain loadbench`: the loader
 * filling its batch ring, drained by a consumer that takes every batch as it
 * comes and does nothing with it, timed from the loader's start and from its
 * first batch, with the ring's waits, the loader's stage times and, if asked,
 * a digest of every batch in order.
 *
 * It does not print, choose worker counts, judge the figures or run any
 * compute: the command (tools/cmd_loadbench.c) does the first three, and the
 * training driver joins the loader to compute. It holds no handles, so there
 * is nothing to destroy: every loader and ring it makes is freed before
 * rt_loadbench_run() returns.
 */
#ifndef RT_LOADER_LOADBENCH_H
#define RT_LOADER_LOADBENCH_H

#include <stddef.h>
#include <stdint.h>

#include "loader/loader.h"
#include "staging/ring.h"

struct rt_loadbench_opts {
    struct rt_loader_opts lo;   /* the loader's options, workers included */
    uint32_t ring_slots;        /* 0: workers + 2, at least 4 */
    enum rt_pin pin;
    int digest;                 /* XXH3 of every batch's images, labels and ids, in order */
};

struct rt_loadbench_result {
    int workers;
    double wall_s, steady_s;    /* from the loader's start; from the first batch on */
    double images_per_s, steady_images_per_s;
    uint64_t images, batches;
    struct rt_loader_stats st;  /* where the loader's threads spent their time */
    struct rt_wait_stats prod, cons; /* the ring's waits: producers for a free slot, the consumer for a batch */
    size_t ring_bytes;
    int ring_locked;
    uint32_t ring_slots;
    uint64_t boundary_wait_max_ns; /* worst wait for the first batch of epochs after the first */
    char digest[17];            /* 16 hex digits when asked for, else "" */
};

/*
 * Creates a ring shaped for `ds` and o->lo.batch, runs the loader over it to
 * the end of o->lo.epochs with a consumer that takes every batch as soon as it
 * is ready (no compute), and measures it into `r` (zeroed first; meaningful
 * only on success). `ds` and `o` are borrowed for the call. Returns 0, or
 * -errno with rt_errmsg() set (a corrupt block names shard, block and
 * records; a ring that cannot be page-locked under RT_PIN_ON says why).
 * Thread-safe for distinct `r`; it blocks until the run is over.
 */
int rt_loadbench_run(const struct rt_dataset *ds, const struct rt_loadbench_opts *o, struct rt_loadbench_result *r);

/* ---- the digest of a stream of batches ------------------------------------------------ */

/*
 * The digest `--digest` prints: XXH3-64 over every batch in the order the
 * consumer took them -- each batch's images (batch x C x H x W bytes, padding
 * included), then its int32 labels and its uint64 ids (batch entries each),
 * as they lie in the slot. Any consumer of a loader (the Python module) that
 * feeds it the same batches gets the same 16 hex digits.
 */
struct rt_batch_digest;

/* Starts an empty digest. Returns 0, or -ENOMEM. */
int rt_batch_digest_create(struct rt_batch_digest **out);
/* Frees the digest; NULL is fine. */
void rt_batch_digest_destroy(struct rt_batch_digest *d);
/* Adds batch `b`, whose images are C x H x W each (the ring's shape). Not thread-safe per digest. */
void rt_batch_digest_add(struct rt_batch_digest *d, const struct rt_batch *b, uint32_t c, uint32_t h, uint32_t w);
/* The digest of the batches added so far, as 16 lowercase hex digits and a NUL; more may be added after. */
void rt_batch_digest_hex(const struct rt_batch_digest *d, char hex[17]);

#endif /* RT_LOADER_LOADBENCH_H */
