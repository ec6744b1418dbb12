/*
 * test_nvml.c - common/nvml.c against tests/fake_nvml.c, a stand-in library
 * with known readings, loaded through the rt_nvml_*_from() entries:
 * test_nvml /path/to/libfake_nvml.so
 *
 * Each reading against the fake's values (and a GPU chosen by bus id over
 * index); the sampler's cadence, callback and window (mean, max, reset);
 * destroy within 100 ms of a 10 s period; a GPU without power readings; and
 * NVML absent, without a function, failing its init, or without the GPU:
 * an error naming why, nothing printed, no initialisation left behind.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "common/common.h"
#include "common/nvml.h"

#define GIB (1024ull * 1024ull * 1024ull)
#define FAKE_POWER_W 250.5
#define FAKE_SM_MHZ 1980u

static const char *fake_path;
static int (*fake_inits)(void);

static void sleep_ms(unsigned ms)
{
    struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

static double now_ms(void)
{
    return (double)rt_now_ns() * 1e-6;
}

/* ---- "absent means silent": stdout and stderr caught in a file around a call -------------------- */

struct quiet {
    int fd, out, err;
    char path[64];
};

static void quiet_begin(struct quiet *q)
{
    fflush(stdout);
    fflush(stderr);
    snprintf(q->path, sizeof(q->path), "/tmp/rt-test-nvml-XXXXXX");
    q->fd = mkstemp(q->path);
    if (q->fd < 0) {
        perror("mkstemp");
        exit(1);
    }
    q->out = dup(1);
    q->err = dup(2);
    dup2(q->fd, 1);
    dup2(q->fd, 2);
}

/* Restores stdout and stderr; returns how many bytes were written meanwhile (and shows them). */
static long quiet_end(struct quiet *q)
{
    fflush(stdout);
    fflush(stderr);
    dup2(q->out, 1);
    dup2(q->err, 2);
    close(q->out);
    close(q->err);
    long n = (long)lseek(q->fd, 0, SEEK_END);
    if (n > 0) {
        char buf[512] = "";
        ssize_t got = pread(q->fd, buf, sizeof(buf) - 1, 0);
        buf[got > 0 ? got : 0] = 0;
        fprintf(stderr, "printed while it should have been silent: '%s'\n", buf);
    }
    close(q->fd);
    unlink(q->path);
    return n;
}

/* ---- a callback that records every reading ---------------------------------------------------- */

#define MAX_SEEN 4096

struct seen {
    pthread_mutex_t mu;
    atomic_uint count;
    unsigned n; /* under mu: readings in r */
    struct rt_nvml_reading r[MAX_SEEN];
    pthread_t thread;
    atomic_int wrong_thread;
};

static void on_sample(void *ctx, const struct rt_nvml_reading *r)
{
    struct seen *s = ctx;
    pthread_mutex_lock(&s->mu);
    if (s->n < MAX_SEEN)
        s->r[s->n++] = *r;
    /* Called from the sampler thread, never the creator's. */
    if (pthread_equal(pthread_self(), s->thread))
        atomic_store(&s->wrong_thread, 1);
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add(&s->count, 1);
}

static void seen_init(struct seen *s)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
    s->thread = pthread_self();
}

/* Waits up to 5 s for `n` callbacks; returns 1 when they came. */
static int seen_wait(struct seen *s, unsigned n)
{
    for (int i = 0; i < 5000; i++) {
        if (atomic_load(&s->count) >= n)
            return 1;
        sleep_ms(1);
    }
    return 0;
}

/* ---- the fake's values ------------------------------------------------------------------------ */

/* A reading of fake GPU `gpu` (0: 3 GiB used, 1: 5 GiB) with every counter. */
static void check_fake_reading(const struct rt_nvml_reading *r, int gpu, unsigned mask)
{
    CHECKF(r->valid_mask == mask, "valid_mask 0x%x, expected 0x%x", r->valid_mask, mask);
    CHECKF(r->util_gpu_pct < 100, "util %u", r->util_gpu_pct);
    CHECKF(r->util_mem_pct == r->util_gpu_pct / 2, "memory util %u for gpu util %u (fields swapped?)",
           r->util_mem_pct, r->util_gpu_pct);
    CHECKF(r->mem_used_bytes == (gpu ? 5 : 3) * GIB, "mem used %llu", (unsigned long long)r->mem_used_bytes);
    CHECKF(r->mem_total_bytes == 80 * GIB, "mem total %llu", (unsigned long long)r->mem_total_bytes);
    if (mask & RT_NVML_POWER)
        CHECKF(r->power_w == FAKE_POWER_W, "power %.6f W, expected %.1f", r->power_w, FAKE_POWER_W);
    else
        CHECKF(r->power_w == 0, "power %.3f W in a reading without power", r->power_w);
    CHECKF(r->sm_clock_mhz == FAKE_SM_MHZ, "SM clock %u MHz, expected %u (asked for another clock?)", r->sm_clock_mhz,
           FAKE_SM_MHZ);
    const double now = (double)rt_now_ns() * 1e-9;
    CHECKF(r->t_s > now - 60 && r->t_s <= now, "t_s %.3f, now %.3f", r->t_s, now);
}

/* The summary of readings seen[from, from + n) as the sampler should have made it. */
static void check_window(const struct rt_nvml_summary *w, const struct seen *s, unsigned from)
{
    unsigned n = w->samples;
    CHECKF(from + n <= s->n, "window of %u readings from %u, only %u seen by the callback", n, from, s->n);
    if (!n || from + n > s->n)
        return;
    double ug = 0, um = 0, ugmax = 0, pw = 0, pwmax = 0, clk = 0, mem = 0;
    uint64_t memmax = 0;
    unsigned npw = 0, mask = 0;
    for (unsigned i = from; i < from + n; i++) {
        const struct rt_nvml_reading *r = &s->r[i];
        mask |= r->valid_mask;
        ug += r->util_gpu_pct;
        um += r->util_mem_pct;
        ugmax = RT_MAX(ugmax, (double)r->util_gpu_pct);
        mem += (double)r->mem_used_bytes;
        memmax = RT_MAX(memmax, r->mem_used_bytes);
        clk += r->sm_clock_mhz;
        if (r->valid_mask & RT_NVML_POWER) {
            pw += r->power_w;
            pwmax = RT_MAX(pwmax, r->power_w);
            npw++;
        }
    }
    CHECKF(w->valid_mask == mask, "window valid_mask 0x%x, readings 0x%x", w->valid_mask, mask);
    CHECKF(fabs(w->util_gpu_pct_mean - ug / n) < 1e-9, "util mean %.4f, expected %.4f", w->util_gpu_pct_mean, ug / n);
    CHECKF(w->util_gpu_pct_max == ugmax, "util max %.1f, expected %.1f", w->util_gpu_pct_max, ugmax);
    CHECKF(fabs(w->util_mem_pct_mean - um / n) < 1e-9, "mem util mean %.4f, expected %.4f", w->util_mem_pct_mean,
           um / n);
    CHECKF(w->mem_used_bytes_max == memmax, "mem used max %llu", (unsigned long long)w->mem_used_bytes_max);
    CHECKF(fabs(w->mem_used_bytes_mean - mem / n) < 1, "mem used mean %.1f", w->mem_used_bytes_mean);
    CHECKF(w->mem_total_bytes == 80 * GIB, "mem total %llu", (unsigned long long)w->mem_total_bytes);
    CHECKF(fabs(w->sm_clock_mhz_mean - clk / n) < 1e-9, "SM clock mean %.3f", w->sm_clock_mhz_mean);
    CHECKF(w->sm_clock_mhz_max == FAKE_SM_MHZ, "SM clock max %.1f", w->sm_clock_mhz_max);
    if (npw) {
        CHECKF(fabs(w->power_w_mean - pw / npw) < 1e-9, "power mean %.4f, expected %.4f", w->power_w_mean, pw / npw);
        CHECKF(w->power_w_max == pwmax, "power max %.4f", w->power_w_max);
    } else {
        CHECKF(w->power_w_mean == 0 && w->power_w_max == 0, "power %.3f/%.3f with no power reading",
               w->power_w_mean, w->power_w_max);
    }
    CHECKF(w->t_first_s == s->r[from].t_s && w->t_last_s == s->r[from + n - 1].t_s,
           "window times %.6f..%.6f, readings %.6f..%.6f", w->t_first_s, w->t_last_s, s->r[from].t_s,
           s->r[from + n - 1].t_s);
}

/* ---- the tests ---------------------------------------------------------------------------------- */

static void test_available(void)
{
    char why[300];
    CHECK(rt_nvml_available_from(fake_path, why, sizeof(why)) == 1);
    CHECKF(strstr(why, "fake_nvml") && strstr(why, "driver 999.99.99-fake"), "why: '%s'", why);
    CHECKF(fake_inits() == 0, "%d NVML initialisations left behind", fake_inits());
    /* Cut to fit, NUL-terminated. */
    char small[8];
    memset(small, 'x', sizeof(small));
    CHECK(rt_nvml_available_from(fake_path, small, sizeof(small)) == 1);
    CHECK(strlen(small) == sizeof(small) - 1);
    /* The driver's version alone; nothing where NVML cannot be opened. */
    char ver[32] = "x";
    CHECK(rt_nvml_driver_version_from(fake_path, ver, sizeof(ver)) == 1);
    CHECKF(!strcmp(ver, "999.99.99-fake"), "driver version '%s'", ver);
    CHECK(rt_nvml_driver_version_from("/nonexistent/libnvidia-ml.so.1", ver, sizeof(ver)) == 0);
    CHECKF(ver[0] == 0, "driver version '%s' without NVML", ver);
    CHECKF(fake_inits() == 0, "%d NVML initialisations left behind", fake_inits());
}

/* NVML absent, or not NVML: 0 / an error naming why, and not a byte printed. */
static void test_unavailable(void)
{
    static const struct {
        const char *lib;
        int err;
        const char *needle;
    } cases[] = {
        {"/nonexistent/libnvidia-ml.so.1", -ENOENT, "/nonexistent/libnvidia-ml.so.1"},
        {"libnvidia-ml-absent-for-test.so.1", -ENOENT, "libnvidia-ml-absent-for-test.so.1"},
        {"libm.so.6", -ENOSYS, "lacks nvmlInit_v2"},
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(cases); i++) {
        char why[600] = "";
        struct rt_nvml_sampler *s = (struct rt_nvml_sampler *)&why; /* must come back NULL */
        const struct rt_nvml_sampler_opts o = {.period_ms = 20};
        rt_errclear();
        struct quiet q;
        quiet_begin(&q);
        int avail = rt_nvml_available_from(cases[i].lib, why, sizeof(why));
        int rc = rt_nvml_sampler_create_from(cases[i].lib, &o, &s);
        long printed = quiet_end(&q);
        CHECKF(printed == 0, "%s: %ld bytes printed", cases[i].lib, printed);
        CHECKF(avail == 0, "%s: available", cases[i].lib);
        CHECKF(strstr(why, cases[i].needle), "%s: why '%s' lacks '%s'", cases[i].lib, why, cases[i].needle);
        CHECKF(rc == cases[i].err, "%s: create returned %d, expected %d", cases[i].lib, rc, cases[i].err);
        CHECKF(strstr(rt_errmsg(), cases[i].needle), "%s: message '%s' lacks '%s'", cases[i].lib, rt_errmsg(),
               cases[i].needle);
        CHECK(s == NULL);
    }
    /* The real one is absent here too (no driver on a CI machine): whatever the answer, silence. */
    char why[600];
    struct quiet q;
    quiet_begin(&q);
    int avail = rt_nvml_available(why, sizeof(why));
    long printed = quiet_end(&q);
    CHECKF(printed == 0, "rt_nvml_available printed %ld bytes", printed);
    fprintf(stderr, "this machine's NVML: %s: %s\n", avail ? "available" : "unavailable", why);
}

/* NVML opens but fails: no driver, no such GPU. The error says so; nothing stays initialised. */
static void test_init_and_device_errors(void)
{
    struct rt_nvml_sampler *s = NULL;
    struct quiet q;

    setenv("FAKE_NVML_INIT_ERROR", "9", 1);
    char why[600];
    quiet_begin(&q);
    int avail = rt_nvml_available_from(fake_path, why, sizeof(why));
    int rc = rt_nvml_sampler_create_from(fake_path, &(struct rt_nvml_sampler_opts){.period_ms = 20}, &s);
    long printed = quiet_end(&q);
    unsetenv("FAKE_NVML_INIT_ERROR");
    CHECK(printed == 0);
    CHECK(avail == 0);
    CHECKF(strstr(why, "nvmlInit_v2 failed: Driver Not Loaded"), "why: '%s'", why);
    CHECKF(rc == -ENODEV && strstr(rt_errmsg(), "Driver Not Loaded"), "rc %d: %s", rc, rt_errmsg());
    CHECK(s == NULL);

    quiet_begin(&q);
    rc = rt_nvml_sampler_create_from(fake_path, &(struct rt_nvml_sampler_opts){.pci_bus_id = "0000:99:00.0"}, &s);
    printed = quiet_end(&q);
    CHECK(printed == 0);
    CHECKF(rc == -ENODEV && strstr(rt_errmsg(), "0000:99:00.0") && strstr(rt_errmsg(), "Not Found"), "rc %d: %s", rc,
           rt_errmsg());
    CHECK(s == NULL);
    CHECK_ERR(rt_nvml_sampler_create_from(fake_path, &(struct rt_nvml_sampler_opts){.nvml_index = 7}, &s),
              "index 7");
    CHECK(s == NULL);
    CHECK_ERR(rt_nvml_sampler_create_from(fake_path, &(struct rt_nvml_sampler_opts){.period_ms = 3600001}, &s),
              "over an hour");
    CHECK(rt_nvml_sampler_create_from(fake_path, NULL, &s) == -EINVAL);
    CHECKF(fake_inits() == 0, "%d NVML initialisations left behind", fake_inits());
}

/* Readings on the caller's thread; the GPU by bus id over index; the window's reset; a prompt destroy. */
static void test_readings_and_prompt_destroy(void)
{
    static struct seen seen;
    seen_init(&seen);
    struct rt_nvml_sampler *s = NULL;
    struct rt_nvml_sampler_opts o = {.period_ms = 10000, .on_sample = on_sample, .ctx = &seen};
    CHECK_OK(rt_nvml_sampler_create_from(fake_path, &o, &s));
    if (!s)
        return;
    CHECKF(fake_inits() == 1, "%d initialisations", fake_inits());
    CHECKF(!strcmp(rt_nvml_sampler_device(s), "index 0"), "device '%s'", rt_nvml_sampler_device(s));
    CHECKF(!strcmp(rt_nvml_sampler_missing(s), ""), "missing '%s'", rt_nvml_sampler_missing(s));
    /* The sampler reads once at start; the next reading is 10 s away, so from here on only we call NVML. */
    CHECK(seen_wait(&seen, 1));
    struct rt_nvml_reading r1, r2;
    CHECK_OK(rt_nvml_sampler_read(s, &r1));
    CHECK_OK(rt_nvml_sampler_read(s, &r2));
    check_fake_reading(&r1, 0, RT_NVML_ALL);
    check_fake_reading(&r2, 0, RT_NVML_ALL);
    CHECKF(r2.util_gpu_pct == (r1.util_gpu_pct + 1) % 100, "util %u then %u: not one call apart", r1.util_gpu_pct,
           r2.util_gpu_pct);
    CHECK(r2.t_s >= r1.t_s);

    /* The window holds the start reading only, and is empty once read. */
    struct rt_nvml_summary w;
    rt_nvml_sampler_window(s, &w);
    CHECKF(w.samples == 1, "%u samples", w.samples);
    pthread_mutex_lock(&seen.mu);
    check_window(&w, &seen, 0);
    check_fake_reading(&seen.r[0], 0, RT_NVML_ALL);
    pthread_mutex_unlock(&seen.mu);
    CHECK(w.util_gpu_pct_mean == w.util_gpu_pct_max);
    CHECK(w.power_w_mean == FAKE_POWER_W && w.power_w_max == FAKE_POWER_W);
    CHECK(w.mem_used_bytes_max == 3 * GIB && w.mem_used_bytes_mean == (double)(3 * GIB));
    rt_nvml_sampler_window(s, &w);
    CHECKF(w.samples == 0 && w.valid_mask == 0 && w.util_gpu_pct_max == 0 && w.mem_used_bytes_max == 0,
           "window not reset: %u samples, mask 0x%x", w.samples, w.valid_mask);
    char text[64], json[64];
    CHECK_OK(rt_nvml_summary_format(&w, text, sizeof(text)));
    CHECKF(!strcmp(text, "gpu n/a"), "'%s'", text);
    CHECK_OK(rt_nvml_summary_json(&w, json, sizeof(json)));
    CHECKF(!strcmp(json, ""), "'%s'", json);

    /* Destroy wakes the thread from its 10 s wait at once (2 s: room for a loaded machine, far from 10 s). */
    const double t0 = now_ms();
    rt_nvml_sampler_destroy(s);
    const double dt = now_ms() - t0;
    CHECKF(dt < 2000, "destroy took %.1f ms with a 10 s period", dt);
    CHECK(atomic_load(&seen.count) == 1);
    CHECK(!atomic_load(&seen.wrong_thread));
    CHECKF(fake_inits() == 0, "%d initialisations after destroy", fake_inits());

    /* By bus id (the CUDA runtime's form, and NVML's own), which wins over the index. */
    static const struct {
        const char *bus;
        int gpu;
    } ids[] = {{"0000:86:00.0", 1}, {"00000000:3B:00.0", 0}, {"0000:3b:00.0", 0}};
    for (size_t i = 0; i < RT_ARRAY_LEN(ids); i++) {
        struct rt_nvml_sampler_opts ob = {.pci_bus_id = ids[i].bus, .nvml_index = 1 - ids[i].gpu, .period_ms = 10000};
        CHECK_OK(rt_nvml_sampler_create_from(fake_path, &ob, &s));
        if (!s)
            continue;
        struct rt_nvml_reading r;
        CHECK_OK(rt_nvml_sampler_read(s, &r));
        check_fake_reading(&r, ids[i].gpu, RT_NVML_ALL);
        char want[64];
        snprintf(want, sizeof(want), "pci %s", ids[i].bus);
        CHECKF(!strcmp(rt_nvml_sampler_device(s), want), "device '%s'", rt_nvml_sampler_device(s));
        rt_nvml_sampler_destroy(s);
    }
    CHECKF(fake_inits() == 0, "%d initialisations after destroy", fake_inits());
}

/* A 20 ms period: the cadence, every reading through the callback, windows that match them. */
static void test_sampling(void)
{
    static struct seen seen;
    seen_init(&seen);
    struct rt_nvml_sampler *s = NULL;
    struct rt_nvml_sampler_opts o = {.period_ms = 20, .on_sample = on_sample, .ctx = &seen};
    const double t0 = now_ms();
    CHECK_OK(rt_nvml_sampler_create_from(fake_path, &o, &s));
    if (!s)
        return;
    sleep_ms(300);
    struct rt_nvml_summary w1, w2;
    rt_nvml_sampler_window(s, &w1);
    const double t1 = now_ms();
    sleep_ms(200);
    /* Callbacks come before a reading joins the window: before the last window they are at most one ahead of
     * the windows' total; readings taken between it and destroy have callbacks and no window, however many. */
    pthread_mutex_lock(&seen.mu);
    const unsigned n_before = seen.n;
    pthread_mutex_unlock(&seen.mu);
    rt_nvml_sampler_window(s, &w2);
    const double t2 = now_ms();
    rt_nvml_sampler_destroy(s);

    /* Readings at about 0, 20, 40 ... ms: fewer means a late thread, more a wait that does not wait. */
    CHECKF(w1.samples >= 5 && w1.samples <= (t1 - t0) / 20 + 2, "%u samples in %.0f ms at 20 ms", w1.samples,
           t1 - t0);
    CHECKF(w2.samples >= 3 && w2.samples <= (t2 - t1) / 20 + 2, "%u samples in %.0f ms at 20 ms", w2.samples,
           t2 - t1);
    pthread_mutex_lock(&seen.mu);
    const unsigned n = seen.n;
    CHECKF(n >= w1.samples + w2.samples && n_before <= w1.samples + w2.samples + 1,
           "%u callbacks (%u before the last window) for windows of %u and %u readings", n, n_before, w1.samples,
           w2.samples);
    check_window(&w1, &seen, 0);
    check_window(&w2, &seen, w1.samples);
    /* Each callback a fresh reading, in order, at least ~a period apart on average. */
    for (unsigned i = 0; i < n; i++)
        check_fake_reading(&seen.r[i], 0, RT_NVML_ALL);
    for (unsigned i = 1; i < n; i++) {
        CHECKF(seen.r[i].util_gpu_pct == (seen.r[i - 1].util_gpu_pct + 1) % 100, "reading %u: util %u after %u", i,
               seen.r[i].util_gpu_pct, seen.r[i - 1].util_gpu_pct);
        CHECK(seen.r[i].t_s > seen.r[i - 1].t_s);
    }
    if (n > 2) {
        const double gap_ms = (seen.r[n - 1].t_s - seen.r[0].t_s) * 1e3 / (n - 1);
        CHECKF(gap_ms >= 15, "readings %.1f ms apart on average at a 20 ms period", gap_ms);
    }
    pthread_mutex_unlock(&seen.mu);
    CHECK(!atomic_load(&seen.wrong_thread));
    CHECKF(fake_inits() == 0, "%d initialisations after destroy", fake_inits());
}

/* Readers on other threads while the sampler runs fast (for ThreadSanitizer). */
struct hammer {
    struct rt_nvml_sampler *s;
    atomic_int stop;
    unsigned windowed;
    int bad;
};

static void *hammer_main(void *arg)
{
    struct hammer *h = arg;
    while (!atomic_load(&h->stop)) {
        struct rt_nvml_summary w;
        struct rt_nvml_reading r;
        rt_nvml_sampler_window(h->s, &w);
        h->windowed += w.samples;
        if (w.samples && (w.valid_mask != RT_NVML_ALL || w.mem_used_bytes_max != 3 * GIB))
            h->bad++;
        if (rt_nvml_sampler_read(h->s, &r) != 0 || r.sm_clock_mhz != FAKE_SM_MHZ)
            h->bad++;
        sleep_ms(1);
    }
    return NULL;
}

static void test_concurrent(void)
{
    static struct seen seen;
    seen_init(&seen);
    struct hammer h = {0};
    struct rt_nvml_sampler_opts o = {.period_ms = 1, .on_sample = on_sample, .ctx = &seen};
    CHECK_OK(rt_nvml_sampler_create_from(fake_path, &o, &h.s));
    if (!h.s)
        return;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, hammer_main, &h) == 0);
    sleep_ms(150);
    atomic_store(&h.stop, 1);
    pthread_join(t, NULL);
    struct rt_nvml_summary w;
    /* As in test_sampling: callbacks at most one ahead of the windows before the last one, none behind after. */
    const unsigned n_before = atomic_load(&seen.count);
    rt_nvml_sampler_window(h.s, &w);
    rt_nvml_sampler_destroy(h.s);
    const unsigned total = h.windowed + w.samples, n = atomic_load(&seen.count);
    CHECKF(h.bad == 0, "%d bad readings or windows", h.bad);
    CHECKF(total >= 10 && n >= total && n_before <= total + 1, "%u readings in windows, %u callbacks (%u before)",
           total, n, n_before);
}

/* A GPU without power readings: the rest still valid, power left out everywhere. */
static void test_partial(void)
{
    static struct seen seen;
    seen_init(&seen);
    setenv("FAKE_NVML_NO_POWER", "1", 1);
    struct rt_nvml_sampler *s = NULL;
    struct rt_nvml_sampler_opts o = {.period_ms = 20, .on_sample = on_sample, .ctx = &seen};
    struct quiet q;
    quiet_begin(&q);
    int rc = rt_nvml_sampler_create_from(fake_path, &o, &s);
    long printed = quiet_end(&q);
    CHECK(printed == 0);
    CHECKF(rc == 0, "create: %s", rt_errmsg());
    if (!s) {
        unsetenv("FAKE_NVML_NO_POWER");
        return;
    }
    const unsigned mask = RT_NVML_ALL & ~(unsigned)RT_NVML_POWER;
    CHECKF(!strcmp(rt_nvml_sampler_missing(s), "power: Not Supported"), "missing '%s'", rt_nvml_sampler_missing(s));
    struct rt_nvml_reading r;
    CHECK_OK(rt_nvml_sampler_read(s, &r));
    check_fake_reading(&r, 0, mask);
    CHECK(seen_wait(&seen, 3));
    struct rt_nvml_summary w;
    rt_nvml_sampler_window(s, &w);
    rt_nvml_sampler_destroy(s);
    unsetenv("FAKE_NVML_NO_POWER");
    CHECKF(w.samples >= 3 && w.valid_mask == mask, "%u samples, mask 0x%x", w.samples, w.valid_mask);
    pthread_mutex_lock(&seen.mu);
    check_window(&w, &seen, 0);
    pthread_mutex_unlock(&seen.mu);
    char text[128], json[256];
    CHECK_OK(rt_nvml_summary_format(&w, text, sizeof(text)));
    CHECKF(strstr(text, "gpu ") == text && strstr(text, " mem 3.0 GiB") && strstr(text, " 1980 MHz") &&
               !strstr(text, " W"),
           "'%s'", text);
    CHECK_OK(rt_nvml_summary_json(&w, json, sizeof(json)));
    CHECKF(strstr(json, "\"gpu_util_pct\": ") && strstr(json, "\"gpu_mem_used_gib\": 3.000") &&
               strstr(json, "\"gpu_sm_clock_mhz\": 1980") && !strstr(json, "power"),
           "'%s'", json);
    CHECKF(fake_inits() == 0, "%d initialisations after destroy", fake_inits());
}

/* Power read in every second reading only: its mean is over the readings that have it. */
static void test_partial_some(void)
{
    static struct seen seen;
    seen_init(&seen);
    setenv("FAKE_NVML_NO_POWER", "2", 1);
    struct rt_nvml_sampler *s = NULL;
    struct rt_nvml_sampler_opts o = {.period_ms = 20, .on_sample = on_sample, .ctx = &seen};
    CHECK_OK(rt_nvml_sampler_create_from(fake_path, &o, &s));
    if (s) {
        CHECK(seen_wait(&seen, 4));
        struct rt_nvml_summary w;
        rt_nvml_sampler_window(s, &w);
        rt_nvml_sampler_destroy(s);
        unsigned with = 0;
        pthread_mutex_lock(&seen.mu);
        for (unsigned i = 0; i < w.samples && i < seen.n; i++)
            with += (seen.r[i].valid_mask & RT_NVML_POWER) != 0;
        check_window(&w, &seen, 0);
        pthread_mutex_unlock(&seen.mu);
        CHECKF(w.samples >= 4 && with >= 1 && with < w.samples, "%u of %u readings with power", with, w.samples);
        CHECKF(w.valid_mask == RT_NVML_ALL, "mask 0x%x", w.valid_mask);
        CHECKF(w.power_w_mean == FAKE_POWER_W && w.power_w_max == FAKE_POWER_W,
               "power mean %.4f max %.4f: a mean over readings without power?", w.power_w_mean, w.power_w_max);
        CHECKF(w.util_gpu_pct_max > 0 && w.sm_clock_mhz_mean == FAKE_SM_MHZ, "clock mean %.3f",
               w.sm_clock_mhz_mean);
    }
    unsetenv("FAKE_NVML_NO_POWER");
}

/* The two formats on a summary made by hand. */
static void test_format(void)
{
    struct rt_nvml_summary w = {
        .samples = 10,
        .valid_mask = RT_NVML_ALL,
        .util_gpu_pct_mean = 87.26,
        .util_gpu_pct_max = 99,
        .mem_used_bytes_max = (uint64_t)(11.2 * (double)GIB),
        .mem_total_bytes = 80 * GIB,
        .power_w_mean = 312.44,
        .sm_clock_mhz_mean = 1755.2,
    };
    char buf[256];
    CHECK_OK(rt_nvml_summary_format(&w, buf, sizeof(buf)));
    CHECKF(!strcmp(buf, "gpu 87% mem 11.2 GiB 312 W 1755 MHz"), "'%s'", buf);
    CHECK_OK(rt_nvml_summary_json(&w, buf, sizeof(buf)));
    CHECKF(!strcmp(buf, "\"gpu_samples\": 10, \"gpu_util_pct\": 87.3, \"gpu_mem_used_gib\": 11.200, "
                        "\"gpu_power_w\": 312.4, \"gpu_sm_clock_mhz\": 1755"),
           "'%s'", buf);
    /* Valid JSON once braced. */
    char obj[300];
    snprintf(obj, sizeof(obj), "{%s}", buf);
    CHECK(obj[1] == '"' && obj[strlen(obj) - 2] != ',');

    /* Too small: cut text; JSON all or nothing. */
    char small[12];
    CHECK(rt_nvml_summary_format(&w, small, sizeof(small)) == -ENOSPC);
    CHECKF(!strcmp(small, "gpu 87% mem"), "'%s'", small);
    CHECK(rt_nvml_summary_json(&w, small, sizeof(small)) == -ENOSPC);
    CHECK(small[0] == 0);

    /* Only memory: the line still starts with "gpu". */
    w.valid_mask = RT_NVML_MEM;
    CHECK_OK(rt_nvml_summary_format(&w, buf, sizeof(buf)));
    CHECKF(!strcmp(buf, "gpu mem 11.2 GiB"), "'%s'", buf);
}

static void test_null(void)
{
    rt_nvml_sampler_destroy(NULL);
    struct rt_nvml_summary w;
    memset(&w, 0xff, sizeof(w));
    rt_nvml_sampler_window(NULL, &w);
    CHECK(w.samples == 0 && w.valid_mask == 0);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_nvml /path/to/libfake_nvml.so\n");
        return 77;
    }
    fake_path = argv[1];
    /* Held open for the whole test, so the fake's counters outlive each sampler's dlclose. */
    void *fake = dlopen(fake_path, RTLD_NOW | RTLD_LOCAL);
    if (!fake) {
        fprintf(stderr, "cannot open the stand-in NVML: %s\n", dlerror());
        return 1;
    }
    void *sym = dlsym(fake, "fake_nvml_inits");
    if (!sym) {
        fprintf(stderr, "%s has no fake_nvml_inits\n", fake_path);
        return 1;
    }
    memcpy(&fake_inits, &sym, sizeof(sym));
    unsetenv("FAKE_NVML_INIT_ERROR");
    unsetenv("FAKE_NVML_NO_POWER");

    test_available();
    test_unavailable();
    test_init_and_device_errors();
    test_readings_and_prompt_destroy();
    test_sampling();
    test_concurrent();
    test_partial();
    test_partial_some();
    test_format();
    test_null();
    dlclose(fake);
    return check_result();
}
