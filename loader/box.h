/*
 * box.h (private to loader/) - a rectangle in an image's pixel coordinates,
 * shared by the crop sampler (rrc.h), the JPEG region decoder (jpegcrop.h)
 * and the resizer (resize.h). Coordinates may be fractional: a box sampled
 * on the full-size image is scaled when the JPEG is decoded at 1/2, 1/4 or
 * 1/8 of its size.
 */
#ifndef RT_LOADER_BOX_H
#define RT_LOADER_BOX_H

struct rt_box {
    double x, y;    /* left, top */
    double w, h;    /* width, height; > 0 */
};

#endif
