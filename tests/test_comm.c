/*
 * test_comm.c - the process group and the bucketer under mpirun -np N
 * (N = 1..4): collectives with inputs whose results are exactly predictable
 * (small integers in floats), bucket plans from one bucket per tensor to one
 * for the whole buffer giving the same sums, the control word, the plan check
 * naming a gradient that never arrived, and the collective counts.
 * Exit 0 pass, 1 fail, 77 skip (not started by an MPI launcher).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm/comm.h"
#include "common/common.h"

static void collectives(struct rt_comm *c, int rank, int world)
{
    enum { N = 1000 };
    float f[N];
    for (int i = 0; i < N; i++)
        f[i] = (float)((rank + 1) * (i % 50 + 1));
    rt_comm_allreduce(c, f, N, RT_COMM_F32, RT_RED_SUM, "test sum");
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += f[i] != (float)((i % 50 + 1) * world * (world + 1) / 2);
    CHECKF(bad == 0, "%d of %d sums wrong (f[1] = %g)", bad, N, (double)f[1]);

    double d[3] = {rank, 2.0 * rank, 1.0};
    rt_comm_allreduce(c, d, 3, RT_COMM_F64, RT_RED_AVG, "test avg");
    CHECKF(d[0] == (world - 1) / 2.0 && d[1] == world - 1.0 && d[2] == 1.0, "avg %g %g %g", d[0], d[1], d[2]);

    int64_t mx[2] = {rank * 10, -rank};
    rt_comm_allreduce(c, mx, 2, RT_COMM_I64, RT_RED_MAX, "test max");
    CHECK(mx[0] == (world - 1) * 10 && mx[1] == 0);
    int64_t mn[1] = {100 + rank};
    rt_comm_allreduce(c, mn, 1, RT_COMM_I64, RT_RED_MIN, "test min");
    CHECK(mn[0] == 100);

    int root = world - 1;
    uint64_t r[2] = {(uint64_t)rank + 1, 7};
    rt_comm_reduce(c, r, 2, RT_COMM_U64, RT_RED_SUM, root, "test reduce");
    if (rank == root)
        CHECKF(r[0] == (uint64_t)world * (world + 1) / 2 && r[1] == 7u * (uint64_t)world, "reduce %lu %lu",
               (unsigned long)r[0], (unsigned long)r[1]);
    else
        CHECK(r[0] == (uint64_t)rank + 1 && r[1] == 7); /* untouched off the root */

    char msg[64];
    snprintf(msg, sizeof(msg), rank == root ? "from the last rank" : "not this");
    rt_comm_broadcast(c, msg, sizeof(msg), root, "test broadcast");
    CHECKF(!strcmp(msg, "from the last rank"), "broadcast gave '%s'", msg);

    int32_t mine[2] = {rank, rank * rank}, *all = calloc((size_t)world * 2, sizeof(int32_t));
    rt_comm_allgather(c, mine, all, sizeof(mine), "test allgather");
    for (int i = 0; i < world; i++)
        CHECK(all[2 * i] == i && all[2 * i + 1] == i * i);
    free(all);

    rt_comm_barrier(c, -1, "test barrier");
    rt_comm_node_barrier(c, -1, "test node barrier");
    const struct rt_rank_info *ri = rt_comm_info(c);
    int v = ri->local_rank == 0 ? 4242 + ri->node : -1;
    rt_comm_node_broadcast(c, &v, sizeof(v), "test node broadcast");
    CHECK(v == 4242 + ri->node);

    /* A 16 MB all-reduce, the size of a large bucket. */
    size_t big = (size_t)4 << 20;
    float *g = malloc(big * sizeof(float));
    for (size_t i = 0; i < big; i++)
        g[i] = (float)(rank + (int)(i & 3));
    rt_comm_allreduce(c, g, big, RT_COMM_F32, RT_RED_SUM, "test big sum");
    bad = 0;
    for (size_t i = 0; i < big; i++)
        bad += g[i] != (float)(world * (world - 1) / 2 + world * (int)(i & 3));
    CHECKF(bad == 0, "%d wrong of the 16 MB sum", bad);
    free(g);
}

/* A gradient buffer of tensors with alignment gaps, as compute lays it out. */
enum { NT = 37 };
static struct rt_bucket_tensor tensors[NT];
static char names[NT][16];
static size_t layout(void)
{
    size_t off = 0;
    for (int i = 0; i < NT; i++) {
        size_t n = (size_t)(i % 5 == 0 ? 70000 + 1000 * i : 1 + 97 * i);
        snprintf(names[i], sizeof(names[i]), "t%d", i);
        /* a shuffled table: the bucketer sorts by offset */
        int slot = (i * 17) % NT;
        tensors[slot] = (struct rt_bucket_tensor){names[i], off, n};
        off = (off + n + 63) / 64 * 64;
    }
    return off;
}

static float expect(size_t i, int world)
{
    return (float)(world * (world + 1) / 2 + world * (int)(i % 7));
}

static void fill(float *g, size_t total, int rank)
{
    for (size_t i = 0; i < total; i++)
        g[i] = (float)(rank + 1 + (int)(i % 7));
}

/* Reports readiness tensor by tensor in buffer order, as backward does,
 * up to (not including) the tensor that starts at stop_at. */
static void backward_reports(struct rt_bucketer *b, size_t stop_at)
{
    size_t ends[NT];
    for (int i = 0; i < NT; i++)
        ends[i] = tensors[i].offset + tensors[i].count;
    for (int i = 0; i < NT; i++) /* few: insertion sort */
        for (int j = i; j > 0 && ends[j] < ends[j - 1]; j--) {
            size_t t = ends[j];
            ends[j] = ends[j - 1];
            ends[j - 1] = t;
        }
    for (int i = 0; i < NT && ends[i] <= stop_at; i++)
        rt_bucketer_ready(b, ends[i]);
}

static void bucketer(struct rt_comm *c, int rank, int world)
{
    size_t total = layout();
    float *g = calloc(total, sizeof(float));
    const size_t caps[] = {1024, 64 << 10, 300 << 10, 1 << 30};
    int prev_nb = 1 << 30;
    for (size_t k = 0; k < RT_ARRAY_LEN(caps); k++) {
        for (int overlap = 0; overlap < 2; overlap++) {
            struct rt_bucket_opts o = {.cap_bytes = caps[k], .first_cap_bytes = caps[k] / 2, .no_overlap = !overlap};
            struct rt_bucketer *b;
            CHECK_OK(rt_bucketer_create(c, g, total, tensors, NT, &o, &b));
            if (!b)
                continue;
            int nb = rt_bucketer_count(b);
            if (overlap)
                CHECKF(nb <= prev_nb, "cap %zu: %d buckets, more than a smaller cap's %d", caps[k], nb, prev_nb);
            prev_nb = nb;
            if (caps[k] == 1024)
                CHECKF(nb == NT, "1 KB cap: %d buckets for %d tensors", nb, NT);
            if (caps[k] == 1 << 30)
                CHECKF(nb == 1, "whole-buffer cap: %d buckets", nb);
            /* Buckets tile the buffer. */
            size_t at = 0;
            for (int i = 0; i < nb; i++) {
                size_t bo, bc;
                rt_bucketer_bucket(b, i, &bo, &bc, NULL, 0);
                CHECK(bo == at);
                at = bo + bc;
            }
            CHECK(at == total);
            /* The tail, which backward finishes last, is a small bucket of its own. */
            if (caps[k] >= (64 << 10) && caps[k] < (1 << 30)) {
                size_t lo, lc;
                rt_bucketer_bucket(b, nb - 1, &lo, &lc, NULL, 0);
                CHECKF(lc * sizeof(float) <= o.first_cap_bytes + 256, "cap %zu: last bucket %zu bytes", caps[k],
                       lc * sizeof(float));
            }
            struct rt_comm_counts c0, c1;
            for (int step = 0; step < 2; step++) {
                fill(g, total, rank);
                rt_comm_counts(c, &c0);
                rt_bucketer_begin(b, (uint64_t)step);
                backward_reports(b, total);
                rt_comm_counts(c, &c1);
                /* Overlap: every bucket started during "backward"; off: none. */
                if (world > 1)
                    CHECKF(c1.bucket_allreduces - c0.bucket_allreduces == (uint64_t)(overlap ? nb : 0),
                           "cap %zu overlap %d: %lu started during backward of %d", caps[k], overlap,
                           (unsigned long)(c1.bucket_allreduces - c0.bucket_allreduces), nb);
                uint32_t flags = 0;
                uint64_t wait_ns = 0;
                CHECK_OK(rt_bucketer_finish(b, 1u << (rank % 32), &flags, &wait_ns));
                CHECKF(flags == (world >= 32 ? 0xffffffffu : (1u << world) - 1), "flags %#x", flags);
                rt_comm_counts(c, &c1);
                CHECK(c1.bucket_allreduces - c0.bucket_allreduces == (uint64_t)(world > 1 ? nb : 0));
                int bad = 0;
                for (int i = 0; i < NT; i++)
                    for (size_t j = tensors[i].offset; j < tensors[i].offset + tensors[i].count; j++)
                        bad += g[j] != expect(j, world);
                CHECKF(bad == 0, "cap %zu overlap %d step %d: %d wrong sums", caps[k], overlap, step, bad);
            }
            rt_bucketer_destroy(b);
        }
    }

    /* The plan check: a gradient never reported final is named. */
    struct rt_bucket_opts o = {.cap_bytes = 64 << 10};
    struct rt_bucketer *b;
    CHECK_OK(rt_bucketer_create(c, g, total, tensors, NT, &o, &b));
    fill(g, total, rank);
    rt_bucketer_begin(b, 9);
    size_t cut = 0;
    for (int i = 0; i < NT; i++)
        if (!strcmp(tensors[i].name, "t30"))
            cut = tensors[i].offset;
    backward_reports(b, cut);
    uint32_t flags;
    CHECK_ERR(rt_bucketer_finish(b, 0, &flags, NULL), "t30");
    CHECK_ERR(rt_bucketer_finish(b, 0, &flags, NULL), "step 9");
    rt_bucketer_destroy(b);

    /* Bad plans. */
    struct rt_bucket_tensor overl[2] = {{"a", 0, 100}, {"b", 50, 100}};
    CHECK_ERR(rt_bucketer_create(c, g, total, overl, 2, &o, &b), "overlaps");
    struct rt_bucket_tensor out[1] = {{"c", total - 10, 100}};
    CHECK_ERR(rt_bucketer_create(c, g, total, out, 1, &o, &b), "leaves the buffer");
    free(g);
}

int main(void)
{
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMIX_RANK")) {
        fprintf(stderr, "skip: run under mpirun (ctest does)\n");
        return 77;
    }
    struct rt_comm *c;
    struct rt_comm_opts co = {.timeout_s = 60};
    if (rt_comm_create(&co, &c) < 0) {
        fprintf(stderr, "rt_comm_create: %s\n", rt_errmsg());
        return 1;
    }
    const struct rt_rank_info *ri = rt_comm_info(c);
    int rank = ri->rank, world = ri->world;
    CHECK(ri->source == RT_RANKS_MPI && ri->mpi);
    CHECK(ri->local_rank >= 0 && ri->local_rank < ri->local_world && ri->nodes >= 1);
    CHECK(rt_comm_default_threads(c) >= 1);
    collectives(c, rank, world);
    bucketer(c, rank, world);
    struct rt_comm_counts cc;
    rt_comm_counts(c, &cc);
    if (world > 1)
        CHECK(cc.other > 10);
    /* Every rank's verdict, so one failing rank fails the test everywhere. */
    int64_t fails = check_result() != 0;
    rt_comm_allreduce(c, &fails, 1, RT_COMM_I64, RT_RED_SUM, "test verdict");
    if (rank == 0)
        printf("test_comm: %d ranks, %d checks on rank 0, %ld rank(s) failed\n", world, check_count, (long)fails);
    rt_comm_destroy(c);
    return fails ? 1 : 0;
}
