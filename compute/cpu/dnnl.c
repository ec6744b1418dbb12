/*
 * dnnl.c - the CPU backend's convolutions as oneDNN primitives, in fp32 and
 * (for the bf16 table) bf16, and what the backend asks of oneDNN besides:
 * whether the CPU computes bf16 natively.
 *
 * Layouts. Every primitive is created with its memory formats left to the
 * library ("any"), so it picks what its fastest implementation wants. Our
 * tensors are in cpu.h's layout: blocked nChw16c when C is a multiple of 16
 * -- what the AVX-512 convolutions choose, in fp32 and in bf16 -- and
 * (C, N, H, W) otherwise, described to oneDNN by strides. When the choice
 * equals our tensor's format, the primitive reads and writes the tensor in
 * place: in the models every convolution but the first (whose input has 1
 * or 3 channels) does so, and activations stay blocked from layer to layer.
 * When it differs (the input image, odd test shapes, a CPU whose best
 * format is another), a reorder converts into and out of scratch.
 *
 * Weights are PyTorch's (Cout, Cin, kh, kw) fp32 and change every step, so
 * each call reorders them into the primitive's blocked format (and to bf16
 * in the bf16 table: autocast's "weights cast once per call of the layer");
 * the filter gradient is reordered back with a sum post-op, which adds it
 * to dw as the op table requires. Weight tensors are small next to the
 * activations, so this costs a few percent of a convolution at most.
 *
 * Algorithms: Winograd where it measured faster (conv_alg), direct elsewhere;
 * a bf16 convolution may compute in fp32 on widened copies of its tensors
 * (Winograd; the smallest maps' filter gradient), the reorders converting.
 *
 * The primitives of a shape (forward, backward data, backward weights, and
 * their reorders) are created on first use and cached per backend; a step
 * of a model then creates nothing. Scratch -- the primitives' scratchpads
 * (user-managed), reordered weights and activations, a gradient to be added
 * -- is carved from rt_cpu_scratch() per call.
 *
 * oneDNN is built with OpenMP here, so its primitives run on the same team
 * our kernels do, at the backend's thread count (rt_cpu_thread_setup). With
 * a given thread count its convolutions are deterministic, which keeps a
 * resumed run bit-identical.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dnnl.h>

#include "common/common.h"
#include "compute/cpu/cpu.h"

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    switch ((unsigned)isa) {
    case dnnl_cpu_isa_sse41:
        return "SSE4.1";
    case dnnl_cpu_isa_avx:
        return "AVX";
    case dnnl_cpu_isa_avx2:
        return "AVX2";
    case dnnl_cpu_isa_avx2_vnni:
        return "AVX2 with VNNI";
    case dnnl_cpu_isa_avx512_core:
        return "AVX-512";
    case dnnl_cpu_isa_avx512_core_vnni:
        return "AVX-512 with VNNI";
    case dnnl_cpu_isa_avx512_core_bf16:
        return "AVX-512 with AVX512_BF16";
    case dnnl_cpu_isa_avx512_core_amx:
        return "AVX-512 with AMX";
    default:
        return "baseline x86-64";
    }
}

int rt_cpu_bf16_isa(char *why, size_t len)
{
    const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if (((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) == (unsigned)dnnl_cpu_isa_avx512_core_bf16)
        return 1;
    snprintf(why, len,
             "this CPU has neither AVX512_BF16 nor AMX (oneDNN's effective ISA: %s), so bf16 would be emulated, "
             "slower than fp32: use --amp off",
             isa_name(isa));
    return 0;
}

void rt_cpu_dnnl_describe(char *buf, size_t len)
{
    const dnnl_version_t *v = dnnl_version();
    snprintf(buf, len, "oneDNN %d.%d.%d (%s)", v->major, v->minor, v->patch, isa_name(dnnl_get_effective_cpu_isa()));
}

/* An op cannot fail (cpu.h): a oneDNN error here is a bug or exhausted memory, and a half-done op is worse. */
#define DN(call)                                                                                                       \
    do {                                                                                                               \
        dnnl_status_t st_ = (call);                                                                                    \
        if (st_ != dnnl_success)                                                                                       \
            dn_fail(#call, st_, __FILE__, __LINE__);                                                                   \
    } while (0)

static void dn_fail(const char *what, dnnl_status_t st, const char *file, int line)
{
    fprintf(stderr, "ringtrain: oneDNN call failed (status %d) at %s:%d: %s\n", (int)st, file, line, what);
    abort();
}

/* ---- one convolution shape: its primitives and reorders ---------------------------- */

/* A tensor as we hold it and as a primitive wants it; `re` converts ours -> the primitive's (inputs) or back
 * (outputs), NULL when they are the same. */
struct dn_arg {
    dnnl_memory_desc_t ours, prim;
    dnnl_primitive_t re;
    size_t bytes; /* of the primitive's format, when it differs */
};

struct dn_prim {
    dnnl_primitive_t p;
    size_t scratchpad;
    dnnl_memory_desc_t scratch_md;
};

struct conv_key {
    struct rt_conv_desc d;
    int bias;
    dnnl_data_type_t dt;
};

enum conv_dir { CONV_FWD = 0, CONV_BWD_DATA, CONV_BWD_WEIGHTS, CONV_DIRS };

struct conv_entry {
    struct conv_key key;
    dnnl_memory_desc_t bias_md;
    struct dn_prim prim[CONV_DIRS];         /* each created on first use */
    struct dn_arg arg[CONV_DIRS][3];        /* per direction: its two inputs, then its output */
};

/*
 * Winograd F(4x4, 3x3) for fp32 3x3 stride-1 convolutions on blocked tensors: oneDNN's AVX-512 kernels for it
 * (forward, backward data and backward weights) ran 2.2-2.5x the direct kernels' speed in direct-convolution
 * FLOPs (128 channels, 8x8 to 32x32 maps, batch 128, 2 threads, Zen 4), since they do 2.25x fewer multiplies;
 * 1.4-2.4x on 4x4 maps; but at 2x2 half the direct kernels' speed (a 4x4 output tile mostly wasted), so not below
 * 4x4 (resnet18's last two stages on 32x32 images).
 * Its rounding error is a few fp32 ulps larger than direct's; the PyTorch fixtures hold at their tolerances.
 * Where the library has no such kernel (no AVX-512, other shapes) the direct algorithm is used.
 */
static dnnl_alg_kind_t conv_alg(const struct conv_key *k)
{
    const struct rt_conv_desc *c = &k->d;
    if (c->kh != 3 || c->kw != 3 || c->stride != 1 || c->in.c % RT_CPU_BLOCK || c->cout % RT_CPU_BLOCK)
        return dnnl_convolution_direct;
    if (k->dt == dnnl_f32 && c->oh >= 4 && c->ow >= 4)
        return dnnl_convolution_winograd;
    /*
     * bf16 tensors, widened for it (the reorders convert; fp32 Winograd on bf16 inputs, the output rounded once):
     * forward + both backwards measured against the bf16 direct kernels at batch 128: 0.74-0.94x the time with 64
     * in and 128 out channels or more (32x32 down to 4x4 maps), a tie at 64 -> 64, 1.45-1.66x with 16 or 32 in.
     */
    if (k->dt == dnnl_bf16 && c->in.c >= 64 && c->cout >= 128 && c->oh >= 4 && c->ow >= 4)
        return dnnl_convolution_winograd;
    return dnnl_convolution_direct;
}

/* A matmul of rt_cpu_dnnl_matmul: its shape (the key) and primitive. */
struct mm_entry {
    struct {
        int64_t dims[3][4]; /* per operand: rows, cols, rs, cs */
        int bf16[3], bias, accumulate;
    } key;
    dnnl_memory_desc_t md[4]; /* a, b, c, bias */
    dnnl_primitive_t p;
};

struct cpu_dnnl {
    dnnl_engine_t eng;
    dnnl_stream_t st;
    struct conv_entry **conv;
    int nconv, capconv;
    struct mm_entry **mm;
    int nmm, capmm;
};

static struct cpu_dnnl *dn_of(struct rt_backend *be)
{
    if (be->dnnl)
        return be->dnnl;
    struct cpu_dnnl *d = rt_calloc(1, sizeof(*d), "oneDNN state");
    if (!d)
        abort();
    DN(dnnl_engine_create(&d->eng, dnnl_cpu, 0));
    DN(dnnl_stream_create(&d->st, d->eng, dnnl_stream_default_flags));
    be->dnnl = d;
    return d;
}

void rt_cpu_dnnl_release(struct rt_backend *be)
{
    struct cpu_dnnl *d = be->dnnl;
    if (!d)
        return;
    for (int i = 0; i < d->nconv; i++) {
        struct conv_entry *e = d->conv[i];
        for (int k = 0; k < CONV_DIRS; k++) {
            if (e->prim[k].p)
                dnnl_primitive_destroy(e->prim[k].p);
            for (int j = 0; j < 3; j++)
                if (e->arg[k][j].re)
                    dnnl_primitive_destroy(e->arg[k][j].re);
        }
        free(e);
    }
    free(d->conv);
    for (int i = 0; i < d->nmm; i++) {
        dnnl_primitive_destroy(d->mm[i]->p);
        free(d->mm[i]);
    }
    free(d->mm);
    dnnl_stream_destroy(d->st);
    dnnl_engine_destroy(d->eng);
    free(d);
    be->dnnl = NULL;
}

/* Our layout of a spatial tensor (cpu.h) as a oneDNN memory descriptor. */
static void spatial_md(dnnl_memory_desc_t *md, struct rt_shape4 sh, dnnl_data_type_t dt)
{
    const dnnl_dims_t dims = {sh.n, sh.c, sh.h, sh.w};
    if (rt_cpu_blocked(sh)) {
        DN(dnnl_memory_desc_init_by_tag(md, 4, dims, dt, dnnl_nChw16c));
        return;
    }
    const dnnl_dim_t hw = (dnnl_dim_t)sh.h * sh.w;
    const dnnl_dims_t strides = {hw, (dnnl_dim_t)sh.n * hw, sh.w, 1}; /* (C, N, H, W) */
    DN(dnnl_memory_desc_init_by_strides(md, 4, dims, dt, strides));
}

/* A primitive-desc's format for `what`, and the reorder between it and ours (dir: ours -> prim for inputs). With
 * `accumulate`, the reorder adds into its destination (dw += ...). */
static void arg_init(struct cpu_dnnl *d, struct dn_arg *a, const dnnl_memory_desc_t *ours,
                     const dnnl_primitive_desc_t pd, dnnl_query_t what, int input, int accumulate)
{
    a->ours = *ours;
    a->prim = *dnnl_primitive_desc_query_md(pd, what, 0);
    a->re = NULL;
    a->bytes = 0;
    if (dnnl_memory_desc_equal(&a->ours, &a->prim) && !accumulate)
        return;
    a->bytes = dnnl_memory_desc_get_size(&a->prim);
    dnnl_primitive_attr_t attr = NULL;
    if (accumulate) {
        dnnl_post_ops_t po;
        DN(dnnl_primitive_attr_create(&attr));
        DN(dnnl_post_ops_create(&po));
        DN(dnnl_post_ops_append_sum(po, 1.0f));
        DN(dnnl_primitive_attr_set_post_ops(attr, po));
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t rpd;
    const dnnl_memory_desc_t *from = input ? &a->ours : &a->prim, *to = input ? &a->prim : &a->ours;
    DN(dnnl_reorder_primitive_desc_create(&rpd, from, d->eng, to, d->eng, attr));
    DN(dnnl_primitive_create(&a->re, rpd));
    dnnl_primitive_desc_destroy(rpd);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
}

/*
 * The primitive descriptor of direction `dir` of convolution k with algorithm `alg`, its activations computed in
 * `cdt` (which may differ from the tensors': the reorders convert), formats left to the library, scratchpad ours;
 * NULL where the library has no kernel for it. A backward one is hinted by the forward of the same algorithm and
 * types, as oneDNN asks.
 */
static dnnl_primitive_desc_t conv_pd_try(struct cpu_dnnl *d, const struct conv_key *k, enum conv_dir dir,
                                         dnnl_alg_kind_t alg, dnnl_data_type_t cdt)
{
    dnnl_primitive_desc_t hint = NULL, pd = NULL;
    if (dir != CONV_FWD && !(hint = conv_pd_try(d, k, CONV_FWD, alg, cdt)))
        return NULL;
    const struct rt_conv_desc *c = &k->d;
    const dnnl_dims_t sd = {c->in.n, c->in.c, c->in.h, c->in.w}, wd = {c->cout, c->in.c, c->kh, c->kw},
                      dd = {c->in.n, c->cout, c->oh, c->ow}, strides = {c->stride, c->stride}, pad = {c->pad, c->pad};
    dnnl_memory_desc_t src, w, dst;
    DN(dnnl_memory_desc_init_by_tag(&src, 4, sd, cdt, dnnl_format_tag_any));
    /* the filter gradient in fp32 whatever the activations: it is added into the fp32 buffer */
    DN(dnnl_memory_desc_init_by_tag(&w, 4, wd, dir == CONV_BWD_WEIGHTS ? dnnl_f32 : cdt, dnnl_format_tag_any));
    DN(dnnl_memory_desc_init_by_tag(&dst, 4, dd, cdt, dnnl_format_tag_any));
    dnnl_memory_desc_t bmd;
    const dnnl_dims_t bd = {c->cout};
    DN(dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_f32, dnnl_x));
    const dnnl_memory_desc_t *bias = k->bias ? &bmd : NULL;
    dnnl_convolution_desc_t cd;
    if (dir == CONV_FWD)
        DN(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, alg, &src, &w, bias, &dst, strides, pad,
                                              pad));
    else if (dir == CONV_BWD_DATA)
        DN(dnnl_convolution_backward_data_desc_init(&cd, alg, &src, &w, &dst, strides, pad, pad));
    else
        DN(dnnl_convolution_backward_weights_desc_init(&cd, alg, &src, &w, bias, &dst, strides, pad, pad));
    dnnl_primitive_attr_t attr;
    DN(dnnl_primitive_attr_create(&attr));
    DN(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    if (dnnl_primitive_desc_create(&pd, &cd, attr, d->eng, hint) != dnnl_success)
        pd = NULL;
    dnnl_primitive_attr_destroy(attr);
    if (hint)
        dnnl_primitive_desc_destroy(hint);
    return pd;
}

/*
 * Creates direction `dir` of entry e: the algorithm conv_alg chose (Winograd computes in fp32, on widened copies
 * where the tensors are bf16), else direct in the tensors' own type; and the reorders between our tensors and
 * the formats the library chose.
 */
static void conv_ready(struct cpu_dnnl *d, struct conv_entry *e, enum conv_dir dir)
{
    if (e->prim[dir].p)
        return;
    const struct conv_key *k = &e->key;
    const dnnl_alg_kind_t alg = conv_alg(k);
    dnnl_data_type_t cdt = alg == dnnl_convolution_winograd ? dnnl_f32 : k->dt;
    /*
     * oneDNN 2.6's bf16 filter gradient is slow on the smallest maps: at 1x1 and 2x2 outputs (resnet18's last
     * stages on 32x32 images) it ran at 27 % and 55 % of the fp32 kernel's speed (512 channels, batch 128, 2
     * threads, AVX512_BF16). There the bf16 tensors are widened and the fp32 primitive runs: the maps are tiny, so
     * the widening costs little, and the gradient is the same fp32 sum of products of bf16 values.
     */
    if (dir == CONV_BWD_WEIGHTS && k->dt == dnnl_bf16 && k->d.oh * k->d.ow <= 4)
        cdt = dnnl_f32;
    dnnl_primitive_desc_t pd = conv_pd_try(d, k, dir, alg, cdt);
    if (!pd && alg != dnnl_convolution_direct) /* no Winograd kernel for this one */
        pd = conv_pd_try(d, k, dir, dnnl_convolution_direct, k->dt);
    if (!pd)
        dn_fail("dnnl_primitive_desc_create (convolution)", dnnl_unimplemented, __FILE__, __LINE__);

    struct dn_prim *p = &e->prim[dir];
    p->scratch_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    p->scratchpad = dnnl_memory_desc_get_size(&p->scratch_md);
    DN(dnnl_primitive_create(&p->p, pd));

    /* our tensors: x and y in cpu.h's layout, the weights PyTorch's (Cout, Cin, kh, kw) fp32 */
    enum { X, W, Y };
    dnnl_memory_desc_t ours[3];
    spatial_md(&ours[X], k->d.in, k->dt);
    spatial_md(&ours[Y], (struct rt_shape4){k->d.in.n, k->d.cout, k->d.oh, k->d.ow}, k->dt);
    const dnnl_dims_t wd = {k->d.cout, k->d.in.c, k->d.kh, k->d.kw};
    DN(dnnl_memory_desc_init_by_tag(&ours[W], 4, wd, dnnl_f32, dnnl_oihw));
    static const struct {
        int tensor;
        dnnl_query_t q;
    } args[CONV_DIRS][3] = {
        [CONV_FWD] = {{X, dnnl_query_src_md}, {W, dnnl_query_weights_md}, {Y, dnnl_query_dst_md}},
        [CONV_BWD_DATA] = {{Y, dnnl_query_diff_dst_md}, {W, dnnl_query_weights_md}, {X, dnnl_query_diff_src_md}},
        [CONV_BWD_WEIGHTS] = {{X, dnnl_query_src_md}, {Y, dnnl_query_diff_dst_md}, {W, dnnl_query_diff_weights_md}},
    };
    /* the filter gradient's reorder always runs: its sum post-op is what adds it to dw */
    for (int j = 0; j < 3; j++)
        arg_init(d, &e->arg[dir][j], &ours[args[dir][j].tensor], pd, args[dir][j].q, j < 2,
                 dir == CONV_BWD_WEIGHTS && j == 2);
    dnnl_primitive_desc_destroy(pd);
}

/* The array v of n entries of `elem` bytes with room for one more (capacity *cap, doubled when full); aborts when
 * memory is exhausted, as an op cannot fail. */
static void *room_for_one(void *v, int n, int *cap, size_t elem)
{
    if (n < *cap)
        return v;
    *cap = *cap ? 2 * *cap : 16;
    v = rt_realloc(v, (size_t)*cap * elem, "oneDNN primitive cache");
    if (!v)
        abort();
    return v;
}

static struct conv_entry *conv_get(struct cpu_dnnl *d, const struct rt_conv_desc *cd, int bias, dnnl_data_type_t dt)
{
    struct conv_key k;
    memset(&k, 0, sizeof(k));
    k.d = *cd;
    k.bias = bias;
    k.dt = dt;
    for (int i = 0; i < d->nconv; i++)
        if (!memcmp(&d->conv[i]->key, &k, sizeof(k)))
            return d->conv[i];
    struct conv_entry *e = rt_calloc(1, sizeof(*e), "convolution primitives");
    if (!e)
        abort();
    e->key = k;
    const dnnl_dims_t bd = {cd->cout};
    DN(dnnl_memory_desc_init_by_tag(&e->bias_md, 1, bd, dnnl_f32, dnnl_x));
    d->conv = room_for_one(d->conv, d->nconv, &d->capconv, sizeof(*d->conv));
    d->conv[d->nconv++] = e;
    return e;
}

/* ---- execution ------------------------------------------------------------------ */

/* Per-call scratch, carved from rt_cpu_scratch() in 64-byte pieces. */
struct carve {
    size_t need;
    char *base;
};

static size_t carve_add(struct carve *c, size_t bytes)
{
    size_t off = c->need;
    c->need += (bytes + 63) & ~(size_t)63;
    return off;
}

static dnnl_memory_t mem(struct cpu_dnnl *d, const dnnl_memory_desc_t *md, const void *p)
{
    dnnl_memory_t m;
    DN(dnnl_memory_create(&m, md, d->eng, (void *)p));
    return m;
}

/* Runs `p` with n arguments; the memory objects are released after. */
static void run(struct cpu_dnnl *d, dnnl_primitive_t p, int n, dnnl_exec_arg_t *args)
{
    DN(dnnl_primitive_execute(p, d->st, n, args));
    DN(dnnl_stream_wait(d->st));
    for (int i = 0; i < n; i++)
        dnnl_memory_destroy(args[i].memory);
}

static void reorder(struct cpu_dnnl *d, dnnl_primitive_t re, const dnnl_memory_desc_t *from, const void *src,
                    const dnnl_memory_desc_t *to, void *dst)
{
    dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, mem(d, from, src)}, {DNNL_ARG_TO, mem(d, to, dst)}};
    run(d, re, 2, a);
}

/*
 * Runs direction `dir` of the convolution cd on our tensors: inputs in0, in1 (x and w forward, dy and w
 * backward data, x and dy backward weights), the output into `out` (y; dx; dw, added to), each through scratch
 * and its reorder where the library's format is not ours. `bias`: the forward's bias, or the bias gradient the
 * backward weights add to (fp32, or NULL). `beta` 1 (backward data): dx += the gradient, with the activation
 * table's own axpy.
 */
static void conv_exec(struct rt_stream *s, const struct rt_conv_desc *cd, dnnl_data_type_t dt, enum conv_dir dir,
                      const void *in0, const void *in1, void *out, float *bias, float beta)
{
    static const int ids[CONV_DIRS][4] = {
        [CONV_FWD] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS},
        [CONV_BWD_DATA] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC, 0},
        [CONV_BWD_WEIGHTS] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS, DNNL_ARG_DIFF_BIAS},
    };
    struct cpu_dnnl *d = dn_of(s->be);
    struct conv_entry *e = conv_get(d, cd, bias != NULL, dt);
    conv_ready(d, e, dir);
    const struct dn_prim *p = &e->prim[dir];
    const struct dn_arg *a = e->arg[dir];
    const int add = dir == CONV_BWD_DATA && beta != 0.0f;
    const size_t n_out = (size_t)cd->in.n * cd->in.c * cd->in.h * cd->in.w; /* dx's elements */
    struct carve c = {0};
    const size_t o_pad = carve_add(&c, p->scratchpad), o_in0 = carve_add(&c, a[0].bytes),
                 o_in1 = carve_add(&c, a[1].bytes), o_out = carve_add(&c, a[2].bytes),
                 o_sum = carve_add(&c, add ? n_out * (dt == dnnl_f32 ? 4 : 2) : 0),
                 o_db = carve_add(&c, dir == CONV_BWD_WEIGHTS && bias ? (size_t)cd->cout * sizeof(float) : 0);
    c.base = (char *)rt_cpu_scratch(s, c.need);
    const void *ip0 = a[0].re ? c.base + o_in0 : in0, *ip1 = a[1].re ? c.base + o_in1 : in1;
    if (a[0].re)
        reorder(d, a[0].re, &a[0].ours, in0, &a[0].prim, c.base + o_in0);
    if (a[1].re)
        reorder(d, a[1].re, &a[1].ours, in1, &a[1].prim, c.base + o_in1);
    void *target = add ? c.base + o_sum : out; /* where the result lands in our format */
    void *op = a[2].re ? c.base + o_out : target;
    float *db = dir == CONV_BWD_WEIGHTS ? (float *)(void *)(c.base + o_db) : bias;
    dnnl_exec_arg_t args[5] = {{ids[dir][0], mem(d, &a[0].prim, ip0)},
                               {ids[dir][1], mem(d, &a[1].prim, ip1)},
                               {ids[dir][2], mem(d, &a[2].prim, op)},
                               {DNNL_ARG_SCRATCHPAD, mem(d, &p->scratch_md, c.base + o_pad)},
                               {ids[dir][3], bias ? mem(d, &e->bias_md, db) : NULL}};
    run(d, p->p, bias ? 5 : 4, args);
    if (a[2].re)
        reorder(d, a[2].re, &a[2].prim, op, &a[2].ours, target);
    if (add) {
        const struct rt_ops *t = dt == dnnl_f32 ? NULL : rt_backend_ops_for(s->be, RT_BF16);
        /* the kernels themselves, not the (possibly queued) table of the backend: this runs on its stream */
        (t ? t->axpy : rt_cpu_axpy)(s, n_out, 1.0f, (const float *)target, (float *)out);
    }
    if (dir == CONV_BWD_WEIGHTS && bias)
        for (int i = 0; i < cd->cout; i++)
            bias[i] += db[i];
}

static void conv_fwd(struct rt_stream *s, const struct rt_conv_desc *cd, const void *x, const float *w,
                     const float *bias, void *y, dnnl_data_type_t dt)
{
    conv_exec(s, cd, dt, CONV_FWD, x, w, y, (float *)bias /* only read forward */, 0.0f);
}

static void conv_bwd_data(struct rt_stream *s, const struct rt_conv_desc *cd, const void *dy, const float *w,
                          float beta, void *dx, dnnl_data_type_t dt)
{
    conv_exec(s, cd, dt, CONV_BWD_DATA, dy, w, dx, NULL, beta);
}

static void conv_bwd_filter(struct rt_stream *s, const struct rt_conv_desc *cd, const void *x, const void *dy,
                            float *dw, float *dbias, dnnl_data_type_t dt)
{
    conv_exec(s, cd, dt, CONV_BWD_WEIGHTS, x, dy, dw, dbias, 0.0f);
}

/* ---- matrix products (the bf16 linear layers) ------------------------------------ */

void rt_cpu_dnnl_matmul(struct rt_stream *s, const struct rt_cpu_mm_arg *a, const struct rt_cpu_mm_arg *b,
                        const float *bias, const struct rt_cpu_mm_arg *c, int accumulate)
{
    struct cpu_dnnl *d = dn_of(s->be);
    const struct rt_cpu_mm_arg *ops[3] = {a, b, c};
    struct mm_entry k;
    memset(&k, 0, sizeof(k));
    for (int i = 0; i < 3; i++) {
        const int64_t v[4] = {ops[i]->rows, ops[i]->cols, ops[i]->rs, ops[i]->cs};
        memcpy(k.key.dims[i], v, sizeof(v));
        k.key.bf16[i] = ops[i]->bf16;
    }
    k.key.bias = bias != NULL;
    k.key.accumulate = accumulate;
    struct mm_entry *e = NULL;
    for (int i = 0; i < d->nmm && !e; i++)
        if (!memcmp(&d->mm[i]->key, &k.key, sizeof(k.key)))
            e = d->mm[i];
    if (!e) {
        e = rt_calloc(1, sizeof(*e), "matmul primitive");
        if (!e)
            abort();
        e->key = k.key;
        for (int i = 0; i < 3; i++) {
            const dnnl_dims_t dims = {ops[i]->rows, ops[i]->cols}, strides = {ops[i]->rs, ops[i]->cs};
            DN(dnnl_memory_desc_init_by_strides(&e->md[i], 2, dims, ops[i]->bf16 ? dnnl_bf16 : dnnl_f32, strides));
        }
        const dnnl_dims_t bdims = {1, c->cols}, bstrides = {c->cols, 1};
        DN(dnnl_memory_desc_init_by_strides(&e->md[3], 2, bdims, dnnl_f32, bstrides));
        dnnl_matmul_desc_t desc;
        DN(dnnl_matmul_desc_init(&desc, &e->md[0], &e->md[1], bias ? &e->md[3] : NULL, &e->md[2]));
        dnnl_primitive_attr_t attr;
        DN(dnnl_primitive_attr_create(&attr));
        if (accumulate) { /* c += the product: one rounding of the sum */
            dnnl_post_ops_t po;
            DN(dnnl_post_ops_create(&po));
            DN(dnnl_post_ops_append_sum(po, 1.0f));
            DN(dnnl_primitive_attr_set_post_ops(attr, po));
            dnnl_post_ops_destroy(po);
        }
        dnnl_primitive_desc_t pd;
        DN(dnnl_primitive_desc_create(&pd, &desc, attr, d->eng, NULL));
        DN(dnnl_primitive_create(&e->p, pd));
        dnnl_primitive_desc_destroy(pd);
        dnnl_primitive_attr_destroy(attr);
        d->mm = room_for_one(d->mm, d->nmm, &d->capmm, sizeof(*d->mm));
        d->mm[d->nmm++] = e;
    }
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mem(d, &e->md[0], a->p)},
                               {DNNL_ARG_WEIGHTS, mem(d, &e->md[1], b->p)},
                               {DNNL_ARG_DST, mem(d, &e->md[2], c->p)},
                               {DNNL_ARG_BIAS, bias ? mem(d, &e->md[3], bias) : NULL}};
    run(d, e->p, bias ? 4 : 3, args);
}

/* ---- the op table's entries ------------------------------------------------------ */

void rt_cpu_conv2d_fwd(struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *w,
                       const float *bias, float *y)
{
    conv_fwd(s, d, x, w, bias, y, dnnl_f32);
}

void rt_cpu_conv2d_bwd_data(struct rt_stream *s, const struct rt_conv_desc *d, const float *dy, const float *w,
                            float beta, float *dx)
{
    conv_bwd_data(s, d, dy, w, beta, dx, dnnl_f32);
}

void rt_cpu_conv2d_bwd_filter(struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *dy,
                              float *dw, float *dbias)
{
    conv_bwd_filter(s, d, x, dy, dw, dbias, dnnl_f32);
}

static void conv2d_fwd_bf16(struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *w,
                            const float *bias, float *y)
{
    conv_fwd(s, d, x, w, bias, y, dnnl_bf16);
}

static void conv2d_bwd_data_bf16(struct rt_stream *s, const struct rt_conv_desc *d, const float *dy, const float *w,
                                 float beta, float *dx)
{
    conv_bwd_data(s, d, dy, w, beta, dx, dnnl_bf16);
}

static void conv2d_bwd_filter_bf16(struct rt_stream *s, const struct rt_conv_desc *d, const float *x,
                                   const float *dy, float *dw, float *dbias)
{
    conv_bwd_filter(s, d, x, dy, dw, dbias, dnnl_bf16);
}

void rt_cpu_dnnl_fill_bf16(struct rt_ops *t)
{
    t->conv2d_fwd = conv2d_fwd_bf16;
    t->conv2d_bwd_data = conv2d_bwd_data_bf16;
    t->conv2d_bwd_filter = conv2d_bwd_filter_bf16;
}
