/*
 * backend.c - the CPU backend: memory, the in-order "stream" (ops run before
 * they return), thread set-up for OpenMP and OpenBLAS, the op tables that
 * point at the kernels in dnnl.c, pool.c, elem.c and bf16.c, and
 * rt_cpu_create/rt_cpu_destroy, which compute/backend.c calls.
 *
 * It does not do: choosing a backend, the accessors every backend shares,
 * dtype names or the convolution and pooling descriptors (compute/backend.c);
 * asynchronous streams (async.c).
 */
#include <errno.h>
#include <omp.h>
#include <pthread.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compute/cpu/cpu.h"

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
    /* On an asynchronous stream's worker (s->q set) this is the queued copy: async.c counted the wait. */
    if (!s->q)
        rt_backend_waited(s);
    memcpy(host_dst, src, bytes);
}

void rt_cpu_download_async(struct rt_stream *s, void *host_dst, const void *src, size_t bytes)
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
    if (!s->q)
        rt_backend_waited(s);
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
static const struct rt_ops cpu_ops = {.act = RT_F32, .bn_relu = 1, .add_relu = 1, RT_OPS_LIST(CPU_OP)};
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

int rt_cpu_create(const struct rt_backend_opts *o, struct rt_backend **out)
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
        rt_cpu_destroy(be);
        return rc;
    }
    char dnnl[96];
    rt_cpu_dnnl_describe(dnnl, sizeof(dnnl));
    snprintf(be->describe, sizeof(be->describe), "cpu: %d thread%s, %s, %s%s", be->threads,
             be->threads == 1 ? "" : "s", dnnl, blas, async ? ", asynchronous streams (RINGTRAIN_CPU_STREAMS=async)" : "");
    *out = be;
    return 0;
}

void rt_cpu_destroy(struct rt_backend *be)
{
    if (!be)
        return;
    rt_cpu_async_stop(be);
    rt_cpu_dnnl_release(be);
    free(be->scratch);
    free(be->scratch16);
    free(be);
}
