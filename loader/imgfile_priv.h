/*
 * imgfile_priv.h (private to loader/imgfile*.c) - what imgfile.c shares
 * with the decoders kept in their own files (imgfile_bmp.c, imgfile_tiff.c):
 * the error helper, the header size checks, the decoder's two pixel buffers
 * and the conversions every format ends in. Not for other modules.
 */
#ifndef RT_LOADER_IMGFILE_PRIV_H
#define RT_LOADER_IMGFILE_PRIV_H

#include <stddef.h>
#include <stdint.h>

#include "loader/format.h" /* rt_le16, rt_le32 */
#include "loader/imgfile.h"

/* Sets *why = reason and the message (printf-style); returns -EBADMSG. */
int rt_img_bad(enum rt_img_bad *why, enum rt_img_bad reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* 0, or -EBADMSG (corrupt for a zero side, too large past the limits) naming `name` and format `fmt`. */
int rt_img_check_size(const char *name, const char *fmt, uint64_t w, uint64_t h, enum rt_img_bad *why);
/* Grows the decoder's buffer `which` (0: the result, 1: scratch) to n bytes; 0 or -ENOMEM. */
int rt_imgdec_reserve(struct rt_imgdec *d, int which, size_t n);
/* The decoder's buffer `which` (valid after rt_imgdec_reserve). */
uint8_t *rt_imgdec_buf(struct rt_imgdec *d, int which);
/* n RGB pixels to Pillow's convert("L") luma. */
void rt_img_rgb_to_gray(const uint8_t *rgb, uint8_t *gray, size_t n);
/*
 * n CMYK pixels to RGB with Pillow's formula: `ink` 1 when 0 means no ink
 * (TIFF), 0 when the samples are Adobe-inverted (libjpeg's CMYK JPEGs).
 */
void rt_img_cmyk_to_rgb(const uint8_t *cmyk, uint8_t *rgb, size_t n, int ink);

/* Sample i of a row of 1-, 2-, 4- or 8-bit samples, the first in the high bits (BMP and TIFF rows). */
static inline uint32_t rt_img_packed(const uint8_t *row, size_t i, int bits)
{
    switch (bits) {
    case 1: return row[i >> 3] >> (7 - (i & 7)) & 1;
    case 2: return row[i >> 2] >> (6 - 2 * (i & 3)) & 3;
    case 4: return row[i >> 1] >> (i & 1 ? 0 : 4) & 15;
    default: return row[i];
    }
}

/*
 * The BMP and TIFF readers. With d == NULL only the header is read and
 * `info` filled (width, height, gray, orientation); else the image is
 * decoded to `channels` (1 or 3) into d's buffer 0, *w x *h as stored,
 * and *orientation set to TIFF's Orientation tag (1..8), which the caller
 * applies always (Pillow does on load); the TIFF probe reports the turned
 * size and orientation 1. Return 0, -EBADMSG with *why and a message, or
 * -ENOMEM with *why = RT_IMG_OK.
 */
int rt_img_bmp(struct rt_imgdec *d, const uint8_t *buf, size_t len, const char *name, uint32_t channels,
               struct rt_img_info *info, uint32_t *w, uint32_t *h, enum rt_img_bad *why);
int rt_img_tiff(struct rt_imgdec *d, const uint8_t *buf, size_t len, const char *name, uint32_t channels,
                struct rt_img_info *info, int *orientation, uint32_t *w, uint32_t *h, enum rt_img_bad *why);

#endif
