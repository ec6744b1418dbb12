/*
 * resize.c - resizing for pack --size/--max-side and for the load-time crop:
 * one box of an HWC uint8 image into CHW planes (with an optional mirror and
 * destination rectangle) or into another HWC image, and the fit geometry of
 * pack --size. It does no decoding, no colour conversion and no random
 * choices (the box comes from rrc.c or rt_fit_geometry).
 *
 * rt_resize_box_chw and rt_resize_hwc are our own implementation of Pillow
 * 9.4's BILINEAR resampling for 8-bit images (libImaging/Resample.c, written
 * here from its description) and reproduce Pillow's output value for value:
 *  - per axis, a triangle filter whose support grows with the downscale
 *    factor, centred at in0 + (i + 0.5) * scale, its window clamped to the
 *    WHOLE image (not the box: pixels around the box take part, as in
 *    resize(box=...)), weights normalised in double and rounded to 22-bit
 *    fixed point;
 *  - two passes, horizontal first over just the source rows the vertical
 *    pass reads, each value 2^21 + sum(in * weight) shifted right by 22 and
 *    clamped to 0..255, into a uint8 temporary image.
 * Pillow takes a box as four float32 edges, and so do we, with one
 * exception: a box that is a whole-pixel window of a whole-image resize
 * (rt_fit_geometry's CROP) is computed as that resize, so pack --size equals
 * torchvision's Resize(S) + CenterCrop(S) exactly; through float32 edges
 * 42 of 60 random images differed from it in 0.07 % of the values (by 1).
 *
 * Why our own code: neither stb_image_resize (used here before: float, edge
 * pixels repeated where Pillow renormalises; 6-17 % of the values differ,
 * 53-60 dB) nor swscale (no fractional box; 5-27 dB worse on crops) gives
 * Pillow's values, and stb v1 (no SIMD) took as long as decoding the JPEG.
 * The arithmetic is all integer after the tables, so vector kernels can be
 * exact: the horizontal pass transposes 16 source rows at a time (SSE2
 * unpacks) so that one vector holds one column of them, then per output and
 * tap multiplies by the broadcast weight (AVX-512BW: 16 int32 lanes; AVX2:
 * two vectors of 8); the vertical pass runs along the row (one weight per
 * source row). The kernel is chosen once per resizer from the CPU
 * (__builtin_cpu_supports), or by RT_RESIZE_KERNEL=scalar|avx2|avx512 at
 * create (tests compare the plain C kernel, which any CPU runs, with both).
 * Tables are built into the resizer's scratch and kept for the next call
 * with the same geometry (building them took ~8 % of a 500x375 -> 224 call;
 * pack meets the same sizes again and again); nothing is allocated once the
 * scratch has grown.
 *
 * Speed, median thread CPU time per 224x224 output, one thread, AMD EPYC
 * (Zen 4, 2 cores, shared), bench/resize_quality.py (values that differ from
 * Pillow BILINEAR: 0 in all 12 of its cases for all three kernels):
 *
 *   source box                   avx512   avx2    scalar   Pillow 9.4   stb tri (before)
 *   500x375 CROP fit (375.8x375)  0.089   0.107   0.93     0.92 ms      1.16 ms
 *   500x375 whole                 0.106   0.123   1.06     1.05 ms      1.40 ms
 *   270x270 box (1.2x)            0.055   0.068   0.62     0.82 ms      0.71 ms
 *   2000x1500 whole (8.9x)        1.07    1.21   11.5      8.77 ms     17.8 ms
 *   120.5x131.2 box (upscale)     0.034   0.040   0.38     0.38 ms      0.33 ms
 *
 * The load-time crop (rt_resize_crop_chw) is swscale's instead (bilinear,
 * RGB24 into planar GBRP -- the slot's planes -- with full chroma and
 * accurate rounding), kept as it was so that training data does not change:
 * a crop taken at random needs no placement finer than a whole pixel, and
 * the box is rounded to whole pixels (of the image as decoded, so at most
 * half a pixel of a 1/k-scale decode). It does a random crop to 224x224 in
 * about 0.23 ms, context remade each time, and is 53..56 dB from Pillow on
 * whole-pixel boxes (tests/test_resize.c); setups compared with it, PSNR vs
 * Pillow BILINEAR (dB), 224x224 outputs unless named:
 *
 *   case                                     sws bilin*  sws area  sws lanczos
 *   270 box -> 224 (1.2x)                       56.5       44.8      34.3
 *   500x375 CROP fit (fractional box)           51.7       38.9      33.9
 *   2000x1500 whole (8.9x)                      57.6       37.3      34.0
 *   64 box -> 224 (upscale 3.5x)                50.2       50.2      34.9
 *   (* RGB24 in, GBRP out, SWS_FULL_CHR_H_INT|SWS_FULL_CHR_H_INP|SWS_ACCURATE_RND,
 *    the best swscale setup; GBRP in and out without those flags loses up to
 *    15 dB because swscale filters the B and R planes as subsampled chroma.)
 */
#include "loader/resize.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <libavutil/pixfmt.h>
#include <libswscale/swscale.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RT_RESIZE_X86 1
#endif

#include "common/common.h"

/* Pillow's fixed point for 8-bit images: weights carry 32 - 8 - 2 = 22 fraction bits. */
#define RT_PREC_BITS 22

/* Sides are bounded like JPEG's (65535 px); the sizes below then fit their types. */
#define RT_RESIZE_MAX_SIDE 65535u

/* Rows the vector kernels filter at once (transposed so that one vector holds one column of them). */
#define RT_BLOCK 16

/*
 * One axis's filter: output i (of n) is the sum over count[i] taps of the
 * source samples from first + start[i] on, weighted by k[i * ksize + t]
 * (fixed point, RT_PREC_BITS fraction bits). Sources used: [first, last).
 */
struct rt_axis {
    uint32_t n, ksize, first, last;
    uint32_t *start, *count;
    int32_t *k;
};

enum rt_kernel { RT_KERNEL_SCALAR = 0, RT_KERNEL_AVX2, RT_KERNEL_AVX512 };
static const char *const rt_kernel_names[] = {"scalar", "avx2", "avx512"};

struct rt_resizer {
    struct SwsContext *sws; /* rt_resize_crop_chw's, remade when the geometry changes */
    enum rt_kernel kernel;  /* chosen once, at create */
    uint8_t *tab;           /* both axes' tables and the normalisation's doubles */
    size_t tab_cap;
    uint8_t *tmp;           /* the horizontal pass's output: the source rows the vertical pass reads */
    size_t tmp_cap;
    uint8_t *blk;           /* vector kernels: a transposed block of source rows, then of output rows */
    size_t blk_cap;
    /* The last call's geometry and the tables built for it (in tab), reused while a call's geometry is the same:
     * pack meets the same image sizes, and so the same boxes, again and again. */
    struct rt_resize_key {
        uint32_t sw, sh, ow, oh;
        int flip;
        struct rt_box box;
    } key;                  /* sw == 0: none (no valid call has an empty image) */
    struct rt_axis h, v;
};

/* Grows *buf to at least n bytes, keeping nothing; NULL when out of memory. */
static void *rt_resize_grow(uint8_t **buf, size_t *cap, size_t n)
{
    if (n > *cap) {
        size_t want = n + n / 4;
        void *p = realloc(*buf, want);
        if (!p)
            return NULL;
        *buf = p;
        *cap = want;
    }
    return *buf;
}

static int rt_kernel_supported(enum rt_kernel k)
{
#ifdef RT_RESIZE_X86
    __builtin_cpu_init();
    switch (k) {
    case RT_KERNEL_SCALAR: return 1;
    case RT_KERNEL_AVX2: return __builtin_cpu_supports("avx2");
    case RT_KERNEL_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
    }
    return 0;
#else
    return k == RT_KERNEL_SCALAR;
#endif
}

int rt_resizer_create(struct rt_resizer **out)
{
    enum rt_kernel kernel = RT_KERNEL_SCALAR;
    const char *want = getenv("RT_RESIZE_KERNEL");
    if (want && *want) {
        int found = 0;
        for (int k = RT_KERNEL_SCALAR; k <= RT_KERNEL_AVX512; k++)
            if (strcmp(want, rt_kernel_names[k]) == 0)
                kernel = (enum rt_kernel)k, found = 1;
        if (!found)
            return rt_errf(-EINVAL, "resize: RT_RESIZE_KERNEL=%s (scalar, avx2 or avx512)", want);
        if (!rt_kernel_supported(kernel))
            return rt_errf(-ENOTSUP, "resize: RT_RESIZE_KERNEL=%s: this CPU lacks it", want);
    } else {
        for (int k = RT_KERNEL_AVX512; k > RT_KERNEL_SCALAR && kernel == RT_KERNEL_SCALAR; k--)
            if (rt_kernel_supported((enum rt_kernel)k))
                kernel = (enum rt_kernel)k;
    }
    struct rt_resizer *r = calloc(1, sizeof *r);
    if (!r)
        return rt_errf(-ENOMEM, "resize: out of memory");
    r->kernel = kernel;
    *out = r;
    return 0;
}

void rt_resizer_destroy(struct rt_resizer *r)
{
    if (!r)
        return;
    sws_freeContext(r->sws);
    free(r->tab);
    free(r->tmp);
    free(r->blk);
    free(r);
}

/* A box may end a rounding error past the image (boxes scaled by 1/k). */
#define RT_RESIZE_BOX_SLACK 1e-6

static int rt_resize_check_src(const uint8_t *src, uint32_t sw, uint32_t sh, uint32_t c, size_t sstride)
{
    if (!src)
        return rt_errf(-EINVAL, "resize: no source image");
    if (c != 1 && c != 3)
        return rt_errf(-EINVAL, "resize: %u channels (1 or 3 supported)", c);
    if (sw == 0 || sh == 0 || sw > RT_RESIZE_MAX_SIDE || sh > RT_RESIZE_MAX_SIDE)
        return rt_errf(-EINVAL, "resize: source is %ux%u (1..%u a side)", sw, sh, RT_RESIZE_MAX_SIDE);
    if (sstride < (size_t)sw * c || sstride > INT_MAX)
        return rt_errf(-EINVAL, "resize: source stride %zu for %u pixels of %u bytes", sstride, sw, c);
    return 0;
}

/*
 * Where one axis's outputs sit, as Pillow's resize sees them: Pillow takes
 * the box as four float32 edges, and output xx of `span` outputs is centred
 * at in0 + (xx + 0.5) * (in1 - in0) / span. A box that is a whole-pixel
 * window of a whole-image resize (rt_fit_geometry's CROP: Resize(S) then
 * CenterCrop) is computed as that resize instead -- edges 0 and the side,
 * `span` the resized side, outputs from `off` -- so the result is bit for
 * bit what torchvision's two steps make; through the float32 box 0.07 % of
 * the values would differ by one (the edges rounded to float32 move the
 * filter by ~1e-5 px, and a few weights round the other way). Such a box
 * of Pillow's own resize(box=...) is then a window of the same lattice, and
 * both ways agreed on every case tried.
 */
struct rt_axis_geom {
    float in0, in1;
    uint32_t span, off;
    double scale, filterscale; /* Pillow's, from the above */
    uint32_t ksize;            /* Pillow's ksize for BILINEAR (support 1) */
};

static struct rt_axis_geom rt_axis_geom_of(float in0, float in1, uint32_t span, uint32_t off)
{
    struct rt_axis_geom g = {in0, in1, span, off, 0, 0, 0};
    float fspan = in1 - in0;
    g.scale = (double)fspan / span;
    g.filterscale = g.scale < 1.0 ? 1.0 : g.scale;
    g.ksize = (uint32_t)ceil(g.filterscale) * 2 + 1;
    return g;
}

static struct rt_axis_geom rt_axis_place(uint32_t insize, double b0, double bw, uint32_t n)
{
    double whole = (double)n * insize / bw, rw = nearbyint(whole);
    if (rw >= n && rw <= (1 << 24) && fabs(whole - rw) <= 1e-9 * rw) {
        double left = b0 * rw / insize, l = nearbyint(left);
        if (fabs(left - l) <= 1e-7 && l >= 0 && l + n <= rw)
            return rt_axis_geom_of(0.0f, (float)insize, (uint32_t)rw, (uint32_t)l);
    }
    return rt_axis_geom_of((float)b0, (float)(b0 + bw), n, 0);
}

/*
 * Pillow 9.4's precompute_coeffs + normalize_coeffs_8bpc for BILINEAR, the
 * same double arithmetic in the same order (the file is built without FMA
 * contraction of these lines: no -march, and this function has no target
 * attribute), for outputs off .. off + ax->n - 1, reversed when flip.
 * `dw` holds ksize doubles.
 */
static void rt_axis_build(struct rt_axis *ax, uint32_t insize, struct rt_axis_geom g, int flip, double *dw)
{
    const double scale = g.scale, support = 1.0 * g.filterscale, ss = 1.0 / g.filterscale;
    const uint32_t n = ax->n;
    uint32_t first = UINT32_MAX, last = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t o = flip ? n - 1 - i : i;
        int xx = (int)(g.off + i);
        double center = g.in0 + (xx + 0.5) * scale;
        double ww = 0.0;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0)
            xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > (int)insize)
            xmax = (int)insize;
        xmax -= xmin;
        for (int x = 0; x < xmax; x++) {
            double t = (x + xmin - center + 0.5) * ss;
            t = t < 0.0 ? -t : t;
            double w = t < 1.0 ? 1.0 - t : 0.0;
            dw[x] = w;
            ww += w;
        }
        int32_t *k = ax->k + (size_t)o * ax->ksize;
        for (int x = 0; x < xmax; x++) {
            double w = ww != 0.0 ? dw[x] / ww : dw[x];
            k[x] = (int32_t)(w < 0 ? -0.5 + w * (1 << RT_PREC_BITS) : 0.5 + w * (1 << RT_PREC_BITS));
        }
        for (int x = xmax < 0 ? 0 : xmax; x < (int)ax->ksize; x++)
            k[x] = 0;
        ax->start[o] = (uint32_t)xmin;
        ax->count[o] = xmax < 0 ? 0 : (uint32_t)xmax;
        if (ax->count[o]) {
            first = RT_MIN(first, (uint32_t)xmin);
            last = RT_MAX(last, (uint32_t)(xmin + xmax));
        }
    }
    if (first > last)
        first = last = 0;
    for (uint32_t i = 0; i < n; i++)
        ax->start[i] -= ax->count[i] ? first : ax->start[i];
    ax->first = first;
    ax->last = last;
}

static inline uint8_t rt_clip8(int32_t acc)
{
    if (acc >= (1 << RT_PREC_BITS << 8))
        return 255;
    if (acc <= 0)
        return 0;
    return (uint8_t)(acc >> RT_PREC_BITS);
}

/*
 * Horizontal pass, plain C, one source row: `in` points at source pixel
 * h->first of the row; value (x, ch) goes to out[ch * cs + x * xs].
 */
static void rt_hrow_scalar(const uint8_t *in, const struct rt_axis *h, uint32_t c, uint8_t *out, size_t cs,
                           size_t xs)
{
    for (uint32_t x = 0; x < h->n; x++) {
        const int32_t *k = h->k + (size_t)x * h->ksize;
        const uint8_t *p = in + (size_t)h->start[x] * c;
        for (uint32_t ch = 0; ch < c; ch++) {
            int32_t acc = 1 << (RT_PREC_BITS - 1);
            for (uint32_t t = 0; t < h->count[x]; t++)
                acc += p[t * c + ch] * k[t];
            out[ch * cs + x * xs] = rt_clip8(acc);
        }
    }
}

/* Vertical pass, plain C, one output row of len bytes from rows `in` (stride `st`) weighted by k. */
static void rt_vrow_scalar(const uint8_t *in, size_t st, const int32_t *k, uint32_t count, uint8_t *out, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        int32_t acc = 1 << (RT_PREC_BITS - 1);
        for (uint32_t t = 0; t < count; t++)
            acc += in[t * st + i] * k[t];
        out[i] = rt_clip8(acc);
    }
}

#ifdef RT_RESIZE_X86
/* The vector kernels' loads (16 or 8 bytes widened to int32 lanes) and AVX-512's store (>> 22, clamped, narrowed). */
#define RT_LOAD16(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define RT_STORE16(p, a) \
    _mm_storeu_si128((__m128i *)(p), _mm512_cvtusepi32_epi8(_mm512_max_epi32(_mm512_srai_epi32(a, RT_PREC_BITS), zero)))
#define RT_LOAD8(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))

/* 16x16 bytes transposed in place: four rounds of interleaving rows i and i + 8 (each rotates the index bits). */
static inline void rt_tr16(__m128i v[16])
{
    for (int round = 0; round < 4; round++) {
        __m128i n[16];
        for (int i = 0; i < 8; i++) {
            n[2 * i] = _mm_unpacklo_epi8(v[i], v[i + 8]);
            n[2 * i + 1] = _mm_unpackhi_epi8(v[i], v[i + 8]);
        }
        memcpy(v, n, sizeof n);
    }
}

/* out[j * 16 + i] = rows[i][j] for j < len: a block of 16 rows, one column of them per 16 bytes. */
static void rt_block_in(const uint8_t *const rows[16], size_t len, uint8_t *out)
{
    size_t j = 0;
    for (; j + 16 <= len; j += 16) {
        __m128i v[16];
        for (int i = 0; i < 16; i++)
            v[i] = _mm_loadu_si128((const __m128i *)(rows[i] + j));
        rt_tr16(v);
        for (int i = 0; i < 16; i++)
            _mm_storeu_si128((__m128i *)(out + (j + i) * 16), v[i]);
    }
    for (; j < len; j++)
        for (int i = 0; i < 16; i++)
            out[j * 16 + i] = rows[i][j];
}

/* The inverse: rows[i][j] = in[j * 16 + i] for j < len. */
static void rt_block_out(const uint8_t *in, size_t len, uint8_t *const rows[16])
{
    size_t j = 0;
    for (; j + 16 <= len; j += 16) {
        __m128i v[16];
        for (int i = 0; i < 16; i++)
            v[i] = _mm_loadu_si128((const __m128i *)(in + (j + i) * 16));
        rt_tr16(v);
        for (int i = 0; i < 16; i++)
            _mm_storeu_si128((__m128i *)(rows[i] + j), v[i]);
    }
    for (; j < len; j++)
        for (int i = 0; i < 16; i++)
            rows[i][j] = in[j * 16 + i];
}

/*
 * Horizontal pass over a transposed block of 16 rows (`blk`: 16 bytes per
 * source byte from pixel h->first on), 16 rows per vector lane group:
 * value (x, ch) of the 16 rows goes to the 16 bytes at out + (ch * cs + x * xs) * 16.
 */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
rt_hblock_avx512(const uint8_t *blk, const struct rt_axis *h, uint32_t c, uint8_t *out, size_t cs, size_t xs)
{
    const __m512i half = _mm512_set1_epi32(1 << (RT_PREC_BITS - 1)), zero = _mm512_setzero_si512();
    for (uint32_t x = 0; x < h->n; x++) {
        const int32_t *k = h->k + (size_t)x * h->ksize;
        const uint8_t *p = blk + (size_t)h->start[x] * c * 16;
        uint32_t n = h->count[x];
        if (c == 3) {
            __m512i a0 = half, a1 = half, a2 = half;
            for (uint32_t t = 0; t < n; t++, p += 48) {
                __m512i w = _mm512_set1_epi32(k[t]);
                a0 = _mm512_add_epi32(a0, _mm512_mullo_epi32(RT_LOAD16(p), w));
                a1 = _mm512_add_epi32(a1, _mm512_mullo_epi32(RT_LOAD16(p + 16), w));
                a2 = _mm512_add_epi32(a2, _mm512_mullo_epi32(RT_LOAD16(p + 32), w));
            }
            RT_STORE16(out + (x * xs) * 16, a0);
            RT_STORE16(out + (cs + x * xs) * 16, a1);
            RT_STORE16(out + (2 * cs + x * xs) * 16, a2);
        } else {
            __m512i a0 = half, a1 = _mm512_setzero_si512();
            uint32_t t = 0;
            for (; t + 2 <= n; t += 2, p += 32) {
                a0 = _mm512_add_epi32(a0, _mm512_mullo_epi32(RT_LOAD16(p), _mm512_set1_epi32(k[t])));
                a1 = _mm512_add_epi32(a1, _mm512_mullo_epi32(RT_LOAD16(p + 16), _mm512_set1_epi32(k[t + 1])));
            }
            if (t < n)
                a0 = _mm512_add_epi32(a0, _mm512_mullo_epi32(RT_LOAD16(p), _mm512_set1_epi32(k[t])));
            RT_STORE16(out + (x * xs) * 16, _mm512_add_epi32(a0, a1));
        }
    }
}

__attribute__((target("avx2"))) static inline void rt_store16_avx2(uint8_t *p, __m256i lo, __m256i hi)
{
    /* Values are 0..256 after the shift, so the signed 16-bit step keeps them. */
    __m256i w = _mm256_packus_epi32(_mm256_srai_epi32(lo, RT_PREC_BITS), _mm256_srai_epi32(hi, RT_PREC_BITS));
    w = _mm256_permute4x64_epi64(w, 0xD8);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
}

__attribute__((target("avx2"))) static void rt_hblock_avx2(const uint8_t *blk, const struct rt_axis *h, uint32_t c,
                                                           uint8_t *out, size_t cs, size_t xs)
{
    const __m256i half = _mm256_set1_epi32(1 << (RT_PREC_BITS - 1));
    for (uint32_t x = 0; x < h->n; x++) {
        const int32_t *k = h->k + (size_t)x * h->ksize;
        const uint8_t *p = blk + (size_t)h->start[x] * c * 16;
        uint32_t n = h->count[x];
        for (uint32_t ch = 0; ch < c; ch++) {
            __m256i lo = half, hi = half;
            const uint8_t *q = p + ch * 16;
            for (uint32_t t = 0; t < n; t++, q += c * 16) {
                __m256i w = _mm256_set1_epi32(k[t]);
                lo = _mm256_add_epi32(lo, _mm256_mullo_epi32(RT_LOAD8(q), w));
                hi = _mm256_add_epi32(hi, _mm256_mullo_epi32(RT_LOAD8(q + 8), w));
            }
            rt_store16_avx2(out + (ch * cs + x * xs) * 16, lo, hi);
        }
    }
}

/* Vertical pass, one output row: as rt_vrow_scalar, 64 then 16 bytes at a time. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
rt_vrow_avx512(const uint8_t *in, size_t st, const int32_t *k, uint32_t count, uint8_t *out, size_t len)
{
    const __m512i half = _mm512_set1_epi32(1 << (RT_PREC_BITS - 1)), zero = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 64 <= len; i += 64) {
        __m512i a0 = half, a1 = half, a2 = half, a3 = half;
        const uint8_t *p = in + i;
        for (uint32_t t = 0; t < count; t++, p += st) {
            __m512i w = _mm512_set1_epi32(k[t]);
            a0 = _mm512_add_epi32(a0, _mm512_mullo_epi32(RT_LOAD16(p), w));
            a1 = _mm512_add_epi32(a1, _mm512_mullo_epi32(RT_LOAD16(p + 16), w));
            a2 = _mm512_add_epi32(a2, _mm512_mullo_epi32(RT_LOAD16(p + 32), w));
            a3 = _mm512_add_epi32(a3, _mm512_mullo_epi32(RT_LOAD16(p + 48), w));
        }
        RT_STORE16(out + i, a0);
        RT_STORE16(out + i + 16, a1);
        RT_STORE16(out + i + 32, a2);
        RT_STORE16(out + i + 48, a3);
    }
    for (; i + 16 <= len; i += 16) {
        __m512i a0 = half;
        const uint8_t *p = in + i;
        for (uint32_t t = 0; t < count; t++, p += st)
            a0 = _mm512_add_epi32(a0, _mm512_mullo_epi32(RT_LOAD16(p), _mm512_set1_epi32(k[t])));
        RT_STORE16(out + i, a0);
    }
    rt_vrow_scalar(in + i, st, k, count, out + i, len - i);
}

__attribute__((target("avx2"))) static void rt_vrow_avx2(const uint8_t *in, size_t st, const int32_t *k,
                                                         uint32_t count, uint8_t *out, size_t len)
{
    const __m256i half = _mm256_set1_epi32(1 << (RT_PREC_BITS - 1));
    size_t i = 0;
    for (; i + 32 <= len; i += 32) {
        __m256i a0 = half, a1 = half, a2 = half, a3 = half;
        const uint8_t *p = in + i;
        for (uint32_t t = 0; t < count; t++, p += st) {
            __m256i w = _mm256_set1_epi32(k[t]);
            a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(RT_LOAD8(p), w));
            a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(RT_LOAD8(p + 8), w));
            a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(RT_LOAD8(p + 16), w));
            a3 = _mm256_add_epi32(a3, _mm256_mullo_epi32(RT_LOAD8(p + 24), w));
        }
        rt_store16_avx2(out + i, a0, a1);
        rt_store16_avx2(out + i + 16, a2, a3);
    }
    rt_vrow_scalar(in + i, st, k, count, out + i, len - i);
}
#endif

/*
 * Where the passes write. The temporary image holds `nseg` segments (the
 * c planes for CHW output, one interleaved image for HWC), each `rows` rows
 * of `seg` bytes; value (x, ch) of a row sits at ch * cs + x * xs within it,
 * counting segments as consecutive. The output has the same segments at
 * out + s * oplane, rows ostride bytes apart.
 */
struct rt_layout {
    uint32_t nseg;
    size_t seg, cs, xs;
    uint8_t *out;
    size_t oplane, ostride;
};

/* Horizontal pass: source rows v->first .. v->last - 1 into r->tmp; src holds the image from (wx, wy) on. */
static int rt_hpass(struct rt_resizer *r, const uint8_t *src, uint32_t wx, uint32_t wy, size_t sstride, uint32_t c,
                    const struct rt_axis *h, const struct rt_axis *v, const struct rt_layout *L)
{
    uint32_t rows = v->last - v->first;
    size_t segsz = (size_t)rows * L->seg;
    const uint8_t *base = src + (size_t)(v->first - wy) * sstride + (size_t)(h->first - wx) * c;
    /* Per-segment strides in the temporary image: planes are whole images of `rows` rows. */
    size_t tcs = L->nseg > 1 ? segsz : L->cs;
    if (r->kernel == RT_KERNEL_SCALAR) {
        for (uint32_t y = 0; y < rows; y++)
            rt_hrow_scalar(base + (size_t)y * sstride, h, c, r->tmp + (size_t)y * L->seg, tcs, L->xs);
        return 0;
    }
#ifdef RT_RESIZE_X86
    size_t win = (size_t)(h->last - h->first) * c, outlen = (size_t)L->nseg * L->seg;
    /* The transposed source block, the transposed output block, one row for the block's unused lanes. */
    size_t need = win * 16 + outlen * 16 + L->seg;
    if (!rt_resize_grow(&r->blk, &r->blk_cap, need))
        return rt_errf(-ENOMEM, "resize: out of memory (%zu bytes of row blocks)", need);
    uint8_t *tin = r->blk, *tout = tin + win * 16, *spare = tout + outlen * 16;
    for (uint32_t y0 = 0; y0 < rows; y0 += RT_BLOCK) {
        uint32_t m = rows - y0 < RT_BLOCK ? rows - y0 : RT_BLOCK;
        const uint8_t *in[16];
        for (uint32_t i = 0; i < 16; i++)
            in[i] = base + (size_t)(y0 + (i < m ? i : m - 1)) * sstride;
        rt_block_in(in, win, tin);
        if (r->kernel == RT_KERNEL_AVX512)
            rt_hblock_avx512(tin, h, c, tout, L->cs, L->xs);
        else
            rt_hblock_avx2(tin, h, c, tout, L->cs, L->xs);
        for (uint32_t s = 0; s < L->nseg; s++) {
            uint8_t *o[16];
            for (uint32_t i = 0; i < 16; i++)
                o[i] = i < m ? r->tmp + s * segsz + (size_t)(y0 + i) * L->seg : spare;
            rt_block_out(tout + s * L->seg * 16, L->seg, o);
        }
    }
    return 0;
#else
    return rt_errf(-ENOTSUP, "resize: no vector kernel on this CPU");
#endif
}

static void rt_vpass(const struct rt_resizer *r, const struct rt_axis *v, const struct rt_layout *L)
{
    size_t segsz = (size_t)(v->last - v->first) * L->seg;
    for (uint32_t s = 0; s < L->nseg; s++) {
        const uint8_t *in = r->tmp + s * segsz;
        uint8_t *out = L->out + s * L->oplane;
        for (uint32_t y = 0; y < v->n; y++, out += L->ostride) {
            const uint8_t *rows = in + (size_t)v->start[y] * L->seg;
            const int32_t *k = v->k + (size_t)y * v->ksize;
            switch (r->kernel) {
#ifdef RT_RESIZE_X86
            case RT_KERNEL_AVX512: rt_vrow_avx512(rows, L->seg, k, v->count[y], out, L->seg); break;
            case RT_KERNEL_AVX2: rt_vrow_avx2(rows, L->seg, k, v->count[y], out, L->seg); break;
#endif
            default: rt_vrow_scalar(rows, L->seg, k, v->count[y], out, L->seg); break;
            }
        }
    }
}

/*
 * The resampling both entry points share: `box` (validated, inside the
 * sw x sh image) of src to ow x oh outputs laid out as L says, mirrored
 * when flip. src holds the window win = {x, y, w, h} of the image (its
 * top-left pixel first); the pixels the filter reads must lie in it.
 * Tables and the temporary image live in the resizer's scratch.
 */
static int rt_resize_run(struct rt_resizer *r, const uint8_t *src, uint32_t sw, uint32_t sh, const uint32_t win[4],
                         uint32_t c, size_t sstride, const struct rt_box *box, uint32_t ow, uint32_t oh, int flip,
                         struct rt_layout *L)
{
    struct rt_resize_key key;
    memset(&key, 0, sizeof key); /* compared whole, padding included: the fields are set one by one */
    key.sw = sw;
    key.sh = sh;
    key.ow = ow;
    key.oh = oh;
    key.flip = flip;
    key.box = *box;
    if (memcmp(&key, &r->key, sizeof key) != 0) {
        r->key.sw = 0; /* the tables are being replaced: valid again only once they are built */
        struct rt_axis_geom gx = rt_axis_place(sw, box->x, box->w, ow), gy = rt_axis_place(sh, box->y, box->h, oh);
        struct rt_axis h = {.n = ow, .ksize = gx.ksize}, v = {.n = oh, .ksize = gy.ksize};
        size_t kmax = RT_MAX(h.ksize, v.ksize);
        size_t hk = (size_t)ow * h.ksize, vk = (size_t)oh * v.ksize;
        size_t need = (kmax + hk + vk) * 8 + ((size_t)ow + oh) * 2 * sizeof(uint32_t);
        if (!rt_resize_grow(&r->tab, &r->tab_cap, need))
            return rt_errf(-ENOMEM, "resize: out of memory (%zu bytes of filter tables)", need);
        double *dw = (double *)r->tab;
        h.k = (int32_t *)(dw + kmax);
        v.k = h.k + hk;
        h.start = (uint32_t *)(v.k + vk);
        h.count = h.start + ow;
        v.start = h.count + ow;
        v.count = v.start + oh;
        rt_axis_build(&h, sw, gx, flip, dw);
        rt_axis_build(&v, sh, gy, 0, dw);
        r->h = h;
        r->v = v;
        r->key = key;
    }
    const struct rt_axis h = r->h, v = r->v;
    if (h.last <= h.first || v.last <= v.first)
        return rt_errf(-EINVAL, "resize: box (%g, %g, %g x %g) covers no pixel", box->x, box->y, box->w, box->h);
    if (h.first < win[0] || h.last > win[0] + win[2] || v.first < win[1] || v.last > win[1] + win[3])
        return rt_errf(-ERANGE, "resize: the filter reads columns %u..%u and rows %u..%u, outside the %ux%u window "
                       "at (%u, %u) the source holds", h.first, h.last - 1, v.first, v.last - 1, win[2], win[3],
                       win[0], win[1]);

    size_t tmpsz = (size_t)(v.last - v.first) * L->seg * L->nseg;
    if (!rt_resize_grow(&r->tmp, &r->tmp_cap, tmpsz))
        return rt_errf(-ENOMEM, "resize: out of memory (%zu bytes of resized rows)", tmpsz);
    int rc = rt_hpass(r, src, win[0], win[1], sstride, c, &h, &v, L);
    if (rc)
        return rc;
    rt_vpass(r, &v, L);
    return 0;
}

int rt_resize_box_chw(struct rt_resizer *r, const uint8_t *src, uint32_t sw, uint32_t sh, uint32_t c,
                      size_t sstride, const struct rt_box *box, uint8_t *dst, uint32_t dw, uint32_t dh,
                      const uint32_t rect[4], int flip)
{
    const uint32_t whole[4] = {0, 0, sw, sh};
    return rt_resize_box_chw_window(r, src, sw, sh, whole, c, sstride, box, dst, dw, dh, rect, flip);
}

int rt_resize_box_chw_window(struct rt_resizer *r, const uint8_t *src, uint32_t sw, uint32_t sh,
                             const uint32_t win[4], uint32_t c, size_t sstride, const struct rt_box *box,
                             uint8_t *dst, uint32_t dw, uint32_t dh, const uint32_t rect[4], int flip)
{
    if (!win || win[2] == 0 || win[3] == 0 || win[0] > sw || win[1] > sh || win[2] > sw - win[0] ||
        win[3] > sh - win[1])
        return rt_errf(-EINVAL, "resize: the source's window is empty or outside the %ux%u image", sw, sh);
    int rc = rt_resize_check_src(src, win[2], win[3], c, sstride);
    if (rc)
        return rc;
    if (sw > RT_RESIZE_MAX_SIDE || sh > RT_RESIZE_MAX_SIDE)
        return rt_errf(-EINVAL, "resize: source is %ux%u (1..%u a side)", sw, sh, RT_RESIZE_MAX_SIDE);
    if (!r || !box || !dst)
        return rt_errf(-EINVAL, "resize: missing resizer, box or destination");
    if (!(isfinite(box->x) && isfinite(box->y) && isfinite(box->w) && isfinite(box->h)) || !(box->w > 0) ||
        !(box->h > 0) || box->x < -RT_RESIZE_BOX_SLACK || box->y < -RT_RESIZE_BOX_SLACK ||
        box->x + box->w > sw + RT_RESIZE_BOX_SLACK || box->y + box->h > sh + RT_RESIZE_BOX_SLACK)
        return rt_errf(-EINVAL, "resize: box (%g, %g, %g x %g) is empty or outside the %ux%u image", box->x, box->y,
                       box->w, box->h, sw, sh);
    if (dw == 0 || dh == 0 || dw > RT_RESIZE_MAX_SIDE || dh > RT_RESIZE_MAX_SIDE)
        return rt_errf(-EINVAL, "resize: destination is %ux%u (1..%u a side)", dw, dh, RT_RESIZE_MAX_SIDE);
    uint32_t rx = 0, ry = 0, rw = dw, rh = dh;
    if (rect) {
        rx = rect[0], ry = rect[1], rw = rect[2], rh = rect[3];
        if (rw == 0 || rh == 0 || rx > dw || ry > dh || rw > dw - rx || rh > dh - ry)
            return rt_errf(-EINVAL, "resize: rectangle (%u, %u, %u x %u) is empty or outside %ux%u", rx, ry, rw,
                           rh, dw, dh);
    }
    /* Clamp the slack away: the filter never reads past the image. */
    struct rt_box b = *box;
    b.x = b.x < 0 ? 0 : b.x;
    b.y = b.y < 0 ? 0 : b.y;
    b.w = b.x + b.w > sw ? sw - b.x : b.w;
    b.h = b.y + b.h > sh ? sh - b.y : b.h;
    if (!(b.w > 0) || !(b.h > 0))
        return rt_errf(-EINVAL, "resize: box (%g, %g, %g x %g) is empty inside the %ux%u image", box->x, box->y,
                       box->w, box->h, sw, sh);
    /* CHW: the temporary image is c planes, so the vertical pass writes the planes directly. */
    struct rt_layout L = {.nseg = c, .seg = rw, .cs = rw, .xs = 1, .out = dst + (size_t)ry * dw + rx,
                          .oplane = (size_t)dw * dh, .ostride = dw};
    return rt_resize_run(r, src, sw, sh, win, c, sstride, &b, rw, rh, flip, &L);
}

int rt_resize_hwc(struct rt_resizer *r, const uint8_t *src, uint32_t sw, uint32_t sh, uint32_t c,
                  size_t sstride, uint8_t *dst, uint32_t dw, uint32_t dh)
{
    int rc = rt_resize_check_src(src, sw, sh, c, sstride);
    if (rc)
        return rc;
    if (!r || !dst)
        return rt_errf(-EINVAL, "resize: missing resizer or destination");
    if (dw == 0 || dh == 0 || dw > RT_RESIZE_MAX_SIDE || dh > RT_RESIZE_MAX_SIDE)
        return rt_errf(-EINVAL, "resize: destination is %ux%u (1..%u a side)", dw, dh, RT_RESIZE_MAX_SIDE);
    const struct rt_box whole = {0, 0, sw, sh};
    const uint32_t win[4] = {0, 0, sw, sh};
    struct rt_layout L = {.nseg = 1, .seg = (size_t)dw * c, .cs = 1, .xs = c, .out = dst, .oplane = 0,
                          .ostride = (size_t)dw * c};
    return rt_resize_run(r, src, sw, sh, win, c, sstride, &whole, dw, dh, 0, &L);
}

static const char *const rt_fit_names[] = {[RT_FIT_CROP] = "crop", [RT_FIT_STRETCH] = "stretch", [RT_FIT_PAD] = "pad"};

const char *rt_fit_name(enum rt_fit fit)
{
    if ((unsigned)fit >= sizeof rt_fit_names / sizeof rt_fit_names[0])
        return NULL;
    return rt_fit_names[fit];
}

int rt_fit_parse(const char *name, enum rt_fit *out)
{
    for (unsigned i = 0; name && i < sizeof rt_fit_names / sizeof rt_fit_names[0]; i++) {
        if (strcmp(name, rt_fit_names[i]) == 0) {
            *out = (enum rt_fit)i;
            return 0;
        }
    }
    return -EINVAL;
}

/*
 * torchvision's Resize(S) + CenterCrop(S), generalised to dw x dh: the side
 * that must grow more to cover its target is set to it exactly, the other
 * becomes int(target * other / side) (Python's int(): truncation), and the
 * crop starts at int(round((resized - target) / 2.0)) (Python's round():
 * halves to even, which is rint() in the default rounding mode). For
 * dw == dh this is torchvision's arithmetic: the shorter side is the one
 * set to S, and on a tie (sw == sh) the width, as torchvision's w <= h.
 */
static void rt_fit_crop(uint32_t sw, uint32_t sh, uint32_t dw, uint32_t dh, struct rt_box *box)
{
    uint64_t rw, rh;
    if ((uint64_t)dw * sh >= (uint64_t)dh * sw) {
        rw = dw;
        rh = (uint64_t)((double)((uint64_t)dw * sh) / sw);
    } else {
        rh = dh;
        rw = (uint64_t)((double)((uint64_t)dh * sw) / sh);
    }
    /* The truncation can leave the other side a hair short of its target for HxW outputs. */
    rw = rw < dw ? dw : rw;
    rh = rh < dh ? dh : rh;
    double left = rint(((double)rw - dw) / 2.0), top = rint(((double)rh - dh) / 2.0);
    double kx = (double)sw / (double)rw, ky = (double)sh / (double)rh;
    box->x = left * kx;
    box->y = top * ky;
    box->w = dw * kx;
    box->h = dh * ky;
}

void rt_fit_geometry(enum rt_fit fit, uint32_t sw, uint32_t sh, uint32_t dw, uint32_t dh, struct rt_box *box,
                     uint32_t rect[4])
{
    *box = (struct rt_box){0, 0, sw, sh};
    rect[0] = rect[1] = 0;
    rect[2] = dw;
    rect[3] = dh;
    /* An empty source or target gives an empty box, which rt_resize_box_chw refuses. */
    if (sw == 0 || sh == 0 || dw == 0 || dh == 0) {
        *box = (struct rt_box){0, 0, 0, 0};
        return;
    }
    switch (fit) {
    case RT_FIT_CROP:
        rt_fit_crop(sw, sh, dw, dh, box);
        break;
    case RT_FIT_STRETCH:
        break;
    case RT_FIT_PAD: {
        uint32_t w = dw, h = dh;
        if ((uint64_t)dw * sh <= (uint64_t)dh * sw) /* width binds */
            h = (uint32_t)lround((double)sh * dw / sw);
        else
            w = (uint32_t)lround((double)sw * dh / sh);
        w = w < 1 ? 1 : w > dw ? dw : w;
        h = h < 1 ? 1 : h > dh ? dh : h;
        rect[0] = (dw - w) / 2;
        rect[1] = (dh - h) / 2;
        rect[2] = w;
        rect[3] = h;
        break;
    }
    }
}

/*
 * The load-time crop's resize (see resize.h): swscale's bilinear filter,
 * whose support grows with the downscale factor as Pillow's does, from RGB24
 * (or GRAY8) straight into planar GBRP (or GRAY8) -- the slot's CHW planes,
 * G, B, R in swscale's order -- with full chroma on both sides, so no plane
 * is treated as subsampled colour (without those flags swscale loses up to
 * 15 dB: resize.c's table above). A mirror is a row reversal afterwards.
 */
int rt_resize_crop_chw(struct rt_resizer *r, const uint8_t *src, uint32_t sw, uint32_t sh, uint32_t c,
                       size_t sstride, const struct rt_box *box, uint8_t *dst, uint32_t dw, uint32_t dh, int flip)
{
    int rc = rt_resize_check_src(src, sw, sh, c, sstride);
    if (rc)
        return rc;
    if (!r || !box || !dst)
        return rt_errf(-EINVAL, "resize: missing resizer, box or destination");
    if (dw == 0 || dh == 0 || dw > RT_RESIZE_MAX_SIDE || dh > RT_RESIZE_MAX_SIDE)
        return rt_errf(-EINVAL, "resize: destination is %ux%u (1..%u a side)", dw, dh, RT_RESIZE_MAX_SIDE);
    /* Whole pixels: a box scaled by the JPEG decoder's 1/k moves by at most half a pixel of the decoded image. */
    double fx0 = fmax(0, round(box->x)), fy0 = fmax(0, round(box->y));
    double fx1 = fmin(sw, round(box->x + box->w)), fy1 = fmin(sh, round(box->y + box->h));
    if (!(isfinite(fx0) && isfinite(fy0) && isfinite(fx1) && isfinite(fy1)) || !(box->w > 0) || !(box->h > 0))
        return rt_errf(-EINVAL, "resize: box (%g, %g, %g x %g) is empty or outside the %ux%u image", box->x, box->y,
                       box->w, box->h, sw, sh);
    uint32_t x0 = (uint32_t)fx0, y0 = (uint32_t)fy0;
    uint32_t bw = fx1 > fx0 ? (uint32_t)(fx1 - fx0) : 0, bh = fy1 > fy0 ? (uint32_t)(fy1 - fy0) : 0;
    /* A box thinner than half a pixel still covers the pixel it sits on. */
    if (bw == 0)
        bw = 1, x0 = x0 < sw ? x0 : sw - 1;
    if (bh == 0)
        bh = 1, y0 = y0 < sh ? y0 : sh - 1;
    if (x0 + bw > sw || y0 + bh > sh)
        return rt_errf(-EINVAL, "resize: box (%g, %g, %g x %g) is outside the %ux%u image", box->x, box->y, box->w,
                       box->h, sw, sh);
    const enum AVPixelFormat in_fmt = c == 3 ? AV_PIX_FMT_RGB24 : AV_PIX_FMT_GRAY8;
    const enum AVPixelFormat out_fmt = c == 3 ? AV_PIX_FMT_GBRP : AV_PIX_FMT_GRAY8;
    r->sws = sws_getCachedContext(r->sws, (int)bw, (int)bh, in_fmt, (int)dw, (int)dh, out_fmt,
                                  SWS_BILINEAR | SWS_FULL_CHR_H_INT | SWS_FULL_CHR_H_INP | SWS_ACCURATE_RND, NULL,
                                  NULL, NULL);
    if (!r->sws)
        return rt_errf(-ENOMEM, "resize: swscale cannot scale %ux%u to %ux%u", bw, bh, dw, dh);
    const size_t plane = (size_t)dw * dh;
    const uint8_t *in[4] = {src + (size_t)y0 * sstride + (size_t)x0 * c, NULL, NULL, NULL};
    const int in_stride[4] = {(int)sstride, 0, 0, 0};
    uint8_t *out[4] = {c == 3 ? dst + plane : dst, c == 3 ? dst + 2 * plane : NULL, c == 3 ? dst : NULL, NULL};
    const int out_stride[4] = {(int)dw, c == 3 ? (int)dw : 0, c == 3 ? (int)dw : 0, 0};
    if (sws_scale(r->sws, in, in_stride, 0, (int)bh, out, out_stride) != (int)dh)
        return rt_errf(-EIO, "resize: swscale did not write the %ux%u output", dw, dh);
    if (flip)
        for (size_t row = 0; row < (size_t)c * dh; row++) {
            uint8_t *p = dst + row * dw;
            for (uint32_t i = 0, j = dw - 1; i < j; i++, j--) {
                uint8_t t = p[i];
                p[i] = p[j];
                p[j] = t;
            }
        }
    return 0;
}
