/*
 * test_cuda_twins_elem.c - the fast element-wise kernels (compute/cuda/fast_elem.cu) against their reference twins
 * (elem.cu) on the same GPU, bit for bit.
 *
 * For fp32, bf16 and fp16, every op the fast tables replace -- relu_fwd, relu_bwd, add, add_relu_fwd,
 * add_relu_bwd, scale, axpy -- runs from the fast table (rt_backend_ops_for) and from the reference table
 * (rt_backend_ops_reference) on the same inputs, in separate but identical device buffers, and every element of
 * every buffer is compared afterwards: outputs bit for bit (NaN payloads and -0 included), and the guards behind
 * each operand and the inputs that are not outputs against the bits uploaded. Sizes 0, 1, 3, 7, 8, 9, 15, 4097,
 * 100003 and 2^20 + 5 start at element offsets 0 and one vector (the fast kernels) and 1 and 3 (misaligned: the
 * fast entry must hand them to the reference kernel); 9000005 elements at offset 0 make the grid-stride loop go
 * round more than once on an H200. Variants: in place (ReLU, add into either input), beta 0 and 1, either output
 * of add_relu_bwd NULL. Inputs hold NaNs with payloads, zeros of both signs, infinities, the largest finite
 * values, the smallest normals and subnormals among random values. Then the fused ops of the fast table against
 * the reference table's unfused ones: add_relu_fwd against add then relu_fwd in place, add_relu_bwd against
 * relu_bwd into a temporary then a copy (beta 0) or axpy(1) (beta 1) into each gradient.
 *
 * It also checks that the fast tables fuse (add_relu 1), their twins do not, and that every op above is a
 * different kernel in the two tables (so a fast fill that replaced nothing fails here rather than passing).
 *
 * One line per op, variant, type and size, with the differing elements at each offset. Exit 0 pass, 1 fail, 77
 * skip: no CUDA backend in this build, no usable GPU, or RINGTRAIN_CUDA_KERNELS=reference (the fast tables are
 * then the twins). The seed is fixed and printed.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "test_cuda_parts.h"
#include "test_util.h"
#include "common/common.h"
#include "compute/compute.h"

#define SEED UINT64_C(20250412)
#define BIG ((size_t)9000005)
#define NBUF 4
#define GUARD_VECTORS 2

static const size_t SIZES[] = {0, 1, 3, 7, 8, 9, 15, 4097, 100003, ((size_t)1 << 20) + 5};
static const size_t OFFSETS[] = {0, 1, 3, 16}; /* 16: replaced by one vector's elements of the type */

static struct rt_backend *be;
static struct rt_stream *st;
static const struct rt_ops *mem; /* the fp32 table: alloc, upload, download */

/* ---- the variants (as tests/test_cuda_bodies_elem.cu's) --------------------------------------------------------- */

enum op_id { RELU_FWD, RELU_BWD, ADD, ADD_RELU_FWD, ADD_RELU_BWD, SCALE, AXPY };

/* Roles in0, in1 (inputs), out0, out1 (outputs; scale's x is out0) name one of nbuf buffers, -1 when absent. */
struct variant {
    enum op_id op;
    const char *name;
    int nbuf;
    int in0, in1, out0, out1;
    float alpha, beta0, beta1;
    int big; /* also run at BIG elements */
};

static const struct variant VARIANTS[] = {
    {RELU_FWD, "relu_fwd", 2, 0, -1, 1, -1, 0.0f, 0.0f, 0.0f, 1},
    {RELU_FWD, "relu_fwd in place", 1, 0, -1, 0, -1, 0.0f, 0.0f, 0.0f, 0},
    {RELU_BWD, "relu_bwd beta=0", 3, 0, 1, 2, -1, 0.0f, 0.0f, 0.0f, 0},
    {RELU_BWD, "relu_bwd beta=1", 3, 0, 1, 2, -1, 0.0f, 1.0f, 0.0f, 1},
    {ADD, "add", 3, 0, 1, 2, -1, 0.0f, 0.0f, 0.0f, 0},
    {ADD, "add y=a", 2, 0, 1, 0, -1, 0.0f, 0.0f, 0.0f, 0},
    {ADD, "add y=b", 2, 0, 1, 1, -1, 0.0f, 0.0f, 0.0f, 1},
    {ADD_RELU_FWD, "add_relu_fwd", 3, 0, 1, 2, -1, 0.0f, 0.0f, 0.0f, 1},
    {ADD_RELU_FWD, "add_relu_fwd y=a", 2, 0, 1, 0, -1, 0.0f, 0.0f, 0.0f, 0},
    {ADD_RELU_FWD, "add_relu_fwd y=b", 2, 0, 1, 1, -1, 0.0f, 0.0f, 0.0f, 0},
    {ADD_RELU_BWD, "add_relu_bwd betas 0,0", 4, 0, 1, 2, 3, 0.0f, 0.0f, 0.0f, 0},
    {ADD_RELU_BWD, "add_relu_bwd betas 0,1", 4, 0, 1, 2, 3, 0.0f, 0.0f, 1.0f, 1},
    {ADD_RELU_BWD, "add_relu_bwd betas 1,0", 4, 0, 1, 2, 3, 0.0f, 1.0f, 0.0f, 0},
    {ADD_RELU_BWD, "add_relu_bwd betas 1,1", 4, 0, 1, 2, 3, 0.0f, 1.0f, 1.0f, 1},
    {ADD_RELU_BWD, "add_relu_bwd dxa NULL, beta_b=1", 3, 0, 1, -1, 2, 0.0f, 0.0f, 1.0f, 0},
    {ADD_RELU_BWD, "add_relu_bwd dxb NULL, beta_a=0", 3, 0, 1, 2, -1, 0.0f, 0.0f, 0.0f, 0},
    {SCALE, "scale alpha=-0.75", 1, -1, -1, 0, -1, -0.75f, 0.0f, 0.0f, 1},
    {SCALE, "scale alpha=0", 1, -1, -1, 0, -1, 0.0f, 0.0f, 0.0f, 0},
    {SCALE, "scale alpha=3", 1, -1, -1, 0, -1, 3.0f, 0.0f, 0.0f, 0},
    {AXPY, "axpy alpha=0.37", 2, 0, -1, 1, -1, 0.37f, 0.0f, 0.0f, 1},
    {AXPY, "axpy alpha=-1", 2, 0, -1, 1, -1, -1.0f, 0.0f, 0.0f, 0},
};

/* 1 when buffer k is written by the variant; 2 when it is also read first. */
static int output_kind(const struct variant *c, int k)
{
    if (k == c->out0)
        return c->op == SCALE || c->op == AXPY || c->beta0 != 0.0f || k == c->in0 || k == c->in1 ? 2 : 1;
    if (k == c->out1)
        return c->beta1 != 0.0f ? 2 : 1;
    return 0;
}

/* ---- values --------------------------------------------------------------------------------------------------- */

static size_t esize(enum rt_dtype dt)
{
    return dt == RT_F32 ? 4 : 2;
}

/* NaNs (quiet, signed with a payload, signalling), +-0, +-Inf, the largest finite and a large negative value,
 * +-1, the smallest normal, subnormals of both signs: bit patterns of each type. */
#define N_SPECIAL 16
static const uint32_t SPECIAL[3][N_SPECIAL] = {
    {0x7fc00000u, 0xffc00001u, 0x7fa00000u, 0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu,
     0xff000000u, 0x3f800000u, 0xbf800000u, 0x00800000u, 0x00000001u, 0x807fffffu, 0x00400000u, 0x80000003u},
    {0x7fc0u, 0xffc1u, 0x7fa0u, 0x0000u, 0x8000u, 0x7f80u, 0xff80u, 0x7f7fu, 0xff00u, 0x3f80u, 0xbf80u, 0x0080u,
     0x0001u, 0x807fu, 0x0040u, 0x8003u},
    {0x7e00u, 0xfe01u, 0x7d00u, 0x0000u, 0x8000u, 0x7c00u, 0xfc00u, 0x7bffu, 0xf800u, 0x3c00u, 0xbc00u, 0x0400u,
     0x0001u, 0x83ffu, 0x0200u, 0x8003u},
};

/* One element's bits from a random word u: one in 8 a special value, the others finite values of magnitude in
 * [1/16, 16) of either sign, built from the fields (one draw per element, no conversion). */
static uint32_t value_bits(enum rt_dtype dt, uint32_t u)
{
    if ((u & 7u) == 0)
        return SPECIAL[dt][(u >> 3) & (N_SPECIAL - 1)];
    const uint32_t sign = (u >> 7) & 1u, e = (u >> 8) & 7u, m = u >> 11;
    if (dt == RT_F32)
        return sign << 31 | (123u + e) << 23 | (m << 2 & 0x7fffffu);
    if (dt == RT_BF16)
        return sign << 15 | (123u + e) << 7 | (m & 0x7fu);
    return sign << 15 | (11u + e) << 10 | (m & 0x3ffu);
}

static void put_bits(void *p, enum rt_dtype dt, size_t i, uint32_t u)
{
    if (dt == RT_F32)
        ((uint32_t *)p)[i] = u;
    else
        ((uint16_t *)p)[i] = (uint16_t)u;
}

static uint32_t get_bits(const void *p, enum rt_dtype dt, size_t i)
{
    return dt == RT_F32 ? ((const uint32_t *)p)[i] : ((const uint16_t *)p)[i];
}

static int is_nan_bits(enum rt_dtype dt, uint32_t u)
{
    if (dt == RT_F32)
        return (u & 0x7fffffffu) > 0x7f800000u;
    if (dt == RT_BF16)
        return (u & 0x7fffu) > 0x7f80u;
    return (u & 0x7fffu) > 0x7c00u;
}

/* ---- buffers ---------------------------------------------------------------------------------------------------- */

/* [0] the fast table's, [1] the reference's; index NBUF: the unfused path's temporary */
static void *dbuf[2][NBUF + 1];
static uint8_t *hinit[NBUF], *hgot[2][NBUF];
/* Values of the current type for each buffer, drawn once per type: a case takes its operands from them at a
 * start of its own (POOL_SHIFT apart), so that variants and sizes see different data without new draws. */
#define POOL_SHIFT 4093
#define POOL (BIG + POOL_SHIFT)
static uint32_t *pool[NBUF];

static int buffers_alloc(size_t bytes)
{
    for (int s = 0; s < 2; s++)
        for (int k = 0; k <= NBUF; k++)
            if (!(dbuf[s][k] = mem->alloc(be, bytes))) {
                fprintf(stderr, "test_cuda_twins_elem: %zu bytes of device memory: %s\n", bytes, rt_errmsg());
                return -1;
            }
    for (int k = 0; k < NBUF; k++) {
        hinit[k] = tu_xmalloc(bytes);
        hgot[0][k] = tu_xmalloc(bytes);
        hgot[1][k] = tu_xmalloc(bytes);
        pool[k] = tu_xmalloc(POOL * sizeof(uint32_t));
    }
    return 0;
}

static void buffers_free(void)
{
    for (int s = 0; s < 2; s++)
        for (int k = 0; k <= NBUF; k++)
            mem->free(be, dbuf[s][k]);
    for (int k = 0; k < NBUF; k++) {
        free(hinit[k]);
        free(hgot[0][k]);
        free(hgot[1][k]);
        free(pool[k]);
    }
}

static void pool_fill(enum rt_dtype dt)
{
    struct rt_rng rng;
    rt_rng_init(&rng, SEED, (uint64_t)dt);
    for (int k = 0; k < NBUF; k++)
        for (size_t i = 0; i < POOL; i++)
            pool[k][i] = value_bits(dt, rt_rng_u32(&rng));
}

/* ---- running --------------------------------------------------------------------------------------------------- */

/* Buffer k's operand in side s: the sub-buffer at element `off`, NULL for an absent role. */
static float *at(int s, int k, size_t off, enum rt_dtype dt)
{
    return k < 0 ? NULL : (float *)(void *)((char *)dbuf[s][k] + off * esize(dt));
}

static void run_op(const struct rt_ops *o, int s, const struct variant *c, size_t n, size_t off, enum rt_dtype dt)
{
    const float *i0 = at(s, c->in0, off, dt), *i1 = at(s, c->in1, off, dt);
    float *o0 = at(s, c->out0, off, dt), *o1 = at(s, c->out1, off, dt);
    switch (c->op) {
    case RELU_FWD:
        o->relu_fwd(st, n, i0, o0);
        break;
    case RELU_BWD:
        o->relu_bwd(st, n, i0, i1, c->beta0, o0);
        break;
    case ADD:
        o->add(st, n, i0, i1, o0);
        break;
    case ADD_RELU_FWD:
        o->add_relu_fwd(st, n, i0, i1, o0);
        break;
    case ADD_RELU_BWD:
        o->add_relu_bwd(st, n, i0, i1, c->beta0, o0, c->beta1, o1);
        break;
    case SCALE:
        o->scale(st, n, c->alpha, o0);
        break;
    case AXPY:
        o->axpy(st, n, c->alpha, i0, o0);
        break;
    }
}

/* One gradient of the unfused backward: the ReLU's gradient in tmp stored (copy) or added (axpy with alpha 1). */
static void unfused_grad(const struct rt_ops *r, size_t n, const float *tmp, float beta, float *dx, enum rt_dtype dt)
{
    if (!dx)
        return;
    if (beta == 0.0f)
        r->copy(st, dx, tmp, n * esize(dt));
    else
        r->axpy(st, n, 1.0f, tmp, dx);
}

/* The reference table's unfused ops for a fused variant, on side 1. */
static void run_unfused(const struct rt_ops *r, const struct variant *c, size_t n, size_t off, enum rt_dtype dt)
{
    const float *i0 = at(1, c->in0, off, dt), *i1 = at(1, c->in1, off, dt);
    float *o0 = at(1, c->out0, off, dt), *o1 = at(1, c->out1, off, dt), *tmp = at(1, NBUF, off, dt);
    if (c->op == ADD_RELU_FWD) {
        r->add(st, n, i0, i1, o0);
        r->relu_fwd(st, n, o0, o0);
        return;
    }
    r->relu_bwd(st, n, i0, i1, 0.0f, tmp);
    unfused_grad(r, n, tmp, c->beta0, o0, dt);
    unfused_grad(r, n, tmp, c->beta1, o1, dt);
}

/*
 * Variant c at n elements from offset `off` of each buffer: the fast table's op on side 0, the reference's (or its
 * unfused ops) on side 1, from the same uploaded bits. Returns the elements that differ between the sides, plus
 * those of either side that changed where nothing may be written (guards, inputs).
 */
static size_t run_case(const struct rt_ops *f, const struct rt_ops *r, const struct variant *c, size_t n, size_t off,
                       enum rt_dtype dt, int unfused, uint64_t case_id)
{
    const size_t es = esize(dt), len = off + n + GUARD_VECTORS * 16 / es, bytes = len * es;
    const size_t start = (size_t)(case_id % POOL_SHIFT);
    for (int k = 0; k < c->nbuf; k++) {
        /* a negative finite guard of its own per buffer: a stray store of any result changes it */
        const uint32_t guard = dt == RT_F32 ? 0xc49a5000u - 0x10000u * (uint32_t)k : 0xe4d2u - 0x10u * (uint32_t)k;
        const int kind = output_kind(c, k);
        for (size_t i = 0; i < len; i++) {
            uint32_t u = guard;
            if (i >= off && i < off + n) {
                if (kind == 1)
                    u = dt == RT_F32 ? 0xc4424000u : 0xe212u; /* a poison the op must overwrite */
                else if (i + 3 >= off + n) /* specials in every tail */
                    u = SPECIAL[dt][(i + (size_t)k + start) % N_SPECIAL];
                else
                    u = pool[k][start + i - off];
            }
            put_bits(hinit[k], dt, i, u);
        }
        mem->upload(st, dbuf[0][k], hinit[k], bytes);
        mem->upload(st, dbuf[1][k], hinit[k], bytes);
    }
    run_op(f, 0, c, n, off, dt);
    if (unfused)
        run_unfused(r, c, n, off, dt);
    else
        run_op(r, 1, c, n, off, dt);
    size_t bad = 0;
    for (int k = 0; k < c->nbuf; k++) {
        mem->download(st, hgot[0][k], dbuf[0][k], bytes);
        mem->download(st, hgot[1][k], dbuf[1][k], bytes);
        const int out = output_kind(c, k) != 0;
        for (size_t i = 0; i < len; i++) {
            const uint32_t a = get_bits(hgot[0][k], dt, i), b = get_bits(hgot[1][k], dt, i);
            const uint32_t u = get_bits(hinit[k], dt, i);
            const int writable = out && i >= off && i < off + n;
            const int ok = a == b && (writable || a == u);
            if (!ok && bad < 3)
                fprintf(stderr,
                        "  %s %s n=%zu +%zu: buffer %d element %ld (%s): fast %#x, %s %#x, uploaded %#x%s\n",
                        rt_dtype_name(dt), c->name, n, off, k, (long)i - (long)off,
                        writable ? "output" : i >= off && i < off + n ? "input" : "guard", a,
                        unfused ? "unfused" : "reference", b, u,
                        is_nan_bits(dt, a) && is_nan_bits(dt, b) ? " (both NaN: the payloads differ)" : "");
            bad += !ok;
        }
    }
    return bad;
}

/* Every size and offset of variant c for dt: one line per size. */
static void check_variant(const struct rt_ops *f, const struct rt_ops *r, const struct variant *c, enum rt_dtype dt,
                          int unfused)
{
    const size_t W = 16 / esize(dt);
    const size_t nsizes = RT_ARRAY_LEN(SIZES) + (c->big ? 1 : 0);
    for (size_t s = 0; s < nsizes; s++) {
        const int big = s == RT_ARRAY_LEN(SIZES);
        const size_t n = big ? BIG : SIZES[s];
        char line[256];
        int len = snprintf(line, sizeof(line), "%s %s%-32s n=%-7zu", rt_dtype_name(dt),
                           unfused ? "fused vs unfused " : "", c->name, n);
        size_t total = 0;
        for (size_t o = 0; o < (big ? 1 : RT_ARRAY_LEN(OFFSETS)); o++) {
            const size_t off = OFFSETS[o] == 16 ? W : OFFSETS[o];
            const size_t bad = run_case(f, r, c, n, off, dt, unfused,
                                        (uint64_t)(c - VARIANTS) * 10000 + s * 100 + o * 10 + (uint64_t)dt);
            total += bad;
            if (len > 0 && (size_t)len < sizeof(line))
                len += snprintf(line + len, sizeof(line) - (size_t)len, " +%zu(%s) %zu", off,
                                off % W ? "reference path" : "fast", bad);
        }
        printf("%s differ  %s\n", line, total ? "FAIL" : "ok");
        CHECKF(total == 0, "%s %s%s n=%zu: %zu elements differ", rt_dtype_name(dt), unfused ? "fused vs unfused " : "",
               c->name, n, total);
    }
}

/* The tables' shape: the fast one fuses and has its own kernel for every op compared here. */
static void check_tables(const struct rt_ops *f, const struct rt_ops *r, enum rt_dtype dt)
{
    CHECKF(f->add_relu == 1, "%s: the fast table does not fuse add + ReLU", rt_dtype_name(dt));
    CHECKF(r->add_relu == 0, "%s: the reference table fuses add + ReLU", rt_dtype_name(dt));
    CHECKF(f->act == dt && r->act == dt, "%s: tables of types %d and %d", rt_dtype_name(dt), (int)f->act, (int)r->act);
#define DIFFERS(op) CHECKF(f->op != r->op, "%s: " #op " of the fast table is the reference kernel", rt_dtype_name(dt))
    DIFFERS(relu_fwd);
    DIFFERS(relu_bwd);
    DIFFERS(add);
    DIFFERS(add_relu_fwd);
    DIFFERS(add_relu_bwd);
    DIFFERS(scale);
    DIFFERS(axpy);
#undef DIFFERS
}

int test_cuda_twins_elem_main(int argc, char **argv)
{
    (void)argv;
    if (argc > 1) {
        fprintf(stderr, "usage: test_cuda_ops twins-elem\n");
        return 1;
    }
    printf("test_cuda_twins_elem: fast element-wise kernels against their reference twins on one GPU; seed %llu\n",
           (unsigned long long)SEED);
    int rc = rt_backend_create(&(struct rt_backend_opts){.kind = RT_BACKEND_CUDA}, &be);
    if (rc < 0) {
        fprintf(stderr, "test_cuda_twins_elem: skip: no CUDA backend: %s\n", rt_errmsg());
        return 77;
    }
    st = rt_backend_stream(be);
    mem = rt_backend_ops(be);
    printf("  %s\n", rt_backend_describe(be));
    if (rt_backend_ops_for(be, RT_F32) == rt_backend_ops_reference(be, RT_F32)) {
        fprintf(stderr, "test_cuda_twins_elem: skip: the backend runs the reference kernels "
                        "(RINGTRAIN_CUDA_KERNELS=reference): nothing to compare\n");
        rt_backend_destroy(be);
        return 77;
    }
    if (buffers_alloc((BIG + 64) * sizeof(float)) < 0) { /* the largest n, its offset and guard, in fp32 */
        buffers_free();
        rt_backend_destroy(be);
        return 1;
    }
    const enum rt_dtype dts[3] = {RT_F32, RT_BF16, RT_F16};
    for (int d = 0; d < 3; d++) {
        const enum rt_dtype dt = dts[d];
        const struct rt_ops *f = rt_backend_ops_for(be, dt);
        if (!f) {
            printf("skip %s: %s\n", rt_dtype_name(dt), rt_errmsg());
            continue;
        }
        const struct rt_ops *r = rt_backend_ops_reference(be, dt);
        CHECKF(r != NULL && r != f, "%s: no reference twin beside the fast table", rt_dtype_name(dt));
        if (!r || r == f)
            continue;
        check_tables(f, r, dt);
        pool_fill(dt);
        for (size_t v = 0; v < RT_ARRAY_LEN(VARIANTS); v++)
            check_variant(f, r, &VARIANTS[v], dt, 0);
        for (size_t v = 0; v < RT_ARRAY_LEN(VARIANTS); v++)
            if (VARIANTS[v].op == ADD_RELU_FWD || VARIANTS[v].op == ADD_RELU_BWD)
                check_variant(f, r, &VARIANTS[v], dt, 1);
    }
    buffers_free();
    rt_backend_destroy(be);
    fflush(stdout);
    return check_result();
}
