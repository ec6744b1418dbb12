/*
 * spatial.cu - the CUDA backend's spatial kernels other than convolution:
 * the uint8 input transform, layout conversion to and from host NCHW,
 * batchnorm, max and average pooling, global average pooling and flatten.
 *
 * Spatial tensors are NCHW on the GPU: every (image, channel) plane is H*W
 * contiguous floats, as in the CPU's (C, N, H, W) layout (which only orders
 * the planes differently). So pooling runs plane by plane, the
 * layout conversions are plain copies, and flatten's (N, C*H*W) features are
 * the tensor itself.
 *
 * Results are the CPU backend's bit for bit wherever its order of operations
 * can be kept. Float expressions are spelled with the _rn intrinsics because
 * the CUDA compiler would otherwise fuse a * b + c into one rounding where
 * the CPU (built with -std=c17, no contraction) rounds twice. Pooling scans
 * each window in the CPU's order with its first-maximum and NaN rules, and
 * backward passes gather (one thread per input element adds the windows
 * covering it, in output order) instead of scattering: that is the CPU's
 * sum in the CPU's order, without atomics. Global pooling sums a plane
 * sequentially, as the CPU does. Batchnorm's statistics are the exception:
 * the sums are double as on the CPU, but split over blocks and combined by
 * a fixed tree rather than by the CPU's sequential partials, so a mean or
 * invstd can differ from the CPU's in the last float bit (and everything
 * downstream with it). The split depends on the shape alone and no float
 * atomics are used, so every op repeats exactly from run to run.
 *
 * Everything is issued on the stream without waiting, except to_nchw, which
 * must hand back host data, and input_u8, whose pinned staging buffer waits
 * for its previous upload (rt_cuda_host_stage). This file does not check
 * shapes (rt_pool_desc_init and the model did) and implements only
 * floor-mode pooling.
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
/* Grid-stride loops cover the rest; more blocks than this only add scheduling. */
#define MAX_BLOCKS ((size_t)1 << 20)

static unsigned grid_for(size_t n)
{
    const size_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < MAX_BLOCKS ? b : MAX_BLOCKS);
}

/*
 * Launches kernel<I> over n elements on the stream, with I = uint32_t while
 * every index the kernel forms stays below `bound` <= INT32_MAX (64-bit
 * division, which the flat kernels do per element to find their channel or
 * plane, costs several times the 32-bit one), size_t beyond. The grid-stride
 * step is at most 2^28, so a 32-bit index cannot wrap past 2^32.
 */
#define LAUNCH_FLAT(s, n, bound, kernel, ...)                                                                       \
    do {                                                                                                             \
        const size_t n_ = (n);                                                                                       \
        if (n_ == 0)                                                                                                 \
            break;                                                                                                   \
        const cudaStream_t st_ = rt_cuda_stream(s);                                                                  \
        if ((bound) <= (size_t)INT32_MAX)                                                                            \
            kernel<uint32_t><<<grid_for(n_), THREADS, 0, st_>>>((uint32_t)n_, __VA_ARGS__);                          \
        else                                                                                                         \
            kernel<size_t><<<grid_for(n_), THREADS, 0, st_>>>(n_, __VA_ARGS__);                                      \
        RT_CUDA_LAUNCHED();                                                                                          \
    } while (0)

#define FOR_EACH(i, n) for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (I)gridDim.x * blockDim.x)

static size_t shape_count(struct rt_shape4 sh)
{
    return (size_t)sh.n * sh.c * sh.h * sh.w;
}

/* ==== layout ============================================================== */

void rt_cuda_to_nchw(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *host_nchw)
{
    const size_t bytes = shape_count(sh) * sizeof(float);
    if (bytes == 0)
        return;
    const cudaStream_t st = rt_cuda_stream(s);
    RT_CUDA_CHECK(cudaMemcpyAsync(host_nchw, x, bytes, cudaMemcpyDeviceToHost, st));
    rt_backend_waited(s);
    RT_CUDA_CHECK(cudaStreamSynchronize(st));
}

void rt_cuda_from_nchw(struct rt_stream *s, struct rt_shape4 sh, const float *host_nchw, float *x)
{
    const size_t bytes = shape_count(sh) * sizeof(float);
    rt_cuda_wrote(s, x, bytes);
    if (bytes == 0)
        return;
    /* From pageable memory the call returns once the source has been staged, so the caller may reuse it. */
    RT_CUDA_CHECK(cudaMemcpyAsync(x, host_nchw, bytes, cudaMemcpyHostToDevice, rt_cuda_stream(s)));
}

/* ==== input =============================================================== */

/* Channels [c0, c0 + cg) of the NCHW batch; n = N * cg * H * W. */
template <typename I>
static __global__ void input_u8_kernel(I n, size_t hw_, size_t c_, int c0, int cg, const uint8_t *src,
                                       struct input_norm k, float *y)
{
    const I hw = (I)hw_, c = (I)c_, ghw = (I)cg * hw;
    FOR_EACH(i, n)
    {
        const I img = i / ghw, r = i - img * ghw, cc = r / hw;
        const I at = (img * c + (I)c0 + cc) * hw + (r - cc * hw);
        /* The CPU's expression, rounded step by step as IEEE float on the host. */
        const float v = __fdiv_rn((float)src[at], 255.0f);
        y[at] = __fdiv_rn(__fsub_rn(v, k.mean[cc]), k.std[cc]);
    }
}

void rt_cuda_input_u8_dev(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *dev, const float *mean,
                          const float *std, float *y)
{
    const size_t hw = (size_t)sh.h * sh.w, total = shape_count(sh);
    if (total == 0)
        return;
    for (int c0 = 0; c0 < sh.c; c0 += INPUT_GROUP) {
        const int cg = sh.c - c0 < INPUT_GROUP ? sh.c - c0 : INPUT_GROUP;
        const struct input_norm k = input_norm_of(mean, std, c0, cg);
        LAUNCH_FLAT(s, (size_t)sh.n * cg * hw, total, input_u8_kernel, hw, (size_t)sh.c, c0, cg, dev, k, y);
    }
}

void rt_cuda_input_u8(struct rt_stream *s, struct rt_shape4 sh, const uint8_t *host_images, const float *mean,
                      const float *std, float *y)
{
    const size_t total = shape_count(sh);
    if (total == 0)
        return;
    rt_cuda_input_u8_dev(s, sh, rt_cuda_stage_images(s, host_images, total), mean, std, y);
}

/* ==== batchnorm =========================================================== */

/*
 * Statistics in two steps: blocks of BN_THREADS sum slices of a channel
 * (grid C x splits, so a few wide channels still fill the GPU), then one
 * block per channel adds its slices' partials by a fixed tree and finishes
 * the per-channel scalars. The normalising pass is a flat kernel of its
 * own. Splits grow with the channel's size up to one partial per thread of
 * the finishing block.
 */
#define BN_THREADS 256
#define BN_MAX_SPLITS BN_THREADS
#define BN_CHUNK ((size_t)4096) /* fewest elements per slice: 16 per thread */

struct bn_split {
    size_t m;        /* elements per channel, N*H*W */
    size_t chunk;    /* elements per slice */
    unsigned splits; /* slices per channel */
};

static struct bn_split bn_split_of(const struct rt_bn_desc *d)
{
    struct bn_split b;
    b.m = (size_t)d->in.n * d->in.h * d->in.w;
    size_t sp = (b.m + BN_CHUNK - 1) / BN_CHUNK;
    if (sp > BN_MAX_SPLITS)
        sp = BN_MAX_SPLITS;
    if (sp < 1)
        sp = 1;
    b.splits = (unsigned)sp;
    b.chunk = (b.m + sp - 1) / sp;
    return b;
}

/* Sums a and b over the BN_THREADS threads of the block by a fixed tree; every thread gets the totals. */
static __device__ void bn_block_sum2(double *a, double *b)
{
    __shared__ double sa[BN_THREADS], sb[BN_THREADS];
    const unsigned t = threadIdx.x;
    sa[t] = *a;
    sb[t] = *b;
    __syncthreads();
    for (unsigned h = BN_THREADS / 2; h > 0; h >>= 1) {
        if (t < h) {
            sa[t] += sa[t + h];
            sb[t] += sb[t + h];
        }
        __syncthreads();
    }
    *a = sa[0];
    *b = sb[0];
}

/*
 * One slice of a channel's sums. Element j of the channel is (n, p) =
 * (j / HW, j % HW) at (n*C + ch)*HW + p; a thread strides by BN_THREADS,
 * which moves (n, p) by a constant amount, so the loop carries (offset, p)
 * instead of dividing per element. Consecutive threads read consecutive p.
 * Forward (dy NULL): sums of (x - k) and (x - k)^2 with k = the channel's
 * first element, as the CPU shifts to avoid cancellation. Backward: sums of
 * dy and dy * (x - save_mean).
 */
static __global__ void bn_partial_kernel(const float *x, const float *dy, const float *save_mean, size_t c,
                                         size_t hw, size_t m, size_t chunk, unsigned splits, double *part)
{
    const size_t ch = blockIdx.x / splits, sl = blockIdx.x % splits;
    const double k = dy ? (double)save_mean[ch] : (double)x[ch * hw];
    double a = 0.0, b = 0.0;
    const size_t j0 = sl * chunk, j1 = j0 + chunk < m ? j0 + chunk : m;
    size_t j = j0 + threadIdx.x;
    if (j < j1) {
        const size_t chw = c * hw, dp = BN_THREADS % hw, doff = (BN_THREADS / hw) * chw;
        size_t p = j % hw, off = ((j / hw) * c + ch) * hw;
        for (; j < j1; j += BN_THREADS) {
            const double d = (double)x[off + p] - k;
            if (dy) {
                const double g = dy[off + p];
                a += g;
                b += g * d;
            } else {
                a += d;
                b += d * d;
            }
            p += dp;
            off += doff;
            if (p >= hw) {
                p -= hw;
                off += chw;
            }
        }
    }
    bn_block_sum2(&a, &b);
    if (threadIdx.x == 0) {
        part[2 * (size_t)blockIdx.x] = a;
        part[2 * (size_t)blockIdx.x + 1] = b;
    }
}

/* Sums of channel blockIdx.x's partials (a missing slice adds 0, which changes no sum). */
static __device__ void bn_channel_sums(const double *part, unsigned splits, double *a, double *b)
{
    const size_t ch = blockIdx.x;
    const unsigned t = threadIdx.x;
    *a = t < splits ? part[2 * (ch * splits + t)] : 0.0;
    *b = t < splits ? part[2 * (ch * splits + t) + 1] : 0.0;
    bn_block_sum2(a, b);
}

/* Training forward's scalars, in double on the host as the CPU has them. */
struct bn_fwd_k {
    double m, eps, mom, keep /* 1 - mom */, unbias /* m / (m - 1) */;
};

/* Per channel, the CPU's formulas operation by operation (no fused multiply-adds). */
static __global__ void bn_fwd_final_kernel(const float *x, size_t hw, unsigned splits, const double *part,
                                           struct bn_fwd_k k, float *running_mean, float *running_var,
                                           float *save_mean, float *save_invstd)
{
    double s1, s2;
    bn_channel_sums(part, splits, &s1, &s2);
    if (threadIdx.x != 0)
        return;
    const size_t ch = blockIdx.x;
    const double dm = __ddiv_rn(s1, k.m);
    double var = __dsub_rn(__ddiv_rn(s2, k.m), __dmul_rn(dm, dm));
    if (var < 0.0)
        var = 0.0;
    const double mean = __dadd_rn((double)x[ch * hw], dm);
    save_mean[ch] = (float)mean;
    save_invstd[ch] = (float)__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(var, k.eps)));
    running_mean[ch] = (float)__dadd_rn(__dmul_rn(k.mom, mean), __dmul_rn(k.keep, (double)running_mean[ch]));
    running_var[ch] =
        (float)__dadd_rn(__dmul_rn(__dmul_rn(k.mom, var), k.unbias), __dmul_rn(k.keep, (double)running_var[ch]));
}

/* y = (x - mean) * (invstd * gamma) + beta, rounded as the CPU's bn_row_affine. */
template <typename I>
static __global__ void bn_affine_kernel(I n, size_t hw_, size_t c_, const float *x, const float *mean,
                                        const float *invstd, const float *gamma, const float *beta, float *y)
{
    const I hw = (I)hw_, c = (I)c_;
    FOR_EACH(i, n)
    {
        const I ch = (i / hw) % c;
        const float a = __fmul_rn(invstd[ch], gamma[ch]);
        y[i] = __fadd_rn(__fmul_rn(__fsub_rn(x[i], mean[ch]), a), beta[ch]);
    }
}

void rt_cuda_bn_train_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                          const float *beta, float *running_mean, float *running_var, float *save_mean,
                          float *save_invstd, float *y)
{
    const size_t c = (size_t)d->in.c, hw = (size_t)d->in.h * d->in.w;
    const struct bn_split b = bn_split_of(d);
    if (c == 0 || b.m == 0)
        return;
    const cudaStream_t st = rt_cuda_stream(s);
    double *part = (double *)rt_cuda_workspace(s, c * b.splits * 2 * sizeof(double));
    bn_partial_kernel<<<(unsigned)(c * b.splits), BN_THREADS, 0, st>>>(x, NULL, NULL, c, hw, b.m, b.chunk, b.splits,
                                                                        part);
    RT_CUDA_LAUNCHED();
    struct bn_fwd_k k;
    k.m = (double)b.m;
    k.eps = rt_decimal_double(d->eps);
    k.mom = rt_decimal_double(d->momentum);
    k.keep = 1.0 - k.mom;
    /* PyTorch refuses one value per channel in training; the CPU then keeps the biased variance (0). */
    k.unbias = b.m > 1 ? (double)b.m / (double)(b.m - 1) : 1.0;
    bn_fwd_final_kernel<<<(unsigned)c, BN_THREADS, 0, st>>>(x, hw, b.splits, part, k, running_mean, running_var,
                                                             save_mean, save_invstd);
    RT_CUDA_LAUNCHED();
    const size_t n = c * b.m;
    LAUNCH_FLAT(s, n, n, bn_affine_kernel, hw, c, x, save_mean, save_invstd, gamma, beta, y);
}

/* invstd = (float)(1 / sqrt((double)running_var + eps)), once per channel rather than per element. */
static __global__ void bn_infer_invstd_kernel(size_t c, const float *running_var, double eps, float *invstd)
{
    const size_t ch = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch < c)
        invstd[ch] = (float)__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn((double)running_var[ch], eps)));
}

void rt_cuda_bn_infer_fwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,
                          const float *beta, const float *running_mean, const float *running_var, float *y)
{
    const size_t c = (size_t)d->in.c, hw = (size_t)d->in.h * d->in.w, n = shape_count(d->in);
    if (n == 0)
        return;
    float *invstd = (float *)rt_cuda_workspace(s, c * sizeof(float));
    bn_infer_invstd_kernel<<<grid_for(c), THREADS, 0, rt_cuda_stream(s)>>>(c, running_var, rt_decimal_double(d->eps),
                                                                          invstd);
    RT_CUDA_LAUNCHED();
    LAUNCH_FLAT(s, n, n, bn_affine_kernel, hw, c, x, running_mean, invstd, gamma, beta, y);
}

/*
 * Per channel: adds the parameter gradients and leaves dx's coefficients
 * (grad_mean, proj, scale) in coef[3*ch ..], each rounded to float from
 * double as the CPU does.
 */
static __global__ void bn_bwd_final_kernel(unsigned splits, const double *part, double m, const float *gamma,
                                           const float *save_invstd, float *dgamma, float *dbeta, float *coef)
{
    double sdy, sdyx;
    bn_channel_sums(part, splits, &sdy, &sdyx);
    if (threadIdx.x != 0)
        return;
    const size_t ch = blockIdx.x;
    const double invstd = save_invstd[ch];
    dbeta[ch] = __fadd_rn(dbeta[ch], (float)sdy);
    dgamma[ch] = __fadd_rn(dgamma[ch], (float)__dmul_rn(sdyx, invstd));
    coef[3 * ch] = (float)__ddiv_rn(sdy, m);
    coef[3 * ch + 1] = (float)__ddiv_rn(__dmul_rn(__dmul_rn(sdyx, invstd), invstd), m);
    coef[3 * ch + 2] = (float)__dmul_rn(invstd, (double)gamma[ch]);
}

/* dx = beta_dx dx + (dy - grad_mean - (x - mean) proj) scale, rounded as the CPU's bn_row_bwd_dx. */
template <typename I>
static __global__ void bn_bwd_dx_kernel(I n, size_t hw_, size_t c_, const float *x, const float *dy,
                                        const float *save_mean, const float *coef, float beta_dx, float *dx)
{
    const I hw = (I)hw_, c = (I)c_;
    FOR_EACH(i, n)
    {
        const I ch = (i / hw) % c;
        const float gm = coef[3 * ch], proj = coef[3 * ch + 1], scale = coef[3 * ch + 2];
        const float t =
            __fmul_rn(__fsub_rn(__fsub_rn(dy[i], gm), __fmul_rn(__fsub_rn(x[i], save_mean[ch]), proj)), scale);
        /* beta_dx 0 must not read dx: it may hold NaN. */
        dx[i] = beta_dx == 0.0f ? t : __fadd_rn(__fmul_rn(beta_dx, dx[i]), t);
    }
}

void rt_cuda_bn_bwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                    const float *gamma, const float *beta, const float *save_mean, const float *save_invstd,
                    float beta_dx, float *dx, float *dgamma, float *dbeta)
{
    (void)beta; /* only for a fused ReLU, which the CUDA tables do not offer (rt_ops.bn_relu 0) */
    const size_t c = (size_t)d->in.c, hw = (size_t)d->in.h * d->in.w;
    const struct bn_split b = bn_split_of(d);
    if (c == 0 || b.m == 0)
        return;
    const cudaStream_t st = rt_cuda_stream(s);
    const size_t npart = c * b.splits * 2;
    double *part = (double *)rt_cuda_workspace(s, npart * sizeof(double) + 3 * c * sizeof(float));
    float *coef = (float *)(part + npart);
    bn_partial_kernel<<<(unsigned)(c * b.splits), BN_THREADS, 0, st>>>(x, dy, save_mean, c, hw, b.m, b.chunk,
                                                                        b.splits, part);
    RT_CUDA_LAUNCHED();
    bn_bwd_final_kernel<<<(unsigned)c, BN_THREADS, 0, st>>>(b.splits, part, (double)b.m, gamma, save_invstd, dgamma,
                                                             dbeta, coef);
    RT_CUDA_LAUNCHED();
    const size_t n = c * b.m;
    LAUNCH_FLAT(s, n, n, bn_bwd_dx_kernel, hw, c, x, dy, save_mean, coef, beta_dx, dx);
}

/*
 * bn_infer_bwd's coefficients in bn_bwd_dx_kernel's form: grad_mean = proj = 0 and scale = the forward's
 * invstd * gamma, rounded as bn_infer_fwd computes it (bn_infer_invstd_kernel, then bn_affine_kernel's product).
 */
static __global__ void bn_infer_bwd_coef_kernel(size_t c, const float *running_var, const float *gamma, double eps,
                                                float *coef)
{
    const size_t ch = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c)
        return;
    const float invstd = (float)__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn((double)running_var[ch], eps)));
    coef[3 * ch] = 0.0f;
    coef[3 * ch + 1] = 0.0f;
    coef[3 * ch + 2] = __fmul_rn(invstd, gamma[ch]);
}

/* dx = beta_dx dx + dy invstd gamma: bn_bwd's dx kernel with the coefficients above and mean = running_mean
 * (dy - 0 - (x - mean) 0 is dy for every finite x), as the CPU's rt_cpu_bn_infer_bwd. */
void rt_cuda_bn_infer_bwd(struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,
                          const float *gamma, const float *beta, const float *running_mean, const float *running_var,
                          float beta_dx, float *dx)
{
    (void)beta; /* only for a fused ReLU, which the CUDA tables do not offer (rt_ops.bn_relu 0): d->relu is never set */
    const size_t c = (size_t)d->in.c, hw = (size_t)d->in.h * d->in.w, n = shape_count(d->in);
    if (n == 0)
        return;
    float *coef = (float *)rt_cuda_workspace(s, 3 * c * sizeof(float));
    bn_infer_bwd_coef_kernel<<<grid_for(c), THREADS, 0, rt_cuda_stream(s)>>>(c, running_var, gamma,
                                                                            rt_decimal_double(d->eps), coef);
    RT_CUDA_LAUNCHED();
    LAUNCH_FLAT(s, n, n, bn_bwd_dx_kernel, hw, c, x, dy, running_mean, coef, beta_dx, dx);
}

/* ==== pooling ============================================================= */

static struct pool_geom pool_geom_of(const struct rt_pool_desc *d)
{
    struct pool_geom g = {d->in.h, d->in.w, d->kh, d->kw, d->stride, d->pad, d->oh, d->ow};
    return g;
}

/*
 * Index in the plane of the maximum of window (oy, ox), pool.c's rule: the
 * first maximum in row-major order, and any NaN wins (so the last NaN), as
 * PyTorch's CPU kernel. Padding never wins: pad <= k/2 leaves every
 * floor-mode window at least one input element.
 */
static __device__ __forceinline__ int pool_argmax(const struct pool_geom &g, const float *plane, int oy, int ox)
{
    int y0, y1, x0, x1;
    pool_window(g, oy, ox, &y0, &y1, &x0, &x1);
    int best = y0 * g.w + x0;
    float m = -INFINITY;
    for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++) {
            const int i = iy * g.w + ix;
            const float v = plane[i];
            if (v > m || isnan(v)) {
                m = v;
                best = i;
            }
        }
    return best;
}

/* dx's starting value before gradients are added, as pool.c's pool_apply_beta: beta 0 never reads dx. */
static __device__ __forceinline__ float pool_beta_start(float beta, const float *dx)
{
    if (beta == 0.0f)
        return 0.0f;
    return beta == 1.0f ? *dx : __fmul_rn(*dx, beta);
}

template <typename I>
static __global__ void maxpool_fwd_kernel(I n, struct pool_geom g, const float *x, float *y)
{
    const I hw = (I)g.h * (I)g.w, ohw = (I)g.oh * (I)g.ow;
    FOR_EACH(i, n)
    {
        const I plane = i / ohw;
        const int r = (int)(i - plane * ohw), oy = r / g.ow, ox = r % g.ow;
        const float *xp = x + plane * hw;
        y[i] = xp[pool_argmax(g, xp, oy, ox)];
    }
}

/*
 * One thread per input element: the gradients of the windows whose maximum
 * it is, in output row-major order, the order the CPU adds them in. `store`
 * is the CPU's 2x2 stride-2 beta-0 path, which stores the gradient instead
 * of adding it to 0 (only a -0 gradient tells the two apart).
 */
template <typename I>
static __global__ void maxpool_bwd_kernel(I n, struct pool_geom g, const float *x, const float *dy, float beta,
                                          int store, float *dx)
{
    const I hw = (I)g.h * (I)g.w, ohw = (I)g.oh * (I)g.ow;
    FOR_EACH(i, n)
    {
        const I plane = i / hw;
        const int q = (int)(i - plane * hw), iy = q / g.w, ix = q % g.w;
        const float *xp = x + plane * hw, *gp = dy + plane * ohw;
        int oy0, oy1, ox0, ox1;
        pool_cover(iy, g.kh, g.stride, g.pad, g.oh, &oy0, &oy1);
        pool_cover(ix, g.kw, g.stride, g.pad, g.ow, &ox0, &ox1);
        float acc = pool_beta_start(beta, dx + i);
        for (int oy = oy0; oy < oy1; oy++)
            for (int ox = ox0; ox < ox1; ox++)
                if (pool_argmax(g, xp, oy, ox) == q) {
                    const float v = gp[oy * g.ow + ox];
                    acc = store ? v : __fadd_rn(acc, v);
                }
        dx[i] = acc;
    }
}

static size_t pool_bound(const struct rt_pool_desc *d)
{
    const size_t nx = shape_count(d->in), ny = (size_t)d->in.n * d->in.c * d->oh * d->ow;
    return nx > ny ? nx : ny;
}

void rt_cuda_maxpool_fwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y)
{
    const size_t ny = (size_t)d->in.n * d->in.c * d->oh * d->ow;
    LAUNCH_FLAT(s, ny, pool_bound(d), maxpool_fwd_kernel, pool_geom_of(d), x, y);
}

void rt_cuda_maxpool_bwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, const float *y,
                         const float *dy, float beta, float *dx)
{
    (void)y; /* the positions are recomputed from x, which settles ties the way forward did */
    const int store = beta == 0.0f && d->kh == 2 && d->kw == 2 && d->stride == 2 && d->pad == 0;
    LAUNCH_FLAT(s, shape_count(d->in), pool_bound(d), maxpool_bwd_kernel, pool_geom_of(d), x, dy, beta, store, dx);
}

/* The clipped window summed in row-major order, times 1/(kh*kw): floor mode keeps
 * every window inside the padded input, so the divisor counts padding (PyTorch's
 * count_include_pad=True). */
template <typename I>
static __global__ void avgpool_fwd_kernel(I n, struct pool_geom g, float inv, const float *x, float *y)
{
    const I hw = (I)g.h * (I)g.w, ohw = (I)g.oh * (I)g.ow;
    FOR_EACH(i, n)
    {
        const I plane = i / ohw;
        const int r = (int)(i - plane * ohw), oy = r / g.ow, ox = r % g.ow;
        const float *xp = x + plane * hw;
        int y0, y1, x0, x1;
        pool_window(g, oy, ox, &y0, &y1, &x0, &x1);
        float acc = 0.0f;
        for (int iy = y0; iy < y1; iy++)
            for (int ix = x0; ix < x1; ix++)
                acc = __fadd_rn(acc, xp[iy * g.w + ix]);
        y[i] = __fmul_rn(acc, inv);
    }
}

/* One thread per input element: g * inv of every window covering it, in output row-major order. */
template <typename I>
static __global__ void avgpool_bwd_kernel(I n, struct pool_geom g, float inv, const float *dy, float beta, float *dx)
{
    const I hw = (I)g.h * (I)g.w, ohw = (I)g.oh * (I)g.ow;
    FOR_EACH(i, n)
    {
        const I plane = i / hw;
        const int q = (int)(i - plane * hw), iy = q / g.w, ix = q % g.w;
        const float *gp = dy + plane * ohw;
        int oy0, oy1, ox0, ox1;
        pool_cover(iy, g.kh, g.stride, g.pad, g.oh, &oy0, &oy1);
        pool_cover(ix, g.kw, g.stride, g.pad, g.ow, &ox0, &ox1);
        float acc = pool_beta_start(beta, dx + i);
        for (int oy = oy0; oy < oy1; oy++)
            for (int ox = ox0; ox < ox1; ox++)
                acc = __fadd_rn(acc, __fmul_rn(gp[oy * g.ow + ox], inv));
        dx[i] = acc;
    }
}

void rt_cuda_avgpool_fwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y)
{
    const size_t ny = (size_t)d->in.n * d->in.c * d->oh * d->ow;
    const float inv = 1.0f / (float)(d->kh * d->kw);
    LAUNCH_FLAT(s, ny, pool_bound(d), avgpool_fwd_kernel, pool_geom_of(d), inv, x, y);
}

void rt_cuda_avgpool_bwd(struct rt_stream *s, const struct rt_pool_desc *d, const float *dy, float beta, float *dx)
{
    const float inv = 1.0f / (float)(d->kh * d->kw);
    LAUNCH_FLAT(s, shape_count(d->in), pool_bound(d), avgpool_bwd_kernel, pool_geom_of(d), inv, dy, beta, dx);
}

/* ==== global average pooling and flatten ================================== */

/*
 * One thread per plane summing it in order, as the CPU does: planes are
 * small where global pooling is used (4x4 to 8x8), and the sequential sum
 * is the CPU's to the bit. With NCHW the (n, c) plane's index is its
 * feature's index in (N, C).
 */
template <typename I>
static __global__ void gap_fwd_kernel(I n, size_t hw_, float inv, const float *x, float *y)
{
    const I hw = (I)hw_;
    FOR_EACH(j, n)
    {
        const float *xp = x + j * hw;
        float acc = 0.0f;
        for (I p = 0; p < hw; p++)
            acc = __fadd_rn(acc, xp[p]);
        y[j] = __fmul_rn(acc, inv);
    }
}

template <typename I>
static __global__ void gap_bwd_kernel(I n, size_t hw_, float inv, const float *dy, float beta, float *dx)
{
    const I hw = (I)hw_;
    FOR_EACH(i, n)
    {
        const float v = __fmul_rn(dy[i / hw], inv);
        dx[i] = beta == 0.0f ? v : __fadd_rn(__fmul_rn(beta, dx[i]), v);
    }
}

void rt_cuda_gap_fwd(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y)
{
    const size_t hw = (size_t)sh.h * sh.w, total = shape_count(sh);
    if (hw == 0)
        return;
    const float inv = 1.0f / (float)hw;
    LAUNCH_FLAT(s, (size_t)sh.n * sh.c, total, gap_fwd_kernel, hw, inv, x, y);
}

void rt_cuda_gap_bwd(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx)
{
    const size_t hw = (size_t)sh.h * sh.w, total = shape_count(sh);
    if (hw == 0)
        return;
    const float inv = 1.0f / (float)hw;
    LAUNCH_FLAT(s, total, total, gap_bwd_kernel, hw, inv, dy, beta, dx);
}

/* Features (N, C*H*W) in (c, h, w) order are NCHW: flatten is a copy. */
void rt_cuda_flatten_fwd(struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y)
{
    const size_t bytes = shape_count(sh) * sizeof(float);
    if (bytes == 0 || x == y)
        return;
    RT_CUDA_CHECK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, rt_cuda_stream(s)));
}

template <typename I>
static __global__ void axpby_kernel(I n, float beta, const float *g, float *dx)
{
    FOR_EACH(i, n)
    {
        dx[i] = __fadd_rn(__fmul_rn(beta, dx[i]), g[i]);
    }
}

void rt_cuda_flatten_bwd(struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx)
{
    const size_t n = shape_count(sh);
    if (beta == 0.0f) {
        rt_cuda_flatten_fwd(s, sh, dy, dx);
        return;
    }
    LAUNCH_FLAT(s, n, n, axpby_kernel, beta, dy, dx);
}
