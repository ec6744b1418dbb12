/*
 * core.c - the refcounted core behind a CLoader (ext.h): the dataset, the
 * ring with its slots' reference counts, the int64 label buffers and, when
 * the caller gave the memory, the object that owns it.
 *
 * Nothing here needs the GIL except dropping that owner at the very end: a
 * DLPack deleter can drop the last reference of a batch, or of the whole
 * core, from any thread (a CUDA caching allocator's, a DataLoader's pin
 * thread) without holding it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "python/src/ext.h"

#define LABEL_ALIGN 64

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static size_t page_bytes(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static size_t labels_bytes(uint32_t slots, uint32_t batch)
{
    return round_up((size_t)slots * batch * sizeof(int64_t), LABEL_ALIGN);
}

static size_t ring_mem_bytes(uint32_t slots, uint32_t batch, uint32_t c, uint32_t h, uint32_t w)
{
    const struct rt_ring_opts ro = {.slots = slots, .batch = batch, .channels = c, .height = h, .width = w};
    return rt_ring_slot_bytes(&ro) * slots;
}

size_t ext_core_memory_bytes(uint32_t slots, uint32_t batch, uint32_t c, uint32_t h, uint32_t w)
{
    /* The slots start page-aligned (as the ring's own mmap would), whatever address the caller's block has. */
    return page_bytes() + ring_mem_bytes(slots, batch, c, h, w) + labels_bytes(slots, batch);
}

/* The ring's allocator over the caller's block: the block itself, once; freeing is the owner's business. */
static void *caller_alloc(size_t bytes, void *ctx)
{
    struct ext_core *k = ctx;
    if (bytes != k->ext_ring_bytes) {
        rt_errf(-EINVAL, "ring memory: asked for %zu bytes, the caller's block holds %zu", bytes, k->ext_ring_bytes);
        return NULL;
    }
    return k->ext_base;
}

static void caller_free(void *p, size_t bytes, void *ctx)
{
    (void)p;
    (void)bytes;
    (void)ctx;
}

/* Drops the caller-memory owner's reference, taking the GIL (from any thread); after finalisation it is left. */
static void drop_owner(PyObject *owner)
{
    if (!owner || !Py_IsInitialized())
        return;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF(owner);
    PyGILState_Release(g);
}

static void core_free(struct ext_core *k)
{
    /* The loader's threads are gone (CLoader.close() or a failed open): nothing fills the ring any more. In a
     * forked child they never were there: the loader and the ring are the parent's copies, whose condition
     * variables still count the parent's waiters (destroying one would wait for them for ever), so both are
     * left as they are. */
    if (k->pid == getpid()) {
        rt_loader_destroy(k->L);
        rt_ring_destroy(k->ring);
    }
    if (!k->ext_base)
        free(k->labels64);
    free(k->slots);
    rt_dataset_close(k->ds);
    PyObject *owner = k->owner;
    free(k);
    drop_owner(owner); /* last: the ring and the label buffers were inside the owner's memory */
}

int ext_core_create(struct rt_dataset *ds, uint32_t slots, uint32_t batch, uint32_t h, uint32_t w,
                    uintptr_t ext_addr, size_t ext_bytes, PyObject *owner, struct ext_core **out)
{
    const struct rt_dataset_info *info = rt_dataset_info(ds);
    struct ext_core *k = rt_calloc(1, sizeof(*k), "loader core");
    if (!k) {
        rt_dataset_close(ds);
        drop_owner(owner);
        return -ENOMEM;
    }
    k->ds = ds;
    k->pid = getpid();
    atomic_init(&k->refs, 1);
    atomic_init(&k->held, 0);
    k->owner = owner;
    k->nslots = slots;
    k->batch = batch;
    k->c = info->channels;
    k->h = h;
    k->w = w;
    int rc;
    k->slots = rt_calloc(slots, sizeof(*k->slots), "loader slot references");
    if (!k->slots) {
        rc = -ENOMEM;
        goto err;
    }
    for (uint32_t i = 0; i < slots; i++)
        atomic_init(&k->slots[i].refs, 0);
    struct rt_ring_opts ro = {.slots = slots, .batch = batch, .channels = k->c, .height = k->h, .width = k->w,
                              /* CPU tensors need no locked pages; a GPU's come as caller memory (pinned) */
                              .pin = RT_PIN_OFF};
    if (ext_addr) {
        const size_t need = ext_core_memory_bytes(slots, batch, k->c, k->h, k->w);
        if (ext_bytes < need) {
            rc = rt_errf(-EINVAL, "memory= holds %zu bytes; a ring of %u slots of %u x %ux%ux%u needs %zu "
                         "(ring_bytes())", ext_bytes, slots, batch, k->c, k->h, k->w, need);
            goto err;
        }
        k->ext_base = (uint8_t *)round_up(ext_addr, page_bytes());
        k->ext_ring_bytes = ring_mem_bytes(slots, batch, k->c, k->h, k->w);
        k->labels64 = (int64_t *)(k->ext_base + k->ext_ring_bytes);
        k->alloc = (struct rt_ring_allocator){.name = "caller memory", .locks = 1, .alloc = caller_alloc,
                                              .free = caller_free, .ctx = k};
        ro.allocator = &k->alloc;
    } else {
        k->labels64 = aligned_alloc(LABEL_ALIGN, labels_bytes(slots, batch));
        if (!k->labels64) {
            rc = rt_errf(-ENOMEM, "out of memory for %zu bytes of int64 labels", labels_bytes(slots, batch));
            goto err;
        }
    }
    rc = rt_ring_create(&ro, &k->ring);
    if (rc < 0)
        goto err;
    *out = k;
    return 0;
err:
    core_free(k);
    return rc;
}

void ext_core_unref(struct ext_core *k)
{
    if (k && atomic_fetch_sub(&k->refs, 1) == 1)
        core_free(k);
}

void ext_slot_hand_out(struct ext_core *k, struct rt_batch *b)
{
    struct ext_slot *s = &k->slots[b->slot];
    s->b = b;
    atomic_fetch_add(&k->refs, 1);
    atomic_fetch_add(&k->held, 1);
    atomic_store(&s->refs, 1);
}

void ext_slot_ref(struct ext_core *k, uint32_t slot)
{
    atomic_fetch_add(&k->slots[slot].refs, 1);
}

void ext_slot_unref(struct ext_core *k, uint32_t slot)
{
    struct ext_slot *s = &k->slots[slot];
    if (atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    atomic_fetch_sub(&k->held, 1);
    /* IN_FLIGHT -> FREE under the ring's mutex (what rt_loader_release does), which also orders every read of
     * the slot before a producer refills it. The ring outlives the loader, so this holds after close too. A
     * forked child has no producer to give the slot to (and may hold a copy of a lock taken at the fork). */
    if (k->pid == getpid())
        rt_ring_release(k->ring, s->b);
    ext_core_unref(k);
}
