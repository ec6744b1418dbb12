/*
 * rrc.h (private to loader/) - where to crop a variable-size image at load
 * time: torchvision's RandomResizedCrop box (training) and the centre box of
 * Resize + CenterCrop (evaluation), in the full-size image's pixels. The
 * training box and flip are a pure function of (seed, epoch, sample id)
 * through the counter-based RNG, so any worker count gives the same crops.
 */
#ifndef RT_LOADER_RRC_H
#define RT_LOADER_RRC_H

#include <stdint.h>

#include "loader/box.h"

struct rt_rrc_opts {
    double scale_lo, scale_hi;   /* area fraction range; torchvision's default (0.08, 1) */
    double ratio_lo, ratio_hi;   /* aspect (w/h) range; default (3/4, 4/3), sampled log-uniform */
};

/* torchvision's defaults. */
void rt_rrc_defaults(struct rt_rrc_opts *o);

/*
 * torchvision's RandomResizedCrop.get_params for a width x height image:
 * up to 10 tries of (area, log-aspect); the first box that fits is placed
 * uniformly; else a centre crop clamped to the ratio range (*fallback = 1).
 * The box has integer coordinates. *flip is a fair coin from the same
 * stream. Pure function; thread-safe.
 */
void rt_rrc_box(const struct rt_rrc_opts *o, uint64_t seed, uint64_t epoch, uint64_t id, uint32_t width,
                uint32_t height, struct rt_box *box, int *flip, int *fallback);

/*
 * Evaluation: the box of the original image that torchvision's
 * Resize(round(min(out_w,out_h) / crop_ratio)) + CenterCrop((out_h, out_w)) keeps (crop_ratio 0.875:
 * the usual Resize(256) + CenterCrop(224); 1: Resize(S) + CenterCrop(S)). Fractional coordinates.
 * Inside the image unless torchvision would pad (a side of the resized image
 * shorter than the crop: only when out_w != out_h or crop_ratio > 1); then
 * the box reaches past that side as torchvision's padding does, and the
 * caller decides (jpegcrop clamps). A zero size gives the whole image. Pure;
 * thread-safe.
 */
void rt_center_box(uint32_t width, uint32_t height, uint32_t out_w, uint32_t out_h, double crop_ratio,
                   struct rt_box *box);

#endif
