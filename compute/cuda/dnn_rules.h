/*
 * dnn_rules.h - the pure parts of the CUDA backend's fast convolutions (dnn_fast.c), written so that a test
 * without a GPU can run them (tests/test_cuda_conv.c --rules): the rule that picks a convolution's algorithm
 * or engine among measured candidates, the bookkeeping of the cache of 16-bit weight copies (which copies a
 * write makes stale), and the index arithmetic of the padded stem (a 16-bit convolution over 1 or 3 input
 * channels computed over 8, the extra channels zero).
 *
 * Plain C with no CUDA header: the index functions are also compiled by nvcc for the kernels of dnn_kern.cu
 * (RT_DNN_HD makes them __host__ __device__ there). Nothing here allocates device memory, calls a library or
 * keeps global state; the cache functions work on the caller's struct only and are not thread-safe (the
 * backend is used from one thread).
 */
#ifndef RT_COMPUTE_CUDA_DNN_RULES_H
#define RT_COMPUTE_CUDA_DNN_RULES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define RT_DNN_HD static inline __host__ __device__
#else
#define RT_DNN_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the choice rule ------------------------------------------------------------------------------------ */

/* One candidate of a convolution (a legacy algorithm with its math type, or an engine configuration of
 * cuDNN's graph API) as the rule sees it. */
struct rt_dnn_cand {
    float ms;              /* measured time per call in ms; negative or NaN: not measured */
    size_t workspace;      /* bytes it needs */
    int ran;               /* 1: it was built and ran in the measurement without an error */
    int deterministic;     /* 1: bitwise reproducible (legacy: CUDNN_DETERMINISTIC; engine: no NONDETERMINISTIC note) */
    int tensor_cores;      /* 1: tensor cores; with fp32 data that is TF32 (legacy: TENSOR_OP math; engine note) */
    int down_convert;      /* 1: the engine narrows its inputs (CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) */
    int reduced;           /* 1: the engine accumulates in less than fp32 (..._REDUCED_PRECISION_REDUCTION) */
};

/* The settings a choice is made under. */
struct rt_dnn_rule {
    int f32;               /* 1: fp32 data (tensor cores then mean TF32); 0: bf16 or fp16 */
    int tf32;              /* rt_backend_opts.tf32: fp32 may use TF32 */
    int nondeterministic;  /* rt_backend_opts.nondeterministic: non-deterministic candidates may win */
    size_t ws_limit;       /* the most workspace a candidate may need, bytes */
};

/* Why a candidate may not win; RT_DNN_OK when it may. */
enum rt_dnn_verdict {
    RT_DNN_OK = 0,
    RT_DNN_NOT_RUN,        /* it did not build or failed in the measurement */
    RT_DNN_NOT_MEASURED,   /* no valid time */
    RT_DNN_WORKSPACE,      /* needs more workspace than the limit */
    RT_DNN_DOWN_CONVERT,   /* narrows its inputs: never taken (as PyTorch filters it) */
    RT_DNN_REDUCED,        /* accumulates below fp32: never taken (fp32 accumulation is promised) */
    RT_DNN_TF32,           /* TF32 on fp32 data without rt_dnn_rule.tf32 */
    RT_DNN_NONDETERMINISTIC, /* not reproducible without rt_dnn_rule.nondeterministic */
};

/* The verdict on candidate c under r. With `timed` 0 the time and `ran` are not judged (the filter before a
 * candidate is built and measured). Pure. */
enum rt_dnn_verdict rt_dnn_judge(const struct rt_dnn_rule *r, const struct rt_dnn_cand *c, int timed);
/* "ok", "did not run", ... for logs. Never NULL. */
const char *rt_dnn_verdict_name(enum rt_dnn_verdict v);
/* The candidate that wins under r: the fastest that rt_dnn_judge(r, c, 1) lets through, a tie going to the
 * one with less workspace, then to the lower index (so the choice does not depend on anything but the
 * list). Returns its index in c[0 .. n), or -1 when none may win. Pure. */
int rt_dnn_choose(const struct rt_dnn_rule *r, const struct rt_dnn_cand *c, int n);

/* ---- the cache of 16-bit weight copies ---------------------------------------------------------------- */

/* A weight copy's layout: the fp32 (K, C, R*S) weights as they are (linear layers: (out, in)), or as
 * (K, R*S, cpad) with channels cpad >= C, the ones >= C zero (cuDNN's NHWC filter layout, padded for a stem). */
enum rt_dnn_wlayout { RT_DNN_W_PLAIN = 0, RT_DNN_W_KRSC = 1 };

struct rt_dnn_wkey {
    const void *src;       /* the fp32 weights (device address) */
    int dt;                /* enum rt_dtype of the copy */
    int layout;            /* enum rt_dnn_wlayout */
    int k, c, rs, cpad;    /* shape; cpad == c unless padded, and == c for RT_DNN_W_PLAIN */
};

struct rt_dnn_wentry {
    struct rt_dnn_wkey key;
    size_t src_bytes;      /* k * c * rs * 4: the fp32 range the copy is made from */
    void *copy;            /* the caller's device copy (NULL until it allocates one) */
    size_t copy_bytes;
    int valid;             /* 0: made from older contents of src (or never made): make again before use */
};

/* The cache: entries in the order they were added, and the span [lo, hi) of every source range, so that a
 * write outside all of them is rejected with two comparisons. Zero-initialised is empty. */
struct rt_dnn_wcache {
    struct rt_dnn_wentry *e;
    int n, cap;
    uintptr_t lo, hi;
};

/* The index of the entry of key k, or -1. */
int rt_dnn_wcache_find(const struct rt_dnn_wcache *w, const struct rt_dnn_wkey *k);
/* Adds an entry for k (not valid, no copy yet); returns its index, or -ENOMEM (the cache is unchanged),
 * -EINVAL for a key with a non-positive dimension or cpad < c. Indices stay valid; pointers into w->e do
 * not survive an add. */
int rt_dnn_wcache_add(struct rt_dnn_wcache *w, const struct rt_dnn_wkey *k);
/* Memory [dst, dst + bytes) was written: every entry whose source range overlaps it becomes not valid.
 * Returns how many entries were valid and now are not. bytes 0 overlaps nothing. */
int rt_dnn_wcache_invalidate(struct rt_dnn_wcache *w, const void *dst, size_t bytes);
/* Every entry becomes not valid (a block of device memory was freed: its size is not known here). */
void rt_dnn_wcache_invalidate_all(struct rt_dnn_wcache *w);
/* Frees the table (not the copies: the caller frees those first). The cache is empty after it. */
void rt_dnn_wcache_fini(struct rt_dnn_wcache *w);

/* ---- the padded stem ------------------------------------------------------------------------------------- */

/* The channel count a 16-bit convolution over c input channels is computed with: c rounded up to a multiple
 * of 8 (the tensor cores' 16-byte rows of 16-bit elements); c itself when c is one already or not positive. */
int rt_dnn_stem_channels(int c);

/* Element i of the padded input (P, cp) (P = N*H*W pixels, NHWC): its source in x (P, c), or -1 for a pad
 * channel (written as zero). */
RT_DNN_HD int64_t rt_dnn_xpad_src(int64_t i, int c, int cp)
{
    const int64_t p = i / cp, ch = i % cp;
    return ch < c ? p * c + ch : -1;
}

/* Element i of the padded 16-bit weights (K, rs, cp): its source in the fp32 weights (K, c, rs), or -1 for
 * a pad channel. */
RT_DNN_HD int64_t rt_dnn_wpad_src(int64_t i, int c, int cp, int rs)
{
    const int64_t k = i / ((int64_t)rs * cp), r = i % ((int64_t)rs * cp), p = r / cp, ch = r % cp;
    return ch < c ? (k * c + ch) * rs + p : -1;
}

/* Element i of the fp32 gradient dw (K, c, rs): where the padded convolution's 16-bit gradient (K, rs, cp)
 * holds it. */
RT_DNN_HD int64_t rt_dnn_dwpad16_src(int64_t i, int c, int cp, int rs)
{
    const int64_t k = i / ((int64_t)c * rs), r = i % ((int64_t)c * rs), ch = r / rs, p = r % rs;
    return (k * rs + p) * cp + ch;
}

/* Element i of the fp32 gradient dw (K, c, rs): where the padded convolution's fp32 gradient (K, cp, rs)
 * holds it. */
RT_DNN_HD int64_t rt_dnn_dwpad32_src(int64_t i, int c, int cp, int rs)
{
    const int64_t k = i / ((int64_t)c * rs), r = i % ((int64_t)c * rs);
    return k * cp * rs + r;
}

#ifdef __cplusplus
}
#endif

#endif
