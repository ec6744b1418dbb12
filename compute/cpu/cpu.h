/*
 * cpu.h - the CPU backend's kernels, private to compute/. Each rt_cpu_<op>
 * is one slot of struct rt_ops (compute.h says what it computes);
 * cpu/backend.c puts them in the table. Spatial tensors are in the layout
 * below; kernels thread with OpenMP over the backend's thread count;
 * convolutions are oneDNN primitives (dnnl.c).
 *
 * Kernels never fail: shapes were checked when the model was built. Scratch
 * memory (im2col columns) comes from rt_cpu_scratch(), one growing buffer
 * per backend, so a kernel must not hold it across calls.
 *
 * Choosing a backend and the accessors every backend shares are not here
 * (compute/backend.c); it calls rt_cpu_create and rt_cpu_destroy below.
 */
#ifndef RT_COMPUTE_CPU_H
#define RT_COMPUTE_CPU_H

#include <stdint.h>
#include <string.h>

#include "compute/backend.h"
#include "compute/compute.h"

/*
 * The CPU backend's spatial layout, the same in the fp32 and the bf16
 * table. A tensor of logical shape (N, C, H, W) whose C is a multiple of
 * RT_CPU_BLOCK is blocked, oneDNN's "nChw16c": channels in blocks of 16,
 * the 16 of a block contiguous, so that element (n, c, h, w) lies at
 *   (((n*(C/16) + c/16)*H + h)*W + w)*16 + c%16,
 * the format oneDNN's AVX-512 convolutions (fp32 and bf16) choose for
 * themselves, so a network keeps it from layer to layer with no reorder.
 * Any other C (the input image's 1 or 3 channels, odd test shapes) stays
 * channel-major with the batch folded in, (C, N, H, W):
 *   ((c*N + n)*H + h)*W + w.
 * Neither pads: a tensor is always N*C*H*W elements, so the element-wise
 * ops do not care which it is. rt_cpu_offset() is the rule; kernels that
 * walk a blocked tensor loop over (n, c/16, h, w, c%16) instead.
 */
#define RT_CPU_BLOCK 16
static inline int rt_cpu_blocked(struct rt_shape4 sh)
{
    return sh.c % RT_CPU_BLOCK == 0;
}
static inline size_t rt_cpu_offset(struct rt_shape4 sh, int n, int c, int h, int w)
{
    const size_t H = (size_t)sh.h, W = (size_t)sh.w;
    if (rt_cpu_blocked(sh))
        return ((((size_t)n * (size_t)(sh.c / RT_CPU_BLOCK) + (size_t)(c / RT_CPU_BLOCK)) * H + (size_t)h) * W +
                (size_t)w) * RT_CPU_BLOCK + (size_t)(c % RT_CPU_BLOCK);
    return (((size_t)c * (size_t)sh.n + (size_t)n) * H + (size_t)h) * W + (size_t)w;
}

/* bf16 bits (uint16_t) and floats. */
static inline float rt_cpu_bf16_to_f32(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/*
 * The bf16 table's rounding (bf16.c, dnnl.c): to nearest even, as the
 * AVX512_BF16 instruction the vector stores use (VCVTNEPS2BF16), so that an element rounds the same in a vector and
 * in a scalar tail: a NaN stays a NaN, quiet, with its top payload bits, as
 * elem.c's cast; the carry takes the largest finite floats to Inf; and a
 * denormal float becomes a zero of its sign (the instruction reads
 * denormals as zero, as the compute threads' DAZ/FTZ do in every fp32
 * operation; elem.c's cast alone keeps them).
 */
static inline uint16_t rt_cpu_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    if ((u & 0x7f800000u) == 0)
        return (uint16_t)((u >> 16) & 0x8000u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/*
 * The CPU backend (backend.c), for compute/backend.c's rt_backend_create and
 * rt_backend_destroy. rt_cpu_create opens one with o->threads threads (0:
 * the CPUs this process may use) and o->cpu_streams; returns 0 with the
 * backend in *out (owned by the caller), or -errno with rt_errmsg() saying
 * why and *out untouched. rt_cpu_destroy stops its streams and frees it with
 * everything it holds; NULL is fine. Not thread-safe, as rt_backend_create.
 */
int rt_cpu_create(const struct rt_backend_opts *o, struct rt_backend **out);
void rt_cpu_destroy(struct rt_backend *be);

/*
 * Returns at least `bytes` of 64-byte aligned scratch owned by the stream's
 * backend, growing it when needed (contents are not kept). Never returns
 * NULL: when memory is exhausted it prints the size and aborts, since an op
 * cannot report an error and a half-done op is worse.
 */
float *rt_cpu_scratch(struct rt_stream *s, size_t bytes);

/*
 * Loads OpenBLAS once per process (blas.c says why at run time), sets its
 * thread count and describes it ("OpenBLAS SkylakeX"). 0 or -ENOENT.
 */
int rt_cpu_blas_init(int threads, char *describe, size_t len);

/*
 * What every thread that runs kernels needs once: the OpenMP thread count
 * (`threads`) and denormals flushed to zero in it and its OpenMP team.
 */
void rt_cpu_thread_setup(int threads);

/*
 * Asynchronous streams (async.c, compute.h's rt_backend_async): start turns
 * the backend `be` (fully set up otherwise) into one whose default stream is
 * a worker thread, with the queued op table, events and the input copy
 * stream; 0 or -errno. stop drains and joins every stream; fine when start
 * was never called.
 */
int rt_cpu_async_start(struct rt_backend *be);
void rt_cpu_async_stop(struct rt_backend *be);

/*
 * oneDNN (dnnl.c): the engine and primitive cache of `be`, created on first
 * use and released by rt_cpu_dnnl_release (fine when never used).
 * rt_cpu_bf16_isa() says whether this CPU computes bf16 natively
 * (AVX512_BF16 or AMX): 1, or 0 with `why` naming what is missing.
 */
void rt_cpu_dnnl_release(struct rt_backend *be);
int rt_cpu_bf16_isa(char *why, size_t len);
/* "oneDNN 2.6.3 (AVX-512 with AVX512_BF16)": the library and the instruction set it runs with, for the banner. */
void rt_cpu_dnnl_describe(char *buf, size_t len);

/*
 * A matrix product on oneDNN (dnnl.c), for the bf16 table's linear layers:
 * c = a b (+ bias, 1 x N fp32) (+ c when `accumulate`), a M x K, b K x N,
 * c M x N, each operand rows x cols at p with element (i, j) at
 * p[i*rs + j*cs], bf16 or fp32; products summed in fp32, c rounded once.
 * The primitive is made once per shape and kept, as the convolutions'.
 */
struct rt_cpu_mm_arg {
    const void *p;
    int bf16; /* 1: bf16 (uint16_t bits); 0: fp32 */
    int64_t rows, cols, rs, cs;
};
void rt_cpu_dnnl_matmul(struct rt_stream *s, const struct rt_cpu_mm_arg *a, const struct rt_cpu_mm_arg *b,
                        const float *bias, const struct rt_cpu_mm_arg *c, int accumulate);

/*
 * The bf16 table (compute.h's rt_backend_ops_for(be, RT_BF16)): `t` starts as
 * a copy of the fp32 table with act = RT_BF16. rt_cpu_fill_bf16 (bf16.c)
 * replaces every op that reads or writes activations, except the
 * convolutions, which rt_cpu_dnnl_fill_bf16 (dnnl.c) replaces. Its
 * functions take the fp32 signatures; their activation pointers hold bf16
 * (uint16_t bits) in the layout above.
 */
void rt_cpu_fill_bf16(struct rt_ops *t);
void rt_cpu_dnnl_fill_bf16(struct rt_ops *t);

/*
 * The ops: rt_cpu_<op> for every op of compute.h's RT_OPS_LIST, with the
 * signature given there. backend.c holds memory; dnnl.c the convolutions
 * (oneDNN primitives, cached per shape); pool.c layout conversion, pooling,
 * gap, flatten and linear; elem.c input, batchnorm, activations, dropout,
 * loss, reductions, casts and the optimizer updates.
 */
#define RT_CPU_OP_DECLARE(ret, name, params, args) ret rt_cpu_##name params;
RT_OPS_LIST(RT_CPU_OP_DECLARE)
#undef RT_CPU_OP_DECLARE

#endif
