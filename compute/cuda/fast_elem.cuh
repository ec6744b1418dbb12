/*
 * fast_elem.cuh - the per-vector bodies of the fast element-wise kernels (fast_elem.cu): ReLU forward and
 * backward, add, add + ReLU forward and backward, scale and axpy over fp32, bf16 and fp16 activations, and the
 * launch rules (when the fast kernels may run, how many blocks). Private to compute/cuda/ and to the nvcc-built
 * CPU test of the bodies (tests/test_cuda_bodies_elem.cu), which calls the same functions for every vector index.
 * It does not launch anything: fast_elem.cu's __global__ wrappers map a grid-stride loop onto these bodies.
 *
 * A body handles vector v of a flat buffer of n elements: elements [v W, v W + W), W = FK_VEC(T) (16 bytes: 4
 * floats, 8 bf16 or fp16), moved by one 16-byte load per operand and one 16-byte store per output; or, in the
 * last vector when W does not divide n, elements [v W, n) one at a time. Preconditions, which the launcher
 * checks with fe_fast_ok before it chooses these kernels over the reference ones: n < 2^31 (indices are 32-bit),
 * every operand 16-byte aligned (NULL where an operand may be absent), v < fe_vectors<T>(n). Vectors are
 * independent: any order, any thread, each element read and then written by the one call that owns it, so an
 * output may be one of the inputs (in-place ReLU, y = a + y).
 *
 * Arithmetic: elem.cu's reference kernels element for element. Each element is widened to float (exact),
 * computed in float with the _rn operations of fast.cuh (fk_add, fk_mul: one rounding each, never contracted
 * into a fused multiply-add, on the device and on the host alike) and rounded once into T (fk_st). The ReLU is
 * the select `v < 0 ? 0 : v`, so NaN and -0 pass; its gradient the select `y > 0 ? dy : 0`, so it is 0 where
 * y <= 0 or y is NaN, even for a NaN dy. beta == 0 stores (the old output is not read); any other beta adds, as
 * elem.cu and compute.h say. The fused add + ReLU rounds the sum into T before the ReLU, and its backward
 * rounds the gradient into T before adding it: add then relu_fwd, and relu_bwd then a copy or axpy(1), bit for
 * bit.
 */
#ifndef RT_COMPUTE_CUDA_FAST_ELEM_CUH
#define RT_COMPUTE_CUDA_FAST_ELEM_CUH

#include <stddef.h>
#include <stdint.h>

#include "compute/cuda/fast.cuh"

/* Threads per block of every fast element-wise kernel. */
#define FE_THREADS 256
/* The grid is at most this many full waves (every multiprocessor holding as many blocks as its thread limit
 * allows: 8 of FE_THREADS on compute capability 8.0 and 9.0, each thread with a 16-byte load per operand in flight): enough
 * that no multiprocessor idles while another finishes a partial wave, and few enough that a grid-stride loop,
 * not block scheduling, covers a large tensor. The kernels use at most 32 registers per thread (ptxas, compute capability 9.0),
 * so registers do not hold residency below the thread limit. */
#define FE_WAVES 4

/* Largest element count of the fast kernels: 32-bit indices, v W and v W + W computed without overflow. */
#define FE_MAX_N ((size_t)INT32_MAX)

/* Vectors covering n elements: the last one is partial when W does not divide n. */
template <typename T> RT_HD uint32_t fe_vectors(uint32_t n)
{
    return (n + (uint32_t)FK_VEC(T) - 1) / (uint32_t)FK_VEC(T);
}

/*
 * 1 when the fast kernels may run on these operands: n <= FE_MAX_N and every pointer 16-byte aligned (NULL, an
 * absent operand, counts as aligned). Otherwise the launcher calls the reference kernel, which takes any n and
 * alignment. Pure.
 */
static inline int fe_fast_ok(size_t n, const void *p0, const void *p1 = NULL, const void *p2 = NULL,
                             const void *p3 = NULL)
{
    return n <= FE_MAX_N && fk_aligned(p0) && fk_aligned(p1) && fk_aligned(p2) && fk_aligned(p3);
}

/* Blocks of FE_THREADS for nv vectors on a GPU of `sms` multiprocessors of `sm_threads` resident threads each
 * (cudaDeviceProp's multiProcessorCount and maxThreadsPerMultiProcessor): one vector per thread up to FE_WAVES
 * full waves, a grid-stride loop beyond. At least 1. Pure. */
static inline unsigned fe_grid(uint32_t nv, int sms, int sm_threads)
{
    const uint32_t need = (nv + FE_THREADS - 1) / FE_THREADS;
    const uint32_t per_sm = sm_threads >= FE_THREADS ? (uint32_t)sm_threads / FE_THREADS : 1u;
    const uint32_t cap = (uint32_t)(sms > 0 ? sms : 1) * per_sm * FE_WAVES;
    const uint32_t b = need < cap ? need : cap;
    return b ? b : 1u;
}

/* ---- the element rules ---------------------------------------------------------------------------------- */

/* relu_fwd_k's select: NaN and -0 pass. */
RT_HD float fe_relu(float v)
{
    return v < 0.0f ? 0.0f : v;
}

/* relu_bwd_k's select: 0 where y <= 0 or y is NaN, whatever dy holds. */
RT_HD float fe_relu_grad(float y, float dy)
{
    return y > 0.0f ? dy : 0.0f;
}

/* One element of a gradient output: g stored (beta 0: the old value is not read) or added to the old value. */
template <typename T> RT_HD T fe_grad_elem(const T *old, float g, float beta)
{
    return fk_st<T>(beta == 0.0f ? g : fk_add(fk_ld(*old), g));
}

/* A whole vector of a gradient output at p (aligned): fe_grad_elem for each of its W elements, the old vector
 * loaded only when it is added to. */
template <typename T> RT_HD void fe_grad_store(T *p, const float *g, float beta)
{
    fk_pack<T> o;
    if (beta == 0.0f) {
FK_UNROLL
        for (int l = 0; l < FK_VEC(T); l++)
            o.v[l] = fk_st<T>(g[l]);
    } else {
        o = fk_load(p);
FK_UNROLL
        for (int l = 0; l < FK_VEC(T); l++)
            o.v[l] = fk_st<T>(fk_add(fk_ld(o.v[l]), g[l]));
    }
    fk_store(p, o);
}

/* ---- the bodies: vector v of n elements ------------------------------------------------------------------ */

/* y = max(0, x); y may be x. */
template <typename T> RT_HD void fe_relu_fwd_vec(uint32_t v, uint32_t n, const T *x, T *y)
{
    const uint32_t i = v * (uint32_t)FK_VEC(T);
    if (n - i >= (uint32_t)FK_VEC(T)) {
        fk_pack<T> p = fk_load(x + i);
FK_UNROLL
        for (int l = 0; l < FK_VEC(T); l++)
            p.v[l] = fk_st<T>(fe_relu(fk_ld(p.v[l])));
        fk_store(y + i, p);
        return;
    }
    for (uint32_t j = i; j < n; j++)
        y[j] = fk_st<T>(fe_relu(fk_ld(x[j])));
}

/* dx = beta dx + (y > 0 ? dy : 0), beta 0 or 1 (compute.h). */
template <typename T> RT_HD void fe_relu_bwd_vec(uint32_t v, uint32_t n, const T *y, const T *dy, float beta, T *dx)
{
    const uint32_t i = v * (uint32_t)FK_VEC(T);
    if (n - i >= (uint32_t)FK_VEC(T)) {
        const fk_pack<T> py = fk_load(y + i), pd = fk_load(dy + i);
        float g[FK_VEC(T)];
FK_UNROLL
        for (int l = 0; l < FK_VEC(T); l++)
            g[l] = fe_relu_grad(fk_ld(py.v[l]), fk_ld(pd.v[l]));
        fe_grad_store(dx + i, g, beta);
        return;
    }
    for (uint32_t j = i; j < n; j++)
        dx[j] = fe_grad_elem(dx + j, fe_relu_grad(fk_ld(y[j]), fk_ld(dy[j])), beta);
}

/* y = a + b, rounded once; y may be a or b. */
template <typename T> RT_HD void fe_add_vec(uint32_t v, uint32_t n, const T *a, const T *b, T *y)
{
    const uint32_t i = v * (uint32_t)FK_VEC(T);
    if (n - i >= (uint32_t)FK_VEC(T)) {
        const fk_pack<T> pa = fk_load(a + i), pb = fk_load(b + i);
        fk_pack<T> o;
FK_UNROLL
        for (int l = 0; l < FK_VEC(T); l++)
            o.v[l] = fk_st<T>(fk_add(fk_ld(pa.v[l]), fk_ld(pb.v[l])));
        fk_store(y + i, o);
        return;
    }
    for (uint32_t j = i; j < n; j++)
        y[j] = fk_st<T>(fk_add(fk_ld(a[j]), fk_ld(b[j])));
}

/* y = max(0, a + b), the sum rounded into T first (add then relu_fwd); y may be a or b. */
template <typename T> RT_HD T fe_add_relu_elem(T a, T b)
{
    return fk_st<T>(fe_relu(fk_ld(fk_st<T>(fk_add(fk_ld(a), fk_ld(b))))));
}

template <typename T> RT_HD void fe_add_relu_fwd_vec(uint32_t v, uint32_t n, const T *a, const T *b, T *y)
{
    const uint32_t i = v * (uint32_t)FK_VEC(T);
    if (n - i >= (uint32_t)FK_VEC(T)) {
        const fk_pack<T> pa = fk_load(a + i), pb = fk_load(b + i);
        fk_pack<T> o;
FK_UNROLL
        for (int l = 0; l < FK_VEC(T); l++)
            o.v[l] = fe_add_relu_elem(pa.v[l], pb.v[l]);
        fk_store(y + i, o);
        return;
    }
    for (uint32_t j = i; j < n; j++)
        y[j] = fe_add_relu_elem(a[j], b[j]);
}

/*
 * g = (y > 0 ? dy : 0) rounded into T (relu_bwd's output), then dxa = beta_a dxa + g and dxb = beta_b dxb + g;
 * a NULL output is skipped. g is complete before either output is written, so dxa or dxb may be dy.
 */
template <typename T>
RT_HD void fe_add_relu_bwd_vec(uint32_t v, uint32_t n, const T *y, const T *dy, float beta_a, T *dxa, float beta_b,
                               T *dxb)
{
    const uint32_t i = v * (uint32_t)FK_VEC(T);
    if (n - i >= (uint32_t)FK_VEC(T)) {
        const fk_pack<T> py = fk_load(y + i), pd = fk_load(dy + i);
        float g[FK_VEC(T)];
FK_UNROLL
        for (int l = 0; l < FK_VEC(T); l++)
            g[l] = fk_ld(fk_st<T>(fe_relu_grad(fk_ld(py.v[l]), fk_ld(pd.v[l]))));
        if (dxa)
            fe_grad_store(dxa + i, g, beta_a);
        if (dxb)
            fe_grad_store(dxb + i, g, beta_b);
        return;
    }
    for (uint32_t j = i; j < n; j++) {
        const float g = fk_ld(fk_st<T>(fe_relu_grad(fk_ld(y[j]), fk_ld(dy[j]))));
        if (dxa)
            dxa[j] = fe_grad_elem(dxa + j, g, beta_a);
        if (dxb)
            dxb[j] = fe_grad_elem(dxb + j, g, beta_b);
    }
}

/* x = x alpha (scale_k's operand order). */
template <typename T> RT_HD void fe_scale_vec(uint32_t v, uint32_t n, float alpha, T *x)
{
    const uint32_t i = v * (uint32_t)FK_VEC(T);
    if (n - i >= (uint32_t)FK_VEC(T)) {
        fk_pack<T> p = fk_load(x + i);
FK_UNROLL
        for (int l = 0; l < FK_VEC(T); l++)
            p.v[l] = fk_st<T>(fk_mul(fk_ld(p.v[l]), alpha));
        fk_store(x + i, p);
        return;
    }
    for (uint32_t j = i; j < n; j++)
        x[j] = fk_st<T>(fk_mul(fk_ld(x[j]), alpha));
}

/* y = y + (alpha x rounded to float), rounded once into T (axpy_k: no fused multiply-add). */
template <typename T> RT_HD void fe_axpy_vec(uint32_t v, uint32_t n, float alpha, const T *x, T *y)
{
    const uint32_t i = v * (uint32_t)FK_VEC(T);
    if (n - i >= (uint32_t)FK_VEC(T)) {
        const fk_pack<T> px = fk_load(x + i);
        fk_pack<T> py = fk_load(y + i);
FK_UNROLL
        for (int l = 0; l < FK_VEC(T); l++)
            py.v[l] = fk_st<T>(fk_add(fk_ld(py.v[l]), fk_mul(alpha, fk_ld(px.v[l]))));
        fk_store(y + i, py);
        return;
    }
    for (uint32_t j = i; j < n; j++)
        y[j] = fk_st<T>(fk_add(fk_ld(y[j]), fk_mul(alpha, fk_ld(x[j]))));
}

#endif
