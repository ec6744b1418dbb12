/*
 * philox.h - Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy
 * as 1, 2, 3", SC'11), once, for the host and for CUDA kernels: common.c's
 * rt_philox4x32() and the dropout masks (compute/dropout_index.h) of every
 * backend are this function. Header-only so that nvcc can inline it into
 * device code; no state, no allocation.
 */
#ifndef RT_COMMON_PHILOX_H
#define RT_COMMON_PHILOX_H

#include <stdint.h>

#ifdef __CUDACC__
#define RT_PHILOX_FN __host__ __device__ static inline
#else
#define RT_PHILOX_FN static inline
#endif

/* out = Philox4x32-10(key, ctr): 4 words from a 64-bit key and a 128-bit counter. */
RT_PHILOX_FN void rt_philox4x32_10(uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                   uint32_t out[4])
{
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int round = 0; round < 10; round++) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        const uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        const uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

#endif
