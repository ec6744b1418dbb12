/*
 * test_util.h - helpers shared by the C tests: temporary directories, file
 * comparison, and reading every record of a packed split back.
 */
#ifndef RT_TESTS_UTIL_H
#define RT_TESTS_UTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "loader/loader.h"

/* malloc that ends the test (exit 1) when memory runs out; n = 0 is one byte. */
static inline void *tu_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* n floats of host memory (tu_xmalloc). */
static inline float *tu_hfloats(size_t n)
{
    return tu_xmalloc(n * sizeof(float));
}

/* CIFAR-10's per-channel mean and standard deviation (0..1 units): the whole-model tests' normalisation. */
static const float TU_CIFAR_MEAN[3] = {0.4914f, 0.4822f, 0.4465f}, TU_CIFAR_STD[3] = {0.2470f, 0.2435f, 0.2616f};

/* A random uint8 batch (n, c, h, w), returned (tu_xmalloc), and n labels below k into labels[n]: the images drawn
 * from r first, then the labels. */
static inline uint8_t *tu_random_batch(struct rt_rng *r, int n, int c, int h, int w, int k, int32_t *labels)
{
    const size_t ni = (size_t)n * c * h * w;
    uint8_t *img = tu_xmalloc(ni);
    for (size_t i = 0; i < ni; i++)
        img[i] = (uint8_t)rt_rng_below(r, 256);
    for (int i = 0; i < n; i++)
        labels[i] = (int32_t)rt_rng_below(r, (uint32_t)k);
    return img;
}

/* mkdtemp under $TMPDIR or /tmp; aborts the test (exit 1) if impossible. */
static inline void tu_tempdir(char *buf, size_t len, const char *tag)
{
    const char *base = getenv("TMPDIR");
    snprintf(buf, len, "%s/rt-%s-XXXXXX", base && *base ? base : "/tmp", tag);
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        exit(1);
    }
}

/* How many entries of `dir` begin with `prefix` ("w.safetensors.tmp-": the temporary
 * files rt_file_write_atomic makes have random suffixes); -1 when dir cannot be read. */
static inline int tu_count_prefixed(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* 1 if the two files exist and have the same bytes. */
static inline int tu_same_file(const char *a, const char *b)
{
    uint8_t *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int same = rt_file_read(a, &x, &nx) == 0 && rt_file_read(b, &y, &ny) == 0 && nx == ny && !memcmp(x, y, nx);
    free(x);
    free(y);
    return same;
}

/*
 * Decodes every record of `split` of the dataset at `dir` into malloc'd
 * arrays (*pixels: records x C*H*W, *labels). Returns the record count or -1.
 */
static inline long tu_read_split(const char *dir, enum rt_split split, uint8_t **pixels, int32_t **labels)
{
    struct rt_dataset *ds;
    struct rt_decoder *dec;
    if (rt_dataset_open(dir, &ds) < 0 || rt_decoder_create(&dec) < 0)
        return -1;
    const struct rt_dataset_info *info = rt_dataset_info(ds);
    const struct rt_split_info *si = &info->split[split];
    const size_t rec = (size_t)info->channels * info->height * info->width;
    long n = (long)si->records, rc = n;
    *pixels = malloc(rec * (size_t)n + 1);
    *labels = malloc(sizeof(int32_t) * (size_t)n + 1);
    for (uint32_t s = 0; s < si->nshards && rc >= 0; s++) {
        char path[4200];
        struct rt_shard *sh;
        snprintf(path, sizeof(path), "%s/%s", dir, si->shards[s].file);
        if (rt_shard_open(path, &sh) < 0) {
            rc = -1;
            break;
        }
        const struct rt_shard_header *h = rt_shard_header(sh);
        const struct rt_block_entry *bl = rt_shard_blocks(sh);
        memcpy(*labels + h->first_record, rt_shard_labels(sh), 4 * h->record_count);
        for (uint32_t b = 0; b < h->block_count && rc >= 0; b++) {
            uint8_t *stored = malloc(bl[b].stored_size);
            if (rt_shard_read_block(sh, b, stored) < 0 ||
                rt_block_decode(dec, h, &bl[b], b, stored,
                                *pixels + rec * (h->first_record + bl[b].first_record), path) < 0)
                rc = -1;
            free(stored);
        }
        rt_shard_close(sh);
    }
    rt_decoder_destroy(dec);
    rt_dataset_close(ds);
    return rc;
}

#endif
