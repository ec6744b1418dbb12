/*
 * cbatch.c - CBatch, one batch handed out by CLoader.next(), and its
 * exports: DLPack capsules (DLPack 0.6, unversioned DLManagedTensor, kDLCPU)
 * of the images (uint8, (B, C, H, W)), labels and ids (int64, (B,)), and
 * buffer-protocol views of the images and labels.
 *
 * Every export holds a reference on the batch's slot (ext.h), so the slot
 * returns to the ring only when the CBatch and every tensor or array made
 * from it are gone: a batch kept across next() keeps its values. A capsule
 * that torch consumed ("used_dltensor") is freed through the managed
 * tensor's deleter, which may run in any thread without the GIL; one never
 * consumed ("dltensor") calls that deleter from its destructor.
 */
#include <dlpack/dlpack.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "python/src/ext.h"

PyTypeObject *ext_batch_type, *ext_view_type;

struct cbatch {
    PyObject_HEAD
    struct ext_core *k;
    uint32_t slot;
    int released;                /* release() dropped the CBatch's own reference */
    uint64_t epoch, step, seq;
    uint32_t valid, batch;
    uint8_t *images;             /* (B, C, H, W) uint8 in the slot */
    int64_t *labels;             /* (B,) int64 in the core's label buffer */
    uint64_t *ids;               /* (B,) uint64 in the slot; RT_PAD_ID reads as int64 -1 */
};

PyObject *ext_cbatch_new(struct ext_core *k, struct rt_batch *b)
{
    struct cbatch *self = (struct cbatch *)ext_alloc(ext_batch_type);
    if (!self) {
        ext_slot_unref(k, b->slot);
        return NULL;
    }
    self->k = k;
    self->slot = b->slot;
    self->epoch = b->epoch;
    self->step = b->step;
    self->seq = b->seq;
    self->valid = b->valid;
    self->batch = b->batch;
    self->images = b->images;
    self->labels = k->labels64 + (size_t)b->slot * k->batch;
    self->ids = b->ids;
    return (PyObject *)self;
}

static void cbatch_dealloc(PyObject *op)
{
    struct cbatch *self = (struct cbatch *)op;
    if (!self->released)
        ext_slot_unref(self->k, self->slot);
    ext_free(op);
}

static int check_live(const struct cbatch *self)
{
    if (!self->released)
        return 0;
    PyErr_SetString(PyExc_ValueError, "ringtrain: the batch was released (release()); its slot may hold another now");
    return -1;
}

/* ---- DLPack --------------------------------------------------------------------------- */

struct export {
    DLManagedTensor mt;
    int64_t shape[4], strides[4];
    struct ext_core *k;
    uint32_t slot;
};

/* May run in any thread, with or without the GIL: touches no Python object (the core's last reference aside). */
static void export_deleter(DLManagedTensor *mt)
{
    struct export *e = mt->manager_ctx;
    struct ext_core *k = e->k;
    const uint32_t slot = e->slot;
    free(e);
    ext_slot_unref(k, slot);
}

static void capsule_destructor(PyObject *cap)
{
    /* Consumed capsules are renamed "used_dltensor": the consumer owns the tensor and calls the deleter. */
    if (!PyCapsule_IsValid(cap, "dltensor"))
        return;
    DLManagedTensor *mt = PyCapsule_GetPointer(cap, "dltensor");
    if (mt && mt->deleter)
        mt->deleter(mt);
}

PyObject *ext_dlpack_capsule(DLManagedTensor *mt)
{
    PyObject *cap = PyCapsule_New(mt, "dltensor", capsule_destructor);
    if (!cap)
        mt->deleter(mt);
    return cap;
}

/* A capsule over `data` of `ndim` dims (C-contiguous) holding a slot reference, or NULL with an exception. */
static PyObject *export_capsule(struct cbatch *self, void *data, DLDataType dtype, int ndim, const int64_t *shape)
{
    if (check_live(self) < 0)
        return NULL;
    struct export *e = calloc(1, sizeof(*e));
    if (!e)
        return PyErr_NoMemory();
    for (int i = 0; i < ndim; i++)
        e->shape[i] = shape[i];
    e->strides[ndim - 1] = 1;
    for (int i = ndim - 2; i >= 0; i--)
        e->strides[i] = e->strides[i + 1] * shape[i + 1];
    e->k = self->k;
    e->slot = self->slot;
    e->mt.manager_ctx = e;
    e->mt.deleter = export_deleter;
    e->mt.dl_tensor = (DLTensor){.data = data, .device = {.device_type = kDLCPU, .device_id = 0}, .ndim = ndim,
                                 .dtype = dtype, .shape = e->shape, .strides = e->strides, .byte_offset = 0};
    ext_slot_ref(self->k, self->slot);
    return ext_dlpack_capsule(&e->mt);
}

static PyObject *cbatch_images(PyObject *op, PyObject *noargs)
{
    struct cbatch *self = (struct cbatch *)op;
    const int64_t shape[4] = {self->batch, self->k->c, self->k->h, self->k->w};
    (void)noargs;
    return export_capsule(self, self->images, (DLDataType){.code = kDLUInt, .bits = 8, .lanes = 1}, 4, shape);
}

static PyObject *cbatch_labels(PyObject *op, PyObject *noargs)
{
    struct cbatch *self = (struct cbatch *)op;
    const int64_t shape[1] = {self->batch};
    (void)noargs;
    return export_capsule(self, self->labels, (DLDataType){.code = kDLInt, .bits = 64, .lanes = 1}, 1, shape);
}

static PyObject *cbatch_ids(PyObject *op, PyObject *noargs)
{
    struct cbatch *self = (struct cbatch *)op;
    const int64_t shape[1] = {self->batch};
    (void)noargs;
    return export_capsule(self, self->ids, (DLDataType){.code = kDLInt, .bits = 64, .lanes = 1}, 1, shape);
}

/* ---- buffer-protocol views ------------------------------------------------------------ */

struct view {
    PyObject_HEAD
    struct ext_core *k;
    uint32_t slot;
    void *buf;
    Py_ssize_t len, itemsize;
    const char *format;
    int ndim;
    Py_ssize_t shape[4], strides[4];
};

static PyObject *make_view(struct cbatch *self, void *buf, const char *format, Py_ssize_t itemsize, int ndim,
                           const Py_ssize_t *shape)
{
    if (check_live(self) < 0)
        return NULL;
    struct view *v = (struct view *)ext_alloc(ext_view_type);
    if (!v)
        return NULL;
    v->k = self->k;
    v->slot = self->slot;
    v->buf = buf;
    v->format = format;
    v->itemsize = itemsize;
    v->ndim = ndim;
    v->len = itemsize;
    for (int i = 0; i < ndim; i++) {
        v->shape[i] = shape[i];
        v->len *= shape[i];
    }
    v->strides[ndim - 1] = itemsize;
    for (int i = ndim - 2; i >= 0; i--)
        v->strides[i] = v->strides[i + 1] * shape[i + 1];
    ext_slot_ref(self->k, self->slot);
    return (PyObject *)v;
}

static void view_dealloc(PyObject *op)
{
    struct view *v = (struct view *)op;
    if (v->k)
        ext_slot_unref(v->k, v->slot);
    ext_free(op);
}

static int view_getbuffer(PyObject *op, Py_buffer *b, int flags)
{
    struct view *v = (struct view *)op;
    b->buf = v->buf;
    b->obj = op;
    Py_INCREF(op); /* the view, and through it the slot, lives as long as the buffer */
    b->len = v->len;
    b->readonly = 0;
    b->itemsize = v->itemsize;
    b->format = (flags & PyBUF_FORMAT) ? (char *)v->format : NULL;
    if (flags & PyBUF_ND) {
        b->ndim = v->ndim;
        b->shape = v->shape;
    } else {
        b->ndim = 1;
        b->shape = NULL;
    }
    b->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? v->strides : NULL;
    b->suboffsets = NULL;
    b->internal = NULL;
    return 0;
}

static PyObject *cbatch_images_view(PyObject *op, PyObject *noargs)
{
    struct cbatch *self = (struct cbatch *)op;
    const Py_ssize_t shape[4] = {self->batch, self->k->c, self->k->h, self->k->w};
    (void)noargs;
    return make_view(self, self->images, "B", 1, 4, shape);
}

static PyObject *cbatch_labels_view(PyObject *op, PyObject *noargs)
{
    struct cbatch *self = (struct cbatch *)op;
    const Py_ssize_t shape[1] = {self->batch};
    (void)noargs;
    return make_view(self, self->labels, "q", 8, 1, shape);
}

/* ---- addresses, release, attributes --------------------------------------------------- */

static PyObject *cbatch_images_address(PyObject *op, PyObject *noargs)
{
    struct cbatch *self = (struct cbatch *)op;
    (void)noargs;
    return check_live(self) < 0 ? NULL : PyLong_FromVoidPtr(self->images);
}

static PyObject *cbatch_labels_address(PyObject *op, PyObject *noargs)
{
    struct cbatch *self = (struct cbatch *)op;
    (void)noargs;
    return check_live(self) < 0 ? NULL : PyLong_FromVoidPtr(self->labels);
}

static PyObject *cbatch_release(PyObject *op, PyObject *noargs)
{
    struct cbatch *self = (struct cbatch *)op;
    (void)noargs;
    if (!self->released) {
        self->released = 1;
        ext_slot_unref(self->k, self->slot);
    }
    Py_RETURN_NONE;
}

/* Integer attributes: closure = offset of a uint64_t (or, below, uint32_t) field of struct cbatch. */
static PyObject *get_u64(PyObject *op, void *c)
{
    return PyLong_FromUnsignedLongLong(*(const uint64_t *)((const char *)op + (size_t)c));
}

static PyObject *get_u32(PyObject *op, void *c)
{
    return PyLong_FromUnsignedLong(*(const uint32_t *)((const char *)op + (size_t)c));
}

static PyGetSetDef getset[] = {
    {"epoch", get_u64, NULL, "epoch of the batch (0-based)", (void *)offsetof(struct cbatch, epoch)},
    {"step", get_u64, NULL, "step within the epoch (0-based)", (void *)offsetof(struct cbatch, step)},
    {"seq", get_u64, NULL, "position in the loader's stream of batches", (void *)offsetof(struct cbatch, seq)},
    {"valid", get_u32, NULL, "real samples; the rest (batch - valid) are padding",
     (void *)offsetof(struct cbatch, valid)},
    {"batch", get_u32, NULL, "samples in the slot (B)", (void *)offsetof(struct cbatch, batch)},
    {"slot", get_u32, NULL, "the ring slot holding the batch", (void *)offsetof(struct cbatch, slot)},
    {NULL, NULL, NULL, NULL, NULL},
};

int ext_cbatch_images(PyObject *op, const uint8_t **images, uint32_t shape[4])
{
    if (!PyObject_TypeCheck(op, ext_batch_type)) {
        PyErr_SetString(PyExc_TypeError, "ringtrain: a CBatch (CLoader.next()) is expected");
        return -1;
    }
    struct cbatch *self = (struct cbatch *)op;
    if (check_live(self) < 0)
        return -1;
    *images = self->images;
    shape[0] = self->batch;
    shape[1] = self->k->c;
    shape[2] = self->k->h;
    shape[3] = self->k->w;
    return 0;
}

static PyMethodDef methods[] = {
    {"images", cbatch_images, METH_NOARGS, "images() -> DLPack capsule: uint8 (B, C, H, W) on kDLCPU"},
    {"labels", cbatch_labels, METH_NOARGS, "labels() -> DLPack capsule: int64 (B,)"},
    {"ids", cbatch_ids, METH_NOARGS, "ids() -> DLPack capsule: int64 (B,) split-local record ids, -1 for padding"},
    {"images_view", cbatch_images_view, METH_NOARGS,
     "images_view() -> object with the buffer protocol, uint8 (B, C, H, W)"},
    {"labels_view", cbatch_labels_view, METH_NOARGS, "labels_view() -> object with the buffer protocol, int64 (B,)"},
    {"images_address", cbatch_images_address, METH_NOARGS, "images_address() -> int: address of images[0]"},
    {"labels_address", cbatch_labels_address, METH_NOARGS, "labels_address() -> int: address of the int64 labels"},
    {"release", cbatch_release, METH_NOARGS,
     "release(): drops this object's own reference on the slot now (exports keep theirs). Idempotent"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot batch_slots[] = {
    {Py_tp_dealloc, cbatch_dealloc},
    {Py_tp_methods, methods},
    {Py_tp_getset, getset},
    {Py_tp_doc, "One batch handed out by CLoader.next(); its slot returns to the ring when it and every export "
                "are gone."},
    {0, NULL},
};

static PyType_Spec batch_spec = {
    "ringtrain._ringtrain.CBatch",
    sizeof(struct cbatch),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    batch_slots,
};

static PyType_Slot view_slots[] = {
    {Py_tp_dealloc, view_dealloc},
    {Py_bf_getbuffer, view_getbuffer},
    {Py_tp_doc, "A buffer-protocol view of a batch's images or labels; holds the batch's slot while it lives."},
    {0, NULL},
};

static PyType_Spec view_spec = {
    "ringtrain._ringtrain.BatchView",
    sizeof(struct view),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    view_slots,
};

int ext_cbatch_init(PyObject *m)
{
    ext_batch_type = ext_add_type(m, &batch_spec, "CBatch");
    ext_view_type = ext_batch_type ? ext_add_type(m, &view_spec, "BatchView") : NULL;
    return ext_view_type ? 0 : -1;
}
