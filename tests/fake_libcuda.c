/* A stand-in for the CUDA driver library (libcuda.so.1) at the hardware boundary: the few
 * entry points colab_gpu.cuda_order's child calls, answering from the environment the way
 * the driver answers from the hardware.
 *
 *   FAKE_CUDA_DEVICES       "busid/uuid,busid/uuid": the GPUs in the driver's own (fastest
 *                           first) order; an empty bus id or UUID is one the driver fails to give
 *   FAKE_CUDA_INIT_RESULT   the CUresult cuInit returns (default 0, CUDA_SUCCESS)
 *   FAKE_CUDA_INIT_SECONDS  how long cuInit takes (a box without persistence mode)
 *   FAKE_CUDA_LOG           a file cuInit appends its process id to, one line per call
 *
 * CUDA_VISIBLE_DEVICES is applied as the driver applies it: ordinals of that order (read as
 * strtoul reads them) or (unique prefixes of) UUIDs, all of the first entry's form, stopping
 * at the first entry that names no GPU or is of the other form; a GPU named twice leaves none
 * visible. No device visible: cuInit returns CUDA_ERROR_NO_DEVICE.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_DEVICES 16
#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_NOT_SUPPORTED 801

static char bus_ids[MAX_DEVICES][64];
static char uuids[MAX_DEVICES][64];
static int device_count;
static int visible[MAX_DEVICES]; /* CUDA ordinal -> device */
static int visible_count;
static int initialized;

static void read_devices(void) {
    const char *spec = getenv("FAKE_CUDA_DEVICES");
    device_count = 0;
    while (spec && *spec && device_count < MAX_DEVICES) {
        size_t length = strcspn(spec, ",");
        const char *slash = memchr(spec, '/', length);
        size_t bus_length = slash ? (size_t)(slash - spec) : length;
        snprintf(bus_ids[device_count], sizeof bus_ids[0], "%.*s", (int)bus_length, spec);
        snprintf(uuids[device_count], sizeof uuids[0], "%.*s",
                 slash ? (int)(length - bus_length - 1) : 0, slash ? slash + 1 : "");
        device_count++;
        spec += length + (spec[length] == ',');
    }
}

/* The device an entry names in a list whose first entry is a GPU UUID (by_uuid) or an ordinal:
 * read as strtoul reads it ("1gpu" is 1); an entry of the other form names none. */
static int named_device(const char *entry, size_t length, int by_uuid) {
    char text[64];
    snprintf(text, sizeof text, "%.*s", (int)length, entry);
    if (!by_uuid) {
        char *end;
        long ordinal = strtol(text, &end, 10);
        return end != text && ordinal >= 0 && ordinal < device_count ? (int)ordinal : -1;
    }
    if (strncmp(text, "GPU-", 4) == 0) {
        int match = -1;
        for (int device = 0; device < device_count; device++) {
            if (strncmp(uuids[device], text, length) == 0) {
                if (match >= 0) return -1; /* ambiguous prefix */
                match = device;
            }
        }
        return match;
    }
    return -1;
}

static void apply_visible_devices(void) {
    const char *entries = getenv("CUDA_VISIBLE_DEVICES");
    visible_count = 0;
    if (!entries) {
        for (int device = 0; device < device_count; device++) visible[visible_count++] = device;
        return;
    }
    while (*entries == ' ') entries++;
    int by_uuid = strncmp(entries, "GPU-", 4) == 0;
    while (visible_count < MAX_DEVICES) {
        while (*entries == ' ') entries++;
        size_t length = strcspn(entries, ",");
        while (length > 0 && entries[length - 1] == ' ') length--;
        int device = named_device(entries, length, by_uuid);
        if (device < 0) return;
        for (int seen = 0; seen < visible_count; seen++)
            if (visible[seen] == device) {
                visible_count = 0; /* a GPU named twice: none is visible */
                return;
            }
        visible[visible_count++] = device;
        entries = strchr(entries, ',');
        if (!entries) return;
        entries++;
    }
}

int cuInit(unsigned int flags) {
    (void)flags;
    const char *log = getenv("FAKE_CUDA_LOG");
    if (log) {
        FILE *file = fopen(log, "a");
        if (file) {
            fprintf(file, "%d\n", (int)getpid());
            fclose(file);
        }
    }
    const char *seconds = getenv("FAKE_CUDA_INIT_SECONDS");
    if (seconds) sleep((unsigned)atoi(seconds));
    const char *result = getenv("FAKE_CUDA_INIT_RESULT");
    if (result && atoi(result) != CUDA_SUCCESS) return atoi(result);
    read_devices();
    apply_visible_devices();
    if (visible_count == 0) return CUDA_ERROR_NO_DEVICE;
    initialized = 1;
    return CUDA_SUCCESS;
}

int cuDeviceGetCount(int *count) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    *count = visible_count;
    return CUDA_SUCCESS;
}

int cuDeviceGet(int *device, int ordinal) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= visible_count) return CUDA_ERROR_INVALID_DEVICE;
    *device = visible[ordinal];
    return CUDA_SUCCESS;
}

int cuDeviceGetPCIBusId(char *bus_id, int length, int device) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (device < 0 || device >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    if (!bus_ids[device][0]) return CUDA_ERROR_NOT_SUPPORTED;
    snprintf(bus_id, (size_t)length, "%s", bus_ids[device]);
    return CUDA_SUCCESS;
}

/* CUuuid: 16 bytes, the UUID's hex digits without "GPU-" and the dashes. */
int cuDeviceGetUuid_v2(unsigned char *uuid, int device) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (device < 0 || device >= device_count) return CUDA_ERROR_INVALID_DEVICE;
    const char *text = uuids[device];
    if (strncmp(text, "GPU-", 4) != 0) return CUDA_ERROR_NOT_SUPPORTED;
    int written = 0;
    for (const char *digit = text + 4; *digit && written < 16; digit++) {
        if (*digit == '-') continue;
        unsigned int byte;
        if (!digit[1] || sscanf(digit, "%2x", &byte) != 1) return CUDA_ERROR_NOT_SUPPORTED;
        uuid[written++] = (unsigned char)byte;
        digit++;
    }
    return written == 16 ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
}
