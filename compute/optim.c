/*
 * optim.c - optimizers over a model's flat parameter buffer (SGD with
 * momentum, Nesterov and weight decay; Adam; AdamW), gradient clipping by
 * global norm, unscaling of loss-scaled gradients, and the learning-rate
 * schedules. An optimizer is bound to its model's trainable parameters and
 * their gradients when it is created, so no call passes buffers. The
 * arithmetic is the backend's (sgd_update / adam_update / unscale_check in
 * the op table); this file keeps the state buffers, the device scalars the
 * checks land in and the step count, and computes learning rates on the
 * host.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compute/compute.h"

struct rt_optim {
    const struct rt_model *model; /* bound at creation */
    struct rt_backend *be;
    const struct rt_ops *ops;
    struct rt_optim_opts o;
    float *params;   /* the model's, floats [0, n) */
    float *grads;    /* the model's, n floats */
    size_t n;        /* rt_model_trainable_count() */
    size_t head_n;   /* rt_model_head_count(): the first group of rt_optim_step_groups */
    int64_t steps;
    float *state[2]; /* SGD: momentum_buffer; Adam: exp_avg, exp_avg_sq */
    int nstate;
    float *norm;     /* device scalar for rt_clip_grad_norm() */
    float *found;    /* device scalar for rt_optim_unscale() */
    float *scale;    /* device scalar: rt_optim_unscale()'s scale */
    const float *skip; /* rt_optim_skip_if(); NULL: never */
};

int rt_optim_create(struct rt_model *m, const struct rt_optim_opts *o, struct rt_optim **out)
{
    *out = NULL;
    if (o->kind != RT_OPT_SGD && o->kind != RT_OPT_ADAM && o->kind != RT_OPT_ADAMW)
        return rt_errf(-EINVAL, "unknown optimizer %d", (int)o->kind);
    if (o->kind == RT_OPT_SGD && o->nesterov && (o->momentum <= 0.0f || o->dampening != 0.0f))
        return rt_errf(-EINVAL, "Nesterov momentum needs a momentum above 0 and no dampening");
    if (o->weight_decay < 0.0f || o->momentum < 0.0f)
        return rt_errf(-EINVAL, "momentum and weight decay must not be negative");
    struct rt_optim *opt = rt_calloc(1, sizeof(*opt), "optimizer");
    if (!opt)
        return -ENOMEM;
    struct rt_backend *be = rt_model_backend(m);
    const size_t n = rt_model_trainable_count(m);
    opt->model = m;
    opt->be = be;
    opt->ops = rt_backend_ops(be);
    opt->o = *o;
    opt->params = rt_model_params(m);
    opt->grads = rt_model_grads(m);
    opt->n = n;
    opt->head_n = RT_MIN(rt_model_head_count(m), n);
    if (o->kind == RT_OPT_SGD)
        opt->nstate = o->momentum != 0.0f ? 1 : 0;
    else
        opt->nstate = 2;
    for (int i = 0; i < opt->nstate; i++) {
        opt->state[i] = opt->ops->alloc(be, n * sizeof(float));
        if (!opt->state[i]) {
            rt_optim_destroy(opt);
            return -ENOMEM;
        }
    }
    if (!(opt->norm = opt->ops->alloc(be, sizeof(float))) || !(opt->found = opt->ops->alloc(be, sizeof(float))) ||
        !(opt->scale = opt->ops->alloc(be, sizeof(float)))) {
        rt_optim_destroy(opt);
        return -ENOMEM;
    }
    *out = opt;
    return 0;
}

void rt_optim_destroy(struct rt_optim *opt)
{
    if (!opt)
        return;
    for (int i = 0; i < opt->nstate; i++)
        opt->ops->free(opt->be, opt->state[i]);
    opt->ops->free(opt->be, opt->norm);
    opt->ops->free(opt->be, opt->found);
    opt->ops->free(opt->be, opt->scale);
    free(opt);
}

/* The update of floats [off, off + count) at learning rate lr (the step count already advanced). */
static void update(struct rt_optim *opt, size_t off, size_t count, float lr)
{
    struct rt_stream *s = rt_backend_stream(opt->be);
    const struct rt_optim_opts *o = &opt->o;
    float *params = opt->params;
    const float *grads = opt->grads;
    if (!count)
        return;
    if (o->kind == RT_OPT_SGD)
        opt->ops->sgd_update(s, count, params + off, grads + off, opt->state[0] ? opt->state[0] + off : NULL, lr,
                             o->momentum, o->dampening, o->weight_decay, o->nesterov, opt->steps == 1, opt->skip);
    else
        opt->ops->adam_update(s, count, params + off, grads + off, opt->state[0] + off, opt->state[1] + off, lr,
                              o->beta1, o->beta2, o->eps, o->weight_decay, o->kind == RT_OPT_ADAMW, opt->steps,
                              opt->skip);
}

void rt_optim_step(struct rt_optim *opt, float lr)
{
    opt->steps++;
    update(opt, 0, opt->n, lr);
}

void rt_optim_step_groups(struct rt_optim *opt, float lr, float head_lr)
{
    opt->steps++;
    const size_t head_n = head_lr == lr ? 0 : opt->head_n; /* one group: the same ops as rt_optim_step */
    update(opt, 0, head_n, head_lr);
    update(opt, head_n, opt->n - head_n, lr);
}

int64_t rt_optim_steps(const struct rt_optim *opt)
{
    return opt->steps;
}

void rt_optim_set_steps(struct rt_optim *opt, int64_t steps)
{
    opt->steps = steps;
}

const struct rt_model *rt_optim_model(const struct rt_optim *opt)
{
    return opt->model;
}

int rt_optim_state_count(const struct rt_optim *opt)
{
    return opt->nstate;
}

float *rt_optim_state(struct rt_optim *opt, int which, const char **name)
{
    static const char *const sgd[] = {"momentum_buffer"};
    static const char *const adam[] = {"exp_avg", "exp_avg_sq"};
    if (which < 0 || which >= opt->nstate)
        return NULL;
    if (name)
        *name = opt->o.kind == RT_OPT_SGD ? sgd[which] : adam[which];
    return opt->state[which];
}

static const char *const optim_names[] = {"sgd", "adam", "adamw"};

const char *rt_optim_kind_name(enum rt_optim_kind k)
{
    return (unsigned)k < RT_ARRAY_LEN(optim_names) ? optim_names[k] : "?";
}

int rt_optim_kind_parse(const char *s, enum rt_optim_kind *k)
{
    for (size_t i = 0; i < RT_ARRAY_LEN(optim_names); i++)
        if (!strcmp(s, optim_names[i])) {
            *k = (enum rt_optim_kind)i;
            return 0;
        }
    return rt_errf(-EINVAL, "unknown optimizer '%s' (sgd, adam, adamw)", s);
}

const float *rt_clip_grad_norm_async(struct rt_optim *opt, float max_norm)
{
    struct rt_stream *s = rt_backend_stream(opt->be);
    opt->ops->sumsq(s, opt->n, opt->grads, opt->norm);
    if (max_norm > 0.0f)
        opt->ops->clip_scale(s, opt->n, opt->norm, max_norm, opt->grads);
    return opt->norm;
}

float rt_clip_grad_norm(struct rt_optim *opt, float max_norm)
{
    float sq;
    opt->ops->download(rt_backend_stream(opt->be), &sq, rt_clip_grad_norm_async(opt, max_norm), sizeof(float));
    return sqrtf(sq);
}

const float *rt_optim_unscale_async(struct rt_optim *opt, const float *scale)
{
    opt->ops->unscale_check(rt_backend_stream(opt->be), opt->n, opt->grads, scale, opt->found);
    return opt->found;
}

int rt_optim_unscale(struct rt_optim *opt, float scale)
{
    struct rt_stream *s = rt_backend_stream(opt->be);
    float found = 0.0f;
    opt->ops->upload(s, opt->scale, &scale, sizeof(scale));
    opt->ops->download(s, &found, rt_optim_unscale_async(opt, opt->scale), sizeof(found));
    return found != 0.0f;
}

void rt_optim_skip_if(struct rt_optim *opt, const float *flag)
{
    opt->skip = flag;
}

/* ---- schedules -------------------------------------------------------------- */

static const char *const sched_names[] = {"constant", "step", "cosine", "onecycle"};

const char *rt_sched_kind_name(enum rt_sched_kind k)
{
    return (unsigned)k < RT_ARRAY_LEN(sched_names) ? sched_names[k] : "?";
}

int rt_sched_kind_parse(const char *s, enum rt_sched_kind *k)
{
    for (size_t i = 0; i < RT_ARRAY_LEN(sched_names); i++)
        if (!strcmp(s, sched_names[i])) {
            *k = (enum rt_sched_kind)i;
            return 0;
        }
    return rt_errf(-EINVAL, "unknown schedule '%s' (constant, step, cosine, onecycle)", s);
}

/*
 * constant, step and cosine: an optional linear warm-up from base/warmup to
 * base over warmup_steps, then the schedule over the remaining steps (step:
 * StepLR's base * gamma^(t / step_size); cosine: CosineAnnealingLR to 0).
 * onecycle: PyTorch's OneCycleLR with anneal_strategy='linear' (the DAWNBench
 * recipe's triangle): from base/25 up to base over warmup_steps (30 % of the
 * run when 0), then down to base/25/1e4 at the last step.
 */
float rt_sched_lr(const struct rt_sched *s, uint64_t step)
{
    double base = s->base_lr;
    if (s->kind == RT_SCHED_ONECYCLE) {
        double total = (double)RT_MAX(s->total_steps, 2);
        double up_end = s->warmup_steps ? (double)s->warmup_steps - 1.0 : 0.3 * total - 1.0;
        double initial = base / 25.0, final = initial / 1e4;
        double t = (double)step;
        if (up_end > 0.0 && t <= up_end)
            return (float)(initial + (base - initial) * (t / up_end));
        double start = up_end > 0.0 ? up_end : 0.0;
        double pct = (t - start) / (total - 1.0 - start);
        if (pct > 1.0)
            pct = 1.0;
        return (float)(base + (final - base) * pct);
    }
    if (step < s->warmup_steps)
        return (float)(base * (double)(step + 1) / (double)s->warmup_steps);
    uint64_t t = step - s->warmup_steps;
    uint64_t span = s->total_steps > s->warmup_steps ? s->total_steps - s->warmup_steps : 1;
    switch (s->kind) {
    case RT_SCHED_CONSTANT:
    case RT_SCHED_ONECYCLE:
        return (float)base;
    case RT_SCHED_STEP:
        return (float)(base * pow(s->gamma, (double)(t / RT_MAX(s->step_size, 1))));
    case RT_SCHED_COSINE:
        return (float)(base * 0.5 * (1.0 + cos(M_PI * (double)RT_MIN(t, span) / (double)span)));
    }
    return (float)base;
}
