/*
 * trace.h - a bounded recorder of what every thread of the process did and
 * when, written as a Chrome trace-event JSON file (it opens in Perfetto and
 * chrome://tracing): `ringtrain train --trace FILE`.
 *
 * One recorder exists per process at a time (rt_trace_create installs it).
 * The stages record into it through the free functions below, which do
 * nothing -- one relaxed load and a branch -- unless the recorder is
 * recording (rt_trace_set_recording: the driver opens it for a window of
 * optimizer steps). So the loader, the ring, the comm thread and the model
 * hold their trace calls in the open, and a run without --trace pays for
 * nothing but those loads.
 *
 * Events go into per-thread buffers made of fixed-size chunks (4096 events of
 * 64 bytes) taken from one budget, the cap (64 MiB by default): when it is
 * spent, further events are dropped and counted, never reallocated. Names
 * (`name`, a category) must be static strings; a `label` (a layer's name, a
 * bucket's number) is copied, up to 23 characters.
 *
 * Tracks: each thread that records is one track (tid), named by
 * rt_trace_thread_name() (call it when the thread starts, before or after
 * the recorder exists). Work that runs elsewhere -- a GPU stream, the CPU
 * backend's asynchronous stream, the buckets' ready-to-reduced intervals --
 * goes on a virtual track (rt_trace_track) whose events any thread may
 * record. Spans on one track must nest: each thread records only its own
 * nested spans; a virtual track's spans come from one place in order.
 *
 * Thread-safety: every function may be called from any thread, except
 * create, destroy and rt_trace_render, which the owner calls while no other
 * thread records (after the workers were joined, or with recording off and
 * the workers idle).
 *
 * Times are rt_now_ns() (CLOCK_MONOTONIC). The file is in microseconds from
 * a base time, and a rank's events may be shifted onto another rank's clock
 * when the ranks' parts are merged (see rt_trace_render).
 */
#ifndef RT_COMMON_TRACE_H
#define RT_COMMON_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/common.h"

/* Categories ("cat" in the file), which Perfetto can filter by. */
enum rt_trace_cat {
    RT_TRACE_STEP,      /* the driver's step and its phases */
    RT_TRACE_LOADER,    /* the loader's planner, I/O and workers */
    RT_TRACE_RING,      /* the ring's waits and occupancy */
    RT_TRACE_COPY,      /* host-to-device copies */
    RT_TRACE_COMPUTE,   /* forward and backward, per layer */
    RT_TRACE_COMM,      /* gradient buckets and collectives */
    RT_TRACE_OPTIM,     /* the optimizer */
    RT_TRACE_EVAL,      /* validation */
    RT_TRACE_CKPT,      /* checkpoints */
    RT_TRACE_COUNTER,   /* counters: images/s, loss scale, GPU readings */
    RT_TRACE_NCAT
};

struct rt_trace;

struct rt_trace_opts {
    size_t cap_bytes;        /* memory for events; 0 = 64 MiB */
    int pid;                 /* the process's id in the file: the rank */
    const char *process;     /* its name, e.g. "rank 0 (node1)"; copied */
};

/*
 * Creates the recorder and installs it as the process's, not yet recording.
 * Returns 0 with *out set, -EBUSY when one is installed already, -EINVAL for
 * a cap below one chunk (256 KiB), -ENOMEM.
 */
int rt_trace_create(const struct rt_trace_opts *o, struct rt_trace **out);
/* Uninstalls and frees it. NULL is fine. */
void rt_trace_destroy(struct rt_trace *t);

/* Starts (1) or stops (0) recording. A span that ends after recording stopped is not recorded (its
 * children, recorded before, stay). */
void rt_trace_set_recording(struct rt_trace *t, int on);

/* What the recorder holds. */
struct rt_trace_stats {
    uint64_t events;         /* recorded */
    uint64_t dropped;        /* lost to the cap */
    uint64_t bytes;          /* memory taken by event chunks */
    uint64_t cap_bytes;
    int tracks;
};
void rt_trace_get_stats(struct rt_trace *t, struct rt_trace_stats *out);

/* ---- recording (any thread; no-ops unless recording) ----------------------- */

/* 1 while the installed recorder records. One relaxed load. */
extern int rt_trace_live_flag;
static inline int rt_trace_live(void)
{
    return __atomic_load_n(&rt_trace_live_flag, __ATOMIC_RELAXED);
}

/* A span's start: rt_now_ns() while recording, else 0 (and rt_trace_end then does nothing). */
static inline uint64_t rt_trace_begin(void)
{
    return rt_trace_live() ? rt_now_ns() : 0;
}

/* Names the calling thread's track ("loader worker 1"); `sort` orders tracks in the file (lower first). */
void rt_trace_thread_name(const char *name, int sort);

/* A virtual track's id by name (made on first use, same id after): a stream, the buckets. -1 without a recorder. */
int rt_trace_track(const char *name, int sort);

/* A complete span [t0, t1) on the calling thread's track. `label` may be NULL. */
void rt_trace_span(enum rt_trace_cat cat, const char *name, const char *label, uint64_t t0, uint64_t t1);
/* The same on a virtual track. */
void rt_trace_span_on(int track, enum rt_trace_cat cat, const char *name, const char *label, uint64_t t0,
                      uint64_t t1);
/* An interval that may overlap anything (an async span: a bucket from ready to reduced), on a virtual track. */
void rt_trace_async(int track, enum rt_trace_cat cat, const char *name, const char *label, uint64_t id, uint64_t t0,
                    uint64_t t1);
/* A counter's value at time t (0: now), shown as a graph named `name`. */
void rt_trace_counter(const char *name, double value, uint64_t t);
/* A moment on the calling thread's track (0: now). */
void rt_trace_instant(enum rt_trace_cat cat, const char *name, const char *label, uint64_t t);

/* Ends a span begun with rt_trace_begin() (t0 = 0: it was not recording then). */
static inline void rt_trace_end(uint64_t t0, enum rt_trace_cat cat, const char *name, const char *label)
{
    if (t0)
        rt_trace_span(cat, name, label, t0, rt_now_ns());
}

/* A moment recorded unconditionally (the run's end, which the merge aligns on): also while not recording. */
void rt_trace_mark(enum rt_trace_cat cat, const char *name, uint64_t t);

/* ---- writing ------------------------------------------------------------------ */

/*
 * Writes this process's events as JSON array elements, comma-separated, each
 * preceded by a comma when `lead_comma`, with the process and track names
 * first: times become (ts + shift_ns - base_ns) / 1000 microseconds. Rank 0
 * writes its own with shift 0; another rank renders with shift = rank 0's
 * clock at the end minus its own (both taken just after the same
 * collective) and sends the text to rank 0, which appends it. Returns 0 or
 * -EIO.
 */
int rt_trace_render(struct rt_trace *t, FILE *f, int lead_comma, int64_t shift_ns, uint64_t base_ns);

/* The time the recorder was created (the default base of the file's times). */
uint64_t rt_trace_created_ns(const struct rt_trace *t);

/*
 * The file around the events: rt_trace_write_head() writes `{"traceEvents":[`,
 * rt_trace_write_tail() closes the array and adds "otherData": the world,
 * the step window and the stats summed over the ranks. 0 or -EIO.
 */
int rt_trace_write_head(FILE *f);
int rt_trace_write_tail(FILE *f, int world, const char *window, const struct rt_trace_stats *sum);

#endif /* RT_COMMON_TRACE_H */
