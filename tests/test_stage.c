/*
 * test_stage.c - node-local dataset staging through its library API
 * (rt_local_copy_dataset): where the copy goes (PARENT/ringtrain-<uid>/<h>,
 * <h> the manifest's XXH64, recomputed here), byte-identical results with
 * io_uring, with read/write, with the automatic fallback when io_uring is
 * unavailable, and across queue depths and block sizes; the progress callback
 * (every block of every file copied, in order, from the calling thread;
 * nothing when nothing is copied); the counters of an idempotent second run,
 * of a damaged staged file, of a swapped one (same size, other bytes) and of
 * a damaged source; a staged copy given as its own source; the lock timeout;
 * what a process that waited for the lock checks; manifests that name files
 * staging cannot honour; bad options.
 *
 * Shared nodes, as far as one user can test them (test_stage_users.sh plants
 * things as a second user): the per-user directory and the dataset directory
 * created 0700 and refused when group or others may write them (or, as root,
 * when another user owns them); a parent writable by others but not sticky
 * refused; links planted as the per-user directory, the dataset directory,
 * the lock, a staged shard, and as `.partial` files while a copy runs --
 * never followed, their targets untouched; rt_file_write_atomic (checkpoints)
 * beside a planted `.tmp` link and over a link; the checkpoint directory's
 * checks (rt_dir_open_owned with the driver's rules).
 *
 * The process-level cases (concurrent ranks, kill -9, disk full) are in
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
#include <libgen.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "check.h"
#include "loader/offline.h"
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

/* The destination is PARENT/ringtrain-<uid>/<XXH64(manifest.json)>, absolute, with counters that add up. */
static void test_first_copy_and_naming(int have_uring)
{
    char ds[600], mpath[700], want[900], dest[4096], parent[600];
    struct rt_local_copy_result r;
    struct rt_local_copy_opts o = {0};

    path_of(ds, sizeof(ds), "ds");
    path_of(parent, sizeof(parent), "p1");
    snprintf(mpath, sizeof(mpath), "%s/manifest.json", ds);
    snprintf(want, sizeof(want), "%s/ringtrain-%u/%016llx", parent, (unsigned)geteuid(),
             (unsigned long long)file_xxh64(mpath));
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
    CHECK_OK(rt_local_copy_dest(ds, parent, dest, sizeof(dest)));
    char user[4200];
    snprintf(user, sizeof(user), "%s", dest);
    CHECK_OK(rt_mkdirs(dirname(user), 0700));
    CHECK_OK(rt_file_write_atomic(dest, "x", 1));
    CHECK_ERR(stage_to("ds", "p8", o, &r), "not a directory");
}


/* ---- shared nodes ----------------------------------------------------------------- */

/* A file (or directory) another user would like us to write into; its content must never change. */
#define VICTIM_TEXT "precious, not ringtrain's"

static void make_victims(char *file, size_t flen, char *dir, size_t dlen)
{
    path_of(file, flen, "victim.txt");
    path_of(dir, dlen, "victim.d");
    CHECK_OK(rt_file_write_atomic(file, VICTIM_TEXT, strlen(VICTIM_TEXT)));
    CHECK_OK(rt_mkdirs(dir, 0755));
}

/* 1 if the victims are as made: the file's bytes and an empty directory. */
static int victims_untouched(const char *file, const char *dir)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    struct stat st;
    int ok = lstat(file, &st) == 0 && S_ISREG(st.st_mode) && rt_file_read(file, &buf, &len) == 0 &&
             len == strlen(VICTIM_TEXT) && !memcmp(buf, VICTIM_TEXT, len);
    free(buf);
    DIR *d = opendir(dir);
    struct dirent *e;
    int entries = 0;
    while (d && (e = readdir(d)))
        entries += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d)
        closedir(d);
    if (!ok || !d || entries)
        fprintf(stderr, "victims: %s %s, %s holds %d entries\n", file, ok ? "intact" : "CHANGED", dir, entries);
    return ok && d && entries == 0;
}

/* Where dataset "ds" goes under PARENT `parent_rel`: the dataset directory and this user's directory. */
static void dest_of(const char *parent_rel, char *dest, size_t dlen, char *user, size_t ulen)
{
    char ds[600], parent[600];
    path_of(ds, sizeof(ds), "ds");
    path_of(parent, sizeof(parent), parent_rel);
    CHECK_OK(rt_local_copy_dest(ds, parent, dest, dlen));
    snprintf(user, ulen, "%s", dest);
    dirname(user);
}

static unsigned mode_of(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 ? (unsigned)st.st_mode & 07777 : 0xffffu;
}

/* The per-user space: 0700 and ours; refused once group or others may write it (or, as root, another owns it). */
static void test_user_space(void)
{
    struct rt_local_copy_result r;
    struct rt_local_copy_opts o = {0};
    char dest[4096], user[4096], parent[600], want[4300];

    path_of(parent, sizeof(parent), "u1");
    dest_of("u1", dest, sizeof(dest), user, sizeof(user));
    CHECK_OK(stage_to("ds", "u1", o, &r));
    CHECKF(mode_of(user) == 0700 && mode_of(dest) == 0700, "%s mode %o, %s mode %o", user, mode_of(user), dest,
           mode_of(dest));
    snprintf(want, sizeof(want), "%s.lock", dest);
    CHECK(access(want, F_OK) == 0); /* the lock lives in the per-user directory, not in PARENT */

    static const struct {
        unsigned mode;
        const char *says;
    } bad[] = {{0777, "writable by group and others (mode 0777)"}, {0770, "writable by group (mode 0770)"},
               {0703, "writable by others (mode 0703)"}};
    for (size_t i = 0; i < RT_ARRAY_LEN(bad); i++) {
        CHECK(chmod(user, bad[i].mode) == 0);
        snprintf(want, sizeof(want), "%s: %s: refusing to stage into a directory other users can write; remove it "
                 "or use --to DIR", user, bad[i].says);
        CHECK_ERR(stage_to("ds", "u1", o, &r), want);
    }
    CHECK(chmod(user, 0700) == 0);
    /* The dataset directory is checked the same way. */
    CHECK(chmod(dest, 0757) == 0);
    snprintf(want, sizeof(want), "%s: writable by others (mode 0757)", dest);
    CHECK_ERR(stage_to("ds", "u1", o, &r), want);
    CHECK(chmod(dest, 0700) == 0);
    CHECK_OK(stage_to("ds", "u1", o, &r));
    CHECK(r.files_copied == 0);

    /* PARENT may be shared (/tmp) only when sticky: else anyone could rename our directory and put theirs. */
    CHECK(chmod(parent, 0777) == 0);
    snprintf(want, sizeof(want), "%s: writable by group and others and not sticky (mode 0777)", parent);
    CHECK_ERR(stage_to("ds", "u1", o, &r), want);
    CHECK(chmod(parent, 01777) == 0);
    CHECK_OK(stage_to("ds", "u1", o, &r));
    CHECK(chmod(parent, 0755) == 0);

    if (geteuid() != 0) {
        printf("test_stage: not root: the other-owner cases are in test_stage_users.sh\n");
        return;
    }
    /* Another owner, even one who lets nobody else write, controls what is there. */
    CHECK(chown(user, 65534, 65534) == 0);
    snprintf(want, sizeof(want), "%s: owned by ", user);
    CHECK_ERR(stage_to("ds", "u1", o, &r), want);
    CHECK_ERR(stage_to("ds", "u1", o, &r), "(uid 65534), not by root (uid 0): refusing to stage into a directory "
                                           "another user controls; remove it or use --to DIR");
    CHECK(chown(user, 0, 0) == 0);
    CHECK(chown(parent, 65534, 65534) == 0);
    CHECK_ERR(stage_to("ds", "u1", o, &r), "neither by root (uid 0) nor by root");
    CHECK(chown(parent, 0, 0) == 0);
    CHECK_OK(stage_to("ds", "u1", o, &r));
}

/* Plants, from the progress callback, a link at every `.partial` name a later file of the copy will use. */
struct planter {
    const char *dest;
    const char *victim;
    int planted;
};

static void plant_partials(void *ctx, const struct rt_local_copy_progress *p)
{
    struct planter *pl = ctx;
    char names[64][64], link[4300], ds[600];
    if (pl->planted)
        return;
    path_of(ds, sizeof(ds), "ds");
    const int n = dataset_files(ds, names, 64);
    for (int i = 0; i < n; i++) {
        if (!strcmp(names[i], p->file))
            continue;
        snprintf(link, sizeof(link), "%s/%s.partial", pl->dest, names[i]);
        pl->planted += symlink(pl->victim, link) == 0;
    }
}

/* Links where staging creates, writes or trusts something: refused, or replaced; never followed. */
static void test_links(void)
{
    struct rt_local_copy_result r;
    struct rt_local_copy_opts o = {0};
    char dest[4096], user[4096], victim[600], vdir[600], link[4300], ds[600];

    path_of(ds, sizeof(ds), "ds");
    make_victims(victim, sizeof(victim), vdir, sizeof(vdir));

    /* The per-user directory as a link (to a directory of ours, even): refused. */
    dest_of("l1", dest, sizeof(dest), user, sizeof(user));
    CHECK_OK(stage_to("ds", "l1", o, &r));
    CHECK_OK(rt_remove_tree(user));
    CHECK(symlink(vdir, user) == 0);
    CHECK_ERR(stage_to("ds", "l1", o, &r), "is a symbolic link: refusing to stage into a directory reached through "
                                           "a link; remove it or use --to DIR");
    CHECK(strstr(rt_errmsg(), user) != NULL);
    CHECK(victims_untouched(victim, vdir));
    CHECK(unlink(user) == 0);

    /* The dataset directory as a link. */
    CHECK(mkdir(user, 0700) == 0);
    CHECK(symlink(vdir, dest) == 0);
    CHECK_ERR(stage_to("ds", "l1", o, &r), "is a symbolic link");
    CHECK(strstr(rt_errmsg(), dest) != NULL);
    CHECK(victims_untouched(victim, vdir));
    CHECK(unlink(dest) == 0);

    /* The lock file as a link: never opened through it (nor created at its target). */
    snprintf(link, sizeof(link), "%s.lock", dest);
    unlink(link);
    CHECK(symlink(victim, link) == 0);
    CHECK_ERR(stage_to("ds", "l1", o, &r), "is a symbolic link: refusing to use it as the staging lock");
    CHECK(victims_untouched(victim, vdir));
    CHECK(unlink(link) == 0);
    char dangling[700];
    snprintf(dangling, sizeof(dangling), "%s/not-yet", vdir);
    CHECK(symlink(dangling, link) == 0);
    CHECK_ERR(stage_to("ds", "l1", o, &r), "is a symbolic link");
    CHECK(victims_untouched(victim, vdir));
    CHECK(unlink(link) == 0);

    /* `.partial` links planted while the copy runs (left by a crash, or by anyone): a new file is made instead. */
    CHECK_OK(rt_remove_tree(dest));
    struct planter pl = {.dest = dest, .victim = victim};
    struct rt_local_copy_opts po = {.progress = plant_partials, .progress_ctx = &pl};
    CHECK_OK(stage_to("ds", "l1", po, &r));
    CHECKF(pl.planted >= 3, "planted %d links", pl.planted);
    CHECK(victims_untouched(victim, vdir));
    CHECK(same_dataset(ds, r.path)); /* no link left behind, every file a real copy */

    /* A staged shard or manifest.json replaced by a link: copied again over the link, its target untouched. */
    char names[64][64], p[8400];
    const int n = dataset_files(ds, names, 64);
    snprintf(p, sizeof(p), "%s/%s", dest, names[1]);
    CHECK(unlink(p) == 0 && symlink(victim, p) == 0);
    snprintf(p, sizeof(p), "%s/%s", dest, names[n - 1]);
    snprintf(link, sizeof(link), "%s/%s", ds, names[n - 1]);
    CHECK(unlink(p) == 0 && symlink(link, p) == 0); /* to the right bytes, even */
    CHECK_OK(stage_to("ds", "l1", o, &r));
    CHECKF(r.files_damaged == 1 && r.files_copied == 2, "damaged %u, copied %u", r.files_damaged, r.files_copied);
    CHECK(victims_untouched(victim, vdir));
    CHECK(same_dataset(ds, r.path));
    for (int i = 0; i < n; i++) {
        struct stat st;
        snprintf(p, sizeof(p), "%s/%s", dest, names[i]);
        CHECKF(lstat(p, &st) == 0 && S_ISREG(st.st_mode), "%s is not a regular file", p);
    }
}

/* A staged shard swapped for other bytes of the same size: the full check finds it and copies it again. */
static void test_swapped(void)
{
    struct rt_local_copy_result r;
    struct rt_local_copy_opts o = {0};
    char ds[600], names[64][64], p[4300], tmp[4400];
    uint8_t *buf = NULL;
    size_t len = 0;

    path_of(ds, sizeof(ds), "ds");
    CHECK_OK(stage_to("ds", "sw", o, &r));
    dataset_files(ds, names, 64);
    snprintf(p, sizeof(p), "%s/%s", r.path, names[2]);
    snprintf(tmp, sizeof(tmp), "%s.new", p);
    CHECK_OK(rt_file_read(p, &buf, &len));
    for (size_t i = 0; buf && i < len; i += 97)
        buf[i] ^= 0x5a;
    CHECK_OK(rt_file_write_atomic(tmp, buf, len));
    free(buf);
    CHECK(rename(tmp, p) == 0);
    CHECK_OK(stage_to("ds", "sw", o, &r));
    CHECKF(r.files_damaged == 1 && r.files_copied == 2, "damaged %u, copied %u", r.files_damaged, r.files_copied);
    CHECK(same_dataset(ds, r.path));
}

/* A stager in a thread of its own, for the lock tests. */
struct stager {
    pthread_t t;
    const char *parent;
    struct rt_local_copy_result r;
    int rc;
};

static void *stager_run(void *arg)
{
    struct stager *s = arg;
    s->rc = stage_to("ds", s->parent, (struct rt_local_copy_opts){0}, &s->r);
    return NULL;
}

/*
 * Returns once another open file waits in flock() for fd's lock: /proc/locks
 * lists a blocked request as "-> FLOCK ..." with the file's inode. Without
 * /proc/locks, or after 30 s, it returns anyway, and the caller's check of
 * `waited` says what happened. (A fixed sleep here failed when the stager's
 * thread started late on a loaded machine.)
 */
static void wait_for_lock_waiter(int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return;
    char want[64], line[512];
    snprintf(want, sizeof(want), ":%llu ", (unsigned long long)st.st_ino);
    for (int i = 0; i < 3000; i++) {
        FILE *f = fopen("/proc/locks", "r");
        if (!f) {
            struct timespec ts = {0, 300000000L};
            nanosleep(&ts, NULL);
            return;
        }
        int found = 0;
        while (!found && fgets(line, sizeof(line), f))
            found = strstr(line, "-> FLOCK") && strstr(line, want);
        fclose(f);
        if (found)
            return;
        struct timespec ts = {0, 10000000L};
        nanosleep(&ts, NULL);
    }
}

/*
 * A process that waited for the lock checks sizes only when the holder it
 * waited for recorded, as it let go, that it had checked every byte; a record
 * older than the wait (an earlier run's), or none, means a full check -- which
 * here finds the byte flipped while it waited.
 */
static void test_waiter(void)
{
    struct rt_local_copy_result r;
    char dest[4096], user[4096], lock[4200], names[64][64], p[4300], ds[600];

    path_of(ds, sizeof(ds), "ds");
    const int n = dataset_files(ds, names, 64);
    dest_of("w1", dest, sizeof(dest), user, sizeof(user));
    CHECK_OK(stage_to("ds", "w1", (struct rt_local_copy_opts){0}, &r));
    snprintf(lock, sizeof(lock), "%s.lock", dest);

    for (int fresh = 1; fresh >= 0; fresh--) {
        struct stager s = {.parent = "w1"};
        int fd = open(lock, O_RDWR);
        CHECK(fd >= 0 && flock(fd, LOCK_EX) == 0);
        CHECK(pthread_create(&s.t, NULL, stager_run, &s) == 0);
        wait_for_lock_waiter(fd);
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        char text[256];
        int len = snprintf(text, sizeof(text), "pid 1 on test since now\nchecked: size and xxh64 at %lld.%09ld\n",
                           (long long)now.tv_sec - (fresh ? 0 : 3600), now.tv_nsec);
        CHECK(ftruncate(fd, 0) == 0 && pwrite(fd, text, (size_t)len, 0) == len);
        if (!fresh) {
            snprintf(p, sizeof(p), "%s/%s", dest, names[0]);
            flip_byte(p, 100);
        }
        close(fd);
        pthread_join(s.t, NULL);
        CHECKF(s.rc == 0, "stager: %d", s.rc);
        CHECK(s.r.waited == 1);
        if (fresh)
            CHECKF(s.r.files_hashed == 0 && s.r.files_copied == 0, "fresh record: hashed %u, copied %u",
                   s.r.files_hashed, s.r.files_copied);
        else
            CHECKF(s.r.files_hashed == (uint32_t)n - 1 && s.r.files_damaged == 1 && s.r.files_copied == 2,
                   "stale record: hashed %u, damaged %u, copied %u", s.r.files_hashed, s.r.files_damaged,
                   s.r.files_copied);
    }
    CHECK(same_dataset(ds, dest));
}

/* What `train --checkpoint-dir` checks (driver.c's rules) and how checkpoints are written (rt_file_write_atomic). */
static void test_checkpoint_dir(void)
{
    static const struct rt_dir_rules ckpt = {RT_DIR_CREATE, 0755, "write checkpoints into",
                                             "give --checkpoint-dir a directory only you can write"};
    char dir[600], path[700], link[720], victim[600], vdir[600];
    int fd = -1;

    make_victims(victim, sizeof(victim), vdir, sizeof(vdir));
    path_of(dir, sizeof(dir), "ck/a/b");
    CHECK_OK(rt_dir_open_owned(AT_FDCWD, dir, dir, &ckpt, &fd)); /* created, with its parents */
    if (fd >= 0)
        close(fd);
    const mode_t mask = umask(0);
    umask(mask);
    CHECKF(mode_of(dir) == (0755 & ~(unsigned)mask), "created with mode %o", mode_of(dir));
    CHECK(chmod(dir, 0775) == 0);
    static const char group_w[] = "writable by group (mode 0775): refusing to write checkpoints into a directory "
                                  "other users can write";
    CHECK_ERR(rt_dir_open_owned(AT_FDCWD, dir, dir, &ckpt, &fd), group_w);
    CHECK(chmod(dir, 0757) == 0);
    CHECK_ERR(rt_dir_open_owned(AT_FDCWD, dir, dir, &ckpt, &fd), "writable by others");
    CHECK(chmod(dir, 0755) == 0);
    path_of(link, sizeof(link), "ck/link");
    CHECK(symlink(vdir, link) == 0);
    static const char is_link[] = "is a symbolic link: refusing to write checkpoints into a directory reached "
                                  "through a link";
    CHECK_ERR(rt_dir_open_owned(AT_FDCWD, link, link, &ckpt, &fd), is_link);
    strcat(link, "/"); /* a trailing slash would make the kernel resolve the link */
    CHECK_ERR(rt_dir_open_owned(AT_FDCWD, link, link, &ckpt, &fd), is_link);
    path_of(path, sizeof(path), "ck/file");
    CHECK_OK(rt_file_write_atomic(path, "x", 1));
    CHECK_ERR(rt_dir_open_owned(AT_FDCWD, path, path, &ckpt, &fd), "exists and is not a directory");
    if (geteuid() == 0) {
        CHECK(chown(dir, 65534, 65534) == 0);
        static const char other[] = "(uid 65534), not by root (uid 0): refusing to write checkpoints into a "
                                    "directory another user controls";
        CHECK_ERR(rt_dir_open_owned(AT_FDCWD, dir, dir, &ckpt, &fd), other);
        CHECK(chown(dir, 0, 0) == 0);
    }
    CHECK(victims_untouched(victim, vdir));

    /* A link planted where the old writer put its fixed temporary file, and the checkpoint itself as a link. */
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    snprintf(link, sizeof(link), "%s.tmp", path);
    CHECK(symlink(victim, link) == 0);
    CHECK_OK(rt_file_write_atomic(path, "weights", 7));
    CHECK(victims_untouched(victim, vdir));
    uint8_t *got = NULL;
    size_t glen = 0;
    CHECK(rt_file_read(path, &got, &glen) == 0 && glen == 7 && !memcmp(got, "weights", 7));
    free(got);
    snprintf(link, sizeof(link), "%s/state.json", dir);
    CHECK(symlink(victim, link) == 0);
    CHECK_OK(rt_file_write_atomic(link, "{}", 2)); /* replaces the link, never writes through it */
    CHECK(victims_untouched(victim, vdir));
    struct stat st;
    CHECK(lstat(link, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 2);
    /* Nothing but the two files and the planted .tmp link: no temporary file left. */
    DIR *d = opendir(dir);
    struct dirent *e;
    int entries = 0;
    while (d && (e = readdir(d)))
        entries += e->d_name[0] != '.';
    if (d)
        closedir(d);
    CHECKF(entries == 3, "%s holds %d entries", dir, entries);
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
    test_user_space();
    test_links();
    test_swapped();
    test_waiter();
    test_checkpoint_dir();
    int rc = check_result();
    if (rc == 0)
        rt_remove_tree(root);
    return rc;
}
