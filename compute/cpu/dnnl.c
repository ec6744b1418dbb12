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

enum { ARG_OURS = 0, ARG_PRIM = 1 };

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

struct conv_entry {
    struct conv_key key;
    dnnl_primitive_desc_t fwd_pd;
    struct dn_prim fwd, bwd_d, bwd_w; /* bwd_* created on first backward */
    struct dn_arg f_src, f_w, f_dst;  /* forward */
    struct dn_arg d_ddst, d_w, d_dsrc; /* backward data */
    struct dn_arg w_src, w_ddst, w_dw; /* backward weights (w_dw's reorder adds into dw) */
    dnnl_memory_desc_t bias_md;
    dnnl_alg_kind_t alg;  /* Winograd or direct (conv_alg) */
    dnnl_data_type_t cdt; /* the type the primitives compute in: the tensors', or fp32 for Winograd */
    int have_bwd_d, have_bwd_w;
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


struct cpu_dnnl {
    dnnl_engine_t eng;
    dnnl_stream_t st;
    struct conv_entry **conv;
    int nconv, capconv;
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

static void arg_fini(struct dn_arg *a)
{
    if (a->re)
        dnnl_primitive_destroy(a->re);
}

void rt_cpu_dnnl_release(struct rt_backend *be)
{
    struct cpu_dnnl *d = be->dnnl;
    if (!d)
        return;
    for (int i = 0; i < d->nconv; i++) {
        struct conv_entry *e = d->conv[i];
        struct dn_prim *ps[3] = {&e->fwd, &e->bwd_d, &e->bwd_w};
        for (int k = 0; k < 3; k++)
            if (ps[k]->p)
                dnnl_primitive_destroy(ps[k]->p);
        struct dn_arg *as[9] = {&e->f_src, &e->f_w, &e->f_dst, &e->d_ddst, &e->d_w, &e->d_dsrc,
                                &e->w_src, &e->w_ddst, &e->w_dw};
        for (int k = 0; k < 9; k++)
            arg_fini(as[k]);
        dnnl_primitive_desc_destroy(e->fwd_pd);
        free(e);
    }
    free(d->conv);
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

static void prim_init(struct dn_prim *p, dnnl_primitive_desc_t pd)
{
    p->scratch_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    p->scratchpad = dnnl_memory_desc_get_size(&p->scratch_md);
    DN(dnnl_primitive_create(&p->p, pd));
}

static dnnl_primitive_attr_t user_scratchpad(void)
{
    dnnl_primitive_attr_t attr;
    DN(dnnl_primitive_attr_create(&attr));
    DN(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    return attr;
}

/* The plain descriptors of a convolution: src, weights (any), dst, all with formats left to the library. */
struct conv_mds {
    dnnl_memory_desc_t src, w, w32, dst, bias;
    dnnl_dims_t strides, pad;
};

/* The convolution's descriptors with activations of type `dt` (which may differ from the tensors': see
 * conv_need_bwd_weights). */
static void conv_mds_init(struct conv_mds *m, const struct conv_key *k, dnnl_data_type_t dt)
{
    const struct rt_conv_desc *cd = &k->d;
    const dnnl_dims_t sd = {cd->in.n, cd->in.c, cd->in.h, cd->in.w}, wd = {cd->cout, cd->in.c, cd->kh, cd->kw},
                      dd = {cd->in.n, cd->cout, cd->oh, cd->ow}, bd = {cd->cout};
    DN(dnnl_memory_desc_init_by_tag(&m->src, 4, sd, dt, dnnl_format_tag_any));
    DN(dnnl_memory_desc_init_by_tag(&m->w, 4, wd, dt, dnnl_format_tag_any));
    DN(dnnl_memory_desc_init_by_tag(&m->w32, 4, wd, dnnl_f32, dnnl_format_tag_any));
    DN(dnnl_memory_desc_init_by_tag(&m->dst, 4, dd, dt, dnnl_format_tag_any));
    DN(dnnl_memory_desc_init_by_tag(&m->bias, 1, bd, dnnl_f32, dnnl_x));
    m->strides[0] = m->strides[1] = cd->stride;
    m->pad[0] = m->pad[1] = cd->pad;
}

static void conv_ours(const struct conv_key *k, dnnl_memory_desc_t *x, dnnl_memory_desc_t *w,
                      dnnl_memory_desc_t *y)
{
    const struct rt_conv_desc *cd = &k->d;
    spatial_md(x, cd->in, k->dt);
    spatial_md(y, (struct rt_shape4){cd->in.n, cd->cout, cd->oh, cd->ow}, k->dt);
    const dnnl_dims_t wd = {cd->cout, cd->in.c, cd->kh, cd->kw};
    DN(dnnl_memory_desc_init_by_tag(w, 4, wd, dnnl_f32, dnnl_oihw));
}

static struct conv_entry *conv_get(struct rt_stream *s, const struct rt_conv_desc *cd, int bias, dnnl_data_type_t dt)
{
    struct cpu_dnnl *d = dn_of(s->be);
    struct conv_key k;
    memset(&k, 0, sizeof(k));
    k.d.in = cd->in;
    k.d.cout = cd->cout;
    k.d.kh = cd->kh;
    k.d.kw = cd->kw;
    k.d.stride = cd->stride;
    k.d.pad = cd->pad;
    k.d.oh = cd->oh;
    k.d.ow = cd->ow;
    k.bias = bias;
    k.dt = dt;
    for (int i = 0; i < d->nconv; i++)
        if (!memcmp(&d->conv[i]->key, &k, sizeof(k)))
            return d->conv[i];

    struct conv_entry *e = rt_calloc(1, sizeof(*e), "convolution primitives");
    if (!e)
        abort();
    e->key = k;
    struct conv_mds m;
    dnnl_convolution_desc_t cdesc;
    dnnl_primitive_attr_t attr = user_scratchpad();
    e->alg = conv_alg(&k);
    for (;;) {
        e->cdt = e->alg == dnnl_convolution_winograd ? dnnl_f32 : k.dt;
        conv_mds_init(&m, &k, e->cdt);
        e->bias_md = m.bias;
        DN(dnnl_convolution_forward_desc_init(&cdesc, dnnl_forward_training, e->alg, &m.src, &m.w,
                                              bias ? &m.bias : NULL, &m.dst, m.strides, m.pad, m.pad));
        const dnnl_status_t st = dnnl_primitive_desc_create(&e->fwd_pd, &cdesc, attr, d->eng, NULL);
        if (st == dnnl_success)
            break;
        if (e->alg == dnnl_convolution_direct)
            dn_fail("dnnl_primitive_desc_create (convolution forward)", st, __FILE__, __LINE__);
        e->alg = dnnl_convolution_direct; /* no Winograd kernel for this one */
    }
    dnnl_primitive_attr_destroy(attr);
    prim_init(&e->fwd, e->fwd_pd);
    dnnl_memory_desc_t x, w, y;
    conv_ours(&k, &x, &w, &y);
    arg_init(d, &e->f_src, &x, e->fwd_pd, dnnl_query_src_md, 1, 0);
    arg_init(d, &e->f_w, &w, e->fwd_pd, dnnl_query_weights_md, 1, 0);
    arg_init(d, &e->f_dst, &y, e->fwd_pd, dnnl_query_dst_md, 0, 0);

    if (d->nconv == d->capconv) {
        int cap = d->capconv ? 2 * d->capconv : 16;
        struct conv_entry **n = realloc(d->conv, (size_t)cap * sizeof(*n));
        if (!n)
            abort();
        d->conv = n;
        d->capconv = cap;
    }
    d->conv[d->nconv++] = e;
    return e;
}

static void conv_need_bwd_data(struct rt_stream *s, struct conv_entry *e)
{
    if (e->have_bwd_d)
        return;
    struct cpu_dnnl *d = dn_of(s->be);
    struct conv_mds m;
    conv_mds_init(&m, &e->key, e->cdt);
    dnnl_convolution_desc_t cdesc;
    dnnl_primitive_attr_t attr = user_scratchpad();
    dnnl_primitive_desc_t pd;
    DN(dnnl_convolution_backward_data_desc_init(&cdesc, e->alg, &m.src, &m.w, &m.dst, m.strides, m.pad, m.pad));
    if (dnnl_primitive_desc_create(&pd, &cdesc, attr, d->eng, e->fwd_pd) != dnnl_success) {
        /* no Winograd kernel for this direction: direct, in the tensors' type */
        conv_mds_init(&m, &e->key, e->key.dt);
        DN(dnnl_convolution_backward_data_desc_init(&cdesc, dnnl_convolution_direct, &m.src, &m.w, &m.dst,
                                                    m.strides, m.pad, m.pad));
        DN(dnnl_primitive_desc_create(&pd, &cdesc, attr, d->eng, e->alg == dnnl_convolution_direct ? e->fwd_pd : NULL));
    }
    dnnl_primitive_attr_destroy(attr);
    prim_init(&e->bwd_d, pd);
    dnnl_memory_desc_t x, w, y;
    conv_ours(&e->key, &x, &w, &y);
    arg_init(d, &e->d_ddst, &y, pd, dnnl_query_diff_dst_md, 1, 0);
    arg_init(d, &e->d_w, &w, pd, dnnl_query_weights_md, 1, 0);
    arg_init(d, &e->d_dsrc, &x, pd, dnnl_query_diff_src_md, 0, 0);
    dnnl_primitive_desc_destroy(pd);
    e->have_bwd_d = 1;
}

static void conv_need_bwd_weights(struct rt_stream *s, struct conv_entry *e)
{
    if (e->have_bwd_w)
        return;
    struct cpu_dnnl *d = dn_of(s->be);
    /*
     * oneDNN 2.6's bf16 filter gradient is slow on the smallest maps: at 1x1 and 2x2 outputs (resnet18's last
     * stages on 32x32 images) it ran at 27 % and 55 % of the fp32 kernel's speed (512 channels, batch 128, 2
     * threads, AVX512_BF16). There the bf16 tensors are widened (the reorders of arg_init convert) and the fp32
     * primitive runs: the maps are tiny, so the widening costs little, and the gradient is the same fp32 sum of
     * products of bf16 values.
     */
    const dnnl_data_type_t cdt = e->key.dt == dnnl_bf16 && e->key.d.oh * e->key.d.ow <= 4 ? dnnl_f32 : e->cdt;
    struct conv_mds m;
    conv_mds_init(&m, &e->key, cdt);
    dnnl_convolution_desc_t cdesc;
    /* Filter (and bias) gradients in fp32 whatever the activations are: they are added into the fp32 buffer. */
    const dnnl_alg_kind_t alg = cdt == e->cdt ? e->alg : dnnl_convolution_direct;
    DN(dnnl_convolution_backward_weights_desc_init(&cdesc, alg, &m.src, &m.w32, e->key.bias ? &m.bias : NULL, &m.dst,
                                                   m.strides, m.pad, m.pad));
    dnnl_primitive_attr_t attr = user_scratchpad();
    dnnl_primitive_desc_t pd, hint = e->fwd_pd;
    if (alg == dnnl_convolution_winograd && dnnl_primitive_desc_create(&pd, &cdesc, attr, d->eng, hint) == dnnl_success)
        goto created;
    if (alg == dnnl_convolution_winograd) { /* no Winograd kernel for this direction: direct, in the tensors' type */
        conv_mds_init(&m, &e->key, e->key.dt);
        DN(dnnl_convolution_backward_weights_desc_init(&cdesc, dnnl_convolution_direct, &m.src, &m.w32,
                                                       e->key.bias ? &m.bias : NULL, &m.dst, m.strides, m.pad, m.pad));
    }
    if (alg == dnnl_convolution_winograd || cdt != e->cdt) { /* the hint must be a direct forward of the same types */
        dnnl_convolution_desc_t fdesc;
        DN(dnnl_convolution_forward_desc_init(&fdesc, dnnl_forward_training, dnnl_convolution_direct, &m.src, &m.w,
                                              e->key.bias ? &m.bias : NULL, &m.dst, m.strides, m.pad, m.pad));
        DN(dnnl_primitive_desc_create(&hint, &fdesc, NULL, d->eng, NULL));
    }
    DN(dnnl_primitive_desc_create(&pd, &cdesc, attr, d->eng, hint));
    if (hint != e->fwd_pd)
        dnnl_primitive_desc_destroy(hint);
created:
    dnnl_primitive_attr_destroy(attr);
    prim_init(&e->bwd_w, pd);
    dnnl_memory_desc_t x, w, y;
    conv_ours(&e->key, &x, &w, &y);
    arg_init(d, &e->w_src, &x, pd, dnnl_query_src_md, 1, 0);
    arg_init(d, &e->w_ddst, &y, pd, dnnl_query_diff_dst_md, 1, 0);
    arg_init(d, &e->w_dw, &w, pd, dnnl_query_diff_weights_md, 0, 1);
    dnnl_primitive_desc_destroy(pd);
    e->have_bwd_w = 1;
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

/* Where input `a` is in the primitive's format: `p` itself, or scratch at `off` after a reorder. */
static const void *in_arg(struct cpu_dnnl *d, const struct dn_arg *a, const void *p, char *at)
{
    if (!a->re)
        return p;
    reorder(d, a->re, &a->ours, p, &a->prim, at);
    return at;
}

static size_t act_size(struct rt_shape4 sh, dnnl_data_type_t dt)
{
    return (size_t)sh.n * (size_t)sh.c * (size_t)sh.h * (size_t)sh.w * (dt == dnnl_f32 ? 4u : 2u);
}

static void conv_fwd(struct rt_stream *s, const struct rt_conv_desc *cd, const void *x, const float *w,
                     const float *bias, void *y, dnnl_data_type_t dt)
{
    struct conv_entry *e = conv_get(s, cd, bias != NULL, dt);
    struct cpu_dnnl *d = s->be->dnnl;
    struct carve c = {0};
    const size_t o_pad = carve_add(&c, e->fwd.scratchpad), o_x = carve_add(&c, e->f_src.bytes),
                 o_w = carve_add(&c, e->f_w.bytes), o_y = carve_add(&c, e->f_dst.bytes);
    c.base = (char *)rt_cpu_scratch(s, c.need);
    const void *xp = in_arg(d, &e->f_src, x, c.base + o_x);
    const void *wp = in_arg(d, &e->f_w, w, c.base + o_w);
    void *yp = e->f_dst.re ? c.base + o_y : y;
    dnnl_exec_arg_t a[5] = {{DNNL_ARG_SRC, mem(d, &e->f_src.prim, xp)},
                            {DNNL_ARG_WEIGHTS, mem(d, &e->f_w.prim, wp)},
                            {DNNL_ARG_DST, mem(d, &e->f_dst.prim, yp)},
                            {DNNL_ARG_SCRATCHPAD, mem(d, &e->fwd.scratch_md, c.base + o_pad)},
                            {DNNL_ARG_BIAS, bias ? mem(d, &e->bias_md, bias) : NULL}};
    run(d, e->fwd.p, bias ? 5 : 4, a);
    if (e->f_dst.re)
        reorder(d, e->f_dst.re, &e->f_dst.prim, yp, &e->f_dst.ours, y);
}

/* dx += t, both n elements of type dt (bf16: rounded as the bf16 table rounds). */
static void add_into(void *dx, const void *t, size_t n, dnnl_data_type_t dt, int threads)
{
    if (dt == dnnl_f32) {
        float *restrict a = dx;
        const float *restrict b = t;
#pragma omp parallel for schedule(static) num_threads(threads) if (n > ((size_t)1 << 15))
        for (size_t i = 0; i < n; i++)
            a[i] += b[i];
        return;
    }
    uint16_t *restrict a = dx;
    const uint16_t *restrict b = t;
#pragma omp parallel for schedule(static) num_threads(threads) if (n > ((size_t)1 << 15))
    for (size_t i = 0; i < n; i++)
        a[i] = rt_cpu_f32_to_bf16(rt_cpu_bf16_to_f32(a[i]) + rt_cpu_bf16_to_f32(b[i]));
}

static void conv_bwd_data(struct rt_stream *s, const struct rt_conv_desc *cd, const void *dy, const float *w,
                          float beta, void *dx, dnnl_data_type_t dt)
{
    struct conv_entry *e = conv_get(s, cd, 0, dt);
    conv_need_bwd_data(s, e);
    struct cpu_dnnl *d = s->be->dnnl;
    const int add = beta != 0.0f;
    struct carve c = {0};
    const size_t o_pad = carve_add(&c, e->bwd_d.scratchpad), o_dy = carve_add(&c, e->d_ddst.bytes),
                 o_w = carve_add(&c, e->d_w.bytes), o_dx = carve_add(&c, e->d_dsrc.bytes),
                 o_sum = carve_add(&c, add ? act_size(cd->in, dt) : 0);
    c.base = (char *)rt_cpu_scratch(s, c.need);
    const void *dyp = in_arg(d, &e->d_ddst, dy, c.base + o_dy);
    const void *wp = in_arg(d, &e->d_w, w, c.base + o_w);
    /* the gradient lands in ours (or a copy in ours' format when it is to be added) */
    void *out = add ? c.base + o_sum : dx;
    void *dxp = e->d_dsrc.re ? c.base + o_dx : out;
    dnnl_exec_arg_t a[4] = {{DNNL_ARG_DIFF_DST, mem(d, &e->d_ddst.prim, dyp)},
                            {DNNL_ARG_WEIGHTS, mem(d, &e->d_w.prim, wp)},
                            {DNNL_ARG_DIFF_SRC, mem(d, &e->d_dsrc.prim, dxp)},
                            {DNNL_ARG_SCRATCHPAD, mem(d, &e->bwd_d.scratch_md, c.base + o_pad)}};
    run(d, e->bwd_d.p, 4, a);
    if (e->d_dsrc.re)
        reorder(d, e->d_dsrc.re, &e->d_dsrc.prim, dxp, &e->d_dsrc.ours, out);
    if (add)
        add_into(dx, out, act_size(cd->in, dt) / (dt == dnnl_f32 ? 4 : 2), dt, s->be->threads);
}

static void conv_bwd_filter(struct rt_stream *s, const struct rt_conv_desc *cd, const void *x, const void *dy,
                            float *dw, float *dbias, dnnl_data_type_t dt)
{
    struct conv_entry *e = conv_get(s, cd, dbias != NULL, dt);
    conv_need_bwd_weights(s, e);
    struct cpu_dnnl *d = s->be->dnnl;
    struct carve c = {0};
    const size_t o_pad = carve_add(&c, e->bwd_w.scratchpad), o_x = carve_add(&c, e->w_src.bytes),
                 o_dy = carve_add(&c, e->w_ddst.bytes), o_dw = carve_add(&c, e->w_dw.bytes),
                 o_db = carve_add(&c, dbias ? (size_t)cd->cout * sizeof(float) : 0);
    c.base = (char *)rt_cpu_scratch(s, c.need);
    const void *xp = in_arg(d, &e->w_src, x, c.base + o_x);
    const void *dyp = in_arg(d, &e->w_ddst, dy, c.base + o_dy);
    float *db = (float *)(void *)(c.base + o_db);
    dnnl_exec_arg_t a[5] = {{DNNL_ARG_SRC, mem(d, &e->w_src.prim, xp)},
                            {DNNL_ARG_DIFF_DST, mem(d, &e->w_ddst.prim, dyp)},
                            {DNNL_ARG_DIFF_WEIGHTS, mem(d, &e->w_dw.prim, c.base + o_dw)},
                            {DNNL_ARG_SCRATCHPAD, mem(d, &e->bwd_w.scratch_md, c.base + o_pad)},
                            {DNNL_ARG_DIFF_BIAS, dbias ? mem(d, &e->bias_md, db) : NULL}};
    run(d, e->bwd_w.p, dbias ? 5 : 4, a);
    /* dw += the gradient, back in PyTorch's layout (the reorder's sum post-op) */
    reorder(d, e->w_dw.re, &e->w_dw.prim, c.base + o_dw, &e->w_dw.ours, dw);
    if (dbias)
        for (int i = 0; i < cd->cout; i++)
            dbias[i] += db[i];
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
