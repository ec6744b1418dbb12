/*
 * test_cuda_ops.c - the CUDA backend against the CPU backend, op by op, then
 * whole models.
 *
 * Ops: every slot of struct rt_ops is run on both backends with the same
 * inputs (same host arrays, same seeds) and the CUDA result is compared
 * with the CPU result, which is the reference (the CPU ops are themselves
 * checked against naive double-precision references and finite differences
 * in test_ops_spatial.c and test_ops_elem.c), element by element. Spatial
 * tensors go in and out through each backend's from_nchw / to_nchw (the CPU
 * keeps them blocked or (C, N, H, W), CUDA NCHW); features (N, F) and flat
 * buffers through upload/download. One line per comparison: op, shapes, the
 * largest |cuda - cpu|, the tolerance at that element, how many values are
 * not bit-identical, ok or FAIL. Tolerances are in the table TOL below.
 *
 * Models: mnist-net, resnet18, resnet9 and mnist-net with dropout run one
 * training step on both backends, in fp32 and with the 16-bit tables, and
 * the logits, loss, every gradient tensor and the running statistics are
 * compared by direction and length against bounds that a correct other
 * implementation keeps: fixed ones in fp32, and in 16 bits the floor --
 * what exact fp32 arithmetic on 16-bit values does to the same model,
 * measured in the same run (the "whole models" section says why). Planted
 * faults (a layout mistake, a lost loss scale, a batchnorm that does not
 * update its statistics) must be caught.
 *
 * `test_cuda_ops --stand-in` (ctest's test_cuda_ops_standin, label unit)
 * runs the model part without a GPU, the CPU backend's bf16 table in the
 * GPU's place and, for fp32, the CPU's fp32 table with every op output
 * moved by up to 2 ulps: so the bounds the first GPU run meets, the floors
 * (fp16's too) and the planted faults have run in CI. It skips (77) on a
 * CPU without AVX512_BF16 or AMX.
 *
 * The first line says which CUDA runtime the build has, the NVIDIA driver
 * it needs and the machine's driver. Exit 0 pass, 1 fail, 77 skip (no CUDA
 * backend in this build, no driver or no device). The seed is fixed and
 * printed.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "optable_check.h"
#include "test_cuda_parts.h"
#include "test_util.h"
#include "common/common.h"
#include "common/nvml.h"
#include "compute/compute.h"
#include "compute/dropout_index.h"

#define SEED UINT64_C(20250307)

/* ---- tolerances ------------------------------------------------------------------------------------ */

/*
 * |cuda - cpu| <= atol + rtol * scale, where scale is |cpu| of the element
 * (elementwise) or max |cpu| over the whole tensor (vs_max: for results that
 * are sums, where a value near zero is the difference of large partial sums
 * and carries their rounding). Wherever the CPU value is NaN or +-Inf the
 * CUDA value must be NaN or the same Inf; a mask or a bit pattern must match
 * exactly. An index, layout or stride mistake moves values by the order of
 * max |cpu|, far above every tolerance here.
 */
enum tol_id {
    T_EXACT,      /* data movement, selection, counts */
    T_ELEM,       /* one or a few fp32 roundings per element */
    T_TRANS,      /* element-wise through erf/exp */
    T_GEMM,       /* convolution and linear: dot products */
    T_REDUCE,     /* batchnorm, global pooling: per-channel sums */
    T_LOSS,       /* cross-entropy sums */
    T_SUMSQ,      /* double accumulation, one rounding to float */
    T_OPTIM,      /* SGD, Adam, AdamW */
    T_COUNT
};

static const struct tol {
    const char *name;
    double atol, rtol;
    int vs_max;
} TOL[T_COUNT] = {
    /* copies, layout conversion, flatten, max pooling forward, ReLU forward, casts, dropout masks,
     * non-finite counts, correct/count of the loss: no arithmetic that could round differently. */
    [T_EXACT] = {"exact", 0.0, 0.0, 0},
    /* input normalisation, ReLU/dropout backward with beta, add/axpy, average pooling, max pooling
     * backward (up to 4 overlapping windows summed in another order): one to a few roundings, and a
     * compiler may contract a*b+c into an FMA on one side only: an ulp or two; 1e-6 is ~8 ulp at 1. */
    [T_ELEM] = {"elementwise", 1e-6, 1e-6, 0},
    /* GELU and the softmax of the loss: glibc's erff/expf against CUDA's, each within a few ulp. */
    [T_TRANS] = {"transcendental", 1e-6, 1e-5, 0},
    /* conv2d/linear fp32 with another summation order (cuDNN/cuBLAS algorithms, blocking, split-K;
     * Winograd/FFT transforms): rounding grows with sqrt(K) ulp of the largest partial sum, so the
     * bound is relative to max |ref| over the tensor. TF32 (10-bit mantissa) would be ~1e-3: it fails. */
    [T_GEMM] = {"gemm", 1e-5, 1e-4, 1},
    /* batchnorm (mean, variance, the two sums of backward) and gap: sums over N*H*W of up to ~2000
     * values per channel, tree against sequential; channels with mean 20 and sd 0.5 make a
     * cancelling variance formula (E[x^2] - E[x]^2 in float) show up as ~1e-4. */
    [T_REDUCE] = {"reduction", 1e-5, 1e-5, 1},
    /* loss_sum: a sum over rows of log-sum-exp in another order. */
    [T_LOSS] = {"loss", 1e-5, 1e-5, 1},
    /* sum of squares: both accumulate in double (compute.h), so only the final float rounding can differ. */
    [T_SUMSQ] = {"sumsq", 0.0, 2.5e-7, 0},
    /* compute.h promises torch.optim's order of operations and FMAs on every backend, so the results
     * should be bit-identical (the line reports the bit-differing count); 1e-6 leaves room for one
     * contraction choice of a compiler. */
    [T_OPTIM] = {"optimizer", 1e-6, 1e-6, 0},
};

/* ---- the two backends ------------------------------------------------------------------------------ */

enum { CPU = 0, GPU = 1 };

static struct side {
    const char *name;
    struct rt_backend *be;
    const struct rt_ops *ops;
    struct rt_stream *st;
} S[2] = {{.name = "cpu"}, {.name = "cuda"}};

/* Issues op `name` on backend s with its stream. */
#define OP(s, name, ...) S[s].ops->name(S[s].st, __VA_ARGS__)
#define BOTH for (int s = 0; s < 2; s++)

/* ---- host helpers -------------------------------------------------------------------------------- */

static void fill_uniform(struct rt_rng *r, float *p, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * rt_rng_uniform(r);
}

static void fill_normal(struct rt_rng *r, float *p, size_t n, float mean, float sd)
{
    for (size_t i = 0; i < n; i++)
        p[i] = mean + sd * rt_rng_normal(r);
}

static void fill_const(float *p, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        p[i] = v;
}

/* No exact zeros (a zero would hide a dropout or ReLU mask). */
static void avoid_zero(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] == 0.0f)
            p[i] = 0.5f;
}

static size_t count4(struct rt_shape4 s)
{
    return (size_t)s.n * s.c * s.h * s.w;
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* ---- device buffers on both backends --------------------------------------------------------------- */

struct dual {
    void *p[2];
};

#define DF(d, s) ((float *)(d).p[s])

static struct dual d_alloc(size_t bytes)
{
    struct dual d;
    BOTH {
        d.p[s] = S[s].ops->alloc(S[s].be, bytes ? bytes : 4);
        if (!d.p[s]) {
            fprintf(stderr, "test_cuda_ops: %s alloc of %zu bytes: %s\n", S[s].name, bytes, rt_errmsg());
            exit(1);
        }
    }
    return d;
}

static struct dual d_floats(size_t n)
{
    return d_alloc(n * sizeof(float));
}

static void d_free(struct dual *d)
{
    BOTH {
        S[s].ops->free(S[s].be, d->p[s]);
        d->p[s] = NULL;
    }
}

/* The same host bytes into both; synchronised, so the host array may change right after. */
static void d_put(struct dual *d, const void *host, size_t bytes)
{
    BOTH {
        OP(s, upload, d->p[s], host, bytes);
        S[s].ops->sync(S[s].st);
    }
}

static void d_put_sp(struct dual *d, struct rt_shape4 sh, const float *nchw)
{
    BOTH {
        OP(s, from_nchw, sh, nchw, DF(*d, s));
        S[s].ops->sync(S[s].st);
    }
}

/* n copies of v (layout does not matter for a constant). */
static void d_fill(struct dual *d, size_t n, float v)
{
    float *h = tu_hfloats(n);
    fill_const(h, n, v);
    d_put(d, h, n * sizeof(float));
    free(h);
}

static void d_get(const struct dual *d, void *h_cpu, void *h_gpu, size_t bytes)
{
    void *h[2] = {h_cpu, h_gpu};
    BOTH {
        OP(s, download, h[s], d->p[s], bytes);
        S[s].ops->sync(S[s].st);
    }
}

static void d_get_sp(const struct dual *d, struct rt_shape4 sh, float *h_cpu, float *h_gpu)
{
    float *h[2] = {h_cpu, h_gpu};
    BOTH {
        OP(s, to_nchw, sh, DF(*d, s), h[s]);
        S[s].ops->sync(S[s].st);
    }
}

/* ---- comparison ----------------------------------------------------------------------------------- */

/* max_err and tol_at_max belong to the element with the largest err/tol (for tolerances relative
 * to max|ref| that is the largest error). */
struct cmp {
    size_t bad, not_bitequal, worst_i;
    double max_err, tol_at_max, worst_ratio;
};

/* Compares got with ref under TOL[t]; prints the first few misses to stderr with `what`. */
static struct cmp cmp_core(const char *what, const float *ref, const float *got, size_t n, enum tol_id t)
{
    const struct tol *T = &TOL[t];
    struct cmp c = {0};
    double mx = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ref[i]))
            mx = fmax(mx, fabs((double)ref[i]));
    for (size_t i = 0; i < n; i++) {
        const double r = ref[i], g = got[i];
        double err, tol;
        int ok;
        if (!isfinite(r) || !isfinite(g)) {
            ok = (isnan(r) && isnan(g)) || r == g;
            err = ok ? 0.0 : INFINITY;
            tol = 0.0;
        } else {
            err = fabs(g - r);
            tol = T->atol + T->rtol * (T->vs_max ? mx : fabs(r));
            ok = err <= tol;
        }
        if (fbits(ref[i]) != fbits(got[i]))
            c.not_bitequal++;
        if (!ok) {
            if (c.bad < 5)
                fprintf(stderr, "    %s[%zu]: %s %.9g cpu %.9g (err %.3g > tol %.3g)\n", what, i, S[GPU].name, g, r, err,
                        tol);
            c.bad++;
        }
        /* the element closest to failing: its error and tolerance are what the line prints */
        const double ratio = tol > 0.0 ? err / tol : (err > 0.0 ? INFINITY : 0.0);
        if (i == 0 || ratio > c.worst_ratio || (ratio == c.worst_ratio && err > c.max_err)) {
            c.worst_ratio = ratio;
            c.worst_i = i;
            c.max_err = err;
            c.tol_at_max = tol;
        }
    }
    return c;
}

static void report(const char *op, const char *shape, size_t n, const struct cmp *c, enum tol_id t)
{
    const int ok = c->bad == 0;
    printf("  %-40s %-50s err %-9.3g tol %-9.3g (%s) n=%zu, %zu not bit-equal  %s\n", op, shape, c->max_err,
           c->tol_at_max, TOL[t].name, n, c->not_bitequal, ok ? "ok" : "FAIL");
    CHECKF(ok, "%s %s: %zu of %zu values outside the %s tolerance (atol %g, rtol %g%s)", op, shape, c->bad, n,
           TOL[t].name, TOL[t].atol, TOL[t].rtol, TOL[t].vs_max ? " of max|ref|" : "");
}

static void compare(const char *op, const char *shape, const float *ref, const float *got, size_t n, enum tol_id t)
{
    const struct cmp c = cmp_core(op, ref, got, n, t);
    report(op, shape, n, &c, t);
}

/* Downloads a spatial tensor from both backends and compares. */
static void cmp_sp(const char *op, const char *shape, const struct dual *d, struct rt_shape4 sh, enum tol_id t)
{
    const size_t n = count4(sh);
    float *a = tu_hfloats(n), *b = tu_hfloats(n);
    d_get_sp(d, sh, a, b);
    compare(op, shape, a, b, n, t);
    free(a);
    free(b);
}

/* Downloads n floats (features or a flat buffer) from both backends and compares. */
static void cmp_flat(const char *op, const char *shape, const struct dual *d, size_t n, enum tol_id t)
{
    float *a = tu_hfloats(n), *b = tu_hfloats(n);
    d_get(d, a, b, n * sizeof(float));
    compare(op, shape, a, b, n, t);
    free(a);
    free(b);
}

/* Bit patterns that must match exactly (casts). */
static void cmp_bits16(const char *op, const char *shape, const uint16_t *ref, const uint16_t *got, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (ref[i] != got[i] && bad++ < 5)
            fprintf(stderr, "    %s[%zu]: cuda 0x%04x cpu 0x%04x\n", op, i, got[i], ref[i]);
    printf("  %-40s %-50s %zu of %zu patterns differ, tol exact bits  %s\n", op, shape, bad, n, bad ? "FAIL" : "ok");
    CHECKF(bad == 0, "%s %s: %zu of %zu results differ in bits", op, shape, bad, n);
}

static void cmp_bits32(const char *op, const char *shape, const float *ref, const float *got, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (fbits(ref[i]) != fbits(got[i]) && bad++ < 5)
            fprintf(stderr, "    %s[%zu]: cuda 0x%08x cpu 0x%08x\n", op, i, fbits(got[i]), fbits(ref[i]));
    printf("  %-40s %-50s %zu of %zu values differ, tol exact bits  %s\n", op, shape, bad, n, bad ? "FAIL" : "ok");
    CHECKF(bad == 0, "%s %s: %zu of %zu results differ in bits", op, shape, bad, n);
}

/* Positions of zeros (dropped elements) must be the same bit for bit. */
/* A dual's CPU and GPU contents in host NCHW (logical) order: spatial (sp) or flat. */
static void d_get_logical(struct dual *d, int sp, struct rt_shape4 sh, float *cpu, float *gpu)
{
    if (sp)
        d_get_sp(d, sh, cpu, gpu);
    else
        d_get(d, cpu, gpu, count4(sh) * sizeof(float));
}

static void cmp_mask(const char *op, const char *shape, const float *ref, const float *got, size_t n)
{
    size_t bad = 0, dropped = 0;
    for (size_t i = 0; i < n; i++) {
        dropped += ref[i] == 0.0f;
        if ((ref[i] == 0.0f) != (got[i] == 0.0f) && bad++ < 5)
            fprintf(stderr, "    %s[%zu]: cuda %s, cpu %s\n", op, i, got[i] == 0.0f ? "dropped" : "kept",
                    ref[i] == 0.0f ? "dropped" : "kept");
    }
    char what[96];
    snprintf(what, sizeof(what), "%s mask", op);
    printf("  %-40s %-50s %zu of %zu positions differ (%zu dropped), tol exact  %s\n", what, shape, bad, n, dropped,
           bad ? "FAIL" : "ok");
    CHECKF(bad == 0, "%s %s: dropout mask differs at %zu of %zu positions", op, shape, bad, n);
}

/* ---- memory ------------------------------------------------------------------------------------------ */

static void test_memory(void)
{
    printf("memory: alloc, upload, download, copy, zero, sync\n");
    struct rt_rng r;
    rt_rng_init(&r, SEED, 1);
    const size_t nb = 4099; /* odd: no vector-width assumption */
    struct dual a = d_alloc(nb), b = d_alloc(nb);
    uint8_t *h = tu_xmalloc(nb), *want = tu_xmalloc(nb), *got[2] = {tu_xmalloc(nb), tu_xmalloc(nb)};

    /* fresh allocations are zeroed and 256-byte aligned */
    BOTH {
        OP(s, download, got[s], b.p[s], nb);
        S[s].ops->sync(S[s].st);
        size_t nz = 0;
        for (size_t i = 0; i < nb; i++)
            nz += got[s][i] != 0;
        const int aligned = (uintptr_t)b.p[s] % 256 == 0;
        printf("  %-40s %-50s %zu non-zero bytes, %saligned to 256  %s\n", "alloc", S[s].name, nz,
               aligned ? "" : "not ", nz == 0 && aligned ? "ok" : "FAIL");
        CHECKF(nz == 0, "%s: alloc of %zu bytes is not zeroed (%zu non-zero bytes)", S[s].name, nb, nz);
        CHECKF(aligned, "%s: alloc returned %p, not 256-byte aligned", S[s].name, b.p[s]);
    }

    for (size_t i = 0; i < nb; i++)
        h[i] = (uint8_t)rt_rng_u32(&r);
    d_put(&a, h, nb);
    /* b = zeros; copy 2000 bytes from a+7 to b+3 (both unaligned), then zero 100 bytes at b+50 */
    BOTH {
        OP(s, copy, (uint8_t *)b.p[s] + 3, (const uint8_t *)a.p[s] + 7, 2000);
        OP(s, zero, (uint8_t *)b.p[s] + 50, 100);
    }
    memset(want, 0, nb);
    memcpy(want + 3, h + 7, 2000);
    memset(want + 50, 0, 100);
    d_get(&a, got[0], got[1], nb);
    BOTH {
        const int ok = memcmp(got[s], h, nb) == 0;
        printf("  %-40s %-50s %s\n", "upload/download round trip", S[s].name, ok ? "exact  ok" : "differs  FAIL");
        CHECKF(ok, "%s: download(upload(x)) != x for %zu bytes", S[s].name, nb);
    }
    d_get(&b, got[0], got[1], nb);
    BOTH {
        const int ok = memcmp(got[s], want, nb) == 0;
        printf("  %-40s %-50s %s\n", "copy (unaligned) + zero (range)", S[s].name, ok ? "exact  ok" : "differs  FAIL");
        CHECKF(ok, "%s: copy of 2000 bytes at +7 -> +3 then zero of 100 at +50: wrong bytes", S[s].name);
    }
    d_free(&a);
    d_free(&b);

    /* a larger buffer (bandwidth paths, several blocks), copied device to device */
    const size_t nbig = ((size_t)8 << 20) + 12;
    uint8_t *big = tu_xmalloc(nbig), *back = tu_xmalloc(nbig);
    for (size_t i = 0; i < nbig; i++)
        big[i] = (uint8_t)(i * 131 + (i >> 11));
    struct dual x = d_alloc(nbig), y = d_alloc(nbig);
    d_put(&x, big, nbig);
    BOTH {
        OP(s, copy, y.p[s], x.p[s], nbig);
        OP(s, zero, x.p[s], nbig);
        OP(s, download, back, y.p[s], nbig);
        S[s].ops->sync(S[s].st);
        int ok = memcmp(back, big, nbig) == 0;
        OP(s, download, back, x.p[s], nbig);
        S[s].ops->sync(S[s].st);
        size_t nz = 0;
        for (size_t i = 0; i < nbig; i++)
            nz += back[i] != 0;
        ok = ok && nz == 0;
        printf("  %-40s %-50s %s\n", "copy + zero 8 MiB", S[s].name, ok ? "exact  ok" : "differs  FAIL");
        CHECKF(ok, "%s: 8 MiB copy/zero wrong (%zu non-zero bytes after zero)", S[s].name, nz);
    }
    d_free(&x);
    d_free(&y);
    free(big);
    free(back);
    free(h);
    free(want);
    free(got[0]);
    free(got[1]);
}

/* ---- layout and input ---------------------------------------------------------------------------------- */

static void test_layout(void)
{
    printf("layout: from_nchw / to_nchw\n");
    static const struct rt_shape4 shapes[] = {{5, 3, 7, 9}, {1, 64, 4, 4}, {4, 512, 1, 1}, {3, 1, 28, 28}};
    struct rt_rng r;
    rt_rng_init(&r, SEED, 2);
    for (size_t k = 0; k < RT_ARRAY_LEN(shapes); k++) {
        const struct rt_shape4 sh = shapes[k];
        const size_t n = count4(sh);
        float *h = tu_hfloats(n), *a = tu_hfloats(n), *b = tu_hfloats(n);
        fill_uniform(&r, h, n, -1, 1);
        struct dual d = d_floats(n);
        d_put_sp(&d, sh, h);
        d_get_sp(&d, sh, a, b);
        char shape[64];
        snprintf(shape, sizeof(shape), "(%d,%d,%d,%d)", sh.n, sh.c, sh.h, sh.w);
        compare("to_nchw(from_nchw(x)) cpu", shape, h, a, n, T_EXACT);
        compare("to_nchw(from_nchw(x)) cuda", shape, h, b, n, T_EXACT);
        d_free(&d);
        free(h);
        free(a);
        free(b);
    }
}

static void test_input_u8(void)
{
    printf("input_u8\n");
    static const struct rt_shape4 shapes[] = {{5, 1, 28, 28}, {3, 1, 13, 7}, {4, 3, 32, 32}, {3, 3, 17, 11}};
    static const float mean1[1] = {0.1307f}, std1[1] = {0.3081f};
    static const float mean3[3] = {0.4914f, 0.4822f, 0.4465f}, std3[3] = {0.2470f, 0.2435f, 0.2616f};
    struct rt_rng r;
    rt_rng_init(&r, SEED, 3);
    for (size_t k = 0; k < RT_ARRAY_LEN(shapes); k++) {
        const struct rt_shape4 sh = shapes[k];
        const size_t n = count4(sh);
        uint8_t *img = tu_xmalloc(n);
        for (size_t i = 0; i < n; i++)
            img[i] = (uint8_t)rt_rng_below(&r, 256);
        img[0] = 0;
        img[n - 1] = 255;
        const float *mean = sh.c == 1 ? mean1 : mean3, *sd = sh.c == 1 ? std1 : std3;
        struct dual y = d_floats(n);
        d_fill(&y, n, NAN);
        BOTH {
            OP(s, input_u8, sh, img, mean, sd, DF(y, s));
            S[s].ops->sync(S[s].st);
        }
        char shape[64];
        snprintf(shape, sizeof(shape), "(%d,%d,%d,%d) C=%d", sh.n, sh.c, sh.h, sh.w, sh.c);
        cmp_sp("input_u8", shape, &y, sh, T_ELEM);
        d_free(&y);
        free(img);
    }
}

/* ---- convolution ------------------------------------------------------------------------------------------ */

struct conv_case {
    int n, cin, h, w, cout, k, stride, pad, bias;
};

static void test_conv_case(const struct conv_case *c, uint64_t stream)
{
    struct rt_conv_desc d = {.in = {c->n, c->cin, c->h, c->w}, .cout = c->cout, .kh = c->k, .kw = c->k,
                             .stride = c->stride, .pad = c->pad};
    if (rt_conv_desc_init(&d) < 0) {
        CHECKF(0, "rt_conv_desc_init: %s", rt_errmsg());
        return;
    }
    const struct rt_shape4 ys = {c->n, c->cout, d.oh, d.ow};
    char shape[128];
    snprintf(shape, sizeof(shape), "x(%d,%d,%d,%d) w(%d,%d,%d,%d) s%d p%d%s y(%d,%d,%d,%d)", c->n, c->cin, c->h, c->w,
             c->cout, c->cin, c->k, c->k, c->stride, c->pad, c->bias ? " +b" : "", ys.n, ys.c, ys.h, ys.w);
    const size_t nx = count4(d.in), ny = count4(ys), nw = (size_t)c->cout * c->cin * c->k * c->k,
                 nb = (size_t)c->cout;
    struct rt_rng r;
    rt_rng_init(&r, SEED, stream);
    float *hx = tu_hfloats(nx), *hw = tu_hfloats(nw), *hb = tu_hfloats(nb), *hdy = tu_hfloats(ny);
    float *old = tu_hfloats(RT_MAX(nx, nw));
    const float bound = sqrtf(3.0f / (float)(c->cin * c->k * c->k)); /* unit-variance outputs */
    fill_uniform(&r, hx, nx, -1, 1);
    fill_uniform(&r, hw, nw, -bound, bound);
    fill_uniform(&r, hb, nb, -1, 1);
    fill_uniform(&r, hdy, ny, -1, 1);
    struct dual x = d_floats(nx), w = d_floats(nw), b = d_floats(nb), y = d_floats(ny), dy = d_floats(ny),
                dx = d_floats(nx), dw = d_floats(nw), db = d_floats(nb);
    d_put_sp(&x, d.in, hx);
    d_put(&w, hw, nw * sizeof(float));
    d_put(&b, hb, nb * sizeof(float));
    d_put_sp(&dy, ys, hdy);

    d_fill(&y, ny, NAN);
    BOTH OP(s, conv2d_fwd, &d, DF(x, s), DF(w, s), c->bias ? DF(b, s) : NULL, DF(y, s));
    cmp_sp("conv2d_fwd", shape, &y, ys, T_GEMM);

    d_fill(&dx, nx, NAN); /* beta 0 must not read dx */
    BOTH OP(s, conv2d_bwd_data, &d, DF(dy, s), DF(w, s), 0.0f, DF(dx, s));
    cmp_sp("conv2d_bwd_data beta=0", shape, &dx, d.in, T_GEMM);
    fill_uniform(&r, old, nx, -1, 1);
    d_put_sp(&dx, d.in, old);
    BOTH OP(s, conv2d_bwd_data, &d, DF(dy, s), DF(w, s), 1.0f, DF(dx, s));
    cmp_sp("conv2d_bwd_data beta=1", shape, &dx, d.in, T_GEMM);

    /* parameter gradients are added to: start from non-zero values */
    fill_uniform(&r, old, nw, -1, 1);
    d_put(&dw, old, nw * sizeof(float));
    fill_uniform(&r, old, nb, -1, 1);
    d_put(&db, old, nb * sizeof(float));
    BOTH OP(s, conv2d_bwd_filter, &d, DF(x, s), DF(dy, s), DF(dw, s), c->bias ? DF(db, s) : NULL);
    cmp_flat("conv2d_bwd_filter dw (+=)", shape, &dw, nw, T_GEMM);
    if (c->bias)
        cmp_flat("conv2d_bwd_filter dbias (+=)", shape, &db, nb, T_GEMM);

    struct dual *all[] = {&x, &w, &b, &y, &dy, &dx, &dw, &db};
    for (size_t i = 0; i < RT_ARRAY_LEN(all); i++)
        d_free(all[i]);
    free(hx);
    free(hw);
    free(hb);
    free(hdy);
    free(old);
}

static void test_conv(void)
{
    printf("conv2d fwd / bwd_data / bwd_filter\n");
    static const struct conv_case cases[] = {
        /* n  cin   h   w  cout k  s  p  bias */
        {5, 16, 8, 8, 32, 1, 1, 0, 0},      /* 1x1 stride 1 */
        {1, 6, 9, 7, 10, 1, 1, 0, 1},       /* 1x1 stride 1, batch 1, bias */
        {5, 8, 10, 10, 16, 3, 1, 1, 0},     /* 3x3 pad 1 stride 1 */
        {1, 5, 13, 11, 7, 3, 1, 1, 1},      /* odd sizes, batch 1, bias */
        {5, 16, 16, 16, 32, 3, 2, 1, 0},    /* 3x3 pad 1 stride 2 (downsampling block) */
        {1, 4, 9, 7, 6, 3, 2, 1, 1},        /* odd sizes, stride 2, bias */
        {5, 3, 32, 32, 64, 7, 2, 3, 0},     /* resnet18's stem on 32x32 */
        {1, 3, 23, 19, 8, 7, 2, 3, 1},      /* 7x7 stem, odd sizes, bias */
        {5, 64, 8, 8, 128, 1, 2, 0, 0},     /* 1x1 stride 2 downsample shortcut */
        {4, 256, 2, 2, 512, 3, 2, 1, 0},    /* resnet18 layer4.0.conv1 at 32x32: K = 2304 */
        {5, 1, 28, 28, 32, 3, 1, 0, 1},     /* mnist-net conv1 (no padding), bias */
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(cases); i++)
        test_conv_case(&cases[i], 100 + i);
}

/* ---- batchnorm ----------------------------------------------------------------------------------------------- */

/* A device buffer of the GPU side alone; exits as d_alloc does. */
static void *gpu_alloc(size_t bytes)
{
    void *p = S[GPU].ops->alloc(S[GPU].be, bytes ? bytes : 4);
    if (!p) {
        fprintf(stderr, "test_cuda_ops: %s alloc of %zu bytes: %s\n", S[GPU].name, bytes, rt_errmsg());
        exit(1);
    }
    return p;
}

/*
 * bn_infer_bwd of the 16-bit tables (NHWC), which no model test reaches (they freeze nothing): on x, dy and dx's
 * old values (host NCHW) rounded to the table's type, against the CPU's fp32 results ref0 (beta_dx 0: dy a) and
 * ref1 (beta_dx 1: old + dy a). dx = R(R(old) + R(dy) a) is within u |old| + u |dy a| of the exact sum before its
 * own rounding (u the type's unit roundoff), so 3 u (|old| + |ref0|) bounds it, plus 1e-6 for fp16's subnormal
 * spacing. g, b, rm, rv: the fp32 parameters and running statistics on the GPU side.
 */
static void test_bn_infer_bwd16(const struct rt_bn_desc *d, const char *shape, const float *hx, const float *hdy,
                                const float *old, const float *ref0, const float *ref1, const float *g, const float *b,
                                const float *rm, const float *rv)
{
    const struct rt_shape4 sh = d->in;
    const size_t n = count4(sh);
    float *nans = tu_hfloats(n), *got = tu_hfloats(n);
    fill_const(nans, n, NAN);
    for (int t = 0; t < 2; t++) {
        const enum rt_dtype act = t ? RT_F16 : RT_BF16;
        const struct rt_ops *o16 = rt_backend_ops_for(S[GPU].be, act);
        if (!o16)
            continue;
        const double u = act == RT_BF16 ? 0x1p-8 : 0x1p-11;
        struct rt_stream *gs = S[GPU].st;
        float *x16 = gpu_alloc(n * sizeof(uint16_t)), *dy16 = gpu_alloc(n * sizeof(uint16_t));
        float *dx16 = gpu_alloc(n * sizeof(uint16_t));
        o16->from_nchw(gs, sh, hx, x16);
        o16->from_nchw(gs, sh, hdy, dy16);
        for (int bd = 0; bd < 2; bd++) {
            o16->from_nchw(gs, sh, bd ? old : nans, dx16); /* beta_dx 0 must not read dx */
            o16->bn_infer_bwd(gs, d, x16, dy16, g, b, rm, rv, (float)bd, dx16);
            o16->to_nchw(gs, sh, dx16, got);
            o16->sync(gs);
            const float *ref = bd ? ref1 : ref0;
            size_t bad = 0;
            double worst = 0.0, worst_tol = 0.0;
            for (size_t i = 0; i < n; i++) {
                const double tol = 3.0 * u * (fabs((double)ref0[i]) + (bd ? fabs((double)old[i]) : 0.0)) + 1e-6;
                const double err = fabs((double)got[i] - (double)ref[i]);
                if (!(err <= tol) && bad++ < 5)
                    fprintf(stderr, "    bn_infer_bwd %s[%zu]: %s %.9g cpu fp32 %.9g (err %.3g > tol %.3g)\n",
                            rt_dtype_name(act), i, S[GPU].name, (double)got[i], (double)ref[i], err, tol);
                if (err / tol > (worst_tol > 0.0 ? worst / worst_tol : 0.0)) {
                    worst = err;
                    worst_tol = tol;
                }
            }
            char op[64];
            snprintf(op, sizeof(op), "bn_infer_bwd %s beta_dx=%d dx", rt_dtype_name(act), bd);
            printf("  %-40s %-50s err %-9.3g tol %-9.3g (3u of |old| + |dy a|) n=%zu  %s\n", op, shape, worst,
                   worst_tol, n, bad ? "FAIL" : "ok");
            CHECKF(bad == 0, "%s %s: %zu of %zu values outside 3u (|old| + |dy a|) of the fp32 CPU's", op, shape, bad,
                   n);
        }
        S[GPU].ops->free(S[GPU].be, x16);
        S[GPU].ops->free(S[GPU].be, dy16);
        S[GPU].ops->free(S[GPU].be, dx16);
    }
    free(nans);
    free(got);
}

static void test_bn_case(struct rt_shape4 sh, uint64_t stream)
{
    const struct rt_bn_desc d = {.in = sh, .eps = 1e-5f, .momentum = 0.1f};
    char shape[64];
    snprintf(shape, sizeof(shape), "x(%d,%d,%d,%d) per channel %d", sh.n, sh.c, sh.h, sh.w, sh.n * sh.h * sh.w);
    const size_t n = count4(sh), c = (size_t)sh.c, hw = (size_t)sh.h * sh.w;
    struct rt_rng r;
    rt_rng_init(&r, SEED, stream);
    /* a distinct mean and spread per channel: a wrong channel stride shows, and mean 20 / sd 0.5
     * punishes a cancelling variance formula */
    static const float mu[] = {0.0f, 5.0f, -20.0f, 1.5f}, sd[] = {1.0f, 3.0f, 0.5f, 2.0f};
    float *hx = tu_hfloats(n), *hdy = tu_hfloats(n), *old = tu_hfloats(n);
    for (int in = 0; in < sh.n; in++)
        for (size_t ch = 0; ch < c; ch++)
            fill_normal(&r, hx + ((size_t)in * c + ch) * hw, hw, mu[ch % 4], sd[ch % 4]);
    fill_normal(&r, hdy, n, 0.0f, 1.0f);
    float *hg = tu_hfloats(c), *hb = tu_hfloats(c), *hrm = tu_hfloats(c), *hrv = tu_hfloats(c), *hc = tu_hfloats(c);
    fill_uniform(&r, hg, c, 0.5f, 1.5f);
    fill_uniform(&r, hb, c, -0.5f, 0.5f);
    fill_uniform(&r, hrm, c, -1.0f, 1.0f);
    fill_uniform(&r, hrv, c, 0.5f, 2.0f);
    struct dual x = d_floats(n), y = d_floats(n), g = d_floats(c), b = d_floats(c), rm = d_floats(c),
                rv = d_floats(c), sm = d_floats(c), si = d_floats(c), dy = d_floats(n), dx = d_floats(n),
                dg = d_floats(c), dbt = d_floats(c);
    d_put_sp(&x, sh, hx);
    d_put_sp(&dy, sh, hdy);
    d_put(&g, hg, c * sizeof(float));
    d_put(&b, hb, c * sizeof(float));
    d_put(&rm, hrm, c * sizeof(float));
    d_put(&rv, hrv, c * sizeof(float));
    d_fill(&y, n, NAN);
    d_fill(&sm, c, NAN);
    d_fill(&si, c, NAN);

    BOTH OP(s, bn_train_fwd, &d, DF(x, s), DF(g, s), DF(b, s), DF(rm, s), DF(rv, s), DF(sm, s), DF(si, s),
            DF(y, s));
    cmp_sp("bn_train_fwd y", shape, &y, sh, T_REDUCE);
    cmp_flat("bn_train_fwd save_mean", shape, &sm, c, T_REDUCE);
    cmp_flat("bn_train_fwd save_invstd", shape, &si, c, T_REDUCE);
    cmp_flat("bn_train_fwd running_mean", shape, &rm, c, T_REDUCE);
    cmp_flat("bn_train_fwd running_var", shape, &rv, c, T_REDUCE);

    /* inference from the same running statistics on both */
    d_put(&rm, hrm, c * sizeof(float));
    d_put(&rv, hrv, c * sizeof(float));
    d_fill(&y, n, NAN);
    BOTH OP(s, bn_infer_fwd, &d, DF(x, s), DF(g, s), DF(b, s), DF(rm, s), DF(rv, s), DF(y, s));
    cmp_sp("bn_infer_fwd y", shape, &y, sh, T_REDUCE);

    /* backward from the CPU's saved statistics on both, so only bn_bwd itself is compared */
    float *hsm = tu_hfloats(c), *hsi = tu_hfloats(c);
    OP(CPU, download, hsm, DF(sm, CPU), c * sizeof(float));
    OP(CPU, download, hsi, DF(si, CPU), c * sizeof(float));
    S[CPU].ops->sync(S[CPU].st);
    d_put(&sm, hsm, c * sizeof(float));
    d_put(&si, hsi, c * sizeof(float));
    d_fill(&dx, n, NAN);
    fill_uniform(&r, hc, c, -1, 1);
    d_put(&dg, hc, c * sizeof(float));
    fill_uniform(&r, hc, c, -1, 1);
    d_put(&dbt, hc, c * sizeof(float));
    BOTH OP(s, bn_bwd, &d, DF(x, s), DF(dy, s), DF(g, s), DF(b, s), DF(sm, s), DF(si, s), 0.0f, DF(dx, s), DF(dg, s),
            DF(dbt, s));
    cmp_sp("bn_bwd beta_dx=0 dx", shape, &dx, sh, T_REDUCE);
    cmp_flat("bn_bwd dgamma (+=)", shape, &dg, c, T_REDUCE);
    cmp_flat("bn_bwd dbeta (+=)", shape, &dbt, c, T_REDUCE);
    fill_uniform(&r, old, n, -1, 1);
    d_put_sp(&dx, sh, old);
    BOTH OP(s, bn_bwd, &d, DF(x, s), DF(dy, s), DF(g, s), DF(b, s), DF(sm, s), DF(si, s), 1.0f, DF(dx, s), DF(dg, s),
            DF(dbt, s));
    cmp_sp("bn_bwd beta_dx=1 dx", shape, &dx, sh, T_REDUCE);
    cmp_flat("bn_bwd dgamma (+= twice)", shape, &dg, c, T_REDUCE);
    cmp_flat("bn_bwd dbeta (+= twice)", shape, &dbt, c, T_REDUCE);

    /* inference's backward (a frozen layer) from the running statistics: dy times the forward's scale, with the
     * same roundings on both (no sums), so elementwise; the fused ReLU's forms follow below */
    float *ref[2] = {tu_hfloats(n), tu_hfloats(n)}, *got = tu_hfloats(n);
    for (int bd = 0; bd < 2; bd++) {
        if (bd)
            d_put_sp(&dx, sh, old);
        else
            d_fill(&dx, n, NAN); /* beta_dx 0 must not read dx */
        BOTH OP(s, bn_infer_bwd, &d, DF(x, s), DF(dy, s), DF(g, s), DF(b, s), DF(rm, s), DF(rv, s), (float)bd,
                DF(dx, s));
        d_get_sp(&dx, sh, ref[bd], got);
        compare(bd ? "bn_infer_bwd beta_dx=1 dx" : "bn_infer_bwd beta_dx=0 dx", shape, ref[bd], got, n, T_ELEM);
    }
    test_bn_infer_bwd16(&d, shape, hx, hdy, old, ref[0], ref[1], DF(g, GPU), DF(b, GPU), DF(rm, GPU), DF(rv, GPU));

    /* The fused ReLU (rt_bn_desc.relu) where both tables offer it: forward's y clipped, backward's dy passed only
     * where the forward's output, recomputed from x with the same statistics, is > 0 (both sides read the CPU's
     * saved statistics, so the masks are the same elements and dx, dgamma, dbeta differ only by sum order). */
    if (S[CPU].ops->bn_relu && S[GPU].ops->bn_relu) {
        struct rt_bn_desc dr = d;
        dr.relu = 1;
        d_put(&rm, hrm, c * sizeof(float));
        d_put(&rv, hrv, c * sizeof(float));
        d_fill(&y, n, NAN);
        BOTH OP(s, bn_train_fwd, &dr, DF(x, s), DF(g, s), DF(b, s), DF(rm, s), DF(rv, s), DF(sm, s), DF(si, s),
                DF(y, s));
        cmp_sp("bn_train_fwd relu y", shape, &y, sh, T_REDUCE);
        d_put(&sm, hsm, c * sizeof(float));
        d_put(&si, hsi, c * sizeof(float));
        d_fill(&dx, n, NAN);
        d_fill(&dg, c, 0.0f);
        d_fill(&dbt, c, 0.0f);
        BOTH OP(s, bn_bwd, &dr, DF(x, s), DF(dy, s), DF(g, s), DF(b, s), DF(sm, s), DF(si, s), 0.0f, DF(dx, s),
                DF(dg, s), DF(dbt, s));
        cmp_sp("bn_bwd relu beta_dx=0 dx", shape, &dx, sh, T_REDUCE);
        cmp_flat("bn_bwd relu dgamma", shape, &dg, c, T_REDUCE);
        cmp_flat("bn_bwd relu dbeta", shape, &dbt, c, T_REDUCE);
        d_put(&rm, hrm, c * sizeof(float));
        d_put(&rv, hrv, c * sizeof(float));
        d_fill(&y, n, NAN);
        BOTH OP(s, bn_infer_fwd, &dr, DF(x, s), DF(g, s), DF(b, s), DF(rm, s), DF(rv, s), DF(y, s));
        cmp_sp("bn_infer_fwd relu y", shape, &y, sh, T_REDUCE);
        d_put_sp(&dx, sh, old);
        BOTH OP(s, bn_infer_bwd, &dr, DF(x, s), DF(dy, s), DF(g, s), DF(b, s), DF(rm, s), DF(rv, s), 1.0f,
                DF(dx, s));
        cmp_sp("bn_infer_bwd relu beta_dx=1 dx", shape, &dx, sh, T_ELEM);
    } else {
        printf("  batchnorm + ReLU: not fused by the %s table (bn_relu 0): not compared\n",
               S[CPU].ops->bn_relu ? S[GPU].name : S[CPU].name);
    }
    free(ref[0]);
    free(ref[1]);
    free(got);

    struct dual *all[] = {&x, &y, &g, &b, &rm, &rv, &sm, &si, &dy, &dx, &dg, &dbt};
    for (size_t i = 0; i < RT_ARRAY_LEN(all); i++)
        d_free(all[i]);
    free(hx);
    free(hdy);
    free(old);
    free(hg);
    free(hb);
    free(hrm);
    free(hrv);
    free(hc);
    free(hsm);
    free(hsi);
}

static void test_bn(void)
{
    printf("batchnorm train / infer / bwd / infer bwd\n");
    static const struct rt_shape4 shapes[] = {{5, 16, 8, 8}, {1, 8, 7, 5}, {4, 32, 1, 1}, {2, 6, 33, 31}};
    for (size_t i = 0; i < RT_ARRAY_LEN(shapes); i++)
        test_bn_case(shapes[i], 200 + i);
}

/* ---- pooling ----------------------------------------------------------------------------------------------------- */

/* xmode: 0 continuous values, 1 three levels (ties everywhere: the first maximum wins), 2 NaN every 11th */
static void test_pool_case(int is_max, struct rt_shape4 in, int k, int stride, int pad, int xmode, uint64_t stream)
{
    struct rt_pool_desc d = {.in = in, .kh = k, .kw = k, .stride = stride, .pad = pad};
    if (rt_pool_desc_init(&d) < 0) {
        CHECKF(0, "rt_pool_desc_init: %s", rt_errmsg());
        return;
    }
    const struct rt_shape4 ys = {in.n, in.c, d.oh, d.ow};
    static const char *const modes[] = {"", " ties", " NaNs"};
    char shape[128], op[64];
    snprintf(shape, sizeof(shape), "x(%d,%d,%d,%d) %dx%d s%d p%d%s y(%d,%d,%d,%d)", in.n, in.c, in.h, in.w, k, k,
             stride, pad, modes[xmode], ys.n, ys.c, ys.h, ys.w);
    const char *name = is_max ? "maxpool" : "avgpool";
    const size_t nx = count4(in), ny = count4(ys);
    struct rt_rng r;
    rt_rng_init(&r, SEED, stream);
    float *hx = tu_hfloats(nx), *hdy = tu_hfloats(ny), *old = tu_hfloats(nx);
    fill_uniform(&r, hx, nx, -1, 1);
    if (xmode == 1)
        for (size_t i = 0; i < nx; i++)
            hx[i] = 0.25f * (float)rt_rng_below(&r, 3);
    if (xmode == 2)
        for (size_t i = 5; i < nx; i += 11)
            hx[i] = NAN;
    fill_uniform(&r, hdy, ny, -1, 1);
    struct dual x = d_floats(nx), y = d_floats(ny), dy = d_floats(ny), dx = d_floats(nx);
    d_put_sp(&x, in, hx);
    d_put_sp(&dy, ys, hdy);
    d_fill(&y, ny, NAN);
    if (is_max)
        BOTH OP(s, maxpool_fwd, &d, DF(x, s), DF(y, s));
    else
        BOTH OP(s, avgpool_fwd, &d, DF(x, s), DF(y, s));
    snprintf(op, sizeof(op), "%s_fwd", name);
    cmp_sp(op, shape, &y, ys, is_max ? T_EXACT : T_ELEM);

    /* maxpool_bwd gets each backend's own y (equal: the forward is exact) */
    for (int beta = 0; beta < 2; beta++) {
        if (beta) {
            fill_uniform(&r, old, nx, -1, 1);
            d_put_sp(&dx, in, old);
        } else {
            d_fill(&dx, nx, NAN);
        }
        if (is_max)
            BOTH OP(s, maxpool_bwd, &d, DF(x, s), DF(y, s), DF(dy, s), (float)beta, DF(dx, s));
        else
            BOTH OP(s, avgpool_bwd, &d, DF(dy, s), (float)beta, DF(dx, s));
        snprintf(op, sizeof(op), "%s_bwd beta=%d", name, beta);
        cmp_sp(op, shape, &dx, in, T_ELEM);
    }
    d_free(&x);
    d_free(&y);
    d_free(&dy);
    d_free(&dx);
    free(hx);
    free(hdy);
    free(old);
}

static void test_pool(void)
{
    printf("max / avg pooling fwd / bwd\n");
    static const struct {
        struct rt_shape4 in;
        int k, stride, pad;
    } cases[] = {
        {{5, 8, 16, 16}, 3, 2, 1}, /* resnet18's stem pooling */
        {{1, 3, 9, 7}, 3, 2, 1},   /* odd sizes, batch 1 */
        {{5, 8, 8, 8}, 2, 2, 0},   /* mnist-net / resnet9 pooling */
        {{1, 4, 7, 9}, 2, 2, 0},   /* floor mode drops the last row / column */
    };
    uint64_t stream = 300;
    for (size_t i = 0; i < RT_ARRAY_LEN(cases); i++)
        for (int is_max = 1; is_max >= 0; is_max--)
            for (int xmode = 0; xmode < (is_max ? 3 : 2); xmode++)
                test_pool_case(is_max, cases[i].in, cases[i].k, cases[i].stride, cases[i].pad, xmode, stream++);
}

/* ---- global average pooling and flatten ------------------------------------------------------------------------- */

static void test_feat_case(struct rt_shape4 sh, int flatten, uint64_t stream)
{
    const char *name = flatten ? "flatten" : "gap";
    char shape[64], op[64];
    snprintf(shape, sizeof(shape), "x(%d,%d,%d,%d) -> (%d,%d)", sh.n, sh.c, sh.h, sh.w, sh.n,
             flatten ? sh.c * sh.h * sh.w : sh.c);
    const size_t nx = count4(sh), ny = flatten ? nx : (size_t)sh.n * sh.c;
    struct rt_rng r;
    rt_rng_init(&r, SEED, stream);
    float *hx = tu_hfloats(nx), *hdy = tu_hfloats(ny), *old = tu_hfloats(nx);
    fill_uniform(&r, hx, nx, -1, 1);
    fill_uniform(&r, hdy, ny, -1, 1);
    struct dual x = d_floats(nx), y = d_floats(ny), dy = d_floats(ny), dx = d_floats(nx);
    d_put_sp(&x, sh, hx);
    d_put(&dy, hdy, ny * sizeof(float));
    d_fill(&y, ny, NAN);
    if (flatten)
        BOTH OP(s, flatten_fwd, sh, DF(x, s), DF(y, s));
    else
        BOTH OP(s, gap_fwd, sh, DF(x, s), DF(y, s));
    snprintf(op, sizeof(op), "%s_fwd", name);
    cmp_flat(op, shape, &y, ny, flatten ? T_EXACT : T_REDUCE);
    for (int beta = 0; beta < 2; beta++) {
        if (beta) {
            fill_uniform(&r, old, nx, -1, 1);
            d_put_sp(&dx, sh, old);
        } else {
            d_fill(&dx, nx, NAN);
        }
        if (flatten)
            BOTH OP(s, flatten_bwd, sh, DF(dy, s), (float)beta, DF(dx, s));
        else
            BOTH OP(s, gap_bwd, sh, DF(dy, s), (float)beta, DF(dx, s));
        snprintf(op, sizeof(op), "%s_bwd beta=%d", name, beta);
        cmp_sp(op, shape, &dx, sh, flatten && !beta ? T_EXACT : T_ELEM);
    }
    d_free(&x);
    d_free(&y);
    d_free(&dy);
    d_free(&dx);
    free(hx);
    free(hdy);
    free(old);
}

static void test_feat(void)
{
    printf("gap / flatten fwd / bwd\n");
    static const struct rt_shape4 shapes[] = {{5, 64, 4, 4}, {1, 3, 7, 5}, {4, 512, 1, 1}, {5, 64, 12, 12}};
    uint64_t stream = 400;
    for (size_t i = 0; i < RT_ARRAY_LEN(shapes); i++) {
        test_feat_case(shapes[i], 0, stream++);
        test_feat_case(shapes[i], 1, stream++);
    }
}

/* ---- linear ---------------------------------------------------------------------------------------------------- */

static void test_linear_case(int n, int in, int out, int bias, uint64_t stream)
{
    char shape[96];
    snprintf(shape, sizeof(shape), "x(%d,%d) w(%d,%d)%s y(%d,%d)", n, in, out, in, bias ? " +b" : "", n, out);
    const size_t nx = (size_t)n * in, nw = (size_t)out * in, ny = (size_t)n * out, nb = (size_t)out;
    struct rt_rng r;
    rt_rng_init(&r, SEED, stream);
    float *hx = tu_hfloats(nx), *hw = tu_hfloats(nw), *hb = tu_hfloats(nb), *hdy = tu_hfloats(ny), *old = tu_hfloats(RT_MAX(nx, nw));
    const float bound = sqrtf(3.0f / (float)in);
    fill_uniform(&r, hx, nx, -1, 1);
    fill_uniform(&r, hw, nw, -bound, bound);
    fill_uniform(&r, hb, nb, -1, 1);
    fill_uniform(&r, hdy, ny, -1, 1);
    struct dual x = d_floats(nx), w = d_floats(nw), b = d_floats(nb), y = d_floats(ny), dy = d_floats(ny),
                dx = d_floats(nx), dw = d_floats(nw), db = d_floats(nb);
    d_put(&x, hx, nx * sizeof(float));
    d_put(&w, hw, nw * sizeof(float));
    d_put(&b, hb, nb * sizeof(float));
    d_put(&dy, hdy, ny * sizeof(float));
    d_fill(&y, ny, NAN);
    BOTH OP(s, linear_fwd, n, in, out, DF(x, s), DF(w, s), bias ? DF(b, s) : NULL, DF(y, s));
    cmp_flat("linear_fwd", shape, &y, ny, T_GEMM);

    d_fill(&dx, nx, NAN);
    BOTH OP(s, linear_bwd_data, n, in, out, DF(dy, s), DF(w, s), 0.0f, DF(dx, s));
    cmp_flat("linear_bwd_data beta=0", shape, &dx, nx, T_GEMM);
    fill_uniform(&r, old, nx, -1, 1);
    d_put(&dx, old, nx * sizeof(float));
    BOTH OP(s, linear_bwd_data, n, in, out, DF(dy, s), DF(w, s), 1.0f, DF(dx, s));
    cmp_flat("linear_bwd_data beta=1", shape, &dx, nx, T_GEMM);

    fill_uniform(&r, old, nw, -1, 1);
    d_put(&dw, old, nw * sizeof(float));
    fill_uniform(&r, old, nb, -1, 1);
    d_put(&db, old, nb * sizeof(float));
    BOTH OP(s, linear_bwd_filter, n, in, out, DF(x, s), DF(dy, s), DF(dw, s), bias ? DF(db, s) : NULL);
    cmp_flat("linear_bwd_filter dw (+=)", shape, &dw, nw, T_GEMM);
    if (bias)
        cmp_flat("linear_bwd_filter db (+=)", shape, &db, nb, T_GEMM);

    struct dual *all[] = {&x, &w, &b, &y, &dy, &dx, &dw, &db};
    for (size_t i = 0; i < RT_ARRAY_LEN(all); i++)
        d_free(all[i]);
    free(hx);
    free(hw);
    free(hb);
    free(hdy);
    free(old);
}

static void test_linear(void)
{
    printf("linear fwd / bwd_data / bwd_filter\n");
    test_linear_case(5, 12544, 128, 1, 500); /* mnist-net fc1 on 3x32x32 */
    test_linear_case(4, 128, 10, 1, 501);    /* mnist-net fc2 */
    test_linear_case(5, 512, 10, 0, 502);    /* resnet18 fc without bias */
    test_linear_case(1, 33, 7, 1, 503);      /* batch 1, odd sizes */
    test_linear_case(7, 1, 3, 0, 504);       /* in = 1 */
    test_linear_case(64, 300, 100, 1, 505);
}

/* ---- element-wise ------------------------------------------------------------------------------------------------ */

static void test_relu_gelu(void)
{
    printf("relu / gelu fwd / bwd\n");
    const size_t n = 100003; /* a ragged tail for any vector width or block size */
    char shape[32];
    snprintf(shape, sizeof(shape), "n=%zu", n);
    struct rt_rng r;
    rt_rng_init(&r, SEED, 600);
    float *hx = tu_hfloats(n), *hdy = tu_hfloats(n), *old = tu_hfloats(n);
    fill_normal(&r, hx, n, 0.0f, 2.0f);
    hx[3] = 0.0f;
    hx[4] = -0.0f;
    hx[5] = NAN; /* ReLU lets NaN through (torch.relu), so a non-finite activation stays visible */
    hx[6] = INFINITY;
    hx[7] = -INFINITY;
    fill_normal(&r, hdy, n, 0.0f, 1.0f);
    fill_uniform(&r, old, n, -1, 1);
    struct dual x = d_floats(n), y = d_floats(n), dy = d_floats(n), dx = d_floats(n);
    d_put(&x, hx, n * sizeof(float));
    d_put(&dy, hdy, n * sizeof(float));

    d_fill(&y, n, 7.0f);
    BOTH OP(s, relu_fwd, n, DF(x, s), DF(y, s));
    cmp_flat("relu_fwd", shape, &y, n, T_EXACT);
    struct dual xi = d_floats(n);
    d_put(&xi, hx, n * sizeof(float));
    BOTH OP(s, relu_fwd, n, DF(xi, s), DF(xi, s));
    cmp_flat("relu_fwd in place", shape, &xi, n, T_EXACT);
    d_free(&xi);
    /* backward from each backend's own y (equal: checked above) */
    d_fill(&dx, n, NAN);
    BOTH OP(s, relu_bwd, n, DF(y, s), DF(dy, s), 0.0f, DF(dx, s));
    cmp_flat("relu_bwd beta=0", shape, &dx, n, T_EXACT);
    d_put(&dx, old, n * sizeof(float));
    BOTH OP(s, relu_bwd, n, DF(y, s), DF(dy, s), 1.0f, DF(dx, s));
    cmp_flat("relu_bwd beta=1", shape, &dx, n, T_ELEM);

    /* GELU on finite inputs (the spread reaches both tails) */
    hx[5] = 0.3f;
    hx[6] = 9.5f;
    hx[7] = -9.5f;
    d_put(&x, hx, n * sizeof(float));
    d_fill(&y, n, NAN);
    BOTH OP(s, gelu_fwd, n, DF(x, s), DF(y, s));
    cmp_flat("gelu_fwd", shape, &y, n, T_TRANS);
    d_fill(&dx, n, NAN);
    BOTH OP(s, gelu_bwd, n, DF(x, s), DF(dy, s), 0.0f, DF(dx, s));
    cmp_flat("gelu_bwd beta=0", shape, &dx, n, T_TRANS);
    d_put(&dx, old, n * sizeof(float));
    BOTH OP(s, gelu_bwd, n, DF(x, s), DF(dy, s), 1.0f, DF(dx, s));
    cmp_flat("gelu_bwd beta=1", shape, &dx, n, T_TRANS);

    d_free(&x);
    d_free(&y);
    d_free(&dy);
    d_free(&dx);
    free(hx);
    free(hdy);
    free(old);
}

/*
 * Dropout keys each element on its logical (n, c, h, w) index (compute.h), so
 * the masks must match position for position although the CPU stores
 * spatial tensors blocked (nChw16c) or (C, N, H, W), the fp32 table NCHW and the 16-bit tables
 * NHWC; features (N, F) are row-major everywhere. Spatial cases go in and
 * out through from_nchw / to_nchw, features through upload / download.
 */
static void test_dropout(void)
{
    printf("dropout fwd / bwd (masks bit for bit)\n");
    /* net.c's draws for streams beyond 2^24, whose high part keys Philox (dropout_index.h) */
    const struct rt_dropout_draw far1 = rt_dropout_node_draw(42, (UINT64_C(1) << 24) + 3, 0, 5);
    const struct rt_dropout_draw far2 = rt_dropout_node_draw(UINT64_C(0x9e3779b97f4a7c15), UINT64_MAX, 0, 255);
    const struct {
        struct rt_shape4 sh;
        int spatial;
        float p;
        uint64_t seed, offset;
    } cases[] = {
        {{1, (1 << 20) + 3, 1, 1}, 0, 0.5f, UINT64_C(0x9e3779b97f4a7c15), 0}, /* seed's high word set; ragged tail */
        {{1024, 1024, 1, 1}, 0, 0.1f, 12345, 1000003},                        /* offset not a multiple of 4 */
        {{17, 241, 1, 1}, 0, 0.25f, 1, (UINT64_C(1) << 34) + 1},              /* counter beyond 32 bits */
        {{1, 5, 1, 1}, 0, 0.5f, 77, 6},                                       /* fewer than a Philox block */
        {{5, 64, 12, 12}, 1, 0.25f, 42, (UINT64_C(3) << 56) + 5},             /* mnist-net's dropout1 */
        {{3, 5, 7, 9}, 1, 0.5f, UINT64_C(0x9e3779b97f4a7c15), 1000003},       /* odd sizes */
        {{1, 3, 13, 11}, 1, 0.3f, 9, 2},                                      /* batch 1 */
        {{4, 1, 28, 28}, 1, 0.3f, 10, 3},                                     /* one channel */
        {{6, 7, 1, 1}, 1, 0.3f, 11, 0},                                       /* 1x1 planes */
        {{4, 64, 4, 4}, 1, 0.0f, 3, 11},                                      /* p = 0: the identity */
        {{5, 64, 12, 12}, 1, 0.25f, far1.seed, far1.offset},                  /* stream 2^24 + 3's dropout1 */
        {{7, 37, 1, 1}, 0, 0.5f, far2.seed, far2.offset},                     /* the last stream, node 255 */
    };
    size_t nmax = 0;
    for (size_t k = 0; k < RT_ARRAY_LEN(cases); k++)
        nmax = RT_MAX(nmax, count4(cases[k].sh));
    struct rt_rng r;
    rt_rng_init(&r, SEED, 700);
    float *hx = tu_hfloats(nmax), *hdy = tu_hfloats(nmax), *old = tu_hfloats(nmax), *a = tu_hfloats(nmax), *b = tu_hfloats(nmax);
    fill_normal(&r, hx, nmax, 0.0f, 1.0f);
    fill_normal(&r, hdy, nmax, 0.0f, 1.0f);
    avoid_zero(hx, nmax);
    avoid_zero(hdy, nmax);
    fill_uniform(&r, old, nmax, -1, 1);
    struct dual x = d_floats(nmax), y = d_floats(nmax), dy = d_floats(nmax), dx = d_floats(nmax);
    for (size_t k = 0; k < RT_ARRAY_LEN(cases); k++) {
        const struct rt_shape4 sh = cases[k].sh;
        const int sp = cases[k].spatial;
        const size_t len = count4(sh);
        const float p = cases[k].p;
        const uint64_t seed = cases[k].seed, off = cases[k].offset;
        char shape[128];
        snprintf(shape, sizeof(shape), "%s (%d,%d,%d,%d) p=%.2f seed %#llx offset %llu", sp ? "spatial" : "features",
                 sh.n, sh.c, sh.h, sh.w, (double)p, (unsigned long long)seed, (unsigned long long)off);
        /* every array in host NCHW (logical) order, whatever the backend keeps */
        if (sp) {
            d_put_sp(&x, sh, hx);
            d_put_sp(&dy, sh, hdy);
        } else {
            d_put(&x, hx, len * sizeof(float));
            d_put(&dy, hdy, len * sizeof(float));
        }
        d_fill(&y, len, NAN);
        BOTH OP(s, dropout_fwd, sh, sp, p, seed, off, NULL, DF(x, s), DF(y, s));
        if (sp)
            d_get_sp(&y, sh, a, b);
        else
            d_get(&y, a, b, len * sizeof(float));
        cmp_mask("dropout_fwd", shape, a, b, len);
        compare("dropout_fwd values", shape, a, b, len, T_ELEM);
        /* The draw made on the device from a stream there (a graph's replay): the CPU's host draw for that stream
         * and node, bit for bit */
        {
            const uint64_t stream = seed ^ 0x5eedu, node = (uint64_t)(k % 200);
            const struct rt_dropout_draw dr = rt_dropout_node_draw(seed, stream, (uint32_t)off, (unsigned)node);
            struct dual sd = d_floats(2), z = d_floats(len);
            d_put(&sd, &stream, sizeof(stream));
            OP(CPU, dropout_fwd, sh, sp, p, dr.seed, dr.offset, NULL, DF(x, CPU), DF(z, CPU));
            OP(GPU, dropout_fwd, sh, sp, p, seed, (uint64_t)(uint32_t)off + (node << 56), (const uint64_t *)sd.p[GPU],
               DF(x, GPU), DF(z, GPU));
            float *host_drawn = tu_hfloats(len), *dev_drawn = tu_hfloats(len);
            d_get_logical(&z, sp, sh, host_drawn, dev_drawn);
            cmp_mask("dropout_fwd, stream on the device", shape, host_drawn, dev_drawn, len);
            free(host_drawn);
            free(dev_drawn);
            d_free(&z);
            d_free(&sd);
        }
        /* backward regenerates the same mask: compare it with the CUDA forward's mask too */
        float *fwd_gpu = tu_hfloats(len);
        memcpy(fwd_gpu, b, len * sizeof(float));
        d_fill(&dx, len, NAN);
        BOTH OP(s, dropout_bwd, sh, sp, p, seed, off, NULL, DF(dy, s), 0.0f, DF(dx, s));
        if (sp)
            d_get_sp(&dx, sh, a, b);
        else
            d_get(&dx, a, b, len * sizeof(float));
        cmp_mask("dropout_bwd beta=0", shape, a, b, len);
        cmp_mask("dropout_bwd vs cuda fwd", shape, fwd_gpu, b, len);
        compare("dropout_bwd beta=0 values", shape, a, b, len, T_ELEM);
        free(fwd_gpu);
        if (sp) {
            d_put_sp(&dx, sh, old);
        } else {
            d_put(&dx, old, len * sizeof(float));
        }
        BOTH OP(s, dropout_bwd, sh, sp, p, seed, off, NULL, DF(dy, s), 1.0f, DF(dx, s));
        if (sp)
            cmp_sp("dropout_bwd beta=1", shape, &dx, sh, T_ELEM);
        else
            cmp_flat("dropout_bwd beta=1", shape, &dx, len, T_ELEM);

        /*
         * The 16-bit tables (NHWC spatial tensors) against the fp32 CPU, masks
         * only, on ones: a normal fp32 input could round to a 16-bit zero.
         * Their buffers fit in the GPU side of dy (in) and dx (out).
         */
        for (int t = 0; t < 2; t++) {
            const enum rt_dtype act = t ? RT_F16 : RT_BF16;
            const struct rt_ops *o16 = rt_backend_ops_for(S[GPU].be, act);
            if (!o16)
                continue;
            char op[64];
            snprintf(op, sizeof(op), "dropout_fwd %s", rt_dtype_name(act));
            float *ones = tu_hfloats(len);
            fill_const(ones, len, 1.0f);
            uint16_t *h16 = tu_xmalloc(len * sizeof(uint16_t));
            if (sp) {
                o16->from_nchw(S[GPU].st, sh, ones, DF(dy, GPU));
                OP(CPU, from_nchw, sh, ones, DF(y, CPU));
            } else {
                for (size_t i = 0; i < len; i++)
                    h16[i] = (uint16_t)(act == RT_BF16 ? 0x3f80u : 0x3c00u); /* 1.0 */
                o16->upload(S[GPU].st, DF(dy, GPU), h16, len * sizeof(uint16_t));
                OP(CPU, upload, DF(y, CPU), ones, len * sizeof(float));
            }
            o16->dropout_fwd(S[GPU].st, sh, sp, p, seed, off, NULL, DF(dy, GPU), DF(dx, GPU));
            OP(CPU, dropout_fwd, sh, sp, p, seed, off, NULL, DF(y, CPU), DF(dx, CPU));
            if (sp) {
                o16->to_nchw(S[GPU].st, sh, DF(dx, GPU), b);
                OP(CPU, to_nchw, sh, DF(dx, CPU), a);
            } else {
                o16->download(S[GPU].st, h16, DF(dx, GPU), len * sizeof(uint16_t));
                OP(CPU, download, a, DF(dx, CPU), len * sizeof(float));
            }
            BOTH S[s].ops->sync(S[s].st);
            if (!sp)
                for (size_t i = 0; i < len; i++)
                    b[i] = (h16[i] & 0x7fffu) ? 1.0f : 0.0f; /* only zero or not matters */
            cmp_mask(op, shape, a, b, len);
            free(ones);
            free(h16);
        }
    }
    d_free(&x);
    d_free(&y);
    d_free(&dy);
    d_free(&dx);
    free(hx);
    free(hdy);
    free(old);
    free(a);
    free(b);
}

static void test_blas1(void)
{
    printf("add / scale / axpy\n");
    const size_t n = 100003;
    char shape[32];
    snprintf(shape, sizeof(shape), "n=%zu", n);
    struct rt_rng r;
    rt_rng_init(&r, SEED, 800);
    float *ha = tu_hfloats(n), *hb = tu_hfloats(n);
    fill_normal(&r, ha, n, 0.0f, 1.0f);
    fill_normal(&r, hb, n, 1.0f, 2.0f);
    struct dual a = d_floats(n), b = d_floats(n), y = d_floats(n);
    d_put(&a, ha, n * sizeof(float));
    d_put(&b, hb, n * sizeof(float));
    /* add and scale are one IEEE operation per element: no contraction can change them */
    d_fill(&y, n, NAN);
    BOTH OP(s, add, n, DF(a, s), DF(b, s), DF(y, s));
    cmp_flat("add", shape, &y, n, T_EXACT);
    BOTH OP(s, add, n, DF(y, s), DF(b, s), DF(y, s));
    cmp_flat("add in place (y = y + b)", shape, &y, n, T_EXACT);
    BOTH OP(s, scale, n, -0.75f, DF(y, s));
    cmp_flat("scale alpha=-0.75", shape, &y, n, T_EXACT);
    BOTH OP(s, scale, n, 0.0f, DF(y, s));
    cmp_flat("scale alpha=0", shape, &y, n, T_EXACT);
    d_put(&y, hb, n * sizeof(float));
    BOTH OP(s, axpy, n, 0.37f, DF(a, s), DF(y, s));
    cmp_flat("axpy alpha=0.37", shape, &y, n, T_ELEM);
    BOTH OP(s, axpy, n, -1.0f, DF(b, s), DF(y, s));
    cmp_flat("axpy alpha=-1", shape, &y, n, T_ELEM);
    /* the residual add and its ReLU in one op: one rounding then a select, and backward a select into each
     * gradient (stored, or added once): exact on every backend */
    if (S[CPU].ops->add_relu && S[GPU].ops->add_relu) {
        struct dual g = d_floats(n), dxa = d_floats(n), dxb = d_floats(n);
        d_fill(&y, n, NAN);
        BOTH OP(s, add_relu_fwd, n, DF(a, s), DF(b, s), DF(y, s));
        cmp_flat("add_relu_fwd", shape, &y, n, T_EXACT);
        d_put(&g, ha, n * sizeof(float));
        d_fill(&dxa, n, NAN); /* beta 0 must not read it */
        d_put(&dxb, hb, n * sizeof(float));
        BOTH OP(s, add_relu_bwd, n, DF(y, s), DF(g, s), 0.0f, DF(dxa, s), 1.0f, DF(dxb, s));
        cmp_flat("add_relu_bwd dxa beta=0", shape, &dxa, n, T_EXACT);
        cmp_flat("add_relu_bwd dxb beta=1", shape, &dxb, n, T_EXACT);
        d_put(&dxb, hb, n * sizeof(float));
        BOTH OP(s, add_relu_bwd, n, DF(y, s), DF(g, s), 0.0f, NULL, 1.0f, DF(dxb, s));
        cmp_flat("add_relu_bwd dxa NULL, dxb beta=1", shape, &dxb, n, T_EXACT);
        d_free(&g);
        d_free(&dxa);
        d_free(&dxb);
    } else {
        printf("  add_relu: not fused by the %s table (add_relu 0): not compared\n",
               S[CPU].ops->add_relu ? S[GPU].name : S[CPU].name);
    }
    d_free(&a);
    d_free(&b);
    d_free(&y);
    free(ha);
    free(hb);
}

/* ---- cross-entropy ------------------------------------------------------------------------------------------------- */

static void test_xent_case(int n, int k, float eps, int with_grad, uint64_t stream)
{
    char shape[96];
    snprintf(shape, sizeof(shape), "logits(%d,%d) eps=%.1f%s", n, k, (double)eps, with_grad ? "" : " no dlogits");
    const size_t nz = (size_t)n * k;
    struct rt_rng r;
    rt_rng_init(&r, SEED, stream);
    float *hz = tu_hfloats(nz);
    int32_t *lab = tu_xmalloc((size_t)n * sizeof(int32_t));
    fill_normal(&r, hz, nz, 0.0f, 3.0f);
    int valid = 0;
    for (int i = 0; i < n; i++) {
        lab[i] = (int32_t)rt_rng_below(&r, (uint32_t)k);
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
        hz[1] = mx + 1.0f;
        hz[2] = mx + 1.0f;
        lab[0] = 2;
    }
    const float gs = valid ? 1.0f / (float)valid : 1.0f;
    struct dual z = d_floats(nz), l = d_alloc((size_t)n * sizeof(int32_t)), st = d_alloc(sizeof(struct rt_loss_stats)),
                dz = d_floats(nz);
    d_put(&z, hz, nz * sizeof(float));
    d_put(&l, lab, (size_t)n * sizeof(int32_t));
    const struct rt_loss_stats start = {1.5f, 2.0f, 3.0f}; /* the op adds to what is there */
    d_put(&st, &start, sizeof(start));
    d_fill(&dz, nz, NAN); /* padding rows must be written as zeros */
    BOTH OP(s, xent_fwd_bwd, n, k, DF(z, s), (const int32_t *)l.p[s], eps, gs, NULL, (struct rt_loss_stats *)st.p[s],
            with_grad ? DF(dz, s) : NULL);
    struct rt_loss_stats got[2];
    d_get(&st, &got[0], &got[1], sizeof(struct rt_loss_stats));
    compare("xent loss_sum (+= 1.5)", shape, &got[0].loss_sum, &got[1].loss_sum, 1, T_LOSS);
    compare("xent correct (+= 2)", shape, &got[0].correct, &got[1].correct, 1, T_EXACT);
    compare("xent count (+= 3)", shape, &got[0].count, &got[1].count, 1, T_EXACT);
    CHECKF(got[0].count == 3.0f + (float)valid, "xent %s: cpu count %g, want %d", shape, (double)got[0].count,
           3 + valid);
    if (with_grad)
        cmp_flat("xent dlogits", shape, &dz, nz, T_TRANS);
    d_free(&z);
    d_free(&l);
    d_free(&st);
    d_free(&dz);
    free(hz);
    free(lab);
}

static void test_xent(void)
{
    printf("xent_fwd_bwd\n");
    uint64_t stream = 900;
    static const int shapes[][2] = {{37, 10}, {4, 1000}, {64, 100}, {1, 10}};
    for (size_t i = 0; i < RT_ARRAY_LEN(shapes); i++)
        for (int e = 0; e < 2; e++)
            test_xent_case(shapes[i][0], shapes[i][1], e ? 0.1f : 0.0f, 1, stream++);
    test_xent_case(37, 10, 0.1f, 0, stream++);
}

/* ---- reductions -------------------------------------------------------------------------------------------------------- */

static void test_reductions(void)
{
    printf("sumsq / count_nonfinite\n");
    struct rt_rng r;
    rt_rng_init(&r, SEED, 1000);
    const size_t big = ((size_t)1 << 21) + 5;
    float *hx = tu_hfloats(big);
    fill_normal(&r, hx, big, 0.0f, 1.0f);
    hx[0] = 4096.0f; /* 2^24 first: a float accumulator would then lose every 1 */
    struct dual x = d_floats(big), out = d_floats(1);
    static const size_t sizes[] = {1, 1000, 65537, ((size_t)1 << 21) + 5};
    d_put(&x, hx, big * sizeof(float));
    for (size_t k = 0; k < RT_ARRAY_LEN(sizes); k++) {
        char shape[32];
        snprintf(shape, sizeof(shape), "n=%zu", sizes[k]);
        d_fill(&out, 1, NAN);
        BOTH OP(s, sumsq, sizes[k], DF(x, s), DF(out, s));
        cmp_flat("sumsq", shape, &out, 1, T_SUMSQ);
    }

    /* NaN and Inf planted at the ends, at block-like boundaries and in between; FLT_MAX and
     * subnormals are finite */
    static const size_t pos[] = {0, 1, 255, 256, 1023, 1024, 65535, 65536, 99991, ((size_t)1 << 21) + 4};
    for (size_t i = 0; i < RT_ARRAY_LEN(pos); i++)
        hx[pos[i]] = i % 3 == 0 ? NAN : i % 3 == 1 ? INFINITY : -INFINITY;
    hx[7] = FLT_MAX;
    hx[8] = -FLT_MAX;
    hx[9] = 1e-45f;
    hx[10] = bitsf(0xffc00001u); /* a negative NaN with a payload */
    d_put(&x, hx, big * sizeof(float));
    for (size_t k = 0; k < RT_ARRAY_LEN(sizes); k++) {
        char shape[48];
        size_t want = 0;
        for (size_t i = 0; i < sizes[k]; i++)
            want += !isfinite(hx[i]);
        snprintf(shape, sizeof(shape), "n=%zu (%zu planted)", sizes[k], want);
        d_fill(&out, 1, NAN);
        BOTH OP(s, count_nonfinite, sizes[k], DF(x, s), DF(out, s));
        float got[2];
        d_get(&out, &got[0], &got[1], sizeof(float));
        compare("count_nonfinite", shape, &got[0], &got[1], 1, T_EXACT);
        CHECKF(got[0] == (float)want, "count_nonfinite %s: cpu says %g", shape, (double)got[0]);
    }

    /* clip_scale: the factor worked out on the device from the squared norm, bit for bit the CPU's (and
     * nothing done below max_norm or for a non-finite norm) */
    printf("clip_scale\n");
    static const float clip_cases[][2] = {{400.0f, 2.0f}, {400.0f, 25.0f}, {INFINITY, 1.0f}, {NAN, 1.0f}};
    const size_t nc = 65537;
    fill_normal(&r, hx, nc, 0.0f, 1.0f);
    struct dual y = d_floats(nc), q = d_floats(1);
    for (size_t c = 0; c < RT_ARRAY_LEN(clip_cases); c++) {
        char shape[64];
        snprintf(shape, sizeof(shape), "n=%zu sumsq %g max_norm %g", nc, (double)clip_cases[c][0],
                 (double)clip_cases[c][1]);
        d_put(&y, hx, nc * sizeof(float));
        d_fill(&q, 1, clip_cases[c][0]);
        BOTH OP(s, clip_scale, nc, DF(q, s), clip_cases[c][1], DF(y, s));
        cmp_flat("clip_scale", shape, &y, nc, T_EXACT);
    }

    /* Loss scaling on the device: unscale_check by a device scale, scaler_update's rule, and an update skipped
     * on the device flag, each bit for bit the CPU's. */
    printf("unscale_check / scaler_update / skipped updates\n");
    struct dual sg = d_floats(2), fl = d_floats(1), m1 = d_floats(nc), gg = d_floats(nc);
    d_fill(&gg, nc, 0.25f);
    d_put(&sg, (float[2]){65536.0f, 0.0f}, 2 * sizeof(float));
    for (int i = 0; i < 40; i++) {
        char shape[48];
        snprintf(shape, sizeof(shape), "step %d", i);
        hx[7] = i % 5 == 1 ? INFINITY : 1.0f; /* an overflow every fifth step */
        d_put(&y, hx, nc * sizeof(float));
        BOTH OP(s, unscale_check, nc, DF(y, s), DF(sg, s), DF(fl, s));
        cmp_flat("unscale_check flag", shape, &fl, 1, T_EXACT);
        BOTH OP(s, scaler_update, DF(sg, s), DF(sg, s) + 1, DF(fl, s), 2.0f, 0.5f, 3);
        cmp_flat("scaler_update scale, good", shape, &sg, 2, T_EXACT);
        d_fill(&m1, nc, 0.5f);
        BOTH OP(s, sgd_update, nc, DF(y, s), DF(gg, s), DF(m1, s), 0.1f, 0.9f, 0.0f, 1e-4f, 0, 0, DF(fl, s));
        cmp_flat("sgd_update under the flag", shape, &y, nc, T_EXACT);
    }
    d_free(&sg);
    d_free(&fl);
    d_free(&m1);
    d_free(&gg);
    d_free(&y);
    d_free(&q);
    d_free(&x);
    d_free(&out);
    free(hx);
}

/* ---- casts ------------------------------------------------------------------------------------------------------------- */

/* Value of a half bit pattern (for building inputs exactly between two halves). */
static double half_value(uint16_t h)
{
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double v = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return (h & 0x8000) ? -v : v;
}

/* Runs cast op (which: 0 f32->f16, 1 f32->bf16) on both backends and compares the bits. */
static void cast_from_f32(int which, const char *op, const char *shape, const float *hx, size_t n)
{
    struct dual x = d_floats(n), y = d_alloc(n * sizeof(uint16_t));
    uint16_t *a = tu_xmalloc(n * sizeof(uint16_t)), *b = tu_xmalloc(n * sizeof(uint16_t));
    d_put(&x, hx, n * sizeof(float));
    if (which == 0)
        BOTH OP(s, cast_f32_f16, n, DF(x, s), (uint16_t *)y.p[s]);
    else
        BOTH OP(s, cast_f32_bf16, n, DF(x, s), (uint16_t *)y.p[s]);
    d_get(&y, a, b, n * sizeof(uint16_t));
    cmp_bits16(op, shape, a, b, n);
    d_free(&x);
    d_free(&y);
    free(a);
    free(b);
}

static void cast_to_f32(int which, const char *op, const char *shape, const uint16_t *hx, size_t n)
{
    struct dual x = d_alloc(n * sizeof(uint16_t)), y = d_floats(n);
    float *a = tu_hfloats(n), *b = tu_hfloats(n);
    d_put(&x, hx, n * sizeof(uint16_t));
    if (which == 0)
        BOTH OP(s, cast_f16_f32, n, (const uint16_t *)x.p[s], DF(y, s));
    else
        BOTH OP(s, cast_bf16_f32, n, (const uint16_t *)x.p[s], DF(y, s));
    d_get(&y, a, b, n * sizeof(float));
    cmp_bits32(op, shape, a, b, n);
    d_free(&x);
    d_free(&y);
    free(a);
    free(b);
}

static void test_casts(void)
{
    printf("casts f32 <-> f16 / bf16 (exact bits)\n");
    struct rt_rng r;
    rt_rng_init(&r, SEED, 1100);
    static const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fbfffffu, 0x7fc00001u,
                                    0xff812345u, 0x7fffffffu, 0x7f802000u, 0xffa00000u};
    const size_t nnan = RT_ARRAY_LEN(nans);
    float fnan[RT_ARRAY_LEN(nans)];
    for (size_t i = 0; i < nnan; i++)
        fnan[i] = bitsf(nans[i]);

    /* f32 -> f16: specials, exact midpoints between neighbouring halves and their float neighbours,
     * random floats over the whole half range and beyond it */
    static const uint32_t special16[] = {
        0x00000000u, 0x80000000u, 0x3f800000u, 0xc0200000u, 0x477fe000u, 0x477fefffu, 0x477ff000u,
        0xc77ff000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x33800000u, 0x33000000u, 0x33000001u,
        0x32ffffffu, 0x33c00000u, 0x34200000u, 0x387fc000u, 0x387fe000u, 0x38800000u, 0x3f801000u,
        0x3f803000u, 0x3dcccccdu, 0x00000001u, 0x80000001u, 0x007fffffu, 0x38000000u, 0x387ff000u,
    };
    const size_t nmid = 20000, nrand = 30000, ns = RT_ARRAY_LEN(special16);
    const size_t n16 = ns + 3 * nmid + nrand;
    float *fx = tu_hfloats(n16);
    size_t j = 0;
    for (size_t i = 0; i < ns; i++)
        fx[j++] = bitsf(special16[i]);
    for (size_t i = 0; i < nmid; i++) {
        const uint16_t h = (uint16_t)rt_rng_below(&r, 0x7bff); /* finite, with a finite successor */
        const float m = (float)((half_value(h) + half_value((uint16_t)(h + 1))) / 2); /* exact in float */
        const float sgn = rt_rng_u32(&r) & 1 ? -1.0f : 1.0f;
        fx[j++] = sgn * m;
        fx[j++] = sgn * nextafterf(m, INFINITY);
        fx[j++] = sgn * nextafterf(m, 0.0f);
    }
    for (size_t i = 0; i < nrand; i++) {
        /* exponents 2^-30 .. 2^17 (subnormal halves, normals, overflow), random mantissa and sign */
        const uint32_t e = 97 + rt_rng_below(&r, 48), mant = rt_rng_u32(&r) & 0x7fffffu;
        fx[j++] = bitsf((rt_rng_u32(&r) & 0x80000000u) | e << 23 | mant);
    }
    char shape[64];
    snprintf(shape, sizeof(shape), "n=%zu (ties, subnormals, overflow, Inf)", n16);
    cast_from_f32(0, "cast_f32_f16", shape, fx, n16);
    snprintf(shape, sizeof(shape), "n=%zu NaNs (quiet, signalling, payloads)", nnan);
    cast_from_f32(0, "cast_f32_f16 NaN", shape, fnan, nnan);

    /* f16 -> f32 and bf16 -> f32: every pattern, NaNs separately */
    uint16_t *all = tu_xmalloc(65536 * sizeof(uint16_t)), *hnan = tu_xmalloc(65536 * sizeof(uint16_t));
    for (int w = 0; w < 2; w++) {
        const uint32_t expmask = w == 0 ? 0x7c00u : 0x7f80u, mantmask = w == 0 ? 0x03ffu : 0x007fu;
        size_t na = 0, nn = 0;
        for (uint32_t i = 0; i < 65536; i++) {
            const int is_nan = (i & expmask) == expmask && (i & mantmask);
            if (is_nan)
                hnan[nn++] = (uint16_t)i;
            else
                all[na++] = (uint16_t)i;
        }
        const char *op = w == 0 ? "cast_f16_f32" : "cast_bf16_f32";
        snprintf(shape, sizeof(shape), "all %zu non-NaN patterns", na);
        cast_to_f32(w, op, shape, all, na);
        char opn[48];
        snprintf(opn, sizeof(opn), "%s NaN", op);
        snprintf(shape, sizeof(shape), "all %zu NaN patterns", nn);
        cast_to_f32(w, opn, shape, hnan, nn);
    }

    /* f32 -> bf16: specials, exact ties (low half 0x8000) and their neighbours, random bit patterns */
    static const uint32_t special_bf[] = {
        0x00000000u, 0x80000000u, 0x3f800000u, 0xc0200000u, 0x3f808000u, 0x3f818000u, 0x3f808001u,
        0x3f807fffu, 0x7f7fffffu, 0x7f7f8000u, 0x7f7effffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,
        0x00000001u, 0x00018000u, 0x00008000u, 0x007fffffu, 0x80008000u,
    };
    const size_t nbs = RT_ARRAY_LEN(special_bf), nties = 20000, nbr = 40000, nbf = nbs + 3 * nties + nbr;
    float *bx = tu_hfloats(nbf);
    j = 0;
    for (size_t i = 0; i < nbs; i++)
        bx[j++] = bitsf(special_bf[i]);
    for (size_t i = 0; i < nties; i++) {
        uint32_t hi;
        do
            hi = rt_rng_u32(&r) & 0xffffu;
        while ((hi & 0x7f80u) == 0x7f80u); /* finite */
        const uint32_t t = hi << 16 | 0x8000u;
        bx[j++] = bitsf(t);
        bx[j++] = bitsf(t + 1);
        bx[j++] = bitsf(t - 1);
    }
    for (size_t i = 0; i < nbr; i++) {
        uint32_t u;
        do
            u = rt_rng_u32(&r);
        while ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)); /* NaNs are tested apart */
        bx[j++] = bitsf(u);
    }
    snprintf(shape, sizeof(shape), "n=%zu (ties, subnormals, FLT_MAX, Inf)", nbf);
    cast_from_f32(1, "cast_f32_bf16", shape, bx, nbf);
    snprintf(shape, sizeof(shape), "n=%zu NaNs (quiet, signalling, payloads)", nnan);
    cast_from_f32(1, "cast_f32_bf16 NaN", shape, fnan, nnan);

    free(fx);
    free(bx);
    free(all);
    free(hnan);
}

/* ---- optimizers --------------------------------------------------------------------------------------------------------- */

static void test_sgd(void)
{
    printf("sgd_update (3 steps)\n");
    static const struct {
        const char *name;
        float lr, momentum, dampening, wd;
        int nesterov;
    } cases[] = {
        {"sgd momentum 0.9", 0.1f, 0.9f, 0.0f, 0.0f, 0},
        {"sgd momentum+dampening+wd", 0.1f, 0.9f, 0.1f, 5e-4f, 0},
        {"sgd nesterov+wd", 0.05f, 0.9f, 0.0f, 1e-4f, 1},
        {"sgd no momentum+wd", 0.1f, 0.0f, 0.0f, 1e-2f, 0},
        {"sgd plain", 0.2f, 0.0f, 0.0f, 0.0f, 0},
    };
    const size_t n = 100003;
    char shape[32];
    snprintf(shape, sizeof(shape), "n=%zu", n);
    struct rt_rng r;
    rt_rng_init(&r, SEED, 1200);
    float *hp = tu_hfloats(n), *hg = tu_hfloats(n);
    struct dual p = d_floats(n), g = d_floats(n), buf = d_floats(n);
    for (size_t c = 0; c < RT_ARRAY_LEN(cases); c++) {
        fill_normal(&r, hp, n, 0.0f, 1.0f);
        d_put(&p, hp, n * sizeof(float));
        d_fill(&buf, n, NAN); /* the first step must not read the buffer */
        const int has_buf = cases[c].momentum != 0.0f;
        for (int step = 1; step <= 3; step++) {
            fill_normal(&r, hg, n, 0.0f, 1.0f);
            d_put(&g, hg, n * sizeof(float));
            BOTH OP(s, sgd_update, n, DF(p, s), DF(g, s), has_buf ? DF(buf, s) : NULL, cases[c].lr,
                    cases[c].momentum, cases[c].dampening, cases[c].wd, cases[c].nesterov, step == 1, NULL);
            if (step == 1) {
                char op[80];
                snprintf(op, sizeof(op), "%s: param (first step)", cases[c].name);
                cmp_flat(op, shape, &p, n, T_OPTIM);
            }
        }
        char op[80];
        snprintf(op, sizeof(op), "%s: param", cases[c].name);
        cmp_flat(op, shape, &p, n, T_OPTIM);
        if (has_buf) {
            snprintf(op, sizeof(op), "%s: momentum_buffer", cases[c].name);
            cmp_flat(op, shape, &buf, n, T_OPTIM);
        }
    }
    d_free(&p);
    d_free(&g);
    d_free(&buf);
    free(hp);
    free(hg);
}

static void test_adam(void)
{
    printf("adam_update (4 steps)\n");
    static const struct {
        const char *name;
        float lr, b1, b2, eps, wd;
        int decoupled;
        int64_t first_step;
    } cases[] = {
        {"adam", 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0, 1},
        {"adam wd", 1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, 0, 1},
        {"adamw wd", 1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, 1, 1},
        {"adamw b1 .3 b2 .99 eps 1e-6", 2e-2f, 0.3f, 0.99f, 1e-6f, 0.1f, 1, 1},
        {"adam from step 1000", 1e-3f, 0.9f, 0.999f, 1e-8f, 5e-4f, 0, 1000},
    };
    const size_t n = 100003;
    char shape[32];
    snprintf(shape, sizeof(shape), "n=%zu", n);
    struct rt_rng r;
    rt_rng_init(&r, SEED, 1300);
    float *hp = tu_hfloats(n), *hg = tu_hfloats(n), *hm = tu_hfloats(n), *hv = tu_hfloats(n);
    struct dual p = d_floats(n), g = d_floats(n), m = d_floats(n), v = d_floats(n);
    for (size_t c = 0; c < RT_ARRAY_LEN(cases); c++) {
        fill_normal(&r, hp, n, 0.0f, 1.0f);
        d_put(&p, hp, n * sizeof(float));
        if (cases[c].first_step == 1) {
            BOTH {
                OP(s, zero, m.p[s], n * sizeof(float));
                OP(s, zero, v.p[s], n * sizeof(float));
            }
        } else { /* resumed: state from earlier steps */
            fill_normal(&r, hm, n, 0.0f, 0.1f);
            for (size_t i = 0; i < n; i++)
                hv[i] = 1e-4f * rt_rng_uniform(&r);
            d_put(&m, hm, n * sizeof(float));
            d_put(&v, hv, n * sizeof(float));
        }
        for (int64_t step = cases[c].first_step; step < cases[c].first_step + 4; step++) {
            fill_normal(&r, hg, n, 0.0f, 1.0f);
            for (size_t i = 0; i < n; i += 10) /* a tenth near eps, where its placement shows */
                hg[i] *= 3.0f * cases[c].eps;
            d_put(&g, hg, n * sizeof(float));
            BOTH OP(s, adam_update, n, DF(p, s), DF(g, s), DF(m, s), DF(v, s), cases[c].lr, cases[c].b1, cases[c].b2,
                    cases[c].eps, cases[c].wd, cases[c].decoupled, step, NULL);
        }
        char op[80];
        snprintf(op, sizeof(op), "%s: param", cases[c].name);
        cmp_flat(op, shape, &p, n, T_OPTIM);
        snprintf(op, sizeof(op), "%s: exp_avg", cases[c].name);
        cmp_flat(op, shape, &m, n, T_OPTIM);
        snprintf(op, sizeof(op), "%s: exp_avg_sq", cases[c].name);
        cmp_flat(op, shape, &v, n, T_OPTIM);
    }
    d_free(&p);
    d_free(&g);
    d_free(&m);
    d_free(&v);
    free(hp);
    free(hg);
    free(hm);
    free(hv);
}

/* ---- whole models -------------------------------------------------------------------------------------------------------- */

/*
 * One RT_TRAIN step of a whole model from the same seed on both sides (the
 * same initial weights, drawn on the host), on a batch of MODEL_N random
 * 3x32x32 images with label smoothing 0.1; then the logits, the mean loss,
 * every parameter's gradient and the batchnorm running statistics are
 * compared with the fp32 CPU's, tensor by tensor (the logits as one
 * tensor), in two ways:
 *   direction  cosine(dev, ref): a layout, index or lane mistake, or a
 *              lost contribution, turns a tensor far from fp32's (a cosine
 *              near 0);
 *   length     |dev| / |ref|: a lost or doubled scale keeps the direction
 *              exactly, and rounding noise, orthogonal to the signal,
 *              moves the length far less than the distance.
 * Plus the whole gradient buffer's direction, the mean loss, and exactly:
 * the sample count, num_batches_tracked and, in fp32, the correct count.
 *
 * Not element by element, as the ops are: a few ulps of difference in an
 * op's output (another summation order) tip a ReLU or a max-pooling choice
 * here and there and send that element's gradient elsewhere. With every op
 * output of the fp32 CPU moved by up to 2 ulps (the fp32 perturbation,
 * below), 0.1-1 % of the elements of some gradient tensors moved by 10-70
 * times the old element-wise bound (2e-3 of the tensor's max) -- at batch
 * 4 in resnet18, at batch 32 in resnet9 and mnist-net -- while every
 * tensor kept a cosine above 0.9999 and its length within 0.3 %.
 *
 * The batch is a training batch's size because batchnorm normalises each
 * channel over N*H*W values, and resnet18's layer4 is 1x1 on 32x32 inputs:
 * at batch 4 it normalises over 4 values, and its backward magnifies every
 * rounding that reaches it (bf16's gradients had a cosine of 0.63 to fp32's
 * at batch 4, 0.87 at batch 32).
 *
 * fp32 on the device: fixed bounds (F32_MIN_COS, F32_MAX_LEN), which the
 * fp32 perturbation must keep with room; the stand-in checks it does.
 *
 * 16-bit on the device (the bf16 and fp16 tables): every activation is
 * rounded to 8 or 11 significant bits at each of ~20 layers and again on
 * the way back; where a deep network's gradient is a small difference of
 * large terms (random images, random weights) that moves whole tensors a
 * long way: bf16's resnet18 gradients have a cosine of only 0.87-0.99 to
 * fp32's, per tensor, with exact fp32 arithmetic on bf16 values. So a
 * 16-bit run is held to what correct 16-bit arithmetic does to the same
 * model, measured in the same run: its floor (the fp32 kernels with 16-bit
 * storage, below). The 16-bit side runs with a loss scale (LOSS_SCALE, as
 * fp16 training does; a power of two, so exact unless something
 * overflows) and unscales with the fp32 table's unscale_check, which must
 * find no overflow. Planted faults (further below) show that the checks
 * still catch real mistakes.
 */
enum { MODEL_N = 32, MODEL_C = 3, MODEL_H = 32, MODEL_W = 32, MODEL_K = 10 };
#define LOSS_SCALE 1024.0f

/* What one training step of a model left, on the host. */
struct model_run {
    size_t np, nbuf;
    int nt;
    struct rt_tensor_info *tab; /* a copy of the model's table */
    float *params0, *bufs0;     /* before the step */
    float *logits, *grads, *bufs;
    struct rt_loss_stats st;
    int64_t tracked;
    int overflow;               /* with a loss scale: unscale_check found a non-finite gradient */
};

static void model_run_free(struct model_run *r)
{
    free(r->tab);
    free(r->params0);
    free(r->bufs0);
    free(r->logits);
    free(r->grads);
    free(r->bufs);
    memset(r, 0, sizeof(*r));
}

/*
 * One step of `name` on side s with `act` activations, built on `table`
 * (NULL: the backend's own table for act), its loss's gradient scaled by
 * loss_scale and the gradients unscaled after. 0, or -1 after a failed
 * check.
 */
static int model_run(int s, const char *name, int dropout, enum rt_dtype act, const struct rt_ops *table,
                     float loss_scale, struct model_run *out)
{
    memset(out, 0, sizeof(*out));
    const struct rt_model_opts mo = {.name = name, .c = MODEL_C, .h = MODEL_H, .w = MODEL_W, .classes = MODEL_K,
                                     .batch = MODEL_N, .seed = SEED, .act = act, .ops = table};
    struct rt_model *m = NULL;
    if (rt_model_create(S[s].be, &mo, &m) < 0) {
        CHECKF(0, "%s: rt_model_create %s %s: %s", S[s].name, name, rt_dtype_name(act), rt_errmsg());
        return -1;
    }
    const struct rt_tensor_info *tab = rt_model_tensors(m, &out->nt);
    out->tab = tu_xmalloc((size_t)out->nt * sizeof(*tab));
    memcpy(out->tab, tab, (size_t)out->nt * sizeof(*tab));
    const size_t np = out->np = rt_model_param_count(m), nb = out->nbuf = rt_model_buffer_count(m);
    out->params0 = tu_hfloats(np);
    out->grads = tu_hfloats(np);
    out->bufs0 = tu_hfloats(nb + 1);
    out->bufs = tu_hfloats(nb + 1);
    out->logits = tu_hfloats((size_t)MODEL_N * MODEL_K);
    rt_model_read(m, RT_MODEL_PARAMS, 0, np, out->params0);
    rt_model_read(m, RT_MODEL_BUFFERS, 0, nb, out->bufs0);
    rt_model_zero_grads(m);

    struct rt_rng r;
    rt_rng_init(&r, SEED, 1400);
    int32_t labels[MODEL_N];
    uint8_t *img = tu_random_batch(&r, MODEL_N, MODEL_C, MODEL_H, MODEL_W, MODEL_K, labels);
    const struct rt_step_opts so = {.mode = RT_TRAIN, .label_smoothing = 0.1f, .grad_scale = loss_scale / MODEL_N,
                                    .dropout_offset = dropout ? 12345 : 0, .no_dropout = !dropout,
                                    .mean = TU_CIFAR_MEAN, .std = TU_CIFAR_STD};
    const int rc = rt_model_step(m, &so, MODEL_N, img, labels, &out->st);
    CHECKF(rc == 0, "%s %s %s: rt_model_step: %s", S[s].name, name, rt_dtype_name(act), rt_errmsg());
    if (rc == 0 && loss_scale != 1.0f) {
        const struct rt_ops *o32 = rt_backend_ops(S[s].be);
        float *found = o32->alloc(S[s].be, 2 * sizeof(float)), f = 1.0f;
        CHECKF(found != NULL, "%s: alloc: %s", S[s].name, rt_errmsg());
        if (found) {
            o32->upload(S[s].st, found + 1, &loss_scale, sizeof(float)); /* the scale, a device float */
            o32->unscale_check(S[s].st, np, rt_model_grads(m), found + 1, found);
            o32->download(S[s].st, &f, found, sizeof(f));
            o32->sync(S[s].st);
            o32->free(S[s].be, found);
        }
        out->overflow = f != 0.0f;
    }
    rt_model_logits(m, out->logits, MODEL_N);
    rt_model_read(m, RT_MODEL_GRADS, 0, np, out->grads);
    rt_model_read(m, RT_MODEL_BUFFERS, 0, nb, out->bufs);
    out->tracked = rt_model_batches_tracked(m);
    free(img);
    rt_model_destroy(m);
    return rc == 0 ? 0 : -1;
}

/* Both runs built the same tensor table, from the same initial weights and statistics (bit for bit). */
static int same_start(const char *label, const struct model_run *ref, const struct model_run *dev)
{
    int same = ref->nt == dev->nt && ref->np == dev->np && ref->nbuf == dev->nbuf;
    for (int i = 0; same && i < ref->nt; i++)
        same = !strcmp(ref->tab[i].name, dev->tab[i].name) && ref->tab[i].kind == dev->tab[i].kind &&
               ref->tab[i].offset == dev->tab[i].offset && ref->tab[i].count == dev->tab[i].count;
    CHECKF(same, "%s: the tensor tables of the two sides differ", label);
    if (!same)
        return -1;
    char op[96], shape[96];
    snprintf(op, sizeof(op), "%s initial params", label);
    snprintf(shape, sizeof(shape), "%zu params, seed %llu", ref->np, (unsigned long long)SEED);
    compare(op, shape, ref->params0, dev->params0, ref->np, T_EXACT);
    snprintf(op, sizeof(op), "%s initial buffers", label);
    snprintf(shape, sizeof(shape), "%zu floats", ref->nbuf);
    compare(op, shape, ref->bufs0, dev->bufs0, ref->nbuf, T_EXACT);
    return 0;
}

/* ---- the bounds ------------------------------------------------------------------------------------------------------- */

/*
 * fp32: per tensor, cosine >= F32_MIN_COS and | |dev|/|ref| - 1 | <=
 * F32_MAX_LEN; the mean loss within F32_MAX_LOSS relative. The fp32
 * perturbation reached 1 - cosine 1e-5 and lengths 7e-4 from 1 at batch 32
 * (1e-4 and 3e-3 at batch 64): ten and three times inside.
 *
 * 16-bit, against the floor of the same model and type:
 *   1 - cosine(dev, ref) <= COS_K (1 - cosine(floor, ref)) + COS_SLACK
 *   | |dev|/|ref| - 1 |   <= LEN_K |floor - ref| / |ref| + LEN_SLACK
 *   the mean loss's relative difference <= LOSS_K the floor's + LOSS_SLACK.
 * The factors leave room for a GPU that rounds at the same points but sums
 * in other orders and rounds its weight gradients to 16 bits once more
 * (nhwc16.cu): the CPU's bf16 table, at the floor by construction, came
 * within 1.3 times the floor's 1 - cosine and 0.07 of length 1 (AMD EPYC,
 * Zen 4). A floor too far from fp32 to judge by (a tensor's cosine below
 * FLOOR_MIN_COS) fails the test: the set-up no longer discriminates.
 */
#define F32_MIN_COS 0.999
#define F32_MAX_LEN 0.01
#define F32_MAX_LOSS 1e-5
#define COS_K 3.0
#define COS_SLACK 0.002
#define LEN_K 0.5
#define LEN_SLACK 0.02
#define LOSS_K 3.0
#define LOSS_SLACK 1e-3
#define FLOOR_MIN_COS 0.8

/* Which checks of a model failed (bits of model_compare's result). */
enum model_check {
    CHK_LOGITS = 1u << 0,
    CHK_LOSS = 1u << 1,
    CHK_GRADS = 1u << 2,
    CHK_STATS = 1u << 3,
    CHK_COUNTS = 1u << 4, /* sample count, num_batches_tracked, the correct count in fp32, an overflow */
};

static const char *check_names(unsigned fails, char *buf, size_t len)
{
    static const char *const names[] = {"logits", "loss", "grads", "running stats", "counts"};
    buf[0] = 0;
    for (size_t i = 0; i < RT_ARRAY_LEN(names); i++)
        if (fails & (1u << i))
            snprintf(buf + strlen(buf), len - strlen(buf), "%s%s", buf[0] ? ", " : "", names[i]);
    return buf[0] ? buf : "none";
}

/* How a vector compares with the reference: cosine, |v| / |ref| and |v - ref| / |ref|, in double. */
struct vsim {
    double cos, len, dist;
};

static struct vsim vsim(const float *ref, const float *v, size_t n)
{
    double rv = 0, rr = 0, vv = 0, dd = 0;
    for (size_t i = 0; i < n; i++) {
        const double a = ref[i], b = v[i];
        rv += a * b;
        rr += a * a;
        vv += b * b;
        dd += (a - b) * (a - b);
    }
    if (!isfinite(rv) || !isfinite(vv) || !isfinite(dd)) /* a NaN or Inf: as far as can be */
        return (struct vsim){-1.0, INFINITY, INFINITY};
    if (rr == 0) /* two zero vectors are the same; anything else is infinitely far from zero */
        return vv == 0 ? (struct vsim){1.0, 1.0, 0.0} : (struct vsim){0.0, INFINITY, INFINITY};
    return (struct vsim){vv > 0 ? rv / sqrt(rr * vv) : 0.0, sqrt(vv / rr), sqrt(dd / rr)};
}

/* One tensor's verdict: its numbers, the floor's, the bounds, and how near them it came (1 = at a bound). */
struct tverdict {
    struct vsim dev, floor;
    int has_floor;
    double cos_bound, len_bound, nearness;
    int ok;
};

/* dev against ref, held to the floor's bounds (floor != NULL) or to the fp32 ones. */
static struct tverdict tverdict(const float *ref, const float *floor, const float *dev, size_t n)
{
    struct tverdict t = {.dev = vsim(ref, dev, n), .has_floor = floor != NULL};
    if (floor) {
        t.floor = vsim(ref, floor, n);
        t.cos_bound = 1.0 - (COS_K * (1.0 - t.floor.cos) + COS_SLACK);
        t.len_bound = LEN_K * t.floor.dist + LEN_SLACK;
    } else {
        t.cos_bound = F32_MIN_COS;
        t.len_bound = F32_MAX_LEN;
    }
    const double rc = (1.0 - t.dev.cos) / (1.0 - t.cos_bound), rl = fabs(t.dev.len - 1.0) / t.len_bound;
    t.nearness = isfinite(rc) && isfinite(rl) ? fmax(rc, rl) : INFINITY;
    t.ok = t.dev.cos >= t.cos_bound && fabs(t.dev.len - 1.0) <= t.len_bound;
    return t;
}

static void tverdict_text(const struct tverdict *t, char *buf, size_t len)
{
    if (t->has_floor)
        snprintf(buf, len, "cosine %.5f (floor %.5f, >= %.4f), length %.4f (floor %.4f, 1 +- %.3f)", t->dev.cos,
                 t->floor.cos, t->cos_bound, t->dev.len, t->floor.len, t->len_bound);
    else
        snprintf(buf, len, "cosine %.7f (>= %g), length %.6f (1 +- %g)", t->dev.cos, t->cos_bound, t->dev.len,
                 t->len_bound);
}

static void check_line(const char *label, const char *what, const char *detail, int ok)
{
    printf("  %-30s %-13s %s  %s\n", label, what, detail, ok ? "ok" : "FAIL");
}

/* The runs of one comparison: the fp32 CPU reference, the floor (NULL for fp32), the device's. */
struct model_runs {
    const char *label;
    const struct model_run *ref, *floor, *dev;
};

/*
 * Every tensor of `kind`, each by tverdict; one line naming the tensor that
 * came nearest its bounds, one on stderr for each of the first that failed.
 * Returns how many failed; adds to *floor_bad those whose floor was below
 * FLOOR_MIN_COS.
 */
static int check_tensors(const struct model_runs *r, const char *what, enum rt_param_kind kind, int *floor_bad)
{
    const float *a = kind == RT_PARAM ? r->ref->grads : r->ref->bufs;
    const float *b = kind == RT_PARAM ? r->dev->grads : r->dev->bufs;
    const float *f = !r->floor ? NULL : kind == RT_PARAM ? r->floor->grads : r->floor->bufs;
    struct tverdict nearest = {.nearness = -1.0};
    const char *nearest_name = "-";
    int bad = 0, n = 0;
    char text[256];
    for (int i = 0; i < r->ref->nt; i++) {
        const struct rt_tensor_info *e = &r->ref->tab[i];
        if (e->kind != kind)
            continue;
        n++;
        const struct tverdict t = tverdict(a + e->offset, f ? f + e->offset : NULL, b + e->offset, e->count);
        if (!t.ok && bad++ < 4) {
            tverdict_text(&t, text, sizeof(text));
            fprintf(stderr, "    %s %s %s: %s\n", r->label, what, e->name, text);
        }
        if (f && t.floor.cos < FLOOR_MIN_COS && (*floor_bad)++ < 4)
            fprintf(stderr, "    %s %s %s: the floor's cosine %.4f is below %g\n", r->label, what, e->name,
                    t.floor.cos, FLOOR_MIN_COS);
        if (t.nearness > nearest.nearness) {
            nearest = t;
            nearest_name = e->name;
        }
    }
    char detail[512];
    tverdict_text(&nearest, text, sizeof(text));
    snprintf(detail, sizeof(detail), "%d tensors, %d outside; nearest its bounds %s: %s", n, bad, nearest_name, text);
    check_line(r->label, what, detail, bad == 0);
    return bad;
}

/* The device's run against the reference (as far as the floor, if any); returns the enum model_check bits that
 * failed. */
static unsigned model_compare(const struct model_runs *r)
{
    const struct model_run *ref = r->ref, *fl = r->floor, *dev = r->dev;
    unsigned fails = 0;
    int floor_bad = 0;
    char text[256], detail[512];

    const struct tverdict lg = tverdict(ref->logits, fl ? fl->logits : NULL, dev->logits, (size_t)MODEL_N * MODEL_K);
    tverdict_text(&lg, text, sizeof(text));
    snprintf(detail, sizeof(detail), "(%d,%d): %s", MODEL_N, MODEL_K, text);
    check_line(r->label, "logits", detail, lg.ok);
    fails |= lg.ok ? 0 : CHK_LOGITS;
    floor_bad += fl && lg.floor.cos < FLOOR_MIN_COS;

    const double l32 = ref->st.loss_sum / ref->st.count, ldev = dev->st.loss_sum / dev->st.count;
    const double dl = fabs(ldev - l32) / fabs(l32);
    const double dlf = fl ? fabs(fl->st.loss_sum / fl->st.count - l32) / fabs(l32) : 0.0;
    const double bl = fl ? LOSS_K * dlf + LOSS_SLACK : F32_MAX_LOSS;
    int ok = dl <= bl;
    if (fl)
        snprintf(detail, sizeof(detail), "fp32 %.6f, here %.6f: relative difference %.3g (floor %.3g, <= %.3g)", l32,
                 ldev, dl, dlf, bl);
    else
        snprintf(detail, sizeof(detail), "fp32 %.7f, here %.7f: relative difference %.3g (<= %g)", l32, ldev, dl, bl);
    check_line(r->label, "mean loss", detail, ok);
    fails |= ok ? 0 : CHK_LOSS;

    const struct tverdict whole = tverdict(ref->grads, fl ? fl->grads : NULL, dev->grads, ref->np);
    ok = whole.dev.cos >= whole.cos_bound;
    if (fl)
        snprintf(detail, sizeof(detail), "%zu floats: cosine %.5f (floor %.5f, >= %.4f)", ref->np, whole.dev.cos,
                 whole.floor.cos, whole.cos_bound);
    else
        snprintf(detail, sizeof(detail), "%zu floats: cosine %.7f (>= %g)", ref->np, whole.dev.cos, whole.cos_bound);
    check_line(r->label, "grads, whole", detail, ok);
    fails |= ok ? 0 : CHK_GRADS;
    if (check_tensors(r, "grads", RT_PARAM, &floor_bad))
        fails |= CHK_GRADS;
    if (ref->nbuf && check_tensors(r, "running stats", RT_BUFFER, &floor_bad))
        fails |= CHK_STATS;

    /* In 16 bits a logit may tip an argmax that was a near tie: the correct count is compared in fp32 only. */
    ok = dev->st.count == ref->st.count && dev->tracked == ref->tracked && !dev->overflow &&
         (fl || dev->st.correct == ref->st.correct);
    snprintf(detail, sizeof(detail), "loss over %g samples (fp32 %g), %g correct (fp32 %g), num_batches_tracked %lld "
             "(fp32 %lld), %s", (double)dev->st.count, (double)ref->st.count, (double)dev->st.correct,
             (double)ref->st.correct, (long long)dev->tracked, (long long)ref->tracked,
             dev->overflow ? "gradients overflowed at the loss scale" : "no overflow");
    check_line(r->label, "counts", detail, ok);
    fails |= ok ? 0 : CHK_COUNTS;

    /* A floor too far from fp32 makes every bound loose: the set-up, not the table, is then at fault. */
    if (fl)
        CHECKF(floor_bad == 0 && !fl->overflow, "%s: the floor is too far from fp32 to judge by (%d tensors below "
               "cosine %g%s)", r->label, floor_bad, FLOOR_MIN_COS, fl->overflow ? ", an overflow" : "");
    return fails;
}

/* ---- the rounding tables: the floor, and the fp32 perturbation ------------------------------------------------- */

/*
 * What correct 16-bit arithmetic does to a model, measured without any
 * 16-bit kernel (the floor): the CPU's fp32 table with every activation and
 * activation gradient an op writes rounded to the 16-bit type (through the
 * fp32 table's own casts, which test_casts checks bit for bit against the
 * GPU's), and the weights of the convolutions and linear layers rounded
 * before use, as the 16-bit tables cast them (autocast); parameter
 * gradients, batchnorm statistics and every sum stay fp32. Exact fp32
 * arithmetic on 16-bit values: a correct 16-bit table differs from fp32 by
 * about as much. The CPU's bf16 table sits at it (AMD EPYC, Zen 4: per
 * tensor, cosines within 0.02 of the floor's).
 *
 * The fp32 perturbation: the same table with every op output and weight
 * moved to the nearest value with its last two mantissa bits zero (up to 2
 * ulps): another correct fp32 implementation, summing in another order,
 * as cuDNN's algorithms do; the stand-in's fp32 "device".
 */
enum emu_kind { EMU_BF16, EMU_F16, EMU_F32_2ULP };

static const char *emu_kind_name(enum emu_kind k)
{
    return k == EMU_BF16 ? "the bf16 floor" : k == EMU_F16 ? "the fp16 floor" : "the fp32 perturbation (2 ulps)";
}

/* The rounding tables' state; they run on the CPU side (S[CPU]) and wrap its fp32 table. */
static struct {
    enum emu_kind kind;        /* what values are rounded to */
    uint16_t *bits;            /* scratch: rounded values */
    float *w;                  /* scratch: rounded weights */
    size_t nbits, nw;
} emu;

/* Scratch of at least n elements of `size` bytes (the CPU's ops are done when they return: no stream to wait). */
static void *emu_scratch(void **p, size_t *have, size_t n, size_t size)
{
    if (n > *have) {
        S[CPU].ops->free(S[CPU].be, *p);
        *p = S[CPU].ops->alloc(S[CPU].be, n * size);
        if (!*p) {
            fprintf(stderr, "test_cuda_ops: %zu bytes of emulation scratch: %s\n", n * size, rt_errmsg());
            exit(1);
        }
        *have = n;
    }
    return *p;
}

static void emu_round(struct rt_stream *s, float *x, size_t n)
{
    if (emu.kind == EMU_F32_2ULP) {
        /* The CPU backend's buffers are host memory; its ops may be queued (RINGTRAIN_CPU_STREAMS=async). */
        S[CPU].ops->sync(s);
        for (size_t i = 0; i < n; i++) {
            const uint32_t u = fbits(x[i]);
            if ((u & 0x7f800000u) != 0x7f800000u) /* NaN and Inf stay */
                x[i] = bitsf((u + 1u + ((u >> 2) & 1u)) & ~3u);
        }
        return;
    }
    uint16_t *b = emu_scratch((void **)&emu.bits, &emu.nbits, n, sizeof(uint16_t));
    if (emu.kind == EMU_BF16) {
        S[CPU].ops->cast_f32_bf16(s, n, x, b);
        S[CPU].ops->cast_bf16_f32(s, n, b, x);
    } else {
        S[CPU].ops->cast_f32_f16(s, n, x, b);
        S[CPU].ops->cast_f16_f32(s, n, b, x);
    }
}

/* A rounded copy of n weights. */
static const float *emu_weights(struct rt_stream *s, const float *w, size_t n)
{
    float *r = emu_scratch((void **)&emu.w, &emu.nw, n, sizeof(float));
    S[CPU].ops->copy(s, r, w, n * sizeof(float));
    emu_round(s, r, n);
    return r;
}

static size_t conv_out_count(const struct rt_conv_desc *d)
{
    return (size_t)d->in.n * d->cout * d->oh * d->ow;
}

static size_t pool_out_count(const struct rt_pool_desc *d)
{
    return (size_t)d->in.n * d->in.c * d->oh * d->ow;
}

static size_t conv_w_count(const struct rt_conv_desc *d)
{
    return (size_t)d->cout * d->in.c * d->kh * d->kw;
}

static void emu_input_u8(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *img, const float *mean,
                         const float *std, float *y)
{
    S[CPU].ops->input_u8(s, sh, img, mean, std, y);
    emu_round(s, y, count4(sh));
}

static void emu_input_u8_dev(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *img, const float *mean,
                             const float *std, float *y)
{
    S[CPU].ops->input_u8_dev(s, sh, img, mean, std, y);
    emu_round(s, y, count4(sh));
}

static void emu_conv2d_fwd(struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *w,
                           const float *bias, float *y)
{
    S[CPU].ops->conv2d_fwd(s, d, x, emu_weights(s, w, conv_w_count(d)), bias, y);
    emu_round(s, y, conv_out_count(d));
}

static void emu_conv2d_bwd_data(struct rt_stream *s, const struct rt_conv_desc *d, const float *dy, const float *w,
                                float beta, float *dx)
{
    S[CPU].ops->conv2d_bwd_data(s, d, dy, emu_weights(s, w, conv_w_count(d)), beta, dx);
    emu_round(s, dx, count4(d->in));
}

static void emu_bn_train_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                             const float *beta, float *rm, float *rv, float *sm, float *si, float *y)
{
    S[CPU].ops->bn_train_fwd(s, d, x, gamma, beta, rm, rv, sm, si, y);
    emu_round(s, y, count4(d->in));
}

static void emu_bn_infer_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                             const float *beta, const float *rm, const float *rv, float *y)
{
    S[CPU].ops->bn_infer_fwd(s, d, x, gamma, beta, rm, rv, y);
    emu_round(s, y, count4(d->in));
}

static void emu_bn_bwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                       const float *gamma, const float *beta, const float *sm, const float *si, float beta_dx, float *dx,
                       float *dgamma, float *dbeta)
{
    S[CPU].ops->bn_bwd(s, d, x, dy, gamma, beta, sm, si, beta_dx, dx, dgamma, dbeta);
    emu_round(s, dx, count4(d->in));
}

static void emu_bn_infer_bwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                             const float *gamma, const float *beta, const float *rm, const float *rv, float beta_dx,
                             float *dx)
{
    S[CPU].ops->bn_infer_bwd(s, d, x, dy, gamma, beta, rm, rv, beta_dx, dx);
    emu_round(s, dx, count4(d->in));
}

static void emu_maxpool_bwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, const float *y,
                            const float *dy, float beta, float *dx)
{
    S[CPU].ops->maxpool_bwd(s, d, x, y, dy, beta, dx);
    emu_round(s, dx, count4(d->in));
}

static void emu_avgpool_fwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y)
{
    S[CPU].ops->avgpool_fwd(s, d, x, y);
    emu_round(s, y, pool_out_count(d));
}

static void emu_avgpool_bwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *dy, float beta, float *dx)
{
    S[CPU].ops->avgpool_bwd(s, d, dy, beta, dx);
    emu_round(s, dx, count4(d->in));
}

static void emu_gap_fwd(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y)
{
    S[CPU].ops->gap_fwd(s, sh, x, y);
    emu_round(s, y, (size_t)sh.n * sh.c);
}

static void emu_gap_bwd(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx)
{
    S[CPU].ops->gap_bwd(s, sh, dy, beta, dx);
    emu_round(s, dx, count4(sh));
}

static void emu_flatten_bwd(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx)
{
    S[CPU].ops->flatten_bwd(s, sh, dy, beta, dx);
    emu_round(s, dx, count4(sh));
}

static void emu_linear_fwd(struct rt_stream *s, int n, int in, int out, const float *x, const float *w, const float *b,
                           float *y)
{
    S[CPU].ops->linear_fwd(s, n, in, out, x, emu_weights(s, w, (size_t)in * out), b, y);
    emu_round(s, y, (size_t)n * out);
}

static void emu_linear_bwd_data(struct rt_stream *s, int n, int in, int out, const float *dy, const float *w,
                                float beta, float *dx)
{
    S[CPU].ops->linear_bwd_data(s, n, in, out, dy, emu_weights(s, w, (size_t)in * out), beta, dx);
    emu_round(s, dx, (size_t)n * in);
}

static void emu_relu_bwd(struct rt_stream *s, size_t n, const float *y, const float *dy, float beta, float *dx)
{
    S[CPU].ops->relu_bwd(s, n, y, dy, beta, dx);
    emu_round(s, dx, n);
}

static void emu_gelu_fwd(struct rt_stream *s, size_t n, const float *x, float *y)
{
    S[CPU].ops->gelu_fwd(s, n, x, y);
    emu_round(s, y, n);
}

static void emu_gelu_bwd(struct rt_stream *s, size_t n, const float *x, const float *dy, float beta, float *dx)
{
    S[CPU].ops->gelu_bwd(s, n, x, dy, beta, dx);
    emu_round(s, dx, n);
}

static void emu_dropout_fwd(struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,
                            uint64_t offset, const uint64_t *stream, const float *x, float *y)
{
    S[CPU].ops->dropout_fwd(s, sh, spatial, p, seed, offset, stream, x, y);
    emu_round(s, y, count4(sh));
}

static void emu_dropout_bwd(struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,
                            uint64_t offset, const uint64_t *stream, const float *dy, float beta, float *dx)
{
    S[CPU].ops->dropout_bwd(s, sh, spatial, p, seed, offset, stream, dy, beta, dx);
    emu_round(s, dx, count4(sh));
}

static void emu_add(struct rt_stream *s, size_t n, const float *a, const float *b, float *y)
{
    S[CPU].ops->add(s, n, a, b, y);
    emu_round(s, y, n);
}

/* The residual add and its ReLU: the sum rounded (the ReLU of a rounded value is exact); backward's gradients
 * are dy (already rounded) or dx + dy, rounded. */
static void emu_add_relu_fwd(struct rt_stream *s, size_t n, const float *a, const float *b, float *y)
{
    S[CPU].ops->add_relu_fwd(s, n, a, b, y);
    emu_round(s, y, n);
}

static void emu_add_relu_bwd(struct rt_stream *s, size_t n, const float *y, const float *dy, float beta_a, float *dxa,
                             float beta_b, float *dxb)
{
    S[CPU].ops->add_relu_bwd(s, n, y, dy, beta_a, dxa, beta_b, dxb);
    if (dxa)
        emu_round(s, dxa, n);
    if (dxb)
        emu_round(s, dxb, n);
}

static void emu_scale(struct rt_stream *s, size_t n, float alpha, float *x)
{
    S[CPU].ops->scale(s, n, alpha, x);
    emu_round(s, x, n);
}

static void emu_axpy(struct rt_stream *s, size_t n, float alpha, const float *x, float *y)
{
    S[CPU].ops->axpy(s, n, alpha, x, y);
    emu_round(s, y, n);
}

static void emu_xent_fwd_bwd(struct rt_stream *s, int n, int k, const float *logits, const int32_t *labels,
                             float label_smoothing, float grad_scale, const float *loss_scale,
                             struct rt_loss_stats *stats, float *dlogits)
{
    S[CPU].ops->xent_fwd_bwd(s, n, k, logits, labels, label_smoothing, grad_scale, loss_scale, stats, dlogits);
    if (dlogits)
        emu_round(s, dlogits, (size_t)n * k);
}

/*
 * The rounding table for `kind`: an fp32 table (its act stays RT_F32, its
 * buffers fp32) on the CPU side. There is one, and its wrappers round to the
 * kind of the latest call: take it right before the run it is for. Ops whose outputs are exact functions of
 * rounded inputs need no wrapper: ReLU and max pooling forward (a choice),
 * flatten forward (a copy), the parameter gradients (fp32 in every table).
 */
static const struct rt_ops *emu_table(enum emu_kind kind)
{
    static struct rt_ops t;
    emu.kind = kind;
    t = *S[CPU].ops;
    t.input_u8 = emu_input_u8;
    t.input_u8_dev = emu_input_u8_dev;
    t.conv2d_fwd = emu_conv2d_fwd;
    t.conv2d_bwd_data = emu_conv2d_bwd_data;
    t.bn_train_fwd = emu_bn_train_fwd;
    t.bn_infer_fwd = emu_bn_infer_fwd;
    t.bn_bwd = emu_bn_bwd;
    t.bn_infer_bwd = emu_bn_infer_bwd;
    t.maxpool_bwd = emu_maxpool_bwd;
    t.avgpool_fwd = emu_avgpool_fwd;
    t.avgpool_bwd = emu_avgpool_bwd;
    t.gap_fwd = emu_gap_fwd;
    t.gap_bwd = emu_gap_bwd;
    t.flatten_bwd = emu_flatten_bwd;
    t.linear_fwd = emu_linear_fwd;
    t.linear_bwd_data = emu_linear_bwd_data;
    t.relu_bwd = emu_relu_bwd;
    t.gelu_fwd = emu_gelu_fwd;
    t.gelu_bwd = emu_gelu_bwd;
    t.dropout_fwd = emu_dropout_fwd;
    t.dropout_bwd = emu_dropout_bwd;
    t.add = emu_add;
    t.add_relu_fwd = emu_add_relu_fwd;
    t.add_relu_bwd = emu_add_relu_bwd;
    t.scale = emu_scale;
    t.axpy = emu_axpy;
    t.xent_fwd_bwd = emu_xent_fwd_bwd;
    return &t;
}

static void emu_free(void)
{
    S[CPU].ops->free(S[CPU].be, emu.bits);
    S[CPU].ops->free(S[CPU].be, emu.w);
    memset(&emu, 0, sizeof(emu));
}

/* ---- the model tests ---------------------------------------------------------------------------------------------------- */

/*
 * Runs kept for the whole test: each model's fp32 CPU reference, and its
 * floor of each 16-bit type, are compared with every table and every
 * planted fault.
 */
static struct kept_run {
    const char *name;
    int dropout;
    enum rt_dtype of; /* RT_F32: the fp32 reference; RT_BF16 or RT_F16: the floor of that type */
    struct model_run run;
    int ok;
} kept[16];

static const struct model_run *kept_run(const char *name, int dropout, enum rt_dtype of)
{
    size_t i = 0;
    for (; i < RT_ARRAY_LEN(kept) && kept[i].name; i++)
        if (!strcmp(kept[i].name, name) && kept[i].dropout == dropout && kept[i].of == of)
            return kept[i].ok ? &kept[i].run : NULL;
    if (i == RT_ARRAY_LEN(kept)) {
        CHECKF(0, "more than %zu kept runs", RT_ARRAY_LEN(kept));
        return NULL;
    }
    kept[i].name = name;
    kept[i].dropout = dropout;
    kept[i].of = of;
    if (of == RT_F32) {
        kept[i].ok = model_run(CPU, name, dropout, RT_F32, NULL, 1.0f, &kept[i].run) == 0;
    } else {
        const struct rt_ops *t = emu_table(of == RT_BF16 ? EMU_BF16 : EMU_F16);
        kept[i].ok = model_run(CPU, name, dropout, RT_F32, t, LOSS_SCALE, &kept[i].run) == 0;
    }
    return kept[i].ok ? &kept[i].run : NULL;
}

static void kept_free(void)
{
    for (size_t i = 0; i < RT_ARRAY_LEN(kept); i++)
        model_run_free(&kept[i].run);
}

static int stand_in; /* 1: the CPU stands in for the GPU (--stand-in) */

/*
 * The fp32 table under test and the side it runs on: the GPU's; on the
 * stand-in the fp32 perturbation (a rounding table, so taken right before
 * its run), on the CPU side.
 */
static const struct rt_ops *f32_device(int *side, const char **name)
{
    *side = stand_in ? CPU : GPU;
    *name = stand_in ? emu_kind_name(EMU_F32_2ULP) : S[GPU].name;
    return stand_in ? emu_table(EMU_F32_2ULP) : rt_backend_ops(S[GPU].be);
}

/*
 * fp32 on the device against the fp32 CPU. On the stand-in the device is
 * the fp32 perturbation (the CPU's own table, every output moved by up to 2
 * ulps): the fp32 bounds must hold for another correct summation order.
 */
static void test_model_f32(const char *name, int dropout)
{
    char label[64];
    snprintf(label, sizeof(label), "%s%s fp32", name, dropout ? "+dropout" : "");
    const struct model_run *ref = kept_run(name, dropout, RT_F32);
    int side;
    const char *dev_name;
    const struct rt_ops *table = f32_device(&side, &dev_name);
    printf("model %s: one RT_TRAIN step (batch %d, %dx%dx%d, %s), %s\n", name, MODEL_N, MODEL_C, MODEL_H, MODEL_W,
           dropout ? "with dropout: the same Philox masks" : "no dropout", dev_name);
    struct model_run dev = {0};
    if (ref && model_run(side, name, dropout, RT_F32, table, 1.0f, &dev) == 0 && same_start(label, ref, &dev) == 0) {
        char names[96];
        const unsigned fails = model_compare(&(struct model_runs){label, ref, NULL, &dev});
        CHECKF(fails == 0, "%s on %s: outside the fp32 bounds: %s", label, dev_name,
               check_names(fails, names, sizeof(names)));
    }
    model_run_free(&dev);
}

/* The device's 16-bit table for `act` against the fp32 CPU, as far as the floor. */
static void test_model_amp(const char *name, int dropout, enum rt_dtype act)
{
    printf("model %s: one RT_TRAIN step (batch %d, %dx%dx%d, %s), %s activations %s, loss scale %g\n", name, MODEL_N,
           MODEL_C, MODEL_H, MODEL_W, dropout ? "with dropout: the same Philox masks" : "no dropout", S[GPU].name,
           rt_dtype_name(act), (double)LOSS_SCALE);
    char label[64];
    snprintf(label, sizeof(label), "%s%s %s", name, dropout ? "+dropout" : "", rt_dtype_name(act));
    const struct model_run *ref = kept_run(name, dropout, RT_F32), *fl = kept_run(name, dropout, act);
    struct model_run dev = {0};
    if (ref && fl && model_run(GPU, name, dropout, act, NULL, LOSS_SCALE, &dev) == 0 &&
        same_start(label, ref, &dev) == 0) {
        char names[96];
        const unsigned fails = model_compare(&(struct model_runs){label, ref, fl, &dev});
        CHECKF(fails == 0, "%s: beyond its floor: %s", label, check_names(fails, names, sizeof(names)));
    }
    model_run_free(&dev);
}

/*
 * The fp16 floor, on the CPU alone: the stand-in has no fp16 table, but the
 * GPU's fp16 checks stand on this floor, so it is tried here: no overflow at
 * the loss scale, every tensor above FLOOR_MIN_COS, nearer fp32 than bf16's
 * floor (3 more significant bits), and the largest scaled weight gradient
 * far below fp16's largest value: the GPU sums a weight gradient in a
 * 16-bit scratch (nhwc16.cu) before adding it to fp32.
 */
static void test_floor_f16(const char *name, int dropout)
{
    const struct model_run *ref = kept_run(name, dropout, RT_F32), *h = kept_run(name, dropout, RT_F16),
                           *b = kept_run(name, dropout, RT_BF16);
    if (!ref || !h || !b)
        return;
    double worst = 2.0, gmax = 0.0;
    const char *worst_name = "-";
    for (int i = 0; i < ref->nt; i++) {
        const struct rt_tensor_info *e = &ref->tab[i];
        if (e->kind != RT_PARAM)
            continue;
        const struct vsim v = vsim(ref->grads + e->offset, h->grads + e->offset, e->count);
        if (v.cos < worst)
            worst = v.cos, worst_name = e->name;
    }
    for (size_t i = 0; i < ref->np; i++)
        gmax = fmax(gmax, fabs((double)ref->grads[i]) * LOSS_SCALE);
    const struct vsim vh = vsim(ref->grads, h->grads, ref->np), vb = vsim(ref->grads, b->grads, ref->np);
    const int ok = !h->overflow && worst >= FLOOR_MIN_COS && vh.dist < vb.dist && gmax < 65504.0 / 16;
    char label[64], detail[512];
    snprintf(label, sizeof(label), "%s%s fp16", name, dropout ? "+dropout" : "");
    snprintf(detail, sizeof(detail), "%s; worst tensor cosine %.5f (>= %g) %s; |floor - ref|/|ref| %.4f (bf16's "
             "%.4f); largest scaled gradient %.4g (< 65504/16)", h->overflow ? "an overflow" : "no overflow", worst,
             FLOOR_MIN_COS, worst_name, vh.dist, vb.dist, gmax);
    check_line(label, "floor", detail, ok);
    CHECKF(ok, "%s: the fp16 floor: %s", label, detail);
}

/* ---- planted faults: the 16-bit checks catch real mistakes ------------------------------------------------------------ */

/*
 * Each fault is one op of the device's 16-bit table wrapped so that it does
 * what a plausible bug would; the model is built on that table
 * (rt_model_opts.ops), run against the same fp32 reference, and the check
 * named for the fault must fail. The wrappers go through the table's own
 * layout and memory ops, so they work on every backend.
 */
/* The check of the model comparison that must fail for each of optable_check.h's planted faults. */
static const unsigned plant_caught_by[OC_PLANT_COUNT] = {
    [OC_PLANT_LAYOUT] = CHK_GRADS,
    [OC_PLANT_SCALE] = CHK_GRADS, /* in fp32, without a loss scale, the same factor is lost all the same */
    [OC_PLANT_BN_STATS] = CHK_STATS,
};

/*
 * Every planted fault in the device's table for `act` (in fp32, f32_device's),
 * on `name`: each must be caught by its check, against the floor in 16 bits,
 * by the fixed bounds in fp32.
 */
static void test_plants(const char *name, enum rt_dtype act)
{
    const struct model_run *ref = kept_run(name, 0, RT_F32), *fl = act == RT_F32 ? NULL : kept_run(name, 0, act);
    if (!ref || (act != RT_F32 && !fl))
        return;
    int side = GPU;
    const char *dev_name = S[GPU].name;
    const struct rt_ops *table = act == RT_F32 ? f32_device(&side, &dev_name) : rt_backend_ops_for(S[GPU].be, act);
    for (int p = 0; p < OC_PLANT_COUNT; p++) {
        const struct oc_plant_info *pi = &oc_plants[p];
        printf("planted fault in the %s table of %s: %s %s\n", rt_dtype_name(act), dev_name, pi->op, pi->fault);
        const struct rt_ops t = oc_plant_table(table, (enum oc_plant)p, LOSS_SCALE);
        struct model_run dev = {0};
        char label[64], names[96], want[96];
        snprintf(label, sizeof(label), "%s %s, planted", name, rt_dtype_name(act));
        if (model_run(side, name, 0, act, &t, act == RT_F32 ? 1.0f : LOSS_SCALE, &dev) == 0) {
            const unsigned fails = model_compare(&(struct model_runs){label, ref, fl, &dev});
            const int caught = (fails & plant_caught_by[p]) != 0;
            printf("  %s %s: failed: %s; must fail: %s  %s\n", pi->op, pi->fault,
                   check_names(fails, names, sizeof(names)), check_names(plant_caught_by[p], want, sizeof(want)),
                   caught ? "caught" : "MISSED");
            CHECKF(caught, "planted fault (%s %s) not caught by the %s check on %s %s", pi->op, pi->fault, want, name,
                   rt_dtype_name(act));
        }
        model_run_free(&dev);
    }
}

/* ---- main ------------------------------------------------------------------------------------------------------------------ */

/* The first line: the CUDA runtime this build runs on, the driver it needs, and the machine's driver, so that a
 * skip or a refused GPU says why at once. */
static void print_versions(void)
{
    struct rt_backend_probe p;
    if (rt_backend_probe(RT_BACKEND_CUDA, &p) < 0) {
        printf("test_cuda_ops: CUDA %s\n", p.detail);
        return;
    }
    char driver[128];
    rt_nvml_describe_driver(p.driver_version, driver, sizeof(driver));
    printf("test_cuda_ops: CUDA runtime %d.%d (needs NVIDIA driver %d or later), driver %s; %s\n",
           p.runtime_version / 1000, p.runtime_version % 1000 / 10, p.driver_needed, driver, p.detail);
}

static int usage(void)
{
    fprintf(stderr, "usage: test_cuda_ops [--stand-in] | twins-elem | twins-bn [--stand-in | --quick] | conv [--rules] [-v]\n"
                    "  (none)       every op, then whole models, on the CUDA backend against the CPU backend\n"
                    "  --stand-in   the whole-model checks of the 16-bit tables with the CPU backend's bf16\n"
                    "               table in the GPU's place, and the planted faults they must catch\n"
                    "  twins-elem   the fast element-wise kernels against their reference twins on the GPU\n"
                    "  twins-bn     the fast batchnorm kernels against their twins, the fused ReLU against\n"
                    "               the unfused ops (--stand-in: the CPU in the GPU's place)\n"
                    "  conv         the convolutions as the fast tables choose them (--rules: their rules,\n"
                    "               no GPU needed)\n");
    return 1;
}

/* The parts that share this executable (test_cuda_parts.h says why). */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} parts[] = {
    {"twins-elem", test_cuda_twins_elem_main},
    {"twins-bn", test_cuda_twins_bn_main},
    {"conv", test_cuda_conv_main},
};

int main(int argc, char **argv)
{
    for (size_t i = 0; argc >= 2 && i < RT_ARRAY_LEN(parts); i++)
        if (!strcmp(argv[1], parts[i].name))
            return parts[i].run(argc - 1, argv + 1);
    stand_in = argc == 2 && !strcmp(argv[1], "--stand-in");
    if (argc > 2 || (argc == 2 && !stand_in))
        return usage();
    print_versions();
    printf("seed %llu%s\n", (unsigned long long)SEED,
           stand_in ? "; stand-in: the CPU backend's bf16 table in the GPU's place" : "");
    S[GPU].name = stand_in ? "cpu-bf16" : "cuda";
    int rc = rt_backend_create(&(struct rt_backend_opts){.kind = stand_in ? RT_BACKEND_CPU : RT_BACKEND_CUDA},
                               &S[GPU].be);
    if (rc < 0) {
        if (stand_in) {
            fprintf(stderr, "test_cuda_ops: the stand-in's cpu backend: %s\n", rt_errmsg());
            return 1;
        }
        fprintf(stderr, "test_cuda_ops: skip: no CUDA backend: %s\n", rt_errmsg());
        return 77;
    }
    rc = rt_backend_create(&(struct rt_backend_opts){.kind = RT_BACKEND_CPU, .threads = 0}, &S[CPU].be);
    if (rc < 0) {
        fprintf(stderr, "test_cuda_ops: cpu backend: %s\n", rt_errmsg());
        rt_backend_destroy(S[GPU].be);
        return 1;
    }
    BOTH {
        S[s].ops = rt_backend_ops(S[s].be);
        S[s].st = rt_backend_stream(S[s].be);
        printf("  %s: %s\n", S[s].name, rt_backend_describe(S[s].be));
    }
    if (stand_in && !rt_backend_ops_for(S[GPU].be, RT_BF16)) {
        fprintf(stderr, "test_cuda_ops: skip: the stand-in needs the CPU's bf16 table: %s\n", rt_errmsg());
        rt_backend_destroy(S[CPU].be);
        rt_backend_destroy(S[GPU].be);
        return 77;
    }
    if (!stand_in) {
        printf("op tolerances: |%s - cpu| <= atol + rtol * (|cpu| or max|cpu| over the tensor)\n", S[GPU].name);
        for (int t = 0; t < T_COUNT; t++)
            printf("  %-16s atol %-8.3g rtol %-8.3g %s\n", TOL[t].name, TOL[t].atol, TOL[t].rtol,
                   TOL[t].vs_max ? "of max|cpu|" : "of |cpu|");
    }
    printf("models, per tensor: fp32 cosine >= %g, | |dev|/|ref| - 1 | <= %g, mean loss within %g; 16-bit against "
           "the floor: 1 - cosine <= %g (1 - floor's) + %g, | |dev|/|ref| - 1 | <= %g |floor - ref|/|ref| + %g, mean "
           "loss within %g times the floor's difference + %g\n",
           F32_MIN_COS, F32_MAX_LEN, F32_MAX_LOSS, COS_K, COS_SLACK, LEN_K, LEN_SLACK, LOSS_K, LOSS_SLACK);
    if (!stand_in) {
        test_memory();
        test_layout();
        test_input_u8();
        test_conv();
        test_bn();
        test_pool();
        test_feat();
        test_linear();
        test_relu_gelu();
        test_dropout();
        test_blas1();
        test_xent();
        test_reductions();
        test_casts();
        test_sgd();
        test_adam();
    }
    test_model_f32("mnist-net", 0);
    test_model_f32("resnet18", 0);
    test_model_f32("resnet9", 0);
    test_model_f32("mnist-net", 1);
    test_plants("resnet18", RT_F32);
    /* mixed precision: the 16-bit tables (NHWC and tensor cores on the GPU) against the fp32 CPU */
    int planted = 0;
    for (int a = 0; a < 2; a++) {
        const enum rt_dtype act = a ? RT_F16 : RT_BF16;
        const struct rt_ops *t16 = rt_backend_ops_for(S[GPU].be, act);
        if (!t16) {
            printf("skip %s models: %s\n", rt_dtype_name(act), rt_errmsg());
            continue;
        }
        /* the rule every 16-bit table keeps (compute.h's RT_OPS_ACT_LIST) */
        CHECKF(rt_ops_check_act_table(t16, rt_backend_ops(S[GPU].be)) == 0, "%s", rt_errmsg());
        test_model_amp("mnist-net", 0, act);
        test_model_amp("resnet18", 0, act);
        test_model_amp("resnet9", 0, act);
        test_model_amp("mnist-net", 1, act);
        if (!planted++)
            test_plants("resnet18", act);
    }
    if (stand_in) {
        printf("the fp16 floor the GPU's fp16 checks will stand on\n");
        test_floor_f16("mnist-net", 0);
        test_floor_f16("resnet18", 0);
        test_floor_f16("resnet9", 0);
        test_floor_f16("mnist-net", 1);
    }
    if (!planted)
        printf("no 16-bit table on %s: the 16-bit models and planted faults did not run\n", S[GPU].name);

    kept_free();
    emu_free();
    rt_backend_destroy(S[CPU].be);
    rt_backend_destroy(S[GPU].be);
    fflush(stdout);
    return check_result();
}
