/*
 * fuzz_idx.c - libFuzzer target for the MNIST IDX reader: the input is an
 * IDX file, gzipped or not (gunzip bounded at 16 MiB here), parsed as both an
 * image file (3 dimensions) and a label file (1 dimension).
 */
#include <stdint.h>
#include <stdlib.h>

#include "common/common.h"
#include "loader/source.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *inflated = NULL;
    size_t len = size;
    const uint8_t *buf = data, *payload;
    uint32_t dims[3];

    if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) {
        if (rt_gunzip(data, size, 16u << 20, "fuzz", &inflated, &len) < 0)
            return 0;
        buf = inflated;
    }
    if (rt_idx_parse(buf, len, "fuzz", 3, dims, &payload) == 0) {
        /* Touch the first and last byte the parser vouched for. */
        volatile uint8_t sink = payload[0];
        sink = payload[(uint64_t)dims[0] * dims[1] * dims[2] - 1];
        (void)sink;
    }
    if (rt_idx_parse(buf, len, "fuzz", 1, dims, &payload) == 0) {
        volatile uint8_t sink = payload[dims[0] - 1];
        (void)sink;
    }
    free(inflated);
    return 0;
}
