/*
 * dnn_kern.cu - the small kernels of the fast path's padded stem (dnn_fast.c): a 16-bit convolution over c
 * input channels, c not a multiple of 8 (the 3-channel image), is computed over cp = c rounded up to 8, so
 * that the tensor-core engines take it. Its input is copied into a zero-padded NHWC scratch, its 16-bit
 * weights are cast with zero pad channels, and the real channels of its weight gradient are added into the
 * fp32 gradient.
 *
 * The index arithmetic of each kernel is a function of dnn_rules.h (host and device), which
 * tests/test_cuda_conv.c --rules checks on the CPU; a kernel only maps its grid onto it. One element per
 * thread: these tensors are small (a stem's input is N*H*W*8 elements, its weights K*R*S*8). Conversions
 * round to nearest even once; the gradient adds are one fp32 addition each, in a fixed order (one per
 * element per call), so results repeat exactly.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "compute/cuda/dnn_priv.h"
#include "compute/cuda/kern.cuh"

#define THREADS 256
#define MAX_BLOCKS ((int64_t)1 << 20)

#define FOR_EACH(i, n)                                                                                           \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

static unsigned grid_for(int64_t n)
{
    const int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b < MAX_BLOCKS ? b : MAX_BLOCKS);
}

template <typename T> static __global__ void pad_x_k(int64_t n, int c, int cp, const T *x, T *xp)
{
    FOR_EACH(i, n)
    {
        const int64_t src = rt_dnn_xpad_src(i, c, cp);
        xp[i] = src < 0 ? stf<T>(0.0f) : x[src];
    }
}

template <typename T> static __global__ void weights_pad_k(int64_t n, int c, int cp, int rs, const float *w, T *out)
{
    FOR_EACH(i, n)
    {
        const int64_t src = rt_dnn_wpad_src(i, c, cp, rs);
        out[i] = stf<T>(src < 0 ? 0.0f : w[src]);
    }
}

template <typename T> static __global__ void dw_acc_pad16_k(int64_t n, int c, int cp, int rs, const T *g, float *dw)
{
    FOR_EACH(i, n)
    {
        dw[i] = __fadd_rn(dw[i], ldf(g[rt_dnn_dwpad16_src(i, c, cp, rs)]));
    }
}

static __global__ void dw_acc_pad32_k(int64_t n, int c, int cp, int rs, const float *g, float *dw)
{
    FOR_EACH(i, n)
    {
        dw[i] = __fadd_rn(dw[i], g[rt_dnn_dwpad32_src(i, c, cp, rs)]);
    }
}

void rt_dnn_pad_x(struct rt_stream *s, enum rt_dtype dt, int64_t pixels, int c, int cp, const void *x, void *xp)
{
    const int64_t n = pixels * cp;
    if (n <= 0)
        return;
    if (dt == RT_BF16)
        pad_x_k<__nv_bfloat16><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(
            n, c, cp, (const __nv_bfloat16 *)x, (__nv_bfloat16 *)xp);
    else
        pad_x_k<__half><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, c, cp, (const __half *)x, (__half *)xp);
    RT_CUDA_LAUNCHED();
}

void rt_dnn_weights_pad(struct rt_stream *s, enum rt_dtype dt, int k, int c, int cp, int rs, const float *w,
                        void *out)
{
    const int64_t n = (int64_t)k * rs * cp;
    if (n <= 0)
        return;
    if (dt == RT_BF16)
        weights_pad_k<__nv_bfloat16><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, c, cp, rs, w,
                                                                                      (__nv_bfloat16 *)out);
    else
        weights_pad_k<__half><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, c, cp, rs, w, (__half *)out);
    RT_CUDA_LAUNCHED();
}

void rt_dnn_dw_acc_pad16(struct rt_stream *s, enum rt_dtype dt, int k, int c, int cp, int rs, const void *g,
                         float *dw)
{
    const int64_t n = (int64_t)k * c * rs;
    if (n <= 0)
        return;
    if (dt == RT_BF16)
        dw_acc_pad16_k<__nv_bfloat16><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(
            n, c, cp, rs, (const __nv_bfloat16 *)g, dw);
    else
        dw_acc_pad16_k<__half><<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, c, cp, rs, (const __half *)g, dw);
    RT_CUDA_LAUNCHED();
}

void rt_dnn_dw_acc_pad32(struct rt_stream *s, int k, int c, int cp, int rs, const float *g, float *dw)
{
    const int64_t n = (int64_t)k * c * rs;
    if (n <= 0)
        return;
    dw_acc_pad32_k<<<grid_for(n), THREADS, 0, rt_cuda_stream(s)>>>(n, c, cp, rs, g, dw);
    RT_CUDA_LAUNCHED();
}
