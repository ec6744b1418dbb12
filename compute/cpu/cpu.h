/*
 * cpu.h - the CPU backend's kernels, private to compute/. Each function is
 * one slot of struct rt_ops (compute.h says what it computes); cpu/backend.c
 * puts them in the table. Spatial tensors are (C, N, H, W); kernels thread
 * with OpenMP over the backend's thread count, GEMMs go to OpenBLAS.
 *
 * Kernels never fail: shapes were checked when the model was built. Scratch
 * memory (im2col columns) comes from rt_cpu_scratch(), one growing buffer
 * per backend, so a kernel must not hold it across calls.
 */
#ifndef RT_COMPUTE_CPU_H
#define RT_COMPUTE_CPU_H

#include "compute/backend.h"
#include "compute/compute.h"

/*
 * Returns at least `bytes` of 64-byte aligned scratch owned by the stream's
 * backend, growing it when needed (contents are not kept). Never returns
 * NULL: when memory is exhausted it prints the size and aborts, since an op
 * cannot report an error and a half-done op is worse.
 */
float *rt_cpu_scratch(struct rt_stream *s, size_t bytes);

/*
 * Loads OpenBLAS once per process (blas.c says why at run time), sets its
 * thread count and describes it ("OpenBLAS SkylakeX"). 0 or -ENOENT.
 */
int rt_cpu_blas_init(int threads, char *describe, size_t len);

/* memory and layout (backend.c) */
void *rt_cpu_alloc(struct rt_backend *be, size_t bytes);
void rt_cpu_free(struct rt_backend *be, void *p);
void rt_cpu_upload(struct rt_stream *s, void *dst, const void *host_src, size_t bytes);
void rt_cpu_download(struct rt_stream *s, void *host_dst, const void *src, size_t bytes);
void rt_cpu_copy(struct rt_stream *s, void *dst, const void *src, size_t bytes);
void rt_cpu_zero(struct rt_stream *s, void *dst, size_t bytes);
void rt_cpu_sync(struct rt_stream *s);

/* conv.c: convolution through im2col + sgemm over the whole batch */
void rt_cpu_conv2d_fwd(struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *w,
                       const float *bias, float *y);
void rt_cpu_conv2d_bwd_data(struct rt_stream *s, const struct rt_conv_desc *d, const float *dy, const float *w,
                            float beta, float *dx);
void rt_cpu_conv2d_bwd_filter(struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *dy,
                              float *dw, float *dbias);

/* pool.c: pooling, flatten, linear, layout conversion */
void rt_cpu_to_nchw(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *host_nchw);
void rt_cpu_from_nchw(struct rt_stream *s, struct rt_shape4 sh, const float *host_nchw, float *x);
void rt_cpu_maxpool_fwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y);
void rt_cpu_maxpool_bwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, const float *y,
                        const float *dy, float beta, float *dx);
void rt_cpu_avgpool_fwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y);
void rt_cpu_avgpool_bwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *dy, float beta, float *dx);
void rt_cpu_gap_fwd(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y);
void rt_cpu_gap_bwd(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx);
void rt_cpu_flatten_fwd(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y);
void rt_cpu_flatten_bwd(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx);
void rt_cpu_linear_fwd(struct rt_stream *s, int n, int in, int out, const float *x, const float *w, const float *b,
                       float *y);
void rt_cpu_linear_bwd_data(struct rt_stream *s, int n, int in, int out, const float *dy, const float *w,
                            float beta, float *dx);
void rt_cpu_linear_bwd_filter(struct rt_stream *s, int n, int in, int out, const float *x, const float *dy,
                              float *dw, float *db);

/* elem.c: input, batchnorm, activations, dropout, loss, reductions, casts, optimizers */
void rt_cpu_input_u8(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *host_images, const float *mean,
                     const float *std, float *y);
void rt_cpu_bn_train_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                         const float *beta, float *running_mean, float *running_var, float *save_mean,
                         float *save_invstd, float *y);
void rt_cpu_bn_infer_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                         const float *beta, const float *running_mean, const float *running_var, float *y);
void rt_cpu_bn_bwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                   const float *gamma, const float *save_mean, const float *save_invstd, float beta_dx, float *dx,
                   float *dgamma, float *dbeta);
void rt_cpu_relu_fwd(struct rt_stream *s, size_t n, const float *x, float *y);
void rt_cpu_relu_bwd(struct rt_stream *s, size_t n, const float *y, const float *dy, float beta, float *dx);
void rt_cpu_gelu_fwd(struct rt_stream *s, size_t n, const float *x, float *y);
void rt_cpu_gelu_bwd(struct rt_stream *s, size_t n, const float *x, const float *dy, float beta, float *dx);
void rt_cpu_dropout_fwd(struct rt_stream *s, size_t n, float p, uint64_t seed, uint64_t offset, const float *x,
                        float *y);
void rt_cpu_dropout_bwd(struct rt_stream *s, size_t n, float p, uint64_t seed, uint64_t offset, const float *dy,
                        float beta, float *dx);
void rt_cpu_add(struct rt_stream *s, size_t n, const float *a, const float *b, float *y);
void rt_cpu_scale(struct rt_stream *s, size_t n, float alpha, float *x);
void rt_cpu_axpy(struct rt_stream *s, size_t n, float alpha, const float *x, float *y);
void rt_cpu_xent_fwd_bwd(struct rt_stream *s, int n, int k, const float *logits, const int32_t *labels,
                         float label_smoothing, float grad_scale, struct rt_loss_stats *stats, float *dlogits);
void rt_cpu_sumsq(struct rt_stream *s, size_t n, const float *x, float *out);
void rt_cpu_count_nonfinite(struct rt_stream *s, size_t n, const float *x, float *out);
void rt_cpu_unscale_check(struct rt_stream *s, size_t n, float *g, float inv_scale, float *found);
void rt_cpu_cast_f32_f16(struct rt_stream *s, size_t n, const float *x, uint16_t *y);
void rt_cpu_cast_f16_f32(struct rt_stream *s, size_t n, const uint16_t *x, float *y);
void rt_cpu_cast_f32_bf16(struct rt_stream *s, size_t n, const float *x, uint16_t *y);
void rt_cpu_cast_bf16_f32(struct rt_stream *s, size_t n, const uint16_t *x, float *y);
void rt_cpu_sgd_update(struct rt_stream *s, size_t n, float *p, const float *g, float *buf, float lr, float momentum,
                       float dampening, float weight_decay, int nesterov, int first);
void rt_cpu_adam_update(struct rt_stream *s, size_t n, float *p, const float *g, float *m, float *v, float lr,
                        float beta1, float beta2, float eps, float weight_decay, int decoupled, int64_t step);

#endif
