/*
 * test_cuda_version.c - rt_cuda_driver_verdict(), the CUDA backend's verdict
 * on the NVIDIA driver, over versions and errors no one machine can show: no
 * driver; a driver of an older major version, refused before the devices are
 * counted and named with both versions; an older minor version, let through
 * to the count (CUDA's minor version compatibility) and named with both
 * versions when the count then says cudaErrorInsufficientDriver; a kernel
 * module that does not match the driver's libraries; any other count error.
 * Pure: it needs no GPU and no driver.
 *
 * Exit 0 pass, 1 fail, 77 skip (a build without the CUDA backend, where the
 * verdict does not exist).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "rt_buildinfo.h"

#if RT_HAVE_CUDA
#include "check.h"
#include "compute/cuda/cuda_be.h"

/* The verdict's return value, with its message in msg; the message is also checked to contain `needle`
 * (NULL: the verdict must be 0). */
static void expect(int driver, int runtime, int err, const char *text, const char *needle)
{
    char msg[400] = "";
    const int rc = rt_cuda_driver_verdict(driver, runtime, err, text, msg, sizeof(msg));
    if (!needle) {
        CHECKF(rc == 0, "driver %d runtime %d count %d: %d '%s'", driver, runtime, err, rc, msg);
        return;
    }
    CHECKF(rc == -ENODEV, "driver %d runtime %d count %d: returned %d", driver, runtime, err, rc);
    CHECKF(strstr(msg, needle) != NULL, "driver %d runtime %d count %d: '%s' lacks '%s'", driver, runtime, err, msg,
           needle);
}
#endif

int main(void)
{
#if RT_HAVE_CUDA
    const int insufficient = (int)cudaErrorInsufficientDriver;
    const char *old = "the NVIDIA driver supports CUDA 12.4, older than the 13.0 this build needs: update the NVIDIA "
                      "driver (CUDA 13.x needs 580 or later)";

    /* No driver: whatever the count would say. */
    expect(0, 13000, -1, NULL, "no NVIDIA driver on this machine");
    expect(0, 13000, insufficient, "CUDA driver version is insufficient for CUDA runtime version",
           "no NVIDIA driver");

    /* An older major version: refused before counting, both versions named; the count's error, had there
     * been one, does not replace that message. */
    expect(12040, 13000, -1, NULL, old);
    expect(12040, 13000, insufficient, "CUDA driver version is insufficient for CUDA runtime version", old);
    expect(12040, 13000, (int)cudaErrorNoDevice, "no CUDA-capable device is detected", old);
    expect(11080, 12000, -1, NULL, "supports CUDA 11.8, older than the 12.0");

    /* The same major version: newer, equal, and older minor versions pass the version check ... */
    expect(13010, 13000, -1, NULL, NULL);
    expect(13000, 13000, -1, NULL, NULL);
    expect(12020, 12080, -1, NULL, NULL);
    expect(12020, 12080, (int)cudaSuccess, NULL, NULL);
    /* ... and an older minor version the count refuses is named with both versions. */
    expect(12020, 12080, insufficient, "CUDA driver version is insufficient for CUDA runtime version",
           "the NVIDIA driver supports CUDA 12.2, older than the 12.8 this build needs");
    /* The count's refusal with a driver as new as the runtime: both versions and the runtime's words. */
    expect(13000, 13000, insufficient, "CUDA driver version is insufficient for CUDA runtime version",
           "the NVIDIA driver (CUDA 13.0) is too old for this build's CUDA 13.0 runtime (CUDA driver version is "
           "insufficient");

    /* Other count errors. */
    expect(13000, 13000, (int)cudaErrorSystemDriverMismatch, "system has unsupported display driver / cuda driver "
           "combination", "kernel module and the driver's libraries are different versions");
    expect(13000, 13000, (int)cudaErrorNoDevice, "no CUDA-capable device is detected",
           "no usable GPU: no CUDA-capable device is detected");
    expect(13000, 13000, (int)cudaErrorNoDevice, NULL, "no usable GPU: cudaGetDeviceCount failed");

    /* The driver branch each runtime needs, named in the messages above; none for a major version not in the table. */
    CHECK(rt_cuda_min_driver(13000) == 580 && rt_cuda_min_driver(13020) == 580);
    CHECK(rt_cuda_min_driver(12080) == 525 && rt_cuda_min_driver(11080) == 450);
    CHECK(rt_cuda_min_driver(14000) == 0 && rt_cuda_min_driver(0) == 0);
    expect(11080, 12000, -1, NULL, "update the NVIDIA driver (CUDA 12.x needs 525 or later)");
    expect(13000, 14000, -1, NULL, "older than the 14.0 this build needs: update the NVIDIA driver");

    /* A short buffer is cut, never overrun. */
    char small[12];
    memset(small, 'x', sizeof(small));
    CHECK(rt_cuda_driver_verdict(12040, 13000, -1, NULL, small, 8) == -ENODEV);
    CHECK(strlen(small) == 7 && small[8] == 'x');
    return check_result();
#else
    fprintf(stderr, "skip: this build has no CUDA backend, which the driver verdict belongs to\n");
    return 77;
#endif
}
