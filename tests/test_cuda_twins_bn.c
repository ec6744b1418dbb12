/*
 * test_cuda_twins_bn.c - the CUDA backend's fast batchnorm kernels (compute/cuda/fast_bn.cu) against their
 * reference twins (rt_backend_ops_reference: spatial.cu, nhwc16.cu) on the same GPU and inputs, and against the
 * CPU backend; skips (77) without a usable GPU, and under RINGTRAIN_CUDA_KERNELS=reference (no fast tables).
 *
 * For fp32 (NCHW), bf16 and fp16 (NHWC), over odd shapes (C not a multiple of 8, H*W not a multiple of 4, 1x1
 * planes, C = 1, one value per channel) and the ResNet shapes (N = 512, C = 64..512, 32x32..4x4):
 *   - the four ops of the fast table against the reference table's: statistics and parameter gradients within
 *     the reduction tolerance of test_cuda_ops (1e-5 + 1e-5 max|ref|: the two sum in different orders), outputs
 *     within that plus one rounding of the type (the 16-bit reference kernels let the compiler fuse a * b + c);
 *     the fp32 inference ops bit for bit (no sums, the same roundings);
 *   - the fused ReLU (rt_bn_desc.relu, the fast table's bn_relu = 1) against the reference's unfused
 *     composition: bn_train_fwd / bn_infer_fwd then relu_fwd in place, and relu_bwd on that output then bn_bwd /
 *     bn_infer_bwd. The 16-bit reference computes the batchnorm's output with a fused multiply-add, so a ReLU
 *     mask may differ from the fast kernels' where that output is within an ulp of 0: these checks run on the odd
 *     shapes there, where that is vanishingly rare, and on every shape in fp32;
 *   - the CPU backend (its fp32 ops; its bf16 table where the CPU has one, else the fp32 ops with outputs rounded
 *     once by the GPU's own conversion; fp16 likewise), on the odd shapes;
 *   - determinism: each fast op called twice on the same inputs gives the same bits; bn_bwd with dx NULL gives
 *     the parameter gradients of the call with dx.
 * Then, for the ResNet shapes, the time per call of each table's ops (host clock over repeated calls, after a
 * warm-up) and the fast kernels' bandwidth by their byte count (fast_bn.cu): informational, no assertion --
 * performance claims come from the benchmarks.
 *
 * `test_cuda_ops twins-bn --stand-in` runs the same checks with a CPU backend in the GPU's place (its tables as both
 * "fast" and "reference"; bf16 where the CPU has it; no fp16, no ResNet shapes, no times): a check of the test
 * itself -- its unfused compositions, its plumbing -- on a machine without a GPU. `--quick` leaves out the ResNet
 * shapes and the times (a run under compute-sanitizer).
 *
 * One line per comparison; exit 0 pass, 1 fail, 77 skip. Seed fixed and printed.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "test_cuda_parts.h"
#include "test_util.h"
#include "common/common.h"
#include "compute/compute.h"

#define SEED UINT64_C(20250312)
#define ATOL 1e-5
#define RMAX 1e-5

static struct rt_backend *gbe, *cbe;
static struct rt_stream *gs, *cs;
static const struct rt_ops *g32, *c32;
static int stand_in; /* --stand-in: a CPU backend in the GPU's place */
static int quick;    /* --quick: the odd shapes only */

/* ---- memory on either backend ----------------------------------------------------------------------------- */

static float *dalloc(struct rt_backend *be, size_t bytes)
{
    void *p = rt_backend_ops(be)->alloc(be, bytes ? bytes : 4);
    if (!p) {
        fprintf(stderr, "test_cuda_twins_bn: alloc of %zu bytes: %s\n", bytes, rt_errmsg());
        exit(1);
    }
    return p;
}

static size_t count4(struct rt_shape4 sh)
{
    return (size_t)sh.n * sh.c * sh.h * sh.w;
}

/* One table of one backend: where its tensors go and how they come back. */
struct side {
    struct rt_backend *be;
    struct rt_stream *s;
    const struct rt_ops *o;       /* the table whose ops run; its from_nchw/to_nchw hold the spatial tensors */
    const struct rt_ops *round16; /* NULL, or a GPU 16-bit table rounding this side's fp32 outputs (emulation) */
};

static float *sp_put(const struct side *sd, struct rt_shape4 sh, const float *host)
{
    float *d = dalloc(sd->be, count4(sh) * sizeof(float));
    sd->o->from_nchw(sd->s, sh, host, d);
    return d;
}

static void sp_set(const struct side *sd, struct rt_shape4 sh, const float *host, float *d)
{
    sd->o->from_nchw(sd->s, sh, host, d);
}

/* Rounds host NCHW values to the 16-bit type of table o16 on the GPU (its own conversion), in place. */
static void round_on_gpu(const struct rt_ops *o16, struct rt_shape4 sh, float *host)
{
    float *d = dalloc(gbe, count4(sh) * sizeof(float));
    o16->from_nchw(gs, sh, host, d);
    o16->to_nchw(gs, sh, d, host);
    o16->sync(gs);
    g32->free(gbe, d);
}

static void sp_get(const struct side *sd, struct rt_shape4 sh, const float *d, float *host)
{
    sd->o->to_nchw(sd->s, sh, d, host);
    sd->o->sync(sd->s);
    if (sd->round16)
        round_on_gpu(sd->round16, sh, host);
}

static float *v_put(const struct side *sd, const float *host, size_t n)
{
    float *d = dalloc(sd->be, n * sizeof(float));
    rt_backend_ops(sd->be)->upload(sd->s, d, host, n * sizeof(float));
    return d;
}

static void v_set(const struct side *sd, const float *host, float *d, size_t n)
{
    rt_backend_ops(sd->be)->upload(sd->s, d, host, n * sizeof(float));
}

static void v_get(const struct side *sd, const float *d, float *host, size_t n)
{
    rt_backend_ops(sd->be)->download(sd->s, host, d, n * sizeof(float));
    rt_backend_ops(sd->be)->sync(sd->s);
}

static void dfree(const struct side *sd, float *d)
{
    rt_backend_ops(sd->be)->free(sd->be, d);
}

/* ---- comparison -------------------------------------------------------------------------------------------- */

/* |got - ref| <= ATOL + RMAX max|ref| + urel |ref_i| (exact: equal values, two NaNs agreeing); one line. */
static size_t compare(const char *what, const char *dt, const char *shape, const float *ref, const float *got,
                      size_t n, int exact, double urel)
{
    double mx = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && fabs((double)ref[i]) > mx)
            mx = fabs((double)ref[i]);
    size_t bad = 0, diff = 0, first = 0;
    double worst = 0.0, worst_tol = 0.0;
    for (size_t i = 0; i < n; i++) {
        const float r = ref[i], g = got[i];
        diff += memcmp(&r, &g, sizeof(r)) != 0;
        int ok;
        double err = 0.0, tol = 0.0;
        if (isnan(r) || isnan(g))
            ok = isnan(r) && isnan(g);
        else if (exact || !isfinite(r) || !isfinite(g))
            ok = r == g;
        else {
            err = fabs((double)g - (double)r);
            tol = ATOL + RMAX * mx + urel * fabs((double)r);
            ok = err <= tol;
        }
        if (!exact && (i == 0 || err * worst_tol > worst * tol)) {
            worst = err;
            worst_tol = tol;
        }
        if (!ok && bad++ == 0)
            first = i;
    }
    if (exact)
        printf("  %-44s %-4s %-28s exact: %zu of %zu bits differ  %s\n", what, dt, shape, diff, n, bad ? "FAIL" : "ok");
    else
        printf("  %-44s %-4s %-28s err %-9.3g of tol %-9.3g bits differ %zu/%zu  %s\n", what, dt, shape, worst,
               worst_tol, diff, n, bad ? "FAIL" : "ok");
    if (bad)
        printf("    %zu values off, first [%zu]: ref %.9g got %.9g\n", bad, first, (double)ref[first],
               (double)got[first]);
    CHECKF(bad == 0, "%s %s %s: %zu of %zu values off", what, dt, shape, bad, n);
    return bad;
}

static void same_bits(const char *what, const char *dt, const char *shape, const float *a, const float *b, size_t n)
{
    const int same = !memcmp(a, b, n * sizeof(float));
    printf("  %-44s %-4s %-28s the same bits twice  %s\n", what, dt, shape, same ? "ok" : "FAIL");
    CHECKF(same, "%s %s %s: a second call gave other bits", what, dt, shape);
}

/* ---- one case: host inputs, and the ops on a side ---------------------------------------------------------- */

struct hcase {
    struct rt_shape4 sh;
    size_t n, c;
    float *x, *dy, *old, *nans;                    /* NCHW, exact in the type */
    float *gamma, *beta, *rm, *rv, *dg, *db, *cn; /* C each; cn: NaN */
    float *sm, *si;                                /* backward's saved statistics (the reference forward's) */
};

/* The outputs of one op run, on the host. */
struct hout {
    float *y, *dx;                         /* NCHW */
    float *sm, *si, *rm, *rv, *dg, *db;    /* C */
};

static void hout_init(struct hout *o, size_t n, size_t c)
{
    o->y = tu_hfloats(n);
    o->dx = tu_hfloats(n);
    o->sm = tu_hfloats(c);
    o->si = tu_hfloats(c);
    o->rm = tu_hfloats(c);
    o->rv = tu_hfloats(c);
    o->dg = tu_hfloats(c);
    o->db = tu_hfloats(c);
}

static void hout_free(struct hout *o)
{
    free(o->y);
    free(o->dx);
    free(o->sm);
    free(o->si);
    free(o->rm);
    free(o->rv);
    free(o->dg);
    free(o->db);
}

static struct rt_bn_desc desc_of(struct rt_shape4 sh, int relu)
{
    struct rt_bn_desc d;
    memset(&d, 0, sizeof(d));
    d.in = sh;
    d.eps = 1e-5f;
    d.momentum = 0.1f;
    d.relu = relu;
    return d;
}

/* Device tensors of a side, made once per case and reset before each op. */
struct dcase {
    float *x, *y, *dy, *dx, *g, *b, *rm, *rv, *sm, *si, *dg, *db;
};

static void dcase_init(const struct side *sd, const struct hcase *h, struct dcase *d)
{
    d->x = sp_put(sd, h->sh, h->x);
    d->y = sp_put(sd, h->sh, h->nans);
    d->dy = sp_put(sd, h->sh, h->dy);
    d->dx = sp_put(sd, h->sh, h->nans);
    d->g = v_put(sd, h->gamma, h->c);
    d->b = v_put(sd, h->beta, h->c);
    d->rm = v_put(sd, h->rm, h->c);
    d->rv = v_put(sd, h->rv, h->c);
    d->sm = v_put(sd, h->cn, h->c);
    d->si = v_put(sd, h->cn, h->c);
    d->dg = v_put(sd, h->dg, h->c);
    d->db = v_put(sd, h->db, h->c);
}

static void dcase_free(const struct side *sd, struct dcase *d)
{
    float *all[] = {d->x, d->y, d->dy, d->dx, d->g, d->b, d->rm, d->rv, d->sm, d->si, d->dg, d->db};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        dfree(sd, all[i]);
}

/* bn_train_fwd (then, with unfused_relu, the table's relu_fwd in place on y). */
static void do_train_fwd(const struct side *sd, const struct hcase *h, struct dcase *d, int relu, int unfused_relu,
                         struct hout *o)
{
    const struct rt_bn_desc de = desc_of(h->sh, relu);
    sp_set(sd, h->sh, h->nans, d->y);
    v_set(sd, h->rm, d->rm, h->c);
    v_set(sd, h->rv, d->rv, h->c);
    v_set(sd, h->cn, d->sm, h->c);
    v_set(sd, h->cn, d->si, h->c);
    sd->o->bn_train_fwd(sd->s, &de, d->x, d->g, d->b, d->rm, d->rv, d->sm, d->si, d->y);
    if (unfused_relu)
        sd->o->relu_fwd(sd->s, h->n, d->y, d->y);
    sp_get(sd, h->sh, d->y, o->y);
    v_get(sd, d->sm, o->sm, h->c);
    v_get(sd, d->si, o->si, h->c);
    v_get(sd, d->rm, o->rm, h->c);
    v_get(sd, d->rv, o->rv, h->c);
}

static void do_infer_fwd(const struct side *sd, const struct hcase *h, struct dcase *d, int relu, int unfused_relu,
                         struct hout *o)
{
    const struct rt_bn_desc de = desc_of(h->sh, relu);
    sp_set(sd, h->sh, h->nans, d->y);
    v_set(sd, h->rm, d->rm, h->c);
    v_set(sd, h->rv, d->rv, h->c);
    sd->o->bn_infer_fwd(sd->s, &de, d->x, d->g, d->b, d->rm, d->rv, d->y);
    if (unfused_relu)
        sd->o->relu_fwd(sd->s, h->n, d->y, d->y);
    sp_get(sd, h->sh, d->y, o->y);
}

/*
 * bn_bwd from h's saved statistics; beta_dx 1 starts dx at h->old, 0 at NaN. With unfused_relu the gradient
 * first goes through the table's relu_bwd on the forward's output (train_fwd then relu_fwd in place, from the
 * same saved statistics: the reference forward's). no_dx: dx NULL.
 */
static void do_bwd(const struct side *sd, const struct hcase *h, struct dcase *d, int relu, int unfused_relu, int bd,
                   int no_dx, struct hout *o)
{
    const struct rt_bn_desc de = desc_of(h->sh, relu);
    sp_set(sd, h->sh, bd ? h->old : h->nans, d->dx);
    v_set(sd, h->sm, d->sm, h->c);
    v_set(sd, h->si, d->si, h->c);
    v_set(sd, h->dg, d->dg, h->c);
    v_set(sd, h->db, d->db, h->c);
    const float *g = d->dy;
    float *masked = NULL;
    if (unfused_relu) {
        /* the forward's ReLU output, recomputed with the reference's own kernels and h's statistics: the
         * training forward would have written it; here the saved statistics are inputs */
        struct rt_bn_desc fe = desc_of(h->sh, 0);
        float *rm = v_put(sd, h->rm, h->c), *rv = v_put(sd, h->rv, h->c), *sm = v_put(sd, h->cn, h->c),
              *si = v_put(sd, h->cn, h->c);
        sd->o->bn_train_fwd(sd->s, &fe, d->x, d->g, d->b, rm, rv, sm, si, d->y);
        sd->o->relu_fwd(sd->s, h->n, d->y, d->y);
        masked = sp_put(sd, h->sh, h->nans);
        sd->o->relu_bwd(sd->s, h->n, d->y, d->dy, 0.0f, masked);
        g = masked;
        dfree(sd, rm);
        dfree(sd, rv);
        dfree(sd, sm);
        dfree(sd, si);
    }
    sd->o->bn_bwd(sd->s, &de, d->x, g, d->g, d->b, d->sm, d->si, (float)bd, no_dx ? NULL : d->dx, d->dg, d->db);
    if (!no_dx)
        sp_get(sd, h->sh, d->dx, o->dx);
    v_get(sd, d->dg, o->dg, h->c);
    v_get(sd, d->db, o->db, h->c);
    if (masked)
        dfree(sd, masked);
}

static void do_infer_bwd(const struct side *sd, const struct hcase *h, struct dcase *d, int relu, int unfused_relu,
                         int bd, struct hout *o)
{
    const struct rt_bn_desc de = desc_of(h->sh, relu), fe = desc_of(h->sh, 0);
    sp_set(sd, h->sh, bd ? h->old : h->nans, d->dx);
    v_set(sd, h->rm, d->rm, h->c);
    v_set(sd, h->rv, d->rv, h->c);
    const float *g = d->dy;
    float *masked = NULL;
    if (unfused_relu) {
        sd->o->bn_infer_fwd(sd->s, &fe, d->x, d->g, d->b, d->rm, d->rv, d->y);
        sd->o->relu_fwd(sd->s, h->n, d->y, d->y);
        masked = sp_put(sd, h->sh, h->nans);
        sd->o->relu_bwd(sd->s, h->n, d->y, d->dy, 0.0f, masked);
        g = masked;
    }
    sd->o->bn_infer_bwd(sd->s, &de, d->x, g, d->g, d->b, d->rm, d->rv, (float)bd, d->dx);
    sp_get(sd, h->sh, d->dx, o->dx);
    if (masked)
        dfree(sd, masked);
}

/* ---- a case ------------------------------------------------------------------------------------------------ */

/* One rounding of the type, relative: what a differently rounded (or fused) expression may move a stored value. */
static double ulp_rel(enum rt_dtype dt)
{
    return dt == RT_BF16 ? 0x1p-7 : dt == RT_F16 ? 0x1p-10 : 0.0;
}

/* The spatial inputs of a shape in fp32, made once for the three types. */
struct hbase {
    float *x, *dy, *old;
};

static void hbase_make(struct hbase *b, struct rt_shape4 sh, uint64_t stream)
{
    static const float mu[] = {0.0f, 5.0f, -20.0f, 1.5f}, sd[] = {1.0f, 3.0f, 0.5f, 2.0f};
    struct rt_rng r;
    rt_rng_init(&r, SEED, stream);
    const size_t n = count4(sh), hw = (size_t)sh.h * sh.w;
    b->x = tu_hfloats(n);
    b->dy = tu_hfloats(n);
    b->old = tu_hfloats(n);
    for (size_t i = 0; i < n; i++) {
        const size_t c = i / hw % (size_t)sh.c;
        b->x[i] = mu[c % 4] + sd[c % 4] * rt_rng_normal(&r);
        b->dy[i] = rt_rng_normal(&r);
        b->old[i] = -1.0f + 2.0f * rt_rng_uniform(&r);
    }
}

static void hbase_free(struct hbase *b)
{
    free(b->x);
    free(b->dy);
    free(b->old);
}

/* A case's inputs: the shape's, rounded to the type by o16 (NULL: fp32), and per-channel ones from `stream`. */
static void hcase_make(struct hcase *h, struct rt_shape4 sh, const struct hbase *b, const struct rt_ops *o16,
                       uint64_t stream)
{
    struct rt_rng r;
    rt_rng_init(&r, SEED, stream);
    h->sh = sh;
    h->n = count4(sh);
    h->c = (size_t)sh.c;
    h->x = tu_hfloats(h->n);
    h->dy = tu_hfloats(h->n);
    h->old = tu_hfloats(h->n);
    h->nans = tu_hfloats(h->n);
    memcpy(h->x, b->x, h->n * sizeof(float));
    memcpy(h->dy, b->dy, h->n * sizeof(float));
    memcpy(h->old, b->old, h->n * sizeof(float));
    for (size_t i = 0; i < h->n; i++)
        h->nans[i] = NAN;
    if (o16) { /* values exact in the type, so that every side sees the same */
        round_on_gpu(o16, sh, h->x);
        round_on_gpu(o16, sh, h->dy);
        round_on_gpu(o16, sh, h->old);
    }
    float **pc[] = {&h->gamma, &h->beta, &h->rm, &h->rv, &h->dg, &h->db, &h->cn, &h->sm, &h->si};
    for (size_t i = 0; i < sizeof(pc) / sizeof(pc[0]); i++)
        *pc[i] = tu_hfloats(h->c);
    for (size_t c = 0; c < h->c; c++) {
        h->gamma[c] = 0.5f + rt_rng_uniform(&r);
        h->beta[c] = -0.5f + rt_rng_uniform(&r);
        h->rm[c] = -1.0f + 2.0f * rt_rng_uniform(&r);
        h->rv[c] = 0.5f + 1.5f * rt_rng_uniform(&r);
        h->dg[c] = -1.0f + 2.0f * rt_rng_uniform(&r);
        h->db[c] = -1.0f + 2.0f * rt_rng_uniform(&r);
        h->cn[c] = NAN;
    }
}

static void hcase_free(struct hcase *h)
{
    float *all[] = {h->x, h->dy, h->old, h->nans, h->gamma, h->beta, h->rm, h->rv, h->dg, h->db, h->cn, h->sm, h->si};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        free(all[i]);
}

/* Bytes the fast kernels move per call (fast_bn.cu's count), e the element size. */
static double fast_bytes(const char *op, size_t n, size_t e, int bd)
{
    if (!strcmp(op, "bn_train_fwd"))
        return 3.0 * (double)(n * e);
    if (!strcmp(op, "bn_infer_fwd"))
        return 2.0 * (double)(n * e);
    if (!strcmp(op, "bn_bwd"))
        return (5.0 + bd) * (double)(n * e);
    return (3.0 + bd) * (double)(n * e);
}

/* Seconds per call of op on table o (informational). */
static double time_op(const struct side *sd, const struct hcase *h, struct dcase *d, const char *op, int relu)
{
    const struct rt_bn_desc de = desc_of(h->sh, relu);
    const int reps = 20;
    uint64_t t0 = 0;
    for (int i = -3; i < reps; i++) {
        if (i == 0) {
            sd->o->sync(sd->s);
            t0 = rt_now_ns();
        }
        if (!strcmp(op, "bn_train_fwd"))
            sd->o->bn_train_fwd(sd->s, &de, d->x, d->g, d->b, d->rm, d->rv, d->sm, d->si, d->y);
        else if (!strcmp(op, "bn_infer_fwd"))
            sd->o->bn_infer_fwd(sd->s, &de, d->x, d->g, d->b, d->rm, d->rv, d->y);
        else if (!strcmp(op, "bn_bwd"))
            sd->o->bn_bwd(sd->s, &de, d->x, d->dy, d->g, d->b, d->sm, d->si, 0.0f, d->dx, d->dg, d->db);
        else
            sd->o->bn_infer_bwd(sd->s, &de, d->x, d->dy, d->g, d->b, d->rm, d->rv, 0.0f, d->dx);
    }
    sd->o->sync(sd->s);
    return (double)(rt_now_ns() - t0) * 1e-9 / reps;
}

/*
 * One shape in one type. cpu: a side on the CPU backend (NULL: not compared there). composed16: run the
 * fused-against-unfused checks also in 16 bits. timing: print the informational times.
 */
static void run_case(struct rt_shape4 sh, const struct hbase *b, enum rt_dtype dt, const struct side *fast,
                     const struct side *ref, const struct side *cpu, int composed16, int timing, uint64_t stream)
{
    const char *dn = rt_dtype_name(dt);
    char shape[64];
    snprintf(shape, sizeof(shape), "(%d,%d,%d,%d)", sh.n, sh.c, sh.h, sh.w);
    const double u = ulp_rel(dt);
    const int composed = dt == RT_F32 || composed16;
    struct hcase h;
    hcase_make(&h, sh, b, dt == RT_F32 ? NULL : fast->o, stream);
    struct dcase df, dr, dc;
    dcase_init(fast, &h, &df);
    dcase_init(ref, &h, &dr);
    if (cpu)
        dcase_init(cpu, &h, &dc);
    struct hout of, orf, oc, o2;
    hout_init(&of, h.n, h.c);
    hout_init(&orf, h.n, h.c);
    hout_init(&oc, h.n, h.c);
    hout_init(&o2, h.n, h.c);
    char what[96];

    /* training forward; the reference's saved statistics become backward's inputs */
    for (int relu = 0; relu < 2; relu++) {
        do_train_fwd(fast, &h, &df, relu, 0, &of);
        if (!relu || composed) {
            do_train_fwd(ref, &h, &dr, 0, relu, &orf);
            snprintf(what, sizeof(what), "bn_train_fwd%s vs reference%s", relu ? "+relu" : "", relu ? "+relu_fwd" : "");
            compare(what, dn, shape, orf.y, of.y, h.n, 0, u);
            if (!relu) {
                compare("bn_train_fwd save_mean vs reference", dn, shape, orf.sm, of.sm, h.c, 0, 0.0);
                compare("bn_train_fwd save_invstd vs reference", dn, shape, orf.si, of.si, h.c, 0, 0.0);
                compare("bn_train_fwd running_mean vs reference", dn, shape, orf.rm, of.rm, h.c, 0, 0.0);
                compare("bn_train_fwd running_var vs reference", dn, shape, orf.rv, of.rv, h.c, 0, 0.0);
                memcpy(h.sm, orf.sm, h.c * sizeof(float));
                memcpy(h.si, orf.si, h.c * sizeof(float));
            }
        }
        if (cpu) {
            do_train_fwd(cpu, &h, &dc, relu, 0, &oc);
            snprintf(what, sizeof(what), "bn_train_fwd%s vs cpu", relu ? "+relu" : "");
            compare(what, dn, shape, oc.y, of.y, h.n, 0, u);
            if (!relu) {
                compare("bn_train_fwd save_mean vs cpu", dn, shape, oc.sm, of.sm, h.c, 0, 0.0);
                compare("bn_train_fwd save_invstd vs cpu", dn, shape, oc.si, of.si, h.c, 0, 0.0);
                compare("bn_train_fwd running_mean vs cpu", dn, shape, oc.rm, of.rm, h.c, 0, 0.0);
                compare("bn_train_fwd running_var vs cpu", dn, shape, oc.rv, of.rv, h.c, 0, 0.0);
            }
        }
        do_train_fwd(fast, &h, &df, relu, 0, &o2);
        snprintf(what, sizeof(what), "bn_train_fwd%s y, stats", relu ? "+relu" : "");
        same_bits(what, dn, shape, of.y, o2.y, h.n);
        same_bits(what, dn, shape, of.rv, o2.rv, h.c);
    }

    /* inference forward */
    for (int relu = 0; relu < 2; relu++) {
        do_infer_fwd(fast, &h, &df, relu, 0, &of);
        if (!relu || composed) {
            do_infer_fwd(ref, &h, &dr, 0, relu, &orf);
            snprintf(what, sizeof(what), "bn_infer_fwd%s vs reference%s", relu ? "+relu" : "", relu ? "+relu_fwd" : "");
            compare(what, dn, shape, orf.y, of.y, h.n, dt == RT_F32, u);
        }
        if (cpu) {
            do_infer_fwd(cpu, &h, &dc, relu, 0, &oc);
            snprintf(what, sizeof(what), "bn_infer_fwd%s vs cpu", relu ? "+relu" : "");
            compare(what, dn, shape, oc.y, of.y, h.n, 0, u);
        }
    }

    /* backward, from the reference forward's saved statistics */
    for (int relu = 0; relu < 2; relu++)
        for (int bd = 0; bd < 2; bd++) {
            do_bwd(fast, &h, &df, relu, 0, bd, 0, &of);
            const char *rl = relu ? "+relu" : "";
            if (!relu || composed) {
                do_bwd(ref, &h, &dr, 0, relu, bd, 0, &orf);
                const char *ru = relu ? " (relu_bwd then bn_bwd)" : "";
                snprintf(what, sizeof(what), "bn_bwd%s beta_dx=%d dx vs ref%s", rl, bd, ru);
                compare(what, dn, shape, orf.dx, of.dx, h.n, 0, u);
                snprintf(what, sizeof(what), "bn_bwd%s beta_dx=%d dgamma vs ref", rl, bd);
                compare(what, dn, shape, orf.dg, of.dg, h.c, 0, 0.0);
                snprintf(what, sizeof(what), "bn_bwd%s beta_dx=%d dbeta vs ref", rl, bd);
                compare(what, dn, shape, orf.db, of.db, h.c, 0, 0.0);
            }
            if (cpu) {
                do_bwd(cpu, &h, &dc, relu, 0, bd, 0, &oc);
                snprintf(what, sizeof(what), "bn_bwd%s beta_dx=%d dx vs cpu", rl, bd);
                compare(what, dn, shape, oc.dx, of.dx, h.n, 0, u);
                snprintf(what, sizeof(what), "bn_bwd%s beta_dx=%d dgamma vs cpu", rl, bd);
                compare(what, dn, shape, oc.dg, of.dg, h.c, 0, 0.0);
                snprintf(what, sizeof(what), "bn_bwd%s beta_dx=%d dbeta vs cpu", rl, bd);
                compare(what, dn, shape, oc.db, of.db, h.c, 0, 0.0);
            }
            do_bwd(fast, &h, &df, relu, 0, bd, 0, &o2);
            snprintf(what, sizeof(what), "bn_bwd%s beta_dx=%d dx, dgamma", rl, bd);
            same_bits(what, dn, shape, of.dx, o2.dx, h.n);
            same_bits(what, dn, shape, of.dg, o2.dg, h.c);
            if (!bd && !stand_in) { /* the CPU's bn_bwd needs a dx */
                do_bwd(fast, &h, &df, relu, 0, bd, 1, &o2);
                snprintf(what, sizeof(what), "bn_bwd%s dx NULL: dgamma, dbeta as with dx", rl);
                same_bits(what, dn, shape, of.dg, o2.dg, h.c);
                same_bits(what, dn, shape, of.db, o2.db, h.c);
            }
        }

    /* inference backward */
    for (int relu = 0; relu < 2; relu++)
        for (int bd = 0; bd < 2; bd++) {
            do_infer_bwd(fast, &h, &df, relu, 0, bd, &of);
            const char *rl = relu ? "+relu" : "";
            if (!relu || composed) {
                do_infer_bwd(ref, &h, &dr, 0, relu, bd, &orf);
                snprintf(what, sizeof(what), "bn_infer_bwd%s beta_dx=%d vs ref%s", rl, bd, relu ? " (relu_bwd)" : "");
                compare(what, dn, shape, orf.dx, of.dx, h.n, dt == RT_F32, u);
            }
            if (cpu) {
                do_infer_bwd(cpu, &h, &dc, relu, 0, bd, &oc);
                snprintf(what, sizeof(what), "bn_infer_bwd%s beta_dx=%d vs cpu", rl, bd);
                compare(what, dn, shape, oc.dx, of.dx, h.n, 0, u);
            }
            do_infer_bwd(fast, &h, &df, relu, 0, bd, &o2);
            snprintf(what, sizeof(what), "bn_infer_bwd%s beta_dx=%d dx", rl, bd);
            same_bits(what, dn, shape, of.dx, o2.dx, h.n);
        }

    if (timing) {
        static const char *const ops[] = {"bn_train_fwd", "bn_bwd", "bn_infer_fwd", "bn_infer_bwd"};
        const size_t e = dt == RT_F32 ? 4 : 2;
        v_set(fast, h.sm, df.sm, h.c);
        v_set(fast, h.si, df.si, h.c);
        v_set(ref, h.sm, dr.sm, h.c);
        v_set(ref, h.si, dr.si, h.c);
        for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
            const double tf = time_op(fast, &h, &df, ops[i], 0), tr = time_op(ref, &h, &dr, ops[i], 0);
            const double tfr = time_op(fast, &h, &df, ops[i], 1);
            printf("  time %-14s %-4s %-20s fast %8.1f us (%6.0f GB/s by its byte count), +relu %8.1f us; reference "
                   "%8.1f us (x%.2f)\n",
                   ops[i], dn, shape, tf * 1e6, fast_bytes(ops[i], h.n, e, 0) / tf * 1e-9, tfr * 1e6, tr * 1e6,
                   tr / tf);
        }
    }

    hout_free(&of);
    hout_free(&orf);
    hout_free(&oc);
    hout_free(&o2);
    dcase_free(fast, &df);
    dcase_free(ref, &dr);
    if (cpu)
        dcase_free(cpu, &dc);
    hcase_free(&h);
}

int test_cuda_twins_bn_main(int argc, char **argv)
{
    stand_in = argc == 2 && !strcmp(argv[1], "--stand-in");
    quick = stand_in || (argc == 2 && !strcmp(argv[1], "--quick"));
    if (argc > 2 || (argc == 2 && !quick)) {
        fprintf(stderr, "usage: test_cuda_ops twins-bn [--stand-in | --quick]\n");
        return 1;
    }
    printf("test_cuda_twins_bn: seed %llu%s\n", (unsigned long long)SEED,
           stand_in ? "; stand-in: a CPU backend in the GPU's place" : "");
    struct rt_backend_opts o;
    memset(&o, 0, sizeof(o));
    o.kind = stand_in ? RT_BACKEND_CPU : RT_BACKEND_CUDA;
    if (rt_backend_create(&o, &gbe) < 0) {
        fprintf(stderr, "test_cuda_twins_bn: skip: no CUDA backend: %s\n", rt_errmsg());
        return stand_in ? 1 : 77;
    }
    memset(&o, 0, sizeof(o));
    o.kind = RT_BACKEND_CPU;
    if (rt_backend_create(&o, &cbe) < 0) {
        fprintf(stderr, "test_cuda_twins_bn: cpu backend: %s\n", rt_errmsg());
        rt_backend_destroy(gbe);
        return 1;
    }
    if (!stand_in && rt_backend_ops(gbe) == rt_backend_ops_reference(gbe, RT_F32)) {
        printf("test_cuda_twins_bn: skip: the backend's own tables are the reference ones "
               "(RINGTRAIN_CUDA_KERNELS=reference): nothing to compare\n");
        rt_backend_destroy(cbe);
        rt_backend_destroy(gbe);
        return 77;
    }
    gs = rt_backend_stream(gbe);
    cs = rt_backend_stream(cbe);
    g32 = rt_backend_ops(gbe);
    c32 = rt_backend_ops(cbe);
    printf("  %s\n  %s\n", rt_backend_describe(gbe), rt_backend_describe(cbe));
    printf("tolerance: |got - ref| <= %g + %g max|ref| (+ one rounding of the type for outputs: 2^-7 bf16, 2^-10 "
           "fp16, relative)\n",
           ATOL, RMAX);

    static const struct rt_shape4 odd[] = {
        {3, 5, 4, 4}, {2, 8, 1, 1}, {4, 24, 7, 7}, {1, 64, 3, 3}, {7, 13, 5, 3}, {16, 64, 8, 8},
        {5, 1, 3, 3}, {1, 4, 1, 1}, {2, 264, 3, 3}, {3, 70, 2, 3}, {64, 16, 16, 16}, {66, 1, 128, 128},
    };
    static const struct rt_shape4 resnet[] = {
        {512, 64, 32, 32}, {512, 128, 16, 16}, {512, 256, 8, 8}, {512, 512, 4, 4},
    };
    static const enum rt_dtype dts[] = {RT_F32, RT_BF16, RT_F16};
    struct side fast[3], ref[3], cpu[3];
    int have[3] = {0, 0, 0};
    for (size_t t = 0; t < 3; t++) {
        const enum rt_dtype dt = dts[t];
        const struct rt_ops *fo = rt_backend_ops_for(gbe, dt);
        const struct rt_ops *ro = stand_in ? fo : rt_backend_ops_reference(gbe, dt);
        if (!fo || !ro) {
            printf("%s: no table on this GPU (%s): skipped\n", rt_dtype_name(dt), rt_errmsg());
            continue;
        }
        have[t] = 1;
        printf("%s: fast table bn_relu %d, reference bn_relu %d\n", rt_dtype_name(dt), fo->bn_relu, ro->bn_relu);
        CHECKF(stand_in || (fo->bn_relu == 1 && ro->bn_relu == 0), "%s: bn_relu fast %d reference %d (want 1, 0)",
               rt_dtype_name(dt), fo->bn_relu, ro->bn_relu);
        const struct side f = {gbe, gs, fo, NULL}, r = {gbe, gs, ro, NULL};
        fast[t] = f;
        ref[t] = r;
        const struct rt_ops *cb = dt == RT_BF16 ? rt_backend_ops_for(cbe, RT_BF16) : NULL;
        const struct side c = {cbe, cs, cb ? cb : c32, dt == RT_F32 || cb ? NULL : fo};
        cpu[t] = c;
        if (dt != RT_F32)
            printf("%s: the cpu side is %s\n", rt_dtype_name(dt),
                   cb ? "its bf16 table" : "its fp32 ops, outputs rounded once by the GPU's conversion");
    }
    const size_t nodd = sizeof(odd) / sizeof(odd[0]), nres = sizeof(resnet) / sizeof(resnet[0]);
    for (size_t i = 0; i < nodd + (quick ? 0 : nres); i++) {
        const int big = i >= nodd;
        const struct rt_shape4 sh = big ? resnet[i - nodd] : odd[i];
        struct hbase b;
        hbase_make(&b, sh, i);
        for (size_t t = 0; t < 3; t++)
            if (have[t])
                run_case(sh, &b, dts[t], &fast[t], &ref[t], big ? NULL : &cpu[t], !big, big, 1000 + 10 * i + t);
        hbase_free(&b);
    }
    rt_backend_destroy(cbe);
    rt_backend_destroy(gbe);
    fflush(stdout);
    return check_result();
}
