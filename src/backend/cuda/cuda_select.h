/* cuda_select.h — which CUDA kernel (and tile) runs each grouped expert
 * product and each attention segment: pure functions of the device's
 * capabilities, the kernel switches (cuda_env.h clef_cuda_knobs: defaults
 * unless a test or bench program sets them), the numerics' split and the
 * pass's shape.  Plain C with no CUDA dependency, compiled in every build,
 * so the choice for every device generation is tested in CI without a GPU
 * (tests/unit/test_cuda_select.c); the backend (cuda_backend.c) only asks.
 *
 * Every kernel these functions choose between gives bitwise the same sums
 * for a row (same 16-wide K chunks in the same order, hi then lo; the
 * attention variants within the stated tolerances, and a segment's variant
 * depends on its own length only), so a choice by pass size changes speed,
 * never a record's answer: batches stay invariant. */
#ifndef CLEF_BACKEND_CUDA_SELECT_H
#define CLEF_BACKEND_CUDA_SELECT_H

#include <stdint.h>

#include "backend/cuda/cuda_env.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Packed weight formats of the expert kernels (ck_qgemm_args.qtype). */
enum { CK_QT_NVFP4 = 1, CK_QT_FP8 = 2, CK_QT_INT4 = 3 };

/* Rows per tile of the BF16 expert kernels for ck_gemm_args.big: 0 -> 64, 1 -> 128, 2 -> 32. */
int ck_gemm_bm(int big);

/* Rows per tile of the packed kernels (ck_qgemm) for a pass of `rows` expert rows over `n_experts`:
 * 32 while the experts average <= 32 rows (weight streaming), 128 for NVFP4 from 8,192 rows (no fold
 * accumulators: room for the bigger tile), else 64. */
int ck_qgemm_bm(int qtype, int64_t rows, int64_t n_experts);

/* What the device and the binary can run. */
typedef struct ck_caps {
    int cc_major, cc_minor; /* the device's compute capability (e.g. 9.0 H100/H200, 8.9 L40S, 12.0 RTX 50xx) */
    int sm90a_built;        /* the binary holds the sm_90a kernels (ck_wgmma_built) */
    int sms;                /* streaming multiprocessors (132 on an H200; 0: unknown) */
} ck_caps;

/* The Hopper-only kernels (wgmma, the tensor-copy engine, FP8 wgmma) run: an
 * sm_90a build on a compute capability 9.0 device (sm_90a code runs on 9.0
 * only, not on 10.x or 12.x). */
int ck_caps_hopper(const ck_caps *c);

/* BF16 expert kernels (cuda_kernels.h). */
typedef enum ck_experts_kernel {
    CK_EXPERTS_MMA = 0,   /* ck_gemm: mma.sync, cp.async; every device from sm_80 */
    CK_EXPERTS_TMA = 1,   /* ck_gemm_tma: the same MMAs fed by a loading warp and the tensor-copy engine */
    CK_EXPERTS_WGMMA = 2, /* ck_gemm_wgmma: Hopper warpgroup MMAs */
    CK_EXPERTS_WGMMA_WS = 3,       /* ck_gemm_wgmma_ws: the same MMAs, persistent and warp-specialised */
    CK_EXPERTS_WGMMA_WS_PAIRS = 4, /* ck_gemm_wgmma_ws_opts(CK_WS_PAIRS): in CTA pairs sharing weight tiles */
} ck_experts_kernel;

typedef struct ck_experts_pick {
    ck_experts_kernel kernel;
    int big; /* ck_gemm_args.big: tile rows ck_gemm_bm(big) (0: 64, 1: 128, 2: 32) */
    int bm;  /* those rows: the permutation plan's tile */
} ck_experts_pick;

/* The kernel and tile of one BF16 expert pass of `rows` expert rows (tokens
 * x top-k) over `n_experts` experts of hidden x inter, activations split in
 * `split` bf16 halves (1 fast, 2 precise); `tmaps_ok`: the layer's tensor
 * maps exist (the TMA kernel needs them).  Rules (the fastest measured on
 * the H200, docs/BENCHMARKS.md):
 *   wgmma when the device is Hopper, knobs->wgmma is 1, or 2 with rows >=
 *     knobs->wgmma_rows (default 8,000), and hidden, inter % 64 == 0;
 *     128-row tiles from min(wgmma_rows, 8,192) rows (knobs->tune != 0),
 *     else 64; the 128-row tiles on the persistent warp-specialised form
 *     (knobs->wgmma_ws 1; 2: in CTA pairs) where the tensor maps exist;
 *   else mma.sync / TMA: 128-row tiles from 8,192 rows (precise with tune
 *     bit 4: 64), 32-row tiles for a precise pass averaging <= 32 rows per
 *     expert (tune bit 1), else 64; the TMA kernel (Hopper, knobs->tma,
 *     tmaps_ok) for the 32- and 64-row tiles. */
ck_experts_pick ck_pick_experts(const ck_caps *caps, const clef_cuda_knobs *k, int64_t rows, int64_t n_experts,
                                int64_t hidden, int64_t inter, int split, int tmaps_ok);

/* Packed (quantized) expert kernels. */
typedef enum ck_packed_kernel {
    CK_PACKED_MMA = 0,    /* ck_qgemm (v2, or v3 for reordered INT4 / NVFP4): every device from sm_80 */
    CK_PACKED_WGMMA = 1,  /* ck_qgemm_wgmma: decoded tiles on Hopper warpgroup MMAs, bitwise ck_qgemm */
    CK_PACKED_FP8MMA = 2, /* ck_fp8mma: W8A8 on Hopper's FP8 tensor cores (opt-in: changes numerics) */
    CK_PACKED_TMA = 3,    /* ck_qgemm with ck_qgemm_args.tma: v4, v3's warps fed by a loading warp (Hopper bulk
                           * copies), bitwise v3; ck_qgemm runs v3 where v4 does not fit (K % 128) */
    CK_PACKED_SKINNY = 4, /* ck_qgemm with ck_qgemm_args.skinny: v5 (swapped operands, two stripes per warp),
                           * bitwise v3, every device from sm_80; ck_qgemm runs v3 where v5 does not fit */
} ck_packed_kernel;

typedef struct ck_packed_pick {
    ck_packed_kernel kernel;
    int bm; /* tile rows (ck_qgemm_args.bm and the plan's tile) */
} ck_packed_pick;

/* The kernel and tile of one packed expert pass: `qtype` a CK_QT_* format,
 * activations in `split` bf16 halves (1 fast, 2 precise), `wgmma_fits` both
 * products fit ck_qgemm_wgmma (ck_qgemm_wgmma_fits), `fp8_mma` the user
 * asked for W8A8 (CLEF_CUDA_FP8_MMA) and `fp8mma_fits` the layer's FP8
 * blocks fit ck_fp8mma.  W8A8 when asked for and it fits on Hopper (128-row
 * tiles); else wgmma (128 rows) by the BF16 rule with knobs->qwgmma_rows,
 * for NVFP4 and INT4 (knobs->qwgmma = 1) or every format (2); else
 * ck_qgemm_bm's tile, on v4 where ck_packed_tma says, else ck_qgemm's v3 /
 * v2; but kernel v5 (CK_PACKED_SKINNY, 32-row tiles) for INT4 / NVFP4 passes
 * with split 1 averaging <= knobs->v5_rows rows per expert (knobs->int4 = 6,
 * knobs->nvfp4 = 5: the defaults), ahead of the wgmma kernel (at the default
 * 1024 every fast INT4 / NVFP4 pass of the thinker: a pass holds at most
 * 8,192 tokens, 512 rows per expert). */
ck_packed_pick ck_pick_packed(const ck_caps *caps, const clef_cuda_knobs *k, int qtype, int64_t rows,
                              int64_t n_experts, int split, int wgmma_fits, int fp8_mma, int fp8mma_fits);
/* Whether a packed product of `qtype` with `bm`-row tiles that would run ck_qgemm (mma.sync) runs it as
 * kernel v4 (ck_qgemm_args.tma = 1): Hopper (ck_caps_hopper), INT4 with knobs->int4 = 5 or NVFP4 with
 * knobs->nvfp4 = 4 (opt-in A/B switches: v4 measured slower than v3, docs/BENCHMARKS.md), bm 32 or 64.  ck_pick_packed's CK_PACKED_TMA and the dense packed
 * matmul both ask this. */
int ck_packed_tma(const ck_caps *caps, const clef_cuda_knobs *k, int qtype, int bm);

/* The attention kernel variant of a segment of `seg_len` queries (1 = v1,
 * 2 = v2, 3 = v2w, 4 = v2s; ck_attn_tc_rows gives their tile rows):
 * knobs->attn when set (v2s: v2 unless split is 1); v1 without a positive
 * softmax scale (`scale_ok` 0); else v2, except v2w for precise (split 2)
 * segments longer than CK_ATTN_SHORT. */
enum { CK_ATTN_SHORT = 512 };
int ck_pick_attention(const clef_cuda_knobs *k, int split, int64_t seg_len, int scale_ok);

/* Whether a fast-mode (split 1) call whose v2 segments make `blocks` blocks of 128-row tiles (tiles x
 * query heads) runs them as v2s instead (64-row blocks on the same 32-key tiles: bitwise v2, so the
 * choice may depend on the whole call): with the default switch, when those blocks are fewer than
 * CK_ATTN_V2S_PER_SM per SM of the device's `sms` (two v2 blocks fit an SM: a 300-token record's 96
 * blocks leave a third of an H200 idle and put 128 rows' work on each busy SM). */
enum { CK_ATTN_V2S_PER_SM = 2 };
int ck_attention_v2s(const clef_cuda_knobs *k, int split, int64_t blocks, int sms);

/* The attention kernel's K/V split: split, or 3 (one K/V buffer, two blocks
 * per SM) for precise attention with tune bit 2. */
int ck_attention_ksplit(const clef_cuda_knobs *k, int split);

#ifdef __cplusplus
}
#endif

#endif
