/*
 * pool.c - the CPU backend's spatial kernels other than convolution: layout
 * conversion to and from NCHW, max and average pooling, global average
 * pooling, flatten, and the linear layer on feature tensors.
 *
 * Spatial tensors come in two layouts (cpu.h). Channel-major (C, N, H, W),
 * for C not a multiple of 16: every (channel, image) plane is H*W contiguous
 * floats, exactly as in NCHW, only the planes are ordered channel-major. So
 * pooling runs plane by plane without caring about the order, and the layout
 * conversions (and flatten, whose (N, C*H*W) output is NCHW) are copies of
 * whole planes. Blocked nChw16c, for C a multiple of 16: every (image,
 * block of 16 channels) "block plane" is H*W pixels of 16 contiguous
 * channels, and block plane j = n*(C/16) + c/16 holds exactly the 16 NCHW
 * planes that start at j*16*H*W. So the kernels run block plane by block
 * plane with the 16 channels as the innermost loop, which the compiler
 * vectorises, and the layout conversions transpose each block plane's
 * (H*W, 16) to (16, H*W) in place of a copy. Loops are OpenMP over (block)
 * planes with static schedules; every output element is written by one
 * thread in a fixed order, so results do not depend on timing, and the
 * floating-point operations per element are the same in both layouts. The
 * linear layer is OpenBLAS sgemm.
 *
 * This file does not check shapes (rt_pool_desc_init and the model did) and
 * implements only floor-mode pooling.
 */
#include <math.h>
#include <string.h>

#include <cblas.h>

#include "common/common.h"
#include "compute/cpu/cpu.h"

#define BLK RT_CPU_BLOCK

/*
 * Fewest floats a loop must touch to be worth an OpenMP parallel region
 * (microseconds to start and join; far more when the cores are shared).
 * Smaller loops run on the calling thread with the same results.
 */
#define POOL_PAR_MIN ((size_t)1 << 15)

/* Planes (channel, image) of a spatial tensor, in the index type of the OpenMP loops. */
static long pool_planes(struct rt_shape4 sh)
{
    return (long)sh.c * sh.n;
}

/* Block planes (image, 16 channels) of a blocked tensor: its planes / 16. */
static long pool_blocks(struct rt_shape4 sh)
{
    return (long)sh.n * (sh.c / BLK);
}

/* dst = beta * dst for a backward op's output region: 0 overwrites without reading. */
static void pool_apply_beta(float *dst, size_t n, float beta)
{
    if (beta == 1.0f)
        return;
    if (beta == 0.0f) {
        memset(dst, 0, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++)
        dst[i] *= beta;
}

/*
 * One block plane (H*W, 16) -> its 16 NCHW planes (16, H*W), 16 pixels at a
 * time so that both sides of the transpose stay within a few cache lines.
 */
static void blk_unpack(const float *restrict src, size_t hw, float *restrict dst)
{
    for (size_t s0 = 0; s0 < hw; s0 += BLK) {
        const size_t len = RT_MIN((size_t)BLK, hw - s0);
        for (size_t l = 0; l < BLK; l++)
            for (size_t t = 0; t < len; t++)
                dst[l * hw + s0 + t] = src[(s0 + t) * BLK + l];
    }
}

/* The inverse, dst (H*W, 16) = beta * dst + src (16, H*W); beta 0 never reads dst. */
static void blk_pack(const float *restrict src, size_t hw, float beta, float *restrict dst)
{
    for (size_t s0 = 0; s0 < hw; s0 += BLK) {
        const size_t len = RT_MIN((size_t)BLK, hw - s0);
        float *o = dst + s0 * BLK;
        if (beta == 0.0f) {
            for (size_t t = 0; t < len; t++)
                for (size_t l = 0; l < BLK; l++)
                    o[t * BLK + l] = src[l * hw + s0 + t];
        } else {
            for (size_t t = 0; t < len; t++)
                for (size_t l = 0; l < BLK; l++)
                    o[t * BLK + l] = beta * o[t * BLK + l] + src[l * hw + s0 + t];
        }
    }
}

void rt_cpu_to_nchw(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *host_nchw)
{
    (void)s;
    const size_t hw = (size_t)sh.h * sh.w;
    if (rt_cpu_blocked(sh)) {
        const long blocks = pool_blocks(sh);
        const size_t bs = hw * BLK;
#pragma omp parallel for schedule(static) if ((size_t)blocks * bs >= POOL_PAR_MIN)
        for (long j = 0; j < blocks; j++)
            blk_unpack(x + (size_t)j * bs, hw, host_nchw + (size_t)j * bs);
        return;
    }
    const long planes = pool_planes(sh);
#pragma omp parallel for schedule(static) if ((size_t)planes * hw >= POOL_PAR_MIN)
    for (long j = 0; j < planes; j++) {
        /* j walks the (C, N) source; plane (c, n) goes to NCHW position n*C + c. */
        const size_t c = (size_t)j / (size_t)sh.n, n = (size_t)j % (size_t)sh.n;
        memcpy(host_nchw + (n * (size_t)sh.c + c) * hw, x + (size_t)j * hw, hw * sizeof(float));
    }
}

void rt_cpu_from_nchw(struct rt_stream *s, struct rt_shape4 sh, const float *host_nchw, float *x)
{
    (void)s;
    const size_t hw = (size_t)sh.h * sh.w;
    if (rt_cpu_blocked(sh)) {
        const long blocks = pool_blocks(sh);
        const size_t bs = hw * BLK;
#pragma omp parallel for schedule(static) if ((size_t)blocks * bs >= POOL_PAR_MIN)
        for (long j = 0; j < blocks; j++)
            blk_pack(host_nchw + (size_t)j * bs, hw, 0.0f, x + (size_t)j * bs);
        return;
    }
    const long planes = pool_planes(sh);
#pragma omp parallel for schedule(static) if ((size_t)planes * hw >= POOL_PAR_MIN)
    for (long j = 0; j < planes; j++) {
        const size_t c = (size_t)j / (size_t)sh.n, n = (size_t)j % (size_t)sh.n;
        memcpy(x + (size_t)j * hw, host_nchw + (n * (size_t)sh.c + c) * hw, hw * sizeof(float));
    }
}

/* The window of output (oy, ox) clipped to the input: rows [*y0, *y1), columns [*x0, *x1). */
static void pool_window(const struct rt_pool_desc *d, int oy, int ox, int *y0, int *y1, int *x0, int *x1)
{
    const int ys = oy * d->stride - d->pad, xs = ox * d->stride - d->pad;
    *y0 = ys > 0 ? ys : 0;
    *x0 = xs > 0 ? xs : 0;
    *y1 = ys + d->kh < d->in.h ? ys + d->kh : d->in.h;
    *x1 = xs + d->kw < d->in.w ? xs + d->kw : d->in.w;
}

/*
 * Index in the plane of the maximum of window (oy, ox): the first maximum in
 * row-major order, and a NaN wins so that it propagates, both as PyTorch's
 * CPU kernel does. Padding never wins: rt_pool_desc_init keeps pad <= k/2,
 * so every floor-mode window holds at least one input element.
 */
static size_t pool_argmax(const struct rt_pool_desc *d, const float *plane, int oy, int ox)
{
    int y0, y1, x0, x1;
    pool_window(d, oy, ox, &y0, &y1, &x0, &x1);
    size_t best = (size_t)y0 * d->in.w + x0;
    float m = -INFINITY;
    for (int iy = y0; iy < y1; iy++) {
        for (int ix = x0; ix < x1; ix++) {
            const size_t i = (size_t)iy * d->in.w + ix;
            const float v = plane[i];
            if (v > m || isnan(v)) {
                m = v;
                best = i;
            }
        }
    }
    return best;
}

/*
 * Max pooling plane by plane. Windows that lie wholly inside the input (all
 * but the border when there is padding) go through pool_max_span, the border
 * through pool_argmax; the forward of the common 2x2 and 3x3 stride-2
 * windows is written out as selects the compiler vectorises across outputs:
 * per-window bookkeeping and a chain of unpredictable branches would
 * otherwise cost several times the memory traffic. Same first-maximum and
 * NaN rules everywhere.
 */
static inline float pool_take(float m, float v)
{
    return v > m || isnan(v) ? v : m;
}

/* y[i] = max of the 2x2 window at r + 2i (row pitch w), i < n. */
static void pool_max2x2s2_fwd(const float *r, int w, int n, float *y)
{
#pragma omp simd
    for (int i = 0; i < n; i++) {
        float m = r[2 * i];
        m = pool_take(m, r[2 * i + 1]);
        m = pool_take(m, r[w + 2 * i]);
        m = pool_take(m, r[w + 2 * i + 1]);
        y[i] = m;
    }
}

/* y[i] = max of the 3x3 window at r + 2i (row pitch w), i < n. */
static void pool_max3x3s2_fwd(const float *r, int w, int n, float *y)
{
#pragma omp simd
    for (int i = 0; i < n; i++) {
        float m = r[2 * i];
        m = pool_take(m, r[2 * i + 1]);
        m = pool_take(m, r[2 * i + 2]);
        m = pool_take(m, r[w + 2 * i]);
        m = pool_take(m, r[w + 2 * i + 1]);
        m = pool_take(m, r[w + 2 * i + 2]);
        m = pool_take(m, r[2 * w + 2 * i]);
        m = pool_take(m, r[2 * w + 2 * i + 1]);
        m = pool_take(m, r[2 * w + 2 * i + 2]);
        y[i] = m;
    }
}

/*
 * Outputs [ox0, ox1) of output row oy, whose windows lie inside the plane,
 * one at a time: forward when y is not NULL (y[ox] = max), else backward
 * (dx[argmax] += g[ox]; windows may overlap). The window and stride are
 * compile-time constants in the common cases.
 */
static inline void pool_max_span_n(const struct rt_pool_desc *d, const float *plane, const float *r, int ox0,
                                   int ox1, float *y, const float *g, float *dx, const int kh, const int kw,
                                   const int s)
{
    const size_t w = (size_t)d->in.w;
    for (int ox = ox0; ox < ox1; ox++) {
        const float *p = r + (size_t)(ox - ox0) * s;
        size_t best = 0;
        float m = p[0];
        for (int a = 0; a < kh; a++)
            for (int b = 0; b < kw; b++) {
                const size_t i = (size_t)a * w + b;
                if (p[i] > m || isnan(p[i])) {
                    m = p[i];
                    best = i;
                }
            }
        if (y)
            y[ox] = m;
        else
            dx[(size_t)(p - plane) + best] += g[ox];
    }
}

static void pool_max_span(const struct rt_pool_desc *d, const float *plane, int oy, int ox0, int ox1, float *y,
                          const float *g, float *dx)
{
    const int w = d->in.w, s = d->stride;
    const float *r = plane + (size_t)(oy * s - d->pad) * w + (ox0 * s - d->pad); /* window ox0's top-left */
    const int k22 = s == 2 && d->kh == 2 && d->kw == 2, k33 = s == 2 && d->kh == 3 && d->kw == 3;
    if (y && k22)
        pool_max2x2s2_fwd(r, w, ox1 - ox0, y + ox0);
    else if (y && k33)
        pool_max3x3s2_fwd(r, w, ox1 - ox0, y + ox0);
    else if (k22)
        pool_max_span_n(d, plane, r, ox0, ox1, y, g, dx, 2, 2, 2);
    else if (k33)
        pool_max_span_n(d, plane, r, ox0, ox1, y, g, dx, 3, 3, 2);
    else
        pool_max_span_n(d, plane, r, ox0, ox1, y, g, dx, d->kh, d->kw, s);
}

/* Outputs [*lo, *hi) along one axis whose windows lie inside [0, in). */
static void pool_inner(int k, int s, int p, int in, int out, int *lo, int *hi)
{
    int a = (p + s - 1) / s;
    int b = in + p - k < 0 ? 0 : (in + p - k) / s + 1;
    if (b > out)
        b = out;
    if (a > b)
        a = b;
    *lo = a;
    *hi = b;
}

/* One plane: forward when y is not NULL, else backward into dx (beta already applied). */
static void pool_max_plane(const struct rt_pool_desc *d, const float *plane, float *y, const float *g, float *dx)
{
    int oy0, oy1, ox0, ox1;
    pool_inner(d->kh, d->stride, d->pad, d->in.h, d->oh, &oy0, &oy1);
    pool_inner(d->kw, d->stride, d->pad, d->in.w, d->ow, &ox0, &ox1);
    for (int oy = 0; oy < d->oh; oy++) {
        const size_t o = (size_t)oy * d->ow;
        float *yr = y ? y + o : NULL;
        const float *gr = g ? g + o : NULL;
        const int inner = oy >= oy0 && oy < oy1 && ox0 < ox1;
        for (int ox = 0; ox < d->ow; ox++) {
            if (inner && ox == ox0) {
                pool_max_span(d, plane, oy, ox0, ox1, yr, gr, dx);
                ox = ox1 - 1;
                continue;
            }
            const size_t at = pool_argmax(d, plane, oy, ox);
            if (y)
                yr[ox] = plane[at];
            else
                dx[at] += gr[ox];
        }
    }
}

/*
 * Blocked pooling: one block plane (H*W pixels of 16 channels) at a time,
 * every window computed for the 16 channels at once as vector lanes. An
 * output row's windows are swept one window row at a time, each from left
 * to right, so that the input is read (and dx stored) as sequential runs:
 * visiting a window's rows in turn, output by output, interleaves two or
 * three streams a row (kilobytes) apart, which ran at a quarter of the
 * memory's speed on tensors larger than the cache. Within each window the
 * pixels are still visited in row-major order, and every dx element gets
 * its additions in the order of the windows, so per channel the arithmetic
 * is that of the plane kernels above: the same first maximum, the same
 * order of additions.
 */

/* Outputs of a row handled at once when the accumulators cannot live in y: 4 KiB of them. */
#define POOL_SPAN 32

/* pool_take's test without the branch of ||, which would keep the lane loops scalar. */
static inline int blk_wins(float v, float m)
{
    return (v > m) | (isnan(v) != 0);
}

/* Columns [*x0, *x1) of output ox's window, clipped to the input. */
static inline void blk_cols(const struct rt_pool_desc *d, int ox, int *x0, int *x1)
{
    const int xs = ox * d->stride - d->pad;
    *x0 = xs > 0 ? xs : 0;
    *x1 = xs + d->kw < d->in.w ? xs + d->kw : d->in.w;
}

/*
 * The maxima of outputs [ox0, ox1) of row oy of block plane p, 16 lanes
 * each, into m; with `best`, also each winner's pixel as an offset from
 * the window's first row, (iy - y0)*W + ix. The offsets are floats (exact
 * below 2^24) because gcc turns a select of ints under a float compare
 * into branches, which keeps the lane loop scalar.
 */
static void blk_max_span(const struct rt_pool_desc *d, const float *p, int oy, int ox0, int ox1, float *restrict m,
                         float *restrict best)
{
    const size_t w = (size_t)d->in.w;
    int y0, y1, x0, x1;
    pool_window(d, oy, ox0, &y0, &y1, &x0, &x1);
    /* -inf never wins, so the first pixel stays the winner of a window of -inf, as in pool_argmax */
    for (int ox = ox0; ox < ox1; ox++) {
        blk_cols(d, ox, &x0, &x1);
        float *mo = m + (size_t)(ox - ox0) * BLK;
        for (int l = 0; l < BLK; l++)
            mo[l] = -INFINITY;
        if (best)
            for (int l = 0; l < BLK; l++)
                best[(size_t)(ox - ox0) * BLK + (size_t)l] = (float)x0;
    }
    for (int iy = y0; iy < y1; iy++) {
        const float *r = p + (size_t)iy * w * BLK;
        const size_t row = (size_t)(iy - y0) * w;
        for (int ox = ox0; ox < ox1; ox++) {
            blk_cols(d, ox, &x0, &x1);
            float *mo = m + (size_t)(ox - ox0) * BLK;
            for (int ix = x0; ix < x1; ix++) {
                const float *v = r + (size_t)ix * BLK;
                if (best) {
                    float *bo = best + (size_t)(ox - ox0) * BLK;
                    const float at = (float)(row + (size_t)ix);
#pragma omp simd
                    for (int l = 0; l < BLK; l++) {
                        const int t = blk_wins(v[l], mo[l]);
                        mo[l] = t ? v[l] : mo[l];
                        bo[l] = t ? at : bo[l];
                    }
                } else {
#pragma omp simd
                    for (int l = 0; l < BLK; l++)
                        mo[l] = blk_wins(v[l], mo[l]) ? v[l] : mo[l];
                }
            }
        }
    }
}

/* y (OH*OW, 16) = the window maxima of block plane p; each output row accumulates in place. */
static void blk_max_fwd(const struct rt_pool_desc *d, const float *p, float *y)
{
    for (int oy = 0; oy < d->oh; oy++)
        blk_max_span(d, p, oy, 0, d->ow, y + (size_t)oy * d->ow * BLK, NULL);
}

/*
 * dx (block plane) = beta dx + the gradient of the max pooling of block
 * plane p, g (OH*OW, 16). With beta 0 and windows that tile the plane
 * (window = stride, no padding) every dx element is stored once, row by
 * row: the gradient at its window's maximum, zero elsewhere, so dx is never
 * read. Otherwise beta is applied to the plane first and each gradient
 * added at its window's maximum (windows may overlap).
 */
static void blk_max_bwd(const struct rt_pool_desc *d, const float *p, const float *g, float beta, float *dx)
{
    const size_t w = (size_t)d->in.w;
    const int kh = d->kh, kw = d->kw;
    const int store = beta == 0.0f && kh == d->stride && kw == d->stride && d->pad == 0;
    float m[POOL_SPAN * BLK], best[POOL_SPAN * BLK];
    if (!store)
        pool_apply_beta(dx, (size_t)d->in.h * w * BLK, beta);
    for (int oy = 0; oy < d->oh; oy++) {
        int y0, y1, x0, x1;
        pool_window(d, oy, 0, &y0, &y1, &x0, &x1);
        for (int ox0 = 0; ox0 < d->ow; ox0 += POOL_SPAN) {
            const int ox1 = RT_MIN(ox0 + POOL_SPAN, d->ow);
            blk_max_span(d, p, oy, ox0, ox1, m, best);
            const float *go = g + ((size_t)oy * d->ow + ox0) * BLK;
            if (!store) {
                for (int ox = ox0; ox < ox1; ox++) {
                    const float *gk = go + (size_t)(ox - ox0) * BLK, *bk = best + (size_t)(ox - ox0) * BLK;
                    for (int l = 0; l < BLK; l++)
                        dx[((size_t)y0 * w + (size_t)bk[l]) * BLK + (size_t)l] += gk[l];
                }
                continue;
            }
            /* pixel k of window row a, counted from the span's first window, is column kw*ox0 + k */
            for (int a = 0; a < kh; a++) {
                float *o = dx + ((size_t)(y0 + a) * w + (size_t)(kw * ox0)) * BLK;
                for (int k = 0; k < kw * (ox1 - ox0); k++) {
                    const float at = (float)((size_t)a * w + (size_t)(kw * ox0 + k));
                    const float *gk = go + (size_t)(k / kw) * BLK, *bk = best + (size_t)(k / kw) * BLK;
                    /* the load outside the select: inside it is control flow to the vectoriser */
#pragma omp simd
                    for (int l = 0; l < BLK; l++) {
                        const float gl = gk[l];
                        o[(size_t)k * BLK + (size_t)l] = bk[l] == at ? gl : 0.0f;
                    }
                }
            }
        }
        /* columns right of the last window */
        if (store && w > (size_t)(kw * d->ow))
            for (int a = 0; a < kh; a++)
                memset(dx + ((size_t)(y0 + a) * w + (size_t)(kw * d->ow)) * BLK, 0,
                       (w - (size_t)(kw * d->ow)) * BLK * sizeof(float));
    }
    /* rows below the last window */
    if (store && d->in.h > kh * d->oh)
        memset(dx + (size_t)(kh * d->oh) * w * BLK, 0, (size_t)(d->in.h - kh * d->oh) * w * BLK * sizeof(float));
}

/* y (OH*OW, 16) = the window means of block plane p (the divisor is kh*kw: floor mode), summed in place. */
static void blk_avg_fwd(const struct rt_pool_desc *d, const float *p, float inv, float *y)
{
    const size_t w = (size_t)d->in.w;
    for (int oy = 0; oy < d->oh; oy++) {
        float *yr = y + (size_t)oy * d->ow * BLK;
        int y0, y1, x0, x1;
        pool_window(d, oy, 0, &y0, &y1, &x0, &x1);
        memset(yr, 0, (size_t)d->ow * BLK * sizeof(float));
        for (int iy = y0; iy < y1; iy++) {
            const float *r = p + (size_t)iy * w * BLK;
            for (int ox = 0; ox < d->ow; ox++) {
                blk_cols(d, ox, &x0, &x1);
                float *o = yr + (size_t)ox * BLK;
                for (int ix = x0; ix < x1; ix++) {
                    const float *v = r + (size_t)ix * BLK;
#pragma omp simd
                    for (int l = 0; l < BLK; l++)
                        o[l] += v[l];
                }
            }
        }
#pragma omp simd
        for (size_t i = 0; i < (size_t)d->ow * BLK; i++)
            yr[i] *= inv;
    }
}

/* dx (block plane, beta applied) += each window's gradient / (kh*kw) over the window. */
static void blk_avg_bwd(const struct rt_pool_desc *d, const float *g, float inv, float *dx)
{
    const size_t w = (size_t)d->in.w;
    for (int oy = 0; oy < d->oh; oy++) {
        int y0, y1, x0, x1;
        pool_window(d, oy, 0, &y0, &y1, &x0, &x1);
        for (int iy = y0; iy < y1; iy++) {
            float *r = dx + (size_t)iy * w * BLK;
            for (int ox = 0; ox < d->ow; ox++) {
                const float *go = g + ((size_t)oy * d->ow + ox) * BLK;
                float v[BLK];
#pragma omp simd
                for (int l = 0; l < BLK; l++)
                    v[l] = go[l] * inv;
                blk_cols(d, ox, &x0, &x1);
                for (int ix = x0; ix < x1; ix++) {
                    float *o = r + (size_t)ix * BLK;
#pragma omp simd
                    for (int l = 0; l < BLK; l++)
                        o[l] += v[l];
                }
            }
        }
    }
}

void rt_cpu_maxpool_fwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y)
{
    (void)s;
    const size_t hw = (size_t)d->in.h * d->in.w, ohw = (size_t)d->oh * d->ow;
    if (rt_cpu_blocked(d->in)) {
        const long blocks = pool_blocks(d->in);
#pragma omp parallel for schedule(static) if ((size_t)blocks * hw * BLK >= POOL_PAR_MIN)
        for (long j = 0; j < blocks; j++)
            blk_max_fwd(d, x + (size_t)j * hw * BLK, y + (size_t)j * ohw * BLK);
        return;
    }
    const long planes = pool_planes(d->in);
#pragma omp parallel for schedule(static) if ((size_t)planes * hw >= POOL_PAR_MIN)
    for (long j = 0; j < planes; j++)
        pool_max_plane(d, x + (size_t)j * hw, y + (size_t)j * ohw, NULL, NULL);
}

/*
 * Backward of the unpadded 2x2 stride-2 window with beta 0: the windows tile
 * the plane, so every dx element is stored once (the gradient at each
 * window's first maximum, zero elsewhere) instead of clearing the plane and
 * adding into it; a last odd row or column, outside every window, is zeroed.
 */
static void pool_max2x2s2_bwd_store(const float *plane, int h, int w, int oh, int ow, const float *g, float *out)
{
    for (int oy = 0; oy < oh; oy++) {
        const float *r0 = plane + (size_t)(2 * oy) * w, *r1 = r0 + w;
        float *d0 = out + (size_t)(2 * oy) * w, *d1 = d0 + w;
        /* selects, not branches: which of the four wins is unpredictable */
        for (int ox = 0; ox < ow; ox++) {
            float m = r0[2 * ox], v;
            int best = 0, t;
            v = r0[2 * ox + 1];
            t = v > m || isnan(v);
            m = t ? v : m;
            best = t ? 1 : best;
            v = r1[2 * ox];
            t = v > m || isnan(v);
            m = t ? v : m;
            best = t ? 2 : best;
            v = r1[2 * ox + 1];
            t = v > m || isnan(v);
            best = t ? 3 : best;
            const float gv = g[(size_t)oy * ow + ox];
            d0[2 * ox] = best == 0 ? gv : 0.0f;
            d0[2 * ox + 1] = best == 1 ? gv : 0.0f;
            d1[2 * ox] = best == 2 ? gv : 0.0f;
            d1[2 * ox + 1] = best == 3 ? gv : 0.0f;
        }
        if (w > 2 * ow) {
            d0[w - 1] = 0.0f;
            d1[w - 1] = 0.0f;
        }
    }
    if (h > 2 * oh)
        memset(out + (size_t)(h - 1) * w, 0, (size_t)w * sizeof(float));
}

void rt_cpu_maxpool_bwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, const float *y,
                        const float *dy, float beta, float *dx)
{
    (void)s;
    (void)y; /* the positions are recomputed from x, which settles ties the way forward did */
    const size_t hw = (size_t)d->in.h * d->in.w, ohw = (size_t)d->oh * d->ow;
    if (rt_cpu_blocked(d->in)) {
        const size_t bs = hw * BLK, obs = ohw * BLK;
        const long blocks = pool_blocks(d->in);
#pragma omp parallel for schedule(static) if ((size_t)blocks * bs >= POOL_PAR_MIN)
        for (long j = 0; j < blocks; j++)
            blk_max_bwd(d, x + (size_t)j * bs, dy + (size_t)j * obs, beta, dx + (size_t)j * bs);
        return;
    }
    const int store = beta == 0.0f && d->kh == 2 && d->kw == 2 && d->stride == 2 && d->pad == 0;
    const long planes = pool_planes(d->in);
#pragma omp parallel for schedule(static) if ((size_t)planes * hw >= POOL_PAR_MIN)
    for (long j = 0; j < planes; j++) {
        float *out = dx + (size_t)j * hw;
        if (store) {
            pool_max2x2s2_bwd_store(x + (size_t)j * hw, d->in.h, d->in.w, d->oh, d->ow, dy + (size_t)j * ohw, out);
            continue;
        }
        pool_apply_beta(out, hw, beta);
        pool_max_plane(d, x + (size_t)j * hw, NULL, dy + (size_t)j * ohw, out);
    }
}

void rt_cpu_avgpool_fwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y)
{
    (void)s;
    const size_t hw = (size_t)d->in.h * d->in.w, ohw = (size_t)d->oh * d->ow;
    /* Floor mode keeps every window inside the padded input, so the divisor is always kh*kw. */
    const float inv = 1.0f / (float)(d->kh * d->kw);
    if (rt_cpu_blocked(d->in)) {
        const long blocks = pool_blocks(d->in);
#pragma omp parallel for schedule(static) if ((size_t)blocks * hw * BLK >= POOL_PAR_MIN)
        for (long j = 0; j < blocks; j++)
            blk_avg_fwd(d, x + (size_t)j * hw * BLK, inv, y + (size_t)j * ohw * BLK);
        return;
    }
    const long planes = pool_planes(d->in);
#pragma omp parallel for schedule(static) if ((size_t)planes * hw >= POOL_PAR_MIN)
    for (long j = 0; j < planes; j++) {
        const float *plane = x + (size_t)j * hw;
        float *out = y + (size_t)j * ohw;
        for (int oy = 0; oy < d->oh; oy++) {
            for (int ox = 0; ox < d->ow; ox++) {
                int y0, y1, x0, x1;
                pool_window(d, oy, ox, &y0, &y1, &x0, &x1);
                float acc = 0.0f;
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++)
                        acc += plane[(size_t)iy * d->in.w + ix];
                out[(size_t)oy * d->ow + ox] = acc * inv;
            }
        }
    }
}

void rt_cpu_avgpool_bwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *dy, float beta, float *dx)
{
    (void)s;
    const size_t hw = (size_t)d->in.h * d->in.w, ohw = (size_t)d->oh * d->ow;
    const float inv = 1.0f / (float)(d->kh * d->kw);
    if (rt_cpu_blocked(d->in)) {
        const size_t bs = hw * BLK;
        const long blocks = pool_blocks(d->in);
#pragma omp parallel for schedule(static) if ((size_t)blocks * bs >= POOL_PAR_MIN)
        for (long j = 0; j < blocks; j++) {
            float *out = dx + (size_t)j * bs;
            pool_apply_beta(out, bs, beta);
            blk_avg_bwd(d, dy + (size_t)j * ohw * BLK, inv, out);
        }
        return;
    }
    const long planes = pool_planes(d->in);
#pragma omp parallel for schedule(static) if ((size_t)planes * hw >= POOL_PAR_MIN)
    for (long j = 0; j < planes; j++) {
        const float *g = dy + (size_t)j * ohw;
        float *out = dx + (size_t)j * hw;
        pool_apply_beta(out, hw, beta);
        for (int oy = 0; oy < d->oh; oy++) {
            for (int ox = 0; ox < d->ow; ox++) {
                int y0, y1, x0, x1;
                pool_window(d, oy, ox, &y0, &y1, &x0, &x1);
                const float v = g[(size_t)oy * d->ow + ox] * inv;
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++)
                        out[(size_t)iy * d->in.w + ix] += v;
            }
        }
    }
}

void rt_cpu_gap_fwd(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y)
{
    (void)s;
    const size_t hw = (size_t)sh.h * sh.w;
    const float inv = 1.0f / (float)hw;
    if (rt_cpu_blocked(sh)) {
        /* block plane j = n*(C/16) + c/16 gives features n*C + c = j*16 + c%16 */
        const long blocks = pool_blocks(sh);
#pragma omp parallel for schedule(static) if ((size_t)blocks * hw * BLK >= POOL_PAR_MIN)
        for (long j = 0; j < blocks; j++) {
            const float *p = x + (size_t)j * hw * BLK;
            float acc[BLK] = {0};
            for (size_t i = 0; i < hw; i++) {
#pragma omp simd
                for (int l = 0; l < BLK; l++)
                    acc[l] += p[i * BLK + (size_t)l];
            }
            float *o = y + (size_t)j * BLK;
#pragma omp simd
            for (int l = 0; l < BLK; l++)
                o[l] = acc[l] * inv;
        }
        return;
    }
    const long planes = pool_planes(sh);
#pragma omp parallel for schedule(static) if ((size_t)planes * hw >= POOL_PAR_MIN)
    for (long j = 0; j < planes; j++) {
        const size_t c = (size_t)j / (size_t)sh.n, n = (size_t)j % (size_t)sh.n;
        const float *plane = x + (size_t)j * hw;
        float acc = 0.0f;
        for (size_t i = 0; i < hw; i++)
            acc += plane[i];
        y[n * (size_t)sh.c + c] = acc * inv;
    }
}

void rt_cpu_gap_bwd(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx)
{
    (void)s;
    const size_t hw = (size_t)sh.h * sh.w;
    const float inv = 1.0f / (float)hw;
    if (rt_cpu_blocked(sh)) {
        const long blocks = pool_blocks(sh);
#pragma omp parallel for schedule(static) if ((size_t)blocks * hw * BLK >= POOL_PAR_MIN)
        for (long j = 0; j < blocks; j++) {
            float v[BLK];
#pragma omp simd
            for (int l = 0; l < BLK; l++)
                v[l] = dy[(size_t)j * BLK + (size_t)l] * inv;
            float *out = dx + (size_t)j * hw * BLK;
            for (size_t i = 0; i < hw; i++) {
                float *o = out + i * BLK;
                if (beta == 0.0f) {
#pragma omp simd
                    for (int l = 0; l < BLK; l++)
                        o[l] = v[l];
                } else {
#pragma omp simd
                    for (int l = 0; l < BLK; l++)
                        o[l] = beta * o[l] + v[l];
                }
            }
        }
        return;
    }
    const long planes = pool_planes(sh);
#pragma omp parallel for schedule(static) if ((size_t)planes * hw >= POOL_PAR_MIN)
    for (long j = 0; j < planes; j++) {
        const size_t c = (size_t)j / (size_t)sh.n, n = (size_t)j % (size_t)sh.n;
        const float v = dy[n * (size_t)sh.c + c] * inv;
        float *out = dx + (size_t)j * hw;
        if (beta == 0.0f) {
            for (size_t i = 0; i < hw; i++)
                out[i] = v;
        } else {
            for (size_t i = 0; i < hw; i++)
                out[i] = beta * out[i] + v;
        }
    }
}

void rt_cpu_flatten_fwd(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y)
{
    /* Features (N, C*H*W) in (c, h, w) order are NCHW. */
    rt_cpu_to_nchw(s, sh, x, y);
}

void rt_cpu_flatten_bwd(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx)
{
    if (beta == 0.0f) {
        rt_cpu_from_nchw(s, sh, dy, dx);
        return;
    }
    const size_t hw = (size_t)sh.h * sh.w;
    if (rt_cpu_blocked(sh)) {
        const long blocks = pool_blocks(sh);
        const size_t bs = hw * BLK;
#pragma omp parallel for schedule(static) if ((size_t)blocks * bs >= POOL_PAR_MIN)
        for (long j = 0; j < blocks; j++)
            blk_pack(dy + (size_t)j * bs, hw, beta, dx + (size_t)j * bs);
        return;
    }
    const long planes = pool_planes(sh);
#pragma omp parallel for schedule(static) if ((size_t)planes * hw >= POOL_PAR_MIN)
    for (long j = 0; j < planes; j++) {
        const size_t c = (size_t)j / (size_t)sh.n, n = (size_t)j % (size_t)sh.n;
        const float *g = dy + (n * (size_t)sh.c + c) * hw;
        float *out = dx + (size_t)j * hw;
        for (size_t i = 0; i < hw; i++)
            out[i] = beta * out[i] + g[i];
    }
}

void rt_cpu_linear_fwd(struct rt_stream *s, int n, int in, int out, const float *x, const float *w, const float *b,
                       float *y)
{
    (void)s;
    /* y starts as the bias rows so the GEMM adds into it (beta 1), or is overwritten (beta 0). */
    if (b) {
        for (int i = 0; i < n; i++)
            memcpy(y + (size_t)i * out, b, (size_t)out * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in, b ? 1.0f : 0.0f, y, out);
}

void rt_cpu_linear_bwd_data(struct rt_stream *s, int n, int in, int out, const float *dy, const float *w,
                            float beta, float *dx)
{
    (void)s;
    /* BLAS does not read C when beta is 0, so garbage in dx is fine. */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, dy, out, w, in, beta, dx, in);
}

void rt_cpu_linear_bwd_filter(struct rt_stream *s, int n, int in, int out, const float *x, const float *dy,
                              float *dw, float *db)
{
    (void)s;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
    if (db) {
        /* Column sums of dy over the batch, in order; n*out is too small to be worth threads. */
        for (int o = 0; o < out; o++) {
            float acc = 0.0f;
            for (int i = 0; i < n; i++)
                acc += dy[(size_t)i * out + o];
            db[o] += acc;
        }
    }
}
