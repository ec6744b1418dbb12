/*
 * cmd_version.c - `ringtrain version` (or `ringtrain --version`): this build's
 * version, the compute backends compiled in with what they see, and the
 * library versions (as compiled against, and as loaded where the library can
 * say). cuDNN, cuBLAS and NCCL are loaded here to ask them; one that is
 * missing is reported as "not found (reason)", never an error.
 */
#include <archive.h>
#include <errno.h>
#include <jansson.h>
#include <png.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>
#include <zlib.h>
#include <zstd.h>

#include "common/cudalibs.h"
#include "common/nvml.h"
#include "compute/compute.h"
#include "rt_buildinfo.h"
#include "tools/cli.h"

/* cuDNN, cuBLAS, NCCL: "built / loaded (file)" or "built / not found (reason)". */
static void print_cuda_libs(void)
{
#if RT_HAVE_CUDA
    for (int i = 0; i < RT_CUDALIB_COUNT; i++) {
        struct rt_cudalib_info li;
        if (rt_cudalibs_info((enum rt_cudalib)i, &li) != 0)
            continue;
        if (!li.compiled)
            printf("  %-12s not in this build\n", li.name);
        else if (li.loaded)
            printf("  %-12s %s / %d.%d.%d (%s)\n", li.name, li.built, li.version[0], li.version[1], li.version[2],
                   li.path);
        else
            printf("  %-12s %s / %s (%s)\n", li.name, li.built, li.err == -ENOSYS ? "not usable" : "not found",
                   li.why);
    }
#endif
}

static void version_help(void)
{
    printf("Usage: ringtrain version\n"
           "  or:  ringtrain --version\n\n"
           "Prints this build's version, the compute backends compiled in with what they see (CPUs; CUDA\n"
           "runtime, driver and GPUs), and the versions of the libraries it was built against and loaded.\n"
           "cuDNN, cuBLAS and NCCL are loaded to ask them; one that is missing is reported as\n"
           "\"not found (reason)\", not as an error.\n\n"
           "Options:\n"
           "  -h, --help  print this help\n");
}

int cmd_version(int argc, char **argv)
{
    struct rt_backend_probe cpu, cuda;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            version_help();
            return RT_EXIT_OK;
        }
        return cli_usage_error("version", "unexpected argument '%s'", argv[i]);
    }
    printf("ringtrain %s (%s build, %s)\n", RT_VERSION, RT_BUILD_TYPE, RT_C_COMPILER);
    printf("compute backends:\n");
    rt_backend_probe(RT_BACKEND_CPU, &cpu);
    printf("  cpu   %s\n", cpu.detail);
    if (rt_backend_probe(RT_BACKEND_CUDA, &cuda) == 0) {
        /* The runtime with the driver branch it needs, the driver with the CUDA version it supports: a GPU run
         * that is refused says why on this one line. */
        char needs[48] = "", driver[128];
        if (cuda.driver_needed)
            snprintf(needs, sizeof(needs), " (needs NVIDIA driver %d or later)", cuda.driver_needed);
        rt_nvml_describe_driver(cuda.driver_version, driver, sizeof(driver));
        printf("  cuda  built with CUDA %s, cuDNN %s, cuBLAS %s, NCCL %s; runtime %d.%d%s, driver %s; %s\n",
               RT_CUDA_VERSION, *RT_CUDNN_VERSION ? RT_CUDNN_VERSION : "not found",
               *RT_CUBLAS_VERSION ? RT_CUBLAS_VERSION : "not found", *RT_NCCL_VERSION ? RT_NCCL_VERSION : "not found",
               cuda.runtime_version / 1000, cuda.runtime_version % 1000 / 10, needs, driver, cuda.detail);
    } else {
        printf("  cuda  %s\n", cuda.detail);
    }
    printf("libraries (built against / loaded):\n");
    printf("  liburing     %s\n", RT_LIBURING_VERSION);
    printf("  zstd         %s / %s\n", RT_LIBZSTD_VERSION, ZSTD_versionString());
    printf("  turbojpeg    %s\n", RT_TURBOJPEG_VERSION);
    printf("  libarchive   %s / %s\n", RT_LIBARCHIVE_VERSION, archive_version_string());
    unsigned xxv = XXH_versionNumber();
    printf("  xxhash       %s / %u.%u.%u\n", RT_XXHASH_VERSION, xxv / 10000, xxv / 100 % 100, xxv % 100);
    printf("  jansson      %s / %s\n", RT_JANSSON_VERSION, jansson_version_str());
    printf("  zlib         %s / %s\n", RT_ZLIB_VERSION, zlibVersion());
    printf("  libpng       %s / %s\n", RT_LIBPNG_VERSION, png_get_libpng_ver(NULL));
    print_cuda_libs();
    return RT_EXIT_OK;
}
