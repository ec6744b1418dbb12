/*
 * convert.c - Converter: what a CPU batch becomes at hand-over when the
 * Python Loader asks for floats -- its uint8 images (B, C, H, W) as float32
 * or bfloat16, each (v / 255 - mean[c]) / std[c] (rt_norm_lut's expression,
 * the trainer's input op bit for bit in float32; bfloat16 is that rounded to
 * nearest even), laid out NCHW or NHWC (channels_last), written into memory
 * the caller owns (the tensor handed to the user).
 *
 * What makes it fast changes no bit of the result:
 *   - vector kernels instead of one table lookup per value: with AVX-512
 *     VBMI the table itself, 64 values at a time by byte permutes; with
 *     AVX-512F alone the expression, 16 at a time, each division made exact
 *     by one FMA correction and checked against the table for all 256 values
 *     of every channel when the Converter is made (the table where one
 *     differs, and on other CPUs). For NHWC with 3 channels the three planes
 *     are read together and written as contiguous pixels;
 *   - a batch is cut into chunks of images that the calling thread and the
 *     Converter's own helper threads claim (threads - 1 of them, started at
 *     the first batch, asleep on a condition variable between batches: no
 *     spinning on CPUs the loader's workers share; the caller never waits
 *     for a helper that has not started);
 *   - tensor() writes into buffers of its own that come back when torch
 *     frees the tensor, instead of fresh memory whose pages fault in on
 *     every batch.
 *
 * It holds no batch slot beyond the call and converts nothing twice: run()
 * and tensor() return when the whole batch is written.
 */
#include <dlpack/dlpack.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define CV_X86 1
#else
#define CV_X86 0
#endif

#include "common/common.h"
#include "python/src/ext.h"

PyTypeObject *ext_converter_type;

#define CV_MAX_C 4
#define CV_MAX_THREADS 64
/* Values per chunk a thread claims (at least one image): a few microseconds of work. */
#define CV_CHUNK ((size_t)24576)

/* ---- the kernels ---------------------------------------------------------------------- */

enum cv_kernel {
    CV_TABLE,                     /* one lookup per value: any CPU, any layout */
    CV_AVX512,                    /* the expression, 16 values at a time (AVX-512F) */
    CV_VBMI,                      /* the table by byte permutes, 64 values at a time (AVX-512 VBMI) */
};

struct cv_plan {
    uint32_t c;
    int bf16, nhwc;
    enum cv_kernel kernel;
    float mean[CV_MAX_C], sd[CV_MAX_C], rsd[CV_MAX_C];
    float lut[CV_MAX_C * 256];
    uint16_t lut16[CV_MAX_C * 256];
    uint8_t bytes[CV_MAX_C][4][256]; /* CV_VBMI: byte k of each value of lut (float32) or lut16 (k < 2) */
};

/* float -> bfloat16, rounded to nearest even (the table's values are finite). */
static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Images [n0, n1) through the table: planes for NCHW, pixel by pixel (contiguous writes) for NHWC. */
static void cv_run_table(const struct cv_plan *p, const uint8_t *src, void *dst, size_t n0, size_t n1, size_t hw)
{
    const size_t C = p->c;
    for (size_t n = n0; n < n1; n++) {
        const uint8_t *in = src + n * C * hw;
        if (p->nhwc) {
            for (size_t i = 0; i < hw; i++)
                for (size_t ch = 0; ch < C; ch++) {
                    const size_t o = (n * hw + i) * C + ch, v = ch * 256 + in[ch * hw + i];
                    if (p->bf16)
                        ((uint16_t *)dst)[o] = p->lut16[v];
                    else
                        ((float *)dst)[o] = p->lut[v];
                }
            continue;
        }
        for (size_t ch = 0; ch < C; ch++) {
            const uint8_t *pl = in + ch * hw;
            const size_t base = (n * C + ch) * hw;
            if (p->bf16)
                for (size_t i = 0; i < hw; i++)
                    ((uint16_t *)dst)[base + i] = p->lut16[ch * 256 + pl[i]];
            else
                for (size_t i = 0; i < hw; i++)
                    ((float *)dst)[base + i] = p->lut[ch * 256 + pl[i]];
        }
    }
}

#if CV_X86
#define CV_TARGET_AVX512 __attribute__((target("avx512f")))

/*
 * 16 bytes -> ((float)v / 255 - mean) / sd. Each quotient a / b is a * (1 / b)
 * corrected once with the exact residual a - q * b (one FMA), which gives
 * the correctly rounded quotient for these operands in all but rare cases;
 * cv_plan_init checks every value against the table and does not use this
 * where one differs. (C17 without GNU extensions: no contraction of the
 * separate multiply and subtract.)
 */
static inline CV_TARGET_AVX512 __m512 cv_norm16(__m128i v8, __m512 mean, __m512 sd, __m512 rsd)
{
    const __m512 k255 = _mm512_set1_ps(255.0f), r255 = _mm512_set1_ps(1.0f / 255.0f);
    const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v8));
    __m512 q = _mm512_mul_ps(x, r255);
    q = _mm512_fmadd_ps(_mm512_fnmadd_ps(q, k255, x), r255, q);
    const __m512 d = _mm512_sub_ps(q, mean);
    const __m512 y = _mm512_mul_ps(d, rsd);
    return _mm512_fmadd_ps(_mm512_fnmadd_ps(y, sd, d), rsd, y);
}

/* bf16_of on 16 lanes. */
static inline CV_TARGET_AVX512 __m256i cv_bf16x16(__m512 y)
{
    const __m512i u = _mm512_castps_si512(y);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

static inline CV_TARGET_AVX512 void cv_store16(void *dst, size_t at, int bf16, __m512 y)
{
    if (bf16)
        _mm256_storeu_si256((__m256i *)((uint16_t *)dst + at), cv_bf16x16(y));
    else
        _mm512_storeu_ps((float *)dst + at, y);
}

/* 1 when cv_norm16 gives lut[ch * 256 + v] for every channel and value. */
static CV_TARGET_AVX512 int cv_simd_exact(const struct cv_plan *p)
{
    for (uint32_t ch = 0; ch < p->c; ch++) {
        const __m512 m = _mm512_set1_ps(p->mean[ch]), s = _mm512_set1_ps(p->sd[ch]), r = _mm512_set1_ps(p->rsd[ch]);
        for (int v = 0; v < 256; v += 16) {
            uint8_t in[16];
            float out[16];
            for (int i = 0; i < 16; i++)
                in[i] = (uint8_t)(v + i);
            _mm512_storeu_ps(out, cv_norm16(_mm_loadu_si128((const __m128i *)in), m, s, r));
            if (memcmp(out, p->lut + ch * 256 + v, sizeof(out)) != 0)
                return 0;
        }
    }
    return 1;
}

/* Pixels [i0, hw) of a 3-plane image (planes a, b, c) through the table, as NHWC values from dst[o] on: what the
 * vector kernels leave past their last full vector. */
static inline void cv_tail_nhwc3(const struct cv_plan *p, const uint8_t *a, const uint8_t *b, const uint8_t *c,
                                 size_t i0, size_t hw, void *dst, size_t o)
{
    for (size_t i = i0; i < hw; i++)
        for (size_t ch = 0; ch < 3; ch++) {
            const size_t at = o + 3 * i + ch, v = ch * 256 + (ch == 0 ? a : ch == 1 ? b : c)[i];
            if (p->bf16)
                ((uint16_t *)dst)[at] = p->lut16[v];
            else
                ((float *)dst)[at] = p->lut[v];
        }
}

/*
 * Images [n0, n1) with cv_norm16: NCHW plane by plane; NHWC with 3 channels
 * 16 pixels of the three planes at a time, interleaved by two-source permutes
 * into 48 contiguous values; NHWC with 1 channel is NCHW. Tails of fewer
 * than 16 pixels through the table (the same bits).
 */
static inline __attribute__((always_inline)) CV_TARGET_AVX512 void cv_simd(const struct cv_plan *p, const int bf16,
                                                                      const uint8_t *src, void *dst, size_t n0,
                                                                      size_t n1, size_t hw)
{
    const size_t C = p->c, body = hw & ~(size_t)15;
    __m512 m[CV_MAX_C], s[CV_MAX_C], r[CV_MAX_C];
    for (size_t ch = 0; ch < C; ch++) {
        m[ch] = _mm512_set1_ps(p->mean[ch]);
        s[ch] = _mm512_set1_ps(p->sd[ch]);
        r[ch] = _mm512_set1_ps(p->rsd[ch]);
    }
    if (!p->nhwc || C == 1) {
        for (size_t pl = n0 * C; pl < n1 * C; pl++) {
            const size_t ch = pl % C;
            const uint8_t *in = src + pl * hw;
            for (size_t i = 0; i < body; i += 16)
                cv_store16(dst, pl * hw + i, bf16,
                           cv_norm16(_mm_loadu_si128((const __m128i *)(in + i)), m[ch], s[ch], r[ch]));
            for (size_t i = body; i < hw; i++) {
                if (bf16)
                    ((uint16_t *)dst)[pl * hw + i] = p->lut16[ch * 256 + in[i]];
                else
                    ((float *)dst)[pl * hw + i] = p->lut[ch * 256 + in[i]];
            }
        }
        return;
    }
    /* Output vector k (values 16k .. 16k+15 of 48) holds pixel j / 3, channel j % 3 at lane j - 16k: the
     * first permute takes channels 0 and 1 (lanes of a and b), the second puts channel 2 (lanes of c) in. */
    int32_t i01[3][16], i2[3][16];
    for (int k = 0; k < 3; k++)
        for (int l = 0; l < 16; l++) {
            const int j = 16 * k + l, px = j / 3, ch = j % 3;
            i01[k][l] = ch == 0 ? px : ch == 1 ? 16 + px : 0;
            i2[k][l] = ch == 2 ? 16 + px : l;
        }
    __m512i x01[3], x2[3];
    for (int k = 0; k < 3; k++) {
        x01[k] = _mm512_loadu_si512(i01[k]);
        x2[k] = _mm512_loadu_si512(i2[k]);
    }
    for (size_t n = n0; n < n1; n++) {
        const uint8_t *a = src + n * 3 * hw, *b = a + hw, *c = b + hw;
        const size_t o = n * hw * 3;
        for (size_t i = 0; i < body; i += 16) {
            const __m512 va = cv_norm16(_mm_loadu_si128((const __m128i *)(a + i)), m[0], s[0], r[0]);
            const __m512 vb = cv_norm16(_mm_loadu_si128((const __m128i *)(b + i)), m[1], s[1], r[1]);
            const __m512 vc = cv_norm16(_mm_loadu_si128((const __m128i *)(c + i)), m[2], s[2], r[2]);
            for (int k = 0; k < 3; k++) {
                const __m512 t = _mm512_permutex2var_ps(va, x01[k], vb);
                cv_store16(dst, o + 3 * i + 16 * (size_t)k, bf16, _mm512_permutex2var_ps(t, x2[k], vc));
            }
        }
        cv_tail_nhwc3(p, a, b, c, body, hw, dst, o);
    }
}

/* cv_simd compiled once per output type (bf16 a constant in each: no test in the loops). */
static CV_TARGET_AVX512 void cv_run_simd(const struct cv_plan *p, const uint8_t *src, void *dst, size_t n0, size_t n1,
                                  size_t hw)
{
    if (p->bf16)
        cv_simd(p, 1, src, dst, n0, n1, hw);
    else
        cv_simd(p, 0, src, dst, n0, n1, hw);
}

/*
 * The table itself, 64 values at a time: each byte of a table value is a
 * 256-entry byte table, looked up with two 128-entry byte permutes and a
 * blend on the index's top bit; unpacking the 4 (float32) or 2 (bfloat16)
 * byte vectors gives the values. The unpacks work within 128-bit lanes, so
 * the 64 indices are first permuted into the order that makes their
 * output come out in pixel order. Exact by construction (no check needed),
 * and about a third fewer instructions than the expression.
 */
#define CV_TARGET_VBMI __attribute__((target("avx512f,avx512bw,avx512vbmi")))

/* t[0..255] at each of the 64 byte indices of idx. */
static inline CV_TARGET_VBMI __m512i cv_look(const uint8_t *t, __m512i idx)
{
    const __m512i lo = _mm512_permutex2var_epi8(_mm512_loadu_si512(t), idx, _mm512_loadu_si512(t + 64));
    const __m512i hi = _mm512_permutex2var_epi8(_mm512_loadu_si512(t + 128), idx, _mm512_loadu_si512(t + 192));
    return _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi);
}

/* 64 pixels of channel ch (idx in cv_vbmi_order): v[0..3] 16 floats each, or v[0..1] 32 bfloat16 each, in order. */
static inline CV_TARGET_VBMI void cv_vbmi64(const struct cv_plan *p, const int bf16, size_t ch, __m512i idx,
                                             __m512i v[4])
{
    const __m512i b0 = cv_look(p->bytes[ch][0], idx), b1 = cv_look(p->bytes[ch][1], idx);
    if (bf16) {
        v[0] = _mm512_unpacklo_epi8(b0, b1);
        v[1] = _mm512_unpackhi_epi8(b0, b1);
        return;
    }
    const __m512i b2 = cv_look(p->bytes[ch][2], idx), b3 = cv_look(p->bytes[ch][3], idx);
    const __m512i l01 = _mm512_unpacklo_epi8(b0, b1), h01 = _mm512_unpackhi_epi8(b0, b1);
    const __m512i l23 = _mm512_unpacklo_epi8(b2, b3), h23 = _mm512_unpackhi_epi8(b2, b3);
    v[0] = _mm512_unpacklo_epi16(l01, l23);
    v[1] = _mm512_unpackhi_epi16(l01, l23);
    v[2] = _mm512_unpacklo_epi16(h01, h23);
    v[3] = _mm512_unpackhi_epi16(h01, h23);
}

static inline __attribute__((always_inline)) CV_TARGET_VBMI void cv_vbmi(const struct cv_plan *p, const int bf16,
                                                                   const uint8_t *src, void *dst, size_t n0,
                                                                   size_t n1, size_t hw)
{
    const size_t C = p->c, body = hw & ~(size_t)63, esize = bf16 ? 2 : 4;
    /* Byte position -> pixel: float32 vector q, 128-bit lane L, dword d is byte 16L + 4q + d of the unpacks'
     * input; bfloat16 vector h, lane L, word d is byte 16L + 8h + d. */
    uint8_t order[64];
    for (int L = 0; L < 4; L++)
        for (int j = 0; j < 16; j++)
            order[16 * L + j] = (uint8_t)(bf16 ? 32 * (j / 8) + 8 * L + j % 8 : 16 * (j / 4) + 4 * L + j % 4);
    const __m512i ord = _mm512_loadu_si512(order);
    const size_t per = 64 / esize; /* values per output vector: 16 floats or 32 bfloat16 */
    if (!p->nhwc || C == 1) {
        for (size_t pl = n0 * C; pl < n1 * C; pl++) {
            const size_t ch = pl % C;
            const uint8_t *in = src + pl * hw;
            char *out = (char *)dst + pl * hw * esize;
            for (size_t i = 0; i < body; i += 64) {
                __m512i v[4];
                cv_vbmi64(p, bf16, ch, _mm512_permutexvar_epi8(ord, _mm512_loadu_si512(in + i)), v);
                for (size_t q = 0; q < 64 / per; q++)
                    _mm512_storeu_si512(out + (i + q * per) * esize, v[q]);
            }
            for (size_t i = body; i < hw; i++) {
                if (bf16)
                    ((uint16_t *)out)[i] = p->lut16[ch * 256 + in[i]];
                else
                    ((float *)out)[i] = p->lut[ch * 256 + in[i]];
            }
        }
        return;
    }
    /* NHWC, 3 channels: output vector k of a group of `per` pixels holds value j = per * k + l (pixel j / 3,
     * channel j % 3) at lane l; channels 0 and 1 by one two-source permute, channel 2 put in by a second. */
    __m512i x01[3], x2[3];
    if (bf16) {
        int16_t i01[3][32], i2[3][32];
        for (int k = 0; k < 3; k++)
            for (int l = 0; l < 32; l++) {
                const int j = 32 * k + l, px = j / 3, ch = j % 3;
                i01[k][l] = (int16_t)(ch == 0 ? px : ch == 1 ? 32 + px : 0);
                i2[k][l] = (int16_t)(ch == 2 ? 32 + px : l);
            }
        for (int k = 0; k < 3; k++) {
            x01[k] = _mm512_loadu_si512(i01[k]);
            x2[k] = _mm512_loadu_si512(i2[k]);
        }
    } else {
        int32_t i01[3][16], i2[3][16];
        for (int k = 0; k < 3; k++)
            for (int l = 0; l < 16; l++) {
                const int j = 16 * k + l, px = j / 3, ch = j % 3;
                i01[k][l] = ch == 0 ? px : ch == 1 ? 16 + px : 0;
                i2[k][l] = ch == 2 ? 16 + px : l;
            }
        for (int k = 0; k < 3; k++) {
            x01[k] = _mm512_loadu_si512(i01[k]);
            x2[k] = _mm512_loadu_si512(i2[k]);
        }
    }
    for (size_t n = n0; n < n1; n++) {
        const uint8_t *a = src + n * 3 * hw, *b = a + hw, *c = b + hw;
        char *out = (char *)dst + n * hw * 3 * esize;
        for (size_t i = 0; i < body; i += 64) {
            __m512i va[4], vb[4], vc[4];
            cv_vbmi64(p, bf16, 0, _mm512_permutexvar_epi8(ord, _mm512_loadu_si512(a + i)), va);
            cv_vbmi64(p, bf16, 1, _mm512_permutexvar_epi8(ord, _mm512_loadu_si512(b + i)), vb);
            cv_vbmi64(p, bf16, 2, _mm512_permutexvar_epi8(ord, _mm512_loadu_si512(c + i)), vc);
            for (size_t q = 0; q < 64 / per; q++)
                for (int k = 0; k < 3; k++) {
                    char *at = out + (3 * (i + q * per) + (size_t)k * per) * esize;
                    if (bf16) {
                        const __m512i t = _mm512_permutex2var_epi16(va[q], x01[k], vb[q]);
                        _mm512_storeu_si512(at, _mm512_permutex2var_epi16(t, x2[k], vc[q]));
                    } else {
                        const __m512i t = _mm512_permutex2var_epi32(va[q], x01[k], vb[q]);
                        _mm512_storeu_si512(at, _mm512_permutex2var_epi32(t, x2[k], vc[q]));
                    }
                }
        }
        cv_tail_nhwc3(p, a, b, c, body, hw, out, 0);
    }
}

static CV_TARGET_VBMI void cv_run_vbmi(const struct cv_plan *p, const uint8_t *src, void *dst, size_t n0, size_t n1,
                                size_t hw)
{
    if (p->bf16)
        cv_vbmi(p, 1, src, dst, n0, n1, hw);
    else
        cv_vbmi(p, 0, src, dst, n0, n1, hw);
}
#endif

/* Checks and tables; 0, or -EINVAL (channels not 1..4, a std not positive). */
static int cv_plan_init(struct cv_plan *p, uint32_t c, const float *mean, const float *sd, int bf16, int nhwc)
{
    if (c < 1 || c > CV_MAX_C)
        return -EINVAL;
    memset(p, 0, sizeof(*p));
    p->c = c;
    p->bf16 = bf16;
    p->nhwc = nhwc;
    for (uint32_t ch = 0; ch < c; ch++) {
        if (!(sd[ch] > 0))
            return -EINVAL;
        p->mean[ch] = mean[ch];
        p->sd[ch] = sd[ch];
        p->rsd[ch] = 1.0f / sd[ch];
    }
    rt_norm_lut(c, p->mean, p->sd, p->lut);
    for (uint32_t i = 0; bf16 && i < c * 256; i++)
        p->lut16[i] = bf16_of(p->lut[i]);
    for (uint32_t ch = 0; ch < c; ch++)
        for (int v = 0; v < 256; v++) {
            uint32_t u = bf16 ? p->lut16[ch * 256 + v] : 0;
            if (!bf16)
                memcpy(&u, &p->lut[ch * 256 + v], sizeof(u));
            for (int k = 0; k < 4; k++)
                p->bytes[ch][k][v] = (uint8_t)(u >> (8 * k));
        }
    p->kernel = CV_TABLE;
#if CV_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && (!nhwc || c == 1 || c == 3)) {
        if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi"))
            p->kernel = CV_VBMI;
        else if (cv_simd_exact(p))
            p->kernel = CV_AVX512;
    }
#endif
    return 0;
}

/*
 * Another kernel than the plan's own choice, for tests: "table", "avx512"
 * (where the CPU has it, and only if exact for these constants: else the
 * table) or "avx512vbmi". 0, or -ENOTSUP when the CPU lacks it.
 */
static int cv_plan_force(struct cv_plan *p, const char *name)
{
    if (!strcmp(name, "table")) {
        p->kernel = CV_TABLE;
        return 0;
    }
#if CV_X86
    const int layout = !p->nhwc || p->c == 1 || p->c == 3;
    if (!strcmp(name, "avx512") && layout && __builtin_cpu_supports("avx512f")) {
        p->kernel = cv_simd_exact(p) ? CV_AVX512 : CV_TABLE;
        return 0;
    }
    if (!strcmp(name, "avx512vbmi") && layout && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi")) {
        p->kernel = CV_VBMI;
        return 0;
    }
#endif
    return -ENOTSUP;
}

static void cv_plan_run(const struct cv_plan *p, const uint8_t *src, void *dst, size_t n0, size_t n1, size_t hw)
{
#if CV_X86
    if (p->kernel == CV_VBMI) {
        cv_run_vbmi(p, src, dst, n0, n1, hw);
        return;
    }
    if (p->kernel == CV_AVX512) {
        cv_run_simd(p, src, dst, n0, n1, hw);
        return;
    }
#endif
    cv_run_table(p, src, dst, n0, n1, hw);
}

/* ---- the helper threads --------------------------------------------------------------- */

/*
 * A batch is cut into chunks of a few images that the calling thread and
 * the helpers claim one at a time, so the caller never waits for a helper
 * that has not woken up (on CPUs shared with the loader's workers a woken
 * thread may not run for a while): it converts what nobody claimed and
 * waits only for the chunks in flight. A claim names its job's generation,
 * so a helper that wakes late cannot take a chunk of a later job with the
 * pointers of an earlier one.
 */
struct cv_job {
    const uint8_t *src;
    void *dst;
    size_t n, hw;
    uint32_t per, chunks;         /* images per chunk, chunks */
};

struct cv_pool {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    const struct cv_plan *plan;
    struct cv_job job;            /* the current job, under mu */
    uint32_t gen;                 /* bumped for each job, under mu */
    _Atomic uint64_t claim;       /* gen << 32 | the next unclaimed chunk */
    atomic_uint finished;         /* chunks of the current job written */
    uint32_t helpers;             /* started */
    int stop;
    pthread_t th[CV_MAX_THREADS];
};

/* Claims and converts chunks of job `gen` until none is left. */
static void cv_work(struct cv_pool *pool, const struct cv_job *j, uint32_t gen)
{
    uint64_t c = atomic_load(&pool->claim);
    for (;;) {
        if ((uint32_t)(c >> 32) != gen || (uint32_t)c >= j->chunks)
            return;
        if (!atomic_compare_exchange_weak(&pool->claim, &c, c + 1))
            continue;
        const size_t n0 = (size_t)(uint32_t)c * j->per, n1 = n0 + j->per < j->n ? n0 + j->per : j->n;
        cv_plan_run(pool->plan, j->src, j->dst, n0, n1, j->hw);
        if (atomic_fetch_add(&pool->finished, 1) + 1 == j->chunks) {
            pthread_mutex_lock(&pool->mu);
            pthread_cond_signal(&pool->done);
            pthread_mutex_unlock(&pool->mu);
        }
        c = atomic_load(&pool->claim);
    }
}

static void *cv_helper_main(void *arg)
{
    struct cv_pool *pool = arg;
    uint32_t seen = 0;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (pool->gen == seen && !pool->stop)
            pthread_cond_wait(&pool->go, &pool->mu);
        if (pool->stop)
            break;
        seen = pool->gen;
        const struct cv_job job = pool->job;
        pthread_mutex_unlock(&pool->mu);
        cv_work(pool, &job, seen);
        pthread_mutex_lock(&pool->mu);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

/*
 * A pool of up to `helpers` threads for `plan` (borrowed: it outlives the
 * pool), or NULL when none could be started. The threads block every signal:
 * Ctrl-C goes to Python's thread.
 */
static struct cv_pool *cv_pool_create(const struct cv_plan *plan, uint32_t helpers)
{
    struct cv_pool *pool = calloc(1, sizeof(*pool));
    if (!pool)
        return NULL;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->go, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->plan = plan;
    atomic_init(&pool->claim, 0);
    atomic_init(&pool->finished, 0);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (uint32_t i = 0; i < helpers && i < CV_MAX_THREADS; i++) {
        if (pthread_create(&pool->th[i], NULL, cv_helper_main, pool) != 0)
            break;
        pool->helpers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!pool->helpers) {
        pthread_cond_destroy(&pool->done);
        pthread_cond_destroy(&pool->go);
        pthread_mutex_destroy(&pool->mu);
        free(pool);
        return NULL;
    }
    return pool;
}

/* Stops and joins the helpers; NULL is fine. Not in a forked child (the threads are not there). */
static void cv_pool_destroy(struct cv_pool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->go);
    pthread_mutex_unlock(&pool->mu);
    for (uint32_t i = 0; i < pool->helpers; i++)
        pthread_join(pool->th[i], NULL);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->go);
    pthread_mutex_destroy(&pool->mu);
    free(pool);
}

/* Runs `job` on this thread and the helpers that join in; returns when every chunk is written. One job at a time. */
static void cv_pool_run(struct cv_pool *pool, const struct cv_job *job)
{
    pthread_mutex_lock(&pool->mu);
    const uint32_t gen = ++pool->gen;
    pool->job = *job;
    atomic_store(&pool->finished, 0);
    atomic_store(&pool->claim, (uint64_t)gen << 32);
    pthread_cond_broadcast(&pool->go);
    pthread_mutex_unlock(&pool->mu);
    cv_work(pool, job, gen);
    if (atomic_load(&pool->finished) == job->chunks)
        return;
    pthread_mutex_lock(&pool->mu);
    while (atomic_load(&pool->finished) != job->chunks)
        pthread_cond_wait(&pool->done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}

/* ---- the tensors' memory --------------------------------------------------------------- */

/*
 * The memory of the tensors tensor() hands out: a tensor's buffer comes back
 * here when torch frees the tensor (its DLPack deleter, any thread, no GIL)
 * and is handed out again -- still mapped, often still in cache -- instead of
 * a fresh allocation whose pages fault in on every batch. A tensor the user
 * keeps keeps its buffer; a few free ones are kept, the rest freed.
 */
#define CV_KEEP 4

struct cv_store {
    atomic_long refs;             /* the Converter + one per buffer out */
    pid_t pid;                    /* a forked child's copy allocates and frees on its own, without the lock */
    pthread_mutex_t mu;
    size_t bytes;                 /* of the buffers in keep[] */
    uint32_t nkeep;
    void *keep[CV_KEEP];
};

static struct cv_store *cv_store_create(void)
{
    struct cv_store *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    atomic_init(&st->refs, 1);
    st->pid = getpid();
    pthread_mutex_init(&st->mu, NULL);
    return st;
}

static void cv_store_unref(struct cv_store *st)
{
    if (!st || atomic_fetch_sub(&st->refs, 1) != 1)
        return;
    for (uint32_t i = 0; i < st->nkeep; i++)
        free(st->keep[i]);
    if (st->pid == getpid())
        pthread_mutex_destroy(&st->mu);
    free(st);
}

/* A buffer of `bytes` (64-byte aligned) with a store reference, or NULL. Any thread. */
static void *cv_store_get(struct cv_store *st, size_t bytes)
{
    void *buf = NULL;
    if (st->pid == getpid()) {
        pthread_mutex_lock(&st->mu);
        if (bytes == st->bytes && st->nkeep)
            buf = st->keep[--st->nkeep];
        pthread_mutex_unlock(&st->mu);
    }
    if (!buf)
        buf = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (buf)
        atomic_fetch_add(&st->refs, 1);
    return buf;
}

/* Gives back a buffer of cv_store_get and its store reference. Any thread, without the GIL. */
static void cv_store_put(struct cv_store *st, void *buf, size_t bytes)
{
    if (st->pid == getpid()) {
        pthread_mutex_lock(&st->mu);
        if (bytes != st->bytes) { /* another batch size (a short last batch): those kept go */
            for (uint32_t i = 0; i < st->nkeep; i++)
                free(st->keep[i]);
            st->nkeep = 0;
            st->bytes = bytes;
        }
        if (st->nkeep < CV_KEEP) {
            st->keep[st->nkeep++] = buf;
            buf = NULL;
        }
        pthread_mutex_unlock(&st->mu);
    }
    free(buf);
    cv_store_unref(st);
}

struct cv_export {
    DLManagedTensor mt;
    int64_t shape[4], strides[4];
    struct cv_store *st;
    size_t bytes;
};

static void cv_export_deleter(DLManagedTensor *mt)
{
    struct cv_export *e = mt->manager_ctx;
    cv_store_put(e->st, mt->dl_tensor.data, e->bytes);
    free(e);
}

/* ---- Converter ------------------------------------------------------------------------ */

struct converter {
    PyObject_HEAD
    struct cv_plan plan;
    uint32_t threads;             /* threads converting a batch, the caller included (1: the caller alone) */
    struct cv_pool *pool;         /* NULL until the first batch worth splitting */
    pid_t pid;                    /* the process whose threads the pool holds */
    pthread_mutex_t run_mu;       /* one batch at a time (the GIL is released while converting) */
    struct cv_store *store;
};


/* Per-channel floats of a sequence of `c`, into out: 0, or -1 with an exception. */
static int float_seq(PyObject *seq, const char *what, uint32_t *c, float *out)
{
    const Py_ssize_t n = PySequence_Size(seq);
    if (n < 0)
        return -1;
    if (n < 1 || n > CV_MAX_C || (*c && (uint32_t)n != *c)) {
        PyErr_Format(PyExc_ValueError, "Converter: %s has %zd values; 1 to %d, one per channel", what, n, CV_MAX_C);
        return -1;
    }
    *c = (uint32_t)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PySequence_GetItem(seq, i);
        out[i] = v ? (float)PyFloat_AsDouble(v) : 0;
        Py_XDECREF(v);
        if (PyErr_Occurred())
            return -1;
    }
    return 0;
}

static PyObject *converter_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"mean", "std", "bf16", "channels_last", "threads", "kernel", NULL};
    PyObject *mean_o, *std_o;
    int bf16 = 0, nhwc = 0;
    unsigned int threads = 1;
    const char *kernel = "auto";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|ppIs:Converter", kwlist, &mean_o, &std_o, &bf16, &nhwc, &threads,
                                     &kernel))
        return NULL;
    uint32_t c = 0;
    float mean[CV_MAX_C], sd[CV_MAX_C];
    if (float_seq(mean_o, "mean", &c, mean) < 0 || float_seq(std_o, "std", &c, sd) < 0)
        return NULL;
    if (threads < 1 || threads > CV_MAX_THREADS + 1)
        return ext_raisef(EINVAL, "Converter: threads %u, 1 to %d", threads, CV_MAX_THREADS + 1);
    struct converter *self = (struct converter *)ext_alloc(tp);
    if (!self)
        return NULL;
    if (cv_plan_init(&self->plan, c, mean, sd, bf16, nhwc) < 0) {
        Py_DECREF(self);
        return ext_raisef(EINVAL, "Converter: every std must be positive");
    }
    if (strcmp(kernel, "auto") && cv_plan_force(&self->plan, kernel) < 0) {
        Py_DECREF(self);
        return PyErr_Format(PyExc_ValueError,
                            "Converter: kernel '%s' is not one this CPU and layout have (auto, table, avx512, "
                            "avx512vbmi)",
                            kernel);
    }
    self->threads = threads;
    self->pid = getpid();
    pthread_mutex_init(&self->run_mu, NULL);
    self->store = cv_store_create();
    if (!self->store) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void converter_dealloc(PyObject *op)
{
    struct converter *self = (struct converter *)op;
    if (self->pid == getpid()) {
        Py_BEGIN_ALLOW_THREADS
        cv_pool_destroy(self->pool);
        Py_END_ALLOW_THREADS
        pthread_mutex_destroy(&self->run_mu);
    } /* a forked child's copy: its helpers (and the mutexes' owners) were the parent's; left as they are */
    cv_store_unref(self->store); /* the tensors out keep it until they are freed */
    ext_free(op);
}

/* Converts CBatch `batch` into dst (the GIL released meanwhile): 0, or -1 with an exception. */
static int converter_fill(struct converter *self, PyObject *batch, void *dst)
{
    const uint8_t *src;
    uint32_t shape[4];
    if (ext_cbatch_images(batch, &src, shape) < 0)
        return -1;
    if (shape[1] != self->plan.c) {
        ext_raisef(EINVAL, "Converter: the batch has %u channels, the converter %u", shape[1], self->plan.c);
        return -1;
    }
    struct cv_job job = {.src = src, .dst = dst, .n = shape[0], .hw = (size_t)shape[2] * shape[3]};
    const size_t image = (size_t)shape[1] * job.hw;
    job.per = (uint32_t)(CV_CHUNK / (image ? image : 1));
    job.per = job.per ? job.per : 1;
    job.chunks = (uint32_t)((job.n + job.per - 1) / job.per);
    /* In a forked child the pool's threads are gone: the calling thread alone. */
    const int split = self->threads > 1 && job.chunks > 1 && self->pid == getpid();
    if (split && !self->pool) {
        self->pool = cv_pool_create(&self->plan, self->threads - 1);
        if (!self->pool)
            self->threads = 1; /* no thread could be started: not tried again for every batch */
    }
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->run_mu);
    if (split && self->pool)
        cv_pool_run(self->pool, &job);
    else
        cv_plan_run(&self->plan, job.src, job.dst, 0, job.n, job.hw);
    pthread_mutex_unlock(&self->run_mu);
    Py_END_ALLOW_THREADS
    return 0;
}

static PyObject *converter_run(PyObject *op, PyObject *args)
{
    PyObject *batch;
    unsigned long long addr;
    if (!PyArg_ParseTuple(args, "OK:run", &batch, &addr))
        return NULL;
    if (!addr)
        return ext_raisef(EINVAL, "Converter: no output address");
    if (converter_fill((struct converter *)op, batch, (void *)(uintptr_t)addr) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *converter_tensor(PyObject *op, PyObject *batch)
{
    struct converter *self = (struct converter *)op;
    const uint8_t *src;
    uint32_t shape[4];
    if (ext_cbatch_images(batch, &src, shape) < 0)
        return NULL;
    const int64_t B = shape[0], C = shape[1], H = shape[2], W = shape[3];
    const size_t esize = self->plan.bf16 ? 2 : 4, bytes = (size_t)(B * C * H * W) * esize;
    struct cv_export *e = calloc(1, sizeof(*e));
    void *buf = e ? cv_store_get(self->store, bytes ? bytes : 1) : NULL;
    if (!buf) {
        free(e);
        return PyErr_NoMemory();
    }
    e->st = self->store;
    e->bytes = bytes ? bytes : 1;
    const int64_t shp[4] = {B, C, H, W};
    const int64_t nchw[4] = {C * H * W, H * W, W, 1}, nhwc[4] = {H * W * C, 1, W * C, C};
    for (int i = 0; i < 4; i++) {
        e->shape[i] = shp[i];
        e->strides[i] = self->plan.nhwc ? nhwc[i] : nchw[i];
    }
    e->mt.manager_ctx = e;
    e->mt.deleter = cv_export_deleter;
    e->mt.dl_tensor = (DLTensor){.data = buf, .device = {.device_type = kDLCPU, .device_id = 0}, .ndim = 4,
                                 .dtype = {.code = self->plan.bf16 ? kDLBfloat : kDLFloat, .bits = (uint8_t)(8 * esize),
                                           .lanes = 1},
                                 .shape = e->shape, .strides = e->strides, .byte_offset = 0};
    if (converter_fill(self, batch, buf) < 0) {
        cv_export_deleter(&e->mt);
        return NULL;
    }
    return ext_dlpack_capsule(&e->mt);
}

static PyObject *get_kernel(PyObject *op, void *c)
{
    static const char *const names[] = {[CV_TABLE] = "table", [CV_AVX512] = "avx512", [CV_VBMI] = "avx512vbmi"};
    (void)c;
    return PyUnicode_FromString(names[((struct converter *)op)->plan.kernel]);
}

static PyObject *get_threads(PyObject *op, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLong(((struct converter *)op)->threads);
}

static PyGetSetDef getset[] = {
    {"kernel", get_kernel, NULL,
     "'avx512vbmi' (the table by byte permutes), 'avx512' (the expression, checked equal to the table for every "
     "value) or 'table' (one lookup per value)", NULL},
    {"threads", get_threads, NULL, "threads a batch is split over at most (the caller's included)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef methods[] = {
    {"tensor", converter_tensor, METH_O,
     "tensor(batch) -> DLPack capsule: the CBatch's images, normalised, in memory of the converter's own (B, C, H, "
     "W), NCHW or NHWC strides; the buffer is reused once torch frees the tensor. The GIL is released while "
     "converting"},
    {"run", converter_run, METH_VARARGS,
     "run(batch, address): the CBatch's images, normalised, into the float32/bfloat16 memory at address "
     "(B x C x H x W elements, NCHW or NHWC as made); returns when all are written. The GIL is released"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot slots[] = {
    {Py_tp_new, converter_new},
    {Py_tp_dealloc, converter_dealloc},
    {Py_tp_methods, methods},
    {Py_tp_getset, getset},
    {Py_tp_doc, "Converter(mean, std, bf16=False, channels_last=False, threads=1, kernel='auto'): a batch's uint8 "
                "images as (v / 255 - mean) / std in float32 or bfloat16, NCHW or NHWC, split over `threads` "
                "threads (the caller and threads - 1 of its own); kernel names one for tests ('table', 'avx512', "
                "'avx512vbmi': ValueError where the CPU lacks it)."},
    {0, NULL},
};

static PyType_Spec spec = {
    "ringtrain._ringtrain.Converter",
    sizeof(struct converter),
    0,
    Py_TPFLAGS_DEFAULT,
    slots,
};

int ext_convert_init(PyObject *m)
{
    ext_converter_type = ext_add_type(m, &spec, "Converter");
    return ext_converter_type ? 0 : -1;
}
