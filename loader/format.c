/*
 * format.c - encodes and validates the fixed parts of a shard: the 128-byte
 * header, the label section and the block index (docs/FORMAT.md). Pure
 * functions over memory: no I/O, no allocation, safe on hostile bytes.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <xxhash.h>

#include "common/common.h"
#include "loader/format.h"

void rt_shard_header_encode(const struct rt_shard_header *h, uint8_t *out)
{
    memset(out, 0, RT_SHARD_HEADER_SIZE);
    memcpy(out + HDR_MAGIC, RT_SHARD_MAGIC, 8);
    rt_put32(out + HDR_VERSION, rt_shard_variable(h) ? RT_SHARD_VERSION_VARIABLE : RT_SHARD_VERSION_FIXED);
    rt_put32(out + HDR_SIZE, RT_SHARD_HEADER_SIZE);
    rt_put32(out + HDR_CODEC, (uint32_t)h->codec);
    rt_put32(out + HDR_COMPRESSION, h->compression);
    rt_put32(out + HDR_SPLIT, (uint32_t)h->split);
    rt_put32(out + HDR_CHANNELS, h->channels);
    rt_put32(out + HDR_HEIGHT, h->height);
    rt_put32(out + HDR_WIDTH, h->width);
    rt_put32(out + HDR_NUM_CLASSES, h->num_classes);
    rt_put32(out + HDR_BLOCK_COUNT, h->block_count);
    rt_put64(out + HDR_RECORD_COUNT, h->record_count);
    rt_put64(out + HDR_FIRST_RECORD, h->first_record);
    rt_put64(out + HDR_LABELS_OFFSET, h->labels_offset);
    rt_put64(out + HDR_INDEX_OFFSET, h->index_offset);
    rt_put64(out + HDR_DATA_OFFSET, h->data_offset);
    rt_put64(out + HDR_FILE_SIZE, h->file_size);
    rt_put64(out + HDR_LABELS_XXH64, h->labels_xxh64);
    rt_put64(out + HDR_INDEX_XXH64, h->index_xxh64);
    rt_put64(out + HDR_XXH64, XXH64(out, HDR_XXH64, 0));
}

void rt_block_entry_encode(const struct rt_block_entry *e, uint8_t *out)
{
    rt_put64(out, e->offset);
    rt_put32(out + 8, e->stored_size);
    rt_put32(out + 12, e->raw_size);
    rt_put32(out + 16, e->first_record);
    rt_put32(out + 20, e->record_count);
    rt_put64(out + 24, e->xxh64);
}

static uint64_t align8(uint64_t v) { return (v + 7) & ~(uint64_t)7; }

int rt_shard_parse_header(const void *buf, size_t len, const char *name, struct rt_shard_header *h)
{
    const uint8_t *p = buf;
    uint64_t want;

    if (len < RT_SHARD_HEADER_SIZE)
        return rt_errf(-EBADMSG, "%s: truncated shard header: %zu bytes, expected %u", name, len,
                       RT_SHARD_HEADER_SIZE);
    if (memcmp(p + HDR_MAGIC, RT_SHARD_MAGIC, 8) != 0)
        return rt_errf(-EBADMSG, "%s: offset 0: not a ringtrain shard (bad magic, expected \"RTSHARD\\0\")",
                       name);
    h->version = rt_le32(p + HDR_VERSION);
    /* The checksum first: a version above ours is a newer writer's only where the header is intact (a newer
     * format keeps the checksum where it is, over the bytes before it); a flipped byte in the version field is
     * a corrupt header, not a reason to upgrade. */
    if (rt_le64(p + HDR_XXH64) != XXH64(p, HDR_XXH64, 0))
        return rt_errf(-EBADMSG, "%s: offset %d: header checksum mismatch (header is corrupt)", name,
                       HDR_XXH64);
    if (h->version > RT_SHARD_VERSION)
        return rt_errf(-EPROTONOSUPPORT,
                       "%s: offset %d: shard format version %" PRIu32
                       " was written by a newer ringtrain; this build reads version %u",
                       name, HDR_VERSION, h->version, RT_SHARD_VERSION);
    if (h->version != RT_SHARD_VERSION_FIXED && h->version != RT_SHARD_VERSION_VARIABLE)
        return rt_errf(-EBADMSG, "%s: offset %d: shard format version %" PRIu32 ", expected 1 or 2", name,
                       HDR_VERSION, h->version);
    if (rt_le32(p + HDR_SIZE) != RT_SHARD_HEADER_SIZE)
        return rt_errf(-EBADMSG, "%s: offset %d: header size %" PRIu32 ", expected %u", name, HDR_SIZE,
                       rt_le32(p + HDR_SIZE), RT_SHARD_HEADER_SIZE);

    uint32_t codec = rt_le32(p + HDR_CODEC), split = rt_le32(p + HDR_SPLIT);
    h->compression = rt_le32(p + HDR_COMPRESSION);
    h->channels = rt_le32(p + HDR_CHANNELS);
    h->height = rt_le32(p + HDR_HEIGHT);
    h->width = rt_le32(p + HDR_WIDTH);
    h->num_classes = rt_le32(p + HDR_NUM_CLASSES);
    h->block_count = rt_le32(p + HDR_BLOCK_COUNT);
    h->record_count = rt_le64(p + HDR_RECORD_COUNT);
    h->first_record = rt_le64(p + HDR_FIRST_RECORD);
    h->labels_offset = rt_le64(p + HDR_LABELS_OFFSET);
    h->index_offset = rt_le64(p + HDR_INDEX_OFFSET);
    h->data_offset = rt_le64(p + HDR_DATA_OFFSET);
    h->file_size = rt_le64(p + HDR_FILE_SIZE);
    h->labels_xxh64 = rt_le64(p + HDR_LABELS_XXH64);
    h->index_xxh64 = rt_le64(p + HDR_INDEX_XXH64);

    if (codec > RT_CODEC_JPEG)
        return rt_errf(-EBADMSG, "%s: offset %d: unknown codec %" PRIu32 " (expected 0 raw or 1 jpeg)",
                       name, HDR_CODEC, codec);
    h->codec = (enum rt_codec)codec;
    if (h->compression > RT_COMPRESSION_ZSTD)
        return rt_errf(-EBADMSG, "%s: offset %d: unknown block compression %" PRIu32, name,
                       HDR_COMPRESSION, h->compression);
    if (h->codec == RT_CODEC_RAW && h->compression != RT_COMPRESSION_ZSTD)
        return rt_errf(-EBADMSG, "%s: offset %d: raw codec requires zstd block compression", name,
                       HDR_COMPRESSION);
    if (split >= RT_SPLIT_COUNT)
        return rt_errf(-EBADMSG, "%s: offset %d: unknown split %" PRIu32, name, HDR_SPLIT, split);
    h->split = (enum rt_split)split;
    if (h->channels == 0 || h->channels > RT_MAX_CHANNELS || (h->codec == RT_CODEC_JPEG && h->channels != 1 && h->channels != 3))
        return rt_errf(-EBADMSG, "%s: offset %d: bad channel count %" PRIu32, name, HDR_CHANNELS,
                       h->channels);
    if (h->version == RT_SHARD_VERSION_VARIABLE) {
        /* Version 2 exists for variable-size JPEG records and nothing else. */
        if (h->codec != RT_CODEC_JPEG || h->height != 0 || h->width != 0)
            return rt_errf(-EBADMSG, "%s: offset %d: a version 2 shard holds variable-size JPEG records "
                           "(codec 1, size 0x0), not codec %u with size %" PRIu32 "x%" PRIu32,
                           name, HDR_HEIGHT, (unsigned)h->codec, h->height, h->width);
    } else if (h->height == 0 || h->height > RT_MAX_DIM || h->width == 0 || h->width > RT_MAX_DIM) {
        return rt_errf(-EBADMSG, "%s: offset %d: bad image size %" PRIu32 "x%" PRIu32, name, HDR_HEIGHT,
                       h->height, h->width);
    }
    if (h->num_classes == 0 || h->num_classes > RT_MAX_CLASSES)
        return rt_errf(-EBADMSG, "%s: offset %d: bad class count %" PRIu32, name, HDR_NUM_CLASSES,
                       h->num_classes);
    if (h->record_count == 0 || h->record_count > ((uint64_t)1 << 40))
        return rt_errf(-EBADMSG, "%s: offset %d: bad record count %" PRIu64, name, HDR_RECORD_COUNT,
                       h->record_count);
    if (h->block_count == 0 || h->block_count > h->record_count)
        return rt_errf(-EBADMSG, "%s: offset %d: bad block count %" PRIu32 " for %" PRIu64 " records",
                       name, HDR_BLOCK_COUNT, h->block_count, h->record_count);
    if (rt_le64(p + HDR_RESERVED) != 0)
        return rt_errf(-EBADMSG, "%s: offset %d: reserved bytes are not zero", name, HDR_RESERVED);
    if (h->labels_offset != RT_SHARD_HEADER_SIZE)
        return rt_errf(-EBADMSG, "%s: offset %d: labels offset %" PRIu64 ", expected %u", name,
                       HDR_LABELS_OFFSET, h->labels_offset, RT_SHARD_HEADER_SIZE);
    want = align8(h->labels_offset + 4 * h->record_count);
    if (h->index_offset != want)
        return rt_errf(-EBADMSG, "%s: offset %d: index offset %" PRIu64 ", expected %" PRIu64, name,
                       HDR_INDEX_OFFSET, h->index_offset, want);
    want = h->index_offset + (uint64_t)RT_BLOCK_ENTRY_SIZE * h->block_count;
    if (h->data_offset != want)
        return rt_errf(-EBADMSG, "%s: offset %d: data offset %" PRIu64 ", expected %" PRIu64, name,
                       HDR_DATA_OFFSET, h->data_offset, want);
    if (h->file_size <= h->data_offset)
        return rt_errf(-EBADMSG, "%s: offset %d: file size %" PRIu64 " leaves no room for block data",
                       name, HDR_FILE_SIZE, h->file_size);
    return 0;
}

int rt_shard_parse_labels(const struct rt_shard_header *h, const void *buf, size_t len,
                          const char *name, int32_t *labels)
{
    const uint8_t *p = buf;

    if (len != 4 * h->record_count)
        return rt_errf(-EBADMSG, "%s: label section is %zu bytes, expected %" PRIu64, name, len,
                       4 * h->record_count);
    if (XXH64(buf, len, 0) != h->labels_xxh64)
        return rt_errf(-EBADMSG, "%s: offset %" PRIu64 ": label section checksum mismatch", name,
                       h->labels_offset);
    for (uint64_t i = 0; i < h->record_count; i++) {
        int32_t v = (int32_t)rt_le32(p + 4 * i);
        if (v < 0 || (uint32_t)v >= h->num_classes)
            return rt_errf(-EBADMSG, "%s: record %" PRIu64 " (offset %" PRIu64 "): label %" PRId32
                           " out of range [0, %" PRIu32 ")",
                           name, i, h->labels_offset + 4 * i, v, h->num_classes);
        labels[i] = v;
    }
    return 0;
}

int rt_shard_parse_index(const struct rt_shard_header *h, const void *buf, size_t len,
                         const char *name, struct rt_block_entry *blocks)
{
    const uint8_t *p = buf;
    const uint64_t rec_bytes = rt_record_bytes(h);
    uint64_t next_offset = h->data_offset, next_record = 0;

    if (len != (size_t)RT_BLOCK_ENTRY_SIZE * h->block_count)
        return rt_errf(-EBADMSG, "%s: block index is %zu bytes, expected %" PRIu64, name, len,
                       (uint64_t)RT_BLOCK_ENTRY_SIZE * h->block_count);
    if (XXH64(buf, len, 0) != h->index_xxh64)
        return rt_errf(-EBADMSG, "%s: offset %" PRIu64 ": block index checksum mismatch", name,
                       h->index_offset);
    for (uint32_t b = 0; b < h->block_count; b++) {
        const uint8_t *q = p + (size_t)RT_BLOCK_ENTRY_SIZE * b;
        struct rt_block_entry *e = &blocks[b];
        e->offset = rt_le64(q);
        e->stored_size = rt_le32(q + 8);
        e->raw_size = rt_le32(q + 12);
        e->first_record = rt_le32(q + 16);
        e->record_count = rt_le32(q + 20);
        e->xxh64 = rt_le64(q + 24);
        if (e->offset != next_offset)
            return rt_errf(-EBADMSG, "%s: block %" PRIu32 ": starts at offset %" PRIu64
                           ", expected %" PRIu64 " (blocks must be contiguous)",
                           name, b, e->offset, next_offset);
        if (e->stored_size == 0 || e->stored_size > h->file_size - e->offset)
            return rt_errf(-EBADMSG, "%s: block %" PRIu32 ": %" PRIu32 " stored bytes at offset %" PRIu64
                           " run past the end of the file (%" PRIu64 " bytes)",
                           name, b, e->stored_size, e->offset, h->file_size);
        if (e->first_record != next_record || e->record_count == 0 ||
            e->record_count > h->record_count - next_record)
            return rt_errf(-EBADMSG, "%s: block %" PRIu32 ": records [%" PRIu32 ", +%" PRIu32
                           ") do not continue from record %" PRIu64 " within %" PRIu64,
                           name, b, e->first_record, e->record_count, next_record, h->record_count);
        if (e->raw_size > RT_MAX_BLOCK_RAW)
            return rt_errf(-EBADMSG, "%s: block %" PRIu32 ": raw size %" PRIu32 " exceeds the %u limit",
                           name, b, e->raw_size, RT_MAX_BLOCK_RAW);
        if (h->codec == RT_CODEC_RAW && e->raw_size != rec_bytes * e->record_count)
            return rt_errf(-EBADMSG, "%s: block %" PRIu32 ": raw size %" PRIu32 ", expected %" PRIu64
                           " for %" PRIu32 " records",
                           name, b, e->raw_size, rec_bytes * e->record_count, e->record_count);
        if (h->codec == RT_CODEC_JPEG && e->raw_size < rt_jpeg_table_bytes(h, e->record_count))
            return rt_errf(-EBADMSG, "%s: block %" PRIu32 ": raw size %" PRIu32 " too small for %" PRIu32
                           " JPEG records",
                           name, b, e->raw_size, e->record_count);
        if (h->compression == RT_COMPRESSION_NONE && e->stored_size != e->raw_size)
            return rt_errf(-EBADMSG, "%s: block %" PRIu32 ": stored size %" PRIu32
                           " differs from raw size %" PRIu32 " in an uncompressed block",
                           name, b, e->stored_size, e->raw_size);
        next_offset = e->offset + e->stored_size;
        next_record += e->record_count;
    }
    if (next_record != h->record_count)
        return rt_errf(-EBADMSG, "%s: blocks hold %" PRIu64 " records, header says %" PRIu64, name,
                       next_record, h->record_count);
    if (next_offset != h->file_size)
        return rt_errf(-EBADMSG, "%s: blocks end at offset %" PRIu64 ", header says file size %" PRIu64,
                       name, next_offset, h->file_size);
    return 0;
}

int rt_jpeg_block_check(const struct rt_shard_header *h, const struct rt_block_entry *e, uint32_t block,
                        const uint8_t *payload, const char *name)
{
    const uint64_t table = rt_jpeg_table_bytes(h, e->record_count);
    const uint64_t data_len = e->raw_size - table; /* rt_shard_parse_index checked raw_size >= table */
    const uint8_t *sizes = payload + 4 * ((uint64_t)e->record_count + 1);

    if (rt_le32(payload) != 0)
        return rt_errf(-EBADMSG, "%s: block %" PRIu32 ": JPEG offset table must start at 0", name, block);
    for (uint32_t r = 0; r < e->record_count; r++) {
        uint32_t lo = rt_le32(payload + 4 * (uint64_t)r), hi = rt_le32(payload + 4 * ((uint64_t)r + 1));
        uint64_t rec = h->first_record + e->first_record + r;
        if (hi < lo || hi > data_len)
            return rt_errf(-EBADMSG, "%s: block %" PRIu32 ": record %" PRIu64 ": JPEG bytes [%" PRIu32 ", %" PRIu32
                           ") outside the %" PRIu64 "-byte payload",
                           name, block, rec, lo, hi, data_len);
        if (r + 1 == e->record_count && hi != data_len)
            return rt_errf(-EBADMSG, "%s: block %" PRIu32 ": record %" PRIu64 ": payload has %" PRIu64
                           " trailing bytes", name, block, rec, data_len - hi);
        if (rt_shard_variable(h)) {
            uint32_t hw = rt_le32(sizes + 4 * (uint64_t)r);
            if ((hw >> 16) == 0 || (hw & 0xffff) == 0)
                return rt_errf(-EBADMSG, "%s: block %" PRIu32 ": record %" PRIu64 ": size %" PRIu32 "x%" PRIu32
                               " in the record table", name, block, rec, hw >> 16, hw & 0xffff);
        }
    }
    return 0;
}

void rt_jpeg_block_record(const struct rt_shard_header *h, const struct rt_block_entry *e,
                          const uint8_t *payload, uint32_t r, struct rt_jpeg_record *rec)
{
    const uint8_t *data = payload + rt_jpeg_table_bytes(h, e->record_count);
    uint32_t lo = rt_le32(payload + 4 * (uint64_t)r), hi = rt_le32(payload + 4 * ((uint64_t)r + 1));

    rec->data = data + lo;
    rec->len = hi - lo;
    if (rt_shard_variable(h)) {
        uint32_t hw = rt_le32(payload + 4 * ((uint64_t)e->record_count + 1) + 4 * (uint64_t)r);
        rec->height = hw >> 16;
        rec->width = hw & 0xffff;
    } else {
        rec->height = h->height;
        rec->width = h->width;
    }
}
