/*
 * test_ring.c - the batch ring under stress (run under ThreadSanitizer in
 * CI): several producers fill batches in whatever order the scheduler gives
 * them while one consumer checks that every batch arrives once, in seq
 * order, with the contents its producer wrote; an error close stops the
 * consumer with the producer's message; memory checks explain themselves.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common/common.h"
#include "staging/ring.h"

#define PRODUCERS 4
#define BATCHES 4000

struct shared {
    struct rt_ring *ring;
    uint64_t next;        /* next seq to hand out (atomic) */
    uint64_t limit;
    uint64_t fail_at;     /* a producer closes with an error at this seq (0 = never) */
};

static void *producer(void *arg)
{
    struct shared *sh = arg;
    for (;;) {
        uint64_t seq = __atomic_fetch_add(&sh->next, 1, __ATOMIC_RELAXED);
        if (seq >= sh->limit)
            break;
        if (sh->fail_at && seq == sh->fail_at) {
            rt_errf(-EBADMSG, "producer failed on purpose at batch %" PRIu64, seq);
            rt_ring_close(sh->ring, -EBADMSG);
            break;
        }
        struct rt_batch *b = rt_ring_fill_begin(sh->ring, seq);
        if (!b)
            break;
        /* Vary the fill time so batches complete out of order. */
        if (seq % 7 == 3)
            usleep(50);
        for (uint32_t i = 0; i < b->batch; i++) {
            b->labels[i] = (int32_t)(seq * 31 + i);
            b->ids[i] = seq;
            memset(b->images + (size_t)i * 3 * 4 * 4, (int)(seq & 0xff), 3 * 4 * 4);
        }
        b->valid = b->batch;
        b->step = seq;
        rt_ring_fill_end(sh->ring, b);
    }
    return NULL;
}

static uint64_t run(uint32_t slots, uint64_t limit, uint64_t fail_at, int *in_order)
{
    struct rt_ring_opts o = {.slots = slots, .batch = 8, .channels = 3, .height = 4, .width = 4, .pin = RT_PIN_OFF};
    struct shared sh = {.limit = limit, .fail_at = fail_at};
    pthread_t th[PRODUCERS];
    uint64_t got = 0;

    *in_order = 1;
    if (rt_ring_create(&o, &sh.ring) < 0) {
        CHECKF(0, "ring create: %s", rt_errmsg());
        return 0;
    }
    for (int i = 0; i < PRODUCERS; i++)
        pthread_create(&th[i], NULL, producer, &sh);
    for (;;) {
        struct rt_batch *b;
        if (got == limit && !fail_at)
            break;
        b = rt_ring_take(sh.ring);
        if (!b)
            break;
        int good = b->seq == got && b->step == got && b->valid == 8;
        for (uint32_t i = 0; i < b->batch && good; i++)
            good = b->labels[i] == (int32_t)(got * 31 + i) && b->ids[i] == got &&
                   b->images[(size_t)i * 48 + 47] == (uint8_t)(got & 0xff);
        if (!good)
            *in_order = 0;
        got++;
        rt_ring_release(sh.ring, b);
    }
    if (!fail_at) {
        struct rt_wait_stats p, c;
        rt_ring_wait_stats(sh.ring, &p, &c);
        CHECKF(p.count == limit && c.count == limit, "wait counts %" PRIu64 "/%" PRIu64, p.count, c.count);
        CHECK(p.p50_ns <= p.p99_ns && p.p99_ns <= p.max_ns && c.p50_ns <= c.p99_ns && c.p99_ns <= c.max_ns);
        rt_ring_close(sh.ring, 0);
    } else {
        CHECK(rt_ring_error(sh.ring) == -EBADMSG);
        CHECKF(strstr(rt_ring_errmsg(sh.ring), "on purpose at batch") != NULL, "message: %s",
               rt_ring_errmsg(sh.ring));
    }
    for (int i = 0; i < PRODUCERS; i++)
        pthread_join(th[i], NULL);
    rt_ring_destroy(sh.ring);
    return got;
}

int main(void)
{
    int in_order;
    for (uint32_t slots = 2; slots <= 9; slots += 7) {
        uint64_t got = run(slots, BATCHES, 0, &in_order);
        CHECKF(got == BATCHES, "slots %u: consumed %" PRIu64, slots, got);
        CHECKF(in_order, "slots %u: a batch came out of order or with wrong contents", slots);
    }
    uint64_t got = run(3, BATCHES, 1000, &in_order);
    CHECKF(got <= 1000, "consumed %" PRIu64 " batches past the failure at 1000", got);
    CHECK(in_order);

    /* Memory checks name the numbers and the fix. */
    CHECK_ERR(rt_ring_check_memory((size_t)1 << 62, RT_PIN_OFF, 0), "--shuffle window");
    struct rt_ring_opts bad = {.slots = 1, .batch = 8, .channels = 3, .height = 4, .width = 4};
    struct rt_ring *r;
    CHECK_ERR(rt_ring_create(&bad, &r), "ring slots must be");
    /* Pinned: a 4-slot ring fits the default 8 MiB `ulimit -l` and comes back locked. */
    struct rt_ring_opts pin = {.slots = 4, .batch = 16, .channels = 3, .height = 32, .width = 32, .pin = RT_PIN_ON};
    if (rt_ring_create(&pin, &r) == 0) {
        CHECK(rt_ring_locked(r));
        CHECK(rt_ring_bytes(r) >= 4 * (16 * 3072 + 16 * 4 + 16 * 8));
        rt_ring_destroy(r);
    } else {
        CHECKF(strstr(rt_errmsg(), "ulimit -l") != NULL, "pinned ring failed without the fix: %s", rt_errmsg());
    }
    printf("test_ring: %d checks\n", check_count);
    return check_result();
}
