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

/*
 * The double a Python script holds for a hyperparameter that reached us as a
 * float: the shortest decimal that reads back as `f` (what the user typed,
 * for any value written with up to 9 significant digits), read as a double.
 * PyTorch computes 1 - beta1, lr * wd, momentum * mean ... from that double,
 * and (double)f differs from it in the ninth digit, enough to move a float
 * result by an ulp; the backends compute their scalars from this instead.
 */
double rt_decimal_double(float f);

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
 * Writes a file atomically: `path`.tmp, fsync, rename over `path`, fsync of
 * the directory. On failure nothing is left at `path` that was not there
 * before, and the temporary file is removed. Returns 0 or -errno.
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

#ifdef __cplusplus
}
#endif

#endif /* RT_COMMON_H */
