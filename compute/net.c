/*
 * net.c - struct rt_model, the network graph: layer builders, the
 * build-time plan (tensor table, flat parameter/gradient layout,
 * gradient-buffer reuse, in-place ReLU), PyTorch-default initialisation, the
 * forward/loss/backward step issued through the backend's op table, and the
 * rt_model_* accessors of compute.h.
 *
 * It does not know any architecture (models.c builds those) nor any
 * optimizer: it fills the gradient buffer and stops.
 */
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compute/backend.h"
#include "compute/dropout_index.h"
#include "compute/net.h"

enum node_kind { K_CONV, K_BN, K_RELU, K_MAXPOOL, K_GAP, K_FLATTEN, K_LINEAR, K_DROPOUT, K_ADD, K_SCALE };

/* How a table entry is initialised (PyTorch's reset_parameters()). */
enum init_kind { I_WEIGHT, I_BIAS, I_BN_WEIGHT, I_BN_BIAS, I_RUNNING_MEAN, I_RUNNING_VAR, I_COUNT };

struct tensor {
    int spatial;            /* 1: (N, C, H, W) in the backend layout; 0: features (N, F) */
    struct rt_shape4 sh;    /* n = the batch the net was built for; features: c = F, h = w = 1 */
    size_t per_sample;      /* floats per sample */
    float *data;
    float *grad;            /* NULL for the input image */
    int consumers;
    int producer;           /* node index; -1 for the input */
    int alias;              /* shares data with this tensor (in-place ReLU), or -1 */
    int grad_slot;          /* index into the gradient buffer pool; -1 none */
    int grad_written;       /* during backward: the first consumer overwrites, later ones add */
    int needs_grad;         /* something trainable lies at or before its producer: backward needs its gradient */
};

struct node {
    enum node_kind kind;
    int in[2], out;
    char name[80];          /* state_dict prefix ("layer1.0.conv1") or a description */
    struct rt_conv_desc conv;
    struct rt_pool_desc pool;
    struct rt_bn_desc bn;
    int lin_in, lin_out;
    int w, b;               /* tensor-table rows: weight/gamma, bias/beta; -1 none */
    int rm, rv;             /* batchnorm running statistics rows */
    int bt;                 /* batchnorm num_batches_tracked row */
    int frozen;             /* its parameters train not (rt_model_opts.freeze); a batchnorm runs in inference mode */
    float *save_mean, *save_invstd;
    float p, alpha;         /* dropout probability; scale factor */
    int fused;              /* ReLU: done by the batchnorm or residual add before it (nothing to run) */
    int add_relu;           /* residual add: the ReLU after it runs inside it (add_relu_fwd/add_relu_bwd) */
    int relu_out;           /* batchnorm with bn.relu, add with add_relu: the fused ReLU's output, whose gradient
                             * backward reads */
};

/* A tensor-table row with what its initialisation needs. */
struct entry {
    struct rt_tensor_info info;
    enum init_kind init;
    int fan_in, fan_out;
};

struct rt_model {
    char name[32];              /* rt_model_opts.name */
    struct rt_backend *be;
    const struct rt_ops *ops;   /* the table of the activations' type: every op on tensors */
    const struct rt_ops *ops32; /* the fp32 table: the parameter side (checks on flat buffers) */
    size_t esz;                 /* bytes per activation element */
    struct rt_stream *s;
    enum net_init init;
    int classes;
    int failed;

    struct tensor *t;
    int nt, capt;
    struct node *nd;
    int nn, capn;
    struct entry *ent;
    int nent, capent;
    struct rt_tensor_info *tab; /* the rows of ent, contiguous, made by net_finish() */

    size_t param_count, buffer_count;
    size_t trainable_count; /* floats [0, n) of params that train: the gradient buffer's size */
    size_t head_count;      /* floats [0, n) of params that are the classifier's (0: it is frozen) */
    int head;               /* the classifier's node */
    float *params, *grads, *buffers;
    int64_t *tracked;       /* num_batches_tracked per tensor-table row (batchnorm rows only) */
    int64_t train_steps;    /* training steps, the count a model without batchnorm reports */
    uint64_t seed;          /* initial weights and dropout masks */
    int last_batch;         /* batch of the last step (for the non-finite search) */
    int last_mode;
    float **grad_pool;
    size_t *grad_pool_size;
    int ngrad_pool;
    int logits;
    int32_t *labels;        /* device, batch */
    float *logits32;        /* device, batch x classes: 16-bit logits widened for the host; else NULL */
    struct rt_loss_stats *stats; /* device */
    /* Graphs of the step (rt_step_opts.graph), one per setting baked into them (graph_key); graph_why says why
     * the steps stay eager (NULL: none refused so far). */
    struct step_graph *graphs;
    int ngraphs;
    const char *graph_why;
    char graph_why_buf[256];
    uint64_t graph_replays;
    int capturing;          /* step_ops records a graph: the input's event wait and release are the launch's, and
                             * dropout draws from stream_dev on the device */
    uint64_t *stream_dev;   /* device: the micro-batch's dropout stream, written before each replay */
    int dropout_layers;     /* dropout nodes with p > 0 */
};

/* What a captured step bakes in: a replay is valid only with the same. */
struct graph_key {
    const uint8_t *images;
    const int32_t *labels_dev;
    const float *loss_scale, *mean, *std;
    int batch;
    enum rt_mode mode;
    float grad_scale, label_smoothing;
    int no_dropout;
    uint32_t dropout_start; /* dropout_offset's low half (its stream goes in stream_dev) */
};
struct step_graph {
    struct graph_key key;
    struct rt_graph *g;
    uint64_t gen;           /* rt_backend_graph_gen when captured */
};
/* Graphs kept per model: the two input buffers, times a short update's other gradient scale, with room. */
enum { MAX_STEP_GRAPHS = 8 };

static void graphs_drop(struct rt_model *n)
{
    for (int i = 0; i < n->ngraphs; i++)
        rt_graph_destroy(n->graphs[i].g);
    n->ngraphs = 0;
}

/* ---- building ------------------------------------------------------------ */

static int grow(void **p, int *cap, int need, size_t elem, const char *what)
{
    if (need <= *cap)
        return 0;
    int nc = *cap ? *cap * 2 : 32;
    while (nc < need)
        nc *= 2;
    void *q = rt_realloc(*p, (size_t)nc * elem, what);
    if (!q)
        return -ENOMEM;
    memset((char *)q + (size_t)*cap * elem, 0, (size_t)(nc - *cap) * elem);
    *p = q;
    *cap = nc;
    return 0;
}

static int new_tensor(struct rt_model *n, int spatial, struct rt_shape4 sh)
{
    if (grow((void **)&n->t, &n->capt, n->nt + 1, sizeof(*n->t), "net tensors"))
        return -1;
    struct tensor *t = &n->t[n->nt];
    memset(t, 0, sizeof(*t));
    t->spatial = spatial;
    t->sh = sh;
    t->per_sample = (size_t)sh.c * (size_t)sh.h * (size_t)sh.w;
    t->producer = n->nn - 1;
    t->alias = -1;
    t->grad_slot = -1;
    return n->nt++;
}

static struct node *new_node(struct rt_model *n, enum node_kind k, int in0, int in1, const char *name)
{
    if (n->failed)
        return NULL;
    if (grow((void **)&n->nd, &n->capn, n->nn + 1, sizeof(*n->nd), "net nodes")) {
        n->failed = 1;
        return NULL;
    }
    struct node *d = &n->nd[n->nn++];
    memset(d, 0, sizeof(*d));
    d->kind = k;
    d->in[0] = in0;
    d->in[1] = in1;
    d->w = d->b = d->rm = d->rv = d->bt = -1;
    snprintf(d->name, sizeof(d->name), "%s", name ? name : "");
    n->t[in0].consumers++;
    if (in1 >= 0)
        n->t[in1].consumers++;
    return d;
}


static int add_entry(struct rt_model *n, const char *prefix, const char *suffix, enum rt_param_kind kind,
                     enum init_kind init, int ndim, const int64_t *shape, int fan_in, int fan_out)
{
    if (grow((void **)&n->ent, &n->capent, n->nent + 1, sizeof(*n->ent), "tensor table")) {
        n->failed = 1;
        return -1;
    }
    struct entry *e = &n->ent[n->nent];
    memset(e, 0, sizeof(*e));
    snprintf(e->info.name, sizeof(e->info.name), "%s.%s", prefix, suffix);
    e->info.kind = kind;
    e->info.ndim = ndim;
    e->info.count = 1;
    for (int i = 0; i < ndim; i++) {
        e->info.shape[i] = shape[i];
        e->info.count *= (size_t)shape[i];
    }
    e->init = init;
    e->fan_in = fan_in;
    e->fan_out = fan_out;
    return n->nent++;
}

/* Marks the net failed with a message naming the layer. */
static int fail(struct rt_model *n, const char *layer)
{
    n->failed = 1;
    rt_errf(-EINVAL, "%s: %s", layer, rt_errmsg());
    return -1;
}

static int need(struct rt_model *n, int x, int spatial, const char *layer)
{
    if (n->failed)
        return -1;
    if (x < 0 || x >= n->nt)
        return fail(n, layer);
    if (n->t[x].spatial != spatial) {
        rt_errf(-EINVAL, "expects a %s input", spatial ? "spatial (N,C,H,W)" : "flat (N,F)");
        return fail(n, layer);
    }
    return 0;
}

int net_create(struct rt_backend *be, const char *name, struct rt_shape4 input, int classes, enum net_init init,
               enum rt_dtype act, const struct rt_ops *ops, struct rt_model **out)
{
    *out = NULL;
    if (ops) { /* a caller's table (rt_model_opts.ops); the backend's own keep the rule by construction */
        if (ops->act != act)
            return rt_errf(-EINVAL, "the op table given is %s, the model's activations %s", rt_dtype_name(ops->act),
                           rt_dtype_name(act));
        const int rc = act != RT_F32 ? rt_ops_check_act_table(ops, rt_backend_ops(be)) : 0;
        if (rc < 0)
            return rc;
    } else if (!(ops = rt_backend_ops_for(be, act))) {
        return -ENOTSUP;
    }
    struct rt_model *n = rt_calloc(1, sizeof(*n), "model");
    if (!n)
        return -ENOMEM;
    snprintf(n->name, sizeof(n->name), "%s", name);
    n->be = be;
    n->ops = ops;
    n->ops32 = rt_backend_ops(be);
    n->esz = act == RT_F32 ? sizeof(float) : sizeof(uint16_t);
    n->s = rt_backend_stream(be);
    n->init = init;
    n->classes = classes;
    n->logits = -1;
    if (new_tensor(n, 1, input) != 0) {
        free(n);
        return -ENOMEM;
    }
    *out = n;
    return 0;
}

int net_conv(struct rt_model *n, int x, const char *name, int cout, int k, int stride, int pad, int bias)
{
    if (need(n, x, 1, name))
        return -1;
    struct rt_conv_desc d = {.in = n->t[x].sh, .cout = cout, .kh = k, .kw = k, .stride = stride, .pad = pad};
    if (rt_conv_desc_init(&d))
        return fail(n, name);
    struct node *nd = new_node(n, K_CONV, x, -1, name);
    if (!nd)
        return -1;
    nd->conv = d;
    int cin = d.in.c;
    int64_t ws[4] = {cout, cin, k, k};
    nd->w = add_entry(n, name, "weight", RT_PARAM, I_WEIGHT, 4, ws, cin * k * k, cout * k * k);
    if (bias) {
        int64_t bs[1] = {cout};
        nd->b = add_entry(n, name, "bias", RT_PARAM, I_BIAS, 1, bs, cin * k * k, cout);
    }
    nd->out = new_tensor(n, 1, (struct rt_shape4){d.in.n, cout, d.oh, d.ow});
    return n->failed ? -1 : nd->out;
}

int net_bn(struct rt_model *n, int x, const char *name)
{
    if (need(n, x, 1, name))
        return -1;
    struct node *nd = new_node(n, K_BN, x, -1, name);
    if (!nd)
        return -1;
    nd->bn = (struct rt_bn_desc){.in = n->t[x].sh, .eps = 1e-5f, .momentum = 0.1f};
    int64_t cs[1] = {n->t[x].sh.c};
    nd->w = add_entry(n, name, "weight", RT_PARAM, I_BN_WEIGHT, 1, cs, 0, 0);
    nd->b = add_entry(n, name, "bias", RT_PARAM, I_BN_BIAS, 1, cs, 0, 0);
    nd->rm = add_entry(n, name, "running_mean", RT_BUFFER, I_RUNNING_MEAN, 1, cs, 0, 0);
    nd->rv = add_entry(n, name, "running_var", RT_BUFFER, I_RUNNING_VAR, 1, cs, 0, 0);
    nd->bt = add_entry(n, name, "num_batches_tracked", RT_BUFFER_I64, I_COUNT, 0, NULL, 0, 0);
    nd->out = new_tensor(n, 1, n->t[x].sh);
    return n->failed ? -1 : nd->out;
}

int net_relu(struct rt_model *n, int x)
{
    if (n->failed)
        return -1;
    struct node *nd = new_node(n, K_RELU, x, -1, "relu");
    if (!nd)
        return -1;
    nd->out = new_tensor(n, n->t[x].spatial, n->t[x].sh);
    return n->failed ? -1 : nd->out;
}

static int pool_node(struct rt_model *n, int x, const char *what, int kh, int kw, int stride, int pad)
{
    if (need(n, x, 1, what))
        return -1;
    struct rt_pool_desc d = {.in = n->t[x].sh, .kh = kh, .kw = kw, .stride = stride, .pad = pad};
    if (rt_pool_desc_init(&d))
        return fail(n, what);
    struct node *nd = new_node(n, K_MAXPOOL, x, -1, what);
    if (!nd)
        return -1;
    nd->pool = d;
    nd->out = new_tensor(n, 1, (struct rt_shape4){d.in.n, d.in.c, d.oh, d.ow});
    return n->failed ? -1 : nd->out;
}

int net_maxpool(struct rt_model *n, int x, const char *what, int k, int stride, int pad)
{
    return pool_node(n, x, what, k, k, stride, pad);
}

int net_global_maxpool(struct rt_model *n, int x, const char *what)
{
    if (need(n, x, 1, what))
        return -1;
    const struct rt_shape4 *sh = &n->t[x].sh;
    return pool_node(n, x, what, sh->h, sh->w, RT_MAX(sh->h, sh->w), 0);
}

static int to_features(struct rt_model *n, int x, const char *what, enum node_kind k)
{
    if (need(n, x, 1, what))
        return -1;
    struct node *nd = new_node(n, k, x, -1, what);
    if (!nd)
        return -1;
    struct rt_shape4 sh = n->t[x].sh;
    int f = k == K_GAP ? sh.c : sh.c * sh.h * sh.w;
    nd->out = new_tensor(n, 0, (struct rt_shape4){sh.n, f, 1, 1});
    return n->failed ? -1 : nd->out;
}

int net_gap(struct rt_model *n, int x, const char *what)
{
    return to_features(n, x, what, K_GAP);
}

int net_flatten(struct rt_model *n, int x, const char *what)
{
    return to_features(n, x, what, K_FLATTEN);
}

int net_linear(struct rt_model *n, int x, const char *name, int out, int bias)
{
    if (need(n, x, 0, name))
        return -1;
    struct node *nd = new_node(n, K_LINEAR, x, -1, name);
    if (!nd)
        return -1;
    nd->lin_in = n->t[x].sh.c;
    nd->lin_out = out;
    int64_t ws[2] = {out, nd->lin_in};
    nd->w = add_entry(n, name, "weight", RT_PARAM, I_WEIGHT, 2, ws, nd->lin_in, out);
    if (bias) {
        int64_t bs[1] = {out};
        nd->b = add_entry(n, name, "bias", RT_PARAM, I_BIAS, 1, bs, nd->lin_in, out);
    }
    nd->out = new_tensor(n, 0, (struct rt_shape4){n->t[x].sh.n, out, 1, 1});
    return n->failed ? -1 : nd->out;
}

int net_dropout(struct rt_model *n, int x, const char *what, float p)
{
    if (n->failed)
        return -1;
    if (!(p >= 0.0f && p < 1.0f)) {
        rt_errf(-EINVAL, "dropout probability %g is not in [0, 1)", (double)p);
        return fail(n, what);
    }
    /* The node's index and its tensor's logical indices each have their own bits of the masks' Philox counter
     * (dropout_index.h); beyond them two layers, or two micro-batches, would draw the same masks. */
    if (n->nn >= RT_DROPOUT_NODES) {
        rt_errf(-EINVAL, "dropout as layer %d: dropout layers must be among the first %d", n->nn, RT_DROPOUT_NODES);
        return fail(n, what);
    }
    if (x >= 0 && x < n->nt && (uint64_t)n->t[x].sh.n * n->t[x].per_sample >= (UINT64_C(1) << 32)) {
        rt_errf(-EINVAL, "dropout over %llu elements: at most 2^32 - 1 per batch",
                (unsigned long long)((uint64_t)n->t[x].sh.n * n->t[x].per_sample));
        return fail(n, what);
    }
    struct node *nd = new_node(n, K_DROPOUT, x, -1, what);
    if (!nd)
        return -1;
    nd->p = p;
    n->dropout_layers += p > 0.0f;
    nd->out = new_tensor(n, n->t[x].spatial, n->t[x].sh);
    return n->failed ? -1 : nd->out;
}

int net_add(struct rt_model *n, int a, int b, const char *what)
{
    if (n->failed)
        return -1;
    const struct tensor *ta = &n->t[a], *tb = &n->t[b];
    if (ta->spatial != tb->spatial || memcmp(&ta->sh, &tb->sh, sizeof(ta->sh)) != 0) {
        rt_errf(-EINVAL, "residual shapes differ: (%d,%d,%d,%d) + (%d,%d,%d,%d)", ta->sh.n, ta->sh.c, ta->sh.h,
                ta->sh.w, tb->sh.n, tb->sh.c, tb->sh.h, tb->sh.w);
        return fail(n, what);
    }
    struct node *nd = new_node(n, K_ADD, a, b, what);
    if (!nd)
        return -1;
    nd->out = new_tensor(n, ta->spatial, ta->sh);
    return n->failed ? -1 : nd->out;
}

int net_scale(struct rt_model *n, int x, const char *what, float alpha)
{
    if (n->failed)
        return -1;
    struct node *nd = new_node(n, K_SCALE, x, -1, what);
    if (!nd)
        return -1;
    nd->alpha = alpha;
    nd->out = new_tensor(n, n->t[x].spatial, n->t[x].sh);
    return n->failed ? -1 : nd->out;
}

/* ---- planning and allocation ----------------------------------------------- */

static size_t align64(size_t v)
{
    return (v + 63) & ~(size_t)63; /* 64 floats = 256 bytes */
}

/* PyTorch's initialisation, drawn from Philox keyed by (seed, table row). */
static void init_entry(const struct rt_model *n, const struct entry *e, int row, uint64_t seed, float *v)
{
    struct rt_rng r;
    rt_rng_init(&r, seed, 0x1000u + (uint64_t)row);
    size_t c = e->info.count;
    switch (e->init) {
    case I_WEIGHT:
        if (n->init == NET_INIT_FAN_OUT && e->info.ndim == 4) {
            float sd = (float)sqrt(2.0 / (double)e->fan_out);
            for (size_t i = 0; i < c; i++)
                v[i] = sd * rt_rng_normal(&r);
        } else {
            /* kaiming_uniform_(a=sqrt(5)): bound = sqrt(6 / ((1 + 5) fan_in)) */
            float bound = (float)(1.0 / sqrt((double)e->fan_in));
            for (size_t i = 0; i < c; i++)
                v[i] = (2.0f * rt_rng_uniform(&r) - 1.0f) * bound;
        }
        break;
    case I_BIAS: {
        float bound = (float)(1.0 / sqrt((double)e->fan_in));
        for (size_t i = 0; i < c; i++)
            v[i] = (2.0f * rt_rng_uniform(&r) - 1.0f) * bound;
        break;
    }
    case I_BN_WEIGHT:
    case I_RUNNING_VAR:
        for (size_t i = 0; i < c; i++)
            v[i] = 1.0f;
        break;
    case I_BN_BIAS:
    case I_RUNNING_MEAN:
    case I_COUNT:
        memset(v, 0, c * sizeof(float));
        break;
    }
}

static void *dev_alloc_bytes(struct rt_model *n, size_t bytes, int *err)
{
    if (*err)
        return NULL;
    void *p = n->ops->alloc(n->be, bytes);
    if (!p)
        *err = 1;
    return p;
}

static void *dev_alloc(struct rt_model *n, size_t floats, int *err)
{
    return dev_alloc_bytes(n, floats * sizeof(float), err);
}

/* An activation or activation gradient of `elems` elements of the net's type. */
static void *act_alloc(struct rt_model *n, size_t elems, int *err)
{
    return dev_alloc_bytes(n, elems * n->esz, err);
}

/* Gives tensor tx's gradient a pool slot: the smallest free one that is big
 * enough, else the biggest free one (grown), else a new one. */
static void take_slot(struct rt_model *n, int *busy, int *np, int tx)
{
    size_t want = n->t[tx].per_sample * (size_t)n->t[tx].sh.n;
    int best = -1, big = -1;
    for (int q = 0; q < *np; q++) {
        if (busy[q])
            continue;
        if (n->grad_pool_size[q] >= want && (best < 0 || n->grad_pool_size[q] < n->grad_pool_size[best]))
            best = q;
        if (big < 0 || n->grad_pool_size[q] > n->grad_pool_size[big])
            big = q;
    }
    if (best < 0)
        best = big >= 0 ? big : (*np)++;
    if (n->grad_pool_size[best] < want)
        n->grad_pool_size[best] = want;
    busy[best] = 1;
    n->t[tx].grad_slot = best;
}

/* 1 when node d runs the ReLU after it (its relu_out), whose output's gradient its backward reads. */
static int relu_fused(const struct node *d)
{
    return (d->kind == K_BN && d->bn.relu) || (d->kind == K_ADD && d->add_relu);
}

/* Assigns every gradient a buffer from a pool, reusing one as soon as the
 * tensor's producer has run its backward. Sizes are settled before anything
 * is allocated, so a reused buffer grows to its largest user. */
static int plan_grads(struct rt_model *n)
{
    int cap = n->nt + 1;
    n->grad_pool_size = rt_calloc((size_t)cap, sizeof(size_t), "gradient plan");
    int *busy = rt_calloc((size_t)cap, sizeof(int), "gradient plan");
    n->grad_pool = rt_calloc((size_t)cap, sizeof(float *), "gradient plan");
    if (!n->grad_pool_size || !busy || !n->grad_pool) {
        free(busy);
        return -ENOMEM;
    }
    int np = 0;
    take_slot(n, busy, &np, n->logits);
    for (int i = n->nn - 1; i >= 0; i--) {
        const struct node *d = &n->nd[i];
        if (d->kind == K_RELU && d->fused)
            continue; /* its batchnorm reads the gradient of its output, and frees it */
        if (!n->t[d->out].needs_grad)
            continue; /* no backward: nothing trainable at or before it */
        /* A trainable batchnorm computes its data gradient with its parameters' in one op: where nothing needs
         * it (the layer before is frozen), it goes to a buffer of its own, free again for the layers below. */
        const int sink = d->kind == K_BN && !d->frozen && !n->t[d->in[0]].needs_grad;
        for (int k = 0; k < 2; k++) {
            int x = d->in[k];
            if (x > 0 && n->t[x].grad_slot < 0 && (n->t[x].needs_grad || sink))
                take_slot(n, busy, &np, x);
        }
        busy[n->t[relu_fused(d) ? d->relu_out : d->out].grad_slot] = 0;
        if (sink && d->in[0] > 0)
            busy[n->t[d->in[0]].grad_slot] = 0;
    }
    free(busy);
    n->ngrad_pool = np;
    return 0;
}

/* The classifier: the layer with parameters that computes the logits, through the parameter-free layers after it
 * (resnet9 scales its logits); -1 if there is none. */
static int find_head(const struct rt_model *n, int logits)
{
    for (int t = logits; t > 0;) {
        const int p = n->t[t].producer;
        if (p < 0 || n->nd[p].in[1] >= 0)
            return -1;
        if (n->nd[p].w >= 0)
            return p;
        t = n->nd[p].in[0];
    }
    return -1;
}

/* 1 if a glob of pats[0..np) matches `name`, marking which did in used[]. */
static int glob_hit(char **pats, int np, int *used, const char *name)
{
    int hit = 0;
    for (int k = 0; k < np; k++)
        if (fnmatch(pats[k], name, 0) == 0)
            hit = used[k] = 1;
    return hit;
}

/* Marks the layers `freeze` names (rt_model_opts.freeze): a layer is frozen when all its parameters match. */
static int apply_freeze(struct rt_model *n, const char *freeze)
{
    if (!freeze || !*freeze)
        return 0;
    char buf[1024], *pats[64], *save = NULL;
    int np = 0, used[64] = {0};
    if (strlen(freeze) >= sizeof(buf))
        return rt_errf(-EINVAL, "--freeze: the list of globs is longer than %zu characters", sizeof(buf) - 1);
    snprintf(buf, sizeof(buf), "%s", freeze);
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        for (char *e = tok + strlen(tok); e > tok && e[-1] == ' ';)
            *--e = 0;
        if (!*tok)
            continue;
        if (np == (int)RT_ARRAY_LEN(pats))
            return rt_errf(-EINVAL, "--freeze: more than %d globs", (int)RT_ARRAY_LEN(pats));
        pats[np++] = tok;
    }
    int trainable = 0;
    for (int i = 0; i < n->nn; i++) {
        struct node *d = &n->nd[i];
        if (d->w < 0)
            continue;
        const int hw = glob_hit(pats, np, used, n->ent[d->w].info.name);
        const int hb = d->b >= 0 ? glob_hit(pats, np, used, n->ent[d->b].info.name) : hw;
        if (hw != hb)
            return rt_errf(-EINVAL, "--freeze '%s' matches %s but not %s: a layer is frozen whole", freeze,
                           n->ent[hw ? d->w : d->b].info.name, n->ent[hw ? d->b : d->w].info.name);
        d->frozen = hw;
        trainable += !hw;
        const int rows[] = {d->w, d->b, d->rm, d->rv, d->bt};
        for (size_t k = 0; k < RT_ARRAY_LEN(rows); k++)
            if (rows[k] >= 0)
                n->ent[rows[k]].info.frozen = hw;
    }
    for (int k = 0; k < np; k++) {
        if (used[k])
            continue;
        const char *some[3] = {"", "", ""};
        for (int i = 0, seen = 0; i < n->nn; i++)
            if (n->nd[i].w >= 0 && seen++ < 3)
                some[seen - 1] = n->nd[i].name;
        return rt_errf(-EINVAL, "--freeze: '%s' matches no parameter (the globs match PyTorch's state_dict names: "
                                "here %s.weight, %s.*, %s.*, ..., %s.*)",
                       pats[k], some[0], some[1], some[2], n->head >= 0 ? n->nd[n->head].name : "?");
    }
    if (!trainable)
        return rt_errf(-EINVAL, "--freeze '%s' freezes every layer: nothing would train", freeze);
    return 0;
}

int net_finish(struct rt_model *n, int logits, uint64_t seed, const char *freeze)
{
    if (n->failed)
        return -EINVAL;
    const struct tensor *lt = &n->t[logits];
    if (lt->spatial || lt->sh.c != n->classes)
        return rt_errf(-EINVAL, "the last layer gives %d outputs, not %d classes", lt->sh.c, n->classes);
    n->logits = logits;
    n->seed = seed;
    n->head = find_head(n, logits);
    int rc = apply_freeze(n, freeze);
    if (rc < 0)
        return rc;
    if (n->head >= 0) {
        n->ent[n->nd[n->head].w].info.head = 1;
        if (n->nd[n->head].b >= 0)
            n->ent[n->nd[n->head].b].info.head = 1;
    }

    /* Parameters in the order backward finishes them, last node first: the trainable ones, then the frozen. */
    size_t off = 0;
    for (int frozen = 0; frozen < 2; frozen++) {
        for (int i = n->nn - 1; i >= 0; i--) {
            int rows[2] = {n->nd[i].w, n->nd[i].b};
            for (int k = 0; k < 2; k++) {
                if (rows[k] < 0 || n->nd[i].frozen != frozen)
                    continue;
                n->ent[rows[k]].info.offset = off;
                off = align64(off + n->ent[rows[k]].info.count);
            }
        }
        if (!frozen)
            n->trainable_count = off;
    }
    n->param_count = off;
    /* The classifier is the last layer, so the first laid out: floats [0, head_count). */
    if (n->head >= 0 && !n->nd[n->head].frozen && n->ent[n->nd[n->head].w].info.offset == 0) {
        const struct node *h = &n->nd[n->head];
        n->head_count = align64(n->ent[h->w].info.count);
        if (h->b >= 0)
            n->head_count = RT_MAX(n->head_count, align64(n->ent[h->b].info.offset + n->ent[h->b].info.count));
    }
    /* Which tensors backward needs the gradient of: those with something trainable at or before them. */
    for (int i = 0; i < n->nn; i++) {
        const struct node *d = &n->nd[i];
        int ng = d->w >= 0 && !d->frozen;
        for (int k = 0; k < 2; k++)
            ng |= d->in[k] >= 0 && n->t[d->in[k]].needs_grad;
        n->t[d->out].needs_grad = ng;
    }
    off = 0;
    for (int i = 0; i < n->nent; i++) {
        if (n->ent[i].info.kind != RT_BUFFER)
            continue;
        n->ent[i].info.offset = off;
        off = align64(off + n->ent[i].info.count);
    }
    n->buffer_count = off;

    n->tab = rt_calloc((size_t)n->nent + 1, sizeof(*n->tab), "tensor table");
    if (!n->tab)
        return -ENOMEM;
    for (int i = 0; i < n->nent; i++)
        n->tab[i] = n->ent[i].info;

    n->tracked = rt_calloc((size_t)n->nent, sizeof(*n->tracked), "num_batches_tracked");
    if (!n->tracked)
        return -ENOMEM;
    int err = 0;
    n->params = dev_alloc(n, n->param_count, &err);
    n->grads = dev_alloc(n, RT_MAX(n->trainable_count, 1), &err);
    n->buffers = dev_alloc(n, RT_MAX(n->buffer_count, 1), &err);
    n->labels = dev_alloc(n, (size_t)n->t[0].sh.n, &err);
    n->stats = dev_alloc(n, sizeof(struct rt_loss_stats) / sizeof(float), &err);
    if (n->esz != sizeof(float))
        n->logits32 = dev_alloc(n, (size_t)n->t[0].sh.n * (size_t)n->classes, &err);
    if (err)
        return -ENOMEM;

    size_t maxc = 1;
    for (int i = 0; i < n->nent; i++)
        maxc = RT_MAX(maxc, n->ent[i].info.count);
    float *host = rt_malloc(maxc * sizeof(float), "initial weights");
    if (!host)
        return -ENOMEM;
    for (int i = 0; i < n->nent; i++) {
        const struct entry *e = &n->ent[i];
        if (e->info.kind == RT_BUFFER_I64)
            continue;
        init_entry(n, e, i, seed, host);
        float *base = e->info.kind == RT_PARAM ? n->params : n->buffers;
        n->ops->upload(n->s, base + e->info.offset, host, e->info.count * sizeof(float));
    }
    free(host);

    /* ReLU runs in place when nothing else reads its input and the input's
     * producer does not need its own output for backward. */
    for (int i = 0; i < n->nn; i++) {
        const struct node *d = &n->nd[i];
        if (d->kind != K_RELU)
            continue;
        int x = d->in[0];
        int prod = n->t[x].producer;
        if (x > 0 && n->t[x].consumers == 1 && prod >= 0 && n->nd[prod].kind != K_MAXPOOL &&
            n->nd[prod].kind != K_RELU)
            n->t[d->out].alias = x;
    }
    /* A ReLU that runs in place on a batchnorm's output is folded into the batchnorm where the table can: one pass
     * over the tensor instead of three (batchnorm, ReLU forward, ReLU backward). One on a residual add's output
     * alike into the add (add_relu_fwd/bwd), where the add's inputs are two tensors (x + x keeps its ReLU: the
     * fused backward writes two gradients). */
    for (int i = 0; i < n->nn; i++) {
        struct node *d = &n->nd[i];
        const int x = d->in[0];
        if (d->kind != K_RELU || n->t[d->out].alias != x)
            continue;
        struct node *p = &n->nd[n->t[x].producer];
        if (p->kind == K_BN && n->ops->bn_relu)
            p->bn.relu = 1;
        else if (p->kind == K_ADD && n->ops->add_relu && p->in[0] != p->in[1])
            p->add_relu = 1;
        else
            continue;
        p->relu_out = d->out;
        d->fused = 1;
    }
    for (int i = 0; i < n->nt; i++) {
        struct tensor *t = &n->t[i];
        t->data = t->alias >= 0 ? n->t[t->alias].data : act_alloc(n, t->per_sample * (size_t)t->sh.n, &err);
    }
    for (int i = 0; i < n->nn; i++) {
        struct node *d = &n->nd[i];
        if (d->kind == K_BN) {
            d->save_mean = dev_alloc(n, (size_t)d->bn.in.c, &err);
            d->save_invstd = dev_alloc(n, (size_t)d->bn.in.c, &err);
        }
    }
    if (err || plan_grads(n))
        return -ENOMEM;
    for (int q = 0; q < n->ngrad_pool; q++)
        n->grad_pool[q] = act_alloc(n, n->grad_pool_size[q], &err);
    if (err)
        return -ENOMEM;
    for (int i = 1; i < n->nt; i++)
        n->t[i].grad = n->t[i].grad_slot >= 0 ? n->grad_pool[n->t[i].grad_slot] : NULL;
    return 0;
}

void rt_model_destroy(struct rt_model *n)
{
    if (!n)
        return;
    const struct rt_ops *o = n->ops;
    for (int i = 0; i < n->nt; i++)
        if (n->t[i].alias < 0)
            o->free(n->be, n->t[i].data);
    for (int i = 0; i < n->nn; i++) {
        o->free(n->be, n->nd[i].save_mean);
        o->free(n->be, n->nd[i].save_invstd);
    }
    for (int q = 0; q < n->ngrad_pool; q++)
        o->free(n->be, n->grad_pool[q]);
    o->free(n->be, n->params);
    o->free(n->be, n->grads);
    o->free(n->be, n->buffers);
    o->free(n->be, n->labels);
    o->free(n->be, n->stats);
    o->free(n->be, n->logits32);
    n->ops32->free(n->be, n->stream_dev);
    graphs_drop(n);
    free(n->graphs);
    free(n->grad_pool);
    free(n->grad_pool_size);
    free(n->tab);
    free(n->tracked);
    free(n->ent);
    free(n->nd);
    free(n->t);
    free(n);
}

/* ---- the step ---------------------------------------------------------------- */

static float *P(struct rt_model *n, int row)
{
    return row < 0 ? NULL : n->params + n->ent[row].info.offset;
}

static float *G(struct rt_model *n, int row)
{
    return row < 0 ? NULL : n->grads + n->ent[row].info.offset;
}

static float *B(struct rt_model *n, int row)
{
    return n->buffers + n->ent[row].info.offset;
}

static size_t count_at(const struct tensor *t, int batch)
{
    return t->per_sample * (size_t)batch;
}

/* The tensor's logical shape at `batch` samples. */
static struct rt_shape4 shape_at(const struct tensor *t, int batch)
{
    struct rt_shape4 sh = t->sh;
    sh.n = batch;
    return sh;
}

/* Dropout masks: each node draws under its own (key, counters) of the micro-batch's stream (dropout_index.h). */
static struct rt_dropout_draw dropout_draw(const struct rt_model *n, const struct rt_step_opts *o, int node)
{
    /* A graph's: the key and start with the node, drawn on the device from the stream it holds (dropout_fwd). */
    if (n->capturing)
        return (struct rt_dropout_draw){n->seed, (uint64_t)(uint32_t)o->dropout_offset + ((uint64_t)node << 56)};
    return rt_dropout_node_draw(n->seed, o->dropout_stream + (o->dropout_offset >> 32), (uint32_t)o->dropout_offset,
                                (unsigned)node);
}

/*
 * The per-op profile (rt_step_opts.per_op): OP() issues op `name` of table `op` with `args` between two marks on
 * the timeline `tl`, RT_MARK_OP_BEGIN before and RT_MARK_OP_END after, both labelled with the op's member name in
 * struct rt_ops (a static string, as the timeline wants). tl is NULL when the profile is off, so that an ordinary
 * step pays one test per op and no mark.
 */
#define OP(tl, op, name, args)                                                                                 \
    do {                                                                                                       \
        if (tl)                                                                                                \
            rt_timeline_mark((tl), #name, RT_MARK_OP_BEGIN);                                                   \
        (op)->name args;                                                                                       \
        if (tl)                                                                                                \
            rt_timeline_mark((tl), #name, RT_MARK_OP_END);                                                     \
    } while (0)

/* The timeline the step's ops are marked on: the step's own with per_op, else NULL (no op marks). */
static struct rt_timeline *op_marks(const struct rt_step_opts *o)
{
    return o->per_op ? o->timeline : NULL;
}

static void node_fwd(struct rt_model *n, int i, int batch, const struct rt_step_opts *o)
{
    const struct rt_ops *op = n->ops;
    struct rt_stream *s = n->s;
    struct rt_timeline *tl = op_marks(o);
    struct node *d = &n->nd[i];
    const struct tensor *x = &n->t[d->in[0]];
    struct tensor *y = &n->t[d->out];
    int train = o->mode == RT_TRAIN;
    switch (d->kind) {
    case K_CONV: {
        struct rt_conv_desc c = d->conv;
        c.in.n = batch;
        OP(tl, op, conv2d_fwd, (s, &c, x->data, P(n, d->w), P(n, d->b), y->data));
        break;
    }
    case K_BN: {
        struct rt_bn_desc b = d->bn;
        b.in.n = batch;
        if (train && !d->frozen)
            OP(tl, op, bn_train_fwd, (s, &b, x->data, P(n, d->w), P(n, d->b), B(n, d->rm), B(n, d->rv), d->save_mean,
                                      d->save_invstd, y->data));
        else
            OP(tl, op, bn_infer_fwd, (s, &b, x->data, P(n, d->w), P(n, d->b), B(n, d->rm), B(n, d->rv), y->data));
        break;
    }
    case K_RELU:
        if (!d->fused)
            OP(tl, op, relu_fwd, (s, count_at(x, batch), x->data, y->data));
        break;
    case K_MAXPOOL: {
        struct rt_pool_desc p = d->pool;
        p.in.n = batch;
        OP(tl, op, maxpool_fwd, (s, &p, x->data, y->data));
        break;
    }
    case K_GAP:
        OP(tl, op, gap_fwd, (s, shape_at(x, batch), x->data, y->data));
        break;
    case K_FLATTEN:
        OP(tl, op, flatten_fwd, (s, shape_at(x, batch), x->data, y->data));
        break;
    case K_LINEAR:
        OP(tl, op, linear_fwd, (s, batch, d->lin_in, d->lin_out, x->data, P(n, d->w), P(n, d->b), y->data));
        break;
    case K_DROPOUT:
        if (train && !o->no_dropout && d->p > 0.0f) {
            const struct rt_dropout_draw dr = dropout_draw(n, o, i);
            OP(tl, op, dropout_fwd, (s, shape_at(x, batch), x->spatial, d->p, dr.seed, dr.offset,
                                     n->capturing ? n->stream_dev : NULL, x->data, y->data));
        } else {
            OP(tl, op, copy, (s, y->data, x->data, count_at(x, batch) * n->esz));
        }
        break;
    case K_ADD:
        if (d->add_relu)
            OP(tl, op, add_relu_fwd, (s, count_at(x, batch), x->data, n->t[d->in[1]].data, y->data));
        else
            OP(tl, op, add, (s, count_at(x, batch), x->data, n->t[d->in[1]].data, y->data));
        break;
    case K_SCALE:
        OP(tl, op, copy, (s, y->data, x->data, count_at(x, batch) * n->esz));
        OP(tl, op, scale, (s, count_at(x, batch), d->alpha, y->data));
        break;
    }
}

/* dx of input k of node d: NULL for the image; beta 0 for the first writer. */
static float *dx_of(struct rt_model *n, const struct node *d, int k, float *beta)
{
    struct tensor *x = &n->t[d->in[k]];
    if (d->in[k] == 0 || !x->grad)
        return NULL; /* the image, or a tensor below everything trainable */
    *beta = x->grad_written ? 1.0f : 0.0f;
    x->grad_written = 1;
    return x->grad;
}

/* dx = beta dx + alpha dy, for the ops whose backward is a copy; its ops marked on tl (op_marks) when not NULL. */
static void pass_grad(struct rt_model *n, struct rt_timeline *tl, size_t count, float alpha, const float *dy, float beta,
                      float *dx)
{
    const struct rt_ops *op = n->ops;
    if (beta != 0.0f) {
        OP(tl, op, axpy, (n->s, count, alpha, dy, dx));
        return;
    }
    OP(tl, op, copy, (n->s, dx, dy, count * n->esz));
    if (alpha != 1.0f)
        OP(tl, op, scale, (n->s, count, alpha, dx));
}

/* Tells the caller that node i's parameter gradients, and with them all of
 * the buffer before them, are final (parameters are laid out last node
 * first). */
static void grads_done(struct rt_model *n, const struct node *d, const struct rt_step_opts *o)
{
    if (!o->grads_ready || d->w < 0)
        return;
    size_t end = n->ent[d->w].info.offset + n->ent[d->w].info.count;
    if (d->b >= 0)
        end = RT_MAX(end, n->ent[d->b].info.offset + n->ent[d->b].info.count);
    o->grads_ready(o->grads_ready_arg, end);
}

static void node_bwd(struct rt_model *n, int i, int batch, const struct rt_step_opts *o)
{
    const struct rt_ops *op = n->ops;
    struct rt_stream *s = n->s;
    struct rt_timeline *tl = op_marks(o);
    struct node *d = &n->nd[i];
    const struct tensor *x = &n->t[d->in[0]];
    const struct tensor *y = &n->t[d->out];
    const float *dy = y->grad;
    float beta = 0.0f;
    float *dx;
    if (!y->needs_grad)
        return; /* nothing trainable at or before this layer */
    switch (d->kind) {
    case K_CONV: {
        struct rt_conv_desc c = d->conv;
        c.in.n = batch;
        if (!d->frozen) {
            OP(tl, op, conv2d_bwd_filter, (s, &c, x->data, dy, G(n, d->w), G(n, d->b)));
            grads_done(n, d, o); /* before the data gradient: the all-reduce starts sooner */
        }
        if ((dx = dx_of(n, d, 0, &beta)))
            OP(tl, op, conv2d_bwd_data, (s, &c, dy, P(n, d->w), beta, dx));
        break;
    }
    case K_BN: {
        struct rt_bn_desc b = d->bn;
        b.in.n = batch;
        dx = dx_of(n, d, 0, &beta);
        if (b.relu)
            dy = n->t[d->relu_out].grad;
        if (d->frozen) { /* inference mode: the data gradient through the running statistics */
            if (dx)
                OP(tl, op, bn_infer_bwd,
                   (s, &b, x->data, dy, P(n, d->w), P(n, d->b), B(n, d->rm), B(n, d->rv), beta, dx));
            break;
        }
        OP(tl, op, bn_bwd, (s, &b, x->data, dy, P(n, d->w), P(n, d->b), d->save_mean, d->save_invstd, beta, dx,
                            G(n, d->w), G(n, d->b)));
        grads_done(n, d, o);
        break;
    }
    case K_RELU:
        if (!d->fused && (dx = dx_of(n, d, 0, &beta)))
            OP(tl, op, relu_bwd, (s, count_at(x, batch), y->data, dy, beta, dx));
        break;
    case K_MAXPOOL: {
        struct rt_pool_desc p = d->pool;
        p.in.n = batch;
        if ((dx = dx_of(n, d, 0, &beta)))
            OP(tl, op, maxpool_bwd, (s, &p, x->data, y->data, dy, beta, dx));
        break;
    }
    case K_GAP:
        if ((dx = dx_of(n, d, 0, &beta)))
            OP(tl, op, gap_bwd, (s, shape_at(x, batch), dy, beta, dx));
        break;
    case K_FLATTEN:
        if ((dx = dx_of(n, d, 0, &beta)))
            OP(tl, op, flatten_bwd, (s, shape_at(x, batch), dy, beta, dx));
        break;
    case K_LINEAR:
        if (!d->frozen) {
            OP(tl, op, linear_bwd_filter, (s, batch, d->lin_in, d->lin_out, x->data, dy, G(n, d->w), G(n, d->b)));
            grads_done(n, d, o);
        }
        if ((dx = dx_of(n, d, 0, &beta)))
            OP(tl, op, linear_bwd_data, (s, batch, d->lin_in, d->lin_out, dy, P(n, d->w), beta, dx));
        break;
    case K_DROPOUT:
        if (!(dx = dx_of(n, d, 0, &beta)))
            break;
        if (!o->no_dropout && d->p > 0.0f) {
            const struct rt_dropout_draw dr = dropout_draw(n, o, i);
            OP(tl, op, dropout_bwd, (s, shape_at(x, batch), x->spatial, d->p, dr.seed, dr.offset,
                                     n->capturing ? n->stream_dev : NULL, dy, beta, dx));
        } else {
            pass_grad(n, tl, count_at(x, batch), 1.0f, dy, beta, dx);
        }
        break;
    case K_ADD:
        if (d->add_relu) { /* y holds the ReLU's output: the gradient passes where it is > 0 */
            float beta_b = 0.0f;
            float *dxa = dx_of(n, d, 0, &beta), *dxb = dx_of(n, d, 1, &beta_b);
            OP(tl, op, add_relu_bwd, (s, count_at(x, batch), y->data, n->t[d->relu_out].grad, beta, dxa, beta_b, dxb));
            break;
        }
        for (int k = 0; k < 2; k++)
            if ((dx = dx_of(n, d, k, &beta)))
                pass_grad(n, tl, count_at(x, batch), 1.0f, dy, beta, dx);
        break;
    case K_SCALE:
        if ((dx = dx_of(n, d, 0, &beta)))
            pass_grad(n, tl, count_at(x, batch), d->alpha, dy, beta, dx);
        break;
    }
}

/* The host's side of a training step: the counters a checkpoint saves (num_batches_tracked). */
static void step_account(struct rt_model *n, const struct rt_step_opts *o, int batch)
{
    n->last_batch = batch;
    n->last_mode = o->mode;
    if (o->mode == RT_TRAIN) {
        n->train_steps++;
        for (int i = 0; i < n->nn; i++)
            if (n->nd[i].bt >= 0 && !n->nd[i].frozen)
                n->tracked[n->nd[i].bt]++;
    }
}

static int step_ops(struct rt_model *n, const struct rt_step_opts *o, int batch, const uint8_t *images,
                    const int32_t *labels, struct rt_loss_stats *stats);

/* Why this step cannot be a graph, or NULL. */
static const char *graph_refusal(const struct rt_step_opts *o)
{
    if (!o->input_ticket || !o->labels_dev)
        return "the step's images or labels are host memory, not an input upload";
    if (!o->stats_dev)
        return "the step's loss sums go to the host (rt_step_opts.stats_dev not set)";
    if (o->timeline)
        return "the step is profiled layer by layer (timeline marks inside the step)";
    return NULL;
}

static void graph_refuse(struct rt_model *n, const char *why)
{
    snprintf(n->graph_why_buf, sizeof(n->graph_why_buf), "%s", why);
    n->graph_why = n->graph_why_buf;
}

/*
 * The step as a graph: captured the first time a setting is seen (the loss sums into the model's own scalar, the
 * gradients' progress reported once after it, for everything is final then), replayed after. What the host
 * does in a step -- the counters -- it does on a replay too. A capture that fails leaves the model eager, the
 * reason in graph_why.
 */
static int graph_step(struct rt_model *n, const struct rt_step_opts *o, int batch, const uint8_t *images,
                      const int32_t *labels, struct rt_loss_stats *stats)
{
    const struct graph_key k = {images,        o->labels_dev,    o->loss_scale,       o->mean,
                                o->std,        batch,            o->mode,             o->grad_scale,
                                o->label_smoothing, o->no_dropout, (uint32_t)o->dropout_offset};
    /* Dropout's stream changes every micro-batch: it goes to the device before the capture and each replay. */
    const int drop = o->mode == RT_TRAIN && !o->no_dropout && n->dropout_layers > 0;
    if (drop) {
        if (!n->stream_dev && !(n->stream_dev = n->ops32->alloc(n->be, sizeof(uint64_t))))
            return -ENOMEM;
        const uint64_t stream = o->dropout_stream + (o->dropout_offset >> 32);
        n->ops32->upload(n->s, n->stream_dev, &stream, sizeof(stream));
    }
    /* Memory a graph baked in was freed or regrown since (a workspace that grew for another shape): capture
     * again. */
    const uint64_t gen = rt_backend_graph_gen(n->be);
    int stale = 0;
    for (int i = 0; i < n->ngraphs; i++)
        stale |= n->graphs[i].gen != gen;
    if (stale)
        graphs_drop(n);
    struct step_graph *hit = NULL;
    for (int i = 0; i < n->ngraphs && !hit; i++)
        if (!memcmp(&n->graphs[i].key, &k, sizeof(k)))
            hit = &n->graphs[i];
    struct rt_step_opts c = *o;
    c.grads_ready = NULL;
    c.stats_dev = n->stats;
    c.graph = 0;
    if (!hit) {
        if (n->ngraphs == MAX_STEP_GRAPHS) {
            graph_refuse(n, "more distinct step settings than graphs kept");
            return step_ops(n, o, batch, images, labels, stats);
        }
        if (!n->graphs && !(n->graphs = rt_calloc(MAX_STEP_GRAPHS, sizeof(*n->graphs), "step graphs")))
            return -ENOMEM;
        int rc = rt_graph_capture_begin(n->be);
        if (rc < 0) {
            graph_refuse(n, rt_errmsg());
            return step_ops(n, o, batch, images, labels, stats);
        }
        n->capturing = 1;
        rc = step_ops(n, &c, batch, images, labels, NULL);
        n->capturing = 0;
        struct rt_graph *g = NULL;
        const int end = rt_graph_capture_end(n->be, &g);
        if (rc < 0) {
            rt_graph_destroy(g);
            return rc;
        }
        if (end < 0) {
            graph_refuse(n, rt_errmsg());
            return step_ops(n, o, batch, images, labels, stats);
        }
        hit = &n->graphs[n->ngraphs++];
        *hit = (struct step_graph){k, g, rt_backend_graph_gen(n->be)};
    } else {
        n->graph_replays++;
    }
    /* The input's copy waited for before the replay, its buffer given back after it (rather than after the loss:
     * the next copy into it is two steps away). */
    rt_backend_input_acquire(n->be, o->input_ticket);
    rt_graph_launch(hit->g);
    rt_backend_input_release(n->be, o->input_ticket);
    n->ops32->copy(n->s, o->stats_dev, n->stats, sizeof(struct rt_loss_stats));
    if (o->grads_ready && o->mode == RT_TRAIN && o->grad_scale > 0.0f)
        o->grads_ready(o->grads_ready_arg, n->trainable_count);
    return 0;
}

const char *rt_model_graph_status(const struct rt_model *n, int *graphs, uint64_t *replays)
{
    if (graphs)
        *graphs = n->ngraphs;
    if (replays)
        *replays = n->graph_replays;
    return n->graph_why;
}

int rt_model_step(struct rt_model *n, const struct rt_step_opts *o, int batch, const uint8_t *images, const int32_t *labels,
             struct rt_loss_stats *stats)
{
    if (batch <= 0 || batch > n->t[0].sh.n)
        return rt_errf(-EINVAL, "batch of %d samples: the model was built for at most %d", batch, n->t[0].sh.n);
    if (o->graph && !n->graph_why) {
        const char *why = graph_refusal(o);
        if (why)
            graph_refuse(n, why);
    }
    /* A graph when asked and allowed (graph_step falls back to the ops itself), else the ops one by one. */
    const int rc = o->graph && !n->graph_why ? graph_step(n, o, batch, images, labels, stats)
                                             : step_ops(n, o, batch, images, labels, stats);
    if (rc == 0)
        step_account(n, o, batch); /* once, whichever ran: a capture's ops count nothing */
    return rc;
}

static int step_ops(struct rt_model *n, const struct rt_step_opts *o, int batch, const uint8_t *images,
                    const int32_t *labels, struct rt_loss_stats *stats)
{
    const struct rt_ops *op = n->ops;
    struct rt_stream *s = n->s;
    struct rt_timeline *tl = o->timeline, *tl_op = op_marks(o);
    /* The per-op profile brings the layer marks with it: they say which layer each op belongs to. */
    const int per_layer = tl && (o->per_layer || o->per_op);
    struct rt_shape4 in = n->t[0].sh;
    in.n = batch;
    if (o->input_ticket) {
        /* Marked after the wait for the upload: an op's time is its own, the wait is the stream's idle. */
        if (!n->capturing)
            rt_backend_input_acquire(n->be, o->input_ticket);
        OP(tl_op, op, input_u8_dev, (s, in, images, o->mean, o->std, n->t[0].data));
        if (!o->labels_dev && !n->capturing) /* else the loss reads the buffer's labels: released after it */
            rt_backend_input_release(n->be, o->input_ticket);
    } else {
        OP(tl_op, op, input_u8, (s, in, images, o->mean, o->std, n->t[0].data));
    }
    if (per_layer)
        rt_timeline_mark(tl, "input", RT_MARK_INPUT);
    for (int i = 0; i < n->nn; i++) {
        node_fwd(n, i, batch, o);
        if (per_layer)
            rt_timeline_mark(tl, n->nd[i].name, RT_MARK_LAYER_FWD);
    }
    int backward = o->mode == RT_TRAIN && o->grad_scale > 0.0f;
    struct tensor *lt = &n->t[n->logits];
    const int32_t *lab = n->labels;
    if (o->input_ticket && o->labels_dev) /* they came with the images, on the copy stream */
        lab = o->labels_dev;
    else
        OP(tl_op, op, upload, (s, n->labels, labels, (size_t)batch * sizeof(int32_t)));
    struct rt_loss_stats *stats_dev = o->stats_dev ? o->stats_dev : n->stats;
    OP(tl_op, op, zero, (s, stats_dev, sizeof(struct rt_loss_stats)));
    OP(tl_op, op, xent_fwd_bwd, (s, batch, n->classes, lt->data, lab, o->label_smoothing, o->grad_scale,
                                 o->loss_scale, stats_dev, backward ? lt->grad : NULL));
    if (o->input_ticket && o->labels_dev && !n->capturing)
        rt_backend_input_release(n->be, o->input_ticket);
    if (tl)
        rt_timeline_mark(tl, "loss", RT_MARK_FORWARD);
    if (backward) {
        for (int i = 0; i < n->nt; i++)
            n->t[i].grad_written = 0;
        lt->grad_written = 1;
        for (int i = n->nn - 1; i >= 0; i--) {
            node_bwd(n, i, batch, o);
            if (per_layer)
                rt_timeline_mark(tl, n->nd[i].name, RT_MARK_LAYER_BWD);
        }
        if (tl)
            rt_timeline_mark(tl, "backward", RT_MARK_BACKWARD);
    }
    if (o->stats_dev)
        return 0; /* the caller reads them later: no host wait */
    struct rt_loss_stats st;
    OP(tl_op, op, download, (s, &st, n->stats, sizeof(st)));
    stats->loss_sum += st.loss_sum;
    stats->correct += st.correct;
    stats->count += st.count;
    return 0;
}

void rt_model_logits(struct rt_model *n, float *host, int batch)
{
    const size_t count = (size_t)batch * (size_t)n->classes;
    if (n->ops->act == RT_F32) {
        n->ops->download(n->s, host, n->t[n->logits].data, count * sizeof(float));
        return;
    }
    /* 16-bit logits: widened on the device, into a buffer kept for it. */
    const uint16_t *bits = (const uint16_t *)n->t[n->logits].data;
    if (n->ops->act == RT_BF16)
        n->ops32->cast_bf16_f32(n->s, count, bits, n->logits32);
    else
        n->ops32->cast_f16_f32(n->s, count, bits, n->logits32);
    n->ops->download(n->s, host, n->logits32, count * sizeof(float));
}

/* 1 if the `count` elements at x (fp32 when `param`, else the activations' type) hold a NaN or Inf. */
static int nonfinite_in(struct rt_model *n, const float *x, size_t count, int param)
{
    float bad = 0.0f;
    float *dev = &n->stats->loss_sum; /* scratch: the loss sums were read already */
    (param ? n->ops32 : n->ops)->count_nonfinite(n->s, count, x, dev);
    n->ops->download(n->s, &bad, dev, sizeof(float));
    return bad != 0.0f;
}

void rt_model_find_nonfinite(struct rt_model *n, char *buf, size_t len)
{
    buf[0] = 0;
    for (int i = 0; i < n->nent; i++) {
        const struct rt_tensor_info *e = &n->ent[i].info;
        if (e->kind == RT_PARAM && nonfinite_in(n, n->params + e->offset, e->count, 1)) {
            snprintf(buf, len, "%s (parameter)", e->name);
            return;
        }
    }
    if (n->last_batch <= 0)
        return;
    /* Run the last batch's forward again, checking each output as it is made;
     * the running statistics are restored so the search changes nothing. */
    size_t bytes = n->buffer_count * sizeof(float);
    float *saved = bytes ? malloc(bytes) : NULL;
    if (saved)
        n->ops->download(n->s, saved, n->buffers, bytes);
    struct rt_step_opts o = {.mode = n->last_mode, .no_dropout = 1};
    if (nonfinite_in(n, n->t[0].data, count_at(&n->t[0], n->last_batch), 0)) {
        snprintf(buf, len, "the normalised input");
    } else {
        for (int i = 0; i < n->nn; i++) {
            node_fwd(n, i, n->last_batch, &o);
            if (nonfinite_in(n, n->t[n->nd[i].out].data, count_at(&n->t[n->nd[i].out], n->last_batch), 0)) {
                snprintf(buf, len, "%s output", n->nd[i].name);
                break;
            }
        }
    }
    if (saved) {
        n->ops->upload(n->s, n->buffers, saved, bytes);
        free(saved);
    }
    if (buf[0])
        return;
    for (int i = 0; i < n->nent; i++) {
        const struct rt_tensor_info *e = &n->ent[i].info;
        if (e->kind == RT_PARAM && !e->frozen && nonfinite_in(n, n->grads + e->offset, e->count, 1)) {
            snprintf(buf, len, "%s gradient", e->name);
            return;
        }
    }
}

const char *rt_model_name(const struct rt_model *n)
{
    return n->name;
}

const struct rt_tensor_info *rt_model_tensors(const struct rt_model *n, int *count)
{
    *count = n->nent;
    return n->tab;
}

enum rt_dtype rt_model_act(const struct rt_model *n)
{
    return n->ops->act;
}

struct rt_backend *rt_model_backend(const struct rt_model *n)
{
    return n->be;
}

int rt_model_node_count(const struct rt_model *n)
{
    return n->nn;
}

size_t rt_model_param_count(const struct rt_model *n)
{
    return n->param_count;
}

size_t rt_model_buffer_count(const struct rt_model *n)
{
    return n->buffer_count;
}

float *rt_model_params(struct rt_model *n)
{
    return n->params;
}

float *rt_model_grads(struct rt_model *n)
{
    return n->grads;
}

float *rt_model_buffers(struct rt_model *n)
{
    return n->buffers;
}

/* The flat buffers are fp32 whatever the activations: cleared and copied with the fp32 table's memory ops. */
void rt_model_zero_grads(struct rt_model *n)
{
    n->ops32->zero(n->s, n->grads, n->trainable_count * sizeof(float));
}

/* Floats [offset, offset + count) of buffer `which`; a range outside it aborts, naming it. */
static float *buf_range(struct rt_model *n, enum rt_model_buf which, size_t offset, size_t count)
{
    static const char *const names[] = {"parameter", "gradient", "buffer"};
    float *base = which == RT_MODEL_PARAMS ? n->params : which == RT_MODEL_GRADS ? n->grads : n->buffers;
    const size_t size = which == RT_MODEL_BUFFERS ? n->buffer_count
                        : which == RT_MODEL_GRADS ? n->trainable_count
                                                  : n->param_count;
    if ((unsigned)which >= RT_ARRAY_LEN(names) || offset > size || count > size - offset) {
        fprintf(stderr, "ringtrain: %zu floats at offset %zu of the model's %s buffer, which holds %zu\n", count,
                offset, (unsigned)which < RT_ARRAY_LEN(names) ? names[which] : "unknown", size);
        abort();
    }
    return base + offset;
}

void rt_model_read(struct rt_model *n, enum rt_model_buf which, size_t offset, size_t count, float *dst)
{
    const float *src = buf_range(n, which, offset, count);
    if (count)
        n->ops32->download(n->s, dst, src, count * sizeof(float));
}

void rt_model_write(struct rt_model *n, enum rt_model_buf which, size_t offset, const float *src, size_t count)
{
    float *dst = buf_range(n, which, offset, count);
    if (count)
        n->ops32->upload(n->s, dst, src, count * sizeof(float));
}

/* The trainable batchnorms' count (they move together); the first batchnorm's when all are frozen; the training
 * steps without batchnorm. */
int64_t rt_model_batches_tracked(const struct rt_model *n)
{
    int first = -1;
    for (int i = 0; i < n->nn; i++) {
        if (n->nd[i].bt < 0)
            continue;
        if (!n->nd[i].frozen)
            return n->tracked[n->nd[i].bt];
        if (first < 0)
            first = n->nd[i].bt;
    }
    return first >= 0 ? n->tracked[first] : n->train_steps;
}

void rt_model_set_batches_tracked(struct rt_model *n, int64_t v)
{
    for (int i = 0; i < n->nent; i++)
        n->tracked[i] = v;
    n->train_steps = v;
}

int64_t rt_model_tracked(const struct rt_model *n, int row)
{
    return row >= 0 && row < n->nent ? n->tracked[row] : 0;
}

void rt_model_set_tracked(struct rt_model *n, int row, int64_t v)
{
    if (row >= 0 && row < n->nent)
        n->tracked[row] = v;
}

size_t rt_model_trainable_count(const struct rt_model *n)
{
    return n->trainable_count;
}

void rt_model_param_split(const struct rt_model *n, uint64_t *trainable, uint64_t *frozen)
{
    int count;
    const struct rt_tensor_info *tab = rt_model_tensors(n, &count);
    *trainable = *frozen = 0;
    for (int i = 0; i < count; i++)
        if (tab[i].kind == RT_PARAM)
            *(tab[i].frozen ? frozen : trainable) += tab[i].count;
}

size_t rt_model_head_count(const struct rt_model *n)
{
    return n->head_count;
}

const char *rt_model_head_name(const struct rt_model *n)
{
    return n->head >= 0 ? n->nd[n->head].name : "";
}
