/*
 * cloader.c - CLoader, the loader for Python: open_loader() opens a split
 * and starts the C loader over a ring (its own memory, or memory the caller
 * gives, such as a pinned torch tensor); next() hands out one CBatch per
 * batch, in order, with the GIL released while it waits. Also ring_bytes()
 * and image_shape().
 *
 * The augmentation and, for datasets of variable-size JPEG records (pack
 * --max-side), the crop to image_size x image_size are the loader's rule
 * (rt_loader_opts_for), the one `ringtrain train` and `loadbench` use: the
 * same options give the same batches. The ring's shape is
 * rt_loader_image_shape()'s.
 *
 * A batch the user keeps holds its slot (ext.h). Batch seq lives in slot
 * seq % slots and cannot be filled before batch seq - slots is given back,
 * so next() checks that batch before it blocks: still referenced, it raises
 * Error(EBUSY) saying what to do rather than wait for ever.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "loader/loadbench.h"
#include "loader/verdict.h"
#include "python/src/ext.h"

PyTypeObject *ext_loader_type;

struct cloader {
    PyObject_HEAD
    struct ext_core *k;
    struct rt_batch_digest *dg;
    uint64_t steps;              /* per epoch */
    uint64_t first_epoch, first_end; /* the epoch opened at and where its steps end (start_sample: maybe short) */
    uint64_t total;              /* batches this loader hands out; 0 = no end (epochs = 0) */
    uint64_t taken;              /* batches handed out so far */
    uint64_t t_open;             /* rt_now_ns() at open */
    pid_t pid;                   /* the process that opened it: a forked child has none of its threads */
    int in_next;                 /* a next() is waiting with the GIL released */
    int ended;                   /* next() returned None */
    /* Kept at close(), for state() and stats() after it. */
    struct rt_loader_state state;
    struct rt_loader_stats st;
    struct rt_wait_stats prod, cons;
    uint64_t t_close;
};

/* ---- opening ------------------------------------------------------------------------ */

static const char *const shuffle_names[] = {"exact", "window", "none"};
static const char *const last_names[] = {"drop", "pad"};

/* An int (or an object with __index__) in [lo, hi] into *out, or -1 with TypeError/ValueError naming `what`. */
static int u64_arg(PyObject *o, const char *what, uint64_t lo, uint64_t hi, uint64_t *out)
{
    PyObject *i = PyNumber_Index(o);
    if (!i) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", what);
        return -1;
    }
    int overflow = 0;
    long long sv = PyLong_AsLongLongAndOverflow(i, &overflow);
    unsigned long long v = (unsigned long long)sv;
    if (overflow > 0)
        v = PyLong_AsUnsignedLongLong(i);
    Py_DECREF(i);
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        overflow = 1;
        v = UINT64_MAX;
        hi = hi < UINT64_MAX ? hi : UINT64_MAX - 1; /* past 2^64 - 1: out of range whatever hi is */
    }
    if (overflow < 0 || (!overflow && sv < 0) || v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s must be in %llu..%llu", what, (unsigned long long)lo,
                     (unsigned long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* None (0) or an int in 1..4096 into *out, or -1 with TypeError/ValueError. */
static int image_size_arg(PyObject *o, uint32_t *out)
{
    uint64_t v = 0;
    if (o && o != Py_None && u64_arg(o, "image_size", 1, 4096, &v) < 0)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* A positive finite number into *out, or -1 with TypeError/ValueError naming `what`. */
static int positive_arg(PyObject *o, const char *what, double *out)
{
    const double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "%s must be a number", what);
        return -1;
    }
    if (!(v > 0) || !isfinite(v)) {
        PyErr_Format(PyExc_ValueError, "%s must be positive and finite, not %g", what, v);
        return -1;
    }
    *out = v;
    return 0;
}

/* None (left as it is: the loader's default) or a (lo, hi) pair of positive numbers with lo <= hi, as
 * torchvision's RandomResizedCrop takes scale= and ratio=. 0, or -1 with TypeError/ValueError. */
static int range_arg(PyObject *o, const char *what, double out[2])
{
    if (!o || o == Py_None)
        return 0;
    if (!PySequence_Check(o) || PySequence_Size(o) != 2) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a (min, max) pair of numbers", what);
        return -1;
    }
    double v[2];
    for (Py_ssize_t i = 0; i < 2; i++) {
        PyObject *x = PySequence_GetItem(o, i);
        const int rc = x ? positive_arg(x, what, &v[i]) : -1;
        Py_XDECREF(x);
        if (rc < 0)
            return -1;
    }
    if (v[0] > v[1]) {
        PyErr_Format(PyExc_ValueError, "%s must be (min, max), not (%g, %g)", what, v[0], v[1]);
        return -1;
    }
    out[0] = v[0];
    out[1] = v[1];
    return 0;
}

/* rt_loader_image_shape() for Python: its message, with the keyword that answers it. 0, or -1 with Error. */
static int image_shape(const struct rt_dataset_info *info, uint32_t image_size, uint32_t *h, uint32_t *w)
{
    const int rc = rt_loader_image_shape(info, image_size, h, w);
    if (rc < 0) {
        if (info->height == 0)
            ext_raisef(-rc, "%s; from Python: image_size=S", rt_errmsg());
        else
            ext_raisef(-rc, "%s; from Python: image_size=None (or %u)", rt_errmsg(), info->height);
        return -1;
    }
    return 0;
}

PyObject *ext_image_shape(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "image_size", NULL};
    const char *path;
    PyObject *size_o = Py_None;
    uint32_t image_size, h = 0, w = 0;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O:image_shape", kwlist, &path, &size_o) ||
        image_size_arg(size_o, &image_size) < 0)
        return NULL;
    struct rt_dataset *ds = NULL;
    if (ext_dataset_open(path, &ds) < 0)
        return NULL;
    const struct rt_dataset_info *info = rt_dataset_info(ds);
    PyObject *res = image_shape(info, image_size, &h, &w) < 0 ? NULL
                                                                : Py_BuildValue("(kkk)", (unsigned long)info->channels,
                                                                                (unsigned long)h, (unsigned long)w);
    rt_dataset_close(ds);
    return res;
}

PyObject *ext_ring_bytes(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"slots", "batch", "c", "h", "w", NULL};
    PyObject *o[5];
    uint64_t v[5];
    static const uint64_t hi[5] = {1024, UINT32_MAX, 4, 65535, 65535};
    static const char *const what[5] = {"slots", "batch", "c", "h", "w"};
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO:ring_bytes", kwlist, &o[0], &o[1], &o[2], &o[3], &o[4]))
        return NULL;
    for (int i = 0; i < 5; i++)
        if (u64_arg(o[i], what[i], i == 0 ? 2 : 1, hi[i], &v[i]) < 0)
            return NULL;
    return PyLong_FromSize_t(ext_core_memory_bytes((uint32_t)v[0], (uint32_t)v[1], (uint32_t)v[2], (uint32_t)v[3],
                                                   (uint32_t)v[4]));
}

PyObject *ext_open_loader(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path",  "split", "batch",       "shuffle",    "last",   "seed",   "augment", "workers",
                             "rank",  "world", "slots",       "start_epoch", "start_step", "epochs", "memory", "digest",
                             "image_size", "crop_scale", "crop_ratio", "center_ratio", "start_sample", NULL};
    const char *path, *split_s = "train", *shuffle_s = "exact", *last_s = "drop", *augment_s = "default";
    PyObject *batch_o = NULL, *seed_o = NULL, *workers_o = NULL, *rank_o = NULL, *world_o = NULL, *slots_o = NULL;
    PyObject *se_o = NULL, *ss_o = NULL, *sp_o = NULL, *epochs_o = NULL, *memory = Py_None;
    PyObject *size_o = Py_None, *scale_o = Py_None, *ratio_o = Py_None, *center_o = Py_None;
    int want_digest = 0;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|sOssOsOOOOOOOOpOOOOO:open_loader", kwlist, &path, &split_s,
                                     &batch_o, &shuffle_s, &last_s, &seed_o, &augment_s, &workers_o, &rank_o,
                                     &world_o, &slots_o, &se_o, &ss_o, &epochs_o, &memory, &want_digest, &size_o,
                                     &scale_o, &ratio_o, &center_o, &sp_o))
        return NULL;
    struct rt_loader_opts lo = {0};
    uint32_t image_size;
    if (image_size_arg(size_o, &image_size) < 0 || range_arg(scale_o, "crop_scale", lo.crop_scale) < 0 ||
        range_arg(ratio_o, "crop_ratio", lo.crop_ratio) < 0 ||
        (center_o != Py_None && positive_arg(center_o, "center_ratio", &lo.center_ratio) < 0))
        return NULL;
    if (lo.center_ratio > 1) {
        PyErr_Format(PyExc_ValueError, "center_ratio must be in (0, 1], not %g", lo.center_ratio);
        return NULL;
    }
    uint64_t batch = 0, seed = 0, workers = 0, rank = 0, world = 1, slots = 0, se = 0, ss = 0, sp = 0, epochs = 0;
    if (!batch_o) {
        PyErr_SetString(PyExc_TypeError, "open_loader() needs batch=");
        return NULL;
    }
    if (u64_arg(batch_o, "batch", 1, UINT32_MAX, &batch) < 0 ||
        (seed_o && u64_arg(seed_o, "seed", 0, UINT64_MAX, &seed) < 0) ||
        (workers_o && u64_arg(workers_o, "workers", 0, 1024, &workers) < 0) ||
        (world_o && u64_arg(world_o, "world", 1, UINT32_MAX, &world) < 0) ||
        (rank_o && u64_arg(rank_o, "rank", 0, world - 1, &rank) < 0) ||
        (slots_o && u64_arg(slots_o, "slots", 0, 1024, &slots) < 0) ||
        (se_o && u64_arg(se_o, "start_epoch", 0, UINT64_MAX / 2, &se) < 0) ||
        (ss_o && u64_arg(ss_o, "start_step", 0, UINT64_MAX / 2, &ss) < 0) ||
        (sp_o && u64_arg(sp_o, "start_sample", 0, UINT64_MAX / 2, &sp) < 0) ||
        (epochs_o && u64_arg(epochs_o, "epochs", 0, UINT64_MAX / 2, &epochs) < 0))
        return NULL;
    if (slots == 1) {
        PyErr_SetString(PyExc_ValueError, "slots must be 0 (workers + 2, at least 4) or 2..1024");
        return NULL;
    }
    if (ss && sp) {
        PyErr_SetString(PyExc_ValueError, "start_step and start_sample: a resume point is one or the other");
        return NULL;
    }
    if (epochs && se >= epochs) {
        PyErr_Format(PyExc_ValueError, "start_epoch %llu is not before epochs %llu", (unsigned long long)se,
                     (unsigned long long)epochs);
        return NULL;
    }
    if (ext_split(split_s, &lo.split) < 0)
        return NULL;
    int shuffle = ext_choice("shuffle", shuffle_s, shuffle_names, 3), last = ext_choice("last", last_s, last_names, 2);
    if (shuffle < 0 || last < 0)
        return NULL;
    /* "default" is the loader's default for the split and data; anything else is rt_aug_parse's spelling. */
    struct rt_aug aug;
    const int aug_default = !strcmp(augment_s, "default");
    if (!aug_default && rt_aug_parse(augment_s, &aug) < 0) {
        PyErr_Format(PyExc_ValueError, "augment: %s", rt_errmsg());
        return NULL;
    }
    unsigned long long ext_addr = 0;
    Py_ssize_t ext_bytes = 0;
    PyObject *owner = NULL;
    if (memory != Py_None) {
        if (!PyTuple_Check(memory) || !PyArg_ParseTuple(memory, "KnO:memory", &ext_addr, &ext_bytes, &owner)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "memory must be None or a tuple (address, nbytes, owner)");
            return NULL;
        }
        if (!ext_addr || ext_bytes <= 0) {
            PyErr_SetString(PyExc_ValueError, "memory: address and nbytes must be positive");
            return NULL;
        }
    }

    struct rt_dataset *ds = NULL;
    if (ext_dataset_open(path, &ds) < 0)
        return NULL;
    const struct rt_dataset_info *info = rt_dataset_info(ds);
    uint32_t h, w;
    /* The augmentation and crop are the loader's rule, as for train and loadbench: "default" is its default. */
    int rc = 0;
    if (image_shape(info, image_size, &h, &w) < 0 ||
        (rc = rt_loader_opts_for(info, lo.split, aug_default ? NULL : &aug, image_size, &lo)) < 0) {
        if (rc < 0)
            ext_raise(rc);
        rt_dataset_close(ds);
        return NULL;
    }
    lo.batch = (uint32_t)batch;
    lo.world = (uint32_t)world;
    lo.rank = (uint32_t)rank;
    lo.seed = seed;
    lo.shuffle = (enum rt_shuffle)shuffle;
    lo.last = (enum rt_last_batch)last;
    lo.workers = workers ? (int)workers : rt_cpus_available();
    lo.epochs = epochs;
    lo.start_epoch = se;
    lo.start_step = ss;
    lo.start_sample = sp;
    const uint32_t nslots = slots ? (uint32_t)slots : (uint32_t)RT_MAX(lo.workers + 2, 4);
    if (owner) {
        const size_t need = ext_core_memory_bytes(nslots, lo.batch, info->channels, h, w);
        if ((size_t)ext_bytes < need) {
            PyErr_Format(PyExc_ValueError,
                         "memory holds %zd bytes; a ring of %u slots of %u images of %ux%ux%u needs %zu "
                         "(ring_bytes())",
                         ext_bytes, nslots, lo.batch, info->channels, h, w, need);
            rt_dataset_close(ds);
            return NULL;
        }
        Py_INCREF(owner); /* taken by the core */
    }

    /* Hashing a batch reads all of it on the consumer's thread: only when asked for, as loadbench does. */
    struct rt_batch_digest *dg = NULL;
    if (want_digest && rt_batch_digest_create(&dg) < 0) {
        ext_raise(-ENOMEM);
        Py_XDECREF(owner);
        rt_dataset_close(ds);
        return NULL;
    }
    struct ext_core *k = NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = ext_core_create(ds, nslots, lo.batch, h, w, (uintptr_t)ext_addr, (size_t)ext_bytes, owner, &k);
    if (rc == 0)
        rc = rt_loader_create(k->ds, &lo, k->ring, &k->L);
    Py_END_ALLOW_THREADS
    struct cloader *cl = rc < 0 ? NULL : (struct cloader *)ext_alloc(ext_loader_type);
    if (!cl) {
        if (rc < 0)
            ext_raise(rc); /* before the core goes: its message is this thread's rt_errmsg() */
        ext_core_unref(k);
        rt_batch_digest_destroy(dg);
        return NULL;
    }
    cl->k = k;
    cl->dg = dg;
    cl->steps = rt_loader_steps_per_epoch(k->L);
    /* The first epoch runs from its first step (start_step, or start_sample's base) to its own end. */
    struct rt_loader_state st0;
    rt_loader_state(k->L, &st0);
    cl->first_epoch = se;
    cl->first_end = rt_loader_epoch_steps(k->L, se);
    cl->total = epochs ? (epochs - se - 1) * cl->steps + cl->first_end - st0.step : 0;
    cl->t_open = rt_now_ns();
    cl->pid = getpid();
    return (PyObject *)cl;
}

/* ---- next ----------------------------------------------------------------------------- */

static PyObject *closed_error(void)
{
    PyErr_SetString(PyExc_ValueError, "ringtrain.Loader: the loader is closed");
    return NULL;
}

static PyObject *busy_error(const char *what)
{
    PyErr_Format(PyExc_RuntimeError, "ringtrain.Loader: %s while next() waits in another thread", what);
    return NULL;
}

static PyObject *cloader_next(PyObject *op, PyObject *noargs)
{
    struct cloader *self = (struct cloader *)op;
    struct ext_core *k = self->k;
    (void)noargs;
    if (!k->L)
        return closed_error();
    if (self->in_next)
        return busy_error("next()");
    if (self->pid != getpid())
        return ext_raisef(ECHILD, "ringtrain.Loader: opened in process %d, whose threads a forked process does "
                          "not have: open a loader in each process", (int)self->pid);
    if (self->ended)
        Py_RETURN_NONE;
    if (!self->total || self->taken < self->total) {
        /* The batch this next() waits for lives in the slot of batch taken - slots: still held, it never comes. */
        const struct ext_slot *s = &k->slots[self->taken % k->nslots];
        if (atomic_load(&s->refs) > 0)
            return ext_raisef(EBUSY,
                              "ringtrain.Loader: batch %" PRIu64 " (epoch %" PRIu64 ", step %" PRIu64
                              ") is still referenced (%u batches held, the ring has %u slots) and the next batch "
                              "needs its slot: free or .clone() old batches, or pass slots= (more than the batches "
                              "kept at once)",
                              s->b->seq, s->b->epoch, s->b->step, atomic_load(&k->held), k->nslots);
    }
    struct rt_batch *b = NULL;
    int rc;
    self->in_next = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = rt_loader_next(k->L, &b);
    if (rc == 1) {
        int64_t *lab = k->labels64 + (size_t)b->slot * k->batch;
        for (uint32_t i = 0; i < b->batch; i++)
            lab[i] = b->labels[i];
        if (self->dg)
            rt_batch_digest_add(self->dg, b, k->c, k->h, k->w);
    }
    Py_END_ALLOW_THREADS
    self->in_next = 0;
    if (rc < 0)
        return ext_raise(rc);
    if (rc == 0) {
        self->ended = 1;
        Py_RETURN_NONE;
    }
    self->taken++;
    ext_slot_hand_out(k, b);
    return ext_cbatch_new(k, b);
}

/* ---- close, state, stats -------------------------------------------------------------- */

/* Stops the loader's threads, keeping what state() and stats() report. The ring stays with the core. */
static void cloader_stop(struct cloader *self)
{
    struct ext_core *k = self->k;
    if (!k || !k->L)
        return;
    if (self->pid != getpid()) {
        /* A forked child: the threads to stop are the parent's, and a lock one of them held at the fork would
         * never be let go here. Its copy of the loader is left as it is. */
        k->L = NULL;
        return;
    }
    rt_loader_state(k->L, &self->state);
    rt_loader_stats(k->L, &self->st);
    rt_ring_wait_stats(k->ring, &self->prod, &self->cons);
    self->t_close = rt_now_ns();
    struct rt_loader *L = k->L;
    k->L = NULL;
    Py_BEGIN_ALLOW_THREADS
    rt_loader_destroy(L);
    Py_END_ALLOW_THREADS
}

static PyObject *cloader_close(PyObject *op, PyObject *noargs)
{
    struct cloader *self = (struct cloader *)op;
    (void)noargs;
    if (self->in_next)
        return busy_error("close()");
    cloader_stop(self);
    Py_RETURN_NONE;
}

static void cloader_dealloc(PyObject *op)
{
    struct cloader *self = (struct cloader *)op;
    cloader_stop(self);
    rt_batch_digest_destroy(self->dg);
    ext_core_unref(self->k);
    ext_free(op);
}

static PyObject *cloader_state(PyObject *op, PyObject *noargs)
{
    struct cloader *self = (struct cloader *)op;
    struct rt_loader_state st = self->state;
    (void)noargs;
    if (self->in_next)
        return busy_error("state()");
    if (self->k->L)
        rt_loader_state(self->k->L, &st);
    PyObject *d = PyDict_New();
    if (!d || ext_dict_put(d, "epoch", PyLong_FromUnsignedLongLong(st.epoch)) < 0 ||
        ext_dict_put(d, "step", PyLong_FromUnsignedLongLong(st.step)) < 0 ||
        ext_dict_put(d, "sample", PyLong_FromUnsignedLongLong(st.sample)) < 0 ||
        ext_dict_put(d, "micro", PyLong_FromUnsignedLong(st.micro)) < 0 ||
        ext_dict_put(d, "accum", PyLong_FromUnsignedLong(st.accum)) < 0 ||
        ext_dict_put(d, "seed", PyLong_FromUnsignedLongLong(st.seed)) < 0 ||
        ext_dict_put(d, "world", PyLong_FromUnsignedLong(st.world)) < 0 ||
        ext_dict_put(d, "rank", PyLong_FromUnsignedLong(st.rank)) < 0 ||
        ext_dict_put(d, "batch", PyLong_FromUnsignedLong(st.batch)) < 0 ||
        ext_dict_put(d, "shuffle", PyUnicode_FromString(rt_shuffle_name(st.shuffle))) < 0) {
        Py_XDECREF(d);
        return NULL;
    }
    return d;
}

/* epoch_steps(epoch): where `epoch`'s step numbers end (rt_loader_epoch_steps, kept at open: also after close). */
static PyObject *cloader_epoch_steps(PyObject *op, PyObject *arg)
{
    const struct cloader *self = (const struct cloader *)op;
    uint64_t epoch;
    if (u64_arg(arg, "epoch", 0, UINT64_MAX / 2, &epoch) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(epoch == self->first_epoch ? self->first_end : self->steps);
}

static PyObject *wait_dict(const struct rt_wait_stats *w)
{
    PyObject *d = PyDict_New();
    if (!d || ext_dict_put(d, "count", PyLong_FromUnsignedLongLong(w->count)) < 0 ||
        ext_dict_put(d, "total_ms", PyFloat_FromDouble((double)w->total_ns * 1e-6)) < 0 ||
        ext_dict_put(d, "p50_ms", PyFloat_FromDouble((double)w->p50_ns * 1e-6)) < 0 ||
        ext_dict_put(d, "p99_ms", PyFloat_FromDouble((double)w->p99_ns * 1e-6)) < 0 ||
        ext_dict_put(d, "max_ms", PyFloat_FromDouble((double)w->max_ns * 1e-6)) < 0) {
        Py_XDECREF(d);
        return NULL;
    }
    return d;
}

/* The stage shares as `ringtrain loadbench` prints them (rt_stage_shares: io, the waits and idle of wall time,
 * the rest of worker time), keyed by their JSON names. */
static PyObject *shares_dict(const struct rt_loader_stats *s, const struct rt_wait_stats *prod,
                             const struct rt_wait_stats *cons, double wall)
{
    double share[RT_STAGE_N];
    rt_stage_shares(s, prod, cons, wall, share);
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < RT_STAGE_N; i++)
        if (ext_dict_put(d, rt_stage_name((enum rt_stage)i, 1), PyFloat_FromDouble(share[i])) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    return d;
}

static PyObject *cloader_stats(PyObject *op, PyObject *noargs)
{
    struct cloader *self = (struct cloader *)op;
    struct ext_core *k = self->k;
    struct rt_loader_stats s = self->st;
    struct rt_wait_stats prod = self->prod, cons = self->cons;
    uint64_t t = self->t_close;
    (void)noargs;
    if (self->in_next)
        return busy_error("stats()");
    if (k->L) {
        rt_loader_stats(k->L, &s);
        rt_ring_wait_stats(k->ring, &prod, &cons);
        t = rt_now_ns();
    }
    const double wall = (double)(t - self->t_open) * 1e-9;
    PyObject *d = PyDict_New();
#define PUT_U(key, v) ext_dict_put(d, key, PyLong_FromUnsignedLongLong(v)) < 0
    if (!d || ext_dict_put(d, "io_kind", PyUnicode_FromString(s.io_kind ? s.io_kind : "")) < 0 ||
        ext_dict_put(d, "direct", PyBool_FromLong(s.direct)) < 0 ||
        ext_dict_put(d, "fixed_buffers", PyBool_FromLong(s.fixed_buffers)) < 0 ||
        ext_dict_put(d, "fixed_files", PyBool_FromLong(s.fixed_files)) < 0 || PUT_U("workers", (uint64_t)s.workers) ||
        PUT_U("queue_depth", s.queue_depth) || PUT_U("batches", s.batches) || PUT_U("images", s.images) ||
        PUT_U("io_reads", s.io_reads) || PUT_U("io_bytes", s.io_bytes) || PUT_U("io_busy_ns", s.io_busy_ns) ||
        PUT_U("raw_bytes", s.raw_bytes) || PUT_U("decoded_images", s.decoded_images) ||
        PUT_U("checksum_ns", s.checksum_ns) || PUT_U("decompress_ns", s.decompress_ns) ||
        PUT_U("decode_ns", s.decode_ns) || PUT_U("augment_ns", s.augment_ns) ||
        PUT_U("worker_idle_ns", s.worker_idle_ns) || PUT_U("load_ns", s.load_ns) ||
        PUT_U("resident_bytes", s.resident_bytes) || ext_dict_put(d, "producer", wait_dict(&prod)) < 0 ||
        ext_dict_put(d, "consumer", wait_dict(&cons)) < 0 ||
        ext_dict_put(d, "shares", shares_dict(&s, &prod, &cons, wall)) < 0 ||
        ext_dict_put(d, "wall_s", PyFloat_FromDouble(wall)) < 0 ||
        ext_dict_put(d, "images_per_s", PyFloat_FromDouble(wall > 0 ? (double)s.images / wall : 0)) < 0 ||
        PUT_U("ring_bytes", rt_ring_bytes(k->ring)) ||
        ext_dict_put(d, "ring_locked", PyBool_FromLong(rt_ring_locked(k->ring))) < 0 || PUT_U("slots", k->nslots)) {
        Py_XDECREF(d);
        return NULL;
    }
#undef PUT_U
    return d;
}

static PyObject *cloader_digest(PyObject *op, PyObject *noargs)
{
    struct cloader *self = (struct cloader *)op;
    char hex[17];
    (void)noargs;
    if (self->in_next)
        return busy_error("digest()");
    if (!self->dg) {
        PyErr_SetString(PyExc_ValueError, "digest(): the loader was opened without digest=True");
        return NULL;
    }
    rt_batch_digest_hex(self->dg, hex);
    return PyUnicode_FromString(hex);
}

static PyObject *cloader_held(PyObject *op, PyObject *noargs)
{
    (void)noargs;
    return PyLong_FromUnsignedLong(atomic_load(&((struct cloader *)op)->k->held));
}

/* ---- the type ------------------------------------------------------------------------- */

static PyObject *get_steps(PyObject *op, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLongLong(((struct cloader *)op)->steps);
}

/* The shape getters: closure = offset of the field in struct ext_core. */
static PyObject *get_u32(PyObject *op, void *c)
{
    const struct ext_core *k = ((struct cloader *)op)->k;
    return PyLong_FromUnsignedLong(*(const uint32_t *)((const char *)k + (size_t)c));
}

static PyGetSetDef getset[] = {
    {"steps_per_epoch", get_steps, NULL, "batches per epoch on this rank (the same on every rank)", NULL},
    {"batch", get_u32, NULL, "samples per batch (slot capacity)", (void *)offsetof(struct ext_core, batch)},
    {"channels", get_u32, NULL, "C of the (B, C, H, W) images", (void *)offsetof(struct ext_core, c)},
    {"height", get_u32, NULL, "H of the images", (void *)offsetof(struct ext_core, h)},
    {"width", get_u32, NULL, "W of the images", (void *)offsetof(struct ext_core, w)},
    {"slots", get_u32, NULL, "batch slots in the ring", (void *)offsetof(struct ext_core, nslots)},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef methods[] = {
    {"next", cloader_next, METH_NOARGS,
     "next() -> CBatch | None: the next batch in order (None after the last epoch when epochs > 0); raises Error "
     "(EBUSY) when the batch it needs sits in a slot still referenced"},
    {"state", cloader_state, METH_NOARGS,
     "state() -> dict: the position after the last next(): epoch, step, sample (shuffle exact/none: the global "
     "position of the next batch's update in the epoch's sequence; window: 0), micro, accum, seed, world, rank, "
     "batch, shuffle"},
    {"epoch_steps", cloader_epoch_steps, METH_O,
     "epoch_steps(epoch) -> int: where the epoch's step numbers end: steps_per_epoch, or less for the epoch "
     "opened at start_sample (its steps are numbered from start_sample // (batch * world) on)"},
    {"stats", cloader_stats, METH_NOARGS,
     "stats() -> dict: the loader's stage times, the ring's waits, stage shares and images/s since open"},
    {"digest", cloader_digest, METH_NOARGS,
     "digest() -> str: XXH3-64 of every batch handed out so far, as `ringtrain loadbench --digest` computes it "
     "(opened with digest=True)"},
    {"held", cloader_held, METH_NOARGS, "held() -> int: batches handed out whose slot is still referenced"},
    {"close", cloader_close, METH_NOARGS,
     "close(): stops the loader's threads; batches handed out stay valid until freed. Idempotent"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot slots[] = {
    {Py_tp_dealloc, cloader_dealloc},
    {Py_tp_methods, methods},
    {Py_tp_getset, getset},
    {Py_tp_doc, "A running loader over one split of a packed dataset (made by open_loader())."},
    {0, NULL},
};

static PyType_Spec spec = {
    "ringtrain._ringtrain.CLoader",
    sizeof(struct cloader),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    slots,
};

int ext_cloader_init(PyObject *m)
{
    ext_loader_type = ext_add_type(m, &spec, "CLoader");
    return ext_loader_type ? 0 : -1;
}

/*
 * aug_draw(augment, seed, epoch, id, height, width): what sample `id` of
 * `epoch` draws under the augmentation `augment` (rt_aug_parse's spelling)
 * for images of height x width, as the loader's workers draw it: a dict of
 * dy, dx (the crop's offset from the unpadded image), flip, jitter (a list
 * of (name, factor) in the order applied), erase and cutout ((y, x, h, w) or
 * None). For tests and for checking a pipeline against torchvision's.
 */
PyObject *ext_aug_draw(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"augment", "seed", "epoch", "id", "height", "width", NULL};
    const char *aug_s;
    unsigned long long seed, epoch, id;
    unsigned int h, w;
    struct rt_aug a;
    struct rt_aug_draw d;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sKKKII:aug_draw", kwlist, &aug_s, &seed, &epoch, &id, &h, &w))
        return NULL;
    if (rt_aug_parse(aug_s, &a) < 0)
        return PyErr_Format(PyExc_ValueError, "augment: %s", rt_errmsg());
    if (!h || !w)
        return PyErr_Format(PyExc_ValueError, "aug_draw: height and width must be positive");
    rt_aug_draw(&a, seed, epoch, id, h, w, &d);
    PyObject *jit = PyList_New(0);
    for (int i = 0; jit && i < d.njitter; i++) {
        PyObject *t = Py_BuildValue("(sd)", rt_jitter_name(d.order[i]), (double)d.factor[i]);
        if (!t || PyList_Append(jit, t) < 0)
            Py_CLEAR(jit);
        Py_XDECREF(t);
    }
    if (!jit)
        return NULL;
    PyObject *er = d.erase[2] ? Py_BuildValue("(IIII)", d.erase[0], d.erase[1], d.erase[2], d.erase[3])
                              : Py_NewRef(Py_None);
    PyObject *cut = d.cut[2] ? Py_BuildValue("(IIII)", d.cut[0], d.cut[1], d.cut[2], d.cut[3]) : Py_NewRef(Py_None);
    PyObject *r = er && cut ? Py_BuildValue("{s:l,s:l,s:O,s:O,s:O,s:O}", "dy", d.dy, "dx", d.dx, "flip",
                                            d.flip ? Py_True : Py_False, "jitter", jit, "erase", er, "cutout", cut)
                            : NULL;
    Py_DECREF(jit);
    Py_XDECREF(er);
    Py_XDECREF(cut);
    return r;
}
