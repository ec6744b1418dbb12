/*
 * test_jpegcrop.c - the partial, scaled JPEG decoder (loader/jpegcrop.h)
 * against TurboJPEG's full decode of the same file:
 *  - at 1/1 the region's pixels inside the box equal tjDecompress2()'s
 *    exactly (baseline 4:2:0 and 4:4:4, progressive 4:2:0, grayscale; sizes
 *    that are and are not multiples of 16; RGB and 1-channel output);
 *  - at 1/2, 1/4, 1/8 they match the full decode area-averaged over k x k
 *    blocks within a PSNR bound per k (stated at PSNR_MIN below);
 *  - rows below the box are not decoded (region shorter than the image);
 *  - a JPEG with junk bytes before its SOS (a libjpeg warning, no error)
 *    decodes exactly, and cut short it is still refused;
 *  - truncated and non-JPEG data give -EBADMSG naming the file; CMYK and
 *    YCCK give "unsupported colour space"; the decoder works after errors.
 * Images are synthetic (fixed seed 27, printed) and encoded here.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <turbojpeg.h>

#include "check.h"
#include "common/common.h"
#include "loader/jpegcrop.h"
#include "loader/rrc.h"

#define SEED 27u

/*
 * Lowest PSNR (dB) of a 1/k decode against the full decode averaged over
 * k x k blocks, over the box's whole blocks. The scaled IDCT is not an area
 * average (different filter, 4:2:0 chroma upsampled at another stage).
 * Measured on these images (libjpeg-turbo 2.1.5): worst correct box 37.3,
 * 42.6, 47.5 dB at 1/2, 1/4, 1/8; with the region placed one scaled pixel
 * off, the best box reaches only 35.3, 30.2, 25.7 dB and most fall to
 * 14-25 dB. The bounds sit between.
 */
static const double PSNR_MIN[9] = {[2] = 35.0, [4] = 38.0, [8] = 42.0};

static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* Photo-like test content: gradients, discs with sharp edges, texture and a little noise. */
static void synth(uint8_t *px, int w, int h, int channels, uint32_t seed)
{
    uint32_t s = seed;
    double cx[8], cy[8], r[8], col[8][3];
    for (int i = 0; i < 8; i++) {
        cx[i] = lcg(&s) % w;
        cy[i] = lcg(&s) % h;
        r[i] = 3 + lcg(&s) % (w / 3 + 1);
        for (int c = 0; c < 3; c++)
            col[i][c] = lcg(&s) & 255;
    }
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            double v[3] = {60 + 150.0 * x / w, 50 + 160.0 * y / h, 200 - 120.0 * (x + y) / (w + h)};
            for (int i = 0; i < 8; i++)
                if ((x - cx[i]) * (x - cx[i]) + (y - cy[i]) * (y - cy[i]) < r[i] * r[i])
                    for (int c = 0; c < 3; c++)
                        v[c] = 0.25 * v[c] + 0.75 * col[i][c];
            const double tex = 20 * sin(x * 0.21) * sin(y * 0.13);
            for (int c = 0; c < channels; c++) {
                const double o = v[c] + tex + (double)(lcg(&s) % 9) - 4;
                px[((size_t)y * w + x) * channels + c] = (uint8_t)(o < 0 ? 0 : o > 255 ? 255 : o);
            }
        }
}

struct img {
    const char *kind;
    int w, h;
    unsigned char *jpg;
    unsigned long len;
    uint8_t *rgb, *gray; /* tjDecompress2 of jpg: RGB and 1-channel */
};

static int make_img(tjhandle dec, struct img *im, const char *kind, int w, int h, uint32_t seed)
{
    /*
     * A fresh compressor per image: TurboJPEG 2.1.5 reusing a handle after a
     * TJFLAG_PROGRESSIVE image wrote a corrupt grayscale file here.
     */
    tjhandle enc = tjInitCompress();
    const int gray = !strcmp(kind, "gray");
    const int sub = gray ? TJSAMP_GRAY : !strcmp(kind, "444") ? TJSAMP_444 : TJSAMP_420;
    const int flags = !strcmp(kind, "progressive") ? TJFLAG_PROGRESSIVE : 0;
    uint8_t *px = malloc((size_t)w * h * 3);
    synth(px, w, h, gray ? 1 : 3, seed);
    *im = (struct img){.kind = kind, .w = w, .h = h};
    if (tjCompress2(enc, px, w, 0, h, gray ? TJPF_GRAY : TJPF_RGB, &im->jpg, &im->len, sub, 90, flags)) {
        fprintf(stderr, "tjCompress2: %s\n", tjGetErrorStr2(enc));
        free(px);
        tjDestroy(enc);
        return -1;
    }
    free(px);
    tjDestroy(enc);
    im->rgb = malloc((size_t)w * h * 3);
    im->gray = malloc((size_t)w * h);
    /* flags 0: accurate integer IDCT and fancy upsampling, what jpegcrop.c sets. */
    if (tjDecompress2(dec, im->jpg, im->len, im->rgb, w, 0, h, TJPF_RGB, 0) ||
        tjDecompress2(dec, im->jpg, im->len, im->gray, w, 0, h, TJPF_GRAY, 0)) {
        fprintf(stderr, "tjDecompress2 (%s %dx%d): %s\n", kind, w, h, tjGetErrorStr2(dec));
        return -1;
    }
    return 0;
}

/*
 * `im` with 3 bytes that are no marker inserted before its first SOS: libjpeg
 * decodes it to the same pixels with the warning "Corrupt JPEG data: 3
 * extraneous bytes before marker 0xda", as Pillow does. *out borrows im's
 * pixels; free out->jpg. Returns 0 or -1.
 */
static int junk_before_sos(const struct img *im, struct img *out)
{
    size_t at = 2;
    while (at + 4 <= im->len && im->jpg[at] == 0xff && im->jpg[at + 1] != 0xda)
        at += 2 + ((size_t)im->jpg[at + 2] << 8 | im->jpg[at + 3]);
    if (at + 2 > im->len || im->jpg[at] != 0xff || im->jpg[at + 1] != 0xda)
        return -1;
    *out = *im;
    out->len = im->len + 3;
    out->jpg = malloc(out->len);
    memcpy(out->jpg, im->jpg, at);
    memcpy(out->jpg + at, "\x00\x5a\xa5", 3);
    memcpy(out->jpg + at + 3, im->jpg + at, im->len - at);
    return 0;
}

/* k = 1: box pixels equal the full decode; box given in integer full-size pixels. */
static void check_exact(struct rt_jpegcrop *d, const struct img *im, int channels, struct rt_box box)
{
    struct rt_jpeg_region reg;
    const uint32_t ow = (uint32_t)box.w, oh = (uint32_t)box.h; /* forces k = 1 */
    int rc = rt_jpegcrop_decode(d, im->jpg, im->len, "exact.jpg", (uint32_t)channels, &box, ow, oh, &reg);
    CHECKF(rc == 0, "%s %dx%d: %s", im->kind, im->w, im->h, rt_errmsg());
    if (rc)
        return;
    CHECK(reg.scale_denom == 1);
    const double rx = reg.box.x, ry = reg.box.y;
    CHECKF(rx == floor(rx) && ry == floor(ry) && reg.box.w == box.w && reg.box.h == box.h, "region box %g %g %g %g",
           rx, ry, reg.box.w, reg.box.h);
    CHECK(rx >= 0 && ry >= 0 && rx + reg.box.w <= reg.w && ry + reg.box.h <= reg.h);
    /* Only the box's rows: those above are skipped, those below never read. */
    CHECKF(reg.h <= box.h, "%s %dx%d: region h %u for a box of %g rows", im->kind, im->w, im->h, reg.h, box.h);
    const uint8_t *full = channels == 3 ? im->rgb : im->gray;
    long diff = 0;
    for (int y = 0; y < (int)box.h; y++)
        for (int x = 0; x < (int)box.w; x++)
            for (int c = 0; c < channels; c++) {
                const uint8_t a = reg.px[(size_t)(ry + y) * reg.stride + (size_t)(rx + x) * channels + c];
                const uint8_t b = full[((size_t)(box.y + y) * im->w + (size_t)(box.x + x)) * channels + c];
                diff += a != b;
            }
    CHECKF(diff == 0, "%s %dx%d ch%d box (%g,%g %gx%g): %ld samples differ from tjDecompress2", im->kind, im->w,
           im->h, channels, box.x, box.y, box.w, box.h, diff);
}

/* k > 1: PSNR against the full decode averaged over k x k blocks; returns the PSNR. */
static double check_scaled(struct rt_jpegcrop *d, const struct img *im, unsigned k, struct rt_box box)
{
    struct rt_jpeg_region reg;
    const uint32_t ow = (uint32_t)floor(box.w / k), oh = (uint32_t)floor(box.h / k);
    int rc = rt_jpegcrop_decode(d, im->jpg, im->len, "scaled.jpg", 3, &box, ow, oh, &reg);
    CHECKF(rc == 0, "%s: %s", im->kind, rt_errmsg());
    if (rc)
        return 0;
    CHECKF(reg.scale_denom == k, "%s box %gx%g out %ux%u: k %u, expected %u", im->kind, box.w, box.h, ow, oh,
           reg.scale_denom, k);
    if (reg.scale_denom != k)
        return 0;
    CHECK(fabs(reg.box.w - box.w / k) < 1e-9 && fabs(reg.box.h - box.h / k) < 1e-9);
    /* Scaled-image column of region column 0. */
    const double xoff = box.x / k - reg.box.x, yoff = box.y / k - reg.box.y;
    CHECK(xoff == floor(xoff) && yoff == floor(yoff) && xoff >= 0 && yoff >= 0);
    double se = 0;
    long n = 0;
    const int sx0 = (int)ceil(box.x / k), sx1 = (int)floor((box.x + box.w) / k);
    const int sy0 = (int)ceil(box.y / k), sy1 = (int)floor((box.y + box.h) / k);
    for (int sy = sy0; sy < sy1; sy++)
        for (int sx = sx0; sx < sx1; sx++) {
            if ((sx + 1) * (int)k > im->w || (sy + 1) * (int)k > im->h)
                continue;
            for (int c = 0; c < 3; c++) {
                double sum = 0;
                for (unsigned j = 0; j < k; j++)
                    for (unsigned i = 0; i < k; i++)
                        sum += im->rgb[((size_t)(sy * k + j) * im->w + (size_t)(sx * k + i)) * 3 + c];
                const double a = reg.px[(size_t)(sy - yoff) * reg.stride + (size_t)(sx - xoff) * 3 + c];
                se += (a - sum / (k * k)) * (a - sum / (k * k));
                n++;
            }
        }
    CHECK(n > 0);
    const double psnr = 10 * log10(255.0 * 255.0 / (se / (n ? n : 1) + 1e-12));
    CHECKF(psnr >= PSNR_MIN[k], "%s %dx%d k=%u: PSNR %.2f dB < %.1f", im->kind, im->w, im->h, k, psnr, PSNR_MIN[k]);
    return psnr;
}

struct cmyk_err {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
};

static void cmyk_error_exit(j_common_ptr c)
{
    longjmp(((struct cmyk_err *)c->err)->jb, 1);
}

/* An Adobe-style CMYK JPEG (no colour transform), written with the libjpeg API. */
static int make_cmyk(unsigned char **out, unsigned long *len)
{
    struct jpeg_compress_struct ci;
    struct cmyk_err e;
    ci.err = jpeg_std_error(&e.pub);
    e.pub.error_exit = cmyk_error_exit;
    if (setjmp(e.jb)) {
        jpeg_destroy_compress(&ci);
        return -1;
    }
    jpeg_create_compress(&ci);
    *out = NULL;
    *len = 0;
    jpeg_mem_dest(&ci, out, len);
    ci.image_width = 40;
    ci.image_height = 24;
    ci.input_components = 4;
    ci.in_color_space = JCS_CMYK;
    jpeg_set_defaults(&ci);
    jpeg_set_colorspace(&ci, JCS_CMYK);
    jpeg_start_compress(&ci, TRUE);
    uint8_t row[40 * 4];
    for (int x = 0; x < 40 * 4; x++)
        row[x] = (uint8_t)(x * 5);
    while (ci.next_scanline < ci.image_height) {
        JSAMPROW r = row;
        jpeg_write_scanlines(&ci, &r, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    return 0;
}

int main(void)
{
    printf("test_jpegcrop: seed %u\n", SEED);
    tjhandle enc = tjInitCompress(), dec = tjInitDecompress();
    struct rt_jpegcrop *d = NULL;
    CHECK_OK(rt_jpegcrop_create(&d));
    if (!enc || !dec || !d)
        return 1;

    static const char *kinds[] = {"420", "444", "progressive", "gray"};
    static const int sizes[][2] = {{500, 375}, {333, 211}, {97, 131}, {64, 48}};
    struct img imgs[RT_ARRAY_LEN(kinds) * RT_ARRAY_LEN(sizes)];
    size_t nimg = 0;
    for (size_t ki = 0; ki < RT_ARRAY_LEN(kinds); ki++)
        for (size_t si = 0; si < RT_ARRAY_LEN(sizes); si++) {
            if (make_img(dec, &imgs[nimg], kinds[ki], sizes[si][0], sizes[si][1],
                         SEED + (uint32_t)(ki * 10 + si)))
                return 1;
            nimg++;
        }

    struct rt_rrc_opts o;
    rt_rrc_defaults(&o);
    double worst[9] = {0, 0, 100, 0, 100, 0, 0, 0, 100};
    for (size_t i = 0; i < nimg; i++) {
        const struct img *im = &imgs[i];
        /* Fixed boxes at the edges and corners, then RandomResizedCrop boxes. */
        const struct rt_box fixed[] = {
            {0, 0, im->w, im->h},
            {0, 0, 17, 9},
            {im->w - 19, im->h - 7, 19, 7},
            {16, 16, im->w / 2, im->h / 2},
            {15, 17, im->w / 3 + 1, im->h / 3 + 3},
            {im->w / 2 + 1, 1, im->w / 2 - 1, im->h / 2 + 2},
        };
        for (size_t b = 0; b < RT_ARRAY_LEN(fixed); b++) {
            check_exact(d, im, 3, fixed[b]);
            check_exact(d, im, 1, fixed[b]);
        }
        for (uint64_t id = 0; id < 12; id++) {
            struct rt_box box;
            int flip, fb;
            rt_rrc_box(&o, SEED, 0, id, (uint32_t)im->w, (uint32_t)im->h, &box, &flip, &fb);
            check_exact(d, im, id & 1 ? 1 : 3, box);
        }
        /* Rows below the box are not decoded. */
        struct rt_jpeg_region reg;
        const struct rt_box top = {0, 0, im->w, 8};
        CHECK_OK(rt_jpegcrop_decode(d, im->jpg, im->len, "top.jpg", 3, &top, 8, 8, &reg));
        CHECKF(reg.h < (uint32_t)im->h && reg.h == 8, "%s: %u rows decoded for an 8-row box", im->kind, reg.h);

        for (unsigned k = 2; k <= 8; k *= 2) {
            if (im->w < 64 || im->h < 64)
                continue;
            const struct rt_box boxes[] = {{0, 0, im->w, im->h}, {24, 40, im->w / 2, im->h / 2}, {5, 3, RT_MIN(130, im->w - 5), RT_MIN(97, im->h - 3)}};
            for (size_t b = 0; b < RT_ARRAY_LEN(boxes); b++) {
                const double p = check_scaled(d, im, k, boxes[b]);
                worst[k] = RT_MIN(worst[k], p);
            }
        }
    }
    printf("worst PSNR against a k x k area average: 1/2 %.1f dB, 1/4 %.1f dB, 1/8 %.1f dB\n", worst[2], worst[4],
           worst[8]);

    /* Truncated data: a whole-image box must read past the cut (baseline); progressive reads all at start. */
    const struct img *base = &imgs[0], *prog = &imgs[2 * RT_ARRAY_LEN(sizes)];
    struct rt_jpeg_region reg;
    const struct rt_box whole = {0, 0, base->w, base->h}, small = {0, 0, 16, 16};
    CHECK_ERR(rt_jpegcrop_decode(d, base->jpg, base->len * 6 / 10, "cut.jpg", 3, &whole, 64, 64, &reg),
              "cut.jpg: truncated or corrupt JPEG");
    CHECK(rt_jpegcrop_decode(d, base->jpg, base->len * 6 / 10, "cut.jpg", 3, &whole, 64, 64, &reg) == -EBADMSG);
    CHECK_ERR(rt_jpegcrop_decode(d, prog->jpg, prog->len * 6 / 10, "cutprog.jpg", 3, &small, 16, 16, &reg),
              "cutprog.jpg: truncated or corrupt JPEG");
    CHECK_ERR(rt_jpegcrop_decode(d, base->jpg, 300, "head.jpg", 3, &whole, 64, 64, &reg), "head.jpg: truncated");
    /* Damage libjpeg decodes through (pack keeps such files, as Pillow reads them) is no error; a cut still is. */
    struct img warned;
    CHECK(junk_before_sos(base, &warned) == 0);
    check_exact(d, &warned, 3, whole);
    check_exact(d, &warned, 1, (struct rt_box){8, 8, 40, 24});
    CHECK_ERR(rt_jpegcrop_decode(d, warned.jpg, warned.len * 6 / 10, "cutwarned.jpg", 3, &whole, 64, 64, &reg),
              "cutwarned.jpg: truncated or corrupt JPEG: Premature end of JPEG file");
    free(warned.jpg);
    static const uint8_t text[] = "this is a text file named .jpg\n";
    CHECK(rt_jpegcrop_decode(d, text, sizeof text, "text.jpg", 3, &whole, 64, 64, &reg) == -EBADMSG);
    CHECK_ERR(rt_jpegcrop_decode(d, text, 0, "empty.jpg", 3, &whole, 64, 64, &reg), "empty.jpg");

    /* CMYK (written with libjpeg) and YCCK (TurboJPEG's encoding of CMYK pixels) are refused. */
    unsigned char *cmyk = NULL, *ycck = NULL;
    unsigned long cmyk_len = 0, ycck_len = 0;
    CHECK(make_cmyk(&cmyk, &cmyk_len) == 0);
    uint8_t px4[32 * 16 * 4];
    for (size_t i = 0; i < sizeof px4; i++)
        px4[i] = (uint8_t)(i * 7);
    CHECK(tjCompress2(enc, px4, 32, 0, 16, TJPF_CMYK, &ycck, &ycck_len, TJSAMP_420, 90, 0) == 0);
    const struct rt_box b16 = {0, 0, 16, 16};
    CHECK_ERR(rt_jpegcrop_decode(d, cmyk, cmyk_len, "cmyk.jpg", 3, &b16, 16, 16, &reg),
              "cmyk.jpg: unsupported colour space (CMYK");
    CHECK_ERR(rt_jpegcrop_decode(d, ycck, ycck_len, "ycck.jpg", 3, &b16, 16, 16, &reg),
              "ycck.jpg: unsupported colour space (YCCK");
    free(cmyk);
    tjFree(ycck);

    /* Bad arguments, then the same decoder still decodes exactly after all those errors. */
    const struct rt_box outside = {base->w + 5, 0, 10, 10}, empty = {0, 0, 0, 10};
    CHECK(rt_jpegcrop_decode(d, base->jpg, base->len, "a.jpg", 3, &outside, 8, 8, &reg) == -EINVAL);
    CHECK(rt_jpegcrop_decode(d, base->jpg, base->len, "a.jpg", 3, &empty, 8, 8, &reg) == -EINVAL);
    CHECK(rt_jpegcrop_decode(d, base->jpg, base->len, "a.jpg", 2, &whole, 8, 8, &reg) == -EINVAL);
    check_exact(d, base, 3, (struct rt_box){33, 21, 101, 77});
    /* A box reaching past the image is clamped to it. */
    const struct rt_box over = {-10, -10, base->w + 20, base->h + 20};
    CHECK_OK(rt_jpegcrop_decode(d, base->jpg, base->len, "over.jpg", 3, &over, base->w, base->h, &reg));
    CHECK(reg.w == (uint32_t)base->w && reg.h == (uint32_t)base->h && reg.box.x == 0 && reg.box.y == 0 &&
          reg.box.w == base->w && reg.box.h == base->h);

    rt_jpegcrop_destroy(d);
    rt_jpegcrop_destroy(NULL);
    for (size_t i = 0; i < nimg; i++) {
        tjFree(imgs[i].jpg);
        free(imgs[i].rgb);
        free(imgs[i].gray);
    }
    tjDestroy(enc);
    tjDestroy(dec);
    return check_result();
}
