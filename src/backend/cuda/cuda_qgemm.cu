/* cuda_qgemm.cu — weight products with the weights kept packed on the GPU
 * (quantized checkpoints, SPEC.md §10.3, src/quant/qweight.h): NVFP4
 * (compressed-tensors and ModelOpt), FP8 E4M3 with block scales and INT4
 * auto_gptq (symmetric or asymmetric), dense and grouped over experts (the
 * gate/up GEMM with the SwiGLU fused, the down GEMM), with the tile plan of
 * ck_moe_plan (BM = ck_gemm_bm(0) = 64 rows per tile).
 *
 * Kernel (qgemm2_kernel): a 2- to 4-stage cp.async ring brings the bf16
 * activation tiles and the PACKED weight bytes of each 64-wide K step into
 * shared memory; each K step every thread dequantizes the packed units it
 * copied itself into a double-buffered 128 x 64 bf16 tile, then the block
 * runs mma.sync m16n8k16 (bf16 -> f32) as the bf16 kernel of cuda_gemm.cu
 * (details at the kernel).
 * Weight elements on the tensor cores are always exact in bf16:
 *   NVFP4:  fp4(q) * fp8(scale16) (2 x 4 significant bits: exact); the
 *           per-tensor global is applied to the f32 sum in the epilogue
 *           (y = sum / global, or sum * scale_2), so per weight the CPU's
 *           one rounding of (fp4 * s) / g becomes one rounding of the sum.
 *   FP8:    fp8(q) (exact in bf16); the f32 block scale multiplies the f32
 *           partial sum of each block_c-wide K block (fold, below).
 *   INT4:   nibble - zero (an integer in [-16, 15], exact); the f16 group
 *           scale multiplies the f32 partial sum of each group (fold).
 * Fold: a second set of f32 accumulators collects the products of one scale
 * group; at the group's last 16-wide K chunk acc += partial * scale[n, g]
 * and the partial restarts at 0.  So the only differences from the CPU
 * decode (clef_qweight_rows_f32, f32 weights, f32 sums) are f32 rounding
 * order (~1e-7 relative) and the activation rounding to bf16 (~3e-3 on a
 * product; ~1e-6 with the split hi/lo activations of the precise mode).
 *
 * Determinism: every output element is one thread's sum over K in ascending
 * 16-wide chunks, folded at fixed K positions; it depends on its own row
 * only (no split-K, no atomics).
 *
 * INT4 and NVFP4 by default run kernel v3 (qgemm3_kernel, below): the same
 * tiles, activations, fold / epilogue, with the weights (NVFP4: and their
 * E4M3 scales) reordered at upload (ck_int4_reorder, ck_nvfp4_reorder,
 * cuda_qbits.h) so that they go packed from the ring to registers and are
 * decoded there; bitwise the results of v2, which stays for
 * CLEF_CUDA_QGEMM_INT4=v2 / CLEF_CUDA_QGEMM_NVFP4=v2 (checkpoint layouts).
 *
 * History: this is the second version of the kernel (v2).  The first one
 * (v1: one shared-memory dequantization pass per K step behind two
 * barriers, an FP4 lookup table, precise mode dequantizing the weights
 * twice) was removed after v2 matched it on the H200 (bitwise in fast mode,
 * within 2e-6 precise) and was faster at every measured shape
 * (docs/BENCHMARKS.md, "Quantized checkpoints").
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_qbits.h"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_qdecode.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

typedef __nv_bfloat16 bf16;

namespace {

constexpr int QBN = 128;      /* output columns per block (GATEUP: 64 gate + 64 up) */
constexpr int QBK = 64;       /* K per pipeline stage */
constexpr int QPITCH = QBK + 8; /* bf16 row pitch of the smem tiles */
constexpr int QTHREADS = 256; /* 8 warps */
constexpr int UNITS = QBN * (QBK / 16); /* 16-wide K chunks of one weight row per stage: 512 */
constexpr int UNITS_PER_THREAD = UNITS / QTHREADS;

/* Tile shapes: BM rows (32 for a few rows per expert, 64, 128 for many),
 * warps 1x8 (BM 32) or 2x4. */
template <int BM> __host__ __device__ constexpr int q_warps_m() { return BM == 32 ? 1 : 2; }


/* The weight matrix of a column c of the block (GATEUP: gate for c < 64). */
__device__ __forceinline__ const ck_qmat *qmat_of(const ck_qgemm_args &a, int e, int c) {
    if (a.mode == CK_GEMM_DENSE) return &a.W;
    if (a.mode == CK_GEMM_GATEUP) return c < 64 ? &a.W0[e] : &a.W1[e];
    return &a.W0[e];
}

/* ---- the kernel (v2) ------------------------------------------------------
 * Tiles BM x 128 (GATEUP: 64 gate + 64 up columns), 8 warps, ldmatrix
 * fragments and mma.sync as the bf16 kernel; the fold of the header comment;
 * epilogue: Y (DENSE, DOWN) or silu(gate) * up to H (GATEUP).  Its design:
 *  - each thread dequantizes exactly the packed units it copied itself
 *    (cp.async.wait_group makes them visible to it), into a DOUBLE-buffered
 *    bf16 tile Wd[kt & 1]; so one barrier per 64-wide K step:
 *      wait(own copies of stage kt); dequant(kt) -> Wd[kt&1]; barrier;
 *      issue the copies of stage kt+S-1 (into the slot of kt-1, which every
 *      warp finished before the barrier); MMAs of kt.
 *    Wd[kt&1] was last read by the MMAs of kt-2, which every thread finished
 *    before the barrier of kt-1.
 *  - precise (split = 2): the hi and lo activation tiles of the same K step
 *    share one stage; each dequantized weight fragment feeds two MMAs (hi,
 *    then lo) into the same accumulator: the weights are read and
 *    dequantized once instead of twice.  (Summation order: per 16-wide chunk
 *    hi then lo, instead of all hi chunks then all lo chunks.)
 *  - NVFP4 decoded in registers (cuda_qbits.h: a byte-permute table of
 *    2 * |fp4|, the 128 + T bf16 trick of INT4, the sign, times the FP8
 *    scale / 2: all exact, no subnormals), no shared-memory table. */
constexpr int Q2_SMEM_2BLOCKS = 112 * 1024; /* two blocks per SM below this */
static_assert(QTHREADS % QBN == 0, "INT4 units of a thread share their weight row");

/* packed bytes of one unit (16 K values of one weight row) in a stage:
 * FP8 16, NVFP4 / INT4 8; then the aux words (NVFP4 scale word, INT4 zero
 * word; FP8 none) */
template <int QT> __host__ __device__ constexpr int q2_ubytes() { return QT == CK_QT_FP8 ? 16 : 8; }
template <int QT> __host__ __device__ constexpr int q2_pk_bytes() {
    return UNITS * q2_ubytes<QT>() + (QT == CK_QT_FP8 ? 0 : UNITS * 4);
}
template <int QT, int BM, int SPLIT> __host__ __device__ constexpr int q2_bytes(int s) {
    return s * SPLIT * BM * QPITCH * 2 + s * q2_pk_bytes<QT>() + 2 * QBN * QPITCH * 2;
}
/* the deepest ring (4, 3, 2 stages) that leaves room for two blocks per SM; else 3 stages, one block */
template <int QT, int BM, int SPLIT> __host__ __device__ constexpr int q2_stages() {
    return q2_bytes<QT, BM, SPLIT>(4) <= Q2_SMEM_2BLOCKS   ? 4
         : q2_bytes<QT, BM, SPLIT>(3) <= Q2_SMEM_2BLOCKS ? 3
         : q2_bytes<QT, BM, SPLIT>(2) <= Q2_SMEM_2BLOCKS ? 2
                                                         : 3;
}
template <int QT, int BM, int SPLIT> __host__ __device__ constexpr int q2_smem() {
    return q2_bytes<QT, BM, SPLIT>(q2_stages<QT, BM, SPLIT>());
}
template <int QT, int BM, int SPLIT> __host__ __device__ constexpr int q2_min_blocks() {
    return q2_smem<QT, BM, SPLIT>() <= Q2_SMEM_2BLOCKS ? 2 : 1;
}
static_assert(q2_smem<CK_QT_NVFP4, 128, 2>() <= 227 * 1024, "v2 BM 128 precise fits one block");
static_assert(q2_smem<CK_QT_FP8, 64, 2>() <= 227 * 1024, "v2 fits");
static_assert(32 * (QBN + 4) * 4 <= q2_smem<CK_QT_INT4, 32, 1>(), "epilogue tile fits");
static_assert(64 * (QBN + 4) * 4 <= q2_smem<CK_QT_INT4, 64, 1>(), "epilogue tile fits");
static_assert(128 * (QBN + 4) * 4 <= q2_smem<CK_QT_NVFP4, 128, 1>(), "epilogue tile fits");

/* The end of a scale group (v2 and v3): acc += part x the column's scale (sc[ni][q & 1]: columns 2 tig,
 * 2 tig + 1 of n8 tile ni), part = 0.  part is PM x PN fragments (the first of acc's; 1 x 1 where the
 * format folds nothing). */
template <int MI, int NI, int PM, int PN>
__device__ __forceinline__ void fold_frags(float (&acc)[MI][NI][4], float (&part)[PM][PN][4], const float (&sc)[NI][2]) {
#pragma unroll
    for (int mi = 0; mi < PM; mi++)
#pragma unroll
        for (int ni = 0; ni < PN; ni++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                acc[mi][ni][q] = fmaf(part[mi][ni][q], sc[ni][q & 1], acc[mi][ni][q]);
                part[mi][ni][q] = 0.0f;
            }
}

template <int QT, int BM, int SPLIT>
__global__ void __launch_bounds__(QTHREADS, q2_min_blocks<QT, BM, SPLIT>()) qgemm2_kernel(const ck_qgemm_args a) {
    constexpr int QBM = BM, QSTAGES = q2_stages<QT, BM, SPLIT>();
    constexpr int UB = q2_ubytes<QT>(), PKB = q2_pk_bytes<QT>();
    constexpr int QWARPS_M = q_warps_m<BM>(), QWARPS_N = 8 / QWARPS_M;
    constexpr int WTM = QBM / QWARPS_M, WTN = QBN / QWARPS_N;
    constexpr int MI = WTM / 16, NI = WTN / 8;
    constexpr int A_CHUNKS = QBM * (QBK / 8) / QTHREADS;
    constexpr int A_TILE = QBM * QPITCH; /* bf16 elements of one activation tile (hi or lo) */
    constexpr bool FOLD = QT != CK_QT_NVFP4;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *As = reinterpret_cast<bf16 *>(smem_raw);                            /* [STAGES][SPLIT][BM][PITCH] */
    unsigned char *Pk = smem_raw + QSTAGES * SPLIT * A_TILE * 2;             /* [STAGES][PKB] */
    bf16 *Wd0 = reinterpret_cast<bf16 *>(Pk + QSTAGES * PKB);                /* [2][BN][PITCH] */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / QWARPS_N, wn = warp % QWARPS_N;
    int64_t nt, row0, rows;
    int e;
    if (!gemm_block_tile(a, QBM, QBN, nt, row0, rows, e)) return;
    const bf16 *A = reinterpret_cast<const bf16 *>(a.A);
    const int64_t K = a.K, N = a.N;

    const bf16 *a_src[A_CHUNKS];
    int a_dst[A_CHUNKS], a_col[A_CHUNKS];
    gemm_a_chunks<A_CHUNKS, QTHREADS, QBK, QPITCH>(a, A, tid, row0, rows, a_src, a_dst, a_col);
    int u_r[UNITS_PER_THREAD], u_kc[UNITS_PER_THREAD], u_n[UNITS_PER_THREAD];
#pragma unroll
    for (int i = 0; i < UNITS_PER_THREAD; i++) {
        const int u = tid + i * QTHREADS;
        if (QT == CK_QT_INT4) {
            u_r[i] = u % QBN;
            u_kc[i] = u / QBN;
        } else {
            u_r[i] = u / 4;
            u_kc[i] = u % 4;
        }
        u_n[i] = (int)(a.mode == CK_GEMM_GATEUP ? nt * 64 + (u_r[i] & 63) : nt * QBN + u_r[i]);
    }
    const int64_t R = N;
    /* each unit's matrix pointers, read once (not per K step): u_q = the row's
     * packed data (NVFP4 / FP8: row n; INT4: column n of word row 0), u_x =
     * NVFP4 scales (base) / INT4 zero word of column n (word row 0) */
    const unsigned char *u_q[UNITS_PER_THREAD], *u_x[UNITS_PER_THREAD];
#pragma unroll
    for (int i = 0; i < UNITS_PER_THREAD; i++) {
        if (QT == CK_QT_INT4 && i > 0) { /* INT4: every unit of a thread is the same weight row (u % QBN) */
            u_q[i] = u_q[0], u_x[i] = u_x[0];
            continue;
        }
        const ck_qmat *m = qmat_of(a, e, u_r[i]);
        const int64_t n = u_n[i] < N ? u_n[i] : 0;
        const unsigned char *q = static_cast<const unsigned char *>(m->q);
        if (QT == CK_QT_NVFP4) {
            u_q[i] = q + n * (K / 2);
            u_x[i] = static_cast<const unsigned char *>(m->scale);
        } else if (QT == CK_QT_FP8) {
            u_q[i] = q + n * K;
            u_x[i] = nullptr;
        } else {
            u_q[i] = q + n * 4;
            u_x[i] = a.has_zeros ? static_cast<const unsigned char *>(m->zeros) + (n / 8) * 4 : nullptr;
        }
    }

    auto load_stage = [&](int kt, int stage) {
        const int64_t k0 = (int64_t)kt * QBK;
        gemm_a_load<A_CHUNKS, SPLIT>(As + stage * SPLIT * A_TILE, A_TILE, a_src, a_dst, a_col, k0, K, A);
        unsigned char *pk = Pk + stage * PKB;
        uint32_t *aux = reinterpret_cast<uint32_t *>(pk + UNITS * UB);
#pragma unroll
        for (int i = 0; i < UNITS_PER_THREAD; i++) {
            const int u = tid + i * QTHREADS;
            int64_t kk = k0 + u_kc[i] * 16;
            const bool ok = u_n[i] < N && kk < K;
            const int64_t n = ok ? u_n[i] : 0;
            kk = ok ? kk : 0;
            if (QT == CK_QT_NVFP4) {
                cp_async8(pk + u * UB, u_q[i] + kk / 2, ok);
                const int64_t si = n * (K / 16) + kk / 16;
                cp_async4(aux + u, u_x[i] + (si & ~(int64_t)3), ok);
            } else if (QT == CK_QT_FP8) {
                cp_async16(pk + u * UB, u_q[i] + kk, ok);
            } else {
                const unsigned char *q = u_q[i] + (kk / 8) * R * 4; /* word row kk / 8, column n */
                cp_async4(pk + u * UB, q, ok);
                cp_async4(pk + u * UB + 4, q + R * 4, ok);
                if (a.has_zeros) cp_async4(aux + u, u_x[i] + (kk / a.group) * (R / 8) * 4, ok);
            }
        }
    };

    /* this thread's own packed units of stage `stage` -> bf16 tile wd */
    auto dequant_stage = [&](int kt, int stage, bf16 *wd) {
        const int64_t k0 = (int64_t)kt * QBK;
        const unsigned char *pk = Pk + stage * PKB;
        const uint32_t *aux = reinterpret_cast<const uint32_t *>(pk + UNITS * UB);
#pragma unroll
        for (int i = 0; i < UNITS_PER_THREAD; i++) {
            const int u = tid + i * QTHREADS;
            uint32_t outw[8];
            if (QT == CK_QT_NVFP4) {
                const int64_t kk = k0 + u_kc[i] * 16;
                const int64_t si = (int64_t)u_n[i] * (K / 16) + kk / 16;
                qdec_nvfp4(*reinterpret_cast<const uint2 *>(pk + u * UB), (aux[u] >> (8 * (int)(si & 3))) & 0xFFu, outw);
            } else if (QT == CK_QT_FP8) {
                qdec_fp8(*reinterpret_cast<const uint4 *>(pk + u * UB), outw);
            } else {
                const int z = a.has_zeros ? (int)((aux[u] >> (4 * (int)(u_n[i] & 7))) & 15u) + 1 : 8;
                qdec_int4(*reinterpret_cast<const uint2 *>(pk + u * UB), z, outw);
            }
            uint4 *dst = reinterpret_cast<uint4 *>(wd + u_r[i] * QPITCH + u_kc[i] * 16);
            dst[0] = make_uint4(outw[0], outw[1], outw[2], outw[3]);
            dst[1] = make_uint4(outw[4], outw[5], outw[6], outw[7]);
        }
    };

    float acc[MI][NI][4], part[FOLD ? MI : 1][FOLD ? NI : 1][4];
    zero_frags(acc);
    if (FOLD) zero_frags(part);
    const int tig = lane & 3;
    const ck_qmat *cm = qmat_of(a, e, wn * WTN);
    int cn[NI][2];
#pragma unroll
    for (int ni = 0; ni < NI; ni++)
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int c = wn * WTN + ni * 8 + tig * 2 + q;
            cn[ni][q] = (int)(a.mode == CK_GEMM_GATEUP ? nt * 64 + (c & 63) : nt * QBN + c);
        }
    const int fold_g = (int)(QT == CK_QT_FP8 ? a.block_c : a.group);
    int srow[NI][2];
    if (FOLD) {
        const int nbc = (int)((K + a.block_c - 1) / (QT == CK_QT_FP8 ? a.block_c : 1));
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int n = cn[ni][q] < N ? cn[ni][q] : 0;
                srow[ni][q] = QT == CK_QT_FP8 ? (n / (int)a.block_r) * nbc : n;
            }
    }

    /* The scales of the NEXT group are loaded right after the current group's fold (as v3 does), so
     * their latency runs under a group of MMAs instead of stalling the block's warps at the fold. */
    const int ngroups = FOLD ? (int)((K + fold_g - 1) / fold_g) : 0;
    float scn[FOLD ? NI : 1][2];
    auto load_scales = [&](int grp) {
#pragma unroll
        for (int ni = 0; ni < (FOLD ? NI : 1); ni++)
#pragma unroll
            for (int q = 0; q < 2; q++) {
                if (QT == CK_QT_FP8)
                    scn[ni][q] = __ldg(static_cast<const float *>(cm->scale) + srow[ni][q] + grp);
                else
                    scn[ni][q] =
                        __half2float(__ldg(static_cast<const __half *>(cm->scale) + (int64_t)grp * R + srow[ni][q]));
            }
    };
    if (FOLD) load_scales(0);
    int gpos = 0, grp = 0;
    const int ktiles = (int)((K + QBK - 1) / QBK);
#pragma unroll
    for (int s = 0; s < QSTAGES - 1; s++) {
        if (s < ktiles) load_stage(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<QSTAGES - 2>(); /* this thread's copies of stage kt landed */
        bf16 *Wd = Wd0 + (kt & 1) * QBN * QPITCH;
        dequant_stage(kt, kt % QSTAGES, Wd);
        __syncthreads(); /* Wd[kt&1] and every thread's activation copies of kt visible; kt-1 fully consumed */
        if (kt + QSTAGES - 1 < ktiles) load_stage(kt + QSTAGES - 1, (kt + QSTAGES - 1) % QSTAGES);
        cp_async_commit();
        const bf16 *as = As + (kt % QSTAGES) * SPLIT * A_TILE;
#pragma unroll
        for (int ks = 0; ks < QBK / 16; ks++) {
            const int64_t kk = (int64_t)kt * QBK + ks * 16;
            if (kk >= K) break;
            uint32_t bfr[NI][2];
#pragma unroll
            for (int nj = 0; nj < NI / 2; nj++)
                ldsm_x4(bfr[2 * nj][0], bfr[2 * nj][1], bfr[2 * nj + 1][0], bfr[2 * nj + 1][1],
                        Wd + (wn * WTN + nj * 16 + (lane & 7) + ((lane >> 4) << 3)) * QPITCH + ks * 16 +
                            ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int h = 0; h < SPLIT; h++) {
                uint32_t af[MI][4];
#pragma unroll
                for (int mi = 0; mi < MI; mi++)
                    ldsm_x4(af[mi][0], af[mi][1], af[mi][2], af[mi][3],
                            as + h * A_TILE + (wm * WTM + mi * 16 + (lane & 15)) * QPITCH + ks * 16 + (lane >> 4) * 8);
                if (!FOLD) {
#pragma unroll
                    for (int mi = 0; mi < MI; mi++)
#pragma unroll
                        for (int ni = 0; ni < NI; ni++) mma16816(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
                } else {
#pragma unroll
                    for (int mi = 0; mi < (FOLD ? MI : 1); mi++)
#pragma unroll
                        for (int ni = 0; ni < (FOLD ? NI : 1); ni++)
                            mma16816(part[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
                }
            }
            if (FOLD) { /* the group position counted, not divided (see q3_fold) */
                gpos += 16;
                if (gpos == fold_g || kk + 16 == K) { /* last chunk of a scale group: fold */
                    float sc[NI][2];
#pragma unroll
                    for (int ni = 0; ni < NI; ni++)
#pragma unroll
                        for (int q = 0; q < 2; q++) sc[ni][q] = scn[FOLD ? ni : 0][q];
                    fold_frags(acc, part, sc);
                    if (grp + 1 < ngroups) load_scales(grp + 1);
                    grp++, gpos = 0;
                }
            }
        }
    }
    cp_async_wait<0>();

    float gs = 1.0f;
    int gdiv = 0;
    if (QT == CK_QT_NVFP4) {
        gs = cm->global;
        gdiv = a.global_div;
    }
    mma_epilogue<QBM, QBN, WTM, WTN, QTHREADS>(a, acc, N, a.split, row0, rows, nt, wm, wn, lane, tid, smem_raw,
                                               [gs, gdiv](float v, int64_t) {
                                                   return QT == CK_QT_NVFP4 ? (gdiv ? v / gs : v * gs) : v;
                                               });
}

/* Host: one launch of a packed-weight kernel over BM x BN block tiles (gemm_grid: DENSE ceil(M / BM)
 * row tiles, grouped the plan's max_tiles; BN = QBN but for v5), with `smem` bytes of dynamic shared
 * memory (the limit raised once per device: *done, the kernel's own mask) and `threads` threads; v2, v3,
 * v4 and v5 all launch here. */
template <class Kernel>
static cudaError_t launch_packed(Kernel *kernel, int bm, int threads, int smem, unsigned *done, const ck_qgemm_args *a,
                                 cudaStream_t st, int bn = QBN) {
    cudaError_t e = allow_smem(kernel, smem, done);
    if (e != cudaSuccess) return e;
    unsigned blocks;
    e = gemm_grid(a->mode, a->mode == CK_GEMM_DENSE ? (a->M + bm - 1) / bm : a->max_tiles, a->N, bn, &blocks);
    if (e != cudaSuccess || !blocks) return e;
    kernel<<<blocks, threads, smem, st>>>(*a);
    return cudaGetLastError();
}

template <int QT, int QBM, int SPLIT> cudaError_t launch_q2(const ck_qgemm_args *a, cudaStream_t st) {
    static unsigned done = 0; /* devices whose limit is raised */
    return launch_packed(qgemm2_kernel<QT, QBM, SPLIT>, QBM, QTHREADS, q2_smem<QT, QBM, SPLIT>(), &done, a, st);
}

template <int QT, int QBM> cudaError_t launch_v2(const ck_qgemm_args *a, cudaStream_t st) {
    return a->split == 2 ? launch_q2<QT, QBM, 2>(a, st) : launch_q2<QT, QBM, 1>(a, st);
}


/* ---- kernel v3: reordered weights, dequantized in registers ---------------
 * For INT4 and NVFP4 uploaded in the reordered layouts of cuda_qbits.h
 * (atoms of 16 columns x 64 K; ck_int4_reorder, ck_nvfp4_reorder).  The
 * tiles, warps, activation ring, fold (INT4) and epilogue (NVFP4: the
 * per-tensor global) are v2's; only the weight path differs: each stage one
 * 16-byte cp.async per thread brings the block's 8 atoms (128 columns x 64
 * K, 4 KiB, packed) into the ring, NVFP4 also their 8 scale atoms (512
 * bytes: 32 threads, 16 bytes each); at the MMAs each lane reads the 16
 * bytes of each of its warp's atoms (one ld.shared.v4: exactly its B
 * fragments of the 4 K chunks; NVFP4 also its 8 scale bytes) and decodes
 * them in registers (INT4: CK_INT4R_REG and one __hsub2 per register,
 * (128 + q) - (128 + zero); NVFP4: qdec_nvf4r, qdec_nvfp4's exact steps), so
 * there is no bf16 weight tile, no dequantization pass and no barrier besides
 * the ring's one.
 * Bitwise the same as v2: each output element sees the same A fragment, the
 * same B bits (the decodes are the same exact operations), the same chunk
 * order (hi then lo per chunk when split) and the same folds / epilogue, in
 * the same warp / lane / register position. */
template <int BM, int SPLIT> __host__ __device__ constexpr int q3_stages() { return BM == 32 ? (SPLIT == 1 ? 6 : 5) : 4; }
/* blocks per SM the registers are bounded for (MINB: __launch_bounds__): 3 by default with 32-row tiles
 * (the weight-streaming regime: more loads in flight; 80 registers, a few bytes spilled), else 2
 * (ck_qgemm_args.int4_reordered = 2 asks for 2 with 32-row tiles too: a tuning A/B, same results);
 * NVFP4's 128-row tiles: 1 */
constexpr int Q3_BSTAGE = QBN / 16 * CK_INT4R_ATOM_BYTES; /* packed weight bytes per stage: 4096 */
constexpr int Q3_SSTAGE = QBN / 16 * CK_NVF4R_SC_ATOM_BYTES; /* NVFP4 scale bytes per stage: 512 */
static_assert(Q3_BSTAGE == QTHREADS * 16, "one 16-byte weight copy per thread per stage");
static_assert(Q3_SSTAGE == 32 * 16, "one 16-byte scale copy per thread of warp 0 per stage");
/* weight bytes of one stage: the atoms (+ NVFP4 scale atoms) */
template <int QT> __host__ __device__ constexpr int q3_wstage() { return Q3_BSTAGE + (QT == CK_QT_NVFP4 ? Q3_SSTAGE : 0); }
template <int QT, int BM, int SPLIT> __host__ __device__ constexpr int q3_smem() {
    return q3_stages<BM, SPLIT>() * (SPLIT * BM * QPITCH * 2 + q3_wstage<QT>()) > BM * (QBN + 4) * 4
               ? q3_stages<BM, SPLIT>() * (SPLIT * BM * QPITCH * 2 + q3_wstage<QT>())
               : BM * (QBN + 4) * 4;
}
static_assert(q3_smem<CK_QT_NVFP4, 64, 2>() <= Q2_SMEM_2BLOCKS, "v3 fits two blocks per SM");
static_assert(3 * (q3_smem<CK_QT_NVFP4, 32, 2>() + 1024) <= 228 * 1024, "v3 BM 32 fits three blocks per SM");
static_assert(q3_smem<CK_QT_NVFP4, 128, 2>() <= 227 * 1024, "v3 BM 128 fits one block");

/* The INT4 fold state of one thread of a v3 / v4 warp (FOLD: INT4 only): the scales (and zero
 * words) of the NEXT scale group are loaded right after the current group's fold (zeros: at its
 * first chunk), so the load's L2 / DRAM latency runs under a whole group of MMAs instead of
 * stalling every warp at the fold, where the pipeline has lined them up; the values are the same,
 * so the sums are bitwise those of loading them at the fold. */
template <int NI> struct q3_fold {
    const __half *scale;  /* f16 [K / G, R] of the warp's matrix */
    const uint32_t *zrow; /* zero words [K / G, R / 8], NULL: symmetric */
    int64_t R;            /* the output columns N: the scale rows' length */
    int wcol, tig, g, fold_g, ngroups;
    int gpos, grp; /* the current chunk's K offset inside its group, and the group: counted, not divided
                    * (a run-time divisor costs ~20 instructions, and the chunk loop asked three per chunk) */
    float scn[NI][2];  /* the scales of the current group: columns wcol + 8 ni + 2 tig + q */
    uint32_t zwn[NI];  /* the zero words of the next group to start */
    uint32_t zz[NI];   /* bf16x2 (128 + zero) of the current group, per 8-column half */
    __device__ __forceinline__ void load_scales(int grp) {
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int n = wcol + ni * 8 + tig * 2 + q;
                scn[ni][q] = __half2float(__ldg(scale + (int64_t)grp * R + (n < R ? n : 0)));
            }
    }
    __device__ __forceinline__ void load_zeros(int grp) {
#pragma unroll
        for (int ni = 0; ni < NI; ni++) {
            const int zc = wcol / 8 + ni < (int)(R / 8) ? wcol / 8 + ni : (int)(R / 8) - 1;
            zwn[ni] = __ldg(zrow + (int64_t)grp * (R / 8) + zc);
        }
    }
    /* before the K loop: group 0's scales and zero words */
    __device__ __forceinline__ void init(const ck_qgemm_args &a, const ck_qmat *cm, int wcol_, int lane, int64_t K) {
        scale = static_cast<const __half *>(cm->scale);
        zrow = a.has_zeros ? static_cast<const uint32_t *>(cm->zeros) : nullptr;
        R = a.N, wcol = wcol_, tig = lane & 3, g = lane >> 2, fold_g = (int)a.group;
        ngroups = (int)((K + fold_g - 1) / fold_g);
        gpos = 0, grp = 0;
#pragma unroll
        for (int ni = 0; ni < NI; ni++) zz[ni] = 0x43084308u; /* symmetric: 136 = 128 + 8 */
        load_scales(0);
        if (zrow) load_zeros(0);
    }
};

/* One 64-wide K tile kt64 of a v3 / v4 MMA warp: the A tile `as` (SPLIT x [rows][PITCH] bf16, a_tile
 * elements apart; columns 0..63 of this K tile at column a_col0), the warp's NA weight atoms at
 * `wq` (atom na at wq + na * w_stride, this lane's 16 bytes at lane * 16 of it) and, NVFP4, their
 * scale atoms at `ws` (s_stride apart).  The K chunks in ascending order, each: the zeros at a
 * group's first chunk, the B fragments decoded in registers, the MMAs (hi then lo), the fold at a
 * group's last chunk (INT4; NVFP4 accumulates in acc directly). */
template <int QT, int SPLIT, int MI, int NI, int NA, int PITCH>
__device__ __forceinline__ void q3_k64(float (&acc)[MI][NI][4], float (&part)[MI][NI][4], q3_fold<NI> &f,
                                       int64_t K, int kt64, const bf16 *as, int a_tile, int a_col0, int arow0,
                                       const unsigned char *wq, int w_stride, const unsigned char *ws, int s_stride,
                                       int lane) {
    constexpr bool FOLD = QT == CK_QT_INT4, NVF = QT == CK_QT_NVFP4;
    const int g = lane >> 2;
    uint4 bw[NA]; /* this lane's 16 bytes of each atom of the warp: its B fragments of the 4 chunks */
    uint2 sw[NA]; /* NVFP4: its 8 scale bytes of each atom (chunk kc: 16-bit half kc % 2 of word kc / 2) */
#pragma unroll
    for (int na = 0; na < NA; na++) {
        bw[na] = *reinterpret_cast<const uint4 *>(wq + na * w_stride + lane * 16);
        if (NVF) sw[na] = *reinterpret_cast<const uint2 *>(ws + na * s_stride + g * 8);
    }
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        const int64_t kk = (int64_t)kt64 * 64 + ks * 16;
        if (kk >= K) break;
        if (FOLD && f.zrow && f.gpos == 0) { /* first chunk of a group: its zeros (loaded ahead) */
#pragma unroll
            for (int ni = 0; ni < NI; ni++) f.zz[ni] = qdec_int4r_zero(1, (f.zwn[ni] >> (4 * g)) & 15u);
            if (f.grp + 1 < f.ngroups) f.load_zeros(f.grp + 1);
        }
        uint32_t bfr[NI][2];
#pragma unroll
        for (int na = 0; na < NA; na++) {
            const uint32_t w = ks == 0 ? bw[na].x : ks == 1 ? bw[na].y : ks == 2 ? bw[na].z : bw[na].w;
            if (NVF) {
                uint32_t sh[2], r4[4];
                qdec_nvf4r_scales((ks < 2 ? sw[na].x : sw[na].y) >> (16 * (ks & 1)), sh);
                qdec_nvf4r(w, sh, r4);
#pragma unroll
                for (int p = 0; p < 4; p++) bfr[2 * na + (p >> 1)][p & 1] = r4[p];
            } else {
#pragma unroll
                for (int p = 0; p < 4; p++) {
                    const int ni = 2 * na + (p >> 1);
                    bfr[ni][p & 1] = qdec_int4r(w, p, f.zz[ni]);
                }
            }
        }
#pragma unroll
        for (int h = 0; h < SPLIT; h++) {
            uint32_t af[MI][4];
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
                ldsm_x4(af[mi][0], af[mi][1], af[mi][2], af[mi][3],
                        as + h * a_tile + (arow0 + mi * 16 + (lane & 15)) * PITCH + a_col0 + ks * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int ni = 0; ni < NI; ni++) {
                    if (FOLD)
                        mma16816(part[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
                    else
                        mma16816(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
                }
        }
        if (FOLD) {
            f.gpos += 16;
            if (f.gpos == f.fold_g || kk + 16 == K) { /* last chunk of a group: fold (as v2) */
                fold_frags(acc, part, f.scn);
                if (f.grp + 1 < f.ngroups) f.load_scales(f.grp + 1);
                f.grp++, f.gpos = 0;
            }
        }
    }
}

template <int QT, int BM, int SPLIT, int MINB>
__global__ void __launch_bounds__(QTHREADS, MINB) qgemm3_kernel(const ck_qgemm_args a) {
    constexpr int QBM = BM, QSTAGES = q3_stages<BM, SPLIT>(), WSTAGE = q3_wstage<QT>();
    constexpr int QWARPS_M = q_warps_m<BM>(), QWARPS_N = 8 / QWARPS_M;
    constexpr int WTM = QBM / QWARPS_M, WTN = QBN / QWARPS_N;
    constexpr int MI = WTM / 16, NI = WTN / 8, NA = WTN / 16; /* NA atoms per warp */
    constexpr int A_CHUNKS = QBM * (QBK / 8) / QTHREADS;
    constexpr int A_TILE = QBM * QPITCH;
    constexpr bool FOLD = QT == CK_QT_INT4, NVF = QT == CK_QT_NVFP4;
    static_assert(NA >= 1 && NI == 2 * NA, "a warp covers whole atoms");
    static_assert(QT == CK_QT_INT4 || QT == CK_QT_NVFP4, "v3: INT4 or NVFP4");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *As = reinterpret_cast<bf16 *>(smem_raw);                  /* [STAGES][SPLIT][BM][PITCH] */
    unsigned char *Bq = smem_raw + QSTAGES * SPLIT * A_TILE * 2;   /* [STAGES][8 atoms][32 lanes][16]
                                                                      (+ NVFP4 [8 scale atoms][64]) */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / QWARPS_N, wn = warp % QWARPS_N;
    int64_t nt, row0, rows;
    int e;
    if (!gemm_block_tile(a, QBM, QBN, nt, row0, rows, e)) return;
    const bf16 *A = reinterpret_cast<const bf16 *>(a.A);
    const int64_t K = a.K, N = a.N, K64 = (K + 63) / 64;

    const bf16 *a_src[A_CHUNKS];
    int a_dst[A_CHUNKS], a_col[A_CHUNKS];
    gemm_a_chunks<A_CHUNKS, QTHREADS, QBK, QPITCH>(a, A, tid, row0, rows, a_src, a_dst, a_col);
    /* the weight copy of this thread: block atom tid / 32 (columns 16 (tid / 32) ..), lane chunk tid % 32;
     * NVFP4, threads 0..31: 16-byte piece tid % 4 of the scale atom of block atom tid / 4 */
    const unsigned char *b_src, *s_src = nullptr;
    bool b_ok, s_ok = false;
    {
        const int c = (tid >> 5) * 16; /* block column of the atom */
        const ck_qmat *m = qmat_of(a, e, c);
        const int64_t n = a.mode == CK_GEMM_GATEUP ? nt * 64 + (c & 63) : nt * QBN + c;
        b_ok = n < N;
        b_src = static_cast<const unsigned char *>(m->q) + (b_ok ? CK_INT4R_ATOM_OFF(n / 16, (int64_t)0, K64) : 0) +
                (tid & 31) * 16;
        if (NVF && tid < 32) {
            const int cs = (tid >> 2) * 16;
            const ck_qmat *ms = qmat_of(a, e, cs);
            const int64_t ns = a.mode == CK_GEMM_GATEUP ? nt * 64 + (cs & 63) : nt * QBN + cs;
            s_ok = ns < N;
            s_src = static_cast<const unsigned char *>(ms->scale) +
                    (s_ok ? CK_NVF4R_SC_ATOM_OFF(ns / 16, (int64_t)0, K64) : 0) + (tid & 3) * 16;
        }
    }

    auto load_stage = [&](int kt, int stage) {
        gemm_a_load<A_CHUNKS, SPLIT>(As + stage * SPLIT * A_TILE, A_TILE, a_src, a_dst, a_col, (int64_t)kt * QBK, K, A);
        /* atom (n / 16, kt) of this thread's matrix: kt * 512 bytes after atom (n / 16, 0) */
        unsigned char *bs = Bq + stage * WSTAGE;
        cp_async16(bs + tid * 16, b_ok ? b_src + (int64_t)kt * CK_INT4R_ATOM_BYTES : b_src, b_ok);
        if (NVF && tid < 32) /* scale atom (n / 16, kt): kt * 64 bytes after atom (n / 16, 0) */
            cp_async16(bs + Q3_BSTAGE + tid * 16, s_ok ? s_src + (int64_t)kt * CK_NVF4R_SC_ATOM_BYTES : b_src, s_ok);
    };

    float acc[MI][NI][4], part[MI][NI][4];
    zero_frags(acc);
    zero_frags(part);
    const ck_qmat *cm = qmat_of(a, e, wn * WTN);
    /* the warp's first column in its matrix (its WTN columns are contiguous in one matrix); accumulator
     * columns wcol + 8 ni + 2 tig + q, B fragment columns wcol + 8 ni + g */
    const int wcol = (int)(a.mode == CK_GEMM_GATEUP ? nt * 64 + ((wn * WTN) & 63) : nt * QBN + wn * WTN);
    q3_fold<NI> f;
    if (FOLD) f.init(a, cm, wcol, lane, K);
    cp_ring<QSTAGES>((int)((K + QBK - 1) / QBK), load_stage, [&](int kt, int stage) {
        const unsigned char *bs = Bq + stage * WSTAGE;
        q3_k64<QT, SPLIT, MI, NI, NA, QPITCH>(acc, part, f, K, kt, As + stage * SPLIT * A_TILE, A_TILE, 0, wm * WTM,
                                              bs + wn * NA * CK_INT4R_ATOM_BYTES, CK_INT4R_ATOM_BYTES,
                                              bs + Q3_BSTAGE + wn * NA * CK_NVF4R_SC_ATOM_BYTES, CK_NVF4R_SC_ATOM_BYTES,
                                              lane);
    });
    cp_async_wait<0>();

    /* NVFP4: the per-tensor global of the warp's matrix (v2's epilogue) */
    const float gs = NVF ? cm->global : 1.0f;
    const int gdiv = NVF ? a.global_div : 0;
    mma_epilogue<QBM, QBN, WTM, WTN, QTHREADS>(a, acc, N, a.split, row0, rows, nt, wm, wn, lane, tid, smem_raw,
                                               [gs, gdiv](float v, int64_t) {
                                                   return NVF ? (gdiv ? v / gs : v * gs) : v;
                                               });
}

template <int QT, int QBM, int SPLIT, int MINB> cudaError_t launch_q3(const ck_qgemm_args *a, cudaStream_t st) {
    static unsigned done = 0; /* devices whose limit is raised */
    return launch_packed(qgemm3_kernel<QT, QBM, SPLIT, MINB>, QBM, QTHREADS, q3_smem<QT, QBM, SPLIT>(), &done, a, st);
}

template <int QT, int QBM, int MINB> cudaError_t launch_v3(const ck_qgemm_args *a, cudaStream_t st) {
    return a->split == 2 ? launch_q3<QT, QBM, 2, MINB>(a, st) : launch_q3<QT, QBM, 1, MINB>(a, st);
}

/* ---- kernel v4: v3's warps fed by a loading warp (Hopper bulk copies) -----
 * v3 at small passes is bound by its pipeline, not by DRAM: every thread
 * both copies (one 16-byte cp.async of 4 KiB of packed weights per 64-wide
 * K stage) and multiplies, behind one block-wide barrier per stage, so a
 * stage moves 4x fewer weight bytes than the BF16 kernels' for the same
 * per-stage cost (docs/BENCHMARKS.md: INT4 at 300 tokens ~0.8 TB/s).  v4
 * keeps v3's tiles, warps and register decode (q3_k64: the same
 * instructions in the same order, so bitwise v3's sums) and adds a ninth
 * warp that, per 128-wide K stage, issues one bulk copy (cp.async.bulk,
 * completing on the stage's full mbarrier) per column group of 16: the
 * group's two consecutive atoms, 1 KiB (NVFP4: also its two scale atoms,
 * 128 bytes), and one per activation row (256 bytes; precise: hi and lo),
 * and refills a stage as soon as the 8 MMA warps release it (empty
 * mbarrier), as cuda_gemm.cu's gemm_tma_kernel does for BF16.  No
 * block-wide barrier in the K loop.  Rows past the tile's and column
 * groups past N are not copied: their accumulators see stale shared memory
 * and are never stored (each output element reads its own A row and W
 * column only).  Needs K % 128 == 0 (ck_qgemm falls back to v3 otherwise)
 * and the rows of A 16-byte aligned (lda % 8 == 0).
 * Measured on the H200 (2026-12-02, docs/BENCHMARKS.md): bitwise v2 / v3
 * everywhere, but no faster: the INT4 gate+up pass at 300 tokens 279 us
 * against v3's 274 (same divisions then), NVFP4 end to end 24.2 / 54.4 ms
 * at 300 / 1,000 tokens against v3's 21.7 / 50.1, INT4's 64-row tiles (one
 * block per SM) 66.0 ms at 1,000 against 51.7.  So the copies were never
 * the limit: the MMA warps' own instruction stream is (Nsight Compute:
 * 0.54-0.62 issued warps per scheduler, DRAM at 16%).  Opt-in only
 * (CLEF_CUDA_QGEMM_INT4=v4 / CLEF_CUDA_QGEMM_NVFP4=v4), kept as the base
 * for a consumer with more independent work per warp. */
#ifdef CLEF_CUDA_WGMMA
constexpr int Q4_KS = 128;                                         /* K per stage */
constexpr int Q4_APITCH = Q4_KS + 8;                               /* activation row pitch: 272 bytes */
constexpr int Q4_GW = (Q4_KS / 64) * CK_INT4R_ATOM_BYTES;          /* one column group's weights per stage */
constexpr int Q4_GS = (Q4_KS / 64) * CK_NVF4R_SC_ATOM_BYTES;       /* NVFP4: its scale atoms */
constexpr int Q4_THREADS = QTHREADS + 32;                          /* + the loading warp */
template <int QT> __host__ __device__ constexpr int q4_wbytes() { return 8 * Q4_GW + (QT == CK_QT_NVFP4 ? 8 * Q4_GS : 0); }
template <int QT, int BM, int SPLIT> __host__ __device__ constexpr int q4_stage_bytes() {
    return q4_wbytes<QT>() + SPLIT * BM * Q4_APITCH * 2;
}
/* two blocks per SM when at least 3 stages fit in half the shared memory and the registers allow it
 * (INT4's 64-row tiles carry the fold's second accumulator set: 2 blocks of 288 threads would cap them
 * at 112 registers and spill), else one block with up to 8 stages */
template <int QT, int BM, int SPLIT> __host__ __device__ constexpr int q4_minb() {
    return (110 * 1024) / q4_stage_bytes<QT, BM, SPLIT>() >= 3 && (BM == 32 || QT == CK_QT_NVFP4) ? 2 : 1;
}
template <int QT, int BM, int SPLIT> __host__ __device__ constexpr int q4_stages() {
    return ((q4_minb<QT, BM, SPLIT>() == 2 ? 110 : 220) * 1024) / q4_stage_bytes<QT, BM, SPLIT>() < 8
               ? ((q4_minb<QT, BM, SPLIT>() == 2 ? 110 : 220) * 1024) / q4_stage_bytes<QT, BM, SPLIT>()
               : 8;
}
template <int QT, int BM, int SPLIT> __host__ __device__ constexpr int q4_smem() {
    return q4_stages<QT, BM, SPLIT>() * q4_stage_bytes<QT, BM, SPLIT>();
}
static_assert(q4_stage_bytes<CK_QT_NVFP4, 64, 2>() % 16 == 0 && q4_stage_bytes<CK_QT_INT4, 32, 1>() % 16 == 0,
              "stages stay 16-byte aligned");
static_assert(q4_stages<CK_QT_NVFP4, 64, 2>() >= 4 && q4_stages<CK_QT_INT4, 32, 1>() >= 6, "pipeline depth");
static_assert(64 * (QBN + 4) * 4 <= q4_smem<CK_QT_INT4, 64, 1>(), "epilogue tile fits");
static_assert(32 * (QBN + 4) * 4 <= q4_smem<CK_QT_INT4, 32, 1>(), "epilogue tile fits");

#ifdef CLEF_WGMMA_DEVICE
/* `bytes` (a multiple of 16) from global src to shared dst (both 16-byte aligned), completing on b. */
static __device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(b))
                 : "memory");
}
#endif

template <int QT, int BM, int SPLIT>
__global__ void __launch_bounds__(Q4_THREADS, q4_minb<QT, BM, SPLIT>()) qgemm4_kernel(const ck_qgemm_args a) {
#ifdef CLEF_WGMMA_DEVICE
    constexpr int STAGES = q4_stages<QT, BM, SPLIT>(), SBY = q4_stage_bytes<QT, BM, SPLIT>(), WBY = q4_wbytes<QT>();
    constexpr int QWARPS_M = q_warps_m<BM>(), QWARPS_N = 8 / QWARPS_M;
    constexpr int WTM = BM / QWARPS_M, WTN = QBN / QWARPS_N;
    constexpr int MI = WTM / 16, NI = WTN / 8, NA = WTN / 16;
    constexpr int A_TILE = BM * Q4_APITCH, SUB = Q4_KS / 64, RPL = (BM + 31) / 32;
    constexpr bool FOLD = QT == CK_QT_INT4, NVF = QT == CK_QT_NVFP4;
    static_assert(NA >= 1 && NI == 2 * NA, "a warp covers whole atoms");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    __shared__ const bf16 *arow[BM];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int64_t nt, row0, rows;
    int e;
    if (!gemm_block_tile(a, BM, QBN, nt, row0, rows, e)) return;
    const bf16 *A = reinterpret_cast<const bf16 *>(a.A);
    const int64_t K = a.K, N = a.N, K64 = (K + 63) / 64;
    const int ktiles = (int)(K / Q4_KS);
    if (tid < BM) { /* the tile's A rows (GATEUP gathers through row_src); NULL past its rows: not copied */
        int64_t p = row0 + tid;
        if (tid < rows && a.mode == CK_GEMM_GATEUP) p = a.row_src[p];
        arow[tid] = tid < rows ? A + p * a.lda : nullptr;
    }
    if (tid == 0)
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 32); /* one expect_tx arrival per lane of the loading warp */
            mbar_init(&empty[s], 8); /* one arrival per MMA warp */
        }
    fence_proxy_async();
    __syncthreads();

    if (warp == 8) { /* the loading warp: lanes 0..7 the column groups, every lane its rows */
        const unsigned char *wsrc = nullptr, *ssrc = nullptr;
        if (lane < 8) {
            const int c = lane * 16;
            const ck_qmat *m = qmat_of(a, e, c);
            const int64_t n = a.mode == CK_GEMM_GATEUP ? nt * 64 + (c & 63) : nt * QBN + c;
            if (n < N) {
                wsrc = static_cast<const unsigned char *>(m->q) + CK_INT4R_ATOM_OFF(n / 16, (int64_t)0, K64);
                if (NVF) ssrc = static_cast<const unsigned char *>(m->scale) + CK_NVF4R_SC_ATOM_OFF(n / 16, (int64_t)0, K64);
            }
        }
        const bf16 *rp[RPL];
        uint32_t bytes = wsrc ? Q4_GW + (NVF ? Q4_GS : 0) : 0;
#pragma unroll
        for (int j = 0; j < RPL; j++) {
            const int r = lane + 32 * j;
            rp[j] = r < BM ? arow[r] : nullptr;
            if (rp[j]) bytes += SPLIT * Q4_KS * 2;
        }
        for (int kt = 0; kt < ktiles; kt++) {
            const int s = kt % STAGES;
            if (kt >= STAGES) mbar_wait(&empty[s], (uint32_t)((kt / STAGES - 1) & 1));
            /* the MMA warps' generic-proxy reads of the stage before the async-proxy copies that
             * overwrite it (gemm_tma_kernel's fence) */
            fence_proxy_async();
            unsigned char *st = smem_raw + s * SBY;
            mbar_arrive_expect_tx(&full[s], bytes);
            if (wsrc) {
                bulk_load(st + lane * Q4_GW, wsrc + (int64_t)kt * Q4_GW, Q4_GW, &full[s]);
                if (NVF) bulk_load(st + 8 * Q4_GW + lane * Q4_GS, ssrc + (int64_t)kt * Q4_GS, Q4_GS, &full[s]);
            }
            bf16 *as = reinterpret_cast<bf16 *>(st + WBY);
#pragma unroll
            for (int j = 0; j < RPL; j++)
                if (rp[j])
#pragma unroll
                    for (int h = 0; h < SPLIT; h++)
                        bulk_load(as + (h * BM + lane + 32 * j) * Q4_APITCH, rp[j] + h * K + (int64_t)kt * Q4_KS,
                                  Q4_KS * 2, &full[s]);
        }
        return; /* the copies complete on the full barriers the MMA warps wait on; the block lives on */
    }

    const int wm = warp / QWARPS_N, wn = warp % QWARPS_N;
    float acc[MI][NI][4], part[MI][NI][4];
    zero_frags(acc);
    zero_frags(part);
    const ck_qmat *cm = qmat_of(a, e, wn * WTN);
    const int wcol = (int)(a.mode == CK_GEMM_GATEUP ? nt * 64 + ((wn * WTN) & 63) : nt * QBN + wn * WTN);
    q3_fold<NI> f;
    if (FOLD) f.init(a, cm, wcol, lane, K);
    for (int kt = 0; kt < ktiles; kt++) {
        const int s = kt % STAGES;
        mbar_wait(&full[s], (uint32_t)((kt / STAGES) & 1));
        const unsigned char *st = smem_raw + s * SBY;
#pragma unroll
        for (int sub = 0; sub < SUB; sub++)
            q3_k64<QT, SPLIT, MI, NI, NA, Q4_APITCH>(acc, part, f, K, kt * SUB + sub,
                                                     reinterpret_cast<const bf16 *>(st + WBY), A_TILE, sub * 64,
                                                     wm * WTM, st + wn * NA * Q4_GW + sub * CK_INT4R_ATOM_BYTES, Q4_GW,
                                                     st + 8 * Q4_GW + wn * NA * Q4_GS + sub * CK_NVF4R_SC_ATOM_BYTES,
                                                     Q4_GS, lane);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
    }
    const float gs = NVF ? cm->global : 1.0f;
    const int gdiv = NVF ? a.global_div : 0;
    mma_epilogue<BM, QBN, WTM, WTN, QTHREADS>(a, acc, N, a.split, row0, rows, nt, wm, wn, lane, tid, smem_raw,
                                              [gs, gdiv](float v, int64_t) { return NVF ? (gdiv ? v / gs : v * gs) : v; },
                                              true);
#endif
}

template <int QT, int BM, int SPLIT> cudaError_t launch_q4(const ck_qgemm_args *a, cudaStream_t st) {
    static unsigned done = 0; /* devices whose limit is raised */
    return launch_packed(qgemm4_kernel<QT, BM, SPLIT>, BM, Q4_THREADS, q4_smem<QT, BM, SPLIT>(), &done, a, st);
}
template <int QT, int BM> cudaError_t launch_v4(const ck_qgemm_args *a, cudaStream_t st) {
    return a->split == 2 ? launch_q4<QT, BM, 2>(a, st) : launch_q4<QT, BM, 1>(a, st);
}
#endif /* CLEF_CUDA_WGMMA */

/* ---- kernel v5: skinny grouped products (a few rows per expert) ----------
 * For the grouped modes (GATEUP, DOWN) of passes averaging up to
 * CLEF_CUDA_V5_ROWS (1024) rows per expert, on 32-row tiles (1 x 300 tokens
 * is ~19 per expert, 1 x 1,000 ~62: two tiles; a pass of 8,192 tokens 512:
 * sixteen), ahead of the packed wgmma kernel, fast numerics (split 1), INT4
 * and NVFP4 in the reordered layouts of cuda_qbits.h.  At these shapes the
 * products stream their weights once and the work per weight byte is the
 * limit (docs/BENCHMARKS.md, issue 18), so v5 is v3 rearranged to spend the
 * fewest instructions per packed byte:
 *  - swapped operands: the decoded weights are the A operand of
 *    mma.m16n8k16 (16 output columns x 16 K), the activation rows the B
 *    operand (8 rows per n8 tile), so a 19-row tile costs 3 MMAs per 16 x 16
 *    weights instead of 4, and n8 tiles past the tile's rows are skipped.
 *    The v3 atoms need no new layout: lane l's word of chunk kc holds its
 *    B-fragment registers p = 2 ni + j (column half ni, K half j), which are
 *    exactly its A-fragment registers a0 = p0, a1 = p2, a2 = p1, a3 = p3;
 *  - each warp owns two 16-column stripes (GATEUP: the gate and the up
 *    stripe of the same 16 intermediate columns, so the SwiGLU is done in
 *    registers, no shared-memory epilogue; DOWN: two adjacent stripes), and
 *    every activation fragment it loads feeds both;
 *  - the block's 8 warps share one activation tile per 128-wide K stage
 *    (32 rows x 128, rows past the tile zero-filled without reading), in a
 *    3-stage cp.async ring with v3's one barrier per stage; each thread
 *    copies its own lane's 16 bytes of its warp's four atoms (16 KiB of
 *    packed weights per stage per block; NVFP4 also their scale atoms, INT4
 *    the scales and zeros of the stage's groups: no load of its own in the K
 *    loop);
 *  - the tile's n8 row tiles are a compile-time count (four bodies, one
 *    picked per block), so its MMAs are straight-line code;
 *  - when K % 128 == 0 and INT4 groups are 128 wide (the checkpoints'
 *    shapes), a second kernel of whole stages (q5_body's CPG): no K bound
 *    checks, fixed fold positions, copy sources advanced by fixed strides
 *    (the general kernel spent ~3 instructions of overhead per MMA on
 *    them: 1,465 SASS instructions per INT4 stage, 534 in the whole-stage
 *    kernel);
 *  - NVFP4 decoded as fp4 x scale x 2^-9 in one bf16x2 multiply per register
 *    (qdec_nvf4r9), the sums multiplied by 2^9 before the global scale.
 * Bitwise v3 (and so v2): every output element is the same sum — the same
 * exact bf16 weight codes (INT4: the same decode; NVFP4: the same codes
 * times 2^-9, so every product and partial sum of the tensor core times the
 * same power of two, undone exactly: the same bits unless a product falls
 * below 2^-117), the same bf16 activations, the products of each 16-wide K
 * chunk added to the same f32 accumulator in ascending chunk order (the
 * tensor core's sum of a chunk does not depend on which operand holds which
 * factor: the products are exact), the INT4 fold at the same K positions
 * with the same scale (acc = fma(part, scale, acc)), the same NVFP4 global
 * and SwiGLU expressions.  tests/unit/test_cuda_quant.c checks v5 against
 * v3 and v2, both kernels. */
constexpr int Q5_WARPS = 8, Q5_THREADS = Q5_WARPS * 32, Q5_BM = 32, Q5_STAGES = 3;
constexpr int Q5_KS = 128;                        /* K per stage: two atoms per stripe */
constexpr int Q5_XPITCH = Q5_KS + 8;              /* bf16 row pitch of the activation tile */
constexpr int Q5_XBYTES = Q5_BM * Q5_XPITCH * 2;  /* 8704 */
constexpr int Q5_WBYTES = Q5_WARPS * 2 * 2 * CK_INT4R_ATOM_BYTES;    /* 16384: [warp][stripe][atom][lane 16 B] */
constexpr int Q5_SBYTES = Q5_WARPS * 2 * 2 * CK_NVF4R_SC_ATOM_BYTES; /* 2048: NVFP4 scale atoms, same order */
/* INT4: the f16 scales and zero words of the (at most 8) groups a 128-wide stage overlaps (G = 16: 8; a G
 * that does not divide 128 is >= 48: at most 4), per warp and stripe: [warp][stripe][group][16 columns]
 * halves, [warp][stripe][group][2] words */
constexpr int Q5_GSLOTS = 8;
constexpr int Q5_ISBYTES = Q5_WARPS * 2 * Q5_GSLOTS * 16 * 2; /* 4096 */
constexpr int Q5_IZBYTES = Q5_WARPS * 2 * Q5_GSLOTS * 2 * 4;  /* 1024 */
template <int QT> __host__ __device__ constexpr int q5_stage_bytes() {
    return Q5_XBYTES + Q5_WBYTES + (QT == CK_QT_NVFP4 ? Q5_SBYTES : Q5_ISBYTES + Q5_IZBYTES);
}
template <int QT> __host__ __device__ constexpr int q5_smem() { return Q5_STAGES * q5_stage_bytes<QT>(); }
static_assert(2 * (q5_smem<CK_QT_NVFP4>() + 1024) <= 228 * 1024 && 2 * (q5_smem<CK_QT_INT4>() + 1024) <= 228 * 1024,
              "v5 fits two blocks per SM");
static_assert(Q5_BM * Q5_KS / 8 == 2 * Q5_THREADS, "two 16-byte activation copies per thread per stage");
/* Block columns in gemm_col_tiles' terms: 32 weight rows per warp (GATEUP: 16 gate + 16 up rows of 16
 * intermediate columns, so 128 per block; DOWN: 32 output columns, 256 per block) */
constexpr int Q5_BN = Q5_WARPS * 32;

/* The block's work for a tile of NT n8 row tiles (rows <= 8 NT): NT a compile-time constant, so the MMAs
 * and fragment loads of the tile's row tiles are straight-line code (no per-MMA branch).
 * CPG > 0, the whole-stage body: K % 128 == 0 and (INT4) groups of 16 CPG K values (CPG 1, 2, 4 or 8:
 * G 16 .. 128; NVFP4 passes 8), so every stage is whole and a group's first and last chunk are fixed
 * chunks of the stage: the K loop has no bound checks, no group counter, no division (the stage's
 * groups are kt 8 / CPG ..), and a group's first MMA adds to a zero C instead of zeroing its partial
 * sums after the previous fold (the same +0 start, so the same sums).  CPG = 0: any K % 16 == 0 and
 * group (the general body, a run-time group counter). */
template <int QT, int NT, int CPG>
__device__ __forceinline__ void q5_body(const ck_qgemm_args &a, int64_t nt, int64_t row0, int64_t rows, int e,
                                        unsigned char *smem_raw) {
    constexpr bool FOLD = QT == CK_QT_INT4, NVF = QT == CK_QT_NVFP4, WHOLE = CPG > 0;
    constexpr int CPG1 = WHOLE ? CPG : 1, GPS = Q5_KS / 16 / CPG1; /* INT4 whole stages: groups per stage */
    static_assert(CPG == 0 || (CPG <= 8 && 8 % CPG1 == 0), "a whole stage holds whole groups");
    constexpr int SB = q5_stage_bytes<QT>();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
    const bool gateup = a.mode == CK_GEMM_GATEUP;
    const int64_t K = a.K, N = a.N, K64 = (K + 63) / 64;
    const bf16 *A = reinterpret_cast<const bf16 *>(a.A);

    /* the warp's two stripes: matrix, first column */
    const ck_qmat *m[2];
    int64_t col[2];
    if (gateup) {
        col[0] = col[1] = nt * (Q5_BN / 2) + warp * 16;
        m[0] = &a.W0[e], m[1] = &a.W1[e];
    } else {
        col[0] = nt * Q5_BN + warp * 32, col[1] = col[0] + 16;
        m[0] = m[1] = &a.W0[e];
    }
    const unsigned char *wsrc[2], *ssrc[2] = {nullptr, nullptr};
    bool wok[2];
#pragma unroll
    for (int s = 0; s < 2; s++) {
        wok[s] = col[s] < N;
        wsrc[s] = static_cast<const unsigned char *>(m[s]->q) +
                  (wok[s] ? CK_INT4R_ATOM_OFF(col[s] / 16, (int64_t)0, K64) : 0) + lane * 16;
        if (NVF)
            ssrc[s] = static_cast<const unsigned char *>(m[s]->scale) +
                      (wok[s] ? CK_NVF4R_SC_ATOM_OFF(col[s] / 16, (int64_t)0, K64) : 0) + (lane & 3) * 16;
    }
    const bf16 *x_src[2];
    int x_dst[2], x_col[2];
    gemm_a_chunks<2, Q5_THREADS, Q5_KS, Q5_XPITCH>(a, A, tid, row0, rows, x_src, x_dst, x_col);
    /* INT4: each stripe's scales f16 [K / G, R] and zero words [K / G, R / 8] (NULL: symmetric) */
    const int64_t G = FOLD ? a.group : 1, R = N;
    const __half *scl[2];
    const uint32_t *zrw[2];
#pragma unroll
    for (int s = 0; s < 2; s++) {
        scl[s] = static_cast<const __half *>(m[s]->scale);
        zrw[s] = FOLD && a.has_zeros ? static_cast<const uint32_t *>(m[s]->zeros) : nullptr;
    }

    /* Whole stages: every copy of a stage is its copy of the previous stage advanced by a fixed stride
     * (cp_ring loads the stages in order), so the sources are set once here and load_stage adds the
     * strides: 64-bit source, its validity and its stride per copy (stride 0 where invalid, so the
     * source stays an address inside its array).  x: the two activation chunks (128 bf16 a stage);
     * w: each stripe's atom pair (two atoms a stage); sc: NVFP4 lanes 0..15's scale piece (two scale
     * atoms a stage), INT4 the lane's group scales (GPS groups a stage); zr: INT4 zero words. */
    const unsigned char *xp[2] = {nullptr, nullptr}, *wp[2] = {nullptr, nullptr}, *sp = nullptr, *zp = nullptr;
    bool xok[2] = {false, false}, sok = false, zok = false;
    int64_t sinc = 0, zinc = 0;
    int sdst = 0, zdst = 0;
    if (WHOLE) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            xok[i] = x_src[i] != nullptr;
            xp[i] = reinterpret_cast<const unsigned char *>(xok[i] ? x_src[i] + x_col[i] : A);
            wp[i] = wsrc[i];
        }
        if (NVF) {
            const int st = lane >> 3, i = (lane >> 2) & 1;
            sok = st ? wok[1] : wok[0];
            sp = (st ? ssrc[1] : ssrc[0]) + (sok ? i * CK_NVF4R_SC_ATOM_BYTES : 0);
            sinc = sok ? 2 * CK_NVF4R_SC_ATOM_BYTES : 0;
            sdst = Q5_XBYTES + Q5_WBYTES + ((warp * 2 + st) * 2 + i) * CK_NVF4R_SC_ATOM_BYTES + (lane & 3) * 16;
        }
        if (FOLD) {
            const int st = lane >> 4, gl = (lane >> 1) & 7, hh = lane & 1;
            const int64_t c0 = st ? col[1] : col[0];
            sok = gl < GPS && c0 + 8 * hh < R;
            sp = reinterpret_cast<const unsigned char *>((st ? scl[1] : scl[0]) + (sok ? gl * R + c0 + 8 * hh : 0));
            sinc = sok ? (int64_t)GPS * R * 2 : 0;
            sdst = Q5_XBYTES + Q5_WBYTES + (((warp * 2 + st) * Q5_GSLOTS + gl) * 16 + 8 * hh) * 2;
            if (a.has_zeros) {
                zok = gl < GPS && c0 / 8 + hh < R / 8;
                zp = reinterpret_cast<const unsigned char *>((st ? zrw[1] : zrw[0]) +
                                                             (zok ? gl * (R / 8) + c0 / 8 + hh : 0));
                zinc = zok ? (int64_t)GPS * (R / 8) * 4 : 0;
                zdst = Q5_XBYTES + Q5_WBYTES + Q5_ISBYTES + (((warp * 2 + st) * Q5_GSLOTS + gl) * 2 + hh) * 4;
            }
        }
    }

    auto load_stage = [&](int kt, int stage) {
        unsigned char *sb = smem_raw + stage * SB;
        if (WHOLE) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                cp_async16(sb + 2 * x_dst[i], xp[i], xok[i]);
                xp[i] += xok[i] ? Q5_KS * 2 : 0;
            }
            unsigned char *wb = sb + Q5_XBYTES + warp * 4 * CK_INT4R_ATOM_BYTES + lane * 16;
#pragma unroll
            for (int st = 0; st < 2; st++) {
#pragma unroll
                for (int i = 0; i < 2; i++)
                    cp_async16(wb + (2 * st + i) * CK_INT4R_ATOM_BYTES, wp[st] + i * CK_INT4R_ATOM_BYTES, wok[st]);
                wp[st] += wok[st] ? 2 * CK_INT4R_ATOM_BYTES : 0;
            }
            if (FOLD || (NVF && lane < 16)) { /* (NVFP4 lanes 16..31 copy nothing: their slots are the next warp's) */
                cp_async16(sb + sdst, sp, sok);
                sp += sinc;
            }
            if (FOLD && a.has_zeros) {
                cp_async4(sb + zdst, zp, zok);
                zp += zinc;
            }
            return;
        }
        /* the general body: each copy from the stage index, bounded by K */
        gemm_a_load<2, 1>(reinterpret_cast<bf16 *>(sb), 0, x_src, x_dst, x_col, (int64_t)kt * Q5_KS, K, A);
        unsigned char *wb = sb + Q5_XBYTES + warp * 4 * CK_INT4R_ATOM_BYTES;
#pragma unroll
        for (int s = 0; s < 2; s++)
#pragma unroll
            for (int i = 0; i < 2; i++) { /* atom 2 kt + i of the stripe (none past K) */
                const bool ok = wok[s] && 2 * kt + i < K64;
                cp_async16(wb + (2 * s + i) * CK_INT4R_ATOM_BYTES + lane * 16,
                           ok ? wsrc[s] + (int64_t)(2 * kt + i) * CK_INT4R_ATOM_BYTES : wsrc[s], ok);
            }
        /* (lane-dependent stripe choices are selects, not indices: an index would put the arrays in local memory) */
        if (NVF && lane < 16) { /* lanes 0..15: piece lane % 4 of atom (lane / 4) % 2 of stripe lane / 8's scales */
            const int s = lane >> 3, i = (lane >> 2) & 1;
            const bool ok = (s ? wok[1] : wok[0]) && 2 * kt + i < K64;
            const unsigned char *src = s ? ssrc[1] : ssrc[0];
            cp_async16(sb + Q5_XBYTES + Q5_WBYTES + ((warp * 2 + s) * 2 + i) * CK_NVF4R_SC_ATOM_BYTES + (lane & 3) * 16,
                       ok ? src + (int64_t)(2 * kt + i) * CK_NVF4R_SC_ATOM_BYTES : src, ok);
        }
        if (FOLD) { /* the scales and zero words of the groups g0 .. g1 this stage overlaps: lane = stripe (lane /
                     * 16), group g0 + (lane / 2) % 8, half (lane % 2: columns 8 h .. 8 h + 7 / zero word h) */
            const int64_t k0 = (int64_t)kt * Q5_KS, k1 = (k0 + Q5_KS - 1 < K ? k0 + Q5_KS - 1 : K - 1);
            const int64_t g0 = k0 / G;
            const int st = lane >> 4, gl = (lane >> 1) & 7, hh = lane & 1;
            const bool gok = g0 + gl <= k1 / G;
            const int64_t c0 = st ? col[1] : col[0];
            const __half *sc = st ? scl[1] : scl[0];
            const bool sok = gok && c0 + 8 * hh < R;
            cp_async16(sb + Q5_XBYTES + Q5_WBYTES + (((warp * 2 + st) * Q5_GSLOTS + gl) * 16 + 8 * hh) * 2,
                       sok ? sc + (g0 + gl) * R + c0 + 8 * hh : sc, sok);
            if (a.has_zeros) {
                const uint32_t *zr = st ? zrw[1] : zrw[0];
                const bool zok = gok && c0 / 8 + hh < R / 8;
                cp_async4(sb + Q5_XBYTES + Q5_WBYTES + Q5_ISBYTES + (((warp * 2 + st) * Q5_GSLOTS + gl) * 2 + hh) * 4,
                          zok ? zr + (g0 + gl) * (R / 8) + c0 / 8 + hh : zr, zok);
            }
        }
    };

    float acc[2][NT][4], part[2][NT][4];
    zero_frags(acc);
    if (!WHOLE) zero_frags(part);
    /* INT4 fold state (v3's q3_fold, per stripe; accumulator rows = columns col + g + 8 h): the scales and
     * zeros come through the ring with the weights (a group's values in the stage of its first / last
     * chunk), not as loads of their own whose latency the fold would wait for */
    uint32_t zz[2][2];
    int64_t gpos = 0;
    int grp = 0;
    if (FOLD)
#pragma unroll
        for (int s = 0; s < 2; s++) zz[s][0] = zz[s][1] = 0x43084308u; /* symmetric: 136 = 128 + 8 */

    cp_ring<Q5_STAGES>((int)((K + Q5_KS - 1) / Q5_KS), load_stage, [&](int kt, int stage) {
        const unsigned char *sb = smem_raw + stage * SB;
        const bf16 *xs = reinterpret_cast<const bf16 *>(sb);
        const int grp0 = grp; /* the group of the stage's first K: slot 0 of its scales / zeros */
        const __half *ss = reinterpret_cast<const __half *>(sb + Q5_XBYTES + Q5_WBYTES) + warp * 2 * Q5_GSLOTS * 16;
        const uint32_t *zs =
            reinterpret_cast<const uint32_t *>(sb + Q5_XBYTES + Q5_WBYTES + Q5_ISBYTES) + warp * 2 * Q5_GSLOTS * 2;
        uint4 bw[2]; /* this lane's 16 bytes of the current atom of each stripe (read at its first chunk) */
        uint2 sw[2];
#pragma unroll
        for (int ks = 0; ks < Q5_KS / 16; ks++) {
            const int64_t kk = (int64_t)kt * Q5_KS + ks * 16;
            if (!WHOLE && kk >= K) break;
            const int i = ks >> 2, kc = ks & 3; /* atom, chunk in the atom */
            /* INT4: whether this chunk starts / ends a group, and the stage slot of its group's scales */
            const bool first = WHOLE ? ks % CPG1 == 0 : gpos == 0;
            const int slot = WHOLE ? ks / CPG1 : grp - grp0;
            if (kc == 0)
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    bw[s] = *reinterpret_cast<const uint4 *>(sb + Q5_XBYTES +
                                                             (warp * 4 + 2 * s + i) * CK_INT4R_ATOM_BYTES + lane * 16);
                    if (NVF)
                        sw[s] = *reinterpret_cast<const uint2 *>(sb + Q5_XBYTES + Q5_WBYTES +
                                                                 ((warp * 2 + s) * 2 + i) * CK_NVF4R_SC_ATOM_BYTES + g * 8);
                }
            if (FOLD && a.has_zeros && first) { /* first chunk of a group: its zeros (this stage's slot) */
#pragma unroll
                for (int s = 0; s < 2; s++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        zz[s][h] = qdec_int4r_zero(1, (zs[(s * Q5_GSLOTS + slot) * 2 + h] >> (4 * g)) & 15u);
            }
            /* B fragments of the activation rows: n8 tiles 2 jp, 2 jp + 1 from one ldmatrix.x4 (matrices:
             * rows 16 jp + 0..7 at K 0..7, 8..15, then rows 16 jp + 8..15); an odd NT's last tile by .x4 too
             * (the rows past it are zero-filled) */
            uint32_t bx[(NT + 1) / 2 * 2][2];
#pragma unroll
            for (int jp = 0; jp < (NT + 1) / 2; jp++)
                ldsm_x4(bx[2 * jp][0], bx[2 * jp][1], bx[2 * jp + 1][0], bx[2 * jp + 1][1],
                        xs + (16 * jp + (lane >> 4) * 8 + (lane & 7)) * Q5_XPITCH + ks * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int s = 0; s < 2; s++) {
                const uint32_t w = kc == 0 ? bw[s].x : kc == 1 ? bw[s].y : kc == 2 ? bw[s].z : bw[s].w;
                uint32_t r4[4], af[4];
                if (NVF) { /* values x 2^-9, undone in the epilogue */
                    uint32_t sh[2];
                    qdec_nvf4r9_scales((kc < 2 ? sw[s].x : sw[s].y) >> (16 * (kc & 1)), sh);
                    qdec_nvf4r9(w, sh, r4);
                } else {
#pragma unroll
                    for (int p = 0; p < 4; p++) r4[p] = qdec_int4r(w, p, zz[s][p >> 1]);
                }
                af[0] = r4[0], af[1] = r4[2], af[2] = r4[1], af[3] = r4[3];
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    if (FOLD && WHOLE && first)
                        mma16816_c0(part[s][j], af, bx[j][0], bx[j][1]);
                    else
                        mma16816(FOLD ? part[s][j] : acc[s][j], af, bx[j][0], bx[j][1]);
                }
            }
            if (FOLD) {
                bool last;
                if (WHOLE) {
                    last = ks % CPG1 == CPG1 - 1;
                } else {
                    gpos += 16;
                    last = gpos == G || kk + 16 == K;
                }
                if (last) { /* last chunk of a group: fold (as v3) */
#pragma unroll
                    for (int s = 0; s < 2; s++) {
                        float scn[2];
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            scn[h] = __half2float(ss[(s * Q5_GSLOTS + slot) * 16 + 8 * h + g]);
#pragma unroll
                        for (int j = 0; j < NT; j++)
#pragma unroll
                            for (int q = 0; q < 4; q++) {
                                acc[s][j][q] = fmaf(part[s][j][q], scn[q >> 1], acc[s][j][q]);
                                if (!WHOLE) part[s][j][q] = 0.0f;
                            }
                    }
                    if (!WHOLE) grp++, gpos = 0;
                }
            }
        }
    });
    cp_async_wait<0>();

    /* epilogue: element q of n8 tile j is row 8 j + 2 tig + (q & 1), column col + g + 8 (q >> 1) */
    float gs[2] = {1.0f, 1.0f};
    if (NVF) gs[0] = m[0]->global, gs[1] = m[1]->global;
    auto fin = [&](float v, int s) { /* NVFP4: the sums of values x 2^-9 (qdec_nvf4r9) times 2^9, exactly */
        if (!NVF) return v;
        v = __fmul_rn(v, 512.0f);
        return a.global_div ? v / gs[s] : v * gs[s];
    };
    if (gateup) {
        bf16 *H = reinterpret_cast<bf16 *>(a.H);
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int r = 8 * j + 2 * tig + (q & 1);
                const int64_t c = col[0] + g + 8 * (q >> 1);
                if (r < rows && c < N)
                    put_bf16(H + (row0 + r) * N, N, 1, c, silu_mul(fin(acc[0][j][q], 0), fin(acc[1][j][q], 1)));
            }
    } else {
#pragma unroll
        for (int s = 0; s < 2; s++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int r = 8 * j + 2 * tig + (q & 1);
                    const int64_t c = col[s] + g + 8 * (q >> 1);
                    if (r < rows && c < N) a.Y[(row0 + r) * a.ldy + c] = fin(acc[s][j][q], s);
                }
    }
}

/* Kernel v5 over the tiles of a grouped product: q5_body for each block's n8 row tiles (block-uniform).
 * CPG: q5_body's (8: whole stages, q5_whole; 0: any K and group). */
template <int QT, int CPG>
__global__ void __launch_bounds__(Q5_THREADS, 2) qgemm5_kernel(const ck_qgemm_args a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    int64_t nt, row0, rows;
    int e;
    if (!gemm_block_tile(a, Q5_BM, Q5_BN, nt, row0, rows, e)) return;
    switch ((rows + 7) / 8) {
    case 1: q5_body<QT, 1, CPG>(a, nt, row0, rows, e, smem_raw); break;
    case 2: q5_body<QT, 2, CPG>(a, nt, row0, rows, e, smem_raw); break;
    case 3: q5_body<QT, 3, CPG>(a, nt, row0, rows, e, smem_raw); break;
    default: q5_body<QT, 4, CPG>(a, nt, row0, rows, e, smem_raw); break;
    }
}

/* Whether v5 runs the product a in whole stages (q5_body's CPG 8): K % 128 == 0 and, INT4, groups of 128. */
static bool q5_whole(const ck_qgemm_args *a) {
    return a->K % Q5_KS == 0 && (a->qtype == CK_QT_NVFP4 || a->group == 128);
}

/* Whether kernel v5 runs the product a: grouped, split 1, 32-row tiles, reordered INT4 or NVFP4, K % 16 == 0,
 * lda % 8 == 0, A 16-byte aligned (its activation copies). */
static bool v5_fits(const ck_qgemm_args *a) {
    if (!a->skinny || a->mode == CK_GEMM_DENSE || a->split != 1 || a->bm != Q5_BM || a->lda % 8 ||
        ((uintptr_t)a->A & 15))
        return false;
    if (a->qtype == CK_QT_INT4) return a->int4_reordered && a->group >= 16 && a->group % 16 == 0 && a->N % 8 == 0;
    return a->qtype == CK_QT_NVFP4 && a->nvfp4_reordered;
}

template <int QT> cudaError_t launch_v5(const ck_qgemm_args *a, cudaStream_t st) {
    static unsigned done[2] = {0, 0}; /* devices whose limit is raised, per kernel */
    if (q5_whole(a)) return launch_packed(qgemm5_kernel<QT, 8>, Q5_BM, Q5_THREADS, q5_smem<QT>(), &done[1], a, st, Q5_BN);
    return launch_packed(qgemm5_kernel<QT, 0>, Q5_BM, Q5_THREADS, q5_smem<QT>(), &done[0], a, st, Q5_BN);
}

/* The reorder of cuda_qbits.h: one thread per u32 word of the reordered array. */
__global__ void int4_reorder_kernel(const uint32_t *src, int64_t K, int64_t N, uint32_t *dst, int64_t words) {
    const int64_t w = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= words) return;
    const int64_t K64 = (K + 63) / 64;
    uint32_t out = 0;
#pragma unroll
    for (int s = 0; s < 8; s++) {
        const int64_t k = CK_INT4R_K(w, s, K64), n = CK_INT4R_N(w, s, K64);
        if (k < K && n < N) out |= ((src[(k / 8) * N + n] >> (4 * (k % 8))) & 15u) << (4 * s);
    }
    dst[w] = out;
}

/* The NVFP4 reorder of cuda_qbits.h: the data one thread per u32 word (the INT4 permutation), then the
 * scales one thread per byte. */
__global__ void nvfp4_reorder_kernel(const unsigned char *src, int64_t K, int64_t N, uint32_t *dst, int64_t words) {
    const int64_t w = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= words) return;
    const int64_t K64 = (K + 63) / 64;
    uint32_t out = 0;
#pragma unroll
    for (int s = 0; s < 8; s++) {
        const int64_t k = CK_INT4R_K(w, s, K64), n = CK_INT4R_N(w, s, K64);
        if (k < K && n < N) out |= ((uint32_t)(src[n * (K / 2) + k / 2] >> (4 * (k & 1))) & 15u) << (4 * s);
    }
    dst[w] = out;
}
__global__ void nvfp4_scale_reorder_kernel(const unsigned char *src, int64_t K, int64_t N, unsigned char *dst,
                                           int64_t bytes) {
    const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= bytes) return;
    const int64_t K64 = (K + 63) / 64, n = CK_NVF4R_SC_N(b, K64), grp = CK_NVF4R_SC_G(b, K64);
    dst[b] = n < N && grp < K / 16 ? src[n * (K / 16) + grp] : (unsigned char)0;
}

} /* namespace */

extern "C" {

cudaError_t ck_qgemm(const ck_qgemm_args *a, cudaStream_t st) {
    if (a->K < 16 || a->K % 16 || a->split < 1 || a->split > 2 || a->N < 1 || a->N > 0x7fff0000LL)
        return cudaErrorInvalidValue;
    const int bm = a->bm;
    if (v5_fits(a)) return a->qtype == CK_QT_INT4 ? launch_v5<CK_QT_INT4>(a, st) : launch_v5<CK_QT_NVFP4>(a, st);
#ifdef CLEF_CUDA_WGMMA
    if (a->tma && (bm == 32 || bm == 64) && a->K % Q4_KS == 0 && a->lda % 8 == 0 && ((uintptr_t)a->A & 15) == 0) {
        if (a->qtype == CK_QT_INT4 && a->int4_reordered && a->group >= 16 && a->group % 16 == 0 && a->N % 8 == 0)
            return bm == 32 ? launch_v4<CK_QT_INT4, 32>(a, st) : launch_v4<CK_QT_INT4, 64>(a, st);
        if (a->qtype == CK_QT_NVFP4 && a->nvfp4_reordered)
            return bm == 32 ? launch_v4<CK_QT_NVFP4, 32>(a, st) : launch_v4<CK_QT_NVFP4, 64>(a, st);
    }
#endif
    switch (a->qtype) {
    case CK_QT_NVFP4:
        if (a->nvfp4_reordered)
            return bm == 32    ? launch_v3<CK_QT_NVFP4, 32, 3>(a, st)
                 : bm == 64  ? launch_v3<CK_QT_NVFP4, 64, 2>(a, st)
                 : bm == 128 ? launch_v3<CK_QT_NVFP4, 128, 1>(a, st) : cudaErrorInvalidValue;
        return bm == 32 ? launch_v2<CK_QT_NVFP4, 32>(a, st)
             : bm == 64 ? launch_v2<CK_QT_NVFP4, 64>(a, st)
             : bm == 128 ? launch_v2<CK_QT_NVFP4, 128>(a, st) : cudaErrorInvalidValue;
    case CK_QT_FP8:
        if (a->block_c % 16 || a->block_r < 1) return cudaErrorInvalidValue;
        return bm == 32 ? launch_v2<CK_QT_FP8, 32>(a, st)
             : bm == 64 ? launch_v2<CK_QT_FP8, 64>(a, st) : cudaErrorInvalidValue;
    case CK_QT_INT4:
        if (a->group < 16 || a->group % 16 || a->N % 8) return cudaErrorInvalidValue;
        if (a->int4_reordered)
            return bm == 32 ? (a->int4_reordered == 2 ? launch_v3<CK_QT_INT4, 32, 2>(a, st)
                                                      : launch_v3<CK_QT_INT4, 32, 3>(a, st))
                 : bm == 64 ? launch_v3<CK_QT_INT4, 64, 2>(a, st) : cudaErrorInvalidValue;
        return bm == 32 ? launch_v2<CK_QT_INT4, 32>(a, st)
             : bm == 64 ? launch_v2<CK_QT_INT4, 64>(a, st) : cudaErrorInvalidValue;
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t ck_int4_reorder(const void *src, int64_t K, int64_t N, void *dst, cudaStream_t st) {
    if (K < 16 || K % 8 || N < 1 || N % 8) return cudaErrorInvalidValue;
    const int64_t words = CK_INT4R_BYTES(N, K) / 4;
    int4_reorder_kernel<<<(unsigned)((words + 255) / 256), 256, 0, st>>>(static_cast<const uint32_t *>(src), K, N,
                                                                        static_cast<uint32_t *>(dst), words);
    return cudaGetLastError();
}

cudaError_t ck_nvfp4_reorder(const void *src_q, const void *src_scale, int64_t K, int64_t N, void *dst_q,
                             void *dst_scale, cudaStream_t st) {
    if (K < 16 || K % 16 || N < 1) return cudaErrorInvalidValue;
    const int64_t words = CK_NVF4R_BYTES(N, K) / 4, sbytes = CK_NVF4R_SC_BYTES(N, K);
    nvfp4_reorder_kernel<<<(unsigned)((words + 255) / 256), 256, 0, st>>>(static_cast<const unsigned char *>(src_q), K, N,
                                                                         static_cast<uint32_t *>(dst_q), words);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    nvfp4_scale_reorder_kernel<<<(unsigned)((sbytes + 255) / 256), 256, 0, st>>>(
        static_cast<const unsigned char *>(src_scale), K, N, static_cast<unsigned char *>(dst_scale), sbytes);
    return cudaGetLastError();
}

} /* extern "C" */
