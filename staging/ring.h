/*
 * ring.h - between the loader and compute: the ring of batch slots that the
 * loader fills and the trainer drains, and the slot layout that is the
 * contract between them (struct rt_batch).
 *
 * This module knows nothing about datasets, layers or collectives. The ring's
 * memory is allocated once, page-aligned and mlock()ed where allowed; an
 * allocator switch (struct rt_ring_allocator) lets the CUDA backend put the
 * slots in cudaHostAlloc memory instead. Functions return 0 or -errno with
 * the reason in rt_errmsg(), unless a comment says otherwise.
 *
 * Tracing (common/trace.h): while a trace records, a producer that blocked
 * in rt_ring_fill_begin() leaves a "ring wait (slot)" span and a consumer
 * that blocked in rt_ring_take() a "ring wait (consumer)" span on its own
 * thread's track (labelled with the batch's seq), and every
 * rt_ring_fill_end() / rt_ring_release() sets the counter "ring occupancy"
 * (see rt_ring_set_trace_name) to the slots holding a finished batch (READY
 * or IN_FLIGHT).
 */
#ifndef RT_STAGING_RING_H
#define RT_STAGING_RING_H

#include <stddef.h>
#include <stdint.h>

/* ---- batch slots and the ring ---------------------------------------------- */

/*
 * Sample id of a padding slot (evaluation's `pad` policy); never a real id.
 * The sampler marks padding positions of its order with it too (loader.h).
 */
#define RT_PAD_ID UINT64_MAX

enum rt_slot_state { RT_SLOT_FREE = 0, RT_SLOT_FILLING, RT_SLOT_READY, RT_SLOT_IN_FLIGHT };

/*
 * One batch slot, the contract between loader and compute. Pointers point
 * into the ring's single allocation and stay valid for the ring's lifetime.
 * The first `valid` samples are real; the remaining (batch - valid) are
 * padding (zero image, label 0, id RT_PAD_ID) that metrics must mask out.
 */
struct rt_batch {
    uint8_t *images;     /* [batch][C][H][W] uint8 */
    int32_t *labels;     /* [batch] */
    uint64_t *ids;       /* [batch] split-local record index, or RT_PAD_ID */
    uint32_t batch;      /* slot capacity B */
    uint32_t valid;      /* real samples, 1..B (0 only for a rank left with no data) */
    uint64_t epoch;      /* 0-based */
    uint64_t step;       /* 0-based within the epoch */
    uint64_t seq;        /* 0-based position in the stream of batches */
    uint32_t slot;       /* index of this slot in the ring */
};

/* Where slot memory comes from. NULL in rt_ring_opts = page-aligned mmap. */
struct rt_ring_allocator {
    const char *name;                           /* e.g. "cudaHostAlloc", in messages */
    int locks;                                  /* 1 if the memory is page-locked by alloc itself */
    void *(*alloc)(size_t bytes, void *ctx);    /* NULL on failure, with rt_errf set */
    void (*free)(void *p, size_t bytes, void *ctx);
    void *ctx;
};

/*
 * AUTO (default): lock the slots when `ulimit -l` allows and mlock() succeeds, else pageable slots and
 * one line saying so (rt_info, once per process); nothing on the CPU needs locked slots, and a GPU's
 * slots come from an allocator that locks them itself (cudaHostAlloc, outside RLIMIT_MEMLOCK).
 * ON: locked or an error that gives the numbers and the fix. OFF: pageable.
 */
enum rt_pin { RT_PIN_AUTO = 0, RT_PIN_ON, RT_PIN_OFF };

struct rt_ring_opts {
    uint32_t slots;          /* 2..1024 */
    uint32_t batch;          /* samples per slot */
    uint32_t channels, height, width;
    enum rt_pin pin;         /* AUTO (default), ON or OFF: see enum rt_pin */
    const struct rt_ring_allocator *allocator; /* borrowed; NULL = mmap */
};

/* Wait-time summary of one side of the ring, in nanoseconds. */
struct rt_wait_stats {
    uint64_t count;
    uint64_t total_ns;
    uint64_t p50_ns, p99_ns, max_ns;
};

struct rt_ring;

/* Bytes one slot occupies (images + labels + ids, each page-aligned). A slot is one block in that order, so
 * that one copy from `images` to the end of `labels` moves both to a device (the trainer's input upload). */
size_t rt_ring_slot_bytes(const struct rt_ring_opts *o);

/*
 * Checks that `bytes` of slot memory can be allocated and (pin == ON)
 * locked (AUTO never fails for the lock): compares with `ulimit -l`
 * (RLIMIT_MEMLOCK, unless CAP_IPC_LOCK) and with MemAvailable plus
 * `extra_bytes` the caller will also need (the loader's resident dataset).
 * Returns 0, or -ENOMEM with a message giving the numbers and the fix.
 */
int rt_ring_check_memory(size_t bytes, enum rt_pin pin, uint64_t extra_bytes);

/* Allocates the ring (all slots FREE). Returns 0 or -errno. */
int rt_ring_create(const struct rt_ring_opts *o, struct rt_ring **out);
/* Frees the ring; NULL is fine. No thread may be waiting on it. */
void rt_ring_destroy(struct rt_ring *r);

uint32_t rt_ring_slots(const struct rt_ring *r);
/* The slot shape the ring was created with. */
void rt_ring_shape(const struct rt_ring *r, uint32_t *batch, uint32_t *channels, uint32_t *height,
                   uint32_t *width);

/*
 * Producer side. Batches are numbered 0, 1, 2, ... (seq) and batch `seq`
 * always lives in slot seq % slots, so the consumer sees them in order
 * whatever order producers finish in. Blocks until that slot is FREE and the
 * batch seq - slots has been released, then marks it FILLING and returns it.
 * Returns NULL once the ring is closed. Thread-safe; each seq must be
 * claimed by exactly one producer.
 */
struct rt_batch *rt_ring_fill_begin(struct rt_ring *r, uint64_t seq);
/* FILLING -> READY; wakes the consumer. */
void rt_ring_fill_end(struct rt_ring *r, struct rt_batch *b);

/*
 * Consumer side (one consumer thread). Blocks until the next batch in seq
 * order is READY and returns it IN_FLIGHT; NULL once the ring is closed and
 * that batch will never come (rt_ring_error() says why, 0 for a clean end).
 */
struct rt_batch *rt_ring_take(struct rt_ring *r);
/* IN_FLIGHT -> FREE; wakes a waiting producer. */
void rt_ring_release(struct rt_ring *r, struct rt_batch *b);

/*
 * Closes the ring: every waiter returns NULL from now on. `err` is 0 for a
 * clean end of stream, or -errno for a failure (the message is copied from
 * the calling thread's rt_errmsg() so the consumer can print it). The first
 * close wins. Thread-safe.
 */
void rt_ring_close(struct rt_ring *r, int err);
/* 0, or the -errno of the close; rt_ring_errmsg() gives its message. */
int rt_ring_error(const struct rt_ring *r);
const char *rt_ring_errmsg(const struct rt_ring *r);

/*
 * Names the ring's occupancy counter in a trace, so that two rings alive at
 * once (training and evaluation) draw two graphs. `counter` must be a static
 * string; the default is "ring occupancy". Thread-safe.
 */
void rt_ring_set_trace_name(struct rt_ring *r, const char *counter);

/* Waits so far: producers (for a FREE slot) and the consumer (for READY). */
void rt_ring_wait_stats(struct rt_ring *r, struct rt_wait_stats *producer,
                        struct rt_wait_stats *consumer);
/* Bytes allocated, and whether they ended up page-locked. */
size_t rt_ring_bytes(const struct rt_ring *r);
int rt_ring_locked(const struct rt_ring *r);

#endif /* RT_STAGING_RING_H */
