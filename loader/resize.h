/*
 * resize.h (private to loader/) - antialiased image resizing for pack
 * (--size, --max-side) and for load-time crops: a box of an interleaved
 * (HWC) uint8 image resized into CHW planes (a batch slot's layout) or into
 * another HWC image. Pack's two entry points reproduce Pillow 9.4's BILINEAR
 * exactly (our own code); the load-time crop uses swscale. How and why:
 * resize.c.
 */
#ifndef RT_LOADER_RESIZE_H
#define RT_LOADER_RESIZE_H

#include <stddef.h>
#include <stdint.h>

#include "loader/box.h"

/* Per-thread resizing state (filter tables, scratch). */
struct rt_resizer;

/*
 * Picks the fastest exact kernel this CPU has (avx512, avx2, else plain C);
 * the environment variable RT_RESIZE_KERNEL=scalar|avx2|avx512 forces one
 * (for tests and benchmarks; -ENOTSUP when the CPU lacks it, -EINVAL for an
 * unknown name). All kernels give the same values. Returns 0 or -errno.
 */
int rt_resizer_create(struct rt_resizer **out);
/* Frees the resizer; NULL is fine. */
void rt_resizer_destroy(struct rt_resizer *r);

/*
 * Resizes `box` (source pixel coordinates, inside [0, sw] x [0, sh]) of the
 * HWC image `src` (sw x sh, c = 1 or 3 channels, rows `sstride` bytes apart)
 * to the rectangle `rect` = {x, y, w, h} (integers) of a CHW image of
 * dw x dh (`dst`, c planes of dh*dw bytes), mirrored left-right when `flip`.
 * rect NULL means the whole of dst. Pixels of dst outside rect are left
 * alone. The values are Pillow 9.4's Image.resize((w, h), BILINEAR,
 * box=(x, y, x + w, y + h)) of the box, exactly: source pixels just outside
 * the box take part in the filter; a box that is a whole-pixel window of a
 * whole-image resize (rt_fit_geometry's CROP) gives exactly that resize's
 * pixels (torchvision's Resize + CenterCrop). A box may end up to 1e-6 px
 * past the image (rounding of a scaled box). Returns 0 or -errno (-EINVAL for an empty or
 * out-of-range box, a bad rect, c not 1 or 3, a side over 65535; -ENOMEM).
 * Allocates only while its scratch grows to the largest size seen.
 * Not thread-safe: one resizer per thread.
 */
int rt_resize_box_chw(struct rt_resizer *r, const uint8_t *src, uint32_t sw, uint32_t sh, uint32_t c,
                      size_t sstride, const struct rt_box *box, uint8_t *dst, uint32_t dw, uint32_t dh,
                      const uint32_t rect[4], int flip);

/*
 * As rt_resize_box_chw, with `src` holding only the window win = {x, y, w,
 * h} of the sw x sh image (src points at its top-left pixel, rows sstride
 * bytes apart): the result is the whole image's, provided the window holds
 * every pixel the filter reads -- the box and about 1/scale + 1 pixels
 * around it when shrinking, cut at the image's edges. -ERANGE when it does
 * not (nothing is written); -EINVAL for a window outside the image.
 */
int rt_resize_box_chw_window(struct rt_resizer *r, const uint8_t *src, uint32_t sw, uint32_t sh,
                             const uint32_t win[4], uint32_t c, size_t sstride, const struct rt_box *box,
                             uint8_t *dst, uint32_t dw, uint32_t dh, const uint32_t rect[4], int flip);

/*
 * The load-time crop's resize: as rt_resize_box_chw into the whole of dst,
 * with the box rounded to whole pixels and swscale's bilinear filter (close
 * to Pillow, not equal; kept so that training data does not change -- the
 * choice and its figures: resize.c). Not thread-safe: one resizer per thread.
 */
int rt_resize_crop_chw(struct rt_resizer *r, const uint8_t *src, uint32_t sw, uint32_t sh, uint32_t c,
                       size_t sstride, const struct rt_box *box, uint8_t *dst, uint32_t dw, uint32_t dh, int flip);

/*
 * The whole HWC image `src` (sw x sh) to the HWC image `dst` (dw x dh, rows
 * dw*c bytes): Pillow's BILINEAR resize, exactly. Returns 0 or -errno.
 */
int rt_resize_hwc(struct rt_resizer *r, const uint8_t *src, uint32_t sw, uint32_t sh, uint32_t c,
                  size_t sstride, uint8_t *dst, uint32_t dw, uint32_t dh);

/*
 * How pack --size makes a fixed-size image from any size:
 *  CROP     torchvision's Resize(min(dw,dh)) + CenterCrop((dh, dw)): scale so the image covers dw x dh,
 *           keep the centre (the default);
 *  STRETCH  the whole image to dw x dh, aspect ratio not kept;
 *  PAD      the whole image scaled to fit inside dw x dh, centred, the rest zero.
 */
enum rt_fit { RT_FIT_CROP = 0, RT_FIT_STRETCH, RT_FIT_PAD };

/* "crop" / "stretch" / "pad"; NULL for an unknown value. */
const char *rt_fit_name(enum rt_fit fit);
/* The inverse: 0 and *out set, or -EINVAL (no message) for an unknown name. */
int rt_fit_parse(const char *name, enum rt_fit *out);

/*
 * The source box and destination rectangle {x, y, w, h} for `fit` of an
 * sw x sh image into dw x dh; pass both to rt_resize_box_chw (after zeroing
 * dst for PAD). CROP reproduces torchvision's integer arithmetic (int() of
 * the longer side, round-half-even of the crop offset). A zero size gives an
 * empty box, which rt_resize_box_chw refuses. Pure; thread-safe.
 */
void rt_fit_geometry(enum rt_fit fit, uint32_t sw, uint32_t sh, uint32_t dw, uint32_t dh, struct rt_box *box,
                     uint32_t rect[4]);

#endif
