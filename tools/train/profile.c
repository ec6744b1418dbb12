/*
 * profile.c - the step profile and its verdict: where each optimizer step's
 * time goes (data wait, copy, forward, backward, exposed communication,
 * optimizer, the rest), p50 and p99 over the run and over each epoch (the
 * --metrics records), and what limits the run with the next thing to try.
 * Also the trace's step spans: the step on the training thread, and the
 * compute stream's layers from the timeline.
 *
 * Forward, backward and the optimizer are timed on the compute stream (a
 * timeline: CUDA events on a GPU, the host clock on the CPU), the rest on the
 * host. A step's timeline is read at the end of the next one, when that
 * step's work is queued behind it, so reading never leaves the stream idle
 * (the steps use two timelines in turn); profile_flush() reads the last one
 * where every step must be in (an epoch's end, a trace window's end).
 *
 * With --profile-ops also the op profile: the model marks the stream before
 * and after every op it issues (two CUDA events per op; host times on the
 * CPU, whose ops are done when they return), so that each op's own time is
 * the difference of its pair and the rest of the step's span on the stream,
 * the gaps between one op's end and the next one's begin, is the stream
 * waiting for the host ("idle"). The optimizer's span counts as one op.
 * Every step is marked; the figures are those of the steps after the
 * warm-up, or of all of them in a shorter run, as for the step profile.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/trace.h"
#include "loader/verdict.h"
#include "tools/train/driver.h"

static const char *const phase_names[PROF_N] = {"data wait", "copy", "forward", "backward",
                                                "exposed comm", "optimizer", "rest", "step"};
static const char *const phase_keys[PROF_N] = {"data", "copy", "forward", "backward",
                                               "comm", "optimizer", "rest", "step"};

/* Bin 0 holds times under 1 us; bin b >= 1 holds [1 us * 1.02^(b-1), 1 us * 1.02^b). */
static int bin_of(uint64_t ns)
{
    if (ns < 1000)
        return 0;
    int b = 1 + (int)floor(log((double)ns / 1000.0) / log(1.02));
    return RT_MIN(b, PROF_BINS - 1);
}

static double bin_value(int b)
{
    return b == 0 ? 0.0 : 1000.0 * pow(1.02, (double)b - 0.5);
}

static double percentile(const uint32_t *h, uint64_t n, double q)
{
    if (!n)
        return 0;
    const uint64_t rank = (uint64_t)ceil(q * (double)n);
    uint64_t seen = 0;
    for (int b = 0; b < PROF_BINS; b++)
        if ((seen += h[b]) >= RT_MAX(rank, 1))
            return bin_value(b);
    return bin_value(PROF_BINS - 1);
}

int profile_create(struct train *T)
{
    struct train_profile *p = &T->prof;
    for (int i = 0; i < PROF_SETS; i++)
        if (!(p->set[i].bins = rt_calloc(PROF_N, sizeof(*p->set[i].bins), "step profile")))
            return -ENOMEM;
    /* Per-layer marks only while tracing: each layer's forward and backward, per micro-batch. With the op
     * profile, the layer marks and two per op: a layer issues at most two ops forward (a scale: copy, scale)
     * and two backward (a convolution: filter, data; a residual add: a copy or axpy per input), so 10 marks
     * per layer; the input, the loss's three ops, and the phase marks, 16. */
    const int layers = RT_MAX(rt_model_node_count(T->model), 1);
    const int per_micro = T->cfg.profile_ops ? 10 * layers + 16 : T->tr.rec ? 2 * layers + 8 : 6;
    const int cap = per_micro * (int)T->cfg.grad_accum + 4;
    for (int i = 0; i < 2; i++) {
        const int rc = rt_timeline_create(T->be, cap, &p->tls[i]);
        if (rc < 0)
            return rc;
    }
    p->tl = p->tls[0];
    if (T->cfg.profile_ops && T->tr.rec &&
        !(p->ops.layer = rt_calloc((size_t)cap, sizeof(*p->ops.layer), "op profile")))
        return -ENOMEM;
    return 0;
}

void profile_destroy(struct train *T)
{
    for (int i = 0; i < 2; i++) {
        rt_timeline_destroy(T->prof.tls[i]);
        T->prof.tls[i] = NULL;
    }
    T->prof.tl = NULL;
    free(T->prof.ops.op);
    free(T->prof.ops.layer);
    memset(&T->prof.ops, 0, sizeof(T->prof.ops));
    for (int i = 0; i < PROF_SETS; i++) {
        free(T->prof.set[i].bins);
        T->prof.set[i].bins = NULL;
    }
}

void profile_epoch_reset(struct train *T)
{
    for (int i = PROF_EPOCH; i <= PROF_EPOCH_ALL; i++) {
        memset(T->prof.set[i].bins, 0, PROF_N * sizeof(*T->prof.set[i].bins));
        T->prof.set[i].steps = 0;
    }
}

static void hist_add(struct prof_hist *h, const int bin[PROF_N])
{
    for (int k = 0; k < PROF_N; k++)
        h->bins[k][bin[k]]++;
    h->steps++;
}

void profile_update_begin(struct train *T)
{
    struct train_profile *p = &T->prof;
    /* The timeline the step before last used: read at the last step's end. */
    p->tl = p->tls[T->pos.update & 1u];
    p->per_layer = rt_trace_live();
    p->now = (struct prof_step){.t_step0 = rt_now_ns(), .per_layer = p->per_layer, .tl = p->tl};
    /* Only the differences between marks are exact, but with tracing (the trace's device tracks sit on the host's
     * clock: on CUDA from a base point the timeline waited for once, compute.h). */
    rt_timeline_start(p->tl, rt_backend_stream(T->be), rt_trace_live());
}

void profile_micro(struct train *T, const struct train_batch *b)
{
    struct train_profile *p = &T->prof;
    const uint64_t wait = b->t_ready - b->t_start;
    /* The next batch's copy is issued inside the wait: it counts as copy, as does the wait for this one's. */
    p->now.cur[PROF_DATA] += wait > b->copy_issue_ns ? wait - b->copy_issue_ns : 0;
    p->now.cur[PROF_COPY] += b->copy_issue_ns + b->copy_wait_ns;
    p->now.micro++;
    if (rt_trace_live())
        rt_trace_span(RT_TRACE_STEP, "data wait", NULL, b->t_start, b->t_ready);
}

void profile_model_opts(struct train *T, struct rt_step_opts *so)
{
    rt_timeline_mark(T->prof.tl, "start", MARK_MICRO);
    so->timeline = T->prof.tl;
    so->per_layer = T->prof.per_layer;
    so->per_op = T->cfg.profile_ops;
}

/* ---- the op profile (--profile-ops) ----------------------------------------------- */

/* Adds `ns` and one to the sets the step counts in: all, and steady after the warm-up. */
static void sets_add(uint64_t sum[OPS_SETS], uint64_t count[OPS_SETS], uint64_t ns, int steady)
{
    for (int k = 0; k <= steady; k++) {
        sum[k] += ns;
        count[k]++;
    }
}

/* Adds `ns` and a call to op `name` in the sets the step counts in. */
static void ops_add(struct train_opprof *o, const char *name, uint64_t ns, int steady)
{
    /* The names are static strings: the pointer finds the op, the strcmp()s only a name whose copies at two
     * call sites were not merged. */
    int i = 0;
    while (i < o->nop && o->op[i].name != name)
        i++;
    if (i == o->nop)
        for (i = 0; i < o->nop && strcmp(o->op[i].name, name) != 0; i++)
            ;
    if (i == o->nop) {
        if (o->nop == o->cap) {
            const int cap = o->cap ? 2 * o->cap : 64;
            struct opprof_op *nv = realloc(o->op, (size_t)cap * sizeof(*nv));
            if (!nv)
                return; /* no memory for a new name: the op's time counts as idle */
            o->op = nv;
            o->cap = cap;
        }
        o->op[o->nop++] = (struct opprof_op){.name = name};
    }
    sets_add(o->op[i].ns, o->op[i].calls, ns, steady);
}

/* The layer each mark's op belongs to, for the trace: the label of the next layer mark after it ("loss" for the
 * loss's ops), none past the model's last one. */
static void ops_layers(const struct rt_timeline_mark *m, int n, const char **layer)
{
    const char *next = NULL;
    for (int i = n - 1; i >= 0; i--) {
        switch (m[i].kind) {
        case RT_MARK_INPUT:
        case RT_MARK_LAYER_FWD:
        case RT_MARK_FORWARD:
        case RT_MARK_LAYER_BWD:
            next = m[i].label;
            break;
        case RT_MARK_OP_BEGIN:
        case RT_MARK_OP_END:
            break;
        default:
            next = NULL;
            break;
        }
        layer[i] = next;
    }
}

/* One step's marks into the op profile; with tracing (track >= 0), each op a span on the compute stream's track,
 * inside its layer's (the ops' marks lie between the layer marks). */
static void ops_step(struct train *T, const struct rt_timeline_mark *m, int n, int track)
{
    struct train_opprof *o = &T->prof.ops;
    if (!T->cfg.profile_ops || n < 2)
        return;
    const int steady = T->prof.steps_seen >= PROF_WARMUP;
    if (track >= 0 && o->layer)
        ops_layers(m, n, o->layer);
    uint64_t begin = 0, optim0 = 0;
    int open = 0, optim_open = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t t = m[i].ns;
        switch (m[i].kind) {
        case RT_MARK_OP_BEGIN:
            o->unpaired += open;
            begin = t;
            open = 1;
            break;
        case RT_MARK_OP_END:
            if (!open) {
                o->unpaired++;
                break;
            }
            ops_add(o, m[i].label, t > begin ? t - begin : 0, steady);
            if (track >= 0)
                rt_trace_span_on(track, RT_TRACE_COMPUTE, m[i].label, o->layer ? o->layer[i] : NULL, begin, t);
            open = 0;
            break;
        case MARK_OPTIM_START:
            optim0 = t;
            optim_open = 1;
            break;
        case MARK_OPTIM_END:
            if (optim_open)
                ops_add(o, "optimizer", t > optim0 ? t - optim0 : 0, steady);
            optim_open = 0;
            break;
        default:
            break;
        }
    }
    o->unpaired += open;
    sets_add(o->span_ns, o->steps, m[n - 1].ns > m[0].ns ? m[n - 1].ns - m[0].ns : 0, steady);
}

static const char *const op_cat_keys[OPC_N] = {"conv_fwd", "data_grad", "weight_grad", "batchnorm", "elementwise",
                                               "pooling", "loss", "optimizer", "copies", "other", "idle"};

const char *profile_op_category_key(enum op_cat k)
{
    return (unsigned)k < OPC_N ? op_cat_keys[k] : "other";
}

/* 1 if `op` is `prefix` followed by nothing or by "_..." (a family: "relu" takes relu_fwd and relu_bwd, not
 * "relux"). */
static int op_family(const char *op, const char *prefix)
{
    const size_t n = strlen(prefix);
    return strncmp(op, prefix, n) == 0 && (op[n] == 0 || op[n] == '_');
}

enum op_cat profile_op_category(const char *op)
{
    /* The table's names (compute.h's RT_OPS_LIST), by what the time is spent on, as the bench sums PyTorch's
     * aten ops: the convolutions and linear layers by direction; the memory section of the table (its moves,
     * zeroing, allocation and waits) and the casts as copies. */
    static const struct {
        const char *family;
        enum op_cat cat;
    } fam[] = {{"conv2d_fwd", OPC_CONV_FWD},        {"linear_fwd", OPC_CONV_FWD},
               {"conv2d_bwd_data", OPC_DATA_GRAD},  {"linear_bwd_data", OPC_DATA_GRAD},
               {"conv2d_bwd_filter", OPC_WEIGHT_GRAD}, {"linear_bwd_filter", OPC_WEIGHT_GRAD},
               {"bn", OPC_BATCHNORM},               {"relu", OPC_ELEMENTWISE},
               {"add", OPC_ELEMENTWISE},            {"scale", OPC_ELEMENTWISE},
               {"axpy", OPC_ELEMENTWISE},           {"dropout", OPC_ELEMENTWISE},
               {"gelu", OPC_ELEMENTWISE},           {"maxpool", OPC_POOLING},
               {"avgpool", OPC_POOLING},            {"gap", OPC_POOLING},
               {"flatten", OPC_POOLING},            {"xent_fwd_bwd", OPC_LOSS},
               {"optimizer", OPC_OPTIMIZER},        {"input_u8", OPC_COPIES},
               {"upload", OPC_COPIES},              {"download", OPC_COPIES},
               {"copy", OPC_COPIES},                {"zero", OPC_COPIES},
               {"to_nchw", OPC_COPIES},             {"from_nchw", OPC_COPIES},
               {"cast", OPC_COPIES},                {"alloc", OPC_COPIES},
               {"free", OPC_COPIES},                {"sync", OPC_COPIES}};
    for (size_t i = 0; i < RT_ARRAY_LEN(fam); i++)
        if (op_family(op, fam[i].family))
            return fam[i].cat;
    return OPC_OTHER;
}

static int by_ms(const void *a, const void *b)
{
    const struct op_row *x = a, *y = b;
    if (x->ms != y->ms)
        return x->ms > y->ms ? -1 : 1;
    return strcmp(x->name, y->name);
}

int profile_op_stats(const struct train *T, struct op_stats *out)
{
    const struct train_opprof *o = &T->prof.ops;
    memset(out, 0, sizeof(*out));
    const int k = o->steps[OPS_STEADY] ? OPS_STEADY : OPS_ALL;
    if (!o->steps[k])
        return 0;
    out->steps = o->steps[k];
    out->warm = k == OPS_ALL;
    const double per = 1e-6 / (double)o->steps[k]; /* ns summed over the steps -> ms per step */
    out->step_ms = (double)o->span_ns[k] * per;
    if (!(out->row = rt_calloc((size_t)RT_MAX(o->nop, 1), sizeof(*out->row), "op profile")))
        return -ENOMEM;
    double own = 0;
    for (int i = 0; i < o->nop; i++) {
        if (!o->op[i].calls[k])
            continue; /* seen in the warm-up only */
        struct op_row *r = &out->row[out->nrow++];
        r->name = o->op[i].name;
        r->cat = profile_op_category(r->name);
        r->ms = (double)o->op[i].ns[k] * per;
        r->calls = (double)o->op[i].calls[k] / (double)o->steps[k];
        out->cat_ms[r->cat] += r->ms;
        own += r->ms;
    }
    /* On one stream the ops follow each other, so their own times fit in the span: the rest is waiting. */
    out->cat_ms[OPC_IDLE] = out->step_ms > own ? out->step_ms - own : 0;
    qsort(out->row, (size_t)out->nrow, sizeof(*out->row), by_ms);
    return 0;
}

void profile_op_stats_free(struct op_stats *s)
{
    free(s->row);
    s->row = NULL;
    s->nrow = 0;
}

/* Adds step s's device phases to s->cur; with tracing, the compute stream's spans. */
static void device_phases(struct train *T, struct prof_step *s)
{
    const struct rt_timeline_mark *m;
    const int n = rt_timeline_read(s->tl, &m);
    const int track = s->per_layer ? rt_trace_track("compute stream", 1) : -1;
    uint64_t prev = 0, fwd0 = 0, bwd0 = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t t = m[i].ns, d = prev && t > prev ? t - prev : 0;
        switch (m[i].kind) {
        case RT_MARK_OP_BEGIN:
        case RT_MARK_OP_END:
            /* The op profile's marks (ops_step) lie inside the phases and layers: each span runs from the phase
             * or layer mark before it. */
            continue;
        case MARK_MICRO:
            fwd0 = t;
            break;
        case RT_MARK_INPUT:
        case RT_MARK_LAYER_FWD:
            s->cur[PROF_FORWARD] += d;
            rt_trace_span_on(track, RT_TRACE_COMPUTE, "fwd", m[i].label, prev, t);
            break;
        case RT_MARK_FORWARD:
            s->cur[PROF_FORWARD] += d;
            rt_trace_span_on(track, RT_TRACE_COMPUTE, "loss", NULL, prev, t);
            rt_trace_span_on(track, RT_TRACE_COMPUTE, "forward", NULL, fwd0, t);
            bwd0 = t;
            break;
        case RT_MARK_LAYER_BWD:
            s->cur[PROF_BACKWARD] += d;
            rt_trace_span_on(track, RT_TRACE_COMPUTE, "bwd", m[i].label, prev, t);
            break;
        case RT_MARK_BACKWARD:
            s->cur[PROF_BACKWARD] += d;
            rt_trace_span_on(track, RT_TRACE_COMPUTE, "backward", NULL, bwd0, t);
            break;
        case MARK_GRAPH: /* a replayed micro-batch: its forward and backward are one span, counted as backward */
            s->cur[PROF_BACKWARD] += d;
            rt_trace_span_on(track, RT_TRACE_COMPUTE, "forward+backward (graph)", NULL, prev, t);
            break;
        case MARK_OPTIM_END:
            s->cur[PROF_OPTIM] += d;
            rt_trace_span_on(track, RT_TRACE_OPTIM, "optimizer", NULL, prev, t);
            break;
        default: /* MARK_OPTIM_START: the gap before it is the stream's wait for the all-reduce */
            s->comm_dev += d;
            break;
        }
        prev = t;
    }
    ops_step(T, m, n, track);
}

/* Step s's device phases (its timeline read: the caller knows the stream has work queued behind it, or is
 * flushing), then the step into the histograms and, when it was traced, its spans. */
static void step_finish(struct train *T, struct prof_step *s)
{
    struct train_profile *p = &T->prof;
    device_phases(T, s);
    s->pending = 0;
    /* Exposed communication: where the host no longer waits for the all-reduce (the stream does, late mode),
     * the stream's wait before the optimizer says it; where the host waits, both say the same time. */
    if (s->comm_dev > s->cur[PROF_COMM]) {
        meter_comm(&T->meter, s->comm_dev - s->cur[PROF_COMM]);
        s->cur[PROF_COMM] = s->comm_dev;
    }
    s->cur[PROF_STEP] = s->t_end - s->t_step0;
    uint64_t parts = 0;
    for (int k = 0; k < PROF_REST; k++)
        parts += s->cur[k];
    s->cur[PROF_REST] = s->cur[PROF_STEP] > parts ? s->cur[PROF_STEP] - parts : 0;
    int bin[PROF_N]; /* each phase's bin, once for the sets it goes into */
    for (int k = 0; k < PROF_N; k++)
        bin[k] = bin_of(s->cur[k]);
    hist_add(&p->set[PROF_RUN_ALL], bin);
    hist_add(&p->set[PROF_EPOCH_ALL], bin);
    if (p->steps_seen++ >= PROF_WARMUP) {
        hist_add(&p->set[PROF_RUN], bin);
        hist_add(&p->set[PROF_EPOCH], bin);
    }
    if (s->per_layer && rt_trace_live()) {
        char label[24];
        snprintf(label, sizeof(label), "%" PRIu64, s->update);
        rt_trace_span(RT_TRACE_STEP, "step", label, s->t_step0, s->t_end);
        const double imgs = (double)T->cfg.batch * s->micro * T->world;
        rt_trace_counter("images/s", imgs / ((double)s->cur[PROF_STEP] * 1e-9), s->t_end);
        if (T->scaling)
            rt_trace_counter("loss scale", s->scale, s->t_end);
    }
}

/*
 * The step's end. Its timeline is read at the next step's end, when that
 * step's work is queued behind it (no host wait): the step before it is
 * added now. profile_flush() adds the last one where the run needs every
 * step counted (an epoch's end, a trace window's end).
 */
void profile_update_end(struct train *T)
{
    struct train_profile *p = &T->prof;
    p->now.t_end = rt_now_ns();
    p->now.cur[PROF_COMM] = T->step_comm_ns;
    p->now.update = T->pos.update - 1;
    p->now.scale = T->scaler.scale;
    profile_flush(T);
    p->late = p->now;
    p->late.pending = 1;
}

void profile_flush(struct train *T)
{
    if (T->prof.late.pending)
        step_finish(T, &T->prof.late);
}

/* The percentiles of the steps after the warm-up, or of every step where there are none after it. */
static void hist_stats(const struct prof_hist *steady, const struct prof_hist *all, struct prof_stats *out)
{
    const struct prof_hist *h = steady->steps > 0 ? steady : all;
    out->steps = h->steps;
    out->warm = h == all;
    for (int k = 0; k < PROF_N; k++) {
        out->p50[k] = percentile(h->bins[k], h->steps, 0.50);
        out->p99[k] = percentile(h->bins[k], h->steps, 0.99);
    }
}

void profile_stats(const struct train *T, struct prof_stats *out)
{
    hist_stats(&T->prof.set[PROF_RUN], &T->prof.set[PROF_RUN_ALL], out);
}

void profile_epoch_stats(const struct train *T, struct prof_stats *out)
{
    hist_stats(&T->prof.set[PROF_EPOCH], &T->prof.set[PROF_EPOCH_ALL], out);
}

/* ---- the verdict ------------------------------------------------------------------ */

/* What limits the run, from the p50s: rt_step_limit's rules (loader/verdict.h), the trainer's words and knobs. */
static double share_of(double part, double step)
{
    return step > 0 ? part / step : 0;
}

/* What each pick maximises: the negated value where the pick is a minimum. */
static void pick_keys(const struct prof_rank *k, double key[PICK_N])
{
    key[PICK_WORST_DATA] = share_of(k->data, k->step);
    key[PICK_SLOW] = k->compute;
    key[PICK_FAST] = -k->compute;
    key[PICK_LEAST_COMM] = -share_of(k->comm, k->step);
}

void profile_pick(const struct prof_rank *ranks, int world, struct prof_picks *out)
{
    double best[PICK_N];
    pick_keys(&ranks[0], best);
    for (int i = 0; i < PICK_N; i++)
        out->rank[i] = 0;
    for (int r = 1; r < world; r++) {
        double key[PICK_N];
        pick_keys(&ranks[r], key);
        for (int i = 0; i < PICK_N; i++)
            if (key[i] > best[i]) {
                best[i] = key[i];
                out->rank[i] = r;
            }
    }
    for (int i = 0; i < PICK_N; i++)
        out->r[i] = ranks[out->rank[i]];
}

/* The shares rt_step_limit reads: the worst data wait's on its own rank's step, the others of the p50 step. */
static struct rt_step_shares step_shares(const struct prof_stats *st, const struct prof_picks *k)
{
    const double step = st->p50[PROF_STEP] > 0 ? st->p50[PROF_STEP] : 1;
    const struct prof_rank *rw = &k->r[PICK_WORST_DATA], *rl = &k->r[PICK_LEAST_COMM];
    return (struct rt_step_shares){
        .data = share_of(rw->data, rw->step), .comm = st->p50[PROF_COMM] / step,
        .comm_least = share_of(rl->comm, rl->step),
        .imbalance = share_of(k->r[PICK_SLOW].compute - k->r[PICK_FAST].compute, st->p50[PROF_COMM]),
        .host = (st->p50[PROF_REST] + st->p50[PROF_COPY]) / step};
}

static void say_input(const struct train *T, const struct prof_picks *k, const struct rt_step_shares *sh,
                      struct prof_verdict *p)
{
    const struct train_cfg *c = &T->cfg;
    const struct prof_rank *rw = &k->r[PICK_WORST_DATA];
    char alone[96];
    rt_verdict_alone(rw->step, rw->data, (double)c->batch * c->grad_accum * T->world, alone, sizeof(alone));
    snprintf(p->evidence, sizeof(p->evidence), "rank %d waits %.1f ms for data in a %.1f ms step (%.0f%%)%s",
             k->rank[PICK_WORST_DATA], rw->data * 1e-6, rw->step * 1e-6, 100 * sh->data, alone);
    snprintf(p->advice, sizeof(p->advice),
             "more loader workers (--workers %d; now %d)%s; `ringtrain loadbench DIR --target FILE.json` with "
             "this run's --json output shows whether the loader can feed the model",
             RT_MAX(c->workers, 1) * 2, RT_MAX(c->workers, 1),
             c->stage_to ? "" : "; stage the data to node-local disk (--stage-to $TMPDIR, or `ringtrain stage`)");
}

static void say_slower_rank(const struct prof_stats *st, const struct prof_picks *k, const struct rt_step_shares *sh,
                            struct prof_verdict *p)
{
    snprintf(p->evidence, sizeof(p->evidence),
             "the all-reduce wait here (%.1f ms, %.0f%% of the step) is for a slower rank: rank %d waits %.0f%%; "
             "forward + backward take %.1f ms on rank %d and %.1f ms on rank %d",
             st->p50[PROF_COMM] * 1e-6, 100 * sh->comm, k->rank[PICK_LEAST_COMM], 100 * sh->comm_least,
             k->r[PICK_SLOW].compute * 1e-6, k->rank[PICK_SLOW], k->r[PICK_FAST].compute * 1e-6,
             k->rank[PICK_FAST]);
    snprintf(p->advice, sizeof(p->advice),
             "give every rank the same cores and device (ranks sharing cores, or a busy node, run out of step); "
             "`ringtrain ranks` shows each rank's CPUs");
}

static void say_comm(const struct train *T, const struct prof_stats *st, const struct rt_step_shares *sh,
                     struct prof_verdict *p)
{
    const struct train_cfg *c = &T->cfg;
    snprintf(p->evidence, sizeof(p->evidence),
             "the all-reduce left %.1f ms of a %.1f ms step exposed (%.0f%%) over %d buckets, on every rank (%.0f%% "
             "at least)",
             st->p50[PROF_COMM] * 1e-6, st->p50[PROF_STEP] * 1e-6, 100 * sh->comm, rt_bucketer_count(T->bucketer),
             100 * sh->comm_least);
    if (c->no_overlap)
        snprintf(p->advice, sizeof(p->advice), "drop --no-overlap so buckets reduce while backward runs");
    else
        snprintf(p->advice, sizeof(p->advice),
                 "another bucket size (--bucket-cap-mb %g and %g; now %g); `ringtrain commbench` shows what the link "
                 "carries at each size; a larger --batch-size or --grad-accum sends less per image",
                 c->bucket_cap_mb / 2, c->bucket_cap_mb * 2, c->bucket_cap_mb);
}

static void say_host(const struct train *T, const struct prof_stats *st, const struct rt_step_shares *sh,
                     struct prof_verdict *p)
{
    const struct train_cfg *c = &T->cfg;
    snprintf(p->evidence, sizeof(p->evidence),
             "%.1f ms of a %.1f ms step (%.0f%%) is spent outside data, compute and communication",
             (st->p50[PROF_REST] + st->p50[PROF_COPY]) * 1e-6, st->p50[PROF_STEP] * 1e-6, 100 * sh->host);
    snprintf(p->advice, sizeof(p->advice),
             "leave cores to the loader and the comm thread (--threads %d; now %d); a larger --batch-size spreads "
             "the per-step work; look at the trace's training thread between the phases",
             RT_MAX(c->threads - 1, 1), c->threads);
}

static void say_compute(const struct train *T, const struct prof_stats *st, const struct rt_step_shares *sh,
                        struct prof_verdict *p)
{
    const double step = st->p50[PROF_STEP] > 0 ? st->p50[PROF_STEP] : 1;
    const double compute = (st->p50[PROF_FORWARD] + st->p50[PROF_BACKWARD] + st->p50[PROF_OPTIM]) / step;
    snprintf(p->evidence, sizeof(p->evidence),
             "forward %.1f + backward %.1f + optimizer %.1f ms are %.0f%% of a %.1f ms step; data wait %.0f%%, "
             "exposed comm %.0f%%",
             st->p50[PROF_FORWARD] * 1e-6, st->p50[PROF_BACKWARD] * 1e-6, st->p50[PROF_OPTIM] * 1e-6, 100 * compute,
             step * 1e-6, 100 * sh->data, 100 * sh->comm);
    snprintf(p->advice, sizeof(p->advice), "%s",
             rt_backend_kind_of(T->be) == RT_BACKEND_CUDA
                 ? "16-bit activations (--amp bf16 or fp16) or a larger --batch-size to fill the GPU"
                 : "the model is the limit here: more ranks (each with its cores), a smaller model, or a GPU");
}

void profile_verdict(const struct train *T, const struct prof_stats *st, const struct prof_picks *k,
                     struct prof_verdict *p)
{
    const struct rt_step_shares sh = step_shares(st, k);
    const enum rt_limit l = rt_step_limit(&sh);
    snprintf(p->limit, sizeof(p->limit), "%s", rt_limit_word(l));
    switch (l) {
    case RT_LIMIT_INPUT: say_input(T, k, &sh, p); break;
    case RT_LIMIT_SLOWER_RANK: say_slower_rank(st, k, &sh, p); break;
    case RT_LIMIT_COMM: say_comm(T, st, &sh, p); break;
    case RT_LIMIT_HOST: say_host(T, st, &sh, p); break;
    case RT_LIMIT_COMPUTE: say_compute(T, st, &sh, p); break;
    }
}

void profile_gather(struct train *T)
{
    struct prof_stats st;
    profile_stats(T, &st);
    const struct prof_rank mine = {st.p50[PROF_DATA], st.p50[PROF_STEP], st.p50[PROF_COMM],
                                   st.p50[PROF_FORWARD] + st.p50[PROF_BACKWARD]};
    /* Three small all-reduces (O(log n) each), never a gather of every rank's row: the best key of each pick,
     * the lowest rank that holds it, and that rank's row. */
    double key[PICK_N], best[PICK_N];
    pick_keys(&mine, key);
    memcpy(best, key, sizeof(best));
    rt_comm_allreduce(T->comm, best, PICK_N, RT_COMM_F64, RT_RED_MAX, "the step profiles' extremes");
    int32_t who[PICK_N];
    for (int i = 0; i < PICK_N; i++)
        who[i] = key[i] == best[i] ? T->rank : INT32_MAX;
    rt_comm_allreduce(T->comm, who, PICK_N, RT_COMM_I32, RT_RED_MIN, "the step profiles' extremes");
    struct prof_picks k;
    memset(&k, 0, sizeof(k));
    for (int i = 0; i < PICK_N; i++) {
        k.rank[i] = who[i];
        if (who[i] == T->rank)
            k.r[i] = mine;
    }
    rt_comm_allreduce(T->comm, k.r, PICK_N * 4, RT_COMM_F64, RT_RED_SUM, "the step profiles' extremes");
    profile_verdict(T, &st, &k, &T->verdict);
    T->verdict.have = 1;
    T->verdict.st = st;
}

const char *profile_phase_name(enum prof_phase k)
{
    return phase_names[k];
}

const char *profile_phase_key(enum prof_phase k)
{
    return phase_keys[k];
}
