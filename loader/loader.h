/*
 * loader.h - ringtrain's data side, up to the batch slot: `pack` from the
 * usual source formats, the synthetic dataset generator, the block decoders
 * and the dataset check built on them, the sampler, augmentation and the
 * loader that fills the batch ring. The dataset format (shards + manifest)
 * and its reader are in loader/dataset.h, the batch slots and the ring in
 * staging/ring.h; both are included here.
 *
 * This module knows nothing about CUDA, models or collectives. See
 * docs/FORMAT.md for the on-disk layout that the functions below read and
 * write. All functions return 0 (or a count) on success and -errno on
 * failure, with the reason -- naming file, shard, block, record or offset --
 * in rt_errmsg(). None of them abort on bad input.
 */
#ifndef RT_LOADER_H
#define RT_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "loader/dataset.h"
#include "staging/ring.h"

/* ---- synthetic data (`ringtrain synth`) ----------------------------------- */

enum rt_synth_format { RT_SYNTH_CIFAR10, RT_SYNTH_CIFAR100, RT_SYNTH_MNIST };

struct rt_synth_opts {
    enum rt_synth_format format;
    uint64_t train;  /* training records (the CLI defaults to 50000; 60000 for MNIST) */
    uint64_t test;   /* test records (default 10000) */
    uint64_t seed;   /* same seed -> byte-identical files */
    int threads;     /* 0 = the CPUs this process may use */
};

/*
 * Writes a learnable synthetic dataset under `outdir` in the exact layout the
 * original distribution unpacks to:
 *   CIFAR-10:  outdir/cifar-10-batches-bin/data_batch_{1..5}.bin, test_batch.bin,
 *              batches.meta.txt (records: 1 label byte + 3072 bytes R,G,B planes)
 *   CIFAR-100: outdir/cifar-100-binary/train.bin, test.bin, fine_label_names.txt,
 *              coarse_label_names.txt (records: coarse byte, fine byte, 3072 bytes)
 *   MNIST:     outdir/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
 * Each class is a distinct procedural pattern drawn with random translation,
 * colour and noise. Files are written atomically. Returns 0 or -errno.
 */
int rt_synth_write(const char *outdir, const struct rt_synth_opts *opts);

/*
 * Renders record `index` of `split` (RT_SPLIT_TRAIN or RT_SPLIT_TEST) exactly
 * as rt_synth_write() stores it: `out` receives C*H*W bytes in CHW order
 * (3x32x32 for CIFAR, 1x28x28 for MNIST) and *label the (fine) class.
 * Pure function of its arguments; thread-safe.
 */
void rt_synth_record(enum rt_synth_format format, uint64_t seed, enum rt_split split,
                     uint64_t index, uint8_t *out, int32_t *label);

/* ---- packing (`ringtrain pack`) ------------------------------------------- */

enum rt_label_kind { RT_LABEL_FINE = 0, RT_LABEL_COARSE = 1 };

struct rt_pack_progress {
    uint64_t records_done, records_total;
    uint64_t bytes_in, bytes_out;
    double seconds;
};

struct rt_pack_opts {
    enum rt_codec codec;        /* RT_CODEC_RAW (default) or RT_CODEC_JPEG */
    int quality;                /* JPEG quality 1..100; 0 = 90, or pass-through of JPEG input */
    int level;                  /* zstd level for raw blocks; 0 = 3 */
    uint64_t shard_bytes;       /* target stored bytes per shard; 0 = 64 MiB */
    uint32_t block_records;     /* records per block; 0 = about 128 KiB of pixels */
    double val_split;           /* fraction of train moved to val, [0, 1) */
    uint64_t split_seed;        /* seed of the val selection */
    enum rt_label_kind label;   /* CIFAR-100: fine (default) or coarse labels */
    int threads;                /* 0 = the CPUs this process may use */
    int force;                  /* replace an existing dataset at outdir */
    /* Called from the packing thread after each group of blocks; may be NULL. */
    void (*progress)(void *ctx, const struct rt_pack_progress *p);
    void *progress_ctx;
};

struct rt_pack_stats {
    char source[48];            /* detected input kind, e.g. "cifar10-bin" */
    uint64_t records;           /* records written, all splits */
    uint64_t split_records[RT_SPLIT_COUNT];
    uint64_t bytes_in;          /* decoded pixel bytes read (C*H*W per record) */
    uint64_t bytes_out;         /* shard bytes written */
    uint32_t shards;
    double seconds;             /* wall time of the whole pack */
};

/*
 * Packs `input` -- a CIFAR-10/100 binary directory or its .tar.gz, the CIFAR
 * python tarball, an MNIST IDX directory (plain or .gz), or an image folder
 * ROOT/<class>/<file>.jpg -- into shards and a manifest under `outdir`.
 * Output is built in a temporary sibling directory and renamed into place only
 * when complete, so a failed pack leaves nothing that looks like a dataset.
 * Same input and options give byte-identical output whatever the thread count.
 * Returns 0 or -errno; `stats` (may be NULL) is filled on success.
 */
int rt_pack(const char *input, const char *outdir, const struct rt_pack_opts *opts,
            struct rt_pack_stats *stats);

/* ---- decoding blocks ---------------------------------------------------------- */

/* Per-thread decoding state (zstd context, TurboJPEG handle). */
struct rt_decoder;

int rt_decoder_create(struct rt_decoder **out);
void rt_decoder_destroy(struct rt_decoder *d);

/* Time a decoder has spent in each part of rt_block_decode() since creation. */
struct rt_decode_times {
    uint64_t checksum_ns, decompress_ns, decode_ns;
    uint64_t raw_bytes;      /* bytes zstd produced (0 for stored blocks) */
    uint64_t records;
};
void rt_decoder_times(const struct rt_decoder *d, struct rt_decode_times *t);

/*
 * Checks the stored bytes of block `block` (stored_size bytes) against the
 * index checksum and decodes its records into `out`, which must hold
 * record_count * C*H*W bytes (CHW per record, uint8). Returns 0 or
 * -EBADMSG with a message naming `name`, the block and the record.
 */
int rt_block_decode(struct rt_decoder *d, const struct rt_shard_header *h,
                    const struct rt_block_entry *e, uint32_t block, const void *stored,
                    uint8_t *out, const char *name);

/* ---- checking a dataset (`ringtrain verify`) ------------------------------------ */

/*
 * Checks every shard named by the manifest: size, whole-file XXH64, header,
 * labels (checksum and range), block index, every block checksum, and that
 * every block decodes to the right number of bytes. Calls `report` once per
 * problem with a line naming the file, block and what was expected.
 * Returns the number of problems (0 = all well) or -errno when it could not
 * run at all.
 */
int rt_dataset_verify(const struct rt_dataset *ds, void (*report)(void *ctx, const char *line),
                      void *ctx);

/* ---- sampler ------------------------------------------------------------------ */

/*
 * Which records a rank sees, in which order, epoch after epoch. The order is
 * a pure function of (seed, epoch, world, rank) and the dataset's block
 * layout: thread counts and timing never change it.
 *
 *  EXACT   a uniform permutation of the whole split per epoch; each rank
 *          takes a contiguous chunk of it. The loader keeps the decoded split
 *          in RAM after the first read (right for CIFAR-sized data).
 *  WINDOW  for data larger than RAM: the split's blocks are permuted per
 *          epoch and dealt round-robin to ranks; each rank reads its blocks
 *          in windows of `window_blocks` and shuffles the records within a
 *          window. Memory: a few windows, not the split.
 *  NONE    record order, contiguous chunk per rank (evaluation).
 *
 * Every rank gets the same number of steps by construction. Last-batch
 * policy DROP (training default) drops the tail so every batch is full; PAD
 * (evaluation) covers every record exactly once across ranks and fills the
 * remaining positions with RT_PAD_ID, always at the end of the rank's order.
 */
enum rt_shuffle { RT_SHUFFLE_EXACT = 0, RT_SHUFFLE_WINDOW, RT_SHUFFLE_NONE };
enum rt_last_batch { RT_LAST_DROP = 0, RT_LAST_PAD };

/* "exact" / "window" / "none"; NULL for an unknown value. */
const char *rt_shuffle_name(enum rt_shuffle shuffle);
/* The inverse: 0 and *out set, or -EINVAL (no message) for an unknown name. */
int rt_shuffle_parse(const char *name, enum rt_shuffle *out);

struct rt_sampler_opts {
    uint64_t records;               /* N, records in the split */
    uint32_t nblocks;               /* WINDOW: blocks of the split, in split order */
    const uint32_t *block_records;  /* WINDOW: records per block (borrowed during create) */
    uint32_t world, rank;           /* rank < world */
    uint32_t batch;                 /* per rank */
    enum rt_shuffle shuffle;
    uint32_t window_blocks;         /* WINDOW: 0 = 64 */
    enum rt_last_batch last;
    uint64_t seed;
};

/*
 * One epoch's plan for one rank. order[steps * batch] lists split-local
 * record ids batch after batch (RT_PAD_ID for padding). For WINDOW,
 * window w reads blocks[win_block[w] .. win_block[w+1]) (split-wide block
 * numbers) and its records fill order positions [win_pos[w], win_pos[w+1])
 * (positions at or past steps * batch are dropped); win_pos[nwindows] may
 * be below steps * batch, the rest being padding.
 */
struct rt_epoch_plan {
    uint64_t epoch, steps;
    uint32_t batch;
    uint64_t *order;
    uint32_t nwindows;
    uint32_t *blocks;
    uint32_t *win_block;            /* nwindows + 1 entries */
    uint64_t *win_pos;              /* nwindows + 1 entries */
};

struct rt_sampler;

/*
 * Validates the options and fixes the steps per epoch. Fails with -EINVAL
 * and a message when the split is too small to give every rank one batch
 * under DROP (never an empty epoch), or for inconsistent options.
 */
int rt_sampler_create(const struct rt_sampler_opts *o, struct rt_sampler **out);
void rt_sampler_destroy(struct rt_sampler *s);
/* Steps per epoch; the same on every rank. */
uint64_t rt_sampler_steps(const struct rt_sampler *s);
/* Builds `epoch`'s plan for this rank. Caller frees it with rt_epoch_plan_free(). */
int rt_sampler_plan(const struct rt_sampler *s, uint64_t epoch, struct rt_epoch_plan **out);
void rt_epoch_plan_free(struct rt_epoch_plan *p);

/* ---- augmentation ---------------------------------------------------------------- */

enum rt_pad_mode { RT_PAD_ZERO = 0, RT_PAD_REFLECT };
enum rt_flip { RT_FLIP_NONE = 0, RT_FLIP_RANDOM, RT_FLIP_ALTERNATE };

/*
 * uint8 augmentation, as the CIFAR recipes do it: random crop of the
 * original size out of the image padded by `pad` pixels (zero or reflect),
 * and a horizontal flip: RANDOM (probability 1/2 each epoch) or ALTERNATE
 * (a random first-epoch choice per sample, inverted every other epoch).
 * pad = 0 and flip = NONE is a plain copy (evaluation).
 */
struct rt_aug {
    uint32_t pad;
    enum rt_pad_mode pad_mode;
    enum rt_flip flip;
};

/*
 * Writes the augmented CHW image of sample `id` in `epoch` to `dst` (same
 * shape as `src`). The crop offsets and flip depend only on (seed, epoch,
 * id) through the counter-based RNG. pad must be <= min(h, w) - 1 for REFLECT.
 */
void rt_augment(const struct rt_aug *a, uint64_t seed, uint64_t epoch, uint64_t id, uint32_t c, uint32_t h,
                uint32_t w, const uint8_t *src, uint8_t *dst);

/* ---- the loader: shards -> decode -> augment -> ring ------------------------------ */

enum rt_io_kind { RT_IO_AUTO = 0, RT_IO_URING, RT_IO_PREAD };

/* Where a loader starts, or how far a consumer got; restores to the exact next batch. */
struct rt_loader_state {
    uint64_t epoch, step;    /* the next batch to hand out */
    uint64_t seed;
    uint32_t world, rank, batch;
    enum rt_shuffle shuffle;
};

struct rt_loader_opts {
    enum rt_split split;
    uint32_t batch;              /* per rank */
    uint32_t world, rank;        /* 0/0 = 1/0 */
    uint64_t seed;
    enum rt_shuffle shuffle;
    uint32_t window_blocks;      /* WINDOW: 0 = 64 */
    enum rt_last_batch last;
    struct rt_aug aug;
    int workers;                 /* decode/augment threads; 0 = the CPUs this process may use */
    enum rt_io_kind io;          /* AUTO: io_uring, or a pread pool with a notice if unavailable */
    uint32_t queue_depth;        /* reads in flight; 0 = 32 */
    int direct;                  /* O_DIRECT reads (falls back with a notice where unsupported) */
    uint64_t epochs;             /* stop after this epoch count (0 = run until destroyed) */
    uint64_t start_epoch, start_step; /* resume point (see rt_loader_state) */
    /* Called by the worker that filled batch `b`, just before it is handed to
     * the consumer (progress; the tests' slow storage). NULL: none. It must not
     * touch the ring or the loader. */
    void (*on_batch)(void *ctx, const struct rt_batch *b);
    void *on_batch_ctx;
};

/* Where the time went, summed over the loader's threads. */
struct rt_loader_stats {
    const char *io_kind;         /* "io_uring" or "pread" */
    int direct, fixed_buffers, fixed_files;
    int workers;
    uint32_t queue_depth;
    uint64_t batches, images;    /* handed to the consumer */
    uint64_t io_reads, io_bytes;
    uint64_t io_busy_ns;         /* wall time with at least one read in flight */
    uint64_t raw_bytes;          /* bytes zstd produced (stored JPEG blocks add none) */
    uint64_t decoded_images;     /* records decoded from blocks */
    uint64_t checksum_ns, decompress_ns, decode_ns, augment_ns; /* worker time, summed */
    uint64_t worker_idle_ns;
    uint64_t load_ns;            /* EXACT/NONE: wall time of the first full read */
    uint64_t resident_bytes;     /* decoded records held in RAM */
};

struct rt_loader;

/*
 * Opens split `o->split` of the dataset at `dir` (borrowed `ds`, which must
 * outlive the loader) and starts the loader's threads: one planner, one I/O
 * thread (or the pread pool) and o->workers decode/augment workers, which
 * fill `ring` (borrowed; its shape must match the dataset and o->batch) in
 * batch order from o->start_epoch/o->start_step on. Batches are bit-identical
 * for any worker count, queue depth, I/O engine or completion order.
 * Returns 0 or -errno.
 */
int rt_loader_create(const struct rt_dataset *ds, const struct rt_loader_opts *o, struct rt_ring *ring,
                     struct rt_loader **out);

/*
 * Takes the next batch in order. Returns 1 with *out set to it (IN_FLIGHT,
 * until rt_loader_release()); 0 with *out = NULL at the end of the last
 * epoch, which is no error and leaves rt_errmsg() alone; or -errno with
 * *out = NULL on an error such as a corrupt block (rt_errmsg() names shard,
 * block and records). Once it has returned 0 or -errno it returns the same
 * again. One consumer thread.
 */
int rt_loader_next(struct rt_loader *L, struct rt_batch **out);
void rt_loader_release(struct rt_loader *L, struct rt_batch *b);

/* Stops the threads and frees the loader (closing the ring); NULL is fine. */
void rt_loader_destroy(struct rt_loader *L);

uint64_t rt_loader_steps_per_epoch(const struct rt_loader *L);
void rt_loader_stats(struct rt_loader *L, struct rt_loader_stats *s);

/* The position after the last batch rt_loader_next() returned. */
void rt_loader_state(const struct rt_loader *L, struct rt_loader_state *st);
/* As one line of JSON (`len` >= 256), and back; parse returns 0 or -EINVAL. */
int rt_loader_state_format(const struct rt_loader_state *st, char *buf, size_t len);
int rt_loader_state_parse(const char *text, struct rt_loader_state *st);

/* ---- images ------------------------------------------------------------------- */

/*
 * Writes a CHW uint8 image (C = 1 or 3) as PNG, or as binary PPM/PGM, chosen
 * by the extension of `path` (.png, .ppm, .pgm). Returns 0 or -errno.
 */
int rt_image_write(const char *path, const uint8_t *chw, uint32_t c, uint32_t h, uint32_t w);

#endif /* RT_LOADER_H */
