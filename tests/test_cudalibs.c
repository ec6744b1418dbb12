/*
 * test_cudalibs.c - common/cudalibs: cuDNN, cuBLAS and NCCL loaded at run time.
 *   - every function of the table resolves, into the library (not into our own
 *     forwarding definition), and their count is the table's size;
 *   - the loaded libraries' major versions are the headers' the build used;
 *   - the forwarding functions pass arguments and results through;
 *   - a library that cannot be opened, or lacks a symbol, gives an error that
 *     names it (through the test hook, in a child process: the table itself is
 *     not touched), the other libraries still load, and a forwarding function
 *     called then ends the process with that error instead of crashing.
 * Needs the libraries installed, not a GPU. Exit 0 pass, 1 fail, 77 skip (a
 * build without CUDA).
 */
#include "rt_buildinfo.h"

#if RT_HAVE_CUDA

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cublas_v2.h>
#include <cudnn.h>
#ifdef RT_HAVE_NCCL
#include <nccl.h>
#endif

#include "check.h"
#include "common/common.h"
#include "common/cudalibs.h"

#ifdef RT_HAVE_NCCL
#define WANT_LIBS RT_CUDALIBS_ALL
#else
#define WANT_LIBS (RT_CUDALIBS_CUDNN | RT_CUDALIBS_CUBLAS)
#endif

#define ABSENT_SONAME "libcudnn_rt_test_absent.so.9"
#define ABSENT_DIR "/nonexistent/rt-test-libdir"
#define ABSENT_SYMBOL "cublasRtTestNoSuchFunction"

/* Runs `body` in a child process with stdout and stderr captured into out[len].
 * Returns the wait status, or -1. */
static int run_child(int (*body)(void), char *out, size_t len)
{
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        int rc = body();
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
    }
    close(fd[1]);
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd[0], out + n, len - 1 - n);
        if (r > 0 && n + (size_t)r < len - 1) {
            n += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r > 0)
            n += (size_t)r;
        break;
    }
    out[n] = '\0';
    close(fd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return status;
}

/* Child: cuDNN's soname points nowhere. Its checks, then a forwarding call
 * that must end the process with the loader's error. */
static int child_absent_library(void)
{
    CHECK_OK(rt_cudalibs_test_override(RT_CUDALIB_CUDNN, ABSENT_SONAME, ABSENT_DIR, NULL));
    int rc = rt_cudalibs_load(RT_CUDALIBS_CUDNN);
    CHECKF(rc == -ENOENT, "rc %d", rc);
    const char *m = rt_errmsg();
    CHECKF(strstr(m, "cuDNN") && strstr(m, ABSENT_SONAME) && strstr(m, ABSENT_DIR), "message: %s", m);
    CHECKF(strstr(m, "LD_LIBRARY_PATH") && strstr(m, "--device cpu") && strstr(m, "cannot open shared object file"),
           "message: %s", m);
    /* Remembered: the same answer again, without a second search. */
    CHECK_ERR(rt_cudalibs_load(RT_CUDALIBS_CUDNN | RT_CUDALIBS_CUBLAS), ABSENT_SONAME);
    struct rt_cudalib_info li;
    CHECK_OK(rt_cudalibs_info(RT_CUDALIB_CUDNN, &li));
    CHECKF(li.compiled && !li.loaded && strstr(li.why, ABSENT_SONAME) && strstr(li.why, ABSENT_DIR), "why: %s",
           li.why);
    /* The other libraries do not depend on it. */
    CHECK_OK(rt_cudalibs_load(RT_CUDALIBS_CUBLAS));
    fprintf(stderr, "child checks: %d failed\n", check_failures);
    fflush(stderr);
    size_t v = cudnnGetVersion(); /* must not return */
    fprintf(stderr, "cudnnGetVersion returned %zu\n", v);
    return 3;
}

/* Child: cuBLAS must also have a symbol it does not have. */
static int child_missing_symbol(void)
{
    CHECK_OK(rt_cudalibs_test_override(RT_CUDALIB_CUBLAS, NULL, NULL, ABSENT_SYMBOL));
    int rc = rt_cudalibs_load(RT_CUDALIBS_CUBLAS);
    CHECKF(rc == -ENOSYS, "rc %d", rc);
    const char *m = rt_errmsg();
    CHECKF(strstr(m, "cuBLAS") && strstr(m, "libcublas.so.") && strstr(m, ABSENT_SYMBOL), "message: %s", m);
    CHECKF(strstr(m, "lacks 1 of the functions") && !strstr(m, "cublasCreate_v2"), "only the missing one: %s", m);
    /* Nothing of a library that failed goes into the table. */
    void *addr = (void *)1;
    enum rt_cudalib lib;
    size_t nonnull = 0;
    for (size_t i = 0; rt_cudalibs_symbol(i, &lib, &addr); i++)
        nonnull += lib == RT_CUDALIB_CUBLAS && addr != NULL;
    CHECKF(nonnull == 0, "%zu cuBLAS entries filled", nonnull);
    CHECK_OK(rt_cudalibs_load(RT_CUDALIBS_CUDNN));
    return check_result();
}

static void test_failures(void)
{
    static char out[16384];
    int st = run_child(child_absent_library, out, sizeof(out));
    int aborted = st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
    CHECKF(aborted && strstr(out, "child checks: 0 failed"), "status 0x%x, output:\n%s", st, out);
    CHECKF(strstr(out, "cudnnGetVersion was called, but cuDNN (" ABSENT_SONAME ") could not be loaded"),
           "the forwarding call's message:\n%s", out);
    st = run_child(child_missing_symbol, out, sizeof(out));
    CHECKF(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x, output:\n%s", st, out);
}

/* The library file an address lies in ("" when none). */
static const char *file_of(void *addr)
{
    Dl_info di;
    if (!addr || !dladdr(addr, &di) || !di.dli_fname)
        return "";
    const char *slash = strrchr(di.dli_fname, '/');
    return slash ? slash + 1 : di.dli_fname;
}

static void test_table(void)
{
    static const char *const prefix[RT_CUDALIB_COUNT] = {"libcudnn.so", "libcublas", "libnccl.so"};
    const size_t n = rt_cudalibs_symbol_count();
    size_t count = 0, resolved = 0, per_lib[RT_CUDALIB_COUNT] = {0}, unresolved[RT_CUDALIB_COUNT] = {0};
    const char *first_unresolved[RT_CUDALIB_COUNT] = {0};
    const char *name;
    enum rt_cudalib lib;
    void *addr;
    for (size_t i = 0; (name = rt_cudalibs_symbol(i, &lib, &addr)); i++) {
        count++;
        for (size_t j = 0; j < i; j++)
            CHECKF(strcmp(rt_cudalibs_symbol(j, NULL, NULL), name), "%s listed twice", name);
        CHECKF((unsigned)lib < RT_CUDALIB_COUNT, "%s: library %d", name, (int)lib);
        if ((unsigned)lib >= RT_CUDALIB_COUNT)
            continue;
        per_lib[lib]++;
        if (!addr) {
            if (!unresolved[lib]++)
                first_unresolved[lib] = name;
            continue;
        }
        resolved++;
        /* Into the library, never into our own definition of the same name. */
        CHECKF(!strncmp(file_of(addr), prefix[lib], strlen(prefix[lib])), "%s resolved into '%s'", name,
               file_of(addr));
    }
    for (int i = 0; i < RT_CUDALIB_COUNT; i++)
        CHECKF(!unresolved[i], "%zu of the %zu functions of library %d did not resolve (the first: %s)",
               unresolved[i], per_lib[i], i, first_unresolved[i]);
    CHECKF(count == n && resolved == n, "%zu entries, %zu resolved, table size %zu", count, resolved, n);
    CHECK(rt_cudalibs_symbol(n, NULL, NULL) == NULL);
    CHECK(per_lib[RT_CUDALIB_CUDNN] > 0 && per_lib[RT_CUDALIB_CUBLAS] > 0);
#ifdef RT_HAVE_NCCL
    CHECK(per_lib[RT_CUDALIB_NCCL] > 0);
#else
    CHECK(per_lib[RT_CUDALIB_NCCL] == 0);
#endif
    printf("table: %zu functions (cuDNN %zu, cuBLAS %zu, NCCL %zu), all resolved: %s\n", n, per_lib[0], per_lib[1],
           per_lib[2], resolved == n ? "yes" : "NO");

    /* Loaded RTLD_GLOBAL, as linking them did, and our definitions are not exported: a lookup in the global
     * scope finds the library's function (comm/nccl.c looks up ncclResetDebugInit so). */
    CHECKF(!strncmp(file_of(dlsym(RTLD_DEFAULT, "cudnnGetVersion")), "libcudnn.so", 11), "cudnnGetVersion in '%s'",
           file_of(dlsym(RTLD_DEFAULT, "cudnnGetVersion")));
#ifdef RT_HAVE_NCCL
    CHECK(dlsym(RTLD_DEFAULT, "ncclResetDebugInit") != NULL);
#endif

    /* The names the call sites use, under the symbols the libraries export. */
    const char *const expect[] = {"cudnnCreate", "cudnnConvolutionForward", "cublasCreate_v2", "cublasGemmEx",
                                  "cublasSgemm_v2",
#ifdef RT_HAVE_NCCL
                                  "ncclCommInitRankConfig", "ncclAllReduce",
#endif
    };
    for (size_t k = 0; k < RT_ARRAY_LEN(expect); k++) {
        int found = 0;
        for (size_t i = 0; (name = rt_cudalibs_symbol(i, NULL, NULL)); i++)
            found |= !strcmp(name, expect[k]);
        CHECKF(found, "%s is not in the table", expect[k]);
    }
}

static void test_versions(void)
{
    int loaded[RT_CUDALIB_COUNT] = {0};
    const int major[RT_CUDALIB_COUNT] = {CUDNN_MAJOR, CUBLAS_VER_MAJOR,
#ifdef RT_HAVE_NCCL
                                         NCCL_MAJOR
#else
                                         0
#endif
    };
    for (int i = 0; i < RT_CUDALIB_COUNT; i++) {
        struct rt_cudalib_info li;
        CHECK_OK(rt_cudalibs_info((enum rt_cudalib)i, &li));
        if (!li.compiled) {
            CHECKF(i == RT_CUDALIB_NCCL, "%s not compiled in", li.name);
            printf("%-6s not in this build\n", li.name);
            continue;
        }
        CHECKF(li.loaded, "%s: %s", li.name, li.why);
        if (!li.loaded)
            continue;
        loaded[i] = 1;
        CHECKF(li.version[0] == major[i], "%s: loaded %d.%d.%d, built against %s", li.name, li.version[0],
               li.version[1], li.version[2], li.built);
        printf("%-6s built against %s, loaded %d.%d.%d from %s\n", li.name, li.built, li.version[0], li.version[1],
               li.version[2], li.path);
    }

    /* Through the forwarding definitions, as the call sites call them (only into a loaded library: a call
     * into one that failed would end this process). */
    if (loaded[RT_CUDALIB_CUDNN]) {
        CHECKF(cudnnGetVersion() / 10000 == CUDNN_MAJOR, "cudnnGetVersion() = %zu", cudnnGetVersion());
        CHECK(!strcmp(cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM), "CUDNN_STATUS_BAD_PARAM"));
    }
    if (loaded[RT_CUDALIB_CUBLAS]) {
        int v = -1;
        CHECK(cublasGetProperty(MAJOR_VERSION, &v) == CUBLAS_STATUS_SUCCESS && v == CUBLAS_VER_MAJOR);
        CHECKF(strstr(cublasGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED), "not initialized"), "'%s'",
               cublasGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED));
    }
#ifdef RT_HAVE_NCCL
    if (loaded[RT_CUDALIB_NCCL]) {
        int v = -1;
        CHECK(ncclGetVersion(&v) == ncclSuccess && v / 10000 == NCCL_MAJOR);
        CHECK(ncclGetErrorString(ncclInvalidArgument) && *ncclGetErrorString(ncclInvalidArgument));
    }
#endif
}

int main(void)
{
    /* Before this process loads anything: the children inherit nothing loaded. */
    test_failures();

    /* One at a time: each library's error of its own. */
    for (int i = 0; i < RT_CUDALIB_COUNT; i++)
        if (WANT_LIBS & (1u << i))
            CHECK_OK(rt_cudalibs_load(1u << i));
    CHECK_OK(rt_cudalibs_load(WANT_LIBS));
    test_table();
    test_versions();
    CHECK_ERR(rt_cudalibs_test_override(RT_CUDALIB_CUDNN, ABSENT_SONAME, NULL, NULL), "already loaded");
    CHECK_ERR(rt_cudalibs_load(1u << 7), "unknown library");
#ifndef RT_HAVE_NCCL
    CHECK_ERR(rt_cudalibs_load(RT_CUDALIBS_NCCL), "no NCCL");
#endif
    return check_result();
}

#else /* !RT_HAVE_CUDA */

#include <stdio.h>

int main(void)
{
    printf("skip: this build has no CUDA\n");
    return 77;
}

#endif
