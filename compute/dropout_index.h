/*
 * dropout_index.h - which random draw each element of a dropout tensor gets:
 * the one implementation of the mask of compute.h's dropout_fwd/dropout_bwd,
 * shared by the CPU kernel (cpu/elem.c), the CUDA kernels of every table
 * (cuda/elem.cu) and the tests, in C and in CUDA (host and device).
 *
 * The rule. Element (n, c, h, w) of a tensor of logical shape (N, C, H, W)
 * -- element (n, f) of features (N, F), taken as (N, F, 1, 1) -- has the
 * logical index L = ((n*C + c)*H + h)*W + w wherever its layout stores it,
 * and under (seed, offset) it is stream element e = offset + L. It is kept
 * iff u >= p, with u = (w >> 8) * 2^-24 and w word e % 4 of the
 * Philox4x32-10 block with key (seed lo, seed hi) and counter
 * (e/4 lo, e/4 hi, 0, RT_DROPOUT_CTR3); kept elements are scaled by 1/(1-p).
 * Keying on L rather than on the place in memory is what makes the
 * backends' masks agree: the CPU stores spatial tensors (C, N, H, W), or
 * blocked nChw16c when C is a multiple of 16, the CUDA fp32 table NCHW, the
 * CUDA 16-bit tables NHWC.
 *
 * A kernel walks its memory in order, maps each memory index to L with
 * rt_dropout_logical(), and draws with rt_dropout_block() and
 * rt_dropout_mul_of(). rt_dropout_run() says how far memory and L advance
 * together, so that a run shares Philox blocks between 4 consecutive
 * elements instead of computing one block per element. In a layout where
 * neighbours in memory lie far apart in L (NHWC, nChw16c) a kernel can
 * walk an (n, c) plane instead: its H*W elements have consecutive L and lie
 * rt_dropout_plane_step() apart in memory.
 *
 * A model (net.c) gives each dropout node its own (seed, offset) for each
 * micro-batch with rt_dropout_node_draw(), so that no two (stream, node)
 * pairs share a Philox (key, counter).
 *
 * Everything here is a pure function of its arguments (thread-safe, no
 * state). Indices are element counts (uint64_t); shapes must have every
 * dimension >= 1 and memory indices must be below N*C*H*W. Private to the
 * compute module and its tests; not part of the public API.
 */
#ifndef RT_COMPUTE_DROPOUT_INDEX_H
#define RT_COMPUTE_DROPOUT_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "common/philox.h"
#include "compute/compute.h"

#ifdef __CUDACC__
#define RT_DROPOUT_FN static inline __host__ __device__
#else
#define RT_DROPOUT_FN static inline
#endif

/* "drop": the last Philox counter word of dropout draws, keeping them apart
 * from the rt_rng streams (common.h) of the same seed. */
#define RT_DROPOUT_CTR3 0x64726f70u

/* Where element (n, c, h, w) of logical shape (N, C, H, W) lies in memory. */
enum rt_dropout_layout {
    RT_DROPOUT_FEATURES = 0, /* (N, F) row-major as (N, F, 1, 1): n*F + f, every backend */
    RT_DROPOUT_NCHW,         /* ((n*C + c)*H + h)*W + w: the CUDA fp32 table */
    RT_DROPOUT_CNHW,         /* ((c*N + n)*H + h)*W + w: the CPU backend when 16 does not divide C */
    RT_DROPOUT_NHWC,         /* ((n*H + h)*W + w)*C + c: the CUDA 16-bit tables */
    RT_DROPOUT_NCHW16C,      /* (((n*(C/16) + c/16)*H + h)*W + w)*16 + c%16: the CPU backend when 16 divides C */
};

/* The logical index L of the element at memory index i of layout l. */
RT_DROPOUT_FN uint64_t rt_dropout_logical(enum rt_dropout_layout l, struct rt_shape4 sh, uint64_t i)
{
    const uint64_t hw = (uint64_t)sh.h * (uint64_t)sh.w;
    if (l == RT_DROPOUT_CNHW) {
        const uint64_t plane = i / hw, s = i - plane * hw; /* plane = c*N + n, s = h*W + w */
        const uint64_t c = plane / (uint64_t)sh.n, n = plane - c * (uint64_t)sh.n;
        return (n * (uint64_t)sh.c + c) * hw + s;
    }
    if (l == RT_DROPOUT_NHWC) {
        const uint64_t px = i / (uint64_t)sh.c, c = i - px * (uint64_t)sh.c; /* px = n*HW + s */
        const uint64_t n = px / hw, s = px - n * hw;
        return (n * (uint64_t)sh.c + c) * hw + s;
    }
    if (l == RT_DROPOUT_NCHW16C) {
        const uint64_t q = i >> 4, lane = i & 15u; /* q = (n*(C/16) + c/16)*HW + s */
        const uint64_t nb = q / hw, s = q - nb * hw;
        const uint64_t cb = (uint64_t)sh.c >> 4, n = nb / cb, c = ((nb - n * cb) << 4) + lane;
        return (n * (uint64_t)sh.c + c) * hw + s;
    }
    return i; /* NCHW and features are stored in logical order */
}

/*
 * How many elements from memory index i on (i included, at least 1) have
 * logical indices L(i), L(i) + 1, ...: the rest of an (n, c) plane in CNHW,
 * one element in NHWC (unless C = 1) and in nChw16c (unless H*W = 1, where
 * nChw16c is NCHW), the rest of the tensor in NCHW and features. Not
 * necessarily the longest such run.
 */
RT_DROPOUT_FN uint64_t rt_dropout_run(enum rt_dropout_layout l, struct rt_shape4 sh, uint64_t i)
{
    const uint64_t hw = (uint64_t)sh.h * (uint64_t)sh.w;
    const uint64_t total = (uint64_t)sh.n * (uint64_t)sh.c * hw;
    if (l == RT_DROPOUT_CNHW)
        return hw - i % hw;
    if (l == RT_DROPOUT_NHWC && sh.c > 1 && hw > 1)
        return 1;
    if (l == RT_DROPOUT_NCHW16C && hw > 1)
        return 1;
    return total - i;
}

/*
 * The distance in memory from element (n, c, s) of an (n, c) plane to
 * (n, c, s + 1), s = h*W + w: 1 in NCHW, CNHW and features, C in NHWC, 16
 * in nChw16c. So memory indices i, i + step, i + 2 step, ... hold logical
 * indices L(i), L(i) + 1, ... up to the end of i's plane: H*W - L(i) % (H*W)
 * elements, every layout.
 */
RT_DROPOUT_FN uint64_t rt_dropout_plane_step(enum rt_dropout_layout l, struct rt_shape4 sh)
{
    if (l == RT_DROPOUT_NHWC)
        return (uint64_t)sh.c;
    if (l == RT_DROPOUT_NCHW16C)
        return 16;
    return 1;
}

/*
 * The Philox4x32-10 block of stream elements 4 blk .. 4 blk + 3 under
 * `seed`: w[j] is the word of element 4 blk + j; rt_philox4x32() with
 * counter (blk lo, blk hi, 0, RT_DROPOUT_CTR3).
 */
RT_DROPOUT_FN void rt_dropout_block(uint64_t seed, uint64_t blk, uint32_t w[4])
{
    rt_philox4x32_10((uint32_t)seed, (uint32_t)(seed >> 32), (uint32_t)blk, (uint32_t)(blk >> 32), 0u,
                     RT_DROPOUT_CTR3, w);
}

/* The factor `scale` multiplies kept elements by: 1/(1-p), or 0 for p >= 1
 * (everything dropped, as torch returns zeros). Host code computes it once
 * per call, so that every backend rounds the same float expression. */
RT_DROPOUT_FN float rt_dropout_scale(float p)
{
    return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
}

/* The multiplier of the element whose Philox word is w: scale if kept (u >= p), else 0. */
RT_DROPOUT_FN float rt_dropout_mul_of(uint32_t w, float p, float scale)
{
    const float u = (float)(w >> 8) * (1.0f / 16777216.0f);
    return u >= p ? scale : 0.0f;
}

/* The multiplier of stream element e: one Philox block per call, for
 * elements that share no block with their neighbours in memory (NHWC). */
RT_DROPOUT_FN float rt_dropout_mul(uint64_t seed, uint64_t e, float p, float scale)
{
    uint32_t w[4];
    rt_dropout_block(seed, e >> 2, w);
    return rt_dropout_mul_of(w[e & 3], p, scale);
}

/*
 * The multipliers of stream elements e0 .. e0+len-1 under `seed` into
 * mul[0], mul[step], mul[2 step], ...: `scale` where kept, 0 where dropped,
 * one Philox block per 4 consecutive elements (the CPU kernels' scalar path).
 */
RT_DROPOUT_FN void rt_dropout_mask(uint64_t seed, uint64_t e0, size_t len, float p, float scale, float *mul,
                                   size_t step)
{
    size_t j = 0;
    while (j < len) {
        const uint64_t e = e0 + j;
        uint32_t w[4];
        rt_dropout_block(seed, e >> 2, w);
        for (unsigned lane = (unsigned)(e & 3); lane < 4 && j < len; lane++, j++)
            mul[j * step] = rt_dropout_mul_of(w[lane], p, scale);
    }
}

/*
 * Streams and nodes. A micro-batch's dropout stream s (rt_step_opts) and a
 * dropout node's index d in the model (d < RT_DROPOUT_NODES) pick the
 * (seed, offset) that node passes to dropout_fwd / dropout_bwd:
 *
 *   offset = start + (s mod 2^24) * 2^32 + d * 2^56
 *   seed   = model seed XOR rt_dropout_key_mix(s >> 24)
 *
 * and element L of its tensor (start + L < 2^32: net.c refuses larger
 * tensors) is stream element offset + L. Below 2^24 streams the key is the
 * model seed and the offset (s << 32) + (d << 56) + start, bit for bit the
 * rule every earlier run drew its masks by. From 2^24 on, the bits of s that
 * would reach the node's bits (stream 2^24 at node 0 drew stream 0's masks
 * at node 1) go into the Philox key instead: keys differ for different
 * s >> 24 (the mix is a bijection), counters for different
 * (s mod 2^24, d, start + L), so no two (stream, node) pairs of a model share
 * a draw, whatever the 64-bit s. The key rather than counter word 2 carries
 * s >> 24 because the ops take one 64-bit key and one 64-bit offset, and
 * every table's kernel keeps drawing as it did.
 */
#define RT_DROPOUT_NODES 256         /* dropout nodes have indices below this (the offset's top 8 bits) */
#define RT_DROPOUT_STREAM_LO_BITS 24 /* bits of the stream kept in the offset, above its low 32 bits */

/* What one dropout node passes to dropout_fwd / dropout_bwd: the Philox key and the stream element of L = 0. */
struct rt_dropout_draw {
    uint64_t seed;
    uint64_t offset;
};

/* splitmix64's finalizer: a bijection of 64-bit words with mix(0) = 0. */
RT_DROPOUT_FN uint64_t rt_dropout_key_mix(uint64_t h)
{
    h = (h ^ (h >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    h = (h ^ (h >> 27)) * UINT64_C(0x94D049BB133111EB);
    return h ^ (h >> 31);
}

/* Node `node`'s draw in micro-batch stream `stream` under the model seed, its tensors starting at stream element
 * `start` (0 for training; tests use others). node < RT_DROPOUT_NODES (net.c refuses more at build). */
RT_DROPOUT_FN struct rt_dropout_draw rt_dropout_node_draw(uint64_t seed, uint64_t stream, uint32_t start,
                                                          unsigned node)
{
    const uint64_t lo = stream & ((UINT64_C(1) << RT_DROPOUT_STREAM_LO_BITS) - 1);
    struct rt_dropout_draw d;
    d.seed = seed ^ rt_dropout_key_mix(stream >> RT_DROPOUT_STREAM_LO_BITS);
    d.offset = (uint64_t)start + (lo << 32) + ((uint64_t)node << 56);
    return d;
}

/* dropout_fwd/bwd's `stream` (compute.h): with one, (*seed, *offset) -- the model's seed and start + (node << 56)
 * -- become the node's draw for *stream, made where the op runs (a graph's replay); without, they stay. */
RT_DROPOUT_FN void rt_dropout_stream_draw(const uint64_t *stream, uint64_t *seed, uint64_t *offset)
{
    if (!stream)
        return;
    const struct rt_dropout_draw d =
        rt_dropout_node_draw(*seed, *stream, (uint32_t)*offset, (unsigned)(*offset >> 56));
    *seed = d.seed;
    *offset = d.offset;
}

#endif
