/*
 * timeline.c - compute.h's timelines over the backend's streams: the
 * ordinary CPU backend stamps the host clock when a mark is made (its ops
 * are done by then); the asynchronous CPU streams and CUDA mark their queues
 * through struct rt_backend_streams.
 */
#include <errno.h>
#include <stdlib.h>

#include "common/common.h"
#include "compute/backend.h"

int rt_timeline_create(struct rt_backend *be, int capacity, struct rt_timeline **out)
{
    if (capacity <= 0)
        return rt_errf(-EINVAL, "a timeline of %d marks", capacity);
    struct rt_timeline *t = rt_calloc(1, sizeof(*t), "timeline");
    if (!t)
        return -ENOMEM;
    t->be = be;
    t->cap = capacity;
    t->s = rt_backend_stream(be);
    t->m = rt_calloc((size_t)capacity, sizeof(*t->m), "timeline marks");
    int rc = t->m ? 0 : -ENOMEM;
    if (!rc && be->streams && be->streams->marks_init)
        rc = be->streams->marks_init(t);
    if (rc < 0) {
        free(t->m);
        free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void rt_timeline_destroy(struct rt_timeline *t)
{
    if (!t)
        return;
    if (t->be->streams && t->be->streams->marks_fini)
        t->be->streams->marks_fini(t);
    free(t->m);
    free(t);
}

void rt_timeline_start(struct rt_timeline *t, struct rt_stream *s, int exact)
{
    t->s = s;
    t->n = 0;
    if (t->be->streams && t->be->streams->marks_start)
        t->be->streams->marks_start(t, exact);
}

int rt_timeline_mark(struct rt_timeline *t, const char *label, int kind)
{
    if (t->n == t->cap)
        return -1;
    const int i = t->n++;
    t->m[i] = (struct rt_timeline_mark){.label = label, .kind = kind};
    t->last_point = rt_stream_point(t->s);
    if (t->be->streams && t->be->streams->mark)
        t->be->streams->mark(t, i);
    else
        t->m[i].ns = rt_now_ns();
    return i;
}

int rt_timeline_read(struct rt_timeline *t, const struct rt_timeline_mark **marks)
{
    /* Like rt_event_synchronize on the last mark. */
    if (t->n && t->last_point == __atomic_load_n(&t->s->points, __ATOMIC_ACQUIRE))
        rt_backend_waited(t->s);
    if (t->be->streams && t->be->streams->marks_read)
        t->be->streams->marks_read(t);
    *marks = t->m;
    return t->n;
}
