/*
 * fake_nvml.c - a stand-in for libnvidia-ml.so.1 with known readings, loaded
 * by test_nvml through rt_nvml_*_from(). It exports the NVML functions
 * common/nvml.c uses, with NVML's ABI (see the declarations there), and two
 * of its own for the test to look at.
 *
 * Two GPUs:
 *   index 0, PCI 0000:3B:00.0: 3 GiB of 80 GiB used
 *   index 1, PCI 0000:86:00.0: 5 GiB of 80 GiB used
 * both with utilisation gpu = n % 100 and memory = gpu / 2, where n counts
 * the calls of nvmlDeviceGetUtilizationRates in this process (1, 2, ...);
 * power 250500 mW; clocks graphics 1410, SM 1980, memory 2619 MHz.
 *
 * Faults, read from the environment at each call:
 *   FAKE_NVML_INIT_ERROR=<code>  nvmlInit_v2 returns <code> (9: driver not loaded)
 *   FAKE_NVML_NO_POWER=1         nvmlDeviceGetPowerUsage returns NOT_SUPPORTED (3)
 *   FAKE_NVML_NO_POWER=2         ... on every second call (the 2nd, 4th, ...)
 * Every device function returns UNINITIALIZED (1) while nvmlInit_v2 has not
 * succeeded more often than nvmlShutdown was called, as NVML does.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_SUCCESS 0
#define FAKE_UNINITIALIZED 1
#define FAKE_INVALID_ARGUMENT 2
#define FAKE_NOT_SUPPORTED 3
#define FAKE_NOT_FOUND 6

#define FAKE_GIB (1024ull * 1024ull * 1024ull)

struct nvmlDevice_st {
    unsigned index;
    unsigned domain, bus;
    unsigned long long used;
};

struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
};

struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
};

/* NVML's functions (their declarations in nvml.h, with the enums as int). */
int nvmlInit_v2(void);
int nvmlShutdown(void);
const char *nvmlErrorString(int result);
int nvmlSystemGetDriverVersion(char *version, unsigned int length);
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, struct nvmlDevice_st **device);
int nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, struct nvmlDevice_st **device);
int nvmlDeviceGetUtilizationRates(struct nvmlDevice_st *device, struct nvmlUtilization_st *utilization);
int nvmlDeviceGetMemoryInfo(struct nvmlDevice_st *device, struct nvmlMemory_st *memory);
int nvmlDeviceGetPowerUsage(struct nvmlDevice_st *device, unsigned int *power);
int nvmlDeviceGetClockInfo(struct nvmlDevice_st *device, int type, unsigned int *clock);

/* The fake's own, for the test. */
int fake_nvml_inits(void);
unsigned fake_nvml_util_calls(void);

static struct nvmlDevice_st devices[2] = {
    {.index = 0, .domain = 0, .bus = 0x3b, .used = 3 * FAKE_GIB},
    {.index = 1, .domain = 0, .bus = 0x86, .used = 5 * FAKE_GIB},
};

static atomic_int inits;
static atomic_uint util_calls;
static atomic_uint power_calls;

static int env_int(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : 0;
}

static int check_device(const struct nvmlDevice_st *d)
{
    if (atomic_load(&inits) <= 0)
        return FAKE_UNINITIALIZED;
    if (d != &devices[0] && d != &devices[1])
        return FAKE_INVALID_ARGUMENT;
    return FAKE_SUCCESS;
}

int nvmlInit_v2(void)
{
    int e = env_int("FAKE_NVML_INIT_ERROR");
    if (e)
        return e;
    atomic_fetch_add(&inits, 1);
    return FAKE_SUCCESS;
}

int nvmlShutdown(void)
{
    if (atomic_load(&inits) <= 0)
        return FAKE_UNINITIALIZED;
    atomic_fetch_sub(&inits, 1);
    return FAKE_SUCCESS;
}

const char *nvmlErrorString(int result)
{
    switch (result) {
    case 0:
        return "Success";
    case 1:
        return "Uninitialized";
    case 2:
        return "Invalid Argument";
    case 3:
        return "Not Supported";
    case 6:
        return "Not Found";
    case 9:
        return "Driver Not Loaded";
    default:
        return "Unknown Error";
    }
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (atomic_load(&inits) <= 0)
        return FAKE_UNINITIALIZED;
    if (!version || length < 16)
        return FAKE_INVALID_ARGUMENT;
    snprintf(version, length, "999.99.99-fake");
    return FAKE_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, struct nvmlDevice_st **device)
{
    if (atomic_load(&inits) <= 0)
        return FAKE_UNINITIALIZED;
    if (!device || index >= 2)
        return FAKE_INVALID_ARGUMENT;
    *device = &devices[index];
    return FAKE_SUCCESS;
}

/* The formats NVML documents: %x:%x:%x.%x, %x:%x:%x and %x:%x.%x. */
int nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, struct nvmlDevice_st **device)
{
    if (atomic_load(&inits) <= 0)
        return FAKE_UNINITIALIZED;
    if (!pciBusId || !device)
        return FAKE_INVALID_ARGUMENT;
    unsigned dom = 0, bus = 0, dev = 0, fn = 0;
    if (sscanf(pciBusId, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4 &&
        sscanf(pciBusId, "%x:%x:%x", &dom, &bus, &dev) != 3) {
        dom = 0;
        if (sscanf(pciBusId, "%x:%x.%x", &bus, &dev, &fn) != 3)
            return FAKE_INVALID_ARGUMENT;
    }
    for (int i = 0; i < 2; i++) {
        if (devices[i].domain == dom && devices[i].bus == bus && dev == 0 && fn == 0) {
            *device = &devices[i];
            return FAKE_SUCCESS;
        }
    }
    return FAKE_NOT_FOUND;
}

int nvmlDeviceGetUtilizationRates(struct nvmlDevice_st *device, struct nvmlUtilization_st *utilization)
{
    int rc = check_device(device);
    if (rc)
        return rc;
    unsigned n = atomic_fetch_add(&util_calls, 1) + 1;
    utilization->gpu = n % 100;
    utilization->memory = utilization->gpu / 2;
    return FAKE_SUCCESS;
}

int nvmlDeviceGetMemoryInfo(struct nvmlDevice_st *device, struct nvmlMemory_st *memory)
{
    int rc = check_device(device);
    if (rc)
        return rc;
    memory->total = 80 * FAKE_GIB;
    memory->used = device->used;
    memory->free = memory->total - memory->used;
    return FAKE_SUCCESS;
}

int nvmlDeviceGetPowerUsage(struct nvmlDevice_st *device, unsigned int *power)
{
    int rc = check_device(device);
    if (rc)
        return rc;
    const int no_power = env_int("FAKE_NVML_NO_POWER");
    const unsigned n = atomic_fetch_add(&power_calls, 1) + 1;
    if (no_power == 1 || (no_power == 2 && n % 2 == 0))
        return FAKE_NOT_SUPPORTED;
    *power = 250500;
    return FAKE_SUCCESS;
}

int nvmlDeviceGetClockInfo(struct nvmlDevice_st *device, int type, unsigned int *clock)
{
    int rc = check_device(device);
    if (rc)
        return rc;
    static const unsigned mhz[3] = {1410, 1980, 2619}; /* graphics, SM, memory */
    if (type < 0 || type > 2)
        return FAKE_INVALID_ARGUMENT;
    *clock = mhz[type];
    return FAKE_SUCCESS;
}

int fake_nvml_inits(void)
{
    return atomic_load(&inits);
}

unsigned fake_nvml_util_calls(void)
{
    return atomic_load(&util_calls);
}
