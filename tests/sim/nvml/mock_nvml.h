/*
 * Internals shared by the mock NVML's sources (mock_nvml.c: the node, its GPUs and
 * the entry points of a plain GPU; mig.c: MIG mode, instances and MIG devices).
 */
#ifndef GPUSIM_MOCK_NVML_H
#define GPUSIM_MOCK_NVML_H

#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include "nvml.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_GPUS 16

/* What a GPU's health readings say (health.c; healthy unless a fault was injected). */
struct health_st {
    unsigned long long ecc_dbe, ecc_dbe_aggregate, reasons;
    int retire_pending, remap_pending, remap_failure, lost;
    unsigned int remapped_unc, remapped_corr, pcie_gen, pcie_width;
};

struct nvmlDevice_st {
    unsigned int index;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char serial[NVML_DEVICE_SERIAL_BUFFER_SIZE];
    char vbios[NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE];
    char arch[32];
    unsigned int bus;
    unsigned int device_id;
    unsigned int subsystem_id;
    unsigned int pci_class; /* base class, sub class, programming interface: 0x030200 */
    unsigned long long memory_mib;
    int cc_major, cc_minor;
    int mig_capable;
    unsigned int power_w;
    int numa_node;
    char local_cpus[128]; /* the CPUs near the GPU, as a cpulist ("0-15,32") */
    int fd; /* the open /dev/nvidiaN, a GPU handle like the real library holds */
    struct health_st health;
};

struct node_st {
    int initialised; /* nvmlInit calls not yet matched by nvmlShutdown */
    unsigned int count;
    struct nvmlDevice_st gpus[MAX_GPUS];
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    int cuda_version;
    int ctl_fd;
};
extern struct node_st node;

/* Paths under GPUSIM_RUN (default /run/gpusim) and GPUSIM_DEV (default /dev). */
const char *run_dir(void);
const char *dev_dir(void);
int run_path(char *out, size_t size, const char *name);
int read_line(const char *name, char *out, size_t size);
int exists(const char *name);
/* A file under the run dir, opened for reading (from the snapshot in a container). */
FILE *open_run(const char *name);
void copy(char *dst, size_t size, const char *src);
nvmlReturn_t put_string(char *out, unsigned int length, const char *value);

/* The simulated GPU behind a handle, or NULL for a handle that is none of ours. */
struct nvmlDevice_st *gpu_of(nvmlDevice_t device);

#define REQUIRE_INIT()                                                                        \
    do {                                                                                      \
        if (node.initialised == 0)                                                            \
            return NVML_ERROR_UNINITIALIZED;                                                  \
    } while (0)

/* Declares `gpu` for a device entry point; answers like NVML for a bad handle. */
#define REQUIRE_DEVICE(device)                                                                \
    struct nvmlDevice_st *gpu = gpu_of(device);                                               \
    do {                                                                                      \
        REQUIRE_INIT();                                                                       \
        if (!gpu)                                                                             \
            return NVML_ERROR_INVALID_ARGUMENT;                                               \
    } while (0)


/* mig.c: called by mock_nvml.c at init, and for handles that may be MIG devices. */
void mig_load(void);
int is_mig_device(nvmlDevice_t device);
nvmlReturn_t mig_device_index(nvmlDevice_t device, unsigned int *index);
nvmlReturn_t mig_device_name(nvmlDevice_t device, char *name, unsigned int length);
nvmlReturn_t mig_device_uuid(nvmlDevice_t device, char *uuid, unsigned int length);
nvmlReturn_t mig_device_memory(nvmlDevice_t device, unsigned long long *total_mib);
nvmlReturn_t mig_handle_by_uuid(const char *uuid, nvmlDevice_t *device);
int mig_enabled(const struct nvmlDevice_st *gpu);
int gpu_held_by_others(const struct nvmlDevice_st *gpu);
nvmlReturn_t mig_at_reset(const struct nvmlDevice_st *gpu);

/* health.c: read at init, after the GPUs; and a GPU reset. */
void health_load(void);
nvmlReturn_t gpu_reset(struct nvmlDevice_st *gpu);

/* remote.c: the node's state inside a container, from the simulated persistence daemon. */
int remote_load(void);
void remote_drop(void);
int remote_active(void);
int remote_exists(const char *name);
FILE *remote_open(const char *name);

#endif
