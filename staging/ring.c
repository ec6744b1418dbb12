/*
 * ring.c - the ring of batch slots between the loader's workers (many
 * producers) and the trainer (one consumer).
 *
 * Batch `seq` always lives in slot seq % slots, so batches come out in seq
 * order however the producers interleave, and a producer that runs ahead
 * simply waits for its slot: that is the backpressure. One mutex guards the
 * states; each slot has its own condition variable so a release wakes only
 * the producer waiting for that slot. Both sides' waits go into log-linear
 * histograms for p50/p99/max.
 *
 * Memory is one allocation (slots x slot bytes), page-aligned, mlock()ed
 * when `ulimit -l` allows (enum rt_pin), or from the caller's allocator
 * (cudaHostAlloc).
 *
 * While a trace records, a wait that blocked becomes a span on the waiting
 * thread's track, timed by the readings that feed the histograms, and the
 * number of full slots is a counter updated under the mutex (so its values
 * are in time order).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/common.h"
#include "common/trace.h"
#include "staging/ring.h"

/* Log-linear histogram: exact below 64 ns, then 16 sub-buckets per power of two. */
#define HIST_SUB 16
#define HIST_LINEAR 64
#define HIST_BUCKETS (HIST_LINEAR + (64 - 6) * HIST_SUB)

struct hist {
    uint64_t count, total, max;
    uint64_t bucket[HIST_BUCKETS];
};

struct slot {
    struct rt_batch b;
    enum rt_slot_state state;
    uint64_t next_seq;      /* the seq this slot holds next */
    pthread_cond_t cond;    /* producers waiting for this slot */
};

struct rt_ring {
    pthread_mutex_t mu;
    pthread_cond_t ready;   /* the consumer */
    struct slot *slots;
    uint32_t nslots;
    uint32_t batch, c, h, w;
    uint64_t take_seq;      /* next seq the consumer takes */
    uint32_t full;          /* slots READY or IN_FLIGHT: the trace's occupancy */
    const char *counter;    /* the occupancy counter's name (static) */
    int closed;
    int err;
    char errmsg[512];
    struct hist prod, cons;
    uint8_t *mem;
    size_t mem_bytes;
    int locked;
    const struct rt_ring_allocator *alloc;
};

static unsigned hist_index(uint64_t v)
{
    if (v < HIST_LINEAR)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v); /* >= 6 */
    return HIST_LINEAR + (e - 6) * HIST_SUB + (unsigned)((v >> (e - 4)) & (HIST_SUB - 1));
}

/* Upper edge of bucket i (the value reported for a percentile inside it). */
static uint64_t hist_upper(unsigned i)
{
    if (i < HIST_LINEAR)
        return i;
    unsigned e = (i - HIST_LINEAR) / HIST_SUB + 6, sub = (i - HIST_LINEAR) % HIST_SUB;
    return ((uint64_t)(HIST_SUB + sub + 1) << (e - 4)) - 1;
}

static void hist_add(struct hist *h, uint64_t v)
{
    h->count++;
    h->total += v;
    if (v > h->max)
        h->max = v;
    h->bucket[hist_index(v)]++;
}

static uint64_t hist_quantile(const struct hist *h, double q)
{
    uint64_t want = (uint64_t)(q * (double)h->count + 0.5), seen = 0;
    if (want == 0)
        want = 1;
    for (unsigned i = 0; i < HIST_BUCKETS; i++) {
        seen += h->bucket[i];
        if (seen >= want) {
            uint64_t u = hist_upper(i);
            return u < h->max ? u : h->max;
        }
    }
    return h->max;
}

static void hist_summary(const struct hist *h, struct rt_wait_stats *s)
{
    s->count = h->count;
    s->total_ns = h->total;
    s->max_ns = h->max;
    s->p50_ns = h->count ? hist_quantile(h, 0.50) : 0;
    s->p99_ns = h->count ? hist_quantile(h, 0.99) : 0;
}

static size_t page_round(size_t n)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (n + page - 1) / page * page;
}

size_t rt_ring_slot_bytes(const struct rt_ring_opts *o)
{
    const size_t img = (size_t)o->batch * o->channels * o->height * o->width;
    return page_round(img) + page_round((size_t)o->batch * sizeof(int32_t)) +
           page_round((size_t)o->batch * sizeof(uint64_t));
}

/* 1 if this process holds CAP_IPC_LOCK (then RLIMIT_MEMLOCK does not apply). */
static int has_ipc_lock(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long eff = 0;
    int found = 0;

    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "CapEff: %llx", &eff) == 1) {
            found = 1;
            break;
        }
    fclose(f);
    return found && (eff >> 14) & 1; /* CAP_IPC_LOCK = 14 */
}

/* The `ulimit -l` that `bytes` of locked memory exceed (to *limit), or 0: no limit, within it, or CAP_IPC_LOCK. */
static int memlock_exceeded(size_t bytes, uint64_t *limit)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY || (uint64_t)bytes <= rl.rlim_cur ||
        has_ipc_lock())
        return 0;
    *limit = rl.rlim_cur;
    return 1;
}

int rt_ring_check_memory(size_t bytes, enum rt_pin pin, uint64_t extra_bytes)
{
    char need[32], have[32], extra[32];
    const uint64_t avail = rt_mem_available();

    rt_format_bytes((double)bytes, need, sizeof(need));
    if (avail && (uint64_t)bytes + extra_bytes > avail) {
        rt_format_bytes((double)avail, have, sizeof(have));
        rt_format_bytes((double)extra_bytes, extra, sizeof(extra));
        return rt_errf(-ENOMEM,
                       "not enough free memory: the batch ring needs %s and the resident dataset %s, "
                       "but only %s is available (MemAvailable). Fix: use fewer ring slots or a smaller "
                       "batch, or `--shuffle window` so the dataset is streamed instead of held in RAM",
                       need, extra, have);
    }
    uint64_t limit;
    if (pin == RT_PIN_ON && memlock_exceeded(bytes, &limit)) {
        rt_format_bytes((double)limit, have, sizeof(have));
        return rt_errf(-ENOMEM,
                       "the batch ring needs %s of page-locked memory but `ulimit -l` allows %s (%llu KiB). "
                       "Fix: raise the limit (`ulimit -l unlimited` in the job script; under Slurm also "
                       "`srun --propagate=MEMLOCK`, or set `memlock` in /etc/security/limits.conf), or use "
                       "fewer ring slots / a smaller batch, or `--no-pin` for pageable slots",
                       need, have, (unsigned long long)(limit / 1024));
    }
    return 0;
}

/*
 * mlock()s the slots. ON: an error with the fix when that is refused. AUTO: a refusal (or a limit
 * too low to try) leaves them pageable, said in one line once per process. 0 or -errno.
 */
static int lock_slots(struct rt_ring *r, enum rt_pin pin)
{
    static atomic_int said;
    char need[32], why[160];
    uint64_t limit;

    rt_format_bytes((double)r->mem_bytes, need, sizeof(need));
    if (pin == RT_PIN_AUTO && memlock_exceeded(r->mem_bytes, &limit)) {
        char have[32];
        rt_format_bytes((double)limit, have, sizeof(have));
        snprintf(why, sizeof(why), "`ulimit -l` allows %s", have);
    } else if (mlock(r->mem, r->mem_bytes) == 0) {
        r->locked = 1;
        return 0;
    } else if (pin == RT_PIN_ON) {
        return rt_errf(-errno, "cannot lock the batch ring's %s in memory: %s. Fix: raise `ulimit -l`, "
                       "or use `--no-pin`", need, strerror(errno));
    } else {
        snprintf(why, sizeof(why), "mlock: %s", strerror(errno));
    }
    if (atomic_exchange(&said, 1) == 0)
        rt_info("batch ring: %s of pageable slots, not page-locked (%s); the CPU needs no locked slots "
                "(--no-pin: pageable without this line, --pin: locked or stop)", need, why);
    return 0;
}

int rt_ring_create(const struct rt_ring_opts *o, struct rt_ring **out)
{
    struct rt_ring *r;
    size_t slot_bytes, img, lab;
    int rc;

    if (o->slots < 2 || o->slots > 1024)
        return rt_errf(-EINVAL, "ring slots must be 2..1024, not %" PRIu32, o->slots);
    if (!o->batch || !o->channels || !o->height || !o->width)
        return rt_errf(-EINVAL, "ring needs a non-zero batch size and image shape");
    slot_bytes = rt_ring_slot_bytes(o);
    img = page_round((size_t)o->batch * o->channels * o->height * o->width);
    lab = page_round((size_t)o->batch * sizeof(int32_t));
    if (!o->allocator || !o->allocator->locks) {
        rc = rt_ring_check_memory(slot_bytes * o->slots, o->pin, 0);
        if (rc < 0)
            return rc;
    }
    r = rt_calloc(1, sizeof(*r), "ring");
    if (!r)
        return -ENOMEM;
    r->slots = rt_calloc(o->slots, sizeof(*r->slots), "ring slots");
    if (!r->slots) {
        free(r);
        return -ENOMEM;
    }
    r->nslots = o->slots;
    r->counter = "ring occupancy";
    r->batch = o->batch;
    r->c = o->channels;
    r->h = o->height;
    r->w = o->width;
    r->alloc = o->allocator;
    r->mem_bytes = slot_bytes * o->slots;
    if (r->alloc) {
        r->mem = r->alloc->alloc(r->mem_bytes, r->alloc->ctx);
        if (!r->mem) {
            rc = -ENOMEM;
            goto err;
        }
        r->locked = r->alloc->locks;
    } else {
        void *p = mmap(NULL, r->mem_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            rc = rt_errf(-ENOMEM, "cannot map %zu bytes for the batch ring: %s", r->mem_bytes, strerror(errno));
            goto err;
        }
        r->mem = p;
        if (o->pin != RT_PIN_OFF) {
            rc = lock_slots(r, o->pin);
            if (rc < 0)
                goto err;
        }
        if (!r->locked)
            memset(r->mem, 0, r->mem_bytes); /* fault the pages in now, not in the first epoch */
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->ready, NULL);
    for (uint32_t i = 0; i < o->slots; i++) {
        struct slot *s = &r->slots[i];
        uint8_t *base = r->mem + slot_bytes * i;
        s->b.images = base;
        s->b.labels = (int32_t *)(base + img);
        s->b.ids = (uint64_t *)(base + img + lab);
        s->b.batch = o->batch;
        s->b.slot = i;
        s->state = RT_SLOT_FREE;
        s->next_seq = i;
        pthread_cond_init(&s->cond, NULL);
    }
    *out = r;
    return 0;
err:
    if (r->mem && r->alloc)
        r->alloc->free(r->mem, r->mem_bytes, r->alloc->ctx);
    else if (r->mem)
        munmap(r->mem, r->mem_bytes);
    free(r->slots);
    free(r);
    return rc;
}

void rt_ring_destroy(struct rt_ring *r)
{
    if (!r)
        return;
    for (uint32_t i = 0; i < r->nslots; i++)
        pthread_cond_destroy(&r->slots[i].cond);
    pthread_cond_destroy(&r->ready);
    pthread_mutex_destroy(&r->mu);
    if (r->alloc)
        r->alloc->free(r->mem, r->mem_bytes, r->alloc->ctx);
    else
        munmap(r->mem, r->mem_bytes); /* also unlocks */
    free(r->slots);
    free(r);
}

uint32_t rt_ring_slots(const struct rt_ring *r) { return r->nslots; }

void rt_ring_shape(const struct rt_ring *r, uint32_t *batch, uint32_t *channels, uint32_t *height,
                   uint32_t *width)
{
    *batch = r->batch;
    *channels = r->c;
    *height = r->h;
    *width = r->w;
}

/* A wait on the ring that blocked, [t0, t1), as a span labelled with the batch's seq. */
static void trace_wait(const char *name, uint64_t seq, uint64_t t0, uint64_t t1)
{
    char label[64]; /* the recorder keeps 23 characters */
    snprintf(label, sizeof(label), "seq %" PRIu64, seq);
    rt_trace_span(RT_TRACE_RING, name, label, t0, t1);
}

struct rt_batch *rt_ring_fill_begin(struct rt_ring *r, uint64_t seq)
{
    struct slot *s = &r->slots[seq % r->nslots];
    uint64_t t0 = rt_now_ns(), t1 = 0;
    struct rt_batch *b = NULL;
    int waited = 0;

    pthread_mutex_lock(&r->mu);
    while (!r->closed && !(s->state == RT_SLOT_FREE && s->next_seq == seq)) {
        pthread_cond_wait(&s->cond, &r->mu);
        waited = 1;
    }
    if (!r->closed) {
        s->state = RT_SLOT_FILLING;
        s->b.seq = seq;
        b = &s->b;
        t1 = rt_now_ns();
        hist_add(&r->prod, t1 - t0);
    }
    pthread_mutex_unlock(&r->mu);
    if (waited && b && rt_trace_live())
        trace_wait("ring wait (slot)", seq, t0, t1);
    return b;
}

void rt_ring_fill_end(struct rt_ring *r, struct rt_batch *b)
{
    pthread_mutex_lock(&r->mu);
    r->slots[b->slot].state = RT_SLOT_READY;
    r->full++;
    if (rt_trace_live())
        rt_trace_counter(r->counter, r->full, 0);
    if (b->seq == r->take_seq)
        pthread_cond_signal(&r->ready);
    pthread_mutex_unlock(&r->mu);
}

struct rt_batch *rt_ring_take(struct rt_ring *r)
{
    uint64_t t0 = rt_now_ns(), t1 = 0;
    struct rt_batch *b = NULL;
    int waited = 0;

    pthread_mutex_lock(&r->mu);
    struct slot *s = &r->slots[r->take_seq % r->nslots];
    /* A close with an error stops at once; a clean close still hands out what is READY. */
    while (!(r->closed && r->err) && !(s->state == RT_SLOT_READY && s->b.seq == r->take_seq)) {
        if (r->closed)
            break;
        pthread_cond_wait(&r->ready, &r->mu);
        waited = 1;
    }
    if (!(r->closed && r->err) && s->state == RT_SLOT_READY && s->b.seq == r->take_seq) {
        s->state = RT_SLOT_IN_FLIGHT;
        r->take_seq++;
        b = &s->b;
        t1 = rt_now_ns();
        hist_add(&r->cons, t1 - t0);
    }
    pthread_mutex_unlock(&r->mu);
    if (waited && b && rt_trace_live())
        trace_wait("ring wait (consumer)", b->seq, t0, t1);
    return b;
}

void rt_ring_release(struct rt_ring *r, struct rt_batch *b)
{
    pthread_mutex_lock(&r->mu);
    struct slot *s = &r->slots[b->slot];
    s->state = RT_SLOT_FREE;
    s->next_seq = b->seq + r->nslots;
    r->full--;
    if (rt_trace_live())
        rt_trace_counter(r->counter, r->full, 0);
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&r->mu);
}

void rt_ring_close(struct rt_ring *r, int err)
{
    pthread_mutex_lock(&r->mu);
    if (!r->closed) {
        r->closed = 1;
        r->err = err;
        if (err)
            snprintf(r->errmsg, sizeof(r->errmsg), "%s", rt_errmsg());
    }
    pthread_cond_broadcast(&r->ready);
    for (uint32_t i = 0; i < r->nslots; i++)
        pthread_cond_broadcast(&r->slots[i].cond);
    pthread_mutex_unlock(&r->mu);
}

void rt_ring_set_trace_name(struct rt_ring *r, const char *counter)
{
    pthread_mutex_lock(&r->mu);
    r->counter = counter;
    pthread_mutex_unlock(&r->mu);
}

int rt_ring_error(const struct rt_ring *r)
{
    pthread_mutex_lock((pthread_mutex_t *)&r->mu);
    int err = r->err;
    pthread_mutex_unlock((pthread_mutex_t *)&r->mu);
    return err;
}

const char *rt_ring_errmsg(const struct rt_ring *r) { return r->errmsg; }

void rt_ring_wait_stats(struct rt_ring *r, struct rt_wait_stats *producer, struct rt_wait_stats *consumer)
{
    pthread_mutex_lock(&r->mu);
    if (producer)
        hist_summary(&r->prod, producer);
    if (consumer)
        hist_summary(&r->cons, consumer);
    pthread_mutex_unlock(&r->mu);
}

size_t rt_ring_bytes(const struct rt_ring *r) { return r->mem_bytes; }

int rt_ring_locked(const struct rt_ring *r) { return r->locked; }
