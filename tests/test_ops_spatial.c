/*
 * test_ops_spatial.c - the CPU backend's spatial ops through the op table:
 * convolution, max/average/global pooling, flatten, linear, the NCHW
 * layout conversions and batchnorm's inference-mode backward (bn_infer_bwd,
 * a frozen layer's; the rest of batchnorm is test_ops_elem.c's).
 *
 * Every forward is compared with a naive direct loop written here in NCHW
 * and double precision. Every backward is compared element by element with
 * a naive double-precision backward, and that reference is itself checked by
 * central finite differences of loss = sum(y * r) on a fixed subset of 16
 * elements per tensor, 4 in the big cases that exist to exercise chunking
 * (the op's own forward in float, step 1e-2: the ops are linear, or
 * piecewise linear with well-separated inputs for max pooling, so the
 * differences are exact up to float rounding). Then beta = 0 must ignore a
 * NaN-filled output, beta = 1 must add to it, and parameter gradients must
 * accumulate.
 *
 * Tolerances, |got - want| <= atol + rtol * max|want| over the tensor:
 *   forward and backward vs the naive reference: atol 1e-5, rtol 1e-5
 *   finite differences vs the reference gradient: atol 1e-3, rtol 3e-3
 * (an index mistake moves an element by the order of max|want|).
 *
 * The CPU backend stores spatial tensors blocked (nChw16c) when C is a
 * multiple of 16 and channel-major (C, N, H, W) otherwise, with a kernel
 * path for each, so every op runs with both kinds of C (1..7; 16, 32, 64).
 * Only test_layout looks at the memory; the others go through from_nchw /
 * to_nchw and need not know the layout.
 *
 * Seeds are fixed and printed; the whole test runs in about a second
 * (a few seconds under AddressSanitizer).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "test_util.h"
#include "common/common.h"
#include "compute/compute.h"

#define SEED 20241121u

#define REF_ATOL 1e-5
#define REF_RTOL 1e-5
#define FD_ATOL 1e-3
#define FD_RTOL 3e-3
#define FD_STEP 1e-2f
#define FD_POINTS 16 /* elements checked by finite differences per tensor */
#define FD_POINTS_BIG 4 /* the same where one forward touches more than FD_BIG floats */
#define FD_BIG 20000

static struct rt_backend *be;
static const struct rt_ops *ops;
static struct rt_stream *st;

/* ---- host and device helpers ----------------------------------------------- */

static float *dev_alloc(size_t floats)
{
    float *p = ops->alloc(be, floats * sizeof(float));
    if (!p) {
        fprintf(stderr, "test_ops_spatial: ops->alloc: %s\n", rt_errmsg());
        exit(1);
    }
    return p;
}

static void fill_uniform(struct rt_rng *r, float *p, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * rt_rng_uniform(r);
}

static void fill_value(float *p, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        p[i] = v;
}

static size_t shape_count(struct rt_shape4 s)
{
    return (size_t)s.n * s.c * s.h * s.w;
}

/* Host NCHW -> new device spatial tensor. */
static float *dev_spatial(struct rt_shape4 s, const float *nchw)
{
    float *d = dev_alloc(shape_count(s));
    ops->from_nchw(st, s, nchw, d);
    return d;
}

static float *dev_plain(const float *host, size_t n)
{
    float *d = dev_alloc(n);
    ops->upload(st, d, host, n * sizeof(float));
    return d;
}

static void get_spatial(struct rt_shape4 s, const float *d, float *nchw)
{
    ops->to_nchw(st, s, d, nchw);
    ops->sync(st);
}

static void get_plain(const float *d, float *host, size_t n)
{
    ops->download(st, host, d, n * sizeof(float));
    ops->sync(st);
}

/*
 * Compares got with want element by element; prints the first few misses
 * with `op`, `shape`, `what` and the index, and records one check.
 */
static void compare(const char *op, const char *shape, const char *what, const float *got, const double *want,
                    size_t n, double atol, double rtol)
{
    double scale = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(want[i]));
    const double tol = atol + rtol * scale;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        if (isnan(want[i]) && isnan(got[i]))
            continue; /* a NaN that must propagate did */
        if (!(err <= tol)) {
            if (bad < 5)
                fprintf(stderr, "  %s %s %s[%zu]: got %.8g want %.8g (|diff| %.3g > tol %.3g)\n", op, shape, what,
                        i, (double)got[i], want[i], err, tol);
            bad++;
        }
    }
    CHECKF(bad == 0, "%s %s %s: %zu of %zu elements off", op, shape, what, bad, n);
}

/* Index j of the `points` elements of an n-element tensor checked by finite differences. */
static size_t fd_index(size_t j, size_t n, size_t points)
{
    size_t step = n / points;
    return step ? j * step + (j * 7) % step : j;
}

/*
 * Central differences of loss(ctx) with respect to host array t (n floats):
 * for each checked element, compares (loss(t+h) - loss(t-h)) / 2h with
 * grad[i] (the reference gradient).
 */
static void check_fd(const char *op, const char *shape, const char *what, float *t, size_t n, const double *grad,
                     double (*loss)(void *), void *ctx, size_t work)
{
    /* Big cases are there for chunking, which the full reference comparison covers; a few points suffice. */
    const size_t want = work > FD_BIG ? FD_POINTS_BIG : FD_POINTS;
    size_t points = n < want ? n : want;
    float *num = tu_xmalloc(points * sizeof(float));
    double *ref = tu_xmalloc(points * sizeof(double));
    for (size_t j = 0; j < points; j++) {
        size_t i = fd_index(j, n, points);
        float keep = t[i];
        t[i] = keep + FD_STEP;
        double lp = loss(ctx);
        t[i] = keep - FD_STEP;
        double lm = loss(ctx);
        t[i] = keep;
        num[j] = (float)((lp - lm) / (2.0 * (double)FD_STEP));
        ref[j] = grad[i];
    }
    loss(ctx); /* leaves the device copies as the host arrays are again */
    char w[64];
    snprintf(w, sizeof(w), "%s (finite differences)", what);
    compare(op, shape, w, num, ref, points, FD_ATOL, FD_RTOL);
    free(num);
    free(ref);
}

static double dot_f(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* want[i] = old[i] + add[i] */
static double *sum_ref(const float *old, const double *add, size_t n)
{
    double *d = tu_xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        d[i] = (double)old[i] + add[i];
    return d;
}

/* ---- convolution ------------------------------------------------------------- */

struct conv_case {
    int n, cin, h, w, cout, kh, kw, stride, pad, bias;
};

struct conv_ctx {
    struct rt_conv_desc d;
    struct rt_shape4 ys;
    float *x, *w, *b, *r, *y;      /* host: x, y NCHW */
    float *dx_, *dw_, *db_, *dy_;  /* device */
    int bias;
};

static void conv_ref_fwd(const struct rt_conv_desc *d, const float *x, const float *w, const float *b, double *y)
{
    const int N = d->in.n, C = d->in.c, H = d->in.h, W = d->in.w;
    for (int n = 0; n < N; n++)
        for (int co = 0; co < d->cout; co++)
            for (int oy = 0; oy < d->oh; oy++)
                for (int ox = 0; ox < d->ow; ox++) {
                    double acc = b ? b[co] : 0.0;
                    for (int ci = 0; ci < C; ci++)
                        for (int ki = 0; ki < d->kh; ki++)
                            for (int kj = 0; kj < d->kw; kj++) {
                                int iy = oy * d->stride - d->pad + ki, ix = ox * d->stride - d->pad + kj;
                                if (iy < 0 || iy >= H || ix < 0 || ix >= W)
                                    continue;
                                acc += (double)x[((size_t)(n * C + ci) * H + iy) * W + ix] *
                                       w[((size_t)(co * C + ci) * d->kh + ki) * d->kw + kj];
                            }
                    y[((size_t)(n * d->cout + co) * d->oh + oy) * d->ow + ox] = acc;
                }
}

/* dx, dw, db of loss = sum(y * r), by scattering every product of the forward. */
static void conv_ref_bwd(const struct rt_conv_desc *d, const float *x, const float *w, const float *r, double *dx,
                         double *dw, double *db)
{
    const int N = d->in.n, C = d->in.c, H = d->in.h, W = d->in.w;
    memset(dx, 0, shape_count(d->in) * sizeof(double));
    memset(dw, 0, (size_t)d->cout * C * d->kh * d->kw * sizeof(double));
    memset(db, 0, (size_t)d->cout * sizeof(double));
    for (int n = 0; n < N; n++)
        for (int co = 0; co < d->cout; co++)
            for (int oy = 0; oy < d->oh; oy++)
                for (int ox = 0; ox < d->ow; ox++) {
                    double g = r[((size_t)(n * d->cout + co) * d->oh + oy) * d->ow + ox];
                    db[co] += g;
                    for (int ci = 0; ci < C; ci++)
                        for (int ki = 0; ki < d->kh; ki++)
                            for (int kj = 0; kj < d->kw; kj++) {
                                int iy = oy * d->stride - d->pad + ki, ix = ox * d->stride - d->pad + kj;
                                if (iy < 0 || iy >= H || ix < 0 || ix >= W)
                                    continue;
                                size_t xi = ((size_t)(n * C + ci) * H + iy) * W + ix;
                                size_t wi = ((size_t)(co * C + ci) * d->kh + ki) * d->kw + kj;
                                dx[xi] += w[wi] * g;
                                dw[wi] += x[xi] * g;
                            }
                }
}

/* Uploads the host x, w, b, runs the op's forward and returns sum(y * r). */
static double conv_loss(void *p)
{
    struct conv_ctx *c = p;
    const size_t nw = (size_t)c->d.cout * c->d.in.c * c->d.kh * c->d.kw;
    ops->from_nchw(st, c->d.in, c->x, c->dx_);
    ops->upload(st, c->dw_, c->w, nw * sizeof(float));
    ops->upload(st, c->db_, c->b, (size_t)c->d.cout * sizeof(float));
    ops->conv2d_fwd(st, &c->d, c->dx_, c->dw_, c->bias ? c->db_ : NULL, c->dy_);
    get_spatial(c->ys, c->dy_, c->y);
    return dot_f(c->y, c->r, shape_count(c->ys));
}

static void test_conv_case(const struct conv_case *cc, uint64_t stream)
{
    struct conv_ctx c = {.bias = cc->bias};
    c.d = (struct rt_conv_desc){.in = {cc->n, cc->cin, cc->h, cc->w}, .cout = cc->cout, .kh = cc->kh,
                                .kw = cc->kw, .stride = cc->stride, .pad = cc->pad};
    CHECK_OK(rt_conv_desc_init(&c.d));
    c.ys = (struct rt_shape4){cc->n, cc->cout, c.d.oh, c.d.ow};
    char shape[160];
    snprintf(shape, sizeof(shape), "x(%d,%d,%d,%d) w(%d,%d,%d,%d) stride %d pad %d%s -> y(%d,%d,%d,%d)", cc->n,
             cc->cin, cc->h, cc->w, cc->cout, cc->cin, cc->kh, cc->kw, cc->stride, cc->pad,
             cc->bias ? " bias" : "", cc->n, cc->cout, c.d.oh, c.d.ow);

    const size_t nx = shape_count(c.d.in), ny = shape_count(c.ys);
    const size_t nw = (size_t)cc->cout * cc->cin * cc->kh * cc->kw, nb = (size_t)cc->cout;
    struct rt_rng rng;
    rt_rng_init(&rng, SEED, stream);
    c.x = tu_xmalloc(nx * sizeof(float));
    c.w = tu_xmalloc(nw * sizeof(float));
    c.b = tu_xmalloc(nb * sizeof(float));
    c.r = tu_xmalloc(ny * sizeof(float));
    c.y = tu_xmalloc(ny * sizeof(float));
    fill_uniform(&rng, c.x, nx, -1, 1);
    fill_uniform(&rng, c.w, nw, -0.5f, 0.5f);
    fill_uniform(&rng, c.b, nb, -1, 1);
    fill_uniform(&rng, c.r, ny, -1, 1);
    c.dx_ = dev_alloc(nx);
    c.dw_ = dev_alloc(nw);
    c.db_ = dev_alloc(nb);
    c.dy_ = dev_alloc(ny);

    /* forward */
    double *yref = tu_xmalloc(ny * sizeof(double));
    conv_ref_fwd(&c.d, c.x, c.w, cc->bias ? c.b : NULL, yref);
    conv_loss(&c);
    compare("conv2d_fwd", shape, "y", c.y, yref, ny, REF_ATOL, REF_RTOL);

    /* backward, beta 0 over NaN, against the reference */
    double *dxref = tu_xmalloc(nx * sizeof(double)), *dwref = tu_xmalloc(nw * sizeof(double));
    double *dbref = tu_xmalloc(nb * sizeof(double));
    conv_ref_bwd(&c.d, c.x, c.w, c.r, dxref, dwref, dbref);
    float *g = dev_spatial(c.ys, c.r);
    float *gx = dev_alloc(nx), *gw = dev_alloc(nw), *gb = dev_alloc(nb);
    float *hx = tu_xmalloc(nx * sizeof(float)), *hw = tu_xmalloc(nw * sizeof(float)), *hb = tu_xmalloc(nb * sizeof(float));
    fill_value(hx, nx, NAN);
    ops->upload(st, gx, hx, nx * sizeof(float));
    ops->conv2d_bwd_data(st, &c.d, g, c.dw_, 0.0f, gx);
    get_spatial(c.d.in, gx, hx);
    compare("conv2d_bwd_data beta=0", shape, "dx", hx, dxref, nx, REF_ATOL, REF_RTOL);
    ops->conv2d_bwd_filter(st, &c.d, c.dx_, g, gw, cc->bias ? gb : NULL);
    get_plain(gw, hw, nw);
    compare("conv2d_bwd_filter", shape, "dw", hw, dwref, nw, REF_ATOL, REF_RTOL);
    if (cc->bias) {
        get_plain(gb, hb, nb);
        compare("conv2d_bwd_filter", shape, "dbias", hb, dbref, nb, REF_ATOL, REF_RTOL);
    }

    /* the reference against finite differences of the op's forward */
    check_fd("conv2d_bwd_data", shape, "dx", c.x, nx, dxref, conv_loss, &c, nx + ny);
    check_fd("conv2d_bwd_filter", shape, "dw", c.w, nw, dwref, conv_loss, &c, nx + ny);
    if (cc->bias)
        check_fd("conv2d_bwd_filter", shape, "dbias", c.b, nb, dbref, conv_loss, &c, nx + ny);

    /* beta 1 adds to dx; dw and dbias always accumulate */
    float *old = tu_xmalloc(RT_MAX(nx, nw) * sizeof(float));
    fill_uniform(&rng, old, nx, -1, 1);
    ops->from_nchw(st, c.d.in, old, gx);
    ops->conv2d_bwd_data(st, &c.d, g, c.dw_, 1.0f, gx);
    get_spatial(c.d.in, gx, hx);
    double *want = sum_ref(old, dxref, nx);
    compare("conv2d_bwd_data beta=1", shape, "dx", hx, want, nx, REF_ATOL, REF_RTOL);
    free(want);
    fill_uniform(&rng, old, nw, -1, 1);
    ops->upload(st, gw, old, nw * sizeof(float));
    ops->upload(st, gb, old, nb * sizeof(float));
    ops->conv2d_bwd_filter(st, &c.d, c.dx_, g, gw, cc->bias ? gb : NULL);
    get_plain(gw, hw, nw);
    want = sum_ref(old, dwref, nw);
    compare("conv2d_bwd_filter accumulate", shape, "dw", hw, want, nw, REF_ATOL, REF_RTOL);
    free(want);
    if (cc->bias) {
        get_plain(gb, hb, nb);
        want = sum_ref(old, dbref, nb);
        compare("conv2d_bwd_filter accumulate", shape, "dbias", hb, want, nb, REF_ATOL, REF_RTOL);
        free(want);
    }

    /* the same inputs give the same bits */
    float *y1 = tu_xmalloc(ny * sizeof(float));
    conv_loss(&c);
    memcpy(y1, c.y, ny * sizeof(float));
    conv_loss(&c);
    CHECKF(memcmp(y1, c.y, ny * sizeof(float)) == 0, "conv2d_fwd %s: two runs differ", shape);

    free(y1);
    free(old);
    free(hx);
    free(hw);
    free(hb);
    ops->free(be, g);
    ops->free(be, gx);
    ops->free(be, gw);
    ops->free(be, gb);
    free(dxref);
    free(dwref);
    free(dbref);
    free(yref);
    ops->free(be, c.dx_);
    ops->free(be, c.dw_);
    ops->free(be, c.db_);
    ops->free(be, c.dy_);
    free(c.x);
    free(c.w);
    free(c.b);
    free(c.r);
    free(c.y);
}

static void test_conv(void)
{
    static const struct conv_case cases[] = {
        /* n cin  h   w cout kh kw s  p  bias */
        {3, 2, 7, 5, 4, 3, 3, 1, 1, 1},      /* odd sizes, 3x3 same padding */
        {1, 1, 9, 9, 3, 3, 3, 2, 0, 0},      /* batch 1, Cin 1, stride 2, no padding */
        {3, 3, 11, 10, 5, 7, 7, 2, 3, 1},    /* the 7x7 stride-2 stem */
        {2, 6, 5, 5, 7, 1, 1, 1, 0, 1},      /* pointwise: no columns */
        {3, 4, 6, 7, 3, 1, 1, 2, 0, 0},      /* 1x1 stride-2 downsample */
        {2, 3, 6, 5, 4, 3, 2, 2, 1, 1},      /* non-square kernel, kernel larger than stride */
        {3, 5, 1, 1, 4, 3, 3, 1, 1, 0},      /* 3x3 on 1x1: all but the centre is padding */
        {2, 2, 2, 2, 3, 7, 7, 1, 3, 1},      /* kernel columns that see only padding */
        {2, 3, 4, 4, 2, 5, 5, 1, 2, 0},      /* 5x5 same padding */
        {20, 64, 16, 16, 2, 3, 3, 1, 1, 1},  /* two chunks of whole images (8 MB of columns each) */
        {3, 4, 2, 2, 5, 3, 3, 2, 1, 1},      /* 2x2 -> 1x1 stride 2: four of nine taps see input */
        {2, 3, 10, 11, 4, 5, 5, 3, 2, 1},    /* stride 3: nine phases */
        {2, 2, 7, 6, 3, 1, 1, 3, 1, 0},      /* 1x1 kernel, stride 3, padding: outputs that see only padding */
        {2, 8, 200, 200, 2, 3, 3, 1, 1, 0},  /* three chunks that split images */
        {2, 16, 251, 249, 2, 3, 3, 2, 1, 1}, /* stride 2, odd sizes, chunks that split images */
        /* blocked in and out (C multiples of 16): oneDNN reads and writes the tensors in place */
        {4, 16, 8, 8, 32, 3, 3, 1, 1, 1},    /* 3x3 stride 1: the Winograd kernels */
        {2, 32, 4, 4, 16, 3, 3, 1, 1, 0},    /* Winograd's smallest map */
        {2, 32, 2, 2, 32, 3, 3, 1, 1, 1},    /* below it: direct */
        {2, 16, 9, 9, 32, 3, 3, 2, 1, 0},    /* blocked, stride 2 */
        {3, 3, 12, 12, 16, 3, 3, 1, 1, 1},   /* the image's 3 channels into a blocked output */
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(cases); i++)
        test_conv_case(&cases[i], 100 + i);
}

/* ---- pooling ------------------------------------------------------------------- */

enum pool_kind { POOL_MAX, POOL_AVG };

struct pool_ctx {
    struct rt_pool_desc d;
    struct rt_shape4 ys;
    enum pool_kind kind;
    float *x, *r, *y;  /* host NCHW */
    float *dx_, *dy_;  /* device */
};

/*
 * Window (oy, ox) of plane p: for max, PyTorch's rule (the first maximum in
 * row-major order, a NaN replacing whatever came before); for avg, the sum /
 * (kh*kw).
 */
static void pool_ref_fwd(const struct rt_pool_desc *d, enum pool_kind kind, const float *x, double *y,
                         size_t *argmax)
{
    const size_t planes = (size_t)d->in.n * d->in.c, hw = (size_t)d->in.h * d->in.w;
    for (size_t p = 0; p < planes; p++)
        for (int oy = 0; oy < d->oh; oy++)
            for (int ox = 0; ox < d->ow; ox++) {
                double best = -INFINITY, sum = 0;
                size_t bi = SIZE_MAX;
                for (int ki = 0; ki < d->kh; ki++)
                    for (int kj = 0; kj < d->kw; kj++) {
                        int iy = oy * d->stride - d->pad + ki, ix = ox * d->stride - d->pad + kj;
                        if (iy < 0 || iy >= d->in.h || ix < 0 || ix >= d->in.w)
                            continue;
                        size_t i = p * hw + (size_t)iy * d->in.w + ix;
                        sum += x[i];
                        if (bi == SIZE_MAX || x[i] > best || isnan(x[i])) {
                            best = x[i];
                            bi = i;
                        }
                    }
                size_t o = (p * d->oh + oy) * d->ow + ox;
                y[o] = kind == POOL_MAX ? best : sum / (d->kh * d->kw);
                argmax[o] = bi;
            }
}

static void pool_ref_bwd(const struct rt_pool_desc *d, enum pool_kind kind, const float *r, const size_t *argmax,
                         double *dx)
{
    const size_t planes = (size_t)d->in.n * d->in.c, hw = (size_t)d->in.h * d->in.w;
    memset(dx, 0, planes * hw * sizeof(double));
    for (size_t p = 0; p < planes; p++)
        for (int oy = 0; oy < d->oh; oy++)
            for (int ox = 0; ox < d->ow; ox++) {
                size_t o = (p * d->oh + oy) * d->ow + ox;
                if (kind == POOL_MAX) {
                    dx[argmax[o]] += r[o];
                    continue;
                }
                for (int ki = 0; ki < d->kh; ki++)
                    for (int kj = 0; kj < d->kw; kj++) {
                        int iy = oy * d->stride - d->pad + ki, ix = ox * d->stride - d->pad + kj;
                        if (iy >= 0 && iy < d->in.h && ix >= 0 && ix < d->in.w)
                            dx[p * hw + (size_t)iy * d->in.w + ix] += (double)r[o] / (d->kh * d->kw);
                    }
            }
}

static double pool_loss(void *p)
{
    struct pool_ctx *c = p;
    ops->from_nchw(st, c->d.in, c->x, c->dx_);
    if (c->kind == POOL_MAX)
        ops->maxpool_fwd(st, &c->d, c->dx_, c->dy_);
    else
        ops->avgpool_fwd(st, &c->d, c->dx_, c->dy_);
    get_spatial(c->ys, c->dy_, c->y);
    return dot_f(c->y, c->r, shape_count(c->ys));
}

static void pool_bwd(struct pool_ctx *c, const float *g, float beta, float *gx)
{
    if (c->kind == POOL_MAX)
        ops->maxpool_bwd(st, &c->d, c->dx_, c->dy_, g, beta, gx);
    else
        ops->avgpool_bwd(st, &c->d, g, beta, gx);
}

/*
 * x layouts: 0 distinct values 0.05 apart in random order (no ties, and a
 * finite-difference step cannot reorder them), 1 all equal (ties: the first
 * element of each window wins), 2 all negative (padding must never win), 3
 * as 0 with every 7th element NaN (it must propagate, and take the gradient).
 */
static void test_pool_case(enum pool_kind kind, struct rt_shape4 in, int kh, int kw, int stride, int pad, int xmode,
                           uint64_t stream)
{
    struct pool_ctx c = {.kind = kind};
    c.d = (struct rt_pool_desc){.in = in, .kh = kh, .kw = kw, .stride = stride, .pad = pad};
    CHECK_OK(rt_pool_desc_init(&c.d));
    c.ys = (struct rt_shape4){in.n, in.c, c.d.oh, c.d.ow};
    const char *op = kind == POOL_MAX ? "maxpool" : "avgpool";
    static const char *const modes[] = {"distinct", "all equal", "all negative", "with NaNs"};
    char shape[160], name[64];
    snprintf(shape, sizeof(shape), "x(%d,%d,%d,%d) window %dx%d stride %d pad %d, x %s -> y(%d,%d,%d,%d)", in.n, in.c,
             in.h, in.w, kh, kw, stride, pad, modes[xmode], in.n, in.c, c.d.oh, c.d.ow);

    const size_t nx = shape_count(in), ny = shape_count(c.ys);
    struct rt_rng rng;
    rt_rng_init(&rng, SEED, stream);
    c.x = tu_xmalloc(nx * sizeof(float));
    c.r = tu_xmalloc(ny * sizeof(float));
    c.y = tu_xmalloc(ny * sizeof(float));
    if (xmode == 0 || xmode == 3) {
        for (size_t i = 0; i < nx; i++)
            c.x[i] = 0.05f * ((float)i - (float)nx / 2);
        for (size_t i = nx - 1; i > 0; i--) {
            size_t j = rt_rng_below(&rng, (uint32_t)(i + 1));
            float t = c.x[i];
            c.x[i] = c.x[j];
            c.x[j] = t;
        }
        for (size_t i = 3; xmode == 3 && i < nx; i += 7)
            c.x[i] = NAN;
    } else if (xmode == 1) {
        fill_value(c.x, nx, 0.25f);
    } else {
        fill_uniform(&rng, c.x, nx, -2.0f, -1.0f);
    }
    fill_uniform(&rng, c.r, ny, -1, 1);
    c.dx_ = dev_alloc(nx);
    c.dy_ = dev_alloc(ny);

    double *yref = tu_xmalloc(ny * sizeof(double)), *dxref = tu_xmalloc(nx * sizeof(double));
    size_t *argmax = tu_xmalloc(ny * sizeof(size_t));
    pool_ref_fwd(&c.d, kind, c.x, yref, argmax);
    pool_ref_bwd(&c.d, kind, c.r, argmax, dxref);
    pool_loss(&c);
    snprintf(name, sizeof(name), "%s_fwd", op);
    compare(name, shape, "y", c.y, yref, ny, REF_ATOL, REF_RTOL);

    float *g = dev_spatial(c.ys, c.r), *gx = dev_alloc(nx);
    float *hx = tu_xmalloc(nx * sizeof(float)), *old = tu_xmalloc(nx * sizeof(float));
    fill_value(hx, nx, NAN);
    ops->upload(st, gx, hx, nx * sizeof(float));
    pool_bwd(&c, g, 0.0f, gx);
    get_spatial(in, gx, hx);
    snprintf(name, sizeof(name), "%s_bwd beta=0", op);
    compare(name, shape, "dx", hx, dxref, nx, REF_ATOL, REF_RTOL);

    fill_uniform(&rng, old, nx, -1, 1);
    ops->from_nchw(st, in, old, gx);
    pool_bwd(&c, g, 1.0f, gx);
    get_spatial(in, gx, hx);
    double *want = sum_ref(old, dxref, nx);
    snprintf(name, sizeof(name), "%s_bwd beta=1", op);
    compare(name, shape, "dx", hx, want, nx, REF_ATOL, REF_RTOL);
    free(want);

    /*
     * Max pooling has a derivative only where a step cannot reorder a window
     * (distinct, spaced x); with NaNs in x the loss itself is NaN.
     */
    if (xmode == 0 || (kind == POOL_AVG && xmode != 3)) {
        snprintf(name, sizeof(name), "%s_bwd", op);
        check_fd(name, shape, "dx", c.x, nx, dxref, pool_loss, &c, nx + ny);
    }

    free(old);
    free(hx);
    ops->free(be, g);
    ops->free(be, gx);
    free(argmax);
    free(yref);
    free(dxref);
    ops->free(be, c.dx_);
    ops->free(be, c.dy_);
    free(c.x);
    free(c.r);
    free(c.y);
}

static void test_pool(void)
{
    static const struct {
        struct rt_shape4 in;
        int kh, kw, stride, pad;
    } cases[] = {
        {{3, 2, 7, 7}, 2, 2, 2, 0},   /* floor mode drops the last row and column */
        {{2, 3, 8, 8}, 2, 2, 2, 0},   /* resnet9's pooling */
        {{3, 2, 9, 7}, 3, 3, 2, 1},   /* overlapping windows with padding (the ImageNet stem) */
        {{1, 1, 5, 6}, 3, 3, 1, 1},   /* batch 1, stride 1 */
        {{2, 2, 6, 5}, 2, 2, 1, 1},   /* padding on a 2x2 window */
        {{2, 3, 7, 8}, 3, 2, 2, 1},   /* non-square window */
        {{3, 1, 4, 4}, 4, 4, 4, 0},   /* one window per plane */
        /* blocked (C a multiple of 16): the same windows with 16 channels as lanes */
        {{2, 16, 7, 7}, 2, 2, 2, 0},  /* 2x2/2 backward's store path, with a row and a column outside every window */
        {{3, 32, 4, 4}, 2, 2, 2, 0},  /* two blocks of channels */
        {{2, 16, 9, 7}, 3, 3, 2, 1},  /* overlapping windows with padding */
        {{1, 32, 5, 6}, 3, 3, 1, 1},  /* batch 1, stride 1 */
        {{2, 16, 6, 5}, 2, 2, 1, 1},  /* padding on a 2x2 window */
        {{2, 16, 7, 8}, 3, 2, 2, 1},  /* non-square window */
        {{2, 16, 10, 8}, 3, 3, 3, 0}, /* windows that tile the plane, with rows and columns outside every window */
        {{1, 16, 4, 70}, 2, 2, 2, 0}, /* rows of more outputs than the kernel handles at once */
        {{1, 32, 5, 70}, 3, 3, 2, 1}, /* the same, windows overlapping across the kernel's spans */
        {{4, 32, 16, 16}, 2, 2, 2, 0}, /* big enough for the threads */
    };
    uint64_t stream = 200;
    for (size_t i = 0; i < RT_ARRAY_LEN(cases); i++)
        for (int kind = POOL_MAX; kind <= POOL_AVG; kind++)
            for (int xmode = 0; xmode < 4; xmode++)
                test_pool_case((enum pool_kind)kind, cases[i].in, cases[i].kh, cases[i].kw, cases[i].stride,
                               cases[i].pad, xmode, stream++);

    /* Ties, spelled out: on a constant 4x4 plane a 2x2/2 max pool routes each gradient to the window's top-left. */
    struct rt_pool_desc d = {.in = {1, 1, 4, 4}, .kh = 2, .kw = 2, .stride = 2};
    CHECK_OK(rt_pool_desc_init(&d));
    float x[16], dy[4] = {1, 2, 3, 4}, dx[16];
    fill_value(x, 16, 1.0f);
    float *dx_ = dev_spatial(d.in, x), *dy_ = dev_alloc(4), *y_ = dev_alloc(4), *gx = dev_alloc(16);
    ops->upload(st, dy_, dy, sizeof(dy));
    ops->maxpool_fwd(st, &d, dx_, y_);
    ops->maxpool_bwd(st, &d, dx_, y_, dy_, 0.0f, gx);
    get_spatial(d.in, gx, dx);
    static const float want[16] = {1, 0, 2, 0, 0, 0, 0, 0, 3, 0, 4, 0, 0, 0, 0, 0};
    CHECKF(memcmp(dx, want, sizeof(want)) == 0, "maxpool_bwd ties: gradient not at the first element of each window");
    ops->free(be, dx_);
    ops->free(be, dy_);
    ops->free(be, y_);
    ops->free(be, gx);
}

/* ---- global average pooling and flatten ------------------------------------------ */

struct feat_ctx {
    struct rt_shape4 sh;
    int flatten;        /* 0 gap, 1 flatten */
    float *x, *r, *y;   /* host: x NCHW, y (N, F) */
    float *dx_, *dy_;
    size_t ny;
};

static double feat_loss(void *p)
{
    struct feat_ctx *c = p;
    ops->from_nchw(st, c->sh, c->x, c->dx_);
    if (c->flatten)
        ops->flatten_fwd(st, c->sh, c->dx_, c->dy_);
    else
        ops->gap_fwd(st, c->sh, c->dx_, c->dy_);
    get_plain(c->dy_, c->y, c->ny);
    return dot_f(c->y, c->r, c->ny);
}

static void test_feat_case(struct rt_shape4 sh, int flatten, uint64_t stream)
{
    struct feat_ctx c = {.sh = sh, .flatten = flatten};
    const char *op = flatten ? "flatten" : "gap";
    char shape[96], name[64];
    snprintf(shape, sizeof(shape), "x(%d,%d,%d,%d)", sh.n, sh.c, sh.h, sh.w);
    const size_t nx = shape_count(sh), hw = (size_t)sh.h * sh.w;
    c.ny = flatten ? nx : (size_t)sh.n * sh.c;
    struct rt_rng rng;
    rt_rng_init(&rng, SEED, stream);
    c.x = tu_xmalloc(nx * sizeof(float));
    c.r = tu_xmalloc(c.ny * sizeof(float));
    c.y = tu_xmalloc(c.ny * sizeof(float));
    fill_uniform(&rng, c.x, nx, -1, 1);
    fill_uniform(&rng, c.r, c.ny, -1, 1);
    c.dx_ = dev_alloc(nx);
    c.dy_ = dev_alloc(c.ny);

    /* flatten is PyTorch's x.view(N, -1) of NCHW; gap the mean of each (n, c) plane */
    double *yref = tu_xmalloc(c.ny * sizeof(double)), *dxref = tu_xmalloc(nx * sizeof(double));
    for (size_t p = 0; p < (size_t)sh.n * sh.c; p++) {
        double s = 0;
        for (size_t i = 0; i < hw; i++) {
            s += c.x[p * hw + i];
            if (flatten) {
                yref[p * hw + i] = c.x[p * hw + i];
                dxref[p * hw + i] = c.r[p * hw + i];
            } else {
                dxref[p * hw + i] = c.r[p] / (double)hw;
            }
        }
        if (!flatten)
            yref[p] = s / (double)hw;
    }
    feat_loss(&c);
    snprintf(name, sizeof(name), "%s_fwd", op);
    compare(name, shape, "y", c.y, yref, c.ny, REF_ATOL, REF_RTOL);

    float *g = dev_plain(c.r, c.ny), *gx = dev_alloc(nx);
    float *hx = tu_xmalloc(nx * sizeof(float)), *old = tu_xmalloc(nx * sizeof(float));
    fill_value(hx, nx, NAN);
    ops->upload(st, gx, hx, nx * sizeof(float));
    if (flatten)
        ops->flatten_bwd(st, sh, g, 0.0f, gx);
    else
        ops->gap_bwd(st, sh, g, 0.0f, gx);
    get_spatial(sh, gx, hx);
    snprintf(name, sizeof(name), "%s_bwd beta=0", op);
    compare(name, shape, "dx", hx, dxref, nx, REF_ATOL, REF_RTOL);

    fill_uniform(&rng, old, nx, -1, 1);
    ops->from_nchw(st, sh, old, gx);
    if (flatten)
        ops->flatten_bwd(st, sh, g, 1.0f, gx);
    else
        ops->gap_bwd(st, sh, g, 1.0f, gx);
    get_spatial(sh, gx, hx);
    double *want = sum_ref(old, dxref, nx);
    snprintf(name, sizeof(name), "%s_bwd beta=1", op);
    compare(name, shape, "dx", hx, want, nx, REF_ATOL, REF_RTOL);
    free(want);

    snprintf(name, sizeof(name), "%s_bwd", op);
    check_fd(name, shape, "dx", c.x, nx, dxref, feat_loss, &c, nx + c.ny);

    free(old);
    free(hx);
    ops->free(be, g);
    ops->free(be, gx);
    free(yref);
    free(dxref);
    ops->free(be, c.dx_);
    ops->free(be, c.dy_);
    free(c.x);
    free(c.r);
    free(c.y);
}

static void test_feat(void)
{
    static const struct rt_shape4 shapes[] = {
        {3, 4, 5, 3},   {1, 2, 1, 1},   {2, 3, 8, 8}, {5, 7, 2, 3},
        {2, 16, 5, 3},  {3, 32, 4, 4},  {2, 16, 1, 1}, /* blocked; 1x1 planes make it NCHW */
        {4, 64, 12, 12},                              /* mnist-net's flatten, big enough for the threads */
    };
    uint64_t stream = 300;
    for (size_t i = 0; i < RT_ARRAY_LEN(shapes); i++) {
        test_feat_case(shapes[i], 0, stream++);
        test_feat_case(shapes[i], 1, stream++);
    }
}

/* ---- batchnorm in inference mode (a frozen layer) --------------------------------- */

/*
 * bn_infer_bwd is the gradient of bn_infer_fwd with the running statistics
 * fixed: dx = dy gamma / sqrt(running_var + eps), and with a fused ReLU
 * (rt_bn_desc.relu; this table's bn_relu is 1) dy only where the forward's
 * output is > 0. Checked against that in double, and against central
 * differences of bn_infer_fwd itself (with the same relu) at the usual
 * points. x is made from the pre-activation it should give, 0.1 to 2 from
 * the ReLU's kink and negative at every third element, so the mask is mixed
 * in every shape and the steps (1e-2 in x, at most 0.03 in the
 * pre-activation) never cross the kink: the differences are exact up to
 * float rounding. Channel 1 has a negative gamma.
 */
struct bni_ctx {
    struct rt_bn_desc d;
    float *x, *r, *y;                          /* host NCHW */
    float *x_, *y_, *g_, *b_, *rm_, *rv_;      /* device */
};

static double bni_loss(void *p)
{
    struct bni_ctx *c = p;
    ops->from_nchw(st, c->d.in, c->x, c->x_);
    ops->bn_infer_fwd(st, &c->d, c->x_, c->g_, c->b_, c->rm_, c->rv_, c->y_);
    get_spatial(c->d.in, c->y_, c->y);
    return dot_f(c->y, c->r, shape_count(c->d.in));
}

static void test_bn_infer_case(struct rt_shape4 sh, int relu, uint64_t stream)
{
    struct bni_ctx c = {.d = {.in = sh, .eps = 1e-5f, .momentum = 0.1f, .relu = relu}};
    char shape[96];
    snprintf(shape, sizeof(shape), "x(%d,%d,%d,%d)%s%s", sh.n, sh.c, sh.h, sh.w, sh.c % 16 ? "" : " blocked",
             relu ? " relu" : "");
    const size_t nx = shape_count(sh), C = (size_t)sh.c, hw = (size_t)sh.h * sh.w;
    struct rt_rng rng;
    rt_rng_init(&rng, SEED, stream);
    float *g = tu_hfloats(C), *b = tu_hfloats(C), *rm = tu_hfloats(C), *rv = tu_hfloats(C);
    fill_uniform(&rng, g, C, 0.5f, 1.5f);
    fill_uniform(&rng, b, C, -0.5f, 0.5f);
    fill_uniform(&rng, rm, C, -1, 1);
    fill_uniform(&rng, rv, C, 0.5f, 2.0f);
    if (C > 1)
        g[1] = -g[1];
    double *a = tu_xmalloc(C * sizeof(double)); /* the forward's slope, gamma / sqrt(var + eps) */
    for (size_t ch = 0; ch < C; ch++)
        a[ch] = g[ch] / sqrt((double)rv[ch] + (double)c.d.eps);
    c.x = tu_hfloats(nx);
    c.r = tu_hfloats(nx);
    c.y = tu_hfloats(nx);
    double *dxref = tu_xmalloc(nx * sizeof(double));
    for (size_t i = 0; i < nx; i++) {
        const size_t ch = i / hw % C;
        /* the pre-activation v: 0.1 to 2 from the kink, negative at every third element (a mixed mask) */
        const double vt = (i % 3 ? 1.0 : -1.0) * (0.1 + 1.9 * rt_rng_uniform(&rng));
        c.x[i] = (float)(rm[ch] + (vt - b[ch]) / a[ch]);
        const double v = ((double)c.x[i] - rm[ch]) * a[ch] + b[ch];
        c.r[i] = -1.0f + 2.0f * rt_rng_uniform(&rng);
        dxref[i] = relu && !(v > 0) ? 0.0 : (double)c.r[i] * a[ch];
    }
    c.x_ = dev_alloc(nx);
    c.y_ = dev_alloc(nx);
    c.g_ = dev_plain(g, C);
    c.b_ = dev_plain(b, C);
    c.rm_ = dev_plain(rm, C);
    c.rv_ = dev_plain(rv, C);

    float *dy = dev_spatial(sh, c.r), *gx = dev_alloc(nx);
    float *hx = tu_hfloats(nx), *old = tu_hfloats(nx);
    ops->from_nchw(st, sh, c.x, c.x_);
    fill_value(hx, nx, NAN); /* beta_dx 0 must not read dx */
    ops->upload(st, gx, hx, nx * sizeof(float));
    ops->bn_infer_bwd(st, &c.d, c.x_, dy, c.g_, c.b_, c.rm_, c.rv_, 0.0f, gx);
    get_spatial(sh, gx, hx);
    compare("bn_infer_bwd beta_dx=0", shape, "dx", hx, dxref, nx, REF_ATOL, REF_RTOL);
    /* the op's own gradient against central differences of bn_infer_fwd (check_fd leaves x_ as c.x again) */
    double *got = tu_xmalloc(nx * sizeof(double));
    memset(got, 0, nx * sizeof(double)); /* gcc -fsanitize cannot see the loop fill it */
    for (size_t i = 0; i < nx; i++)
        got[i] = hx[i];
    check_fd("bn_infer_bwd", shape, "dx", c.x, nx, got, bni_loss, &c, 2 * nx);
    free(got);

    fill_uniform(&rng, old, nx, -1, 1);
    ops->from_nchw(st, sh, old, gx);
    ops->bn_infer_bwd(st, &c.d, c.x_, dy, c.g_, c.b_, c.rm_, c.rv_, 1.0f, gx);
    get_spatial(sh, gx, hx);
    double *want = sum_ref(old, dxref, nx);
    compare("bn_infer_bwd beta_dx=1", shape, "dx", hx, want, nx, REF_ATOL, REF_RTOL);
    free(want);

    float *dp[] = {dy, gx, c.x_, c.y_, c.g_, c.b_, c.rm_, c.rv_};
    for (size_t i = 0; i < RT_ARRAY_LEN(dp); i++)
        ops->free(be, dp[i]);
    float *hp[] = {hx, old, g, b, rm, rv, c.x, c.r, c.y};
    for (size_t i = 0; i < RT_ARRAY_LEN(hp); i++)
        free(hp[i]);
    free(a);
    free(dxref);
}

static void test_bn_infer(void)
{
    CHECKF(ops->bn_relu == 1, "the CPU's fp32 table does not fuse batchnorm and ReLU (bn_relu %d)", ops->bn_relu);
    static const struct rt_shape4 shapes[] = {
        {2, 3, 5, 4},  {1, 5, 1, 1},   {3, 7, 6, 6},   /* (C, N, H, W) */
        {2, 16, 5, 3}, {3, 32, 4, 4},  {2, 16, 1, 1},  /* nChw16c */
        {8, 5, 32, 32}, {4, 64, 12, 12},               /* big enough for the threads, one of each layout */
    };
    uint64_t stream = 500;
    for (size_t i = 0; i < RT_ARRAY_LEN(shapes); i++)
        for (int relu = 0; relu < 2; relu++)
            test_bn_infer_case(shapes[i], relu, stream++);
}

/* ---- layout -------------------------------------------------------------------- */

/*
 * Where the CPU backend keeps element (n, c, h, w), written out here from
 * cpu.h's contract: nChw16c when 16 divides C, else (C, N, H, W).
 */
static size_t cpu_at(struct rt_shape4 sh, int n, int c, int h, int w)
{
    if (sh.c % 16 == 0)
        return ((((size_t)n * (sh.c / 16) + c / 16) * sh.h + h) * sh.w + w) * 16 + c % 16;
    return (((size_t)c * sh.n + n) * sh.h + h) * sh.w + w;
}

static void test_layout_case(struct rt_shape4 sh)
{
    const size_t n = shape_count(sh);
    char shape[64];
    snprintf(shape, sizeof(shape), "x(%d,%d,%d,%d)", sh.n, sh.c, sh.h, sh.w);
    float *a = tu_xmalloc(n * sizeof(float)), *b = tu_xmalloc(n * sizeof(float)), *dev = tu_xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        a[i] = (float)i;
    float *x = dev_spatial(sh, a);
    ops->download(st, dev, x, n * sizeof(float));
    ops->sync(st);
    size_t bad = 0;
    for (int in = 0; in < sh.n; in++)
        for (int c = 0; c < sh.c; c++)
            for (int h = 0; h < sh.h; h++)
                for (int w = 0; w < sh.w; w++) {
                    size_t nchw = (((size_t)in * sh.c + c) * sh.h + h) * sh.w + w;
                    size_t at = cpu_at(sh, in, c, h, w);
                    if (dev[at] != a[nchw]) {
                        if (bad++ < 5)
                            fprintf(stderr, "  from_nchw %s: (n%d,c%d,h%d,w%d) at %zu is %g, want %g\n", shape, in, c,
                                    h, w, at, (double)dev[at], (double)a[nchw]);
                    }
                }
    CHECKF(bad == 0, "from_nchw %s: %zu elements not in the %s order", shape, bad,
           sh.c % 16 ? "(C,N,H,W)" : "nChw16c");
    get_spatial(sh, x, b);
    CHECKF(memcmp(a, b, n * sizeof(float)) == 0, "to_nchw(from_nchw(x)) != x for %s", shape);
    ops->free(be, x);
    free(a);
    free(b);
    free(dev);
}

static void test_layout(void)
{
    /* A round trip through either layout is the identity, and memory holds what cpu.h says. */
    static const struct rt_shape4 shapes[] = {
        {3, 4, 5, 2}, {2, 16, 5, 3}, {3, 32, 4, 4}, {1, 48, 1, 1}, {2, 17, 3, 3},
        {4, 32, 17, 15}, /* big enough for the threads; pixels not a multiple of 16 */
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(shapes); i++)
        test_layout_case(shapes[i]);
}

/* ---- linear --------------------------------------------------------------------- */

struct lin_ctx {
    int n, in, out, bias;
    float *x, *w, *b, *r, *y;  /* host */
    float *x_, *w_, *b_, *y_;  /* device */
};

static double lin_loss(void *p)
{
    struct lin_ctx *c = p;
    ops->upload(st, c->x_, c->x, (size_t)c->n * c->in * sizeof(float));
    ops->upload(st, c->w_, c->w, (size_t)c->out * c->in * sizeof(float));
    ops->upload(st, c->b_, c->b, (size_t)c->out * sizeof(float));
    ops->linear_fwd(st, c->n, c->in, c->out, c->x_, c->w_, c->bias ? c->b_ : NULL, c->y_);
    get_plain(c->y_, c->y, (size_t)c->n * c->out);
    return dot_f(c->y, c->r, (size_t)c->n * c->out);
}

static void test_linear_case(int n, int in, int out, int bias, uint64_t stream)
{
    struct lin_ctx c = {.n = n, .in = in, .out = out, .bias = bias};
    char shape[96];
    snprintf(shape, sizeof(shape), "x(%d,%d) w(%d,%d)%s", n, in, out, in, bias ? " bias" : "");
    const size_t nx = (size_t)n * in, nw = (size_t)out * in, ny = (size_t)n * out, nb = (size_t)out;
    struct rt_rng rng;
    rt_rng_init(&rng, SEED, stream);
    c.x = tu_xmalloc(nx * sizeof(float));
    c.w = tu_xmalloc(nw * sizeof(float));
    c.b = tu_xmalloc(nb * sizeof(float));
    c.r = tu_xmalloc(ny * sizeof(float));
    c.y = tu_xmalloc(ny * sizeof(float));
    fill_uniform(&rng, c.x, nx, -1, 1);
    fill_uniform(&rng, c.w, nw, -0.5f, 0.5f);
    fill_uniform(&rng, c.b, nb, -1, 1);
    fill_uniform(&rng, c.r, ny, -1, 1);
    c.x_ = dev_alloc(nx);
    c.w_ = dev_alloc(nw);
    c.b_ = dev_alloc(nb);
    c.y_ = dev_alloc(ny);

    double *yref = tu_xmalloc(ny * sizeof(double)), *dxref = tu_xmalloc(nx * sizeof(double));
    double *dwref = tu_xmalloc(nw * sizeof(double)), *dbref = tu_xmalloc(nb * sizeof(double));
    memset(dxref, 0, nx * sizeof(double));
    memset(dwref, 0, nw * sizeof(double));
    memset(dbref, 0, nb * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double acc = bias ? c.b[o] : 0.0, g = c.r[(size_t)i * out + o];
            for (int k = 0; k < in; k++) {
                acc += (double)c.x[(size_t)i * in + k] * c.w[(size_t)o * in + k];
                dxref[(size_t)i * in + k] += g * c.w[(size_t)o * in + k];
                dwref[(size_t)o * in + k] += g * c.x[(size_t)i * in + k];
            }
            yref[(size_t)i * out + o] = acc;
            dbref[o] += g;
        }
    /* NaN in y first: the forward must overwrite it, bias or not */
    float *hy = tu_xmalloc(ny * sizeof(float));
    fill_value(hy, ny, NAN);
    ops->upload(st, c.y_, hy, ny * sizeof(float));
    free(hy);
    lin_loss(&c);
    compare("linear_fwd", shape, "y", c.y, yref, ny, REF_ATOL, REF_RTOL);

    float *g = dev_plain(c.r, ny), *gx = dev_alloc(nx), *gw = dev_alloc(nw), *gb = dev_alloc(nb);
    float *hx = tu_xmalloc(nx * sizeof(float)), *hw = tu_xmalloc(nw * sizeof(float)), *hb = tu_xmalloc(nb * sizeof(float));
    fill_value(hx, nx, NAN);
    ops->upload(st, gx, hx, nx * sizeof(float));
    ops->linear_bwd_data(st, n, in, out, g, c.w_, 0.0f, gx);
    get_plain(gx, hx, nx);
    compare("linear_bwd_data beta=0", shape, "dx", hx, dxref, nx, REF_ATOL, REF_RTOL);
    ops->linear_bwd_filter(st, n, in, out, c.x_, g, gw, bias ? gb : NULL);
    get_plain(gw, hw, nw);
    compare("linear_bwd_filter", shape, "dw", hw, dwref, nw, REF_ATOL, REF_RTOL);
    if (bias) {
        get_plain(gb, hb, nb);
        compare("linear_bwd_filter", shape, "db", hb, dbref, nb, REF_ATOL, REF_RTOL);
    }

    check_fd("linear_bwd_data", shape, "dx", c.x, nx, dxref, lin_loss, &c, nx + nw);
    check_fd("linear_bwd_filter", shape, "dw", c.w, nw, dwref, lin_loss, &c, nx + nw);
    if (bias)
        check_fd("linear_bwd_filter", shape, "db", c.b, nb, dbref, lin_loss, &c, nx + nw);

    float *old = tu_xmalloc(RT_MAX(nx, nw) * sizeof(float));
    fill_uniform(&rng, old, nx, -1, 1);
    ops->upload(st, gx, old, nx * sizeof(float));
    ops->linear_bwd_data(st, n, in, out, g, c.w_, 1.0f, gx);
    get_plain(gx, hx, nx);
    double *want = sum_ref(old, dxref, nx);
    compare("linear_bwd_data beta=1", shape, "dx", hx, want, nx, REF_ATOL, REF_RTOL);
    free(want);
    fill_uniform(&rng, old, nw, -1, 1);
    ops->upload(st, gw, old, nw * sizeof(float));
    ops->upload(st, gb, old, nb * sizeof(float));
    ops->linear_bwd_filter(st, n, in, out, c.x_, g, gw, bias ? gb : NULL);
    get_plain(gw, hw, nw);
    want = sum_ref(old, dwref, nw);
    compare("linear_bwd_filter accumulate", shape, "dw", hw, want, nw, REF_ATOL, REF_RTOL);
    free(want);
    if (bias) {
        get_plain(gb, hb, nb);
        want = sum_ref(old, dbref, nb);
        compare("linear_bwd_filter accumulate", shape, "db", hb, want, nb, REF_ATOL, REF_RTOL);
        free(want);
    }

    free(old);
    free(hx);
    free(hw);
    free(hb);
    ops->free(be, g);
    ops->free(be, gx);
    ops->free(be, gw);
    ops->free(be, gb);
    free(yref);
    free(dxref);
    free(dwref);
    free(dbref);
    ops->free(be, c.x_);
    ops->free(be, c.w_);
    ops->free(be, c.b_);
    ops->free(be, c.y_);
    free(c.x);
    free(c.w);
    free(c.b);
    free(c.r);
    free(c.y);
}

static void test_linear(void)
{
    test_linear_case(3, 7, 5, 1, 400);
    test_linear_case(3, 7, 5, 0, 401);
    test_linear_case(1, 1, 1, 1, 402);
    test_linear_case(5, 33, 10, 1, 403);
    test_linear_case(64, 512, 10, 1, 404);
}

int main(void)
{
    int rc = rt_backend_create(&(struct rt_backend_opts){.kind = RT_BACKEND_CPU, .threads = 2}, &be);
    if (rc < 0) {
        fprintf(stderr, "test_ops_spatial: cpu backend: %s\n", rt_errmsg());
        return 1;
    }
    ops = rt_backend_ops(be);
    st = rt_backend_stream(be);
    fprintf(stderr, "test_ops_spatial: %s, seed %u\n", rt_backend_describe(be), SEED);

    test_layout();
    test_conv();
    test_pool();
    test_feat();
    test_bn_infer();
    test_linear();

    rt_backend_destroy(be);
    return check_result();
}
