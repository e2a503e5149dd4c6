/* bench_cuda.h — what the CUDA probes (stream_probe.cu, expert_gemm.cu)
 * share: CK(call), the check of every CUDA runtime call.  On an error it
 * prints "<program>: <file>:<line>: <CUDA error string>" to stderr and exits
 * with status 1 (a probe has nothing to clean up or retry).  Name the program
 * once per file with BENCH_CK_PROGRAM("name") after including this header. */
#ifndef CLEF_BENCH_CUDA_H
#define CLEF_BENCH_CUDA_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define BENCH_CK_PROGRAM(name) static const char *const bench_program = name;

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s: %s:%d: %s\n", bench_program, __FILE__, __LINE__, cudaGetErrorString(e_));           \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

#endif
