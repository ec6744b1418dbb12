/*
 * conv.c - 2-D convolution for the CPU backend (PyTorch semantics: zero
 * padding, dilation 1, groups 1) as im2col over the whole batch plus
 * OpenBLAS sgemm.
 *
 * Activations are (C, N, H, W), so the output of a convolution, (Cout, N,
 * oh, ow), is exactly the matrix y(Cout, P) with P = N*oh*ow, and
 *
 *   forward      y(Cout, P)  = W(Cout, K) col(K, P)          K = Cin*kh*kw
 *   bwd data     dcol(K, P)  = W^T dy,  then col2im adds dcol into dx
 *   bwd filter   dW(Cout, K) += dy col^T,  dbias += row sums of dy
 *
 * where col holds, for each output position, the input patch it sees (row
 * k = (ci*kh + ki)*kw + kj, the order of W's flattened rows). The P columns
 * are processed in chunks of whole output rows so one chunk of col lives in
 * the backend's scratch buffer and stays in cache between im2col and the
 * GEMM; a 1x1 stride-1 unpadded convolution needs no columns at all (x is
 * already col). A chunk is about 8 MB of columns (at least 512 of them),
 * whole images when they fit.
 *
 * Three things keep im2col and col2im a small share of the time, also on the
 * small planes of CIFAR-sized networks (8x8 down to 1x1) where a row of col
 * is a handful of floats:
 *  - with padding or a stride, the chunk's input is first staged: copied
 *    into zero-bordered planes split by stride phase (conv_stage), so that
 *    every row of col is a plain copy of consecutive floats with no edge
 *    cases, and the strided, bordered work is done once per input element
 *    instead of kh*kw times;
 *  - rows are copied in blocks (runs of images x rows) with the common
 *    widths as compile-time constants, so per-row overhead does not
 *    dominate;
 *  - kernel taps that can only ever see padding (all but the centre of a
 *    3x3 kernel on a 1x1 input) are dropped from K, with W packed to match,
 *    since their columns would be all zero (the one difference from
 *    PyTorch: a NaN or Inf in a dropped weight does not reach y); a
 *    convolution left with one tap that reads x in place needs no columns.
 *
 * OpenBLAS threads the GEMMs; im2col, col2im and the bias loops are OpenMP
 * loops with static schedules in which each output element is written by one
 * thread in a fixed order, so results depend only on the thread count.
 *
 * This file does not check shapes (the model did, through
 * rt_conv_desc_init) and does not fuse batchnorm or activations.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "compute/cpu/cpu.h"

/*
 * Target size of one chunk of columns. A few MB keeps the chunk in the L2/L3
 * caches between im2col writing it and the GEMM packing it, while the GEMM
 * still sees hundreds of columns.
 */
#define CONV_CHUNK_BYTES ((size_t)8 << 20)
/*
 * Fewest columns per chunk: below this the GEMM's fixed costs (packing W,
 * reading and writing dW in the filter gradient) outweigh the cache benefit.
 */
#define CONV_CHUNK_MIN_COLS 512
/*
 * Fewest floats a loop must touch to be worth an OpenMP parallel region
 * (microseconds to start and join; far more when the cores are shared).
 * Smaller loops run on the calling thread; every element is computed the
 * same way either way, so results do not change.
 */
#define CONV_PAR_MIN ((size_t)1 << 15)

struct conv_geom {
    int cin, n, h, w;
    int cout, kh, kw, stride, pad, oh, ow;
    int ki0, nki, kj0, nkj; /* the taps that can see input: rows ki0.., columns kj0.. */
    int trimmed;            /* nki*nkj < kh*kw: W is packed down to those taps */
    int staged;             /* stride or padding: taps read a staged copy of the input (see conv_stage) */
    int pa, pb;             /* stride phases along rows and columns that taps read */
    int hq, wq;             /* one phase plane: hq x wq */
    size_t sq;              /* pa*pb*hq*wq: one staged (channel, image) plane */
    size_t hw;              /* h*w: one input plane */
    size_t K;               /* cin*nki*nkj: rows of col, columns of the (packed) W */
    size_t P;               /* n*oh*ow: output positions, columns of y */
    size_t R;               /* n*oh: output rows, the unit chunks are made of */
};

/*
 * Taps t of a kernel of size k along one axis that read an input position
 * o*s - p + t inside [0, in) for some output o < out: the range [*t0, *t0 +
 * *nt). (It may include a tap that strides over the input and sees none;
 * that costs time, not correctness.) When no tap sees input the output is
 * all padding, and tap 0 stands in for the rest.
 */
static void conv_taps(int k, int in, int out, int s, int p, int *t0, int *nt)
{
    int lo = p - (out - 1) * s, hi = in - 1 + p;
    if (lo < 0)
        lo = 0;
    if (hi > k - 1)
        hi = k - 1;
    if (hi < lo)
        lo = hi = 0;
    *t0 = lo;
    *nt = hi - lo + 1;
}

static struct conv_geom conv_geom_of(const struct rt_conv_desc *d)
{
    struct conv_geom g = {
        .cin = d->in.c, .n = d->in.n, .h = d->in.h, .w = d->in.w,
        .cout = d->cout, .kh = d->kh, .kw = d->kw, .stride = d->stride, .pad = d->pad,
        .oh = d->oh, .ow = d->ow,
    };
    conv_taps(g.kh, g.h, g.oh, g.stride, g.pad, &g.ki0, &g.nki);
    conv_taps(g.kw, g.w, g.ow, g.stride, g.pad, &g.kj0, &g.nkj);
    g.trimmed = g.nki * g.nkj < g.kh * g.kw;
    g.staged = g.stride > 1 || g.pad > 0;
    g.pa = g.nki < g.stride ? g.nki : g.stride;
    g.pb = g.nkj < g.stride ? g.nkj : g.stride;
    g.hq = g.oh + (g.nki - 1) / g.stride;
    g.wq = g.ow + (g.nkj - 1) / g.stride;
    g.sq = (size_t)g.pa * g.pb * g.hq * g.wq;
    g.hw = (size_t)g.h * g.w;
    g.K = (size_t)g.cin * g.nki * g.nkj;
    g.R = (size_t)g.n * g.oh;
    g.P = g.R * g.ow;
    return g;
}

/*
 * col would be x itself: a single tap that reads input (oy, ox) for output
 * (oy, ox). That is a 1x1 stride-1 unpadded convolution, and also any
 * "same" convolution of a 1x1 input once the taps that see only padding are
 * trimmed (resnet18's last stage on 32x32 images).
 */
static int conv_direct(const struct conv_geom *g)
{
    return g->nki == 1 && g->nkj == 1 && g->stride == 1 && g->ki0 == g->pad && g->kj0 == g->pad && g->oh == g->h &&
           g->ow == g->w;
}

/*
 * Output rows per chunk: about CONV_CHUNK_BYTES of columns, whole images when
 * an image is smaller than that (so col2im rarely splits a plane), and the
 * chunks evened out so the last one is not a sliver.
 */
static size_t conv_chunk_rows(const struct conv_geom *g)
{
    size_t cols = CONV_CHUNK_BYTES / (g->K * sizeof(float));
    if (cols < CONV_CHUNK_MIN_COLS)
        cols = CONV_CHUNK_MIN_COLS;
    size_t rows = cols / (size_t)g->ow;
    if (rows < 1)
        rows = 1;
    if (rows >= g->R)
        return g->R;
    size_t unit = rows >= (size_t)g->oh ? (size_t)g->oh : 1;
    size_t units = g->R / unit;
    size_t per = rows / unit;
    size_t chunks = (units + per - 1) / per;
    return (units + chunks - 1) / chunks * unit;
}

/*
 * Output rows [r0, r1) as at most three runs of the same shape: a partial
 * first image, whole images, a partial last image. Working on runs rather
 * than rows keeps the per-row bookkeeping out of the copy loops.
 */
struct conv_run {
    size_t n;     /* first image of the run */
    int imgs;     /* images in it */
    int oy0, rows; /* the output rows it covers in each image */
};

static int conv_runs(const struct conv_geom *g, size_t r0, size_t r1, struct conv_run run[3])
{
    const size_t oh = (size_t)g->oh;
    size_t r = r0;
    int k = 0;
    if (r % oh) {
        const size_t n = r / oh, end = r1 < (n + 1) * oh ? r1 : (n + 1) * oh;
        run[k++] = (struct conv_run){n, 1, (int)(r - n * oh), (int)(end - r)};
        r = end;
    }
    if (r1 - r >= oh) {
        const size_t full = (r1 - r) / oh;
        run[k++] = (struct conv_run){r / oh, (int)full, 0, g->oh};
        r += full * oh;
    }
    if (r < r1)
        run[k++] = (struct conv_run){r / oh, 1, 0, (int)(r1 - r)};
    return k;
}

/* Floats rounded up to a 64-byte multiple, so the scratch regions stay aligned. */
static size_t conv_round(size_t floats)
{
    return (floats + 15) & ~(size_t)15;
}

/*
 * The scratch regions of one call: the packed W (or its gradient) when taps
 * are trimmed; and unless the convolution is direct, one chunk of staged
 * planes (conv_stage) and one chunk of col.
 */
struct conv_scratch {
    float *wk, *planes, *col;
};

static struct conv_scratch conv_scratch_get(struct rt_stream *s, const struct conv_geom *g, size_t rows)
{
    const size_t nw = g->trimmed ? conv_round((size_t)g->cout * g->K) : 0;
    size_t np = 0, nc = 0;
    if (!conv_direct(g)) {
        /* a chunk of `rows` output rows touches at most rows/oh + 2 images */
        size_t imgs = rows / (size_t)g->oh + 2;
        if (imgs > (size_t)g->n)
            imgs = (size_t)g->n;
        np = conv_round((size_t)g->cin * imgs * g->sq);
        nc = conv_round(g->K * rows * g->ow);
    }
    if (nw + np + nc == 0)
        return (struct conv_scratch){NULL, NULL, NULL};
    float *p = rt_cpu_scratch(s, (nw + np + nc) * sizeof(float));
    if (!p) {
        fprintf(stderr, "ringtrain: out of memory for convolution columns\n");
        abort();
    }
    return (struct conv_scratch){.wk = g->trimmed ? p : NULL, .planes = p + nw, .col = p + nw + np};
}

/* wk(Cout, Cin, nki, nkj) = the taps of w(Cout, Cin, kh, kw) that see input. */
static void conv_pack_w(const struct conv_geom *g, const float *w, float *wk)
{
    const long rows = (long)g->cout * g->cin;
#pragma omp parallel for schedule(static) if ((size_t)rows * g->kh * g->kw >= CONV_PAR_MIN)
    for (long j = 0; j < rows; j++) {
        const float *src = w + (size_t)j * g->kh * g->kw + (size_t)g->ki0 * g->kw + g->kj0;
        float *dst = wk + (size_t)j * g->nki * g->nkj;
        for (int a = 0; a < g->nki; a++)
            for (int b = 0; b < g->nkj; b++)
                dst[a * g->nkj + b] = src[a * g->kw + b];
    }
}

/* dw += wk scattered back to the taps it was packed from. */
static void conv_unpack_add_dw(const struct conv_geom *g, const float *wk, float *dw)
{
    const long rows = (long)g->cout * g->cin;
#pragma omp parallel for schedule(static) if ((size_t)rows * g->kh * g->kw >= CONV_PAR_MIN)
    for (long j = 0; j < rows; j++) {
        float *dst = dw + (size_t)j * g->kh * g->kw + (size_t)g->ki0 * g->kw + g->kj0;
        const float *src = wk + (size_t)j * g->nki * g->nkj;
        for (int a = 0; a < g->nki; a++)
            for (int b = 0; b < g->nkj; b++)
                dst[a * g->kw + b] += src[a * g->nkj + b];
    }
}

/*
 * Blocks of rows: `imgs` images of `rows` rows of n floats, row r of image i
 * at base + i*ip + r*rp. The copies and adds between blocks hand the common
 * widths to inlined loops with a constant trip count, which compile to a few
 * vector moves: on 8x8 and smaller planes a row is a handful of floats and
 * per-row overhead, not bandwidth, would set the cost.
 */
struct conv_blk {
    size_t ip, rp; /* image and row pitch, in floats */
};

/*
 * The widths that get a loop of their own, the same for every block
 * operation below (copy, add, strided gather and scatter-add); a new width is
 * added here. Each operation's own loop is exact whatever the width --
 * copies, or one add per element in the same order -- so which widths are
 * listed changes the speed, never a float.
 */
#define CONV_WIDTHS(X, blk_n) X(1, blk_n) X(2, blk_n) X(4, blk_n) X(8, blk_n) X(16, blk_n) X(32, blk_n)
#define CONV_WIDTH_CASE(w, blk_n)                                                                                      \
    case w:                                                                                                            \
        blk_n(d, db, s, sb, imgs, rows, w);                                                                            \
        return 1;
/*
 * Defines `static int name(d, db, s, sb, imgs, rows, n)`: when n is one of
 * CONV_WIDTHS it runs blk_n(d, db, s, sb, imgs, rows, W) with W a constant
 * equal to n, so that the inlined loop has a fixed trip count, and returns 1;
 * otherwise it does nothing and returns 0, and the caller runs its general
 * loop.
 */
#define CONV_BY_WIDTH(name, blk_n)                                                                                     \
    static int name(float *restrict d, struct conv_blk db, const float *restrict s, struct conv_blk sb, int imgs,      \
                    int rows, int n)                                                                                   \
    {                                                                                                                  \
        switch (n) {                                                                                                   \
            CONV_WIDTHS(CONV_WIDTH_CASE, blk_n)                                                                        \
        }                                                                                                              \
        return 0;                                                                                                      \
    }

static inline void conv_copy_blk_n(float *restrict d, struct conv_blk db, const float *restrict s,
                                   struct conv_blk sb, int imgs, int rows, const int n)
{
    for (int i = 0; i < imgs; i++)
        for (int r = 0; r < rows; r++) {
            float *dr = d + i * db.ip + r * db.rp;
            const float *sr = s + i * sb.ip + r * sb.rp;
            for (int e = 0; e < n; e++)
                dr[e] = sr[e];
        }
}

CONV_BY_WIDTH(conv_copy_blk_w, conv_copy_blk_n)

static void conv_copy_blk(float *restrict d, struct conv_blk db, const float *restrict s, struct conv_blk sb,
                          int imgs, int rows, int n)
{
    if (conv_copy_blk_w(d, db, s, sb, imgs, rows, n))
        return;
    for (int i = 0; i < imgs; i++)
        for (int r = 0; r < rows; r++)
            memcpy(d + i * db.ip + r * db.rp, s + i * sb.ip + r * sb.rp, (size_t)n * sizeof(float));
}

static inline void conv_add_blk_n(float *restrict d, struct conv_blk db, const float *restrict s, struct conv_blk sb,
                                  int imgs, int rows, const int n)
{
    for (int i = 0; i < imgs; i++)
        for (int r = 0; r < rows; r++) {
            float *dr = d + i * db.ip + r * db.rp;
            const float *sr = s + i * sb.ip + r * sb.rp;
#pragma omp simd
            for (int e = 0; e < n; e++)
                dr[e] += sr[e];
        }
}

CONV_BY_WIDTH(conv_add_blk_w, conv_add_blk_n)

static void conv_add_blk(float *restrict d, struct conv_blk db, const float *restrict s, struct conv_blk sb,
                         int imgs, int rows, int n)
{
    if (!conv_add_blk_w(d, db, s, sb, imgs, rows, n))
        conv_add_blk_n(d, db, s, sb, imgs, rows, n);
}

/*
 * As conv_copy_blk, reading every es-th float of the source rows, and as
 * conv_add_blk, adding into every es-th float of the destination rows:
 * staging for strided convolutions. Stride 2 with the common widths gets
 * constant trip counts too, for the 4x4 and smaller planes where a row is a
 * float or two and a block is a run of images.
 */
static inline void conv_gather_blk_n(float *restrict d, struct conv_blk db, const float *restrict s,
                                     struct conv_blk sb, int imgs, int rows, const int n, const int es)
{
    for (int i = 0; i < imgs; i++)
        for (int r = 0; r < rows; r++) {
            float *dr = d + i * db.ip + r * db.rp;
            const float *sr = s + i * sb.ip + r * sb.rp;
            for (int e = 0; e < n; e++)
                dr[e] = sr[(size_t)e * es];
        }
}

static inline void conv_gather2_blk_n(float *restrict d, struct conv_blk db, const float *restrict s,
                                      struct conv_blk sb, int imgs, int rows, const int n)
{
    conv_gather_blk_n(d, db, s, sb, imgs, rows, n, 2);
}

CONV_BY_WIDTH(conv_gather2_blk_w, conv_gather2_blk_n)

static void conv_gather_blk(float *restrict d, struct conv_blk db, const float *restrict s, struct conv_blk sb,
                            int imgs, int rows, int n, int es)
{
    if (es != 2 || !conv_gather2_blk_w(d, db, s, sb, imgs, rows, n))
        conv_gather_blk_n(d, db, s, sb, imgs, rows, n, es);
}

static inline void conv_scatter_add_blk_n(float *restrict d, struct conv_blk db, const float *restrict s,
                                          struct conv_blk sb, int imgs, int rows, const int n, const int es)
{
    for (int i = 0; i < imgs; i++)
        for (int r = 0; r < rows; r++) {
            float *dr = d + i * db.ip + r * db.rp;
            const float *sr = s + i * sb.ip + r * sb.rp;
            for (int e = 0; e < n; e++)
                dr[(size_t)e * es] += sr[e];
        }
}

static inline void conv_scatter_add2_blk_n(float *restrict d, struct conv_blk db, const float *restrict s,
                                           struct conv_blk sb, int imgs, int rows, const int n)
{
    conv_scatter_add_blk_n(d, db, s, sb, imgs, rows, n, 2);
}

CONV_BY_WIDTH(conv_scatter_add2_blk_w, conv_scatter_add2_blk_n)

static void conv_scatter_add_blk(float *restrict d, struct conv_blk db, const float *restrict s, struct conv_blk sb,
                                 int imgs, int rows, int n, int es)
{
    if (es != 2 || !conv_scatter_add2_blk_w(d, db, s, sb, imgs, rows, n))
        conv_scatter_add_blk_n(d, db, s, sb, imgs, rows, n, es);
}

/*
 * The staged input. With padding or a stride, im2col does not read x: each
 * (channel, image) plane is first copied into pa*pb phase planes of hq x wq,
 * where element (a, b, i, j) is input (ki0 + a + s*i - pad, kj0 + b + s*j -
 * pad), zero where that lies in the padding. Tap (ki0 + ta, kj0 + tb) of
 * output (oy, ox) is then element (ta % s, tb % s, oy + ta / s, ox + tb / s):
 * for every tap, consecutive outputs of a row read consecutive floats, and
 * the strided and edge-case work is done once per input element here rather
 * than once per element of col (kh*kw times as many). Without stride or
 * padding the layout is x's own (one phase, hq x wq = h x w).
 *
 * conv_valid gives the phase-plane indices [*lo, *hi) along one axis whose
 * input coordinate o + s*i lies inside [0, in).
 */
static void conv_valid(int o, int s, int in, int nq, int *lo, int *hi)
{
    int a = o >= 0 ? 0 : (-o + s - 1) / s;
    int b = in - o <= 0 ? 0 : (in - o + s - 1) / s;
    if (b > nq)
        b = nq;
    if (a > b)
        a = b;
    *lo = a;
    *hi = b;
}

/* Stages channel ci of images [n_first, n_first + nimg) into dst (nimg planes of sq floats). */
static void conv_stage(const struct conv_geom *g, const float *x, int ci, size_t n_first, size_t nimg, float *dst)
{
    const int s = g->stride;
    const float *xc = x + ((size_t)ci * g->n + n_first) * g->hw;
    const struct conv_blk qb = {g->sq, (size_t)g->wq}, xb = {g->hw, (size_t)s * g->w};
    /* Without padding no tap reads outside the input, so the rest of the phase planes is never read. */
    if (g->pad)
        memset(dst, 0, nimg * g->sq * sizeof(float));
    for (int a = 0; a < g->pa; a++) {
        int i0, i1;
        conv_valid(g->ki0 + a - g->pad, s, g->h, g->hq, &i0, &i1);
        for (int b = 0; b < g->pb; b++) {
            int j0, j1;
            conv_valid(g->kj0 + b - g->pad, s, g->w, g->wq, &j0, &j1);
            if (i0 == i1 || j0 == j1)
                continue;
            const int r = g->ki0 + a - g->pad + s * i0, c = g->kj0 + b - g->pad + s * j0;
            float *q = dst + (size_t)(a * g->pb + b) * g->hq * g->wq + (size_t)i0 * g->wq + j0;
            const float *src = xc + (size_t)r * g->w + c;
            if (s == 1)
                conv_copy_blk(q, qb, src, xb, (int)nimg, i1 - i0, j1 - j0);
            else
                conv_gather_blk(q, qb, src, xb, (int)nimg, i1 - i0, j1 - j0, s);
        }
    }
}

/*
 * The inverse for gradients: the dx planes of channel ci, images [n_first,
 * n_first + nimg), become beta * dx plus the staged gradient in acc, added
 * back onto the input positions it was staged from. With `cont` the first
 * image continues from the previous chunk: beta is not applied to it again.
 */
static void conv_unstage(const struct conv_geom *g, const float *acc, int ci, size_t n_first, size_t nimg, int cont,
                         float beta, float *dx)
{
    const int s = g->stride;
    float *out = dx + ((size_t)ci * g->n + n_first) * g->hw;
    const struct conv_blk qb = {g->sq, (size_t)g->wq}, xb = {g->hw, (size_t)s * g->w};
    float *fresh = out + (size_t)cont * g->hw;
    const size_t nfresh = nimg - (size_t)cont;
    int i0, i1, j0, j1;
    conv_valid(g->ki0 - g->pad, s, g->h, g->hq, &i0, &i1);
    conv_valid(g->kj0 - g->pad, s, g->w, g->wq, &j0, &j1);
    if (beta == 0.0f && s == 1 && i1 - i0 == g->h && j1 - j0 == g->w) {
        /* one phase that covers the whole input: store rather than clear and add */
        const float *q = acc + (size_t)i0 * g->wq + j0;
        if (cont)
            conv_add_blk(out, xb, q, qb, 1, g->h, g->w);
        conv_copy_blk(fresh, xb, q + (size_t)cont * g->sq, qb, (int)nfresh, g->h, g->w);
        return;
    }
    if (beta == 0.0f) {
        memset(fresh, 0, nfresh * g->hw * sizeof(float));
    } else if (beta != 1.0f) {
        for (size_t i = 0; i < nfresh * g->hw; i++)
            fresh[i] *= beta;
    }
    for (int a = 0; a < g->pa; a++) {
        conv_valid(g->ki0 + a - g->pad, s, g->h, g->hq, &i0, &i1);
        for (int b = 0; b < g->pb; b++) {
            conv_valid(g->kj0 + b - g->pad, s, g->w, g->wq, &j0, &j1);
            if (i0 == i1 || j0 == j1)
                continue;
            const int r = g->ki0 + a - g->pad + s * i0, c = g->kj0 + b - g->pad + s * j0;
            const float *q = acc + (size_t)(a * g->pb + b) * g->hq * g->wq + (size_t)i0 * g->wq + j0;
            float *d = out + (size_t)r * g->w + c;
            if (s == 1)
                conv_add_blk(d, xb, q, qb, (int)nimg, i1 - i0, j1 - j0);
            else
                conv_scatter_add_blk(d, xb, q, qb, (int)nimg, i1 - i0, j1 - j0, s);
        }
    }
}

/*
 * Where tap (ki0 + ta, kj0 + tb) reads output row oy0's patch row in a
 * (channel, image) plane of the layout im2col reads (row pitch wq), relative
 * to the plane's start.
 */
static size_t conv_tap_offset(const struct conv_geom *g, int ta, int tb, int oy0)
{
    const int s = g->stride;
    return (size_t)((ta % s) * g->pb + (tb % s)) * g->hq * g->wq + (size_t)(oy0 + ta / s) * g->wq +
           (size_t)(tb / s);
}

/*
 * col(K, (r1-r0)*ow) = the patches of output rows [r0, r1) (row r is image
 * r / oh, output row r % oh): the chunk's images are staged when there is a
 * stride or padding, then one thread writes each row of col as copies of
 * whole rows.
 */
static void conv_im2col(const struct conv_geom *g, const float *x, size_t r0, size_t r1, float *planes, float *col)
{
    const size_t ld = (r1 - r0) * (size_t)g->ow;
    struct conv_run run[3];
    const int nrun = conv_runs(g, r0, r1, run);
    const size_t n_first = run[0].n, nimg = run[nrun - 1].n + (size_t)run[nrun - 1].imgs - n_first;
    const int ow = g->ow, taps = g->nki * g->nkj;
    /* what the taps read, and its channel and image pitches */
    const float *base = g->staged ? planes : x + n_first * g->hw;
    const size_t cp = g->staged ? nimg * g->sq : (size_t)g->n * g->hw;
    const size_t ip = g->staged ? g->sq : g->hw;
    const long K = (long)g->K;
    if (g->staged && taps == 1 && r0 % (size_t)g->oh == 0 && r1 % (size_t)g->oh == 0) {
        /* one tap per channel (1x1 strided) over whole images: the staged planes are col's rows */
#pragma omp parallel for schedule(static) if (g->K * ld >= CONV_PAR_MIN)
        for (int ci = 0; ci < g->cin; ci++)
            conv_stage(g, x, ci, n_first, nimg, col + (size_t)ci * ld);
        return;
    }
#pragma omp parallel if (g->K * ld >= CONV_PAR_MIN)
    {
        if (g->staged) {
#pragma omp for schedule(static)
            for (int ci = 0; ci < g->cin; ci++)
                conv_stage(g, x, ci, n_first, nimg, planes + (size_t)ci * cp);
        }
        /* the loop above ends in a barrier: every plane is staged */
#pragma omp for schedule(static)
        for (long k = 0; k < K; k++) {
            const int ci = (int)(k / taps), ta = (int)(k % taps) / g->nkj, tb = (int)(k % g->nkj);
            float *dst = col + (size_t)k * ld;
            for (int q = 0; q < nrun; q++) {
                const struct conv_run *u = &run[q];
                const float *src = base + (size_t)ci * cp + (u->n - n_first) * ip + conv_tap_offset(g, ta, tb, u->oy0);
                conv_copy_blk(dst, (struct conv_blk){(size_t)u->rows * ow, (size_t)ow}, src,
                              (struct conv_blk){ip, (size_t)g->wq}, u->imgs, u->rows, ow);
                dst += (size_t)u->imgs * u->rows * ow;
            }
        }
    }
}

/*
 * dx = beta * dx + col2im(col) over output rows [r0, r1). Parallel over
 * input channels: each thread sums its channels' taps, in order, into staged
 * planes in `planes` (the layout im2col reads), then unstages them into dx.
 * beta applies in the chunk holding an image's first output row, which is
 * the first chunk to touch the image; a later chunk adds.
 */
static void conv_col2im(const struct conv_geom *g, const float *col, size_t r0, size_t r1, float beta, float *planes,
                        float *dx)
{
    const size_t ld = (r1 - r0) * (size_t)g->ow;
    struct conv_run run[3];
    const int nrun = conv_runs(g, r0, r1, run);
    const size_t n_first = run[0].n, nimg = run[nrun - 1].n + (size_t)run[nrun - 1].imgs - n_first;
    const int ow = g->ow, taps = g->nki * g->nkj;
    const int cont = r0 % (size_t)g->oh != 0;
    const struct conv_blk qb = {g->sq, (size_t)g->wq};
    if (taps == 1 && !cont && r1 % (size_t)g->oh == 0) {
        /* one tap per channel over whole images: col's rows are the staged planes */
#pragma omp parallel for schedule(static) if (g->K * ld >= CONV_PAR_MIN)
        for (int ci = 0; ci < g->cin; ci++)
            conv_unstage(g, col + (size_t)ci * ld, ci, n_first, nimg, 0, beta, dx);
        return;
    }
#pragma omp parallel for schedule(static) if (g->K * ld >= CONV_PAR_MIN)
    for (int ci = 0; ci < g->cin; ci++) {
        float *acc = planes + (size_t)ci * nimg * g->sq;
        memset(acc, 0, nimg * g->sq * sizeof(float));
        for (int t = 0; t < taps; t++) {
            const int ta = t / g->nkj, tb = t % g->nkj;
            const float *src = col + ((size_t)ci * taps + t) * ld;
            for (int q = 0; q < nrun; q++) {
                const struct conv_run *u = &run[q];
                float *dst = acc + (u->n - n_first) * g->sq + conv_tap_offset(g, ta, tb, u->oy0);
                conv_add_blk(dst, qb, src, (struct conv_blk){(size_t)u->rows * ow, (size_t)ow}, u->imgs, u->rows, ow);
                src += (size_t)u->imgs * u->rows * ow;
            }
        }
        conv_unstage(g, acc, ci, n_first, nimg, cont, beta, dx);
    }
}

/* y(Cout, cols, leading dimension ld) += bias per row. */
static void conv_add_bias(const float *bias, int cout, size_t cols, size_t ld, float *y)
{
#pragma omp parallel for schedule(static) if ((size_t)cout * cols >= CONV_PAR_MIN)
    for (int co = 0; co < cout; co++) {
        float *row = y + (size_t)co * ld;
        const float b = bias[co];
#pragma omp simd
        for (size_t i = 0; i < cols; i++)
            row[i] += b;
    }
}

void rt_cpu_conv2d_fwd(struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *w,
                       const float *bias, float *y)
{
    const struct conv_geom g = conv_geom_of(d);
    const int P = (int)g.P, K = (int)g.K;
    const size_t rows = conv_chunk_rows(&g);
    const struct conv_scratch sc = conv_scratch_get(s, &g, rows);
    const float *wk = w;
    if (g.trimmed) {
        conv_pack_w(&g, w, sc.wk);
        wk = sc.wk;
    }
    if (conv_direct(&g)) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g.cout, P, K, 1.0f, wk, K, x, P, 0.0f, y, P);
        if (bias)
            conv_add_bias(bias, g.cout, g.P, g.P, y);
        return;
    }
    for (size_t r0 = 0; r0 < g.R; r0 += rows) {
        const size_t r1 = r0 + rows < g.R ? r0 + rows : g.R;
        const int cols = (int)((r1 - r0) * g.ow);
        float *yc = y + r0 * g.ow;
        conv_im2col(&g, x, r0, r1, sc.planes, sc.col);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g.cout, cols, K, 1.0f, wk, K, sc.col, cols, 0.0f,
                    yc, P);
        if (bias)
            conv_add_bias(bias, g.cout, (size_t)cols, g.P, yc);
    }
}

void rt_cpu_conv2d_bwd_data(struct rt_stream *s, const struct rt_conv_desc *d, const float *dy, const float *w,
                            float beta, float *dx)
{
    const struct conv_geom g = conv_geom_of(d);
    const int P = (int)g.P, K = (int)g.K;
    const size_t rows = conv_chunk_rows(&g);
    const struct conv_scratch sc = conv_scratch_get(s, &g, rows);
    const float *wk = w;
    if (g.trimmed) {
        conv_pack_w(&g, w, sc.wk);
        wk = sc.wk;
    }
    if (conv_direct(&g)) {
        /* BLAS does not read C when beta is 0, so garbage in dx is fine. */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, P, g.cout, 1.0f, wk, K, dy, P, beta, dx, P);
        return;
    }
    for (size_t r0 = 0; r0 < g.R; r0 += rows) {
        const size_t r1 = r0 + rows < g.R ? r0 + rows : g.R;
        const int cols = (int)((r1 - r0) * g.ow);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, cols, g.cout, 1.0f, wk, K, dy + r0 * g.ow, P, 0.0f,
                    sc.col, cols);
        conv_col2im(&g, sc.col, r0, r1, beta, sc.planes, dx);
    }
}

void rt_cpu_conv2d_bwd_filter(struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *dy,
                              float *dw, float *dbias)
{
    const struct conv_geom g = conv_geom_of(d);
    const int P = (int)g.P, K = (int)g.K;
    if (dbias) {
        /* Summed in double: P reaches 10^5 and more, and the order is fixed per build. */
#pragma omp parallel for schedule(static) if ((size_t)g.cout * g.P >= CONV_PAR_MIN)
        for (int co = 0; co < g.cout; co++) {
            const float *row = dy + (size_t)co * g.P;
            double acc = 0.0;
#pragma omp simd reduction(+ : acc)
            for (size_t i = 0; i < g.P; i++)
                acc += row[i];
            dbias[co] += (float)acc;
        }
    }
    const size_t rows = conv_chunk_rows(&g);
    const struct conv_scratch sc = conv_scratch_get(s, &g, rows);
    /* Trimmed taps: the packed gradient starts from zero (beta 0 on the first GEMM) and is added into dw at the end. */
    float *dwk = g.trimmed ? sc.wk : dw;
    if (conv_direct(&g)) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g.cout, K, P, 1.0f, dy, P, x, P, g.trimmed ? 0.0f : 1.0f,
                    dwk, K);
    } else {
        for (size_t r0 = 0; r0 < g.R; r0 += rows) {
            const size_t r1 = r0 + rows < g.R ? r0 + rows : g.R;
            const int cols = (int)((r1 - r0) * g.ow);
            const float gbeta = g.trimmed && r0 == 0 ? 0.0f : 1.0f;
            conv_im2col(&g, x, r0, r1, sc.planes, sc.col);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g.cout, K, cols, 1.0f, dy + r0 * g.ow, P, sc.col,
                        cols, gbeta, dwk, K);
        }
    }
    if (g.trimmed)
        conv_unpack_add_dw(&g, dwk, dw);
}
