/*
 * nvml.h - GPU counters (utilisation, memory, power, SM clock) read through
 * NVML, the NVIDIA driver's management library, by a sampler thread.
 *
 * What it does. rt_nvml_sampler_create() opens libnvidia-ml.so.1 with
 * dlopen() (it is never linked, and no NVML or CUDA header is needed to build
 * this), initialises NVML, finds one GPU by its PCI bus id (else by NVML's
 * index) and starts a thread that reads the counters about once per period.
 * Each reading goes to an optional callback (the trace's counters) and into a
 * window that rt_nvml_sampler_window() summarises and empties (the epoch line
 * and the metrics). Two helpers format a summary for those.
 *
 * Absent means silent. Without the library, with an NVML that lacks one of the
 * functions used here, when nvmlInit fails (no driver) or when the GPU is not
 * found, the functions here return an error with the reason in rt_errmsg() (or
 * in `why`) and print nothing: whether a missing NVML is worth a line is the
 * caller's decision. Counters that a GPU does not support (power on some
 * boards) are simply not valid in its readings; the others still are.
 *
 * What it does not do. It changes no GPU setting, reads only the one GPU it
 * was given, knows nothing of CUDA (the caller passes the bus id it got from
 * the CUDA runtime), and does not aggregate across ranks.
 *
 * Threads. Each sampler owns one thread. rt_nvml_sampler_window() and
 * rt_nvml_sampler_read() may be called from any thread, concurrently with the
 * sampler's (NVML itself is thread-safe); create and destroy of one sampler
 * are the caller's to order. Several samplers may exist at once (NVML counts
 * its initialisations). Functions return 0 or -errno with the reason in
 * rt_errmsg(), unless a comment says otherwise.
 */
#ifndef RT_COMMON_NVML_H
#define RT_COMMON_NVML_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library opened by default, through the dynamic loader's search. */
#define RT_NVML_SONAME "libnvidia-ml.so.1"

/* The counters of a reading, as bits of its valid_mask. */
enum rt_nvml_field {
    RT_NVML_UTIL = 1u << 0,     /* util_gpu_pct, util_mem_pct */
    RT_NVML_MEM = 1u << 1,      /* mem_used_bytes, mem_total_bytes */
    RT_NVML_POWER = 1u << 2,    /* power_w */
    RT_NVML_SM_CLOCK = 1u << 3, /* sm_clock_mhz */
    RT_NVML_ALL = RT_NVML_UTIL | RT_NVML_MEM | RT_NVML_POWER | RT_NVML_SM_CLOCK,
};

/*
 * One reading of one GPU. A field is meaningful only when its bit is set in
 * valid_mask (it is 0 otherwise); each counter is read on its own, so one
 * failing leaves the others valid.
 */
struct rt_nvml_reading {
    double t_s;               /* when it was taken: rt_now_ns() / 1e9 (monotonic clock) */
    unsigned util_gpu_pct;    /* % of the last sample period with a kernel running (NVML's own period) */
    unsigned util_mem_pct;    /* % of it with device memory being read or written */
    uint64_t mem_used_bytes;  /* device memory in use, all processes (and the driver's reserve) */
    uint64_t mem_total_bytes; /* device memory in all */
    double power_w;           /* board power draw, watts (NVML: milliwatts / 1000) */
    unsigned sm_clock_mhz;    /* current SM clock */
    unsigned valid_mask;      /* enum rt_nvml_field bits */
};

/*
 * The readings of one window. Means are over the readings in which that
 * counter was valid; a counter valid in none has its bit clear in valid_mask
 * and its figures 0. samples == 0: no reading since the previous window.
 */
struct rt_nvml_summary {
    unsigned samples;         /* readings in the window */
    unsigned valid_mask;      /* counters valid in at least one reading */
    double t_first_s, t_last_s; /* times of the first and last reading (rt_now_ns() / 1e9) */
    double util_gpu_pct_mean, util_gpu_pct_max;
    double util_mem_pct_mean, util_mem_pct_max;
    double mem_used_bytes_mean;
    uint64_t mem_used_bytes_max;
    uint64_t mem_total_bytes; /* from the last reading */
    double power_w_mean, power_w_max;
    double sm_clock_mhz_mean, sm_clock_mhz_max;
};

struct rt_nvml_sampler_opts {
    /*
     * The GPU, as its PCI bus id ("0000:3B:00.0", what cudaDeviceGetPCIBusId
     * gives for the device this rank drives; NVML reads it as %x:%x:%x.%x).
     * Borrowed, copied by create. NULL or "": use nvml_index instead. A bus id
     * that NVML does not find is an error, not a fall-back to the index, which
     * would read some other GPU's counters.
     */
    const char *pci_bus_id;
    /*
     * NVML's index of the GPU, used only without a bus id. NVML numbers every
     * GPU of the node in PCI order whatever CUDA_VISIBLE_DEVICES says, so this
     * equals the CUDA ordinal only when nothing renumbers the devices (no
     * CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER=PCI_BUS_ID): prefer the bus id.
     */
    unsigned nvml_index;
    unsigned period_ms; /* between readings; 0: 1000. At most 3600000. */
    /*
     * Called from the sampler thread with each reading, before it enters the
     * window; NULL: none. It must return promptly (the next reading waits for
     * it) and must not destroy the sampler; it may call the other functions
     * here. `r` is valid only during the call.
     */
    void (*on_sample)(void *ctx, const struct rt_nvml_reading *r);
    void *ctx; /* passed to on_sample; borrowed */
};

struct rt_nvml_sampler;

/*
 * Opens NVML (RT_NVML_SONAME), finds the GPU of `o`, takes one reading on the
 * calling thread to see which counters it has, and starts the sampler thread,
 * which reads at once and then every o->period_ms until destroyed. Stores the
 * sampler in *out (NULL on failure). Returns 0, or (printing nothing):
 *   -EINVAL   a bad option (period over an hour; NULL o or out)
 *   -ENOENT   the library could not be opened (the message names it and gives
 *             the loader's reason)
 *   -ENOSYS   it lacks a function used here ("... lacks nvmlInit_v2, ...")
 *   -ENODEV   nvmlInit_v2 failed (no driver), or the GPU was not found
 *   -ENOTSUP  the GPU was found but none of the counters could be read
 *   -ENOMEM, or pthread_create's error.
 */
int rt_nvml_sampler_create(const struct rt_nvml_sampler_opts *o, struct rt_nvml_sampler **out);

/*
 * rt_nvml_sampler_create() with `soname` opened instead of RT_NVML_SONAME: a
 * file path (tests load a stand-in library this way) or another soname.
 * Borrowed; only used during the call.
 */
int rt_nvml_sampler_create_from(const char *soname, const struct rt_nvml_sampler_opts *o,
                                struct rt_nvml_sampler **out);

/*
 * Stops the thread (promptly: it waits on a condition variable, not a sleep
 * of a whole period; at most one reading in progress is finished), then shuts
 * NVML down and closes the library. NULL is fine. Not from on_sample.
 */
void rt_nvml_sampler_destroy(struct rt_nvml_sampler *s);

/*
 * Summarises in *out the readings taken since the previous call (since create
 * for the first) and starts a new window. Thread-safe. An empty window gives
 * samples == 0 (a period longer than the interval between calls).
 */
void rt_nvml_sampler_window(struct rt_nvml_sampler *s, struct rt_nvml_summary *out);

/*
 * Takes one reading now, on the calling thread, outside the window and
 * without calling on_sample. Returns 0 when at least one counter was read
 * (r->valid_mask says which), else -EIO with NVML's reasons. Thread-safe.
 */
int rt_nvml_sampler_read(struct rt_nvml_sampler *s, struct rt_nvml_reading *r);

/*
 * The counters this GPU did not give at create and NVML's reasons, e.g.
 * "power: Not Supported"; "" when it gave them all. Valid for the sampler's
 * life; thread-safe (written once, before the thread starts).
 */
const char *rt_nvml_sampler_missing(const struct rt_nvml_sampler *s);

/*
 * The GPU as NVML was asked for it: "pci 0000:3B:00.0" or "index 0". Valid
 * for the sampler's life.
 */
const char *rt_nvml_sampler_device(const struct rt_nvml_sampler *s);

/*
 * Formats `sum` for the epoch line: "gpu 87% mem 11.2 GiB 312 W 1755 MHz",
 * leaving out the counters not valid in it; "gpu n/a" for an empty window.
 * Always NUL-terminates `buf` (when len > 0). Returns 0, or -ENOSPC when the
 * text was cut to fit.
 */
int rt_nvml_summary_format(const struct rt_nvml_summary *sum, char *buf, size_t len);

/*
 * Writes `sum` as JSON object members for the metrics lines:
 *   "gpu_samples": 10, "gpu_util_pct": 87.3, "gpu_mem_used_gib": 11.234,
 *   "gpu_power_w": 312.4, "gpu_sm_clock_mhz": 1755
 * with no braces and no leading or trailing comma; a counter not valid in
 * `sum` is left out, and an empty window writes "" (so the caller adds the
 * separating comma only when buf[0] != 0). gpu_util_pct and gpu_power_w and
 * gpu_sm_clock_mhz are window means; gpu_mem_used_gib is the window's maximum
 * (GiB = 2^30 bytes). Always NUL-terminates `buf` (len > 0). Returns 0, or
 * -ENOSPC when it did not fit (buf then holds "", never half a member).
 */
int rt_nvml_summary_json(const struct rt_nvml_summary *sum, char *buf, size_t len);

/*
 * Whether NVML can be used here, for `ringtrain --version`-style reports:
 * opens the library, looks up every function, runs nvmlInit_v2 and
 * nvmlShutdown, closes it. Writes to why[len] (NUL-terminated, cut to fit)
 * the library's path and the driver's version when it can be used ("NVML
 * /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1, driver 550.54.15"), else the
 * reason it cannot. Returns 1 when it can, 0 when not. Prints nothing and
 * leaves rt_errmsg() as it was. Thread-safe.
 */
int rt_nvml_available(char *why, size_t len);

/* rt_nvml_available() for the library `soname` (a path or a soname; borrowed). */
int rt_nvml_available_from(const char *soname, char *why, size_t len);

/*
 * The NVIDIA driver's version as NVML gives it ("580.65.06"), for the lines
 * that say what a GPU run had: writes it to buf[len] (cut to fit) and
 * returns 1; 0 with buf "" when NVML cannot be used or does not say. Prints
 * nothing and leaves rt_errmsg() as it was. Thread-safe.
 */
int rt_nvml_driver_version(char *buf, size_t len);
/* rt_nvml_driver_version() for the library `soname` (a path or a soname; borrowed). */
int rt_nvml_driver_version_from(const char *soname, char *buf, size_t len);

/*
 * The driver as a GPU run's lines name it, from the CUDA version it supports
 * (cudaDriverGetVersion: 13000 = 13.0; 0 = no driver): "580.65.06 (CUDA 13.0)",
 * "present (CUDA 13.0)" where NVML does not say, or "none". Thread-safe.
 */
void rt_nvml_describe_driver(int cuda_driver_version, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* RT_COMMON_NVML_H */
