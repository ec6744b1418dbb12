/*
 * local_copy.h - node-local dataset copies (`ringtrain stage`, `train
 * --stage-to`): a packed dataset copied from shared storage to node-local
 * disk once per node, checked byte for byte against its manifest.
 *
 * This module knows nothing about decoding, batches or the ring: it reads the
 * manifest with the dataset reader (loader/dataset.h) and copies files.
 * Functions return 0 or -errno with the reason in rt_errmsg(), unless a
 * comment says otherwise.
 */
#ifndef RT_STAGING_LOCAL_COPY_H
#define RT_STAGING_LOCAL_COPY_H

#include <stddef.h>
#include <stdint.h>

/*
 * Staging copies a packed dataset (docs/FORMAT.md: manifest.json + shards)
 * from shared storage to node-local disk, so that training reads it from
 * there. The copy lands in PARENT/ringtrain-<uid>/<h>, where <uid> is the
 * effective user id of the caller and <h> the 16 lowercase hex digits of the
 * XXH64 (seed 0) of the source's manifest.json: the same dataset always maps
 * to the same directory for one user, a repacked one to a new one, and two
 * users never share a copy.
 *
 *   PARENT/                      may be shared (/tmp): created if missing (0755),
 *                                accepted when owned by this user or root and,
 *                                if group or others may write it, sticky
 *     ringtrain-<uid>/           this user's space: created 0700
 *       <h>/                     one dataset: created 0700
 *       <h>.lock                 its lock file (0600)
 *
 * Guarantees:
 *  - Shared nodes. PARENT/ringtrain-<uid> and <h> are opened with O_NOFOLLOW
 *    and checked with fstat() on the opened directory (never stat then open by
 *    name): one that is a link, not a directory, owned by another user, or
 *    writable by group or others is refused with an error naming the path and
 *    (for another owner) the user name and uid -- "PARENT/ringtrain-0: owned
 *    by NAME (uid 998), not by root (uid 0): refusing to stage into a directory
 *    another user controls; remove it or use --to DIR". Everything in them is
 *    reached relative to those fds (openat, renameat, unlinkat, O_NOFOLLOW);
 *    files are created afresh with O_EXCL after unlinkat() of whatever had the
 *    name, so no link is ever followed and what was checked stays as it was:
 *    nobody but this user (and root) can write there.
 *  - Each file is written under a temporary name (<file>.partial), its bytes
 *    hashed as they are written and compared with the manifest's size and
 *    XXH64, fsynced, then renamed; the directory is fsynced. manifest.json
 *    is written last (and read back and checked against <h>), so a staged
 *    directory that holds manifest.json is complete and verified; one without
 *    it is not a dataset.
 *  - One process per destination at a time: an exclusive flock() on
 *    PARENT/ringtrain-<uid>/<h>.lock. Others wait, then find the copy done.
 *    The kernel drops the lock when its holder dies, so none is ever stale;
 *    the lock file itself is left in place (removing it would race).
 *  - Resumable: files already staged and matching are kept; *.partial files
 *    left by an interrupted run are deleted and those files copied afresh.
 *  - Idempotent: a second call copies nothing. It still checks every staged
 *    file's size, and by default its XXH64 too (RT_LOCAL_COPY_VERIFY_SIZE
 *    skips the hashing), so a file changed since (even to other bytes of the
 *    same size) is found and copied again. A process that had to wait for the
 *    lock checks sizes only when the holder it waited for recorded in the lock
 *    file, as it let go, that it had checked or copied every byte (a holder
 *    with VERIFY_SIZE records nothing); otherwise it checks in full.
 *  - A staged file found damaged (or a link in its place) is copied again
 *    (manifest.json is removed first). A file whose copy does not match the
 *    manifest max_attempts times in a row is an error naming it (the source
 *    itself is damaged).
 *  - Out of space: statvfs() is checked before copying (needed vs
 *    available); ENOSPC while copying is reported with the same figures.
 */

enum rt_local_copy_engine {
    RT_LOCAL_COPY_ENGINE_AUTO = 0,  /* io_uring; read/write with a one-line notice if unavailable */
    RT_LOCAL_COPY_ENGINE_URING,     /* io_uring or fail */
    RT_LOCAL_COPY_ENGINE_PLAIN,     /* read/write, one block at a time */
};

enum rt_local_copy_verify {
    RT_LOCAL_COPY_VERIFY_FULL = 0,  /* files already staged: size and whole-file XXH64 */
    RT_LOCAL_COPY_VERIFY_SIZE,      /* files already staged: size only */
};

/*
 * How far a copy has got, as passed to rt_local_copy_opts.progress after each
 * block written. Bytes count what this call copies, not files found already
 * staged. A file copied again (its bytes did not match the manifest) starts
 * over from file_done = 0, so bytes_done can go back by what that attempt had
 * written; it reaches bytes_total when the last file is written.
 */
struct rt_local_copy_progress {
    const char *file;           /* the file being copied, relative to the dataset
                                   directory (a shard or manifest.json); borrowed
                                   for the duration of the call */
    uint64_t file_done;         /* its bytes written so far */
    uint64_t file_bytes;        /* its size */
    uint64_t bytes_done;        /* bytes written so far, all files of this call */
    uint64_t bytes_total;       /* bytes this call has to copy, all files */
};

struct rt_local_copy_opts {
    const char *parent;         /* directory to stage under (created if missing); NULL =
                                   $SLURM_TMPDIR, else $TMPDIR, else /tmp. Borrowed. */
    uint32_t queue_depth;       /* blocks in flight, 1..4096; 0 = 32 */
    uint32_t block_bytes;       /* bytes per read/write, a multiple of 4 KiB up to 64 MiB;
                                   0 = 1 MiB */
    enum rt_local_copy_engine engine;
    enum rt_local_copy_verify verify;
    uint32_t max_attempts;      /* copies of one file before giving up, 1..100; 0 = 3 */
    double lock_timeout_s;      /* > 0: give up after waiting this long for another
                                   process's lock (-EBUSY); 0 = wait as long as it takes */
    /*
     * Called after each block written (each read/write unit of block_bytes,
     * the last one of a file shorter; manifest.json as one block), from the
     * thread that called rt_local_copy_dataset(); no further reads or writes
     * are queued until it returns. May be NULL. It must not stage the same
     * destination again (this call holds its lock).
     */
    void (*progress)(void *ctx, const struct rt_local_copy_progress *p);
    void *progress_ctx;
};

struct rt_local_copy_result {
    char path[4096];            /* the staged dataset directory */
    char manifest_xxh64[17];    /* <h>: XXH64 of manifest.json, 16 hex digits */
    enum rt_local_copy_engine engine; /* URING or PLAIN when something was copied, else AUTO */
    uint32_t queue_depth;       /* the options as applied (defaults filled in) */
    uint32_t block_bytes;
    uint32_t files;             /* files in the dataset, manifest.json included */
    uint32_t files_copied;      /* files this call wrote */
    uint32_t files_damaged;     /* staged files found with a wrong size or checksum (recopied) */
    uint32_t files_hashed;      /* staged files whose XXH64 was checked without copying */
    uint32_t partials_removed;  /* *.partial files of an interrupted run deleted */
    uint32_t retries;           /* copies repeated because the bytes did not match */
    uint64_t bytes_total;       /* all files */
    uint64_t bytes_copied;
    uint64_t bytes_hashed;      /* bytes read to check files already staged */
    int waited;                 /* 1 if another process held the lock when this one came */
    double wait_seconds;        /* waiting for that lock */
    double check_seconds;       /* checking what was already staged */
    double copy_seconds;        /* copying, fsyncs and renames */
    double seconds;             /* the whole call */
};

/*
 * Writes the directory `src` would be staged to (PARENT/ringtrain-<uid>/<h>)
 * into out[len], reading `src`/manifest.json; `parent` as in
 * rt_local_copy_opts. Copies nothing, creates and checks nothing. Returns 0
 * or -errno.
 */
int rt_local_copy_dest(const char *src, const char *parent, char *out, size_t len);

/*
 * Stages the dataset at `src` (see above) and fills `res` (required). Blocks
 * while another process stages the same dataset under the same parent.
 * Returns 0 when res->path holds a complete, verified copy; -errno otherwise
 * with the reason in rt_errmsg(), naming the file: -ENOENT / -EACCES for a
 * missing or unreadable source file, -EBADMSG for a source file whose bytes
 * never matched the manifest, -ENOSPC (needed vs available), -EBUSY when
 * lock_timeout_s ran out, -EPERM / -ELOOP / -ENOTDIR for a directory of the
 * layout above that another user controls or can write, or that is a link
 * or not a directory (-ELOOP too for a link as the lock file), -EINVAL for
 * bad options. A failure never leaves manifest.json beside shards that are
 * not all verified.
 * Progress notes (waiting for the lock, the io_uring fallback, files copied
 * again) go through rt_info/rt_warn; byte counts through opts->progress.
 * Thread-safe for different destinations;
 * for one destination, processes and threads serialize on the lock.
 */
int rt_local_copy_dataset(const char *src, const struct rt_local_copy_opts *opts,
                          struct rt_local_copy_result *res);

#endif /* RT_STAGING_LOCAL_COPY_H */
