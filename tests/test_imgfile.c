/*
 * test_imgfile.c - loader/imgfile.c on the folder tests/mkfolder.c writes
 * (every JPEG/PNG/WebP/PPM/BMP/TIFF variant, bad and ignored files) and on damaged
 * bytes made here: status and reason, format, size, channels; lossless files
 * decode to exactly the pixels written, JPEG and lossy WebP within a stated
 * PSNR of them; EXIF orientation 6 from a JPEG and a WebP, all eight from
 * PNG eXIf before and after IDAT, and WebP EXIF chunks bare, prefixed and unflagged, against an
 * independent reference; a JPEG with junk bytes before its SOS
 * decodes and names libjpeg's warning; truncation at every cut,
 * decompression bombs refused from the header.
 *
 * Seeds: the folder's content is fixed by mkfolder.c (seed = file index).
 * PSNR bounds (of the decode against the pixels encoded): JPEG q90 4:2:0
 * >= 30 dB (JPEG-in-TIFF q90 too), q90 4:4:4 and q95 CMYK/YCCK >= 32 dB,
 * lossy WebP q85 >= 30 dB; BMP and TIFF otherwise exactly.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <webp/encode.h>
#include <zlib.h>

#include "check.h"
#include "common/common.h"
#include "loader/imgfile.h"
#include "mkfolder.h"
#include "test_util.h"

static double psnr(const uint8_t *a, const uint8_t *b, size_t n)
{
    double se = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        se += d * d;
    }
    return se == 0 ? INFINITY : 10 * log10(255.0 * 255.0 * n / se);
}

static uint8_t l24(const uint8_t *p)
{
    return (uint8_t)((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16);
}

static double min_psnr(const char *kind)
{
    if (!strcmp(kind, "jpeg-420") || !strcmp(kind, "jpeg-progressive") || !strcmp(kind, "jpeg-exif6") ||
        !strcmp(kind, "jpeg-gray") || !strcmp(kind, "jpeg-extraneous-bytes") || !strcmp(kind, "tiff-jpeg"))
        return 30;
    if (!strcmp(kind, "webp-lossy"))
        return 30;
    return 32;
}

/* Probe, then decode at 3 and 1 channels; checks the outcome against the table's entry. */
static void check_file(struct rt_imgdec *d, const char *dir, const struct mkf_file *e)
{
    char path[4096];
    uint8_t *buf;
    size_t len;
    struct rt_img_info info;
    enum rt_img_bad why = RT_IMG_BAD_COUNT;
    const uint8_t *px;
    uint32_t w = 0, h = 0;
    const char *base = strrchr(e->path, '/') ? strrchr(e->path, '/') + 1 : e->path;

    if (!strcmp(e->status, "ignored")) {
        CHECKF(base[0] == '.' || !rt_img_name_listed(base), "%s should be ignored", e->path);
        return;
    }
    CHECKF(rt_img_name_listed(base), "%s should be listed", e->path);
    snprintf(path, sizeof(path), "%s/%s", dir, e->path);
    if (rt_file_read(path, &buf, &len) < 0) {
        CHECKF(0, "%s", rt_errmsg());
        return;
    }
    int prc = rt_img_probe(buf, len, path, &info, &why);
    if (strcmp(e->status, "ok") != 0) {
        int rc = prc;
        if (rc == 0) {
            CHECKF(!strcmp(rt_img_format_name(info.format), e->format), "%s: format %s", e->path,
                   rt_img_format_name(info.format));
            CHECK(info.width == e->w && info.height == e->h);
            rc = rt_img_decode(d, buf, len, path, 3, 0, &px, &w, &h, &why);
        }
        CHECKF(rc == -EBADMSG, "%s: rc %d", e->path, rc);
        CHECKF(!strcmp(rt_img_bad_name(why), e->status), "%s: reason %s, expected %s (%s)", e->path,
               rt_img_bad_name(why), e->status, rt_errmsg());
        CHECKF(strstr(rt_errmsg(), path) != NULL, "message names the file: %s", rt_errmsg());
        if (!strcmp(e->status, "truncated"))
            CHECKF(strstr(rt_errmsg(), "truncated ") != NULL && strstr(rt_errmsg(), e->format), "%s", rt_errmsg());
        if (!strcmp(e->status, "unsupported"))
            CHECKF(strstr(rt_errmsg(), "convert") != NULL, "%s", rt_errmsg());
        printf("  %-22s %-16s %s\n", e->path, e->kind, rt_errmsg());
        free(buf);
        return;
    }
    CHECKF(prc == 0, "%s: %s", e->path, rt_errmsg());
    CHECKF(!strcmp(rt_img_format_name(info.format), e->format), "%s: format %s", e->path,
           rt_img_format_name(info.format));
    CHECKF(info.width == e->w && info.height == e->h, "%s: %ux%u", e->path, info.width, info.height);
    CHECKF(info.gray == e->gray, "%s: gray %d", e->path, info.gray);
    CHECKF(info.orientation == e->orientation, "%s: orientation %d", e->path, info.orientation);
    CHECK(info.cmyk == (strstr(e->kind, "cmyk") || strstr(e->kind, "ycck")));
    CHECK(info.progressive == (!strcmp(e->kind, "jpeg-progressive") || !strcmp(e->kind, "png-adam7")));

    /* 3 channels: against the pixels written (gray written is replicated). */
    int rc = rt_img_decode(d, buf, len, path, 3, 0, &px, &w, &h, &why);
    CHECKF(rc == 0 && why == RT_IMG_OK, "%s: %s", e->path, rt_errmsg());
    /* Damage libjpeg decodes through is named, not hidden; an undamaged file has no warning. */
    CHECKF(!strcmp(rt_imgdec_warning(d), e->warning ? e->warning : ""), "%s: warning \"%s\", expected \"%s\"",
           e->path, rt_imgdec_warning(d), e->warning ? e->warning : "");
    if (rc != 0 || w != e->w || h != e->h) {
        CHECKF(0, "%s: decoded %ux%u", e->path, w, h);
        free(buf);
        return;
    }
    const size_t n = (size_t)w * h;
    uint8_t *ref = malloc(n * 3), *rgb = malloc(n * 3);
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 3; k++)
            ref[3 * i + k] = e->px[e->c == 1 ? i : 3 * i + k];
    memcpy(rgb, px, n * 3);
    double p = psnr(rgb, ref, n * 3);
    if (e->lossless)
        CHECKF(memcmp(rgb, ref, n * 3) == 0, "%s: lossless file decodes to other pixels (PSNR %.2f)", e->path, p);
    else
        CHECKF(p >= min_psnr(e->kind), "%s: PSNR %.2f dB < %.0f", e->path, p, min_psnr(e->kind));
    printf("  %-22s %-16s %-7s %3ux%-3u PSNR %6.2f dB\n", e->path, e->kind, e->format, w, h, p);

    /* 1 channel: Pillow's convert("L") of the RGB result, exactly. */
    rc = rt_img_decode(d, buf, len, path, 1, 0, &px, &w, &h, &why);
    CHECKF(rc == 0 && w == e->w && h == e->h, "%s: gray decode: %s", e->path, rt_errmsg());
    if (rc == 0 && w == e->w && h == e->h) {
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += px[i] != l24(rgb + 3 * i);
        CHECKF(bad == 0, "%s: %zu gray pixels differ from the RGB decode's luma", e->path, bad);
    }

    /* EXIF rotation: ignored unless asked; asked, orientation 6 turns the image 90 degrees clockwise. */
    rc = rt_img_decode(d, buf, len, path, 3, 1, &px, &w, &h, &why);
    CHECKF(rc == 0, "%s: %s", e->path, rt_errmsg());
    if (rc == 0 && e->orientation == 6) {
        CHECKF(w == e->h && h == e->w, "%s: turned to %ux%u", e->path, w, h);
        if (w != e->h || h != e->w)
            goto done;
        /* The stored top-left pixel is displayed top-right. */
        CHECK(memcmp(px + (size_t)(w - 1) * 3, rgb, 3) == 0);
        size_t bad = 0;
        for (uint32_t r = 0; r < h; r++)
            for (uint32_t c = 0; c < w; c++)
                bad += memcmp(px + ((size_t)r * w + c) * 3, rgb + ((size_t)(e->h - 1 - c) * e->w + r) * 3, 3) != 0;
        CHECKF(bad == 0, "%s: %zu pixels misplaced by the rotation", e->path, bad);
    } else if (rc == 0) {
        CHECK(w == e->w && h == e->h && memcmp(px, rgb, n * 3) == 0);
    }
done:
    free(ref);
    free(rgb);
    free(buf);
}

/* out(r, c) = in(src_r, src_c), for the displayed image of orientation o (Pillow's exif_transpose). */
static void ref_orient(int o, uint32_t w, uint32_t h, uint32_t r, uint32_t c, uint32_t *sr, uint32_t *sc)
{
    switch (o) {
    case 2: *sr = r; *sc = w - 1 - c; break;          /* FLIP_LEFT_RIGHT */
    case 3: *sr = h - 1 - r; *sc = w - 1 - c; break;  /* ROTATE_180 */
    case 4: *sr = h - 1 - r; *sc = c; break;          /* FLIP_TOP_BOTTOM */
    case 5: *sr = c; *sc = r; break;                  /* TRANSPOSE */
    case 6: *sr = h - 1 - c; *sc = r; break;          /* ROTATE_270 (clockwise 90) */
    case 7: *sr = h - 1 - c; *sc = w - 1 - r; break;  /* TRANSVERSE */
    case 8: *sr = c; *sc = w - 1 - r; break;          /* ROTATE_90 (counter-clockwise) */
    default: *sr = r; *sc = c; break;
    }
}

/* Pixels of px (w x h RGB, src turned by orientation o) not where ref_orient puts src's (W x H RGB). */
static size_t misplaced(const uint8_t *px, uint32_t w, uint32_t h, const uint8_t *src, uint32_t W, uint32_t H, int o)
{
    size_t bad = 0;
    for (uint32_t r = 0; r < h; r++) {
        for (uint32_t c = 0; c < w; c++) {
            uint32_t sr, sc;
            ref_orient(o, W, H, r, c, &sr, &sc);
            bad += memcmp(px + ((size_t)r * w + c) * 3, src + ((size_t)sr * W + sc) * 3, 3) != 0;
        }
    }
    return bad;
}

static void check_orientations(struct rt_imgdec *d)
{
    enum { W = 7, H = 4 };
    uint8_t rgb[W * H * 3], exif[26] = {'I', 'I', 42, 0, 8, 0, 0, 0, 1, 0, 0x12, 0x01, 3, 0, 1, 0, 0, 0};
    mkf_pattern(rgb, W, H, 3, 99);
    for (int i = 0; i < W * H; i++)
        rgb[3 * i] = (uint8_t)i; /* every pixel distinct */
    for (int i = 0; i < 16; i++) {
        /* Each orientation with the eXIf chunk before IDAT, then after it (Pillow reads both). */
        const int o = i % 8 + 1, late = i >= 8;
        uint8_t *png;
        size_t len;
        struct rt_img_info info;
        enum rt_img_bad why;
        const uint8_t *px;
        uint32_t w, h;

        exif[18] = (uint8_t)o;
        struct mkf_png spec = {.w = W, .h = H, .color_type = 2, .depth = 8, .rows = rgb, .exif = exif,
                               .n_exif = sizeof(exif), .exif_late = late};
        if (mkf_png_encode(&spec, &png, &len) < 0) {
            CHECK(0);
            return;
        }
        CHECK_OK(rt_img_probe(png, len, "orient.png", &info, &why));
        CHECKF(info.orientation == o, "eXIf orientation %d (late %d) read as %d", o, late, info.orientation);
        CHECK_OK(rt_img_decode(d, png, len, "orient.png", 3, 0, &px, &w, &h, &why));
        CHECK(w == W && h == H && memcmp(px, rgb, sizeof(rgb)) == 0);
        CHECK_OK(rt_img_decode(d, png, len, "orient.png", 3, 1, &px, &w, &h, &why));
        const int turned_ok = o >= 5 ? (w == H && h == W) : (w == W && h == H);
        CHECKF(turned_ok, "orientation %d: %ux%u", o, w, h);
        const size_t bad = turned_ok ? misplaced(px, w, h, rgb, W, H, o) : 0;
        CHECKF(bad == 0, "orientation %d: %zu pixels misplaced", o, bad);
        /* One channel goes through the same rotation. */
        CHECK_OK(rt_img_decode(d, png, len, "orient.png", 1, 1, &px, &w, &h, &why));
        CHECK(o >= 5 ? (w == H && h == W) : (w == W && h == H));
        free(png);
    }
}

/*
 * WebP EXIF chunks as libwebp's demuxer (Pillow) reads them: the TIFF
 * structure bare or after "Exif\0\0", only when VP8X's EXIF flag is set
 * (Pillow 9.4 sees no orientation without it).
 */
static void check_webp_exif(struct rt_imgdec *d)
{
    enum { W = 7, H = 4 };
    static const uint8_t exif[] = {'E', 'x', 'i', 'f', 0, 0, 'M', 'M', 0, 42, 0, 0, 0, 8, 0, 1, 0x01, 0x12,
                                   0, 3, 0, 0, 0, 1, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0};
    uint8_t rgb[W * H * 3], *simple = NULL;
    mkf_pattern(rgb, W, H, 3, 98);
    const size_t n_simple = WebPEncodeLosslessRGB(rgb, W, H, W * 3, &simple);
    CHECK(n_simple > 0);
    for (int v = 0; n_simple && v < 3; v++) {
        const int prefixed = v == 1, flag = v < 2, want = flag ? 8 : 1;
        uint8_t *webp;
        size_t len;
        struct rt_img_info info;
        enum rt_img_bad why;
        const uint8_t *px;
        uint32_t w, h;

        if (mkf_webp_exif(simple, n_simple, W, H, exif + (prefixed ? 0 : 6), sizeof(exif) - (prefixed ? 0 : 6), flag,
                          &webp, &len) < 0) {
            CHECK(0);
            break;
        }
        CHECK_OK(rt_img_probe(webp, len, "exif.webp", &info, &why));
        CHECKF(info.orientation == want, "WebP EXIF (prefixed %d, flag %d): orientation %d, expected %d", prefixed,
               flag, info.orientation, want);
        CHECK_OK(rt_img_decode(d, webp, len, "exif.webp", 3, 1, &px, &w, &h, &why));
        const int turned_ok = want == 8 ? (w == H && h == W) : (w == W && h == H);
        CHECKF(turned_ok, "WebP EXIF orientation %d: %ux%u", want, w, h);
        const size_t bad = turned_ok ? misplaced(px, w, h, rgb, W, H, want) : 0;
        CHECKF(bad == 0, "WebP EXIF orientation %d: %zu pixels misplaced", want, bad);
        free(webp);
    }
    WebPFree(simple);
}

/* Expects rt_img_decode (and the probe, where the header alone shows it) to refuse buf with `want`. */
static void expect_bad(struct rt_imgdec *d, const uint8_t *buf, size_t len, const char *name, enum rt_img_bad want,
                       const char *needle, int probe_too)
{
    struct rt_img_info info;
    enum rt_img_bad why = RT_IMG_OK;
    const uint8_t *px;
    uint32_t w, h;

    if (probe_too) {
        CHECKF(rt_img_probe(buf, len, name, &info, &why) == -EBADMSG && why == want, "%s (%zu bytes) probe: %s: %s",
               name, len, rt_img_bad_name(why), rt_errmsg());
        CHECKF(strstr(rt_errmsg(), name) && strstr(rt_errmsg(), needle), "%s", rt_errmsg());
    }
    why = RT_IMG_OK;
    int rc = rt_img_decode(d, buf, len, name, 3, 1, &px, &w, &h, &why);
    CHECKF(rc == -EBADMSG && why == want, "%s (%zu bytes): rc %d, %s, expected %s: %s", name, len, rc,
           rt_img_bad_name(why), rt_img_bad_name(want), rt_errmsg());
    CHECKF(strstr(rt_errmsg(), name) && strstr(rt_errmsg(), needle), "%s lacks '%s'", rt_errmsg(), needle);
}

/*
 * Every cut of a file (60 spread over it, and the last byte alone missing) is
 * "truncated". With tail_ok (PNG) a cut after the last pixel row may decode,
 * as Pillow does, but then to exactly the whole file's pixels.
 */
static void check_cuts(struct rt_imgdec *d, const char *dir, const char *rel, const char *needle, int tail_ok)
{
    char path[4096];
    uint8_t *buf, *full;
    size_t len, tails = 0;
    const uint8_t *px;
    uint32_t w, h, w2, h2;
    enum rt_img_bad why;

    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    if (rt_file_read(path, &buf, &len) < 0 || rt_img_decode(d, buf, len, rel, 3, 0, &px, &w, &h, &why) < 0) {
        CHECKF(0, "%s", rt_errmsg());
        return;
    }
    full = malloc((size_t)w * h * 3);
    memcpy(full, px, (size_t)w * h * 3);
    const size_t step = len / 60 + 1;
    for (size_t i = 0, cut = 4; cut < len; i++, cut = cut == len - 1 ? len : RT_MIN(4 + i * step, len - 1)) {
        uint8_t *part = malloc(cut); /* exactly `cut` bytes: ASan sees any read past them */
        memcpy(part, buf, cut);
        if (tail_ok && rt_img_decode(d, part, cut, rel, 3, 0, &px, &w2, &h2, &why) == 0) {
            CHECKF(w2 == w && h2 == h && memcmp(px, full, (size_t)w * h * 3) == 0, "%s cut at %zu", rel, cut);
            tails++;
        } else {
            expect_bad(d, part, cut, rel, RT_IMG_TRUNCATED, needle, 0);
        }
        free(part);
    }
    if (tail_ok)
        printf("  %s: %zu of the cuts after the last pixel row decode whole\n", rel, tails);
    free(full);
    free(buf);
}

static void put32be(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* A PNG signature and IHDR declaring w x h (RGB 8), then nothing: the size must be refused from IHDR. */
static size_t png_bomb(uint8_t *b, uint32_t w, uint32_t h)
{
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    memcpy(b, sig, 8);
    put32be(b + 8, 13);
    memcpy(b + 12, "IHDR", 4);
    put32be(b + 16, w);
    put32be(b + 20, h);
    b[24] = 8;
    b[25] = 2;
    b[26] = b[27] = b[28] = 0;
    put32be(b + 29, (uint32_t)crc32(0, b + 12, 17));
    return 33;
}

static void check_damage(struct rt_imgdec *d, const char *dir)
{
    static const uint8_t text[] = "hello, these are not pixels";
    uint8_t b[64], *jpeg;
    size_t len;
    char path[4096];
    enum rt_img_bad why;
    const uint8_t *px;
    uint32_t w, h;

    expect_bad(d, text, 0, "zero.jpg", RT_IMG_EMPTY, "zero-sized", 1);
    expect_bad(d, text, sizeof(text) - 1, "text.jpg", RT_IMG_NOT_IMAGE, "not an image", 1);
    expect_bad(d, (const uint8_t *)"GIF89a\1\0\1\0\0\0\0;", 14, "a.gif", RT_IMG_UNSUPPORTED, "convert", 1);
    /* A TIFF whose first directory has no entries; one cut inside its header; "BM" and nothing more. */
    expect_bad(d, (const uint8_t *)"II*\0\10\0\0\0\0\0", 10, "a.tif", RT_IMG_CORRUPT, "corrupt TIFF", 1);
    expect_bad(d, (const uint8_t *)"MM\0*\0\0\0\10\0", 9, "cut.tif", RT_IMG_TRUNCATED, "truncated TIFF", 1);
    expect_bad(d, (const uint8_t *)"BM\0\0", 4, "a.bmp", RT_IMG_TRUNCATED, "truncated BMP", 1);
    expect_bad(d, (const uint8_t *)"P3\n2 1\n255\n0 0 0 255 255 255\n", 29, "ascii.ppm", RT_IMG_UNSUPPORTED, "P3", 1);
    expect_bad(d, (const uint8_t *)"P6\n70000 2\n255\n", 15, "wide.ppm", RT_IMG_TOO_LARGE, "too large", 1);
    expect_bad(d, (const uint8_t *)"P6\n20 20\n0\n", 11, "maxval.ppm", RT_IMG_CORRUPT, "maxval", 1);
    expect_bad(d, (const uint8_t *)"P6\n4 4\n255\nxyz", 14, "short.ppm", RT_IMG_TRUNCATED, "truncated", 1);
    len = png_bomb(b, 70000, 10);
    expect_bad(d, b, len, "wide.png", RT_IMG_TOO_LARGE, "too large", 1);
    len = png_bomb(b, 20000, 20000);
    expect_bad(d, b, len, "bomb.png", RT_IMG_TOO_LARGE, "too large", 1);
    len = png_bomb(b, 20, 20);
    expect_bad(d, b, len, "ihdr-only.png", RT_IMG_TRUNCATED, "truncated PNG", 0);

    CHECK(rt_img_decode(d, text, sizeof(text), "x", 2, 0, &px, &w, &h, &why) == -EINVAL);

    /* A JPEG whose SOF claims 60000x60000: refused before any pixel buffer exists. */
    snprintf(path, sizeof(path), "%s/cats/baseline.jpg", dir);
    if (rt_file_read(path, &jpeg, &len) == 0) {
        for (size_t i = 2; i + 9 < len; i++) {
            if (jpeg[i] == 0xff && jpeg[i + 1] == 0xc0) {
                jpeg[i + 5] = 60000 >> 8;
                jpeg[i + 6] = 60000 & 255;
                jpeg[i + 7] = 60000 >> 8;
                jpeg[i + 8] = 60000 & 255;
                break;
            }
        }
        expect_bad(d, jpeg, len, "bomb.jpg", RT_IMG_TOO_LARGE, "too large", 1);
        free(jpeg);
    }
    /* A flipped byte inside a PNG's pixel data: the CRC names it corrupt. */
    snprintf(path, sizeof(path), "%s/cats/interlaced.png", dir);
    if (rt_file_read(path, &jpeg, &len) == 0) {
        jpeg[len / 2] ^= 0x40;
        expect_bad(d, jpeg, len, "flipped.png", RT_IMG_CORRUPT, "corrupt PNG", 0);
        free(jpeg);
    }
    check_cuts(d, dir, "cats/baseline.jpg", "truncated JPEG: ", 0);
    check_cuts(d, dir, "cats/progressive.JPG", "truncated JPEG: ", 0);
    check_cuts(d, dir, "cats/cmyk.jpg", "truncated JPEG: ", 0);
    /* Its warning before the scan does not let a cut file through: the end of the data is still an error. */
    check_cuts(d, dir, "dogs/warned.jpg", "truncated JPEG: ", 0);
    check_cuts(d, dir, "cats/interlaced.png", "truncated PNG", 1);
    check_cuts(d, dir, "cats/palette.png", "truncated PNG", 1);
    check_cuts(d, dir, "cats/photo.webp", "truncated WebP", 0);
    check_cuts(d, dir, "cats/lossless.webp", "truncated WebP", 0);
    check_cuts(d, dir, "cats/scan.ppm", "truncated PPM/PGM", 0);
    check_cuts(d, dir, "dogs/zb_24.bmp", "truncated BMP", 0);
    check_cuts(d, dir, "dogs/zb_565.bmp", "truncated BMP", 0);
    /* Cut after its last row's end-of-line, an RLE file has every pixel: it decodes, as in Pillow. */
    check_cuts(d, dir, "dogs/zb_rle8.bmp", "truncated BMP", 1);
    check_cuts(d, dir, "dogs/zb_rle4.bmp", "truncated BMP", 1);
    check_cuts(d, dir, "dogs/zt_lzw.tiff", "truncated TIFF", 0);
    check_cuts(d, dir, "dogs/zt_tiled.tif", "truncated TIFF", 0);
    check_cuts(d, dir, "dogs/zt_jpeg.tif", "truncated TIFF", 0);

    CHECK(rt_img_name_listed("a.JPG") && rt_img_name_listed("b.jpeg") && rt_img_name_listed("c.WebP") &&
          rt_img_name_listed("d.pgm") && rt_img_name_listed("e.tiff"));
    CHECK(!rt_img_name_listed("notes.txt") && !rt_img_name_listed("Thumbs.db") && !rt_img_name_listed("jpg") &&
          !rt_img_name_listed("a.jpg/b") && !rt_img_name_listed("x.jpg.part"));
    CHECK(!strcmp(rt_img_bad_name(RT_IMG_EMPTY), "zero-sized") && !strcmp(rt_img_bad_name(RT_IMG_OK), "ok") &&
          !strcmp(rt_img_bad_name(RT_IMG_TOO_LARGE), "too large"));
    CHECK(!strcmp(rt_img_format_name(RT_IMG_PNM), "PPM/PGM") && !strcmp(rt_img_format_name(RT_IMG_UNKNOWN), "unknown"));
}

/*
 * rt_img_decode_part on every good JPEG of the folder, at 1/1 and 1/2 (a
 * turned one decoded as stored): windows at the corners, the middle and
 * across the whole image, 1 and 3 channels. The window handed back holds the
 * rows asked for exactly and at least the columns (libjpeg widens to iMCU
 * columns); its pixels equal the whole decode's away from its own edges
 * inside the image (16 px, the margin pack keeps; how many differ nearer is
 * printed), the warning is the whole decode's, and a file cut short is still
 * found truncated when the window lies above the cut.
 */
static void check_windows(struct rt_imgdec *d, const char *dir, const struct mkf_folder *f)
{
    static const double at[][4] = {{0, 0, 0.5, 0.5}, {0.5, 0.5, 0.5, 0.5}, {0.25, 0.2, 0.5, 0.6}, {0, 0, 1, 1},
                                   {0.6, 0, 0.4, 1}, {0, 0.7, 1, 0.3}};
    size_t checked = 0, near_edge = 0, cuts = 0;
    for (size_t i = 0; i < f->n; i++) {
        const struct mkf_file *e = &f->files[i];
        if (strcmp(e->status, "ok") || strcmp(e->format, "JPEG"))
            continue;
        char path[4096];
        uint8_t *buf;
        size_t len;
        snprintf(path, sizeof(path), "%s/%s", dir, e->path);
        if (rt_file_read(path, &buf, &len) < 0) {
            CHECKF(0, "%s", rt_errmsg());
            continue;
        }
        for (uint32_t denom = 1; denom <= 2; denom *= 2)
            for (uint32_t c = 1; c <= 3; c += 2) {
                enum rt_img_bad why;
                const uint8_t *px;
                uint32_t W, H, w, h;
                if (rt_img_decode_part(d, buf, len, path, c, 0, denom, NULL, NULL, &px, &W, &H, &why) < 0) {
                    CHECKF(0, "%s: %s", e->path, rt_errmsg());
                    continue;
                }
                uint8_t *whole = tu_xmalloc((size_t)W * H * c);
                memcpy(whole, px, (size_t)W * H * c);
                char warned[256];
                snprintf(warned, sizeof(warned), "%s", rt_imgdec_warning(d));
                for (size_t k = 0; k < RT_ARRAY_LEN(at); k++) {
                    struct rt_img_window want = {(uint32_t)(at[k][0] * W), (uint32_t)(at[k][1] * H),
                                                 RT_MAX(1, (uint32_t)(at[k][2] * W)),
                                                 RT_MAX(1, (uint32_t)(at[k][3] * H))},
                                         got;
                    int rc = rt_img_decode_part(d, buf, len, path, c, 0, denom, &want, &got, &px, &w, &h, &why);
                    CHECKF(rc == 0, "%s: window %zu: %s", e->path, k, rt_errmsg());
                    if (rc)
                        continue;
                    CHECKF(!strcmp(rt_imgdec_warning(d), warned), "%s: warning '%s', whole decode '%s'", e->path,
                           rt_imgdec_warning(d), warned);
                    CHECKF(got.w == w && got.h == h && got.y == want.y && got.h == want.h && got.x <= want.x &&
                               got.x + got.w >= want.x + want.w && got.x + got.w <= W,
                           "%s 1/%u: window (%u,%u %ux%u) asked, (%u,%u %ux%u) given", e->path, denom, want.x,
                           want.y, want.w, want.h, got.x, got.y, got.w, got.h);
                    if (got.x + got.w > W || got.y + got.h > H)
                        continue;
                    size_t bad = 0;
                    for (uint32_t y = 0; y < h; y++)
                        for (uint32_t x = 0; x < w; x++) {
                            uint32_t gx = got.x + x;
                            int inner = (got.x == 0 || x >= 16) && (got.x + got.w == W || x + 16 < w);
                            for (uint32_t ch = 0; ch < c; ch++) {
                                int same = px[((size_t)y * w + x) * c + ch] ==
                                           whole[((size_t)(got.y + y) * W + gx) * c + ch];
                                bad += inner && !same;
                                near_edge += !inner && !same;
                            }
                        }
                    CHECKF(bad == 0, "%s 1/%u c%u window %zu: %zu values differ from the whole decode", e->path,
                           denom, c, k, bad);
                    checked++;
                }
                free(whole);
            }
        /* Cut short: a window of the top rows fails (or not) exactly as the whole decode does. */
        const uint8_t *px;
        uint32_t w, h;
        enum rt_img_bad why_whole = RT_IMG_OK, why_part = RT_IMG_OK;
        const size_t cut = len * 6 / 10;
        const struct rt_img_window top = {0, 0, e->w, RT_MAX(1, e->h / 5)};
        int rc_whole = rt_img_decode(d, buf, cut, path, 3, 0, &px, &w, &h, &why_whole);
        int rc_part = rt_img_decode_part(d, buf, cut, path, 3, 0, 1, &top, NULL, &px, &w, &h, &why_part);
        CHECKF(rc_whole == rc_part && why_whole == why_part, "%s cut at %zu: whole decode %d (%s), window %d (%s)",
               e->path, cut, rc_whole, rt_img_bad_name(why_whole), rc_part, rt_img_bad_name(why_part));
        cuts += rc_part < 0;
        free(buf);
    }
    printf("  rt_img_decode_part: %zu files cut short found bad as by the whole decode\n", cuts);
    CHECK(cuts > 0);
    printf("  rt_img_decode_part: %zu windows equal to the whole decode (%zu values differ within 16 px of a "
           "window's inner edge)\n", checked, near_edge);
    CHECK(checked > 0);
}

int main(void)
{
    char tmpl[] = "/tmp/test_imgfile.XXXXXX", dir[256], json[256];
    struct mkf_folder f;
    struct rt_imgdec *d = NULL;
    const uint64_t t0 = rt_now_ns();

    printf("seeds: mkfolder.c's fixed per-file seeds (file index)\n");
    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(dir, sizeof(dir), "%s/photos", tmpl);
    if (mkf_write(dir, 0, 0, &f) < 0 || rt_imgdec_create(&d) < 0) {
        rt_remove_tree(tmpl);
        return 1;
    }
    /* The table the generator wrote beside the folder says the same as the one it returned. */
    snprintf(json, sizeof(json), "%s/photos.expected.json", tmpl);
    json_error_t jerr;
    json_t *root = json_load_file(json, 0, &jerr);
    CHECKF(root != NULL, "%s: %s", json, jerr.text);
    if (root) {
        json_t *files = json_object_get(root, "files");
        CHECK(json_array_size(files) == f.n);
        for (size_t i = 0; i < f.n && i < json_array_size(files); i++) {
            json_t *o = json_array_get(files, i);
            CHECK(!strcmp(json_string_value(json_object_get(o, "path")), f.files[i].path));
            CHECK(!strcmp(json_string_value(json_object_get(o, "status")), f.files[i].status));
            CHECK(json_integer_value(json_object_get(o, "width")) == f.files[i].w);
        }
        json_decref(root);
    }
    CHECKF(f.ok == 44 && f.bad == 6 && f.ignored == 4, "%zu ok, %zu bad, %zu ignored", f.ok, f.bad, f.ignored);
    for (size_t i = 0; i < f.n; i++)
        check_file(d, dir, &f.files[i]);
    check_orientations(d);
    check_webp_exif(d);
    check_damage(d, dir);
    check_windows(d, dir, &f);

    rt_imgdec_destroy(d);
    rt_imgdec_destroy(NULL);
    mkf_free(&f);
    rt_remove_tree(tmpl);
    printf("%.2f s\n", (rt_now_ns() - t0) / 1e9);
    return check_result();
}
