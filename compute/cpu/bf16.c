/*
 * bf16.c - the activation ops of the CPU backend's bf16 table (compute.h's
 * rt_backend_ops_for(be, RT_BF16); cpu.h's rt_cpu_fill_bf16). Every op the
 * CUDA backend's 16-bit tables replace is replaced here, except the three
 * convolutions (dnnl.c): layout conversion, input, batchnorm (with the
 * ReLU fused where rt_bn_desc.relu asks: bn_relu is 1), pooling,
 * global pooling, flatten, the linear layer, ReLU/GELU, dropout,
 * add/scale/axpy, the loss and the two reductions. Each takes the fp32
 * signature; its activation pointers hold bf16 (uint16_t bits), in the
 * layout of cpu.h (nChw16c when C % 16 == 0, else (C, N, H, W)).
 *
 * Precision, as PyTorch's CPU autocast: every element is widened to fp32
 * (exact: a bf16 is the top half of a float), the op computes in fp32 (sums
 * in double where the fp32 kernel's are), and the result is rounded once,
 * to nearest even, on the store. Weights, biases, batchnorm parameters and
 * statistics, parameter gradients and the loss statistics stay fp32; the
 * linear layer multiplies bf16 activations by its weights rounded to bf16
 * per call, accumulating in fp32. So an op that is one fp32 expression per
 * element (ReLU, add, scale, axpy, dropout, max pooling, GELU, the input)
 * gives exactly the fp32 kernel's result rounded to bf16. One difference: a
 * result below fp32's smallest normal becomes a zero (f32_to_bf16 says why).
 *
 * Speed: the hot ops (the element-wise ones, batchnorm, max pooling, the
 * input transform, dropout, flatten) are loops over 16-lane AVX-512
 * vectors, which the nChw16c layout makes one pixel's channel block, near
 * the memory bandwidth; dropout draws its Philox words 16 blocks at a time;
 * the linear layer is oneDNN's bf16 matmul. The rare ops (average pooling,
 * the loss) widen into fp32 scratch, call the fp32 kernel and round the
 * result. That scratch is the backend's scratch16, apart from
 * rt_cpu_scratch(), which the fp32 kernels use.
 *
 * Determinism: loops are OpenMP static schedules over chunks fixed by the
 * shape (elements, a channel, an (image, channel block) plane or a run of
 * them), and every reduction adds per-chunk partial sums in a fixed order,
 * so these kernels do not even depend on the thread count; oneDNN's matmul
 * in the linear layer repeats exactly for a given thread count.
 */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "common/common.h"
#include "compute/cpu/cpu.h"
#include "compute/dropout_index.h"

/* a * b + c stays two roundings, as in the fp32 kernels (elem.c), so that
 * the bf16 results are theirs rounded; GCC does not contract in ISO C. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/*
 * The table exists only where rt_cpu_bf16_isa() found AVX512_BF16 or AMX,
 * which come with AVX-512 F/BW/DQ/VL, so the kernels may use them without a
 * run-time check: 16 floats are one register, and one instruction rounds
 * them to bf16 (twice as fast as rounding in integer arithmetic, in cache).
 * Elsewhere the vector types below are lowered to whatever the target has
 * (and the table is never built). A plain target attribute, not an ifunc:
 * sanitizer builds are fine.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#else
#define BF16_TARGET
#endif
/* Helpers that take or return vectors are always inlined: no call passes one, so the warning that a vector wider
 * than the target's registers is passed differently than GCC once did is moot. */
#define BF16_INLINE static inline __attribute__((always_inline)) BF16_TARGET
#if !defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

#define LANES 16 /* == RT_CPU_BLOCK: one vector is one pixel of a channel block */

/* Elements per parallel chunk and the least worth a parallel region, as in elem.c. */
#define CHUNK ((size_t)16384)
#define PAR_MIN ((size_t)32768)
/* Pixels a batchnorm sum runs in fp32 before it is added into double: short
 * enough that the fp32 partial loses nothing that matters (64 terms). */
#define FLUSH 64
/* Pixels a batchnorm statistics task sums at least (bn_sums). */
#define BN_TASK_PIX ((size_t)256)

static inline int nthreads(const struct rt_stream *s)
{
    return s->be->threads > 0 ? s->be->threads : 1;
}

static inline size_t nchunks(size_t n)
{
    return (n + CHUNK - 1) / CHUNK;
}

static inline const uint16_t *cb16(const float *p)
{
    return (const uint16_t *)(const void *)p;
}

static inline uint16_t *mb16(float *p)
{
    return (uint16_t *)(void *)p;
}

/* ==== conversions ========================================================== */

/* Scalar conversions: rt_cpu_bf16_to_f32 and rt_cpu_f32_to_bf16 (cpu.h), shared with dnnl.c. */

#if defined(__x86_64__)
BF16_INLINE v16f ld16(const uint16_t *p)
{
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)p));
    return (v16f)_mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

BF16_INLINE void st16(uint16_t *p, v16f f)
{
    _mm256_storeu_si256((__m256i *)(void *)p, (__m256i)_mm512_cvtneps_pbh((__m512)f));
}
#else
BF16_INLINE v16f ld16(const uint16_t *p)
{
    v16h h;
    memcpy(&h, p, sizeof(h));
    return (v16f)(__builtin_convertvector(h, v16u) << 16);
}

/* f32_to_bf16 16 lanes at a time, in integer arithmetic. */
BF16_INLINE void st16(uint16_t *p, v16f f)
{
    const v16u u = (v16u)f;
    const v16u r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const v16u nan = (v16u)((v16i)(u & 0x7fffffffu) > 0x7f800000);
    const v16u den = (v16u)((v16i)(u & 0x7f800000u) == 0);
    const v16u q = (u >> 16) | 0x40u, z = (u >> 16) & 0x8000u;
    const v16h h = __builtin_convertvector((r & ~nan & ~den) | (q & nan) | (z & den), v16h);
    memcpy(p, &h, sizeof(h));
}
#endif

/* The first n < 16 elements, the rest zero; and the store of the first n. */
BF16_INLINE v16f ldn(const uint16_t *p, size_t n)
{
    uint16_t t[LANES] = {0};
    memcpy(t, p, n * sizeof(*p));
    return ld16(t);
}

BF16_INLINE void stn(uint16_t *p, v16f f, size_t n)
{
    uint16_t t[LANES];
    st16(t, f);
    memcpy(p, t, n * sizeof(*p));
}

BF16_INLINE v16f ldf(const float *p)
{
    v16f v;
    memcpy(&v, p, sizeof(v));
    return v;
}

BF16_INLINE void stf(float *p, v16f v)
{
    memcpy(p, &v, sizeof(v));
}

/* A broadcast: (v16f){0} + a would turn a -0 into +0 (a batchnorm shift of -0 then gave a +0 where elem.c gives -0). */
BF16_INLINE v16f splat(float a)
{
    v16f v;
    for (int l = 0; l < LANES; l++)
        v[l] = a;
    return v;
}

/* Per-lane conditions: an AVX-512 mask register where there is one, else a vector of all-ones/zero lanes. */
#if defined(__x86_64__)
typedef __mmask16 vmask;

BF16_INLINE vmask gt(v16f a, v16f b)
{
    return _mm512_cmp_ps_mask((__m512)a, (__m512)b, _CMP_GT_OQ);
}

BF16_INLINE vmask ge(v16f a, v16f b)
{
    return _mm512_cmp_ps_mask((__m512)a, (__m512)b, _CMP_GE_OQ);
}

BF16_INLINE vmask isnan16(v16f a)
{
    return _mm512_cmp_ps_mask((__m512)a, (__m512)a, _CMP_UNORD_Q);
}

BF16_INLINE vmask eqi(v16i a, int k)
{
    return _mm512_cmpeq_epi32_mask((__m512i)a, _mm512_set1_epi32(k));
}

/* m ? a : b per lane */
BF16_INLINE v16f sel(vmask m, v16f a, v16f b)
{
    return (v16f)_mm512_mask_blend_ps(m, (__m512)b, (__m512)a);
}

BF16_INLINE v16i seli(vmask m, v16i a, v16i b)
{
    return (v16i)_mm512_mask_blend_epi32(m, (__m512i)b, (__m512i)a);
}
#else
typedef v16i vmask;

BF16_INLINE vmask gt(v16f a, v16f b)
{
    return a > b;
}

BF16_INLINE vmask ge(v16f a, v16f b)
{
    return a >= b;
}

BF16_INLINE vmask isnan16(v16f a)
{
    return a != a;
}

BF16_INLINE vmask eqi(v16i a, int k)
{
    return a == k;
}

BF16_INLINE v16f sel(vmask m, v16f a, v16f b)
{
    return (v16f)(((v16i)a & m) | ((v16i)b & ~m));
}

BF16_INLINE v16i seli(vmask m, v16i a, v16i b)
{
    return (a & m) | (b & ~m);
}
#endif

/* Widen n bf16 to fp32 / round n fp32 to bf16, in parallel chunks. */
BF16_TARGET static void widen_chunk(size_t n, const uint16_t *x, float *y)
{
    size_t i = 0;
    for (; i + LANES <= n; i += LANES)
        stf(y + i, ld16(x + i));
    for (; i < n; i++)
        y[i] = rt_cpu_bf16_to_f32(x[i]);
}

BF16_TARGET static void narrow_chunk(size_t n, const float *x, uint16_t *y)
{
    size_t i = 0;
    for (; i + LANES <= n; i += LANES)
        st16(y + i, ldf(x + i));
    for (; i < n; i++)
        y[i] = rt_cpu_f32_to_bf16(x[i]);
}

static void widen(struct rt_stream *s, size_t n, const uint16_t *x, float *y)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK;
        widen_chunk(RT_MIN(n - lo, CHUNK), x + lo, y + lo);
    }
}

static void narrow(struct rt_stream *s, size_t n, const float *x, uint16_t *y)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK;
        narrow_chunk(RT_MIN(n - lo, CHUNK), x + lo, y + lo);
    }
}

/* ==== scratch ============================================================== */

/*
 * At least `bytes` of 64-byte aligned scratch, the backend's scratch16
 * (grown by half again, contents not kept). Aborts when memory is
 * exhausted, as rt_cpu_scratch() does: an op cannot fail.
 */
static void *scratch16(struct rt_stream *s, size_t bytes)
{
    struct rt_backend *be = s->be;
    if (bytes <= be->scratch16_bytes)
        return be->scratch16;
    free(be->scratch16);
    be->scratch16 = NULL;
    be->scratch16_bytes = 0;
    const size_t n = ((bytes + bytes / 2) + 4095) & ~(size_t)4095;
    void *p = NULL;
    if (posix_memalign(&p, 4096, n) != 0) {
        char b[32];
        rt_format_bytes((double)n, b, sizeof(b));
        fprintf(stderr, "ringtrain: out of memory for %s of bf16 kernel scratch\n", b);
        abort();
    }
    be->scratch16 = p;
    be->scratch16_bytes = n;
    return p;
}

/* Scratch split into parts: sizes in bytes, each part 64-byte aligned. */
static void *scratch16_parts(struct rt_stream *s, const size_t *bytes, void **part, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += (bytes[i] + 63) & ~(size_t)63;
    char *p = scratch16(s, total ? total : 64);
    for (int i = 0; i < n; i++) {
        part[i] = p;
        p += (bytes[i] + 63) & ~(size_t)63;
    }
    return part[0];
}

/* ==== layout conversion ==================================================== */

/* Spatial tensor geometry: the planes a kernel runs over (cpu.h). Blocked:
 * plane j = n*CB + cb holds pixels (h, w) x 16 lanes; else plane j = c*N + n
 * holds H*W elements. */
struct geo {
    int blocked;
    size_t n, c, hw, planes, plane; /* plane: elements per plane */
};

static struct geo geo_of(struct rt_shape4 sh)
{
    struct geo g;
    g.blocked = rt_cpu_blocked(sh);
    g.n = (size_t)sh.n;
    g.c = (size_t)sh.c;
    g.hw = (size_t)sh.h * (size_t)sh.w;
    g.planes = g.blocked ? g.n * (g.c / LANES) : g.c * g.n;
    g.plane = g.blocked ? g.hw * LANES : g.hw;
    return g;
}

/* For plane j: its image and first channel. */
static void plane_nc(const struct geo *g, size_t j, size_t *n, size_t *c)
{
    if (g->blocked) {
        const size_t cbs = g->c / LANES;
        *n = j / cbs;
        *c = (j % cbs) * LANES;
    } else {
        *n = j % g->n;
        *c = j / g->n;
    }
}

static void bf16_to_nchw(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *host_nchw)
{
    const struct geo g = geo_of(sh);
    const uint16_t *xh = cb16(x);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (g.planes * g.plane >= PAR_MIN)
    for (size_t j = 0; j < g.planes; j++) {
        size_t n, c;
        plane_nc(&g, j, &n, &c);
        const uint16_t *src = xh + j * g.plane;
        float *dst = host_nchw + (n * g.c + c) * g.hw;
        if (!g.blocked) {
            widen_chunk(g.hw, src, dst);
            continue;
        }
        for (size_t l = 0; l < LANES; l++)
            for (size_t p = 0; p < g.hw; p++)
                dst[l * g.hw + p] = rt_cpu_bf16_to_f32(src[p * LANES + l]);
    }
}

static void bf16_from_nchw(struct rt_stream *s, struct rt_shape4 sh, const float *host_nchw, float *x)
{
    const struct geo g = geo_of(sh);
    uint16_t *xh = mb16(x);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (g.planes * g.plane >= PAR_MIN)
    for (size_t j = 0; j < g.planes; j++) {
        size_t n, c;
        plane_nc(&g, j, &n, &c);
        uint16_t *dst = xh + j * g.plane;
        const float *src = host_nchw + (n * g.c + c) * g.hw;
        if (!g.blocked) {
            narrow_chunk(g.hw, src, dst);
            continue;
        }
        for (size_t l = 0; l < LANES; l++)
            for (size_t p = 0; p < g.hw; p++)
                dst[p * LANES + l] = rt_cpu_f32_to_bf16(src[l * g.hw + p]);
    }
}

/* ==== input ================================================================ */

static void bf16_input_u8(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *host_images, const float *mean,
                          const float *std, float *y)
{
    const struct geo g = geo_of(sh);
    uint16_t *yh = mb16(y);
    /* The fp32 kernel's expression per byte value and channel, rounded once:
     * every pixel is its fp32 result rounded, with no division per pixel. */
    uint16_t *lut = scratch16(s, g.c * 256 * sizeof(uint16_t));
    for (size_t ch = 0; ch < g.c; ch++) {
        float row[256];
        rt_norm_lut(1, mean + ch, std + ch, row);
        for (int v = 0; v < 256; v++)
            lut[ch * 256 + (size_t)v] = rt_cpu_f32_to_bf16(row[v]);
    }
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (g.planes * g.plane >= PAR_MIN)
    for (size_t j = 0; j < g.planes; j++) {
        size_t n, c;
        plane_nc(&g, j, &n, &c);
        uint16_t *dst = yh + j * g.plane;
        if (!g.blocked) {
            const uint8_t *src = host_images + (n * g.c + c) * g.hw;
            const uint16_t *t = lut + c * 256;
            for (size_t p = 0; p < g.hw; p++)
                dst[p] = t[src[p]];
            continue;
        }
        for (size_t l = 0; l < LANES; l++) {
            const uint8_t *src = host_images + (n * g.c + c + l) * g.hw;
            const uint16_t *t = lut + (c + l) * 256;
            for (size_t p = 0; p < g.hw; p++)
                dst[p * LANES + l] = t[src[p]];
        }
    }
}

/* Host memory is the CPU's device memory: the upload's buffer is the host batch itself. */
static void bf16_input_u8_dev(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *dev_images, const float *mean,
                              const float *std, float *y)
{
    bf16_input_u8(s, sh, dev_images, mean, std, y);
}

/* ==== batchnorm ============================================================ */

/*
 * A fused ReLU (rt_bn_desc.relu; this table's bn_relu is 1) gives what this
 * table's batchnorm then its ReLU give, bit for bit. Those see the
 * batchnorm's output as stored: v = (x - mean) a + b rounded to bf16. A
 * normal v keeps its sign and stays nonzero there (bf16 has fp32's exponent
 * range), and a v below fp32's smallest normal in magnitude becomes a zero
 * of its sign (f32_to_bf16). So the ReLU's forward (`y < 0 ? 0 : y`) clips
 * exactly where v <= -FLT_MIN, and its backward (`y > 0 ? dy : 0`) passes
 * exactly where v >= FLT_MIN; a NaN fails both tests, as on the stored y.
 * Testing v > 0 instead would differ on a positive denormal v, which the
 * store flushes; these tests hold whether or not the arithmetic flushes
 * denormals too. The backward recomputes v with the training forward's very
 * operands (save_mean; save_invstd * gamma, the forward's float scale;
 * beta) and expression, so its mask is the forward's. The mask is applied
 * inside the loops that read x and dy anyway: the fusion saves the ReLU's
 * own passes over memory, and adds none.
 */
BF16_INLINE v16f relu_clip(v16f v)
{
    return sel(ge(splat(-FLT_MIN), v), (v16f){0}, v);
}

/* g where the stored (x - mean) a + b is > 0, else 0 (even for a NaN g); t = x - mean. */
BF16_INLINE v16f relu_pass(v16f g, v16f t, v16f a, v16f b)
{
    return sel(ge(t * a + b, splat(FLT_MIN)), g, (v16f){0});
}

static inline float relu_pass1(float g, float t, float a, float b)
{
    return t * a + b >= FLT_MIN ? g : 0.0f;
}

/*
 * Per-channel sums, as elem.c takes them: forward sum(x - k) and
 * sum((x - k)^2) with k the channel's first element (so that E[x^2] - E[x]^2
 * does not cancel when the mean is large against the spread); backward
 * sum(dy) and sum(dy (x - mean)). Terms are computed in fp32 (x and dy are
 * exact there) and summed FLUSH pixels at a time in fp32 vectors, then in
 * double. Blocked tensors: sums_block takes one channel block over a run of
 * nimg images (planes `stride` apart) into 16 doubles of partials per
 * quantity, which bn_sums adds over the runs in order; otherwise a channel
 * is one contiguous run summed by one thread (sums_row). Backward with a
 * fused ReLU (ra, rb not NULL: its scale and shift, per lane or the
 * channel's; k is then the mean): dy is masked by relu_pass first.
 */
BF16_TARGET static void sums_block(const uint16_t *x, const uint16_t *dy, size_t hw, size_t nimg, size_t stride,
                                   const float *k16, const float *ra16, const float *rb16, double *o1, double *o2)
{
    const v16f k = ldf(k16);
    const v16f ra = ra16 ? ldf(ra16) : (v16f){0}, rb = rb16 ? ldf(rb16) : (v16f){0};
    double d1[LANES] = {0}, d2[LANES] = {0};
    v16f a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0};
    size_t run = 0; /* pixels in the fp32 accumulators */
    for (size_t i = 0; i < nimg; i++) {
        const uint16_t *xi = x + i * stride, *gi = dy ? dy + i * stride : NULL;
        for (size_t p0 = 0; p0 < hw;) {
            const size_t p1 = RT_MIN(hw, p0 + (FLUSH - run));
            size_t p = p0;
            /* two pixels per step in separate accumulators: the adds' latency, not the loads, would bound one */
            if (gi) {
                for (; p + 2 <= p1; p += 2) {
                    const v16f t0 = ld16(xi + p * LANES) - k, t1 = ld16(xi + (p + 1) * LANES) - k;
                    v16f g0 = ld16(gi + p * LANES), g1 = ld16(gi + (p + 1) * LANES);
                    if (ra16) {
                        g0 = relu_pass(g0, t0, ra, rb);
                        g1 = relu_pass(g1, t1, ra, rb);
                    }
                    a0 += g0;
                    a1 += g1;
                    b0 += g0 * t0;
                    b1 += g1 * t1;
                }
                if (p < p1) {
                    const v16f t0 = ld16(xi + p * LANES) - k;
                    v16f g0 = ld16(gi + p * LANES);
                    if (ra16)
                        g0 = relu_pass(g0, t0, ra, rb);
                    a0 += g0;
                    b0 += g0 * t0;
                }
            } else {
                for (; p + 2 <= p1; p += 2) {
                    const v16f t0 = ld16(xi + p * LANES) - k, t1 = ld16(xi + (p + 1) * LANES) - k;
                    a0 += t0;
                    a1 += t1;
                    b0 += t0 * t0;
                    b1 += t1 * t1;
                }
                if (p < p1) {
                    const v16f t0 = ld16(xi + p * LANES) - k;
                    a0 += t0;
                    b0 += t0 * t0;
                }
            }
            run += p1 - p0;
            p0 = p1;
            if (run == FLUSH || (i + 1 == nimg && p0 == hw)) {
                const v16f a = a0 + a1, b = b0 + b1;
                for (int l = 0; l < LANES; l++) {
                    d1[l] += (double)a[l];
                    d2[l] += (double)b[l];
                }
                a0 = a1 = b0 = b1 = (v16f){0};
                run = 0;
            }
        }
    }
    memcpy(o1, d1, sizeof(d1));
    memcpy(o2, d2, sizeof(d2));
}

/* The same over one contiguous channel of m elements, shift (or mean) k; ra, rb: the channel's, or NULL. */
BF16_TARGET static void sums_row(const uint16_t *x, const uint16_t *dy, size_t m, float kf, const float *ra1,
                                 const float *rb1, double *o1, double *o2)
{
    const v16f k = splat(kf);
    const float raf = ra1 ? *ra1 : 0.0f, rbf = rb1 ? *rb1 : 0.0f;
    const v16f ra = splat(raf), rb = splat(rbf);
    double s1 = 0.0, s2 = 0.0;
    const size_t full = m - m % LANES;
    size_t i = 0;
    while (i < full) {
        const size_t end = RT_MIN(full, i + (size_t)FLUSH * LANES);
        v16f a = {0}, b = {0};
        for (; i < end; i += LANES) {
            const v16f t = ld16(x + i) - k;
            if (dy) {
                v16f g = ld16(dy + i);
                if (ra1)
                    g = relu_pass(g, t, ra, rb);
                a += g;
                b += g * t;
            } else {
                a += t;
                b += t * t;
            }
        }
        for (int l = 0; l < LANES; l++) {
            s1 += (double)a[l];
            s2 += (double)b[l];
        }
    }
    for (; i < m; i++) {
        const float t = rt_cpu_bf16_to_f32(x[i]) - kf;
        if (dy) {
            float g = rt_cpu_bf16_to_f32(dy[i]);
            if (ra1)
                g = relu_pass1(g, t, raf, rbf);
            s1 += (double)g;
            s2 += (double)(g * t);
        } else {
            s1 += (double)t;
            s2 += (double)(t * t);
        }
    }
    *o1 = s1;
    *o2 = s2;
}

/*
 * Channel sums S1[c], S2[c] (doubles, C each) of x (and dy) with per-channel
 * k (C floats); ra, rb (C floats each, or NULL): a fused ReLU's scale and
 * shift, which mask dy; part is scratch for the blocked partials (planes x
 * 32 doubles).
 */
static void bn_sums(struct rt_stream *s, const struct geo *g, const uint16_t *x, const uint16_t *dy, const float *k,
                    const float *ra, const float *rb, double *part, double *s1, double *s2)
{
    const size_t m = g->n * g->hw;
    if (!g->blocked) {
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (g->c * m >= PAR_MIN)
        for (size_t c = 0; c < g->c; c++)
            sums_row(x + c * m, dy ? dy + c * m : NULL, m, k[c], ra ? ra + c : NULL, rb ? rb + c : NULL, &s1[c],
                     &s2[c]);
        return;
    }
    /*
     * A task sums one channel block over a run of images of at least
     * BN_TASK_PIX pixels, so that small planes (4x4 at the end of a
     * network) do not pay a flush into double per plane; the runs depend on
     * the shape alone, so the sums do not depend on the thread count.
     */
    const size_t cbs = g->c / LANES, ipt = RT_MAX((size_t)1, BN_TASK_PIX / g->hw), runs = (g->n + ipt - 1) / ipt;
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (g->c * m >= PAR_MIN)
    for (size_t t = 0; t < cbs * runs; t++) {
        const size_t cb = t % cbs, i0 = t / cbs * ipt, o = (i0 * cbs + cb) * g->plane; /* in memory order */
        sums_block(x + o, dy ? dy + o : NULL, g->hw, RT_MIN(ipt, g->n - i0), cbs * g->plane, k + cb * LANES,
                   ra ? ra + cb * LANES : NULL, rb ? rb + cb * LANES : NULL, part + t * 2 * LANES,
                   part + t * 2 * LANES + LANES);
    }
    for (size_t c = 0; c < g->c; c++) {
        const size_t cb = c / LANES, l = c % LANES;
        double a = 0.0, b = 0.0;
        for (size_t r = 0; r < runs; r++) {
            const double *pp = part + (r * cbs + cb) * 2 * LANES;
            a += pp[l];
            b += pp[LANES + l];
        }
        s1[c] = a;
        s2[c] = b;
    }
}

/* y = (x - mean) a + b over one plane: per-lane parameters (blocked) or one channel's; relu: relu_clip'ed. */
BF16_TARGET static void affine_block(const uint16_t *x, size_t hw, const float *mean16, const float *a16,
                                     const float *b16, int relu, uint16_t *y)
{
    const v16f mu = ldf(mean16), a = ldf(a16), b = ldf(b16);
    for (size_t p = 0; p < hw; p++) {
        const v16f v = (ld16(x + p * LANES) - mu) * a + b;
        st16(y + p * LANES, relu ? relu_clip(v) : v);
    }
}

BF16_TARGET static void affine_row(const uint16_t *x, size_t m, float muf, float af, float bf, int relu, uint16_t *y)
{
    const v16f mu = splat(muf), a = splat(af), b = splat(bf);
    size_t i = 0;
    for (; i + LANES <= m; i += LANES) {
        const v16f v = (ld16(x + i) - mu) * a + b;
        st16(y + i, relu ? relu_clip(v) : v);
    }
    if (i < m) {
        const v16f v = (ldn(x + i, m - i) - mu) * a + b;
        stn(y + i, relu ? relu_clip(v) : v, m - i);
    }
}

/* y = (x - mean[c]) a[c] + b[c] over the whole tensor, then max(0, y) with relu. */
static void bn_affine(struct rt_stream *s, const struct geo *g, const uint16_t *x, const float *mean, const float *a,
                      const float *b, int relu, uint16_t *y)
{
    const size_t m = g->n * g->hw;
    if (!g->blocked) {
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (g->c * m >= PAR_MIN)
        for (size_t c = 0; c < g->c; c++)
            affine_row(x + c * m, m, mean[c], a[c], b[c], relu, y + c * m);
        return;
    }
    const size_t cbs = g->c / LANES;
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (g->c * m >= PAR_MIN)
    for (size_t j = 0; j < g->planes; j++) {
        const size_t c0 = (j % cbs) * LANES;
        affine_block(x + j * g->plane, g->hw, mean + c0, a + c0, b + c0, relu, y + j * g->plane);
    }
}

/* Per-channel fp32 vectors of the batchnorm kernels, C floats each, in scratch16 with the partial sums. */
struct bn_scratch {
    double *part, *s1, *s2;
    float *k, *a, *b, *c;
};

static void bn_scratch_get(struct rt_stream *s, const struct geo *g, struct bn_scratch *w)
{
    const size_t C = g->c;
    const size_t bytes[7] = {
        (g->blocked ? g->planes : 1) * 2 * LANES * sizeof(double), C * sizeof(double), C * sizeof(double),
        C * sizeof(float), C * sizeof(float), C * sizeof(float), C * sizeof(float),
    };
    void *p[7];
    scratch16_parts(s, bytes, p, 7);
    w->part = p[0];
    w->s1 = p[1];
    w->s2 = p[2];
    w->k = p[3];
    w->a = p[4];
    w->b = p[5];
    w->c = p[6];
}

static void bf16_bn_train_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                              const float *beta, float *running_mean, float *running_var, float *save_mean,
                              float *save_invstd, float *y)
{
    const struct geo g = geo_of(d->in);
    const uint16_t *xh = cb16(x);
    const size_t m = g.n * g.hw;
    struct bn_scratch w;
    bn_scratch_get(s, &g, &w);
    for (size_t c = 0; c < g.c; c++) /* the channel's first element: image 0, pixel 0 */
        w.k[c] = rt_cpu_bf16_to_f32(xh[rt_cpu_offset(d->in, 0, (int)c, 0, 0)]);
    bn_sums(s, &g, xh, NULL, w.k, NULL, NULL, w.part, w.s1, w.s2);
    const double eps = rt_decimal_double(d->eps), mom = rt_decimal_double(d->momentum);
    /* one value per channel: the unbiased variance is undefined; keep the biased one (0), as elem.c */
    const double unbias = m > 1 ? (double)m / (double)(m - 1) : 1.0;
    for (size_t c = 0; c < g.c; c++) {
        const double dm = w.s1[c] / (double)m;
        double var = w.s2[c] / (double)m - dm * dm;
        if (var < 0.0)
            var = 0.0;
        const double mean = (double)w.k[c] + dm;
        const float mean_f = (float)mean, invstd_f = (float)(1.0 / sqrt(var + eps));
        save_mean[c] = mean_f;
        save_invstd[c] = invstd_f;
        running_mean[c] = (float)(mom * mean + (1.0 - mom) * running_mean[c]);
        running_var[c] = (float)(mom * var * unbias + (1.0 - mom) * running_var[c]);
        w.c[c] = mean_f;
        w.a[c] = invstd_f * gamma[c]; /* a fused ReLU's backward recomputes this product (bf16_bn_bwd) */
        w.b[c] = beta[c];
    }
    bn_affine(s, &g, xh, w.c, w.a, w.b, d->relu, mb16(y));
}

static void bf16_bn_infer_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                              const float *beta, const float *running_mean, const float *running_var, float *y)
{
    const struct geo g = geo_of(d->in);
    struct bn_scratch w;
    bn_scratch_get(s, &g, &w);
    const double eps = rt_decimal_double(d->eps);
    for (size_t c = 0; c < g.c; c++) {
        const float invstd = (float)(1.0 / sqrt((double)running_var[c] + eps));
        w.c[c] = running_mean[c];
        w.a[c] = invstd * gamma[c];
        w.b[c] = beta[c];
    }
    bn_affine(s, &g, cb16(x), w.c, w.a, w.b, d->relu, mb16(y));
}

/*
 * dx = beta_dx dx + (dy - grad_mean - (x - mean) proj) scale over one plane
 * or channel; beta_dx 0 never reads dx. ra, rb (per lane, or the channel's;
 * NULL: none): a fused ReLU's scale and shift, which mask dy as in bn_sums.
 */
BF16_TARGET static void bn_dx_block(const uint16_t *x, const uint16_t *dy, size_t hw, const float *mean16,
                                    const float *gm16, const float *proj16, const float *scale16, const float *ra16,
                                    const float *rb16, float beta_dx, uint16_t *dx)
{
    const v16f mu = ldf(mean16), gm = ldf(gm16), pr = ldf(proj16), sc = ldf(scale16), bd = splat(beta_dx);
    const v16f ra = ra16 ? ldf(ra16) : (v16f){0}, rb = rb16 ? ldf(rb16) : (v16f){0};
    for (size_t p = 0; p < hw; p++) {
        const size_t o = p * LANES;
        const v16f t = ld16(x + o) - mu;
        v16f g = ld16(dy + o);
        if (ra16)
            g = relu_pass(g, t, ra, rb);
        const v16f v = (g - gm - t * pr) * sc;
        st16(dx + o, beta_dx == 0.0f ? v : bd * ld16(dx + o) + v);
    }
}

BF16_TARGET static void bn_dx_row(const uint16_t *x, const uint16_t *dy, size_t m, float muf, float gmf, float prf,
                                  float scf, const float *ra1, const float *rb1, float beta_dx, uint16_t *dx)
{
    const v16f mu = splat(muf), gm = splat(gmf), pr = splat(prf), sc = splat(scf), bd = splat(beta_dx);
    const v16f ra = splat(ra1 ? *ra1 : 0.0f), rb = splat(rb1 ? *rb1 : 0.0f);
    size_t i = 0;
    for (; i + LANES <= m; i += LANES) {
        const v16f t = ld16(x + i) - mu;
        v16f g = ld16(dy + i);
        if (ra1)
            g = relu_pass(g, t, ra, rb);
        const v16f v = (g - gm - t * pr) * sc;
        st16(dx + i, beta_dx == 0.0f ? v : bd * ld16(dx + i) + v);
    }
    if (i < m) {
        const size_t r = m - i;
        const v16f t = ldn(x + i, r) - mu;
        v16f g = ldn(dy + i, r);
        if (ra1)
            g = relu_pass(g, t, ra, rb);
        const v16f v = (g - gm - t * pr) * sc;
        stn(dx + i, beta_dx == 0.0f ? v : bd * ldn(dx + i, r) + v, r);
    }
}

/* dx = beta_dx dx + (dy - k - (x - mean) p) sc per channel, masked by a fused ReLU's (ra, rb) when they are given:
 * bn_dx_row / bn_dx_block over the tensor's layout. */
static void bn_dx_all(struct rt_stream *s, const struct geo *g, const uint16_t *xh, const uint16_t *gh,
                      const float *mean, const float *k, const float *p, const float *sc, const float *ra,
                      const float *rb, float beta_dx, uint16_t *dxh)
{
    const size_t m = g->n * g->hw;
    if (!g->blocked) {
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (g->c * m >= PAR_MIN)
        for (size_t c = 0; c < g->c; c++)
            bn_dx_row(xh + c * m, gh + c * m, m, mean[c], k[c], p[c], sc[c], ra ? ra + c : NULL, rb ? rb + c : NULL,
                      beta_dx, dxh + c * m);
        return;
    }
    const size_t cbs = g->c / LANES;
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (g->c * m >= PAR_MIN)
    for (size_t j = 0; j < g->planes; j++) {
        const size_t c0 = (j % cbs) * LANES, o = j * g->plane;
        bn_dx_block(xh + o, gh + o, g->hw, mean + c0, k + c0, p + c0, sc + c0, ra ? ra + c0 : NULL,
                    rb ? rb + c0 : NULL, beta_dx, dxh + o);
    }
}

static void bf16_bn_bwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                        const float *gamma, const float *beta, const float *save_mean, const float *save_invstd,
                        float beta_dx, float *dx, float *dgamma, float *dbeta)
{
    const struct geo g = geo_of(d->in);
    const uint16_t *xh = cb16(x), *gh = cb16(dy);
    uint16_t *dxh = mb16(dx);
    const size_t m = g.n * g.hw;
    struct bn_scratch w;
    bn_scratch_get(s, &g, &w);
    /* A fused ReLU's mask: the training forward's scale, the same float product (w.c is free here), and shift. */
    const float *ra = NULL, *rb = NULL;
    if (d->relu) {
        for (size_t c = 0; c < g.c; c++)
            w.c[c] = save_invstd[c] * gamma[c];
        ra = w.c;
        rb = beta;
    }
    bn_sums(s, &g, xh, gh, save_mean, ra, rb, w.part, w.s1, w.s2);
    /* per channel: w.k = grad_mean, w.a = proj, w.b = scale (PyTorch's form, as elem.c) */
    for (size_t c = 0; c < g.c; c++) {
        const double invstd = save_invstd[c], sdy = w.s1[c], sdyx = w.s2[c];
        dbeta[c] += (float)sdy;
        dgamma[c] += (float)(sdyx * invstd);
        w.k[c] = (float)(sdy / (double)m);
        w.a[c] = (float)(sdyx * invstd * invstd / (double)m);
        w.b[c] = (float)(invstd * gamma[c]);
    }
    bn_dx_all(s, &g, xh, gh, save_mean, w.k, w.a, w.b, ra, rb, beta_dx, dxh);
}

/*
 * The data gradient of bn_infer_fwd: dx = dy a with a = invstd * gamma, the forward's float product, through
 * bf16_bn_bwd's dx kernels with grad_mean = proj = 0 and scale = a (dy - 0 - (x - mean) 0 is dy for every finite
 * x), so the result is the fp32 op's (elem.c) rounded once. A fused ReLU's mask is relu_pass on the forward's v,
 * recomputed from its very operands (running_mean, a, beta): the mask of this table's bn_infer_fwd then relu_bwd.
 */
static void bf16_bn_infer_bwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                              const float *gamma, const float *beta, const float *running_mean,
                              const float *running_var, float beta_dx, float *dx)
{
    const struct geo g = geo_of(d->in);
    const uint16_t *xh = cb16(x), *gh = cb16(dy);
    uint16_t *dxh = mb16(dx);
    struct bn_scratch w;
    bn_scratch_get(s, &g, &w);
    const double eps = rt_decimal_double(d->eps);
    /* per channel: w.k = 0 (grad_mean and proj), w.a = the forward's scale */
    for (size_t c = 0; c < g.c; c++) {
        w.k[c] = 0.0f;
        w.a[c] = (float)(1.0 / sqrt((double)running_var[c] + eps)) * gamma[c];
    }
    const float *ra = d->relu ? w.a : NULL, *rb = d->relu ? beta : NULL;
    bn_dx_all(s, &g, xh, gh, running_mean, w.k, w.k, w.a, ra, rb, beta_dx, dxh);
}

/* ==== max pooling ========================================================== */

/* The window of output (oy, ox) clipped to the input: rows [y0, y1), columns [x0, x1). */
struct win {
    int y0, y1, x0, x1;
};

static struct win window_of(const struct rt_pool_desc *d, int oy, int ox)
{
    const int ys = oy * d->stride - d->pad, xs = ox * d->stride - d->pad;
    struct win w;
    w.y0 = ys > 0 ? ys : 0;
    w.x0 = xs > 0 ? xs : 0;
    w.y1 = ys + d->kh < d->in.h ? ys + d->kh : d->in.h;
    w.x1 = xs + d->kw < d->in.w ? xs + d->kw : d->in.w;
    return w;
}

/*
 * Which elements win, pool.c's rule: the first maximum in row-major order,
 * and a NaN wins so that it propagates (a later NaN over an earlier one).
 * Padding never wins: every floor-mode window holds an input element.
 */
BF16_INLINE vmask takes(v16f m, v16f v)
{
    return gt(v, m) | isnan16(v);
}

/* Output columns per pass over a row: their running maxima and winners stay in L1. */
#define MP_COLS 64

/* Outputs [*lo, *hi) along one axis whose windows lie wholly inside [0, in), as pool.c. */
static void inner_range(int k, int s, int p, int in, int out, int *lo, int *hi)
{
    int a = (p + s - 1) / s;
    int b = in + p - k < 0 ? 0 : (in + p - k) / s + 1;
    if (b > out)
        b = out;
    if (a > b)
        a = b;
    *lo = a;
    *hi = b;
}

/* One row of the windows of columns [c0, c0 + nc): per column, the input columns its window covers. */
struct mp_cols {
    int c0, nc;
    int in0, in1;        /* the columns (relative to c0) whose windows lie inside the row: no clipping */
    int xlo[MP_COLS], xhi[MP_COLS];
};

#if defined(__x86_64__)
BF16_INLINE void mp_bits_elem(const uint16_t *r, int ix, int pix, __m256i *mb, __m256i *any, v16i *best)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(r + (size_t)ix * LANES));
    *any = _mm256_or_si256(*any, v);
    if (best) {
        const __mmask16 t = _mm256_cmpgt_epu16_mask(v, *mb);
        *best = (v16i)_mm512_mask_mov_epi32((__m512i)*best, t, _mm512_set1_epi32(pix));
    }
    *mb = _mm256_max_epu16(*mb, v);
}
#endif

BF16_INLINE void mp_float_elem(const uint16_t *r, int ix, int pix, v16f *mf, v16i *best)
{
    const v16f v = ld16(r + (size_t)ix * LANES);
    const vmask t = takes(*mf, v);
    *mf = sel(t, v, *mf);
    if (best)
        *best = seli(t, (v16i){0} + pix, *best);
}

/*
 * The maxima of output row oy, columns [c0, c0 + nc), of one (image,
 * channel block) plane, 16 channels per element: as bf16 bits into m, and
 * when `best` is not NULL each lane's winner, as its pixel index h*W + w.
 * Window row by window row, each read from left to right: memory is read
 * in order (a 2x2 window's two rows are adjacent, and reading them a window
 * at a time, interleaved, ran at half the speed of one stream), and each
 * window still sees its elements in row-major order. Inlined with constant
 * kw and s for the common windows.
 */
BF16_INLINE void mp_row(const struct rt_pool_desc *d, const uint16_t *x, int oy, const struct mp_cols *cl,
                        uint16_t *m, v16i *best, const int kw, const int s)
{
    const int w = d->in.w, ys = oy * s - d->pad, nc = cl->nc;
    const int ylo = ys > 0 ? ys : 0, yhi = ys + d->kh < d->in.h ? ys + d->kh : d->in.h;
    for (int c = 0; c < nc && best; c++) /* the window's first element wins unless a later one beats it */
        best[c] = (v16i){0} + (ylo * w + cl->xlo[c]);
#if defined(__x86_64__)
    /*
     * On the bits first: a non-negative bf16 orders as its 16 bits do as an
     * unsigned integer (a NaN above Inf), so where no element of the row's
     * windows has its sign bit set -- the usual case, after a ReLU -- a
     * window is an integer max per element and nothing is converted; the
     * winner is the first maximum, as below (of several NaNs in a window,
     * the first with the largest payload, where pool.c takes the last: the
     * output is NaN either way). Else the float path below redoes the row.
     */
    {
        __m256i mb[MP_COLS], any = _mm256_setzero_si256();
        for (int c = 0; c < nc; c++)
            mb[c] = _mm256_setzero_si256();
        for (int iy = ylo; iy < yhi; iy++) {
            const uint16_t *r = x + (size_t)iy * (size_t)w * LANES;
            for (int c = 0; c < nc; c++) {
                v16i *bc = best ? &best[c] : NULL;
                if (c >= cl->in0 && c < cl->in1)
                    for (int b = 0, ix = cl->xlo[c]; b < kw; b++, ix++)
                        mp_bits_elem(r, ix, iy * w + ix, &mb[c], &any, bc);
                else
                    for (int ix = cl->xlo[c]; ix < cl->xhi[c]; ix++)
                        mp_bits_elem(r, ix, iy * w + ix, &mb[c], &any, bc);
            }
        }
        /* the sign bits are the top bits of the odd bytes */
        if ((_mm256_movemask_epi8(any) & (int)0xaaaaaaaau) == 0) {
            for (int c = 0; c < nc; c++)
                _mm256_storeu_si256((__m256i *)(void *)(m + (size_t)c * LANES), mb[c]);
            return;
        }
        for (int c = 0; c < nc && best; c++)
            best[c] = (v16i){0} + (ylo * w + cl->xlo[c]);
    }
#endif
    v16f mf[MP_COLS];
    for (int c = 0; c < nc; c++)
        mf[c] = splat(-INFINITY);
    for (int iy = ylo; iy < yhi; iy++) {
        const uint16_t *r = x + (size_t)iy * (size_t)w * LANES;
        for (int c = 0; c < nc; c++) {
            v16i *bc = best ? &best[c] : NULL;
            if (c >= cl->in0 && c < cl->in1)
                for (int b = 0, ix = cl->xlo[c]; b < kw; b++, ix++)
                    mp_float_elem(r, ix, iy * w + ix, &mf[c], bc);
            else
                for (int ix = cl->xlo[c]; ix < cl->xhi[c]; ix++)
                    mp_float_elem(r, ix, iy * w + ix, &mf[c], bc);
        }
    }
    for (int c = 0; c < nc; c++)
        st16(m + (size_t)c * LANES, mf[c]);
}

BF16_TARGET static void mp_row_2(const struct rt_pool_desc *d, const uint16_t *x, int oy, const struct mp_cols *cl,
                                 uint16_t *m, v16i *best)
{
    mp_row(d, x, oy, cl, m, best, 2, 2);
}

BF16_TARGET static void mp_row_3(const struct rt_pool_desc *d, const uint16_t *x, int oy, const struct mp_cols *cl,
                                 uint16_t *m, v16i *best)
{
    mp_row(d, x, oy, cl, m, best, 3, 2);
}

BF16_TARGET static void mp_row_any(const struct rt_pool_desc *d, const uint16_t *x, int oy, const struct mp_cols *cl,
                                   uint16_t *m, v16i *best)
{
    mp_row(d, x, oy, cl, m, best, d->kw, d->stride);
}

typedef void (*mp_row_fn)(const struct rt_pool_desc *d, const uint16_t *x, int oy, const struct mp_cols *cl,
                          uint16_t *m, v16i *best);

static mp_row_fn mp_row_for(const struct rt_pool_desc *d)
{
    if (d->kw == 2 && d->stride == 2)
        return mp_row_2;
    if (d->kw == 3 && d->stride == 2)
        return mp_row_3;
    return mp_row_any;
}

/* The windows' columns for output columns [c0, c0 + nc). */
static void mp_cols_of(const struct rt_pool_desc *d, int c0, int nc, struct mp_cols *cl)
{
    int lo, hi;
    inner_range(d->kw, d->stride, d->pad, d->in.w, d->ow, &lo, &hi);
    cl->c0 = c0;
    cl->nc = nc;
    cl->in0 = RT_MAX(lo - c0, 0);
    cl->in1 = RT_MAX(RT_MIN(hi - c0, nc), cl->in0);
    for (int c = 0; c < nc; c++) {
        const int xs = (c0 + c) * d->stride - d->pad;
        cl->xlo[c] = xs > 0 ? xs : 0;
        cl->xhi[c] = xs + d->kw < d->in.w ? xs + d->kw : d->in.w;
    }
}

static void mp_block_fwd(const struct rt_pool_desc *d, const uint16_t *x, uint16_t *y)
{
    const mp_row_fn row = mp_row_for(d);
    struct mp_cols cl;
    for (int c0 = 0; c0 < d->ow; c0 += MP_COLS) {
        mp_cols_of(d, c0, RT_MIN(MP_COLS, d->ow - c0), &cl);
        for (int oy = 0; oy < d->oh; oy++)
            row(d, x, oy, &cl, y + ((size_t)oy * d->ow + (size_t)c0) * LANES, NULL);
    }
}

/* How a backward plane receives its gradients (mp_block_bwd). */
enum mp_store { MP_STORE = 0, MP_ADD, MP_ACC };

/*
 * The gradients g of output row oy, columns [c0, c0 + nc), to their
 * winners: over the windows' rows again, in memory order, each element
 * getting g where its lane won and 0 elsewhere -- stored (disjoint windows,
 * beta 0), added to dx (disjoint, beta 1) or added to the fp32 plane acc
 * (windows that overlap add up there, in output order as pool.c adds).
 */
BF16_TARGET static void mp_row_grad(const struct rt_pool_desc *d, int oy, const struct mp_cols *cl, const v16i *best,
                                    const uint16_t *g, uint16_t *dx, float *acc, enum mp_store how)
{
    const int w = d->in.w, ys = oy * d->stride - d->pad;
    const int ylo = ys > 0 ? ys : 0, yhi = ys + d->kh < d->in.h ? ys + d->kh : d->in.h;
    for (int iy = ylo; iy < yhi; iy++)
        for (int c = 0; c < cl->nc; c++) {
            const uint16_t *gc = g + (size_t)c * LANES;
            const v16f gv = ld16(gc);
            for (int ix = cl->xlo[c]; ix < cl->xhi[c]; ix++) {
                const size_t e = ((size_t)iy * (size_t)w + (size_t)ix) * LANES;
                const vmask won = eqi(best[c], iy * w + ix);
                if (how == MP_ACC) {
                    stf(acc + e, ldf(acc + e) + sel(won, gv, (v16f){0}));
                } else if (how == MP_ADD) {
                    st16(dx + e, ld16(dx + e) + sel(won, gv, (v16f){0}));
                } else {
#if defined(__x86_64__)
                    /* the gradient's own bits: nothing to convert */
                    const __m256i gb = _mm256_loadu_si256((const __m256i *)(const void *)gc);
                    _mm256_storeu_si256((__m256i *)(void *)(dx + e), _mm256_maskz_mov_epi16(won, gb));
#else
                    st16(dx + e, sel(won, gv, (v16f){0}));
#endif
                }
            }
        }
}

/*
 * One plane backward. Windows that do not overlap (stride >= window) give
 * each dx element at most one gradient, stored straight into dx (beta 0,
 * after zeroing what no window covers) or added to it (beta 1); windows
 * that overlap add into acc, an fp32 plane that starts as beta dx and is
 * rounded once at the end.
 */
static void mp_block_bwd(const struct rt_pool_desc *d, const uint16_t *x, const uint16_t *dy, float beta,
                         uint16_t *dx, float *acc)
{
    const size_t hw = (size_t)d->in.h * (size_t)d->in.w;
    const int disjoint = d->kh <= d->stride && d->kw <= d->stride;
    enum mp_store how = MP_ACC;
    if (disjoint && beta == 0.0f) {
        const int covers = d->pad == 0 && d->kh == d->stride && d->kw == d->stride && d->oh * d->stride == d->in.h &&
                           d->ow * d->stride == d->in.w;
        if (!covers)
            memset(dx, 0, hw * LANES * sizeof(*dx));
        how = MP_STORE;
    } else if (disjoint && beta == 1.0f) {
        how = MP_ADD;
    } else if (beta == 0.0f) {
        memset(acc, 0, hw * LANES * sizeof(*acc));
    } else {
        for (size_t p = 0; p < hw * LANES; p++)
            acc[p] = beta * rt_cpu_bf16_to_f32(dx[p]);
    }
    const mp_row_fn row = mp_row_for(d);
    uint16_t m[MP_COLS * LANES];
    v16i best[MP_COLS];
    struct mp_cols cl;
    for (int c0 = 0; c0 < d->ow; c0 += MP_COLS) {
        mp_cols_of(d, c0, RT_MIN(MP_COLS, d->ow - c0), &cl);
        for (int oy = 0; oy < d->oh; oy++) {
            row(d, x, oy, &cl, m, best);
            mp_row_grad(d, oy, &cl, best, dy + ((size_t)oy * d->ow + (size_t)c0) * LANES, dx, acc, how);
        }
    }
    if (how == MP_ACC)
        narrow_chunk(hw * LANES, acc, dx);
}

/* The (C, N, H, W) layout, one plane of H*W at a time, scalar: only odd channel counts get here. */
static size_t plane_argmax(const struct rt_pool_desc *d, const uint16_t *x, struct win b)
{
    const size_t w = (size_t)d->in.w;
    size_t best = (size_t)b.y0 * w + (size_t)b.x0;
    float m = rt_cpu_bf16_to_f32(x[best]);
    for (int iy = b.y0; iy < b.y1; iy++)
        for (int ix = b.x0; ix < b.x1; ix++) {
            const size_t i = (size_t)iy * w + (size_t)ix;
            const float v = rt_cpu_bf16_to_f32(x[i]);
            if (v > m || isnan(v)) {
                m = v;
                best = i;
            }
        }
    return best;
}

static void maxpool_plane_fwd(const struct rt_pool_desc *d, const uint16_t *x, uint16_t *y)
{
    for (int oy = 0; oy < d->oh; oy++)
        for (int ox = 0; ox < d->ow; ox++)
            y[(size_t)oy * d->ow + ox] = rt_cpu_f32_to_bf16(rt_cpu_bf16_to_f32(x[plane_argmax(d, x, window_of(d, oy, ox))]));
}

static void maxpool_plane_bwd(const struct rt_pool_desc *d, const uint16_t *x, const uint16_t *dy, float beta,
                              uint16_t *dx, float *acc)
{
    const size_t hw = (size_t)d->in.h * d->in.w;
    for (size_t i = 0; i < hw; i++)
        acc[i] = beta == 0.0f ? 0.0f : beta * rt_cpu_bf16_to_f32(dx[i]);
    for (int oy = 0; oy < d->oh; oy++)
        for (int ox = 0; ox < d->ow; ox++)
            acc[plane_argmax(d, x, window_of(d, oy, ox))] += rt_cpu_bf16_to_f32(dy[(size_t)oy * d->ow + ox]);
    for (size_t i = 0; i < hw; i++)
        dx[i] = rt_cpu_f32_to_bf16(acc[i]);
}

static void bf16_maxpool_fwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y)
{
    const struct geo g = geo_of(d->in);
    const size_t oplane = (size_t)d->oh * d->ow * (g.blocked ? LANES : 1);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (g.planes * g.plane >= PAR_MIN)
    for (size_t j = 0; j < g.planes; j++) {
        if (g.blocked)
            mp_block_fwd(d, cb16(x) + j * g.plane, mb16(y) + j * oplane);
        else
            maxpool_plane_fwd(d, cb16(x) + j * g.plane, mb16(y) + j * oplane);
    }
}

static void bf16_maxpool_bwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, const float *y,
                             const float *dy, float beta, float *dx)
{
    (void)y; /* the positions are recomputed from x, which settles ties the way forward did */
    const struct geo g = geo_of(d->in);
    const size_t oplane = (size_t)d->oh * d->ow * (g.blocked ? LANES : 1);
    const int nt = nthreads(s);
    /* one fp32 plane per thread for the windows that overlap */
    float *acc = scratch16(s, (size_t)nt * g.plane * sizeof(float));
#pragma omp parallel for schedule(static) num_threads(nt) if (g.planes * g.plane >= PAR_MIN)
    for (size_t j = 0; j < g.planes; j++) {
        float *a = acc + (size_t)omp_get_thread_num() * g.plane;
        if (g.blocked)
            mp_block_bwd(d, cb16(x) + j * g.plane, cb16(dy) + j * oplane, beta, mb16(dx) + j * g.plane, a);
        else
            maxpool_plane_bwd(d, cb16(x) + j * g.plane, cb16(dy) + j * oplane, beta, mb16(dx) + j * g.plane, a);
    }
}

/* ==== average pooling: the fp32 kernel on widened copies (no model uses it) ==== */

static void bf16_avgpool_fwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y)
{
    const size_t nx = (size_t)d->in.n * d->in.c * d->in.h * d->in.w, ny = (size_t)d->in.n * d->in.c * d->oh * d->ow;
    const size_t bytes[2] = {nx * sizeof(float), ny * sizeof(float)};
    void *p[2];
    scratch16_parts(s, bytes, p, 2);
    widen(s, nx, cb16(x), p[0]);
    rt_cpu_avgpool_fwd(s, d, p[0], p[1]);
    narrow(s, ny, p[1], mb16(y));
}

static void bf16_avgpool_bwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *dy, float beta, float *dx)
{
    const size_t nx = (size_t)d->in.n * d->in.c * d->in.h * d->in.w, ny = (size_t)d->in.n * d->in.c * d->oh * d->ow;
    const size_t bytes[2] = {ny * sizeof(float), nx * sizeof(float)};
    void *p[2];
    scratch16_parts(s, bytes, p, 2);
    widen(s, ny, cb16(dy), p[0]);
    if (beta != 0.0f) /* the fp32 kernel adds into beta dx: widen it first */
        widen(s, nx, cb16(dx), p[1]);
    rt_cpu_avgpool_bwd(s, d, p[0], beta, p[1]);
    narrow(s, nx, p[1], mb16(dx));
}

/* ==== global average pooling and flatten ================================== */

/* Sums in fp32 pixel by pixel, as pool.c, times 1/HW; features (N, C) row-major. */
BF16_TARGET static void gap_block(const uint16_t *x, size_t hw, float inv, uint16_t *y16)
{
    v16f acc = {0};
    for (size_t p = 0; p < hw; p++)
        acc += ld16(x + p * LANES);
    st16(y16, acc * inv);
}

static void bf16_gap_fwd(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y)
{
    const struct geo g = geo_of(sh);
    const float inv = 1.0f / (float)g.hw;
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (g.planes * g.plane >= PAR_MIN)
    for (size_t j = 0; j < g.planes; j++) {
        size_t n, c;
        plane_nc(&g, j, &n, &c);
        const uint16_t *src = cb16(x) + j * g.plane;
        uint16_t *dst = mb16(y) + n * g.c + c;
        if (g.blocked) {
            gap_block(src, g.hw, inv, dst);
            continue;
        }
        float acc = 0.0f;
        for (size_t p = 0; p < g.hw; p++)
            acc += rt_cpu_bf16_to_f32(src[p]);
        *dst = rt_cpu_f32_to_bf16(acc * inv);
    }
}

BF16_TARGET static void gap_bwd_block(const uint16_t *dy16, size_t hw, float inv, float beta, uint16_t *dx)
{
    const v16f v = ld16(dy16) * inv, b = splat(beta);
    for (size_t p = 0; p < hw; p++)
        st16(dx + p * LANES, beta == 0.0f ? v : b * ld16(dx + p * LANES) + v);
}

static void bf16_gap_bwd(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx)
{
    const struct geo g = geo_of(sh);
    const float inv = 1.0f / (float)g.hw;
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (g.planes * g.plane >= PAR_MIN)
    for (size_t j = 0; j < g.planes; j++) {
        size_t n, c;
        plane_nc(&g, j, &n, &c);
        const uint16_t *src = cb16(dy) + n * g.c + c;
        uint16_t *dst = mb16(dx) + j * g.plane;
        if (g.blocked) {
            gap_bwd_block(src, g.hw, inv, beta, dst);
            continue;
        }
        const float v = rt_cpu_bf16_to_f32(*src) * inv;
        for (size_t p = 0; p < g.hw; p++)
            dst[p] = rt_cpu_f32_to_bf16(beta == 0.0f ? v : beta * rt_cpu_bf16_to_f32(dst[p]) + v);
    }
}

/*
 * 16 x 16 tiles of 16-bit elements between a blocked plane (pixel-major, 16
 * lanes a pixel) and features (channel-major rows of HW): tile_t reads 16
 * rows of 16 elements, src + i*ss, and writes their transpose, dst + l*ds,
 * in 64 shuffles (interleaving words, then pairs, quads and halves);
 * beta 1 adds the transpose to what dst holds. The strided scalar loop it
 * replaces spent 2.6 cycles an element.
 */
#if defined(__x86_64__)
BF16_TARGET static void tile_t(const uint16_t *src, size_t ss, uint16_t *dst, size_t ds, float beta)
{
    __m256i r[16], a[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm256_loadu_si256((const __m256i *)(const void *)(src + (size_t)i * ss));
    for (int i = 0; i < 8; i++) {
        a[2 * i] = _mm256_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm256_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
    }
    for (int q = 0; q < 4; q++) { /* rows 4q .. 4q+3 */
        r[4 * q + 0] = _mm256_unpacklo_epi32(a[4 * q], a[4 * q + 2]);
        r[4 * q + 1] = _mm256_unpackhi_epi32(a[4 * q], a[4 * q + 2]);
        r[4 * q + 2] = _mm256_unpacklo_epi32(a[4 * q + 1], a[4 * q + 3]);
        r[4 * q + 3] = _mm256_unpackhi_epi32(a[4 * q + 1], a[4 * q + 3]);
    }
    for (int o = 0; o < 2; o++) /* rows 8o .. 8o+7: a[8o + j] holds columns j (low half) and 8 + j (high half) */
        for (int m = 0; m < 4; m++) {
            a[8 * o + 2 * m] = _mm256_unpacklo_epi64(r[8 * o + m], r[8 * o + 4 + m]);
            a[8 * o + 2 * m + 1] = _mm256_unpackhi_epi64(r[8 * o + m], r[8 * o + 4 + m]);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm256_permute2x128_si256(a[j], a[8 + j], 0x20);
        r[8 + j] = _mm256_permute2x128_si256(a[j], a[8 + j], 0x31);
    }
    for (int l = 0; l < 16; l++) {
        uint16_t *o = dst + (size_t)l * ds;
        if (beta == 0.0f) {
            _mm256_storeu_si256((__m256i *)(void *)o, r[l]);
        } else {
            const v16f v = (v16f)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(r[l]), 16));
            st16(o, splat(beta) * ld16(o) + v);
        }
    }
}
#endif

/* Features (N, C*H*W) in PyTorch's (c, h, w) order: element (n, c, p) at (n*C + c)*HW + p. */
static void bf16_flatten_fwd(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y)
{
    const struct geo g = geo_of(sh);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (g.planes * g.plane >= PAR_MIN)
    for (size_t j = 0; j < g.planes; j++) {
        size_t n, c;
        plane_nc(&g, j, &n, &c);
        const uint16_t *src = cb16(x) + j * g.plane;
        uint16_t *dst = mb16(y) + (n * g.c + c) * g.hw;
        if (!g.blocked) {
            memcpy(dst, src, g.hw * sizeof(*dst));
            continue;
        }
        size_t p0 = 0;
#if defined(__x86_64__)
        for (; p0 + 16 <= g.hw; p0 += 16)
            tile_t(src + p0 * LANES, LANES, dst + p0, g.hw, 0.0f);
#endif
        for (size_t l = 0; l < LANES; l++)
            for (size_t p = p0; p < g.hw; p++)
                dst[l * g.hw + p] = src[p * LANES + l];
    }
}

static void bf16_flatten_bwd(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx)
{
    const struct geo g = geo_of(sh);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (g.planes * g.plane >= PAR_MIN)
    for (size_t j = 0; j < g.planes; j++) {
        size_t n, c;
        plane_nc(&g, j, &n, &c);
        const uint16_t *src = cb16(dy) + (n * g.c + c) * g.hw;
        uint16_t *dst = mb16(dx) + j * g.plane;
        const size_t lanes = g.blocked ? LANES : 1;
        size_t p0 = 0;
#if defined(__x86_64__)
        for (; g.blocked && p0 + 16 <= g.hw; p0 += 16)
            tile_t(src + p0, g.hw, dst + p0 * LANES, LANES, beta);
#endif
        for (size_t l = 0; l < lanes; l++)
            for (size_t p = p0; p < g.hw; p++) {
                uint16_t *o = dst + p * lanes + l;
                const uint16_t v = src[l * g.hw + p];
                *o = beta == 0.0f ? v : rt_cpu_f32_to_bf16(beta * rt_cpu_bf16_to_f32(*o) + rt_cpu_bf16_to_f32(v));
            }
    }
}

/* ==== linear =============================================================== */

/*
 * PyTorch's autocast: activations and weights in bf16 (the weights rounded
 * per call), products summed in fp32, the bias added in fp32, the output
 * rounded once: oneDNN's bf16 matmul on the AVX512_BF16 dot products
 * (rt_cpu_dnnl_matmul, its primitive kept per shape).
 */

static void bf16_linear_fwd(struct rt_stream *s, int n, int in, int out, const float *x, const float *w,
                            const float *b, float *y)
{
    if (n <= 0)
        return;
    const size_t nw = (size_t)out * in, bytes[1] = {nw * sizeof(uint16_t)};
    void *p[1];
    scratch16_parts(s, bytes, p, 1);
    uint16_t *wb = p[0];
    narrow(s, nw, w, wb); /* the weights cast per call, as autocast */
    /* y (n, out) = x (n, in) w^T: w^T's element (k, o) at wb[o*in + k] */
    const struct rt_cpu_mm_arg a = {x, 1, n, in, in, 1}, bw = {wb, 1, in, out, 1, in}, c = {y, 1, n, out, out, 1};
    rt_cpu_dnnl_matmul(s, &a, &bw, b, &c, 0);
}

static void bf16_linear_bwd_data(struct rt_stream *s, int n, int in, int out, const float *dy, const float *w,
                                 float beta, float *dx)
{
    if (n <= 0)
        return;
    const size_t nw = (size_t)out * in, bytes[1] = {nw * sizeof(uint16_t)};
    void *p[1];
    scratch16_parts(s, bytes, p, 1);
    uint16_t *wb = p[0];
    narrow(s, nw, w, wb); /* the weights cast per call, as autocast */
    /* dx (n, in) = dy (n, out) w (out, in), plus dx when beta is 1 (the sum post-op: one rounding) */
    const struct rt_cpu_mm_arg a = {dy, 1, n, out, out, 1}, bw = {wb, 1, out, in, in, 1}, c = {dx, 1, n, in, in, 1};
    rt_cpu_dnnl_matmul(s, &a, &bw, NULL, &c, beta != 0.0f);
}

static void bf16_linear_bwd_filter(struct rt_stream *s, int n, int in, int out, const float *x, const float *dy,
                                   float *dw, float *db)
{
    if (n <= 0)
        return;
    const uint16_t *gh = cb16(dy);
    if (db) {
        /* column sums of dy over the batch, in order, as pool.c */
        for (int o = 0; o < out; o++) {
            float acc = 0.0f;
            for (int i = 0; i < n; i++)
                acc += rt_cpu_bf16_to_f32(gh[(size_t)i * out + o]);
            db[o] += acc;
        }
    }
    /* fp32 parameter gradients: dw (out, in) += dy^T (out, n) x (n, in), added to by the sum post-op */
    const struct rt_cpu_mm_arg a = {dy, 1, out, n, 1, out}, bx = {x, 1, n, in, in, 1}, c = {dw, 0, out, in, in, 1};
    rt_cpu_dnnl_matmul(s, &a, &bx, NULL, &c, 1);
}

/* ==== activations ========================================================== */

BF16_TARGET static void relu_fwd_chunk(size_t n, const uint16_t *x, uint16_t *y)
{
    /* `x < 0 ? 0 : x` lets NaN through, as torch.relu does */
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        const v16f v = ld16(x + i);
        st16(y + i, sel(gt((v16f){0}, v), (v16f){0}, v));
    }
    if (i < n) {
        const v16f v = ldn(x + i, n - i);
        stn(y + i, sel(gt((v16f){0}, v), (v16f){0}, v), n - i);
    }
}

static void bf16_relu_fwd(struct rt_stream *s, size_t n, const float *x, float *y)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK;
        relu_fwd_chunk(RT_MIN(n - lo, CHUNK), cb16(x) + lo, mb16(y) + lo);
    }
}

/* 0 (not NaN) where y <= 0 even for a NaN dy, as PyTorch's threshold_backward: a select. */
BF16_TARGET static void relu_bwd_chunk(size_t n, const uint16_t *y, const uint16_t *dy, float beta, uint16_t *dx)
{
    const v16f bv = splat(beta);
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        const v16f g = sel(gt(ld16(y + i), (v16f){0}), ld16(dy + i), (v16f){0});
        st16(dx + i, beta == 0.0f ? g : bv * ld16(dx + i) + g);
    }
    if (i < n) {
        const size_t r = n - i;
        const v16f g = sel(gt(ldn(y + i, r), (v16f){0}), ldn(dy + i, r), (v16f){0});
        stn(dx + i, beta == 0.0f ? g : bv * ldn(dx + i, r) + g, r);
    }
}

static void bf16_relu_bwd(struct rt_stream *s, size_t n, const float *y, const float *dy, float beta, float *dx)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK;
        relu_bwd_chunk(RT_MIN(n - lo, CHUNK), cb16(y) + lo, cb16(dy) + lo, beta, mb16(dx) + lo);
    }
}

/* torch.nn.GELU(), elem.c's expressions (scalar: erff has no vector form here). */
#define GELU_ALPHA 0.70710678118654752440f /* 1/sqrt(2) */
#define GELU_BETA 0.39894228040143267794f  /* 1/sqrt(2 pi) */

static void bf16_gelu_fwd(struct rt_stream *s, size_t n, const float *x, float *y)
{
    const uint16_t *xh = cb16(x);
    uint16_t *yh = mb16(y);
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN / 8)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK, hi = RT_MIN(n, lo + CHUNK);
        for (size_t i = lo; i < hi; i++) {
            const float v = rt_cpu_bf16_to_f32(xh[i]);
            yh[i] = rt_cpu_f32_to_bf16(v * 0.5f * (1.0f + erff(v * GELU_ALPHA)));
        }
    }
}

static void bf16_gelu_bwd(struct rt_stream *s, size_t n, const float *x, const float *dy, float beta, float *dx)
{
    const uint16_t *xh = cb16(x), *gh = cb16(dy);
    uint16_t *dxh = mb16(dx);
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN / 8)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK, hi = RT_MIN(n, lo + CHUNK);
        for (size_t i = lo; i < hi; i++) {
            const float v = rt_cpu_bf16_to_f32(xh[i]);
            const float cdf = 0.5f * (1.0f + erff(v * GELU_ALPHA));
            const float pdf = GELU_BETA * expf(v * v * -0.5f);
            const float g = rt_cpu_bf16_to_f32(gh[i]) * (cdf + v * pdf);
            dxh[i] = rt_cpu_f32_to_bf16(beta == 0.0f ? g : beta * rt_cpu_bf16_to_f32(dxh[i]) + g);
        }
    }
}

/* ==== dropout ============================================================== */

/* Elements per mask tile (flat layouts) and pixels per tile (blocked): stack arrays of multipliers. */
#define DROP_TILE 1024
#define DROP_PIX 64


#if defined(__x86_64__)
/*
 * Philox4x32-10 (common/philox.h) of 16 dropout counters at once, one per
 * 32-bit lane: block blk = c1:c0 of each lane, key `seed`, counter (c0, c1,
 * 0, RT_DROPOUT_CTR3). The same words as rt_dropout_block(), an eighth of
 * the instructions per element: the scalar rounds made dropout 12 % of an
 * mnist-net step.
 */
BF16_INLINE void philox16(uint64_t seed, __m512i c0, __m512i c1, __m512i w[4])
{
    const __m512i m0 = _mm512_set1_epi32((int)0xD2511F53u), m1 = _mm512_set1_epi32((int)0xCD9E8D57u);
    __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_set1_epi32((int)RT_DROPOUT_CTR3);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        /* 32 x 32 -> 64-bit products: even lanes from one multiply, odd lanes from another */
        const __m512i p0e = _mm512_mul_epu32(c0, m0), p0o = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), m0);
        const __m512i p1e = _mm512_mul_epu32(c2, m1), p1o = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), m1);
        const __m512i hi0 = _mm512_mask_blend_epi32(0xaaaa, _mm512_srli_epi64(p0e, 32), p0o);
        const __m512i hi1 = _mm512_mask_blend_epi32(0xaaaa, _mm512_srli_epi64(p1e, 32), p1o);
        const __m512i lo0 = _mm512_mask_blend_epi32(0xaaaa, p0e, _mm512_slli_epi64(p0o, 32));
        const __m512i lo1 = _mm512_mask_blend_epi32(0xaaaa, p1e, _mm512_slli_epi64(p1o, 32));
        /* a ^ b ^ c: truth table 0x96 */
        c0 = _mm512_ternarylogic_epi32(hi1, c1, _mm512_set1_epi32((int)k0), 0x96);
        c2 = _mm512_ternarylogic_epi32(hi0, c3, _mm512_set1_epi32((int)k1), 0x96);
        c1 = lo1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    w[0] = c0;
    w[1] = c1;
    w[2] = c2;
    w[3] = c3;
}

/* rt_dropout_mul_of() of 16 words: scale where (w >> 8) 2^-24 >= p, else 0. */
BF16_INLINE __m512 mul_of16(__m512i w, float p, float scale)
{
    const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(w, 8)), _mm512_set1_ps(1.0f / 16777216.0f));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(u, _mm512_set1_ps(p), _CMP_GE_OQ), _mm512_set1_ps(scale));
}

/* The counters (lo, hi words) of blocks base + add per lane, the carry out of the low word included. */
BF16_INLINE void blk_add(__m512i lo, __m512i hi, __m512i add, __m512i *c0, __m512i *c1)
{
    *c0 = _mm512_add_epi32(lo, add);
    *c1 = _mm512_mask_add_epi32(hi, _mm512_cmplt_epu32_mask(*c0, lo), hi, _mm512_set1_epi32(1));
}

/* rt_dropout_mask with step 1, 16 Philox blocks (64 elements) at a time. */
BF16_TARGET static void dropout_mask_vec(uint64_t seed, uint64_t e0, size_t len, float p, float scale, float *mul)
{
    const uint64_t end = e0 + len;
    const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (uint64_t b = e0 >> 2; 4 * b < end; b += 16) {
        __m512i c0, c1, w[4];
        blk_add(_mm512_set1_epi32((int)(uint32_t)b), _mm512_set1_epi32((int)(uint32_t)(b >> 32)), iota, &c0, &c1);
        philox16(seed, c0, c1, w);
        float t[4][16];
        for (int j = 0; j < 4; j++)
            _mm512_storeu_ps(t[j], mul_of16(w[j], p, scale));
        const uint64_t lo = RT_MAX(e0, 4 * b), hi = RT_MIN(end, 4 * b + 64);
        for (uint64_t e = lo; e < hi; e++)
            mul[e - e0] = t[e & 3][(e >> 2) - b];
    }
}

/*
 * Multipliers of 16 runs at once, one per channel of a blocked plane: lane
 * l's pixels p < len are stream elements e[l] + p, and their multipliers go
 * to mul[p*16 + l], a pixel's 16 channels one vector. Each lane walks its
 * own blocks, one Philox block per 4 pixels; where e[l] is not a multiple
 * of 4, a pixel's word comes from the block after, by the lane's phase.
 */
BF16_TARGET static void dropout_mask_lanes(uint64_t seed, const uint64_t *e, size_t len, float p, float scale,
                                           float *mul)
{
    uint32_t blo[LANES], bhi[LANES];
    __mmask16 ph1 = 0, ph2 = 0, ph3 = 0;
    for (int l = 0; l < LANES; l++) {
        const uint64_t b = e[l] >> 2;
        blo[l] = (uint32_t)b;
        bhi[l] = (uint32_t)(b >> 32);
        const unsigned ph = (unsigned)(e[l] & 3);
        ph1 |= (__mmask16)((ph == 1) << l);
        ph2 |= (__mmask16)((ph == 2) << l);
        ph3 |= (__mmask16)((ph == 3) << l);
    }
    const __m512i lo = _mm512_loadu_si512(blo), hi = _mm512_loadu_si512(bhi);
    __m512i c0, c1, v[8];
    blk_add(lo, hi, _mm512_setzero_si512(), &c0, &c1);
    philox16(seed, c0, c1, v);
    for (size_t q = 0; 4 * q < len; q++) {
        blk_add(lo, hi, _mm512_set1_epi32((int)(q + 1)), &c0, &c1);
        philox16(seed, c0, c1, v + 4);
        for (size_t i = 0; i < 4 && 4 * q + i < len; i++) {
            __m512i r = _mm512_mask_mov_epi32(v[i], ph1, v[i + 1]);
            r = _mm512_mask_mov_epi32(r, ph2, v[i + 2]);
            r = _mm512_mask_mov_epi32(r, ph3, v[i + 3]);
            _mm512_storeu_ps(mul + (4 * q + i) * LANES, mul_of16(r, p, scale));
        }
        for (int j = 0; j < 4; j++)
            v[j] = v[j + 4];
    }
}
#endif

/* y = x * mul (beta 0) or beta y + x * mul; multiplying gives NaN for a dropped Inf, as torch's x * mask. */
BF16_TARGET static void dropout_mul(size_t n, const uint16_t *x, const float *mul, float beta, uint16_t *y)
{
    const v16f bv = splat(beta);
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        const v16f v = ld16(x + i) * ldf(mul + i);
        st16(y + i, beta == 0.0f ? v : bv * ld16(y + i) + v);
    }
    for (; i < n; i++) {
        const float v = rt_cpu_bf16_to_f32(x[i]) * mul[i];
        y[i] = rt_cpu_f32_to_bf16(beta == 0.0f ? v : beta * rt_cpu_bf16_to_f32(y[i]) + v);
    }
}

/*
 * Forward (beta 0) and backward share this routine, so backward's mask is
 * forward's by construction. Flat layouts ((C, N, H, W) planes, features)
 * walk memory in tiles, a run of consecutive logical indices at a time, as
 * elem.c. A blocked plane (n, 16 channels) draws each channel's run of
 * pixels -- consecutive logical indices -- into a pixel-major tile, so the
 * multipliers of one pixel's 16 channels are one vector.
 */
static void dropout_apply(struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,
                          uint64_t offset, const uint16_t *x, float beta, uint16_t *y)
{
    const size_t n = (size_t)sh.n * sh.c * sh.h * sh.w;
    const float scale = rt_dropout_scale(p);
    if (spatial && rt_cpu_blocked(sh)) {
        const struct geo g = geo_of(sh);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN / 8)
        for (size_t j = 0; j < g.planes; j++) {
            size_t img, c0;
            plane_nc(&g, j, &img, &c0);
            float mul[DROP_PIX * LANES];
            for (size_t p0 = 0; p0 < g.hw; p0 += DROP_PIX) {
                const size_t len = RT_MIN(g.hw - p0, (size_t)DROP_PIX);
#if defined(__x86_64__)
                uint64_t e[LANES];
                for (size_t l = 0; l < LANES; l++)
                    e[l] = offset + (img * g.c + c0 + l) * g.hw + p0;
                dropout_mask_lanes(seed, e, len, p, scale, mul);
#else
                for (size_t l = 0; l < LANES; l++)
                    rt_dropout_mask(seed, offset + (img * g.c + c0 + l) * g.hw + p0, len, p, scale, mul + l, LANES);
#endif
                const size_t o = j * g.plane + p0 * LANES;
                dropout_mul(len * LANES, x + o, mul, beta, y + o);
            }
        }
        return;
    }
    const enum rt_dropout_layout lay = spatial ? RT_DROPOUT_CNHW : RT_DROPOUT_FEATURES;
    const size_t nt = (n + DROP_TILE - 1) / DROP_TILE;
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN / 8)
    for (size_t t = 0; t < nt; t++) {
        const size_t lo = t * DROP_TILE, len = RT_MIN(n - lo, (size_t)DROP_TILE);
        float mul[DROP_TILE];
        for (size_t j = 0; j < len;) {
            const uint64_t i = lo + j;
            const size_t run = (size_t)RT_MIN(rt_dropout_run(lay, sh, i), (uint64_t)(len - j));
#if defined(__x86_64__)
            dropout_mask_vec(seed, offset + rt_dropout_logical(lay, sh, i), run, p, scale, mul + j);
#else
            rt_dropout_mask(seed, offset + rt_dropout_logical(lay, sh, i), run, p, scale, mul + j, 1);
#endif
            j += run;
        }
        dropout_mul(len, x + lo, mul, beta, y + lo);
    }
}

static void bf16_dropout_fwd(struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,
                             uint64_t offset, const uint64_t *stream, const float *x, float *y)
{
    rt_dropout_stream_draw(stream, &seed, &offset);
    dropout_apply(s, sh, spatial, p, seed, offset, cb16(x), 0.0f, mb16(y));
}

static void bf16_dropout_bwd(struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,
                             uint64_t offset, const uint64_t *stream, const float *dy, float beta, float *dx)
{
    rt_dropout_stream_draw(stream, &seed, &offset);
    dropout_apply(s, sh, spatial, p, seed, offset, cb16(dy), beta, mb16(dx));
}

/* ==== add, scale, axpy ===================================================== */

BF16_TARGET static void add_chunk(size_t n, const uint16_t *a, const uint16_t *b, uint16_t *y)
{
    size_t i = 0;
    for (; i + LANES <= n; i += LANES)
        st16(y + i, ld16(a + i) + ld16(b + i));
    if (i < n)
        stn(y + i, ldn(a + i, n - i) + ldn(b + i, n - i), n - i);
}

/* y = y + alpha x (a == NULL: y = alpha y), alpha x rounded to fp32 first, as elem.c. */
BF16_TARGET static void axpy_chunk(size_t n, float alpha, const uint16_t *x, uint16_t *y)
{
    const v16f av = splat(alpha);
    size_t i = 0;
    if (!x) {
        for (; i + LANES <= n; i += LANES)
            st16(y + i, ld16(y + i) * av);
        if (i < n)
            stn(y + i, ldn(y + i, n - i) * av, n - i);
        return;
    }
    for (; i + LANES <= n; i += LANES)
        st16(y + i, ld16(y + i) + av * ld16(x + i));
    if (i < n)
        stn(y + i, ldn(y + i, n - i) + av * ldn(x + i, n - i), n - i);
}

static void bf16_add(struct rt_stream *s, size_t n, const float *a, const float *b, float *y)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t k = 0; k < nb; k++) {
        const size_t lo = k * CHUNK;
        add_chunk(RT_MIN(n - lo, CHUNK), cb16(a) + lo, cb16(b) + lo, mb16(y) + lo);
    }
}

/* add then relu_fwd over each chunk while it is in cache: the unfused ops' bits (a ReLU of a rounded sum). */
static void bf16_add_relu_fwd(struct rt_stream *s, size_t n, const float *a, const float *b, float *y)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t k = 0; k < nb; k++) {
        const size_t lo = k * CHUNK, len = RT_MIN(n - lo, CHUNK);
        add_chunk(len, cb16(a) + lo, cb16(b) + lo, mb16(y) + lo);
        relu_fwd_chunk(len, mb16(y) + lo, mb16(y) + lo);
    }
}

/* relu_bwd into each input's gradient, chunk by chunk (y and dy from cache the second time). */
static void bf16_add_relu_bwd(struct rt_stream *s, size_t n, const float *y, const float *dy, float beta_a, float *dxa,
                              float beta_b, float *dxb)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t k = 0; k < nb; k++) {
        const size_t lo = k * CHUNK, len = RT_MIN(n - lo, CHUNK);
        if (dxa)
            relu_bwd_chunk(len, cb16(y) + lo, cb16(dy) + lo, beta_a, mb16(dxa) + lo);
        if (dxb)
            relu_bwd_chunk(len, cb16(y) + lo, cb16(dy) + lo, beta_b, mb16(dxb) + lo);
    }
}

static void bf16_scale(struct rt_stream *s, size_t n, float alpha, float *x)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t k = 0; k < nb; k++) {
        const size_t lo = k * CHUNK;
        axpy_chunk(RT_MIN(n - lo, CHUNK), alpha, NULL, mb16(x) + lo);
    }
}

static void bf16_axpy(struct rt_stream *s, size_t n, float alpha, const float *x, float *y)
{
    const size_t nb = nchunks(n);
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t k = 0; k < nb; k++) {
        const size_t lo = k * CHUNK;
        axpy_chunk(RT_MIN(n - lo, CHUNK), alpha, cb16(x) + lo, mb16(y) + lo);
    }
}

/* ==== loss ================================================================= */

/* The fp32 kernel on widened logits: (N, K) is small, and the sums stay the fp32 table's exactly. */
static void bf16_xent_fwd_bwd(struct rt_stream *s, int n, int k, const float *logits, const int32_t *labels,
                              float label_smoothing, float grad_scale, const float *loss_scale,
                              struct rt_loss_stats *stats, float *dlogits)
{
    if (n <= 0 || k <= 0)
        return;
    const size_t nz = (size_t)n * k;
    const size_t bytes[2] = {nz * sizeof(float), dlogits ? nz * sizeof(float) : 0};
    void *p[2];
    scratch16_parts(s, bytes, p, 2);
    widen(s, nz, cb16(logits), p[0]);
    rt_cpu_xent_fwd_bwd(s, n, k, p[0], labels, label_smoothing, grad_scale, loss_scale, stats, dlogits ? p[1] : NULL);
    if (dlogits)
        narrow(s, nz, p[1], mb16(dlogits));
}

/* ==== reductions =========================================================== */

static void bf16_sumsq(struct rt_stream *s, size_t n, const float *x, float *out)
{
    const uint16_t *xh = cb16(x);
    const size_t nb = nchunks(n);
    double *part = scratch16(s, (nb + 1) * sizeof(double));
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK, hi = RT_MIN(n, lo + CHUNK);
        /* four partials so the adds overlap; a square of a bf16 is exact in double */
        double a[4] = {0.0, 0.0, 0.0, 0.0};
        size_t i = lo;
        for (; i + 4 <= hi; i += 4)
            for (int q = 0; q < 4; q++) {
                const double v = rt_cpu_bf16_to_f32(xh[i + (size_t)q]);
                a[q] += v * v;
            }
        for (; i < hi; i++) {
            const double v = rt_cpu_bf16_to_f32(xh[i]);
            a[0] += v * v;
        }
        part[b] = (a[0] + a[1]) + (a[2] + a[3]);
    }
    double total = 0.0;
    for (size_t b = 0; b < nb; b++)
        total += part[b];
    *out = (float)total;
}

static void bf16_count_nonfinite(struct rt_stream *s, size_t n, const float *x, float *out)
{
    const uint16_t *xh = cb16(x);
    const size_t nb = nchunks(n);
    size_t *part = scratch16(s, (nb + 1) * sizeof(size_t));
#pragma omp parallel for schedule(static) num_threads(nthreads(s)) if (n >= PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        const size_t lo = b * CHUNK, hi = RT_MIN(n, lo + CHUNK);
        uint32_t c = 0;
        /* an all-ones exponent is Inf or NaN */
#pragma omp simd reduction(+ : c)
        for (size_t i = lo; i < hi; i++)
            c += (xh[i] & 0x7f80u) == 0x7f80u;
        part[b] = c;
    }
    size_t total = 0;
    for (size_t b = 0; b < nb; b++)
        total += part[b];
    *out = (float)total;
}

/* ==== the table ============================================================ */

void rt_cpu_fill_bf16(struct rt_ops *t)
{
    /* The batchnorm ops fuse a ReLU (rt_bn_desc.relu) bit for bit as this table's batchnorm then ReLU (see
     * relu_clip), so the model may fuse them. */
    t->bn_relu = 1;
    t->add_relu = 1; /* add then ReLU's bits, in one pass */
    t->to_nchw = bf16_to_nchw;
    t->from_nchw = bf16_from_nchw;
    t->input_u8 = bf16_input_u8;
    t->input_u8_dev = bf16_input_u8_dev;
    t->bn_train_fwd = bf16_bn_train_fwd;
    t->bn_infer_fwd = bf16_bn_infer_fwd;
    t->bn_bwd = bf16_bn_bwd;
    t->bn_infer_bwd = bf16_bn_infer_bwd;
    t->maxpool_fwd = bf16_maxpool_fwd;
    t->maxpool_bwd = bf16_maxpool_bwd;
    t->avgpool_fwd = bf16_avgpool_fwd;
    t->avgpool_bwd = bf16_avgpool_bwd;
    t->gap_fwd = bf16_gap_fwd;
    t->gap_bwd = bf16_gap_bwd;
    t->flatten_fwd = bf16_flatten_fwd;
    t->flatten_bwd = bf16_flatten_bwd;
    t->linear_fwd = bf16_linear_fwd;
    t->linear_bwd_data = bf16_linear_bwd_data;
    t->linear_bwd_filter = bf16_linear_bwd_filter;
    t->relu_fwd = bf16_relu_fwd;
    t->relu_bwd = bf16_relu_bwd;
    t->gelu_fwd = bf16_gelu_fwd;
    t->gelu_bwd = bf16_gelu_bwd;
    t->dropout_fwd = bf16_dropout_fwd;
    t->dropout_bwd = bf16_dropout_bwd;
    t->add = bf16_add;
    t->add_relu_fwd = bf16_add_relu_fwd;
    t->add_relu_bwd = bf16_add_relu_bwd;
    t->scale = bf16_scale;
    t->axpy = bf16_axpy;
    t->xent_fwd_bwd = bf16_xent_fwd_bwd;
    t->sumsq = bf16_sumsq;
    t->count_nonfinite = bf16_count_nonfinite;
}
