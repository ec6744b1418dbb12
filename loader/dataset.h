/*
 * dataset.h - the dataset format and its reader: a packed dataset is a
 * manifest.json and the shards it lists (docs/FORMAT.md). This header names
 * the format's vocabulary (codecs, splits), reads and validates the manifest
 * into an rt_dataset, and parses and reads shards: header, labels, block
 * index and the stored bytes of single blocks.
 *
 * It does not decode blocks, verify a whole dataset or load batches: those
 * need the decoders and are in loader.h (decoders, loader) and offline.h
 * (verify), which include this header. What
 * only needs the file list, sizes and checksums (node-local copies,
 * staging/local_copy.h) depends on this part alone. All functions return 0
 * (or a count) on success and -errno on failure, with the reason -- naming
 * file, shard, block, record or offset -- in rt_errmsg(). None of them abort
 * on bad input.
 */
#ifndef RT_LOADER_DATASET_H
#define RT_LOADER_DATASET_H

#include <stddef.h>
#include <stdint.h>

/* ---- vocabulary ------------------------------------------------------------ */

enum rt_codec { RT_CODEC_RAW = 0, RT_CODEC_JPEG = 1 };

enum rt_split { RT_SPLIT_TRAIN = 0, RT_SPLIT_VAL = 1, RT_SPLIT_TEST = 2, RT_SPLIT_COUNT = 3 };

/* "raw" / "jpeg"; NULL for an unknown value. */
const char *rt_codec_name(enum rt_codec codec);
/* "train" / "val" / "test"; NULL for an unknown value. */
const char *rt_split_name(enum rt_split split);

/* ---- reading a dataset ------------------------------------------------------ */

struct rt_dataset;

struct rt_shard_ref {
    const char *file;        /* name relative to the dataset directory */
    uint64_t records;
    uint64_t bytes;          /* file size */
    uint64_t xxh64;          /* XXH64 (seed 0) of the whole file */
    uint64_t first_record;   /* index of the shard's first record within its split */
};

struct rt_split_info {
    uint64_t records;
    uint32_t nshards;
    const struct rt_shard_ref *shards;
    const uint64_t *class_counts;    /* num_classes entries */
};

struct rt_dataset_info {
    const char *dir;
    const char *source;              /* input kind recorded by pack */
    enum rt_codec codec;
    /*
     * height = width = 0: variable-size JPEG records (pack --max-side), each
     * with its own size in its block; the loader crops and resizes them to
     * a size the caller chooses (rt_loader_opts.image_size).
     */
    uint32_t channels, height, width;
    /* Variable-size records only: pack's --max-side, and the smallest,
     * median and largest record size as {height, width} (by area). */
    uint32_t max_side;
    uint32_t size_min[2], size_median[2], size_max[2];
    /* Files pack skipped (--skip-bad) and ignored (not images); 0 for other sources. */
    uint64_t skipped_files, ignored_files;
    uint32_t num_classes;
    const char *const *class_names;  /* num_classes entries */
    uint64_t stored_bytes;           /* sum of shard sizes */
    struct rt_split_info split[RT_SPLIT_COUNT];
    /*
     * Per-channel normalisation statistics of the training split (manifest
     * "mean" and "std"), in 0..1 units (pixel / 255): the mean and the
     * population standard deviation over every pixel of every training
     * record as the loader decodes it -- what torchvision's
     * Normalize(mean, std) takes. The first `channels` entries are used.
     * have_norm = 0 (and the arrays zero) when the manifest predates these
     * fields or the dataset has no training records.
     */
    int have_norm;
    float mean[4], std[4];
};

/*
 * Opens the dataset at `dir` by reading and validating `dir`/manifest.json.
 * Shards are not opened. The handle owns all strings and arrays reachable from
 * rt_dataset_info(). Returns 0 or -errno.
 */
int rt_dataset_open(const char *dir, struct rt_dataset **out);

/* Same, from manifest text already in memory (`name` is used in messages). */
int rt_dataset_parse_manifest(const char *dir, const char *text, size_t len, const char *name,
                              struct rt_dataset **out);

/* Frees the handle; NULL is fine. */
void rt_dataset_close(struct rt_dataset *ds);

/* Borrowed view, valid until rt_dataset_close(). */
const struct rt_dataset_info *rt_dataset_info(const struct rt_dataset *ds);

/* ---- reading a shard ---------------------------------------------------------- */

/* Parsed, validated shard header (docs/FORMAT.md, "Shard header"). Version 1
 * holds fixed-size records; version 2 variable-size JPEG records, with
 * height = width = 0 here and each record's size in its block's table. */
struct rt_shard_header {
    uint32_t version;
    enum rt_codec codec;
    uint32_t compression;    /* 0 = stored, 1 = zstd */
    enum rt_split split;
    uint32_t channels, height, width;
    uint32_t num_classes;
    uint64_t record_count;
    uint64_t first_record;
    uint32_t block_count;
    uint64_t labels_offset, index_offset, data_offset, file_size;
    uint64_t labels_xxh64, index_xxh64;
};

/* 1 when the shard's records have their own sizes (version 2, jpeg). */
static inline int rt_shard_variable(const struct rt_shard_header *h) { return h->height == 0; }

/* One entry of the block index. */
struct rt_block_entry {
    uint64_t offset;         /* absolute file offset of the stored bytes */
    uint32_t stored_size;
    uint32_t raw_size;       /* payload bytes after decompression */
    uint32_t first_record;   /* within the shard */
    uint32_t record_count;
    uint64_t xxh64;          /* of the stored bytes */
};

/* Bytes of the fixed shard header; read at least this much to parse it. */
#define RT_SHARD_HEADER_SIZE 128

/*
 * Parses the first RT_SHARD_HEADER_SIZE bytes of a shard and checks magic,
 * version, header checksum and that all offsets and counts are consistent
 * with each other. `name` is used in messages. Returns 0 or -EBADMSG /
 * -EPROTONOSUPPORT (newer version).
 */
int rt_shard_parse_header(const void *buf, size_t len, const char *name, struct rt_shard_header *h);

/*
 * Checks the label section (record_count little-endian int32 at
 * labels_offset; `buf` holds exactly those bytes) against its checksum and
 * the class range, and copies them to `labels`. Returns 0 or -EBADMSG.
 */
int rt_shard_parse_labels(const struct rt_shard_header *h, const void *buf, size_t len,
                          const char *name, int32_t *labels);

/*
 * Checks and decodes the block index (`buf` holds block_count * 32 bytes at
 * index_offset) into `blocks`: checksum, blocks in order, contiguous record
 * ranges covering the shard, stored ranges inside the data section.
 * Returns 0 or -EBADMSG.
 */
int rt_shard_parse_index(const struct rt_shard_header *h, const void *buf, size_t len,
                         const char *name, struct rt_block_entry *blocks);

/*
 * Checks the record table of a JPEG block's payload (raw_size bytes, after
 * its checksum and any decompression): offsets start at 0, never decrease
 * and end at the payload's end; for variable-size shards every record's
 * size is 1..65535 on each side. Returns 0 or -EBADMSG naming `name`, the
 * block and the record.
 */
int rt_jpeg_block_check(const struct rt_shard_header *h, const struct rt_block_entry *e, uint32_t block,
                        const uint8_t *payload, const char *name);

/* A record of a JPEG block whose table rt_jpeg_block_check() accepted. */
struct rt_jpeg_record {
    const uint8_t *data;     /* the JPEG stream, inside the payload */
    uint32_t len;
    uint32_t height, width;  /* the record's size (the header's for fixed-size shards) */
};

/* Record `r` (< e->record_count) of a checked JPEG block payload. Pure. */
void rt_jpeg_block_record(const struct rt_shard_header *h, const struct rt_block_entry *e,
                          const uint8_t *payload, uint32_t r, struct rt_jpeg_record *rec);

/* An open shard file with its header, labels and block index loaded. */
struct rt_shard;

/* Opens and validates a shard (header, labels, index; not the blocks). */
int rt_shard_open(const char *path, struct rt_shard **out);
/* Closes the shard; NULL is fine. */
void rt_shard_close(struct rt_shard *s);
const struct rt_shard_header *rt_shard_header(const struct rt_shard *s);
const int32_t *rt_shard_labels(const struct rt_shard *s);
const struct rt_block_entry *rt_shard_blocks(const struct rt_shard *s);

/*
 * Reads block `block`'s stored bytes into `buf` (at least stored_size bytes)
 * with pread. Returns 0 or -errno.
 */
int rt_shard_read_block(const struct rt_shard *s, uint32_t block, void *buf);

#endif /* RT_LOADER_DATASET_H */
