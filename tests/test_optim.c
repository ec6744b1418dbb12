/*
 * test_optim.c - optimizers and schedules against PyTorch: five steps of
 * torch.optim.SGD (momentum, Nesterov, dampening, weight decay), Adam and
 * AdamW on 1000 parameters, and 100 steps of CosineAnnealingLR, OneCycleLR
 * (linear) and StepLR, from tests/fixtures/compute/{optim,sched}.safetensors
 * (tools/gen_fixtures.py). Also gradient clipping against a direct norm.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compute/compute.h"

#include "check.h"

#define NP 1000

static int get(const struct rt_st_file *f, const char *name, enum rt_st_dtype dt, void *out, size_t count)
{
    const struct rt_st_tensor *t = rt_st_find(f, name);
    if (!t || t->dtype != dt || t->bytes != count * rt_st_dtype_size(dt)) {
        CHECKF(0, "fixture tensor %s missing or misshapen", name);
        return -1;
    }
    memcpy(out, t->data, t->bytes);
    return 0;
}

struct optcase {
    const char *name;
    struct rt_optim_opts o;
    float lr;
};

static void check_optim(struct rt_backend *be, const struct rt_st_file *f, const struct optcase *c)
{
    const struct rt_ops *ops = rt_backend_ops(be);
    struct rt_stream *s = rt_backend_stream(be);
    float *p = ops->alloc(be, NP * sizeof(float)), *g = ops->alloc(be, NP * sizeof(float));
    float host[NP], ref[NP];
    char nm[64];
    if (get(f, "p0", RT_ST_F32, host, NP))
        return;
    ops->upload(s, p, host, sizeof(host));
    struct rt_optim *opt = NULL;
    CHECKF(rt_optim_create(be, &c->o, NP, &opt) == 0, "%s: %s", c->name, rt_errmsg());
    for (int k = 0; k < 5 && opt; k++) {
        snprintf(nm, sizeof(nm), "g.%d", k);
        if (get(f, nm, RT_ST_F32, host, NP))
            break;
        ops->upload(s, g, host, sizeof(host));
        rt_optim_step(opt, p, g, c->lr);
    }
    double worst = 0;
    snprintf(nm, sizeof(nm), "%s.p", c->name);
    if (opt && !get(f, nm, RT_ST_F32, ref, NP)) {
        ops->download(s, host, p, sizeof(host));
        for (int i = 0; i < NP; i++) {
            double d = fabs((double)host[i] - ref[i]);
            worst = fmax(worst, d / (fabs(ref[i]) + 1e-6));
            CHECKF(d <= 1e-6 + 1e-5 * fabs(ref[i]), "%s: p[%d] = %.9g vs PyTorch %.9g", c->name, i, host[i], ref[i]);
        }
    }
    for (int k = 0; opt && k < rt_optim_state_count(opt); k++) {
        const char *sname;
        float *st = rt_optim_state(opt, k, &sname);
        snprintf(nm, sizeof(nm), "%s.%s", c->name, sname);
        if (get(f, nm, RT_ST_F32, ref, NP))
            continue;
        ops->download(s, host, st, sizeof(host));
        for (int i = 0; i < NP; i++) {
            double d = fabs((double)host[i] - ref[i]);
            worst = fmax(worst, d / (fabs(ref[i]) + 1e-6));
            CHECKF(d <= 1e-7 + 1e-5 * fabs(ref[i]), "%s: %s[%d] = %.9g vs PyTorch %.9g", c->name, sname, i, host[i],
                  ref[i]);
        }
    }
    printf("%-14s max relative error %.1e\n", c->name, worst);
    rt_optim_destroy(opt);
    ops->free(be, p);
    ops->free(be, g);
}

static void check_sched(const struct rt_st_file *f, const char *name, const struct rt_sched *sc)
{
    double ref[100];
    if (get(f, name, RT_ST_F64, ref, 100))
        return;
    double worst = 0;
    for (int i = 0; i < 100; i++) {
        double lr = rt_sched_lr(sc, (uint64_t)i), d = fabs(lr - ref[i]);
        worst = fmax(worst, d / (ref[i] + 1e-12));
        CHECKF(d <= 1e-7 + 1e-5 * ref[i], "%s step %d: lr %.9g vs PyTorch %.9g", name, i, lr, ref[i]);
    }
    printf("%-14s max relative error %.1e\n", name, worst);
}

static void check_clip(struct rt_backend *be)
{
    const struct rt_ops *ops = rt_backend_ops(be);
    struct rt_stream *s = rt_backend_stream(be);
    float host[NP];
    struct rt_rng r;
    rt_rng_init(&r, 7, 0);
    double sq = 0;
    for (int i = 0; i < NP; i++) {
        host[i] = rt_rng_normal(&r);
        sq += (double)host[i] * host[i];
    }
    float *g = ops->alloc(be, sizeof(host));
    ops->upload(s, g, host, sizeof(host));
    struct rt_optim *opt = NULL;
    struct rt_optim_opts oo = {.kind = RT_OPT_SGD};
    CHECK_OK(rt_optim_create(be, &oo, NP, &opt));
    float norm = rt_clip_grad_norm(opt, g, NP, 1.0f);
    CHECKF(fabs(norm - sqrt(sq)) <= 1e-4 * sqrt(sq), "clip: norm %.7g vs %.7g", norm, sqrt(sq));
    float after[NP];
    ops->download(s, after, g, sizeof(after));
    double sq2 = 0;
    for (int i = 0; i < NP; i++)
        sq2 += (double)after[i] * after[i];
    CHECKF(fabs(sqrt(sq2) - 1.0) < 1e-4, "clip: norm after clipping %.7g, want 1", sqrt(sq2));
    float again = rt_clip_grad_norm(opt, g, NP, 10.0f);
    ops->download(s, host, g, sizeof(host));
    CHECKF(fabs(again - 1.0) < 1e-4 && !memcmp(host, after, sizeof(host)), "clip: a norm under the limit is kept");
    rt_optim_destroy(opt);
    ops->free(be, g);
}

int main(void)
{
    const char *dir = getenv("RT_FIXTURES");
    if (!dir) {
        fprintf(stderr, "RT_FIXTURES is not set (run through ctest)\n");
        return 1;
    }
    struct rt_backend *be = NULL;
    struct rt_backend_opts bo = {.kind = RT_BACKEND_CPU, .threads = 2};
    if (rt_backend_create(&bo, &be) < 0) {
        fprintf(stderr, "backend: %s\n", rt_errmsg());
        return 1;
    }
    char path[4096];
    struct rt_st_file *f = NULL;
    snprintf(path, sizeof(path), "%s/compute/optim.safetensors", dir);
    if (rt_st_read(path, &f) < 0) {
        fprintf(stderr, "%s\n", rt_errmsg());
        return 1;
    }
    const struct optcase cases[] = {
        {"sgd", {.kind = RT_OPT_SGD, .momentum = 0.9f, .weight_decay = 5e-4f}, 0.1f},
        {"sgd_nesterov", {.kind = RT_OPT_SGD, .momentum = 0.9f, .nesterov = 1, .weight_decay = 5e-4f}, 0.1f},
        {"sgd_plain", {.kind = RT_OPT_SGD}, 0.1f},
        {"sgd_damp", {.kind = RT_OPT_SGD, .momentum = 0.9f, .dampening = 0.1f}, 0.1f},
        {"adam", {.kind = RT_OPT_ADAM, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-2f}, 1e-3f},
        {"adamw", {.kind = RT_OPT_ADAMW, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-2f}, 1e-3f},
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(cases); i++)
        check_optim(be, f, &cases[i]);
    rt_st_close(f);

    snprintf(path, sizeof(path), "%s/compute/sched.safetensors", dir);
    if (rt_st_read(path, &f) < 0) {
        fprintf(stderr, "%s\n", rt_errmsg());
        return 1;
    }
    struct rt_sched cos = {.kind = RT_SCHED_COSINE, .base_lr = 0.4f, .total_steps = 100};
    struct rt_sched one = {.kind = RT_SCHED_ONECYCLE, .base_lr = 0.4f, .total_steps = 100, .warmup_steps = 25};
    struct rt_sched step = {.kind = RT_SCHED_STEP, .base_lr = 0.4f, .total_steps = 100, .step_size = 30,
                            .gamma = 0.1f};
    check_sched(f, "cosine", &cos);
    check_sched(f, "onecycle", &one);
    check_sched(f, "step", &step);
    rt_st_close(f);

    check_clip(be);
    rt_backend_destroy(be);
    return check_result();
}
