/*
 * backend_cuda.c - the CUDA backend's device, stream, library handles,
 * memory ops and op table, and rt_cuda_create/rt_cuda_destroy, which
 * compute/backend.c calls. The kernels live in elem.cu and spatial.cu, the
 * convolutions and linear layers in dnn.c.
 *
 * One backend is one device and one compute stream; cuDNN and cuBLAS are
 * bound to that stream, so every op of a step is queued in order without a
 * device-wide synchronisation. Only download() and sync() wait, because they
 * must hand results to the host.
 *
 * Numerics: fp32 GEMMs always run with FMA math, fp32 convolutions too unless
 * rt_backend_opts.tf32 allows TF32 (train's default, as PyTorch's): a backend
 * created with zeroed options computes strict fp32, which the tests compare
 * with the CPU backend; mixed precision is a separate, explicit choice.
 *
 * It does not do: choosing a backend or the accessors every backend shares
 * (compute/backend.c), pinned batch slots or the copy stream (staging/), NCCL
 * (comm/), kernels (the files cuda_be.h lists).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/cudalibs.h"
#include "compute/cuda/cuda_be.h"

/* Turing (7.5) is the oldest architecture the kernels are built for (CMake's
 * CMAKE_CUDA_ARCHITECTURES; CUDA 13 dropped Volta). */
#define RT_CUDA_MIN_CC 75

void rt_cuda_fail(const char *lib, int code, const char *msg, const char *expr, const char *file, int line)
{
    int dev = -1;
    cudaGetDevice(&dev);
    rt_log(RT_LOG_ERROR, "%s error %d (%s) in %s at %s:%d (GPU %d); aborting", lib, code, msg ? msg : "?", expr, file,
           line, dev);
    fflush(stdout);
    fflush(stderr);
    abort();
}

/* ---- memory ---------------------------------------------------------------------- */

void *rt_cuda_alloc(struct rt_backend *be, size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1); /* 256-byte aligned */
    if (e != cudaSuccess) {
        size_t free_b = 0, total = 0;
        cudaMemGetInfo(&free_b, &total);
        cudaGetLastError(); /* not sticky: the caller reports and stops */
        rt_errf(-ENOMEM, "GPU %d: cannot allocate %zu MB (%s; %zu MB free of %zu)", be->cuda->device, bytes >> 20,
                cudaGetErrorString(e), free_b >> 20, total >> 20);
        return NULL;
    }
    /* Zeroed, as the op table promises; on the backend's stream so that it
     * is ordered before any op that uses the memory. */
    RT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, be->cuda->compute));
    return p;
}

void rt_cuda_free(struct rt_backend *be, void *p)
{
    if (!p)
        return;
    /* Whatever dnn.c derived from this memory (a 16-bit weight copy) must not outlive it: the address may
     * come back from the next cudaMalloc holding other data. */
    rt_cuda_freed(be->cuda, p);
    be->graph_gen++; /* a graph may have it baked in */
    /* The memory may still be read by queued work: drain first. */
    RT_CUDA_CHECK(cudaStreamSynchronize(be->cuda->compute));
    RT_CUDA_CHECK(cudaFree(p));
}

void rt_cuda_upload(struct rt_stream *s, void *dst, const void *host_src, size_t bytes)
{
    rt_cuda_wrote(s, dst, bytes);
    /* From pageable memory cudaMemcpyAsync returns once the source has been
     * staged, so the caller may reuse its buffer at once, as on the CPU. */
    if (bytes)
        RT_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, rt_cuda_stream(s)));
}

void rt_cuda_download(struct rt_stream *s, void *host_dst, const void *src, size_t bytes)
{
    if (bytes)
        RT_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, rt_cuda_stream(s)));
    rt_backend_waited(s);
    RT_CUDA_CHECK(cudaStreamSynchronize(rt_cuda_stream(s)));
}

void rt_cuda_download_async(struct rt_stream *s, void *host_dst, const void *src, size_t bytes)
{
    if (bytes)
        RT_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, rt_cuda_stream(s)));
}

void rt_cuda_copy(struct rt_stream *s, void *dst, const void *src, size_t bytes)
{
    rt_cuda_wrote(s, dst, bytes);
    if (bytes && dst != src)
        RT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, rt_cuda_stream(s)));
}

void rt_cuda_zero(struct rt_stream *s, void *dst, size_t bytes)
{
    rt_cuda_wrote(s, dst, bytes);
    if (bytes)
        RT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, rt_cuda_stream(s)));
}

void rt_cuda_sync(struct rt_stream *s)
{
    rt_backend_waited(s);
    RT_CUDA_CHECK(cudaStreamSynchronize(rt_cuda_stream(s)));
}

/*
 * A scratch block grown to `bytes`. Stream-ordered: the old block is released after the work that uses it. A
 * graph bakes the block's address in, so a growth bumps the backend's graph generation (the model then drops
 * its graphs, rt_backend_graph_gen); during a capture the new block is an ordinary allocation, made at once
 * and not captured, and the old one is kept until the backend goes (captured work may still use it).
 */
static void *grow_block(struct rt_stream *s, void **p, size_t *have, size_t bytes)
{
    struct rt_cuda *c = rt_cuda_of(s);
    if (bytes <= *have && *p)
        return *p;
    const cudaStream_t st = rt_cuda_stream(s);
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    RT_CUDA_CHECK(cudaStreamIsCapturing(st, &cap));
    s->be->graph_gen++;
    if (cap != cudaStreamCaptureStatusNone) {
        if (*p && c->nretired < RT_CUDA_RETIRED)
            c->retired[c->nretired++] = *p;
        *p = NULL;
        RT_CUDA_CHECK(cudaMalloc(p, bytes));
    } else {
        if (*p)
            RT_CUDA_CHECK(cudaFreeAsync(*p, st));
        *p = NULL;
        RT_CUDA_CHECK(cudaMallocAsync(p, bytes, st));
    }
    *have = bytes;
    return *p;
}

void *rt_cuda_workspace(struct rt_stream *s, size_t bytes)
{
    struct rt_cuda *c = rt_cuda_of(s);
    const size_t want = bytes < ((size_t)1 << 20) ? (size_t)1 << 20 : bytes;
    return grow_block(s, &c->workspace, &c->workspace_bytes, want);
}

void *rt_cuda_host_stage(struct rt_stream *s, size_t bytes)
{
    struct rt_cuda *c = rt_cuda_of(s);
    /* The previous contents may still be on their way to the device. */
    RT_CUDA_CHECK(cudaStreamSynchronize(rt_cuda_stream(s)));
    if (bytes > c->host_stage_bytes) {
        if (c->host_stage)
            RT_CUDA_CHECK(cudaFreeHost(c->host_stage));
        c->host_stage = NULL;
        c->host_stage_bytes = 0;
        RT_CUDA_CHECK(cudaHostAlloc((void **)&c->host_stage, bytes, cudaHostAllocDefault));
        c->host_stage_bytes = bytes;
    }
    return c->host_stage;
}

void *rt_cuda_scratch(struct rt_stream *s, int slot, size_t bytes)
{
    struct rt_cuda *c = rt_cuda_of(s);
    return grow_block(s, &c->scratch[slot], &c->scratch_bytes[slot], bytes);
}

const uint8_t *rt_cuda_stage_images(struct rt_stream *s, const uint8_t *host, size_t bytes)
{
    /* Pinned staging makes the upload a true async DMA; the ring slot is free
     * again as soon as this returns. The workspace is reused by later ops only
     * after the kernels that read it, in stream order. */
    void *stage = rt_cuda_host_stage(s, bytes);
    memcpy(stage, host, bytes);
    uint8_t *dev = (uint8_t *)rt_cuda_workspace(s, bytes);
    RT_CUDA_CHECK(cudaMemcpyAsync(dev, stage, bytes, cudaMemcpyHostToDevice, rt_cuda_stream(s)));
    return dev;
}

/* ---- page-locked host memory for the batch ring ----------------------------------- */

static void *rt_cuda_host_alloc(struct rt_backend *be, size_t bytes)
{
    (void)be;
    void *p = NULL;
    /* Portable: pinned for every context of the process, whichever thread fills it. */
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        rt_errf(-ENOMEM, "cudaHostAlloc of %zu bytes for the batch ring: %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void rt_cuda_host_free(struct rt_backend *be, void *p)
{
    (void)be;
    if (p)
        cudaFreeHost(p);
}

static const struct rt_backend_io cuda_io = {
    .host_alloc = rt_cuda_host_alloc,
    .host_free = rt_cuda_host_free,
};

/* ---- the table ------------------------------------------------------------------- */

/* The fp32 reference table: every slot is the function of its name (.conv2d_fwd = rt_cuda_conv2d_fwd, ...). */
#define CUDA_OP(ret, name, params, args) .name = rt_cuda_##name,
static const struct rt_ops cuda_ops = {.act = RT_F32, RT_OPS_LIST(CUDA_OP)};
#undef CUDA_OP

/* RINGTRAIN_CUDA_KERNELS: "fast" (or unset, or empty) 0, "reference" 1, anything else -EINVAL. */
static int kernels_choice(int *reference)
{
    const char *v = getenv("RINGTRAIN_CUDA_KERNELS");
    *reference = 0;
    if (!v || !v[0] || !strcmp(v, "fast"))
        return 0;
    if (!strcmp(v, "reference")) {
        *reference = 1;
        return 0;
    }
    return rt_errf(-EINVAL, "RINGTRAIN_CUDA_KERNELS=%s: expected fast (the default) or reference (the simple twin "
                            "kernels, a way back should a fast one misbehave)",
                   v);
}

/*
 * The tables: the reference fp32 table, its 16-bit twins (the fp32 table with the activation ops replaced by
 * nhwc16.cu's, elem.cu's and dnn.c's), and the fast tables, the same with fast_elem.cu's and fast_bn.cu's
 * kernels over them. The fast 16-bit tables start from the fast fp32 table, so that every op on fp32 buffers
 * (memory, casts, optimizer) is shared as rt_ops_check_act_table wants.
 */
static void tables_build(struct rt_cuda *c)
{
    static const enum rt_dtype dts[2] = {RT_BF16, RT_F16};
    c->ref32 = cuda_ops;
    c->fast32 = cuda_ops;
    rt_cuda_fast_elem_fill(&c->fast32, RT_F32);
    rt_cuda_fast_bn_fill(&c->fast32, RT_F32);
    rt_cuda_fast_dnn_fill(&c->fast32, RT_F32);
    for (int i = 0; i < 2; i++) {
        struct rt_ops *r = &c->ref16[i], *f = &c->fast16[i];
        *r = c->ref32;
        r->act = dts[i];
        rt_cuda_spatial_fill16(r, dts[i]);
        rt_cuda_elem_fill16(r, dts[i]);
        rt_cuda_dnn_fill16(r, dts[i]);
        *f = c->fast32;
        f->act = dts[i];
        f->bn_relu = f->add_relu = 0;
        rt_cuda_spatial_fill16(f, dts[i]);
        rt_cuda_elem_fill16(f, dts[i]);
        rt_cuda_dnn_fill16(f, dts[i]);
        rt_cuda_fast_elem_fill(f, dts[i]);
        rt_cuda_fast_bn_fill(f, dts[i]);
        rt_cuda_fast_dnn_fill(f, dts[i]);
    }
}

/* ---- create / destroy ------------------------------------------------------------ */

int rt_cuda_create(const struct rt_backend_opts *o, struct rt_backend **out)
{
    *out = NULL;
    int n = 0, driver = 0, runtime = 0;
    char why[320];
    if (cudaDriverGetVersion(&driver) != cudaSuccess)
        driver = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess)
        runtime = 0;
    /* The versions before the count: with a driver too old for the runtime, cudaGetDeviceCount fails with
     * cudaErrorInsufficientDriver, whose message names neither version. */
    int verdict = rt_cuda_driver_verdict(driver, runtime, -1, NULL, why, sizeof(why));
    if (verdict == 0) {
        const cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess)
            verdict = rt_cuda_driver_verdict(driver, runtime, (int)e, cudaGetErrorString(e), why, sizeof(why));
        else if (n == 0) {
            snprintf(why, sizeof(why), "no usable GPU: the driver sees no device");
            verdict = -ENODEV;
        }
    }
    if (verdict < 0) {
        cudaGetLastError();
        return rt_errf(verdict, "%s (use --device cpu)", why);
    }
    if (o->device < 0 || o->device >= n)
        return rt_errf(-ENODEV, "GPU %d asked for, but %d %s visible (CUDA_VISIBLE_DEVICES=%s)", o->device, n,
                       n == 1 ? "is" : "are", getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
    /* cuDNN and cuBLAS are loaded now, not linked: a CUDA build runs on the CPU where they are not installed. */
    int lib_rc = rt_cudalibs_load(RT_CUDALIBS_CUDNN | RT_CUDALIBS_CUBLAS); /* rt_errmsg(): which, why, what to do */
    if (lib_rc)
        return lib_rc;
    struct rt_backend *be = rt_calloc(1, sizeof(*be), "cuda backend");
    struct rt_cuda *c = rt_calloc(1, sizeof(*c), "cuda backend");
    if (!be || !c) {
        free(be);
        free(c);
        return -ENOMEM;
    }
    be->kind = RT_BACKEND_CUDA;
    be->cuda = c;
    be->io = &cuda_io;
    be->streams = &rt_cuda_streams;
    be->device = o->device;
    c->device = o->device;
    c->tf32 = o->tf32 != 0;
    c->nondeterministic = o->nondeterministic != 0;
    {
        const int rc = kernels_choice(&c->reference);
        if (rc < 0) {
            free(c);
            free(be);
            return rc;
        }
    }
    RT_CUDA_CHECK(cudaGetDeviceProperties(&c->prop, c->device));
    /* For NVML, which numbers GPUs its own way (CUDA_VISIBLE_DEVICES does not apply): the bus id is the GPU. */
    if (cudaDeviceGetPCIBusId(be->pci_bus_id, (int)sizeof(be->pci_bus_id), c->device) != cudaSuccess) {
        cudaGetLastError();
        be->pci_bus_id[0] = 0;
    }
    if (c->prop.major * 10 + c->prop.minor < RT_CUDA_MIN_CC) {
        int rc = rt_errf(-ENODEV, "GPU %d (%s) is compute capability %d.%d; this build needs %d.%d or newer (use "
                                  "--device cpu)",
                         c->device, c->prop.name, c->prop.major, c->prop.minor, RT_CUDA_MIN_CC / 10,
                         RT_CUDA_MIN_CC % 10);
        free(c);
        free(be);
        return rc;
    }
    RT_CUDA_CHECK(cudaSetDevice(c->device));
    RT_CUDA_CHECK(cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking));
    RT_CUDNN_CHECK(cudnnCreate(&c->dnn));
    RT_CUDNN_CHECK(cudnnSetStream(c->dnn, c->compute));
    RT_CUBLAS_CHECK(cublasCreate(&c->blas));
    RT_CUBLAS_CHECK(cublasSetStream(c->blas, c->compute));
    RT_CUBLAS_CHECK(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH)); /* no TF32: see the top */
    RT_CUBLAS_CHECK(cublasSetPointerMode(c->blas, CUBLAS_POINTER_MODE_HOST));
    be->stream.be = be;
    be->stream.handle = c->compute;
    /* The input uploads' copy stream, buffers and events (compute/input.c). */
    if (rt_input_pair_init(be) < 0)
        rt_cuda_fail("CUDA", 0, rt_errmsg(), "rt_input_pair_init(be)", __FILE__, __LINE__);
    tables_build(c);
    be->ref_ops = &c->ref32;
    be->ref_f16 = &c->ref16[1];
    be->ops = c->reference ? &c->ref32 : &c->fast32;
    be->ops_f16 = c->reference ? &c->ref16[1] : &c->fast16[1];
    /* bf16 tensor-core convolutions and GEMMs start with Ampere (sm_80). */
    if (c->prop.major >= 8) {
        be->ref_bf16 = &c->ref16[0];
        be->ops_bf16 = c->reference ? &c->ref16[0] : &c->fast16[0];
    } else
        snprintf(be->why_not_bf16, sizeof(be->why_not_bf16),
                 "GPU %d (%.60s) is compute capability %d.%d; bf16 needs 8.0 or newer (use --amp fp16)", c->device,
                 c->prop.name, c->prop.major, c->prop.minor);
    size_t dnn = cudnnGetVersion();
    int cublas = 0;
    cublasGetVersion(c->blas, &cublas);
    snprintf(be->describe, sizeof(be->describe),
             "cuda: GPU %d %.60s (sm_%d%d, %.0f GiB), cuDNN %d.%d.%d, cuBLAS %d; %s kernels, fp32 convolutions %s, "
             "%s algorithms",
             c->device, c->prop.name, c->prop.major, c->prop.minor, (double)c->prop.totalGlobalMem / (1u << 30),
             (int)(dnn / 10000 % 100), (int)(dnn / 100 % 100), (int)(dnn % 100), cublas,
             c->reference ? "reference" : "fast", c->tf32 ? "TF32" : "strict fp32",
             c->nondeterministic ? "any" : "deterministic");
    *out = be;
    return 0;
}

void rt_cuda_destroy(struct rt_backend *be)
{
    if (!be)
        return;
    struct rt_cuda *c = be->cuda;
    if (!c) {
        free(be);
        return;
    }
    cudaStreamSynchronize(c->compute);
    rt_cuda_dnn_release(c);
    if (c->workspace)
        cudaFreeAsync(c->workspace, c->compute);
    for (int i = 0; i < RT_CUDA_SCRATCH_SLOTS; i++)
        if (c->scratch[i])
            cudaFreeAsync(c->scratch[i], c->compute);
    for (int i = 0; i < c->nretired; i++)
        cudaFreeAsync(c->retired[i], c->compute);
    rt_input_pair_fini(be);
    cudaStreamSynchronize(c->compute);
    if (c->host_stage)
        cudaFreeHost(c->host_stage);
    cublasDestroy(c->blas);
    cudnnDestroy(c->dnn);
    cudaStreamDestroy(c->compute);
    free(c);
    be->cuda = NULL;
    free(be);
}
