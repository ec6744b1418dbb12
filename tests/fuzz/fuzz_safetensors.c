/*
 * fuzz_safetensors.c - libFuzzer target for the safetensors reader
 * (compute.h). When the first input byte is even, the rest is the whole
 * file. When it is odd, the rest is "header JSON, a NUL byte, data bytes"
 * and the target prepends the correct header length, so mutations reach the
 * JSON checks instead of dying at the length check. Any input must be either
 * accepted -- with every tensor inside the file and consistent with its
 * shape -- or rejected with an error: never a crash, a leak or an
 * out-of-bounds read.
 *
 * The reader takes a path, so the input goes through a memfd and is read
 * back as /proc/self/fd/N: the real file path, no temporary files on disk.
 *
 * Seeds (corpus/safetensors/): rt-*.safetensors are files rt_st_write()
 * made (a mixed-dtype state_dict-like file, one with metadata, an empty
 * one), foreign-* a hand-laid file with padding and keys out of data order,
 * json-* the header-and-data form.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/common.h"
#include "compute/compute.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads `len` bytes as a file through a memfd; checks what an accepted file promises. */
static void fuzz_file(const uint8_t *buf, size_t len)
{
    struct rt_st_file *f = NULL;
    char path[64];
    int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);

    if (fd < 0)
        return;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    if (rt_write_full(fd, buf, len, path) == 0 && rt_st_read(path, &f) == 0) {
        uint64_t sum = 0, covered = 0;
        for (int i = 0; i < rt_st_count(f); i++) {
            const struct rt_st_tensor *t = rt_st_get(f, i);
            uint64_t n = rt_st_dtype_size(t->dtype);
            if (t->ndim < 0 || t->ndim > 8 || rt_st_find(f, t->name) != t)
                abort();
            for (int d = 0; d < t->ndim; d++)
                n *= (uint64_t)t->shape[d];
            if (n != t->bytes)
                abort();
            /* Touch every byte: ASan catches a tensor that points outside the file. */
            for (size_t b = 0; b < t->bytes; b++)
                sum += ((const uint8_t *)t->data)[b];
            covered += t->bytes;
        }
        /* Accepted tensors tile the data section, which lies inside the file. */
        if (covered > len)
            abort();
        (void)rt_st_meta(f, "format");
        volatile uint64_t keep = sum; /* the reads above must happen */
        (void)keep;
        rt_st_close(f);
    }
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] % 2 == 0) {
        fuzz_file(data + 1, size - 1);
        return 0;
    }
    const uint8_t *nul = memchr(data + 1, 0, size - 1);
    size_t hlen = nul ? (size_t)(nul - (data + 1)) : size - 1;
    size_t dlen = nul ? size - 1 - hlen - 1 : 0;
    uint8_t *file = malloc(8 + hlen + dlen + 1);
    if (!file)
        return 0;
    for (int b = 0; b < 8; b++)
        file[b] = (uint8_t)((uint64_t)hlen >> (8 * b));
    memcpy(file + 8, data + 1, hlen);
    if (dlen)
        memcpy(file + 8 + hlen, nul + 1, dlen);
    fuzz_file(file, 8 + hlen + dlen);
    free(file);
    return 0;
}
