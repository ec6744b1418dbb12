/*
 * jpeg_scales.c - how long libjpeg-turbo takes to decode a JPEG at each IDCT
 * scale (1/1, 1/2, 1/4, 1/8), for the whole image and for a typical
 * RandomResizedCrop box decoded partially (jpeg_crop_scanline for the
 * columns, jpeg_skip_scanlines to the box's first row, then abort after its
 * last row), the way loader/jpegcrop.c decodes. Its table is the evidence
 * for the scales jpegcrop.c allows: libjpeg-turbo's SIMD covers only some
 * reduced-size IDCTs, so a smaller scale is not automatically faster.
 *
 * Images: ImageNet-like sizes (500x375, 1024x768, 2000x1500) encoded by
 * TurboJPEG at quality 90, 4:2:0, from structured synthetic content
 * (gradients, shapes, textures of several frequencies, a little noise), so
 * the entropy-coded data has a photo-like density. Not part of the CMake
 * build; no arguments beyond an optional repetition count.
 *
 * Build and run:
 *   cc -O2 -o /tmp/jpeg_scales bench/jpeg_scales.c $(pkg-config --cflags --libs libjpeg libturbojpeg) -lm && /tmp/jpeg_scales
 */
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jpeglib.h>
#include <turbojpeg.h>

struct err {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
};

static void on_error(j_common_ptr c)
{
    longjmp(((struct err *)c->err)->jb, 1);
}

/*
 * This thread's CPU time, not wall time: the machine is shared with builds,
 * and waiting for a core is no part of a decode's cost.
 */
static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* Photo-like content: smooth background, shapes with edges, textures, noise. */
static void synth(uint8_t *px, int w, int h, uint32_t seed)
{
    uint32_t s = seed;
    struct { double cx, cy, r; uint8_t c[3]; } disc[24];
    for (int i = 0; i < 24; i++) {
        disc[i].cx = lcg(&s) % w;
        disc[i].cy = lcg(&s) % h;
        disc[i].r = 0.02 * w + lcg(&s) % (w / 5 + 1);
        for (int c = 0; c < 3; c++)
            disc[i].c[c] = (uint8_t)(lcg(&s) & 255);
    }
    const double f1 = 0.02 + (lcg(&s) % 100) * 0.001, f2 = 0.15 + (lcg(&s) % 100) * 0.003;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            double v[3] = {80 + 100.0 * x / w, 60 + 120.0 * y / h, 140 - 60.0 * (x + y) / (w + h)};
            for (int i = 0; i < 24; i++) {
                const double dx = x - disc[i].cx, dy = y - disc[i].cy;
                if (dx * dx + dy * dy < disc[i].r * disc[i].r)
                    for (int c = 0; c < 3; c++)
                        v[c] = 0.3 * v[c] + 0.7 * disc[i].c[c];
            }
            const double tex = 25 * sin(x * f1 + 3 * sin(y * 0.01)) * sin(y * f1) +
                               12 * sin(x * f2) * sin(y * f2 * 0.7) * (x > w / 2);
            for (int c = 0; c < 3; c++) {
                const double n = (double)(lcg(&s) % 17) - 8;
                const double o = v[c] + tex + n;
                px[((size_t)y * w + x) * 3 + c] = (uint8_t)(o < 0 ? 0 : o > 255 ? 255 : o);
            }
        }
}

/*
 * One decode at 1/k. Whole image when crop is NULL; else crop = {x, y, w, h}
 * in full-size pixels, decoded partially and aborted after its last row.
 */
static int decode(struct jpeg_decompress_struct *ci, struct err *e, const uint8_t *jpg, unsigned long len,
                  int k, const int *crop, uint8_t *out)
{
    if (setjmp(e->jb)) {
        jpeg_abort_decompress(ci);
        return -1;
    }
    jpeg_mem_src(ci, jpg, len);
    jpeg_read_header(ci, TRUE);
    ci->out_color_space = JCS_RGB;
    ci->scale_num = 1;
    ci->scale_denom = (unsigned)k;
    jpeg_start_decompress(ci);
    JDIMENSION y0 = 0, y1 = ci->output_height;
    if (crop) {
        JDIMENSION xoff = (JDIMENSION)(crop[0] / k), width = (JDIMENSION)((crop[0] + crop[2]) / k) - xoff;
        jpeg_crop_scanline(ci, &xoff, &width);
        y0 = (JDIMENSION)(crop[1] / k);
        y1 = (JDIMENSION)((crop[1] + crop[3] + k - 1) / k);
        if (y1 > ci->output_height)
            y1 = ci->output_height;
        jpeg_skip_scanlines(ci, y0);
    }
    const size_t stride = (size_t)ci->output_width * 3;
    while (ci->output_scanline < y1) {
        JSAMPROW row = out + (size_t)(ci->output_scanline - y0) * stride;
        jpeg_read_scanlines(ci, &row, 1);
    }
    if (ci->output_scanline == ci->output_height)
        jpeg_finish_decompress(ci);
    else
        jpeg_abort_decompress(ci);
    return 0;
}

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 15;
    const int sizes[][2] = {{500, 375}, {1024, 768}, {2000, 1500}};
    const int scales[] = {1, 2, 4, 8};
    char cpu[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10)) {
                const char *p = strchr(line, ':');
                snprintf(cpu, sizeof cpu, "%.200s", p ? p + 2 : line);
                cpu[strcspn(cpu, "\n")] = 0;
                break;
            }
        fclose(f);
    }
    printf("# CPU: %s; libjpeg-turbo %d; median of %d reps x 3 images; CPU ms per image (thread CPU time)\n", cpu, LIBJPEG_TURBO_VERSION_NUMBER,
           reps);
    printf("# crop: box (0.2W, 0.25H, 0.6W x 0.6H) = 36%% of the area, about the median RRC box\n");
    printf("%-10s %7s  %8s %8s %8s %8s   %8s %8s %8s %8s\n", "size", "KB", "1/1", "1/2", "1/4", "1/8", "crop1/1",
           "crop1/2", "crop1/4", "crop1/8");

    struct jpeg_decompress_struct ci;
    struct err e;
    ci.err = jpeg_std_error(&e.pub);
    e.pub.error_exit = on_error;
    jpeg_create_decompress(&ci);
    tjhandle tj = tjInitCompress();

    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int w = sizes[si][0], h = sizes[si][1];
        uint8_t *px = malloc((size_t)w * h * 3), *out = malloc((size_t)w * h * 3);
        unsigned char *jpg[3] = {0};
        unsigned long len[3] = {0};
        double kb = 0;
        for (int i = 0; i < 3; i++) {
            synth(px, w, h, 1234u + 77u * (unsigned)i + (unsigned)si);
            if (tjCompress2(tj, px, w, 0, h, TJPF_RGB, &jpg[i], &len[i], TJSAMP_420, 90, 0)) {
                fprintf(stderr, "tjCompress2: %s\n", tjGetErrorStr2(tj));
                return 1;
            }
            kb += len[i] / 1024.0 / 3;
        }
        const int crop[4] = {w / 5, h / 4, w * 3 / 5, h * 3 / 5};
        double med[2][4];
        for (int c = 0; c < 2; c++)
            for (int s = 0; s < 4; s++) {
                double t[64 * 3];
                int n = 0;
                decode(&ci, &e, jpg[0], len[0], scales[s], c ? crop : NULL, out); /* warm-up */
                for (int r = 0; r < reps && r < 64; r++)
                    for (int i = 0; i < 3; i++) {
                        const double t0 = now_ms();
                        if (decode(&ci, &e, jpg[i], len[i], scales[s], c ? crop : NULL, out))
                            return 1;
                        t[n++] = now_ms() - t0;
                    }
                qsort(t, (size_t)n, sizeof t[0], cmp);
                med[c][s] = t[n / 2];
            }
        char name[32];
        snprintf(name, sizeof name, "%dx%d", w, h);
        printf("%-10s %7.0f  %8.2f %8.2f %8.2f %8.2f   %8.2f %8.2f %8.2f %8.2f\n", name, kb, med[0][0], med[0][1],
               med[0][2], med[0][3], med[1][0], med[1][1], med[1][2], med[1][3]);
        for (int i = 0; i < 3; i++)
            tjFree(jpg[i]);
        free(px);
        free(out);
    }
    jpeg_destroy_decompress(&ci);
    tjDestroy(tj);
    return 0;
}
