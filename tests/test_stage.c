/*
 * test_stage.c - node-local dataset staging through its library API
 * (rt_local_copy_dataset): where the copy goes (named by the manifest's XXH64,
 * recomputed here), byte-identical results with io_uring, with read/write,
 * with the automatic fallback when io_uring is unavailable, and across queue
 * depths and block sizes; the progress callback (every block of every file
 * copied, in order, from the calling thread; nothing when nothing is copied);
 * the counters of an idempotent second run, of a damaged staged file and of
 * a damaged source; a staged copy given as its own source; the lock timeout;
 * manifests that name files staging cannot honour; bad options. The
 * process-level cases (concurrent ranks, kill -9, disk full) are in
 * test_stage.sh.
 *
 * The fallback is tested by interposing io_uring_queue_init() below: when
 * `fake_no_uring` is set it fails with -ENOSYS, as it does under a seccomp
 * filter or with io_uring disabled by sysctl; otherwise it calls liburing's.
 * (This relies on liburing being linked as a shared library, which is what
 * its pkg-config file gives.)
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "check.h"
#include "staging/local_copy.h"
#include "test_util.h"

#define SEED 5

static char root[256];
static int fake_no_uring;

int io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags)
{
    typedef int (*init_fn)(unsigned, struct io_uring *, unsigned);
    static init_fn real;

    if (fake_no_uring)
        return -ENOSYS;
    if (!real)
        real = (init_fn)dlsym(RTLD_NEXT, "io_uring_queue_init");
    return real ? real(entries, ring, flags) : -ENOSYS;
}

static void path_of(char *buf, size_t len, const char *rel) { snprintf(buf, len, "%s/%s", root, rel); }

/* Names of the dataset's files (shards, then manifest.json); returns the count. */
static int dataset_files(const char *dir, char names[][64], int max)
{
    struct rt_dataset *ds;
    int n = 0;
    if (rt_dataset_open(dir, &ds) < 0)
        return -1;
    const struct rt_dataset_info *info = rt_dataset_info(ds);
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++)
        for (uint32_t i = 0; i < info->split[sp].nshards && n < max - 1; i++)
            snprintf(names[n++], 64, "%s", info->split[sp].shards[i].file);
    snprintf(names[n++], 64, "manifest.json");
    rt_dataset_close(ds);
    return n;
}

/* 1 if `dest` holds exactly the files of dataset `src`, byte for byte, and nothing else. */
static int same_dataset(const char *src, const char *dest)
{
    char names[64][64], a[4200], b[4200];
    int n = dataset_files(src, names, 64), entries = 0;
    DIR *d = opendir(dest);
    struct dirent *e;

    if (n <= 0 || !d) {
        if (d)
            closedir(d);
        return 0;
    }
    while ((e = readdir(d)))
        entries += e->d_name[0] != '.';
    closedir(d);
    if (entries != n) {
        fprintf(stderr, "%s: %d entries, expected %d\n", dest, entries, n);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        snprintf(a, sizeof(a), "%s/%s", src, names[i]);
        snprintf(b, sizeof(b), "%s/%s", dest, names[i]);
        if (!tu_same_file(a, b)) {
            fprintf(stderr, "%s differs from %s\n", b, a);
            return 0;
        }
    }
    return 1;
}

static uint64_t file_xxh64(const char *path)
{
    uint8_t *buf;
    size_t len;
    if (rt_file_read(path, &buf, &len) < 0)
        return 0;
    uint64_t h = XXH64(buf, len, 0);
    free(buf);
    return h;
}

/* Flips the bits of the byte at `off` in `path`. */
static void flip_byte(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    uint8_t b = 0;
    CHECK(fd >= 0 && pread(fd, &b, 1, off) == 1);
    b ^= 0xff;
    CHECK(fd >= 0 && pwrite(fd, &b, 1, off) == 1);
    if (fd >= 0)
        close(fd);
}

static ino_t inode_of(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_ino : 0;
}

static int stage_to(const char *src_rel, const char *parent_rel, struct rt_local_copy_opts o,
                    struct rt_local_copy_result *r)
{
    char src[600], parent[600];
    path_of(src, sizeof(src), src_rel);
    path_of(parent, sizeof(parent), parent_rel);
    o.parent = parent;
    return rt_local_copy_dataset(src, &o, r);
}

static void make_dataset(void)
{
    char src[600], ds[600];
    struct rt_synth_opts so = {.format = RT_SYNTH_CIFAR10, .train = 600, .test = 100, .seed = SEED, .threads = 1};
    struct rt_pack_opts po = {.shard_bytes = 256 << 10, .threads = 1};
    path_of(src, sizeof(src), "src");
    path_of(ds, sizeof(ds), "ds");
    CHECK_OK(rt_synth_write(src, &so));
    CHECK_OK(rt_pack(src, ds, &po, NULL));
}

/* The destination is PARENT/ringtrain-<XXH64(manifest.json)>, absolute, with counters that add up. */
static void test_first_copy_and_naming(int have_uring)
{
    char ds[600], mpath[700], want[900], dest[4096], parent[600];
    struct rt_local_copy_result r;
    struct rt_local_copy_opts o = {0};

    path_of(ds, sizeof(ds), "ds");
    path_of(parent, sizeof(parent), "p1");
    snprintf(mpath, sizeof(mpath), "%s/manifest.json", ds);
    snprintf(want, sizeof(want), "%s/ringtrain-%016llx", parent, (unsigned long long)file_xxh64(mpath));
    CHECK_OK(rt_local_copy_dest(ds, parent, dest, sizeof(dest)));
    CHECKF(!strcmp(dest, want), "rt_local_copy_dest gave %s, expected %s", dest, want);

    CHECK_OK(stage_to("ds", "p1", o, &r));
    CHECKF(!strcmp(r.path, want), "staged to %s, expected %s", r.path, want);
    CHECK(strlen(r.manifest_xxh64) == 16 && strstr(want, r.manifest_xxh64));
    CHECK(same_dataset(ds, r.path));
    CHECKF(r.files >= 4 && r.files_copied == r.files, "%u of %u files copied", r.files_copied, r.files);
    CHECK(r.bytes_copied == r.bytes_total && r.bytes_total > 2000000);
    CHECK(r.files_damaged == 0 && r.files_hashed == 0 && r.partials_removed == 0 && r.retries == 0);
    CHECK(!r.waited && r.wait_seconds == 0);
    CHECK(r.engine == (have_uring ? RT_LOCAL_COPY_ENGINE_URING : RT_LOCAL_COPY_ENGINE_PLAIN));
    CHECK(r.queue_depth == 32 && r.block_bytes == 1u << 20); /* the documented defaults */

    /* A parent spelled with a trailing slash and a "." maps to the same directory. */
    char odd[700];
    snprintf(odd, sizeof(odd), "%s/./", parent);
    CHECK_OK(rt_local_copy_dest(ds, odd, dest, sizeof(dest)));
    CHECKF(!strcmp(dest, want), "rt_local_copy_dest(%s) gave %s", odd, dest);
}

/* A second run copies nothing; it hashes every shard unless told to trust sizes. */
static void test_idempotent(void)
{
    struct rt_local_copy_result r;
    struct rt_local_copy_opts o = {0};
    char ds[600];
    path_of(ds, sizeof(ds), "ds");

    CHECK_OK(stage_to("ds", "p1", o, &r));
    CHECKF(r.files_copied == 0 && r.bytes_copied == 0, "second run copied %u files", r.files_copied);
    CHECK(r.files_hashed == r.files - 1);
    /* Every shard byte, not the manifest (compared byte for byte instead). */
    struct stat mst;
    char m[700];
    snprintf(m, sizeof(m), "%s/manifest.json", ds);
    CHECK(stat(m, &mst) == 0);
    CHECKF(r.bytes_hashed == r.bytes_total - (uint64_t)mst.st_size, "hashed %llu of %llu bytes",
           (unsigned long long)r.bytes_hashed, (unsigned long long)r.bytes_total);
    CHECK(r.engine == RT_LOCAL_COPY_ENGINE_AUTO);
    o.verify = RT_LOCAL_COPY_VERIFY_SIZE;
    CHECK_OK(stage_to("ds", "p1", o, &r));
    CHECK(r.files_copied == 0 && r.files_hashed == 0 && r.bytes_hashed == 0);
    CHECK(same_dataset(ds, r.path));
}

/* A flipped byte in one staged shard: that shard (and the manifest) copied again, no other. */
static void test_damaged_staged_file(void)
{
    struct rt_local_copy_result r;
    struct rt_local_copy_opts o = {0};
    char ds[600], names[64][64], p[4200];
    ino_t before[64];

    path_of(ds, sizeof(ds), "ds");
    CHECK_OK(stage_to("ds", "p1", o, &r));
    int n = dataset_files(ds, names, 64);
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof(p), "%s/%s", r.path, names[i]);
        before[i] = inode_of(p);
    }
    snprintf(p, sizeof(p), "%s/%s", r.path, names[1]);
    flip_byte(p, 3000);

    o.verify = RT_LOCAL_COPY_VERIFY_SIZE; /* by design, a size check cannot see a flipped byte */
    CHECK_OK(stage_to("ds", "p1", o, &r));
    CHECK(r.files_copied == 0 && r.files_damaged == 0);

    o.verify = RT_LOCAL_COPY_VERIFY_FULL;
    CHECK_OK(stage_to("ds", "p1", o, &r));
    CHECKF(r.files_damaged == 1 && r.files_copied == 2, "damaged %u, copied %u", r.files_damaged, r.files_copied);
    CHECK(same_dataset(ds, r.path));
    for (int i = 0; i < n - 1; i++) {
        snprintf(p, sizeof(p), "%s/%s", r.path, names[i]);
        CHECKF((inode_of(p) != before[i]) == (i == 1), "%s: inode %s", names[i],
               inode_of(p) != before[i] ? "changed" : "kept");
    }

    /* A truncated one is caught by size alone. */
    snprintf(p, sizeof(p), "%s/%s", r.path, names[0]);
    CHECK(truncate(p, 1000) == 0);
    o.verify = RT_LOCAL_COPY_VERIFY_SIZE;
    CHECK_OK(stage_to("ds", "p1", o, &r));
    CHECK(r.files_damaged == 1 && r.files_copied == 2);
    CHECK(same_dataset(ds, r.path));
}

/* A staged copy staged onto itself: checked, never "repaired" from its own damaged bytes. */
static void test_self(void)
{
    struct rt_local_copy_result r, again;
    struct rt_local_copy_opts o = {0};
    char parent[600], p[4200];

    CHECK_OK(stage_to("ds", "p9", o, &r));
    path_of(parent, sizeof(parent), "p9");
    o.parent = parent;
    CHECK_OK(rt_local_copy_dataset(r.path, &o, &again));
    CHECK(!strcmp(again.path, r.path) && again.files_copied == 0);
    snprintf(p, sizeof(p), "%s/train-00000.rts", r.path);
    flip_byte(p, 200);
    CHECK_ERR(rt_local_copy_dataset(r.path, &o, &again), "is this staged copy itself");
    snprintf(p, sizeof(p), "%s/manifest.json", r.path);
    CHECK(access(p, F_OK) == 0);
}

/* read/write, the automatic fallback, and odd depths and block sizes give the same bytes. */
static void test_engines(int have_uring)
{
    struct rt_local_copy_result r;
    char ds[600];
    path_of(ds, sizeof(ds), "ds");

    struct rt_local_copy_opts plain = {.engine = RT_LOCAL_COPY_ENGINE_PLAIN, .block_bytes = 12288};
    CHECK_OK(stage_to("ds", "p2", plain, &r));
    CHECK(r.engine == RT_LOCAL_COPY_ENGINE_PLAIN && r.files_copied == r.files);
    CHECK(same_dataset(ds, r.path));

    fake_no_uring = 1;
    struct rt_local_copy_opts autoo = {0};
    CHECK_OK(stage_to("ds", "p3", autoo, &r));
    CHECKF(r.engine == RT_LOCAL_COPY_ENGINE_PLAIN && r.files_copied == r.files, "fallback: engine %d", (int)r.engine);
    CHECK(same_dataset(ds, r.path));
    struct rt_local_copy_opts uring = {.engine = RT_LOCAL_COPY_ENGINE_URING};
    CHECK_ERR(stage_to("ds", "p4", uring, &r), "io_uring is not available");
    fake_no_uring = 0;

    if (!have_uring)
        return;
    /* Depth 1 and 3 with 4 KiB blocks: many short last blocks, the slot ring wrapping around. */
    static const uint32_t depth[] = {1, 3, 64};
    for (size_t i = 0; i < RT_ARRAY_LEN(depth); i++) {
        char parent[32];
        struct rt_local_copy_opts o = {.engine = RT_LOCAL_COPY_ENGINE_URING, .queue_depth = depth[i],
                                       .block_bytes = 4096};
        snprintf(parent, sizeof(parent), "d%u", depth[i]);
        CHECK_OK(stage_to("ds", parent, o, &r));
        CHECK(r.engine == RT_LOCAL_COPY_ENGINE_URING);
        CHECKF(same_dataset(ds, r.path), "queue depth %u", depth[i]);
    }
}

/* What the progress callback was told, checked call by call. */
struct progress_log {
    pthread_t caller;
    uint32_t block;
    uint64_t calls, files, bad;
    char file[64];
    uint64_t file_done, file_bytes, base, bytes_total;
    char first_bad[256];
};

static void progress_bad(struct progress_log *g, const char *what, const struct rt_local_copy_progress *p)
{
    if (g->bad++ == 0)
        snprintf(g->first_bad, sizeof(g->first_bad), "call %llu (%s at %llu of %llu, %llu of %llu in all): %s",
                 (unsigned long long)g->calls, p->file, (unsigned long long)p->file_done,
                 (unsigned long long)p->file_bytes, (unsigned long long)p->bytes_done,
                 (unsigned long long)p->bytes_total, what);
}

/*
 * Each call reports one more block of the current file (manifest.json as a
 * single block); a new file starts only when the previous one is complete;
 * bytes_done is the files before plus this one's bytes.
 */
static void log_progress(void *ctx, const struct rt_local_copy_progress *p)
{
    struct progress_log *g = ctx;
    const int manifest = !strcmp(p->file, "manifest.json");

    if (!pthread_equal(pthread_self(), g->caller))
        progress_bad(g, "called from another thread", p);
    if (g->calls++ == 0)
        g->bytes_total = p->bytes_total;
    if (p->bytes_total != g->bytes_total)
        progress_bad(g, "bytes_total changed", p);
    if (g->files == 0 || strcmp(g->file, p->file) != 0) {
        if (g->files && g->file_done != g->file_bytes)
            progress_bad(g, "the previous file was left incomplete", p);
        g->base += g->file_bytes;
        g->files++;
        g->file_done = 0;
        g->file_bytes = p->file_bytes;
        snprintf(g->file, sizeof(g->file), "%s", p->file);
    }
    const uint64_t want = manifest ? p->file_bytes : RT_MIN(g->file_done + g->block, p->file_bytes);
    if (p->file_bytes != g->file_bytes || p->file_done != want)
        progress_bad(g, "not one block further", p);
    g->file_done = p->file_done;
    if (p->bytes_done != g->base + p->file_done)
        progress_bad(g, "bytes_done is not the files before plus this one", p);
}

/* The progress callback sees every block of every file copied, with both engines; nothing when nothing is copied. */
static void test_progress(int have_uring)
{
    struct rt_local_copy_opts opts[] = {
        {.engine = RT_LOCAL_COPY_ENGINE_PLAIN, .block_bytes = 12288},
        {.engine = RT_LOCAL_COPY_ENGINE_URING, .queue_depth = 3, .block_bytes = 4096},
    };
    char ds[600], names[64][64], p[4200];
    path_of(ds, sizeof(ds), "ds");
    const int n = dataset_files(ds, names, 64);

    for (int e = 0; e < (have_uring ? 2 : 1); e++) {
        struct progress_log g = {.caller = pthread_self(), .block = opts[e].block_bytes};
        struct rt_local_copy_result r;
        uint64_t blocks = 0;
        opts[e].progress = log_progress;
        opts[e].progress_ctx = &g;
        CHECK_OK(stage_to("ds", e ? "pp2" : "pp1", opts[e], &r));
        for (int i = 0; i < n - 1; i++) {
            struct stat st;
            snprintf(p, sizeof(p), "%s/%.63s", ds, names[i]);
            CHECK(stat(p, &st) == 0);
            blocks += ((uint64_t)st.st_size + g.block - 1) / g.block;
        }
        CHECKF(g.bad == 0, "engine %d: %llu bad reports, first %s", e, (unsigned long long)g.bad, g.first_bad);
        CHECKF(g.calls == blocks + 1, "engine %d: %llu calls for %llu blocks and the manifest", e,
               (unsigned long long)g.calls, (unsigned long long)blocks);
        CHECK(g.files == (uint64_t)n && !strcmp(g.file, "manifest.json"));
        CHECK(g.bytes_total == r.bytes_copied && g.base + g.file_done == r.bytes_copied);

        struct progress_log again = {.caller = pthread_self(), .block = opts[e].block_bytes};
        opts[e].progress_ctx = &again;
        CHECK_OK(stage_to("ds", e ? "pp2" : "pp1", opts[e], &r));
        CHECK(r.files_copied == 0 && again.calls == 0);
    }
}

/* A source file whose bytes do not match the manifest: retried, then an error naming it; nothing complete. */
static void test_damaged_source(void)
{
    char cmd[1400], src[600], p[4200];
    struct rt_local_copy_result r;
    struct rt_local_copy_opts o = {.max_attempts = 2};
    char names[64][64];

    path_of(src, sizeof(src), "bad");
    snprintf(cmd, sizeof(cmd), "cp -r '%s/ds' '%s'", root, src);
    CHECK(system(cmd) == 0);
    CHECK(dataset_files(src, names, 64) > 3);
    snprintf(p, sizeof(p), "%s/%s", src, names[2]);
    flip_byte(p, 5000);
    CHECK_ERR(stage_to("bad", "p5", o, &r), names[2]);
    CHECKF(strstr(rt_errmsg(), "copied 2 times") != NULL, "%s", rt_errmsg());
    CHECK(r.retries == 1);
    snprintf(p, sizeof(p), "%s/manifest.json", r.path);
    CHECK(access(p, F_OK) != 0);

    /* A missing source file is named before anything is copied. */
    snprintf(p, sizeof(p), "%s/%s", src, names[0]);
    CHECK(unlink(p) == 0);
    CHECK_ERR(stage_to("bad", "p6", o, &r), names[0]);
    CHECK(strstr(rt_errmsg(), "missing") != NULL);
    CHECK(r.files_copied == 0);
}

/* Another holder of the lock: wait, then -EBUSY naming the lock after the timeout. */
static void test_lock_timeout(void)
{
    char ds[600], parent[600], dest[4096], lock[4200];
    struct rt_local_copy_result r;
    struct rt_local_copy_opts o = {.lock_timeout_s = 0.3};

    path_of(ds, sizeof(ds), "ds");
    path_of(parent, sizeof(parent), "p1");
    CHECK_OK(rt_local_copy_dest(ds, parent, dest, sizeof(dest)));
    snprintf(lock, sizeof(lock), "%s.lock", dest);
    int fd = open(lock, O_RDWR);
    CHECK(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0);
    uint64_t t0 = rt_now_ns();
    CHECK_ERR(stage_to("ds", "p1", o, &r), "is in use");
    double waited = (double)(rt_now_ns() - t0) * 1e-9;
    CHECKF(waited >= 0.3 && waited < 5, "gave up after %.2f s", waited);
    CHECK(strstr(rt_errmsg(), lock) != NULL);
    CHECK(r.waited == 1);
    close(fd);
    CHECK_OK(stage_to("ds", "p1", o, &r));
    CHECK(r.waited == 0 && r.files_copied == 0);
}

/* Rewrites the manifest of a copy of ds with `from` replaced by `to` (and renames the file). */
static void edit_copy(const char *name, const char *from, const char *to)
{
    char cmd[2000];
    snprintf(cmd, sizeof(cmd),
             "rm -rf '%s/%s' && cp -r '%s/ds' '%s/%s' && sed -i 's/\"%s\"/\"%s\"/' '%s/%s/manifest.json' && "
             "{ [ ! -e '%s/%s/%s' ] || mv '%s/%s/%s' '%s/%s/%s'; }",
             root, name, root, root, name, from, to, root, name, root, name, to, root, name, from, root, name, to);
    CHECK(system(cmd) == 0);
}

/* File names a copy cannot honour, and options out of range. */
static void test_refusals(void)
{
    struct rt_local_copy_result r;
    struct rt_local_copy_opts o = {0};

    edit_copy("dup", "train-00001.rts", "train-00000.rts");
    CHECK_ERR(stage_to("dup", "p7", o, &r), "listed twice");
    edit_copy("res", "train-00001.rts", "train-00001.partial");
    CHECK_ERR(stage_to("res", "p7", o, &r), "reserved");
    CHECK_ERR(stage_to("src", "p7", o, &r), "not a packed dataset");

    struct rt_local_copy_opts bad[] = {
        {.queue_depth = 5000}, {.block_bytes = 1000}, {.block_bytes = 6000},
        {.queue_depth = 4096, .block_bytes = 64u << 20}, {.max_attempts = 101}, {.lock_timeout_s = -1},
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(bad); i++)
        CHECKF(stage_to("ds", "p7", bad[i], &r) == -EINVAL, "bad options %zu accepted", i);

    /* A regular file where the destination directory should be. */
    char ds[600], parent[600], dest[4096];
    path_of(ds, sizeof(ds), "ds");
    path_of(parent, sizeof(parent), "p8");
    CHECK_OK(rt_mkdirs(parent, 0755));
    CHECK_OK(rt_local_copy_dest(ds, parent, dest, sizeof(dest)));
    CHECK_OK(rt_file_write_atomic(dest, "x", 1));
    CHECK_ERR(stage_to("ds", "p8", o, &r), "not a directory");
}

int main(void)
{
    struct io_uring ring;
    int have_uring = io_uring_queue_init(4, &ring, 0) == 0;

    if (have_uring)
        io_uring_queue_exit(&ring);
    tu_tempdir(root, sizeof(root), "stage");
    printf("test_stage: synth seed %d in %s; io_uring %s\n", SEED, root, have_uring ? "available" : "unavailable");
    make_dataset();
    test_first_copy_and_naming(have_uring);
    test_idempotent();
    test_damaged_staged_file();
    test_self();
    test_engines(have_uring);
    test_progress(have_uring);
    test_damaged_source();
    test_lock_timeout();
    test_refusals();
    int rc = check_result();
    if (rc == 0)
        rt_remove_tree(root);
    return rc;
}
