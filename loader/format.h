/*
 * format.h (private to loader/) - byte layout constants of shard format v1 and
 * the little-endian helpers that read and write it. docs/FORMAT.md is the
 * specification; this file must agree with it.
 */
#ifndef RT_LOADER_FORMAT_H
#define RT_LOADER_FORMAT_H

#include <stdint.h>
#include <string.h>

#include "loader/dataset.h"

#define RT_SHARD_MAGIC "RTSHARD\0"
#define RT_SHARD_VERSION 2u          /* the newest this build reads */
#define RT_SHARD_VERSION_FIXED 1u    /* written for fixed-size records (every dataset before variable sizes) */
#define RT_SHARD_VERSION_VARIABLE 2u /* written for variable-size JPEG records (height = width = 0) */
#define RT_BLOCK_ENTRY_SIZE 32u
#define RT_COMPRESSION_NONE 0u
#define RT_COMPRESSION_ZSTD 1u
#define RT_MANIFEST_NAME "manifest.json"
#define RT_MANIFEST_FORMAT "ringtrain-dataset"
#define RT_MANIFEST_VERSION 1

/* Upper bounds that keep a hostile header from asking for absurd memory. */
#define RT_MAX_DIM 65535u
#define RT_MAX_CHANNELS 4u
#define RT_MAX_CLASSES 1000000u
#define RT_MAX_BLOCK_RAW (256u << 20)

/* Header field offsets (docs/FORMAT.md, "Shard header"). */
enum {
    HDR_MAGIC = 0,
    HDR_VERSION = 8,
    HDR_SIZE = 12,
    HDR_CODEC = 16,
    HDR_COMPRESSION = 20,
    HDR_SPLIT = 24,
    HDR_CHANNELS = 28,
    HDR_HEIGHT = 32,
    HDR_WIDTH = 36,
    HDR_NUM_CLASSES = 40,
    HDR_BLOCK_COUNT = 44,
    HDR_RECORD_COUNT = 48,
    HDR_FIRST_RECORD = 56,
    HDR_LABELS_OFFSET = 64,
    HDR_INDEX_OFFSET = 72,
    HDR_DATA_OFFSET = 80,
    HDR_FILE_SIZE = 88,
    HDR_LABELS_XXH64 = 96,
    HDR_INDEX_XXH64 = 104,
    HDR_RESERVED = 112,
    HDR_XXH64 = 120,
};

static inline uint32_t rt_le16(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8; }

static inline uint32_t rt_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t rt_le64(const uint8_t *p) { return rt_le32(p) | (uint64_t)rt_le32(p + 4) << 32; }

static inline void rt_put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline void rt_put64(uint8_t *p, uint64_t v)
{
    rt_put32(p, (uint32_t)v);
    rt_put32(p + 4, (uint32_t)(v >> 32));
}

/* Serialises `h` into RT_SHARD_HEADER_SIZE bytes, header checksum included. */
void rt_shard_header_encode(const struct rt_shard_header *h, uint8_t *out);

/* Serialises one block index entry into RT_BLOCK_ENTRY_SIZE bytes. */
void rt_block_entry_encode(const struct rt_block_entry *e, uint8_t *out);

/* Bytes of one decoded record (0 for variable-size records: see rt_shard_variable). */
static inline uint64_t rt_record_bytes(const struct rt_shard_header *h)
{
    return (uint64_t)h->channels * h->height * h->width;
}

/* Bytes of a JPEG block's record table: offsets, and each record's size when variable. */
static inline uint64_t rt_jpeg_table_bytes(const struct rt_shard_header *h, uint32_t records)
{
    return 4 * ((uint64_t)records + 1) + (rt_shard_variable(h) ? 4 * (uint64_t)records : 0);
}

#endif
