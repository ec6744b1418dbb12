/*
 * loader.c - the training input pipeline: sampler -> block reads (io.c) ->
 * decode workers -> augment workers -> the batch ring (staging/).
 *
 * Threads:
 *   planner  walks the epochs: builds each epoch's plan, asks for the block
 *            reads it needs, and -- once the records of a batch are resident
 *            -- claims the batch's ring slot (the producer wait) and queues a
 *            batch job naming the B source records.
 *   io       io_uring (or the pread pool) reads blocks into its buffers and
 *            queues a decode job per completed block.
 *   workers  take decode jobs first (so reading never starves), then batch
 *            jobs: decode writes a block's records straight into resident
 *            memory; a batch job augments each record straight into the slot.
 *
 * Resident memory is either the whole decoded split (EXACT and NONE: read
 * once, in the first epoch) or a few windows of blocks (WINDOW). Variable-
 * size JPEG records (pack --max-side) stay JPEG in resident memory -- a
 * block's payload as stored -- and a batch job decodes each sample's crop
 * (rrc.h: RandomResizedCrop, or the evaluation centre) at a reduced scale
 * where the crop allows (jpegcrop.h) and resizes it into the slot
 * (resize.h); then "decode" and "augment" in the stats are that decoding
 * and that resizing. Batch
 * contents depend only on the plan and on (seed, epoch, id), never on which
 * worker ran what when, so the output is bit-identical for any worker count,
 * queue depth, I/O engine or completion order.
 *
 * Errors (a read that fails, a block that does not decode) close the ring
 * with the message; the consumer's next rt_loader_next() returns -errno with
 * it, and no partly filled batch is ever marked READY.
 *
 * Trace (common/trace.h), one track per thread, spans nested as listed (a
 * loader of another split than train adds " (val)" or " (test)" to its
 * tracks' names and to its ring's occupancy counter):
 *   "loader planner"   "plan epoch" (the sampler's order); "load resident"
 *                      > "wait for blocks"; "plan batch" per step > "start
 *                      window", "wait for window buffer", "wait for blocks",
 *                      "ring wait (slot)" (the ring's).
 *   "loader io"...     see io.c.
 *   "loader worker N"  "decode block" per block > "checksum", "decompress",
 *                      "decode" (decode.c); "batch" per step > "augment".
 * Spans whose stage already takes clock readings for rt_loader_stats reuse
 * them; the others read the clock only while recording.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "common/common.h"
#include "common/trace.h"
#include "loader/format.h"
#include "loader/io.h"
#include "loader/jpegcrop.h"
#include "loader/loader.h"
#include "loader/resize.h"
#include "loader/rrc.h"
#include "staging/ring.h"

#define NWIN 4            /* window buffers in WINDOW mode: two in use, two loading */

/* Trace track order (the loader's threads sort in 10..99; io.c takes 11 and 60..99). */
#define TRACE_SORT_PLANNER 10
#define TRACE_SORT_WORKER 20
#define TRACE_SORT_WORKER_LAST 59

/* Per split: the suffix of the track names and the ring's occupancy counter (static strings). */
static const char *const trace_tag[RT_SPLIT_COUNT] = {"", " (val)", " (test)"};
static const char *const trace_counter[RT_SPLIT_COUNT] = {"ring occupancy", "ring occupancy (val)",
                                                          "ring occupancy (test)"};

enum win_state { WIN_FREE = 0, WIN_LOADING, WIN_READY };

struct blockref {
    uint32_t shard;       /* index into L->shards */
    uint32_t index;       /* block within the shard */
    uint64_t first;       /* split-local index of its first record */
    uint32_t records;
    size_t bytes;         /* in resident memory: decoded records, or the JPEG payload (variable sizes) */
};

/* Decoded records resident in memory: the whole split, or one window. */
struct window {
    uint8_t *mem;
    size_t cap;
    enum win_state state;
    uint32_t pending;     /* blocks still to decode */
    uint64_t refs;        /* queued batch jobs reading it */
    int retired;          /* the planner will queue no more jobs reading it */
    uint32_t nblocks, nblocks_cap;
    uint32_t *blocks;     /* split-wide block numbers, in load order */
    size_t *offset;       /* byte offset of each block's records in mem */
    uint32_t *pos_of;     /* WINDOW: split-wide block number -> position in blocks[] */
};

struct batch_job {
    struct rt_batch *b;
    uint64_t epoch, step;
    uint64_t *ids;        /* [batch] */
    const uint8_t **src;  /* [batch]; NULL for padding */
    struct rt_jpeg_record *rec; /* [batch], variable-size records: the JPEG and its size */
    int win[2];           /* windows read (-1 = none) */
};

struct decode_job {
    struct rt_io_req req;
};

struct worker {
    struct rt_loader *L;
    pthread_t thread;
    struct rt_decoder *dec;
    struct rt_jpegcrop *crop;    /* variable-size records */
    struct rt_resizer *rs;
    /* Written by the worker with atomic stores, read by rt_loader_stats(). */
    uint64_t checksum_ns, decompress_ns, decode_ns, raw_bytes, records;
    uint64_t crop_decode_ns, crops; /* variable-size records: decoding the crops, and how many */
    uint64_t augment_ns, idle_ns;
};

struct rt_loader {
    struct rt_loader_opts o;
    struct rt_ring *ring;
    struct rt_sampler *sampler;
    struct rt_io *io;
    uint64_t steps;
    uint64_t first_base, first_end;   /* start_epoch's step numbers: from first_base (start_step), below first_end */
    size_t rec;                       /* bytes per record in a slot */
    uint32_t c, h, w;                 /* slot image shape */
    int variable;                     /* variable-size JPEG records, cropped per sample */
    struct rt_rrc_opts rrc;
    double center_ratio;

    uint32_t nshards;
    struct rt_shard **shards;
    char **shard_paths;
    uint32_t nblocks;
    struct blockref *blocks;
    int32_t *labels;                  /* [records] */
    uint64_t records;

    /* Resident memory. */
    int streaming;                    /* WINDOW */
    struct window cache;              /* EXACT / NONE */
    struct window win[NWIN];

    /* Everything below is guarded by mu. */
    pthread_mutex_t mu;
    pthread_cond_t work;              /* workers: a job arrived, or stop */
    pthread_cond_t planner_cv;        /* planner: a window got ready/free, a job finished */
    struct decode_job *dq;            /* circular, capacity nbufs */
    uint32_t dq_cap, dq_head, dq_len;
    struct batch_job *bq;             /* circular, capacity ring slots */
    uint32_t bq_cap, bq_head, bq_len;
    struct batch_job *jobs;           /* storage for batch jobs, one per ring slot */
    uint64_t jobs_queued, jobs_done;
    int stop, failed;

    pthread_t planner;
    int planner_started;
    struct worker *workers;
    int nworkers;

    uint64_t load_ns;
    /* Consumer side (one thread). */
    uint64_t next_epoch, next_step;
    uint64_t batches, images;
};

/* ---- tracing ------------------------------------------------------------------ */

/* Span [t0, t1) labelled "epoch E step S" on this thread's track; call only while recording. */
static void trace_step_span(const char *name, uint64_t epoch, uint64_t step, uint64_t t0, uint64_t t1)
{
    char label[64]; /* the recorder keeps 23 characters */
    snprintf(label, sizeof(label), "epoch %" PRIu64 " step %" PRIu64, epoch, step);
    rt_trace_span(RT_TRACE_LOADER, name, label, t0, t1);
}

/* ---- failure ------------------------------------------------------------------ */

/* Records the first error (message in this thread's rt_errmsg) and closes the ring. */
static void loader_fail(struct rt_loader *L, int rc)
{
    pthread_mutex_lock(&L->mu);
    int first = !L->failed;
    L->failed = 1;
    pthread_cond_broadcast(&L->work);
    pthread_cond_broadcast(&L->planner_cv);
    pthread_mutex_unlock(&L->mu);
    if (first)
        rt_ring_close(L->ring, rc ? rc : -EIO);
}

/* ---- I/O completion -> decode jobs ------------------------------------------------- */

static void io_done(void *ctx, struct rt_io_req *req, int err)
{
    struct rt_loader *L = ctx;

    if (err) {
        loader_fail(L, err);
        return;
    }
    pthread_mutex_lock(&L->mu);
    /* Capacity equals the read buffers, and each job holds one. */
    L->dq[(L->dq_head + L->dq_len) % L->dq_cap].req = *req;
    L->dq_len++;
    pthread_cond_signal(&L->work);
    pthread_mutex_unlock(&L->mu);
}

/* Cookie of a block read: window slot (NWIN = the whole-split cache) and position in it. */
static uint64_t cookie_make(uint32_t slot, uint32_t pos) { return (uint64_t)slot << 32 | pos; }

static struct window *cookie_window(struct rt_loader *L, uint64_t cookie)
{
    uint32_t slot = (uint32_t)(cookie >> 32);
    return slot == NWIN ? &L->cache : &L->win[slot];
}

/* Decodes one block into its window; t_start is when the job was taken (the trace span's start). */
static void run_decode(struct worker *wk, struct decode_job *j, uint64_t t_start)
{
    struct rt_loader *L = wk->L;
    struct window *win = cookie_window(L, j->req.cookie);
    const uint32_t pos = (uint32_t)j->req.cookie;
    const struct blockref *br = &L->blocks[win->blocks[pos]];
    const struct rt_shard *sh = L->shards[br->shard];
    struct rt_decode_times t;

    int rc = (L->variable ? rt_block_payload : rt_block_decode)(wk->dec, rt_shard_header(sh),
                                                                &rt_shard_blocks(sh)[br->index], br->index,
                                                                j->req.data, win->mem + win->offset[pos],
                                                                L->shard_paths[br->shard]);
    rt_io_put_buffer(L->io, j->req.buf);
    rt_decoder_times(wk->dec, &t);
    __atomic_store_n(&wk->checksum_ns, t.checksum_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&wk->decompress_ns, t.decompress_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&wk->decode_ns, t.decode_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&wk->raw_bytes, t.raw_bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&wk->records, t.records, __ATOMIC_RELAXED);
    if (rc < 0) {
        loader_fail(L, rc);
        return;
    }
    pthread_mutex_lock(&L->mu);
    if (--win->pending == 0) {
        win->state = WIN_READY;
        pthread_cond_broadcast(&L->planner_cv);
    }
    pthread_mutex_unlock(&L->mu);
    if (rt_trace_live()) {
        char label[64];
        snprintf(label, sizeof(label), "shard %" PRIu32 " block %" PRIu32, br->shard, br->index);
        rt_trace_span(RT_TRACE_LOADER, "decode block", label, t_start, rt_now_ns());
    }
}

/* ---- batch jobs ------------------------------------------------------------------- */

/*
 * Variable-size record i of the job into `dst` (CHW, S x S): the crop box
 * (by seed, epoch and id alone), the JPEG decoded over that box at the
 * smallest scale that keeps it at least S wide and high, then resized.
 * Adds the decoding time to *dec_ns.
 */
static int crop_record(struct rt_loader *L, struct worker *wk, const struct batch_job *j, uint32_t i, uint8_t *dst,
                       uint64_t *dec_ns)
{
    const struct rt_jpeg_record *r = &j->rec[i];
    struct rt_jpeg_region reg;
    struct rt_box box;
    int flip = 0, fallback;
    char where[160];

    /* The flip is the stream's first draw: the same for both crops. */
    if (L->o.crop == RT_CROP_RANDOM || L->o.aug.flip == RT_FLIP_RANDOM)
        rt_rrc_box(&L->rrc, L->o.seed, j->epoch, j->ids[i], r->width, r->height, &box, &flip, &fallback);
    flip = L->o.aug.flip == RT_FLIP_RANDOM ? flip : 0;
    if (L->o.crop == RT_CROP_CENTER)
        rt_center_box(r->width, r->height, L->w, L->h, L->center_ratio, &box);
    snprintf(where, sizeof(where), "%s record %" PRIu64, rt_split_name(L->o.split), j->ids[i]);
    const uint64_t t0 = rt_now_ns();
    int rc = rt_jpegcrop_decode(wk->crop, r->data, r->len, where, L->c, &box, L->w, L->h, &reg);
    *dec_ns += rt_now_ns() - t0;
    if (rc < 0)
        return rc;
    rc = rt_resize_crop_chw(wk->rs, reg.px, reg.w, reg.h, L->c, reg.stride, &reg.box, dst, L->w, L->h, flip);
    if (rc == 0)
        rt_augment_pixels(&L->o.aug, L->o.seed, j->epoch, j->ids[i], L->c, L->h, L->w, dst);
    return rc;
}

/* Augments one batch into its slot and publishes it; t_start is when the job was taken. */
static void run_batch(struct worker *wk, struct batch_job *j, uint64_t t_start)
{
    struct rt_loader *L = wk->L;
    struct rt_batch *b = j->b;
    const uint32_t B = L->o.batch;
    const uint64_t t0 = rt_now_ns();
    uint32_t valid = 0;

    uint64_t crop_ns = 0;
    for (uint32_t i = 0; i < B; i++) {
        uint8_t *dst = b->images + L->rec * i;
        if (!j->src[i]) {
            memset(dst, 0, L->rec);
            b->labels[i] = 0;
            b->ids[i] = RT_PAD_ID;
            continue;
        }
        if (L->variable) {
            int rc = crop_record(L, wk, j, i, dst, &crop_ns);
            if (rc < 0) {
                /* The slot stays FILLING: a closed ring never hands it out. */
                loader_fail(L, rc);
                return;
            }
        } else {
            rt_augment(&L->o.aug, L->o.seed, j->epoch, j->ids[i], L->c, L->h, L->w, j->src[i], dst);
        }
        b->labels[i] = L->labels[j->ids[i]];
        b->ids[i] = j->ids[i];
        valid++;
    }
    b->valid = valid;
    b->epoch = j->epoch;
    b->step = j->step;
    const uint64_t t1 = rt_now_ns();
    __atomic_fetch_add(&wk->augment_ns, t1 - t0 - crop_ns, __ATOMIC_RELAXED);
    if (L->variable) {
        __atomic_fetch_add(&wk->crop_decode_ns, crop_ns, __ATOMIC_RELAXED);
        __atomic_fetch_add(&wk->crops, valid, __ATOMIC_RELAXED);
    }
    if (L->o.on_batch)
        L->o.on_batch(L->o.on_batch_ctx, b);
    /* From here on the slot is the consumer's: only the job (a copy) is read. */
    rt_ring_fill_end(L->ring, b);

    pthread_mutex_lock(&L->mu);
    for (int k = 0; k < 2; k++) {
        if (j->win[k] < 0)
            continue;
        struct window *win = &L->win[j->win[k]];
        if (--win->refs == 0 && win->retired) {
            win->state = WIN_FREE;
            pthread_cond_broadcast(&L->planner_cv);
        }
    }
    L->jobs_done++;
    pthread_cond_broadcast(&L->planner_cv);
    pthread_mutex_unlock(&L->mu);
    if (rt_trace_live()) {
        rt_trace_span(RT_TRACE_LOADER, "augment", NULL, t0, t1);
        trace_step_span("batch", j->epoch, j->step, t_start, rt_now_ns());
    }
}

static void *worker_main(void *arg)
{
    struct worker *wk = arg;
    struct rt_loader *L = wk->L;
    const int idx = (int)(wk - L->workers);
    char name[32];

    snprintf(name, sizeof(name), "loader worker %d%s", idx, trace_tag[L->o.split]);
    rt_trace_thread_name(name, idx < TRACE_SORT_WORKER_LAST - TRACE_SORT_WORKER ? TRACE_SORT_WORKER + idx
                                                                                : TRACE_SORT_WORKER_LAST);
    for (;;) {
        struct decode_job dj;
        struct batch_job bj;
        int kind = 0;
        uint64_t t0 = rt_now_ns();

        pthread_mutex_lock(&L->mu);
        while (!L->stop && !L->failed && !L->dq_len && !L->bq_len)
            pthread_cond_wait(&L->work, &L->mu);
        if (L->stop || L->failed) {
            pthread_mutex_unlock(&L->mu);
            break;
        }
        if (L->dq_len) {
            dj = L->dq[L->dq_head];
            L->dq_head = (L->dq_head + 1) % L->dq_cap;
            L->dq_len--;
            kind = 1;
        } else {
            bj = L->bq[L->bq_head];
            L->bq_head = (L->bq_head + 1) % L->bq_cap;
            L->bq_len--;
            kind = 2;
        }
        pthread_mutex_unlock(&L->mu);
        const uint64_t t1 = rt_now_ns();
        __atomic_fetch_add(&wk->idle_ns, t1 - t0, __ATOMIC_RELAXED);
        if (kind == 1)
            run_decode(wk, &dj, t1);
        else
            run_batch(wk, &bj, t1);
    }
    return NULL;
}

/* ---- planner ---------------------------------------------------------------------- */

/* Asks for every block of `win` to be read and decoded into it (mu not held). */
static int window_load(struct rt_loader *L, uint32_t slot, struct window *win)
{
    for (uint32_t i = 0; i < win->nblocks; i++) {
        const struct blockref *br = &L->blocks[win->blocks[i]];
        const struct rt_block_entry *e = &rt_shard_blocks(L->shards[br->shard])[br->index];
        struct rt_io_req req = {.file = br->shard, .offset = e->offset, .len = e->stored_size,
                                .cookie = cookie_make(slot, i)};
        int rc = rt_io_submit(L->io, &req);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Waits until `win` is READY (or the loader stops). Returns 0, or -1 to stop. */
static int window_wait(struct rt_loader *L, struct window *win)
{
    const uint64_t t0 = rt_trace_begin();
    int waited = 0;

    pthread_mutex_lock(&L->mu);
    while (!L->stop && !L->failed && win->state != WIN_READY) {
        pthread_cond_wait(&L->planner_cv, &L->mu);
        waited = 1;
    }
    int stop = L->stop || L->failed;
    pthread_mutex_unlock(&L->mu);
    if (waited)
        rt_trace_end(t0, RT_TRACE_LOADER, "wait for blocks", NULL);
    return stop ? -1 : 0;
}

/* Reads the whole split into the cache, once (EXACT and NONE). */
static int load_resident(struct rt_loader *L)
{
    uint64_t t0 = rt_now_ns();
    struct window *c = &L->cache;

    c->nblocks = L->nblocks;
    c->pending = L->nblocks;
    c->state = WIN_LOADING;
    size_t at = 0;
    for (uint32_t i = 0; i < L->nblocks; i++) {
        c->blocks[i] = i;
        c->offset[i] = at;
        at += L->blocks[i].bytes;
    }
    int rc = window_load(L, NWIN, c);
    if (rc < 0)
        return rc;
    if (window_wait(L, c) < 0)
        return -1;
    const uint64_t t1 = rt_now_ns();
    /* rt_loader_stats reads it under the lock, perhaps while the load is still going. */
    pthread_mutex_lock(&L->mu);
    L->load_ns = t1 - t0;
    pthread_mutex_unlock(&L->mu);
    if (rt_trace_live()) {
        char label[64];
        snprintf(label, sizeof(label), "%" PRIu32 " blocks", L->nblocks);
        rt_trace_span(RT_TRACE_LOADER, "load resident", label, t0, t1);
    }
    return 0;
}

/* Queues one batch job (its slot already claimed); wakes a worker. */
static void queue_batch(struct rt_loader *L, const struct batch_job *j)
{
    pthread_mutex_lock(&L->mu);
    L->bq[(L->bq_head + L->bq_len) % L->bq_cap] = *j;
    L->bq_len++;
    L->jobs_queued++;
    for (int k = 0; k < 2; k++)
        if (j->win[k] >= 0)
            L->win[j->win[k]].refs++;
    pthread_cond_signal(&L->work);
    pthread_mutex_unlock(&L->mu);
}

/* Claims the ring slot of batch `seq` and fills the job's fixed fields; NULL to stop. */
static struct batch_job *claim(struct rt_loader *L, uint64_t seq, uint64_t epoch, uint64_t step)
{
    struct rt_batch *b = rt_ring_fill_begin(L->ring, seq);
    if (!b)
        return NULL;
    struct batch_job *j = &L->jobs[b->slot];
    j->b = b;
    j->epoch = epoch;
    j->step = step;
    j->win[0] = j->win[1] = -1;
    return j;
}

static uint32_t block_of(const struct rt_loader *L, uint64_t id);

/*
 * Points position i of job j at record `id` of block `b`, whose resident
 * bytes start at `base`: the decoded record, or (variable sizes) the JPEG
 * record found through the block's table.
 */
static void job_source(const struct rt_loader *L, struct batch_job *j, uint32_t i, uint32_t b, const uint8_t *base,
                       uint64_t id)
{
    const struct blockref *br = &L->blocks[b];
    if (!L->variable) {
        j->src[i] = base + (id - br->first) * L->rec;
        return;
    }
    const struct rt_shard *sh = L->shards[br->shard];
    rt_jpeg_block_record(rt_shard_header(sh), &rt_shard_blocks(sh)[br->index], base, (uint32_t)(id - br->first),
                         &j->rec[i]);
    j->src[i] = j->rec[i].data;
}

static int run_resident_epoch(struct rt_loader *L, const struct rt_epoch_plan *p, uint64_t step0, uint64_t *seq)
{
    const uint32_t B = L->o.batch;

    for (uint64_t s = step0; s < p->steps; s++) {
        const uint64_t t0 = rt_trace_begin();
        struct batch_job *j = claim(L, (*seq)++, p->epoch, s);
        if (!j)
            return -1;
        for (uint32_t i = 0; i < B; i++) {
            uint64_t id = p->order[s * B + i];
            j->ids[i] = id;
            j->src[i] = NULL;
            if (id != RT_PAD_ID && !L->variable) {
                j->src[i] = L->cache.mem + id * L->rec;
            } else if (id != RT_PAD_ID) {
                const uint32_t b = block_of(L, id);
                job_source(L, j, i, b, L->cache.mem + L->cache.offset[b], id);
            }
        }
        queue_batch(L, j);
        if (t0)
            trace_step_span("plan batch", p->epoch, s, t0, rt_now_ns());
    }
    return 0;
}

/* Window of plan position k (k < win_pos[nwindows]). */
static uint32_t window_of(const struct rt_epoch_plan *p, uint64_t k, uint32_t hint)
{
    uint32_t w = hint;
    while (w + 1 < p->nwindows && p->win_pos[w + 1] <= k)
        w++;
    return w;
}

/* Split-wide block holding split-local record `id` (blocks are in record order). */
static uint32_t block_of(const struct rt_loader *L, uint64_t id)
{
    uint32_t lo = 0, hi = L->nblocks;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (L->blocks[mid].first <= id)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Points position i of job j at record `id` in a loaded window; -1 if the window does not hold it. */
static int window_record(const struct rt_loader *L, const struct window *win, uint64_t id, struct batch_job *j,
                         uint32_t i)
{
    const uint32_t b = block_of(L, id), pos = win->pos_of[b];
    if (pos >= win->nblocks || win->blocks[pos] != b)
        return -1;
    job_source(L, j, i, b, win->mem + win->offset[pos], id);
    return 0;
}

/* Takes a FREE window buffer and starts loading window w of plan p into it; -1 if none is free. */
static int window_start(struct rt_loader *L, const struct rt_epoch_plan *p, uint32_t w, int *slot_out)
{
    int slot = -1;
    pthread_mutex_lock(&L->mu);
    for (int i = 0; i < NWIN; i++)
        if (L->win[i].state == WIN_FREE) {
            slot = i;
            break;
        }
    pthread_mutex_unlock(&L->mu);
    if (slot < 0)
        return -1;
    const uint64_t t0 = rt_trace_begin();
    /* Only the planner touches a FREE window's fields. */
    struct window *win = &L->win[slot];
    const uint32_t b0 = p->win_block[w], n = p->win_block[w + 1] - b0;
    size_t bytes = 0;
    for (uint32_t i = 0; i < n; i++)
        bytes += L->blocks[p->blocks[b0 + i]].bytes;
    if (bytes > win->cap) {
        free(win->mem);
        win->cap = 0;
        win->mem = rt_malloc(bytes, "window buffer");
        if (!win->mem)
            return -ENOMEM;
        win->cap = bytes;
    }
    if (n > win->nblocks_cap) {
        free(win->blocks);
        free(win->offset);
        win->nblocks_cap = 0;
        win->blocks = rt_malloc(sizeof(uint32_t) * n, "window blocks");
        win->offset = rt_malloc(sizeof(size_t) * n, "window offsets");
        if (!win->blocks || !win->offset)
            return -ENOMEM;
        win->nblocks_cap = n;
    }
    bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t b = p->blocks[b0 + i];
        win->blocks[i] = b;
        win->offset[i] = bytes;
        win->pos_of[b] = i;
        bytes += L->blocks[b].bytes;
    }
    win->nblocks = n;
    win->refs = 0;
    win->retired = 0;
    pthread_mutex_lock(&L->mu);
    win->pending = n;
    win->state = n ? WIN_LOADING : WIN_READY;
    pthread_mutex_unlock(&L->mu);
    *slot_out = slot;
    int rc = window_load(L, (uint32_t)slot, win);
    if (t0) {
        char label[64];
        snprintf(label, sizeof(label), "%" PRIu32 " (%" PRIu32 " blocks)", w, n);
        rt_trace_span(RT_TRACE_LOADER, "start window", label, t0, rt_now_ns());
    }
    return rc;
}

/* Marks a window as needing no more jobs; frees it at once if none are queued. */
static void window_retire(struct rt_loader *L, int slot)
{
    pthread_mutex_lock(&L->mu);
    struct window *win = &L->win[slot];
    win->retired = 1;
    if (win->refs == 0) {
        win->state = WIN_FREE;
        pthread_cond_broadcast(&L->planner_cv);
    }
    pthread_mutex_unlock(&L->mu);
}

/* Windows of the next epoch started before it begins (its first ones, in order). */
#define PRELOAD 2
struct preload {
    int n;
    int slot[PRELOAD];
};

/*
 * Queues the batches of epoch p from step0 on. `pre` holds the windows of p
 * that the previous epoch already started; on return it holds those of `pn`
 * (the next epoch's plan, NULL for none) started here once all of p's windows
 * were under way -- so an epoch's first batches do not wait for a cold read.
 */
static int run_window_epoch(struct rt_loader *L, const struct rt_epoch_plan *p, uint64_t step0, uint64_t *seq,
                            struct preload *pre, const struct rt_epoch_plan *pn)
{
    const uint32_t B = L->o.batch;
    const uint64_t real_end = p->win_pos[p->nwindows]; /* positions past this are padding */
    uint32_t w_lo = 0, next_load = 0;
    int loaded[NWIN];
    uint32_t loaded_w[NWIN];
    int nloaded = 0;
    int rc;

    /* Skip the windows a resumed epoch no longer needs. */
    if (step0 * B < real_end)
        next_load = w_lo = window_of(p, step0 * B, 0);
    else
        next_load = w_lo = p->nwindows;
    if (pre->n && step0 == 0) {
        for (int i = 0; i < pre->n; i++) {
            loaded[i] = pre->slot[i];
            loaded_w[i] = (uint32_t)i;
        }
        nloaded = pre->n;
        next_load = (uint32_t)pre->n;
    } else {
        for (int i = 0; i < pre->n; i++)
            window_retire(L, pre->slot[i]);
    }
    pre->n = 0;

    for (uint64_t s = step0; s < p->steps; s++) {
        const uint64_t t_plan = rt_trace_begin();
        const uint64_t k0 = s * B, k1 = k0 + B;
        uint32_t wa = UINT32_MAX, wb = UINT32_MAX;
        if (k0 < real_end) {
            wa = window_of(p, k0, w_lo);
            wb = window_of(p, (k1 < real_end ? k1 : real_end) - 1, wa);
        }
        /* Retire windows that no batch from here on reads. */
        for (int i = 0; i < nloaded;) {
            if (wa == UINT32_MAX || loaded_w[i] < wa) {
                window_retire(L, loaded[i]);
                loaded[i] = loaded[nloaded - 1];
                loaded_w[i] = loaded_w[nloaded - 1];
                nloaded--;
            } else {
                i++;
            }
        }
        if (wa != UINT32_MAX)
            w_lo = wa;
        /* Start loads ahead while buffers are free, then wait for the ones this batch reads. */
        for (;;) {
            while (nloaded + pre->n < NWIN) {
                int slot;
                if (next_load < p->nwindows) {
                    rc = window_start(L, p, next_load, &slot);
                    if (rc == -1)
                        break;
                    if (rc < 0)
                        return rc;
                    loaded[nloaded] = slot;
                    loaded_w[nloaded++] = next_load++;
                } else if (pn && pre->n < PRELOAD && (uint32_t)pre->n < pn->nwindows) {
                    /* This epoch's reads are all under way: start the next epoch's first windows. */
                    rc = window_start(L, pn, (uint32_t)pre->n, &slot);
                    if (rc == -1)
                        break;
                    if (rc < 0)
                        return rc;
                    pre->slot[pre->n++] = slot;
                } else {
                    break;
                }
            }
            if (wb == UINT32_MAX || next_load > wb)
                break;
            /* Wait for a buffer to free up (a queued job finishing). */
            uint64_t t_wait = 0;
            pthread_mutex_lock(&L->mu);
            int any_free = 0;
            for (int i = 0; i < NWIN; i++)
                any_free |= L->win[i].state == WIN_FREE;
            if (!any_free && !L->stop && !L->failed) {
                t_wait = rt_trace_begin();
                pthread_cond_wait(&L->planner_cv, &L->mu);
            }
            int stop = L->stop || L->failed;
            pthread_mutex_unlock(&L->mu);
            rt_trace_end(t_wait, RT_TRACE_LOADER, "wait for window buffer", NULL);
            if (stop)
                return -1;
        }
        int js[2] = {-1, -1};
        for (int i = 0; i < nloaded; i++) {
            if (loaded_w[i] == wa)
                js[0] = loaded[i];
            else if (loaded_w[i] == wb)
                js[1] = loaded[i];
        }
        for (int k = 0; k < 2; k++)
            if (js[k] >= 0 && window_wait(L, &L->win[js[k]]) < 0)
                return -1;

        struct batch_job *j = claim(L, (*seq)++, p->epoch, s);
        if (!j)
            return -1;
        for (uint32_t i = 0; i < B; i++) {
            uint64_t k = k0 + i, id = p->order[k];
            j->ids[i] = id;
            j->src[i] = NULL;
            if (id == RT_PAD_ID)
                continue;
            uint32_t w = window_of(p, k, wa);
            const struct window *win = &L->win[w == wa ? js[0] : js[1]];
            if (window_record(L, win, id, j, i) < 0) {
                rc = rt_errf(-EINVAL, "loader: record %" PRIu64 " is not in its window (epoch %" PRIu64
                             ", step %" PRIu64 ")", id, p->epoch, s);
                return rc;
            }
        }
        j->win[0] = js[0];
        j->win[1] = js[1] != js[0] ? js[1] : -1;
        queue_batch(L, j);
        if (t_plan)
            trace_step_span("plan batch", p->epoch, s, t_plan, rt_now_ns());
    }
    for (int i = 0; i < nloaded; i++)
        window_retire(L, loaded[i]);
    return 0;
}

/* The sampler's plan of epoch e from global position `first`, traced as "plan epoch". */
static int plan_epoch(struct rt_loader *L, uint64_t e, uint64_t first, struct rt_epoch_plan **out)
{
    const uint64_t t0 = rt_trace_begin();
    int rc = rt_sampler_plan(L->sampler, e, first, out);
    if (t0) {
        char label[64];
        snprintf(label, sizeof(label), "%" PRIu64, e);
        rt_trace_span(RT_TRACE_LOADER, "plan epoch", label, t0, rt_now_ns());
    }
    return rc;
}

static void *planner_main(void *arg)
{
    struct rt_loader *L = arg;
    uint64_t seq = 0;
    int rc = 0;
    char name[32];

    snprintf(name, sizeof(name), "loader planner%s", trace_tag[L->o.split]);
    rt_trace_thread_name(name, TRACE_SORT_PLANNER);
    if (!L->streaming) {
        rc = load_resident(L);
        if (rc)
            goto out;
    }
    /* Plans are made one epoch ahead so window mode can start the next epoch's reads early. */
    struct rt_epoch_plan *p = NULL, *pn = NULL;
    struct preload pre = {0};
    rc = plan_epoch(L, L->o.start_epoch, L->o.start_sample, &p);
    for (uint64_t e = L->o.start_epoch; rc == 0 && (!L->o.epochs || e < L->o.epochs); e++) {
        uint64_t step0 = e == L->o.start_epoch ? L->first_base : 0;
        pn = NULL;
        if (!L->o.epochs || e + 1 < L->o.epochs)
            rc = plan_epoch(L, e + 1, 0, &pn);
        if (rc == 0)
            rc = L->streaming ? run_window_epoch(L, p, step0, &seq, &pre, pn) : run_resident_epoch(L, p, step0, &seq);
        rt_epoch_plan_free(p);
        p = pn;
    }
    rt_epoch_plan_free(p);
    if (rc)
        goto out;
    /* A clean end: close the ring only when every queued batch is READY. */
    pthread_mutex_lock(&L->mu);
    while (!L->stop && !L->failed && L->jobs_done < L->jobs_queued)
        pthread_cond_wait(&L->planner_cv, &L->mu);
    int ok = !L->stop && !L->failed;
    pthread_mutex_unlock(&L->mu);
    if (ok)
        rt_ring_close(L->ring, 0);
    return NULL;
out:
    if (rc < -1)
        loader_fail(L, rc);
    return NULL;
}

/* ---- set-up ---------------------------------------------------------------------- */

/*
 * Each shard is open twice (its metadata reader and the I/O engine): raise the
 * soft open-file limit toward the hard one when a big split needs it.
 */
static int ensure_fd_limit(uint32_t nshards)
{
    const rlim_t need = (rlim_t)nshards * 2 + 64;
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
        return 0;
    rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
    rl.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0 && want >= need)
        return 0;
    return rt_errf(-EMFILE, "the split has %" PRIu32 " shards, which needs about %llu open files, but `ulimit -n` "
                   "allows %llu: raise it, or pack with a larger --shard-size",
                   nshards, (unsigned long long)need, (unsigned long long)want);
}

static int open_split(struct rt_loader *L, const struct rt_dataset_info *info)
{
    const struct rt_split_info *si = &info->split[L->o.split];
    char path[4096];
    int rc;

    rc = ensure_fd_limit(si->nshards);
    if (rc < 0)
        return rc;
    L->nshards = si->nshards;
    L->records = si->records;
    L->shards = rt_calloc(si->nshards, sizeof(*L->shards), "loader shards");
    L->shard_paths = rt_calloc(si->nshards, sizeof(char *), "loader shard paths");
    L->labels = rt_malloc(sizeof(int32_t) * (si->records ? si->records : 1), "loader labels");
    if (!L->shards || !L->shard_paths || !L->labels)
        return -ENOMEM;
    for (uint32_t i = 0; i < si->nshards; i++) {
        rc = rt_path_join(path, sizeof(path), info->dir, si->shards[i].file);
        if (rc < 0)
            return rc;
        L->shard_paths[i] = strdup(path);
        if (!L->shard_paths[i])
            return rt_errf(-ENOMEM, "out of memory");
        rc = rt_shard_open(path, &L->shards[i]);
        if (rc < 0)
            return rc;
        const struct rt_shard_header *h = rt_shard_header(L->shards[i]);
        if (h->record_count != si->shards[i].records || h->first_record != si->shards[i].first_record ||
            h->channels != info->channels || h->height != info->height || h->width != info->width ||
            h->codec != info->codec)
            return rt_errf(-EBADMSG, "%s: header (%" PRIu64 " records from %" PRIu64 ", %" PRIu32 "x%" PRIu32
                           "x%" PRIu32 ") disagrees with the manifest (%" PRIu64 " from %" PRIu64 ")",
                           path, h->record_count, h->first_record, h->channels, h->height, h->width,
                           si->shards[i].records, si->shards[i].first_record);
        memcpy(L->labels + h->first_record, rt_shard_labels(L->shards[i]), sizeof(int32_t) * h->record_count);
        L->nblocks += h->block_count;
    }
    L->blocks = rt_malloc(sizeof(*L->blocks) * (L->nblocks ? L->nblocks : 1), "loader blocks");
    if (!L->blocks)
        return -ENOMEM;
    uint32_t n = 0;
    for (uint32_t i = 0; i < si->nshards; i++) {
        const struct rt_shard_header *h = rt_shard_header(L->shards[i]);
        const struct rt_block_entry *e = rt_shard_blocks(L->shards[i]);
        for (uint32_t b = 0; b < h->block_count; b++)
            L->blocks[n++] = (struct blockref){.shard = i, .index = b, .first = h->first_record + e[b].first_record,
                                               .records = e[b].record_count,
                                               .bytes = L->variable ? e[b].raw_size : e[b].record_count * L->rec};
    }
    return 0;
}

static int start_threads(struct rt_loader *L)
{
    int rc;
    for (int i = 0; i < L->nworkers; i++) {
        struct worker *wk = &L->workers[i];
        rc = -pthread_create(&wk->thread, NULL, worker_main, wk);
        if (rc < 0) {
            L->nworkers = i;
            return rt_errf(rc, "loader: cannot start worker thread: %s", strerror(-rc));
        }
    }
    rc = -pthread_create(&L->planner, NULL, planner_main, L);
    if (rc < 0)
        return rt_errf(rc, "loader: cannot start planner thread: %s", strerror(-rc));
    L->planner_started = 1;
    return 0;
}

int rt_loader_image_shape(const struct rt_dataset_info *info, uint32_t image_size, uint32_t *height,
                          uint32_t *width)
{
    if (info->height == 0) {
        if (!image_size)
            return rt_errf(-EINVAL, "%s: the images have sizes of their own (packed with --max-side %" PRIu32 "): "
                           "choose the size training sees (--image-size S)", info->dir, info->max_side);
        if (image_size > 4096)
            return rt_errf(-EINVAL, "image size %" PRIu32 " out of range [1, 4096]", image_size);
        *height = *width = image_size;
        return 0;
    }
    if (image_size && (image_size != info->height || image_size != info->width))
        return rt_errf(-EINVAL, "%s: image size %" PRIu32 ": the images were stored at %" PRIu32 "x%" PRIu32
                       "; cropping at load time needs a dataset packed with --codec jpeg --max-side N (or pack "
                       "again with --size %" PRIu32 ")", info->dir, image_size, info->height, info->width, image_size);
    *height = info->height;
    *width = info->width;
    return 0;
}

int rt_loader_opts_for(const struct rt_dataset_info *info, enum rt_split split, const struct rt_aug *aug,
                       uint32_t image_size, struct rt_loader_opts *o)
{
    uint32_t h, w;
    const int rc = rt_loader_image_shape(info, image_size, &h, &w);
    if (rc < 0)
        return rc;
    o->split = split;
    o->image_size = image_size;
    o->aug = aug ? *aug : split == RT_SPLIT_TRAIN && info->channels == 3 ? RT_AUG_DEFAULT : (struct rt_aug){0};
    o->crop = RT_CROP_CENTER;
    if (info->height == 0) {
        if (o->aug.flip == RT_FLIP_ALTERNATE)
            return rt_errf(-EINVAL, "%s: alternate-flip is for fixed-size images; variable-size ones take flip",
                           info->dir);
        o->crop = split == RT_SPLIT_TRAIN && o->aug.pad ? RT_CROP_RANDOM : RT_CROP_CENTER;
        o->aug.pad = 0;
        o->aug.pad_mode = RT_PAD_ZERO;
        for (int k = 0; k < 2; k++) { /* the spelling's crop-scale/crop-ratio, where given, over the options' */
            if (o->aug.crop_scale[1] > 0)
                o->crop_scale[k] = o->aug.crop_scale[k];
            if (o->aug.crop_ratio[1] > 0)
                o->crop_ratio[k] = o->aug.crop_ratio[k];
        }
    } else if (o->aug.crop_scale[1] > 0 || o->aug.crop_ratio[1] > 0) {
        return rt_errf(-EINVAL, "%s: crop-scale and crop-ratio are RandomResizedCrop's, for images of their own "
                       "sizes (pack --max-side); these are %ux%u: crop=PAD pads and crops them", info->dir,
                       info->height, info->width);
    }
    if (o->aug.erase_p > 0 || o->aug.cutout) {
        /* Erased pixels take the data's mean colour: 0 once normalised, as RandomErasing(value=0) after Normalize. */
        float mean[4], sd[4];
        rt_loader_norm(info, RT_MIN(info->channels, 4u), mean, sd);
        for (uint32_t c = 0; c < info->channels && c < 4; c++)
            o->aug.fill[c] = (uint8_t)lrintf(RT_MIN(RT_MAX(mean[c], 0.0f), 1.0f) * 255.0f);
    }
    return rt_aug_check(&o->aug, info->channels, h, w);
}

int rt_loader_norm(const struct rt_dataset_info *info, uint32_t channels, float *mean, float *std)
{
    const int have = info && info->have_norm;
    for (uint32_t i = 0; i < channels && i < 4; i++) {
        mean[i] = have ? info->mean[i] : 0.5f;
        std[i] = have ? info->std[i] : 0.25f;
    }
    return have;
}

int rt_loader_create(const struct rt_dataset *ds, const struct rt_loader_opts *opts, struct rt_ring *ring,
                     struct rt_loader **out)
{
    const struct rt_dataset_info *info = rt_dataset_info(ds);
    struct rt_loader *L;
    uint32_t rb, rc_, rh, rw, max_stored = 0;
    int rc;

    const int variable = info->height == 0;
    uint32_t sh, sw;

    if ((unsigned)opts->split >= RT_SPLIT_COUNT)
        return rt_errf(-EINVAL, "loader: unknown split");
    if (!info->split[opts->split].records)
        return rt_errf(-EINVAL, "%s: the %s split is empty", info->dir, rt_split_name(opts->split));
    if ((rc = rt_loader_image_shape(info, opts->image_size, &sh, &sw)) < 0)
        return rc;
    if (variable && (opts->aug.pad || opts->aug.flip == RT_FLIP_ALTERNATE))
        return rt_errf(-EINVAL, "%s: variable-size images are cropped with RandomResizedCrop; padded crops and "
                       "alternating flips are for fixed-size images", info->dir);
    rt_ring_shape(ring, &rb, &rc_, &rh, &rw);
    if (rb != opts->batch || rc_ != info->channels || rh != sh || rw != sw)
        return rt_errf(-EINVAL, "loader: ring slots are %" PRIu32 "x%" PRIu32 "x%" PRIu32 "x%" PRIu32
                       ", the dataset needs %" PRIu32 "x%" PRIu32 "x%" PRIu32 "x%" PRIu32,
                       rb, rc_, rh, rw, opts->batch, info->channels, sh, sw);
    if ((rc = rt_aug_check(&opts->aug, info->channels, sh, sw)) < 0)
        return rc;

    L = rt_calloc(1, sizeof(*L), "loader");
    if (!L)
        return -ENOMEM;
    L->o = *opts;
    if (!L->o.world)
        L->o.world = 1;
    if (!L->o.accum)
        L->o.accum = 1;
    if (!L->o.queue_depth)
        L->o.queue_depth = 32;
    L->nworkers = L->o.workers > 0 ? L->o.workers : rt_cpus_available();
    L->ring = ring;
    L->c = info->channels;
    L->h = sh;
    L->w = sw;
    L->rec = (size_t)L->c * L->h * L->w;
    L->variable = variable;
    rt_rrc_defaults(&L->rrc);
    if (L->o.crop_scale[1] > 0) {
        L->rrc.scale_lo = L->o.crop_scale[0];
        L->rrc.scale_hi = L->o.crop_scale[1];
    }
    if (L->o.crop_ratio[1] > 0) {
        L->rrc.ratio_lo = L->o.crop_ratio[0];
        L->rrc.ratio_hi = L->o.crop_ratio[1];
    }
    L->center_ratio = L->o.center_ratio > 0 ? L->o.center_ratio : RT_CENTER_RATIO;
    L->streaming = L->o.shuffle == RT_SHUFFLE_WINDOW;
    L->next_epoch = L->o.start_epoch;
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->work, NULL);
    pthread_cond_init(&L->planner_cv, NULL);

    rc = open_split(L, info);
    if (rc < 0)
        goto err;

    uint32_t *brec = rt_malloc(sizeof(uint32_t) * L->nblocks, "block sizes");
    if (!brec) {
        rc = -ENOMEM;
        goto err;
    }
    for (uint32_t i = 0; i < L->nblocks; i++) {
        brec[i] = L->blocks[i].records;
        const struct rt_block_entry *e = &rt_shard_blocks(L->shards[L->blocks[i].shard])[L->blocks[i].index];
        if (e->stored_size > max_stored)
            max_stored = e->stored_size;
    }
    struct rt_sampler_opts so = {.records = L->records, .nblocks = L->nblocks, .block_records = brec,
                                 .world = L->o.world, .rank = L->o.rank, .batch = L->o.batch,
                                 .accum = L->o.accum, .shuffle = L->o.shuffle,
                                 .window_blocks = L->o.window_blocks, .last = L->o.last, .seed = L->o.seed};
    rc = rt_sampler_create(&so, &L->sampler);
    free(brec);
    if (rc < 0)
        goto err;
    L->steps = rt_sampler_steps(L->sampler);
    if (L->o.start_sample && L->o.start_step) {
        rc = rt_errf(-EINVAL, "loader: a resume point is a step or a global position, not both");
        goto err;
    }
    if ((rc = rt_sampler_steps_from(L->sampler, L->o.start_sample, &L->first_base, &L->first_end)) < 0)
        goto err;
    if (!L->o.start_sample)
        L->first_base = L->o.start_step;
    L->next_step = L->first_base;
    if (L->first_base >= L->first_end) {
        if (L->o.start_sample)
            rc = rt_errf(-EINVAL, "loader: from position %" PRIu64 " the epoch's %" PRIu64 " records leave no "
                         "whole update of %" PRIu64 ": start at the next epoch",
                         L->o.start_sample, L->records, rt_sampler_global_batch(L->sampler));
        else
            rc = rt_errf(-EINVAL, "loader: resume step %" PRIu64 " is past the %" PRIu64 " steps of an epoch",
                         L->o.start_step, L->steps);
        goto err;
    }

    if (!L->streaming) {
        uint64_t bytes = 0;
        for (uint32_t i = 0; i < L->nblocks; i++)
            bytes += L->blocks[i].bytes;
        const uint64_t avail = rt_mem_available();
        if (avail && bytes > avail) {
            char need[32], have[32];
            rt_format_bytes((double)bytes, need, sizeof(need));
            rt_format_bytes((double)avail, have, sizeof(have));
            rc = rt_errf(-ENOMEM, "the %s split needs %s in RAM but only %s is available; use "
                         "`--shuffle window` to stream it from the shards instead",
                         rt_split_name(L->o.split), need, have);
            goto err;
        }
        /* Huge pages where the kernel has them: the first read faults in 2 MiB at a time, not 4 KiB. */
        void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            rc = rt_errf(-ENOMEM, "cannot map %" PRIu64 " bytes for the resident dataset: %s", bytes, strerror(errno));
            goto err;
        }
        madvise(m, bytes, MADV_HUGEPAGE);
        L->cache.mem = m;
        L->cache.cap = bytes;
        L->cache.blocks = rt_malloc(sizeof(uint32_t) * L->nblocks, "resident blocks");
        L->cache.offset = rt_malloc(sizeof(size_t) * L->nblocks, "resident offsets");
        if (!L->cache.mem || !L->cache.blocks || !L->cache.offset) {
            rc = -ENOMEM;
            goto err;
        }
    }

    for (int i = 0; L->streaming && i < NWIN; i++) {
        L->win[i].pos_of = rt_calloc(L->nblocks, sizeof(uint32_t), "window block map");
        if (!L->win[i].pos_of) {
            rc = -ENOMEM;
            goto err;
        }
    }

    /* Batch jobs: one per ring slot (a job exists only while its slot is claimed). */
    L->bq_cap = rt_ring_slots(ring);
    L->bq = rt_calloc(L->bq_cap, sizeof(*L->bq), "batch queue");
    L->jobs = rt_calloc(L->bq_cap, sizeof(*L->jobs), "batch jobs");
    if (!L->bq || !L->jobs) {
        rc = -ENOMEM;
        goto err;
    }
    for (uint32_t i = 0; i < L->bq_cap; i++) {
        L->jobs[i].ids = rt_malloc(sizeof(uint64_t) * L->o.batch, "batch job ids");
        L->jobs[i].src = rt_malloc(sizeof(uint8_t *) * L->o.batch, "batch job sources");
        L->jobs[i].rec = L->variable ? rt_calloc(L->o.batch, sizeof(struct rt_jpeg_record), "batch job records") : NULL;
        if (!L->jobs[i].ids || !L->jobs[i].src || (L->variable && !L->jobs[i].rec)) {
            rc = -ENOMEM;
            goto err;
        }
    }
    const uint32_t nbufs = L->o.queue_depth + 2 * (uint32_t)L->nworkers;
    L->dq_cap = nbufs;
    L->dq = rt_calloc(nbufs, sizeof(*L->dq), "decode queue");
    L->workers = rt_calloc((size_t)L->nworkers, sizeof(*L->workers), "loader workers");
    if (!L->dq || !L->workers) {
        rc = -ENOMEM;
        goto err;
    }
    for (int i = 0; i < L->nworkers; i++) {
        L->workers[i].L = L;
        rc = rt_decoder_create(&L->workers[i].dec);
        if (rc == 0 && L->variable && (rc = rt_jpegcrop_create(&L->workers[i].crop)) == 0)
            rc = rt_resizer_create(&L->workers[i].rs);
        if (rc < 0)
            goto err;
    }
    struct rt_io_opts io = {.kind = L->o.io, .depth = L->o.queue_depth, .direct = L->o.direct,
                            .max_len = max_stored, .nbufs = nbufs, .paths = (const char *const *)L->shard_paths,
                            .nfiles = L->nshards, .done = io_done, .done_ctx = L,
                            .trace_tag = trace_tag[L->o.split]};
    rc = rt_io_create(&io, &L->io);
    if (rc < 0)
        goto err;
    rt_ring_set_trace_name(ring, trace_counter[L->o.split]);
    rc = start_threads(L);
    if (rc < 0)
        goto err;
    *out = L;
    return 0;
err:
    rt_loader_destroy(L);
    return rc;
}

void rt_loader_destroy(struct rt_loader *L)
{
    if (!L)
        return;
    pthread_mutex_lock(&L->mu);
    L->stop = 1;
    pthread_cond_broadcast(&L->work);
    pthread_cond_broadcast(&L->planner_cv);
    pthread_mutex_unlock(&L->mu);
    /* The planner may sit in rt_ring_fill_begin(); closing the ring wakes it. */
    rt_ring_close(L->ring, 0);
    if (L->planner_started)
        pthread_join(L->planner, NULL);
    for (int i = 0; L->workers && i < L->nworkers; i++)
        if (L->workers[i].thread)
            pthread_join(L->workers[i].thread, NULL);
    rt_io_destroy(L->io);
    for (int i = 0; L->workers && i < L->nworkers; i++) {
        rt_decoder_destroy(L->workers[i].dec);
        rt_jpegcrop_destroy(L->workers[i].crop);
        rt_resizer_destroy(L->workers[i].rs);
    }
    for (uint32_t i = 0; L->jobs && i < L->bq_cap; i++) {
        free(L->jobs[i].ids);
        free(L->jobs[i].src);
        free(L->jobs[i].rec);
    }
    for (uint32_t i = 0; L->shards && i < L->nshards; i++) {
        rt_shard_close(L->shards[i]);
        free(L->shard_paths[i]);
    }
    for (int i = 0; i < NWIN; i++) {
        free(L->win[i].mem);
        free(L->win[i].blocks);
        free(L->win[i].offset);
        free(L->win[i].pos_of);
    }
    if (L->cache.mem)
        munmap(L->cache.mem, L->cache.cap);
    free(L->cache.blocks);
    free(L->cache.offset);
    rt_sampler_destroy(L->sampler);
    pthread_cond_destroy(&L->work);
    pthread_cond_destroy(&L->planner_cv);
    pthread_mutex_destroy(&L->mu);
    free(L->workers);
    free(L->dq);
    free(L->bq);
    free(L->jobs);
    free(L->shards);
    free(L->shard_paths);
    free(L->blocks);
    free(L->labels);
    free(L);
}

/* ---- consumer --------------------------------------------------------------------- */

int rt_loader_next(struct rt_loader *L, struct rt_batch **out)
{
    struct rt_batch *b = rt_ring_take(L->ring);
    *out = b;
    if (!b) {
        int err = rt_ring_error(L->ring);
        return err ? rt_errf(err, "%s", rt_ring_errmsg(L->ring)) : 0;
    }
    L->batches++;
    L->images += b->valid;
    L->next_epoch = b->epoch;
    L->next_step = b->step + 1;
    if (L->next_step == rt_loader_epoch_steps(L, b->epoch)) {
        L->next_epoch++;
        L->next_step = 0;
    }
    return 1;
}

void rt_loader_release(struct rt_loader *L, struct rt_batch *b) { rt_ring_release(L->ring, b); }

uint64_t rt_loader_steps_per_epoch(const struct rt_loader *L) { return L->steps; }

uint64_t rt_loader_epoch_steps(const struct rt_loader *L, uint64_t epoch)
{
    return epoch == L->o.start_epoch ? L->first_end : L->steps;
}

void rt_loader_stats(struct rt_loader *L, struct rt_loader_stats *s)
{
    struct rt_io_stats io;

    memset(s, 0, sizeof(*s));
    rt_io_get_stats(L->io, &io);
    s->io_kind = io.kind;
    s->direct = io.direct;
    s->fixed_buffers = io.fixed_buffers;
    s->fixed_files = io.fixed_files;
    s->workers = L->nworkers;
    s->queue_depth = L->o.queue_depth;
    s->batches = L->batches;
    s->images = L->images;
    s->io_reads = io.reads;
    s->io_bytes = io.bytes;
    s->io_busy_ns = io.busy_ns;
    for (int i = 0; i < L->nworkers; i++) {
        const struct worker *wk = &L->workers[i];
        s->checksum_ns += __atomic_load_n(&wk->checksum_ns, __ATOMIC_RELAXED);
        s->decompress_ns += __atomic_load_n(&wk->decompress_ns, __ATOMIC_RELAXED);
        s->decode_ns += __atomic_load_n(&wk->decode_ns, __ATOMIC_RELAXED) +
                        __atomic_load_n(&wk->crop_decode_ns, __ATOMIC_RELAXED);
        s->decoded_images += __atomic_load_n(&wk->crops, __ATOMIC_RELAXED);
        s->raw_bytes += __atomic_load_n(&wk->raw_bytes, __ATOMIC_RELAXED);
        s->decoded_images += __atomic_load_n(&wk->records, __ATOMIC_RELAXED);
        s->augment_ns += __atomic_load_n(&wk->augment_ns, __ATOMIC_RELAXED);
        s->worker_idle_ns += __atomic_load_n(&wk->idle_ns, __ATOMIC_RELAXED);
    }
    pthread_mutex_lock(&L->mu);
    s->load_ns = L->load_ns;
    pthread_mutex_unlock(&L->mu);
    s->resident_bytes = L->streaming ? 0 : L->cache.cap;
    for (int i = 0; L->streaming && i < NWIN; i++)
        s->resident_bytes += L->win[i].cap;
}

/* ---- resumable state ----------------------------------------------------------------- */

void rt_loader_state(const struct rt_loader *L, struct rt_loader_state *st)
{
    /* The epoch a start_sample began counts its steps from the base its position gives (rt_sampler_steps_from). */
    const int shifted = L->next_epoch == L->o.start_epoch && L->o.start_sample;
    const uint64_t base = shifted ? L->first_base : 0, first = shifted ? L->o.start_sample : 0;
    const uint64_t j = L->next_step - base, G = rt_sampler_global_batch(L->sampler);
    st->epoch = L->next_epoch;
    st->step = L->next_step;
    st->micro = (uint32_t)(j % L->o.accum);
    st->sample = G ? first + j / L->o.accum * G : 0;
    st->seed = L->o.seed;
    st->world = L->o.world;
    st->rank = L->o.rank;
    st->batch = L->o.batch;
    st->accum = L->o.accum;
    st->shuffle = L->o.shuffle;
}

int rt_loader_state_format(const struct rt_loader_state *st, char *buf, size_t len)
{
    int n = snprintf(buf, len,
                     "{\"format\":\"ringtrain-loader-state\",\"version\":2,\"epoch\":%" PRIu64 ",\"step\":%" PRIu64
                     ",\"sample\":%" PRIu64 ",\"micro\":%" PRIu32 ",\"seed\":\"0x%016" PRIx64 "\",\"world\":%" PRIu32
                     ",\"rank\":%" PRIu32 ",\"batch\":%" PRIu32 ",\"accum\":%" PRIu32 ",\"shuffle\":\"%s\"}",
                     st->epoch, st->step, st->sample, st->micro, st->seed, st->world, st->rank, st->batch, st->accum,
                     rt_shuffle_name(st->shuffle));
    if (n < 0 || (size_t)n >= len)
        return rt_errf(-ENOSPC, "loader state needs %d bytes", n + 1);
    return 0;
}

int rt_loader_state_parse(const char *text, struct rt_loader_state *st)
{
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    json_int_t epoch, step, world, rank, batch, version, sample = 0, micro = 0, accum = 1;
    const char *format = NULL, *seed = NULL, *shuffle = NULL;
    int rc = 0;

    if (!root)
        return rt_errf(-EINVAL, "loader state is not JSON: %s", jerr.text);
    if (json_unpack_ex(root, &jerr, 0, "{s:s, s:I, s:I, s:I, s:s, s:I, s:I, s:I, s:s}", "format", &format,
                       "version", &version, "epoch", &epoch, "step", &step, "seed", &seed, "world", &world,
                       "rank", &rank, "batch", &batch, "shuffle", &shuffle) < 0) {
        rc = rt_errf(-EINVAL, "loader state: %s", jerr.text);
        goto out;
    }
    if (strcmp(format, "ringtrain-loader-state") || version < 1 || version > 2) {
        rc = rt_errf(-EINVAL, "not a version 1 or 2 ringtrain loader state");
        goto out;
    }
    if (version == 2 && json_unpack_ex(root, &jerr, 0, "{s:I, s:I, s:I}", "sample", &sample, "micro", &micro,
                                       "accum", &accum) < 0) {
        rc = rt_errf(-EINVAL, "loader state: %s", jerr.text);
        goto out;
    }
    char *end;
    errno = 0;
    unsigned long long sv = strtoull(seed, &end, 16);
    if (epoch < 0 || step < 0 || world < 1 || rank < 0 || rank >= world || batch < 1 || *end || errno ||
        world > UINT32_MAX || batch > UINT32_MAX || sample < 0 || accum < 1 || accum > UINT32_MAX || micro < 0 ||
        micro >= accum) {
        rc = rt_errf(-EINVAL, "loader state has out-of-range values");
        goto out;
    }
    st->epoch = (uint64_t)epoch;
    st->step = (uint64_t)step;
    st->seed = sv;
    st->world = (uint32_t)world;
    st->rank = (uint32_t)rank;
    st->batch = (uint32_t)batch;
    st->accum = (uint32_t)accum;
    st->micro = (uint32_t)micro;
    st->sample = (uint64_t)sample;
    if (rt_shuffle_parse(shuffle, &st->shuffle) < 0) {
        rc = rt_errf(-EINVAL, "loader state: unknown shuffle '%s'", shuffle);
        goto out;
    }
    /* Version 1: each rank read its own contiguous chunk of the epoch. One rank's chunk is the whole sequence,
     * today's order; WINDOW's order is unchanged. */
    if (version == 1 && st->shuffle != RT_SHUFFLE_WINDOW) {
        if (world > 1)
            rc = rt_errf(-EINVAL, "the loader state is of the order before version 2, in which each of its %" PRIu32
                                  " ranks read its own part of the epoch; today one global order serves every "
                                  "world size, and the old position has no place in it: start the epoch again",
                         st->world);
        st->sample = st->step * st->batch;
    }
out:
    json_decref(root);
    return rc;
}
