/*
 * backend.c - dispatch over the backends and what every backend shares:
 * rt_backend_create() picks the CPU backend (cpu/) or the CUDA backend
 * (cuda/, when this build has it) and rt_backend_destroy() hands a backend
 * back to the one that made it; the accessors read struct rt_backend's
 * common fields (backend.h); the dtype names, the check of a 16-bit op
 * table against the fp32 one, and the convolution and pooling descriptors
 * are the same for every backend.
 *
 * It does not do: memory, streams, kernels or op tables (cpu/backend.c,
 * cuda/backend_cuda.c and the files beside them), the input uploads
 * (input.c), probing for devices (probe.c).
 */
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "common/common.h"
#include "compute/backend.h"
#include "compute/cpu/cpu.h"
#include "rt_buildinfo.h"
#if RT_HAVE_CUDA
#include "compute/cuda/cuda_be.h"
#endif

static int backend_open(const struct rt_backend_opts *o, struct rt_backend **out)
{
    switch (o->kind) {
    case RT_BACKEND_CPU:
        return rt_cpu_create(o, out);
    case RT_BACKEND_CUDA:
#if RT_HAVE_CUDA
        return rt_cuda_create(o, out);
#else
        return rt_errf(-ENOTSUP, "this build has no CUDA backend (CMake found no CUDA toolkit with nvcc and "
                                 "cuDNN): use --device cpu, or rebuild where /usr/local/cuda has them");
#endif
    }
    return rt_errf(-EINVAL, "unknown backend %d", (int)o->kind);
}

int rt_backend_create(const struct rt_backend_opts *o, struct rt_backend **out)
{
    *out = NULL;
    const int rc = backend_open(o, out);
    if (rc == 0)
        (*out)->owner = pthread_self(); /* the thread that queues work: its waits are the host waits */
    return rc;
}

void rt_backend_destroy(struct rt_backend *be)
{
    if (!be)
        return;
#if RT_HAVE_CUDA
    if (be->kind == RT_BACKEND_CUDA) {
        rt_cuda_destroy(be);
        return;
    }
#endif
    rt_cpu_destroy(be);
}

const struct rt_ops *rt_backend_ops(const struct rt_backend *be)
{
    return be->ops;
}

const struct rt_ops *rt_backend_ops_for(const struct rt_backend *be, enum rt_dtype act)
{
    if (act == RT_F32)
        return be->ops;
    const struct rt_ops *t = act == RT_BF16 ? be->ops_bf16 : act == RT_F16 ? be->ops_f16 : NULL;
    if (t)
        return t;
    const char *why = act == RT_BF16 ? be->why_not_bf16 : act == RT_F16 ? be->why_not_f16 : "";
    rt_errf(-ENOTSUP, "%s activations: %s", rt_dtype_name(act), why[0] ? why : "not supported by this backend");
    return NULL;
}

const struct rt_ops *rt_backend_ops_reference(const struct rt_backend *be, enum rt_dtype act)
{
    return act == RT_F32 ? be->ref_ops : act == RT_BF16 ? be->ref_bf16 : act == RT_F16 ? be->ref_f16 : NULL;
}

int rt_backend_conv_choices(const struct rt_backend *be, struct rt_conv_choice *out, int cap)
{
#if RT_HAVE_CUDA
    if (be->kind == RT_BACKEND_CUDA)
        return rt_cuda_conv_choices(be->cuda, out, cap);
#endif
    (void)be;
    (void)out;
    (void)cap;
    return 0;
}

int rt_ops_check_act_table(const struct rt_ops *t16, const struct rt_ops *t32)
{
    static const char *const act[] = {
#define ACT_NAME(name) #name,
        RT_OPS_ACT_LIST(ACT_NAME)
#undef ACT_NAME
    };
    struct slot {
        const char *name;
        size_t off;
    };
#define SLOT(ret, name, params, args) {#name, offsetof(struct rt_ops, name)},
    static const struct slot slots[] = {RT_OPS_LIST(SLOT)};
#undef SLOT
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++) {
        void *a, *b;
        memcpy(&a, (const char *)t32 + slots[i].off, sizeof(a));
        memcpy(&b, (const char *)t16 + slots[i].off, sizeof(b));
        int is_act = 0;
        for (size_t k = 0; k < sizeof(act) / sizeof(act[0]); k++)
            is_act |= !strcmp(act[k], slots[i].name);
        if (!b)
            return rt_errf(-EINVAL, "%s table: %s is NULL", rt_dtype_name(t16->act), slots[i].name);
        if (is_act && a == b)
            return rt_errf(-EINVAL, "%s table: %s takes activations but is the fp32 kernel", rt_dtype_name(t16->act),
                           slots[i].name);
        if (!is_act && a != b)
            return rt_errf(-EINVAL, "%s table: %s works on fp32 buffers but is not the fp32 table's",
                           rt_dtype_name(t16->act), slots[i].name);
    }
    return 0;
}

void *rt_backend_host_alloc(struct rt_backend *be, size_t bytes)
{
    if (be->io)
        return be->io->host_alloc(be, bytes);
    rt_errf(-ENOTSUP, "the CPU backend allocates no page-locked memory of its own");
    return NULL;
}

void rt_backend_host_free(struct rt_backend *be, void *p)
{
    if (be->io)
        be->io->host_free(be, p);
}

const char *rt_dtype_name(enum rt_dtype t)
{
    switch (t) {
    case RT_F32:
        return "fp32";
    case RT_BF16:
        return "bf16";
    case RT_F16:
        return "fp16";
    }
    return "?";
}

struct rt_stream *rt_backend_stream(struct rt_backend *be)
{
    return &be->stream;
}

int rt_backend_async(const struct rt_backend *be)
{
    return be->async != NULL;
}

uint64_t rt_backend_host_waits(const struct rt_backend *be)
{
    return __atomic_load_n(&be->host_waits, __ATOMIC_RELAXED);
}

void rt_backend_waited(struct rt_stream *s)
{
    /* The comm thread's waits for a bucket's event are not counted: it waits so that the queueing thread
     * need not, and the stream goes on with what that thread queued. */
    if (s == &s->be->stream && pthread_equal(pthread_self(), s->be->owner))
        __atomic_add_fetch(&s->be->host_waits, 1, __ATOMIC_RELAXED);
}

uint64_t rt_stream_point(struct rt_stream *s)
{
    return __atomic_add_fetch(&s->points, 1, __ATOMIC_ACQ_REL);
}

enum rt_backend_kind rt_backend_kind_of(const struct rt_backend *be)
{
    return be->kind;
}

int rt_backend_device(const struct rt_backend *be)
{
    return be->device;
}

const char *rt_backend_pci_bus_id(const struct rt_backend *be)
{
    return be->pci_bus_id[0] ? be->pci_bus_id : NULL;
}

void *rt_backend_native_stream(struct rt_backend *be)
{
    return be->stream.handle;
}

const char *rt_backend_describe(const struct rt_backend *be)
{
    return be->describe;
}

int rt_conv_desc_init(struct rt_conv_desc *d)
{
    const struct rt_shape4 *x = &d->in;
    if (x->n <= 0 || x->c <= 0 || x->h <= 0 || x->w <= 0 || d->cout <= 0 || d->kh <= 0 || d->kw <= 0 ||
        d->stride <= 0 || d->pad < 0)
        return rt_errf(-EINVAL, "convolution: bad shape (%d,%d,%d,%d) kernel %dx%d stride %d pad %d", x->n, x->c,
                       x->h, x->w, d->kh, d->kw, d->stride, d->pad);
    int hp = x->h + 2 * d->pad, wp = x->w + 2 * d->pad;
    if (hp < d->kh || wp < d->kw)
        return rt_errf(-EINVAL, "convolution: a %dx%d kernel does not fit a %dx%d input (padding %d)", d->kh, d->kw,
                       x->h, x->w, d->pad);
    d->oh = (hp - d->kh) / d->stride + 1;
    d->ow = (wp - d->kw) / d->stride + 1;
    return 0;
}

int rt_pool_desc_init(struct rt_pool_desc *d)
{
    const struct rt_shape4 *x = &d->in;
    if (x->n <= 0 || x->c <= 0 || x->h <= 0 || x->w <= 0 || d->kh <= 0 || d->kw <= 0 || d->stride <= 0 ||
        d->pad < 0 || 2 * d->pad > d->kh || 2 * d->pad > d->kw)
        return rt_errf(-EINVAL, "pooling: bad shape (%d,%d,%d,%d) window %dx%d stride %d pad %d", x->n, x->c, x->h,
                       x->w, d->kh, d->kw, d->stride, d->pad);
    int hp = x->h + 2 * d->pad, wp = x->w + 2 * d->pad;
    if (hp < d->kh || wp < d->kw)
        return rt_errf(-EINVAL, "pooling: a %dx%d window does not fit a %dx%d input", d->kh, d->kw, x->h, x->w);
    d->oh = (hp - d->kh) / d->stride + 1;
    d->ow = (wp - d->kw) / d->stride + 1;
    return 0;
}
