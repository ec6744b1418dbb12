/*
 * backend.h - what every backend's struct rt_backend and struct rt_stream
 * hold, private to compute/. The CPU backend (cpu/) and the CUDA backend
 * (cuda/) fill the same structs; rt_backend_create() (backend.c) picks one
 * and the accessors there read the common fields. Each backend's own create
 * and destroy are declared in its private header (cpu/cpu.h, cuda/cuda_be.h).
 */
#ifndef RT_COMPUTE_BACKEND_H
#define RT_COMPUTE_BACKEND_H

#include <pthread.h>

#include "compute/compute.h"

#ifdef __cplusplus
extern "C" {
#endif

struct rt_cuda; /* cuda/cuda_be.h */

/* A backend's page-locked host memory (compute.h's rt_backend_host_alloc:
 * cudaHostAlloc for the batch ring). NULL on the CPU, which needs none. */
struct rt_backend_io {
    void *(*host_alloc)(struct rt_backend *be, size_t bytes);
    void (*host_free)(struct rt_backend *be, void *p);
};

struct cpu_queue; /* cpu/async.c: one asynchronous stream's worker thread */
struct cpu_dnnl;  /* cpu/dnnl.c */

struct rt_stream {
    struct rt_backend *be;
    void *handle;           /* CUDA: the cudaStream_t ops are issued on; CPU: NULL */
    struct cpu_queue *q;    /* CPU asynchronous streams: the stream's worker; NULL otherwise */
    uint64_t points;        /* events and timeline marks recorded on it so far (rt_backend_host_waits) */
};

struct rt_event {
    struct rt_backend *be;
    void *handle;           /* CUDA: the cudaEvent_t */
    struct cpu_queue *q;    /* CPU asynchronous streams: where it was last recorded (NULL: never) */
    uint64_t seq;           /* ... and how many calls had been queued there then */
    struct rt_stream *on;   /* the stream of the last record (NULL: never recorded) */
    uint64_t point;         /* its `points` count at that record */
};

/*
 * A backend's streams and events beyond the default stream: the machinery
 * that compute.h's events and the input uploads' copy stream (input.c) are
 * written once over. NULL on the ordinary CPU backend, where every op has
 * finished when it returns. create returns NULL with rt_errmsg() set;
 * event_init 0 or -errno; the rest cannot fail (CUDA errors abort through
 * the check macros). alloc/free are ordered on the stream (cudaMallocAsync);
 * copy_from_host reads `host` when the copy runs, not when it is issued, as a
 * DMA from page-locked memory does: the caller keeps it until an event
 * recorded after the copy has passed.
 */
struct rt_backend_streams {
    struct rt_stream *(*create)(struct rt_backend *be);
    void (*destroy)(struct rt_stream *s);
    int (*event_init)(struct rt_event *e);
    void (*event_fini)(struct rt_event *e);
    void (*record)(struct rt_event *e, struct rt_stream *s);
    void (*wait)(struct rt_stream *s, struct rt_event *e);
    void (*synchronize)(struct rt_event *e);
    void *(*alloc)(struct rt_stream *s, size_t bytes);
    void (*free)(struct rt_stream *s, void *p);
    void (*copy_from_host)(struct rt_stream *s, void *dst, const void *host, size_t bytes);
    void (*call)(struct rt_stream *s, void (*fn)(void *arg), void *arg); /* rt_stream_call */
    /* Graphs of the default stream's work (compute.h): begin 0 or -errno; end 0 and the implementation's
     * graph in *out, or -errno; launch on the default stream; destroy after its replays. */
    int (*capture_begin)(struct rt_backend *be);
    int (*capture_end)(struct rt_backend *be, void **out);
    void (*graph_launch)(struct rt_backend *be, void *g);
    void (*graph_destroy)(struct rt_backend *be, void *g);
    /* Timelines (timeline.c): native marks for t->cap points; the anchor; a mark; their times after a
     * host wait (filling t->m[i].ns for i < t->n). */
    int (*marks_init)(struct rt_timeline *t);
    void (*marks_fini)(struct rt_timeline *t);
    void (*marks_start)(struct rt_timeline *t, int exact);
    void (*mark)(struct rt_timeline *t, int i);
    void (*marks_read)(struct rt_timeline *t);
};

struct rt_timeline {
    struct rt_backend *be;
    struct rt_stream *s;        /* the stream of the marks since the last start */
    int cap, n;
    uint64_t last_point;        /* the stream's `points` count at the last mark */
    uint64_t last_seq;          /* CPU asynchronous streams: the last mark's place in its queue */
    struct rt_timeline_mark *m;
    void **native;              /* CUDA: cap events, then the anchor, then the base */
    uint64_t anchor_ns;         /* CUDA: the host time the anchor passed */
    uint64_t base_ns;           /* CUDA: the host time the base passed (0: no exact start yet) */
    int exact;                  /* CUDA: this start wants host times (the anchor's from the base's) */
};

/*
 * The input uploads (compute.h, rt_backend_input_upload): a copy stream and
 * two device buffers used in turn, each with the event of its copy and the
 * event of compute having read it. input.c, over the backend's streams.
 */
struct rt_input_pair {
    struct rt_stream *copy;
    uint8_t *buf[2];
    size_t bytes[2];
    struct rt_event copied[2], consumed[2];
};

struct rt_backend {
    enum rt_backend_kind kind;
    int threads;            /* CPU worker threads */
    struct rt_stream stream;
    const struct rt_ops *ops;
    /* The 16-bit tables (rt_backend_ops_for), NULL where the device has none;
     * why_not_bf16 and why_not_f16 say why, for the message. */
    const struct rt_ops *ops_bf16, *ops_f16;
    char why_not_bf16[160], why_not_f16[160];
    /* The reference twins of ops, ops_bf16 and ops_f16 (rt_backend_ops_reference); NULL on the CPU. */
    const struct rt_ops *ref_ops, *ref_bf16, *ref_f16;
    void *scratch;          /* CPU: see rt_cpu_scratch() */
    size_t scratch_bytes;
    void *scratch16;        /* CPU bf16 table: its own scratch (cpu/bf16.c), apart from rt_cpu_scratch()'s */
    size_t scratch16_bytes;
    struct cpu_dnnl *dnnl;  /* CPU: oneDNN's engine, stream and primitive cache (cpu/dnnl.c); NULL until used */
    char describe[352];
    char pci_bus_id[32];    /* CUDA: the GPU's PCI bus id ("0000:3B:00.0"); "" otherwise */
    struct rt_cuda *cuda;   /* CUDA: the device, handles and caches; NULL on the CPU */
    const struct rt_backend_io *io; /* NULL on the CPU */
    uint64_t input_tickets; /* rt_backend_input_upload calls so far */
    int device;             /* CUDA device ordinal; -1 on the CPU */
    const struct rt_backend_streams *streams; /* NULL on the ordinary CPU backend */
    struct rt_input_pair input; /* with `streams`: rt_backend_input_* (input.c) */
    struct cpu_async *async;    /* CPU asynchronous streams (cpu/async.c); NULL otherwise */
    uint64_t host_waits;        /* rt_backend_host_waits(); atomic */
    uint64_t graph_gen;         /* bumped when memory a graph may have baked in is freed or regrown */
    pthread_t owner;            /* the thread that created it, which queues the work */
};

/* Every backend's download, sync and to_nchw call this on the stream they waited for (rt_backend_host_waits):
 * it counts the wait when `s` is the default stream. */
void rt_backend_waited(struct rt_stream *s);
/* Graphs captured at an older generation may use freed memory: drop them (net.c). */
static inline uint64_t rt_backend_graph_gen(const struct rt_backend *be)
{
    return be->graph_gen;
}

/* A new point recorded on `s` (an event or a timeline mark): returns its number. */
uint64_t rt_stream_point(struct rt_stream *s);

/* The compute stream waits for upload `ticket`'s copy; then marks its buffer consumed (after the ops issued
 * in between). No-ops on the CPU. */
void rt_backend_input_acquire(struct rt_backend *be, uint64_t ticket);
void rt_backend_input_release(struct rt_backend *be, uint64_t ticket);

/* Sets up / tears down be->input over be->streams (input.c): 0 or -errno. */
int rt_input_pair_init(struct rt_backend *be);
void rt_input_pair_fini(struct rt_backend *be);

#ifdef __cplusplus
}
#endif

#endif
