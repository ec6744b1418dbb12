/*
 * tracefile.c - `train --trace FILE`: the recorder's life in the driver.
 * Started before the loader's threads so that they are named; opened for the
 * window of optimizer steps (--trace-steps); at the end every rank renders
 * its events on rank 0's clock and rank 0 writes one file, receiving the
 * ranks' parts one at a time.
 *
 * Clocks: each rank reads its clock just after the run's last collective
 * (train_finish's); the ranks leave a collective within microseconds of each
 * other, so rank 0's reading minus a rank's is that rank's offset. The
 * "run end" mark on every rank sits at that moment.
 *
 * Also the GPU's counters (NVML), which go to the trace as counters and to
 * the epoch line.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "common/trace.h"
#include "tools/train/driver.h"

int tracefile_create(struct train *T)
{
    const struct train_cfg *c = &T->cfg;
    if (!c->trace)
        return 0;
    char host[64] = "?", name[128];
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = 0;
    snprintf(name, sizeof(name), "rank %d (%s)", T->rank, host);
    struct rt_trace_opts o = {.cap_bytes = (size_t)(c->trace_mb * 1048576.0), .pid = T->rank, .process = name};
    const int rc = rt_trace_create(&o, &T->tr.rec);
    if (rc < 0)
        return rc;
    /* Gathered at the run's end, allocated now: a failure then would leave this rank out of the others'
     * allgather. */
    T->tr.clocks = rt_calloc((size_t)T->world, sizeof(*T->tr.clocks), "the ranks' trace clocks");
    if (!T->tr.clocks)
        return -ENOMEM;
    rt_trace_thread_name("training", 0);
    return 0;
}

void tracefile_window(struct train *T, uint64_t update, int begin)
{
    const struct train_cfg *c = &T->cfg;
    if (!T->tr.rec)
        return;
    if (begin)
        rt_trace_set_recording(T->tr.rec, c->trace_all || (update >= c->trace_first && update < c->trace_last));
    else if (!c->trace_all && update >= c->trace_last)
        rt_trace_set_recording(T->tr.rec, 0);
}

/*
 * Rank 0: the file, written beside its final name and renamed when whole. The
 * temporary file is a new one of a name nobody can predict
 * (rt_file_create_temp), so a link planted beside the trace is never written
 * through; the rename replaces whatever the final name was, a link included.
 */
static int write_root(struct train *T, uint64_t base, const struct rt_trace_stats *sum,
                      const char *window)
{
    char tmp[4200];
    int fd, made = rt_file_create_temp(T->cfg.trace, tmp, sizeof(tmp), &fd);
    if (made < 0)
        return rt_errf(made, "cannot write the trace: %s", rt_errmsg());
    FILE *f = fdopen(fd, "w");
    if (!f) {
        const int e = errno;
        close(fd);
        unlink(tmp);
        return rt_errf(-e, "cannot write the trace %s: %s", tmp, strerror(e));
    }
    int rc = rt_trace_write_head(f);
    if (!rc)
        rc = rt_trace_render(T->tr.rec, f, 0, 0, base);
    for (int r = 1; r < T->world; r++) {
        uint64_t len = 0;
        rt_comm_gather_one(T->comm, r, &len, sizeof(len), "the trace's size");
        char *buf = len ? malloc(len) : NULL;
        if (len && !buf) {
            /* The caller ends the job: rank r waits to send. */
            fclose(f);
            unlink(tmp);
            return rt_errf(-ENOMEM, "out of memory for rank %d's trace (%" PRIu64 " bytes)", r, len);
        }
        rt_comm_gather_one(T->comm, r, buf, len, "the trace");
        if (!rc && len && fwrite(buf, 1, len, f) != len)
            rc = rt_errf(-EIO, "writing the trace %s: %s", tmp, strerror(errno));
        free(buf);
    }
    if (!rc)
        rc = rt_trace_write_tail(f, T->world, window, sum);
    if (fclose(f) != 0 && !rc)
        rc = rt_errf(-EIO, "writing the trace %s: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, T->cfg.trace) != 0)
        rc = rt_errf(-errno, "renaming %s to %s: %s", tmp, T->cfg.trace, strerror(errno));
    if (rc)
        unlink(tmp);
    return rc;
}

/* Another rank: its part, rendered on rank 0's clock, sent when rank 0 asks for it. */
static int send_part(struct train *T, int64_t shift, uint64_t base)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int rc = f ? rt_trace_render(T->tr.rec, f, 1, shift, base) : rt_errf(-ENOMEM, "no memory for the trace");
    if (f && fclose(f) != 0 && !rc)
        rc = rt_errf(-ENOMEM, "no memory for the trace");
    uint64_t n = rc ? 0 : (uint64_t)len;
    /* Rank 0 waits for this part whatever happened here: an empty part keeps the order. */
    for (int r = 1; r < T->world; r++) {
        rt_comm_gather_one(T->comm, r, &n, sizeof(n), "the trace's size");
        rt_comm_gather_one(T->comm, r, r == T->rank ? buf : NULL, r == T->rank ? n : 0, "the trace");
    }
    free(buf);
    return rc;
}

int tracefile_finish(struct train *T, uint64_t t_end)
{
    struct train_trace *t = &T->tr;
    if (!t->rec)
        return 0;
    rt_trace_set_recording(t->rec, 0);
    rt_trace_mark(RT_TRACE_STEP, "run end", t_end);
    /* The loader's threads record nothing more once they are gone. */
    input_destroy(T);
    uint64_t mine[2] = {t_end, rt_trace_created_ns(t->rec)};
    rt_comm_allgather(T->comm, mine, t->clocks, sizeof(mine), "the trace's clocks");
    const uint64_t base = t->clocks[0][1];
    const int64_t shift = (int64_t)(t->clocks[0][0] - t_end);
    struct rt_trace_stats st, sum;
    rt_trace_get_stats(t->rec, &st);
    uint64_t v[3] = {st.events, st.dropped, st.bytes};
    rt_comm_allreduce(T->comm, v, 3, RT_COMM_U64, RT_RED_SUM, "the trace's counts");
    sum = (struct rt_trace_stats){.events = v[0], .dropped = v[1], .bytes = v[2], .cap_bytes = st.cap_bytes};
    char window[64];
    if (T->cfg.trace_all)
        snprintf(window, sizeof(window), "all");
    else
        snprintf(window, sizeof(window), "%" PRIu64 ":%" PRIu64, T->cfg.trace_first, T->cfg.trace_last);
    const int rc = T->root ? write_root(T, base, &sum, window) : send_part(T, shift, base);
    if (rc < 0)
        return rc;
    if (T->root) {
        struct stat sb;
        t->file_bytes = stat(T->cfg.trace, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        printf("trace: %s (%.1f MB, %" PRIu64 " events from %d rank%s, optimizer steps %s); event memory %.1f of "
               "%.0f MiB per rank, %" PRIu64 " events dropped%s\n",
               T->cfg.trace, (double)t->file_bytes / 1e6, sum.events, T->world, T->world > 1 ? "s" : "", window,
               (double)st.bytes / 1048576.0, (double)st.cap_bytes / 1048576.0, sum.dropped,
               sum.dropped ? " (the cap was reached: raise --trace-mb or narrow --trace-steps)" : "");
        fflush(stdout);
    }
    return 0;
}

/* The sampler thread's readings as the trace's counters (no-ops unless recording). */
static void gpu_sample(void *ctx, const struct rt_nvml_reading *r)
{
    static __thread int named;
    (void)ctx;
    if (!named) {
        rt_trace_thread_name("gpu counters (NVML)", 8);
        named = 1;
    }
    const uint64_t t = (uint64_t)(r->t_s * 1e9);
    if (r->valid_mask & RT_NVML_UTIL)
        rt_trace_counter("gpu utilisation %", r->util_gpu_pct, t);
    if (r->valid_mask & RT_NVML_MEM)
        rt_trace_counter("gpu memory used GiB", (double)r->mem_used_bytes / 1073741824.0, t);
    if (r->valid_mask & RT_NVML_POWER)
        rt_trace_counter("gpu power W", r->power_w, t);
    if (r->valid_mask & RT_NVML_SM_CLOCK)
        rt_trace_counter("gpu SM clock MHz", r->sm_clock_mhz, t);
}

void tracefile_gpu_create(struct train *T)
{
    const char *bus = rt_backend_pci_bus_id(T->be);
    if (!bus)
        return;
    struct rt_nvml_sampler_opts o = {.pci_bus_id = bus, .period_ms = 1000, .on_sample = gpu_sample};
    if (rt_nvml_sampler_create(&o, &T->gpu) < 0)
        T->gpu = NULL; /* no NVML here: no counters, and nothing said */
}

void tracefile_gpu_destroy(struct train *T)
{
    rt_nvml_sampler_destroy(T->gpu);
    T->gpu = NULL;
}

void tracefile_destroy(struct train *T)
{
    rt_trace_destroy(T->tr.rec);
    free(T->tr.clocks);
    T->tr.rec = NULL;
    T->tr.clocks = NULL;
}
