/*
 * compute.h - ringtrain's compute stage: backends behind one op table,
 * models built from those ops, optimizers, learning-rate schedules and the
 * safetensors weight format.
 *
 * Layers of this module, bottom up:
 *
 *   backend   struct rt_backend owns a device (the CPU's cores, or one GPU),
 *             all tensor memory and its streams; struct rt_ops is the op table
 *             every backend implements the same way. Ops are issued on a
 *             stream: the CPU backend runs them in order before returning, the
 *             CUDA backend enqueues them.
 *   model     struct rt_model builds a network (mnist-net, resnet18, resnet50,
 *             resnet9, wrn-D-K) from ops, keeps parameters and gradients in one flat
 *             buffer each, laid out as backward finishes them, and runs
 *             forward, loss and backward on a uint8 batch.
 *   optim     SGD / Adam / AdamW over a model's flat buffers (bound to the
 *             model at creation), global-norm clipping, loss scaling's
 *             unscale, and the learning-rate schedules.
 *   format    safetensors reading and writing (PyTorch state_dict names).
 *
 * Tensor layout. Parameters are always in PyTorch's layout (conv weights
 * (Cout, Cin, kh, kw), linear weights (out, in)). Activations -- the
 * "spatial" tensors of logical shape (N, C, H, W) -- are in the backend's own
 * layout: the CPU backend keeps them in oneDNN's blocked nChw16c when C is a
 * multiple of 16 (what its convolutions run on, so no reorder between layers)
 * and channel-major (C, N, H, W) otherwise (cpu/cpu.h); the CUDA backend NCHW
 * in fp32 and NHWC in 16 bits. "Feature" tensors, (N, F) row-major, are the
 * same on every backend; flatten and global pooling convert.
 *
 * This module never calls MPI or NCCL; it knows nothing of the loader beyond
 * the uint8 batch it is handed.
 */
#ifndef RT_COMPUTE_H
#define RT_COMPUTE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

enum rt_backend_kind { RT_BACKEND_CPU = 0, RT_BACKEND_CUDA = 1 };

/*
 * Element type of activations (mixed precision). Parameters, their
 * gradients, optimizer state and batchnorm statistics are always fp32; with
 * RT_BF16 or RT_F16 the activations and their gradients are 16-bit and the
 * convolutions and linear layers run on tensor cores with fp32 accumulation
 * (PyTorch's autocast, with the weights cast once per call of the layer).
 */
enum rt_dtype { RT_F32 = 0, RT_BF16 = 1, RT_F16 = 2 };
const char *rt_dtype_name(enum rt_dtype t); /* "fp32", "bf16", "fp16" */

struct rt_backend_probe {
    int compiled;          /* 1 if this build has the backend */
    int devices;           /* usable devices: CPUs for cpu, GPUs for cuda (0 = none) */
    int runtime_version;   /* CUDA runtime as 1000*major + 10*minor; 0 for cpu */
    int driver_version;    /* CUDA driver, 0 when no driver is installed */
    int driver_needed;     /* CUDA: the oldest NVIDIA driver branch this runtime runs on (580 for CUDA 13.x), 0: unknown */
    char detail[256];      /* one human line: why no device, library versions */
};

/*
 * Probes backend `b` without initialising anything lasting (no CUDA context is
 * kept). Safe on machines with no GPU or no driver. Returns 0, or -ENOTSUP
 * when the backend is not compiled in (`p->compiled` = 0 then).
 */
int rt_backend_probe(enum rt_backend_kind b, struct rt_backend_probe *p);

/* ==== backend and op table ============================================== */

/* How the CPU backend runs ops (rt_backend_async): ENV reads RINGTRAIN_CPU_STREAMS ("async" or "sync", unset: sync). */
enum rt_cpu_streams { RT_CPU_STREAMS_ENV = 0, RT_CPU_STREAMS_SYNC, RT_CPU_STREAMS_ASYNC };

struct rt_backend_opts {
    enum rt_backend_kind kind;
    int threads;           /* CPU: worker threads (0 = the CPUs this process may use) */
    int device;            /* CUDA: device ordinal */
    enum rt_cpu_streams cpu_streams; /* CPU: synchronous ops (default) or asynchronous streams */
    /* CUDA: fp32 convolutions may run on TF32 tensor cores (10-bit mantissa inputs, fp32 accumulation), as
     * PyTorch's default torch.backends.cudnn.allow_tf32 = True; linear layers stay strict fp32 either way, as
     * PyTorch's matmuls. 0, a zeroed struct's value, is strict fp32: what every comparison with the CPU needs.
     * `train --tf32` defaults to on. Ignored on the CPU. TF32 results are still deterministic. */
    int tf32;
    /* CUDA: cuDNN may pick convolution algorithms whose results are not bitwise reproducible (they sum with
     * atomics), where they are faster. 0, the default: only deterministic algorithms, so that a run and its
     * resume give the same bits (`train --deterministic off` sets 1). Ignored on the CPU. */
    int nondeterministic;
};

struct rt_backend;         /* opaque: a device, its memory and its streams */
struct rt_stream;          /* opaque: an in-order queue of ops */

/*
 * Opens a backend. Returns 0 and stores it in *out, or -errno with
 * rt_errmsg() saying why (no such device, library missing). Not thread-safe:
 * one thread creates, uses and destroys a backend.
 */
int rt_backend_create(const struct rt_backend_opts *o, struct rt_backend **out);
void rt_backend_destroy(struct rt_backend *be); /* NULL is fine */

/* The op table and the default stream of `be` (both owned by `be`). */
const struct rt_ops *rt_backend_ops(const struct rt_backend *be);
/*
 * The op table whose activations are of type `act` (rt_backend_ops() is the
 * RT_F32 one), or NULL with rt_errmsg() saying why the backend cannot (bf16
 * needs a CPU with AVX512_BF16 or AMX, or a GPU of compute capability 8.0 or
 * later; the CPU has no fp16 table). In such a table every activation argument -- x, y, dx, dy,
 * logits, dlogits and the element-wise ops' operands -- points at `act`
 * elements, and spatial tensors may be in another layout than the fp32
 * table's (the CUDA backend's 16-bit tables are NHWC, for the tensor cores).
 * Weights, biases, batchnorm parameters and statistics, every parameter
 * gradient, the loss statistics and the optimizer and cast ops stay fp32
 * as in the RT_F32 table.
 */
const struct rt_ops *rt_backend_ops_for(const struct rt_backend *be, enum rt_dtype act);
/*
 * The twin of rt_backend_ops_for(be, act) built from the simple reference kernels, or NULL where the backend
 * keeps none (the CPU, whose tables are the reference everything else is checked against). The CUDA backend
 * keeps the first, straightforward kernels (one element per thread) beside the fast ones (16-byte vectors,
 * fused batchnorm + ReLU and residual add + ReLU): tests run both on the same device and compare, and
 * RINGTRAIN_CUDA_KERNELS=reference in the environment when the backend is created makes the twins the
 * backend's own tables (rt_backend_ops and rt_backend_ops_for then return them), a proven way back should a
 * fast kernel misbehave. The twins fuse nothing (bn_relu and add_relu 0). NULL also when `act` has no table.
 */
const struct rt_ops *rt_backend_ops_reference(const struct rt_backend *be, enum rt_dtype act);
struct rt_stream *rt_backend_stream(struct rt_backend *be);
/* Which backend `be` is. */
enum rt_backend_kind rt_backend_kind_of(const struct rt_backend *be);
/* The CUDA device ordinal `be` drives, -1 on the CPU. */
int rt_backend_device(const struct rt_backend *be);
/* The GPU's PCI bus id ("0000:3B:00.0", which NVML finds it by), NULL on the CPU. Owned by `be`. */
const char *rt_backend_pci_bus_id(const struct rt_backend *be);
/* The default stream's native handle (a cudaStream_t), NULL on the CPU: for
 * the comm stage, which orders its NCCL stream against it with events. */
void *rt_backend_native_stream(struct rt_backend *be);
/* One line for the banner, e.g. "cpu: 2 threads, OpenBLAS 0.3.21 (SkylakeX)". */
const char *rt_backend_describe(const struct rt_backend *be);

/*
 * Input batches, asynchronously. rt_backend_input_upload() starts copying
 * `bytes` of host uint8 images (and what follows them in the same block
 * that the step reads: the trainer's labels, rt_step_opts.labels_dev) into
 * the next of the backend's two device
 * input buffers, on its copy stream (CUDA), and returns that buffer and a
 * ticket; the copy first waits until compute has finished reading what the
 * buffer held two uploads ago. Compute consumes it with
 * rt_step_opts.input_ticket: the step's first op waits for the copy (an
 * event, no host wait) and marks the buffer consumed after reading it.
 * rt_backend_input_wait() blocks the host until the copy has read the host
 * memory, so that a ring slot can be reused. From page-locked memory
 * (rt_backend_host_alloc) the copy is a DMA that overlaps compute. On the
 * CPU backend the returned pointer is `host` itself and the rest does
 * nothing.
 */
const uint8_t *rt_backend_input_upload(struct rt_backend *be, const uint8_t *host, size_t bytes, uint64_t *ticket);
void rt_backend_input_wait(struct rt_backend *be, uint64_t ticket);

/*
 * Events: a point in a stream's queue, for work on another thread or stream
 * that must follow it (the comm stage's all-reduce of a gradient bucket
 * follows the backward ops that wrote it). CUDA events on the CUDA backend;
 * fences between worker threads on the CPU backend's asynchronous streams
 * (rt_backend_async); on the ordinary CPU backend every op has finished when
 * it returns, so an event is always passed.
 *
 * rt_event_create() returns 0 and the event in *out, or -errno (rt_errmsg()).
 * rt_event_record() marks the point after everything issued on `s` so far (a
 * later record moves it). rt_event_synchronize() blocks the calling thread
 * until that point has passed (at once if the event was never recorded); it
 * may be called from another thread than the one that records, provided the
 * record happened before (the comm thread is handed the bucket after it was
 * recorded). rt_stream_wait_event() makes ops issued on `s` after it wait for
 * the point, without blocking the caller. destroy(NULL) is fine; an event
 * must not be in use when destroyed.
 */
struct rt_event;
int rt_event_create(struct rt_backend *be, struct rt_event **out);
void rt_event_destroy(struct rt_event *e);
void rt_event_record(struct rt_event *e, struct rt_stream *s);
void rt_event_synchronize(struct rt_event *e);
void rt_stream_wait_event(struct rt_stream *s, struct rt_event *e);
/*
 * Host work in a stream's order: fn(arg) runs when `s` reaches this point,
 * and the ops issued on `s` after it wait for it to return -- how a stream
 * waits for something only the host knows (the MPI all-reduce of host
 * gradients). A queued call on the CPU backend's asynchronous streams,
 * cudaLaunchHostFunc on CUDA (fn must not call CUDA then), and at once on
 * the ordinary CPU backend. fn runs on another thread than the caller's
 * everywhere but there; `arg` must stay valid until it has run.
 */
void rt_stream_call(struct rt_stream *s, void (*fn)(void *arg), void *arg);

/*
 * Graphs: the work issued on the default stream between
 * rt_graph_capture_begin() and rt_graph_capture_end() is recorded, not run,
 * and rt_graph_launch() queues all of it again, as it was issued and with
 * the same arguments, for the price of one call (CUDA graphs; the CPU
 * backend's asynchronous streams record their queued calls, a twin that
 * runs everywhere). So the captured work must not depend on the host: no
 * host wait, no host memory read or written, no event or timeline mark, no
 * host call (rt_stream_call), nothing freed. CUDA rejects these, and
 * aborts through the check macros; the asynchronous CPU streams refuse them
 * and capture_end says which. Pointers and scalars are baked in: a replay
 * reads and writes the same buffers.
 * capture_begin returns 0, or -ENOTSUP (the ordinary CPU backend, whose ops
 * run as they are issued). capture_end returns 0 and the graph in *out, or
 * -errno with rt_errmsg() naming what could not be captured (the recorded
 * work is then dropped, not run). destroy(NULL) is fine; it waits for the
 * graph's queued replays first. One thread captures and launches.
 */
struct rt_graph;
int rt_graph_capture_begin(struct rt_backend *be);
int rt_graph_capture_end(struct rt_backend *be, struct rt_graph **out);
void rt_graph_launch(struct rt_graph *g);
void rt_graph_destroy(struct rt_graph *g);

/*
 * Timelines: when queued work ran, on the host's clock (rt_now_ns), for the
 * step profile and the trace's device tracks. A mark is a point in a
 * stream's queue, like an event; its time is the moment the stream passed
 * it: a CUDA event with timing, read against an anchor event; a stamp the
 * worker writes on the CPU backend's asynchronous streams; the time of the
 * call on the ordinary CPU backend, whose ops are done when they return.
 *
 * rt_timeline_start() forgets the marks and anchors the clock on `s`. With
 * `exact`, the marks' host times are right (the trace): on CUDA the first
 * exact start waits once for `s` to pass a base point, and every anchor's
 * host time is the base's plus the device time between them, read with the
 * marks; without, the anchor's host time is when it was issued, and only the
 * differences between marks are exact (the step profile). rt_timeline_mark()
 * marks the point after everything issued on `s` so far, with a borrowed
 * label (a layer's name, which must outlive the read) and a kind of the
 * caller's; it returns the mark's index, or -1 when the timeline is full.
 * rt_timeline_read(), after a host wait that covers every mark (the step's
 * loss download), returns the count and the marks with their times filled.
 * One thread uses a timeline. Returns of create: 0, or -errno.
 */
struct rt_timeline_mark {
    const char *label;
    int kind;
    uint64_t ns;
};
struct rt_timeline;
int rt_timeline_create(struct rt_backend *be, int capacity, struct rt_timeline **out);
void rt_timeline_destroy(struct rt_timeline *t); /* NULL is fine */
void rt_timeline_start(struct rt_timeline *t, struct rt_stream *s, int exact);
int rt_timeline_mark(struct rt_timeline *t, const char *label, int kind);
int rt_timeline_read(struct rt_timeline *t, const struct rt_timeline_mark **marks);

/*
 * 1 when `be` is the CPU backend with asynchronous streams
 * (RINGTRAIN_CPU_STREAMS=async when it was created): each stream is a worker
 * thread running its ops in order, as a GPU would, so that an op returns
 * before it has run and a missing wait between streams shows up as wrong
 * results (and as a race under ThreadSanitizer). Results equal the ordinary
 * CPU backend's bit for bit. A mode for testing the stream protocol, slower
 * than the default.
 */
int rt_backend_async(const struct rt_backend *be);

/*
 * Host waits: how many times so far the thread that created `be` (the one
 * that queues its work) blocked until the default (compute) stream had run
 * everything queued on it, so that the stream ran dry behind the wait --
 * each download and sync issued on it (and to_nchw where it waits: CUDA,
 * the asynchronous CPU streams), each rt_event_synchronize
 * of, and each rt_timeline_read ending at, the newest point recorded on it
 * (a wait for an older point, with work queued behind it, as when results
 * are read a step late, is not one; nor is another thread's wait, such as
 * the comm thread's for a gradient bucket). Counted the same way on every
 * backend, the ordinary CPU one included, so that a training step's figure
 * means the same everywhere; thread-safe.
 */
uint64_t rt_backend_host_waits(const struct rt_backend *be);

/*
 * Page-locked host memory the device copies from by DMA (cudaHostAlloc, for
 * the ring's slots), or NULL with rt_errmsg() set: the CPU backend has no
 * use for it (the ring mlock()s its own). Freed with rt_backend_host_free.
 */
void *rt_backend_host_alloc(struct rt_backend *be, size_t bytes);
void rt_backend_host_free(struct rt_backend *be, void *p);

/* Logical shape of a spatial tensor; its bytes are n*c*h*w floats in the backend's layout. */
struct rt_shape4 {
    int n, c, h, w;
};

/* A 2-D convolution, PyTorch semantics (dilation 1, groups 1). */
struct rt_conv_desc {
    struct rt_shape4 in;   /* x: (N, Cin, H, W) */
    int cout, kh, kw, stride, pad;
    int oh, ow;            /* filled by rt_conv_desc_init() */
};

/* Fills d->oh/d->ow; -EINVAL with a message if the kernel does not fit the input. */
int rt_conv_desc_init(struct rt_conv_desc *d);

/* Max or average pooling over windows, PyTorch semantics (floor mode). */
struct rt_pool_desc {
    struct rt_shape4 in;
    int kh, kw, stride, pad;
    int oh, ow;            /* filled by rt_pool_desc_init() */
};
int rt_pool_desc_init(struct rt_pool_desc *d);

struct rt_bn_desc {
    struct rt_shape4 in;
    float eps;             /* 1e-5 */
    float momentum;        /* running = (1 - momentum) * running + momentum * batch; 0.1 */
    /* Batchnorm and ReLU in one pass, only in a table whose bn_relu is set: y = max(0, bn(x)) in both forward ops,
     * and bn_bwd takes dy as the gradient of that y, passing it only where bn(x), recomputed from x, is > 0. */
    int relu;
};

/* Outputs of the loss, left in device memory (read back after the step). */
struct rt_loss_stats {
    float loss_sum;        /* sum over valid samples of the smoothed cross-entropy */
    float correct;         /* valid samples whose argmax equals the label */
    float count;           /* valid samples */
};

/*
 * The op table. Every pointer argument is device memory from ops->alloc
 * unless it says "host". Sizes are element counts. Conventions:
 *
 *  - `beta` on a backward op: the op stores beta * out + result, with beta 0
 *    (overwrite) or 1 (add: a tensor feeding two consumers sums its
 *    gradients). Parameter gradients (dw, db, dgamma, dbeta) are always
 *    added to, so that micro-batches accumulate; the caller zeroes the flat
 *    gradient buffer before the first micro-batch of a step
 *    (rt_model_zero_grads).
 *  - Spatial tensors are in the backend's layout (see top of file); feature
 *    tensors are (N, F) row-major.
 *  - Ops return nothing; a CPU op cannot fail once its arguments have passed
 *    the model's shape checks, and CUDA failures abort through the check
 *    macros. Allocation returns NULL with rt_errmsg() set.
 *
 * The ops are written once, here, as X(return type, name, (parameters),
 * (argument names)) in table order; RT_OPS_LIST(X) applies X to each (the
 * names let a wrapper forward a call: cpu/async.c queues every op that way). struct rt_ops below has one
 * member per op, `ret (*name) params`; each backend implements every op as a
 * function of that signature named after it (rt_cpu_<name> in cpu/cpu.h,
 * rt_cuda_<name> in cuda/cuda_be.h, both declared from this list), and its
 * fp32 table points every member at that function. A new op is one line
 * here plus a function in each backend (the link fails until every backend
 * has it). The CUDA backend's 16-bit tables start from its fp32 table and
 * replace the activation ops one by one (the fill16 functions of cuda/).
 */
/* The ops that read or write host memory, or allocate: a backend with streams
 * stages or waits for the host data in each (cpu/async.c does it by hand). */
#define RT_OPS_HOST_LIST(X)                                                                                            \
    /* -- memory -- */                                                                                                 \
    X(void *, alloc, (struct rt_backend *be, size_t bytes), (be, bytes)) /* 256-byte aligned, zeroed */                \
    X(void, free, (struct rt_backend *be, void *p), (be, p))         /* NULL is fine */                                \
    X(void, upload, (struct rt_stream *s, void *dst, const void *host_src, size_t bytes), (s, dst, host_src, bytes))   \
    X(void, download, (struct rt_stream *s, void *host_dst, const void *src, size_t bytes), (s, host_dst, src, bytes)) \
    /* The copy runs when the stream reaches it and the call returns at once (no host wait): host_dst is read       \
     * only after an event recorded after it has passed (rt_event_synchronize). From page-locked memory              \
     * (rt_backend_host_alloc) the CUDA copy is a DMA; from pageable memory it is still correct but slower. */       \
    X(void, download_async, (struct rt_stream *s, void *host_dst, const void *src, size_t bytes),                      \
          (s, host_dst, src, bytes))                                                                                   \
    X(void, sync, (struct rt_stream *s), (s)) /* wait for everything issued */                                         \
                                                                                                                       \
    /* -- layout: host NCHW float <-> backend spatial layout (tests, debugging) -- */                                  \
    X(void, to_nchw, (struct rt_stream *s, struct rt_shape4 sh, const float *x, float *host_nchw),                     \
          (s, sh, x, host_nchw))                                                                                       \
    X(void, from_nchw, (struct rt_stream *s, struct rt_shape4 sh, const float *host_nchw, float *x),                   \
          (s, sh, host_nchw, x))                                                                                       \
                                                                                                                       \
    /*                                                                                                                 \
     * Input: a host uint8 batch (N, C, H, W) as the ring slot holds it, turned                                        \
     * into y = (x / 255 - mean[c]) / std[c] in the backend layout. mean and                                           \
     * std are host arrays of C values in 0..1 units.                                                                  \
     */                                                                                                                \
    X(void, input_u8, (struct rt_stream *s, struct rt_shape4 sh, const uint8_t *host_images, const float *mean,        \
                       const float *std, float *y), (s, sh, host_images, mean, std, y))                                \
    /* The same from device memory (rt_backend_input_upload's buffer); no staging, no host wait. */                    \
    X(void, input_u8_dev, (struct rt_stream *s, struct rt_shape4 sh, const uint8_t *dev_images, const float *mean,     \
                           const float *std, float *y), (s, sh, dev_images, mean, std, y))

/* The ops that touch device memory only: queued on their stream as they are. */
#define RT_OPS_DEVICE_LIST(X)                                                                                          \
    /* -- device memory -- */                                                                                          \
    X(void, copy, (struct rt_stream *s, void *dst, const void *src, size_t bytes), (s, dst, src, bytes))               \
    X(void, zero, (struct rt_stream *s, void *dst, size_t bytes), (s, dst, bytes))                                     \
                                                                                                                       \
    /* -- convolution; w (Cout, Cin, kh, kw), bias (Cout) or NULL -- */                                                \
    X(void, conv2d_fwd, (struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *w,            \
                         const float *bias, float *y), (s, d, x, w, bias, y))                                          \
    X(void, conv2d_bwd_data, (struct rt_stream *s, const struct rt_conv_desc *d, const float *dy, const float *w,      \
                              float beta, float *dx), (s, d, dy, w, beta, dx))                                         \
    X(void, conv2d_bwd_filter, (struct rt_stream *s, const struct rt_conv_desc *d, const float *x, const float *dy,    \
                                float *dw, float *dbias /* NULL: no bias */), (s, d, x, dy, dw, dbias))                \
                                                                                                                       \
    /* -- batchnorm (per channel over N, H, W); gamma/beta/running_* (C) -- */                                         \
    X(void, bn_train_fwd, (struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,        \
                           const float *beta, float *running_mean, float *running_var, float *save_mean,               \
                           float *save_invstd, float *y),                                                              \
                                 (s, d, x, gamma, beta, running_mean, running_var, save_mean, save_invstd, y))         \
    X(void, bn_infer_fwd, (struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *gamma,        \
                           const float *beta, const float *running_mean, const float *running_var, float *y),          \
                                 (s, d, x, gamma, beta, running_mean, running_var, y))                                 \
    /* beta (the shift) is read only with d->relu, to recompute the forward's output */                                \
    X(void, bn_bwd, (struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,                 \
                     const float *gamma, const float *beta, const float *save_mean, const float *save_invstd,          \
                     float beta_dx, float *dx, float *dgamma, float *dbeta),                                           \
                           (s, d, x, dy, gamma, beta, save_mean, save_invstd, beta_dx, dx, dgamma, dbeta))             \
    /* The data gradient of bn_infer_fwd (a frozen layer: running statistics, no parameter gradients):             \
     * dx = beta_dx dx + dy gamma invstd, invstd = (float)(1 / sqrt((double)running_var + eps)) as the forward's;    \
     * with d->relu, dy only where the forward's output, recomputed from x, is > 0 */                                \
    X(void, bn_infer_bwd, (struct rt_stream *s, const struct rt_bn_desc *d, const float *x, const float *dy,           \
                           const float *gamma, const float *beta, const float *running_mean, const float *running_var, \
                           float beta_dx, float *dx),                                                                  \
                                 (s, d, x, dy, gamma, beta, running_mean, running_var, beta_dx, dx))                   \
                                                                                                                       \
    /* -- pooling: y (N, C, oh, ow); backward recomputes the max positions from x -- */                                \
    X(void, maxpool_fwd, (struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y), (s, d, x, y))  \
    X(void, maxpool_bwd, (struct rt_stream *s, const struct rt_pool_desc *d, const float *x, const float *y,           \
                          const float *dy, float beta, float *dx), (s, d, x, y, dy, beta, dx))                         \
    /* Average pooling counts padding in the divisor (PyTorch's count_include_pad=True). */                            \
    X(void, avgpool_fwd, (struct rt_stream *s, const struct rt_pool_desc *d, const float *x, float *y), (s, d, x, y))  \
    X(void, avgpool_bwd, (struct rt_stream *s, const struct rt_pool_desc *d, const float *dy, float beta, float *dx),  \
          (s, d, dy, beta, dx))                                                                                        \
    /* Global average pooling: spatial (N, C, H, W) -> features (N, C). */                                             \
    X(void, gap_fwd, (struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y), (s, sh, x, y))              \
    X(void, gap_bwd, (struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx),               \
          (s, sh, dy, beta, dx))                                                                                       \
    /* Flatten: spatial (N, C, H, W) -> features (N, C*H*W) in PyTorch's order (c, h, w). */                           \
    X(void, flatten_fwd, (struct rt_stream *s, struct rt_shape4 sh, const float *x, float *y), (s, sh, x, y))          \
    X(void, flatten_bwd, (struct rt_stream *s, struct rt_shape4 sh, const float *dy, float beta, float *dx),           \
          (s, sh, dy, beta, dx))                                                                                       \
                                                                                                                       \
    /* -- linear on features: x (N, in), w (out, in), b (out) or NULL, y (N, out) -- */                                \
    X(void, linear_fwd, (struct rt_stream *s, int n, int in, int out, const float *x, const float *w,                  \
                         const float *b, float *y), (s, n, in, out, x, w, b, y))                                       \
    X(void, linear_bwd_data, (struct rt_stream *s, int n, int in, int out, const float *dy, const float *w,            \
                              float beta, float *dx), (s, n, in, out, dy, w, beta, dx))                                \
    X(void, linear_bwd_filter, (struct rt_stream *s, int n, int in, int out, const float *x, const float *dy,          \
                                float *dw, float *db), (s, n, in, out, x, dy, dw, db))                                 \
                                                                                                                       \
    /* -- element-wise over `n` floats (any layout) -- */                                                              \
    X(void, relu_fwd, (struct rt_stream *s, size_t n, const float *x, float *y), (s, n, x, y)) /* y may be x */        \
    X(void, relu_bwd, (struct rt_stream *s, size_t n, const float *y, const float *dy, float beta, float *dx),         \
          (s, n, y, dy, beta, dx))                                                                                     \
    /* GELU, exact (erf) form as torch.nn.GELU() */                                                                    \
    X(void, gelu_fwd, (struct rt_stream *s, size_t n, const float *x, float *y), (s, n, x, y))                         \
    X(void, gelu_bwd, (struct rt_stream *s, size_t n, const float *x, const float *dy, float beta, float *dx),         \
          (s, n, x, dy, beta, dx))                                                                                     \
    /*                                                                                                                 \
     * Inverted dropout with probability p over a tensor of logical shape sh:                                          \
     * spatial = 1 for a spatial tensor (N, C, H, W) in the backend's layout,                                          \
     * spatial = 0 for features (N, F) row-major, passed as sh = (N, F, 1, 1).                                         \
     * Element (n, c, h, w) -- (n, f) of features -- is stream element                                                 \
     * e = offset + L, L = ((n*C + c)*H + h)*W + w its logical (NCHW) index                                            \
     * wherever the layout stores it. It is kept iff u >= p, and scaled by                                             \
     * 1/(1-p), where u = (w >> 8) * 2^-24 and w is word e % 4 of                                                      \
     * rt_philox4x32(key = {seed lo, seed hi}, counter = {e/4 lo, e/4 hi, 0,                                           \
     * 0x64726f70}). So every backend and table, whatever its layout, draws                                            \
     * the same mask for the same logical element (compute/dropout_index.h is                                          \
     * the one implementation); backward regenerates it from (seed, offset):                                           \
     * no mask is stored. With `stream` (a device uint64, read when the op                                             \
     * runs) the pair is drawn there instead: (seed, offset) =                                                         \
     * rt_dropout_node_draw(seed, *stream, offset's low 32 bits, offset >> 56),                                        \
     * so that a graph replays a layer with each micro-batch's stream (pass                                            \
     * the model's seed and start + (node << 56)). NULL: as given.                                                     \
     */                                                                                                                \
    X(void, dropout_fwd, (struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,               \
                          uint64_t offset, const uint64_t *stream, const float *x, float *y),                          \
                                (s, sh, spatial, p, seed, offset, stream, x, y))                                       \
    X(void, dropout_bwd, (struct rt_stream *s, struct rt_shape4 sh, int spatial, float p, uint64_t seed,               \
                          uint64_t offset, const uint64_t *stream, const float *dy, float beta, float *dx),            \
                                (s, sh, spatial, p, seed, offset, stream, dy, beta, dx))                               \
    /* y = a + b; x *= alpha; y += alpha x */                                                                          \
    X(void, add, (struct rt_stream *s, size_t n, const float *a, const float *b, float *y), (s, n, a, b, y))           \
    /* A residual add and the ReLU after it in one pass, where the table's add_relu is set: y = max(0, a + b),     \
     * rounded once (NaN passes, as relu_fwd); y may be a or b. Backward: g = dy where y > 0, else 0 (relu_bwd's   \
     * rule, y being the output), then dxa = g (beta_a 0, dxa not read) or dxa + g (beta_a != 0), and dxb alike;   \
     * a NULL dx is skipped, and dxa and dxb are never the same buffer. Bit for bit add then relu_fwd, and        \
     * relu_bwd then a copy or axpy(1) into each input's gradient. */                                                \
    X(void, add_relu_fwd, (struct rt_stream *s, size_t n, const float *a, const float *b, float *y), (s, n, a, b, y))  \
    X(void, add_relu_bwd, (struct rt_stream *s, size_t n, const float *y, const float *dy, float beta_a, float *dxa,   \
                           float beta_b, float *dxb), (s, n, y, dy, beta_a, dxa, beta_b, dxb))                         \
    X(void, scale, (struct rt_stream *s, size_t n, float alpha, float *x), (s, n, alpha, x))                           \
    X(void, axpy, (struct rt_stream *s, size_t n, float alpha, const float *x, float *y), (s, n, alpha, x, y))         \
                                                                                                                       \
    /*                                                                                                                 \
     * Softmax cross-entropy with label smoothing eps (PyTorch's                                                       \
     * CrossEntropyLoss(label_smoothing=eps)): logits (N, K) features, labels                                          \
     * device int32 (N), label < 0 marks a padding sample that adds nothing.                                           \
     * Adds this batch's sums into *stats (device memory). If                                                          \
     * dlogits is not NULL it receives grad_scale * d(loss_sum)/d(logits)                                              \
     * (zero rows for padding); pass grad_scale = 1 / (samples in the step).                                           \
     * With loss_scale (a device float, read when the op runs) the factor is                                           \
     * grad_scale * *loss_scale, the product rounded to float first (loss                                              \
     * scaling with the scale kept on the device); NULL: grad_scale alone.                                             \
     */                                                                                                                \
    X(void, xent_fwd_bwd, (struct rt_stream *s, int n, int k, const float *logits, const int32_t *labels,              \
                           float label_smoothing, float grad_scale, const float *loss_scale,                           \
                           struct rt_loss_stats *stats, float *dlogits),                                               \
                                 (s, n, k, logits, labels, label_smoothing, grad_scale, loss_scale, stats, dlogits))   \
                                                                                                                       \
    /* -- reductions and checks over flat buffers -- */                                                                \
    /* *out (device float) = sum of x[i]^2 in double precision, stored as float */                                     \
    X(void, sumsq, (struct rt_stream *s, size_t n, const float *x, float *out), (s, n, x, out))                        \
    /* *out (device float) = number of NaN/Inf entries */                                                              \
    X(void, count_nonfinite, (struct rt_stream *s, size_t n, const float *x, float *out), (s, n, x, out))              \
    /* Clipping by global norm with the norm on the device: norm = sqrtf(*sumsq) (sumsq's result); when norm is      \
     * finite and > max_norm, x *= max_norm / (norm + 1e-6f) (torch.nn.utils.clip_grad_norm_'s factor, in fp32),     \
     * else x is left as it is. fp32 x in every table. */                                                            \
    X(void, clip_scale, (struct rt_stream *s, size_t n, const float *sumsq, float max_norm, float *x),                 \
          (s, n, sumsq, max_norm, x))                                                                                  \
    /*                                                                                                                 \
     * Loss scaling (fp32 gradients in every table), the scale a device                                                \
     * float: g *= 1.0f / *scale, and *found (device float) = 1 if any g was                                           \
     * NaN/Inf before scaling, else 0. PyTorch's                                                                       \
     * _amp_foreach_non_finite_check_and_unscale_.                                                                     \
     */                                                                                                                \
    X(void, unscale_check, (struct rt_stream *s, size_t n, float *g, const float *scale, float *found),               \
          (s, n, g, scale, found))                                                                                     \
    /*                                                                                                                 \
     * The scale's update after unscale_check, on the device (PyTorch's                                                \
     * _amp_update_scale_; rt_scaler_update's rule, which the host replays a                                           \
     * step later for its messages): *found != 0: *scale *= backoff, *good = 0;                                        \
     * else ++*good, and when it reaches growth_interval *good = 0 and *scale                                          \
     * *= growth unless that passes 3e38. One thread's work.                                                           \
     */                                                                                                                \
    X(void, scaler_update, (struct rt_stream *s, float *scale, float *good, const float *found, float growth,          \
                            float backoff, int growth_interval), (s, scale, good, found, growth, backoff,              \
                                                                  growth_interval))                                    \
                                                                                                                       \
    /* -- casts (mixed precision); half/bf16 as raw uint16 bits, round to nearest even -- */                           \
    X(void, cast_f32_f16, (struct rt_stream *s, size_t n, const float *x, uint16_t *y), (s, n, x, y))                  \
    X(void, cast_f16_f32, (struct rt_stream *s, size_t n, const uint16_t *x, float *y), (s, n, x, y))                  \
    X(void, cast_f32_bf16, (struct rt_stream *s, size_t n, const float *x, uint16_t *y), (s, n, x, y))                 \
    X(void, cast_bf16_f32, (struct rt_stream *s, size_t n, const uint16_t *x, float *y), (s, n, x, y))                 \
                                                                                                                       \
    /*                                                                                                                 \
     * Optimizer updates over n parameters, torch.optim's semantics exactly                                            \
     * (PyTorch 1.13 as Debian 12 ships it: same order of operations and                                               \
     * fused multiply-adds, so results match bit for bit). `step` counts from 1.                                       \
     * SGD: g' = g + wd p; buf = first ? g' : momentum buf + (1 - dampening) g';                                       \
     *      d = nesterov ? g' + momentum buf : buf (momentum 0: d = g', no buf);                                       \
     *      p -= lr d.                                                                                                 \
     * Adam (decoupled = 0): g' = g + wd p; AdamW (decoupled = 1): p *= 1 - lr wd, g' = g;                             \
     *      m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;                                                              \
     *      p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps).                                         \
     * skip (a device float, read when the op runs), when not NULL and not 0:                                          \
     * nothing is written (loss scaling's skipped update, decided on the device).                                      \
     */                                                                                                                \
    X(void, sgd_update, (struct rt_stream *s, size_t n, float *p, const float *g, float *buf, float lr,                \
                         float momentum, float dampening, float weight_decay, int nesterov, int first,                 \
                         const float *skip), (s, n, p, g, buf, lr, momentum, dampening, weight_decay, nesterov,        \
                                              first, skip))                                                            \
    X(void, adam_update, (struct rt_stream *s, size_t n, float *p, const float *g, float *m, float *v, float lr,       \
                          float beta1, float beta2, float eps, float weight_decay, int decoupled, int64_t step,        \
                          const float *skip), (s, n, p, g, m, v, lr, beta1, beta2, eps, weight_decay, decoupled,       \
                                               step, skip))

#define RT_OPS_LIST(X) RT_OPS_HOST_LIST(X) RT_OPS_DEVICE_LIST(X)

/*
 * The 16-bit tables' rule, shared by every backend: the ops whose activation
 * arguments take the table's type. A bf16 or fp16 table (rt_backend_ops_for)
 * replaces exactly these and keeps every other op of its fp32 table -- the
 * memory ops, the casts, loss scaling and the optimizer updates, all on fp32
 * buffers. rt_ops_check_act_table() checks a table against the rule (the CPU's
 * bf16 table in test_cpu_bf16, the CUDA tables in test_cuda_ops).
 */
#define RT_OPS_ACT_LIST(X)                                                                                             \
    X(to_nchw) X(from_nchw) X(input_u8) X(input_u8_dev) X(conv2d_fwd) X(conv2d_bwd_data) X(conv2d_bwd_filter)          \
    X(bn_train_fwd) X(bn_infer_fwd) X(bn_bwd) X(bn_infer_bwd) X(maxpool_fwd) X(maxpool_bwd) X(avgpool_fwd)             \
    X(avgpool_bwd) X(gap_fwd) X(gap_bwd) X(flatten_fwd) X(flatten_bwd) X(linear_fwd) X(linear_bwd_data)                \
    X(linear_bwd_filter) X(relu_fwd) X(relu_bwd) X(gelu_fwd) X(gelu_bwd) X(dropout_fwd) X(dropout_bwd) X(add)          \
    X(add_relu_fwd) X(add_relu_bwd) X(scale) X(axpy) X(xent_fwd_bwd) X(sumsq) X(count_nonfinite)

/* One member of struct rt_ops: a pointer to the op's function. */
#define RT_OPS_MEMBER(ret, name, params, args) ret(*name) params;

struct rt_ops {
    enum rt_dtype act; /* the activations' element type in this table (rt_backend_ops_for) */
    int bn_relu;       /* 1: the batchnorm ops honour rt_bn_desc.relu (the model then fuses BN + ReLU) */
    int add_relu;      /* 1: the model runs a residual add and the ReLU after it as add_relu_fwd/add_relu_bwd */
    RT_OPS_LIST(RT_OPS_MEMBER)
};

#undef RT_OPS_MEMBER

/* 0 if `t16` replaces exactly the RT_OPS_ACT_LIST ops of `t32` (each non-NULL) and shares every other; -EINVAL
 * naming the first op that breaks the rule in rt_errmsg() otherwise. */
int rt_ops_check_act_table(const struct rt_ops *t16, const struct rt_ops *t32);

/*
 * What the backend chose for each convolution it has run: one row per (shape, direction, activation type),
 * in the order they were first run. The CUDA backend measures the candidates once per shape (cuDNN's
 * algorithms and engines) and keeps the fastest its rules allow (deterministic unless
 * rt_backend_opts.nondeterministic; TF32 only with rt_backend_opts.tf32). The CPU backend reports none.
 */
enum rt_conv_dir { RT_CONV_FWD = 0, RT_CONV_BWD_DATA = 1, RT_CONV_BWD_FILTER = 2 };
struct rt_conv_choice {
    struct rt_conv_desc d;  /* the shape, its batch size included */
    enum rt_conv_dir dir;
    enum rt_dtype dt;       /* the activations' type */
    char how[112];          /* what runs it, e.g. "cudnn legacy IMPLICIT_PRECOMP_GEMM", "cudnn engine 29 (knobs
                             * ...)", "fp32 NCHW (no 16-bit algorithm)" */
    float ms;               /* its measured time, ms per call; 0 when it was not measured */
    size_t workspace;       /* bytes */
    int deterministic;      /* 1: bitwise reproducible */
    int tensor_cores;       /* 1: runs on tensor cores (TF32 for fp32) */
    int candidates;         /* how many were measured for it */
};
/* Fills out[0 .. min(count, cap)) and returns the count (0 on the CPU). `be` is only read: call it between
 * steps, from the thread that runs them. */
int rt_backend_conv_choices(const struct rt_backend *be, struct rt_conv_choice *out, int cap);

/* ==== models ============================================================== */

enum rt_param_kind {
    RT_PARAM = 0,          /* trained: in the parameter and gradient buffers */
    RT_BUFFER = 1,         /* state (batchnorm running mean/var): in the buffer buffer, fp32 */
    RT_BUFFER_I64 = 2,     /* num_batches_tracked: host int64 kept by the model */
};

/* One row of the tensor table shared by checkpoints, tests, the optimizer and the bucketer. */
struct rt_tensor_info {
    char name[96];         /* PyTorch state_dict name, e.g. "layer1.0.bn1.running_mean" */
    enum rt_param_kind kind;
    size_t offset;         /* in floats, into the parameter/gradient buffer (PARAM) or buffer buffer */
    size_t count;
    int ndim;
    int64_t shape[4];
    int frozen;            /* its layer is frozen (rt_model_opts.freeze): a PARAM has no gradient and no optimizer
                            * state and lies past rt_model_trainable_count(); a batchnorm's buffers stay as they are */
    int head;              /* a tensor of the classifier, the layer that computes the logits */
};

struct rt_model_opts {
    const char *name;      /* "mnist-net", "resnet18", "resnet50", "resnet9", "wrn-D-K" */
    int c, h, w;           /* input image shape; any h, w the model's pooling allows (models.c), square or not */
    int classes;
    int batch;             /* largest batch forward will see */
    uint64_t seed;         /* initial weights and dropout stream */
    enum rt_dtype act;     /* activations' element type (RT_F32 default; see rt_backend_ops_for) */
    /* The op table to build on, or NULL for rt_backend_ops_for(be, act). A table of `be`'s with some ops
     * wrapped (the tests plant faults in one op this way); its act must be `act`, and a 16-bit one must keep
     * rt_ops_check_act_table's rule against rt_backend_ops(be). Borrowed: it must outlive the model. */
    const struct rt_ops *ops;
    /*
     * Layers to freeze, or NULL: comma-separated fnmatch(3) globs matched against the parameters' state_dict
     * names ("conv1.*,bn1.*,layer1.*"; `*` crosses dots). A layer is frozen when every parameter of it matches;
     * one matched in part (a weight without its bias) or a glob matching nothing is -EINVAL naming it. A frozen
     * layer gets no gradient (backward computes only the data gradients something trainable needs, and nothing
     * at all below the lowest trainable layer), its parameters are laid out after the trainable ones, and a
     * frozen batchnorm runs in inference mode in training too (running statistics and num_batches_tracked
     * untouched), as requires_grad_(False) plus .eval() on those modules does in PyTorch.
     */
    const char *freeze;
};

struct rt_model;

/*
 * Builds model o->name for inputs (batch, c, h, w) on backend `be` (borrowed,
 * must outlive the model), with PyTorch's default initialisation drawn from
 * o->seed. Returns 0, -EINVAL (unknown name: the message lists the models;
 * input too small for the architecture -- resnet9 under 8x8, mnist-net under
 * 6x6; the ResNets and WideResNets take any size -- the message names the
 * size given and the size needed, "resnet9: input 3x4x4 too small: needs at
 * least 8x8 (...)";
 * o->ops not a table for o->act), -ENOTSUP (the backend has no table for
 * o->act: the message says why), or -ENOMEM.
 */
int rt_model_create(struct rt_backend *be, const struct rt_model_opts *o, struct rt_model **out);
void rt_model_destroy(struct rt_model *m); /* NULL is fine */

/* Comma-separated model names for help text. */
const char *rt_model_names(void);

/* The tensor table in state_dict order of the PyTorch module; owned by m. */
const struct rt_tensor_info *rt_model_tensors(const struct rt_model *m, int *count);
size_t rt_model_param_count(const struct rt_model *m);   /* floats in the parameter buffer */
/* Floats [0, n) of the parameter buffer that train: the whole gradient buffer, what the optimizer, clipping and
 * the all-reduce cover. rt_model_param_count() when nothing is frozen. */
size_t rt_model_trainable_count(const struct rt_model *m);
/* The classifier (the layer computing the logits): its name ("fc"), and the floats [0, n) of the parameter
 * buffer it holds (it is laid out first), 0 when it is frozen. */
const char *rt_model_head_name(const struct rt_model *m);
size_t rt_model_head_count(const struct rt_model *m);
/* Parameters (elements) in trainable and in frozen layers, for banners. */
void rt_model_param_split(const struct rt_model *m, uint64_t *trainable, uint64_t *frozen);
int rt_model_node_count(const struct rt_model *m);       /* layers (ops) of the graph: a step's timeline marks */
size_t rt_model_buffer_count(const struct rt_model *m);  /* floats in the buffer buffer */
float *rt_model_params(struct rt_model *m);              /* device */
float *rt_model_grads(struct rt_model *m);               /* device */
float *rt_model_buffers(struct rt_model *m);             /* device */
/* num_batches_tracked: of the trainable batchnorms (which count together; the first's when all are frozen), and
 * set on every batchnorm. A frozen batchnorm keeps its own: rt_model_tracked() reads it by its tensor-table row. */
int64_t rt_model_batches_tracked(const struct rt_model *m);
void rt_model_set_batches_tracked(struct rt_model *m, int64_t v);
int64_t rt_model_tracked(const struct rt_model *m, int row);
void rt_model_set_tracked(struct rt_model *m, int row, int64_t v);
const char *rt_model_name(const struct rt_model *m);
enum rt_dtype rt_model_act(const struct rt_model *m);
struct rt_backend *rt_model_backend(const struct rt_model *m);

/* Which of the model's flat buffers (all fp32, on the model's backend). */
enum rt_model_buf {
    RT_MODEL_PARAMS = 0,   /* parameters: rt_model_param_count() floats, laid out as the tensor table says */
    RT_MODEL_GRADS,        /* their gradients: the same layout, rt_model_trainable_count() floats */
    RT_MODEL_BUFFERS,      /* batchnorm running statistics: rt_model_buffer_count() floats */
};

/*
 * Zeroes the gradient buffer, in stream order on the backend's default
 * stream (no host wait): before the first micro-batch of an optimizer step,
 * since rt_model_step adds into it.
 */
void rt_model_zero_grads(struct rt_model *m);

/*
 * Copy floats [offset, offset + count) of buffer `which` to host `dst`
 * (read) or from host `src` (write), in stream order on the backend's
 * default stream. read returns once the data is on the host; write returns
 * once `src` may be reused (the ops issued after it see the new values).
 * count 0 is fine and does nothing. A range beyond the buffer is the
 * caller's bug: the process aborts with a message naming it. Not
 * thread-safe (one thread drives a model).
 */
void rt_model_read(struct rt_model *m, enum rt_model_buf which, size_t offset, size_t count, float *dst);
void rt_model_write(struct rt_model *m, enum rt_model_buf which, size_t offset, const float *src, size_t count);

enum rt_mode { RT_EVAL = 0, RT_TRAIN = 1 };

struct rt_step_opts {
    enum rt_mode mode;
    float label_smoothing;
    float grad_scale;      /* 1 / (samples in the optimizer step), times the loss scale
                            * when one is used; 0 = skip backward */
    /* Dropout: the micro-batch's stream number, micro-batch * world + rank. Each stream and each dropout
     * layer draws its own masks (compute/dropout_index.h), and streams below 2^24 draw exactly those they
     * drew when callers passed stream << 32 in dropout_offset. dropout_offset is that older form, still
     * honoured: its high 32 bits add to dropout_stream, its low 32 bits are the stream element each
     * layer's masks start at (tests). Both 0: stream 0. */
    uint64_t dropout_stream;
    uint64_t dropout_offset;
    int no_dropout;        /* RT_TRAIN without dropout (parity tests against PyTorch) */
    const float *mean, *std; /* host, C values each (0..1 units) */
    /* Backward's progress report, or NULL: called on the calling thread with
     * `ready` = the floats at the start of the gradient buffer whose values
     * are final for this step (buffer order is the order backward finishes
     * them, so `ready` only grows). The ops writing them have been issued on
     * the model's stream; on the CPU backend they are also done. */
    void (*grads_ready)(void *arg, size_t ready);
    void *grads_ready_arg;
    /* `images` is rt_backend_input_upload()'s device buffer for this ticket (0: images are host memory) */
    uint64_t input_ticket;
    /* With input_ticket: the labels are already in that upload's buffer, here (device int32, n entries,
     * padding -1), copied with the images; `labels` is then not read, and the buffer counts as consumed after
     * the loss rather than after the input's normalisation. NULL: labels is host memory, uploaded by the step. */
    const int32_t *labels_dev;
    /* Marks on the model's stream, or NULL: RT_MARK_FORWARD after the loss, RT_MARK_BACKWARD after
     * backward; with per_layer, also one after each layer's forward (RT_MARK_LAYER_FWD) and backward
     * (RT_MARK_LAYER_BWD), labelled with the layer's name, and RT_MARK_INPUT after the input's
     * normalisation. The caller started the timeline before the step. */
    struct rt_timeline *timeline;
    int per_layer;
    /* With a timeline, the per-op profile: a mark before and after every op the step issues on the model's
     * stream (RT_MARK_OP_BEGIN, then RT_MARK_OP_END labelled with the op's name as in struct rt_ops,
     * "conv2d_bwd_filter"), so that an op's time is its own pair's difference and the time between one op's
     * end and the next one's begin is the stream waiting for the host. Per_layer's marks come as well. */
    int per_op;
    /* Where the loss sums go. NULL: added into rt_model_step's `stats` on the host, which waits for the
     * stream (one host wait per micro-batch). Set: device memory for one struct rt_loss_stats that the step
     * overwrites, in stream order, with this micro-batch's sums (`stats` is then not touched and may be
     * NULL): no host wait; the caller copies them out later (download_async, then an event). */
    struct rt_loss_stats *stats_dev;
    /* Loss scaling with the scale on the device: the loss gradient is multiplied by *loss_scale as well
     * (xent_fwd_bwd's loss_scale); NULL: by grad_scale alone, which then holds any host-side scale. */
    const float *loss_scale;
    /* 1: run the step's forward, loss and backward as a graph (compute.h's graphs): captured the first time
     * its settings are seen -- the input buffer, labels_dev, batch, mode, the scales, mean and std,
     * label_smoothing, no_dropout and dropout_offset's low half, which a replay bakes in -- and replayed after, for one launch instead of one per op. grads_ready is then called
     * once, after the step, with every gradient final; dropout draws each replay's masks from its own
     * dropout_stream, written to the device before it. Steps that cannot be one (images or labels not an
     * input upload, no stats_dev, a timeline, a backend without graphs) run as they are, and so do all
     * later ones after a capture fails: rt_model_graph_status says why. */
    int graph;
};
enum rt_mark_kind {
    RT_MARK_INPUT = 1,
    RT_MARK_LAYER_FWD,
    RT_MARK_FORWARD,
    RT_MARK_LAYER_BWD,
    RT_MARK_BACKWARD,
    RT_MARK_OP_BEGIN,
    RT_MARK_OP_END
};

/*
 * Runs one micro-batch: normalise the host uint8 images (n, c, h, w), forward,
 * loss against host labels (n; label < 0 = padding) and, in RT_TRAIN with
 * grad_scale > 0, backward, adding into the gradient buffer. Adds the loss
 * sums into *stats (host), or writes them to o->stats_dev (device, no host
 * wait). n <= the batch the model was built for. In
 * RT_TRAIN batchnorm uses batch statistics and updates running statistics
 * (and num_batches_tracked), but for a frozen layer's (rt_model_opts.freeze),
 * which stays in inference mode; RT_EVAL uses the running statistics and no
 * dropout.
 * Returns 0 or -EINVAL (shape mismatch).
 */
int rt_model_step(struct rt_model *m, const struct rt_step_opts *o, int n, const uint8_t *images,
                  const int32_t *labels, struct rt_loss_stats *stats);

/*
 * The graphs rt_step_opts.graph made: how many were captured and how many
 * steps replayed one. Returns NULL while none was refused, else why the
 * steps run op by op (the first reason; it lasts).
 */
const char *rt_model_graph_status(const struct rt_model *m, int *graphs, uint64_t *replays);

/* Logits of the last rt_model_step, (n, classes) copied to host. */
void rt_model_logits(struct rt_model *m, float *host, int n);

/*
 * After a non-finite loss: names the first tensor of the last step, in
 * forward order then backward order, holding a NaN or Inf ("layer3.0.bn1
 * output", "fc.weight grad"). Writes "" if none is found.
 */
void rt_model_find_nonfinite(struct rt_model *m, char *buf, size_t len);

/* ==== optimizers and schedules ============================================ */

enum rt_optim_kind { RT_OPT_SGD = 0, RT_OPT_ADAM = 1, RT_OPT_ADAMW = 2 };

struct rt_optim_opts {
    enum rt_optim_kind kind;
    float momentum, dampening; /* SGD */
    int nesterov;              /* SGD */
    float weight_decay;
    float beta1, beta2, eps;   /* Adam/AdamW: 0.9, 0.999, 1e-8 */
};

/*
 * An optimizer is bound to one model when it is created: it updates the
 * model's trainable parameters, floats [0, rt_model_trainable_count()) of
 * the parameter buffer, from the same floats of the gradient buffer, and no
 * call passes buffers. Every call below issues its work on the model's
 * backend's default stream, in order behind the step that filled the
 * gradients (rt_model_step); a call that returns a host value waits for that
 * stream, the others return at once. One thread uses an optimizer: the one
 * that runs its model's steps.
 */
struct rt_optim;

/*
 * Creates an optimizer of kind o->kind (o is copied) for model `m` (borrowed:
 * it must outlive the optimizer), with its state on the model's backend:
 * SGD's momentum buffer (none with momentum 0), Adam's and AdamW's exp_avg and
 * exp_avg_sq, rt_model_trainable_count(m) floats each and zeroed, and the
 * device scalars its checks land in (so that a step allocates nothing). The
 * step count starts at 0. Returns 0 with *out set; -EINVAL (an unknown kind;
 * Nesterov without momentum or with dampening; a negative momentum or weight
 * decay: rt_errmsg() says which) or -ENOMEM, with *out NULL.
 */
int rt_optim_create(struct rt_model *m, const struct rt_optim_opts *o, struct rt_optim **out);
/* Frees the state and the scalars (the model's buffers are the model's). NULL is fine. */
void rt_optim_destroy(struct rt_optim *opt);

/*
 * One update of every trainable parameter at learning rate `lr`, PyTorch's
 * torch.optim.SGD / Adam / AdamW step with the options given at creation:
 * reads the gradients, writes the parameters and the state. Counts one step
 * first (Adam's bias correction and SGD's first-step momentum use the new
 * count). Queued; no host wait. Skipped on the device, parameters and state
 * untouched, while the flag of rt_optim_skip_if is set when it runs.
 */
void rt_optim_step(struct rt_optim *opt, float lr);
/*
 * rt_optim_step with two parameter groups: the classifier, floats
 * [0, rt_model_head_count()) (laid out first), at `head_lr` (train's
 * --lr-head), the rest at `lr`; one step of the count. head_lr == lr issues
 * exactly rt_optim_step's ops, so the bits are the same.
 */
void rt_optim_step_groups(struct rt_optim *opt, float lr, float head_lr);
/* Updates issued so far (skipped ones too, until rt_optim_set_steps takes them back). */
int64_t rt_optim_steps(const struct rt_optim *opt);
/* Sets the step count: a resumed checkpoint's, or one less after an update the device skipped. */
void rt_optim_set_steps(struct rt_optim *opt, int64_t steps);
/*
 * State buffer `which` (0 .. rt_optim_state_count() - 1) for checkpoints:
 * SGD momentum_buffer; Adam exp_avg, exp_avg_sq. Device memory owned by the
 * optimizer, rt_model_trainable_count() floats laid out as the parameters.
 * *name (when name is not NULL) gets PyTorch's name of it. NULL for any
 * other `which`.
 */
float *rt_optim_state(struct rt_optim *opt, int which, const char **name);
/* How many state buffers: 0 (SGD without momentum), 1 (SGD) or 2 (Adam, AdamW). */
int rt_optim_state_count(const struct rt_optim *opt);
/* The model the optimizer was created for (rt_optim_create's, borrowed). */
const struct rt_model *rt_optim_model(const struct rt_optim *opt);
/* "sgd", "adam", "adamw" ("?" for another value); and back: 0, or -EINVAL naming the choices. */
const char *rt_optim_kind_name(enum rt_optim_kind k);
int rt_optim_kind_parse(const char *s, enum rt_optim_kind *k);

/*
 * Clips the model's gradients to a global L2 norm of at most max_norm
 * (PyTorch's clip_grad_norm_: every gradient times max_norm / (norm + 1e-6)
 * when norm > max_norm; max_norm <= 0 only measures). Returns the norm
 * before clipping (NaN or Inf when a gradient was non-finite), read back
 * from the device: waits for the stream.
 */
float rt_clip_grad_norm(struct rt_optim *opt, float max_norm);
/*
 * The same clipping without a host wait: the squared norm stays on the
 * device and clip_scale decides there. Returns the device float holding the
 * squared norm before clipping (the optimizer's own scalar, overwritten by
 * the next call): copy it out with download_async to learn whether it was
 * finite. rt_clip_grad_norm is this plus a download, so both give the same
 * bits.
 */
const float *rt_clip_grad_norm_async(struct rt_optim *opt, float max_norm);

/*
 * Loss scaling: the model's gradients *= 1.0f / scale (the op table's
 * unscale_check). Returns 1 if any of them was NaN or Inf before scaling,
 * else 0: the flag lands in a device scalar the optimizer keeps and is read
 * back, the one host wait of the unscale.
 */
int rt_optim_unscale(struct rt_optim *opt, float scale);
/*
 * The same with the scale a device float (read when the op runs) and no host
 * wait: returns the device flag (the optimizer's scalar, overwritten by the
 * next call), for rt_optim_skip_if and to be copied out with download_async.
 */
const float *rt_optim_unscale_async(struct rt_optim *opt, const float *scale);
/*
 * From now on every update (rt_optim_step, rt_optim_step_groups) is skipped
 * on the device when *flag (a device float, borrowed) is not 0 when it runs:
 * loss scaling's overflow, decided without the host. NULL: never skipped.
 * The step count still advances on the host; the caller takes a skipped
 * update back with rt_optim_set_steps once it has read the flag (before the
 * next update is issued, so that its step count and learning rate are
 * exact). Issues nothing.
 */
void rt_optim_skip_if(struct rt_optim *opt, const float *flag);

enum rt_sched_kind { RT_SCHED_CONSTANT = 0, RT_SCHED_STEP, RT_SCHED_COSINE, RT_SCHED_ONECYCLE };

struct rt_sched {
    enum rt_sched_kind kind;
    float base_lr;
    uint64_t total_steps;     /* optimizer steps in the whole run */
    uint64_t warmup_steps;    /* linear warm-up from 0 (all kinds) */
    uint64_t step_size;       /* STEP: decay every step_size steps */
    float gamma;              /* STEP: factor (0.1) */
};

/* Learning rate for optimizer step `step` (0-based). Pure function. */
float rt_sched_lr(const struct rt_sched *s, uint64_t step);
const char *rt_sched_kind_name(enum rt_sched_kind k);
int rt_sched_kind_parse(const char *s, enum rt_sched_kind *k);

/* ==== dynamic loss scaling ================================================ */

/*
 * PyTorch's GradScaler as a pure state machine (the trainer multiplies the
 * loss gradient by `scale`, unscales the gradients with rt_optim_unscale,
 * and reports whether they held a NaN/Inf; the training loop keeps the
 * scale on the device, where the scaler_update op applies these rules, and
 * replays them here a step later for its messages and stop rules):
 *  - overflow: the step is skipped (no optimizer update, the LR schedule
 *    does not advance), scale *= backoff, the good-step count restarts;
 *  - growth_interval good steps in a row: scale *= growth.
 * Two ways out, so a diverged run does not skip forever: max_skips skipped
 * steps in a row, or the scale falling below min_scale.
 */
struct rt_scaler {
    float scale;           /* 65536 to start (2^16, PyTorch's init_scale) */
    float growth, backoff; /* 2, 0.5 */
    uint32_t growth_interval; /* 2000 */
    uint32_t max_skips;    /* 0: never stop on skips */
    float min_scale;       /* below this the scale has collapsed (2^-14, fp16's smallest normal) */
    uint32_t good;         /* good steps since the last change */
    uint32_t skips_in_row;
    uint64_t skipped;      /* all skipped steps */
};

enum rt_scaler_verdict {
    RT_SCALER_APPLY = 0,   /* finite: apply the update */
    RT_SCALER_SKIP,        /* overflow: skip the update, the scale was backed off */
    RT_SCALER_STOP_SKIPS,  /* overflow, and max_skips in a row: stop */
    RT_SCALER_STOP_COLLAPSED, /* overflow, and the scale fell below min_scale: stop */
};

/* The defaults above. */
void rt_scaler_init(struct rt_scaler *s);
/* One optimizer step's outcome; updates the state and says what to do. */
enum rt_scaler_verdict rt_scaler_update(struct rt_scaler *s, int found_nonfinite);

/* ==== safetensors ========================================================= */

enum rt_st_dtype { RT_ST_F32 = 0, RT_ST_F16, RT_ST_BF16, RT_ST_I64, RT_ST_I32, RT_ST_U8, RT_ST_F64 };

struct rt_st_tensor {
    char name[128];
    enum rt_st_dtype dtype;
    int ndim;
    int64_t shape[8];
    const void *data;      /* host; in a read file it points into the file's memory */
    size_t bytes;
};

struct rt_st_file;         /* a file read into memory */

/*
 * Writes a safetensors file atomically (temp file, fsync, rename, fsync of
 * the directory): the 8-byte little-endian header length, the JSON header
 * ({name: {dtype, shape, data_offsets}} plus "__metadata__" with the
 * string pairs meta_kv[0..2*n_meta)), then the tensors' bytes in the given
 * order, 8-byte aligned as the format recommends. Returns 0 or -errno; on
 * failure the old file, if any, is untouched.
 */
int rt_st_write(const char *path, const struct rt_st_tensor *t, int n, const char *const *meta_kv, int n_meta);

/*
 * Reads and validates a safetensors file: header length, JSON, dtypes,
 * shapes against byte counts, offsets inside the file and not overlapping.
 * Returns 0 or -errno (-EINVAL/-EBADMSG with the file and what is wrong).
 */
int rt_st_read(const char *path, struct rt_st_file **out);
void rt_st_close(struct rt_st_file *f); /* NULL is fine */
int rt_st_count(const struct rt_st_file *f);
const struct rt_st_tensor *rt_st_get(const struct rt_st_file *f, int i);
const struct rt_st_tensor *rt_st_find(const struct rt_st_file *f, const char *name); /* NULL if absent */
const char *rt_st_meta(const struct rt_st_file *f, const char *key);                 /* NULL if absent */
size_t rt_st_dtype_size(enum rt_st_dtype d);
const char *rt_st_dtype_name(enum rt_st_dtype d); /* "F32", "I64", ... as the format spells them */

/* ==== checkpoints ========================================================== */

/*
 * Writes the model's state_dict (parameters, batchnorm running statistics,
 * num_batches_tracked as I64 scalars) to `path` as safetensors, atomically,
 * with the string pairs meta_kv[0..2*n_meta) as "__metadata__". Returns 0
 * or -errno.
 */
int rt_model_save(struct rt_model *m, const char *path, const char *const *meta_kv, int n_meta);

/*
 * Loads the model's state_dict from an open safetensors file (`path` names
 * it in messages): every tensor of the table must be there with its shape
 * (F32; num_batches_tracked I64), and nothing else. On error (-EINVAL naming
 * the tensor) the model may be partly overwritten.
 */
int rt_model_load(struct rt_model *m, const struct rt_st_file *f, const char *path);

/*
 * Starting weights from another run or from PyTorch (train --init, eval of a file without ringtrain's
 * metadata): a safetensors state_dict with PyTorch's names, strictly. Every difference between the file and the
 * model is collected, as load_state_dict(strict=True) reports them: a tensor the model has and the file lacks
 * (missing), one the file has and the model lacks (unexpected), one of another shape, one of a type that is not
 * a number of its kind (floating tensors may be F32, F16, BF16 or F64, converted to fp32; num_batches_tracked an
 * integer). With reset_head the classifier's tensors are left out of the comparison (the file may lack them or
 * hold another number of classes) and keep the model's own initialisation, PyTorch's for that layer drawn from
 * the seed. Returns 0 with every other tensor loaded, or -EINVAL with r->diff listing the differences and the
 * model untouched (rt_errmsg() says how many; rt_init_print() lists them). r is filled either way; free it
 * with rt_init_result_free().
 */
enum rt_init_diff_kind { RT_INIT_MISSING = 0, RT_INIT_UNEXPECTED, RT_INIT_SHAPE, RT_INIT_DTYPE };
struct rt_init_diff {
    enum rt_init_diff_kind kind;
    char name[128];
    char file[48];         /* the file's dtype and shape, "F32 [1000, 512]" ("" when missing) */
    char model[48];        /* the model's, "F32 [10, 512]" ("" when unexpected) */
    int head;              /* the tensor is the classifier's (a --reset-head would settle it) */
};
struct rt_init_result {
    int loaded;            /* tensors loaded */
    int head_reset;        /* tensors of the classifier left at their initialisation */
    int ndiff;
    struct rt_init_diff *diff;
};
int rt_model_load_init(struct rt_model *m, const struct rt_st_file *f, int reset_head, struct rt_init_result *r);
/* The differences, one per line, to f: "  missing     layer1.0.bn1.running_var  model F32 [64]". */
void rt_init_print(const struct rt_init_result *r, FILE *f);
void rt_init_result_free(struct rt_init_result *r);

/* The optimizer's state as "<parameter>.<state>" tensors of the model it was created for (PyTorch's names:
 * momentum_buffer, exp_avg, exp_avg_sq) plus metadata "step"; and back. 0 or -errno. */
int rt_optim_save(struct rt_optim *opt, const char *path, const char *const *meta_kv, int n_meta);
int rt_optim_load(struct rt_optim *opt, const struct rt_st_file *f, const char *path);

#ifdef __cplusplus
}
#endif

#endif
