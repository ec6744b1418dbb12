/*
 * fast_bn.cu - the CUDA backend's fast batchnorm kernels: rt_cuda_fast_bn_fill puts them in a fast table's
 * bn_train_fwd, bn_infer_fwd, bn_bwd and bn_infer_bwd, fp32 NCHW and bf16/fp16 NHWC, each honouring
 * rt_bn_desc.relu (a ReLU fused into the batchnorm, forward and backward: the table's bn_relu is 1). The
 * reference kernels (spatial.cu, nhwc16.cu) stay in the reference tables (rt_backend_ops_reference,
 * RINGTRAIN_CUDA_KERNELS=reference); they ignore relu, which their tables never ask for. What one thread does
 * is in fast_bn.cuh, host and device, so that tests/test_cuda_bodies_bn.cu runs it on the CPU; the kernels
 * here map blocks onto it and combine within a block. This file does not check shapes beyond its 32-bit
 * indices (the model did), and runs nothing but its own kernels.
 *
 * Kernels per op, all on the op's stream, none waiting on the host:
 *   bn_train_fwd  statistics (x) -> finalize (per channel: save_mean, save_invstd, running statistics, the
 *                 scale a) -> affine (y = (x - mean) a + beta, ReLU'd with relu)                      3 launches
 *   bn_bwd        statistics (x, dy; dy masked with relu) -> finalize (dgamma, dbeta added to; dx's
 *                 coefficients) -> dx (skipped when dx is NULL)                                       3 launches
 *   bn_infer_fwd  scale per channel -> affine                                                         2 launches
 *   bn_infer_bwd  scale per channel -> dx with grad_mean = proj = 0                                   2 launches
 *
 * Grids. A unit is V = 16 / sizeof(element) consecutive elements, one 16-byte load (fast_bn.cuh says when
 * scalar loads stand in for it, with the same arithmetic in the same order).
 *   NCHW (fp32, V = 4): a channel's N*H*W values, j = n*HW + p, in units of 4 along j, one multiply-high
 *     division by HW per unit to find (n, p). Statistics: one block per (channel, split), a split a run of
 *     `chunk` units that the block's 256 threads take in turn (thread t: units t, t + 256, ...); element-wise:
 *     one block per (channel, run of 4 * 256 units), thread t the units t + i*256, i < 4.
 *   NHWC (16 bits, V = 8): a row is one pixel's C channels; a thread owns one group of 8 channels of a row
 *     (per-channel accumulators and coefficients in registers: no index arithmetic per element). A block is
 *     gb groups (the fastest index, so a warp reads whole 128-byte lines) x rl = 256/gb row lanes, gb the
 *     power of two >= C/8, at most 8 (a tile of 64 channels; wider tensors take several tiles). Statistics:
 *     one block per (tile, split of `chunk` rows), row lane l taking rows l, l + rl, ...; element-wise: one
 *     block per (tile, run of 4*rl rows).
 *   Splits are made from the shape alone (fast_bn.cuh, bn_geo_split: about BN_TARGET_BLOCKS blocks, at least
 *   4 units per thread and 256 rows per NHWC split, at most BN_MAX_SPLITS = 1024 per channel), so the order of
 *   every sum is a function of (N, C, H, W): the same inputs give the same bits on every run and on every GPU,
 *   and resume stays exact.
 *
 * Summation order, fixed: a thread adds its units in increasing order, lanes in order, in double (d = x - k,
 * s1 += d, s2 = fma(d, d, s2) forward; g, g (x - mean) backward); a statistics block then combines its
 * threads -- NCHW by block_tree_sum (fast.cuh: warp butterfly, then a tree over warps), NHWC over its row
 * lanes by a halving tree in shared memory (bn_rows_tree_replay is the CPU's replay) -- and writes one
 * partial per (quantity, channel, split) to part[(q*C + c)*splits + s], a channel's partials contiguous. The
 * finalize is one block per channel: thread t adds partials t, t + 256, ... (at most 4) in order, then
 * block_tree_sum; thread 0 computes the scalars by the CPU's double formulas. No atomics anywhere.
 *
 * Bytes moved, e the element size (4 fp32, 2 bf16/fp16), n = N*C*H*W; the per-channel partials (16 bytes x
 * C x splits, written once and read once, each at most 3.2 % of n e in 16 bits and 0.1 % in fp32) and the
 * per-channel coefficients aside:
 *   bn_train_fwd  3 n e: x read by the statistics and again by the affine pass, y written
 *   bn_bwd        5 n e (6 n e with beta_dx 1): x and dy read twice, dx written (and read)
 *   bn_infer_fwd  2 n e;  bn_infer_bwd  3 n e (4 with beta_dx 1)
 * That is the least a two-pass batchnorm moves: the statistics must see all of x before the first y is
 * known. The fused ReLU adds no pass: unfused, relu_fwd in place (2 n e) and relu_bwd (3 n e) come on top, so
 * a BN + ReLU unit moves 3 + 5 = 8 n e here against 13 n e before. The element-wise pass walks its blocks in
 * reverse (the first block launched takes the last rows): the statistics pass read those last, so with the
 * L2 cache (50 MB on an H200) part of the second read of x (and dy) may come from it instead of memory.
 *
 * Sizes: every index is 32-bit; a tensor of 2^31 elements or more aborts with a message naming the way back
 * (the reference kernels index in 64 bits). Scratch: rt_cuda_workspace, stream-ordered, taken once per op.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>

#include "common/common.h"
#include "compute/cuda/cuda_be.h"
#include "compute/cuda/fast_bn.cuh"

/* ==== kernels ================================================================================================ */

/* NCHW statistics: block (channel c, split s) of a grid of splits * C blocks. */
template <int BWD>
static __global__ __launch_bounds__(FK_THREADS) void bn_nchw_stats_k(bn_geo g, const float *x, const float *dy, int vec,
                                                                     const float *save_mean, const float *save_invstd,
                                                                     const float *gamma, const float *beta, int relu,
                                                                     double *part)
{
    __shared__ double sh[FK_WARPS];
    const uint32_t c = blockIdx.x / g.splits, s = blockIdx.x - c * g.splits;
    const bn_sum_k k = bn_nchw_sum_k<BWD>(g, x, save_mean, save_invstd, gamma, beta, c, relu);
    double a, b;
    bn_nchw_stats_thread<BWD>(g, x, dy, vec, c, s, threadIdx.x, k, relu, a, b);
    a = block_tree_sum(a, sh);
    b = block_tree_sum(b, sh);
    if (threadIdx.x == 0) {
        part[bn_part_at(g, 0, c, s)] = a;
        part[bn_part_at(g, 1, c, s)] = b;
    }
}

/* NHWC statistics: block (tile, split s) of a grid of splits * tiles blocks; the row lanes' sums combined by the
 * halving tree of bn_rows_tree_replay, in shared memory. */
template <typename T, int BWD>
static __global__ __launch_bounds__(FK_THREADS, 2) void bn_nhwc_stats_k(bn_geo g, const T *x, const T *dy, int vec,
                                                                     const float *save_mean, const float *save_invstd,
                                                                     const float *gamma, const float *beta, int relu,
                                                                     double *part)
{
    constexpr int V = FK_VEC(T);
    __shared__ double sh[2][V][FK_THREADS];
    const uint32_t t = threadIdx.x, tile = blockIdx.x / g.splits, s = blockIdx.x - tile * g.splits;
    const uint32_t gl = t & (g.gb - 1), lane = t >> g.lg_gb, grp = tile * g.gb + gl;
    bn_sum_k k[V];
    bn_nhwc_sum_k<T, BWD>(g, x, save_mean, save_invstd, gamma, beta, grp, relu, k);
    double a[V], b[V];
    bn_nhwc_stats_thread<T, BWD>(g, x, dy, vec, tile, s, t, k, relu, a, b);
    for (int e = 0; e < V; e++) {
        sh[0][e][t] = a[e];
        sh[1][e][t] = b[e];
    }
    __syncthreads();
    for (uint32_t h = g.rl / 2; h > 0; h /= 2) {
        if (lane < h)
            for (int e = 0; e < V; e++) {
                sh[0][e][t] += sh[0][e][t + h * g.gb];
                sh[1][e][t] += sh[1][e][t + h * g.gb];
            }
        __syncthreads();
    }
    if (lane == 0 && grp < g.units)
        for (int e = 0; e < V && grp * V + (uint32_t)e < g.c; e++) {
            part[bn_part_at(g, 0, grp * V + e, s)] = sh[0][e][gl];
            part[bn_part_at(g, 1, grp * V + e, s)] = sh[1][e][gl];
        }
}

/* Training forward's finalize: block c; the shift is x's element (0, c, 0, 0), at c * kstride. */
template <typename T>
static __global__ __launch_bounds__(FK_THREADS) void bn_fwd_final_k(bn_geo g, const double *part, const T *x,
                                                                    uint32_t kstride, bn_fwd_q q, const float *gamma,
                                                                    float *running_mean, float *running_var,
                                                                    float *save_mean, float *save_invstd, float *coef_a)
{
    __shared__ double sh[FK_WARPS];
    const uint32_t c = blockIdx.x;
    double a, b;
    bn_final_thread(g, part, c, threadIdx.x, a, b);
    a = block_tree_sum(a, sh);
    b = block_tree_sum(b, sh);
    if (threadIdx.x == 0)
        bn_fwd_scalars(a, b, (double)fk_ld(x[(size_t)c * kstride]), q, gamma[c], running_mean + c, running_var + c,
                       save_mean + c, save_invstd + c, coef_a + c);
}

/* Backward's finalize: block c; dx's coefficients into gm, pj, sc, and the fused ReLU's scale into ra. */
static __global__ __launch_bounds__(FK_THREADS) void bn_bwd_final_k(bn_geo g, const double *part, const float *gamma,
                                                                    const float *save_invstd, float *dgamma,
                                                                    float *dbeta, float *gm, float *pj, float *sc,
                                                                    float *ra)
{
    __shared__ double sh[FK_WARPS];
    const uint32_t c = blockIdx.x;
    double a, b;
    bn_final_thread(g, part, c, threadIdx.x, a, b);
    a = block_tree_sum(a, sh);
    b = block_tree_sum(b, sh);
    if (threadIdx.x == 0) {
        bn_bwd_scalars(a, b, (double)g.m, save_invstd[c], gamma[c], dgamma + c, dbeta + c, gm + c, pj + c, sc + c);
        ra[c] = fk_mul(save_invstd[c], gamma[c]);
    }
}

/* Inference's scale per channel; zero (when not NULL) gets 0s: bn_infer_bwd's grad_mean and proj. */
static __global__ void bn_infer_coef_k(uint32_t c, const float *running_var, double eps, const float *gamma, float *a,
                                       float *zero)
{
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= c)
        return;
    a[i] = bn_infer_scale(running_var[i], eps, gamma[i]);
    if (zero)
        zero[i] = 0.0f;
}

/* Element-wise passes: block gridDim.x - 1 - blockIdx.x of the layout's grid (reversed: file comment). */
static __global__ __launch_bounds__(FK_THREADS) void bn_nchw_affine_k(bn_geo g, const float *x, float *y, int vec,
                                                                      const float *mean, const float *a,
                                                                      const float *b, int relu)
{
    bn_nchw_affine_thread(g, x, y, vec, mean, a, b, relu, gridDim.x - 1 - blockIdx.x, threadIdx.x);
}

template <typename T>
static __global__ __launch_bounds__(FK_THREADS) void bn_nhwc_affine_k(bn_geo g, const T *x, T *y, int vec,
                                                                      const float *mean, const float *a,
                                                                      const float *b, int relu)
{
    bn_nhwc_affine_thread<T>(g, x, y, vec, mean, a, b, relu, gridDim.x - 1 - blockIdx.x, threadIdx.x);
}

static __global__ __launch_bounds__(FK_THREADS) void bn_nchw_dx_k(bn_geo g, const float *x, const float *dy, float *dx,
                                                                  int vec, bn_dx_arrays p, int relu, float beta_dx)
{
    bn_nchw_dx_thread(g, x, dy, dx, vec, p, relu, beta_dx, gridDim.x - 1 - blockIdx.x, threadIdx.x);
}

template <typename T>
static __global__ __launch_bounds__(FK_THREADS, 2) void bn_nhwc_dx_k(bn_geo g, const T *x, const T *dy, T *dx, int vec,
                                                                  bn_dx_arrays p, int relu, float beta_dx)
{
    bn_nhwc_dx_thread<T>(g, x, dy, dx, vec, p, relu, beta_dx, gridDim.x - 1 - blockIdx.x, threadIdx.x);
}

/* ==== launches ================================================================================================ */

/* fp32 tables are NCHW, 16-bit ones NHWC. */
template <typename T> static constexpr int bn_nhwc()
{
    return sizeof(T) == 2;
}

/*
 * The geometry of a call on `in`, or 0 when there is nothing to do (no element). Aborts, naming the way back,
 * on 2^31 elements or more: the kernels' indices are 32-bit.
 */
template <typename T> static int bn_geo_of(struct rt_shape4 in, const char *op, bn_geo *g)
{
    const size_t n = (size_t)in.n * in.c * in.h * in.w;
    if (n == 0)
        return 0;
    if (n > (size_t)INT32_MAX) {
        char msg[200];
        snprintf(msg, sizeof(msg),
                 "%s on (%d,%d,%d,%d): %zu elements, above the fast kernels' 32-bit indices (RINGTRAIN_CUDA_KERNELS="
                 "reference runs it)",
                 op, in.n, in.c, in.h, in.w, n);
        rt_cuda_fail("ringtrain", EOVERFLOW, msg, "fast batchnorm", __FILE__, __LINE__);
    }
    const uint32_t hw = (uint32_t)in.h * (uint32_t)in.w;
    *g = bn_nhwc<T>() ? bn_geo_nhwc<T>((uint32_t)in.n * hw, (uint32_t)in.c)
                      : bn_geo_nchw((uint32_t)in.n, (uint32_t)in.c, hw);
    return 1;
}

/* Workspace: the partials (2 * C * splits doubles, when `splits`), then `arrays` float arrays of C (each
 * starting 16-byte aligned). */
struct bn_ws {
    double *part;
    float *f[4];
};

static bn_ws bn_ws_take(struct rt_stream *s, const bn_geo &g, int splits, int arrays)
{
    const size_t np = splits ? 2 * (size_t)g.c * g.splits : 0, cp = ((size_t)g.c + 3) / 4 * 4;
    char *w = (char *)rt_cuda_workspace(s, np * sizeof(double) + (size_t)arrays * cp * sizeof(float));
    bn_ws r;
    r.part = (double *)w;
    for (int i = 0; i < 4; i++)
        r.f[i] = i < arrays ? (float *)(w + np * sizeof(double)) + (size_t)i * cp : NULL;
    return r;
}

/* The statistics pass into part (BWD: sums of dy and dy (x - mean), dy masked with relu). */
template <typename T, int BWD>
static void bn_stats(struct rt_stream *s, const bn_geo &g, const T *x, const T *dy, const float *save_mean,
                     const float *save_invstd, const float *gamma, const float *beta, int relu, double *part)
{
    const cudaStream_t st = rt_cuda_stream(s);
    const int vec = g.vec_ok && fk_aligned(x) && fk_aligned(dy);
    if constexpr (bn_nhwc<T>())
        bn_nhwc_stats_k<T, BWD><<<g.splits * g.tiles, FK_THREADS, 0, st>>>(g, x, dy, vec, save_mean, save_invstd, gamma,
                                                                           beta, relu, part);
    else
        bn_nchw_stats_k<BWD><<<g.splits * g.c, FK_THREADS, 0, st>>>(g, (const float *)x, (const float *)dy, vec,
                                                                     save_mean, save_invstd, gamma, beta, relu, part);
    RT_CUDA_LAUNCHED();
}

/* y = (x - mean) a + b per channel, ReLU'd with relu. */
template <typename T>
static void bn_affine(struct rt_stream *s, const bn_geo &g, const T *x, T *y, const float *mean, const float *a,
                      const float *b, int relu)
{
    const cudaStream_t st = rt_cuda_stream(s);
    const int vec = g.vec_ok && fk_aligned(x) && fk_aligned(y);
    if constexpr (bn_nhwc<T>())
        bn_nhwc_affine_k<T><<<g.eblocks * g.tiles, FK_THREADS, 0, st>>>(g, x, y, vec, mean, a, b, relu);
    else
        bn_nchw_affine_k<<<g.eblocks * g.c, FK_THREADS, 0, st>>>(g, (const float *)x, (float *)y, vec, mean, a, b,
                                                                 relu);
    RT_CUDA_LAUNCHED();
}

template <typename T>
static void bn_dx(struct rt_stream *s, const bn_geo &g, const T *x, const T *dy, T *dx, const bn_dx_arrays &p,
                  int relu, float beta_dx)
{
    const cudaStream_t st = rt_cuda_stream(s);
    const int vec = g.vec_ok && fk_aligned(x) && fk_aligned(dy) && fk_aligned(dx);
    if constexpr (bn_nhwc<T>())
        bn_nhwc_dx_k<T><<<g.eblocks * g.tiles, FK_THREADS, 0, st>>>(g, x, dy, dx, vec, p, relu, beta_dx);
    else
        bn_nchw_dx_k<<<g.eblocks * g.c, FK_THREADS, 0, st>>>(g, (const float *)x, (const float *)dy, (float *)dx, vec,
                                                             p, relu, beta_dx);
    RT_CUDA_LAUNCHED();
}

static unsigned bn_blocks_for(uint32_t n)
{
    return (n + FK_THREADS - 1) / FK_THREADS;
}

/* ==== the ops ================================================================================================= */

template <typename T>
static void fast_bn_train_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                              const float *beta, float *running_mean, float *running_var, float *save_mean,
                              float *save_invstd, float *y)
{
    bn_geo g;
    if (!bn_geo_of<T>(d->in, "bn_train_fwd", &g))
        return;
    const T *xt = (const T *)x;
    const bn_ws w = bn_ws_take(s, g, 1, 1);
    bn_stats<T, 0>(s, g, xt, NULL, NULL, NULL, NULL, NULL, 0, w.part);
    bn_fwd_q q;
    q.m = (double)g.m;
    q.eps = rt_decimal_double(d->eps);
    q.mom = rt_decimal_double(d->momentum);
    q.keep = 1.0 - q.mom;
    /* PyTorch refuses one value per channel in training; the CPU then keeps the biased variance (0). */
    q.unbias = g.m > 1 ? (double)g.m / (double)(g.m - 1) : 1.0;
    bn_fwd_final_k<T><<<g.c, FK_THREADS, 0, rt_cuda_stream(s)>>>(g, w.part, xt, bn_nhwc<T>() ? 1u : g.hw, q, gamma,
                                                                 running_mean, running_var, save_mean, save_invstd,
                                                                 w.f[0]);
    RT_CUDA_LAUNCHED();
    bn_affine<T>(s, g, xt, (T *)y, save_mean, w.f[0], beta, d->relu);
}

template <typename T>
static void fast_bn_infer_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                              const float *beta, const float *running_mean, const float *running_var, float *y)
{
    bn_geo g;
    if (!bn_geo_of<T>(d->in, "bn_infer_fwd", &g))
        return;
    const bn_ws w = bn_ws_take(s, g, 0, 1);
    bn_infer_coef_k<<<bn_blocks_for(g.c), FK_THREADS, 0, rt_cuda_stream(s)>>>(g.c, running_var,
                                                                              rt_decimal_double(d->eps), gamma, w.f[0],
                                                                              NULL);
    RT_CUDA_LAUNCHED();
    bn_affine<T>(s, g, (const T *)x, (T *)y, running_mean, w.f[0], beta, d->relu);
}

template <typename T>
static void fast_bn_bwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                        const float *gamma, const float *beta, const float *save_mean, const float *save_invstd,
                        float beta_dx, float *dx, float *dgamma, float *dbeta)
{
    bn_geo g;
    if (!bn_geo_of<T>(d->in, "bn_bwd", &g))
        return;
    const T *xt = (const T *)x, *gt = (const T *)dy;
    const bn_ws w = bn_ws_take(s, g, 1, 4);
    bn_stats<T, 1>(s, g, xt, gt, save_mean, save_invstd, gamma, beta, d->relu, w.part);
    bn_bwd_final_k<<<g.c, FK_THREADS, 0, rt_cuda_stream(s)>>>(g, w.part, gamma, save_invstd, dgamma, dbeta, w.f[0],
                                                              w.f[1], w.f[2], w.f[3]);
    RT_CUDA_LAUNCHED();
    if (!dx)
        return;
    bn_dx_arrays p;
    p.mu = save_mean;
    p.gm = w.f[0];
    p.pj = w.f[1];
    p.sc = w.f[2];
    p.ra = w.f[3];
    p.rb = beta;
    bn_dx<T>(s, g, xt, gt, (T *)dx, p, d->relu, beta_dx);
}

/* dx = beta_dx dx + dy a, a the forward's scale: the dx pass with grad_mean = proj = 0 (dy - 0 - (x - mean) 0 is
 * dy for every finite x, as on the CPU), the fused ReLU's mask from the forward's operands (running_mean, a,
 * beta). */
template <typename T>
static void fast_bn_infer_bwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                              const float *gamma, const float *beta, const float *running_mean,
                              const float *running_var, float beta_dx, float *dx)
{
    bn_geo g;
    if (!dx || !bn_geo_of<T>(d->in, "bn_infer_bwd", &g))
        return;
    const bn_ws w = bn_ws_take(s, g, 0, 2);
    bn_infer_coef_k<<<bn_blocks_for(g.c), FK_THREADS, 0, rt_cuda_stream(s)>>>(g.c, running_var,
                                                                              rt_decimal_double(d->eps), gamma, w.f[0],
                                                                              w.f[1]);
    RT_CUDA_LAUNCHED();
    bn_dx_arrays p;
    p.mu = running_mean;
    p.gm = w.f[1];
    p.pj = w.f[1];
    p.sc = w.f[0];
    p.ra = w.f[0];
    p.rb = beta;
    bn_dx<T>(s, g, (const T *)x, (const T *)dy, (T *)dx, p, d->relu, beta_dx);
}

template <typename T> static void fast_bn_fill_t(struct rt_ops *t)
{
    t->bn_train_fwd = fast_bn_train_fwd<T>;
    t->bn_infer_fwd = fast_bn_infer_fwd<T>;
    t->bn_bwd = fast_bn_bwd<T>;
    t->bn_infer_bwd = fast_bn_infer_bwd<T>;
    t->bn_relu = 1;
}

void rt_cuda_fast_bn_fill(struct rt_ops *t, enum rt_dtype dt)
{
    if (dt == RT_BF16)
        fast_bn_fill_t<__nv_bfloat16>(t);
    else if (dt == RT_F16)
        fast_bn_fill_t<__half>(t);
    else
        fast_bn_fill_t<float>(t);
}
