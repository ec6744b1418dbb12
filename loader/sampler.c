/*
 * sampler.c - the distributed sampler: which split-local record ids each
 * rank sees, epoch after epoch, and in which order (see loader.h for the
 * three shuffle modes and the two last-batch policies).
 *
 * Everything here is a pure function of the options and the epoch: the RNG
 * is Philox keyed by the seed with the stream naming (purpose, epoch, ...),
 * so any rank can compute any other rank's plan -- which is how WINDOW mode
 * finds the step count that every rank shares without talking to them.
 *
 * EXACT and NONE deal one global sequence per epoch (a permutation, or
 * record order): update u takes positions [u*G, (u+1)*G), G = batch x world
 * x accum, cut into world x accum micro-batches of `batch` by position;
 * micro-batch m goes to rank m % world as its (m / world)-th micro-batch of
 * the update. Which samples an update sees depends on G alone, so a run
 * stopped on one world size continues on another with the same updates.
 * PAD's last update, short of G, shares its records out evenly over its
 * micro-batches instead (plan_global).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "loader/loader.h"

/* Stream namespaces of the sampler's RNG (the augmentation has its own). */
#define STREAM_PERM   (UINT64_C(1) << 56)
#define STREAM_BLOCKS (UINT64_C(2) << 56)
#define STREAM_WINDOW (UINT64_C(3) << 56)

struct rt_sampler {
    struct rt_sampler_opts o;       /* accum 0 made 1 */
    uint32_t *block_records;    /* WINDOW */
    uint64_t *block_first;      /* WINDOW: first split-local record of each block */
    uint64_t steps;
};

const char *rt_shuffle_name(enum rt_shuffle shuffle)
{
    switch (shuffle) {
    case RT_SHUFFLE_EXACT: return "exact";
    case RT_SHUFFLE_WINDOW: return "window";
    case RT_SHUFFLE_NONE: return "none";
    }
    return NULL;
}

int rt_shuffle_parse(const char *name, enum rt_shuffle *out)
{
    for (int s = RT_SHUFFLE_EXACT; s <= RT_SHUFFLE_NONE; s++)
        if (!strcmp(name, rt_shuffle_name((enum rt_shuffle)s))) {
            *out = (enum rt_shuffle)s;
            return 0;
        }
    return -EINVAL;
}

static uint64_t rng_below64(struct rt_rng *r, uint64_t n)
{
    if (n <= UINT32_MAX)
        return rt_rng_below(r, (uint32_t)n);
    /* Rejection on the top of the 64-bit range keeps it unbiased. */
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t v;
    do
        v = rt_rng_u64(r);
    while (v >= limit);
    return v % n;
}

/* Fisher-Yates over ids[0..n) with the stream (seed, stream). */
static void shuffle_u64(uint64_t *ids, uint64_t n, uint64_t seed, uint64_t stream)
{
    struct rt_rng r;
    rt_rng_init(&r, seed, stream);
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = rng_below64(&r, i);
        uint64_t t = ids[i - 1];
        ids[i - 1] = ids[j];
        ids[j] = t;
    }
}

/* The split's blocks in this epoch's dealing order (WINDOW). */
static int block_perm(const struct rt_sampler *s, uint64_t epoch, uint64_t **out)
{
    uint64_t *perm = rt_malloc(sizeof(*perm) * s->o.nblocks, "block permutation");
    if (!perm)
        return -ENOMEM;
    for (uint32_t i = 0; i < s->o.nblocks; i++)
        perm[i] = i;
    shuffle_u64(perm, s->o.nblocks, s->o.seed, STREAM_BLOCKS | epoch);
    *out = perm;
    return 0;
}

/* Records rank `rank` is dealt in WINDOW mode for the given block order. */
static uint64_t window_rank_records(const struct rt_sampler *s, const uint64_t *perm, uint32_t rank)
{
    uint64_t n = 0;
    for (uint64_t j = rank; j < s->o.nblocks; j += s->o.world)
        n += s->block_records[perm[j]];
    return n;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/*
 * WINDOW step count. The records dealt to each rank depend on the epoch's
 * block order, so the count uses the bound that holds for every epoch: a
 * rank gets at least floor(nblocks / world) blocks, the smallest ones in the
 * worst case (DROP), and at most ceil(nblocks / world) of the largest (PAD).
 */
static uint64_t window_steps(const struct rt_sampler *s)
{
    const uint32_t nb = s->o.nblocks, w = s->o.world;
    uint32_t *sorted = rt_malloc(sizeof(*sorted) * nb, "block sizes");
    uint64_t n = 0, steps;

    if (!sorted)
        return 0;
    memcpy(sorted, s->block_records, sizeof(*sorted) * nb);
    qsort(sorted, nb, sizeof(*sorted), cmp_u32);
    if (s->o.last == RT_LAST_DROP) {
        for (uint32_t i = 0; i < nb / w; i++)
            n += sorted[i];
        steps = n / s->o.batch;
    } else {
        uint32_t take = (nb + w - 1) / w;
        for (uint32_t i = 0; i < take; i++)
            n += sorted[nb - 1 - i];
        steps = (n + s->o.batch - 1) / s->o.batch;
        if (steps == 0)
            steps = 1;
    }
    free(sorted);
    return steps;
}

/* EXACT/NONE: the global batch, what one update takes from the epoch's sequence. */
static uint64_t global_batch(const struct rt_sampler *s)
{
    return (uint64_t)s->o.batch * s->o.world * s->o.accum;
}

/* EXACT/NONE: the updates of an epoch whose sequence is taken from position `first` on. */
static uint64_t updates_from(const struct rt_sampler *s, uint64_t first)
{
    const uint64_t G = global_batch(s), n = s->o.records - first;
    return s->o.last == RT_LAST_DROP ? n / G : (n + G - 1) / G;
}

int rt_sampler_create(const struct rt_sampler_opts *o, struct rt_sampler **out)
{
    struct rt_sampler *s;

    if (!o->world || o->rank >= o->world)
        return rt_errf(-EINVAL, "sampler: rank %" PRIu32 " outside world size %" PRIu32, o->rank, o->world);
    if (!o->batch)
        return rt_errf(-EINVAL, "sampler: batch size must be at least 1");
    if (!o->records)
        return rt_errf(-EINVAL, "sampler: the split has no records");
    if (o->shuffle == RT_SHUFFLE_WINDOW && (!o->nblocks || !o->block_records))
        return rt_errf(-EINVAL, "sampler: window shuffle needs the block layout");
    s = rt_calloc(1, sizeof(*s), "sampler");
    if (!s)
        return -ENOMEM;
    s->o = *o;
    if (!s->o.accum)
        s->o.accum = 1;
    if (!s->o.window_blocks)
        s->o.window_blocks = 64;
    if (o->shuffle == RT_SHUFFLE_WINDOW) {
        uint64_t total = 0;
        s->block_records = rt_malloc(sizeof(uint32_t) * o->nblocks, "block sizes");
        s->block_first = rt_malloc(sizeof(uint64_t) * o->nblocks, "block starts");
        if (!s->block_records || !s->block_first) {
            rt_sampler_destroy(s);
            return -ENOMEM;
        }
        for (uint32_t i = 0; i < o->nblocks; i++) {
            s->block_records[i] = o->block_records[i];
            s->block_first[i] = total;
            total += o->block_records[i];
        }
        if (total != o->records) {
            rt_sampler_destroy(s);
            return rt_errf(-EINVAL, "sampler: blocks hold %" PRIu64 " records, the split %" PRIu64, total,
                           o->records);
        }
        s->steps = window_steps(s);
    } else {
        s->steps = updates_from(s, 0) * s->o.accum;
    }
    if (s->steps == 0) {
        char acc[48] = "";
        if (s->o.accum > 1 && o->shuffle != RT_SHUFFLE_WINDOW)
            snprintf(acc, sizeof(acc), " x accumulation %" PRIu32, s->o.accum);
        int rc = rt_errf(-EINVAL,
                         "%" PRIu64 " records%s are too few for %" PRIu32 " rank(s) x batch %" PRIu32
                         "%s with the drop policy: an epoch would have no full %s. Use a smaller batch%s",
                         o->records, o->shuffle == RT_SHUFFLE_WINDOW ? " in window-shuffled blocks" : "",
                         o->world, o->batch, acc, acc[0] ? "update" : "batch",
                         o->shuffle == RT_SHUFFLE_WINDOW ? ", smaller blocks or --shuffle exact" : "");
        rt_sampler_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

void rt_sampler_destroy(struct rt_sampler *s)
{
    if (!s)
        return;
    free(s->block_records);
    free(s->block_first);
    free(s);
}

uint64_t rt_sampler_steps(const struct rt_sampler *s) { return s->steps; }

uint64_t rt_sampler_global_batch(const struct rt_sampler *s)
{
    return s->o.shuffle == RT_SHUFFLE_WINDOW ? 0 : global_batch(s);
}

int rt_sampler_steps_from(const struct rt_sampler *s, uint64_t first, uint64_t *base, uint64_t *end)
{
    if (first == 0) {
        *base = 0;
        *end = s->steps;
        return 0;
    }
    if (s->o.shuffle == RT_SHUFFLE_WINDOW)
        return rt_errf(-EINVAL, "sampler: the window shuffle deals whole blocks to each rank: it has no global "
                                "position to start from");
    if (first >= s->o.records)
        return rt_errf(-EINVAL, "sampler: position %" PRIu64 " is past the split's %" PRIu64 " records", first,
                       s->o.records);
    *base = first / global_batch(s) * s->o.accum;
    *end = *base + updates_from(s, first) * s->o.accum;
    return 0;
}

void rt_epoch_plan_free(struct rt_epoch_plan *p)
{
    if (!p)
        return;
    free(p->order);
    free(p->blocks);
    free(p->win_block);
    free(p->win_pos);
    free(p);
}

/* EXACT/NONE: this rank's micro-batches of the global sequence from position `first` (the header comment). */
static int plan_global(const struct rt_sampler *s, struct rt_epoch_plan *p, uint64_t first, uint64_t base)
{
    const struct rt_sampler_opts *o = &s->o;
    const uint64_t n = o->records, G = global_batch(s), b = o->batch;
    uint64_t *perm = rt_malloc(sizeof(*perm) * n, "sample permutation");

    if (!perm)
        return -ENOMEM;
    for (uint64_t i = 0; i < n; i++)
        perm[i] = i;
    if (o->shuffle == RT_SHUFFLE_EXACT)
        shuffle_u64(perm, n, o->seed, STREAM_PERM | p->epoch);
    for (uint64_t k = 0; k < base * b; k++) /* steps before the start: never handed out */
        p->order[k] = RT_PAD_ID;
    const uint64_t M = (uint64_t)o->world * o->accum;
    for (uint64_t k = base; k < p->steps; k++) {
        const uint64_t j = k - base, u = j / o->accum, m = (j % o->accum) * o->world + o->rank;
        const uint64_t start = first + u * G, left = n - start;
        /* PAD's last update, short of G: its `left` records shared out evenly, so that no rank's last batch is
         * empty while another's is full (the ranks' counts differ by one at most). */
        const uint64_t lo = left >= G ? start + m * b : start + m * left / M;
        const uint64_t hi = left >= G ? lo + b : start + (m + 1) * left / M;
        for (uint64_t i = 0; i < b; i++)
            p->order[k * b + i] = lo + i < hi ? perm[lo + i] : RT_PAD_ID;
    }
    free(perm);
    return 0;
}

static int plan_window(const struct rt_sampler *s, struct rt_epoch_plan *p)
{
    const struct rt_sampler_opts *o = &s->o;
    const uint64_t len = p->steps * o->batch;
    uint64_t *perm = NULL, *seq = NULL;
    uint32_t nb = 0;
    int rc = block_perm(s, p->epoch, &perm);

    if (rc < 0)
        return rc;
    for (uint64_t j = o->rank; j < o->nblocks; j += o->world)
        nb++;
    const uint64_t mine = window_rank_records(s, perm, o->rank);
    /* At most one window per block; the real count is known after grouping. */
    p->blocks = rt_malloc(sizeof(*p->blocks) * (nb ? nb : 1), "plan blocks");
    p->win_block = rt_malloc(sizeof(*p->win_block) * (nb + 1), "plan windows");
    p->win_pos = rt_malloc(sizeof(*p->win_pos) * (nb + 1), "plan windows");
    seq = rt_malloc(sizeof(*seq) * (mine ? mine : 1), "window order");
    if (!p->blocks || !p->win_block || !p->win_pos || !seq) {
        rc = -ENOMEM;
        goto out;
    }
    nb = 0;
    for (uint64_t j = o->rank; j < o->nblocks; j += o->world)
        p->blocks[nb++] = (uint32_t)perm[j];
    /*
     * A window closes once it has window_blocks blocks and at least one
     * batch of records, so a batch never spans more than two windows.
     */
    uint64_t pos = 0;
    p->nwindows = 0;
    for (uint32_t b0 = 0; b0 < nb;) {
        uint32_t b = b0;
        uint64_t first = pos;
        while (b < nb && (b - b0 < s->o.window_blocks || pos - first < o->batch)) {
            uint32_t blk = p->blocks[b++];
            for (uint32_t r = 0; r < s->block_records[blk]; r++)
                seq[pos++] = s->block_first[blk] + r;
        }
        p->win_block[p->nwindows] = b0;
        p->win_pos[p->nwindows] = first;
        p->nwindows++;
        /* A window's shuffle is keyed by its first block, unique within the epoch. */
        shuffle_u64(seq + first, pos - first, o->seed, STREAM_WINDOW | (p->epoch << 32) | p->blocks[b0]);
        b0 = b;
    }
    p->win_block[p->nwindows] = nb;
    p->win_pos[p->nwindows] = pos;
    for (uint64_t k = 0; k < len; k++)
        p->order[k] = k < mine ? seq[k] : RT_PAD_ID;
    rc = 0;
out:
    free(perm);
    free(seq);
    return rc;
}

int rt_sampler_plan(const struct rt_sampler *s, uint64_t epoch, uint64_t first, struct rt_epoch_plan **out)
{
    uint64_t base, end;
    int rc = rt_sampler_steps_from(s, first, &base, &end);
    if (rc < 0)
        return rc;
    struct rt_epoch_plan *p = rt_calloc(1, sizeof(*p), "epoch plan");
    if (!p)
        return -ENOMEM;
    if (epoch >= (UINT64_C(1) << 24)) {
        free(p);
        return rt_errf(-EINVAL, "sampler: epoch %" PRIu64 " out of range", epoch);
    }
    p->epoch = epoch;
    p->steps = end;
    p->batch = s->o.batch;
    p->order = rt_malloc(sizeof(*p->order) * p->steps * p->batch, "epoch order");
    if (!p->order) {
        free(p);
        return -ENOMEM;
    }
    rc = s->o.shuffle == RT_SHUFFLE_WINDOW ? plan_window(s, p) : plan_global(s, p, first, base);
    if (rc < 0) {
        rt_epoch_plan_free(p);
        return rc;
    }
    *out = p;
    return 0;
}
