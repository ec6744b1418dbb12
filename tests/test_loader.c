/*
 * test_loader.c - the loader end to end on a small packed synthetic CIFAR-10
 * (several shards, small blocks):
 *   - batches are bit-identical (digest of images, labels, ids) for worker
 *     counts 1/2/4, queue depths 1..32, io_uring and pread, O_DIRECT or not;
 *   - without augmentation every sample equals its decoded record and label;
 *   - with crop+flip (zero or reflect padding) every sample is one of the 162
 *     crops/flips of its record (checked against a naive padded-image
 *     implementation), many different crops occur, and about half flip;
 *   - evaluation padding across 3 ranks covers the split exactly once;
 *   - the serialised loader state resumes at exactly the next batch;
 *   - the end of the data is rt_loader_next() returning 0 with no batch, again
 *     on the next call;
 *   - a corrupt block stops the run (-EBADMSG) with shard, block and records
 *     named, and a missing shard is refused at start-up.
 * RT_TEST_SMALL=1 shrinks the dataset (for the ThreadSanitizer build).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "check.h"
#include "common/common.h"
#include "loader/loader.h"
#include "loader/offline.h"
#include "staging/ring.h"
#include "test_util.h"

static char g_dir[512], g_data[600];
static uint8_t *g_pixels;
static int32_t *g_labels;
static long g_train;

struct run_opts {
    struct rt_loader_opts lo;
    uint64_t max_batches;  /* 0 = all */
};

static struct rt_loader_opts base_opts(enum rt_shuffle sh)
{
    struct rt_loader_opts o = {.split = RT_SPLIT_TRAIN, .batch = 32, .world = 1, .seed = 42, .shuffle = sh,
                               .window_blocks = 4, .workers = 2, .epochs = 2,
                               .aug = {.pad = 4, .flip = RT_FLIP_RANDOM}};
    return o;
}

/*
 * A ring of `slots` CIFAR-shaped slots and a loader feeding it; 0, or -1
 * with nothing left allocated (message in rt_errmsg).
 */
static int start_loader(const struct rt_dataset *ds, const struct rt_loader_opts *lo, uint32_t slots,
                        struct rt_ring **ring, struct rt_loader **L)
{
    struct rt_ring_opts ro = {.slots = slots, .batch = lo->batch, .channels = 3, .height = 32, .width = 32,
                              .pin = RT_PIN_OFF};
    if (rt_ring_create(&ro, ring) < 0)
        return -1;
    if (rt_loader_create(ds, lo, *ring, L) < 0) {
        rt_ring_destroy(*ring);
        return -1;
    }
    return 0;
}

static void stop_loader(struct rt_ring *ring, struct rt_loader *L)
{
    rt_loader_destroy(L);
    rt_ring_destroy(ring);
}

/*
 * Digest of every batch the loader hands out; 0, or -1 when the loader did
 * not start and rt_loader_next()'s -errno when it stopped on an error
 * (message in rt_errmsg). Checks that the end, or the error, comes with a
 * NULL batch and comes again on the next call.
 */
static int digest_run(const struct rt_dataset *ds, const struct rt_loader_opts *lo, uint64_t *digest,
                      uint64_t *batches)
{
    struct rt_ring *ring;
    struct rt_loader *L;
    struct rt_batch *b;
    int rc;

    *batches = 0;
    if (start_loader(ds, lo, 4, &ring, &L) < 0)
        return -1;
    XXH64_state_t *xs = XXH64_createState();
    XXH64_reset(xs, 0);
    while ((rc = rt_loader_next(L, &b)) > 0) {
        XXH64_update(xs, b->images, (size_t)b->batch * 3072);
        XXH64_update(xs, b->labels, 4 * (size_t)b->batch);
        XXH64_update(xs, b->ids, 8 * (size_t)b->batch);
        (*batches)++;
        rt_loader_release(L, b);
    }
    static struct rt_batch not_null;
    CHECKF(b == NULL, "rt_loader_next returned %d with a batch", rc);
    b = &not_null;
    CHECKF(rt_loader_next(L, &b) == rc && b == NULL, "a second call after %d", rc);
    *digest = XXH64_digest(xs);
    XXH64_freeState(xs);
    stop_loader(ring, L);
    return rc;
}

static void test_determinism(const struct rt_dataset *ds)
{
    static const struct {
        int workers;
        uint32_t qd;
        enum rt_io_kind io;
        int direct;
    } cfg[] = {{1, 1, RT_IO_PREAD, 0}, {2, 32, RT_IO_AUTO, 0}, {4, 4, RT_IO_AUTO, 0},
               {4, 32, RT_IO_PREAD, 0}, {3, 2, RT_IO_AUTO, 1}};
    for (int sh = 0; sh < 3; sh++) {
        uint64_t ref = 0, nref = 0;
        for (size_t i = 0; i < RT_ARRAY_LEN(cfg); i++) {
            struct rt_loader_opts o = base_opts((enum rt_shuffle)sh);
            uint64_t d, n;
            o.workers = cfg[i].workers;
            o.queue_depth = cfg[i].qd;
            o.io = cfg[i].io;
            o.direct = cfg[i].direct;
            if (digest_run(ds, &o, &d, &n) < 0) {
                CHECKF(0, "shuffle %d config %zu: %s", sh, i, rt_errmsg());
                continue;
            }
            if (i == 0) {
                ref = d;
                nref = n;
                CHECKF(n == 2 * (uint64_t)(g_train / 32) || sh == RT_SHUFFLE_WINDOW, "shuffle %d: %" PRIu64 " batches", sh, n);
                CHECK(n > 0);
            }
            CHECKF(d == ref && n == nref, "shuffle %d: workers %d qd %u io %d direct %d: digest %016" PRIx64
                   " (%" PRIu64 " batches) != %016" PRIx64 " (%" PRIu64 ")",
                   sh, cfg[i].workers, cfg[i].qd, (int)cfg[i].io, cfg[i].direct, d, n, ref, nref);
        }
    }
}

/* Reflect index into [0, n) as numpy's "reflect" (edge not repeated). */
static int reflect(int i, int n) { return i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i; }

/* Any shape: out[c][y][x] = padded[c][y + oy][(flip ? w-1-x : x) + ox], padding zero or reflected. */
static void naive_aug(const uint8_t *src, uint8_t *dst, int c, int h, int w, int pad, int oy, int ox, int flip,
                          int refl)
{
    for (int ch = 0; ch < c; ch++)
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                int py = y + oy - pad, px = (flip ? w - 1 - x : x) + ox - pad;
                int inside = py >= 0 && py < h && px >= 0 && px < w;
                dst[((size_t)ch * h + y) * w + x] =
                    inside || refl ? src[((size_t)ch * h + reflect(py, h)) * w + reflect(px, w)] : 0;
            }
}

static void test_contents(const struct rt_dataset *ds)
{
    for (int aug = 0; aug < 3; aug++) {
        struct rt_loader_opts o = base_opts(RT_SHUFFLE_EXACT);
        struct rt_ring *ring;
        struct rt_loader *L;
        struct rt_batch *b;
        uint8_t want[3072];
        int offsets_seen[9][9] = {{0}}, flips = 0, checked = 0;

        if (!aug)
            memset(&o.aug, 0, sizeof(o.aug));
        if (aug == 2)
            o.aug.pad_mode = RT_PAD_REFLECT;
        o.epochs = 1;
        if (start_loader(ds, &o, 3, &ring, &L) < 0) {
            CHECKF(0, "%s", rt_errmsg());
            return;
        }
        int more;
        while ((more = rt_loader_next(L, &b)) > 0) {
            for (uint32_t i = 0; i < b->valid; i++) {
                uint64_t id = b->ids[i];
                const uint8_t *got = b->images + 3072 * (size_t)i, *rec = g_pixels + 3072 * id;
                CHECKF(id < (uint64_t)g_train && b->labels[i] == g_labels[id], "id %" PRIu64 " label", id);
                if (!aug) {
                    CHECKF(!memcmp(got, rec, 3072), "record %" PRIu64 " differs from its decoded pixels", id);
                    continue;
                }
                int match = 0;
                for (int oy = 0; oy <= 8 && !match; oy++)
                    for (int ox = 0; ox <= 8 && !match; ox++)
                        for (int f = 0; f < 2 && !match; f++) {
                            naive_aug(rec, want, 3, 32, 32, 4, oy, ox, f, aug == 2);
                            if (!memcmp(got, want, 3072)) {
                                match = 1;
                                offsets_seen[oy][ox]++;
                                flips += f;
                            }
                        }
                CHECKF(match, "sample %" PRIu64 " is no crop/flip of its record", id);
                checked++;
            }
            rt_loader_release(L, b);
        }
        CHECKF(more == 0, "%s", rt_errmsg());
        if (aug) {
            int distinct = 0;
            for (int y = 0; y < 9; y++)
                for (int x = 0; x < 9; x++)
                    distinct += offsets_seen[y][x] > 0;
            CHECKF(distinct > 40, "only %d distinct crop offsets", distinct);
            CHECKF(flips > checked / 4 && flips < checked * 3 / 4, "%d flips of %d", flips, checked);
        }
        stop_loader(ring, L);
    }
}

/* rt_augment on shapes other than CIFAR's: small (padded buffer) and large (row by row) paths. */
static void test_augment_shapes(void)
{
    static const int shapes[][3] = {{1, 28, 28}, {3, 200, 120}, {3, 7, 300}};
    for (size_t si = 0; si < RT_ARRAY_LEN(shapes); si++) {
        const int c = shapes[si][0], h = shapes[si][1], w = shapes[si][2], pad = 4;
        const size_t n = (size_t)c * h * w;
        uint8_t *src = malloc(n), *got = malloc(n), *want = malloc(n);
        struct rt_rng r;
        rt_rng_init(&r, 99, si);
        for (size_t i = 0; i < n; i++)
            src[i] = (uint8_t)rt_rng_u32(&r);
        int right = 0, left = 0;
        for (int refl = 0; refl < 2; refl++)
            for (uint64_t id = 0; id < 12; id++) {
                struct rt_aug a = {.pad = pad, .pad_mode = refl ? RT_PAD_REFLECT : RT_PAD_ZERO, .flip = RT_FLIP_RANDOM};
                int match = 0;
                rt_augment(&a, 3, 1, id, (uint32_t)c, (uint32_t)h, (uint32_t)w, src, got);
                for (int oy = 0; oy <= 2 * pad && !match; oy++)
                    for (int ox = 0; ox <= 2 * pad && !match; ox++)
                        for (int f = 0; f < 2 && !match; f++) {
                            naive_aug(src, want, c, h, w, pad, oy, ox, f, refl);
                            match = !memcmp(got, want, n);
                            right += match && ox > pad;
                            left += match && ox < pad;
                        }
                CHECKF(match, "%dx%dx%d %s id %" PRIu64 ": no crop/flip matches", c, h, w, refl ? "reflect" : "zero",
                       id);
            }
        /* Both edges must have been exercised, or the comparison proved little. */
        CHECKF(right && left, "%dx%dx%d: crops shifted right %d, left %d times", c, h, w, right, left);
        free(src);
        free(got);
        free(want);
    }
}

static void test_eval_pad(const struct rt_dataset *ds)
{
    const struct rt_split_info *si = &rt_dataset_info(ds)->split[RT_SPLIT_TEST];
    uint8_t *seen = calloc(si->records, 1);
    uint64_t steps0 = 0;

    for (uint32_t rank = 0; rank < 3; rank++) {
        struct rt_loader_opts o = {.split = RT_SPLIT_TEST, .batch = 48, .world = 3, .rank = rank,
                                   .shuffle = RT_SHUFFLE_NONE, .last = RT_LAST_PAD, .workers = 2, .epochs = 1};
        struct rt_ring *ring;
        struct rt_loader *L;
        struct rt_batch *b;
        uint64_t steps = 0;
        static const uint8_t zero[3072];

        if (start_loader(ds, &o, 4, &ring, &L) < 0) {
            CHECKF(0, "%s", rt_errmsg());
            break;
        }
        int more;
        while ((more = rt_loader_next(L, &b)) > 0) {
            for (uint32_t i = 0; i < b->batch; i++) {
                if (i < b->valid) {
                    CHECK(b->ids[i] < si->records);
                    if (b->ids[i] < si->records)
                        seen[b->ids[i]]++;
                } else {
                    CHECK(b->ids[i] == RT_PAD_ID && !memcmp(b->images + 3072 * (size_t)i, zero, 3072));
                }
            }
            steps++;
            rt_loader_release(L, b);
        }
        CHECKF(more == 0, "%s", rt_errmsg());
        if (rank == 0)
            steps0 = steps;
        CHECKF(steps == steps0, "rank %u: %" PRIu64 " steps, rank 0 %" PRIu64, rank, steps, steps0);
        stop_loader(ring, L);
    }
    uint64_t wrong = 0;
    for (uint64_t i = 0; i < si->records; i++)
        wrong += seen[i] != 1;
    CHECKF(wrong == 0, "%" PRIu64 " test records not seen exactly once across 3 ranks", wrong);
    free(seen);
}

/* Digest of batches [skip, skip + count) of a run started at (epoch, step). */
static uint64_t batches_digest(const struct rt_dataset *ds, struct rt_loader_opts o, uint64_t skip, uint64_t count,
                               struct rt_loader_state *state_after_skip)
{
    struct rt_ring *ring;
    struct rt_loader *L;
    struct rt_batch *b;
    uint64_t h = 0, n = 0;

    if (start_loader(ds, &o, 4, &ring, &L) < 0) {
        CHECKF(0, "%s", rt_errmsg());
        return 0;
    }
    while (n < skip + count && rt_loader_next(L, &b) > 0) {
        if (n >= skip)
            h = XXH64(b->images, (size_t)b->batch * 3072, h) ^ XXH64(b->ids, 8 * (size_t)b->batch, n - skip);
        rt_loader_release(L, b);
        n++;
        if (n == skip && state_after_skip)
            rt_loader_state(L, state_after_skip);
    }
    CHECKF(n == skip + count, "got %" PRIu64 " batches", n);
    stop_loader(ring, L);
    return h;
}

static void test_resume(const struct rt_dataset *ds)
{
    for (int sh = 0; sh < 2; sh++) {
        struct rt_loader_opts o = base_opts(sh ? RT_SHUFFLE_WINDOW : RT_SHUFFLE_EXACT);
        struct rt_loader_state st, back;
        char text[512];
        o.epochs = 3;
        /* Stop inside the second epoch, resume from the saved state. */
        uint64_t steps = (uint64_t)g_train / 32;
        uint64_t skip = steps + 3;
        uint64_t cont = batches_digest(ds, o, skip, 5, &st);
        CHECK(st.epoch == 1 && st.step == 3);
        CHECK_OK(rt_loader_state_format(&st, text, sizeof(text)));
        CHECK_OK(rt_loader_state_parse(text, &back));
        CHECK(back.epoch == st.epoch && back.step == st.step && back.seed == 42 && back.batch == 32);
        o.start_epoch = back.epoch;
        o.start_step = back.step;
        uint64_t resumed = batches_digest(ds, o, 0, 5, NULL);
        CHECKF(cont == resumed, "shuffle %d: resumed batches differ", sh);
    }
    struct rt_loader_state st;
    CHECK_ERR(rt_loader_state_parse("{\"format\":\"x\"}", &st), "loader state");
    /* Version 1 (each rank read its own chunk): one rank's is today's order, more ranks' are refused. */
    CHECK_OK(rt_loader_state_parse("{\"format\":\"ringtrain-loader-state\",\"version\":1,\"epoch\":1,\"step\":3,"
                                   "\"seed\":\"0x2a\",\"world\":1,\"rank\":0,\"batch\":32,\"shuffle\":\"exact\"}",
                                   &st));
    CHECK(st.sample == 96 && st.accum == 1 && st.micro == 0);
    CHECK_ERR(rt_loader_state_parse("{\"format\":\"ringtrain-loader-state\",\"version\":1,\"epoch\":1,\"step\":3,"
                                    "\"seed\":\"0x2a\",\"world\":2,\"rank\":0,\"batch\":32,\"shuffle\":\"exact\"}",
                                    &st),
              "order before version 2");
}

/* The ids of the first `n` batches of a loader with options `o` into ids[n * batch]; the count it gave. */
static uint64_t ids_of(const struct rt_dataset *ds, struct rt_loader_opts o, uint64_t n, uint64_t *ids,
                       struct rt_loader_state *after)
{
    struct rt_ring *ring;
    struct rt_loader *L;
    struct rt_batch *b;
    uint64_t k = 0;
    if (start_loader(ds, &o, 4, &ring, &L) < 0) {
        CHECKF(0, "%s", rt_errmsg());
        return 0;
    }
    for (; k < n && rt_loader_next(L, &b) > 0; k++) {
        memcpy(ids + k * o.batch, b->ids, sizeof(uint64_t) * o.batch);
        rt_loader_release(L, b);
    }
    if (after)
        rt_loader_state(L, after);
    stop_loader(ring, L);
    return k;
}

/*
 * The global order across world sizes: two ranks' state after 3 steps says global position 192; a one-rank
 * loader started there (start_sample) gives the one-rank order's batches from there on, and from a position
 * between two of its batches (200) the records from 200 on, its epoch ending where whole batches do.
 */
static void test_global_position(const struct rt_dataset *ds)
{
    const uint64_t N = (uint64_t)g_train, per = N / 32;
    uint64_t *ref = calloc(per * 32, sizeof(uint64_t)), *got = calloc(per * 32, sizeof(uint64_t));
    struct rt_loader_opts o = base_opts(RT_SHUFFLE_EXACT);
    struct rt_loader_state st;
    o.start_epoch = 1;
    o.epochs = 2;
    CHECK(ids_of(ds, o, per, ref, NULL) == per);
    struct rt_loader_opts o2 = o;
    o2.world = 2;
    o2.rank = 1;
    CHECK(ids_of(ds, o2, 3, got, &st) == 3);
    CHECK(st.sample == 192 && st.step == 3 && st.micro == 0);
    CHECK(memcmp(got, ref + 32, sizeof(uint64_t) * 32) == 0); /* rank 1's first batch: positions 32..63 */
    for (uint64_t first = 192; first <= 200; first += 8) {
        struct rt_loader_opts o1 = o;
        o1.start_sample = first;
        const uint64_t want = first / 32 + (N - first) / 32; /* the end of the epoch's step numbers */
        struct rt_ring *ring;
        struct rt_loader *L;
        if (start_loader(ds, &o1, 4, &ring, &L) < 0) {
            CHECKF(0, "%s", rt_errmsg());
            continue;
        }
        CHECKF(rt_loader_epoch_steps(L, 1) == want, "from %" PRIu64 ": epoch ends at %" PRIu64 ", not %" PRIu64,
               first, rt_loader_epoch_steps(L, 1), want);
        stop_loader(ring, L);
        const uint64_t n = want - first / 32;
        CHECK(ids_of(ds, o1, n, got, &st) == n);
        uint64_t bad = 0;
        for (uint64_t i = 0; i < n * 32; i++)
            bad += first + i < per * 32 ? got[i] != ref[first + i] : 0;
        CHECKF(bad == 0, "from position %" PRIu64 ": %" PRIu64 " ids not the one-rank order's", first, bad);
        CHECKF(st.epoch == 2 && st.step == 0, "from %" PRIu64 ": after the epoch at (%" PRIu64 ", %" PRIu64 ")",
               first, st.epoch, st.step);
    }
    free(ref);
    free(got);
}

static void corrupt_byte(const char *path, long off)
{
    int fd = open(path, O_RDWR);
    uint8_t c;
    if (fd < 0 || pread(fd, &c, 1, off) != 1) {
        CHECKF(0, "cannot open %s", path);
        return;
    }
    c ^= 0x40;
    CHECK(pwrite(fd, &c, 1, off) == 1);
    close(fd);
}

static void test_faults(const struct rt_dataset *ds_good)
{
    char copy[700], cmd[1600], shard[900];
    struct rt_dataset *ds;
    const struct rt_split_info *si = &rt_dataset_info(ds_good)->split[RT_SPLIT_TRAIN];

    snprintf(copy, sizeof(copy), "%s/corrupt", g_dir);
    snprintf(cmd, sizeof(cmd), "cp -r '%s' '%s'", g_data, copy);
    CHECK(system(cmd) == 0);
    snprintf(shard, sizeof(shard), "%s/%s", copy, si->shards[1].file);
    struct rt_shard *s;
    if (rt_shard_open(shard, &s) < 0) {
        CHECKF(0, "%s", rt_errmsg());
        return;
    }
    const struct rt_block_entry *e = &rt_shard_blocks(s)[2];
    long off = (long)e->offset + 5;
    rt_shard_close(s);
    corrupt_byte(shard, off);
    CHECK_OK(rt_dataset_open(copy, &ds));
    for (int sh = 0; sh < 2; sh++) {
        struct rt_loader_opts o = base_opts(sh ? RT_SHUFFLE_WINDOW : RT_SHUFFLE_EXACT);
        uint64_t d, n;
        o.epochs = 2;
        CHECK(digest_run(ds, &o, &d, &n) == -EBADMSG);
        CHECKF(strstr(rt_errmsg(), si->shards[1].file) && strstr(rt_errmsg(), "block 2") &&
                   strstr(rt_errmsg(), "records"),
               "message: %s", rt_errmsg());
    }
    rt_dataset_close(ds);

    /* A missing shard is refused before any thread starts. */
    unlink(shard);
    CHECK_OK(rt_dataset_open(copy, &ds));
    struct rt_loader_opts o = base_opts(RT_SHUFFLE_EXACT);
    uint64_t d, n;
    CHECK(digest_run(ds, &o, &d, &n) < 0);
    CHECKF(strstr(rt_errmsg(), si->shards[1].file) != NULL, "message: %s", rt_errmsg());
    rt_dataset_close(ds);

    /* Too few records for one full batch per rank under drop. */
    o.batch = 4096;
    CHECK(digest_run(ds_good, &o, &d, &n) < 0);
    CHECKF(strstr(rt_errmsg(), "too few") != NULL, "message: %s", rt_errmsg());
}

/* The spelling: each spec parses and reads back as its canonical form, which parses to the same rt_aug. */
static void test_augment_spelling(void)
{
    static const char *const ok[][2] = {
        {"none", "none"},
        {"crop+flip", "crop=4,flip"},
        {"crop=2,reflect,alternate-flip", "crop=2,reflect,alternate-flip"},
        {"flip,jitter=0.4", "flip,jitter=0.4"},
        {"brightness=0.2,saturation=0.5", "brightness=0.2,saturation=0.5"},
        {"erase", "erase=0.5"},
        {"erase=0.25:0.1:0.2,cutout=16", "erase=0.25:0.1:0.2,cutout=16"},
        {"erase=1:0.02:0.33:0.5:2", "erase=1:0.02:0.33:0.5:2"},
        {"flip,crop,crop-ratio=0.5:2,crop-scale=0.35:1", "crop=4,crop-scale=0.35:1,crop-ratio=0.5:2,flip"},
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(ok); i++) {
        struct rt_aug a, b;
        char text[256];
        CHECKF(rt_aug_parse(ok[i][0], &a) == 0, "'%s': %s", ok[i][0], rt_errmsg());
        rt_aug_describe(&a, text, sizeof(text));
        CHECKF(!strcmp(text, ok[i][1]), "'%s' reads back as '%s', not '%s'", ok[i][0], text, ok[i][1]);
        CHECKF(rt_aug_parse(text, &b) == 0 && !memcmp(&a, &b, sizeof(a)), "'%s' does not parse to the same", text);
    }
    static const char *const bad[][2] = {
        {"crop,sharpen", "sharpen"}, {"crop=-1", "crop=PAD"}, {"erase=0", "probability"},
        {"erase=0.5:0.3:0.1", "SMIN:SMAX"}, {"erase=0.5:0.1", "1, 3 or 5"}, {"jitter", "strength"},
        {"cutout=0", "cutout=SIZE"}, {"reflect=1", "no value"}, {"", "empty"},
        {"crop-scale=0:1", "crop-scale=MIN:MAX"}, {"crop-scale=0.5:1.5", "<= 1"}, {"crop-ratio=2:1", "crop-ratio"},
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(bad); i++) {
        struct rt_aug a;
        CHECKF(rt_aug_parse(bad[i][0], &a) == -EINVAL && strstr(rt_errmsg(), bad[i][1]),
               "'%s' gave '%s', wanted a message naming '%s'", bad[i][0], rt_errmsg(), bad[i][1]);
    }
    struct rt_aug j = {.jitter = {0.5f, 0, 0}};
    CHECK(rt_aug_check(&j, 3, 8, 8) == 0 && rt_aug_check(&j, 1, 8, 8) == 0 && rt_aug_check(&j, 2, 8, 8) == -EINVAL);
}

/*
 * Erasing and Cutout on both crop paths (the padded buffer and row by row):
 * inside their rectangles every pixel is the fill, outside the image is the
 * crop alone; rt_augment_pixels on the crop gives rt_augment's image.
 */
static void test_augment_erase(void)
{
    static const int shapes[][3] = {{3, 32, 32}, {3, 200, 120}};
    for (size_t si = 0; si < RT_ARRAY_LEN(shapes); si++) {
        const uint32_t c = (uint32_t)shapes[si][0], h = (uint32_t)shapes[si][1], w = (uint32_t)shapes[si][2];
        const size_t n = (size_t)c * h * w;
        uint8_t *src = malloc(n), *got = malloc(n), *crop = malloc(n);
        struct rt_rng r;
        rt_rng_init(&r, 7, si);
        for (size_t i = 0; i < n; i++)
            src[i] = (uint8_t)(rt_rng_u32(&r) | 1); /* never the fill, 0 */
        struct rt_aug a, geo = {.pad = 4, .flip = RT_FLIP_RANDOM};
        CHECK(rt_aug_parse("crop,flip,erase=0.9,cutout=9", &a) == 0);
        int erased = 0;
        for (uint64_t id = 0; id < 40; id++) {
            struct rt_aug_draw d;
            rt_aug_draw(&a, 3, 2, id, h, w, &d);
            rt_augment(&a, 3, 2, id, c, h, w, src, got);
            rt_augment(&geo, 3, 2, id, c, h, w, src, crop);
            erased += d.erase[2] > 0;
            size_t wrong = 0;
            for (uint32_t ch = 0; ch < c; ch++)
                for (uint32_t y = 0; y < h; y++)
                    for (uint32_t x = 0; x < w; x++) {
                        const size_t k = ((size_t)ch * h + y) * w + x;
                        const int in = (y - d.erase[0] < d.erase[2] && x - d.erase[1] < d.erase[3]) ||
                                       (y - d.cut[0] < d.cut[2] && x - d.cut[1] < d.cut[3]);
                        wrong += got[k] != (in ? 0 : crop[k]);
                    }
            CHECKF(!wrong, "%ux%ux%u id %" PRIu64 ": %zu pixels wrong", c, h, w, id, wrong);
            rt_augment_pixels(&a, 3, 2, id, c, h, w, crop);
            CHECKF(!memcmp(crop, got, n), "%ux%ux%u id %" PRIu64 ": rt_augment_pixels differs", c, h, w, id);
        }
        CHECKF(erased > 28, "%d of 40 erased at p 0.9", erased);
        free(src);
        free(got);
        free(crop);
    }
}

int main(void)
{
    const int small = getenv("RT_TEST_SMALL") && atoi(getenv("RT_TEST_SMALL"));
    struct rt_synth_opts so = {.format = RT_SYNTH_CIFAR10, .train = small ? 600 : 2000, .test = small ? 150 : 500,
                               .seed = 5, .threads = 2};
    struct rt_pack_opts po = {.codec = RT_CODEC_RAW, .shard_bytes = 256 << 10, .block_records = 13, .threads = 2};
    char src[600];
    struct rt_dataset *ds;

    tu_tempdir(g_dir, sizeof(g_dir), "loader");
    snprintf(src, sizeof(src), "%s/src", g_dir);
    snprintf(g_data, sizeof(g_data), "%s/data", g_dir);
    if (rt_synth_write(src, &so) < 0 || rt_pack(src, g_data, &po, NULL) < 0 || rt_dataset_open(g_data, &ds) < 0) {
        fprintf(stderr, "set-up failed: %s\n", rt_errmsg());
        return 1;
    }
    g_train = tu_read_split(g_data, RT_SPLIT_TRAIN, &g_pixels, &g_labels);
    CHECK(g_train == (long)so.train);
    CHECK(rt_dataset_info(ds)->split[RT_SPLIT_TRAIN].nshards >= 3);

    test_determinism(ds);
    test_contents(ds);
    if (!small) /* single-threaded arithmetic: nothing for the ThreadSanitizer run to see */
        test_augment_shapes();
    test_augment_spelling();
    test_augment_erase();
    test_eval_pad(ds);
    test_resume(ds);
    test_global_position(ds);
    test_faults(ds);

    rt_dataset_close(ds);
    free(g_pixels);
    free(g_labels);
    rt_remove_tree(g_dir);
    printf("test_loader: %d checks\n", check_count);
    return check_result();
}
