/*
 * ext.h (private to python/src/) - the pieces of the extension module
 * ringtrain._ringtrain that its files share: the exception class, argument
 * conversions, the refcounted loader core that batches and their exports
 * keep alive, and the types each file defines.
 *
 * The module is built against Python's limited API (3.11) and DLPack 0.6's
 * header; it links no torch, CUDA or libpython.
 *
 * Lifetime of a loader's memory (the contract the Python package documents):
 *   - one struct ext_core per loader holds the dataset, the ring, the loader
 *     and the int64 label buffers, with a reference count: one for the
 *     CLoader object, one for every batch handed out and not yet given back;
 *   - a batch handed out by CLoader.next() has a slot reference count: one
 *     for the CBatch, one for each export (DLPack capsule or managed tensor,
 *     buffer view). When the last goes, the slot returns to the ring
 *     (rt_loader_release) and the batch's core reference is dropped;
 *   - CLoader.close() (or its deallocation) stops the loader's threads; the
 *     ring's memory lives on until the last batch reference is gone.
 * Slot and core references are atomic: a DLPack deleter may drop one in any
 * thread without the GIL. Only the very last core reference touches Python
 * (the owner of caller-given memory), under PyGILState_Ensure().
 */
#ifndef RT_PYTHON_EXT_H
#define RT_PYTHON_EXT_H

#include <Python.h>
/* after Python.h, which must come first */
#include <dlpack/dlpack.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "loader/loader.h"

/* ---- errors and arguments --------------------------------------------------------- */

/* _ringtrain.Error (an OSError subclass whose str() is the C message), made at module init. */
extern PyObject *ext_error;

/* Raises ext_error(-rc, rt_errmsg()) and returns NULL. `rc` is a negative errno. */
PyObject *ext_raise(int rc);
/* Same with a message of our own. */
PyObject *ext_raisef(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Index of `s` in names[n] (NULL entries skipped), or -1 with ValueError naming `what` and the choices. */
int ext_choice(const char *what, const char *s, const char *const *names, int n);
/* "train" / "val" / "test" to the split, or -1 with ValueError. */
int ext_split(const char *s, enum rt_split *out);

/* dict[key] = value, stealing `value`; 0, or -1 with an exception (also when value is NULL). */
int ext_dict_put(PyObject *d, const char *key, PyObject *value);

/* Opens the dataset at `path` with the GIL released: 0, or -1 with ext_error raised. */
int ext_dataset_open(const char *path, struct rt_dataset **out);
/* The dataset's class names as a list of str, or NULL with an exception. */
PyObject *ext_class_list(const struct rt_dataset_info *info);
/* Makes the heap type of `spec` and adds it to module `m` as `name`: the type, or NULL with an exception. */
PyTypeObject *ext_add_type(PyObject *m, PyType_Spec *spec, const char *name);

/* A fresh heap-type instance of `tp` with zeroed C fields, or NULL with an exception. */
PyObject *ext_alloc(PyTypeObject *tp);
/* Frees an instance of a heap type made by ext_alloc (the tp_dealloc's last call). */
void ext_free(PyObject *self);

/* ---- the loader core ------------------------------------------------------------------ */

struct ext_slot {
    atomic_uint refs;                /* the CBatch and its exports; 0 = with the ring */
    struct rt_batch *b;              /* the batch handed out from this slot (valid while refs > 0) */
};

struct ext_core {
    atomic_long refs;                /* the CLoader + one per slot with refs > 0 */
    struct rt_dataset *ds;
    struct rt_ring *ring;
    struct rt_loader *L;             /* NULL once closed (only under the GIL) */
    uint32_t nslots, batch, c, h, w; /* c, h, w: a slot image's shape (rt_loader_image_shape) */
    int64_t *labels64;               /* [nslots][batch]: the handed-out batches' labels as int64 */
    struct ext_slot *slots;
    atomic_uint held;                /* slots with refs > 0 */
    pid_t pid;                       /* the process whose threads use the ring (see core.c on fork) */
    /* Memory the caller gave (memory=): the ring and labels64 live inside it, `owner` keeps it. */
    PyObject *owner;
    uint8_t *ext_base;
    size_t ext_ring_bytes;
    struct rt_ring_allocator alloc;
};

/*
 * Bytes of caller-given memory a ring of this shape needs: the slots
 * (rt_ring_slot_bytes each), the int64 label buffers, and a page of slack to
 * align the start.
 */
size_t ext_core_memory_bytes(uint32_t slots, uint32_t batch, uint32_t c, uint32_t h, uint32_t w);

/*
 * Makes a core for dataset `ds` (taken: closed with the core, or at once on
 * failure) with its ring's images C x h x w (C the dataset's; h x w from
 * rt_loader_image_shape: the stored size, or the S x S that variable-size
 * records are cropped to) -- its own mmap when ext_addr is 0,
 * else inside [ext_addr, ext_addr + ext_bytes), whose `owner` reference is
 * taken as well (dropped with the core, or on failure) -- and the int64 label
 * buffers; no loader yet. One core reference, the caller's. Returns 0 or
 * -errno with rt_errmsg() set. With or without the GIL.
 */
int ext_core_create(struct rt_dataset *ds, uint32_t slots, uint32_t batch, uint32_t h, uint32_t w,
                    uintptr_t ext_addr, size_t ext_bytes, PyObject *owner, struct ext_core **out);
/* Drops one core reference; the last frees everything. Any thread, with or without the GIL. */
void ext_core_unref(struct ext_core *k);

/* A batch just taken: slot refs = 1 (the CBatch's), one more core reference, held + 1. */
void ext_slot_hand_out(struct ext_core *k, struct rt_batch *b);
/* One more reference on a slot that has one already (an export). */
void ext_slot_ref(struct ext_core *k, uint32_t slot);
/* Drops one slot reference; the last gives the slot back to the ring and drops the core reference. Any thread. */
void ext_slot_unref(struct ext_core *k, uint32_t slot);

/* ---- types ---------------------------------------------------------------------------- */

extern PyTypeObject *ext_loader_type, *ext_batch_type, *ext_view_type, *ext_dataset_type;

/* Each file's types (0, or -1 with an exception); called from the module's init. */
int ext_cloader_init(PyObject *m);
int ext_cbatch_init(PyObject *m);
int ext_cdataset_init(PyObject *m);

/* A new CBatch for the batch just handed out from `k` (takes over its slot reference), or NULL. */
PyObject *ext_cbatch_new(struct ext_core *k, struct rt_batch *b);
/* The images of CBatch `op` (borrowed: valid while the caller holds `op`) and their shape (B, C, H, W): 0, or -1
 * with an exception (not a CBatch, or released). With the GIL. */
int ext_cbatch_images(PyObject *op, const uint8_t **images, uint32_t shape[4]);
/*
 * A "dltensor" capsule over `mt` (a CPU export with its own deleter): torch's from_dlpack consumes it and calls
 * the deleter when the tensor goes; an unconsumed capsule calls it when it is freed. NULL with an exception on
 * failure, the deleter already called.
 */
PyObject *ext_dlpack_capsule(DLManagedTensor *mt);

/* ---- the hand-over conversion (convert.c) --------------------------------------------- */

extern PyTypeObject *ext_converter_type;
/* Converter, the Python type (added to `m`); called from the module's init. 0, or -1 with an exception. */
int ext_convert_init(PyObject *m);
/* Module functions of each file. */
PyObject *ext_open_loader(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ext_ring_bytes(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ext_aug_draw(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ext_image_shape(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ext_stage(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ext_pack(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ext_synth(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ext_verify(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ext_wait_verdict(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ext_dataset_info(PyObject *self, PyObject *args, PyObject *kw);

#endif /* RT_PYTHON_EXT_H */
