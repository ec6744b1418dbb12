/*
 * test_ddp.c - data-parallel training equals one process with the whole
 * batch. Under mpirun -np W, each rank runs the training step of `ringtrain
 * train` through the pipeline driver's own functions (tools/train/train.h:
 * the same bucket plan, step options and update as the command) on its
 * synthetic batch of B samples. As the reference, every rank also gathers
 * all W batches and computes, alone, the gradient of the W*B samples' mean
 * loss on a model of its own (the W shares as micro-batches, each with the
 * dropout masks its rank draws: offset (micro-batch x W + rank) << 32), and
 * steps SGD. After each of a few updates the all-reduced gradients and the
 * parameters must match the reference within a stated tolerance, and be
 * bitwise equal across ranks. Two bucket caps (many small buckets, and
 * 25 MB) and no-overlap give the same.
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
#include "tools/train/train.h"

enum { B = 8, C = 3, H = 16, WD = 16, CLASSES = 10, STEPS = 3 };
static const float LR = 0.05f;

/* Tolerance: the reference adds the ranks' shares in one order, the
 * all-reduce in its own; float rounding differs by a few ulps of the largest term. */
static const double ATOL = 1e-6, RTOL = 2e-4;

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

/* The reference: the whole gathered batch (W shares) through `ref` alone, as one update's gradient. */
static void reference_grads(struct rt_model *ref, int world, uint64_t micro, const uint8_t *img, const int32_t *lab,
                            struct rt_loss_stats *st)
{
    static const float mean[C] = {0.5f, 0.5f, 0.5f}, std[C] = {0.25f, 0.25f, 0.25f};
    const size_t per = (size_t)C * H * WD;
    rt_model_zero_grads(ref);
    for (int r = 0; r < world; r++) {
        struct rt_step_opts so = {.mode = RT_TRAIN, .grad_scale = 1.0f / ((float)B * (float)world),
                                  .dropout_stream = micro * (uint64_t)world + (uint64_t)r, .mean = mean,
                                  .std = std};
        CHECK_OK(rt_model_step(ref, &so, B, img + (size_t)r * B * per, lab + r * B, st));
    }
}

static int run(struct rt_comm *comm, double cap_mb, int no_overlap, uint64_t *digest_out)
{
    const int world = rt_comm_info(comm)->world;
    const size_t per = (size_t)C * H * WD;
    struct train_cfg c = {
        .model = "mnist-net", .epochs = 1, .batch = B, .lr = LR, .sched = RT_SCHED_CONSTANT, .warmup_epochs = -1,
        .step_epochs = 30, .gamma = 0.1f, .grad_accum = 1, .seed = 11, .workers = 1, .threads = 1, .synthetic = 1,
        .syn_c = C, .syn_h = H, .syn_w = WD, .syn_classes = CLASSES, .pin = RT_PIN_OFF, .device = DEVICE_CPU,
        .amp = AMP_OFF, /* fp32, as the whole-batch reference model: auto would take bf16 on a CPU that has it */
        .bucket_cap_mb = cap_mb, .no_overlap = no_overlap, .comm = comm,
        .optim = {.kind = RT_OPT_SGD, .momentum = 0.9f, .weight_decay = 5e-4f}};
    struct train *T = NULL;
    if (train_create(&c, &T) < 0) {
        fprintf(stderr, "train_create: %s\n", rt_errmsg());
        train_destroy(T);
        return -1;
    }
    struct rt_model_opts mo = {.name = c.model, .c = C, .h = H, .w = WD, .classes = CLASSES, .batch = B,
                               .seed = c.seed};
    struct rt_model *ref;
    struct rt_optim *ropt;
    CHECK_OK(rt_model_create(rt_model_backend(train_model(T)), &mo, &ref));
    const size_t np = rt_model_param_count(ref);
    CHECK(np == rt_model_param_count(train_model(T)));
    CHECK_OK(rt_optim_create(ref, &c.optim, &ropt));

    uint8_t *img = malloc((size_t)world * B * per);
    int32_t *lab = malloc((size_t)world * B * sizeof(int32_t));
    float *g_ddp = malloc(np * sizeof(float)), *g_ref = malloc(np * sizeof(float));
    float *p_ddp = malloc(np * sizeof(float)), *p_ref = malloc(np * sizeof(float));
    for (int step = 0; step < STEPS; step++) {
        struct train_batch b;
        CHECK(train_input_next(T, &b) == 1 && train_step_size(T) == 1);
        /* b.images is the backend's input buffer (host memory on the CPU backend): read it once its copy is done
         * (with asynchronous streams the copy may still be under way). */
        rt_backend_input_wait(rt_model_backend(train_model(T)), b.ticket);
        rt_comm_allgather(comm, b.images, img, B * per, "the batches");
        rt_comm_allgather(comm, b.labels, lab, B * sizeof(int32_t), "the labels");
        const uint64_t micro = train_position(T).micro;
        CHECK_OK(train_step_forward_backward(T, &b, 0, 1));
        train_input_release(T, &b);
        CHECK_OK(train_step_reduce(T));
        rt_model_read(train_model(T), RT_MODEL_GRADS, 0, np, g_ddp);

        struct rt_loss_stats st_ref = {0};
        reference_grads(ref, world, micro, img, lab, &st_ref);
        rt_model_read(ref, RT_MODEL_GRADS, 0, np, g_ref);
        double scale, e = max_rel_err(g_ddp, g_ref, np, &scale);
        CHECKF(e <= 0, "cap %g overlap %d step %d: gradients off the whole-batch ones by %g beyond tolerance "
                       "(max |g| %g)",
               cap_mb, !no_overlap, step, e, scale);
        CHECK_OK(train_step_apply(T));
        /* The global loss equals the reference's (the update's sums are read from the device once applied). */
        const struct rt_loss_stats *mine = train_last_loss(T);
        double ls[2] = {mine->loss_sum, mine->count};
        rt_comm_allreduce(comm, ls, 2, RT_COMM_F64, RT_RED_SUM, "test loss");
        CHECKF(fabs(ls[0] - st_ref.loss_sum) <= 1e-4 * fabs(st_ref.loss_sum) && ls[1] == (double)world * B,
               "loss %g vs %g", ls[0], (double)st_ref.loss_sum);
        rt_optim_step(ropt, LR);
    }
    rt_model_read(train_model(T), RT_MODEL_PARAMS, 0, np, p_ddp);
    rt_model_read(ref, RT_MODEL_PARAMS, 0, np, p_ref);
    double scale, e = max_rel_err(p_ddp, p_ref, np, &scale);
    CHECKF(e <= 0, "parameters after %d steps off the whole-batch run by %g beyond tolerance", STEPS, e);
    /* Bitwise equal across ranks: the driver's own replica check. */
    CHECK_OK(train_replicas_check(T, digest_out));
    if (rt_comm_info(comm)->rank == 0)
        printf("cap %6.2f MB %-10s: parameters within %g + %g*max of the whole-batch run\n", cap_mb,
               no_overlap ? "no-overlap" : "overlap", ATOL, RTOL);
    free(img);
    free(lab);
    free(g_ddp);
    free(g_ref);
    free(p_ddp);
    free(p_ref);
    rt_optim_destroy(ropt);
    rt_model_destroy(ref);
    train_destroy(T);
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
    CHECK_OK(run(c, 0.05, 0, &d1));
    CHECK_OK(run(c, 25, 0, &d2));
    CHECK_OK(run(c, 25, 1, &d3));
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
