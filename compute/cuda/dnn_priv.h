/*
 * dnn_priv.h - what the CUDA backend's convolution files share, private to them (dnn.c, dnn_fast.c,
 * dnn_graph.c, dnn_kern.cu) and to tests/test_cuda_conv.c:
 *
 *   dnn.c        the reference convolutions (cuDNN's legacy API, the fastest deterministic algorithm Find
 *                measures, no TF32, 16-bit weights cast on every call) and the pieces of it the fast path
 *                reuses: the legacy descriptors, Find, the names of the legacy algorithms;
 *   dnn_fast.c   the fast tables' convolutions and 16-bit linear layers: per shape, every legacy algorithm
 *                and every engine of cuDNN's graph API measured once, the fastest the rules allow kept with
 *                its descriptors or plan; 16-bit weights cast once per update; padded stems;
 *   dnn_graph.c  cuDNN's backend ("graph") API for one convolution: operation graph, engine configurations
 *                from the heuristics, execution plans, execution;
 *   dnn_kern.cu  the small kernels of the padded stem;
 *   dnn_rules.c  the pure rules (dnn_rules.h).
 *
 * Directions are numbered as enum rt_conv_dir: 0 forward, 1 backward data, 2 backward filter.
 */
#ifndef RT_COMPUTE_CUDA_DNN_PRIV_H
#define RT_COMPUTE_CUDA_DNN_PRIV_H

#include "compute/cuda/cuda_be.h"
#include "compute/cuda/dnn_rules.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Upper bound of a convolution's workspace: beyond this the faster algorithms (FFT, Winograd) buy little and
 * memory is better left to activations. */
#define DNN_WORKSPACE_CAP ((size_t)1 << 30)

/* More than any cuDNN 9 direction has legacy algorithms (8, 6, 7); the count asked for is clamped to it. */
#define DNN_MAX_ALGOS 32

enum { DIR_FWD = 0, DIR_BWD_DATA = 1, DIR_BWD_FILTER = 2 };

/* The element type and layout of a call's activations (dnn.c's TY_F32, TY_BF16, TY_F16). */
struct dnn_type {
    enum rt_dtype dt;
    cudnnDataType_t data;
    cudnnTensorFormat_t fmt;
    cudnnMathType_t math;
    size_t esz;
};
/* The type of activations dt; never NULL for RT_F32, RT_BF16, RT_F16. */
const struct dnn_type *rt_dnn_type_of(enum rt_dtype dt);

/* ---- dnn.c: legacy descriptors, Find, the reference entry points ---- */

struct conv_descs {
    cudnnTensorDescriptor_t x, y, b; /* b: (1, Cout, 1, 1), or NULL when there is no bias */
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
};

/* One measured legacy candidate, the fields the three cuDNN perf structs share. */
struct dnn_perf {
    int algo;
    cudnnStatus_t status;
    float time;             /* ms, as Find measured it */
    size_t memory;
    cudnnDeterminism_t determinism;
    cudnnMathType_t math;
};

/* Creates the legacy descriptors of (d, ty): x, y in ty's layout, w in the matching filter layout, the
 * convolution (cross-correlation, fp32 compute, ty->math), and b when with_bias. Aborts on a cuDNN error. */
void rt_dnn_descs_make(const struct rt_conv_desc *d, int with_bias, const struct dnn_type *ty,
                       struct conv_descs *o);
void rt_dnn_descs_free(struct conv_descs *o);
/* Workspace of legacy algorithm `algo` of direction dir (not checked: "not supported" is an answer). */
cudnnStatus_t rt_dnn_ws_size(struct rt_cuda *c, const struct conv_descs *dd, int dir, int algo, size_t *bytes);
/* How many legacy algorithms direction dir has. */
int rt_dnn_algo_count(int dir);
/* cudnnFind*AlgorithmEx of direction dir on the stream (it waits for its runs): in0/in1 the inputs in the
 * order of the direction's call (x, w / w, dy / x, dy), out a buffer the candidates may overwrite. Fills r[]
 * fastest first; returns how many, 0 when cuDNN refuses the search as not supported; aborts on other errors. */
int rt_dnn_find(struct rt_cuda *c, const struct conv_descs *dd, int dir, const void *in0, const void *in1,
                void *out, void *ws, size_t ws_bytes, struct dnn_perf r[DNN_MAX_ALGOS]);
/* 1 when st says "not supported" (CUDNN_STATUS_NOT_SUPPORTED or a sub-code of it). */
int rt_dnn_unsupported(cudnnStatus_t st);
/* "convolution forward of N=128 Cin=64 32x32 -> Cout=128 3x3 stride 2 pad 1 in fp16 NHWC", for messages. */
void rt_dnn_describe(const struct rt_conv_desc *d, int dir, const struct dnn_type *ty, char *buf, size_t len);
/* "IMPLICIT_PRECOMP_GEMM" etc.; "?" out of range. */
const char *rt_dnn_legacy_name(int dir, int algo);
/* The reference tables' convolutions for activations of type dt (the fp32 ones are rt_cuda_conv2d_*): the
 * fast path hands a call to them when none of its candidates may run it. */
void rt_dnn_ref_fwd(struct rt_stream *s, const struct rt_conv_desc *d, enum rt_dtype dt, const float *x,
                    const float *w, const float *bias, float *y);
void rt_dnn_ref_bwd_data(struct rt_stream *s, const struct rt_conv_desc *d, enum rt_dtype dt, const float *dy,
                         const float *w, float beta, float *dx);
void rt_dnn_ref_bwd_filter(struct rt_stream *s, const struct rt_conv_desc *d, enum rt_dtype dt, const float *x,
                           const float *dy, float *dw, float *dbias);
/* The 16-bit linear layers' products (n > 0) with wl, the 16-bit copy of the weights (out, in): y = x wl^T (+ b),
 * dx = beta dx + dy wl, on cuBLAS with fp32 compute. */
void rt_dnn_linear16_fwd(struct rt_stream *s, enum rt_dtype dt, int n, int in, int out, const void *x,
                         const void *wl, const float *b, void *y);
void rt_dnn_linear16_bwd_data(struct rt_stream *s, enum rt_dtype dt, int n, int in, int out, const void *dy,
                              const void *wl, float beta, void *dx);

/* ---- dnn_graph.c: the backend API for one convolution ---- */

/* What one graph computes: direction dir of d, with these element types and layouts, y = alpha * op + beta
 * * y (y being dx for backward data and dw for backward filter). The uids in the variant pack are 'x', 'w',
 * 'y' for (x or dx), (w or dw), (y or dy), as PyTorch names them. */
struct rt_dnn_gspec {
    struct rt_conv_desc d;
    int dir;
    cudnnDataType_t xdt, wdt, ydt;
    int x_nhwc, w_krsc, y_nhwc; /* 1: NHWC activations / (K, R, S, C) filter; 0: NCHW / (K, C, R, S) */
    float alpha, beta;
};

/* An engine configuration as the heuristics listed it. */
struct rt_dnn_cfg_info {
    int64_t engine;        /* CUDNN_ATTR_ENGINE_GLOBAL_INDEX */
    int deterministic, tensor_cores, down_convert, reduced, winograd, fft;
    int runtime_compiled;  /* CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION: finalizing it compiles kernels */
    int fallback;          /* 1: from CUDNN_HEUR_MODE_FALLBACK, 0: from CUDNN_HEUR_MODE_A */
    char knobs[72];        /* "2=5 14=3": knob type = value, as far as it fits */
};

struct rt_dnn_graph; /* tensors, convolution, operation and graph descriptors, and the configs listed */
struct rt_dnn_plan;  /* a finalized execution plan of one config, owning that config, and its variant packs */

/* Builds and finalizes the graph of spec g. h may be NULL (the graph is then made without a handle, which
 * cuDNN allows for everything but heuristics on some versions and execution: the --rules test). Returns 0,
 * or -EIO with why (len bytes) naming the descriptor and attribute that failed and cuDNN's status. */
int rt_dnn_graph_create(cudnnHandle_t h, const struct rt_dnn_gspec *g, struct rt_dnn_graph **out, char *why,
                        size_t len);
/* NULL is fine. Destroys the configs still held (not the plans made from them). */
void rt_dnn_graph_destroy(struct rt_dnn_graph *g);
/* The engines cuDNN's heuristics give for the graph: up to max_a from CUDNN_HEUR_MODE_A, then up to max_fb
 * from CUDNN_HEUR_MODE_FALLBACK not already listed (same engine and knobs). Returns how many (0 ... ), or
 * -EIO with why when the heuristics themselves failed (configs listed before the failure are kept). */
int rt_dnn_graph_list(struct rt_dnn_graph *g, int max_a, int max_fb, char *why, size_t len);
int rt_dnn_graph_count(const struct rt_dnn_graph *g);
const struct rt_dnn_cfg_info *rt_dnn_graph_info(const struct rt_dnn_graph *g, int i);
/* Finalizes the plan of config i (the plan takes the config over). Returns 0 with the plan, or -EIO with why. */
int rt_dnn_plan_make(cudnnHandle_t h, struct rt_dnn_graph *g, int i, struct rt_dnn_plan **out, char *why,
                     size_t len);
void rt_dnn_plan_destroy(struct rt_dnn_plan *p); /* NULL is fine */
size_t rt_dnn_plan_workspace(const struct rt_dnn_plan *p);
/* Enqueues the plan on the handle's stream with x, w, y (as in struct rt_dnn_gspec) and workspace ws (at least
 * rt_dnn_plan_workspace bytes; NULL when that is 0). The variant pack is made once per set of pointers (the
 * last few are kept). Returns cuDNN's status, unchecked: the measurement skips a candidate that fails, a call
 * checks it. */
cudnnStatus_t rt_dnn_plan_run(cudnnHandle_t h, struct rt_dnn_plan *p, void *x, void *w, void *y, void *ws);

/* ---- dnn_kern.cu: the padded stem ---- */

/* xp (P, cp) = x (P, c) with zero channels c .. cp-1, 16-bit type dt, NHWC (P = N*H*W). */
void rt_dnn_pad_x(struct rt_stream *s, enum rt_dtype dt, int64_t pixels, int c, int cp, const void *x, void *xp);
/* out (K, rs, cp) 16-bit = w (K, c, rs) fp32, zero channels c .. cp-1 (cp == c: rt_cuda_h_weights' KRSC cast). */
void rt_dnn_weights_pad(struct rt_stream *s, enum rt_dtype dt, int k, int c, int cp, int rs, const float *w,
                        void *out);
/* dw (K, c, rs) fp32 += g (K, rs, cp) 16-bit, channels < c. */
void rt_dnn_dw_acc_pad16(struct rt_stream *s, enum rt_dtype dt, int k, int c, int cp, int rs, const void *g,
                         float *dw);
/* dw (K, c, rs) fp32 += g (K, cp, rs) fp32, channels < c. */
void rt_dnn_dw_acc_pad32(struct rt_stream *s, int k, int c, int cp, int rs, const float *g, float *dw);

/* ---- dnn_fast.c ---- */

/* Frees the fast path's state (plans, descriptors, weight copies) on backend destruction; NULL state is fine. */
void rt_dnn_fast_release(struct rt_cuda *c);

/* What the fast path did so far, for tests and logs: counts since the backend was created. */
struct rt_dnn_stats {
    int keys;              /* shapes measured (each direction, type, setting and beta its own) */
    int graphs, graph_fail;     /* operation graphs built, and failed to build or list */
    int plans, plan_fail;       /* execution plans finalized, and failed to */
    int engines_timed, legacy_timed;
    int engine_wins, legacy_wins, ref_falls; /* what the keys chose; ref: no candidate allowed */
    int fp32_dw_wins;      /* 16-bit weight gradients written straight into fp32 */
    int stems_padded, stems_unpadded;
    int weight_casts;      /* 16-bit weight copies made (first use or after a write) */
    int graph_on;          /* RINGTRAIN_CUDNN_GRAPH: 1 unless it is 0 */
};
void rt_dnn_fast_stats(const struct rt_cuda *c, struct rt_dnn_stats *out);

#ifdef __cplusplus
}
#endif

#endif
