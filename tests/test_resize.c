/*
 * test_resize.c - loader/resize.c against Pillow and against exact rules:
 * rt_resize_box_chw and rt_resize_hwc equal Pillow 9.4's BILINEAR value for
 * value on the fixtures of tools/dev/gen_resize_fixtures.py (RGB and gray,
 * fractional boxes, torchvision's Resize + CenterCrop through
 * rt_fit_geometry, up- and downscales, a 23x downscale, one-pixel sides, a
 * stretch), with every resampling kernel this CPU has (scalar always, avx2
 * and avx512 where present, picked through RT_RESIZE_KERNEL), mirrored and
 * into a rectangle too; the vector kernels equal the scalar one on random
 * images and boxes; rt_resize_crop_chw (swscale) stays close to Pillow; a
 * constant image stays exactly that constant; PAD leaves pixels outside its
 * rectangle alone; rt_fit_geometry's numbers equal torchvision's arithmetic
 * (Python's truncating int() and half-to-even round()); bad arguments give
 * -EINVAL. Random images use the fixed seed printed at the start.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/common.h"
#include "loader/resize.h"
#include "test_util.h"

#define SEED 27

struct img {
    uint32_t w, h, c;
    uint8_t *px; /* HWC */
};

static int pnm_read(const char *name, struct img *im)
{
    char path[1024];
    const char *dir = getenv("RT_FIXTURES");
    snprintf(path, sizeof path, "%s/resize/%s", dir ? dir : "tests/fixtures", name);
    FILE *f = fopen(path, "rb");
    char magic[3] = {0};
    unsigned maxv;
    if (!f) {
        fprintf(stderr, "%s: cannot open (run tools/dev/gen_resize_fixtures.py)\n", path);
        return -1;
    }
    if (fscanf(f, "%2s %u %u %u", magic, &im->w, &im->h, &maxv) != 4 || maxv != 255 || fgetc(f) == EOF ||
        (strcmp(magic, "P6") && strcmp(magic, "P5"))) {
        fprintf(stderr, "%s: not an 8-bit binary PPM/PGM\n", path);
        fclose(f);
        return -1;
    }
    im->c = magic[1] == '6' ? 3 : 1;
    size_t n = (size_t)im->w * im->h * im->c;
    im->px = tu_xmalloc(n);
    size_t got = fread(im->px, 1, n, f);
    fclose(f);
    if (got != n) {
        fprintf(stderr, "%s: short file\n", path);
        return -1;
    }
    return 0;
}

/* PSNR of CHW `chw` against the HWC reference. */
static double psnr_chw_hwc(const uint8_t *chw, const struct img *ref)
{
    size_t plane = (size_t)ref->w * ref->h;
    double se = 0;
    for (size_t i = 0; i < plane; i++)
        for (uint32_t ch = 0; ch < ref->c; ch++) {
            double d = (double)chw[ch * plane + i] - ref->px[i * ref->c + ch];
            se += d * d;
        }
    double mse = se / (double)(plane * ref->c);
    return mse == 0 ? 99.0 : 10 * log10(255.0 * 255.0 / mse);
}

/* The kernels of loader/resize.c, as RT_RESIZE_KERNEL names them. */
static const char *const kernels[] = {"scalar", "avx2", "avx512"};
#define NKERNELS 3

/* A resizer using kernel k, or NULL (printed) where this CPU lacks it; the scalar one always exists. */
static struct rt_resizer *resizer_for(int k)
{
    struct rt_resizer *r = NULL;
    setenv("RT_RESIZE_KERNEL", kernels[k], 1);
    int rc = rt_resizer_create(&r);
    unsetenv("RT_RESIZE_KERNEL");
    if (rc == -ENOTSUP && k > 0) {
        printf("kernel %s: not on this CPU, skipped\n", kernels[k]);
        return NULL;
    }
    CHECKF(rc == 0, "kernel %s: %s", kernels[k], rc ? rt_errmsg() : "");
    return rc ? NULL : r;
}

/* Values of the CHW image that differ from the HWC reference (mirrored when flip). */
static size_t diff_chw_hwc(const uint8_t *chw, size_t stride, size_t plane, const struct img *ref, int flip)
{
    size_t bad = 0;
    for (uint32_t y = 0; y < ref->h; y++)
        for (uint32_t x = 0; x < ref->w; x++)
            for (uint32_t ch = 0; ch < ref->c; ch++) {
                uint32_t sx = flip ? ref->w - 1 - x : x;
                bad += chw[ch * plane + y * stride + x] != ref->px[((size_t)y * ref->w + sx) * ref->c + ch];
            }
    return bad;
}

/* The fixtures: Pillow's resize of `box` of `src` (tools/dev/gen_resize_fixtures.py holds the same boxes). */
static const struct fixture {
    const char *src, *ref;
    struct rt_box box;
} fixtures[] = {
    {"src.ppm", "down64.ppm", {16, 0, 120, 120}},
    {"src.ppm", "up32.ppm", {40.25, 30.5, 32, 32}},
    {"src.ppm", "stretch72x40.ppm", {0, 0, 160, 120}},
    {"src_gray.pgm", "gray64x48.pgm", {0, 0, 160, 120}},
    {"src.ppm", "down7x5.ppm", {0, 0, 160, 120}},
    {"src_gray.pgm", "graybox41x23.pgm", {10.7, 20.3, 100.1, 63.9}},
    {"src.ppm", "line75x1.ppm", {3.5, 60.25, 150, 1}},
    {"src.ppm", "col1x90.ppm", {159.5, 0, 0.5, 120}},
    {"src.ppm", "up200x9.ppm", {0, 110.5, 12.25, 9.5}},
    {"src.ppm", "crop56.ppm", {0, 0, 0, 0}}, /* box from rt_fit_geometry(CROP) */
};

/*
 * Every fixture, exactly, with resizer r: plain, mirrored, and into a
 * rectangle of a larger image whose other pixels must stay as they were.
 */
static void test_exact(struct rt_resizer *r, const char *kname)
{
    for (size_t k = 0; k < sizeof fixtures / sizeof fixtures[0]; k++) {
        struct img src, ref;
        if (pnm_read(fixtures[k].src, &src) || pnm_read(fixtures[k].ref, &ref)) {
            CHECK(!"fixture missing");
            return;
        }
        struct rt_box box = fixtures[k].box;
        if (box.w == 0) {
            uint32_t rect[4];
            rt_fit_geometry(RT_FIT_CROP, src.w, src.h, ref.w, ref.h, &box, rect);
            CHECK(rect[0] == 0 && rect[1] == 0 && rect[2] == ref.w && rect[3] == ref.h);
        }
        size_t st = (size_t)src.w * src.c, plane = (size_t)ref.w * ref.h, n = plane * ref.c;
        uint8_t *out = tu_xmalloc(n);
        for (int flip = 0; flip <= 1; flip++) {
            memset(out, 0xA5, n);
            CHECK_OK(rt_resize_box_chw(r, src.px, src.w, src.h, src.c, st, &box, out, ref.w, ref.h, NULL, flip));
            size_t bad = diff_chw_hwc(out, ref.w, plane, &ref, flip);
            CHECKF(bad == 0, "%s %s%s: %zu of %zu values differ from Pillow", kname, fixtures[k].ref,
                   flip ? " mirrored" : "", bad, n);
        }
        /* Into the rectangle at (3, 2) of a (w + 5) x (h + 4) image. */
        uint32_t bw = ref.w + 5, bh = ref.h + 4, rect[4] = {3, 2, ref.w, ref.h};
        size_t bplane = (size_t)bw * bh;
        uint8_t *big = tu_xmalloc(bplane * ref.c);
        memset(big, 0xA5, bplane * ref.c);
        CHECK_OK(rt_resize_box_chw(r, src.px, src.w, src.h, src.c, st, &box, big, bw, bh, rect, 0));
        size_t bad = diff_chw_hwc(big + 2 * bw + 3, bw, bplane, &ref, 0), outside = 0;
        for (uint32_t ch = 0; ch < ref.c; ch++)
            for (uint32_t y = 0; y < bh; y++)
                for (uint32_t x = 0; x < bw; x++)
                    outside += (x < 3 || x >= 3 + ref.w || y < 2 || y >= 2 + ref.h) &&
                               big[ch * bplane + (size_t)y * bw + x] != 0xA5;
        CHECKF(bad == 0 && outside == 0, "%s %s in a rectangle: %zu values differ, %zu outside written", kname,
               fixtures[k].ref, bad, outside);
        /* rt_resize_hwc: the whole-image fixtures, interleaved. */
        if (box.x == 0 && box.y == 0 && box.w == src.w && box.h == src.h) {
            CHECK_OK(rt_resize_hwc(r, src.px, src.w, src.h, src.c, st, out, ref.w, ref.h));
            bad = 0;
            for (size_t i = 0; i < n; i++)
                bad += out[i] != ref.px[i];
            CHECKF(bad == 0, "%s %s rt_resize_hwc: %zu of %zu values differ", kname, fixtures[k].ref, bad, n);
        }
        printf("%-7s %-17s box (%.3f, %.3f, %.3f x %.3f) -> %ux%u: checked\n", kname, fixtures[k].ref, box.x, box.y,
               box.w, box.h, ref.w, ref.h);
        free(big), free(out), free(src.px), free(ref.px);
    }
}

static void random_image(struct rt_rng *g, uint8_t *px, size_t n);

/*
 * The vector kernel v against the scalar one s on random images, sizes and
 * boxes (up to 700x500, down to 1 px, up to 9x up and 60x down), mirrored
 * or not: every value equal.
 */
static void test_kernels_agree(struct rt_resizer *s, struct rt_resizer *v, const char *kname, struct rt_rng *g)
{
    size_t cases = 0, bad_cases = 0;
    for (int k = 0; k < 60; k++) {
        uint32_t c = k % 3 == 2 ? 1 : 3;
        uint32_t sw = 1 + rt_rng_u32(g) % (k % 10 == 0 ? 700 : 120), sh = 1 + rt_rng_u32(g) % (k % 10 == 0 ? 500 : 90);
        uint32_t dw = 1 + rt_rng_u32(g) % 100, dh = 1 + rt_rng_u32(g) % 80;
        double bw = sw * (0.02 + 0.98 * rt_rng_uniform(g)), bh = sh * (0.02 + 0.98 * rt_rng_uniform(g));
        struct rt_box box = {rt_rng_uniform(g) * (sw - bw), rt_rng_uniform(g) * (sh - bh), bw, bh};
        size_t n = (size_t)dw * dh * c;
        uint8_t *src = tu_xmalloc((size_t)sw * sh * c), *a = tu_xmalloc(n), *b = tu_xmalloc(n);
        random_image(g, src, (size_t)sw * sh * c);
        int flip = k & 1;
        CHECK_OK(rt_resize_box_chw(s, src, sw, sh, c, (size_t)sw * c, &box, a, dw, dh, NULL, flip));
        CHECK_OK(rt_resize_box_chw(v, src, sw, sh, c, (size_t)sw * c, &box, b, dw, dh, NULL, flip));
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += a[i] != b[i];
        CHECK_OK(rt_resize_hwc(s, src, sw, sh, c, (size_t)sw * c, a, dw, dh));
        CHECK_OK(rt_resize_hwc(v, src, sw, sh, c, (size_t)sw * c, b, dw, dh));
        for (size_t i = 0; i < n; i++)
            bad += a[i] != b[i];
        CHECKF(bad == 0, "%s vs scalar: %ux%ux%u box (%g, %g, %g x %g) -> %ux%u: %zu values differ", kname, sw, sh,
               c, box.x, box.y, box.w, box.h, dw, dh, bad);
        cases++, bad_cases += bad != 0;
        free(src), free(a), free(b);
    }
    printf("%s vs scalar: %zu random cases, %zu differ\n", kname, cases, bad_cases);
}

/*
 * rt_resize_crop_chw (the load-time crop: swscale, whole-pixel boxes) on the
 * fixtures whose boxes are whole pixels; measured 54..56 dB, bound 45.
 */
#define MIN_PSNR_CROP_DB 45.0
static void test_crop_path(struct rt_resizer *r, struct rt_rng *g)
{
    static const struct {
        const char *src, *ref;
        struct rt_box box;
    } cases[] = {{"src.ppm", "down64.ppm", {16, 0, 120, 120}},
                 {"src.ppm", "stretch72x40.ppm", {0, 0, 160, 120}},
                 {"src_gray.pgm", "gray64x48.pgm", {0, 0, 160, 120}}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        struct img src, ref;
        if (pnm_read(cases[k].src, &src) || pnm_read(cases[k].ref, &ref)) {
            CHECK(!"fixture missing");
            return;
        }
        uint8_t *a = tu_xmalloc((size_t)ref.w * ref.h * ref.c), *b = tu_xmalloc((size_t)ref.w * ref.h * ref.c);
        CHECK_OK(rt_resize_crop_chw(r, src.px, src.w, src.h, src.c, (size_t)src.w * src.c, &cases[k].box, a, ref.w,
                                    ref.h, 0));
        double p = psnr_chw_hwc(a, &ref);
        printf("crop path %-14s -> %ux%u: %.2f dB\n", cases[k].ref, ref.w, ref.h, p);
        CHECKF(p >= MIN_PSNR_CROP_DB, "crop path %s: %.2f dB < %.1f", cases[k].ref, p, MIN_PSNR_CROP_DB);
        /* The mirror is exact. */
        CHECK_OK(rt_resize_crop_chw(r, src.px, src.w, src.h, src.c, (size_t)src.w * src.c, &cases[k].box, b, ref.w,
                                    ref.h, 1));
        int mirrored = 1;
        for (size_t row = 0; row < (size_t)ref.c * ref.h; row++)
            for (uint32_t x = 0; x < ref.w; x++)
                mirrored &= a[row * ref.w + x] == b[row * ref.w + ref.w - 1 - x];
        CHECKF(mirrored, "crop path %s: flip is not a mirror", cases[k].ref);
        free(a), free(b), free(src.px), free(ref.px);
    }
    /* Random fractional boxes of a random image: any box inside works, and a constant image stays constant. */
    uint8_t src[97 * 61 * 3], dst[3 * 40 * 24];
    random_image(g, src, sizeof src);
    for (int k = 0; k < 50; k++) {
        double w = 0.3 + rt_rng_uniform(g) * 96, h = 0.3 + rt_rng_uniform(g) * 60;
        struct rt_box box = {rt_rng_uniform(g) * (97 - w), rt_rng_uniform(g) * (61 - h), w, h};
        CHECK_OK(rt_resize_crop_chw(r, src, 97, 61, 3, 97 * 3, &box, dst, 40, 24, k & 1));
    }
    memset(src, 77, sizeof src);
    struct rt_box box = {3.4, 5.6, 50.2, 30.1};
    CHECK_OK(rt_resize_crop_chw(r, src, 97, 61, 3, 97 * 3, &box, dst, 40, 24, 1));
    int constant = 1;
    for (size_t i = 0; i < sizeof dst; i++)
        constant &= dst[i] == 77;
    CHECK(constant);
    CHECK(rt_resize_crop_chw(r, src, 97, 61, 3, 97 * 3, &(struct rt_box){0, 0, 0, 5}, dst, 40, 24, 0) == -EINVAL);
}

static void test_constant(struct rt_resizer *r)
{
    static const uint8_t values[] = {0, 1, 37, 128, 254, 255};
    static const struct {
        uint32_t sw, sh, dw, dh;
        struct rt_box box;
    } cases[] = {
        {97, 61, 64, 64, {0, 0, 97, 61}},            /* down, non-uniform */
        {500, 375, 32, 24, {3.3, 7.9, 480.2, 360.1}}, /* 15x down, fractional */
        {50, 40, 224, 224, {10.5, 3.25, 17.75, 21}},  /* 12x up */
        {3, 2, 5, 7, {0, 0, 3, 2}},                   /* tiny */
        {64, 64, 64, 64, {0, 0, 64, 64}},             /* identity */
        {64, 64, 43, 45, {0, 0, 64, 64}},             /* uneven downscale */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        for (uint32_t c = 1; c <= 3; c += 2) {
            uint32_t sw = cases[k].sw, sh = cases[k].sh, dw = cases[k].dw, dh = cases[k].dh;
            uint8_t *src = tu_xmalloc((size_t)sw * sh * c), *dst = tu_xmalloc((size_t)dw * dh * c);
            for (size_t v = 0; v < sizeof values; v++) {
                /* A different constant per channel: a swapped plane shows. */
                for (size_t i = 0; i < (size_t)sw * sh; i++)
                    for (uint32_t ch = 0; ch < c; ch++)
                        src[i * c + ch] = (uint8_t)(values[v] + 50 * ch);
                CHECK_OK(rt_resize_box_chw(r, src, sw, sh, c, (size_t)sw * c, &cases[k].box, dst, dw, dh, NULL,
                                           (int)(v & 1)));
                size_t bad = 0;
                for (uint32_t ch = 0; ch < c; ch++)
                    for (size_t i = 0; i < (size_t)dw * dh; i++)
                        bad += dst[ch * (size_t)dw * dh + i] != (uint8_t)(values[v] + 50 * ch);
                CHECKF(bad == 0, "case %zu c=%u value %u: %zu pixels changed", k, c, values[v], bad);
            }
            free(src);
            free(dst);
        }
    }
}

static void random_image(struct rt_rng *g, uint8_t *px, size_t n)
{
    for (size_t i = 0; i < n; i++)
        px[i] = (uint8_t)rt_rng_u32(g);
}

static void test_flip(struct rt_resizer *r, struct rt_rng *g)
{
    static const struct rt_box boxes[] = {{0, 0, 123, 77}, {13.7, 5.2, 40.1, 60.3}, {100.5, 20, 22.5, 50}};
    const uint32_t sw = 123, sh = 77, dw = 64, dh = 48;
    for (uint32_t c = 1; c <= 3; c += 2) {
        uint8_t *src = tu_xmalloc((size_t)sw * sh * c);
        uint8_t *a = tu_xmalloc((size_t)dw * dh * c), *b = tu_xmalloc((size_t)dw * dh * c);
        random_image(g, src, (size_t)sw * sh * c);
        for (size_t k = 0; k < sizeof boxes / sizeof boxes[0]; k++) {
            CHECK_OK(rt_resize_box_chw(r, src, sw, sh, c, (size_t)sw * c, &boxes[k], a, dw, dh, NULL, 0));
            CHECK_OK(rt_resize_box_chw(r, src, sw, sh, c, (size_t)sw * c, &boxes[k], b, dw, dh, NULL, 1));
            size_t bad = 0, same = 0;
            for (uint32_t ch = 0; ch < c; ch++)
                for (uint32_t y = 0; y < dh; y++)
                    for (uint32_t x = 0; x < dw; x++) {
                        size_t row = (size_t)ch * dw * dh + (size_t)y * dw;
                        bad += a[row + x] != b[row + dw - 1 - x];
                        same += a[row + x] == b[row + x];
                    }
            CHECKF(bad == 0, "c=%u box %zu: %zu pixels not mirrored", c, k, bad);
            CHECKF(same < (size_t)dw * dh * c / 2, "c=%u box %zu: flip changed almost nothing", c, k);
        }
        free(src);
        free(a);
        free(b);
    }
}

static void test_pad(struct rt_resizer *r, struct rt_rng *g)
{
    const uint32_t sw = 160, sh = 90, dw = 64, dh = 64, c = 3;
    struct rt_box box;
    uint32_t rect[4];
    rt_fit_geometry(RT_FIT_PAD, sw, sh, dw, dh, &box, rect);
    /* 160x90 into 64x64: 64x36 (lround(90*64/160) = 36), centred at y = 14. */
    CHECK(box.x == 0 && box.y == 0 && box.w == sw && box.h == sh);
    CHECKF(rect[0] == 0 && rect[1] == 14 && rect[2] == 64 && rect[3] == 36, "rect %u %u %u %u", rect[0], rect[1],
           rect[2], rect[3]);
    uint8_t *src = tu_xmalloc((size_t)sw * sh * c), *dst = tu_xmalloc((size_t)dw * dh * c);
    random_image(g, src, (size_t)sw * sh * c);
    /* A portrait source pads left and right instead; both flips. */
    for (int pass = 0; pass < 4; pass++) {
        uint32_t w = pass < 2 ? sw : sh, h = pass < 2 ? sh : sw;
        rt_fit_geometry(RT_FIT_PAD, w, h, dw, dh, &box, rect);
        memset(dst, 0xA5, (size_t)dw * dh * c);
        CHECK_OK(rt_resize_box_chw(r, src, w, h, c, (size_t)w * c, &box, dst, dw, dh, rect, pass & 1));
        size_t outside_bad = 0, inside_marked = 0;
        for (uint32_t ch = 0; ch < c; ch++)
            for (uint32_t y = 0; y < dh; y++)
                for (uint32_t x = 0; x < dw; x++) {
                    int in = x >= rect[0] && x < rect[0] + rect[2] && y >= rect[1] && y < rect[1] + rect[3];
                    uint8_t v = dst[(size_t)ch * dw * dh + (size_t)y * dw + x];
                    outside_bad += !in && v != 0xA5;
                    inside_marked += in && v == 0xA5;
                }
        CHECKF(outside_bad == 0, "pass %d: %zu pixels outside the rectangle written", pass, outside_bad);
        CHECKF(inside_marked < (size_t)rect[2] * rect[3] * c / 50, "pass %d: rectangle left unwritten", pass);
    }
    free(src);
    free(dst);
}

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * (1 + fabs(b)); }

/* Expected values: torchvision 0.14's Resize(S) + CenterCrop(S) arithmetic, computed in Python. */
static void test_fit_geometry(void)
{
    static const struct {
        uint32_t sw, sh, s;
        double x, y, w, h;
    } crop[] = {
        {500, 375, 224, 62.080536912751676, 0.0, 375.83892617449663, 375.0},
        {375, 500, 224, 0.0, 62.080536912751676, 375.0, 375.83892617449663},
        {640, 480, 64, 75.29411764705883, 0.0, 481.88235294117646, 480.0}, /* 10.5 rounds to 10 */
        {333, 500, 128, 0.0, 83.33333333333333, 333.0, 333.3333333333333},
        {224, 224, 224, 0.0, 0.0, 224.0, 224.0},
        {1000, 3, 64, 498.4765386959171, 0.0, 3.0000468757324334, 3.0}, /* 10634.5 -> 10634 */
        {101, 100, 64, 0.0, 0.0, 101.0, 100.0},
        {509, 383, 224, 61.696969696969695, 0.0, 383.8922558922559, 383.0}, /* 36.5 -> 36 */
        {5640, 3760, 224, 940.0, 0.0, 3760.0, 3760.0},
        {83, 80, 64, 1.2575757575757576, 0.0, 80.48484848484848, 80.0},
    };
    struct rt_box b;
    uint32_t rect[4];
    for (size_t k = 0; k < sizeof crop / sizeof crop[0]; k++) {
        rt_fit_geometry(RT_FIT_CROP, crop[k].sw, crop[k].sh, crop[k].s, crop[k].s, &b, rect);
        CHECKF(near(b.x, crop[k].x) && near(b.y, crop[k].y) && near(b.w, crop[k].w) && near(b.h, crop[k].h),
               "crop %ux%u -> %u: (%.17g, %.17g, %.17g, %.17g)", crop[k].sw, crop[k].sh, crop[k].s, b.x, b.y, b.w,
               b.h);
        CHECK(rect[0] == 0 && rect[1] == 0 && rect[2] == crop[k].s && rect[3] == crop[k].s);
        CHECK(b.x >= 0 && b.y >= 0 && b.x + b.w <= crop[k].sw + 1e-9 && b.y + b.h <= crop[k].sh + 1e-9);
    }
    /* HxW: 500x375 to 128 wide, 64 high: width binds, 500x375 -> 128x96, top = 16. */
    rt_fit_geometry(RT_FIT_CROP, 500, 375, 128, 64, &b, rect);
    CHECKF(near(b.x, 0) && near(b.y, 16 * 375.0 / 96) && near(b.w, 500) && near(b.h, 64 * 375.0 / 96),
           "crop 500x375 -> 128x64: (%g, %g, %g, %g)", b.x, b.y, b.w, b.h);
    /* ... and 32 wide, 64 high: height binds, 500x375 -> 85x64 (int(85.33)), left = rint(26.5) = 26. */
    rt_fit_geometry(RT_FIT_CROP, 500, 375, 32, 64, &b, rect);
    CHECKF(near(b.x, 26 * 500.0 / 85) && near(b.y, 0) && near(b.w, 32 * 500.0 / 85) && near(b.h, 375),
           "crop 500x375 -> 32x64: (%g, %g, %g, %g)", b.x, b.y, b.w, b.h);
    CHECK(rect[2] == 32 && rect[3] == 64);

    rt_fit_geometry(RT_FIT_STRETCH, 500, 375, 128, 64, &b, rect);
    CHECK(b.x == 0 && b.y == 0 && b.w == 500 && b.h == 375);
    CHECK(rect[0] == 0 && rect[1] == 0 && rect[2] == 128 && rect[3] == 64);

    /* PAD 500x375 into 224: 224x168 at y = 28; into 100x300: 100x75 at y = 112. */
    rt_fit_geometry(RT_FIT_PAD, 500, 375, 224, 224, &b, rect);
    CHECK(b.w == 500 && b.h == 375 && rect[0] == 0 && rect[1] == 28 && rect[2] == 224 && rect[3] == 168);
    rt_fit_geometry(RT_FIT_PAD, 500, 375, 100, 300, &b, rect);
    CHECK(rect[0] == 0 && rect[1] == 112 && rect[2] == 100 && rect[3] == 75);
    rt_fit_geometry(RT_FIT_PAD, 3, 1000, 64, 64, &b, rect); /* never thinner than a pixel */
    CHECK(rect[2] == 1 && rect[3] == 64 && rect[0] == 31);

    /* An empty source gives a box the resizer refuses. */
    rt_fit_geometry(RT_FIT_CROP, 0, 10, 64, 64, &b, rect);
    CHECK(b.w == 0 && b.h == 0);

    enum rt_fit f;
    for (int i = RT_FIT_CROP; i <= RT_FIT_PAD; i++) {
        CHECK(rt_fit_name((enum rt_fit)i) != NULL);
        CHECK(rt_fit_parse(rt_fit_name((enum rt_fit)i), &f) == 0 && (int)f == i);
    }
    CHECK(rt_fit_parse("fill", &f) == -EINVAL);
    CHECK(rt_fit_parse(NULL, &f) == -EINVAL);
    CHECK(rt_fit_name((enum rt_fit)7) == NULL);
}

static void test_bad_args(struct rt_resizer *r)
{
    uint8_t src[40 * 30 * 3] = {0}, dst[16 * 16 * 3];
    const size_t st = 40 * 3;
    static const struct rt_box bad[] = {
        {0, 0, 0, 10},       {0, 0, 10, 0},       {-1, 0, 10, 10},      {0, -0.5, 10, 10},
        {35, 0, 5.01, 10},   {0, 25, 10, 5.5},    {0, 0, -3, 10},       {NAN, 0, 10, 10},
        {0, 0, INFINITY, 5}, {41, 0, 1, 1},       {0, 0, 40, 30.0001},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        CHECKF(rt_resize_box_chw(r, src, 40, 30, 3, st, &bad[k], dst, 16, 16, NULL, 0) == -EINVAL, "bad box %zu",
               k);
    /* A rounding error past the edge (a box scaled by 1/8) is not an error. */
    struct rt_box edge = {0, 0, 40 + 1e-9, 30 + 1e-9};
    CHECK_OK(rt_resize_box_chw(r, src, 40, 30, 3, st, &edge, dst, 16, 16, NULL, 0));

    struct rt_box ok = {0, 0, 40, 30};
    const uint32_t bad_rect[][4] = {
        {0, 0, 0, 16}, {0, 0, 17, 16}, {8, 0, 9, 16}, {0, 16, 16, 1}, {UINT32_MAX, 0, 2, 2},
    };
    for (size_t k = 0; k < sizeof bad_rect / sizeof bad_rect[0]; k++)
        CHECKF(rt_resize_box_chw(r, src, 40, 30, 3, st, &ok, dst, 16, 16, bad_rect[k], 0) == -EINVAL, "bad rect %zu",
               k);
    CHECK_ERR(rt_resize_box_chw(r, src, 40, 30, 2, st, &ok, dst, 16, 16, NULL, 0), "channels");
    CHECK_ERR(rt_resize_box_chw(r, src, 40, 30, 3, 40, &ok, dst, 16, 16, NULL, 0), "stride");
    CHECK_ERR(rt_resize_box_chw(r, src, 0, 30, 3, st, &ok, dst, 16, 16, NULL, 0), "source");
    CHECK_ERR(rt_resize_box_chw(r, src, 40, 30, 3, st, &ok, dst, 0, 16, NULL, 0), "destination");
    CHECK_ERR(rt_resize_box_chw(r, NULL, 40, 30, 3, st, &ok, dst, 16, 16, NULL, 0), "source");
    CHECK_ERR(rt_resize_box_chw(r, src, 40, 30, 3, st, NULL, dst, 16, 16, NULL, 0), "box");
    CHECK_ERR(rt_resize_box_chw(r, src, 40, 30, 3, st, &(struct rt_box){0, 0, 0, 0}, dst, 16, 16, NULL, 0), "box");
    CHECK(rt_resize_hwc(r, src, 40, 30, 3, st, dst, 16, 0) == -EINVAL);
    CHECK(rt_resize_hwc(r, src, 40, 30, 4, st, dst, 16, 16) == -EINVAL);
    rt_resizer_destroy(NULL);
    /* An unknown kernel name is refused, not silently replaced. */
    struct rt_resizer *k = NULL;
    setenv("RT_RESIZE_KERNEL", "sse9", 1);
    CHECK(rt_resizer_create(&k) == -EINVAL && k == NULL);
    unsetenv("RT_RESIZE_KERNEL");
}

int main(void)
{
    printf("seed %d\n", SEED);
    struct rt_rng g;
    rt_rng_init(&g, SEED, 0);
    struct rt_resizer *r = NULL;
    if (rt_resizer_create(&r)) {
        fprintf(stderr, "rt_resizer_create: %s\n", rt_errmsg());
        return 1;
    }
    for (int k = 0; k < NKERNELS; k++) {
        struct rt_resizer *kr = resizer_for(k);
        if (!kr)
            continue;
        test_exact(kr, kernels[k]);
        if (k > 0) {
            struct rt_resizer *sr = resizer_for(0);
            if (sr)
                test_kernels_agree(sr, kr, kernels[k], &g);
            rt_resizer_destroy(sr);
        }
        rt_resizer_destroy(kr);
    }
    test_crop_path(r, &g);
    test_constant(r);
    test_flip(r, &g);
    test_pad(r, &g);
    test_fit_geometry();
    test_bad_args(r);
    rt_resizer_destroy(r);
    return check_result();
}
