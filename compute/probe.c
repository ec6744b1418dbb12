/*
 * probe.c - what the compute backends compiled into this binary can see: CPUs
 * for the CPU backend; for CUDA (when built with it) the runtime and driver
 * versions and the device count, read through the statically linked CUDA
 * runtime so the binary still starts where no driver is installed.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "compute/compute.h"
#include "rt_buildinfo.h"

int rt_cuda_probe(struct rt_backend_probe *p);

int rt_backend_probe(enum rt_backend_kind b, struct rt_backend_probe *p)
{
    memset(p, 0, sizeof(*p));
    switch (b) {
    case RT_BACKEND_CPU:
        p->compiled = 1;
        p->devices = rt_cpus_available();
        snprintf(p->detail, sizeof(p->detail), "%d CPUs available to this process", p->devices);
        return 0;
    case RT_BACKEND_CUDA:
#if RT_HAVE_CUDA
        p->compiled = 1;
        return rt_cuda_probe(p);
#else
        snprintf(p->detail, sizeof(p->detail), "not compiled in (no CUDA toolkit at build time)");
        return -ENOTSUP;
#endif
    }
    return -EINVAL;
}
