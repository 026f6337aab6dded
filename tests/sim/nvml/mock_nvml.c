/*
 * gpufleet's mock NVML: libnvidia-ml.so.1 for simulated GPU nodes (a test fixture).
 *
 * NVIDIA's own programs (Debian's nvidia-smi, the container toolkit) load this
 * library instead of the real one on a simulated node, so what they print comes
 * from their own code and only the GPUs underneath are simulated. The node's
 * simulation kit (tests/sim/kit, "gpusim") writes what the hardware and the kernel
 * module would tell the real library, under GPUSIM_RUN (default /run/gpusim):
 *
 *   nvml/gpus             one GPU per line, TAB-separated key=value fields
 *   nvml/library-version  the driver version of the installed libnvidia-ml1
 *   sys/module/nvidia/    present while the simulated nvidia module is loaded;
 *                         its "version" file holds the loaded module's version
 *   nvml/driver           cuda=<NVML's CUDA version number> of the loaded module
 *   persistence-mode      present while persistence mode is on
 *   nvml/mig-profiles     the MIG GPU instance profiles each MIG-capable GPU offers
 *   nvml/mig-instances    GPU and compute instances (gone at a reboot, like on a GPU)
 *   nvml/health           faults injected into the GPUs' health readings (health.c)
 *
 * and in GPUSIM_STATE (default /var/lib/gpusim), which a reboot keeps:
 *
 *   mig-mode              per GPU UUID its current and pending MIG mode (the board keeps
 *                         its MIG mode across reboots; a pending one applies at reset)
 *
 * and the device files of the loaded module are in GPUSIM_DEV (default /dev). Inside a
 * container, which has the device files but none of these, the same files come from
 * the simulated persistence daemon (remote.c).
 *
 * Types and constants come from NVIDIA's nvml.h as published in the go-nvml
 * module (tests/sim/nvml/go.mod pins it); the code is ours. Entry points this file
 * does not implement are generated as "not supported" stubs from that header by
 * tests/sim/nvml/build.sh, as real NVML answers for features a board lacks.
 *
 * Set GPUSIM_NVML_TRACE=1 to log every call of the internal export table to stderr.
 */
#include "mock_nvml.h"

#include <strings.h>

struct node_st node = {.ctl_fd = -1};

const char *run_dir(void)
{
    const char *dir = getenv("GPUSIM_RUN");
    return dir && *dir ? dir : "/run/gpusim";
}

const char *dev_dir(void)
{
    const char *dir = getenv("GPUSIM_DEV");
    return dir && *dir ? dir : "/dev";
}

int run_path(char *out, size_t size, const char *name)
{
    int n = snprintf(out, size, "%s/%s", run_dir(), name);
    return n > 0 && (size_t)n < size;
}

FILE *open_run(const char *name)
{
    char path[PATH_MAX];
    if (remote_active())
        return remote_open(name);
    return run_path(path, sizeof path, name) ? fopen(path, "re") : NULL;
}

/* First line of a file under the run dir, without its newline; 0 if unreadable. */
int read_line(const char *name, char *out, size_t size)
{
    FILE *file = open_run(name);
    if (!file)
        return 0;
    if (!fgets(out, (int)size, file)) {
        fclose(file);
        return 0;
    }
    fclose(file);
    out[strcspn(out, "\n")] = '\0';
    return 1;
}

int exists(const char *name)
{
    char path[PATH_MAX];
    struct stat st;
    if (remote_active())
        return remote_exists(name);
    return run_path(path, sizeof path, name) && stat(path, &st) == 0;
}

void copy(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src);
}

static void parse_gpu(char *line, struct nvmlDevice_st *gpu)
{
    char *save = NULL;
    memset(gpu, 0, sizeof *gpu);
    gpu->fd = -1;
    for (char *field = strtok_r(line, "\t\n", &save); field; field = strtok_r(NULL, "\t\n", &save)) {
        char *value = strchr(field, '=');
        if (!value)
            continue;
        *value++ = '\0';
        if (!strcmp(field, "index"))
            gpu->index = (unsigned int)strtoul(value, NULL, 10);
        else if (!strcmp(field, "name"))
            copy(gpu->name, sizeof gpu->name, value);
        else if (!strcmp(field, "uuid"))
            copy(gpu->uuid, sizeof gpu->uuid, value);
        else if (!strcmp(field, "serial"))
            copy(gpu->serial, sizeof gpu->serial, value);
        else if (!strcmp(field, "vbios"))
            copy(gpu->vbios, sizeof gpu->vbios, value);
        else if (!strcmp(field, "architecture"))
            copy(gpu->arch, sizeof gpu->arch, value);
        else if (!strcmp(field, "bus"))
            gpu->bus = (unsigned int)strtoul(value, NULL, 16);
        else if (!strcmp(field, "device_id"))
            gpu->device_id = (unsigned int)strtoul(value, NULL, 16);
        else if (!strcmp(field, "subsystem_id"))
            gpu->subsystem_id = (unsigned int)strtoul(value, NULL, 16);
        else if (!strcmp(field, "pci_class"))
            gpu->pci_class = (unsigned int)strtoul(value, NULL, 16);
        else if (!strcmp(field, "memory_mib"))
            gpu->memory_mib = strtoull(value, NULL, 10);
        else if (!strcmp(field, "compute_cap"))
            sscanf(value, "%d.%d", &gpu->cc_major, &gpu->cc_minor);
        else if (!strcmp(field, "mig_capable"))
            gpu->mig_capable = atoi(value);
        else if (!strcmp(field, "power_limit_w"))
            gpu->power_w = (unsigned int)strtoul(value, NULL, 10);
        else if (!strcmp(field, "numa_node"))
            gpu->numa_node = atoi(value);
        else if (!strcmp(field, "local_cpus"))
            copy(gpu->local_cpus, sizeof gpu->local_cpus, value);
    }
}

static void close_handles(void)
{
    for (unsigned int i = 0; i < node.count; i++) {
        if (node.gpus[i].fd >= 0)
            close(node.gpus[i].fd);
        node.gpus[i].fd = -1;
    }
    if (node.ctl_fd >= 0)
        close(node.ctl_fd);
    node.ctl_fd = -1;
}

/* What the real library does at init: ask the loaded kernel module, check it is
 * the library's own version, and open the control and GPU device files. */
static nvmlReturn_t load_node(void)
{
    char library_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = "";
    char line[1024];
    char path[PATH_MAX];
    FILE *file;
    struct stat st;

    /* No simulated module files here: a container on a simulated node. */
    if (stat(run_dir(), &st) == 0)
        remote_drop();
    else if (!remote_load())
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (!exists("sys/module/nvidia") ||
        !read_line("sys/module/nvidia/version", node.driver_version, sizeof node.driver_version))
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (read_line("nvml/library-version", library_version, sizeof library_version) &&
        strcmp(library_version, node.driver_version) != 0)
        return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    node.cuda_version = 0;
    if (read_line("nvml/driver", line, sizeof line))
        sscanf(line, "cuda=%d", &node.cuda_version);

    snprintf(path, sizeof path, "%s/nvidiactl", dev_dir());
    node.ctl_fd = open(path, O_RDWR | O_CLOEXEC);
    if (node.ctl_fd < 0)
        return errno == EACCES ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_DRIVER_NOT_LOADED;

    node.count = 0;
    if ((file = open_run("nvml/gpus"))) {
        while (node.count < MAX_GPUS && fgets(line, sizeof line, file)) {
            if (line[0] == '\n' || line[0] == '#')
                continue;
            parse_gpu(line, &node.gpus[node.count]);
            node.count++;
        }
        fclose(file);
    }
    health_load();
    for (unsigned int i = 0; i < node.count; i++) {
        if (node.gpus[i].health.lost)
            continue; /* nothing answers behind its device file */
        snprintf(path, sizeof path, "%s/nvidia%u", dev_dir(), node.gpus[i].index);
        node.gpus[i].fd = open(path, O_RDWR | O_CLOEXEC);
        if (node.gpus[i].fd < 0) {
            close_handles();
            return errno == EACCES ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_GPU_IS_LOST;
        }
    }
    mig_load();
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    if (node.initialised == 0) {
        nvmlReturn_t rc = load_node();
        if (rc != NVML_SUCCESS) {
            close_handles();
            return rc;
        }
    }
    node.initialised++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    if (node.initialised == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (--node.initialised == 0)
        close_handles();
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    default: return "Unknown Error";
    }
}

/* The simulated GPU behind a handle, or NULL for a handle that is none of ours. */
struct nvmlDevice_st *gpu_of(nvmlDevice_t device)
{
    struct nvmlDevice_st *gpu = device.handle;
    return node.count > 0 && gpu >= node.gpus && gpu < node.gpus + node.count ? gpu : NULL;
}

nvmlReturn_t put_string(char *out, unsigned int length, const char *value)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* --- system -------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    REQUIRE_INIT();
    return put_string(version, length, node.driver_version);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    char text[128];
    /* NVML's own version: the CUDA major version, then the driver version. */
    snprintf(text, sizeof text, "%d.%s", node.cuda_version / 1000, node.driver_version);
    return put_string(version, length, text);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    REQUIRE_INIT();
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = node.cuda_version;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version)
{
    return nvmlSystemGetCudaDriverVersion(version);
}

EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    char path[64], text[256] = "";
    FILE *file;
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    if (!(file = fopen(path, "re")))
        return NVML_ERROR_NOT_FOUND;
    if (fgets(text, sizeof text, file))
        text[strcspn(text, "\n")] = '\0';
    fclose(file);
    return put_string(name, length, text);
}

/* --- device handles ------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    REQUIRE_INIT();
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = node.count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    REQUIRE_INIT();
    if (!device || index >= node.count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (node.gpus[index].health.lost)
        return NVML_ERROR_GPU_IS_LOST;
    device->handle = &node.gpus[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* The handle of the GPU whose identity field (at `offset` in the struct) is `value`. */
static nvmlReturn_t handle_by(size_t offset, const char *value, nvmlDevice_t *device)
{
    REQUIRE_INIT();
    if (!value || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < node.count; i++)
        if (!strcmp((const char *)&node.gpus[i] + offset, value)) {
            if (node.gpus[i].health.lost)
                return NVML_ERROR_GPU_IS_LOST;
            device->handle = &node.gpus[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (uuid && !strncmp(uuid, "MIG-", 4))
        return mig_handle_by_uuid(uuid, device);
    return handle_by(offsetof(struct nvmlDevice_st, uuid), uuid, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device)
{
    return handle_by(offsetof(struct nvmlDevice_st, serial), serial, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device)
{
    unsigned int domain = 0, bus = 0, slot = 0, function = 0;
    REQUIRE_INIT();
    if (!bus_id || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* domain:bus:device.function, the domain optional and of any width */
    if (sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &slot, &function) != 4) {
        domain = 0;
        if (sscanf(bus_id, "%x:%x.%x", &bus, &slot, &function) != 3)
            return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (unsigned int i = 0; i < node.count; i++)
        if (domain == 0 && node.gpus[i].bus == bus && slot == 0 && function == 0) {
            if (node.gpus[i].health.lost)
                return NVML_ERROR_GPU_IS_LOST;
            device->handle = &node.gpus[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    if (is_mig_device(device))
        return mig_device_index(device, index);
    REQUIRE_DEVICE(device);
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = gpu->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor)
{
    REQUIRE_DEVICE(device);
    if (!minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minor = gpu->index;
    return NVML_SUCCESS;
}

/* --- identity --------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    if (is_mig_device(device))
        return mig_device_name(device, name, length);
    REQUIRE_DEVICE(device);
    return put_string(name, length, gpu->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    if (is_mig_device(device))
        return mig_device_uuid(device, uuid, length);
    REQUIRE_DEVICE(device);
    return put_string(uuid, length, gpu->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    REQUIRE_DEVICE(device);
    return put_string(serial, length, gpu->serial);
}

EXPORT nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version, unsigned int length)
{
    REQUIRE_DEVICE(device);
    return put_string(version, length, gpu->vbios);
}

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *brand)
{
    REQUIRE_DEVICE(device);
    if (!brand)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* Data-centre boards report the "NVIDIA" brand; the T4 still the Tesla one. */
    *brand = strncmp(gpu->name, "Tesla", 5) == 0 ? NVML_BRAND_TESLA : NVML_BRAND_NVIDIA;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    static const struct {
        const char *name;
        nvmlDeviceArchitecture_t value;
    } known[] = {
        {"Kepler", NVML_DEVICE_ARCH_KEPLER}, {"Maxwell", NVML_DEVICE_ARCH_MAXWELL},
        {"Pascal", NVML_DEVICE_ARCH_PASCAL}, {"Volta", NVML_DEVICE_ARCH_VOLTA},
        {"Turing", NVML_DEVICE_ARCH_TURING}, {"Ampere", NVML_DEVICE_ARCH_AMPERE},
        {"Ada", NVML_DEVICE_ARCH_ADA},       {"Hopper", NVML_DEVICE_ARCH_HOPPER},
    };
    REQUIRE_DEVICE(device);
    if (!arch)
        return NVML_ERROR_INVALID_ARGUMENT;
    *arch = NVML_DEVICE_ARCH_UNKNOWN;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcasecmp(gpu->arch, known[i].name))
            *arch = known[i].value;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    REQUIRE_DEVICE(device);
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = gpu->cc_major;
    *minor = gpu->cc_minor;
    return NVML_SUCCESS;
}

static void fill_pci(const struct nvmlDevice_st *gpu, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof *pci);
    pci->domain = 0;
    pci->bus = gpu->bus;
    pci->device = 0;
    pci->pciDeviceId = (gpu->device_id << 16) | 0x10de;
    pci->pciSubSystemId = (gpu->subsystem_id << 16) | 0x10de;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, 0u,
             gpu->bus, 0u);
    snprintf(pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_FMT, 0u, gpu->bus, 0u);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    REQUIRE_DEVICE(device);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(gpu, pci);
    return NVML_SUCCESS;
}

/* The versioned form NVML added in the 550 driver, which that driver's nvidia-smi
 * reads the PCI address from. */
EXPORT nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci)
{
    REQUIRE_DEVICE(device);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (pci->version != nvmlPciInfoExt_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlPciInfo_t legacy;
    fill_pci(gpu, &legacy);
    memset(pci, 0, sizeof *pci);
    pci->version = nvmlPciInfoExt_v1;
    pci->domain = legacy.domain;
    pci->bus = legacy.bus;
    pci->device = legacy.device;
    pci->pciDeviceId = legacy.pciDeviceId;
    pci->pciSubSystemId = legacy.pciSubSystemId;
    pci->baseClass = gpu->pci_class >> 16;
    pci->subClass = (gpu->pci_class >> 8) & 0xff;
    copy(pci->busId, sizeof pci->busId, legacy.busId);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

/* Set the bits of a cpulist ("0-3,8") in `set` (`words` unsigned longs). */
static nvmlReturn_t cpulist_bits(const char *list, unsigned int words, unsigned long *set)
{
    const unsigned int per_word = 8 * sizeof(unsigned long);
    memset(set, 0, words * sizeof *set);
    for (const char *p = list; *p;) {
        char *end;
        unsigned long first = strtoul(p, &end, 10), last = first;
        if (end == p)
            return NVML_ERROR_UNKNOWN;
        if (*end == '-')
            last = strtoul(end + 1, &end, 10);
        for (unsigned long cpu = first; cpu <= last && cpu < (unsigned long)words * per_word; cpu++)
            set[cpu / per_word] |= 1UL << (cpu % per_word);
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return NVML_ERROR_UNKNOWN;
    }
    return NVML_SUCCESS;
}

/* The CPUs near the GPU (its NUMA node's), which Slurm's NVML plugin reads as the
 * GPU's Cores= and fails without. */
EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device, unsigned int cpuSetSize,
                                                        unsigned long *cpuSet, nvmlAffinityScope_t scope)
{
    REQUIRE_DEVICE(device);
    if (!cpuSet || !cpuSetSize || (scope != NVML_AFFINITY_SCOPE_NODE && scope != NVML_AFFINITY_SCOPE_SOCKET))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpu->local_cpus[0])
        return NVML_ERROR_NOT_SUPPORTED;
    return cpulist_bits(gpu->local_cpus, cpuSetSize, cpuSet);
}

EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize,
                                             unsigned long *cpuSet)
{
    return nvmlDeviceGetCpuAffinityWithinScope(device, cpuSetSize, cpuSet, NVML_AFFINITY_SCOPE_NODE);
}

EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *numa)
{
    REQUIRE_DEVICE(device);
    if (!numa)
        return NVML_ERROR_INVALID_ARGUMENT;
    *numa = (unsigned int)gpu->numa_node;
    return NVML_SUCCESS;
}

/* --- memory, power, sensors: an idle board ------------------------------------------ */

/* Memory the driver keeps for itself outside MIG mode (as the stand-in reported). */
static unsigned long long reserved_mib(const struct nvmlDevice_st *gpu)
{
    if (mig_enabled(gpu))
        return 0;
    return gpu->memory_mib / 64 < 1024 ? gpu->memory_mib / 64 : 1024;
}

/* Total and reserved MiB of a GPU or of a MIG device (whose memory is its GPU instance's). */
static nvmlReturn_t memory_of(nvmlDevice_t device, unsigned long long *total, unsigned long long *reserved)
{
    if (is_mig_device(device)) {
        *reserved = 0;
        return mig_device_memory(device, total);
    }
    REQUIRE_DEVICE(device);
    *total = gpu->memory_mib;
    *reserved = reserved_mib(gpu);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    unsigned long long total_mib, reserved;
    nvmlReturn_t rc;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if ((rc = memory_of(device, &total_mib, &reserved)) != NVML_SUCCESS)
        return rc;
    memory->total = total_mib << 20;
    memory->reserved = reserved << 20;
    memory->used = 0;
    memory->free = memory->total - memory->reserved;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    unsigned long long total_mib, reserved;
    nvmlReturn_t rc;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = memory_of(device, &total_mib, &reserved)) != NVML_SUCCESS)
        return rc;
    memory->total = total_mib << 20;
    memory->used = reserved << 20;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    REQUIRE_DEVICE(device);
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

static nvmlReturn_t power_limit(nvmlDevice_t device, unsigned int *milliwatts)
{
    REQUIRE_DEVICE(device);
    if (!milliwatts)
        return NVML_ERROR_INVALID_ARGUMENT;
    *milliwatts = gpu->power_w * 1000;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    return power_limit(device, limit);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *limit)
{
    return power_limit(device, limit);
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    return power_limit(device, limit);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device,
                                                                 unsigned int *min_limit,
                                                                 unsigned int *max_limit)
{
    REQUIRE_DEVICE(device);
    if (!min_limit || !max_limit)
        return NVML_ERROR_INVALID_ARGUMENT;
    *min_limit = gpu->power_w * 1000 / 2;
    *max_limit = gpu->power_w * 1000;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *milliwatts)
{
    REQUIRE_DEVICE(device);
    if (!milliwatts)
        return NVML_ERROR_INVALID_ARGUMENT;
    *milliwatts = gpu->power_w * 90; /* idle: 9 % of the limit */
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor,
                                             unsigned int *temperature)
{
    REQUIRE_DEVICE(device);
    if (!temperature || sensor != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temperature = 30 + gpu->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    REQUIRE_DEVICE(device);
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* nvml.h: utilization rates cannot be queried on a GPU in MIG mode. */
    if (mig_enabled(gpu))
        return NVML_ERROR_NOT_SUPPORTED;
    utilization->gpu = 0;
    utilization->memory = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *state)
{
    REQUIRE_DEVICE(device);
    if (!state)
        return NVML_ERROR_INVALID_ARGUMENT;
    *state = NVML_PSTATE_0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
    REQUIRE_DEVICE(device);
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = NVML_COMPUTEMODE_DEFAULT;
    return NVML_SUCCESS;
}

static nvmlReturn_t disabled(nvmlDevice_t device, nvmlEnableState_t *state)
{
    REQUIRE_DEVICE(device);
    if (!state)
        return NVML_ERROR_INVALID_ARGUMENT;
    *state = NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    return disabled(device, mode);
}

EXPORT nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, nvmlEnableState_t *active)
{
    return disabled(device, active);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                            nvmlProcessInfo_t *infos)
{
    (void)infos;
    REQUIRE_DEVICE(device);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                             nvmlProcessInfo_t *infos)
{
    return nvmlDeviceGetComputeRunningProcesses_v3(device, count, infos);
}

/* --- events: a healthy board raises none ------------------------------------------------ */

struct nvmlEventSet_st {
    int unused;
};

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    REQUIRE_INIT();
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    set->handle = calloc(1, sizeof(struct nvmlEventSet_st));
    return set->handle ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    free(set.handle);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                             nvmlEventSet_t set)
{
    (void)types;
    REQUIRE_DEVICE(device);
    return set.handle ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types)
{
    REQUIRE_DEVICE(device);
    if (!types)
        return NVML_ERROR_INVALID_ARGUMENT;
    *types = nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms)
{
    (void)data;
    if (!set.handle)
        return NVML_ERROR_INVALID_ARGUMENT;
    usleep(timeout_ms * 1000u);
    return NVML_ERROR_TIMEOUT;
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms)
{
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}

/* --- persistence mode ------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    REQUIRE_DEVICE(device);
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = exists("persistence-mode") ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceSetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t mode)
{
    char path[PATH_MAX];
    REQUIRE_DEVICE(device);
    if (geteuid() != 0 || remote_active())
        return NVML_ERROR_NO_PERMISSION;
    if (!run_path(path, sizeof path, "persistence-mode"))
        return NVML_ERROR_UNKNOWN;
    if (mode == NVML_FEATURE_ENABLED) {
        int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return NVML_ERROR_UNKNOWN;
        close(fd);
    } else if (unlink(path) != 0 && errno != ENOENT) {
        return NVML_ERROR_UNKNOWN;
    }
    return NVML_SUCCESS;
}

/* --- the internal export table ----------------------------------------------------------- */

/*
 * nvidia-smi asks the library for a private table of entry points
 * (nvmlInternalGetExportTable) and refuses to run without one ("Mismatch in versions
 * between nvidia-smi and NVML"). The table's first word is its size; every other
 * slot is a function. The mock gives every slot its own small function, so a
 * trace names the slot nvidia-smi used, and answers "nothing to report" there.
 */
#define SLOTS 256
static uintptr_t export_table[SLOTS];

static int tracing(void)
{
    const char *value = getenv("GPUSIM_NVML_TRACE");
    return value && *value && strcmp(value, "0") != 0;
}

static int is_device(void *handle)
{
    return gpu_of((nvmlDevice_t){handle}) != NULL || is_mig_device((nvmlDevice_t){handle});
}

/* Slots whose meaning is known (seen from nvidia-smi 535 with the trace on). */
enum {
    SLOT_PRIMARY = 20,         /* (device, unsigned int *out): whether it drives the console */
    SLOT_LOG = 26,             /* (printf format, arguments...): nvidia-smi's own log line */
    SLOT_HANDLE_BY_INDEX = 81, /* (index, nvmlDevice_t *out, 0x22) */
    /* A GPU reset, in the order nvidia-smi --gpu-reset calls them: the fabric's state
     * (refused: "fabric state could not be determined"), a group of the devices to
     * reset made from a list (group *out, nvmlDevice_t *devices, count, ...), read back
     * and let go (group, ...), then the reset of a list (count, nvmlDevice_t *devices,
     * ...). Only the last one's answer decides "was successfully reset". */
    SLOT_FABRIC_STATE = 169,
    SLOT_RESET_GROUP = 182,
    SLOT_RESET_GROUP_READ = 183,
    SLOT_RESET_GROUP_DONE = 184,
    SLOT_RESET = 168,
    /* Called one after the other for each MIG device as (MIG device, unsigned int *count,
     * buffer, ...): by their shape, its lists of processes. Answered with none. */
    SLOT_MIG_PROCESSES_A = 213,
    SLOT_MIG_PROCESSES_B = 214,
    SLOT_MIG_PROCESSES_C = 215,
};

/* Each device of the list reset in turn; the first refusal is the answer. */
static nvmlReturn_t reset_devices(unsigned int count, void *list)
{
    nvmlDevice_t *devices = list;
    if (!devices || count == 0 || count > MAX_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < count; i++) {
        struct nvmlDevice_st *gpu = gpu_of(devices[i]);
        nvmlReturn_t rc = gpu ? gpu_reset(gpu) : NVML_ERROR_INVALID_ARGUMENT;
        if (rc != NVML_SUCCESS)
            return rc;
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t slot_call(unsigned int slot, void *a0, void *a1, void *a2, void *a3)
{
    if (tracing())
        fprintf(stderr, "gpusim-nvml: export slot %u (%p, %p, %p, %p)%s\n", slot, a0, a1, a2, a3,
                is_device(a0) ? " device" : "");
    switch (slot) {
    case SLOT_LOG:
    case SLOT_FABRIC_STATE:
    case SLOT_RESET_GROUP_READ:
    case SLOT_RESET_GROUP_DONE:
        return NVML_SUCCESS;
    case SLOT_PRIMARY:
        if (!gpu_of((nvmlDevice_t){a0}) || !a1)
            return NVML_ERROR_INVALID_ARGUMENT;
        *(unsigned int *)a1 = 0; /* a compute board: no console on it */
        return NVML_SUCCESS;
    case SLOT_RESET_GROUP:
        if (!a0)
            return NVML_ERROR_INVALID_ARGUMENT;
        *(void **)a0 = export_table; /* any address but NULL: nvidia-smi only hands it back */
        return NVML_SUCCESS;
    case SLOT_RESET:
        return reset_devices((unsigned int)(uintptr_t)a0, a1);
    case SLOT_MIG_PROCESSES_A:
    case SLOT_MIG_PROCESSES_B:
    case SLOT_MIG_PROCESSES_C:
        if (!is_mig_device((nvmlDevice_t){a0}) || !a1)
            return NVML_ERROR_NOT_SUPPORTED;
        *(unsigned int *)a1 = 0; /* no processes */
        return NVML_SUCCESS;
    case SLOT_HANDLE_BY_INDEX:
        return nvmlDeviceGetHandleByIndex_v2((unsigned int)(uintptr_t)a0, a1);
    default:
        return NVML_ERROR_NOT_SUPPORTED;
    }
}

#define SLOT(n)                                                                               \
    static nvmlReturn_t slot_##n(void *a0, void *a1, void *a2, void *a3)                      \
    {                                                                                         \
        return slot_call(n, a0, a1, a2, a3);                                                  \
    }
#define SLOT8(n) SLOT(n##0) SLOT(n##1) SLOT(n##2) SLOT(n##3) SLOT(n##4) SLOT(n##5) SLOT(n##6) SLOT(n##7)
#define REF8(n) slot_##n##0, slot_##n##1, slot_##n##2, slot_##n##3, slot_##n##4, slot_##n##5, slot_##n##6, slot_##n##7,
/* Slot numbers in octal digits keep the macros short: slot_0137 is slot 95. */
SLOT8(00) SLOT8(01) SLOT8(02) SLOT8(03) SLOT8(04) SLOT8(05) SLOT8(06) SLOT8(07)
SLOT8(010) SLOT8(011) SLOT8(012) SLOT8(013) SLOT8(014) SLOT8(015) SLOT8(016) SLOT8(017)
SLOT8(020) SLOT8(021) SLOT8(022) SLOT8(023) SLOT8(024) SLOT8(025) SLOT8(026) SLOT8(027)
SLOT8(030) SLOT8(031) SLOT8(032) SLOT8(033) SLOT8(034) SLOT8(035) SLOT8(036) SLOT8(037)

typedef nvmlReturn_t (*slot_fn)(void *, void *, void *, void *);
static const slot_fn slot_functions[SLOTS] = {
    REF8(00) REF8(01) REF8(02) REF8(03) REF8(04) REF8(05) REF8(06) REF8(07)
    REF8(010) REF8(011) REF8(012) REF8(013) REF8(014) REF8(015) REF8(016) REF8(017)
    REF8(020) REF8(021) REF8(022) REF8(023) REF8(024) REF8(025) REF8(026) REF8(027)
    REF8(030) REF8(031) REF8(032) REF8(033) REF8(034) REF8(035) REF8(036) REF8(037)
};

EXPORT nvmlReturn_t nvmlInternalGetExportTable(const void **table, const unsigned char *guid)
{
    if (!table)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (tracing() && guid) {
        fprintf(stderr, "gpusim-nvml: export table for guid ");
        for (int i = 0; i < 16; i++)
            fprintf(stderr, "%02x", guid[i]);
        fprintf(stderr, "\n");
    }
    export_table[0] = sizeof export_table;
    for (unsigned int i = 1; i < SLOTS; i++)
        export_table[i] = (uintptr_t)slot_functions[i];
    *table = export_table;
    return NVML_SUCCESS;
}
