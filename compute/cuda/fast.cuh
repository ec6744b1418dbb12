/*
 * fast.cuh - what the CUDA backend's fast kernels (fast_elem.cu, fast_bn.cu) share: 16-byte vectors of the
 * activation types, element conversions, 32-bit division by a run-time constant without a divide
 * instruction, and the one order in which a block's partial sums are combined. Private to compute/cuda/ and to
 * the nvcc-built CPU tests of the kernel bodies (tests/test_cuda_bodies_*.cu).
 *
 * Everything here is __host__ __device__ except block_tree_sum (it synchronises a block): a kernel's
 * per-vector or per-row body is written once, as a __host__ __device__ function over these helpers, and the
 * __global__ wrapper only maps its grid onto it. The CPU tests call the same bodies for every index of odd
 * shapes, so most indexing, tail and rounding mistakes are found without a GPU (DESIGN.md, "GPU code written
 * without a GPU").
 *
 * Rounding: element loads widen to float exactly; stores round to nearest even once (__float2bfloat16_rn,
 * __float2half_rn, which have host implementations with the device's results). Float arithmetic in a body
 * that must match the CPU backend or a reference kernel bit for bit is spelled with the _rn intrinsics where a
 * contraction into a fused multiply-add would change it: nvcc contracts a * b + c on the device, and the host
 * side of these bodies is compiled by the host compiler, which may not; the intrinsics pin both.
 */
#ifndef RT_COMPUTE_CUDA_FAST_CUH
#define RT_COMPUTE_CUDA_FAST_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define RT_HD __host__ __device__ __forceinline__

/* Fully unrolls the loop that follows on the device, so that the register arrays it walks are indexed by
 * constants (a run-time index puts them in local memory); nothing on the host, whose compiler rejects the
 * pragma under -Werror. */
#ifdef __CUDA_ARCH__
#define FK_UNROLL _Pragma("unroll")
#else
#define FK_UNROLL
#endif

/* ---- elements ----------------------------------------------------------------------------------------- */

/* An activation element as float (exact), and a float rounded to nearest even into one. */
RT_HD float fk_ld(float v)
{
    return v;
}
RT_HD float fk_ld(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}
RT_HD float fk_ld(__half v)
{
    return __half2float(v);
}
template <typename T> RT_HD T fk_st(float v);
template <> RT_HD float fk_st<float>(float v)
{
    return v;
}
template <> RT_HD __nv_bfloat16 fk_st<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}
template <> RT_HD __half fk_st<__half>(float v)
{
    return __float2half_rn(v);
}

/*
 * Arithmetic with one rounding each, on the device and on the host alike: fk_add, fk_sub, fk_mul, fk_div in
 * float, fk_dadd, fk_dsub, fk_dmul, fk_ddiv in double (the per-channel scalars that must round as the CPU's
 * double code does); fk_dsqrt and fk_dfma (a * b + c rounded once) in double. On the host the result goes through
 * a volatile, so that no contraction across the statement can fuse it with its neighbours either.
 */
#ifdef __CUDA_ARCH__
#define FK_RN_BINARY(name, T, dev, op)                                                                             \
    RT_HD T name(T a, T b)                                                                                         \
    {                                                                                                              \
        return dev(a, b);                                                                                          \
    }
#else
#define FK_RN_BINARY(name, T, dev, op)                                                                             \
    RT_HD T name(T a, T b)                                                                                         \
    {                                                                                                              \
        volatile T r = a op b;                                                                                     \
        return r;                                                                                                  \
    }
#endif
FK_RN_BINARY(fk_add, float, __fadd_rn, +)
FK_RN_BINARY(fk_sub, float, __fsub_rn, -)
FK_RN_BINARY(fk_mul, float, __fmul_rn, *)
FK_RN_BINARY(fk_div, float, __fdiv_rn, /)
FK_RN_BINARY(fk_dadd, double, __dadd_rn, +)
FK_RN_BINARY(fk_dsub, double, __dsub_rn, -)
FK_RN_BINARY(fk_dmul, double, __dmul_rn, *)
FK_RN_BINARY(fk_ddiv, double, __ddiv_rn, /)
#undef FK_RN_BINARY

RT_HD double fk_dsqrt(double a)
{
#ifdef __CUDA_ARCH__
    return __dsqrt_rn(a);
#else
    return sqrt(a);
#endif
}

RT_HD double fk_dfma(double a, double b, double c)
{
#ifdef __CUDA_ARCH__
    return __fma_rn(a, b, c);
#else
    return fma(a, b, c);
#endif
}

/* ---- 16-byte vectors ---------------------------------------------------------------------------------- */

/* FK_VEC(T) elements of T in 16 bytes: 4 floats, 8 bf16 or fp16. */
#define FK_VEC(T) ((int)(16 / sizeof(T)))

template <typename T> struct alignas(16) fk_pack {
    T v[16 / sizeof(T)];
};

/* One 16-byte load or store: p must be 16-byte aligned (fk_aligned). A plain load, not __ldg: the fast
 * kernels may write what they read (in-place ReLU). */
template <typename T> RT_HD fk_pack<T> fk_load(const T *p)
{
    fk_pack<T> r;
#ifdef __CUDA_ARCH__
    const int4 raw = *reinterpret_cast<const int4 *>(p);
    memcpy(&r, &raw, 16);
#else
    memcpy(&r, p, 16);
#endif
    return r;
}
template <typename T> RT_HD void fk_store(T *p, const fk_pack<T> &v)
{
#ifdef __CUDA_ARCH__
    int4 raw;
    memcpy(&raw, &v, 16);
    *reinterpret_cast<int4 *>(p) = raw;
#else
    memcpy((void *)p, &v, 16); /* T is a class type for bf16/fp16: bytes, not an assignment */
#endif
}

/* 1 when p is 16-byte aligned (NULL counts as aligned: an absent operand). */
RT_HD int fk_aligned(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

/* ---- division by a run-time constant ------------------------------------------------------------------ */

/*
 * n / d and n % d for 32-bit n < 2^31 and d >= 1 by a multiply-high, a add and a shift (the magic-number
 * method; Granlund and Montgomery, "Division by invariant integers using multiplication", 1994): made once on
 * the host per launch (fk_divider_of), used per vector or per row on the device. Exact for every n < 2^31.
 */
struct fk_divider {
    uint32_t d, m, s;
};

static inline fk_divider fk_divider_of(uint32_t d)
{
    fk_divider f;
    f.d = d;
    uint32_t s = 0;
    while (s < 32 && ((uint64_t)1 << s) < d)
        s++;
    f.s = s;
    /* m = floor(2^32 (2^s - d) / d) + 1 */
    f.m = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << s) - d)) / d + 1);
    return f;
}

RT_HD uint32_t fk_umulhi(uint32_t a, uint32_t b)
{
#ifdef __CUDA_ARCH__
    return __umulhi(a, b);
#else
    return (uint32_t)(((uint64_t)a * b) >> 32);
#endif
}

RT_HD uint32_t fk_div_u32(const fk_divider &f, uint32_t n)
{
    return (fk_umulhi(n, f.m) + n) >> f.s;
}

RT_HD uint32_t fk_mod_u32(const fk_divider &f, uint32_t n)
{
    return n - fk_div_u32(f, n) * f.d;
}

/* ---- the order of a block's sums ---------------------------------------------------------------------- */

/*
 * A block of FK_THREADS threads combines one value per thread in one fixed order, written here once: within
 * each warp the butterfly xor 16, 8, 4, 2, 1 (each step adds the same two values in both lanes of a pair, so
 * every lane ends with the same bits), then the warps' totals by a tree over warp indices (w = warps/2, ..., 1:
 * total[i] += total[i + w] for i < w). The device runs it in block_tree_sum; the CPU tests replay it with
 * fk_tree_sum_replay over the same per-thread values and get the same bits. A missing thread's value is 0,
 * which changes no sum.
 */
#define FK_THREADS 256
#define FK_WARPS (FK_THREADS / 32)

/* The replay: v[0 .. FK_THREADS) per-thread values (overwritten). */
template <typename A> static inline A fk_tree_sum_replay(A *v)
{
    for (int w = 0; w < FK_WARPS; w++) {
        A *lane = v + 32 * w;
        for (int o = 16; o > 0; o >>= 1) {
            A next[32];
            for (int l = 0; l < 32; l++)
                next[l] = lane[l] + lane[l ^ o];
            for (int l = 0; l < 32; l++)
                lane[l] = next[l];
        }
    }
    A tot[FK_WARPS];
    for (int w = 0; w < FK_WARPS; w++)
        tot[w] = v[32 * w];
    for (int h = FK_WARPS / 2; h > 0; h >>= 1)
        for (int i = 0; i < h; i++)
            tot[i] += tot[i + h];
    return tot[0];
}

#ifdef __CUDACC__
/* The device side: every thread of the (FK_THREADS, 1, 1) block calls it; every thread gets the total. `sh`
 * holds FK_WARPS values of shared memory, free again when it returns. */
template <typename A> static __device__ __forceinline__ A block_tree_sum(A v, A *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    const unsigned w = threadIdx.x / 32;
    if ((threadIdx.x & 31u) == 0)
        sh[w] = v;
    __syncthreads();
    for (unsigned h = FK_WARPS / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h)
            sh[threadIdx.x] += sh[threadIdx.x + h];
        __syncthreads();
    }
    const A total = sh[0];
    __syncthreads();
    return total;
}
#endif

#endif
