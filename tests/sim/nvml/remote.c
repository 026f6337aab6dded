/*
 * The mock NVML inside a container.
 *
 * On a real node, NVML in a container reaches the same kernel module as on the host,
 * through the device files the container runtime passes in. The simulated module
 * lives in files under GPUSIM_RUN on the node, which a container does not have, so
 * there the library asks the simulated persistence daemon instead: its socket
 * (/run/nvidia-persistenced/socket) is one of the files the real `nvidia-ctk cdi
 * generate` puts into every container's spec. The daemon answers a connection with
 * a snapshot of the node's state and closes it:
 *
 *   <name> <size>\n<size bytes>     repeated; names relative to GPUSIM_RUN, and
 *                                   "state/<name>" for files of GPUSIM_STATE
 *
 * A container only reads: changes (persistence mode, MIG) answer NO_PERMISSION, as
 * they do for an unprivileged container on a real node. GPUSIM_NVML_SOCKET names
 * another socket (tests).
 */
#include "mock_nvml.h"

#include <sys/socket.h>
#include <sys/un.h>

#define REMOTE_MAX_FILES 64
#define REMOTE_MAX_BYTES (1U << 20)

struct remote_file {
    const char *name;
    const char *data;
    size_t size;
};

static struct {
    int active;
    char *buffer;
    unsigned int count;
    struct remote_file files[REMOTE_MAX_FILES];
} remote;

static const char *socket_path(void)
{
    const char *path = getenv("GPUSIM_NVML_SOCKET");
    return path && *path ? path : "/run/nvidia-persistenced/socket";
}

int remote_active(void)
{
    return remote.active;
}

void remote_drop(void)
{
    free(remote.buffer);
    memset(&remote, 0, sizeof remote);
}

static char *receive(size_t *used)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t capacity = 64 * 1024;
    char *buffer;
    int fd;

    if (strlen(socket_path()) >= sizeof addr.sun_path)
        return NULL;
    copy(addr.sun_path, sizeof addr.sun_path, socket_path());
    if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
        return NULL;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || !(buffer = malloc(capacity + 1))) {
        close(fd);
        return NULL;
    }
    *used = 0;
    for (;;) {
        if (*used == capacity) {
            char *larger = capacity < REMOTE_MAX_BYTES ? realloc(buffer, 2 * capacity + 1) : NULL;
            if (!larger)
                break;
            buffer = larger;
            capacity *= 2;
        }
        ssize_t n = read(fd, buffer + *used, capacity - *used);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            close(fd);
            if (n == 0) {
                buffer[*used] = '\0';
                return buffer;
            }
            free(buffer);
            return NULL;
        }
        *used += (size_t)n;
    }
    close(fd);
    free(buffer);
    return NULL;
}

/* Takes a fresh snapshot of the node's state; 0 when no daemon answers. */
int remote_load(void)
{
    size_t used = 0;
    char *buffer, *at, *end;

    remote_drop();
    if (!(buffer = receive(&used)))
        return 0;
    remote.buffer = buffer;
    remote.active = 1;
    for (at = buffer, end = buffer + used; at < end && remote.count < REMOTE_MAX_FILES;) {
        char *newline = memchr(at, '\n', (size_t)(end - at));
        char *space;
        size_t size;
        if (!newline)
            break;
        *newline = '\0';
        if (!(space = strrchr(at, ' ')))
            break;
        *space = '\0';
        size = strtoul(space + 1, NULL, 10);
        if (size > (size_t)(end - newline - 1))
            break;
        remote.files[remote.count++] = (struct remote_file){at, newline + 1, size};
        at = newline + 1 + size;
    }
    return 1;
}

static const struct remote_file *find(const char *name)
{
    for (unsigned int i = 0; i < remote.count; i++)
        if (!strcmp(remote.files[i].name, name))
            return &remote.files[i];
    return NULL;
}

/* A file of the snapshot, or a directory some file of it is in. */
int remote_exists(const char *name)
{
    size_t length = strlen(name);
    for (unsigned int i = 0; i < remote.count; i++)
        if (!strncmp(remote.files[i].name, name, length) &&
            (remote.files[i].name[length] == '\0' || remote.files[i].name[length] == '/'))
            return 1;
    return 0;
}

FILE *remote_open(const char *name)
{
    const struct remote_file *file = find(name);
    if (!file) {
        errno = ENOENT;
        return NULL;
    }
    if (file->size == 0)
        return fopen("/dev/null", "re");
    return fmemopen((void *)file->data, file->size, "r");
}
