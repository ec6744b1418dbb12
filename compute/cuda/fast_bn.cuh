/*
 * fast_bn.cuh - the bodies of the fast batchnorm kernels (fast_bn.cu): the grids' geometry, what one thread
 * of each kernel does, the per-channel scalars and the orders in which partial sums are combined, all
 * __host__ __device__ or host-only, so that tests/test_cuda_bodies_bn.cu runs every thread of every block on
 * the CPU and compares with the CPU backend (DESIGN.md, "GPU code written without a GPU"). The __global__
 * wrappers in fast_bn.cu only map a block onto these and do the block-level combining that needs
 * __syncthreads; the host replays of that combining are here beside the device's description.
 * Private to compute/cuda/ and that test. Does not launch anything.
 *
 * Layouts: fp32 NCHW (the fp32 table), element (n, c, h, w) at ((n*C + c)*H + h)*W + w; 16-bit NHWC (the
 * bf16/fp16 tables), at ((n*H + h)*W + w)*C + c. A channel's m = N*H*W values are its "rows" (NHWC) or its
 * m elements j = n*HW + p (NCHW).
 *
 * The unit of work is V = FK_VEC(T) consecutive logical elements: NHWC, V channels of one row (a channel group
 * g: channels V*g .. V*g + w - 1, w = min(V, C - V*g)); NCHW, elements j = V*u .. V*u + w - 1 of one channel
 * (w = min(V, m - V*u)). A unit is one 16-byte load when the shape and the pointers allow (bn_geo.vec_ok and
 * every pointer 16-byte aligned: NHWC C % V == 0; NCHW H*W % V == 0, so a unit never leaves its plane), and
 * w scalar loads otherwise; either way its lanes are added in lane order into the same accumulators, so the
 * sums -- and every result -- depend on the shape alone, never on alignment.
 *
 * Rounding: sums in double (each thread's terms in order; d = (double)x - k, s1 += d, s2 = fma(d, d, s2)
 * forward; g = dy or its masked value, s1 += g, s2 = fma(g, (double)x - mean, s2) backward: the CPU rounds the
 * product apart, which moves no float result in practice and stays within the reduction tolerance), the
 * per-channel scalars by the CPU backend's double formulas (compute/cpu/elem.c) with one rounding per
 * operation, and every element expression in float with one rounding per operation (fk_add, fk_sub, fk_mul), as
 * elem.c's bn_row_affine and bn_row_bwd_dx write them; 16-bit results are rounded once, on the store.
 *
 * A fused ReLU (rt_bn_desc.relu) acts on the value the unfused batchnorm would store: forward
 * y = max(0, R(v)) with R the store's rounding, and backward passes dy where R(v) > 0, v the forward's float
 * value recomputed from the same operands. R(v) > 0 exactly when v > thr and R(v) < 0 exactly when v < -thr,
 * thr being half the type's smallest subnormal (0 for fp32, 2^-134 bf16, 2^-25 fp16; ties round to the even
 * zero), so the kernels test v against thr and round once: bit for bit this table's batchnorm followed by
 * relu_fwd (`x < 0 ? 0 : x`) and relu_bwd (`y > 0 ? dy : 0`) on the stored y. fp32: the CPU's v < 0 and v > 0.
 */
#ifndef RT_COMPUTE_CUDA_FAST_BN_CUH
#define RT_COMPUTE_CUDA_FAST_BN_CUH

#include <math.h>
#include <stdint.h>

#include "compute/cuda/fast.cuh"

/* ---- geometry ------------------------------------------------------------------------------------------ */

#define BN_MAX_SPLITS 1024u   /* partials per channel at most: 4 per thread of a finalize block */
#define BN_TARGET_BLOCKS 2048u /* statistics blocks wanted: 15 per SM of a 132-SM H200, a few waves */
#define BN_MIN_ITERS 4u        /* units per thread and split at least, so a block's combining is amortised */
#define BN_EW_UNITS 4u         /* units per thread of an element-wise block, loaded before the first store */
/* NHWC: channel groups per block at most: 8 groups are 128 bytes of a 16-bit row, a whole cache line, and wide
 * channel counts then take several tiles, so that a shape's blocks need fewer row splits */
#define BN_MAX_GB 8u
/* NHWC: rows per statistics split at least. Each split leaves 16 bytes of partials per channel, which the
 * finalize reads again: 256 rows of 2-byte values keep that below 3.2 % of the tensor's bytes (NCHW splits are
 * 1024 units of 16 bytes at least: 0.1 %). */
#define BN_MIN_ROWS 256u
/* Units a statistics thread loads before adding them (independent loads in flight): fewer backward, which loads
 * two tensors, so that the registers stay below the 128 that two blocks per multiprocessor allow. */
#define BN_DEPTH(BWD) ((BWD) ? 2 : 4)
/* Units of the dx pass loaded before the first is stored: it loads x, dy and maybe dx for each. */
#define BN_DX_DEPTH 2u

/*
 * The shape of one call, made on the host (bn_geo_nchw / bn_geo_nhwc) from the tensor's shape alone and passed
 * to every kernel by value. The statistics grid is splits x channels (NCHW) or splits x tiles (NHWC), a split
 * being units (NCHW) or rows (NHWC) [s*chunk, min((s+1)*chunk, end)); the element-wise grid is eblocks x
 * channels (NCHW) or eblocks x tiles (NHWC), each block BN_EW_UNITS units per thread, walked in reverse (see
 * fast_bn.cu). NHWC blocks are gb channel groups (lanes, fastest) x rl row lanes, both powers of two, gb*rl =
 * FK_THREADS; tile t holds groups [t*gb, t*gb + gb). Every count is below 2^31 (the caller checks N*C*H*W).
 */
struct bn_geo {
    uint32_t c;       /* channels */
    uint32_t m;       /* values per channel, N*H*W */
    uint32_t hw;      /* NCHW: H*W */
    fk_divider hwd;   /* NCHW: division by hw */
    uint32_t vec_ok;  /* 1: the shape allows 16-byte units (each kernel also needs its pointers aligned) */
    uint32_t units;   /* NCHW: units per channel, ceil(m / V); NHWC: channel groups per row, ceil(C / V) */
    uint32_t gb, lg_gb, rl, tiles; /* NHWC block shape (NCHW: gb = 1, rl = FK_THREADS, tiles = C) */
    uint32_t splits, chunk;        /* statistics: splits per channel (NCHW) or tile (NHWC), units or rows each */
    uint32_t eblocks;              /* element-wise blocks per channel (NCHW) or tile (NHWC) */
};

static inline uint32_t bn_cdiv(uint32_t a, uint32_t b)
{
    return (uint32_t)(((uint64_t)a + b - 1) / b);
}

/* splits over `per` units (or rows) of which a block's thread takes every `lanes`-th, `cols` blocks side by side:
 * enough blocks for the GPU (BN_TARGET_BLOCKS) but at least BN_MIN_ITERS units per thread and `least` per split,
 * at most BN_MAX_SPLITS; the count depends on the shape alone, so the sums' order does too. */
static inline void bn_geo_split(struct bn_geo *g, uint32_t per, uint32_t lanes, uint32_t least, uint32_t cols)
{
    const uint32_t fewest = lanes * BN_MIN_ITERS > least ? lanes * BN_MIN_ITERS : least;
    uint32_t most = per / fewest, want = bn_cdiv(BN_TARGET_BLOCKS, cols);
    uint32_t s = most < want ? most : want;
    s = s < 1 ? 1 : s > BN_MAX_SPLITS ? BN_MAX_SPLITS : s;
    g->chunk = per ? bn_cdiv(per, s) : 1;
    g->splits = per ? bn_cdiv(per, g->chunk) : 1;
}

/* fp32 NCHW (V = 4), n images of c channels of hw pixels; n*c*hw < 2^31, c and n*hw >= 1. */
static inline struct bn_geo bn_geo_nchw(uint32_t n, uint32_t c, uint32_t hw)
{
    struct bn_geo g;
    memset(&g, 0, sizeof(g));
    g.c = c;
    g.m = n * hw;
    g.hw = hw;
    g.hwd = fk_divider_of(hw);
    g.vec_ok = hw % 4 == 0;
    g.units = bn_cdiv(g.m, 4);
    g.gb = 1;
    g.lg_gb = 0;
    g.rl = FK_THREADS;
    g.tiles = c;
    bn_geo_split(&g, g.units, FK_THREADS, 0, c);
    g.eblocks = bn_cdiv(g.units, FK_THREADS * BN_EW_UNITS);
    return g;
}

/* NHWC with V = FK_VEC(T) channels a unit, m rows of c channels; m*c < 2^31, both >= 1. */
template <typename T> static inline struct bn_geo bn_geo_nhwc(uint32_t m, uint32_t c)
{
    const uint32_t V = (uint32_t)FK_VEC(T);
    struct bn_geo g;
    memset(&g, 0, sizeof(g));
    g.c = c;
    g.m = m;
    g.hw = 1;
    g.hwd = fk_divider_of(1);
    g.vec_ok = c % V == 0;
    g.units = bn_cdiv(c, V);
    g.gb = 1;
    g.lg_gb = 0;
    while (g.gb < g.units && g.gb < BN_MAX_GB) {
        g.gb *= 2;
        g.lg_gb++;
    }
    g.rl = FK_THREADS / g.gb;
    g.tiles = bn_cdiv(g.units, g.gb);
    bn_geo_split(&g, m, g.rl, BN_MIN_ROWS, g.tiles);
    g.eblocks = bn_cdiv(m, g.rl * BN_EW_UNITS);
    return g;
}

/* ---- units: load and store V elements (16 bytes, or w scalars) ----------------------------------------- */

template <typename T> RT_HD fk_pack<T> bn_zero_pack()
{
    fk_pack<T> r;
    for (int e = 0; e < FK_VEC(T); e++)
        r.v[e] = fk_st<T>(0.0f);
    return r;
}

/* NCHW (float): the offset of element j of channel c. One division (a multiply-high) by H*W. */
RT_HD uint32_t bn_nchw_at(const bn_geo &g, uint32_t c, uint32_t j)
{
    const uint32_t n = fk_div_u32(g.hwd, j);
    return (n * g.c + c) * g.hw + (j - n * g.hw);
}

/* Lanes of NCHW unit u of channel c (w returned; lanes >= w are 0). vec: one 16-byte load (the unit lies in one
 * plane, at a 16-byte aligned offset: H*W % 4 == 0 and p aligned). */
RT_HD uint32_t bn_nchw_load(const bn_geo &g, const float *p, uint32_t c, uint32_t u, int vec, fk_pack<float> &r)
{
    const uint32_t j0 = 4 * u, w = g.m - j0 < 4 ? g.m - j0 : 4;
    if (vec) {
        r = fk_load(p + bn_nchw_at(g, c, j0));
        return 4;
    }
    /* a loop of constant length, its lanes tested: a run-time bound would index the registers at run time */
    r = bn_zero_pack<float>();
    for (uint32_t e = 0; e < 4; e++)
        if (e < w)
            r.v[e] = p[bn_nchw_at(g, c, j0 + e)];
    return w;
}

RT_HD void bn_nchw_store(const bn_geo &g, float *p, uint32_t c, uint32_t u, int vec, const fk_pack<float> &r)
{
    const uint32_t j0 = 4 * u, w = g.m - j0 < 4 ? g.m - j0 : 4;
    if (vec) {
        fk_store(p + bn_nchw_at(g, c, j0), r);
        return;
    }
    for (uint32_t e = 0; e < 4; e++)
        if (e < w)
            p[bn_nchw_at(g, c, j0 + e)] = r.v[e];
}

/* NHWC: channel group grp of row r, w = min(V, C - V*grp) lanes. vec: C % V == 0 and p aligned. */
template <typename T>
RT_HD uint32_t bn_nhwc_load(const bn_geo &g, const T *p, uint32_t r, uint32_t grp, int vec, fk_pack<T> &out)
{
    const uint32_t V = (uint32_t)FK_VEC(T), c0 = grp * V, w = g.c - c0 < V ? g.c - c0 : V, off = r * g.c + c0;
    if (vec) {
        out = fk_load(p + off);
        return V;
    }
    out = bn_zero_pack<T>();
    for (uint32_t e = 0; e < V; e++)
        if (e < w)
            out.v[e] = p[off + e];
    return w;
}

template <typename T>
RT_HD void bn_nhwc_store(const bn_geo &g, T *p, uint32_t r, uint32_t grp, int vec, const fk_pack<T> &v)
{
    const uint32_t V = (uint32_t)FK_VEC(T), c0 = grp * V, w = g.c - c0 < V ? g.c - c0 : V, off = r * g.c + c0;
    if (vec) {
        fk_store(p + off, v);
        return;
    }
    for (uint32_t e = 0; e < V; e++)
        if (e < w)
            p[off + e] = v.v[e];
}

/* ---- the element expressions ----------------------------------------------------------------------------- */

/* Half the smallest subnormal of T: R(v) > 0 iff v > thr, R(v) < 0 iff v < -thr (file comment). */
template <typename T> RT_HD float bn_relu_thr();
template <> RT_HD float bn_relu_thr<float>()
{
    return 0.0f;
}
template <> RT_HD float bn_relu_thr<__nv_bfloat16>()
{
    return 0x1p-134f;
}
template <> RT_HD float bn_relu_thr<__half>()
{
    return 0x1p-25f;
}

/* y = (x - mean) a + b, each operation rounded (elem.c's bn_row_affine); relu: 0 where the stored y would be
 * negative (a NaN passes). */
RT_HD float bn_affine1(float x, float mean, float a, float b, int relu, float thr)
{
    const float v = fk_add(fk_mul(fk_sub(x, mean), a), b);
    return relu && v < -thr ? 0.0f : v;
}

/* dy where the fused ReLU's stored output, (x - mean) ra + rb, is > 0, else 0 (elem.c's bn_relu_grad). */
RT_HD float bn_mask1(float dy, float x, float mean, float ra, float rb, float thr)
{
    return fk_add(fk_mul(fk_sub(x, mean), ra), rb) > thr ? dy : 0.0f;
}

/* Per-channel coefficients of the dx pass: dx = beta_dx dx + (g - gm - (x - mu) pj) sc, g = dy masked by
 * (ra, rb) when relu. */
struct bn_dx_k {
    float mu, gm, pj, sc, ra, rb;
};

/* elem.c's bn_row_bwd_dx, with the fused ReLU's mask; beta_dx 0 never uses `old`. */
RT_HD float bn_dx1(float x, float dy, const bn_dx_k &k, int relu, float thr, float beta_dx, float old)
{
    const float t = fk_sub(x, k.mu);
    const float g = relu ? (fk_add(fk_mul(t, k.ra), k.rb) > thr ? dy : 0.0f) : dy;
    const float r = fk_mul(fk_sub(fk_sub(g, k.gm), fk_mul(t, k.pj)), k.sc);
    return beta_dx == 0.0f ? r : fk_add(fk_mul(beta_dx, old), r);
}

/* ---- statistics: one thread's sums ------------------------------------------------------------------------ */

/* What a statistics thread needs of one channel: forward, the shift k (the channel's first value); backward,
 * the mean in double and, for a fused ReLU, the forward's operands (mean, ra = save_invstd * gamma, rb = beta). */
struct bn_sum_k {
    double k;
    float mu, ra, rb;
};

/* Forward: the shift, the channel's first value (element (0, c, 0, 0), at `first`). */
template <typename T> RT_HD bn_sum_k bn_sum_k_fwd(const T *first)
{
    bn_sum_k k;
    k.k = (double)fk_ld(*first);
    k.mu = k.ra = k.rb = 0.0f;
    return k;
}

/* Backward, channel c: the saved mean, and with relu the forward's scale (its float product) and shift. */
RT_HD bn_sum_k bn_sum_k_bwd(const float *save_mean, const float *save_invstd, const float *gamma, const float *beta,
                            uint32_t c, int relu)
{
    bn_sum_k k;
    k.mu = save_mean[c];
    k.k = (double)k.mu;
    k.ra = relu ? fk_mul(save_invstd[c], gamma[c]) : 0.0f;
    k.rb = relu ? beta[c] : 0.0f;
    return k;
}

/* What NCHW statistics block (c, .) needs of its channel: forward the shift x(0, c, 0, 0), backward the above. */
template <int BWD>
RT_HD bn_sum_k bn_nchw_sum_k(const bn_geo &g, const float *x, const float *save_mean, const float *save_invstd,
                             const float *gamma, const float *beta, uint32_t c, int relu)
{
    return BWD ? bn_sum_k_bwd(save_mean, save_invstd, gamma, beta, c, relu) : bn_sum_k_fwd(x + c * g.hw);
}

/* The same per lane of NHWC channel group grp (lanes past C, or no group: zeros). */
template <typename T, int BWD>
RT_HD void bn_nhwc_sum_k(const bn_geo &g, const T *x, const float *save_mean, const float *save_invstd,
                         const float *gamma, const float *beta, uint32_t grp, int relu, bn_sum_k *k)
{
    FK_UNROLL
    for (int e = 0; e < FK_VEC(T); e++) {
        const uint32_t c = grp * (uint32_t)FK_VEC(T) + (uint32_t)e;
        if (grp < g.units && c < g.c)
            k[e] = BWD ? bn_sum_k_bwd(save_mean, save_invstd, gamma, beta, c, relu) : bn_sum_k_fwd(x + c);
        else {
            k[e].k = 0.0;
            k[e].mu = k[e].ra = k[e].rb = 0.0f;
        }
    }
}

/* Adds one element's terms: forward d = x - k; backward g = dy (masked), g (x - mean). */
template <int BWD>
RT_HD void bn_sum1(float x, float dy, const bn_sum_k &k, int relu, float thr, double &a, double &b)
{
    if (BWD) {
        const double g = relu ? (double)bn_mask1(dy, x, k.mu, k.ra, k.rb, thr) : (double)dy;
        a += g;
        b = fk_dfma(g, (double)x - k.k, b);
    } else {
        const double d = (double)x - k.k;
        a += d;
        b = fk_dfma(d, d, b);
    }
}

/*
 * NCHW statistics thread t of block (channel c, split s): units u = s*chunk + t + i*FK_THREADS below the split's
 * end, in increasing u, lanes in order, into (a, b). dy (backward) may be NULL forward. BN_DEPTH units are loaded
 * before any is added (independent loads in flight); the order of the additions is unchanged by that.
 */
template <int BWD>
RT_HD void bn_nchw_stats_thread(const bn_geo &g, const float *x, const float *dy, int vec, uint32_t c, uint32_t s,
                                uint32_t t, const bn_sum_k &k, int relu, double &a, double &b)
{
    a = 0.0;
    b = 0.0;
    const uint32_t u0 = s * g.chunk, u1 = u0 + g.chunk < g.units ? u0 + g.chunk : g.units;
    for (uint32_t base = u0 + t; base < u1; base += BN_DEPTH(BWD) * FK_THREADS) {
        fk_pack<float> xv[BN_DEPTH(BWD)], gv[BN_DEPTH(BWD)];
        uint32_t w[BN_DEPTH(BWD)];
        FK_UNROLL
        for (int i = 0; i < BN_DEPTH(BWD); i++) {
            const uint32_t u = base + (uint32_t)i * FK_THREADS;
            w[i] = 0;
            if (u < u1) {
                w[i] = bn_nchw_load(g, x, c, u, vec, xv[i]);
                if (BWD)
                    bn_nchw_load(g, dy, c, u, vec, gv[i]);
            }
        }
        FK_UNROLL
        for (int i = 0; i < BN_DEPTH(BWD); i++)
            for (uint32_t e = 0; e < 4; e++)
                if (e < w[i])
                    bn_sum1<BWD>(xv[i].v[e], BWD ? gv[i].v[e] : 0.0f, k, relu, 0.0f, a, b);
    }
}

/*
 * NHWC statistics thread t of block (tile, split s): lane gl = t % gb takes channel group grp = tile*gb + gl
 * (none when grp >= ceil(C/V): sums 0), row lane t / gb the rows s*chunk + t/gb + i*rl below the split's end,
 * in increasing row; a[e], b[e] are channel V*grp + e's sums (e < w; the rest 0). k[e]: that channel's.
 */
template <typename T, int BWD>
RT_HD void bn_nhwc_stats_thread(const bn_geo &g, const T *x, const T *dy, int vec, uint32_t tile, uint32_t s,
                                uint32_t t, const bn_sum_k *k, int relu, double *a, double *b)
{
    const int V = FK_VEC(T);
    for (int e = 0; e < V; e++)
        a[e] = b[e] = 0.0;
    const uint32_t grp = tile * g.gb + (t & (g.gb - 1)), lane = t >> g.lg_gb;
    if (grp >= g.units)
        return;
    const float thr = bn_relu_thr<T>();
    const uint32_t r0 = s * g.chunk, r1 = r0 + g.chunk < g.m ? r0 + g.chunk : g.m;
    for (uint32_t base = r0 + lane; base < r1; base += BN_DEPTH(BWD) * g.rl) {
        fk_pack<T> xv[BN_DEPTH(BWD)], gv[BN_DEPTH(BWD)];
        uint32_t w[BN_DEPTH(BWD)];
        FK_UNROLL
        for (int i = 0; i < BN_DEPTH(BWD); i++) {
            const uint32_t r = base + (uint32_t)i * g.rl;
            w[i] = 0;
            if (r < r1) {
                w[i] = bn_nhwc_load(g, x, r, grp, vec, xv[i]);
                if (BWD)
                    bn_nhwc_load(g, dy, r, grp, vec, gv[i]);
            }
        }
        FK_UNROLL
        for (int i = 0; i < BN_DEPTH(BWD); i++)
            for (int e = 0; e < V; e++)
                if ((uint32_t)e < w[i])
                    bn_sum1<BWD>(fk_ld(xv[i].v[e]), BWD ? fk_ld(gv[i].v[e]) : 0.0f, k[e], relu, thr, a[e], b[e]);
    }
}

/*
 * The NHWC block's combining, over its rl row lanes for each (quantity, lane e, group lane): v holds
 * rl*gb values, row lane r's at v[r*gb + gl]; for h = rl/2, rl/4, ..., 1: v[r*gb + gl] += v[(r + h)*gb + gl]
 * for r < h. The total is left in v[gl]. fast_bn.cu's bn_nhwc_stats_k does these very additions in shared
 * memory; this is the CPU tests' replay of them.
 */
static inline void bn_rows_tree_replay(double *v, uint32_t rl, uint32_t gb)
{
    for (uint32_t h = rl / 2; h > 0; h /= 2)
        for (uint32_t r = 0; r < h; r++)
            for (uint32_t gl = 0; gl < gb; gl++)
                v[r * gb + gl] += v[(r + h) * gb + gl];
}

/* Partials: part[(q*C + c)*splits + s], q = 0 for the first sum, 1 for the second: a channel's partials are
 * contiguous, so a finalize block reads them coalesced. */
RT_HD uint32_t bn_part_at(const bn_geo &g, uint32_t q, uint32_t c, uint32_t s)
{
    return (q * g.c + c) * g.splits + s;
}

/* Finalize thread t of channel c: its share of the channel's partials, s = t, t + FK_THREADS, ..., in order;
 * the block then adds the threads' shares in block_tree_sum's order (fk_tree_sum_replay on the CPU). */
RT_HD void bn_final_thread(const bn_geo &g, const double *part, uint32_t c, uint32_t t, double &a, double &b)
{
    a = 0.0;
    b = 0.0;
    for (uint32_t s = t; s < g.splits; s += FK_THREADS) {
        a += part[bn_part_at(g, 0, c, s)];
        b += part[bn_part_at(g, 1, c, s)];
    }
}

/* ---- per-channel scalars (the CPU backend's formulas, elem.c) -------------------------------------------- */

/* Training forward's constants, in double as the CPU has them. */
struct bn_fwd_q {
    double m, eps, mom, keep /* 1 - mom */, unbias /* m / (m - 1), or 1 when m == 1 */;
};

/*
 * From s1 = sum (x - k), s2 = sum (x - k)^2 over the channel: the saved statistics, the running ones updated
 * in place (*rm, *rv), and the affine pass's scale a = invstd * gamma (float product, as the CPU's).
 */
RT_HD void bn_fwd_scalars(double s1, double s2, double k, const bn_fwd_q &q, float gamma, float *rm, float *rv,
                          float *save_mean, float *save_invstd, float *a)
{
    const double dm = fk_ddiv(s1, q.m);
    double var = fk_dsub(fk_ddiv(s2, q.m), fk_dmul(dm, dm));
    if (var < 0.0)
        var = 0.0;
    const double mean = fk_dadd(k, dm);
    const float mean_f = (float)mean, invstd_f = (float)fk_ddiv(1.0, fk_dsqrt(fk_dadd(var, q.eps)));
    *save_mean = mean_f;
    *save_invstd = invstd_f;
    *rm = (float)fk_dadd(fk_dmul(q.mom, mean), fk_dmul(q.keep, (double)*rm));
    *rv = (float)fk_dadd(fk_dmul(fk_dmul(q.mom, var), q.unbias), fk_dmul(q.keep, (double)*rv));
    *a = fk_mul(invstd_f, gamma);
}

/* From sdy = sum g, sdyx = sum g (x - mean): the parameter gradients added to, and dx's gm, pj, sc. */
RT_HD void bn_bwd_scalars(double sdy, double sdyx, double m, float save_invstd, float gamma, float *dgamma,
                          float *dbeta, float *gm, float *pj, float *sc)
{
    const double invstd = (double)save_invstd;
    *dbeta = fk_add(*dbeta, (float)sdy);
    *dgamma = fk_add(*dgamma, (float)fk_dmul(sdyx, invstd));
    *gm = (float)fk_ddiv(sdy, m);
    *pj = (float)fk_ddiv(fk_dmul(fk_dmul(sdyx, invstd), invstd), m);
    *sc = (float)fk_dmul(invstd, (double)gamma);
}

/* Inference's scale: (float)(1 / sqrt((double)running_var + eps)) * gamma, the float product. */
RT_HD float bn_infer_scale(float running_var, double eps, float gamma)
{
    return fk_mul((float)fk_ddiv(1.0, fk_dsqrt(fk_dadd((double)running_var, eps))), gamma);
}

/* ---- element-wise threads ---------------------------------------------------------------------------------- */

/*
 * Where element-wise thread t of block `blk` (already reversed by the kernel) works. NCHW: channel blk / eblocks,
 * units ((blk % eblocks)*BN_EW_UNITS + i)*FK_THREADS + t; NHWC: tile blk / eblocks, group tile*gb + t % gb, rows
 * ((blk % eblocks)*BN_EW_UNITS + i)*rl + t / gb; i < BN_EW_UNITS, each below its end. Returns 0 when the thread
 * has no group (NHWC, group >= ceil(C/V)).
 */
struct bn_ew_at {
    uint32_t col;  /* NCHW: channel; NHWC: channel group */
    uint32_t first, step, end; /* its units (NCHW) or rows (NHWC): first + i*step < end */
};

RT_HD int bn_ew_where(const bn_geo &g, int nhwc, uint32_t blk, uint32_t t, bn_ew_at &w)
{
    const uint32_t outer = blk / g.eblocks, eb = blk - outer * g.eblocks;
    if (nhwc) {
        w.col = outer * g.gb + (t & (g.gb - 1));
        w.step = g.rl;
        w.first = eb * BN_EW_UNITS * g.rl + (t >> g.lg_gb);
        w.end = g.m;
        return w.col < g.units;
    }
    w.col = outer;
    w.step = FK_THREADS;
    w.first = eb * BN_EW_UNITS * FK_THREADS + t;
    w.end = g.units;
    return 1;
}

/* Per-lane coefficients of NHWC group grp from per-channel arrays (lanes past C: 0). */
template <typename T> RT_HD void bn_lanes(const bn_geo &g, const float *p, uint32_t grp, float *out)
{
    const uint32_t V = (uint32_t)FK_VEC(T);
    for (uint32_t e = 0; e < V; e++)
        out[e] = grp * V + e < g.c ? p[grp * V + e] : 0.0f;
}

/* y = bn_affine1(x) over NCHW block blk's thread t: mean, a, b per channel. */
RT_HD void bn_nchw_affine_thread(const bn_geo &g, const float *x, float *y, int vec, const float *mean, const float *a,
                                 const float *b, int relu, uint32_t blk, uint32_t t)
{
    bn_ew_at w;
    bn_ew_where(g, 0, blk, t, w);
    const float mu = mean[w.col], sa = a[w.col], sb = b[w.col];
    fk_pack<float> v[BN_EW_UNITS];
    FK_UNROLL
    for (uint32_t i = 0; i < BN_EW_UNITS; i++)
        if (w.first + i * w.step < w.end)
            bn_nchw_load(g, x, w.col, w.first + i * w.step, vec, v[i]);
    FK_UNROLL
    for (uint32_t i = 0; i < BN_EW_UNITS; i++) {
        const uint32_t u = w.first + i * w.step;
        if (u >= w.end)
            continue;
        for (int e = 0; e < 4; e++)
            v[i].v[e] = bn_affine1(v[i].v[e], mu, sa, sb, relu, 0.0f);
        bn_nchw_store(g, y, w.col, u, vec, v[i]);
    }
}

/* The same over NHWC: each lane its channel's mean, a, b. */
template <typename T>
RT_HD void bn_nhwc_affine_thread(const bn_geo &g, const T *x, T *y, int vec, const float *mean, const float *a,
                                 const float *b, int relu, uint32_t blk, uint32_t t)
{
    const int V = FK_VEC(T);
    bn_ew_at w;
    if (!bn_ew_where(g, 1, blk, t, w))
        return;
    float mu[FK_VEC(T)], sa[FK_VEC(T)], sb[FK_VEC(T)];
    bn_lanes<T>(g, mean, w.col, mu);
    bn_lanes<T>(g, a, w.col, sa);
    bn_lanes<T>(g, b, w.col, sb);
    const float thr = bn_relu_thr<T>();
    fk_pack<T> v[BN_EW_UNITS];
    FK_UNROLL
    for (uint32_t i = 0; i < BN_EW_UNITS; i++)
        if (w.first + i * w.step < w.end)
            bn_nhwc_load(g, x, w.first + i * w.step, w.col, vec, v[i]);
    FK_UNROLL
    for (uint32_t i = 0; i < BN_EW_UNITS; i++) {
        const uint32_t r = w.first + i * w.step;
        if (r >= w.end)
            continue;
        for (int e = 0; e < V; e++)
            v[i].v[e] = fk_st<T>(bn_affine1(fk_ld(v[i].v[e]), mu[e], sa[e], sb[e], relu, thr));
        bn_nhwc_store(g, y, r, w.col, vec, v[i]);
    }
}

/* Per-channel coefficient arrays of the dx pass (C floats each; the mask's ra, rb read only with relu). */
struct bn_dx_arrays {
    const float *mu, *gm, *pj, *sc, *ra, *rb;
};

RT_HD bn_dx_k bn_dx_k_of(const bn_dx_arrays &p, uint32_t c, int relu)
{
    bn_dx_k k;
    k.mu = p.mu[c];
    k.gm = p.gm[c];
    k.pj = p.pj[c];
    k.sc = p.sc[c];
    k.ra = relu ? p.ra[c] : 0.0f;
    k.rb = relu ? p.rb[c] : 0.0f;
    return k;
}

/* dx = bn_dx1(...) over NCHW block blk's thread t; beta_dx 0 never reads dx. */
RT_HD void bn_nchw_dx_thread(const bn_geo &g, const float *x, const float *dy, float *dx, int vec,
                             const bn_dx_arrays &p, int relu, float beta_dx, uint32_t blk, uint32_t t)
{
    bn_ew_at w;
    bn_ew_where(g, 0, blk, t, w);
    const bn_dx_k k = bn_dx_k_of(p, w.col, relu);
    for (uint32_t i0 = 0; i0 < BN_EW_UNITS; i0 += BN_DX_DEPTH) {
        fk_pack<float> xv[BN_DX_DEPTH], gv[BN_DX_DEPTH], ov[BN_DX_DEPTH];
        FK_UNROLL
        for (uint32_t i = 0; i < BN_DX_DEPTH; i++) {
            const uint32_t u = w.first + (i0 + i) * w.step;
            if (u >= w.end)
                continue;
            bn_nchw_load(g, x, w.col, u, vec, xv[i]);
            bn_nchw_load(g, dy, w.col, u, vec, gv[i]);
            ov[i] = bn_zero_pack<float>();
            if (beta_dx != 0.0f)
                bn_nchw_load(g, dx, w.col, u, vec, ov[i]);
        }
        FK_UNROLL
        for (uint32_t i = 0; i < BN_DX_DEPTH; i++) {
            const uint32_t u = w.first + (i0 + i) * w.step;
            if (u >= w.end)
                continue;
            for (int e = 0; e < 4; e++)
                ov[i].v[e] = bn_dx1(xv[i].v[e], gv[i].v[e], k, relu, 0.0f, beta_dx, ov[i].v[e]);
            bn_nchw_store(g, dx, w.col, u, vec, ov[i]);
        }
    }
}

template <typename T>
RT_HD void bn_nhwc_dx_thread(const bn_geo &g, const T *x, const T *dy, T *dx, int vec, const bn_dx_arrays &p,
                             int relu, float beta_dx, uint32_t blk, uint32_t t)
{
    const int V = FK_VEC(T);
    bn_ew_at w;
    if (!bn_ew_where(g, 1, blk, t, w))
        return;
    float mu[FK_VEC(T)], gm[FK_VEC(T)], pj[FK_VEC(T)], sc[FK_VEC(T)], ra[FK_VEC(T)], rb[FK_VEC(T)];
    bn_lanes<T>(g, p.mu, w.col, mu);
    bn_lanes<T>(g, p.gm, w.col, gm);
    bn_lanes<T>(g, p.pj, w.col, pj);
    bn_lanes<T>(g, p.sc, w.col, sc);
    for (int e = 0; e < V; e++)
        ra[e] = rb[e] = 0.0f;
    if (relu) {
        bn_lanes<T>(g, p.ra, w.col, ra);
        bn_lanes<T>(g, p.rb, w.col, rb);
    }
    const float thr = bn_relu_thr<T>();
    for (uint32_t i0 = 0; i0 < BN_EW_UNITS; i0 += BN_DX_DEPTH) {
        fk_pack<T> xv[BN_DX_DEPTH], gv[BN_DX_DEPTH], ov[BN_DX_DEPTH];
        FK_UNROLL
        for (uint32_t i = 0; i < BN_DX_DEPTH; i++) {
            const uint32_t r = w.first + (i0 + i) * w.step;
            if (r >= w.end)
                continue;
            bn_nhwc_load(g, x, r, w.col, vec, xv[i]);
            bn_nhwc_load(g, dy, r, w.col, vec, gv[i]);
            ov[i] = bn_zero_pack<T>();
            if (beta_dx != 0.0f)
                bn_nhwc_load(g, dx, r, w.col, vec, ov[i]);
        }
        FK_UNROLL
        for (uint32_t i = 0; i < BN_DX_DEPTH; i++) {
            const uint32_t r = w.first + (i0 + i) * w.step;
            if (r >= w.end)
                continue;
            FK_UNROLL
            for (int e = 0; e < V; e++) {
                bn_dx_k k;
                k.mu = mu[e];
                k.gm = gm[e];
                k.pj = pj[e];
                k.sc = sc[e];
                k.ra = ra[e];
                k.rb = rb[e];
                ov[i].v[e] =
                    fk_st<T>(bn_dx1(fk_ld(xv[i].v[e]), fk_ld(gv[i].v[e]), k, relu, thr, beta_dx, fk_ld(ov[i].v[e])));
            }
            bn_nhwc_store(g, dx, r, w.col, vec, ov[i]);
        }
    }
}

#endif
