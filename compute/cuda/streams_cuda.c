/*
 * streams_cuda.c - the CUDA backend's struct rt_backend_streams: streams,
 * events, stream-ordered allocation and copies from page-locked host memory,
 * for compute.h's events and the input uploads (compute/input.c). Each is
 * the CUDA runtime call of the same meaning; errors abort through the check
 * macros, as every op does.
 */
#include <errno.h>
#include <stdlib.h>

#include "common/common.h"
#include "compute/cuda/cuda_be.h"

static struct rt_stream *stream_create(struct rt_backend *be)
{
    struct rt_stream *s = rt_calloc(1, sizeof(*s), "cuda stream");
    if (!s)
        return NULL;
    cudaStream_t h;
    RT_CUDA_CHECK(cudaStreamCreateWithFlags(&h, cudaStreamNonBlocking));
    s->be = be;
    s->handle = h;
    return s;
}

static void stream_destroy(struct rt_stream *s)
{
    RT_CUDA_CHECK(cudaStreamSynchronize(rt_cuda_stream(s)));
    RT_CUDA_CHECK(cudaStreamDestroy(rt_cuda_stream(s)));
    free(s);
}

static int event_init(struct rt_event *e)
{
    cudaEvent_t h;
    cudaError_t rc = cudaEventCreateWithFlags(&h, cudaEventDisableTiming);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return rt_errf(-EIO, "cudaEventCreate: %s", cudaGetErrorString(rc));
    }
    e->handle = h;
    return 0;
}

static void event_fini(struct rt_event *e)
{
    if (e->handle)
        cudaEventDestroy((cudaEvent_t)e->handle);
    e->handle = NULL;
}

static void event_record(struct rt_event *e, struct rt_stream *s)
{
    RT_CUDA_CHECK(cudaEventRecord((cudaEvent_t)e->handle, rt_cuda_stream(s)));
}

static void event_wait(struct rt_stream *s, struct rt_event *e)
{
    /* An event never recorded has completed: no wait. */
    RT_CUDA_CHECK(cudaStreamWaitEvent(rt_cuda_stream(s), (cudaEvent_t)e->handle, 0));
}

static void event_synchronize(struct rt_event *e)
{
    RT_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)e->handle));
}

static void *stream_alloc(struct rt_stream *s, size_t bytes)
{
    void *p = NULL;
    RT_CUDA_CHECK(cudaMallocAsync(&p, bytes ? bytes : 1, rt_cuda_stream(s)));
    return p;
}

static void stream_free(struct rt_stream *s, void *p)
{
    if (p)
        RT_CUDA_CHECK(cudaFreeAsync(p, rt_cuda_stream(s)));
}

static void copy_from_host(struct rt_stream *s, void *dst, const void *host, size_t bytes)
{
    /* From page-locked memory (the ring's cudaHostAlloc slots) a DMA that reads `host` as it runs. */
    if (bytes)
        RT_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, rt_cuda_stream(s)));
}

/* Timelines: cap timing events, an anchor (native[cap]) and a base (native[cap + 1]); times are the anchor's
 * host time plus cudaEventElapsedTime from it (0.5 us resolution; re-anchored at every start, so a step's float
 * milliseconds keep their precision). An exact start (the trace's) waits for the stream once, at the base, the
 * first time: later anchors get their host time from the base's, plus the time between the two on the device, read
 * with the marks -- so a traced step waits for nothing. */
static int marks_init(struct rt_timeline *t)
{
    t->native = rt_calloc((size_t)t->cap + 2, sizeof(void *), "timeline events");
    if (!t->native)
        return -ENOMEM;
    for (int i = 0; i <= t->cap + 1; i++) {
        cudaEvent_t h;
        cudaError_t rc = cudaEventCreate(&h);
        if (rc != cudaSuccess) {
            cudaGetLastError();
            return rt_errf(-EIO, "cudaEventCreate (timing): %s", cudaGetErrorString(rc));
        }
        t->native[i] = h;
    }
    return 0;
}

/* ---- graphs: CUDA stream capture of the default stream --------------------------------------------------- */

/* Relaxed: an allocation the captured ops make the first time (none after the warm-up) runs at once, uncaptured;
 * a wait for the stream, or a copy from pageable memory, still fails the capture. */
static int graph_capture_begin(struct rt_backend *be)
{
    /* The 16-bit weight copies are made again inside the capture, so that every replay makes them from the
     * weights the optimizer has written since (a replay does not tell dnn_fast.c's cache). */
    rt_cuda_freed(be->cuda, NULL);
    const cudaError_t rc = cudaStreamBeginCapture(rt_cuda_stream(&be->stream), cudaStreamCaptureModeRelaxed);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return rt_errf(-EIO, "cudaStreamBeginCapture: %s", cudaGetErrorString(rc));
    }
    return 0;
}

static int graph_capture_end(struct rt_backend *be, void **out)
{
    cudaGraph_t graph = NULL;
    cudaError_t rc = cudaStreamEndCapture(rt_cuda_stream(&be->stream), &graph);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        if (graph)
            cudaGraphDestroy(graph);
        return rt_errf(-EIO, "cannot capture the step: cudaStreamEndCapture: %s", cudaGetErrorString(rc));
    }
    cudaGraphExec_t exec = NULL;
    rc = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return rt_errf(-EIO, "cannot instantiate the captured step: cudaGraphInstantiate: %s", cudaGetErrorString(rc));
    }
    *out = exec;
    return 0;
}

static void graph_launch(struct rt_backend *be, void *g)
{
    RT_CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)g, rt_cuda_stream(&be->stream)));
}

static void graph_destroy(struct rt_backend *be, void *g)
{
    if (!g)
        return;
    /* Its queued replays first. */
    RT_CUDA_CHECK(cudaStreamSynchronize(rt_cuda_stream(&be->stream)));
    RT_CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)g));
}

static void stream_call(struct rt_stream *s, void (*fn)(void *arg), void *arg)
{
    RT_CUDA_CHECK(cudaLaunchHostFunc(rt_cuda_stream(s), fn, arg));
}

static void marks_fini(struct rt_timeline *t)
{
    for (int i = 0; t->native && i <= t->cap + 1; i++)
        if (t->native[i])
            cudaEventDestroy((cudaEvent_t)t->native[i]);
    free(t->native);
    t->native = NULL;
}

static void marks_start(struct rt_timeline *t, int exact)
{
    cudaEvent_t a = (cudaEvent_t)t->native[t->cap];
    RT_CUDA_CHECK(cudaEventRecord(a, rt_cuda_stream(t->s)));
    t->anchor_ns = rt_now_ns();
    t->exact = exact;
    if (exact && !t->base_ns) {
        cudaEvent_t b = (cudaEvent_t)t->native[t->cap + 1];
        RT_CUDA_CHECK(cudaEventRecord(b, rt_cuda_stream(t->s)));
        rt_backend_waited(t->s); /* once per timeline */
        RT_CUDA_CHECK(cudaEventSynchronize(b));
        t->base_ns = rt_now_ns();
    }
}

static void mark(struct rt_timeline *t, int i)
{
    RT_CUDA_CHECK(cudaEventRecord((cudaEvent_t)t->native[i], rt_cuda_stream(t->s)));
}

static void marks_read(struct rt_timeline *t)
{
    if (t->exact && t->base_ns && t->n) {
        float ms = 0.0f;
        RT_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)t->native[t->cap]));
        RT_CUDA_CHECK(cudaEventElapsedTime(&ms, (cudaEvent_t)t->native[t->cap + 1], (cudaEvent_t)t->native[t->cap]));
        t->anchor_ns = t->base_ns + (uint64_t)((double)ms * 1e6);
    }
    for (int i = 0; i < t->n; i++) {
        float ms = 0.0f;
        RT_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)t->native[i]));
        RT_CUDA_CHECK(cudaEventElapsedTime(&ms, (cudaEvent_t)t->native[t->cap], (cudaEvent_t)t->native[i]));
        t->m[i].ns = t->anchor_ns + (uint64_t)((double)ms * 1e6);
    }
}

const struct rt_backend_streams rt_cuda_streams = {
    .create = stream_create,
    .destroy = stream_destroy,
    .event_init = event_init,
    .event_fini = event_fini,
    .record = event_record,
    .wait = event_wait,
    .synchronize = event_synchronize,
    .alloc = stream_alloc,
    .free = stream_free,
    .copy_from_host = copy_from_host,
    .call = stream_call,
    .capture_begin = graph_capture_begin,
    .capture_end = graph_capture_end,
    .graph_launch = graph_launch,
    .graph_destroy = graph_destroy,
    .marks_init = marks_init,
    .marks_fini = marks_fini,
    .marks_start = marks_start,
    .mark = mark,
    .marks_read = marks_read,
};
