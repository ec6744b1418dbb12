/*
 * cudalibs.h - cuDNN, cuBLAS and NCCL, loaded at run time.
 *
 * A CUDA build of ringtrain does not link these libraries: it starts, and
 * trains on the CPU, on a machine that has none of them (a login node, a CPU
 * partition). Every function of theirs that ringtrain calls is listed once in
 * cudalibs.c; for each, cudalibs.c defines a function of the same name and
 * signature (checked by the compiler against the libraries' own headers) that
 * forwards to the library's, so the call sites are ordinary calls.
 *
 * Loading. rt_cudalibs_load() opens each library by its soname (the major
 * version of the headers the build used: libcudnn.so.9, libcublas.so.13,
 * libnccl.so.2) through the dynamic loader's usual search (LD_LIBRARY_PATH,
 * then the ldconfig cache), then, failing that, from the folder where CMake
 * found it at build time; then it looks up every listed symbol. A library is
 * loaded once per process; a failure is remembered, and later calls return
 * it again. Code that is about to use a library calls rt_cudalibs_load() first,
 * for a clean error. A forwarding function called before its library was
 * loaded loads it there and then; if that fails, it prints the error naming
 * the library and the function, and aborts the process.
 *
 * The libraries are opened RTLD_GLOBAL, as linking them did: symbols looked up
 * with dlsym(RTLD_DEFAULT, ...) (NCCL's ncclResetDebugInit) are found.
 *
 * Built only when the build has CUDA (RT_HAVE_CUDA in rt_buildinfo.h); the
 * NCCL entries only when it has NCCL. This header needs no CUDA header.
 * Every function here is thread-safe.
 */
#ifndef RT_COMMON_CUDALIBS_H
#define RT_COMMON_CUDALIBS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The libraries, as indices (rt_cudalibs_info, rt_cudalibs_symbol) ... */
enum rt_cudalib { RT_CUDALIB_CUDNN, RT_CUDALIB_CUBLAS, RT_CUDALIB_NCCL, RT_CUDALIB_COUNT };

/* ... and as bits of the `which` argument of rt_cudalibs_load. */
#define RT_CUDALIBS_CUDNN (1u << RT_CUDALIB_CUDNN)
#define RT_CUDALIBS_CUBLAS (1u << RT_CUDALIB_CUBLAS)
#define RT_CUDALIBS_NCCL (1u << RT_CUDALIB_NCCL)
#define RT_CUDALIBS_ALL (RT_CUDALIBS_CUDNN | RT_CUDALIBS_CUBLAS | RT_CUDALIBS_NCCL)

/*
 * Loads the libraries named by `which` (RT_CUDALIBS_* bits) and resolves every
 * symbol the table lists for them. Returns 0 when all are loaded (at once when
 * they already were), or a negative errno with rt_errmsg() naming the first
 * library that failed, its soname, the loader's reason, the fallback folder
 * tried (or the symbols missing) and what to do about it:
 *   -ENOENT   the library could not be opened
 *   -ENOSYS   it was opened but lacks symbols (an older release)
 *   -ENOTSUP  NCCL asked for in a build without NCCL
 */
int rt_cudalibs_load(unsigned which);

/* What rt_cudalibs_info reports of one library. */
struct rt_cudalib_info {
    const char *name;        /* "cuDNN", "cuBLAS", "NCCL" */
    const char *soname;      /* "libcudnn.so.9" (NULL when not compiled in) */
    const char *dir;         /* the build-time folder tried after the search */
    const char *built;       /* version of the headers the build used, "9.19.0" */
    int compiled;            /* 0: this build has no NCCL (nothing else below is set) */
    int loaded;              /* 1: loaded; version and path are set */
    int version[3];          /* major, minor, patch as the loaded library reports them */
    char path[512];          /* the file the loader opened */
    int err;                 /* when not loaded: rt_cudalibs_load's error code */
    char why[400];           /* when not loaded: the loader's reason in short ("libcudnn.so.9: cannot open
                                shared object file: ...; nor in /usr/local/cuda/lib") */
};

/*
 * Loads library `lib` if it was not tried yet and describes it in *out, loaded
 * or not. Never aborts: for `ringtrain --version` on machines without the
 * libraries. Returns 0, or -EINVAL for a `lib` out of range.
 */
int rt_cudalibs_info(enum rt_cudalib lib, struct rt_cudalib_info *out);

/* The number of functions in the table (all libraries). */
size_t rt_cudalibs_symbol_count(void);

/*
 * The table's entry `i` (0 <= i < rt_cudalibs_symbol_count()): returns its
 * symbol name and stores its library in *lib and the address it resolved to in
 * *addr (NULL while its library is not loaded); either pointer may be NULL.
 * Returns NULL past the end. The name is static.
 */
const char *rt_cudalibs_symbol(size_t i, enum rt_cudalib *lib, void **addr);

/*
 * Test hook: before `lib` is first loaded, makes its loader open `soname`
 * (NULL: the real one) with `dir` as the fallback folder (NULL: the real one),
 * and also require the symbol `extra` (NULL: none; looked up, never stored).
 * The strings are borrowed and must outlive the process's use of the library.
 * The table itself is not changed. Returns 0, or -EBUSY when `lib` was already
 * loaded or tried, -ENOTSUP when it is not in this build, -EINVAL for a `lib`
 * out of range.
 */
int rt_cudalibs_test_override(enum rt_cudalib lib, const char *soname, const char *dir, const char *extra);

#ifdef __cplusplus
}
#endif

#endif /* RT_COMMON_CUDALIBS_H */
