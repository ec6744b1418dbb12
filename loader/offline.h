/*
 * offline.h - the loader module's offline tools, run before and beside
 * training rather than in it: the synthetic dataset generator
 * (`ringtrain synth`), packing the usual source formats into shards
 * (`ringtrain pack`), the whole-dataset check (`ringtrain verify`) and the
 * image writer (`ringtrain inspect`). They write and check the format that
 * loader/dataset.h reads (docs/FORMAT.md).
 *
 * It does not hold the training path -- decoders, sampler, augmentation and
 * the loader are in loader/loader.h -- and nothing here is called per batch.
 * All functions return 0 (or a count) on success and -errno on failure, with
 * the reason -- naming file, shard, block, record or offset -- in
 * rt_errmsg(). None of them abort on bad input. They take no handles that
 * outlive the call, so there is nothing to destroy.
 */
#ifndef RT_LOADER_OFFLINE_H
#define RT_LOADER_OFFLINE_H

#include <stdint.h>

#include "loader/dataset.h"

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
    int level;                  /* zstd level for raw blocks; 0 = 1 */
    uint64_t shard_bytes;       /* target stored bytes per shard; 0 = 64 MiB */
    uint32_t block_records;     /* records per block; 0 = about 128 KiB of pixels */
    double val_split;           /* fraction of train moved to val, [0, 1) */
    uint64_t split_seed;        /* seed of the val selection */
    enum rt_label_kind label;   /* CIFAR-100: fine (default) or coarse labels */
    int threads;                /* 0 = the CPUs this process may use */
    int force;                  /* replace an existing dataset at outdir */
    /* Image folders only. */
    uint32_t size_h, size_w;    /* --size: store every image at this size; 0 = keep the images' own (all alike) */
    int fit;                    /* how --size makes them so: 0 crop (default), 1 stretch, 2 pad (resize.h) */
    uint32_t max_side;          /* --max-side (jpeg codec): variable-size records, longer side at most this */
    uint32_t channels;          /* 1 = luma, 3 = RGB; 0 = 3 */
    int skip_bad;               /* list unreadable files in the manifest and go on, instead of stopping */
    int exif_rotate;            /* apply EXIF orientation (torchvision does not, by default) */
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
    /* Image folders: files listed as images, ignored (hidden or not images), skipped (--skip-bad). */
    uint64_t files, ignored, skipped;
    char skipped_summary[256];  /* e.g. "2 truncated, 1 not an image"; "" when none */
    uint64_t passthrough;       /* --max-side: JPEGs stored as they were */
    uint64_t scaled[4];         /* --size: JPEGs decoded at 1/2, 1/4, 1/8 (index k for 1/2^k; [0] unused) */
    uint64_t warned;            /* JPEGs kept though libjpeg warned (listed in the manifest) */
    char first_warning[768];    /* the first of them, "PATH: warning"; "" when none */
};

/*
 * Packs `input` -- a CIFAR-10/100 binary directory or its .tar.gz, the CIFAR
 * python tarball, an MNIST IDX directory (plain or .gz), or an image folder
 * ROOT/<class>/<file> (JPEG, PNG, WebP, PPM/PGM, BMP, TIFF) -- into shards and a
 * manifest under `outdir`. Image folders: with size_h/size_w every image is
 * resized (opts->fit); with max_side (jpeg codec) records keep their own
 * sizes; with neither, every image must have the first one's size. A file
 * that cannot be read as an image stops the pack with its path and reason,
 * or with skip_bad is left out and listed in the manifest. A JPEG decoded
 * through a libjpeg warning (as Pillow decodes it) is kept and listed in
 * the manifest with the warning.
 * Output is built in a temporary sibling directory and renamed into place only
 * when complete, so a failed pack leaves nothing that looks like a dataset.
 * Same input and options give byte-identical output whatever the thread count.
 * Returns 0 or -errno; `stats` (may be NULL) is filled on success.
 */
int rt_pack(const char *input, const char *outdir, const struct rt_pack_opts *opts,
            struct rt_pack_stats *stats);

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

/* ---- images ------------------------------------------------------------------- */

/*
 * Writes a CHW uint8 image (C = 1 or 3) as PNG, or as binary PPM/PGM, chosen
 * by the extension of `path` (.png, .ppm, .pgm). Returns 0 or -errno.
 */
int rt_image_write(const char *path, const uint8_t *chw, uint32_t c, uint32_t h, uint32_t w);

#endif /* RT_LOADER_OFFLINE_H */
