/*
 * backend.h - what every backend's struct rt_backend and struct rt_stream
 * hold, private to compute/. The CPU backend (cpu/) and the CUDA backend
 * (cuda/) fill the same structs; rt_backend_create() picks one.
 */
#ifndef RT_COMPUTE_BACKEND_H
#define RT_COMPUTE_BACKEND_H

#include "compute/compute.h"

#ifdef __cplusplus
extern "C" {
#endif

struct rt_cuda; /* cuda/cuda_be.h */

/* A backend's side of compute.h's input-upload and host-memory functions
 * (the CUDA backend's copy stream and cudaHostAlloc). NULL on the CPU, whose
 * "device" memory is host memory: the upload is the host pointer itself and
 * the rest has nothing to do. */
struct rt_backend_io {
    const uint8_t *(*upload)(struct rt_backend *be, const uint8_t *host, size_t bytes, uint64_t ticket);
    void (*wait)(struct rt_backend *be, uint64_t ticket);
    void (*acquire)(struct rt_backend *be, uint64_t ticket);
    void (*release)(struct rt_backend *be, uint64_t ticket);
    void *(*host_alloc)(struct rt_backend *be, size_t bytes);
    void (*host_free)(struct rt_backend *be, void *p);
};

struct rt_stream {
    struct rt_backend *be;
    void *handle;           /* CUDA: the cudaStream_t ops are issued on; CPU: NULL */
};

struct rt_backend {
    enum rt_backend_kind kind;
    int threads;            /* CPU worker threads */
    struct rt_stream stream;
    const struct rt_ops *ops;
    /* The 16-bit tables (rt_backend_ops_for), NULL where the device has none;
     * why_not says why, for the message. */
    const struct rt_ops *ops_bf16, *ops_f16;
    char why_not_bf16[160], why_not_f16[160];
    void *scratch;          /* CPU: see rt_cpu_scratch() */
    size_t scratch_bytes;
    char describe[160];
    struct rt_cuda *cuda;   /* CUDA: the device, handles and caches; NULL on the CPU */
    const struct rt_backend_io *io; /* NULL on the CPU */
    uint64_t input_tickets; /* rt_backend_input_upload calls so far */
    int device;             /* CUDA device ordinal; -1 on the CPU */
};

/* The compute stream waits for upload `ticket`'s copy; then marks its buffer consumed (after the ops issued
 * in between). No-ops on the CPU. */
void rt_backend_input_acquire(struct rt_backend *be, uint64_t ticket);
void rt_backend_input_release(struct rt_backend *be, uint64_t ticket);

/* The CUDA backend's constructor (cuda/backend_cuda.c), built with the toolkit;
 * -ENOTSUP / -ENODEV with the reason in rt_errmsg() otherwise. */
int rt_cuda_create(const struct rt_backend_opts *o, struct rt_backend **out);
void rt_cuda_destroy(struct rt_backend *be);


#ifdef __cplusplus
}
#endif

#endif
