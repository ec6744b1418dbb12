/*
 * kern.cuh - device helpers shared by the CUDA backend's kernel files:
 * loads and stores of the activation types (fp32, bf16, fp16) through
 * float and pooling-window arithmetic (dropout's Philox draws are
 * compute/dropout_index.h, shared with the CPU). Private to compute/cuda/.
 */
#ifndef RT_COMPUTE_CUDA_KERN_CUH
#define RT_COMPUTE_CUDA_KERN_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* An activation element as float; and a float rounded to nearest even into one. */
static __device__ __forceinline__ float ldf(float v)
{
    return v;
}
static __device__ __forceinline__ float ldf(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}
static __device__ __forceinline__ float ldf(__half v)
{
    return __half2float(v);
}
template <typename T> static __device__ __forceinline__ T stf(float v);
template <> __device__ __forceinline__ float stf<float>(float v)
{
    return v;
}
template <> __device__ __forceinline__ __nv_bfloat16 stf<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half stf<__half>(float v)
{
    return __float2half_rn(v);
}

/* Channels per launch of the input kernels (the trainer takes at most 4); their mean and std
 * travel as a kernel argument: no upload, no device buffer to keep alive. */
#define INPUT_GROUP 4
struct input_norm {
    float mean[INPUT_GROUP], std[INPUT_GROUP];
};

/* Host: the mean and std of channels [c0, c0 + cg), cg <= INPUT_GROUP, the rest zero. */
static inline struct input_norm input_norm_of(const float *mean, const float *std, int c0, int cg)
{
    struct input_norm k = {};
    for (int j = 0; j < cg; j++) {
        k.mean[j] = mean[c0 + j];
        k.std[j] = std[c0 + j];
    }
    return k;
}

struct pool_geom {
    int h, w, kh, kw, stride, pad, oh, ow;
};

/* The window of output (oy, ox) clipped to the plane: rows [*y0, *y1), columns [*x0, *x1). */
static __device__ __forceinline__ void pool_window(const struct pool_geom &g, int oy, int ox, int *y0, int *y1,
                                                   int *x0, int *x1)
{
    const int ys = oy * g.stride - g.pad, xs = ox * g.stride - g.pad;
    *y0 = ys > 0 ? ys : 0;
    *x0 = xs > 0 ? xs : 0;
    *y1 = ys + g.kh < g.h ? ys + g.kh : g.h;
    *x1 = xs + g.kw < g.w ? xs + g.kw : g.w;
}

/* Outputs [*lo, *hi) along one axis whose windows cover input coordinate i. */
static __device__ __forceinline__ void pool_cover(int i, int k, int s, int p, int out, int *lo, int *hi)
{
    const int t = i + p - k + 1; /* window o covers i iff i + p - k < o*s <= i + p */
    *lo = t <= 0 ? 0 : (t + s - 1) / s;
    const int h = (i + p) / s + 1;
    *hi = h < out ? h : out;
}

#endif
