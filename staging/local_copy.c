/*
 * local_copy.c - node-local dataset copies (`ringtrain stage`): copies a
 * packed dataset's shards and manifest.json into PARENT/ringtrain-<uid>/<h>
 * with io_uring (or pread/pwrite where io_uring is unavailable), checks every
 * byte against the manifest, and serializes the processes of a node on an
 * flock so that the dataset is copied once. local_copy.h states the
 * guarantees.
 *
 * It does not parse shards: the manifest's file list, sizes and whole-file
 * XXH64 are all it needs (the manifest itself is read and validated by the
 * dataset reader, loader/dataset.h). Temporary files are <file>.partial in
 * the destination.
 *
 * Other users share the node (and PARENT, typically /tmp): everything below
 * PARENT is reached through directory fds checked after opening them
 * (rt_dir_open_owned: ours, not writable by anyone else), with openat,
 * renameat and unlinkat and O_NOFOLLOW, and files are created with O_EXCL
 * (rt_file_create_fresh), so no link is ever followed and nothing checked
 * can be replaced by someone else afterwards.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/common.h"
#include "loader/dataset.h"
#include "staging/local_copy.h"

#define STAGE_PREFIX "ringtrain-" /* PARENT/ringtrain-<uid>: this user's space */
#define STAGE_MANIFEST "manifest.json"
#define STAGE_PARTIAL ".partial"
#define STAGE_DEFAULT_DEPTH 32u
#define STAGE_MAX_DEPTH 4096u
#define STAGE_DEFAULT_BLOCK (1u << 20)
#define STAGE_MIN_BLOCK 4096u
#define STAGE_MAX_BLOCK (64u << 20)
#define STAGE_MAX_BUFFERS ((uint64_t)1 << 30)
#define STAGE_DEFAULT_ATTEMPTS 3u
#define STAGE_MAX_ATTEMPTS 100u
/* How often a lock wait with a timeout retries; flock() itself cannot time out. */
#define STAGE_LOCK_POLL_NS 50000000L
/* The lock file's second line, written by a holder that checked or copied every byte before it let go. */
#define STAGE_LOCK_CHECKED "checked: size and xxh64 at "

/*
 * PARENT may be shared (/tmp): created in, never trusted beyond what its
 * sticky bit promises. PARENT/ringtrain-<uid> and the directories in it are
 * this user's alone.
 */
static const struct rt_dir_rules parent_rules = {RT_DIR_CREATE | RT_DIR_FOLLOW | RT_DIR_SHARED, 0755,
                                                 "stage under", "use --to DIR"};
static const struct rt_dir_rules own_rules = {RT_DIR_CREATE, 0700, "stage into", "remove it or use --to DIR"};

/* ---- paths ------------------------------------------------------------------ */

/*
 * Makes `in` absolute (realpath when it exists, else cwd-relative) without
 * trailing slashes, so that every rank prints the same path whatever its
 * working directory and however the parent was spelled.
 */
static int absolute_dir(const char *in, char *out, size_t len)
{
    char buf[PATH_MAX];
    int n;

    if (realpath(in, buf)) {
        n = snprintf(out, len, "%s", buf);
    } else if (in[0] == '/') {
        n = snprintf(out, len, "%s", in);
    } else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof(cwd)))
            return rt_errf(-errno, "cannot get the working directory: %s", strerror(errno));
        n = snprintf(out, len, "%s/%s", cwd, in);
    }
    if (n < 0 || (size_t)n >= len)
        return rt_errf(-ENAMETOOLONG, "%s: path too long", in);
    while (n > 1 && out[n - 1] == '/')
        out[--n] = '\0';
    return 0;
}

/* The parent directory: the option, else $SLURM_TMPDIR, else $TMPDIR, else /tmp. */
static const char *pick_parent(const char *parent)
{
    const char *env;

    if (parent && *parent)
        return parent;
    if ((env = getenv("SLURM_TMPDIR")) && *env)
        return env;
    if ((env = getenv("TMPDIR")) && *env)
        return env;
    return "/tmp";
}

/*
 * Reads `src`/manifest.json into *text (the caller frees it) and hashes it.
 * A missing manifest is reported as "not a packed dataset".
 */
static int manifest_load(const char *src, uint8_t **text, size_t *len, uint64_t *hash)
{
    char path[PATH_MAX];
    int rc = rt_path_join(path, sizeof(path), src, STAGE_MANIFEST);

    if (rc < 0)
        return rc;
    rc = rt_file_read(path, text, len);
    if (rc == -ENOENT)
        return rt_errf(rc, "%s: no %s here: not a packed dataset (make one with `ringtrain pack`)", src,
                       STAGE_MANIFEST);
    if (rc < 0)
        return rc;
    *hash = XXH64(*text, *len, 0);
    return 0;
}

/* Writes PARENT/ringtrain-<uid>/<hash> (and, given `lock`, PARENT/ringtrain-<uid>/<hash>.lock). */
/* The names under PARENT: this user's directory, "ringtrain-<uid>", and the dataset's in it, "<h>". */
static void stage_names(uint64_t hash, char user[32], char name[24])
{
    snprintf(user, 32, STAGE_PREFIX "%u", (unsigned)geteuid());
    snprintf(name, 24, "%016" PRIx64, hash);
}

static int dest_paths(const char *parent_abs, uint64_t hash, char *dest, size_t dlen, char *lock, size_t llen)
{
    char user[32], name[24], rel[64];

    stage_names(hash, user, name);
    snprintf(rel, sizeof(rel), "%s/%s", user, name);
    if (rt_path_join(dest, dlen, parent_abs, rel) < 0)
        return -ENAMETOOLONG;
    if (lock && (size_t)snprintf(lock, llen, "%s.lock", dest) >= llen)
        return rt_errf(-ENAMETOOLONG, "%s.lock: path too long", dest);
    return 0;
}

int rt_local_copy_dest(const char *src, const char *parent, char *out, size_t len)
{
    char abs[PATH_MAX];
    uint8_t *text;
    size_t tlen;
    uint64_t hash = 0;
    int rc = manifest_load(src, &text, &tlen, &hash);

    if (rc < 0)
        return rc;
    free(text);
    rc = absolute_dir(pick_parent(parent), abs, sizeof(abs));
    return rc < 0 ? rc : dest_paths(abs, hash, out, len, NULL, 0);
}

/* ---- the copy engine -------------------------------------------------------- */

/*
 * Block k of a file always lives in slot k % depth, and a slot is reused only
 * once its block has been written and hashed. Walking the slots from the
 * oldest block therefore hashes the file in order, whatever order the kernel
 * completes the reads and writes in.
 */
enum slot_state { SLOT_FREE, SLOT_READING, SLOT_WRITING, SLOT_WRITTEN };

struct slot {
    uint8_t *buf;
    uint64_t off;           /* file offset of the block */
    uint32_t len;           /* block bytes (the last block of a file may be short) */
    uint32_t done;          /* bytes of the current read or write finished */
    enum slot_state state;
};

struct copier {
    enum rt_local_copy_engine kind; /* URING or PLAIN once set up */
    struct io_uring ring;
    int have_ring;
    int sync_busy;              /* an fsync request (user_data NULL) is in the ring */
    int sync_res;               /* its result, once complete */
    uint32_t depth, block;
    uint8_t *mem;               /* depth * block bytes, page-aligned, one allocation */
    struct slot *slots;
    /* The caller's progress callback (may be NULL) and what it is told. */
    void (*progress)(void *ctx, const struct rt_local_copy_progress *p);
    void *progress_ctx;
    struct rt_local_copy_progress prog;
    uint64_t prog_base;         /* prog.bytes_done when the current file started */
};

/* The two ends of one file copy; paths are for messages. */
struct copy_job {
    int in, out;
    const char *in_path, *out_path;
    uint64_t size;
};

static int copier_setup(struct copier *c, const struct rt_local_copy_opts *o)
{
    const size_t bytes = (size_t)o->queue_depth * o->block_bytes;
    void *mem = NULL;
    int rc;

    c->depth = o->queue_depth;
    c->block = o->block_bytes;
    if ((rc = posix_memalign(&mem, 4096, bytes)) != 0)
        return rt_errf(-rc, "staging buffers: cannot allocate %zu bytes", bytes);
    /*
     * Touching the buffers once faults their pages in before the copy starts
     * and, as a side effect, lets valgrind treat them as defined: it cannot
     * see the kernel filling them through io_uring.
     */
    memset(mem, 0, bytes);
    c->mem = mem;
    c->slots = rt_calloc(c->depth, sizeof(*c->slots), "staging queue slots");
    if (!c->slots)
        return -ENOMEM;
    for (uint32_t i = 0; i < c->depth; i++)
        c->slots[i].buf = c->mem + (size_t)i * c->block;

    c->kind = RT_LOCAL_COPY_ENGINE_PLAIN;
    if (o->engine == RT_LOCAL_COPY_ENGINE_PLAIN)
        return 0;
    /* One request per slot at most, plus one fsync: depth + 1 entries never overflow. */
    rc = io_uring_queue_init(c->depth + 1, &c->ring, 0);
    if (rc == 0) {
        struct io_uring_probe *p = io_uring_get_probe_ring(&c->ring);
        int ok = p && io_uring_opcode_supported(p, IORING_OP_READ) &&
                 io_uring_opcode_supported(p, IORING_OP_WRITE) && io_uring_opcode_supported(p, IORING_OP_FSYNC);
        io_uring_free_probe(p);
        if (ok) {
            c->have_ring = 1;
            c->kind = RT_LOCAL_COPY_ENGINE_URING;
            return 0;
        }
        io_uring_queue_exit(&c->ring);
        rc = -EOPNOTSUPP;
    }
    if (o->engine == RT_LOCAL_COPY_ENGINE_URING)
        return rt_errf(rc, "io_uring is not available here (%s); use --engine plain or auto", strerror(-rc));
    rt_warn("io_uring is not available here (%s): copying with read/write instead", strerror(-rc));
    return 0;
}

static void copier_free(struct copier *c)
{
    if (c->have_ring)
        io_uring_queue_exit(&c->ring);
    free(c->slots);
    free(c->mem);
    memset(c, 0, sizeof(*c));
}

/* Starts the progress figures of file `name`; `before` bytes of this call are already written. */
static void progress_file(struct copier *c, const char *name, uint64_t size, uint64_t before)
{
    c->prog.file = name;
    c->prog.file_bytes = size;
    c->prog.file_done = 0;
    c->prog_base = before;
}

/* Tells the caller that the first `done` bytes of the current file are written. */
static void progress_report(struct copier *c, uint64_t done)
{
    if (!c->progress)
        return;
    c->prog.file_done = done;
    c->prog.bytes_done = c->prog_base + done;
    c->progress(c->progress_ctx, &c->prog);
}

/* Queues the rest of slot `s`'s current read or write. */
static int uring_queue(struct copier *c, const struct copy_job *j, struct slot *s)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&c->ring);

    if (!sqe)
        return rt_errf(-EBUSY, "%s: io_uring submission queue full (%u entries)", j->out_path, c->depth);
    if (s->state == SLOT_READING)
        io_uring_prep_read(sqe, j->in, s->buf + s->done, s->len - s->done, s->off + s->done);
    else
        io_uring_prep_write(sqe, j->out, s->buf + s->done, s->len - s->done, s->off + s->done);
    io_uring_sqe_set_data(sqe, s);
    return 0;
}

/*
 * Handles one completion: a short read or write queues its remainder, a full
 * read queues the write of the same buffer. Returns 1 when it queued a
 * request, 0 when not, -errno on failure. While draining after an error
 * (`draining`), nothing is queued.
 */
static int uring_complete(struct copier *c, const struct copy_job *j, struct slot *s, int res, int draining)
{
    const int reading = s->state == SLOT_READING;
    const uint64_t at = s->off + s->done;
    int rc;

    if (draining) {
        s->state = SLOT_FREE;
        return 0;
    }
    if (res < 0 && res != -EINTR && res != -EAGAIN)
        return rt_errf(res, "%s: %s failed at offset %" PRIu64 ": %s", reading ? j->in_path : j->out_path,
                       reading ? "read" : "write", at, strerror(-res));
    if (res == 0 && reading)
        return rt_errf(-EIO, "%s: ends at offset %" PRIu64 ", the manifest says %" PRIu64
                       " bytes (was it changed while staging?)", j->in_path, at, j->size);
    if (res == 0)
        return rt_errf(-EIO, "%s: write made no progress at offset %" PRIu64, j->out_path, at);
    if (res > 0)
        s->done += (uint32_t)res;
    if (s->done == s->len) {
        if (!reading) {
            s->state = SLOT_WRITTEN;
            return 0;
        }
        s->state = SLOT_WRITING;
        s->done = 0;
    }
    /* What is left: the rest of a short or interrupted transfer, or the write of a block just read. */
    rc = uring_queue(c, j, s);
    return rc < 0 ? rc : 1;
}

/*
 * Copies j->size bytes with io_uring, the pattern of liburing's
 * examples/io_uring-cp.c: fill the queue to depth with reads, submit once,
 * wait for one completion, peek the rest; requeue short reads and writes;
 * issue each block's write when its read completes. `h` receives the bytes
 * in file order. On error, waits for every request in flight before
 * returning, since the kernel may still be using the buffers.
 */
static int copy_uring(struct copier *c, const struct copy_job *j, XXH64_state_t *h)
{
    const uint64_t nblocks = (j->size + c->block - 1) / c->block;
    uint64_t next_read = 0, next_hash = 0;
    unsigned inflight = 0;
    int err = 0, rc;

    for (uint32_t i = 0; i < c->depth; i++)
        c->slots[i].state = SLOT_FREE;
    for (;;) {
        while (!err && next_read < nblocks && next_read - next_hash < c->depth) {
            struct slot *s = &c->slots[next_read % c->depth];
            s->off = next_read * c->block;
            s->len = (uint32_t)RT_MIN((uint64_t)c->block, j->size - s->off);
            s->done = 0;
            s->state = SLOT_READING;
            if ((rc = uring_queue(c, j, s)) < 0) {
                err = rc;
                break;
            }
            inflight++;
            next_read++;
        }
        if (inflight == 0)
            break;
        rc = io_uring_submit_and_wait(&c->ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            /*
             * The kernel refused the submission, so it is unknown which
             * requests it holds: tear the ring down and deliberately keep
             * the buffers allocated, because a request still in flight may
             * yet write into them.
             */
            err = rt_errf(rc, "%s: io_uring submit failed: %s", j->out_path, strerror(-rc));
            io_uring_queue_exit(&c->ring);
            c->have_ring = 0;
            c->sync_busy = 0;
            c->mem = NULL;
            return err;
        }
        struct io_uring_cqe *cqe;
        while (io_uring_peek_cqe(&c->ring, &cqe) == 0) {
            struct slot *s = io_uring_cqe_get_data(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(&c->ring, cqe);
            if (!s) { /* the previous file's fsync, running beside this copy */
                c->sync_res = res;
                c->sync_busy = 0;
                continue;
            }
            inflight--;
            rc = uring_complete(c, j, s, res, err != 0);
            if (rc < 0)
                err = rc;
            else
                inflight += (unsigned)rc;
        }
        while (!err && next_hash < next_read && c->slots[next_hash % c->depth].state == SLOT_WRITTEN) {
            struct slot *s = &c->slots[next_hash % c->depth];
            XXH64_update(h, s->buf, s->len);
            s->state = SLOT_FREE;
            next_hash++;
            progress_report(c, s->off + s->len);
        }
    }
    return err;
}

/* The fallback: one block at a time with read() and write(). */
static int copy_plain(struct copier *c, const struct copy_job *j, XXH64_state_t *h)
{
    uint8_t *buf = c->slots[0].buf;

    for (uint64_t off = 0; off < j->size;) {
        const size_t len = (size_t)RT_MIN((uint64_t)c->block, j->size - off);
        size_t got = 0;
        while (got < len) {
            ssize_t n = read(j->in, buf + got, len - got);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                return rt_errf(-errno, "%s: read failed at offset %" PRIu64 ": %s", j->in_path, off + got,
                               strerror(errno));
            if (n == 0)
                return rt_errf(-EIO, "%s: ends at offset %" PRIu64 ", the manifest says %" PRIu64
                               " bytes (was it changed while staging?)", j->in_path, off + got, j->size);
            got += (size_t)n;
        }
        XXH64_update(h, buf, len);
        int rc = rt_write_full(j->out, buf, len, j->out_path);
        if (rc < 0)
            return rc;
        off += len;
        progress_report(c, off);
    }
    return 0;
}

/*
 * Starts making a copied file durable without waiting for it. With io_uring
 * this queues an fsync that the kernel runs while the next file is copied;
 * otherwise it asks for writeback to begin (sync_file_range), and the fsync
 * proper happens in copier_sync_finish(). Returns 1 when an fsync was
 * queued, 0 when not, -errno when the ring refused it.
 */
static int copier_sync_start(struct copier *c, int fd, const char *path)
{
    struct io_uring_sqe *sqe;
    int rc;

    if (c->kind != RT_LOCAL_COPY_ENGINE_URING || !c->have_ring || c->sync_busy ||
        !(sqe = io_uring_get_sqe(&c->ring))) {
        sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
        return 0;
    }
    io_uring_prep_fsync(sqe, fd, 0);
    io_uring_sqe_set_data(sqe, NULL);
    while ((rc = io_uring_submit(&c->ring)) == -EINTR)
        ;
    if (rc < 0)
        return rt_errf(rc, "%s: io_uring submit of fsync failed: %s", path, strerror(-rc));
    c->sync_busy = 1;
    return 1;
}

/* Makes `fd` durable: waits for the fsync copier_sync_start() queued (`queued`), or runs one. */
static int copier_sync_finish(struct copier *c, int fd, int queued, const char *path)
{
    int rc;

    if (!queued || !c->have_ring) {
        rc = fsync(fd) < 0 ? -errno : 0;
    } else {
        /* No copy is in flight between files, so the only completion left is this fsync's. */
        while (c->sync_busy) {
            struct io_uring_cqe *cqe;
            if ((rc = io_uring_wait_cqe(&c->ring, &cqe)) == -EINTR)
                continue;
            if (rc < 0)
                return rt_errf(rc, "%s: waiting for fsync: %s", path, strerror(-rc));
            if (!io_uring_cqe_get_data(cqe)) {
                c->sync_res = cqe->res;
                c->sync_busy = 0;
            }
            io_uring_cqe_seen(&c->ring, cqe);
        }
        rc = c->sync_res;
    }
    return rc < 0 ? rt_errf(rc, "%s: fsync failed: %s", path, strerror(-rc)) : 0;
}

/* ---- one staging run -------------------------------------------------------- */

/* One file of the dataset and whether this run must (re)copy it. */
struct stage_file {
    const char *name;       /* borrowed from the dataset handle, or STAGE_MANIFEST */
    uint64_t size;
    uint64_t xxh64;
    int copy;
};

struct stage {
    struct rt_local_copy_opts o;    /* with defaults filled in */
    const char *src;
    char dest[PATH_MAX], lock_path[PATH_MAX], user_path[PATH_MAX];
    char user_name[32];             /* ringtrain-<uid> */
    char name[24];                  /* <h>: the dataset directory in it */
    char lock_name[32];             /* <h>.lock */
    uint8_t *manifest;              /* the source's manifest.json bytes */
    size_t manifest_len;
    uint64_t manifest_hash;
    struct rt_dataset *ds;
    struct stage_file *files;       /* shards in manifest order, then manifest.json */
    uint32_t nfiles;
    int userfd, dirfd, lockfd;      /* PARENT/ringtrain-<uid>, the dataset directory, the lock */
    size_t lock_len;                /* bytes of the lock file's first line (who holds it) */
    int holder_checked;             /* the holder this process waited for checked every byte (its record) */
    uint8_t *hashbuf;               /* block_bytes, for checking staged files */
    struct copier cp;
    struct rt_local_copy_result *res;
};

static int normalize_opts(const struct rt_local_copy_opts *in, struct rt_local_copy_opts *o)
{
    if (in)
        *o = *in;
    else
        memset(o, 0, sizeof(*o));
    if (o->queue_depth == 0)
        o->queue_depth = STAGE_DEFAULT_DEPTH;
    if (o->block_bytes == 0)
        o->block_bytes = STAGE_DEFAULT_BLOCK;
    if (o->max_attempts == 0)
        o->max_attempts = STAGE_DEFAULT_ATTEMPTS;
    if (o->queue_depth > STAGE_MAX_DEPTH)
        return rt_errf(-EINVAL, "queue depth %" PRIu32 ": must be 1..%u", o->queue_depth, STAGE_MAX_DEPTH);
    if (o->block_bytes < STAGE_MIN_BLOCK || o->block_bytes > STAGE_MAX_BLOCK || o->block_bytes % STAGE_MIN_BLOCK)
        return rt_errf(-EINVAL, "block size %" PRIu32 ": must be a multiple of 4 KiB in 4 KiB..64 MiB",
                       o->block_bytes);
    if ((uint64_t)o->queue_depth * o->block_bytes > STAGE_MAX_BUFFERS)
        return rt_errf(-EINVAL, "queue depth %" PRIu32 " x block size %" PRIu32 " bytes: at most 1 GiB of buffers",
                       o->queue_depth, o->block_bytes);
    if (o->max_attempts > STAGE_MAX_ATTEMPTS)
        return rt_errf(-EINVAL, "attempts %" PRIu32 ": must be 1..%u", o->max_attempts, STAGE_MAX_ATTEMPTS);
    if (!(o->lock_timeout_s >= 0))
        return rt_errf(-EINVAL, "lock timeout must be >= 0 seconds");
    if (o->engine != RT_LOCAL_COPY_ENGINE_AUTO && o->engine != RT_LOCAL_COPY_ENGINE_URING &&
        o->engine != RT_LOCAL_COPY_ENGINE_PLAIN)
        return rt_errf(-EINVAL, "unknown copy engine %d", (int)o->engine);
    if (o->verify != RT_LOCAL_COPY_VERIFY_FULL && o->verify != RT_LOCAL_COPY_VERIFY_SIZE)
        return rt_errf(-EINVAL, "unknown verify mode %d", (int)o->verify);
    return 0;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(((const struct stage_file *)a)->name, ((const struct stage_file *)b)->name);
}

/*
 * Lists the shards of every split, then manifest.json. Names that would
 * collide with the manifest, with our temporary files or with each other are
 * refused: staging two files onto one name cannot give a complete copy.
 */
static int build_file_list(struct stage *st)
{
    const struct rt_dataset_info *info = rt_dataset_info(st->ds);
    struct stage_file *sorted;
    uint32_t n = 0;

    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++)
        n += info->split[sp].nshards;
    st->files = rt_calloc((size_t)n + 1, sizeof(*st->files), "staging file list");
    if (!st->files)
        return -ENOMEM;
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++)
        for (uint32_t i = 0; i < info->split[sp].nshards; i++) {
            const struct rt_shard_ref *r = &info->split[sp].shards[i];
            const size_t len = strlen(r->file), plen = strlen(STAGE_PARTIAL);
            if (!strcmp(r->file, STAGE_MANIFEST) || (len >= plen && !strcmp(r->file + len - plen, STAGE_PARTIAL)))
                return rt_errf(-EBADMSG, "%s/%s: shard name '%s' is reserved for staging's own files", st->src,
                               STAGE_MANIFEST, r->file);
            st->files[st->nfiles++] = (struct stage_file){r->file, r->bytes, r->xxh64, 0};
        }
    sorted = rt_malloc(sizeof(*sorted) * ((size_t)st->nfiles + 1), "staging file list");
    if (!sorted)
        return -ENOMEM;
    memcpy(sorted, st->files, sizeof(*sorted) * st->nfiles);
    qsort(sorted, st->nfiles, sizeof(*sorted), name_cmp);
    for (uint32_t i = 1; i < st->nfiles; i++)
        if (!strcmp(sorted[i - 1].name, sorted[i].name)) {
            int rc = rt_errf(-EBADMSG, "%s/%s: shard file '%s' is listed twice", st->src, STAGE_MANIFEST,
                             sorted[i].name);
            free(sorted);
            return rc;
        }
    free(sorted);
    st->files[st->nfiles++] = (struct stage_file){STAGE_MANIFEST, st->manifest_len, st->manifest_hash, 0};
    return 0;
}

/* "pid N on HOST since TIME" of whoever holds the lock, for messages. */
static void lock_holder(int fd, char *out, size_t len)
{
    ssize_t n = pread(fd, out, len - 1, 0);
    /* The holder writes who it is just after taking the lock, so a process that tries the lock in between finds
     * the file empty: give the holder a moment (up to 0.1 s) before settling for "another process". */
    for (int i = 0; n <= 0 && i < 20; i++) {
        struct timespec ts = {0, 5000000L};
        nanosleep(&ts, NULL);
        n = pread(fd, out, len - 1, 0);
    }
    if (n <= 0) {
        snprintf(out, len, "another process");
        return;
    }
    out[n] = '\0';
    out[strcspn(out, "\n")] = '\0';
}

/* The realtime clock in nanoseconds: comparable across the nodes that may share a PARENT, unlike the monotonic one. */
static int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/*
 * 1 if the lock file records that its last holder checked (or copied) every
 * byte and let go after `since` (when this process began to wait): then the
 * copy it left has just been verified in full. A record older than that is
 * some earlier run's, and proves nothing about what happened while we waited.
 */
static int holder_checked(int fd, int64_t since)
{
    char text[512];
    ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
    long long sec = 0, nsec = 0;
    const char *rec;

    if (n <= 0)
        return 0;
    text[n] = '\0';
    rec = strstr(text, "\n" STAGE_LOCK_CHECKED);
    if (!rec || sscanf(rec + 1 + strlen(STAGE_LOCK_CHECKED), "%lld.%9lld", &sec, &nsec) != 2)
        return 0;
    return sec * 1000000000 + nsec >= since;
}

/*
 * Takes the exclusive flock on the destination's lock file,
 * PARENT/ringtrain-<uid>/<h>.lock, waiting (up to lock_timeout_s) while
 * another process holds it. The lock file is created in this user's own
 * directory, never through a link (O_NOFOLLOW), and stays in place for good:
 * unlinking it while someone waits on it would let a third process lock a
 * new file of the same name and copy at the same time.
 */
static int lock_acquire(struct stage *st)
{
    char holder[256], host[128] = "?", when[64] = "?";
    int fd = openat(st->userfd, st->lock_name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct stat sb;

    if (fd < 0 && errno == ELOOP)
        return rt_errf(-ELOOP, "%s: is a symbolic link: refusing to use it as the staging lock (no link is followed "
                       "under %s); remove it", st->lock_path, st->user_path);
    if (fd < 0)
        return rt_errf(-errno, "%s: cannot open the staging lock file: %s", st->lock_path, strerror(errno));
    st->lockfd = fd;
    if (fstat(fd, &sb) < 0)
        return rt_errf(-errno, "%s: %s", st->lock_path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return rt_errf(-EINVAL, "%s: not a regular file: refusing to use it as the staging lock; remove it",
                       st->lock_path);
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        const uint64_t t0 = rt_now_ns();
        const int64_t since = wall_ns();
        if (errno != EWOULDBLOCK)
            return rt_errf(-errno, "%s: flock failed: %s", st->lock_path, strerror(errno));
        st->res->waited = 1;
        lock_holder(fd, holder, sizeof(holder));
        rt_info("%s is being staged by %s; waiting for it (lock %s)", st->dest, holder, st->lock_path);
        if (st->o.lock_timeout_s == 0) {
            while (flock(fd, LOCK_EX) < 0)
                if (errno != EINTR)
                    return rt_errf(-errno, "%s: flock failed: %s", st->lock_path, strerror(errno));
        } else {
            const uint64_t limit = (uint64_t)(st->o.lock_timeout_s * 1e9);
            while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
                if (errno != EWOULDBLOCK && errno != EINTR)
                    return rt_errf(-errno, "%s: flock failed: %s", st->lock_path, strerror(errno));
                if (rt_now_ns() - t0 >= limit) {
                    lock_holder(fd, holder, sizeof(holder));
                    return rt_errf(-EBUSY, "%s is in use: %s has held its lock %s for more than %.0f s; "
                                   "wait longer (--timeout) or stage elsewhere (--to)", st->dest, holder,
                                   st->lock_path, st->o.lock_timeout_s);
                }
                struct timespec ts = {0, STAGE_LOCK_POLL_NS};
                nanosleep(&ts, NULL);
            }
        }
        st->res->wait_seconds = (double)(rt_now_ns() - t0) * 1e-9;
        st->holder_checked = holder_checked(fd, since);
    }

    /* Who holds the lock, for the messages of processes that come to wait on it; any old record goes. */
    time_t now = time(NULL);
    struct tm tm;
    gethostname(host, sizeof(host) - 1);
    if (localtime_r(&now, &tm))
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
    const int n = snprintf(holder, sizeof(holder), "pid %d on %s since %s\n", (int)getpid(), host, when);
    /* It only informs messages (and a full disk must not fail here but in the copy, with its figures). */
    if (ftruncate(fd, 0) == 0 && pwrite(fd, holder, (size_t)n, 0) == n)
        st->lock_len = (size_t)n;
    return 0;
}

/*
 * After a successful run that checked or copied every byte (not
 * --trust-size): tells the processes waiting for the lock that they need only
 * check sizes. Only a hint: failing to write it costs them a full check.
 */
static void lock_record_checked(struct stage *st)
{
    char rec[96];
    const int64_t t = wall_ns();
    const int n = snprintf(rec, sizeof(rec), STAGE_LOCK_CHECKED "%lld.%09lld\n", (long long)(t / 1000000000),
                           (long long)(t % 1000000000));

    if (st->o.verify == RT_LOCAL_COPY_VERIFY_FULL && pwrite(st->lockfd, rec, (size_t)n, (off_t)st->lock_len) != n)
        rt_errclear();
}

/*
 * Opens PARENT (created if missing; it may be shared, see parent_rules), fills
 * in the paths (absolute, PARENT canonical now that it exists) and opens this
 * user's PARENT/ringtrain-<uid> in it, created 0700 or checked: a directory
 * there that someone else owns or can write is refused, since they could
 * replace what we check or plant links where we write.
 */
static int user_dir_open(struct stage *st)
{
    char parent[PATH_MAX];
    const char *given = pick_parent(st->o.parent);
    int pfd = -1, rc;

    if ((rc = absolute_dir(given, parent, sizeof(parent))) < 0 ||
        (rc = rt_dir_open_owned(AT_FDCWD, given, parent, &parent_rules, &pfd)) < 0 ||
        (rc = absolute_dir(given, parent, sizeof(parent))) < 0 ||
        (rc = rt_path_join(st->user_path, sizeof(st->user_path), parent, st->user_name)) < 0 ||
        (rc = dest_paths(parent, st->manifest_hash, st->dest, sizeof(st->dest), st->lock_path,
                         sizeof(st->lock_path))) < 0)
        goto out;
    snprintf(st->res->path, sizeof(st->res->path), "%s", st->dest);
    rc = rt_dir_open_owned(pfd, st->user_name, st->user_path, &own_rules, &st->userfd);
out:
    if (pfd >= 0)
        close(pfd);
    return rc;
}

/* Creates the dataset directory in this user's space (under the lock) and opens it, checked as its parent was. */
static int dest_open(struct stage *st)
{
    return rt_dir_open_owned(st->userfd, st->name, st->dest, &own_rules, &st->dirfd);
}

static int dest_fsync(struct stage *st)
{
    if (fsync(st->dirfd) < 0 && errno != EINVAL)
        return rt_errf(-errno, "%s: fsync of the directory failed: %s", st->dest, strerror(errno));
    return 0;
}

/* Deletes *.partial files that an interrupted run left behind; we hold the lock, so none is live. */
static int remove_partials(struct stage *st)
{
    const size_t plen = strlen(STAGE_PARTIAL);
    int fd = dup(st->dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *e;

    if (!d) {
        if (fd >= 0)
            close(fd);
        return rt_errf(-errno, "%s: cannot list: %s", st->dest, strerror(errno));
    }
    while ((e = readdir(d))) {
        const size_t len = strlen(e->d_name);
        if (len <= plen || strcmp(e->d_name + len - plen, STAGE_PARTIAL) != 0)
            continue;
        if (unlinkat(st->dirfd, e->d_name, 0) < 0) {
            int rc = rt_errf(-errno, "%s/%s: cannot remove: %s", st->dest, e->d_name, strerror(errno));
            closedir(d);
            return rc;
        }
        st->res->partials_removed++;
    }
    closedir(d);
    if (st->res->partials_removed)
        rt_info("%s: removed %u partial file%s left by an interrupted run", st->dest, st->res->partials_removed,
                st->res->partials_removed == 1 ? "" : "s");
    return 0;
}

/* XXH64 of the staged file open as `fd`, read through the hash buffer. */
static int hash_staged(struct stage *st, int fd, uint64_t *out)
{
    XXH64_state_t *h = XXH64_createState();
    int rc = 0;

    if (!h)
        return rt_errf(-ENOMEM, "out of memory");
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    XXH64_reset(h, 0);
    for (;;) {
        ssize_t n = read(fd, st->hashbuf, st->o.block_bytes);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = rt_errf(-errno, "read failed: %s", strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        XXH64_update(h, st->hashbuf, (size_t)n);
        st->res->bytes_hashed += (uint64_t)n;
    }
    *out = XXH64_digest(h);
out:
    XXH64_freeState(h);
    return rc;
}

/* 1 if the staged manifest.json is a regular file (not a link) holding exactly the source's bytes. */
static int staged_manifest_matches(struct stage *st)
{
    char path[PATH_MAX];
    uint8_t *text;
    size_t len;
    int same;

    if (rt_path_join(path, sizeof(path), st->dest, STAGE_MANIFEST) < 0 ||
        rt_file_read_at(st->dirfd, STAGE_MANIFEST, path, &text, &len) < 0) {
        rt_errclear();
        return 0;
    }
    same = len == st->manifest_len && memcmp(text, st->manifest, len) == 0;
    free(text);
    return same;
}

/*
 * Whether staged shard `f` must be copied again: 0 when its size (and, with
 * `hash`, its XXH64) match the manifest; 1 when missing or not; -errno.
 * The file is opened without following a link and checked through that fd,
 * so what is hashed is what was checked; a link in its place is replaced by
 * the copy (renameat replaces the link itself; its target is never touched).
 */
static int staged_mismatch(struct stage *st, const struct stage_file *f, int hash)
{
    struct rt_local_copy_result *res = st->res;
    struct stat sb;
    uint64_t got = 0;
    int fd = openat(st->dirfd, f->name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC), rc = 0;

    if (fd < 0 && errno == ENOENT)
        return 1;
    if (fd < 0 && errno == ELOOP) {
        rt_warn("%s/%s: a symbolic link, not a staged copy: replacing it (its target is left alone)", st->dest,
                f->name);
        res->files_damaged++;
        return 1;
    }
    if (fd < 0)
        return rt_errf(-errno, "%s/%s: %s", st->dest, f->name, strerror(errno));
    if (fstat(fd, &sb) < 0) {
        rc = rt_errf(-errno, "%s/%s: %s", st->dest, f->name, strerror(errno));
    } else if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != f->size) {
        rt_warn("%s/%s: staged copy has %lld bytes, the manifest says %" PRIu64 ": copying it again", st->dest,
                f->name, (long long)sb.st_size, f->size);
        res->files_damaged++;
        rc = 1;
    } else if (hash) {
        int hrc = hash_staged(st, fd, &got);
        res->files_hashed++;
        if (hrc < 0) {
            rt_warn("%s/%s: cannot check the staged copy (%s): copying it again", st->dest, f->name, rt_errmsg());
            res->files_damaged++;
            rc = 1;
        } else if (got != f->xxh64) {
            rt_warn("%s/%s: staged copy has xxh64 %016" PRIx64 ", the manifest says %016" PRIx64
                    ": copying it again", st->dest, f->name, got, f->xxh64);
            res->files_damaged++;
            rc = 1;
        }
    }
    close(fd);
    return rc;
}

/*
 * Decides which files to copy. A staged shard is kept when its size (and,
 * unless trusted, its XXH64) matches the manifest. Sizes alone are trusted
 * with VERIFY_SIZE, or when this process waited for the lock, the holder
 * left a complete copy and recorded that it checked or copied every byte of
 * it as it let go (holder_checked): nobody but this user can write here, so
 * those bytes are as they were checked. Returns the number of files to copy,
 * or -errno.
 */
static int plan_copies(struct stage *st)
{
    struct rt_local_copy_result *res = st->res;
    struct stat sb;
    const uint64_t t0 = rt_now_ns();
    int complete = 0, ncopy = 0;

    if (fstatat(st->dirfd, STAGE_MANIFEST, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
        complete = S_ISREG(sb.st_mode) && staged_manifest_matches(st);
        if (!complete)
            rt_warn("%s/%s differs from %s/%s: replacing it", st->dest, STAGE_MANIFEST, st->src, STAGE_MANIFEST);
    }
    const int hash = st->o.verify == RT_LOCAL_COPY_VERIFY_FULL && !(complete && res->waited && st->holder_checked);
    for (uint32_t i = 0; i + 1 < st->nfiles; i++) {
        struct stage_file *f = &st->files[i];
        int rc = staged_mismatch(st, f, hash);
        if (rc < 0)
            return rc;
        f->copy = rc;
        ncopy += f->copy;
    }
    st->files[st->nfiles - 1].copy = ncopy > 0 || !complete;
    ncopy += st->files[st->nfiles - 1].copy;
    res->check_seconds = (double)(rt_now_ns() - t0) * 1e-9;
    return ncopy;
}

/* Checks that every source file to copy can be opened and has the manifest's size. */
static int check_sources(struct stage *st)
{
    char path[PATH_MAX];
    struct stat sb;

    for (uint32_t i = 0; i + 1 < st->nfiles; i++) {
        const struct stage_file *f = &st->files[i];
        int fd, rc;
        if (!f->copy)
            continue;
        if ((rc = rt_path_join(path, sizeof(path), st->src, f->name)) < 0)
            return rc;
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT)
            return rt_errf(-ENOENT, "%s: missing (listed in %s/%s)", path, st->src, STAGE_MANIFEST);
        if (fd < 0)
            return rt_errf(-errno, "%s: cannot open: %s", path, strerror(errno));
        rc = fstat(fd, &sb);
        close(fd);
        if (rc < 0)
            return rt_errf(-errno, "%s: %s", path, strerror(errno));
        if (!S_ISREG(sb.st_mode))
            return rt_errf(-EINVAL, "%s: not a regular file", path);
        if ((uint64_t)sb.st_size != f->size)
            return rt_errf(-EBADMSG, "%s: %lld bytes, the manifest says %" PRIu64 ": the source dataset is "
                           "damaged or was changed (check it with `ringtrain verify %s`)", path,
                           (long long)sb.st_size, f->size, st->src);
    }
    return 0;
}

/* Bytes still to copy from file `from` on. */
static uint64_t bytes_to_copy(const struct stage *st, uint32_t from)
{
    uint64_t n = 0;
    for (uint32_t i = from; i < st->nfiles; i++)
        n += st->files[i].copy ? st->files[i].size : 0;
    return n;
}

/* Bytes an unprivileged user may still write in the destination; UINT64_MAX when unknown. */
static uint64_t space_available(const struct stage *st)
{
    struct statvfs sv;
    return fstatvfs(st->dirfd, &sv) == 0 ? (uint64_t)sv.f_bavail * sv.f_frsize : UINT64_MAX;
}

/* The out-of-space message: `what` happened, what staging needed and what there is. */
static int no_space(const struct stage *st, int code, uint32_t from, const char *what)
{
    char need[32], avail[32];

    const uint64_t free_bytes = space_available(st);

    rt_format_bytes((double)bytes_to_copy(st, from), need, sizeof(need));
    if (free_bytes == UINT64_MAX)
        snprintf(avail, sizeof(avail), "an unknown amount");
    else
        rt_format_bytes((double)free_bytes, avail, sizeof(avail));
    return rt_errf(code, "%s: %s: the files still to copy need %s, %s is available; free some space or "
                   "stage elsewhere (--to)", st->dest, what, need, avail);
}

/* A shard copied and checked but not yet fsynced and renamed. */
struct pending {
    int fd;
    int sync_queued;        /* copier_sync_start() queued its fsync */
    const char *name;
    char tmp[NAME_MAX + 16];
};

/* fsync, close and rename a checked copy into place. */
static int pending_finish(struct stage *st, struct pending *p)
{
    char path[PATH_MAX];
    int rc;

    if (p->fd < 0)
        return 0;
    if (rt_path_join(path, sizeof(path), st->dest, p->tmp) < 0)
        rt_errclear(); /* only names the file in messages; a truncated name will do */
    rc = copier_sync_finish(&st->cp, p->fd, p->sync_queued, path);
    close(p->fd);
    p->fd = -1;
    if (rc == 0 && renameat(st->dirfd, p->tmp, st->dirfd, p->name) < 0)
        rc = rt_errf(-errno, "%s: rename to %s failed: %s", path, p->name, strerror(errno));
    if (rc < 0)
        unlinkat(st->dirfd, p->tmp, 0);
    return rc;
}

/*
 * Copies one shard to <name>.partial (created afresh: rt_file_create_fresh)
 * and hashes what was written. Leaves the open output in p->fd (not yet
 * fsynced) and the XXH64 in *hash; on failure removes the partial file.
 */
static int copy_one(struct stage *st, const struct stage_file *f, struct pending *p, uint64_t *hash)
{
    char in_path[PATH_MAX], out_path[PATH_MAX];
    XXH64_state_t *h = XXH64_createState();
    struct copy_job j = {-1, -1, in_path, out_path, f->size};
    int rc;

    p->fd = -1;
    p->sync_queued = 0;
    p->name = f->name;
    snprintf(p->tmp, sizeof(p->tmp), "%s%s", f->name, STAGE_PARTIAL);
    progress_file(&st->cp, f->name, f->size, st->res->bytes_copied);
    if (!h)
        return rt_errf(-ENOMEM, "out of memory");
    if ((rc = rt_path_join(in_path, sizeof(in_path), st->src, f->name)) < 0 ||
        (rc = rt_path_join(out_path, sizeof(out_path), st->dest, p->tmp)) < 0)
        goto out;
    j.in = open(in_path, O_RDONLY | O_CLOEXEC);
    if (j.in < 0) {
        rc = rt_errf(errno == ENOENT ? -ENOENT : -errno, "%s: %s", in_path,
                     errno == ENOENT ? "missing (was it removed while staging?)" : strerror(errno));
        goto out;
    }
    posix_fadvise(j.in, 0, 0, POSIX_FADV_SEQUENTIAL);
    /* A fresh inode, never an old file or a link planted under the name (O_EXCL after unlinkat). */
    if ((rc = rt_file_create_fresh(st->dirfd, p->tmp, out_path, 0644, &j.out)) < 0) {
        j.out = -1;
        goto out;
    }
    /* Reserving the space up front turns a full disk into an early, clean error. */
    if (f->size > 0 && fallocate(j.out, 0, 0, (off_t)f->size) < 0 && (errno == ENOSPC || errno == EDQUOT)) {
        rc = rt_errf(-errno, "%s: %s", out_path, strerror(errno));
        goto out;
    }
    XXH64_reset(h, 0);
    rc = st->cp.kind == RT_LOCAL_COPY_ENGINE_URING ? copy_uring(&st->cp, &j, h) : copy_plain(&st->cp, &j, h);
    if (rc == 0) {
        *hash = XXH64_digest(h);
        p->fd = j.out;
        j.out = -1;
    }
out:
    if (j.in >= 0)
        close(j.in);
    if (j.out >= 0) {
        close(j.out);
        unlinkat(st->dirfd, p->tmp, 0);
    }
    XXH64_freeState(h);
    return rc;
}

/*
 * Copies every shard marked for copying, each up to max_attempts times until
 * its bytes match the manifest. A file's fsync runs while the next file is
 * copied (an io_uring fsync request; with read/write, writeback started by
 * sync_file_range), and its rename follows once both are done, so the disk
 * writes one file back while the next is read; a crash in between costs
 * only that file.
 */
static int copy_shards(struct stage *st)
{
    struct pending done = {.fd = -1};
    int rc = 0;

    for (uint32_t i = 0; i + 1 < st->nfiles && rc == 0; i++) {
        const struct stage_file *f = &st->files[i];
        struct pending p;
        uint64_t hash = 0;
        if (!f->copy)
            continue;
        for (uint32_t attempt = 1;; attempt++) {
            rc = copy_one(st, f, &p, &hash);
            if (rc == -ENOSPC || rc == -EDQUOT) {
                char what[NAME_MAX + 64];
                snprintf(what, sizeof(what), "out of space while copying %s (%s)", f->name, strerror(-rc));
                rc = no_space(st, rc, i, what);
            }
            if (rc < 0 || hash == f->xxh64)
                break;
            close(p.fd);
            unlinkat(st->dirfd, p.tmp, 0);
            if (attempt == st->o.max_attempts) {
                rc = rt_errf(-EBADMSG, "%s/%s: copied %" PRIu32 " time%s and the bytes never matched the "
                             "manifest (xxh64 %016" PRIx64 ", expected %016" PRIx64 "): the source file is "
                             "damaged or changing (check it with `ringtrain verify %s`)", st->src, f->name,
                             attempt, attempt == 1 ? "" : "s", hash, f->xxh64, st->src);
                break;
            }
            st->res->retries++;
            rt_warn("%s/%s: copy %" PRIu32 " of %" PRIu32 " does not match the manifest (xxh64 %016" PRIx64
                    ", expected %016" PRIx64 "): copying it again", st->src, f->name, attempt,
                    st->o.max_attempts, hash, f->xxh64);
        }
        if (rc < 0)
            break;
        st->res->files_copied++;
        st->res->bytes_copied += f->size;
        /* The previous file's fsync ran while this one was copied; only then queue this one's. */
        rc = pending_finish(st, &done);
        done = p;
        if (rc == 0) {
            int q = copier_sync_start(&st->cp, done.fd, f->name);
            done.sync_queued = q > 0;
            rc = q < 0 ? q : 0;
        }
    }
    /* A checked copy is kept even when a later file failed: the next run need not redo it. */
    int rc2 = pending_finish(st, &done);
    if (rc == 0)
        rc = rc2;
    return rc == 0 ? dest_fsync(st) : rc;
}

/*
 * Writes manifest.json last: to a temporary name (created afresh, as the
 * shards' are), fsynced, read back and checked against the hash the
 * directory is named after, then renamed and the directory fsynced. From that
 * rename on, the copy is complete.
 */
static int write_manifest(struct stage *st)
{
    static const char tmpname[] = STAGE_MANIFEST STAGE_PARTIAL;
    char tmp[PATH_MAX], path[PATH_MAX];
    uint8_t *back = NULL;
    size_t len = 0;
    int fd, rc;

    if ((rc = rt_path_join(path, sizeof(path), st->dest, STAGE_MANIFEST)) < 0 ||
        (rc = rt_path_join(tmp, sizeof(tmp), st->dest, tmpname)) < 0)
        return rc;
    progress_file(&st->cp, STAGE_MANIFEST, st->manifest_len, st->res->bytes_copied);
    rc = rt_file_create_fresh(st->dirfd, tmpname, tmp, 0644, &fd);
    if (rc == -ENOSPC || rc == -EDQUOT)
        return no_space(st, rc, st->nfiles - 1, "out of space for manifest.json");
    if (rc < 0)
        return rc;
    rc = rt_write_full(fd, st->manifest, st->manifest_len, tmp);
    if (rc == -ENOSPC || rc == -EDQUOT)
        rc = no_space(st, rc, st->nfiles - 1, "out of space for manifest.json");
    if (rc == 0 && fsync(fd) < 0)
        rc = rt_errf(-errno, "%s: fsync failed: %s", tmp, strerror(errno));
    close(fd);
    if (rc == 0 && (rc = rt_file_read_at(st->dirfd, tmpname, tmp, &back, &len)) == 0 &&
        XXH64(back, len, 0) != st->manifest_hash)
        rc = rt_errf(-EIO, "%s: read back with xxh64 %016" PRIx64 ", expected %016" PRIx64, tmp,
                     (uint64_t)XXH64(back, len, 0), st->manifest_hash);
    free(back);
    if (rc == 0 && renameat(st->dirfd, tmpname, st->dirfd, STAGE_MANIFEST) < 0)
        rc = rt_errf(-errno, "%s: rename to %s failed: %s", tmp, path, strerror(errno));
    if (rc < 0) {
        unlinkat(st->dirfd, tmpname, 0);
        return rc;
    }
    st->res->files_copied++;
    st->res->bytes_copied += st->manifest_len;
    progress_report(&st->cp, st->manifest_len);
    return dest_fsync(st);
}

/* Everything after the lock is taken. */
static int stage_locked(struct stage *st)
{
    int rc, ncopy;

    if ((rc = dest_open(st)) < 0 || (rc = remove_partials(st)) < 0)
        return rc;
    st->hashbuf = rt_malloc(st->o.block_bytes, "staging hash buffer");
    if (!st->hashbuf)
        return -ENOMEM;
    if ((ncopy = plan_copies(st)) <= 0)
        return ncopy;
    /* Staging a staged copy onto itself can check it, never repair it: it is its own source. */
    struct stat a, b;
    if (stat(st->src, &a) == 0 && fstat(st->dirfd, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        return rt_errf(-EINVAL, "%s is this staged copy itself, and it is incomplete or damaged; stage from the "
                       "original dataset", st->src);

    /* Whatever is about to be repaired, the directory must stop looking complete first. */
    if (unlinkat(st->dirfd, STAGE_MANIFEST, 0) == 0) {
        if ((rc = dest_fsync(st)) < 0)
            return rc;
    } else if (errno != ENOENT) {
        return rt_errf(-errno, "%s/%s: cannot remove: %s", st->dest, STAGE_MANIFEST, strerror(errno));
    }
    if ((rc = check_sources(st)) < 0)
        return rc;
    if (bytes_to_copy(st, 0) > space_available(st))
        return no_space(st, -ENOSPC, 0, "not enough space");

    st->cp.progress = st->o.progress;
    st->cp.progress_ctx = st->o.progress_ctx;
    st->cp.prog.bytes_total = bytes_to_copy(st, 0);
    const uint64_t t0 = rt_now_ns();
    if (ncopy > 1) { /* not just manifest.json: the buffers and the ring are worth setting up */
        if ((rc = copier_setup(&st->cp, &st->o)) < 0)
            return rc;
        st->res->engine = st->cp.kind;
        if ((rc = copy_shards(st)) < 0)
            return rc;
    }
    if ((rc = write_manifest(st)) < 0)
        return rc;
    st->res->copy_seconds = (double)(rt_now_ns() - t0) * 1e-9;
    return 0;
}

int rt_local_copy_dataset(const char *src, const struct rt_local_copy_opts *opts,
                          struct rt_local_copy_result *res)
{
    char manifest_path[PATH_MAX];
    struct stage st = {.src = src, .userfd = -1, .dirfd = -1, .lockfd = -1, .res = res};
    const uint64_t t0 = rt_now_ns();
    int rc;

    memset(res, 0, sizeof(*res));
    if ((rc = normalize_opts(opts, &st.o)) < 0)
        return rc;
    res->queue_depth = st.o.queue_depth;
    res->block_bytes = st.o.block_bytes;
    if ((rc = manifest_load(src, &st.manifest, &st.manifest_len, &st.manifest_hash)) < 0)
        return rc;
    if ((rc = rt_path_join(manifest_path, sizeof(manifest_path), src, STAGE_MANIFEST)) < 0 ||
        (rc = rt_dataset_parse_manifest(src, (const char *)st.manifest, st.manifest_len, manifest_path,
                                        &st.ds)) < 0 ||
        (rc = build_file_list(&st)) < 0)
        goto out;
    stage_names(st.manifest_hash, st.user_name, st.name);
    snprintf(st.lock_name, sizeof(st.lock_name), "%s.lock", st.name);
    snprintf(res->manifest_xxh64, sizeof(res->manifest_xxh64), "%016" PRIx64, st.manifest_hash);
    res->files = st.nfiles;
    for (uint32_t i = 0; i < st.nfiles; i++)
        res->bytes_total += st.files[i].size;
    if ((rc = user_dir_open(&st)) < 0 || (rc = lock_acquire(&st)) < 0)
        goto out;
    if ((rc = stage_locked(&st)) == 0)
        lock_record_checked(&st);
out:
    copier_free(&st.cp);
    if (st.dirfd >= 0)
        close(st.dirfd);
    if (st.userfd >= 0)
        close(st.userfd);
    if (st.lockfd >= 0)
        close(st.lockfd); /* releases the flock */
    free(st.hashbuf);
    free(st.files);
    rt_dataset_close(st.ds);
    free(st.manifest);
    res->seconds = (double)(rt_now_ns() - t0) * 1e-9;
    return rc;
}
