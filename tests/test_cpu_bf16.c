/*
 * test_cpu_bf16.c - the CPU backend's bf16 op table (rt_backend_ops_for(be,
 * RT_BF16)) against its fp32 table: op by op through the op-table engine
 * (optable_check.h) under the bounds of BF16 below, the planted faults the
 * engine must catch, what only this table has (its layout rule, the fused
 * batchnorm + ReLU bit for bit against its unfused ops), whole models, and
 * the ISA gate. Skips (77) on a CPU without AVX512_BF16 or AMX, where there
 * is no bf16 table.
 *
 * The engine gives both tables the same bf16-exact inputs, so a difference is
 * the bf16 table's own: its one rounding of each output (u = 2^-8, bf16's
 * unit roundoff: one round-to-nearest-even moves v by at most u |v|), and
 * where it sums in another order, that (a K-term fp32 sum moves by up to
 * K 2^-24 of the sum of |terms|). Bounds, per check (BF16_TOL):
 *  - exact: ops whose output is one fp32 expression of their inputs per
 *    element, computed as the fp32 kernel does (ReLU, GELU, add, scale,
 *    axpy, dropout, max pooling's forward, flatten, layout, input, batchnorm
 *    inference and its backward, average pooling, the loss): the fp32
 *    output rounded, bit for bit; the loss statistics the same bits.
 *  - sums in another order: max pooling's backward (up to 4 windows add
 *    into one element), global pooling (HW terms): u |ref| plus the order.
 *  - batchnorm training: statistics from fp32 partials of 64 terms, then
 *    double: save_mean within 1e-5 of the spread, save_invstd and the
 *    running statistics within 1e-5 relative (the running mean 1e-6 of the
 *    spread: momentum 0.1); y within u |ref| + 1e-4; dgamma, dbeta within
 *    1e-5 of the channel's sum of |terms|; dx within u |ref| + 1e-4 max|dx|.
 *  - convolutions and linear layers (weights rounded to bf16 on both sides,
 *    as the bf16 table rounds them): products of bf16 values are exact in
 *    fp32, so (K + 1) 2^-24 of each element's sum of |terms| for the order
 *    and u |ref| for the output's rounding (2u + u with beta 1: the sum is
 *    rounded once more after the add).
 *  - sum of squares: double sums in another order, 1e-6 relative.
 * The table itself: every activation op is the bf16 table's own, every other
 * op (memory, casts, optimizer, unscale_check) the very fp32 kernel.
 *
 * Planted faults (optable_check.h's: a layout mistake, a lost loss scale, a
 * batchnorm that does not update its statistics) go into the bf16 table one
 * at a time and the engine, run on the planted op's family, must fail that
 * op: the test fails if one goes unnoticed.
 *
 * Whole models (mnist-net 1x28x28, resnet9 3x32x32, batch 8, one training
 * step with dropout): the bf16 model against the fp32 model from the same
 * seed; the bounds are stated where they are checked. Two bf16 runs must
 * agree bit for bit. These and the convolutions need the bf16 convolutions
 * (dnnl.c); while the bf16 table's convolution slots are still the fp32
 * kernels, they cannot run and the test ends with 77 after the rest passes.
 *
 * The ISA gate: with ONEDNN_MAX_CPU_ISA=AVX2 in a child process (oneDNN
 * reads it once, at its first use), rt_backend_ops_for must return NULL
 * with a message naming AVX512_BF16.
 *
 * Seeds are fixed and printed. Runs in a few seconds on 2 cores.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "check.h"
#include "optable_check.h"
#include "test_util.h"
#include "common/common.h"
#include "compute/compute.h"

#define SEED 20250611u
#define U (1.0 / 256.0)        /* bf16's unit roundoff, 2^-8 */
#define U32 (1.0 / 16777216.0) /* fp32's, 2^-24 */
#define ISA_CHILD_ARG "--isa-child"

static struct rt_backend *be;
static const struct rt_ops *o32, *o16;
static struct rt_stream *st;
static struct rt_rng rng;

static float rnd(float f)
{
    return oc_bf16_f32(oc_bf16(f));
}

/* ---- host and device helpers ----------------------------------------------------------- */

static void *dev(size_t bytes)
{
    void *p = o32->alloc(be, bytes);
    if (!p) {
        fprintf(stderr, "test_cpu_bf16: alloc: %s\n", rt_errmsg());
        exit(1);
    }
    return p;
}

/* Values in [lo, hi), rounded to bf16 so both tables see them exactly. */
static float *random_bf16(size_t n, float lo, float hi)
{
    float *p = tu_hfloats(n);
    for (size_t i = 0; i < n; i++)
        p[i] = rnd(lo + (hi - lo) * rt_rng_uniform(&rng));
    return p;
}

static float *put32(const float *host, size_t n, const struct rt_shape4 *sp)
{
    float *d = dev(n * sizeof(float));
    if (sp)
        o32->from_nchw(st, *sp, host, d);
    else
        o32->upload(st, d, host, n * sizeof(float));
    return d;
}

static float *put16(const float *host, size_t n, const struct rt_shape4 *sp)
{
    float *d = dev(n * sizeof(uint16_t));
    if (sp) {
        o16->from_nchw(st, *sp, host, d);
        return d;
    }
    uint16_t *b = tu_xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        b[i] = oc_bf16(host[i]);
    o16->upload(st, d, b, n * sizeof(uint16_t));
    free(b);
    return d;
}

/* Host copies, widened from bf16 for the bf16 table. */
static float *get32(const float *d, size_t n, const struct rt_shape4 *sp)
{
    float *h = tu_hfloats(n);
    if (sp)
        o32->to_nchw(st, *sp, d, h);
    else
        o32->download(st, h, d, n * sizeof(float));
    return h;
}

static void fill16(float *d, size_t n, uint16_t v)
{
    uint16_t *b = tu_xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        b[i] = v;
    o16->upload(st, d, b, n * sizeof(uint16_t));
    free(b);
}

static void dfree(void *p)
{
    o32->free(be, p);
}

static const char *shape_str(struct rt_shape4 sh)
{
    static char b[4][64];
    static int k;
    k = (k + 1) % 4;
    snprintf(b[k], sizeof(b[k]), "(%d,%d,%d,%d)%s", sh.n, sh.c, sh.h, sh.w, sh.c % 16 ? "" : " blocked");
    return b[k];
}

struct slot {
    const char *name;
    size_t off;
};
#define SLOT(ret, name, params, args) {#name, offsetof(struct rt_ops, name)},
static const struct slot slots[] = {RT_OPS_LIST(SLOT)};
#undef SLOT

static const char *const convs[] = {"conv2d_fwd", "conv2d_bwd_data", "conv2d_bwd_filter"};

static int in_list(const char *name, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(name, list[i]))
            return 1;
    return 0;
}

static void *slot_of(const struct rt_ops *t, const struct slot *s)
{
    void *p;
    memcpy(&p, (const char *)t + s->off, sizeof(p));
    return p;
}

/* 1 if the bf16 table's convolutions are its own (dnnl.c has filled them). */
static int test_table(void)
{
    printf("table: activation ops replaced, parameter-side ops shared with fp32\n");
    CHECK(o16->act == RT_BF16 && o32->act == RT_F32);
    int own_convs = 1;
    for (size_t i = 0; i < RT_ARRAY_LEN(slots); i++)
        if (in_list(slots[i].name, convs, RT_ARRAY_LEN(convs)))
            own_convs &= slot_of(o32, &slots[i]) != slot_of(o16, &slots[i]);
    /* the rule every 16-bit table keeps (compute.h's RT_OPS_ACT_LIST), as the CUDA tables do */
    if (own_convs)
        CHECKF(rt_ops_check_act_table(o16, o32) == 0, "%s", rt_errmsg());
    printf("  %zu slots; convolutions: %s\n", RT_ARRAY_LEN(slots),
           own_convs ? "bf16 (dnnl.c)" : "still the fp32 kernels (rt_cpu_dnnl_fill_bf16 is a no-op)");
    return own_convs;
}

/* ---- layout ------------------------------------------------------------------------- */

static void test_layout(void)
{
    printf("layout: from_nchw puts each rounded value where cpu.h's rule says\n");
    static const struct rt_shape4 shapes[] = {{2, 16, 3, 5}, {2, 32, 4, 4}, {3, 3, 5, 7}, {2, 5, 1, 1}, {4, 48, 9, 11}};
    for (size_t k = 0; k < RT_ARRAY_LEN(shapes); k++) {
        const struct rt_shape4 sh = shapes[k];
        const size_t n = oc_count4(sh);
        float *x = tu_hfloats(n);
        for (size_t i = 0; i < n; i++)
            x[i] = -3.0f + 6.0f * rt_rng_uniform(&rng); /* not bf16: from_nchw rounds */
        float *d = dev(n * sizeof(uint16_t));
        o16->from_nchw(st, sh, x, d);
        uint16_t *bits = tu_xmalloc(n * sizeof(uint16_t));
        o16->download(st, bits, d, n * sizeof(uint16_t));
        /* the blocked (nChw16c) or (C, N, H, W) position, as cpu.h spells it */
        size_t bad = 0;
        const int blocked = sh.c % 16 == 0;
        for (int in = 0; in < sh.n; in++)
            for (int c = 0; c < sh.c; c++)
                for (int y = 0; y < sh.h; y++)
                    for (int xx = 0; xx < sh.w; xx++) {
                        const size_t at =
                            blocked ? ((((size_t)in * (sh.c / 16) + c / 16) * sh.h + y) * sh.w + xx) * 16 + c % 16
                                    : (((size_t)c * sh.n + in) * sh.h + y) * sh.w + xx;
                        const size_t li = (((size_t)in * sh.c + c) * sh.h + y) * sh.w + xx;
                        bad += bits[at] != oc_bf16(x[li]);
                    }
        CHECKF(bad == 0, "from_nchw %s: %zu elements not rounded into their place", shape_str(sh), bad);
        free(bits);
        free(x);
        dfree(d);
    }
}

/*
 * A ReLU fused into the batchnorm (rt_bn_desc.relu) against this table's
 * batchnorm then its ReLU, which the fusion replaces: bit for bit, y and the
 * statistics of training, y of inference, and for beta_dx 0 and 1 dx,
 * dgamma and dbeta of bn_bwd against relu_bwd then bn_bwd, and dx of
 * bn_infer_bwd against relu_bwd (on inference's y) then bn_infer_bwd.
 * Gamma is negative on some channels and beta straddles 0, so the mask
 * is mixed. Channels 0 and 1 hold -1, 0, 1 (mean exactly 0) with beta +0
 * and -0 (gamma < 0 on channel 1), so some outputs are exactly +0 and -0
 * (the running mean of both is 0 too): the ReLU passes both
 * forward and blocks their gradient, which a mask of `>= 0` or `<= 0` gets
 * wrong. With `denormals`, a small shape runs on this thread with FTZ and
 * DAZ off (the backend's threads have them on, which rules denormals out)
 * and gamma ~2^-125, beta 0 on every fourth channel, so that some v =
 * (x - mean) invstd gamma + beta are denormal: the store flushes those to
 * zeros of their sign, so the ReLU's masks must follow the stored y, not
 * v's sign.
 */
struct bnr_out {
    uint16_t *ytr, *yin, *dx[2], *dxi[2]; /* dxi: bn_infer_bwd's */
    float *stats, *pgrad[2]; /* running mean, var, save mean, invstd; dgamma, dbeta per beta_dx */
};

static void *dev_bits(const float *d, size_t bytes)
{
    void *h = tu_xmalloc(bytes);
    o16->download(st, h, d, bytes);
    return h;
}

/* a and b (n elements of `size` bytes: 2 bf16, 4 float) the same bits, else a failure naming the first difference */
static void same_bits(const char *what, const char *shape, const void *a, const void *b, size_t n, size_t size)
{
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * size, (const char *)b + i * size, size) && bad++ == 0)
            first = i;
    printf("  %-34s %-28s bit-identical %s\n", what, shape, bad ? "FAIL" : "ok");
    if (!bad)
        return;
    float va, vb;
    if (size == 2) {
        uint16_t ha, hb;
        memcpy(&ha, (const char *)a + first * size, 2);
        memcpy(&hb, (const char *)b + first * size, 2);
        va = oc_bf16_f32(ha);
        vb = oc_bf16_f32(hb);
    } else {
        memcpy(&va, (const char *)a + first * size, 4);
        memcpy(&vb, (const char *)b + first * size, 4);
    }
    CHECKF(0, "%s %s, ReLU fused: %zu of %zu elements differ from batchnorm then ReLU, first [%zu] (in memory): "
              "fused %.9g, unfused %.9g", what, shape, bad, n, first, (double)vb, (double)va);
}

static void test_bn_relu_case(struct rt_shape4 sh, int denormals)
{
    const size_t n = oc_count4(sh), C = (size_t)sh.c, hw = (size_t)sh.h * sh.w, m = (size_t)sh.n * hw;
    char ss[64];
    snprintf(ss, sizeof(ss), "%s%s", shape_str(sh), denormals ? " denormals" : "");
    const struct rt_bn_desc plain = {.in = sh, .eps = 1e-5f, .momentum = 0.1f};
    struct rt_bn_desc fused = plain;
    /* the ops must run on this thread: below PAR_MIN elements */
    if (denormals && n >= 32768)
        CHECKF(0, "bn+relu %s: too large to run on the calling thread", ss);
    fused.relu = 1;
    float *x = random_bf16(n, -1.0f, 1.0f), *gamma = random_bf16(C, 0.5f, 1.5f), *beta = random_bf16(C, -0.3f, 0.3f);
    float *rm0 = random_bf16(C, -0.1f, 0.1f), *rv0 = random_bf16(C, 0.2f, 0.5f);
    for (size_t c = 0; c < C; c++) {
        if (c % 3 == 2 || c == 1)
            gamma[c] = -gamma[c];
        if (denormals && c % 4 == 2) { /* v = (x - mean) invstd gamma: a mix of denormals and normals */
            gamma[c] *= 0x1p-125f;    /* still normal: this thread flushes denormals yet */
            beta[c] = 0.0f;
        }
    }
    for (size_t c = 0; c < 2; c++) {
        beta[c] = c ? -0.0f : 0.0f;
        rm0[c] = 0.0f;
        /* in logical order j (image, pixel): -1, 0, 1 repeated, then zeros: the sum, and so the mean, is 0 */
        for (size_t j = 0; j < m; j++)
            x[(j / hw * C + c) * hw + j % hw] = j < m - m % 3 ? (float)((int)(j % 3) - 1) : 0.0f;
    }
    float *dy = random_bf16(n, -1.0f, 1.0f), *dx0 = random_bf16(n, -1.0f, 1.0f);
    float *dg0 = random_bf16(C, -1.0f, 1.0f), *db0 = random_bf16(C, -1.0f, 1.0f);
    float *x16 = put16(x, n, &sh), *dy16 = put16(dy, n, &sh), *dx16 = put16(dx0, n, &sh);
    float *g32 = put32(gamma, C, NULL), *b32 = put32(beta, C, NULL);
    float *rmi = put32(rm0, C, NULL), *rvi = put32(rv0, C, NULL); /* inference's, never written */
    float *ytr = dev(n * sizeof(uint16_t)), *yin = dev(n * sizeof(uint16_t)), *t16 = dev(n * sizeof(uint16_t));
    float *sv = dev(4 * C * sizeof(float)), *pg = dev(2 * C * sizeof(float));
    struct bnr_out out[2];
#if defined(__x86_64__)
    const unsigned csr = _mm_getcsr();
    if (denormals)
        _mm_setcsr(csr & ~0x8040u); /* FTZ is bit 15, DAZ bit 6 */
#endif
    for (int f = 0; f < 2; f++) { /* 0: batchnorm then ReLU, 1: fused */
        const struct rt_bn_desc *d = f ? &fused : &plain;
        o32->upload(st, sv, rm0, C * sizeof(float));
        o32->upload(st, sv + C, rv0, C * sizeof(float));
        o16->bn_train_fwd(st, d, x16, g32, b32, sv, sv + C, sv + 2 * C, sv + 3 * C, ytr);
        o16->bn_infer_fwd(st, d, x16, g32, b32, rmi, rvi, yin);
        if (!f) {
            o16->relu_fwd(st, n, ytr, ytr);
            o16->relu_fwd(st, n, yin, yin);
        }
        out[f].ytr = dev_bits(ytr, n * sizeof(uint16_t));
        out[f].yin = dev_bits(yin, n * sizeof(uint16_t));
        out[f].stats = get32(sv, 4 * C, NULL);
        for (int bd = 0; bd < 2; bd++) {
            if (bd)
                o16->from_nchw(st, sh, dx0, dx16);
            else
                fill16(dx16, n, 0x7fc0u); /* beta_dx 0 must not read dx */
            o32->upload(st, pg, dg0, C * sizeof(float));
            o32->upload(st, pg + C, db0, C * sizeof(float));
            if (f) {
                o16->bn_bwd(st, d, x16, dy16, g32, b32, sv + 2 * C, sv + 3 * C, (float)bd, dx16, pg, pg + C);
            } else {
                o16->relu_bwd(st, n, ytr, dy16, 0.0f, t16);
                o16->bn_bwd(st, d, x16, t16, g32, b32, sv + 2 * C, sv + 3 * C, (float)bd, dx16, pg, pg + C);
            }
            out[f].dx[bd] = dev_bits(dx16, n * sizeof(uint16_t));
            out[f].pgrad[bd] = get32(pg, 2 * C, NULL);
            if (bd)
                o16->from_nchw(st, sh, dx0, dx16);
            else
                fill16(dx16, n, 0x7fc0u);
            if (f) {
                o16->bn_infer_bwd(st, d, x16, dy16, g32, b32, rmi, rvi, (float)bd, dx16);
            } else {
                o16->relu_bwd(st, n, yin, dy16, 0.0f, t16);
                o16->bn_infer_bwd(st, d, x16, t16, g32, b32, rmi, rvi, (float)bd, dx16);
            }
            out[f].dxi[bd] = dev_bits(dx16, n * sizeof(uint16_t));
        }
    }
#if defined(__x86_64__)
    _mm_setcsr(csr);
#endif
    same_bits("bn_train_fwd+relu y", ss, out[0].ytr, out[1].ytr, n, 2);
    same_bits("bn_train_fwd+relu statistics", ss, out[0].stats, out[1].stats, 4 * C, 4);
    same_bits("bn_infer_fwd+relu y", ss, out[0].yin, out[1].yin, n, 2);
    for (int bd = 0; bd < 2; bd++) {
        char op[64];
        snprintf(op, sizeof(op), "relu_bwd+bn_bwd dx beta %d", bd);
        same_bits(op, ss, out[0].dx[bd], out[1].dx[bd], n, 2);
        snprintf(op, sizeof(op), "relu_bwd+bn_bwd dgamma, dbeta %d", bd);
        same_bits(op, ss, out[0].pgrad[bd], out[1].pgrad[bd], 2 * C, 4);
        snprintf(op, sizeof(op), "relu_bwd+bn_infer_bwd dx beta %d", bd);
        same_bits(op, ss, out[0].dxi[bd], out[1].dxi[bd], n, 2);
    }
    /* the mask is mixed, and the exact zeros of channels 0 and 1 are there: +0 and -0 pass forward */
    size_t zeros = 0, negz = 0;
    for (size_t i = 0; i < n; i++) {
        zeros += (out[1].ytr[i] & 0x7fffu) == 0;
        negz += out[1].ytr[i] == 0x8000u;
    }
    printf("  %-34s %-28s %zu of %zu clipped or zero, %zu -0\n", "bn_train_fwd+relu mask", ss, zeros, n, negz);
    CHECKF(zeros > n / 10 && zeros < n * 9 / 10, "bn+relu %s: %zu of %zu outputs clipped", ss, zeros, n);
    CHECKF(negz > 0, "bn+relu %s: no output is -0 (channel 1's x = 0)", ss);
    const size_t xzeros = (m - m % 3) / 3 + m % 3; /* channel 1's x = 0 */
    if (denormals)
        CHECKF(negz > xzeros, "bn+relu %s: no negative v was denormal (%zu outputs -0)", ss, negz);
    for (int f = 0; f < 2; f++) {
        free(out[f].ytr);
        free(out[f].yin);
        free(out[f].stats);
        for (int bd = 0; bd < 2; bd++) {
            free(out[f].dx[bd]);
            free(out[f].dxi[bd]);
            free(out[f].pgrad[bd]);
        }
    }
    float *dp[] = {x16, dy16, dx16, g32, b32, rmi, rvi, ytr, yin, t16, sv, pg};
    for (size_t i = 0; i < RT_ARRAY_LEN(dp); i++)
        dfree(dp[i]);
    float *hp[] = {x, gamma, beta, rm0, rv0, dy, dx0, dg0, db0};
    for (size_t i = 0; i < RT_ARRAY_LEN(hp); i++)
        free(hp[i]);
}

static void test_bn_relu(void)
{
    printf("batchnorm with a fused ReLU = batchnorm then ReLU, bit for bit\n");
    CHECKF(o16->bn_relu == 1, "the bf16 table does not fuse batchnorm and ReLU (bn_relu %d)", o16->bn_relu);
    test_bn_relu_case((struct rt_shape4){2, 3, 3, 5}, 0);
    test_bn_relu_case((struct rt_shape4){2, 16, 3, 5}, 0);
    test_bn_relu_case((struct rt_shape4){4, 32, 16, 16}, 0);
    test_bn_relu_case((struct rt_shape4){2, 3, 3, 5}, 1);
    test_bn_relu_case((struct rt_shape4){2, 16, 3, 5}, 1);
}

/* ---- the op table: bounds and cases ------------------------------------------------------ */

#define EXACT(n) {.name = n, .flags = OC_EXACT}
static const struct oc_tol BF16_TOL[OC_CHECK_COUNT] = {
    [OC_LAYOUT] = EXACT("rounded"),
    [OC_INPUT] = EXACT("rounded"),
    [OC_CONV_FWD] = {.name = "gemm", .rtol = U, .kterms = U32},
    [OC_CONV_BWD_DATA] = {.name = "gemm", .rtol = U, .kterms = U32},
    [OC_CONV_BWD_DATA_ADD] = {.name = "gemm, added", .atol = U, .rtol = 2 * U, .kterms = U32},
    [OC_CONV_BWD_FILTER] = {.name = "gemm, fp32", .kterms = U32},
    [OC_BN_Y] = {.name = "bn", .atol = 1e-4, .rtol = U},
    [OC_BN_MEAN] = {.name = "bn mean", .spread = 1e-5},
    [OC_BN_INVSTD] = {.name = "bn stat", .rtol = 1e-5},
    [OC_BN_RUNNING_MEAN] = {.name = "bn mean", .spread = 1e-6},
    [OC_BN_RUNNING_VAR] = {.name = "bn stat", .rtol = 1e-5},
    [OC_BN_INFER_Y] = EXACT("rounded"),
    [OC_BN_DX] = {.name = "bn dx", .rtol = U, .rmax = 1e-4},
    [OC_BN_DPARAM] = {.name = "bn sums", .atol = 1e-7, .terms = 1e-5},
    [OC_BN_INFER_DX] = EXACT("rounded"),
    [OC_MAXPOOL_FWD] = EXACT("rounded"),
    [OC_MAXPOOL_BWD] = {.name = "4 windows", .atol = 4.0 * 4.0 * U32, .rtol = U},
    [OC_MAXPOOL_HOST_FWD] = EXACT("rounded"),
    [OC_MAXPOOL_HOST_BWD] = {.name = "rounding", .rtol = U},
    [OC_AVGPOOL_FWD] = EXACT("rounded"),
    [OC_AVGPOOL_BWD] = EXACT("rounded"),
    [OC_GAP_FWD] = {.name = "hw terms", .rtol = U, .kterms = U32},
    [OC_GAP_BWD] = EXACT("rounded"),
    [OC_FLATTEN_FWD] = EXACT("rounded"),
    [OC_FLATTEN_BWD] = EXACT("rounded"),
    [OC_FLATTEN_BWD_ADD] = EXACT("rounded"),
    [OC_LINEAR_FWD] = {.name = "gemm", .rtol = U, .kterms = U32},
    [OC_LINEAR_BWD_DATA] = {.name = "gemm", .rtol = U, .kterms = U32},
    [OC_LINEAR_BWD_FILTER] = {.name = "gemm, fp32", .kterms = U32},
    [OC_RELU] = EXACT("rounded"),
    [OC_RELU_BWD_ADD] = EXACT("rounded"),
    [OC_GELU] = EXACT("rounded"),
    [OC_ADD] = EXACT("rounded"),
    [OC_AXPY] = EXACT("rounded"),
    [OC_DROPOUT] = EXACT("rounded"),
    [OC_DROPOUT_BWD_ADD] = EXACT("rounded"),
    [OC_XENT_LOSS] = EXACT("fp32 bits"),
    [OC_XENT_DLOGITS] = EXACT("rounded"),
    [OC_SUMSQ] = {.name = "double sums", .rtol = 1e-6},
    [OC_EXACT_COUNT] = EXACT("exact"),
    /* OC_BN_RELU: the fused ReLU is checked bit for bit against this table's own unfused ops (test_bn_relu) */
};
#undef EXACT

#define SH(n, c, h, w) .sh = {n, c, h, w}
/* Shapes: C a multiple of 16 (nChw16c) and not ((C, N, H, W)), vector tails and several threads' chunks. */
static const struct oc_case BF16_CASES[] = {
    {OC_F_LAYOUT, SH(2, 16, 3, 5), .lo = -3, .hi = 3}, {OC_F_LAYOUT, SH(2, 32, 4, 4), .lo = -3, .hi = 3},
    {OC_F_LAYOUT, SH(3, 3, 5, 7), .lo = -3, .hi = 3},  {OC_F_LAYOUT, SH(2, 5, 1, 1), .lo = -3, .hi = 3},
    {OC_F_LAYOUT, SH(4, 48, 9, 11), .lo = -3, .hi = 3},
    {OC_F_INPUT, SH(3, 3, 5, 7)}, {OC_F_INPUT, SH(2, 1, 28, 28)}, {OC_F_INPUT, SH(2, 16, 4, 3)},
    {OC_F_BN, SH(4, 32, 6, 5), .lo = -1, .hi = 1},
    {OC_F_BN, SH(2, 16, 7, 7), .lo = 2, .hi = 4},  /* mean far from 0: the shift */
    {OC_F_BN, SH(3, 3, 9, 11), .lo = 2, .hi = 4},  /* runs of 297: vector and tail */
    {OC_F_BN, SH(2, 5, 4, 4), .lo = -1, .hi = 1},
    {OC_F_BN, SH(8, 64, 16, 16), .lo = -2, .hi = 3}, /* threads, and many flushes of the fp32 sums */
#define POOL3(n, c, h, w, k, s, p)                                                                                     \
    {OC_F_POOL, SH(n, c, h, w), k, s, p, .lo = -2, .hi = 2}, {OC_F_POOL, SH(n, c, h, w), k, s, p, .vals = OC_V_TIES},  \
        {OC_F_POOL, SH(n, c, h, w), k, s, p, .hi = 2, .vals = OC_V_RELU_NANS}
    POOL3(2, 16, 8, 8, 2, 2, 0),   /* windows tile the plane */
    POOL3(2, 16, 7, 9, 2, 2, 0),   /* a last row and column outside every window */
    POOL3(2, 32, 9, 9, 3, 2, 1),   /* overlapping, padded */
    POOL3(2, 16, 4, 4, 4, 4, 0),   /* global, as resnet9's */
    POOL3(1, 16, 5, 150, 2, 2, 0), /* rows of more than one pass of output columns */
    POOL3(2, 3, 7, 7, 3, 2, 1),    /* (C, N, H, W) */
    POOL3(2, 5, 6, 6, 2, 2, 0),
    POOL3(8, 64, 16, 16, 2, 2, 0), /* threads */
#undef POOL3
    /* H*W below, at and above the 16 x 16 tiles of the blocked flatten, and 9 tiles (mnist-net's) */
    {OC_F_FEAT, SH(2, 16, 3, 5), .lo = -2, .hi = 2},   {OC_F_FEAT, SH(3, 32, 4, 4), .lo = -2, .hi = 2},
    {OC_F_FEAT, SH(2, 16, 5, 7), .lo = -2, .hi = 2},   {OC_F_FEAT, SH(2, 64, 12, 12), .lo = -2, .hi = 2},
    {OC_F_FEAT, SH(3, 3, 5, 7), .lo = -2, .hi = 2},    {OC_F_FEAT, SH(2, 5, 1, 1), .lo = -2, .hi = 2},
    {OC_F_LINEAR, SH(8, 100, 1, 1), 37, .e = 1}, {OC_F_LINEAR, SH(5, 16, 1, 1), 10},
    {OC_F_LINEAR, SH(8, 1152, 1, 1), 128, .e = 1},
    {OC_F_ELEM, SH(5, 1, 1, 1), .lo = -2, .hi = 2}, {OC_F_ELEM, SH(37, 1, 1, 1), .lo = -2, .hi = 2},
    {OC_F_ELEM, SH(70001, 1, 1, 1), .lo = -2, .hi = 2}, /* several threads' chunks and a tail */
    /* offsets not a multiple of 4, and just below 2^34, where the block counter's low word carries */
#define DROP2(n, c, h, w, sp)                                                                                          \
    {OC_F_DROPOUT, SH(n, c, h, w), .e = sp, .p = 0.3f, .seed = 0x1234567890abcdefull, .offset = 1001},               \
        {OC_F_DROPOUT, SH(n, c, h, w), .e = sp, .p = 0.3f, .seed = 0x1234567890abcdefull,                           \
         .offset = ((uint64_t)1 << 34) - 999}
    DROP2(2, 32, 5, 7, 1), DROP2(2, 3, 5, 7, 1), DROP2(8, 100, 1, 1, 0), DROP2(4, 64, 13, 11, 1),
#undef DROP2
    {OC_F_XENT, SH(8, 10, 1, 1), .e = 1, .p = 0.1f}, {OC_F_XENT, SH(8, 10, 1, 1), .p = 0.0f},
    {OC_F_REDUCE, SH(7, 1, 1, 1)}, {OC_F_REDUCE, SH(70001, 1, 1, 1)},
};

/* The bf16 convolutions (cpu/dnnl.c: oneDNN in bf16 with fp32 accumulation, weights rounded per call): blocked in
 * and out, the first layer's 3 channels, odd channels both sides, a 1x1 stride-2 shortcut, and the smallest maps
 * (2x2, 1x1), whose filter gradient takes the widened fp32 path. Run only once the table has them. */
static const struct oc_case BF16_CONVS[] = {
    {OC_F_CONV, SH(2, 16, 8, 8), 32, 3, 1, 1, 1}, {OC_F_CONV, SH(2, 3, 9, 9), 16, 3, 1, 1, 0},
    {OC_F_CONV, SH(2, 5, 6, 6), 7, 3, 2, 1, 1},   {OC_F_CONV, SH(2, 16, 8, 8), 32, 1, 2, 0, 0},
    {OC_F_CONV, SH(8, 32, 2, 2), 32, 3, 1, 1, 0}, {OC_F_CONV, SH(8, 64, 1, 1), 16, 3, 1, 1, 1},
    {OC_F_CONV, SH(2, 64, 8, 8), 128, 3, 1, 1, 1}, /* fp32 Winograd on the widened tensors */
};
#undef SH

/* The planted faults, each in a copy of the bf16 table, must fail their op. */
static void test_plants(struct oc_ctx *ctx, const struct oc_table *ops, const struct oc_table *conv_table, int own_convs)
{
    for (int p = 0; p < OC_PLANT_COUNT; p++) {
        const struct oc_plant_info *pi = &oc_plants[p];
        if (pi->family == OC_F_CONV && !own_convs)
            printf("planted fault: %s %s: not run (the bf16 table's convolutions are the fp32 kernels)\n", pi->op,
                   pi->fault);
        else
            CHECKF(oc_plant_run(ctx, pi->family == OC_F_CONV ? conv_table : ops, (enum oc_plant)p, 1024.0f, SEED),
                   "planted fault (%s %s) not caught by the engine on the bf16 table", pi->op, pi->fault);
    }
}

/* ---- whole models --------------------------------------------------------------------------------- */

struct run {
    double loss;
    float *grads, *logits;
    size_t np;
};

/* One training step of model `name` with activations `act`; 0, or -1 with a failed check. */
static int model_step(const char *name, int c, int h, int w, enum rt_dtype act, struct run *out)
{
    enum { N = 8, K = 10 };
    const struct rt_model_opts mo = {
        .name = name, .c = c, .h = h, .w = w, .classes = K, .batch = N, .seed = SEED, .act = act};
    struct rt_model *m = NULL;
    if (rt_model_create(be, &mo, &m) < 0) {
        CHECKF(0, "%s %s: rt_model_create: %s", name, rt_dtype_name(act), rt_errmsg());
        return -1;
    }
    struct rt_rng r;
    rt_rng_init(&r, SEED, 77);
    int32_t labels[N];
    uint8_t *img = tu_random_batch(&r, N, c, h, w, K, labels);
    const struct rt_step_opts so = {.mode = RT_TRAIN, .label_smoothing = 0.1f, .grad_scale = 1.0f / N,
                                    .dropout_offset = 4242, .mean = TU_CIFAR_MEAN, .std = TU_CIFAR_STD};
    struct rt_loss_stats ls = {0};
    rt_model_zero_grads(m);
    int rc = rt_model_step(m, &so, N, img, labels, &ls);
    CHECKF(rc == 0, "%s %s: rt_model_step: %s", name, rt_dtype_name(act), rt_errmsg());
    out->np = rt_model_param_count(m);
    out->grads = tu_hfloats(out->np);
    out->logits = tu_hfloats((size_t)N * K);
    rt_model_read(m, RT_MODEL_GRADS, 0, out->np, out->grads);
    rt_model_logits(m, out->logits, N);
    out->loss = ls.loss_sum / ls.count;
    free(img);
    rt_model_destroy(m);
    return rc == 0 ? 0 : -1;
}

static double cosine(const float *a, const float *b, size_t n)
{
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : (aa == bb ? 1.0 : 0.0);
}

/*
 * Bounds for one model: the loss relative to fp32's; the cosine similarity
 * of the whole gradient buffer with fp32's, and of each tensor's.
 */
struct model_bounds {
    double loss, whole, tensor;
};

static void test_model(const char *name, int c, int h, int w, struct model_bounds bd)
{
    printf("model %s (%dx%dx%d, batch 8, one training step with dropout): bf16 against fp32\n", name, c, h, w);
    struct run f = {0}, b1 = {0}, b2 = {0};
    if (model_step(name, c, h, w, RT_F32, &f) || model_step(name, c, h, w, RT_BF16, &b1) ||
        model_step(name, c, h, w, RT_BF16, &b2))
        goto out;
    const double dl = fabs(b1.loss - f.loss) / fabs(f.loss);
    printf("  loss fp32 %.6f bf16 %.6f: relative difference %.3g (bound %g) %s\n", f.loss, b1.loss, dl, bd.loss,
           dl <= bd.loss ? "ok" : "FAIL");
    CHECKF(dl <= bd.loss, "%s: bf16 loss %.6f vs fp32 %.6f", name, b1.loss, f.loss);
    const double cs = cosine(f.grads, b1.grads, f.np);
    printf("  gradients, whole model (%zu floats): cosine %.6f (bound %g) %s\n", f.np, cs, bd.whole,
           cs >= bd.whole ? "ok" : "FAIL");
    CHECKF(cs >= bd.whole, "%s: gradient cosine similarity %.6f < %g", name, cs, bd.whole);
    /* per tensor, through a model instance's table */
    struct rt_model *m = NULL;
    const struct rt_model_opts mo = {.name = name, .c = c, .h = h, .w = w, .classes = 10, .batch = 8, .seed = SEED};
    if (rt_model_create(be, &mo, &m) == 0) {
        int nt = 0;
        const struct rt_tensor_info *tab = rt_model_tensors(m, &nt);
        double worst = 2.0;
        const char *worst_name = "-";
        for (int i = 0; i < nt; i++) {
            if (tab[i].kind != RT_PARAM)
                continue;
            const double ci = cosine(f.grads + tab[i].offset, b1.grads + tab[i].offset, tab[i].count);
            CHECKF(ci >= bd.tensor, "%s: %s gradient cosine %.6f < %g", name, tab[i].name, ci, bd.tensor);
            if (ci < worst) {
                worst = ci;
                worst_name = tab[i].name;
            }
        }
        printf("  gradients per tensor: worst cosine %.6f (%s; bound %g) %s\n", worst, worst_name, bd.tensor,
               worst >= bd.tensor ? "ok" : "FAIL");
        rt_model_destroy(m);
    }
    const int same = b1.loss == b2.loss && !memcmp(b1.grads, b2.grads, b1.np * sizeof(float)) &&
                     !memcmp(b1.logits, b2.logits, 80 * sizeof(float));
    printf("  two bf16 runs: loss, logits and gradients bit-identical: %s\n", same ? "ok" : "FAIL");
    CHECKF(same, "%s: two bf16 runs differ", name);
out:
    free(f.grads);
    free(f.logits);
    free(b1.grads);
    free(b1.logits);
    free(b2.grads);
    free(b2.logits);
}

/* ---- the ISA gate ------------------------------------------------------------------------------------ */

/* In the child: the bf16 table must be refused, naming AVX512_BF16. */
static int isa_child(void)
{
    struct rt_backend *b = NULL;
    if (rt_backend_create(&(struct rt_backend_opts){.kind = RT_BACKEND_CPU, .threads = 1}, &b) < 0) {
        fprintf(stderr, "isa child: backend: %s\n", rt_errmsg());
        return 1;
    }
    const struct rt_ops *t = rt_backend_ops_for(b, RT_BF16);
    const int ok = t == NULL && strstr(rt_errmsg(), "AVX512_BF16") != NULL;
    printf("  ONEDNN_MAX_CPU_ISA=%s: rt_backend_ops_for(RT_BF16) = %s: %s\n", getenv("ONEDNN_MAX_CPU_ISA"),
           t ? "a table" : "NULL", t ? "" : rt_errmsg());
    rt_backend_destroy(b);
    return ok ? 0 : 1;
}

/* oneDNN reads ONEDNN_MAX_CPU_ISA once, at its first use, and this process has used it: a child, fresh. */
static void test_isa_cap(const char *self)
{
    printf("ISA gate: a child process with ONEDNN_MAX_CPU_ISA=AVX2\n");
    fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) {
        CHECKF(0, "fork: %s", strerror(errno));
        return;
    }
    if (pid == 0) {
        setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
        execl("/proc/self/exe", self, ISA_CHILD_ARG, (char *)NULL);
        fprintf(stderr, "exec %s: %s\n", self, strerror(errno));
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    const int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("  child %s\n", ok ? "ok" : "FAIL");
    CHECKF(ok, "with ONEDNN_MAX_CPU_ISA=AVX2 the bf16 table was not refused with a message naming AVX512_BF16 "
               "(child status %d)",
           status);
}

/* ---- main ------------------------------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], ISA_CHILD_ARG))
        return isa_child();
    printf("test_cpu_bf16: seed %llu\n", (unsigned long long)SEED);
    if (rt_backend_create(&(struct rt_backend_opts){.kind = RT_BACKEND_CPU, .threads = 0}, &be) < 0) {
        fprintf(stderr, "test_cpu_bf16: cpu backend: %s\n", rt_errmsg());
        return 1;
    }
    o32 = rt_backend_ops(be);
    o16 = rt_backend_ops_for(be, RT_BF16);
    st = rt_backend_stream(be);
    if (!o16) {
        fprintf(stderr, "test_cpu_bf16: skip: %s\n", rt_errmsg());
        rt_backend_destroy(be);
        return 77;
    }
    printf("  %s\n", rt_backend_describe(be));
    rt_rng_init(&rng, SEED, 1);

    const int own_convs = test_table();
    test_layout();
    test_bn_relu();
    struct oc_ctx ctx;
    oc_init(&ctx, &(struct oc_side){.name = "cpu-fp32", .be = be, .ops = o32, .st = st},
            &(struct oc_side){.name = "cpu-bf16", .be = be, .ops = o16, .st = st}, SEED);
    const struct oc_table ops = {"the CPU's bf16 table", BF16_TOL, BF16_CASES, RT_ARRAY_LEN(BF16_CASES)};
    const struct oc_table conv_table = {"the CPU's bf16 convolutions", BF16_TOL, BF16_CONVS, RT_ARRAY_LEN(BF16_CONVS)};
    oc_run(&ctx, &ops, ~0u);
    if (own_convs)
        oc_run(&ctx, &conv_table, ~0u);
    CHECKF(oc_failures(&ctx) == 0, "%d op comparisons failed:%s", oc_failures(&ctx), ctx.failed);
    test_plants(&ctx, &ops, &conv_table, own_convs);
    if (own_convs) {
        /*
         * Every activation is rounded to 8 significant bits 10-20 times on
         * the way to the logits and again on the way back, and the
         * convolutions and linear layers multiply bf16 weights. The loss, a
         * mean over 8 samples of ~2.3, moves by far less than 1 %. The
         * gradients: a rounding that tips a ReLU or a max-pooling window
         * near a tie sends a gradient elsewhere, and batchnorm over 8
         * samples spreads that to the whole batch, so the deep nets' early
         * layers decorrelate a little. Where that floor lies was measured
         * with the same networks run through the fp32 kernels with every
         * op's output and every weight rounded to bf16 (exact fp32 math,
         * bf16 storage): resnet9's gradients 0.972 cosine to fp32's, its
         * worst tensor 0.940; this table gives 0.974 and 0.938. mnist-net
         * (2 convolutions, no batchnorm): 0.99996, worst tensor 0.998. A
         * layout, index or lane mistake leaves a tensor's gradient nearly
         * orthogonal to fp32's (cosine well below 0.5), far under these.
         */
        test_model("mnist-net", 1, 28, 28, (struct model_bounds){.loss = 0.01, .whole = 0.999, .tensor = 0.99});
        test_model("resnet9", 3, 32, 32, (struct model_bounds){.loss = 0.01, .whole = 0.95, .tensor = 0.9});
    }
    test_isa_cap(argv[0]);
    rt_backend_destroy(be);
    const int rc = check_result();
    if (rc == 0 && !own_convs) {
        fprintf(stderr, "test_cpu_bf16: the op checks passed, but the models cannot run: the bf16 table's "
                        "convolutions are still the fp32 kernels (rt_cpu_dnnl_fill_bf16 in compute/cpu/dnnl.c)\n");
        return 77;
    }
    return rc;
}
