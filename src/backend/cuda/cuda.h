/* cuda.h — the CUDA backend: the op table of backend/backend.h on one NVIDIA
 * GPU (built for Hopper, sm_90a), BF16 weights resident on the device, f32
 * activations between ops.
 *
 * Numerics (tests/unit/test_cuda_ops.c states and checks the tolerances).
 * Three modes (backend/numerics.h); fast is the default.  The mode comes
 * from clef_cuda_options (a command's --numerics), else the environment
 * (CLEF_CUDA_PRECISE, else CLEF_CUDA_NUMERICS), else fast.
 *   - fast (the default; --numerics fast, CLEF_CUDA_NUMERICS=fast,
 *     CLEF_CUDA_PRECISE=0): activations rounded to bf16 (relative error
 *     ~2^-9 per input, ~3e-3 relative L2 on a product), single-MMA attention
 *     with bf16 Q, K, V, P.  On `small` (200 requests, H200) 91.0% top-1
 *     agreement with the CPU f32 answers, mean TV 0.0129: closer to f32
 *     than the reference's own bf16 deployment (84.7-87.1%, mean TV 0.016),
 *     the bar a default must clear (clef_numerics_bar).
 *   - balanced (--numerics balanced = CLEF_CUDA_PRECISE=dense,attention):
 *     precise dense products and attention, bf16 activations into the expert
 *     GEMMs (their fast-mode cost): 99.2% top-1 / mean TV 0.0015 on `small`.
 *   - precise (--numerics precise, CLEF_CUDA_PRECISE=1): f32-level
 *     agreement.  Every f32 activation row going into a weight product is
 *     split into hi = bf16(x) and lo = bf16(x - hi) (x = hi + lo to ~2^-17)
 *     and both halves are multiplied with the bf16 weights on the tensor
 *     cores with f32 accumulation, so products match f32 to ~1e-6 relative.
 *     The custom GEMM loads each weight tile once and feeds it to the hi and
 *     the lo MMA; dense products through cuBLASLt run the [hi; lo] rows as 2T
 *     stacked rows in one call and add the halves (ck_split_sum).  Attention
 *     (head_dim 64, 72 (padded to 80) or 128) runs on the tensor cores with
 *     Q, K, V and the probabilities split the same way: hi.hi + hi.lo +
 *     lo.hi per product (~1e-6 relative).  On `small`: 100% top-1, mean TV
 *     0.00013 (its bar: >= 99.5%, <= 0.001).
 *   CLEF_CUDA_PRECISE may also name parts: a comma list of "dense" (the
 *   matmul op), "experts" (the moe op), "attention"; the others are fast.
 *   CLEF_CUDA_PRECISE wins over CLEF_CUDA_NUMERICS.  An unknown value of
 *   a user setting (numerics, CLEF_CUDA_FP8_MMA, _GRAPHS, _PROFILE) makes
 *   clef_cuda_backend_create fail (500, naming the variable; cuda_env.h
 *   parses them).
 * Kernel switches (cuda_env.h clef_cuda_knobs; clef_cuda_options.knobs,
 * else the defaults: the backend does not read them from the environment;
 * test and bench programs do, by these names; which kernel runs is
 * cuda_select.h's choice from them and the device):
 *   CLEF_CUDA_TUNE (bits, default 7) picks kernel shapes of the precise
 *   mode, never values: 1 = 32-row expert tiles when the experts average
 *   <= 32 rows, 2 = one K/V buffer in the split attention (two blocks/SM),
 *   4 = 64-row instead of 128-row expert tiles for big batches
 *   (mma.sync kernel; the wgmma one: 0 = 64-row tiles always).
 *   CLEF_CUDA_WGMMA: 0 = expert GEMMs on the mma.sync kernel only, 1 = on
 *   the sm_90a wgmma kernel (cuda_wgmma.cu) at every size, 2 (default on
 *   sm_90a builds and compute capability 9.0) = wgmma from
 *   CLEF_CUDA_WGMMA_ROWS expert rows per pass (default 8000, 1,000 tokens
 *   x top-8, where the persistent kernel below on 128-row tiles takes 357
 *   us per layer fast and 454 precise against the TMA kernel's 433 fast
 *   (672 precise, an earlier session); at 2,400 rows the TMA kernel is
 *   faster, 332 vs 344 us fast; H200,
 *   bench/expert_gemm; from this threshold up to 8192 rows the wgmma passes
 *   use 128-row tiles; packed experts:
 *   CLEF_CUDA_QWGMMA_ROWS, default 8192); both kernels give bitwise the
 *   same sums, so the thresholds choose speed only.  Packed (quantized)
 *   experts follow the same rule on the wgmma variant of cuda_wgmma.cu
 *   (128-row tiles; NVFP4 in either layout, FP8 blocks with Bc % 64 == 0,
 *   INT4 reordered with G % 64 == 0; bitwise the results of cuda_qgemm.cu's
 *   kernels)
 *   CLEF_CUDA_QWGMMA: 0 = never, 1 (default) = NVFP4 and INT4 (FP8 stays
 *   on mma.sync, faster there on the H200), 2 = every format.
 *   CLEF_CUDA_WGMMA_WS: 1 (default on sm_90a builds and compute capability
 *   9.0) = the BF16 wgmma passes of 128-row tiles run on the persistent
 *   warp-specialised kernel (cuda_wgmma_ws.cu: one CTA per SM, a producer
 *   warpgroup of tensor copies and cp.async, two consumer warpgroups of
 *   m64n256k16), bitwise the wgmma kernel's sums: at 32,000 tokens fast
 *   2.69 + 1.49 ms per layer against 3.78 + 2.07 (H200); 2 = the same in
 *   CTA pairs that share each weight tile (TMA multicast; measured slower:
 *   3.57 + 2.15 ms); 0 = the wgmma kernel.
 *   CLEF_CUDA_TMA: 1 (default on sm_90a builds and compute capability 9.0)
 *   = the BF16 expert passes below the wgmma threshold run on the
 *   warp-specialised kernel (cuda_gemm.cu gemm_tma_kernel: weights through
 *   the tensor-copy engine, a loading warp beside the MMA warps), bitwise
 *   the mma.sync kernel's sums; 0 = the mma.sync kernel.
 *   CLEF_CUDA_FP8_MMA: 0 (default) = FP8-block experts as above (W8A16:
 *   weights decoded exactly to bf16); 1 = W8A8 on the FP8 tensor cores
 *   (cuda_fp8mma.cu; opt-in because it CHANGES NUMERICS): the expert input
 *   rows are quantized per token per 128 columns (s = amax / 448, s = 1
 *   where that is 0: an all-zero block or amax < ~2^-140; E4M3 of x / s, round to nearest even, saturating:
 *   clef_fp8_e4m3_encode bit for bit), gate/up run as wgmma e4m3 x e4m3 with
 *   f32 promotion per 128-K block (acc += part * a_scale * w_scale), the
 *   SwiGLU goes to bf16 rows, which are quantized the same way for the down
 *   product.  E4M3 has 4 significant bits, so each activation carries up to
 *   2^-4 relative rounding (~3% relative L2 on a product vs the f32 CPU
 *   result, the fast mode's ~0.3% being bf16's).  Results stay bitwise
 *   independent of batch composition (per-row quantization, one 128-row
 *   kernel shape at every pass size, fixed K order).  Applies to layers
 *   whose experts all have 128x128 blocks and hidden, inter % 128 == 0, on
 *   sm_90a builds and compute capability 9.0 (else ignored); the precise /
 *   fast expert setting does not apply to those layers.
 *   - Other head sizes use an f32 attention kernel in both modes.
 *   - Everything else (norms, RoPE, router softmax/top-k, SwiGLU, combine,
 *     head row ops) is f32 as on the CPU.
 * Determinism (backend.h): every output element has one fixed reduction
 * order that depends on its own row (and segment) only: the custom GEMM
 * tiles never split K, cuBLASLt split-K (below) has its split fixed per
 * weight shape and a fixed-order reduction, the expert combine sums in
 * ascending expert order, no float atomics.  A record gives bitwise the same
 * result alone or packed.
 *
 * Dense products use cuBLASLt with one algorithm fixed per weight shape,
 * timed once at 300 and 8192 rows (300 counting double), unless
 * CLEF_CUDA_GEMM=custom selects the hand-written tensor-core kernel for them
 * too.  The algorithm may split K (fixed split count; INPLACE, COMPUTE_TYPE
 * or OUTPUT_TYPE reduction, each checked on the GPU for bitwise row
 * independence first); CLEF_CUDA_LT_SPLITK=0 forbids that (the fallback),
 * =2 allows only split-K algorithms where a shape has any (tests).
 * CLEF_CUDA_LT_LOG=1 prints each shape's candidates and the pick.
 *
 * Quantized weights (src/quant: NVFP4 both forms, FP8 block, INT4 GPTQ sym /
 * asym) stay packed on the device (bytes + scales as in the checkpoint, ~1/4
 * of bf16 for NVFP4 / INT4) and are dequantized tile by tile in shared
 * memory (cuda_qgemm.cu: W4A16 / W8A16, the grouped experts and the matmul
 * op).  Weight values reach the tensor cores exactly (fp4 * fp8 scale; fp8;
 * nibble - zero); the NVFP4 global scale, FP8 block and INT4 group scales
 * multiply f32 partial sums, so the products carry the same activation
 * rounding as bf16 weights (~3e-3; ~1e-6 precise).  Shapes the kernels do
 * not tile (in % 16, INT4 group or FP8 block columns not a multiple of 16)
 * are refused with 500 "unsupported weight dtype on cuda".
 * INT4 is reordered once at upload (same size) so that each lane's 16-byte
 * chunk is its mma B fragments, dequantized in registers (kernel v3);
 * CLEF_CUDA_QGEMM_INT4=v2 (read when the backend is created) keeps the
 * checkpoint layout and the shared-memory kernel v2 instead: bitwise the
 * same results, slower; CLEF_CUDA_QGEMM_INT4=v3-2blk bounds v3's 32-row
 * tiles for 2 blocks per SM instead of 3 (a tuning A/B, same results).
 * NVFP4 likewise: its data and E4M3 group scales are reordered once at
 * upload (same size for in % 64 == 0 and out % 16 == 0, padded otherwise;
 * no copy of the checkpoint layout kept; the host arrays unchanged) into the
 * same B-fragment atoms plus 64-byte scale atoms, and decoded in registers by
 * kernel v3 (and by the wgmma variant for big passes) with v2's exact
 * fp4 * scale arithmetic; CLEF_CUDA_QGEMM_NVFP4=v2 (default v3; read when
 * the backend is created) keeps the checkpoint layout and kernel v2:
 * bitwise the same results.
 *
 * CUDA graphs: CLEF_CUDA_GRAPHS=1 (default) records the thinker's
 * text-only forward (embedding, every layer, final norm: ~850 launches)
 * as a CUDA graph the second time the same batch layout (token count and
 * record boundaries) comes with the same buffers, and replays it from the
 * third: one launch instead of ~850, the same kernels and arguments, so
 * bitwise the same results (test_cuda_golden).  Up to 16 layouts are kept
 * (least recently used dropped); a forward with media, per-layer hidden
 * states or profiling on runs plainly; 0 turns graphs off.
 *
 * When the library is built without CUDA (CMake CLEF_CUDA=OFF) these
 * functions still exist: clef_cuda_device_count returns 0 and
 * clef_cuda_backend_create fails with 500.
 */
#ifndef CLEF_BACKEND_CUDA_CUDA_H
#define CLEF_BACKEND_CUDA_CUDA_H

#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_env.h"
#include "backend/numerics.h"

/* Number of usable CUDA devices; 0 when the build has no CUDA, no driver is
 * loaded or no GPU is present (never fails). */
int clef_cuda_device_count(void);

/* Options of clef_cuda_backend_create_ex. */
typedef struct clef_cuda_options {
    int device;  /* CUDA device ordinal */
    int precise; /* 1 = precise numerics (split-bf16), 0 = fast (bf16); -1 = by `numerics` */
    clef_numerics numerics; /* with precise = -1: a mode (backend/numerics.h), or CLEF_NUMERICS_ENV (0) = from
                               the environment: CLEF_CUDA_PRECISE, else CLEF_CUDA_NUMERICS, else fast */
    int gemm;    /* dense products: 0 = per shape the faster of cuBLASLt and the custom kernel, 1 = custom kernel,
                    2 = cuBLASLt wherever it has a batch-invariant algorithm (tests);
                    -1 = from CLEF_CUDA_GEMM ("cublaslt" = 0 / "custom" = 1) */
    int profile; /* 1 = time every op with CUDA events (clef_cuda_profile_dump); -1 = from CLEF_CUDA_PROFILE */
    const clef_cuda_knobs *knobs; /* kernel switches (cuda_env.h; copied); NULL = the defaults.  The backend never
                                     reads them from the environment: test and bench programs set them */
} clef_cuda_options;

/* A CUDA backend on device `device` in numerics `numerics` (CLEF_NUMERICS_ENV:
 * from the environment, else fast), other options from the environment.
 * Returns NULL + err (500 naming the CUDA error) when the device cannot be
 * used.  Release with be->ops->destroy(be). */
clef_backend *clef_cuda_backend_create(int device, clef_numerics numerics, clef_err *err);
clef_backend *clef_cuda_backend_create_ex(const clef_cuda_options *opt, clef_err *err);

/* Sets one kernel switch (cuda_env.h: NAME as its variable, e.g. "CLEF_CUDA_QGEMM_INT4", "v3") for every
 * backend clef_cuda_backend_create makes afterwards in this process (`clef bench --kernel`: A/B runs; the
 * switches give the default's results).  Not thread-safe: call before any backend is made.  Returns 0, or
 * -1 with err (400 param "kernel" for an unknown name; 500 "settings" for a bad value, cuda_env.h's
 * messages).  Works in a build without CUDA too (the switch then has no backend to reach). */
int clef_cuda_set_switch(const char *name, const char *value, clef_err *err);

/* The device and the settings that shape results or speed, e.g. "NVIDIA
 * H200, 132 SMs, 139.8 GiB, CUDA runtime 13.0, precise, cuBLASLt dense GEMM,
 * wgmma experts from 8000 rows (packed 8192), persistent wgmma experts, TMA expert kernel below"
 * (+ ", CUDA graphs off", the
 * W8A8 or attention-kernel choice where set), into buf (cap bytes,
 * truncated); "" when `be` is not a CUDA backend. */
void clef_cuda_describe(clef_backend *be, char *buf, size_t cap);

/* Which kernel family the device runs (docs/DESIGN.md "GPU architectures"):
 * "hopper" (an sm_90a build on a compute capability 9.0 device: the wgmma,
 * tensor-copy and FP8 wgmma kernels) or "portable" (mma.sync and cp.async,
 * every device from sm_80: Ampere, Ada, Blackwell, or Hopper without sm_90a
 * code); "cpu" when `be` is not a CUDA backend.  A static string. */
const char *clef_cuda_kernel_path(clef_backend *be);

/* The GPU architectures this binary holds code for, as `clef --version`
 * prints them ("sm_80 sm_86 sm_89 sm_90a sm_100 sm_120 compute_120": sm_ =
 * machine code, compute_ = PTX the driver compiles); "" without CUDA. */
const char *clef_cuda_built_archs(void);

/* The numerics a CUDA backend runs, as named: "fast", "balanced", "precise",
 * or the precise parts of a CLEF_CUDA_PRECISE list ("dense,experts", ...);
 * "f32" for any other backend (the CPU). */
const char *clef_numerics_of(clef_backend *be);

/* Peak device memory taken through this backend (weights, workspaces,
 * scratch), and the driver's view of used memory on the device, in bytes. */
size_t clef_cuda_peak_bytes(clef_backend *be);
/* Streamed experts (backend.h experts_stream_begin; cuda_place.c): layers
 * streamed, copies made and bytes copied host -> device since creation
 * (zeros without CUDA). */
void clef_cuda_stream_stats(clef_backend *be, uint64_t *layers, uint64_t *copies, uint64_t *bytes);
/* The pinned host -> device copy rate, GB/s (1e9 bytes), timed on the first
 * streamed layer's image into its slot (best of 5); 0 when nothing is
 * streamed or without CUDA.  Leaves the slot to be refilled by the next
 * forward. */
double clef_cuda_pinned_copy_gbps(clef_backend *be);
size_t clef_cuda_used_bytes(clef_backend *be);
/* Bytes of weight memory taken in the arenas (every weight uploaded, 256-byte
 * aligned; packed quantized weights count their packed bytes, scales and
 * zeros, see cu_weight_init_packed), without the arenas' unused tails. */
size_t clef_cuda_weight_bytes(clef_backend *be);

/* With profiling on: per-op count, total and mean milliseconds since the
 * last reset, largest first, as a table on `f` (NULL: just reset); then
 * resets.  Waits for the device.  No-op without profiling. */
void clef_cuda_profile_dump(clef_backend *be, FILE *f);

/* Turn per-op timing on or off (no-op on other backends). */
void clef_cuda_set_profile(clef_backend *be, int on);

/* CUDA graphs (CLEF_CUDA_GRAPHS, default 1): the thinker's text-only
 * forwards go through graph_run (backend.h), keyed by the batch layout (token
 * count, record boundaries) and the buffers' addresses.  Counts since the
 * backend was made: forwards captured into a graph, forwards replayed from
 * one, and captures that failed (those forwards ran as plain launches; the
 * key is not tried again).  Zeros on other backends.  Any pointer may be NULL. */
void clef_cuda_graph_stats(clef_backend *be, long *captures, long *replays, long *failed);

/* Whether `be` is a CUDA backend. */
int clef_backend_is_cuda(const clef_backend *be);

/* The W8A8 path's activation quantizer (CLEF_CUDA_FP8_MMA=1; ck_fp8_quant_rows
 * in cuda_kernels.h), exposed for tests: x [rows, K] device rows (f32, or
 * bf16 when x_bf16) -> q E4M3 bytes [rows, K] and s f32 scales
 * [rows, K / 128] (device, q 4-byte aligned), per row per 128 columns:
 * s = amax / 448 (1 when that is 0), q = clef_fp8_e4m3_encode(x / s).
 * K % 128 == 0.  Enqueued on the backend's stream (a download waits for it).
 * Returns 0, or -1 + err (500) on a bad shape, a CUDA error, a backend that
 * is not CUDA or a build without CUDA. */
int clef_cuda_fp8_quant_rows(clef_backend *be, const void *x, int x_bf16, int64_t rows, int64_t K, uint8_t *q, float *s,
                             clef_err *err);

#endif
