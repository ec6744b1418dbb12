/*
 * loader.h - ringtrain's data side on the training path, up to the batch
 * slot: the block decoders, the sampler, augmentation and the loader that
 * fills the batch ring (its options, stats and resumable state,
 * rt_loader_next/release). The dataset format (shards + manifest) and its
 * reader are in loader/dataset.h, the batch slots and the ring in
 * staging/ring.h; both are included here.
 *
 * It does not hold the offline tools that make and check datasets -- `pack`,
 * the synthetic dataset generator, `verify` and the image writer: those are
 * in loader/offline.h; the loader-alone benchmark is in loader/loadbench.h.
 * This module knows nothing about CUDA, models or collectives. See
 * docs/FORMAT.md for the on-disk layout that the functions below read.
 * All functions return 0 (or a count) on success and -errno on failure, with
 * the reason -- naming file, shard, block, record or offset -- in
 * rt_errmsg(). None of them abort on bad input.
 */
#ifndef RT_LOADER_H
#define RT_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "loader/dataset.h"
#include "staging/ring.h"

/* ---- decoding blocks ---------------------------------------------------------- */

/* Per-thread decoding state (zstd context, TurboJPEG handle). */
struct rt_decoder;

int rt_decoder_create(struct rt_decoder **out);
/* Frees the decoder; NULL is fine. */
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

/*
 * Variable-size JPEG shards: checks block `block`'s stored bytes (checksum,
 * decompression, record table: rt_jpeg_block_check) and copies the payload
 * (raw_size bytes) to `out`, where rt_jpeg_block_record() finds each
 * record; the loader decodes the records per sample, cropped.
 * Returns 0 or -EBADMSG naming `name`, the block and the record.
 */
int rt_block_payload(struct rt_decoder *d, const struct rt_shard_header *h, const struct rt_block_entry *e,
                     uint32_t block, const void *stored, uint8_t *out, const char *name);

/*
 * Variable-size records: decodes one record of a checked block payload
 * (rt_jpeg_block_record) whole, at its own size, into CHW `out` (h->channels
 * x rec->height x rec->width bytes); a JPEG whose size disagrees with the
 * record table is an error. For verify and inspect, not the training path.
 * Returns 0 or -EBADMSG naming `where`.
 */
int rt_jpeg_record_decode(struct rt_decoder *d, const struct rt_shard_header *h, const struct rt_jpeg_record *rec,
                          uint8_t *out, const char *where);

/* ---- sampler ------------------------------------------------------------------ */

/*
 * Which records a rank sees, in which order, epoch after epoch. The order is
 * a pure function of (seed, epoch, world, rank, batch, accum) and the
 * dataset's block layout: thread counts and timing never change it.
 *
 *  EXACT   a uniform permutation of the whole split per epoch: the epoch's
 *          global sequence. Update u takes its positions [u*G, (u+1)*G),
 *          G = batch x world x accum, cut into micro-batches of `batch` by
 *          position; micro-batch m goes to rank m % world as that rank's
 *          (m / world)-th of the update. The samples of an update depend on
 *          G alone: a run continues on another world size with the same
 *          updates (tools/train/checkpoint.c). The loader keeps the decoded
 *          split in RAM after the first read (right for CIFAR-sized data).
 *  WINDOW  for data larger than RAM: the split's blocks are permuted per
 *          epoch and dealt round-robin to ranks; each rank reads its blocks
 *          in windows of `window_blocks` and shuffles the records within a
 *          window (its micro-batches one after another; accum plays no part).
 *          Memory: a few windows, not the split. The order depends on the
 *          world size: each rank reads only its own blocks.
 *  NONE    record order as the global sequence, dealt as EXACT's (evaluation).
 *
 * Every rank gets the same number of steps by construction. Last-batch
 * policy DROP (training default) drops the tail so every batch is full
 * (EXACT/NONE: every update: the last N mod G records of the sequence); PAD
 * (evaluation) covers every record exactly once across ranks and fills the
 * remaining positions with RT_PAD_ID, always at the end of the rank's order
 * (EXACT/NONE with accum 1: the last update's records are shared out evenly,
 * so the ranks' last batches differ by one record at most).
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
    uint32_t batch;                 /* per rank: one micro-batch */
    uint32_t accum;                 /* EXACT/NONE: micro-batches per rank per update; 0 = 1 */
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
/* Frees the sampler; NULL is fine. */
void rt_sampler_destroy(struct rt_sampler *s);
/* Steps (micro-batches) per epoch; the same on every rank. */
uint64_t rt_sampler_steps(const struct rt_sampler *s);
/* EXACT/NONE: G, the samples one update takes from the global sequence; WINDOW: 0 (there is none). */
uint64_t rt_sampler_global_batch(const struct rt_sampler *s);
/*
 * An epoch whose global sequence is taken from position `first` on (a run
 * resumed from another world or batch size; EXACT/NONE only unless first
 * is 0): its steps are numbered from *base = (first / G) x accum up to
 * *end, the updates that fit in the records from `first` as the last-batch
 * policy says. first 0 gives 0 and rt_sampler_steps(). Returns 0 or -EINVAL
 * with a message.
 */
int rt_sampler_steps_from(const struct rt_sampler *s, uint64_t first, uint64_t *base, uint64_t *end);
/* Builds `epoch`'s plan for this rank from global position `first` (0: the whole epoch; steps below the base
 * are padding, never handed out). Caller frees it with rt_epoch_plan_free(). */
int rt_sampler_plan(const struct rt_sampler *s, uint64_t epoch, uint64_t first, struct rt_epoch_plan **out);
/* Frees a plan and its arrays; NULL is fine. */
void rt_epoch_plan_free(struct rt_epoch_plan *p);

/* ---- augmentation ---------------------------------------------------------------- */

enum rt_pad_mode { RT_PAD_ZERO = 0, RT_PAD_REFLECT };
enum rt_flip { RT_FLIP_NONE = 0, RT_FLIP_RANDOM, RT_FLIP_ALTERNATE };
/* ColorJitter's adjustments (hue is not one of ours). */
enum rt_jitter { RT_JITTER_BRIGHTNESS = 0, RT_JITTER_CONTRAST, RT_JITTER_SATURATION, RT_JITTER_COUNT };

/*
 * uint8 augmentation, torchvision's operations under their names, each
 * drawn from (seed, epoch, sample id) alone, in this order:
 *  - a random crop of the original size out of the image padded by `pad`
 *    pixels, zero or reflect (torchvision's RandomCrop with its padding);
 *    for images of their own sizes the loader's RandomResizedCrop instead,
 *    whose area share and aspect ranges crop_scale and crop_ratio set when
 *    non-zero (rt_loader_opts_for copies them into the loader's options);
 *  - a horizontal flip: RANDOM (probability 1/2 each epoch) or ALTERNATE (a
 *    random first-epoch choice per sample, inverted every other epoch);
 *  - ColorJitter(brightness, contrast, saturation): each `jitter` value v > 0
 *    draws a factor uniform in [max(0, 1 - v), 1 + v], and the adjustments
 *    run in a random order, as ColorJitter's; bit for bit the values of
 *    torchvision's tensor functions on uint8 images (adjust_brightness, ...;
 *    contrast's mean is exact up to 65,793 pixels an image). 1 or 3 channels;
 *    saturation leaves 1-channel images as they are (as torchvision does);
 *  - RandomErasing(p, scale, ratio): with probability erase_p a rectangle of
 *    an area share in erase_scale and an aspect in erase_ratio (log-uniform),
 *    up to 10 tries as torchvision's, is set to `fill`;
 *  - Cutout: a cutout x cutout square centred on a random pixel, clipped
 *    to the image, set to `fill`.
 * `fill` is what erased pixels become: rt_loader_opts_for() sets it to the
 * data's mean colour (0 after the normalisation, within half a step of 255),
 * which is what RandomErasing(value=0) after Normalize gives.
 * All zero is a plain copy (evaluation). Each part has its own random stream,
 * so adding one never changes another's draws.
 */
struct rt_aug {
    uint32_t pad;
    enum rt_pad_mode pad_mode;
    enum rt_flip flip;
    float jitter[RT_JITTER_COUNT];
    float erase_p;
    float erase_scale[2];        /* {0, 0} = (0.02, 0.33) */
    float erase_ratio[2];        /* {0, 0} = (0.3, 3.3) */
    uint32_t cutout;
    uint8_t fill[4];
    double crop_scale[2];        /* {0, 0}: the loader options' (RandomResizedCrop's (0.08, 1)) */
    double crop_ratio[2];        /* {0, 0}: the loader options' ((3/4, 4/3)); doubles, as the options' */
};

/* What one sample drew: the crop offset, the flip, the jitter in the order applied, the erased rectangles. */
struct rt_aug_draw {
    long dy, dx;                 /* crop offset from the unpadded image */
    int flip;
    int njitter;                 /* adjustments applied, in order: */
    enum rt_jitter order[RT_JITTER_COUNT];
    float factor[RT_JITTER_COUNT]; /* factor[i] goes with order[i] */
    uint32_t erase[4];           /* y, x, height, width; height 0: nothing erased */
    uint32_t cut[4];             /* Cutout's, the same way */
};

/*
 * Parses an augmentation: "none", or a comma (or '+') list of crop[=PAD],
 * reflect, crop-scale=SMIN:SMAX, crop-ratio=RMIN:RMAX, flip, alternate-flip,
 * brightness=V, contrast=V, saturation=V, jitter=V (the three at once),
 * erase[=P[:SMIN:SMAX[:RMIN:RMAX]]] and cutout=SIZE. Returns 0 or -EINVAL
 * with rt_errmsg() naming the bad part.
 */
int rt_aug_parse(const char *spec, struct rt_aug *a);
/* The augmentation in the words of rt_aug_parse ("crop=4,flip,jitter=0.4,erase=0.5"); "none" for none. */
void rt_aug_describe(const struct rt_aug *a, char *buf, size_t len);
/* "brightness", "contrast" or "saturation": the adjustment's name in the spelling. */
const char *rt_jitter_name(enum rt_jitter kind);
/* Whether `a` suits images of c x h x w: 0, or -EINVAL with a message. */
int rt_aug_check(const struct rt_aug *a, uint32_t c, uint32_t h, uint32_t w);

/* What sample `id` draws in `epoch` for images of h x w (the tests' and users' window on rt_augment). */
void rt_aug_draw(const struct rt_aug *a, uint64_t seed, uint64_t epoch, uint64_t id, uint32_t h, uint32_t w,
                 struct rt_aug_draw *d);

/*
 * Writes the augmented CHW image of sample `id` in `epoch` to `dst` (same
 * shape as `src`); the draws are rt_aug_draw's. pad must be <= min(h, w) - 1
 * for REFLECT.
 */
void rt_augment(const struct rt_aug *a, uint64_t seed, uint64_t epoch, uint64_t id, uint32_t c, uint32_t h,
                uint32_t w, const uint8_t *src, uint8_t *dst);

/*
 * The pixel part alone (jitter, erasing, Cutout), in place on a CHW image:
 * for images the loader has already cropped (variable-size records).
 */
void rt_augment_pixels(const struct rt_aug *a, uint64_t seed, uint64_t epoch, uint64_t id, uint32_t c, uint32_t h,
                       uint32_t w, uint8_t *img);

/* ---- the loader: shards -> decode -> augment -> ring ------------------------------ */

enum rt_io_kind { RT_IO_AUTO = 0, RT_IO_URING, RT_IO_PREAD };

/*
 * How variable-size records become S x S images: RANDOM is torchvision's
 * RandomResizedCrop(S, scale, ratio), training's; CENTER is
 * Resize(S / center_ratio) + CenterCrop(S), evaluation's. Either is then
 * flipped as aug.flip = RANDOM asks (a draw of the same (seed, epoch, id)
 * stream); other aug fields must be 0.
 */
enum rt_crop { RT_CROP_RANDOM = 0, RT_CROP_CENTER };

/* The evaluation crop's default share of the resized image: Resize(256) + CenterCrop(224). */
#define RT_CENTER_RATIO 0.875

/*
 * Where a loader starts, or how far a consumer got; restores to the exact
 * next batch. `sample` and `micro` carry the position to another world or
 * batch size (EXACT/NONE): the next batch belongs to the update that starts
 * at global position `sample` and is its micro-th micro-batch on this rank
 * (a move needs micro 0). WINDOW has no global position (sample 0).
 */
struct rt_loader_state {
    uint64_t epoch, step;    /* the next batch to hand out */
    uint64_t sample;         /* EXACT/NONE: global position of the next batch's update in epoch `epoch` */
    uint32_t micro;          /* the next batch's place in its update (0 at an update's start) */
    uint64_t seed;
    uint32_t world, rank, batch, accum;
    enum rt_shuffle shuffle;
};

struct rt_loader_opts {
    enum rt_split split;
    uint32_t batch;              /* per rank: one micro-batch */
    uint32_t accum;              /* micro-batches per rank per update (the sampler's); 0 = 1 */
    uint32_t world, rank;        /* 0/0 = 1/0 */
    uint64_t seed;
    enum rt_shuffle shuffle;
    uint32_t window_blocks;      /* WINDOW: 0 = 64 */
    enum rt_last_batch last;
    struct rt_aug aug;
    /* Variable-size records only (rt_dataset_info height 0; required then): slot images are
     * image_size x image_size, made by `crop`. A fixed-size dataset takes 0 or its own size. */
    uint32_t image_size;
    enum rt_crop crop;
    double crop_scale[2];        /* RANDOM: area fraction range; {0, 0} = (0.08, 1) */
    double crop_ratio[2];        /* RANDOM: aspect range; {0, 0} = (3/4, 4/3) */
    double center_ratio;         /* CENTER: 0 = RT_CENTER_RATIO */
    int workers;                 /* decode/augment threads; 0 = the CPUs this process may use */
    enum rt_io_kind io;          /* AUTO: io_uring, or a pread pool with a notice if unavailable */
    uint32_t queue_depth;        /* reads in flight; 0 = 32 */
    int direct;                  /* O_DIRECT reads (falls back with a notice where unsupported) */
    uint64_t epochs;             /* stop after this epoch count (0 = run until destroyed) */
    uint64_t start_epoch, start_step; /* resume point (see rt_loader_state) */
    /* EXACT/NONE, instead of start_step (then 0): start epoch start_epoch at this position of its global
     * sequence, one that another world or batch size reached; the epoch's steps are then numbered from
     * rt_sampler_steps_from()'s base. 0: not used. */
    uint64_t start_sample;
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
    uint64_t decoded_images;     /* records decoded: from blocks, or per sample (variable-size crops) */
    uint64_t checksum_ns, decompress_ns, decode_ns, augment_ns; /* worker time, summed */
    uint64_t worker_idle_ns;
    uint64_t load_ns;            /* EXACT/NONE: wall time of the first full read */
    uint64_t resident_bytes;     /* records held in RAM: decoded, or JPEG for variable sizes */
};

struct rt_loader;

/* ---- the input's policy: one home for what train, eval, loadbench and Python each used to decide ---- */

/* The default training augmentation: pad 4 with zeros, random crop, random horizontal flip (the CIFAR recipe). */
#define RT_AUG_DEFAULT ((struct rt_aug){.pad = 4, .pad_mode = RT_PAD_ZERO, .flip = RT_FLIP_RANDOM})

/*
 * The policy part of `o` for split `split` of the data `info`, the rest of
 * `o` (batch, ranks, shuffle, workers...) left as it is:
 *  - o->aug: `aug`, or for NULL the default -- RT_AUG_DEFAULT on the
 *    training split of 3-channel data, none on any other split or data
 *    (crops and flips suit photos, not digits); the augmentation's
 *    crop_scale/crop_ratio, where set, into o->crop_scale/crop_ratio;
 *  - variable-size records (info->height 0): o->crop is RandomResizedCrop on
 *    the training split when the augmentation crops (pad > 0), the centre
 *    crop otherwise; the padding, which is for fixed sizes, is dropped (the
 *    flip kept); an alternating flip is refused;
 *  - o->image_size, checked as rt_loader_image_shape() does.
 * Returns 0, or -EINVAL with a message naming what to change.
 */
int rt_loader_opts_for(const struct rt_dataset_info *info, enum rt_split split, const struct rt_aug *aug,
                       uint32_t image_size, struct rt_loader_opts *o);

/*
 * The normalisation constants of `channels` (at most 4) channels: the
 * manifest's (info->have_norm), else 0.5 and 0.25 for every channel (info
 * NULL: synthetic data). The normalisation itself is the model's, on the
 * device (rt_norm_lut's expression), or the Python Loader's at hand-over.
 * Returns 1 when they come from the manifest, else 0.
 */
int rt_loader_norm(const struct rt_dataset_info *info, uint32_t channels, float *mean, float *std);

/*
 * The image shape in the ring's slots for `info` and a requested image
 * size (rt_loader_opts.image_size): S x S for variable-size records (S
 * required), the stored size for fixed-size ones (S 0 or that size).
 * Returns 0 or -EINVAL with a message saying what to pass.
 */
int rt_loader_image_shape(const struct rt_dataset_info *info, uint32_t image_size, uint32_t *height,
                          uint32_t *width);

/*
 * Opens split `o->split` of the dataset `ds` (borrowed; it must outlive the
 * loader) and starts the loader's threads: one planner, one I/O
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
/* The end of `epoch`'s step numbers: rt_loader_steps_per_epoch(), or less for an epoch started at
 * o->start_sample. */
uint64_t rt_loader_epoch_steps(const struct rt_loader *L, uint64_t epoch);
void rt_loader_stats(struct rt_loader *L, struct rt_loader_stats *s);

/* The position after the last batch rt_loader_next() returned. */
void rt_loader_state(const struct rt_loader *L, struct rt_loader_state *st);
/* As one line of JSON (`len` >= 320), and back; parse returns 0 or -EINVAL. A version 1 state (before the
 * global order) parses where its order is today's too: one rank, or WINDOW; another is refused, saying why. */
int rt_loader_state_format(const struct rt_loader_state *st, char *buf, size_t len);
int rt_loader_state_parse(const char *text, struct rt_loader_state *st);

#endif /* RT_LOADER_H */
