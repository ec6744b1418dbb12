/*
 * augment.c - uint8 augmentation written straight into the batch slot:
 * random crop out of a zero- or reflect-padded image, and horizontal flip
 * (random, or alternating every other epoch per sample); then, in place,
 * ColorJitter's brightness, contrast and saturation, RandomErasing and
 * Cutout. Also the spelling of an augmentation (rt_aug_parse/describe).
 *
 * The padded image is never built: each output row maps to one source row
 * (or to zeros); that row is padded into a small buffer and the crop is one
 * contiguous (or reversed) copy out of it, which compiles to vector moves.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "loader/loader.h"

/* RNG stream namespaces of the augmentation (the sampler uses 1..3 << 56). */
#define STREAM_AUG  (UINT64_C(8) << 56)
#define STREAM_FLIP (UINT64_C(9) << 56)
/* (rrc.c's RandomResizedCrop is 10.) */
#define STREAM_COLOR (UINT64_C(11) << 56)
#define STREAM_ERASE (UINT64_C(12) << 56)

/* The per-sample part of a stream id: the epoch and the sample's id. */
static uint64_t sample_key(uint64_t epoch, uint64_t id)
{
    return (epoch << 40) | (id & ((UINT64_C(1) << 40) - 1));
}

/* Source index for padded coordinate i (0 <= i+pad < n + 2 pad), or -1 for a zero. */
static inline long resolve(long i, long n, enum rt_pad_mode mode)
{
    if (i >= 0 && i < n)
        return i;
    if (mode == RT_PAD_ZERO)
        return -1;
    return i < 0 ? -i : 2 * (n - 1) - i;
}

/* Reversed copy; written plainly so the vectoriser turns it into byte shuffles. */
static inline void copy_reversed(uint8_t *restrict d, const uint8_t *restrict s, long n)
{
    for (long x = 0; x < n; x++)
        d[x] = s[n - 1 - x];
}

/*
 * One output row: out[x] = padded[x + pad + shift] (flipped: padded[w-1-x +
 * pad + shift]). For the small rows of CIFAR the padded row is built in
 * `tmp` (a row copy plus `pad` edge bytes each side) so the crop itself is
 * one contiguous copy.
 */
static inline void crop_row(const uint8_t *restrict srow, uint8_t *restrict drow, uint8_t *restrict tmp, long w,
                            long pad, long shift, int flip, enum rt_pad_mode mode)
{
    const long lo = shift < 0 ? -shift : 0, hi = shift > 0 ? shift : 0; /* edge bytes the crop reads */
    if (!shift) {
        if (flip)
            copy_reversed(drow, srow, w);
        else
            memcpy(drow, srow, (size_t)w);
        return;
    }
    memcpy(tmp + pad, srow, (size_t)w);
    /* Zero edges were written once per image; reflected ones depend on the row. */
    if (mode == RT_PAD_REFLECT) {
        for (long i = pad - lo; i < pad; i++)
            tmp[i] = srow[resolve(i - pad, w, mode)];
        for (long i = 0; i < hi; i++)
            tmp[pad + w + i] = srow[resolve(w + i, w, mode)];
    }
    if (flip)
        copy_reversed(drow, tmp + pad + shift, w);
    else
        memcpy(drow, tmp + pad + shift, (size_t)w);
}

/* Rows up to this wide are padded in a stack buffer; wider ones go pixel by pixel. */
#define STACK_ROW 1024

/* Any width: each pixel resolved on its own (images too wide for the row buffer). */
static void crop_row_generic(const uint8_t *srow, uint8_t *drow, long w, long shift, int flip, enum rt_pad_mode mode)
{
    for (long x = 0; x < w; x++) {
        long sx = resolve((flip ? w - 1 - x : x) + shift, w, mode);
        drow[x] = sx < 0 ? 0 : srow[sx];
    }
}

/* Padded images up to this size are built whole in a per-thread buffer. */
#define PADDED_MAX (64 * 1024)

/*
 * The small-image path: copy the image into the middle of a padded buffer
 * (borders zero, or reflected per image), then cut the crop out row by row.
 * Building the whole padded image before reading any of it matters: reading
 * a row back right after writing it in pieces stalls on store forwarding.
 * Inlined into rt_augment twice -- with the CIFAR shape as constants, so each
 * row copy is a single vector move, and generic.
 */
static inline __attribute__((always_inline)) void crop_padded(const uint8_t *src, uint8_t *dst, uint32_t c, long h,
                                                              long w, long pad, long dy, long dx, int flip,
                                                              enum rt_pad_mode mode, uint8_t *buf)
{
    const long pw = w + 2 * pad, ph = h + 2 * pad;
    const size_t plane = (size_t)h * w, pplane = (size_t)ph * pw;

    for (uint32_t ch = 0; ch < c; ch++) {
        uint8_t *pp = buf + pplane * ch;
        const uint8_t *sp = src + plane * ch;
        for (long y = 0; y < h; y++) {
            uint8_t *row = pp + (size_t)(y + pad) * pw + pad;
            memcpy(row, sp + (size_t)y * w, (size_t)w);
            if (mode == RT_PAD_REFLECT)
                for (long i = 1; i <= pad; i++) {
                    row[-i] = row[i];
                    row[w - 1 + i] = row[w - 1 - i];
                }
        }
        if (mode == RT_PAD_REFLECT)
            for (long i = 1; i <= pad; i++) {
                memcpy(pp + (size_t)(pad - i) * pw, pp + (size_t)(pad + i) * pw, (size_t)pw);
                memcpy(pp + (size_t)(pad + h - 1 + i) * pw, pp + (size_t)(pad + h - 1 - i) * pw, (size_t)pw);
            }
    }
    for (uint32_t ch = 0; ch < c; ch++) {
        const uint8_t *pp = buf + pplane * ch + (size_t)(pad + dy) * pw + pad + dx;
        uint8_t *dp = dst + plane * ch;
        for (long y = 0; y < h; y++) {
            if (flip)
                copy_reversed(dp + (size_t)y * w, pp + (size_t)y * pw, w);
            else
                memcpy(dp + (size_t)y * w, pp + (size_t)y * pw, (size_t)w);
        }
    }
}

/* Larger images: one row at a time (see crop_row), or pixel by pixel when very wide. */
static void crop_rows(const uint8_t *src, uint8_t *dst, uint32_t c, long h, long w, long pad, long dy, long dx,
                      int flip, enum rt_pad_mode mode)
{
    const size_t plane = (size_t)h * w;
    uint8_t tmp[STACK_ROW];
    const int narrow = w + 2 * pad <= STACK_ROW;

    if (narrow && mode == RT_PAD_ZERO)
        memset(tmp, 0, (size_t)(w + 2 * pad));
    for (uint32_t ch = 0; ch < c; ch++) {
        const uint8_t *sp = src + plane * ch;
        uint8_t *dp = dst + plane * ch;
        for (long y = 0; y < h; y++) {
            long sy = resolve(y + dy, h, mode);
            if (sy < 0)
                memset(dp + (size_t)y * w, 0, (size_t)w);
            else if (narrow)
                crop_row(sp + (size_t)sy * w, dp + (size_t)y * w, tmp, w, pad, dx, flip, mode);
            else
                crop_row_generic(sp + (size_t)sy * w, dp + (size_t)y * w, w, dx, flip, mode);
        }
    }
}

/* ---- the draws ------------------------------------------------------------------------------------- */

static const float ERASE_SCALE[2] = {0.02f, 0.33f}, ERASE_RATIO[2] = {0.3f, 3.3f};

/* RandomErasing's rectangle, as torchvision draws it: up to 10 tries of an area share and a log-uniform aspect. */
static void draw_erase(const struct rt_aug *a, struct rt_rng *r, uint32_t h, uint32_t w, uint32_t box[4])
{
    if (!(rt_rng_uniform(r) < a->erase_p))
        return;
    const float *sc = a->erase_scale[1] > 0 ? a->erase_scale : ERASE_SCALE;
    const float *ra = a->erase_ratio[1] > 0 ? a->erase_ratio : ERASE_RATIO;
    const double area = (double)h * w, log_lo = log(ra[0]), log_hi = log(ra[1]);
    for (int t = 0; t < 10; t++) {
        const double target = area * (sc[0] + (sc[1] - sc[0]) * (double)rt_rng_uniform(r));
        const double aspect = exp(log_lo + (log_hi - log_lo) * (double)rt_rng_uniform(r));
        const long eh = lround(sqrt(target * aspect)), ew = lround(sqrt(target / aspect));
        if (!(eh < (long)h && ew < (long)w))
            continue;
        box[0] = rt_rng_below(r, (uint32_t)(h - eh + 1));
        box[1] = rt_rng_below(r, (uint32_t)(w - ew + 1));
        box[2] = (uint32_t)eh;
        box[3] = (uint32_t)ew;
        return;
    }
}

/* Cutout's square: centred on a random pixel, clipped to the image. */
static void draw_cutout(uint32_t size, struct rt_rng *r, uint32_t h, uint32_t w, uint32_t box[4])
{
    const long cy = rt_rng_below(r, h), cx = rt_rng_below(r, w), half = size / 2;
    const long y0 = RT_MAX(cy - half, 0L), x0 = RT_MAX(cx - half, 0L);
    const long y1 = RT_MIN(cy - half + (long)size, (long)h), x1 = RT_MIN(cx - half + (long)size, (long)w);
    box[0] = (uint32_t)y0;
    box[1] = (uint32_t)x0;
    box[2] = (uint32_t)(y1 - y0);
    box[3] = (uint32_t)(x1 - x0);
}

void rt_aug_draw(const struct rt_aug *a, uint64_t seed, uint64_t epoch, uint64_t id, uint32_t h, uint32_t w,
                 struct rt_aug_draw *d)
{
    memset(d, 0, sizeof(*d));
    struct rt_rng r;
    if (a->pad || a->flip == RT_FLIP_RANDOM) {
        rt_rng_init(&r, seed, STREAM_AUG | sample_key(epoch, id));
        if (a->pad) {
            d->dy = (long)rt_rng_below(&r, 2 * a->pad + 1) - (long)a->pad;
            d->dx = (long)rt_rng_below(&r, 2 * a->pad + 1) - (long)a->pad;
        }
        if (a->flip == RT_FLIP_RANDOM)
            d->flip = rt_rng_u32(&r) & 1;
    }
    if (a->flip == RT_FLIP_ALTERNATE) {
        rt_rng_init(&r, seed, STREAM_FLIP | (id & ((UINT64_C(1) << 40) - 1)));
        d->flip = (int)((rt_rng_u32(&r) ^ epoch) & 1);
    }
    if (a->jitter[0] > 0 || a->jitter[1] > 0 || a->jitter[2] > 0) {
        /* ColorJitter: a random order of the three (Fisher-Yates), then each factor in that order. */
        enum rt_jitter perm[RT_JITTER_COUNT] = {RT_JITTER_BRIGHTNESS, RT_JITTER_CONTRAST, RT_JITTER_SATURATION};
        rt_rng_init(&r, seed, STREAM_COLOR | sample_key(epoch, id));
        for (uint32_t i = RT_JITTER_COUNT - 1; i > 0; i--) {
            const uint32_t k = rt_rng_below(&r, i + 1);
            const enum rt_jitter t = perm[i];
            perm[i] = perm[k];
            perm[k] = t;
        }
        for (int i = 0; i < RT_JITTER_COUNT; i++) {
            const float v = a->jitter[perm[i]];
            if (!(v > 0))
                continue;
            const float lo = v < 1 ? 1 - v : 0, hi = 1 + v;
            d->order[d->njitter] = perm[i];
            d->factor[d->njitter++] = lo + (hi - lo) * rt_rng_uniform(&r);
        }
    }
    if (a->erase_p > 0 || a->cutout) {
        rt_rng_init(&r, seed, STREAM_ERASE | sample_key(epoch, id));
        if (a->erase_p > 0)
            draw_erase(a, &r, h, w, d->erase);
        if (a->cutout)
            draw_cutout(a->cutout, &r, h, w, d->cut);
    }
}

/* Cloned per ISA: the row copies and the pixel arithmetic in the widest vectors the CPU has (not under sanitizers). */
#ifdef RT_NO_IFUNC
#define RT_CLONES
#else
#define RT_CLONES __attribute__((target_clones("avx2", "default")))
#endif

/* ---- the pixel operations: torchvision's tensor functions on uint8, value for value ------------------- */

/*
 * torchvision's _blend on uint8: (ratio * img1 + (1 - ratio) * img2) in
 * float32, clamped to [0, 255], truncated. This file is compiled without
 * floating-point contraction, so the two products round on their own as
 * torch's separate kernels round them.
 */
static inline uint8_t blend(float ratio, float x, float other)
{
    float v = ratio * x + (1.0f - ratio) * other;
    v = v < 0 ? 0 : v > 255 ? 255 : v;
    return (uint8_t)v;
}

/* rgb_to_grayscale on uint8: 0.2989 r + 0.587 g + 0.114 b in float32, truncated. */
static inline uint8_t gray_of(uint8_t r, uint8_t g, uint8_t b)
{
    return (uint8_t)(0.2989f * (float)r + 0.587f * (float)g + 0.114f * (float)b);
}

/* The blend with one value for every pixel (brightness: 0; contrast: the mean), written so that it vectorises. */
static inline void blend_all(uint8_t *restrict img, size_t n, float ratio, float other)
{
    for (size_t i = 0; i < n; i++)
        img[i] = blend(ratio, img[i], other);
}

/* n pixels of the gray image of a CHW RGB image (planes hw apart), as rgb_to_grayscale makes them. */
static void gray_plane(const uint8_t *restrict img, size_t hw, size_t n, uint8_t *restrict gray)
{
    for (size_t i = 0; i < n; i++)
        gray[i] = gray_of(img[i], img[hw + i], img[2 * hw + i]);
}

/* The gray image is made in pieces of this many pixels, on the stack. */
#define GRAY_CHUNK 4096

RT_CLONES static void jitter_one(enum rt_jitter kind, float f, uint32_t c, size_t hw, uint8_t *img)
{
    uint8_t gray[GRAY_CHUNK];
    switch (kind) {
    case RT_JITTER_BRIGHTNESS:
        blend_all(img, c * hw, f, 0.0f);
        break;
    case RT_JITTER_CONTRAST: {
        /* The mean of the gray image in float32: its sum is exact (below 2^24), then divided as torch's mean. */
        uint64_t sum = 0;
        for (size_t i0 = 0; i0 < hw; i0 += GRAY_CHUNK) {
            const size_t n = RT_MIN((size_t)GRAY_CHUNK, hw - i0);
            const uint8_t *p = img + i0;
            if (c == 3) {
                gray_plane(img + i0, hw, n, gray);
                p = gray;
            }
            uint32_t part = 0;
            for (size_t i = 0; i < n; i++)
                part += p[i];
            sum += part;
        }
        blend_all(img, c * hw, f, (float)sum / (float)hw);
        break;
    }
    case RT_JITTER_SATURATION:
        if (c != 3)
            break;
        for (size_t i0 = 0; i0 < hw; i0 += GRAY_CHUNK) {
            const size_t n = RT_MIN((size_t)GRAY_CHUNK, hw - i0);
            gray_plane(img + i0, hw, n, gray);
            for (uint32_t ch = 0; ch < 3; ch++) {
                uint8_t *restrict p = img + ch * hw + i0;
                for (size_t i = 0; i < n; i++)
                    p[i] = blend(f, p[i], gray[i]);
            }
        }
        break;
    default:
        break;
    }
}

static void fill_box(const uint32_t box[4], const uint8_t *fill, uint32_t c, uint32_t h, uint32_t w, uint8_t *img)
{
    if (!box[2] || !box[3])
        return;
    for (uint32_t ch = 0; ch < c; ch++)
        for (uint32_t y = box[0]; y < box[0] + box[2] && y < h; y++)
            memset(img + ((size_t)ch * h + y) * w + box[1], fill[ch], box[3]);
}

static void apply_pixels(const struct rt_aug *a, const struct rt_aug_draw *d, uint32_t c, uint32_t h, uint32_t w,
                         uint8_t *img)
{
    for (int i = 0; i < d->njitter; i++)
        jitter_one(d->order[i], d->factor[i], c, (size_t)h * w, img);
    fill_box(d->erase, a->fill, c, h, w, img);
    fill_box(d->cut, a->fill, c, h, w, img);
}

/* Per thread: the padded-image buffer and the geometry its zero borders were laid out for. */
static _Thread_local uint8_t padded_buf[PADDED_MAX];
static _Thread_local uint64_t padded_geom;

RT_CLONES void rt_augment(const struct rt_aug *a, uint64_t seed, uint64_t epoch, uint64_t id, uint32_t c,
                          uint32_t h, uint32_t w, const uint8_t *src, uint8_t *dst)
{
    struct rt_aug_draw d;
    rt_aug_draw(a, seed, epoch, id, h, w, &d);
    const long dy = d.dy, dx = d.dx;
    const int flip = d.flip;
    if (!dy && !dx && !flip) {
        memcpy(dst, src, (size_t)c * h * w);
    } else {
        const size_t padded = (size_t)c * (h + 2 * a->pad) * (w + 2 * a->pad);
        if (padded > PADDED_MAX) {
            crop_rows(src, dst, c, h, w, a->pad, dy, dx, flip, a->pad_mode);
        } else {
            /* Zero borders are written once per thread and geometry; the image part is rewritten every call. */
            const uint64_t geom = (uint64_t)c << 48 | (uint64_t)h << 32 | (uint64_t)w << 16 | (uint64_t)a->pad << 2 |
                                  (uint64_t)a->pad_mode << 1 | 1;
            if (padded_geom != geom) {
                memset(padded_buf, 0, padded);
                padded_geom = geom;
            }
            if (h == 32 && w == 32 && a->pad == 4)
                crop_padded(src, dst, c, 32, 32, 4, dy, dx, flip, a->pad_mode, padded_buf);
            else
                crop_padded(src, dst, c, h, w, a->pad, dy, dx, flip, a->pad_mode, padded_buf);
        }
    }
    apply_pixels(a, &d, c, h, w, dst);
}

void rt_augment_pixels(const struct rt_aug *a, uint64_t seed, uint64_t epoch, uint64_t id, uint32_t c, uint32_t h,
                       uint32_t w, uint8_t *img)
{
    if (!(a->jitter[0] > 0 || a->jitter[1] > 0 || a->jitter[2] > 0 || a->erase_p > 0 || a->cutout))
        return;
    struct rt_aug_draw d;
    rt_aug_draw(a, seed, epoch, id, h, w, &d);
    apply_pixels(a, &d, c, h, w, img);
}

/* ---- the spelling ------------------------------------------------------------------------------------ */

/* "V" or "A:B[:C:D...]": up to `max` numbers separated by ':'; returns how many, or -1. */
static int parse_numbers(const char *s, double *v, int max)
{
    int n = 0;
    while (n < max) {
        char *end;
        errno = 0;
        v[n] = strtod(s, &end);
        if (end == s || errno || !isfinite(v[n]))
            return -1;
        n++;
        if (!*end)
            return n;
        if (*end != ':')
            return -1;
        s = end + 1;
    }
    return -1;
}

static const char *const JITTER_NAMES[RT_JITTER_COUNT] = {"brightness", "contrast", "saturation"};

const char *rt_jitter_name(enum rt_jitter kind)
{
    return (unsigned)kind < RT_JITTER_COUNT ? JITTER_NAMES[kind] : "?";
}

static int parse_jitter(const char *tok, const char *val, struct rt_aug *a)
{
    double v;
    int k = -1;
    for (int i = 0; i < RT_JITTER_COUNT; i++)
        if (!strcmp(tok, JITTER_NAMES[i]))
            k = i;
    if (!val || parse_numbers(val, &v, 1) != 1 || v < 0 || v > 100)
        return rt_errf(-EINVAL, "%s=V needs a strength V >= 0 (the factor is drawn from [max(0, 1 - V), 1 + V]), "
                       "not '%s'", tok, val ? val : "");
    for (int i = 0; i < RT_JITTER_COUNT; i++)
        if (i == k || k < 0)
            a->jitter[i] = (float)v;
    return 0;
}

static int parse_erase(const char *val, struct rt_aug *a)
{
    double v[5] = {0.5, 0, 0, 0, 0};
    const int n = val ? parse_numbers(val, v, 5) : 1;
    if (n != 1 && n != 3 && n != 5)
        return rt_errf(-EINVAL, "erase[=P[:SMIN:SMAX[:RMIN:RMAX]]] takes 1, 3 or 5 numbers, not '%s'", val);
    if (!(v[0] > 0 && v[0] <= 1))
        return rt_errf(-EINVAL, "erase: the probability P must be in (0, 1], not %g", v[0]);
    if (n >= 3 && !(v[1] > 0 && v[1] <= v[2] && v[2] < 1))
        return rt_errf(-EINVAL, "erase: the area share SMIN:SMAX must satisfy 0 < SMIN <= SMAX < 1, not %g:%g", v[1],
                       v[2]);
    if (n == 5 && !(v[3] > 0 && v[3] <= v[4]))
        return rt_errf(-EINVAL, "erase: the aspect RMIN:RMAX must satisfy 0 < RMIN <= RMAX, not %g:%g", v[3], v[4]);
    a->erase_p = (float)v[0];
    if (n >= 3) {
        a->erase_scale[0] = (float)v[1];
        a->erase_scale[1] = (float)v[2];
    }
    if (n == 5) {
        a->erase_ratio[0] = (float)v[3];
        a->erase_ratio[1] = (float)v[4];
    }
    return 0;
}

/* A whole number in [lo, hi] for `name=N`. */
static int parse_count(const char *name, const char *val, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end;
    long v = val ? strtol(val, &end, 10) : -1;
    if (!val || !*val || *end || v < (long)lo || v > (long)hi)
        return rt_errf(-EINVAL, "%s needs a size in pixels (%u to %u), not '%s'", name, lo, hi, val ? val : "");
    *out = (uint32_t)v;
    return 0;
}

/* crop-scale=A:B or crop-ratio=A:B: RandomResizedCrop's ranges, 0 < A <= B (<= 1 for the area share). */
static int parse_crop_range(const char *name, const char *val, double hi_max, double out[2])
{
    double v[2];
    if (!val || parse_numbers(val, v, 2) != 2 || !(v[0] > 0 && v[0] <= v[1] && v[1] <= hi_max))
        return rt_errf(-EINVAL, "%s=MIN:MAX needs 0 < MIN <= MAX%s, not '%s'", name,
                       hi_max <= 1 ? " <= 1" : "", val ? val : "");
    out[0] = v[0];
    out[1] = v[1];
    return 0;
}

static int parse_token(char *tok, struct rt_aug *a)
{
    char *val = strchr(tok, '=');
    if (val)
        *val++ = 0;
    if (!strcmp(tok, "crop-scale"))
        return parse_crop_range(tok, val, 1.0, a->crop_scale);
    if (!strcmp(tok, "crop-ratio"))
        return parse_crop_range(tok, val, 1e6, a->crop_ratio);
    if (!strcmp(tok, "crop")) {
        a->pad = 4;
        return val ? parse_count("crop=PAD", val, 0, 4096, &a->pad) : 0;
    }
    if (!strcmp(tok, "cutout"))
        return parse_count("cutout=SIZE", val, 1, 4096, &a->cutout);
    if (!strcmp(tok, "erase"))
        return parse_erase(val, a);
    if (!strcmp(tok, "jitter") || !strcmp(tok, "brightness") || !strcmp(tok, "contrast") ||
        !strcmp(tok, "saturation"))
        return parse_jitter(tok, val, a);
    if (val)
        return rt_errf(-EINVAL, "'%s' takes no value", tok);
    if (!strcmp(tok, "reflect"))
        a->pad_mode = RT_PAD_REFLECT;
    else if (!strcmp(tok, "flip"))
        a->flip = RT_FLIP_RANDOM;
    else if (!strcmp(tok, "alternate-flip"))
        a->flip = RT_FLIP_ALTERNATE;
    else
        return rt_errf(-EINVAL, "unknown '%s' (crop[=PAD], reflect, crop-scale=SMIN:SMAX, crop-ratio=RMIN:RMAX, "
                       "flip, alternate-flip, brightness=V, contrast=V, saturation=V, jitter=V, "
                       "erase[=P[:SMIN:SMAX[:RMIN:RMAX]]], cutout=SIZE, none)",
                       tok);
    return 0;
}

int rt_aug_parse(const char *spec, struct rt_aug *a)
{
    char buf[512], *save = NULL;
    memset(a, 0, sizeof(*a));
    if (!spec || !*spec)
        return rt_errf(-EINVAL, "an empty augmentation (say none)");
    if (!strcmp(spec, "none"))
        return 0;
    if (strlen(spec) >= sizeof(buf))
        return rt_errf(-EINVAL, "the augmentation '%.40s...' is too long", spec);
    snprintf(buf, sizeof(buf), "%s", spec);
    for (char *tok = strtok_r(buf, ",+", &save); tok; tok = strtok_r(NULL, ",+", &save)) {
        const int rc = parse_token(tok, a);
        if (rc < 0) {
            memset(a, 0, sizeof(*a));
            return rc;
        }
    }
    return 0;
}

void rt_aug_describe(const struct rt_aug *a, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = 0;
#define PUT(...) (n += (size_t)snprintf(buf + RT_MIN(n, len), n < len ? len - n : 0, __VA_ARGS__))
    if (a->pad)
        PUT("%scrop=%" PRIu32 "%s", n ? "," : "", a->pad, a->pad_mode == RT_PAD_REFLECT ? ",reflect" : "");
    if (a->crop_scale[1] > 0)
        PUT("%scrop-scale=%g:%g", n ? "," : "", a->crop_scale[0], a->crop_scale[1]);
    if (a->crop_ratio[1] > 0)
        PUT("%scrop-ratio=%g:%g", n ? "," : "", a->crop_ratio[0], a->crop_ratio[1]);
    if (a->flip)
        PUT("%s%s", n ? "," : "", a->flip == RT_FLIP_RANDOM ? "flip" : "alternate-flip");
    if (a->jitter[0] > 0 && a->jitter[0] == a->jitter[1] && a->jitter[1] == a->jitter[2])
        PUT("%sjitter=%g", n ? "," : "", a->jitter[0]);
    else
        for (int i = 0; i < RT_JITTER_COUNT; i++)
            if (a->jitter[i] > 0)
                PUT("%s%s=%g", n ? "," : "", JITTER_NAMES[i], a->jitter[i]);
    if (a->erase_p > 0) {
        PUT("%serase=%g", n ? "," : "", a->erase_p);
        if (a->erase_scale[1] > 0 || a->erase_ratio[1] > 0) {
            const float *sc = a->erase_scale[1] > 0 ? a->erase_scale : ERASE_SCALE;
            PUT(":%g:%g", sc[0], sc[1]);
        }
        if (a->erase_ratio[1] > 0)
            PUT(":%g:%g", a->erase_ratio[0], a->erase_ratio[1]);
    }
    if (a->cutout)
        PUT("%scutout=%" PRIu32, n ? "," : "", a->cutout);
    if (!n)
        PUT("none");
#undef PUT
}

int rt_aug_check(const struct rt_aug *a, uint32_t c, uint32_t h, uint32_t w)
{
    if ((a->jitter[0] > 0 || a->jitter[1] > 0 || a->jitter[2] > 0) && c != 1 && c != 3)
        return rt_errf(-EINVAL, "colour jitter is for 1- or 3-channel images, not %" PRIu32, c);
    if ((a->erase_p > 0 || a->cutout) && c > 4)
        return rt_errf(-EINVAL, "erase and cutout are for images of up to 4 channels, not %" PRIu32, c);
    if (a->pad > h || a->pad > w || (a->pad_mode == RT_PAD_REFLECT && (a->pad >= h || a->pad >= w)))
        return rt_errf(-EINVAL, "crop padding %" PRIu32 " is too large for %" PRIu32 "x%" PRIu32 " images", a->pad,
                       h, w);
    return 0;
}
