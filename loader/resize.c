/*
 * resize.c - antialiased resizing for pack --size/--max-side and for the
 * load-time crop: one box of an HWC uint8 image into CHW planes (with an
 * optional mirror) or into another HWC image, and the fit geometry of
 * pack --size. It does no decoding, no colour conversion and no random
 * choices (the box comes from rrc.c or rt_fit_geometry).
 *
 * The filtering is stb_image_resize v1 (Debian libstb-dev), triangle filter,
 * linear (not sRGB) colour space, clamped edges. For downscaling its
 * triangle's support grows with the factor, which is what Pillow's BILINEAR
 * (torchvision's default for PIL images) does, and it takes a fractional
 * source box (stbir_resize_subpixel), so a box scaled by the JPEG decoder's
 * 1/2..1/8 needs no rounding.
 *
 * Why this library and filter (bench/resize_quality.py with bench/resize_bench.c;
 * CPU "AMD EPYC" (Zen 4, 2 cores, shared), one thread, thread CPU time). Rule: keep the
 * candidates whose PSNR against Pillow BILINEAR is within ~1 dB of the best,
 * then take the fastest. PSNR (dB) vs Pillow 9.4 BILINEAR, same box:
 *
 *   case (source -> 224x224 unless named)   stb tri  stb mitch  sws bilin*  sws area  sws lanczos
 *   270 box -> 224 (1.2x)                     57.5      45.8       56.5       44.8      34.3
 *   500x375 whole                             56.5      46.8       56.4       37.6      33.7
 *   500x375 CROP fit (fractional box)         57.7      46.4       51.7       38.9      33.9
 *   500x375 -> 128                            54.3      47.1       54.3       36.9      33.1
 *   375 box at x=62.5 -> 64                   54.9      47.1       41.6       32.0      30.7
 *   2000x1500 fractional 844x701 box          60.3      51.7       44.7       40.2      37.2
 *   2000x1500 whole (8.9x)                    57.7      48.7       57.6       37.3      34.0
 *   120.5x131.2 box -> 224 (upscale)          56.1      43.6       29.5       29.5      27.4
 *   64 box -> 224 (upscale 3.5x)              56.1      46.0       50.2       50.2      34.9
 *   photo 900x277 whole                       55.8      50.6       55.8       42.2      39.4
 *   photo CROP fit -> 64                      53.4      48.2       47.4       37.9      35.4
 *   photo 100.4x110.9 box -> 224 (upscale)    56.3      47.5       37.6       37.6      34.7
 *   mean                                      56.4      47.4       48.6       38.8      34.1
 *   (* RGB24 in, GBRP out, SWS_FULL_CHR_H_INT|SWS_FULL_CHR_H_INP|SWS_ACCURATE_RND,
 *    the best swscale setup; GBRP in and out without those flags loses up to
 *    15 dB because swscale filters the B and R planes as subsampled chroma.)
 *
 * Only stb's triangle is within 1 dB of the best (it is Pillow's filter;
 * stb's Catmull-Rom likewise matches Pillow BICUBIC at 56.5 dB). swscale
 * cannot take a fractional box, and the rounding costs 5..27 dB on crops.
 * swscale is 2..5x faster, so speed did not get to decide. Median CPU time
 * per 224x224 output (one thread, noisy: a shared, loaded machine):
 *
 *   source box             stb tri   stb mitch   sws bilin*   Pillow BILINEAR
 *   270 -> 224 (1.2x)       1.03 ms    1.33 ms     0.29 ms       0.85 ms
 *   500x375 whole           1.46 ms    2.19 ms     0.34 ms       1.41 ms
 *   120.5x131.2 (up)        0.62 ms    0.77 ms     0.13 ms       0.36 ms
 *   2000x1500 whole        19.6 ms    33.1 ms      3.9 ms        8.3 ms
 *
 * stb v1 converts to float and has no SIMD: a large downscale costs about
 * 6.5 ns per source pixel, so callers should let the JPEG decoder shrink
 * first (scaled IDCT) down to no less than the output size. This file adds
 * a CHW/flip copy, small beside the filtering. Full tables: run the bench.
 *
 * The load-time crop (rt_resize_crop_chw) is swscale's instead, its best
 * setup above (bilinear, RGB24 into planar GBRP -- the slot's planes -- with
 * full chroma and accurate rounding): there speed decides and sub-pixel
 * placement does not. With stb there, the loader reached 2.93x torchvision's
 * ImageFolder pipeline at S=224 and resizing took 46 % of its workers' time
 * (bench/folder_vs_torchvision.sh, AMD EPYC Zen 4, 2 cores); swscale does a
 * random crop to 224x224 in 0.23 ms, context remade each time (stb: about
 * 0.9 ms), and a crop taken at random needs no placement finer than a whole
 * pixel: the box is rounded to whole pixels (of the image as decoded, so at
 * most half a pixel of a 1/k-scale decode). On whole-pixel boxes it is
 * 53..56 dB from Pillow (tests/test_resize.c). Pack keeps stb: there the
 * record should be what torchvision's Resize + CenterCrop makes, whose box is
 * fractional.
 *
 * stb is compiled here from its header (STB_IMAGE_RESIZE_IMPLEMENTATION, static)
 * rather than called in libstb.so, for two reasons: libstb.so was built with
 * assertions on, and v1 asserts (aborts) on ordinary geometries
 * (upstream issue nothings/stb#1449: a coefficient sum check whose result is
 * normalised right after anyway), and the header lets STBIR_MALLOC use this
 * resizer's scratch, so a call allocates nothing once the scratch has grown.
 * stb v1 recomputes its filter coefficients on every call (it has no API
 * to keep them); that is O(dw + dh) work beside the O(dw * dh) resampling.
 *
 * Edges: pixels around the box inside the image take part in the filter, as
 * in Pillow's resize(box=...); at the image's own border stb repeats the
 * edge pixel where Pillow renormalises the truncated filter (a difference in
 * the outermost output pixels only, included in the PSNR figures above).
 */
#include "loader/resize.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <libavutil/pixfmt.h>
#include <libswscale/swscale.h>

#include "common/common.h"

struct rt_resizer {
    struct SwsContext *sws; /* rt_resize_crop_chw's, remade when the geometry changes */
    uint8_t *work; /* stb's working memory (STBIR_MALLOC) */
    size_t work_cap;
    uint8_t *hwc; /* stb's HWC output before the CHW/flip copy */
    size_t hwc_cap;
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

static void *rt_resize_stb_malloc(size_t n, void *ctx)
{
    struct rt_resizer *r = ctx;
    return rt_resize_grow(&r->work, &r->work_cap, n);
}

/* stb's memory is the resizer's scratch, kept between calls. */
#define STBIR_MALLOC(size, ctx) rt_resize_stb_malloc((size), (ctx))
#define STBIR_FREE(ptr, ctx) ((void)(ptr), (void)(ctx))
/* See the opening comment: the checks abort on inputs the code handles. */
#define STBIR_ASSERT(x) ((void)0)
#define STB_IMAGE_RESIZE_STATIC
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#include <stb_image_resize.h>
#pragma GCC diagnostic pop

/* stb takes int sizes and strides; JPEG's own limit is 65535 px a side. */
#define RT_RESIZE_MAX_SIDE 65535u

int rt_resizer_create(struct rt_resizer **out)
{
    struct rt_resizer *r = calloc(1, sizeof *r);
    if (!r)
        return rt_errf(-ENOMEM, "resize: out of memory");
    *out = r;
    return 0;
}

void rt_resizer_destroy(struct rt_resizer *r)
{
    if (!r)
        return;
    sws_freeContext(r->sws);
    free(r->work);
    free(r->hwc);
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
 * The resampling both entry points share: box of src to an HWC image of
 * ow x oh at out (rows ostride bytes apart). The box has been validated.
 * stb sees only a window of the source around the box, wide enough for the
 * filter, so a small crop of a large image does not convert whole rows.
 */
static int rt_resize_run(struct rt_resizer *r, const uint8_t *src, uint32_t sw, uint32_t sh, uint32_t c,
                         size_t sstride, const struct rt_box *box, uint8_t *out, uint32_t ow, uint32_t oh,
                         size_t ostride)
{
    double sx = ow / box->w, sy = oh / box->h;
    /* The triangle reaches 1 output pixel either side: 1/scale input pixels when downscaling. */
    double mx = (sx < 1 ? 1 / sx : 1) + 2, my = (sy < 1 ? 1 / sy : 1) + 2;
    double fx0 = floor(box->x - mx), fy0 = floor(box->y - my);
    double fx1 = ceil(box->x + box->w + mx), fy1 = ceil(box->y + box->h + my);
    uint32_t x0 = fx0 < 0 ? 0 : (uint32_t)fx0, y0 = fy0 < 0 ? 0 : (uint32_t)fy0;
    uint32_t x1 = fx1 > sw ? sw : (uint32_t)fx1, y1 = fy1 > sh ? sh : (uint32_t)fy1;
    const uint8_t *in = src + (size_t)y0 * sstride + (size_t)x0 * c;
    int ok = stbir_resize_subpixel(in, (int)(x1 - x0), (int)(y1 - y0), (int)sstride, out, (int)ow, (int)oh,
                                   (int)ostride, STBIR_TYPE_UINT8, (int)c, STBIR_ALPHA_CHANNEL_NONE, 0,
                                   STBIR_EDGE_CLAMP, STBIR_EDGE_CLAMP, STBIR_FILTER_TRIANGLE, STBIR_FILTER_TRIANGLE,
                                   STBIR_COLORSPACE_LINEAR, r, (float)sx, (float)sy, (float)((box->x - x0) * sx),
                                   (float)((box->y - y0) * sy));
    /* stb fails only when its memory cannot be had. */
    return ok ? 0 : rt_errf(-ENOMEM, "resize: out of memory (%ux%u box to %ux%u)", x1 - x0, y1 - y0, ow, oh);
}

int rt_resize_box_chw(struct rt_resizer *r, const uint8_t *src, uint32_t sw, uint32_t sh, uint32_t c,
                      size_t sstride, const struct rt_box *box, uint8_t *dst, uint32_t dw, uint32_t dh,
                      const uint32_t rect[4], int flip)
{
    int rc = rt_resize_check_src(src, sw, sh, c, sstride);
    if (rc)
        return rc;
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
    /* Clamp the slack away so stb never reads past the image. */
    struct rt_box b = *box;
    b.x = b.x < 0 ? 0 : b.x;
    b.y = b.y < 0 ? 0 : b.y;
    b.w = b.x + b.w > sw ? sw - b.x : b.w;
    b.h = b.y + b.h > sh ? sh - b.y : b.h;
    if (!(b.w > 0) || !(b.h > 0))
        return rt_errf(-EINVAL, "resize: box (%g, %g, %g x %g) is empty inside the %ux%u image", box->x, box->y,
                       box->w, box->h, sw, sh);

    size_t row = (size_t)rw * c;
    uint8_t *hwc = rt_resize_grow(&r->hwc, &r->hwc_cap, row * rh);
    if (!hwc)
        return rt_errf(-ENOMEM, "resize: out of memory (%ux%u output)", rw, rh);
    rc = rt_resize_run(r, src, sw, sh, c, sstride, &b, hwc, rw, rh, row);
    if (rc)
        return rc;

    /* De-interleave into the planes; a mirror reads each row backwards. */
    size_t plane = (size_t)dw * dh;
    for (uint32_t y = 0; y < rh; y++) {
        const uint8_t *s = hwc + (size_t)y * row;
        for (uint32_t ch = 0; ch < c; ch++) {
            uint8_t *d = dst + ch * plane + (size_t)(ry + y) * dw + rx;
            if (flip) {
                for (uint32_t x = 0; x < rw; x++)
                    d[rw - 1 - x] = s[(size_t)x * c + ch];
            } else {
                for (uint32_t x = 0; x < rw; x++)
                    d[x] = s[(size_t)x * c + ch];
            }
        }
    }
    return 0;
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
    return rt_resize_run(r, src, sw, sh, c, sstride, &whole, dst, dw, dh, (size_t)dw * c);
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
