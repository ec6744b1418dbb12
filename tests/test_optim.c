/*
 * test_optim.c - optimizers and schedules against PyTorch: five steps of
 * torch.optim.SGD (momentum, Nesterov, dampening, weight decay), Adam and
 * AdamW on 1000 parameters, and 100 steps of CosineAnnealingLR, OneCycleLR
 * (linear) and StepLR, from tests/fixtures/compute/{optim,sched}.safetensors
 * (tools/dev/gen_fixtures.py). Also gradient clipping against a direct norm, and
 * unscaling of loss-scaled gradients. An optimizer works on a model's
 * trainable floats: the cases fill the first NP of a small mnist-net's and
 * zero its other gradients (every update is elementwise, so the rest do not
 * touch them).
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

/* mnist-net on 1x6x6 inputs (over 27,000 trainable floats), its gradients zeroed; NULL on failure. */
static struct rt_model *small_model(struct rt_backend *be)
{
    const struct rt_model_opts mo = {.name = "mnist-net", .c = 1, .h = 6, .w = 6, .classes = 2, .batch = 1, .seed = 1};
    struct rt_model *m = NULL;
    CHECKF(rt_model_create(be, &mo, &m) == 0, "mnist-net: %s", rt_errmsg());
    if (m && rt_model_trainable_count(m) < NP) {
        CHECKF(0, "mnist-net has %zu trainable floats, fewer than %d", rt_model_trainable_count(m), NP);
        rt_model_destroy(m);
        return NULL;
    }
    if (m)
        rt_model_zero_grads(m);
    return m;
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
    float host[NP], ref[NP];
    char nm[64];
    struct rt_model *m = small_model(be);
    if (!m || get(f, "p0", RT_ST_F32, host, NP)) {
        rt_model_destroy(m);
        return;
    }
    rt_model_write(m, RT_MODEL_PARAMS, 0, host, NP);
    struct rt_optim *opt = NULL;
    CHECKF(rt_optim_create(m, &c->o, &opt) == 0, "%s: %s", c->name, rt_errmsg());
    for (int k = 0; k < 5 && opt; k++) {
        snprintf(nm, sizeof(nm), "g.%d", k);
        if (get(f, nm, RT_ST_F32, host, NP))
            break;
        rt_model_write(m, RT_MODEL_GRADS, 0, host, NP);
        rt_optim_step(opt, c->lr);
    }
    double worst = 0;
    snprintf(nm, sizeof(nm), "%s.p", c->name);
    if (opt && !get(f, nm, RT_ST_F32, ref, NP)) {
        rt_model_read(m, RT_MODEL_PARAMS, 0, NP, host);
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
    rt_model_destroy(m);
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
    float host[NP];
    struct rt_rng r;
    rt_rng_init(&r, 7, 0);
    double sq = 0;
    for (int i = 0; i < NP; i++) {
        host[i] = rt_rng_normal(&r);
        sq += (double)host[i] * host[i];
    }
    struct rt_model *m = small_model(be);
    if (!m)
        return;
    rt_model_write(m, RT_MODEL_GRADS, 0, host, NP);
    struct rt_optim *opt = NULL;
    struct rt_optim_opts oo = {.kind = RT_OPT_SGD};
    CHECK_OK(rt_optim_create(m, &oo, &opt));
    if (!opt) {
        rt_model_destroy(m);
        return;
    }
    float norm = rt_clip_grad_norm(opt, 1.0f);
    CHECKF(fabs(norm - sqrt(sq)) <= 1e-4 * sqrt(sq), "clip: norm %.7g vs %.7g", norm, sqrt(sq));
    float after[NP];
    rt_model_read(m, RT_MODEL_GRADS, 0, NP, after);
    double sq2 = 0;
    for (int i = 0; i < NP; i++)
        sq2 += (double)after[i] * after[i];
    CHECKF(fabs(sqrt(sq2) - 1.0) < 1e-4, "clip: norm after clipping %.7g, want 1", sqrt(sq2));
    float again = rt_clip_grad_norm(opt, 10.0f);
    rt_model_read(m, RT_MODEL_GRADS, 0, NP, host);
    CHECKF(fabs(again - 1.0) < 1e-4 && !memcmp(host, after, sizeof(host)), "clip: a norm under the limit is kept");
    rt_optim_destroy(opt);
    rt_model_destroy(m);
}

/* GradScaler's rules, step by step against a hand-run of torch.cuda.amp.GradScaler's update(). */
static void check_scaler(void)
{
    struct rt_scaler sc;
    rt_scaler_init(&sc);
    CHECK(sc.scale == 65536.0f && sc.growth_interval == 2000);
    sc.growth_interval = 3;
    sc.max_skips = 4;
    /* overflow: skip, halve */
    CHECK(rt_scaler_update(&sc, 1) == RT_SCALER_SKIP && sc.scale == 32768.0f && sc.skipped == 1);
    /* two good steps: no growth yet; an overflow restarts the count */
    CHECK(rt_scaler_update(&sc, 0) == RT_SCALER_APPLY && rt_scaler_update(&sc, 0) == RT_SCALER_APPLY);
    CHECK(sc.scale == 32768.0f && sc.good == 2);
    CHECK(rt_scaler_update(&sc, 1) == RT_SCALER_SKIP && sc.scale == 16384.0f && sc.good == 0);
    /* three good steps in a row: doubled, count restarts */
    for (int i = 0; i < 3; i++)
        CHECK(rt_scaler_update(&sc, 0) == RT_SCALER_APPLY);
    CHECKF(sc.scale == 32768.0f && sc.good == 0, "scale %g good %u", sc.scale, sc.good);
    /* max_skips in a row stops; fewer do not */
    for (int i = 0; i < 3; i++)
        CHECK(rt_scaler_update(&sc, 1) == RT_SCALER_SKIP);
    CHECK(rt_scaler_update(&sc, 1) == RT_SCALER_STOP_SKIPS && sc.skipped == 6 && sc.scale == 2048.0f);
    /* a collapsing scale stops even when skips are not limited */
    rt_scaler_init(&sc);
    sc.max_skips = 0;
    int n = 0;
    enum rt_scaler_verdict v;
    while ((v = rt_scaler_update(&sc, 1)) == RT_SCALER_SKIP)
        n++;
    /* 2^16 halved 31 times is 2^-15, the first value below 2^-14 */
    CHECKF(v == RT_SCALER_STOP_COLLAPSED && n == 30, "collapse after %d skips (verdict %d)", n, (int)v);
}

/* The unscale op: every gradient times 1/scale, and the flag for a NaN or Inf anywhere. */
static void check_unscale(struct rt_backend *be)
{
    const struct rt_ops *ops = rt_backend_ops(be);
    struct rt_stream *s = rt_backend_stream(be);
    enum { N = 100003 };
    float *host = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++)
        host[i] = (float)(i % 97) - 48.0f;
    float *g = ops->alloc(be, N * sizeof(float)), *found = ops->alloc(be, sizeof(float));
    float *scale = ops->alloc(be, sizeof(float)); /* the loss scale lives on the device */
    float f = -1.0f;
    ops->upload(s, g, host, N * sizeof(float));
    ops->upload(s, scale, &(float){4.0f}, sizeof(float));
    ops->unscale_check(s, N, g, scale, found);
    ops->download(s, back, g, N * sizeof(float));
    ops->download(s, &f, found, sizeof(float));
    int same = 1;
    for (int i = 0; i < N; i++)
        same &= back[i] == host[i] * 0.25f;
    CHECKF(same && f == 0.0f, "unscale: finite gradients scaled exactly, flag %g", f);
    const int at[3] = {0, N / 2, N - 1};
    for (int k = 0; k < 3; k++) {
        host[at[k]] = k == 1 ? NAN : INFINITY;
        ops->upload(s, g, host, N * sizeof(float));
        ops->upload(s, scale, &(float){2.0f}, sizeof(float));
        ops->unscale_check(s, N, g, scale, found);
        ops->download(s, &f, found, sizeof(float));
        CHECKF(f == 1.0f, "unscale: a non-finite gradient at %d raises the flag (got %g)", at[k], f);
        host[at[k]] = 1.0f;
    }
    ops->unscale_check(s, 0, g, scale, found); /* the flag is reset per call */
    ops->download(s, &f, found, sizeof(float));
    CHECKF(f == 0.0f, "unscale: no gradients, no overflow (got %g)", f);
    ops->free(be, g);
    ops->free(be, found);
    ops->free(be, scale);
    free(host);
    free(back);
}

/* scaler_update on the device follows rt_scaler_update (the host replays it a step later for its messages) over
 * overflows, good runs that grow the scale, and a growth that would pass 3e38 and is refused. */
static void check_device_scaler(struct rt_backend *be)
{
    const struct rt_ops *ops = rt_backend_ops(be);
    struct rt_stream *s = rt_backend_stream(be);
    struct rt_scaler sc;
    rt_scaler_init(&sc);
    sc.growth_interval = 3;
    sc.max_skips = 0;
    float *d = ops->alloc(be, 3 * sizeof(float)); /* scale, good, found */
    ops->upload(s, d, (float[2]){sc.scale, 0.0f}, 2 * sizeof(float));
    int steps = 0, agree = 1;
    for (int i = 0; i < 700 && agree; i++, steps++) {
        const float found = (i % 7 == 2 || i % 11 == 0) && i < 150 ? 1.0f : 0.0f; /* then only growth */
        ops->upload(s, d + 2, &found, sizeof(float));
        ops->scaler_update(s, d, d + 1, d + 2, sc.growth, sc.backoff, (int)sc.growth_interval);
        rt_scaler_update(&sc, found != 0.0f);
        float got[2];
        ops->download(s, got, d, sizeof(got));
        agree = got[0] == sc.scale && got[1] == (float)sc.good;
        CHECKF(agree, "scaler_update, step %d: device scale %g good %g, host %g %u", i, (double)got[0],
               (double)got[1], (double)sc.scale, sc.good);
    }
    CHECKF(sc.scale > 1e38f, "the growth ran up to the 3e38 limit: scale %g", (double)sc.scale);
    printf("scaler_update: %d steps as the host's rule, the scale ending at %g\n", steps, (double)sc.scale);
    ops->free(be, d);
}

/* An update skipped on the device (loss scaling's overflow) leaves every parameter and state bit alone; a 0
 * flag changes them exactly as no flag does. */
static void check_skip(struct rt_backend *be)
{
    const struct rt_ops *ops = rt_backend_ops(be);
    struct rt_stream *s = rt_backend_stream(be);
    enum { N = 4099 };
    float h[N], a[N], b[N], ma[N], mb[N];
    for (int i = 0; i < N; i++)
        h[i] = (float)(i % 13) * 0.125f - 0.75f;
    float *p = ops->alloc(be, N * sizeof(float)), *g = ops->alloc(be, N * sizeof(float));
    float *m = ops->alloc(be, N * sizeof(float)), *v = ops->alloc(be, N * sizeof(float));
    float *flag = ops->alloc(be, sizeof(float));
    ops->upload(s, g, h, sizeof(h));
    for (int kind = 0; kind < 2; kind++) {
        for (int f = 0; f < 3; f++) { /* flag 1, flag 0, no flag */
            ops->upload(s, p, h, sizeof(h));
            ops->upload(s, m, h, sizeof(h));
            ops->zero(s, v, sizeof(h));
            ops->upload(s, flag, &(float){f == 0 ? 1.0f : 0.0f}, sizeof(float));
            const float *skip = f < 2 ? flag : NULL;
            if (kind == 0)
                ops->sgd_update(s, N, p, g, m, 0.1f, 0.9f, 0.0f, 1e-4f, 1, 0, skip);
            else
                ops->adam_update(s, N, p, g, m, v, 0.01f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 3, skip);
            ops->download(s, f == 2 ? b : a, p, sizeof(h));
            ops->download(s, f == 2 ? mb : ma, m, sizeof(h));
            if (f == 0)
                CHECKF(!memcmp(a, h, sizeof(h)) && !memcmp(ma, h, sizeof(h)),
                       "%s with the skip flag set changed the parameters or the state", kind ? "adamw" : "sgd");
        }
        CHECKF(!memcmp(a, b, sizeof(h)) && !memcmp(ma, mb, sizeof(h)) && memcmp(a, h, sizeof(h)),
               "%s with the skip flag 0 differs from no flag (or did nothing)", kind ? "adamw" : "sgd");
    }
    ops->free(be, p);
    ops->free(be, g);
    ops->free(be, m);
    ops->free(be, v);
    ops->free(be, flag);
}

/* rt_optim_unscale: exactly g * (1 / scale), and 1 only when a gradient was non-finite (the flag is reset per
 * call). */
static void check_optim_unscale(struct rt_backend *be)
{
    const float scale = 3.0f, inv = 1.0f / scale; /* not a power of two: the product is rounded, and must be alike */
    float host[NP], back[NP];
    for (int i = 0; i < NP; i++)
        host[i] = (float)(i % 89) * 0.37f - 16.0f;
    struct rt_model *m = small_model(be);
    struct rt_optim *opt = NULL;
    struct rt_optim_opts oo = {.kind = RT_OPT_ADAM, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    if (m)
        CHECK_OK(rt_optim_create(m, &oo, &opt));
    if (!opt) {
        rt_model_destroy(m);
        return;
    }
    rt_model_write(m, RT_MODEL_GRADS, 0, host, NP);
    int found = rt_optim_unscale(opt, scale);
    rt_model_read(m, RT_MODEL_GRADS, 0, NP, back);
    int exact = 1;
    for (int i = 0; i < NP; i++)
        exact &= back[i] == host[i] * inv;
    CHECKF(found == 0 && exact, "optim unscale, finite: returned %d, products %s", found, exact ? "exact" : "differ");
    host[NP - 1] = INFINITY;
    rt_model_write(m, RT_MODEL_GRADS, 0, host, NP);
    found = rt_optim_unscale(opt, scale);
    CHECKF(found == 1, "optim unscale: an Inf in the last gradient returns %d, not 1", found);
    host[NP - 1] = 1.0f;
    rt_model_write(m, RT_MODEL_GRADS, 0, host, NP);
    found = rt_optim_unscale(opt, scale);
    CHECKF(found == 0, "optim unscale: finite again after an overflow returns %d, not 0", found);
    rt_optim_destroy(opt);
    rt_model_destroy(m);
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
    check_scaler();
    check_unscale(be);
    check_optim_unscale(be);
    check_device_scaler(be);
    check_skip(be);
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
