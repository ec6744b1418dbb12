/*
 * elem.cu - the CUDA backend's per-element kernels: ReLU/GELU, dropout,
 * add/scale/axpy, the softmax cross-entropy loss, the flat-buffer reductions
 * (sum of squares, non-finite count), the f16/bf16 casts and the SGD/Adam
 * updates. compute.h (struct rt_ops) says what each computes; the CPU
 * backend's compute/cpu/elem.c is the reference they are tested against.
 *
 * It does not do the input transform, batchnorm, pooling, layout conversion
 * (spatial.cu) or convolutions and linear layers (dnn.c). Every op is one or
 * two kernel launches on the stream's cudaStream_t and returns at once; the
 * only memory it borrows is the backend workspace, for the partial sums of
 * the two-pass reductions.
 *
 * Matching the CPU. nvcc contracts a * b + c into a fused multiply-add where
 * it can, and the CPU code (-std=c17) never does: every such expression is
 * spelled with the _rn intrinsics, fused exactly where elem.c calls fmaf and
 * separate where it does not. With the host-side scalars computed by the
 * same double-precision code as elem.c, ReLU, dropout, add/scale/axpy, the
 * casts and both optimizers give the CPU's bits. GELU and the loss go
 * through the device's erff/expf/log, which are a few ulps from glibc's, so
 * they agree within a few ulps rather than exactly; the double-precision
 * sums of the loss and of sumsq are added in a different (but fixed) order
 * than the CPU's, which can move the float result by an ulp on rare ties.
 *
 * Determinism. Reductions never use atomics: each block sums its share in a
 * fixed tree into a partial, and one block adds the partials in a fixed
 * tree. The grid of a reduction depends only on the element count, not on
 * the device, so the same data gives the same bits on every run and GPU.
 *
 * Dropout draws its mask with elem.c's code (compute/dropout_index.h): each
 * element by its logical NCHW index, so the NHWC tensors of the 16-bit
 * tables get the masks of the fp32 table and of the CPU. One thread owns
 * four consecutive elements of memory; in NCHW and features they share one
 * Philox block, in NHWC each draws its own.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/common.h"
#include "compute/cuda/cuda_be.h"
#include "compute/cuda/kern.cuh"
#include "compute/dropout_index.h"

/* Threads per block of every kernel here; a power of two (block_sum's tree). */
#define THREADS 256
/* Grid-stride loops cover any n; more blocks than this only add scheduling. */
#define MAX_BLOCKS ((size_t)65535)
/* Blocks of the first reduction pass: few enough that one block adds their
 * partials, and a function of n alone so the summation tree is fixed. */
#define RED_BLOCKS ((size_t)1024)
#define RED_PER_BLOCK ((size_t)THREADS * 16)
#define FULL_MASK 0xffffffffu

/* torch.nn.GELU(): x/2 (1 + erf(x/sqrt 2)); the same float constants as elem.c. */
#define GELU_ALPHA 0.70710678118654752440f /* 1/sqrt(2) */
#define GELU_BETA 0.39894228040143267794f  /* 1/sqrt(2 pi) */

static unsigned grid_for(size_t work)
{
    size_t b = (work + THREADS - 1) / THREADS;
    if (b > MAX_BLOCKS)
        b = MAX_BLOCKS;
    return b ? (unsigned)b : 1u;
}

static unsigned red_blocks(size_t n)
{
    size_t b = (n + RED_PER_BLOCK - 1) / RED_PER_BLOCK;
    if (b > RED_BLOCKS)
        b = RED_BLOCKS;
    return b ? (unsigned)b : 1u;
}

#define GRID_STRIDE(i, n)                                                                                            \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

/* Sum over the block in a fixed tree; every thread gets the total. sh holds THREADS values. */
template <typename T> static __device__ T block_sum(T v, T *sh)
{
    const unsigned t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (unsigned w = THREADS / 2; w > 0; w >>= 1) {
        if (t < w)
            sh[t] += sh[t + w];
        __syncthreads();
    }
    return sh[0];
}

/* Butterfly sum over a warp: each step adds the same two values in every
 * lane of a pair (addition commutes), so all lanes end with the same bits. */
static __device__ double warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

/* ==== activations ==========================================================
 *
 * The element-wise kernels are templates over the activation type T (float,
 * __nv_bfloat16, __half): elements are loaded as float, computed in float
 * and rounded once into T on the store. For T = float that is the fp32
 * table's arithmetic unchanged.
 */

template <typename T> static __global__ void relu_fwd_k(size_t n, const T *x, T *y)
{
    /* `x < 0 ? 0 : x` lets NaN through, as torch.relu (and elem.c) does. */
    GRID_STRIDE(i, n)
    {
        const float v = ldf(x[i]);
        y[i] = stf<T>(v < 0.0f ? 0.0f : v);
    }
}

template <typename T> static __global__ void relu_bwd_k(size_t n, const T *y, const T *dy, float beta, T *dx)
{
    /* A select, not a product: 0 where y <= 0 even for a NaN dy, as
     * threshold_backward; beta != 0 means 1 (compute.h), as in elem.c. */
    GRID_STRIDE(i, n)
    {
        const float g = ldf(y[i]) > 0.0f ? ldf(dy[i]) : 0.0f;
        dx[i] = stf<T>(beta == 0.0f ? g : __fadd_rn(ldf(dx[i]), g));
    }
}

template <typename T> static __global__ void gelu_fwd_k(size_t n, const T *x, T *y)
{
    GRID_STRIDE(i, n)
    {
        const float v = ldf(x[i]);
        y[i] = stf<T>(__fmul_rn(__fmul_rn(v, 0.5f), __fadd_rn(1.0f, erff(__fmul_rn(v, GELU_ALPHA)))));
    }
}

template <typename T> static __global__ void gelu_bwd_k(size_t n, const T *x, const T *dy, float beta, T *dx)
{
    GRID_STRIDE(i, n)
    {
        const float v = ldf(x[i]);
        const float cdf = __fmul_rn(0.5f, __fadd_rn(1.0f, erff(__fmul_rn(v, GELU_ALPHA))));
        const float pdf = __fmul_rn(GELU_BETA, expf(__fmul_rn(__fmul_rn(v, v), -0.5f)));
        const float g = __fmul_rn(ldf(dy[i]), __fadd_rn(cdf, __fmul_rn(v, pdf)));
        dx[i] = stf<T>(beta == 0.0f ? g : __fadd_rn(__fmul_rn(beta, ldf(dx[i])), g));
    }
}

/* ==== dropout ============================================================== */

/*
 * y = x * mul (beta 0) or y = beta y + x * mul, mul = scale where kept and 0
 * where dropped: one routine both ways, as in elem.c, so backward's mask is
 * forward's. Multiplying (not selecting) gives NaN for a dropped Inf, as
 * torch's x * mask does. Thread g owns memory indices i = 4 g + q - lead,
 * q = 0..3, lead = offset % 4: where memory is in logical order (NCHW,
 * features) their stream elements offset + i share one Philox block, which
 * is then computed once. x may be y (each element is read, then written, by
 * one thread).
 */
template <typename T>
static __global__ void dropout_k(size_t n, enum rt_dropout_layout lay, struct rt_shape4 sh, float p, float scale,
                                 uint64_t seed, uint64_t offset, const uint64_t *stream, const T *x, float beta, T *y)
{
    rt_dropout_stream_draw(stream, &seed, &offset); /* a graph's replay: every thread makes the same draw */
    const size_t lead = (size_t)(offset & 3u);
    const size_t groups = (n + lead + 3) / 4;
    GRID_STRIDE(grp, groups)
    {
        uint64_t blk = UINT64_MAX; /* no block yet: e >> 2 < 2^62 */
        uint32_t w[4];
#pragma unroll
        for (unsigned l = 0; l < 4; l++) {
            const size_t q = 4 * grp + l;
            if (q < lead || q - lead >= n)
                continue;
            const size_t i = q - lead;
            const uint64_t e = offset + rt_dropout_logical(lay, sh, i);
            if (e >> 2 != blk) {
                blk = e >> 2;
                rt_dropout_block(seed, blk, w);
            }
            const float v = __fmul_rn(ldf(x[i]), rt_dropout_mul_of(w[e & 3], p, scale));
            y[i] = stf<T>(beta == 0.0f ? v : __fadd_rn(__fmul_rn(beta, ldf(y[i])), v));
        }
    }
}

/* ==== add, scale, axpy ===================================================== */

template <typename T> static __global__ void add_k(size_t n, const T *a, const T *b, T *y)
{
    GRID_STRIDE(i, n)
    y[i] = stf<T>(__fadd_rn(ldf(a[i]), ldf(b[i])));
}

/* y = max(0, a + b), the sum rounded once into T (relu_fwd_k's rule on it: NaN passes). */
template <typename T> static __global__ void add_relu_fwd_k(size_t n, const T *a, const T *b, T *y)
{
    GRID_STRIDE(i, n)
    {
        const float v = ldf(stf<T>(__fadd_rn(ldf(a[i]), ldf(b[i]))));
        y[i] = stf<T>(v < 0.0f ? 0.0f : v);
    }
}

/* g = y > 0 ? dy : 0 into each input's gradient: stored (beta 0) or added (relu_bwd_k then add_k's rounding). */
template <typename T>
static __global__ void add_relu_bwd_k(size_t n, const T *y, const T *dy, float beta_a, T *dxa, float beta_b, T *dxb)
{
    GRID_STRIDE(i, n)
    {
        const float g = ldf(stf<T>(ldf(y[i]) > 0.0f ? ldf(dy[i]) : 0.0f));
        if (dxa)
            dxa[i] = stf<T>(beta_a == 0.0f ? g : __fadd_rn(ldf(dxa[i]), g));
        if (dxb)
            dxb[i] = stf<T>(beta_b == 0.0f ? g : __fadd_rn(ldf(dxb[i]), g));
    }
}

template <typename T> static __global__ void scale_k(size_t n, float alpha, T *x)
{
    GRID_STRIDE(i, n)
    x[i] = stf<T>(__fmul_rn(ldf(x[i]), alpha));
}

/* Every thread works the factor out of the squared norm as the host once did: sqrtf, an add, one division. */
static __global__ void clip_scale_k(size_t n, const float *sumsq, float max_norm, float *x)
{
    const float norm = __fsqrt_rn(*sumsq);
    if (!(isfinite(norm) && norm > max_norm))
        return;
    const float f = __fdiv_rn(max_norm, __fadd_rn(norm, 1e-6f));
    GRID_STRIDE(i, n)
    x[i] = __fmul_rn(x[i], f);
}

template <typename T> static __global__ void axpy_k(size_t n, float alpha, const T *x, T *y)
{
    GRID_STRIDE(i, n)
    y[i] = stf<T>(__fadd_rn(ldf(y[i]), __fmul_rn(alpha, ldf(x[i]))));
}

/* ==== loss ================================================================= */

/* Rows per block of xent_rows_k: one warp per sample. */
#define XENT_ROWS (THREADS / 32)

/*
 * One warp per sample: the sample's (loss, correct, valid) into rows[3 r ..]
 * and, when dlogits is not NULL, its gradient row. elem.c's formulas, with
 * its sequential sums over classes replaced by per-lane sums and a warp
 * butterfly. dlogits may be logits: every lane has read all it needs of the
 * row before the __syncwarp that precedes the first write.
 */
template <typename T>
static __global__ void xent_rows_k(int n, int k, const T *logits, const int32_t *labels, double eps, double on,
                                   double off, float grad_scale, const float *loss_scale, double *rows, T *dlogits)
{
    const int lane = (int)(threadIdx.x & 31u);
    for (int64_t r = (int64_t)blockIdx.x * XENT_ROWS + threadIdx.x / 32; r < n;
         r += (int64_t)gridDim.x * XENT_ROWS) {
        const T *z = logits + (size_t)r * (size_t)k;
        T *dz = dlogits ? dlogits + (size_t)r * (size_t)k : NULL;
        double *row = rows + 3 * (size_t)r;
        const int32_t y = labels[r];
        /* label < 0 is padding; a label >= k is the caller's bug, treated
         * the same rather than read out of bounds (as elem.c). */
        if (y < 0 || y >= k) {
            if (dz)
                for (int j = lane; j < k; j += 32)
                    dz[j] = stf<T>(0.0f);
            if (lane == 0)
                row[0] = row[1] = row[2] = 0.0;
            continue;
        }

        /*
         * elem.c scans with a strict `>` from zmax = z[0]: the first maximum
         * wins and NaNs are passed over, unless z[0] itself is NaN, which
         * then stays the maximum. Here: the first maximum over the non-NaN
         * entries (value, then lower index: a total order, so the butterfly
         * needs no fixed order), and z[0]'s NaN case afterwards. arg == k
         * marks a lane that has seen no non-NaN entry.
         */
        float best = -INFINITY;
        int arg = k;
        for (int j = lane; j < k; j += 32) {
            const float zj = ldf(z[j]);
            if (!isnan(zj) && (arg == k || zj > best)) {
                best = zj;
                arg = j;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(FULL_MASK, best, o);
            const int oa = __shfl_xor_sync(FULL_MASK, arg, o);
            if (oa != k && (arg == k || ob > best || (ob == best && oa < arg))) {
                best = ob;
                arg = oa;
            }
        }
        float zmax = best;
        const float z0 = ldf(z[0]);
        if (isnan(z0)) {
            zmax = z0;
            arg = 0;
        }

        /* exp in float as torch's log_softmax, sums in double (elem.c) */
        double sum = 0.0, zsum = 0.0;
        for (int j = lane; j < k; j += 32) {
            const float zj = ldf(z[j]);
            sum += (double)expf(__fsub_rn(zj, zmax));
            zsum += (double)zj;
        }
        sum = warp_sum(sum);
        zsum = warp_sum(zsum);
        const double zy = (double)ldf(z[y]);
        const double lse = __dadd_rn((double)zmax, log(sum));
        if (lane == 0) {
            /* on (-log p_y) + eps (mean over classes of -log p_j) */
            row[0] = __dadd_rn(__dmul_rn(on, __dsub_rn(lse, zy)),
                               __dmul_rn(eps, __dsub_rn(lse, __ddiv_rn(zsum, (double)k))));
            row[1] = arg == y ? 1.0 : 0.0;
            row[2] = 1.0;
        }
        if (dz) {
            __syncwarp();
            const double inv = __ddiv_rn(1.0, sum);
            /* the loss scale lives on the device: the product rounded to float, as elem.c's */
            const double gs = (double)(loss_scale ? __fmul_rn(grad_scale, *loss_scale) : grad_scale);
            for (int j = lane; j < k; j += 32) {
                /* the exponential again, rather than a stored copy: the same bits */
                const double e = (double)expf(__fsub_rn(ldf(z[j]), zmax));
                const double t = __dadd_rn(j == y ? on : 0.0, off);
                dz[j] = stf<T>((float)__dmul_rn(gs, __dsub_rn(__dmul_rn(e, inv), t)));
            }
        }
    }
}

/* Sums the per-sample rows in a fixed tree and adds them into *stats, as floats, as elem.c does. */
static __global__ void xent_stats_k(int n, const double *rows, struct rt_loss_stats *stats)
{
    __shared__ double s0[THREADS], s1[THREADS], s2[THREADS];
    double a = 0.0, b = 0.0, c = 0.0;
    for (int r = (int)threadIdx.x; r < n; r += THREADS) {
        a += rows[3 * (size_t)r];
        b += rows[3 * (size_t)r + 1];
        c += rows[3 * (size_t)r + 2];
    }
    a = block_sum(a, s0);
    b = block_sum(b, s1);
    c = block_sum(c, s2);
    if (threadIdx.x == 0) {
        stats->loss_sum += (float)a;
        stats->correct += (float)b;
        stats->count += (float)c;
    }
}

/* ==== reductions =========================================================== */

template <typename T> static __global__ void sumsq_part_k(size_t n, const T *x, double *part)
{
    __shared__ double sh[THREADS];
    double a = 0.0;
    /* the product of two floats is exact in double: fusing it changes nothing */
    GRID_STRIDE(i, n)
    {
        const double v = (double)ldf(x[i]);
        a = fma(v, v, a);
    }
    a = block_sum(a, sh);
    if (threadIdx.x == 0)
        part[blockIdx.x] = a;
}

static __global__ void sumsq_final_k(unsigned nb, const double *part, float *out)
{
    __shared__ double sh[THREADS];
    double a = 0.0;
    for (unsigned b = threadIdx.x; b < nb; b += THREADS)
        a += part[b];
    a = block_sum(a, sh);
    if (threadIdx.x == 0)
        *out = (float)a;
}

template <typename T> static __global__ void nonfinite_part_k(size_t n, const T *x, unsigned long long *part)
{
    __shared__ unsigned long long sh[THREADS];
    unsigned long long c = 0;
    /* an all-ones exponent is Inf or NaN, whatever -ftz or fast-math do to comparisons */
    GRID_STRIDE(i, n)
    c += (__float_as_uint(ldf(x[i])) & 0x7f800000u) == 0x7f800000u;
    c = block_sum(c, sh);
    if (threadIdx.x == 0)
        part[blockIdx.x] = c;
}

static __global__ void nonfinite_final_k(unsigned nb, const unsigned long long *part, float *out)
{
    __shared__ unsigned long long sh[THREADS];
    unsigned long long c = 0;
    for (unsigned b = threadIdx.x; b < nb; b += THREADS)
        c += part[b];
    c = block_sum(c, sh);
    if (threadIdx.x == 0)
        *out = (float)c;
}

/* g *= 1 / *scale; *found was zeroed before the launch, every thread that sees
 * a NaN/Inf stores the same 1.0f into it (a benign race: one value). */
static __global__ void unscale_check_k(size_t n, float *g, const float *scale, float *found)
{
    const float inv_scale = __fdiv_rn(1.0f, *scale);
    bool bad = false;
    GRID_STRIDE(i, n)
    {
        const float v = g[i];
        bad |= (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
        g[i] = v * inv_scale;
    }
    if (bad)
        *found = 1.0f;
}

/* elem.c's rt_cpu_scaler_update on one thread: the scale and its growth count stay on the device. */
static __global__ void scaler_update_k(float *scale, float *good, const float *found, float growth, float backoff,
                                       int growth_interval)
{
    if (*found != 0.0f) {
        *scale = __fmul_rn(*scale, backoff);
        *good = 0.0f;
        return;
    }
    const float n = __fadd_rn(*good, 1.0f);
    *good = n;
    if (n >= (float)growth_interval) {
        const float g = __fmul_rn(*scale, growth);
        if (g <= 3.0e38f)
            *scale = g;
        *good = 0.0f;
    }
}

/* ==== casts ================================================================ */

/*
 * The hardware conversions round to nearest even with overflow to Inf, as
 * elem.c's bit arithmetic does; NaNs take elem.c's explicit path because the
 * hardware makes every NaN the canonical one, dropping sign and payload.
 */
static __global__ void cast_f32_f16_k(size_t n, const float *x, uint16_t *y)
{
    GRID_STRIDE(i, n)
    {
        const float f = x[i];
        const uint32_t u = __float_as_uint(f), a = u & 0x7fffffffu;
        if (a > 0x7f800000u) /* quiet NaN, sign and top payload bits kept */
            y[i] = (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u | ((a >> 13) & 0x3ffu));
        else
            y[i] = (uint16_t)__half_as_ushort(__float2half_rn(f));
    }
}

static __global__ void cast_f16_f32_k(size_t n, const uint16_t *x, float *y)
{
    GRID_STRIDE(i, n)
    {
        const uint16_t h = x[i];
        if ((h & 0x7fffu) >= 0x7c00u) /* Inf, NaN with its payload (not made quiet) */
            y[i] = __uint_as_float(((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u | ((uint32_t)(h & 0x3ffu) << 13));
        else
            y[i] = __half2float(__ushort_as_half((unsigned short)h));
    }
}

static __global__ void cast_f32_bf16_k(size_t n, const float *x, uint16_t *y)
{
    GRID_STRIDE(i, n)
    {
        const float f = x[i];
        const uint32_t u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: the top half, forced quiet */
            y[i] = (uint16_t)((u >> 16) | 0x0040u);
        else
            y[i] = (uint16_t)__bfloat16_as_ushort(__float2bfloat16_rn(f));
    }
}

static __global__ void cast_bf16_f32_k(size_t n, const uint16_t *x, float *y)
{
    /* exact, NaN payloads included */
    GRID_STRIDE(i, n)
    y[i] = __uint_as_float((uint32_t)x[i] << 16);
}

/* ==== optimizers =========================================================== */

/*
 * elem.c's sgd_chunk element for element: grad.add(param, alpha=wd),
 * buf.mul_(m).add_(grad, alpha=1-dampening), grad.add(buf, alpha=m),
 * param.add_(grad, alpha=-lr), each add-with-alpha one fused multiply-add.
 * buf is not touched (it may be NULL) when momentum is 0.
 */
static __global__ void sgd_k(size_t n, float *p, const float *g, float *buf, float neg_lr, float mom, float ag,
                             float wd, int nesterov, int first, const float *skip)
{
    if (skip && *skip != 0.0f)
        return; /* loss scaling's skipped update */
    const bool has_wd = wd != 0.0f;
    GRID_STRIDE(i, n)
    {
        const float pi = p[i];
        const float gi = has_wd ? __fmaf_rn(pi, wd, g[i]) : g[i];
        float d;
        if (mom == 0.0f) {
            d = gi;
        } else if (first) {
            buf[i] = gi;
            d = nesterov ? __fmaf_rn(gi, mom, gi) : gi;
        } else {
            const float b = __fmaf_rn(gi, ag, __fmul_rn(buf[i], mom));
            buf[i] = b;
            d = nesterov ? __fmaf_rn(b, mom, gi) : b;
        }
        p[i] = __fmaf_rn(d, neg_lr, pi);
    }
}

/*
 * elem.c's adam_chunk element for element (PyTorch 1.13's single-tensor
 * Adam/AdamW): add with alpha is fma(other, alpha, self), addcmul is
 * fma(value * t1, t2, self), addcdiv is self + (value * t1) / t2; sqrt and
 * division correctly rounded whatever -prec-sqrt/-prec-div say.
 */
static __global__ void adam_k(size_t n, float *p, const float *g, float *m, float *v, float decay, float wd,
                              float b1, float w1, float b2, float w2, float bc2, float eps, float neg_step,
                              const float *skip)
{
    if (skip && *skip != 0.0f)
        return; /* loss scaling's skipped update */
    const bool has_wd = wd != 0.0f, has_decay = decay != 1.0f;
    GRID_STRIDE(i, n)
    {
        const float pi = has_decay ? __fmul_rn(p[i], decay) : p[i];
        const float gi = has_wd ? __fmaf_rn(pi, wd, g[i]) : g[i];
        const float mi = __fmaf_rn(gi, w1, __fmul_rn(m[i], b1));
        const float vi = __fmaf_rn(__fmul_rn(w2, gi), gi, __fmul_rn(v[i], b2));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2), eps);
        m[i] = mi;
        v[i] = vi;
        p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(neg_step, mi), denom));
    }
}

/* ==== the op table's entries =============================================== */

/*
 * Each entry is a template over the activation type T with the op table's
 * float signature: the fp32 table takes the float instance (the rt_cuda_*
 * names below), the 16-bit tables the bf16 and fp16 ones
 * (rt_cuda_elem_fill16), whose pointers hold T elements.
 */
#define TP(p) reinterpret_cast<const T *>(p)
#define TM(p) reinterpret_cast<T *>(p)

template <typename T> static void relu_fwd_t(struct rt_stream *s, size_t n, const float *x, float *y)
{
    if (n == 0)
        return;
    relu_fwd_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, TP(x), TM(y));
    RT_CUDA_LAUNCHED();
}

template <typename T>
static void relu_bwd_t(struct rt_stream *s, size_t n, const float *y, const float *dy, float beta, float *dx)
{
    if (n == 0)
        return;
    relu_bwd_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, TP(y), TP(dy), beta, TM(dx));
    RT_CUDA_LAUNCHED();
}

template <typename T> static void gelu_fwd_t(struct rt_stream *s, size_t n, const float *x, float *y)
{
    if (n == 0)
        return;
    gelu_fwd_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, TP(x), TM(y));
    RT_CUDA_LAUNCHED();
}

template <typename T>
static void gelu_bwd_t(struct rt_stream *s, size_t n, const float *x, const float *dy, float beta, float *dx)
{
    if (n == 0)
        return;
    gelu_bwd_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, TP(x), TP(dy), beta, TM(dx));
    RT_CUDA_LAUNCHED();
}

/* The layout of T's spatial tensors: NCHW in the fp32 table, NHWC in the 16-bit ones (nhwc16.cu). */
template <typename T> static enum rt_dropout_layout spatial_layout()
{
    return RT_DROPOUT_NHWC;
}
template <> enum rt_dropout_layout spatial_layout<float>()
{
    return RT_DROPOUT_NCHW;
}

template <typename T>
static void dropout_launch(struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,
                           uint64_t offset, const uint64_t *stream, const float *x, float beta, float *y)
{
    const size_t n = (size_t)sh.n * sh.c * sh.h * sh.w;
    if (n == 0)
        return;
    const enum rt_dropout_layout lay = spatial ? spatial_layout<T>() : RT_DROPOUT_FEATURES;
    /* on the host, the same float expression as elem.c; a draw made on the device keeps offset's low bits */
    const float scale = rt_dropout_scale(p);
    const size_t groups = (n + (size_t)(offset & 3u) + 3) / 4;
    dropout_k<T><<<grid_for(groups), THREADS, 0, rt_cuda_stream(s)>>>(n, lay, sh, p, scale, seed, offset, stream,
                                                                      TP(x), beta, TM(y));
    RT_CUDA_LAUNCHED();
}

template <typename T>
static void dropout_fwd_t(struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,
                          uint64_t offset, const uint64_t *stream, const float *x, float *y)
{
    dropout_launch<T>(s, sh, spatial, p, seed, offset, stream, x, 0.0f, y);
}

template <typename T>
static void dropout_bwd_t(struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,
                          uint64_t offset, const uint64_t *stream, const float *dy, float beta, float *dx)
{
    dropout_launch<T>(s, sh, spatial, p, seed, offset, stream, dy, beta, dx);
}

template <typename T> static void add_t(struct rt_stream *s, size_t n, const float *a, const float *b, float *y)
{
    if (n == 0)
        return;
    add_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, TP(a), TP(b), TM(y));
    RT_CUDA_LAUNCHED();
}

template <typename T> static void add_relu_fwd_t(struct rt_stream *s, size_t n, const float *a, const float *b, float *y)
{
    if (n == 0)
        return;
    add_relu_fwd_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, TP(a), TP(b), TM(y));
    RT_CUDA_LAUNCHED();
}

template <typename T>
static void add_relu_bwd_t(struct rt_stream *s, size_t n, const float *y, const float *dy, float beta_a, float *dxa,
                           float beta_b, float *dxb)
{
    if (n == 0 || (!dxa && !dxb))
        return;
    add_relu_bwd_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, TP(y), TP(dy), beta_a, TM(dxa), beta_b,
                                                                       TM(dxb));
    RT_CUDA_LAUNCHED();
}

template <typename T> static void scale_t(struct rt_stream *s, size_t n, float alpha, float *x)
{
    if (n == 0)
        return;
    scale_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, alpha, TM(x));
    RT_CUDA_LAUNCHED();
}

template <typename T> static void axpy_t(struct rt_stream *s, size_t n, float alpha, const float *x, float *y)
{
    if (n == 0)
        return;
    axpy_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, alpha, TP(x), TM(y));
    RT_CUDA_LAUNCHED();
}

/* 16-bit logits are widened to float per element; the sums stay double, dlogits is rounded once into T. */
template <typename T>
static void xent_t(struct rt_stream *s, int n, int k, const float *logits, const int32_t *labels,
                   float label_smoothing, float grad_scale, const float *loss_scale, struct rt_loss_stats *stats,
                   float *dlogits)
{
    if (n <= 0 || k <= 0)
        return;
    const cudaStream_t st = rt_cuda_stream(s);
    /* the smoothing weights in double from the value the user typed, as elem.c */
    const double eps = rt_decimal_double(label_smoothing);
    const double on = 1.0 - eps, off = eps / k;
    double *rows = (double *)rt_cuda_workspace(s, 3 * (size_t)n * sizeof(double));
    size_t blocks = ((size_t)n + XENT_ROWS - 1) / XENT_ROWS;
    if (blocks > MAX_BLOCKS)
        blocks = MAX_BLOCKS;
    xent_rows_k<T><<<(unsigned)blocks, THREADS, 0, st>>>(n, k, TP(logits), labels, eps, on, off, grad_scale,
                                                          loss_scale, rows, TM(dlogits));
    RT_CUDA_LAUNCHED();
    xent_stats_k<<<1, THREADS, 0, st>>>(n, rows, stats);
    RT_CUDA_LAUNCHED();
}

template <typename T> static void sumsq_t(struct rt_stream *s, size_t n, const float *x, float *out)
{
    const cudaStream_t st = rt_cuda_stream(s);
    const unsigned nb = red_blocks(n);
    double *part = (double *)rt_cuda_workspace(s, nb * sizeof(double));
    /* n == 0 still runs: *out must become 0 */
    sumsq_part_k<T><<<nb, THREADS, 0, st>>>(n, TP(x), part);
    RT_CUDA_LAUNCHED();
    sumsq_final_k<<<1, THREADS, 0, st>>>(nb, part, out);
    RT_CUDA_LAUNCHED();
}

template <typename T> static void count_nonfinite_t(struct rt_stream *s, size_t n, const float *x, float *out)
{
    const cudaStream_t st = rt_cuda_stream(s);
    const unsigned nb = red_blocks(n);
    unsigned long long *part = (unsigned long long *)rt_cuda_workspace(s, nb * sizeof(unsigned long long));
    nonfinite_part_k<T><<<nb, THREADS, 0, st>>>(n, TP(x), part);
    RT_CUDA_LAUNCHED();
    nonfinite_final_k<<<1, THREADS, 0, st>>>(nb, part, out);
    RT_CUDA_LAUNCHED();
}

#undef TP
#undef TM

void rt_cuda_relu_fwd(struct rt_stream *s, size_t n, const float *x, float *y)
{
    relu_fwd_t<float>(s, n, x, y);
}

void rt_cuda_relu_bwd(struct rt_stream *s, size_t n, const float *y, const float *dy, float beta, float *dx)
{
    relu_bwd_t<float>(s, n, y, dy, beta, dx);
}

void rt_cuda_gelu_fwd(struct rt_stream *s, size_t n, const float *x, float *y)
{
    gelu_fwd_t<float>(s, n, x, y);
}

void rt_cuda_gelu_bwd(struct rt_stream *s, size_t n, const float *x, const float *dy, float beta, float *dx)
{
    gelu_bwd_t<float>(s, n, x, dy, beta, dx);
}

void rt_cuda_dropout_fwd(struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,
                         uint64_t offset, const uint64_t *stream, const float *x, float *y)
{
    dropout_fwd_t<float>(s, sh, spatial, p, seed, offset, stream, x, y);
}

void rt_cuda_dropout_bwd(struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,
                         uint64_t offset, const uint64_t *stream, const float *dy, float beta, float *dx)
{
    dropout_bwd_t<float>(s, sh, spatial, p, seed, offset, stream, dy, beta, dx);
}

void rt_cuda_add(struct rt_stream *s, size_t n, const float *a, const float *b, float *y)
{
    add_t<float>(s, n, a, b, y);
}

void rt_cuda_add_relu_fwd(struct rt_stream *s, size_t n, const float *a, const float *b, float *y)
{
    add_relu_fwd_t<float>(s, n, a, b, y);
}

void rt_cuda_add_relu_bwd(struct rt_stream *s, size_t n, const float *y, const float *dy, float beta_a, float *dxa,
                          float beta_b, float *dxb)
{
    add_relu_bwd_t<float>(s, n, y, dy, beta_a, dxa, beta_b, dxb);
}

void rt_cuda_scale(struct rt_stream *s, size_t n, float alpha, float *x)
{
    rt_cuda_wrote(s, x, n * sizeof(float));
    scale_t<float>(s, n, alpha, x);
}

void rt_cuda_axpy(struct rt_stream *s, size_t n, float alpha, const float *x, float *y)
{
    rt_cuda_wrote(s, y, n * sizeof(float));
    axpy_t<float>(s, n, alpha, x, y);
}

void rt_cuda_xent_fwd_bwd(struct rt_stream *s, int n, int k, const float *logits, const int32_t *labels,
                          float label_smoothing, float grad_scale, const float *loss_scale,
                          struct rt_loss_stats *stats, float *dlogits)
{
    xent_t<float>(s, n, k, logits, labels, label_smoothing, grad_scale, loss_scale, stats, dlogits);
}

void rt_cuda_sumsq(struct rt_stream *s, size_t n, const float *x, float *out)
{
    sumsq_t<float>(s, n, x, out);
}

void rt_cuda_count_nonfinite(struct rt_stream *s, size_t n, const float *x, float *out)
{
    count_nonfinite_t<float>(s, n, x, out);
}

void rt_cuda_clip_scale(struct rt_stream *s, size_t n, const float *sumsq, float max_norm, float *x)
{
    rt_cuda_wrote(s, x, n * sizeof(float));
    if (n == 0)
        return;
    clip_scale_k<<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, sumsq, max_norm, x);
    RT_CUDA_LAUNCHED();
}

template <typename T> static void elem_fill(struct rt_ops *t)
{
    t->relu_fwd = relu_fwd_t<T>;
    t->relu_bwd = relu_bwd_t<T>;
    t->gelu_fwd = gelu_fwd_t<T>;
    t->gelu_bwd = gelu_bwd_t<T>;
    t->dropout_fwd = dropout_fwd_t<T>;
    t->dropout_bwd = dropout_bwd_t<T>;
    t->add = add_t<T>;
    t->add_relu_fwd = add_relu_fwd_t<T>;
    t->add_relu_bwd = add_relu_bwd_t<T>;
    t->scale = scale_t<T>;
    t->axpy = axpy_t<T>;
    t->xent_fwd_bwd = xent_t<T>;
    t->sumsq = sumsq_t<T>;
    t->count_nonfinite = count_nonfinite_t<T>;
}

void rt_cuda_elem_fill16(struct rt_ops *t, enum rt_dtype dt)
{
    if (dt == RT_BF16)
        elem_fill<__nv_bfloat16>(t);
    else
        elem_fill<__half>(t);
}

void rt_cuda_unscale_check(struct rt_stream *s, size_t n, float *g, const float *scale, float *found)
{
    const cudaStream_t st = rt_cuda_stream(s);
    RT_CUDA_CHECK(cudaMemsetAsync(found, 0, sizeof(float), st));
    if (n == 0)
        return;
    unscale_check_k<<<grid_for(n), THREADS, 0, st>>>(n, g, scale, found);
    RT_CUDA_LAUNCHED();
}

void rt_cuda_scaler_update(struct rt_stream *s, float *scale, float *good, const float *found, float growth,
                           float backoff, int growth_interval)
{
    scaler_update_k<<<1, 1, 0, rt_cuda_stream(s)>>>(scale, good, found, growth, backoff, growth_interval);
    RT_CUDA_LAUNCHED();
}

void rt_cuda_cast_f32_f16(struct rt_stream *s, size_t n, const float *x, uint16_t *y)
{
    if (n == 0)
        return;
    cast_f32_f16_k<<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, x, y);
    RT_CUDA_LAUNCHED();
}

void rt_cuda_cast_f16_f32(struct rt_stream *s, size_t n, const uint16_t *x, float *y)
{
    rt_cuda_wrote(s, y, n * sizeof(float));
    if (n == 0)
        return;
    cast_f16_f32_k<<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, x, y);
    RT_CUDA_LAUNCHED();
}

void rt_cuda_cast_f32_bf16(struct rt_stream *s, size_t n, const float *x, uint16_t *y)
{
    if (n == 0)
        return;
    cast_f32_bf16_k<<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, x, y);
    RT_CUDA_LAUNCHED();
}

void rt_cuda_cast_bf16_f32(struct rt_stream *s, size_t n, const uint16_t *x, float *y)
{
    rt_cuda_wrote(s, y, n * sizeof(float));
    if (n == 0)
        return;
    cast_bf16_f32_k<<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, x, y);
    RT_CUDA_LAUNCHED();
}

void rt_cuda_sgd_update(struct rt_stream *s, size_t n, float *p, const float *g, float *buf, float lr, float momentum,
                        float dampening, float weight_decay, int nesterov, int first, const float *skip)
{
    rt_cuda_wrote(s, p, n * sizeof(float));
    if (n == 0)
        return;
    /* the float scalars ATen receives from torch.optim.SGD's Python code (as elem.c's struct sgd_k holds them) */
    const float alpha_g = (float)(1.0 - rt_decimal_double(dampening));
    sgd_k<<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, p, g, buf, -lr, momentum, alpha_g, weight_decay,
                                                           nesterov, first, skip);
    RT_CUDA_LAUNCHED();
}

void rt_cuda_adam_update(struct rt_stream *s, size_t n, float *p, const float *g, float *m, float *v, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int decoupled, int64_t step,
                         const float *skip)
{
    rt_cuda_wrote(s, p, n * sizeof(float));
    if (n == 0)
        return;
    /* the float scalars ATen receives from torch.optim.Adam/AdamW's Python code (as elem.c's struct adam_k holds them) */
    const double lr_d = rt_decimal_double(lr), b1 = rt_decimal_double(beta1), b2 = rt_decimal_double(beta2);
    const double wd = rt_decimal_double(weight_decay), st = (double)step;
    const double bc1 = 1.0 - pow(b1, st), bc2 = 1.0 - pow(b2, st);
    const float decay = decoupled && weight_decay != 0.0f ? (float)(1.0 - lr_d * wd) : 1.0f;
    const float wd_f = decoupled ? 0.0f : weight_decay;
    const float w1 = (float)(1.0 - b1), w2 = (float)(1.0 - b2);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float neg_step = (float)-(lr_d / bc1);
    adam_k<<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, p, g, m, v, decay, wd_f, beta1, w1, beta2, w2,
                                                            bc2_sqrt, eps, neg_step, skip);
    RT_CUDA_LAUNCHED();
}
