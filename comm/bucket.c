/*
 * bucket.c - the gradient bucketer: plans contiguous buckets over the flat
 * gradient buffer, starts each bucket's all-reduce (an in-place sum) as soon
 * as backward reports its gradients final, and waits for them all before the
 * optimizer step. No packing: a bucket is a slice. Host buffers go to the
 * comm thread's job queue (MPI); device buffers, in NCCL mode, to a comm
 * stream (nccl.c). The plan, the readiness rule and the control word are the
 * same for both.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "common/trace.h"
#include "common/common.h"

struct bucket {
    size_t offset, count;       /* floats */
    int t0, t1;                 /* tensors [t0, t1) in offset order */
    struct rt_comm_job job;
    uint64_t t_ready;           /* NCCL mode, tracing: when it was queued */
};

struct rt_bucketer {
    struct rt_comm *c;
    float *grads;
    size_t total;
    struct rt_bucket_tensor *t; /* sorted by offset */
    int nt;
    struct bucket *b;
    int nb;
    int no_overlap;
    uint64_t step;
    size_t ready;
    int next;                   /* first bucket not launched */
    uint32_t flags;
    struct rt_comm_job flag_job;
    struct rt_nccl_stream *dev; /* NCCL mode; NULL for host buffers */
    void (*fence_mark)(void *ctx, int bucket); /* rt_bucket_opts */
    void *fence_ctx;
    /* Late mode (rt_bucket_opts.stream_call): jobs done (the comm thread counts them) and sent; the count the
     * update before's end reached; the waits queued on the compute stream, one per update in turn. */
    void (*stream_call)(void *ctx, void (*fn)(void *arg), void *arg);
    void *stream_ctx;
    uint64_t jobs_done, jobs_sent, target_prev;
    int started;                /* this update has waited for the one before's jobs */
    struct late_wait {
        struct rt_bucketer *b;
        uint64_t target;
    } waiter[2];
};

/* Before this update's first job: the update before's are done (a host wait with this update's work queued). */
static void late_start(struct rt_bucketer *b)
{
    if (b->started)
        return;
    rt_comm_count_wait(b->c, &b->jobs_done, b->target_prev);
    b->started = 1;
}

/* On the compute stream: the optimizer step queued after this reads the update's reduced gradients. */
static void late_wait_fn(void *arg)
{
    const struct late_wait *w = arg;
    rt_comm_count_wait(w->b->c, &w->b->jobs_done, w->target);
}

/*
 * Late mode's end of an update (rt_bucketer_finish): nothing waits for this update's reductions. In NCCL mode
 * the compute stream waits on the last bucket's event and the host watches the update before's all-reduces;
 * over MPI a host call queued on the compute stream waits for this update's jobs. The control word goes over MPI
 * either way, a step late: returns the update before's (0 after the first; `flags` itself in a group of one).
 */
static uint32_t late_finish(struct rt_bucketer *b, uint32_t flags)
{
    if (b->dev) {
        rt_nccl_stream_join(b->dev);
        rt_nccl_stream_watch(b->dev, 1);
    }
    if (!rt_comm_parallel(b->c))
        return flags;
    late_start(b); /* no bucket started this update (NCCL, or overlap off): the update before's word is ready */
    const uint32_t g = b->flags;
    b->flags = flags;
    rt_comm_job_submit(b->c, &b->flag_job);
    b->target_prev = ++b->jobs_sent;
    if (!b->dev) {
        struct late_wait *w = &b->waiter[b->step & 1u];
        *w = (struct late_wait){b, b->target_prev};
        b->stream_call(b->stream_ctx, late_wait_fn, w);
    }
    return g;
}

void rt_bucketer_settle(struct rt_bucketer *b)
{
    if (!b || !b->stream_call)
        return;
    if (b->dev) {
        rt_nccl_stream_watch(b->dev, 1);
        rt_nccl_stream_watch(b->dev, 0);
    }
    if (rt_comm_parallel(b->c))
        rt_comm_count_wait(b->c, &b->jobs_done, b->jobs_sent);
}

static int by_offset(const void *a, const void *b)
{
    const struct rt_bucket_tensor *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

int rt_bucketer_create(struct rt_comm *c, float *grads, size_t count, const struct rt_bucket_tensor *t, int nt,
                       const struct rt_bucket_opts *o, struct rt_bucketer **out)
{
    *out = NULL;
    if (nt <= 0 || count == 0)
        return rt_errf(-EINVAL, "bucketer: no gradients to reduce");
    size_t cap = o && o->cap_bytes ? o->cap_bytes : (size_t)25 << 20;
    size_t first = o && o->first_cap_bytes ? o->first_cap_bytes : (size_t)1 << 20;
    first = RT_MIN(first, cap);
    struct rt_bucketer *B = rt_calloc(1, sizeof(*B), "bucketer");
    if (!B)
        return -ENOMEM;
    B->c = c;
    B->grads = grads;
    B->total = count;
    B->no_overlap = o && o->no_overlap;
    B->fence_mark = o ? o->fence_mark : NULL;
    B->fence_ctx = o ? o->fence_ctx : NULL;
    B->stream_call = o ? o->stream_call : NULL;
    B->stream_ctx = o ? o->stream_ctx : NULL;
    B->t = rt_malloc((size_t)nt * sizeof(*B->t), "bucket plan");
    B->b = rt_calloc((size_t)nt, sizeof(*B->b), "bucket plan");
    if (!B->t || !B->b) {
        rt_bucketer_destroy(B);
        return -ENOMEM;
    }
    memcpy(B->t, t, (size_t)nt * sizeof(*t));
    B->nt = nt;
    qsort(B->t, (size_t)nt, sizeof(*B->t), by_offset);
    for (int i = 0; i < nt; i++) {
        size_t end = B->t[i].offset + B->t[i].count;
        if (end > count || (i > 0 && B->t[i].offset < B->t[i - 1].offset + B->t[i - 1].count)) {
            int rc = rt_errf(-EINVAL, "bucketer: tensor %s [%zu, %zu) overlaps another or leaves the buffer of %zu",
                             B->t[i].name, B->t[i].offset, end, count);
            rt_bucketer_destroy(B);
            return rc;
        }
    }
    /* The tail -- the tensors backward finishes last, whose all-reduce
     * nothing can hide -- is a bucket of at most first_cap of its own (at
     * least one tensor); the rest is cut greedily in buffer order, the first
     * bucket up to first_cap so communication starts early, the others up to
     * cap. */
    int tail = nt - 1;
    size_t all = 0;
    for (int i = 0; i < nt; i++)
        all += B->t[i].count;
    if (all <= first / sizeof(float))
        tail = nt; /* one bucket holds everything */
    else if (nt > 1) {
        size_t held = B->t[tail].count;
        while (tail > 1 && held + B->t[tail - 1].count <= first / sizeof(float))
            held += B->t[--tail].count;
    }
    int i = 0;
    while (i < nt) {
        struct bucket *k = &B->b[B->nb];
        size_t limit = (B->nb == 0 ? first : cap) / sizeof(float);
        int stop = i < tail ? tail : nt; /* the tail is never merged into the body */
        k->t0 = i;
        k->offset = B->nb == 0 ? 0 : B->b[B->nb - 1].offset + B->b[B->nb - 1].count;
        size_t held = 0;
        do {
            held += B->t[i].count;
            i++;
        } while (i < stop && held + B->t[i].count <= limit);
        k->t1 = i;
        size_t end = i < nt ? B->t[i].offset : count;
        k->count = end - k->offset;
        if (k->count > (size_t)1 << 30) {
            int rc = rt_errf(-EINVAL, "bucketer: tensor %s alone is over 4 GiB", B->t[k->t0].name);
            rt_bucketer_destroy(B);
            return rc;
        }
        B->nb++;
    }
    if (o && o->nccl) {
        int rc = rt_nccl_stream_create(o->nccl, o->stream, B->nb, &B->dev);
        if (rc < 0) {
            rt_bucketer_destroy(B);
            return rt_errf(rc, "bucketer: %s", rt_errmsg());
        }
    }
    for (int k = 0; k < B->nb; k++) {
        struct bucket *bk = &B->b[k];
        char names[120];
        rt_bucketer_bucket(B, k, NULL, NULL, names, sizeof(names));
        bk->job = (struct rt_comm_job){.kind = JOB_ALLREDUCE, .buf = grads + bk->offset, .count = (int)bk->count,
                                       .dt = MPI_FLOAT, .op = MPI_SUM, .bucket = k, .timeout_s = rt_comm_timeout(c),
                                       .fence = o ? o->fence_wait : NULL, .fence_ctx = o ? o->fence_ctx : NULL,
                                       .done_count = &B->jobs_done};
        snprintf(bk->job.what, sizeof(bk->job.what), "the all-reduce of gradient bucket %d of %d (%.2f MB: %s)", k + 1,
                 B->nb, (double)bk->count * 4e-6, names);
    }
    B->flag_job = (struct rt_comm_job){.kind = JOB_ALLREDUCE, .buf = &B->flags, .count = 1, .dt = MPI_UINT32_T,
                                       .op = MPI_BOR, .bucket = -1, .timeout_s = rt_comm_timeout(c),
                                       .done_count = &B->jobs_done};
    snprintf(B->flag_job.what, sizeof(B->flag_job.what), "the step's control word (stop, non-finite loss)");
    *out = B;
    return 0;
}

void rt_bucketer_destroy(struct rt_bucketer *b)
{
    if (!b)
        return;
    rt_bucketer_settle(b); /* the comm thread may still be reducing in b's memory */
    rt_nccl_stream_destroy(b->dev);
    free(b->t);
    free(b->b);
    free(b);
}

int rt_bucketer_count(const struct rt_bucketer *b)
{
    return b->nb;
}

void rt_bucketer_bucket(const struct rt_bucketer *b, int i, size_t *offset, size_t *count, char *names, size_t len)
{
    const struct bucket *k = &b->b[i];
    if (offset)
        *offset = k->offset;
    if (count)
        *count = k->count;
    if (names && len) {
        if (k->t1 - k->t0 == 1)
            snprintf(names, len, "%s", b->t[k->t0].name);
        else
            snprintf(names, len, "%d tensors, %s .. %s", k->t1 - k->t0, b->t[k->t0].name, b->t[k->t1 - 1].name);
    }
}

void rt_bucketer_begin(struct rt_bucketer *b, uint64_t step)
{
    b->step = step;
    b->ready = 0;
    b->next = 0;
    b->started = 0;
    if (b->dev)
        rt_nccl_stream_begin(b->dev, step);
}

/* Starts the all-reduces of buckets [b->next, upto). In NCCL mode they go
 * through NCCL even in a group of one (a copy in place, but the same path);
 * over MPI a group of one has nothing to do. */
static void launch(struct rt_bucketer *b, int upto)
{
    if (b->next >= upto)
        return;
    if (b->dev) {
        /* One event for the lot: the compute stream has queued the backward
         * work that wrote all of them. */
        rt_nccl_stream_follow(b->dev);
        for (; b->next < upto; b->next++) {
            struct bucket *bk = &b->b[b->next];
            bk->t_ready = rt_trace_live() ? rt_now_ns() : 0;
            rt_nccl_stream_allreduce(b->dev, b->next, b->grads + bk->offset, bk->count, bk->job.what);
            rt_comm_count_bucket(b->c);
        }
        return;
    }
    for (; b->next < upto; b->next++)
        if (rt_comm_parallel(b->c)) {
            if (b->stream_call)
                late_start(b);
            if (b->fence_mark)
                b->fence_mark(b->fence_ctx, b->next);
            rt_comm_job_submit(b->c, &b->b[b->next].job);
            b->jobs_sent++;
        }
}

void rt_bucketer_ready(void *bucketer, size_t ready)
{
    struct rt_bucketer *b = bucketer;
    if (ready > b->ready)
        b->ready = ready;
    if (b->no_overlap)
        return;
    /* A bucket ends where the next tensor starts, so the alignment gap after
     * its last tensor counts as ready with it. */
    int upto = b->next;
    while (upto < b->nb) {
        const struct bucket *bk = &b->b[upto];
        const struct rt_bucket_tensor *last = &b->t[bk->t1 - 1];
        if (last->offset + last->count > b->ready)
            break;
        upto++;
    }
    launch(b, upto);
}

/* NCCL mode on the trace: each bucket from queued to the host seeing every all-reduce done (the device's
 * own times are not read back). Only buckets queued while the trace recorded carry a time. The late mode
 * (stream_call, which train always sets) does not come here: its host never sees the buckets done, so the
 * track is commbench's and a non-late bucketer's. */
static void trace_nccl(const struct rt_bucketer *b)
{
    int track = -1;
    const uint64_t now = rt_now_ns();
    for (int k = 0; k < b->nb; k++) {
        if (!b->b[k].t_ready)
            continue;
        if (track < 0)
            track = rt_trace_track("NCCL buckets (host view)", 7);
        char label[24];
        snprintf(label, sizeof(label), "%d", k);
        rt_trace_async(track, RT_TRACE_COMM, "bucket queued->reduced", label, (b->step << 12) | (uint64_t)k,
                       b->b[k].t_ready, now);
    }
}

int rt_bucketer_finish(struct rt_bucketer *b, uint32_t flags, uint32_t *global_flags, uint64_t *wait_ns)
{
    uint64_t t0 = rt_now_ns();
    const struct rt_bucket_tensor *last = &b->t[b->nt - 1];
    int missing = b->ready < last->offset + last->count;
    if (b->no_overlap || !missing) {
        b->ready = RT_MAX(b->ready, b->total);
        launch(b, b->nb);
    }
    if (missing) {
        /* The plan check: name what never arrived. What was started is
         * finished first (its memory is the caller's); the caller then ends
         * the job, as the other ranks wait for the rest. */
        if (b->dev)
            rt_nccl_stream_wait(b->dev);
        for (int k = 0; k < b->next && rt_comm_parallel(b->c) && !b->dev; k++)
            rt_comm_job_wait(b->c, &b->b[k].job);
        char names[512];
        size_t o = 0;
        int n = 0;
        for (int i = 0; i < b->nt; i++) {
            if (b->t[i].offset + b->t[i].count <= b->ready)
                continue;
            if (n++ < 6 && o < sizeof(names))
                o += (size_t)snprintf(names + o, sizeof(names) - o, "%s%s", o ? ", " : "", b->t[i].name);
        }
        if (n > 6 && o < sizeof(names))
            snprintf(names + o, sizeof(names) - o, " and %d more", n - 6);
        return rt_errf(-EPROTO, "step %" PRIu64 ": backward never reported the gradients of %d tensors final (%s); "
                                "their buckets cannot be reduced",
                       b->step, n, names);
    }
    uint32_t g = flags;
    /* The control word goes over MPI in both modes: the comm thread runs it
     * while the gradients are reduced (NCCL has no bitwise OR, and a device
     * word would need a copy back to the host after the all-reduces anyway).
     * In NCCL mode its deadline and the NCCL watchdog's run side by side; the
     * first to expire ends the job, both name the step. */
    if (b->stream_call) {
        g = late_finish(b, flags);
    } else {
        if (rt_comm_parallel(b->c)) {
            b->flags = flags;
            rt_comm_job_submit(b->c, &b->flag_job);
        }
        if (b->dev) {
            rt_nccl_stream_wait(b->dev);
            trace_nccl(b);
        }
        if (rt_comm_parallel(b->c)) {
            for (int k = 0; k < b->nb && !b->dev; k++)
                rt_comm_job_wait(b->c, &b->b[k].job);
            rt_comm_job_wait(b->c, &b->flag_job);
            g = b->flags;
        }
    }
    if (global_flags)
        *global_flags = g;
    if (wait_ns)
        *wait_ns = rt_now_ns() - t0;
    return 0;
}
