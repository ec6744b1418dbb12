/*
 * fuzz_shard.c - libFuzzer target for the dataset readers: the input is a
 * whole shard file (header, labels, index, every block decoded) when its
 * first byte is even, or manifest.json text when odd. Any input must be
 * either accepted or rejected with an error: never a crash, a leak, or an
 * out-of-bounds read.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "loader/format.h"
#include "loader/loader.h"
#include <xxhash.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_shard(const uint8_t *buf, size_t len)
{
    struct rt_shard_header h;
    struct rt_decoder *dec;

    if (rt_shard_parse_header(buf, len, "fuzz", &h) < 0 || h.file_size != len)
        return;
    /* Keep hostile counts from turning into huge allocations: the sections must fit the input. */
    if (h.record_count > len / 4 || h.block_count > len / 32 || h.data_offset > len)
        return;
    int32_t *labels = malloc(4 * h.record_count);
    struct rt_block_entry *blocks = malloc(sizeof(*blocks) * h.block_count);
    if (labels && blocks && rt_shard_parse_labels(&h, buf + h.labels_offset, 4 * h.record_count, "fuzz", labels) == 0 &&
        rt_shard_parse_index(&h, buf + h.index_offset, 32 * (size_t)h.block_count, "fuzz", blocks) == 0 &&
        rt_decoder_create(&dec) == 0) {
        const uint64_t rec = (uint64_t)h.channels * h.height * h.width;
        for (uint32_t b = 0; b < h.block_count; b++) {
            if (rec * blocks[b].record_count > (64u << 20))
                break;
            uint8_t *out = malloc(rec * blocks[b].record_count);
            if (out)
                rt_block_decode(dec, &h, &blocks[b], b, buf + blocks[b].offset, out, "fuzz");
            free(out);
        }
        rt_decoder_destroy(dec);
    }
    free(labels);
    free(blocks);
}

/* Recomputes block, index, label and header checksums wherever the offsets fit. */
static void reseal(uint8_t *buf, size_t len)
{
    if (len < RT_SHARD_HEADER_SIZE)
        return;
    uint64_t n = rt_le64(buf + HDR_RECORD_COUNT), nb = rt_le32(buf + HDR_BLOCK_COUNT);
    uint64_t lo = rt_le64(buf + HDR_LABELS_OFFSET), io = rt_le64(buf + HDR_INDEX_OFFSET);
    if (io <= len && nb <= (len - io) / 32) {
        for (uint64_t b = 0; b < nb; b++) {
            uint8_t *e = buf + io + 32 * b;
            uint64_t off = rt_le64(e), sz = rt_le32(e + 8);
            if (off <= len && sz <= len - off)
                rt_put64(e + 24, XXH64(buf + off, sz, 0));
        }
        rt_put64(buf + HDR_INDEX_XXH64, XXH64(buf + io, 32 * nb, 0));
    }
    if (lo <= len && n <= (len - lo) / 4)
        rt_put64(buf + HDR_LABELS_XXH64, XXH64(buf + lo, 4 * n, 0));
    rt_put64(buf + HDR_XXH64, XXH64(buf, HDR_XXH64, 0));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] % 2 == 0 && (data[0] & 2)) {
        uint8_t *copy = malloc(size - 1 + 1);
        if (!copy)
            return 0;
        memcpy(copy, data + 1, size - 1);
        reseal(copy, size - 1);
        fuzz_shard(copy, size - 1);
        free(copy);
    } else if (data[0] % 2 == 0) {
        fuzz_shard(data + 1, size - 1);
    } else {
        struct rt_dataset *ds = NULL;
        if (rt_dataset_parse_manifest("fuzz", (const char *)data + 1, size - 1, "fuzz", &ds) == 0)
            rt_dataset_close(ds);
    }
    return 0;
}
