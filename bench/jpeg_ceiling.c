/*
 * jpeg_ceiling.c - libjpeg-turbo's own decode rate on a folder of JPEGs: the
 * ceiling that bench/folder_vs_torchvision.sh sets a load-time-decoding loader
 * against. Reads every regular file under DIR (recursively; names ending in
 * .jpg/.jpeg in any case) into memory, then decodes all of them, full size, to
 * interleaved RGB with TurboJPEG (tjDecompress2, default flags: accurate
 * integer IDCT and fancy upsampling, what Pillow and a plain libjpeg decode
 * use) on T threads, in passes over the whole set until at least MIN_S
 * seconds have passed. Prints images/s, compressed MB/s and Mpixel/s, and one
 * JSON line.
 *
 * It does not read from disk while timed, does not crop, resize or convert
 * to CHW: decode only. With --scale 1/2 (or 1/4, 1/8) it measures
 * libjpeg-turbo's scaled IDCT instead (what a loader cropping to a small S
 * may use), still the whole image.
 *
 * Why a loop and not tjbench: tjbench times one file at a time on one
 * thread, so it neither sees the folder's mix of sizes nor uses both cores
 * the way the loader does, and libjpeg-turbo-progs is one more package.
 *
 * Build (not part of the CMake build; the bench script does this):
 *   cc -O2 -Wall -Wextra -o jpeg_ceiling bench/jpeg_ceiling.c \
 *      $(pkg-config --cflags --libs libturbojpeg) -lpthread
 * Usage:
 *   jpeg_ceiling DIR [--threads T] [--min-seconds S] [--scale 1|1/2|1/4|1/8]
 * Exit status: 0, 1 when a file does not decode, 2 on a usage error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <turbojpeg.h>

struct file {
    char *path;
    unsigned char *data;
    unsigned long size;
    int w, h; /* output size at the chosen scale */
};

static struct file *files;
static size_t nfiles, capfiles;
static uint64_t total_bytes, total_pixels;

struct pass {
    atomic_size_t next;
    atomic_int failed;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int is_jpeg_name(const char *path)
{
    const char *dot = strrchr(path, '.');
    return dot && (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
}

static int add_file(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)ftw;
    if (type != FTW_F || !is_jpeg_name(path) || st->st_size <= 0)
        return 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "jpeg_ceiling: %s: %s\n", path, strerror(errno));
        return 1;
    }
    if (nfiles == capfiles) {
        capfiles = capfiles ? 2 * capfiles : 1024;
        struct file *nf = realloc(files, capfiles * sizeof(*files));
        if (!nf) {
            fclose(f);
            return 1;
        }
        files = nf;
    }
    struct file *x = &files[nfiles];
    x->size = (unsigned long)st->st_size;
    x->data = malloc(x->size);
    const int ok = x->data && fread(x->data, 1, x->size, f) == x->size;
    fclose(f);
    if (!ok) {
        fprintf(stderr, "jpeg_ceiling: %s: short read\n", path);
        free(x->data);
        return 1;
    }
    x->path = strdup(path);
    nfiles++;
    total_bytes += x->size;
    return 0;
}

/* Decodes files claimed from p->next until none is left; one TurboJPEG handle and
 * one output buffer (grown to the largest image) per thread. */
static void *decode_worker(void *arg)
{
    struct pass *p = arg;
    tjhandle tj = tjInitDecompress();
    unsigned char *out = NULL;
    size_t cap = 0;
    if (!tj) {
        atomic_store(&p->failed, 1);
        return NULL;
    }
    for (size_t i; (i = atomic_fetch_add(&p->next, 1)) < nfiles;) {
        const struct file *x = &files[i];
        const size_t need = (size_t)x->w * (size_t)x->h * 3;
        if (need > cap) {
            free(out);
            cap = need;
            out = malloc(cap);
            if (!out) {
                atomic_store(&p->failed, 1);
                break;
            }
        }
        if (tjDecompress2(tj, x->data, x->size, out, x->w, 0, x->h, TJPF_RGB, 0) != 0 &&
            tjGetErrorCode(tj) == TJERR_FATAL) {
            fprintf(stderr, "jpeg_ceiling: %s: %s\n", x->path ? x->path : "?", tjGetErrorStr2(tj));
            atomic_store(&p->failed, 1);
            break;
        }
    }
    free(out);
    tjDestroy(tj);
    return NULL;
}

/* One pass over every file on `threads` threads. 0, or -1 when a decode failed. */
static int run_pass(int threads)
{
    struct pass p;
    pthread_t tid[256];
    atomic_init(&p.next, 0);
    atomic_init(&p.failed, 0);
    for (int t = 0; t < threads; t++)
        if (pthread_create(&tid[t], NULL, decode_worker, &p) != 0) {
            threads = t;
            atomic_store(&p.failed, 1);
            break;
        }
    for (int t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    return atomic_load(&p.failed) ? -1 : 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: jpeg_ceiling DIR [--threads T] [--min-seconds S] [--scale 1|1/2|1/4|1/8]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    long threads = sysconf(_SC_NPROCESSORS_ONLN);
    double min_s = 3.0;
    int num = 1, denom = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--min-seconds") && i + 1 < argc)
            min_s = strtod(argv[++i], NULL);
        else if (!strcmp(argv[i], "--scale") && i + 1 < argc) {
            const char *s = argv[++i];
            if (!strcmp(s, "1"))
                denom = 1;
            else if (!strcmp(s, "1/2") || !strcmp(s, "1/4") || !strcmp(s, "1/8"))
                denom = atoi(s + 2);
            else
                return usage();
        } else if (argv[i][0] != '-' && !dir)
            dir = argv[i];
        else
            return usage();
    }
    if (!dir || threads < 1 || threads > 256 || !(min_s > 0))
        return usage();

    const int walked = nftw(dir, add_file, 32, FTW_PHYS);
    if (walked != 0 || nfiles == 0) {
        fprintf(stderr, "jpeg_ceiling: %s: %s\n", dir,
                walked < 0 ? strerror(errno) : walked ? "could not read every file" : "no .jpg/.jpeg files");
        return 1;
    }
    /* Sizes first, untimed: tjDecompressHeader3 is part of every decode the loader does, but
     * here it only sizes the output buffer. */
    tjhandle tj = tjInitDecompress();
    for (size_t i = 0; i < nfiles; i++) {
        int w, h, sub, cs;
        if (tjDecompressHeader3(tj, files[i].data, files[i].size, &w, &h, &sub, &cs) != 0) {
            fprintf(stderr, "jpeg_ceiling: %s: %s\n", files[i].path ? files[i].path : "?", tjGetErrorStr2(tj));
            return 1;
        }
        files[i].w = TJSCALED(w, ((tjscalingfactor){num, denom}));
        files[i].h = TJSCALED(h, ((tjscalingfactor){num, denom}));
        total_pixels += (uint64_t)w * (uint64_t)h;
    }
    tjDestroy(tj);

    /* One untimed pass: first touch of the output buffers and the decoder's tables. */
    if (run_pass((int)threads) < 0)
        return 1;
    int passes = 0;
    const double t0 = now_s();
    double t1;
    do {
        if (run_pass((int)threads) < 0)
            return 1;
        passes++;
        t1 = now_s();
    } while (t1 - t0 < min_s);

    const double secs = t1 - t0, imgs = (double)nfiles * passes;
    printf("jpeg_ceiling: %zu files, %.1f MB, %.2f Mpixel mean; %d thread%s, %d pass%s in %.2f s: "
           "%.0f images/s, %.1f MB/s compressed, %.1f Mpixel/s (TurboJPEG %s decode to RGB)\n",
           nfiles, (double)total_bytes / 1e6, (double)total_pixels / (double)nfiles / 1e6, (int)threads,
           threads == 1 ? "" : "s", passes, passes == 1 ? "" : "es", secs, imgs / secs,
           (double)total_bytes * passes / 1e6 / secs, (double)total_pixels * passes / 1e6 / secs,
           denom == 1 ? "full-size" : denom == 2 ? "1/2-scale" : denom == 4 ? "1/4-scale" : "1/8-scale");
    printf("{\"mode\":\"jpeg_ceiling\",\"files\":%zu,\"bytes\":%llu,\"pixels\":%llu,\"threads\":%ld,\"scale\":\"%d/%d\","
           "\"passes\":%d,\"seconds\":%.4f,\"images_per_s\":%.1f,\"mb_per_s\":%.2f,\"mpixel_per_s\":%.2f}\n",
           nfiles, (unsigned long long)total_bytes, (unsigned long long)total_pixels, threads, num, denom, passes, secs,
           imgs / secs, (double)total_bytes * passes / 1e6 / secs, (double)total_pixels * passes / 1e6 / secs);
    for (size_t i = 0; i < nfiles; i++) {
        free(files[i].data);
        free(files[i].path);
    }
    free(files);
    return 0;
}
