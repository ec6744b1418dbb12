/*
 * dnn_fast.c - the fast tables' convolutions (fp32, bf16, fp16) and 16-bit linear layers of the CUDA backend
 * (rt_cuda_fast_dnn_fill), chosen as PyTorch chooses them with torch.backends.cudnn.benchmark, and what the
 * backend reports of them (rt_cuda_conv_choices). Semantics are compute.h's, as for dnn.c's reference
 * entries: y overwritten, dx = beta * dx + result, dw and dbias added to.
 *
 * Choice, once per key: (shape with its batch size, direction, activation type, the backend's tf32 and
 * nondeterministic settings, and for backward data the exact beta, which a graph plan bakes in).
 *  - Candidates: every legacy algorithm cuDNN's Find lists (Find's times kept for the log), and, unless
 *    RINGTRAIN_CUDNN_GRAPH=0, the engine configurations cuDNN's graph API offers for an operation graph of
 *    this one convolution (dnn_graph.c: heuristics mode A, then the fallback list), each finalized into an
 *    execution plan. A 16-bit backward filter also gets a second graph whose dw is the fp32 gradient itself
 *    ((K, C, R, S), beta 1): where an engine runs it, the 16-bit scratch and the add pass
 *    (rt_cuda_h_dw_acc) go away.
 *  - Filter before building: dnn_rules.c's rule on what a candidate is known to be (deterministic unless
 *    rt_cuda.nondeterministic; on fp32 data no TF32 unless rt_cuda.tf32 -- FMA math on the legacy
 *    descriptors, CUDNN_DEFAULT_MATH with TF32, tensor-op math in 16 bits; never an engine that narrows its
 *    inputs or accumulates below fp32). Engines that compile kernels at finalize time (runtime compiled)
 *    are built only when no precompiled engine of the graph finalized, at most two: each costs a compilation.
 *    At most 10 plans per graph, in the heuristics' order (PyTorch's default cudnn.benchmark_limit).
 *  - Measurement: every candidate the rule lets through runs on the call's real inputs (the output is the
 *    real y for forward, scratch for the accumulating backward outputs), timed with CUDA events on the
 *    backend's stream: one untimed run (it loads the kernels), then three timed runs, the median kept; a
 *    candidate whose first timed run takes 4x the best so far is not run again. The 16-bit backward filter
 *    candidates that write 16-bit scratch are charged the add pass's measured time. The fastest allowed
 *    wins (a tie goes to less workspace). Workspace is bounded as in dnn.c: half the free memory, at most
 *    DNN_WORKSPACE_CAP, at least what the backend's workspace already holds. This is the one place these
 *    ops wait for the device, once per key.
 *  - Kept: the legacy descriptors (made once per key, with the winner's math type) or the plan with its
 *    graph and a few variant packs; nothing is made per call but a variant pack for new pointers.
 *  - No candidate allowed (or none runs): the key runs as the reference tables run it (dnn.c: which takes a
 *    non-deterministic algorithm when no deterministic one exists, and runs an unsupported 16-bit shape in
 *    fp32 NCHW), announced once.
 *
 * 16-bit weights: a cache of each fp32 weight buffer's 16-bit copy (KRSC for convolutions, as-is for linear
 * layers, padded KRSC for stems), keyed by the fp32 pointer, layout and type (dnn_rules.c's bookkeeping),
 * made again only after rt_cuda_wrote reports a write that overlaps its source: so once per update, and a
 * layer's backward data reuses its forward's copy. Copies are device memory allocated on the stream and
 * freed with the backend.
 *
 * Stems: a 16-bit convolution over Cin channels, Cin not a multiple of 8, runs (forward and backward
 * filter) over Cin rounded up to 8: the input copied into a zero-padded NHWC scratch, the cached weights
 * padded with zeros, the padded weight gradient's real channels added into dw. Decided once per key: when
 * the padded shape has no allowed candidate, the unpadded one is measured as any other (and may end in
 * dnn.c's fp32 fallback). Backward data is never padded.
 *
 * Plans are executed only on 16-byte aligned buffers (the graphs promise that alignment); a call with a
 * misaligned buffer runs as the reference tables run it, announced once. Everything is issued on the
 * stream of the call; execution errors abort through the check macros; a failure to build a graph or plan
 * only drops that candidate (logged at debug level).
 *
 * It does not fuse anything, run convolutions with groups or dilation, or use more than one stream.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compute/cuda/dnn_priv.h"

/* Configurations asked of the heuristics per graph (mode A, fallback), and the most plans built and timed per
 * graph: the heuristics list the likely fastest first, and each plan costs its finalization and a few runs.
 * 10 is PyTorch's default torch.backends.cudnn.benchmark_limit. */
#define LIST_A 32
#define LIST_FB 8
#define MAX_PLANS 10
#define MAX_RTC 2
#define MAX_CANDS (DNN_MAX_ALGOS + 2 * (MAX_PLANS + MAX_RTC))
#define TIMED_RUNS 3
/* A candidate this many times slower than the best so far on its first timed run cannot win. */
#define GIVE_UP 4.0f

enum fast_how {
    HOW_LEGACY = 0, /* a legacy algorithm through the kept descriptors */
    HOW_ENGINE,     /* a graph API plan */
    HOW_STEM,       /* (stem key) the padded shape's entry runs it */
    HOW_UNPADDED,   /* (stem key) the padded shape had no candidate: the unpadded key runs it */
    HOW_REF         /* no candidate allowed: dnn.c's reference entry runs it */
};

struct fast_key {
    struct rt_conv_desc d;
    int dir, dt;
    int stem;              /* 1: the key of a stem's padding decision */
    uint32_t beta;         /* backward data: the bits of beta; 0 otherwise */
    int tf32, nondet;
};

struct fast_entry {
    struct fast_key key;
    enum fast_how how;
    struct conv_descs dd;  /* legacy descriptors (also the bias descriptors of fp32 calls) */
    int have_dd;
    int algo;
    cudnnMathType_t math;
    struct rt_dnn_graph *graph;
    struct rt_dnn_plan *plan;
    int fp32_dw;           /* 16-bit backward filter writing the fp32 dw itself (K, C, R, S), beta 1 */
    size_t workspace;
    struct fast_entry *inner; /* HOW_STEM: the padded shape's entry */
    int cp;                /* HOW_STEM: the padded channel count */
    int for_stem, direct;  /* made for a stem's padded shape; also run by a layer of that shape itself */
    float ms;
    int deterministic, tensor_cores, candidates;
    char how_text[112];
    struct fast_entry *next; /* in its hash bucket */
};

/* Buckets of the choice cache's hash: every convolution call looks its key up. */
#define BUCKETS 256

struct rt_cuda_dnn {
    struct fast_entry **e; /* in the order they were made (rt_cuda_conv_choices lists them so) */
    int n, cap;
    struct fast_entry *bucket[BUCKETS];
    struct rt_dnn_wcache wc;
    struct rt_dnn_stats st; /* st.graph_on: RINGTRAIN_CUDNN_GRAPH, read once */
    int warned_align;
};

/* ---- state ----------------------------------------------------------------------------------------------- */

static _Noreturn void out_of_memory(const char *what, int line)
{
    rt_cuda_fail("libc", ENOMEM, strerror(ENOMEM), what, __FILE__, line);
}

/* RINGTRAIN_CUDNN_GRAPH: 0 leaves the graph API out of the search; anything else keeps it (warned about once,
 * when `warn`, unless it is 1 or empty). */
static int graph_on_env(int warn)
{
    const char *v = getenv("RINGTRAIN_CUDNN_GRAPH");
    if (warn && v && v[0] && strcmp(v, "0") && strcmp(v, "1"))
        rt_log(RT_LOG_WARN, "RINGTRAIN_CUDNN_GRAPH=%s: expected 0 (leave cuDNN's graph API out of the convolution "
                            "search) or 1; using the graph API",
               v);
    return !(v && !strcmp(v, "0"));
}

static struct rt_cuda_dnn *state(struct rt_cuda *c)
{
    if (c->dnn_state)
        return c->dnn_state;
    struct rt_cuda_dnn *st = calloc(1, sizeof(*st));
    if (!st)
        out_of_memory("the fast convolutions' state", __LINE__);
    st->st.graph_on = graph_on_env(1);
    c->dnn_state = st;
    return st;
}

static struct fast_key key_make(const struct rt_cuda *c, const struct rt_conv_desc *d, int dir, enum rt_dtype dt,
                                int stem, float beta)
{
    struct fast_key k;
    memset(&k, 0, sizeof(k)); /* compared with memcmp: no stray padding bytes */
    k.d = *d;
    k.dir = dir;
    k.dt = (int)dt;
    k.stem = stem;
    if (dir == DIR_BWD_DATA)
        memcpy(&k.beta, &beta, sizeof(k.beta));
    k.tf32 = c->tf32;
    k.nondet = c->nondeterministic;
    return k;
}

/* FNV-1a over the key's bytes (zeroed padding: key_make). */
static unsigned key_hash(const struct fast_key *k)
{
    const unsigned char *p = (const unsigned char *)k;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof(*k); i++)
        h = (h ^ p[i]) * 16777619u;
    return h % BUCKETS;
}

static struct fast_entry *lookup(const struct rt_cuda_dnn *st, const struct fast_key *k)
{
    for (struct fast_entry *e = st->bucket[key_hash(k)]; e; e = e->next)
        if (!memcmp(&e->key, k, sizeof(*k)))
            return e;
    return NULL;
}

static void entry_add(struct rt_cuda_dnn *st, struct fast_entry *e)
{
    const unsigned b = key_hash(&e->key);
    e->next = st->bucket[b];
    st->bucket[b] = e;
    if (st->n == st->cap) {
        const int cap = st->cap ? 2 * st->cap : 32;
        struct fast_entry **p = realloc(st->e, (size_t)cap * sizeof(*p));
        if (!p)
            out_of_memory("growing the convolution choice cache", __LINE__);
        st->e = p;
        st->cap = cap;
    }
    st->e[st->n++] = e;
}

static void entry_free(struct fast_entry *e)
{
    if (!e)
        return;
    rt_dnn_plan_destroy(e->plan);
    rt_dnn_graph_destroy(e->graph);
    if (e->have_dd)
        rt_dnn_descs_free(&e->dd);
    free(e);
}

/* "convolution forward of N=... in bf16 NHWC, strict fp32 / TF32, deterministic / any" for logs. */
static void key_describe(const struct fast_key *k, char *buf, size_t len)
{
    char what[256];
    rt_dnn_describe(&k->d, k->dir, rt_dnn_type_of((enum rt_dtype)k->dt), what, sizeof(what));
    float beta;
    memcpy(&beta, &k->beta, sizeof(beta));
    char b[32] = "";
    if (k->dir == DIR_BWD_DATA && beta != 0.0f)
        snprintf(b, sizeof(b), " (beta %g)", (double)beta);
    snprintf(buf, len, "%s%s%s, %s algorithms", what, b,
             k->dt == RT_F32 ? (k->tf32 ? ", TF32 allowed" : ", strict fp32") : "",
             k->nondet ? "any" : "deterministic");
}

/* ---- 16-bit weight copies -------------------------------------------------------------------------------- */

/* The 16-bit copy of fp32 weights w (k, c, rs): as-is (RT_DNN_W_PLAIN, cp == c) or (k, rs, cp), channels past c
 * zero (RT_DNN_W_KRSC). Made on the stream now unless a valid one exists. */
static const void *weights16(struct rt_stream *s, enum rt_dtype dt, int layout, int k, int c, int cp, int rs,
                             const float *w)
{
    struct rt_cuda_dnn *st = state(rt_cuda_of(s));
    const struct rt_dnn_wkey key = {.src = w, .dt = (int)dt, .layout = layout, .k = k, .c = c, .rs = rs, .cpad = cp};
    int i = rt_dnn_wcache_find(&st->wc, &key);
    if (i < 0) {
        i = rt_dnn_wcache_add(&st->wc, &key);
        if (i == -ENOMEM)
            out_of_memory("growing the 16-bit weight cache", __LINE__);
        if (i < 0)
            rt_cuda_fail("ringtrain", -i, "bad weight shape", "rt_dnn_wcache_add", __FILE__, __LINE__);
    }
    struct rt_dnn_wentry *e = &st->wc.e[i];
    if (!e->copy) {
        e->copy_bytes = (size_t)k * (size_t)rs * (size_t)cp * 2;
        RT_CUDA_CHECK(cudaMallocAsync(&e->copy, e->copy_bytes, rt_cuda_stream(s)));
    }
    if (!e->valid) {
        if (layout == RT_DNN_W_PLAIN || cp == c)
            rt_cuda_h_weights(s, dt, k, c, rs, layout == RT_DNN_W_KRSC, w, e->copy);
        else
            rt_dnn_weights_pad(s, dt, k, c, cp, rs, w, e->copy);
        e->valid = 1;
        st->st.weight_casts++;
    }
    return e->copy;
}

void rt_cuda_wrote(struct rt_stream *s, const void *dst, size_t bytes)
{
    struct rt_cuda_dnn *st = rt_cuda_of(s)->dnn_state;
    if (st)
        rt_dnn_wcache_invalidate(&st->wc, dst, bytes);
}

void rt_cuda_freed(struct rt_cuda *c, const void *p)
{
    (void)p;
    if (c->dnn_state)
        rt_dnn_wcache_invalidate_all(&c->dnn_state->wc);
}

/* ---- candidates and their measurement -------------------------------------------------------------------- */

enum { CAND_LEGACY = 0, CAND_ENGINE = 1 };

struct cand {
    int kind;
    int algo;              /* legacy */
    cudnnMathType_t math;
    float find_ms;
    struct rt_dnn_plan *plan; /* engine */
    struct rt_dnn_cfg_info info;
    int graph;             /* index of its graph in the search's graphs[] */
    int fp32_dw;
    struct rt_dnn_cand r;  /* what the rule judges */
};

/* The buffers a search runs its candidates on. */
struct probe {
    const void *in0, *in1; /* forward: x, w; backward data: w, dy; backward filter: x, dy */
    void *out;             /* forward: y; backward: scratch dx, or dw (16-bit (K, R, S, C), or fp32 for fp32 data) */
    void *out32;           /* 16-bit backward filter: scratch fp32 dw (K, C, R, S) for the fp32-dw engines */
    void *ws;
    size_t ws_bytes;
    float beta;            /* the legacy calls' beta: the key's for backward data, 1 for fp32 dw, else 0 */
};

static void cand_name(const struct cand *k, int dir, char *buf, size_t len)
{
    if (k->kind == CAND_LEGACY)
        snprintf(buf, len, "cudnn legacy %s%s", rt_dnn_legacy_name(dir, k->algo),
                 k->math == CUDNN_TENSOR_OP_MATH || k->math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ? " (tensor ops)"
                 : k->math == CUDNN_DEFAULT_MATH                                                    ? " (default math)"
                                                                                                    : "");
    else
        snprintf(buf, len, "cudnn engine %lld (knobs %s)%s", (long long)k->info.engine,
                 k->info.knobs[0] ? k->info.knobs : "none", k->fp32_dw ? " fp32 dw" : "");
}

static cudnnStatus_t cand_run(struct rt_cuda *c, const struct fast_entry *e, const struct cand *k,
                              const struct probe *p)
{
    const float one = 1.0f, zero = 0.0f;
    void *in0 = (void *)(uintptr_t)p->in0, *in1 = (void *)(uintptr_t)p->in1;
    if (k->kind == CAND_ENGINE) {
        switch (e->key.dir) {
        case DIR_FWD:
            return rt_dnn_plan_run(c->dnn, k->plan, in0, in1, p->out, p->ws);
        case DIR_BWD_DATA:
            return rt_dnn_plan_run(c->dnn, k->plan, p->out, in0, in1, p->ws);
        default:
            return rt_dnn_plan_run(c->dnn, k->plan, in0, k->fp32_dw ? p->out32 : p->out, in1, p->ws);
        }
    }
    const cudnnStatus_t st = cudnnSetConvolutionMathType(e->dd.conv, k->math);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    switch (e->key.dir) {
    case DIR_FWD:
        return cudnnConvolutionForward(c->dnn, &one, e->dd.x, in0, e->dd.w, in1, e->dd.conv,
                                       (cudnnConvolutionFwdAlgo_t)k->algo, p->ws, p->ws_bytes, &zero, e->dd.y, p->out);
    case DIR_BWD_DATA:
        return cudnnConvolutionBackwardData(c->dnn, &one, e->dd.w, in0, e->dd.y, in1, e->dd.conv,
                                            (cudnnConvolutionBwdDataAlgo_t)k->algo, p->ws, p->ws_bytes, &p->beta,
                                            e->dd.x, p->out);
    default:
        return cudnnConvolutionBackwardFilter(c->dnn, &one, e->dd.x, in0, e->dd.y, in1, e->dd.conv,
                                              (cudnnConvolutionBwdFilterAlgo_t)k->algo, p->ws, p->ws_bytes, &p->beta,
                                              e->dd.w, p->out);
    }
}

/* One thing to time: a candidate, or the 16-bit weight gradient's add pass. */
struct timed {
    struct rt_cuda *c;
    struct rt_stream *s;
    const struct fast_entry *e;
    const struct cand *k;
    const struct probe *p;
    int acc;               /* 1: time rt_cuda_h_dw_acc(out -> out32) instead of k */
};

static cudnnStatus_t timed_run(const struct timed *t)
{
    if (!t->acc)
        return cand_run(t->c, t->e, t->k, t->p);
    const struct rt_conv_desc *d = &t->e->key.d;
    rt_cuda_h_dw_acc(t->s, (enum rt_dtype)t->e->key.dt, d->cout, d->in.c, d->kh * d->kw, t->p->out, t->p->out32);
    return CUDNN_STATUS_SUCCESS;
}

static float median3(float a, float b, float c)
{
    return a > b ? (b > c ? b : a > c ? c : a) : (a > c ? a : b > c ? c : b);
}

/* A candidate failed to launch: what it left of a launch error is not sticky (a lost context would be, and
 * the next check aborts on it), so it is cleared, or the next kernel's launch check would report it. */
static float launch_failed(cudaStream_t stream)
{
    cudaGetLastError();
    RT_CUDA_CHECK(cudaStreamSynchronize(stream));
    return -1.0f;
}

/* Times t on the stream: one untimed run, then up to TIMED_RUNS timed ones (one only when it is already
 * GIVE_UP times `best`). Returns the median in ms, or -1 with *st the status when a run failed to launch;
 * a device fault aborts, naming `name` and `what`. */
static float time_it(const struct timed *t, cudaEvent_t ev[2 * TIMED_RUNS], float best, cudnnStatus_t *st,
                     const char *name, const char *what)
{
    cudaStream_t stream = rt_cuda_stream(t->s);
    *st = timed_run(t);
    if (*st != CUDNN_STATUS_SUCCESS)
        return launch_failed(stream);
    /* A kernel fault of the untimed run surfaces here; the context is lost, so it aborts, saying which. */
    const cudaError_t fault = cudaStreamSynchronize(stream);
    if (fault != cudaSuccess) {
        rt_log(RT_LOG_ERROR, "%s: %s faulted in its first run", what, name);
        rt_cuda_fail("CUDA", (int)fault, cudaGetErrorString(fault), name, __FILE__, __LINE__);
    }
    float ms[TIMED_RUNS] = {0};
    int runs = 0;
    for (; runs < TIMED_RUNS; runs++) {
        RT_CUDA_CHECK(cudaEventRecord(ev[2 * runs], stream));
        *st = timed_run(t);
        RT_CUDA_CHECK(cudaEventRecord(ev[2 * runs + 1], stream));
        if (*st != CUDNN_STATUS_SUCCESS)
            return launch_failed(stream);
        if (runs == 0) {
            RT_CUDA_CHECK(cudaEventSynchronize(ev[1]));
            RT_CUDA_CHECK(cudaEventElapsedTime(&ms[0], ev[0], ev[1]));
            if (best > 0.0f && ms[0] > GIVE_UP * best)
                return ms[0];
        }
    }
    RT_CUDA_CHECK(cudaEventSynchronize(ev[2 * TIMED_RUNS - 1]));
    for (int i = 1; i < TIMED_RUNS; i++)
        RT_CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
    return median3(ms[0], ms[1], ms[2]);
}

/* The graphs of a search: the graph of (key, spec), its engines filtered by the rule and finalized, appended to
 * cands[] (at most MAX_PLANS, or MAX_RTC runtime-compiled ones when no other finalized). */
static void engines_add(struct rt_cuda *c, struct rt_cuda_dnn *st, const char *what, const struct rt_dnn_gspec *spec,
                        int fp32_dw, const struct rt_dnn_rule *rule, struct rt_dnn_graph **graph, int gi,
                        struct cand *cands, int *nc)
{
    char why[320];
    *graph = NULL;
    struct rt_dnn_graph *g = NULL;
    if (rt_dnn_graph_create(c->dnn, spec, &g, why, sizeof(why)) < 0) {
        st->st.graph_fail++;
        rt_log(RT_LOG_DEBUG, "%s: the cuDNN graph%s was not built: %s", what, fp32_dw ? " with an fp32 dw" : "", why);
        return;
    }
    st->st.graphs++;
    const int n = rt_dnn_graph_list(g, LIST_A, LIST_FB, why, sizeof(why));
    if (n <= 0) {
        st->st.graph_fail += n < 0;
        rt_log(RT_LOG_DEBUG, "%s: the cuDNN graph%s has no engine configuration%s%s", what,
               fp32_dw ? " with an fp32 dw" : "", n < 0 ? ": " : "", n < 0 ? why : "");
        rt_dnn_graph_destroy(g);
        return;
    }
    int made = 0;
    for (int rtc = 0; rtc < 2 && made == 0; rtc++) {
        for (int i = 0; i < n && made < (rtc ? MAX_RTC : MAX_PLANS) && *nc < MAX_CANDS; i++) {
            const struct rt_dnn_cfg_info *info = rt_dnn_graph_info(g, i);
            if (info->runtime_compiled != rtc)
                continue;
            struct cand k = {.kind = CAND_ENGINE, .info = *info, .graph = gi, .fp32_dw = fp32_dw};
            k.r = (struct rt_dnn_cand){.ms = -1.0f, .deterministic = info->deterministic,
                                       .tensor_cores = info->tensor_cores, .down_convert = info->down_convert,
                                       .reduced = info->reduced};
            char name[112];
            cand_name(&k, spec->dir, name, sizeof(name));
            const enum rt_dnn_verdict v = rt_dnn_judge(rule, &k.r, 0);
            if (v != RT_DNN_OK) {
                rt_log(RT_LOG_DEBUG, "%s: %s left out: %s", what, name, rt_dnn_verdict_name(v));
                continue;
            }
            if (rt_dnn_plan_make(c->dnn, g, i, &k.plan, why, sizeof(why)) < 0) {
                st->st.plan_fail++;
                rt_log(RT_LOG_DEBUG, "%s: %s: no plan: %s", what, name, why);
                continue;
            }
            st->st.plans++;
            k.r.workspace = rt_dnn_plan_workspace(k.plan);
            if (k.r.workspace > rule->ws_limit) {
                rt_log(RT_LOG_DEBUG, "%s: %s left out: needs %zu bytes of workspace, over the %zu limit", what, name,
                       k.r.workspace, rule->ws_limit);
                rt_dnn_plan_destroy(k.plan);
                continue;
            }
            k.r.ran = 1; /* until the measurement says otherwise */
            cands[(*nc)++] = k;
            made++;
        }
    }
    *graph = g;
}

/* The graph of direction dir of key k in type ty; fp32_dw: a 16-bit backward filter's fp32 (K, C, R, S) dw. */
static struct rt_dnn_gspec gspec_of(const struct fast_key *k, const struct dnn_type *ty, int fp32_dw)
{
    const int f32 = ty->dt == RT_F32;
    struct rt_dnn_gspec g = {.d = k->d, .dir = k->dir, .xdt = ty->data, .wdt = ty->data, .ydt = ty->data,
                             .x_nhwc = !f32, .w_krsc = !f32, .y_nhwc = !f32, .alpha = 1.0f, .beta = 0.0f};
    if (k->dir == DIR_BWD_DATA)
        memcpy(&g.beta, &k->beta, sizeof(g.beta));
    else if (k->dir == DIR_BWD_FILTER && (f32 || fp32_dw))
        g.beta = 1.0f; /* parameter gradients accumulate over micro-batches */
    if (fp32_dw) {
        g.wdt = CUDNN_DATA_FLOAT;
        g.w_krsc = 0;
    }
    return g;
}

/*
 * Measures the candidates of key k (see the top of the file) on the call's buffers: in0/in1 the inputs in the
 * order of the direction (x, w / w, dy / x, dy; 16-bit weights already cast), out the real y for forward
 * (NULL for the backward directions, which use scratch). Returns the new entry (not yet in the cache).
 */
static struct fast_entry *measure(struct rt_stream *s, const struct fast_key *k, const void *in0, const void *in1,
                                  void *out)
{
    struct rt_cuda *c = rt_cuda_of(s);
    struct rt_cuda_dnn *st = state(c);
    cudaStream_t stream = rt_cuda_stream(s);
    const struct dnn_type *ty = rt_dnn_type_of((enum rt_dtype)k->dt);
    const struct rt_conv_desc *d = &k->d;
    const int dir = k->dir, f32 = ty->dt == RT_F32;
    char what[320];
    key_describe(k, what, sizeof(what));
    st->st.keys++;

    struct fast_entry *e = calloc(1, sizeof(*e));
    if (!e)
        out_of_memory("a convolution choice", __LINE__);
    e->key = *k;
    rt_dnn_descs_make(d, f32, ty, &e->dd);
    e->have_dd = 1;
    /* fp32: FMA math keeps TF32 out of Find; the default math lets it in (PyTorch's allow_tf32). */
    RT_CUDNN_CHECK(cudnnSetConvolutionMathType(e->dd.conv, f32 ? (c->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH)
                                                               : CUDNN_TENSOR_OP_MATH));

    const size_t wcount = (size_t)d->cout * d->in.c * d->kh * d->kw;
    const size_t out_bytes = dir == DIR_BWD_DATA     ? (size_t)d->in.n * d->in.c * d->in.h * d->in.w * ty->esz
                             : dir == DIR_BWD_FILTER ? wcount * ty->esz
                                                     : 0;
    const size_t out32_bytes = dir == DIR_BWD_FILTER && !f32 ? wcount * sizeof(float) : 0;
    size_t free_b = 0, total_b = 0;
    RT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    size_t limit = free_b > out_bytes + out32_bytes ? (free_b - out_bytes - out32_bytes) / 2 : 0;
    if (limit > DNN_WORKSPACE_CAP)
        limit = DNN_WORKSPACE_CAP;
    const size_t held = c->workspace_bytes < DNN_WORKSPACE_CAP ? c->workspace_bytes : DNN_WORKSPACE_CAP;
    if (limit < held)
        limit = held;
    const struct rt_dnn_rule rule = {.f32 = f32, .tf32 = c->tf32, .nondeterministic = c->nondeterministic,
                                     .ws_limit = limit};

    struct cand *cands = calloc(MAX_CANDS, sizeof(*cands));
    if (!cands)
        out_of_memory("a convolution search", __LINE__);
    int nc = 0;
    struct rt_dnn_graph *graphs[2] = {NULL, NULL};

    /* Engines first: building them is host work, and the search's workspace must fit the largest. */
    if (st->st.graph_on) {
        int gi = 0;
        if (dir == DIR_BWD_FILTER && !f32) {
            const struct rt_dnn_gspec g32 = gspec_of(k, ty, 1);
            engines_add(c, st, what, &g32, 1, &rule, &graphs[gi], gi, cands, &nc);
            gi++;
        }
        const struct rt_dnn_gspec g = gspec_of(k, ty, 0);
        engines_add(c, st, what, &g, 0, &rule, &graphs[gi], gi, cands, &nc);
    }

    /* Legacy algorithms: which take the shape, and the most workspace one within the limit needs. */
    size_t need_legacy = 0;
    int supported = 0;
    for (int a = 0; a < rt_dnn_algo_count(dir); a++) {
        size_t sz = 0;
        if (rt_dnn_ws_size(c, &e->dd, dir, a, &sz) != CUDNN_STATUS_SUCCESS)
            continue;
        supported++;
        if (sz <= limit && sz > need_legacy)
            need_legacy = sz;
    }
    size_t need = need_legacy;
    for (int i = 0; i < nc; i++)
        need = cands[i].r.workspace > need ? cands[i].r.workspace : need;

    void *tmp_ws = NULL, *tmp_out = NULL, *tmp_out32 = NULL;
    struct probe p = {.in0 = in0, .in1 = in1, .out = out, .ws_bytes = need};
    if (need > 0) {
        if (need <= c->workspace_bytes) {
            p.ws = rt_cuda_workspace(s, need);
        } else {
            RT_CUDA_CHECK(cudaMallocAsync(&tmp_ws, need, stream));
            p.ws = tmp_ws;
        }
    }
    /* Backward outputs accumulate (beta 1): the candidates write zeroed scratch, never dx or dw. */
    if (out_bytes) {
        RT_CUDA_CHECK(cudaMallocAsync(&tmp_out, out_bytes, stream));
        RT_CUDA_CHECK(cudaMemsetAsync(tmp_out, 0, out_bytes, stream));
        p.out = tmp_out;
    }
    if (out32_bytes) {
        RT_CUDA_CHECK(cudaMallocAsync(&tmp_out32, out32_bytes, stream));
        RT_CUDA_CHECK(cudaMemsetAsync(tmp_out32, 0, out32_bytes, stream));
        p.out32 = tmp_out32;
    }
    if (dir == DIR_BWD_DATA)
        memcpy(&p.beta, &k->beta, sizeof(p.beta));
    else if (dir == DIR_BWD_FILTER)
        p.beta = f32 ? 1.0f : 0.0f;

    if (supported > 0) {
        struct dnn_perf r[DNN_MAX_ALGOS];
        const int got = rt_dnn_find(c, &e->dd, dir, in0, in1, p.out, p.ws, need_legacy, r);
        for (int i = 0; i < got && nc < MAX_CANDS; i++) {
            if (r[i].status != CUDNN_STATUS_SUCCESS || r[i].memory > need_legacy)
                continue;
            struct cand kk = {.kind = CAND_LEGACY, .algo = r[i].algo, .math = r[i].math, .find_ms = r[i].time};
            kk.r = (struct rt_dnn_cand){
                .ms = -1.0f, .workspace = r[i].memory, .ran = 1,
                .deterministic = r[i].determinism == CUDNN_DETERMINISTIC,
                .tensor_cores =
                    r[i].math == CUDNN_TENSOR_OP_MATH || r[i].math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION};
            /* The execution call is checked against the workspace query in this math type: never hand it less. */
            size_t sz = 0;
            if (cudnnSetConvolutionMathType(e->dd.conv, kk.math) == CUDNN_STATUS_SUCCESS &&
                rt_dnn_ws_size(c, &e->dd, dir, kk.algo, &sz) == CUDNN_STATUS_SUCCESS && sz > kk.r.workspace)
                kk.r.workspace = sz;
            if (kk.r.workspace > need)
                kk.r.ran = 0;
            cands[nc++] = kk;
        }
    }

    /* Every allowed candidate, timed the same way on the same buffers. */
    cudaEvent_t ev[2 * TIMED_RUNS];
    for (int i = 0; i < 2 * TIMED_RUNS; i++)
        RT_CUDA_CHECK(cudaEventCreate(&ev[i]));
    float best = -1.0f;
    int timed = 0, acc_needed = 0;
    for (int i = 0; i < nc; i++) {
        struct cand *kk = &cands[i];
        if (rt_dnn_judge(&rule, &kk->r, 0) != RT_DNN_OK || !kk->r.ran)
            continue;
        const struct timed t = {.c = c, .s = s, .e = e, .k = kk, .p = &p};
        cudnnStatus_t rs = CUDNN_STATUS_SUCCESS;
        char name[112];
        cand_name(kk, dir, name, sizeof(name));
        kk->r.ms = time_it(&t, ev, best, &rs, name, what);
        timed++;
        if (kk->kind == CAND_ENGINE)
            st->st.engines_timed++;
        else
            st->st.legacy_timed++;
        if (rs != CUDNN_STATUS_SUCCESS) {
            rt_log(RT_LOG_DEBUG, "%s: %s failed in the measurement: %s", what, name, cudnnGetErrorString(rs));
            kk->r.ran = 0;
            continue;
        }
        if (best < 0.0f || kk->r.ms < best)
            best = kk->r.ms;
        acc_needed |= dir == DIR_BWD_FILTER && !f32 && !kk->fp32_dw;
    }
    if (acc_needed) {
        /* Those candidates leave a 16-bit gradient that one more pass adds into fp32: charge them for it. */
        const struct timed t = {.c = c, .s = s, .e = e, .p = &p, .acc = 1};
        cudnnStatus_t rs;
        const float acc_ms = time_it(&t, ev, -1.0f, &rs, "the 16-bit weight gradient's add pass", what);
        for (int i = 0; i < nc; i++)
            if (!cands[i].fp32_dw && cands[i].r.ms >= 0.0f)
                cands[i].r.ms += acc_ms;
    }
    for (int i = 0; i < 2 * TIMED_RUNS; i++)
        RT_CUDA_CHECK(cudaEventDestroy(ev[i]));
    /* Stream ordered after the candidates' kernels: no wait. */
    if (tmp_out32)
        RT_CUDA_CHECK(cudaFreeAsync(tmp_out32, stream));
    if (tmp_out)
        RT_CUDA_CHECK(cudaFreeAsync(tmp_out, stream));
    if (tmp_ws)
        RT_CUDA_CHECK(cudaFreeAsync(tmp_ws, stream));

    struct rt_dnn_cand judged[MAX_CANDS];
    for (int i = 0; i < nc; i++)
        judged[i] = cands[i].r;
    const int win = rt_dnn_choose(&rule, judged, nc);
    for (int i = 0; i < nc; i++) {
        char name[112], find[48] = "";
        cand_name(&cands[i], dir, name, sizeof(name));
        if (cands[i].kind == CAND_LEGACY)
            snprintf(find, sizeof(find), " (Find %.4f ms)", (double)cands[i].find_ms);
        rt_log(RT_LOG_DEBUG, "%s: %s %s: %.4f ms%s, %zu bytes of workspace, %s, %s: %s", what, i == win ? "*" : " ",
               name, (double)cands[i].r.ms, find, cands[i].r.workspace,
               cands[i].r.deterministic ? "deterministic" : "non-deterministic",
               cands[i].r.tensor_cores ? "tensor cores" : "no tensor cores",
               i == win ? "chosen" : rt_dnn_verdict_name(rt_dnn_judge(&rule, &cands[i].r, 1)));
    }

    e->candidates = timed;
    if (win >= 0) {
        struct cand *w = &cands[win];
        e->ms = w->r.ms;
        e->workspace = w->r.workspace;
        e->deterministic = w->r.deterministic;
        e->tensor_cores = w->r.tensor_cores;
        cand_name(w, dir, e->how_text, sizeof(e->how_text));
        if (w->kind == CAND_LEGACY) {
            e->how = HOW_LEGACY;
            e->algo = w->algo;
            e->math = w->math;
            RT_CUDNN_CHECK(cudnnSetConvolutionMathType(e->dd.conv, w->math));
            st->st.legacy_wins++;
        } else {
            e->how = HOW_ENGINE;
            e->plan = w->plan;
            w->plan = NULL;
            e->graph = graphs[w->graph];
            graphs[w->graph] = NULL;
            e->fp32_dw = w->fp32_dw;
            st->st.engine_wins++;
            st->st.fp32_dw_wins += w->fp32_dw;
        }
    } else {
        e->how = HOW_REF;
        rt_dnn_descs_free(&e->dd);
        e->have_dd = 0;
        snprintf(e->how_text, sizeof(e->how_text), "reference (no allowed candidate of %d)", nc);
        st->st.ref_falls++;
        rt_log(RT_LOG_INFO, "%s: none of the %d cuDNN candidates may run it under the backend's settings; it runs "
                            "as the reference tables run it",
               what, nc);
    }
    for (int i = 0; i < nc; i++)
        rt_dnn_plan_destroy(cands[i].plan);
    free(cands);
    rt_dnn_graph_destroy(graphs[0]);
    rt_dnn_graph_destroy(graphs[1]);
    return e;
}

/* The entry of (d, dir, type, beta), measured now on the given buffers if it is new. */
static struct fast_entry *get(struct rt_stream *s, const struct rt_conv_desc *d, int dir, enum rt_dtype dt,
                              float beta, const void *in0, const void *in1, void *out)
{
    struct rt_cuda *c = rt_cuda_of(s);
    struct rt_cuda_dnn *st = state(c);
    const struct fast_key k = key_make(c, d, dir, dt, 0, beta);
    struct fast_entry *e = lookup(st, &k);
    if (!e) {
        e = measure(s, &k, in0, in1, out);
        entry_add(st, e);
    }
    return e;
}

/* ---- execution ------------------------------------------------------------------------------------------- */

static int aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

/* 1 when entry e may run on these buffers: a plan was built for 16-byte aligned ones. */
static int runs_here(struct rt_cuda *c, const struct fast_entry *e, const void *a, const void *b, const void *o)
{
    if (e->how == HOW_REF)
        return 0;
    if (e->how != HOW_ENGINE || (aligned16(a) && aligned16(b) && aligned16(o)))
        return 1;
    struct rt_cuda_dnn *st = state(c);
    if (!st->warned_align) {
        st->warned_align = 1;
        char what[320];
        key_describe(&e->key, what, sizeof(what));
        rt_log(RT_LOG_INFO, "%s: a buffer is not 16-byte aligned (%p, %p, %p); such calls run as the reference "
                            "tables run them",
               what, a, b, o);
    }
    return 0;
}

static void *entry_ws(struct rt_stream *s, const struct fast_entry *e)
{
    return e->workspace ? rt_cuda_workspace(s, e->workspace) : NULL;
}

static void run_fwd(struct rt_stream *s, const struct fast_entry *e, const void *x, const void *w, void *y)
{
    struct rt_cuda *c = rt_cuda_of(s);
    void *ws = entry_ws(s, e);
    if (e->how == HOW_ENGINE) {
        RT_CUDNN_CHECK(rt_dnn_plan_run(c->dnn, e->plan, (void *)(uintptr_t)x, (void *)(uintptr_t)w, y, ws));
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    RT_CUDNN_CHECK(cudnnConvolutionForward(c->dnn, &one, e->dd.x, x, e->dd.w, w, e->dd.conv,
                                           (cudnnConvolutionFwdAlgo_t)e->algo, ws, e->workspace, &zero, e->dd.y, y));
}

/* Backward filter into `out`: fp32 data's dw (beta 1), or a 16-bit call's fp32 dw (e->fp32_dw, beta 1) or
 * 16-bit (K, R, S, C) scratch (beta 0). */
static void run_bwd_filter(struct rt_stream *s, const struct fast_entry *e, const void *x, const void *dy, void *out)
{
    struct rt_cuda *c = rt_cuda_of(s);
    void *ws = entry_ws(s, e);
    if (e->how == HOW_ENGINE) {
        RT_CUDNN_CHECK(rt_dnn_plan_run(c->dnn, e->plan, (void *)(uintptr_t)x, out, (void *)(uintptr_t)dy, ws));
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    RT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(c->dnn, &one, e->dd.x, x, e->dd.y, dy, e->dd.conv,
                                                  (cudnnConvolutionBwdFilterAlgo_t)e->algo, ws, e->workspace,
                                                  e->key.dt == RT_F32 ? &one : &zero, e->dd.w, out));
}

/* ---- stems ----------------------------------------------------------------------------------------------- */

static int stem_candidate(const struct rt_conv_desc *d, enum rt_dtype dt)
{
    return dt != RT_F32 && d->in.c > 0 && d->in.c % 8 != 0;
}

/* x (N, H, W, Cin) into the padded scratch (N, H, W, cp). */
static void *stem_input(struct rt_stream *s, const struct rt_conv_desc *d, enum rt_dtype dt, int cp, const void *x)
{
    const int64_t pixels = (int64_t)d->in.n * d->in.h * d->in.w;
    void *xp = rt_cuda_scratch(s, RT_CUDA_SCRATCH_XPAD, (size_t)pixels * (size_t)cp * 2);
    rt_dnn_pad_x(s, dt, pixels, d->in.c, cp, x, xp);
    return xp;
}

/* The stem decision of (d, dir): measured now (the padded shape's candidates, on the padded input and, for
 * forward, the padded weights and the real y) if it is new. dir is forward or backward filter; w is the fp32
 * weights (forward) and dy the output gradient (backward filter). */
static struct fast_entry *stem_decide(struct rt_stream *s, const struct rt_conv_desc *d, int dir, enum rt_dtype dt,
                                      const void *x, const float *w, const void *dy, void *y)
{
    struct rt_cuda *c = rt_cuda_of(s);
    struct rt_cuda_dnn *st = state(c);
    const struct fast_key k = key_make(c, d, dir, dt, 1, 0.0f);
    struct fast_entry *se = lookup(st, &k);
    if (se)
        return se;
    se = calloc(1, sizeof(*se));
    if (!se)
        out_of_memory("a stem decision", __LINE__);
    se->key = k;
    se->cp = rt_dnn_stem_channels(d->in.c);
    struct rt_conv_desc pd = *d;
    pd.in.c = se->cp;
    void *xp = stem_input(s, d, dt, se->cp, x);
    const int had = st->n;
    struct fast_entry *in;
    if (dir == DIR_FWD) {
        const void *wp = weights16(s, dt, RT_DNN_W_KRSC, d->cout, d->in.c, se->cp, d->kh * d->kw, w);
        in = get(s, &pd, DIR_FWD, dt, 0.0f, xp, wp, y);
    } else {
        in = get(s, &pd, DIR_BWD_FILTER, dt, 0.0f, xp, dy, NULL);
    }
    if (st->n > had)
        in->for_stem = 1;
    se->inner = in;
    se->how = in->how == HOW_LEGACY || in->how == HOW_ENGINE ? HOW_STEM : HOW_UNPADDED;
    se->ms = in->ms;
    se->workspace = in->workspace;
    se->deterministic = in->deterministic;
    se->tensor_cores = in->tensor_cores;
    se->candidates = in->candidates;
    snprintf(se->how_text, sizeof(se->how_text), "stem %d->%d channels: %.80s", d->in.c, se->cp, in->how_text);
    if (se->how == HOW_STEM)
        st->st.stems_padded++;
    else
        st->st.stems_unpadded++;
    entry_add(st, se);
    return se;
}

/* ---- the table's convolution entries ---------------------------------------------------------------------- */

static void fast_fwd(struct rt_stream *s, const struct rt_conv_desc *d, enum rt_dtype dt, const float *x,
                     const float *w, const float *bias, float *y)
{
    /* cuDNN rejects empty tensors; an empty batch has nothing to compute. */
    if (d->in.n <= 0)
        return;
    struct rt_cuda *c = rt_cuda_of(s);
    const int f32 = dt == RT_F32;
    const size_t rows = (size_t)d->in.n * d->oh * d->ow;
    if (stem_candidate(d, dt)) {
        struct fast_entry *se = stem_decide(s, d, DIR_FWD, dt, x, w, NULL, y);
        if (se->how == HOW_STEM && runs_here(c, se->inner, y, y, y)) {
            const void *wp = weights16(s, dt, RT_DNN_W_KRSC, d->cout, d->in.c, se->cp, d->kh * d->kw, w);
            const void *xp = stem_input(s, d, dt, se->cp, x);
            run_fwd(s, se->inner, xp, wp, y);
            if (bias)
                rt_cuda_h_bias_add(s, dt, rows, (size_t)d->cout, bias, y);
            return;
        }
    }
    const void *wt = f32 ? (const void *)w
                         : weights16(s, dt, RT_DNN_W_KRSC, d->cout, d->in.c, d->in.c, d->kh * d->kw, w);
    struct fast_entry *e = get(s, d, DIR_FWD, dt, 0.0f, x, wt, y);
    e->direct = 1;
    if (!runs_here(c, e, x, wt, y)) {
        rt_dnn_ref_fwd(s, d, dt, x, w, bias, y);
        return;
    }
    run_fwd(s, e, x, wt, y);
    const float one = 1.0f;
    if (bias && f32)
        RT_CUDNN_CHECK(cudnnAddTensor(c->dnn, &one, e->dd.b, bias, &one, e->dd.y, y));
    else if (bias)
        rt_cuda_h_bias_add(s, dt, rows, (size_t)d->cout, bias, y);
}

static void fast_bwd_data(struct rt_stream *s, const struct rt_conv_desc *d, enum rt_dtype dt, const float *dy,
                          const float *w, float beta, float *dx)
{
    if (d->in.n <= 0)
        return;
    struct rt_cuda *c = rt_cuda_of(s);
    const void *wt = dt == RT_F32 ? (const void *)w
                                  : weights16(s, dt, RT_DNN_W_KRSC, d->cout, d->in.c, d->in.c, d->kh * d->kw, w);
    struct fast_entry *e = get(s, d, DIR_BWD_DATA, dt, beta, wt, dy, NULL);
    e->direct = 1;
    if (!runs_here(c, e, dx, wt, dy)) {
        rt_dnn_ref_bwd_data(s, d, dt, dy, w, beta, dx);
        return;
    }
    void *ws = entry_ws(s, e);
    if (e->how == HOW_ENGINE) {
        RT_CUDNN_CHECK(rt_dnn_plan_run(c->dnn, e->plan, dx, (void *)(uintptr_t)wt, (void *)(uintptr_t)dy, ws));
        return;
    }
    const float one = 1.0f;
    /* dx = beta dx + result; cuDNN does not read dx when beta is 0. */
    RT_CUDNN_CHECK(cudnnConvolutionBackwardData(c->dnn, &one, e->dd.w, wt, e->dd.y, dy, e->dd.conv,
                                                (cudnnConvolutionBwdDataAlgo_t)e->algo, ws, e->workspace, &beta,
                                                e->dd.x, dx));
}

static void fast_bwd_filter(struct rt_stream *s, const struct rt_conv_desc *d, enum rt_dtype dt, const float *x,
                            const float *dy, float *dw, float *dbias)
{
    if (d->in.n <= 0)
        return;
    struct rt_cuda *c = rt_cuda_of(s);
    const int f32 = dt == RT_F32, rs = d->kh * d->kw;
    const size_t rows = (size_t)d->in.n * d->oh * d->ow;
    if (stem_candidate(d, dt)) {
        struct fast_entry *se = stem_decide(s, d, DIR_BWD_FILTER, dt, x, NULL, dy, NULL);
        if (se->how == HOW_STEM && runs_here(c, se->inner, dy, dy, dy)) {
            const struct fast_entry *in = se->inner;
            const void *xp = stem_input(s, d, dt, se->cp, x);
            if (in->fp32_dw) {
                /* The plan accumulates (beta 1): into zeros, then the real channels into dw. */
                const size_t n32 = (size_t)d->cout * (size_t)se->cp * (size_t)rs;
                float *g = rt_cuda_scratch(s, RT_CUDA_SCRATCH_DW32, n32 * sizeof(float));
                RT_CUDA_CHECK(cudaMemsetAsync(g, 0, n32 * sizeof(float), rt_cuda_stream(s)));
                run_bwd_filter(s, in, xp, dy, g);
                rt_dnn_dw_acc_pad32(s, d->cout, d->in.c, se->cp, rs, g, dw);
            } else {
                void *g = rt_cuda_scratch(s, RT_CUDA_SCRATCH_DW, (size_t)d->cout * (size_t)se->cp * (size_t)rs * 2);
                run_bwd_filter(s, in, xp, dy, g);
                rt_dnn_dw_acc_pad16(s, dt, d->cout, d->in.c, se->cp, rs, g, dw);
            }
            if (dbias)
                rt_cuda_h_bias_grad(s, dt, rows, (size_t)d->cout, dy, dbias);
            return;
        }
    }
    struct fast_entry *e = get(s, d, DIR_BWD_FILTER, dt, 0.0f, x, dy, NULL);
    e->direct = 1;
    const size_t count = (size_t)d->cout * d->in.c * rs;
    /* 16-bit without an fp32-dw engine: this call's gradient into scratch, then added into the fp32 dw. */
    void *g = f32 || e->fp32_dw ? (void *)dw : rt_cuda_scratch(s, RT_CUDA_SCRATCH_DW, count * 2);
    if (!runs_here(c, e, x, dy, g)) {
        rt_dnn_ref_bwd_filter(s, d, dt, x, dy, dw, dbias);
        return;
    }
    run_bwd_filter(s, e, x, dy, g);
    if (g != (void *)dw)
        rt_cuda_h_dw_acc(s, dt, d->cout, d->in.c, rs, g, dw);
    const float one = 1.0f;
    if (dbias && f32)
        RT_CUDNN_CHECK(cudnnConvolutionBackwardBias(c->dnn, &one, e->dd.y, dy, &one, e->dd.b, dbias));
    else if (dbias)
        rt_cuda_h_bias_grad(s, dt, rows, (size_t)d->cout, dy, dbias);
}

/* ---- 16-bit linear layers: dnn.c's products, the weights from the cache ------------------------------------ */

static void lin16_fwd(struct rt_stream *s, enum rt_dtype dt, int n, int in, int out, const float *x, const float *w,
                      const float *b, float *y)
{
    if (n > 0)
        rt_dnn_linear16_fwd(s, dt, n, in, out, x, weights16(s, dt, RT_DNN_W_PLAIN, out, in, in, 1, w), b, y);
}

static void lin16_bwd_data(struct rt_stream *s, enum rt_dtype dt, int n, int in, int out, const float *dy,
                           const float *w, float beta, float *dx)
{
    if (n > 0)
        rt_dnn_linear16_bwd_data(s, dt, n, in, out, dy, weights16(s, dt, RT_DNN_W_PLAIN, out, in, in, 1, w), beta,
                                 dx);
}

/* ---- the tables ------------------------------------------------------------------------------------------ */

#define FAST_CONV_ENTRIES(sfx, DT)                                                                               \
    static void conv_fwd_##sfx(struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *w, \
                               const float *bias, float *y)                                                      \
    {                                                                                                            \
        fast_fwd(s, d, DT, x, w, bias, y);                                                                       \
    }                                                                                                            \
    static void conv_bwd_data_##sfx(struct rt_stream *s, const struct rt_conv_desc *d, const float *dy,          \
                                    const float *w, float beta, float *dx)                                       \
    {                                                                                                            \
        fast_bwd_data(s, d, DT, dy, w, beta, dx);                                                                \
    }                                                                                                            \
    static void conv_bwd_filter_##sfx(struct rt_stream *s, const struct rt_conv_desc *d, const float *x,         \
                                      const float *dy, float *dw, float *dbias)                                  \
    {                                                                                                            \
        fast_bwd_filter(s, d, DT, x, dy, dw, dbias);                                                             \
    }

FAST_CONV_ENTRIES(f32, RT_F32)
FAST_CONV_ENTRIES(bf16, RT_BF16)
FAST_CONV_ENTRIES(f16, RT_F16)

#define FAST_LINEAR_ENTRIES(sfx, DT)                                                                             \
    static void linear_fwd_##sfx(struct rt_stream *s, int n, int in, int out, const float *x, const float *w,    \
                                 const float *b, float *y)                                                       \
    {                                                                                                            \
        lin16_fwd(s, DT, n, in, out, x, w, b, y);                                                                \
    }                                                                                                            \
    static void linear_bwd_data_##sfx(struct rt_stream *s, int n, int in, int out, const float *dy,              \
                                      const float *w, float beta, float *dx)                                     \
    {                                                                                                            \
        lin16_bwd_data(s, DT, n, in, out, dy, w, beta, dx);                                                      \
    }

FAST_LINEAR_ENTRIES(bf16, RT_BF16)
FAST_LINEAR_ENTRIES(f16, RT_F16)

void rt_cuda_fast_dnn_fill(struct rt_ops *t, enum rt_dtype dt)
{
    /* fp32 linear layers stay dnn.c's cuBLAS calls in the handle's default (strict fp32) math, as PyTorch's
     * matmuls with allow_tf32 False; the 16-bit linear backward filter needs no weights and stays dnn.c's. */
    switch (dt) {
    case RT_F32:
        t->conv2d_fwd = conv_fwd_f32;
        t->conv2d_bwd_data = conv_bwd_data_f32;
        t->conv2d_bwd_filter = conv_bwd_filter_f32;
        break;
    case RT_BF16:
        t->conv2d_fwd = conv_fwd_bf16;
        t->conv2d_bwd_data = conv_bwd_data_bf16;
        t->conv2d_bwd_filter = conv_bwd_filter_bf16;
        t->linear_fwd = linear_fwd_bf16;
        t->linear_bwd_data = linear_bwd_data_bf16;
        break;
    case RT_F16:
        t->conv2d_fwd = conv_fwd_f16;
        t->conv2d_bwd_data = conv_bwd_data_f16;
        t->conv2d_bwd_filter = conv_bwd_filter_f16;
        t->linear_fwd = linear_fwd_f16;
        t->linear_bwd_data = linear_bwd_data_f16;
        break;
    }
}

/* ---- what the caller is told, and teardown ------------------------------------------------------------------ */

static int listed_choice(const struct fast_entry *e)
{
    /* A stem that fell back to its unpadded key shows as that key; a padded shape only through its stem. */
    return e->how != HOW_UNPADDED && (!e->for_stem || e->direct);
}

int rt_cuda_conv_choices(const struct rt_cuda *c, struct rt_conv_choice *out, int cap)
{
    int n = 0;
    const struct rt_cuda_dnn *st = c->dnn_state;
    for (int i = 0; st && i < st->n; i++) {
        const struct fast_entry *e = st->e[i];
        if (!listed_choice(e))
            continue;
        if (n < cap) {
            struct rt_conv_choice *o = &out[n];
            memset(o, 0, sizeof(*o));
            o->d = e->key.d;
            o->dir = (enum rt_conv_dir)e->key.dir;
            o->dt = (enum rt_dtype)e->key.dt;
            snprintf(o->how, sizeof(o->how), "%s", e->how_text);
            o->ms = e->ms;
            o->workspace = e->workspace;
            o->deterministic = e->deterministic;
            o->tensor_cores = e->tensor_cores;
            o->candidates = e->candidates;
        }
        n++;
    }
    for (int i = 0; i < c->nalgos; i++, n++) {
        if (n >= cap)
            continue;
        const struct rt_cuda_algo *a = &c->algos[i];
        struct rt_conv_choice *o = &out[n];
        memset(o, 0, sizeof(*o));
        o->d = a->d;
        o->dir = (enum rt_conv_dir)a->dir;
        o->dt = (enum rt_dtype)a->dt;
        o->workspace = a->workspace;
        o->ms = a->ms;
        o->candidates = a->candidates;
        if (a->in_f32) {
            /* Its fp32 call has a row of its own (the fp32 reference key). */
            o->deterministic = 1;
            snprintf(o->how, sizeof(o->how), "reference: fp32 NCHW (no 16-bit algorithm)");
        } else {
            o->deterministic = a->deterministic;
            o->tensor_cores = a->tensor_cores || a->dt != RT_F32;
            snprintf(o->how, sizeof(o->how), "reference: cudnn legacy %s", rt_dnn_legacy_name(a->dir, a->algo));
        }
    }
    return n;
}

void rt_dnn_fast_stats(const struct rt_cuda *c, struct rt_dnn_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (c->dnn_state)
        *out = c->dnn_state->st;
    else
        out->graph_on = graph_on_env(0);
}

void rt_dnn_fast_release(struct rt_cuda *c)
{
    struct rt_cuda_dnn *st = c->dnn_state;
    if (!st)
        return;
    for (int i = 0; i < st->n; i++)
        entry_free(st->e[i]);
    free(st->e);
    /* Stream ordered: the destroying backend synchronises its stream after this. */
    for (int i = 0; i < st->wc.n; i++)
        if (st->wc.e[i].copy)
            cudaFreeAsync(st->wc.e[i].copy, c->compute);
    rt_dnn_wcache_fini(&st->wc);
    free(st);
    c->dnn_state = NULL;
}
