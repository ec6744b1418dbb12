/*
 * augment.c - uint8 augmentation written straight into the batch slot:
 * random crop out of a zero- or reflect-padded image, and horizontal flip
 * (random, or alternating every other epoch per sample).
 *
 * The padded image is never built: each output row maps to one source row
 * (or to zeros); that row is padded into a small buffer and the crop is one
 * contiguous (or reversed) copy out of it, which compiles to vector moves.
 */
#include <string.h>

#include "common/common.h"
#include "loader/loader.h"

/* RNG stream namespaces of the augmentation (the sampler uses 1..3 << 56). */
#define STREAM_AUG  (UINT64_C(8) << 56)
#define STREAM_FLIP (UINT64_C(9) << 56)

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

/* Per thread: the padded-image buffer and the geometry its zero borders were laid out for. */
static _Thread_local uint8_t padded_buf[PADDED_MAX];
static _Thread_local uint64_t padded_geom;

/* Cloned per ISA so the row copies use the widest shuffles the CPU has (not in sanitizer builds). */
#ifdef RT_NO_IFUNC
#define RT_CLONES
#else
#define RT_CLONES __attribute__((target_clones("avx2", "default")))
#endif
RT_CLONES void rt_augment(const struct rt_aug *a, uint64_t seed,
                                                                  uint64_t epoch, uint64_t id, uint32_t c,
                                                                  uint32_t h, uint32_t w, const uint8_t *src,
                                                                  uint8_t *dst)
{
    long dy = 0, dx = 0; /* crop offset relative to the unpadded image */
    int flip = 0;

    if (a->pad || a->flip == RT_FLIP_RANDOM) {
        struct rt_rng r;
        rt_rng_init(&r, seed, STREAM_AUG | (epoch << 40) | (id & ((UINT64_C(1) << 40) - 1)));
        if (a->pad) {
            dy = (long)rt_rng_below(&r, 2 * a->pad + 1) - (long)a->pad;
            dx = (long)rt_rng_below(&r, 2 * a->pad + 1) - (long)a->pad;
        }
        if (a->flip == RT_FLIP_RANDOM)
            flip = rt_rng_u32(&r) & 1;
    }
    if (a->flip == RT_FLIP_ALTERNATE) {
        struct rt_rng r;
        rt_rng_init(&r, seed, STREAM_FLIP | (id & ((UINT64_C(1) << 40) - 1)));
        flip = (int)((rt_rng_u32(&r) ^ epoch) & 1);
    }
    if (!dy && !dx && !flip) {
        memcpy(dst, src, (size_t)c * h * w);
        return;
    }
    const size_t padded = (size_t)c * (h + 2 * a->pad) * (w + 2 * a->pad);
    if (padded > PADDED_MAX) {
        crop_rows(src, dst, c, h, w, a->pad, dy, dx, flip, a->pad_mode);
        return;
    }
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
