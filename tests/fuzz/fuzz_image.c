/*
 * fuzz_image.c - libFuzzer target for loader/imgfile.c: the input is an
 * image file's bytes (JPEG, PNG, WebP, PPM/PGM or anything else), probed,
 * then decoded at 3 and 1 channels, with and without EXIF rotation. A file
 * whose probe declares more than 4 Mpixel is not decoded here: the decoder
 * would allocate what the header allows (RT_IMG_MAX_PIXELS), which is
 * correct and only slow; sizes are checked by the probe's own code paths.
 */
#include <stdint.h>
#include <stdlib.h>

#include "common/common.h"
#include "loader/imgfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct rt_imgdec *d;
    struct rt_img_info info;
    enum rt_img_bad why;
    const uint8_t *px;
    uint32_t w, h;

    if (!d && rt_imgdec_create(&d) < 0)
        return 0;
    int rc = rt_img_probe(data, size, "fuzz", &info, &why);
    if (rc == 0 && (uint64_t)info.width * info.height > ((uint64_t)1 << 22))
        return 0;
    for (int k = 0; k < 4; k++) {
        const uint32_t channels = k & 1 ? 1 : 3;
        const int rotate = k >= 2;
        if (rt_img_decode(d, data, size, "fuzz", channels, rotate, &px, &w, &h, &why) == 0) {
            /* Touch the first and last byte the decoder vouched for. */
            volatile uint8_t sink = px[0];
            sink = px[(size_t)w * h * channels - 1];
            (void)sink;
            if (rc != 0)
                abort(); /* the probe refused what the decoder accepted */
        }
    }
    return 0;
}
