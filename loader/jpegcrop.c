/*
 * jpegcrop.c - decodes the part of a JPEG that a load-time crop needs, with
 * the libjpeg API of libjpeg-turbo: the IDCT scale 1/k (k = 1, 2, 4, 8) that
 * leaves the box at least as large as the output, only the box's columns
 * (jpeg_crop_scanline, widened to iMCU boundaries by the library) and only
 * the rows down to the box's last one (jpeg_skip_scanlines, then
 * jpeg_abort_decompress instead of decoding the rest). It does not resize,
 * flip or convert to CHW (resize.h does), and it does not decode CMYK/YCCK.
 *
 * Why these scales: bench/jpeg_scales.c, CPU ms per image (median; "AMD
 * EPYC" Zen 4, libjpeg-turbo 2.1.5, synthetic q90 4:2:0 images; crop = a
 * 60% x 60% box, decoded partially):
 *              1/1   1/2   1/4   1/8 | crop 1/1  1/2  1/4  1/8
 *   500x375   0.69  0.57  0.51  0.46 |     0.49 0.44 0.41 0.44
 *   1024x768  2.64  2.16  2.02  1.78 |     2.07 1.67 1.74 1.72
 *   2000x1500 9.92  7.92  7.24  6.71 |     6.76 6.22 6.05 6.32
 * Every reduced scale is faster than the one above it for whole images and
 * no slower (within noise) for crops, where entropy decoding of the rows
 * down to the box -- which no scale reduces -- dominates. 1/2 and 1/4 have
 * SIMD IDCTs; 1/8 is DC-only and needs none. So all four are allowed, and
 * the smaller region also makes the following resize cheaper.
 *
 * Exactness: the pixels inside the box equal a full tjDecompress2() decode
 * at 1/1 (same IDCT, same fancy upsampling), because the requested columns
 * are widened by one pixel each side where the image goes on: libjpeg-turbo's
 * h2v1/h2v2 fancy upsampling treats a cropped region's left and right edges
 * as image edges (libjpeg.txt, "Decompressing partial scanlines"; without
 * the extra column test_jpegcrop sees differing edge pixels in 4:2:0 files).
 * Rows need no widening: jpeg_skip_scanlines keeps the upsampler's context
 * rows, and the first row after a skip equals the full decode's.
 *
 * Truncation: libjpeg's end-of-data warning is an error (other warnings,
 * damage that pack let through as Pillow does, are not), but rows after
 * the box's last one are never read, so a baseline file truncated below the box decodes
 * without complaint (progressive files are read whole by
 * jpeg_start_decompress). Pack's full test decode catches those.
 */
#include "loader/jpegcrop.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

#include <jpeglib.h>
#include <jerror.h>

#include "common/common.h"

/*
 * Largest decoded region and largest libjpeg working memory (progressive
 * coefficient buffers): about 100 megapixels, far above any training image,
 * so that a hostile header fails cleanly instead of exhausting memory.
 */
#define JPEGCROP_MAX_REGION_BYTES ((size_t)1 << 30)
#define JPEGCROP_MAX_LIBJPEG_MEM (1L << 30)

/* The scales allowed, largest first (see the file comment for why all). */
static const unsigned jpegcrop_scales[] = {8, 4, 2};

struct jpegcrop_err {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
};

struct rt_jpegcrop {
    struct jpeg_decompress_struct ci;
    struct jpegcrop_err err;
    int created;
    uint8_t *buf;
    size_t cap;
    const char *name; /* of the JPEG being decoded, for messages */
};

static void jpegcrop_error_exit(j_common_ptr c)
{
    struct jpegcrop_err *e = (struct jpegcrop_err *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}

/*
 * The end of the data (JWRN_JPEG_EOF) is an error: the file is truncated.
 * Other warnings (level < 0) are damage libjpeg decodes through, which pack
 * accepted as Pillow does, listing the file in the manifest; trace messages
 * are ignored.
 */
static void jpegcrop_emit_message(j_common_ptr c, int level)
{
    struct jpegcrop_err *e = (struct jpegcrop_err *)c->err;
    if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) {
        c->err->format_message(c, e->msg);
        longjmp(e->jb, 1);
    }
}

int rt_jpegcrop_create(struct rt_jpegcrop **out)
{
    *out = NULL;
    struct rt_jpegcrop *d = rt_calloc(1, sizeof *d, "JPEG crop decoder");
    if (!d)
        return -ENOMEM;
    d->ci.err = jpeg_std_error(&d->err.pub);
    d->err.pub.error_exit = jpegcrop_error_exit;
    d->err.pub.emit_message = jpegcrop_emit_message;
    if (setjmp(d->err.jb)) {
        const int rc = rt_errf(-ENOMEM, "cannot create a JPEG decoder: %s", d->err.msg);
        free(d);
        return rc;
    }
    jpeg_create_decompress(&d->ci);
    d->created = 1;
    d->ci.mem->max_memory_to_use = JPEGCROP_MAX_LIBJPEG_MEM;
    *out = d;
    return 0;
}

void rt_jpegcrop_destroy(struct rt_jpegcrop *d)
{
    if (!d)
        return;
    if (d->created)
        jpeg_destroy_decompress(&d->ci);
    free(d->buf);
    free(d);
}

/* The largest allowed k with the box still at least out_w x out_h after scaling by 1/k. */
static unsigned jpegcrop_pick_scale(double bw, double bh, uint32_t out_w, uint32_t out_h)
{
    for (size_t i = 0; i < RT_ARRAY_LEN(jpegcrop_scales); i++) {
        const unsigned k = jpegcrop_scales[i];
        if (bw / k >= out_w && bh / k >= out_h)
            return k;
    }
    return 1;
}

int rt_jpegcrop_decode(struct rt_jpegcrop *d, const uint8_t *jpeg, size_t len, const char *name_or_null,
                       uint32_t channels, const struct rt_box *box, uint32_t out_w, uint32_t out_h,
                       struct rt_jpeg_region *reg)
{
    /* Kept in d, not a local: the error path after longjmp reads it. */
    d->name = name_or_null ? name_or_null : "(JPEG)";
    const char *name = d->name;
    if (channels != 1 && channels != 3)
        return rt_errf(-EINVAL, "%s: %u channels requested, expected 1 or 3", name, channels);
    if (!(isfinite(box->x) && isfinite(box->y) && box->w > 0 && box->h > 0 && isfinite(box->w) &&
          isfinite(box->h)) ||
        out_w == 0 || out_h == 0)
        return rt_errf(-EINVAL, "%s: bad crop box (%g, %g, %g x %g) or output %ux%u", name, box->x, box->y, box->w,
                       box->h, out_w, out_h);
    if (!jpeg || len < 4)
        return rt_errf(-EBADMSG, "%s: truncated or corrupt JPEG (%zu bytes)", name, len);

    struct jpeg_decompress_struct *ci = &d->ci;
    if (setjmp(d->err.jb)) {
        jpeg_abort_decompress(ci);
        const int code = d->err.pub.msg_code == JERR_OUT_OF_MEMORY ? -ENOMEM : -EBADMSG;
        return rt_errf(code, "%s: truncated or corrupt JPEG: %s", d->name, d->err.msg);
    }

    jpeg_mem_src(ci, jpeg, (unsigned long)len);
    if (jpeg_read_header(ci, TRUE) != JPEG_HEADER_OK) {
        jpeg_abort_decompress(ci);
        return rt_errf(-EBADMSG, "%s: truncated or corrupt JPEG: no image", d->name);
    }
    switch (ci->jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
        break;
    default:
        jpeg_abort_decompress(ci);
        return rt_errf(-EBADMSG, "%s: unsupported colour space (%s JPEG)", d->name,
                       ci->jpeg_color_space == JCS_CMYK   ? "CMYK"
                       : ci->jpeg_color_space == JCS_YCCK ? "YCCK"
                                                          : "unknown");
    }

    const double W = ci->image_width, H = ci->image_height;
    const double x0 = RT_MAX(box->x, 0.0), y0 = RT_MAX(box->y, 0.0);
    const double x1 = RT_MIN(box->x + box->w, W), y1 = RT_MIN(box->y + box->h, H);
    if (!(x1 > x0 && y1 > y0)) {
        jpeg_abort_decompress(ci);
        return rt_errf(-EINVAL, "%s: crop box (%g, %g, %g x %g) outside the %ux%u image", d->name, box->x, box->y,
                       box->w, box->h, ci->image_width, ci->image_height);
    }
    const unsigned k = jpegcrop_pick_scale(x1 - x0, y1 - y0, out_w, out_h);

    /* What tjDecompress2() does with no flags, so a k = 1 region equals its pixels. */
    ci->out_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
    ci->dct_method = JDCT_ISLOW;
    ci->do_fancy_upsampling = TRUE;
    ci->do_block_smoothing = TRUE;
    ci->quantize_colors = FALSE;
    ci->scale_num = 1;
    ci->scale_denom = k;
    jpeg_start_decompress(ci);

    const JDIMENSION ow = ci->output_width, oh = ci->output_height;
    const double bx0 = x0 / k, bx1 = x1 / k, by0 = y0 / k, by1 = y1 / k;
    JDIMENSION c0 = (JDIMENSION)floor(bx0), c1 = (JDIMENSION)ceil(bx1);
    JDIMENSION r0 = (JDIMENSION)floor(by0), r1 = (JDIMENSION)ceil(by1);
    /* One more column each side where the image goes on: see "Exactness" above. */
    c0 = c0 > 0 ? c0 - 1 : 0;
    c1 = RT_MIN(c1 + 1, ow);
    r1 = RT_MIN(r1, oh);

    JDIMENSION xoff = c0, width = c1 - c0;
    if (width < ow)
        jpeg_crop_scanline(ci, &xoff, &width);
    else
        xoff = 0;
    const size_t stride = (size_t)ci->output_width * ci->output_components;
    const size_t bytes = stride * (r1 - r0);
    if (bytes > JPEGCROP_MAX_REGION_BYTES) {
        jpeg_abort_decompress(ci);
        return rt_errf(-EFBIG, "%s: crop region %ux%u of a %ux%u JPEG is too large", d->name, ci->output_width,
                       r1 - r0, ci->image_width, ci->image_height);
    }
    if (bytes > d->cap) {
        uint8_t *p = rt_realloc(d->buf, bytes, "JPEG crop region");
        if (!p) {
            jpeg_abort_decompress(ci);
            return -ENOMEM;
        }
        d->buf = p;
        d->cap = bytes;
    }

    if (r0 > 0 && jpeg_skip_scanlines(ci, r0) != r0) {
        jpeg_abort_decompress(ci);
        return rt_errf(-EBADMSG, "%s: truncated or corrupt JPEG: cannot skip to row %u", d->name, r0);
    }
    while (ci->output_scanline < r1) {
        JSAMPROW rows[16];
        const JDIMENSION n = RT_MIN(r1 - ci->output_scanline, (JDIMENSION)RT_ARRAY_LEN(rows));
        for (JDIMENSION i = 0; i < n; i++)
            rows[i] = d->buf + (size_t)(ci->output_scanline - r0 + i) * stride;
        if (jpeg_read_scanlines(ci, rows, n) == 0) {
            jpeg_abort_decompress(ci);
            return rt_errf(-EBADMSG, "%s: truncated or corrupt JPEG: no data at row %u", d->name, ci->output_scanline);
        }
    }
    /* Reading on to EOI when every row was decoded anyway catches damage after the last scan. */
    if (ci->output_scanline == oh)
        jpeg_finish_decompress(ci);
    else
        jpeg_abort_decompress(ci);

    reg->px = d->buf;
    reg->w = width;
    reg->h = r1 - r0;
    reg->stride = stride;
    reg->box = (struct rt_box){bx0 - xoff, by0 - r0, bx1 - bx0, by1 - by0};
    reg->scale_denom = k;
    return 0;
}
