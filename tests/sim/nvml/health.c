/*
 * The mock NVML's health readings: ECC counters, page retirement, row remapping, clock
 * event reasons, the PCIe link, and a GPU lost to the driver.
 *
 * A GPU is healthy unless the node's simulation kit injected a fault
 * (`gpusim fault`, tests/sim/kit/gpusim/faults.py), which it writes to nvml/health under
 * the run dir, one GPU a line, TAB-separated key=value fields:
 *
 *   index=N  ecc_dbe=N (volatile)  ecc_dbe_aggregate=N  retire_pending=0|1
 *   remap_pending=0|1  remap_failure=0|1  remapped_unc=N  remapped_corr=N
 *   reasons=0xN (clock event reason bits besides idle)  pcie_gen=N  pcie_width=N
 *   lost=0|1
 *
 * NVIDIA's programs read these through the entry points below, as they would read a
 * board's; what they print, and how, is theirs.
 *
 * A GPU reset (gpu_reset, asked through nvidia-smi's private entry points) clears what
 * a reset clears; what the board keeps is the kit's, so the kit does it
 * (`gpusim reset-gpu N`, GPUSIM_KIT naming the program, /opt/gpusim/bin/gpusim on a node).
 */
#include "mock_nvml.h"

#include <sys/wait.h>

/* The PCIe generation a GPU's architecture links at, as the boards do (x16 all). */
static unsigned int max_generation(const struct nvmlDevice_st *gpu)
{
    if (!strcmp(gpu->arch, "Hopper"))
        return 5;
    if (!strcmp(gpu->arch, "Ampere") || !strncmp(gpu->arch, "Ada", 3))
        return 4;
    return 3;
}

/* Row remapping is what HBM boards (A100, A30, H100, H200) have; older boards retire
 * pages instead, and newer ones report page retirement as not supported. */
static int remaps_rows(const struct nvmlDevice_st *gpu)
{
    return !strcmp(gpu->arch, "Ampere") || !strcmp(gpu->arch, "Hopper");
}

void health_load(void)
{
    char line[512];
    FILE *file = open_run("nvml/health");
    for (unsigned int i = 0; i < node.count; i++) {
        struct health_st *h = &node.gpus[i].health;
        memset(h, 0, sizeof *h);
        h->pcie_gen = max_generation(&node.gpus[i]);
        h->pcie_width = 16;
    }
    if (!file)
        return;
    while (fgets(line, sizeof line, file)) {
        struct health_st *h = NULL;
        char *save = NULL;
        for (char *field = strtok_r(line, "\t\n", &save); field; field = strtok_r(NULL, "\t\n", &save)) {
            char *value = strchr(field, '=');
            if (!value)
                continue;
            *value++ = '\0';
            unsigned long long number = strtoull(value, NULL, 0);
            if (!strcmp(field, "index")) {
                h = NULL;
                for (unsigned int i = 0; i < node.count; i++)
                    if (node.gpus[i].index == number)
                        h = &node.gpus[i].health;
                continue;
            }
            if (!h)
                continue;
            if (!strcmp(field, "ecc_dbe"))
                h->ecc_dbe = number;
            else if (!strcmp(field, "ecc_dbe_aggregate"))
                h->ecc_dbe_aggregate = number;
            else if (!strcmp(field, "retire_pending"))
                h->retire_pending = (int)number;
            else if (!strcmp(field, "remap_pending"))
                h->remap_pending = (int)number;
            else if (!strcmp(field, "remap_failure"))
                h->remap_failure = (int)number;
            else if (!strcmp(field, "remapped_unc"))
                h->remapped_unc = (unsigned int)number;
            else if (!strcmp(field, "remapped_corr"))
                h->remapped_corr = (unsigned int)number;
            else if (!strcmp(field, "reasons"))
                h->reasons = number;
            else if (!strcmp(field, "pcie_gen") && number)
                h->pcie_gen = (unsigned int)number;
            else if (!strcmp(field, "pcie_width") && number)
                h->pcie_width = (unsigned int)number;
            else if (!strcmp(field, "lost"))
                h->lost = (int)number;
        }
    }
    fclose(file);
}

/* --- ECC ------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current,
                                         nvmlEnableState_t *pending)
{
    REQUIRE_DEVICE(device);
    if (!current || !pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = NVML_FEATURE_ENABLED; /* data-centre boards ship with ECC on */
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t type,
                                                nvmlEccCounterType_t counter,
                                                unsigned long long *count)
{
    REQUIRE_DEVICE(device);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (type == NVML_MEMORY_ERROR_TYPE_CORRECTED)
        *count = 0;
    else if (counter == NVML_VOLATILE_ECC)
        *count = gpu->health.ecc_dbe;
    else /* the aggregate counter outlives driver reloads and holds the volatile one */
        *count = gpu->health.ecc_dbe_aggregate > gpu->health.ecc_dbe ? gpu->health.ecc_dbe_aggregate
                                                                     : gpu->health.ecc_dbe;
    return NVML_SUCCESS;
}

/* --- retired pages and remapped rows -------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device,
                                                           nvmlEnableState_t *pending)
{
    REQUIRE_DEVICE(device);
    if (!pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (remaps_rows(gpu))
        return NVML_ERROR_NOT_SUPPORTED;
    *pending = gpu->health.retire_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrected,
                                              unsigned int *uncorrected, unsigned int *pending,
                                              unsigned int *failed)
{
    REQUIRE_DEVICE(device);
    if (!corrected || !uncorrected || !pending || !failed)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!remaps_rows(gpu))
        return NVML_ERROR_NOT_SUPPORTED;
    *corrected = gpu->health.remapped_corr;
    *uncorrected = gpu->health.remapped_unc;
    *pending = (unsigned int)gpu->health.remap_pending;
    *failed = (unsigned int)gpu->health.remap_failure;
    return NVML_SUCCESS;
}

/* --- clock event reasons -------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                           unsigned long long *reasons)
{
    REQUIRE_DEVICE(device);
    if (!reasons)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* Nothing runs on a simulated GPU: it is idle, plus whatever holds its clocks down. */
    *reasons = nvmlClocksEventReasonGpuIdle | gpu->health.reasons;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                              unsigned long long *reasons)
{
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device,
                                                             unsigned long long *reasons)
{
    REQUIRE_DEVICE(device);
    if (!reasons)
        return NVML_ERROR_INVALID_ARGUMENT;
    *reasons = nvmlClocksEventReasonAll;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t device,
                                                                unsigned long long *reasons)
{
    return nvmlDeviceGetSupportedClocksEventReasons(device, reasons);
}

/* --- the PCIe link ---------------------------------------------------------------------- */

static nvmlReturn_t link_value(nvmlDevice_t device, unsigned int *out, int which)
{
    REQUIRE_DEVICE(device);
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    switch (which) {
    case 0: *out = gpu->health.pcie_gen; break;
    case 1: *out = max_generation(gpu); break;
    case 2: *out = gpu->health.pcie_width; break;
    default: *out = 16; break;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen)
{
    return link_value(device, gen, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen)
{
    return link_value(device, gen, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen)
{
    return link_value(device, gen, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *width)
{
    return link_value(device, width, 2);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *width)
{
    return link_value(device, width, 3);
}

/* --- a GPU reset --------------------------------------------------------------------------- */

/* Runs the kit's `reset-gpu INDEX`: what the board keeps, cleared as a reset clears it. */
static nvmlReturn_t kit_reset(unsigned int index)
{
    const char *kit = getenv("GPUSIM_KIT");
    char number[16];
    int status;
    pid_t pid;
    if (!kit || !*kit)
        kit = "/opt/gpusim/bin/gpusim";
    snprintf(number, sizeof number, "%u", index);
    if ((pid = fork()) < 0)
        return NVML_ERROR_UNKNOWN;
    if (pid == 0) {
        execl(kit, kit, "reset-gpu", number, (char *)NULL);
        _exit(127);
    }
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return NVML_ERROR_UNKNOWN;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

/*
 * The driver resets a GPU only while it answers on the bus and no process other than
 * the one asking (and the daemons that tolerate a reset) holds it; a reset applies a
 * pending MIG mode and clears the GPU's instances, its volatile ECC count and a pending
 * row remapping or page retirement (which it completes). A lost GPU takes a reboot.
 */
nvmlReturn_t gpu_reset(struct nvmlDevice_st *gpu)
{
    nvmlReturn_t rc;
    if (geteuid() != 0)
        return NVML_ERROR_NO_PERMISSION;
    health_load();
    if (gpu->health.lost)
        return NVML_ERROR_GPU_IS_LOST;
    if (gpu_held_by_others(gpu))
        return NVML_ERROR_IN_USE;
    if ((rc = mig_at_reset(gpu)) != NVML_SUCCESS)
        return rc;
    if ((rc = kit_reset(gpu->index)) != NVML_SUCCESS)
        return rc;
    health_load();
    return NVML_SUCCESS;
}
