/*
 * cdataset.c - CDataset, random access to the records of one split of a
 * packed dataset, for torch.utils.data.DataLoader: get(i) finds the shard
 * and block holding record i, reads and decodes that block (checksum
 * first), and keeps the last decoded block, so reading in order decodes each
 * block once.
 *
 * DataLoader workers fork after the dataset was made: each process opens its
 * own shards and decoder, on its first get() after a fork (getpid() changed),
 * and a lock another thread held at the fork is made afresh in the child.
 *
 * Records of fixed-size datasets are the manifest's C x H x W (jpeg
 * included): the cache holds the block decoded. Variable-size JPEG records
 * (pack --max-side) come whole at their own size, with no crop or resize:
 * the cache holds the block's checked JPEG payload (rt_block_payload), and
 * each get() decodes its one record (rt_jpeg_record_decode).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "python/src/ext.h"

PyTypeObject *ext_dataset_type;

struct cdataset {
    PyObject_HEAD
    char *path;
    enum rt_split split;
    struct rt_dataset *ds;
    const struct rt_dataset_info *info;
    const struct rt_split_info *si;
    size_t rec_bytes;            /* C * H * W; 0 for variable-size records */
    int variable;                /* records of their own sizes (info height 0) */
    /* Per process (made again after a fork), guarded by mu. */
    pid_t pid;
    pthread_mutex_t mu;
    struct rt_shard **shards;    /* si->nshards, opened on first use */
    struct rt_decoder *dec;
    uint8_t *stored, *decoded;   /* a block's stored bytes; its decoded records (variable: its JPEG payload) */
    size_t stored_cap, decoded_cap;
    int64_t cache_shard;         /* the block in `decoded`, or -1 */
    uint32_t cache_block;
};

/* Drops the per-process state: the shards, the decoder and the cached block (kept buffers are reused). */
static void drop_process_state(struct cdataset *self)
{
    for (uint32_t i = 0; self->shards && i < self->si->nshards; i++) {
        rt_shard_close(self->shards[i]);
        self->shards[i] = NULL;
    }
    rt_decoder_destroy(self->dec);
    self->dec = NULL;
    self->cache_shard = -1;
}

static void cdataset_dealloc(PyObject *op)
{
    struct cdataset *self = (struct cdataset *)op;
    if (self->ds) {
        drop_process_state(self);
        pthread_mutex_destroy(&self->mu);
    }
    free(self->shards);
    free(self->stored);
    free(self->decoded);
    rt_dataset_close(self->ds);
    free(self->path);
    ext_free(op);
}

static PyObject *cdataset_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "split", NULL};
    const char *path, *split_s = "train";
    enum rt_split split;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|s:CDataset", kwlist, &path, &split_s) ||
        ext_split(split_s, &split) < 0)
        return NULL;
    struct rt_dataset *ds = NULL;
    if (ext_dataset_open(path, &ds) < 0)
        return NULL;
    struct cdataset *self = (struct cdataset *)ext_alloc(tp);
    if (!self) {
        rt_dataset_close(ds);
        return NULL;
    }
    self->ds = ds;
    pthread_mutex_init(&self->mu, NULL);
    self->info = rt_dataset_info(ds);
    self->split = split;
    self->si = &self->info->split[split];
    self->rec_bytes = (size_t)self->info->channels * self->info->height * self->info->width;
    self->variable = self->info->height == 0;
    self->pid = getpid();
    self->cache_shard = -1;
    self->path = strdup(path);
    self->shards = calloc(self->si->nshards ? self->si->nshards : 1, sizeof(*self->shards));
    if (!self->path || !self->shards) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static Py_ssize_t cdataset_len(PyObject *op)
{
    const struct cdataset *self = (const struct cdataset *)op;
    return (Py_ssize_t)self->si->records;
}

static int reserve(uint8_t **buf, size_t *cap, size_t n, const char *what)
{
    if (*cap >= n)
        return 0;
    uint8_t *p = rt_realloc(*buf, n, what);
    if (!p)
        return -ENOMEM;
    *buf = p;
    *cap = n;
    return 0;
}

/* The shard of split-local record i (binary search over the shards' first records). */
static uint32_t shard_of(const struct rt_split_info *si, uint64_t i)
{
    uint32_t lo = 0, hi = si->nshards - 1;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo + 1) / 2;
        if (si->shards[mid].first_record <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Opens shard j of the split and checks its header against the manifest. 0 or -errno. */
static int open_shard(struct cdataset *self, uint32_t j)
{
    const struct rt_shard_ref *ref = &self->si->shards[j];
    char path[4096];
    int rc = rt_path_join(path, sizeof(path), self->info->dir, ref->file);
    if (rc == 0)
        rc = rt_shard_open(path, &self->shards[j]);
    if (rc < 0)
        return rc;
    const struct rt_shard_header *h = rt_shard_header(self->shards[j]);
    if (h->record_count != ref->records || h->first_record != ref->first_record ||
        h->channels != self->info->channels || h->height != self->info->height || h->width != self->info->width) {
        rc = rt_errf(-EBADMSG,
                     "%s: header (%" PRIu64 " records from %" PRIu64 ", %" PRIu32 "x%" PRIu32 "x%" PRIu32
                     ") disagrees with the manifest (%" PRIu64 " from %" PRIu64 ", %" PRIu32 "x%" PRIu32
                     "x%" PRIu32 ")",
                     path, h->record_count, h->first_record, h->channels, h->height, h->width, ref->records,
                     ref->first_record, self->info->channels, self->info->height, self->info->width);
        rt_shard_close(self->shards[j]);
        self->shards[j] = NULL;
    }
    return rc;
}

/*
 * Record i (split-local, < records) and its label. Fixed-size records are
 * copied into *out (rec_bytes, the caller's); a variable-size one is decoded
 * into a buffer of its own size, given to the caller in *out (free() it),
 * its size in *height, *width. Under mu. 0 or -errno.
 */
static int read_record(struct cdataset *self, uint64_t i, uint8_t **out, uint32_t *height, uint32_t *width,
                       int32_t *label)
{
    const uint32_t j = shard_of(self->si, i);
    int rc;
    if (!self->shards[j] && (rc = open_shard(self, j)) < 0)
        return rc;
    if (!self->dec && (rc = rt_decoder_create(&self->dec)) < 0)
        return rc;
    const struct rt_shard *s = self->shards[j];
    const struct rt_shard_header *h = rt_shard_header(s);
    const struct rt_block_entry *e = rt_shard_blocks(s);
    const uint64_t local = i - h->first_record;
    uint32_t lo = 0, hi = h->block_count - 1;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo + 1) / 2;
        if (e[mid].first_record <= local)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (self->cache_shard != (int64_t)j || self->cache_block != lo) {
        self->cache_shard = -1;
        char path[4096];
        const size_t decoded_bytes = self->variable ? e[lo].raw_size : (size_t)e[lo].record_count * self->rec_bytes;
        if ((rc = rt_path_join(path, sizeof(path), self->info->dir, self->si->shards[j].file)) < 0 ||
            (rc = reserve(&self->stored, &self->stored_cap, e[lo].stored_size, "stored block")) < 0 ||
            (rc = reserve(&self->decoded, &self->decoded_cap, decoded_bytes, "decoded block")) < 0 ||
            (rc = rt_shard_read_block(s, lo, self->stored)) < 0)
            return rc;
        rc = self->variable ? rt_block_payload(self->dec, h, &e[lo], lo, self->stored, self->decoded, path)
                            : rt_block_decode(self->dec, h, &e[lo], lo, self->stored, self->decoded, path);
        if (rc < 0)
            return rc;
        self->cache_shard = j;
        self->cache_block = lo;
    }
    const uint32_t r = (uint32_t)(local - e[lo].first_record);
    *label = rt_shard_labels(s)[local];
    if (!self->variable) {
        memcpy(*out, self->decoded + (size_t)r * self->rec_bytes, self->rec_bytes);
        return 0;
    }
    struct rt_jpeg_record rec;
    rt_jpeg_block_record(h, &e[lo], self->decoded, r, &rec);
    uint8_t *img = rt_malloc((size_t)h->channels * rec.height * rec.width, "record");
    if (!img)
        return -ENOMEM;
    char where[4200];
    snprintf(where, sizeof(where), "%s/%s: block %" PRIu32 ", record %" PRIu32, self->info->dir,
             self->si->shards[j].file, lo, r);
    if ((rc = rt_jpeg_record_decode(self->dec, h, &rec, img, where)) < 0) {
        free(img);
        return rc;
    }
    *out = img;
    *height = rec.height;
    *width = rec.width;
    return 0;
}

static PyObject *cdataset_get(PyObject *op, PyObject *arg)
{
    struct cdataset *self = (struct cdataset *)op;
    const Py_ssize_t n = (Py_ssize_t)self->si->records;
    Py_ssize_t i = PyNumber_AsSsize_t(arg, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0)
        i += n;
    if (i < 0 || i >= n) {
        PyErr_Format(PyExc_IndexError, "record %zd out of range: the %s split has %zd", i,
                     rt_split_name(self->split), n);
        return NULL;
    }
    if (self->pid != getpid()) {
        /* A forked child, where only this thread came along. The state is whole unless another thread of the
         * parent was inside read_record() at the fork: then it is forgotten, not freed (the child's copy of
         * what that thread was changing cannot be trusted). The parent's shards stay open in the parent. */
        if (pthread_mutex_trylock(&self->mu) == 0) {
            pthread_mutex_unlock(&self->mu);
            drop_process_state(self);
        } else {
            memset(self->shards, 0, sizeof(*self->shards) * self->si->nshards);
            self->dec = NULL;
            self->stored = self->decoded = NULL;
            self->stored_cap = self->decoded_cap = 0;
            self->cache_shard = -1;
        }
        pthread_mutex_init(&self->mu, NULL);
        self->pid = getpid();
    }
    /* Fixed sizes: straight into the bytes object. Variable: its size is known only once the block is read
     * (without the GIL), so the record comes in a buffer of its own and is copied once. */
    PyObject *bytes = NULL;
    uint8_t *out = NULL;
    uint32_t height = self->info->height, width = self->info->width;
    if (!self->variable) {
        if (!(bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)self->rec_bytes)))
            return NULL;
        out = (uint8_t *)PyBytes_AsString(bytes);
    }
    int32_t label = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mu);
    rc = read_record(self, (uint64_t)i, &out, &height, &width, &label);
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        Py_XDECREF(bytes);
        return ext_raise(rc);
    }
    if (self->variable) {
        bytes = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)self->info->channels * height * width);
        free(out);
        if (!bytes)
            return NULL;
    }
    return Py_BuildValue("(Nikk)", bytes, (int)label, (unsigned long)height, (unsigned long)width);
}

static PyObject *cdataset_reduce(PyObject *op, PyObject *noargs)
{
    struct cdataset *self = (struct cdataset *)op;
    (void)noargs;
    return Py_BuildValue("(O(ss))", (PyObject *)Py_TYPE(op), self->path, rt_split_name(self->split));
}

static PyObject *get_shape(PyObject *op, void *c)
{
    const struct rt_dataset_info *info = ((struct cdataset *)op)->info;
    const uint32_t v[3] = {info->channels, info->height, info->width};
    return PyLong_FromUnsignedLong(v[(size_t)c]);
}

static PyObject *get_classes(PyObject *op, void *c)
{
    (void)c;
    return ext_class_list(((struct cdataset *)op)->info);
}

static PyObject *get_split(PyObject *op, void *c)
{
    (void)c;
    return PyUnicode_FromString(rt_split_name(((struct cdataset *)op)->split));
}

static PyGetSetDef getset[] = {
    {"channels", get_shape, NULL, "C of each (C, H, W) record", (void *)0},
    {"height", get_shape, NULL, "H of each record; 0: each record has its own (get() says)", (void *)1},
    {"width", get_shape, NULL, "W of each record; 0: each record has its own (get() says)", (void *)2},
    {"classes", get_classes, NULL, "class names, by label", NULL},
    {"split", get_split, NULL, "the split read: 'train', 'val' or 'test'", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef methods[] = {
    {"get", cdataset_get, METH_O,
     "get(i) -> (bytes, int, h, w): record i of the split as C*h*w bytes (CHW, uint8), its label and its size "
     "(the dataset's, or the record's own for variable-size records, decoded whole); negative i counts from "
     "the end"},
    {"__reduce__", cdataset_reduce, METH_NOARGS, "pickles as (path, split): a new process opens its own shards"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot slots[] = {
    {Py_tp_new, cdataset_new},
    {Py_tp_dealloc, cdataset_dealloc},
    {Py_tp_methods, methods},
    {Py_tp_getset, getset},
    {Py_sq_length, cdataset_len},
    {Py_mp_length, cdataset_len},
    {Py_tp_doc, "CDataset(path, split='train'): random access to the records of one split of a packed dataset; "
                "safe across fork() (DataLoader workers)."},
    {0, NULL},
};

static PyType_Spec spec = {
    "ringtrain._ringtrain.CDataset",
    sizeof(struct cdataset),
    0,
    Py_TPFLAGS_DEFAULT,
    slots,
};

int ext_cdataset_init(PyObject *m)
{
    ext_dataset_type = ext_add_type(m, &spec, "CDataset");
    return ext_dataset_type ? 0 : -1;
}
