/*
 * MIG in gpufleet's mock NVML: mode, GPU and compute instances, MIG devices.
 *
 * What a board offers (its GPU instance profiles with their placements) is data the
 * simulation kit writes from tests/sim/kit/profiles/models.yaml into
 * nvml/mig-profiles. The rules are the hardware's as NVML states them: a MIG mode
 * change is pending until the GPU is reset, which happens at once only when no
 * other process holds the GPU; a GPU instance occupies memory slices at one of its
 * profile's placements and its compute slices out of seven; a compute instance
 * occupies compute slices of its GPU instance; each compute instance is a MIG
 * device. Instances live in the node's run directory (a reboot loses them, as a
 * GPU reset does); the MIG mode, by GPU UUID, in its state directory (the board
 * keeps it).
 * Every entry point re-reads both, since nvidia-smi and mig-parted are separate
 * processes; changes take a lock and replace the files atomically.
 */
#include "mock_nvml.h"

#include <dirent.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/sysmacros.h>
#include <sys/un.h>

#define MAX_GI_IDS 15     /* GPU instance ids 1..14 */
#define MAX_CI_IDS 8      /* compute instance ids 0..7 */
#define MAX_PLACEMENTS 8  /* memory slices of a board */
#define COMPUTE_SLICES 7  /* compute slices of a board */
#define MAX_MIG_DEVICES 7 /* one per compute slice at most */

struct gi_profile {
    int offered;
    char name[32]; /* "1g.5gb" */
    unsigned int id, slices, size, instances, sm, ce, dec, enc, jpeg, ofa;
    unsigned int placements, starts[MAX_PLACEMENTS];
    unsigned long long memory_mib;
};

struct nvmlComputeInstance_st {
    int used;
    struct nvmlGpuInstance_st *gi;
    unsigned int id, profile, start; /* profile: an NVML_COMPUTE_INSTANCE_PROFILE_* */
};

struct nvmlGpuInstance_st {
    int used;
    unsigned int gpu, id, profile, start; /* profile: an NVML_GPU_INSTANCE_PROFILE_* */
    struct nvmlComputeInstance_st cis[MAX_CI_IDS];
};

static struct mig_gpu {
    int current, pending;
    struct gi_profile profiles[NVML_GPU_INSTANCE_PROFILE_COUNT];
    struct nvmlGpuInstance_st gis[MAX_GI_IDS];
} mig[MAX_GPUS];

/* Compute slices of each NVML_COMPUTE_INSTANCE_PROFILE_* (1, 2, 3, 4, 7, 8, 6 slices). */
static const unsigned int ci_slice_count[] = {1, 2, 3, 4, 7, 8, 6};
#define CI_PROFILES (sizeof ci_slice_count / sizeof ci_slice_count[0])

/* --- state files ------------------------------------------------------------------------ */

static const char *state_dir(void)
{
    const char *dir = getenv("GPUSIM_STATE");
    return dir && *dir ? dir : "/var/lib/gpusim";
}

static int state_path(char *out, size_t size, const char *name)
{
    int n = snprintf(out, size, "%s/%s", state_dir(), name);
    return n > 0 && (size_t)n < size;
}

/*
 * The device file of a MIG capability ("gpu0/gi1/access"), which NVML has
 * nvidia-modprobe create when an instance appears: its minor is the one the driver
 * lists in /proc/driver/nvidia-caps/mig-minors (GPUSIM_PROC_DRIVER on a simulated
 * node). Without that list, or without the right to create device files, no file.
 */
static void create_cap_device(const char *cap)
{
    const char *proc = getenv("GPUSIM_PROC_DRIVER");
    char path[PATH_MAX], line[128], name[96];
    unsigned int minor;
    FILE *file;
    int found = 0;
    snprintf(path, sizeof path, "%s/nvidia-caps/mig-minors", proc && *proc ? proc : "/proc/driver");
    if (!(file = fopen(path, "re")))
        return;
    while (!found && fgets(line, sizeof line, file))
        found = sscanf(line, "%95s %u", name, &minor) == 2 && !strcmp(name, cap);
    fclose(file);
    if (!found)
        return;
    snprintf(path, sizeof path, "%s/nvidia-caps", dev_dir());
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/nvidia-caps/nvidia-cap%u", dev_dir(), minor);
    /* numbered like the node's other device files (1:3, see the simulation kit) */
    if (mknod(path, S_IFCHR | 0444, makedev(1, 3)) == 0)
        chmod(path, 0444);
}

static unsigned int gpu_number(const struct nvmlDevice_st *gpu)
{
    return (unsigned int)(gpu - node.gpus);
}

int mig_enabled(const struct nvmlDevice_st *gpu)
{
    return gpu->mig_capable && mig[gpu_number(gpu)].current == NVML_DEVICE_MIG_ENABLE;
}

static void parse_profile(char *line)
{
    struct gi_profile p = {.offered = 1};
    unsigned int gpu = MAX_GPUS, index = NVML_GPU_INSTANCE_PROFILE_COUNT;
    char *save = NULL;
    for (char *field = strtok_r(line, " \t\n", &save); field; field = strtok_r(NULL, " \t\n", &save)) {
        char *value = strchr(field, '=');
        if (!value)
            continue;
        *value++ = '\0';
        unsigned int number = (unsigned int)strtoul(value, NULL, 10);
        if (!strcmp(field, "gpu")) gpu = number;
        else if (!strcmp(field, "index")) index = number;
        else if (!strcmp(field, "name")) copy(p.name, sizeof p.name, value);
        else if (!strcmp(field, "id")) p.id = number;
        else if (!strcmp(field, "slices")) p.slices = number;
        else if (!strcmp(field, "size")) p.size = number;
        else if (!strcmp(field, "instances")) p.instances = number;
        else if (!strcmp(field, "memory_mib")) p.memory_mib = strtoull(value, NULL, 10);
        else if (!strcmp(field, "sm")) p.sm = number;
        else if (!strcmp(field, "ce")) p.ce = number;
        else if (!strcmp(field, "dec")) p.dec = number;
        else if (!strcmp(field, "enc")) p.enc = number;
        else if (!strcmp(field, "jpeg")) p.jpeg = number;
        else if (!strcmp(field, "ofa")) p.ofa = number;
        else if (!strcmp(field, "starts"))
            for (char *s = value; *s && p.placements < MAX_PLACEMENTS; s += strcspn(s, ","), s += *s == ',')
                p.starts[p.placements++] = (unsigned int)strtoul(s, NULL, 10);
    }
    if (gpu < MAX_GPUS && index < NVML_GPU_INSTANCE_PROFILE_COUNT)
        mig[gpu].profiles[index] = p;
}

static void load_instance(const char *line)
{
    unsigned int gpu, gi, ci, profile, start;
    if (sscanf(line, "gi %u %u %u %u", &gpu, &gi, &profile, &start) == 4) {
        if (gpu < MAX_GPUS && gi < MAX_GI_IDS && profile < NVML_GPU_INSTANCE_PROFILE_COUNT) {
            struct nvmlGpuInstance_st *g = &mig[gpu].gis[gi];
            g->used = 1;
            g->gpu = gpu;
            g->id = gi;
            g->profile = profile;
            g->start = start;
        }
    } else if (sscanf(line, "ci %u %u %u %u %u", &gpu, &gi, &ci, &profile, &start) == 5) {
        if (gpu < MAX_GPUS && gi < MAX_GI_IDS && ci < MAX_CI_IDS && profile < CI_PROFILES &&
            mig[gpu].gis[gi].used) {
            struct nvmlComputeInstance_st *c = &mig[gpu].gis[gi].cis[ci];
            c->used = 1;
            c->gi = &mig[gpu].gis[gi];
            c->id = ci;
            c->profile = profile;
            c->start = start;
        }
    }
}

/* Re-read profiles, modes and instances (another process may have changed them). */
void mig_load(void)
{
    char path[PATH_MAX], line[512];
    FILE *file;
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        memset(mig[i].profiles, 0, sizeof mig[i].profiles);
        memset(mig[i].gis, 0, sizeof mig[i].gis);
        mig[i].current = mig[i].pending = NVML_DEVICE_MIG_DISABLE;
    }
    if ((file = open_run("nvml/mig-profiles"))) {
        while (fgets(line, sizeof line, file))
            parse_profile(line);
        fclose(file);
    }
    if ((file = remote_active() ? remote_open("state/mig-mode")
                                : state_path(path, sizeof path, "mig-mode") ? fopen(path, "re") : NULL)) {
        char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        int current, pending;
        while (fgets(line, sizeof line, file))
            if (sscanf(line, "%95s %d %d", uuid, &current, &pending) == 3)
                for (unsigned int i = 0; i < node.count; i++)
                    if (!strcmp(node.gpus[i].uuid, uuid)) {
                        mig[i].current = current;
                        mig[i].pending = pending;
                    }
        fclose(file);
    }
    if ((file = open_run("nvml/mig-instances"))) {
        while (fgets(line, sizeof line, file))
            load_instance(line);
        fclose(file);
    }
}

/* Replace `path` with what `write` puts in it, atomically. */
static nvmlReturn_t replace_file(const char *path, void (*write)(FILE *))
{
    char tmp[PATH_MAX];
    FILE *file;
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp || !(file = fopen(tmp, "we")))
        return NVML_ERROR_UNKNOWN;
    write(file);
    if (fclose(file) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return NVML_ERROR_UNKNOWN;
    }
    return NVML_SUCCESS;
}

static void write_modes(FILE *file)
{
    for (unsigned int i = 0; i < node.count; i++)
        if (node.gpus[i].mig_capable)
            fprintf(file, "%s %d %d\n", node.gpus[i].uuid, mig[i].current, mig[i].pending);
}

static void write_instances(FILE *file)
{
    for (unsigned int i = 0; i < MAX_GPUS; i++)
        for (unsigned int g = 0; g < MAX_GI_IDS; g++) {
            const struct nvmlGpuInstance_st *gi = &mig[i].gis[g];
            if (!gi->used)
                continue;
            fprintf(file, "gi %u %u %u %u\n", i, gi->id, gi->profile, gi->start);
            for (unsigned int c = 0; c < MAX_CI_IDS; c++)
                if (gi->cis[c].used)
                    fprintf(file, "ci %u %u %u %u %u\n", i, gi->id, c, gi->cis[c].profile, gi->cis[c].start);
        }
}

static nvmlReturn_t save(void)
{
    char path[PATH_MAX];
    nvmlReturn_t rc;
    if (remote_active())
        return NVML_ERROR_NO_PERMISSION;
    if (!state_path(path, sizeof path, "mig-mode") || (rc = replace_file(path, write_modes)) != NVML_SUCCESS)
        return NVML_ERROR_UNKNOWN;
    if (!run_path(path, sizeof path, "nvml/mig-instances"))
        return NVML_ERROR_UNKNOWN;
    return replace_file(path, write_instances);
}

/* Changes hold a lock from their load to their save, so two processes cannot both
 * take the same slices. Returns the lock's descriptor (or -1: no lock, still go on). */
static int lock_and_load(void)
{
    char path[PATH_MAX];
    int fd = -1;
    if (run_path(path, sizeof path, "nvml/mig.lock") &&
        (fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) >= 0)
        flock(fd, LOCK_EX);
    mig_load();
    return fd;
}

static nvmlReturn_t save_and_unlock(int fd, nvmlReturn_t rc)
{
    if (rc == NVML_SUCCESS)
        rc = save();
    if (fd >= 0)
        close(fd); /* releases the lock */
    return rc;
}

/* --- handles ------------------------------------------------------------------------------ */

static struct nvmlGpuInstance_st *gi_of(nvmlGpuInstance_t handle)
{
    for (unsigned int i = 0; i < node.count; i++)
        for (unsigned int g = 0; g < MAX_GI_IDS; g++)
            if (handle.handle == &mig[i].gis[g])
                return mig[i].gis[g].used ? handle.handle : NULL;
    return NULL;
}

static struct nvmlComputeInstance_st *ci_of(void *handle)
{
    for (unsigned int i = 0; i < node.count; i++)
        for (unsigned int g = 0; g < MAX_GI_IDS; g++)
            for (unsigned int c = 0; c < MAX_CI_IDS; c++)
                if (handle == &mig[i].gis[g].cis[c])
                    return mig[i].gis[g].cis[c].used ? handle : NULL;
    return NULL;
}

/* A MIG device handle is its compute instance's address. */
int is_mig_device(nvmlDevice_t device)
{
    if (node.initialised == 0 || gpu_of(device))
        return 0; /* a whole GPU: no need to read the MIG state */
    mig_load();
    return ci_of(device.handle) != NULL;
}

#define REQUIRE_MIG_GPU(device)                                                               \
    REQUIRE_DEVICE(device);                                                                   \
    do {                                                                                      \
        if (!gpu->mig_capable)                                                                \
            return NVML_ERROR_NOT_SUPPORTED;                                                  \
        mig_load();                                                                           \
    } while (0)

#define REQUIRE_GI(handle)                                                                    \
    struct nvmlGpuInstance_st *gi;                                                            \
    do {                                                                                      \
        REQUIRE_INIT();                                                                       \
        mig_load();                                                                           \
        if (!(gi = gi_of(handle)))                                                            \
            return NVML_ERROR_INVALID_ARGUMENT;                                               \
    } while (0)

static const struct gi_profile *gi_profile(const struct nvmlGpuInstance_st *gi)
{
    return &mig[gi->gpu].profiles[gi->profile];
}

/* The NVML_GPU_INSTANCE_PROFILE_* of the board's profile with this id, or -1. */
static int profile_by_id(unsigned int gpu, unsigned int id)
{
    for (int p = 0; p < NVML_GPU_INSTANCE_PROFILE_COUNT; p++)
        if (mig[gpu].profiles[p].offered && mig[gpu].profiles[p].id == id)
            return p;
    return -1;
}

/* --- MIG mode ------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    REQUIRE_MIG_GPU(device);
    if (!current || !pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    *current = (unsigned int)mig[gpu_number(gpu)].current;
    *pending = (unsigned int)mig[gpu_number(gpu)].pending;
    return NVML_SUCCESS;
}

/*
 * In gpusim's kernel view (a user namespace, where no other process's descriptors can
 * be read) the view answers instead: a connection to GPUSIM_GPUS_HELD_SOCKET gets the
 * indexes of the GPUs held by processes other than the one connecting, as they are
 * then ("0,3"). 1: held, 0: not, -1: no such answer.
 */
static int held_per_kernel_view(unsigned int index)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    const char *path = getenv("GPUSIM_GPUS_HELD_SOCKET");
    char reply[256];
    size_t used = 0;
    ssize_t n;
    int fd;
    if (!path || !*path || strlen(path) >= sizeof addr.sun_path)
        return -1;
    copy(addr.sun_path, sizeof addr.sun_path, path);
    if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        close(fd);
        return -1;
    }
    while (used < sizeof reply - 1 && (n = read(fd, reply + used, sizeof reply - 1 - used)) > 0)
        used += (size_t)n;
    close(fd);
    reply[used] = '\0';
    for (const char *p = reply; *p;) {
        char *end;
        unsigned long held = strtoul(p, &end, 10);
        if (end == p)
            break;
        if (held == index)
            return 1;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

/*
 * Driver daemons whose handles do not keep a GPU from being reset (NVIDIA's
 * nvidia-mig-manager service runs after both and leaves them running): the persistence
 * daemon and the fabric manager, by their /proc/PID/comm (gpusim's RESET_TOLERATED).
 */
static int reset_tolerated(long pid)
{
    char path[64], comm[32] = "";
    FILE *file;
    snprintf(path, sizeof path, "/proc/%ld/comm", pid);
    if (!(file = fopen(path, "re")))
        return 0;
    if (!fgets(comm, sizeof comm, file))
        comm[0] = '\0';
    fclose(file);
    comm[strcspn(comm, "\n")] = '\0';
    return !strcmp(comm, "nvidia-persiste") || !strcmp(comm, "nv-fabricmanage");
}

/* Whether a process other than this one (and the daemons above) has the GPU's device
 * file open, so that the driver cannot reset the GPU. */
int gpu_held_by_others(const struct nvmlDevice_st *gpu)
{
    char wanted[PATH_MAX], fd_dir[64], link[PATH_MAX + 64], target[PATH_MAX];
    DIR *procs, *fds;
    struct dirent *proc, *fd;
    int held = held_per_kernel_view(gpu->index);
    if (held >= 0)
        return held;
    held = 0;
    snprintf(wanted, sizeof wanted, "%s/nvidia%u", dev_dir(), gpu->index);
    if (!(procs = opendir("/proc")))
        return 0;
    while (!held && (proc = readdir(procs))) {
        long pid = strtol(proc->d_name, NULL, 10);
        if (pid <= 0 || pid == (long)getpid())
            continue;
        snprintf(fd_dir, sizeof fd_dir, "/proc/%ld/fd", pid);
        if (!(fds = opendir(fd_dir)))
            continue;
        while (!held && (fd = readdir(fds))) {
            ssize_t n;
            snprintf(link, sizeof link, "%s/%s", fd_dir, fd->d_name);
            if ((n = readlink(link, target, sizeof target - 1)) > 0) {
                target[n] = '\0';
                held = !strcmp(target, wanted) && !reset_tolerated(pid);
            }
        }
        closedir(fds);
    }
    closedir(procs);
    return held;
}

static int has_instances(unsigned int gpu)
{
    for (unsigned int g = 0; g < MAX_GI_IDS; g++)
        if (mig[gpu].gis[g].used)
            return 1;
    return 0;
}

/*
 * The mode becomes pending; the driver then resets the GPU to make it current,
 * which it can only do while no other process holds the GPU (activationStatus is
 * then NVML_ERROR_IN_USE and the mode stays pending until a reset or a reboot).
 */
EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode, nvmlReturn_t *activation)
{
    REQUIRE_MIG_GPU(device);
    if (!activation || (mode != NVML_DEVICE_MIG_ENABLE && mode != NVML_DEVICE_MIG_DISABLE))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (geteuid() != 0)
        return NVML_ERROR_NO_PERMISSION;
    int lock = lock_and_load();
    struct mig_gpu *m = &mig[gpu_number(gpu)];
    if (mode == NVML_DEVICE_MIG_DISABLE && has_instances(gpu_number(gpu)))
        return save_and_unlock(lock, NVML_ERROR_IN_USE);
    m->pending = (int)mode;
    *activation = NVML_SUCCESS;
    if (m->current != m->pending) {
        if (gpu_held_by_others(gpu))
            *activation = NVML_ERROR_IN_USE;
        else
            m->current = m->pending;
    }
    return save_and_unlock(lock, NVML_SUCCESS);
}

/* A GPU reset (mock_nvml.c): a pending MIG mode becomes current and the GPU's
 * instances are gone, as at power-on. */
nvmlReturn_t mig_at_reset(const struct nvmlDevice_st *gpu)
{
    if (!gpu->mig_capable)
        return NVML_SUCCESS;
    int lock = lock_and_load();
    struct mig_gpu *m = &mig[gpu_number(gpu)];
    m->current = m->pending;
    memset(m->gis, 0, sizeof m->gis);
    return save_and_unlock(lock, NVML_SUCCESS);
}

/* --- GPU instance profiles and placements ------------------------------------------------------ */

static nvmlReturn_t offered_profile(nvmlDevice_t device, unsigned int profile, const struct gi_profile **out)
{
    REQUIRE_MIG_GPU(device);
    if (profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_enabled(gpu) || !mig[gpu_number(gpu)].profiles[profile].offered)
        return NVML_ERROR_NOT_SUPPORTED;
    *out = &mig[gpu_number(gpu)].profiles[profile];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_t *info)
{
    const struct gi_profile *p;
    nvmlReturn_t rc;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = offered_profile(device, profile, &p)) != NVML_SUCCESS)
        return rc;
    *info = (nvmlGpuInstanceProfileInfo_t){
        .id = p->id, .isP2pSupported = 0, .sliceCount = p->slices, .instanceCount = p->instances,
        .multiprocessorCount = p->sm, .copyEngineCount = p->ce, .decoderCount = p->dec,
        .encoderCount = p->enc, .jpegCount = p->jpeg, .ofaCount = p->ofa, .memorySizeMB = p->memory_mib,
    };
    return NVML_SUCCESS;
}

static nvmlReturn_t fill_profile_v(const struct gi_profile *p, nvmlGpuInstanceProfileInfo_v2_t *info)
{
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    snprintf(name, sizeof name, "MIG %s", p->name);
    if (info->version == nvmlGpuInstanceProfileInfo_v3) {
        nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)info;
        *v3 = (nvmlGpuInstanceProfileInfo_v3_t){
            .version = nvmlGpuInstanceProfileInfo_v3, .id = p->id, .sliceCount = p->slices,
            .instanceCount = p->instances, .multiprocessorCount = p->sm, .copyEngineCount = p->ce,
            .decoderCount = p->dec, .encoderCount = p->enc, .jpegCount = p->jpeg, .ofaCount = p->ofa,
            .memorySizeMB = p->memory_mib, .capabilities = 0,
        };
        copy(v3->name, sizeof v3->name, name);
        return NVML_SUCCESS;
    }
    if (info->version != nvmlGpuInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    *info = (nvmlGpuInstanceProfileInfo_v2_t){
        .version = nvmlGpuInstanceProfileInfo_v2, .id = p->id, .isP2pSupported = 0,
        .sliceCount = p->slices, .instanceCount = p->instances, .multiprocessorCount = p->sm,
        .copyEngineCount = p->ce, .decoderCount = p->dec, .encoderCount = p->enc, .jpegCount = p->jpeg,
        .ofaCount = p->ofa, .memorySizeMB = p->memory_mib,
    };
    copy(info->name, sizeof info->name, name);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                         nvmlGpuInstanceProfileInfo_v2_t *info)
{
    const struct gi_profile *p;
    nvmlReturn_t rc;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = offered_profile(device, profile, &p)) != NVML_SUCCESS)
        return rc;
    return fill_profile_v(p, info);
}

/* The board's profile by the id nvidia-smi prints (19 for an A100's 1g.5gb). */
static nvmlReturn_t profile_with_id(nvmlDevice_t device, unsigned int id, int *index)
{
    REQUIRE_MIG_GPU(device);
    if (!mig_enabled(gpu))
        return NVML_ERROR_NOT_SUPPORTED;
    if ((*index = profile_by_id(gpu_number(gpu), id)) < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device, unsigned int id,
                                                             nvmlGpuInstanceProfileInfo_v2_t *info)
{
    int index;
    nvmlReturn_t rc;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = profile_with_id(device, id, &index)) != NVML_SUCCESS)
        return rc;
    return fill_profile_v(&mig[gpu_of(device) - node.gpus].profiles[index], info);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int id,
                                                                  nvmlGpuInstancePlacement_t *placements,
                                                                  unsigned int *count)
{
    int index;
    nvmlReturn_t rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = profile_with_id(device, id, &index)) != NVML_SUCCESS)
        return rc;
    const struct gi_profile *p = &mig[gpu_of(device) - node.gpus].profiles[index];
    if (!placements) {
        *count = p->placements;
        return NVML_SUCCESS;
    }
    if (*count < p->placements) {
        *count = p->placements;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < p->placements; i++)
        placements[i] = (nvmlGpuInstancePlacement_t){.start = p->starts[i], .size = p->size};
    *count = p->placements;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device, unsigned int id,
                                                               nvmlGpuInstancePlacement_t *placements,
                                                               unsigned int *count)
{
    return nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, id, placements, count);
}

/* Whether a GPU instance of profile `index` fits at `start` next to the existing ones. */
static int gi_fits(unsigned int gpu, int index, unsigned int start)
{
    const struct gi_profile *p = &mig[gpu].profiles[index];
    unsigned int compute = p->slices, same = 0;
    for (unsigned int g = 0; g < MAX_GI_IDS; g++) {
        const struct nvmlGpuInstance_st *other = &mig[gpu].gis[g];
        if (!other->used)
            continue;
        const struct gi_profile *o = gi_profile(other);
        if (start < other->start + o->size && other->start < start + p->size)
            return 0; /* memory slices overlap */
        compute += o->slices;
        same += other->profile == (unsigned int)index;
    }
    return compute <= COMPUTE_SLICES && same < p->instances;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int id,
                                                              unsigned int *count)
{
    int index;
    nvmlReturn_t rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = profile_with_id(device, id, &index)) != NVML_SUCCESS)
        return rc;
    /* How many more fit if each new one takes the first free placement. */
    unsigned int gpu = (unsigned int)(gpu_of(device) - node.gpus);
    struct nvmlGpuInstance_st saved[MAX_GI_IDS];
    memcpy(saved, mig[gpu].gis, sizeof saved);
    *count = 0;
    for (unsigned int i = 0; i < mig[gpu].profiles[index].placements; i++) {
        unsigned int start = mig[gpu].profiles[index].starts[i];
        for (unsigned int g = 1; g < MAX_GI_IDS && gi_fits(gpu, index, start); g++)
            if (!mig[gpu].gis[g].used) {
                mig[gpu].gis[g] = (struct nvmlGpuInstance_st){.used = 1, .gpu = gpu, .id = g,
                                                              .profile = (unsigned int)index, .start = start};
                (*count)++;
                break;
            }
    }
    memcpy(mig[gpu].gis, saved, sizeof saved);
    return NVML_SUCCESS;
}

/* A fault injected by `gpusim fault gi-create-error`: the next GPU instance created on
 * that GPU fails, once (nvml/gi-create-error holds its index and goes with it), as a
 * transient error of the real library's does. */
static int take_create_error(unsigned int index)
{
    char line[32], path[PATH_MAX];
    if (!read_line("nvml/gi-create-error", line, sizeof line) || strtoul(line, NULL, 10) != index)
        return 0;
    if (run_path(path, sizeof path, "nvml/gi-create-error"))
        unlink(path);
    return 1;
}

static nvmlReturn_t create_gi(nvmlDevice_t device, unsigned int id, const nvmlGpuInstancePlacement_t *placement,
                              nvmlGpuInstance_t *out)
{
    REQUIRE_MIG_GPU(device);
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (geteuid() != 0)
        return NVML_ERROR_NO_PERMISSION;
    int lock = lock_and_load();
    unsigned int n = gpu_number(gpu);
    int index = profile_by_id(n, id);
    nvmlReturn_t rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (!mig_enabled(gpu))
        rc = NVML_ERROR_NOT_SUPPORTED;
    else if (index < 0)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    else if (take_create_error(gpu->index))
        rc = NVML_ERROR_UNKNOWN;
    else {
        const struct gi_profile *p = &mig[n].profiles[index];
        int valid = !placement;
        for (unsigned int i = 0; placement && i < p->placements; i++)
            valid |= placement->start == p->starts[i] && placement->size == p->size;
        if (!valid)
            rc = NVML_ERROR_INVALID_ARGUMENT;
        for (unsigned int i = 0; valid && i < p->placements; i++) {
            unsigned int start = p->starts[i];
            if ((placement && start != placement->start) || !gi_fits(n, index, start))
                continue;
            for (unsigned int g = 1; g < MAX_GI_IDS; g++)
                if (!mig[n].gis[g].used) {
                    mig[n].gis[g] = (struct nvmlGpuInstance_st){.used = 1, .gpu = n, .id = g,
                                                                .profile = (unsigned int)index, .start = start};
                    out->handle = &mig[n].gis[g];
                    rc = NVML_SUCCESS;
                    char cap[64];
                    snprintf(cap, sizeof cap, "gpu%u/gi%u/access", gpu->index, g);
                    create_cap_device(cap);
                    break;
                }
            break;
        }
    }
    return save_and_unlock(lock, rc);
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gi)
{
    return create_gi(device, id, NULL, gi);
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int id,
                                                             const nvmlGpuInstancePlacement_t *placement,
                                                             nvmlGpuInstance_t *gi)
{
    if (!placement)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(device, id, placement, gi);
}

EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t handle)
{
    REQUIRE_GI(handle);
    if (geteuid() != 0)
        return NVML_ERROR_NO_PERMISSION;
    int lock = lock_and_load();
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!gi->used)
        rc = NVML_ERROR_INVALID_ARGUMENT; /* gone meanwhile */
    for (unsigned int c = 0; rc == NVML_SUCCESS && c < MAX_CI_IDS; c++)
        if (gi->cis[c].used)
            rc = NVML_ERROR_IN_USE; /* its compute instances must go first */
    if (rc == NVML_SUCCESS)
        memset(gi, 0, sizeof *gi);
    return save_and_unlock(lock, rc);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gis,
                                              unsigned int *count)
{
    int index;
    nvmlReturn_t rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = profile_with_id(device, id, &index)) != NVML_SUCCESS)
        return rc;
    struct mig_gpu *m = &mig[gpu_of(device) - node.gpus];
    unsigned int found = 0;
    for (unsigned int g = 0; g < MAX_GI_IDS; g++)
        if (m->gis[g].used && m->gis[g].profile == (unsigned int)index) {
            if (gis) /* sized by the caller for the profile's instance count, as NVML asks */
                gis[found].handle = &m->gis[g];
            found++;
        }
    *count = found;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *out)
{
    REQUIRE_MIG_GPU(device);
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!mig_enabled(gpu))
        return NVML_ERROR_NOT_SUPPORTED;
    if (id >= MAX_GI_IDS || !mig[gpu_number(gpu)].gis[id].used)
        return NVML_ERROR_NOT_FOUND;
    out->handle = &mig[gpu_number(gpu)].gis[id];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t handle, nvmlGpuInstanceInfo_t *info)
{
    REQUIRE_GI(handle);
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    info->device.handle = &node.gpus[gi->gpu];
    info->id = gi->id;
    info->profileId = gi_profile(gi)->id;
    info->placement = (nvmlGpuInstancePlacement_t){.start = gi->start, .size = gi_profile(gi)->size};
    return NVML_SUCCESS;
}

/* --- compute instances ------------------------------------------------------------------------ */

/* Whether compute instance profile `profile` exists in this GPU instance. */
static int ci_offered(const struct nvmlGpuInstance_st *gi, unsigned int profile)
{
    unsigned int slices = gi_profile(gi)->slices;
    if (profile >= CI_PROFILES)
        return 0;
    unsigned int c = ci_slice_count[profile];
    return c <= slices && !(c == 3 && slices == 4) && (c <= 4 || c == slices);
}

static void ci_name(const struct nvmlGpuInstance_st *gi, unsigned int profile, char *out, size_t size)
{
    const struct gi_profile *p = gi_profile(gi);
    if (ci_slice_count[profile] == p->slices)
        snprintf(out, size, "MIG %s", p->name);
    else
        snprintf(out, size, "MIG %uc.%s", ci_slice_count[profile], p->name);
}

static void fill_ci_profile(const struct nvmlGpuInstance_st *gi, unsigned int profile,
                            nvmlComputeInstanceProfileInfo_t *info)
{
    const struct gi_profile *p = gi_profile(gi);
    unsigned int c = ci_slice_count[profile];
    *info = (nvmlComputeInstanceProfileInfo_t){
        .id = profile, .sliceCount = c, .instanceCount = p->slices / c,
        .multiprocessorCount = p->sm / p->slices * c, .sharedCopyEngineCount = p->ce,
        .sharedDecoderCount = p->dec, .sharedEncoderCount = p->enc, .sharedJpegCount = p->jpeg,
        .sharedOfaCount = p->ofa,
    };
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t handle, unsigned int profile,
                                                                 unsigned int engines,
                                                                 nvmlComputeInstanceProfileInfo_t *info)
{
    REQUIRE_GI(handle);
    if (!info || engines != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED || profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!ci_offered(gi, profile))
        return NVML_ERROR_NOT_SUPPORTED;
    fill_ci_profile(gi, profile, info);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t handle, unsigned int profile,
                                                                  unsigned int engines,
                                                                  nvmlComputeInstanceProfileInfo_v2_t *info)
{
    nvmlComputeInstanceProfileInfo_t plain;
    nvmlReturn_t rc;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlComputeInstanceProfileInfo_v2 && info->version != nvmlComputeInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if ((rc = nvmlGpuInstanceGetComputeInstanceProfileInfo(handle, profile, engines, &plain)) != NVML_SUCCESS)
        return rc;
    /* v2 and v3 share their layout up to v3's trailing capabilities field. */
    info->id = plain.id;
    info->sliceCount = plain.sliceCount;
    info->instanceCount = plain.instanceCount;
    info->multiprocessorCount = plain.multiprocessorCount;
    info->sharedCopyEngineCount = plain.sharedCopyEngineCount;
    info->sharedDecoderCount = plain.sharedDecoderCount;
    info->sharedEncoderCount = plain.sharedEncoderCount;
    info->sharedJpegCount = plain.sharedJpegCount;
    info->sharedOfaCount = plain.sharedOfaCount;
    ci_name(gi_of(handle), profile, info->name, sizeof info->name);
    if (info->version == nvmlComputeInstanceProfileInfo_v3)
        ((nvmlComputeInstanceProfileInfo_v3_t *)info)->capabilities = 0;
    return NVML_SUCCESS;
}

/* Whether a compute instance of `profile` fits at compute slice `start` of the GPU instance. */
static int ci_fits(const struct nvmlGpuInstance_st *gi, unsigned int profile, unsigned int start)
{
    unsigned int size = ci_slice_count[profile], same = 0;
    if (start % size != 0 || start + size > gi_profile(gi)->slices)
        return 0;
    for (unsigned int c = 0; c < MAX_CI_IDS; c++) {
        const struct nvmlComputeInstance_st *other = &gi->cis[c];
        if (!other->used)
            continue;
        unsigned int other_size = ci_slice_count[other->profile];
        if (start < other->start + other_size && other->start < start + size)
            return 0;
        same += other->profile == profile;
    }
    return same < gi_profile(gi)->slices / size;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(nvmlGpuInstance_t handle, unsigned int profile,
                                                                        nvmlComputeInstancePlacement_t *placements,
                                                                        unsigned int *count)
{
    REQUIRE_GI(handle);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!ci_offered(gi, profile))
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int size = ci_slice_count[profile], found = 0;
    for (unsigned int start = 0; start + size <= gi_profile(gi)->slices; start += size) {
        if (placements && found < *count)
            placements[found] = (nvmlComputeInstancePlacement_t){.start = start, .size = size};
        found++;
    }
    if (placements && found > *count) {
        *count = found;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = found;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t handle, unsigned int profile,
                                                                       unsigned int *count)
{
    REQUIRE_GI(handle);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!ci_offered(gi, profile))
        return NVML_ERROR_NOT_SUPPORTED;
    struct nvmlComputeInstance_st saved[MAX_CI_IDS];
    memcpy(saved, gi->cis, sizeof saved);
    *count = 0;
    for (unsigned int start = 0; start < gi_profile(gi)->slices; start++)
        for (unsigned int c = 0; c < MAX_CI_IDS && ci_fits(gi, profile, start); c++)
            if (!gi->cis[c].used) {
                gi->cis[c] = (struct nvmlComputeInstance_st){.used = 1, .gi = gi, .id = c, .profile = profile,
                                                             .start = start};
                (*count)++;
                break;
            }
    memcpy(gi->cis, saved, sizeof saved);
    return NVML_SUCCESS;
}

static nvmlReturn_t create_ci(nvmlGpuInstance_t handle, unsigned int profile,
                              const nvmlComputeInstancePlacement_t *placement, nvmlComputeInstance_t *out)
{
    REQUIRE_GI(handle);
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!ci_offered(gi, profile))
        return NVML_ERROR_NOT_SUPPORTED;
    if (geteuid() != 0)
        return NVML_ERROR_NO_PERMISSION;
    if (placement && (placement->size != ci_slice_count[profile] || placement->start % placement->size != 0))
        return NVML_ERROR_INVALID_ARGUMENT;
    int lock = lock_and_load();
    nvmlReturn_t rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    if (!gi->used)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int start = 0; gi->used && start < gi_profile(gi)->slices && rc != NVML_SUCCESS; start++) {
        if ((placement && start != placement->start) || !ci_fits(gi, profile, start))
            continue;
        for (unsigned int c = 0; c < MAX_CI_IDS; c++)
            if (!gi->cis[c].used) {
                gi->cis[c] = (struct nvmlComputeInstance_st){.used = 1, .gi = gi, .id = c, .profile = profile,
                                                             .start = start};
                out->handle = &gi->cis[c];
                rc = NVML_SUCCESS;
                char cap[64];
                snprintf(cap, sizeof cap, "gpu%u/gi%u/ci%u/access", node.gpus[gi->gpu].index, gi->id, c);
                create_cap_device(cap);
                break;
            }
    }
    return save_and_unlock(lock, rc);
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gi, unsigned int profile,
                                                         nvmlComputeInstance_t *ci)
{
    return create_ci(gi, profile, NULL, ci);
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(nvmlGpuInstance_t gi, unsigned int profile,
                                                                      const nvmlComputeInstancePlacement_t *placement,
                                                                      nvmlComputeInstance_t *ci)
{
    if (!placement)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_ci(gi, profile, placement, ci);
}

EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t handle)
{
    REQUIRE_INIT();
    if (geteuid() != 0)
        return NVML_ERROR_NO_PERMISSION;
    int lock = lock_and_load();
    struct nvmlComputeInstance_st *ci = ci_of(handle.handle);
    if (ci)
        memset(ci, 0, sizeof *ci);
    return save_and_unlock(lock, ci ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t handle, unsigned int profile,
                                                       nvmlComputeInstance_t *cis, unsigned int *count)
{
    REQUIRE_GI(handle);
    if (!count || profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int found = 0;
    for (unsigned int c = 0; c < MAX_CI_IDS; c++)
        if (gi->cis[c].used && gi->cis[c].profile == profile) {
            if (cis) /* sized by the caller for the profile's instance count, as NVML asks */
                cis[found].handle = &gi->cis[c];
            found++;
        }
    *count = found;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t handle, unsigned int id,
                                                          nvmlComputeInstance_t *out)
{
    REQUIRE_GI(handle);
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (id >= MAX_CI_IDS || !gi->cis[id].used)
        return NVML_ERROR_NOT_FOUND;
    out->handle = &gi->cis[id];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t handle, nvmlComputeInstanceInfo_t *info)
{
    REQUIRE_INIT();
    mig_load();
    struct nvmlComputeInstance_st *ci = ci_of(handle.handle);
    if (!ci || !info)
        return NVML_ERROR_INVALID_ARGUMENT;
    info->device.handle = &node.gpus[ci->gi->gpu];
    info->gpuInstance.handle = ci->gi;
    info->id = ci->id;
    info->profileId = ci->profile;
    info->placement = (nvmlComputeInstancePlacement_t){.start = ci->start, .size = ci_slice_count[ci->profile]};
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t handle, nvmlComputeInstanceInfo_t *info)
{
    return nvmlComputeInstanceGetInfo_v2(handle, info);
}

/* --- MIG devices ------------------------------------------------------------------------------ */

/* The n-th MIG device of a GPU: compute instances ordered by where their GPU instance
 * starts, then by where they start within it. */
static struct nvmlComputeInstance_st *nth_mig_device(unsigned int gpu, unsigned int n)
{
    struct nvmlComputeInstance_st *order[MAX_GI_IDS * MAX_CI_IDS];
    unsigned int count = 0;
    for (unsigned int g = 0; g < MAX_GI_IDS; g++)
        for (unsigned int c = 0; c < MAX_CI_IDS; c++)
            if (mig[gpu].gis[g].used && mig[gpu].gis[g].cis[c].used)
                order[count++] = &mig[gpu].gis[g].cis[c];
    for (unsigned int i = 1; i < count; i++) /* insertion sort: at most a few dozen */
        for (unsigned int j = i; j > 0; j--) {
            struct nvmlComputeInstance_st *a = order[j - 1], *b = order[j];
            if (a->gi->start < b->gi->start || (a->gi->start == b->gi->start && a->start <= b->start))
                break;
            order[j - 1] = b;
            order[j] = a;
        }
    return n < count ? order[n] : NULL;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    REQUIRE_MIG_GPU(device);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = MAX_MIG_DEVICES;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *out)
{
    REQUIRE_MIG_GPU(device);
    if (!out || index >= MAX_MIG_DEVICES)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlComputeInstance_st *ci = nth_mig_device(gpu_number(gpu), index);
    if (!ci)
        return NVML_ERROR_NOT_FOUND;
    out->handle = (struct nvmlDevice_st *)(void *)ci;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig)
{
    REQUIRE_INIT();
    if (!is_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (is_mig_device(device)) {
        *is_mig = 1;
        return NVML_SUCCESS;
    }
    if (!gpu_of(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = 0;
    return NVML_SUCCESS;
}

/* Declares `ci` for an entry point that takes a MIG device. */
#define REQUIRE_MIG_DEVICE(device)                                                            \
    struct nvmlComputeInstance_st *ci;                                                        \
    do {                                                                                      \
        REQUIRE_INIT();                                                                       \
        mig_load();                                                                           \
        if (!(ci = ci_of((device).handle)))                                                   \
            return gpu_of(device) ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;    \
    } while (0)

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    REQUIRE_MIG_DEVICE(device);
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = ci->gi->id;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    REQUIRE_MIG_DEVICE(device);
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = ci->id;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t device, nvmlDevice_t *parent)
{
    REQUIRE_MIG_DEVICE(device);
    if (!parent)
        return NVML_ERROR_INVALID_ARGUMENT;
    parent->handle = &node.gpus[ci->gi->gpu];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    REQUIRE_MIG_DEVICE(device);
    if (!attributes)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlComputeInstanceProfileInfo_t profile;
    const struct gi_profile *p = gi_profile(ci->gi);
    fill_ci_profile(ci->gi, ci->profile, &profile);
    *attributes = (nvmlDeviceAttributes_t){
        .multiprocessorCount = profile.multiprocessorCount, .sharedCopyEngineCount = p->ce,
        .sharedDecoderCount = p->dec, .sharedEncoderCount = p->enc, .sharedJpegCount = p->jpeg,
        .sharedOfaCount = p->ofa, .gpuInstanceSliceCount = p->slices,
        .computeInstanceSliceCount = profile.sliceCount, .memorySizeMB = p->memory_mib,
    };
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    return nvmlDeviceGetAttributes_v2(device, attributes);
}

/* A MIG device's index is its place among its GPU's MIG devices. */
nvmlReturn_t mig_device_index(nvmlDevice_t device, unsigned int *index)
{
    REQUIRE_MIG_DEVICE(device);
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int n = 0; n < MAX_MIG_DEVICES; n++)
        if (nth_mig_device(ci->gi->gpu, n) == ci) {
            *index = n;
            return NVML_SUCCESS;
        }
    return NVML_ERROR_UNKNOWN;
}

nvmlReturn_t mig_device_name(nvmlDevice_t device, char *name, unsigned int length)
{
    char text[2 * NVML_DEVICE_NAME_V2_BUFFER_SIZE], profile[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    REQUIRE_MIG_DEVICE(device);
    ci_name(ci->gi, ci->profile, profile, sizeof profile);
    snprintf(text, sizeof text, "%s %s", node.gpus[ci->gi->gpu].name, profile);
    return put_string(name, length, text);
}

/* A MIG device's UUID: stable for its GPU, GPU instance and compute instance. */
static void mig_uuid(const struct nvmlComputeInstance_st *ci, char *out, size_t size)
{
    unsigned long long hash = 1469598103934665603ULL; /* FNV-1a */
    char seed[128];
    snprintf(seed, sizeof seed, "%s/%u/%u/%u/%u/%u", node.gpus[ci->gi->gpu].uuid, ci->gi->id, ci->gi->profile,
             ci->gi->start, ci->id, ci->profile);
    unsigned char bytes[16];
    for (int half = 0; half < 2; half++) {
        for (const char *s = seed; *s; s++)
            hash = (hash ^ (unsigned char)*s) * 1099511628211ULL;
        for (int i = 0; i < 8; i++)
            bytes[half * 8 + i] = (unsigned char)(hash >> (8 * i));
    }
    bytes[6] = (bytes[6] & 0x0f) | 0x50; /* a name-based UUID */
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    snprintf(out, size,
             "MIG-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7], bytes[8],
             bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]);
}

nvmlReturn_t mig_device_uuid(nvmlDevice_t device, char *uuid, unsigned int length)
{
    char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    REQUIRE_MIG_DEVICE(device);
    mig_uuid(ci, text, sizeof text);
    return put_string(uuid, length, text);
}

nvmlReturn_t mig_device_memory(nvmlDevice_t device, unsigned long long *total_mib)
{
    REQUIRE_MIG_DEVICE(device);
    *total_mib = gi_profile(ci->gi)->memory_mib;
    return NVML_SUCCESS;
}

nvmlReturn_t mig_handle_by_uuid(const char *uuid, nvmlDevice_t *device)
{
    char text[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    REQUIRE_INIT();
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    mig_load();
    for (unsigned int i = 0; i < node.count; i++)
        for (unsigned int g = 0; g < MAX_GI_IDS; g++)
            for (unsigned int c = 0; c < MAX_CI_IDS; c++) {
                struct nvmlComputeInstance_st *ci = &mig[i].gis[g].cis[c];
                if (!ci->used)
                    continue;
                mig_uuid(ci, text, sizeof text);
                if (!strcmp(text, uuid)) {
                    device->handle = (struct nvmlDevice_st *)(void *)ci;
                    return NVML_SUCCESS;
                }
            }
    return NVML_ERROR_NOT_FOUND;
}

/* BAR1 of a MIG device: its share of the board's 64 GiB aperture (A100 and H100 boards
 * report 65536 MiB), by memory slices. A whole GPU's BAR1 is not simulated. */
EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1)
{
    if (!is_mig_device(device)) {
        REQUIRE_DEVICE(device);
        return NVML_ERROR_NOT_SUPPORTED;
    }
    REQUIRE_MIG_DEVICE(device);
    if (!bar1)
        return NVML_ERROR_INVALID_ARGUMENT;
    bar1->bar1Total = (65536ULL << 20) / MAX_PLACEMENTS * gi_profile(ci->gi)->size;
    bar1->bar1Used = 0;
    bar1->bar1Free = bar1->bar1Total;
    return NVML_SUCCESS;
}

/* A MIG device's ECC error counters (nvidia-smi -q lists a MIG device only with them):
 * a healthy board has none. A whole GPU's ECC is not simulated. */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, nvmlMemoryErrorType_t type,
                                                   nvmlEccCounterType_t counter, nvmlMemoryLocation_t location,
                                                   unsigned long long *count)
{
    (void)type, (void)counter, (void)location;
    if (!is_mig_device(device)) {
        REQUIRE_DEVICE(device);
        return NVML_ERROR_NOT_SUPPORTED;
    }
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}
