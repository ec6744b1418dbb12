/*
 * source_cifar.c - CIFAR-10 and CIFAR-100 as distributed: the binary
 * version (records of label byte(s) + 3072 bytes of R, G, B planes) and the
 * python version (pickled dicts, parsed by pickle.c without executing
 * anything). Every record's size and label range is checked here, so pack
 * never sees a bad record.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "loader/pickle.h"
#include "loader/source.h"

#define CIFAR_PIXELS 3072u

/* Fills info's geometry and takes `names` (or makes "class_<i>" names). */
static int set_classes(struct rt_source_info *info, uint32_t n, char **names)
{
    info->channels = 3;
    info->height = 32;
    info->width = 32;
    info->num_classes = n;
    info->class_names = rt_calloc(n, sizeof(char *), "class names");
    if (!info->class_names)
        return -ENOMEM;
    for (uint32_t c = 0; c < n; c++) {
        char buf[32];
        snprintf(buf, sizeof(buf), "class_%" PRIu32, c);
        info->class_names[c] = strdup(names && names[c] ? names[c] : buf);
        if (!info->class_names[c])
            return rt_errf(-ENOMEM, "out of memory");
    }
    return 0;
}

static void free_names(char **names, size_t n)
{
    if (!names)
        return;
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* Splits a names file into non-empty trimmed lines; needs at least `want`. */
static int read_names(const struct rt_blobs *b, const char *file, size_t want, char ***out)
{
    const struct rt_blob *blob = rt_blobs_find(b, file);
    char **names;
    size_t n = 0, i = 0;

    *out = NULL;
    if (!blob) {
        rt_warn("%s: no %s; classes will be named class_0, class_1, ...", b->origin, file);
        return 0;
    }
    names = rt_calloc(want, sizeof(char *), "class names");
    if (!names)
        return -ENOMEM;
    while (i < blob->len && n < want) {
        size_t start = i;
        while (i < blob->len && blob->data[i] != '\n')
            i++;
        size_t end = i++;
        while (end > start && (blob->data[end - 1] == '\r' || blob->data[end - 1] == ' '))
            end--;
        if (end == start)
            continue;
        names[n] = strndup((const char *)blob->data + start, end - start);
        if (!names[n++]) {
            free_names(names, want);
            return rt_errf(-ENOMEM, "out of memory");
        }
    }
    if (n < want) {
        free_names(names, want);
        return rt_errf(-EBADMSG, "%s/%s: %zu class names, expected %zu", b->origin, file, n, want);
    }
    *out = names;
    return 0;
}

/*
 * Appends the records of one binary batch file to pixels/labels.
 * `label_bytes` is 1 (CIFAR-10) or 2 (CIFAR-100: coarse, fine).
 */
static int parse_bin(const struct rt_blobs *b, const char *file, unsigned label_bytes, unsigned which,
                     const uint32_t *limits, uint8_t **pixels, int32_t **labels, uint64_t *count)
{
    const struct rt_blob *blob = rt_blobs_find(b, file);
    const size_t rec = label_bytes + CIFAR_PIXELS;
    uint64_t n;

    if (!blob)
        return rt_errf(-ENOENT, "%s/%s: missing", b->origin, file);
    if (blob->len == 0 || blob->len % rec != 0)
        return rt_errf(-EBADMSG, "%s/%s: %zu bytes is not a whole number of %zu-byte records "
                       "(record %zu is cut short at offset %zu): truncated or not a CIFAR-%s file",
                       b->origin, file, blob->len, rec, blob->len / rec, blob->len / rec * rec,
                       label_bytes == 1 ? "10" : "100");
    n = blob->len / rec;
    uint8_t *px = rt_realloc(*pixels, (*count + n) * CIFAR_PIXELS, "CIFAR pixels");
    if (!px)
        return -ENOMEM;
    *pixels = px;
    int32_t *lb = rt_realloc(*labels, (*count + n) * sizeof(int32_t), "CIFAR labels");
    if (!lb)
        return -ENOMEM;
    *labels = lb;
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *r = blob->data + i * rec;
        for (unsigned k = 0; k < label_bytes; k++)
            if (r[k] >= limits[k])
                return rt_errf(-EBADMSG, "%s/%s: record %" PRIu64 " (offset %" PRIu64 "): %s label %u out of "
                               "range [0, %" PRIu32 ")",
                               b->origin, file, i, i * rec + k,
                               label_bytes == 1 ? "class" : (k == 0 ? "coarse" : "fine"), r[k], limits[k]);
        lb[*count + i] = r[which];
        memcpy(px + (*count + i) * CIFAR_PIXELS, r + label_bytes, CIFAR_PIXELS);
    }
    *count += n;
    return 0;
}

int rt_cifar_bin_open(const struct rt_blobs *b, enum rt_label_kind label, struct rt_source **out)
{
    struct rt_source_info info = {0};
    uint8_t *pixels[RT_SPLIT_COUNT] = {0};
    int32_t *labels[RT_SPLIT_COUNT] = {0};
    char **names = NULL;
    int c100 = rt_blobs_find(b, "train.bin") != NULL;
    int rc;

    if (c100) {
        static const uint32_t lim[2] = {20, 100};
        unsigned which = label == RT_LABEL_COARSE ? 0 : 1;
        snprintf(info.kind, sizeof(info.kind), "cifar100-bin");
        if ((rc = parse_bin(b, "train.bin", 2, which, lim, &pixels[RT_SPLIT_TRAIN], &labels[RT_SPLIT_TRAIN],
                            &info.count[RT_SPLIT_TRAIN])) < 0 ||
            (rc = parse_bin(b, "test.bin", 2, which, lim, &pixels[RT_SPLIT_TEST], &labels[RT_SPLIT_TEST],
                            &info.count[RT_SPLIT_TEST])) < 0)
            goto err;
        rc = read_names(b, which ? "fine_label_names.txt" : "coarse_label_names.txt", lim[which], &names);
        if (rc == 0)
            rc = set_classes(&info, lim[which], names);
        free_names(names, lim[which]);
    } else {
        static const uint32_t lim[1] = {10};
        if (label == RT_LABEL_COARSE) {
            rc = rt_errf(-EINVAL, "%s: --label coarse applies to CIFAR-100 only", b->origin);
            goto err;
        }
        snprintf(info.kind, sizeof(info.kind), "cifar10-bin");
        for (int i = 1; i <= 5; i++) {
            char file[32];
            snprintf(file, sizeof(file), "data_batch_%d.bin", i);
            rc = parse_bin(b, file, 1, 0, lim, &pixels[RT_SPLIT_TRAIN], &labels[RT_SPLIT_TRAIN],
                           &info.count[RT_SPLIT_TRAIN]);
            if (rc < 0) {
                if (rc == -ENOENT)
                    rt_errf(rc, "%s/%s: missing (CIFAR-10 has data_batch_1..5.bin and test_batch.bin)",
                            b->origin, file);
                goto err;
            }
        }
        rc = parse_bin(b, "test_batch.bin", 1, 0, lim, &pixels[RT_SPLIT_TEST], &labels[RT_SPLIT_TEST],
                       &info.count[RT_SPLIT_TEST]);
        if (rc < 0)
            goto err;
        rc = read_names(b, "batches.meta.txt", 10, &names);
        if (rc == 0)
            rc = set_classes(&info, 10, names);
        free_names(names, 10);
    }
    if (rc < 0)
        goto err;
    return rt_source_from_memory(out, &info, pixels, labels);
err:
    rt_source_parts_free(&info, pixels, labels);
    return rc;
}

/* Appends one python batch; picks fine or coarse labels. */
static int add_py_batch(const struct rt_blobs *b, const char *file, int want_coarse, uint32_t limit,
                        uint8_t **pixels, int32_t **labels, uint64_t *count)
{
    const struct rt_blob *blob = rt_blobs_find(b, file);
    struct rt_cifar_py_batch batch = {0};
    char name[4200];
    int rc;

    snprintf(name, sizeof(name), "%s/%s", b->origin, file);
    if (!blob)
        return rt_errf(-ENOENT, "%s: missing", name);
    rc = rt_pickle_cifar_batch(blob->data, blob->len, name, &batch);
    if (rc < 0)
        return rc;
    const int32_t *src = want_coarse ? batch.coarse : batch.labels;
    if (!src) {
        rc = rt_errf(-EBADMSG, "%s: no coarse_labels (is this CIFAR-100?)", name);
        goto out;
    }
    uint8_t *px = rt_realloc(*pixels, (*count + batch.n) * CIFAR_PIXELS, "CIFAR pixels");
    if (!px) {
        rc = -ENOMEM;
        goto out;
    }
    *pixels = px;
    int32_t *lb = rt_realloc(*labels, (*count + batch.n) * sizeof(int32_t), "CIFAR labels");
    if (!lb) {
        rc = -ENOMEM;
        goto out;
    }
    *labels = lb;
    for (uint64_t i = 0; i < batch.n; i++) {
        if (src[i] < 0 || (uint32_t)src[i] >= limit) {
            rc = rt_errf(-EBADMSG, "%s: record %" PRIu64 ": label %" PRId32 " out of range [0, %" PRIu32 ")", name,
                         i, src[i], limit);
            goto out;
        }
        lb[*count + i] = src[i];
    }
    memcpy(px + *count * CIFAR_PIXELS, batch.data, batch.n * CIFAR_PIXELS);
    *count += batch.n;
out:
    rt_pickle_cifar_batch_free(&batch);
    return rc;
}

int rt_cifar_py_open(const struct rt_blobs *b, enum rt_label_kind label, struct rt_source **out)
{
    struct rt_source_info info = {0};
    struct rt_cifar_py_meta meta = {0};
    uint8_t *pixels[RT_SPLIT_COUNT] = {0};
    int32_t *labels[RT_SPLIT_COUNT] = {0};
    int c100 = rt_blobs_find(b, "data_batch_1") == NULL;
    int coarse = label == RT_LABEL_COARSE;
    uint32_t nclass = c100 ? (coarse ? 20 : 100) : 10;
    const char *meta_file = c100 ? "meta" : "batches.meta";
    const struct rt_blob *mb = rt_blobs_find(b, meta_file);
    char name[4200];
    int rc = 0;

    if (coarse && !c100)
        return rt_errf(-EINVAL, "%s: --label coarse applies to CIFAR-100 only", b->origin);
    snprintf(info.kind, sizeof(info.kind), c100 ? "cifar100-python" : "cifar10-python");
    if (c100) {
        if ((rc = add_py_batch(b, "train", coarse, nclass, &pixels[RT_SPLIT_TRAIN], &labels[RT_SPLIT_TRAIN],
                               &info.count[RT_SPLIT_TRAIN])) < 0 ||
            (rc = add_py_batch(b, "test", coarse, nclass, &pixels[RT_SPLIT_TEST], &labels[RT_SPLIT_TEST],
                               &info.count[RT_SPLIT_TEST])) < 0)
            goto err;
    } else {
        for (int i = 1; i <= 5 && rc == 0; i++) {
            char file[32];
            snprintf(file, sizeof(file), "data_batch_%d", i);
            rc = add_py_batch(b, file, 0, nclass, &pixels[RT_SPLIT_TRAIN], &labels[RT_SPLIT_TRAIN],
                              &info.count[RT_SPLIT_TRAIN]);
        }
        if (rc == 0)
            rc = add_py_batch(b, "test_batch", 0, nclass, &pixels[RT_SPLIT_TEST], &labels[RT_SPLIT_TEST],
                              &info.count[RT_SPLIT_TEST]);
        if (rc < 0)
            goto err;
    }
    char **names = NULL;
    if (mb) {
        snprintf(name, sizeof(name), "%s/%s", b->origin, meta_file);
        rc = rt_pickle_cifar_meta(mb->data, mb->len, name, &meta);
        if (rc < 0)
            goto err;
        names = coarse ? meta.coarse_names : meta.names;
        size_t have = coarse ? meta.ncoarse : meta.n;
        if (!names || have != nclass) {
            rc = rt_errf(-EBADMSG, "%s: %zu %s class names, expected %" PRIu32, name, names ? have : 0,
                         coarse ? "coarse" : "", nclass);
            goto err;
        }
    } else {
        rt_warn("%s: no %s; classes will be named class_0, class_1, ...", b->origin, meta_file);
    }
    rc = set_classes(&info, nclass, names);
    if (rc < 0)
        goto err;
    rt_pickle_cifar_meta_free(&meta);
    return rt_source_from_memory(out, &info, pixels, labels);
err:
    rt_pickle_cifar_meta_free(&meta);
    rt_source_parts_free(&info, pixels, labels);
    return rc;
}
