/*
 * test_cuda_bodies_bn.cu - the fast batchnorm kernels' bodies (compute/cuda/fast_bn.cuh) run on the CPU against
 * the CPU backend: no GPU needed (DESIGN.md, "GPU code written without a GPU").
 *
 * For each op the test does on the host what fast_bn.cu launches: every thread of every block of the statistics
 * grid through its body, the block's combining replayed in the device's order (fk_tree_sum_replay for the
 * NCHW blocks and the finalize, bn_rows_tree_replay for the NHWC row lanes), the finalize's scalars per channel,
 * and every thread of the element-wise grid -- in fp32 NCHW and in bf16 and fp16 NHWC, over odd shapes (C not a
 * multiple of 8, H*W not a multiple of 4, 1x1 planes, C = 1, one value per channel, several channel tiles, more
 * splits than a finalize block has threads), with the fused ReLU off and on, beta_dx 0 and 1, once with
 * 16-byte aligned buffers and once one element off (the scalar path, which must give the same bits). The
 * reference is the CPU backend: its fp32 ops, its bf16 table where this CPU has one (else the fp32 ops on the
 * widened values, outputs rounded once), fp32 ops rounded once for fp16.
 *
 * Two kinds of data. Normal: per-channel means and spreads that differ (a wrong channel index shows) and one
 * channel of mean -20, sd 0.5 (a cancelling variance formula shows); statistics within the reduction tolerance
 * of tests/test_cuda_ops.c (1e-5 + 1e-5 max|cpu|, the order of the sums differs), outputs within that plus one
 * rounding of the type; inference ops, whose scalars need no sum, bit for bit; and the affine body fed the CPU's
 * own mean and scale gives the CPU's y bit for bit. Dyadic: small multiples of 1/8 and 1/16, whose every sum is
 * exact in any order, so every result -- statistics, running statistics, parameter gradients, y, dx -- must be
 * the CPU's bit for bit. Outputs start as NaN (an element not written fails), dx as NaN where beta_dx is 0 (one
 * read fails). Planted faults (a dropped tail unit, a statistics split cut short, coefficients of the next
 * channel) must be caught by the same comparisons. The ReLU threshold of each type is checked against its
 * rounding.
 *
 * One line per comparison; exit 0 pass, 1 fail (77 never: the CPU backend is always there). Seed fixed, printed.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <type_traits>
#include <vector>

#include "check.h"
#include "common/common.h"
#include "compute/compute.h"
#include "compute/cuda/fast_bn.cuh"

#define SEED UINT64_C(20250311)

static struct rt_backend *be;
static const struct rt_ops *o32, *o16; /* o16: the CPU's bf16 table, or NULL */
static struct rt_stream *st;

/* A fault planted in the simulated launches, to show that the comparisons catch it. */
enum plant { PLANT_NONE, PLANT_EW_TAIL, PLANT_STATS_TAIL, PLANT_CHANNEL };
static enum plant plant;
static int quiet; /* planted runs: count, do not print */

/* ---- types and layouts ------------------------------------------------------------------------------------ */

template <typename T> static const char *tname();
template <> const char *tname<float>()
{
    return "fp32";
}
template <> const char *tname<__nv_bfloat16>()
{
    return "bf16";
}
template <> const char *tname<__half>()
{
    return "fp16";
}

/* v rounded to T and widened back. */
template <typename T> static float rnd(float v)
{
    return fk_ld(fk_st<T>(v));
}

/* One ulp of T relative to the value, at most: a rounding that tips the other way. */
template <typename T> static double ulp_rel();
template <> double ulp_rel<float>()
{
    return 0.0;
}
template <> double ulp_rel<__nv_bfloat16>()
{
    return 0x1p-7;
}
template <> double ulp_rel<__half>()
{
    return 0x1p-10;
}

template <typename T> static constexpr int is_nhwc()
{
    return sizeof(T) == 2;
}

static size_t count4(struct rt_shape4 sh)
{
    return (size_t)sh.n * sh.c * sh.h * sh.w;
}

/* Index of logical element i (NCHW order) in T's layout. */
template <typename T> static size_t lay_of(struct rt_shape4 sh, size_t i)
{
    if (!is_nhwc<T>())
        return i;
    const size_t hw = (size_t)sh.h * sh.w, p = i % hw, c = i / hw % sh.c, n = i / hw / sh.c;
    return (n * hw + p) * sh.c + c;
}

/* sh's NCHW values `nchw` in T's layout, in host memory at a 16-byte boundary or one element past it (misaligned:
 * the kernels' scalar path). */
template <typename T> struct hbuf {
    std::vector<unsigned char> mem;
    T *p;
    hbuf(struct rt_shape4 sh, const std::vector<float> &nchw, int misalign) : mem((count4(sh) + 16) * sizeof(T) + 16)
    {
        uintptr_t a = ((uintptr_t)mem.data() + 15) & ~(uintptr_t)15;
        p = (T *)a + (misalign ? 1 : 0);
        for (size_t i = 0; i < count4(sh); i++)
            p[lay_of<T>(sh, i)] = fk_st<T>(nchw[i]);
    }
    /* The values back in NCHW order into nchw (resized to count4(sh)). */
    void get(struct rt_shape4 sh, std::vector<float> &nchw) const
    {
        nchw.resize(count4(sh));
        for (size_t i = 0; i < nchw.size(); i++)
            nchw[i] = fk_ld(p[lay_of<T>(sh, i)]);
    }
};

/* count4(sh) NaNs: an output's start, so that an element left unwritten shows. */
static std::vector<float> nans(struct rt_shape4 sh)
{
    return std::vector<float>(count4(sh), NAN);
}

template <typename T> static bn_geo geo_of(struct rt_shape4 sh)
{
    const uint32_t hw = (uint32_t)(sh.h * sh.w);
    return is_nhwc<T>() ? bn_geo_nhwc<T>((uint32_t)sh.n * hw, (uint32_t)sh.c)
                        : bn_geo_nchw((uint32_t)sh.n, (uint32_t)sh.c, hw);
}

/* ---- the launches, simulated: every block, every thread, the device's combining order ---------------------- */

/* A planted fault: the grid ends one unit (NCHW) or row (NHWC) short of each channel's end. */
template <typename T> static void drop_tail(bn_geo &g)
{
    if (is_nhwc<T>())
        g.m--;
    else
        g.units--;
}

template <typename T, int BWD>
static void sim_stats(bn_geo g, const T *x, const T *dy, const float *sm, const float *si, const float *gamma,
                      const float *beta, int relu, double *part)
{
    const int vec = g.vec_ok && fk_aligned(x) && fk_aligned(dy);
    if (plant == PLANT_STATS_TAIL) /* the last unit or row of each channel never summed */
        drop_tail<T>(g);
    if constexpr (is_nhwc<T>()) {
        const int V = FK_VEC(T);
        std::vector<double> sh(2 * V * FK_THREADS);
        for (uint32_t tile = 0; tile < g.tiles; tile++)
            for (uint32_t s = 0; s < g.splits; s++) {
                for (uint32_t t = 0; t < FK_THREADS; t++) {
                    const uint32_t grp = tile * g.gb + (t & (g.gb - 1));
                    bn_sum_k k[FK_VEC(T)];
                    bn_nhwc_sum_k<T, BWD>(g, x, sm, si, gamma, beta, grp, relu, k);
                    double a[FK_VEC(T)], b[FK_VEC(T)];
                    bn_nhwc_stats_thread<T, BWD>(g, x, dy, vec, tile, s, t, k, relu, a, b);
                    for (int e = 0; e < V; e++) {
                        sh[(0 * V + e) * FK_THREADS + t] = a[e];
                        sh[(1 * V + e) * FK_THREADS + t] = b[e];
                    }
                }
                for (int q = 0; q < 2; q++)
                    for (int e = 0; e < V; e++)
                        bn_rows_tree_replay(&sh[(q * V + e) * FK_THREADS], g.rl, g.gb);
                for (uint32_t gl = 0; gl < g.gb; gl++) {
                    const uint32_t grp = tile * g.gb + gl;
                    for (int e = 0; e < V && grp < g.units && grp * V + (uint32_t)e < g.c; e++)
                        for (uint32_t q = 0; q < 2; q++)
                            part[bn_part_at(g, q, grp * V + e, s)] = sh[(q * V + e) * FK_THREADS + gl];
                }
            }
    } else {
        double a[FK_THREADS], b[FK_THREADS];
        for (uint32_t c = 0; c < g.c; c++)
            for (uint32_t s = 0; s < g.splits; s++) {
                const bn_sum_k k = bn_nchw_sum_k<BWD>(g, (const float *)x, sm, si, gamma, beta, c, relu);
                for (uint32_t t = 0; t < FK_THREADS; t++)
                    bn_nchw_stats_thread<BWD>(g, (const float *)x, (const float *)dy, vec, c, s, t, k, relu, a[t],
                                              b[t]);
                part[bn_part_at(g, 0, c, s)] = fk_tree_sum_replay(a);
                part[bn_part_at(g, 1, c, s)] = fk_tree_sum_replay(b);
            }
    }
}

/* The finalize's channel sums: the threads' shares, then block_tree_sum's order. */
static void sim_final_sums(const bn_geo &g, const double *part, uint32_t c, double *s1, double *s2)
{
    double a[FK_THREADS], b[FK_THREADS];
    for (uint32_t t = 0; t < FK_THREADS; t++)
        bn_final_thread(g, part, c, t, a[t], b[t]);
    *s1 = fk_tree_sum_replay(a);
    *s2 = fk_tree_sum_replay(b);
}

template <typename T>
static void sim_affine(bn_geo g, const T *x, T *y, const float *mean, const float *a, const float *b, int relu)
{
    const int vec = g.vec_ok && fk_aligned(x) && fk_aligned(y);
    if (plant == PLANT_EW_TAIL)
        drop_tail<T>(g);
    std::vector<float> rot_m, rot_a, rot_b;
    if (plant == PLANT_CHANNEL) { /* each channel given its neighbour's coefficients */
        for (uint32_t c = 0; c < g.c; c++) {
            rot_m.push_back(mean[(c + 1) % g.c]);
            rot_a.push_back(a[(c + 1) % g.c]);
            rot_b.push_back(b[(c + 1) % g.c]);
        }
        mean = rot_m.data();
        a = rot_a.data();
        b = rot_b.data();
    }
    const uint32_t blocks = g.eblocks * (is_nhwc<T>() ? g.tiles : g.c);
    for (uint32_t blk = 0; blk < blocks; blk++)
        for (uint32_t t = 0; t < FK_THREADS; t++) {
            if constexpr (is_nhwc<T>())
                bn_nhwc_affine_thread<T>(g, x, y, vec, mean, a, b, relu, blk, t);
            else
                bn_nchw_affine_thread(g, (const float *)x, (float *)y, vec, mean, a, b, relu, blk, t);
        }
}

template <typename T>
static void sim_dx(bn_geo g, const T *x, const T *dy, T *dx, const bn_dx_arrays &p, int relu, float beta_dx)
{
    const int vec = g.vec_ok && fk_aligned(x) && fk_aligned(dy) && fk_aligned(dx);
    if (plant == PLANT_EW_TAIL)
        drop_tail<T>(g);
    const uint32_t blocks = g.eblocks * (is_nhwc<T>() ? g.tiles : g.c);
    for (uint32_t blk = 0; blk < blocks; blk++)
        for (uint32_t t = 0; t < FK_THREADS; t++) {
            if constexpr (is_nhwc<T>())
                bn_nhwc_dx_thread<T>(g, x, dy, dx, vec, p, relu, beta_dx, blk, t);
            else
                bn_nchw_dx_thread(g, (const float *)x, (const float *)dy, (float *)dx, vec, p, relu, beta_dx, blk, t);
        }
}

/* ---- the four ops as fast_bn.cu sequences them, on host NCHW floats in and out ----------------------------- */

/* The tensors of one call. Spatial ones host NCHW (values exact in T); per-channel ones C floats. */
struct bn_io {
    struct rt_shape4 sh;
    int relu;
    float beta_dx;
    std::vector<float> x, dy, y, dx;                    /* y, dx: out (dx also in when beta_dx != 0) */
    std::vector<float> gamma, beta, rm, rv, sm, si, dg, db; /* rm, rv, dg, db: in and out */
};

static struct rt_bn_desc desc_of(const bn_io &io)
{
    struct rt_bn_desc d;
    memset(&d, 0, sizeof(d));
    d.in = io.sh;
    d.eps = 1e-5f;
    d.momentum = 0.1f;
    d.relu = io.relu;
    return d;
}

/* Each op on io through the bodies; misalign: buffers one element off 16 bytes. */
template <typename T> struct fast_side {
    static void train_fwd(bn_io &io, int misalign)
    {
        const bn_geo g = geo_of<T>(io.sh);
        const hbuf<T> x(io.sh, io.x, misalign);
        std::vector<double> part(2 * (size_t)g.c * g.splits, NAN);
        sim_stats<T, 0>(g, x.p, NULL, NULL, NULL, NULL, NULL, 0, part.data());
        bn_fwd_q q;
        const struct rt_bn_desc d = desc_of(io);
        q.m = (double)g.m;
        q.eps = rt_decimal_double(d.eps);
        q.mom = rt_decimal_double(d.momentum);
        q.keep = 1.0 - q.mom;
        q.unbias = g.m > 1 ? (double)g.m / (double)(g.m - 1) : 1.0;
        std::vector<float> a(g.c);
        io.sm.assign(g.c, NAN);
        io.si.assign(g.c, NAN);
        for (uint32_t c = 0; c < g.c; c++) {
            double s1, s2;
            sim_final_sums(g, part.data(), c, &s1, &s2);
            bn_fwd_scalars(s1, s2, (double)fk_ld(x.p[c * (is_nhwc<T>() ? 1 : g.hw)]), q, io.gamma[c], &io.rm[c],
                           &io.rv[c], &io.sm[c], &io.si[c], &a[c]);
        }
        affine(io, io.sm.data(), a.data(), misalign);
    }

    static void infer_fwd(bn_io &io, int misalign)
    {
        const double eps = rt_decimal_double(desc_of(io).eps);
        std::vector<float> a(io.sh.c);
        for (int c = 0; c < io.sh.c; c++)
            a[c] = bn_infer_scale(io.rv[c], eps, io.gamma[c]);
        affine(io, io.rm.data(), a.data(), misalign);
    }

    /* The affine pass alone with given coefficients (also the CPU's): y = bn_affine1(x; mean, a, beta). */
    static void affine(bn_io &io, const float *mean, const float *a, int misalign)
    {
        const hbuf<T> x(io.sh, io.x, misalign);
        hbuf<T> y(io.sh, nans(io.sh), misalign);
        sim_affine<T>(geo_of<T>(io.sh), x.p, y.p, mean, a, io.beta.data(), io.relu);
        y.get(io.sh, io.y);
    }

    static void bwd(bn_io &io, int misalign)
    {
        const bn_geo g = geo_of<T>(io.sh);
        const hbuf<T> x(io.sh, io.x, misalign), dy(io.sh, io.dy, misalign);
        std::vector<double> part(2 * (size_t)g.c * g.splits, NAN);
        sim_stats<T, 1>(g, x.p, dy.p, io.sm.data(), io.si.data(), io.gamma.data(), io.beta.data(), io.relu,
                        part.data());
        std::vector<float> gm(g.c), pj(g.c), sc(g.c), ra(g.c);
        for (uint32_t c = 0; c < g.c; c++) {
            double s1, s2;
            sim_final_sums(g, part.data(), c, &s1, &s2);
            bn_bwd_scalars(s1, s2, (double)g.m, io.si[c], io.gamma[c], &io.dg[c], &io.db[c], &gm[c], &pj[c], &sc[c]);
            ra[c] = fk_mul(io.si[c], io.gamma[c]);
        }
        bn_dx_arrays p;
        p.mu = io.sm.data();
        p.gm = gm.data();
        p.pj = pj.data();
        p.sc = sc.data();
        p.ra = ra.data();
        p.rb = io.beta.data();
        dx_pass(io, p, misalign);
    }

    static void infer_bwd(bn_io &io, int misalign)
    {
        const double eps = rt_decimal_double(desc_of(io).eps);
        std::vector<float> a(io.sh.c), zero(io.sh.c, 0.0f);
        for (int c = 0; c < io.sh.c; c++)
            a[c] = bn_infer_scale(io.rv[c], eps, io.gamma[c]);
        bn_dx_arrays p;
        p.mu = io.rm.data();
        p.gm = zero.data();
        p.pj = zero.data();
        p.sc = a.data();
        p.ra = a.data();
        p.rb = io.beta.data();
        dx_pass(io, p, misalign);
    }

    /* The backward's element-wise pass with arrays p: io.dx (read where beta_dx != 0) rewritten. */
    static void dx_pass(bn_io &io, const bn_dx_arrays &p, int misalign)
    {
        const hbuf<T> x(io.sh, io.x, misalign), dy(io.sh, io.dy, misalign);
        hbuf<T> dx(io.sh, io.dx, misalign);
        sim_dx<T>(geo_of<T>(io.sh), x.p, dy.p, dx.p, p, io.relu, io.beta_dx);
        dx.get(io.sh, io.dx);
    }
};

/* ---- the CPU backend's ops on the same tensors --------------------------------------------------------------- */

static float *cpu_alloc(size_t bytes)
{
    void *p = o32->alloc(be, bytes ? bytes : 4);
    if (!p) {
        fprintf(stderr, "test_cuda_bodies_bn: cpu alloc of %zu bytes: %s\n", bytes, rt_errmsg());
        exit(1);
    }
    return (float *)p;
}

template <typename T> struct cpu_side {
    /* One call's tensors on the CPU backend, freed with it; o the table that runs T: the bf16 one where it exists
     * (native: its own rounding), else fp32 then rounded. */
    struct dev {
        const int native = std::is_same<T, __nv_bfloat16>::value && o16;
        const struct rt_ops *const o = native ? o16 : o32;
        std::vector<float *> bufs;
        float *sp(struct rt_shape4 sh, const std::vector<float> &host)
        {
            float *d = cpu_alloc(count4(sh) * sizeof(float));
            o->from_nchw(st, sh, host.data(), d);
            bufs.push_back(d);
            return d;
        }
        float *vec(const std::vector<float> &host)
        {
            float *d = cpu_alloc(host.size() * sizeof(float));
            o32->upload(st, d, host.data(), host.size() * sizeof(float));
            bufs.push_back(d);
            return d;
        }
        void get_sp(struct rt_shape4 sh, const float *d, std::vector<float> &host)
        {
            host.resize(count4(sh));
            o->to_nchw(st, sh, d, host.data());
            o->sync(st);
            if (!native)
                for (float &v : host)
                    v = rnd<T>(v);
        }
        void get(const float *d, std::vector<float> &host)
        {
            o32->download(st, host.data(), d, host.size() * sizeof(float));
            o32->sync(st);
        }
        ~dev()
        {
            for (float *p : bufs)
                o32->free(be, p);
        }
    };

    static void train_fwd(bn_io &io)
    {
        dev d;
        const struct rt_bn_desc de = desc_of(io);
        const std::vector<float> cn(io.sh.c, NAN);
        float *x = d.sp(io.sh, io.x), *y = d.sp(io.sh, nans(io.sh)), *g = d.vec(io.gamma), *b = d.vec(io.beta);
        float *rm = d.vec(io.rm), *rv = d.vec(io.rv), *sm = d.vec(cn), *si = d.vec(cn);
        d.o->bn_train_fwd(st, &de, x, g, b, rm, rv, sm, si, y);
        d.get_sp(io.sh, y, io.y);
        d.get(rm, io.rm);
        d.get(rv, io.rv);
        d.get(sm, io.sm);
        d.get(si, io.si);
    }

    static void infer_fwd(bn_io &io)
    {
        dev d;
        const struct rt_bn_desc de = desc_of(io);
        float *x = d.sp(io.sh, io.x), *y = d.sp(io.sh, nans(io.sh));
        d.o->bn_infer_fwd(st, &de, x, d.vec(io.gamma), d.vec(io.beta), d.vec(io.rm), d.vec(io.rv), y);
        d.get_sp(io.sh, y, io.y);
    }

    static void bwd(bn_io &io)
    {
        dev d;
        const struct rt_bn_desc de = desc_of(io);
        float *x = d.sp(io.sh, io.x), *dy = d.sp(io.sh, io.dy), *dx = d.sp(io.sh, io.dx);
        float *dg = d.vec(io.dg), *db = d.vec(io.db);
        d.o->bn_bwd(st, &de, x, dy, d.vec(io.gamma), d.vec(io.beta), d.vec(io.sm), d.vec(io.si), io.beta_dx, dx, dg,
                    db);
        d.get_sp(io.sh, dx, io.dx);
        d.get(dg, io.dg);
        d.get(db, io.db);
    }

    static void infer_bwd(bn_io &io)
    {
        dev d;
        const struct rt_bn_desc de = desc_of(io);
        float *x = d.sp(io.sh, io.x), *dy = d.sp(io.sh, io.dy), *dx = d.sp(io.sh, io.dx);
        d.o->bn_infer_bwd(st, &de, x, dy, d.vec(io.gamma), d.vec(io.beta), d.vec(io.rm), d.vec(io.rv), io.beta_dx,
                          dx);
        d.get_sp(io.sh, dx, io.dx);
    }
};

/* ---- comparison --------------------------------------------------------------------------------------------- */

/*
 * exact: got == ref as values (two NaNs agree; so do two values below FLT_MIN in magnitude, as the CPU's bf16
 * stores flush them); otherwise |got - ref| <= atol + rmax max|ref| + urel |ref_i| (NaN or Inf must match).
 * Prints one line (unless quiet) and returns the count outside.
 */
static size_t compare(const char *op, const char *dt, const char *shape, const std::vector<float> &ref,
                      const std::vector<float> &got, int exact, double atol, double rmax, double urel)
{
    const size_t n = ref.size();
    double mx = 0.0;
    for (float v : ref)
        if (isfinite(v) && fabs((double)v) > mx)
            mx = fabs((double)v);
    size_t bad = 0, diff_bits = 0, first = n;
    double worst = 0.0, worst_tol = 0.0;
    for (size_t i = 0; i < n; i++) {
        const float r = ref[i], g = i < got.size() ? got[i] : NAN;
        if (memcmp(&r, &g, sizeof(r)))
            diff_bits++;
        int ok;
        double err = 0.0, tol = 0.0;
        if (isnan(r) || isnan(g))
            ok = isnan(r) && isnan(g);
        else if (exact)
            ok = r == g || (fabsf(r) < FLT_MIN && fabsf(g) < FLT_MIN);
        else if (!isfinite(r) || !isfinite(g))
            ok = r == g;
        else {
            err = fabs((double)g - (double)r);
            tol = atol + rmax * mx + urel * fabs((double)r);
            ok = err <= tol;
        }
        /* the element nearest its bound (the first, when every error is 0) */
        if (!exact && isfinite(err) && (i == 0 || err * worst_tol > worst * tol)) {
            worst = err;
            worst_tol = tol;
        }
        if (!ok && bad++ == 0)
            first = i;
    }
    if (!quiet) {
        if (exact)
            printf("  %-30s %-4s %-30s exact: %zu of %zu bits differ%s  %s\n", op, dt, shape, diff_bits, n,
                   diff_bits && !bad ? " (zeros' signs or flushed denormals only)" : "", bad ? "FAIL" : "ok");
        else
            printf("  %-30s %-4s %-30s err %-9.3g of tol %-9.3g bits differ %zu/%zu  %s\n", op, dt, shape, worst,
                   worst_tol, diff_bits, n, bad ? "FAIL" : "ok");
        if (bad)
            printf("    %zu values off, first [%zu]: cpu %.9g, bodies %.9g\n", bad, first, (double)ref[first],
                   first < got.size() ? (double)got[first] : NAN);
        CHECKF(bad == 0, "%s %s %s: %zu of %zu values off", op, dt, shape, bad, n);
    }
    return bad;
}

static int bits_equal(const std::vector<float> &a, const std::vector<float> &b)
{
    return a.size() == b.size() && !memcmp(a.data(), b.data(), a.size() * sizeof(float));
}

/* ---- data ---------------------------------------------------------------------------------------------------- */

enum data_kind { DATA_NORMAL, DATA_DYADIC };

/* The inputs of a case, rounded to T where they are activations. */
template <typename T> static bn_io make_io(struct rt_shape4 sh, enum data_kind dk, struct rt_rng *r)
{
    static const float mu[] = {0.0f, 5.0f, -20.0f, 1.5f}, sd[] = {1.0f, 3.0f, 0.5f, 2.0f};
    bn_io io;
    io.sh = sh;
    io.relu = 0;
    io.beta_dx = 0.0f;
    const size_t n = count4(sh), hw = (size_t)sh.h * sh.w, C = (size_t)sh.c;
    io.x.resize(n);
    io.dy.resize(n);
    io.dx.assign(n, NAN);
    for (size_t i = 0; i < n; i++) {
        const size_t c = i / hw % C;
        if (dk == DATA_DYADIC) {
            io.x[i] = (float)((int)(c % 5) - 2) + (float)((int)rt_rng_below(r, 65) - 32) / 8.0f;
            io.dy[i] = (float)((int)rt_rng_below(r, 65) - 32) / 16.0f;
        } else {
            io.x[i] = rnd<T>(mu[c % 4] + sd[c % 4] * rt_rng_normal(r));
            io.dy[i] = rnd<T>(rt_rng_normal(r));
        }
    }
    io.gamma.resize(C);
    io.beta.resize(C);
    io.rm.resize(C);
    io.rv.resize(C);
    io.sm.resize(C);
    io.si.resize(C);
    io.dg.resize(C);
    io.db.resize(C);
    for (size_t c = 0; c < C; c++) {
        io.gamma[c] = 0.5f + rt_rng_uniform(r);
        io.beta[c] = -0.5f + rt_rng_uniform(r);
        io.rm[c] = -1.0f + 2.0f * rt_rng_uniform(r);
        io.rv[c] = 0.5f + 1.5f * rt_rng_uniform(r);
        /* backward's saved statistics: dyadic, so that sums of dy (x - mean) stay exact */
        io.sm[c] = dk == DATA_DYADIC ? (float)((int)(c % 5) - 2) + (float)((int)rt_rng_below(r, 9) - 4) / 8.0f
                                     : mu[c % 4] + 0.1f * rt_rng_normal(r);
        io.si[c] = 1.0f / (sd[c % 4] * (0.8f + 0.4f * rt_rng_uniform(r)));
        io.dg[c] = -1.0f + 2.0f * rt_rng_uniform(r);
        io.db[c] = -1.0f + 2.0f * rt_rng_uniform(r);
    }
    return io;
}

/* ---- one case ------------------------------------------------------------------------------------------------- */

#define T_ATOL 1e-5
#define T_RMAX 1e-5

/* Statistics: exact for dyadic data, the reduction tolerance otherwise. */
static void cmp_stat(const char *op, const char *dt, const char *shape, const std::vector<float> &ref,
                     const std::vector<float> &got, int exact)
{
    compare(op, dt, shape, ref, got, exact, T_ATOL, T_RMAX, 0.0);
}

template <typename T> static void cmp_out(const char *op, const char *shape, const std::vector<float> &ref,
                                          const std::vector<float> &got, int exact)
{
    compare(op, tname<T>(), shape, ref, got, exact, T_ATOL, T_RMAX, ulp_rel<T>());
}

/* The same op through the scalar path (buffers one element off 16 bytes) gives the same bits. */
typedef std::vector<const std::vector<float> *> outs;

static void same_bits(const char *op, const char *dt, const char *shape, const outs &a, const outs &b)
{
    int same = 1;
    for (size_t i = 0; i < a.size(); i++)
        same &= bits_equal(*a[i], *b[i]);
    printf("  %-30s %-4s %-30s misaligned (scalar path) = aligned, bit for bit  %s\n", op, dt, shape,
           same ? "ok" : "FAIL");
    CHECKF(same, "%s %s %s: the scalar path's bits differ from the vector path's", op, dt, shape);
}

template <typename T> static void run_case(struct rt_shape4 sh, enum data_kind dk, uint64_t stream)
{
    const char *dt = tname<T>();
    const int exact = dk == DATA_DYADIC;
    char shape[80];
    const bn_geo g = geo_of<T>(sh);
    snprintf(shape, sizeof(shape), "(%d,%d,%d,%d)%s", sh.n, sh.c, sh.h, sh.w, exact ? " dyadic" : "");
    if (is_nhwc<T>())
        printf("%s %s: %u tiles of %u channel groups x %u row lanes; statistics %u splits of %u rows; element-wise "
               "%u blocks a tile%s\n",
               dt, shape, g.tiles, g.gb, g.rl, g.splits, g.chunk, g.eblocks, g.vec_ok ? "" : "; scalar units (C % 8)");
    else
        printf("%s %s: statistics %u splits of %u units a channel; element-wise %u blocks a channel%s\n", dt, shape,
               g.splits, g.chunk, g.eblocks, g.vec_ok ? "" : "; scalar units (H*W % 4)");
    struct rt_rng r;
    rt_rng_init(&r, SEED, stream);
    const bn_io base = make_io<T>(sh, dk, &r);
    /* dx's old values for beta_dx 1 (beta_dx 0 gets NaN: it must not read them) */
    std::vector<float> old(base.x.size());
    for (float &v : old)
        v = dk == DATA_DYADIC ? (float)((int)rt_rng_below(&r, 17) - 8) / 4.0f
                              : rnd<T>(-1.0f + 2.0f * rt_rng_uniform(&r));
    char op[64];

    for (int relu = 0; relu < 2; relu++) {
        bn_io fin = base; /* the forward ops' inputs */
        fin.relu = relu;

        /* training forward */
        bn_io ref = fin, got = fin, mis = fin;
        cpu_side<T>::train_fwd(ref);
        fast_side<T>::train_fwd(got, 0);
        fast_side<T>::train_fwd(mis, 1);
        snprintf(op, sizeof(op), "bn_train_fwd%s", relu ? "+relu" : "");
        cmp_stat((std::string(op) + " save_mean").c_str(), dt, shape, ref.sm, got.sm, exact);
        cmp_stat((std::string(op) + " save_invstd").c_str(), dt, shape, ref.si, got.si, exact);
        cmp_stat((std::string(op) + " running_mean").c_str(), dt, shape, ref.rm, got.rm, exact);
        cmp_stat((std::string(op) + " running_var").c_str(), dt, shape, ref.rv, got.rv, exact);
        cmp_out<T>((std::string(op) + " y").c_str(), shape, ref.y, got.y, exact);
        same_bits(op, dt, shape, {&got.y, &got.sm, &got.si, &got.rm, &got.rv},
                  {&mis.y, &mis.sm, &mis.si, &mis.rm, &mis.rv});
        /* the affine body with the CPU's own coefficients: the CPU's y, bit for bit */
        std::vector<float> a(sh.c);
        for (int c = 0; c < sh.c; c++)
            a[c] = fk_mul(ref.si[c], ref.gamma[c]);
        bn_io aff = fin;
        fast_side<T>::affine(aff, ref.sm.data(), a.data(), 0);
        cmp_out<T>((std::string(op) + " y, cpu's mean & scale").c_str(), shape, ref.y, aff.y, 1);

        /* inference forward: no sums, so bit for bit */
        bn_io iref = fin, igot = fin, imis = fin;
        cpu_side<T>::infer_fwd(iref);
        fast_side<T>::infer_fwd(igot, 0);
        fast_side<T>::infer_fwd(imis, 1);
        snprintf(op, sizeof(op), "bn_infer_fwd%s y", relu ? "+relu" : "");
        cmp_out<T>(op, shape, iref.y, igot.y, 1);
        same_bits(op, dt, shape, {&igot.y}, {&imis.y});

        for (int bd = 0; bd < 2; bd++) {
            bn_io bin = base; /* the backward ops' inputs */
            bin.relu = relu;
            bin.beta_dx = (float)bd;
            if (bd)
                bin.dx = old;

            /* training backward from the saved statistics of the case (the same on both sides) */
            bn_io bref = bin, bgot = bin, bmis = bin;
            cpu_side<T>::bwd(bref);
            fast_side<T>::bwd(bgot, 0);
            fast_side<T>::bwd(bmis, 1);
            snprintf(op, sizeof(op), "bn_bwd%s beta_dx=%d", relu ? "+relu" : "", bd);
            cmp_stat((std::string(op) + " dgamma").c_str(), dt, shape, bref.dg, bgot.dg, exact);
            cmp_stat((std::string(op) + " dbeta").c_str(), dt, shape, bref.db, bgot.db, exact);
            cmp_out<T>((std::string(op) + " dx").c_str(), shape, bref.dx, bgot.dx, exact);
            same_bits(op, dt, shape, {&bgot.dx, &bgot.dg, &bgot.db}, {&bmis.dx, &bmis.dg, &bmis.db});

            /* inference backward: bit for bit */
            bn_io jref = bin, jgot = bin, jmis = bin;
            cpu_side<T>::infer_bwd(jref);
            fast_side<T>::infer_bwd(jgot, 0);
            fast_side<T>::infer_bwd(jmis, 1);
            snprintf(op, sizeof(op), "bn_infer_bwd%s beta_dx=%d dx", relu ? "+relu" : "", bd);
            cmp_out<T>(op, shape, jref.dx, jgot.dx, 1);
            same_bits(op, dt, shape, {&jgot.dx}, {&jmis.dx});
        }
    }
}

/* ---- planted faults ----------------------------------------------------------------------------------------- */

template <typename T> static void planted(struct rt_shape4 sh)
{
    static const struct {
        enum plant p;
        const char *what;
    } faults[] = {
        {PLANT_EW_TAIL, "element-wise pass drops each channel's last unit"},
        {PLANT_STATS_TAIL, "statistics drop each channel's last unit"},
        {PLANT_CHANNEL, "affine pass reads the next channel's coefficients"},
    };
    struct rt_rng r;
    rt_rng_init(&r, SEED, 999);
    const bn_io base = make_io<T>(sh, DATA_NORMAL, &r);
    bn_io ref = base;
    ref.relu = 1;
    cpu_side<T>::train_fwd(ref);
    for (size_t i = 0; i < sizeof(faults) / sizeof(faults[0]); i++) {
        bn_io got = base;
        got.relu = 1;
        plant = faults[i].p;
        quiet = 1;
        fast_side<T>::train_fwd(got, 0);
        const size_t bad = compare("", "", "", ref.y, got.y, 0, T_ATOL, T_RMAX, ulp_rel<T>()) +
                           compare("", "", "", ref.sm, got.sm, 0, T_ATOL, T_RMAX, 0.0);
        quiet = 0;
        plant = PLANT_NONE;
        printf("  planted fault %-4s (%d,%d,%d,%d): %-52s %s (%zu values off)\n", tname<T>(), sh.n, sh.c, sh.h, sh.w,
               faults[i].what, bad ? "caught" : "MISSED", bad);
        CHECKF(bad > 0, "planted fault not caught: %s (%s)", faults[i].what, tname<T>());
    }
}

/* ---- the ReLU thresholds ---------------------------------------------------------------------------------------- */

/* v > thr exactly where v rounds to a positive T, v < -thr where it rounds to a negative one. */
template <typename T> static void test_thr(void)
{
    const float thr = bn_relu_thr<T>();
    size_t bad = 0;
    const float probes[] = {thr, nextafterf(thr, 1.0f), nextafterf(thr, 0.0f), 2.0f * thr, 0.5f * thr, FLT_MIN,
                            1e-30f, 1e-10f, 1e-7f, 3e-8f, 0x1p-149f, 1.0f};
    for (float p : probes)
        for (int s = 0; s < 2; s++) {
            const float v = s ? -p : p, w = rnd<T>(v);
            bad += (v > thr) != (w > 0.0f);
            bad += (v < -thr) != (w < 0.0f);
        }
    printf("  relu threshold %-4s %-10g: v > thr iff R(v) > 0 over %zu probes  %s\n", tname<T>(), (double)thr,
           sizeof(probes) / sizeof(probes[0]) * 2, bad ? "FAIL" : "ok");
    CHECKF(bad == 0, "relu threshold of %s", tname<T>());
}

int main(void)
{
    printf("test_cuda_bodies_bn: seed %llu\n", (unsigned long long)SEED);
    struct rt_backend_opts o;
    memset(&o, 0, sizeof(o));
    o.kind = RT_BACKEND_CPU;
    if (rt_backend_create(&o, &be) < 0) {
        fprintf(stderr, "test_cuda_bodies_bn: cpu backend: %s\n", rt_errmsg());
        return 1;
    }
    o32 = rt_backend_ops(be);
    o16 = rt_backend_ops_for(be, RT_BF16);
    st = rt_backend_stream(be);
    printf("  %s; bf16 reference: %s\n", rt_backend_describe(be),
           o16 ? "the CPU's bf16 table" : "fp32 ops rounded once (no bf16 table here)");
    test_thr<float>();
    test_thr<__nv_bfloat16>();
    test_thr<__half>();

    /* which types run a shape: 1 fp32, 2 bf16, 4 fp16. The two largest give a finalize block more partials than
     * threads, (66,1,128,128) in fp32 NCHW, (72,1,64,64) in the NHWC types (1024 splits, the most). */
    static const struct {
        struct rt_shape4 sh;
        int types;
    } shapes[] = {
        {{3, 5, 4, 4}, 7},   {{2, 8, 1, 1}, 7},     {{4, 24, 7, 7}, 7},     {{1, 64, 3, 3}, 7},
        {{7, 13, 5, 3}, 7},  {{16, 64, 8, 8}, 7},   {{5, 1, 3, 3}, 7},      {{1, 4, 1, 1}, 7},
        {{2, 264, 3, 3}, 7}, {{3, 520, 1, 2}, 7},   {{16, 3, 32, 32}, 7},   {{32, 16, 16, 16}, 7},
        {{3, 70, 2, 3}, 7},  {{72, 1, 64, 64}, 6}, {{66, 1, 128, 128}, 1},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
        for (int dk = 0; dk < 2; dk++) {
            const uint64_t stream = 10 * i + (uint64_t)dk;
            if (shapes[i].types & 1)
                run_case<float>(shapes[i].sh, (enum data_kind)dk, stream);
            if (shapes[i].types & 2)
                run_case<__nv_bfloat16>(shapes[i].sh, (enum data_kind)dk, stream);
            if (shapes[i].types & 4)
                run_case<__half>(shapes[i].sh, (enum data_kind)dk, stream);
        }
    printf("planted faults\n");
    const struct rt_shape4 ps = {7, 13, 5, 3}, pv = {4, 16, 4, 4};
    planted<float>(ps);
    planted<float>(pv);
    planted<__nv_bfloat16>(ps);
    planted<__nv_bfloat16>(pv);
    planted<__half>(pv);
    rt_backend_destroy(be);
    fflush(stdout);
    return check_result();
}
