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
 *    ends with the parameters of an uninterrupted one;
 *  - data that ends before the epoch does is an error naming where, not a
 *    finished run;
 *  - an epoch that --grad-accum does not divide ends with a short update
 *    (--shuffle window; the global order's epochs take whole updates):
 *    a run stopped after every one of its updates (each epoch's end among
 *    them) and resumed from there holds, bit for bit, the uninterrupted
 *    run's parameters, and so does one stopped by SIGTERM (train_run), after
 *    which a second train_run in the same process runs to its end; a
 *    checkpoint is written once per position;
 *  - the step profile's verdict when the data wait is the whole step.
 * Exit 0 pass, 1 fail.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "comm/comm.h"
#include "common/common.h"
#include "loader/offline.h"
#include "test_util.h"
#include "tools/train/driver.h"
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

    /* One trainer runs at a time: each is read back (train_sync) before the other goes on, as the step's loss
     * download used to make them. Two CPU backends' stream workers in oneDNN at once is allowed by oneDNN, but
     * ThreadSanitizer, which sees only part of its locking, reports it. */
    for (int u = 0; u < 2; u++) {
        CHECK_OK(train_step(one));
        CHECK_OK(train_sync(one));
        CHECK(train_step_size(two) == 2);
        CHECK_OK(train_step_micro(two, 0, 2));
        if (u == 0) {
            float *p_half = params(two, &n2);
            CHECKF(!memcmp(p0, p_half, n * sizeof(float)), "the first of two micro-batches changed the parameters");
            free(p_half);
        }
        CHECK(train_position(two).update == (uint64_t)u && train_position(two).micro == 2 * (uint64_t)u + 1);
        CHECK_OK(train_step_micro(two, 1, 2));
        CHECK_OK(train_step_reduce(two));
        CHECK_OK(train_step_apply(two));
        CHECK_OK(train_sync(two));
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
    /* The device decides each update; the host reads its verdict a step late, or at once after train_sync. */
    CHECK_OK(train_step(T)); /* update 0: applied */
    CHECK_OK(train_sync(T));
    CHECK(rt_optim_steps(train_optim(T)) == 1 && s->scale == 65536.0f);
    float *before = params(T, &n);
    for (int u = 1; u <= 2; u++) {
        CHECK_OK(train_step(T)); /* updates 1 and 2: the injected overflow */
        CHECK_OK(train_sync(T));
        float *after = params(T, &n);
        CHECKF(!memcmp(before, after, n * sizeof(float)), "update %d overflowed but changed the parameters", u);
        CHECKF(rt_optim_steps(train_optim(T)) == 1, "update %d: the optimizer counted %lld updates", u,
               (long long)rt_optim_steps(train_optim(T)));
        CHECKF(s->scale == 65536.0f / (float)(1 << u) && s->skipped == (uint64_t)u, "update %d: scale %g, %llu skipped",
               u, (double)s->scale, (unsigned long long)s->skipped);
        free(after);
    }
    CHECK_OK(train_step(T)); /* update 3: applied again, at the backed-off scale */
    CHECK_OK(train_sync(T));
    float *after = params(T, &n);
    CHECK(memcmp(before, after, n * sizeof(float)) != 0 && rt_optim_steps(train_optim(T)) == 2);
    CHECK(train_position(T).update == 4 && s->scale == 16384.0f);
    free(before);
    free(after);
    train_destroy(T);

    /* Overflowing for ever: the third skip in a row (update 2) ends the run when the host reads it, at update 3's
     * optimizer step. */
    f.overflow_update = 0;
    f.overflow_count = 1000;
    c.max_skipped_steps = 3;
    CHECK_OK(train_create(&c, &T));
    CHECK_OK(train_step(T));
    CHECK_OK(train_step(T));
    CHECK_OK(train_step(T));
    CHECK_ERR(train_step(T), "3 optimizer steps in a row overflowed (step 2, loss scale now 8192)");
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
        CHECK_OK(train_step(T));
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
    /* The loss is read a step late (no host wait in a step): the update after the NaN stops the run. */
    CHECK_OK(train_step(T));
    CHECK_ERR(train_step(T), "the loss became NaN");
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
    CHECK(train_stopped(T) == STOP_EPOCHS && train_position(T).epoch == 2);
    const uint64_t uninterrupted = train_replicas_digest(T);
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
    const uint64_t resumed = train_replicas_digest(T);
    CHECKF(resumed == uninterrupted, "resumed run ends at %016llx, uninterrupted at %016llx",
           (unsigned long long)resumed, (unsigned long long)uninterrupted);
    printf("resume: stopped after 5 updates (epoch 1, micro-batch 10), resumed: %016llx == %016llx\n",
           (unsigned long long)resumed, (unsigned long long)uninterrupted);
    train_destroy(T);
}

/*
 * An epoch --grad-accum does not divide: 256 records, batch 16 = 16 micro-batches an epoch, accumulation 3 =
 * 5 updates of 3 and a short one of 1; 2 epochs = 12 updates.
 */
enum { SHORT_ACCUM = 3, SHORT_UPDATES = 12 };

/* Short updates are --shuffle window's (its ranks deal blocks); the global order's updates are all whole. */
static struct train_cfg short_cfg(const char *ckpt, uint64_t updates, int resume)
{
    struct train_cfg c = data_cfg(ckpt, updates, resume);
    c.grad_accum = SHORT_ACCUM;
    c.shuffle = RT_SHUFFLE_WINDOW;
    return c;
}

/* Runs train_run(c) while another thread sends this process SIGTERM after `ms` milliseconds. */
struct sig_arg {
    unsigned ms;
};

static void *sigterm_after(void *p)
{
    const struct sig_arg *a = p;
    struct timespec ts = {a->ms / 1000, (long)(a->ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    kill(getpid(), SIGTERM);
    return NULL;
}

static int send_sigterm_during_run(const struct train_cfg *c, unsigned ms)
{
    struct sig_arg a = {ms};
    pthread_t th;
    if (pthread_create(&th, NULL, sigterm_after, &a) != 0)
        return -1;
    const int rc = train_run(c);
    pthread_join(th, NULL);
    return rc;
}

/* The parameters a checkpoint directory holds, as a resumed driver reads them. */
static uint64_t saved_digest(const char *dir)
{
    struct train_cfg c = short_cfg(dir, 0, 1);
    struct train *T = NULL;
    uint64_t d = 0;
    if (train_create(&c, &T) == 0)
        d = train_replicas_digest(T);
    train_destroy(T);
    return d;
}

/* The data ending before the epoch does (a loader that disagrees with the position) is an error naming where,
 * never a success in mid-epoch: no "finished" mark, the stop state untouched. */
static void test_data_ends_first(void)
{
    char dir[700], fin[800];
    snprintf(dir, sizeof(dir), "%s/ckpt-ends", g_dir);
    snprintf(fin, sizeof(fin), "%s/finished", dir);
    struct train_cfg c = data_cfg(dir, 0, 0);
    struct train_faults f;
    train_faults_none(&f);
    f.data_end_micro = 5; /* inside the first update after the 2-micro-batch updates 0 and 1 */
    c.faults = &f;
    struct train *T = NULL;
    CHECK_OK(train_create(&c, &T));
    CHECK_ERR(train_loop(T), "the data ended at micro-batch 5 of epoch 1, which has");
    CHECK(train_stopped(T) == STOP_NONE && train_position(T).micro == 5);
    train_destroy(T);
    /* The whole run (train_run: the loop, then train_finish only after a 0 from it) fails, unmarked. */
    CHECK_ERR(train_run(&c), "the data ended at micro-batch 5 of epoch 1, which has");
    CHECKF(access(fin, F_OK) != 0, "a run whose data ended early was marked finished");
}

static void test_short_update_resume(void)
{
    char whole[700], dir[700];
    struct train *T = NULL;
    snprintf(whole, sizeof(whole), "%s/short-whole", g_dir);

    /* The uninterrupted run, update by update: the last of each epoch short; the parameters after each. */
    struct train_cfg c = short_cfg(whole, 0, 0);
    CHECK_OK(train_create(&c, &T));
    uint32_t sizes[SHORT_UPDATES + 1];
    uint64_t after[SHORT_UPDATES + 1];
    int u = 0;
    for (; u < SHORT_UPDATES && train_position(T).epoch < 2; u++) {
        sizes[u] = train_step_size(T);
        CHECK_OK(train_step(T));
        if (epoch_done(T)) {
            CHECK_OK(epoch_next(T));
        }
        after[u + 1] = train_replicas_digest(T);
    }
    CHECKF(u == SHORT_UPDATES && train_position(T).epoch == 2 && sizes[0] == 3 && sizes[4] == 3 && sizes[5] == 1 &&
               sizes[6] == 3 && sizes[11] == 1,
           "%d updates of sizes %u %u %u %u %u (expected 12: 3 3 3 3 3 1 per epoch)", u, sizes[0], sizes[1],
           sizes[4], sizes[5], sizes[11]);
    CHECK(train_position(T).micro == 32 && rt_optim_steps(train_optim(T)) == SHORT_UPDATES);
    const uint64_t uninterrupted = after[SHORT_UPDATES];
    train_destroy(T);

    /* The loop, stopped by --steps after every update k and resumed from that checkpoint for the next: each
     * process makes one update (k = 6 and 12 end an epoch), writes one checkpoint (at an epoch's end the
     * epoch's; the stop finds it written), and holds the uninterrupted run's parameters after update k. */
    snprintf(dir, sizeof(dir), "%s/short-chain", g_dir);
    int exact = 0;
    for (uint64_t k = 1; k <= SHORT_UPDATES; k++) {
        c = short_cfg(dir, k, k > 1);
        CHECK_OK(train_create(&c, &T));
        CHECK(train_position(T).update == k - 1);
        CHECK_OK(train_loop(T));
        const struct train_pos at = train_position(T);
        const uint64_t d = train_replicas_digest(T);
        CHECKF(train_stopped(T) == STOP_STEPS && at.update == k && at.batch % SHORT_ACCUM == 0 &&
                   train_checkpoints_saved(T) == 1 && d == after[k],
               "--steps %llu: stopped at update %llu, micro-batch %llu of epoch %llu, %llu checkpoints; parameters "
               "%016llx, uninterrupted %016llx",
               (unsigned long long)k, (unsigned long long)at.update, (unsigned long long)at.batch,
               (unsigned long long)at.epoch, (unsigned long long)train_checkpoints_saved(T), (unsigned long long)d,
               (unsigned long long)after[k]);
        exact += d == after[k];
        train_destroy(T);
    }
    printf("short updates: 2 epochs of 16 micro-batches, --grad-accum 3 = 12 updates (5 x 3 + 1 an epoch); resumed "
           "from the checkpoint after each update: %d of 12 equal the uninterrupted run (%016llx at the end)\n", exact,
           (unsigned long long)uninterrupted);

    /* SIGTERM during train_run: it stops between two updates with a checkpoint; the resumed run (a second
     * train_run in this process, the signal gone) finishes the run exactly. */
    snprintf(dir, sizeof(dir), "%s/short-sigterm", g_dir);
    c = short_cfg(dir, 0, 0);
    struct train_faults f;
    train_faults_none(&f);
    f.loader_delay_ms = 20; /* 32 micro-batches: about 0.7 s, the signal lands inside */
    c.faults = &f;
    CHECK_OK(send_sigterm_during_run(&c, 150));
    char fin[800];
    snprintf(fin, sizeof(fin), "%s/finished", dir);
    const uint64_t at_signal = saved_digest(dir);
    CHECKF(access(fin, F_OK) != 0 && at_signal != uninterrupted, "SIGTERM did not stop the run early");
    c = short_cfg(dir, 0, 1);
    CHECK_OK(train_run(&c));
    CHECKF(access(fin, F_OK) == 0, "the resumed train_run, after a SIGTERM to the first, did not finish its run");
    const uint64_t d = saved_digest(dir);
    CHECKF(d == uninterrupted, "stopped by SIGTERM and resumed: %016llx, uninterrupted %016llx",
           (unsigned long long)d, (unsigned long long)uninterrupted);
    printf("short updates: SIGTERM mid-run, then a second train_run in the same process resumes to %016llx\n",
           (unsigned long long)d);
}

/* What the step profile's verdict says when a rank waits for data the whole step. */
static void test_verdict_all_wait(void)
{
    struct train T;
    memset(&T, 0, sizeof(T));
    T.world = 1;
    T.cfg.batch = 32;
    T.cfg.grad_accum = 1;
    T.cfg.workers = 1;
    struct prof_stats st;
    memset(&st, 0, sizeof(st));
    st.p50[PROF_DATA] = st.p50[PROF_STEP] = 5e6; /* 5 ms of 5 ms */
    struct prof_rank r = {.data = 5e6, .step = 5e6};
    struct prof_verdict v;
    memset(&v, 0, sizeof(v));
    struct prof_picks k;
    profile_pick(&r, 1, &k);
    profile_verdict(&T, &st, &k, &v);
    CHECKF(!strcmp(v.limit, "input") && !strstr(v.evidence, "inf") && !strstr(v.evidence, "nan"),
           "verdict %s: %s", v.limit, v.evidence);
    printf("verdict, data wait = the whole step: %s-bound: %s\n", v.limit, v.evidence);
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
    test_data_ends_first();
    test_short_update_resume();
    test_verdict_all_wait();
    rt_comm_destroy(g_comm);
    if (check_failures == 0)
        rt_remove_tree(g_dir);
    return check_result();
}
