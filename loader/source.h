/*
 * source.h (private to loader/) - the inputs `pack` reads, behind one
 * interface: every source says its shape, classes and per-split record counts
 * up front, then hands out records by (split, index) in any order from any
 * thread (lookups are read-only after open).
 *
 * Kinds: CIFAR-10/100 binary (directory or any archive libarchive reads),
 * CIFAR-10/100 python pickles (directory or archive), MNIST IDX (plain or
 * gzip), and image folders ROOT/<class>/<file> (optionally with ROOT/train,
 * ROOT/val|test above the class folders), listing the files whose
 * extension torchvision's ImageFolder accepts.
 */
#ifndef RT_LOADER_SOURCE_H
#define RT_LOADER_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "loader/offline.h"

enum rt_item_kind {
    RT_ITEM_PIXELS,    /* `pixels` points at C*H*W CHW bytes owned by the source */
    RT_ITEM_IMAGE_FILE, /* `path` names an image file (imgfile.h) the caller reads */
};

struct rt_item {
    enum rt_item_kind kind;
    int32_t label;
    const uint8_t *pixels;
    const char *path;
};

struct rt_source_info {
    char kind[48];                /* e.g. "cifar10-bin", "mnist-idx", "image-folder" */
    uint32_t channels, height, width;
    uint32_t num_classes;
    char **class_names;           /* num_classes entries */
    uint64_t count[RT_SPLIT_COUNT];
    /* Image folders: height = width = 0 (pack decides the size); files left out of the listing. */
    uint64_t ignored_hidden, ignored_other;
    char ignored_example[128];    /* one ignored name, for the message */
};

struct rt_source;

/*
 * Detects what `input` is and opens it: in-memory formats are read and fully
 * validated here (every label range-checked, every size checked), image
 * folders are listed and their first image probed. Returns 0 or -errno with a
 * message naming the file and what was expected.
 */
int rt_source_open(const char *input, enum rt_label_kind label, struct rt_source **out);

/* Frees the source; NULL is fine. */
void rt_source_close(struct rt_source *s);

const struct rt_source_info *rt_source_info(const struct rt_source *s);

/* Record `index` of `split` (index < count[split]). Thread-safe. */
void rt_source_item(const struct rt_source *s, enum rt_split split, uint64_t index, struct rt_item *it);

/*
 * Parses an IDX file (http://yann.lecun.com/exdb/mnist/ layout): big-endian
 * magic 0x0000 08 <ndims>, ndims u32 sizes, then uint8 data filling the rest
 * exactly. Requires `ndims` dimensions; stores them in `dims` and the data
 * pointer in *data. Returns 0 or -EBADMSG naming `name` and the offset.
 */
int rt_idx_parse(const uint8_t *buf, size_t len, const char *name, uint32_t ndims, uint32_t *dims,
                 const uint8_t **data);

/*
 * Inflates gzip (or zlib) data into a malloc'd buffer of at most `limit`
 * bytes. Returns 0 or -EBADMSG (corrupt, truncated, or larger than `limit`).
 */
int rt_gunzip(const uint8_t *in, size_t len, size_t limit, const char *name, uint8_t **out,
              size_t *out_len);

/* ---- constructors used by rt_source_open() (source_*.c) ---- */

/* Named byte blobs: the files of a directory or the members of an archive. */
struct rt_blob {
    char *name;     /* base name */
    uint8_t *data;
    size_t len;
};

struct rt_blobs {
    struct rt_blob *v;
    size_t n;
    char origin[4096]; /* directory or archive path, for messages */
};

const struct rt_blob *rt_blobs_find(const struct rt_blobs *b, const char *name);

/*
 * Frees what a constructor gathered before it failed: the class names in
 * `info` (NULL entries are fine) and, when given, the per-split arrays.
 */
void rt_source_parts_free(struct rt_source_info *info, uint8_t *pixels[RT_SPLIT_COUNT],
                          int32_t *labels[RT_SPLIT_COUNT]);

/* A source whose records are all in memory (CIFAR, MNIST). Takes `pixels` and `labels`. */
int rt_source_from_memory(struct rt_source **out, const struct rt_source_info *info,
                          uint8_t *pixels[RT_SPLIT_COUNT], int32_t *labels[RT_SPLIT_COUNT]);

/* A source of image files. Takes `paths` (each malloc'd) and `labels`. */
int rt_source_from_files(struct rt_source **out, const struct rt_source_info *info,
                         char **paths[RT_SPLIT_COUNT], int32_t *labels[RT_SPLIT_COUNT]);

int rt_cifar_bin_open(const struct rt_blobs *b, enum rt_label_kind label, struct rt_source **out);
int rt_cifar_py_open(const struct rt_blobs *b, enum rt_label_kind label, struct rt_source **out);
int rt_mnist_open(const char *dir, const struct rt_blobs *b, struct rt_source **out);
int rt_folder_open(const char *root, struct rt_source **out);

#endif
