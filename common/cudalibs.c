/*
 * cudalibs.c - the table of every cuDNN, cuBLAS and NCCL function ringtrain
 * calls, the loader that fills it (dlopen by soname, then from the build's
 * folder; dlsym of every entry), and a definition of each of those functions,
 * under its own name, that forwards to the table. See cudalibs.h.
 *
 * The list below is the only place a function is named. Each entry is
 *   X(return type, name, (parameters), (arguments), library)
 * and expands into a member of the function-pointer table, a row of the symbol
 * table the loader walks, and the forwarding definition. The definitions are
 * checked against the libraries' headers: a parameter list that differs from
 * the header's is a "conflicting types" error, and a name no header declares
 * fails -Wmissing-prototypes. A function the code calls that is missing here is
 * an undefined reference at link time, since the libraries are not linked.
 *
 * It does not create handles, pick devices or know what the calls are for; it
 * does not call MPI (a failure aborts this process only: see need()).
 */
#include "common/cudalibs.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cudnn.h>
#ifdef RT_HAVE_NCCL
#include <nccl.h>
#endif

#include "common/common.h"

/* The folders where CMake found the libraries (compile definitions). */
#ifndef RT_CUDNN_LIBDIR
#define RT_CUDNN_LIBDIR ""
#endif
#ifndef RT_CUBLAS_LIBDIR
#define RT_CUBLAS_LIBDIR ""
#endif
#ifndef RT_NCCL_LIBDIR
#define RT_NCCL_LIBDIR ""
#endif

#define RT_STR_(x) #x
#define RT_STR(x) RT_STR_(x)

/* ---- the list ------------------------------------------------------------------------- */

/* cudnnX entries: compute/cuda/backend_cuda.c, dnn.c, dnn_fast.c, dnn_graph.c and cuda_be.h's check macro. */
#define RT_CUDALIBS_CUDNN_LIST(X)                                                                                     \
    X(cudnnStatus_t, cudnnCreate, (cudnnHandle_t * handle), (handle), CUDNN)                                          \
    X(cudnnStatus_t, cudnnDestroy, (cudnnHandle_t handle), (handle), CUDNN)                                           \
    X(cudnnStatus_t, cudnnSetStream, (cudnnHandle_t handle, cudaStream_t streamId), (handle, streamId), CUDNN)        \
    X(size_t, cudnnGetVersion, (void), (), CUDNN)                                                                     \
    X(const char *, cudnnGetErrorString, (cudnnStatus_t status), (status), CUDNN)                                     \
    X(cudnnStatus_t, cudnnCreateTensorDescriptor, (cudnnTensorDescriptor_t * tensorDesc), (tensorDesc), CUDNN)        \
    X(cudnnStatus_t, cudnnDestroyTensorDescriptor, (cudnnTensorDescriptor_t tensorDesc), (tensorDesc), CUDNN)         \
    X(cudnnStatus_t, cudnnSetTensor4dDescriptor,                                                                      \
      (cudnnTensorDescriptor_t tensorDesc, cudnnTensorFormat_t format, cudnnDataType_t dataType, int n, int c, int h, \
       int w),                                                                                                        \
      (tensorDesc, format, dataType, n, c, h, w), CUDNN)                                                              \
    X(cudnnStatus_t, cudnnCreateFilterDescriptor, (cudnnFilterDescriptor_t * filterDesc), (filterDesc), CUDNN)        \
    X(cudnnStatus_t, cudnnDestroyFilterDescriptor, (cudnnFilterDescriptor_t filterDesc), (filterDesc), CUDNN)         \
    X(cudnnStatus_t, cudnnSetFilter4dDescriptor,                                                                      \
      (cudnnFilterDescriptor_t filterDesc, cudnnDataType_t dataType, cudnnTensorFormat_t format, int k, int c, int h, \
       int w),                                                                                                        \
      (filterDesc, dataType, format, k, c, h, w), CUDNN)                                                              \
    X(cudnnStatus_t, cudnnCreateConvolutionDescriptor, (cudnnConvolutionDescriptor_t * convDesc), (convDesc), CUDNN)  \
    X(cudnnStatus_t, cudnnDestroyConvolutionDescriptor, (cudnnConvolutionDescriptor_t convDesc), (convDesc), CUDNN)   \
    X(cudnnStatus_t, cudnnSetConvolution2dDescriptor,                                                                 \
      (cudnnConvolutionDescriptor_t convDesc, int pad_h, int pad_w, int u, int v, int dilation_h, int dilation_w,     \
       cudnnConvolutionMode_t mode, cudnnDataType_t computeType),                                                     \
      (convDesc, pad_h, pad_w, u, v, dilation_h, dilation_w, mode, computeType), CUDNN)                               \
    X(cudnnStatus_t, cudnnSetConvolutionMathType, (cudnnConvolutionDescriptor_t convDesc, cudnnMathType_t mathType),  \
      (convDesc, mathType), CUDNN)                                                                                    \
    X(cudnnStatus_t, cudnnGetConvolutionForwardAlgorithmMaxCount, (cudnnHandle_t handle, int *count),                 \
      (handle, count), CUDNN)                                                                                         \
    X(cudnnStatus_t, cudnnGetConvolutionBackwardDataAlgorithmMaxCount, (cudnnHandle_t handle, int *count),            \
      (handle, count), CUDNN)                                                                                         \
    X(cudnnStatus_t, cudnnGetConvolutionBackwardFilterAlgorithmMaxCount, (cudnnHandle_t handle, int *count),          \
      (handle, count), CUDNN)                                                                                         \
    X(cudnnStatus_t, cudnnFindConvolutionForwardAlgorithmEx,                                                          \
      (cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnFilterDescriptor_t wDesc, \
       const void *w, const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc, void *y,      \
       const int requestedAlgoCount, int *returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t *perfResults,             \
       void *workSpace, size_t workSpaceSizeInBytes),                                                                 \
      (handle, xDesc, x, wDesc, w, convDesc, yDesc, y, requestedAlgoCount, returnedAlgoCount, perfResults, workSpace, \
       workSpaceSizeInBytes),                                                                                         \
      CUDNN)                                                                                                          \
    X(cudnnStatus_t, cudnnFindConvolutionBackwardDataAlgorithmEx,                                                     \
      (cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const void *w,                                      \
       const cudnnTensorDescriptor_t dyDesc, const void *dy, const cudnnConvolutionDescriptor_t convDesc,             \
       const cudnnTensorDescriptor_t dxDesc, void *dx, const int requestedAlgoCount, int *returnedAlgoCount,          \
       cudnnConvolutionBwdDataAlgoPerf_t *perfResults, void *workSpace, size_t workSpaceSizeInBytes),                 \
      (handle, wDesc, w, dyDesc, dy, convDesc, dxDesc, dx, requestedAlgoCount, returnedAlgoCount, perfResults,       \
       workSpace, workSpaceSizeInBytes),                                                                              \
      CUDNN)                                                                                                          \
    X(cudnnStatus_t, cudnnFindConvolutionBackwardFilterAlgorithmEx,                                                   \
      (cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const void *x,                                      \
       const cudnnTensorDescriptor_t dyDesc, const void *y, const cudnnConvolutionDescriptor_t convDesc,              \
       const cudnnFilterDescriptor_t dwDesc, void *dw, const int requestedAlgoCount, int *returnedAlgoCount,          \
       cudnnConvolutionBwdFilterAlgoPerf_t *perfResults, void *workSpace, size_t workSpaceSizeInBytes),               \
      (handle, xDesc, x, dyDesc, y, convDesc, dwDesc, dw, requestedAlgoCount, returnedAlgoCount, perfResults,        \
       workSpace, workSpaceSizeInBytes),                                                                              \
      CUDNN)                                                                                                          \
    X(cudnnStatus_t, cudnnGetConvolutionForwardWorkspaceSize,                                                         \
      (cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,                \
       const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc, cudnnConvolutionFwdAlgo_t    \
       algo, size_t *sizeInBytes),                                                                                    \
      (handle, xDesc, wDesc, convDesc, yDesc, algo, sizeInBytes), CUDNN)                                              \
    X(cudnnStatus_t, cudnnGetConvolutionBackwardDataWorkspaceSize,                                                    \
      (cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,               \
       const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,                             \
       cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes),                                                      \
      (handle, wDesc, dyDesc, convDesc, dxDesc, algo, sizeInBytes), CUDNN)                                            \
    X(cudnnStatus_t, cudnnGetConvolutionBackwardFilterWorkspaceSize,                                                  \
      (cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,               \
       const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,                           \
       cudnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes),                                                    \
      (handle, xDesc, dyDesc, convDesc, gradDesc, algo, sizeInBytes), CUDNN)                                          \
    X(cudnnStatus_t, cudnnConvolutionForward,                                                                         \
      (cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t xDesc, const void *x,                   \
       const cudnnFilterDescriptor_t wDesc, const void *w, const cudnnConvolutionDescriptor_t convDesc,               \
       cudnnConvolutionFwdAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *beta,                \
       const cudnnTensorDescriptor_t yDesc, void *y),                                                                 \
      (handle, alpha, xDesc, x, wDesc, w, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, yDesc, y), CUDNN)    \
    X(cudnnStatus_t, cudnnConvolutionBackwardData,                                                                    \
      (cudnnHandle_t handle, const void *alpha, const cudnnFilterDescriptor_t wDesc, const void *w,                   \
       const cudnnTensorDescriptor_t dyDesc, const void *dy, const cudnnConvolutionDescriptor_t convDesc,             \
       cudnnConvolutionBwdDataAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *beta,            \
       const cudnnTensorDescriptor_t dxDesc, void *dx),                                                               \
      (handle, alpha, wDesc, w, dyDesc, dy, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, dxDesc, dx),       \
      CUDNN)                                                                                                          \
    X(cudnnStatus_t, cudnnConvolutionBackwardFilter,                                                                  \
      (cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t xDesc, const void *x,                   \
       const cudnnTensorDescriptor_t dyDesc, const void *dy, const cudnnConvolutionDescriptor_t convDesc,             \
       cudnnConvolutionBwdFilterAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *beta,          \
       const cudnnFilterDescriptor_t dwDesc, void *dw),                                                               \
      (handle, alpha, xDesc, x, dyDesc, dy, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, dwDesc, dw),       \
      CUDNN)                                                                                                          \
    X(cudnnStatus_t, cudnnConvolutionBackwardBias,                                                                    \
      (cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t dyDesc, const void *dy,                 \
       const void *beta, const cudnnTensorDescriptor_t dbDesc, void *db),                                             \
      (handle, alpha, dyDesc, dy, beta, dbDesc, db), CUDNN)                                                           \
    X(cudnnStatus_t, cudnnAddTensor,                                                                                  \
      (cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t aDesc, const void *A, const void *beta, \
       const cudnnTensorDescriptor_t cDesc, void *C),                                                                 \
      (handle, alpha, aDesc, A, beta, cDesc, C), CUDNN)                                                           \
    /* The backend ("graph") API: compute/cuda/dnn_graph.c. */                                                      \
    X(cudnnStatus_t, cudnnBackendCreateDescriptor,                                                                    \
      (cudnnBackendDescriptorType_t descriptorType, cudnnBackendDescriptor_t * descriptor),                          \
      (descriptorType, descriptor), CUDNN)                                                                            \
    X(cudnnStatus_t, cudnnBackendDestroyDescriptor, (cudnnBackendDescriptor_t descriptor), (descriptor), CUDNN)       \
    X(cudnnStatus_t, cudnnBackendFinalize, (cudnnBackendDescriptor_t descriptor), (descriptor), CUDNN)                \
    X(cudnnStatus_t, cudnnBackendSetAttribute,                                                                        \
      (cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t attributeName,                                \
       cudnnBackendAttributeType_t attributeType, int64_t elementCount, const void *arrayOfElements),                 \
      (descriptor, attributeName, attributeType, elementCount, arrayOfElements), CUDNN)                               \
    X(cudnnStatus_t, cudnnBackendGetAttribute,                                                                        \
      (cudnnBackendDescriptor_t const descriptor, cudnnBackendAttributeName_t attributeName,                          \
       cudnnBackendAttributeType_t attributeType, int64_t requestedElementCount, int64_t *elementCount,               \
       void *arrayOfElements),                                                                                        \
      (descriptor, attributeName, attributeType, requestedElementCount, elementCount, arrayOfElements), CUDNN)        \
    X(cudnnStatus_t, cudnnBackendExecute,                                                                             \
      (cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan, cudnnBackendDescriptor_t variantPack),           \
      (handle, executionPlan, variantPack), CUDNN)

/* cublasX entries under their exported names: cublas_v2.h maps cublasCreate to
 * cublasCreate_v2 and so on (the unsuffixed symbols are the legacy API). */
#define RT_CUDALIBS_CUBLAS_LIST(X)                                                                                    \
    X(cublasStatus_t, cublasCreate_v2, (cublasHandle_t * handle), (handle), CUBLAS)                                   \
    X(cublasStatus_t, cublasDestroy_v2, (cublasHandle_t handle), (handle), CUBLAS)                                    \
    X(cublasStatus_t, cublasGetVersion_v2, (cublasHandle_t handle, int *version), (handle, version), CUBLAS)          \
    X(cublasStatus_t, cublasGetProperty, (libraryPropertyType type, int *value), (type, value), CUBLAS)               \
    X(const char *, cublasGetStatusString, (cublasStatus_t status), (status), CUBLAS)                                 \
    X(cublasStatus_t, cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t streamId), (handle, streamId), CUBLAS) \
    X(cublasStatus_t, cublasSetMathMode, (cublasHandle_t handle, cublasMath_t mode), (handle, mode), CUBLAS)          \
    X(cublasStatus_t, cublasSetPointerMode_v2, (cublasHandle_t handle, cublasPointerMode_t mode), (handle, mode),     \
      CUBLAS)                                                                                                         \
    X(cublasStatus_t, cublasSgemm_v2,                                                                                 \
      (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,                \
       const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta, float *C, int ldc),   \
      (handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc), CUBLAS)                                 \
    X(cublasStatus_t, cublasGemmEx,                                                                                   \
      (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,                \
       const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B, cudaDataType Btype, int ldb,     \
       const void *beta, void *C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,                       \
       cublasGemmAlgo_t algo),                                                                                        \
      (handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, computeType, algo), \
      CUBLAS)

/* ncclX entries: comm/nccl.c. */
#ifdef RT_HAVE_NCCL
#define RT_CUDALIBS_NCCL_LIST(X)                                                                                      \
    X(ncclResult_t, ncclGetVersion, (int *version), (version), NCCL)                                                  \
    X(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId), (uniqueId), NCCL)                                     \
    X(ncclResult_t, ncclCommInitRankConfig,                                                                           \
      (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config),                          \
      (comm, nranks, commId, rank, config), NCCL)                                                                     \
    X(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t * asyncError), (comm, asyncError), NCCL)    \
    X(ncclResult_t, ncclCommFinalize, (ncclComm_t comm), (comm), NCCL)                                                \
    X(ncclResult_t, ncclCommDestroy, (ncclComm_t comm), (comm), NCCL)                                                 \
    X(ncclResult_t, ncclCommAbort, (ncclComm_t comm), (comm), NCCL)                                                   \
    X(const char *, ncclGetErrorString, (ncclResult_t result), (result), NCCL)                                        \
    X(const char *, ncclGetLastError, (ncclComm_t comm), (comm), NCCL)                                                \
    X(ncclResult_t, ncclAllReduce,                                                                                    \
      (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, \
       cudaStream_t stream),                                                                                          \
      (sendbuff, recvbuff, count, datatype, op, comm, stream), NCCL)
#else
#define RT_CUDALIBS_NCCL_LIST(X)
#endif

#define RT_CUDALIBS_LIST(X) RT_CUDALIBS_CUDNN_LIST(X) RT_CUDALIBS_CUBLAS_LIST(X) RT_CUDALIBS_NCCL_LIST(X)

/* ---- the tables it expands into --------------------------------------------------------- */

/* One pointer per function, filled only when all of its library's resolve. */
struct fn_table {
#define RT_CUDALIBS_MEMBER(ret, name, params, args, lib) ret(*name) params;
    RT_CUDALIBS_LIST(RT_CUDALIBS_MEMBER)
#undef RT_CUDALIBS_MEMBER
};
static struct fn_table fn;

/* What the loader looks up: the name as the definition below spells it once
 * the headers' macros are applied, so that the two cannot differ. */
static const struct sym {
    const char *name;
    enum rt_cudalib lib;
    size_t offset; /* of its pointer in struct fn_table */
} syms[] = {
#define RT_CUDALIBS_ROW(ret, name, params, args, lib) {RT_STR(name), RT_CUDALIB_##lib, offsetof(struct fn_table, name)},
    RT_CUDALIBS_LIST(RT_CUDALIBS_ROW)
#undef RT_CUDALIBS_ROW
};

_Static_assert(sizeof(struct fn_table) == RT_ARRAY_LEN(syms) * sizeof(void (*)(void)),
               "one pointer per row of the symbol table");

/* ---- the libraries ---------------------------------------------------------------------- */

enum lib_state { LIB_UNTRIED, LIB_LOADED, LIB_FAILED };

struct lib {
    const char *name;
    const char *soname;   /* NULL: not in this build */
    const char *dir;      /* where CMake found it; "" when unknown */
    const char *built;    /* the headers' version */
    const char *advice;   /* what a user does when it is missing */
    const char *extra;    /* test hook: one more symbol to require */
    atomic_int state;     /* enum lib_state; LOADED/FAILED published with release */
    int err;
    void *handle;
    char path[512];
    char msg[768];        /* the error for rt_cudalibs_load */
    char reason[400];     /* its short form for rt_cudalibs_info */
};

/* The sonames carry the major version of the headers compiled against. */
static struct lib libs[RT_CUDALIB_COUNT] = {
    [RT_CUDALIB_CUDNN] = {.name = "cuDNN",
                          .soname = "libcudnn.so." RT_STR(CUDNN_MAJOR),
                          .dir = RT_CUDNN_LIBDIR,
                          .built = RT_STR(CUDNN_MAJOR) "." RT_STR(CUDNN_MINOR) "." RT_STR(CUDNN_PATCHLEVEL),
                          .advice = "Install cuDNN " RT_STR(CUDNN_MAJOR) " or put its folder on LD_LIBRARY_PATH, or "
                                    "use --device cpu"},
    [RT_CUDALIB_CUBLAS] = {.name = "cuBLAS",
                           .soname = "libcublas.so." RT_STR(CUBLAS_VER_MAJOR),
                           .dir = RT_CUBLAS_LIBDIR,
                           .built = RT_STR(CUBLAS_VER_MAJOR) "." RT_STR(CUBLAS_VER_MINOR) "." RT_STR(CUBLAS_VER_PATCH),
                           .advice = "Install cuBLAS " RT_STR(CUBLAS_VER_MAJOR) " (with libcublasLt, from the CUDA "
                                     "toolkit) or put its folder on LD_LIBRARY_PATH, or use --device cpu"},
#ifdef RT_HAVE_NCCL
    [RT_CUDALIB_NCCL] = {.name = "NCCL",
                         .soname = "libnccl.so." RT_STR(NCCL_MAJOR),
                         .dir = RT_NCCL_LIBDIR,
                         .built = RT_STR(NCCL_MAJOR) "." RT_STR(NCCL_MINOR) "." RT_STR(NCCL_PATCH),
                         .advice = "Install NCCL " RT_STR(NCCL_MAJOR) " or put its folder on LD_LIBRARY_PATH, or use "
                                   "--device cpu"},
#else
    [RT_CUDALIB_NCCL] = {.name = "NCCL", .soname = NULL, .dir = "", .built = "", .advice = "this build has no NCCL"},
#endif
};

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

/* dlerror()'s text, or `none` when it has none. */
static const char *dl_reason(const char *none)
{
    const char *e = dlerror();
    return e ? e : none;
}

/* Opens L's library: by soname through the loader's search, then from the
 * build's folder. Returns the handle, or NULL with L->msg set. */
static void *lib_open(struct lib *L)
{
    /* RTLD_GLOBAL: as a linked library, its symbols are visible to dlsym(RTLD_DEFAULT).
     * RTLD_NOW: a library that lacks what it needs fails here, not in a step. */
    void *h = dlopen(L->soname, RTLD_NOW | RTLD_GLOBAL);
    if (h)
        return h;
    char first[300];
    snprintf(first, sizeof(first), "%s", dl_reason("not found"));
    if (!L->dir[0]) {
        snprintf(L->msg, sizeof(L->msg), "%s (%s) could not be loaded: %s (searched LD_LIBRARY_PATH and the "
                 "ldconfig cache; the build recorded no folder for it). %s", L->name, L->soname, first, L->advice);
        snprintf(L->reason, sizeof(L->reason), "%s", first);
        return NULL;
    }
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", L->dir, L->soname);
    h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (h)
        return h;
    snprintf(L->msg, sizeof(L->msg), "%s (%s) could not be loaded: %s (searched LD_LIBRARY_PATH and the ldconfig "
             "cache); nor from the build's folder %s: %.250s. %s", L->name, L->soname, first, L->dir,
             dl_reason("not found"), L->advice);
    snprintf(L->reason, sizeof(L->reason), "%s; nor in %.80s", first, L->dir);
    return NULL;
}

/* The names of missing symbols, as a list for a message (cut with "..."). */
struct missing {
    size_t n;
    char text[400];
};

static void missing_add(struct missing *m, const char *name)
{
    size_t len = strlen(m->text);
    m->n++;
    if (len + strlen(name) + 8 < sizeof(m->text))
        snprintf(m->text + len, sizeof(m->text) - len, "%s%s", len ? ", " : "", name);
    else if (!strstr(m->text, ", ..."))
        snprintf(m->text + len, sizeof(m->text) - len, ", ...");
}

/* Loads library `i` and fills its part of the table; called with load_lock
 * held, once. Returns 0 or -errno with L->msg set. */
static int lib_load_locked(enum rt_cudalib i)
{
    struct lib *L = &libs[i];
    void *h = lib_open(L);
    if (!h)
        return -ENOENT;
    char path[sizeof(L->path)];
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
        snprintf(path, sizeof(path), "%s", lm->l_name);
    else
        snprintf(path, sizeof(path), "%s", L->soname);

    /* Every symbol first; the table is written only when none is missing. */
    void *addr[RT_ARRAY_LEN(syms)] = {0};
    struct missing miss = {.text = ""};
    for (size_t k = 0; k < RT_ARRAY_LEN(syms); k++) {
        if (syms[k].lib != i)
            continue;
        if (!(addr[k] = dlsym(h, syms[k].name)))
            missing_add(&miss, syms[k].name);
    }
    if (L->extra && !dlsym(h, L->extra))
        missing_add(&miss, L->extra);
    if (miss.n) {
        snprintf(L->msg, sizeof(L->msg), "%s (%.200s) lacks %zu of the functions ringtrain calls: %.300s (a release older "
                 "than the %s this build was made with?). %s", L->name, path, miss.n, miss.text, L->built,
                 L->advice);
        snprintf(L->reason, sizeof(L->reason), "%.200s lacks %.190s", path, miss.text);
        dlclose(h);
        return -ENOSYS;
    }
    for (size_t k = 0; k < RT_ARRAY_LEN(syms); k++)
        if (syms[k].lib == i)
            memcpy((char *)&fn + syms[k].offset, &addr[k], sizeof(addr[k]));
    memcpy(L->path, path, sizeof(path));
    L->handle = h;
    return 0;
}

/* Loads library `i` unless it was tried; returns 0 or the (remembered) error. */
static int lib_load(enum rt_cudalib i)
{
    struct lib *L = &libs[i];
    int st = atomic_load_explicit(&L->state, memory_order_acquire);
    if (st == LIB_UNTRIED) {
        pthread_mutex_lock(&load_lock);
        st = atomic_load_explicit(&L->state, memory_order_relaxed);
        if (st == LIB_UNTRIED) {
            if (!L->soname) {
                L->err = -ENOTSUP;
                snprintf(L->msg, sizeof(L->msg), "%s: this build of ringtrain has no %s (CMake found no nccl.h and "
                         "libnccl 2.14 or later)", L->name, L->name);
                snprintf(L->reason, sizeof(L->reason), "not in this build");
            } else {
                L->err = lib_load_locked(i);
            }
            st = L->err ? LIB_FAILED : LIB_LOADED;
            atomic_store_explicit(&L->state, st, memory_order_release);
        }
        pthread_mutex_unlock(&load_lock);
    }
    return st == LIB_LOADED ? 0 : L->err;
}

/* A forwarding function found its library not loaded: load it now, or end
 * the process with the reason. Code that wants a clean error calls
 * rt_cudalibs_load() before its first call into the library. */
static void need(enum rt_cudalib i, const char *fname)
{
    if (lib_load(i) == 0)
        return;
    rt_log(RT_LOG_ERROR, "%s was called, but %s", fname, libs[i].msg);
    fflush(stderr);
    abort();
}

/* ---- the forwarding definitions ------------------------------------------------------- */

/* Hidden: an executable never exports them, so a library loaded later cannot
 * bind its own calls to these instead of to its own functions. */
#define RT_CUDALIBS_FORWARD(ret, name, params, args, lib)                                                            \
    __attribute__((visibility("hidden"))) ret name params                                                           \
    {                                                                                                                \
        if (atomic_load_explicit(&libs[RT_CUDALIB_##lib].state, memory_order_acquire) != LIB_LOADED)                 \
            need(RT_CUDALIB_##lib, RT_STR(name));                                                                    \
        return fn.name args;                                                                                         \
    }
RT_CUDALIBS_LIST(RT_CUDALIBS_FORWARD)
#undef RT_CUDALIBS_FORWARD

/* ---- the API ------------------------------------------------------------------------------ */

int rt_cudalibs_load(unsigned which)
{
    if (which & ~(unsigned)RT_CUDALIBS_ALL)
        return rt_errf(-EINVAL, "rt_cudalibs_load: unknown library bits 0x%x", which & ~(unsigned)RT_CUDALIBS_ALL);
    for (int i = 0; i < RT_CUDALIB_COUNT; i++) {
        if (!(which & (1u << i)))
            continue;
        int rc = lib_load((enum rt_cudalib)i);
        if (rc)
            return rt_errf(rc, "%s", libs[i].msg);
    }
    return 0;
}

/* The loaded library's own version; 0 when it cannot say. */
static void lib_version(enum rt_cudalib i, int v[3])
{
    v[0] = v[1] = v[2] = 0;
    switch (i) {
    case RT_CUDALIB_CUDNN: {
        size_t c = fn.cudnnGetVersion(); /* cuDNN 9: major*10000 + minor*100 + patch */
        size_t m = c >= 90000 ? 10000 : 1000;
        v[0] = (int)(c / m);
        v[1] = (int)(c % m / 100);
        v[2] = (int)(c % 100);
        break;
    }
    case RT_CUDALIB_CUBLAS:
        fn.cublasGetProperty(MAJOR_VERSION, &v[0]);
        fn.cublasGetProperty(MINOR_VERSION, &v[1]);
        fn.cublasGetProperty(PATCH_LEVEL, &v[2]);
        break;
    case RT_CUDALIB_NCCL: {
#ifdef RT_HAVE_NCCL
        int c = 0;
        if (fn.ncclGetVersion(&c) == ncclSuccess) {
            int m = c >= 10000 ? 10000 : 1000; /* 2.9 changed the code's layout */
            v[0] = c / m;
            v[1] = c % m / 100;
            v[2] = c % 100;
        }
#endif
        break;
    }
    default:
        break;
    }
}

int rt_cudalibs_info(enum rt_cudalib lib, struct rt_cudalib_info *out)
{
    if ((unsigned)lib >= RT_CUDALIB_COUNT)
        return rt_errf(-EINVAL, "rt_cudalibs_info: no library %d", (int)lib);
    const struct lib *L = &libs[lib];
    memset(out, 0, sizeof(*out));
    out->name = L->name;
    out->soname = L->soname;
    out->dir = L->dir;
    out->built = L->built;
    out->compiled = L->soname != NULL;
    if (!out->compiled)
        return 0;
    if (lib_load(lib) == 0) {
        out->loaded = 1;
        lib_version(lib, out->version);
        snprintf(out->path, sizeof(out->path), "%s", L->path);
    } else {
        out->err = L->err;
        snprintf(out->why, sizeof(out->why), "%s", L->reason);
    }
    return 0;
}

size_t rt_cudalibs_symbol_count(void)
{
    return RT_ARRAY_LEN(syms);
}

const char *rt_cudalibs_symbol(size_t i, enum rt_cudalib *lib, void **addr)
{
    if (i >= RT_ARRAY_LEN(syms))
        return NULL;
    if (lib)
        *lib = syms[i].lib;
    if (addr) {
        *addr = NULL;
        if (atomic_load_explicit(&libs[syms[i].lib].state, memory_order_acquire) == LIB_LOADED)
            memcpy(addr, (const char *)&fn + syms[i].offset, sizeof(*addr));
    }
    return syms[i].name;
}

int rt_cudalibs_test_override(enum rt_cudalib lib, const char *soname, const char *dir, const char *extra)
{
    if ((unsigned)lib >= RT_CUDALIB_COUNT)
        return rt_errf(-EINVAL, "rt_cudalibs_test_override: no library %d", (int)lib);
    int rc = 0;
    pthread_mutex_lock(&load_lock);
    struct lib *L = &libs[lib];
    if (atomic_load_explicit(&L->state, memory_order_relaxed) != LIB_UNTRIED)
        rc = rt_errf(-EBUSY, "%s was already loaded or tried", L->name);
    else if (!L->soname)
        rc = rt_errf(-ENOTSUP, "%s is not in this build", L->name);
    else {
        if (soname)
            L->soname = soname;
        if (dir)
            L->dir = dir;
        L->extra = extra;
    }
    pthread_mutex_unlock(&load_lock);
    return rc;
}
