/*
 * cuda_be.h - the CUDA backend, private to compute/cuda/ (and to
 * compute/backend.c, which calls rt_cuda_create and rt_cuda_destroy when
 * the build has CUDA). Each rt_cuda_<op>
 * function is one slot of struct rt_ops with the semantics compute.h states
 * (the CPU backend, compute/cpu/, is the reference the GPU tests compare to).
 *
 * Layout: spatial tensors are NCHW on the GPU (the CPU backend's nChw16c or CNHW;
 * the op table hides it: to_nchw/from_nchw convert, gap/flatten produce the
 * same (N, F) row-major features). Every op is issued on the stream's
 * cudaStream_t, asynchronously; nothing in an op synchronises the device
 * except download (which must hand back host data) and sync.
 *
 * Failures: a CUDA, cuDNN or cuBLAS error is not recoverable inside a step,
 * so the check macros print the library's message with file:line and abort
 * the process (under mpirun/srun, the launcher then ends the job).
 *
 * Files: backend_cuda.c (create and destroy: device, stream, handles; memory;
 * the tables), streams_cuda.c (further streams and events), probe_cuda.c
 * (runtime, driver and device count). The reference kernels, which every
 * table starts from: elem.cu (element-wise ops, loss, reductions, casts,
 * optimizers, dropout), spatial.cu (input, layout, batchnorm, pooling, gap,
 * flatten), nhwc16.cu (the 16-bit tables' spatial ops), dnn.c (convolutions
 * through cuDNN's legacy API, linear layers through cuBLAS). The fast tables
 * put over them: fast_elem.cu (+ fast_elem.cuh, the per-vector bodies),
 * fast_bn.cu (+ fast_bn.cuh), both on fast.cuh; dnn_fast.c (convolutions
 * chosen among cuDNN's legacy algorithms and its graph API's engines,
 * dnn_graph.c; 16-bit weights cast once per update; padded stems,
 * dnn_kern.cu), dnn_rules.c (their pure rules), dnn_priv.h.
 */
#ifndef RT_COMPUTE_CUDA_BE_H
#define RT_COMPUTE_CUDA_BE_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "compute/backend.h"
#include "compute/compute.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device scratch kept by the backend besides the workspace, one per use, so
 * that an op can hold one while it uses the workspace (all stream-ordered).
 * X32 and Y32 hold the fp32 NCHW copies of a 16-bit convolution's input and
 * output while it runs in fp32 (dnn.c, when no 16-bit algorithm supports it).
 * W and DW: the reference path's per-call 16-bit weights and 16-bit weight
 * gradient. XPAD: a padded stem's 16-bit input, zero channels appended
 * (dnn_fast.c); DW32: a padded stem's fp32 weight gradient over its padded
 * channels, before the real ones are added into dw. */
enum {
    RT_CUDA_SCRATCH_W = 0,
    RT_CUDA_SCRATCH_DW = 1,
    RT_CUDA_SCRATCH_X32 = 2,
    RT_CUDA_SCRATCH_Y32 = 3,
    RT_CUDA_SCRATCH_XPAD = 4,
    RT_CUDA_SCRATCH_DW32 = 5,
    RT_CUDA_SCRATCH_SLOTS = 6
};
/* Scratch blocks kept when outgrown during a graph capture (each a growth: a handful at most). */
enum { RT_CUDA_RETIRED = 16 };

/* A convolution algorithm chosen by measurement, per shape and direction, for
 * the reference tables (dnn.c); or, for 16-bit activations, the decision that
 * none supports the shape. The fast tables keep their own cache (dnn_fast.c). */
struct rt_cuda_algo {
    struct rt_conv_desc d;
    int dir;                /* 0 forward, 1 backward data, 2 backward filter */
    int dt;                 /* enum rt_dtype of the activations */
    int algo;               /* cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t */
    size_t workspace;
    int in_f32;             /* 1: no cuDNN algorithm takes this shape and direction in dt (NHWC); the call
                               converts to fp32 NCHW and runs the fp32 table's convolution (algo unused) */
    float ms;               /* Find's time of the chosen algorithm, ms (0 with in_f32) */
    int candidates;         /* how many Find listed */
    int deterministic;      /* Find's determinism of the chosen algorithm */
    int tensor_cores;       /* Find's math type of it was a tensor-op one */
};

struct rt_cuda_dnn; /* dnn.c */

struct rt_cuda {
    int device;
    struct cudaDeviceProp prop;
    cudaStream_t compute;   /* the backend's default stream (rt_backend_stream) */
    cudnnHandle_t dnn;      /* bound to `compute` */
    cublasHandle_t blas;    /* bound to `compute` */
    void *workspace;        /* cuDNN workspace, grown on demand (rt_cuda_workspace) */
    size_t workspace_bytes;
    struct rt_cuda_algo *algos; /* the cache of chosen algorithms (dnn.c) */
    int nalgos, cap_algos;
    float *host_stage;      /* pinned staging for input_u8 and small uploads */
    size_t host_stage_bytes;
    void *scratch[RT_CUDA_SCRATCH_SLOTS]; /* rt_cuda_scratch */
    size_t scratch_bytes[RT_CUDA_SCRATCH_SLOTS];
    void *retired[RT_CUDA_RETIRED]; /* scratch outgrown during a graph capture, freed with the backend */
    int nretired;
    /* The tables (rt_backend_ops, rt_backend_ops_for): fast (fast_elem.cu, fast_bn.cu over the rest) and their
     * reference twins (elem.cu, spatial.cu, nhwc16.cu alone: rt_backend_ops_reference), [0] bf16, [1] fp16. */
    struct rt_ops fast32, fast16[2];
    struct rt_ops ref32, ref16[2];
    int reference;          /* 1: RINGTRAIN_CUDA_KERNELS=reference, the twins are the backend's own tables */
    int tf32;               /* rt_backend_opts.tf32: fp32 convolutions may use TF32 */
    int nondeterministic;   /* rt_backend_opts.nondeterministic: cuDNN may pick non-deterministic algorithms */
    struct rt_cuda_dnn *dnn_state; /* dnn_fast.c's own state (chosen plans and algorithms, 16-bit weight copies),
                                      NULL until the first fast convolution or linear layer */
};

/*
 * The CUDA backend (backend_cuda.c), for compute/backend.c's rt_backend_create
 * and rt_backend_destroy. rt_cuda_create opens GPU o->device: 0 with the
 * backend in *out (owned by the caller), or -ENODEV (no driver, too old a
 * driver, no such device, too old a GPU), -ENOMEM, or the error of loading
 * cuDNN and cuBLAS, with rt_errmsg() saying why. rt_cuda_destroy drains its
 * stream and frees it with everything it holds; NULL is fine.
 */
int rt_cuda_create(const struct rt_backend_opts *o, struct rt_backend **out);
void rt_cuda_destroy(struct rt_backend *be);

/* Streams, events and stream-ordered memory (streams_cuda.c), over which compute/input.c runs the input uploads. */
extern const struct rt_backend_streams rt_cuda_streams;

/*
 * probe_cuda.c: whether this build's CUDA runtime can use the machine's
 * NVIDIA driver, decided from what the runtime reported, so that every
 * combination can be tested without a GPU (tests/test_cuda_version.c).
 * `driver` and `runtime` are cudaDriverGetVersion's and
 * cudaRuntimeGetVersion's figures (1000 * major + 10 * minor; driver 0: no
 * driver). `count_err` is what cudaGetDeviceCount returned (a cudaError_t)
 * and `count_text` its cudaGetErrorString; pass -1 and NULL before counting,
 * to judge the versions alone. The checks, in order:
 *   1. no driver: "no NVIDIA driver on this machine";
 *   2. a driver of an older major CUDA version than the runtime, or
 *      cudaErrorInsufficientDriver from the count with an older driver:
 *      "the NVIDIA driver supports CUDA 12.4, older than the 13.0 this build
 *      needs: update the driver". Within a major version an older driver
 *      may serve a newer runtime (CUDA's minor version compatibility), so
 *      only the count can refuse it;
 *   3. cudaErrorInsufficientDriver with a driver as new as the runtime
 *      (both versions named), cudaErrorSystemDriverMismatch (the kernel
 *      module and the driver's libraries differ), any other count error
 *      ("no usable GPU: <count_text>").
 * Returns 0 (usable so far: the caller still checks that the count is not 0),
 * or -ENODEV with `msg` (len bytes, len > 0) saying why, without the
 * alternative (the caller adds "use --device cpu"). Pure and thread-safe.
 */
int rt_cuda_driver_verdict(int driver, int runtime, int count_err, const char *count_text, char *msg, size_t len);

/*
 * The oldest NVIDIA driver branch that runs CUDA runtime `runtime` (1000 *
 * major + 10 * minor) under CUDA's minor version compatibility: 580 for
 * 13.x, 525 for 12.x, 450 for 11.x; 0 for a major version this table does
 * not know. The verdict's messages name it. Pure.
 */
int rt_cuda_min_driver(int runtime);

/* Prints "[rank/world] error: <lib> error <code> (<msg>) in <expr> at file:line" and aborts. */
void rt_cuda_fail(const char *lib, int code, const char *msg, const char *expr, const char *file, int line)
    __attribute__((noreturn));

#define RT_CUDA_CHECK(call)                                                                                          \
    do {                                                                                                             \
        cudaError_t e_ = (call);                                                                                     \
        if (e_ != cudaSuccess)                                                                                       \
            rt_cuda_fail("CUDA", (int)e_, cudaGetErrorString(e_), #call, __FILE__, __LINE__);                        \
    } while (0)
#define RT_CUDNN_CHECK(call)                                                                                         \
    do {                                                                                                             \
        cudnnStatus_t e_ = (call);                                                                                   \
        if (e_ != CUDNN_STATUS_SUCCESS)                                                                              \
            rt_cuda_fail("cuDNN", (int)e_, cudnnGetErrorString(e_), #call, __FILE__, __LINE__);                      \
    } while (0)
#define RT_CUBLAS_CHECK(call)                                                                                        \
    do {                                                                                                             \
        cublasStatus_t e_ = (call);                                                                                  \
        if (e_ != CUBLAS_STATUS_SUCCESS)                                                                             \
            rt_cuda_fail("cuBLAS", (int)e_, cublasGetStatusString(e_), #call, __FILE__, __LINE__);                   \
    } while (0)
/* After a kernel launch: launch errors (bad configuration) surface here. */
#define RT_CUDA_LAUNCHED() RT_CUDA_CHECK(cudaPeekAtLastError())

static inline cudaStream_t rt_cuda_stream(struct rt_stream *s)
{
    return (cudaStream_t)s->handle;
}

static inline struct rt_cuda *rt_cuda_of(struct rt_stream *s)
{
    return s->be->cuda;
}

/* At least `bytes` of device workspace owned by the backend (grown with
 * cudaFreeAsync/cudaMallocAsync on the stream; never NULL: aborts when the
 * device is out of memory, naming the size). Valid until the next call. */
void *rt_cuda_workspace(struct rt_stream *s, size_t bytes);
/* At least `bytes` of pinned host memory for staging uploads; the stream is
 * synchronised first if the previous contents may still be in flight. */
void *rt_cuda_host_stage(struct rt_stream *s, size_t bytes);

/* At least `bytes` of device scratch in slot `slot` (RT_CUDA_SCRATCH_*), grown like the workspace. */
void *rt_cuda_scratch(struct rt_stream *s, int slot, size_t bytes);
/* A host uint8 batch of `bytes` copied to the device (through pinned staging) on the stream; the
 * returned device copy lives in the workspace until the next op that takes the workspace. */
const uint8_t *rt_cuda_stage_images(struct rt_stream *s, const uint8_t *host, size_t bytes);

/*
 * The ops: rt_cuda_<op> for every op of compute.h's RT_OPS_LIST, with the
 * signature given there. backend_cuda.c holds memory; spatial.cu input,
 * layout, batchnorm, pooling, gap and flatten; dnn.c the convolutions and
 * linear layers; elem.cu the element-wise ops, loss, reductions, casts and
 * optimizer updates.
 */
#define RT_CUDA_OP_DECLARE(ret, name, params, args) ret rt_cuda_##name params;
RT_OPS_LIST(RT_CUDA_OP_DECLARE)
#undef RT_CUDA_OP_DECLARE

/* ---- dnn.c, dnn_fast.c (dnn_graph.c, dnn_kern.cu, dnn_rules.c under them: dnn_priv.h) ---- */
/* The 16-bit reference tables' convolution and linear entries (dnn.c). */
void rt_cuda_dnn_fill16(struct rt_ops *t, enum rt_dtype dt);
/* Frees the algorithm caches, plans and 16-bit weight copies (backend destruction). */
void rt_cuda_dnn_release(struct rt_cuda *c);
/* The fast tables' convolution and linear entries (t's activations are dt, t->act), dnn_fast.c: per shape,
 * cuDNN's legacy algorithms and its graph API's engines measured once and the fastest the backend's settings
 * allow kept (deterministic unless rt_cuda.nondeterministic; TF32 in fp32 only with rt_cuda.tf32), 16-bit
 * weights cast once per update, stems padded to 8 channels. The reference tables keep dnn.c's first
 * convolutions (cuDNN's legacy Find, deterministic, no tensor cores in fp32, 16-bit weights cast on every
 * call), the proven way back. RINGTRAIN_CUDNN_GRAPH=0 in the environment leaves the graph API out. */
void rt_cuda_fast_dnn_fill(struct rt_ops *t, enum rt_dtype dt);
/* rt_backend_conv_choices for the CUDA backend: the fast tables' choices, then the reference tables' (their
 * `how` starting "reference: "). */
int rt_cuda_conv_choices(const struct rt_cuda *c, struct rt_conv_choice *out, int cap);
/* Device memory at p was freed (rt_cuda_free): the 16-bit weight copies dnn_fast.c made from memory that a
 * later allocation may reuse are all made again before their next use (the freed block's size is not known
 * here, and frees are rare). Host work only. */
void rt_cuda_freed(struct rt_cuda *c, const void *p);
/*
 * An op of the fp32 table is about to write [dst, dst + bytes) of device memory on stream s (upload, copy,
 * zero, from_nchw, the optimizer updates, scale, axpy, the casts into fp32): whatever dnn.c derived from
 * that memory (the 16-bit copies of convolution and linear weights, made once per update) is made again
 * before its next use. Every fp32-table op that can write a float buffer other than an activation calls it,
 * fast and reference kernels alike. Host work only, a few comparisons per cached weight.
 */
void rt_cuda_wrote(struct rt_stream *s, const void *dst, size_t bytes);

/* ---- fast_elem.cu, fast_bn.cu: the fast kernels over a table of the reference ones ---- */
/* Replace the element-wise entries (ReLU, add, add_relu, scale, axpy, ...) of table t, whose activations are
 * dt, with the vectorised kernels, and set t->add_relu where they fuse the residual add with its ReLU. */
void rt_cuda_fast_elem_fill(struct rt_ops *t, enum rt_dtype dt);
/* The batchnorm entries alike; sets t->bn_relu (the fast batchnorm honours rt_bn_desc.relu). */
void rt_cuda_fast_bn_fill(struct rt_ops *t, enum rt_dtype dt);

/* ---- nhwc16.cu: the 16-bit tables' spatial entries and dnn.c's helpers ---- */
void rt_cuda_spatial_fill16(struct rt_ops *t, enum rt_dtype dt);
/* w (k, c, rs) fp32 -> 16-bit, as (k, rs, c) when krsc. */
void rt_cuda_h_weights(struct rt_stream *s, enum rt_dtype dt, int k, int c, int rs, int krsc, const float *w,
                       void *out);
/* dw (k, c, rs) fp32 += g (k, rs, c) 16-bit. */
void rt_cuda_h_dw_acc(struct rt_stream *s, enum rt_dtype dt, int k, int c, int rs, const void *g, float *dw);
/* y (rows, c) 16-bit += b (c) fp32; db (c) fp32 += column sums of dy (rows, c) 16-bit. */
void rt_cuda_h_bias_add(struct rt_stream *s, enum rt_dtype dt, size_t rows, size_t c, const float *b, void *y);
void rt_cuda_h_bias_grad(struct rt_stream *s, enum rt_dtype dt, size_t rows, size_t c, const void *dy, float *db);
/* x (sh) 16-bit NHWC -> y fp32 NCHW, device to device (exact). */
void rt_cuda_h_to_f32(struct rt_stream *s, enum rt_dtype dt, struct rt_shape4 sh, const void *x, float *y);
/* y (sh) 16-bit NHWC = beta * y + x (fp32 NCHW), rounded once; beta 0 does not read y. */
void rt_cuda_h_from_f32(struct rt_stream *s, enum rt_dtype dt, struct rt_shape4 sh, const float *x, float beta,
                        void *y);

/* ---- elem.cu ---- */
/* The 16-bit tables' element-wise, loss and reduction entries. */
void rt_cuda_elem_fill16(struct rt_ops *t, enum rt_dtype dt);

#ifdef __cplusplus
}
#endif

#endif
