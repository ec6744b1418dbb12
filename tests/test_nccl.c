/*
 * test_nccl.c - the bucketer in NCCL mode under mpirun -np N (1, 2): device
 * gradients of tensors with alignment gaps hold small integers whose sums are
 * exact in floats; "backward" writes them tensor by tensor on a compute
 * stream (asynchronous copies from pinned memory) and reports each one final,
 * as compute does; the bucketer all-reduces them through NCCL with one bucket
 * per tensor, a middle cap and one bucket for everything, overlapped and
 * with no_overlap, over two steps each. Every float of the buffer (gaps too)
 * must be the exact sum, the control word the OR of every rank's bit, and
 * the counts the buckets. At np 1 the sum is the input, through NCCL all the
 * same. Then the plan check in NCCL mode and the device refusal.
 *
 * `test_nccl local`, a plain process (no mpirun): the world of one made in
 * this process (rt_nccl_create_local) on GPU 0, no MPI at all. A plan with a
 * first bucket at first_cap, body buckets at cap, a tensor larger than the
 * cap alone, and a tail of three tensors within first_cap; each bucket's
 * all-reduce must start as soon as its last tensor is reported final, and
 * every float of the buffer (gaps too) must come back as the sum over the one
 * rank, exactly: multiples of 1/4, overlapped and not, two steps each.
 *
 * Exit 0 pass, 1 fail, 77 skip: not under an MPI launcher (local: under one
 * with more than one rank), no NCCL in this build, no usable GPU, or fewer
 * GPUs than ranks on the node (np 2 on a machine with one GPU). The skip is
 * agreed by all ranks.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm/comm.h"
#include "common/common.h"

#ifdef RT_HAVE_NCCL
#include <cuda_runtime.h>

#define CUDA_OK(call)                                                                                                \
    do {                                                                                                             \
        cudaError_t e_ = (call);                                                                                     \
        if (e_ != cudaSuccess) {                                                                                     \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));                   \
            exit(1);                                                                                                 \
        }                                                                                                            \
    } while (0)

enum { NT = 13 };
static struct rt_bucket_tensor tensors[NT];
static char names[NT][16];

/* Tensors in a shuffled table, 64-float alignment gaps between them, as
 * compute lays them out; returns the buffer's length in floats. */
static size_t layout(void)
{
    size_t off = 0;
    for (int i = 0; i < NT; i++) {
        size_t n = (size_t)(i % 5 == 0 ? 70000 + 1000 * i : 1 + 97 * i);
        snprintf(names[i], sizeof(names[i]), "t%d", i);
        tensors[(i * 5) % NT] = (struct rt_bucket_tensor){names[i], off, n};
        off = (off + n + 63) / 64 * 64;
    }
    return off;
}

static float value(size_t i, int rank)
{
    return (float)(rank + 1 + (int)(i % 7));
}

static float expect(size_t i, int world)
{
    return (float)(world * (world + 1) / 2 + world * (int)(i % 7));
}

/* "Backward": for each tensor in buffer order, the compute stream writes it
 * (and the gap after it) from pinned memory, then reports it final; stops at
 * the tensor that starts at stop_at. The copies are asynchronous: only the
 * bucketer's event makes the all-reduce wait for them. */
static void backward(struct rt_bucketer *b, float *dev, const float *pinned, size_t total, cudaStream_t compute,
                     size_t stop_at)
{
    size_t starts[NT];
    for (int i = 0; i < NT; i++)
        starts[i] = tensors[i].offset;
    for (int i = 0; i < NT; i++) /* few: insertion sort */
        for (int j = i; j > 0 && starts[j] < starts[j - 1]; j--) {
            size_t t = starts[j];
            starts[j] = starts[j - 1];
            starts[j - 1] = t;
        }
    for (int i = 0; i < NT && starts[i] < stop_at; i++) {
        size_t end = i + 1 < NT ? starts[i + 1] : total;
        CUDA_OK(cudaMemcpyAsync(dev + starts[i], pinned + starts[i], (end - starts[i]) * sizeof(float),
                                cudaMemcpyHostToDevice, compute));
        rt_bucketer_ready(b, end);
    }
}

static void bucketer(struct rt_comm *c, struct rt_nccl *n, int rank, int world)
{
    size_t total = layout();
    float *dev = NULL, *pinned = NULL, *back = NULL;
    cudaStream_t compute;
    CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    CUDA_OK(cudaMalloc((void **)&dev, total * sizeof(float)));
    CUDA_OK(cudaMallocHost((void **)&pinned, total * sizeof(float)));
    CUDA_OK(cudaMallocHost((void **)&back, total * sizeof(float)));
    for (size_t i = 0; i < total; i++)
        pinned[i] = value(i, rank);

    const size_t caps[] = {1024, 64 << 10, (size_t)1 << 30};
    for (size_t k = 0; k < RT_ARRAY_LEN(caps); k++) {
        for (int overlap = 0; overlap < 2; overlap++) {
            struct rt_bucket_opts o = {.cap_bytes = caps[k], .first_cap_bytes = caps[k] / 2, .no_overlap = !overlap,
                                       .nccl = n, .stream = compute};
            struct rt_bucketer *b = NULL;
            CHECK_OK(rt_bucketer_create(c, dev, total, tensors, NT, &o, &b));
            if (!b)
                continue;
            int nb = rt_bucketer_count(b);
            if (caps[k] == 1024)
                CHECKF(nb == NT, "1 KB cap: %d buckets for %d tensors", nb, NT);
            if (caps[k] == (size_t)1 << 30)
                CHECKF(nb == 1, "whole-buffer cap: %d buckets", nb);
            for (int step = 0; step < 2; step++) {
                /* Garbage (NaN bytes) where "backward" has not written yet. */
                CUDA_OK(cudaMemsetAsync(dev, 0xff, total * sizeof(float), compute));
                struct rt_comm_counts c0, c1;
                rt_comm_counts(c, &c0);
                rt_bucketer_begin(b, (uint64_t)(10 * k + step));
                backward(b, dev, pinned, total, compute, total);
                rt_comm_counts(c, &c1);
                /* NCCL mode counts its all-reduces, at np 1 too: they went through NCCL. */
                CHECKF(c1.bucket_allreduces - c0.bucket_allreduces == (uint64_t)(overlap ? nb : 0),
                       "cap %zu overlap %d: %lu queued during backward of %d", caps[k], overlap,
                       (unsigned long)(c1.bucket_allreduces - c0.bucket_allreduces), nb);
                uint32_t flags = 0;
                uint64_t wait_ns = UINT64_MAX;
                CHECK_OK(rt_bucketer_finish(b, 1u << (rank % 32), &flags, &wait_ns));
                CHECKF(flags == (world >= 32 ? 0xffffffffu : (1u << world) - 1), "flags %#x", flags);
                CHECKF(wait_ns < (uint64_t)60e9, "wait %lu ns", (unsigned long)wait_ns);
                rt_comm_counts(c, &c1);
                CHECK(c1.bucket_allreduces - c0.bucket_allreduces == (uint64_t)nb);
                /* Queued behind finish on the compute stream, as the optimizer would be. */
                CUDA_OK(cudaMemcpyAsync(back, dev, total * sizeof(float), cudaMemcpyDeviceToHost, compute));
                CUDA_OK(cudaStreamSynchronize(compute));
                size_t bad = 0, first = total;
                for (size_t i = 0; i < total; i++)
                    if (back[i] != expect(i, world)) {
                        bad++;
                        first = RT_MIN(first, i);
                    }
                CHECKF(bad == 0, "cap %zu overlap %d step %d: %zu of %zu sums wrong (first at %zu: %g, want %g)",
                       caps[k], overlap, step, bad, total, first, bad ? (double)back[first] : 0.0,
                       bad ? (double)expect(first, world) : 0.0);
            }
            rt_bucketer_destroy(b);
        }
    }

    /* The plan check in NCCL mode: what was queued completes, the missing
     * tensor is named. Every rank misses the same one. */
    struct rt_bucket_opts o = {.cap_bytes = 64 << 10, .nccl = n, .stream = compute};
    struct rt_bucketer *b = NULL;
    CHECK_OK(rt_bucketer_create(c, dev, total, tensors, NT, &o, &b));
    if (b) {
        size_t cut = 0;
        for (int i = 0; i < NT; i++)
            if (!strcmp(tensors[i].name, "t11"))
                cut = tensors[i].offset;
        rt_bucketer_begin(b, 9);
        backward(b, dev, pinned, total, compute, cut);
        uint32_t flags;
        CHECK_ERR(rt_bucketer_finish(b, 0, &flags, NULL), "t11");
        rt_bucketer_destroy(b);
    }
    /* A bad plan is refused before any device state is made. */
    struct rt_bucket_tensor overl[2] = {{"a", 0, 100}, {"b", 50, 100}};
    CHECK_ERR(rt_bucketer_create(c, dev, total, overl, 2, &o, &b), "overlaps");

    CUDA_OK(cudaFreeHost(back));
    CUDA_OK(cudaFreeHost(pinned));
    CUDA_OK(cudaFree(dev));
    CUDA_OK(cudaStreamDestroy(compute));
}

/* ---- the local world of one ------------------------------------------------------------ */

/* Tensors in buffer order, floats; 64-float alignment gaps between them. With a first cap of 4096 floats and a
 * cap of 16384 the plan is: {0, 1} (first bucket, up to first_cap), {2, 3} and {4} (up to cap), {5} (over the
 * cap: alone), {6, 7, 8} (the tail: the last tensors within first_cap). */
enum { LT = 9, LB = 5 };
static const size_t local_count[LT] = {1000, 2000, 3000, 9000, 5000, 20000, 2500, 1000, 500};
static const int local_first[LB + 1] = {0, 2, 4, 5, 6, LT}; /* bucket k holds tensors [first[k], first[k + 1]) */
static const size_t local_first_cap = 4096 * sizeof(float), local_cap = 16384 * sizeof(float);

/* A multiple of 1/4 in [-32, 31.75]: exact in floats, and so is any sum of a few. */
static float local_value(size_t i)
{
    return (float)((int)(i % 256) - 128) * 0.25f;
}

static void local_world(struct rt_comm *c, struct rt_nccl *n)
{
    struct rt_bucket_tensor t[LT];
    char tname[LT][16];
    size_t start[LT], off = 0;
    for (int i = 0; i < LT; i++) {
        start[i] = off;
        snprintf(tname[i], sizeof(tname[i]), "s%d", i);
        /* The table in another order than the buffer, as a model hands it over. */
        t[(i * 4) % LT] = (struct rt_bucket_tensor){tname[i], off, local_count[i]};
        off = (off + local_count[i] + 63) / 64 * 64;
    }
    const size_t total = off;
    float *dev = NULL, *pinned = NULL, *back = NULL;
    cudaStream_t compute;
    CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    CUDA_OK(cudaMalloc((void **)&dev, total * sizeof(float)));
    CUDA_OK(cudaMallocHost((void **)&pinned, total * sizeof(float)));
    CUDA_OK(cudaMallocHost((void **)&back, total * sizeof(float)));
    for (size_t i = 0; i < total; i++)
        pinned[i] = local_value(i);

    for (int overlap = 0; overlap < 2; overlap++) {
        struct rt_bucket_opts o = {.cap_bytes = local_cap, .first_cap_bytes = local_first_cap,
                                   .no_overlap = !overlap, .nccl = n, .stream = compute};
        struct rt_bucketer *b = NULL;
        CHECK_OK(rt_bucketer_create(c, dev, total, t, LT, &o, &b));
        if (!b)
            continue;
        const int nb = rt_bucketer_count(b);
        CHECKF(nb == LB, "local: %d buckets, planned %d", nb, LB);
        for (int k = 0; k < nb && nb == LB; k++) {
            size_t bo, bc;
            char bnames[120];
            rt_bucketer_bucket(b, k, &bo, &bc, bnames, sizeof(bnames));
            const size_t end = k + 1 < LB ? start[local_first[k + 1]] : total;
            CHECKF(bo == start[local_first[k]] && bc == end - bo, "local: bucket %d is [%zu, +%zu), planned [%zu, %zu)",
                   k, bo, bc, start[local_first[k]], end);
            char want[120];
            const int t0 = local_first[k], t1 = local_first[k + 1] - 1;
            if (t0 == t1)
                snprintf(want, sizeof(want), "s%d", t0);
            else
                snprintf(want, sizeof(want), "%d tensors, s%d .. s%d", t1 - t0 + 1, t0, t1);
            CHECKF(!strcmp(bnames, want), "local: bucket %d names '%s', expected '%s'", k, bnames, want);
        }
        for (int step = 0; step < 2; step++) {
            /* NaN bytes until "backward" writes: a float the copies or the all-reduces missed would show. */
            CUDA_OK(cudaMemsetAsync(dev, 0xff, total * sizeof(float), compute));
            struct rt_comm_counts c0, c1;
            rt_comm_counts(c, &c0);
            rt_bucketer_begin(b, (uint64_t)step);
            int done = 0; /* buckets whose last tensor is final */
            for (int i = 0; i < LT; i++) {
                const size_t end = i + 1 < LT ? start[i + 1] : total;
                CUDA_OK(cudaMemcpyAsync(dev + start[i], pinned + start[i], (end - start[i]) * sizeof(float),
                                        cudaMemcpyHostToDevice, compute));
                rt_bucketer_ready(b, end);
                while (done < LB && local_first[done + 1] <= i + 1)
                    done++;
                rt_comm_counts(c, &c1);
                CHECKF(c1.bucket_allreduces - c0.bucket_allreduces == (uint64_t)(overlap ? done : 0),
                       "local overlap %d step %d: after tensor %d, %lu all-reduces started, expected %d", overlap,
                       step, i, (unsigned long)(c1.bucket_allreduces - c0.bucket_allreduces), overlap ? done : 0);
            }
            uint32_t flags = 0;
            uint64_t wait_ns = UINT64_MAX;
            CHECK_OK(rt_bucketer_finish(b, 0x5u, &flags, &wait_ns));
            CHECKF(flags == 0x5u, "local: flags %#x, expected this rank's 0x5", flags);
            CHECKF(wait_ns < (uint64_t)60e9, "local: wait %lu ns", (unsigned long)wait_ns);
            rt_comm_counts(c, &c1);
            CHECK(c1.bucket_allreduces - c0.bucket_allreduces == (uint64_t)LB);
            /* Behind finish on the compute stream, where the optimizer would read. */
            CUDA_OK(cudaMemcpyAsync(back, dev, total * sizeof(float), cudaMemcpyDeviceToHost, compute));
            CUDA_OK(cudaStreamSynchronize(compute));
            size_t bad = 0, first = total;
            for (size_t i = 0; i < total; i++)
                if (back[i] != 1.0f * local_value(i)) { /* the sum over a world of one */
                    bad++;
                    first = RT_MIN(first, i);
                }
            CHECKF(bad == 0, "local overlap %d step %d: %zu of %zu sums wrong (first at %zu: %g, want %g)", overlap,
                   step, bad, total, first, bad ? (double)back[first] : 0.0,
                   bad ? (double)local_value(first) : 0.0);
        }
        rt_bucketer_destroy(b);
    }
    CUDA_OK(cudaFreeHost(back));
    CUDA_OK(cudaFreeHost(pinned));
    CUDA_OK(cudaFree(dev));
    CUDA_OK(cudaStreamDestroy(compute));
}

/* `test_nccl local`: a plain process, no MPI launcher. */
static int main_local(void)
{
    struct rt_comm *c;
    struct rt_comm_opts co = {.timeout_s = 120};
    if (rt_comm_create(&co, &c) < 0) {
        fprintf(stderr, "rt_comm_create: %s\n", rt_errmsg());
        return 1;
    }
    if (rt_comm_info(c)->world != 1) {
        fprintf(stderr, "skip: the local world is one process; this is one of %d\n", rt_comm_info(c)->world);
        rt_comm_destroy(c);
        return 77;
    }
    int ngpu = 0;
    cudaError_t e = cudaGetDeviceCount(&ngpu);
    if (e != cudaSuccess || ngpu == 0) {
        cudaGetLastError();
        fprintf(stderr, "skip: no usable GPU (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        rt_comm_destroy(c);
        return 77;
    }
    struct rt_nccl *bad = NULL;
    CHECK_ERR(rt_nccl_create_local(c, ngpu + 7, &bad), "GPU");
    CHECK(bad == NULL);
    struct rt_nccl *n = NULL;
    CHECK_OK(rt_nccl_create_local(c, 0, &n));
    if (n) {
        const char *d = rt_nccl_describe(n);
        CHECKF(strstr(d, "NCCL 2.") && strstr(d, "on GPU 0") && strstr(d, "one rank"), "describe: '%s'", d);
        printf("test_nccl local: %s\n", d);
        local_world(c, n);
        rt_nccl_destroy(n);
    }
    rt_comm_destroy(c);
    return check_result();
}

static const char *env_get(void *ctx, const char *name)
{
    (void)ctx;
    return getenv(name);
}
#endif /* RT_HAVE_NCCL */

int main(int argc, char **argv)
{
    const int local = argc > 1 && !strcmp(argv[1], "local");
    if (!local && !getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMIX_RANK")) {
        fprintf(stderr, "skip: run under mpirun (ctest does)\n");
        return 77;
    }
    if (!rt_nccl_available()) {
        fprintf(stderr, "skip: this build has no NCCL\n");
        return 77;
    }
#ifdef RT_HAVE_NCCL
    if (local)
        return main_local();
    struct rt_comm *c;
    struct rt_comm_opts co = {.timeout_s = 120};
    if (rt_comm_create(&co, &c) < 0) {
        fprintf(stderr, "rt_comm_create: %s\n", rt_errmsg());
        return 1;
    }
    const struct rt_rank_info *ri = rt_comm_info(c);
    int rank = ri->rank, world = ri->world;
    int ngpu = 0, device = -1;
    char note[1024] = "", why[512] = "";
    cudaError_t e = cudaGetDeviceCount(&ngpu);
    if (e != cudaSuccess || ngpu == 0)
        snprintf(why, sizeof(why), "no usable GPU (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
    else if (rt_gpu_preflight(ngpu, ri->local_rank, ri->local_world, env_get, NULL, &device, note, sizeof(note)) < 0)
        snprintf(why, sizeof(why), "%s", rt_errmsg());
    /* Every rank runs or every rank skips: a lone skipper would leave the
     * others in NCCL's set-up. */
    int64_t can = why[0] == 0;
    rt_comm_allreduce(c, &can, 1, RT_COMM_I64, RT_RED_MIN, "test: can every rank run");
    if (!can) {
        if (why[0])
            fprintf(stderr, "skip: rank %d: %s\n", rank, why);
        rt_comm_destroy(c);
        return 77;
    }
    if (rank == 0 && note[0])
        fprintf(stderr, "note: %s\n", note);

    struct rt_nccl *bad = NULL;
    CHECK_ERR(rt_nccl_create(c, ngpu + 7, &bad), "GPU");
    CHECK(bad == NULL);
    if (world > 1) /* refused before any NCCL call: no peer is left waiting */
        CHECK_ERR(rt_nccl_create_local(c, device, &bad), "world of one");
    struct rt_nccl *n = NULL;
    CHECK_OK(rt_nccl_create(c, device, &n));
    if (n) {
        const char *d = rt_nccl_describe(n);
        CHECKF(strstr(d, "NCCL 2.") && strstr(d, "transport:"), "describe: '%s'", d);
        if (rank == 0)
            printf("test_nccl: %s\n", d);
        bucketer(c, n, rank, world);
        rt_nccl_destroy(n);
    }
    int64_t fails = check_result() != 0;
    rt_comm_allreduce(c, &fails, 1, RT_COMM_I64, RT_RED_SUM, "test verdict");
    if (rank == 0)
        printf("test_nccl: %d ranks, %d checks on rank 0, %ld rank(s) failed\n", world, check_count, (long)fails);
    rt_comm_destroy(c);
    return fails ? 1 : 0;
#else
    return 77;
#endif
}
