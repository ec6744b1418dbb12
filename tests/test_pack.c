/*
 * test_pack.c - `pack` from every input kind, read back record by record:
 * raw is bit-exact, jpeg is within a stated PSNR; determinism across thread
 * counts; the seeded validation split; shard sizing; the manifest's
 * per-channel mean/std of the training split; and each class of bad
 * input (truncated, wrong sizes, labels out of range, missing files, corrupt
 * gzip/tar/JPEG, clobbering, disk full) failing with a message that names
 * the file and leaving no dataset behind. Seeds are fixed and printed.
 */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "loader/offline.h"
#include "test_util.h"

#define SEED 11
#define NTRAIN 300
#define NTEST 60

static char root[256];

static void path_of(char *buf, size_t len, const char *rel) { snprintf(buf, len, "%s/%s", root, rel); }

static int exists(const char *rel)
{
    char p[600];
    struct stat st;
    path_of(p, sizeof(p), rel);
    return stat(p, &st) == 0;
}

static int pack_rel(const char *in, const char *out, const struct rt_pack_opts *o)
{
    char pi[600], po[600];
    path_of(pi, sizeof(pi), in);
    path_of(po, sizeof(po), out);
    return rt_pack(pi, po, o, NULL);
}

/* Checks a packed split against the records synth generates. */
static void check_against_synth(const char *out, enum rt_synth_format fmt, enum rt_split split, long want,
                                int coarse)
{
    char p[600];
    uint8_t *px, rec[3072];
    int32_t *lab, label;
    path_of(p, sizeof(p), out);
    long n = tu_read_split(p, split, &px, &lab);
    CHECKF(n == want, "%s: %ld records in %s, expected %ld (%s)", out, n, rt_split_name(split), want, rt_errmsg());
    size_t rb = fmt == RT_SYNTH_MNIST ? 784 : 3072;
    long bad = 0;
    for (long i = 0; i < n && i < want; i++) {
        rt_synth_record(fmt, SEED, split, (uint64_t)i, rec, &label);
        if (coarse)
            label /= 5;
        bad += memcmp(px + rb * (size_t)i, rec, rb) != 0 || lab[i] != label;
    }
    CHECKF(bad == 0, "%s: %ld records differ from the source", out, bad);
    free(px);
    free(lab);
}

static void test_cifar_bin(void)
{
    struct rt_synth_opts so = {.format = RT_SYNTH_CIFAR10, .train = NTRAIN, .test = NTEST, .seed = SEED};
    struct rt_pack_opts po = {.threads = 2};
    char p[600];

    path_of(p, sizeof(p), "c10");
    CHECK_OK(rt_synth_write(p, &so));
    /* The parent directory, and the batches directory itself, both work. */
    CHECK_OK(pack_rel("c10", "c10-raw", &po));
    check_against_synth("c10-raw", RT_SYNTH_CIFAR10, RT_SPLIT_TRAIN, NTRAIN, 0);
    check_against_synth("c10-raw", RT_SYNTH_CIFAR10, RT_SPLIT_TEST, NTEST, 0);
    CHECK_OK(pack_rel("c10/cifar-10-batches-bin", "c10-raw2", &po));
    char a[600], b[600];
    path_of(a, sizeof(a), "c10-raw/train-00000.rts");
    path_of(b, sizeof(b), "c10-raw2/train-00000.rts");
    CHECK(tu_same_file(a, b));

    so.format = RT_SYNTH_CIFAR100;
    path_of(p, sizeof(p), "c100");
    CHECK_OK(rt_synth_write(p, &so));
    CHECK_OK(pack_rel("c100", "c100-fine", &po));
    check_against_synth("c100-fine", RT_SYNTH_CIFAR100, RT_SPLIT_TRAIN, NTRAIN, 0);
    po.label = RT_LABEL_COARSE;
    CHECK_OK(pack_rel("c100", "c100-coarse", &po));
    check_against_synth("c100-coarse", RT_SYNTH_CIFAR100, RT_SPLIT_TEST, NTEST, 1);
    struct rt_dataset *ds;
    path_of(p, sizeof(p), "c100-coarse");
    CHECK_OK(rt_dataset_open(p, &ds));
    if (ds) {
        CHECK(rt_dataset_info(ds)->num_classes == 20);
        rt_dataset_close(ds);
    }
    CHECK_ERR(pack_rel("c10", "c10-coarse", &po), "CIFAR-100 only");
}

/* Writes a tar.gz at `out` (relative) of members[i] <- files[i] (absolute paths). */
static void write_targz(const char *out, const char *const *members, const char *const *files, size_t n)
{
    char dst[600];
    path_of(dst, sizeof(dst), out);
    struct archive *a = archive_write_new();
    archive_write_add_filter_gzip(a);
    archive_write_set_format_pax_restricted(a);
    archive_write_open_filename(a, dst);
    for (size_t i = 0; i < n; i++) {
        uint8_t *data;
        size_t len;
        if (rt_file_read(files[i], &data, &len) < 0)
            continue;
        struct archive_entry *e = archive_entry_new();
        archive_entry_set_pathname(e, members[i]);
        archive_entry_set_size(e, (la_int64_t)len);
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_perm(e, 0644);
        archive_write_header(a, e);
        archive_write_data(a, data, len);
        archive_entry_free(e);
        free(data);
    }
    archive_write_close(a);
    archive_write_free(a);
}

/* A tar.gz of `dir` (relative) with its CIFAR-10 binary files under `prefix/`, `cut` bytes short. */
static void make_targz(const char *dir, const char *prefix, const char *out, size_t cut)
{
    const char *names[] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                           "data_batch_5.bin", "test_batch.bin", "batches.meta.txt"};
    char members[7][300], files[7][700];
    const char *mp[7], *fp[7];
    for (size_t i = 0; i < 7; i++) {
        snprintf(members[i], sizeof(members[i]), "%s/%s", prefix, names[i]);
        snprintf(files[i], sizeof(files[i]), "%s/%s/%s", root, dir, names[i]);
        mp[i] = members[i];
        fp[i] = files[i];
    }
    write_targz(out, mp, fp, 7);
    if (cut) {
        char dst[600];
        struct stat st;
        path_of(dst, sizeof(dst), out);
        stat(dst, &st);
        CHECK(truncate(dst, st.st_size - (off_t)cut) == 0);
    }
}

/*
 * The CIFAR python tarballs as torchvision downloads them, built from the
 * pickle fixtures (tests/fixtures/make_pickle_fixtures.py: data[i][j] =
 * (31 i + 7 j) mod 256, CIFAR-10 labels i mod 10, CIFAR-100 fine (37 i) mod 100).
 */
static void test_python_tarballs(void)
{
    const char *fx = getenv("RT_FIXTURES");
    struct rt_pack_opts po = {.threads = 2};
    char f[8][700], p[600];
    const char *fp[8];
    uint8_t *px;
    int32_t *lab;

    if (!fx) {
        printf("RT_FIXTURES unset: skipping the python tarball cases\n");
        return;
    }
    /* CIFAR-10: five batches from the Python 2 fixture, test from protocol 4, meta from Python 2. */
    const char *m10[] = {"cifar-10-batches-py/data_batch_1", "cifar-10-batches-py/data_batch_2",
                         "cifar-10-batches-py/data_batch_3", "cifar-10-batches-py/data_batch_4",
                         "cifar-10-batches-py/data_batch_5", "cifar-10-batches-py/test_batch",
                         "cifar-10-batches-py/batches.meta"};
    for (int i = 0; i < 7; i++) {
        snprintf(f[i], sizeof(f[i]), "%s/pickle/%s", fx,
                 i < 5 ? "c10_batch_py2.pkl" : i == 5 ? "c10_batch_p4.pkl" : "c10_meta_py2.pkl");
        fp[i] = f[i];
    }
    write_targz("cifar-10-python.tar.gz", m10, fp, 7);
    CHECK_OK(pack_rel("cifar-10-python.tar.gz", "c10py", &po));
    path_of(p, sizeof(p), "c10py");
    long n = tu_read_split(p, RT_SPLIT_TRAIN, &px, &lab);
    CHECK(n == 60);
    long bad = 0;
    for (long r = 0; r < n; r++) {
        long i = r % 12;
        for (int j = 0; j < 3072; j++)
            bad += px[3072 * r + j] != (uint8_t)((i * 31 + j * 7) % 256);
        bad += lab[r] != i % 10;
    }
    CHECKF(bad == 0, "cifar-10-python: %ld wrong bytes or labels", bad);
    free(px);
    free(lab);

    /* CIFAR-100: train and test from the protocol-4 fixture (data shaped (n, 3, 32, 32)), coarse labels. */
    const char *m100[] = {"cifar-100-python/train", "cifar-100-python/test", "cifar-100-python/meta"};
    snprintf(f[0], sizeof(f[0]), "%s/pickle/c100_train_p4.pkl", fx);
    snprintf(f[1], sizeof(f[1]), "%s/pickle/c100_train_p4.pkl", fx);
    snprintf(f[2], sizeof(f[2]), "%s/pickle/c100_meta_p4.pkl", fx);
    write_targz("cifar-100-python.tar.gz", m100, fp, 3);
    po.label = RT_LABEL_COARSE;
    CHECK_OK(pack_rel("cifar-100-python.tar.gz", "c100py", &po));
    path_of(p, sizeof(p), "c100py");
    n = tu_read_split(p, RT_SPLIT_TEST, &px, &lab);
    CHECK(n == 6);
    bad = 0;
    for (long i = 0; i < n; i++) {
        for (int j = 0; j < 3072; j++)
            bad += px[3072 * i + j] != (uint8_t)((i * 31 + j * 7) % 256);
        bad += lab[i] != (i * 37) % 100 / 5;
    }
    CHECKF(bad == 0, "cifar-100-python: %ld wrong bytes or labels", bad);
    free(px);
    free(lab);

    /* A pickle that asks to run os.system is refused, named, and nothing is written. */
    snprintf(f[5], sizeof(f[5]), "%s/pickle/bad_os_system.pkl", fx);
    snprintf(f[0], sizeof(f[0]), "%s/pickle/c10_batch_py2.pkl", fx);
    for (int i = 1; i < 5; i++)
        snprintf(f[i], sizeof(f[i]), "%s", f[0]);
    for (int i = 0; i < 7; i++)
        fp[i] = f[i];
    write_targz("evil.tar.gz", m10, fp, 7);
    po.label = RT_LABEL_FINE;
    CHECK_ERR(pack_rel("evil.tar.gz", "evil", &po), "test_batch");
    CHECK(!exists("evil") && !exists("evil.partial"));
}

static void test_archive(void)
{
    struct rt_pack_opts po = {.threads = 2};
    make_targz("c10/cifar-10-batches-bin", "cifar-10-batches-bin", "c10.tar.gz", 0);
    CHECK_OK(pack_rel("c10.tar.gz", "c10-tar", &po));
    check_against_synth("c10-tar", RT_SYNTH_CIFAR10, RT_SPLIT_TRAIN, NTRAIN, 0);
    check_against_synth("c10-tar", RT_SYNTH_CIFAR10, RT_SPLIT_TEST, NTEST, 0);
    make_targz("c10/cifar-10-batches-bin", "cifar-10-batches-bin", "c10-cut.tar.gz", 5000);
    CHECK_ERR(pack_rel("c10-cut.tar.gz", "c10-cut", &po), "c10-cut.tar.gz");
    CHECK(!exists("c10-cut") && !exists("c10-cut.partial"));
}

static void test_mnist(void)
{
    struct rt_synth_opts so = {.format = RT_SYNTH_MNIST, .train = NTRAIN, .test = NTEST, .seed = SEED};
    struct rt_pack_opts po = {.threads = 2};
    char p[600];
    const char *files[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"};

    path_of(p, sizeof(p), "mnist-gz");
    CHECK_OK(rt_synth_write(p, &so));
    CHECK_OK(pack_rel("mnist-gz", "mnist-a", &po));
    check_against_synth("mnist-a", RT_SYNTH_MNIST, RT_SPLIT_TRAIN, NTRAIN, 0);
    check_against_synth("mnist-a", RT_SYNTH_MNIST, RT_SPLIT_TEST, NTEST, 0);

    /* The same files gunzipped, under torchvision's MNIST/raw/ layout. */
    path_of(p, sizeof(p), "mnist-plain/MNIST/raw");
    CHECK_OK(rt_mkdirs(p, 0755));
    for (size_t i = 0; i < 4; i++) {
        char gz[700], plain[700];
        uint8_t *data, *raw;
        size_t len, rlen;
        snprintf(gz, sizeof(gz), "%s/mnist-gz/%s.gz", root, files[i]);
        snprintf(plain, sizeof(plain), "%s/%s", p, files[i]);
        CHECK_OK(rt_file_read(gz, &data, &len));
        gzFile f = gzopen(gz, "rb");
        raw = malloc(1 << 20);
        rlen = (size_t)gzread(f, raw, 1 << 20);
        gzclose(f);
        CHECK_OK(rt_file_write_atomic(plain, raw, rlen));
        free(data);
        free(raw);
    }
    CHECK_OK(pack_rel("mnist-plain", "mnist-b", &po));
    char a[600], b[600];
    path_of(a, sizeof(a), "mnist-a/train-00000.rts");
    path_of(b, sizeof(b), "mnist-b/train-00000.rts");
    CHECK(tu_same_file(a, b));

    /* Bad IDX: wrong magic, lying dimensions, count mismatch, corrupt gzip. */
    char f[700];
    uint8_t *data;
    size_t len;
    snprintf(f, sizeof(f), "%s/t10k-images-idx3-ubyte", p);
    CHECK_OK(rt_file_read(f, &data, &len));
    data[2] = 0x0d; /* float elements */
    CHECK_OK(rt_file_write_atomic(f, data, len));
    CHECK_ERR(pack_rel("mnist-plain", "mnist-bad", &po), "t10k-images-idx3-ubyte: offset 2");
    data[2] = 0x08;
    data[7] = (uint8_t)(data[7] + 1); /* one more image than there are bytes for */
    CHECK_OK(rt_file_write_atomic(f, data, len));
    CHECK_ERR(pack_rel("mnist-plain", "mnist-bad", &po), "truncated");
    data[7] = (uint8_t)(data[7] - 2); /* one fewer: now images and labels disagree (and extra bytes) */
    CHECK_OK(rt_file_write_atomic(f, data, len - 784 * 1));
    CHECK_ERR(pack_rel("mnist-plain", "mnist-bad", &po), "labels");
    free(data);
    snprintf(f, sizeof(f), "%s/mnist-gz/train-labels-idx1-ubyte.gz", root);
    CHECK_OK(rt_file_read(f, &data, &len));
    CHECK_OK(rt_file_write_atomic(f, data, len / 2));
    CHECK_ERR(pack_rel("mnist-gz", "mnist-bad", &po), "train-labels-idx1-ubyte.gz");
    free(data);
    CHECK(!exists("mnist-bad"));
}

/* Writes synth CIFAR-10 records as JPEG files into dir/<class>/. Returns files written. */
static int make_folder(const char *dir, int n, int quality)
{
    tjhandle tj = tjInitCompress();
    int written = 0;
    for (int i = 0; i < n; i++) {
        uint8_t chw[3072], hwc[3072];
        int32_t label;
        unsigned char *jpeg = NULL;
        unsigned long jlen = 0;
        char p[700];
        rt_synth_record(RT_SYNTH_CIFAR10, SEED, RT_SPLIT_TRAIN, (uint64_t)i, chw, &label);
        for (int k = 0; k < 1024; k++)
            for (int c = 0; c < 3; c++)
                hwc[3 * k + c] = chw[c * 1024 + k];
        tjCompress2(tj, hwc, 32, 0, 32, TJPF_RGB, &jpeg, &jlen, TJSAMP_420, quality, 0);
        snprintf(p, sizeof(p), "%s/%s/class%02d", root, dir, (int)label);
        rt_mkdirs(p, 0755);
        snprintf(p, sizeof(p), "%s/%s/class%02d/img%04d.jpg", root, dir, (int)label, i);
        written += rt_file_write_atomic(p, jpeg, jlen) == 0;
        tjFree(jpeg);
    }
    tjDestroy(tj);
    return written;
}

static double psnr(const uint8_t *a, const uint8_t *b, size_t n)
{
    double se = 0;
    for (size_t i = 0; i < n; i++)
        se += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return se == 0 ? 99.0 : 10 * log10(255.0 * 255.0 / (se / (double)n));
}

static void test_folder_and_jpeg(void)
{
    struct rt_pack_opts po = {.threads = 2};
    char p[600];
    uint8_t *px, *px2, rec[3072];
    int32_t *lab, *lab2, label;

    CHECK(make_folder("folder", 120, 95) == 120);
    /* raw from JPEG files: equal to decoding the files; jpeg pass-through: the same pixels. */
    CHECK_OK(pack_rel("folder", "folder-raw", &po));
    po.codec = RT_CODEC_JPEG;
    CHECK_OK(pack_rel("folder", "folder-jpeg", &po));
    path_of(p, sizeof(p), "folder-raw");
    long n = tu_read_split(p, RT_SPLIT_TRAIN, &px, &lab);
    path_of(p, sizeof(p), "folder-jpeg");
    long n2 = tu_read_split(p, RT_SPLIT_TRAIN, &px2, &lab2);
    CHECK(n == 120 && n2 == 120);
    CHECK(n == n2 && memcmp(px, px2, 3072 * (size_t)n) == 0 && memcmp(lab, lab2, 4 * (size_t)n) == 0);
    /* Files are listed class by class in sorted order: labels never decrease. */
    int sorted = 1;
    for (long i = 1; i < n; i++)
        sorted &= lab[i] >= lab[i - 1];
    CHECK(sorted);
    free(px);
    free(lab);
    free(px2);
    free(lab2);

    /* jpeg codec from raw pixels at quality 90: mean PSNR >= 29 dB, every record >= 28 dB on the
     * synthetic data, whose per-pixel noise is the hardest case for JPEG (docs/FORMAT.md). */
    po.quality = 90;
    CHECK_OK(pack_rel("c10", "c10-jpeg", &po));
    path_of(p, sizeof(p), "c10-jpeg");
    n = tu_read_split(p, RT_SPLIT_TRAIN, &px, &lab);
    CHECK(n == NTRAIN);
    double worst = 99, sum = 0;
    int labels_ok = 1;
    for (long i = 0; i < n; i++) {
        rt_synth_record(RT_SYNTH_CIFAR10, SEED, RT_SPLIT_TRAIN, (uint64_t)i, rec, &label);
        double q = psnr(px + 3072 * (size_t)i, rec, 3072);
        worst = RT_MIN(worst, q);
        sum += q;
        labels_ok &= lab[i] == label;
    }
    printf("jpeg q90 round trip: mean PSNR %.1f dB, worst %.1f dB over %ld records\n", sum / (double)n, worst, n);
    CHECK(worst >= 28.0);
    CHECK(sum / (double)n >= 29.0);
    CHECK(labels_ok);
    free(px);
    free(lab);

    /* Nested train/test layout. */
    CHECK(make_folder("nested/train", 60, 90) == 60);
    CHECK(make_folder("nested/test", 20, 90) == 20);
    po = (struct rt_pack_opts){.threads = 2};
    CHECK_OK(pack_rel("nested", "nested-ds", &po));
    struct rt_dataset *ds;
    path_of(p, sizeof(p), "nested-ds");
    CHECK_OK(rt_dataset_open(p, &ds));
    if (ds) {
        CHECK(rt_dataset_info(ds)->split[RT_SPLIT_TRAIN].records == 60);
        CHECK(rt_dataset_info(ds)->split[RT_SPLIT_TEST].records == 20);
        rt_dataset_close(ds);
    }

    /* A corrupt JPEG is named; so is one of another size. */
    char f[700];
    snprintf(f, sizeof(f), "%s/folder/class03/bad.jpg", root);
    CHECK_OK(rt_file_write_atomic(f, "\xff\xd8\xff\xe0garbage", 12));
    CHECK_ERR(pack_rel("folder", "folder-bad", &po), "bad.jpg");
    unlink(f);
    tjhandle tj = tjInitCompress();
    uint8_t big[48 * 48 * 3] = {0};
    unsigned char *jpeg = NULL;
    unsigned long jlen = 0;
    tjCompress2(tj, big, 48, 0, 48, TJPF_RGB, &jpeg, &jlen, TJSAMP_444, 90, 0);
    snprintf(f, sizeof(f), "%s/folder/class05/zz-big.jpg", root);
    CHECK_OK(rt_file_write_atomic(f, jpeg, jlen));
    tjFree(jpeg);
    tjDestroy(tj);
    CHECK_ERR(pack_rel("folder", "folder-bad", &po), "zz-big.jpg");
    CHECK(strstr(rt_errmsg(), "48x48") != NULL);
    unlink(f);
    CHECK(!exists("folder-bad") && !exists("folder-bad.partial"));
    path_of(p, sizeof(p), "empty-folder/a");
    rt_mkdirs(p, 0755);
    CHECK_ERR(pack_rel("empty-folder", "x", &po), "no image files");
}

/* All files of two dataset directories are byte-identical. */
static int same_dataset(const char *a, const char *b)
{
    struct rt_dataset *ds;
    char pa[600], pb[600];
    int same = 1;
    path_of(pa, sizeof(pa), a);
    if (rt_dataset_open(pa, &ds) < 0)
        return 0;
    const struct rt_dataset_info *info = rt_dataset_info(ds);
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++)
        for (uint32_t i = 0; i < info->split[sp].nshards; i++) {
            snprintf(pa, sizeof(pa), "%s/%s/%s", root, a, info->split[sp].shards[i].file);
            snprintf(pb, sizeof(pb), "%s/%s/%s", root, b, info->split[sp].shards[i].file);
            same &= tu_same_file(pa, pb);
        }
    snprintf(pa, sizeof(pa), "%s/%s/manifest.json", root, a);
    snprintf(pb, sizeof(pb), "%s/%s/manifest.json", root, b);
    same &= tu_same_file(pa, pb);
    rt_dataset_close(ds);
    return same;
}

static void test_determinism_and_shards(void)
{
    struct rt_pack_opts one = {.threads = 1, .shard_bytes = 200000, .block_records = 10};
    struct rt_pack_opts four = one;
    four.threads = 4;
    CHECK_OK(pack_rel("c10", "det-1", &one));
    CHECK_OK(pack_rel("c10", "det-4", &four));
    CHECK(same_dataset("det-1", "det-4"));
    one.codec = four.codec = RT_CODEC_JPEG;
    CHECK_OK(pack_rel("c10", "detj-1", &one));
    CHECK_OK(pack_rel("c10", "detj-4", &four));
    CHECK(same_dataset("detj-1", "detj-4"));

    /* Small shards: several of them, each within the target (one block over at most), records contiguous. */
    struct rt_dataset *ds;
    char p[600];
    path_of(p, sizeof(p), "det-1");
    CHECK_OK(rt_dataset_open(p, &ds));
    if (ds) {
        const struct rt_split_info *si = &rt_dataset_info(ds)->split[RT_SPLIT_TRAIN];
        CHECKF(si->nshards >= 4, "%u shards", si->nshards);
        uint64_t next = 0;
        for (uint32_t i = 0; i < si->nshards; i++) {
            CHECK(si->shards[i].first_record == next);
            CHECK(si->shards[i].bytes < 200000 + 40000);
            next += si->shards[i].records;
        }
        CHECK(next == NTRAIN);
        rt_dataset_close(ds);
    }
    check_against_synth("det-1", RT_SYNTH_CIFAR10, RT_SPLIT_TRAIN, NTRAIN, 0);
}

static void test_val_split(void)
{
    struct rt_pack_opts po = {.threads = 2, .val_split = 0.1, .split_seed = 5};
    uint8_t *tp, *vp, rec[3072];
    int32_t *tl, *vl, label;
    char p[600];

    CHECK_OK(pack_rel("c10", "split-a", &po));
    CHECK_OK(pack_rel("c10", "split-b", &po));
    CHECK(same_dataset("split-a", "split-b"));
    path_of(p, sizeof(p), "split-a");
    long nt = tu_read_split(p, RT_SPLIT_TRAIN, &tp, &tl);
    long nv = tu_read_split(p, RT_SPLIT_VAL, &vp, &vl);
    CHECK(nv == 30 && nt == NTRAIN - 30);
    /* Train and val partition the original training set, each in source order. */
    int *seen = calloc(NTRAIN, sizeof(int));
    long ti = 0, vi = 0, missing = 0;
    for (long i = 0; i < NTRAIN; i++) {
        rt_synth_record(RT_SYNTH_CIFAR10, SEED, RT_SPLIT_TRAIN, (uint64_t)i, rec, &label);
        if (ti < nt && !memcmp(tp + 3072 * (size_t)ti, rec, 3072) && tl[ti] == label)
            ti++;
        else if (vi < nv && !memcmp(vp + 3072 * (size_t)vi, rec, 3072) && vl[vi] == label)
            vi++;
        else
            missing++;
    }
    CHECKF(missing == 0 && ti == nt && vi == nv, "missing %ld, train %ld/%ld, val %ld/%ld", missing, ti, nt, vi, nv);
    free(seen);
    /* Another seed picks another subset. */
    po.split_seed = 6;
    CHECK_OK(pack_rel("c10", "split-c", &po));
    uint8_t *vp2;
    int32_t *vl2;
    path_of(p, sizeof(p), "split-c");
    CHECK(tu_read_split(p, RT_SPLIT_VAL, &vp2, &vl2) == 30);
    CHECK(memcmp(vp, vp2, 3072 * 30) != 0);
    free(tp), free(tl), free(vp), free(vl), free(vp2), free(vl2);
    po.val_split = 0.9999;
    CHECK_ERR(pack_rel("c10", "split-d", &po), "leaves no training records");
}

/* The norm statistics of one dataset, as its manifest gives them. */
struct norm {
    int have;
    uint32_t channels;
    float mean[4], std[4];
};

static struct norm norm_of(const char *rel)
{
    struct norm n = {0};
    struct rt_dataset *ds;
    char p[600];
    path_of(p, sizeof(p), rel);
    if (rt_dataset_open(p, &ds) == 0) {
        const struct rt_dataset_info *info = rt_dataset_info(ds);
        n.have = info->have_norm;
        n.channels = info->channels;
        memcpy(n.mean, info->mean, sizeof(n.mean));
        memcpy(n.std, info->std, sizeof(n.std));
        rt_dataset_close(ds);
    }
    return n;
}

/*
 * The manifest's mean/std of `rel` against the training records read back
 * and decoded: exactly the values of the exact integer sums (as pack forms
 * them, docs/FORMAT.md), and within 1e-9 of a plain two-pass computation.
 */
static void check_norm(const char *rel)
{
    char p[600];
    uint8_t *px = NULL;
    int32_t *lab = NULL;
    struct norm got = norm_of(rel);

    path_of(p, sizeof(p), rel);
    long n = tu_read_split(p, RT_SPLIT_TRAIN, &px, &lab);
    CHECKF(n > 0 && got.have, "%s: %ld training records, have_norm %d", rel, n, got.have);
    if (n <= 0 || !got.have) {
        free(px);
        free(lab);
        return;
    }
    const size_t plane = got.channels == 1 ? 784 : 1024, rec = plane * got.channels;
    const double cnt = (double)n * (double)plane;
    for (uint32_t c = 0; c < got.channels; c++) {
        uint64_t sum = 0, sq = 0;
        for (long r = 0; r < n; r++)
            for (size_t i = 0; i < plane; i++) {
                uint64_t v = px[rec * (size_t)r + c * plane + i];
                sum += v;
                sq += v * v;
            }
        unsigned __int128 var = (unsigned __int128)(uint64_t)cnt * sq - (unsigned __int128)sum * sum;
        double mean = (double)sum / (cnt * 255.0), std = sqrt((double)var) / (cnt * 255.0);
        double dev = 0;
        for (long r = 0; r < n; r++)
            for (size_t i = 0; i < plane; i++) {
                double d = px[rec * (size_t)r + c * plane + i] / 255.0 - mean;
                dev += d * d;
            }
        CHECKF(got.mean[c] == (float)mean && got.std[c] == (float)std,
               "%s: channel %u: mean %.9g std %.9g, want %.9g %.9g", rel, c, (double)got.mean[c],
               (double)got.std[c], mean, std);
        CHECKF(fabs(sqrt(dev / cnt) - std) < 1e-9, "%s: channel %u: std %.12g, two-pass %.12g", rel, c, std,
               sqrt(dev / cnt));
        printf("%s: channel %u: mean %.4f std %.4f over %ld training records\n", rel, c, mean, std, n);
    }
    for (uint32_t c = got.channels; c < 4; c++)
        CHECK(got.mean[c] == 0 && got.std[c] == 0);
    free(px);
    free(lab);
}

/* Replaces the first `from` in `text` with `to`; the result is malloc'd. */
static char *replace(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    if (!at)
        return NULL;
    size_t pre = (size_t)(at - text), fl = strlen(from), tl = strlen(to), len = strlen(text);
    char *m = malloc(len - fl + tl + 1);
    memcpy(m, text, pre);
    memcpy(m + pre, to, tl);
    memcpy(m + pre + tl, at + fl, len - pre - fl + 1);
    return m;
}

/* Per-channel mean/std of the training split in the manifest (packed by the earlier tests). */
static void test_norm_stats(void)
{
    /* Raw and jpeg, CIFAR-10 (3 channels) and MNIST (1), pass-through JPEG files, a val split. */
    const char *sets[] = {"det-1", "detj-1", "mnist-a", "folder-raw", "folder-jpeg", "split-a", "c100-coarse"};
    for (size_t i = 0; i < RT_ARRAY_LEN(sets); i++)
        check_norm(sets[i]);

    /* Thread count changes nothing; the same pixels give the same statistics whatever the codec. */
    struct norm one = norm_of("det-1"), four = norm_of("det-4"), j1 = norm_of("detj-1"), j4 = norm_of("detj-4");
    CHECK(one.have && four.have && !memcmp(&one, &four, sizeof(one)));
    CHECK(j1.have && j4.have && !memcmp(&j1, &j4, sizeof(j1)));
    struct norm fr = norm_of("folder-raw"), fj = norm_of("folder-jpeg");
    CHECK(fr.have && !memcmp(&fr, &fj, sizeof(fr)));
    /* Only training records count: carving out val changes the values. */
    struct norm sa = norm_of("split-a");
    CHECK(memcmp(sa.mean, one.mean, sizeof(sa.mean)) != 0);
    /* JPEG's loss shifts the statistics a little, not a lot. */
    for (int c = 0; c < 3; c++)
        CHECKF(fabsf(j1.mean[c] - one.mean[c]) < 0.01f && fabsf(j1.std[c] - one.std[c]) < 0.01f,
               "channel %d: jpeg %g/%g, raw %g/%g", c, (double)j1.mean[c], (double)j1.std[c], (double)one.mean[c],
               (double)one.std[c]);

    /* Older manifests without the fields load with have_norm = 0; bad values are refused by name. */
    char p[600];
    uint8_t *text;
    size_t len;
    struct rt_dataset *ds = NULL;
    path_of(p, sizeof(p), "det-1/manifest.json");
    CHECK_OK(rt_file_read(p, &text, &len));
    const char *t = (const char *)text;
    const char *ms = strstr(t, "  \"mean\""), *me = ms ? strstr(ms, "\"num_classes\"") : NULL;
    CHECK(ms && me);
    if (!ms || !me) {
        free(text);
        return;
    }
    char *old = malloc(len + 1);
    memcpy(old, t, (size_t)(ms - t));
    strcpy(old + (ms - t), me - 2);
    CHECK_OK(rt_dataset_parse_manifest("d", old, strlen(old), "old.json", &ds));
    CHECK(ds && !rt_dataset_info(ds)->have_norm && rt_dataset_info(ds)->mean[0] == 0);
    rt_dataset_close(ds);
    free(old);
    struct {
        const char *from, *to, *needle;
    } muts[] = {
        {"\"mean\": [\n    0.", "\"mean\": [\n    -0.", "\"mean\"[0] is not a number in [0, 1]"},
        {"\"mean\": [\n    0.", "\"mean\": [\n    \"0\", 0.", "\"mean\" must be an array of 3 numbers"},
        {"\"mean\": [\n    0.", "\"mean\": [\n    \"x\", 0.", "\"mean\" must be an array of 3 numbers"},
        {"\"std\": [\n    0.", "\"std\": [\n    0.7, 0.", "\"std\" must be an array of 3 numbers"},
        {"\"std\": [\n    0.", "\"std\": [\n    7", "\"std\"[0] is not a number in [0, 0.5]"},
        {"\"std\": [", "\"sd\": [", "\"mean\" without \"std\""},
        {"\"mean\": [", "\"man\": [", "\"std\" without \"mean\""},
        {"\"mean\": [", "\"std\": 1, \"mean\": [", "duplicate"},
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(muts); i++) {
        char *m = replace(t, muts[i].from, muts[i].to);
        CHECKF(m != NULL, "mutation %zu: '%s' not in the manifest", i, muts[i].from);
        if (!m)
            continue;
        CHECK_ERR(rt_dataset_parse_manifest("d", m, strlen(m), "m.json", &ds), muts[i].needle);
        CHECK(strstr(rt_errmsg(), "m.json") != NULL);
        free(m);
    }
    free(text);
}

static void test_bad_cifar(void)
{
    struct rt_pack_opts po = {.threads = 2};
    char dir[600], f[700];
    uint8_t *data;
    size_t len;

    path_of(dir, sizeof(dir), "badc10/cifar-10-batches-bin");
    CHECK_OK(rt_mkdirs(dir, 0755));
    const char *names[] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                           "data_batch_5.bin", "test_batch.bin"};
    for (size_t i = 0; i < 6; i++) {
        char s[700];
        snprintf(s, sizeof(s), "%s/c10/cifar-10-batches-bin/%s", root, names[i]);
        snprintf(f, sizeof(f), "%s/%s", dir, names[i]);
        CHECK_OK(rt_file_read(s, &data, &len));
        CHECK_OK(rt_file_write_atomic(f, data, len));
        free(data);
    }
    /* No batches.meta.txt: packs, with generated class names. */
    CHECK_OK(pack_rel("badc10", "badc10-ok", &po));

    snprintf(f, sizeof(f), "%s/data_batch_3.bin", dir);
    CHECK_OK(rt_file_read(f, &data, &len));
    /* Truncated: a partial last record. */
    CHECK_OK(rt_file_write_atomic(f, data, len - 100));
    CHECK_ERR(pack_rel("badc10", "badc10-x", &po), "data_batch_3.bin");
    CHECK(strstr(rt_errmsg(), "3073-byte records") != NULL);
    /* Label out of range in record 2. */
    data[2 * 3073] = 10;
    CHECK_OK(rt_file_write_atomic(f, data, len));
    CHECK_ERR(pack_rel("badc10", "badc10-x", &po), "data_batch_3.bin: record 2 (offset 6146)");
    /* Missing file. */
    unlink(f);
    CHECK_ERR(pack_rel("badc10", "badc10-x", &po), "data_batch_3.bin: missing");
    free(data);
    CHECK(!exists("badc10-x") && !exists("badc10-x.partial"));
    CHECK_ERR(pack_rel("does-not-exist", "x", &po), "does-not-exist");
    path_of(f, sizeof(f), "notdata.txt");
    CHECK_OK(rt_file_write_atomic(f, "hello\n", 6));
    CHECK_ERR(pack_rel("notdata.txt", "x", &po), "notdata.txt");
}

static void test_clobber(void)
{
    struct rt_pack_opts po = {.threads = 2};
    char p[600];

    /* An existing dataset is kept unless --force; a foreign non-empty directory always. */
    CHECK_ERR(pack_rel("c10", "c10-raw", &po), "--force");
    po.force = 1;
    po.codec = RT_CODEC_JPEG;
    CHECK_OK(pack_rel("c10", "c10-raw", &po));
    struct rt_dataset *ds;
    path_of(p, sizeof(p), "c10-raw");
    CHECK_OK(rt_dataset_open(p, &ds));
    if (ds) {
        CHECK(rt_dataset_info(ds)->codec == RT_CODEC_JPEG);
        rt_dataset_close(ds);
    }
    CHECK(!exists("c10-raw.replaced") && !exists("c10-raw.partial"));
    path_of(p, sizeof(p), "mine/notes.txt");
    rt_mkdirs(p, 0755);
    rmdir(p);
    CHECK_OK(rt_file_write_atomic(p, "keep me", 7));
    CHECK_ERR(pack_rel("c10", "mine", &po), "not empty");
    CHECK(exists("mine/notes.txt"));
    /* An empty directory is fine as a target, and survives a failed pack. */
    path_of(p, sizeof(p), "emptyout");
    CHECK_OK(rt_mkdirs(p, 0755));
    CHECK_ERR(pack_rel("does-not-exist", "emptyout", &po), "does-not-exist");
    CHECK(exists("emptyout"));
    CHECK_OK(pack_rel("c10", "emptyout", &po));
    CHECK(exists("emptyout/manifest.json"));
}

/*
 * Disk full, simulated with RLIMIT_FSIZE in a child: a clear error and
 * nothing left behind. Shards are written on a thread of their own: with one
 * shard the failure is found at the end of the pack, with small shards at
 * the next shard's hand-over, the workers still encoding.
 */
static void test_disk_full(void)
{
    const uint64_t shard_bytes[] = {0, 300000};
    for (int k = 0; k < 2; k++) {
        pid_t pid = fork();
        if (pid == 0) {
            struct rlimit rl = {150000, 150000};
            signal(SIGXFSZ, SIG_IGN);
            setrlimit(RLIMIT_FSIZE, &rl);
            struct rt_pack_opts po = {.threads = 2, .shard_bytes = shard_bytes[k]};
            int rc = pack_rel("c10", "full", &po);
            fprintf(stderr, "pack under a 150 kB file size limit, shards of %" PRIu64 " B: rc %d: %s\n",
                    shard_bytes[k], rc, rt_errmsg());
            _exit(rc < 0 && (rc == -EFBIG || rc == -ENOSPC) && strstr(rt_errmsg(), "write failed") ? 0 : 1);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        CHECK(!exists("full") && !exists("full.partial"));
    }
}

/*
 * An unreadable class folder is named in the error. Permissions do not stop
 * root, so as root the pack runs in a child that has become `nobody`.
 */
static void test_unreadable(void)
{
    char dir[300], cls[400];

    tu_tempdir(dir, sizeof(dir), "unread");
    chmod(dir, 0755);
    snprintf(cls, sizeof(cls), "%s/in/locked", dir);
    CHECK_OK(rt_mkdirs(cls, 0755));
    chmod(cls, 0);
    pid_t pid = fork();
    if (pid == 0) {
        if (geteuid() == 0 && (setgid(65534) < 0 || setuid(65534) < 0))
            _exit(2);
        char in[400], out[400];
        struct rt_pack_opts po = {.threads = 1};
        snprintf(in, sizeof(in), "%s/in", dir);
        snprintf(out, sizeof(out), "%s/out", dir);
        int rc = rt_pack(in, out, &po, NULL);
        fprintf(stderr, "pack of an unreadable folder: rc %d: %s\n", rc, rt_errmsg());
        _exit(rc == -EACCES && strstr(rt_errmsg(), "locked: cannot read directory") ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    chmod(cls, 0755);
    rt_remove_tree(dir);
}

int main(void)
{
    tu_tempdir(root, sizeof(root), "pack");
    printf("test_pack: synth seed %d in %s\n", SEED, root);
    test_cifar_bin();
    test_archive();
    test_python_tarballs();
    test_mnist();
    test_folder_and_jpeg();
    test_determinism_and_shards();
    test_val_split();
    test_norm_stats();
    test_bad_cifar();
    test_clobber();
    test_disk_full();
    test_unreadable();
    int rc = check_result();
    if (rc == 0)
        rt_remove_tree(root);
    return rc;
}
