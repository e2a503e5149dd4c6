/* version.c — `clef --version`: the version, the commit the binary was built from and the GPU
 * architectures it holds code for (build/clef_version.h, written by cmake/version.cmake). */
#include <stdio.h>

#include "backend/cuda/cuda.h"
#include "cli/cli.h"
#include "clef_version.h"

int cli_version(FILE *f) {
    fprintf(f, "clef %s (commit %s)\n", CLEF_VERSION, CLEF_COMMIT);
    const char *archs = clef_cuda_built_archs();
    fprintf(f, "cuda: %s\n", archs[0] ? archs : "not built (CPU only)");
    return 0;
}
