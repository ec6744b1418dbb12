/*
 * probe_cuda.c - CUDA runtime/driver versions and device count for
 * rt_backend_probe(). Built only when CMake found the CUDA toolkit.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>

#include "compute/compute.h"
#include "rt_buildinfo.h"

int rt_cuda_probe(struct rt_backend_probe *p);

int rt_cuda_probe(struct rt_backend_probe *p)
{
    int n = 0;
    cudaError_t err;

    cudaRuntimeGetVersion(&p->runtime_version);
    if (cudaDriverGetVersion(&p->driver_version) != cudaSuccess)
        p->driver_version = 0;
    err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        p->devices = 0;
        if (p->driver_version == 0)
            snprintf(p->detail, sizeof(p->detail), "no NVIDIA driver on this machine: the CPU backend is used");
        else
            snprintf(p->detail, sizeof(p->detail), "no usable GPU: %s", cudaGetErrorString(err));
        /* Clear the sticky error so later CUDA use starts clean. */
        cudaGetLastError();
        return 0;
    }
    p->devices = n;
    if (n > 0) {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
            snprintf(p->detail, sizeof(p->detail), "%d x %.200s (sm_%d%d)", n, prop.name, prop.major, prop.minor);
    } else {
        snprintf(p->detail, sizeof(p->detail), "no GPU visible");
    }
    return 0;
}
