/*
 * probe_cuda.c - CUDA runtime/driver versions and device count for
 * rt_backend_probe(), and the verdict on the driver that the probe and the
 * backend's creation share (rt_cuda_driver_verdict). Built only when CMake
 * found the CUDA toolkit.
 */
#include <errno.h>
#include <stdio.h>

#include "common/common.h"
#include "compute/cuda/cuda_be.h"
#include "rt_buildinfo.h"

int rt_cuda_probe(struct rt_backend_probe *p);

int rt_cuda_min_driver(int runtime)
{
    /* NVIDIA's table of minimum drivers for minor version compatibility (Linux): one branch per major version. */
    static const struct {
        int major, branch;
    } min[] = {{11, 450}, {12, 525}, {13, 580}};
    for (size_t i = 0; i < RT_ARRAY_LEN(min); i++)
        if (min[i].major == runtime / 1000)
            return min[i].branch;
    return 0;
}

/* "update the NVIDIA driver (CUDA 13.x needs 580 or later)", or without the parenthesis for an unknown major. */
static void update_hint(int runtime, char *buf, size_t len)
{
    const int need = rt_cuda_min_driver(runtime);
    if (need)
        snprintf(buf, len, "update the NVIDIA driver (CUDA %d.x needs %d or later)", runtime / 1000, need);
    else
        snprintf(buf, len, "update the NVIDIA driver");
}

int rt_cuda_driver_verdict(int driver, int runtime, int count_err, const char *count_text, char *msg, size_t len)
{
    const int dmaj = driver / 1000, dmin = driver % 1000 / 10, rmaj = runtime / 1000, rmin = runtime % 1000 / 10;
    char hint[96];
    update_hint(runtime, hint, sizeof(hint));
    if (driver <= 0) {
        snprintf(msg, len, "no NVIDIA driver on this machine");
        return -ENODEV;
    }
    /* Another major version is never compatible; an older minor one of the same major may be (CUDA's minor
     * version compatibility), and then only the count says whether this driver is too old after all. */
    if (dmaj < rmaj || (count_err == (int)cudaErrorInsufficientDriver && driver < runtime)) {
        snprintf(msg, len, "the NVIDIA driver supports CUDA %d.%d, older than the %d.%d this build needs: %s", dmaj,
                 dmin, rmaj, rmin, hint);
        return -ENODEV;
    }
    if (count_err < 0 || count_err == (int)cudaSuccess)
        return 0;
    if (count_err == (int)cudaErrorInsufficientDriver)
        snprintf(msg, len, "the NVIDIA driver (CUDA %d.%d) is too old for this build's CUDA %d.%d runtime (%s): %s",
                 dmaj, dmin, rmaj, rmin, count_text ? count_text : "cudaErrorInsufficientDriver", hint);
    else if (count_err == (int)cudaErrorSystemDriverMismatch)
        snprintf(msg, len, "the NVIDIA kernel module and the driver's libraries are different versions (%s): "
                           "reboot after a driver update, or reinstall the driver",
                 count_text ? count_text : "cudaErrorSystemDriverMismatch");
    else
        snprintf(msg, len, "no usable GPU: %s", count_text ? count_text : "cudaGetDeviceCount failed");
    return -ENODEV;
}

int rt_cuda_probe(struct rt_backend_probe *p)
{
    int n = 0;
    char why[sizeof(p->detail)];

    if (cudaRuntimeGetVersion(&p->runtime_version) != cudaSuccess)
        p->runtime_version = 0;
    if (cudaDriverGetVersion(&p->driver_version) != cudaSuccess)
        p->driver_version = 0;
    p->driver_needed = rt_cuda_min_driver(p->runtime_version);
    /* The versions before the count: a driver too old for the runtime makes the count fail with a message
     * that names neither version. */
    int rc = rt_cuda_driver_verdict(p->driver_version, p->runtime_version, -1, NULL, why, sizeof(why));
    if (rc == 0) {
        const cudaError_t err = cudaGetDeviceCount(&n);
        if (err != cudaSuccess)
            rc = rt_cuda_driver_verdict(p->driver_version, p->runtime_version, (int)err, cudaGetErrorString(err),
                                        why, sizeof(why));
    }
    if (rc < 0) {
        p->devices = 0;
        snprintf(p->detail, sizeof(p->detail), "%.200s%s", why,
                 p->driver_version == 0 ? ": the CPU backend is used" : "");
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
