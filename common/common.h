/*
 * common.h - the few things every ringtrain module needs: error reporting,
 * logging, the clock, a counter-based RNG and checked allocation.
 *
 * Errors. Library functions return 0 (or a count) on success and -errno on
 * failure. The human-readable reason -- naming the file, shard, block, record
 * or byte offset and what was expected -- is stored per thread by rt_errf()
 * and read back with rt_errmsg(). A caller that adds context wraps the
 * message with rt_errf(code, "%s: %s", ctx, rt_errmsg()).
 *
 * This header does not know about CUDA, MPI or any model.
 */
#ifndef RT_COMMON_H
#define RT_COMMON_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define RT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define RT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define RT_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- errors ------------------------------------------------------------ */

/*
 * Records a formatted message as this thread's last error and returns `code`
 * unchanged, so that `return rt_errf(-EINVAL, "...", ...)` reads naturally.
 * `code` should be a negative errno. Thread-safe (thread-local storage).
 */
int rt_errf(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Same as rt_errf() with a va_list. */
int rt_verrf(int code, const char *fmt, va_list ap);

/*
 * Returns this thread's last error message; "" when none was set. The pointer
 * stays valid until this thread's next rt_errf().
 */
const char *rt_errmsg(void);

/* Clears this thread's last error message. */
void rt_errclear(void);

/* ---- logging ----------------------------------------------------------- */

enum rt_log_level { RT_LOG_DEBUG, RT_LOG_INFO, RT_LOG_WARN, RT_LOG_ERROR };

/*
 * Sets the `[rank/world]` prefix and the minimum level printed. Called once at
 * start-up, before any thread is started; the defaults are rank 0 of 1, INFO.
 */
void rt_log_setup(int rank, int world, enum rt_log_level min_level);

/* Prints one line to stderr as "[rank/world] message". Thread-safe. */
void rt_log(enum rt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define rt_info(...) rt_log(RT_LOG_INFO, __VA_ARGS__)
#define rt_warn(...) rt_log(RT_LOG_WARN, __VA_ARGS__)

/* ---- clock ------------------------------------------------------------- */

/* Monotonic time in nanoseconds. */
uint64_t rt_now_ns(void);
/* When this process was started (exec), on rt_now_ns()'s clock: from /proc/self/stat's start time, which
 * counts clock ticks (10 ms) since boot. 0 when it cannot be read. */
uint64_t rt_process_start_ns(void);
/* rt_now_ns()'s stamp `t` as Unix time in seconds (CLOCK_REALTIME), for comparing with clocks outside the
 * process (a launcher's start); as exact as the two clocks read back to back. */
double rt_unix_time_of(uint64_t t);

/* ---- counter-based RNG --------------------------------------------------- */

/*
 * Philox4x32-10 (Salmon et al., SC'11): the output for (key, counter) depends
 * on nothing else, so a stream keyed by (seed, epoch, sample id) gives the
 * same numbers whatever thread draws them and in whatever order.
 */
struct rt_rng {
    uint32_t key[2];
    uint32_t ctr[4];
    uint32_t buf[4];
    unsigned used; /* words of buf already handed out */
};

/*
 * One Philox4x32-10 block: the four words for (key, ctr), a pure function.
 * For code that needs random access into a stream (each thread computing the
 * draws for its own range of counters) rather than rt_rng's sequential
 * stream; rt_rng below is built on it, so both give the same words.
 */
void rt_philox4x32(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]);

/* Starts a stream for (seed, stream id); counter at 0. */
void rt_rng_init(struct rt_rng *r, uint64_t seed, uint64_t stream);
uint32_t rt_rng_u32(struct rt_rng *r);
uint64_t rt_rng_u64(struct rt_rng *r);
/* Uniform in [0, n) without modulo bias; n > 0. */
uint32_t rt_rng_below(struct rt_rng *r, uint32_t n);
/* Uniform float in [0, 1). */
float rt_rng_uniform(struct rt_rng *r);
/* Standard normal (Box-Muller). */
float rt_rng_normal(struct rt_rng *r);

/* ---- memory -------------------------------------------------------------- */

/*
 * malloc/calloc/realloc that record an -ENOMEM error naming `what` and the
 * size on failure (and return NULL). Never abort.
 */
void *rt_malloc(size_t n, const char *what);
void *rt_calloc(size_t count, size_t size, const char *what);
void *rt_realloc(void *p, size_t n, const char *what);

/* ---- small text helpers ---------------------------------------------------- */

/*
 * Parses a byte size such as "64M", "1.5G", "4096" or "512KiB" (powers of
 * 1024). Returns 0 and stores the value, or -EINVAL.
 */
int rt_parse_size(const char *s, uint64_t *out);

/* Formats `bytes` as "12.3 MB" (powers of 1000, as throughput is quoted). */
void rt_format_bytes(double bytes, char *buf, size_t len);

/* Appends printf-style text to the NUL-terminated string in buf[len], cut at its end; a full buf is left as is. */
void rt_appendf(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/*
 * The double a Python script holds for a hyperparameter that reached us as a
 * float: the shortest decimal that reads back as `f` (what the user typed,
 * for any value written with up to 9 significant digits), read as a double.
 * PyTorch computes 1 - beta1, lr * wd, momentum * mean ... from that double,
 * and (double)f differs from it in the ninth digit, enough to move a float
 * result by an ulp; the backends compute their scalars from this instead.
 */
double rt_decimal_double(float f);

/* ---- the input's normalisation ------------------------------------------------------ */

/*
 * The table of a uint8 image's normalisation: lut[ch * 256 + v] = (v / 255 -
 * mean[ch]) / std[ch] in float, for `channels` channels (mean and std on the
 * [0, 1] scale, as torchvision's ToTensor + Normalize). The trainer's input op
 * (compute) and the Python Loader's float batches read it: one expression,
 * the same bits.
 */
void rt_norm_lut(uint32_t channels, const float *mean, const float *std, float *lut);

/* ---- CPUs ----------------------------------------------------------------- */

/*
 * The number of CPUs this process may use: its sched_getaffinity() mask,
 * lowered to SLURM_CPUS_PER_TASK when Slurm sets it. At least 1.
 */
int rt_cpus_available(void);

/* MemAvailable from /proc/meminfo, in bytes; 0 when unknown. */
uint64_t rt_mem_available(void);

/* ---- files ----------------------------------------------------------------- */

/*
 * Reads a whole file into a malloc'd buffer (NUL-terminated one byte past
 * *len, so text can be parsed in place). The caller frees *buf. Returns 0 or
 * -errno with a message naming the path.
 */
int rt_file_read(const char *path, uint8_t **buf, size_t *len);

/*
 * Writes `len` bytes to `fd` in full, retrying short writes and EINTR.
 * Returns 0 or -errno (the message names `path` and the offset reached).
 */
int rt_write_full(int fd, const void *data, size_t len, const char *path);

/*
 * Writes a file atomically: a temporary file beside it (rt_file_create_temp:
 * a new name, created exclusively, never through a link), fsync, rename over
 * `path`, fsync of the directory. The rename replaces whatever entry `path`
 * is, a link included, without following it. On failure nothing is left at
 * `path` that was not there before, and the temporary file is removed.
 * Returns 0 or -errno.
 */
int rt_file_write_atomic(const char *path, const void *data, size_t len);

/* fsyncs the directory holding `path` (or `path` itself if a directory). */
int rt_fsync_dir(const char *dir);

/*
 * Writes "dir/name" into out[len]. Returns 0, or -ENAMETOOLONG (with a
 * message naming both parts) when it does not fit.
 */
int rt_path_join(char *out, size_t len, const char *dir, const char *name);

/* `mkdir -p`. Returns 0 or -errno with a message naming the path. */
int rt_mkdirs(const char *path, unsigned mode);

/* Removes a directory tree (like `rm -rf`); missing is not an error. */
int rt_remove_tree(const char *path);

/* ---- files on a node other users share ---------------------------------------------
 *
 * Another user who can write a directory we use can replace a file after we
 * checked it, or plant a link where we are about to create a file, so that we
 * write through it into a file of theirs choosing. So: a directory we write
 * into or trust is opened first (O_DIRECTORY, O_NOFOLLOW) and then checked
 * with fstat() on that fd -- never stat() then open() by name, which another
 * process can swap in between -- and everything under it is reached relative
 * to that fd (openat, mkdirat, renameat, unlinkat) with O_NOFOLLOW; files we
 * create are created with O_CREAT|O_EXCL, which neither opens an existing file
 * nor follows a link.
 *
 * A directory is "owned" when it is a real directory (the last component is
 * not a link), its owner is this process's effective uid, and neither group
 * nor others may write it. The group bits also carry the mask of an ACL, so
 * a write ACL granted to anyone else is refused too. Links earlier in a path
 * the user gave (/scratch -> /lustre/...) are the user's own and followed.
 */

enum rt_dir_flags {
    RT_DIR_CREATE = 1u << 0, /* missing: created with `mode` (its missing parents, with AT_FDCWD, 0755) */
    RT_DIR_FOLLOW = 1u << 1, /* a link as the last component is followed: for a path the user gave
                                (the parent of our own directories), never for a name of ours */
    RT_DIR_SHARED = 1u << 2, /* a directory we only create our own directories in (/tmp): owned by us
                                or by root, and if group or others may write it, sticky, so that none of
                                them can rename or remove what we create there */
};

/* How rt_dir_open_owned() checks a directory, and what its refusals say. */
struct rt_dir_rules {
    unsigned flags;         /* enum rt_dir_flags */
    unsigned mode;          /* for RT_DIR_CREATE: 0700, 0755 */
    const char *doing;      /* what is refused, for messages: "stage into" */
    const char *advice;     /* ends a refusal: "remove it or use --to DIR" */
};

/*
 * Opens directory `name` relative to `at` (a directory fd, or AT_FDCWD and a
 * path) with O_DIRECTORY and, unless RT_DIR_FOLLOW, O_NOFOLLOW; creates it
 * first when missing and RT_DIR_CREATE is set; then checks the opened
 * directory with fstat(): owned (above), or with RT_DIR_SHARED owned by us or
 * root and sticky if others may write it. `shown` is its full path for
 * messages (NULL: `name`). On success *fd is the directory's fd (O_CLOEXEC;
 * the caller closes it). Returns 0 or -errno with rt_errmsg() set:
 *  -ENOENT  missing (without RT_DIR_CREATE)
 *  -ELOOP   "PATH: is a symbolic link: refusing to <doing> a directory reached through a link; <advice>"
 *  -ENOTDIR "PATH: exists and is not a directory: refusing to <doing> it; <advice>"
 *  -EPERM   "PATH: owned by NAME (uid N), not by NAME (uid M): refusing to <doing> a directory another
 *           user controls; <advice>"
 *           "PATH: writable by group and others (mode 0777): refusing to <doing> a directory other users
 *           can write; <advice>"
 *           and with RT_DIR_SHARED: "PATH: owned by NAME (uid N), neither by NAME (uid M) nor by root:
 *           that user could rename or replace what is created in it; refusing to <doing> it; <advice>",
 *           "PATH: writable by others and not sticky (mode 0777): they could rename or replace what is
 *           created in it; refusing to <doing> it; <advice>"
 * (a user the user database does not know is "uid N").
 * Thread-safe.
 */
int rt_dir_open_owned(int at, const char *name, const char *shown, const struct rt_dir_rules *r, int *fd);

/*
 * Creates file `name` in directory `at` afresh and opens it for writing
 * (O_WRONLY, O_CLOEXEC; `mode` less the umask). Whatever entry has that name
 * -- a file a crashed run left, a planted link -- is first removed with
 * unlinkat(), which never follows a link, and the file is then created with
 * O_CREAT|O_EXCL, so it is a new inode nothing else refers to. Meant for
 * fixed names in a directory we own (rt_dir_open_owned); where someone else
 * could recreate the name in between it fails (-EEXIST), never writing
 * through what they put there. `shown` names the file in messages. Returns 0
 * with the fd in *fd, or -errno.
 */
int rt_file_create_fresh(int at, const char *name, const char *shown, unsigned mode, int *fd);

/*
 * Creates a temporary file beside `path`: "<path>.tmp-XXXXXXXX", the suffix
 * random, created exclusively (O_CREAT|O_EXCL: never an existing file, never
 * through a link) with mode 0644 less the umask and opened for writing, so a
 * file or link someone planted under a predictable name is never written
 * through. Its name goes to tmp[len] (for the caller's rename, or unlink on
 * failure), its fd to *fd. Returns 0 or -errno naming the path.
 */
int rt_file_create_temp(const char *path, char *tmp, size_t len, int *fd);

/*
 * Opens `path` for writing, created when missing (mode 0644 less the umask),
 * else appended to (`append`: O_APPEND) or emptied. The last component is
 * never followed (O_NOFOLLOW), and before anything is emptied the file is
 * refused when it is a link (-ELOOP), not a regular file (-EINVAL), owned by
 * another user or linked under other names too (-EPERM): writing would then
 * change a file that is not this path's own. `doing` says what for in those
 * refusals ("write metrics"). Returns 0 with the fd (O_CLOEXEC) in *fd, or
 * -errno with a message naming the path.
 */
int rt_file_open_write(const char *path, int append, const char *doing, int *fd);

/*
 * rt_file_read() of file `name` relative to directory `at`, never through a
 * link (O_NOFOLLOW: -ELOOP); `shown` names it in messages (NULL: `name`).
 */
int rt_file_read_at(int at, const char *name, const char *shown, uint8_t **buf, size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* RT_COMMON_H */
