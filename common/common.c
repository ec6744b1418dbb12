/*
 * common.c - error messages, logging, clock, Philox RNG, checked allocation
 * and whole-file helpers shared by every module. Nothing here allocates
 * behind the caller's back except rt_file_read().
 */
#include "common.h"
#include "philox.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- errors ------------------------------------------------------------ */

static _Thread_local char err_buf[1024];

int rt_verrf(int code, const char *fmt, va_list ap)
{
    char tmp[sizeof(err_buf)];
    /* Format into a scratch buffer first: callers often pass rt_errmsg()
     * itself as an argument when adding context. */
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    memcpy(err_buf, tmp, sizeof(err_buf));
    return code;
}

int rt_errf(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rt_verrf(code, fmt, ap);
    va_end(ap);
    return code;
}

const char *rt_errmsg(void) { return err_buf; }

void rt_errclear(void) { err_buf[0] = '\0'; }

/* ---- logging ----------------------------------------------------------- */

static struct {
    int rank, world;
    enum rt_log_level min;
} log_cfg = {0, 1, RT_LOG_INFO};

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

void rt_log_setup(int rank, int world, enum rt_log_level min_level)
{
    log_cfg.rank = rank;
    log_cfg.world = world;
    log_cfg.min = min_level;
}

void rt_log(enum rt_log_level level, const char *fmt, ...)
{
    static const char *const tag[] = {"debug: ", "", "warning: ", "error: "};
    char line[2048];
    va_list ap;

    if (level < log_cfg.min)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_lock);
    fprintf(stderr, "[%d/%d] %s%s\n", log_cfg.rank, log_cfg.world, tag[level], line);
    pthread_mutex_unlock(&log_lock);
}

/* ---- clock ------------------------------------------------------------- */

uint64_t rt_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- Philox4x32-10 ------------------------------------------------------- */

void rt_philox4x32(const uint32_t key_in[2], const uint32_t ctr_in[4], uint32_t out[4])
{
    rt_philox4x32_10(key_in[0], key_in[1], ctr_in[0], ctr_in[1], ctr_in[2], ctr_in[3], out);
}

void rt_rng_init(struct rt_rng *r, uint64_t seed, uint64_t stream)
{
    r->key[0] = (uint32_t)seed;
    r->key[1] = (uint32_t)(seed >> 32);
    r->ctr[0] = 0;
    r->ctr[1] = 0;
    r->ctr[2] = (uint32_t)stream;
    r->ctr[3] = (uint32_t)(stream >> 32);
    r->used = 4;
}

uint32_t rt_rng_u32(struct rt_rng *r)
{
    if (r->used == 4) {
        rt_philox4x32(r->key, r->ctr, r->buf);
        if (++r->ctr[0] == 0)
            r->ctr[1]++;
        r->used = 0;
    }
    return r->buf[r->used++];
}

uint64_t rt_rng_u64(struct rt_rng *r)
{
    uint64_t hi = rt_rng_u32(r);
    return (hi << 32) | rt_rng_u32(r);
}

uint32_t rt_rng_below(struct rt_rng *r, uint32_t n)
{
    /* Lemire's multiply-shift with rejection of the biased low range. */
    uint64_t m = (uint64_t)rt_rng_u32(r) * n;
    uint32_t lo = (uint32_t)m;
    if (lo < n) {
        uint32_t threshold = (uint32_t)(-n) % n;
        while (lo < threshold) {
            m = (uint64_t)rt_rng_u32(r) * n;
            lo = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

float rt_rng_uniform(struct rt_rng *r) { return (float)(rt_rng_u32(r) >> 8) * (1.0f / 16777216.0f); }

float rt_rng_normal(struct rt_rng *r)
{
    float u1 = ((float)(rt_rng_u32(r) >> 8) + 0.5f) * (1.0f / 16777216.0f);
    float u2 = rt_rng_uniform(r);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

/* ---- memory -------------------------------------------------------------- */

void *rt_malloc(size_t n, const char *what)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        rt_errf(-ENOMEM, "out of memory allocating %zu bytes for %s", n, what);
    return p;
}

void *rt_calloc(size_t count, size_t size, const char *what)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        rt_errf(-ENOMEM, "out of memory allocating %zu x %zu bytes for %s", count, size, what);
    return p;
}

void *rt_realloc(void *p, size_t n, const char *what)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        rt_errf(-ENOMEM, "out of memory growing %s to %zu bytes", what, n);
    return q;
}

/* ---- text ---------------------------------------------------------------- */

int rt_parse_size(const char *s, uint64_t *out)
{
    char *end;
    double v;
    double mult = 1;

    errno = 0;
    v = strtod(s, &end);
    if (end == s || errno || v < 0)
        return rt_errf(-EINVAL, "'%s' is not a size (examples: 4096, 64M, 1.5G)", s);
    switch (*end) {
    case 'k': case 'K': mult = 1024.0; end++; break;
    case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (mult > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0))
        end += strlen(end);
    if (*end != '\0')
        return rt_errf(-EINVAL, "'%s' is not a size (examples: 4096, 64M, 1.5G)", s);
    v *= mult;
    if (v >= 18446744073709551615.0)
        return rt_errf(-EINVAL, "size '%s' is too large", s);
    *out = (uint64_t)v;
    return 0;
}

void rt_format_bytes(double bytes, char *buf, size_t len)
{
    static const char *const unit[] = {"B", "kB", "MB", "GB", "TB"};
    unsigned u = 0;
    while (bytes >= 1000.0 && u + 1 < RT_ARRAY_LEN(unit)) {
        bytes /= 1000.0;
        u++;
    }
    snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
}

/* ---- CPUs ----------------------------------------------------------------- */

int rt_cpus_available(void)
{
    cpu_set_t set;
    int n = 0;
    const char *slurm = getenv("SLURM_CPUS_PER_TASK");

    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        n = CPU_COUNT(&set);
    if (n <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online > 0 ? (int)online : 1;
    }
    if (slurm) {
        long s = strtol(slurm, NULL, 10);
        if (s > 0 && s < n)
            n = (int)s;
    }
    return n;
}

uint64_t rt_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kib = 0;

    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return (uint64_t)kib * 1024;
}

/* ---- files ----------------------------------------------------------------- */

int rt_file_read(const char *path, uint8_t **buf, size_t *len)
{
    struct stat st;
    uint8_t *data;
    size_t got = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return rt_errf(-errno, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        int e = S_ISDIR(st.st_mode) ? EISDIR : errno;
        close(fd);
        return rt_errf(-e, "%s: not a readable regular file: %s", path, strerror(e));
    }
    data = rt_malloc((size_t)st.st_size + 1, path);
    if (!data) {
        close(fd);
        return -ENOMEM;
    }
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, data + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            free(data);
            close(fd);
            return rt_errf(-e, "%s: read failed at offset %zu: %s", path, got,
                           n < 0 ? strerror(e) : "file shrank while reading");
        }
        got += (size_t)n;
    }
    close(fd);
    data[got] = '\0';
    *buf = data;
    *len = got;
    return 0;
}

int rt_write_full(int fd, const void *data, size_t len, const char *path)
{
    const uint8_t *p = data;
    size_t done = 0;

    while (done < len) {
        ssize_t n = write(fd, p + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return rt_errf(-errno, "%s: write failed after %zu of %zu bytes: %s", path, done, len,
                           strerror(errno));
        done += (size_t)n;
    }
    return 0;
}

int rt_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return rt_errf(-errno, "%s: cannot open directory: %s", dir, strerror(errno));
    if (fsync(fd) < 0 && errno != EINVAL) {
        int e = errno;
        close(fd);
        return rt_errf(-e, "%s: fsync failed: %s", dir, strerror(e));
    }
    close(fd);
    return 0;
}

static void dir_of(const char *path, char *dir, size_t len)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, len, ".");
    else if (slash == path)
        snprintf(dir, len, "/");
    else
        snprintf(dir, len, "%.*s", (int)(slash - path), path);
}

int rt_file_write_atomic(const char *path, const void *data, size_t len)
{
    char tmp[4096], dir[4096];
    int fd, rc;

    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp))
        return rt_errf(-ENAMETOOLONG, "%s: path too long", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return rt_errf(-errno, "%s: cannot create: %s", tmp, strerror(errno));
    rc = rt_write_full(fd, data, len, tmp);
    if (rc == 0 && fsync(fd) < 0)
        rc = rt_errf(-errno, "%s: fsync failed: %s", tmp, strerror(errno));
    if (close(fd) < 0 && rc == 0)
        rc = rt_errf(-errno, "%s: close failed: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) < 0)
        rc = rt_errf(-errno, "%s: rename to %s failed: %s", tmp, path, strerror(errno));
    if (rc < 0) {
        unlink(tmp);
        return rc;
    }
    dir_of(path, dir, sizeof(dir));
    return rt_fsync_dir(dir);
}

int rt_path_join(char *out, size_t len, const char *dir, const char *name)
{
    int n = snprintf(out, len, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= len)
        return rt_errf(-ENAMETOOLONG, "%s/%s: path too long", dir, name);
    return 0;
}

int rt_mkdirs(const char *path, unsigned mode)
{
    char buf[4096];
    size_t n = strlen(path);

    if (n == 0 || n >= sizeof(buf))
        return rt_errf(-EINVAL, "'%s': bad directory path", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, mode) < 0 && errno != EEXIST)
            return rt_errf(-errno, "%s: cannot create directory: %s", buf, strerror(errno));
        buf[i] = c;
    }
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
        return rt_errf(-ENOTDIR, "%s: exists and is not a directory", path);
    return 0;
}

int rt_remove_tree(const char *path)
{
    struct stat st;
    DIR *d;
    struct dirent *e;
    int rc = 0;

    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0 : rt_errf(-errno, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) < 0)
            return rt_errf(-errno, "%s: cannot remove: %s", path, strerror(errno));
        return 0;
    }
    d = opendir(path);
    if (!d)
        return rt_errf(-errno, "%s: cannot open directory: %s", path, strerror(errno));
    while ((e = readdir(d)) != NULL) {
        char child[4096];
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(child, sizeof(child), "%s/%s", path, e->d_name);
        int r = rt_remove_tree(child);
        if (r < 0 && rc == 0)
            rc = r;
    }
    closedir(d);
    if (rmdir(path) < 0 && rc == 0)
        rc = rt_errf(-errno, "%s: cannot remove directory: %s", path, strerror(errno));
    return rc;
}

double rt_decimal_double(float f)
{
    if (!isfinite(f) || f == 0.0f)
        return (double)f;
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof(buf), "%.*g", prec, (double)f);
        if (strtof(buf, NULL) == f)
            return strtod(buf, NULL);
    }
    return (double)f;
}
