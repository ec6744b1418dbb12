/*
 * image.c - writes one CHW uint8 image to a file a person can look at: PNG
 * through libpng, or binary PPM/PGM. Used by `ringtrain inspect --out`.
 */
#include <errno.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "loader/offline.h"

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

/* Interleaves CHW into HWC rows. */
static void to_hwc(const uint8_t *chw, uint32_t c, uint32_t h, uint32_t w, uint8_t *hwc)
{
    const size_t plane = (size_t)h * w;
    for (size_t i = 0; i < plane; i++)
        for (uint32_t k = 0; k < c; k++)
            hwc[i * c + k] = chw[k * plane + i];
}

static int write_png(FILE *f, const char *path, const uint8_t *hwc, uint32_t c, uint32_t h, uint32_t w)
{
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;

    if (!png || !info) {
        png_destroy_write_struct(&png, NULL);
        return rt_errf(-ENOMEM, "%s: cannot create PNG writer", path);
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        return rt_errf(-EIO, "%s: PNG write failed", path);
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, w, h, 8, c == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (uint32_t y = 0; y < h; y++)
        png_write_row(png, hwc + (size_t)y * w * c);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return 0;
}

int rt_image_write(const char *path, const uint8_t *chw, uint32_t c, uint32_t h, uint32_t w)
{
    int png = ends_with(path, ".png");
    int pnm = ends_with(path, ".ppm") || ends_with(path, ".pgm");
    uint8_t *hwc;
    FILE *f;
    int rc = 0;

    if (!png && !pnm)
        return rt_errf(-EINVAL, "%s: unknown image type (use .png, .ppm or .pgm)", path);
    if (c != 1 && c != 3)
        return rt_errf(-EINVAL, "%s: cannot write a %u-channel image", path, c);
    if (pnm && (c == 1) != ends_with(path, ".pgm"))
        return rt_errf(-EINVAL, "%s: a %u-channel image is written as .%s", path, c, c == 1 ? "pgm" : "ppm");
    hwc = rt_malloc((size_t)c * h * w, "image");
    if (!hwc)
        return -ENOMEM;
    to_hwc(chw, c, h, w, hwc);
    f = fopen(path, "wb");
    if (!f) {
        rc = rt_errf(-errno, "%s: cannot create: %s", path, strerror(errno));
        free(hwc);
        return rc;
    }
    if (png) {
        rc = write_png(f, path, hwc, c, h, w);
    } else {
        fprintf(f, "P%c\n%u %u\n255\n", c == 1 ? '5' : '6', w, h);
        if (fwrite(hwc, 1, (size_t)c * h * w, f) != (size_t)c * h * w)
            rc = rt_errf(-EIO, "%s: write failed", path);
    }
    if (fclose(f) != 0 && rc == 0)
        rc = rt_errf(-errno, "%s: write failed: %s", path, strerror(errno));
    free(hwc);
    return rc;
}
