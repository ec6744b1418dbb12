/*
 * fast_elem.cu - the CUDA backend's fast element-wise kernels: relu_fwd, relu_bwd, add, add_relu_fwd,
 * add_relu_bwd, scale and axpy of the fast tables (fp32, bf16, fp16), put there by rt_cuda_fast_elem_fill over
 * elem.cu's reference entries. The per-vector bodies are in fast_elem.cuh; this file launches them.
 *
 * What is fast about them. These ops are pure streams through memory (a few flops per element), so their time is
 * bytes over bandwidth, and the kernels are written to move bytes at the memory's pace:
 *  - 16-byte accesses: each thread loads and stores whole 16-byte vectors (4 floats, 8 bf16 or fp16), so a warp
 *    moves 512 bytes per instruction per operand. The reference kernels move one element per thread: 128 bytes
 *    per warp instruction in fp32 and 64 in 16 bits, eight times the instructions for the same bytes, which is
 *    what keeps the 16-bit ones from the memory's pace (issue 41's reading; not measured). 16 bytes is the widest
 *    access a thread has, and the most bytes in flight per thread.
 *  - 32-bit indices: vector counts and offsets are uint32_t (n < 2^31), the grid-stride loop's arithmetic one
 *    instruction each, where the reference kernels carry size_t indices.
 *  - A grid sized to the GPU: at most FE_WAVES full waves of resident blocks on every multiprocessor (an H200
 *    has 132 of 2048 threads), which keeps each thread busy with a 16-byte load per operand in flight -- 32 KB
 *    per operand and multiprocessor, about 4 MB for the chip, what 4.8 TB/s needs in flight at a microsecond of
 *    latency; beyond that, a grid-stride loop. The reference grid grows with n up to 65535 blocks.
 *  - Fusion: the residual add and the ReLU after it are one pass (the table's add_relu = 1). Bytes moved per op,
 *    with E the element size: relu_fwd 2nE; relu_bwd 3nE (beta 0) or 4nE (beta 1); add 3nE; add_relu_fwd 3nE
 *    against 5nE for add then relu_fwd; add_relu_bwd reads y and dy once for both inputs' gradients, 4nE to 6nE,
 *    against relu_bwd then a copy or axpy into each gradient, 7nE to 9nE; scale 2nE; axpy 3nE.
 * That these reach the memory roofline is an expectation from the byte counts above, not yet measured.
 *
 * Correctness: every result is bit for bit that of elem.cu's kernel of the same op and type (fast_elem.cuh says
 * how), for every n and alignment. Operands that break the fast kernels' preconditions -- a pointer not 16-byte
 * aligned, or n >= 2^31 -- go to the reference table's entry (rt_backend_ops_reference), the proven kernel. The
 * fp32 table's scale and axpy tell dnn.c of their writes (rt_cuda_wrote) as elem.cu's do, fallback or not.
 * Launch errors are checked after every launch; nothing here synchronises.
 *
 * What it leaves to the reference kernels of elem.cu: GELU, dropout, the loss, the reductions (sumsq,
 * count_nonfinite), loss scaling, the casts and the optimizer updates are not replaced (the batchnorm's fast
 * kernels are fast_bn.cu's, the convolutions and linear layers dnn's).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "compute/cuda/cuda_be.h"
#include "compute/cuda/fast.cuh"
#include "compute/cuda/fast_elem.cuh"

/* ---- kernels: the grid mapped onto the bodies ----------------------------------------------------------------- */

#define FE_GRID_STRIDE(v, nv)                                                                                        \
    for (uint32_t v = blockIdx.x * FE_THREADS + threadIdx.x; v < (nv); v += gridDim.x * FE_THREADS)

template <typename T> static __global__ void __launch_bounds__(FE_THREADS)
    relu_fwd_k(uint32_t n, uint32_t nv, const T *x, T *y)
{
    FE_GRID_STRIDE(v, nv)
    fe_relu_fwd_vec<T>(v, n, x, y);
}

template <typename T> static __global__ void __launch_bounds__(FE_THREADS)
    relu_bwd_k(uint32_t n, uint32_t nv, const T *y, const T *dy, float beta, T *dx)
{
    FE_GRID_STRIDE(v, nv)
    fe_relu_bwd_vec<T>(v, n, y, dy, beta, dx);
}

template <typename T> static __global__ void __launch_bounds__(FE_THREADS)
    add_k(uint32_t n, uint32_t nv, const T *a, const T *b, T *y)
{
    FE_GRID_STRIDE(v, nv)
    fe_add_vec<T>(v, n, a, b, y);
}

template <typename T> static __global__ void __launch_bounds__(FE_THREADS)
    add_relu_fwd_k(uint32_t n, uint32_t nv, const T *a, const T *b, T *y)
{
    FE_GRID_STRIDE(v, nv)
    fe_add_relu_fwd_vec<T>(v, n, a, b, y);
}

template <typename T> static __global__ void __launch_bounds__(FE_THREADS)
    add_relu_bwd_k(uint32_t n, uint32_t nv, const T *y, const T *dy, float beta_a, T *dxa, float beta_b, T *dxb)
{
    FE_GRID_STRIDE(v, nv)
    fe_add_relu_bwd_vec<T>(v, n, y, dy, beta_a, dxa, beta_b, dxb);
}

template <typename T> static __global__ void __launch_bounds__(FE_THREADS)
    scale_k(uint32_t n, uint32_t nv, float alpha, T *x)
{
    FE_GRID_STRIDE(v, nv)
    fe_scale_vec<T>(v, n, alpha, x);
}

template <typename T> static __global__ void __launch_bounds__(FE_THREADS)
    axpy_k(uint32_t n, uint32_t nv, float alpha, const T *x, T *y)
{
    FE_GRID_STRIDE(v, nv)
    fe_axpy_vec<T>(v, n, alpha, x, y);
}

/* ---- the table's entries ---------------------------------------------------------------------------------------- */

/* The activation type of T's table. */
template <typename T> static enum rt_dtype fe_dtype();
template <> enum rt_dtype fe_dtype<float>()
{
    return RT_F32;
}
template <> enum rt_dtype fe_dtype<__nv_bfloat16>()
{
    return RT_BF16;
}
template <> enum rt_dtype fe_dtype<__half>()
{
    return RT_F16;
}

/* The reference twin of T's fast table: where the fast kernels' preconditions fail. A fast table exists only
 * beside its twin (backend_cuda.c builds both), so NULL is a broken backend. */
template <typename T> static const struct rt_ops *fe_reference(struct rt_stream *s)
{
    const struct rt_ops *r = rt_backend_ops_reference(s->be, fe_dtype<T>());
    if (!r)
        rt_cuda_fail("ringtrain", -1, "a fast element-wise kernel has no reference table to fall back on",
                     "rt_backend_ops_reference", __FILE__, __LINE__);
    return r;
}

/* dnn.c hears of every write to an fp32 buffer by the fp32 table's scale and axpy, as from elem.cu's (cuda_be.h:
 * it keeps 16-bit copies of fp32 weights); the 16-bit tables' scale and axpy write activations only. */
template <typename T> static void fe_wrote(struct rt_stream *s, const void *dst, size_t n)
{
    (void)s;
    (void)dst;
    (void)n;
}
template <> void fe_wrote<float>(struct rt_stream *s, const void *dst, size_t n)
{
    rt_cuda_wrote(s, dst, n * sizeof(float));
}

static unsigned fe_blocks(struct rt_stream *s, uint32_t nv)
{
    const struct cudaDeviceProp *p = &rt_cuda_of(s)->prop;
    return fe_grid(nv, p->multiProcessorCount, p->maxThreadsPerMultiProcessor);
}

/* Launches `kernel` (one of the above: its first two arguments are n and the vector count) over n elements of T,
 * n < 2^31 (fe_fast_ok); nothing for n == 0. */
template <typename T, typename K, typename... A> static void fe_launch(struct rt_stream *s, K kernel, size_t n, A... args)
{
    if (n == 0)
        return;
    const uint32_t n32 = (uint32_t)n, nv = fe_vectors<T>(n32);
    kernel<<<fe_blocks(s, nv), FE_THREADS, 0, rt_cuda_stream(s)>>>(n32, nv, args...);
    RT_CUDA_LAUNCHED();
}

/* The table's float pointers hold T elements (compute.h's rt_backend_ops_for). */
#define TP(p) reinterpret_cast<const T *>(p)
#define TM(p) reinterpret_cast<T *>(p)

template <typename T> static void relu_fwd_f(struct rt_stream *s, size_t n, const float *x, float *y)
{
    if (!fe_fast_ok(n, x, y)) {
        fe_reference<T>(s)->relu_fwd(s, n, x, y);
        return;
    }
    fe_launch<T>(s, relu_fwd_k<T>, n, TP(x), TM(y));
}

template <typename T>
static void relu_bwd_f(struct rt_stream *s, size_t n, const float *y, const float *dy, float beta, float *dx)
{
    if (!fe_fast_ok(n, y, dy, dx)) {
        fe_reference<T>(s)->relu_bwd(s, n, y, dy, beta, dx);
        return;
    }
    fe_launch<T>(s, relu_bwd_k<T>, n, TP(y), TP(dy), beta, TM(dx));
}

template <typename T> static void add_f(struct rt_stream *s, size_t n, const float *a, const float *b, float *y)
{
    if (!fe_fast_ok(n, a, b, y)) {
        fe_reference<T>(s)->add(s, n, a, b, y);
        return;
    }
    fe_launch<T>(s, add_k<T>, n, TP(a), TP(b), TM(y));
}

template <typename T>
static void add_relu_fwd_f(struct rt_stream *s, size_t n, const float *a, const float *b, float *y)
{
    if (!fe_fast_ok(n, a, b, y)) {
        fe_reference<T>(s)->add_relu_fwd(s, n, a, b, y);
        return;
    }
    fe_launch<T>(s, add_relu_fwd_k<T>, n, TP(a), TP(b), TM(y));
}

template <typename T>
static void add_relu_bwd_f(struct rt_stream *s, size_t n, const float *y, const float *dy, float beta_a, float *dxa,
                           float beta_b, float *dxb)
{
    if (!fe_fast_ok(n, y, dy, dxa, dxb)) {
        fe_reference<T>(s)->add_relu_bwd(s, n, y, dy, beta_a, dxa, beta_b, dxb);
        return;
    }
    if (dxa || dxb)
        fe_launch<T>(s, add_relu_bwd_k<T>, n, TP(y), TP(dy), beta_a, TM(dxa), beta_b, TM(dxb));
}

template <typename T> static void scale_f(struct rt_stream *s, size_t n, float alpha, float *x)
{
    if (!fe_fast_ok(n, x)) {
        fe_reference<T>(s)->scale(s, n, alpha, x); /* the fp32 reference entry calls rt_cuda_wrote itself */
        return;
    }
    fe_wrote<T>(s, x, n);
    fe_launch<T>(s, scale_k<T>, n, alpha, TM(x));
}

template <typename T> static void axpy_f(struct rt_stream *s, size_t n, float alpha, const float *x, float *y)
{
    if (!fe_fast_ok(n, x, y)) {
        fe_reference<T>(s)->axpy(s, n, alpha, x, y); /* as scale_f */
        return;
    }
    fe_wrote<T>(s, y, n);
    fe_launch<T>(s, axpy_k<T>, n, alpha, TP(x), TM(y));
}

#undef TP
#undef TM

template <typename T> static void fe_fill(struct rt_ops *t)
{
    t->relu_fwd = relu_fwd_f<T>;
    t->relu_bwd = relu_bwd_f<T>;
    t->add = add_f<T>;
    t->add_relu_fwd = add_relu_fwd_f<T>;
    t->add_relu_bwd = add_relu_bwd_f<T>;
    t->scale = scale_f<T>;
    t->axpy = axpy_f<T>;
    t->add_relu = 1; /* the model may now run a residual add and its ReLU as one pass */
}

void rt_cuda_fast_elem_fill(struct rt_ops *t, enum rt_dtype dt)
{
    if (dt == RT_F32)
        fe_fill<float>(t);
    else if (dt == RT_BF16)
        fe_fill<__nv_bfloat16>(t);
    else if (dt == RT_F16)
        fe_fill<__half>(t);
}
