/*
 * nvml.c - NVML opened with dlopen(), the few of its functions the counters
 * need, and the sampler thread with its window. See nvml.h.
 *
 * NVML's types and functions are declared below rather than taken from its
 * header, so that every build has this module, CUDA or not. It does not keep
 * the library open between samplers: each sampler (and each availability
 * check) opens it, initialises NVML, and undoes both when done; the loader and
 * NVML both count, so samplers side by side share one copy.
 */
#include "common/nvml.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"

/* ---- NVML's ABI --------------------------------------------------------------------------- */

/*
 * From NVML's nvml.h (NVML_API_VERSION 13; these declarations are unchanged
 * since the _v2 entry points came with NVML 5, CUDA 5.5):
 *
 *   typedef enum nvmlReturn_enum { NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1,
 *       NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_NOT_SUPPORTED = 3, ...,
 *       NVML_ERROR_NOT_FOUND = 6, ..., NVML_ERROR_UNKNOWN = 999 } nvmlReturn_t;
 *   typedef struct nvmlDevice_st *nvmlDevice_t;
 *   typedef struct nvmlUtilization_st { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
 *   typedef struct nvmlMemory_st { unsigned long long total; unsigned long long free;
 *                                  unsigned long long used; } nvmlMemory_t;   (bytes)
 *   typedef enum nvmlClockType_enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1,
 *       NVML_CLOCK_MEM = 2, NVML_CLOCK_VIDEO = 3 } nvmlClockType_t;         (MHz)
 *   nvmlReturn_t nvmlInit_v2(void);
 *   nvmlReturn_t nvmlShutdown(void);
 *   const char *nvmlErrorString(nvmlReturn_t result);
 *   nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
 *   nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device);
 *   nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization);
 *   nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
 *   nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power);  (milliwatts)
 *   nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock);
 *   nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length);
 *
 * An enum is passed and returned as an int on the ABIs NVML ships for
 * (x86-64, aarch64, ppc64le), so both enums are int here. The structs keep
 * NVML's tags; there are no typedefs.
 */
#define NVML_SUCCESS 0
#define NVML_CLOCK_SM 1
#define NVML_DRIVER_VERSION_LEN 80 /* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE */

struct nvmlDevice_st; /* opaque */

struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
};

struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
};

/* Every function used, each required: one missing makes NVML unavailable. */
#define NVML_FUNCS(X)                                                                                                 \
    X(int, nvmlInit_v2, (void))                                                                                       \
    X(int, nvmlShutdown, (void))                                                                                      \
    X(const char *, nvmlErrorString, (int result))                                                                    \
    X(int, nvmlDeviceGetHandleByIndex_v2, (unsigned int index, struct nvmlDevice_st **device))                        \
    X(int, nvmlDeviceGetHandleByPciBusId_v2, (const char *pciBusId, struct nvmlDevice_st **device))                   \
    X(int, nvmlDeviceGetUtilizationRates, (struct nvmlDevice_st * device, struct nvmlUtilization_st *utilization))    \
    X(int, nvmlDeviceGetMemoryInfo, (struct nvmlDevice_st * device, struct nvmlMemory_st *memory))                    \
    X(int, nvmlDeviceGetPowerUsage, (struct nvmlDevice_st * device, unsigned int *power))                             \
    X(int, nvmlDeviceGetClockInfo, (struct nvmlDevice_st * device, int type, unsigned int *clock))

/* One opened and initialised NVML. */
struct nvml_lib {
    void *handle;
    char path[512]; /* the file the loader opened */
#define NVML_MEMBER(ret, name, params) ret(*name) params;
    NVML_FUNCS(NVML_MEMBER)
#undef NVML_MEMBER
    int (*nvmlSystemGetDriverVersion)(char *version, unsigned int length); /* optional */
};

static const struct {
    const char *name;
    size_t offset;
} nvml_syms[] = {
#define NVML_SYM(ret, name, params) {#name, offsetof(struct nvml_lib, name)},
    NVML_FUNCS(NVML_SYM)
#undef NVML_SYM
};

static const char *nvml_err(const struct nvml_lib *L, int rc)
{
    const char *s = L->nvmlErrorString ? L->nvmlErrorString(rc) : NULL;
    return s ? s : "unknown error";
}

/*
 * Opens `soname`, looks up every function and runs nvmlInit_v2. Returns 0
 * with NVML initialised, or -ENOENT / -ENOSYS / -ENODEV with the reason in
 * why[len] and nothing left open. Writes nothing else anywhere.
 */
static int lib_open(struct nvml_lib *L, const char *soname, char *why, size_t len)
{
    memset(L, 0, sizeof(*L));
    why[0] = 0;
    dlerror(); /* a stale message must not be taken for this call's */
    /* RTLD_LOCAL: its symbols stay out of the global scope; RTLD_NOW: a library
     * missing its own dependencies fails here, not in the sampler thread. */
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, len, "NVML (%s) could not be opened: %s", soname, e ? e : "not found");
        return -ENOENT;
    }
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
        snprintf(L->path, sizeof(L->path), "%s", lm->l_name);
    else
        snprintf(L->path, sizeof(L->path), "%s", soname);

    char missing[400] = "";
    size_t nmissing = 0;
    for (size_t i = 0; i < RT_ARRAY_LEN(nvml_syms); i++) {
        void *addr = dlsym(h, nvml_syms[i].name);
        if (!addr) {
            rt_appendf(missing, sizeof(missing), "%s%s", nmissing ? ", " : "", nvml_syms[i].name);
            nmissing++;
        }
        /* ISO C has no conversion from void * to a function pointer; the bytes are the address. */
        memcpy((char *)L + nvml_syms[i].offset, &addr, sizeof(addr));
    }
    if (nmissing) {
        snprintf(why, len, "NVML (%s) lacks %s (an NVML older than the functions this build calls?)", L->path,
                 missing);
        dlclose(h);
        memset(L, 0, sizeof(*L));
        return -ENOSYS;
    }
    void *ver = dlsym(h, "nvmlSystemGetDriverVersion");
    memcpy(&L->nvmlSystemGetDriverVersion, &ver, sizeof(ver));

    int rc = L->nvmlInit_v2();
    if (rc != NVML_SUCCESS) {
        snprintf(why, len, "NVML (%s): nvmlInit_v2 failed: %s (NVML error %d)", L->path, nvml_err(L, rc), rc);
        dlclose(h);
        memset(L, 0, sizeof(*L));
        return -ENODEV;
    }
    L->handle = h;
    return 0;
}

/* Shuts NVML down and closes the library; an unopened `L` is fine. */
static void lib_close(struct nvml_lib *L)
{
    if (!L->handle)
        return;
    L->nvmlShutdown();
    dlclose(L->handle);
    memset(L, 0, sizeof(*L));
}

/*
 * Reads every counter of `dev` into *r; each on its own, so one failing
 * leaves the rest. When `why` is not NULL, NVML's reason for each counter that
 * failed is appended to it ("power: Not Supported").
 */
static void read_counters(const struct nvml_lib *L, struct nvmlDevice_st *dev, struct rt_nvml_reading *r, char *why,
                          size_t len)
{
    memset(r, 0, sizeof(*r));
    r->t_s = (double)rt_now_ns() * 1e-9;
    struct nvmlUtilization_st u;
    struct nvmlMemory_st m;
    unsigned int mw = 0, mhz = 0;
    int rc;
    if ((rc = L->nvmlDeviceGetUtilizationRates(dev, &u)) == NVML_SUCCESS) {
        r->util_gpu_pct = u.gpu;
        r->util_mem_pct = u.memory;
        r->valid_mask |= RT_NVML_UTIL;
    } else if (why) {
        rt_appendf(why, len, "%sutilization: %s", why[0] ? "; " : "", nvml_err(L, rc));
    }
    if ((rc = L->nvmlDeviceGetMemoryInfo(dev, &m)) == NVML_SUCCESS) {
        r->mem_used_bytes = m.used;
        r->mem_total_bytes = m.total;
        r->valid_mask |= RT_NVML_MEM;
    } else if (why) {
        rt_appendf(why, len, "%smemory: %s", why[0] ? "; " : "", nvml_err(L, rc));
    }
    if ((rc = L->nvmlDeviceGetPowerUsage(dev, &mw)) == NVML_SUCCESS) {
        r->power_w = mw / 1000.0;
        r->valid_mask |= RT_NVML_POWER;
    } else if (why) {
        rt_appendf(why, len, "%spower: %s", why[0] ? "; " : "", nvml_err(L, rc));
    }
    if ((rc = L->nvmlDeviceGetClockInfo(dev, NVML_CLOCK_SM, &mhz)) == NVML_SUCCESS) {
        r->sm_clock_mhz = mhz;
        r->valid_mask |= RT_NVML_SM_CLOCK;
    } else if (why) {
        rt_appendf(why, len, "%sSM clock: %s", why[0] ? "; " : "", nvml_err(L, rc));
    }
}

/* ---- the window ----------------------------------------------------------------------------- */

/* Sums and maxima of the readings since the last rt_nvml_sampler_window(). */
struct window {
    unsigned samples, mask;
    double t_first, t_last;
    unsigned n_util, n_mem, n_power, n_clock;
    double util_gpu_sum, util_gpu_max, util_mem_sum, util_mem_max;
    double mem_used_sum;
    uint64_t mem_used_max, mem_total;
    double power_sum, power_max;
    double clock_sum, clock_max;
};

static void window_add(struct window *w, const struct rt_nvml_reading *r)
{
    if (!w->samples)
        w->t_first = r->t_s;
    w->t_last = r->t_s;
    w->samples++;
    w->mask |= r->valid_mask;
    if (r->valid_mask & RT_NVML_UTIL) {
        w->n_util++;
        w->util_gpu_sum += r->util_gpu_pct;
        w->util_mem_sum += r->util_mem_pct;
        w->util_gpu_max = RT_MAX(w->util_gpu_max, (double)r->util_gpu_pct);
        w->util_mem_max = RT_MAX(w->util_mem_max, (double)r->util_mem_pct);
    }
    if (r->valid_mask & RT_NVML_MEM) {
        w->n_mem++;
        w->mem_used_sum += (double)r->mem_used_bytes;
        w->mem_used_max = RT_MAX(w->mem_used_max, r->mem_used_bytes);
        w->mem_total = r->mem_total_bytes;
    }
    if (r->valid_mask & RT_NVML_POWER) {
        w->n_power++;
        w->power_sum += r->power_w;
        w->power_max = RT_MAX(w->power_max, r->power_w);
    }
    if (r->valid_mask & RT_NVML_SM_CLOCK) {
        w->n_clock++;
        w->clock_sum += r->sm_clock_mhz;
        w->clock_max = RT_MAX(w->clock_max, (double)r->sm_clock_mhz);
    }
}

static void window_summary(const struct window *w, struct rt_nvml_summary *out)
{
    memset(out, 0, sizeof(*out));
    out->samples = w->samples;
    out->valid_mask = w->mask;
    out->t_first_s = w->t_first;
    out->t_last_s = w->t_last;
    if (w->n_util) {
        out->util_gpu_pct_mean = w->util_gpu_sum / w->n_util;
        out->util_gpu_pct_max = w->util_gpu_max;
        out->util_mem_pct_mean = w->util_mem_sum / w->n_util;
        out->util_mem_pct_max = w->util_mem_max;
    }
    if (w->n_mem) {
        out->mem_used_bytes_mean = w->mem_used_sum / w->n_mem;
        out->mem_used_bytes_max = w->mem_used_max;
        out->mem_total_bytes = w->mem_total;
    }
    if (w->n_power) {
        out->power_w_mean = w->power_sum / w->n_power;
        out->power_w_max = w->power_max;
    }
    if (w->n_clock) {
        out->sm_clock_mhz_mean = w->clock_sum / w->n_clock;
        out->sm_clock_mhz_max = w->clock_max;
    }
}

/* ---- the sampler ------------------------------------------------------------------------------ */

struct rt_nvml_sampler {
    struct nvml_lib lib;
    struct nvmlDevice_st *dev;
    uint64_t period_ns;
    void (*on_sample)(void *ctx, const struct rt_nvml_reading *r);
    void *ctx;
    char device[96];
    char missing[256];
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC: a step of the wall clock moves no deadline */
    pthread_t thread;
    int started;
    int stop;          /* under mu */
    struct window win; /* under mu */
};

static void ts_add_ns(struct timespec *t, uint64_t ns)
{
    ns += (uint64_t)t->tv_nsec;
    t->tv_sec += (time_t)(ns / 1000000000u);
    t->tv_nsec = (long)(ns % 1000000000u);
}

static int ts_before(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

static void *sampler_main(void *arg)
{
    struct rt_nvml_sampler *s = arg;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        /* NVML calls and the callback run unlocked: window() and destroy() never wait for them. */
        pthread_mutex_unlock(&s->mu);
        struct rt_nvml_reading r;
        read_counters(&s->lib, s->dev, &r, NULL, 0);
        if (s->on_sample)
            s->on_sample(s->ctx, &r);
        pthread_mutex_lock(&s->mu);
        window_add(&s->win, &r);
        /* A steady cadence; after a stall longer than a period, one period from now rather than a burst. */
        ts_add_ns(&next, s->period_ns);
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (ts_before(&next, &now)) {
            next = now;
            ts_add_ns(&next, s->period_ns);
        }
        /* destroy() sets stop and signals under mu, so the wake-up cannot be missed. */
        while (!s->stop && pthread_cond_timedwait(&s->cv, &s->mu, &next) == 0) {
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int rt_nvml_sampler_create_from(const char *soname, const struct rt_nvml_sampler_opts *o,
                                struct rt_nvml_sampler **out)
{
    if (!out)
        return rt_errf(-EINVAL, "rt_nvml_sampler_create: no place for the sampler");
    *out = NULL;
    if (!o || !soname)
        return rt_errf(-EINVAL, "rt_nvml_sampler_create: no options or library");
    if (o->period_ms > 3600000u)
        return rt_errf(-EINVAL, "rt_nvml_sampler_create: period %u ms is over an hour", o->period_ms);

    struct rt_nvml_sampler *s = rt_calloc(1, sizeof(*s), "NVML sampler");
    if (!s)
        return -ENOMEM;
    pthread_condattr_t ca;
    int rc = pthread_condattr_init(&ca);
    if (rc == 0) {
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        rc = pthread_cond_init(&s->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (rc != 0) {
        free(s);
        return rt_errf(-rc, "rt_nvml_sampler_create: pthread_cond_init: %s", strerror(rc));
    }
    pthread_mutex_init(&s->mu, NULL);
    s->period_ns = (uint64_t)(o->period_ms ? o->period_ms : 1000u) * 1000000u;
    s->on_sample = o->on_sample;
    s->ctx = o->ctx;
    const int by_bus = o->pci_bus_id && o->pci_bus_id[0];
    if (by_bus)
        snprintf(s->device, sizeof(s->device), "pci %.60s", o->pci_bus_id);
    else
        snprintf(s->device, sizeof(s->device), "index %u", o->nvml_index);

    char why[600];
    rc = lib_open(&s->lib, soname, why, sizeof(why));
    if (rc) {
        rt_errf(rc, "GPU counters unavailable: %s", why);
        goto fail;
    }
    int nrc = by_bus ? s->lib.nvmlDeviceGetHandleByPciBusId_v2(o->pci_bus_id, &s->dev)
                     : s->lib.nvmlDeviceGetHandleByIndex_v2(o->nvml_index, &s->dev);
    if (nrc != NVML_SUCCESS) {
        rc = rt_errf(-ENODEV, "GPU counters unavailable: NVML (%s) has no GPU at %s: %s (NVML error %d)", s->lib.path,
                     s->device, nvml_err(&s->lib, nrc), nrc);
        goto fail;
    }
    /* One reading now: which counters this GPU gives, and a clean error when it gives none. */
    struct rt_nvml_reading r;
    read_counters(&s->lib, s->dev, &r, s->missing, sizeof(s->missing));
    if (!r.valid_mask) {
        rc = rt_errf(-ENOTSUP, "GPU counters unavailable: NVML (%s) read none of the counters of the GPU at %s: %s",
                     s->lib.path, s->device, s->missing);
        goto fail;
    }
    rc = pthread_create(&s->thread, NULL, sampler_main, s);
    if (rc != 0) {
        rc = rt_errf(-rc, "rt_nvml_sampler_create: pthread_create: %s", strerror(rc));
        goto fail;
    }
    s->started = 1;
    *out = s;
    return 0;
fail:
    rt_nvml_sampler_destroy(s);
    return rc;
}

int rt_nvml_sampler_create(const struct rt_nvml_sampler_opts *o, struct rt_nvml_sampler **out)
{
    return rt_nvml_sampler_create_from(RT_NVML_SONAME, o, out);
}

void rt_nvml_sampler_destroy(struct rt_nvml_sampler *s)
{
    if (!s)
        return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    lib_close(&s->lib);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void rt_nvml_sampler_window(struct rt_nvml_sampler *s, struct rt_nvml_summary *out)
{
    if (!s) {
        memset(out, 0, sizeof(*out));
        return;
    }
    pthread_mutex_lock(&s->mu);
    window_summary(&s->win, out);
    memset(&s->win, 0, sizeof(s->win));
    pthread_mutex_unlock(&s->mu);
}

int rt_nvml_sampler_read(struct rt_nvml_sampler *s, struct rt_nvml_reading *r)
{
    char why[256] = "";
    read_counters(&s->lib, s->dev, r, why, sizeof(why));
    if (!r->valid_mask)
        return rt_errf(-EIO, "NVML read none of the counters of the GPU at %s: %s", s->device, why);
    return 0;
}

const char *rt_nvml_sampler_missing(const struct rt_nvml_sampler *s)
{
    return s->missing;
}

const char *rt_nvml_sampler_device(const struct rt_nvml_sampler *s)
{
    return s->device;
}

/* ---- formatting ----------------------------------------------------------------------------- */

#define GIB (1024.0 * 1024.0 * 1024.0)

int rt_nvml_summary_format(const struct rt_nvml_summary *sum, char *buf, size_t len)
{
    if (!len)
        return rt_errf(-ENOSPC, "rt_nvml_summary_format: no room");
    if (!sum->samples || !sum->valid_mask)
        return snprintf(buf, len, "gpu n/a") >= (int)len ? rt_errf(-ENOSPC, "rt_nvml_summary_format: no room") : 0;
    char t[160] = "";
    const unsigned m = sum->valid_mask;
    if (m & RT_NVML_UTIL)
        rt_appendf(t, sizeof(t), "gpu %.0f%%", sum->util_gpu_pct_mean);
    if (m & RT_NVML_MEM)
        rt_appendf(t, sizeof(t), "%smem %.1f GiB", t[0] ? " " : "gpu ", (double)sum->mem_used_bytes_max / GIB);
    if (m & RT_NVML_POWER)
        rt_appendf(t, sizeof(t), "%s%.0f W", t[0] ? " " : "gpu ", sum->power_w_mean);
    if (m & RT_NVML_SM_CLOCK)
        rt_appendf(t, sizeof(t), "%s%.0f MHz", t[0] ? " " : "gpu ", sum->sm_clock_mhz_mean);
    if (snprintf(buf, len, "%s", t) >= (int)len)
        return rt_errf(-ENOSPC, "rt_nvml_summary_format: %zu bytes of text for a buffer of %zu", strlen(t) + 1, len);
    return 0;
}

int rt_nvml_summary_json(const struct rt_nvml_summary *sum, char *buf, size_t len)
{
    if (!len)
        return rt_errf(-ENOSPC, "rt_nvml_summary_json: no room");
    buf[0] = 0;
    if (!sum->samples || !sum->valid_mask)
        return 0;
    char t[256] = "";
    const unsigned m = sum->valid_mask;
    rt_appendf(t, sizeof(t), "\"gpu_samples\": %u", sum->samples);
    if (m & RT_NVML_UTIL)
        rt_appendf(t, sizeof(t), ", \"gpu_util_pct\": %.1f", sum->util_gpu_pct_mean);
    if (m & RT_NVML_MEM)
        rt_appendf(t, sizeof(t), ", \"gpu_mem_used_gib\": %.3f", (double)sum->mem_used_bytes_max / GIB);
    if (m & RT_NVML_POWER)
        rt_appendf(t, sizeof(t), ", \"gpu_power_w\": %.1f", sum->power_w_mean);
    if (m & RT_NVML_SM_CLOCK)
        rt_appendf(t, sizeof(t), ", \"gpu_sm_clock_mhz\": %.0f", sum->sm_clock_mhz_mean);
    if (strlen(t) + 1 > len)
        return rt_errf(-ENOSPC, "rt_nvml_summary_json: %zu bytes of JSON for a buffer of %zu", strlen(t) + 1, len);
    memcpy(buf, t, strlen(t) + 1);
    return 0;
}

/* ---- availability ------------------------------------------------------------------------- */

/* Opens NVML from `soname` and reads the driver's version into ver[len] ("" when NVML lacks the function); 1 when
 * NVML could be used (msg then names the library), 0 with the reason in msg. */
static int driver_version(const char *soname, char *ver, size_t len, char *msg, size_t msg_len)
{
    struct nvml_lib L;
    ver[0] = 0;
    if (lib_open(&L, soname, msg, msg_len) != 0)
        return 0;
    char v[NVML_DRIVER_VERSION_LEN] = "";
    if (L.nvmlSystemGetDriverVersion && L.nvmlSystemGetDriverVersion(v, sizeof(v)) != NVML_SUCCESS)
        v[0] = 0;
    v[sizeof(v) - 1] = 0;
    snprintf(ver, len, "%s", v);
    snprintf(msg, msg_len, "NVML %s", L.path);
    lib_close(&L);
    return 1;
}

int rt_nvml_available_from(const char *soname, char *why, size_t len)
{
    char msg[600], ver[NVML_DRIVER_VERSION_LEN];
    const int ok = driver_version(soname, ver, sizeof(ver), msg, sizeof(msg));
    if (len)
        snprintf(why, len, "%s%s%s", msg, ver[0] ? ", driver " : "", ver);
    return ok;
}

int rt_nvml_driver_version_from(const char *soname, char *buf, size_t len)
{
    char msg[600], ver[NVML_DRIVER_VERSION_LEN];
    const int ok = driver_version(soname, ver, sizeof(ver), msg, sizeof(msg)) && ver[0];
    if (len)
        snprintf(buf, len, "%s", ok ? ver : "");
    return ok;
}

int rt_nvml_driver_version(char *buf, size_t len)
{
    return rt_nvml_driver_version_from(RT_NVML_SONAME, buf, len);
}

void rt_nvml_describe_driver(int cuda_driver_version, char *buf, size_t len)
{
    char nvidia[NVML_DRIVER_VERSION_LEN];
    /* The driver's own version number is NVML's to tell; where there is no driver there is no NVML to open. */
    if (!cuda_driver_version) {
        snprintf(buf, len, "none");
        return;
    }
    if (!rt_nvml_driver_version(nvidia, sizeof(nvidia)))
        snprintf(nvidia, sizeof(nvidia), "present");
    snprintf(buf, len, "%s (CUDA %d.%d)", nvidia, cuda_driver_version / 1000, cuda_driver_version % 1000 / 10);
}

int rt_nvml_available(char *why, size_t len)
{
    return rt_nvml_available_from(RT_NVML_SONAME, why, len);
}
