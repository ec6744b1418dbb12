/*
 * synth.c - `ringtrain synth`: writes a synthetic, learnable image dataset in
 * the byte layout of the CIFAR-10 binary, CIFAR-100 binary or MNIST IDX (.gz)
 * distributions, so that everything that reads the originals can run
 * without downloading them.
 *
 * Classes. There are 20 pattern families (stripes, rings, checker, oval,
 * square, cross, dots, triangle, blobs, bar, spiral, star, annulus, grid,
 * wave, edge, plaid, chevron, zigzag, dotring) with 5 variants each that
 * differ in one parameter: orientation, frequency, thickness, aspect ratio or
 * count. CIFAR-100 uses all 100 as fine classes, fine = family * 5 + variant,
 * so coarse = fine / 5 is the family; its names are "<family>_<variant>" and
 * "<family>". CIFAR-10 and MNIST use the first 10 families as classes and
 * draw the variant at random per image. Every image is drawn with a random
 * translation, scale and phase, a small rotation jitter (any rotation where
 * the family does not depend on it), random foreground and background colours
 * that are independent of the class, a linear illumination gradient, additive
 * noise and, in 40% of the CIFAR images, a solid rectangle of a third colour
 * hiding part of the pattern. MNIST images are grey strokes on an exactly
 * black ground, with light and noise on the strokes only.
 *
 * Labels. Records are grouped in blocks of K (the number of classes); block
 * b holds each class exactly once, in the order of a Fisher-Yates shuffle
 * drawn from the block's own stream. Classes are therefore balanced to within
 * one record and look shuffled, and a label is still a function of the index.
 *
 * Determinism. Record i of a split is a pure function of (format, seed,
 * split, i): its randomness comes from rt_rng_init(seed, stream) with a
 * stream id built from those values (see syn_stream()), so the bytes do not
 * depend on the thread that draws them, and same options give byte-identical
 * files whatever the thread count. Per-pixel maths is plain float arithmetic
 * (our own sine and square root, no libm), so other machines give the same
 * bytes too, unless the compiler fuses multiply-adds (-ffp-contract=fast on
 * an FMA target), which changes some pixels slightly. The gzip streams of
 * MNIST are as deterministic as the zlib version that writes them.
 *
 * This file does not read datasets, pack shards or know about training; it
 * only renders records and writes the distribution files.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "common/common.h"
#include "loader/offline.h"

#define SYN_FAMILIES 20
#define SYN_VARIANTS 5
#define SYN_CIFAR_SIZE 32
#define SYN_MNIST_SIZE 28
#define SYN_CIFAR_PIXELS (3 * SYN_CIFAR_SIZE * SYN_CIFAR_SIZE)
#define SYN_MNIST_PIXELS (SYN_MNIST_SIZE * SYN_MNIST_SIZE)
#define SYN_MAX_RECORDS 0xffffffffu /* IDX dims are uint32; plenty for the others */
#define SYN_MAX_THREADS 256
#define SYN_MAX_POINTS 8

static const char *const family_name[SYN_FAMILIES] = {
    "stripes", "rings", "checker", "oval",  "square", "cross", "dots",  "triangle", "blobs",   "bar",
    "spiral",  "star",  "annulus", "grid",  "wave",   "edge",  "plaid", "chevron",  "zigzag",  "dotring",
};

enum syn_family {
    FAM_STRIPES, FAM_RINGS, FAM_CHECKER, FAM_OVAL, FAM_SQUARE, FAM_CROSS, FAM_DOTS, FAM_TRIANGLE,
    FAM_BLOBS, FAM_BAR, FAM_SPIRAL, FAM_STAR, FAM_ANNULUS, FAM_GRID, FAM_WAVE, FAM_EDGE, FAM_PLAID,
    FAM_CHEVRON, FAM_ZIGZAG, FAM_DOTRING,
};

/* Stream kinds: the two uses of the RNG must never share a stream. */
enum { STREAM_IMAGE = 0, STREAM_LABELS = 1 };

/* Everything random about one image, drawn before any pixel is computed. */
struct syn_scene {
    int family, variant;
    float cx, cy;     /* pattern centre, pixels */
    float unit;       /* pixels per pattern unit (half the image at scale 1) */
    float cs, sn;     /* rotation of the pattern frame */
    float ph, ph2;    /* phases, turns */
    float fj;         /* frequency jitter factor */
    float window;     /* radius of the texture window in units; 0 = none */
    int npts;
    float pts[SYN_MAX_POINTS][2];
    float fg[3], bg[3];
    float gx, gy;     /* illumination gradient, intensity per pixel */
    float occ_x, occ_y, occ_w, occ_h; /* occluding rectangle: centre, half sizes (px); w 0 = none */
    float occ_col[3];
    float noise;      /* noise standard deviation, intensity units [0, 1] */
    uint64_t noise_seed;
};

/* ---- cheap deterministic maths ------------------------------------------------ */

/* t minus the nearest integer, in [-0.5, 0.5]; |t| < 2^31. Written with
 * comparisons rather than branches: the sign of t is random per pixel. */
static inline float syn_wrap(float t)
{
    float f = t - (float)(int32_t)t;
    return f - (float)((f > 0.5f) - (f < -0.5f));
}

/* sin(2*pi*t) for t in turns, to about 1e-3: a parabola with one correction
 * step. Ours rather than libm's so output does not depend on the libm. */
static inline float syn_tsin(float t)
{
    float x = 2.0f * syn_wrap(t);
    float y = 4.0f * x * (1.0f - fabsf(x));
    return 0.225f * (y * fabsf(y) - y) + y;
}

static inline float syn_tcos(float t) { return syn_tsin(t + 0.25f); }

/* In the operand order of SSE max/min, so that no branch is needed. */
static inline float syn_clamp01(float x)
{
    x = x > 0.0f ? x : 0.0f;
    return x < 1.0f ? x : 1.0f;
}

/* sqrt(x) for x >= 0 to about 1e-6 relative: the classic bit-level guess of
 * 1/sqrt(x) and two Newton steps. Plain float arithmetic, so loops using it
 * can be vectorised (libm's sqrtf cannot, for errno's sake) and the result
 * does not depend on the libm. */
static inline float syn_sqrt(float x)
{
    uint32_t i;
    float y;
    memcpy(&i, &x, sizeof(i));
    i = 0x5f3759dfu - (i >> 1);
    memcpy(&y, &i, sizeof(y));
    y = y * (1.5f - 0.5f * x * y * y);
    y = y * (1.5f - 0.5f * x * y * y);
    return x * y;
}

/* Coverage of a pixel whose centre is at signed distance d (units, negative
 * inside) from a shape's boundary; `unit` pixels per unit give a one-pixel
 * anti-aliased edge. */
static inline float syn_edge(float d, float unit) { return syn_clamp01(0.5f - d * unit); }

/* Distance from (u, v) to the segment (0,0)-(ex,ey). */
static float syn_seg_dist(float u, float v, float ex, float ey)
{
    float t = (u * ex + v * ey) / (ex * ex + ey * ey);
    t = syn_clamp01(t);
    float du = u - t * ex, dv = v - t * ey;
    return syn_sqrt(du * du + dv * dv);
}

/* ---- the families ---------------------------------------------------------------- */

/* Per-variant parameter of each family (see syn_coverage()). */
static const float var_ring_freq[SYN_VARIANTS] = {1.2f, 1.55f, 2.0f, 2.6f, 3.4f};
static const float var_checker_k[SYN_VARIANTS] = {1.0f, 1.3f, 1.7f, 2.2f, 2.9f};
static const float var_oval_aspect[SYN_VARIANTS] = {1.0f, 1.45f, 2.0f, 2.8f, 3.8f};
static const float var_square_thick[SYN_VARIANTS] = {0.12f, 0.2f, 0.3f, 0.42f, 0.6f};
static const float var_cross_width[SYN_VARIANTS] = {0.07f, 0.11f, 0.16f, 0.22f, 0.3f};
static const float var_dots_period[SYN_VARIANTS] = {0.9f, 0.72f, 0.58f, 0.47f, 0.38f};
static const float var_annulus_width[SYN_VARIANTS] = {0.05f, 0.09f, 0.14f, 0.2f, 0.27f};
static const float var_grid_period[SYN_VARIANTS] = {0.9f, 0.7f, 0.55f, 0.43f, 0.34f};
static const float var_wave_freq[SYN_VARIANTS] = {0.35f, 0.55f, 0.75f, 0.95f, 1.15f};
static const float var_plaid_angle[SYN_VARIANTS] = {30.0f, 45.0f, 60.0f, 75.0f, 90.0f};
static const float var_chevron_angle[SYN_VARIANTS] = {50.0f, 70.0f, 90.0f, 110.0f, 130.0f};
static const float var_zigzag_freq[SYN_VARIANTS] = {0.5f, 0.75f, 1.0f, 1.25f, 1.5f};

/* Families drawn at any rotation: they have no orientation, or their variants
 * do not depend on it. The others get a small jitter around the variant's
 * angle. */
static int syn_free_rotation(int family)
{
    switch (family) {
    case FAM_RINGS: case FAM_OVAL: case FAM_BLOBS: case FAM_SPIRAL: case FAM_STAR:
    case FAM_ANNULUS: case FAM_DOTRING:
        return 1;
    default:
        return 0;
    }
}

/* Textures fill the plane; they are cut to a random round window so that the
 * background shows around them. */
static int syn_texture(int family)
{
    switch (family) {
    case FAM_STRIPES: case FAM_RINGS: case FAM_CHECKER: case FAM_DOTS: case FAM_SPIRAL:
    case FAM_GRID: case FAM_PLAID: case FAM_ZIGZAG:
        return 1;
    default:
        return 0;
    }
}

/* Angle (turns) of the pattern frame for families whose variants are orientations. */
static float syn_variant_angle(int family, int variant)
{
    switch (family) {
    case FAM_STRIPES: case FAM_BAR: case FAM_EDGE:
        return (float)variant * 0.1f; /* 0, 36, ..., 144 degrees */
    case FAM_TRIANGLE:
        return (float)variant * (24.0f / 360.0f);
    default:
        return 0.0f;
    }
}

/*
 * Foreground coverage in [0, 1] of the point (u, v) of the pattern frame
 * (units: half the image at scale 1) for `family`. `unit` is pixels per
 * unit, for edges. Always inlined with a constant family (syn_cover()), so
 * that the switch folds away and each family's loop can be vectorised.
 */
static inline __attribute__((always_inline)) float
syn_coverage(int family, const struct syn_scene *sc, float u, float v, float unit)
{
    const int var = sc->variant;
    float r, d, a;

    switch (family) {
    case FAM_STRIPES:
        return 0.5f + 0.5f * syn_tsin(2.2f * sc->fj * u + sc->ph);
    case FAM_RINGS:
        r = syn_sqrt(u * u + v * v);
        return 0.5f + 0.5f * syn_tcos(var_ring_freq[var] * sc->fj * r + sc->ph);
    case FAM_CHECKER: {
        float k = 0.5f * var_checker_k[var] * sc->fj;
        float p = syn_tsin(k * u + sc->ph) * syn_tsin(k * v + sc->ph2) * 6.0f;
        return 0.5f + 0.5f * (p < -1.0f ? -1.0f : (p > 1.0f ? 1.0f : p));
    }
    case FAM_OVAL: {
        float s = syn_sqrt(var_oval_aspect[var]);
        float ax = 0.5f * s, ay = 0.5f / s;
        r = syn_sqrt((u / ax) * (u / ax) + (v / ay) * (v / ay));
        return syn_edge((r - 1.0f) * ay, unit);
    }
    case FAM_SQUARE: {
        const float h = 0.55f;
        float m = RT_MAX(fabsf(u), fabsf(v));
        d = RT_MAX(m - h, (h - h * var_square_thick[var]) - m);
        return syn_edge(d, unit);
    }
    case FAM_CROSS: {
        const float len = 0.7f;
        float w = var_cross_width[var], au = fabsf(u), av = fabsf(v);
        d = RT_MIN(RT_MAX(au - w, av - len), RT_MAX(av - w, au - len));
        return syn_edge(d, unit);
    }
    case FAM_DOTS: {
        float p = var_dots_period[var] / sc->fj;
        float fu = syn_wrap(u / p + sc->ph), fv = syn_wrap(v / p + sc->ph2);
        d = (syn_sqrt(fu * fu + fv * fv) - 0.3f) * p;
        return syn_edge(d, unit);
    }
    case FAM_TRIANGLE: {
        /* Inward normals at 90, 210 and 330 degrees; inradius 0.3. */
        const float c30 = 0.8660254f;
        float d0 = v - 0.3f;
        float d1 = -c30 * u - 0.5f * v - 0.3f;
        float d2 = c30 * u - 0.5f * v - 0.3f;
        d = RT_MAX(d0, RT_MAX(d1, d2));
        return syn_edge(d, unit);
    }
    case FAM_BLOBS:
        a = 0.0f;
        for (int i = 0; i < sc->npts; i++) {
            float du = (u - sc->pts[i][0]) * 3.5f, dv = (v - sc->pts[i][1]) * 3.5f;
            float q = 1.0f / (1.0f + du * du + dv * dv);
            a = RT_MAX(a, q * q);
        }
        return syn_clamp01(a * 1.15f);
    case FAM_BAR:
        d = RT_MAX(fabsf(v) - 0.13f, fabsf(u) - 0.8f);
        return syn_edge(d, unit);
    case FAM_SPIRAL: {
        /* cos(k*theta + phi) = Re((z/|z|)^k * e^(i*phi)), no atan2 needed. */
        float re = 1.0f, im = 0.0f;
        r = syn_sqrt(u * u + v * v);
        if (r < 1e-6f)
            return 0.5f;
        float zr = u / r, zi = v / r;
        for (int i = 0; i <= var; i++) {
            float t = re * zr - im * zi;
            im = re * zi + im * zr;
            re = t;
        }
        float phi = 1.6f * sc->fj * r + sc->ph;
        return 0.5f + 0.5f * (re * syn_tcos(phi) - im * syn_tsin(phi));
    }
    case FAM_STAR: {
        int k = var + 3;
        float re = 1.0f, im = 0.0f;
        r = syn_sqrt(u * u + v * v);
        if (r < 1e-6f)
            return 1.0f;
        float zr = u / r, zi = v / r;
        for (int i = 0; i < k; i++) {
            float t = re * zr - im * zi;
            im = re * zi + im * zr;
            re = t;
        }
        return syn_edge((r - 0.5f * (1.0f + 0.4f * re)) * 0.7f, unit);
    }
    case FAM_ANNULUS:
        r = syn_sqrt(u * u + v * v);
        return syn_edge(fabsf(r - 0.52f) - var_annulus_width[var], unit);
    case FAM_GRID: {
        float p = var_grid_period[var] / sc->fj;
        float du = fabsf(syn_wrap(u / p + sc->ph)) * p;
        float dv = fabsf(syn_wrap(v / p + sc->ph2)) * p;
        return syn_edge(RT_MIN(du, dv) - 0.07f, unit);
    }
    case FAM_WAVE: {
        const float amp = 0.3f;
        float f = var_wave_freq[var] * sc->fj;
        float y = amp * syn_tsin(f * u + sc->ph);
        float slope = amp * 6.2831853f * f * syn_tcos(f * u + sc->ph);
        d = fabsf(v - y) / syn_sqrt(1.0f + slope * slope) - 0.09f;
        return syn_edge(RT_MAX(d, fabsf(u) - 0.85f), unit);
    }
    case FAM_EDGE:
        return syn_edge(u - 0.25f * (sc->ph - 0.5f), unit);
    case FAM_PLAID: {
        float half = var_plaid_angle[var] * (0.5f / 360.0f);
        float c = syn_tcos(half), s = syn_tsin(half);
        float f = 1.8f * sc->fj;
        float g1 = syn_tsin(f * (c * u + s * v) + sc->ph);
        float g2 = syn_tsin(f * (c * u - s * v) + sc->ph2);
        return 0.5f + 0.25f * (g1 + g2);
    }
    case FAM_CHEVRON: {
        /* Two arms from an apex at (-0.3, 0), opening towards +u. */
        float half = var_chevron_angle[var] * (0.5f / 360.0f);
        float ex = 0.75f * syn_tcos(half), ey = 0.75f * syn_tsin(half);
        float pu = u + 0.3f;
        d = RT_MIN(syn_seg_dist(pu, v, ex, ey), syn_seg_dist(pu, v, ex, -ey));
        return syn_edge(d - 0.1f, unit);
    }
    case FAM_ZIGZAG: {
        float g = var_zigzag_freq[var] * sc->fj;
        float tri = 4.0f * fabsf(syn_wrap(g * u + sc->ph2)) - 1.0f;
        return 0.5f + 0.5f * syn_tsin(1.8f * (v + 0.25f * tri) + sc->ph);
    }
    case FAM_DOTRING: {
        float best = 1e9f;
        for (int i = 0; i < sc->npts; i++) {
            float du = u - sc->pts[i][0], dv = v - sc->pts[i][1];
            best = RT_MIN(best, du * du + dv * dv);
        }
        return syn_edge(syn_sqrt(best) - 0.14f, unit);
    }
    default:
        return 0.0f;
    }
}

#define SYN_COVER_CASE(f)                                                  \
    case f:                                                                \
        for (size_t p = 0; p < n; p++)                                     \
            cov[p] = syn_coverage(f, sc, u[p], v[p], sc->unit);            \
        break

/* cov[p] = coverage of (u[p], v[p]) for the scene's family, p < n. */
static inline __attribute__((always_inline)) void
syn_cover(const struct syn_scene *sc, const float *u, const float *v, float *cov, size_t n)
{
    switch (sc->family) {
    SYN_COVER_CASE(FAM_STRIPES);
    SYN_COVER_CASE(FAM_RINGS);
    SYN_COVER_CASE(FAM_CHECKER);
    SYN_COVER_CASE(FAM_OVAL);
    SYN_COVER_CASE(FAM_SQUARE);
    SYN_COVER_CASE(FAM_CROSS);
    SYN_COVER_CASE(FAM_DOTS);
    SYN_COVER_CASE(FAM_TRIANGLE);
    SYN_COVER_CASE(FAM_BLOBS);
    SYN_COVER_CASE(FAM_BAR);
    SYN_COVER_CASE(FAM_SPIRAL);
    SYN_COVER_CASE(FAM_STAR);
    SYN_COVER_CASE(FAM_ANNULUS);
    SYN_COVER_CASE(FAM_GRID);
    SYN_COVER_CASE(FAM_WAVE);
    SYN_COVER_CASE(FAM_EDGE);
    SYN_COVER_CASE(FAM_PLAID);
    SYN_COVER_CASE(FAM_CHEVRON);
    SYN_COVER_CASE(FAM_ZIGZAG);
    SYN_COVER_CASE(FAM_DOTRING);
    default:
        memset(cov, 0, n * sizeof(*cov));
        break;
    }
}

#undef SYN_COVER_CASE

/* ---- one record --------------------------------------------------------------------- */

static int syn_num_classes(enum rt_synth_format format)
{
    return format == RT_SYNTH_CIFAR100 ? SYN_FAMILIES * SYN_VARIANTS : 10;
}

/*
 * Stream id of a record or label block: bit 62 the kind, bits 59-60 the
 * format, bits 56-57 the split, bits 0-55 the index. Indices are below
 * SYN_MAX_RECORDS, so ids never collide.
 */
static uint64_t syn_stream(int kind, enum rt_synth_format format, enum rt_split split, uint64_t index)
{
    return ((uint64_t)kind << 62) | ((uint64_t)(format & 3) << 59) | ((uint64_t)(split & 3) << 56) |
           (index & ((UINT64_C(1) << 56) - 1));
}

/* Class of record `index`: position index % K of block index / K's shuffle. */
static int32_t syn_label(enum rt_synth_format format, uint64_t seed, enum rt_split split,
                         uint64_t index)
{
    uint8_t perm[SYN_FAMILIES * SYN_VARIANTS];
    const uint32_t k = (uint32_t)syn_num_classes(format);
    const uint32_t pos = (uint32_t)(index % k);
    struct rt_rng r;

    rt_rng_init(&r, seed, syn_stream(STREAM_LABELS, format, split, index / k));
    for (uint32_t i = 0; i < k; i++)
        perm[i] = (uint8_t)i;
    /* Forward Fisher-Yates fixes perm[i] at step i, so stop at pos. */
    for (uint32_t i = 0; i + 1 < k && i <= pos; i++) {
        uint32_t j = i + rt_rng_below(&r, k - i);
        uint8_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    return perm[pos];
}

static float syn_lum(const float c[3]) { return 0.299f * c[0] + 0.587f * c[1] + 0.114f * c[2]; }

static void syn_scene_draw(struct syn_scene *sc, enum rt_synth_format format, int32_t label,
                           int size, struct rt_rng *r)
{
    const float shift = 0.12f * (float)size;
    float scale, angle;

    memset(sc, 0, sizeof(*sc));
    if (format == RT_SYNTH_CIFAR100) {
        sc->family = label / SYN_VARIANTS;
        sc->variant = label % SYN_VARIANTS;
    } else {
        sc->family = label;
        sc->variant = (int)rt_rng_below(r, SYN_VARIANTS);
    }
    sc->cx = 0.5f * (float)size + (2.0f * rt_rng_uniform(r) - 1.0f) * shift;
    sc->cy = 0.5f * (float)size + (2.0f * rt_rng_uniform(r) - 1.0f) * shift;
    scale = 0.85f + 0.3f * rt_rng_uniform(r);
    sc->unit = 0.5f * (float)size * scale;
    if (syn_free_rotation(sc->family)) {
        angle = rt_rng_uniform(r);
    } else {
        float jitter = sc->family == FAM_TRIANGLE ? 5.0f / 360.0f : 8.0f / 360.0f;
        angle = syn_variant_angle(sc->family, sc->variant) +
                (2.0f * rt_rng_uniform(r) - 1.0f) * jitter;
    }
    sc->cs = syn_tcos(angle);
    sc->sn = syn_tsin(angle);
    sc->ph = rt_rng_uniform(r);
    sc->ph2 = rt_rng_uniform(r);
    sc->fj = 0.9f + 0.2f * rt_rng_uniform(r);
    if (syn_texture(sc->family))
        sc->window = 0.7f + 0.8f * rt_rng_uniform(r);
    if (sc->family == FAM_BLOBS) {
        sc->npts = sc->variant + 1;
        for (int i = 0; i < sc->npts; i++) {
            sc->pts[i][0] = 1.1f * rt_rng_uniform(r) - 0.55f;
            sc->pts[i][1] = 1.1f * rt_rng_uniform(r) - 0.55f;
        }
    } else if (sc->family == FAM_DOTRING) {
        sc->npts = sc->variant + 3;
        for (int i = 0; i < sc->npts; i++) {
            float t = (float)i / (float)sc->npts;
            sc->pts[i][0] = 0.5f * syn_tcos(t);
            sc->pts[i][1] = 0.5f * syn_tsin(t);
        }
    }

    if (format == RT_SYNTH_MNIST) {
        /* Bright strokes on a black ground, as the digits are; the light
         * gradient and the noise touch only the strokes (syn_render()). */
        sc->bg[0] = 0.0f;
        sc->fg[0] = 0.7f + 0.3f * rt_rng_uniform(r);
        float amp = 0.15f * rt_rng_uniform(r), dir = rt_rng_uniform(r);
        sc->gx = amp * syn_tcos(dir) / (float)size;
        sc->gy = amp * syn_tsin(dir) / (float)size;
        sc->noise = 0.02f + 0.06f * rt_rng_uniform(r);
    } else {
        /* Colours are independent of the class; demand some luminance contrast
         * so that the pattern is visible. Either may be the brighter. */
        for (int tries = 0; tries < 32; tries++) {
            for (int c = 0; c < 3; c++) {
                sc->fg[c] = rt_rng_uniform(r);
                sc->bg[c] = rt_rng_uniform(r);
            }
            if (fabsf(syn_lum(sc->fg) - syn_lum(sc->bg)) >= 0.25f)
                break;
        }
        float amp = 0.3f * rt_rng_uniform(r), dir = rt_rng_uniform(r);
        sc->gx = amp * syn_tcos(dir) / (float)size;
        sc->gy = amp * syn_tsin(dir) / (float)size;
        sc->noise = 0.02f + 0.08f * rt_rng_uniform(r);
        /* Sometimes a solid rectangle of a third colour hides part of the
         * pattern, so that no single region gives the class away. */
        if (rt_rng_uniform(r) < 0.4f) {
            sc->occ_x = (float)size * rt_rng_uniform(r);
            sc->occ_y = (float)size * rt_rng_uniform(r);
            sc->occ_w = (float)size * (0.1f + 0.1f * rt_rng_uniform(r));
            sc->occ_h = (float)size * (0.1f + 0.1f * rt_rng_uniform(r));
            for (int c = 0; c < 3; c++)
                sc->occ_col[c] = rt_rng_uniform(r);
        }
    }
    sc->noise_seed = rt_rng_u64(r);
}

/* splitmix64: the per-pixel noise needs 384 words per CIFAR image, more than
 * is worth drawing from Philox; it is seeded from the record's Philox stream. */
static inline uint64_t syn_mix_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Uniform noise bytes (mean 127.5, std 73.9) in the order of the pixels; n
 * is a multiple of 8. Byte j of each word is bits 8j..8j+7 on any host. */
static void syn_noise_fill(uint64_t seed, uint8_t *noise, size_t n)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t z = syn_mix_next(&s);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        z = __builtin_bswap64(z);
#endif
        memcpy(noise + i, &z, 8);
    }
}

/*
 * Renders a drawn scene into `channels` planes of size x size bytes. Always
 * inlined with constant sizes (one copy per format) so that the loops have
 * fixed trip counts and are vectorised at -O2.
 */
static inline __attribute__((always_inline)) void
syn_render(const struct syn_scene *sc, uint8_t *out, const int size, const int channels)
{
    enum { MAXP = SYN_CIFAR_SIZE * SYN_CIFAR_SIZE };
    const size_t plane = (size_t)size * (size_t)size;
    float u[MAXP], v[MAXP], cov[MAXP], light[MAXP], occ[MAXP];
    float ox[SYN_CIFAR_SIZE], oy[SYN_CIFAR_SIZE];
    uint8_t noise[SYN_CIFAR_PIXELS];
    const float inv_unit = 1.0f / sc->unit;

    syn_noise_fill(sc->noise_seed, noise, plane * (size_t)channels);
    for (int y = 0; y < size; y++) {
        const float dy = (float)y + 0.5f - sc->cy;
        for (int x = 0; x < size; x++) {
            const float dx = (float)x + 0.5f - sc->cx;
            const size_t p = (size_t)y * (size_t)size + (size_t)x;
            u[p] = (dx * sc->cs + dy * sc->sn) * inv_unit;
            v[p] = (dy * sc->cs - dx * sc->sn) * inv_unit;
            light[p] = sc->gx * dx + sc->gy * dy;
        }
    }
    syn_cover(sc, u, v, cov, plane);
    if (sc->window > 0.0f) {
        const float win_unit = sc->unit * 0.5f; /* two-pixel window edge */
        for (size_t p = 0; p < plane; p++)
            cov[p] *= syn_edge(syn_sqrt(u[p] * u[p] + v[p] * v[p]) - sc->window, win_unit);
    }
    for (int i = 0; i < size; i++) {
        ox[i] = syn_edge(fabsf((float)i + 0.5f - sc->occ_x) - sc->occ_w, 1.0f);
        oy[i] = syn_edge(fabsf((float)i + 0.5f - sc->occ_y) - sc->occ_h, 1.0f);
    }
    for (int y = 0; y < size; y++)
        for (int x = 0; x < size; x++)
            occ[y * size + x] = sc->occ_w > 0.0f ? oy[y] * ox[x] : 0.0f;

    /* Scales the noise's std of 73.9 to sc->noise (intensity 0..1). */
    const float namp = sc->noise * (1.0f / 73.9f);
    /* Grey (MNIST) images keep an exactly black ground: light and noise are
     * weighted by the pattern's coverage. The test folds at compile time. */
    const int masked = channels == 1;
    for (int c = 0; c < channels; c++) {
        const float bg = sc->bg[c], diff = sc->fg[c] - sc->bg[c], oc = sc->occ_col[c];
        const uint8_t *nz = noise + (size_t)c * plane;
        uint8_t *o = out + (size_t)c * plane;
        for (size_t p = 0; p < plane; p++) {
            float val = bg + cov[p] * diff;
            val += occ[p] * (oc - val);
            float extra = light[p] + namp * ((float)nz[p] - 127.5f);
            val = (val + (masked ? cov[p] * extra : extra)) * 255.0f + 0.5f;
            val = val > 0.0f ? val : 0.0f;
            val = val < 255.0f ? val : 255.0f;
            o[p] = (uint8_t)(int)val;
        }
    }
}

void rt_synth_record(enum rt_synth_format format, uint64_t seed, enum rt_split split,
                     uint64_t index, uint8_t *out, int32_t *label)
{
    struct syn_scene sc;
    struct rt_rng r;

    if (format != RT_SYNTH_CIFAR10 && format != RT_SYNTH_CIFAR100 && format != RT_SYNTH_MNIST) {
        *label = -1;
        return;
    }
    *label = syn_label(format, seed, split, index);
    rt_rng_init(&r, seed, syn_stream(STREAM_IMAGE, format, split, index));
    if (format == RT_SYNTH_MNIST) {
        syn_scene_draw(&sc, format, *label, SYN_MNIST_SIZE, &r);
        syn_render(&sc, out, SYN_MNIST_SIZE, 1);
    } else {
        syn_scene_draw(&sc, format, *label, SYN_CIFAR_SIZE, &r);
        syn_render(&sc, out, SYN_CIFAR_SIZE, 3);
    }
}

/* ---- rendering many records ------------------------------------------------------- */

/* Records [first, first + n) of a split, rendered into a file image. */
struct syn_job {
    enum rt_synth_format format;
    uint64_t seed;
    enum rt_split split;
    uint64_t first;
    uint64_t n;
    uint8_t *pix;        /* pixels of record 0 */
    size_t pix_stride;
    uint8_t *lab;        /* label byte(s) of record 0 */
    size_t lab_stride;
};

struct syn_worker {
    const struct syn_job *job;
    uint64_t begin, end; /* relative to job->first */
    pthread_t tid;
};

static void syn_job_run(const struct syn_job *job, uint64_t begin, uint64_t end)
{
    for (uint64_t i = begin; i < end; i++) {
        int32_t label;
        rt_synth_record(job->format, job->seed, job->split, job->first + i,
                        job->pix + i * job->pix_stride, &label);
        uint8_t *l = job->lab + i * job->lab_stride;
        if (job->format == RT_SYNTH_CIFAR100) {
            l[0] = (uint8_t)(label / SYN_VARIANTS);
            l[1] = (uint8_t)label;
        } else {
            l[0] = (uint8_t)label;
        }
    }
}

static void *syn_worker_main(void *arg)
{
    const struct syn_worker *w = arg;
    syn_job_run(w->job, w->begin, w->end);
    return NULL;
}

/* Renders a job on `threads` threads. Cannot fail: a thread that cannot be
 * started has its share rendered by the caller. */
static void syn_job_render(const struct syn_job *job, int threads)
{
    struct syn_worker workers[SYN_MAX_THREADS];
    int started[SYN_MAX_THREADS];

    if ((uint64_t)threads > job->n / 64 + 1)
        threads = (int)(job->n / 64 + 1);
    if (threads <= 1) {
        syn_job_run(job, 0, job->n);
        return;
    }
    for (int t = 0; t < threads; t++) {
        workers[t].job = job;
        workers[t].begin = job->n * (uint64_t)t / (uint64_t)threads;
        workers[t].end = job->n * (uint64_t)(t + 1) / (uint64_t)threads;
        started[t] = 0;
    }
    for (int t = 1; t < threads; t++)
        started[t] = pthread_create(&workers[t].tid, NULL, syn_worker_main, &workers[t]) == 0;
    syn_job_run(job, workers[0].begin, workers[0].end);
    for (int t = 1; t < threads; t++) {
        if (started[t])
            pthread_join(workers[t].tid, NULL);
        else
            syn_job_run(job, workers[t].begin, workers[t].end);
    }
}

static int syn_default_threads(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* ---- files -------------------------------------------------------------------------- */

static int syn_path(char *buf, size_t len, const char *dir, const char *name)
{
    if ((size_t)snprintf(buf, len, "%s/%s", dir, name) >= len)
        return rt_errf(-ENAMETOOLONG, "%s/%s: path too long", dir, name);
    return 0;
}

/* Writes one text file of class names, one per line, then `extra_newline`. */
static int syn_write_names(const char *dir, const char *file, int count, int fine, int extra_newline)
{
    char path[4096];
    char *text;
    size_t len = 0, cap = (size_t)count * 24 + 2;
    int rc = syn_path(path, sizeof(path), dir, file);

    if (rc < 0)
        return rc;
    text = rt_malloc(cap, path);
    if (!text)
        return -ENOMEM;
    for (int i = 0; i < count; i++) {
        if (fine)
            len += (size_t)snprintf(text + len, cap - len, "%s_%d\n",
                                    family_name[i / SYN_VARIANTS], i % SYN_VARIANTS);
        else
            len += (size_t)snprintf(text + len, cap - len, "%s\n", family_name[i]);
    }
    if (extra_newline)
        text[len++] = '\n';
    rc = rt_file_write_atomic(path, text, len);
    free(text);
    return rc;
}

/* Renders records [first, first + n) of `split` as one CIFAR binary file. */
static int syn_write_cifar_file(const char *dir, const char *file, const struct rt_synth_opts *opts,
                                enum rt_split split, uint64_t first, uint64_t n, int threads)
{
    const size_t lab_bytes = opts->format == RT_SYNTH_CIFAR100 ? 2 : 1;
    const size_t rec = lab_bytes + SYN_CIFAR_PIXELS;
    char path[4096];
    uint8_t *buf;
    int rc = syn_path(path, sizeof(path), dir, file);

    if (rc < 0)
        return rc;
    buf = rt_malloc((size_t)n * rec, path);
    if (!buf)
        return -ENOMEM;
    struct syn_job job = {
        .format = opts->format, .seed = opts->seed, .split = split, .first = first, .n = n,
        .pix = buf + lab_bytes, .pix_stride = rec, .lab = buf, .lab_stride = rec,
    };
    syn_job_render(&job, threads);
    rc = rt_file_write_atomic(path, buf, (size_t)n * rec);
    free(buf);
    return rc;
}

static int syn_write_cifar10(const char *outdir, const struct rt_synth_opts *opts, int threads)
{
    char dir[4096];
    int rc = syn_path(dir, sizeof(dir), outdir, "cifar-10-batches-bin");

    if (rc < 0 || (rc = rt_mkdirs(dir, 0755)) < 0)
        return rc;
    /* Five batches, as even as possible, the first ones taking the remainder. */
    uint64_t first = 0;
    for (uint64_t b = 0; b < 5; b++) {
        char name[32];
        uint64_t n = opts->train / 5 + (b < opts->train % 5 ? 1 : 0);
        snprintf(name, sizeof(name), "data_batch_%d.bin", (int)b + 1);
        rc = syn_write_cifar_file(dir, name, opts, RT_SPLIT_TRAIN, first, n, threads);
        if (rc < 0)
            return rc;
        first += n;
    }
    rc = syn_write_cifar_file(dir, "test_batch.bin", opts, RT_SPLIT_TEST, 0, opts->test, threads);
    if (rc < 0)
        return rc;
    return syn_write_names(dir, "batches.meta.txt", 10, 0, 1);
}

static int syn_write_cifar100(const char *outdir, const struct rt_synth_opts *opts, int threads)
{
    char dir[4096];
    int rc = syn_path(dir, sizeof(dir), outdir, "cifar-100-binary");

    if (rc < 0 || (rc = rt_mkdirs(dir, 0755)) < 0)
        return rc;
    rc = syn_write_cifar_file(dir, "train.bin", opts, RT_SPLIT_TRAIN, 0, opts->train, threads);
    if (rc == 0)
        rc = syn_write_cifar_file(dir, "test.bin", opts, RT_SPLIT_TEST, 0, opts->test, threads);
    if (rc == 0)
        rc = syn_write_names(dir, "fine_label_names.txt", SYN_FAMILIES * SYN_VARIANTS, 1, 0);
    if (rc == 0)
        rc = syn_write_names(dir, "coarse_label_names.txt", SYN_FAMILIES, 0, 0);
    return rc;
}

static void syn_put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/*
 * gzips `len` bytes and writes them atomically to `path`. The gzip header is
 * zlib's default one (mtime 0, no name), so equal input gives equal bytes.
 * Run-length matching only: on noisy pixels it compresses as well as the
 * default strategy at about twice the speed.
 */
static int syn_write_gz(const char *path, const uint8_t *data, size_t len)
{
    z_stream zs;
    uint8_t *out = NULL;
    size_t cap;
    int rc, zrc;

    memset(&zs, 0, sizeof(zs));
    zrc = deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_RLE);
    if (zrc != Z_OK)
        return rt_errf(zrc == Z_MEM_ERROR ? -ENOMEM : -EINVAL, "%s: deflateInit2 failed: %s", path,
                       zs.msg ? zs.msg : zError(zrc));
    cap = (size_t)deflateBound(&zs, (uLong)len);
    out = rt_malloc(cap, path);
    if (!out) {
        rc = -ENOMEM;
        goto out;
    }
    zs.next_in = (Bytef *)data;
    zs.next_out = out;
    /* avail_in/avail_out are 32-bit: feed and drain in pieces of at most 1 GiB. */
    size_t in_left = len;
    do {
        if (zs.avail_in == 0 && in_left > 0) {
            zs.avail_in = (uInt)RT_MIN(in_left, (size_t)1 << 30);
            in_left -= zs.avail_in;
        }
        zs.avail_out = (uInt)RT_MIN(cap - (size_t)(zs.next_out - out), (size_t)1 << 30);
        zrc = deflate(&zs, in_left == 0 ? Z_FINISH : Z_NO_FLUSH);
    } while (zrc == Z_OK);
    if (zrc != Z_STREAM_END) {
        rc = rt_errf(-EIO, "%s: deflate failed: %s", path, zs.msg ? zs.msg : zError(zrc));
        goto out;
    }
    rc = rt_file_write_atomic(path, out, (size_t)(zs.next_out - out));
out:
    deflateEnd(&zs);
    free(out);
    return rc;
}

/* Writes one MNIST split: the images file and the labels file. */
static int syn_write_mnist_split(const char *outdir, const char *prefix, const struct rt_synth_opts *opts,
                                 enum rt_split split, uint64_t n, int threads)
{
    char path[4096], name[64];
    const size_t img_len = 16 + (size_t)n * SYN_MNIST_PIXELS, lab_len = 8 + (size_t)n;
    uint8_t *img = NULL, *lab = NULL;
    int rc;

    img = rt_malloc(img_len, "synthetic MNIST images");
    lab = img ? rt_malloc(lab_len, "synthetic MNIST labels") : NULL;
    if (!lab) {
        rc = -ENOMEM;
        goto out;
    }
    syn_put_be32(img, 0x00000803);
    syn_put_be32(img + 4, (uint32_t)n);
    syn_put_be32(img + 8, SYN_MNIST_SIZE);
    syn_put_be32(img + 12, SYN_MNIST_SIZE);
    syn_put_be32(lab, 0x00000801);
    syn_put_be32(lab + 4, (uint32_t)n);
    struct syn_job job = {
        .format = RT_SYNTH_MNIST, .seed = opts->seed, .split = split, .first = 0, .n = n,
        .pix = img + 16, .pix_stride = SYN_MNIST_PIXELS, .lab = lab + 8, .lab_stride = 1,
    };
    syn_job_render(&job, threads);

    snprintf(name, sizeof(name), "%s-images-idx3-ubyte.gz", prefix);
    rc = syn_path(path, sizeof(path), outdir, name);
    if (rc == 0)
        rc = syn_write_gz(path, img, img_len);
    if (rc < 0)
        goto out;
    snprintf(name, sizeof(name), "%s-labels-idx1-ubyte.gz", prefix);
    rc = syn_path(path, sizeof(path), outdir, name);
    if (rc == 0)
        rc = syn_write_gz(path, lab, lab_len);
out:
    free(img);
    free(lab);
    return rc;
}

static int syn_write_mnist(const char *outdir, const struct rt_synth_opts *opts, int threads)
{
    int rc = rt_mkdirs(outdir, 0755);

    if (rc == 0)
        rc = syn_write_mnist_split(outdir, "train", opts, RT_SPLIT_TRAIN, opts->train, threads);
    if (rc == 0)
        rc = syn_write_mnist_split(outdir, "t10k", opts, RT_SPLIT_TEST, opts->test, threads);
    return rc;
}

int rt_synth_write(const char *outdir, const struct rt_synth_opts *opts)
{
    int threads;

    if (!outdir || !*outdir || !opts)
        return rt_errf(-EINVAL, "synth: no output directory or options given");
    if (opts->format != RT_SYNTH_CIFAR10 && opts->format != RT_SYNTH_CIFAR100 &&
        opts->format != RT_SYNTH_MNIST)
        return rt_errf(-EINVAL, "synth: unknown format %d", (int)opts->format);
    if (opts->train < 1 || opts->train > SYN_MAX_RECORDS)
        return rt_errf(-EINVAL, "synth: train record count must be 1..%u (got %llu)",
                       SYN_MAX_RECORDS, (unsigned long long)opts->train);
    if (opts->test < 1 || opts->test > SYN_MAX_RECORDS)
        return rt_errf(-EINVAL, "synth: test record count must be 1..%u (got %llu)",
                       SYN_MAX_RECORDS, (unsigned long long)opts->test);
    /* A file is built in memory; only matters where size_t is 32 bits. */
    if (RT_MAX(opts->train, opts->test) > SIZE_MAX / (2 + SYN_CIFAR_PIXELS))
        return rt_errf(-EFBIG, "synth: %llu records do not fit in memory",
                       (unsigned long long)RT_MAX(opts->train, opts->test));
    if (opts->threads < 0)
        return rt_errf(-EINVAL, "synth: thread count must be >= 0 (got %d)", opts->threads);
    threads = opts->threads ? opts->threads : syn_default_threads();
    threads = RT_MIN(threads, SYN_MAX_THREADS);

    switch (opts->format) {
    case RT_SYNTH_CIFAR10: return syn_write_cifar10(outdir, opts, threads);
    case RT_SYNTH_CIFAR100: return syn_write_cifar100(outdir, opts, threads);
    case RT_SYNTH_MNIST: return syn_write_mnist(outdir, opts, threads);
    }
    return -EINVAL;
}
