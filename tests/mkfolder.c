/*
 * mkfolder.c - `rt_mkfolder DIR [--count N] [--seeds]`: writes a
 * deterministic image folder as people have them (see mkfolder.h) with
 * libjpeg, libpng, libwebp, libtiff and a BMP writer of its own (every
 * depth, RLE8/RLE4, OS/2 and Windows headers), and
 * DIR/../<basename>.expected.json listing
 * every file: path, class, expected status, format, size, gray. The same
 * bytes on every run: the pixels come from a seeded pattern, the encoders
 * are called with fixed settings.
 *
 * It does not exercise the reader: test_imgfile.c and imgfile_vs_pillow.py do.
 */
#include <errno.h>
#include <libgen.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>
#include <sys/stat.h>
#include <tiffio.h>
#include <unistd.h>
#include <webp/encode.h>

#include "common/common.h"
#include "mkfolder.h"

enum kind {
    K_JPEG_420, K_JPEG_444, K_JPEG_PROG, K_JPEG_GRAY, K_JPEG_CMYK, K_JPEG_YCCK, K_JPEG_EXIF6, K_JPEG_EXTRA,
    K_PNG_RGB, K_PNG_PAL8, K_PNG_PAL4, K_PNG_RGB16, K_PNG_GRAYA, K_PNG_RGBA, K_PNG_ADAM7, K_PNG_GRAY1,
    K_PNG_GRAY16, K_WEBP_EXIF6, K_PNG_EXIF6_LATE,
    K_WEBP_LOSSY, K_WEBP_LOSSLESS, K_PPM, K_PGM,
    K_BAD_TRUNC, K_BAD_TEXT, K_BAD_EMPTY, K_BAD_BMP, K_IGNORED,
    K_BMP_24, K_BMP_RLE8, K_BMP_RLE4, K_BMP_565, K_BMP_555, K_BMP_1, K_BMP_PAL4, K_BMP_32, K_BMP_OS2,
    K_TIFF_RGB, K_TIFF_LZW, K_TIFF_RGBA, K_TIFF_GRAY16, K_TIFF_PAL, K_TIFF_CMYK, K_TIFF_JPEG, K_TIFF_TILED,
    K_TIFF_PLANAR, K_TIFF_BILEVEL, K_TIFF_ORIENT6, K_TIFF_RGB16, K_BAD_BMP_TRUNC, K_BAD_TIFF_TRUNC,
};

static const char *const kind_names[] = {
    "jpeg-420", "jpeg-444", "jpeg-progressive", "jpeg-gray", "jpeg-cmyk", "jpeg-ycck", "jpeg-exif6",
    "jpeg-extraneous-bytes",
    "png-rgb", "png-palette8", "png-palette4", "png-16", "png-gray-alpha", "png-rgba", "png-adam7", "png-gray1",
    "png-gray16", "webp-exif6", "png-exif6-late",
    "webp-lossy", "webp-lossless", "ppm", "pgm",
    "truncated-jpeg", "text-as-jpg", "zero-bytes", "bmp-v3-header", "ignored",
    "bmp-24", "bmp-rle8", "bmp-rle4", "bmp-565-topdown", "bmp-555-v5", "bmp-1bit", "bmp-4bit-short-pal", "bmp-32-rgba",
    "bmp-os2-gray8",
    "tiff-rgb", "tiff-lzw", "tiff-rgba-be", "tiff-gray16", "tiff-palette", "tiff-cmyk", "tiff-jpeg", "tiff-tiled",
    "tiff-planar", "tiff-bilevel", "tiff-orient6", "tiff-rgb16", "truncated-bmp", "truncated-tiff",
};

struct spec {
    enum kind kind;
    const char *klass, *name;
    uint32_t w, h;
};

/* The folder: every kind once, sizes 40..320 and not square. */
static const struct spec folder[] = {
    {K_JPEG_420, "cats", "baseline.jpg", 320, 240},
    {K_JPEG_PROG, "cats", "progressive.JPG", 200, 300},
    {K_JPEG_GRAY, "cats", "gray.jpeg", 160, 120},
    {K_JPEG_CMYK, "cats", "cmyk.jpg", 180, 140},
    {K_JPEG_YCCK, "cats", "ycck.jpg", 150, 200},
    {K_JPEG_EXIF6, "cats", "rotated.jpg", 120, 80},
    {K_PNG_PAL8, "cats", "palette.png", 100, 60},
    {K_PNG_RGB16, "cats", "deep.png", 90, 140},
    {K_PNG_GRAYA, "cats", "gray_alpha.png", 64, 96},
    {K_PNG_RGBA, "cats", "rgba.png", 130, 70},
    {K_PNG_ADAM7, "cats", "interlaced.png", 77, 53},
    {K_WEBP_LOSSY, "cats", "photo.webp", 240, 160},
    {K_WEBP_LOSSLESS, "cats", "lossless.webp", 110, 90},
    {K_PPM, "cats", "scan.ppm", 50, 40},
    {K_IGNORED, "cats", "Thumbs.db", 0, 0},
    {K_IGNORED, "cats", ".DS_Store", 0, 0},
    {K_JPEG_444, "dogs", "IMG_0001.JPEG", 300, 200},
    {K_PNG_RGB, "dogs", "really_a_png.jpg", 60, 44},
    {K_PNG_PAL4, "dogs", "palette4.png", 41, 63},
    {K_PNG_GRAY1, "dogs", "bilevel.png", 40, 48},
    {K_PGM, "dogs", "scan.pgm", 45, 70},
    /* Sorts last of the fixed files, so the records before it keep their numbers. */
    {K_JPEG_EXTRA, "dogs", "warned.jpg", 96, 64},
    /* Later additions sort after it, for the same reason. */
    {K_PNG_GRAY16, "dogs", "x_gray16.png", 56, 72},
    {K_WEBP_EXIF6, "dogs", "y_rotated.webp", 70, 45},
    {K_PNG_EXIF6_LATE, "dogs", "z_rotated_late.png", 66, 50},
    /* BMP and TIFF: after all of the above, in dogs, so that the records before them keep their numbers. */
    {K_BMP_24, "dogs", "zb_24.bmp", 40, 30},
    {K_BMP_RLE8, "dogs", "zb_rle8.bmp", 61, 37},
    {K_BMP_RLE4, "dogs", "zb_rle4.bmp", 45, 33},
    {K_BMP_565, "dogs", "zb_565.bmp", 50, 35},
    {K_BMP_555, "dogs", "zb_555.bmp", 43, 29},
    {K_BMP_1, "dogs", "zb_bilevel.bmp", 53, 31},
    {K_BMP_PAL4, "dogs", "zb_pal4.bmp", 39, 27},
    {K_BMP_32, "dogs", "zb_rgba.bmp", 47, 33},
    {K_BMP_OS2, "dogs", "zb_os2.bmp", 42, 26},
    {K_TIFF_RGB, "dogs", "zt_rgb.tif", 52, 38},
    {K_TIFF_LZW, "dogs", "zt_lzw.tiff", 64, 41},
    {K_TIFF_RGBA, "dogs", "zt_rgba.tif", 45, 36},
    {K_TIFF_GRAY16, "dogs", "zt_gray16.tif", 40, 33},
    {K_TIFF_PAL, "dogs", "zt_palette.tif", 55, 31},
    {K_TIFF_CMYK, "dogs", "zt_cmyk.tif", 38, 44},
    {K_TIFF_JPEG, "dogs", "zt_jpeg.tif", 80, 48},
    {K_TIFF_TILED, "dogs", "zt_tiled.tif", 50, 37},
    {K_TIFF_PLANAR, "dogs", "zt_planar.tif", 41, 30},
    {K_TIFF_BILEVEL, "dogs", "zt_bilevel.tif", 59, 35},
    {K_TIFF_ORIENT6, "dogs", "zt_rotated.tif", 36, 24},
    {K_TIFF_RGB16, "dogs", "zt_rgb16.tif", 33, 22},
    {K_BAD_BMP_TRUNC, "dogs", "cut.bmp", 40, 30},
    {K_BAD_TIFF_TRUNC, "dogs", "cut.tif", 40, 30},
    {K_BAD_TRUNC, "dogs", "download.jpg", 200, 150},
    {K_BAD_TEXT, "dogs", "notes.jpg", 0, 0},
    {K_BAD_EMPTY, "dogs", "empty.png", 0, 0},
    {K_BAD_BMP, "dogs", "old.bmp", 40, 30},
    {K_IGNORED, "dogs", ".hidden.jpg", 0, 0},
    {K_IGNORED, "dogs", "notes.txt", 0, 0},
};

/* Fuzz seeds: small enough to stay under 4 KB. */
static const struct spec seeds[] = {
    {K_JPEG_420, "", "tiny.jpg", 24, 16},       {K_JPEG_PROG, "", "progressive.jpg", 24, 16},
    {K_JPEG_CMYK, "", "cmyk.jpg", 16, 8},       {K_JPEG_EXIF6, "", "exif6.jpg", 16, 8},
    {K_JPEG_GRAY, "", "gray.jpg", 16, 16},      {K_PNG_PAL8, "", "palette.png", 24, 16},
    {K_PNG_ADAM7, "", "adam7.png", 12, 10},     {K_PNG_RGB16, "", "deep.png", 8, 6},
    {K_WEBP_LOSSY, "", "lossy.webp", 24, 16},   {K_WEBP_LOSSLESS, "", "lossless.webp", 24, 16},
    {K_PPM, "", "tiny.ppm", 12, 8},             {K_BAD_TRUNC, "", "truncated.jpg", 32, 24},
    {K_BMP_RLE8, "", "rle8.bmp", 24, 16},       {K_BMP_565, "", "565.bmp", 16, 8},
    {K_TIFF_LZW, "", "lzw.tif", 16, 8},         {K_TIFF_TILED, "", "tiled.tif", 20, 18},
};

/* ---- content --------------------------------------------------------------- */

static uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static uint8_t clamp8(int v) { return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); }

void mkf_pattern(uint8_t *px, uint32_t w, uint32_t h, uint32_t c, uint32_t seed)
{
    const uint32_t s = mix(seed * 2654435761u + 1);
    const float cx = (0.3f + (s & 255) / 640.0f) * w, cy = (0.3f + ((s >> 8) & 255) / 640.0f) * h;
    const float rad = (w < h ? w : h) * (0.2f + ((s >> 16) & 63) / 512.0f);
    const int disc[3] = {(int)(s >> 24), 255 - (int)((s >> 4) & 255), (int)((s >> 12) & 127) + 64};

    for (uint32_t y = 0; y < h; y++) {
        for (uint32_t x = 0; x < w; x++) {
            int v[3];
            v[0] = (int)(x * 255 / (w > 1 ? w - 1 : 1));
            v[1] = (int)(y * 255 / (h > 1 ? h - 1 : 1));
            v[2] = (int)((x + 2 * y) * 255 / (w + 2 * h));
            float dx = x - cx, dy = y - cy;
            if (dx * dx + dy * dy < rad * rad)
                for (int k = 0; k < 3; k++)
                    v[k] = disc[k];
            if (y > h * 3 / 4 && y < h * 3 / 4 + h / 10 + 1)
                v[0] = v[1] = v[2] = 30; /* a dark bar: sharp edges */
            int noise = (int)(mix(s ^ (y * 65537u + x)) % 13) - 6;
            uint8_t *p = px + ((size_t)y * w + x) * c;
            if (c == 1) {
                p[0] = clamp8((v[0] * 2 + v[1] * 5 + v[2]) / 8 + noise);
            } else {
                for (int k = 0; k < 3; k++)
                    p[k] = clamp8(v[k] + noise);
            }
        }
    }
}

/* ---- encoders -------------------------------------------------------------- */

struct jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jmp;
};

static void jerr_exit(j_common_ptr c) { longjmp(((struct jerr *)c->err)->jmp, 1); }

/* EXIF APP1 payload holding only IFD0's Orientation (little-endian TIFF). */
static size_t exif_app1(uint8_t *b, int orientation)
{
    static const uint8_t tmpl[] = {'E', 'x', 'i', 'f', 0, 0, 'I', 'I', 42, 0, 8, 0, 0, 0, /* IFD0 at 8 */
                                   1, 0,                                                  /* 1 entry */
                                   0x12, 0x01, 3, 0, 1, 0, 0, 0, 0, 0, 0, 0,              /* 0x0112 SHORT x1 */
                                   0, 0, 0, 0};                                           /* no IFD1 */
    memcpy(b, tmpl, sizeof(tmpl));
    b[6 + 8 + 2 + 8] = (uint8_t)orientation;
    return sizeof(tmpl);
}

/* in_c: 1 gray, 3 RGB, 4 CMYK (Adobe-inverted samples). */
static int jpeg_encode(const uint8_t *px, uint32_t w, uint32_t h, int in_c, int ycck, int progressive,
                       int quality, int s444, int orientation, uint8_t **out, unsigned long *len)
{
    struct jpeg_compress_struct cj;
    struct jerr je;
    uint8_t exif[64];

    *out = NULL;
    *len = 0;
    cj.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jerr_exit;
    if (setjmp(je.jmp)) {
        jpeg_destroy_compress(&cj);
        free(*out);
        fprintf(stderr, "mkfolder: JPEG encode failed\n");
        return -1;
    }
    jpeg_create_compress(&cj);
    jpeg_mem_dest(&cj, out, len);
    cj.image_width = w;
    cj.image_height = h;
    cj.input_components = in_c;
    cj.in_color_space = in_c == 1 ? JCS_GRAYSCALE : in_c == 3 ? JCS_RGB : JCS_CMYK;
    jpeg_set_defaults(&cj);
    if (ycck)
        jpeg_set_colorspace(&cj, JCS_YCCK);
    jpeg_set_quality(&cj, quality, TRUE);
    if (s444)
        for (int i = 0; i < cj.num_components; i++)
            cj.comp_info[i].h_samp_factor = cj.comp_info[i].v_samp_factor = 1;
    if (progressive)
        jpeg_simple_progression(&cj);
    jpeg_start_compress(&cj, TRUE);
    if (orientation > 1) {
        size_t n = exif_app1(exif, orientation);
        jpeg_write_marker(&cj, JPEG_APP0 + 1, exif, (unsigned)n);
    }
    while (cj.next_scanline < h) {
        JSAMPROW row = (JSAMPROW)(px + (size_t)cj.next_scanline * w * in_c);
        jpeg_write_scanlines(&cj, &row, 1);
    }
    jpeg_finish_compress(&cj);
    jpeg_destroy_compress(&cj);
    return 0;
}

struct membuf {
    uint8_t *p;
    size_t len, cap;
    int oom;
};

static void png_mem_write(png_structp png, png_bytep data, size_t n)
{
    struct membuf *m = png_get_io_ptr(png);
    if (m->len + n > m->cap) {
        size_t cap = (m->len + n) * 2;
        uint8_t *p = realloc(m->p, cap);
        if (!p) {
            m->oom = 1;
            png_error(png, "out of memory");
        }
        m->p = p;
        m->cap = cap;
    }
    memcpy(m->p + m->len, data, n);
    m->len += n;
}

static void png_mem_flush(png_structp png) { (void)png; }

int mkf_png_encode(const struct mkf_png *s, uint8_t **out, size_t *len)
{
    struct membuf m = {0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    png_colorp pal = NULL;

    if (!png || !info) {
        png_destroy_write_struct(&png, &info);
        return -1;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        free(m.p);
        free(pal);
        fprintf(stderr, "mkfolder: PNG encode failed\n");
        return -1;
    }
    png_set_write_fn(png, &m, png_mem_write, png_mem_flush);
    png_set_IHDR(png, info, s->w, s->h, s->depth, s->color_type, s->interlace, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    if (s->palette) {
        pal = malloc(sizeof(*pal) * (size_t)s->n_palette);
        for (int i = 0; pal && i < s->n_palette; i++) {
            pal[i].red = s->palette[3 * i];
            pal[i].green = s->palette[3 * i + 1];
            pal[i].blue = s->palette[3 * i + 2];
        }
        png_set_PLTE(png, info, pal, s->n_palette);
    }
    if (s->trns)
        png_set_tRNS(png, info, s->trns, s->n_trns, NULL);
    if (s->exif && !s->exif_late)
        png_set_eXIf_1(png, info, s->n_exif, (png_bytep)s->exif);
    png_write_info(png, info);
    /* Set after png_write_info, png_write_end writes it after IDAT. */
    if (s->exif && s->exif_late)
        png_set_eXIf_1(png, info, s->n_exif, (png_bytep)s->exif);
    const size_t rowbytes = png_get_rowbytes(png, info);
    const int passes = png_set_interlace_handling(png);
    for (int p = 0; p < passes; p++)
        for (uint32_t y = 0; y < s->h; y++)
            png_write_row(png, s->rows + y * rowbytes);
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    free(pal);
    *out = m.p;
    *len = m.len;
    return 0;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

int mkf_webp_exif(const uint8_t *webp, size_t len, uint32_t w, uint32_t h, const uint8_t *exif, size_t n, int flag,
                  uint8_t **out, size_t *out_len)
{
    if (len < 20 || memcmp(webp, "RIFF", 4) != 0 || memcmp(webp + 8, "WEBP", 4) != 0) {
        fprintf(stderr, "mkfolder: not a simple-format WebP\n");
        return -1;
    }
    const size_t total = 12 + 18 + (len - 12) + 8 + n + (n & 1);
    uint8_t *b = calloc(1, total);
    if (!b)
        return -1;
    memcpy(b, "RIFF", 4);
    put_le32(b + 4, (uint32_t)(total - 8));
    memcpy(b + 8, "WEBPVP8X", 8);
    put_le32(b + 16, 10);
    b[20] = flag ? 0x08 : 0; /* EXIF; no alpha, ICC, XMP or animation */
    for (int k = 0; k < 3; k++) { /* 24-bit canvas width - 1, then height - 1 */
        b[24 + k] = (uint8_t)((w - 1) >> (8 * k));
        b[27 + k] = (uint8_t)((h - 1) >> (8 * k));
    }
    memcpy(b + 30, webp + 12, len - 12);
    uint8_t *c = b + 30 + (len - 12);
    memcpy(c, "EXIF", 4);
    put_le32(c + 4, (uint32_t)n);
    memcpy(c + 8, exif, n);
    *out = b;
    *out_len = total;
    return 0;
}

static int write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) {
        fprintf(stderr, "mkfolder: %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* A 24-bit BMP: a real one, so that only our refusal keeps it out. */
static int bmp_bytes(uint32_t w, uint32_t h, const uint8_t *rgb, uint8_t **out, size_t *len)
{
    const uint32_t stride = (w * 3 + 3) & ~3u, size = 54 + stride * h;
    uint8_t *b = calloc(1, size);
    if (!b)
        return -1;
    const uint32_t hdr[] = {size, 0, 54, 40, w, h};
    b[0] = 'B';
    b[1] = 'M';
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 4; k++)
            b[2 + 4 * i + k] = (uint8_t)(hdr[i] >> (8 * k));
    b[26] = 1;  /* planes */
    b[28] = 24; /* bits per pixel */
    for (uint32_t y = 0; y < h; y++)
        for (uint32_t x = 0; x < w; x++)
            for (int k = 0; k < 3; k++)
                b[54 + (h - 1 - y) * stride + x * 3 + k] = rgb[((size_t)y * w + x) * 3 + 2 - k];
    *out = b;
    *len = size;
    return 0;
}

/*
 * Inserts 3 bytes that are no marker before the first SOS (0xFFDA), walking
 * the header's segments so that no 0xFF 0xDA inside one is taken for it:
 * libjpeg (and Pillow, which uses it) decodes such a file with the warning
 * "Corrupt JPEG data: 3 extraneous bytes before marker 0xda". *data is
 * reallocated. Returns 0 or -1.
 */
static int jpeg_junk_before_sos(uint8_t **data, size_t *len)
{
    static const uint8_t junk[3] = {0x00, 0x5a, 0xa5};
    size_t at = 2;

    while (at + 4 <= *len && (*data)[at] == 0xff && (*data)[at + 1] != 0xda)
        at += 2 + ((size_t)(*data)[at + 2] << 8 | (*data)[at + 3]);
    if (at + 2 > *len || (*data)[at] != 0xff || (*data)[at + 1] != 0xda) {
        fprintf(stderr, "mkfolder: no SOS marker in the JPEG written\n");
        return -1;
    }
    uint8_t *p = realloc(*data, *len + sizeof(junk));
    if (!p)
        return -1;
    memmove(p + at + sizeof(junk), p + at, *len - at);
    memcpy(p + at, junk, sizeof(junk));
    *data = p;
    *len += sizeof(junk);
    return 0;
}

/* ---- BMP and TIFF ---------------------------------------------------------- */

static void put_le16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/*
 * A BMP as a writer would lay it out: file header, a DIB header of `hsize`
 * bytes (12: OS/2 1.x; 40, 56, 108, 124: Windows), the three bit field
 * masks after a 40-byte header (else inside it), the palette (BGR for OS/2,
 * BGRX else) and `px` (rows in file order, padded). colors: the header's
 * count (0: all).
 */
struct bmpw {
    uint32_t w, h, hsize, bits, comp, colors, n_pal;
    int topdown;
    const uint8_t *pal; /* n_pal RGB triples */
    const uint32_t *masks; /* 4 masks when comp == 3 */
    const uint8_t *px;
    size_t n_px;
};

static int bmp_build(const struct bmpw *b, uint8_t **out, size_t *len)
{
    const size_t pe = b->hsize == 12 ? 3 : 4, extra = b->comp == 3 && b->hsize == 40 ? 12 : 0;
    const size_t off = 14 + b->hsize + extra + pe * b->n_pal, size = off + b->n_px;
    uint8_t *p = calloc(1, size);
    if (!p)
        return -1;
    p[0] = 'B';
    p[1] = 'M';
    put_le32(p + 2, (uint32_t)size);
    put_le32(p + 10, (uint32_t)off);
    put_le32(p + 14, b->hsize);
    if (b->hsize == 12) {
        put_le16(p + 18, b->w);
        put_le16(p + 20, b->h);
        put_le16(p + 22, 1);
        put_le16(p + 24, b->bits);
    } else {
        put_le32(p + 18, b->w);
        put_le32(p + 22, b->topdown ? (uint32_t)(0 - b->h) : b->h);
        put_le16(p + 26, 1);
        put_le16(p + 28, b->bits);
        put_le32(p + 30, b->comp);
        put_le32(p + 34, (uint32_t)b->n_px);
        put_le32(p + 38, 2835);
        put_le32(p + 42, 2835);
        put_le32(p + 46, b->colors);
        if (b->comp == 3)
            for (int k = 0; k < (extra ? 3 : 4); k++)
                put_le32(p + 54 + 4 * k, b->masks[k]);
        if (b->hsize >= 108)
            put_le32(p + 70, 0x73524742); /* "sRGB" colour space */
    }
    for (uint32_t i = 0; i < b->n_pal; i++)
        for (int k = 0; k < 3; k++)
            p[14 + b->hsize + extra + pe * i + k] = b->pal[3 * i + 2 - k];
    memcpy(p + off, b->px, b->n_px);
    *out = p;
    *len = size;
    return 0;
}

/*
 * RLE8 (rle4 = 0) or RLE4 of palette indexes (w x h, top row first) as
 * BMP writers emit them: rows bottom-up, each ended by end-of-line, the
 * last by end-of-bitmap. RLE8 rows use runs of 3 or more and absolute runs
 * (padded to 16 bits) between them; RLE4 rows use runs only (no odd
 * absolute counts, which Pillow 9.4 reads one pixel short). With
 * delta_row < h, that row starts with a delta of 5 pixels right (left at
 * index 0) as Pillow reads it. out holds at least 2 * w * h + 8 * h bytes;
 * returns the size.
 */
static size_t bmp_rle(const uint8_t *idx, uint32_t w, uint32_t h, int rle4, uint32_t delta_row, uint8_t *out)
{
    size_t o = 0;
    for (uint32_t r = 0; r < h; r++) {
        const uint32_t y = h - 1 - r;
        const uint8_t *row = idx + (size_t)y * w;
        uint32_t x = 0;
        if (y == delta_row) {
            /* Pillow 9.4 takes a delta's right/up from the two bytes after the two that follow the escape: this
             * row starts 5 right (by Pillow's reading; 2 right then a run of 5 by the format's). */
            static const uint8_t delta[6] = {0, 2, 2, 0, 5, 0};
            memcpy(out + o, delta, sizeof(delta));
            o += sizeof(delta);
            x = 5;
        }
        while (x < w) {
            uint32_t run = 1;
            while (x + run < w && run < 255 && row[x + run] == row[x])
                run++;
            if (rle4 || run >= 3) {
                out[o++] = (uint8_t)run;
                out[o++] = rle4 ? (uint8_t)(row[x] << 4 | row[x]) : row[x];
                x += run;
                continue;
            }
            /* An absolute run up to where a run of 3 starts; shorter than 3, the run of 1 or 2 as it is. */
            uint32_t n = 0;
            while (x + n < w && n < 255 &&
                   !(x + n + 2 < w && row[x + n] == row[x + n + 1] && row[x + n] == row[x + n + 2]))
                n++;
            if (n < 3) {
                out[o++] = (uint8_t)run;
                out[o++] = row[x];
                x += run;
                continue;
            }
            out[o++] = 0;
            out[o++] = (uint8_t)n;
            memcpy(out + o, row + x, n);
            o += n;
            if (n & 1)
                out[o++] = 0;
            x += n;
        }
        out[o++] = 0;
        out[o++] = r + 1 < h ? 0 : 1;
    }
    return o;
}

/*
 * A TIFF file written with libtiff: px holds contiguous rows of spp samples
 * of bps bits (16-bit samples native-endian); planar separate and tiles
 * (16 x 16) are laid out from it here. cmap: 3 << bps colormap entries.
 */
struct tiffw {
    uint32_t w, h, rows_per_strip;
    uint16_t spp, bps, photometric, compression, predictor, n_extra, extra, orientation;
    int planar_separate, tiled, big_endian, jpeg_quality;
    const uint16_t *cmap;
    const uint8_t *px;
};

static int tiff_file(const char *path, const struct tiffw *t)
{
    TIFF *tif = TIFFOpen(path, t->big_endian ? "wb" : "wl");
    const size_t rb = ((size_t)t->w * t->spp * t->bps + 7) / 8, bpp = (size_t)t->spp * t->bps / 8;
    uint8_t *tmp = malloc(rb * 16 + 16 * 16 * 8);
    int ok = tif && tmp;

    if (ok) {
        TIFFSetField(tif, TIFFTAG_IMAGEWIDTH, t->w);
        TIFFSetField(tif, TIFFTAG_IMAGELENGTH, t->h);
        TIFFSetField(tif, TIFFTAG_SAMPLESPERPIXEL, t->spp);
        TIFFSetField(tif, TIFFTAG_BITSPERSAMPLE, t->bps);
        TIFFSetField(tif, TIFFTAG_PHOTOMETRIC, t->photometric);
        TIFFSetField(tif, TIFFTAG_COMPRESSION, t->compression);
        TIFFSetField(tif, TIFFTAG_PLANARCONFIG, t->planar_separate ? PLANARCONFIG_SEPARATE : PLANARCONFIG_CONTIG);
        if (t->predictor)
            TIFFSetField(tif, TIFFTAG_PREDICTOR, t->predictor);
        if (t->n_extra) {
            uint16_t ex[1] = {t->extra};
            TIFFSetField(tif, TIFFTAG_EXTRASAMPLES, t->n_extra, ex);
        }
        if (t->orientation)
            TIFFSetField(tif, TIFFTAG_ORIENTATION, t->orientation);
        if (t->cmap)
            TIFFSetField(tif, TIFFTAG_COLORMAP, t->cmap, t->cmap + (1 << t->bps), t->cmap + (2 << t->bps));
        if (t->jpeg_quality) {
            TIFFSetField(tif, TIFFTAG_JPEGQUALITY, t->jpeg_quality);
            TIFFSetField(tif, TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB);
        }
        if (t->tiled) {
            TIFFSetField(tif, TIFFTAG_TILEWIDTH, 16);
            TIFFSetField(tif, TIFFTAG_TILELENGTH, 16);
        } else {
            TIFFSetField(tif, TIFFTAG_ROWSPERSTRIP, t->rows_per_strip ? t->rows_per_strip : 8);
        }
    }
    for (uint32_t y = 0; ok && t->tiled && y < t->h; y += 16) {
        for (uint32_t x = 0; ok && x < t->w; x += 16) {
            memset(tmp, 0, 16 * 16 * bpp);
            for (uint32_t r = 0; r < 16 && y + r < t->h; r++)
                memcpy(tmp + r * 16 * bpp, t->px + (y + r) * rb + x * bpp, (RT_MIN(16, t->w - x)) * bpp);
            ok = TIFFWriteTile(tif, tmp, x, y, 0, 0) >= 0;
        }
    }
    for (uint16_t s = 0; ok && !t->tiled && s < (t->planar_separate ? t->spp : 1); s++) {
        for (uint32_t y = 0; ok && y < t->h; y++) {
            const uint8_t *row = t->px + y * rb;
            if (t->planar_separate) { /* 8-bit samples only */
                for (uint32_t x = 0; x < t->w; x++)
                    tmp[x] = row[x * t->spp + s];
                row = tmp;
            } else {
                memcpy(tmp, row, rb);
                row = tmp;
            }
            ok = TIFFWriteScanline(tif, (void *)row, y, s) >= 0;
        }
    }
    if (tif)
        TIFFClose(tif);
    free(tmp);
    if (!ok)
        fprintf(stderr, "mkfolder: %s: TIFF write failed\n", path);
    return ok ? 0 : -1;
}

/* Pillow's CMYK -> RGB (Convert.c cmyk2rgb): ink, 0 = none. */
static void pillow_cmyk(const uint8_t *cmyk, uint8_t *rgb)
{
    const unsigned nk = 255u - cmyk[3];
    for (int k = 0; k < 3; k++) {
        const unsigned t = cmyk[k] * nk + 128u;
        rgb[k] = clamp8((int)nk - (int)(((t >> 8) + t) >> 8));
    }
}

/* The 216-colour cube index of an RGB pixel (PNG palette files use it too). */
static int cube(const uint8_t *p) { return (p[0] + 25) / 51 * 36 + (p[1] + 25) / 51 * 6 + (p[2] + 25) / 51; }

/*
 * The BMP and TIFF kinds: writes `path` from the pattern in rgb (w x h x 3,
 * replaced by the pixels Pillow reads back; 1 channel for gray kinds) using
 * buf (n * 8 bytes) as scratch. Returns 0 or -1.
 */
static int bmp_or_tiff(const struct spec *s, uint32_t seed, const char *path, struct mkf_file *e, uint8_t *rgb,
                       uint8_t *buf)
{
    const uint32_t w = s->w, h = s->h;
    const size_t n = (size_t)w * h;
    uint8_t pal[256 * 3], *data = NULL;
    size_t len = 0;
    int rc = -1;

    e->lossless = 1;
    e->format = "BMP";
    switch (s->kind) {
    case K_BMP_24:
    case K_BAD_BMP_TRUNC:
        if (bmp_bytes(w, h, rgb, &data, &len) < 0)
            goto out;
        if (s->kind == K_BAD_BMP_TRUNC) {
            len = len * 2 / 3;
            e->status = "truncated";
        }
        break;
    case K_BAD_BMP: {
        /* Adobe's 56-byte header (masks and alpha inside it): Pillow 9.4 refuses it, and so do we. */
        const uint32_t stride = (w * 3 + 3) & ~3u;
        memset(buf, 0x80, (size_t)stride * h);
        struct bmpw b = {.w = w, .h = h, .hsize = 56, .bits = 24, .px = buf, .n_px = (size_t)stride * h};
        e->status = "unsupported";
        if (bmp_build(&b, &data, &len) < 0)
            goto out;
        break;
    }
    case K_BMP_RLE8:
    case K_BMP_RLE4: {
        /* RLE8: the colour cube, its index 0 black where the delta skips; RLE4: 16 tinted grays. */
        const int rle4 = s->kind == K_BMP_RLE4, n_pal = rle4 ? 16 : 216;
        const uint32_t delta_row = rle4 ? h : h / 3;
        uint8_t *idx = buf + n * 6;
        for (int i = 0; i < n_pal; i++) {
            if (!rle4) {
                pal[3 * i] = (uint8_t)(i / 36 * 51);
                pal[3 * i + 1] = (uint8_t)(i / 6 % 6 * 51);
                pal[3 * i + 2] = (uint8_t)(i % 6 * 51);
            } else {
                pal[3 * i] = (uint8_t)(i * 17);
                pal[3 * i + 1] = (uint8_t)(255 - i * 13);
                pal[3 * i + 2] = (uint8_t)(i * 7 + 40);
            }
        }
        for (size_t i = 0; i < n; i++) {
            const uint8_t *p = rgb + 3 * i;
            idx[i] = (uint8_t)(rle4 ? (p[0] * 2 + p[1] * 5 + p[2]) / 8 / 16 : cube(p));
            /* Runs for the encoder to find: the pattern's noise broken up in blocks of 4. */
            if (i % w % 4)
                idx[i] = idx[i - 1];
            if (i / w == delta_row && i % w < 5)
                idx[i] = 0;
            memcpy(rgb + 3 * i, pal + 3 * idx[i], 3);
        }
        struct bmpw b = {.w = w, .h = h, .hsize = 40, .bits = rle4 ? 4 : 8, .comp = rle4 ? 2 : 1,
                         .colors = (uint32_t)n_pal, .n_pal = (uint32_t)n_pal, .pal = pal, .px = buf};
        b.n_px = bmp_rle(idx, w, h, rle4, delta_row, buf);
        if (bmp_build(&b, &data, &len) < 0)
            goto out;
        break;
    }
    case K_BMP_565:
    case K_BMP_555: {
        /* 5-6-5 (BI_BITFIELDS, masks after a 40-byte header, top-down) or 5-5-5 (BI_RGB, 124-byte header). */
        static const uint32_t m565[4] = {0xF800, 0x7E0, 0x1F, 0};
        const int six = s->kind == K_BMP_565;
        const uint32_t stride = (w * 2 + 3) & ~3u;
        memset(buf, 0, (size_t)stride * h);
        for (uint32_t y = 0; y < h; y++) {
            for (uint32_t x = 0; x < w; x++) {
                uint8_t *p = rgb + ((size_t)y * w + x) * 3;
                const uint32_t r = p[0] >> 3, g = six ? p[1] >> 2 : p[1] >> 3, b = p[2] >> 3;
                put_le16(buf + (size_t)(six ? y : h - 1 - y) * stride + 2 * x,
                         six ? r << 11 | g << 5 | b : r << 10 | g << 5 | b);
                p[0] = (uint8_t)(r * 255 / 31);
                p[1] = (uint8_t)(six ? g * 255 / 63 : g * 255 / 31);
                p[2] = (uint8_t)(b * 255 / 31);
            }
        }
        struct bmpw b = {.w = w, .h = h, .hsize = six ? 40 : 124, .bits = 16, .comp = six ? 3 : 0, .topdown = six,
                         .masks = m565, .px = buf, .n_px = (size_t)stride * h};
        if (bmp_build(&b, &data, &len) < 0)
            goto out;
        break;
    }
    case K_BMP_1:
    case K_BMP_OS2: {
        /* Palettes that are the gray ramp make Pillow's image gray: black and white ("1"), or OS/2's 256 BGR
         * triples ("L"). */
        const int one = s->kind == K_BMP_1;
        const uint32_t stride = one ? ((w + 31) / 32) * 4 : (w + 3) & ~3u;
        mkf_pattern(rgb, w, h, 1, seed);
        e->gray = 1;
        e->c = 1;
        memset(buf, 0, (size_t)stride * h);
        for (int i = 0; i < 256; i++)
            pal[3 * i] = pal[3 * i + 1] = pal[3 * i + 2] = (uint8_t)(one ? i * 255 : i);
        for (uint32_t y = 0; y < h; y++) {
            uint8_t *row = buf + (size_t)(h - 1 - y) * stride;
            for (uint32_t x = 0; x < w; x++) {
                uint8_t *v = rgb + (size_t)y * w + x;
                if (one) {
                    *v = *v >= 128 ? 255 : 0;
                    if (*v)
                        row[x / 8] |= (uint8_t)(0x80 >> (x % 8));
                } else {
                    row[x] = *v;
                }
            }
        }
        struct bmpw b = {.w = w, .h = h, .hsize = one ? 40 : 12, .bits = one ? 1 : 8, .n_pal = one ? 2 : 256,
                         .pal = pal, .px = buf, .n_px = (size_t)stride * h};
        if (bmp_build(&b, &data, &len) < 0)
            goto out;
        break;
    }
    case K_BMP_PAL4: {
        /* 4-bit, a 108-byte header, top-down, 12 colours: indexes 12..15 fall past the palette, where Pillow
         * reads its gray ramp (12, 12, 12) ... (15, 15, 15). */
        const uint32_t stride = ((w * 4 + 31) / 32) * 4;
        memset(buf, 0, (size_t)stride * h);
        for (int i = 0; i < 16; i++) {
            pal[3 * i] = (uint8_t)(i < 12 ? 40 + i * 18 : i);
            pal[3 * i + 1] = (uint8_t)(i < 12 ? 200 - i * 15 : i);
            pal[3 * i + 2] = (uint8_t)(i < 12 ? 90 + i * 5 : i);
        }
        for (uint32_t y = 0; y < h; y++) {
            for (uint32_t x = 0; x < w; x++) {
                uint8_t *p = rgb + ((size_t)y * w + x) * 3;
                const int v = (p[0] * 2 + p[1] * 5 + p[2]) / 8 / 16;
                buf[(size_t)y * stride + x / 2] |= (uint8_t)(x % 2 ? v : v << 4);
                memcpy(p, pal + 3 * v, 3);
            }
        }
        struct bmpw b = {.w = w, .h = h, .hsize = 108, .bits = 4, .colors = 12, .n_pal = 12, .pal = pal,
                         .topdown = 1, .px = buf, .n_px = (size_t)stride * h};
        if (bmp_build(&b, &data, &len) < 0)
            goto out;
        break;
    }
    case K_BMP_32: {
        /* BI_BITFIELDS with R, G, B, A in byte order, alpha 0 too: its colour must survive. */
        static const uint32_t rgba[4] = {0xFF, 0xFF00, 0xFF0000, 0xFF000000};
        for (uint32_t y = 0; y < h; y++)
            for (uint32_t x = 0; x < w; x++) {
                uint8_t *d = buf + ((size_t)(h - 1 - y) * w + x) * 4;
                memcpy(d, rgb + ((size_t)y * w + x) * 3, 3);
                d[3] = (uint8_t)((x * 37 + y * 11) % 256);
            }
        struct bmpw b = {.w = w, .h = h, .hsize = 124, .bits = 32, .comp = 3, .masks = rgba, .px = buf,
                         .n_px = n * 4};
        if (bmp_build(&b, &data, &len) < 0)
            goto out;
        break;
    }
    default:
        break;
    }
    if (data) {
        rc = write_file(path, data, len);
        goto out;
    }

    /* TIFF */
    e->format = "TIFF";
    struct tiffw t = {.w = w, .h = h, .spp = 3, .bps = 8, .photometric = PHOTOMETRIC_RGB,
                      .compression = COMPRESSION_NONE, .px = buf};
    uint16_t cmap[3 * 256];
    memcpy(buf, rgb, n * 3);
    switch (s->kind) {
    case K_TIFF_RGB:
        break;
    case K_TIFF_LZW:
    case K_BAD_TIFF_TRUNC:
        t.compression = COMPRESSION_LZW;
        t.predictor = PREDICTOR_HORIZONTAL;
        break;
    case K_TIFF_RGBA:
        /* Big-endian, deflate, unassociated alpha (0 too): dropped. */
        t.compression = COMPRESSION_ADOBE_DEFLATE;
        t.big_endian = 1;
        t.spp = 4;
        t.n_extra = 1;
        t.extra = EXTRASAMPLE_UNASSALPHA;
        for (size_t i = 0; i < n; i++) {
            memcpy(buf + 4 * i, rgb + 3 * i, 3);
            buf[4 * i + 3] = (uint8_t)(i * 7);
        }
        break;
    case K_TIFF_GRAY16: {
        /* As the 16-bit gray PNG: Pillow's "I;16" clipped to 0..255 by convert(). */
        uint16_t *g = (uint16_t *)(void *)buf;
        mkf_pattern(rgb, w, h, 1, seed);
        for (size_t i = 0; i < n; i++) {
            const uint32_t v = (i / w + i % w) % 2 ? 256u + rgb[i] * 200u : rgb[i];
            g[i] = (uint16_t)v;
            rgb[i] = v > 255 ? 255 : (uint8_t)v;
        }
        t.compression = COMPRESSION_PACKBITS;
        t.photometric = PHOTOMETRIC_MINISBLACK;
        t.spp = 1;
        t.bps = 16;
        e->gray = 1;
        e->c = 1;
        break;
    }
    case K_TIFF_PAL:
        /* The colour cube; 16-bit colormap entries with noise in the low byte (Pillow keeps the high one). */
        for (int i = 0; i < 256; i++) {
            const int v[3] = {i / 36 * 51, i / 6 % 6 * 51, i % 6 * 51};
            for (int k = 0; k < 3; k++)
                cmap[k * 256 + i] = (uint16_t)((i < 216 ? v[k] : 0) << 8 | (mix((uint32_t)(i * 3 + k)) & 255));
        }
        for (size_t i = 0; i < n; i++) {
            const int c = cube(rgb + 3 * i);
            buf[i] = (uint8_t)c;
            for (int k = 0; k < 3; k++)
                rgb[3 * i + k] = (uint8_t)(cmap[k * 256 + c] >> 8);
        }
        t.compression = COMPRESSION_LZW;
        t.photometric = PHOTOMETRIC_PALETTE;
        t.spp = 1;
        t.cmap = cmap;
        break;
    case K_TIFF_CMYK:
        for (size_t i = 0; i < n; i++) {
            const uint8_t *p = rgb + 3 * i;
            const uint8_t mx = RT_MAX(p[0], RT_MAX(p[1], p[2]));
            uint8_t *c = buf + 4 * i;
            for (int k = 0; k < 3; k++)
                c[k] = mx ? (uint8_t)(255 - (p[k] * 255 + mx / 2) / mx) : 0;
            c[3] = (uint8_t)(255 - mx);
        }
        for (size_t i = 0; i < n; i++)
            pillow_cmyk(buf + 4 * i, rgb + 3 * i);
        t.photometric = PHOTOMETRIC_SEPARATED;
        t.spp = 4;
        break;
    case K_TIFF_JPEG:
        /* YCbCr 4:2:0 in JPEG strips: lossy, but libjpeg decodes it for Pillow as for us. */
        t.compression = COMPRESSION_JPEG;
        t.photometric = PHOTOMETRIC_YCBCR;
        t.jpeg_quality = 90;
        t.rows_per_strip = 16;
        e->lossless = 0;
        break;
    case K_TIFF_TILED:
        t.compression = COMPRESSION_ADOBE_DEFLATE;
        t.tiled = 1;
        break;
    case K_TIFF_PLANAR:
        t.compression = COMPRESSION_LZW;
        t.planar_separate = 1;
        break;
    case K_TIFF_BILEVEL: {
        /* Min-is-white, PackBits: a set bit is black. */
        const size_t rb = (w + 7) / 8;
        mkf_pattern(rgb, w, h, 1, seed);
        memset(buf, 0, rb * h);
        for (size_t i = 0; i < n; i++) {
            rgb[i] = rgb[i] >= 128 ? 255 : 0;
            if (!rgb[i])
                buf[i / w * rb + i % w / 8] |= (uint8_t)(0x80 >> (i % w % 8));
        }
        t.compression = COMPRESSION_PACKBITS;
        t.photometric = PHOTOMETRIC_MINISWHITE;
        t.spp = 1;
        t.bps = 1;
        e->gray = 1;
        e->c = 1;
        break;
    }
    case K_TIFF_ORIENT6:
        t.orientation = ORIENTATION_RIGHTTOP;
        break;
    case K_TIFF_RGB16: {
        /* The low byte is noise: Pillow keeps the high byte. */
        uint16_t *v = (uint16_t *)(void *)buf;
        for (size_t i = 0; i < n * 3; i++)
            v[i] = (uint16_t)(rgb[i] << 8 | (mix((uint32_t)i + seed) & 255));
        t.bps = 16;
        break;
    }
    default:
        fprintf(stderr, "mkfolder: kind %d is no BMP or TIFF\n", (int)s->kind);
        goto out;
    }
    if (tiff_file(path, &t) < 0)
        goto out;
    rc = 0;
    if (s->kind == K_TIFF_ORIENT6) {
        /* Pillow turns a TIFF by its Orientation tag when it loads it, asked or not: the pixels and size
         * expected are the displayed ones (orientation 6: 90 degrees clockwise), with nothing left to turn. */
        for (uint32_t r = 0; r < w; r++)
            for (uint32_t c = 0; c < h; c++)
                memcpy(buf + ((size_t)r * h + c) * 3, rgb + ((size_t)(h - 1 - c) * w + r) * 3, 3);
        memcpy(rgb, buf, n * 3);
        e->w = h;
        e->h = w;
    }
    if (s->kind == K_BAD_TIFF_TRUNC) {
        struct stat st;
        e->status = "truncated";
        rc = stat(path, &st) == 0 && truncate(path, st.st_size * 3 / 5) == 0 ? 0 : -1;
    }
out:
    free(data);
    return rc;
}

/* ---- the folder ------------------------------------------------------------ */

static struct mkf_file *add(struct mkf_folder *f)
{
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 64;
        struct mkf_file *p = realloc(f->files, cap * sizeof(*p));
        if (!p)
            return NULL;
        f->files = p;
        f->cap = cap;
    }
    memset(&f->files[f->n], 0, sizeof(f->files[0]));
    return &f->files[f->n++];
}

/* Encodes one spec; fills e (px taken). Returns 0 or -1. */
static int make_one(const struct spec *s, uint32_t seed, const char *path, struct mkf_file *e)
{
    const uint32_t w = s->w, h = s->h;
    const size_t n = (size_t)w * h;
    uint8_t *rgb = NULL, *buf = NULL, *data = NULL, *buf_webp = NULL;
    size_t len = 0;
    unsigned long jlen = 0;
    int rc = -1;

    e->kind = kind_names[s->kind];
    e->status = "ok";
    e->format = "unknown";
    e->w = w;
    e->h = h;
    e->orientation = 1;
    e->c = 3;
    if (n) {
        rgb = malloc(n * 4);
        buf = malloc(n * 8);
        if (!rgb || !buf)
            goto out;
        mkf_pattern(rgb, w, h, 3, seed);
    }
    switch (s->kind) {
    case K_JPEG_420:
    case K_JPEG_444:
    case K_JPEG_PROG:
    case K_JPEG_EXIF6:
    case K_JPEG_EXTRA:
    case K_BAD_TRUNC:
        e->format = "JPEG";
        e->orientation = s->kind == K_JPEG_EXIF6 ? 6 : 1;
        if (jpeg_encode(rgb, w, h, 3, 0, s->kind == K_JPEG_PROG, 90, s->kind == K_JPEG_444, e->orientation,
                        &data, &jlen) < 0)
            goto out;
        len = jlen;
        if (s->kind == K_JPEG_EXTRA) {
            if (jpeg_junk_before_sos(&data, &len) < 0)
                goto out;
            e->warning = "Corrupt JPEG data: 3 extraneous bytes before marker 0xda";
        }
        if (s->kind == K_BAD_TRUNC) {
            len = len * 11 / 20; /* in the middle of the scan */
            e->status = "truncated";
        }
        break;
    case K_JPEG_GRAY:
        e->format = "JPEG";
        e->gray = 1;
        e->c = 1;
        mkf_pattern(rgb, w, h, 1, seed);
        if (jpeg_encode(rgb, w, h, 1, 0, 0, 90, 0, 1, &data, &jlen) < 0)
            goto out;
        len = jlen;
        break;
    case K_JPEG_CMYK:
    case K_JPEG_YCCK:
        /* Adobe (Photoshop) CMYK stores 255 - ink. Written so that Pillow's CMYK->RGB gives back rgb:
         * inverted K = max(r,g,b), inverted C = r * 255 / max. */
        e->format = "JPEG";
        for (size_t i = 0; i < n; i++) {
            const uint8_t *p = rgb + 3 * i;
            uint8_t mx = RT_MAX(p[0], RT_MAX(p[1], p[2]));
            for (int k = 0; k < 3; k++)
                buf[4 * i + k] = mx ? (uint8_t)((p[k] * 255 + mx / 2) / mx) : 0;
            buf[4 * i + 3] = mx;
        }
        if (jpeg_encode(buf, w, h, 4, s->kind == K_JPEG_YCCK, 0, 95, 0, 1, &data, &jlen) < 0)
            goto out;
        len = jlen;
        break;
    case K_PNG_RGB:
    case K_PNG_ADAM7:
    case K_PNG_EXIF6_LATE: {
        /* The late eXIf: after IDAT, where Pillow reads it when the pixels are loaded. */
        uint8_t exif[64];
        const size_t n_exif = exif_app1(exif, 6);
        struct mkf_png p = {.w = w, .h = h, .color_type = PNG_COLOR_TYPE_RGB, .depth = 8, .rows = rgb,
                            .interlace = s->kind == K_PNG_ADAM7 ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE};
        if (s->kind == K_PNG_EXIF6_LATE) {
            p.exif = exif + 6;
            p.n_exif = (uint32_t)(n_exif - 6);
            p.exif_late = 1;
            e->orientation = 6;
        }
        e->format = "PNG";
        e->lossless = 1;
        if (mkf_png_encode(&p, &data, &len) < 0)
            goto out;
        break;
    }
    case K_PNG_PAL8:
    case K_PNG_PAL4: {
        /* 8-bit: a 6x6x6 cube and tRNS on the first entries (dropped, as Pillow drops it); 4-bit: 16 grays
         * tinted, packed two to a byte. */
        const int n_pal = s->kind == K_PNG_PAL8 ? 216 : 16;
        uint8_t pal[216 * 3], trns[16];
        for (int i = 0; i < n_pal; i++) {
            if (n_pal == 216) {
                pal[3 * i] = (uint8_t)(i / 36 * 51);
                pal[3 * i + 1] = (uint8_t)(i / 6 % 6 * 51);
                pal[3 * i + 2] = (uint8_t)(i % 6 * 51);
            } else {
                pal[3 * i] = (uint8_t)(i * 17);
                pal[3 * i + 1] = (uint8_t)(255 - i * 13);
                pal[3 * i + 2] = (uint8_t)(i * 7 + 40);
            }
        }
        for (int i = 0; i < 16; i++)
            trns[i] = (uint8_t)(i * 16);
        const size_t rowbytes = n_pal == 216 ? w : (w + 1) / 2;
        memset(buf, 0, rowbytes * h);
        for (size_t i = 0; i < n; i++) {
            const uint8_t *p = rgb + 3 * i;
            int idx = n_pal == 216 ? (p[0] + 25) / 51 * 36 + (p[1] + 25) / 51 * 6 + (p[2] + 25) / 51
                                   : (p[0] * 2 + p[1] * 5 + p[2]) / 8 / 16;
            const size_t y = i / w, x = i % w;
            if (n_pal == 216)
                buf[y * rowbytes + x] = (uint8_t)idx;
            else
                buf[y * rowbytes + x / 2] |= (uint8_t)(x % 2 ? idx : idx << 4);
            memcpy(rgb + 3 * i, pal + 3 * idx, 3);
        }
        struct mkf_png p = {.w = w, .h = h, .color_type = PNG_COLOR_TYPE_PALETTE, .depth = n_pal == 216 ? 8 : 4,
                            .rows = buf, .palette = pal, .n_palette = n_pal,
                            .trns = n_pal == 216 ? trns : NULL, .n_trns = 16};
        e->format = "PNG";
        e->lossless = 1;
        if (mkf_png_encode(&p, &data, &len) < 0)
            goto out;
        break;
    }
    case K_PNG_RGB16:
        /* The low byte is noise: Pillow keeps the high byte, and so must we. */
        for (size_t i = 0; i < n * 3; i++) {
            buf[2 * i] = rgb[i];
            buf[2 * i + 1] = (uint8_t)mix((uint32_t)i + seed);
        }
        {
            struct mkf_png p = {.w = w, .h = h, .color_type = PNG_COLOR_TYPE_RGB, .depth = 16, .rows = buf};
            e->format = "PNG";
            e->lossless = 1;
            if (mkf_png_encode(&p, &data, &len) < 0)
                goto out;
        }
        break;
    case K_PNG_GRAYA:
    case K_PNG_GRAY1: {
        mkf_pattern(rgb, w, h, 1, seed);
        e->format = "PNG";
        e->gray = 1;
        e->c = 1;
        e->lossless = 1;
        struct mkf_png p = {.w = w, .h = h, .color_type = PNG_COLOR_TYPE_GRAY_ALPHA, .depth = 8, .rows = buf};
        if (s->kind == K_PNG_GRAYA) {
            for (size_t i = 0; i < n; i++) {
                buf[2 * i] = rgb[i];
                buf[2 * i + 1] = (uint8_t)(i * 7);
            }
        } else {
            const size_t rowbytes = (w + 7) / 8;
            memset(buf, 0, rowbytes * h);
            for (size_t i = 0; i < n; i++) {
                const size_t y = i / w, x = i % w;
                rgb[i] = rgb[i] >= 128 ? 255 : 0;
                if (rgb[i])
                    buf[y * rowbytes + x / 8] |= (uint8_t)(0x80 >> (x % 8));
            }
            p.color_type = PNG_COLOR_TYPE_GRAY;
            p.depth = 1;
        }
        if (mkf_png_encode(&p, &data, &len) < 0)
            goto out;
        break;
    }
    case K_PNG_GRAY16:
        /* Pillow opens it as mode "I" and clips to 0..255 when converting: half the samples above 255 (read
         * as 255), half below (read as they are), never the high byte. */
        mkf_pattern(rgb, w, h, 1, seed);
        for (size_t i = 0; i < n; i++) {
            const uint32_t v = (i / w + i % w) % 2 ? 256u + rgb[i] * 200u : rgb[i];
            buf[2 * i] = (uint8_t)(v >> 8);
            buf[2 * i + 1] = (uint8_t)v;
            rgb[i] = v > 255 ? 255 : (uint8_t)v;
        }
        {
            struct mkf_png p = {.w = w, .h = h, .color_type = PNG_COLOR_TYPE_GRAY, .depth = 16, .rows = buf};
            e->format = "PNG";
            e->gray = 1;
            e->c = 1;
            e->lossless = 1;
            if (mkf_png_encode(&p, &data, &len) < 0)
                goto out;
        }
        break;
    case K_PNG_RGBA: {
        for (size_t i = 0; i < n; i++) {
            memcpy(buf + 4 * i, rgb + 3 * i, 3);
            buf[4 * i + 3] = (uint8_t)(i % 251); /* fully transparent pixels too: their colour must survive */
        }
        struct mkf_png p = {.w = w, .h = h, .color_type = PNG_COLOR_TYPE_RGB_ALPHA, .depth = 8, .rows = buf};
        e->format = "PNG";
        e->lossless = 1;
        if (mkf_png_encode(&p, &data, &len) < 0)
            goto out;
        break;
    }
    case K_WEBP_LOSSY:
        e->format = "WebP";
        len = WebPEncodeRGB(rgb, (int)w, (int)h, (int)w * 3, 85, &data);
        if (!len)
            goto out;
        break;
    case K_WEBP_LOSSLESS:
        /* Alpha never 0: the lossless encoder may rewrite the colour of fully transparent pixels. */
        for (size_t i = 0; i < n; i++) {
            memcpy(buf + 4 * i, rgb + 3 * i, 3);
            buf[4 * i + 3] = (uint8_t)(1 + i % 255);
        }
        e->format = "WebP";
        e->lossless = 1;
        len = WebPEncodeLosslessRGBA(buf, (int)w, (int)h, (int)w * 4, &data);
        if (!len)
            goto out;
        break;
    case K_WEBP_EXIF6: {
        /* Lossless, the TIFF structure bare as the WebP container spec has it, orientation 6. */
        uint8_t exif[64], *simple = NULL;
        const size_t n_exif = exif_app1(exif, 6);
        const size_t n_simple = WebPEncodeLosslessRGB(rgb, (int)w, (int)h, (int)w * 3, &simple);
        e->format = "WebP";
        e->lossless = 1;
        e->orientation = 6;
        rc = n_simple ? mkf_webp_exif(simple, n_simple, w, h, exif + 6, n_exif - 6, 1, &buf_webp, &len) : -1;
        WebPFree(simple);
        if (rc < 0)
            goto out;
        rc = write_file(path, buf_webp, len);
        goto out;
    }
    case K_PPM:
    case K_PGM: {
        const int c = s->kind == K_PPM ? 3 : 1;
        if (c == 1)
            mkf_pattern(rgb, w, h, 1, seed);
        int hl = snprintf((char *)buf, 64, "P%d\n# made by rt_mkfolder\n%u %u\n255\n", c == 3 ? 6 : 5, w, h);
        memcpy(buf + hl, rgb, n * c);
        e->format = "PPM/PGM";
        e->gray = c == 1;
        e->c = (uint32_t)c;
        e->lossless = 1;
        rc = write_file(path, buf, (size_t)hl + n * c);
        goto out;
    }
    case K_BAD_BMP:
    case K_BMP_24: case K_BMP_RLE8: case K_BMP_RLE4: case K_BMP_565: case K_BMP_555: case K_BMP_1:
    case K_BMP_PAL4: case K_BMP_32: case K_BMP_OS2: case K_TIFF_RGB: case K_TIFF_LZW: case K_TIFF_RGBA:
    case K_TIFF_GRAY16: case K_TIFF_PAL: case K_TIFF_CMYK: case K_TIFF_JPEG: case K_TIFF_TILED:
    case K_TIFF_PLANAR: case K_TIFF_BILEVEL: case K_TIFF_ORIENT6: case K_TIFF_RGB16: case K_BAD_BMP_TRUNC:
    case K_BAD_TIFF_TRUNC:
        rc = bmp_or_tiff(s, seed, path, e, rgb, buf);
        goto out;
    case K_BAD_TEXT:
    case K_IGNORED: {
        static const char text[] = "These are my notes about the photos.\n";
        e->status = s->kind == K_IGNORED ? "ignored" : "not an image";
        e->w = e->h = 0;
        rc = write_file(path, text, sizeof(text) - 1);
        goto out;
    }
    case K_BAD_EMPTY:
        e->format = "unknown";
        e->status = "zero-sized";
        rc = write_file(path, "", 0);
        goto out;
    }
    rc = write_file(path, data, len);
out:
    if (s->kind == K_WEBP_LOSSY || s->kind == K_WEBP_LOSSLESS)
        WebPFree(data);
    else
        free(data);
    free(buf);
    free(buf_webp);
    if (rc == 0 && strcmp(e->status, "ok") == 0 && rgb) {
        e->px = rgb;
        rgb = NULL;
    }
    free(rgb);
    return rc;
}

static int write_json(const char *dir, const struct mkf_folder *f)
{
    char *copy = strdup(dir), path[4096];
    size_t dl = strlen(copy);
    while (dl > 1 && copy[dl - 1] == '/')
        copy[--dl] = 0;
    char *base = basename(copy), *parent_copy = strdup(copy);
    const char *parent = dirname(parent_copy);
    snprintf(path, sizeof(path), "%s/%s.expected.json", parent, base);
    FILE *out = fopen(path, "w");
    if (!out) {
        fprintf(stderr, "mkfolder: %s: %s\n", path, strerror(errno));
        free(copy);
        free(parent_copy);
        return -1;
    }
    fprintf(out, "{\n  \"root\": \"%s\",\n  \"classes\": [\"cats\", \"dogs\", \"empty\"],\n", base);
    fprintf(out, "  \"counts\": {\"ok\": %zu, \"bad\": %zu, \"ignored\": %zu},\n  \"files\": [\n", f->ok, f->bad,
            f->ignored);
    for (size_t i = 0; i < f->n; i++) {
        const struct mkf_file *e = &f->files[i];
        fprintf(out,
                "    {\"path\": \"%s\", \"class\": \"%s\", \"status\": \"%s\", \"format\": \"%s\", \"kind\": \"%s\", "
                "\"width\": %u, \"height\": %u, \"gray\": %s, \"lossless\": %s, \"orientation\": %d, "
                "\"warning\": \"%s\"}%s\n",
                e->path, e->klass, e->status, e->format, e->kind, e->w, e->h, e->gray ? "true" : "false",
                e->lossless ? "true" : "false", e->orientation, e->warning ? e->warning : "", i + 1 < f->n ? "," : "");
    }
    fprintf(out, "  ]\n}\n");
    int rc = fclose(out) == 0 ? 0 : -1;
    free(copy);
    free(parent_copy);
    return rc;
}

int mkf_write(const char *dir, int count, int tiny, struct mkf_folder *out)
{
    struct mkf_folder f = {0};
    const struct spec *table = tiny ? seeds : folder;
    const size_t n = tiny ? RT_ARRAY_LEN(seeds) : RT_ARRAY_LEN(folder);
    static const char *const classes[] = {"cats", "dogs", "empty"};
    char path[4096];

    if (rt_mkdirs(dir, 0755) < 0)
        goto fail;
    for (size_t i = 0; !tiny && i < RT_ARRAY_LEN(classes); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, classes[i]);
        if (rt_mkdirs(path, 0755) < 0)
            goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        struct mkf_file *e = add(&f);
        if (!e)
            goto fail;
        snprintf(e->path, sizeof(e->path), "%s%s%s", table[i].klass, tiny ? "" : "/", table[i].name);
        snprintf(e->klass, sizeof(e->klass), "%s", table[i].klass);
        snprintf(path, sizeof(path), "%s/%s", dir, e->path);
        if (make_one(&table[i], (uint32_t)i + 1, path, e) < 0)
            goto fail;
        if (strcmp(e->status, "ok") == 0)
            f.ok++;
        else if (strcmp(e->status, "ignored") == 0)
            f.ignored++;
        else
            f.bad++;
    }
    for (int k = 0; !tiny && k < 2; k++) {
        for (int i = 0; i < count; i++) {
            /* Mixed sizes, mostly landscape like photos: 64..447 by 48..335. */
            uint32_t r = mix((uint32_t)(k * 100003 + i));
            struct spec s = {i % 5 == 4 ? K_JPEG_PROG : K_JPEG_420, classes[k], NULL, 64 + r % 384,
                             48 + (r >> 12) % 288};
            struct mkf_file *e = add(&f);
            if (!e)
                goto fail;
            snprintf(e->path, sizeof(e->path), "%s/gen_%05d.jpg", classes[k], i);
            snprintf(e->klass, sizeof(e->klass), "%s", classes[k]);
            snprintf(path, sizeof(path), "%s/%s", dir, e->path);
            if (make_one(&s, 1000 + r % 100000, path, e) < 0)
                goto fail;
            free(e->px);
            e->px = NULL;
            f.ok++;
        }
    }
    if (!tiny && write_json(dir, &f) < 0)
        goto fail;
    if (out)
        *out = f;
    else
        mkf_free(&f);
    return 0;
fail:
    if (rt_errmsg()[0])
        fprintf(stderr, "mkfolder: %s\n", rt_errmsg());
    mkf_free(&f);
    return -1;
}

void mkf_free(struct mkf_folder *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++)
        free(f->files[i].px);
    free(f->files);
    memset(f, 0, sizeof(*f));
}

#ifndef RT_MKFOLDER_NO_MAIN
int main(int argc, char **argv)
{
    const char *dir = NULL;
    int count = 0, tiny = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--count") == 0 && i + 1 < argc)
            count = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seeds") == 0)
            tiny = 1;
        else if (argv[i][0] != '-' && !dir)
            dir = argv[i];
        else
            dir = NULL, i = argc;
    }
    if (!dir || count < 0) {
        fprintf(stderr, "usage: rt_mkfolder DIR [--count N] [--seeds]\n"
                        "  writes an image folder with every JPEG/PNG/WebP/PPM/BMP/TIFF variant, bad and ignored\n"
                        "  files, and DIR/../<basename>.expected.json; --count N adds N JPEGs per class;\n"
                        "  --seeds writes tiny seed files (fuzz corpus) into DIR instead.\n");
        return 2;
    }
    struct mkf_folder f;
    if (mkf_write(dir, count, tiny, &f) < 0)
        return 1;
    printf("%s: %zu files: %zu ok, %zu bad, %zu ignored%s\n", dir, f.n, f.ok, f.bad, f.ignored,
           tiny ? "" : "; classes cats, dogs, empty");
    mkf_free(&f);
    return 0;
}
#endif
