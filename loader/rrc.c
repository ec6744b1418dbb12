/*
 * rrc.c - the crop boxes of load-time augmentation: torchvision 0.14's
 * RandomResizedCrop.get_params (training) and the box that Resize +
 * CenterCrop keeps (evaluation), both in the full-size image's pixels.
 *
 * The sampler follows torchvision's structure step for step (10 tries,
 * Python's round-half-even, inclusive randint, the ratio-clamped centre
 * fallback) so that its boxes have torchvision's distribution; the random
 * numbers themselves come from our counter-based RNG, not torch's generator,
 * so individual boxes differ from torch's while their statistics agree
 * (tests/test_rrc.c checks that against a torchvision fixture). It does not
 * decode or resize anything.
 */
#include "loader/rrc.h"

#include <math.h>

#include "common/common.h"

/* RNG namespace of this sampler; see the stream layout in rrc_stream(). */
#define RRC_NAMESPACE (UINT64_C(10) << 56)

void rt_rrc_defaults(struct rt_rrc_opts *o)
{
    o->scale_lo = 0.08;
    o->scale_hi = 1.0;
    o->ratio_lo = 3.0 / 4.0;
    o->ratio_hi = 4.0 / 3.0;
}

/*
 * Stream id: namespace in bits 56..63, the epoch's low 16 bits in 40..55, the
 * sample id's low 40 bits in 0..39. Epochs therefore repeat their crops after
 * 65536 epochs and ids after 2^40 samples, both far beyond any real run.
 */
static uint64_t rrc_stream(uint64_t epoch, uint64_t id)
{
    return RRC_NAMESPACE | ((epoch & 0xFFFFu) << 40) | (id & ((UINT64_C(1) << 40) - 1));
}

/*
 * Uniform double in [0, 1) from 53 random bits: a float's 24 bits would put
 * visible steps into target_area on multi-megapixel images.
 */
static double rrc_uniform(struct rt_rng *r)
{
    return (double)(rt_rng_u64(r) >> 11) * 0x1p-53;
}

/* Python's round() of a float: to nearest, ties to even (the default FP mode). */
static double rrc_round(double v)
{
    return nearbyint(v);
}

void rt_rrc_box(const struct rt_rrc_opts *o, uint64_t seed, uint64_t epoch, uint64_t id, uint32_t width,
                uint32_t height, struct rt_box *box, int *flip, int *fallback)
{
    struct rt_rng r;
    rt_rng_init(&r, seed, rrc_stream(epoch, id));

    /*
     * The flip is drawn first so that it sits at a fixed position of the
     * stream, independent of how many tries the box needed.
     */
    *flip = (int)(rt_rng_u32(&r) >> 31);
    *fallback = 0;

    if (width == 0 || height == 0) {
        *box = (struct rt_box){0, 0, width, height};
        return;
    }

    const double W = width, H = height;
    const double area = W * H;
    const double rlo = RT_MIN(o->ratio_lo, o->ratio_hi), rhi = RT_MAX(o->ratio_lo, o->ratio_hi);
    const double log_lo = log(o->ratio_lo), log_hi = log(o->ratio_hi);

    for (int attempt = 0; attempt < 10; attempt++) {
        const double target_area = area * (o->scale_lo + (o->scale_hi - o->scale_lo) * rrc_uniform(&r));
        const double aspect = exp(log_lo + (log_hi - log_lo) * rrc_uniform(&r));
        const double w = rrc_round(sqrt(target_area * aspect));
        const double h = rrc_round(sqrt(target_area / aspect));
        if (w > 0 && w <= W && h > 0 && h <= H) {
            /* torchvision draws the top before the left. */
            const uint32_t top = rt_rng_below(&r, height - (uint32_t)h + 1);
            const uint32_t left = rt_rng_below(&r, width - (uint32_t)w + 1);
            *box = (struct rt_box){left, top, w, h};
            return;
        }
    }

    *fallback = 1;
    const double in_ratio = W / H;
    double w = W, h = H;
    if (in_ratio < rlo) {
        h = rrc_round(w / rlo);
    } else if (in_ratio > rhi) {
        w = rrc_round(h * rhi);
    }
    /* Python's // on non-negative integers. */
    box->x = (double)((width - (uint32_t)w) / 2);
    box->y = (double)((height - (uint32_t)h) / 2);
    box->w = w;
    box->h = h;
}

void rt_center_box(uint32_t width, uint32_t height, uint32_t out_w, uint32_t out_h, double crop_ratio,
                   struct rt_box *box)
{
    if (width == 0 || height == 0 || out_w == 0 || out_h == 0 || !(crop_ratio > 0)) {
        *box = (struct rt_box){0, 0, width, height};
        return;
    }
    /* Resize(R): the shorter side becomes R, the longer int(R * long / short). */
    const double R = rrc_round((double)RT_MIN(out_w, out_h) / crop_ratio);
    const uint32_t s = RT_MIN(width, height), l = RT_MAX(width, height);
    const double new_long = floor(R * (double)l / (double)s);
    const double new_w = width <= height ? R : new_long;
    const double new_h = width <= height ? new_long : R;

    /*
     * CenterCrop: torchvision pads a side shorter than the crop (equally,
     * the odd pixel on the right/bottom) and then takes
     * int(round((size - crop) / 2.0)); in the resized image's coordinates
     * that is a start of -pad_before, or the rounded centre offset.
     */
    double left, top;
    if (out_w > new_w)
        left = -floor((out_w - new_w) / 2);
    else
        left = rrc_round((new_w - out_w) / 2.0);
    if (out_h > new_h)
        top = -floor((out_h - new_h) / 2);
    else
        top = rrc_round((new_h - out_h) / 2.0);

    /* Resize maps pixel edges linearly: x_original = x_resized * W / new_w. */
    const double sx = (double)width / new_w, sy = (double)height / new_h;
    box->x = left * sx;
    box->y = top * sy;
    box->w = out_w * sx;
    box->h = out_h * sy;
}
