/*
 * mkfolder.h - writes a deterministic image folder "as people have them"
 * (tests/mkfolder.c): every JPEG/PNG/WebP/PPM/BMP/TIFF variant loader/imgfile.c must
 * read, bad files it must name, and files a folder reader must ignore, with
 * the table of what each file is. Used by the rt_mkfolder program and linked
 * into test_imgfile. Test code: errors print and return -1.
 */
#ifndef RT_TESTS_MKFOLDER_H
#define RT_TESTS_MKFOLDER_H

#include <stddef.h>
#include <stdint.h>

struct mkf_file {
    char path[128];     /* relative to the folder: "<class>/<name>" */
    char klass[16];
    const char *status; /* "ok", "ignored", or rt_img_bad_name()'s word */
    const char *format; /* rt_img_format_name()'s word; "unknown" for non-images */
    const char *kind;   /* what the file exercises: "jpeg-cmyk", "png-16", "bmp-rle8", "tiff-jpeg", ... */
    uint32_t w, h;      /* stored size (before EXIF rotation; a TIFF's after its Orientation tag); 0: no image */
    int gray;           /* stored with one colour channel */
    int lossless;       /* decodes to exactly px */
    int orientation;    /* EXIF orientation written; 1 when none */
    const char *warning; /* libjpeg's warning for a damaged JPEG that still decodes; NULL when none */
    uint32_t c;         /* channels of px (1 or 3) */
    uint8_t *px;        /* the pixels encoded, HWC (CMYK files: the RGB they encode); NULL when none */
};

struct mkf_folder {
    struct mkf_file *files;
    size_t n, cap;
    size_t ok, bad, ignored;
};

/*
 * Writes the folder into `dir` (created; classes cats, dogs and the empty
 * class empty) and `dir`/../<basename(dir)>.expected.json; with count > 0
 * also `count` ordinary JPEGs of mixed sizes per class (not kept in *out's
 * px). With tiny, writes instead small (24x16) seed files straight into dir,
 * one per decodable kind plus a truncated JPEG (fuzz seeds). *out may be
 * NULL; else the caller frees it with mkf_free. Returns 0 or -1 (printed).
 */
int mkf_write(const char *dir, int count, int tiny, struct mkf_folder *out);
void mkf_free(struct mkf_folder *f);

/* One PNG in memory, as libpng writes it. rows: h rows of libpng's packed
 * row bytes; palette: n_palette RGB triples; trns/exif optional (NULL);
 * exif (the bare TIFF structure) before IDAT, or after it with exif_late.
 * *out is malloc'd. Returns 0 or -1. */
struct mkf_png {
    uint32_t w, h;
    int color_type, depth, interlace;
    const uint8_t *rows;
    const uint8_t *palette;
    int n_palette;
    const uint8_t *trns;
    int n_trns;
    const uint8_t *exif;
    uint32_t n_exif;
    int exif_late; /* the eXIf chunk after the pixel data (IDAT), not before */
};
int mkf_png_encode(const struct mkf_png *spec, uint8_t **out, size_t *len);

/*
 * The simple-format WebP `webp` (len bytes, w x h) rewritten as an extended
 * one: a VP8X chunk (its EXIF flag set when `flag`), the image chunk, then
 * an EXIF chunk holding `exif` (n bytes). *out is malloc'd. Returns 0 or -1.
 */
int mkf_webp_exif(const uint8_t *webp, size_t len, uint32_t w, uint32_t h, const uint8_t *exif, size_t n, int flag,
                  uint8_t **out, size_t *out_len);

/* Deterministic structured test content: gradients, a disc, a bar and mild noise; c = 1 or 3. */
void mkf_pattern(uint8_t *px, uint32_t w, uint32_t h, uint32_t c, uint32_t seed);

#endif
