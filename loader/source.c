/*
 * source.c - the source object shared by every input kind, and detection:
 * given the path the user passed to `pack`, decide which kind it is (CIFAR
 * binary or python, MNIST IDX, image folder; directory or archive) and open
 * it. Archives are read through libarchive (tar, tar.gz, zip, ...), gzip
 * through zlib.
 */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "common/common.h"
#include "loader/source.h"

struct rt_source {
    struct rt_source_info info;
    uint8_t *pixels[RT_SPLIT_COUNT]; /* in-memory sources */
    char **paths[RT_SPLIT_COUNT];    /* file sources */
    int32_t *labels[RT_SPLIT_COUNT];
};

/* Every file name any in-memory source reads; nothing else is loaded. */
static const char *const known_names[] = {
    "data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin",
    "test_batch.bin", "batches.meta.txt", "train.bin", "test.bin", "fine_label_names.txt",
    "coarse_label_names.txt", "data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4",
    "data_batch_5", "test_batch", "batches.meta", "train", "test", "meta",
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte", "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", "train-images.idx3-ubyte",
    "train-labels.idx1-ubyte", "t10k-images.idx3-ubyte", "t10k-labels.idx1-ubyte",
};

/* Directories the distributions unpack to, tried below the path given. */
static const char *const known_subdirs[] = {
    "cifar-10-batches-bin", "cifar-100-binary", "cifar-10-batches-py", "cifar-100-python", "MNIST/raw",
    "raw",
};

static int is_known_name(const char *name)
{
    for (size_t i = 0; i < RT_ARRAY_LEN(known_names); i++)
        if (strcmp(name, known_names[i]) == 0)
            return 1;
    return 0;
}

/* ---- the source object ------------------------------------------------------ */

void rt_source_parts_free(struct rt_source_info *info, uint8_t *pixels[RT_SPLIT_COUNT],
                          int32_t *labels[RT_SPLIT_COUNT])
{
    if (info->class_names)
        for (uint32_t c = 0; c < info->num_classes; c++)
            free(info->class_names[c]);
    free(info->class_names);
    info->class_names = NULL;
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++) {
        if (pixels) {
            free(pixels[sp]);
            pixels[sp] = NULL;
        }
        if (labels) {
            free(labels[sp]);
            labels[sp] = NULL;
        }
    }
}

void rt_source_close(struct rt_source *s)
{
    if (!s)
        return;
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++) {
        free(s->pixels[sp]);
        if (s->paths[sp])
            for (uint64_t i = 0; i < s->info.count[sp]; i++)
                free(s->paths[sp][i]);
        free(s->paths[sp]);
        free(s->labels[sp]);
    }
    rt_source_parts_free(&s->info, NULL, NULL);
    free(s);
}

const struct rt_source_info *rt_source_info(const struct rt_source *s) { return &s->info; }

void rt_source_item(const struct rt_source *s, enum rt_split split, uint64_t index, struct rt_item *it)
{
    it->label = s->labels[split][index];
    if (s->pixels[split] || !s->paths[split]) {
        it->kind = RT_ITEM_PIXELS;
        it->pixels = s->pixels[split] + index * ((uint64_t)s->info.channels * s->info.height * s->info.width);
        it->path = NULL;
    } else {
        it->kind = RT_ITEM_IMAGE_FILE;
        it->pixels = NULL;
        it->path = s->paths[split][index];
    }
}

static struct rt_source *source_new(const struct rt_source_info *info)
{
    struct rt_source *s = rt_calloc(1, sizeof(*s), "source");
    if (s)
        s->info = *info;
    return s;
}

int rt_source_from_memory(struct rt_source **out, const struct rt_source_info *info,
                          uint8_t *pixels[RT_SPLIT_COUNT], int32_t *labels[RT_SPLIT_COUNT])
{
    struct rt_source *s = source_new(info);
    if (!s)
        return -ENOMEM;
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++) {
        s->pixels[sp] = pixels[sp];
        s->labels[sp] = labels[sp];
    }
    *out = s;
    return 0;
}

int rt_source_from_files(struct rt_source **out, const struct rt_source_info *info,
                         char **paths[RT_SPLIT_COUNT], int32_t *labels[RT_SPLIT_COUNT])
{
    struct rt_source *s = source_new(info);
    if (!s)
        return -ENOMEM;
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++) {
        s->paths[sp] = paths[sp];
        s->labels[sp] = labels[sp];
    }
    *out = s;
    return 0;
}

/* ---- blobs: named files from a directory or an archive --------------------- */

const struct rt_blob *rt_blobs_find(const struct rt_blobs *b, const char *name)
{
    for (size_t i = 0; i < b->n; i++)
        if (strcmp(b->v[i].name, name) == 0)
            return &b->v[i];
    return NULL;
}

static void blobs_free(struct rt_blobs *b)
{
    for (size_t i = 0; i < b->n; i++) {
        free(b->v[i].name);
        free(b->v[i].data);
    }
    free(b->v);
    b->v = NULL;
    b->n = 0;
}

static int blobs_add(struct rt_blobs *b, const char *name, uint8_t *data, size_t len)
{
    struct rt_blob *v = rt_realloc(b->v, (b->n + 1) * sizeof(*v), "file list");
    if (!v)
        return -ENOMEM;
    b->v = v;
    v[b->n].name = strdup(name);
    if (!v[b->n].name)
        return rt_errf(-ENOMEM, "out of memory");
    v[b->n].data = data;
    v[b->n].len = len;
    b->n++;
    return 0;
}

/* Loads the known files present in `dir`. */
static int blobs_from_dir(const char *dir, struct rt_blobs *b)
{
    snprintf(b->origin, sizeof(b->origin), "%s", dir);
    for (size_t i = 0; i < RT_ARRAY_LEN(known_names); i++) {
        char path[4096];
        struct stat st;
        uint8_t *data;
        size_t len;
        int rc;

        snprintf(path, sizeof(path), "%s/%s", dir, known_names[i]);
        if (stat(path, &st) < 0 || !S_ISREG(st.st_mode))
            continue;
        rc = rt_file_read(path, &data, &len);
        if (rc < 0)
            return rc;
        rc = blobs_add(b, known_names[i], data, len);
        if (rc < 0) {
            free(data);
            return rc;
        }
    }
    return 0;
}

/* Reads the known members of an archive (any format and filter libarchive knows). */
static int blobs_from_archive(const char *path, struct rt_blobs *b)
{
    struct archive *a = archive_read_new();
    struct archive_entry *ent;
    int rc = 0, r;

    snprintf(b->origin, sizeof(b->origin), "%s", path);
    if (!a)
        return rt_errf(-ENOMEM, "out of memory");
    archive_read_support_filter_all(a);
    archive_read_support_format_all(a);
    if (archive_read_open_filename(a, path, 1 << 20) != ARCHIVE_OK) {
        rc = rt_errf(-EBADMSG, "%s: cannot read as an archive: %s", path, archive_error_string(a));
        goto out;
    }
    while ((r = archive_read_next_header(a, &ent)) == ARCHIVE_OK) {
        const char *full = archive_entry_pathname(ent);
        const char *base = full ? strrchr(full, '/') : NULL;
        base = base ? base + 1 : full;
        if (!base || archive_entry_filetype(ent) != AE_IFREG || !is_known_name(base))
            continue;
        int64_t size = archive_entry_size_is_set(ent) ? archive_entry_size(ent) : -1;
        if (size < 0 || size > ((int64_t)1 << 32)) {
            rc = rt_errf(-EBADMSG, "%s: member %s: unusable size %lld", path, full, (long long)size);
            goto out;
        }
        uint8_t *data = rt_malloc((size_t)size + 1, full);
        if (!data) {
            rc = -ENOMEM;
            goto out;
        }
        la_ssize_t got = archive_read_data(a, data, (size_t)size);
        if (got != size) {
            free(data);
            rc = rt_errf(-EBADMSG, "%s: member %s: truncated or corrupt (%lld of %lld bytes read): %s", path,
                         full, (long long)got, (long long)size,
                         got < 0 ? archive_error_string(a) : "archive ends early");
            goto out;
        }
        if (rt_blobs_find(b, base)) {
            free(data);
            rc = rt_errf(-EBADMSG, "%s: holds %s twice; pack one dataset per archive", path, base);
            goto out;
        }
        if ((rc = blobs_add(b, base, data, (size_t)size)) < 0) {
            free(data);
            goto out;
        }
    }
    if (r != ARCHIVE_EOF)
        rc = rt_errf(-EBADMSG, "%s: corrupt or truncated archive: %s", path, archive_error_string(a));
out:
    archive_read_free(a);
    return rc;
}

/* ---- detection ------------------------------------------------------------------ */

enum kind { K_NONE, K_CIFAR_BIN, K_CIFAR_PY, K_MNIST };

static int exists_in(const char *dir, const char *name)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

static enum kind kind_of_dir(const char *dir)
{
    if (exists_in(dir, "data_batch_1.bin") || exists_in(dir, "train.bin"))
        return K_CIFAR_BIN;
    if (exists_in(dir, "data_batch_1") || (exists_in(dir, "train") && exists_in(dir, "meta")))
        return K_CIFAR_PY;
    if (exists_in(dir, "train-images-idx3-ubyte") || exists_in(dir, "train-images-idx3-ubyte.gz") ||
        exists_in(dir, "train-images.idx3-ubyte") || exists_in(dir, "t10k-images-idx3-ubyte") ||
        exists_in(dir, "t10k-images-idx3-ubyte.gz"))
        return K_MNIST;
    return K_NONE;
}

static enum kind kind_of_blobs(const struct rt_blobs *b)
{
    if (rt_blobs_find(b, "data_batch_1.bin") || rt_blobs_find(b, "train.bin"))
        return K_CIFAR_BIN;
    if (rt_blobs_find(b, "data_batch_1") || (rt_blobs_find(b, "train") && rt_blobs_find(b, "meta")))
        return K_CIFAR_PY;
    for (size_t i = 0; i < b->n; i++)
        if (strstr(b->v[i].name, "idx3-ubyte"))
            return K_MNIST;
    return K_NONE;
}

static int open_blobs(enum kind k, const char *dir, const struct rt_blobs *b, enum rt_label_kind label,
                      struct rt_source **out)
{
    switch (k) {
    case K_CIFAR_BIN: return rt_cifar_bin_open(b, label, out);
    case K_CIFAR_PY: return rt_cifar_py_open(b, label, out);
    case K_MNIST: return rt_mnist_open(dir, b, out);
    case K_NONE: break;
    }
    return rt_errf(-EINVAL, "internal: no source kind");
}

int rt_source_open(const char *input, enum rt_label_kind label, struct rt_source **out)
{
    struct rt_blobs blobs = {0};
    struct stat st;
    char dir[4096] = "";
    enum kind k = K_NONE;
    int rc, found = 0;

    if (stat(input, &st) < 0)
        return rt_errf(-errno, "%s: cannot read input: %s", input, strerror(errno));
    if (S_ISREG(st.st_mode)) {
        rc = blobs_from_archive(input, &blobs);
        if (rc == 0 && (k = kind_of_blobs(&blobs)) == K_NONE)
            rc = rt_errf(-EINVAL, "%s: no CIFAR-10/100 (binary or python) or MNIST files inside this archive",
                         input);
        if (rc == 0)
            rc = open_blobs(k, input, &blobs, label, out);
        blobs_free(&blobs);
        return rc;
    }
    if (!S_ISDIR(st.st_mode))
        return rt_errf(-EINVAL, "%s: neither a directory nor an archive", input);

    k = kind_of_dir(input);
    if (k != K_NONE) {
        snprintf(dir, sizeof(dir), "%s", input);
        found = 1;
    }
    for (size_t i = 0; i < RT_ARRAY_LEN(known_subdirs); i++) {
        char sub[4096];
        snprintf(sub, sizeof(sub), "%s/%s", input, known_subdirs[i]);
        enum kind ks = kind_of_dir(sub);
        if (ks == K_NONE)
            continue;
        if (found && strcmp(dir, input) != 0)
            return rt_errf(-EINVAL, "%s: holds more than one dataset (%s and %s); name the one to pack", input,
                           dir, sub);
        if (!found) {
            snprintf(dir, sizeof(dir), "%s", sub);
            k = ks;
            found = 1;
        }
    }
    if (!found)
        return rt_folder_open(input, out);
    rc = blobs_from_dir(dir, &blobs);
    if (rc == 0)
        rc = open_blobs(k, dir, &blobs, label, out);
    blobs_free(&blobs);
    return rc;
}

/* ---- gzip ------------------------------------------------------------------------ */

int rt_gunzip(const uint8_t *in, size_t len, size_t limit, const char *name, uint8_t **out, size_t *out_len)
{
    z_stream zs;
    size_t cap = len * 4 + 1024, used = 0;
    uint8_t *buf;
    int zrc;

    memset(&zs, 0, sizeof(zs));
    if (inflateInit2(&zs, 15 + 32) != Z_OK)
        return rt_errf(-ENOMEM, "%s: cannot start zlib", name);
    cap = RT_MIN(cap, limit + 1);
    buf = rt_malloc(cap, name);
    if (!buf) {
        inflateEnd(&zs);
        return -ENOMEM;
    }
    zs.next_in = (Bytef *)in;
    zs.avail_in = (uInt)RT_MIN(len, (size_t)UINT32_MAX);
    for (;;) {
        if (used == cap) {
            if (cap > limit) {
                free(buf);
                inflateEnd(&zs);
                return rt_errf(-EBADMSG, "%s: decompresses to more than %zu bytes", name, limit);
            }
            size_t ncap = RT_MIN(cap * 2, limit + 1);
            uint8_t *nb = rt_realloc(buf, ncap, name);
            if (!nb) {
                free(buf);
                inflateEnd(&zs);
                return -ENOMEM;
            }
            buf = nb;
            cap = ncap;
        }
        zs.next_out = buf + used;
        zs.avail_out = (uInt)RT_MIN(cap - used, (size_t)UINT32_MAX);
        zrc = inflate(&zs, Z_NO_FLUSH);
        used = cap - zs.avail_out;
        if (zrc == Z_STREAM_END)
            break;
        if (zrc != Z_OK && !(zrc == Z_BUF_ERROR && zs.avail_out == 0)) {
            int rc = rt_errf(-EBADMSG, "%s: corrupt or truncated gzip data at input offset %lu: %s", name,
                             zs.total_in, zs.msg ? zs.msg : (zrc == Z_BUF_ERROR ? "unexpected end" : "error"));
            free(buf);
            inflateEnd(&zs);
            return rc;
        }
    }
    if (used > limit) {
        free(buf);
        inflateEnd(&zs);
        return rt_errf(-EBADMSG, "%s: decompresses to more than %zu bytes", name, limit);
    }
    inflateEnd(&zs);
    *out = buf;
    *out_len = used;
    return 0;
}
