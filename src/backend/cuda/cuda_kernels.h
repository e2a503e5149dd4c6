/* cuda_kernels.h — the CUDA kernels of the CUDA backend behind plain C
 * launchers (shared by the .cu files, compiled by nvcc, and cuda_backend.c,
 * compiled by the C compiler).  Every launcher enqueues work on `st` and
 * returns the launch's cudaError_t (cudaSuccess, or the error of the launch;
 * faults inside a kernel surface at the next synchronising call).
 *
 * Shapes are in elements; all pointers are device memory unless marked
 * (host).  bf16 values travel as uint16_t so this header stays plain C.
 */
#ifndef CLEF_BACKEND_CUDA_KERNELS_H
#define CLEF_BACKEND_CUDA_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_select.h" /* CK_QT_*, ck_gemm_bm, ck_qgemm_bm */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- activations to bf16 ------------------------------------------------ */

/* dst[r, 0..K) = bf16(x[r * ldx + k]) (round to nearest even) for r < rows.
 * With split = 2 each dst row holds 2K values: [hi | lo], hi = bf16(x),
 * lo = bf16(x - hi).  dst rows are K * split apart.  K % 8 == 0 keeps every
 * dst row 16-byte aligned (needed by the GEMM loads). */
cudaError_t ck_rows_to_bf16(const float *x, int64_t rows, int64_t K, int64_t ldx, uint16_t *dst, int split,
                            cudaStream_t st);

/* Up to three ck_rows_to_bf16 conversions (same split) in one launch: part
 * i converts rows [0, p[i].rows) of p[i].K floats, p[i].ldx apart, into
 * p[i].dst; bitwise the separate calls. */
typedef struct ck_rows_bf16_part {
    const float *x;
    int64_t rows, K, ldx;
    uint16_t *dst;
} ck_rows_bf16_part;
typedef struct ck_rows_bf16_job {
    ck_rows_bf16_part p[3];
} ck_rows_bf16_job;
cudaError_t ck_rows_to_bf16_multi(const ck_rows_bf16_job *jobs, int n, int split, cudaStream_t st);

/* ---- tensor-core GEMM (mma.sync m16n8k16 bf16, f32 accumulation) --------- */

/* What a GEMM launch computes.
 *   DENSE:  Y[r, n] = A[r] . W[n] (+ bias[n]) for r < M, n < N.
 *   GATEUP: grouped over experts; tile t covers permuted rows
 *           [tile_row0[t], min(tile_row0[t] + BM, expert_end[e])) of expert
 *           e = tile_expert[t]; A row of permuted row p is row_src[p];
 *           H[p, j] = silu(G) * U with G = A . gate_e[j], U = A . up_e[j],
 *           j < N (the intermediate size), stored bf16 ([hi | lo] rows of
 *           2N when split = 2).
 *   DOWN:   grouped as GATEUP with A row p = p: Y[p, n] = A[p] . down_e[n].
 * Every output element is one dot product over K in ascending 16-wide
 * chunks: its value never depends on M, the tile it lands in or the rows
 * packed around it. */
typedef enum ck_gemm_mode { CK_GEMM_DENSE = 0, CK_GEMM_GATEUP = 1, CK_GEMM_DOWN = 2 } ck_gemm_mode;

/* An opaque CUDA tensor map (CUtensorMap: 128 bytes, 64-byte aligned). */
typedef struct ck_tmap {
#ifdef __cplusplus
    alignas(64)
#else
    _Alignas(64)
#endif
        unsigned char opaque[128];
} ck_tmap;

typedef struct ck_gemm_args {
    ck_gemm_mode mode;
    const uint16_t *A;  /* bf16 activations, rows of lda = K * split elements */
    int64_t lda;
    int64_t K;          /* weight columns (K % 8 == 0) */
    int split;          /* 1, or 2 = A rows are [hi | lo]: each weight tile is loaded once and multiplied
                           with both halves (hi then lo into one f32 accumulator, per 16-wide K chunk) */
    int64_t N;          /* output columns (DENSE/DOWN: weight rows; GATEUP: intermediate size) */
    /* DENSE */
    const uint16_t *W;  /* [N, K] */
    int64_t M;          /* rows of A / Y */
    const float *bias;  /* [N] or NULL */
    /* grouped (GATEUP, DOWN) */
    const uint16_t *const *W0; /* [E] gate (GATEUP) or down (DOWN) weight of each expert */
    const uint16_t *const *W1; /* [E] up weight (GATEUP) */
    const int32_t *tile_expert, *tile_row0, *expert_end, *n_tiles; /* from ck_moe_plan */
    int64_t max_tiles;  /* grid bound: ceil(rows / BM) + E */
    const int32_t *row_src; /* GATEUP: A row of each permuted row */
    /* outputs */
    float *Y;           /* DENSE, DOWN */
    int64_t ldy;
    uint16_t *H;        /* GATEUP: [rows, N * split] bf16 */
    int big;            /* tile shape: 0 = 64x128 (few rows), 1 = 128x128 (many rows), 2 = 32x128 (a few
                           rows per expert; 4 pipeline stages also when split); same results */
    /* ck_gemm_tma only: device array of ck_tmap (ck_tmap_bf16, box_rows 64 for GATEUP, 128 for DOWN),
     * GATEUP [gate E | up E], DOWN [down E], of the same weights as W0 / W1; n_experts = E */
    const ck_tmap *wmaps;
    int64_t n_experts;
} ck_gemm_args;

/* Encodes into *m the 2-D tensor map of a bf16 weight [rows, cols] at device
 * address base (row-major, cols % 8 == 0, 16-byte aligned) for boxes of
 * box_rows rows x 64 columns with the 128-byte swizzle (gemm_tma_kernel's
 * weight tiles); host code, through the driver's cuTensorMapEncodeTiled.
 * cudaErrorNotSupported where the build lacks sm_90a or the driver the
 * function, cudaErrorInvalidValue on other shapes. */
cudaError_t ck_tmap_bf16(ck_tmap *m, const void *base, int64_t rows, int64_t cols, int box_rows);

/* The grouped modes of ck_gemm (GATEUP, DOWN) with big = 2 (32-row tiles) or
 * 0 (64-row tiles) on the warp-specialised kernel (cuda_gemm.cu,
 * gemm_tma_kernel: the weights through the tensor-copy engine, a loading
 * warp beside the 8 MMA warps): same arguments plus wmaps / n_experts,
 * bitwise ck_gemm's results.  Needs K % 8 == 0, lda % 8 == 0, a 16-byte
 * aligned A and a compute capability 9.0 device; cudaErrorNotSupported
 * where the build lacks sm_90a (ck_wgmma_built() == 0: the same build
 * condition), cudaErrorInvalidValue on other arguments. */
cudaError_t ck_gemm_tma(const ck_gemm_args *a, cudaStream_t st);

cudaError_t ck_gemm(const ck_gemm_args *a, cudaStream_t st);

/* 1 when this build holds the sm_90a warpgroup-MMA kernels of ck_gemm_wgmma
 * (CMake's CUDA architectures include 90a), else 0. */
int ck_wgmma_built(void);

/* cudaSuccess when the binary holds code the current device can run (its
 * machine code, or PTX the driver compiles for it): the attributes of one
 * kernel; cudaErrorNoKernelImageForDevice (or another error) when not. */
cudaError_t ck_image_check(void);

/* The grouped modes of ck_gemm (GATEUP, DOWN) on Hopper warpgroup MMAs
 * (wgmma.mma_async, cuda_wgmma.cu): same arguments, same results contract
 * (one fixed-order sum over K per element, hi then lo per 16-wide chunk).
 * big = 0: 64-row tiles, 1: 128-row tiles (ck_gemm_bm(big) rows: the plan of
 * ck_moe_plan must use the same BM).  Needs K >= 64, K % 64 == 0, lda % 8 == 0 and,
 * for DOWN, an even ldy and 8-byte aligned Y; a device of compute
 * capability 9.0.  cudaErrorNotSupported when the build lacks sm_90a,
 * cudaErrorInvalidValue on other shapes. */
cudaError_t ck_gemm_wgmma(const ck_gemm_args *a, cudaStream_t st);

/* ck_gemm_wgmma's grouped products with 128-row tiles (big = 1: the plan of
 * ck_moe_plan with BM = 128) on the persistent warp-specialised kernel
 * (cuda_wgmma_ws.cu: one CTA per SM walking 128 x 256 output tiles, a
 * producer warpgroup loading the weights by tensor copies from wmaps and the
 * activation rows by cp.async, two consumer warpgroups of m64n256k16 MMAs):
 * same arguments plus wmaps / n_experts (ck_gemm_tma's maps: GATEUP boxes of
 * 64 rows [gate E | up E], DOWN 128 rows), bitwise ck_gemm_wgmma's results.
 * Needs K >= 64, K % 64 == 0, lda % 8 == 0, a 16-byte aligned A, for DOWN an
 * even ldy and 8-byte aligned Y, and a compute capability 9.0 device.
 * cudaErrorNotSupported when the build lacks sm_90a, cudaErrorInvalidValue
 * on other arguments. */
cudaError_t ck_gemm_wgmma_ws(const ck_gemm_args *a, cudaStream_t st);
/* ck_gemm_wgmma_ws in a variant (same results, same requirements; one of):
 *   0            ck_gemm_wgmma_ws;
 *   CK_WS_PAIRS  clusters of two CTAs on pairs of m-tiles that share a weight tile, each CTA copying
 *                half of it into both (TMA multicast: half the weight traffic from L2);
 *   CK_WS_NOFENCE  without the consumers' proxy fence between the cp.async rows and the wgmma reads
 *                (bench/expert_gemm's A/B of what the fence costs; not for the backend).
 * cudaErrorInvalidValue for other opts. */
enum { CK_WS_NOFENCE = 1, CK_WS_PAIRS = 2 };
cudaError_t ck_gemm_wgmma_ws_opts(const ck_gemm_args *a, int opts, cudaStream_t st);

/* ---- packed quantized weights (cuda_qgemm.cu) ---------------------------- */

/* Formats (the values of clef_wqtype in quant/qweight.h). */

/* One packed weight [N rows, K cols] on the device, laid out as in the
 * checkpoint (quant/qweight.h):
 *   NVFP4: q u8 [N, K/2] (low nibble = even column), scale FP8 E4M3 [N, K/16],
 *          global f32 (divisor or multiplier: ck_qgemm_args.global_div);
 *   FP8:   q FP8 E4M3 [N, K], scale f32 [ceil(N/Br), ceil(K/Bc)];
 *   INT4:  q u32 [K/8, N], scale f16 [K/G, N], zeros u32 [K/G, N/8] or NULL
 *          (symmetric: zero 8).
 * or, with ck_qgemm_args.int4_reordered / nvfp4_reordered, INT4 q / NVFP4 q
 * and scale in the reordered layouts of cuda_qbits.h (ck_int4_reorder,
 * ck_nvfp4_reorder).
 * Every array starts 256-byte aligned and is readable up to a multiple of 4
 * bytes past its end (NVFP4 scales are fetched as aligned words). */
typedef struct ck_qmat {
    const void *q;
    const void *scale;
    const void *zeros;
    float global;
    int32_t pad_;
} ck_qmat;

/* A product with packed weights: the modes and tile plan of ck_gemm_args
 * (grouped: the plan of ck_moe_plan with BM = ck_qgemm_bm()); W0/W1 are
 * device arrays [E] of ck_qmat (gate/up for GATEUP, down for DOWN); DENSE
 * uses W.  K % 16 == 0; INT4: G % 16 == 0, N % 8 == 0; FP8: Bc % 16 == 0.
 * Every output element is one fixed-order sum over K (no split-K, no
 * atomics): bitwise independent of the rows around it.  Numerics: see
 * cuda_qgemm.cu (weights exact in bf16, scales applied in f32). */
typedef struct ck_qgemm_args {
    ck_gemm_mode mode;
    int qtype;          /* CK_QT_* */
    int global_div;     /* NVFP4: 1 = y = sum / global (compressed-tensors), 0 = sum * global (ModelOpt) */
    int has_zeros;      /* INT4: 1 = asymmetric (every matrix has zeros), 0 = symmetric */
    int64_t group;      /* INT4: G */
    int64_t block_r, block_c; /* FP8 */
    const uint16_t *A;  /* bf16 activations, rows of lda = K * split */
    int64_t lda;
    int64_t K;
    int split;
    int64_t N;
    ck_qmat W;          /* DENSE */
    int64_t M;          /* DENSE rows */
    const ck_qmat *W0, *W1; /* grouped: device [E] */
    const int32_t *tile_expert, *tile_row0, *expert_end, *n_tiles;
    int64_t max_tiles;
    const int32_t *row_src; /* GATEUP */
    float *Y;           /* DENSE (no bias: add it with ck_add_bias), DOWN */
    int64_t ldy;
    uint16_t *H;        /* GATEUP: [rows, N * split] bf16 */
    int bm;             /* tile rows: ck_qgemm_bm (the plan's BM for grouped launches) */
    int int4_reordered; /* INT4: 1 = every q is in the reordered layout of ck_int4_reorder (kernel v3,
                           registers), 0 = the GPTQ layout (kernel v2); bitwise the same results;
                           2 = as 1 with 32-row tiles register-bounded for 2 blocks/SM instead of 3 */
    int nvfp4_reordered; /* NVFP4: 1 = every q and scale is in the reordered layout of ck_nvfp4_reorder
                            (kernel v3, registers), 0 = the checkpoint layout (kernel v2); bitwise the
                            same results */
    int tma;            /* 1 = kernel v4 (cuda_qgemm.cu: v3 fed by a loading warp, Hopper bulk copies;
                           bitwise v3) where it fits: reordered INT4 / NVFP4, bm 32 or 64, K % 128 == 0,
                           lda % 8 == 0, A 16-byte aligned (else v3).  Set only on a Hopper device with an
                           sm_90a build (ck_packed_tma) */
    int skinny;         /* 1 = kernel v5 (cuda_qgemm.cu: swapped operands, two stripes per warp, the SwiGLU in
                           registers; bitwise v3) where it fits: grouped, split 1, bm 32, reordered INT4 / NVFP4,
                           lda % 8 == 0, A 16-byte aligned (else v3 / v4).  Any device from sm_80 */
} ck_qgemm_args;

/* (Rows per M tile of the packed-weight GEMM: ck_qgemm_bm, cuda_select.h.  Every
 * shape gives bitwise the same results, so the choice may depend on the batch.) */

cudaError_t ck_qgemm(const ck_qgemm_args *a, cudaStream_t st);

/* 1 when the grouped product a (mode, K, N, lda, split and the format
 * fields; bm, pointers and plan not looked at) can run on ck_qgemm_wgmma:
 * the build holds sm_90a code, GATEUP or DOWN, K % 64 == 0, lda % 8 == 0;
 * NVFP4 (either layout); FP8 with block_c % 64 == 0 and block_r % 8 == 0; INT4 in the
 * reordered layout (int4_reordered != 0) with G % 64 == 0.  Else 0. */
int ck_qgemm_wgmma_fits(const ck_qgemm_args *a);

/* The grouped modes of ck_qgemm on Hopper warpgroup MMAs (cuda_wgmma.cu:
 * the packed weights dequantized per stage into the swizzled bf16 tile):
 * same arguments and bitwise the same results as ck_qgemm (same exact bf16
 * weight codes, same k16 chunk order, hi then lo, same per-group folds and
 * epilogue), so the host may pick either per pass.  Needs
 * ck_qgemm_wgmma_fits(a), bm == 128 (the plan of ck_moe_plan with BM 128),
 * for DOWN an even ldy and 8-byte aligned Y, and a device of compute
 * capability 9.0.  cudaErrorNotSupported when the build lacks sm_90a,
 * cudaErrorInvalidValue on other arguments. */
cudaError_t ck_qgemm_wgmma(const ck_qgemm_args *a, cudaStream_t st);

/* ---- W8A8 FP8-block experts (cuda_fp8mma.cu, CLEF_CUDA_FP8_MMA=1) ------- */

/* Per-row, per-128-column E4M3 quantization of activation rows x [rows, K]
 * (f32, or bf16 when x_bf16; rows ldx elements apart): for row r, block b
 * (columns 128 b .. 128 b + 127):
 *   s[r, b] = amax / 448 (f32 division; amax = max |x| over the block),
 *             1 when that is 0 (amax == 0, or below ~2^-140 where the
 *             division underflows; the block's codes are then zeros);
 *   q[r, 128 b + i] = E4M3 of x / s (f32 division; round to nearest even,
 *             saturating to +-448; NaN 0x7F), bit for bit
 *             clef_fp8_e4m3_encode (src/quant/fp.c).
 * q [rows, K] bytes (4-byte aligned), s f32 [rows, K / 128].  K % 128 == 0,
 * ldx >= K, else cudaErrorInvalidValue.  Each row's result depends on that
 * row only. */
cudaError_t ck_fp8_quant_rows(const void *x, int x_bf16, int64_t rows, int64_t K, int64_t ldx, uint8_t *q, float *s,
                              cudaStream_t st);

/* A grouped W8A8 product: the tile plan of ck_moe_plan with BM = 128, A =
 * FP8 rows of ck_fp8_quant_rows, W0/W1 = device [E] of FP8-block weights
 * (ck_qmat: q E4M3 [N, K], scale f32 [ceil(N/128), K/128], 128 x 128 blocks).
 *   GATEUP: A rows are tokens (permuted row p reads A row row_src[p]);
 *           H[p, j] = bf16(silu(G) * U), G, U the products with gate_e /
 *           up_e row j, H rows N (= the intermediate size) apart;
 *   DOWN:   A row p = p; Y[p, n] = the product with down_e row n (f32,
 *           rows ldy apart; ldy even, Y 8-byte aligned).
 * Each product is, per 128-wide K block kb ascending, the block's FP8
 * products summed on the tensor cores (f32) and added as
 * acc = fmaf(part, As[row, kb] * Ws[n / 128, kb], acc) (f32). */
typedef struct ck_fp8mma_args {
    ck_gemm_mode mode;        /* CK_GEMM_GATEUP or CK_GEMM_DOWN */
    const uint8_t *A;         /* E4M3 rows [*, K], 16-byte aligned */
    const float *As;          /* their scales [*, K / 128] */
    int64_t K, N;
    const ck_qmat *W0, *W1;   /* device [E]: gate (GATEUP) / down (DOWN); up (GATEUP) */
    const int32_t *tile_expert, *tile_row0, *expert_end, *n_tiles; /* ck_moe_plan, BM = 128 */
    int64_t max_tiles;
    const int32_t *row_src;   /* GATEUP */
    float *Y;                 /* DOWN */
    int64_t ldy;
    uint16_t *H;              /* GATEUP: bf16 [rows, N] */
} ck_fp8mma_args;

/* 1 when the build holds the sm_90a kernel and a product with K columns, N
 * rows and weight blocks block_r x block_c can run on ck_fp8mma: K % 128 ==
 * 0, 128 x 128 blocks.  Else 0. */
int ck_fp8mma_fits(int64_t K, int64_t N, int64_t block_r, int64_t block_c);

/* Launch (device of compute capability 9.0).  cudaErrorNotSupported when the
 * build lacks sm_90a, cudaErrorInvalidValue on other arguments. */
cudaError_t ck_fp8mma(const ck_fp8mma_args *a, cudaStream_t st);

/* INT4 q u32 [K/8, N] (GPTQ layout, device) -> dst in the reordered layout
 * of cuda_qbits.h (CK_INT4R_*: atoms of 16 columns x 64 K whose 16-byte lane
 * chunks are the mma B fragments), CK_INT4R_BYTES(N, K) bytes (device, not
 * overlapping src; padding nibbles 0).  K % 8 == 0, N % 8 == 0, else
 * cudaErrorInvalidValue.  Asynchronous on st. */
cudaError_t ck_int4_reorder(const void *src, int64_t K, int64_t N, void *dst, cudaStream_t st);

/* NVFP4 data src_q u8 [N, K/2] and E4M3 scales src_scale u8 [N, K/16]
 * (checkpoint layout, device) -> the reordered layout of cuda_qbits.h
 * (CK_NVF4R_*: the data in the INT4 atoms' nibble order, CK_NVF4R_BYTES(N, K)
 * bytes at dst_q; the scales in 64-byte scale atoms, CK_NVF4R_SC_BYTES(N, K)
 * bytes at dst_scale; padding 0; destinations device memory not overlapping
 * the sources).  K % 16 == 0, K >= 16, N >= 1, else cudaErrorInvalidValue.
 * Asynchronous on st. */
cudaError_t ck_nvfp4_reorder(const void *src_q, const void *src_scale, int64_t K, int64_t N, void *dst_q,
                             void *dst_scale, cudaStream_t st);

/* Y[r, n] = sum_k x[r, k] * W[n, k] (+ bias[n]) for f32 weights, one thread
 * per output, k ascending (fallback for F32/F16 checkpoints). */
cudaError_t ck_gemm_f32(const float *x, int64_t M, int64_t K, const float *W, int64_t N, const float *bias, float *Y,
                        cudaStream_t st);

/* Y[r, n] += bias[n] for r < M, n < N (rows ldy apart). */
cudaError_t ck_add_bias(float *Y, int64_t M, int64_t N, int64_t ldy, const float *bias, cudaStream_t st);

/* y[r, n] = D[2r, n] + D[2r + 1, n] (+ bias[n]) for r < M, n < N: the hi
 * and lo halves of a split product run as 2M stacked rows (rows [hi_r,
 * lo_r] interleaved, as the [hi | lo] activation rows read as K-wide rows
 * give them).  N % 4 == 0 and 16-byte aligned D, y, bias (else
 * cudaErrorInvalidValue). */
cudaError_t ck_split_sum(const float *D, int64_t M, int64_t N, const float *bias, float *y, cudaStream_t st);

/* ---- MoE routing -------------------------------------------------------- */

/* Permute the T*k (token, slot) entries of idx by expert, token order kept
 * within an expert (a stable counting sort, integer atomics only):
 *   cnt[E]          scratch (zeroed and filled here; passes of at most
 *                   16,384 entries over at most 512 experts count inside
 *                   the placing kernel instead)
 *   expert_end[E]   one past the last permuted row of each expert
 *   row_tok[T*k]    token of each permuted row
 *   slot_pos[T*k]   permuted row of each entry (t * k + s)
 *   tile_expert / tile_row0 [ceil(T*k / BM) + E], n_tiles[1]: the M tiles of
 *   every expert with rows, experts ascending.
 * Entries outside [0, E) are not placed (the caller checks them). */
cudaError_t ck_moe_plan(const int32_t *idx, int64_t T, int k, int E, int BM, int32_t *cnt, int32_t *expert_end,
                        int32_t *row_tok, int32_t *slot_pos, int32_t *tile_expert, int32_t *tile_row0,
                        int32_t *n_tiles, cudaStream_t st);

/* y[t] = sum over t's k slots in ascending expert order of w[t,s] * yp[slot_pos[t*k+s]]. */
cudaError_t ck_moe_combine(const float *yp, const int32_t *idx, const float *w, const int32_t *slot_pos, int64_t T,
                           int k, int64_t H, float *y, cudaStream_t st);

/* ck_moe_combine fused with the next add_rmsnorm (cuda_elem.cu): for each token t < T, h[t] += its
 * combined row, y[t] = rmsnorm(h[t]) * nw (eps), a16 (NULL: none) y's row as bf16 (split halves, rows
 * H * split apart) — bitwise ck_moe_combine into o then ck_add_rmsnorm(h, o, nw, y, .., a16, split).
 * Only where ck_moe_combine_norm_fits (the wide norm's shape: H % 4 == 0, 512 <= H <= 8192, yp, h,
 * nw, y 16-byte aligned; a16 8-byte aligned), else cudaErrorInvalidValue.  y must not overlap h; it may
 * be the expert input. */
int ck_moe_combine_norm_fits(const float *yp, const float *h, const float *nw, const float *y, int64_t H);
cudaError_t ck_moe_combine_norm(const float *yp, const int32_t *idx, const float *w, const int32_t *slot_pos,
                                int64_t T, int k, int64_t H, float *h, const float *nw, float *y, uint16_t *a16,
                                int split, float eps, cudaStream_t st);

/* Router softmax + top-k (+ renormalisation), one warp per token. */
cudaError_t ck_router_topk(const float *logits, int64_t T, int64_t E, int64_t k, int norm, int32_t *idx, float *w,
                           cudaStream_t st);

/* out[i] = f32(table[ids[i]]) for a bf16 (is_f32 = 0) or f32 table [rows, cols];
 * an id outside [0, rows) gives a zero row. */
cudaError_t ck_gather(const void *table, int is_f32, int64_t rows, int64_t cols, const int32_t *ids, int64_t n,
                      float *out, cudaStream_t st);

/* ---- attention ---------------------------------------------------------- */

/* In-place interleaved M-RoPE on x[T, heads, D]; pos int32 [3][T]. */
cudaError_t ck_rope(float *x, int64_t T, int64_t heads, int64_t D, const int32_t *pos, int64_t s1, int64_t s2,
                    const float *inv_freq, cudaStream_t st);

/* Query rows per tile of ck_attn_tc for this split (1, 2 or 3) and kernel
 * variant (1 = v1; 2 = v2 (default); 3 = v2 with 128-row tiles in the precise
 * mode as well; 4 = v2s, split 1 only: v2's 32-key tiles under 64-row blocks, bitwise v2): 64 or 128. */
int ck_attn_tc_rows(int split, int variant);

/* Where the tensor-core attention writes: f32 rows `stride` apart at out, and when out16 is set also
 * the bf16 rows a following product reads (rows nh * D * split16 apart: [hi | lo] when split16 = 2,
 * ck_rows_to_bf16's values of the f32 outputs; 4-byte aligned). */
typedef struct ck_attn_out {
    float *out;
    int64_t stride;
    uint16_t *out16;
    int split16;
} ck_attn_out;

/* Tensor-core flash attention (D = 64, 72 or 128): q [*, nh, D], k/v [*, nkv, D]
 * bf16 rows packed (row stride nh*D / nkv*D); tiles int32 [n_tiles][2] =
 * (segment, first query row within it, a multiple of ck_attn_tc_rows(split,
 * variant)), heaviest first is fastest; offsets int64
 * [n_seg + 1].  out f32 rows o_stride apart.  split = 2: q, k, v rows are
 * [hi | lo] (ck_rows_to_bf16 split 2; row strides doubled) and every product
 * takes three MMAs (hi.hi + hi.lo + lo.hi), P split the same way; split = 3:
 * the same with one K/V buffer instead of two (104 KB of shared memory at
 * D = 128: two blocks per SM; bitwise the same results as split = 2).
 * variant: see ck_attn_tc_rows; variants 2, 3 and 4 need scale > 0.  out16 /
 * split16: see ck_attn_out (NULL: f32 rows only).  Errors:
 * cudaErrorInvalidValue for an unsupported D, split, variant, scale or split16. */
cudaError_t ck_attn_tc(const uint16_t *q, const uint16_t *k, const uint16_t *v, float *out, int64_t o_stride,
                       uint16_t *out16, int split16, const int32_t *tiles, int64_t n_tiles, const int64_t *q_off,
                       const int64_t *kv_off, int nh, int nkv, int D, float scale, int causal, int split, int variant,
                       cudaStream_t st);

/* f32 attention for any head_dim: one warp per (query row, head), online
 * softmax over the keys in order.  n_rows = q_off[n_seg]. */
cudaError_t ck_attn_f32(const float *q, const float *k, const float *v, float *out, int64_t q_stride,
                        int64_t k_stride, int64_t v_stride, int64_t o_stride, const int64_t *q_off,
                        const int64_t *kv_off, int64_t n_seg, int64_t n_rows, int nh, int nkv, int D, float scale,
                        int causal, cudaStream_t st);

/* ---- row ops ------------------------------------------------------------ */

cudaError_t ck_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps, cudaStream_t st);
/* The residual add fused with the next RMSNorm: h[r] += o[r] (o NULL: no
 * add), then y = rmsnorm(h) with ck_rmsnorm's reduction shape (bitwise
 * ck_add then ck_rmsnorm); with a16 non-NULL also y's rows as bf16 exactly
 * as ck_rows_to_bf16(y, rows, dim, dim, a16, split).  Wide rows need o
 * 16-byte and a16 8-byte aligned (cudaErrorInvalidValue otherwise). */
cudaError_t ck_add_rmsnorm(float *h, const float *o, const float *w, float *y, int64_t rows, int64_t dim, float eps,
                           uint16_t *a16, int split, cudaStream_t st);
/* Per-head RMSNorm (q_w for the nq query heads of each row at q + t *
 * q_stride, k_w for the nk key heads at k + t * k_stride), then M-RoPE as
 * ck_rope, in place, one block per token: bitwise ck_rmsnorm (rows of D)
 * then ck_rope for D < 512 (where ck_rmsnorm also reduces a row in one
 * warp; from 512 it takes its block-wide kernel, and the sums agree to f32
 * rounding).  D even, <= 1024.  With q16 (and k16) non-NULL the results are
 * also written as the bf16 rows attention reads, exactly as ck_rows_to_bf16
 * with `split16` would convert them: q16 rows of nq * D * split16, k16 rows
 * of nk * D * split16 ([hi | lo] when split16 = 2). */
cudaError_t ck_qk_norm_rope(float *q, int64_t q_stride, float *k, int64_t k_stride, int64_t T, int nq, int nk,
                            const float *q_w, const float *k_w, float eps, int D, const int32_t *pos, int64_t s1,
                            int64_t s2, const float *inv_freq, uint16_t *q16, uint16_t *k16, int split16,
                            cudaStream_t st);
cudaError_t ck_layernorm(const float *x, const float *w, const float *b, float *y, int64_t rows, int64_t dim,
                         float eps, cudaStream_t st);
cudaError_t ck_swiglu(const float *g, const float *u, float *out, int64_t n, cudaStream_t st);
/* copy_many (backend.h): list (device) [n] of {dst, src, bytes}; `most` the largest bytes (the grid).
 * 16-byte vectors where a copy's addresses and size allow, bytes otherwise. */
typedef struct ck_copy {
    void *dst;
    const void *src;
    size_t bytes;
} ck_copy;
cudaError_t ck_copy_many(const ck_copy *list, int n, size_t most, cudaStream_t st);
cudaError_t ck_add(const float *a, const float *b, float *y, int64_t rows, int64_t dim, int64_t b_stride,
                   cudaStream_t st);
cudaError_t ck_gelu(const float *x, float *y, int64_t n, cudaStream_t st);
/* spans: int64 [n][2] (start, end). */
cudaError_t ck_span_mean(const float *x, int64_t dim, const int64_t *spans, int64_t n, float *out, cudaStream_t st);
cudaError_t ck_pair_features(const float *F, const int32_t *f_rows, const float *o, int64_t n, int64_t dim, float *out,
                             cudaStream_t st);
/* a_rows NULL = identity. */
cudaError_t ck_cosine(const float *a, const int32_t *a_rows, const float *b, int64_t n, int64_t dim, float eps,
                      float *out, cudaStream_t st);

/* ---- media tower ops (cuda_tower.cu; contracts in backend.h) ------------- */

cudaError_t ck_gelu_tanh(const float *x, float *y, int64_t n, cudaStream_t st);
/* pos int32 [N][2] (y, x); inv_freq [d/4]. */
cudaError_t ck_rope_2d(float *x, int64_t N, int64_t stride, int64_t heads, int64_t d, const int32_t *pos,
                       const float *inv_freq, cudaStream_t st);
/* idx int32 [N][4], w [N][4]. */
cudaError_t ck_mix_rows(const float *table, int64_t dim, const int32_t *idx, const float *w, int64_t N, float *out,
                        cudaStream_t st);
cudaError_t ck_im2col_3x3s2(const float *in, int64_t B, int64_t Fi, int64_t Ti, int64_t Ci, float *cols,
                            cudaStream_t st);
/* B <= 65535. */
cudaError_t ck_transpose(const float *x, int64_t B, int64_t R, int64_t C, float *y, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
