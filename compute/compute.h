/*
 * compute.h - ringtrain's compute stage. So far: which backends this build
 * has and what hardware they see. The op table, layers and models build on
 * this (docs/ARCHITECTURE.md).
 */
#ifndef RT_COMPUTE_H
#define RT_COMPUTE_H

#include <stddef.h>

enum rt_backend { RT_BACKEND_CPU = 0, RT_BACKEND_CUDA = 1 };

struct rt_backend_probe {
    int compiled;          /* 1 if this build has the backend */
    int devices;           /* usable devices: CPUs for cpu, GPUs for cuda (0 = none) */
    int runtime_version;   /* CUDA runtime as 1000*major + 10*minor; 0 for cpu */
    int driver_version;    /* CUDA driver, 0 when no driver is installed */
    char detail[256];      /* one human line: why no device, library versions */
};

/*
 * Probes backend `b` without initialising anything lasting (no CUDA context is
 * kept). Safe on machines with no GPU or no driver. Returns 0, or -ENOTSUP
 * when the backend is not compiled in (`p->compiled` = 0 then).
 */
int rt_backend_probe(enum rt_backend b, struct rt_backend_probe *p);

#endif
