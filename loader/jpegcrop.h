/*
 * jpegcrop.h (private to loader/) - decodes only the part of a JPEG that a
 * load-time crop needs: at the smallest IDCT scale (1/1, 1/2, 1/4, 1/8 --
 * which of them, measured, in jpegcrop.c) that still leaves the box at
 * least as large as the output, and only the box's rows and (iMCU-aligned)
 * columns, through libjpeg-turbo's jpeg_crop_scanline / jpeg_skip_scanlines.
 * The caller resizes the returned region (resize.h).
 */
#ifndef RT_LOADER_JPEGCROP_H
#define RT_LOADER_JPEGCROP_H

#include <stddef.h>
#include <stdint.h>

#include "loader/box.h"

struct rt_jpegcrop;

int rt_jpegcrop_create(struct rt_jpegcrop **out);
/* Frees the decoder; NULL is fine. */
void rt_jpegcrop_destroy(struct rt_jpegcrop *d);

/* What was decoded: HWC pixels of the region, and the box in its coordinates. */
struct rt_jpeg_region {
    const uint8_t *px;       /* the decoder's buffer, valid until its next call */
    uint32_t w, h;           /* region size in pixels */
    size_t stride;           /* bytes between rows */
    struct rt_box box;       /* the requested box, in region pixels (scaled, shifted) */
    uint32_t scale_denom;    /* 1, 2, 4 or 8 */
};

/*
 * Decodes the part of `jpeg` (len bytes; a baseline or progressive RGB/YCbCr
 * or grayscale JPEG) covering `box` (in full-size pixel coordinates, inside
 * the image) for an output of out_w x out_h, as `channels` (3: RGB, gray
 * expanded; 1: luma) interleaved channels. Data that ends early is an error;
 * other damage libjpeg decodes through with a warning is not (pack accepts
 * such files, as Pillow does, and lists them in the manifest). Returns 0 or -EBADMSG with a message naming
 * `name`; CMYK/YCCK JPEGs are refused (-EBADMSG, "unsupported colour space").
 * A box reaching past the image is clamped to it (reg->box is the clamped
 * box); one wholly outside, a box without area, channels other than 1 or 3
 * or a zero output give -EINVAL; a region over 1 GiB -EFBIG; out of memory
 * -ENOMEM. At 1/1 the box's pixels equal tjDecompress2()'s (flags 0).
 * Rows below the box are not read, so damage there goes unnoticed in a
 * baseline file: validate files once with a full decode (pack does).
 * Not thread-safe: one decoder per thread.
 */
int rt_jpegcrop_decode(struct rt_jpegcrop *d, const uint8_t *jpeg, size_t len, const char *name,
                       uint32_t channels, const struct rt_box *box, uint32_t out_w, uint32_t out_h,
                       struct rt_jpeg_region *reg);

#endif
