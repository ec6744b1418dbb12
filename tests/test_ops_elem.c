/*
 * test_ops_elem.c - the CPU backend's element-wise and per-channel ops
 * (compute/cpu/elem.c) through the public op table: the uint8 input
 * transform, batchnorm, ReLU/GELU, dropout, add/scale/axpy, the softmax
 * cross-entropy, sumsq / count_nonfinite, the f16/bf16 casts, and the SGD /
 * Adam / AdamW updates.
 *
 * Forwards are compared with naive double-precision references written
 * here, backwards with central finite differences of loss = sum(y * r) (and
 * with double references where a tighter bound is possible), optimizers with
 * the torch.optim formulas in double. Each comparison prints its worst error
 * next to its tolerance; failures print op, index and values. PyTorch
 * fixtures are compared elsewhere (the model and optimizer tests).
 *
 * The ops on spatial tensors (input, batchnorm, dropout) run on both of the
 * CPU backend's layouts: channel-major (C, N, H, W) for C not a multiple of
 * 16, blocked nChw16c for C = 16, 32, 64. Tensors go in and out through
 * from_nchw / to_nchw, so the references do not depend on the layout; only
 * input_u8's test and dropout_index.h's look at the memory.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/common.h"
#include "compute/compute.h"
#include "compute/dropout_index.h"

#define SEED UINT64_C(20240611)

static struct rt_backend *be;
static const struct rt_ops *ops;
static struct rt_stream *st;
static struct rt_rng rng;

/* ---- helpers ---------------------------------------------------------------- */

static void *dev_alloc(size_t bytes)
{
    void *p = ops->alloc(be, bytes);
    if (!p) {
        fprintf(stderr, "alloc %zu bytes: %s\n", bytes, rt_errmsg());
        exit(1);
    }
    return p;
}

static float *dev_floats(size_t n)
{
    return dev_alloc(n * sizeof(float));
}

static float *host_floats(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static double *host_doubles(size_t n)
{
    double *p = malloc((n ? n : 1) * sizeof(double));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static void up(float *dev, const float *host, size_t n)
{
    ops->upload(st, dev, host, n * sizeof(float));
}

static void down(float *host, const float *dev, size_t n)
{
    ops->download(st, host, dev, n * sizeof(float));
    ops->sync(st);
}

static void fill_normal(float *x, size_t n, float mean, float sd)
{
    for (size_t i = 0; i < n; i++)
        x[i] = mean + sd * rt_rng_normal(&rng);
}

/* n standard-normal floats with no zero among them (a zero input would hide a dropout mask), host memory. */
static float *dropout_input(size_t n)
{
    float *x = host_floats(n);
    fill_normal(x, n, 0.0f, 1.0f);
    for (size_t i = 0; i < n; i++)
        if (x[i] == 0.0f)
            x[i] = 1.0f;
    return x;
}

static void fill_nan(float *dev, size_t n)
{
    float *h = host_floats(n);
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    up(dev, h, n);
    free(h);
}

/*
 * Compares got[i] with want[i] under |got - want| <= atol + rtol |want|.
 * Prints the first few mismatches (op, index, values) and one summary line
 * with the worst error against its tolerance. Counts as one check.
 */
static void expect_close(const char *op, const float *got, const double *want, size_t n, double atol, double rtol)
{
    size_t bad = 0, worst_i = 0;
    double worst = 0.0; /* error as a fraction of the allowed error */
    double worst_abs = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double err = fabs((double)got[i] - want[i]);
        const double tol = atol + rtol * fabs(want[i]);
        const double r = tol > 0.0 ? err / tol : (err > 0.0 ? INFINITY : 0.0);
        if (!(err <= tol)) {
            if (bad < 5)
                fprintf(stderr, "  %s[%zu]: got %.9g want %.9g (err %.3g, tol %.3g)\n", op, i, (double)got[i],
                        want[i], err, tol);
            bad++;
        }
        if (r > worst || isnan(r)) {
            worst = r;
            worst_i = i;
            worst_abs = err;
        }
    }
    printf("  %-34s n=%-7zu worst err %.3g at %zu (%.2f of atol %.1g + rtol %.1g)\n", op, n, worst_abs, worst_i,
           worst, atol, rtol);
    CHECKF(bad == 0, "%s: %zu of %zu values outside atol %g + rtol %g", op, bad, n, atol, rtol);
}

static double dot_fr(const float *y, const float *r, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)y[i] * r[i];
    return s;
}

/* ---- input ---------------------------------------------------------------------- */

/*
 * Where the CPU backend keeps element (n, c, s) of shape sh, s = h*W + w,
 * written out here from cpu.h's contract: nChw16c when 16 divides C, else
 * (C, N, H, W).
 */
static size_t cpu_at(struct rt_shape4 sh, size_t n, size_t c, size_t s)
{
    const size_t hw = (size_t)sh.h * sh.w;
    if (sh.c % 16 == 0)
        return ((n * (size_t)(sh.c / 16) + c / 16) * hw + s) * 16 + c % 16;
    return (c * (size_t)sh.n + n) * hw + s;
}

/* Both entry points, bit for bit ((float)v / 255 - mean) / std at the layout's place for (n, c, s). */
static void test_input_u8_case(struct rt_shape4 sh)
{
    const size_t hw = (size_t)sh.h * sh.w, nc = (size_t)sh.c, total = (size_t)sh.n * nc * hw;
    uint8_t *img = malloc(total);
    float *mean = host_floats(nc), *sd = host_floats(nc), *h = host_floats(total);
    if (!img) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < total; i++)
        img[i] = (uint8_t)rt_rng_below(&rng, 256);
    img[0] = 0;
    img[1] = 255;
    static const float m3[3] = {0.4914f, 0.4822f, 0.4465f}, s3[3] = {0.2470f, 0.2435f, 0.2616f};
    for (size_t c = 0; c < nc; c++) {
        /* distinct per channel, so that a channel mix-up changes values */
        mean[c] = m3[c % 3] + 0.01f * (float)(c / 3);
        sd[c] = s3[c % 3] + 0.003f * (float)(c / 3);
    }
    float *y = dev_floats(total);
    for (int dev = 0; dev < 2; dev++) {
        fill_nan(y, total);
        if (dev)
            ops->input_u8_dev(st, sh, img, mean, sd, y);
        else
            ops->input_u8(st, sh, img, mean, sd, y);
        down(h, y, total);
        size_t bad = 0;
        for (size_t n = 0; n < (size_t)sh.n; n++)
            for (size_t c = 0; c < nc; c++)
                for (size_t i = 0; i < hw; i++) {
                    const uint8_t v = img[(n * nc + c) * hw + i]; /* host NCHW */
                    const float want = ((float)v / 255.0f - mean[c]) / sd[c];
                    const float got = h[cpu_at(sh, n, c, i)];
                    if (memcmp(&got, &want, sizeof(got)) != 0 && bad++ < 5)
                        fprintf(stderr, "  %s (%d,%d,%d,%d) n=%zu c=%zu i=%zu: got %.9g want %.9g\n",
                                dev ? "input_u8_dev" : "input_u8", sh.n, sh.c, sh.h, sh.w, n, c, i, (double)got,
                                (double)want);
                }
        printf("  %-12s (%d,%d,%d,%d) %s: %zu of %zu values differ\n", dev ? "input_u8_dev" : "input_u8", sh.n, sh.c,
               sh.h, sh.w, sh.c % 16 ? "(C,N,H,W)" : "nChw16c", bad, total);
        CHECKF(bad == 0, "%s (%d,%d,%d,%d): %zu values differ from ((float)v / 255 - mean) / std in %s",
               dev ? "input_u8_dev" : "input_u8", sh.n, sh.c, sh.h, sh.w, bad, sh.c % 16 ? "(C,N,H,W)" : "nChw16c");
    }
    ops->free(be, y);
    free(img);
    free(mean);
    free(sd);
    free(h);
}

static void test_input_u8(void)
{
    printf("input_u8\n");
    static const struct rt_shape4 shapes[] = {
        {3, 3, 4, 5}, {2, 1, 3, 3}, {2, 16, 3, 5}, {3, 32, 4, 4},
        {8, 3, 32, 32}, {4, 16, 24, 24}, /* big enough for the threads */
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(shapes); i++)
        test_input_u8_case(shapes[i]);
}

/* ---- batchnorm ---------------------------------------------------------------------- */

/*
 * Host arrays of a batchnorm test are (C, M): channel rows of M = N*H*W
 * values, m = n*H*W + h*W + w, as the references want them. They reach the
 * backend's layout through NCHW and from_nchw (for (C, N, H, W) the same
 * bytes as an upload).
 */
static void put_cm(struct rt_shape4 sh, float *dev, const float *cm)
{
    const size_t c = (size_t)sh.c, hw = (size_t)sh.h * sh.w, m = (size_t)sh.n * hw;
    float *nchw = host_floats(c * m);
    for (size_t ch = 0; ch < c; ch++)
        for (size_t n = 0; n < (size_t)sh.n; n++)
            memcpy(nchw + (n * c + ch) * hw, cm + ch * m + n * hw, hw * sizeof(float));
    ops->from_nchw(st, sh, nchw, dev);
    ops->sync(st);
    free(nchw);
}

static void get_cm(struct rt_shape4 sh, float *cm, const float *dev)
{
    const size_t c = (size_t)sh.c, hw = (size_t)sh.h * sh.w, m = (size_t)sh.n * hw;
    float *nchw = host_floats(c * m);
    ops->to_nchw(st, sh, dev, nchw);
    ops->sync(st);
    for (size_t ch = 0; ch < c; ch++)
        for (size_t n = 0; n < (size_t)sh.n; n++)
            memcpy(cm + ch * m + n * hw, nchw + (n * c + ch) * hw, hw * sizeof(float));
    free(nchw);
}

/* x (C, M) with a distinct mean and spread per channel, so a wrong channel stride shows. */
static void fill_bn_input(float *x, size_t c, size_t m)
{
    static const float mu[] = {0.0f, 5.0f, -20.0f, 1.5f}, sd[] = {1.0f, 3.0f, 0.5f, 2.0f};
    for (size_t ch = 0; ch < c; ch++)
        fill_normal(x + ch * m, m, mu[ch % 4] + 0.25f * (float)(ch / 4), sd[ch % 4]);
}

/* Per-channel parameters: distinct, gamma within 0.5..1.5 so that the error floors below hold for any C. */
static float bn_gamma(size_t ch)
{
    return 0.5f + 0.25f * (float)(ch % 5);
}

static float bn_beta(size_t ch)
{
    return 0.1f * (float)(ch % 7) - 0.2f;
}

static void test_bn_forward_case(struct rt_shape4 sh)
{
    const struct rt_bn_desc d = {.in = sh, .eps = 1e-5f, .momentum = 0.1f};
    const size_t c = (size_t)sh.c, m = (size_t)sh.n * sh.h * sh.w, total = c * m;
    float *hx = host_floats(total), *hy = host_floats(total), *g = host_floats(c), *b = host_floats(c),
          *rm = host_floats(c), *rv = host_floats(c), *got = host_floats(c);
    fill_bn_input(hx, c, m);
    for (size_t ch = 0; ch < c; ch++) {
        g[ch] = bn_gamma(ch);
        b[ch] = bn_beta(ch);
        rm[ch] = 0.3f * (float)ch;
        rv[ch] = 1.0f + 0.5f * (float)ch;
    }
    float *x = dev_floats(total), *y = dev_floats(total), *dg = dev_floats(c), *db = dev_floats(c),
          *drm = dev_floats(c), *drv = dev_floats(c), *smean = dev_floats(c), *sinv = dev_floats(c);
    put_cm(sh, x, hx);
    up(dg, g, c);
    up(db, b, c);
    up(drm, rm, c);
    up(drv, rv, c);
    fill_nan(y, total);
    ops->bn_train_fwd(st, &d, x, dg, db, drm, drv, smean, sinv, y);

    double *wy = host_doubles(total), *wmean = host_doubles(c), *winv = host_doubles(c), *wrm = host_doubles(c),
           *wrv = host_doubles(c);
    for (size_t ch = 0; ch < c; ch++) {
        double s = 0.0, q = 0.0;
        for (size_t i = 0; i < m; i++)
            s += hx[ch * m + i];
        const double mu = s / (double)m;
        for (size_t i = 0; i < m; i++)
            q += (hx[ch * m + i] - mu) * (hx[ch * m + i] - mu);
        const double var = q / (double)m;
        wmean[ch] = mu;
        winv[ch] = 1.0 / sqrt(var + 1e-5);
        wrm[ch] = 0.9 * rm[ch] + 0.1 * mu;
        wrv[ch] = 0.9 * rv[ch] + 0.1 * q / (double)(m - 1); /* unbiased */
        for (size_t i = 0; i < m; i++)
            wy[ch * m + i] = (hx[ch * m + i] - mu) * winv[ch] * g[ch] + b[ch];
    }
    printf("  (%d,%d,%d,%d) %s\n", sh.n, sh.c, sh.h, sh.w, sh.c % 16 ? "(C,N,H,W)" : "nChw16c");
    get_cm(sh, hy, y);
    /* the floor is the float rounding of the saved mean: ulp(20) / std 0.5 ~ 4e-6 on channel 2 */
    expect_close("bn_train_fwd y", hy, wy, total, 6e-6, 2e-6);
    down(got, smean, c);
    expect_close("bn_train_fwd save_mean", got, wmean, c, 1e-6, 1e-6);
    down(got, sinv, c);
    expect_close("bn_train_fwd save_invstd", got, winv, c, 0, 1e-6);
    down(got, drm, c);
    expect_close("bn_train_fwd running_mean", got, wrm, c, 1e-6, 1e-6);
    down(got, drv, c);
    expect_close("bn_train_fwd running_var (unbiased)", got, wrv, c, 0, 1e-6);

    /* inference with the updated running statistics */
    float *hrm = host_floats(c), *hrv = host_floats(c);
    down(hrm, drm, c);
    down(hrv, drv, c);
    fill_nan(y, total);
    ops->bn_infer_fwd(st, &d, x, dg, db, drm, drv, y);
    for (size_t ch = 0; ch < c; ch++)
        for (size_t i = 0; i < m; i++)
            wy[ch * m + i] = (hx[ch * m + i] - (double)hrm[ch]) / sqrt((double)hrv[ch] + 1e-5) * g[ch] + b[ch];
    get_cm(sh, hy, y);
    expect_close("bn_infer_fwd y", hy, wy, total, 2e-6, 2e-6);

    float *ptrs[] = {x, y, dg, db, drm, drv, smean, sinv};
    for (size_t i = 0; i < RT_ARRAY_LEN(ptrs); i++)
        ops->free(be, ptrs[i]);
    float *hp[] = {hx, hy, g, b, rm, rv, got, hrm, hrv};
    for (size_t i = 0; i < RT_ARRAY_LEN(hp); i++)
        free(hp[i]);
    double *dp[] = {wy, wmean, winv, wrm, wrv};
    for (size_t i = 0; i < RT_ARRAY_LEN(dp); i++)
        free(dp[i]);
}

static void test_bn_forward(void)
{
    printf("batchnorm forward\n");
    static const struct rt_shape4 shapes[] = {
        {3, 5, 5, 7},   /* M = 105 per channel: not a multiple of the kernels' 8-wide loop, so the tail is covered */
        {2, 16, 5, 3},  /* blocked: one block of channels */
        {3, 32, 4, 4},  /* blocked: two */
        {4, 32, 16, 16}, /* blocked, big enough for the threads */
        {4, 8, 32, 32}, /* channel-major, big enough for the threads */
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(shapes); i++)
        test_bn_forward_case(shapes[i]);
}

/* loss = sum(bn_train_fwd(x; gamma, beta) * r), in double from the op's float output; hy and r are (C, M). */
static double bn_loss(const struct rt_bn_desc *d, const float *x, const float *g, const float *b, float *y,
                      const float *r, float *hy, float *work)
{
    const size_t c = (size_t)d->in.c, total = c * d->in.n * d->in.h * d->in.w;
    /* running stats and saved stats go to scratch: only y matters here */
    ops->bn_train_fwd(st, d, x, g, b, work, work + c, work + 2 * c, work + 3 * c, y);
    get_cm(d->in, hy, y);
    return dot_fr(hy, r, total);
}

/*
 * bn_bwd against a double-precision gradient from the saved statistics
 * (dx, dgamma, dbeta), and, with `fd`, against central differences of the
 * op's own forward: every dx element and every dgamma / dbeta. The
 * differences need a small tensor: loss sums every y, whose rounding errors
 * grow with the tensor.
 */
static void test_bn_backward_case(struct rt_shape4 sh, int fd)
{
    const struct rt_bn_desc d = {.in = sh, .eps = 1e-5f, .momentum = 0.1f};
    const size_t c = (size_t)sh.c, m = (size_t)sh.n * sh.h * sh.w, total = c * m;
    printf("  (%d,%d,%d,%d) %s%s\n", sh.n, sh.c, sh.h, sh.w, sh.c % 16 ? "(C,N,H,W)" : "nChw16c",
           fd ? ", finite differences" : "");
    float *hx = host_floats(total), *hr = host_floats(total), *hy = host_floats(total), *hdx = host_floats(total);
    float *g = host_floats(c), *b = host_floats(c), *got = host_floats(c), *half = host_floats(c);
    for (size_t ch = 0; ch < c; ch++) {
        g[ch] = ch % 3 == 2 ? -0.6f : bn_gamma(ch); /* a negative gamma too */
        b[ch] = bn_beta(ch);
        half[ch] = 0.5f;
    }
    fill_bn_input(hx, c, m);
    fill_normal(hr, total, 0.0f, 1.0f);
    float *x = dev_floats(total), *y = dev_floats(total), *r = dev_floats(total), *dx = dev_floats(total),
          *dg = dev_floats(c), *db = dev_floats(c), *work = dev_floats(4 * c), *smean = dev_floats(c),
          *sinv = dev_floats(c), *dgamma = dev_floats(c), *dbeta = dev_floats(c);
    put_cm(sh, x, hx);
    put_cm(sh, r, hr);
    up(dg, g, c);
    up(db, b, c);
    ops->bn_train_fwd(st, &d, x, dg, db, work, work + c, smean, sinv, y);

    /* dx over NaN (beta 0 must not read it); dgamma/dbeta start at 0.5 and are added to */
    fill_nan(dx, total);
    up(dgamma, half, c);
    up(dbeta, half, c);
    ops->bn_bwd(st, &d, x, r, dg, db, smean, sinv, 0.0f, dx, dgamma, dbeta);
    get_cm(sh, hdx, dx);

    /* exact double-precision gradient from the saved statistics: a tight bound */
    float *hmean = host_floats(c), *hinv = host_floats(c);
    down(hmean, smean, c);
    down(hinv, sinv, c);
    double *want = host_doubles(total), *wg = host_doubles(c), *wb = host_doubles(c);
    for (size_t ch = 0; ch < c; ch++) {
        double sdy = 0.0, sdyx = 0.0;
        for (size_t i = 0; i < m; i++) {
            sdy += hr[ch * m + i];
            sdyx += hr[ch * m + i] * ((double)hx[ch * m + i] - hmean[ch]);
        }
        wb[ch] = 0.5 + sdy;
        wg[ch] = 0.5 + sdyx * hinv[ch];
        for (size_t i = 0; i < m; i++) {
            const double xh = ((double)hx[ch * m + i] - hmean[ch]) * hinv[ch];
            want[ch * m + i] = (double)g[ch] * hinv[ch] * (hr[ch * m + i] - sdy / m - xh * sdyx * hinv[ch] / m);
        }
    }
    expect_close("bn_bwd dx vs double reference", hdx, want, total, 1e-6, 1e-5);
    down(got, dgamma, c);
    expect_close("bn_bwd dgamma (+= 0.5) vs double ref", got, wg, c, 1e-6, 1e-6);
    down(got, dbeta, c);
    expect_close("bn_bwd dbeta (+= 0.5) vs double ref", got, wb, c, 1e-6, 1e-6);

    double *fb = host_doubles(c);
    for (size_t ch = 0; ch < c; ch++)
        fb[ch] = wb[ch];
    if (fd) {
        /* central differences, h = 1e-2 on inputs of spread 0.5..3 */
        const float h = 1e-2f;
        double *fdx = host_doubles(total), *fg = host_doubles(c);
        float *px = host_floats(total), *pp = host_floats(c);
        memcpy(px, hx, total * sizeof(float));
        for (size_t i = 0; i < total; i++) {
            px[i] = hx[i] + h;
            put_cm(sh, x, px);
            const double lp = bn_loss(&d, x, dg, db, y, hr, hy, work);
            px[i] = hx[i] - h;
            put_cm(sh, x, px);
            const double lm = bn_loss(&d, x, dg, db, y, hr, hy, work);
            px[i] = hx[i];
            fdx[i] = (lp - lm) / ((double)(hx[i] + h) - (double)(hx[i] - h));
        }
        put_cm(sh, x, hx);
        expect_close("bn_bwd dx vs finite differences", hdx, fdx, total, 2e-3, 1e-2);

        for (size_t ch = 0; ch < c; ch++) {
            memcpy(pp, g, c * sizeof(float));
            pp[ch] = g[ch] + h;
            up(dg, pp, c);
            const double lp = bn_loss(&d, x, dg, db, y, hr, hy, work);
            pp[ch] = g[ch] - h;
            up(dg, pp, c);
            const double lm = bn_loss(&d, x, dg, db, y, hr, hy, work);
            up(dg, g, c);
            fg[ch] = 0.5 + (lp - lm) / ((double)(g[ch] + h) - (double)(g[ch] - h));
            memcpy(pp, b, c * sizeof(float));
            pp[ch] = b[ch] + h;
            up(db, pp, c);
            const double lbp = bn_loss(&d, x, dg, db, y, hr, hy, work);
            pp[ch] = b[ch] - h;
            up(db, pp, c);
            const double lbm = bn_loss(&d, x, dg, db, y, hr, hy, work);
            up(db, b, c);
            fb[ch] = 0.5 + (lbp - lbm) / ((double)(b[ch] + h) - (double)(b[ch] - h));
        }
        down(got, dgamma, c);
        expect_close("bn_bwd dgamma (+= 0.5) vs fd", got, fg, c, 2e-3, 1e-3);
        down(got, dbeta, c);
        expect_close("bn_bwd dbeta (+= 0.5) vs fd", got, fb, c, 2e-3, 1e-3);
        free(fdx);
        free(fg);
        free(px);
        free(pp);
    }

    /* beta_dx = 1 adds to what dx holds */
    float *base = host_floats(total);
    fill_normal(base, total, 0.0f, 1.0f);
    put_cm(sh, dx, base);
    ops->bn_bwd(st, &d, x, r, dg, db, smean, sinv, 1.0f, dx, dgamma, dbeta);
    for (size_t i = 0; i < total; i++)
        want[i] = (double)base[i] + hdx[i];
    get_cm(sh, hy, dx);
    expect_close("bn_bwd beta_dx=1 accumulates", hy, want, total, 1e-6, 1e-6);
    down(got, dbeta, c);
    for (size_t ch = 0; ch < c; ch++)
        fb[ch] = 0.5 + 2.0 * (fb[ch] - 0.5);
    expect_close("bn_bwd dbeta accumulates twice", got, fb, c, 4e-3, 1e-3);

    float *ptrs[] = {x, y, r, dx, dg, db, work, smean, sinv, dgamma, dbeta};
    for (size_t i = 0; i < RT_ARRAY_LEN(ptrs); i++)
        ops->free(be, ptrs[i]);
    float *hp[] = {hx, hr, hy, hdx, g, b, got, half, hmean, hinv, base};
    for (size_t i = 0; i < RT_ARRAY_LEN(hp); i++)
        free(hp[i]);
    free(want);
    free(wg);
    free(wb);
    free(fb);
}

static void test_bn_backward(void)
{
    printf("batchnorm backward\n");
    /* M = 30 per channel: the mean and projection terms of dx are ~1/sqrt(M) of dy, far above the FD
     * error; 30 is not a multiple of the kernels' 8-wide loop, so the tail is covered. */
    test_bn_backward_case((struct rt_shape4){2, 3, 3, 5}, 1);
    test_bn_backward_case((struct rt_shape4){2, 16, 3, 5}, 1);
    test_bn_backward_case((struct rt_shape4){3, 32, 2, 2}, 1);
    test_bn_backward_case((struct rt_shape4){4, 32, 16, 16}, 0);
    test_bn_backward_case((struct rt_shape4){4, 8, 32, 32}, 0);
}

/*
 * Batchnorm's statistics are sums over a channel, which the kernels split
 * between threads (per block plane when blocked): one thread and two give
 * the same bits, forward and backward.
 */
static void test_bn_threads(void)
{
    printf("batchnorm: 1 thread and 2 threads agree bit for bit\n");
    struct rt_backend *be1 = NULL;
    CHECK_OK(rt_backend_create(&(struct rt_backend_opts){.kind = RT_BACKEND_CPU, .threads = 1}, &be1));
    if (!be1)
        return;
    static const struct rt_shape4 shapes[] = {{4, 32, 16, 16}, {2, 16, 32, 32}, {4, 8, 32, 32}};
    for (size_t k = 0; k < RT_ARRAY_LEN(shapes); k++) {
        const struct rt_bn_desc d = {.in = shapes[k], .eps = 1e-5f, .momentum = 0.1f};
        const size_t c = (size_t)d.in.c, total = c * d.in.n * d.in.h * d.in.w;
        const size_t nbuf = 3 * total + 7 * c;
        float *host = host_floats(nbuf), *out[2];
        for (size_t i = 0; i < nbuf; i++)
            host[i] = 0.5f;
        fill_bn_input(host, c, total / c);             /* x */
        fill_normal(host + total, total, 0.0f, 1.0f); /* dy */
        for (int t = 0; t < 2; t++) {
            struct rt_backend *b = t ? be : be1;
            const struct rt_ops *o = rt_backend_ops(b);
            struct rt_stream *s = rt_backend_stream(b);
            float *dev = o->alloc(b, nbuf * sizeof(float));
            out[t] = host_floats(nbuf);
            CHECK(dev != NULL);
            if (!dev)
                continue;
            /* x, dy, dx (C, M) in any layout: the op's result only has to match the other team's */
            float *x = dev, *dy = x + total, *dx = dy + total, *p = dx + total;
            o->upload(s, dev, host, nbuf * sizeof(float));
            o->bn_train_fwd(s, &d, x, p, p + c, p + 2 * c, p + 3 * c, p + 4 * c, p + 5 * c, dx);
            o->bn_bwd(s, &d, x, dy, p, p + c, p + 4 * c, p + 5 * c, 0.0f, dx, p + 6 * c, p + c);
            o->download(s, out[t], dev, nbuf * sizeof(float));
            o->sync(s);
            o->free(b, dev);
        }
        CHECKF(memcmp(out[0], out[1], nbuf * sizeof(float)) == 0,
               "batchnorm (%d,%d,%d,%d): 1 thread and 2 threads differ", d.in.n, d.in.c, d.in.h, d.in.w);
        free(out[0]);
        free(out[1]);
        free(host);
    }
    rt_backend_destroy(be1);
}

/*
 * Batchnorm with a fused ReLU (rt_bn_desc.relu, which the CPU tables honour: rt_ops.bn_relu) against the two ops
 * it replaces, bit for bit: bn_train_fwd then relu_fwd in place, bn_infer_fwd then relu_fwd; relu_bwd (on that
 * output) then bn_bwd, with beta_dx 0 and 1. The fused kernels compute the same float expressions, the mask
 * included, so nothing may differ; a gamma of each sign and betas around 0 put the mask everywhere.
 */
static void test_bn_relu_case(struct rt_shape4 sh)
{
    printf("  (%d,%d,%d,%d) %s\n", sh.n, sh.c, sh.h, sh.w, sh.c % 16 ? "(C,N,H,W)" : "nChw16c");
    struct rt_bn_desc plain = {.in = sh, .eps = 1e-5f, .momentum = 0.1f}, fused = plain;
    fused.relu = 1;
    const size_t c = (size_t)sh.c, m = (size_t)sh.n * sh.h * sh.w, total = c * m;
    float *hx = host_floats(total), *hr = host_floats(total), *g = host_floats(c), *b = host_floats(c);
    float *got[2] = {host_floats(total), host_floats(total)}, *st2[2] = {host_floats(4 * c), host_floats(4 * c)};
    for (size_t ch = 0; ch < c; ch++) {
        g[ch] = ch % 3 == 2 ? -0.6f : bn_gamma(ch);
        b[ch] = bn_beta(ch) - 0.2f;
    }
    fill_bn_input(hx, c, m);
    fill_normal(hr, total, 0.0f, 1.0f);
    float *x = dev_floats(total), *r = dev_floats(total), *y = dev_floats(total), *dx = dev_floats(total),
          *t = dev_floats(total), *dg = dev_floats(c), *db = dev_floats(c), *sv = dev_floats(4 * c),
          *gr = dev_floats(2 * c);
    put_cm(sh, x, hx);
    put_cm(sh, r, hr);
    up(dg, g, c);
    up(db, b, c);
    static const char *const what[] = {"bn_train_fwd", "bn_infer_fwd", "bn_bwd beta_dx 0", "bn_bwd beta_dx 1"};
    for (int k = 0; k < 4; k++) {
        for (int f = 0; f < 2; f++) {
            /* running stats start equal in both; save_mean/invstd of a training forward feed the backward */
            const float init[4] = {0.1f, 0.9f, 0.0f, 0.0f};
            for (size_t i = 0; i < 4 * c; i++)
                st2[f][i] = init[i / c];
            up(sv, st2[f], 4 * c);
            const struct rt_bn_desc *d = f ? &fused : &plain;
            if (k == 1) {
                ops->bn_infer_fwd(st, d, x, dg, db, sv, sv + c, y);
            } else {
                ops->bn_train_fwd(st, d, x, dg, db, sv, sv + c, sv + 2 * c, sv + 3 * c, y);
            }
            if (!f)
                ops->relu_fwd(st, total, y, y);
            if (k >= 2) {
                const float beta_dx = k == 3 ? 1.0f : 0.0f;
                put_cm(sh, dx, hr); /* what beta_dx 1 adds to */
                up(gr, g, c);      /* dgamma, dbeta start at gamma (added to) */
                up(gr + c, b, c);
                const float *dyb = r;
                if (!f) {
                    ops->relu_bwd(st, total, y, r, 0.0f, t);
                    dyb = t;
                }
                ops->bn_bwd(st, d, x, dyb, dg, db, sv + 2 * c, sv + 3 * c, beta_dx, dx, gr, gr + c);
                get_cm(sh, got[f], dx);
                down(st2[f], gr, 2 * c);
            } else {
                get_cm(sh, got[f], y);
                down(st2[f], sv, 4 * c);
            }
        }
        CHECKF(memcmp(got[0], got[1], total * sizeof(float)) == 0, "%s (%d,%d,%d,%d) with relu: fused differs from "
               "the ops it replaces", what[k], sh.n, sh.c, sh.h, sh.w);
        CHECKF(memcmp(st2[0], st2[1], (k >= 2 ? 2 : 4) * c * sizeof(float)) == 0,
               "%s (%d,%d,%d,%d) with relu: %s differ", what[k], sh.n, sh.c, sh.h, sh.w,
               k >= 2 ? "dgamma/dbeta" : "statistics");
    }
    /* the mask is not empty nor everything: some outputs are clipped, some pass */
    size_t zeros = 0;
    ops->bn_train_fwd(st, &fused, x, dg, db, sv, sv + c, sv + 2 * c, sv + 3 * c, y);
    get_cm(sh, got[0], y);
    for (size_t i = 0; i < total; i++)
        zeros += got[0][i] == 0.0f;
    CHECKF(zeros > total / 10 && zeros < total * 9 / 10, "bn+relu (%d,%d,%d,%d): %zu of %zu outputs clipped", sh.n,
           sh.c, sh.h, sh.w, zeros, total);
    float *ptrs[] = {x, r, y, dx, t, dg, db, sv, gr};
    for (size_t i = 0; i < RT_ARRAY_LEN(ptrs); i++)
        ops->free(be, ptrs[i]);
    float *hp[] = {hx, hr, g, b, got[0], got[1], st2[0], st2[1]};
    for (size_t i = 0; i < RT_ARRAY_LEN(hp); i++)
        free(hp[i]);
}

static void test_bn_relu(void)
{
    printf("batchnorm with a fused ReLU = batchnorm then ReLU, bit for bit\n");
    CHECKF(rt_backend_ops(be)->bn_relu == 1, "the CPU's fp32 table does not fuse batchnorm and ReLU");
    test_bn_relu_case((struct rt_shape4){2, 3, 3, 5});
    test_bn_relu_case((struct rt_shape4){2, 16, 3, 5});
    test_bn_relu_case((struct rt_shape4){4, 32, 16, 16});
}

/* ---- activations -------------------------------------------------------------------- */

typedef void (*unary_fwd)(struct rt_stream *s, size_t n, const float *x, float *y);

/*
 * For an element-wise op, loss = sum(f(x) r) moves only through y_i when x_i
 * moves, so one pair of forwards at x + h and x - h gives every d loss / d x_i.
 */
static void elementwise_fd(unary_fwd f, size_t n, const float *hx, const float *hr, float h, double *fd)
{
    float *x = dev_floats(n), *y = dev_floats(n), *p = host_floats(n), *yp = host_floats(n),
          *ym = host_floats(n);
    for (size_t i = 0; i < n; i++)
        p[i] = hx[i] + h;
    up(x, p, n);
    f(st, n, x, y);
    down(yp, y, n);
    for (size_t i = 0; i < n; i++)
        p[i] = hx[i] - h;
    up(x, p, n);
    f(st, n, x, y);
    down(ym, y, n);
    for (size_t i = 0; i < n; i++)
        fd[i] = hr[i] * ((double)yp[i] - ym[i]) / ((double)(hx[i] + h) - (double)(hx[i] - h));
    ops->free(be, x);
    ops->free(be, y);
    free(p);
    free(yp);
    free(ym);
}

static void test_relu(void)
{
    printf("relu\n");
    const size_t n = 5000;
    float *hx = host_floats(n), *hr = host_floats(n), *hy = host_floats(n), *hdx = host_floats(n);
    fill_normal(hx, n, 0.0f, 1.0f);
    /* keep inputs 0.05 away from the kink so h = 1e-2 differences see one side */
    for (size_t i = 0; i < n; i++)
        if (fabsf(hx[i]) < 0.05f)
            hx[i] += hx[i] < 0 ? -0.05f : 0.05f;
    hx[7] = NAN;
    fill_normal(hr, n, 0.0f, 1.0f);
    float *x = dev_floats(n), *y = dev_floats(n), *r = dev_floats(n), *dx = dev_floats(n);
    up(x, hx, n);
    up(r, hr, n);
    ops->relu_fwd(st, n, x, y);
    down(hy, y, n);
    double *want = host_doubles(n);
    for (size_t i = 0; i < n; i++)
        want[i] = hx[i] > 0 ? hx[i] : 0.0;
    want[7] = 0.0;
    CHECKF(isnan(hy[7]), "relu_fwd(NaN) = %g, want NaN (torch.relu lets NaN through)", (double)hy[7]);
    hy[7] = 0.0f;
    expect_close("relu_fwd", hy, want, n, 0, 0);

    /* in place: y may be x */
    float *xi = dev_floats(n);
    up(xi, hx, n);
    ops->relu_fwd(st, n, xi, xi);
    down(hdx, xi, n);
    hdx[7] = 0.0f;
    expect_close("relu_fwd in place", hdx, want, n, 0, 0);
    ops->free(be, xi);

    hx[7] = 1.0f;
    up(x, hx, n);
    ops->relu_fwd(st, n, x, y);
    fill_nan(dx, n);
    ops->relu_bwd(st, n, y, r, 0.0f, dx);
    down(hdx, dx, n);
    double *fd = host_doubles(n);
    elementwise_fd(ops->relu_fwd, n, hx, hr, 1e-2f, fd);
    expect_close("relu_bwd (over NaN) vs fd", hdx, fd, n, 1e-5, 1e-5);

    float *base = host_floats(n);
    fill_normal(base, n, 0.0f, 1.0f);
    up(dx, base, n);
    ops->relu_bwd(st, n, y, r, 1.0f, dx);
    down(hy, dx, n);
    for (size_t i = 0; i < n; i++)
        want[i] = (double)base[i] + (hx[i] > 0 ? hr[i] : 0.0f);
    expect_close("relu_bwd beta=1", hy, want, n, 0, 1.2e-7);

    ops->free(be, x);
    ops->free(be, y);
    ops->free(be, r);
    ops->free(be, dx);
    free(hx);
    free(hr);
    free(hy);
    free(hdx);
    free(want);
    free(fd);
    free(base);
}

static void test_gelu(void)
{
    printf("gelu\n");
    const size_t n = 5000;
    float *hx = host_floats(n), *hr = host_floats(n), *hy = host_floats(n), *hdx = host_floats(n);
    fill_normal(hx, n, 0.0f, 2.0f);
    fill_normal(hr, n, 0.0f, 1.0f);
    float *x = dev_floats(n), *y = dev_floats(n), *r = dev_floats(n), *dx = dev_floats(n);
    up(x, hx, n);
    up(r, hr, n);
    ops->gelu_fwd(st, n, x, y);
    down(hy, y, n);
    double *want = host_doubles(n), *fd = host_doubles(n);
    for (size_t i = 0; i < n; i++)
        want[i] = 0.5 * hx[i] * (1.0 + erf(hx[i] / sqrt(2.0)));
    expect_close("gelu_fwd vs double erf", hy, want, n, 2e-7, 1e-6);

    fill_nan(dx, n);
    ops->gelu_bwd(st, n, x, r, 0.0f, dx);
    down(hdx, dx, n);
    elementwise_fd(ops->gelu_fwd, n, hx, hr, 1e-2f, fd);
    expect_close("gelu_bwd (over NaN) vs fd", hdx, fd, n, 1e-4, 1e-3);
    for (size_t i = 0; i < n; i++) {
        const double v = hx[i];
        want[i] = hr[i] * (0.5 * (1.0 + erf(v / sqrt(2.0))) + v * exp(-0.5 * v * v) / sqrt(2.0 * M_PI));
    }
    expect_close("gelu_bwd vs double reference", hdx, want, n, 1e-6, 1e-5);

    float *base = host_floats(n);
    fill_normal(base, n, 0.0f, 1.0f);
    up(dx, base, n);
    ops->gelu_bwd(st, n, x, r, 1.0f, dx);
    down(hy, dx, n);
    for (size_t i = 0; i < n; i++)
        want[i] += base[i];
    expect_close("gelu_bwd beta=1", hy, want, n, 2e-6, 1e-5);

    ops->free(be, x);
    ops->free(be, y);
    ops->free(be, r);
    ops->free(be, dx);
    free(hx);
    free(hr);
    free(hy);
    free(hdx);
    free(want);
    free(fd);
    free(base);
}

/* ---- dropout -------------------------------------------------------------------------- */

/* dropout_fwd with fixed (p, seed, offset), shaped for elementwise_fd() */
static float drop_p;
static uint64_t drop_seed, drop_off;

static void dropout_fixed(struct rt_stream *s, size_t n, const float *x, float *y)
{
    ops->dropout_fwd(s, (struct rt_shape4){1, (int)n, 1, 1}, 0, drop_p, drop_seed, drop_off, NULL, x, y);
}

/* The mask as compute.h documents it, for stream element e: 1 if kept. */
static int dropout_kept_ref(uint64_t seed, uint64_t e, float p)
{
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint64_t blk = e >> 2;
    const uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), 0, 0x64726f70u};
    uint32_t w[4];
    rt_philox4x32(key, ctr, w);
    return (float)(w[e & 3] >> 8) * (1.0f / 16777216.0f) >= p;
}

static void test_dropout(void)
{
    printf("dropout\n");
    /* features (1024, 1024): memory order is the logical order, so element i draws offset + i */
    const struct rt_shape4 fs = {1024, 1024, 1, 1};
    const size_t n = (size_t)1 << 20;
    const float p = 0.3f, scale = 1.0f / (1.0f - p);
    const uint64_t seed = 0x123456789abcdefULL, off = 1000003;
    float *hx = dropout_input(n), *a = host_floats(n), *b = host_floats(n);
    float *x = dev_floats(n), *y = dev_floats(n);
    up(x, hx, n);
    ops->dropout_fwd(st, fs, 0, p, seed, off, NULL, x, y);
    down(a, y, n);

    size_t kept = 0, wrong = 0, ref_wrong = 0;
    for (size_t i = 0; i < n; i++) {
        const int k = a[i] != 0.0f;
        kept += (size_t)k;
        if (k && a[i] != hx[i] * scale && wrong++ < 5)
            fprintf(stderr, "  dropout_fwd[%zu]: kept value %.9g != x * 1/(1-p) = %.9g\n", i, (double)a[i],
                    (double)(hx[i] * scale));
        if (i < 4096 && k != dropout_kept_ref(seed, off + i, p) && ref_wrong++ < 5)
            fprintf(stderr, "  dropout_fwd[%zu]: mask %d differs from the documented Philox draw\n", i, k);
    }
    const double frac = (double)kept / n, sigma = sqrt(p * (1.0 - p) / n);
    printf("  dropout p=%.2f kept %.5f (want %.5f +- %.5f)\n", (double)p, frac, 1.0 - p, 5 * sigma);
    CHECKF(fabs(frac - (1.0 - p)) < 5 * sigma, "dropout kept %.5f, want %.5f", frac, 1.0 - p);
    CHECKF(wrong == 0, "dropout_fwd: %zu kept values not scaled by 1/(1-p)", wrong);
    CHECKF(ref_wrong == 0, "dropout_fwd: %zu mask bits differ from the documented Philox draw", ref_wrong);

    /* same (seed, offset) -> same output; another offset -> another mask */
    ops->dropout_fwd(st, fs, 0, p, seed, off, NULL, x, y);
    down(b, y, n);
    CHECKF(memcmp(a, b, n * sizeof(float)) == 0, "dropout_fwd: same (seed, offset) gave another output");
    ops->dropout_fwd(st, fs, 0, p, seed, off + n, NULL, x, y);
    down(b, y, n);
    size_t agree = 0;
    for (size_t i = 0; i < n; i++)
        agree += (a[i] != 0.0f) == (b[i] != 0.0f);
    const double fa = (double)agree / n, want_fa = p * p + (1 - p) * (1 - p);
    CHECKF(fabs(fa - want_fa) < 0.01, "dropout: masks at offsets %llu and %llu agree on %.4f, want ~%.4f",
           (unsigned long long)off, (unsigned long long)(off + n), fa, want_fa);
    ops->dropout_fwd(st, fs, 0, p, seed + 1, off, NULL, x, y);
    down(b, y, n);
    agree = 0;
    for (size_t i = 0; i < n; i++)
        agree += (a[i] != 0.0f) == (b[i] != 0.0f);
    CHECKF(fabs((double)agree / n - want_fa) < 0.01, "dropout: another seed agrees on %.4f, want ~%.4f",
           (double)agree / n, want_fa);

    /* offset + i addressing: a sub-range started at offset + k is the slice of the full output */
    const size_t k = 4099, len = 70001; /* k not a multiple of 4: lanes within a Philox block */
    float *ys = dev_floats(len);
    ops->dropout_fwd(st, (struct rt_shape4){1, (int)len, 1, 1}, 0, p, seed, off + k, NULL, x + k, ys);
    down(b, ys, len);
    CHECKF(memcmp(a + k, b, len * sizeof(float)) == 0, "dropout: range at offset+%zu is not the slice", k);
    ops->free(be, ys);

    /* independent of the thread count */
    struct rt_backend *be1 = NULL;
    CHECK_OK(rt_backend_create(&(struct rt_backend_opts){.kind = RT_BACKEND_CPU, .threads = 1}, &be1));
    if (be1) {
        const struct rt_ops *o1 = rt_backend_ops(be1);
        struct rt_stream *s1 = rt_backend_stream(be1);
        float *x1 = o1->alloc(be1, n * sizeof(float)), *y1 = o1->alloc(be1, n * sizeof(float));
        CHECK(x1 && y1);
        if (x1 && y1) {
            o1->upload(s1, x1, hx, n * sizeof(float));
            o1->dropout_fwd(s1, fs, 0, p, seed, off, NULL, x1, y1);
            o1->download(s1, b, y1, n * sizeof(float));
            CHECKF(memcmp(a, b, n * sizeof(float)) == 0, "dropout: 1 thread and 2 threads differ");
        }
        o1->free(be1, x1);
        o1->free(be1, y1);
        rt_backend_destroy(be1);
    }

    /* backward: mask * scale, the same mask, over NaN for beta 0; beta 1 adds */
    const struct rt_shape4 fb = {100, 100, 1, 1};
    const size_t nb = 10000;
    float *hr = host_floats(nb), *hd = host_floats(nb);
    double *want = host_doubles(nb), *fd = host_doubles(nb);
    fill_normal(hr, nb, 0.0f, 1.0f);
    float *r = dev_floats(nb), *dx = dev_floats(nb);
    up(r, hr, nb);
    fill_nan(dx, nb);
    ops->dropout_bwd(st, fb, 0, p, seed, off, NULL, r, 0.0f, dx);
    down(hd, dx, nb);
    for (size_t i = 0; i < nb; i++)
        want[i] = a[i] != 0.0f ? (double)(hr[i] * scale) : 0.0;
    expect_close("dropout_bwd = mask * scale * dy", hd, want, nb, 0, 0);
    drop_p = p;
    drop_seed = seed;
    drop_off = off;
    elementwise_fd(dropout_fixed, nb, hx, hr, 0.25f, fd); /* linear: a wide step has no truncation error */
    expect_close("dropout_bwd vs fd", hd, fd, nb, 1e-5, 1e-5);
    float *base = host_floats(nb);
    fill_normal(base, nb, 0.0f, 1.0f);
    up(dx, base, nb);
    ops->dropout_bwd(st, fb, 0, p, seed, off, NULL, r, 1.0f, dx);
    down(hd, dx, nb);
    for (size_t i = 0; i < nb; i++)
        want[i] += base[i];
    expect_close("dropout_bwd beta=1", hd, want, nb, 0, 1.2e-7);

    /* p = 0 is the identity */
    ops->dropout_fwd(st, fb, 0, 0.0f, seed, off, NULL, x, y);
    down(hd, y, nb);
    CHECKF(memcmp(hd, hx, nb * sizeof(float)) == 0, "dropout p=0 is not the identity");

    ops->free(be, x);
    ops->free(be, y);
    ops->free(be, r);
    ops->free(be, dx);
    free(hx);
    free(a);
    free(b);
    free(hr);
    free(hd);
    free(want);
    free(fd);
    free(base);
}

/* ---- dropout: masks keyed on the logical index ------------------------------------------ */

/*
 * Where element (n, c, h, w) of logical shape sh lies in each layout,
 * written out here independently of dropout_index.h. at_nchw is also the
 * logical index every layout must draw by (compute.h), and, for sh =
 * (N, F, 1, 1), the row-major features' n*F + f.
 */
static size_t at_nchw(struct rt_shape4 sh, int n, int c, int h, int w)
{
    return (((size_t)n * sh.c + c) * sh.h + h) * sh.w + w;
}

static size_t at_cnhw(struct rt_shape4 sh, int n, int c, int h, int w)
{
    return (((size_t)c * sh.n + n) * sh.h + h) * sh.w + w;
}

static size_t at_nhwc(struct rt_shape4 sh, int n, int c, int h, int w)
{
    return (((size_t)n * sh.h + h) * sh.w + w) * sh.c + c;
}

static size_t at_nchw16c(struct rt_shape4 sh, int n, int c, int h, int w)
{
    return ((((size_t)n * (sh.c / 16) + c / 16) * sh.h + h) * sh.w + w) * 16 + c % 16;
}

static const struct drop_layout {
    enum rt_dropout_layout id;
    const char *name;
    size_t (*at)(struct rt_shape4 sh, int n, int c, int h, int w);
    size_t step; /* rt_dropout_plane_step: memory distance from (n, c, h, w) to the next pixel; 0 = C */
} drop_layouts[] = {
    {RT_DROPOUT_NCHW, "NCHW", at_nchw, 1},
    {RT_DROPOUT_CNHW, "CNHW", at_cnhw, 1},
    {RT_DROPOUT_NHWC, "NHWC", at_nhwc, 0},
    {RT_DROPOUT_NCHW16C, "NCHW16C", at_nchw16c, 16}, /* only for C a multiple of 16 */
    {RT_DROPOUT_FEATURES, "features", at_nchw, 1},   /* only for shapes (N, F, 1, 1) */
};

/* Whether layout L can hold shape sh. */
static int drop_layout_fits(const struct drop_layout *L, struct rt_shape4 sh)
{
    if (L->id == RT_DROPOUT_NCHW16C)
        return sh.c % 16 == 0;
    if (L->id == RT_DROPOUT_FEATURES)
        return sh.h == 1 && sh.w == 1;
    return 1;
}

/*
 * Shapes for both tests below: odd sizes, batch 1, one channel, 1x1 planes, mnist-net's two dropouts;
 * C = 16, 32 and 64 are blocked on the CPU (64 with planes of 144 pixels, which the kernel's tiles
 * of 64 pixels cross), and 1x1 planes make the blocked layout NCHW.
 */
static const struct drop_case {
    struct rt_shape4 sh;
    int spatial;
} drop_cases[] = {
    {{5, 3, 7, 9}, 1},    {{1, 4, 5, 3}, 1},    {{3, 1, 6, 5}, 1},  {{4, 6, 1, 1}, 1},
    {{4, 64, 12, 12}, 1}, {{2, 16, 5, 3}, 1},   {{3, 32, 4, 4}, 1}, {{2, 16, 1, 1}, 1},
    {{1, 32, 3, 1}, 1},   {{7, 37, 1, 1}, 0},   {{64, 128, 1, 1}, 0},
};

/* Offsets: 0, not a multiple of 4, a counter beyond 32 bits, and net.c's node << 56 plus a micro-batch's base. */
static const uint64_t drop_offsets[] = {0, 1000003, (UINT64_C(1) << 34) + 1,
                                        (UINT64_C(9) << 56) + (UINT64_C(5) << 32) + 2};

/*
 * dropout_index.h on its own: for every layout, each memory index maps to
 * the logical index of the (n, c, h, w) stored there, the runs it reports
 * are runs, and the mask drawn through the mapping in memory order is, at
 * every logical position, the same in all layouts and the same as
 * common.h's rt_philox4x32 drawn at offset + logical index.
 */
static void test_dropout_index(void)
{
    printf("dropout_index.h: masks by logical index in every layout\n");
    const float p = 0.3f, scale = rt_dropout_scale(p);
    const uint64_t seed = UINT64_C(0xfedcba9876543210);

    /* its Philox is common.h's, high words of key and counter included */
    size_t philox_bad = 0;
    for (uint64_t k = 0; k < 1000; k++) {
        const uint64_t sd = rt_rng_u64(&rng), blk = rt_rng_u64(&rng) >> (k % 3 == 0 ? 2 : 34);
        const uint32_t key[2] = {(uint32_t)sd, (uint32_t)(sd >> 32)};
        const uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), 0, RT_DROPOUT_CTR3};
        uint32_t want[4], got[4];
        rt_philox4x32(key, ctr, want);
        rt_dropout_block(sd, blk, got);
        philox_bad += memcmp(want, got, sizeof(want)) != 0;
    }
    CHECKF(philox_bad == 0, "rt_dropout_block differs from rt_philox4x32 in %zu of 1000 blocks", philox_bad);

    for (size_t k = 0; k < RT_ARRAY_LEN(drop_cases); k++) {
        const struct rt_shape4 sh = drop_cases[k].sh;
        const size_t total = (size_t)sh.n * sh.c * sh.h * sh.w;
        /* the layouts that fit sh, NCHW (every shape) first */
        const struct drop_layout *lays[RT_ARRAY_LEN(drop_layouts)];
        size_t nlay = 0;
        for (size_t l = 0; l < RT_ARRAY_LEN(drop_layouts); l++)
            if (drop_layout_fits(&drop_layouts[l], sh))
                lays[nlay++] = &drop_layouts[l];
        unsigned char *mask[RT_ARRAY_LEN(drop_layouts)];
        for (size_t l = 0; l < nlay; l++) {
            mask[l] = malloc(total);
            if (!mask[l]) {
                fprintf(stderr, "out of memory\n");
                exit(1);
            }
        }
        uint64_t *lmap = malloc(total * sizeof(uint64_t)), *longest = malloc(total * sizeof(uint64_t));
        if (!lmap || !longest) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        /* plane steps: pixel s + 1 of every (n, c) plane lies step after pixel s */
        size_t step_bad = 0;
        for (size_t l = 0; l < nlay; l++) {
            const struct drop_layout *L = lays[l];
            const uint64_t step = rt_dropout_plane_step(L->id, sh), want = L->step ? L->step : (size_t)sh.c;
            if (step != want && step_bad++ < 3)
                fprintf(stderr, "  %s (%d,%d,%d,%d): plane step %llu, want %llu\n", L->name, sh.n, sh.c, sh.h, sh.w,
                        (unsigned long long)step, (unsigned long long)want);
            for (size_t li = 0; li + 1 < total && step == want; li++) {
                const size_t hw = (size_t)sh.h * sh.w, s = li % hw;
                if (s + 1 == hw)
                    continue;
                const int w = (int)(s % (size_t)sh.w), h = (int)(s / (size_t)sh.w);
                const int w1 = (int)((s + 1) % (size_t)sh.w), h1 = (int)((s + 1) / (size_t)sh.w);
                const int c = (int)(li / hw % (size_t)sh.c), n = (int)(li / (hw * (size_t)sh.c));
                if (L->at(sh, n, c, h1, w1) != L->at(sh, n, c, h, w) + step && step_bad++ < 3)
                    fprintf(stderr, "  %s (%d,%d,%d,%d): pixel %zu of plane (%d,%d) is not a step after pixel %zu\n",
                            L->name, sh.n, sh.c, sh.h, sh.w, s + 1, n, c, s);
            }
        }
        CHECKF(step_bad == 0, "(%d,%d,%d,%d): %zu plane steps wrong", sh.n, sh.c, sh.h, sh.w, step_bad);
        for (size_t o = 0; o < RT_ARRAY_LEN(drop_offsets); o++) {
            const uint64_t off = drop_offsets[o];
            size_t map_bad = 0, run_bad = 0, mask_bad = 0, disagree = 0, dropped = 0;
            for (size_t l = 0; l < nlay; l++) {
                const enum rt_dropout_layout id = lays[l]->id;
                /* the longest run from each memory index, from the end back: a run's check is then one compare */
                for (size_t i = total; i-- > 0;) {
                    lmap[i] = rt_dropout_logical(id, sh, i);
                    longest[i] = i + 1 < total && lmap[i + 1] == lmap[i] + 1 ? longest[i + 1] + 1 : 1;
                }
                for (size_t i = 0; i < total; i++) {
                    const uint64_t li = lmap[i];
                    mask[l][i] = rt_dropout_mul(seed, off + li, p, scale) != 0.0f;
                    const uint64_t run = rt_dropout_run(id, sh, i);
                    const int ok = run >= 1 && run <= longest[i];
                    if (!ok && run_bad++ < 3)
                        fprintf(stderr, "  %s (%d,%d,%d,%d): run %llu from memory index %zu is not a run\n",
                                lays[l]->name, sh.n, sh.c, sh.h, sh.w, (unsigned long long)run, i);
                }
            }
            /* every logical position (n, c, h, w), in logical order li */
            for (size_t li = 0; li < total; li++) {
                const size_t hw = (size_t)sh.h * sh.w;
                const int w = (int)(li % (size_t)sh.w), h = (int)(li / (size_t)sh.w % (size_t)sh.h);
                const int c = (int)(li / hw % (size_t)sh.c), n = (int)(li / (hw * (size_t)sh.c));
                const int want = dropout_kept_ref(seed, off + li, p);
                dropped += !want;
                for (size_t l = 0; l < nlay; l++) {
                    const struct drop_layout *L = lays[l];
                    const size_t mi = L->at(sh, n, c, h, w);
                    const uint64_t got = rt_dropout_logical(L->id, sh, mi);
                    if (got != li && map_bad++ < 3)
                        fprintf(stderr, "  %s (%d,%d,%d,%d): memory %zu maps to %llu, not %zu = (%d,%d,%d,%d)\n",
                                L->name, sh.n, sh.c, sh.h, sh.w, mi, (unsigned long long)got, li, n, c, h, w);
                    disagree += mask[l][mi] != mask[0][at_nchw(sh, n, c, h, w)]; /* lays[0] is NCHW */
                    if (mask[l][mi] != want && mask_bad++ < 3)
                        fprintf(stderr, "  %s (%d,%d,%d,%d) offset %llu: (%d,%d,%d,%d) %s, reference %s\n", L->name,
                                sh.n, sh.c, sh.h, sh.w, (unsigned long long)off, n, c, h, w,
                                mask[l][mi] ? "kept" : "dropped", want ? "kept" : "dropped");
                }
            }
            printf("  (%d,%d,%d,%d) offset %-20llu %zu layouts, %zu positions (%zu dropped): %zu maps, %zu runs, "
                   "%zu masks wrong, %zu disagree\n",
                   sh.n, sh.c, sh.h, sh.w, (unsigned long long)off, nlay, total, dropped, map_bad, run_bad, mask_bad,
                   disagree);
            CHECKF(map_bad == 0, "(%d,%d,%d,%d): %zu memory indices map to the wrong logical index", sh.n, sh.c, sh.h,
                   sh.w, map_bad);
            CHECKF(run_bad == 0, "(%d,%d,%d,%d): %zu runs are not runs of the logical index", sh.n, sh.c, sh.h, sh.w,
                   run_bad);
            CHECKF(mask_bad == 0 && disagree == 0,
                   "(%d,%d,%d,%d) offset %llu: %zu mask bits differ from the reference, %zu between layouts", sh.n,
                   sh.c, sh.h, sh.w, (unsigned long long)off, mask_bad, disagree);
        }
        for (size_t l = 0; l < nlay; l++)
            free(mask[l]);
        free(lmap);
        free(longest);
    }
}

/*
 * The CPU backend's dropout_fwd / dropout_bwd on real tensors -- spatial
 * ones through from_nchw / to_nchw, features through upload / download --
 * against a reference that draws each logical (n, c, h, w) with
 * rt_philox4x32: a kernel keyed on the memory index fails on every spatial
 * shape with N > 1 and C > 1 (channel-major) or H*W > 1 (blocked).
 */
/* A tensor of logical shape sh from / to host memory in logical (NCHW) order: spatial tensors through the backend's
 * layout conversion, features row-major as they are. */
static void put_logical(struct rt_shape4 sh, int spatial, float *dev, const float *host)
{
    if (spatial)
        ops->from_nchw(st, sh, host, dev);
    else
        up(dev, host, (size_t)sh.n * sh.c * sh.h * sh.w);
}

static void get_logical(struct rt_shape4 sh, int spatial, float *host, const float *dev)
{
    if (spatial) {
        ops->to_nchw(st, sh, dev, host);
        ops->sync(st);
    } else {
        down(host, dev, (size_t)sh.n * sh.c * sh.h * sh.w);
    }
}

static void test_dropout_logical(void)
{
    printf("dropout_fwd / dropout_bwd keyed on the logical index\n");
    const float p = 0.4f, scale = rt_dropout_scale(p);
    const uint64_t seed = 20240611;
    for (size_t k = 0; k < RT_ARRAY_LEN(drop_cases); k++) {
        const struct rt_shape4 sh = drop_cases[k].sh;
        const int spatial = drop_cases[k].spatial;
        const size_t total = (size_t)sh.n * sh.c * sh.h * sh.w;
        float *hx = host_floats(total), *hdy = host_floats(total), *old = host_floats(total), *got = host_floats(total);
        double *want = host_doubles(total);
        fill_normal(hx, total, 0.0f, 1.0f);
        fill_normal(hdy, total, 0.0f, 1.0f);
        fill_normal(old, total, 0.0f, 1.0f);
        for (size_t i = 0; i < total; i++) {
            if (hx[i] == 0.0f)
                hx[i] = 1.0f; /* a zero would hide the mask */
            if (hdy[i] == 0.0f)
                hdy[i] = 1.0f;
        }
        float *x = dev_floats(total), *y = dev_floats(total), *dy = dev_floats(total), *dx = dev_floats(total);
        /* host arrays are NCHW, i.e. in logical order: host index = logical index */
        put_logical(sh, spatial, x, hx);
        put_logical(sh, spatial, dy, hdy);
        for (size_t o = 1; o < RT_ARRAY_LEN(drop_offsets); o += 2) { /* 1000003 and net.c's kind */
            const uint64_t off = drop_offsets[o];
            char what[160];
            snprintf(what, sizeof(what), "dropout %s (%d,%d,%d,%d) offset %llu", spatial ? "spatial" : "features",
                     sh.n, sh.c, sh.h, sh.w, (unsigned long long)off);

            ops->dropout_fwd(st, sh, spatial, p, seed, off, NULL, x, y);
            get_logical(sh, spatial, got, y);
            size_t mask_bad = 0;
            for (size_t li = 0; li < total; li++) {
                const int kept = dropout_kept_ref(seed, off + li, p);
                want[li] = kept ? (double)(hx[li] * scale) : 0.0;
                if ((got[li] != 0.0f) != kept && mask_bad++ < 3)
                    fprintf(stderr, "  %s: logical %zu = (%zu,%zu,%zu,%zu) %s, reference %s\n", what, li,
                            li / ((size_t)sh.c * sh.h * sh.w), li / ((size_t)sh.h * sh.w) % (size_t)sh.c,
                            li / (size_t)sh.w % (size_t)sh.h, li % (size_t)sh.w, got[li] != 0.0f ? "kept" : "dropped",
                            kept ? "kept" : "dropped");
            }
            printf("  %-60s %zu of %zu mask bits differ from the reference\n", what, mask_bad, total);
            CHECKF(mask_bad == 0, "%s: dropout_fwd's mask differs from the logical-index reference at %zu of %zu",
                   what, mask_bad, total);
            expect_close("dropout_fwd vs reference", got, want, total, 0, 0);

            /* backward: the same mask; beta 0 overwrites (NaN before), beta 1 adds */
            float *nan = host_floats(total);
            for (size_t i = 0; i < total; i++)
                nan[i] = NAN;
            up(dx, nan, total);
            free(nan);
            ops->dropout_bwd(st, sh, spatial, p, seed, off, NULL, dy, 0.0f, dx);
            get_logical(sh, spatial, got, dx);
            for (size_t li = 0; li < total; li++)
                want[li] = dropout_kept_ref(seed, off + li, p) ? (double)(hdy[li] * scale) : 0.0;
            expect_close("dropout_bwd beta=0 vs reference", got, want, total, 0, 0);
            put_logical(sh, spatial, dx, old);
            ops->dropout_bwd(st, sh, spatial, p, seed, off, NULL, dy, 1.0f, dx);
            get_logical(sh, spatial, got, dx);
            for (size_t li = 0; li < total; li++)
                want[li] += (double)old[li];
            expect_close("dropout_bwd beta=1 vs reference", got, want, total, 0, 1.2e-7);
        }
        ops->free(be, x);
        ops->free(be, y);
        ops->free(be, dy);
        ops->free(be, dx);
        free(hx);
        free(hdy);
        free(old);
        free(got);
        free(want);
    }
}

/* ---- dropout: streams and nodes ------------------------------------------------------------ */

/* The fraction of positions where dropout outputs a and b agree on kept / dropped. */
static double mask_agreement(const float *a, const float *b, size_t n)
{
    size_t agree = 0;
    for (size_t i = 0; i < n; i++)
        agree += (a[i] != 0.0f) == (b[i] != 0.0f);
    return (double)agree / (double)n;
}

/*
 * rt_dropout_node_draw(), net.c's (stream, node) -> (seed, offset), and the
 * CPU kernel under it. Streams below 2^24 draw exactly what offset
 * (stream << 32) + (node << 56) under the model seed drew before; from 2^24
 * on, no (stream, node) may share another's draws: with the offset alone,
 * stream 2^24 at node 0 drew stream 0's masks at node 1, and stream 2^32
 * stream 0's.
 */
static void test_dropout_streams(void)
{
    printf("dropout: (stream, node) -> (seed, offset)\n");
    const uint64_t seed = UINT64_C(0x0123456789abcdef);

    static const uint64_t low[] = {0, 1, 5, 12345, (UINT64_C(1) << 23) + 7, (UINT64_C(1) << 24) - 1};
    static const unsigned nodes[] = {0, 1, 4, 5, 9, RT_DROPOUT_NODES - 1};
    static const uint32_t starts[] = {0, 1000003};
    size_t legacy_bad = 0;
    for (size_t i = 0; i < RT_ARRAY_LEN(low); i++)
        for (size_t j = 0; j < RT_ARRAY_LEN(nodes); j++)
            for (size_t k = 0; k < RT_ARRAY_LEN(starts); k++) {
                const struct rt_dropout_draw d = rt_dropout_node_draw(seed, low[i], starts[k], nodes[j]);
                const uint64_t want = (low[i] << 32) + ((uint64_t)nodes[j] << 56) + starts[k];
                if ((d.seed != seed || d.offset != want) && legacy_bad++ < 3)
                    fprintf(stderr, "  stream %llu node %u start %u: (%#llx, %#llx), before (%#llx, %#llx)\n",
                            (unsigned long long)low[i], nodes[j], starts[k], (unsigned long long)d.seed,
                            (unsigned long long)d.offset, (unsigned long long)seed, (unsigned long long)want);
            }
    printf("  streams below 2^24: %zu of %zu draws differ from (seed, (stream << 32) + (node << 56) + start)\n",
           legacy_bad, RT_ARRAY_LEN(low) * RT_ARRAY_LEN(nodes) * RT_ARRAY_LEN(starts));
    CHECKF(legacy_bad == 0, "dropout: %zu draws of streams below 2^24 changed", legacy_bad);

    /* two (stream, node) pairs share draws iff same key and the same offset bits above the tensor's 32 */
    static const uint64_t streams[] = {0,
                                       1,
                                       (UINT64_C(1) << 24) - 1,
                                       UINT64_C(1) << 24,
                                       (UINT64_C(1) << 24) + 1,
                                       UINT64_C(4) << 24,
                                       UINT64_C(255) << 24,
                                       UINT64_C(1) << 32,
                                       (UINT64_C(1) << 32) + 1,
                                       UINT64_C(1) << 40,
                                       UINT64_C(1) << 56,
                                       UINT64_C(1) << 63,
                                       UINT64_MAX};
    size_t shared = 0, pairs = 0;
    for (size_t a = 0; a < RT_ARRAY_LEN(streams) * RT_ARRAY_LEN(nodes); a++)
        for (size_t b = a + 1; b < RT_ARRAY_LEN(streams) * RT_ARRAY_LEN(nodes); b++) {
            const uint64_t sa = streams[a / RT_ARRAY_LEN(nodes)], sb = streams[b / RT_ARRAY_LEN(nodes)];
            const unsigned na = nodes[a % RT_ARRAY_LEN(nodes)], nb = nodes[b % RT_ARRAY_LEN(nodes)];
            const struct rt_dropout_draw da = rt_dropout_node_draw(seed, sa, 0, na);
            const struct rt_dropout_draw db = rt_dropout_node_draw(seed, sb, 0, nb);
            pairs++;
            if (da.seed == db.seed && da.offset >> 32 == db.offset >> 32 && shared++ < 3)
                fprintf(stderr, "  stream %#llx node %u and stream %#llx node %u share (%#llx, %#llx)\n",
                        (unsigned long long)sa, na, (unsigned long long)sb, nb, (unsigned long long)da.seed,
                        (unsigned long long)da.offset);
        }
    printf("  %zu of %zu (stream, node) pairs share their draws\n", shared, pairs);
    CHECKF(shared == 0, "dropout: %zu pairs of (stream, node) share a Philox key and counters", shared);

    /* the CPU kernel under those draws: features (256, 256), memory order = logical order */
    const struct rt_shape4 fs = {256, 256, 1, 1};
    const size_t n = (size_t)256 * 256;
    const float p = 0.3f;
    const double want_agree = (double)p * p + (1.0 - p) * (1.0 - p);
    float *hx = dropout_input(n), *a = host_floats(n), *b = host_floats(n);
    float *x = dev_floats(n), *y = dev_floats(n);
    up(x, hx, n);

    /* below 2^24: the masks of (seed, (stream << 32) + (node << 56)), element for element */
    const struct rt_dropout_draw old = rt_dropout_node_draw(seed, 12345, 0, 9);
    ops->dropout_fwd(st, fs, 0, p, old.seed, old.offset, NULL, x, y);
    down(a, y, n);
    size_t old_bad = 0;
    for (size_t i = 0; i < n; i++)
        old_bad += (a[i] != 0.0f) != dropout_kept_ref(seed, (UINT64_C(12345) << 32) + (UINT64_C(9) << 56) + i, p);
    printf("  stream 12345 node 9: %zu of %zu mask bits differ from the offset-only rule\n", old_bad, n);
    CHECKF(old_bad == 0, "dropout: stream 12345 node 9's mask changed at %zu of %zu elements", old_bad, n);

    /* pairs that drew the same masks with the offset alone: agreement must be chance, not 1 */
    static const struct {
        uint64_t s1;
        unsigned n1;
        uint64_t s2;
        unsigned n2;
    } clash[] = {
        {UINT64_C(1) << 24, 0, 0, 1},                   /* the stream's bit 24 is the node's bit 0 */
        {(UINT64_C(4) << 24) + 7, 5, 7, 9},             /* mnist-net's dropout1 and dropout2 */
        {UINT64_C(255) << 24, 0, 0, RT_DROPOUT_NODES - 1},
        {UINT64_C(1) << 32, 5, 0, 5},                   /* the offset's 64 bits wrapped */
        {(UINT64_C(1) << 32) + 3, 1, 3, 1},
    };
    for (size_t k = 0; k < RT_ARRAY_LEN(clash); k++) {
        const struct rt_dropout_draw d1 = rt_dropout_node_draw(seed, clash[k].s1, 0, clash[k].n1);
        const struct rt_dropout_draw d2 = rt_dropout_node_draw(seed, clash[k].s2, 0, clash[k].n2);
        ops->dropout_fwd(st, fs, 0, p, d1.seed, d1.offset, NULL, x, y);
        down(a, y, n);
        ops->dropout_fwd(st, fs, 0, p, d2.seed, d2.offset, NULL, x, y);
        down(b, y, n);
        /* The same draw made when the op runs, from a stream on the device (a graph's replay): the same mask. */
        uint64_t *sd = ops->alloc(be, sizeof(uint64_t));
        ops->upload(st, sd, &clash[k].s1, sizeof(uint64_t));
        ops->dropout_fwd(st, fs, 0, p, seed, (uint64_t)clash[k].n1 << 56, sd, x, y);
        down(b, y, n);
        CHECKF(!memcmp(a, b, n * sizeof(float)), "dropout: stream %#llx node %u drawn on the device differs from the "
                                                  "host's draw", (unsigned long long)clash[k].s1, clash[k].n1);
        ops->free(be, sd);
        ops->dropout_fwd(st, fs, 0, p, d2.seed, d2.offset, NULL, x, y);
        down(b, y, n);
        const double agree = mask_agreement(a, b, n);
        printf("  stream %#llx node %u vs stream %#llx node %u: masks agree on %.4f (chance %.4f)\n",
               (unsigned long long)clash[k].s1, clash[k].n1, (unsigned long long)clash[k].s2, clash[k].n2, agree,
               want_agree);
        CHECKF(fabs(agree - want_agree) < 0.02,
               "dropout: stream %#llx node %u and stream %#llx node %u agree on %.4f of their masks, want ~%.4f",
               (unsigned long long)clash[k].s1, clash[k].n1, (unsigned long long)clash[k].s2, clash[k].n2, agree,
               want_agree);
        /* and the kernel draws the documented rule under the new key */
        size_t ref_bad = 0;
        for (size_t i = 0; i < 4096; i++)
            ref_bad += (a[i] != 0.0f) != dropout_kept_ref(d1.seed, d1.offset + i, p);
        CHECKF(ref_bad == 0, "dropout: stream %#llx node %u: %zu of 4096 mask bits differ from the Philox draw",
               (unsigned long long)clash[k].s1, clash[k].n1, ref_bad);
    }

    ops->free(be, x);
    ops->free(be, y);
    free(hx);
    free(a);
    free(b);
}

/* ---- add_relu: the residual add and its ReLU in one pass ---------------------------------- */

/*
 * add_relu_fwd against add then relu_fwd in place, and add_relu_bwd against relu_bwd then a copy (beta 0) or
 * axpy(1) (beta 1) into each input's gradient: bit for bit, NaN and signed zeros included, with one gradient
 * left out (NULL) as a frozen input's is. The table must say it fuses (add_relu), or the model never calls it.
 */
static void test_add_relu(void)
{
    printf("add_relu_fwd / add_relu_bwd\n");
    CHECK(ops->add_relu == 1);
    const size_t n = 100003;
    float *ha = host_floats(n), *hb = host_floats(n), *hg = host_floats(n), *h0 = host_floats(n);
    float *want = host_floats(n), *got = host_floats(n), *want2 = host_floats(n), *got2 = host_floats(n);
    fill_normal(ha, n, 0.0f, 1.0f);
    fill_normal(hb, n, 0.0f, 1.0f);
    fill_normal(hg, n, 0.0f, 1.0f);
    fill_normal(h0, n, 0.0f, 1.0f);
    ha[5] = NAN;                  /* a NaN sum passes forward; its gradient is 0 */
    ha[7] = 1.0f, hb[7] = -1.0f;  /* exactly 0: no gradient */
    ha[9] = -0.0f, hb[9] = -0.0f; /* -0 + -0 = -0, which relu keeps as is (not < 0) */
    hg[11] = NAN, ha[11] = -3.0f; /* a NaN gradient where y <= 0 is dropped */
    float *a = dev_floats(n), *b = dev_floats(n), *y = dev_floats(n), *r = dev_floats(n), *g = dev_floats(n);
    float *d1 = dev_floats(n), *d2 = dev_floats(n), *t = dev_floats(n);
    up(a, ha, n);
    up(b, hb, n);
    up(g, hg, n);
    ops->add(st, n, a, b, r);
    ops->relu_fwd(st, n, r, r);
    ops->add_relu_fwd(st, n, a, b, y);
    down(want, r, n);
    down(got, y, n);
    CHECK(memcmp(want, got, n * sizeof(float)) == 0);
    for (int beta = 0; beta < 2; beta++) {
        /* the unfused way: relu_bwd into t, then t copied or added into each gradient */
        up(d1, h0, n);
        ops->relu_bwd(st, n, y, g, 0.0f, t);
        if (beta)
            ops->axpy(st, n, 1.0f, t, d1);
        else
            ops->copy(st, d1, t, n * sizeof(float));
        down(want, d1, n);
        up(d1, h0, n);
        up(d2, h0, n);
        ops->add_relu_bwd(st, n, y, g, (float)beta, d1, 1.0f - (float)beta, d2);
        down(got, d1, n);
        CHECKF(memcmp(want, got, n * sizeof(float)) == 0, "dxa, beta %d", beta);
        /* the other gradient with the other beta */
        up(d1, h0, n);
        ops->relu_bwd(st, n, y, g, 0.0f, t);
        if (!beta)
            ops->axpy(st, n, 1.0f, t, d1);
        else
            ops->copy(st, d1, t, n * sizeof(float));
        down(want2, d1, n);
        down(got2, d2, n);
        CHECKF(memcmp(want2, got2, n * sizeof(float)) == 0, "dxb, beta %d", 1 - beta);
        /* one gradient only: the other buffer is not touched */
        up(d2, h0, n);
        ops->add_relu_bwd(st, n, y, g, 0.0f, NULL, 0.0f, d2);
        down(got2, d2, n);
        ops->relu_bwd(st, n, y, g, 0.0f, t);
        down(want2, t, n);
        CHECK(memcmp(want2, got2, n * sizeof(float)) == 0);
    }
    CHECK(got2[5] == 0.0f && got2[7] == 0.0f && got2[11] == 0.0f);
    float *dev[] = {a, b, y, r, g, d1, d2, t};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
        ops->free(be, dev[i]);
    float *host[] = {ha, hb, hg, h0, want, got, want2, got2};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
        free(host[i]);
}

/* ---- add, scale, axpy ------------------------------------------------------------------ */

static void test_blas1(void)
{
    printf("add / scale / axpy\n");
    const size_t n = 100003; /* crosses the parallel chunking with a ragged tail */
    float *ha = host_floats(n), *hb = host_floats(n), *hy = host_floats(n);
    double *want = host_doubles(n);
    fill_normal(ha, n, 0.0f, 1.0f);
    fill_normal(hb, n, 1.0f, 2.0f);
    float *a = dev_floats(n), *b = dev_floats(n), *y = dev_floats(n);
    up(a, ha, n);
    up(b, hb, n);
    /* one float rounding each: within 2^-23 relative (1.2e-7) of the exact value */
    ops->add(st, n, a, b, y);
    down(hy, y, n);
    for (size_t i = 0; i < n; i++)
        want[i] = ha[i] + hb[i];
    expect_close("add", hy, want, n, 0, 1.2e-7);
    ops->scale(st, n, -0.75f, y);
    down(hy, y, n);
    for (size_t i = 0; i < n; i++)
        want[i] = -0.75 * (float)(ha[i] + hb[i]);
    expect_close("scale", hy, want, n, 0, 1.2e-7);
    up(y, hb, n);
    ops->axpy(st, n, 0.5f, a, y);
    down(hy, y, n);
    for (size_t i = 0; i < n; i++)
        want[i] = hb[i] + 0.5 * ha[i];
    expect_close("axpy", hy, want, n, 1e-7, 1e-7);
    ops->free(be, a);
    ops->free(be, b);
    ops->free(be, y);
    free(ha);
    free(hb);
    free(hy);
    free(want);
}

/* ---- cross-entropy ------------------------------------------------------------------- */

static void xent_run(int n, int k, const float *logits, const int32_t *labels, float eps, float scale,
                     struct rt_loss_stats *out, float *host_dlogits)
{
    float *z = dev_floats((size_t)n * k), *dz = host_dlogits ? dev_floats((size_t)n * k) : NULL;
    int32_t *lab = dev_alloc((size_t)n * sizeof(int32_t));
    struct rt_loss_stats *s = dev_alloc(sizeof(*s));
    up(z, logits, (size_t)n * k);
    ops->upload(st, lab, labels, (size_t)n * sizeof(int32_t));
    ops->upload(st, s, out, sizeof(*s));
    if (dz)
        fill_nan(dz, (size_t)n * k); /* padding rows must be written as zeros */
    ops->xent_fwd_bwd(st, n, k, z, lab, eps, scale, NULL, s, dz);
    ops->download(st, out, s, sizeof(*s));
    if (dz)
        down(host_dlogits, dz, (size_t)n * k);
    ops->free(be, z);
    ops->free(be, dz);
    ops->free(be, lab);
    ops->free(be, s);
}

static void test_xent(void)
{
    printf("cross-entropy\n");
    /* hand-computable: K = 2, logits (0, ln 3) -> p = (1/4, 3/4); all-zero logits -> log K whatever eps */
    {
        const float z[3 * 2] = {0.0f, logf(3.0f), 0.0f, logf(3.0f), 0.0f, 0.0f};
        const int32_t lab[3] = {1, 1, 1};
        for (int e = 0; e < 2; e++) {
            const float eps = e ? 0.1f : 0.0f;
            const double ed = e ? 0.1 : 0.0;
            struct rt_loss_stats s = {1.0f, 2.0f, 3.0f}; /* added to, not overwritten */
            xent_run(3, 2, z, lab, eps, 1.0f, &s, NULL);
            /* -log p_1 = log 4/3; the smoothed part is the mean of log 4 and log 4/3 */
            const double l = (1 - ed) * log(4.0 / 3.0) + ed * (log(4.0) + log(4.0 / 3.0)) / 2;
            const double want = 1.0 + 2 * l + log(2.0);
            printf("  xent eps=%.1f loss_sum %.9g want %.9g\n", ed, (double)s.loss_sum, want);
            CHECKF(fabs(s.loss_sum - want) < 1e-6, "xent eps %g: loss_sum %.9g want %.9g", ed, (double)s.loss_sum,
                   want);
            /* row 2's tie (0, 0) goes to class 0 (first max): label 1 is wrong */
            CHECKF(s.correct == 4.0f, "xent: correct %g, want 2 + 2", (double)s.correct);
            CHECKF(s.count == 6.0f, "xent: count %g, want 3 + 3", (double)s.count);
        }
        const float tie[3] = {1.0f, 3.0f, 3.0f};
        const int32_t l1 = 1, l2 = 2;
        struct rt_loss_stats s = {0};
        xent_run(1, 3, tie, &l1, 0.0f, 1.0f, &s, NULL);
        CHECKF(s.correct == 1.0f, "xent: tie at classes 1 and 2, label 1: correct %g, want 1", (double)s.correct);
        s = (struct rt_loss_stats){0};
        xent_run(1, 3, tie, &l2, 0.0f, 1.0f, &s, NULL);
        CHECKF(s.correct == 0.0f, "xent: tie at classes 1 and 2, label 2: correct %g, want 0", (double)s.correct);
    }

    /* gradients against finite differences of loss_sum, with padding rows */
    enum { N = 6, K = 7 };
    const int32_t lab[N] = {3, -1, 0, 6, -5, 2};
    float z[N * K];
    fill_normal(z, N * K, 0.0f, 1.5f);
    for (int e = 0; e < 2; e++) {
        const float eps = e ? 0.1f : 0.0f, gs = 0.25f;
        float dz[N * K];
        struct rt_loss_stats s = {0};
        xent_run(N, K, z, lab, eps, gs, &s, dz);
        CHECKF(s.count == 4.0f, "xent: count %g with two padding rows, want 4", (double)s.count);

        /* loss in double from the definition, per valid row */
        double want_loss = 0.0, want_dz[N * K], fd[N * K];
        for (int r = 0; r < N; r++) {
            if (lab[r] < 0) {
                for (int j = 0; j < K; j++)
                    want_dz[r * K + j] = 0.0;
                continue;
            }
            double mx = z[r * K], se = 0.0;
            for (int j = 1; j < K; j++)
                mx = fmax(mx, z[r * K + j]);
            for (int j = 0; j < K; j++)
                se += exp(z[r * K + j] - mx);
            const double lse = mx + log(se);
            double mean_nll = 0.0;
            for (int j = 0; j < K; j++)
                mean_nll += (lse - z[r * K + j]) / K;
            want_loss += (1.0 - eps) * (lse - z[r * K + lab[r]]) + (double)eps * mean_nll;
            for (int j = 0; j < K; j++)
                want_dz[r * K + j] =
                    gs * (exp(z[r * K + j] - lse) - ((j == lab[r] ? 1.0 - eps : 0.0) + (double)eps / K));
        }
        printf("  xent eps=%.1f loss_sum %.9g want %.9g\n", (double)eps, (double)s.loss_sum, want_loss);
        CHECKF(fabs(s.loss_sum - want_loss) < 1e-5, "xent eps %g: loss_sum %.9g want %.9g", (double)eps,
               (double)s.loss_sum, want_loss);
        expect_close(e ? "xent dlogits eps=0.1 vs double" : "xent dlogits eps=0 vs double", dz, want_dz, N * K,
                     1e-7, 1e-6);

        const float h = 1e-2f;
        for (int i = 0; i < N * K; i++) {
            float zp[N * K];
            memcpy(zp, z, sizeof(zp));
            zp[i] = z[i] + h;
            struct rt_loss_stats sp = {0}, sm = {0};
            xent_run(N, K, zp, lab, eps, gs, &sp, NULL);
            zp[i] = z[i] - h;
            xent_run(N, K, zp, lab, eps, gs, &sm, NULL);
            fd[i] = gs * ((double)sp.loss_sum - sm.loss_sum) / ((double)(z[i] + h) - (double)(z[i] - h));
        }
        expect_close(e ? "xent dlogits eps=0.1 vs fd" : "xent dlogits eps=0 vs fd", dz, fd, N * K, 2e-4, 2e-3);
    }
}

/* ---- reductions ---------------------------------------------------------------------- */

static void test_reductions(void)
{
    printf("sumsq / count_nonfinite\n");
    const size_t n = 300007; /* several parallel chunks and a ragged tail */
    float *hx = host_floats(n);
    double want = 0.0;
    for (size_t i = 0; i < n; i++) {
        hx[i] = (float)((int)(i % 7) - 3) * 0.5f; /* squares are exact: the sum is exact in double */
        want += (double)hx[i] * hx[i];
    }
    float *x = dev_floats(n), *out = dev_floats(1), got;
    up(x, hx, n);
    ops->sumsq(st, n, x, out);
    down(&got, out, 1);
    CHECKF(got == (float)want, "sumsq: %.9g want %.9g", (double)got, want);
    ops->sumsq(st, 0, x, out);
    down(&got, out, 1);
    CHECKF(got == 0.0f, "sumsq of nothing: %g", (double)got);

    /* 4096^2 = 2^24 first, then ones: a float accumulator stops at 2^24 (2^24 + 1 rounds back down) */
    const size_t m = 200001;
    hx[0] = 4096.0f;
    for (size_t i = 1; i < m; i++)
        hx[i] = 1.0f;
    up(x, hx, m);
    ops->sumsq(st, m, x, out);
    down(&got, out, 1);
    CHECKF(got == 16777216.0f + 200000.0f, "sumsq: %.9g want 2^24 + 200000 = 16977216 (double accumulation)",
           (double)got);

    ops->count_nonfinite(st, n, x, out);
    down(&got, out, 1);
    CHECKF(got == 0.0f, "count_nonfinite of finite data: %g", (double)got);
    hx[0] = NAN;
    hx[16383] = INFINITY;
    hx[16384] = -INFINITY;
    hx[n - 1] = NAN;
    hx[5] = FLT_MAX;    /* finite */
    hx[6] = 1e-45f;     /* subnormal, finite */
    up(x, hx, n);
    ops->count_nonfinite(st, n, x, out);
    down(&got, out, 1);
    CHECKF(got == 4.0f, "count_nonfinite: %g, want 4", (double)got);
    ops->free(be, x);
    ops->free(be, out);
    free(hx);
}

/*
 * clip_scale: the factor worked out from the squared norm on the device, as torch.nn.utils.clip_grad_norm_
 * does in fp32 (max_norm / (norm + 1e-6) when norm > max_norm); nothing when the norm is at most max_norm or
 * not finite. download_async: the copy lands once the stream has passed it.
 */
static void test_clip_scale(void)
{
    printf("clip_scale / download_async\n");
    const size_t n = 70001;
    float *hx = host_floats(n), *hy = host_floats(n);
    for (size_t i = 0; i < n; i++)
        hx[i] = (float)((int)(i % 11) - 5) * 0.25f;
    float *x = dev_floats(n), *sq = dev_floats(1);
    const float cases[][2] = {{400.0f, 2.0f}, {400.0f, 20.0f}, {400.0f, 25.0f}, {INFINITY, 1.0f}, {NAN, 1.0f}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const float sumsq = cases[c][0], max_norm = cases[c][1];
        up(x, hx, n);
        up(sq, &sumsq, 1);
        ops->clip_scale(st, n, sq, max_norm, x);
        ops->download_async(st, hy, x, n * sizeof(float));
        ops->sync(st);
        const float norm = sqrtf(sumsq);
        const int clips = isfinite(norm) && norm > max_norm;
        const float f = max_norm / (norm + 1e-6f);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += memcmp(&hy[i], clips ? &(float){hx[i] * f} : &hx[i], sizeof(float)) != 0;
        CHECKF(bad == 0, "clip_scale sumsq %g max_norm %g: %zu of %zu values differ from %s", (double)sumsq,
               (double)max_norm, bad, n, clips ? "x * max_norm / (norm + 1e-6)" : "x unchanged");
    }
    ops->free(be, x);
    ops->free(be, sq);
    free(hx);
    free(hy);
}

/* ---- casts ------------------------------------------------------------------------------ */

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void cast_f32_f16(const float *hx, uint16_t *hy, size_t n)
{
    float *x = dev_floats(n);
    uint16_t *y = dev_alloc(n * 2);
    up(x, hx, n);
    ops->cast_f32_f16(st, n, x, y);
    ops->download(st, hy, y, n * 2);
    ops->free(be, x);
    ops->free(be, y);
}

static void cast_f16_f32(const uint16_t *hx, float *hy, size_t n)
{
    uint16_t *x = dev_alloc(n * 2);
    float *y = dev_floats(n);
    ops->upload(st, x, hx, n * 2);
    ops->cast_f16_f32(st, n, x, y);
    down(hy, y, n);
    ops->free(be, x);
    ops->free(be, y);
}

/* Value of a half bit pattern, decoded from the definition (for the reference rounding). */
static double half_value(uint16_t h)
{
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double v = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return (h & 0x8000) ? -v : v;
}

/* Nearest half to a finite float below 65520 in magnitude, ties to even: a search over the patterns. */
static uint16_t half_nearest(float f)
{
    const double a = fabs((double)f);
    unsigned lo = 0, hi = 0x7bff;
    while (lo < hi) { /* largest pattern with value <= a */
        const unsigned mid = (lo + hi + 1) / 2;
        if (half_value((uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    unsigned pick = lo;
    if (lo < 0x7bff || a > half_value(0x7bff)) {
        const double dl = a - half_value((uint16_t)lo), du = half_value((uint16_t)(lo + 1)) - a;
        if (du < dl || (du == dl && (lo & 1)))
            pick = lo + 1;
    }
    return (uint16_t)(pick | (signbit(f) ? 0x8000u : 0u));
}

static void test_casts(void)
{
    printf("casts\n");
    const struct {
        uint32_t f;
        uint16_t h;
    } kh[] = {
        {0x3f800000u, 0x3c00}, /* 1.0 */
        {0xc0200000u, 0xc100}, /* -2.5 */
        {0x477fe000u, 0x7bff}, /* 65504, the largest half */
        {0x477fefffu, 0x7bff}, /* just below 65520 */
        {0x477ff000u, 0x7c00}, /* 65520 rounds (tie, to even) to Inf */
        {0x7f7fffffu, 0x7c00}, /* FLT_MAX overflows */
        {0x7f800000u, 0x7c00}, /* Inf */
        {0xff800000u, 0xfc00}, /* -Inf */
        {0x33800000u, 0x0001}, /* 2^-24, the smallest subnormal */
        {0x33000000u, 0x0000}, /* 2^-25: tie between 0 and 2^-24, to even 0 */
        {0x33000001u, 0x0001}, /* just above the tie */
        {0x33c00000u, 0x0002}, /* 3 * 2^-25: tie between 1 and 2 units, to even 2 */
        {0x34200000u, 0x0002}, /* 5 * 2^-25: tie between 2 and 3 units, to even 2 */
        {0x34400000u, 0x0003}, /* 3 * 2^-24, exact */
        {0x387fc000u, 0x03ff}, /* the largest subnormal */
        {0x38800000u, 0x0400}, /* 2^-14, the smallest normal */
        {0x3f801000u, 0x3c00}, /* 1 + 2^-11: tie, to even 1.0 */
        {0x3f803000u, 0x3c02}, /* 1 + 3 * 2^-11: tie, to even */
        {0x3dcccccdu, 0x2e66}, /* 0.1 */
        {0x80000000u, 0x8000}, /* -0 */
    };
    const size_t nk = RT_ARRAY_LEN(kh);
    float fx[RT_ARRAY_LEN(kh) + 1];
    uint16_t got[RT_ARRAY_LEN(kh) + 1];
    for (size_t i = 0; i < nk; i++)
        fx[i] = bitsf(kh[i].f);
    fx[nk] = NAN;
    cast_f32_f16(fx, got, nk + 1);
    for (size_t i = 0; i < nk; i++)
        CHECKF(got[i] == kh[i].h, "cast_f32_f16(%a = 0x%08x) = 0x%04x, want 0x%04x", (double)fx[i], kh[i].f,
               got[i], kh[i].h);
    CHECKF((got[nk] & 0x7c00) == 0x7c00 && (got[nk] & 0x3ff), "cast_f32_f16(NaN) = 0x%04x, not a NaN", got[nk]);

    /* every half pattern decodes to its value and encodes back to itself */
    uint16_t *all = malloc(65536 * 2), *back = malloc(65536 * 2);
    float *vals = host_floats(65536);
    for (uint32_t i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    cast_f16_f32(all, vals, 65536);
    size_t bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        const int is_nan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff);
        const int ok = is_nan ? isnan(vals[i])
                              : (double)vals[i] == half_value((uint16_t)i) &&
                                    (signbit(vals[i]) != 0) == ((i & 0x8000) != 0);
        if (!ok && bad++ < 5)
            fprintf(stderr, "  cast_f16_f32(0x%04x) = %a, want %a\n", i, (double)vals[i], half_value((uint16_t)i));
    }
    CHECKF(bad == 0, "cast_f16_f32: %zu of 65536 patterns decode wrongly", bad);
    cast_f32_f16(vals, back, 65536);
    bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        const int is_nan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff);
        const int ok = is_nan ? ((back[i] & 0x7c00) == 0x7c00 && (back[i] & 0x3ff)) : back[i] == i;
        if (!ok && bad++ < 5)
            fprintf(stderr, "  f16 0x%04x -> f32 -> f16 0x%04x\n", i, back[i]);
    }
    CHECKF(bad == 0, "f16 -> f32 -> f16: %zu of 65536 patterns do not round-trip", bad);

    /* random floats over the whole half range against the nearest-half search */
    const size_t nr = 20000;
    float *rx = host_floats(nr);
    uint16_t *ry = malloc(nr * 2);
    for (size_t i = 0; i < nr; i++) {
        /* uniform exponent from 2^-27 to 2^16, random mantissa bits and sign */
        const uint32_t e = 100 + rt_rng_below(&rng, 43), mant = rt_rng_u32(&rng) & 0x7fffffu;
        rx[i] = bitsf((rt_rng_u32(&rng) & 0x80000000u) | e << 23 | mant);
        if (fabsf(rx[i]) >= 65520.0f)
            rx[i] = 65519.0f;
    }
    cast_f32_f16(rx, ry, nr);
    bad = 0;
    for (size_t i = 0; i < nr; i++) {
        const uint16_t want = half_nearest(rx[i]);
        if (ry[i] != want && bad++ < 5)
            fprintf(stderr, "  cast_f32_f16(%a) = 0x%04x, want 0x%04x\n", (double)rx[i], ry[i], want);
    }
    CHECKF(bad == 0, "cast_f32_f16: %zu of %zu random floats not rounded to the nearest half (ties even)", bad,
           nr);

    /* bf16 */
    const struct {
        uint32_t f;
        uint16_t b;
    } kb[] = {
        {0x3f800000u, 0x3f80}, /* 1.0 */
        {0xc0200000u, 0xc020}, /* -2.5 */
        {0x3f808000u, 0x3f80}, /* tie between 0x3f80 and 0x3f81: to even */
        {0x3f818000u, 0x3f82}, /* tie between 0x3f81 and 0x3f82: to even */
        {0x3f808001u, 0x3f81}, /* above the tie */
        {0x3f807fffu, 0x3f80}, /* below the tie */
        {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds to Inf */
        {0xff800000u, 0xff80}, /* -Inf */
        {0x00000001u, 0x0000}, /* the smallest float subnormal rounds to 0 */
        {0x00018000u, 0x0002}, /* subnormal tie, to even */
    };
    const size_t nb = RT_ARRAY_LEN(kb);
    float bx[RT_ARRAY_LEN(kb) + 2];
    uint16_t by[RT_ARRAY_LEN(kb) + 2];
    for (size_t i = 0; i < nb; i++)
        bx[i] = bitsf(kb[i].f);
    bx[nb] = NAN;
    bx[nb + 1] = bitsf(0x7f800001u); /* signalling NaN with a low payload: must not become Inf */
    float *x = dev_floats(nb + 2), *yf = dev_floats(nb + 2);
    uint16_t *y = dev_alloc((nb + 2) * 2);
    up(x, bx, nb + 2);
    ops->cast_f32_bf16(st, nb + 2, x, y);
    ops->download(st, by, y, (nb + 2) * 2);
    for (size_t i = 0; i < nb; i++)
        CHECKF(by[i] == kb[i].b, "cast_f32_bf16(0x%08x) = 0x%04x, want 0x%04x", kb[i].f, by[i], kb[i].b);
    for (size_t i = nb; i < nb + 2; i++)
        CHECKF((by[i] & 0x7f80) == 0x7f80 && (by[i] & 0x7f), "cast_f32_bf16(NaN 0x%08x) = 0x%04x, not a NaN",
               fbits(bx[i]), by[i]);
    ops->cast_bf16_f32(st, nb + 2, y, yf);
    float bf[RT_ARRAY_LEN(kb) + 2];
    down(bf, yf, nb + 2);
    for (size_t i = 0; i < nb; i++)
        CHECKF(fbits(bf[i]) == (uint32_t)kb[i].b << 16, "cast_bf16_f32(0x%04x) = 0x%08x", kb[i].b, fbits(bf[i]));
    CHECK(isnan(bf[nb]) && isnan(bf[nb + 1]));

    ops->free(be, x);
    ops->free(be, yf);
    ops->free(be, y);
    free(all);
    free(back);
    free(vals);
    free(rx);
    free(ry);
}

/* ---- optimizers --------------------------------------------------------------------- */

struct sgd_case {
    const char *name;
    double lr, momentum, dampening, wd;
    int nesterov;
};

static void test_sgd(void)
{
    printf("sgd (3 steps against torch.optim.SGD's formulas in double)\n");
    const struct sgd_case cases[] = {
        {"sgd momentum", 0.1, 0.9, 0.0, 0.0, 0},
        {"sgd momentum+dampening+wd", 0.1, 0.9, 0.1, 5e-4, 0},
        {"sgd nesterov+wd", 0.05, 0.9, 0.0, 1e-4, 1},
        {"sgd no momentum+wd", 0.1, 0.0, 0.0, 1e-2, 0},
    };
    const size_t n = 40000; /* parallel: above the single-thread cut-off */
    float *hp = host_floats(n), *hg = host_floats(n), *out = host_floats(n);
    double *rp = host_doubles(n), *rb = host_doubles(n);
    float *p = dev_floats(n), *g = dev_floats(n), *buf = dev_floats(n);
    for (size_t c = 0; c < RT_ARRAY_LEN(cases); c++) {
        const struct sgd_case *k = &cases[c];
        fill_normal(hp, n, 0.0f, 1.0f);
        for (size_t i = 0; i < n; i++)
            rp[i] = hp[i];
        up(p, hp, n);
        fill_nan(buf, n); /* the first step must not read the buffer */
        for (int step = 1; step <= 3; step++) {
            fill_normal(hg, n, 0.0f, 1.0f);
            up(g, hg, n);
            ops->sgd_update(st, n, p, g, k->momentum != 0.0 ? buf : NULL, (float)k->lr, (float)k->momentum,
                            (float)k->dampening, (float)k->wd, k->nesterov, step == 1, NULL);
            for (size_t i = 0; i < n; i++) {
                double gi = hg[i] + k->wd * rp[i];
                if (k->momentum != 0.0) {
                    rb[i] = step == 1 ? gi : k->momentum * rb[i] + (1.0 - k->dampening) * gi;
                    gi = k->nesterov ? gi + k->momentum * rb[i] : rb[i];
                }
                rp[i] -= k->lr * gi;
            }
        }
        char name[96];
        snprintf(name, sizeof(name), "%s: param", k->name);
        down(out, p, n);
        expect_close(name, out, rp, n, 1e-6, 1e-6);
        if (k->momentum != 0.0) {
            snprintf(name, sizeof(name), "%s: momentum_buffer", k->name);
            down(out, buf, n);
            expect_close(name, out, rb, n, 1e-6, 1e-6);
        }
    }
    ops->free(be, p);
    ops->free(be, g);
    ops->free(be, buf);
    free(hp);
    free(hg);
    free(out);
    free(rp);
    free(rb);
}

struct adam_case {
    const char *name;
    double lr, b1, b2, eps, wd;
    int decoupled;
};

static void test_adam(void)
{
    printf("adam / adamw (3 steps against torch.optim's formulas in double)\n");
    const struct adam_case cases[] = {
        {"adam", 1e-3, 0.9, 0.999, 1e-8, 0.0, 0},
        {"adam wd", 1e-3, 0.9, 0.999, 1e-8, 1e-2, 0},
        {"adamw wd", 1e-3, 0.9, 0.999, 1e-8, 1e-2, 1},
        {"adamw beta1 0.3 beta2 0.99", 2e-2, 0.3, 0.99, 1e-6, 0.1, 1},
    };
    const size_t n = 40000;
    float *hp = host_floats(n), *hg = host_floats(n), *out = host_floats(n);
    double *rp = host_doubles(n), *rm = host_doubles(n), *rv = host_doubles(n);
    float *p = dev_floats(n), *g = dev_floats(n), *m = dev_floats(n), *v = dev_floats(n);
    for (size_t c = 0; c < RT_ARRAY_LEN(cases); c++) {
        const struct adam_case *k = &cases[c];
        fill_normal(hp, n, 0.0f, 1.0f);
        for (size_t i = 0; i < n; i++) {
            rp[i] = hp[i];
            rm[i] = rv[i] = 0.0;
        }
        up(p, hp, n);
        ops->zero(st, m, n * sizeof(float));
        ops->zero(st, v, n * sizeof(float));
        for (int step = 1; step <= 3; step++) {
            fill_normal(hg, n, 0.0f, 1.0f);
            /* a tenth of the gradients near eps, where a missing or misplaced eps shows */
            for (size_t i = 0; i < n; i += 10)
                hg[i] *= (float)(k->eps * 3.0);
            up(g, hg, n);
            ops->adam_update(st, n, p, g, m, v, (float)k->lr, (float)k->b1, (float)k->b2, (float)k->eps,
                             (float)k->wd, k->decoupled, step, NULL);
            const double bc1 = 1.0 - pow(k->b1, step), bc2 = 1.0 - pow(k->b2, step);
            for (size_t i = 0; i < n; i++) {
                double gi = hg[i];
                if (k->decoupled)
                    rp[i] *= 1.0 - k->lr * k->wd;
                else
                    gi += k->wd * rp[i];
                rm[i] = k->b1 * rm[i] + (1.0 - k->b1) * gi;
                rv[i] = k->b2 * rv[i] + (1.0 - k->b2) * gi * gi;
                rp[i] -= k->lr / bc1 * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + k->eps);
            }
        }
        char name[96];
        snprintf(name, sizeof(name), "%s: param", k->name);
        down(out, p, n);
        expect_close(name, out, rp, n, 1e-7, 1e-6);
        snprintf(name, sizeof(name), "%s: exp_avg", k->name);
        down(out, m, n);
        /* m is a difference of O(1) gradients: its error is absolute, on the gradients' scale */
        expect_close(name, out, rm, n, 2e-7, 1e-6);
        snprintf(name, sizeof(name), "%s: exp_avg_sq", k->name);
        down(out, v, n);
        expect_close(name, out, rv, n, 1e-20, 2e-6);
    }
    ops->free(be, p);
    ops->free(be, g);
    ops->free(be, m);
    ops->free(be, v);
    free(hp);
    free(hg);
    free(out);
    free(rp);
    free(rm);
    free(rv);
}

int main(void)
{
    printf("test_ops_elem: seed %llu, 2 threads\n", (unsigned long long)SEED);
    rt_rng_init(&rng, SEED, 0);
    int rc = rt_backend_create(&(struct rt_backend_opts){.kind = RT_BACKEND_CPU, .threads = 2}, &be);
    if (rc < 0) {
        fprintf(stderr, "cpu backend: %s\n", rt_errmsg());
        return 1;
    }
    ops = rt_backend_ops(be);
    st = rt_backend_stream(be);

    test_input_u8();
    test_bn_forward();
    test_bn_backward();
    test_bn_threads();
    test_bn_relu();
    test_relu();
    test_gelu();
    test_dropout();
    test_dropout_index();
    test_dropout_logical();
    test_dropout_streams();
    test_blas1();
    test_add_relu();
    test_xent();
    test_reductions();
    test_clip_scale();
    test_casts();
    test_sgd();
    test_adam();

    rt_backend_destroy(be);
    return check_result();
}
