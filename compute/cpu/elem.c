/*
 * elem.c - the CPU backend's per-element and per-channel kernels: the uint8
 * input transform, batchnorm, ReLU/GELU, dropout, add/scale/axpy, the
 * softmax cross-entropy loss, the flat-buffer reductions (sum of squares,
 * non-finite count), the f16/bf16 casts and the SGD/Adam updates. compute.h
 * (struct rt_ops) says what each computes; cpu.h lists them.
 *
 * It does not do convolution, pooling, linear layers or layout conversion
 * (conv.c, pool.c), and it never allocates: the input lookup table and the
 * per-call partial sums live in the backend's scratch buffer.
 *
 * Spatial tensors are in either of the CPU layouts (cpu.h): channel-major
 * (C, N, H, W), where a channel is one contiguous row of N*H*W floats, or
 * blocked nChw16c (C a multiple of 16), where block plane j = n*(C/16) +
 * c/16 holds H*W pixels of 16 channels and the per-channel kernels run with
 * the 16 channels as vector lanes.
 *
 * Threading. Every parallel loop is `omp parallel for schedule(static)` over
 * fixed-size chunks (element ops), channels (channel-major batchnorm) or
 * block planes (blocked batchnorm), with the backend's thread count.
 * Reductions never use float atomics: a channel's statistics are summed in
 * double in a fixed order -- by one thread, or per block plane and then over
 * the images in order -- and flat-buffer sums are per-chunk doubles added in
 * chunk order, so results do not even depend on the thread count.
 *
 * Dropout's mask. Element (n, c, h, w) of a call with (seed, offset) draws
 * Philox stream element e = offset + its logical NCHW index, not its place
 * in memory (compute.h; compute/dropout_index.h draws, for every backend).
 * Any thread can compute any element's draw, so chunks need no shared
 * state, backward regenerates the same mask, and another backend and layout
 * reproduce it bit for bit. Memory is walked a tile at a time; within an
 * (n, c) plane the logical index advances by one per pixel -- contiguous in
 * (C, N, H, W), 16 floats apart in nChw16c -- so a plane shares Philox
 * blocks between 4 consecutive pixels as a flat buffer does.
 *
 * Optimizers follow PyTorch 1.13's single-tensor torch.optim code operation
 * by operation, with fused multiply-adds where ATen's AVX2 kernels fuse,
 * and the Python-side scalars (1 - beta1, lr / (1 - beta1^step), ...)
 * computed in double as Python does before ATen rounds them to float.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compute/cpu/cpu.h"
#include "compute/dropout_index.h"

/* Clang would otherwise fuse a * b + c where FMA exists (GCC does not under
 * -std=c17), and the result would depend on the machine's clone. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/*
 * The batchnorm normalising loops (and the blocked layout's sums) and the
 * optimizer loops get an AVX2+FMA clone picked at load time (the portable
 * build is SSE2 only, where fmaf is a library call). The clones compute the
 * same bits: a * b + c is not contracted (above), fmaf is exact in both,
 * and a vector of lanes adds each lane in the scalar order. Sanitizer builds define
 * RT_NO_IFUNC: their runtimes crash in ifunc resolvers.
 */
#if defined(__x86_64__) && !defined(RT_NO_IFUNC)
#define ELEM_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ELEM_CLONES
#endif

#define BLK RT_CPU_BLOCK

/* Elements per parallel chunk: big enough to amortise the loop overhead, small
 * enough to balance threads on the smallest activation tensors. */
#define CHUNK ((size_t)16384)
/* Below this many elements an op runs on the calling thread: waking the team
 * costs more than the work. */
#define PAR_MIN ((size_t)32768)

static inline int nthreads(const struct rt_stream *s)
{
    return s->be->threads > 0 ? s->be->threads : 1;
}

static inline size_t nchunks(size_t n)
{
    return (n + CHUNK - 1) / CHUNK;
}

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Scratch for per-call partial results; aborts as rt_cpu_scratch() says when memory is exhausted. */
static void *scratch(struct rt_stream *s, size_t bytes)
{
    void *p = rt_cpu_scratch(s, bytes);
    if (!p) {
        fprintf(stderr, "ringtrain: out of memory for %zu bytes of kernel scratch\n", bytes);
        abort();
    }
    return p;
}

/* ==== input ================================================================ */

void rt_cpu_input_u8(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *host_images, const float *mean,
                     const float *std, float *y)
{
    const size_t n = (size_t)sh.n, c = (size_t)sh.c, hw = (size_t)sh.h * sh.w;
    /* A 256-entry table per channel evaluates the exact expression once per
     * byte value, so every pixel gets the bit-identical result without a
     * division per pixel. */
    float *lut = scratch(s, c * 256 * sizeof(float));
    rt_norm_lut((uint32_t)c, mean, std, lut);

    if (rt_cpu_blocked(sh)) {
        /* block plane j = img*(C/16) + c0/16 reads the 16 image planes that start at j*16*hw */
        const size_t blocks = n * (c / BLK);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (blocks * BLK * hw >= PAR_MIN)
        for (size_t j = 0; j < blocks; j++) {
            const size_t c0 = j % (c / BLK) * BLK;
            const uint8_t *src = host_images + j * BLK * hw;
            float *dst = y + j * BLK * hw;
            for (size_t i = 0; i < hw; i++)
                for (size_t l = 0; l < BLK; l++)
                    dst[i * BLK + l] = lut[(c0 + l) * 256 + src[l * hw + i]];
        }
        return;
    }
    const size_t rows = n * c;
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (rows * hw >= PAR_MIN)
    for (size_t r = 0; r < rows; r++) {
        const size_t ch = r / n, img = r % n; /* rows in output order: (c, n) */
        const uint8_t *src = host_images + (img * c + ch) * hw;
        const float *t = lut + ch * 256;
        float *dst = y + r * hw;
        for (size_t i = 0; i < hw; i++)
            dst[i] = t[src[i]];
    }
}

/* Host memory is the CPU's device memory: the upload's buffer is the host batch itself. */
void rt_cpu_input_u8_dev(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *dev_images, const float *mean,
                         const float *std, float *y)
{
    rt_cpu_input_u8(s, sh, dev_images, mean, std, y);
}

/* ==== batchnorm ============================================================ */

/*
 * Double-precision sums over a row keep eight partial sums (four vectors of
 * two) per quantity, added in a fixed order at the end: a single accumulator
 * would make the loop wait on the adder's latency rather than on memory.
 * Two-double vectors are native to every x86-64 (SSE2), so the partials stay
 * in registers without a per-ISA clone; the four are spelled out because -O2
 * does not unroll a loop over them. The order of additions is fixed, so the
 * sums are the same on every machine.
 */
typedef double v2d __attribute__((vector_size(16)));

static inline v2d pair(const float *p)
{
    return (v2d){p[0], p[1]};
}

static inline double hsum4(v2d a, v2d b, v2d c, v2d d)
{
    const v2d s = (a + b) + (c + d);
    return s[0] + s[1];
}

/*
 * Sums of (x - k) and (x - k)^2 over one channel, in double, with k = x[0]:
 * shifting by a sample of the channel keeps E[x^2] - E[x]^2 from cancelling
 * when the mean is large against the spread, at no extra pass.
 */
static void bn_row_sums(const float *x, size_t m, double *s1, double *s2)
{
    const double k = x[0];
    const v2d kv = {k, k};
    v2d a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
    size_t i = 0;
    for (; i + 8 <= m; i += 8) {
        const v2d d0 = pair(x + i) - kv, d1 = pair(x + i + 2) - kv;
        const v2d d2 = pair(x + i + 4) - kv, d3 = pair(x + i + 6) - kv;
        a0 += d0;
        a1 += d1;
        a2 += d2;
        a3 += d3;
        b0 += d0 * d0;
        b1 += d1 * d1;
        b2 += d2 * d2;
        b3 += d3 * d3;
    }
    double a = hsum4(a0, a1, a2, a3), b = hsum4(b0, b1, b2, b3);
    for (; i < m; i++) {
        const double d = (double)x[i] - k;
        a += d;
        b += d * d;
    }
    *s1 = a;
    *s2 = b;
}

/* y = (x - mean) * a + b: subtracting the mean first keeps the result accurate when |mean| >> std. With `relu`,
 * y = max(0, that) as rt_cpu_relu_fwd writes it (NaN passes). */
ELEM_CLONES static void bn_row_affine(const float *x, size_t m, float mean, float a, float b, int relu, float *y)
{
    if (relu) {
#pragma omp simd
        for (size_t i = 0; i < m; i++) {
            const float v = (x[i] - mean) * a + b;
            y[i] = v < 0.0f ? 0.0f : v;
        }
        return;
    }
#pragma omp simd
    for (size_t i = 0; i < m; i++)
        y[i] = (x[i] - mean) * a + b;
}

/* The gradient a fused ReLU passes back: dy where the batchnorm's output, recomputed exactly as the forward wrote
 * it, is > 0 (rt_cpu_relu_bwd's rule), else 0. */
static inline float bn_relu_grad(float dy, float x, float mean, float a, float b)
{
    return (x - mean) * a + b > 0.0f ? dy : 0.0f;
}

/* sum(dy) and sum(dy * (x - mean)) over one channel, in double. */
static void bn_row_bwd_sums(const float *x, const float *dy, size_t m, float mean, double *sdy,
                            double *sdyx)
{
    const double mu = mean;
    const v2d mv = {mu, mu};
    v2d a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
    size_t i = 0;
    for (; i + 8 <= m; i += 8) {
        const v2d g0 = pair(dy + i), g1 = pair(dy + i + 2), g2 = pair(dy + i + 4), g3 = pair(dy + i + 6);
        a0 += g0;
        a1 += g1;
        a2 += g2;
        a3 += g3;
        b0 += g0 * (pair(x + i) - mv);
        b1 += g1 * (pair(x + i + 2) - mv);
        b2 += g2 * (pair(x + i + 4) - mv);
        b3 += g3 * (pair(x + i + 6) - mv);
    }
    double a = hsum4(a0, a1, a2, a3), b = hsum4(b0, b1, b2, b3);
    for (; i < m; i++) {
        const double g = dy[i];
        a += g;
        b += g * ((double)x[i] - mu);
    }
    *sdy = a;
    *sdyx = b;
}

/* dx = beta_dx dx + (dy - grad_mean - (x - mean) proj) scale; beta_dx 0 never reads dx. */
ELEM_CLONES static void bn_row_bwd_dx(const float *x, const float *dy, size_t m, float mean, float grad_mean,
                                      float proj, float scale, float beta_dx, float *dx)
{
    if (beta_dx == 0.0f) {
#pragma omp simd
        for (size_t i = 0; i < m; i++)
            dx[i] = (dy[i] - grad_mean - (x[i] - mean) * proj) * scale;
    } else {
#pragma omp simd
        for (size_t i = 0; i < m; i++)
            dx[i] = beta_dx * dx[i] + (dy[i] - grad_mean - (x[i] - mean) * proj) * scale;
    }
}

/*
 * Blocked batchnorm. A channel's N*H*W values lie 16 floats apart in N
 * block planes, so the kernels take a block plane at a time and 16
 * channels as lanes: first the sums per block plane (in double, as above:
 * 16 independent lanes keep the adders busy without partial sums), then
 * per channel the sums over the images in order, then the element-wise
 * pass with per-lane constants. A blocked tensor has at least as many block
 * planes as images, so the batch keeps the threads busy when C is 16.
 */

/* Per-lane sums of (x - k) and (x - k)^2 over one block plane's hw pixels, in double. */
ELEM_CLONES static void bn_blk_sums(const float *x, size_t hw, const double *k, double *s1, double *s2)
{
    double a[BLK] = {0}, b[BLK] = {0};
    for (size_t i = 0; i < hw; i++) {
        const float *v = x + i * BLK;
#pragma omp simd
        for (int l = 0; l < BLK; l++) {
            const double dd = (double)v[l] - k[l];
            a[l] += dd;
            b[l] += dd * dd;
        }
    }
    for (int l = 0; l < BLK; l++) {
        s1[l] = a[l];
        s2[l] = b[l];
    }
}

/*
 * y = (x - mean) * a + b over one block plane, constants per lane:
 * bn_row_affine's expression. The constants are copied first: y might
 * alias them, so the compiler would otherwise reload them after each
 * store.
 */
ELEM_CLONES static void bn_blk_affine(const float *x, size_t hw, const float *mean, const float *a, const float *b,
                                      int relu, float *y)
{
    float mu[BLK], sc[BLK], sh[BLK];
    for (int l = 0; l < BLK; l++) {
        mu[l] = mean[l];
        sc[l] = a[l];
        sh[l] = b[l];
    }
    if (relu) {
        for (size_t i = 0; i < hw; i++) {
#pragma omp simd
            for (int l = 0; l < BLK; l++) {
                const float v = (x[i * BLK + l] - mu[l]) * sc[l] + sh[l];
                y[i * BLK + l] = v < 0.0f ? 0.0f : v;
            }
        }
        return;
    }
    for (size_t i = 0; i < hw; i++) {
#pragma omp simd
        for (int l = 0; l < BLK; l++)
            y[i * BLK + l] = (x[i * BLK + l] - mu[l]) * sc[l] + sh[l];
    }
}

/* Per-lane sum(dy) and sum(dy * (x - mean)) over one block plane, in double. With a fused ReLU (`ra` not NULL), dy
 * passes where (x - mean_f) * ra + rb > 0 (bn_relu_grad, per lane). */
ELEM_CLONES static void bn_blk_bwd_sums(const float *x, const float *dy, size_t hw, const double *mean,
                                        const float *mean_f, const float *ra, const float *rb, double *sdy,
                                        double *sdyx)
{
    double a[BLK] = {0}, b[BLK] = {0};
    if (ra) {
        float mu[BLK], sc[BLK], sh[BLK];
        for (int l = 0; l < BLK; l++) {
            mu[l] = mean_f[l];
            sc[l] = ra[l];
            sh[l] = rb[l];
        }
        for (size_t i = 0; i < hw; i++) {
            const float *v = x + i * BLK, *g = dy + i * BLK;
#pragma omp simd
            for (int l = 0; l < BLK; l++) {
                const double gd = bn_relu_grad(g[l], v[l], mu[l], sc[l], sh[l]);
                a[l] += gd;
                b[l] += gd * ((double)v[l] - mean[l]);
            }
        }
    } else {
        for (size_t i = 0; i < hw; i++) {
            const float *v = x + i * BLK, *g = dy + i * BLK;
#pragma omp simd
            for (int l = 0; l < BLK; l++) {
                const double gd = g[l];
                a[l] += gd;
                b[l] += gd * ((double)v[l] - mean[l]);
            }
        }
    }
    for (int l = 0; l < BLK; l++) {
        sdy[l] = a[l];
        sdyx[l] = b[l];
    }
}

/* bn_row_bwd_dx over one block plane, constants per lane (copied first, as in bn_blk_affine); with `ra`, the fused
 * ReLU's mask as in bn_blk_bwd_sums. */
ELEM_CLONES static void bn_blk_bwd_dx(const float *x, const float *dy, size_t hw, const float *mean,
                                      const float *grad_mean, const float *proj, const float *scale, const float *ra,
                                      const float *rb, float beta_dx, float *dx)
{
    float mu[BLK], gm[BLK], pj[BLK], sc[BLK];
    for (int l = 0; l < BLK; l++) {
        mu[l] = mean[l];
        gm[l] = grad_mean[l];
        pj[l] = proj[l];
        sc[l] = scale[l];
    }
    if (ra) {
        float a[BLK], b[BLK];
        for (int l = 0; l < BLK; l++) {
            a[l] = ra[l];
            b[l] = rb[l];
        }
        for (size_t i = 0; i < hw; i++) {
#pragma omp simd
            for (int l = 0; l < BLK; l++) {
                const float xv = x[i * BLK + l], g = bn_relu_grad(dy[i * BLK + l], xv, mu[l], a[l], b[l]);
                const float v = (g - gm[l] - (xv - mu[l]) * pj[l]) * sc[l];
                dx[i * BLK + l] = beta_dx == 0.0f ? v : beta_dx * dx[i * BLK + l] + v;
            }
        }
        return;
    }
    if (beta_dx == 0.0f) {
        for (size_t i = 0; i < hw; i++) {
#pragma omp simd
            for (int l = 0; l < BLK; l++)
                dx[i * BLK + l] = (dy[i * BLK + l] - gm[l] - (x[i * BLK + l] - mu[l]) * pj[l]) * sc[l];
        }
    } else {
        for (size_t i = 0; i < hw; i++) {
#pragma omp simd
            for (int l = 0; l < BLK; l++)
                dx[i * BLK + l] =
                    beta_dx * dx[i * BLK + l] + (dy[i * BLK + l] - gm[l] - (x[i * BLK + l] - mu[l]) * pj[l]) * sc[l];
        }
    }
}

/*
 * Scratch of a blocked batchnorm call: two double sums per (block plane,
 * lane), then four float constants and one double per channel.
 */
struct bn_blk_scratch {
    double *s1, *s2; /* [block plane * 16 + lane] */
    double *k;       /* per channel: the shift (forward) or the mean (backward), in double */
    float *f0, *f1, *f2, *f3;
};

static struct bn_blk_scratch bn_blk_scratch(struct rt_stream *s, size_t blocks, size_t c)
{
    const size_t nd = 2 * blocks * BLK + c;
    double *d = scratch(s, nd * sizeof(double) + 4 * c * sizeof(float));
    float *f = (float *)(d + nd);
    return (struct bn_blk_scratch){.s1 = d, .s2 = d + blocks * BLK, .k = d + 2 * blocks * BLK,
                                   .f0 = f, .f1 = f + c, .f2 = f + 2 * c, .f3 = f + 3 * c};
}

static void bn_train_fwd_blocked(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                                 const float *beta, float *running_mean, float *running_var, float *save_mean,
                                 float *save_invstd, float *y)
{
    const size_t c = (size_t)d->in.c, cb = c / BLK, hw = (size_t)d->in.h * d->in.w;
    const size_t n = (size_t)d->in.n, m = n * hw, blocks = n * cb;
    const double eps = rt_decimal_double(d->eps), mom = rt_decimal_double(d->momentum);
    const double unbias = m > 1 ? (double)m / (double)(m - 1) : 1.0;
    const struct bn_blk_scratch t = bn_blk_scratch(s, blocks, c);
    /* the shift of bn_row_sums: each channel's first value, (0, c, 0, 0) */
    for (size_t ch = 0; ch < c; ch++)
        t.k[ch] = x[(ch / BLK) * hw * BLK + ch % BLK];
#pragma omp parallel num_threads(nthreads(s)) if (c * m >= PAR_MIN)
    {
#pragma omp for schedule(static)
        for (size_t j = 0; j < blocks; j++)
            bn_blk_sums(x + j * hw * BLK, hw, t.k + j % cb * BLK, t.s1 + j * BLK, t.s2 + j * BLK);
#pragma omp for schedule(static)
        for (size_t ch = 0; ch < c; ch++) {
            double s1 = 0.0, s2 = 0.0;
            for (size_t img = 0; img < n; img++) {
                s1 += t.s1[(img * cb + ch / BLK) * BLK + ch % BLK];
                s2 += t.s2[(img * cb + ch / BLK) * BLK + ch % BLK];
            }
            const double dm = s1 / (double)m;
            double var = s2 / (double)m - dm * dm;
            if (var < 0.0)
                var = 0.0;
            const double mean = t.k[ch] + dm;
            const float mean_f = (float)mean, invstd_f = (float)(1.0 / sqrt(var + eps));
            save_mean[ch] = mean_f;
            save_invstd[ch] = invstd_f;
            running_mean[ch] = (float)(mom * mean + (1.0 - mom) * running_mean[ch]);
            running_var[ch] = (float)(mom * var * unbias + (1.0 - mom) * running_var[ch]);
            t.f0[ch] = mean_f;
            t.f1[ch] = invstd_f * gamma[ch];
        }
        /* backwards: the block planes summed last are the likeliest to be still in the cache */
#pragma omp for schedule(static)
        for (size_t r = 0; r < blocks; r++) {
            const size_t j = blocks - 1 - r, c0 = j % cb * BLK;
            bn_blk_affine(x + j * hw * BLK, hw, t.f0 + c0, t.f1 + c0, beta + c0, d->relu, y + j * hw * BLK);
        }
    }
}

void rt_cpu_bn_train_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                         const float *beta, float *running_mean, float *running_var, float *save_mean,
                         float *save_invstd, float *y)
{
    if (rt_cpu_blocked(d->in)) {
        bn_train_fwd_blocked(s, d, x, gamma, beta, running_mean, running_var, save_mean, save_invstd, y);
        return;
    }
    const size_t c = (size_t)d->in.c, m = (size_t)d->in.n * d->in.h * d->in.w;
    const double eps = rt_decimal_double(d->eps), mom = rt_decimal_double(d->momentum);
    /* PyTorch refuses one value per channel in training; the unbiased
     * variance is then undefined and we keep the biased one (0). */
    const double unbias = m > 1 ? (double)m / (double)(m - 1) : 1.0;
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (c * m >= PAR_MIN)
    for (size_t ch = 0; ch < c; ch++) {
        const float *xr = x + ch * m;
        double s1, s2;
        bn_row_sums(xr, m, &s1, &s2);
        const double dm = s1 / (double)m;
        double var = s2 / (double)m - dm * dm;
        if (var < 0.0)
            var = 0.0;
        const double mean = (double)xr[0] + dm;
        const float mean_f = (float)mean, invstd_f = (float)(1.0 / sqrt(var + eps));
        save_mean[ch] = mean_f;
        save_invstd[ch] = invstd_f;
        running_mean[ch] = (float)(mom * mean + (1.0 - mom) * running_mean[ch]);
        running_var[ch] = (float)(mom * var * unbias + (1.0 - mom) * running_var[ch]);
        bn_row_affine(xr, m, mean_f, invstd_f * gamma[ch], beta[ch], d->relu, y + ch * m);
    }
}

void rt_cpu_bn_infer_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                         const float *beta, const float *running_mean, const float *running_var, float *y)
{
    const size_t c = (size_t)d->in.c, m = (size_t)d->in.n * d->in.h * d->in.w;
    const double eps = rt_decimal_double(d->eps);
    if (rt_cpu_blocked(d->in)) {
        const size_t cb = c / BLK, hw = (size_t)d->in.h * d->in.w, blocks = (size_t)d->in.n * cb;
        const struct bn_blk_scratch t = bn_blk_scratch(s, 0, c);
        for (size_t ch = 0; ch < c; ch++)
            t.f1[ch] = (float)(1.0 / sqrt((double)running_var[ch] + eps)) * gamma[ch];
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (c * m >= PAR_MIN)
        for (size_t j = 0; j < blocks; j++) {
            const size_t c0 = j % cb * BLK;
            bn_blk_affine(x + j * hw * BLK, hw, running_mean + c0, t.f1 + c0, beta + c0, d->relu, y + j * hw * BLK);
        }
        return;
    }
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (c * m >= PAR_MIN)
    for (size_t ch = 0; ch < c; ch++) {
        const float invstd = (float)(1.0 / sqrt((double)running_var[ch] + eps));
        bn_row_affine(x + ch * m, m, running_mean[ch], invstd * gamma[ch], beta[ch], d->relu, y + ch * m);
    }
}

static void bn_bwd_blocked(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                           const float *gamma, const float *beta, const float *save_mean, const float *save_invstd,
                           float beta_dx, float *dx, float *dgamma, float *dbeta)
{
    const size_t c = (size_t)d->in.c, cb = c / BLK, hw = (size_t)d->in.h * d->in.w;
    const size_t n = (size_t)d->in.n, m = n * hw, blocks = n * cb;
    const struct bn_blk_scratch t = bn_blk_scratch(s, blocks, c);
    for (size_t ch = 0; ch < c; ch++) {
        t.k[ch] = save_mean[ch];
        t.f3[ch] = save_invstd[ch] * gamma[ch]; /* the forward's scale, in float as it computed it */
    }
    /* a fused ReLU: its mask from the forward's constants (bn_blk_bwd_sums) */
    const float *ra = d->relu ? t.f3 : NULL;
#pragma omp parallel num_threads(nthreads(s)) if (c * m >= PAR_MIN)
    {
#pragma omp for schedule(static)
        for (size_t j = 0; j < blocks; j++)
            bn_blk_bwd_sums(x + j * hw * BLK, dy + j * hw * BLK, hw, t.k + j % cb * BLK, save_mean + j % cb * BLK,
                            ra ? ra + j % cb * BLK : NULL, beta + j % cb * BLK, t.s1 + j * BLK, t.s2 + j * BLK);
#pragma omp for schedule(static)
        for (size_t ch = 0; ch < c; ch++) {
            double sdy = 0.0, sdyx = 0.0;
            for (size_t img = 0; img < n; img++) {
                sdy += t.s1[(img * cb + ch / BLK) * BLK + ch % BLK];
                sdyx += t.s2[(img * cb + ch / BLK) * BLK + ch % BLK];
            }
            const double invstd = save_invstd[ch];
            dbeta[ch] += (float)sdy;
            dgamma[ch] += (float)(sdyx * invstd);
            t.f0[ch] = (float)(sdy / (double)m);
            t.f1[ch] = (float)(sdyx * invstd * invstd / (double)m);
            t.f2[ch] = (float)(invstd * gamma[ch]);
        }
        /* backwards: the block planes summed last are the likeliest to be still in the cache */
#pragma omp for schedule(static)
        for (size_t r = 0; r < blocks; r++) {
            const size_t j = blocks - 1 - r, c0 = j % cb * BLK, o = j * hw * BLK;
            bn_blk_bwd_dx(x + o, dy + o, hw, save_mean + c0, t.f0 + c0, t.f1 + c0, t.f2 + c0, ra ? ra + c0 : NULL,
                          beta + c0, beta_dx, dx + o);
        }
    }
}

void rt_cpu_bn_bwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                   const float *gamma, const float *beta, const float *save_mean, const float *save_invstd,
                   float beta_dx, float *dx, float *dgamma, float *dbeta)
{
    if (rt_cpu_blocked(d->in)) {
        bn_bwd_blocked(s, d, x, dy, gamma, beta, save_mean, save_invstd, beta_dx, dx, dgamma, dbeta);
        return;
    }
    const size_t c = (size_t)d->in.c, m = (size_t)d->in.n * d->in.h * d->in.w;
    /* A fused ReLU on this (C, N, H, W) path, which no model's batchnorm takes (their channels are multiples of
     * 16): the masked gradient is made first, into scratch. */
    float *masked = d->relu ? scratch(s, c * m * sizeof(float)) : NULL;
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (c * m >= PAR_MIN)
    for (size_t ch = 0; ch < c; ch++) {
        const float *xr = x + ch * m, *gr = dy + ch * m;
        if (masked) {
            const float a = save_invstd[ch] * gamma[ch], b = beta[ch], mu = save_mean[ch];
            float *mr = masked + ch * m;
            for (size_t i = 0; i < m; i++)
                mr[i] = bn_relu_grad(gr[i], xr[i], mu, a, b);
            gr = mr;
        }
        const float mean = save_mean[ch];
        const double invstd = save_invstd[ch];
        double sdy, sdyx;
        bn_row_bwd_sums(xr, gr, m, mean, &sdy, &sdyx);
        dbeta[ch] += (float)sdy;
        dgamma[ch] += (float)(sdyx * invstd);
        /* PyTorch's form: dx = (dy - mean(dy) - (x - mean) invstd^2 mean(dy (x - mean))) invstd gamma. */
        const float grad_mean = (float)(sdy / (double)m);
        const float proj = (float)(sdyx * invstd * invstd / (double)m);
        const float scale = (float)(invstd * gamma[ch]);
        bn_row_bwd_dx(xr, gr, m, mean, grad_mean, proj, scale, beta_dx, dx + ch * m);
    }
}

/*
 * The data gradient of bn_infer_fwd, y = (x - running_mean) a + beta with a = invstd * gamma as bn_infer_fwd rounds
 * it: dx = dy a. That is bn_bwd's dx with grad_mean = proj = 0 and scale = a, so the dx kernels above run with
 * those constants (dy - 0 - (x - mean) 0 is dy for every finite x); a fused ReLU's mask is the forward's output
 * recomputed from the forward's very operands (running_mean, a, beta), as bn_bwd recomputes its own.
 */
void rt_cpu_bn_infer_bwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                         const float *gamma, const float *beta, const float *running_mean, const float *running_var,
                         float beta_dx, float *dx)
{
    const size_t c = (size_t)d->in.c, m = (size_t)d->in.n * d->in.h * d->in.w;
    const double eps = rt_decimal_double(d->eps);
    if (rt_cpu_blocked(d->in)) {
        const size_t cb = c / BLK, hw = (size_t)d->in.h * d->in.w, blocks = (size_t)d->in.n * cb;
        const struct bn_blk_scratch t = bn_blk_scratch(s, 0, c);
        for (size_t ch = 0; ch < c; ch++) {
            t.f0[ch] = 0.0f; /* grad_mean and proj */
            t.f1[ch] = (float)(1.0 / sqrt((double)running_var[ch] + eps)) * gamma[ch];
        }
        const float *ra = d->relu ? t.f1 : NULL;
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (c * m >= PAR_MIN)
        for (size_t j = 0; j < blocks; j++) {
            const size_t c0 = j % cb * BLK, o = j * hw * BLK;
            bn_blk_bwd_dx(x + o, dy + o, hw, running_mean + c0, t.f0 + c0, t.f0 + c0, t.f1 + c0,
                          ra ? ra + c0 : NULL, beta + c0, beta_dx, dx + o);
        }
        return;
    }
    /* A fused ReLU on the (C, N, H, W) path masks dy into scratch first, as rt_cpu_bn_bwd does. */
    float *masked = d->relu ? scratch(s, c * m * sizeof(float)) : NULL;
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (c * m >= PAR_MIN)
    for (size_t ch = 0; ch < c; ch++) {
        const float *xr = x + ch * m, *gr = dy + ch * m;
        const float mean = running_mean[ch], a = (float)(1.0 / sqrt((double)running_var[ch] + eps)) * gamma[ch];
        if (masked) {
            float *mr = masked + ch * m;
            for (size_t i = 0; i < m; i++)
                mr[i] = bn_relu_grad(gr[i], xr[i], mean, a, beta[ch]);
            gr = mr;
        }
        bn_row_bwd_dx(xr, gr, m, mean, 0.0f, 0.0f, a, beta_dx, dx + ch * m);
    }
}

/* ==== activations ========================================================== */

void rt_cpu_relu_fwd(struct rt_stream *s, size_t n, const float *x, float *y)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK, hi = RT_MIN(n, lo + CHUNK);
        /* `x < 0 ? 0 : x` lets NaN through, as torch.relu does, so a
         * non-finite activation stays visible downstream. */
#pragma omp simd
        for (size_t i = lo; i < hi; i++)
            y[i] = x[i] < 0.0f ? 0.0f : x[i];
    }
}

/* One chunk of the ReLU gradient, written so it is a vector loop: the first
 * form ran as scalar code with a branch mispredicted on every other element
 * (7 % of a WideResNet step). PyTorch's threshold_backward gives 0 (not NaN)
 * where y <= 0 even for a NaN dy; a select keeps that. */
static void relu_bwd_chunk(size_t n, const float *restrict y, const float *restrict dy, float beta,
                           float *restrict dx)
{
    /* Both loads happen unconditionally: a load inside the select is
     * control flow to the vectoriser. */
    if (beta == 0.0f) {
        for (size_t i = 0; i < n; i++) {
            const float g = dy[i], v = y[i];
            dx[i] = v > 0.0f ? g : 0.0f;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            const float g = dy[i], v = y[i], d = dx[i];
            dx[i] = d + (v > 0.0f ? g : 0.0f);
        }
    }
}

void rt_cpu_relu_bwd(struct rt_stream *s, size_t n, const float *y, const float *dy, float beta, float *dx)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK, hi = RT_MIN(n, lo + CHUNK);
        relu_bwd_chunk(hi - lo, y + lo, dy + lo, beta, dx + lo);
    }
}

/* torch.nn.GELU(): x/2 (1 + erf(x/sqrt 2)); the derivative adds x times the normal density. */
#define GELU_ALPHA 0.70710678118654752440f /* 1/sqrt(2) */
#define GELU_BETA 0.39894228040143267794f  /* 1/sqrt(2 pi) */

void rt_cpu_gelu_fwd(struct rt_stream *s, size_t n, const float *x, float *y)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN / 8)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK, hi = RT_MIN(n, lo + CHUNK);
        for (size_t i = lo; i < hi; i++)
            y[i] = x[i] * 0.5f * (1.0f + erff(x[i] * GELU_ALPHA));
    }
}

void rt_cpu_gelu_bwd(struct rt_stream *s, size_t n, const float *x, const float *dy, float beta, float *dx)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN / 8)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK, hi = RT_MIN(n, lo + CHUNK);
        for (size_t i = lo; i < hi; i++) {
            const float v = x[i];
            const float cdf = 0.5f * (1.0f + erff(v * GELU_ALPHA));
            const float pdf = GELU_BETA * expf(v * v * -0.5f);
            const float g = dy[i] * (cdf + v * pdf);
            dx[i] = beta == 0.0f ? g : beta * dx[i] + g;
        }
    }
}

/* ==== dropout ============================================================== */

/* Elements per mask tile: one stack array of multipliers, a multiple of the 4 words per Philox block. */
#define DROP_TILE 1024

/*
 * y = mask(x) (fwd, beta 0) or dx = beta dx + mask(dy): the same routine both
 * ways, so backward's mask is forward's by construction. Multiplying (rather
 * than selecting) gives NaN for a dropped Inf, as torch's x * mask does.
 */
static void dropout_apply(struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,
                          uint64_t offset, const float *x, float beta, float *y)
{
    const size_t n = (size_t)sh.n * sh.c * sh.h * sh.w, hw = (size_t)sh.h * sh.w;
    const enum rt_dropout_layout lay = !spatial              ? RT_DROPOUT_FEATURES
                                       : rt_cpu_blocked(sh) ? RT_DROPOUT_NCHW16C
                                                            : RT_DROPOUT_CNHW;
    /* nChw16c with H*W > 1: neighbours in memory lie in different (n, c)
     * planes, so a tile is walked one channel (every 16th float) at a time */
    const size_t step = hw > 1 ? (size_t)rt_dropout_plane_step(lay, sh) : 1;
    const float scale = rt_dropout_scale(p);
    const size_t nt = (n + DROP_TILE - 1) / DROP_TILE;
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN / 8)
    for (size_t t = 0; t < nt; t++) {
        const size_t lo = t * DROP_TILE, len = RT_MIN(n - lo, (size_t)DROP_TILE);
        float mul[DROP_TILE];
        if (step == 1) {
            /* memory order, one run of consecutive logical indices at a time */
            for (size_t j = 0; j < len;) {
                const uint64_t i = lo + j;
                const size_t run = (size_t)RT_MIN(rt_dropout_run(lay, sh, i), (uint64_t)(len - j));
                rt_dropout_mask(seed, offset + rt_dropout_logical(lay, sh, i), run, p, scale, mul + j, 1);
                j += run;
            }
        } else {
            /* lane by lane: memory j, j + step, ... is one plane until the plane ends */
            for (size_t l = 0; l < step && l < len; l++) {
                for (size_t j = l; j < len;) {
                    const uint64_t li = rt_dropout_logical(lay, sh, lo + j);
                    const size_t run = RT_MIN((size_t)(hw - li % hw), (len - j + step - 1) / step);
                    rt_dropout_mask(seed, offset + li, run, p, scale, mul + j, step);
                    j += run * step;
                }
            }
        }
        const float *xt = x + lo;
        float *yt = y + lo;
        if (beta == 0.0f) {
#pragma omp simd
            for (size_t i = 0; i < len; i++)
                yt[i] = xt[i] * mul[i];
        } else {
#pragma omp simd
            for (size_t i = 0; i < len; i++)
                yt[i] = beta * yt[i] + xt[i] * mul[i];
        }
    }
}

void rt_cpu_dropout_fwd(struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,
                        uint64_t offset, const uint64_t *stream, const float *x, float *y)
{
    rt_dropout_stream_draw(stream, &seed, &offset);
    dropout_apply(s, sh, spatial, p, seed, offset, x, 0.0f, y);
}

void rt_cpu_dropout_bwd(struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,
                        uint64_t offset, const uint64_t *stream, const float *dy, float beta, float *dx)
{
    rt_dropout_stream_draw(stream, &seed, &offset);
    dropout_apply(s, sh, spatial, p, seed, offset, dy, beta, dx);
}

/* ==== add, scale, axpy ===================================================== */

void rt_cpu_add(struct rt_stream *s, size_t n, const float *a, const float *b, float *y)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t k = 0; k < nb; k++) {
        const size_t lo = k * CHUNK, hi = RT_MIN(n, lo + CHUNK);
#pragma omp simd
        for (size_t i = lo; i < hi; i++)
            y[i] = a[i] + b[i];
    }
}

/* max(0, a + b): add's sum, then rt_cpu_relu_fwd's select, in one pass. */
void rt_cpu_add_relu_fwd(struct rt_stream *s, size_t n, const float *a, const float *b, float *y)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t k = 0; k < nb; k++) {
        const size_t lo = k * CHUNK, hi = RT_MIN(n, lo + CHUNK);
#pragma omp simd
        for (size_t i = lo; i < hi; i++) {
            const float v = a[i] + b[i];
            y[i] = v < 0.0f ? 0.0f : v;
        }
    }
}

/* relu_bwd_chunk into each input's gradient, a chunk at a time so that y and dy are read from cache the second
 * time: relu_bwd then a copy (beta 0) or an add (axpy with alpha 1), bit for bit. */
void rt_cpu_add_relu_bwd(struct rt_stream *s, size_t n, const float *y, const float *dy, float beta_a, float *dxa,
                         float beta_b, float *dxb)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t k = 0; k < nb; k++) {
        const size_t lo = k * CHUNK, hi = RT_MIN(n, lo + CHUNK);
        if (dxa)
            relu_bwd_chunk(hi - lo, y + lo, dy + lo, beta_a, dxa + lo);
        if (dxb)
            relu_bwd_chunk(hi - lo, y + lo, dy + lo, beta_b, dxb + lo);
    }
}

void rt_cpu_scale(struct rt_stream *s, size_t n, float alpha, float *x)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t k = 0; k < nb; k++) {
        const size_t lo = k * CHUNK, hi = RT_MIN(n, lo + CHUNK);
#pragma omp simd
        for (size_t i = lo; i < hi; i++)
            x[i] *= alpha;
    }
}

void rt_cpu_axpy(struct rt_stream *s, size_t n, float alpha, const float *x, float *y)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t k = 0; k < nb; k++) {
        const size_t lo = k * CHUNK, hi = RT_MIN(n, lo + CHUNK);
#pragma omp simd
        for (size_t i = lo; i < hi; i++)
            y[i] += alpha * x[i];
    }
}

/* ==== loss ================================================================= */

/* Per-sample results, summed in sample order after the parallel loop. */
struct xent_row {
    double loss;
    double correct;
    double valid;
};

void rt_cpu_xent_fwd_bwd(struct rt_stream *s, int n, int k, const float *logits, const int32_t *labels,
                         float label_smoothing, float grad_scale, const float *loss_scale, struct rt_loss_stats *stats,
                         float *dlogits)
{
    if (n <= 0 || k <= 0)
        return;
    if (loss_scale)
        grad_scale *= *loss_scale; /* rounded to float, as the host's product was */
    struct xent_row *rows = scratch(s, (size_t)n * sizeof(*rows));
    const double eps = rt_decimal_double(label_smoothing);
    const double on = 1.0 - eps, off = eps / k;
    const size_t kk = (size_t)k;
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if ((size_t)n * kk >= PAR_MIN / 8)
    for (int r = 0; r < n; r++) {
        const float *z = logits + (size_t)r * kk;
        float *dz = dlogits ? dlogits + (size_t)r * kk : NULL;
        const int32_t y = labels[r];
        /* label < 0 is padding; a label >= k is the caller's bug and is
         * treated the same rather than read out of bounds. */
        if (y < 0 || y >= k) {
            rows[r] = (struct xent_row){0.0, 0.0, 0.0};
            if (dz)
                memset(dz, 0, kk * sizeof(*dz));
            continue;
        }
        float zmax = z[0];
        int arg = 0;
        for (int j = 1; j < k; j++)
            if (z[j] > zmax) { /* strict: the first maximum wins, as torch.argmax */
                zmax = z[j];
                arg = j;
            }
        /* exp in float as torch's log_softmax, sums in double; the
         * exponentials wait in dz for the gradient (each logit is read
         * before its dz is written, so dlogits may be logits). */
        const float zy = z[y];
        double sum = 0.0, zsum = 0.0;
        for (int j = 0; j < k; j++) {
            const float zj = z[j], e = expf(zj - zmax);
            sum += e;
            zsum += zj;
            if (dz)
                dz[j] = e;
        }
        const double lse = zmax + log(sum);
        /* -log p_y and the mean over classes of -log p_j */
        rows[r].loss = on * (lse - zy) + eps * (lse - zsum / k);
        rows[r].correct = arg == y ? 1.0 : 0.0;
        rows[r].valid = 1.0;
        if (dz) {
            const double inv = 1.0 / sum;
            for (int j = 0; j < k; j++) {
                const double t = (j == y ? on : 0.0) + off;
                dz[j] = (float)(grad_scale * (dz[j] * inv - t));
            }
        }
    }
    double loss = 0.0, correct = 0.0, count = 0.0;
    for (int r = 0; r < n; r++) {
        loss += rows[r].loss;
        correct += rows[r].correct;
        count += rows[r].valid;
    }
    stats->loss_sum += (float)loss;
    stats->correct += (float)correct;
    stats->count += (float)count;
}

/* ==== reductions =========================================================== */

static double chunk_sumsq(const float *x, size_t len)
{
    v2d a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const v2d d0 = pair(x + i), d1 = pair(x + i + 2), d2 = pair(x + i + 4), d3 = pair(x + i + 6);
        a0 += d0 * d0;
        a1 += d1 * d1;
        a2 += d2 * d2;
        a3 += d3 * d3;
    }
    double a = hsum4(a0, a1, a2, a3);
    for (; i < len; i++)
        a += (double)x[i] * x[i];
    return a;
}

void rt_cpu_sumsq(struct rt_stream *s, size_t n, const float *x, float *out)
{
    const size_t nb = nchunks(n);
    double *part = scratch(s, (nb + 1) * sizeof(double));
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK;
        part[b] = chunk_sumsq(x + lo, RT_MIN(n - lo, CHUNK));
    }
    double total = 0.0;
    for (size_t b = 0; b < nb; b++)
        total += part[b];
    *out = (float)total;
}

void rt_cpu_clip_scale(struct rt_stream *s, size_t n, const float *sumsq, float max_norm, float *x)
{
    const float norm = sqrtf(*sumsq);
    if (isfinite(norm) && norm > max_norm)
        rt_cpu_scale(s, n, max_norm / (norm + 1e-6f), x);
}

void rt_cpu_count_nonfinite(struct rt_stream *s, size_t n, const float *x, float *out)
{
    const size_t nb = nchunks(n);
    size_t *part = scratch(s, (nb + 1) * sizeof(size_t));
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK, hi = RT_MIN(n, lo + CHUNK);
        uint32_t c = 0;
        /* An all-ones exponent is Inf or NaN; the bit test has no branch to
         * mispredict and is not folded away by -ffinite-math-only. */
#pragma omp simd reduction(+ : c)
        for (size_t i = lo; i < hi; i++)
            c += (f32_bits(x[i]) & 0x7f800000u) == 0x7f800000u;
        part[b] = c;
    }
    size_t total = 0;
    for (size_t b = 0; b < nb; b++)
        total += part[b];
    *out = (float)total;
}

void rt_cpu_unscale_check(struct rt_stream *s, size_t n, float *g, const float *scale, float *found)
{
    const float inv_scale = 1.0f / *scale;
    uint32_t bad = 0;
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) reduction(| : bad) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        bad |= (f32_bits(g[i]) & 0x7f800000u) == 0x7f800000u;
        g[i] *= inv_scale;
    }
    *found = bad ? 1.0f : 0.0f;
}

void rt_cpu_scaler_update(struct rt_stream *s, float *scale, float *good, const float *found, float growth,
                          float backoff, int growth_interval)
{
    (void)s;
    if (*found != 0.0f) {
        *scale *= backoff;
        *good = 0.0f;
        return;
    }
    if ((*good += 1.0f) >= (float)growth_interval) {
        const float g = *scale * growth;
        if (g <= 3.0e38f)
            *scale = g;
        *good = 0.0f;
    }
}

/* ==== casts ================================================================ */

/*
 * float -> IEEE half, round to nearest even. Normal results round in the
 * integer domain (adding 0xfff plus the kept lowest bit carries into the
 * exponent when the mantissa overflows); results below 2^-14 come from one
 * float addition that puts the half's subnormal units in the low bits, so
 * the FPU does the rounding.
 */
static inline uint16_t f32_to_f16(float f)
{
    const uint32_t u = f32_bits(f);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: stays NaN (quiet), keeping the top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520 rounds to Inf (65504 is the largest half) */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: subnormal half or zero */
        /* 0.5 has ulp 2^-24, the half subnormal unit: the sum's low bits are the result. */
        const float t = bits_f32(a) + 0.5f;
        return (uint16_t)(sign | (f32_bits(t) - 0x3f000000u));
    }
    const uint32_t odd = (a >> 13) & 1u;
    /* rebias the exponent (127 -> 15) and round to nearest even */
    return (uint16_t)(sign | ((a + 0xc8000fffu + odd) >> 13));
}

static inline float f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;
    if (em >= 0x7c00u) /* Inf, NaN (payload kept) */
        return bits_f32(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
    if (em >= 0x0400u) /* normal: rebias 15 -> 127 */
        return bits_f32(sign | ((em << 13) + 0x38000000u));
    /* zero or subnormal: em units of 2^-24, exact in float */
    return bits_f32(sign | f32_bits((float)em * (1.0f / 16777216.0f)));
}

static inline uint16_t f32_to_bf16(float f)
{
    const uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: truncation could clear the payload to Inf; force quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* round to nearest even; the carry rounds the largest floats up to Inf as it should */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void rt_cpu_cast_f32_f16(struct rt_stream *s, size_t n, const float *x, uint16_t *y)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK, hi = RT_MIN(n, lo + CHUNK);
        for (size_t i = lo; i < hi; i++)
            y[i] = f32_to_f16(x[i]);
    }
}

void rt_cpu_cast_f16_f32(struct rt_stream *s, size_t n, const uint16_t *x, float *y)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK, hi = RT_MIN(n, lo + CHUNK);
        for (size_t i = lo; i < hi; i++)
            y[i] = f16_to_f32(x[i]);
    }
}

void rt_cpu_cast_f32_bf16(struct rt_stream *s, size_t n, const float *x, uint16_t *y)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK, hi = RT_MIN(n, lo + CHUNK);
        for (size_t i = lo; i < hi; i++)
            y[i] = f32_to_bf16(x[i]);
    }
}

void rt_cpu_cast_bf16_f32(struct rt_stream *s, size_t n, const uint16_t *x, float *y)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK, hi = RT_MIN(n, lo + CHUNK);
#pragma omp simd
        for (size_t i = lo; i < hi; i++)
            y[i] = bits_f32((uint32_t)x[i] << 16);
    }
}

/* ==== optimizers =========================================================== */

/* The float scalars ATen receives from torch.optim.SGD's Python code. */
struct sgd_k {
    float neg_lr, momentum, alpha_g /* 1 - dampening */, wd;
    int nesterov, first;
};

/*
 * One chunk of _single_tensor_sgd: grad.add(param, alpha=wd), buf.mul_(m)
 * .add_(grad, alpha=1-dampening), grad.add(buf, alpha=m), param.add_(grad,
 * alpha=-lr); ATen's add with alpha is a fused multiply-add.
 */
ELEM_CLONES static void sgd_chunk(size_t len, float *p, const float *g, float *buf, const struct sgd_k *k)
{
    const float neg_lr = k->neg_lr, mom = k->momentum, ag = k->alpha_g, wd = k->wd;
    const int has_wd = wd != 0.0f, nesterov = k->nesterov;
    /* One loop per case, so no lane loads a buffer its case does not have (buf is NULL without momentum). */
    if (mom == 0.0f) {
#pragma omp simd
        for (size_t i = 0; i < len; i++) {
            const float gi = has_wd ? fmaf(p[i], wd, g[i]) : g[i];
            p[i] = fmaf(gi, neg_lr, p[i]);
        }
    } else if (k->first) {
#pragma omp simd
        for (size_t i = 0; i < len; i++) {
            const float gi = has_wd ? fmaf(p[i], wd, g[i]) : g[i];
            buf[i] = gi;
            p[i] = fmaf(nesterov ? fmaf(gi, mom, gi) : gi, neg_lr, p[i]);
        }
    } else {
#pragma omp simd
        for (size_t i = 0; i < len; i++) {
            const float gi = has_wd ? fmaf(p[i], wd, g[i]) : g[i];
            const float b = fmaf(gi, ag, buf[i] * mom);
            buf[i] = b;
            p[i] = fmaf(nesterov ? fmaf(b, mom, gi) : b, neg_lr, p[i]);
        }
    }
}

void rt_cpu_sgd_update(struct rt_stream *s, size_t n, float *p, const float *g, float *buf, float lr, float momentum,
                       float dampening, float weight_decay, int nesterov, int first, const float *skip)
{
    if (skip && *skip != 0.0f)
        return;
    const struct sgd_k k = {
        .neg_lr = -lr,
        .momentum = momentum,
        .alpha_g = (float)(1.0 - rt_decimal_double(dampening)),
        .wd = weight_decay,
        .nesterov = nesterov,
        .first = first,
    };
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK;
        sgd_chunk(RT_MIN(n - lo, CHUNK), p + lo, g + lo, buf ? buf + lo : NULL, &k);
    }
}

/* The float scalars ATen receives from torch.optim.Adam/AdamW's Python code. */
struct adam_k {
    float decay;     /* AdamW: param.mul_(1 - lr wd); 1 when not decoupled */
    float wd;        /* Adam: grad.add(param, alpha=wd); 0 when decoupled */
    float beta1, w1; /* exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1) */
    float beta2, w2; /* exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2) */
    float bc2_sqrt;  /* sqrt(1 - beta2^step) */
    float eps;
    float neg_step;  /* -lr / (1 - beta1^step) */
};

/*
 * One chunk of _single_tensor_adam / _single_tensor_adamw as PyTorch 1.13
 * (Debian 12's, which makes our fixtures) writes them: add with alpha is
 * fma(other, alpha, self); addcmul is self + (value * t1) * t2, which GCC
 * contracts to fma(value * t1, t2, self) in ATen's AVX2 kernels; addcdiv is
 * self + (value * t1) / t2. (PyTorch 2 updates exp_avg with lerp_ instead,
 * which can differ in the last bit.)
 */
ELEM_CLONES static void adam_chunk(size_t len, float *p, const float *g, float *m, float *v, const struct adam_k *k)
{
    const float decay = k->decay, wd = k->wd, b1 = k->beta1, w1 = k->w1, b2 = k->beta2, w2 = k->w2,
                bc2 = k->bc2_sqrt, eps = k->eps, neg_step = k->neg_step;
    const int has_wd = wd != 0.0f, has_decay = decay != 1.0f;
    /* Not `omp simd`: sqrtf's errno path keeps this loop scalar anyway. */
    for (size_t i = 0; i < len; i++) {
        const float pi = has_decay ? p[i] * decay : p[i];
        const float gi = has_wd ? fmaf(pi, wd, g[i]) : g[i];
        const float mi = fmaf(gi, w1, m[i] * b1);
        const float vi = fmaf(w2 * gi, gi, v[i] * b2);
        const float denom = sqrtf(vi) / bc2 + eps;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi + neg_step * mi / denom;
    }
}

void rt_cpu_adam_update(struct rt_stream *s, size_t n, float *p, const float *g, float *m, float *v, float lr,
                        float beta1, float beta2, float eps, float weight_decay, int decoupled, int64_t step,
                        const float *skip)
{
    if (skip && *skip != 0.0f)
        return;
    const double lr_d = rt_decimal_double(lr), b1 = rt_decimal_double(beta1), b2 = rt_decimal_double(beta2);
    const double wd = rt_decimal_double(weight_decay), st = (double)step;
    /* torch's Python: bias_correction1 = 1 - beta1 ** step, step_size = lr / bias_correction1, ... */
    const double bc1 = 1.0 - pow(b1, st), bc2 = 1.0 - pow(b2, st);
    const struct adam_k k = {
        .decay = decoupled && weight_decay != 0.0f ? (float)(1.0 - lr_d * wd) : 1.0f,
        .wd = decoupled ? 0.0f : weight_decay,
        .beta1 = beta1,
        .w1 = (float)(1.0 - b1),
        .beta2 = beta2,
        .w2 = (float)(1.0 - b2),
        .bc2_sqrt = (float)sqrt(bc2),
        .eps = eps,
        .neg_step = (float)-(lr_d / bc1),
    };
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK;
        adam_chunk(RT_MIN(n - lo, CHUNK), p + lo, g + lo, m + lo, v + lo, &k);
    }
}
