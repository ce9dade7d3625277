/* A stand-in libnvidia-ml.so.1 for tests/daemon/test_nvml.py: the NVML entry points the
 * daemon's GPU detection calls through the real binding (nvidia-ml-py's pynvml, which loads
 * this library by name with dlopen), with the C signatures of nvml.h. What it reports comes
 * from the environment, read at nvmlInitWithFlags:
 *
 *   KERNELD_NVML_STUB_INIT     an NVML return code for nvmlInitWithFlags (9: driver not loaded)
 *   KERNELD_NVML_STUB_DRIVER   the driver version ("570.86.15")
 *   KERNELD_NVML_STUB_CUDA     the CUDA driver version as NVML encodes it (12080 = 12.8)
 *   KERNELD_NVML_STUB_GPUS     "name,major,minor,busid;..." (at most 8 devices; empty: none)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define MAX_GPUS 8

typedef struct {
    char name[96];
    int major, minor;
    char bus[32];
} stub_gpu;

/* nvml.h's nvmlPciInfo_t (v3). */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

static stub_gpu gpus[MAX_GPUS];
static unsigned int gpu_count;
static int initialised;

static const char *env_or(const char *name, const char *fallback) {
    const char *value = getenv(name);
    return value ? value : fallback;
}

static void parse_gpus(const char *spec) {
    char buffer[1024];
    char *saveptr = NULL;
    gpu_count = 0;
    snprintf(buffer, sizeof buffer, "%s", spec);
    for (char *item = strtok_r(buffer, ";", &saveptr); item && gpu_count < MAX_GPUS;
         item = strtok_r(NULL, ";", &saveptr)) {
        stub_gpu *gpu = &gpus[gpu_count];
        char *fields = NULL;
        char *name = strtok_r(item, ",", &fields);
        char *major = strtok_r(NULL, ",", &fields);
        char *minor = strtok_r(NULL, ",", &fields);
        char *bus = strtok_r(NULL, ",", &fields);
        if (!name || !major || !minor || !bus) continue;
        snprintf(gpu->name, sizeof gpu->name, "%s", name);
        gpu->major = atoi(major);
        gpu->minor = atoi(minor);
        snprintf(gpu->bus, sizeof gpu->bus, "%s", bus);
        gpu_count++;
    }
}

int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    int code = atoi(env_or("KERNELD_NVML_STUB_INIT", "0"));
    if (code != NVML_SUCCESS) return code;
    parse_gpus(env_or("KERNELD_NVML_STUB_GPUS", ""));
    initialised = 1;
    return NVML_SUCCESS;
}

int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

int nvmlShutdown(void) {
    initialised = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case 9: return "Driver Not Loaded";
    case 1: return "Uninitialized";
    default: return "Unknown Error";
    }
}

static int copy_out(char *out, unsigned int length, const char *value) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return NVML_SUCCESS;
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return copy_out(version, length, env_or("KERNELD_NVML_STUB_DRIVER", "570.86.15"));
}

int nvmlSystemGetCudaDriverVersion(int *cuda) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *cuda = atoi(env_or("KERNELD_NVML_STUB_CUDA", "12080"));
    return NVML_SUCCESS;
}

int nvmlSystemGetCudaDriverVersion_v2(int *cuda) { return nvmlSystemGetCudaDriverVersion(cuda); }

int nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *count = gpu_count;
    return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, stub_gpu **device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (index >= gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

int nvmlDeviceGetName(stub_gpu *device, char *name, unsigned int length) {
    return copy_out(name, length, device->name);
}

int nvmlDeviceGetCudaComputeCapability(stub_gpu *device, int *major, int *minor) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *major = device->major;
    *minor = device->minor;
    return NVML_SUCCESS;
}

int nvmlDeviceGetPciInfo_v3(stub_gpu *device, nvmlPciInfo_t *info) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    memset(info, 0, sizeof *info);
    snprintf(info->busId, sizeof info->busId, "%s", device->bus);
    snprintf(info->busIdLegacy, sizeof info->busIdLegacy, "%s", device->bus);
    return NVML_SUCCESS;
}
