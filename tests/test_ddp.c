/*
 * test_ddp.c - data-parallel training equals one process with the whole
 * batch. Under mpirun -np W, each rank runs mnist-net (no dropout, so the two
 * sides see the same function) on its B samples of a W*B batch, with the
 * bucketer hooked into backward, and steps SGD; every rank also runs the same
 * model on the whole W*B batch alone as the reference. After each of a few
 * steps the all-reduced gradients and the parameters must match the
 * reference within a stated tolerance, and be bitwise equal across ranks.
 * Two bucket caps (many small buckets, and 25 MB) and no-overlap give the same.
 * Exit 0 pass, 1 fail, 77 skip (not under an MPI launcher).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm/comm.h"
#include "common/common.h"
#include "compute/compute.h"

enum { B = 8, C = 3, H = 16, WD = 16, CLASSES = 10, STEPS = 3 };

/* Tolerance: the reference sums 2B samples in one GEMM, the ranks B each and
 * then add; float rounding differs by a few ulps of the largest term. */
static const double ATOL = 1e-6, RTOL = 2e-4;

struct hook {
    struct rt_bucketer *b;
    struct rt_comm *c;
    int calls;
    size_t last_ready;
    int monotonic;
};

static void on_ready(void *arg, size_t ready)
{
    struct hook *h = arg;
    h->calls++;
    if (ready < h->last_ready)
        h->monotonic = 0;
    h->last_ready = ready;
    rt_bucketer_ready(h->b, ready);
}

static double max_rel_err(const float *a, const float *ref, size_t n, double *scale)
{
    double mx = 0, worst = 0;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]) - (ATOL + RTOL * mx);
        worst = fmax(worst, e);
    }
    *scale = mx;
    return worst; /* > 0: out of tolerance */
}

static int run(struct rt_comm *comm, double cap_mb, int no_overlap, uint64_t *digest_out)
{
    const struct rt_rank_info *ri = rt_comm_info(comm);
    int rank = ri->rank, world = ri->world, N = B * world;
    struct rt_backend *be;
    struct rt_backend_opts bo = {.kind = RT_BACKEND_CPU, .threads = 1};
    if (rt_backend_create(&bo, &be) < 0)
        return -1;
    struct rt_model *m, *ref;
    struct rt_model_opts mo = {.name = "mnist-net", .c = C, .h = H, .w = WD, .classes = CLASSES, .batch = B,
                               .seed = 11};
    struct rt_model_opts ro = mo;
    ro.batch = N;
    struct rt_optim *opt, *ropt;
    struct rt_optim_opts oo = {.kind = RT_OPT_SGD, .momentum = 0.9f, .weight_decay = 5e-4f};
    CHECK_OK(rt_model_create(be, &mo, &m));
    CHECK_OK(rt_model_create(be, &ro, &ref));
    size_t np = rt_model_param_count(m);
    CHECK(np == rt_model_param_count(ref));
    CHECK_OK(rt_optim_create(be, &oo, np, &opt));
    CHECK_OK(rt_optim_create(be, &oo, np, &ropt));

    int count, nt = 0;
    const struct rt_tensor_info *tab = rt_model_tensors(m, &count);
    struct rt_bucket_tensor bt[64];
    for (int i = 0; i < count && nt < 64; i++)
        if (tab[i].kind == RT_PARAM)
            bt[nt++] = (struct rt_bucket_tensor){tab[i].name, tab[i].offset, tab[i].count};
    struct rt_bucket_opts bopts = {.cap_bytes = (size_t)(cap_mb * 1048576), .no_overlap = no_overlap};
    struct hook h = {.c = comm, .monotonic = 1};
    CHECK_OK(rt_bucketer_create(comm, rt_model_grads(m), np, bt, nt, &bopts, &h.b));

    uint8_t *img = malloc((size_t)N * C * H * WD);
    int32_t *lab = malloc((size_t)N * sizeof(int32_t));
    float *g_ddp = malloc(np * sizeof(float)), *g_ref = malloc(np * sizeof(float));
    float *p_ddp = malloc(np * sizeof(float)), *p_ref = malloc(np * sizeof(float));
    float mean[3] = {0.5f, 0.5f, 0.5f}, std[3] = {0.25f, 0.25f, 0.25f};
    const struct rt_ops *op = rt_backend_ops(be);
    struct rt_stream *s = rt_backend_stream(be);
    int worst_step = -1;
    for (int step = 0; step < STEPS; step++) {
        struct rt_rng r;
        rt_rng_init(&r, 1234, (uint64_t)step);
        for (size_t i = 0; i < (size_t)N * C * H * WD; i++)
            img[i] = (uint8_t)rt_rng_u32(&r);
        for (int i = 0; i < N; i++)
            lab[i] = (int32_t)rt_rng_below(&r, CLASSES);
        /* Reference: the whole batch in one process. */
        op->zero(s, rt_model_grads(ref), np * sizeof(float));
        struct rt_step_opts so = {.mode = RT_TRAIN, .grad_scale = 1.0f / (float)N, .no_dropout = 1, .mean = mean,
                                  .std = std};
        struct rt_loss_stats st = {0}, st_ref = {0};
        CHECK_OK(rt_model_step(ref, &so, N, img, lab, &st_ref));
        /* This rank's share, reduced through the bucketer. */
        op->zero(s, rt_model_grads(m), np * sizeof(float));
        so.grads_ready = on_ready;
        so.grads_ready_arg = &h;
        rt_bucketer_begin(h.b, (uint64_t)step);
        h.last_ready = 0;
        size_t per = (size_t)C * H * WD;
        CHECK_OK(rt_model_step(m, &so, B, img + (size_t)rank * B * per, lab + rank * B, &st));
        uint32_t flags;
        CHECK_OK(rt_bucketer_finish(h.b, 0, &flags, NULL));
        op->download(s, g_ddp, rt_model_grads(m), np * sizeof(float));
        op->download(s, g_ref, rt_model_grads(ref), np * sizeof(float));
        double scale, e = max_rel_err(g_ddp, g_ref, np, &scale);
        CHECKF(e <= 0, "cap %g overlap %d step %d: gradients off the whole-batch ones by %g beyond tolerance "
                       "(max |g| %g)",
               cap_mb, !no_overlap, step, e, scale);
        if (e > 0 && worst_step < 0)
            worst_step = step;
        /* The global loss equals the reference's. */
        double ls[2] = {st.loss_sum, st.count};
        rt_comm_allreduce(comm, ls, 2, RT_COMM_F64, RT_RED_SUM, "test loss");
        CHECKF(fabs(ls[0] - st_ref.loss_sum) <= 1e-4 * fabs(st_ref.loss_sum) && ls[1] == N, "loss %g vs %g",
               ls[0], (double)st_ref.loss_sum);
        rt_optim_step(opt, rt_model_params(m), rt_model_grads(m), 0.05f);
        rt_optim_step(ropt, rt_model_params(ref), rt_model_grads(ref), 0.05f);
    }
    CHECK(h.calls > 0 && h.monotonic);
    CHECKF(h.last_ready >= bt[0].count, "the last report covered %zu floats", h.last_ready);
    op->download(s, p_ddp, rt_model_params(m), np * sizeof(float));
    op->download(s, p_ref, rt_model_params(ref), np * sizeof(float));
    double scale, e = max_rel_err(p_ddp, p_ref, np, &scale);
    CHECKF(e <= 0, "parameters after %d steps off the whole-batch run by %g beyond tolerance", STEPS, e);
    /* Bitwise equal across ranks. */
    uint64_t d = 1469598103934665603ull;
    const unsigned char *pb = (const unsigned char *)p_ddp;
    for (size_t i = 0; i < np * sizeof(float); i++)
        d = (d ^ pb[i]) * 1099511628211ull;
    uint64_t *all = calloc((size_t)world, sizeof(uint64_t));
    rt_comm_allgather(comm, &d, all, sizeof(d), "test digests");
    for (int i = 0; i < world; i++)
        CHECKF(all[i] == all[0], "rank %d's parameters differ from rank 0's", i);
    *digest_out = d;
    if (rank == 0)
        printf("cap %6.2f MB %-10s: %2d buckets, parameters within %g + %g*max of the whole-batch run\n", cap_mb,
               no_overlap ? "no-overlap" : "overlap", rt_bucketer_count(h.b), ATOL, RTOL);
    free(all);
    free(img);
    free(lab);
    free(g_ddp);
    free(g_ref);
    free(p_ddp);
    free(p_ref);
    rt_bucketer_destroy(h.b);
    rt_optim_destroy(opt);
    rt_optim_destroy(ropt);
    rt_model_destroy(m);
    rt_model_destroy(ref);
    rt_backend_destroy(be);
    return 0;
}

int main(void)
{
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMIX_RANK")) {
        fprintf(stderr, "skip: run under mpirun (ctest does)\n");
        return 77;
    }
    struct rt_comm *c;
    struct rt_comm_opts co = {.timeout_s = 120};
    if (rt_comm_create(&co, &c) < 0) {
        fprintf(stderr, "rt_comm_create: %s\n", rt_errmsg());
        return 1;
    }
    uint64_t d1 = 0, d2 = 0, d3 = 0;
    run(c, 0.05, 0, &d1);
    run(c, 25, 0, &d2);
    run(c, 25, 1, &d3);
    /* Sums of two are exact whatever the chunking; beyond two ranks the MPI
     * library may pick another summation order per message size. */
    if (rt_comm_info(c)->world <= 2)
        CHECKF(d1 == d2 && d2 == d3, "bucket plans changed the result: %016lx %016lx %016lx", (unsigned long)d1,
               (unsigned long)d2, (unsigned long)d3);
    int64_t fails = check_result() != 0;
    rt_comm_allreduce(c, &fails, 1, RT_COMM_I64, RT_RED_SUM, "test verdict");
    rt_comm_destroy(c);
    return fails ? 1 : 0;
}
