/*
 * cpu.h - the CPU backend's kernels, private to compute/. Each rt_cpu_<op>
 * is one slot of struct rt_ops (compute.h says what it computes);
 * cpu/backend.c puts them in the table. Spatial tensors are (C, N, H, W);
 * kernels thread with OpenMP over the backend's thread count, GEMMs go to
 * OpenBLAS.
 *
 * Kernels never fail: shapes were checked when the model was built. Scratch
 * memory (im2col columns) comes from rt_cpu_scratch(), one growing buffer
 * per backend, so a kernel must not hold it across calls.
 */
#ifndef RT_COMPUTE_CPU_H
#define RT_COMPUTE_CPU_H

#include "compute/backend.h"
#include "compute/compute.h"

/*
 * Returns at least `bytes` of 64-byte aligned scratch owned by the stream's
 * backend, growing it when needed (contents are not kept). Never returns
 * NULL: when memory is exhausted it prints the size and aborts, since an op
 * cannot report an error and a half-done op is worse.
 */
float *rt_cpu_scratch(struct rt_stream *s, size_t bytes);

/*
 * Loads OpenBLAS once per process (blas.c says why at run time), sets its
 * thread count and describes it ("OpenBLAS SkylakeX"). 0 or -ENOENT.
 */
int rt_cpu_blas_init(int threads, char *describe, size_t len);

/*
 * What every thread that runs kernels needs once: the OpenMP thread count
 * (`threads`) and denormals flushed to zero in it and its OpenMP team.
 */
void rt_cpu_thread_setup(int threads);

/*
 * Asynchronous streams (async.c, compute.h's rt_backend_async): start turns
 * the backend `be` (fully set up otherwise) into one whose default stream is
 * a worker thread, with the queued op table, events and the input copy
 * stream; 0 or -errno. stop drains and joins every stream; fine when start
 * was never called.
 */
int rt_cpu_async_start(struct rt_backend *be);
void rt_cpu_async_stop(struct rt_backend *be);

/*
 * The ops: rt_cpu_<op> for every op of compute.h's RT_OPS_LIST, with the
 * signature given there. backend.c holds memory; conv.c the convolutions
 * (im2col + sgemm over the whole batch); pool.c layout conversion, pooling,
 * gap, flatten and linear; elem.c input, batchnorm, activations, dropout,
 * loss, reductions, casts and the optimizer updates.
 */
#define RT_CPU_OP_DECLARE(ret, name, params, args) ret rt_cpu_##name params;
RT_OPS_LIST(RT_CPU_OP_DECLARE)
#undef RT_CPU_OP_DECLARE

#endif
