/*
 * staging.h - between the loader and compute: the ring of batch slots that
 * the loader fills and the trainer drains, and node-local dataset staging
 * (`ringtrain stage`).
 *
 * This module knows nothing about layers or collectives. The ring's memory
 * is allocated once, page-aligned and mlock()ed by default; an allocator
 * switch (struct rt_ring_allocator) lets the CUDA backend put the slots in
 * cudaHostAlloc memory instead. Functions return 0 or -errno with the reason
 * in rt_errmsg(), unless a comment says otherwise.
 */
#ifndef RT_STAGING_H
#define RT_STAGING_H

#include <stddef.h>
#include <stdint.h>

/* ---- batch slots and the ring ---------------------------------------------- */

/* Sample id of a padding slot (evaluation's `pad` policy); never a real id. */
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

enum rt_pin { RT_PIN_ON = 0, RT_PIN_OFF };

struct rt_ring_opts {
    uint32_t slots;          /* 2..1024 */
    uint32_t batch;          /* samples per slot */
    uint32_t channels, height, width;
    enum rt_pin pin;         /* ON (default): mlock the slots, and fail with the fix if
                                that is not allowed; OFF: plain pageable memory */
    const struct rt_ring_allocator *allocator; /* borrowed; NULL = mmap */
};

/* Wait-time summary of one side of the ring, in nanoseconds. */
struct rt_wait_stats {
    uint64_t count;
    uint64_t total_ns;
    uint64_t p50_ns, p99_ns, max_ns;
};

struct rt_ring;

/* Bytes one slot occupies (images + labels + ids, each page-aligned). */
size_t rt_ring_slot_bytes(const struct rt_ring_opts *o);

/*
 * Checks that `bytes` of slot memory can be allocated and (pin == ON)
 * locked: compares with `ulimit -l` (RLIMIT_MEMLOCK, unless CAP_IPC_LOCK)
 * and with MemAvailable plus `extra_bytes` the caller will also need (the
 * loader's resident dataset). Returns 0, or -ENOMEM with a message giving
 * the numbers and the fix.
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

/* Waits so far: producers (for a FREE slot) and the consumer (for READY). */
void rt_ring_wait_stats(struct rt_ring *r, struct rt_wait_stats *producer,
                        struct rt_wait_stats *consumer);
/* Bytes allocated, and whether they ended up page-locked. */
size_t rt_ring_bytes(const struct rt_ring *r);
int rt_ring_locked(const struct rt_ring *r);

/* ---- node-local dataset staging (`ringtrain stage`) ------------------------- */

/*
 * Staging copies a packed dataset (docs/FORMAT.md: manifest.json + shards)
 * from shared storage to node-local disk, so that training reads it from
 * there. The copy lands in PARENT/ringtrain-<h>, where <h> is the 16 lowercase
 * hex digits of the XXH64 (seed 0) of the source's manifest.json: the same
 * dataset always maps to the same directory, a repacked one to a new one.
 *
 * Guarantees:
 *  - Each file is written under a temporary name (<file>.partial), its bytes
 *    hashed as they are written and compared with the manifest's size and
 *    XXH64, fsynced, then renamed; the directory is fsynced. manifest.json
 *    is written last (and read back and checked against <h>), so a staged
 *    directory that holds manifest.json is complete and verified; one without
 *    it is not a dataset.
 *  - One process per destination at a time: an exclusive flock() on
 *    PARENT/ringtrain-<h>.lock. Others wait, then find the copy done. The
 *    kernel drops the lock when its holder dies, so none is ever stale; the
 *    lock file itself is left in place (removing it would race).
 *  - Resumable: files already staged and matching are kept; *.partial files
 *    left by an interrupted run are deleted and those files copied afresh.
 *  - Idempotent: a second call copies nothing. It still checks every staged
 *    file's size, and by default its XXH64 too (RT_STAGE_VERIFY_SIZE skips
 *    the hashing). A process that had to wait for the lock and then finds
 *    manifest.json in place checks sizes only: the holder it waited for has
 *    just copied or verified every byte.
 *  - A staged file found damaged is copied again (manifest.json is removed
 *    first). A file whose copy does not match the manifest max_attempts
 *    times in a row is an error naming it (the source itself is damaged).
 *  - Out of space: statvfs() is checked before copying (needed vs
 *    available); ENOSPC while copying is reported with the same figures.
 */

enum rt_stage_engine {
    RT_STAGE_ENGINE_AUTO = 0,   /* io_uring; read/write with a one-line notice if unavailable */
    RT_STAGE_ENGINE_URING,      /* io_uring or fail */
    RT_STAGE_ENGINE_PLAIN,      /* read/write, one block at a time */
};

enum rt_stage_verify {
    RT_STAGE_VERIFY_FULL = 0,   /* files already staged: size and whole-file XXH64 */
    RT_STAGE_VERIFY_SIZE,       /* files already staged: size only */
};

struct rt_stage_opts {
    const char *parent;         /* directory to stage under (created if missing); NULL =
                                   $SLURM_TMPDIR, else $TMPDIR, else /tmp. Borrowed. */
    uint32_t queue_depth;       /* blocks in flight, 1..4096; 0 = 32 */
    uint32_t block_bytes;       /* bytes per read/write, a multiple of 4 KiB up to 64 MiB;
                                   0 = 1 MiB */
    enum rt_stage_engine engine;
    enum rt_stage_verify verify;
    uint32_t max_attempts;      /* copies of one file before giving up, 1..100; 0 = 3 */
    double lock_timeout_s;      /* > 0: give up after waiting this long for another
                                   process's lock (-EBUSY); 0 = wait as long as it takes */
    uint32_t block_delay_ms;    /* test hook: sleep this long after each block copied, so
                                   that tests can interrupt a copy midway; 0 in production */
};

struct rt_stage_result {
    char path[4096];            /* the staged dataset directory */
    char manifest_xxh64[17];    /* <h>: XXH64 of manifest.json, 16 hex digits */
    enum rt_stage_engine engine; /* URING or PLAIN when something was copied, else AUTO */
    uint32_t queue_depth;       /* the options as applied (defaults filled in) */
    uint32_t block_bytes;
    uint32_t files;             /* files in the dataset, manifest.json included */
    uint32_t files_copied;      /* files this call wrote */
    uint32_t files_damaged;     /* staged files found with a wrong size or checksum (recopied) */
    uint32_t files_hashed;      /* staged files whose XXH64 was checked without copying */
    uint32_t partials_removed;  /* *.partial files of an interrupted run deleted */
    uint32_t retries;           /* copies repeated because the bytes did not match */
    uint64_t bytes_total;       /* all files */
    uint64_t bytes_copied;
    uint64_t bytes_hashed;      /* bytes read to check files already staged */
    int waited;                 /* 1 if another process held the lock when this one came */
    double wait_seconds;        /* waiting for that lock */
    double check_seconds;       /* checking what was already staged */
    double copy_seconds;        /* copying, fsyncs and renames */
    double seconds;             /* the whole call */
};

/*
 * Writes the directory `src` would be staged to (PARENT/ringtrain-<h>) into
 * out[len], reading `src`/manifest.json; `parent` as in rt_stage_opts. Copies
 * nothing. Returns 0 or -errno.
 */
int rt_stage_dest(const char *src, const char *parent, char *out, size_t len);

/*
 * Stages the dataset at `src` (see above) and fills `res` (required). Blocks
 * while another process stages the same dataset under the same parent.
 * Returns 0 when res->path holds a complete, verified copy; -errno otherwise
 * with the reason in rt_errmsg(), naming the file: -ENOENT / -EACCES for a
 * missing or unreadable source file, -EBADMSG for a source file whose bytes
 * never matched the manifest, -ENOSPC (needed vs available), -EBUSY when
 * lock_timeout_s ran out, -EINVAL for bad options. A failure never leaves
 * manifest.json beside shards that are not all verified.
 * Progress notes (waiting for the lock, the io_uring fallback, files copied
 * again) go through rt_info/rt_warn. Thread-safe for different destinations;
 * for one destination, processes and threads serialize on the lock.
 */
int rt_stage_dataset(const char *src, const struct rt_stage_opts *opts, struct rt_stage_result *res);

#endif /* RT_STAGING_H */
