/*
 * backend.c - the CPU backend: memory, the in-order "stream" (ops run before
 * they return), thread set-up for OpenMP and OpenBLAS, and the op table that
 * points at the kernels in conv.c, pool.c and elem.c.
 */
#include <errno.h>
#include <omp.h>
#include <pthread.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "common/common.h"
#include "compute/cpu/cpu.h"
#include "rt_buildinfo.h"

void *rt_cpu_alloc(struct rt_backend *be, size_t bytes)
{
    (void)be;
    void *p = NULL;
    size_t n = (bytes + 255) & ~(size_t)255;
    if (n == 0)
        n = 256;
    if (posix_memalign(&p, 256, n) != 0) {
        char b[32];
        rt_format_bytes((double)n, b, sizeof(b));
        rt_errf(-ENOMEM, "out of memory allocating a %s tensor", b);
        return NULL;
    }
    memset(p, 0, n);
    return p;
}

void rt_cpu_free(struct rt_backend *be, void *p)
{
    (void)be;
    free(p);
}

void rt_cpu_upload(struct rt_stream *s, void *dst, const void *host_src, size_t bytes)
{
    (void)s;
    memcpy(dst, host_src, bytes);
}

void rt_cpu_download(struct rt_stream *s, void *host_dst, const void *src, size_t bytes)
{
    (void)s;
    memcpy(host_dst, src, bytes);
}

void rt_cpu_copy(struct rt_stream *s, void *dst, const void *src, size_t bytes)
{
    (void)s;
    memmove(dst, src, bytes);
}

void rt_cpu_zero(struct rt_stream *s, void *dst, size_t bytes)
{
    (void)s;
    memset(dst, 0, bytes);
}

void rt_cpu_sync(struct rt_stream *s)
{
    (void)s;
}

float *rt_cpu_scratch(struct rt_stream *s, size_t bytes)
{
    struct rt_backend *be = s->be;
    if (bytes <= be->scratch_bytes)
        return be->scratch;
    free(be->scratch);
    be->scratch = NULL;
    be->scratch_bytes = 0;
    /* Grow by half again so a run of slightly larger layers does not reallocate each time. */
    size_t n = ((bytes + bytes / 2) + 4095) & ~(size_t)4095;
    void *p = NULL;
    if (posix_memalign(&p, 4096, n) != 0) {
        char b[32];
        rt_format_bytes((double)n, b, sizeof(b));
        fprintf(stderr, "ringtrain: out of memory for %s of convolution scratch\n", b);
        abort();
    }
    be->scratch = p;
    be->scratch_bytes = n;
    return p;
}

/* Every slot of the table is the kernel of its name: .conv2d_fwd = rt_cpu_conv2d_fwd, and so on. */
#define CPU_OP(ret, name, params, args) .name = rt_cpu_##name,
static const struct rt_ops cpu_ops = {.act = RT_F32, .bn_relu = 1, RT_OPS_LIST(CPU_OP)};
#undef CPU_OP

/* The bf16 table: the fp32 one with its activation ops replaced (cpu.h), the same for every CPU backend. */
static struct rt_ops cpu_bf16_ops;
static pthread_once_t cpu_bf16_once = PTHREAD_ONCE_INIT;

static void cpu_bf16_build(void)
{
    cpu_bf16_ops = cpu_ops;
    cpu_bf16_ops.act = RT_BF16;
    rt_cpu_fill_bf16(&cpu_bf16_ops);
    rt_cpu_dnnl_fill_bf16(&cpu_bf16_ops);
}

/* be->ops_bf16 where this CPU computes bf16 natively; why_not_bf16 otherwise. */
static void cpu_bf16_setup(struct rt_backend *be)
{
    if (!rt_cpu_bf16_isa(be->why_not_bf16, sizeof(be->why_not_bf16)))
        return;
    pthread_once(&cpu_bf16_once, cpu_bf16_build);
    be->ops_bf16 = &cpu_bf16_ops;
}

/*
 * Denormal floats are flushed to zero (FTZ) and read as zero (DAZ) in the
 * compute threads, as TensorFlow does on CPUs: the tails of gradients in a
 * deep net drift into the denormal range and every multiply on them then
 * takes a microcode assist -- a residual add of such a gradient ran 10x
 * slower. The OpenMP team persists, so setting it once in each member holds
 * for every later region, OpenBLAS's included (same team); threads created
 * afterwards by these threads inherit the setting.
 */
static void flush_denormals(int threads)
{
#if defined(__x86_64__) || defined(__i386__)
#pragma omp parallel num_threads(threads)
    _mm_setcsr(_mm_getcsr() | 0x8040);
#else
    (void)threads;
#endif
}

void rt_cpu_thread_setup(int threads)
{
    /* One pool for everything: our kernels' OpenMP regions and OpenBLAS
     * (built for OpenMP) share it, so they never oversubscribe the cores. */
    omp_set_num_threads(threads);
    flush_denormals(threads);
}

/* Synchronous ops unless asked otherwise, by the options or the environment. */
static int want_async(enum rt_cpu_streams mode, int *out)
{
    *out = mode == RT_CPU_STREAMS_ASYNC;
    if (mode != RT_CPU_STREAMS_ENV)
        return 0;
    const char *e = getenv("RINGTRAIN_CPU_STREAMS");
    if (!e || !*e || !strcmp(e, "sync"))
        return 0;
    if (strcmp(e, "async") != 0)
        return rt_errf(-EINVAL, "RINGTRAIN_CPU_STREAMS=%s: expected sync or async", e);
    *out = 1;
    return 0;
}

static int cpu_create(const struct rt_backend_opts *o, struct rt_backend **out)
{
    struct rt_backend *be = rt_calloc(1, sizeof(*be), "cpu backend");
    if (!be)
        return -ENOMEM;
    be->kind = RT_BACKEND_CPU;
    be->device = -1;
    be->threads = o->threads > 0 ? o->threads : rt_cpus_available();
    be->stream.be = be;
    be->ops = &cpu_ops;
    int async = 0;
    int rc = want_async(o->cpu_streams, &async);
    if (rc < 0) {
        free(be);
        return rc;
    }
    rt_cpu_thread_setup(be->threads);
    cpu_bf16_setup(be);
    snprintf(be->why_not_f16, sizeof(be->why_not_f16), "the CPU backend has no fp16 table: use --amp bf16 or a GPU");
    char blas[128];
    rc = rt_cpu_blas_init(be->threads, blas, sizeof(blas));
    if (rc == 0 && async)
        rc = rt_cpu_async_start(be);
    if (rc < 0) {
        rt_backend_destroy(be);
        return rc;
    }
    char dnnl[96];
    rt_cpu_dnnl_describe(dnnl, sizeof(dnnl));
    snprintf(be->describe, sizeof(be->describe), "cpu: %d thread%s, %s, %s%s", be->threads,
             be->threads == 1 ? "" : "s", dnnl, blas, async ? ", asynchronous streams (RINGTRAIN_CPU_STREAMS=async)" : "");
    *out = be;
    return 0;
}

int rt_backend_create(const struct rt_backend_opts *o, struct rt_backend **out)
{
    *out = NULL;
    switch (o->kind) {
    case RT_BACKEND_CPU:
        return cpu_create(o, out);
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

void rt_backend_destroy(struct rt_backend *be)
{
    if (!be)
        return;
#if RT_HAVE_CUDA
    rt_cuda_destroy(be);
#endif
    rt_cpu_async_stop(be);
    rt_cpu_dnnl_release(be);
    free(be->scratch);
    free(be->scratch16);
    free(be);
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
