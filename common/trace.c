/*
 * trace.c - the recorder behind trace.h: per-thread chunked buffers under
 * one cap, virtual tracks, and the Chrome trace-event JSON writer. It does
 * not gather ranks (the driver sends each rank's rendered text to rank 0)
 * and does not decide what is traced.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/trace.h"

#define CHUNK_EVENTS 4096
#define LABEL_LEN 24
#define NAME_LEN 48

/* One event, 64 bytes. Async spans and counters reuse the fields (see ph). */
struct trace_ev {
    uint64_t ts, dur;           /* ns, host clock */
    const char *name;           /* static */
    double value;               /* counter value; async span id */
    int32_t tid;
    uint8_t ph;                 /* 'X' span, 'C' counter, 'i' instant, 'b' async span (rendered b + e) */
    uint8_t cat;
    uint8_t pad[2];
    char label[LABEL_LEN];
};

struct trace_chunk {
    struct trace_chunk *next;
    int n;
    struct trace_ev ev[CHUNK_EVENTS];
};

/* A track: a thread's (with its chunks) or a virtual one (events live in the recording threads' chunks). */
struct trace_track {
    struct trace_track *next;
    int tid, sort, virt;
    char name[NAME_LEN];
    struct trace_chunk *head, *cur;
};

struct rt_trace {
    pthread_mutex_t mu;         /* tracks list, chunk budget */
    int pid;
    char process[128];
    uint64_t gen;               /* this recorder's generation (threads' cached tracks are per generation) */
    uint64_t created;
    size_t cap, used;
    uint64_t dropped;           /* atomic */
    struct trace_track *tracks;
    int ntracks;
};

int rt_trace_live_flag;
static struct rt_trace *installed;
static uint64_t generation;
static pthread_mutex_t install_mu = PTHREAD_MUTEX_INITIALIZER;

/* The calling thread's track in generation tl_gen, and the name it asked for. */
static __thread struct trace_track *tl_track;
static __thread uint64_t tl_gen;
static __thread char tl_name[NAME_LEN];
static __thread int tl_sort = 100;

static const char *const cat_names[RT_TRACE_NCAT] = {"step", "loader", "ring", "copy", "compute",
                                                     "comm", "optim", "eval", "checkpoint", "counter"};

int rt_trace_create(const struct rt_trace_opts *o, struct rt_trace **out)
{
    size_t cap = o->cap_bytes ? o->cap_bytes : (size_t)64 << 20;
    if (cap < sizeof(struct trace_chunk))
        return rt_errf(-EINVAL, "trace memory cap of %zu bytes: at least %zu", cap, sizeof(struct trace_chunk));
    struct rt_trace *t = rt_calloc(1, sizeof(*t), "trace recorder");
    if (!t)
        return -ENOMEM;
    pthread_mutex_init(&t->mu, NULL);
    t->pid = o->pid;
    snprintf(t->process, sizeof(t->process), "%s", o->process ? o->process : "ringtrain");
    t->cap = cap;
    t->created = rt_now_ns();
    pthread_mutex_lock(&install_mu);
    if (installed) {
        pthread_mutex_unlock(&install_mu);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return rt_errf(-EBUSY, "a trace recorder is already installed in this process");
    }
    t->gen = ++generation;
    __atomic_store_n(&installed, t, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&install_mu);
    *out = t;
    return 0;
}

void rt_trace_destroy(struct rt_trace *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&install_mu);
    __atomic_store_n(&rt_trace_live_flag, 0, __ATOMIC_RELAXED);
    if (installed == t)
        __atomic_store_n(&installed, NULL, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&install_mu);
    for (struct trace_track *k = t->tracks, *nk; k; k = nk) {
        nk = k->next;
        for (struct trace_chunk *c = k->head, *nc; c; c = nc) {
            nc = c->next;
            free(c);
        }
        free(k);
    }
    pthread_mutex_destroy(&t->mu);
    free(t);
}

void rt_trace_set_recording(struct rt_trace *t, int on)
{
    if (t && installed == t)
        __atomic_store_n(&rt_trace_live_flag, on ? 1 : 0, __ATOMIC_RELAXED);
}

void rt_trace_get_stats(struct rt_trace *t, struct rt_trace_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    for (const struct trace_track *k = t->tracks; k; k = k->next)
        for (const struct trace_chunk *c = k->head; c; c = c->next)
            out->events += (uint64_t)c->n;
    out->bytes = t->used;
    out->tracks = t->ntracks;
    pthread_mutex_unlock(&t->mu);
    out->dropped = __atomic_load_n(&t->dropped, __ATOMIC_RELAXED);
    out->cap_bytes = t->cap;
}

uint64_t rt_trace_created_ns(const struct rt_trace *t)
{
    return t->created;
}

/* A new track; the caller holds t->mu. */
static struct trace_track *track_new(struct rt_trace *t, const char *name, int sort, int virt)
{
    struct trace_track *k = calloc(1, sizeof(*k));
    if (!k)
        return NULL;
    k->tid = ++t->ntracks;
    k->sort = sort;
    k->virt = virt;
    snprintf(k->name, sizeof(k->name), "%s", name);
    k->next = t->tracks;
    t->tracks = k;
    return k;
}

/* The calling thread's track in the installed recorder, made on first use; NULL when there is none. */
static struct trace_track *my_track(struct rt_trace **tp)
{
    struct rt_trace *t = __atomic_load_n(&installed, __ATOMIC_ACQUIRE);
    *tp = t;
    if (!t)
        return NULL;
    if (tl_track && tl_gen == t->gen)
        return tl_track;
    char name[NAME_LEN];
    if (tl_name[0])
        snprintf(name, sizeof(name), "%s", tl_name);
    else
        snprintf(name, sizeof(name), "thread %d", (int)gettid());
    pthread_mutex_lock(&t->mu);
    struct trace_track *k = track_new(t, name, tl_sort, 0);
    pthread_mutex_unlock(&t->mu);
    tl_track = k;
    tl_gen = t->gen;
    return k;
}

void rt_trace_thread_name(const char *name, int sort)
{
    snprintf(tl_name, sizeof(tl_name), "%s", name);
    tl_sort = sort;
    struct rt_trace *t = __atomic_load_n(&installed, __ATOMIC_ACQUIRE);
    if (t && tl_track && tl_gen == t->gen) {
        pthread_mutex_lock(&t->mu);
        snprintf(tl_track->name, sizeof(tl_track->name), "%s", name);
        tl_track->sort = sort;
        pthread_mutex_unlock(&t->mu);
    }
}

int rt_trace_track(const char *name, int sort)
{
    struct rt_trace *t = __atomic_load_n(&installed, __ATOMIC_ACQUIRE);
    if (!t)
        return -1;
    pthread_mutex_lock(&t->mu);
    struct trace_track *k = t->tracks;
    while (k && !(k->virt && !strcmp(k->name, name)))
        k = k->next;
    if (!k)
        k = track_new(t, name, sort, 1);
    pthread_mutex_unlock(&t->mu);
    return k ? k->tid : -1;
}

/* A slot for one event in the calling thread's buffer, or NULL (not recording, or the cap is spent). */
static struct trace_ev *slot(int force)
{
    if (!force && !rt_trace_live())
        return NULL;
    struct rt_trace *t;
    struct trace_track *k = my_track(&t);
    if (!k)
        return NULL;
    if (!k->cur || k->cur->n == CHUNK_EVENTS) {
        struct trace_chunk *c = NULL;
        pthread_mutex_lock(&t->mu);
        if (t->used + sizeof(*c) <= t->cap && (c = malloc(sizeof(*c)))) {
            t->used += sizeof(*c);
            c->next = NULL;
            c->n = 0;
            if (k->cur)
                k->cur->next = c;
            else
                k->head = c;
            k->cur = c;
        }
        pthread_mutex_unlock(&t->mu);
        if (!c) {
            __atomic_add_fetch(&t->dropped, 1, __ATOMIC_RELAXED);
            return NULL;
        }
    }
    /* Only this thread appends to its chunks; the writer reads them once the threads are done. */
    struct trace_ev *e = &k->cur->ev[k->cur->n];
    memset(e, 0, sizeof(*e));
    e->tid = k->tid;
    __atomic_store_n(&k->cur->n, k->cur->n + 1, __ATOMIC_RELEASE);
    return e;
}

static void fill(struct trace_ev *e, int tid, uint8_t ph, enum rt_trace_cat cat, const char *name,
                 const char *label, uint64_t t0, uint64_t t1)
{
    if (tid > 0)
        e->tid = tid;
    e->ph = ph;
    e->cat = (uint8_t)cat;
    e->name = name;
    e->ts = t0;
    e->dur = t1 > t0 ? t1 - t0 : 0;
    if (label)
        snprintf(e->label, sizeof(e->label), "%s", label);
}

void rt_trace_span(enum rt_trace_cat cat, const char *name, const char *label, uint64_t t0, uint64_t t1)
{
    struct trace_ev *e = slot(0);
    if (e)
        fill(e, 0, 'X', cat, name, label, t0, t1);
}

void rt_trace_span_on(int track, enum rt_trace_cat cat, const char *name, const char *label, uint64_t t0,
                      uint64_t t1)
{
    struct trace_ev *e = track > 0 ? slot(0) : NULL;
    if (e)
        fill(e, track, 'X', cat, name, label, t0, t1);
}

void rt_trace_async(int track, enum rt_trace_cat cat, const char *name, const char *label, uint64_t id, uint64_t t0,
                    uint64_t t1)
{
    struct trace_ev *e = track > 0 ? slot(0) : NULL;
    if (e) {
        fill(e, track, 'b', cat, name, label, t0, t1);
        e->value = (double)id;
    }
}

void rt_trace_counter(const char *name, double value, uint64_t t)
{
    struct trace_ev *e = slot(0);
    if (e) {
        fill(e, 0, 'C', RT_TRACE_COUNTER, name, NULL, t ? t : rt_now_ns(), 0);
        e->value = value;
    }
}

void rt_trace_instant(enum rt_trace_cat cat, const char *name, const char *label, uint64_t t)
{
    struct trace_ev *e = slot(0);
    if (e)
        fill(e, 0, 'i', cat, name, label, t ? t : rt_now_ns(), 0);
}

void rt_trace_mark(enum rt_trace_cat cat, const char *name, uint64_t t)
{
    struct trace_ev *e = slot(1);
    if (e)
        fill(e, 0, 'i', cat, name, NULL, t ? t : rt_now_ns(), 0);
}

/* ---- writing ------------------------------------------------------------------ */

/* `s` as a JSON string's contents (our names are plain, but a host or label may hold anything). */
static void json_str(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
}

/* Microseconds with nanosecond digits, from a signed ns count. */
static void json_us(FILE *f, int64_t ns)
{
    if (ns < 0) {
        fputc('-', f);
        ns = -ns;
    }
    fprintf(f, "%" PRId64 ".%03d", ns / 1000, (int)(ns % 1000));
}

static void ev_name(FILE *f, const struct trace_ev *e)
{
    json_str(f, e->name);
    if (e->label[0]) {
        fputc(' ', f);
        json_str(f, e->label);
    }
}

static void render_event(FILE *f, int pid, const struct trace_ev *e, int64_t shift, uint64_t base)
{
    const int64_t ts = (int64_t)(e->ts - base) + shift;
    fprintf(f, "{\"pid\":%d,\"tid\":%d,\"cat\":\"%s\",\"name\":\"", pid, e->tid, cat_names[e->cat]);
    ev_name(f, e);
    fputs("\",\"ts\":", f);
    json_us(f, ts);
    switch (e->ph) {
    case 'X':
        fputs(",\"ph\":\"X\",\"dur\":", f);
        json_us(f, (int64_t)e->dur);
        fputc('}', f);
        break;
    case 'C':
        fprintf(f, ",\"ph\":\"C\",\"args\":{\"value\":%.6g}}", e->value);
        break;
    case 'i':
        fputs(",\"ph\":\"i\",\"s\":\"t\"}", f);
        break;
    case 'b':
        fprintf(f, ",\"ph\":\"b\",\"id\":\"%.0f\"},\n{\"pid\":%d,\"tid\":%d,\"cat\":\"%s\",\"name\":\"", e->value, pid,
                e->tid, cat_names[e->cat]);
        ev_name(f, e);
        fputs("\",\"ts\":", f);
        json_us(f, ts + (int64_t)e->dur);
        fprintf(f, ",\"ph\":\"e\",\"id\":\"%.0f\"}", e->value);
        break;
    }
}

int rt_trace_render(struct rt_trace *t, FILE *f, int lead_comma, int64_t shift_ns, uint64_t base_ns)
{
    const char *sep = lead_comma ? ",\n" : "";
    fprintf(f, "%s{\"pid\":%d,\"tid\":0,\"ph\":\"M\",\"name\":\"process_name\",\"args\":{\"name\":\"", sep, t->pid);
    json_str(f, t->process);
    fprintf(f, "\"}},\n{\"pid\":%d,\"tid\":0,\"ph\":\"M\",\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}}",
            t->pid, t->pid);
    pthread_mutex_lock(&t->mu);
    for (const struct trace_track *k = t->tracks; k; k = k->next) {
        fprintf(f, ",\n{\"pid\":%d,\"tid\":%d,\"ph\":\"M\",\"name\":\"thread_name\",\"args\":{\"name\":\"", t->pid,
                k->tid);
        json_str(f, k->name);
        fprintf(f, "\"}},\n{\"pid\":%d,\"tid\":%d,\"ph\":\"M\",\"name\":\"thread_sort_index\",\"args\":{"
                   "\"sort_index\":%d}}",
                t->pid, k->tid, k->sort);
    }
    for (const struct trace_track *k = t->tracks; k; k = k->next)
        for (const struct trace_chunk *c = k->head; c; c = c->next)
            for (int i = 0; i < c->n; i++) {
                fputs(",\n", f);
                render_event(f, t->pid, &c->ev[i], shift_ns, base_ns);
            }
    pthread_mutex_unlock(&t->mu);
    return ferror(f) ? rt_errf(-EIO, "writing the trace: %s", strerror(errno)) : 0;
}

int rt_trace_write_head(FILE *f)
{
    fputs("{\"traceEvents\":[\n", f);
    return ferror(f) ? rt_errf(-EIO, "writing the trace: %s", strerror(errno)) : 0;
}

int rt_trace_write_tail(FILE *f, int world, const char *window, const struct rt_trace_stats *sum)
{
    fprintf(f,
            "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"tool\":\"ringtrain\",\"world\":%d,\"step_window\":\"",
            world);
    json_str(f, window ? window : "");
    fprintf(f, "\",\"events\":%" PRIu64 ",\"dropped_events\":%" PRIu64 ",\"event_bytes\":%" PRIu64
               ",\"cap_bytes\":%" PRIu64 "}}\n",
            sum->events, sum->dropped, sum->bytes, sum->cap_bytes);
    return ferror(f) ? rt_errf(-EIO, "writing the trace: %s", strerror(errno)) : 0;
}
