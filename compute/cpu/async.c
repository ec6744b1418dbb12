/*
 * async.c - the CPU backend's asynchronous streams (RINGTRAIN_CPU_STREAMS=async).
 *
 * On the GPU an op is queued on a stream and runs later; work on two streams
 * is ordered only by the events the code records and waits for. The
 * ordinary CPU backend runs every op before it returns, so a missing wait
 * there is invisible. In this mode each stream is a worker thread that runs
 * its queued calls in order, and the op table is one generic wrapper over
 * the CPU kernels: each op's arguments are captured into a call (a
 * descriptor passed by pointer is copied, as cuDNN reads it when the op is
 * issued) and queued on the stream's worker. Everything the CUDA backend
 * does at issue time is done here at issue time, everything it does later
 * is done later:
 *
 *   - the device-only ops (RT_OPS_DEVICE_LIST) are queued as they are;
 *   - upload, from_nchw and input_u8 copy their host data when issued
 *     (cudaMemcpyAsync from pageable memory stages it before returning);
 *   - download, to_nchw and sync block the caller until the stream has run
 *     them (they hand results to the host);
 *   - alloc returns zeroed memory at once; free first drains every stream;
 *   - events are fences: a record remembers how many calls the stream had
 *     queued, a wait (on another stream, or on the host) blocks until the
 *     worker has finished that many;
 *   - copy_from_host (the input uploads' copy stream) reads the host memory
 *     when it runs, after a pause as a DMA would take, so that a missing
 *     wait reads stale data rather than, by luck, the right data;
 *   - graphs (compute.h): while capturing, the default stream's calls are
 *     kept, not queued, and a launch queues a copy of each; what CUDA's
 *     stream capture rejects (a host wait, host data, an event, a host
 *     call, a free) fails the capture, named.
 *
 * Results are those of the synchronous backend bit for bit: the same
 * kernels run in the same order with the same thread count (each worker
 * sets up its own OpenMP team as the creating thread did). It does not
 * model the GPU's concurrency between two streams' kernels beyond what the
 * threads give, nor its memory model; it is for tests, and slower.
 */
#include <errno.h>
#include <pthread.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "compute/cpu/cpu.h"

/* The pause before a copy from the host runs (a DMA of a batch takes about this long on a PCIe link). */
#define COPY_PAUSE_NS 1000000L

/* One queued call: what to run and the arguments it captured. */
struct cpu_call {
    struct cpu_call *next;
    size_t bytes;               /* the call's own allocation: a graph's launch copies it */
    void (*run)(struct cpu_call *c);
    /* A descriptor argument, kept by value (an op has at most one). */
    union {
        struct rt_conv_desc conv;
        struct rt_pool_desc pool;
        struct rt_bn_desc bn;
    } desc;
    void *host;                 /* host data copied at issue time, freed with the call */
    alignas(max_align_t) unsigned char data[];
};

struct cpu_queue {
    struct rt_backend *be;
    struct rt_stream stream;    /* the stream ops are issued on; .q points back here */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* a call queued, a call done, or stop */
    struct cpu_call *head, *tail;
    uint64_t queued, done;      /* calls queued and finished so far */
    int stop;
    /* Capturing a graph (the calling thread's own: no lock): the calls kept, and why the capture fails. */
    int capturing;
    struct cpu_call *cap_head, **cap_tail;
    size_t cap_n;
    const char *cap_fail;
    struct cpu_queue *next_q;   /* the backend's list of streams */
};

struct cpu_async {
    pthread_mutex_t mu;         /* the list of streams */
    struct cpu_queue *queues;
};

/* ---- queues ---------------------------------------------------------------------- */

static void *queue_main(void *arg)
{
    struct cpu_queue *q = arg;
    /* The OpenMP thread count and FTZ/DAZ are per thread: set them as the backend's creator did. */
    rt_cpu_thread_setup(q->be->threads);
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        struct cpu_call *c = q->head;
        if (!c)
            break;
        /* c stays at the head while it runs: call_submit links new calls behind the tail. */
        pthread_mutex_unlock(&q->mu);
        c->run(c);
        free(c->host);
        pthread_mutex_lock(&q->mu);
        q->head = c->next;
        if (!q->head)
            q->tail = NULL;
        q->done++;
        pthread_cond_broadcast(&q->cv);
        free(c);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* Blocks until q has finished its first `seq` calls. */
static void queue_wait_for(struct cpu_queue *q, uint64_t seq)
{
    pthread_mutex_lock(&q->mu);
    while (q->done < seq)
        pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

/* Blocks until everything queued on q so far has run. */
static void queue_drain(struct cpu_queue *q)
{
    pthread_mutex_lock(&q->mu);
    while (q->done < q->queued)
        pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

static struct cpu_call *call_new(size_t arg_bytes, void (*run)(struct cpu_call *))
{
    struct cpu_call *c = calloc(1, sizeof(*c) + arg_bytes);
    if (!c) {
        fprintf(stderr, "ringtrain: out of memory queueing an op on a CPU stream\n");
        abort();
    }
    c->bytes = sizeof(*c) + arg_bytes;
    c->run = run;
    return c;
}

/* While capturing: what the capture cannot hold (the first reason is kept). Returns 1 when capturing. */
static int capture_refuse(struct rt_stream *s, const char *why)
{
    struct cpu_queue *q = s->q;
    if (!q || !q->capturing)
        return 0;
    if (!q->cap_fail)
        q->cap_fail = why;
    return 1;
}

/* The call runs after everything queued on s before it (kept for the graph instead while capturing). */
static void call_submit(struct rt_stream *s, struct cpu_call *c)
{
    struct cpu_queue *q = s->q;
    if (q->capturing) { /* kept for the graph, not run (with its own host copy, such as input_u8_dev's mean) */
        c->next = NULL;
        *q->cap_tail = c;
        q->cap_tail = &c->next;
        q->cap_n++;
        return;
    }
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = c;
    else
        q->head = c;
    q->tail = c;
    q->queued++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static struct cpu_queue *queue_create(struct rt_backend *be)
{
    struct cpu_queue *q = rt_calloc(1, sizeof(*q), "cpu stream");
    if (!q)
        return NULL;
    q->be = be;
    q->stream = (struct rt_stream){.be = be, .q = q};
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    int rc = pthread_create(&q->thread, NULL, queue_main, q);
    if (rc != 0) {
        pthread_cond_destroy(&q->cv);
        pthread_mutex_destroy(&q->mu);
        free(q);
        rt_errf(-rc, "cannot start a CPU stream's thread: %s", strerror(rc));
        return NULL;
    }
    struct cpu_async *a = be->async;
    pthread_mutex_lock(&a->mu);
    q->next_q = a->queues;
    a->queues = q;
    pthread_mutex_unlock(&a->mu);
    return q;
}

static void queue_destroy(struct cpu_queue *q)
{
    struct cpu_async *a = q->be->async;
    pthread_mutex_lock(&a->mu);
    for (struct cpu_queue **p = &a->queues; *p; p = &(*p)->next_q)
        if (*p == q) {
            *p = q->next_q;
            break;
        }
    pthread_mutex_unlock(&a->mu);
    pthread_mutex_lock(&q->mu);
    q->stop = 1; /* the worker finishes what is queued first */
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

/* Every stream of the backend has run what was queued on it. */
static void drain_all(struct rt_backend *be)
{
    struct cpu_async *a = be->async;
    pthread_mutex_lock(&a->mu);
    for (struct cpu_queue *q = a->queues; q; q = q->next_q)
        queue_drain(q);
    pthread_mutex_unlock(&a->mu);
}

/* ---- waits ------------------------------------------------------------------------- */

/* A stream's wait for an event: the stream and count the event pointed at when the wait was issued. */
struct args_wait {
    struct cpu_queue *q;
    uint64_t seq;
};

static void run_wait(struct cpu_call *c)
{
    const struct args_wait *a = (const struct args_wait *)(const void *)c->data;
    queue_wait_for(a->q, a->seq);
}

/* ---- the device-only ops: one generic wrapper ------------------------------------ */

/* RT_PP_MAP(f, a, b, ...) = f(a) f(b) ...; RT_PP_MAP_LIST(f, a, b, ...) = f(a), f(b), ... (up to 14). */
#define RT_PP_UNPAREN(...) __VA_ARGS__
#define RT_PP_CAT(a, b) RT_PP_CAT_(a, b)
#define RT_PP_CAT_(a, b) a##b
#define RT_PP_NARGS(...) RT_PP_NARGS_(__VA_ARGS__, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define RT_PP_NARGS_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, n, ...) n
#define RT_PP_MAP(f, ...) RT_PP_CAT(RT_PP_MAP_, RT_PP_NARGS(__VA_ARGS__))(f, __VA_ARGS__)
#define RT_PP_MAP_1(f, x) f(x)
#define RT_PP_MAP_2(f, x, ...) f(x) RT_PP_MAP_1(f, __VA_ARGS__)
#define RT_PP_MAP_3(f, x, ...) f(x) RT_PP_MAP_2(f, __VA_ARGS__)
#define RT_PP_MAP_4(f, x, ...) f(x) RT_PP_MAP_3(f, __VA_ARGS__)
#define RT_PP_MAP_5(f, x, ...) f(x) RT_PP_MAP_4(f, __VA_ARGS__)
#define RT_PP_MAP_6(f, x, ...) f(x) RT_PP_MAP_5(f, __VA_ARGS__)
#define RT_PP_MAP_7(f, x, ...) f(x) RT_PP_MAP_6(f, __VA_ARGS__)
#define RT_PP_MAP_8(f, x, ...) f(x) RT_PP_MAP_7(f, __VA_ARGS__)
#define RT_PP_MAP_9(f, x, ...) f(x) RT_PP_MAP_8(f, __VA_ARGS__)
#define RT_PP_MAP_10(f, x, ...) f(x) RT_PP_MAP_9(f, __VA_ARGS__)
#define RT_PP_MAP_11(f, x, ...) f(x) RT_PP_MAP_10(f, __VA_ARGS__)
#define RT_PP_MAP_12(f, x, ...) f(x) RT_PP_MAP_11(f, __VA_ARGS__)
#define RT_PP_MAP_13(f, x, ...) f(x) RT_PP_MAP_12(f, __VA_ARGS__)
#define RT_PP_MAP_14(f, x, ...) f(x) RT_PP_MAP_13(f, __VA_ARGS__)
#define RT_PP_MAP_LIST(f, ...) RT_PP_CAT(RT_PP_MAPL_, RT_PP_NARGS(__VA_ARGS__))(f, __VA_ARGS__)
#define RT_PP_MAPL_1(f, x) f(x)
#define RT_PP_MAPL_2(f, x, ...) f(x), RT_PP_MAPL_1(f, __VA_ARGS__)
#define RT_PP_MAPL_3(f, x, ...) f(x), RT_PP_MAPL_2(f, __VA_ARGS__)
#define RT_PP_MAPL_4(f, x, ...) f(x), RT_PP_MAPL_3(f, __VA_ARGS__)
#define RT_PP_MAPL_5(f, x, ...) f(x), RT_PP_MAPL_4(f, __VA_ARGS__)
#define RT_PP_MAPL_6(f, x, ...) f(x), RT_PP_MAPL_5(f, __VA_ARGS__)
#define RT_PP_MAPL_7(f, x, ...) f(x), RT_PP_MAPL_6(f, __VA_ARGS__)
#define RT_PP_MAPL_8(f, x, ...) f(x), RT_PP_MAPL_7(f, __VA_ARGS__)
#define RT_PP_MAPL_9(f, x, ...) f(x), RT_PP_MAPL_8(f, __VA_ARGS__)
#define RT_PP_MAPL_10(f, x, ...) f(x), RT_PP_MAPL_9(f, __VA_ARGS__)
#define RT_PP_MAPL_11(f, x, ...) f(x), RT_PP_MAPL_10(f, __VA_ARGS__)
#define RT_PP_MAPL_12(f, x, ...) f(x), RT_PP_MAPL_11(f, __VA_ARGS__)
#define RT_PP_MAPL_13(f, x, ...) f(x), RT_PP_MAPL_12(f, __VA_ARGS__)
#define RT_PP_MAPL_14(f, x, ...) f(x), RT_PP_MAPL_13(f, __VA_ARGS__)

/* A descriptor passed by pointer is copied into the call; every other argument is kept as it is. */
static void keep_none(struct cpu_call *c, const void *arg)
{
    (void)c;
    (void)arg;
}
static void keep_conv(struct cpu_call *c, const struct rt_conv_desc **d)
{
    c->desc.conv = **d;
    *d = &c->desc.conv;
}
static void keep_pool(struct cpu_call *c, const struct rt_pool_desc **d)
{
    c->desc.pool = **d;
    *d = &c->desc.pool;
}
static void keep_bn(struct cpu_call *c, const struct rt_bn_desc **d)
{
    c->desc.bn = **d;
    *d = &c->desc.bn;
}
#define ASYNC_KEEP(x)                                                                                                  \
    _Generic(cap_->x, const struct rt_conv_desc *: keep_conv, const struct rt_pool_desc *: keep_pool,                  \
             const struct rt_bn_desc *: keep_bn, default: keep_none)(c, &cap_->x);
#define ASYNC_FIELD(p) p;
#define ASYNC_ARG(x) cap_->x

/* For every op `name`: struct args_<name> (one field per parameter), run_<name> (the kernel on the captured
 * arguments) and capture_<name> (a call holding the arguments, not yet queued). */
#define ASYNC_CAPTURE(ret, name, params, args)                                                                         \
    struct args_##name {                                                                                               \
        RT_PP_MAP(ASYNC_FIELD, RT_PP_UNPAREN params)                                                                   \
    };                                                                                                                 \
    static void run_##name(struct cpu_call *c)                                                                         \
    {                                                                                                                  \
        struct args_##name *cap_ = (struct args_##name *)(void *)c->data;                                              \
        rt_cpu_##name(RT_PP_MAP_LIST(ASYNC_ARG, RT_PP_UNPAREN args));                                                  \
    }                                                                                                                  \
    __attribute__((unused)) static struct cpu_call *capture_##name params                                              \
    {                                                                                                                  \
        struct cpu_call *c = call_new(sizeof(struct args_##name), run_##name);                                         \
        struct args_##name *cap_ = (struct args_##name *)(void *)c->data;                                              \
        *cap_ = (struct args_##name){RT_PP_UNPAREN args};                                                              \
        RT_PP_MAP(ASYNC_KEEP, RT_PP_UNPAREN args)                                                                      \
        return c;                                                                                                      \
    }
RT_OPS_LIST(ASYNC_CAPTURE)
#undef ASYNC_CAPTURE

/* The device-only ops are queued as captured. */
#define ASYNC_QUEUE(ret, name, params, args)                                                                           \
    static ret async_##name params                                                                                     \
    {                                                                                                                  \
        call_submit(s, capture_##name args);                                                                           \
    }
RT_OPS_DEVICE_LIST(ASYNC_QUEUE)
#undef ASYNC_QUEUE

/* The arguments captured in call c of op `name`. */
#define ARGS(c, name) ((struct args_##name *)(void *)(c)->data)

/* ---- the ops that touch host memory ------------------------------------------------ */

static void *async_alloc(struct rt_backend *be, size_t bytes)
{
    return rt_cpu_alloc(be, bytes);
}

static void async_free(struct rt_backend *be, void *p)
{
    if (!p || capture_refuse(&be->stream, "a free (it waits for the device)"))
        return;
    /* Queued work may still read it (cudaFree waits for the device as well). */
    drain_all(be);
    rt_cpu_free(be, p);
}

/* `bytes` of host memory owned by the call (one block per call), freed after it ran. */
static void *keep_alloc(struct cpu_call *c, size_t bytes)
{
    c->host = malloc(bytes ? bytes : 1);
    if (!c->host) {
        fprintf(stderr, "ringtrain: out of memory staging %zu bytes for a CPU stream\n", bytes);
        abort();
    }
    return c->host;
}

static void *keep_host(struct cpu_call *c, const void *host, size_t bytes)
{
    return memcpy(keep_alloc(c, bytes), host, bytes);
}

static size_t shape_count(struct rt_shape4 sh)
{
    return (size_t)sh.n * (size_t)sh.c * (size_t)sh.h * (size_t)sh.w;
}

static void async_upload(struct rt_stream *s, void *dst, const void *host_src, size_t bytes)
{
    if (capture_refuse(s, "an upload from host memory"))
        return;
    struct cpu_call *c = capture_upload(s, dst, host_src, bytes);
    ARGS(c, upload)->host_src = keep_host(c, host_src, bytes);
    call_submit(s, c);
}

static void async_download(struct rt_stream *s, void *host_dst, const void *src, size_t bytes)
{
    if (capture_refuse(s, "a download (a host wait)"))
        return;
    call_submit(s, capture_download(s, host_dst, src, bytes));
    rt_backend_waited(s);
    queue_drain(s->q);
}

/* Queued like a device op: the worker copies when it gets there, and an event after it says when. */
static void async_download_async(struct rt_stream *s, void *host_dst, const void *src, size_t bytes)
{
    if (capture_refuse(s, "a copy to host memory"))
        return;
    call_submit(s, capture_download(s, host_dst, src, bytes));
}

static void async_sync(struct rt_stream *s)
{
    if (capture_refuse(s, "a stream synchronisation (a host wait)"))
        return;
    rt_backend_waited(s);
    queue_drain(s->q);
}

static void async_to_nchw(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *host_nchw)
{
    if (capture_refuse(s, "to_nchw (a host wait)"))
        return;
    call_submit(s, capture_to_nchw(s, sh, x, host_nchw));
    rt_backend_waited(s);
    queue_drain(s->q);
}

static void async_from_nchw(struct rt_stream *s, struct rt_shape4 sh, const float *host_nchw, float *x)
{
    if (capture_refuse(s, "from_nchw (host memory)"))
        return;
    struct cpu_call *c = capture_from_nchw(s, sh, host_nchw, x);
    ARGS(c, from_nchw)->host_nchw = keep_host(c, host_nchw, shape_count(sh) * sizeof(float));
    call_submit(s, c);
}

/* Images (unless NULL), then mean and std (C floats each), in one copy owned by the call. */
static void keep_input(struct cpu_call *c, struct rt_shape4 sh, const uint8_t **images, const float **mean,
                       const float **std)
{
    const size_t nimg = images ? shape_count(sh) : 0, nc = (size_t)sh.c * sizeof(float);
    const size_t off = (nimg + 63) & ~(size_t)63;
    unsigned char *k = keep_alloc(c, off + 2 * nc);
    if (images) {
        memcpy(k, *images, nimg);
        *images = k;
    }
    memcpy(k + off, *mean, nc);
    memcpy(k + off + nc, *std, nc);
    *mean = (const float *)(void *)(k + off);
    *std = (const float *)(void *)(k + off + nc);
}

static void async_input_u8(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *host_images, const float *mean,
                           const float *std, float *y)
{
    if (capture_refuse(s, "images read from host memory (not an input upload)"))
        return;
    struct cpu_call *c = capture_input_u8(s, sh, host_images, mean, std, y);
    struct args_input_u8 *a = ARGS(c, input_u8);
    keep_input(c, sh, &a->host_images, &a->mean, &a->std);
    call_submit(s, c);
}

static void async_input_u8_dev(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *dev_images,
                               const float *mean, const float *std, float *y)
{
    struct cpu_call *c = capture_input_u8_dev(s, sh, dev_images, mean, std, y);
    struct args_input_u8_dev *a = ARGS(c, input_u8_dev);
    keep_input(c, sh, NULL, &a->mean, &a->std);
    call_submit(s, c);
}

/* ---- the table ------------------------------------------------------------------- */

#define ASYNC_SLOT(ret, name, params, args) .name = async_##name,
static const struct rt_ops async_ops = {.act = RT_F32, .bn_relu = 1, .add_relu = 1, RT_OPS_LIST(ASYNC_SLOT)};
#undef ASYNC_SLOT

/* ---- streams and events ---------------------------------------------------------- */

static struct rt_stream *stream_create(struct rt_backend *be)
{
    struct cpu_queue *q = queue_create(be);
    return q ? &q->stream : NULL;
}

static void stream_destroy(struct rt_stream *s)
{
    queue_destroy(s->q);
}

static int event_init(struct rt_event *e)
{
    e->q = NULL;
    e->seq = 0;
    return 0;
}

static void event_fini(struct rt_event *e)
{
    (void)e;
}

/* The point after the calls queued on s so far. The caller orders record against waits on other threads. */
static void event_record(struct rt_event *e, struct rt_stream *s)
{
    if (capture_refuse(s, "an event recorded inside the captured work"))
        return;
    struct cpu_queue *q = s->q;
    pthread_mutex_lock(&q->mu);
    e->q = q;
    e->seq = q->queued;
    pthread_mutex_unlock(&q->mu);
}

/* Like cudaStreamWaitEvent: the wait is for the event's point as recorded now. */
static void event_wait(struct rt_stream *s, struct rt_event *e)
{
    if (capture_refuse(s, "a wait for an event inside the captured work") || !e->q)
        return;
    struct cpu_call *c = call_new(sizeof(struct args_wait), run_wait);
    *(struct args_wait *)(void *)c->data = (struct args_wait){e->q, e->seq};
    call_submit(s, c);
}

static void event_synchronize(struct rt_event *e)
{
    if (e->q)
        queue_wait_for(e->q, e->seq);
}

static void *stream_alloc(struct rt_stream *s, size_t bytes)
{
    return rt_cpu_alloc(s->be, bytes);
}

static void run_stream_free(struct cpu_call *c)
{
    free(*(void **)(void *)c->data);
}

static void stream_free(struct rt_stream *s, void *p)
{
    struct cpu_call *c = call_new(sizeof(void *), run_stream_free);
    *(void **)(void *)c->data = p;
    call_submit(s, c);
}

static void run_copy_from_host(struct cpu_call *c)
{
    const struct args_copy *a = (const struct args_copy *)(const void *)c->data;
    nanosleep(&(struct timespec){0, COPY_PAUSE_NS}, NULL);
    memcpy(a->dst, a->src, a->bytes);
}

static void stream_copy_from_host(struct rt_stream *s, void *dst, const void *host, size_t bytes)
{
    struct cpu_call *c = capture_copy(s, dst, host, bytes);
    c->run = run_copy_from_host;
    call_submit(s, c);
}

struct args_call {
    void (*fn)(void *arg);
    void *arg;
};

static void run_call(struct cpu_call *c)
{
    const struct args_call *a = (const struct args_call *)(const void *)c->data;
    a->fn(a->arg);
}

static void stream_call(struct rt_stream *s, void (*fn)(void *arg), void *arg)
{
    if (capture_refuse(s, "a host call (rt_stream_call)"))
        return;
    struct cpu_call *c = call_new(sizeof(struct args_call), run_call);
    *(struct args_call *)(void *)c->data = (struct args_call){fn, arg};
    call_submit(s, c);
}

/* A timeline mark: the worker writes the time it reached the call (the host reads it after a wait). */
static void run_stamp(struct cpu_call *c)
{
    **(uint64_t **)(void *)c->data = rt_now_ns();
}

static void stream_mark(struct rt_timeline *t, int i)
{
    if (capture_refuse(t->s, "a timeline mark (the step profile's) inside the captured work"))
        return;
    struct cpu_call *c = call_new(sizeof(uint64_t *), run_stamp);
    *(uint64_t **)(void *)c->data = &t->m[i].ns;
    call_submit(t->s, c);
    struct cpu_queue *q = t->s->q;
    pthread_mutex_lock(&q->mu);
    t->last_seq = q->queued;
    pthread_mutex_unlock(&q->mu);
}

/* Like cudaEventSynchronize on each mark: the stamps are written by the worker, so wait for the last (and
 * not for what was queued after it: a timeline read a step late leaves the next step's work queued). */
static void marks_read(struct rt_timeline *t)
{
    if (t->n)
        queue_wait_for(t->s->q, t->last_seq);
}

/* Before the timeline's marks are freed: a step that ended in an error (an overflow that stops the run, say)
 * never read them, and the worker may still be about to write a stamp into them. */
static void marks_fini(struct rt_timeline *t)
{
    queue_drain(t->s->q);
}

/* ---- graphs ---------------------------------------------------------------------- */

/* A captured graph: the default stream's calls in issue order, kept as they were captured. */
struct cpu_graph {
    size_t n;
    struct cpu_call **calls;
};

static void calls_free(struct cpu_call *c)
{
    while (c) {
        struct cpu_call *nx = c->next;
        free(c->host);
        free(c);
        c = nx;
    }
}

static int graph_capture_begin(struct rt_backend *be)
{
    struct cpu_queue *q = be->stream.q;
    if (q->capturing)
        return rt_errf(-EBUSY, "a capture is already under way");
    q->capturing = 1;
    q->cap_head = NULL;
    q->cap_tail = &q->cap_head;
    q->cap_n = 0;
    q->cap_fail = NULL;
    return 0;
}

static int graph_capture_end(struct rt_backend *be, void **out)
{
    struct cpu_queue *q = be->stream.q;
    q->capturing = 0;
    struct cpu_call *head = q->cap_head;
    q->cap_head = NULL;
    if (q->cap_fail) {
        calls_free(head);
        return rt_errf(-EINVAL, "cannot capture the step: %s", q->cap_fail);
    }
    struct cpu_graph *g = rt_calloc(1, sizeof(*g), "graph");
    if (g && q->cap_n)
        g->calls = rt_calloc(q->cap_n, sizeof(*g->calls), "graph calls");
    if (!g || (q->cap_n && !g->calls)) {
        free(g);
        calls_free(head);
        return -ENOMEM;
    }
    for (struct cpu_call *c = head; c; c = c->next)
        g->calls[g->n++] = c;
    *out = g;
    return 0;
}

/* Each call copied and queued: a descriptor argument, and a kept host copy (input_u8_dev's mean and std), still
 * point into the kept call, which the graph owns; the copy owns nothing. */
static void graph_launch(struct rt_backend *be, void *impl)
{
    const struct cpu_graph *g = impl;
    for (size_t i = 0; i < g->n; i++) {
        struct cpu_call *c = malloc(g->calls[i]->bytes);
        if (!c) {
            fprintf(stderr, "ringtrain: out of memory replaying a graph on a CPU stream\n");
            abort();
        }
        memcpy(c, g->calls[i], g->calls[i]->bytes);
        c->next = NULL;
        c->host = NULL;
        call_submit(&be->stream, c);
    }
}

static void graph_destroy(struct rt_backend *be, void *impl)
{
    struct cpu_graph *g = impl;
    if (!g)
        return;
    queue_drain(be->stream.q); /* its replays read the kept calls' descriptors */
    for (size_t i = 0; i < g->n; i++)
        free(g->calls[i]);
    free(g->calls);
    free(g);
}

static const struct rt_backend_streams async_streams = {
    .create = stream_create,
    .destroy = stream_destroy,
    .event_init = event_init,
    .event_fini = event_fini,
    .record = event_record,
    .wait = event_wait,
    .synchronize = event_synchronize,
    .alloc = stream_alloc,
    .free = stream_free,
    .copy_from_host = stream_copy_from_host,
    .call = stream_call,
    .capture_begin = graph_capture_begin,
    .capture_end = graph_capture_end,
    .graph_launch = graph_launch,
    .graph_destroy = graph_destroy,
    .marks_fini = marks_fini,
    .mark = stream_mark,
    .marks_read = marks_read,
};

/* ---- set-up ---------------------------------------------------------------------- */

int rt_cpu_async_start(struct rt_backend *be)
{
    struct cpu_async *a = rt_calloc(1, sizeof(*a), "cpu streams");
    if (!a)
        return -ENOMEM;
    pthread_mutex_init(&a->mu, NULL);
    be->async = a;
    struct cpu_queue *q = queue_create(be);
    if (!q)
        return -EAGAIN;
    be->stream.q = q;
    be->ops = &async_ops;
    /* The queued table wraps the fp32 kernels only: bf16 runs on the ordinary (synchronous) CPU backend. */
    be->ops_bf16 = NULL;
    snprintf(be->why_not_bf16, sizeof(be->why_not_bf16),
             "the CPU's asynchronous streams (RINGTRAIN_CPU_STREAMS=async, a test mode) run fp32 only");
    be->streams = &async_streams;
    return rt_input_pair_init(be);
}

void rt_cpu_async_stop(struct rt_backend *be)
{
    struct cpu_async *a = be->async;
    if (!a)
        return;
    rt_input_pair_fini(be);
    if (be->stream.q)
        queue_destroy(be->stream.q);
    be->stream.q = NULL;
    while (a->queues) /* streams a caller left behind */
        queue_destroy(a->queues);
    pthread_mutex_destroy(&a->mu);
    free(a);
    be->async = NULL;
}
