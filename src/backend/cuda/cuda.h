/* cuda.h — the CUDA backend: the op table of backend/backend.h on one NVIDIA
 * GPU (built for Hopper, sm_90), BF16 weights resident on the device, f32
 * activations between ops.
 *
 * Numerics (tests/unit/test_cuda_ops.c states and checks the tolerances):
 *   - Weight products (matmul, the grouped expert GEMMs) round the f32
 *     activation rows to bf16 and multiply them with the bf16 weights on the
 *     tensor cores with f32 accumulation (relative error ~2^-9 per input, so
 *     ~3e-3 relative L2 on a product).  With CLEF_CUDA_PRECISE=1 in the
 *     environment (or `precise` below) each activation row is split into
 *     hi = bf16(x) and lo = bf16(x - hi) and both are multiplied (x = hi + lo
 *     to ~2^-17): products then match f32 to ~1e-6, at twice the work.
 *     CLEF_CUDA_PRECISE may also name parts: a comma list of "dense" (the
 *     matmul op), "experts" (the moe op), "attention" (f32 kernel).
 *   - Attention runs on the tensor cores (bf16 Q, K, V, P; f32 scores,
 *     softmax and accumulation) for head_dim 64 and 128; other head sizes and
 *     the precise mode use an f32 kernel.
 *   - Everything else (norms, RoPE, router softmax/top-k, SwiGLU, combine,
 *     head row ops) is f32 as on the CPU.
 * Determinism (backend.h): every output element has one fixed reduction
 * order that depends on its own row (and segment) only: GEMM tiles never
 * split K, the expert combine sums in ascending expert order, no float
 * atomics.  A record gives bitwise the same result alone or packed.
 *
 * Dense products use cuBLASLt with one algorithm fixed per weight shape
 * (never split-K), unless CLEF_CUDA_GEMM=custom selects the hand-written
 * tensor-core kernel for them too.  Quantized weights (src/quant) are not
 * supported on CUDA (500 "unsupported weight dtype on cuda").
 *
 * When the library is built without CUDA (CMake CLEF_CUDA=OFF) these
 * functions still exist: clef_cuda_device_count returns 0 and
 * clef_cuda_backend_create fails with 500.
 */
#ifndef CLEF_BACKEND_CUDA_CUDA_H
#define CLEF_BACKEND_CUDA_CUDA_H

#include <stdio.h>

#include "backend/backend.h"

/* Number of usable CUDA devices; 0 when the build has no CUDA, no driver is
 * loaded or no GPU is present (never fails). */
int clef_cuda_device_count(void);

/* Options of clef_cuda_backend_create_ex. */
typedef struct clef_cuda_options {
    int device;  /* CUDA device ordinal */
    int precise; /* 1 = split-bf16 activations and f32 attention (see above); -1 = from CLEF_CUDA_PRECISE */
    int gemm;    /* dense products: 0 = cuBLASLt, 1 = custom kernel; -1 = from CLEF_CUDA_GEMM ("cublaslt"/"custom") */
    int profile; /* 1 = time every op with CUDA events (clef_cuda_profile_dump); -1 = from CLEF_CUDA_PROFILE */
} clef_cuda_options;

/* A CUDA backend on device `device` with the defaults (options from the
 * environment).  Returns NULL + err (500 naming the CUDA error) when the
 * device cannot be used.  Release with be->ops->destroy(be). */
clef_backend *clef_cuda_backend_create(int device, clef_err *err);
clef_backend *clef_cuda_backend_create_ex(const clef_cuda_options *opt, clef_err *err);

/* "NVIDIA H200, 132 SMs, 139.8 GiB, CUDA 13.0" into buf (cap bytes); "" when
 * `be` is not a CUDA backend. */
void clef_cuda_describe(clef_backend *be, char *buf, size_t cap);

/* Peak device memory taken through this backend (weights, workspaces,
 * scratch), and the driver's view of used memory on the device, in bytes. */
size_t clef_cuda_peak_bytes(clef_backend *be);
size_t clef_cuda_used_bytes(clef_backend *be);

/* With profiling on: per-op count, total and mean milliseconds since the
 * last reset, largest first, as a table on `f` (NULL: just reset); then
 * resets.  Waits for the device.  No-op without profiling. */
void clef_cuda_profile_dump(clef_backend *be, FILE *f);

/* Turn per-op timing on or off (no-op on other backends). */
void clef_cuda_set_profile(clef_backend *be, int on);

/* Whether `be` is a CUDA backend. */
int clef_backend_is_cuda(const clef_backend *be);

#endif
