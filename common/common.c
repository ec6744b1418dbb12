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
#include <pwd.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
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

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t rt_process_start_ns(void)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    /* Field 22 (starttime); the command name (field 2) may hold spaces and parentheses: count from its end. */
    const char *p = strrchr(buf, ')');
    unsigned long long start = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                     &start) != 1)
        return 0;
    const long hz = sysconf(_SC_CLK_TCK);
    const uint64_t since_boot = start * (1000000000ull / (uint64_t)(hz > 0 ? hz : 100));
    const uint64_t boot_now = clock_ns(CLOCK_BOOTTIME), mono_now = rt_now_ns();
    const uint64_t age = boot_now > since_boot ? boot_now - since_boot : 0;
    return mono_now > age ? mono_now - age : 0;
}

double rt_unix_time_of(uint64_t t)
{
    const uint64_t real = clock_ns(CLOCK_REALTIME), mono = rt_now_ns();
    return ((double)real - ((double)mono - (double)t)) * 1e-9;
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

void rt_appendf(char *buf, size_t len, const char *fmt, ...)
{
    const size_t used = strnlen(buf, len);
    if (used + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
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

/* rt_file_read() and rt_file_read_at(): `name` under `at`, opened with open(2) flags `oflags` added. */
static int read_whole(int at, const char *name, const char *path, int oflags, uint8_t **buf, size_t *len)
{
    struct stat st;
    uint8_t *data;
    size_t got = 0;
    int fd = openat(at, name, O_RDONLY | O_CLOEXEC | oflags);

    if (fd < 0 && errno == ELOOP && (oflags & O_NOFOLLOW))
        return rt_errf(-ELOOP, "%s: is a symbolic link: refusing to read through it", path);
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

int rt_file_read(const char *path, uint8_t **buf, size_t *len)
{
    return read_whole(AT_FDCWD, path, path, 0, buf, len);
}

int rt_file_read_at(int at, const char *name, const char *shown, uint8_t **buf, size_t *len)
{
    return read_whole(at, name, shown ? shown : name, O_NOFOLLOW | O_NONBLOCK, buf, len);
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

    if ((rc = rt_file_create_temp(path, tmp, sizeof(tmp), &fd)) < 0)
        return rc;
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

/* ---- files on a node other users share ------------------------------------- */

/* "name (uid N)", or "uid N" where the user database does not know the uid. */
static void user_desc(uid_t uid, char *out, size_t len)
{
    struct passwd pw, *found = NULL;
    char buf[4096];

    if (getpwuid_r(uid, &pw, buf, sizeof(buf), &found) == 0 && found && found->pw_name && found->pw_name[0])
        snprintf(out, len, "%s (uid %u)", found->pw_name, (unsigned)uid);
    else
        snprintf(out, len, "uid %u", (unsigned)uid);
}

/* Who may write besides the owner, for messages; mode has S_IWGRP or S_IWOTH. */
static const char *other_writers(mode_t mode)
{
    if ((mode & S_IWGRP) && (mode & S_IWOTH))
        return "group and others";
    return (mode & S_IWGRP) ? "group" : "others";
}

/* 0 if the directory `st` describes may be trusted as `r` says; else the refusal. */
static int dir_check(const struct stat *st, const char *shown, const struct rt_dir_rules *r)
{
    const uid_t me = geteuid();
    const int shared = (r->flags & RT_DIR_SHARED) != 0;
    const unsigned mode = (unsigned)st->st_mode & 07777;
    char owner[300], self[300];

    if (st->st_uid != me && !(shared && st->st_uid == 0)) {
        user_desc(st->st_uid, owner, sizeof(owner));
        user_desc(me, self, sizeof(self));
        if (shared)
            return rt_errf(-EPERM, "%s: owned by %s, neither by %s nor by root: that user could rename or replace "
                           "what is created in it; refusing to %s it; %s", shown, owner, self, r->doing, r->advice);
        return rt_errf(-EPERM, "%s: owned by %s, not by %s: refusing to %s a directory another user controls; %s",
                       shown, owner, self, r->doing, r->advice);
    }
    if (!(mode & (S_IWGRP | S_IWOTH)))
        return 0;
    /* In a sticky directory only an entry's owner (and the directory's) may rename or remove it. */
    if (shared && (mode & S_ISVTX))
        return 0;
    if (shared)
        return rt_errf(-EPERM, "%s: writable by %s and not sticky (mode %04o): they could rename or replace what is "
                       "created in it; refusing to %s it; %s", shown, other_writers(mode), mode, r->doing, r->advice);
    return rt_errf(-EPERM, "%s: writable by %s (mode %04o): refusing to %s a directory other users can write; %s",
                   shown, other_writers(mode), mode, r->doing, r->advice);
}

/* mkdirat(at, name, mode), an existing entry left to the caller's checks; with AT_FDCWD, mkdir -p of the rest. */
static int make_dir(int at, const char *name, const char *shown, unsigned mode)
{
    if (mkdirat(at, name, (mode_t)mode) == 0 || errno == EEXIST)
        return 0;
    const char *slash = strrchr(name, '/');
    if (errno == ENOENT && at == AT_FDCWD && slash && slash != name) {
        char lead[4096];
        snprintf(lead, sizeof(lead), "%.*s", (int)(slash - name), name);
        int rc = rt_mkdirs(lead, 0755);
        if (rc < 0)
            return rc;
        if (mkdirat(at, name, (mode_t)mode) == 0 || errno == EEXIST)
            return 0;
    }
    return rt_errf(-errno, "%s: cannot create the directory: %s", shown, strerror(errno));
}

int rt_dir_open_owned(int at, const char *name, const char *shown, const struct rt_dir_rules *r, int *fd)
{
    const int follow = (r->flags & RT_DIR_FOLLOW) != 0;
    char trimmed[4096];
    struct stat st;
    int dfd, rc;

    *fd = -1;
    if (!shown)
        shown = name;
    /* "link/" resolves the link whatever O_NOFOLLOW says: the last component must be the name itself. */
    size_t n = strlen(name);
    if (!follow && n > 1 && name[n - 1] == '/') {
        if (n >= sizeof(trimmed))
            return rt_errf(-ENAMETOOLONG, "%s: path too long", shown);
        memcpy(trimmed, name, n + 1);
        while (n > 1 && trimmed[n - 1] == '/')
            trimmed[--n] = '\0';
        name = trimmed;
    }
    if ((r->flags & RT_DIR_CREATE) && (rc = make_dir(at, name, shown, r->mode)) < 0)
        return rc;
    dfd = openat(at, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
    if (dfd < 0) {
        const int e = errno;
        /* O_DIRECTORY|O_NOFOLLOW on a link fails with ENOTDIR or ELOOP: look again only to word the message. */
        if ((e == ENOTDIR || e == ELOOP) && !follow && fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISLNK(st.st_mode))
            return rt_errf(-ELOOP, "%s: is a symbolic link: refusing to %s a directory reached through a link; %s",
                           shown, r->doing, r->advice);
        if (e == ENOTDIR)
            return rt_errf(-ENOTDIR, "%s: exists and is not a directory: refusing to %s it; %s", shown, r->doing,
                           r->advice);
        return rt_errf(-e, "%s: cannot open the directory: %s", shown, strerror(e));
    }
    if (fstat(dfd, &st) < 0) {
        rc = rt_errf(-errno, "%s: %s", shown, strerror(errno));
        close(dfd);
        return rc;
    }
    if ((rc = dir_check(&st, shown, r)) < 0) {
        close(dfd);
        return rc;
    }
    *fd = dfd;
    return 0;
}

int rt_file_create_fresh(int at, const char *name, const char *shown, unsigned mode, int *fd)
{
    int f;

    if (!shown)
        shown = name;
    if (unlinkat(at, name, 0) < 0 && errno != ENOENT)
        return rt_errf(-errno, "%s: cannot remove the old one: %s", shown, strerror(errno));
    f = openat(at, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (mode_t)mode);
    if (f < 0 && errno == EEXIST)
        return rt_errf(-EEXIST, "%s: created again by someone else between its removal and its creation: refusing "
                       "to write through it", shown);
    if (f < 0)
        return rt_errf(-errno, "%s: cannot create: %s", shown, strerror(errno));
    *fd = f;
    return 0;
}

/* 64 bits nobody else can guess, for temporary names: getrandom(), else the clock and pid, mixed (splitmix64). */
static uint64_t random_u64(void)
{
    static _Atomic uint64_t counter;
    uint64_t x;

    if (getrandom(&x, sizeof(x), GRND_NONBLOCK) == (ssize_t)sizeof(x))
        return x;
    x = rt_now_ns() ^ ((uint64_t)getpid() << 32) ^ (counter++ * 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int rt_file_create_temp(const char *path, char *tmp, size_t len, int *fd)
{
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";

    /* A name taken (by a crashed run, or by someone guessing) just means another draw. */
    for (int attempt = 0; attempt < 100; attempt++) {
        char suffix[11];
        uint64_t x = random_u64();
        for (size_t i = 0; i + 1 < sizeof(suffix); i++, x /= 36)
            suffix[i] = digits[x % 36];
        suffix[sizeof(suffix) - 1] = '\0';
        if ((size_t)snprintf(tmp, len, "%s.tmp-%s", path, suffix) >= len)
            return rt_errf(-ENAMETOOLONG, "%s: path too long", path);
        int f = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (f >= 0) {
            *fd = f;
            return 0;
        }
        if (errno != EEXIST)
            return rt_errf(-errno, "%s: cannot create a temporary file beside it (%s): %s", path, tmp,
                           strerror(errno));
    }
    return rt_errf(-EEXIST, "%s: cannot create a temporary file beside it: 100 names in a row were taken", path);
}

int rt_file_open_write(const char *path, int append, const char *doing, int *fd)
{
    /* O_NONBLOCK: a FIFO planted under the name must not block the open (it is refused below). */
    int f = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (append ? O_APPEND : 0), 0644);
    struct stat st;
    char owner[300], self[300];
    int rc;

    if (f < 0 && errno == ELOOP)
        return rt_errf(-ELOOP, "%s: is a symbolic link: refusing to %s through it (it could point anywhere); remove "
                       "it or name another file", path, doing);
    if (f < 0 && errno == ENXIO)
        return rt_errf(-EINVAL, "%s: not a regular file: refusing to %s into it", path, doing);
    if (f < 0)
        return rt_errf(-errno, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(f, &st) < 0) {
        rc = rt_errf(-errno, "%s: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        rc = rt_errf(-EINVAL, "%s: not a regular file: refusing to %s into it", path, doing);
    } else if (st.st_uid != geteuid()) {
        user_desc(st.st_uid, owner, sizeof(owner));
        user_desc(geteuid(), self, sizeof(self));
        rc = rt_errf(-EPERM, "%s: owned by %s, not by %s: refusing to %s into a file another user controls; remove "
                     "it or name another file", path, owner, self, doing);
    } else if (st.st_nlink > 1) {
        rc = rt_errf(-EPERM, "%s: has %lu names (hard links): writing would change the file behind the others too; "
                     "refusing to %s into it; remove it or name another file", path, (unsigned long)st.st_nlink,
                     doing);
    } else if (!append && ftruncate(f, 0) < 0) {
        rc = rt_errf(-errno, "%s: cannot empty it: %s", path, strerror(errno));
    } else {
        fcntl(f, F_SETFL, fcntl(f, F_GETFL) & ~O_NONBLOCK);
        *fd = f;
        return 0;
    }
    close(f);
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

void rt_norm_lut(uint32_t channels, const float *mean, const float *std, float *lut)
{
    for (uint32_t ch = 0; ch < channels; ch++)
        for (int v = 0; v < 256; v++)
            lut[ch * 256 + (uint32_t)v] = ((float)v / 255.0f - mean[ch]) / std[ch];
}
