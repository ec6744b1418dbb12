/*
 * test_synth.c - the synthetic dataset generator (loader/synth.c): file
 * names, sizes and headers exactly as the CIFAR-10/100 binary and MNIST IDX
 * distributions lay them out; every stored record equal to
 * rt_synth_record(); byte-identical output whatever the thread count and
 * different output for another seed; balanced labels; argument errors; and
 * that the data is learnable but not through colour: a nearest-class-mean
 * classifier on translation-invariant spectrum features must beat twice
 * chance, one on the mean colour must not.
 *
 * Writes only under a fresh directory in $TMPDIR or /tmp, removed at the end.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "check.h"
#include "common/common.h"
#include "loader/offline.h"
#include "test_util.h"

#define SEED 7
#define CIFAR_PIXELS 3072
#define MNIST_PIXELS 784

/* ---- helpers ------------------------------------------------------------------ */

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Reads `dir`/`name`; NULL (and a failed check) when it cannot. */
static uint8_t *read_in(const char *dir, const char *name, size_t *len)
{
    char path[4096];
    uint8_t *buf = NULL;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    CHECK_OK(rt_file_read(path, &buf, len));
    return buf;
}

/* Reads and gunzips `dir`/`name`; also returns the raw gzip bytes' header. */
static uint8_t *read_gz(const char *dir, const char *name, size_t *len, uint8_t header[10])
{
    char path[4096];
    size_t cap = 1 << 16, n = 0;
    uint8_t *out;
    gzFile gz;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    CHECKF(f != NULL, "cannot open %s", path);
    if (!f)
        return NULL;
    CHECK(fread(header, 1, 10, f) == 10);
    fclose(f);
    gz = gzopen(path, "rb");
    CHECKF(gz != NULL, "gzopen %s", path);
    if (!gz)
        return NULL;
    out = malloc(cap);
    for (;;) {
        if (n == cap)
            out = realloc(out, cap *= 2);
        int got = gzread(gz, out + n, (unsigned)(cap - n));
        CHECKF(got >= 0, "gzread %s", path);
        if (got <= 0)
            break;
        n += (size_t)got;
    }
    gzclose(gz);
    *len = n;
    return out;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* 1 when the two files exist and hold the same bytes. */
static int same_file(const char *dir_a, const char *dir_b, const char *name)
{
    size_t la = 0, lb = 0;
    uint8_t *a = read_in(dir_a, name, &la), *b = read_in(dir_b, name, &lb);
    int same = a && b && la == lb && memcmp(a, b, la) == 0;
    free(a);
    free(b);
    return same;
}

static int synth(const char *dir, enum rt_synth_format format, uint64_t train, uint64_t test,
                 uint64_t seed, int threads)
{
    struct rt_synth_opts o = {
        .format = format, .train = train, .test = test, .seed = seed, .threads = threads,
    };
    return rt_synth_write(dir, &o);
}

/*
 * Checks `n` stored records against rt_synth_record(): records are `stride`
 * bytes, pixels at `pix_off`, labels as the format stores them. `counts`
 * accumulates the (fine) labels.
 */
static void check_records(enum rt_synth_format format, enum rt_split split, uint64_t first,
                          const uint8_t *data, uint64_t n, size_t stride, size_t pix_off,
                          uint64_t *counts)
{
    const size_t npix = format == RT_SYNTH_MNIST ? MNIST_PIXELS : CIFAR_PIXELS;
    const int classes = format == RT_SYNTH_CIFAR100 ? 100 : 10;
    uint8_t want[CIFAR_PIXELS];
    uint64_t bad_pix = 0, bad_label = 0;

    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *rec = data + i * stride;
        int32_t label = -1;
        rt_synth_record(format, SEED, split, first + i, want, &label);
        int ok = label >= 0 && label < classes;
        if (format == RT_SYNTH_CIFAR100)
            ok = ok && rec[0] == label / 5 && rec[1] == label;
        else if (format == RT_SYNTH_CIFAR10)
            ok = ok && rec[0] == label;
        bad_label += !ok;
        bad_pix += memcmp(rec + pix_off, want, npix) != 0;
        if (ok)
            counts[label]++;
    }
    CHECKF(bad_label == 0, "%llu of %llu labels wrong", (unsigned long long)bad_label,
           (unsigned long long)n);
    CHECKF(bad_pix == 0, "%llu of %llu records differ from rt_synth_record()",
           (unsigned long long)bad_pix, (unsigned long long)n);
}

/* Classes are balanced to within one record (blocks of one per class). */
static void check_balance(const uint64_t *counts, int classes, const char *what)
{
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int c = 0; c < classes; c++) {
        lo = RT_MIN(lo, counts[c]);
        hi = RT_MAX(hi, counts[c]);
    }
    CHECKF(hi - lo <= 1, "%s: class counts range %llu..%llu", what, (unsigned long long)lo,
           (unsigned long long)hi);
}

/* Splits a names file into lines; checks the count and that all are distinct. */
static void check_names(const char *text, size_t len, int want_lines, int trailing_blank,
                        char names[][32])
{
    int lines = 0;
    size_t i = 0;
    while (i < len && text[i] != '\n') {
        size_t j = i;
        while (j < len && text[j] != '\n')
            j++;
        CHECK(j < len && j - i > 0 && j - i < 32);
        if (lines < want_lines && j - i < 32) {
            memcpy(names[lines], text + i, j - i);
            names[lines][j - i] = '\0';
        }
        lines++;
        i = j + 1;
    }
    CHECKF(lines == want_lines, "%d names, want %d", lines, want_lines);
    /* What is left is the original's single empty line, or nothing. */
    CHECKF(len - i == (size_t)(trailing_blank ? 1 : 0) && (!trailing_blank || text[i] == '\n'),
           "%zu bytes after the names", len - i);
    for (int a = 0; a < RT_MIN(lines, want_lines); a++)
        for (int b = a + 1; b < RT_MIN(lines, want_lines); b++)
            CHECKF(strcmp(names[a], names[b]) != 0, "name '%s' twice", names[a]);
}

/* ---- layouts -------------------------------------------------------------------------- */

static void test_cifar10(const char *root)
{
    /* 503 does not divide by 5: the batches hold 101, 101, 101, 100, 100. */
    static const uint64_t batch[5] = {101, 101, 101, 100, 100};
    static const char *const real[] = {"airplane", "automobile", "bird", "cat", "deer",
                                       "dog", "frog", "horse", "ship", "truck"};
    char dir_a[1024], dir_b[1024], dir_c[1024], sub_a[2048], sub_b[2048], sub_c[2048];
    uint64_t counts[10] = {0};
    uint64_t first = 0;

    snprintf(dir_a, sizeof(dir_a), "%s/c10_t1", root);
    snprintf(dir_b, sizeof(dir_b), "%s/c10_t2", root);
    snprintf(dir_c, sizeof(dir_c), "%s/c10_seed", root);
    CHECK_OK(synth(dir_a, RT_SYNTH_CIFAR10, 503, 100, SEED, 1));
    CHECK_OK(synth(dir_b, RT_SYNTH_CIFAR10, 503, 100, SEED, 2));
    CHECK_OK(synth(dir_c, RT_SYNTH_CIFAR10, 503, 100, SEED + 1, 2));
    snprintf(sub_a, sizeof(sub_a), "%s/cifar-10-batches-bin", dir_a);
    snprintf(sub_b, sizeof(sub_b), "%s/cifar-10-batches-bin", dir_b);
    snprintf(sub_c, sizeof(sub_c), "%s/cifar-10-batches-bin", dir_c);

    for (int b = 0; b < 6; b++) {
        char name[64], path[4200];
        uint64_t n = b < 5 ? batch[b] : 100;
        size_t len = 0;
        if (b < 5)
            snprintf(name, sizeof(name), "data_batch_%d.bin", b + 1);
        else
            snprintf(name, sizeof(name), "test_batch.bin");
        snprintf(path, sizeof(path), "%s/%s", sub_a, name);
        CHECKF(file_size(path) == (long)(n * 3073), "%s: %ld bytes", path, file_size(path));
        uint8_t *data = read_in(sub_a, name, &len);
        if (data && len == n * 3073) {
            if (b < 5)
                check_records(RT_SYNTH_CIFAR10, RT_SPLIT_TRAIN, first, data, n, 3073, 1, counts);
            else {
                uint64_t test_counts[10] = {0};
                check_records(RT_SYNTH_CIFAR10, RT_SPLIT_TEST, 0, data, n, 3073, 1, test_counts);
                check_balance(test_counts, 10, "cifar10 test");
            }
        }
        free(data);
        first += b < 5 ? n : 0;
        CHECKF(same_file(sub_a, sub_b, name), "%s differs between 1 and 2 threads", name);
        CHECKF(!same_file(sub_a, sub_c, name), "%s is the same for seeds %d and %d", name, SEED,
               SEED + 1);
    }
    check_balance(counts, 10, "cifar10 train");

    size_t len = 0;
    char names[10][32];
    char *meta = (char *)read_in(sub_a, "batches.meta.txt", &len);
    if (meta) {
        check_names(meta, len, 10, 1, names);
        for (int i = 0; i < 10; i++)
            for (size_t j = 0; j < RT_ARRAY_LEN(real); j++)
                CHECKF(strcmp(names[i], real[j]) != 0, "real CIFAR name '%s' used", real[j]);
    }
    free(meta);
    CHECK(same_file(sub_a, sub_c, "batches.meta.txt"));

    /* No temporary file is left behind. */
    static const char *const files[] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                        "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin",
                                        "batches.meta.txt"};
    for (size_t i = 0; i < RT_ARRAY_LEN(files); i++) {
        char prefix[256];
        snprintf(prefix, sizeof(prefix), "%s.tmp", files[i]);
        CHECKF(tu_count_prefixed(sub_a, prefix) == 0, "%s/%s* left behind", sub_a, prefix);
    }
}

static void test_cifar100(const char *root)
{
    char dir[1024], sub[2048];
    uint64_t counts[100] = {0};
    size_t len = 0;

    snprintf(dir, sizeof(dir), "%s/c100", root);
    CHECK_OK(synth(dir, RT_SYNTH_CIFAR100, 300, 100, SEED, 2));
    snprintf(sub, sizeof(sub), "%s/cifar-100-binary", dir);

    uint8_t *train = read_in(sub, "train.bin", &len);
    CHECKF(len == 300 * 3074, "train.bin: %zu bytes", len);
    if (train && len == 300 * 3074)
        check_records(RT_SYNTH_CIFAR100, RT_SPLIT_TRAIN, 0, train, 300, 3074, 2, counts);
    free(train);
    check_balance(counts, 100, "cifar100 train");
    memset(counts, 0, sizeof(counts));
    uint8_t *test = read_in(sub, "test.bin", &len);
    CHECKF(len == 100 * 3074, "test.bin: %zu bytes", len);
    if (test && len == 100 * 3074)
        check_records(RT_SYNTH_CIFAR100, RT_SPLIT_TEST, 0, test, 100, 3074, 2, counts);
    free(test);
    /* 100 records are exactly one block: every class once. */
    for (int c = 0; c < 100; c++)
        CHECKF(counts[c] == 1, "class %d appears %llu times in 100 test records", c,
               (unsigned long long)counts[c]);

    char fine[100][32], coarse[20][32];
    memset(fine, 0, sizeof(fine));
    memset(coarse, 0, sizeof(coarse));
    char *text = (char *)read_in(sub, "fine_label_names.txt", &len);
    if (text)
        check_names(text, len, 100, 0, fine);
    free(text);
    text = (char *)read_in(sub, "coarse_label_names.txt", &len);
    if (text)
        check_names(text, len, 20, 0, coarse);
    free(text);
    /* Fine class f belongs to coarse class f / 5, and its name says so. */
    for (int f = 0; f < 100; f++) {
        size_t n = strlen(coarse[f / 5]);
        CHECKF(n > 0 && strncmp(fine[f], coarse[f / 5], n) == 0 && fine[f][n] == '_',
               "fine '%s' is not in coarse '%s'", fine[f], coarse[f / 5]);
    }
}

static void check_mnist_split(const char *dir, const char *other, const char *prefix,
                              enum rt_split split, uint32_t n)
{
    char img_name[64], lab_name[64];
    uint8_t hdr[10], hdr2[10];
    size_t ilen = 0, llen = 0;
    uint64_t counts[10] = {0};

    snprintf(img_name, sizeof(img_name), "%s-images-idx3-ubyte.gz", prefix);
    snprintf(lab_name, sizeof(lab_name), "%s-labels-idx1-ubyte.gz", prefix);
    uint8_t *img = read_gz(dir, img_name, &ilen, hdr);
    uint8_t *lab = read_gz(dir, lab_name, &llen, hdr2);
    if (!img || !lab)
        goto out;
    /* A gzip member with no timestamp, so equal data gives equal files. */
    CHECK(hdr[0] == 0x1f && hdr[1] == 0x8b && hdr[2] == 8);
    CHECK(hdr[4] == 0 && hdr[5] == 0 && hdr[6] == 0 && hdr[7] == 0);
    CHECK(hdr2[4] == 0 && hdr2[5] == 0 && hdr2[6] == 0 && hdr2[7] == 0);
    CHECKF(ilen == 16 + (size_t)n * MNIST_PIXELS, "%s: %zu bytes unpacked", img_name, ilen);
    CHECKF(llen == 8 + (size_t)n, "%s: %zu bytes unpacked", lab_name, llen);
    if (ilen != 16 + (size_t)n * MNIST_PIXELS || llen != 8 + (size_t)n)
        goto out;
    CHECK(be32(img) == 0x00000803 && be32(img + 4) == n && be32(img + 8) == 28 &&
          be32(img + 12) == 28);
    CHECK(be32(lab) == 0x00000801 && be32(lab + 4) == n);
    check_records(RT_SYNTH_MNIST, split, 0, img + 16, n, MNIST_PIXELS, 0, counts);
    uint64_t bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t want[MNIST_PIXELS];
        int32_t label;
        rt_synth_record(RT_SYNTH_MNIST, SEED, split, i, want, &label);
        bad += lab[8 + i] != label;
    }
    CHECKF(bad == 0, "%s: %llu labels differ", lab_name, (unsigned long long)bad);
    check_balance(counts, 10, img_name);
    CHECKF(same_file(dir, other, img_name), "%s differs between 1 and 2 threads", img_name);
    CHECKF(same_file(dir, other, lab_name), "%s differs between 1 and 2 threads", lab_name);
out:
    free(img);
    free(lab);
}

static void test_mnist(const char *root)
{
    char dir_a[1024], dir_b[1024];

    snprintf(dir_a, sizeof(dir_a), "%s/mnist_t1", root);
    snprintf(dir_b, sizeof(dir_b), "%s/mnist_t2", root);
    CHECK_OK(synth(dir_a, RT_SYNTH_MNIST, 300, 61, SEED, 1));
    CHECK_OK(synth(dir_b, RT_SYNTH_MNIST, 300, 61, SEED, 2));
    check_mnist_split(dir_a, dir_b, "train", RT_SPLIT_TRAIN, 300);
    check_mnist_split(dir_a, dir_b, "t10k", RT_SPLIT_TEST, 61);
}

static void test_errors(const char *root)
{
    char dir[1024], file[1024];

    snprintf(dir, sizeof(dir), "%s/err", root);
    CHECK_ERR(synth(dir, RT_SYNTH_CIFAR10, 0, 10, SEED, 1), "train");
    CHECK_ERR(synth(dir, RT_SYNTH_CIFAR10, 10, 0, SEED, 1), "test");
    CHECK_ERR(synth(dir, RT_SYNTH_MNIST, 10, 10, SEED, -1), "thread");
    CHECK_ERR(synth(dir, (enum rt_synth_format)7, 10, 10, SEED, 1), "format");
    CHECK(synth(dir, RT_SYNTH_CIFAR10, 0, 10, SEED, 1) == -EINVAL);
    CHECK(rt_synth_write(NULL, &(struct rt_synth_opts){.train = 1, .test = 1}) == -EINVAL);

    /* An output path below a regular file cannot be created; the message
     * names the path. */
    snprintf(file, sizeof(file), "%s/plain_file", root);
    CHECK_OK(rt_file_write_atomic(file, "x", 1));
    snprintf(dir, sizeof(dir), "%s/plain_file/sub", root);
    CHECK_ERR(synth(dir, RT_SYNTH_CIFAR10, 5, 1, SEED, 1), "plain_file");
    CHECK_ERR(synth(dir, RT_SYNTH_MNIST, 5, 1, SEED, 1), "plain_file");
    CHECK_ERR(synth(dir, RT_SYNTH_CIFAR100, 5, 1, SEED, 1), "plain_file");

    uint8_t px[CIFAR_PIXELS];
    int32_t label = 0;
    rt_synth_record((enum rt_synth_format)9, SEED, RT_SPLIT_TRAIN, 0, px, &label);
    CHECK(label == -1);
}

/* Same arguments, same bytes; the labels are shuffled within blocks. */
static void test_record(void)
{
    uint8_t a[CIFAR_PIXELS], b[CIFAR_PIXELS];
    int32_t la, lb;
    int in_order = 0;

    rt_synth_record(RT_SYNTH_CIFAR10, 3, RT_SPLIT_TRAIN, 12345, a, &la);
    rt_synth_record(RT_SYNTH_CIFAR10, 3, RT_SPLIT_TRAIN, 12345, b, &lb);
    CHECK(la == lb && memcmp(a, b, sizeof(a)) == 0);
    rt_synth_record(RT_SYNTH_CIFAR10, 3, RT_SPLIT_TEST, 12345, b, &lb);
    CHECK(memcmp(a, b, sizeof(a)) != 0);
    for (uint64_t blk = 0; blk < 20; blk++) {
        int ordered = 1;
        for (uint64_t i = 0; i < 10; i++) {
            rt_synth_record(RT_SYNTH_CIFAR10, 3, RT_SPLIT_TRAIN, blk * 10 + i, a, &la);
            ordered &= la == (int32_t)i;
        }
        in_order += ordered;
    }
    CHECKF(in_order < 2, "%d of 20 label blocks are in class order", in_order);
}

/* ---- learnability ------------------------------------------------------------------------ */

#define RBINS 6
#define OBINS 6
#define NFEAT (RBINS * OBINS)

/*
 * Translation-, colour- and polarity-invariant features of one image: the
 * power spectrum of its standardised grey levels, binned by radius and
 * orientation (log of the fraction of power per bin).
 */
static void spectrum_features(const uint8_t *chw, int c, int s, float *feat)
{
    enum { MAXS = 32 };
    double g[MAXS][MAXS], re[MAXS][MAXS], im[MAXS][MAXS];
    double bins[NFEAT] = {0};
    double tc[MAXS], ts[MAXS]; /* e^(-2 pi i k / s) */
    double mean = 0, var = 0, total = 0;
    const int half = s / 2;

    for (int y = 0; y < s; y++)
        for (int x = 0; x < s; x++) {
            double v = 0;
            for (int k = 0; k < c; k++)
                v += chw[k * s * s + y * s + x];
            g[y][x] = v / c;
            mean += g[y][x];
        }
    mean /= s * s;
    for (int y = 0; y < s; y++)
        for (int x = 0; x < s; x++) {
            g[y][x] -= mean;
            var += g[y][x] * g[y][x];
        }
    double inv = var > 0 ? 1.0 / sqrt(var / (s * s)) : 0;
    for (int k = 0; k < s; k++) {
        tc[k] = cos(-2 * M_PI * k / s);
        ts[k] = sin(-2 * M_PI * k / s);
    }
    /* Rows first, frequencies 0..s/2 only (real input), then columns. */
    for (int y = 0; y < s; y++)
        for (int kx = 0; kx <= half; kx++) {
            double sr = 0, si = 0;
            for (int x = 0; x < s; x++) {
                int k = kx * x % s;
                sr += g[y][x] * tc[k];
                si += g[y][x] * ts[k];
            }
            re[y][kx] = sr * inv;
            im[y][kx] = si * inv;
        }
    for (int kx = 0; kx <= half; kx++)
        for (int ky = 0; ky < s; ky++) {
            double sr = 0, si = 0;
            for (int y = 0; y < s; y++) {
                int k = ky * y % s;
                sr += re[y][kx] * tc[k] - im[y][kx] * ts[k];
                si += re[y][kx] * ts[k] + im[y][kx] * tc[k];
            }
            int fy = ky <= half ? ky : ky - s;
            if (kx == 0 && fy == 0)
                continue;
            double radius = sqrt((double)kx * kx + (double)fy * fy) / half; /* 0..1.41 */
            double angle = atan2((double)fy, (double)kx);                   /* -pi/2..pi/2 */
            int rb = RT_MIN(RBINS - 1, (int)(radius / 1.0 * RBINS));
            int ob = RT_MIN(OBINS - 1, (int)((angle + M_PI / 2) / M_PI * OBINS));
            double p = sr * sr + si * si;
            bins[rb * OBINS + ob] += p;
            total += p;
        }
    for (int i = 0; i < NFEAT; i++)
        feat[i] = (float)log(1e-6 + bins[i] / (total > 0 ? total : 1));
}

/* Per-channel mean: all that colour alone can tell. */
static void colour_features(const uint8_t *chw, int c, int s, float *feat)
{
    for (int k = 0; k < c; k++) {
        double sum = 0;
        for (int i = 0; i < s * s; i++)
            sum += chw[k * s * s + i];
        feat[k] = (float)(sum / (s * s));
    }
}

/*
 * Nearest-class-mean accuracy on the test split, features z-scored with the
 * training split's statistics. `feat` holds (ntrain + ntest) rows of `d`.
 */
static double nearest_mean_accuracy(const float *feat, const int32_t *label, int ntrain, int ntest,
                                    int d, int classes)
{
    double *mu = calloc((size_t)d, sizeof(double)), *sd = calloc((size_t)d, sizeof(double));
    double *cm = calloc((size_t)classes * d, sizeof(double));
    int *cn = calloc((size_t)classes, sizeof(int));
    int correct = 0;

    for (int i = 0; i < ntrain; i++)
        for (int j = 0; j < d; j++)
            mu[j] += feat[(size_t)i * d + j] / ntrain;
    for (int i = 0; i < ntrain; i++)
        for (int j = 0; j < d; j++) {
            double t = feat[(size_t)i * d + j] - mu[j];
            sd[j] += t * t / ntrain;
        }
    for (int j = 0; j < d; j++)
        sd[j] = sd[j] > 0 ? sqrt(sd[j]) : 1;
    for (int i = 0; i < ntrain; i++) {
        cn[label[i]]++;
        for (int j = 0; j < d; j++)
            cm[(size_t)label[i] * d + j] += (feat[(size_t)i * d + j] - mu[j]) / sd[j];
    }
    for (int k = 0; k < classes; k++)
        for (int j = 0; j < d; j++)
            cm[(size_t)k * d + j] /= cn[k] ? cn[k] : 1;
    for (int i = ntrain; i < ntrain + ntest; i++) {
        int best = -1;
        double best_d = INFINITY;
        for (int k = 0; k < classes; k++) {
            double dist = 0;
            for (int j = 0; j < d; j++) {
                double t = (feat[(size_t)i * d + j] - mu[j]) / sd[j] - cm[(size_t)k * d + j];
                dist += t * t;
            }
            if (dist < best_d) {
                best_d = dist;
                best = k;
            }
        }
        correct += best == label[i];
    }
    free(mu);
    free(sd);
    free(cm);
    free(cn);
    return (double)correct / ntest;
}

static void test_learnable(enum rt_synth_format format, const char *name, int ntrain, int ntest)
{
    const int s = format == RT_SYNTH_MNIST ? 28 : 32, c = format == RT_SYNTH_MNIST ? 1 : 3;
    const int classes = format == RT_SYNTH_CIFAR100 ? 100 : 10;
    const int n = ntrain + ntest;
    float *spec = malloc((size_t)n * NFEAT * sizeof(float));
    float *col = malloc((size_t)n * 3 * sizeof(float));
    int32_t *label = malloc((size_t)n * sizeof(int32_t));
    int32_t *coarse = malloc((size_t)n * sizeof(int32_t));
    uint8_t px[CIFAR_PIXELS];

    for (int i = 0; i < n; i++) {
        enum rt_split split = i < ntrain ? RT_SPLIT_TRAIN : RT_SPLIT_TEST;
        uint64_t index = (uint64_t)(i < ntrain ? i : i - ntrain);
        rt_synth_record(format, SEED, split, index, px, &label[i]);
        coarse[i] = label[i] / 5;
        spectrum_features(px, c, s, spec + (size_t)i * NFEAT);
        colour_features(px, c, s, col + (size_t)i * 3);
    }
    double chance = 1.0 / classes;
    double acc = nearest_mean_accuracy(spec, label, ntrain, ntest, NFEAT, classes);
    printf("%s: nearest class mean on spectrum features: test accuracy %.3f (chance %.3f)\n", name,
           acc, chance);
    CHECKF(acc > 2 * chance, "%s: spectrum accuracy %.3f is not above twice chance", name, acc);
    if (format == RT_SYNTH_CIFAR100) {
        double cacc = nearest_mean_accuracy(spec, coarse, ntrain, ntest, NFEAT, 20);
        printf("%s: coarse (20 classes) accuracy %.3f (chance 0.050)\n", name, cacc);
        CHECKF(cacc > 2 * 0.05, "%s: coarse accuracy %.3f", name, cacc);
    }
    if (c == 3) {
        double cacc = nearest_mean_accuracy(col, label, ntrain, ntest, 3, classes);
        printf("%s: nearest class mean on channel means: test accuracy %.3f (chance %.3f)\n", name,
               cacc, chance);
        /* 1.5x chance for 10 classes is 5 standard errors of 1000 test
         * records above chance; 100 classes need the looser 2x. */
        double limit = (classes == 10 ? 1.5 : 2.0) * chance;
        CHECKF(cacc < limit, "%s: colour alone gives %.3f, the class leaks into colour", name,
               cacc);
    }
    free(spec);
    free(col);
    free(label);
    free(coarse);
}

int main(void)
{
    char root[512];

    printf("seed %d\n", SEED);
    tu_tempdir(root, sizeof(root), "synth");
    test_record();
    test_cifar10(root);
    test_cifar100(root);
    test_mnist(root);
    test_errors(root);
    test_learnable(RT_SYNTH_CIFAR10, "cifar10", 2000, 1000);
    test_learnable(RT_SYNTH_CIFAR100, "cifar100", 5000, 1000);
    test_learnable(RT_SYNTH_MNIST, "mnist", 2000, 1000);
    CHECK_OK(rt_remove_tree(root));
    return check_result();
}
