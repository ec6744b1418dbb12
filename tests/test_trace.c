/*
 * test_trace.c - the trace recorder (common/trace.c): nothing is recorded
 * while it is off; spans, async spans, counters and instants come out as the
 * Chrome trace-event JSON they should (parsed back with jansson), on the
 * right tracks, on the clock they were shifted to; the memory cap drops and
 * counts; threads record side by side without losing events; one recorder
 * at a time, and a new one does not reuse an old one's tracks.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "check.h"
#include "common/common.h"
#include "common/trace.h"

/* Renders the recorder into a whole file in memory and parses it. */
static json_t *render_parse(struct rt_trace *t, int64_t shift, uint64_t base)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    struct rt_trace_stats st;
    rt_trace_get_stats(t, &st);
    CHECK(rt_trace_write_head(f) == 0);
    CHECK(rt_trace_render(t, f, 0, shift, base) == 0);
    CHECK(rt_trace_write_tail(f, 1, "all", &st) == 0);
    fclose(f);
    json_error_t err;
    json_t *root = json_loadb(buf, len, 0, &err);
    CHECKF(root != NULL, "the rendered trace is not JSON: %s (line %d)", err.text, err.line);
    free(buf);
    return root;
}

/* The first event whose name is `name` (and whose ph is `ph` unless 0). */
static json_t *find(json_t *root, const char *name, char ph)
{
    json_t *evs = json_object_get(root, "traceEvents"), *e;
    size_t i;
    json_array_foreach(evs, i, e)
    {
        const char *n = json_string_value(json_object_get(e, "name"));
        const char *p = json_string_value(json_object_get(e, "ph"));
        if (n && !strcmp(n, name) && (!ph || (p && p[0] == ph)))
            return e;
    }
    return NULL;
}

static size_t count_ph(json_t *root, char ph)
{
    json_t *evs = json_object_get(root, "traceEvents"), *e;
    size_t i, n = 0;
    json_array_foreach(evs, i, e)
    {
        const char *p = json_string_value(json_object_get(e, "ph"));
        n += p && p[0] == ph;
    }
    return n;
}

/* The track id whose thread_name is `name`, -1 if none. */
static int track_named(json_t *root, const char *name)
{
    json_t *evs = json_object_get(root, "traceEvents"), *e;
    size_t i;
    json_array_foreach(evs, i, e)
    {
        const char *n = json_string_value(json_object_get(e, "name"));
        if (n && !strcmp(n, "thread_name") &&
            !strcmp(json_string_value(json_object_get(json_object_get(e, "args"), "name")), name))
            return (int)json_integer_value(json_object_get(e, "tid"));
    }
    return -1;
}

static double num(json_t *e, const char *k)
{
    return json_number_value(json_object_get(e, k));
}

static void test_off_and_on(void)
{
    struct rt_trace *t;
    CHECK(rt_trace_begin() == 0); /* no recorder: nothing */
    rt_trace_span(RT_TRACE_STEP, "orphan", NULL, 1, 2);
    CHECK_OK(rt_trace_create(&(struct rt_trace_opts){.pid = 3, .process = "rank 3 (\"quoted\")"}, &t));
    struct rt_trace *t2;
    CHECK_ERR(rt_trace_create(&(struct rt_trace_opts){0}, &t2), "already installed");
    rt_trace_thread_name("main thread", 0);
    /* Not recording yet: nothing goes in. */
    CHECK(rt_trace_begin() == 0);
    rt_trace_span(RT_TRACE_STEP, "before", NULL, 10, 20);
    rt_trace_counter("before", 1, 0);
    struct rt_trace_stats st;
    rt_trace_get_stats(t, &st);
    CHECKF(st.events == 0, "%" PRIu64 " events recorded while off", st.events);

    rt_trace_set_recording(t, 1);
    const uint64_t base = rt_trace_created_ns(t);
    rt_trace_span(RT_TRACE_STEP, "outer", "7", base + 1000, base + 9000);
    rt_trace_span(RT_TRACE_COMPUTE, "inner", "layer1.0.conv1", base + 2000, base + 3500);
    const int dev = rt_trace_track("compute stream", 1);
    CHECK(dev > 0 && rt_trace_track("compute stream", 1) == dev);
    CHECK(rt_trace_track("another", 2) != dev);
    rt_trace_span_on(dev, RT_TRACE_COMPUTE, "fwd", "conv2", base + 2500, base + 4000);
    rt_trace_async(dev, RT_TRACE_COMM, "bucket", "0", 42, base + 3000, base + 8000);
    rt_trace_counter("images/s", 1234.5, base + 9000);
    rt_trace_instant(RT_TRACE_STEP, "tick", NULL, base + 5000);
    rt_trace_set_recording(t, 0);
    rt_trace_span(RT_TRACE_STEP, "after", NULL, base + 1, base + 2);
    rt_trace_mark(RT_TRACE_STEP, "run end", base + 10000); /* recorded even while off */
    rt_trace_get_stats(t, &st);
    CHECKF(st.events == 7, "%" PRIu64 " events, expected 7", st.events);
    CHECK(st.dropped == 0 && st.cap_bytes == (uint64_t)64 << 20 && st.bytes > 0);

    json_t *root = render_parse(t, 500000, base); /* this rank's clock runs 0.5 ms behind rank 0's */
    if (root) {
        CHECK(find(root, "before", 0) == NULL && find(root, "after", 0) == NULL);
        json_t *pn = find(root, "process_name", 'M');
        CHECK(pn && !strcmp(json_string_value(json_object_get(json_object_get(pn, "args"), "name")),
                            "rank 3 (\"quoted\")"));
        CHECK(pn && json_integer_value(json_object_get(pn, "pid")) == 3);
        const int main_tid = track_named(root, "main thread");
        CHECK(main_tid > 0 && track_named(root, "compute stream") == dev);
        json_t *o = find(root, "outer 7", 'X'), *in = find(root, "inner layer1.0.conv1", 'X');
        CHECK(o && in);
        if (o && in) {
            /* (ts + shift - base) in microseconds: 1000 ns + 0.5 ms. */
            CHECKF(num(o, "ts") == 501.0 && num(o, "dur") == 8.0, "outer at %g for %g us", num(o, "ts"),
                   num(o, "dur"));
            CHECK(num(in, "ts") == 502.0 && num(in, "dur") == 1.5);
            CHECK(json_integer_value(json_object_get(o, "tid")) == main_tid);
            CHECK(!strcmp(json_string_value(json_object_get(in, "cat")), "compute"));
        }
        json_t *f = find(root, "fwd conv2", 'X');
        CHECK(f && json_integer_value(json_object_get(f, "tid")) == dev);
        json_t *b = find(root, "bucket 0", 'b'), *e = find(root, "bucket 0", 'e');
        CHECK(b && e);
        if (b && e) {
            CHECK(num(b, "ts") == 503.0 && num(e, "ts") == 508.0);
            CHECK(!strcmp(json_string_value(json_object_get(b, "id")), json_string_value(json_object_get(e, "id"))));
        }
        json_t *c = find(root, "images/s", 'C');
        CHECK(c && num(json_object_get(c, "args"), "value") == 1234.5);
        CHECK(find(root, "tick", 'i') != NULL && find(root, "run end", 'i') != NULL);
        json_t *other = json_object_get(root, "otherData");
        CHECK(json_integer_value(json_object_get(other, "events")) == 7);
        json_decref(root);
    }
    rt_trace_destroy(t);
    CHECK(rt_trace_begin() == 0);
}

/* Threads recording side by side, each its own nested spans. */
struct worker {
    int id, n;
};

static void *record(void *arg)
{
    const struct worker *w = arg;
    char name[32];
    snprintf(name, sizeof(name), "worker %d", w->id);
    rt_trace_thread_name(name, 20 + w->id);
    for (int i = 0; i < w->n; i++) {
        const uint64_t t0 = rt_trace_begin();
        const uint64_t t1 = rt_trace_begin();
        rt_trace_end(t1, RT_TRACE_LOADER, "decode", NULL);
        rt_trace_end(t0, RT_TRACE_LOADER, "batch", NULL);
    }
    return NULL;
}

static void test_threads_and_cap(void)
{
    enum { NT = 4, PER = 20000 };
    struct rt_trace *t;
    CHECK_OK(rt_trace_create(&(struct rt_trace_opts){.pid = 0}, &t));
    rt_trace_set_recording(t, 1);
    pthread_t th[NT];
    struct worker w[NT];
    for (int i = 0; i < NT; i++) {
        w[i] = (struct worker){i, PER};
        pthread_create(&th[i], NULL, record, &w[i]);
    }
    for (int i = 0; i < NT; i++)
        pthread_join(th[i], NULL);
    struct rt_trace_stats st;
    rt_trace_get_stats(t, &st);
    CHECKF(st.events == (uint64_t)NT * PER * 2 && st.dropped == 0, "%" PRIu64 " events, %" PRIu64 " dropped",
           st.events, st.dropped);
    CHECK(st.tracks == NT);
    json_t *root = render_parse(t, 0, rt_trace_created_ns(t));
    if (root) {
        CHECK(count_ph(root, 'X') == (size_t)NT * PER * 2);
        for (int i = 0; i < NT; i++) {
            char name[32];
            snprintf(name, sizeof(name), "worker %d", i);
            CHECKF(track_named(root, name) > 0, "no track %s", name);
        }
        json_decref(root);
    }
    rt_trace_destroy(t);

    /* A cap of two chunks (4096 events each): the rest is dropped and counted, never written past. */
    CHECK_ERR(rt_trace_create(&(struct rt_trace_opts){.cap_bytes = 1000}, &t), "at least");
    CHECK_OK(rt_trace_create(&(struct rt_trace_opts){.cap_bytes = 600 << 10}, &t));
    rt_trace_set_recording(t, 1);
    /* The thread that recorded into the last recorder gets a new track in this one. */
    struct worker one = {9, 10000};
    pthread_t h;
    pthread_create(&h, NULL, record, &one);
    pthread_join(h, NULL);
    rt_trace_get_stats(t, &st);
    CHECKF(st.events == 2 * 4096 && st.dropped == 20000 - 2 * 4096, "%" PRIu64 " kept, %" PRIu64 " dropped",
           st.events, st.dropped);
    CHECK(st.bytes <= st.cap_bytes);
    rt_trace_destroy(t);
}

/* A thread that recorded into a destroyed recorder, recording into a new one: a fresh track, no stale pointer. */
static void test_generations(void)
{
    struct rt_trace *t;
    for (int round = 0; round < 3; round++) {
        CHECK_OK(rt_trace_create(&(struct rt_trace_opts){.pid = round}, &t));
        rt_trace_set_recording(t, 1);
        rt_trace_thread_name("main thread", 0);
        rt_trace_span(RT_TRACE_STEP, "s", NULL, 1, 2);
        struct rt_trace_stats st;
        rt_trace_get_stats(t, &st);
        CHECKF(st.events == 1 && st.tracks == 1, "round %d: %" PRIu64 " events, %d tracks", round, st.events,
               st.tracks);
        rt_trace_destroy(t);
    }
}

int main(void)
{
    test_off_and_on();
    test_threads_and_cap();
    test_generations();
    return check_result();
}
