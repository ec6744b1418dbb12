/*
 * optable_check.c - the op-table comparison engine (optable_check.h): buffers
 * on both sides, the tolerance model, the report, each op family's calls on
 * both tables, and the planted faults. Test code: it exits on allocation
 * failure and keeps no state beyond the context, except the planted table's
 * base (one at a time).
 */
#include "optable_check.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#define U32 (1.0 / 16777216.0) /* 2^-24: fp32's unit roundoff */

static const char *const family_names[OC_F_COUNT] = {
    [OC_F_LAYOUT] = "layout: from_nchw, to_nchw",
    [OC_F_INPUT] = "input_u8, input_u8_dev",
    [OC_F_CONV] = "conv2d_fwd, conv2d_bwd_data, conv2d_bwd_filter",
    [OC_F_BN] = "bn_train_fwd, bn_infer_fwd, bn_bwd, bn_infer_bwd (and with a fused ReLU)",
    [OC_F_POOL] = "maxpool_fwd, maxpool_bwd, avgpool_fwd, avgpool_bwd",
    [OC_F_FEAT] = "gap_fwd, gap_bwd, flatten_fwd, flatten_bwd",
    [OC_F_LINEAR] = "linear_fwd, linear_bwd_data, linear_bwd_filter",
    [OC_F_ELEM] = "relu_fwd, relu_bwd, gelu_fwd, gelu_bwd, add, add_relu_fwd, add_relu_bwd, scale, axpy",
    [OC_F_DROPOUT] = "dropout_fwd, dropout_bwd",
    [OC_F_XENT] = "xent_fwd_bwd",
    [OC_F_REDUCE] = "sumsq, count_nonfinite",
};

/* ---- bf16 on the host ---------------------------------------------------------------------------------- */

uint16_t oc_bf16(float f)
{
    const uint32_t u = oc_fbits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    if ((u & 0x7f800000u) == 0)
        return (uint16_t)((u >> 16) & 0x8000u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static int is16(const struct oc_ctx *ctx)
{
    return ctx->side[OC_DEV].ops->act != RT_F32;
}

float oc_round(const struct oc_ctx *ctx, float v)
{
    return is16(ctx) ? oc_bf16_f32(oc_bf16(v)) : v;
}

static const char *shape_str(struct rt_shape4 sh)
{
    static char b[4][48];
    static int k;
    k = (k + 1) % 4;
    snprintf(b[k], sizeof(b[k]), "(%d,%d,%d,%d)", sh.n, sh.c, sh.h, sh.w);
    return b[k];
}

/* ---- buffers --------------------------------------------------------------------------------------------- */

/* Bytes per element of kind on side s. */
static size_t elem_size(const struct oc_ctx *ctx, enum oc_kind kind, int s)
{
    return kind != OC_PARAM && s == OC_DEV && is16(ctx) ? 2 : 4;
}

struct oc_buf oc_new(struct oc_ctx *ctx, enum oc_kind kind, size_t n, struct rt_shape4 sh)
{
    struct oc_buf b = {.n = kind == OC_SPATIAL ? oc_count4(sh) : n, .sh = sh, .kind = kind};
    for (int s = 0; s < 2; s++) {
        const struct oc_side *d = &ctx->side[s];
        b.p[s] = d->ops->alloc(d->be, b.n ? b.n * elem_size(ctx, kind, s) : 4);
        if (!b.p[s]) {
            fprintf(stderr, "optable_check: %s alloc of %zu values: %s\n", d->name, b.n, rt_errmsg());
            exit(1);
        }
    }
    return b;
}

void oc_free(struct oc_ctx *ctx, struct oc_buf *b)
{
    for (int s = 0; s < 2; s++) {
        ctx->side[s].ops->free(ctx->side[s].be, b->p[s]);
        b->p[s] = NULL;
    }
}

static void put_side(struct oc_ctx *ctx, struct oc_buf *b, int s, const float *host)
{
    const struct oc_side *d = &ctx->side[s];
    if (b->kind == OC_SPATIAL) {
        d->ops->from_nchw(d->st, b->sh, host, b->p[s]);
    } else if (elem_size(ctx, b->kind, s) == 2) {
        uint16_t *h = tu_xmalloc(b->n * sizeof(uint16_t) + 1);
        for (size_t i = 0; i < b->n; i++)
            h[i] = oc_bf16(host[i]);
        d->ops->upload(d->st, b->p[s], h, b->n * sizeof(uint16_t));
        d->ops->sync(d->st);
        free(h);
    } else {
        d->ops->upload(d->st, b->p[s], host, b->n * sizeof(float));
    }
    d->ops->sync(d->st);
}

void oc_put(struct oc_ctx *ctx, struct oc_buf *b, const float *host)
{
    float *r = tu_hfloats(b->n + 1);
    for (size_t i = 0; i < b->n; i++)
        r[i] = oc_round(ctx, host[i]);
    for (int s = 0; s < 2; s++)
        put_side(ctx, b, s, r);
    free(r);
}

void oc_fill(struct oc_ctx *ctx, struct oc_buf *b, float v)
{
    float *h = tu_hfloats(b->n + 1);
    for (size_t i = 0; i < b->n; i++)
        h[i] = v;
    oc_put(ctx, b, h);
    free(h);
}

static void get_side(struct oc_ctx *ctx, const struct oc_buf *b, int s, float *host)
{
    const struct oc_side *d = &ctx->side[s];
    if (b->kind == OC_SPATIAL) {
        d->ops->to_nchw(d->st, b->sh, b->p[s], host);
    } else if (elem_size(ctx, b->kind, s) == 2) {
        uint16_t *h = tu_xmalloc(b->n * sizeof(uint16_t) + 1);
        d->ops->download(d->st, h, b->p[s], b->n * sizeof(uint16_t));
        d->ops->sync(d->st);
        for (size_t i = 0; i < b->n; i++)
            host[i] = oc_bf16_f32(h[i]);
        free(h);
    } else {
        d->ops->download(d->st, host, b->p[s], b->n * sizeof(float));
    }
    d->ops->sync(d->st);
}

void oc_get(struct oc_ctx *ctx, const struct oc_buf *b, float *ref, float *dev)
{
    get_side(ctx, b, OC_REF, ref);
    get_side(ctx, b, OC_DEV, dev);
}

float *oc_random(struct oc_ctx *ctx, size_t n, float lo, float hi)
{
    float *p = tu_hfloats(n + 1);
    for (size_t i = 0; i < n; i++)
        p[i] = oc_round(ctx, lo + (hi - lo) * rt_rng_uniform(&ctx->rng));
    return p;
}

float *oc_random_normal(struct oc_ctx *ctx, size_t n, float mean, float sd)
{
    float *p = tu_hfloats(n + 1);
    for (size_t i = 0; i < n; i++)
        p[i] = oc_round(ctx, mean + sd * rt_rng_normal(&ctx->rng));
    return p;
}

/* ---- comparison -------------------------------------------------------------------------------------------- */

static void note_failure(struct oc_ctx *ctx, const char *op)
{
    ctx->failures++;
    const size_t len = strcspn(op, " ");
    char word[64];
    snprintf(word, sizeof(word), " %.*s ", (int)RT_MIN(len, sizeof(word) - 3), op);
    if (!strstr(ctx->failed, word) && strlen(ctx->failed) + strlen(word) < sizeof(ctx->failed))
        strcat(ctx->failed, word + (ctx->failed[0] ? 1 : 0)); /* " a b ": each name between spaces */
}

/* 1 if a check of op `op` (its name as printed, up to the first space) has failed in ctx. */
static int op_failed(const struct oc_ctx *ctx, const char *op)
{
    char word[64];
    snprintf(word, sizeof(word), " %s ", op);
    return strstr(ctx->failed, word) != NULL;
}

int oc_verdict(struct oc_ctx *ctx, int ok, const char *op, const char *shape, const char *detail)
{
    ctx->checks++;
    if (!ok || !ctx->quiet)
        printf("  %-36s %-44s %s  %s\n", op, shape, detail, ok ? "ok" : "FAIL");
    if (!ok)
        note_failure(ctx, op);
    return ok ? 0 : -1;
}

/* fp32: the values are fp32 in every table (parameters, statistics), so exact means the same bits. */
static int compare_core(struct oc_ctx *ctx, const struct oc_tol *t, const char *op, const char *shape, const float *ref,
                        const float *dev, size_t n, const double *extra, int fp32)
{
    if (!t->name)
        return 0;
    const int exact = (t->flags & OC_EXACT) != 0, h = is16(ctx) || fp32;
    double mx = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ref[i]))
            mx = fmax(mx, fabs((double)ref[i]));
    size_t bad = 0, not_bitequal = 0;
    double worst_ratio = -1.0, worst_err = 0.0, worst_tol = 0.0;
    for (size_t i = 0; i < n; i++) {
        const float want = exact && !fp32 ? oc_round(ctx, ref[i]) : ref[i];
        const double r = want, g = dev[i];
        double err = 0.0, tol = 0.0;
        int ok;
        if (exact || !isfinite(r) || !isfinite(g)) {
            ok = (isnan(r) && isnan(g)) || (h && exact ? oc_fbits(want) == oc_fbits(dev[i]) : r == g);
            err = ok ? 0.0 : isfinite(r - g) ? fabs(r - g) : INFINITY;
        } else {
            err = fabs(g - r);
            tol = t->atol + t->rtol * fabs(r) + t->rmax * mx + (extra ? extra[i] : 0.0);
            ok = err <= tol;
        }
        not_bitequal += oc_fbits(ref[i]) != oc_fbits(dev[i]);
        if (!ok && bad++ < 5)
            fprintf(stderr, "    %s %s [%zu]: %s %.9g, %s %.9g (err %.3g > tol %.3g)\n", op, shape, i,
                    ctx->side[OC_DEV].name, g, ctx->side[OC_REF].name, r, err, tol);
        const double ratio = tol > 0.0 ? err / tol : err > 0.0 ? INFINITY : 0.0;
        if (ratio > worst_ratio || (ratio == worst_ratio && err > worst_err)) {
            worst_ratio = ratio;
            worst_err = err;
            worst_tol = tol;
        }
    }
    char detail[160];
    if (exact)
        snprintf(detail, sizeof(detail), "err %-9.3g (%s) n=%zu, %zu not bit-equal", worst_err, t->name, n,
                 not_bitequal);
    else
        snprintf(detail, sizeof(detail), "err %-9.3g tol %-9.3g (%s) n=%zu, %zu not bit-equal", worst_err,
                 worst_tol, t->name, n, not_bitequal);
    return oc_verdict(ctx, bad == 0, op, shape, detail);
}

int oc_compare(struct oc_ctx *ctx, enum oc_check check, const char *op, const char *shape, const float *ref,
               const float *dev, size_t n, const double *extra)
{
    return compare_core(ctx, &ctx->tab_tol[check], op, shape, ref, dev, n, extra, 0);
}

static int compare_fp32(struct oc_ctx *ctx, enum oc_check check, const char *op, const char *shape, const float *ref,
                        const float *dev, size_t n)
{
    return compare_core(ctx, &ctx->tab_tol[check], op, shape, ref, dev, n, NULL, 1);
}

static int compare_buf(struct oc_ctx *ctx, const struct oc_tol *t, const char *op, const char *shape,
                       const struct oc_buf *b, const double *extra)
{
    float *r = tu_hfloats(b->n + 1), *g = tu_hfloats(b->n + 1);
    oc_get(ctx, b, r, g);
    const int rc = compare_core(ctx, t, op, shape, r, g, b->n, extra, b->kind == OC_PARAM);
    free(r);
    free(g);
    return rc;
}

int oc_compare_buf(struct oc_ctx *ctx, enum oc_check check, const char *op, const char *shape, const struct oc_buf *b,
                   const double *extra)
{
    return compare_buf(ctx, &ctx->tab_tol[check], op, shape, b, extra);
}

int oc_compare_tol(struct oc_ctx *ctx, const struct oc_tol *t, const char *op, const char *shape,
                   const struct oc_buf *b)
{
    return compare_buf(ctx, t, op, shape, b, NULL);
}

/* Per-element extra tolerance (terms + kterms (K + 1)) S[i] of check, or NULL where the table has none. */
static double *terms_extra(const struct oc_ctx *ctx, enum oc_check check, const float *S, size_t n, double k)
{
    const struct oc_tol *t = &ctx->tab_tol[check];
    const double c = t->terms + t->kterms * (k + 1.0);
    if (c == 0.0)
        return NULL;
    double *e = tu_xmalloc((n + 1) * sizeof(double));
    for (size_t i = 0; i < n; i++)
        e[i] = c * fabs((double)S[i]) * (1.0 + 1e-6); /* S itself summed in fp32 */
    return e;
}

static int wants_terms(const struct oc_ctx *ctx, enum oc_check check)
{
    return ctx->tab_tol[check].terms != 0.0 || ctx->tab_tol[check].kterms != 0.0;
}

static float *absolute(const float *x, size_t n)
{
    float *a = tu_hfloats(n + 1);
    for (size_t i = 0; i < n; i++)
        a[i] = fabsf(x[i]);
    return a;
}

/* A beta-0 output's old contents: NaN (which the op must not read). */
static void fill_nan(struct oc_ctx *ctx, struct oc_buf *b)
{
    oc_fill(ctx, b, NAN);
}

/* An output's old contents before an op with this beta: old (beta 1) or NaN. */
static void put_old(struct oc_ctx *ctx, struct oc_buf *b, int beta, const float *old)
{
    if (beta)
        oc_put(ctx, b, old);
    else
        fill_nan(ctx, b);
}

#define BOTH for (int s = 0; s < 2; s++)
#define OPS(s) ctx->side[s].ops
#define ST(s) ctx->side[s].st
#define F(b, s) ((float *)(b).p[s])

/* ---- layout and input ---------------------------------------------------------------------------------------- */

static void run_layout(struct oc_ctx *ctx, const struct oc_case *c)
{
    const size_t n = oc_count4(c->sh);
    float *x = tu_hfloats(n), *back = tu_hfloats(n);
    for (size_t i = 0; i < n; i++)
        x[i] = c->lo + (c->hi - c->lo) * rt_rng_uniform(&ctx->rng); /* not rounded: from_nchw rounds */
    struct oc_buf b = oc_new(ctx, OC_SPATIAL, 0, c->sh);
    BOTH {
        put_side(ctx, &b, s, x);
        get_side(ctx, &b, s, back);
        char op[64];
        snprintf(op, sizeof(op), "to_nchw(from_nchw(x)) %s", ctx->side[s].name);
        /* the reference side's own round trip is exact in fp32 */
        const float *want = x;
        if (s == OC_REF) {
            oc_verdict(ctx, !memcmp(x, back, n * sizeof(float)), op, shape_str(c->sh), "exact");
            continue;
        }
        oc_compare(ctx, OC_LAYOUT, op, shape_str(c->sh), want, back, n, NULL);
    }
    oc_free(ctx, &b);
    free(x);
    free(back);
}

static void run_input(struct oc_ctx *ctx, const struct oc_case *c)
{
    const struct rt_shape4 sh = c->sh;
    const size_t n = oc_count4(sh);
    uint8_t *img = tu_xmalloc(n);
    for (size_t i = 0; i < n; i++)
        img[i] = (uint8_t)rt_rng_below(&ctx->rng, 256);
    img[0] = 0;
    img[n - 1] = 255;
    float mean[16], sd[16];
    for (int k = 0; k < sh.c && k < 16; k++) {
        mean[k] = 0.3f + 0.02f * (float)k;
        sd[k] = 0.2f + 0.01f * (float)k;
    }
    struct oc_buf y = oc_new(ctx, OC_SPATIAL, 0, sh);
    void *dimg[2];
    BOTH {
        dimg[s] = OPS(s)->alloc(ctx->side[s].be, n);
        OPS(s)->upload(ST(s), dimg[s], img, n);
    }
    for (int v = 0; v < 2; v++) {
        fill_nan(ctx, &y);
        BOTH (v ? OPS(s)->input_u8_dev : OPS(s)->input_u8)(ST(s), sh, v ? dimg[s] : img, mean, sd, F(y, s));
        oc_compare_buf(ctx, OC_INPUT, v ? "input_u8_dev" : "input_u8", shape_str(sh), &y, NULL);
    }
    BOTH OPS(s)->free(ctx->side[s].be, dimg[s]);
    oc_free(ctx, &y);
    free(img);
}

/* ---- convolution and linear ------------------------------------------------------------------------------------ */

/*
 * The three products of a convolution or a linear layer, on both tables, then
 * (for tables whose tolerance counts terms) on the reference again over the
 * |inputs|, which gives each element's sum of |terms|. dims: conv desc or
 * linear (n, in, out).
 */
struct gemm {
    const struct rt_conv_desc *conv;
    int n, in, out; /* linear */
};

static void gemm_fwd(struct oc_ctx *ctx, const struct gemm *g, int s, const void *x, const void *w, const void *b,
                     void *y)
{
    if (g->conv)
        OPS(s)->conv2d_fwd(ST(s), g->conv, x, w, b, y);
    else
        OPS(s)->linear_fwd(ST(s), g->n, g->in, g->out, x, w, b, y);
}

static void gemm_bwd_data(struct oc_ctx *ctx, const struct gemm *g, int s, const void *dy, const void *w, float beta,
                          void *dx)
{
    if (g->conv)
        OPS(s)->conv2d_bwd_data(ST(s), g->conv, dy, w, beta, dx);
    else
        OPS(s)->linear_bwd_data(ST(s), g->n, g->in, g->out, dy, w, beta, dx);
}

static void gemm_bwd_filter(struct oc_ctx *ctx, const struct gemm *g, int s, const void *x, const void *dy, void *dw,
                            void *db)
{
    if (g->conv)
        OPS(s)->conv2d_bwd_filter(ST(s), g->conv, x, dy, dw, db);
    else
        OPS(s)->linear_bwd_filter(ST(s), g->n, g->in, g->out, x, dy, dw, db);
}

/* Each element's sum of |terms| of one product: the reference table's op on |inputs| (the buffers' ref sides). */
static float *gemm_terms(struct oc_ctx *ctx, const struct gemm *g, int which, struct oc_buf *in1, const float *h1,
                         struct oc_buf *in2, const float *h2, struct oc_buf *in3, const float *h3, struct oc_buf *out,
                         const float *hout)
{
    struct oc_buf *bufs[] = {in1, in2, in3, out};
    const float *hosts[] = {h1, h2, h3, hout};
    for (int i = 0; i < 4; i++)
        if (bufs[i] && hosts[i]) {
            float *a = absolute(hosts[i], bufs[i]->n);
            put_side(ctx, bufs[i], OC_REF, a);
            free(a);
        }
    void *o = F(*out, OC_REF);
    if (which == 0)
        gemm_fwd(ctx, g, OC_REF, F(*in1, OC_REF), F(*in2, OC_REF), in3 ? F(*in3, OC_REF) : NULL, o);
    else if (which == 1)
        gemm_bwd_data(ctx, g, OC_REF, F(*in1, OC_REF), F(*in2, OC_REF), hout ? 1.0f : 0.0f, o);
    else
        gemm_bwd_filter(ctx, g, OC_REF, F(*in1, OC_REF), F(*in2, OC_REF), o, NULL);
    float *S = tu_hfloats(out->n + 1);
    get_side(ctx, out, OC_REF, S);
    return S;
}

/* Restores a buffer's sides from host values after gemm_terms took its reference side. */
static void restore(struct oc_ctx *ctx, struct oc_buf *b, const float *host)
{
    put_side(ctx, b, OC_REF, host);
}

static void run_gemm(struct oc_ctx *ctx, const char *name, const struct gemm *g, const char *shape, int bias,
                     enum oc_kind xk, struct rt_shape4 xs, size_t nx, struct rt_shape4 ys, size_t ny, size_t nw,
                     size_t nb, double kf, double kd, double kw)
{
    const enum oc_check c_fwd = g->conv ? OC_CONV_FWD : OC_LINEAR_FWD;
    const enum oc_check c_data = g->conv ? OC_CONV_BWD_DATA : OC_LINEAR_BWD_DATA;
    const enum oc_check c_add = g->conv ? OC_CONV_BWD_DATA_ADD : OC_LINEAR_BWD_DATA;
    const enum oc_check c_filter = g->conv ? OC_CONV_BWD_FILTER : OC_LINEAR_BWD_FILTER;
    const float bound = sqrtf(3.0f / (float)kf); /* unit-variance outputs */
    float *hx = oc_random(ctx, nx, -1, 1), *hw = oc_random(ctx, nw, -bound, bound), *hb = oc_random(ctx, nb, -1, 1);
    float *hdy = oc_random(ctx, ny, -1, 1);
    struct oc_buf x = oc_new(ctx, xk, nx, xs), w = oc_new(ctx, OC_PARAM, nw, xs), b = oc_new(ctx, OC_PARAM, nb, xs),
                  y = oc_new(ctx, xk, ny, ys), dy = oc_new(ctx, xk, ny, ys), dx = oc_new(ctx, xk, nx, xs),
                  dw = oc_new(ctx, OC_PARAM, nw, xs), db = oc_new(ctx, OC_PARAM, nb, xs);
    oc_put(ctx, &x, hx);
    oc_put(ctx, &w, hw);
    oc_put(ctx, &b, hb);
    oc_put(ctx, &dy, hdy);
    char op[64];
    double *e;
    float *S;

    fill_nan(ctx, &y);
    BOTH gemm_fwd(ctx, g, s, F(x, s), F(w, s), bias ? F(b, s) : NULL, F(y, s));
    S = NULL;
    if (wants_terms(ctx, c_fwd)) {
        S = gemm_terms(ctx, g, 0, &x, hx, &w, hw, bias ? &b : NULL, bias ? hb : NULL, &y, NULL);
        restore(ctx, &x, hx);
        restore(ctx, &w, hw);
        restore(ctx, &b, hb);
        /* y's reference side now holds S: run the reference again */
        gemm_fwd(ctx, g, OC_REF, F(x, OC_REF), F(w, OC_REF), bias ? F(b, OC_REF) : NULL, F(y, OC_REF));
    }
    e = S ? terms_extra(ctx, c_fwd, S, ny, kf) : NULL;
    snprintf(op, sizeof(op), "%s_fwd", name);
    oc_compare_buf(ctx, c_fwd, op, shape, &y, e);
    free(e);
    free(S);

    float *old = oc_random(ctx, RT_MAX(nx, nw), -1, 1);
    for (int beta = 0; beta < 2; beta++) {
        const enum oc_check c = beta ? c_add : c_data;
        put_old(ctx, &dx, beta, old);
        BOTH gemm_bwd_data(ctx, g, s, F(dy, s), F(w, s), (float)beta, F(dx, s));
        S = NULL;
        if (wants_terms(ctx, c)) {
            float *r = tu_hfloats(nx + 1);
            get_side(ctx, &dx, OC_REF, r);
            S = gemm_terms(ctx, g, 1, &dy, hdy, &w, hw, NULL, NULL, &dx, beta ? old : NULL);
            restore(ctx, &dy, hdy);
            restore(ctx, &w, hw);
            put_side(ctx, &dx, OC_REF, r);
            free(r);
        }
        e = S ? terms_extra(ctx, c, S, nx, kd) : NULL;
        snprintf(op, sizeof(op), "%s_bwd_data beta=%d", name, beta);
        oc_compare_buf(ctx, c, op, shape, &dx, e);
        free(e);
        free(S);
    }

    /* parameter gradients are added to: start from non-zero values */
    float *hdw0 = oc_random(ctx, nw, -1, 1), *hdb0 = oc_random(ctx, nb, -1, 1);
    oc_put(ctx, &dw, hdw0);
    oc_put(ctx, &db, hdb0);
    BOTH gemm_bwd_filter(ctx, g, s, F(x, s), F(dy, s), F(dw, s), bias ? F(db, s) : NULL);
    float *Sw = NULL, *Sb = NULL;
    if (wants_terms(ctx, c_filter)) {
        float *rw = tu_hfloats(nw + 1), *rb = tu_hfloats(nb + 1);
        get_side(ctx, &dw, OC_REF, rw);
        get_side(ctx, &db, OC_REF, rb);
        Sw = gemm_terms(ctx, g, 2, &x, hx, &dy, hdy, NULL, NULL, &dw, hdw0);
        /* the bias's terms: sum over samples of |dy|, plus |db0| */
        Sb = absolute(hdb0, nb);
        const size_t per = ny / nb / (size_t)(g->conv ? g->conv->in.n : g->n);
        for (size_t i = 0; i < ny; i++)
            Sb[g->conv ? i / per % nb : i % nb] += fabsf(hdy[i]);
        put_side(ctx, &dw, OC_REF, rw);
        restore(ctx, &x, hx);
        restore(ctx, &dy, hdy);
        free(rw);
        free(rb);
    }
    e = Sw ? terms_extra(ctx, c_filter, Sw, nw, kw) : NULL;
    snprintf(op, sizeof(op), "%s_bwd_filter dw (+=)", name);
    oc_compare_buf(ctx, c_filter, op, shape, &dw, e);
    free(e);
    if (bias) {
        e = Sb ? terms_extra(ctx, c_filter, Sb, nb, kw) : NULL;
        snprintf(op, sizeof(op), "%s_bwd_filter db (+=)", name);
        oc_compare_buf(ctx, c_filter, op, shape, &db, e);
        free(e);
    }
    free(Sw);
    free(Sb);
    struct oc_buf *all[] = {&x, &w, &b, &y, &dy, &dx, &dw, &db};
    for (size_t i = 0; i < RT_ARRAY_LEN(all); i++)
        oc_free(ctx, all[i]);
    float *hs[] = {hx, hw, hb, hdy, old, hdw0, hdb0};
    for (size_t i = 0; i < RT_ARRAY_LEN(hs); i++)
        free(hs[i]);
}

static void run_conv(struct oc_ctx *ctx, const struct oc_case *c)
{
    struct rt_conv_desc d = {.in = c->sh, .cout = c->a, .kh = c->b, .kw = c->b, .stride = c->c, .pad = c->d};
    if (rt_conv_desc_init(&d) < 0) {
        oc_verdict(ctx, 0, "rt_conv_desc_init", shape_str(c->sh), rt_errmsg());
        return;
    }
    const struct rt_shape4 ys = {c->sh.n, c->a, d.oh, d.ow};
    char shape[96];
    snprintf(shape, sizeof(shape), "%s k%d s%d p%d%s -> %s", shape_str(c->sh), c->b, c->c, c->d, c->e ? " +b" : "",
             shape_str(ys));
    const struct gemm g = {.conv = &d};
    run_gemm(ctx, "conv2d", &g, shape, c->e, OC_SPATIAL, c->sh, oc_count4(c->sh), ys, oc_count4(ys),
             (size_t)c->a * c->sh.c * c->b * c->b, (size_t)c->a, (double)c->sh.c * c->b * c->b,
             (double)c->a * c->b * c->b, (double)c->sh.n * d.oh * d.ow);
}

static void run_linear(struct oc_ctx *ctx, const struct oc_case *c)
{
    const int n = c->sh.n, in = c->sh.c, out = c->a;
    char shape[96];
    snprintf(shape, sizeof(shape), "x(%d,%d) w(%d,%d)%s", n, in, out, in, c->e ? " +b" : "");
    const struct gemm g = {.n = n, .in = in, .out = out};
    const struct rt_shape4 none = {0};
    run_gemm(ctx, "linear", &g, shape, c->e, OC_FEAT, none, (size_t)n * in, none, (size_t)n * out,
             (size_t)out * in, (size_t)out, in, out, n);
}

/* ---- batchnorm ------------------------------------------------------------------------------------------------ */

/* A mean's allowed spread per channel: the check's spread in units of the channel's standard deviation
 * (1 / its saved inverse, rsi). Fills and returns `spread`. */
static double *bn_spread(const struct oc_ctx *ctx, enum oc_check check, const float *rsi, size_t C, double *spread)
{
    for (size_t k = 0; k < C; k++)
        spread[k] = ctx->tab_tol[check].spread / rsi[k];
    return spread;
}

static void run_bn(struct oc_ctx *ctx, const struct oc_case *cs)
{
    const struct rt_shape4 sh = cs->sh;
    const struct rt_bn_desc d = {.in = sh, .eps = 1e-5f, .momentum = 0.1f};
    const size_t n = oc_count4(sh), C = (size_t)sh.c, hw = (size_t)sh.h * sh.w;
    char shape[96];
    snprintf(shape, sizeof(shape), "%s per channel %zu%s", shape_str(sh), (size_t)sh.n * hw,
             cs->vals == OC_V_CHANNELS ? " spread" : "");
    float *hx;
    if (cs->vals == OC_V_CHANNELS) {
        static const float mu[] = {0.0f, 5.0f, -20.0f, 1.5f}, sd[] = {1.0f, 3.0f, 0.5f, 2.0f};
        hx = tu_hfloats(n);
        for (size_t i = 0; i < n; i++) {
            const size_t ch = i / hw % C;
            hx[i] = oc_round(ctx, mu[ch % 4] + sd[ch % 4] * rt_rng_normal(&ctx->rng));
        }
    } else {
        hx = oc_random(ctx, n, cs->lo, cs->hi);
    }
    float *hdy = oc_random_normal(ctx, n, 0.0f, 1.0f), *old = oc_random(ctx, n, -1, 1);
    float *hg = oc_random(ctx, C, 0.5f, 1.5f), *hb = oc_random(ctx, C, -0.5f, 0.5f);
    float *hrm = oc_random(ctx, C, -1.0f, 1.0f), *hrv = oc_random(ctx, C, 0.5f, 2.0f);
    float *hdg0 = oc_random(ctx, C, -1, 1), *hdb0 = oc_random(ctx, C, -1, 1);
    const struct rt_shape4 none = {0};
    struct oc_buf x = oc_new(ctx, OC_SPATIAL, 0, sh), y = oc_new(ctx, OC_SPATIAL, 0, sh),
                  dy = oc_new(ctx, OC_SPATIAL, 0, sh), dx = oc_new(ctx, OC_SPATIAL, 0, sh),
                  g = oc_new(ctx, OC_PARAM, C, none), b = oc_new(ctx, OC_PARAM, C, none),
                  rm = oc_new(ctx, OC_PARAM, C, none), rv = oc_new(ctx, OC_PARAM, C, none),
                  sm = oc_new(ctx, OC_PARAM, C, none), si = oc_new(ctx, OC_PARAM, C, none),
                  dg = oc_new(ctx, OC_PARAM, C, none), dbt = oc_new(ctx, OC_PARAM, C, none);
    oc_put(ctx, &x, hx);
    oc_put(ctx, &dy, hdy);
    oc_put(ctx, &g, hg);
    oc_put(ctx, &b, hb);
    oc_put(ctx, &rm, hrm);
    oc_put(ctx, &rv, hrv);
    fill_nan(ctx, &y);
    fill_nan(ctx, &sm);
    fill_nan(ctx, &si);
    BOTH OPS(s)->bn_train_fwd(ST(s), &d, F(x, s), F(g, s), F(b, s), F(rm, s), F(rv, s), F(sm, s), F(si, s), F(y, s));
    oc_compare_buf(ctx, OC_BN_Y, "bn_train_fwd y", shape, &y, NULL);
    /* the reference's saved statistics, for the means' spread and for both backward ops */
    float *rsm = tu_hfloats(C), *rsi = tu_hfloats(C), *tmp = tu_hfloats(C);
    oc_get(ctx, &sm, rsm, tmp);
    oc_get(ctx, &si, rsi, tmp);
    double *spread = tu_xmalloc(C * sizeof(double));
    memset(spread, 0, C * sizeof(double)); /* (C > 0; said for the compiler, which cannot see it) */
    oc_compare_buf(ctx, OC_BN_MEAN, "bn_train_fwd save_mean", shape, &sm, bn_spread(ctx, OC_BN_MEAN, rsi, C, spread));
    oc_compare_buf(ctx, OC_BN_INVSTD, "bn_train_fwd save_invstd", shape, &si, NULL);
    oc_compare_buf(ctx, OC_BN_RUNNING_MEAN, "bn_train_fwd running_mean", shape, &rm,
                   bn_spread(ctx, OC_BN_RUNNING_MEAN, rsi, C, spread));
    oc_compare_buf(ctx, OC_BN_RUNNING_VAR, "bn_train_fwd running_var", shape, &rv, NULL);

    /* inference from the same running statistics on both */
    oc_put(ctx, &rm, hrm);
    oc_put(ctx, &rv, hrv);
    fill_nan(ctx, &y);
    BOTH OPS(s)->bn_infer_fwd(ST(s), &d, F(x, s), F(g, s), F(b, s), F(rm, s), F(rv, s), F(y, s));
    oc_compare_buf(ctx, OC_BN_INFER_Y, "bn_infer_fwd y", shape, &y, NULL);

    /* inference's backward (a frozen layer) from the running statistics; training's from the reference's saved
     * statistics on both, so only bn_bwd itself is compared, the parameter gradients added to twice (beta_dx 0,
     * then 1) and their bound counting each channel's sum of |terms| */
    oc_put(ctx, &sm, rsm);
    oc_put(ctx, &si, rsi);
    oc_put(ctx, &dg, hdg0);
    oc_put(ctx, &dbt, hdb0);
    float *sdyx = tu_hfloats(C), *sdy = tu_hfloats(C);
    for (int beta = 0; beta < 2; beta++) {
        char op[64];
        put_old(ctx, &dx, beta, old);
        BOTH OPS(s)->bn_infer_bwd(ST(s), &d, F(x, s), F(dy, s), F(g, s), F(b, s), F(rm, s), F(rv, s), (float)beta,
                                  F(dx, s));
        snprintf(op, sizeof(op), "bn_infer_bwd beta_dx=%d dx", beta);
        oc_compare_buf(ctx, OC_BN_INFER_DX, op, shape, &dx, NULL);
        put_old(ctx, &dx, beta, old);
        BOTH OPS(s)->bn_bwd(ST(s), &d, F(x, s), F(dy, s), F(g, s), F(b, s), F(sm, s), F(si, s), (float)beta, F(dx, s),
                            F(dg, s), F(dbt, s));
        snprintf(op, sizeof(op), "bn_bwd beta_dx=%d dx", beta);
        oc_compare_buf(ctx, OC_BN_DX, op, shape, &dx, NULL);
        for (size_t k = 0; k < C; k++) {
            double a = beta ? sdyx[k] : fabs(hdg0[k]), bb = beta ? sdy[k] : fabs(hdb0[k]);
            for (int in = 0; in < sh.n; in++)
                for (size_t p = 0; p < hw; p++) {
                    const size_t i = ((size_t)in * C + k) * hw + p;
                    bb += fabs(hdy[i]);
                    a += fabs(hdy[i] * ((double)hx[i] - rsm[k])) * rsi[k];
                }
            sdyx[k] = (float)a;
            sdy[k] = (float)bb;
        }
        double *e = terms_extra(ctx, OC_BN_DPARAM, sdyx, C, 0);
        snprintf(op, sizeof(op), "bn_bwd dgamma (+=%s)", beta ? " twice" : "");
        oc_compare_buf(ctx, OC_BN_DPARAM, op, shape, &dg, e);
        free(e);
        e = terms_extra(ctx, OC_BN_DPARAM, sdy, C, 0);
        snprintf(op, sizeof(op), "bn_bwd dbeta (+=%s)", beta ? " twice" : "");
        oc_compare_buf(ctx, OC_BN_DPARAM, op, shape, &dbt, e);
        free(e);
    }
    /* The fused ReLU (rt_bn_desc.relu) where both tables offer it and the table checks it: both sides read the
     * reference's saved statistics, so the masks are the same elements and the rest differs by sum order. */
    if (ctx->tab_tol[OC_BN_RELU].name && OPS(OC_REF)->bn_relu && OPS(OC_DEV)->bn_relu) {
        struct rt_bn_desc dr = d;
        dr.relu = 1;
        oc_put(ctx, &rm, hrm);
        oc_put(ctx, &rv, hrv);
        fill_nan(ctx, &y);
        BOTH OPS(s)->bn_train_fwd(ST(s), &dr, F(x, s), F(g, s), F(b, s), F(rm, s), F(rv, s), F(sm, s), F(si, s),
                                  F(y, s));
        oc_compare_buf(ctx, OC_BN_RELU, "bn_train_fwd relu y", shape, &y, NULL);
        oc_put(ctx, &sm, rsm);
        oc_put(ctx, &si, rsi);
        fill_nan(ctx, &dx);
        oc_fill(ctx, &dg, 0.0f);
        oc_fill(ctx, &dbt, 0.0f);
        BOTH OPS(s)->bn_bwd(ST(s), &dr, F(x, s), F(dy, s), F(g, s), F(b, s), F(sm, s), F(si, s), 0.0f, F(dx, s),
                            F(dg, s), F(dbt, s));
        oc_compare_buf(ctx, OC_BN_RELU, "bn_bwd relu beta_dx=0 dx", shape, &dx, NULL);
        oc_compare_buf(ctx, OC_BN_RELU, "bn_bwd relu dgamma", shape, &dg, NULL);
        oc_compare_buf(ctx, OC_BN_RELU, "bn_bwd relu dbeta", shape, &dbt, NULL);
        oc_put(ctx, &rm, hrm);
        oc_put(ctx, &rv, hrv);
        fill_nan(ctx, &y);
        BOTH OPS(s)->bn_infer_fwd(ST(s), &dr, F(x, s), F(g, s), F(b, s), F(rm, s), F(rv, s), F(y, s));
        oc_compare_buf(ctx, OC_BN_RELU, "bn_infer_fwd relu y", shape, &y, NULL);
        oc_put(ctx, &dx, old);
        BOTH OPS(s)->bn_infer_bwd(ST(s), &dr, F(x, s), F(dy, s), F(g, s), F(b, s), F(rm, s), F(rv, s), 1.0f,
                                  F(dx, s));
        oc_compare_buf(ctx, OC_BN_RELU_INFER_DX, "bn_infer_bwd relu beta_dx=1 dx", shape, &dx, NULL);
    }
    struct oc_buf *all[] = {&x, &y, &dy, &dx, &g, &b, &rm, &rv, &sm, &si, &dg, &dbt};
    for (size_t i = 0; i < RT_ARRAY_LEN(all); i++)
        oc_free(ctx, all[i]);
    float *hs[] = {hx, hdy, old, hg, hb, hrm, hrv, hdg0, hdb0, rsm, rsi, tmp, sdyx, sdy};
    for (size_t i = 0; i < RT_ARRAY_LEN(hs); i++)
        free(hs[i]);
    free(spread);
}

/* ---- pooling, global pooling, flatten ------------------------------------------------------------------------- */

/*
 * Max pooling on the host, NCHW, pool.c's rule (the first maximum in
 * row-major order wins; a NaN wins): y, and dx = beta dx + the gradients
 * dy at each window's winner, summed in double.
 */
static void host_maxpool(const struct rt_pool_desc *d, const float *x, const float *dy, float beta, float *y, float *dx)
{
    const int H = d->in.h, W = d->in.w;
    const size_t planes = (size_t)d->in.n * d->in.c;
    double *acc = tu_xmalloc((size_t)H * W * sizeof(double));
    for (size_t j = 0; j < planes; j++) {
        const float *xp = x + j * H * W;
        for (int i = 0; i < H * W; i++)
            acc[i] = beta == 0.0f ? 0.0 : beta * (double)dx[j * H * W + i];
        for (int oy = 0; oy < d->oh; oy++)
            for (int ox = 0; ox < d->ow; ox++) {
                int best = -1;
                float m = -INFINITY;
                for (int iy = oy * d->stride - d->pad; iy < oy * d->stride - d->pad + d->kh; iy++)
                    for (int ix = ox * d->stride - d->pad; ix < ox * d->stride - d->pad + d->kw; ix++) {
                        if (iy < 0 || iy >= H || ix < 0 || ix >= W)
                            continue;
                        const float v = xp[iy * W + ix];
                        if (best < 0 || v > m || isnan(v)) {
                            m = v;
                            best = iy * W + ix;
                        }
                    }
                const size_t o = j * d->oh * d->ow + (size_t)oy * d->ow + ox;
                y[o] = m;
                acc[best] += dy[o];
            }
        for (int i = 0; i < H * W; i++)
            dx[j * H * W + i] = (float)acc[i];
    }
    free(acc);
}

static void run_pool(struct oc_ctx *ctx, const struct oc_case *c)
{
    static const char *const vname[] = {"", " ties", " NaNs", " relu+NaNs", ""};
    struct rt_pool_desc d = {.in = c->sh, .kh = c->a, .kw = c->a, .stride = c->b, .pad = c->c};
    if (rt_pool_desc_init(&d) < 0) {
        oc_verdict(ctx, 0, "rt_pool_desc_init", shape_str(c->sh), rt_errmsg());
        return;
    }
    const struct rt_shape4 ys = {c->sh.n, c->sh.c, d.oh, d.ow};
    const size_t nx = oc_count4(c->sh), ny = oc_count4(ys);
    char shape[96], op[64];
    snprintf(shape, sizeof(shape), "%s %dx%d s%d p%d%s", shape_str(c->sh), c->a, c->a, c->b, c->c, vname[c->vals]);
    float *hx = oc_random(ctx, nx, c->vals == OC_V_RELU_NANS ? 0.0f : c->lo, c->hi);
    for (size_t i = 0; i < nx; i++) {
        if (c->vals == OC_V_TIES)
            hx[i] = 0.5f * (float)rt_rng_below(&ctx->rng, 4);
        if ((c->vals == OC_V_NANS && i % 11 == 5) || (c->vals == OC_V_RELU_NANS && i % 37 == 5))
            hx[i] = NAN;
    }
    float *hdy = oc_random(ctx, ny, -1, 1), *old = oc_random(ctx, nx, -1, 1);
    float *hy = tu_hfloats(ny), *hdx = tu_hfloats(nx), *g = tu_hfloats(RT_MAX(nx, ny)), *r = tu_hfloats(RT_MAX(nx, ny));
    struct oc_buf x = oc_new(ctx, OC_SPATIAL, 0, c->sh), y = oc_new(ctx, OC_SPATIAL, 0, ys),
                  dy = oc_new(ctx, OC_SPATIAL, 0, ys), dx = oc_new(ctx, OC_SPATIAL, 0, c->sh);
    oc_put(ctx, &x, hx);
    oc_put(ctx, &dy, hdy);
    for (int avg = 0; avg < 2 && !(avg && c->e); avg++) {
        const char *name = avg ? "avgpool" : "maxpool";
        fill_nan(ctx, &y);
        BOTH (avg ? OPS(s)->avgpool_fwd : OPS(s)->maxpool_fwd)(ST(s), &d, F(x, s), F(y, s));
        snprintf(op, sizeof(op), "%s_fwd", name);
        oc_get(ctx, &y, r, g);
        oc_compare(ctx, avg ? OC_AVGPOOL_FWD : OC_MAXPOOL_FWD, op, shape, r, g, ny, NULL);
        if (!avg) { /* and against the host's max pooling, which depends on no kernel */
            host_maxpool(&d, hx, hdy, 0.0f, hy, hdx);
            oc_compare(ctx, OC_MAXPOOL_HOST_FWD, "maxpool_fwd vs host", shape, hy, g, ny, NULL);
        }
        /* maxpool_bwd gets each side's own y (equal: the forward is exact) */
        for (int beta = 0; beta < 2; beta++) {
            put_old(ctx, &dx, beta, old);
            if (avg)
                BOTH OPS(s)->avgpool_bwd(ST(s), &d, F(dy, s), (float)beta, F(dx, s));
            else
                BOTH OPS(s)->maxpool_bwd(ST(s), &d, F(x, s), F(y, s), F(dy, s), (float)beta, F(dx, s));
            snprintf(op, sizeof(op), "%s_bwd beta=%d", name, beta);
            oc_get(ctx, &dx, r, g);
            oc_compare(ctx, avg ? OC_AVGPOOL_BWD : OC_MAXPOOL_BWD, op, shape, r, g, nx, NULL);
            if (!avg) {
                memcpy(hdx, old, nx * sizeof(float));
                host_maxpool(&d, hx, hdy, (float)beta, hy, hdx);
                snprintf(op, sizeof(op), "maxpool_bwd beta=%d vs host", beta);
                oc_compare(ctx, OC_MAXPOOL_HOST_BWD, op, shape, hdx, g, nx, NULL);
            }
        }
    }
    struct oc_buf *all[] = {&x, &y, &dy, &dx};
    for (size_t i = 0; i < RT_ARRAY_LEN(all); i++)
        oc_free(ctx, all[i]);
    float *hs[] = {hx, hdy, old, hy, hdx, g, r};
    for (size_t i = 0; i < RT_ARRAY_LEN(hs); i++)
        free(hs[i]);
}

static void run_feat(struct oc_ctx *ctx, const struct oc_case *c)
{
    const struct rt_shape4 sh = c->sh;
    const size_t nx = oc_count4(sh), hw = (size_t)sh.h * sh.w;
    float *hx = oc_random(ctx, nx, c->lo, c->hi), *old = oc_random(ctx, nx, -1, 1);
    struct oc_buf x = oc_new(ctx, OC_SPATIAL, 0, sh), dx = oc_new(ctx, OC_SPATIAL, 0, sh);
    oc_put(ctx, &x, hx);
    for (int flat = 0; flat < 2; flat++) {
        const size_t ny = flat ? nx : (size_t)sh.n * sh.c;
        const char *name = flat ? "flatten" : "gap";
        char shape[96], op[64];
        snprintf(shape, sizeof(shape), "%s -> (%d,%zu)", shape_str(sh), sh.n, ny / (size_t)sh.n);
        const struct rt_shape4 none = {0};
        struct oc_buf y = oc_new(ctx, OC_FEAT, ny, none), dy = oc_new(ctx, OC_FEAT, ny, none);
        float *hdy = oc_random(ctx, ny, -1, 1);
        oc_put(ctx, &dy, hdy);
        fill_nan(ctx, &y);
        BOTH (flat ? OPS(s)->flatten_fwd : OPS(s)->gap_fwd)(ST(s), sh, F(x, s), F(y, s));
        double *e = NULL;
        if (!flat && wants_terms(ctx, OC_GAP_FWD)) { /* hw terms: each plane's mean of |x| */
            float *S = tu_hfloats(ny);
            for (size_t j = 0; j < ny; j++) {
                double a = 0.0;
                for (size_t p = 0; p < hw; p++)
                    a += fabs(hx[j * hw + p]);
                S[j] = (float)(a / (double)hw);
            }
            e = terms_extra(ctx, OC_GAP_FWD, S, ny, (double)hw - 1.0);
            free(S);
        }
        snprintf(op, sizeof(op), "%s_fwd", name);
        oc_compare_buf(ctx, flat ? OC_FLATTEN_FWD : OC_GAP_FWD, op, shape, &y, e);
        free(e);
        for (int beta = 0; beta < 2; beta++) {
            put_old(ctx, &dx, beta, old);
            BOTH (flat ? OPS(s)->flatten_bwd : OPS(s)->gap_bwd)(ST(s), sh, F(dy, s), (float)beta, F(dx, s));
            snprintf(op, sizeof(op), "%s_bwd beta=%d", name, beta);
            oc_compare_buf(ctx, !flat ? OC_GAP_BWD : beta ? OC_FLATTEN_BWD_ADD : OC_FLATTEN_BWD, op, shape, &dx, NULL);
        }
        oc_free(ctx, &y);
        oc_free(ctx, &dy);
        free(hdy);
    }
    oc_free(ctx, &x);
    oc_free(ctx, &dx);
    free(hx);
    free(old);
}

/* ---- element-wise ------------------------------------------------------------------------------------------------ */

static void run_elem(struct oc_ctx *ctx, const struct oc_case *c)
{
    const size_t n = (size_t)c->sh.n;
    char shape[32];
    snprintf(shape, sizeof(shape), "n=%zu", n);
    const struct rt_shape4 none = {0};
    float *ha = oc_random(ctx, n, c->lo, c->hi), *hb = oc_random(ctx, n, c->lo, c->hi);
    float *hdy = oc_random(ctx, n, -1, 1), *old = oc_random(ctx, n, -1, 1);
    if (n > 8) { /* NaN passes ReLU, GELU and the rest; a zero and a negative zero stay themselves */
        ha[1] = NAN;
        ha[2] = 0.0f;
        ha[3] = -0.0f;
        ha[4] = INFINITY; /* relu only: GELU gets finite tails */
        ha[5] = -INFINITY;
    }
    struct oc_buf a = oc_new(ctx, OC_FEAT, n, none), b = oc_new(ctx, OC_FEAT, n, none), y = oc_new(ctx, OC_FEAT, n, none),
                  dy = oc_new(ctx, OC_FEAT, n, none), dx = oc_new(ctx, OC_FEAT, n, none);
    oc_put(ctx, &a, ha);
    oc_put(ctx, &b, hb);
    oc_put(ctx, &dy, hdy);

    fill_nan(ctx, &y);
    BOTH OPS(s)->relu_fwd(ST(s), n, F(a, s), F(y, s));
    oc_compare_buf(ctx, OC_RELU, "relu_fwd", shape, &y, NULL);
    oc_put(ctx, &dx, ha);
    BOTH OPS(s)->relu_fwd(ST(s), n, F(dx, s), F(dx, s));
    oc_compare_buf(ctx, OC_RELU, "relu_fwd in place", shape, &dx, NULL);
    /* backward from each side's own y (equal: checked above) */
    for (int beta = 0; beta < 2; beta++) {
        put_old(ctx, &dx, beta, old);
        BOTH OPS(s)->relu_bwd(ST(s), n, F(y, s), F(dy, s), (float)beta, F(dx, s));
        oc_compare_buf(ctx, beta ? OC_RELU_BWD_ADD : OC_RELU, beta ? "relu_bwd beta=1" : "relu_bwd beta=0", shape, &dx,
                       NULL);
    }
    if (n > 8) {
        ha[4] = 9.5f;
        ha[5] = -9.5f;
        oc_put(ctx, &a, ha);
    }
    fill_nan(ctx, &y);
    BOTH OPS(s)->gelu_fwd(ST(s), n, F(a, s), F(y, s));
    oc_compare_buf(ctx, OC_GELU, "gelu_fwd", shape, &y, NULL);
    for (int beta = 0; beta < 2; beta++) {
        put_old(ctx, &dx, beta, old);
        BOTH OPS(s)->gelu_bwd(ST(s), n, F(a, s), F(dy, s), (float)beta, F(dx, s));
        oc_compare_buf(ctx, OC_GELU, beta ? "gelu_bwd beta=1" : "gelu_bwd beta=0", shape, &dx, NULL);
    }
    /* add and scale are one IEEE operation per element, add_relu one rounding and a select */
    fill_nan(ctx, &y);
    BOTH OPS(s)->add(ST(s), n, F(a, s), F(b, s), F(y, s));
    oc_compare_buf(ctx, OC_ADD, "add", shape, &y, NULL);
    oc_put(ctx, &y, ha);
    BOTH OPS(s)->add(ST(s), n, F(y, s), F(b, s), F(y, s));
    oc_compare_buf(ctx, OC_ADD, "add in place (y = y + b)", shape, &y, NULL);
    static const float alphas[] = {0.3f, -0.75f, 0.0f};
    char op[48];
    for (size_t i = 0; i < RT_ARRAY_LEN(alphas); i++) {
        oc_put(ctx, &y, hb);
        BOTH OPS(s)->scale(ST(s), n, alphas[i], F(y, s));
        snprintf(op, sizeof(op), "scale alpha=%g", (double)alphas[i]);
        oc_compare_buf(ctx, OC_ADD, op, shape, &y, NULL);
    }
    static const float axpys[] = {-0.7f, 0.37f, -1.0f};
    for (size_t i = 0; i < RT_ARRAY_LEN(axpys); i++) {
        oc_put(ctx, &y, hb);
        BOTH OPS(s)->axpy(ST(s), n, axpys[i], i == 2 ? F(b, s) : F(a, s), F(y, s));
        snprintf(op, sizeof(op), "axpy alpha=%g", (double)axpys[i]);
        oc_compare_buf(ctx, OC_AXPY, op, shape, &y, NULL);
    }
    if (OPS(OC_REF)->add_relu && OPS(OC_DEV)->add_relu) {
        fill_nan(ctx, &y);
        BOTH OPS(s)->add_relu_fwd(ST(s), n, F(a, s), F(b, s), F(y, s));
        oc_compare_buf(ctx, OC_ADD, "add_relu_fwd", shape, &y, NULL);
        /* (beta_a, beta_b): 2 = that gradient not asked for (NULL) */
        static const int betas[][2] = {{0, 1}, {2, 1}, {1, 2}, {2, 0}};
        for (size_t i = 0; i < RT_ARRAY_LEN(betas); i++) {
            const int ba = betas[i][0], bb = betas[i][1];
            put_old(ctx, &dx, ba == 1, old);
            put_old(ctx, &a, bb == 1, hb);
            BOTH OPS(s)->add_relu_bwd(ST(s), n, F(y, s), F(dy, s), (float)(ba & 1), ba == 2 ? NULL : F(dx, s),
                                      (float)(bb & 1), bb == 2 ? NULL : F(a, s));
            if (ba != 2) {
                snprintf(op, sizeof(op), "add_relu_bwd dxa beta=%d%s", ba, bb == 2 ? ", dxb NULL" : "");
                oc_compare_buf(ctx, OC_ADD, op, shape, &dx, NULL);
            }
            if (bb != 2) {
                snprintf(op, sizeof(op), "add_relu_bwd dxb beta=%d%s", bb, ba == 2 ? ", dxa NULL" : "");
                oc_compare_buf(ctx, OC_ADD, op, shape, &a, NULL);
            }
        }
    } else {
        printf("  add_relu: not fused by the %s table (add_relu 0): not compared\n",
               ctx->side[OPS(OC_REF)->add_relu ? OC_DEV : OC_REF].name);
    }
    struct oc_buf *all[] = {&a, &b, &y, &dy, &dx};
    for (size_t i = 0; i < RT_ARRAY_LEN(all); i++)
        oc_free(ctx, all[i]);
    free(ha);
    free(hb);
    free(hdy);
    free(old);
}

/* ---- dropout -------------------------------------------------------------------------------------------------- */

void oc_compare_mask(struct oc_ctx *ctx, const char *op, const char *shape, const float *ref, const float *dev,
                     size_t n, size_t *dropped)
{
    size_t bad = 0, drop = 0;
    for (size_t i = 0; i < n; i++) {
        drop += ref[i] == 0.0f;
        bad += (ref[i] == 0.0f) != (dev[i] == 0.0f);
    }
    char what[80], detail[96];
    snprintf(what, sizeof(what), "%s mask", op);
    snprintf(detail, sizeof(detail), "%zu of %zu positions differ (%zu dropped), tol exact", bad, n, drop);
    oc_verdict(ctx, bad == 0, what, shape, detail);
    if (dropped)
        *dropped = drop;
}

/*
 * Dropout keys each element on its logical (n, c, h, w) index (compute.h), so
 * the masks must match position for position whatever layout a table keeps.
 * Inputs have no zeros (a zero would hide a mask).
 */
static void run_dropout(struct oc_ctx *ctx, const struct oc_case *c)
{
    const struct rt_shape4 sh = c->sh;
    const int sp = c->e;
    const size_t n = oc_count4(sh);
    char shape[128];
    snprintf(shape, sizeof(shape), "%s %s p=%.2f seed %#llx offset %llu", sp ? "spatial" : "features", shape_str(sh),
             (double)c->p, (unsigned long long)c->seed, (unsigned long long)c->offset);
    float *hx = oc_random_normal(ctx, n, 0.0f, 1.0f), *hdy = oc_random_normal(ctx, n, 0.0f, 1.0f);
    float *old = oc_random(ctx, n, -1, 1), *r = tu_hfloats(n), *g = tu_hfloats(n), *fwd = tu_hfloats(n);
    for (size_t i = 0; i < n; i++) {
        if (hx[i] == 0.0f)
            hx[i] = 0.5f;
        if (hdy[i] == 0.0f)
            hdy[i] = 0.5f;
    }
    const enum oc_kind k = sp ? OC_SPATIAL : OC_FEAT;
    struct oc_buf x = oc_new(ctx, k, n, sh), y = oc_new(ctx, k, n, sh), dy = oc_new(ctx, k, n, sh),
                  dx = oc_new(ctx, k, n, sh);
    oc_put(ctx, &x, hx);
    oc_put(ctx, &dy, hdy);
    fill_nan(ctx, &y);
    BOTH OPS(s)->dropout_fwd(ST(s), sh, sp, c->p, c->seed, c->offset, NULL, F(x, s), F(y, s));
    oc_get(ctx, &y, r, fwd);
    size_t dropped = 0;
    oc_compare_mask(ctx, "dropout_fwd", shape, r, fwd, n, &dropped);
    oc_compare(ctx, OC_DROPOUT, "dropout_fwd values", shape, r, fwd, n, NULL);
    if (n >= 1000) { /* the rate: 3 standard deviations are below 0.05 from n = 1000 */
        char detail[64];
        snprintf(detail, sizeof(detail), "%zu of %zu dropped, within 0.05 of p", dropped, n);
        oc_verdict(ctx, fabs((double)dropped / (double)n - c->p) < 0.05, "dropout_fwd rate", shape, detail);
    }
    /* backward regenerates the same mask: against the device's forward mask too */
    for (int beta = 0; beta < 2; beta++) {
        put_old(ctx, &dx, beta, old);
        BOTH OPS(s)->dropout_bwd(ST(s), sh, sp, c->p, c->seed, c->offset, NULL, F(dy, s), (float)beta, F(dx, s));
        oc_get(ctx, &dx, r, g);
        if (!beta) {
            oc_compare_mask(ctx, "dropout_bwd beta=0", shape, r, g, n, NULL);
            oc_compare_mask(ctx, "dropout_bwd vs device fwd", shape, fwd, g, n, NULL);
        }
        oc_compare(ctx, beta ? OC_DROPOUT_BWD_ADD : OC_DROPOUT, beta ? "dropout_bwd beta=1" : "dropout_bwd beta=0",
                   shape, r, g, n, NULL);
    }
    struct oc_buf *all[] = {&x, &y, &dy, &dx};
    for (size_t i = 0; i < RT_ARRAY_LEN(all); i++)
        oc_free(ctx, all[i]);
    float *hs[] = {hx, hdy, old, r, g, fwd};
    for (size_t i = 0; i < RT_ARRAY_LEN(hs); i++)
        free(hs[i]);
}

/* ---- cross-entropy and reductions ------------------------------------------------------------------------------ */

static void run_xent(struct oc_ctx *ctx, const struct oc_case *c)
{
    const int n = c->sh.n, k = c->sh.c, with_grad = c->e;
    const float eps = c->p;
    char shape[96];
    snprintf(shape, sizeof(shape), "logits(%d,%d) eps=%.1f%s", n, k, (double)eps, with_grad ? "" : " no dlogits");
    const size_t nz = (size_t)n * k;
    float *hz = oc_random_normal(ctx, nz, 0.0f, 3.0f);
    int32_t *lab = tu_xmalloc((size_t)n * sizeof(int32_t));
    int valid = 0;
    for (int i = 0; i < n; i++) {
        lab[i] = (int32_t)rt_rng_below(&ctx->rng, (uint32_t)k);
        if (i % 5 == 2)
            lab[i] = -1; /* padding */
        if (i % 7 == 4)
            lab[i] = -5; /* any negative label is padding */
        valid += lab[i] >= 0;
    }
    if (n > 1 && k > 2) {
        /* row 0: an exact tie for the maximum, so the first-maximum rule decides "correct" */
        float mx = hz[0];
        for (int j = 1; j < k; j++)
            mx = fmaxf(mx, hz[j]);
        hz[1] = hz[2] = oc_round(ctx, mx + 1.0f);
        lab[0] = 2;
    }
    const float gs = valid ? 1.0f / (float)valid : 1.0f;
    const struct rt_shape4 none = {0};
    struct oc_buf z = oc_new(ctx, OC_FEAT, nz, none), dz = oc_new(ctx, OC_FEAT, nz, none),
                  st = oc_new(ctx, OC_PARAM, 3, none), l = oc_new(ctx, OC_PARAM, (size_t)n, none);
    oc_put(ctx, &z, hz);
    BOTH OPS(s)->upload(ST(s), l.p[s], lab, (size_t)n * sizeof(int32_t));
    const float start[3] = {1.5f, 2.0f, 3.0f}; /* the op adds to what is there */
    oc_put(ctx, &st, start);
    fill_nan(ctx, &dz); /* padding rows must be written as zeros */
    BOTH OPS(s)->xent_fwd_bwd(ST(s), n, k, F(z, s), (const int32_t *)l.p[s], eps, gs, NULL,
                              (struct rt_loss_stats *)st.p[s], with_grad ? F(dz, s) : NULL);
    float got[2][3];
    oc_get(ctx, &st, got[0], got[1]);
    compare_fp32(ctx, OC_XENT_LOSS, "xent_fwd_bwd loss_sum (+= 1.5)", shape, &got[0][0], &got[1][0], 1);
    compare_fp32(ctx, OC_EXACT_COUNT, "xent_fwd_bwd correct (+= 2)", shape, &got[0][1], &got[1][1], 1);
    compare_fp32(ctx, OC_EXACT_COUNT, "xent_fwd_bwd count (+= 3)", shape, &got[0][2], &got[1][2], 1);
    char detail[64];
    snprintf(detail, sizeof(detail), "%g, want %d", (double)got[0][2], 3 + valid);
    oc_verdict(ctx, got[0][2] == 3.0f + (float)valid, "xent_fwd_bwd count, reference", shape, detail);
    if (with_grad)
        oc_compare_buf(ctx, OC_XENT_DLOGITS, "xent_fwd_bwd dlogits", shape, &dz, NULL);
    struct oc_buf *all[] = {&z, &dz, &st, &l};
    for (size_t i = 0; i < RT_ARRAY_LEN(all); i++)
        oc_free(ctx, all[i]);
    free(hz);
    free(lab);
}

static void run_reduce(struct oc_ctx *ctx, const struct oc_case *c)
{
    const size_t n = (size_t)c->sh.n;
    const struct rt_shape4 none = {0};
    float *hx = oc_random_normal(ctx, n, 0.0f, 1.0f);
    if (n > 1)
        hx[0] = 4096.0f; /* 2^24 first: a float accumulator would then lose every 1 */
    struct oc_buf x = oc_new(ctx, OC_FEAT, n, none), out = oc_new(ctx, OC_PARAM, 1, none);
    char shape[48];
    snprintf(shape, sizeof(shape), "n=%zu", n);
    oc_put(ctx, &x, hx);
    fill_nan(ctx, &out);
    BOTH OPS(s)->sumsq(ST(s), n, F(x, s), F(out, s));
    oc_compare_buf(ctx, OC_SUMSQ, "sumsq", shape, &out, NULL);

    /* NaN and Inf planted at the ends, at block-like boundaries and in between; the largest finite value of the
     * table's type and subnormals are finite */
    static const size_t pos[] = {0, 1, 255, 256, 1023, 1024, 65535, 65536, 99991, ((size_t)1 << 21) + 4};
    for (size_t i = 0; i < RT_ARRAY_LEN(pos); i++)
        if (pos[i] < n)
            hx[pos[i]] = i % 3 == 0 ? NAN : i % 3 == 1 ? INFINITY : -INFINITY;
    if (n > 10) {
        hx[7] = is16(ctx) ? oc_bitsf(0x7f7f0000u) : FLT_MAX;
        hx[8] = -hx[7];
        hx[9] = 1e-45f;
        hx[10] = oc_bitsf(0xffc00001u); /* a negative NaN with a payload */
    }
    if (n > 2)
        hx[n - 1] = NAN;
    oc_put(ctx, &x, hx);
    size_t want = 0;
    for (size_t i = 0; i < n; i++)
        want += !isfinite(oc_round(ctx, hx[i]));
    snprintf(shape, sizeof(shape), "n=%zu (%zu planted)", n, want);
    fill_nan(ctx, &out);
    BOTH OPS(s)->count_nonfinite(ST(s), n, F(x, s), F(out, s));
    float got[2];
    oc_get(ctx, &out, &got[0], &got[1]);
    compare_fp32(ctx, OC_EXACT_COUNT, "count_nonfinite", shape, &got[0], &got[1], 1);
    char detail[64];
    snprintf(detail, sizeof(detail), "%g, want %zu", (double)got[0], want);
    oc_verdict(ctx, got[0] == (float)want, "count_nonfinite on the reference", shape, detail);
    oc_free(ctx, &x);
    oc_free(ctx, &out);
    free(hx);
}

/* ---- running a table ------------------------------------------------------------------------------------------ */

static void (*const runners[OC_F_COUNT])(struct oc_ctx *, const struct oc_case *) = {
    [OC_F_LAYOUT] = run_layout, [OC_F_INPUT] = run_input, [OC_F_CONV] = run_conv,   [OC_F_BN] = run_bn,
    [OC_F_POOL] = run_pool,     [OC_F_FEAT] = run_feat,   [OC_F_LINEAR] = run_linear, [OC_F_ELEM] = run_elem,
    [OC_F_DROPOUT] = run_dropout, [OC_F_XENT] = run_xent, [OC_F_REDUCE] = run_reduce,
};

static const char *const check_names[OC_CHECK_COUNT] = {
    "layout", "input", "conv fwd", "conv bwd data", "conv bwd data +=", "conv bwd filter", "bn y", "bn mean",
    "bn invstd", "bn running mean", "bn running var", "bn infer y", "bn dx", "bn dgamma/dbeta", "bn infer dx",
    "bn+relu", "bn+relu infer dx", "maxpool fwd", "maxpool bwd", "maxpool vs host", "maxpool bwd vs host",
    "avgpool fwd", "avgpool bwd", "gap fwd", "gap bwd", "flatten fwd", "flatten bwd", "flatten bwd +=",
    "linear fwd", "linear bwd data", "linear bwd filter", "relu", "relu bwd +=", "gelu", "add/scale/add_relu",
    "axpy", "dropout", "dropout bwd +=", "xent loss", "xent_fwd_bwd dlogits", "sumsq", "counts",
};

void oc_init(struct oc_ctx *ctx, const struct oc_side *ref, const struct oc_side *dev, uint64_t seed)
{
    memset(ctx, 0, sizeof(*ctx));
    ctx->side[OC_REF] = *ref;
    ctx->side[OC_DEV] = *dev;
    rt_rng_init(&ctx->rng, seed, 1);
}

int oc_run(struct oc_ctx *ctx, const struct oc_table *t, unsigned families)
{
    const int before = ctx->failures;
    ctx->tab_tol = t->tol;
    printf("op table: %s (%s, %s activations) against %s (%s)\n", ctx->side[OC_DEV].name, t->name,
           rt_dtype_name(ctx->side[OC_DEV].ops->act), ctx->side[OC_REF].name,
           rt_dtype_name(ctx->side[OC_REF].ops->act));
    if (!ctx->quiet) {
        printf("  tolerances: |dev - ref| <= atol + rtol |ref| + rmax max|ref| + (terms + kterms (K+1)) sum|terms| "
               "+ spread sd; exact: ref rounded to the table's type, bit for bit\n");
        char none[640] = "";
        for (int c = 0; c < OC_CHECK_COUNT; c++) {
            const struct oc_tol *x = &t->tol[c];
            if (!x->name)
                snprintf(none + strlen(none), sizeof(none) - strlen(none), "%s%s", none[0] ? ", " : "", check_names[c]);
            else if (x->flags & OC_EXACT)
                printf("    %-20s %-14s exact\n", check_names[c], x->name);
            else
                printf("    %-20s %-14s atol %-8.3g rtol %-8.3g rmax %-8.3g terms %-8.3g kterms %-8.3g spread %.3g\n",
                       check_names[c], x->name, x->atol, x->rtol, x->rmax, x->terms, x->kterms, x->spread);
        }
        if (none[0])
            printf("    not checked: %s\n", none);
    }
    for (int f = 0; f < OC_F_COUNT; f++) {
        if (!(families & (1u << f)))
            continue;
        size_t cases = 0;
        for (size_t i = 0; i < t->ncases; i++)
            cases += t->cases[i].family == (enum oc_family)f;
        if (!cases)
            continue;
        printf("%s (%zu cases)\n", family_names[f], cases);
        for (size_t i = 0; i < t->ncases; i++)
            if (t->cases[i].family == (enum oc_family)f)
                runners[f](ctx, &t->cases[i]);
    }
    printf("op table %s: %d checks so far, %d failed%s%s\n", ctx->side[OC_DEV].name, ctx->checks,
           ctx->failures - before, ctx->failed[0] ? "; failed ops:" : "", ctx->failed);
    return ctx->failures - before;
}

/* ---- planted faults ---------------------------------------------------------------------------------------- */

const struct oc_plant_info oc_plants[OC_PLANT_COUNT] = {
    [OC_PLANT_LAYOUT] = {"conv2d_bwd_data", "writes dx in NCHW order into the table's layout", OC_F_CONV},
    [OC_PLANT_SCALE] = {"xent_fwd_bwd", "leaves a factor (the loss scale) out of the gradient", OC_F_XENT},
    [OC_PLANT_BN_STATS] = {"bn_train_fwd", "does not update the running statistics", OC_F_BN},
};

static const struct rt_ops *plant_base; /* the table the planted op wraps */
static float plant_scale;

/* A spatial tensor of the base table as host NCHW floats (malloc'd). */
static float *plant_get(struct rt_stream *s, struct rt_shape4 sh, const float *x)
{
    float *h = tu_hfloats(oc_count4(sh));
    plant_base->to_nchw(s, sh, x, h);
    plant_base->sync(s);
    return h;
}

/* conv2d_bwd_data with a layout mistake: dx written in NCHW order into a tensor the table keeps in its own layout
 * (NHWC on the GPU), as a kernel indexing the wrong layout writes it; with beta 1 only this call's contribution is
 * misplaced. */
static void plant_conv_bwd_data_layout(struct rt_stream *s, const struct rt_conv_desc *d, const float *dy,
                                       const float *w, float beta, float *dx)
{
    const struct rt_shape4 sh = d->in;
    const size_t n = oc_count4(sh), hw = (size_t)sh.h * sh.w, chw = (size_t)sh.c * hw;
    float *before = beta != 0.0f ? plant_get(s, sh, dx) : NULL;
    plant_base->conv2d_bwd_data(s, d, dy, w, beta, dx);
    float *after = plant_get(s, sh, dx), *out = tu_hfloats(n);
    for (size_t i = 0; i < n; i++) {
        /* element (b, c, yx) lies at NHWC offset b chw + yx C + c, where the kernel put its NCHW element of that
         * offset */
        const size_t b = i / chw, c = i / hw % (size_t)sh.c, yx = i % hw, j = b * chw + yx * (size_t)sh.c + c;
        out[i] = (before ? before[i] : 0.0f) + (after[j] - (before ? before[j] : 0.0f));
    }
    plant_base->from_nchw(s, sh, out, dx);
    plant_base->sync(s);
    free(before);
    free(after);
    free(out);
}

/* xent_fwd_bwd that leaves the loss scale out of the logits' gradient, as a path that forgets to apply it does:
 * every gradient comes out loss_scale times too small, pointing exactly the same way. */
static void plant_xent_unscaled(struct rt_stream *s, int n, int k, const float *logits, const int32_t *labels,
                                float label_smoothing, float grad_scale, const float *loss_scale,
                                struct rt_loss_stats *stats, float *dlogits)
{
    plant_base->xent_fwd_bwd(s, n, k, logits, labels, label_smoothing, grad_scale / plant_scale, loss_scale, stats,
                             dlogits);
}

/* bn_train_fwd that normalises with the batch's statistics but leaves the running statistics as they were. */
static void plant_bn_no_update(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                               const float *beta, float *running_mean, float *running_var, float *save_mean,
                               float *save_invstd, float *y)
{
    const size_t c = (size_t)d->in.c;
    float *keep = tu_hfloats(2 * c);
    plant_base->download(s, keep, running_mean, c * sizeof(float));
    plant_base->download(s, keep + c, running_var, c * sizeof(float));
    plant_base->sync(s);
    plant_base->bn_train_fwd(s, d, x, gamma, beta, running_mean, running_var, save_mean, save_invstd, y);
    plant_base->upload(s, running_mean, keep, c * sizeof(float));
    plant_base->upload(s, running_var, keep + c, c * sizeof(float));
    plant_base->sync(s);
    free(keep);
}

struct rt_ops oc_plant_table(const struct rt_ops *base, enum oc_plant p, float loss_scale)
{
    struct rt_ops t = *base;
    plant_base = base;
    plant_scale = loss_scale;
    switch (p) {
    case OC_PLANT_LAYOUT:
        t.conv2d_bwd_data = plant_conv_bwd_data_layout;
        break;
    case OC_PLANT_SCALE:
        t.xent_fwd_bwd = plant_xent_unscaled;
        break;
    case OC_PLANT_BN_STATS:
        t.bn_train_fwd = plant_bn_no_update;
        break;
    case OC_PLANT_COUNT:
        break;
    }
    return t;
}

int oc_plant_run(const struct oc_ctx *ctx, const struct oc_table *t, enum oc_plant p, float loss_scale, uint64_t seed)
{
    const struct oc_plant_info *pi = &oc_plants[p];
    const struct oc_side *d = &ctx->side[OC_DEV];
    const struct rt_ops planted = oc_plant_table(d->ops, p, loss_scale);
    char name[96];
    snprintf(name, sizeof(name), "%s planted", d->name);
    struct oc_ctx pc;
    oc_init(&pc, &ctx->side[OC_REF], &(struct oc_side){.name = name, .be = d->be, .ops = &planted, .st = d->st}, seed);
    pc.quiet = 1;
    printf("planted fault in the %s table: %s %s\n", d->name, pi->op, pi->fault);
    oc_run(&pc, t, 1u << pi->family);
    const int caught = op_failed(&pc, pi->op);
    printf("  %s: %s\n", pi->op, caught ? "caught" : "MISSED");
    return caught;
}
