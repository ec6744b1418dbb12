/*
 * test_cuda_ops.c - the CUDA backend against the CPU backend, op by op, then
 * whole models.
 *
 * Ops: every slot of struct rt_ops is run on both backends with the same
 * inputs and the CUDA result compared with the CPU's, the reference (the
 * CPU ops are themselves checked against naive double-precision references
 * and finite differences in test_ops_spatial.c and test_ops_elem.c),
 * element by element: through the op-table engine (optable_check.h) with
 * the CUDA table below (CUDA_TOL, CUDA_CASES), which must also catch the
 * engine's planted faults; then what the engine does not check (memory,
 * loss scaling, casts, optimizers, the dropout stream drawn on the device,
 * the 16-bit tables' dropout masks and bn_infer_bwd). One line per check.
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
 * runs without a GPU: the op part against the CPU's fp32 table with every
 * op output moved by up to 2 ulps (the ops the CUDA table holds exact left
 * as they are), the models with the CPU backend's bf16 table in the GPU's
 * place and, for fp32, that perturbed table: so the op bounds, the model
 * bounds the first GPU run meets, the floors (fp16's too) and the planted
 * faults have run in CI. It skips (77) on a
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

/* ---- the two backends ------------------------------------------------------------------------------ */

enum { CPU = 0, GPU = 1 };

static struct oc_side S[2] = {{.name = "cpu"}, {.name = "cuda"}};

/* ---- the op table: CUDA's bounds and cases ----------------------------------------------------------- */

/*
 * |cuda - cpu| <= atol + rtol |cpu| (element-wise) or atol + rmax max|cpu|
 * over the tensor (for results that are sums, where a value near zero is
 * the difference of large partial sums and carries their rounding); exact:
 * the same value (two NaNs agree). Wherever the CPU value is NaN or +-Inf
 * the CUDA value must be NaN or the same Inf. An index, layout or stride
 * mistake moves values by the order of max |cpu|, far above every bound.
 *  - exact: copies, layout, flatten, max pooling forward, ReLU, add, scale,
 *    the residual add and its ReLU (one IEEE operation, or a select, per
 *    element: no contraction can change them), counts.
 *  - elementwise (1e-6, ~8 ulp at 1): input normalisation, the backward
 *    ops with beta, axpy, average pooling, max pooling backward (up to 4
 *    overlapping windows summed in another order), dropout's values, batchnorm
 *    inference's backward: a few roundings, and a compiler may contract
 *    a*b+c into an FMA on one side only.
 *  - transcendental (rtol 1e-5): GELU and the loss's softmax, glibc's
 *    erff/expf against CUDA's, each within a few ulp.
 *  - gemm (rmax 1e-4): cuDNN/cuBLAS algorithms, blocking, split-K and
 *    Winograd/FFT sum in another order, rounding with sqrt(K) ulp of the
 *    largest partial sum; TF32 (10-bit mantissa, ~1e-3) fails.
 *  - reduction (rmax 1e-5): batchnorm and global pooling sum up to ~2000
 *    values per channel, tree against sequential; channels of mean 20 and
 *    sd 0.5 make a cancelling variance formula (E[x^2] - E[x]^2 in float)
 *    show as ~1e-4. The loss sum likewise.
 *  - sumsq (rtol 2.5e-7): both accumulate in double (compute.h), so only the
 *    final float rounding can differ.
 */
#define EXACT {.name = "exact", .flags = OC_EXACT}
#define ELEM {.name = "elementwise", .atol = 1e-6, .rtol = 1e-6}
#define TRANS {.name = "transcendental", .atol = 1e-6, .rtol = 1e-5}
#define GEMM {.name = "gemm", .atol = 1e-5, .rmax = 1e-4}
#define REDUCE {.name = "reduction", .atol = 1e-5, .rmax = 1e-5}
static const struct oc_tol CUDA_TOL[OC_CHECK_COUNT] = {
    [OC_LAYOUT] = EXACT,          [OC_INPUT] = ELEM,
    [OC_CONV_FWD] = GEMM,         [OC_CONV_BWD_DATA] = GEMM,     [OC_CONV_BWD_DATA_ADD] = GEMM,
    [OC_CONV_BWD_FILTER] = GEMM,  [OC_BN_Y] = REDUCE,            [OC_BN_MEAN] = REDUCE,
    [OC_BN_INVSTD] = REDUCE,      [OC_BN_RUNNING_MEAN] = REDUCE, [OC_BN_RUNNING_VAR] = REDUCE,
    [OC_BN_INFER_Y] = REDUCE,     [OC_BN_DX] = REDUCE,           [OC_BN_DPARAM] = REDUCE,
    [OC_BN_INFER_DX] = ELEM,      [OC_BN_RELU] = REDUCE,         [OC_BN_RELU_INFER_DX] = ELEM,
    [OC_MAXPOOL_FWD] = EXACT,     [OC_MAXPOOL_BWD] = ELEM,       [OC_MAXPOOL_HOST_FWD] = EXACT,
    [OC_MAXPOOL_HOST_BWD] = ELEM, [OC_AVGPOOL_FWD] = ELEM,       [OC_AVGPOOL_BWD] = ELEM,
    [OC_GAP_FWD] = REDUCE,        [OC_GAP_BWD] = ELEM,           [OC_FLATTEN_FWD] = EXACT,
    [OC_FLATTEN_BWD] = EXACT,     [OC_FLATTEN_BWD_ADD] = ELEM,   [OC_LINEAR_FWD] = GEMM,
    [OC_LINEAR_BWD_DATA] = GEMM,  [OC_LINEAR_BWD_FILTER] = GEMM, [OC_RELU] = EXACT,
    [OC_RELU_BWD_ADD] = ELEM,     [OC_GELU] = TRANS,             [OC_ADD] = EXACT,
    [OC_AXPY] = ELEM,             [OC_DROPOUT] = ELEM,           [OC_DROPOUT_BWD_ADD] = ELEM,
    [OC_XENT_LOSS] = {.name = "loss", .atol = 1e-5, .rmax = 1e-5},
    [OC_XENT_DLOGITS] = TRANS,
    [OC_SUMSQ] = {.name = "sumsq", .rtol = 2.5e-7},
    [OC_EXACT_COUNT] = EXACT,
};
/* The optimizers: compute.h promises torch.optim's order of operations and FMAs on every backend, so the results
 * should be bit-identical (the line counts the bits that differ); 1e-6 leaves room for one contraction choice. */
static const struct oc_tol OPTIM_TOL = {.name = "optimizer", .atol = 1e-6, .rtol = 1e-6}, EXACT_TOL = EXACT;
#undef EXACT
#undef ELEM
#undef TRANS
#undef GEMM
#undef REDUCE

#define SH(n, c, h, w) .sh = {n, c, h, w}
#define POOL3(n, c, h, w, k, s, p)                                                                                     \
    {OC_F_POOL, SH(n, c, h, w), k, s, p, .lo = -1, .hi = 1}, {OC_F_POOL, SH(n, c, h, w), k, s, p, .vals = OC_V_TIES},  \
        {OC_F_POOL, SH(n, c, h, w), k, s, p, .e = 1, .lo = -1, .hi = 1, .vals = OC_V_NANS}
#define BN(n, c, h, w) {OC_F_BN, SH(n, c, h, w), .vals = OC_V_CHANNELS}
#define FEAT(n, c, h, w) {OC_F_FEAT, SH(n, c, h, w), .lo = -1, .hi = 1}
#define XENT2(n, k) {OC_F_XENT, SH(n, k, 1, 1), .e = 1}, {OC_F_XENT, SH(n, k, 1, 1), .e = 1, .p = 0.1f}
/* conv: a = cout, b = k, c = stride, d = pad, e = bias; linear: (n, in) and a = out; pooling without average: e */
static const struct oc_case CUDA_CASES[] = {
    {OC_F_LAYOUT, SH(5, 3, 7, 9), .lo = -1, .hi = 1},   {OC_F_LAYOUT, SH(1, 64, 4, 4), .lo = -1, .hi = 1},
    {OC_F_LAYOUT, SH(4, 512, 1, 1), .lo = -1, .hi = 1}, {OC_F_LAYOUT, SH(3, 1, 28, 28), .lo = -1, .hi = 1},
    {OC_F_INPUT, SH(5, 1, 28, 28)}, {OC_F_INPUT, SH(3, 1, 13, 7)},
    {OC_F_INPUT, SH(4, 3, 32, 32)}, {OC_F_INPUT, SH(3, 3, 17, 11)},
    {OC_F_CONV, SH(5, 16, 8, 8), 32, 1, 1, 0, 0},   /* 1x1 stride 1 */
    {OC_F_CONV, SH(1, 6, 9, 7), 10, 1, 1, 0, 1},    /* 1x1 stride 1, batch 1, bias */
    {OC_F_CONV, SH(5, 8, 10, 10), 16, 3, 1, 1, 0},  /* 3x3 pad 1 stride 1 */
    {OC_F_CONV, SH(1, 5, 13, 11), 7, 3, 1, 1, 1},   /* odd sizes, batch 1, bias */
    {OC_F_CONV, SH(5, 16, 16, 16), 32, 3, 2, 1, 0}, /* 3x3 pad 1 stride 2 (downsampling block) */
    {OC_F_CONV, SH(1, 4, 9, 7), 6, 3, 2, 1, 1},     /* odd sizes, stride 2, bias */
    {OC_F_CONV, SH(5, 3, 32, 32), 64, 7, 2, 3, 0},  /* resnet18's stem on 32x32 */
    {OC_F_CONV, SH(1, 3, 23, 19), 8, 7, 2, 3, 1},   /* 7x7 stem, odd sizes, bias */
    {OC_F_CONV, SH(5, 64, 8, 8), 128, 1, 2, 0, 0},  /* 1x1 stride 2 downsample shortcut */
    {OC_F_CONV, SH(4, 256, 2, 2), 512, 3, 2, 1, 0}, /* resnet18 layer4.0.conv1 at 32x32: K = 2304 */
    {OC_F_CONV, SH(5, 1, 28, 28), 32, 3, 1, 0, 1},  /* mnist-net conv1 (no padding), bias */
    /* a mean and spread per channel: a wrong channel stride shows, mean 20 / sd 0.5 punishes a cancelling
     * variance formula */
    BN(5, 16, 8, 8), BN(1, 8, 7, 5), BN(4, 32, 1, 1), BN(2, 6, 33, 31),
    POOL3(5, 8, 16, 16, 3, 2, 1), /* resnet18's stem pooling */
    POOL3(1, 3, 9, 7, 3, 2, 1),   /* odd sizes, batch 1 */
    POOL3(5, 8, 8, 8, 2, 2, 0),   /* mnist-net / resnet9 pooling */
    POOL3(1, 4, 7, 9, 2, 2, 0),   /* floor mode drops the last row / column */
    FEAT(5, 64, 4, 4), FEAT(1, 3, 7, 5), FEAT(4, 512, 1, 1), FEAT(5, 64, 12, 12),
    {OC_F_LINEAR, SH(5, 12544, 1, 1), 128, .e = 1}, /* mnist-net fc1 on 3x32x32 */
    {OC_F_LINEAR, SH(4, 128, 1, 1), 10, .e = 1},    /* mnist-net fc2 */
    {OC_F_LINEAR, SH(5, 512, 1, 1), 10},            /* resnet18 fc without bias */
    {OC_F_LINEAR, SH(1, 33, 1, 1), 7, .e = 1},      /* batch 1, odd sizes */
    {OC_F_LINEAR, SH(7, 1, 1, 1), 3},               /* in = 1 */
    {OC_F_LINEAR, SH(64, 300, 1, 1), 100, .e = 1},
    {OC_F_ELEM, SH(100003, 1, 1, 1), .lo = -4, .hi = 4}, /* a ragged tail for any vector width or block size */
    {OC_F_DROPOUT, SH(1, (1 << 20) + 3, 1, 1), .p = 0.5f, .seed = 0x9e3779b97f4a7c15u}, /* seed's high word set */
    {OC_F_DROPOUT, SH(1024, 1024, 1, 1), .p = 0.1f, .seed = 12345, .offset = 1000003},   /* offset not 4k */
    {OC_F_DROPOUT, SH(17, 241, 1, 1), .p = 0.25f, .seed = 1, .offset = ((uint64_t)1 << 34) + 1}, /* beyond 32 bits */
    {OC_F_DROPOUT, SH(1, 5, 1, 1), .p = 0.5f, .seed = 77, .offset = 6}, /* fewer than a Philox block */
    {OC_F_DROPOUT, SH(5, 64, 12, 12), .e = 1, .p = 0.25f, .seed = 42, .offset = ((uint64_t)3 << 56) + 5}, /* dropout1 */
    {OC_F_DROPOUT, SH(3, 5, 7, 9), .e = 1, .p = 0.5f, .seed = 0x9e3779b97f4a7c15u, .offset = 1000003}, /* odd sizes */
    {OC_F_DROPOUT, SH(1, 3, 13, 11), .e = 1, .p = 0.3f, .seed = 9, .offset = 2},  /* batch 1 */
    {OC_F_DROPOUT, SH(4, 1, 28, 28), .e = 1, .p = 0.3f, .seed = 10, .offset = 3}, /* one channel */
    {OC_F_DROPOUT, SH(6, 7, 1, 1), .e = 1, .p = 0.3f, .seed = 11},                /* 1x1 planes */
    {OC_F_DROPOUT, SH(4, 64, 4, 4), .e = 1, .p = 0.0f, .seed = 3, .offset = 11},  /* p = 0: the identity */
    XENT2(37, 10), XENT2(4, 1000), XENT2(64, 100), XENT2(1, 10), {OC_F_XENT, SH(37, 10, 1, 1), .p = 0.1f},
    {OC_F_REDUCE, SH(1, 1, 1, 1)}, {OC_F_REDUCE, SH(1000, 1, 1, 1)}, {OC_F_REDUCE, SH(65537, 1, 1, 1)},
    {OC_F_REDUCE, SH(((size_t)1 << 21) + 5, 1, 1, 1)},
};
#undef POOL3
#undef BN
#undef FEAT
#undef XENT2

/*
 * The table's cases and, after them, two dropout cases with net.c's draws for streams beyond 2^24, whose high
 * part keys Philox (dropout_index.h): stream 2^24 + 3's dropout1, and the last stream's node 255. cases holds
 * RT_ARRAY_LEN(CUDA_CASES) + 2.
 */
static struct oc_table cuda_table(struct oc_case *cases)
{
    const size_t n = RT_ARRAY_LEN(CUDA_CASES);
    const struct rt_dropout_draw far1 = rt_dropout_node_draw(42, (UINT64_C(1) << 24) + 3, 0, 5);
    const struct rt_dropout_draw far2 = rt_dropout_node_draw(UINT64_C(0x9e3779b97f4a7c15), UINT64_MAX, 0, 255);
    memcpy(cases, CUDA_CASES, sizeof(CUDA_CASES));
    cases[n] = (struct oc_case){OC_F_DROPOUT, SH(5, 64, 12, 12), .e = 1, .p = 0.25f, .seed = far1.seed,
                                .offset = far1.offset};
    cases[n + 1] = (struct oc_case){OC_F_DROPOUT, SH(7, 37, 1, 1), .p = 0.5f, .seed = far2.seed, .offset = far2.offset};
    return (struct oc_table){"the CUDA fp32 table", CUDA_TOL, cases, n + 2};
}
#undef SH

/* ---- what the engine does not check: memory, 16-bit extras, loss scaling, casts, optimizers ------------ */

#define OP(s, name, ...) ctx->side[s].ops->name(ctx->side[s].st, __VA_ARGS__)
#define BOTH for (int s = 0; s < 2; s++)
#define F(b, s) ((float *)(b).p[s])

/* n fp32 values (4n bytes) on both sides, zeroed. */
static struct oc_buf flat(struct oc_ctx *ctx, size_t n)
{
    return oc_new(ctx, OC_FEAT, n, (struct rt_shape4){0});
}

/* The same host bytes into both sides; both sides' bytes out. Synchronised. */
static void put_bytes(struct oc_ctx *ctx, struct oc_buf *b, const void *host, size_t bytes)
{
    BOTH {
        OP(s, upload, b->p[s], host, bytes);
        ctx->side[s].ops->sync(ctx->side[s].st);
    }
}

static void get_bytes(struct oc_ctx *ctx, const struct oc_buf *b, void *ref, void *dev, size_t bytes)
{
    void *h[2] = {ref, dev};
    BOTH {
        OP(s, download, h[s], b->p[s], bytes);
        ctx->side[s].ops->sync(ctx->side[s].st);
    }
}

/* How many of n elements of `size` bytes (2 or 4) differ in their bits; the first few to stderr. */
static size_t bits_differ(const char *op, const void *ref, const void *dev, size_t n, size_t size)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a = 0, b = 0;
        memcpy(&a, (const char *)ref + i * size, size);
        memcpy(&b, (const char *)dev + i * size, size);
        if (a != b && bad++ < 5)
            fprintf(stderr, "    %s[%zu]: device 0x%0*x, reference 0x%0*x\n", op, i, (int)size * 2, b, (int)size * 2,
                    a);
    }
    return bad;
}

static void test_memory(struct oc_ctx *ctx)
{
    printf("memory: alloc, upload, download, copy, zero, sync\n");
    const size_t nb = 4099; /* odd: no vector-width assumption */
    struct oc_buf a = flat(ctx, nb / 4 + 1), b = flat(ctx, nb / 4 + 1);
    uint8_t *h = tu_xmalloc(nb), *want = tu_xmalloc(nb), *got[2] = {tu_xmalloc(nb), tu_xmalloc(nb)};
    char detail[96];
    /* fresh allocations are zeroed and 256-byte aligned */
    get_bytes(ctx, &b, got[0], got[1], nb);
    BOTH {
        size_t nz = 0;
        for (size_t i = 0; i < nb; i++)
            nz += got[s][i] != 0;
        const int aligned = (uintptr_t)b.p[s] % 256 == 0;
        snprintf(detail, sizeof(detail), "%zu non-zero bytes, %saligned to 256", nz, aligned ? "" : "not ");
        oc_verdict(ctx, nz == 0 && aligned, "alloc", ctx->side[s].name, detail);
    }
    for (size_t i = 0; i < nb; i++)
        h[i] = (uint8_t)rt_rng_u32(&ctx->rng);
    put_bytes(ctx, &a, h, nb);
    /* b = zeros; copy 2000 bytes from a+7 to b+3 (both unaligned), then zero 100 bytes at b+50 */
    BOTH {
        OP(s, copy, (uint8_t *)b.p[s] + 3, (const uint8_t *)a.p[s] + 7, 2000);
        OP(s, zero, (uint8_t *)b.p[s] + 50, 100);
    }
    memset(want, 0, nb);
    memcpy(want + 3, h + 7, 2000);
    memset(want + 50, 0, 100);
    get_bytes(ctx, &a, got[0], got[1], nb);
    BOTH oc_verdict(ctx, !memcmp(got[s], h, nb), "upload/download round trip", ctx->side[s].name, "exact");
    get_bytes(ctx, &b, got[0], got[1], nb);
    BOTH oc_verdict(ctx, !memcmp(got[s], want, nb), "copy (unaligned) + zero (range)", ctx->side[s].name, "exact");
    oc_free(ctx, &a);
    oc_free(ctx, &b);

    /* a larger buffer (bandwidth paths, several blocks), copied device to device */
    const size_t nbig = ((size_t)8 << 20) + 12;
    uint8_t *big = tu_xmalloc(nbig), *back[2] = {tu_xmalloc(nbig), tu_xmalloc(nbig)};
    for (size_t i = 0; i < nbig; i++)
        big[i] = (uint8_t)(i * 131 + (i >> 11));
    struct oc_buf x = flat(ctx, nbig / 4), y = flat(ctx, nbig / 4);
    put_bytes(ctx, &x, big, nbig);
    BOTH {
        OP(s, copy, y.p[s], x.p[s], nbig);
        OP(s, zero, x.p[s], nbig);
    }
    get_bytes(ctx, &y, back[0], back[1], nbig);
    int same[2];
    BOTH same[s] = !memcmp(back[s], big, nbig);
    get_bytes(ctx, &x, back[0], back[1], nbig);
    BOTH {
        size_t nz = 0;
        for (size_t i = 0; i < nbig; i++)
            nz += back[s][i] != 0;
        snprintf(detail, sizeof(detail), "copy %s, %zu non-zero bytes after zero", same[s] ? "exact" : "differs", nz);
        oc_verdict(ctx, same[s] && nz == 0, "copy + zero 8 MiB", ctx->side[s].name, detail);
    }
    oc_free(ctx, &x);
    oc_free(ctx, &y);
    uint8_t *hs[] = {h, want, got[0], got[1], big, back[0], back[1]};
    for (size_t i = 0; i < RT_ARRAY_LEN(hs); i++)
        free(hs[i]);
}

/*
 * Dropout beyond the engine's checks, on the table's dropout cases (masks bit for bit): the pair drawn on the
 * device from a stream there (a graph's replay) against the reference's host draw for that stream and node; and
 * the 16-bit tables (NHWC spatial tensors) against the reference, on ones (a normal input could round to a 16-bit
 * zero).
 */
static void test_dropout_extras(struct oc_ctx *ctx, const struct oc_table *t)
{
    printf("dropout: the stream on the device, and the 16-bit tables' masks\n");
    struct rt_stream *ds = ctx->side[OC_DEV].st;
    unsigned node = 0;
    for (size_t k = 0; k < t->ncases; k++) {
        const struct oc_case *c = &t->cases[k];
        if (c->family != OC_F_DROPOUT)
            continue;
        const struct rt_shape4 sh = c->sh;
        const int sp = c->e;
        const size_t n = (size_t)sh.n * sh.c * sh.h * sh.w;
        char shape[128], op[64];
        snprintf(shape, sizeof(shape), "%s (%d,%d,%d,%d) p=%.2f seed %#llx offset %llu", sp ? "spatial" : "features",
                 sh.n, sh.c, sh.h, sh.w, (double)c->p, (unsigned long long)c->seed, (unsigned long long)c->offset);
        float *ones = tu_hfloats(n), *r = tu_hfloats(n), *g = tu_hfloats(n);
        for (size_t i = 0; i < n; i++)
            ones[i] = 1.0f;
        const enum oc_kind kind = sp ? OC_SPATIAL : OC_FEAT;
        struct oc_buf x = oc_new(ctx, kind, n, sh), z = oc_new(ctx, kind, n, sh), sd = flat(ctx, 2);
        oc_put(ctx, &x, ones);
        const uint64_t stream = c->seed ^ 0x5eedu;
        const struct rt_dropout_draw dr = rt_dropout_node_draw(c->seed, stream, (uint32_t)c->offset, node);
        put_bytes(ctx, &sd, &stream, sizeof(stream));
        OP(OC_REF, dropout_fwd, sh, sp, c->p, dr.seed, dr.offset, NULL, F(x, OC_REF), F(z, OC_REF));
        OP(OC_DEV, dropout_fwd, sh, sp, c->p, c->seed, (uint64_t)(uint32_t)c->offset + ((uint64_t)node++ << 56),
           (const uint64_t *)sd.p[OC_DEV], F(x, OC_DEV), F(z, OC_DEV));
        oc_get(ctx, &z, r, g);
        oc_compare_mask(ctx, "dropout_fwd, stream on the device", shape, r, g, n, NULL);

        OP(OC_REF, dropout_fwd, sh, sp, c->p, c->seed, c->offset, NULL, F(x, OC_REF), F(z, OC_REF));
        oc_get(ctx, &z, r, g);
        for (int a = 0; a < 2; a++) {
            const enum rt_dtype act = a ? RT_F16 : RT_BF16;
            const struct rt_ops *o16 = rt_backend_ops_for(ctx->side[OC_DEV].be, act);
            if (!o16)
                continue;
            /* the 16-bit tensors fit in the device side of x (in) and z (out) */
            uint16_t *h16 = tu_xmalloc(n * sizeof(uint16_t));
            for (size_t i = 0; i < n; i++)
                h16[i] = (uint16_t)(act == RT_BF16 ? 0x3f80u : 0x3c00u); /* 1.0 */
            if (sp)
                o16->from_nchw(ds, sh, ones, x.p[OC_DEV]);
            else
                o16->upload(ds, x.p[OC_DEV], h16, n * sizeof(uint16_t));
            o16->dropout_fwd(ds, sh, sp, c->p, c->seed, c->offset, NULL, F(x, OC_DEV), F(z, OC_DEV));
            if (sp)
                o16->to_nchw(ds, sh, F(z, OC_DEV), g);
            else
                o16->download(ds, h16, z.p[OC_DEV], n * sizeof(uint16_t));
            o16->sync(ds);
            for (size_t i = 0; !sp && i < n; i++)
                g[i] = (h16[i] & 0x7fffu) ? 1.0f : 0.0f; /* only zero or not matters */
            snprintf(op, sizeof(op), "dropout_fwd %s", rt_dtype_name(act));
            oc_compare_mask(ctx, op, shape, r, g, n, NULL);
            free(h16);
        }
        oc_free(ctx, &x);
        oc_free(ctx, &z);
        oc_free(ctx, &sd);
        free(ones);
        free(r);
        free(g);
    }
}

/*
 * bn_infer_bwd of the 16-bit tables (NHWC), which no model test reaches (they freeze nothing): the engine's
 * batchnorm cases with the device's 16-bit table in its place, dx within 3u |ref| + 1e-6 of the fp32 reference
 * on the same inputs (u the type's unit roundoff: the table rounds dx = beta dx + dy a once; 1e-6 for fp16's
 * subnormal spacing). The engine's inputs are bf16 values, which fp16 holds exactly in its normal range and
 * moves by at most 2^-25 below it: inside the 1e-6.
 */
static const struct oc_tol BN16_TOL[2][OC_CHECK_COUNT] = {
    {[OC_BN_INFER_DX] = {.name = "3u of bf16", .atol = 1e-6, .rtol = 3 * 0x1p-8}},
    {[OC_BN_INFER_DX] = {.name = "3u of fp16", .atol = 1e-6, .rtol = 3 * 0x1p-11}},
};

static void test_bn_infer_bwd16(const struct oc_ctx *ctx, const struct oc_table *t)
{
    const struct oc_side *d = &ctx->side[OC_DEV];
    for (int a = 0; a < 2; a++) {
        const enum rt_dtype act = a ? RT_F16 : RT_BF16;
        const struct rt_ops *o16 = rt_backend_ops_for(d->be, act);
        if (!o16)
            continue;
        char name[64];
        snprintf(name, sizeof(name), "the device's %s table", rt_dtype_name(act));
        struct oc_ctx c16;
        oc_init(&c16, &ctx->side[OC_REF], &(struct oc_side){.name = name, .be = d->be, .ops = o16, .st = d->st},
                SEED + 1);
        oc_run(&c16, &(struct oc_table){"bn_infer_bwd in 16 bits", BN16_TOL[a], t->cases, t->ncases}, 1u << OC_F_BN);
        CHECKF(oc_failures(&c16) == 0, "bn_infer_bwd in %s: %d checks failed", rt_dtype_name(act), oc_failures(&c16));
    }
}

/*
 * Loss scaling on the device, each bit for bit the reference's: clip_scale's factor worked out from the squared
 * norm (nothing done below max_norm or for a non-finite norm), unscale_check by a device scale, scaler_update's
 * rule, and an update skipped on the device flag.
 */
static void test_loss_scaling(struct oc_ctx *ctx)
{
    printf("clip_scale, unscale_check, scaler_update, skipped updates\n");
    static const float clip_cases[][2] = {{400.0f, 2.0f}, {400.0f, 25.0f}, {INFINITY, 1.0f}, {NAN, 1.0f}};
    const size_t n = 65537;
    float *hx = oc_random_normal(ctx, n, 0.0f, 1.0f);
    struct oc_buf y = flat(ctx, n), q = flat(ctx, 1), sg = flat(ctx, 2), fl = flat(ctx, 1), m1 = flat(ctx, n),
                  gg = flat(ctx, n);
    char shape[64];
    for (size_t c = 0; c < RT_ARRAY_LEN(clip_cases); c++) {
        snprintf(shape, sizeof(shape), "n=%zu sumsq %g max_norm %g", n, (double)clip_cases[c][0],
                 (double)clip_cases[c][1]);
        oc_put(ctx, &y, hx);
        oc_fill(ctx, &q, clip_cases[c][0]);
        BOTH OP(s, clip_scale, n, F(q, s), clip_cases[c][1], F(y, s));
        oc_compare_tol(ctx, &EXACT_TOL, "clip_scale", shape, &y);
    }
    oc_fill(ctx, &gg, 0.25f);
    oc_put(ctx, &sg, (const float[2]){65536.0f, 0.0f});
    for (int i = 0; i < 40; i++) {
        snprintf(shape, sizeof(shape), "step %d", i);
        hx[7] = i % 5 == 1 ? INFINITY : 1.0f; /* an overflow every fifth step */
        oc_put(ctx, &y, hx);
        BOTH OP(s, unscale_check, n, F(y, s), F(sg, s), F(fl, s));
        oc_compare_tol(ctx, &EXACT_TOL, "unscale_check flag", shape, &fl);
        BOTH OP(s, scaler_update, F(sg, s), F(sg, s) + 1, F(fl, s), 2.0f, 0.5f, 3);
        oc_compare_tol(ctx, &EXACT_TOL, "scaler_update scale, good", shape, &sg);
        oc_fill(ctx, &m1, 0.5f);
        BOTH OP(s, sgd_update, n, F(y, s), F(gg, s), F(m1, s), 0.1f, 0.9f, 0.0f, 1e-4f, 0, 0, F(fl, s));
        oc_compare_tol(ctx, &EXACT_TOL, "sgd_update under the flag", shape, &y);
    }
    struct oc_buf *all[] = {&y, &q, &sg, &fl, &m1, &gg};
    for (size_t i = 0; i < RT_ARRAY_LEN(all); i++)
        oc_free(ctx, all[i]);
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

enum cast { CAST_F32_F16, CAST_F32_BF16, CAST_F16_F32, CAST_BF16_F32 };

/* Runs a cast on both sides over n values at hx (floats, or 16-bit patterns) and compares the bits. */
static void cast_check(struct oc_ctx *ctx, enum cast which, const char *op, const char *shape, const void *hx,
                       size_t n)
{
    const size_t in = which <= CAST_F32_BF16 ? 4 : 2, out = 6 - in;
    struct oc_buf x = flat(ctx, n), y = flat(ctx, n);
    void *r = tu_xmalloc(n * out), *g = tu_xmalloc(n * out);
    put_bytes(ctx, &x, hx, n * in);
    BOTH switch (which) {
    case CAST_F32_F16:
        OP(s, cast_f32_f16, n, F(x, s), (uint16_t *)y.p[s]);
        break;
    case CAST_F32_BF16:
        OP(s, cast_f32_bf16, n, F(x, s), (uint16_t *)y.p[s]);
        break;
    case CAST_F16_F32:
        OP(s, cast_f16_f32, n, (const uint16_t *)x.p[s], F(y, s));
        break;
    case CAST_BF16_F32:
        OP(s, cast_bf16_f32, n, (const uint16_t *)x.p[s], F(y, s));
        break;
    }
    get_bytes(ctx, &y, r, g, n * out);
    const size_t bad = bits_differ(op, r, g, n, out);
    char detail[64];
    snprintf(detail, sizeof(detail), "%zu of %zu patterns differ, tol exact bits", bad, n);
    oc_verdict(ctx, bad == 0, op, shape, detail);
    oc_free(ctx, &x);
    oc_free(ctx, &y);
    free(r);
    free(g);
}

static void test_casts(struct oc_ctx *ctx)
{
    printf("casts f32 <-> f16 / bf16 (exact bits)\n");
    struct rt_rng *r = &ctx->rng;
    static const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fbfffffu, 0x7fc00001u,
                                    0xff812345u, 0x7fffffffu, 0x7f802000u, 0xffa00000u};
    const size_t nnan = RT_ARRAY_LEN(nans);

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
        fx[j++] = oc_bitsf(special16[i]);
    for (size_t i = 0; i < nmid; i++) {
        const uint16_t h = (uint16_t)rt_rng_below(r, 0x7bff); /* finite, with a finite successor */
        const float m = (float)((half_value(h) + half_value((uint16_t)(h + 1))) / 2); /* exact in float */
        const float sgn = rt_rng_u32(r) & 1 ? -1.0f : 1.0f;
        fx[j++] = sgn * m;
        fx[j++] = sgn * nextafterf(m, INFINITY);
        fx[j++] = sgn * nextafterf(m, 0.0f);
    }
    for (size_t i = 0; i < nrand; i++) {
        /* exponents 2^-30 .. 2^17 (subnormal halves, normals, overflow), random mantissa and sign */
        const uint32_t e = 97 + rt_rng_below(r, 48), mant = rt_rng_u32(r) & 0x7fffffu;
        fx[j++] = oc_bitsf((rt_rng_u32(r) & 0x80000000u) | e << 23 | mant);
    }
    char shape[64];
    snprintf(shape, sizeof(shape), "n=%zu (ties, subnormals, overflow, Inf)", n16);
    cast_check(ctx, CAST_F32_F16, "cast_f32_f16", shape, fx, n16);
    snprintf(shape, sizeof(shape), "n=%zu NaNs (quiet, signalling, payloads)", nnan);
    cast_check(ctx, CAST_F32_F16, "cast_f32_f16 NaN", shape, nans, nnan);

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
        const enum cast c = w == 0 ? CAST_F16_F32 : CAST_BF16_F32;
        snprintf(shape, sizeof(shape), "all %zu non-NaN patterns", na);
        cast_check(ctx, c, op, shape, all, na);
        char opn[48];
        snprintf(opn, sizeof(opn), "%s NaN", op);
        snprintf(shape, sizeof(shape), "all %zu NaN patterns", nn);
        cast_check(ctx, c, opn, shape, hnan, nn);
    }

    /* f32 -> bf16: specials, exact ties (low half 0x8000) and their neighbours, random bit patterns */
    static const uint32_t special_bf[] = {
        0x00000000u, 0x80000000u, 0x3f800000u, 0xc0200000u, 0x3f808000u, 0x3f818000u, 0x3f808001u,
        0x3f807fffu, 0x7f7fffffu, 0x7f7f8000u, 0x7f7effffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,
        0x00000001u, 0x00018000u, 0x00008000u, 0x007fffffu, 0x80008000u,
    };
    const size_t nbs = RT_ARRAY_LEN(special_bf), nties = 20000, nbr = 40000, nbf = nbs + 3 * nties + nbr;
    uint32_t *bx = tu_xmalloc(nbf * sizeof(uint32_t));
    j = 0;
    for (size_t i = 0; i < nbs; i++)
        bx[j++] = special_bf[i];
    for (size_t i = 0; i < nties; i++) {
        uint32_t hi;
        do
            hi = rt_rng_u32(r) & 0xffffu;
        while ((hi & 0x7f80u) == 0x7f80u); /* finite */
        const uint32_t t = hi << 16 | 0x8000u;
        bx[j++] = t;
        bx[j++] = t + 1;
        bx[j++] = t - 1;
    }
    for (size_t i = 0; i < nbr; i++) {
        uint32_t u;
        do
            u = rt_rng_u32(r);
        while ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)); /* NaNs are tested apart */
        bx[j++] = u;
    }
    snprintf(shape, sizeof(shape), "n=%zu (ties, subnormals, FLT_MAX, Inf)", nbf);
    cast_check(ctx, CAST_F32_BF16, "cast_f32_bf16", shape, bx, nbf);
    snprintf(shape, sizeof(shape), "n=%zu NaNs (quiet, signalling, payloads)", nnan);
    cast_check(ctx, CAST_F32_BF16, "cast_f32_bf16 NaN", shape, nans, nnan);
    free(fx);
    free(bx);
    free(all);
    free(hnan);
}

/* ---- optimizers --------------------------------------------------------------------------------------------------------- */

static void test_sgd(struct oc_ctx *ctx)
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
    char shape[32], op[80];
    snprintf(shape, sizeof(shape), "n=%zu", n);
    struct oc_buf p = flat(ctx, n), g = flat(ctx, n), buf = flat(ctx, n);
    for (size_t c = 0; c < RT_ARRAY_LEN(cases); c++) {
        float *hp = oc_random_normal(ctx, n, 0.0f, 1.0f);
        oc_put(ctx, &p, hp);
        oc_fill(ctx, &buf, NAN); /* the first step must not read the buffer */
        const int has_buf = cases[c].momentum != 0.0f;
        for (int step = 1; step <= 3; step++) {
            float *hg = oc_random_normal(ctx, n, 0.0f, 1.0f);
            oc_put(ctx, &g, hg);
            free(hg);
            BOTH OP(s, sgd_update, n, F(p, s), F(g, s), has_buf ? F(buf, s) : NULL, cases[c].lr, cases[c].momentum,
                    cases[c].dampening, cases[c].wd, cases[c].nesterov, step == 1, NULL);
            snprintf(op, sizeof(op), "%s: param%s", cases[c].name, step == 1 ? " (first step)" : "");
            if (step != 2)
                oc_compare_tol(ctx, &OPTIM_TOL, op, shape, &p);
        }
        snprintf(op, sizeof(op), "%s: momentum_buffer", cases[c].name);
        if (has_buf)
            oc_compare_tol(ctx, &OPTIM_TOL, op, shape, &buf);
        free(hp);
    }
    oc_free(ctx, &p);
    oc_free(ctx, &g);
    oc_free(ctx, &buf);
}

static void test_adam(struct oc_ctx *ctx)
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
    char shape[32], op[80];
    snprintf(shape, sizeof(shape), "n=%zu", n);
    struct oc_buf p = flat(ctx, n), g = flat(ctx, n), m = flat(ctx, n), v = flat(ctx, n);
    for (size_t c = 0; c < RT_ARRAY_LEN(cases); c++) {
        float *hp = oc_random_normal(ctx, n, 0.0f, 1.0f);
        oc_put(ctx, &p, hp);
        free(hp);
        if (cases[c].first_step == 1) {
            oc_fill(ctx, &m, 0.0f);
            oc_fill(ctx, &v, 0.0f);
        } else { /* resumed: state from earlier steps */
            float *hm = oc_random_normal(ctx, n, 0.0f, 0.1f), *hv = oc_random(ctx, n, 0.0f, 1e-4f);
            oc_put(ctx, &m, hm);
            oc_put(ctx, &v, hv);
            free(hm);
            free(hv);
        }
        for (int64_t step = cases[c].first_step; step < cases[c].first_step + 4; step++) {
            float *hg = oc_random_normal(ctx, n, 0.0f, 1.0f);
            for (size_t i = 0; i < n; i += 10) /* a tenth near eps, where its placement shows */
                hg[i] *= 3.0f * cases[c].eps;
            oc_put(ctx, &g, hg);
            free(hg);
            BOTH OP(s, adam_update, n, F(p, s), F(g, s), F(m, s), F(v, s), cases[c].lr, cases[c].b1, cases[c].b2,
                    cases[c].eps, cases[c].wd, cases[c].decoupled, step, NULL);
        }
        static const char *const what[] = {"param", "exp_avg", "exp_avg_sq"};
        const struct oc_buf *bufs[] = {&p, &m, &v};
        for (int i = 0; i < 3; i++) {
            snprintf(op, sizeof(op), "%s: %s", cases[c].name, what[i]);
            oc_compare_tol(ctx, &OPTIM_TOL, op, shape, bufs[i]);
        }
    }
    struct oc_buf *all[] = {&p, &g, &m, &v};
    for (size_t i = 0; i < RT_ARRAY_LEN(all); i++)
        oc_free(ctx, all[i]);
}

#undef OP
#undef BOTH
#undef F

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

/* ref and dev bit for bit: a line, and a failed check if not. */
static void same_values(const char *op, const char *shape, const float *ref, const float *dev, size_t n)
{
    const size_t bad = bits_differ(op, ref, dev, n, sizeof(float));
    printf("  %-40s %-50s %zu of %zu differ in their bits  %s\n", op, shape, bad, n, bad ? "FAIL" : "ok");
    CHECKF(bad == 0, "%s %s: %zu of %zu values differ", op, shape, bad, n);
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
    same_values(op, shape, ref->params0, dev->params0, ref->np);
    snprintf(op, sizeof(op), "%s initial buffers", label);
    snprintf(shape, sizeof(shape), "%zu floats", ref->nbuf);
    same_values(op, shape, ref->bufs0, dev->bufs0, ref->nbuf);
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
            const uint32_t u = oc_fbits(x[i]);
            if ((u & 0x7f800000u) != 0x7f800000u) /* NaN and Inf stay */
                x[i] = oc_bitsf((u + 1u + ((u >> 2) & 1u)) & ~3u);
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
    emu_round(s, y, oc_count4(sh));
}

static void emu_input_u8_dev(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *img, const float *mean,
                             const float *std, float *y)
{
    S[CPU].ops->input_u8_dev(s, sh, img, mean, std, y);
    emu_round(s, y, oc_count4(sh));
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
    emu_round(s, dx, oc_count4(d->in));
}

static void emu_bn_train_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                             const float *beta, float *rm, float *rv, float *sm, float *si, float *y)
{
    S[CPU].ops->bn_train_fwd(s, d, x, gamma, beta, rm, rv, sm, si, y);
    emu_round(s, y, oc_count4(d->in));
}

static void emu_bn_infer_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                             const float *beta, const float *rm, const float *rv, float *y)
{
    S[CPU].ops->bn_infer_fwd(s, d, x, gamma, beta, rm, rv, y);
    emu_round(s, y, oc_count4(d->in));
}

static void emu_bn_bwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                       const float *gamma, const float *beta, const float *sm, const float *si, float beta_dx, float *dx,
                       float *dgamma, float *dbeta)
{
    S[CPU].ops->bn_bwd(s, d, x, dy, gamma, beta, sm, si, beta_dx, dx, dgamma, dbeta);
    emu_round(s, dx, oc_count4(d->in));
}

static void emu_bn_infer_bwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                             const float *gamma, const float *beta, const float *rm, const float *rv, float beta_dx,
                             float *dx)
{
    S[CPU].ops->bn_infer_bwd(s, d, x, dy, gamma, beta, rm, rv, beta_dx, dx);
    emu_round(s, dx, oc_count4(d->in));
}

static void emu_maxpool_bwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, const float *y,
                            const float *dy, float beta, float *dx)
{
    S[CPU].ops->maxpool_bwd(s, d, x, y, dy, beta, dx);
    emu_round(s, dx, oc_count4(d->in));
}

static void emu_avgpool_fwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y)
{
    S[CPU].ops->avgpool_fwd(s, d, x, y);
    emu_round(s, y, pool_out_count(d));
}

static void emu_avgpool_bwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *dy, float beta, float *dx)
{
    S[CPU].ops->avgpool_bwd(s, d, dy, beta, dx);
    emu_round(s, dx, oc_count4(d->in));
}

static void emu_gap_fwd(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y)
{
    S[CPU].ops->gap_fwd(s, sh, x, y);
    emu_round(s, y, (size_t)sh.n * sh.c);
}

static void emu_gap_bwd(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx)
{
    S[CPU].ops->gap_bwd(s, sh, dy, beta, dx);
    emu_round(s, dx, oc_count4(sh));
}

static void emu_flatten_bwd(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx)
{
    S[CPU].ops->flatten_bwd(s, sh, dy, beta, dx);
    emu_round(s, dx, oc_count4(sh));
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
    emu_round(s, y, oc_count4(sh));
}

static void emu_dropout_bwd(struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,
                            uint64_t offset, const uint64_t *stream, const float *dy, float beta, float *dx)
{
    S[CPU].ops->dropout_bwd(s, sh, spatial, p, seed, offset, stream, dy, beta, dx);
    emu_round(s, dx, oc_count4(sh));
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

/* ---- the ops ------------------------------------------------------------------------------------------------------------ */

/*
 * Every op through the engine on the CUDA table, the engine's planted faults
 * in it, then what the engine does not check. The device: the GPU's fp32
 * table; on the stand-in the fp32 perturbation on the CPU side (another
 * correct fp32 implementation) with the ops the table holds exact -- one
 * IEEE operation or a select per element -- left as they are, so that the
 * bounds and every path of the op part have run before a GPU runs them.
 */
static void test_ops(void)
{
    struct rt_ops perturbed;
    struct oc_side dev = S[GPU];
    if (stand_in) {
        const struct rt_ops *o = S[CPU].ops;
        perturbed = *emu_table(EMU_F32_2ULP);
        perturbed.add = o->add;
        perturbed.scale = o->scale;
        perturbed.add_relu_fwd = o->add_relu_fwd;
        perturbed.add_relu_bwd = o->add_relu_bwd;
        perturbed.relu_bwd = o->relu_bwd;
        perturbed.flatten_bwd = o->flatten_bwd;
        dev = (struct oc_side){.name = "cpu-fp32 perturbed", .be = S[CPU].be, .ops = &perturbed, .st = S[CPU].st};
    }
    struct oc_case cases[RT_ARRAY_LEN(CUDA_CASES) + 2];
    const struct oc_table t = cuda_table(cases);
    struct oc_ctx ctx;
    oc_init(&ctx, &S[CPU], &dev, SEED);
    oc_run(&ctx, &t, ~0u);
    for (int p = 0; p < OC_PLANT_COUNT; p++)
        CHECKF(oc_plant_run(&ctx, &t, (enum oc_plant)p, LOSS_SCALE, SEED), "planted fault (%s %s) not caught by the op checks",
               oc_plants[p].op, oc_plants[p].fault);
    test_memory(&ctx);
    test_dropout_extras(&ctx, &t);
    test_bn_infer_bwd16(&ctx, &t);
    test_loss_scaling(&ctx);
    test_casts(&ctx);
    test_sgd(&ctx);
    test_adam(&ctx);
    CHECKF(oc_failures(&ctx) == 0, "%d op comparisons failed:%s", oc_failures(&ctx), ctx.failed);
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
    for (int s = 0; s < 2; s++) {
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
    printf("models, per tensor: fp32 cosine >= %g, | |dev|/|ref| - 1 | <= %g, mean loss within %g; 16-bit against "
           "the floor: 1 - cosine <= %g (1 - floor's) + %g, | |dev|/|ref| - 1 | <= %g |floor - ref|/|ref| + %g, mean "
           "loss within %g times the floor's difference + %g\n",
           F32_MIN_COS, F32_MAX_LEN, F32_MAX_LOSS, COS_K, COS_SLACK, LEN_K, LEN_SLACK, LOSS_K, LOSS_SLACK);
    test_ops();
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
