/*
 * imgfile.c - decodes the image files people keep in folders (JPEG, PNG,
 * WebP, binary PPM/PGM, BMP, TIFF) from memory to HWC uint8 RGB or gray,
 * matching what Pillow's Image.open(f).convert("RGB") / convert("L") gives,
 * and names what is wrong with a file that cannot be used.
 *
 * The format comes from the file's first bytes, never its name. Sizes are
 * checked from the header before any pixel buffer is allocated, so a small
 * file that declares a huge image (a decompression bomb) costs nothing.
 * JPEG goes through the libjpeg API (not TurboJPEG) because it hands back
 * CMYK/YCCK samples and the warning codes that tell truncation from other
 * damage; both libraries longjmp out of their errors, and each setjmp below
 * sits in the frame that owns the library's state, so nothing of ours is
 * skipped over.
 *
 * BMP (imgfile_bmp.c, our own parser) and TIFF (imgfile_tiff.c, libtiff)
 * live in their own files and share this file's helpers (imgfile_priv.h).
 *
 * It does not resize, crop, composite alpha, apply colour profiles or gamma
 * (Pillow does not either), or read animations; GIF is recognised and
 * refused with a hint to convert it (torchvision's ImageFolder does not list
 * it).
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jpeglib.h>
#include <jerror.h>
#include <libexif/exif-data.h>
#include <png.h>
#include <webp/decode.h>

#include "common/common.h"
#include "loader/imgfile.h"
#include "loader/imgfile_priv.h"

/* A progressive JPEG may hold any number of scans, each re-reading the whole
 * coefficient buffer: a few KB of file can cost minutes of CPU. libjpeg-turbo's
 * own TurboJPEG 3 API stops at 500 scans for the same reason; real encoders
 * write about 10. */
#define JPEG_MAX_SCANS 500
#define MAX_SIDE 65535u

struct rt_imgdec {
    struct jpeg_decompress_struct jd;
    struct jpeg_fail *jf;
    int jd_ready;
    uint8_t *buf[2];   /* [0] the result; [1] rows before conversion, and rotation */
    size_t cap[2];
    png_bytep *rows;
    size_t rows_cap;
};

static const char *const bad_names[RT_IMG_BAD_COUNT] = {
    [RT_IMG_OK] = "ok",
    [RT_IMG_EMPTY] = "zero-sized",
    [RT_IMG_NOT_IMAGE] = "not an image",
    [RT_IMG_TRUNCATED] = "truncated",
    [RT_IMG_CORRUPT] = "corrupt",
    [RT_IMG_UNSUPPORTED] = "unsupported",
    [RT_IMG_TOO_LARGE] = "too large",
};

const char *rt_img_bad_name(enum rt_img_bad why)
{
    return (unsigned)why < RT_IMG_BAD_COUNT ? bad_names[why] : "unknown";
}

const char *rt_img_format_name(enum rt_img_format f)
{
    switch (f) {
    case RT_IMG_JPEG: return "JPEG";
    case RT_IMG_PNG: return "PNG";
    case RT_IMG_WEBP: return "WebP";
    case RT_IMG_PNM: return "PPM/PGM";
    case RT_IMG_BMP: return "BMP";
    case RT_IMG_TIFF: return "TIFF";
    case RT_IMG_GIF: return "GIF";
    default: return "unknown";
    }
}

int rt_img_name_listed(const char *name)
{
    static const char *const exts[] = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};
    const char *dot = name ? strrchr(name, '.') : NULL;
    if (!dot || strchr(dot, '/'))
        return 0;
    for (size_t i = 0; i < RT_ARRAY_LEN(exts); i++)
        if (strcasecmp(dot, exts[i]) == 0)
            return 1;
    return 0;
}

int rt_img_bad(enum rt_img_bad *why, enum rt_img_bad reason, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rt_verrf(-EBADMSG, fmt, ap);
    va_end(ap);
    *why = reason;
    return -EBADMSG;
}

/* ---- signatures ------------------------------------------------------------ */

static int has_prefix(const uint8_t *buf, size_t len, const char *sig, size_t n)
{
    return len >= n && memcmp(buf, sig, n) == 0;
}

static enum rt_img_format sniff(const uint8_t *buf, size_t len)
{
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

    if (len >= 2 && buf[0] == 0xff && buf[1] == 0xd8)
        return RT_IMG_JPEG;
    /* A PNG cut inside its signature is still a (truncated) PNG. */
    if (len >= 4 && memcmp(buf, png_sig, RT_MIN(len, sizeof(png_sig))) == 0)
        return RT_IMG_PNG;
    /* Shorter than its RIFF header, a WebP is only "RIFF": called a (truncated) WebP too. */
    if (has_prefix(buf, len, "RIFF", 4) && (len < 12 || memcmp(buf + 8, "WEBP", 4) == 0))
        return RT_IMG_WEBP;
    if (len >= 3 && buf[0] == 'P' && buf[1] >= '1' && buf[1] <= '7' &&
        (buf[2] == ' ' || buf[2] == '\n' || buf[2] == '\r' || buf[2] == '\t' || buf[2] == '#'))
        return RT_IMG_PNM;
    if (has_prefix(buf, len, "GIF87a", 6) || has_prefix(buf, len, "GIF89a", 6))
        return RT_IMG_GIF;
    /* Classic TIFF and BigTIFF, both byte orders. */
    if (has_prefix(buf, len, "II*\0", 4) || has_prefix(buf, len, "MM\0*", 4) || has_prefix(buf, len, "II+\0", 4) ||
        has_prefix(buf, len, "MM\0+", 4))
        return RT_IMG_TIFF;
    if (len >= 2 && buf[0] == 'B' && buf[1] == 'M') {
        /* Shorter than the DIB header's size field, "BM" is called a (truncated) BMP, as Pillow tries it as one. */
        if (len < 18)
            return RT_IMG_BMP;
        /* "BM" alone starts plenty of text; the DIB header's size field names the BMP versions. */
        uint32_t dib = rt_le32(buf + 14);
        if (dib == 12 || dib == 40 || dib == 52 || dib == 56 || dib == 64 || dib == 108 || dib == 124)
            return RT_IMG_BMP;
    }
    return RT_IMG_UNKNOWN;
}

/* The checks every format's header goes through before anything is allocated. */
int rt_img_check_size(const char *name, const char *fmt, uint64_t w, uint64_t h, enum rt_img_bad *why)
{
    if (w == 0 || h == 0)
        return rt_img_bad(why, RT_IMG_CORRUPT, "%s: %s header says %" PRIu64 "x%" PRIu64 " pixels", name, fmt, w, h);
    if (w > MAX_SIDE || h > MAX_SIDE || w * h > RT_IMG_MAX_PIXELS)
        return rt_img_bad(why, RT_IMG_TOO_LARGE,
                          "%s: %s of %" PRIu64 "x%" PRIu64 " pixels is too large (at most %u per side and %" PRIu64
                          " pixels)",
                          name, fmt, w, h, MAX_SIDE, RT_IMG_MAX_PIXELS);
    return 0;
}

static int unsupported_format(const char *name, enum rt_img_format f, enum rt_img_bad *why)
{
    return rt_img_bad(why, RT_IMG_UNSUPPORTED,
                      "%s: %s files are not decoded here; convert it to PNG or JPEG (e.g. `convert IN OUT.png` with "
                      "ImageMagick)",
                      name, rt_img_format_name(f));
}

/* ---- EXIF orientation ------------------------------------------------------ */

/* `p` holds "Exif\0\0" and a TIFF structure; 1 when no usable orientation. */
static int exif_orientation(const uint8_t *p, size_t n)
{
    ExifData *ed;
    ExifEntry *e;
    int o = 1;

    if (n < 14 || n > 0xffffff)
        return 1;
    ed = exif_data_new();
    if (!ed)
        return 1;
    /* Read only: no "fixing" of entries, and maker notes left alone. */
    exif_data_unset_option(ed, EXIF_DATA_OPTION_FOLLOW_SPECIFICATION);
    exif_data_set_option(ed, EXIF_DATA_OPTION_DONT_CHANGE_MAKER_NOTE);
    exif_data_load_data(ed, p, (unsigned)n);
    e = exif_content_get_entry(ed->ifd[EXIF_IFD_0], EXIF_TAG_ORIENTATION);
    if (e && e->format == EXIF_FORMAT_SHORT && e->components >= 1 && e->size >= 2 && e->data) {
        ExifShort v = exif_get_short(e->data, exif_data_get_byte_order(ed));
        if (v >= 1 && v <= 8)
            o = v;
    }
    exif_data_unref(ed);
    return o;
}

static int jpeg_orientation(j_decompress_ptr jd)
{
    for (jpeg_saved_marker_ptr m = jd->marker_list; m; m = m->next)
        if (m->marker == JPEG_APP0 + 1 && m->data_length >= 6 && memcmp(m->data, "Exif\0\0", 6) == 0)
            return exif_orientation(m->data, m->data_length);
    return 1;
}

/*
 * A PNG eXIf chunk or a WebP EXIF chunk: the TIFF structure, in WebP
 * sometimes after "Exif\0\0" as in JPEG (Pillow takes both); libexif wants
 * the JPEG APP1 header in front.
 */
static int tiff_orientation(const uint8_t *p, size_t n)
{
    uint8_t *tmp;
    int o;

    if (n >= 6 && memcmp(p, "Exif\0\0", 6) == 0)
        return exif_orientation(p, n);
    if (n < 8 || n > 0xffff)
        return 1;
    tmp = malloc(n + 6);
    if (!tmp)
        return 1;
    memcpy(tmp, "Exif\0\0", 6);
    memcpy(tmp + 6, p, n);
    o = exif_orientation(tmp, n + 6);
    free(tmp);
    return o;
}

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | p[2] << 8 | p[3]; }

static int png_chunk_type(const uint8_t *t)
{
    for (int k = 0; k < 4; k++)
        if (!((t[k] >= 'A' && t[k] <= 'Z') || (t[k] >= 'a' && t[k] <= 'z')))
            return 0;
    return 1;
}

/*
 * The orientation of a PNG's eXIf chunk wherever it stands, as Pillow reads
 * it: one before IDAT (libpng has it in `info`) wins; without one, Pillow's
 * load reads the chunks after the pixel data up to IEND, and the last eXIf
 * there counts. Those are found by walking the chunk headers in `buf` (no
 * decoding, no CRC check, as Pillow), so the header-only probe sees them too;
 * the walk stops at IEND, a chunk type that is no chunk's or a chunk that
 * runs past the end. 1 when none.
 */
static int png_exif_orientation(png_structp png, png_infop info, const uint8_t *buf, size_t len)
{
    png_uint_32 n = 0;
    png_bytep p = NULL;
    const uint8_t *late = NULL;
    size_t late_n = 0, at = 8;
    int idat = 0;

    if (png_get_eXIf_1(png, info, &n, &p) && p)
        return tiff_orientation(p, n);
    while (at + 8 <= len && png_chunk_type(buf + at + 4)) {
        const size_t cn = be32(buf + at);
        const uint8_t *t = buf + at + 4;
        if (memcmp(t, "IEND", 4) == 0 || cn > len - at - 8)
            break;
        if (memcmp(t, "IDAT", 4) == 0) {
            idat = 1;
        } else if (idat && memcmp(t, "eXIf", 4) == 0) {
            late = buf + at + 8;
            late_n = cn;
        }
        if (cn > len - at - 12)
            break;
        at += 12 + cn;
    }
    return late ? tiff_orientation(late, late_n) : 1;
}

/*
 * The first EXIF chunk of an extended (VP8X) WebP whose VP8X flags announce
 * EXIF, as libwebp's demuxer (Pillow's reader) finds it: a simple-format
 * file, or one without the flag, has no orientation there. Walks the RIFF
 * chunks within the file and the RIFF size; 1 when none.
 */
static int webp_orientation(const uint8_t *buf, size_t len)
{
    size_t end, at = 12;

    if (len < 30 || memcmp(buf + 12, "VP8X", 4) != 0 || rt_le32(buf + 16) < 10 || !(buf[20] & 0x08))
        return 1;
    end = RT_MIN(len, (size_t)rt_le32(buf + 4) + 8);
    while (at + 8 <= end) {
        const size_t n = rt_le32(buf + at + 4);
        if (n > end - at - 8)
            return 1;
        if (memcmp(buf + at, "EXIF", 4) == 0)
            return tiff_orientation(buf + at + 8, n);
        at += 8 + n + (n & 1);
    }
    return 1;
}

/* ---- pixel conversions ----------------------------------------------------- */

/* Pillow's convert("L"): ITU-R 601 weights in 16-bit fixed point, rounded (Convert.c, L24). */
static inline uint8_t luma(const uint8_t *rgb)
{
    return (uint8_t)((rgb[0] * 19595u + rgb[1] * 38470u + rgb[2] * 7471u + 0x8000u) >> 16);
}

void rt_img_rgb_to_gray(const uint8_t *rgb, uint8_t *gray, size_t n)
{
    for (size_t i = 0; i < n; i++)
        gray[i] = luma(rgb + 3 * i);
}

/* Big-endian 16-bit gray to 8 bits as Pillow's "I" -> "L"/"RGB" convert does: clipped to 0..255. */
static void gray16_clip(const uint8_t *be16, uint8_t *out, size_t n, uint32_t channels)
{
    for (size_t i = 0; i < n; i++) {
        const uint8_t v = be16[2 * i] ? 255 : be16[2 * i + 1];
        for (uint32_t k = 0; k < channels; k++)
            out[channels * i + k] = v;
    }
}

/*
 * CMYK to RGB the way Pillow does: R = (255 - K) - (255 - K) * C / 255, the
 * division rounded as its MULDIV255. Adobe CMYK as libjpeg returns it is
 * inverted (255 = no ink); Pillow reads it as "CMYK;I", re-inverting it.
 */
void rt_img_cmyk_to_rgb(const uint8_t *cmyk, uint8_t *rgb, size_t n, int ink)
{
    const unsigned flip = ink ? 0u : 255u;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *s = cmyk + 4 * i;
        unsigned nk = 255u - (s[3] ^ flip);
        for (int k = 0; k < 3; k++) {
            unsigned t = (s[k] ^ flip) * nk + 128u;
            int v = (int)nk - (int)(((t >> 8) + t) >> 8);
            rgb[3 * i + k] = (uint8_t)(v < 0 ? 0 : v);
        }
    }
}

int rt_imgdec_reserve(struct rt_imgdec *d, int which, size_t n)
{
    if (d->cap[which] >= n)
        return 0;
    uint8_t *p = rt_realloc(d->buf[which], n, "image pixels");
    if (!p)
        return -ENOMEM;
    d->buf[which] = p;
    d->cap[which] = n;
    return 0;
}

uint8_t *rt_imgdec_buf(struct rt_imgdec *d, int which) { return d->buf[which]; }

/*
 * Applies EXIF orientation `o` to src (w x h x c) into dst; *ow, *oh get the
 * displayed size. The same eight cases as Pillow's ImageOps.exif_transpose.
 */
static void orient(const uint8_t *src, uint32_t w, uint32_t h, uint32_t c, int o, uint8_t *dst, uint32_t *ow,
                   uint32_t *oh)
{
    const int swap = o >= 5;
    const uint32_t dw = swap ? h : w, dh = swap ? w : h;

    for (uint32_t i = 0; i < h; i++) {
        for (uint32_t j = 0; j < w; j++) {
            uint32_t r, k;
            switch (o) {
            case 2: r = i; k = w - 1 - j; break;
            case 3: r = h - 1 - i; k = w - 1 - j; break;
            case 4: r = h - 1 - i; k = j; break;
            case 5: r = j; k = i; break;
            case 6: r = j; k = h - 1 - i; break;
            case 7: r = w - 1 - j; k = h - 1 - i; break;
            case 8: r = w - 1 - j; k = i; break;
            default: r = i; k = j; break;
            }
            memcpy(dst + ((size_t)r * dw + k) * c, src + ((size_t)i * w + j) * c, c);
        }
    }
    *ow = dw;
    *oh = dh;
}

/* ---- JPEG ------------------------------------------------------------------ */

struct jpeg_fail {
    struct jpeg_error_mgr pub;
    struct jpeg_progress_mgr progress;
    jmp_buf jmp;
    int code; /* libjpeg's message code of the error or warning that stopped it */
    char msg[JMSG_LENGTH_MAX];
    char warning[JMSG_LENGTH_MAX]; /* the first warning decoded through; "" when none */
};

static void jpeg_fail_exit(j_common_ptr c)
{
    struct jpeg_fail *f = (struct jpeg_fail *)c->err;
    f->code = c->err->msg_code;
    c->err->format_message(c, f->msg);
    longjmp(f->jmp, 1);
}

/*
 * Warnings (level -1) mean damaged data that libjpeg decodes through, as
 * Pillow does (it ignores them): the first one's text is kept for the
 * caller to report. The end of the data (JWRN_JPEG_EOF) stops the decode:
 * Pillow refuses a truncated file too. Trace messages are dropped.
 */
static void jpeg_fail_emit(j_common_ptr c, int level)
{
    struct jpeg_fail *f = (struct jpeg_fail *)c->err;
    if (level >= 0)
        return;
    if (c->err->msg_code == JWRN_JPEG_EOF)
        jpeg_fail_exit(c);
    if (!f->warning[0])
        c->err->format_message(c, f->warning);
    c->err->num_warnings++;
}

static void jpeg_scan_guard(j_common_ptr c)
{
    j_decompress_ptr jd = (j_decompress_ptr)c;
    struct jpeg_fail *f = (struct jpeg_fail *)c->err;
    if (c->is_decompressor && jd->input_scan_number > JPEG_MAX_SCANS) {
        f->code = -1;
        snprintf(f->msg, sizeof(f->msg), "more than %d progressive scans", JPEG_MAX_SCANS);
        longjmp(f->jmp, 1);
    }
}

static void jpeg_fail_init(struct jpeg_fail *f, j_decompress_ptr jd)
{
    memset(f, 0, sizeof(*f));
    jd->err = jpeg_std_error(&f->pub);
    f->pub.error_exit = jpeg_fail_exit;
    f->pub.emit_message = jpeg_fail_emit;
}

static int jpeg_failed(const struct jpeg_fail *f, const char *name, enum rt_img_bad *why)
{
    switch (f->code) {
    case JWRN_JPEG_EOF:
    case JERR_INPUT_EOF:
    case JERR_INPUT_EMPTY:
        return rt_img_bad(why, RT_IMG_TRUNCATED, "%s: truncated JPEG: %s", name, f->msg);
    case JERR_IMAGE_TOO_BIG:
    case JERR_WIDTH_OVERFLOW:
        return rt_img_bad(why, RT_IMG_TOO_LARGE, "%s: JPEG too large: %s", name, f->msg);
    case JERR_ARITH_NOTIMPL:
    case JERR_BAD_PRECISION:
    case JERR_CONVERSION_NOTIMPL:
    case JERR_SOF_UNSUPPORTED:
    case JERR_NOTIMPL:
        return rt_img_bad(why, RT_IMG_UNSUPPORTED, "%s: unsupported JPEG: %s", name, f->msg);
    default:
        return rt_img_bad(why, RT_IMG_CORRUPT, "%s: corrupt JPEG: %s", name, f->msg);
    }
}

/*
 * Reads the header into jd (the caller's setjmp catches libjpeg's errors) and
 * checks what the header declares. Returns 0 or -EBADMSG.
 */
static int jpeg_header(j_decompress_ptr jd, const uint8_t *buf, size_t len, const char *name, int want_exif,
                       enum rt_img_bad *why)
{
    jpeg_mem_src(jd, buf, (unsigned long)len);
    if (want_exif)
        jpeg_save_markers(jd, JPEG_APP0 + 1, 0xffff);
    jpeg_read_header(jd, TRUE);
    if (jd->num_components != 1 && jd->num_components != 3 && jd->num_components != 4)
        return rt_img_bad(why, RT_IMG_UNSUPPORTED, "%s: unsupported JPEG colour space (%d components)", name,
                          jd->num_components);
    if ((jd->num_components == 3 && jd->jpeg_color_space != JCS_YCbCr && jd->jpeg_color_space != JCS_RGB) ||
        (jd->num_components == 4 && jd->jpeg_color_space != JCS_CMYK && jd->jpeg_color_space != JCS_YCCK))
        return rt_img_bad(why, RT_IMG_UNSUPPORTED, "%s: unsupported JPEG colour space (%d components, transform %d)",
                          name, jd->num_components, (int)jd->jpeg_color_space);
    return rt_img_check_size(name, "JPEG", jd->image_width, jd->image_height, why);
}

static int jpeg_probe(const uint8_t *buf, size_t len, const char *name, struct rt_img_info *info,
                      enum rt_img_bad *why)
{
    struct jpeg_decompress_struct jd;
    struct jpeg_fail f;
    int rc;

    jpeg_fail_init(&f, &jd);
    if (setjmp(f.jmp)) {
        jpeg_destroy_decompress(&jd);
        return jpeg_failed(&f, name, why);
    }
    jpeg_create_decompress(&jd);
    rc = jpeg_header(&jd, buf, len, name, 1, why);
    if (rc == 0) {
        info->width = jd.image_width;
        info->height = jd.image_height;
        info->gray = jd.num_components == 1;
        info->cmyk = jd.num_components == 4;
        info->progressive = jd.progressive_mode != 0;
        info->orientation = jpeg_orientation(&jd);
    }
    jpeg_destroy_decompress(&jd);
    return rc;
}

/*
 * Decodes into d->buf[0] (w x h x channels) at 1/denom of the full size
 * (libjpeg's scaled IDCT; denom 1, 2, 4 or 8), or with `want` only that
 * window of it, widened by libjpeg to whole iMCU columns (*got: which
 * window d->buf[0] holds; rows outside it are read and skipped, never
 * converted). d->buf[1] holds one row when the decoder's output needs
 * converting (CMYK, or colour to luma): 4 bytes a pixel as read, then 3 of RGB.
 */
static int jpeg_decode(struct rt_imgdec *d, const uint8_t *buf, size_t len, const char *name, uint32_t channels,
                       uint32_t denom, const struct rt_img_window *want, struct rt_img_window *got,
                       int want_exif, int *orientation, uint32_t *w, uint32_t *h, enum rt_img_bad *why)
{
    j_decompress_ptr jd = &d->jd;
    struct jpeg_fail *f = d->jf;
    int rc;

    f->code = 0;
    if (setjmp(f->jmp)) {
        jpeg_abort_decompress(jd);
        return jpeg_failed(f, name, why);
    }
    /* Markers saved by an earlier call must not linger: abort frees them, and the next read saves them anew. */
    jpeg_save_markers(jd, JPEG_APP0 + 1, 0);
    rc = jpeg_header(jd, buf, len, name, want_exif, why);
    if (rc < 0)
        goto out;
    *orientation = want_exif ? jpeg_orientation(jd) : 1;
    /* A window is in the pixels as stored; a turned image is decoded whole. */
    const struct rt_img_window *const part = *orientation == 1 ? want : NULL;

    const int cmyk = jd->num_components == 4, gray_in = jd->num_components == 1;
    const int direct = !cmyk && (channels == 3 || gray_in);
    jd->out_color_space = cmyk ? JCS_CMYK : direct && channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jd->dct_method = JDCT_ISLOW;
    jd->scale_num = 1;
    jd->scale_denom = denom;
    jpeg_calc_output_dimensions(jd);
    const uint32_t fw = jd->output_width, fh = jd->output_height;
    /* The window, clamped to the image; the whole image without one. */
    uint32_t x0 = 0, cw = fw, y0 = 0, y1 = fh;
    if (part) {
        x0 = RT_MIN(part->x, fw - 1);
        cw = RT_MAX(1, RT_MIN(part->w, fw - x0));
        y0 = RT_MIN(part->y, fh - 1);
        y1 = y0 + RT_MAX(1, RT_MIN(part->h, fh - y0));
    }
    jpeg_start_decompress(jd);
    if (cw < fw) {
        JDIMENSION xo = x0, cwo = cw;
        jpeg_crop_scanline(jd, &xo, &cwo); /* widens to iMCU columns; output_width becomes cwo */
        x0 = xo;
    }
    const uint32_t iw = jd->output_width, ih = y1 - y0;
    if ((rc = rt_imgdec_reserve(d, 0, (size_t)iw * ih * channels)) < 0 ||
        ((!direct || y1 < fh) && (rc = rt_imgdec_reserve(d, 1, (size_t)iw * 7)) < 0))
        goto out;
    if (y0 > 0 && jpeg_skip_scanlines(jd, y0) != y0) {
        rc = jpeg_failed(f, name, why);
        goto out;
    }
    while (jd->output_scanline < y1) {
        uint8_t *dst = d->buf[0] + (size_t)(jd->output_scanline - y0) * iw * channels;
        JSAMPROW row = direct ? dst : d->buf[1];
        if (jpeg_read_scanlines(jd, &row, 1) != 1)
            continue;
        if (direct)
            continue;
        if (cmyk) {
            if (channels == 3) {
                rt_img_cmyk_to_rgb(d->buf[1], dst, iw, 0);
            } else {
                /* Pillow has no CMYK->L: it goes through RGB (after the row's 4 bytes a pixel). */
                rt_img_cmyk_to_rgb(d->buf[1], d->buf[1] + (size_t)iw * 4, iw, 0);
                rt_img_rgb_to_gray(d->buf[1] + (size_t)iw * 4, dst, iw);
            }
        } else {
            rt_img_rgb_to_gray(d->buf[1], dst, iw);
        }
    }
    /*
     * The rows below the window are still read, so damage there is found as in a whole decode: skipped but
     * entropy-decoded, except the last, which is read -- a skip to the very end would stop reading the file.
     */
    if (y1 < fh) {
        JSAMPROW last = d->buf[1];
        if ((fh - y1 > 1 && jpeg_skip_scanlines(jd, fh - y1 - 1) != fh - y1 - 1) ||
            jpeg_read_scanlines(jd, &last, 1) != 1) {
            rc = jpeg_failed(f, name, why);
            goto out;
        }
    }
    jpeg_finish_decompress(jd);
    *w = iw;
    *h = ih;
    if (got)
        *got = (struct rt_img_window){x0, y0, iw, ih};
    return 0;
out:
    jpeg_abort_decompress(jd);
    return rc;
}

/* ---- PNG ------------------------------------------------------------------- */

struct png_src {
    const uint8_t *p;
    size_t len, off;
    int truncated;
    char msg[160];
};

static void png_src_read(png_structp png, png_bytep out, size_t n)
{
    struct png_src *s = png_get_io_ptr(png);
    if (n > s->len - s->off) {
        s->truncated = 1;
        png_error(png, "file ends early");
    }
    memcpy(out, s->p + s->off, n);
    s->off += n;
}

static void png_fail(png_structp png, png_const_charp msg)
{
    struct png_src *s = png_get_error_ptr(png);
    snprintf(s->msg, sizeof(s->msg), "%s", msg);
    png_longjmp(png, 1);
}

/* Warnings are about ancillary chunks (profiles, text); Pillow ignores them too, and so do we. */
static void png_warn(png_structp png, png_const_charp msg)
{
    (void)png;
    (void)msg;
}

static int png_failed(const struct png_src *s, const char *name, enum rt_img_bad *why)
{
    if (s->truncated)
        return rt_img_bad(why, RT_IMG_TRUNCATED, "%s: truncated PNG: file ends after %zu bytes", name, s->len);
    return rt_img_bad(why, RT_IMG_CORRUPT, "%s: corrupt PNG: %s", name, s->msg);
}

/*
 * Probe (d == NULL) or decode into d->buf[0]. One function for both so that
 * the setjmp frame owns the libpng structs from creation to destruction.
 */
static int png_run(struct rt_imgdec *d, const uint8_t *buf, size_t len, const char *name, uint32_t channels,
                   struct rt_img_info *info, int *orientation, uint32_t *w, uint32_t *h, enum rt_img_bad *why)
{
    struct png_src src = {.p = buf, .len = len};
    png_structp png;
    png_infop pinfo = NULL;
    png_uint_32 iw, ih;
    int depth, color, interlace, rc = 0;

    png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_fail, png_warn);
    if (png)
        pinfo = png_create_info_struct(png);
    if (!png || !pinfo) {
        png_destroy_read_struct(&png, &pinfo, NULL);
        *why = RT_IMG_OK;
        return rt_errf(-ENOMEM, "%s: cannot create a PNG reader", name);
    }
    /* IHDR comes first; its size is checked here because png_read_info reads on to the first IDAT, and a
     * header-only bomb would be called truncated. */
    if (len >= 24 && memcmp(buf + 12, "IHDR", 4) == 0 &&
        (rc = rt_img_check_size(name, "PNG", (uint32_t)buf[16] << 24 | (uint32_t)buf[17] << 16 | buf[18] << 8 | buf[19],
                                (uint32_t)buf[20] << 24 | (uint32_t)buf[21] << 16 | buf[22] << 8 | buf[23], why)) < 0) {
        png_destroy_read_struct(&png, &pinfo, NULL);
        return rc;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &pinfo, NULL);
        return png_failed(&src, name, why);
    }
    png_set_read_fn(png, &src, png_src_read);
    /* Our own limits, from IHDR, below; libpng's default of 1e6 per side would call them corrupt. */
    png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
    png_read_info(png, pinfo);
    png_get_IHDR(png, pinfo, &iw, &ih, &depth, &color, &interlace, NULL, NULL);
    if ((rc = rt_img_check_size(name, "PNG", iw, ih, why)) < 0)
        goto out;
    const int gray_in = (color & PNG_COLOR_MASK_COLOR) == 0;
    if (info) {
        info->width = iw;
        info->height = ih;
        info->gray = gray_in;
        info->progressive = interlace != PNG_INTERLACE_NONE;
        info->orientation = png_exif_orientation(png, pinfo, buf, len);
        goto out;
    }

    /*
     * 16 bits to 8 by dropping the low byte, as Pillow's "RGB;16B" and
     * "LA;16B" unpackers do (a truncation, not rounding), except plain 16-bit
     * gray: Pillow opens it as mode "I" and its convert("L"/"RGB") clips each
     * value to 0..255 (1000 -> 255, 200 -> 200), so those samples are read
     * whole and clipped below. Palette and low-depth gray expanded; alpha and
     * tRNS dropped, not composited.
     */
    const int clip16 = color == PNG_COLOR_TYPE_GRAY && depth == 16;
    const int rgb_out = !gray_in && channels == 1 ? 1 : channels == 3;
    if (depth == 16 && !clip16)
        png_set_strip_16(png);
    if (color == PNG_COLOR_TYPE_PALETTE)
        png_set_palette_to_rgb(png);
    if (gray_in && depth < 8)
        png_set_expand_gray_1_2_4_to_8(png);
    if ((color & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, pinfo, PNG_INFO_tRNS))
        png_set_strip_alpha(png);
    if (gray_in && channels == 3 && !clip16)
        png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, pinfo);

    /* nc samples of sb bytes per pixel as libpng delivers them; into d->buf[1] when converted after. */
    const uint32_t nc = clip16 ? 1 : rgb_out ? 3 : 1, sb = clip16 ? 2 : 1;
    const int target = clip16 || nc != channels ? 1 : 0;
    if (png_get_channels(png, pinfo) != nc || png_get_rowbytes(png, pinfo) != (size_t)iw * nc * sb) {
        rc = rt_img_bad(why, RT_IMG_UNSUPPORTED, "%s: PNG colour type %d, depth %d: unexpected layout after conversion",
                        name, color, depth);
        goto out;
    }
    if ((rc = rt_imgdec_reserve(d, 0, (size_t)iw * ih * channels)) < 0 ||
        (target && (rc = rt_imgdec_reserve(d, 1, (size_t)iw * ih * nc * sb)) < 0))
        goto out;
    if (d->rows_cap < ih) {
        png_bytep *r = rt_realloc(d->rows, (size_t)ih * sizeof(*r), "PNG row pointers");
        if (!r) {
            rc = -ENOMEM;
            goto out;
        }
        d->rows = r;
        d->rows_cap = ih;
    }
    for (uint32_t y = 0; y < ih; y++)
        d->rows[y] = d->buf[target] + (size_t)y * iw * nc * sb;
    /* No png_read_end: a file cut after its last pixel row (IEND, trailing text chunks) decodes, as in Pillow. */
    png_read_image(png, d->rows);
    if (clip16)
        gray16_clip(d->buf[1], d->buf[0], (size_t)iw * ih, channels);
    else if (target)
        rt_img_rgb_to_gray(d->buf[1], d->buf[0], (size_t)iw * ih);
    if (orientation)
        *orientation = png_exif_orientation(png, pinfo, buf, len);
    *w = iw;
    *h = ih;
out:
    if (rc == -ENOMEM)
        *why = RT_IMG_OK;
    png_destroy_read_struct(&png, &pinfo, NULL);
    return rc;
}

/* ---- WebP ------------------------------------------------------------------ */

static int webp_status(VP8StatusCode st, const char *name, enum rt_img_bad *why)
{
    static const char *const what[] = {"ok", "out of memory", "invalid parameter", "bitstream error",
                                       "unsupported feature", "suspended", "user abort", "not enough data"};
    const char *m = (unsigned)st < RT_ARRAY_LEN(what) ? what[st] : "error";
    if (st == VP8_STATUS_NOT_ENOUGH_DATA)
        return rt_img_bad(why, RT_IMG_TRUNCATED, "%s: truncated WebP: %s", name, m);
    if (st == VP8_STATUS_UNSUPPORTED_FEATURE)
        return rt_img_bad(why, RT_IMG_UNSUPPORTED, "%s: unsupported WebP: %s", name, m);
    if (st == VP8_STATUS_OUT_OF_MEMORY) {
        *why = RT_IMG_OK;
        return rt_errf(-ENOMEM, "%s: WebP decoder out of memory", name);
    }
    return rt_img_bad(why, RT_IMG_CORRUPT, "%s: corrupt WebP: %s", name, m);
}

static int webp_probe(const uint8_t *buf, size_t len, const char *name, struct rt_img_info *info,
                      enum rt_img_bad *why)
{
    WebPBitstreamFeatures ft;
    VP8StatusCode st = WebPGetFeatures(buf, len, &ft);
    int rc;

    if (st != VP8_STATUS_OK)
        return webp_status(st, name, why);
    if (ft.has_animation)
        return rt_img_bad(why, RT_IMG_UNSUPPORTED, "%s: animated WebP; save one frame as PNG or JPEG", name);
    if ((rc = rt_img_check_size(name, "WebP", (uint64_t)ft.width, (uint64_t)ft.height, why)) < 0)
        return rc;
    info->width = (uint32_t)ft.width;
    info->height = (uint32_t)ft.height;
    info->orientation = webp_orientation(buf, len);
    return 0;
}

static int webp_decode(struct rt_imgdec *d, const uint8_t *buf, size_t len, const char *name, uint32_t channels,
                       int *orientation, uint32_t *w, uint32_t *h, enum rt_img_bad *why)
{
    struct rt_img_info info = {0};
    WebPDecoderConfig cfg;
    int rc;

    if ((rc = webp_probe(buf, len, name, &info, why)) < 0)
        return rc;
    const int target = channels == 1;
    const size_t n = (size_t)info.width * info.height;
    if ((rc = rt_imgdec_reserve(d, 0, n * channels)) < 0 || (target && (rc = rt_imgdec_reserve(d, 1, n * 3)) < 0)) {
        *why = RT_IMG_OK;
        return rc;
    }
    if (!WebPInitDecoderConfig(&cfg))
        return rt_img_bad(why, RT_IMG_UNSUPPORTED, "%s: libwebp version mismatch", name);
    /* MODE_RGB leaves alpha out, as convert("RGB") does; libwebp's default fancy upsampling, as Pillow's. */
    cfg.output.colorspace = MODE_RGB;
    cfg.output.is_external_memory = 1;
    cfg.output.u.RGBA.rgba = d->buf[target];
    cfg.output.u.RGBA.stride = (int)info.width * 3;
    cfg.output.u.RGBA.size = n * 3;
    VP8StatusCode st = WebPDecode(buf, len, &cfg);
    WebPFreeDecBuffer(&cfg.output);
    if (st != VP8_STATUS_OK)
        return webp_status(st, name, why);
    if (target)
        rt_img_rgb_to_gray(d->buf[1], d->buf[0], n);
    if (orientation)
        *orientation = info.orientation;
    *w = info.width;
    *h = info.height;
    return 0;
}

/* ---- PPM/PGM --------------------------------------------------------------- */

struct pnm {
    uint32_t w, h, maxval, c;
    size_t off; /* first sample */
};

/* Reads one decimal header field, skipping whitespace and # comments. 0 ok, 1 ran out, -1 bad. */
static int pnm_field(const uint8_t *p, size_t len, size_t *off, uint32_t *v)
{
    size_t i = *off;
    uint64_t x = 0;
    int digits = 0;

    for (;;) {
        if (i >= len)
            return 1;
        if (p[i] == '#') {
            while (i < len && p[i] != '\n' && p[i] != '\r')
                i++;
        } else if (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r' || p[i] == '\v' || p[i] == '\f') {
            i++;
        } else {
            break;
        }
    }
    while (i < len && p[i] >= '0' && p[i] <= '9') {
        x = x * 10 + (p[i] - '0');
        if (++digits > 10)
            return -1;
        i++;
    }
    if (!digits)
        return -1;
    if (i >= len)
        return 1;
    if (x > UINT32_MAX)
        return -1;
    *v = (uint32_t)x;
    *off = i;
    return 0;
}

static int pnm_header(const uint8_t *buf, size_t len, const char *name, struct pnm *pn, enum rt_img_bad *why)
{
    size_t off = 2;
    uint32_t *fields[3] = {&pn->w, &pn->h, &pn->maxval};
    int rc;

    if (buf[1] != '5' && buf[1] != '6')
        return rt_img_bad(why, RT_IMG_UNSUPPORTED,
                          "%s: P%c netpbm files are not decoded here (binary P5/P6 only); convert it to PNG", name,
                          buf[1]);
    pn->c = buf[1] == '5' ? 1 : 3;
    for (int k = 0; k < 3; k++) {
        rc = pnm_field(buf, len, &off, fields[k]);
        if (rc > 0)
            return rt_img_bad(why, RT_IMG_TRUNCATED, "%s: truncated PPM/PGM: header ends early", name);
        if (rc < 0)
            return rt_img_bad(why, RT_IMG_CORRUPT, "%s: corrupt PPM/PGM header", name);
    }
    /* Exactly one whitespace byte separates the header from the samples. */
    if (buf[off] != ' ' && buf[off] != '\t' && buf[off] != '\n' && buf[off] != '\r')
        return rt_img_bad(why, RT_IMG_CORRUPT, "%s: corrupt PPM/PGM header", name);
    pn->off = off + 1;
    if (pn->maxval == 0 || pn->maxval > 65535)
        return rt_img_bad(why, RT_IMG_CORRUPT, "%s: PPM/PGM maxval %" PRIu32 " out of range (1..65535)", name,
                          pn->maxval);
    if ((rc = rt_img_check_size(name, "PPM/PGM", pn->w, pn->h, why)) < 0)
        return rc;
    const size_t need = (size_t)pn->w * pn->h * pn->c * (pn->maxval > 255 ? 2 : 1);
    if (len - pn->off < need)
        return rt_img_bad(why, RT_IMG_TRUNCATED, "%s: truncated PPM/PGM: %zu of %zu sample bytes", name, len - pn->off,
                          need);
    return 0;
}

static int pnm_decode(struct rt_imgdec *d, const uint8_t *buf, size_t len, const char *name, uint32_t channels,
                      uint32_t *w, uint32_t *h, enum rt_img_bad *why)
{
    struct pnm pn;
    int rc;

    if ((rc = pnm_header(buf, len, name, &pn, why)) < 0)
        return rc;
    const size_t n = (size_t)pn.w * pn.h;
    const int target = pn.c == 3 && channels == 1;
    if ((rc = rt_imgdec_reserve(d, 0, n * channels)) < 0 || (target && (rc = rt_imgdec_reserve(d, 1, n * 3)) < 0)) {
        *why = RT_IMG_OK;
        return rc;
    }
    uint8_t *dst = d->buf[target];
    const uint8_t *s = buf + pn.off;
    const uint32_t mv = pn.maxval;
    /* Other maxvals scaled to 0..255, rounded to nearest. */
    for (size_t i = 0; i < n; i++) {
        for (uint32_t k = 0; k < pn.c; k++) {
            uint32_t v;
            if (mv > 255) {
                v = (uint32_t)s[0] << 8 | s[1];
                s += 2;
            } else {
                v = *s++;
            }
            if (v > mv)
                v = mv;
            uint8_t b = mv == 255 ? (uint8_t)v : (uint8_t)((v * 255u + mv / 2) / mv);
            if (pn.c == 1 && channels == 3) {
                dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = b;
                break;
            }
            dst[i * pn.c + k] = b;
        }
    }
    if (target)
        rt_img_rgb_to_gray(d->buf[1], d->buf[0], n);
    *w = pn.w;
    *h = pn.h;
    return 0;
}

/* ---- public ---------------------------------------------------------------- */

int rt_img_probe(const uint8_t *buf, size_t len, const char *name, struct rt_img_info *info, enum rt_img_bad *why)
{
    enum rt_img_format f;
    struct pnm pn;
    int rc;

    memset(info, 0, sizeof(*info));
    info->orientation = 1;
    *why = RT_IMG_OK;
    if (len == 0)
        return rt_img_bad(why, RT_IMG_EMPTY, "%s: zero-sized file", name);
    f = sniff(buf, len);
    info->format = f;
    switch (f) {
    case RT_IMG_JPEG:
        return jpeg_probe(buf, len, name, info, why);
    case RT_IMG_PNG:
        return png_run(NULL, buf, len, name, 0, info, NULL, NULL, NULL, why);
    case RT_IMG_WEBP:
        return webp_probe(buf, len, name, info, why);
    case RT_IMG_PNM:
        if ((rc = pnm_header(buf, len, name, &pn, why)) < 0)
            return rc;
        info->width = pn.w;
        info->height = pn.h;
        info->gray = pn.c == 1;
        return 0;
    case RT_IMG_BMP:
        return rt_img_bmp(NULL, buf, len, name, 0, info, NULL, NULL, why);
    case RT_IMG_TIFF:
        return rt_img_tiff(NULL, buf, len, name, 0, info, NULL, NULL, NULL, why);
    case RT_IMG_GIF:
        return unsupported_format(name, f, why);
    default:
        return rt_img_bad(why, RT_IMG_NOT_IMAGE,
                          "%s: not an image (no JPEG, PNG, WebP, PPM/PGM, BMP or TIFF signature)", name);
    }
}

int rt_imgdec_create(struct rt_imgdec **out)
{
    struct rt_imgdec *d = rt_calloc(1, sizeof(*d), "image decoder");
    if (!d)
        return -ENOMEM;
    d->jf = rt_calloc(1, sizeof(*d->jf), "JPEG error state");
    if (!d->jf) {
        free(d);
        return -ENOMEM;
    }
    jpeg_fail_init(d->jf, &d->jd);
    d->jf->progress.progress_monitor = jpeg_scan_guard;
    if (setjmp(d->jf->jmp)) {
        /* jpeg_create_decompress fails only when out of memory. */
        free(d->jf);
        free(d);
        return rt_errf(-ENOMEM, "cannot create a JPEG decoder");
    }
    jpeg_create_decompress(&d->jd);
    d->jd.progress = &d->jf->progress;
    d->jd_ready = 1;
    *out = d;
    return 0;
}

void rt_imgdec_destroy(struct rt_imgdec *d)
{
    if (!d)
        return;
    if (d->jd_ready)
        jpeg_destroy_decompress(&d->jd);
    free(d->jf);
    free(d->buf[0]);
    free(d->buf[1]);
    free(d->rows);
    free(d);
}

int rt_img_decode(struct rt_imgdec *d, const uint8_t *buf, size_t len, const char *name, uint32_t channels,
                  int exif_rotate, const uint8_t **px, uint32_t *w, uint32_t *h, enum rt_img_bad *why)
{
    return rt_img_decode_part(d, buf, len, name, channels, exif_rotate, 1, NULL, NULL, px, w, h, why);
}

int rt_img_decode_part(struct rt_imgdec *d, const uint8_t *buf, size_t len, const char *name, uint32_t channels,
                       int exif_rotate, uint32_t denom, const struct rt_img_window *want, struct rt_img_window *got,
                       const uint8_t **px, uint32_t *w, uint32_t *h, enum rt_img_bad *why)
{
    enum rt_img_format f;
    int orientation = 1, rc;

    *why = RT_IMG_OK;
    d->jf->warning[0] = '\0';
    if (channels != 1 && channels != 3)
        return rt_errf(-EINVAL, "%s: cannot decode to %" PRIu32 " channels (1 or 3)", name, channels);
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8)
        return rt_errf(-EINVAL, "%s: cannot decode at 1/%" PRIu32 " (1, 2, 4 or 8)", name, denom);
    if (len == 0)
        return rt_img_bad(why, RT_IMG_EMPTY, "%s: zero-sized file", name);
    f = sniff(buf, len);
    switch (f) {
    case RT_IMG_JPEG:
        rc = jpeg_decode(d, buf, len, name, channels, denom, want, got, exif_rotate, &orientation, w, h, why);
        break;
    case RT_IMG_PNG:
        rc = png_run(d, buf, len, name, channels, NULL, exif_rotate ? &orientation : NULL, w, h, why);
        break;
    case RT_IMG_WEBP:
        rc = webp_decode(d, buf, len, name, channels, exif_rotate ? &orientation : NULL, w, h, why);
        break;
    case RT_IMG_PNM:
        rc = pnm_decode(d, buf, len, name, channels, w, h, why);
        break;
    case RT_IMG_BMP:
        rc = rt_img_bmp(d, buf, len, name, channels, NULL, w, h, why);
        break;
    case RT_IMG_TIFF:
        rc = rt_img_tiff(d, buf, len, name, channels, NULL, &orientation, w, h, why);
        break;
    case RT_IMG_GIF:
        return unsupported_format(name, f, why);
    default:
        return rt_img_bad(why, RT_IMG_NOT_IMAGE,
                          "%s: not an image (no JPEG, PNG, WebP, PPM/PGM, BMP or TIFF signature)", name);
    }
    if (rc < 0)
        return rc;
    *px = d->buf[0];
    /*
     * Each decoder reports an orientation only where it is to be applied: the EXIF one when asked, a TIFF's
     * always (Pillow turns a TIFF by its Orientation tag whenever it loads one, TiffImageFile.load_end).
     */
    if (orientation != 1) {
        if ((rc = rt_imgdec_reserve(d, 1, (size_t)*w * *h * channels)) < 0)
            return rc;
        orient(d->buf[0], *w, *h, channels, orientation, d->buf[1], w, h);
        *px = d->buf[1];
    }
    /* Whole, as displayed: all but a JPEG decoded as stored, which has said which window it made. */
    if (got && (f != RT_IMG_JPEG || orientation != 1))
        *got = (struct rt_img_window){0, 0, *w, *h};
    return 0;
}

const char *rt_imgdec_warning(const struct rt_imgdec *d) { return d->jf->warning; }
