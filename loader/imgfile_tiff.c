/*
 * imgfile_tiff.c - TIFF files from memory through libtiff, read the way
 * Pillow 9.4's TiffImagePlugin reads them: the first page only, the sample
 * layouts of its OPEN_INFO table (others refused, as it refuses them), and
 * its conversions to RGB:
 *  - bilevel and 2/4/8-bit gray, min-is-white inverted (1-bit: 0/255,
 *    2-bit: v * 85, 4-bit: v * 17); gray + alpha;
 *  - 16-bit gray (mode "I;16"/"I;16B", min-is-white not inverted, as
 *    Pillow's table has it) clipped to 0..255 by convert();
 *  - 8-bit RGB with up to three extra samples (unassociated alpha dropped,
 *    associated alpha divided out as Pillow's "RGBa" unpacker does:
 *    v * 255 / a truncated, 0 where a = 0); 16-bit RGB(A) by its high byte;
 *  - palettes of 1..8 bits (the 16-bit colormap's high byte);
 *  - 8-bit CMYK (with up to two extra samples) by Pillow's CMYK->RGB formula;
 *  - YCbCr only JPEG-compressed, converted to RGB by libjpeg as Pillow has
 *    libtiff do (JPEGCOLORMODE_RGB).
 * The Orientation tag is applied whenever the image is decoded, as Pillow
 * 9.4's TiffImageFile.load_end does (so ImageFolder's loader sees the TIFF
 * upright); the probe reports the turned size and orientation 1, which is
 * what exif_transpose finds on the loaded, converted image.
 * Compression is whatever this libtiff decodes (none, LZW, deflate,
 * PackBits, JPEG, CCITT, ...); strips or tiles; planar configuration
 * contiguous or separate. libtiff applies FillOrder and byte order.
 *
 * libtiff's messages go to a per-handle handler (TIFFOpenOptions, libtiff
 * >= 4.5) that keeps the first error for our message: nothing reaches
 * stderr and nothing global is touched, so decoders in several threads do
 * not meet. A read that runs past the end of the buffer makes the failure
 * "truncated"; other failures are "corrupt".
 *
 * Not read (Pillow reads them, rarely met in image folders): 12-bit gray,
 * 32-bit integer and float samples, 16-bit CMYK, 16-bit RGB with
 * associated alpha, YCbCr not JPEG-compressed, CIE L*a*b*.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tiffio.h>

#include "common/common.h"
#include "loader/imgfile_priv.h"

enum tiff_kind { TK_GRAY, TK_GRAY16, TK_RGB, TK_RGB16, TK_PAL, TK_CMYK, TK_YCBCR_JPEG };

struct tiff_src {
    const uint8_t *buf;
    size_t len, pos;
    int short_read;  /* a read asked for bytes past the end */
    char msg[256];   /* libtiff's first error */
};

static tmsize_t tiff_read(thandle_t h, void *dst, tmsize_t n)
{
    struct tiff_src *s = h;
    if (n < 0)
        return -1;
    const size_t have = s->pos < s->len ? s->len - s->pos : 0, k = RT_MIN(have, (size_t)n);
    memcpy(dst, s->buf + s->pos, k);
    s->pos += k;
    if (k < (size_t)n)
        s->short_read = 1;
    return (tmsize_t)k;
}

static tmsize_t tiff_write(thandle_t h, void *src, tmsize_t n)
{
    (void)h, (void)src, (void)n;
    return -1;
}

static toff_t tiff_seek(thandle_t h, toff_t off, int whence)
{
    struct tiff_src *s = h;
    uint64_t base = whence == SEEK_CUR ? s->pos : whence == SEEK_END ? s->len : 0;
    if (off > UINT64_MAX / 2 || base + off > (uint64_t)SIZE_MAX / 2)
        return (toff_t)-1;
    s->pos = (size_t)(base + off);
    return s->pos;
}

static int tiff_close(thandle_t h)
{
    (void)h;
    return 0;
}

static toff_t tiff_size(thandle_t h) { return ((struct tiff_src *)h)->len; }

static int tiff_map(thandle_t h, void **base, toff_t *size)
{
    (void)h, (void)base, (void)size;
    return 0;
}

static void tiff_unmap(thandle_t h, void *base, toff_t size) { (void)h, (void)base, (void)size; }

static int tiff_on_error(TIFF *tif, void *user, const char *module, const char *fmt, va_list ap)
{
    struct tiff_src *s = user;
    (void)tif;
    if (!s->msg[0]) {
        int n = module ? snprintf(s->msg, sizeof(s->msg), "%s: ", module) : 0;
        if (n >= 0 && (size_t)n < sizeof(s->msg))
            vsnprintf(s->msg + n, sizeof(s->msg) - n, fmt, ap);
    }
    return 1; /* handled: not passed on to the global (stderr) handler */
}

static int tiff_on_warning(TIFF *tif, void *user, const char *module, const char *fmt, va_list ap)
{
    (void)tif, (void)user, (void)module, (void)fmt, (void)ap;
    return 1; /* Pillow ignores libtiff's warnings too */
}

static int tiff_failed(const struct tiff_src *s, const char *name, const char *what, enum rt_img_bad *why)
{
    if (s->short_read)
        return rt_img_bad(why, RT_IMG_TRUNCATED, "%s: truncated TIFF: %s", name, s->msg[0] ? s->msg : what);
    return rt_img_bad(why, RT_IMG_CORRUPT, "%s: corrupt TIFF: %s", name, s->msg[0] ? s->msg : what);
}

struct tiff_layout {
    uint32_t w, h;
    uint16_t bps, spp, photometric, sampleformat, planar, compression, n_extra, fillorder;
    uint16_t *extra;
    int premultiplied; /* RGB with associated alpha (ExtraSamples 1) */
    int orientation;
    enum tiff_kind kind;
    int need;          /* samples a pixel's colour reads (the alpha of premultiplied RGB included) */
    int sep;           /* samples in planes of their own (PlanarConfig separate) */
};

static int extra_is(const struct tiff_layout *t, int n, int first)
{
    if (t->n_extra != n)
        return 0;
    for (int i = 0; i < n; i++)
        if (t->extra[i] != (i == 0 ? first : 0))
            return 0;
    return 1;
}

/* The layout and its kind, from the first directory; 0 or -EBADMSG (unsupported) naming the layout. */
static int tiff_classify(TIFF *tif, const char *name, struct tiff_layout *t, enum rt_img_bad *why)
{
    uint16_t o = 1;
    const int be = TIFFIsBigEndian(tif);

    memset(t, 0, sizeof(*t));
    TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &t->w);
    TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &t->h);
    TIFFGetFieldDefaulted(tif, TIFFTAG_BITSPERSAMPLE, &t->bps);
    TIFFGetFieldDefaulted(tif, TIFFTAG_SAMPLESPERPIXEL, &t->spp);
    TIFFGetFieldDefaulted(tif, TIFFTAG_SAMPLEFORMAT, &t->sampleformat);
    TIFFGetFieldDefaulted(tif, TIFFTAG_PLANARCONFIG, &t->planar);
    TIFFGetFieldDefaulted(tif, TIFFTAG_COMPRESSION, &t->compression);
    TIFFGetFieldDefaulted(tif, TIFFTAG_FILLORDER, &t->fillorder);
    TIFFGetFieldDefaulted(tif, TIFFTAG_EXTRASAMPLES, &t->n_extra, &t->extra);
    if (!TIFFGetField(tif, TIFFTAG_PHOTOMETRIC, &t->photometric))
        return rt_img_bad(why, RT_IMG_CORRUPT, "%s: corrupt TIFF: no PhotometricInterpretation", name);
    if (TIFFGetField(tif, TIFFTAG_ORIENTATION, &o) && o >= 1 && o <= 8)
        t->orientation = o;
    else
        t->orientation = 1;

    const int pm = t->photometric, bps = t->bps, spp = t->spp, fo2 = t->fillorder == FILLORDER_LSB2MSB;
    int ok = 0;
    if (t->sampleformat == SAMPLEFORMAT_UINT) {
        if ((pm == PHOTOMETRIC_MINISBLACK || pm == PHOTOMETRIC_MINISWHITE) && spp == 1 && t->n_extra == 0) {
            if (bps == 1 || bps == 2 || bps == 4 || bps == 8)
                ok = 1, t->kind = TK_GRAY;
            else if (bps == 16 && (be ? pm == PHOTOMETRIC_MINISBLACK && !fo2 : !fo2 || pm == PHOTOMETRIC_MINISBLACK))
                ok = 1, t->kind = TK_GRAY16;
        } else if (pm == PHOTOMETRIC_MINISBLACK && spp == 2 && bps == 8 && !fo2 && extra_is(t, 1, 2)) {
            ok = 1, t->kind = TK_GRAY;
        } else if (pm == PHOTOMETRIC_RGB && bps == 8 && (spp == 3 ? t->n_extra == 0 : !fo2)) {
            ok = (spp == 3 && t->n_extra == 0) ||
                 (spp == 4 && (t->n_extra == 0 || extra_is(t, 1, 0) || extra_is(t, 1, 1) || extra_is(t, 1, 2) ||
                               extra_is(t, 1, 999))) ||
                 (spp == 5 && (extra_is(t, 2, 0) || extra_is(t, 2, 1) || extra_is(t, 2, 2))) ||
                 (spp == 6 && (extra_is(t, 3, 0) || extra_is(t, 3, 1) || extra_is(t, 3, 2)));
            t->kind = TK_RGB;
            t->premultiplied = t->n_extra > 0 && t->extra[0] == EXTRASAMPLE_ASSOCALPHA;
        } else if (pm == PHOTOMETRIC_RGB && bps == 16 && !fo2) {
            ok = (spp == 3 && t->n_extra == 0) ||
                 (spp == 4 && (t->n_extra == 0 || extra_is(t, 1, 0) || extra_is(t, 1, 2)));
            t->kind = TK_RGB16;
        } else if (pm == PHOTOMETRIC_PALETTE && (bps == 1 || bps == 2 || bps == 4 || bps == 8)) {
            ok = (spp == 1 && t->n_extra == 0) || (spp == 2 && bps == 8 && !fo2 && extra_is(t, 1, 2));
            t->kind = TK_PAL;
        } else if (pm == PHOTOMETRIC_SEPARATED && bps == 8 && !fo2) {
            ok = (spp == 4 && t->n_extra == 0) || (spp == 5 && extra_is(t, 1, 0)) || (spp == 6 && extra_is(t, 2, 0));
            t->kind = TK_CMYK;
        } else if (pm == PHOTOMETRIC_YCBCR && bps == 8 && spp == 3 && t->n_extra == 0 && !fo2 &&
                   t->compression == COMPRESSION_JPEG && t->planar == PLANARCONFIG_CONTIG) {
            ok = 1, t->kind = TK_YCBCR_JPEG;
        }
    }
    if (!ok)
        return rt_img_bad(why, RT_IMG_UNSUPPORTED,
                          "%s: TIFF with photometric %d, %d samples of %d bits (format %d, %d extra) is not decoded "
                          "here; convert it to PNG",
                          name, pm, spp, bps, t->sampleformat, t->n_extra);
    if (!TIFFIsCODECConfigured(t->compression))
        return rt_img_bad(why, RT_IMG_UNSUPPORTED, "%s: TIFF compression %d is not decoded by this libtiff; convert "
                          "it to PNG", name, t->compression);
    t->need = t->kind == TK_CMYK ? 4 : t->kind == TK_GRAY || t->kind == TK_GRAY16 || t->kind == TK_PAL ? 1
              : 3 + t->premultiplied;
    t->sep = t->planar == PLANARCONFIG_SEPARATE;
    return rt_img_check_size(name, "TIFF", t->w, t->h, why);
}

/* Sample i of a row of `bps`-bit samples (libtiff has applied FillOrder; 16-bit ones are native). */
static inline uint32_t sample(const uint8_t *row, size_t i, int bps)
{
    if (bps <= 8)
        return rt_img_packed(row, i, bps);
    uint16_t v;
    memcpy(&v, row + 2 * i, 2);
    return v;
}

/*
 * Reads every plane of the first image into planes[p] (h rows of `rb`
 * bytes each: TIFFScanlineSize). 0, or -1 with libtiff's error in src.
 */
static int tiff_read_planes(TIFF *tif, const struct tiff_layout *t, uint8_t *planes, size_t rb, size_t plane_bytes)
{
    const uint32_t np = t->planar == PLANARCONFIG_SEPARATE ? t->spp : 1;

    if (TIFFIsTiled(tif)) {
        uint32_t tw = 0, th = 0;
        TIFFGetField(tif, TIFFTAG_TILEWIDTH, &tw);
        TIFFGetField(tif, TIFFTAG_TILELENGTH, &th);
        const tmsize_t ts = TIFFTileSize(tif), trb = TIFFTileRowSize(tif);
        if (!tw || !th || ts <= 0 || trb <= 0 || (uint64_t)trb * th > (uint64_t)ts)
            return -1;
        const uint64_t bits_px = (uint64_t)t->bps * (np == 1 ? t->spp : 1);
        /* Each tile's first column on a byte boundary (the TIFF specification's multiple of 16 guarantees it). */
        if ((tw * bits_px) % 8)
            return -1;
        uint8_t *tile = malloc((size_t)ts);
        if (!tile)
            return -1;
        for (uint32_t p = 0; p < np; p++) {
            for (uint32_t y = 0; y < t->h; y += th) {
                for (uint32_t x = 0; x < t->w; x += tw) {
                    if (TIFFReadEncodedTile(tif, TIFFComputeTile(tif, x, y, 0, (uint16_t)p), tile, ts) < 0) {
                        free(tile);
                        return -1;
                    }
                    const uint32_t rows = RT_MIN(th, t->h - y), cols = RT_MIN(tw, t->w - x);
                    const size_t x0 = (size_t)(x * bits_px / 8), nb = (size_t)((cols * bits_px + 7) / 8);
                    for (uint32_t r = 0; r < rows; r++)
                        memcpy(planes + p * plane_bytes + (size_t)(y + r) * rb + x0, tile + (size_t)r * trb,
                               RT_MIN(nb, (size_t)trb));
                }
            }
        }
        free(tile);
        return 0;
    }
    uint32_t rps = 0;
    TIFFGetFieldDefaulted(tif, TIFFTAG_ROWSPERSTRIP, &rps);
    if (rps == 0 || rps > t->h)
        rps = t->h;
    const uint32_t ns = (t->h + rps - 1) / rps;
    if ((uint64_t)TIFFNumberOfStrips(tif) < (uint64_t)ns * np)
        return -1;
    for (uint32_t p = 0; p < np; p++) {
        for (uint32_t s = 0; s < ns; s++) {
            const uint32_t rows = RT_MIN(rps, t->h - s * rps);
            const tmsize_t want = (tmsize_t)((size_t)rows * rb);
            if (TIFFReadEncodedStrip(tif, p * ns + s, planes + p * plane_bytes + (size_t)s * rps * rb, want) != want)
                return -1;
        }
    }
    return 0;
}

/* Pixel x of row y to RGB, by kind (see the file's comment). */
static void tiff_pixel(const struct tiff_layout *t, const uint8_t *const *rows, uint32_t x, const uint8_t pal[256][3],
                       uint8_t *rgb)
{
    uint32_t v[6];
    for (int k = 0; k < t->need; k++)
        v[k] = t->sep ? sample(rows[k], x, t->bps) : sample(rows[0], (size_t)x * t->spp + k, t->bps);
    switch (t->kind) {
    case TK_GRAY: {
        uint32_t g = t->bps == 1 ? v[0] * 255 : t->bps == 2 ? v[0] * 85 : t->bps == 4 ? v[0] * 17 : v[0];
        if (t->photometric == PHOTOMETRIC_MINISWHITE)
            g = 255 - g;
        rgb[0] = rgb[1] = rgb[2] = (uint8_t)g;
        break;
    }
    case TK_GRAY16:
        rgb[0] = rgb[1] = rgb[2] = (uint8_t)(v[0] > 255 ? 255 : v[0]);
        break;
    case TK_RGB16:
        for (int k = 0; k < 3; k++)
            rgb[k] = (uint8_t)(v[k] >> 8);
        break;
    case TK_PAL:
        memcpy(rgb, pal[v[0] & 255], 3);
        break;
    case TK_CMYK: {
        const uint8_t c[4] = {(uint8_t)v[0], (uint8_t)v[1], (uint8_t)v[2], (uint8_t)v[3]};
        rt_img_cmyk_to_rgb(c, rgb, 1, 1);
        break;
    }
    default: /* TK_RGB, TK_YCBCR_JPEG (libjpeg's RGB) */
        for (int k = 0; k < 3; k++) {
            uint32_t c = v[k];
            if (t->premultiplied) {
                const uint32_t a = v[3];
                c = a == 0 ? 0 : a == 255 ? c : RT_MIN(c * 255 / a, 255u);
            }
            rgb[k] = (uint8_t)c;
        }
        break;
    }
}

int rt_img_tiff(struct rt_imgdec *d, const uint8_t *buf, size_t len, const char *name, uint32_t channels,
                struct rt_img_info *info, int *orientation, uint32_t *w, uint32_t *h, enum rt_img_bad *why)
{
    struct tiff_src src = {.buf = buf, .len = len};
    struct tiff_layout t;
    uint8_t *planes = NULL, pal[256][3];
    TIFF *tif = NULL;
    int rc;

    TIFFOpenOptions *opts = TIFFOpenOptionsAlloc();
    if (!opts) {
        *why = RT_IMG_OK;
        return rt_errf(-ENOMEM, "%s: out of memory for a TIFF reader", name);
    }
    TIFFOpenOptionsSetErrorHandlerExtR(opts, tiff_on_error, &src);
    TIFFOpenOptionsSetWarningHandlerExtR(opts, tiff_on_warning, &src);
    /* One allocation of libtiff's may not exceed what our own size limits allow an image to need. */
    TIFFOpenOptionsSetMaxSingleMemAlloc(opts, (tmsize_t)RT_IMG_MAX_PIXELS * 8);
    /* "m": no memory mapping, so every read goes through tiff_read, which sees a file that ends early. */
    tif = TIFFClientOpenExt(name, "rm", &src, tiff_read, tiff_write, tiff_seek, tiff_close, tiff_size, tiff_map,
                            tiff_unmap, opts);
    TIFFOpenOptionsFree(opts);
    if (!tif)
        return tiff_failed(&src, name, "cannot read its header", why);
    /*
     * A directory whose tag data runs past the end: libtiff drops the tag (with a warning) and may read on --
     * a palette image without its colormap becomes gray -- while Pillow skips the tag and then fails.
     */
    if (src.short_read) {
        rc = tiff_failed(&src, name, "its directory runs past the end of the file", why);
        goto out;
    }
    if ((rc = tiff_classify(tif, name, &t, why)) < 0)
        goto out;
    if (!d) {
        /* As Pillow has it once loaded: turned by the Orientation tag, nothing left for exif_transpose. */
        info->width = t.orientation >= 5 ? t.h : t.w;
        info->height = t.orientation >= 5 ? t.w : t.h;
        info->gray = t.kind == TK_GRAY || t.kind == TK_GRAY16;
        info->cmyk = t.kind == TK_CMYK;
        info->orientation = 1;
        goto out;
    }
    if (t.kind == TK_PAL) {
        uint16_t *r, *g, *b;
        if (!TIFFGetField(tif, TIFFTAG_COLORMAP, &r, &g, &b)) {
            rc = rt_img_bad(why, RT_IMG_CORRUPT, "%s: corrupt TIFF: palette image without a colormap", name);
            goto out;
        }
        /* Pillow keeps each entry's high byte (value // 256); the map has 2^bps entries. */
        memset(pal, 0, sizeof(pal));
        for (uint32_t i = 0; i < (1u << t.bps); i++) {
            pal[i][0] = (uint8_t)(r[i] >> 8);
            pal[i][1] = (uint8_t)(g[i] >> 8);
            pal[i][2] = (uint8_t)(b[i] >> 8);
        }
    }
    if (t.kind == TK_YCBCR_JPEG && !TIFFSetField(tif, TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB)) {
        rc = tiff_failed(&src, name, "cannot have libjpeg convert YCbCr", why);
        goto out;
    }
    const tmsize_t sl = TIFFScanlineSize(tif);
    const uint32_t np = t.planar == PLANARCONFIG_SEPARATE ? t.spp : 1;
    const uint64_t need_row = ((uint64_t)t.w * t.bps * (np == 1 ? t.spp : 1) + 7) / 8;
    if (sl <= 0 || (uint64_t)sl < need_row) {
        rc = tiff_failed(&src, name, "unexpected scanline size", why);
        goto out;
    }
    const size_t rb = (size_t)sl, plane_bytes = rb * t.h, n = (size_t)t.w * t.h;
    planes = rt_calloc(np, plane_bytes, "TIFF samples");
    if (!planes) {
        rc = -ENOMEM;
        goto out;
    }
    if (tiff_read_planes(tif, &t, planes, rb, plane_bytes) < 0) {
        rc = tiff_failed(&src, name, "cannot read its pixels", why);
        goto out;
    }
    const int target = channels == 1;
    if ((rc = rt_imgdec_reserve(d, 0, n * channels)) < 0 || (target && (rc = rt_imgdec_reserve(d, 1, n * 3)) < 0))
        goto out;
    uint8_t *rgb = rt_imgdec_buf(d, target);
    for (uint32_t y = 0; y < t.h; y++) {
        const uint8_t *rows[6];
        for (uint32_t p = 0; p < np && p < 6; p++)
            rows[p] = planes + p * plane_bytes + (size_t)y * rb;
        for (uint32_t x = 0; x < t.w; x++)
            tiff_pixel(&t, rows, x, (const uint8_t(*)[3])pal, rgb + ((size_t)y * t.w + x) * 3);
    }
    if (target)
        rt_img_rgb_to_gray(rgb, rt_imgdec_buf(d, 0), n);
    *orientation = t.orientation;
    *w = t.w;
    *h = t.h;
out:
    if (rc == -ENOMEM) {
        *why = RT_IMG_OK;
        rt_errf(-ENOMEM, "%s: out of memory decoding a TIFF", name);
    }
    free(planes);
    TIFFClose(tif);
    return rc;
}
