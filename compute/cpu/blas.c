/*
 * blas.c - OpenBLAS, loaded at run time so that ringtrain chooses its kernels.
 *
 * OpenBLAS picks its kernels for the CPU in a constructor that runs when the
 * library is loaded. The Debian 12 build (0.3.21) does not know CPUs newer
 * than it (Sapphire/Emerald Rapids report themselves as family 6 models it
 * has no entry for) and falls back to "Prescott" SSE3 kernels: 10x slower
 * sgemm on an AVX-512 machine. Linked normally, nothing can be done about
 * that after main() starts. So rt_compute does not link libopenblas: the
 * first CPU backend sets OPENBLAS_CORETYPE from what the CPU supports (unless
 * the user set it), then dlopen()s the library and forwards the few BLAS
 * entry points the kernels call (cblas_sgemm, cblas.h's declaration).
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "common/common.h"
#include "compute/cpu/cpu.h"

typedef void (*sgemm_fn)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE, const enum CBLAS_TRANSPOSE,
                         const blasint, const blasint, const blasint, const float, const float *, const blasint,
                         const float *, const blasint, const float, float *, const blasint);

static struct {
    pthread_once_t once;
    int err;
    char msg[512];
    char core[64];
    const char *forced;   /* the OPENBLAS_CORETYPE we set, or NULL */
    sgemm_fn sgemm;
    void (*set_threads)(int);
    char *(*corename)(void);
} blas = {.once = PTHREAD_ONCE_INIT};

/* The newest kernel family OpenBLAS 0.3.21 has that this CPU can run. */
static const char *core_for_cpu(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
    return NULL; /* OpenBLAS's own detection is as good as anything here */
}

static void blas_load(void)
{
    if (!getenv("OPENBLAS_CORETYPE") && (blas.forced = core_for_cpu()))
        setenv("OPENBLAS_CORETYPE", blas.forced, 0);
    static const char *const names[] = {RT_OPENBLAS_LIB, "libopenblas.so.0"};
    void *h = NULL;
    for (size_t i = 0; i < RT_ARRAY_LEN(names) && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        blas.err = -ENOENT;
        snprintf(blas.msg, sizeof(blas.msg), "cannot load OpenBLAS (%s): apt-get install libopenblas0-openmp",
                 dlerror());
        return;
    }
    blas.sgemm = (sgemm_fn)dlsym(h, "cblas_sgemm");
    blas.set_threads = (void (*)(int))dlsym(h, "openblas_set_num_threads");
    blas.corename = (char *(*)(void))dlsym(h, "openblas_get_corename");
    if (!blas.sgemm || !blas.set_threads) {
        blas.err = -ENOENT;
        snprintf(blas.msg, sizeof(blas.msg), "%s lacks cblas_sgemm/openblas_set_num_threads", RT_OPENBLAS_LIB);
        return;
    }
    snprintf(blas.core, sizeof(blas.core), "%s", blas.corename ? blas.corename() : "?");
}

int rt_cpu_blas_init(int threads, char *describe, size_t len)
{
    pthread_once(&blas.once, blas_load);
    if (blas.err)
        return rt_errf(blas.err, "%s", blas.msg);
    blas.set_threads(threads);
    snprintf(describe, len, "OpenBLAS %s%s", blas.core, blas.forced ? " (chosen for this CPU)" : "");
    return 0;
}

void cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb,
                 const blasint m, const blasint n, const blasint k, const float alpha, const float *a,
                 const blasint lda, const float *b, const blasint ldb, const float beta, float *c, const blasint ldc)
{
    blas.sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
