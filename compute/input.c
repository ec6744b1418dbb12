/*
 * input.c - the stream protocol that backends with streams share, written
 * once over struct rt_backend_streams (backend.h): compute.h's events, and
 * the input uploads' copy stream with its two device buffers.
 *
 * The uploads, in the order the ops run:
 *
 *   copy stream:    wait consumed[b] -> (re)allocate buf[b] -> copy host -> buf[b] -> record copied[b]
 *   compute stream: wait copied[b] -> input_u8_dev reads buf[b] -> record consumed[b]
 *   host:           synchronize copied[b] before the ring slot is reused
 *
 * with b = ticket % 2. The same code runs on the GPU (CUDA streams and
 * events) and on the CPU backend's asynchronous streams (worker threads and
 * fences), where a missing wait reads a stale buffer and trips
 * ThreadSanitizer; the ordinary CPU backend has no streams and hands the host
 * batch to compute as it is.
 */
#include <errno.h>
#include <stdlib.h>

#include "common/common.h"
#include "compute/backend.h"

/* ---- events ---------------------------------------------------------------------- */

int rt_event_create(struct rt_backend *be, struct rt_event **out)
{
    *out = NULL;
    struct rt_event *e = rt_calloc(1, sizeof(*e), "event");
    if (!e)
        return -ENOMEM;
    e->be = be;
    if (be->streams) {
        int rc = be->streams->event_init(e);
        if (rc < 0) {
            free(e);
            return rc;
        }
    }
    *out = e;
    return 0;
}

void rt_event_destroy(struct rt_event *e)
{
    if (!e)
        return;
    if (e->be->streams)
        e->be->streams->event_fini(e);
    free(e);
}

void rt_event_record(struct rt_event *e, struct rt_stream *s)
{
    e->on = s;
    e->point = rt_stream_point(s);
    if (e->be->streams)
        e->be->streams->record(e, s);
}

void rt_event_synchronize(struct rt_event *e)
{
    /* The newest point on its stream: nothing the host queued after it, so the stream runs dry. (The points
     * counter is read before the wait: one recorded during it means later work, which the wait left queued.) */
    struct rt_stream *on = e->on;
    if (on && e->point == __atomic_load_n(&on->points, __ATOMIC_ACQUIRE))
        rt_backend_waited(on);
    if (e->be->streams)
        e->be->streams->synchronize(e);
}

struct rt_graph {
    struct rt_backend *be;
    void *impl;
};

int rt_graph_capture_begin(struct rt_backend *be)
{
    if (!be->streams || !be->streams->capture_begin)
        return rt_errf(-ENOTSUP, "the CPU backend runs each op as it is issued: there is nothing to capture "
                                 "(RINGTRAIN_CPU_STREAMS=async records its queued calls)");
    return be->streams->capture_begin(be);
}

int rt_graph_capture_end(struct rt_backend *be, struct rt_graph **out)
{
    *out = NULL;
    void *impl = NULL;
    const int rc = be->streams->capture_end(be, &impl);
    if (rc < 0)
        return rc;
    struct rt_graph *g = rt_calloc(1, sizeof(*g), "graph");
    if (!g) {
        be->streams->graph_destroy(be, impl);
        return -ENOMEM;
    }
    *g = (struct rt_graph){be, impl};
    *out = g;
    return 0;
}

void rt_graph_launch(struct rt_graph *g)
{
    g->be->streams->graph_launch(g->be, g->impl);
}

void rt_graph_destroy(struct rt_graph *g)
{
    if (!g)
        return;
    g->be->streams->graph_destroy(g->be, g->impl);
    free(g);
}

void rt_stream_call(struct rt_stream *s, void (*fn)(void *arg), void *arg)
{
    if (s->be->streams)
        s->be->streams->call(s, fn, arg);
    else
        fn(arg);
}

void rt_stream_wait_event(struct rt_stream *s, struct rt_event *e)
{
    if (e->be->streams)
        e->be->streams->wait(s, e);
}

/* ---- the input uploads ----------------------------------------------------------- */

int rt_input_pair_init(struct rt_backend *be)
{
    struct rt_input_pair *in = &be->input;
    const struct rt_backend_streams *st = be->streams;
    for (int b = 0; b < 2; b++) {
        in->copied[b].be = in->consumed[b].be = be;
        int rc = st->event_init(&in->copied[b]);
        if (rc == 0)
            rc = st->event_init(&in->consumed[b]);
        if (rc < 0)
            return rc;
    }
    in->copy = st->create(be);
    return in->copy ? 0 : -EIO;
}

void rt_input_pair_fini(struct rt_backend *be)
{
    struct rt_input_pair *in = &be->input;
    const struct rt_backend_streams *st = be->streams;
    if (!st)
        return;
    for (int b = 0; b < 2; b++) {
        if (in->buf[b] && in->copy)
            st->free(in->copy, in->buf[b]);
        in->buf[b] = NULL;
    }
    if (in->copy)
        st->destroy(in->copy); /* drains it first */
    in->copy = NULL;
    for (int b = 0; b < 2; b++) {
        if (in->copied[b].be)
            st->event_fini(&in->copied[b]);
        if (in->consumed[b].be)
            st->event_fini(&in->consumed[b]);
    }
}

const uint8_t *rt_backend_input_upload(struct rt_backend *be, const uint8_t *host, size_t bytes, uint64_t *ticket)
{
    *ticket = ++be->input_tickets;
    const struct rt_backend_streams *st = be->streams;
    if (!st)
        return host;
    struct rt_input_pair *in = &be->input;
    const int b = (int)(*ticket & 1u);
    /* The buffer's previous batch must have been read by compute (never recorded: no wait). */
    st->wait(in->copy, &in->consumed[b]);
    if (bytes > in->bytes[b]) {
        /* Ordered on the copy stream, after the wait above. */
        if (in->buf[b])
            st->free(in->copy, in->buf[b]);
        in->buf[b] = st->alloc(in->copy, bytes);
        in->bytes[b] = bytes;
    }
    st->copy_from_host(in->copy, in->buf[b], host, bytes);
    st->record(&in->copied[b], in->copy);
    return in->buf[b];
}

void rt_backend_input_wait(struct rt_backend *be, uint64_t ticket)
{
    /* A later upload into the same buffer re-records the event: waiting for it covers this one too. */
    if (be->streams)
        be->streams->synchronize(&be->input.copied[ticket & 1u]);
}

void rt_backend_input_acquire(struct rt_backend *be, uint64_t ticket)
{
    if (be->streams)
        be->streams->wait(&be->stream, &be->input.copied[ticket & 1u]);
}

void rt_backend_input_release(struct rt_backend *be, uint64_t ticket)
{
    if (be->streams)
        be->streams->record(&be->input.consumed[ticket & 1u], &be->stream);
}
