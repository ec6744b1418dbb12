/*
 * nhwc16.cu - the spatial ops of the CUDA backend's 16-bit tables (bf16 and
 * fp16 activations, rt_backend_ops_for): the uint8 input transform, layout
 * conversion, batchnorm, pooling, global pooling and flatten, and the small
 * kernels dnn.c's 16-bit convolutions and linear layers need (weight casts,
 * bias add, bias and weight gradient accumulation into fp32, and the fp32
 * NCHW copies of the layers no 16-bit cuDNN algorithm supports).
 *
 * Layout: spatial tensors are NHWC, element (n, c, y, x) at
 * ((n*H + y)*W + x)*C + c, the layout cuDNN's tensor-core convolutions
 * read and write without transposing. Features (N, F) are row-major as in
 * every table: an NHWC tensor with H = W = 1, so the per-channel reductions
 * below serve the linear layer's bias gradient too.
 *
 * Precision: elements are loaded as float and every result is rounded once
 * into the 16-bit type on the store. Batchnorm's statistics are summed in
 * double and kept in fp32 (save_mean, save_invstd, the running statistics),
 * as PyTorch's autocast keeps batch_norm in fp32; parameters and their
 * gradients are fp32. Reductions use a fixed split and tree, no atomics,
 * so every op repeats exactly from run to run.
 *
 * Threads run in the physical (NHWC) order wherever they touch memory, so
 * that a warp's 32 loads are contiguous: a channel's statistics are summed
 * by blocks of 32 channels x 8 row lanes.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compute/cuda/cuda_be.h"
#include "compute/cuda/kern.cuh"

#define THREADS 256
#define MAX_BLOCKS ((size_t)1 << 20)
/* Channel reductions: CH_T channels x ROW_T row lanes per block. */
#define CH_T 32
#define ROW_T 8
#define MAX_SPLITS 256

#define FOR_EACH(i, n) for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
#define TP(p) reinterpret_cast<const T *>(p)
#define TM(p) reinterpret_cast<T *>(p)

static unsigned grid_for(size_t n)
{
    const size_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b < MAX_BLOCKS ? b : MAX_BLOCKS);
}

static size_t shape_count(struct rt_shape4 sh)
{
    return (size_t)sh.n * sh.c * sh.h * sh.w;
}

/* ==== layout conversion (tests, debugging) ================================= */

/* NHWC T <-> NCHW float; i runs over the NCHW index. */
template <typename T> static __global__ void to_nchw_k(size_t n, int c, size_t hw, const T *x, float *y)
{
    FOR_EACH(i, n)
    {
        const size_t img = i / ((size_t)c * hw), r = i % ((size_t)c * hw), ch = r / hw, p = r % hw;
        y[i] = ldf(x[(img * hw + p) * (size_t)c + ch]);
    }
}

template <typename T> static __global__ void from_nchw_k(size_t n, int c, size_t hw, const float *x, T *y)
{
    FOR_EACH(i, n)
    {
        const size_t img = i / ((size_t)c * hw), r = i % ((size_t)c * hw), ch = r / hw, p = r % hw;
        y[(img * hw + p) * (size_t)c + ch] = stf<T>(x[i]);
    }
}

template <typename T>
static void to_nchw_t(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *host_nchw)
{
    const size_t n = shape_count(sh);
    if (n == 0)
        return;
    const cudaStream_t st = rt_cuda_stream(s);
    float *tmp = NULL;
    RT_CUDA_CHECK(cudaMallocAsync((void **)&tmp, n * sizeof(float), st));
    to_nchw_k<T><<<grid_for(n), THREADS, 0, st>>>(n, sh.c, (size_t)sh.h * sh.w, TP(x), tmp);
    RT_CUDA_LAUNCHED();
    RT_CUDA_CHECK(cudaMemcpyAsync(host_nchw, tmp, n * sizeof(float), cudaMemcpyDeviceToHost, st));
    RT_CUDA_CHECK(cudaFreeAsync(tmp, st));
    rt_backend_waited(s);
    RT_CUDA_CHECK(cudaStreamSynchronize(st));
}

template <typename T>
static void from_nchw_t(struct rt_stream *s, struct rt_shape4 sh, const float *host_nchw, float *x)
{
    const size_t n = shape_count(sh);
    if (n == 0)
        return;
    const cudaStream_t st = rt_cuda_stream(s);
    float *tmp = NULL;
    RT_CUDA_CHECK(cudaMallocAsync((void **)&tmp, n * sizeof(float), st));
    RT_CUDA_CHECK(cudaMemcpyAsync(tmp, host_nchw, n * sizeof(float), cudaMemcpyHostToDevice, st));
    from_nchw_k<T><<<grid_for(n), THREADS, 0, st>>>(n, sh.c, (size_t)sh.h * sh.w, tmp, TM(x));
    RT_CUDA_LAUNCHED();
    RT_CUDA_CHECK(cudaFreeAsync(tmp, st));
}

/* ==== fp32 copies for the convolutions dnn.c runs in fp32 ==================== */

template <typename T> static __global__ void from_nchw_beta_k(size_t n, int c, size_t hw, const float *x, float beta,
                                                               T *y)
{
    FOR_EACH(i, n)
    {
        const size_t img = i / ((size_t)c * hw), r = i % ((size_t)c * hw), ch = r / hw, p = r % hw;
        const size_t j = (img * hw + p) * (size_t)c + ch;
        y[j] = stf<T>(beta == 0.0f ? x[i] : beta * ldf(y[j]) + x[i]);
    }
}

template <typename T> static void h_to_f32_t(struct rt_stream *s, struct rt_shape4 sh, const void *x, float *y)
{
    const size_t n = shape_count(sh);
    if (n == 0)
        return;
    to_nchw_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, sh.c, (size_t)sh.h * sh.w, TP(x), y);
    RT_CUDA_LAUNCHED();
}

template <typename T>
static void h_from_f32_t(struct rt_stream *s, struct rt_shape4 sh, const float *x, float beta, void *y)
{
    const size_t n = shape_count(sh);
    if (n == 0)
        return;
    from_nchw_beta_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, sh.c, (size_t)sh.h * sh.w, x, beta, TM(y));
    RT_CUDA_LAUNCHED();
}

void rt_cuda_h_to_f32(struct rt_stream *s, enum rt_dtype dt, struct rt_shape4 sh, const void *x, float *y)
{
    if (dt == RT_BF16)
        h_to_f32_t<__nv_bfloat16>(s, sh, x, y);
    else
        h_to_f32_t<__half>(s, sh, x, y);
}

void rt_cuda_h_from_f32(struct rt_stream *s, enum rt_dtype dt, struct rt_shape4 sh, const float *x, float beta, void *y)
{
    if (dt == RT_BF16)
        h_from_f32_t<__nv_bfloat16>(s, sh, x, beta, y);
    else
        h_from_f32_t<__half>(s, sh, x, beta, y);
}

/* ==== input ================================================================= */

/* Source NCHW uint8 (the ring slot's layout), channels [c0, c0 + cg); i over N*cg*HW in source order. */
template <typename T>
static __global__ void input_k(size_t n, size_t hw, int c, int c0, int cg, const uint8_t *src, struct input_norm k,
                               T *y)
{
    FOR_EACH(i, n)
    {
        const size_t ghw = (size_t)cg * hw, img = i / ghw, r = i % ghw, cc = r / hw, p = r % hw;
        const float v = __fdiv_rn((float)src[(img * c + c0 + cc) * hw + p], 255.0f);
        y[(img * hw + p) * (size_t)c + c0 + cc] = stf<T>(__fdiv_rn(__fsub_rn(v, k.mean[cc]), k.std[cc]));
    }
}

template <typename T>
static void input_u8_dev_t(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *dev, const float *mean,
                           const float *std, float *y)
{
    const size_t hw = (size_t)sh.h * sh.w;
    if (shape_count(sh) == 0)
        return;
    const cudaStream_t st = rt_cuda_stream(s);
    for (int c0 = 0; c0 < sh.c; c0 += INPUT_GROUP) {
        const int cg = sh.c - c0 < INPUT_GROUP ? sh.c - c0 : INPUT_GROUP;
        const struct input_norm k = input_norm_of(mean, std, c0, cg);
        const size_t n = (size_t)sh.n * cg * hw;
        input_k<T><<<grid_for(n), THREADS, 0, st>>>(n, hw, sh.c, c0, cg, dev, k, TM(y));
        RT_CUDA_LAUNCHED();
    }
}

template <typename T>
static void input_u8_t(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *host_images, const float *mean,
                       const float *std, float *y)
{
    const size_t total = shape_count(sh);
    if (total == 0)
        return;
    input_u8_dev_t<T>(s, sh, rt_cuda_stage_images(s, host_images, total), mean, std, y);
}

/* ==== per-channel sums ====================================================== */

struct chan_split {
    size_t m;        /* rows: N*H*W */
    size_t chunk;    /* rows per split */
    unsigned splits;
};

static struct chan_split chan_split_of(size_t m)
{
    struct chan_split b;
    b.m = m;
    size_t sp = (m + ROW_T * 32 - 1) / (ROW_T * 32); /* at least 32 rows per lane */
    sp = sp < 1 ? 1 : sp > MAX_SPLITS ? MAX_SPLITS : sp;
    b.chunk = (m + sp - 1) / sp;
    b.splits = (unsigned)((m + b.chunk - 1) / b.chunk);
    if (b.splits < 1)
        b.splits = 1;
    return b;
}

/*
 * Sums over rows [sl*chunk, ...) of channel ch = blockIdx.x*CH_T + tx, into
 * part[2*(ch*splits + sl) + {0,1}]. Three uses:
 *   dy NULL:          sum (x - k), sum (x - k)^2, k = x's first row (shift against cancellation)
 *   x, dy:            sum dy, sum dy (x - save_mean)
 *   x NULL, dy:       sum dy (bias gradients)
 */
template <typename T>
static __global__ void chan_part_k(const T *x, const T *dy, const float *save_mean, size_t c, size_t m, size_t chunk,
                                   unsigned splits, double *part)
{
    __shared__ double sa[ROW_T][CH_T], sb[ROW_T][CH_T];
    const size_t ch = (size_t)blockIdx.x * CH_T + threadIdx.x;
    const unsigned sl = blockIdx.y;
    double a = 0.0, b = 0.0;
    if (ch < c) {
        const double k = dy ? (x ? (double)save_mean[ch] : 0.0) : (double)ldf(x[ch]);
        const size_t j0 = (size_t)sl * chunk, j1 = j0 + chunk < m ? j0 + chunk : m;
        for (size_t j = j0 + threadIdx.y; j < j1; j += ROW_T) {
            const size_t at = j * c + ch;
            if (dy) {
                const double g = (double)ldf(dy[at]);
                a += g;
                if (x)
                    b += g * ((double)ldf(x[at]) - k);
            } else {
                const double d = (double)ldf(x[at]) - k;
                a += d;
                b += d * d;
            }
        }
    }
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && ch < c) {
        for (int r = 1; r < ROW_T; r++) {
            a += sa[r][threadIdx.x];
            b += sb[r][threadIdx.x];
        }
        part[2 * (ch * splits + sl)] = a;
        part[2 * (ch * splits + sl) + 1] = b;
    }
}

/* The channel's sums over its splits, in split order. */
static __device__ void chan_total(const double *part, size_t ch, unsigned splits, double *a, double *b)
{
    double s1 = 0.0, s2 = 0.0;
    for (unsigned t = 0; t < splits; t++) {
        s1 += part[2 * (ch * splits + t)];
        s2 += part[2 * (ch * splits + t) + 1];
    }
    *a = s1;
    *b = s2;
}

template <typename T>
static double *chan_sums(struct rt_stream *s, const T *x, const T *dy, const float *save_mean, size_t c,
                         const struct chan_split *b, size_t extra_bytes)
{
    double *part = (double *)rt_cuda_workspace(s, 2 * c * b->splits * sizeof(double) + extra_bytes);
    const dim3 grid((unsigned)((c + CH_T - 1) / CH_T), b->splits), block(CH_T, ROW_T);
    chan_part_k<T><<<grid, block, 0, rt_cuda_stream(s)>>>(x, dy, save_mean, c, b->m, b->chunk, b->splits, part);
    RT_CUDA_LAUNCHED();
    return part;
}

static __global__ void bias_grad_final_k(size_t c, unsigned splits, const double *part, float *db)
{
    const size_t ch = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c)
        return;
    double a, b;
    chan_total(part, ch, splits, &a, &b);
    db[ch] = __fadd_rn(db[ch], (float)a);
}

template <typename T> static void bias_grad_t(struct rt_stream *s, size_t rows, size_t c, const void *dy, float *db)
{
    if (rows == 0 || c == 0)
        return;
    const struct chan_split b = chan_split_of(rows);
    double *part = chan_sums<T>(s, NULL, (const T *)dy, NULL, c, &b, 0);
    bias_grad_final_k<<<grid_for(c), THREADS, 0, rt_cuda_stream(s)>>>(c, b.splits, part, db);
    RT_CUDA_LAUNCHED();
}

void rt_cuda_h_bias_grad(struct rt_stream *s, enum rt_dtype dt, size_t rows, size_t c, const void *dy, float *db)
{
    if (dt == RT_BF16)
        bias_grad_t<__nv_bfloat16>(s, rows, c, dy, db);
    else
        bias_grad_t<__half>(s, rows, c, dy, db);
}

template <typename T> static __global__ void bias_add_k(size_t n, size_t c, const float *b, T *y)
{
    FOR_EACH(i, n)
    y[i] = stf<T>(__fadd_rn(ldf(y[i]), b[i % c]));
}

void rt_cuda_h_bias_add(struct rt_stream *s, enum rt_dtype dt, size_t rows, size_t c, const float *b, void *y)
{
    const size_t n = rows * c;
    if (n == 0)
        return;
    if (dt == RT_BF16)
        bias_add_k<__nv_bfloat16><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, c, b, (__nv_bfloat16 *)y);
    else
        bias_add_k<__half><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, c, b, (__half *)y);
    RT_CUDA_LAUNCHED();
}

/* ==== weights for the 16-bit convolutions and linear layers ================ */

/* w (K, C, R, S) fp32 -> T, as (K, R, S, C) when krsc (cuDNN's NHWC filter layout), else in place order. */
template <typename T>
static __global__ void weights_k(size_t n, int cin, int rs, int krsc, const float *w, T *out)
{
    FOR_EACH(i, n)
    {
        if (!krsc) {
            out[i] = stf<T>(w[i]);
            continue;
        }
        /* i indexes the output (k, rs, c) */
        const size_t k = i / ((size_t)rs * cin), r = i % ((size_t)rs * cin), p = r / cin, ch = r % cin;
        out[i] = stf<T>(w[(k * cin + ch) * rs + p]);
    }
}

void rt_cuda_h_weights(struct rt_stream *s, enum rt_dtype dt, int k, int c, int rs, int krsc, const float *w,
                       void *out)
{
    const size_t n = (size_t)k * c * rs;
    if (n == 0)
        return;
    if (dt == RT_BF16)
        weights_k<__nv_bfloat16><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, c, rs, krsc, w,
                                                                                 (__nv_bfloat16 *)out);
    else
        weights_k<__half><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, c, rs, krsc, w, (__half *)out);
    RT_CUDA_LAUNCHED();
}

/* dw (K, C, R, S) fp32 += g (K, R, S, C) T; i indexes dw. */
template <typename T> static __global__ void dw_acc_k(size_t n, int cin, int rs, const T *g, float *dw)
{
    FOR_EACH(i, n)
    {
        const size_t k = i / ((size_t)cin * rs), r = i % ((size_t)cin * rs), ch = r / rs, p = r % rs;
        dw[i] = __fadd_rn(dw[i], ldf(g[(k * rs + p) * cin + ch]));
    }
}

void rt_cuda_h_dw_acc(struct rt_stream *s, enum rt_dtype dt, int k, int c, int rs, const void *g, float *dw)
{
    const size_t n = (size_t)k * c * rs;
    if (n == 0)
        return;
    if (dt == RT_BF16)
        dw_acc_k<__nv_bfloat16><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, c, rs, (const __nv_bfloat16 *)g,
                                                                                dw);
    else
        dw_acc_k<__half><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, c, rs, (const __half *)g, dw);
    RT_CUDA_LAUNCHED();
}

/* ==== batchnorm ============================================================= */

struct bn_k {
    double m, eps, mom, keep, unbias;
};

template <typename T>
static __global__ void bn_fwd_final_k(size_t c, unsigned splits, const double *part, const T *x, struct bn_k k,
                                      float *running_mean, float *running_var, float *save_mean, float *save_invstd)
{
    const size_t ch = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c)
        return;
    double s1, s2;
    chan_total(part, ch, splits, &s1, &s2);
    const double dm = s1 / k.m;
    double var = s2 / k.m - dm * dm;
    if (var < 0.0)
        var = 0.0;
    const double mean = (double)ldf(x[ch]) + dm;
    save_mean[ch] = (float)mean;
    save_invstd[ch] = (float)(1.0 / sqrt(var + k.eps));
    running_mean[ch] = (float)(k.mom * mean + k.keep * (double)running_mean[ch]);
    running_var[ch] = (float)(k.mom * var * k.unbias + k.keep * (double)running_var[ch]);
}

template <typename T>
static __global__ void bn_affine_k(size_t n, size_t c, const T *x, const float *mean, const float *invstd,
                                   const float *gamma, const float *beta, T *y)
{
    FOR_EACH(i, n)
    {
        const size_t ch = i % c;
        const float a = invstd[ch] * gamma[ch];
        y[i] = stf<T>((ldf(x[i]) - mean[ch]) * a + beta[ch]);
    }
}

template <typename T>
static void bn_train_fwd_t(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                           const float *beta, float *running_mean, float *running_var, float *save_mean,
                           float *save_invstd, float *y)
{
    const size_t c = (size_t)d->in.c, m = (size_t)d->in.n * d->in.h * d->in.w;
    if (c == 0 || m == 0)
        return;
    const struct chan_split b = chan_split_of(m);
    double *part = chan_sums<T>(s, TP(x), NULL, NULL, c, &b, 0);
    struct bn_k k;
    k.m = (double)m;
    k.eps = rt_decimal_double(d->eps);
    k.mom = rt_decimal_double(d->momentum);
    k.keep = 1.0 - k.mom;
    k.unbias = m > 1 ? (double)m / (double)(m - 1) : 1.0;
    const cudaStream_t st = rt_cuda_stream(s);
    bn_fwd_final_k<T><<<grid_for(c), THREADS, 0, st>>>(c, b.splits, part, TP(x), k, running_mean, running_var,
                                                       save_mean, save_invstd);
    RT_CUDA_LAUNCHED();
    const size_t n = c * m;
    bn_affine_k<T><<<grid_for(n), THREADS, 0, st>>>(n, c, TP(x), save_mean, save_invstd, gamma, beta, TM(y));
    RT_CUDA_LAUNCHED();
}

static __global__ void bn_invstd_k(size_t c, const float *running_var, double eps, float *invstd)
{
    const size_t ch = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch < c)
        invstd[ch] = (float)(1.0 / sqrt((double)running_var[ch] + eps));
}

template <typename T>
static void bn_infer_fwd_t(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                           const float *beta, const float *running_mean, const float *running_var, float *y)
{
    const size_t c = (size_t)d->in.c, n = shape_count(d->in);
    if (n == 0)
        return;
    const cudaStream_t st = rt_cuda_stream(s);
    float *invstd = (float *)rt_cuda_workspace(s, c * sizeof(float));
    bn_invstd_k<<<grid_for(c), THREADS, 0, st>>>(c, running_var, rt_decimal_double(d->eps), invstd);
    RT_CUDA_LAUNCHED();
    bn_affine_k<T><<<grid_for(n), THREADS, 0, st>>>(n, c, TP(x), running_mean, invstd, gamma, beta, TM(y));
    RT_CUDA_LAUNCHED();
}

static __global__ void bn_bwd_final_k(size_t c, unsigned splits, const double *part, double m, const float *gamma,
                                      const float *save_invstd, float *dgamma, float *dbeta, float *coef)
{
    const size_t ch = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c)
        return;
    double sdy, sdyx;
    chan_total(part, ch, splits, &sdy, &sdyx);
    const double invstd = save_invstd[ch];
    dbeta[ch] = __fadd_rn(dbeta[ch], (float)sdy);
    dgamma[ch] = __fadd_rn(dgamma[ch], (float)(sdyx * invstd));
    coef[3 * ch] = (float)(sdy / m);
    coef[3 * ch + 1] = (float)(sdyx * invstd * invstd / m);
    coef[3 * ch + 2] = (float)(invstd * (double)gamma[ch]);
}

template <typename T>
static __global__ void bn_bwd_dx_k(size_t n, size_t c, const T *x, const T *dy, const float *save_mean,
                                   const float *coef, float beta_dx, T *dx)
{
    FOR_EACH(i, n)
    {
        const size_t ch = i % c;
        const float t = (ldf(dy[i]) - coef[3 * ch] - (ldf(x[i]) - save_mean[ch]) * coef[3 * ch + 1]) *
                        coef[3 * ch + 2];
        /* beta_dx 0 must not read dx: it may hold NaN. */
        dx[i] = stf<T>(beta_dx == 0.0f ? t : beta_dx * ldf(dx[i]) + t);
    }
}

template <typename T>
static void bn_bwd_t(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                     const float *gamma, const float *beta, const float *save_mean, const float *save_invstd,
                     float beta_dx, float *dx, float *dgamma, float *dbeta)
{
    (void)beta; /* only for a fused ReLU, which the CUDA tables do not offer (rt_ops.bn_relu 0) */
    const size_t c = (size_t)d->in.c, m = (size_t)d->in.n * d->in.h * d->in.w;
    if (c == 0 || m == 0)
        return;
    const struct chan_split b = chan_split_of(m);
    double *part = chan_sums<T>(s, TP(x), TP(dy), save_mean, c, &b, 3 * c * sizeof(float));
    float *coef = (float *)(part + 2 * c * b.splits);
    const cudaStream_t st = rt_cuda_stream(s);
    bn_bwd_final_k<<<grid_for(c), THREADS, 0, st>>>(c, b.splits, part, (double)m, gamma, save_invstd, dgamma, dbeta,
                                                    coef);
    RT_CUDA_LAUNCHED();
    if (!dx)
        return;
    const size_t n = c * m;
    bn_bwd_dx_k<T><<<grid_for(n), THREADS, 0, st>>>(n, c, TP(x), TP(dy), save_mean, coef, beta_dx, TM(dx));
    RT_CUDA_LAUNCHED();
}

/* bn_infer_bwd's coefficients in bn_bwd_dx_k's form: grad_mean = proj = 0, scale = the forward's invstd * gamma,
 * rounded as bn_infer_fwd_t computes it (bn_invstd_k, then bn_affine_k's product). */
static __global__ void bn_infer_bwd_coef_k(size_t c, const float *running_var, const float *gamma, double eps,
                                           float *coef)
{
    const size_t ch = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c)
        return;
    const float invstd = (float)(1.0 / sqrt((double)running_var[ch] + eps));
    coef[3 * ch] = 0.0f;
    coef[3 * ch + 1] = 0.0f;
    coef[3 * ch + 2] = invstd * gamma[ch];
}

/* dx = beta_dx dx + dy invstd gamma, rounded once into T: bn_bwd_dx_k with the coefficients above and
 * mean = running_mean (dy - 0 - (x - mean) 0 is dy for every finite x). */
template <typename T>
static void bn_infer_bwd_t(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                           const float *gamma, const float *beta, const float *running_mean, const float *running_var,
                           float beta_dx, float *dx)
{
    (void)beta; /* only for a fused ReLU, which the CUDA tables do not offer (rt_ops.bn_relu 0): d->relu is never set */
    const size_t c = (size_t)d->in.c, n = shape_count(d->in);
    if (n == 0)
        return;
    const cudaStream_t st = rt_cuda_stream(s);
    float *coef = (float *)rt_cuda_workspace(s, 3 * c * sizeof(float));
    bn_infer_bwd_coef_k<<<grid_for(c), THREADS, 0, st>>>(c, running_var, gamma, rt_decimal_double(d->eps), coef);
    RT_CUDA_LAUNCHED();
    bn_bwd_dx_k<T><<<grid_for(n), THREADS, 0, st>>>(n, c, TP(x), TP(dy), running_mean, coef, beta_dx, TM(dx));
    RT_CUDA_LAUNCHED();
}

/* ==== pooling =============================================================== */

static struct pool_geom geom_of(const struct rt_pool_desc *d)
{
    struct pool_geom g = {d->in.h, d->in.w, d->kh, d->kw, d->stride, d->pad, d->oh, d->ow};
    return g;
}

/* Pixel index (y*W + x) of window (oy, ox)'s maximum; the CPU's rule: first maximum, any NaN wins. */
template <typename T>
static __device__ __forceinline__ int argmax_nhwc(const struct pool_geom &g, const T *img, size_t c, int oy, int ox)
{
    int y0, y1, x0, x1;
    pool_window(g, oy, ox, &y0, &y1, &x0, &x1);
    int best = y0 * g.w + x0;
    float m = -INFINITY;
    for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++) {
            const int p = iy * g.w + ix;
            const float v = ldf(img[(size_t)p * c]);
            if (v > m || isnan(v)) {
                m = v;
                best = p;
            }
        }
    return best;
}

/* i over y (N, oh, ow, C); img points at (n, 0, 0, ch). */
template <typename T> static __global__ void maxpool_fwd_k(size_t n, struct pool_geom g, size_t c, const T *x, T *y)
{
    const size_t ohw = (size_t)g.oh * g.ow, hw = (size_t)g.h * g.w;
    FOR_EACH(i, n)
    {
        const size_t ch = i % c, pix = i / c, img = pix / ohw;
        const int r = (int)(pix % ohw), oy = r / g.ow, ox = r % g.ow;
        const T *xi = x + img * hw * c + ch;
        y[i] = xi[(size_t)argmax_nhwc(g, xi, c, oy, ox) * c];
    }
}

/* i over x (N, H, W, C): the gradients of the windows whose maximum it is, in output row-major order. */
template <typename T>
static __global__ void maxpool_bwd_k(size_t n, struct pool_geom g, size_t c, const T *x, const T *dy, float beta,
                                     T *dx)
{
    const size_t ohw = (size_t)g.oh * g.ow, hw = (size_t)g.h * g.w;
    FOR_EACH(i, n)
    {
        const size_t ch = i % c, pix = i / c, img = pix / hw;
        const int q = (int)(pix % hw), iy = q / g.w, ix = q % g.w;
        const T *xi = x + img * hw * c + ch, *gi = dy + img * ohw * c + ch;
        int oy0, oy1, ox0, ox1;
        pool_cover(iy, g.kh, g.stride, g.pad, g.oh, &oy0, &oy1);
        pool_cover(ix, g.kw, g.stride, g.pad, g.ow, &ox0, &ox1);
        float acc = beta == 0.0f ? 0.0f : beta * ldf(dx[i]);
        for (int oy = oy0; oy < oy1; oy++)
            for (int ox = ox0; ox < ox1; ox++)
                if (argmax_nhwc(g, xi, c, oy, ox) == q)
                    acc += ldf(gi[(size_t)(oy * g.ow + ox) * c]);
        dx[i] = stf<T>(acc);
    }
}

template <typename T>
static __global__ void avgpool_fwd_k(size_t n, struct pool_geom g, size_t c, float inv, const T *x, T *y)
{
    const size_t ohw = (size_t)g.oh * g.ow, hw = (size_t)g.h * g.w;
    FOR_EACH(i, n)
    {
        const size_t ch = i % c, pix = i / c, img = pix / ohw;
        const int r = (int)(pix % ohw), oy = r / g.ow, ox = r % g.ow;
        const T *xi = x + img * hw * c + ch;
        int y0, y1, x0, x1;
        pool_window(g, oy, ox, &y0, &y1, &x0, &x1);
        float acc = 0.0f;
        for (int iy = y0; iy < y1; iy++)
            for (int ix = x0; ix < x1; ix++)
                acc += ldf(xi[(size_t)(iy * g.w + ix) * c]);
        y[i] = stf<T>(acc * inv);
    }
}

template <typename T>
static __global__ void avgpool_bwd_k(size_t n, struct pool_geom g, size_t c, float inv, const T *dy, float beta,
                                     T *dx)
{
    const size_t ohw = (size_t)g.oh * g.ow, hw = (size_t)g.h * g.w;
    FOR_EACH(i, n)
    {
        const size_t ch = i % c, pix = i / c, img = pix / hw;
        const int q = (int)(pix % hw), iy = q / g.w, ix = q % g.w;
        const T *gi = dy + img * ohw * c + ch;
        int oy0, oy1, ox0, ox1;
        pool_cover(iy, g.kh, g.stride, g.pad, g.oh, &oy0, &oy1);
        pool_cover(ix, g.kw, g.stride, g.pad, g.ow, &ox0, &ox1);
        float acc = beta == 0.0f ? 0.0f : beta * ldf(dx[i]);
        for (int oy = oy0; oy < oy1; oy++)
            for (int ox = ox0; ox < ox1; ox++)
                acc += ldf(gi[(size_t)(oy * g.ow + ox) * c]) * inv;
        dx[i] = stf<T>(acc);
    }
}

static size_t out_count(const struct rt_pool_desc *d)
{
    return (size_t)d->in.n * d->in.c * d->oh * d->ow;
}

template <typename T>
static void maxpool_fwd_t(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y)
{
    const size_t n = out_count(d);
    if (n == 0)
        return;
    maxpool_fwd_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, geom_of(d), (size_t)d->in.c, TP(x), TM(y));
    RT_CUDA_LAUNCHED();
}

template <typename T>
static void maxpool_bwd_t(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, const float *y,
                          const float *dy, float beta, float *dx)
{
    (void)y; /* the positions are recomputed from x, which settles ties the way forward did */
    const size_t n = shape_count(d->in);
    if (n == 0)
        return;
    maxpool_bwd_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, geom_of(d), (size_t)d->in.c, TP(x), TP(dy),
                                                                     beta, TM(dx));
    RT_CUDA_LAUNCHED();
}

template <typename T>
static void avgpool_fwd_t(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y)
{
    const size_t n = out_count(d);
    if (n == 0)
        return;
    const float inv = 1.0f / (float)(d->kh * d->kw);
    avgpool_fwd_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, geom_of(d), (size_t)d->in.c, inv, TP(x),
                                                                     TM(y));
    RT_CUDA_LAUNCHED();
}

template <typename T>
static void avgpool_bwd_t(struct rt_stream *s, const struct rt_pool_desc *d, const float *dy, float beta, float *dx)
{
    const size_t n = shape_count(d->in);
    if (n == 0)
        return;
    const float inv = 1.0f / (float)(d->kh * d->kw);
    avgpool_bwd_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, geom_of(d), (size_t)d->in.c, inv, TP(dy),
                                                                     beta, TM(dx));
    RT_CUDA_LAUNCHED();
}

/* ==== global average pooling and flatten ==================================== */

/* j over features (N, C): the plane of (n, c) summed in pixel order. */
template <typename T> static __global__ void gap_fwd_k(size_t n, size_t c, size_t hw, float inv, const T *x, T *y)
{
    FOR_EACH(j, n)
    {
        const size_t img = j / c, ch = j % c;
        const T *xi = x + img * hw * c + ch;
        float acc = 0.0f;
        for (size_t p = 0; p < hw; p++)
            acc += ldf(xi[p * c]);
        y[j] = stf<T>(acc * inv);
    }
}

template <typename T>
static __global__ void gap_bwd_k(size_t n, size_t c, size_t hw, float inv, const T *dy, float beta, T *dx)
{
    FOR_EACH(i, n)
    {
        const size_t img = i / (hw * c), ch = i % c;
        const float v = ldf(dy[img * c + ch]) * inv;
        dx[i] = stf<T>(beta == 0.0f ? v : beta * ldf(dx[i]) + v);
    }
}

template <typename T> static void gap_fwd_t(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y)
{
    const size_t hw = (size_t)sh.h * sh.w, n = (size_t)sh.n * sh.c;
    if (hw == 0 || n == 0)
        return;
    gap_fwd_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, (size_t)sh.c, hw, 1.0f / (float)hw, TP(x),
                                                                 TM(y));
    RT_CUDA_LAUNCHED();
}

template <typename T>
static void gap_bwd_t(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx)
{
    const size_t hw = (size_t)sh.h * sh.w, n = shape_count(sh);
    if (n == 0)
        return;
    gap_bwd_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, (size_t)sh.c, hw, 1.0f / (float)hw, TP(dy),
                                                                 beta, TM(dx));
    RT_CUDA_LAUNCHED();
}

/* Features (N, C*H*W) in PyTorch's (c, h, w) order from NHWC; j over the features. */
template <typename T> static __global__ void flatten_fwd_k(size_t n, size_t c, size_t hw, const T *x, T *y)
{
    FOR_EACH(j, n)
    {
        const size_t img = j / (c * hw), r = j % (c * hw), ch = r / hw, p = r % hw;
        y[j] = x[(img * hw + p) * c + ch];
    }
}

/* i over dx (N, H, W, C). */
template <typename T>
static __global__ void flatten_bwd_k(size_t n, size_t c, size_t hw, const T *dy, float beta, T *dx)
{
    FOR_EACH(i, n)
    {
        const size_t ch = i % c, pix = i / c, img = pix / hw, p = pix % hw;
        const float v = ldf(dy[(img * c + ch) * hw + p]);
        dx[i] = stf<T>(beta == 0.0f ? v : beta * ldf(dx[i]) + v);
    }
}

template <typename T> static void flatten_fwd_t(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y)
{
    const size_t n = shape_count(sh);
    if (n == 0)
        return;
    flatten_fwd_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, (size_t)sh.c, (size_t)sh.h * sh.w, TP(x),
                                                                     TM(y));
    RT_CUDA_LAUNCHED();
}

template <typename T>
static void flatten_bwd_t(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx)
{
    const size_t n = shape_count(sh);
    if (n == 0)
        return;
    flatten_bwd_k<T><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, (size_t)sh.c, (size_t)sh.h * sh.w, TP(dy),
                                                                     beta, TM(dx));
    RT_CUDA_LAUNCHED();
}

/* ==== the table's spatial entries ========================================== */

template <typename T> static void spatial_fill(struct rt_ops *t)
{
    t->to_nchw = to_nchw_t<T>;
    t->from_nchw = from_nchw_t<T>;
    t->input_u8 = input_u8_t<T>;
    t->input_u8_dev = input_u8_dev_t<T>;
    t->bn_train_fwd = bn_train_fwd_t<T>;
    t->bn_infer_fwd = bn_infer_fwd_t<T>;
    t->bn_bwd = bn_bwd_t<T>;
    t->bn_infer_bwd = bn_infer_bwd_t<T>;
    t->maxpool_fwd = maxpool_fwd_t<T>;
    t->maxpool_bwd = maxpool_bwd_t<T>;
    t->avgpool_fwd = avgpool_fwd_t<T>;
    t->avgpool_bwd = avgpool_bwd_t<T>;
    t->gap_fwd = gap_fwd_t<T>;
    t->gap_bwd = gap_bwd_t<T>;
    t->flatten_fwd = flatten_fwd_t<T>;
    t->flatten_bwd = flatten_bwd_t<T>;
}

void rt_cuda_spatial_fill16(struct rt_ops *t, enum rt_dtype dt)
{
    if (dt == RT_BF16)
        spatial_fill<__nv_bfloat16>(t);
    else
        spatial_fill<__half>(t);
}
