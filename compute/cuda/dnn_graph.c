/*
 * dnn_graph.c - one convolution through cuDNN's backend ("graph") API, for the fast tables' search
 * (dnn_fast.c), the way PyTorch's aten/src/ATen/native/cudnn/Conv_v8.cpp does it through cudnn-frontend:
 *
 *   tensors by unique id ('x', 'w', 'y'), their layout given by strides (NCHW or NHWC activations, (K, C, R, S)
 *   or (K, R, S, C) filters), element types per tensor (so a 16-bit backward filter may write an fp32 dw);
 *   a convolution descriptor (cross-correlation, fp32 compute, symmetric padding, dilation 1);
 *   one operation (forward, backward data or backward filter) with alpha and beta, in an operation graph;
 *   engine configurations from the heuristics (CUDNN_HEUR_MODE_A, then CUDNN_HEUR_MODE_FALLBACK), each with
 *   its numerical and behaviour notes, engine id and knob choices read back;
 *   an execution plan per configuration the caller wants, its workspace size read back;
 *   variant packs (device pointers by uid, workspace) made once per set of pointers, and execution.
 *
 * Every cuDNN status is returned, never aborted on: a graph or plan that does not build is a candidate the
 * search skips, with `why` naming the descriptor, the attribute and cuDNN's status (dnn_fast.c logs it at
 * debug level). Execution's status is the caller's to check. All of it is host work except
 * cudnnBackendExecute, which enqueues on the handle's stream.
 *
 * It does not choose among engines (dnn_rules.c, dnn_fast.c), time them, or fuse anything.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compute/cuda/dnn_priv.h"

/* The most configurations one graph holds (heuristics mode A lists a few dozen at most for a convolution). */
#define GRAPH_MAX_CFGS 64
/* Variant packs kept per plan: a shape shared by several layers alternates between their pointers. */
#define PLAN_VPACKS 8

struct rt_dnn_graph {
    cudnnBackendDescriptor_t t[3]; /* x (or dx), w (or dw), y (or dy) */
    cudnnBackendDescriptor_t conv, op, graph;
    int n;
    cudnnBackendDescriptor_t cfg[GRAPH_MAX_CFGS]; /* NULL once a plan took it over */
    struct rt_dnn_cfg_info info[GRAPH_MAX_CFGS];
};

struct vpack {
    void *ptr[3], *ws;
    cudnnBackendDescriptor_t d;
};

struct rt_dnn_plan {
    cudnnBackendDescriptor_t plan, cfg;
    size_t workspace;
    struct vpack vp[PLAN_VPACKS];
    int next;
};

static const int64_t UIDS[3] = {'x', 'w', 'y'};

/* Fills why with "<where> <what>: <cuDNN's message> (<status>)" and returns -EIO. */
static int fail(char *why, size_t len, const char *where, const char *what, cudnnStatus_t st)
{
    snprintf(why, len, "%s %s: %s (%d)", where, what, cudnnGetErrorString(st), (int)st);
    return -EIO;
}

/* A cuDNN call inside a function with `int rc`, `where`, `why`, `len` and an `out` label. */
#define TRY(call, what)                                                                                          \
    do {                                                                                                         \
        const cudnnStatus_t st_ = (call);                                                                        \
        if (st_ != CUDNN_STATUS_SUCCESS) {                                                                       \
            rc = fail(why, len, where, what, st_);                                                               \
            goto out;                                                                                            \
        }                                                                                                        \
    } while (0)
#define SET(d, attr, type, n, p) TRY(cudnnBackendSetAttribute((d), (attr), (type), (n), (p)), #attr)

static void destroy(cudnnBackendDescriptor_t d)
{
    /* Teardown: a failure to free host memory leaves nothing to act on. */
    if (d)
        (void)cudnnBackendDestroyDescriptor(d);
}

/* ---- the graph ------------------------------------------------------------------------------------------ */

/* (n, c, h, w) logical dimensions and the strides of NHWC or NCHW memory. */
static void layout(int64_t n, int64_t c, int64_t h, int64_t w, int channels_last, int64_t dim[4], int64_t str[4])
{
    dim[0] = n;
    dim[1] = c;
    dim[2] = h;
    dim[3] = w;
    if (channels_last) {
        str[0] = h * w * c;
        str[1] = 1;
        str[2] = w * c;
        str[3] = c;
    } else {
        str[0] = c * h * w;
        str[1] = h * w;
        str[2] = w;
        str[3] = 1;
    }
}

static int tensor_make(int64_t uid, cudnnDataType_t dt, const int64_t dim[4], const int64_t str[4],
                       cudnnBackendDescriptor_t *out, const char *where, char *why, size_t len)
{
    int rc = 0;
    /* Every buffer the fast path hands over is 16-byte aligned (dnn_fast.c checks it per call). */
    const int64_t align = 16;
    cudnnBackendDescriptor_t d = NULL;
    TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &d), "create");
    SET(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    SET(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
    SET(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str);
    SET(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    SET(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    TRY(cudnnBackendFinalize(d), "finalize");
out:
    if (rc) {
        destroy(d);
        d = NULL;
    }
    *out = d;
    return rc;
}

static int conv_make(const struct rt_conv_desc *cd, cudnnBackendDescriptor_t *out, char *why, size_t len)
{
    int rc = 0;
    const char *where = "convolution";
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT; /* fp32 accumulation for every type */
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION; /* PyTorch's conv2d: the kernel is not flipped */
    const int64_t dims = 2, dil[2] = {1, 1}, stride[2] = {cd->stride, cd->stride}, pad[2] = {cd->pad, cd->pad};
    cudnnBackendDescriptor_t d = NULL;
    TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &d), "create");
    SET(d, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    SET(d, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    SET(d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims);
    SET(d, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil);
    SET(d, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride);
    SET(d, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    SET(d, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    TRY(cudnnBackendFinalize(d), "finalize");
out:
    if (rc) {
        destroy(d);
        d = NULL;
    }
    *out = d;
    return rc;
}

/* The operation of direction dir over the graph's tensors and convolution. */
static int op_make(struct rt_dnn_graph *g, int dir, float alpha, float beta, char *why, size_t len)
{
    static const cudnnBackendDescriptorType_t type[3] = {
        CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
    };
    static const char *const name[3] = {"forward operation", "backward data operation", "backward filter operation"};
    int rc = 0;
    const char *where = name[dir];
    cudnnBackendDescriptor_t d = NULL;
    TRY(cudnnBackendCreateDescriptor(type[dir], &d), "create");
    switch (dir) {
    case DIR_FWD:
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->t[0]);
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->t[1]);
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->t[2]);
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->conv);
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
        break;
    case DIR_BWD_DATA:
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->t[0]);
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->t[1]);
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->t[2]);
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->conv);
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
        break;
    default:
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->t[0]);
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->t[1]);
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->t[2]);
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->conv);
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
        SET(d, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
        break;
    }
    TRY(cudnnBackendFinalize(d), "finalize");
out:
    if (rc) {
        destroy(d);
        d = NULL;
    }
    g->op = d;
    return rc;
}

int rt_dnn_graph_create(cudnnHandle_t h, const struct rt_dnn_gspec *s, struct rt_dnn_graph **out, char *why,
                        size_t len)
{
    *out = NULL;
    if (s->dir < DIR_FWD || s->dir > DIR_BWD_FILTER) {
        snprintf(why, len, "no direction %d", s->dir);
        return -EINVAL;
    }
    struct rt_dnn_graph *g = calloc(1, sizeof(*g));
    if (!g) {
        snprintf(why, len, "out of host memory for a graph");
        return -ENOMEM;
    }
    const struct rt_conv_desc *d = &s->d;
    int64_t dim[4], str[4];
    int rc;
    layout(d->in.n, d->in.c, d->in.h, d->in.w, s->x_nhwc, dim, str);
    if ((rc = tensor_make(UIDS[0], s->xdt, dim, str, &g->t[0], "tensor x", why, len)))
        goto fail;
    layout(d->cout, d->in.c, d->kh, d->kw, s->w_krsc, dim, str);
    if ((rc = tensor_make(UIDS[1], s->wdt, dim, str, &g->t[1], "tensor w", why, len)))
        goto fail;
    layout(d->in.n, d->cout, d->oh, d->ow, s->y_nhwc, dim, str);
    if ((rc = tensor_make(UIDS[2], s->ydt, dim, str, &g->t[2], "tensor y", why, len)))
        goto fail;
    if ((rc = conv_make(d, &g->conv, why, len)))
        goto fail;
    if ((rc = op_make(g, s->dir, s->alpha, s->beta, why, len)))
        goto fail;
    {
        const char *where = "operation graph";
        TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &g->graph), "create");
        SET(g->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->op);
        /* Deprecated in cuDNN 9 (the handle comes with each execution) but still what older 9.x releases
         * need to pick the device's engines; a release that refuses it has no need of it. */
        if (h)
            (void)cudnnBackendSetAttribute(g->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        TRY(cudnnBackendFinalize(g->graph), "finalize");
    }
out:
    if (rc)
        goto fail;
    *out = g;
    return 0;
fail:
    rt_dnn_graph_destroy(g);
    return rc;
}

void rt_dnn_graph_destroy(struct rt_dnn_graph *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n; i++)
        destroy(g->cfg[i]);
    destroy(g->graph);
    destroy(g->op);
    destroy(g->conv);
    for (int i = 0; i < 3; i++)
        destroy(g->t[i]);
    free(g);
}

/* ---- engine configurations ----------------------------------------------------------------------------- */

/* Reads the engine id, notes and knob choices of configuration cfg. Returns 0, or -EIO when the engine or its
 * numerical notes cannot be read (then it cannot be judged, and is not a candidate). */
static int cfg_read(cudnnBackendDescriptor_t cfg, struct rt_dnn_cfg_info *o, char *why, size_t len)
{
    int rc = 0;
    const char *where = "engine config";
    memset(o, 0, sizeof(*o));
    cudnnBackendDescriptor_t e = NULL, kn[CUDNN_KNOB_TYPE_COUNTS] = {0};
    int64_t n = 0;
    TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &e), "create engine");
    TRY(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e),
        "CUDNN_ATTR_ENGINECFG_ENGINE");
    TRY(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &o->engine),
        "CUDNN_ATTR_ENGINE_GLOBAL_INDEX");
    {
        cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
        n = 0;
        TRY(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                     CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes),
            "CUDNN_ATTR_ENGINE_NUMERICAL_NOTE");
        o->deterministic = 1;
        for (int64_t i = 0; i < n && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++) {
            switch (notes[i]) {
            case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
                o->tensor_cores = 1;
                break;
            case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
                o->down_convert = 1;
                break;
            case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:
                o->reduced = 1;
                break;
            case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
                o->deterministic = 0;
                break;
            case CUDNN_NUMERICAL_NOTE_FFT:
                o->fft = 1;
                break;
            case CUDNN_NUMERICAL_NOTE_WINOGRAD:
            case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4:
            case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6:
            case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13:
                o->winograd = 1;
                break;
            default:
                break;
            }
        }
    }
    {
        /* Behaviour notes only tell whether finalizing compiles kernels: unreadable means "assume not". */
        cudnnBackendBehaviorNote_t notes[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
        n = 0;
        if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                     CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, notes) == CUDNN_STATUS_SUCCESS)
            for (int64_t i = 0; i < n && i < CUDNN_BEHAVIOR_NOTE_TYPE_COUNT; i++)
                o->runtime_compiled |= notes[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
    }
    {
        /* The knobs name the configuration in logs and tell duplicates apart; unreadable ones are left out. */
        int nk = 0;
        for (; nk < CUDNN_KNOB_TYPE_COUNTS; nk++)
            if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &kn[nk]) != CUDNN_STATUS_SUCCESS) {
                kn[nk] = NULL;
                break;
            }
        n = 0;
        if (nk > 0 && cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                               nk, &n, kn) == CUDNN_STATUS_SUCCESS) {
            size_t at = 0;
            for (int64_t i = 0; i < n && i < nk; i++) {
                cudnnBackendKnobType_t type = CUDNN_KNOB_TYPE_COUNTS;
                int64_t value = 0, m = 0;
                if (cudnnBackendGetAttribute(kn[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &m,
                                             &type) != CUDNN_STATUS_SUCCESS ||
                    cudnnBackendGetAttribute(kn[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &m,
                                             &value) != CUDNN_STATUS_SUCCESS)
                    continue;
                const int w = snprintf(o->knobs + at, sizeof(o->knobs) - at, "%s%d=%lld", at ? " " : "", (int)type,
                                       (long long)value);
                if (w < 0 || (size_t)w >= sizeof(o->knobs) - at) {
                    o->knobs[at] = 0;
                    break;
                }
                at += (size_t)w;
            }
        }
        for (int i = 0; i < nk; i++)
            destroy(kn[i]);
    }
out:
    destroy(e);
    return rc;
}

/* 1 when g already lists engine `engine` with these knobs. */
static int listed(const struct rt_dnn_graph *g, const struct rt_dnn_cfg_info *o)
{
    for (int i = 0; i < g->n; i++)
        if (g->info[i].engine == o->engine && !strcmp(g->info[i].knobs, o->knobs))
            return 1;
    return 0;
}

/* Appends up to max of the configurations heuristics mode `mode` gives. */
static int heur_list(struct rt_dnn_graph *g, cudnnBackendHeurMode_t mode, int max, int fallback, char *why,
                     size_t len)
{
    int rc = 0;
    const char *where = fallback ? "heuristics (fallback)" : "heuristics";
    cudnnBackendDescriptor_t heur = NULL, cfg[GRAPH_MAX_CFGS] = {0};
    int made = 0;
    int64_t count = 0, got = 0;
    TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur), "create");
    SET(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->graph);
    SET(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    TRY(cudnnBackendFinalize(heur), "finalize");
    TRY(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL),
        "CUDNN_ATTR_ENGINEHEUR_RESULTS (count)");
    int want = count < max ? (int)count : max;
    if (want > GRAPH_MAX_CFGS - g->n)
        want = GRAPH_MAX_CFGS - g->n;
    if (want <= 0)
        goto out;
    for (; made < want; made++)
        TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[made]), "create engine config");
    TRY(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, want, &got, cfg),
        "CUDNN_ATTR_ENGINEHEUR_RESULTS");
    for (int i = 0; i < want && i < got; i++) {
        struct rt_dnn_cfg_info info;
        char skip[160];
        if (cfg_read(cfg[i], &info, skip, sizeof(skip)) < 0) {
            rt_log(RT_LOG_DEBUG, "cuDNN graph: a configuration from the %s is left out: %s", where, skip);
            continue;
        }
        if (listed(g, &info))
            continue;
        info.fallback = fallback;
        g->cfg[g->n] = cfg[i];
        g->info[g->n] = info;
        g->n++;
        cfg[i] = NULL; /* the graph holds it now */
    }
out:
    for (int i = 0; i < made; i++)
        destroy(cfg[i]);
    destroy(heur);
    return rc;
}

int rt_dnn_graph_list(struct rt_dnn_graph *g, int max_a, int max_fb, char *why, size_t len)
{
    char why_a[200] = "";
    int rc_a = heur_list(g, CUDNN_HEUR_MODE_A, max_a, 0, why_a, sizeof(why_a));
    if (rc_a < 0) /* mode A is the instant heuristic under another name in some releases: ask for that one */
        rc_a = heur_list(g, CUDNN_HEUR_MODE_INSTANT, max_a, 0, why_a, sizeof(why_a));
    const int rc_fb = heur_list(g, CUDNN_HEUR_MODE_FALLBACK, max_fb, 1, why, len);
    if (rc_a < 0 && rc_fb < 0) {
        char both[400];
        snprintf(both, sizeof(both), "%s; %s", why_a, why);
        snprintf(why, len, "%s", both);
        return -EIO;
    }
    if (rc_a < 0)
        snprintf(why, len, "%s", why_a);
    return g->n;
}

int rt_dnn_graph_count(const struct rt_dnn_graph *g)
{
    return g ? g->n : 0;
}

const struct rt_dnn_cfg_info *rt_dnn_graph_info(const struct rt_dnn_graph *g, int i)
{
    return g && i >= 0 && i < g->n ? &g->info[i] : NULL;
}

/* ---- plans and execution ------------------------------------------------------------------------------- */

int rt_dnn_plan_make(cudnnHandle_t h, struct rt_dnn_graph *g, int i, struct rt_dnn_plan **out, char *why,
                     size_t len)
{
    *out = NULL;
    if (!g || i < 0 || i >= g->n || !g->cfg[i]) {
        snprintf(why, len, "no configuration %d to make a plan of", i);
        return -EINVAL;
    }
    int rc = 0;
    const char *where = "execution plan";
    int64_t ws = -1, n = 0;
    struct rt_dnn_plan *p = calloc(1, sizeof(*p));
    if (!p) {
        snprintf(why, len, "out of host memory for a plan");
        return -ENOMEM;
    }
    TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p->plan), "create");
    /* As for the graph: deprecated in cuDNN 9, needed by older 9.x releases, harmless where ignored. */
    if (h)
        (void)cudnnBackendSetAttribute(p->plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    SET(p->plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g->cfg[i]);
    TRY(cudnnBackendFinalize(p->plan), "finalize");
    TRY(cudnnBackendGetAttribute(p->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws),
        "CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE");
    if (ws < 0) {
        snprintf(why, len, "execution plan: workspace size %lld", (long long)ws);
        rc = -EIO;
        goto out;
    }
    p->workspace = (size_t)ws;
    /* The plan refers to its configuration: it keeps it alive, and the graph forgets it. */
    p->cfg = g->cfg[i];
    g->cfg[i] = NULL;
out:
    if (rc) {
        rt_dnn_plan_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

void rt_dnn_plan_destroy(struct rt_dnn_plan *p)
{
    if (!p)
        return;
    for (int i = 0; i < PLAN_VPACKS; i++)
        destroy(p->vp[i].d);
    destroy(p->plan);
    destroy(p->cfg);
    free(p);
}

size_t rt_dnn_plan_workspace(const struct rt_dnn_plan *p)
{
    return p ? p->workspace : 0;
}

/* A finalized variant pack of uids 'x', 'w', 'y' at ptr[] and workspace ws, or a status. */
static cudnnStatus_t vpack_make(void *const ptr[3], void *ws, cudnnBackendDescriptor_t *out)
{
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &d);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, UIDS);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptr);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendFinalize(d);
    if (st != CUDNN_STATUS_SUCCESS) {
        destroy(d);
        d = NULL;
    }
    *out = d;
    return st;
}

cudnnStatus_t rt_dnn_plan_run(cudnnHandle_t h, struct rt_dnn_plan *p, void *x, void *w, void *y, void *ws)
{
    void *const ptr[3] = {x, w, y};
    struct vpack *v = NULL;
    for (int i = 0; i < PLAN_VPACKS && !v; i++) {
        struct vpack *c = &p->vp[i];
        if (c->d && c->ptr[0] == x && c->ptr[1] == w && c->ptr[2] == y && c->ws == ws)
            v = c;
    }
    if (!v) {
        /* A variant pack is host memory: the execution enqueued with the one replaced here does not need it. */
        v = &p->vp[p->next];
        p->next = (p->next + 1) % PLAN_VPACKS;
        destroy(v->d);
        memset(v, 0, sizeof(*v));
        const cudnnStatus_t st = vpack_make(ptr, ws, &v->d);
        if (st != CUDNN_STATUS_SUCCESS)
            return st;
        memcpy(v->ptr, ptr, sizeof(v->ptr));
        v->ws = ws;
    }
    return cudnnBackendExecute(h, p->plan, v->d);
}
