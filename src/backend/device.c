/* device.c — device string -> backend (see device.h). */
#include "backend/device.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cuda/cuda.h"

const char *clef_backend_auto_name(void) {
    const char *env = getenv("CLEF_DEVICE");
    if (env && *env) return env;
    return clef_cuda_device_count() > 0 ? "cuda" : "cpu";
}

clef_backend *clef_backend_open(const char *device, int n_threads, clef_numerics numerics, clef_err *err) {
    if (!device || !*device) device = clef_backend_auto_name();
    if (strcmp(device, "cpu") == 0) return clef_backend_cpu_create(n_threads, err);
    if (strncmp(device, "cuda", 4) == 0 && (device[4] == '\0' || device[4] == ':')) {
        long n = 0;
        if (device[4] == ':') {
            char *end;
            errno = 0;
            n = strtol(device + 5, &end, 10);
            if (errno || end == device + 5 || *end || n < 0 || n > 1023) {
                clef_fail(err, 500, CLEF_E_INTERNAL, "device", "bad device '%s' (want cpu, cuda or cuda:N)", device);
                return NULL;
            }
        }
        return clef_cuda_backend_create((int)n, numerics, err);
    }
    clef_fail(err, 500, CLEF_E_INTERNAL, "device", "unknown device '%s' (want cpu, cuda or cuda:N)", device);
    return NULL;
}
