/*
 * optable_check.h - one engine that compares an op table (struct rt_ops) with
 * the CPU's fp32 table, op by op, over the same inputs: test_cpu_bf16 runs it
 * on the CPU's bf16 table, test_cuda_ops on the CUDA table. Like nccl-tests'
 * common code and its table per collective: the engine holds the inputs, the
 * calls on both tables, the comparison and the report; each test holds a small
 * table (struct oc_table) of which op families run on which shapes and under
 * which tolerance each check is held.
 *
 * Inputs are drawn on the host and rounded to the device table's activation
 * type (oc_round), and the reference gets those rounded values widened, so
 * both tables see the same numbers and a difference is the table's own.
 * Spatial tensors go in and come out through each table's from_nchw/to_nchw
 * (comparisons are in NCHW whatever a table keeps); features and flat buffers
 * through upload/download, as raw 16-bit values for a 16-bit table.
 * Parameters, their gradients and batchnorm statistics are fp32 everywhere.
 *
 * Every check prints one line: op, shapes, the error and tolerance at the
 * element nearest its bound, the tolerance's name, how many values are not
 * bit-identical, ok or FAIL. The engine counts its own failures (it does not
 * share check.h's counters): a test ends with CHECK(oc_failures(ctx) == 0).
 *
 * Not here: what only one table has (a layout rule, a fused op against its
 * unfused ops, casts and optimizers, whole models); the tests keep those.
 */
#ifndef RT_TESTS_OPTABLE_CHECK_H
#define RT_TESTS_OPTABLE_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/common.h"
#include "compute/compute.h"

/* ---- the two sides ---------------------------------------------------------------------------------------- */

enum { OC_REF = 0, OC_DEV = 1 };

/* One table on its backend and stream; all borrowed. */
struct oc_side {
    const char *name;
    struct rt_backend *be;
    const struct rt_ops *ops;
    struct rt_stream *st;
};

/* ---- tolerances ------------------------------------------------------------------------------------------- */

/*
 * What each check compares; a table holds one struct oc_tol per check. A
 * check whose tolerance has no name is not made on that table.
 */
enum oc_check {
    OC_LAYOUT,          /* to_nchw(from_nchw(x)) on each side */
    OC_INPUT,           /* input_u8, input_u8_dev */
    OC_CONV_FWD,
    OC_CONV_BWD_DATA,   /* beta 0 */
    OC_CONV_BWD_DATA_ADD, /* beta 1 */
    OC_CONV_BWD_FILTER, /* dw, dbias (added to) */
    OC_BN_Y,            /* bn_train_fwd's y */
    OC_BN_MEAN,         /* save_mean */
    OC_BN_INVSTD,       /* save_invstd */
    OC_BN_RUNNING_MEAN,
    OC_BN_RUNNING_VAR,
    OC_BN_INFER_Y,
    OC_BN_DX,           /* bn_bwd's dx, beta 0 and 1 */
    OC_BN_DPARAM,       /* dgamma, dbeta (added to) */
    OC_BN_INFER_DX,     /* bn_infer_bwd */
    OC_BN_RELU,         /* the fused ReLU's outputs, where both tables fuse (y, dx, dgamma, dbeta) */
    OC_BN_RELU_INFER_DX,
    OC_MAXPOOL_FWD,
    OC_MAXPOOL_BWD,
    OC_MAXPOOL_HOST_FWD, /* against pool.c's rule on the host */
    OC_MAXPOOL_HOST_BWD,
    OC_AVGPOOL_FWD,
    OC_AVGPOOL_BWD,
    OC_GAP_FWD,
    OC_GAP_BWD,
    OC_FLATTEN_FWD,
    OC_FLATTEN_BWD,     /* beta 0 */
    OC_FLATTEN_BWD_ADD, /* beta 1 */
    OC_LINEAR_FWD,
    OC_LINEAR_BWD_DATA,
    OC_LINEAR_BWD_FILTER,
    OC_RELU,            /* relu_fwd, and relu_bwd with beta 0 */
    OC_RELU_BWD_ADD,    /* relu_bwd with beta 1 */
    OC_GELU,
    OC_ADD,             /* add, scale, add_relu_fwd, add_relu_bwd: one rounding or a select */
    OC_AXPY,
    OC_DROPOUT,         /* values of dropout_fwd and dropout_bwd with beta 0; masks are always exact */
    OC_DROPOUT_BWD_ADD,
    OC_XENT_LOSS,
    OC_XENT_DLOGITS,
    OC_SUMSQ,
    OC_EXACT_COUNT,     /* counts: xent's correct and count, count_nonfinite */
    OC_CHECK_COUNT
};

/* Flag of struct oc_tol: the table's output must be the reference rounded to its type, bit for bit (fp32: the
 * same value; two NaNs agree). */
#define OC_EXACT 1u

/*
 * |dev - ref| <= atol + rtol |ref| + rmax max|ref| (over the tensor)
 *                + (terms + kterms (K + 1)) S + spread sd
 * where S is the element's sum of |terms| (the op run on |inputs| on the
 * reference table, or the channel's sum for batchnorm's parameter
 * gradients), K the number of products in it (another summation order moves
 * a K-term fp32 sum by up to K 2^-24 S), and sd the channel's spread
 * (1 / save_invstd: batchnorm's means). Wherever the reference is NaN or
 * +-Inf the device must be NaN or the same Inf.
 */
struct oc_tol {
    const char *name;
    double atol, rtol, rmax, terms, kterms, spread;
    unsigned flags;
};

/* ---- the cases ---------------------------------------------------------------------------------------------- */

enum oc_family {
    OC_F_LAYOUT, OC_F_INPUT, OC_F_CONV, OC_F_BN, OC_F_POOL, OC_F_FEAT, OC_F_LINEAR, OC_F_ELEM, OC_F_DROPOUT,
    OC_F_XENT, OC_F_REDUCE, OC_F_COUNT
};

/* Inputs of a case: uniform in [lo, hi), and what is planted in them. */
enum oc_vals {
    OC_V_UNIFORM,
    OC_V_TIES,      /* pooling: 0, 0.5, 1, 1.5 (the first maximum must win) */
    OC_V_NANS,      /* pooling: a NaN every 11th element */
    OC_V_RELU_NANS, /* pooling: non-negative, as after a ReLU, a NaN every 37th (the kernels' integer paths) */
    OC_V_CHANNELS,  /* batchnorm: normal, a mean and spread per channel (0/1, 5/3, -20/0.5, 1.5/2) */
};

/*
 * One case of a family: sh the input shape (linear: n = sh.n, in = sh.c; the
 * element-wise ops, reductions: n = sh.n; cross-entropy: (sh.n, sh.c) logits);
 * a..d the family's integers (conv: cout, k, stride, pad; pool: k, stride, pad;
 * linear: out; feat, conv, linear: bias in e; xent: e = 0 forward only);
 * dropout: p, seed, offset, spatial in e; xent: p is the label smoothing.
 */
struct oc_case {
    enum oc_family family;
    struct rt_shape4 sh;
    int a, b, c, d, e;
    float lo, hi;
    enum oc_vals vals;
    float p;
    uint64_t seed, offset;
};

/* A device table's comparison: its name, its tolerance per check, its cases. */
struct oc_table {
    const char *name;
    const struct oc_tol *tol; /* OC_CHECK_COUNT entries */
    const struct oc_case *cases;
    size_t ncases;
};

/* ---- running ------------------------------------------------------------------------------------------------ */

struct oc_ctx {
    struct oc_side side[2]; /* [OC_REF]: the CPU's fp32 table; [OC_DEV]: the table under test */
    struct rt_rng rng;
    const struct oc_tol *tab_tol; /* the running table's */
    int quiet;              /* 1: only failures and the summary are printed */
    int checks, failures;
    char failed[1024];      /* " op op ..." of the failed checks */
};

/* Sets up ctx for ref (the CPU's fp32 table) and dev (the table under test), rng seeded (seed, stream 1). */
void oc_init(struct oc_ctx *ctx, const struct oc_side *ref, const struct oc_side *dev, uint64_t seed);

/*
 * Prints the table (the two sides, the checks and their tolerances, the
 * ops of its families), runs every case whose family is in `families` (a
 * mask of 1u << enum oc_family; ~0u: all) and prints a summary. Returns the
 * failures counted in this call.
 */
int oc_run(struct oc_ctx *ctx, const struct oc_table *t, unsigned families);

static inline int oc_failures(const struct oc_ctx *ctx)
{
    return ctx->failures;
}

/* Elements of an NCHW shape. */
static inline size_t oc_count4(struct rt_shape4 s)
{
    return (size_t)s.n * s.c * s.h * s.w;
}

/* v rounded to the device table's activation type (bf16: round to nearest even; fp32: v). */
float oc_round(const struct oc_ctx *ctx, float v);

/* A float's bits and back. */
static inline uint32_t oc_fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float oc_bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* f rounded to bf16 as the bf16 tables store it (nearest even; NaN stays a quiet NaN, denormals become signed
 * zeros), and a bf16 widened. */
uint16_t oc_bf16(float f);

static inline float oc_bf16_f32(uint16_t h)
{
    return oc_bitsf((uint32_t)h << 16);
}

/* ---- buffers on both sides ---------------------------------------------------------------------------------- */

enum oc_kind {
    OC_SPATIAL, /* activations, logical NCHW, each table's layout and type */
    OC_FEAT,    /* activations, flat, each table's type */
    OC_PARAM,   /* fp32 on both sides */
};

struct oc_buf {
    void *p[2];
    size_t n;
    struct rt_shape4 sh;
    enum oc_kind kind;
};

/* n values (OC_SPATIAL: count of sh) on both sides, zeroed; exits on failure to allocate. */
struct oc_buf oc_new(struct oc_ctx *ctx, enum oc_kind kind, size_t n, struct rt_shape4 sh);
void oc_free(struct oc_ctx *ctx, struct oc_buf *b);
/* host (NCHW for spatial) into both sides, rounded to each side's type; synchronised. */
void oc_put(struct oc_ctx *ctx, struct oc_buf *b, const float *host);
/* n copies of v on both sides. */
void oc_fill(struct oc_ctx *ctx, struct oc_buf *b, float v);
/* Both sides' contents as host floats, widened (NCHW for spatial); synchronised. */
void oc_get(struct oc_ctx *ctx, const struct oc_buf *b, float *ref, float *dev);
/* Host floats in [lo, hi), or normal (mean, sd), rounded with oc_round (tu_hfloats). */
float *oc_random(struct oc_ctx *ctx, size_t n, float lo, float hi);
float *oc_random_normal(struct oc_ctx *ctx, size_t n, float mean, float sd);

/*
 * Compares dev with ref under the table's tolerance for `check` (extra: per
 * element, added to it, or NULL), prints the line, counts a failure. Returns
 * 0 if within, -1 if not; 0 without a line if the table does not make this
 * check.
 */
int oc_compare(struct oc_ctx *ctx, enum oc_check check, const char *op, const char *shape, const float *ref,
               const float *dev, size_t n, const double *extra);
/* oc_get then oc_compare. */
int oc_compare_buf(struct oc_ctx *ctx, enum oc_check check, const char *op, const char *shape, const struct oc_buf *b,
                   const double *extra);
/* oc_compare_buf under tolerance t instead of the table's: for what a test checks outside the op families. */
int oc_compare_tol(struct oc_ctx *ctx, const struct oc_tol *t, const char *op, const char *shape,
                   const struct oc_buf *b);
/* Dropout masks: zeros (dropped elements) at the same positions, exactly; how many ref dropped into *dropped
 * (NULL: not asked). */
void oc_compare_mask(struct oc_ctx *ctx, const char *op, const char *shape, const float *ref, const float *dev,
                     size_t n, size_t *dropped);
/* A line and a failure unless ok (for checks outside the tolerance model: masks, counts against the host). */
int oc_verdict(struct oc_ctx *ctx, int ok, const char *op, const char *shape, const char *detail);

/* ---- planted faults: the engine must catch each ------------------------------------------------------------ */

enum oc_plant {
    OC_PLANT_LAYOUT,   /* conv2d_bwd_data writes dx in NCHW order into the table's layout */
    OC_PLANT_SCALE,    /* xent_fwd_bwd leaves a factor (the loss scale) out of the gradient */
    OC_PLANT_BN_STATS, /* bn_train_fwd does not update the running statistics */
    OC_PLANT_COUNT
};

struct oc_plant_info {
    const char *op, *fault;
    enum oc_family family; /* the op family whose checks must catch it */
};

extern const struct oc_plant_info oc_plants[OC_PLANT_COUNT];

/*
 * `base` with plant p's op wrapped (the wrappers go through base's own
 * layout and memory ops, so they work on any table); loss_scale is the factor
 * OC_PLANT_SCALE leaves out. base must stay valid while the result is used;
 * one planted table at a time.
 */
struct rt_ops oc_plant_table(const struct rt_ops *base, enum oc_plant p, float loss_scale);

/*
 * Plant p in a copy of ctx's device table, the engine run quietly (seeded
 * seed) over t's cases of the planted op's family: 1 if it failed that op
 * (caught), 0 if not; a line says which.
 */
int oc_plant_run(const struct oc_ctx *ctx, const struct oc_table *t, enum oc_plant p, float loss_scale, uint64_t seed);

#endif
