/*
 * source_idx.c - MNIST-style IDX files (MNIST, Fashion-MNIST, KMNIST...):
 * train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-... , plain or
 * gzipped, under either of the two spellings in circulation
 * ("-idx3-ubyte" and ".idx3-ubyte").
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "loader/format.h"
#include "loader/source.h"

/* Largest decompressed IDX file accepted (4 GiB: far above any MNIST-like set). */
#define IDX_LIMIT ((size_t)1 << 32)

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int rt_idx_parse(const uint8_t *buf, size_t len, const char *name, uint32_t ndims, uint32_t *dims,
                 const uint8_t **data)
{
    uint64_t total = 1;
    size_t hdr = 4 + 4 * (size_t)ndims;

    if (len < 4)
        return rt_errf(-EBADMSG, "%s: truncated: %zu bytes, an IDX header needs 4", name, len);
    if (buf[0] != 0 || buf[1] != 0)
        return rt_errf(-EBADMSG, "%s: offset 0: bad IDX magic %02x%02x%02x%02x (expected 0000 08 %02x)", name,
                       buf[0], buf[1], buf[2], buf[3], ndims);
    if (buf[2] != 0x08)
        return rt_errf(-EBADMSG, "%s: offset 2: IDX element type 0x%02x, only unsigned bytes (0x08) are supported",
                       name, buf[2]);
    if (buf[3] != ndims)
        return rt_errf(-EBADMSG, "%s: offset 3: %u dimensions, expected %" PRIu32 " (%s)", name, buf[3], ndims,
                       ndims == 1 ? "a label file" : "an image file");
    if (len < hdr)
        return rt_errf(-EBADMSG, "%s: truncated IDX header: %zu bytes, expected %zu", name, len, hdr);
    for (uint32_t i = 0; i < ndims; i++) {
        dims[i] = be32(buf + 4 + 4 * i);
        if (dims[i] == 0)
            return rt_errf(-EBADMSG, "%s: offset %u: dimension %" PRIu32 " is 0", name, 4 + 4 * i, i);
        if (i > 0 && dims[i] > RT_MAX_DIM)
            return rt_errf(-EBADMSG, "%s: offset %u: dimension %" PRIu32 " = %" PRIu32 " is too large", name,
                           4 + 4 * i, i, dims[i]);
        total *= dims[i];
    }
    if (total != len - hdr)
        return rt_errf(-EBADMSG, "%s: %zu data bytes after the header, the dimensions need %" PRIu64 "%s", name,
                       len - hdr, total, len - hdr < total ? " (truncated)" : "");
    *data = buf + hdr;
    return 0;
}

/* Finds and (if gzipped) inflates one of the four files; *owned is what to free. */
static int load_idx(const char *dir, const struct rt_blobs *b, const char *stem, const char *kind,
                    uint8_t **owned, const uint8_t **buf, size_t *len, char *name, size_t name_len)
{
    char dash[64], dot[64];
    const char *cands[4];
    const struct rt_blob *blob = NULL;

    snprintf(dash, sizeof(dash), "%s-%s", stem, kind);
    snprintf(dot, sizeof(dot), "%s.%s", stem, kind);
    char dash_gz[70], dot_gz[70];
    snprintf(dash_gz, sizeof(dash_gz), "%s.gz", dash);
    snprintf(dot_gz, sizeof(dot_gz), "%s.gz", dot);
    cands[0] = dash;
    cands[1] = dash_gz;
    cands[2] = dot;
    cands[3] = dot_gz;
    for (int i = 0; i < 4 && !blob; i++) {
        blob = rt_blobs_find(b, cands[i]);
        if (blob)
            snprintf(name, name_len, "%s/%s", b->origin, cands[i]);
    }
    *owned = NULL;
    if (!blob)
        return rt_errf(-ENOENT, "%s: %s missing (MNIST needs train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                       "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, plain or .gz)",
                       dir, dash);
    if (blob->len >= 2 && blob->data[0] == 0x1f && blob->data[1] == 0x8b) {
        int rc = rt_gunzip(blob->data, blob->len, IDX_LIMIT, name, owned, len);
        if (rc < 0)
            return rc;
        *buf = *owned;
        return 0;
    }
    *buf = blob->data;
    *len = blob->len;
    return 0;
}

/* Loads images + labels of one split into freshly allocated arrays. */
static int load_split(const char *dir, const struct rt_blobs *b, const char *stem,
                      struct rt_source_info *info, uint8_t **pixels, int32_t **labels, uint64_t *count,
                      uint32_t *max_label)
{
    uint8_t *img_owned = NULL, *lab_owned = NULL;
    const uint8_t *img_buf = NULL, *lab_buf = NULL, *img = NULL, *lab = NULL;
    size_t img_len = 0, lab_len = 0;
    uint32_t idims[3] = {0}, ldims[1] = {0};
    char img_name[4200], lab_name[4200];
    int rc;

    rc = load_idx(dir, b, stem, "images-idx3-ubyte", &img_owned, &img_buf, &img_len, img_name,
                  sizeof(img_name));
    if (rc < 0)
        goto out;
    rc = load_idx(dir, b, stem, "labels-idx1-ubyte", &lab_owned, &lab_buf, &lab_len, lab_name,
                  sizeof(lab_name));
    if (rc < 0)
        goto out;
    if ((rc = rt_idx_parse(img_buf, img_len, img_name, 3, idims, &img)) < 0 ||
        (rc = rt_idx_parse(lab_buf, lab_len, lab_name, 1, ldims, &lab)) < 0)
        goto out;
    if (idims[0] != ldims[0]) {
        rc = rt_errf(-EBADMSG, "%s holds %" PRIu32 " images but %s holds %" PRIu32 " labels", img_name, idims[0],
                     lab_name, ldims[0]);
        goto out;
    }
    if (info->height && (idims[1] != info->height || idims[2] != info->width)) {
        rc = rt_errf(-EBADMSG, "%s: images are %" PRIu32 "x%" PRIu32 ", the training images are %" PRIu32
                     "x%" PRIu32, img_name, idims[1], idims[2], info->height, info->width);
        goto out;
    }
    info->channels = 1;
    info->height = idims[1];
    info->width = idims[2];
    *count = idims[0];
    *pixels = rt_malloc((size_t)idims[0] * idims[1] * idims[2], img_name);
    *labels = rt_malloc((size_t)idims[0] * sizeof(int32_t), lab_name);
    if (!*pixels || !*labels) {
        rc = -ENOMEM;
        goto out;
    }
    memcpy(*pixels, img, (size_t)idims[0] * idims[1] * idims[2]);
    for (uint32_t i = 0; i < idims[0]; i++) {
        (*labels)[i] = lab[i];
        *max_label = RT_MAX(*max_label, lab[i]);
    }
out:
    free(img_owned);
    free(lab_owned);
    return rc;
}

int rt_mnist_open(const char *dir, const struct rt_blobs *b, struct rt_source **out)
{
    struct rt_source_info info = {0};
    uint8_t *pixels[RT_SPLIT_COUNT] = {0};
    int32_t *labels[RT_SPLIT_COUNT] = {0};
    uint32_t max_label = 0;
    int rc;

    snprintf(info.kind, sizeof(info.kind), "mnist-idx");
    rc = load_split(dir, b, "train", &info, &pixels[RT_SPLIT_TRAIN], &labels[RT_SPLIT_TRAIN],
                    &info.count[RT_SPLIT_TRAIN], &max_label);
    if (rc == 0)
        rc = load_split(dir, b, "t10k", &info, &pixels[RT_SPLIT_TEST], &labels[RT_SPLIT_TEST],
                        &info.count[RT_SPLIT_TEST], &max_label);
    if (rc < 0)
        goto err;
    /* IDX files carry no class count: MNIST-likes have 10, EMNIST splits more. */
    info.num_classes = RT_MAX(10u, max_label + 1);
    info.class_names = rt_calloc(info.num_classes, sizeof(char *), "class names");
    if (!info.class_names) {
        rc = -ENOMEM;
        goto err;
    }
    for (uint32_t c = 0; c < info.num_classes; c++) {
        char buf[16];
        snprintf(buf, sizeof(buf), "%" PRIu32, c);
        if (!(info.class_names[c] = strdup(buf))) {
            rc = rt_errf(-ENOMEM, "out of memory");
            goto err;
        }
    }
    return rt_source_from_memory(out, &info, pixels, labels);
err:
    rt_source_parts_free(&info, pixels, labels);
    return rc;
}
