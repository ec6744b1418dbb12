/*
 * test_train_step.c - the training step of `ringtrain train`, driven call by
 * call through the pipeline driver's own functions (tools/train/train.h) on
 * one rank:
 *  - accumulation: two micro-batches of an update leave the parameters alone
 *    after the first, and two such updates move the parameters as two of a
 *    single micro-batch do (the same batch twice at half the gradient scale,
 *    a model without dropout), to rounding;
 *  - loss scaling: injected overflows skip exactly those updates (parameters
 *    and the optimizer's count untouched), halve the scale each time, and
 *    too many in a row end the run naming the cause;
 *  - clipping: one SGD update moves the parameters by lr x max_norm;
 *  - a NaN loss names its first non-finite tensor;
 *  - resume mid-epoch: stopped by --steps, checkpointed, resumed, the run
 *    ends with the parameters of an uninterrupted one.
 * Exit 0 pass, 1 fail.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm/comm.h"
#include "common/common.h"
#include "loader/offline.h"
#include "test_util.h"
#include "tools/train/train.h"

static struct rt_comm *g_comm;
static char g_dir[512], g_data[600];

/* Compute threads: 2, or RT_TEST_THREADS (the ThreadSanitizer build uses 1: OpenMP's own synchronisation is
 * invisible to it). */
static int test_threads(void)
{
    const char *e = getenv("RT_TEST_THREADS");
    return e && atoi(e) > 0 ? atoi(e) : 2;
}

/* A synthetic-data run on the CPU: one random batch, used for every micro-batch. */
static struct train_cfg synthetic_cfg(const char *model, uint32_t c, uint32_t hw)
{
    return (struct train_cfg){
        .model = model, .epochs = 1, .batch = 8, .lr = 0.05f, .sched = RT_SCHED_CONSTANT, .gamma = 0.1f,
        .warmup_epochs = -1, .step_epochs = 30, .grad_accum = 1, .seed = 3, .workers = 1, .threads = test_threads(),
        .synthetic = 1, .syn_c = c, .syn_h = hw, .syn_w = hw, .syn_classes = 10, .pin = RT_PIN_OFF,
        .device = DEVICE_CPU, .amp = AMP_OFF /* the same precision on every CPU */, .bucket_cap_mb = 25, .loss_scale = 0, .comm = g_comm,
        .optim = {.kind = RT_OPT_SGD, .momentum = 0.9f, .weight_decay = 5e-4f, .beta1 = 0.9f, .beta2 = 0.999f,
                  .eps = 1e-8f}};
}

/* The model's parameters on the host (malloc'd). */
static float *params(struct train *T, size_t *n)
{
    *n = rt_model_param_count(train_model(T));
    float *p = malloc(*n * sizeof(float));
    rt_model_read(train_model(T), RT_MODEL_PARAMS, 0, *n, p);
    return p;
}

/* One micro-batch, as the loop runs it. Returns what the step's calls returned: 0 or -1. */
static int micro_batch(struct train *T)
{
    struct train_batch b;
    if (train_next_batch(T, &b) != 1)
        return -1;
    const int update = train_at_update(T);
    int r = train_forward_backward(T, &b);
    train_release_batch(T, &b);
    if (r < 0 || (update && (train_reduce(T) < 0 || train_update(T) < 0)))
        return -1;
    train_advance(T, &b);
    return 0;
}

/* The largest |a - b| and the largest |b| over n floats, each taken from the difference to `base`. */
static void delta_err(const float *a, const float *b, const float *base, size_t n, double *err, double *scale)
{
    *err = *scale = 0;
    for (size_t i = 0; i < n; i++) {
        const double da = (double)a[i] - base[i], db = (double)b[i] - base[i];
        *err = fmax(*err, fabs(da - db));
        *scale = fmax(*scale, fabs(db));
    }
}

static void test_accumulation(void)
{
    struct train_cfg c = synthetic_cfg("wrn-10-1", 3, 16);
    struct train *one = NULL, *two = NULL;
    size_t n, n2;
    CHECK_OK(train_create(&c, &one));
    c.grad_accum = 2;
    CHECK_OK(train_create(&c, &two));
    float *p0 = params(two, &n);

    for (int u = 0; u < 2; u++) {
        CHECK_OK(micro_batch(one));
        CHECK(!train_at_update(two));
        CHECK_OK(micro_batch(two));
        if (u == 0) {
            float *p_half = params(two, &n2);
            CHECKF(!memcmp(p0, p_half, n * sizeof(float)), "the first of two micro-batches changed the parameters");
            free(p_half);
        }
        CHECK(train_position(two).update == (uint64_t)u && train_at_update(two));
        CHECK_OK(micro_batch(two));
    }
    CHECK(train_position(one).update == 2 && rt_optim_steps(train_optim(one)) == 2);
    CHECK(train_position(two).update == 2 && train_position(two).micro == 4 && rt_optim_steps(train_optim(two)) == 2);

    /* The same batch twice at half the gradient scale is the same update, up to the GEMMs' summation order
     * (a beta = 1 GEMM adds into the accumulated gradient block by block): far below the factor-of-two
     * errors of a gradient zeroed too often or too rarely. */
    float *pa = params(one, &n), *pb = params(two, &n2);
    double err, scale;
    delta_err(pb, pa, p0, n, &err, &scale);
    CHECKF(n == n2 && scale > 0 && err <= 1e-4 * scale,
           "two updates of 2 accumulated micro-batches: parameters off those of 1 by %g (moved by up to %g)", err,
           scale);
    printf("accumulation: 2 updates of 2 x (batch 8, scale 1/16) vs 1 x (batch 8, scale 1/8): parameters moved by "
           "up to %.3g, differ by %.3g\n", scale, err);
    free(p0);
    free(pa);
    free(pb);
    train_destroy(one);
    train_destroy(two);
}

static void test_loss_scaling(void)
{
    struct train_cfg c = synthetic_cfg("mnist-net", 1, 28);
    struct train_faults f;
    train_faults_none(&f);
    f.overflow_update = 1;
    f.overflow_count = 2;
    c.loss_scale = 1;
    c.faults = &f;
    struct train *T = NULL;
    size_t n;
    CHECK_OK(train_create(&c, &T));
    const struct rt_scaler *s = train_scaler(T);
    CHECK(s != NULL && s->scale == 65536.0f);
    CHECK_OK(micro_batch(T)); /* update 0: applied */
    CHECK(rt_optim_steps(train_optim(T)) == 1 && s->scale == 65536.0f);
    float *before = params(T, &n);
    for (int u = 1; u <= 2; u++) {
        CHECK_OK(micro_batch(T)); /* updates 1 and 2: the injected overflow */
        float *after = params(T, &n);
        CHECKF(!memcmp(before, after, n * sizeof(float)), "update %d overflowed but changed the parameters", u);
        CHECKF(rt_optim_steps(train_optim(T)) == 1, "update %d: the optimizer counted %lld updates", u,
               (long long)rt_optim_steps(train_optim(T)));
        CHECKF(s->scale == 65536.0f / (float)(1 << u) && s->skipped == (uint64_t)u, "update %d: scale %g, %llu skipped",
               u, (double)s->scale, (unsigned long long)s->skipped);
        free(after);
    }
    CHECK_OK(micro_batch(T)); /* update 3: applied again, at the backed-off scale */
    float *after = params(T, &n);
    CHECK(memcmp(before, after, n * sizeof(float)) != 0 && rt_optim_steps(train_optim(T)) == 2);
    CHECK(train_position(T).update == 4 && s->scale == 16384.0f);
    free(before);
    free(after);
    train_destroy(T);

    /* Overflowing for ever: the third skip in a row ends the run. */
    f.overflow_update = 0;
    f.overflow_count = 1000;
    c.max_skipped_steps = 3;
    CHECK_OK(train_create(&c, &T));
    CHECK_OK(micro_batch(T));
    CHECK_OK(micro_batch(T));
    CHECK_ERR(micro_batch(T), "3 optimizer steps in a row overflowed");
    printf("loss scaling: updates 1-2 skipped (scale 65536 -> 16384), update 3 applied; 3 in a row: %s\n",
           rt_errmsg());
    train_destroy(T);
}

static void test_clipping(void)
{
    const float max_norm = 0.01f, lr = 1.0f;
    double moved[2];
    for (int clip = 0; clip < 2; clip++) {
        struct train_cfg c = synthetic_cfg("mnist-net", 1, 28);
        c.optim.momentum = 0;
        c.optim.weight_decay = 0;
        c.lr = lr;
        c.clip_grad_norm = clip ? max_norm : 0;
        struct train *T = NULL;
        size_t n;
        CHECK_OK(train_create(&c, &T));
        float *p0 = params(T, &n);
        CHECK_OK(micro_batch(T));
        float *p1 = params(T, &n);
        double ss = 0;
        for (size_t i = 0; i < n; i++)
            ss += ((double)p1[i] - p0[i]) * ((double)p1[i] - p0[i]);
        moved[clip] = sqrt(ss);
        free(p0);
        free(p1);
        train_destroy(T);
    }
    CHECKF(moved[0] > 10 * lr * max_norm, "unclipped update moved %g: the clip would not bite", moved[0]);
    CHECKF(fabs(moved[1] - lr * max_norm) < 5e-3 * lr * max_norm, "clipped update moved %g, expected %g", moved[1],
           (double)(lr * max_norm));
    printf("clipping: update norm %.6g unclipped, %.6g with --clip-grad-norm %g\n", moved[0], moved[1],
           (double)max_norm);
}

static void test_nan_loss(void)
{
    struct train_cfg c = synthetic_cfg("mnist-net", 1, 28);
    struct train *T = NULL;
    CHECK_OK(train_create(&c, &T));
    int count;
    const struct rt_tensor_info *tab = rt_model_tensors(train_model(T), &count);
    const float nan = NAN;
    CHECK(count > 0 && tab[0].kind == RT_PARAM && strstr(tab[0].name, "conv1"));
    rt_model_write(train_model(T), RT_MODEL_PARAMS, tab[0].offset, &nan, 1);
    CHECK_ERR(micro_batch(T), "the loss became NaN");
    CHECKF(strstr(rt_errmsg(), "first non-finite tensor: conv1") != NULL, "message: %s", rt_errmsg());
    printf("NaN in %s: %s\n", tab[0].name, rt_errmsg());
    train_destroy(T);
}

/* A two-epoch run on the packed dataset; `updates` > 0 stops it there. */
static struct train_cfg data_cfg(const char *ckpt, uint64_t updates, int resume)
{
    struct train_cfg c = synthetic_cfg("mnist-net", 3, 32);
    c.synthetic = 0;
    c.data = g_data;
    c.epochs = 2;
    c.batch = 16;
    c.grad_accum = 2;
    c.sched = RT_SCHED_COSINE;
    c.checkpoint_dir = ckpt;
    c.max_updates = updates;
    c.resume = resume;
    c.aug_default = 1;
    c.aug = (struct rt_aug){.pad = 4, .flip = RT_FLIP_RANDOM};
    return c;
}

static void test_resume(void)
{
    char whole[700], split[700];
    struct train *T = NULL;
    snprintf(whole, sizeof(whole), "%s/ckpt-whole", g_dir);
    snprintf(split, sizeof(split), "%s/ckpt-split", g_dir);

    struct train_cfg c = data_cfg(whole, 0, 0);
    CHECK_OK(train_create(&c, &T));
    CHECK_OK(train_loop(T));
    CHECK(train_stopped(T) == STOP_DONE && train_position(T).epoch == 2);
    const uint64_t uninterrupted = train_param_digest(T);
    train_destroy(T);

    c = data_cfg(split, 5, 0);
    CHECK_OK(train_create(&c, &T));
    CHECK_OK(train_loop(T));
    struct train_pos at = train_position(T);
    CHECKF(train_stopped(T) == STOP_STEPS && at.epoch == 0 && at.batch == 10 && at.update == 5,
           "stopped at epoch %llu batch %llu update %llu", (unsigned long long)at.epoch,
           (unsigned long long)at.batch, (unsigned long long)at.update);
    train_destroy(T);

    c = data_cfg(split, 0, 1);
    CHECK_OK(train_create(&c, &T));
    at = train_position(T);
    CHECK(at.epoch == 0 && at.batch == 10 && at.micro == 10 && at.update == 5);
    CHECK_OK(train_loop(T));
    const uint64_t resumed = train_param_digest(T);
    CHECKF(resumed == uninterrupted, "resumed run ends at %016llx, uninterrupted at %016llx",
           (unsigned long long)resumed, (unsigned long long)uninterrupted);
    printf("resume: stopped after 5 updates (epoch 1, micro-batch 10), resumed: %016llx == %016llx\n",
           (unsigned long long)resumed, (unsigned long long)uninterrupted);
    train_destroy(T);
}

int main(void)
{
    struct rt_synth_opts so = {.format = RT_SYNTH_CIFAR10, .train = 256, .test = 64, .seed = 5, .threads = 2};
    struct rt_pack_opts po = {.codec = RT_CODEC_RAW, .threads = 2};
    struct rt_comm_opts co = {0};
    char src[600];
    tu_tempdir(g_dir, sizeof(g_dir), "train-step");
    snprintf(src, sizeof(src), "%s/src", g_dir);
    snprintf(g_data, sizeof(g_data), "%s/data", g_dir);
    if (rt_synth_write(src, &so) < 0 || rt_pack(src, g_data, &po, NULL) < 0 || rt_comm_create(&co, &g_comm) < 0) {
        fprintf(stderr, "set-up failed: %s\n", rt_errmsg());
        return 1;
    }
    test_accumulation();
    test_loss_scaling();
    test_clipping();
    test_nan_loss();
    test_resume();
    rt_comm_destroy(g_comm);
    if (check_failures == 0)
        rt_remove_tree(g_dir);
    return check_result();
}
