/*
 * cuda_be.h - the CUDA backend, private to compute/cuda/. Each rt_cuda_*
 * function is one slot of struct rt_ops with the semantics compute.h states
 * (the CPU backend, compute/cpu/, is the reference the GPU tests compare to).
 *
 * Layout: spatial tensors are NCHW on the GPU (the CPU backend's are CNHW;
 * the op table hides it: to_nchw/from_nchw convert, gap/flatten produce the
 * same (N, F) row-major features). Every op is issued on the stream's
 * cudaStream_t, asynchronously; nothing in an op synchronises the device
 * except download (which must hand back host data) and sync.
 *
 * Failures: a CUDA, cuDNN or cuBLAS error is not recoverable inside a step,
 * so the check macros print the library's message with file:line and abort
 * the process (under mpirun/srun, the launcher then ends the job).
 *
 * Files: backend_cuda.c (device, streams, handles, memory, the table),
 * elem.cu (element-wise ops, loss, reductions, casts, optimizers, dropout),
 * spatial.cu (input, layout, batchnorm, pooling, gap, flatten), dnn.c
 * (convolutions through cuDNN, linear layers through cuBLAS).
 */
#ifndef RT_COMPUTE_CUDA_BE_H
#define RT_COMPUTE_CUDA_BE_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "compute/backend.h"
#include "compute/compute.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device scratch kept by the backend besides the workspace, one per use, so
 * that an op can hold one while it uses the workspace (all stream-ordered). */
enum { RT_CUDA_SCRATCH_W = 0, RT_CUDA_SCRATCH_DW = 1, RT_CUDA_SCRATCH_SLOTS = 2 };

/* A convolution algorithm chosen by measurement, per shape and direction. */
struct rt_cuda_algo {
    struct rt_conv_desc d;
    int dir;                /* 0 forward, 1 backward data, 2 backward filter */
    int dt;                 /* enum rt_dtype of the activations */
    int algo;               /* cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t */
    size_t workspace;
};

struct rt_cuda {
    int device;
    struct cudaDeviceProp prop;
    cudaStream_t compute;   /* the backend's default stream (rt_backend_stream) */
    cudnnHandle_t dnn;      /* bound to `compute` */
    cublasHandle_t blas;    /* bound to `compute` */
    void *workspace;        /* cuDNN workspace, grown on demand (rt_cuda_workspace) */
    size_t workspace_bytes;
    struct rt_cuda_algo *algos; /* the cache of chosen algorithms (dnn.c) */
    int nalgos, cap_algos;
    float *host_stage;      /* pinned staging for input_u8 and small uploads */
    size_t host_stage_bytes;
    void *scratch[RT_CUDA_SCRATCH_SLOTS]; /* rt_cuda_scratch */
    size_t scratch_bytes[RT_CUDA_SCRATCH_SLOTS];
    struct rt_ops ops16[2]; /* the bf16 and fp16 tables (rt_backend_ops_for) */
    /* Input uploads (rt_backend_input_upload): a copy stream and two device
     * buffers used in turn, each with the event of its copy and the event of
     * compute having read it. */
    cudaStream_t copy;
    uint8_t *inbuf[2];
    size_t inbuf_bytes[2];
    cudaEvent_t copied[2], consumed[2];
};

/* Prints "[rank/world] error: <lib> error <code> (<msg>) in <expr> at file:line" and aborts. */
void rt_cuda_fail(const char *lib, int code, const char *msg, const char *expr, const char *file, int line)
    __attribute__((noreturn));

#define RT_CUDA_CHECK(call)                                                                                          \
    do {                                                                                                             \
        cudaError_t e_ = (call);                                                                                     \
        if (e_ != cudaSuccess)                                                                                       \
            rt_cuda_fail("CUDA", (int)e_, cudaGetErrorString(e_), #call, __FILE__, __LINE__);                        \
    } while (0)
#define RT_CUDNN_CHECK(call)                                                                                         \
    do {                                                                                                             \
        cudnnStatus_t e_ = (call);                                                                                   \
        if (e_ != CUDNN_STATUS_SUCCESS)                                                                              \
            rt_cuda_fail("cuDNN", (int)e_, cudnnGetErrorString(e_), #call, __FILE__, __LINE__);                      \
    } while (0)
#define RT_CUBLAS_CHECK(call)                                                                                        \
    do {                                                                                                             \
        cublasStatus_t e_ = (call);                                                                                  \
        if (e_ != CUBLAS_STATUS_SUCCESS)                                                                             \
            rt_cuda_fail("cuBLAS", (int)e_, cublasGetStatusString(e_), #call, __FILE__, __LINE__);                   \
    } while (0)
/* After a kernel launch: launch errors (bad configuration) surface here. */
#define RT_CUDA_LAUNCHED() RT_CUDA_CHECK(cudaPeekAtLastError())

static inline cudaStream_t rt_cuda_stream(struct rt_stream *s)
{
    return (cudaStream_t)s->handle;
}

static inline struct rt_cuda *rt_cuda_of(struct rt_stream *s)
{
    return s->be->cuda;
}

/* At least `bytes` of device workspace owned by the backend (grown with
 * cudaFreeAsync/cudaMallocAsync on the stream; never NULL: aborts when the
 * device is out of memory, naming the size). Valid until the next call. */
void *rt_cuda_workspace(struct rt_stream *s, size_t bytes);
/* At least `bytes` of pinned host memory for staging uploads; the stream is
 * synchronised first if the previous contents may still be in flight. */
void *rt_cuda_host_stage(struct rt_stream *s, size_t bytes);

/* At least `bytes` of device scratch in slot `slot` (RT_CUDA_SCRATCH_*), grown like the workspace. */
void *rt_cuda_scratch(struct rt_stream *s, int slot, size_t bytes);
/* A host uint8 batch of `bytes` copied to the device (through pinned staging) on the stream; the
 * returned device copy lives in the workspace until the next op that takes the workspace. */
const uint8_t *rt_cuda_stage_images(struct rt_stream *s, const uint8_t *host, size_t bytes);

/* ---- backend_cuda.c: memory ---- */
void *rt_cuda_alloc(struct rt_backend *be, size_t bytes);
void rt_cuda_free(struct rt_backend *be, void *p);
void rt_cuda_upload(struct rt_stream *s, void *dst, const void *host_src, size_t bytes);
void rt_cuda_download(struct rt_stream *s, void *host_dst, const void *src, size_t bytes);
void rt_cuda_copy(struct rt_stream *s, void *dst, const void *src, size_t bytes);
void rt_cuda_zero(struct rt_stream *s, void *dst, size_t bytes);
void rt_cuda_sync(struct rt_stream *s);

/* ---- spatial.cu ---- */
void rt_cuda_to_nchw(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *host_nchw);
void rt_cuda_from_nchw(struct rt_stream *s, struct rt_shape4 sh, const float *host_nchw, float *x);
void rt_cuda_input_u8(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *host_images, const float *mean,
                      const float *std, float *y);
void rt_cuda_input_u8_dev(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *dev, const float *mean,
                          const float *std, float *y);
void rt_cuda_bn_train_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                          const float *beta, float *running_mean, float *running_var, float *save_mean,
                          float *save_invstd, float *y);
void rt_cuda_bn_infer_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                          const float *beta, const float *running_mean, const float *running_var, float *y);
void rt_cuda_bn_bwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                    const float *gamma, const float *save_mean, const float *save_invstd, float beta_dx, float *dx,
                    float *dgamma, float *dbeta);
void rt_cuda_maxpool_fwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y);
void rt_cuda_maxpool_bwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, const float *y,
                         const float *dy, float beta, float *dx);
void rt_cuda_avgpool_fwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y);
void rt_cuda_avgpool_bwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *dy, float beta, float *dx);
void rt_cuda_gap_fwd(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y);
void rt_cuda_gap_bwd(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx);
void rt_cuda_flatten_fwd(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y);
void rt_cuda_flatten_bwd(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx);

/* ---- dnn.c ---- */
void rt_cuda_conv2d_fwd(struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *w,
                        const float *bias, float *y);
void rt_cuda_conv2d_bwd_data(struct rt_stream *s, const struct rt_conv_desc *d, const float *dy, const float *w,
                             float beta, float *dx);
void rt_cuda_conv2d_bwd_filter(struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *dy,
                               float *dw, float *dbias);
void rt_cuda_linear_fwd(struct rt_stream *s, int n, int in, int out, const float *x, const float *w, const float *b,
                        float *y);
void rt_cuda_linear_bwd_data(struct rt_stream *s, int n, int in, int out, const float *dy, const float *w,
                             float beta, float *dx);
void rt_cuda_linear_bwd_filter(struct rt_stream *s, int n, int in, int out, const float *x, const float *dy,
                               float *dw, float *db);
/* The 16-bit tables' convolution and linear entries. */
void rt_cuda_dnn_fill16(struct rt_ops *t, enum rt_dtype dt);
/* Frees the algorithm cache (backend destruction). */
void rt_cuda_dnn_release(struct rt_cuda *c);

/* ---- nhwc16.cu: the 16-bit tables' spatial entries and dnn.c's helpers ---- */
void rt_cuda_spatial_fill16(struct rt_ops *t, enum rt_dtype dt);
/* w (k, c, rs) fp32 -> 16-bit, as (k, rs, c) when krsc. */
void rt_cuda_h_weights(struct rt_stream *s, enum rt_dtype dt, int k, int c, int rs, int krsc, const float *w,
                       void *out);
/* dw (k, c, rs) fp32 += g (k, rs, c) 16-bit. */
void rt_cuda_h_dw_acc(struct rt_stream *s, enum rt_dtype dt, int k, int c, int rs, const void *g, float *dw);
/* y (rows, c) 16-bit += b (c) fp32; db (c) fp32 += column sums of dy (rows, c) 16-bit. */
void rt_cuda_h_bias_add(struct rt_stream *s, enum rt_dtype dt, size_t rows, size_t c, const float *b, void *y);
void rt_cuda_h_bias_grad(struct rt_stream *s, enum rt_dtype dt, size_t rows, size_t c, const void *dy, float *db);

/* ---- elem.cu ---- */
/* The 16-bit tables' element-wise, loss and reduction entries. */
void rt_cuda_elem_fill16(struct rt_ops *t, enum rt_dtype dt);
void rt_cuda_relu_fwd(struct rt_stream *s, size_t n, const float *x, float *y);
void rt_cuda_relu_bwd(struct rt_stream *s, size_t n, const float *y, const float *dy, float beta, float *dx);
void rt_cuda_gelu_fwd(struct rt_stream *s, size_t n, const float *x, float *y);
void rt_cuda_gelu_bwd(struct rt_stream *s, size_t n, const float *x, const float *dy, float beta, float *dx);
void rt_cuda_dropout_fwd(struct rt_stream *s, size_t n, float p, uint64_t seed, uint64_t offset, const float *x,
                         float *y);
void rt_cuda_dropout_bwd(struct rt_stream *s, size_t n, float p, uint64_t seed, uint64_t offset, const float *dy,
                         float beta, float *dx);
void rt_cuda_add(struct rt_stream *s, size_t n, const float *a, const float *b, float *y);
void rt_cuda_scale(struct rt_stream *s, size_t n, float alpha, float *x);
void rt_cuda_axpy(struct rt_stream *s, size_t n, float alpha, const float *x, float *y);
void rt_cuda_xent_fwd_bwd(struct rt_stream *s, int n, int k, const float *logits, const int32_t *labels,
                          float label_smoothing, float grad_scale, struct rt_loss_stats *stats, float *dlogits);
void rt_cuda_sumsq(struct rt_stream *s, size_t n, const float *x, float *out);
void rt_cuda_count_nonfinite(struct rt_stream *s, size_t n, const float *x, float *out);
void rt_cuda_unscale_check(struct rt_stream *s, size_t n, float *g, float inv_scale, float *found);
void rt_cuda_cast_f32_f16(struct rt_stream *s, size_t n, const float *x, uint16_t *y);
void rt_cuda_cast_f16_f32(struct rt_stream *s, size_t n, const uint16_t *x, float *y);
void rt_cuda_cast_f32_bf16(struct rt_stream *s, size_t n, const float *x, uint16_t *y);
void rt_cuda_cast_bf16_f32(struct rt_stream *s, size_t n, const uint16_t *x, float *y);
void rt_cuda_sgd_update(struct rt_stream *s, size_t n, float *p, const float *g, float *buf, float lr, float momentum,
                        float dampening, float weight_decay, int nesterov, int first);
void rt_cuda_adam_update(struct rt_stream *s, size_t n, float *p, const float *g, float *m, float *v, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int decoupled, int64_t step);

#ifdef __cplusplus
}
#endif

#endif
