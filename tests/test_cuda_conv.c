/*
 * test_cuda_conv.c - the CUDA backend's fast convolutions (compute/cuda/dnn_fast.c, dnn_graph.c, dnn_kern.cu):
 * cuDNN's legacy algorithms and graph-API engines measured once per shape, the fastest the settings allow
 * kept; 16-bit weights cast once per update; stems padded to 8 channels.
 *
 * `test_cuda_ops conv --rules` (ctest test_cuda_conv_rules, label unit) needs no GPU: the choice rule over
 * made-up candidates under every setting, the weight cache's invalidation by overlapping writes, the padded
 * stem's index arithmetic against naive loops over odd shapes, and, where cuDNN loads, the operation graphs
 * of every direction and type built and finalized (cuDNN builds them without a device) and a wrong one
 * refused with a reason.
 *
 * `test_cuda_conv` (ctest test_cuda_conv, label gpu) runs, for shapes covering the CIFAR models (stems 3->64
 * 3x3 and 7x7 stride 2 at 32x32, 64->64 3x3, 64->128 3x3 and 1x1 stride 2, 256->512 3x3 at 4x4, 512 at 2x2
 * and 1x1; batch 512 and 7), each direction (forward, backward data with beta 0 and 1, backward filter
 * accumulating into dw and db) on the fast tables against the CPU backend:
 *   - fp32 strict (rt_backend_opts zeroed): test_cuda_ops.c's gemm tolerance, |d| <= 1e-5 + 1e-4 max|ref|;
 *   - fp32 with TF32: each product of TF32 operands is off by less than 2^-9 of |a b| (a TF32 operand keeps
 *     10 of fp32's 23 mantissa bits, whether rounded or truncated: relative error under 2^-10 each), the sum
 *     is fp32; so |d| <= 2^-9 * sum |a||b| + the gemm tolerance, sum |a||b| being the CPU's convolution of
 *     the absolute values;
 *   - bf16 and fp16: the CPU's fp32 convolution of the same 16-bit values (inputs rounded on the host as the
 *     device rounds them), fp32 accumulation, and at most two roundings of the output to 16 bits (the
 *     result, then the bias add; dw when it goes through 16-bit scratch): |d| <= 2u (|ref| + |old|) + the
 *     gemm tolerance, u = 2^-8 (bf16) or 2^-11 (fp16);
 * and on the same device: the fast tables against the reference tables (rt_backend_ops_reference), the
 * same call twice bit for bit where the backend is deterministic, a backend with nondeterministic
 * algorithms allowed and one with the graph API left out (RINGTRAIN_CUDNN_GRAPH=0) against the CPU too;
 * the 16-bit weight copies made once (the cast count does not move between calls), remade after an
 * upload, a scale and a copy into the weights (the result then matches the CPU on the new weights), for
 * a stem's padded copy and a linear layer's too; and the choices rt_backend_conv_choices lists (one line
 * each: what cuDNN ran, its measured time) are sane for each backend's settings. Each check prints a line.
 * Exit 0 pass, 1 fail, 77 skip (no CUDA in the build, no usable GPU; --rules in a build without CUDA).
 * The seed is fixed and printed; -v logs every candidate of every search (debug level), otherwise only the
 * first shape's.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_buildinfo.h"
#include "test_cuda_parts.h"

#if RT_HAVE_CUDA
#include "check.h"
#include "test_util.h"
#include "common/common.h"
#include "common/cudalibs.h"
#include "compute/compute.h"
#include "compute/cuda/dnn_priv.h"

#define SEED UINT64_C(20250411)

/* ==== the rules, without a GPU ========================================================================== */

static void rules_choose(void)
{
    printf("choice rule\n");
    /* A..I: what each setting may take; G has not run, H needs too much workspace, I has no time. */
    const struct rt_dnn_cand c[] = {
        /*         ms     ws      ran det tc  down red */
        [0] = {1.0f, 0, 1, 1, 0, 0, 0},          /* A: legacy FMA, deterministic */
        [1] = {0.5f, 1 << 20, 1, 1, 1, 0, 0},    /* B: tensor cores, deterministic */
        [2] = {0.3f, 0, 1, 0, 0, 0, 0},          /* C: no tensor cores, not deterministic */
        [3] = {0.2f, 0, 1, 0, 1, 0, 0},          /* D: tensor cores, not deterministic */
        [4] = {0.1f, 0, 1, 1, 1, 1, 0},          /* E: narrows its inputs */
        [5] = {0.1f, 0, 1, 1, 1, 0, 1},          /* F: accumulates below fp32 */
        [6] = {0.05f, 0, 0, 1, 0, 0, 0},         /* G: did not run */
        [7] = {0.15f, (size_t)2 << 30, 1, 1, 0, 0, 0}, /* H: 2 GiB of workspace */
        [8] = {NAN, 0, 1, 1, 0, 0, 0},           /* I: no time */
    };
    const int n = (int)RT_ARRAY_LEN(c);
    static const struct {
        int f32, tf32, nondet, want;
        const char *why;
    } cases[] = {
        {1, 0, 0, 0, "fp32 strict, deterministic: the FMA one"},
        {1, 1, 0, 1, "fp32 with TF32, deterministic: tensor cores allowed"},
        {1, 0, 1, 2, "fp32 strict, any: the non-deterministic FMA one"},
        {1, 1, 1, 3, "fp32 with TF32, any: the fastest allowed"},
        {0, 0, 0, 1, "16-bit, deterministic: tensor cores whatever tf32 says"},
        {0, 1, 0, 1, "16-bit with tf32 set, deterministic: the same"},
        {0, 0, 1, 3, "16-bit, any: the fastest allowed"},
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(cases); i++) {
        const struct rt_dnn_rule r = {.f32 = cases[i].f32, .tf32 = cases[i].tf32,
                                      .nondeterministic = cases[i].nondet, .ws_limit = (size_t)1 << 30};
        const int got = rt_dnn_choose(&r, c, n);
        printf("  %-60s chose %c, want %c  %s\n", cases[i].why, got < 0 ? '-' : 'A' + got, 'A' + cases[i].want,
               got == cases[i].want ? "ok" : "FAIL");
        CHECKF(got == cases[i].want, "%s: chose %d, want %d", cases[i].why, got, cases[i].want);
    }
    /* The verdicts name each rejection. */
    const struct rt_dnn_rule strict = {.f32 = 1, .ws_limit = (size_t)1 << 30};
    static const enum rt_dnn_verdict want[] = {RT_DNN_OK, RT_DNN_TF32, RT_DNN_NONDETERMINISTIC, RT_DNN_TF32,
                                              RT_DNN_DOWN_CONVERT, RT_DNN_REDUCED, RT_DNN_NOT_RUN, RT_DNN_WORKSPACE,
                                              RT_DNN_NOT_MEASURED};
    for (int i = 0; i < n; i++) {
        const enum rt_dnn_verdict v = rt_dnn_judge(&strict, &c[i], 1);
        CHECKF(v == want[i], "candidate %c under strict fp32: %s, want %s", 'A' + i, rt_dnn_verdict_name(v),
               rt_dnn_verdict_name(want[i]));
    }
    /* Before the measurement, time and `ran` are not judged: G and I pass, the rest as before. */
    CHECK(rt_dnn_judge(&strict, &c[6], 0) == RT_DNN_OK);
    CHECK(rt_dnn_judge(&strict, &c[8], 0) == RT_DNN_OK);
    CHECK(rt_dnn_judge(&strict, &c[7], 0) == RT_DNN_WORKSPACE);
    CHECK(strcmp(rt_dnn_verdict_name(RT_DNN_TF32), "?") && strcmp(rt_dnn_verdict_name((enum rt_dnn_verdict)99), "ok"));
    /* Nothing allowed: -1. Ties: less workspace, then the lower index. A negative time is no time. */
    CHECK(rt_dnn_choose(&strict, c + 2, 2) == -1);
    CHECK(rt_dnn_choose(&strict, c, 0) == -1);
    const struct rt_dnn_cand tie[] = {{0.5f, 4096, 1, 1, 0, 0, 0}, {0.5f, 1024, 1, 1, 0, 0, 0},
                                      {0.5f, 1024, 1, 1, 0, 0, 0}, {-1.0f, 0, 1, 1, 0, 0, 0}};
    const int t = rt_dnn_choose(&strict, tie, 4);
    printf("  %-60s chose %d, want 1  %s\n", "a tie: less workspace, then the first", t, t == 1 ? "ok" : "FAIL");
    CHECK(t == 1);
    const struct rt_dnn_rule tight = {.f32 = 1, .ws_limit = 1024};
    CHECK(rt_dnn_choose(&tight, tie, 1) == -1 && rt_dnn_choose(&tight, tie, 3) == 1);
}

static void rules_wcache(void)
{
    printf("16-bit weight cache\n");
    struct rt_dnn_wcache w = {0};
    char *base = (char *)(uintptr_t)0x100000;
    /* w1: (4, 3, 9) fp32 = 432 bytes at base; w2 right after it; w3 the same source as w1 in another layout. */
    const struct rt_dnn_wkey k1 = {.src = base, .dt = RT_BF16, .layout = RT_DNN_W_KRSC, .k = 4, .c = 3, .rs = 9,
                                   .cpad = 8};
    const struct rt_dnn_wkey k2 = {.src = base + 432, .dt = RT_BF16, .layout = RT_DNN_W_KRSC, .k = 8, .c = 8, .rs = 1,
                                   .cpad = 8};
    const struct rt_dnn_wkey k3 = {.src = base, .dt = RT_F16, .layout = RT_DNN_W_PLAIN, .k = 4, .c = 27, .rs = 1,
                                   .cpad = 27};
    const int i1 = rt_dnn_wcache_add(&w, &k1), i2 = rt_dnn_wcache_add(&w, &k2), i3 = rt_dnn_wcache_add(&w, &k3);
    CHECK(i1 == 0 && i2 == 1 && i3 == 2);
    CHECK(rt_dnn_wcache_find(&w, &k1) == 0 && rt_dnn_wcache_find(&w, &k2) == 1 && rt_dnn_wcache_find(&w, &k3) == 2);
    struct rt_dnn_wkey other = k1;
    other.dt = RT_F16;
    CHECK(rt_dnn_wcache_find(&w, &other) == -1);
    other = k1;
    other.cpad = 3;
    CHECK(rt_dnn_wcache_find(&w, &other) == -1);
    CHECK(w.e[0].src_bytes == 432 && w.e[1].src_bytes == 256 && !w.e[0].valid);
    /* Each write starts from every copy valid; `stale` lists which it must make stale (w1, w2, w3 = bits). */
    static const struct {
        long off;
        size_t bytes;
        unsigned stale;
        const char *what;
    } writes[] = {
        {432 + 256, 64, 0, "just past every source"},
        {-64, 64, 0, "just before every source"},
        {100, 0, 0, "zero bytes"},
        {431, 1, 1 | 4, "the last byte of w1: w1 and w3 (its other layout)"},
        {432, 1, 2, "the first byte of w2 (w1 ends just before)"},
        {432 + 255, 1, 2, "the last byte of w2"},
        {-8, 16, 1 | 4, "across the start of w1"},
        {400, 64, 1 | 2 | 4, "across w1's end into w2"},
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(writes); i++) {
        for (int k = 0; k < w.n; k++)
            w.e[k].valid = 1;
        const int got = rt_dnn_wcache_invalidate(&w, base + writes[i].off, writes[i].bytes);
        unsigned stale = 0;
        int want = 0;
        for (int k = 0; k < 3; k++) {
            stale |= w.e[k].valid ? 0u : 1u << k;
            want += (writes[i].stale >> k) & 1;
        }
        const int ok = got == want && stale == writes[i].stale;
        printf("  write %-50s stale %d (mask %u), want %d (mask %u)  %s\n", writes[i].what, got, stale, want,
               writes[i].stale, ok ? "ok" : "FAIL");
        CHECKF(ok, "write at %+ld (%zu bytes): entries %u made stale, want %u", writes[i].off, writes[i].bytes, stale,
               writes[i].stale);
    }
    for (int k = 0; k < w.n; k++)
        w.e[k].valid = 0;
    CHECK(rt_dnn_wcache_invalidate(&w, base, 432) == 0); /* already stale: none newly */
    w.e[1].valid = 1;
    CHECK(rt_dnn_wcache_invalidate(&w, base + 432 + 255, 1000) == 1);
    for (int i = 0; i < w.n; i++)
        w.e[i].valid = 1;
    rt_dnn_wcache_invalidate_all(&w);
    CHECK(!w.e[0].valid && !w.e[1].valid && !w.e[2].valid);
    /* Bad keys are refused and change nothing; many entries grow the table. */
    struct rt_dnn_wkey bad = k1;
    bad.cpad = 2;
    CHECK(rt_dnn_wcache_add(&w, &bad) == -EINVAL);
    bad = k1;
    bad.k = 0;
    CHECK(rt_dnn_wcache_add(&w, &bad) == -EINVAL && w.n == 3);
    for (int i = 0; i < 100; i++) {
        struct rt_dnn_wkey k = k2;
        k.src = base + 4096 + 1024 * i;
        CHECK(rt_dnn_wcache_add(&w, &k) == 3 + i);
    }
    for (int i = 0; i < w.n; i++)
        w.e[i].valid = 1;
    CHECK(rt_dnn_wcache_invalidate(&w, base + 4096 + 1024 * 50 + 100, 1024) == 2); /* entries 50 and 51 */
    CHECK(w.e[3 + 50].valid == 0 && w.e[3 + 51].valid == 0 && w.e[3 + 49].valid && w.e[3 + 52].valid);
    rt_dnn_wcache_fini(&w);
    CHECK(w.n == 0 && w.e == NULL && rt_dnn_wcache_invalidate(&w, base, 4096) == 0);
}

static void rules_pad(void)
{
    printf("padded stem index arithmetic\n");
    static const int cs[] = {1, 2, 3, 5, 7, 8, 9, 13};
    static const int rss[] = {1, 9, 49};
    CHECK(rt_dnn_stem_channels(1) == 8 && rt_dnn_stem_channels(3) == 8 && rt_dnn_stem_channels(8) == 8 &&
          rt_dnn_stem_channels(9) == 16 && rt_dnn_stem_channels(0) == 0);
    size_t bad = 0, checked = 0;
    for (size_t ci = 0; ci < RT_ARRAY_LEN(cs); ci++) {
        const int c = cs[ci], cp = rt_dnn_stem_channels(c);
        CHECKF(cp % 8 == 0 && cp >= c && cp - c < 8, "c %d -> %d", c, cp);
        /* x (P, c) -> xp (P, cp): every element of x once, the rest pad. */
        const int P = 7;
        for (int64_t i = 0; i < (int64_t)P * cp; i++) {
            const int64_t p = i / cp, ch = i % cp, want = ch < c ? p * c + ch : -1;
            bad += rt_dnn_xpad_src(i, c, cp) != want;
            checked++;
        }
        for (size_t ri = 0; ri < RT_ARRAY_LEN(rss); ri++) {
            const int rs = rss[ri];
            for (int k = 1; k <= 5; k += 2) {
                /* weights (k, c, rs) -> (k, rs, cp) */
                for (int kk = 0; kk < k; kk++)
                    for (int p = 0; p < rs; p++)
                        for (int ch = 0; ch < cp; ch++) {
                            const int64_t i = ((int64_t)kk * rs + p) * cp + ch;
                            const int64_t want = ch < c ? ((int64_t)kk * c + ch) * rs + p : -1;
                            bad += rt_dnn_wpad_src(i, c, cp, rs) != want;
                            checked++;
                        }
                /* dw (k, c, rs) from g (k, rs, cp) and from g (k, cp, rs): only real channels are read */
                for (int kk = 0; kk < k; kk++)
                    for (int ch = 0; ch < c; ch++)
                        for (int p = 0; p < rs; p++) {
                            const int64_t i = ((int64_t)kk * c + ch) * rs + p;
                            bad += rt_dnn_dwpad16_src(i, c, cp, rs) != ((int64_t)kk * rs + p) * cp + ch;
                            bad += rt_dnn_dwpad32_src(i, c, cp, rs) != ((int64_t)kk * cp + ch) * rs + p;
                            checked += 2;
                        }
            }
        }
    }
    printf("  %-60s %zu of %zu indices wrong  %s\n", "x, weights, 16-bit and fp32 gradients, c 1..13", bad, checked,
           bad ? "FAIL" : "ok");
    CHECKF(bad == 0, "%zu of %zu padded-stem indices differ from the naive loops", bad, checked);
}

static cudnnDataType_t cudnn_type(enum rt_dtype dt)
{
    return dt == RT_BF16 ? CUDNN_DATA_BFLOAT16 : dt == RT_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
}

/* The graph dnn_fast.c builds for (d, dir, dt): fp32 NCHW, 16-bit NHWC with (K, R, S, C) filters; fp32_dw a
 * 16-bit backward filter writing an fp32 (K, C, R, S) dw. */
static struct rt_dnn_gspec spec_of(const struct rt_conv_desc *d, int dir, enum rt_dtype dt, int fp32_dw, float beta)
{
    const int f32 = dt == RT_F32;
    struct rt_dnn_gspec g = {.d = *d, .dir = dir, .xdt = cudnn_type(dt), .wdt = cudnn_type(dt), .ydt = cudnn_type(dt),
                             .x_nhwc = !f32, .w_krsc = !f32, .y_nhwc = !f32, .alpha = 1.0f, .beta = beta};
    if (fp32_dw) {
        g.wdt = CUDNN_DATA_FLOAT;
        g.w_krsc = 0;
    }
    return g;
}

struct conv_case {
    int n, cin, h, w, cout, k, stride, pad, bias;
    unsigned variants; /* which of VARS[] (GPU part) */
};

static int desc_of(const struct conv_case *cc, struct rt_conv_desc *d)
{
    *d = (struct rt_conv_desc){.in = {cc->n, cc->cin, cc->h, cc->w}, .cout = cc->cout, .kh = cc->k, .kw = cc->k,
                               .stride = cc->stride, .pad = cc->pad};
    return rt_conv_desc_init(d);
}

static void rules_graph(void)
{
    printf("cuDNN operation graphs, built without a device\n");
    if (rt_cudalibs_load(RT_CUDALIBS_CUDNN) < 0) {
        printf("  cuDNN does not load here (%s): skipped\n", rt_errmsg());
        return;
    }
    static const struct conv_case shapes[] = {
        {512, 64, 32, 32, 64, 3, 1, 1, 0, 0}, {7, 8, 32, 32, 64, 7, 2, 3, 0, 0}, {512, 64, 32, 32, 128, 1, 2, 0, 0, 0},
        {7, 256, 4, 4, 512, 3, 1, 1, 0, 0},   {7, 512, 1, 1, 512, 3, 1, 1, 0, 0},
    };
    static const enum rt_dtype dts[] = {RT_F32, RT_BF16, RT_F16};
    int built = 0, tried = 0;
    for (size_t i = 0; i < RT_ARRAY_LEN(shapes); i++) {
        struct rt_conv_desc d;
        if (desc_of(&shapes[i], &d) < 0) {
            CHECKF(0, "rt_conv_desc_init: %s", rt_errmsg());
            continue;
        }
        for (size_t t = 0; t < RT_ARRAY_LEN(dts); t++)
            for (int dir = 0; dir < 3; dir++)
                for (int f32dw = 0; f32dw <= (dir == DIR_BWD_FILTER && dts[t] != RT_F32); f32dw++) {
                    const float beta = dir == DIR_BWD_FILTER && (dts[t] == RT_F32 || f32dw) ? 1.0f : 0.0f;
                    const struct rt_dnn_gspec g = spec_of(&d, dir, dts[t], f32dw, beta);
                    struct rt_dnn_graph *gr = NULL;
                    char why[320] = "";
                    const int rc = rt_dnn_graph_create(NULL, &g, &gr, why, sizeof(why));
                    tried++;
                    built += rc == 0;
                    CHECKF(rc == 0 && gr, "N=%d Cin=%d -> %d %dx%d, direction %d, %s%s: %s", d.in.n, d.in.c, d.cout,
                           d.kh, d.kw, dir, rt_dtype_name(dts[t]), f32dw ? " fp32 dw" : "", why);
                    if (i == 0 && t == 1 && rc == 0) {
                        /* The heuristics may want a device: what they say here is printed, not judged. */
                        const int n = rt_dnn_graph_list(gr, 32, 8, why, sizeof(why));
                        printf("  heuristics without a device, direction %d bf16%s: %d configurations%s%s\n", dir,
                               f32dw ? " fp32 dw" : "", n, n < 0 ? ": " : "", n < 0 ? why : "");
                    }
                    rt_dnn_graph_destroy(gr);
                }
    }
    printf("  %-60s %d of %d  %s\n", "graphs finalized (every direction, type, dw type)", built, tried,
           built == tried ? "ok" : "FAIL");
    /* A y of the wrong height: refused, and the reason names the operation. */
    struct rt_conv_desc d;
    CHECK(desc_of(&shapes[0], &d) == 0);
    d.oh += 1;
    struct rt_dnn_gspec g = spec_of(&d, DIR_FWD, RT_BF16, 0, 0.0f);
    struct rt_dnn_graph *gr = NULL;
    char why[320] = "";
    const int rc = rt_dnn_graph_create(NULL, &g, &gr, why, sizeof(why));
    printf("  %-60s rc %d: %s  %s\n", "a wrong output shape is refused", rc, why,
           rc < 0 && !gr && strstr(why, "forward operation") ? "ok" : "FAIL");
    CHECKF(rc < 0 && !gr && strstr(why, "forward operation"), "a wrong y: rc %d, '%s'", rc, why);
    rt_dnn_graph_destroy(gr);
    g.dir = 5;
    CHECK(rt_dnn_graph_create(NULL, &g, &gr, why, sizeof(why)) == -EINVAL && !gr);
}

/* ==== on a GPU ========================================================================================= */

enum { CPU = 0, NGPU = 4 };

struct dev {
    const char *name;
    struct rt_backend *be;
    struct rt_stream *st;
};

/* [0] strict fp32, deterministic (zeroed options); [1] TF32; [2] any algorithm; [3] no graph API. */
static struct dev CPUB = {.name = "cpu"};
static struct dev G[NGPU] = {{.name = "cuda"}, {.name = "cuda tf32"}, {.name = "cuda any"}, {.name = "cuda no graph"}};

struct variant {
    const char *name;
    int gpu;
    enum rt_dtype dt;
    int deterministic, vs_ref;
};

enum { V_F32, V_TF32, V_BF16, V_F16, V_F32_ANY, V_BF16_ANY, V_F32_NOGRAPH, V_BF16_NOGRAPH, V_COUNT };
static const struct variant VARS[V_COUNT] = {
    [V_F32] = {"fp32", 0, RT_F32, 1, 1},           [V_TF32] = {"fp32 tf32", 1, RT_F32, 1, 0},
    [V_BF16] = {"bf16", 0, RT_BF16, 1, 1},         [V_F16] = {"fp16", 0, RT_F16, 1, 1},
    [V_F32_ANY] = {"fp32 any", 2, RT_F32, 0, 0},   [V_BF16_ANY] = {"bf16 any", 2, RT_BF16, 0, 0},
    [V_F32_NOGRAPH] = {"fp32 no graph", 3, RT_F32, 1, 0}, [V_BF16_NOGRAPH] = {"bf16 no graph", 3, RT_BF16, 1, 0},
};
#define VB(v) (1u << (v))
#define V_MAIN (VB(V_F32) | VB(V_BF16) | VB(V_F16))
#define V_ALL ((1u << V_COUNT) - 1)

/* ---- host arithmetic ---- */

/* x rounded to nearest even to p significant bits, exponent at least emin (16-bit values as floats). */
static float round_sig(float x, int p, int emin)
{
    if (!isfinite(x) || x == 0.0f)
        return x;
    int e;
    frexp(x, &e);
    e -= 1;
    const double scale = ldexp(1.0, (e < emin ? emin : e) - (p - 1));
    return (float)(nearbyint((double)x / scale) * scale);
}

static float round16(enum rt_dtype dt, float x)
{
    return dt == RT_BF16 ? round_sig(x, 8, -126) : dt == RT_F16 ? round_sig(x, 11, -14) : x;
}

/* The 16-bit unit roundoff (half an ulp at 1). */
static double unit16(enum rt_dtype dt)
{
    return dt == RT_BF16 ? 0x1p-8 : dt == RT_F16 ? 0x1p-11 : 0.0;
}

static float *dup_rounded(const float *x, size_t n, enum rt_dtype dt)
{
    float *y = tu_hfloats(n);
    for (size_t i = 0; i < n; i++)
        y[i] = round16(dt, x[i]);
    return y;
}

static float *dup_abs(const float *x, size_t n)
{
    float *y = tu_hfloats(n);
    for (size_t i = 0; i < n; i++)
        y[i] = fabsf(x[i]);
    return y;
}

static void fill_uniform(struct rt_rng *r, float *p, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * rt_rng_uniform(r);
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

/* ---- a case's host data and its CPU results ---- */

struct host {
    struct rt_conv_desc d;
    struct rt_shape4 ys;
    size_t nx, nw, ny, nb;
    int bias;
    float *x, *w, *b, *dy, *old_dx, *old_dw, *old_db;
};

/* The results every check compares: y; dx with beta 0 and with beta 1 over old_dx; dw and db added to old. */
struct res {
    float *y, *dx0, *dx1, *dw, *db;
};

static void res_alloc(const struct host *h, struct res *r)
{
    r->y = tu_hfloats(h->ny);
    r->dx0 = tu_hfloats(h->nx);
    r->dx1 = tu_hfloats(h->nx);
    r->dw = tu_hfloats(h->nw);
    r->db = tu_hfloats(h->nb);
}

static void res_free(struct res *r)
{
    free(r->y);
    free(r->dx0);
    free(r->dx1);
    free(r->dw);
    free(r->db);
    memset(r, 0, sizeof(*r));
}

static void *xalloc(struct dev *g, size_t bytes)
{
    void *p = rt_backend_ops(g->be)->alloc(g->be, bytes ? bytes : 4);
    if (!p) {
        fprintf(stderr, "test_cuda_conv: %s: alloc of %zu bytes: %s\n", g->name, bytes, rt_errmsg());
        exit(1);
    }
    return p;
}

static void xfree(struct dev *g, void *p)
{
    rt_backend_ops(g->be)->free(g->be, p);
}

/* Device buffers of one case on one backend and table. */
struct bufs {
    void *x, *w, *b, *y, *dy, *dx, *dw, *db;
};

static void bufs_alloc(struct dev *g, const struct host *h, size_t esz, struct bufs *o)
{
    o->x = xalloc(g, h->nx * esz);
    o->y = xalloc(g, h->ny * esz);
    o->dy = xalloc(g, h->ny * esz);
    o->dx = xalloc(g, h->nx * esz);
    o->w = xalloc(g, h->nw * sizeof(float));
    o->dw = xalloc(g, h->nw * sizeof(float));
    o->b = xalloc(g, h->nb * sizeof(float));
    o->db = xalloc(g, h->nb * sizeof(float));
}

static void bufs_free(struct dev *g, struct bufs *o)
{
    void *all[] = {o->x, o->y, o->dy, o->dx, o->w, o->dw, o->b, o->db};
    for (size_t i = 0; i < RT_ARRAY_LEN(all); i++)
        xfree(g, all[i]);
    memset(o, 0, sizeof(*o));
}

/*
 * Every direction of case h with table t on backend g, from the host inputs given (spatial ones NCHW; the
 * weights fp32, cast by the table if it is a 16-bit one): fills r. fwd_twice etc.: the second run of each,
 * for the determinism checks (NULL: not run).
 */
static void run_all(struct dev *g, const struct rt_ops *t, const struct host *h, const float *x, const float *w,
                    const float *dy, const float *old_dx, struct res *r, struct res *again)
{
    const size_t esz = t->act == RT_F32 ? 4 : 2;
    struct bufs o;
    bufs_alloc(g, h, esz, &o);
    struct rt_stream *s = g->st;
    t->from_nchw(s, h->d.in, x, o.x);
    t->upload(s, o.w, w, h->nw * sizeof(float));
    t->upload(s, o.b, h->b, h->nb * sizeof(float));
    t->from_nchw(s, h->ys, dy, o.dy);
    const float *bias = h->bias ? o.b : NULL;
    for (int rep = 0; rep < (again ? 2 : 1); rep++) {
        struct res *out = rep ? again : r;
        t->conv2d_fwd(s, &h->d, o.x, o.w, bias, o.y);
        t->to_nchw(s, h->ys, o.y, out->y);
        /* beta 0 must not read dx: NaN there would show. */
        float *nan = tu_hfloats(h->nx);
        for (size_t i = 0; i < h->nx; i++)
            nan[i] = NAN;
        t->from_nchw(s, h->d.in, nan, o.dx);
        free(nan);
        t->conv2d_bwd_data(s, &h->d, o.dy, o.w, 0.0f, o.dx);
        t->to_nchw(s, h->d.in, o.dx, out->dx0);
        t->from_nchw(s, h->d.in, old_dx, o.dx);
        t->conv2d_bwd_data(s, &h->d, o.dy, o.w, 1.0f, o.dx);
        t->to_nchw(s, h->d.in, o.dx, out->dx1);
        t->upload(s, o.dw, h->old_dw, h->nw * sizeof(float));
        t->upload(s, o.db, h->old_db, h->nb * sizeof(float));
        t->conv2d_bwd_filter(s, &h->d, o.x, o.dy, o.dw, h->bias ? o.db : NULL);
        t->download(s, out->dw, o.dw, h->nw * sizeof(float));
        t->download(s, out->db, o.db, h->nb * sizeof(float));
        t->sync(s);
    }
    bufs_free(g, &o);
}

/* ---- comparison ---- */

/*
 * |got - ref| <= 1e-5 + 1e-4 max|ref| + u * (|ref_i| + |old_i|) + min(tf * abs_i, TF32_GROSS * max|ref|) for
 * every element (old, abs may be NULL). Prints one line; returns the number outside.
 *
 * TF32_GROSS: tf * abs_i, the worst case, is far above what TF32 does where many terms are summed (a weight
 * gradient over N*H*W = 524288 products: 2^-9 * sum |a||b| is the size of the gradient itself), and would
 * let a layout mistake through. TF32's actual error is a bias of at most 2^-10 |ref_i| (truncated operands)
 * plus rounding that grows as 2^-10 sqrt(sum (ab)^2), under 2^-10 max|ref| for these inputs even at 6 sigma;
 * 2^-6 max|ref| leaves 16 times that and still fails a mistake that moves values by max|ref|.
 */
#define TF32_GROSS 0x1p-6
static size_t compare(const char *op, const char *shape, const char *var, const float *ref, const float *got,
                      size_t n, double u, const float *old, double tf, const float *abs)
{
    double mx = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ref[i]))
            mx = fmax(mx, fabs((double)ref[i]));
    size_t bad = 0, nb = 0;
    double worst = 0.0, werr = 0.0, wtol = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double r = ref[i], gv = got[i];
        double tol = 1e-5 + 1e-4 * mx + u * (fabs(r) + (old ? fabs((double)old[i]) : 0.0)) +
                     (abs ? fmin(tf * (double)abs[i], TF32_GROSS * mx) : 0.0);
        double err = isfinite(gv) && isfinite(r) ? fabs(gv - r) : (r == gv ? 0.0 : INFINITY);
        nb += fbits(ref[i]) != fbits(got[i]);
        if (!(err <= tol)) {
            if (bad < 5)
                fprintf(stderr, "    %s %s %s [%zu]: got %.9g want %.9g (err %.3g > tol %.3g)\n", op, var, shape, i, gv,
                        r, err, tol);
            bad++;
        }
        const double ratio = err / tol;
        if (i == 0 || ratio > worst) {
            worst = ratio;
            werr = err;
            wtol = tol;
        }
    }
    printf("  %-34s %-14s %-44s err %-9.3g tol %-9.3g n=%zu, %zu not bit-equal  %s\n", op, var, shape, werr, wtol, n,
           nb, bad ? "FAIL" : "ok");
    CHECKF(bad == 0, "%s %s %s: %zu of %zu values outside the tolerance", op, var, shape, bad, n);
    return bad;
}

static void compare_bits(const char *op, const char *shape, const char *var, const float *a, const float *b, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += fbits(a[i]) != fbits(b[i]);
    printf("  %-34s %-14s %-44s %zu of %zu values differ between two calls  %s\n", op, var, shape, bad, n,
           bad ? "FAIL" : "ok");
    CHECKF(bad == 0, "%s %s %s: the same call twice differs in %zu of %zu values", op, var, shape, bad, n);
}

static void compare_res(const char *what, const char *shape, const char *var, const struct host *h,
                        const struct res *ref, const struct res *got, double u, const float *old_dx, double tf,
                        const struct res *abs)
{
    char op[64];
    /* A 16-bit forward rounds the convolution, then the sum with the bias: |b| joins the scale. */
    float *yb = NULL;
    if (h->bias) {
        yb = tu_hfloats(h->ny);
        const size_t hw = (size_t)h->ys.h * h->ys.w;
        for (size_t i = 0; i < h->ny; i++)
            yb[i] = fabsf(h->b[i / hw % (size_t)h->ys.c]);
    }
    snprintf(op, sizeof(op), "%sforward", what);
    compare(op, shape, var, ref->y, got->y, h->ny, u, yb, tf, abs ? abs->y : NULL);
    free(yb);
    snprintf(op, sizeof(op), "%sbackward data beta 0", what);
    compare(op, shape, var, ref->dx0, got->dx0, h->nx, u, NULL, tf, abs ? abs->dx0 : NULL);
    snprintf(op, sizeof(op), "%sbackward data beta 1", what);
    compare(op, shape, var, ref->dx1, got->dx1, h->nx, u, old_dx, tf, abs ? abs->dx0 : NULL);
    snprintf(op, sizeof(op), "%sbackward filter dw (+=)", what);
    compare(op, shape, var, ref->dw, got->dw, h->nw, u, h->old_dw, tf, abs ? abs->dw : NULL);
    if (h->bias) {
        snprintf(op, sizeof(op), "%sbackward filter db (+=)", what);
        compare(op, shape, var, ref->db, got->db, h->nb, u, h->old_db, tf, abs ? abs->db : NULL);
    }
}

/* ---- one case ---- */

static void host_make(const struct conv_case *cc, uint64_t stream, struct host *h)
{
    memset(h, 0, sizeof(*h));
    if (desc_of(cc, &h->d) < 0) {
        fprintf(stderr, "test_cuda_conv: rt_conv_desc_init: %s\n", rt_errmsg());
        exit(1);
    }
    h->ys = (struct rt_shape4){cc->n, cc->cout, h->d.oh, h->d.ow};
    h->nx = (size_t)cc->n * cc->cin * cc->h * cc->w;
    h->ny = (size_t)h->ys.n * h->ys.c * h->ys.h * h->ys.w;
    h->nw = (size_t)cc->cout * cc->cin * cc->k * cc->k;
    h->nb = (size_t)cc->cout;
    h->bias = cc->bias;
    struct rt_rng r;
    rt_rng_init(&r, SEED, stream);
    h->x = tu_hfloats(h->nx);
    h->w = tu_hfloats(h->nw);
    h->b = tu_hfloats(h->nb);
    h->dy = tu_hfloats(h->ny);
    h->old_dx = tu_hfloats(h->nx);
    h->old_dw = tu_hfloats(h->nw);
    h->old_db = tu_hfloats(h->nb);
    const float bound = sqrtf(3.0f / (float)(cc->cin * cc->k * cc->k)); /* unit-variance outputs */
    fill_uniform(&r, h->x, h->nx, -1, 1);
    fill_uniform(&r, h->w, h->nw, -bound, bound);
    fill_uniform(&r, h->b, h->nb, -1, 1);
    fill_uniform(&r, h->dy, h->ny, -1, 1);
    fill_uniform(&r, h->old_dx, h->nx, -1, 1);
    fill_uniform(&r, h->old_dw, h->nw, -1, 1);
    fill_uniform(&r, h->old_db, h->nb, -1, 1);
}

static void host_free(struct host *h)
{
    free(h->x);
    free(h->w);
    free(h->b);
    free(h->dy);
    free(h->old_dx);
    free(h->old_dw);
    free(h->old_db);
}

/* The CPU's results on (possibly rounded or absolute) inputs; old_dx as given, the rest of the host's. */
static void cpu_run(const struct host *h, const float *x, const float *w, const float *dy, const float *old_dx,
                    struct res *r)
{
    res_alloc(h, r);
    run_all(&CPUB, rt_backend_ops(CPUB.be), h, x, w, dy, old_dx, r, NULL);
}

static void run_case(const struct conv_case *cc, uint64_t stream)
{
    struct host h;
    host_make(cc, stream, &h);
    char shape[96];
    snprintf(shape, sizeof(shape), "x(%d,%d,%d,%d) w(%d,%d,%d,%d) s%d p%d%s", cc->n, cc->cin, cc->h, cc->w, cc->cout,
             cc->cin, cc->k, cc->k, cc->stride, cc->pad, cc->bias ? " +b" : "");
    printf("case %s\n", shape);
    const uint64_t t0 = rt_now_ns();

    /* CPU results per input rounding: fp32 (and the absolute values for the TF32 bound), bf16, fp16. */
    struct res ref32 = {0}, refabs = {0}, ref16[2] = {{0}, {0}};
    float *r16x[2] = {0}, *r16w[2] = {0}, *r16dy[2] = {0}, *r16old[2] = {0};
    const int need16[2] = {(cc->variants & (VB(V_BF16) | VB(V_BF16_ANY) | VB(V_BF16_NOGRAPH))) != 0,
                           (cc->variants & VB(V_F16)) != 0};
    cpu_run(&h, h.x, h.w, h.dy, h.old_dx, &ref32);
    if (cc->variants & VB(V_TF32)) {
        /* sum |a||b| of each output: the convolutions of the absolute values, nothing added to. */
        float *ax = dup_abs(h.x, h.nx), *aw = dup_abs(h.w, h.nw), *ady = dup_abs(h.dy, h.ny);
        float *zx = calloc(h.nx, sizeof(float));
        struct host ha = h;
        ha.old_dw = calloc(h.nw, sizeof(float));
        ha.old_db = calloc(h.nb, sizeof(float));
        ha.b = calloc(h.nb, sizeof(float));
        if (!zx || !ha.old_dw || !ha.old_db || !ha.b) {
            fprintf(stderr, "test_cuda_conv: out of memory\n");
            exit(1);
        }
        cpu_run(&ha, ax, aw, ady, zx, &refabs);
        free(ax);
        free(aw);
        free(ady);
        free(zx);
        free(ha.old_dw);
        free(ha.old_db);
        free(ha.b);
    }
    for (int t = 0; t < 2; t++) {
        if (!need16[t])
            continue;
        const enum rt_dtype dt = t ? RT_F16 : RT_BF16;
        r16x[t] = dup_rounded(h.x, h.nx, dt);
        r16w[t] = dup_rounded(h.w, h.nw, dt);
        r16dy[t] = dup_rounded(h.dy, h.ny, dt);
        r16old[t] = dup_rounded(h.old_dx, h.nx, dt);
        cpu_run(&h, r16x[t], r16w[t], r16dy[t], r16old[t], &ref16[t]);
    }

    for (int v = 0; v < V_COUNT; v++) {
        if (!(cc->variants & VB(v)))
            continue;
        const struct variant *V = &VARS[v];
        struct dev *g = &G[V->gpu];
        const struct rt_ops *t = rt_backend_ops_for(g->be, V->dt);
        if (!t) {
            printf("  %-34s %-14s %-44s no such table here (%s): skipped\n", "all", V->name, shape, rt_errmsg());
            continue;
        }
        const int i16 = V->dt == RT_F16;
        const float *x = V->dt == RT_F32 ? h.x : r16x[i16], *dy = V->dt == RT_F32 ? h.dy : r16dy[i16];
        const float *old = V->dt == RT_F32 ? h.old_dx : r16old[i16];
        const struct res *ref = V->dt == RT_F32 ? &ref32 : &ref16[i16];
        const double u = 2.0 * unit16(V->dt);
        struct res got, again;
        res_alloc(&h, &got);
        res_alloc(&h, &again);
        if (V->gpu == 3) /* read when that backend's first convolution makes its state */
            setenv("RINGTRAIN_CUDNN_GRAPH", "0", 1);
        /* The weights go up fp32: a 16-bit table casts them itself. */
        run_all(g, t, &h, x, h.w, dy, old, &got, V->deterministic ? &again : NULL);
        if (V->gpu == 3)
            unsetenv("RINGTRAIN_CUDNN_GRAPH");
        compare_res("", shape, V->name, &h, ref, &got, u, old, v == V_TF32 ? 0x1p-9 : 0.0,
                    v == V_TF32 ? &refabs : NULL);
        if (V->deterministic) {
            compare_bits("forward, twice", shape, V->name, got.y, again.y, h.ny);
            compare_bits("backward data beta 1, twice", shape, V->name, got.dx1, again.dx1, h.nx);
            compare_bits("backward filter dw, twice", shape, V->name, got.dw, again.dw, h.nw);
        }
        if (V->vs_ref) {
            /* The reference tables on the same device: their results as the reference, twice the rounding. */
            const struct rt_ops *rt = rt_backend_ops_reference(g->be, V->dt);
            struct res rr;
            res_alloc(&h, &rr);
            run_all(g, rt, &h, x, h.w, dy, old, &rr, NULL);
            compare_res("vs reference: ", shape, V->name, &h, &rr, &got, 2.0 * u, old, 0.0, NULL);
            res_free(&rr);
        }
        res_free(&got);
        res_free(&again);
    }
    res_free(&ref32);
    res_free(&refabs);
    for (int t = 0; t < 2; t++) {
        res_free(&ref16[t]);
        free(r16x[t]);
        free(r16w[t]);
        free(r16dy[t]);
        free(r16old[t]);
    }
    host_free(&h);
    printf("  (%.1f s)\n", (double)(rt_now_ns() - t0) / 1e9);
}

/* ---- the 16-bit weight copies ---- */

static int casts_of(struct dev *g)
{
    struct rt_dnn_stats st;
    rt_dnn_fast_stats(g->be->cuda, &st);
    return st.weight_casts;
}

/* Case cc's forward (no bias) with the dt table of G[0]: its 16-bit weight copy made once, reused by a second
 * forward (and, but for a stem, a backward data), and remade after each kind of write into the fp32 weights
 * (upload, scale, copy, an SGD and an Adam step), each forward against the CPU on the weights then current
 * (rounded to dt); prints the casts counted. */
static void weights_check(const struct conv_case *cc, enum rt_dtype dt)
{
    struct dev *g = &G[0];
    const struct rt_ops *t = rt_backend_ops_for(g->be, dt), *t32 = rt_backend_ops(g->be);
    if (!t)
        return;
    struct host h;
    host_make(cc, 900 + (uint64_t)cc->cin, &h);
    char shape[96];
    snprintf(shape, sizeof(shape), "x(%d,%d,%d,%d) w(%d,%d,%d,%d) %s", cc->n, cc->cin, cc->h, cc->w, cc->cout, cc->cin,
             cc->k, cc->k, rt_dtype_name(dt));
    struct bufs o;
    bufs_alloc(g, &h, 2, &o);
    float *xr = dup_rounded(h.x, h.nx, dt), *y1 = tu_hfloats(h.ny), *y2 = tu_hfloats(h.ny);
    float *w2 = tu_hfloats(h.nw);
    struct rt_rng r;
    rt_rng_init(&r, SEED, 990);
    fill_uniform(&r, w2, h.nw, -0.3f, 0.3f);
    void *wsrc = xalloc(g, h.nw * sizeof(float));
    struct rt_stream *s = g->st;
    t->from_nchw(s, h.d.in, xr, o.x);
    t->upload(s, o.w, h.w, h.nw * sizeof(float));
    t->from_nchw(s, h.ys, h.dy, o.dy);

    /* The CPU's forward on the rounded weights cur[] (no bias). */
    float *cur = tu_hfloats(h.nw);
    struct res ref = {0};
    struct host hn = h;
    hn.bias = 0;
#define REF_ON(wts)                                                                                              \
    do {                                                                                                         \
        for (size_t i_ = 0; i_ < h.nw; i_++)                                                                     \
            cur[i_] = round16(dt, (wts)[i_]);                                                                    \
        res_free(&ref);                                                                                          \
        cpu_run(&hn, xr, cur, h.dy, h.old_dx, &ref);                                                             \
    } while (0)

    /* A stem's first forward may cast twice (its padded copy, then the unpadded one when the padded shape has
     * no candidate); a stem's backward data uses the unpadded layout and is not part of a model. */
    const int stem = cc->cin % 8 != 0;
    const int c0 = casts_of(g);
    t->conv2d_fwd(s, &h.d, o.x, o.w, NULL, o.y);
    t->to_nchw(s, h.ys, o.y, y1);
    const int c1 = casts_of(g);
    t->conv2d_fwd(s, &h.d, o.x, o.w, NULL, o.y);
    if (!stem)
        t->conv2d_bwd_data(s, &h.d, o.dy, o.w, 0.0f, o.dx);
    t->to_nchw(s, h.ys, o.y, y2);
    const int c2 = casts_of(g);
    const int first_ok = stem ? c1 == c0 + 1 || c1 == c0 + 2 : c1 == c0 + 1;
    printf("  %-34s %-14s %-44s casts %d, %d, %d (first forward, then forward%s)  %s\n", "weights cast once", "",
           shape, c0, c1, c2, stem ? "" : " + backward data", first_ok && c2 == c1 ? "ok" : "FAIL");
    CHECKF(first_ok && c2 == c1, "%s: weight casts %d -> %d -> %d: want one, then none", shape, c0, c1, c2);
    compare_bits("forward, cached weights", shape, "", y1, y2, h.ny);
    REF_ON(h.w);
    compare("forward, first weights", shape, "", ref.y, y1, h.ny, 2.0 * unit16(dt), NULL, 0.0, NULL);

    /* An upload into the weights: seen. */
    t32->upload(s, o.w, w2, h.nw * sizeof(float));
    t->conv2d_fwd(s, &h.d, o.x, o.w, NULL, o.y);
    t->to_nchw(s, h.ys, o.y, y2);
    REF_ON(w2);
    compare("forward after an upload", shape, "", ref.y, y2, h.ny, 2.0 * unit16(dt), NULL, 0.0, NULL);
    size_t same = 0;
    for (size_t i = 0; i < h.ny; i++)
        same += fbits(y1[i]) == fbits(y2[i]);
    CHECKF(same < h.ny / 2, "%s: the forward after new weights equals the old one in %zu of %zu values", shape, same,
           h.ny);
    /* A kernel of the fp32 table writing the weights: scale by 0.5 (exact in every type). */
    t32->scale(s, h.nw, 0.5f, o.w);
    t->conv2d_fwd(s, &h.d, o.x, o.w, NULL, o.y);
    t->to_nchw(s, h.ys, o.y, y2);
    for (size_t i = 0; i < h.nw; i++)
        w2[i] *= 0.5f;
    REF_ON(w2);
    compare("forward after a scale", shape, "", ref.y, y2, h.ny, 2.0 * unit16(dt), NULL, 0.0, NULL);
    /* A device copy into the weights. */
    t32->upload(s, wsrc, h.w, h.nw * sizeof(float));
    t32->copy(s, o.w, wsrc, h.nw * sizeof(float));
    t->conv2d_fwd(s, &h.d, o.x, o.w, NULL, o.y);
    t->to_nchw(s, h.ys, o.y, y2);
    REF_ON(h.w);
    compare("forward after a copy", shape, "", ref.y, y2, h.ny, 2.0 * unit16(dt), NULL, 0.0, NULL);
    /* The optimizer steps, as a training step writes the weights: the CPU's step on the same weights is what the
     * forward must then see (compute.h promises both backends the same order of operations). */
    {
        const struct rt_ops *c32 = rt_backend_ops(CPUB.be);
        float *gr = tu_hfloats(h.nw), *wn = tu_hfloats(h.nw);
        fill_uniform(&r, gr, h.nw, -1, 1);
        void *cw = xalloc(&CPUB, h.nw * 4), *cg = xalloc(&CPUB, h.nw * 4), *cm = xalloc(&CPUB, h.nw * 4),
             *cv = xalloc(&CPUB, h.nw * 4);
        void *gg = xalloc(g, h.nw * 4), *gm = xalloc(g, h.nw * 4), *gv = xalloc(g, h.nw * 4);
        c32->upload(CPUB.st, cw, h.w, h.nw * 4);
        c32->upload(CPUB.st, cg, gr, h.nw * 4);
        t32->upload(s, gg, gr, h.nw * 4);
        for (int step = 0; step < 2; step++) {
            if (step == 0) {
                c32->sgd_update(CPUB.st, h.nw, cw, cg, cm, 0.1f, 0.9f, 0.0f, 1e-4f, 0, 1, NULL);
                t32->sgd_update(s, h.nw, o.w, gg, gm, 0.1f, 0.9f, 0.0f, 1e-4f, 0, 1, NULL);
            } else {
                c32->adam_update(CPUB.st, h.nw, cw, cg, cm, cv, 0.01f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 1, NULL);
                t32->adam_update(s, h.nw, o.w, gg, gm, gv, 0.01f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 1, NULL);
            }
            c32->download(CPUB.st, wn, cw, h.nw * 4);
            t->conv2d_fwd(s, &h.d, o.x, o.w, NULL, o.y);
            t->to_nchw(s, h.ys, o.y, y2);
            REF_ON(wn);
            compare(step ? "forward after an Adam step" : "forward after an SGD step", shape, "", ref.y, y2, h.ny,
                    2.0 * unit16(dt), NULL, 0.0, NULL);
        }
        xfree(&CPUB, cw);
        xfree(&CPUB, cg);
        xfree(&CPUB, cm);
        xfree(&CPUB, cv);
        xfree(g, gg);
        xfree(g, gm);
        xfree(g, gv);
        free(gr);
        free(wn);
    }
    const int c3 = casts_of(g);
    printf("  %-34s %-14s %-44s %d casts for 5 writes  %s\n", "weights cast again after a write", "", shape, c3 - c2,
           c3 - c2 == 5 ? "ok" : "FAIL");
    CHECKF(c3 - c2 == 5, "%s: %d casts after 5 writes (upload, scale, copy, SGD, Adam)", shape, c3 - c2);
#undef REF_ON
    res_free(&ref);
    free(cur);
    free(w2);
    free(xr);
    free(y1);
    free(y2);
    xfree(g, wsrc);
    bufs_free(g, &o);
    host_free(&h);
}

/* The 16-bit linear layer: the cached weights, remade after an upload. */
static void linear_check(enum rt_dtype dt)
{
    struct dev *g = &G[0];
    const struct rt_ops *t = rt_backend_ops_for(g->be, dt), *c32 = rt_backend_ops(CPUB.be);
    if (!t)
        return;
    const int n = 7, in = 64, out = 10;
    struct rt_rng r;
    rt_rng_init(&r, SEED, 995);
    float *x = tu_hfloats((size_t)n * in), *w = tu_hfloats((size_t)in * out), *y = tu_hfloats((size_t)n * out);
    float *ref = tu_hfloats((size_t)n * out), *wr = tu_hfloats((size_t)in * out);
    fill_uniform(&r, x, (size_t)n * in, -1, 1);
    for (size_t i = 0; i < (size_t)n * in; i++)
        x[i] = round16(dt, x[i]);
    void *cx = xalloc(&CPUB, (size_t)n * in * 4), *cw = xalloc(&CPUB, (size_t)in * out * 4),
         *cy = xalloc(&CPUB, (size_t)n * out * 4);
    void *gx = xalloc(g, (size_t)n * in * 2), *gw = xalloc(g, (size_t)in * out * 4),
         *gy = xalloc(g, (size_t)n * out * 2);
    c32->upload(CPUB.st, cx, x, (size_t)n * in * 4);
    /* (N, F) features: the 16-bit table's from_nchw of (N, F, 1, 1) rounds them in. */
    t->from_nchw(g->st, (struct rt_shape4){n, in, 1, 1}, x, gx);
    for (int round = 0; round < 2; round++) {
        fill_uniform(&r, w, (size_t)in * out, -0.2f, 0.2f);
        for (size_t i = 0; i < (size_t)in * out; i++)
            wr[i] = round16(dt, w[i]);
        c32->upload(CPUB.st, cw, wr, (size_t)in * out * 4);
        c32->linear_fwd(CPUB.st, n, in, out, cx, cw, NULL, cy);
        c32->download(CPUB.st, ref, cy, (size_t)n * out * 4);
        t->upload(g->st, gw, w, (size_t)in * out * 4);
        t->linear_fwd(g->st, n, in, out, gx, gw, NULL, gy);
        t->to_nchw(g->st, (struct rt_shape4){n, out, 1, 1}, gy, y);
        compare(round ? "linear forward after an upload" : "linear forward", "(7,64)x(64,10)^T", rt_dtype_name(dt), ref,
                y, (size_t)n * out, 2.0 * unit16(dt), NULL, 0.0, NULL);
    }
    xfree(&CPUB, cx);
    xfree(&CPUB, cw);
    xfree(&CPUB, cy);
    xfree(g, gx);
    xfree(g, gw);
    xfree(g, gy);
    free(x);
    free(w);
    free(y);
    free(ref);
    free(wr);
}

/* ---- what each backend chose ---- */

static void choices_check(int gi)
{
    struct dev *g = &G[gi];
    const int n = rt_backend_conv_choices(g->be, NULL, 0);
    struct rt_conv_choice *ch = calloc((size_t)(n > 0 ? n : 1), sizeof(*ch));
    if (!ch)
        exit(1);
    const int m = rt_backend_conv_choices(g->be, ch, n);
    struct rt_dnn_stats st;
    rt_dnn_fast_stats(g->be->cuda, &st);
    printf("choices of %s (%d): %d keys measured, %d graphs (%d failed), %d plans (%d failed), %d engines and %d "
           "legacy algorithms timed; won: %d engines (%d with an fp32 dw), %d legacy, %d handed to the reference; "
           "stems %d padded, %d not; %d weight casts\n",
           g->name, n, st.keys, st.graphs, st.graph_fail, st.plans, st.plan_fail, st.engines_timed, st.legacy_timed,
           st.engine_wins, st.fp32_dw_wins, st.legacy_wins, st.ref_falls, st.stems_padded, st.stems_unpadded,
           st.weight_casts);
    CHECK(m == n);
    static const char *const dirs[3] = {"fwd", "bwd data", "bwd filter"};
    size_t bad = 0, engines = 0;
    for (int i = 0; i < m; i++) {
        const struct rt_conv_choice *c = &ch[i];
        const int reference = !strncmp(c->how, "reference", 9);
        printf("  %-10s %-4s N=%-3d %3d->%-3d %2dx%-2d %dx%d s%d p%d  %8.4f ms  %9zu B  %-3s %-3s %2d cand.  %s\n",
               dirs[c->dir], rt_dtype_name(c->dt), c->d.in.n, c->d.in.c, c->d.cout, c->d.in.h, c->d.in.w, c->d.kh,
               c->d.kw, c->d.stride, c->d.pad, (double)c->ms, c->workspace, c->deterministic ? "det" : "any",
               c->tensor_cores ? "tc" : "-", c->candidates, c->how);
        engines += strstr(c->how, "cudnn engine") != NULL;
        int ok = c->how[0] && c->workspace <= DNN_WORKSPACE_CAP && (int)c->dir >= 0 && (int)c->dir < 3;
        if (!reference)
            ok = ok && c->ms > 0.0f && c->candidates >= 1;
        if (!reference && gi != 2)
            ok = ok && c->deterministic;
        if (c->dt == RT_F32 && gi != 1)
            ok = ok && !c->tensor_cores;
        if (gi == 3)
            ok = ok && !strstr(c->how, "cudnn engine");
        if (!ok && bad++ < 5)
            fprintf(stderr, "    choice %d of %s breaks the backend's settings: %s\n", i, g->name, c->how);
    }
    CHECKF(bad == 0, "%s: %zu choices break its settings", g->name, bad);
    CHECKF(n > 0, "%s lists no convolution choice", g->name);
    if (gi == 3)
        CHECKF(!st.graph_on && st.graphs == 0 && st.engines_timed == 0,
               "%s: RINGTRAIN_CUDNN_GRAPH=0, yet %d graphs were built and %d engines timed", g->name, st.graphs,
               st.engines_timed);
    else
        CHECKF(st.graph_on && st.engines_timed > 0,
               "%s: the graph API gave no engine to time (%d graphs, %d failed; %d plans, %d failed): see the debug "
               "lines of the first case",
               g->name, st.graphs, st.graph_fail, st.plans, st.plan_fail);
    printf("  %s: %zu of %d choices are graph-API engines\n", g->name, engines, n);
    free(ch);
}

/* ---- main ---- */

static int gpu_main(int verbose)
{
    struct rt_backend_opts o[NGPU] = {{.kind = RT_BACKEND_CUDA},
                                      {.kind = RT_BACKEND_CUDA, .tf32 = 1},
                                      {.kind = RT_BACKEND_CUDA, .nondeterministic = 1},
                                      {.kind = RT_BACKEND_CUDA}};
    if (rt_backend_create(&o[0], &G[0].be) < 0) {
        printf("test_cuda_conv: no usable GPU: %s: skipped\n", rt_errmsg());
        return 77;
    }
    if (rt_backend_ops(G[0].be) == rt_backend_ops_reference(G[0].be, RT_F32)) {
        printf("test_cuda_conv: RINGTRAIN_CUDA_KERNELS=reference: the backend's own tables are the reference ones, "
               "the fast convolutions are not in use: skipped\n");
        rt_backend_destroy(G[0].be);
        return 77;
    }
    for (int i = 1; i < NGPU; i++)
        if (rt_backend_create(&o[i], &G[i].be) < 0) {
            fprintf(stderr, "test_cuda_conv: a second CUDA backend (%s): %s\n", G[i].name, rt_errmsg());
            return 1;
        }
    if (rt_backend_create(&(struct rt_backend_opts){.kind = RT_BACKEND_CPU}, &CPUB.be) < 0) {
        fprintf(stderr, "test_cuda_conv: CPU backend: %s\n", rt_errmsg());
        return 1;
    }
    CPUB.st = rt_backend_stream(CPUB.be);
    for (int i = 0; i < NGPU; i++)
        G[i].st = rt_backend_stream(G[i].be);
    printf("test_cuda_conv: seed %llu; %s\n", (unsigned long long)SEED, rt_backend_describe(G[0].be));

    /* The first case logs every candidate (debug level): where the graph API fails, the attribute is named. */
    static const struct conv_case cases[] = {
        {512, 64, 32, 32, 64, 3, 1, 1, 0, V_ALL},
        {512, 3, 32, 32, 64, 3, 1, 1, 0, V_MAIN | VB(V_TF32) | VB(V_BF16_ANY) | VB(V_BF16_NOGRAPH)},
        {512, 3, 32, 32, 64, 7, 2, 3, 0, V_MAIN},
        {7, 3, 32, 32, 64, 3, 1, 1, 1, V_MAIN | VB(V_TF32)},
        {7, 64, 32, 32, 64, 3, 1, 1, 1, V_MAIN | VB(V_TF32) | VB(V_F32_ANY)},
        {512, 64, 32, 32, 128, 3, 2, 1, 0, V_MAIN | VB(V_TF32)},
        {512, 64, 32, 32, 128, 1, 2, 0, 0, V_MAIN},
        {7, 64, 32, 32, 128, 1, 2, 0, 1, V_MAIN},
        {512, 256, 4, 4, 512, 3, 1, 1, 0, V_MAIN | VB(V_TF32) | VB(V_F32_NOGRAPH)},
        {7, 256, 4, 4, 512, 3, 1, 1, 1, V_MAIN},
        {512, 512, 2, 2, 512, 3, 1, 1, 0, V_MAIN},
        {7, 512, 1, 1, 512, 3, 1, 1, 1, V_MAIN | VB(V_TF32)},
    };
    const uint64_t t0 = rt_now_ns();
    for (size_t i = 0; i < RT_ARRAY_LEN(cases); i++) {
        rt_log_setup(0, 1, verbose || i == 0 ? RT_LOG_DEBUG : RT_LOG_INFO);
        run_case(&cases[i], 100 + i);
    }
    rt_log_setup(0, 1, verbose ? RT_LOG_DEBUG : RT_LOG_INFO);

    printf("16-bit weight copies\n");
    static const struct conv_case wc[] = {{7, 64, 8, 8, 64, 3, 1, 1, 0, 0}, {7, 3, 8, 8, 64, 3, 1, 1, 0, 0}};
    for (size_t i = 0; i < RT_ARRAY_LEN(wc); i++) {
        weights_check(&wc[i], RT_BF16);
        weights_check(&wc[i], RT_F16);
    }
    linear_check(RT_BF16);
    linear_check(RT_F16);

    for (int i = 0; i < NGPU; i++)
        choices_check(i);
    printf("GPU part: %.1f s\n", (double)(rt_now_ns() - t0) / 1e9);
    for (int i = 0; i < NGPU; i++)
        rt_backend_destroy(G[i].be);
    rt_backend_destroy(CPUB.be);
    return check_result();
}
#endif

int test_cuda_conv_main(int argc, char **argv)
{
    int rules = 0, verbose = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rules"))
            rules = 1;
        else if (!strcmp(argv[i], "-v"))
            verbose = 1;
        else {
            fprintf(stderr, "usage: test_cuda_ops conv [--rules] [-v]\n");
            return 1;
        }
    }
#if RT_HAVE_CUDA
    if (rules) {
        printf("test_cuda_ops conv --rules: no GPU needed\n");
        rules_choose();
        rules_wcache();
        rules_pad();
        rules_graph();
        return check_result();
    }
    return gpu_main(verbose);
#else
    (void)rules;
    (void)verbose;
    printf("test_cuda_conv: this build has no CUDA backend: skipped\n");
    return 77;
#endif
}
