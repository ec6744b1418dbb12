/*
 * dnn.c - convolutions through cuDNN's legacy convolution API and the linear
 * layer through cuBLAS, for the CUDA backend. Semantics are those of
 * compute.h and the CPU reference (cpu/conv.c, rt_cpu_linear_* in
 * cpu/pool.c); spatial tensors are packed NCHW, features (N, F) row-major.
 *
 * These are the reference tables' convolutions and linear layers, the proven
 * way back (RINGTRAIN_CUDA_KERNELS=reference), and the fp32 linear layers of
 * every table. The fast tables' convolutions and 16-bit linear layers are
 * dnn_fast.c's (every legacy algorithm and graph-API engine measured, TF32
 * and non-deterministic algorithms as the backend's options allow, 16-bit
 * weights cast once per update, padded stems); they use the descriptors,
 * Find and the reference entries below through dnn_priv.h, and hand a call
 * back to these entries when none of their candidates may run it.
 *
 * Choices, and why:
 *  - fp32 math only, CUDNN_FMA_MATH on every convolution descriptor. The
 *    default math type lets cuDNN use TF32 tensor cores on Ampere and later,
 *    which keeps only 10 mantissa bits of the inputs: results would drift
 *    from the CPU backend by far more than summation order explains. The
 *    linear layer relies on the backend having left the cuBLAS handle in
 *    CUBLAS_DEFAULT_MATH (no TF32) and in host pointer mode.
 *  - The algorithm of each (shape, direction) is chosen once, by measurement
 *    (cudnnFind*AlgorithmEx), and kept in struct rt_cuda's `algos` cache;
 *    later calls look it up and only enqueue. The shape includes the batch
 *    size, so a smaller last micro-batch is measured once more. Heuristics
 *    (cudnnGet*_v7) are a guess from the shape alone; a measurement costs
 *    a few runs of each candidate, once, during the first step. The search
 *    is the one place these ops block the host: Find times the candidates,
 *    so it waits for them.
 *  - Among the measured algorithms the fastest deterministic one wins (one
 *    that sums with atomics, such as backward filter ALGO_0/ALGO_3, only
 *    when no deterministic one ran): the same inputs then give the same
 *    bits, as on the CPU backend. Results that used tensor cores are never
 *    taken.
 *  - The search's workspace is bounded by what the device can spare: at most
 *    half of the free memory (after the search's own scratch output), never
 *    more than DNN_WORKSPACE_CAP, but at least what the backend's workspace
 *    already holds, since that memory is ours anyway. So an algorithm that
 *    needs gigabytes of workspace is never chosen, and the chosen one's
 *    workspace (rt_cuda_workspace, grown on demand) stays below the cap.
 *  - Find runs the convolutions on real buffers. Forward writes y, which the
 *    real call overwrites right after, so it uses y itself. Backward data
 *    and backward filter would destroy outputs that accumulate (dx with
 *    beta 1, dw always), so their search writes a scratch output allocated
 *    with cudaMallocAsync on the stream and freed right after (stream
 *    ordered: nothing waits on it). The search's workspace is the backend's
 *    when that is already large enough, otherwise another such temporary,
 *    so the search does not leave the backend workspace grown to the largest
 *    candidate's size.
 *  - Descriptors are created per call and destroyed before returning (a
 *    descriptor is host memory only; an enqueued call does not refer to
 *    it). struct rt_cuda_algo has no room for them, and creating and
 *    setting five is a little host work that overlaps the asynchronous GPU
 *    work of the ops before.
 *  - Bias terms: forward adds the bias with cudnnAddTensor (a (1, C, 1, 1)
 *    tensor broadcast over N, H, W); the bias gradients, of convolutions and
 *    of the linear layer, are cudnnConvolutionBackwardBias (the sum over N,
 *    H, W). Features (N, F) row-major are exactly an NCHW tensor (N, F, 1,
 *    1), so the linear layer reuses both and needs no ones vector.
 *
 * Accumulation (compute.h): conv and linear bwd_data store beta * dx + the
 * result (beta 0 does not read dx); weight and bias gradients are always
 * added to. Everything is issued on the stream the backend bound the cuDNN
 * and cuBLAS handles to, rt_cuda_stream(s); nothing here synchronises the
 * device except the one-time search. Errors abort through the check macros.
 *
 * Mixed precision (the 16-bit tables, rt_backend_ops_for): the same
 * entry points with activations in bf16 or fp16, NHWC, and fp32 weights.
 * Each call casts its weights into a 16-bit scratch copy (KRSC for the
 * convolutions: cuDNN's NHWC filter layout), as autocast casts a weight
 * on every forward; convolutions accumulate in fp32 (cuDNN's pseudo-half
 * and pseudo-bf16 configurations) with CUDNN_TENSOR_OP_MATH, and the
 * algorithm search takes tensor-core algorithms; the weight gradient is
 * computed into a 16-bit scratch and added into the fp32 gradient by
 * nhwc16.cu, and bias terms use nhwc16.cu's kernels. The linear layers are
 * cublasGemmEx with 16-bit operands, fp32 compute, and fp32 output for the
 * weight gradient, which is added to directly.
 *
 * When cuDNN has no algorithm at all for a 16-bit convolution (a stem
 * convolution over 1 or 3 input channels in NHWC, say), that layer runs in
 * fp32: its tensors are converted to fp32 NCHW on the GPU, the fp32 entry
 * point computes it, and the result is converted back with the op's
 * semantics (conv16_*_in_f32). The decision is taken once per (shape,
 * direction, type), when the algorithm would be searched, kept in the
 * algorithm cache (rt_cuda_algo.in_f32), and announced once per layer shape
 * and direction. An fp32 convolution cuDNN does not support, and one whose
 * every supported algorithm needs more workspace than the search may take,
 * are two different failures, each named as such with the layer's shape,
 * direction, type and layout (and the sizes, for the second).
 *
 * This file does not check shapes (the model did, through
 * rt_conv_desc_init), does no dilation, groups, or padding other than
 * square symmetric, and fuses nothing.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compute/cuda/dnn_priv.h"

static const char *const dir_name[3] = {"forward", "backward data", "backward filter"};

static const struct dnn_type TY_F32 = {RT_F32, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, CUDNN_FMA_MATH, 4};
static const struct dnn_type TY_BF16 = {RT_BF16, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_NHWC, CUDNN_TENSOR_OP_MATH, 2};
static const struct dnn_type TY_F16 = {RT_F16, CUDNN_DATA_HALF, CUDNN_TENSOR_NHWC, CUDNN_TENSOR_OP_MATH, 2};

const struct dnn_type *rt_dnn_type_of(enum rt_dtype dt)
{
    return dt == RT_BF16 ? &TY_BF16 : dt == RT_F16 ? &TY_F16 : &TY_F32;
}

/* ---- descriptors ------------------------------------------------------- */

void rt_dnn_descs_make(const struct rt_conv_desc *d, int with_bias, const struct dnn_type *ty,
                       struct conv_descs *o)
{
    memset(o, 0, sizeof(*o));
    RT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&o->x));
    RT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(o->x, ty->fmt, ty->data, d->in.n, d->in.c, d->in.h, d->in.w));
    RT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&o->y));
    RT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(o->y, ty->fmt, ty->data, d->in.n, d->cout, d->oh, d->ow));
    if (with_bias) { /* fp32 only: the 16-bit calls add biases with nhwc16.cu's kernels */
        RT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&o->b));
        RT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(o->b, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, d->cout, 1, 1));
    }
    RT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&o->w));
    RT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(o->w, ty->data, ty->fmt, d->cout, d->in.c, d->kh, d->kw));
    RT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&o->conv));
    /* PyTorch's conv2d is a cross-correlation (the kernel is not flipped). */
    RT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(o->conv, d->pad, d->pad, d->stride, d->stride, 1, 1,
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    /* fp32: no TF32 (see the top of the file); 16-bit: tensor cores, fp32 accumulation. */
    RT_CUDNN_CHECK(cudnnSetConvolutionMathType(o->conv, ty->math));
}

void rt_dnn_descs_free(struct conv_descs *o)
{
    RT_CUDNN_CHECK(cudnnDestroyConvolutionDescriptor(o->conv));
    RT_CUDNN_CHECK(cudnnDestroyFilterDescriptor(o->w));
    if (o->b)
        RT_CUDNN_CHECK(cudnnDestroyTensorDescriptor(o->b));
    RT_CUDNN_CHECK(cudnnDestroyTensorDescriptor(o->y));
    RT_CUDNN_CHECK(cudnnDestroyTensorDescriptor(o->x));
}

/* Features (n, f) row-major as the NCHW tensor (n, f, 1, 1), and a per-feature vector (1, f, 1, 1). */
static void feat_descs_make(int n, int f, cudnnTensorDescriptor_t *rows, cudnnTensorDescriptor_t *vec)
{
    RT_CUDNN_CHECK(cudnnCreateTensorDescriptor(rows));
    RT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(*rows, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, f, 1, 1));
    RT_CUDNN_CHECK(cudnnCreateTensorDescriptor(vec));
    RT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(*vec, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, f, 1, 1));
}

static void feat_descs_free(cudnnTensorDescriptor_t rows, cudnnTensorDescriptor_t vec)
{
    RT_CUDNN_CHECK(cudnnDestroyTensorDescriptor(vec));
    RT_CUDNN_CHECK(cudnnDestroyTensorDescriptor(rows));
}

/* ---- algorithm search and cache ---------------------------------------- */

static int conv_same(const struct rt_conv_desc *a, const struct rt_conv_desc *b)
{
    return a->in.n == b->in.n && a->in.c == b->in.c && a->in.h == b->in.h && a->in.w == b->in.w &&
           a->cout == b->cout && a->kh == b->kh && a->kw == b->kw && a->stride == b->stride && a->pad == b->pad &&
           a->oh == b->oh && a->ow == b->ow;
}

/* Not checked: an algorithm that does not support the shape says so here, and is skipped. */
cudnnStatus_t rt_dnn_ws_size(struct rt_cuda *c, const struct conv_descs *dd, int dir, int algo, size_t *bytes)
{
    *bytes = 0;
    switch (dir) {
    case DIR_FWD:
        return cudnnGetConvolutionForwardWorkspaceSize(c->dnn, dd->x, dd->w, dd->conv, dd->y,
                                                       (cudnnConvolutionFwdAlgo_t)algo, bytes);
    case DIR_BWD_DATA:
        return cudnnGetConvolutionBackwardDataWorkspaceSize(c->dnn, dd->w, dd->y, dd->conv, dd->x,
                                                            (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
    default:
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(c->dnn, dd->x, dd->y, dd->conv, dd->w,
                                                              (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
    }
}

int rt_dnn_algo_count(int dir)
{
    switch (dir) {
    case DIR_FWD:
        return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    case DIR_BWD_DATA:
        return CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    default:
        return CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
    }
}

/* Copies the fields of a cuDNN perf array (any direction: same members) into r[]. */
#define DNN_PERF_COPY(src, n, r)                                                                                     \
    do {                                                                                                             \
        for (int i_ = 0; i_ < (n); i_++)                                                                             \
            (r)[i_] = (struct dnn_perf){.algo = (int)(src)[i_].algo,                                                 \
                                        .status = (src)[i_].status,                                                  \
                                        .time = (src)[i_].time,                                                      \
                                        .memory = (src)[i_].memory,                                                  \
                                        .determinism = (src)[i_].determinism,                                        \
                                        .math = (src)[i_].mathType};                                                 \
    } while (0)

/* 1 when cuDNN says a configuration is not supported (CUDNN_STATUS_NOT_SUPPORTED or one of its
 * sub-codes, 3001 ... 3999: cuDNN 9 numbers a status's category in thousands), as opposed to failing. */
int rt_dnn_unsupported(cudnnStatus_t st)
{
    return (int)st / 1000 * 1000 == (int)CUDNN_STATUS_NOT_SUPPORTED;
}

/* Checks a search call: "not supported" is an answer (0 candidates), anything else but success aborts. */
static int find_checked(cudnnStatus_t st, int got, const char *call, int line)
{
    if (rt_dnn_unsupported(st))
        return 0;
    if (st != CUDNN_STATUS_SUCCESS)
        rt_cuda_fail("cuDNN", (int)st, cudnnGetErrorString(st), call, __FILE__, line);
    return got;
}

/*
 * Runs cuDNN's measurement of direction `dir` on the stream: in0/in1 are the
 * inputs in the order of the direction's call (x, w / w, dy / x, dy), out a
 * buffer the candidates may overwrite. Fills r[] sorted fastest first, as
 * cuDNN returns them; returns how many, 0 when cuDNN refuses the search as a
 * whole as not supported.
 */
int rt_dnn_find(struct rt_cuda *c, const struct conv_descs *dd, int dir, const void *in0, const void *in1,
                void *out, void *ws, size_t ws_bytes, struct dnn_perf r[DNN_MAX_ALGOS])
{
    int max = 0, got = 0;
    switch (dir) {
    case DIR_FWD: {
        cudnnConvolutionFwdAlgoPerf_t p[DNN_MAX_ALGOS];
        RT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(c->dnn, &max));
        max = max < 1 ? 1 : max > DNN_MAX_ALGOS ? DNN_MAX_ALGOS : max;
        const cudnnStatus_t st = cudnnFindConvolutionForwardAlgorithmEx(c->dnn, dd->x, in0, dd->w, in1, dd->conv,
                                                                        dd->y, out, max, &got, p, ws, ws_bytes);
        got = find_checked(st, got, "cudnnFindConvolutionForwardAlgorithmEx", __LINE__);
        DNN_PERF_COPY(p, got, r);
        break;
    }
    case DIR_BWD_DATA: {
        cudnnConvolutionBwdDataAlgoPerf_t p[DNN_MAX_ALGOS];
        RT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(c->dnn, &max));
        max = max < 1 ? 1 : max > DNN_MAX_ALGOS ? DNN_MAX_ALGOS : max;
        const cudnnStatus_t st = cudnnFindConvolutionBackwardDataAlgorithmEx(c->dnn, dd->w, in0, dd->y, in1,
                                                                             dd->conv, dd->x, out, max, &got, p, ws,
                                                                             ws_bytes);
        got = find_checked(st, got, "cudnnFindConvolutionBackwardDataAlgorithmEx", __LINE__);
        DNN_PERF_COPY(p, got, r);
        break;
    }
    default: {
        cudnnConvolutionBwdFilterAlgoPerf_t p[DNN_MAX_ALGOS];
        RT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(c->dnn, &max));
        max = max < 1 ? 1 : max > DNN_MAX_ALGOS ? DNN_MAX_ALGOS : max;
        const cudnnStatus_t st = cudnnFindConvolutionBackwardFilterAlgorithmEx(c->dnn, dd->x, in0, dd->y, in1,
                                                                               dd->conv, dd->w, out, max, &got, p,
                                                                               ws, ws_bytes);
        got = find_checked(st, got, "cudnnFindConvolutionBackwardFilterAlgorithmEx", __LINE__);
        DNN_PERF_COPY(p, got, r);
        break;
    }
    }
    return got;
}

/* "convolution forward of N=128 Cin=64 32x32 -> Cout=128 3x3 stride 2 pad 1 in fp16 NHWC" for messages. */
void rt_dnn_describe(const struct rt_conv_desc *d, int dir, const struct dnn_type *ty, char *buf, size_t len)
{
    snprintf(buf, len, "convolution %s of N=%d Cin=%d %dx%d -> Cout=%d %dx%d stride %d pad %d in %s %s",
             dir_name[dir], d->in.n, d->in.c, d->in.h, d->in.w, d->cout, d->kh, d->kw, d->stride, d->pad,
             rt_dtype_name(ty->dt), ty->fmt == CUDNN_TENSOR_NHWC ? "NHWC" : "NCHW");
}

/*
 * No cuDNN algorithm supports (d, dir) in ty (`why` says how that showed):
 * with 16-bit activations the decision to run the layer in fp32 (cached by
 * conv_algo); in fp32 there is nothing to fall back to, and the process
 * aborts naming the layer.
 */
static struct rt_cuda_algo conv_unsupported(const struct rt_conv_desc *d, int dir, const struct dnn_type *ty,
                                            const char *why)
{
    if (ty->dt != RT_F32)
        return (struct rt_cuda_algo){.d = *d, .dir = dir, .dt = (int)ty->dt, .in_f32 = 1};
    char what[256], msg[256];
    rt_dnn_describe(d, dir, ty, what, sizeof(what));
    snprintf(msg, sizeof(msg), "no cuDNN algorithm supports this convolution (%s)", why);
    rt_cuda_fail("cuDNN", (int)CUDNN_STATUS_NOT_SUPPORTED, msg, what, __FILE__, __LINE__);
}

/* Every algorithm that supports (d, dir) needs more workspace than the search may take (`limit`, from
 * `free_b` of device memory free): abort with the sizes. */
static _Noreturn void conv_fail_workspace(const struct rt_conv_desc *d, int dir, const struct dnn_type *ty,
                                          size_t least, size_t limit, size_t free_b)
{
    char what[256], msg[400];
    rt_dnn_describe(d, dir, ty, what, sizeof(what));
    snprintf(msg, sizeof(msg), "every cuDNN algorithm that supports this convolution needs more workspace than can "
                               "be allocated: the least needs %.1f MB, at most %.1f MB can be spared (%.1f MB of "
                               "device memory free; a convolution takes at most half of it, never more than %.0f MB)",
             (double)least / 1048576.0, (double)limit / 1048576.0, (double)free_b / 1048576.0,
             (double)DNN_WORKSPACE_CAP / 1048576.0);
    rt_cuda_fail("cuDNN", (int)CUDNN_STATUS_NOT_SUPPORTED, msg, what, __FILE__, __LINE__);
}

/*
 * Measures the algorithms of (d, dir) and returns the chosen one (see the top
 * of the file for the rules). Blocks until the measurement is done.
 */
static struct rt_cuda_algo conv_search(struct rt_stream *s, const struct rt_conv_desc *d, int dir,
                                       const struct dnn_type *ty, const struct conv_descs *dd, const void *in0,
                                       const void *in1, void *out)
{
    struct rt_cuda *c = rt_cuda_of(s);
    cudaStream_t st = rt_cuda_stream(s);

    /* Backward outputs accumulate: the candidates write a scratch copy (dx or dw) instead. */
    size_t out_bytes = 0;
    if (dir == DIR_BWD_DATA)
        out_bytes = (size_t)d->in.n * d->in.c * d->in.h * d->in.w * ty->esz;
    else if (dir == DIR_BWD_FILTER)
        out_bytes = (size_t)d->cout * d->in.c * d->kh * d->kw * ty->esz;

    size_t free_b = 0, total_b = 0;
    RT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    size_t limit = free_b > out_bytes ? (free_b - out_bytes) / 2 : 0;
    if (limit > DNN_WORKSPACE_CAP)
        limit = DNN_WORKSPACE_CAP;
    const size_t held = c->workspace_bytes < DNN_WORKSPACE_CAP ? c->workspace_bytes : DNN_WORKSPACE_CAP;
    if (limit < held)
        limit = held;

    /* Which algorithms take this configuration at all (their workspace query succeeds), the least workspace
     * any of them needs, and the search's workspace: the most a candidate within the limit needs (Find skips
     * the rest). No supported algorithm and none within the limit are two different failures. A query that
     * fails otherwise than "not supported" decides nothing: the measurement below has the last word. */
    int supported = 0, fit = 0, unclear = 0;
    size_t need = 0, least = SIZE_MAX;
    for (int a = 0; a < rt_dnn_algo_count(dir); a++) {
        size_t sz;
        const cudnnStatus_t q = rt_dnn_ws_size(c, dd, dir, a, &sz);
        if (q != CUDNN_STATUS_SUCCESS) {
            unclear += !rt_dnn_unsupported(q);
            continue;
        }
        supported++;
        least = sz < least ? sz : least;
        if (sz <= limit) {
            fit++;
            need = sz > need ? sz : need;
        }
    }
    if (supported == 0 && !unclear)
        return conv_unsupported(d, dir, ty, "every algorithm's workspace query says so");
    if (supported > 0 && fit == 0)
        conv_fail_workspace(d, dir, ty, least, limit, free_b);
    void *ws = NULL, *tmp_ws = NULL, *tmp_out = NULL;
    if (need > 0) {
        if (need <= c->workspace_bytes) {
            ws = rt_cuda_workspace(s, need);
        } else {
            RT_CUDA_CHECK(cudaMallocAsync(&tmp_ws, need, st));
            ws = tmp_ws;
        }
    }
    if (out_bytes > 0) {
        RT_CUDA_CHECK(cudaMallocAsync(&tmp_out, out_bytes, st));
        out = tmp_out;
    }

    struct dnn_perf r[DNN_MAX_ALGOS];
    const int got = rt_dnn_find(c, dd, dir, in0, in1, out, ws, need, r);

    /* Stream ordered after the candidates' kernels: no wait. */
    if (tmp_out)
        RT_CUDA_CHECK(cudaFreeAsync(tmp_out, st));
    if (tmp_ws)
        RT_CUDA_CHECK(cudaFreeAsync(tmp_ws, st));

    /* Fastest deterministic candidate that ran (fp32: without tensor cores); failing that, the fastest that ran. */
    int pick = -1;
    for (int pass = 0; pass < 2 && pick < 0; pass++) {
        for (int i = 0; i < got; i++) {
            if (r[i].status != CUDNN_STATUS_SUCCESS || r[i].memory > need)
                continue;
            if (ty->dt == RT_F32 &&
                (r[i].math == CUDNN_TENSOR_OP_MATH || r[i].math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
                continue;
            if (pass == 0 && r[i].determinism != CUDNN_DETERMINISTIC)
                continue;
            pick = i;
            break;
        }
    }
    if (pick < 0) {
        /* Why none: every candidate said "not supported" (or the search as a whole did), one ran but needed
         * more workspace than it was given, only tensor-core algorithms ran for fp32, or they failed. */
        int ran = 0, too_big = 0;
        size_t least_ran = SIZE_MAX;
        cudnnStatus_t failed = CUDNN_STATUS_SUCCESS;
        for (int i = 0; i < got; i++) {
            if (r[i].status == CUDNN_STATUS_SUCCESS) {
                ran++;
                too_big += r[i].memory > need;
                least_ran = r[i].memory < least_ran ? r[i].memory : least_ran;
            } else if (!rt_dnn_unsupported(r[i].status) && failed == CUDNN_STATUS_SUCCESS) {
                failed = r[i].status;
            }
        }
        if (ran == 0 && failed == CUDNN_STATUS_SUCCESS)
            return conv_unsupported(d, dir, ty, "the measurement found no candidate that runs it");
        if (too_big == ran && ran > 0)
            conv_fail_workspace(d, dir, ty, least_ran, limit, free_b);
        char what[256], msg[320];
        rt_dnn_describe(d, dir, ty, what, sizeof(what));
        if (ran)
            snprintf(msg, sizeof(msg), "only tensor-core (TF32) algorithms ran, which fp32 here never takes");
        else
            snprintf(msg, sizeof(msg), "every algorithm that supports it failed in the measurement, the first with "
                                       "%s",
                     cudnnGetErrorString(failed));
        rt_cuda_fail("cuDNN", (int)(ran ? CUDNN_STATUS_NOT_SUPPORTED : failed), msg, what, __FILE__, __LINE__);
    }

    struct rt_cuda_algo e = {.d = *d, .dir = dir, .dt = (int)ty->dt, .algo = r[pick].algo, .workspace = r[pick].memory,
                             .ms = r[pick].time, .candidates = got,
                             .deterministic = r[pick].determinism == CUDNN_DETERMINISTIC,
                             .tensor_cores = r[pick].math == CUDNN_TENSOR_OP_MATH ||
                                             r[pick].math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION};
    /* The execution call is checked against the Get*WorkspaceSize figure; never hand it less. */
    size_t sz;
    if (rt_dnn_ws_size(c, dd, dir, e.algo, &sz) == CUDNN_STATUS_SUCCESS && sz > e.workspace)
        e.workspace = sz;
    return e;
}

/* The cached choice for (d, dir, dt), or NULL before the first call. */
static const struct rt_cuda_algo *conv_cached(const struct rt_cuda *c, const struct rt_conv_desc *d, int dir,
                                              enum rt_dtype dt)
{
    for (int i = 0; i < c->nalgos; i++)
        if (c->algos[i].dir == dir && c->algos[i].dt == (int)dt && conv_same(&c->algos[i].d, d))
            return &c->algos[i];
    return NULL;
}

/* 1 when a layer of this shape (any batch size), direction and type was already found to need fp32. */
static int conv_in_f32_before(const struct rt_cuda *c, const struct rt_conv_desc *d, int dir, enum rt_dtype dt)
{
    for (int i = 0; i < c->nalgos; i++) {
        struct rt_conv_desc o = c->algos[i].d;
        o.in.n = d->in.n;
        if (c->algos[i].in_f32 && c->algos[i].dir == dir && c->algos[i].dt == (int)dt && conv_same(&o, d))
            return 1;
    }
    return 0;
}

/*
 * The algorithm for (d, dir): from the cache, or measured now and added to
 * it. in0/in1/out as for conv_find; out is written only for the forward
 * direction (backward searches use a scratch output). With 16-bit
 * activations the entry may say in_f32 instead: the call runs in fp32
 * (conv16_*_in_f32); that is noted once per layer shape and direction.
 */
static struct rt_cuda_algo conv_algo(struct rt_stream *s, const struct rt_conv_desc *d, int dir,
                                     const struct dnn_type *ty, const struct conv_descs *dd, const void *in0,
                                     const void *in1, void *out)
{
    struct rt_cuda *c = rt_cuda_of(s);
    const struct rt_cuda_algo *known = conv_cached(c, d, dir, ty->dt);
    if (known)
        return *known;
    const struct rt_cuda_algo e = conv_search(s, d, dir, ty, dd, in0, in1, out);
    if (e.in_f32 && !conv_in_f32_before(c, d, dir, ty->dt)) {
        char what[256];
        rt_dnn_describe(d, dir, ty, what, sizeof(what));
        rt_log(RT_LOG_INFO, "%s: no cuDNN algorithm supports it; this layer runs in fp32 NCHW instead (its tensors "
                            "converted on the GPU)",
               what);
    }
    if (c->nalgos == c->cap_algos) {
        const int cap = c->cap_algos ? 2 * c->cap_algos : 16;
        struct rt_cuda_algo *p = realloc(c->algos, (size_t)cap * sizeof(*p));
        if (!p)
            rt_cuda_fail("libc", ENOMEM, strerror(ENOMEM), "growing the convolution algorithm cache", __FILE__,
                         __LINE__);
        c->algos = p;
        c->cap_algos = cap;
    }
    c->algos[c->nalgos++] = e;
    return e;
}

/* 1 when (d, dir) in ty was found to need fp32 (an earlier call decided it): the caller goes straight to
 * the fp32 path, without the 16-bit weights or descriptors. */
static int conv_runs_in_f32(struct rt_stream *s, const struct rt_conv_desc *d, int dir, const struct dnn_type *ty)
{
    const struct rt_cuda_algo *known = ty->dt == RT_F32 ? NULL : conv_cached(rt_cuda_of(s), d, dir, ty->dt);
    return known && known->in_f32;
}

/* The backend workspace for an algorithm, or NULL when it needs none. */
static void *conv_workspace(struct rt_stream *s, const struct rt_cuda_algo *a)
{
    return a->workspace ? rt_cuda_workspace(s, a->workspace) : NULL;
}

/* ---- convolution ------------------------------------------------------- */

/* The 16-bit copy of a convolution's fp32 weights, KRSC, in the backend's weight scratch. */
static void *conv_weights16(struct rt_stream *s, const struct rt_conv_desc *d, const struct dnn_type *ty,
                            const float *w)
{
    const size_t count = (size_t)d->cout * d->in.c * d->kh * d->kw;
    void *wl = rt_cuda_scratch(s, RT_CUDA_SCRATCH_W, count * ty->esz);
    rt_cuda_h_weights(s, ty->dt, d->cout, d->in.c, d->kh * d->kw, 1, w, wl);
    return wl;
}

/*
 * The 16-bit calls no cuDNN algorithm supports (a stem convolution of 1 or 3
 * channels in NHWC, say) run as the fp32 table's convolution: the 16-bit
 * NHWC tensors are converted to fp32 NCHW in the backend's X32/Y32 scratch
 * (exact), the fp32 call computes with the fp32 weights and biases, and the
 * output is rounded once into the 16-bit NHWC tensor with the op's
 * semantics: y overwritten, dx = beta * dx + result, dw and db added to (the
 * fp32 call adds into them directly). All on the stream, nothing waits.
 */
static float *conv_f32_scratch(struct rt_stream *s, int slot, struct rt_shape4 sh)
{
    return (float *)rt_cuda_scratch(s, slot, (size_t)sh.n * sh.c * sh.h * sh.w * sizeof(float));
}

static struct rt_shape4 conv_out_shape(const struct rt_conv_desc *d)
{
    return (struct rt_shape4){d->in.n, d->cout, d->oh, d->ow};
}

static void conv16_fwd_in_f32(struct rt_stream *s, const struct rt_conv_desc *d, const struct dnn_type *ty,
                              const void *x, const float *w, const float *bias, void *y)
{
    const struct rt_shape4 ysh = conv_out_shape(d);
    float *x32 = conv_f32_scratch(s, RT_CUDA_SCRATCH_X32, d->in);
    float *y32 = conv_f32_scratch(s, RT_CUDA_SCRATCH_Y32, ysh);
    rt_cuda_h_to_f32(s, ty->dt, d->in, x, x32);
    rt_cuda_conv2d_fwd(s, d, x32, w, bias, y32);
    rt_cuda_h_from_f32(s, ty->dt, ysh, y32, 0.0f, y);
}

static void conv16_bwd_data_in_f32(struct rt_stream *s, const struct rt_conv_desc *d, const struct dnn_type *ty,
                                   const void *dy, const float *w, float beta, void *dx)
{
    const struct rt_shape4 ysh = conv_out_shape(d);
    float *dy32 = conv_f32_scratch(s, RT_CUDA_SCRATCH_Y32, ysh);
    float *dx32 = conv_f32_scratch(s, RT_CUDA_SCRATCH_X32, d->in);
    rt_cuda_h_to_f32(s, ty->dt, ysh, dy, dy32);
    rt_cuda_conv2d_bwd_data(s, d, dy32, w, 0.0f, dx32);
    rt_cuda_h_from_f32(s, ty->dt, d->in, dx32, beta, dx);
}

static void conv16_bwd_filter_in_f32(struct rt_stream *s, const struct rt_conv_desc *d, const struct dnn_type *ty,
                                     const void *x, const void *dy, float *dw, float *dbias)
{
    const struct rt_shape4 ysh = conv_out_shape(d);
    float *x32 = conv_f32_scratch(s, RT_CUDA_SCRATCH_X32, d->in);
    float *dy32 = conv_f32_scratch(s, RT_CUDA_SCRATCH_Y32, ysh);
    rt_cuda_h_to_f32(s, ty->dt, d->in, x, x32);
    rt_cuda_h_to_f32(s, ty->dt, ysh, dy, dy32);
    rt_cuda_conv2d_bwd_filter(s, d, x32, dy32, dw, dbias);
}

static void conv_fwd(struct rt_stream *s, const struct rt_conv_desc *d, const struct dnn_type *ty, const float *x,
                     const float *w, const float *bias, float *y)
{
    /* cuDNN rejects empty tensors; an empty batch has nothing to compute. */
    if (d->in.n <= 0)
        return;
    if (conv_runs_in_f32(s, d, DIR_FWD, ty)) {
        conv16_fwd_in_f32(s, d, ty, x, w, bias, y);
        return;
    }
    struct rt_cuda *c = rt_cuda_of(s);
    const int f32 = ty->dt == RT_F32;
    const void *wt = f32 ? (const void *)w : conv_weights16(s, d, ty, w);
    struct conv_descs dd;
    rt_dnn_descs_make(d, f32 && bias != NULL, ty, &dd);
    const struct rt_cuda_algo a = conv_algo(s, d, DIR_FWD, ty, &dd, x, wt, y);
    if (a.in_f32) { /* decided just now, by the search */
        rt_dnn_descs_free(&dd);
        conv16_fwd_in_f32(s, d, ty, x, w, bias, y);
        return;
    }
    void *ws = conv_workspace(s, &a);
    const float one = 1.0f, zero = 0.0f;
    RT_CUDNN_CHECK(cudnnConvolutionForward(c->dnn, &one, dd.x, x, dd.w, wt, dd.conv,
                                           (cudnnConvolutionFwdAlgo_t)a.algo, ws, a.workspace, &zero, dd.y, y));
    if (bias && f32)
        RT_CUDNN_CHECK(cudnnAddTensor(c->dnn, &one, dd.b, bias, &one, dd.y, y));
    else if (bias)
        rt_cuda_h_bias_add(s, ty->dt, (size_t)d->in.n * d->oh * d->ow, (size_t)d->cout, bias, y);
    rt_dnn_descs_free(&dd);
}

static void conv_bwd_data(struct rt_stream *s, const struct rt_conv_desc *d, const struct dnn_type *ty,
                          const float *dy, const float *w, float beta, float *dx)
{
    if (d->in.n <= 0)
        return;
    if (conv_runs_in_f32(s, d, DIR_BWD_DATA, ty)) {
        conv16_bwd_data_in_f32(s, d, ty, dy, w, beta, dx);
        return;
    }
    struct rt_cuda *c = rt_cuda_of(s);
    const void *wt = ty->dt == RT_F32 ? (const void *)w : conv_weights16(s, d, ty, w);
    struct conv_descs dd;
    rt_dnn_descs_make(d, 0, ty, &dd);
    const struct rt_cuda_algo a = conv_algo(s, d, DIR_BWD_DATA, ty, &dd, wt, dy, NULL);
    if (a.in_f32) {
        rt_dnn_descs_free(&dd);
        conv16_bwd_data_in_f32(s, d, ty, dy, w, beta, dx);
        return;
    }
    void *ws = conv_workspace(s, &a);
    const float one = 1.0f;
    /* dx = beta dx + result; cuDNN does not read dx when beta is 0. */
    RT_CUDNN_CHECK(cudnnConvolutionBackwardData(c->dnn, &one, dd.w, wt, dd.y, dy, dd.conv,
                                                (cudnnConvolutionBwdDataAlgo_t)a.algo, ws, a.workspace, &beta, dd.x,
                                                dx));
    rt_dnn_descs_free(&dd);
}

static void conv_bwd_filter(struct rt_stream *s, const struct rt_conv_desc *d, const struct dnn_type *ty,
                            const float *x, const float *dy, float *dw, float *dbias)
{
    if (d->in.n <= 0)
        return;
    if (conv_runs_in_f32(s, d, DIR_BWD_FILTER, ty)) {
        conv16_bwd_filter_in_f32(s, d, ty, x, dy, dw, dbias);
        return;
    }
    struct rt_cuda *c = rt_cuda_of(s);
    const int f32 = ty->dt == RT_F32;
    const size_t count = (size_t)d->cout * d->in.c * d->kh * d->kw;
    /* 16-bit: the gradient of this call alone, into scratch, then added into the fp32 dw. */
    void *g = f32 ? (void *)dw : rt_cuda_scratch(s, RT_CUDA_SCRATCH_DW, count * ty->esz);
    struct conv_descs dd;
    rt_dnn_descs_make(d, f32 && dbias != NULL, ty, &dd);
    const struct rt_cuda_algo a = conv_algo(s, d, DIR_BWD_FILTER, ty, &dd, x, dy, NULL);
    if (a.in_f32) {
        rt_dnn_descs_free(&dd);
        conv16_bwd_filter_in_f32(s, d, ty, x, dy, dw, dbias);
        return;
    }
    void *ws = conv_workspace(s, &a);
    /* fp32: parameter gradients accumulate over micro-batches, beta 1; 16-bit: the scratch is overwritten. */
    const float one = 1.0f, zero = 0.0f;
    RT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(c->dnn, &one, dd.x, x, dd.y, dy, dd.conv,
                                                  (cudnnConvolutionBwdFilterAlgo_t)a.algo, ws, a.workspace,
                                                  f32 ? &one : &zero, dd.w, g));
    if (!f32)
        rt_cuda_h_dw_acc(s, ty->dt, d->cout, d->in.c, d->kh * d->kw, g, dw);
    if (dbias && f32)
        RT_CUDNN_CHECK(cudnnConvolutionBackwardBias(c->dnn, &one, dd.y, dy, &one, dd.b, dbias));
    else if (dbias)
        rt_cuda_h_bias_grad(s, ty->dt, (size_t)d->in.n * d->oh * d->ow, (size_t)d->cout, dy, dbias);
    rt_dnn_descs_free(&dd);
}

void rt_cuda_conv2d_fwd(struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *w,
                        const float *bias, float *y)
{
    conv_fwd(s, d, &TY_F32, x, w, bias, y);
}

void rt_cuda_conv2d_bwd_data(struct rt_stream *s, const struct rt_conv_desc *d, const float *dy, const float *w,
                             float beta, float *dx)
{
    conv_bwd_data(s, d, &TY_F32, dy, w, beta, dx);
}

void rt_cuda_conv2d_bwd_filter(struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *dy,
                               float *dw, float *dbias)
{
    conv_bwd_filter(s, d, &TY_F32, x, dy, dw, dbias);
}

/* ---- linear -------------------------------------------------------------- */

/*
 * cuBLAS is column-major: a row-major (r, c) matrix M is, to cuBLAS, the
 * column-major (c, r) matrix M^T with leading dimension c. Each product below
 * is therefore computed transposed, with the operands' row lengths as
 * leading dimensions:
 *
 *   forward      y = x w^T         y^T(out, N)  = op_T(w^T(in, out)) x^T(in, N)
 *   bwd data     dx = dy w         dx^T(in, N)  = w^T(in, out) dy^T(out, N)
 *   bwd filter   dw += dy^T x      dw^T(in, out) = x^T(in, N) op_T(dy^T(out, N))
 */

void rt_cuda_linear_fwd(struct rt_stream *s, int n, int in, int out, const float *x, const float *w, const float *b,
                        float *y)
{
    if (n <= 0)
        return;
    struct rt_cuda *c = rt_cuda_of(s);
    const float one = 1.0f, zero = 0.0f;
    /* m = out, n = N, k = in; A = w as (in, out) col-major, transposed; B = x as (in, N); C = y as (out, N). */
    RT_CUBLAS_CHECK(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w, in, x, in, &zero, y, out));
    if (b) {
        cudnnTensorDescriptor_t rows, vec;
        feat_descs_make(n, out, &rows, &vec);
        RT_CUDNN_CHECK(cudnnAddTensor(c->dnn, &one, vec, b, &one, rows, y));
        feat_descs_free(rows, vec);
    }
}

void rt_cuda_linear_bwd_data(struct rt_stream *s, int n, int in, int out, const float *dy, const float *w,
                             float beta, float *dx)
{
    if (n <= 0)
        return;
    struct rt_cuda *c = rt_cuda_of(s);
    const float one = 1.0f;
    /* m = in, n = N, k = out; A = w as (in, out); B = dy as (out, N); C = dx as (in, N). cuBLAS does not
     * read C when beta is 0. */
    RT_CUBLAS_CHECK(cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &one, w, in, dy, out, &beta, dx, in));
}

void rt_cuda_linear_bwd_filter(struct rt_stream *s, int n, int in, int out, const float *x, const float *dy,
                               float *dw, float *db)
{
    if (n <= 0)
        return;
    struct rt_cuda *c = rt_cuda_of(s);
    const float one = 1.0f;
    /* m = in, n = out, k = N; A = x as (in, N); B = dy as (out, N), transposed; C = dw as (in, out), added to. */
    RT_CUBLAS_CHECK(cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &one, x, in, dy, out, &one, dw, in));
    if (db) {
        /* db += column sums of dy: dy (N, out) is the NCHW tensor (N, out, 1, 1), db its (1, out, 1, 1) bias. */
        cudnnTensorDescriptor_t rows, vec;
        feat_descs_make(n, out, &rows, &vec);
        RT_CUDNN_CHECK(cudnnConvolutionBackwardBias(c->dnn, &one, rows, dy, &one, vec, db));
        feat_descs_free(rows, vec);
    }
}

/* ---- 16-bit linear layers ------------------------------------------------ */

static cudaDataType_t blas_type(const struct dnn_type *ty)
{
    return ty->dt == RT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

/* The 16-bit copy of a linear layer's fp32 weights (out, in), in the weight scratch. */
static void *linear_weights16(struct rt_stream *s, const struct dnn_type *ty, int in, int out, const float *w)
{
    void *wl = rt_cuda_scratch(s, RT_CUDA_SCRATCH_W, (size_t)in * out * ty->esz);
    rt_cuda_h_weights(s, ty->dt, out, in, 1, 0, w, wl);
    return wl;
}

/* The same products as the fp32 entries above (see the comment there), with 16-bit operands: wl is the 16-bit
 * copy of the weights (out, in), made per call here and once per update by the fast tables (dnn_fast.c). */
void rt_dnn_linear16_fwd(struct rt_stream *s, enum rt_dtype dt, int n, int in, int out, const void *x,
                         const void *wl, const float *b, void *y)
{
    struct rt_cuda *c = rt_cuda_of(s);
    const cudaDataType_t t = blas_type(rt_dnn_type_of(dt));
    const float one = 1.0f, zero = 0.0f;
    RT_CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, wl, t, in, x, t, in, &zero, y,
                                 t, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (b)
        rt_cuda_h_bias_add(s, dt, (size_t)n, (size_t)out, b, y);
}

void rt_dnn_linear16_bwd_data(struct rt_stream *s, enum rt_dtype dt, int n, int in, int out, const void *dy,
                              const void *wl, float beta, void *dx)
{
    struct rt_cuda *c = rt_cuda_of(s);
    const cudaDataType_t t = blas_type(rt_dnn_type_of(dt));
    const float one = 1.0f;
    RT_CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &one, wl, t, in, dy, t, out, &beta,
                                 dx, t, in, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void linear16_fwd(struct rt_stream *s, const struct dnn_type *ty, int n, int in, int out, const float *x,
                         const float *w, const float *b, float *y)
{
    if (n > 0)
        rt_dnn_linear16_fwd(s, ty->dt, n, in, out, x, linear_weights16(s, ty, in, out, w), b, y);
}

static void linear16_bwd_data(struct rt_stream *s, const struct dnn_type *ty, int n, int in, int out,
                              const float *dy, const float *w, float beta, float *dx)
{
    if (n > 0)
        rt_dnn_linear16_bwd_data(s, ty->dt, n, in, out, dy, linear_weights16(s, ty, in, out, w), beta, dx);
}

static void linear16_bwd_filter(struct rt_stream *s, const struct dnn_type *ty, int n, int in, int out,
                                const float *x, const float *dy, float *dw, float *db)
{
    if (n <= 0)
        return;
    struct rt_cuda *c = rt_cuda_of(s);
    const cudaDataType_t t = blas_type(ty);
    const float one = 1.0f;
    /* 16-bit operands, fp32 output: added straight into the fp32 gradient. */
    RT_CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &one, x, t, in, dy, t, out, &one, dw,
                                 CUDA_R_32F, in, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (db)
        rt_cuda_h_bias_grad(s, ty->dt, (size_t)n, (size_t)out, dy, db);
}

/* The 16-bit tables' entries: one set per type, each a call of the typed function above. */
#define DNN16_ENTRIES(sfx, TY)                                                                                           static void conv_fwd_##sfx(struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *w,                                  const float *bias, float *y)                                                              {                                                                                                                        conv_fwd(s, d, &TY, x, w, bias, y);                                                                              }                                                                                                                    static void conv_bwd_data_##sfx(struct rt_stream *s, const struct rt_conv_desc *d, const float *dy,                                                 const float *w, float beta, float *dx)                                               {                                                                                                                        conv_bwd_data(s, d, &TY, dy, w, beta, dx);                                                                       }                                                                                                                    static void conv_bwd_filter_##sfx(struct rt_stream *s, const struct rt_conv_desc *d, const float *x,                                                  const float *dy, float *dw, float *dbias)                                          {                                                                                                                        conv_bwd_filter(s, d, &TY, x, dy, dw, dbias);                                                                    }                                                                                                                    static void linear_fwd_##sfx(struct rt_stream *s, int n, int in, int out, const float *x, const float *w,                                         const float *b, float *y)                                                               {                                                                                                                        linear16_fwd(s, &TY, n, in, out, x, w, b, y);                                                                    }                                                                                                                    static void linear_bwd_data_##sfx(struct rt_stream *s, int n, int in, int out, const float *dy, const float *w,                                       float beta, float *dx)                                                             {                                                                                                                        linear16_bwd_data(s, &TY, n, in, out, dy, w, beta, dx);                                                          }                                                                                                                    static void linear_bwd_filter_##sfx(struct rt_stream *s, int n, int in, int out, const float *x,                                                        const float *dy, float *dw, float *db)                                           {                                                                                                                        linear16_bwd_filter(s, &TY, n, in, out, x, dy, dw, db);                                                          }

DNN16_ENTRIES(bf16, TY_BF16)
DNN16_ENTRIES(f16, TY_F16)

#define DNN16_FILL(t, sfx)                                                                                               do {                                                                                                                     (t)->conv2d_fwd = conv_fwd_##sfx;                                                                                    (t)->conv2d_bwd_data = conv_bwd_data_##sfx;                                                                          (t)->conv2d_bwd_filter = conv_bwd_filter_##sfx;                                                                      (t)->linear_fwd = linear_fwd_##sfx;                                                                                  (t)->linear_bwd_data = linear_bwd_data_##sfx;                                                                        (t)->linear_bwd_filter = linear_bwd_filter_##sfx;                                                                } while (0)

void rt_cuda_dnn_fill16(struct rt_ops *t, enum rt_dtype dt)
{
    if (dt == RT_BF16)
        DNN16_FILL(t, bf16);
    else
        DNN16_FILL(t, f16);
}

/* ---- teardown ------------------------------------------------------------ */

void rt_cuda_dnn_release(struct rt_cuda *c)
{
    /* The reference cache holds only plain values: its descriptors are per call and it keeps no device memory.
     * The fast path's plans, descriptors and weight copies are dnn_fast.c's to free. */
    rt_dnn_fast_release(c);
    free(c->algos);
    c->algos = NULL;
    c->nalgos = 0;
    c->cap_algos = 0;
}

const char *rt_dnn_legacy_name(int dir, int algo)
{
    static const char *const fwd[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                      "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
    static const char *const bwd_data[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
    static const char *const bwd_filter[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD_NONFUSED", "FFT_TILING",
                                             "ALGO_1_NO_ATOMICS"};
    const char *const *t = dir == DIR_FWD ? fwd : dir == DIR_BWD_DATA ? bwd_data : bwd_filter;
    const int n = dir == DIR_FWD ? 8 : dir == DIR_BWD_DATA ? 6 : 7;
    return algo >= 0 && algo < n ? t[algo] : "?";
}

/* ---- the reference entries, for the fast path's calls it hands back -------------------------------------- */

void rt_dnn_ref_fwd(struct rt_stream *s, const struct rt_conv_desc *d, enum rt_dtype dt, const float *x,
                    const float *w, const float *bias, float *y)
{
    conv_fwd(s, d, rt_dnn_type_of(dt), x, w, bias, y);
}

void rt_dnn_ref_bwd_data(struct rt_stream *s, const struct rt_conv_desc *d, enum rt_dtype dt, const float *dy,
                         const float *w, float beta, float *dx)
{
    conv_bwd_data(s, d, rt_dnn_type_of(dt), dy, w, beta, dx);
}

void rt_dnn_ref_bwd_filter(struct rt_stream *s, const struct rt_conv_desc *d, enum rt_dtype dt, const float *x,
                           const float *dy, float *dw, float *dbias)
{
    conv_bwd_filter(s, d, rt_dnn_type_of(dt), x, dy, dw, dbias);
}
