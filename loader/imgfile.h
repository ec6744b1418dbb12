/*
 * imgfile.h (private to loader/) - reads the image files people keep in
 * folders: JPEG (baseline, progressive, grayscale, CMYK/YCCK), PNG (8/16-bit,
 * palette, gray, alpha), WebP, binary PPM/PGM, BMP (1/4/8-bit palette, RLE8,
 * RLE4, 16/24/32-bit, OS/2 and Windows headers) and TIFF (first page: gray,
 * bilevel, 16-bit gray, RGB(A) 8/16-bit, palette, CMYK, JPEG-in-TIFF; strips
 * or tiles; any compression libtiff decodes), decoded to interleaved uint8
 * pixels (HWC) the way torchvision's default loader sees them (Pillow 9.4's
 * Image.open(f).convert("RGB")): alpha dropped, not composited; no EXIF
 * rotation unless asked, except a TIFF's Orientation tag, which Pillow
 * applies whenever it loads one. A file is usable exactly when Pillow opens
 * and converts it; one that cannot be used gets a reason (enum rt_img_bad)
 * and a message naming it, never a crash.
 *
 * It does not resize (resize.h) or crop at load time (jpegcrop.h), and it
 * reads from memory only: callers read the file.
 */
#ifndef RT_LOADER_IMGFILE_H
#define RT_LOADER_IMGFILE_H

#include <stddef.h>
#include <stdint.h>

enum rt_img_format {
    RT_IMG_UNKNOWN = 0,
    RT_IMG_JPEG,
    RT_IMG_PNG,
    RT_IMG_WEBP,
    RT_IMG_PNM,
    RT_IMG_BMP,    /* Pillow's variants; 52/56-byte headers and bit fields it refuses are RT_IMG_UNSUPPORTED */
    RT_IMG_TIFF,   /* classic and BigTIFF, first page; layouts Pillow refuses are RT_IMG_UNSUPPORTED */
    RT_IMG_GIF,    /* recognised, not decoded (RT_IMG_UNSUPPORTED): ImageFolder does not list .gif */
};

/* Why a file is unusable; RT_IMG_OK when it is fine. Stable order: pack counts by it. */
enum rt_img_bad {
    RT_IMG_OK = 0,
    RT_IMG_EMPTY,        /* zero bytes */
    RT_IMG_NOT_IMAGE,    /* no known image signature */
    RT_IMG_TRUNCATED,    /* ends before the image does */
    RT_IMG_CORRUPT,      /* decoder error other than truncation */
    RT_IMG_UNSUPPORTED,  /* known format or colour space this build does not decode */
    RT_IMG_TOO_LARGE,    /* side > 65535 or more than RT_IMG_MAX_PIXELS pixels */
    RT_IMG_BAD_COUNT
};

#define RT_IMG_MAX_PIXELS ((uint64_t)1 << 28)

/* "zero-sized", "not an image", "truncated", "corrupt", "unsupported", "too large"; "ok" for RT_IMG_OK. */
const char *rt_img_bad_name(enum rt_img_bad why);
/* "JPEG", "PNG", "WebP", "PPM/PGM", "BMP", "TIFF", "GIF", "unknown". */
const char *rt_img_format_name(enum rt_img_format f);

/*
 * 1 when `name`'s extension (case-insensitive) is one torchvision's
 * ImageFolder lists: .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp;
 * else 0. Hidden files are the caller's business.
 */
int rt_img_name_listed(const char *name);

struct rt_img_info {
    enum rt_img_format format;
    uint32_t width, height;  /* as stored, before any EXIF rotation (TIFF: after its Orientation tag) */
    int gray;                /* one colour channel (with or without alpha; a BMP whose palette is the gray ramp) */
    int cmyk;                /* JPEG stored as CMYK or YCCK, TIFF as CMYK */
    int progressive;         /* progressive JPEG or interlaced PNG */
    int orientation;         /* EXIF orientation 1..8 (JPEG APP1, PNG eXIf, WebP EXIF); 1 when absent, BMP, TIFF */
};

/*
 * Reads the header of the file in `buf` (len bytes) without decoding pixels:
 * format, stored size, colour, orientation. Returns 0, or -EBADMSG with
 * *why set and a message naming `name` (zero-sized, not an image, too
 * large, unsupported format, or a header that is itself cut short).
 */
int rt_img_probe(const uint8_t *buf, size_t len, const char *name, struct rt_img_info *info,
                 enum rt_img_bad *why);

/* Per-thread decoding state and pixel buffer. */
struct rt_imgdec;

int rt_imgdec_create(struct rt_imgdec **out);
/* Frees the decoder; NULL is fine. */
void rt_imgdec_destroy(struct rt_imgdec *d);

/*
 * Decodes the whole image in `buf` to `channels` (3: RGB, gray replicated;
 * 1: luma, ITU-R 601 weights as Pillow's convert("L")) interleaved uint8
 * channels. With exif_rotate the EXIF orientation is applied (the result's
 * width and height are then the displayed ones). *px points into the
 * decoder's buffer, valid until its next call; rows are *w * channels bytes
 * apart. A JPEG that ends early is an error (truncated), as in Pillow; one
 * whose other damage libjpeg decodes through with a warning (say "Corrupt
 * JPEG data: 3 extraneous bytes before marker 0xda") decodes, as in Pillow,
 * and rt_imgdec_warning() names it. A PNG cut after its last pixel row
 * (missing IEND) decodes, as in Pillow, and so does an RLE BMP cut after
 * its last row; any other BMP or TIFF that ends early is truncated. A TIFF
 * is turned by its Orientation tag with or without exif_rotate (Pillow's
 * load does it; the probe reports the turned size).
 * 16-bit samples keep their high byte (Pillow's truncation), but 16-bit
 * gray (PNG, TIFF) is clipped to 0..255 (Pillow's mode "I"/"I;16"
 * converted); CMYK/YCCK JPEGs are read as Adobe-inverted, TIFF CMYK as
 * stored, and both converted with Pillow's formula; 5-bit BMP fields
 * become v * 255 / 31 (6-bit: / 63), truncated, as Pillow's unpackers.
 * Returns 0, or -EBADMSG with *why set and a message naming `name` and
 * what is wrong; -ENOMEM, or -EINVAL for channels other than 1 or 3, with
 * *why = RT_IMG_OK (the file is not to blame). Not thread-safe: one decoder
 * per thread.
 */
int rt_img_decode(struct rt_imgdec *d, const uint8_t *buf, size_t len, const char *name, uint32_t channels,
                  int exif_rotate, const uint8_t **px, uint32_t *w, uint32_t *h, enum rt_img_bad *why);

/* A window of an image's pixels: columns x .. x+w-1, rows y .. y+h-1. */
struct rt_img_window {
    uint32_t x, y, w, h;
};

/*
 * As rt_img_decode, with two savings for a JPEG:
 * - decoded at 1/denom of its size (denom 1, 2, 4 or 8) by libjpeg's scaled
 *   IDCT, as Pillow's Image.draft does: the image is then ceil(width /
 *   denom) x ceil(height / denom) (turned by the EXIF orientation when
 *   asked), each pixel standing for a denom x denom block of the full size;
 * - with `want` (coordinates of that image; NULL for all of it), only the
 *   pixels of that window are made: its columns widened to whole iMCU
 *   columns by libjpeg, its rows exactly. *got (may be NULL) says which
 *   window *px holds (*w x *h pixels); the pixels are those of the whole
 *   decode except near the window's own edges inside the image, where
 *   libjpeg's upsampling of subsampled colour may differ by a few units
 *   (keep 16 pixels of margin around what you use). A JPEG the EXIF
 *   orientation turns (when asked) is decoded whole.
 * Every coefficient of the file is still read (rows outside the window are
 * entropy-decoded and dropped), so a file is found truncated, damaged or
 * decoded through a warning exactly as by rt_img_decode. Other formats
 * ignore denom and want and decode whole (*got the whole image). -EINVAL
 * for another denom.
 */
int rt_img_decode_part(struct rt_imgdec *d, const uint8_t *buf, size_t len, const char *name, uint32_t channels,
                       int exif_rotate, uint32_t denom, const struct rt_img_window *want, struct rt_img_window *got,
                       const uint8_t **px, uint32_t *w, uint32_t *h, enum rt_img_bad *why);

/*
 * The first libjpeg warning the last rt_img_decode() call decoded through,
 * as libjpeg words it ("Corrupt JPEG data: ..."); "" when there was none or
 * the file is no JPEG. Points into the decoder, valid until its next call.
 */
const char *rt_imgdec_warning(const struct rt_imgdec *d);

#endif
