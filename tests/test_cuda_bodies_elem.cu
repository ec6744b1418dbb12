/*
 * test_cuda_bodies_elem.cu - the fast element-wise kernels' bodies (compute/cuda/fast_elem.cuh), compiled by
 * nvcc and run on the CPU, against the CPU backend. No GPU is needed or used.
 *
 * Each body is called for every vector index of odd sizes (1, 3, 7, 8, 9, 15, 4097, 100003: tails of every
 * length for 4- and 8-element vectors), twice -- vectors in ascending and in descending order, so that a stray
 * write into a neighbour's elements is not hidden by the neighbour's own write -- on sub-buffers that start 1
 * and 3 vectors into their allocation and have 2 vectors of guard behind them (the body sees only 16-byte
 * aligned operands: the launcher gives anything else to the reference kernel, fe_fast_ok, checked here too).
 * Every op and variant the table uses runs: ReLU forward (also in place), ReLU backward with beta 0 and 1, add
 * and add + ReLU (also into either input), add + ReLU backward with each pair of betas and either output NULL,
 * scale and axpy. Inputs hold NaNs (quiet, signalling, with payloads), zeros of both signs, infinities, the
 * largest finite values (so that sums overflow), the smallest normals and subnormals, among normal values.
 *
 * The expected results come from the CPU backend (one thread, whose denormal flushing -- FTZ/DAZ, which its
 * compute threads set -- is switched off here, as a GPU has none):
 *  - fp32: the CPU's fp32 table, bit for bit;
 *  - bf16: the CPU's bf16 table (rt_backend_ops_for, where this CPU has one) on inputs without subnormals or
 *    smallest normals, since that table's stores flush denormal results to zero (compute/cpu/cpu.h); and, always,
 *    with every special value, the fp32 table on the widened inputs with each result rounded once to bf16;
 *  - fp16: the fp32 table on the widened inputs, each result rounded once to fp16.
 * "Rounded once" is the reference kernels' arithmetic by construction: they widen, compute in float and round
 * once on the store (elem.cu). A NaN matches any NaN (the GPU makes every NaN canonical); every other value must
 * have the same bits, -0 included. Guards and inputs that are not outputs must keep their bits exactly.
 *
 * The comparison must be able to fail: planted faults (a tail that starts late, a full vector stored in the tail,
 * an input read one element off, a fused multiply-add, a beta ignored, a ReLU that turns -0 or NaN into +0, a
 * beta applied to the wrong output) each have to be reported as mismatches. One line per comparison: type, op,
 * size, offsets, mismatches, what the reference was. Exit 0 pass, 1 fail (check.h). The seed is fixed and printed.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "check.h"
#include "common/common.h"
#include "compute/compute.h"
#include "compute/cuda/fast.cuh"
#include "compute/cuda/fast_elem.cuh"

#define SEED UINT64_C(20250411)

static const uint32_t SIZES[] = {1, 3, 7, 8, 9, 15, 4097, 100003};

/* ---- element types ------------------------------------------------------------------------------------------- */

template <typename T> struct ty;
template <> struct ty<float> {
    static const char *name()
    {
        return "fp32";
    }
};
template <> struct ty<__nv_bfloat16> {
    static const char *name()
    {
        return "bf16";
    }
};
template <> struct ty<__half> {
    static const char *name()
    {
        return "fp16";
    }
};

static uint32_t bits_of(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof(u));
    return u;
}
static uint32_t bits_of(__nv_bfloat16 v)
{
    return ((__nv_bfloat16_raw)v).x;
}
static uint32_t bits_of(__half v)
{
    return ((__half_raw)v).x;
}
template <typename T> static T of_bits(uint32_t u);
template <> float of_bits<float>(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}
template <> __nv_bfloat16 of_bits<__nv_bfloat16>(uint32_t u)
{
    __nv_bfloat16_raw r;
    r.x = (unsigned short)u;
    return __nv_bfloat16(r);
}
template <> __half of_bits<__half>(uint32_t u)
{
    __half_raw r;
    r.x = (unsigned short)u;
    return __half(r);
}

/*
 * Special values as bit patterns: NaNs (quiet, signed with a payload, signalling), +0, -0, +-Inf, the largest
 * finite value and a large negative one (sums overflow), +-1; then the "tiny" ones, listed last so that a
 * generator can leave them out: the smallest normal and subnormals of both signs.
 */
#define N_SPECIAL 16
#define N_TINY 5
static const uint32_t SPECIAL_F32[N_SPECIAL] = {0x7fc00000u, 0xffc00001u, 0x7fa00000u, 0x00000000u, 0x80000000u,
                                                0x7f800000u, 0xff800000u, 0x7f7fffffu, 0xff000000u, 0x3f800000u,
                                                0xbf800000u, 0x00800000u, 0x00000001u, 0x807fffffu, 0x00400000u,
                                                0x80000003u};
static const uint32_t SPECIAL_BF16[N_SPECIAL] = {0x7fc0u, 0xffc1u, 0x7fa0u, 0x0000u, 0x8000u, 0x7f80u,
                                                 0xff80u, 0x7f7fu, 0xff00u, 0x3f80u, 0xbf80u, 0x0080u,
                                                 0x0001u, 0x807fu, 0x0040u, 0x8003u};
static const uint32_t SPECIAL_F16[N_SPECIAL] = {0x7e00u, 0xfe01u, 0x7d00u, 0x0000u, 0x8000u, 0x7c00u,
                                                0xfc00u, 0x7bffu, 0xf800u, 0x3c00u, 0xbc00u, 0x0400u,
                                                0x0001u, 0x83ffu, 0x0200u, 0x8003u};
template <typename T> static const uint32_t *specials();
template <> const uint32_t *specials<float>()
{
    return SPECIAL_F32;
}
template <> const uint32_t *specials<__nv_bfloat16>()
{
    return SPECIAL_BF16;
}
template <> const uint32_t *specials<__half>()
{
    return SPECIAL_F16;
}

/* n values of T: 2 N(0, 1) rounded into T, one in 8 (and the last three) a special value; `tiny` 0 leaves out
 * the smallest normal and the subnormals. */
template <typename T> static void fill(T *p, size_t n, struct rt_rng *r, int tiny)
{
    const uint32_t ns = tiny ? N_SPECIAL : N_SPECIAL - N_TINY;
    for (size_t i = 0; i < n; i++) {
        const int special = rt_rng_below(r, 8) == 0 || i + 3 >= n;
        p[i] = special ? of_bits<T>(specials<T>()[rt_rng_below(r, ns)]) : fk_st<T>(2.0f * rt_rng_normal(r));
    }
}

/* ---- the bodies, as a table (the real ones, or one with a planted fault) -------------------------------------- */

template <typename T> struct bodies {
    void (*relu_fwd)(uint32_t v, uint32_t n, const T *x, T *y);
    void (*relu_bwd)(uint32_t v, uint32_t n, const T *y, const T *dy, float beta, T *dx);
    void (*add)(uint32_t v, uint32_t n, const T *a, const T *b, T *y);
    void (*add_relu_fwd)(uint32_t v, uint32_t n, const T *a, const T *b, T *y);
    void (*add_relu_bwd)(uint32_t v, uint32_t n, const T *y, const T *dy, float beta_a, T *dxa, float beta_b, T *dxb);
    void (*scale)(uint32_t v, uint32_t n, float alpha, T *x);
    void (*axpy)(uint32_t v, uint32_t n, float alpha, const T *x, T *y);
};

template <typename T> static bodies<T> real_bodies()
{
    bodies<T> b;
    b.relu_fwd = fe_relu_fwd_vec<T>;
    b.relu_bwd = fe_relu_bwd_vec<T>;
    b.add = fe_add_vec<T>;
    b.add_relu_fwd = fe_add_relu_fwd_vec<T>;
    b.add_relu_bwd = fe_add_relu_bwd_vec<T>;
    b.scale = fe_scale_vec<T>;
    b.axpy = fe_axpy_vec<T>;
    return b;
}

/* ---- the variants ---------------------------------------------------------------------------------------------- */

enum op_id { RELU_FWD, RELU_BWD, ADD, ADD_RELU_FWD, ADD_RELU_BWD, SCALE, AXPY };

/*
 * One way of calling an op: its buffers are nbuf distinct allocations, and each operand role names one of them
 * (-1: absent), so an in-place call is two roles naming the same buffer. Roles: in0, in1 the inputs (x; y, dy;
 * a, b), out0, out1 the outputs (y; dx; dxa, dxb; scale's x is out0). An output is read first where beta != 0
 * and always in scale and axpy.
 */
struct variant {
    enum op_id op;
    const char *name;
    int nbuf;
    int in0, in1, out0, out1;
    float alpha, beta0, beta1;
};

static const struct variant VARIANTS[] = {
    {RELU_FWD, "relu_fwd", 2, 0, -1, 1, -1, 0.0f, 0.0f, 0.0f},
    {RELU_FWD, "relu_fwd in place", 1, 0, -1, 0, -1, 0.0f, 0.0f, 0.0f},
    {RELU_BWD, "relu_bwd beta=0", 3, 0, 1, 2, -1, 0.0f, 0.0f, 0.0f},
    {RELU_BWD, "relu_bwd beta=1", 3, 0, 1, 2, -1, 0.0f, 1.0f, 0.0f},
    {ADD, "add", 3, 0, 1, 2, -1, 0.0f, 0.0f, 0.0f},
    {ADD, "add y=a", 2, 0, 1, 0, -1, 0.0f, 0.0f, 0.0f},
    {ADD, "add y=b", 2, 0, 1, 1, -1, 0.0f, 0.0f, 0.0f},
    {ADD_RELU_FWD, "add_relu_fwd", 3, 0, 1, 2, -1, 0.0f, 0.0f, 0.0f},
    {ADD_RELU_FWD, "add_relu_fwd y=a", 2, 0, 1, 0, -1, 0.0f, 0.0f, 0.0f},
    {ADD_RELU_FWD, "add_relu_fwd y=b", 2, 0, 1, 1, -1, 0.0f, 0.0f, 0.0f},
    {ADD_RELU_BWD, "add_relu_bwd betas 0,0", 4, 0, 1, 2, 3, 0.0f, 0.0f, 0.0f},
    {ADD_RELU_BWD, "add_relu_bwd betas 0,1", 4, 0, 1, 2, 3, 0.0f, 0.0f, 1.0f},
    {ADD_RELU_BWD, "add_relu_bwd betas 1,0", 4, 0, 1, 2, 3, 0.0f, 1.0f, 0.0f},
    {ADD_RELU_BWD, "add_relu_bwd betas 1,1", 4, 0, 1, 2, 3, 0.0f, 1.0f, 1.0f},
    {ADD_RELU_BWD, "add_relu_bwd dxa NULL, beta_b=1", 3, 0, 1, -1, 2, 0.0f, 0.0f, 1.0f},
    {ADD_RELU_BWD, "add_relu_bwd dxb NULL, beta_a=0", 3, 0, 1, 2, -1, 0.0f, 0.0f, 0.0f},
    {SCALE, "scale alpha=-0.75", 1, -1, -1, 0, -1, -0.75f, 0.0f, 0.0f},
    {SCALE, "scale alpha=0", 1, -1, -1, 0, -1, 0.0f, 0.0f, 0.0f},
    {SCALE, "scale alpha=3", 1, -1, -1, 0, -1, 3.0f, 0.0f, 0.0f},
    {AXPY, "axpy alpha=0.37", 2, 0, -1, 1, -1, 0.37f, 0.0f, 0.0f},
    {AXPY, "axpy alpha=-1", 2, 0, -1, 1, -1, -1.0f, 0.0f, 0.0f},
};

static const struct variant *variant_named(const char *name)
{
    for (size_t i = 0; i < RT_ARRAY_LEN(VARIANTS); i++)
        if (!strcmp(VARIANTS[i].name, name))
            return &VARIANTS[i];
    fprintf(stderr, "no variant %s\n", name);
    exit(1);
}

/* 1 when buffer k is written by the variant; 2 when it is also read first. */
static int output_kind(const struct variant &c, int k)
{
    if (k == c.out0)
        return c.op == SCALE || c.op == AXPY || c.beta0 != 0.0f || k == c.in0 || k == c.in1 ? 2 : 1;
    if (k == c.out1)
        return c.beta1 != 0.0f ? 2 : 1;
    return 0;
}

/* The role's pointer into buffers p (each already offset to the sub-buffer), NULL for an absent role. */
template <typename T> static T *role(T *const *p, int k)
{
    return k < 0 ? NULL : p[k];
}

/* Every vector of n elements through body table b, ascending or descending. */
template <typename T> static void run_bodies(const bodies<T> &b, const struct variant &c, uint32_t n, T *const *p,
                                             int descending)
{
    const uint32_t nv = fe_vectors<T>(n);
    T *i0 = role(p, c.in0), *i1 = role(p, c.in1), *o0 = role(p, c.out0), *o1 = role(p, c.out1);
    for (uint32_t k = 0; k < nv; k++) {
        const uint32_t v = descending ? nv - 1 - k : k;
        switch (c.op) {
        case RELU_FWD:
            b.relu_fwd(v, n, i0, o0);
            break;
        case RELU_BWD:
            b.relu_bwd(v, n, i0, i1, c.beta0, o0);
            break;
        case ADD:
            b.add(v, n, i0, i1, o0);
            break;
        case ADD_RELU_FWD:
            b.add_relu_fwd(v, n, i0, i1, o0);
            break;
        case ADD_RELU_BWD:
            b.add_relu_bwd(v, n, i0, i1, c.beta0, o0, c.beta1, o1);
            break;
        case SCALE:
            b.scale(v, n, c.alpha, o0);
            break;
        case AXPY:
            b.axpy(v, n, c.alpha, i0, o0);
            break;
        }
    }
}

/* The same call on a CPU op table; p's buffers hold the table's element type. */
static void run_cpu(const struct rt_ops *o, struct rt_stream *st, const struct variant &c, size_t n, void *const *p)
{
    const float *i0 = (const float *)role(p, c.in0), *i1 = (const float *)role(p, c.in1);
    float *o0 = (float *)role(p, c.out0), *o1 = (float *)role(p, c.out1);
    switch (c.op) {
    case RELU_FWD:
        o->relu_fwd(st, n, i0, o0);
        break;
    case RELU_BWD:
        o->relu_bwd(st, n, i0, i1, c.beta0, o0);
        break;
    case ADD:
        o->add(st, n, i0, i1, o0);
        break;
    case ADD_RELU_FWD:
        o->add_relu_fwd(st, n, i0, i1, o0);
        break;
    case ADD_RELU_BWD:
        o->add_relu_bwd(st, n, i0, i1, c.beta0, o0, c.beta1, o1);
        break;
    case SCALE:
        o->scale(st, n, c.alpha, o0);
        break;
    case AXPY:
        o->axpy(st, n, c.alpha, i0, o0);
        break;
    }
}

/* ---- one case -------------------------------------------------------------------------------------------------- */

static struct rt_backend *cpu;
static struct rt_stream *cpu_st;
static const struct rt_ops *cpu32, *cpu16; /* cpu16: the CPU's bf16 table, NULL where this CPU has none */

/* How the expected values are made. */
enum ref_kind {
    REF_TABLE,   /* the CPU table of T itself (fp32, or the bf16 table) on the same bits */
    REF_ROUNDED, /* the fp32 table on the widened inputs, each result rounded once into T */
};

static void *xalloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/*
 * Variant c over n elements of T at `pre` elements into each buffer (a multiple of the vector width, so 16-byte
 * aligned), `tiny` values included or not, expected values by rk. Returns the mismatches over both orders and
 * every buffer (guards and untouched inputs included); *compared += the output elements compared. `quiet`: no
 * details of mismatches (planted faults).
 */
template <typename T>
static size_t check_case(const bodies<T> &b, const struct variant &c, uint32_t n, size_t pre, enum ref_kind rk,
                         int tiny, uint64_t stream, size_t *compared, int quiet)
{
    const size_t W = FK_VEC(T), post = 2 * W, len = pre + n + post;
    /* guards differ from buffer to buffer and are negative, so that a stray store of any op's result (a ReLU
     * of another buffer's guard, a sum of guards) cannot leave a guard's bits as they were */
    const T poison = fk_st<T>(-777.25f);
    struct rt_rng r;
    rt_rng_init(&r, SEED, stream);
    T *init[4] = {}, *got[2][4] = {}, *exp[4] = {};
    float *wide[4] = {};
    for (int k = 0; k < c.nbuf; k++) {
        init[k] = (T *)xalloc(len * sizeof(T));
        const T guard = fk_st<T>(-1234.5f - 16.0f * (float)k);
        for (size_t i = 0; i < len; i++)
            init[k][i] = guard;
        if (output_kind(c, k) == 1)
            for (size_t i = 0; i < n; i++)
                init[k][pre + i] = poison;
        else
            fill(init[k] + pre, n, &r, tiny);
        for (int o = 0; o < 2; o++) {
            got[o][k] = (T *)xalloc(len * sizeof(T));
            memcpy(got[o][k], init[k], len * sizeof(T));
        }
        exp[k] = (T *)xalloc(len * sizeof(T));
        memcpy(exp[k], init[k], len * sizeof(T));
    }

    /* the bodies, in both orders */
    for (int o = 0; o < 2; o++) {
        T *p[4] = {};
        for (int k = 0; k < c.nbuf; k++)
            p[k] = got[o][k] + pre;
        run_bodies(b, c, n, p, o);
    }

    /* the CPU */
    if (rk == REF_TABLE) {
        void *p[4] = {};
        for (int k = 0; k < c.nbuf; k++)
            p[k] = exp[k] + pre;
        run_cpu(sizeof(T) == sizeof(float) ? cpu32 : cpu16, cpu_st, c, n, p);
    } else {
        void *p[4] = {};
        for (int k = 0; k < c.nbuf; k++) {
            wide[k] = (float *)xalloc(len * sizeof(float));
            for (size_t i = 0; i < len; i++)
                wide[k][i] = fk_ld(init[k][i]);
            p[k] = wide[k] + pre;
        }
        run_cpu(cpu32, cpu_st, c, n, p);
        for (int k = 0; k < c.nbuf; k++)
            if (output_kind(c, k))
                for (size_t i = 0; i < n; i++)
                    exp[k][pre + i] = fk_st<T>(wide[k][pre + i]);
    }

    size_t bad = 0;
    for (int o = 0; o < 2; o++)
        for (int k = 0; k < c.nbuf; k++) {
            const int out = output_kind(c, k) != 0;
            for (size_t i = 0; i < len; i++) {
                const T g = got[o][k][i], e = exp[k][i];
                const int in_region = i >= pre && i < pre + n;
                if (bits_of(g) == bits_of(e) || (out && in_region && isnan(fk_ld(g)) && isnan(fk_ld(e))))
                    continue;
                if (!quiet && bad < 3)
                    fprintf(stderr,
                            "  %s %s n=%u +%zu (%s order): buffer %d element %ld (%s): got %#x (%g), expected %#x "
                            "(%g)\n",
                            ty<T>::name(), c.name, n, pre, o ? "descending" : "ascending", k, (long)i - (long)pre,
                            in_region ? (out ? "output" : "input, must be untouched") : "guard", bits_of(g),
                            (double)fk_ld(g), bits_of(e), (double)fk_ld(e));
                bad++;
            }
            if (out && o == 0)
                *compared += n;
        }
    for (int k = 0; k < c.nbuf; k++) {
        free(init[k]);
        free(got[0][k]);
        free(got[1][k]);
        free(exp[k]);
        free(wide[k]);
    }
    return bad;
}

/* Every size of variant c for T, at sub-buffers 1 and 3 vectors in: one line per size. */
template <typename T> static void check_variant(const struct variant &c, enum ref_kind rk, int tiny, const char *what)
{
    const bodies<T> b = real_bodies<T>();
    const size_t W = FK_VEC(T);
    for (size_t s = 0; s < RT_ARRAY_LEN(SIZES); s++) {
        const uint32_t n = SIZES[s];
        size_t compared = 0, bad = 0;
        for (size_t at = 1; at <= 3; at += 2)
            bad += check_case<T>(b, c, n, at * W, rk, tiny, (uint64_t)(&c - VARIANTS) * 1000 + s * 10 + at,
                                 &compared, 0);
        printf("%s %-32s n=%-6u at +%zu,+%zu: %zu mismatches in %zu outputs x 2 orders against %s  %s\n",
               ty<T>::name(), c.name, n, W, 3 * W, bad, compared, what, bad ? "FAIL" : "ok");
        CHECKF(bad == 0, "%s %s n=%u: %zu mismatches against %s", ty<T>::name(), c.name, n, bad, what);
    }
}

/* ---- planted faults ------------------------------------------------------------------------------------------ */

/* relu_fwd whose tail starts one element late. */
template <typename T> static void bad_tail_late(uint32_t v, uint32_t n, const T *x, T *y)
{
    const uint32_t i = v * (uint32_t)FK_VEC(T);
    if (n - i >= (uint32_t)FK_VEC(T)) {
        fe_relu_fwd_vec<T>(v, n, x, y);
        return;
    }
    for (uint32_t j = i + 1; j < n; j++)
        y[j] = fk_st<T>(fe_relu(fk_ld(x[j])));
}

/* relu_fwd that moves a whole vector in the tail too (past n). */
template <typename T> static void bad_tail_full(uint32_t v, uint32_t n, const T *x, T *y)
{
    (void)n;
    fe_relu_fwd_vec<T>(v, (v + 1) * (uint32_t)FK_VEC(T), x, y);
}

/* add that reads b one element off in its vectors. */
template <typename T> static void bad_shift(uint32_t v, uint32_t n, const T *a, const T *b, T *y)
{
    const uint32_t i = v * (uint32_t)FK_VEC(T);
    if (n - i >= (uint32_t)FK_VEC(T)) {
        for (int l = 0; l < FK_VEC(T); l++)
            y[i + l] = fk_st<T>(fk_add(fk_ld(a[i + l]), fk_ld(b[i + l + 1])));
        return;
    }
    fe_add_vec<T>(v, n, a, b, y);
}

/* axpy through one fused multiply-add (a contraction the reference kernel never makes). */
template <typename T> static void bad_fma(uint32_t v, uint32_t n, float alpha, const T *x, T *y)
{
    const uint32_t i = v * (uint32_t)FK_VEC(T), e = n - i < (uint32_t)FK_VEC(T) ? n : i + (uint32_t)FK_VEC(T);
    for (uint32_t j = i; j < e; j++)
        y[j] = fk_st<T>(fmaf(alpha, fk_ld(x[j]), fk_ld(y[j])));
}

/* relu_bwd that always overwrites. */
template <typename T> static void bad_beta(uint32_t v, uint32_t n, const T *y, const T *dy, float beta, T *dx)
{
    (void)beta;
    fe_relu_bwd_vec<T>(v, n, y, dy, 0.0f, dx);
}

/* ReLU as `v <= 0 ? 0 : v`: -0 becomes +0. */
template <typename T> static void bad_relu_le(uint32_t v, uint32_t n, const T *x, T *y)
{
    const uint32_t i = v * (uint32_t)FK_VEC(T), e = n - i < (uint32_t)FK_VEC(T) ? n : i + (uint32_t)FK_VEC(T);
    for (uint32_t j = i; j < e; j++) {
        const float f = fk_ld(x[j]);
        y[j] = fk_st<T>(f <= 0.0f ? 0.0f : f);
    }
}

/* ReLU as fmaxf(v, 0): NaN becomes 0. */
template <typename T> static void bad_relu_max(uint32_t v, uint32_t n, const T *x, T *y)
{
    const uint32_t i = v * (uint32_t)FK_VEC(T), e = n - i < (uint32_t)FK_VEC(T) ? n : i + (uint32_t)FK_VEC(T);
    for (uint32_t j = i; j < e; j++)
        y[j] = fk_st<T>(fmaxf(fk_ld(x[j]), 0.0f));
}

/* add_relu_bwd that applies beta_a to both outputs. */
template <typename T>
static void bad_betas(uint32_t v, uint32_t n, const T *y, const T *dy, float beta_a, T *dxa, float beta_b, T *dxb)
{
    (void)beta_b;
    fe_add_relu_bwd_vec<T>(v, n, y, dy, beta_a, dxa, beta_a, dxb);
}

/* The body table b (one fault planted) on variant `name` over sizes 7, 9 and 4097: it must mismatch. */
template <typename T>
static void expect_caught(const char *fault, const bodies<T> &b, const char *name, enum ref_kind rk)
{
    const struct variant &c = *variant_named(name);
    static const uint32_t sizes[] = {7, 9, 4097};
    size_t bad = 0, compared = 0;
    for (size_t s = 0; s < RT_ARRAY_LEN(sizes); s++)
        bad += check_case<T>(b, c, sizes[s], FK_VEC(T), rk, 1, 900000 + s, &compared, 1);
    printf("planted fault (%s) in %s %s: %zu mismatches of %zu outputs: %s\n", fault, ty<T>::name(), c.name, bad,
           compared, bad ? "caught" : "NOT CAUGHT");
    CHECKF(bad > 0, "planted fault (%s) in %s %s went unnoticed", fault, ty<T>::name(), c.name);
}

template <typename T> static void planted_faults(enum ref_kind rk)
{
    bodies<T> b = real_bodies<T>();
    b.relu_fwd = bad_tail_late<T>;
    expect_caught<T>("tail starts one element late", b, "relu_fwd", rk);
    b.relu_fwd = bad_tail_full<T>;
    expect_caught<T>("whole vector stored in the tail", b, "relu_fwd", rk);
    b.relu_fwd = bad_relu_le<T>;
    expect_caught<T>("ReLU turns -0 into +0", b, "relu_fwd", rk);
    b.relu_fwd = bad_relu_max<T>;
    expect_caught<T>("ReLU turns NaN into 0", b, "relu_fwd in place", rk);
    b = real_bodies<T>();
    b.add = bad_shift<T>;
    expect_caught<T>("input read one element off", b, "add", rk);
    /* A contraction moves an fp32 result by an ulp, which rounding to 16 bits hides but for rare ties: caught in
     * fp32 only (the GPU test's bit-for-bit comparison with the reference kernels covers 16 bits there). */
    if (sizeof(T) == sizeof(float)) {
        b = real_bodies<T>();
        b.axpy = bad_fma<T>;
        expect_caught<T>("fused multiply-add", b, "axpy alpha=0.37", rk);
    }
    b = real_bodies<T>();
    b.relu_bwd = bad_beta<T>;
    expect_caught<T>("beta ignored", b, "relu_bwd beta=1", rk);
    b = real_bodies<T>();
    b.add_relu_bwd = bad_betas<T>;
    expect_caught<T>("beta_a applied to dxb", b, "add_relu_bwd betas 0,1", rk);
}

/* ---- the launch rules ------------------------------------------------------------------------------------------ */

template <typename T> static void check_index_range(void)
{
    /* the largest n the fast kernels take: vector offsets and the tail's end stay below 2^32 */
    const uint32_t n = (uint32_t)FE_MAX_N, nv = fe_vectors<T>(n), W = (uint32_t)FK_VEC(T);
    const uint64_t last = (uint64_t)(nv - 1) * W;
    CHECKF(last < n && n - last <= W && (uint64_t)nv * W < (UINT64_C(1) << 32), "%s: n=%u nv=%u", ty<T>::name(), n,
           nv);
    printf("%s: n = 2^31 - 1 is %u vectors, the last at element %llu (32-bit offsets)\n", ty<T>::name(), nv,
           (unsigned long long)last);
}

static void check_rules(void)
{
    float *p = (float *)xalloc(64 * sizeof(float));
    const char *c = (const char *)p;
    CHECK(fe_fast_ok(100, p, p + 4, p + 8, NULL));
    CHECK(fe_fast_ok(0, p));
    CHECK(fe_fast_ok(FE_MAX_N, p, p));
    CHECK(!fe_fast_ok(FE_MAX_N + 1, p, p));
    CHECK(!fe_fast_ok((size_t)1 << 33, p));
    for (int off = 1; off < 16; off++) { /* every misalignment, in any operand */
        CHECKF(!fe_fast_ok(8, c + off), "offset %d", off);
        CHECKF(!fe_fast_ok(8, p, p, p, c + off), "offset %d", off);
    }
    CHECK(!fe_fast_ok(8, p + 1, p));     /* fp32 + 1 element */
    CHECK(!fe_fast_ok(8, p, c + 2 * 3)); /* 16-bit + 3 elements */
    CHECK(fe_fast_ok(8, c + 2 * 8, p));  /* 16-bit + 8 elements: a whole vector in */
    free(p);
    CHECK(fe_grid(0, 132, 2048) == 1);
    CHECK(fe_grid(1, 132, 2048) == 1);
    CHECK(fe_grid(FE_THREADS, 132, 2048) == 1);
    CHECK(fe_grid(FE_THREADS + 1, 132, 2048) == 2);
    CHECK(fe_grid(UINT32_MAX / 8, 132, 2048) == 132 * 8 * FE_WAVES); /* H200 */
    CHECK(fe_grid(UINT32_MAX / 8, 40, 1024) == 40 * 4 * FE_WAVES);   /* a Turing part */
    CHECK(fe_grid(UINT32_MAX / 8, 0, 0) == FE_WAVES);               /* nonsense properties: still a grid */
    CHECK(fe_vectors<float>(0) == 0 && fe_vectors<float>(1) == 1 && fe_vectors<float>(4) == 1 &&
          fe_vectors<float>(5) == 2);
    CHECK(fe_vectors<__half>(8) == 1 && fe_vectors<__half>(9) == 2 && fe_vectors<__nv_bfloat16>(15) == 2);
    printf("launch rules: fe_fast_ok refuses every misaligned operand and n >= 2^31; fe_grid caps at %d blocks on "
           "an H200 (132 multiprocessors of 2048 threads)\n",
           132 * 8 * FE_WAVES);
    check_index_range<float>();
    check_index_range<__nv_bfloat16>();
    check_index_range<__half>();
}

/* The CPU ops see denormals as a GPU does: ReLU of a negative subnormal is +0, the sum of two subnormals exact. */
static int cpu_keeps_denormals(void)
{
    float x[2] = {-1e-40f, 1e-40f}, y[2] = {7.0f, 7.0f};
    cpu32->relu_fwd(cpu_st, 1, x, y);
    cpu32->add(cpu_st, 1, x + 1, x + 1, y + 1);
    return bits_of(y[0]) == 0 && bits_of(y[1]) == 2 * bits_of(x[1]); /* a subnormal's bits count 2^-149s */
}

int main(void)
{
    printf("test_cuda_bodies_elem: the fast element-wise bodies on the CPU against the CPU backend; seed %llu\n",
           (unsigned long long)SEED);
    struct rt_backend_opts o;
    memset(&o, 0, sizeof(o));
    o.kind = RT_BACKEND_CPU;
    o.threads = 1; /* every op on this thread, whose floating-point mode is set below */
    o.cpu_streams = RT_CPU_STREAMS_SYNC;
    if (rt_backend_create(&o, &cpu) < 0) {
        fprintf(stderr, "test_cuda_bodies_elem: cpu backend: %s\n", rt_errmsg());
        return 1;
    }
#if defined(__x86_64__)
    _mm_setcsr(_mm_getcsr() & ~0x8040u); /* FTZ (bit 15) and DAZ (bit 6) off: a GPU keeps denormals */
#endif
    cpu_st = rt_backend_stream(cpu);
    cpu32 = rt_backend_ops(cpu);
    cpu16 = rt_backend_ops_for(cpu, RT_BF16);
    CHECKF(cpu_keeps_denormals(), "the CPU backend's ops flush denormals on this thread: the comparisons with "
                                  "subnormal values would not be the GPU's");
    if (cpu16)
        printf("bf16: against the CPU's bf16 table (inputs without subnormals and smallest normals, whose results it "
               "flushes) and the fp32 table rounded once (every input)\n");
    else
        printf("bf16: this CPU has no bf16 table (%s): against the fp32 table rounded once only\n", rt_errmsg());

    check_rules();
    for (size_t v = 0; v < RT_ARRAY_LEN(VARIANTS); v++)
        check_variant<float>(VARIANTS[v], REF_TABLE, 1, "cpu fp32 table");
    for (size_t v = 0; v < RT_ARRAY_LEN(VARIANTS); v++) {
        if (cpu16)
            check_variant<__nv_bfloat16>(VARIANTS[v], REF_TABLE, 0, "cpu bf16 table (no tiny inputs)");
        check_variant<__nv_bfloat16>(VARIANTS[v], REF_ROUNDED, 1, "cpu fp32 rounded once to bf16");
    }
    for (size_t v = 0; v < RT_ARRAY_LEN(VARIANTS); v++)
        check_variant<__half>(VARIANTS[v], REF_ROUNDED, 1, "cpu fp32 rounded once to fp16");

    planted_faults<float>(REF_TABLE);
    planted_faults<__nv_bfloat16>(REF_ROUNDED);
    planted_faults<__half>(REF_ROUNDED);

    rt_backend_destroy(cpu);
    fflush(stdout);
    return check_result();
}
