/*
 * resize_bench.c - the C side of bench/resize_quality.py: resizes one box of
 * a PPM image with loader/resize.c (rt_resize_box_chw: Pillow's BILINEAR,
 * with each of its kernels: avx512, avx2, scalar) and with the libraries it
 * was compared with (stb_image_resize v1 from libstb-dev, which it replaced
 * for pack; libswscale from FFmpeg, which rt_resize_crop_chw uses), writes
 * each result as a PPM for the driver to compare with Pillow, and times it
 * (single thread, median of repeated runs, thread CPU time). Not part of the
 * CMake build; the driver compiles it, from the repository root, with
 *   cc -O3 -D_GNU_SOURCE -DSTB_FROM_HEADER -I. bench/resize_bench.c loader/resize.c common/common.c \
 *      $(pkg-config --cflags --libs stb libswscale libavutil) -lm
 * stb may be left out with -DNO_STB where it is not installed (loader/resize.c
 * needs swscale).
 *
 * Usage: resize_bench IN.ppm OUTDIR NAME X Y W H DW DH [REPS]
 * Prints one line per method: "method usec_per_image mpix_out_per_s".
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef NO_STB
#ifdef STB_FROM_HEADER
/*
 * libstb.so asserts (aborts) inside stbir__normalize_downsample_coefficients
 * for some ordinary geometries (upstream issue nothings/stb#1449, open);
 * -DSTB_FROM_HEADER compiles the same header's implementation here with the
 * assertion off, as loader/resize.c does.
 */
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#define STB_IMAGE_RESIZE_STATIC
#define STBIR_ASSERT(x) ((void)0)
#endif
#include <stb_image_resize.h>
#endif
#ifndef NO_SWS
#include <libavutil/pixfmt.h>
#include <libswscale/swscale.h>
#endif

#include "common/common.h"
#include "loader/resize.h"

struct img {
    int w, h;
    uint8_t *px; /* HWC RGB */
};

static int ppm_read(const char *path, struct img *im)
{
    FILE *f = fopen(path, "rb");
    int maxv;
    if (!f)
        return -errno;
    if (fscanf(f, "P6 %d %d %d", &im->w, &im->h, &maxv) != 3 || maxv != 255 || fgetc(f) == EOF) {
        fclose(f);
        return -EINVAL;
    }
    im->px = malloc((size_t)im->w * im->h * 3);
    if (fread(im->px, 3, (size_t)im->w * im->h, f) != (size_t)im->w * im->h) {
        fclose(f);
        return -EIO;
    }
    fclose(f);
    return 0;
}

static void ppm_write(const char *path, const uint8_t *px, int w, int h)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fprintf(f, "P6\n%d %d\n255\n", w, h);
    fwrite(px, 3, (size_t)w * h, f);
    fclose(f);
}

/*
 * Thread CPU time, not wall time: the build machines are shared, and time
 * spent waiting for a core is not the resizer's.
 */
static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct job {
    const struct img *src;
    double bx, by, bw, bh;
    int dw, dh;
    uint8_t *out; /* HWC RGB dw x dh */
    uint8_t *planes; /* scratch: 3 planes, large enough for the rounded box or the output */
};

typedef int (*method_fn)(const struct job *j, int param);

/* One resizer per kernel of loader/resize.c, made with RT_RESIZE_KERNEL set; NULL where the CPU lacks it. */
static const char *const ours_kernels[] = {"avx512", "avx2", "scalar"};
static struct rt_resizer *ours[3];

/* rt_resize_box_chw into CHW planes (j->planes), as pack --size calls it; the HWC copy is made after timing. */
static int run_ours(const struct job *j, int kernel)
{
    if (!ours[kernel])
        return -1;
    const struct rt_box box = {j->bx, j->by, j->bw, j->bh};
    return rt_resize_box_chw(ours[kernel], j->src->px, (uint32_t)j->src->w, (uint32_t)j->src->h, 3,
                             (size_t)j->src->w * 3, &box, j->planes, (uint32_t)j->dw, (uint32_t)j->dh, NULL, 0);
}

static void chw_to_hwc(const struct job *j)
{
    size_t n = (size_t)j->dw * j->dh;
    for (size_t i = 0; i < n; i++)
        for (int ch = 0; ch < 3; ch++)
            j->out[3 * i + ch] = j->planes[ch * n + i];
}

#ifndef NO_STB
/*
 * Passes stb only a window around the box (the filter's reach plus a margin)
 * so that a small crop of a large image does not decode every full row; the
 * offset inside the window stays fractional.
 */
static int run_stb(const struct job *j, int filter)
{
    const struct img *s = j->src;
    double sx = j->dw / j->bw, sy = j->dh / j->bh;
    double rx = (sx < 1 ? 1 / sx : 1) * 2 + 2, ry = (sy < 1 ? 1 / sy : 1) * 2 + 2;
    int x0 = (int)floor(j->bx - rx), y0 = (int)floor(j->by - ry);
    int x1 = (int)ceil(j->bx + j->bw + rx), y1 = (int)ceil(j->by + j->bh + ry);
    x0 = x0 < 0 ? 0 : x0;
    y0 = y0 < 0 ? 0 : y0;
    x1 = x1 > s->w ? s->w : x1;
    y1 = y1 > s->h ? s->h : y1;
    const uint8_t *in = s->px + ((size_t)y0 * s->w + x0) * 3;
    return stbir_resize_subpixel(in, x1 - x0, y1 - y0, s->w * 3, j->out, j->dw, j->dh, j->dw * 3, STBIR_TYPE_UINT8,
                                 3, STBIR_ALPHA_CHANNEL_NONE, 0, STBIR_EDGE_CLAMP, STBIR_EDGE_CLAMP, filter, filter,
                                 STBIR_COLORSPACE_LINEAR, NULL, (float)sx, (float)sy, (float)((j->bx - x0) * sx),
                                 (float)((j->by - y0) * sy)) ? 0 : -1;
}
#endif

#ifndef NO_SWS
/* swscale has no sub-pixel source offset: the box is rounded to whole pixels. */
static void round_box(const struct job *j, int *x, int *y, int *w, int *h)
{
    *x = (int)lround(j->bx);
    *y = (int)lround(j->by);
    *w = (int)lround(j->bx + j->bw) - *x;
    *h = (int)lround(j->by + j->bh) - *y;
    if (*w < 1)
        *w = 1;
    if (*h < 1)
        *h = 1;
}

enum sws_mode { SWS_MODE_GBRP = 0, SWS_MODE_RGB_TO_GBRP_FULL, SWS_MODE_RGB24_PLAIN, SWS_MODE_RGB24_FULL };
static int sws_mode_sel; /* set per method by main() */
static int sws_fresh_ctx; /* 1: a new context for every call, as RandomResizedCrop boxes change every image */

static int run_sws(const struct job *j, int flags)
{
    static struct SwsContext *ctx;
    int x, y, w, h;
    round_box(j, &x, &y, &w, &h);
    const struct img *s = j->src;
    int full = SWS_FULL_CHR_H_INT | SWS_FULL_CHR_H_INP | SWS_ACCURATE_RND;
    enum AVPixelFormat ifmt = AV_PIX_FMT_RGB24, ofmt = AV_PIX_FMT_GBRP;
    int extra = 0;
    switch (sws_mode_sel) {
    case SWS_MODE_GBRP: ifmt = AV_PIX_FMT_GBRP; break;
    case SWS_MODE_RGB_TO_GBRP_FULL: extra = full; break;
    case SWS_MODE_RGB24_PLAIN: ofmt = AV_PIX_FMT_RGB24; break;
    case SWS_MODE_RGB24_FULL: ofmt = AV_PIX_FMT_RGB24; extra = full; break;
    }
    if (sws_fresh_ctx) {
        sws_freeContext(ctx);
        ctx = NULL;
    }
    ctx = sws_getCachedContext(ctx, w, h, ifmt, j->dw, j->dh, ofmt, flags | extra, NULL, NULL, NULL);
    if (!ctx)
        return -1;
    const uint8_t *sp[4] = {0};
    int ss[4] = {0};
    uint8_t *op = j->planes + (size_t)3 * w * h; /* after the de-interleaved input planes */
    size_t on = (size_t)j->dw * j->dh;
    if (ifmt == AV_PIX_FMT_GBRP) {
        /* GBRP plane order is G, B, R. */
        uint8_t *g = j->planes, *b = g + (size_t)w * h, *r = b + (size_t)w * h;
        for (int yy = 0; yy < h; yy++) {
            const uint8_t *row = s->px + ((size_t)(y + yy) * s->w + x) * 3;
            for (int xx = 0; xx < w; xx++) {
                r[(size_t)yy * w + xx] = row[3 * xx];
                g[(size_t)yy * w + xx] = row[3 * xx + 1];
                b[(size_t)yy * w + xx] = row[3 * xx + 2];
            }
        }
        sp[0] = g, sp[1] = b, sp[2] = r;
        ss[0] = ss[1] = ss[2] = w;
    } else {
        sp[0] = s->px + ((size_t)y * s->w + x) * 3;
        ss[0] = s->w * 3;
    }
    if (ofmt == AV_PIX_FMT_GBRP) {
        uint8_t *dp[4] = {op, op + on, op + 2 * on, NULL};
        int ds[4] = {j->dw, j->dw, j->dw, 0};
        sws_scale(ctx, sp, ss, 0, h, dp, ds);
        for (size_t i = 0; i < on; i++) {
            j->out[3 * i] = op[2 * on + i];
            j->out[3 * i + 1] = op[i];
            j->out[3 * i + 2] = op[on + i];
        }
    } else {
        uint8_t *dp[4] = {j->out, NULL, NULL, NULL};
        int ds[4] = {j->dw * 3, 0, 0, 0};
        sws_scale(ctx, sp, ss, 0, h, dp, ds);
    }
    return 0;
}
#endif

struct method {
    const char *name;
    method_fn fn;
    int param;
    int sws_mode, fresh;
};

static const struct method methods[] = {
    {"ours_avx512", run_ours, 0, 0, 0},
    {"ours_avx2", run_ours, 1, 0, 0},
    {"ours_scalar", run_ours, 2, 0, 0},
#ifndef NO_STB
    {"stb_box", run_stb, STBIR_FILTER_BOX, 0, 0},
    {"stb_triangle", run_stb, STBIR_FILTER_TRIANGLE, 0, 0},
    {"stb_bspline", run_stb, STBIR_FILTER_CUBICBSPLINE, 0, 0},
    {"stb_catmullrom", run_stb, STBIR_FILTER_CATMULLROM, 0, 0},
    {"stb_mitchell", run_stb, STBIR_FILTER_MITCHELL, 0, 0},
#endif
#ifndef NO_SWS
    {"sws_area_gbrp", run_sws, SWS_AREA, SWS_MODE_GBRP, 0},
    {"sws_bilinear_gbrp", run_sws, SWS_BILINEAR, SWS_MODE_GBRP, 0},
    {"sws_bicubic_gbrp", run_sws, SWS_BICUBIC, SWS_MODE_GBRP, 0},
    {"sws_lanczos_gbrp", run_sws, SWS_LANCZOS, SWS_MODE_GBRP, 0},
    {"sws_bilinear_rgb2gbrp_full", run_sws, SWS_BILINEAR, SWS_MODE_RGB_TO_GBRP_FULL, 0},
    {"sws_bilinear_rgb24_plain", run_sws, SWS_BILINEAR, SWS_MODE_RGB24_PLAIN, 0},
    {"sws_bilinear_rgb24_full", run_sws, SWS_BILINEAR, SWS_MODE_RGB24_FULL, 0},
    {"sws_bilinear_gbrp_newctx", run_sws, SWS_BILINEAR, SWS_MODE_GBRP, 1},
#endif
};

int main(int argc, char **argv)
{
    if (argc < 10) {
        fprintf(stderr, "usage: %s IN.ppm OUTDIR NAME X Y W H DW DH [REPS]\n", argv[0]);
        return 2;
    }
    struct img src;
    int rc = ppm_read(argv[1], &src);
    if (rc) {
        fprintf(stderr, "%s: cannot read (%d)\n", argv[1], rc);
        return 1;
    }
    struct job j = {&src, atof(argv[4]), atof(argv[5]), atof(argv[6]), atof(argv[7]), atoi(argv[8]), atoi(argv[9]),
                    NULL, NULL};
    int reps = argc > 10 ? atoi(argv[10]) : 30;
    j.out = malloc((size_t)j.dw * j.dh * 3);
    j.planes = malloc((size_t)3 * ((size_t)(j.bw + 2) * (size_t)(j.bh + 2) + (size_t)j.dw * j.dh));
    double *t = malloc(sizeof(double) * (size_t)reps);
    for (int k = 0; k < 3; k++) {
        setenv("RT_RESIZE_KERNEL", ours_kernels[k], 1);
        if (rt_resizer_create(&ours[k]))
            ours[k] = NULL;
    }
    unsetenv("RT_RESIZE_KERNEL");
    for (size_t m = 0; m < sizeof methods / sizeof methods[0]; m++) {
#ifndef NO_SWS
        sws_mode_sel = methods[m].sws_mode;
        sws_fresh_ctx = methods[m].fresh;
#endif
        if (methods[m].fn(&j, methods[m].param)) { /* warm-up, also builds cached contexts */
            if (methods[m].fn != run_ours || ours[methods[m].param])
                fprintf(stderr, "%s failed\n", methods[m].name);
            continue;
        }
        for (int r = 0; r < reps; r++) {
            double t0 = now_us();
            methods[m].fn(&j, methods[m].param);
            t[r] = now_us() - t0;
        }
        qsort(t, (size_t)reps, sizeof(double), cmp_double);
        double med = t[reps / 2];
        if (methods[m].fn == run_ours)
            chw_to_hwc(&j);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s__%s.ppm", argv[2], argv[3], methods[m].name);
        ppm_write(path, j.out, j.dw, j.dh);
        printf("%s %.1f %.2f\n", methods[m].name, med, (double)j.dw * j.dh / med);
    }
    for (int k = 0; k < 3; k++)
        rt_resizer_destroy(ours[k]);
    return 0;
}
