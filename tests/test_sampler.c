/*
 * test_sampler.c - properties of the distributed sampler over many
 * (records, world, batch, policy, shuffle) combinations:
 *   - every rank has the same step count, and it is never 0;
 *   - DROP: no padding, no record twice in an epoch across ranks, exactly
 *     steps * batch * world records used;
 *   - PAD: every record exactly once per epoch across ranks, padding only at
 *     the end of a rank's order, and (the global order) the ranks' record
 *     counts within one of each other;
 *   - the order is a pure function of (seed, epoch, world, rank): rebuilt
 *     plans are identical, another epoch or seed differs;
 *   - WINDOW: each window's positions hold exactly the records of its blocks;
 *   - EXACT/NONE, the global order: every (world, accumulation) pair of one
 *     global batch G deals each update the same micro-batches (micro-batch m
 *     to rank m % world), smaller micro-batches cut the same G samples, and a
 *     plan from a global position continues the same sequence.
 * Fixed seeds, printed on failure.
 */
#include <errno.h>
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
        uint64_t used = 0, least = UINT64_MAX, most = 0;
        memset(seen, 0, n);
        for (uint32_t r = 0; r < world; r++) {
            const uint64_t used_before = used;
            struct rt_epoch_plan *p, *q;
            if (rt_sampler_plan(s[r], epoch, 0, &p) < 0) {
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
            least = RT_MIN(least, used - used_before);
            most = RT_MAX(most, used - used_before);
            /* Same inputs, same plan. */
            CHECK_OK(rt_sampler_plan(s[r], epoch, 0, &q));
            CHECKF(!memcmp(p->order, q->order, sizeof(uint64_t) * steps * batch), "%s: plan not reproducible", what);
            rt_epoch_plan_free(q);
            rt_epoch_plan_free(p);
        }
        /* The global order's PAD shares its last update out evenly: the ranks' records differ by one at most. */
        if (last == RT_LAST_PAD && shuffle != RT_SHUFFLE_WINDOW)
            CHECKF(most - least <= 1, "%s: epoch %" PRIu64 ": ranks hold %" PRIu64 " to %" PRIu64 " records", what,
                   epoch, least, most);
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
    CHECK_OK(rt_sampler_plan(s, 0, 0, &a));
    CHECK_OK(rt_sampler_plan(s, 1, 0, &b));
    o.seed = 8;
    struct rt_sampler *s2;
    CHECK_OK(rt_sampler_create(&o, &s2));
    CHECK_OK(rt_sampler_plan(s2, 0, 0, &c));
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

    /* NONE is record order, dealt a micro-batch of 10 to each rank in turn. */
    o.shuffle = RT_SHUFFLE_NONE;
    o.world = 2;
    o.rank = 1;
    CHECK_OK(rt_sampler_create(&o, &s));
    CHECK_OK(rt_sampler_plan(s, 3, 0, &a));
    CHECK(a->order[0] == 10 && a->order[9] == 19 && a->order[10] == 30 && a->order[499] == 999);
    rt_epoch_plan_free(a);
    rt_sampler_destroy(s);
}

/* Rank r's plan of (world, batch, accum) from position `first` of epoch 1; NULL (a failed check) on an error. */
static struct rt_epoch_plan *plan_of(uint64_t n, enum rt_shuffle sh, enum rt_last_batch last, uint32_t world,
                                     uint32_t rank, uint32_t batch, uint32_t accum, uint64_t first)
{
    struct rt_sampler_opts o = {.records = n, .world = world, .rank = rank, .batch = batch, .accum = accum,
                                .shuffle = sh, .last = last, .seed = 99};
    struct rt_sampler *s;
    struct rt_epoch_plan *p = NULL;
    if (rt_sampler_create(&o, &s) < 0) {
        CHECKF(0, "create n=%" PRIu64 " world=%u batch=%u accum=%u: %s", n, world, batch, accum, rt_errmsg());
        return NULL;
    }
    if (rt_sampler_plan(s, 1, first, &p) < 0)
        CHECKF(0, "plan from %" PRIu64 ": %s", first, rt_errmsg());
    rt_sampler_destroy(s);
    return p;
}

/*
 * The global order against its reference, one rank taking the whole global batch in one micro-batch per update:
 * G = 24, N = 1000 (41 whole updates, 16 records left out under DROP) and N = 999 under PAD.
 */
static void check_global_order(void)
{
    static const struct { uint32_t world, batch, accum; } ways[] = {
        {1, 24, 1}, {1, 6, 4}, {2, 6, 2}, {4, 6, 1}, {2, 12, 1}, {3, 8, 1}, {8, 3, 1}, {6, 4, 1}, {1, 1, 24},
    };
    for (int sh = RT_SHUFFLE_EXACT; sh <= RT_SHUFFLE_NONE; sh += RT_SHUFFLE_NONE - RT_SHUFFLE_EXACT)
        for (int last = 0; last < 2; last++) {
            const uint64_t n = last == RT_LAST_DROP ? 1000 : 999, G = 24;
            /* The sequence itself, every position below n (PAD: the permutation does not depend on the policy). */
            struct rt_epoch_plan *ref = plan_of(n, (enum rt_shuffle)sh, RT_LAST_PAD, 1, 0, 24, 1, 0);
            if (!ref)
                return;
            static const uint64_t firsts[] = {0, 3 * 24, 3 * 24 + 5};
            for (size_t w = 0; w < RT_ARRAY_LEN(ways); w++)
                for (size_t f = 0; f < RT_ARRAY_LEN(firsts); f++) {
                    const uint64_t first = firsts[f];
                    const uint32_t W = ways[w].world, b = ways[w].batch, A = ways[w].accum;
                    for (uint32_t r = 0; r < W; r++) {
                        struct rt_epoch_plan *p = plan_of(n, (enum rt_shuffle)sh, (enum rt_last_batch)last, W, r, b,
                                                          A, first);
                        if (!p)
                            continue;
                        const uint64_t base = first / G * A;
                        const uint64_t updates = last == RT_LAST_DROP ? (n - first) / G : (n - first + G - 1) / G;
                        const uint64_t want = base + updates * A;
                        CHECKF(p->steps == want, "world %u accum %u from %" PRIu64 ": %" PRIu64 " steps, not %" PRIu64,
                               W, A, first, p->steps, want);
                        /* Step k >= base: update u = (k - base) / A, micro-batch m = ((k - base) % A) x W + r,
                         * at global position first + u G + m b of the reference's sequence; in PAD's last update,
                         * short of G, its `left` records shared out evenly: [m left / M, (m + 1) left / M). */
                        for (uint64_t k = base; k < p->steps; k++) {
                            const uint64_t u = (k - base) / A, m = (k - base) % A * W + r, M = (uint64_t)W * A;
                            const uint64_t start = first + u * G, left = n - start;
                            const uint64_t lo = left >= G ? start + m * b : start + m * left / M;
                            const uint64_t hi = left >= G ? lo + b : start + (m + 1) * left / M;
                            for (uint32_t i = 0; i < b; i++) {
                                const uint64_t pos = lo + i;
                                const uint64_t expect = pos < hi ? ref->order[pos] : RT_PAD_ID;
                                if (p->order[k * b + i] != expect) {
                                    CHECKF(0, "shuffle %d last %d world %u batch %u accum %u from %" PRIu64
                                              ": rank %u step %" PRIu64 " sample %u is %" PRIu64 ", not %" PRIu64,
                                           sh, last, W, b, A, first, r, k, i, p->order[k * b + i], expect);
                                    k = p->steps;
                                    break;
                                }
                            }
                        }
                        rt_epoch_plan_free(p);
                    }
                }
            rt_epoch_plan_free(ref);
        }
    /* WINDOW has no global position to start from. */
    static uint32_t blocks[] = {10, 10, 10};
    struct rt_sampler_opts o = {.records = 30, .nblocks = 3, .block_records = blocks, .world = 1, .batch = 5,
                                .shuffle = RT_SHUFFLE_WINDOW, .seed = 1};
    struct rt_sampler *s;
    struct rt_epoch_plan *p = NULL;
    CHECK_OK(rt_sampler_create(&o, &s));
    CHECK(rt_sampler_plan(s, 0, 10, &p) == -EINVAL && strstr(rt_errmsg(), "window"));
    CHECK(rt_sampler_global_batch(s) == 0);
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
    check_global_order();
    printf("test_sampler: %d combinations, %d checks\n", combos, check_count);
    return check_result();
}
