/*
 * test_sampler.c - properties of the distributed sampler over many
 * (records, world, batch, policy, shuffle) combinations:
 *   - every rank has the same step count, and it is never 0;
 *   - DROP: no padding, no record twice in an epoch across ranks, exactly
 *     steps * batch * world records used;
 *   - PAD: every record exactly once per epoch across ranks, padding only at
 *     the end of a rank's order;
 *   - the order is a pure function of (seed, epoch, world, rank): rebuilt
 *     plans are identical, another epoch or seed differs;
 *   - WINDOW: each window's positions hold exactly the records of its blocks.
 * Fixed seeds, printed on failure.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/common.h"
#include "loader/loader.h"

/* A block layout like pack's: full blocks of `per`, a short last block per shard. */
static uint32_t make_blocks(uint64_t n, uint32_t per, uint32_t shard_blocks, uint32_t *out)
{
    uint32_t nb = 0;
    uint64_t left = n;
    while (left) {
        for (uint32_t b = 0; b < shard_blocks && left; b++) {
            uint32_t take = left < per ? (uint32_t)left : per;
            /* Every third shard ends in a short block, as a real pack does. */
            if (b == shard_blocks - 1 && take > 3 && nb % 3 == 0)
                take = take / 3;
            out[nb++] = take;
            left -= take;
        }
    }
    return nb;
}

static void check_combo(uint64_t n, uint32_t world, uint32_t batch, enum rt_last_batch last,
                        enum rt_shuffle shuffle, uint64_t seed)
{
    static uint32_t blocks[100000];
    const uint32_t nb = make_blocks(n, 7, 5, blocks);
    struct rt_sampler *s[8];
    uint8_t *seen = malloc(n);
    uint64_t steps = 0;
    char what[256];

    snprintf(what, sizeof(what), "n=%" PRIu64 " world=%u batch=%u last=%s shuffle=%d seed=%" PRIu64, n, world,
             batch, last == RT_LAST_PAD ? "pad" : "drop", (int)shuffle, seed);
    for (uint32_t r = 0; r < world; r++) {
        struct rt_sampler_opts o = {.records = n, .nblocks = nb, .block_records = blocks, .world = world, .rank = r,
                                    .batch = batch, .shuffle = shuffle, .window_blocks = 3, .last = last,
                                    .seed = seed};
        if (rt_sampler_create(&o, &s[r]) < 0) {
            /* Only DROP may refuse, and only when there is not one full batch per rank. */
            CHECKF(last == RT_LAST_DROP && strstr(rt_errmsg(), "too few"), "%s: %s", what, rt_errmsg());
            for (uint32_t k = 0; k < r; k++)
                rt_sampler_destroy(s[k]);
            free(seen);
            return;
        }
        uint64_t st = rt_sampler_steps(s[r]);
        CHECKF(st > 0, "%s: zero steps", what);
        if (r == 0)
            steps = st;
        CHECKF(st == steps, "%s: rank %u has %" PRIu64 " steps, rank 0 %" PRIu64, what, r, st, steps);
    }
    for (uint64_t epoch = 0; epoch < 2; epoch++) {
        uint64_t used = 0;
        memset(seen, 0, n);
        for (uint32_t r = 0; r < world; r++) {
            struct rt_epoch_plan *p, *q;
            if (rt_sampler_plan(s[r], epoch, &p) < 0) {
                CHECKF(0, "%s: plan: %s", what, rt_errmsg());
                continue;
            }
            int padding = 0;
            for (uint64_t k = 0; k < steps * batch; k++) {
                uint64_t id = p->order[k];
                if (id == RT_PAD_ID) {
                    CHECKF(last == RT_LAST_PAD, "%s: padding under drop", what);
                    padding = 1;
                    continue;
                }
                CHECKF(!padding, "%s: rank %u: a real record after padding at %" PRIu64, what, r, k);
                if (id >= n) {
                    CHECKF(0, "%s: id %" PRIu64 " out of range", what, id);
                    break;
                }
                CHECKF(!seen[id], "%s: record %" PRIu64 " twice in epoch %" PRIu64, what, id, epoch);
                seen[id] = 1;
                used++;
            }
            if (shuffle == RT_SHUFFLE_WINDOW) {
                /* Each window's positions hold exactly its blocks' records; all but the last hold a batch. */
                CHECK(p->win_block[0] == 0 && p->win_pos[0] == 0);
                for (uint32_t w = 0; w < p->nwindows; w++) {
                    uint64_t cnt = 0;
                    for (uint32_t b = p->win_block[w]; b < p->win_block[w + 1]; b++)
                        cnt += blocks[p->blocks[b]];
                    CHECKF(p->win_pos[w + 1] - p->win_pos[w] == cnt, "%s: window %u size", what, w);
                    if (w + 1 < p->nwindows)
                        CHECKF(cnt >= batch, "%s: window %u holds %" PRIu64 " < batch records", what, w, cnt);
                }
            }
            /* Same inputs, same plan. */
            CHECK_OK(rt_sampler_plan(s[r], epoch, &q));
            CHECKF(!memcmp(p->order, q->order, sizeof(uint64_t) * steps * batch), "%s: plan not reproducible", what);
            rt_epoch_plan_free(q);
            rt_epoch_plan_free(p);
        }
        if (last == RT_LAST_PAD)
            CHECKF(used == n, "%s: epoch %" PRIu64 ": %" PRIu64 " of %" PRIu64 " records covered", what, epoch, used, n);
        else
            CHECKF(used == steps * batch * world, "%s: used %" PRIu64 ", expected %" PRIu64, what, used,
                   steps * batch * world);
    }
    for (uint32_t r = 0; r < world; r++)
        rt_sampler_destroy(s[r]);
    free(seen);
}

static void check_shuffles_differ(void)
{
    struct rt_sampler_opts o = {.records = 1000, .world = 1, .batch = 10, .seed = 7};
    struct rt_sampler *s;
    struct rt_epoch_plan *a, *b, *c;
    CHECK_OK(rt_sampler_create(&o, &s));
    CHECK_OK(rt_sampler_plan(s, 0, &a));
    CHECK_OK(rt_sampler_plan(s, 1, &b));
    o.seed = 8;
    struct rt_sampler *s2;
    CHECK_OK(rt_sampler_create(&o, &s2));
    CHECK_OK(rt_sampler_plan(s2, 0, &c));
    CHECK(memcmp(a->order, b->order, 8 * 1000) != 0);
    CHECK(memcmp(a->order, c->order, 8 * 1000) != 0);
    /* A uniform shuffle leaves about one fixed point; the identity would leave 1000. */
    int fixed = 0;
    for (int i = 0; i < 1000; i++)
        fixed += a->order[i] == (uint64_t)i;
    CHECKF(fixed < 10, "%d fixed points", fixed);
    rt_epoch_plan_free(a);
    rt_epoch_plan_free(b);
    rt_epoch_plan_free(c);
    rt_sampler_destroy(s);
    rt_sampler_destroy(s2);

    /* NONE is record order. */
    o.shuffle = RT_SHUFFLE_NONE;
    o.world = 2;
    o.rank = 1;
    CHECK_OK(rt_sampler_create(&o, &s));
    CHECK_OK(rt_sampler_plan(s, 3, &a));
    CHECK(a->order[0] == 500 && a->order[499] == 999);
    rt_epoch_plan_free(a);
    rt_sampler_destroy(s);
}

int main(void)
{
    static const uint64_t ns[] = {1, 2, 3, 7, 10, 33, 64, 100, 257, 1000, 4099};
    static const uint32_t worlds[] = {1, 2, 3, 4, 8};
    static const uint32_t batches[] = {1, 3, 8, 32, 100};
    int combos = 0;

    for (size_t i = 0; i < RT_ARRAY_LEN(ns); i++)
        for (size_t j = 0; j < RT_ARRAY_LEN(worlds); j++)
            for (size_t k = 0; k < RT_ARRAY_LEN(batches); k++)
                for (int last = 0; last < 2; last++)
                    for (int sh = 0; sh < 3; sh++) {
                        check_combo(ns[i], worlds[j], batches[k], (enum rt_last_batch)last, (enum rt_shuffle)sh,
                                    1234 + i);
                        combos++;
                    }
    check_shuffles_differ();
    printf("test_sampler: %d combinations, %d checks\n", combos, check_count);
    return check_result();
}
