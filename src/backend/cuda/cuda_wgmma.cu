/* cuda_wgmma.cu — the grouped expert GEMMs (GATEUP with SwiGLU, DOWN) on
 * Hopper's warpgroup MMA (wgmma.mma_async, sm_90a), bf16 or packed weights.
 *
 * Same contract as ck_gemm's grouped modes (cuda_kernels.h): the tile plan
 * of ck_moe_plan, [hi | lo] activation rows when split = 2, bf16 weights
 * [N, K] row-major.  Each CTA computes a BM x BN output tile (BM = 64: one
 * warpgroup and BN = 128; BM = 128: two warpgroups, each owning 64 rows, and
 * BN = 256) with K walked in 64-wide steps
 * through a multi-stage cp.async pipeline into 128-byte-swizzled shared
 * tiles that the wgmma descriptors read directly (no ldmatrix, no register
 * staging of operands).  Per 16-wide K chunk the hi product and then the lo
 * product are accumulated (one wgmma m64nBNk16 each) into the same f32
 * registers, so every output element is one fixed-order sum over K: its
 * value depends on its A row and weight row only, never on BM, the grid or
 * the rows packed around it (backend.h determinism rule).
 *
 * The same kernel, templated on the weight format, runs the packed
 * (quantized) experts of ck_qgemm (NVFP4 in either layout, FP8 blocks, INT4
 * reordered) with
 * bitwise ck_qgemm's results: see the kernel's comment.
 *
 * Built only when the CUDA architectures include sm_90a (CLEF_CUDA_WGMMA is
 * then defined by CMake); elsewhere ck_gemm_wgmma reports
 * cudaErrorNotSupported and the backend keeps the mma.sync kernel.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_qdecode.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

typedef __nv_bfloat16 bf16;

namespace {

constexpr int WG_BK = 64;    /* K per stage: one 128-byte swizzle row */
constexpr int ROW_BYTES = WG_BK * 2;
static_assert(ROW_BYTES == WG_ROW_BYTES, "one stage row is one swizzle row (cuda_wgmma.cuh)");
constexpr int SMEM_STAGES_MAX = 200 * 1024; /* pipeline bytes per CTA (one CTA per SM) */

/* The weights of a kernel instance (template parameter QT): WQ_BF16 = bf16
 * rows [N, K] (ck_gemm_args), else a packed format CK_QT_* (ck_qgemm_args:
 * NVFP4, FP8 blocks, INT4 in the reordered layout of kernel v3), or
 * WQ_NVFP4R = NVFP4 in the reordered layout of kernel v3 (data + scale
 * atoms, ck_nvfp4_reorder), copied packed into each stage and dequantized
 * there by the threads into the swizzled bf16 weight tile the wgmma
 * descriptors read. */
constexpr int WQ_BF16 = 0;
constexpr int WQ_NVFP4R = 16; /* not a CK_QT_* value */
template <int QT> struct wg_args { typedef ck_qgemm_args type; };
template <> struct wg_args<WQ_BF16> { typedef ck_gemm_args type; };
/* FP8 and INT4 fold a scale per group into the sums (second accumulator set) */
template <int QT> __host__ __device__ constexpr bool wg_fold() { return QT == CK_QT_FP8 || QT == CK_QT_INT4; }

/* Output columns per CTA: 128 on 64-row tiles, 256 on 128-row bf16 tiles
 * (half the activation traffic per MMA; packed: 128, the fold's partial
 * sums need the registers); GATEUP splits them into BN/2 gate and BN/2 up
 * columns of the same intermediate indices. */
template <int QT, int BM> __host__ __device__ constexpr int wg_bn() { return QT == WQ_BF16 && BM == 128 ? 256 : 128; }
/* Packed bytes per stage after the bf16 weight tile: 4 units (16 K values of
 * one row, kernel v2's units) per weight row: FP8 16 bytes, NVFP4 8 + its
 * scale word; INT4: BN / 16 reordered atoms of 512 bytes + two zero words
 * per 16-byte atom chunk; NVFP4 reordered: the atoms + each chunk's 8 scale
 * bytes (its lane's of the scale atom: 4 copies of the 64, one per thread). */
template <int QT, int BM> __host__ __device__ constexpr int wg_pk_bytes() {
    return QT == CK_QT_FP8     ? wg_bn<QT, BM>() * 4 * 16
         : QT == CK_QT_NVFP4 ? wg_bn<QT, BM>() * 4 * (8 + 4)
         : QT == CK_QT_INT4 || QT == WQ_NVFP4R ? wg_bn<QT, BM>() * 32 + wg_bn<QT, BM>() * 2 * 8
                                               : 0;
}
/* Every stage holds SPLIT activation tiles of BM rows, one weight tile of
 * BN rows (128 bytes a row) and the packed bytes; as many stages as fit
 * SMEM_STAGES_MAX.  Every part is a multiple of 1024 bytes (swizzle atoms). */
template <int QT, int BM, int SPLIT> __host__ __device__ constexpr int wg_stage_bytes() {
    return (SPLIT * BM + wg_bn<QT, BM>()) * ROW_BYTES + wg_pk_bytes<QT, BM>();
}
template <int QT, int BM, int SPLIT> __host__ __device__ constexpr int wg_stages() {
    return SMEM_STAGES_MAX / wg_stage_bytes<QT, BM, SPLIT>() > 8 ? 8 : SMEM_STAGES_MAX / wg_stage_bytes<QT, BM, SPLIT>();
}
template <int QT, int BM, int SPLIT> constexpr int wg_smem_bytes() {
    return wg_stages<QT, BM, SPLIT>() * wg_stage_bytes<QT, BM, SPLIT>() + 1024; /* + alignment slack */
}
static_assert(wg_pk_bytes<CK_QT_NVFP4, 128>() % 1024 == 0 && wg_pk_bytes<CK_QT_INT4, 128>() % 1024 == 0 &&
                  wg_pk_bytes<WQ_NVFP4R, 128>() % 1024 == 0 &&
                  wg_pk_bytes<CK_QT_FP8, 128>() % 1024 == 0,
              "stages stay 1024-byte aligned");


/* One BM x BN tile of a grouped product (a.mode GATEUP or DOWN) with bf16
 * (QT = WQ_BF16) or packed weights.
 *
 * Packed weights (BM = 128, BN = 128, two warpgroups of m64n128): each stage
 * brings the activation tiles and the PACKED weight bytes of a 64-wide K
 * step (cp.async); when the stage is due, each thread decodes exactly the
 * packed bytes it copied itself (cuda_qdecode.cuh: the exact bf16 codes of
 * kernels v2 / v3) into the stage's 128B-swizzled bf16 weight tile, then
 * fence.proxy.async + the barrier make the tile visible to the wgmma reads.
 * The decode of step kt overlaps the wgmma group of step kt - 1 (in flight).
 * Numerics are kernel v2's (cuda_qgemm.cu), element by element:
 *   NVFP4: fp4 * scale16 summed into acc, the global applied in the
 *          epilogue (sum / global or sum * global);
 *   FP8 / INT4: the products of one scale group (block_c or G wide, a
 *          multiple of 64: groups end at stage ends) are summed from 0 into
 *          `part`, ascending k16 chunks, hi then lo; at the group's end
 *          acc = fmaf(part, scale, acc) and part = 0: the same partial sums,
 *          the same fold expression and order as v2 (the wgmma and mma.sync
 *          k16 sums are bitwise equal, test_cuda_ops).  The fold of the
 *          group that ended at step kt - 1 runs in step kt after the decode
 *          and the barrier (wgmma.wait_group 0: part is final), its scales
 *          fetched before the decode.
 * So the results are bitwise those of v2 / v3: the host may mix the kernels
 * by pass size without breaking batch invariance. */
template <int QT, int BM, int SPLIT>
__global__ void __launch_bounds__(BM * 2, 1) wgmma_gemm_kernel(const typename wg_args<QT>::type a) {
#ifdef CLEF_WGMMA_DEVICE
    constexpr int THREADS = BM * 2, STAGES = wg_stages<QT, BM, SPLIT>(), STAGE = wg_stage_bytes<QT, BM, SPLIT>();
    constexpr int BN = wg_bn<QT, BM>(), HALF = BN / 2, NR = BN / 2; /* NR: accumulators per thread */
    constexpr bool FOLD = wg_fold<QT>(), UNITS = QT == CK_QT_FP8 || QT == CK_QT_NVFP4;
    constexpr int A_CHUNKS = BM * 8 / THREADS;                        /* 16-byte chunks per thread */
    constexpr int W_CHUNKS = QT == WQ_BF16 ? BN * 8 / THREADS : 1;
    constexpr int UPT = UNITS ? BN * 4 / THREADS : 1;                 /* packed units per thread */
    constexpr int UB = QT == CK_QT_FP8 ? 16 : 8;                      /* bytes of one unit */
    constexpr int W_OFF = SPLIT * BM * ROW_BYTES, PK_OFF = W_OFF + BN * ROW_BYTES; /* in a stage */
    static_assert(STAGES >= 3, "the schedule loads STAGES - 2 tiles ahead");
    static_assert(QT == WQ_BF16 || (BM == 128 && BN == 128), "packed: 128 x 128 tiles");
    static_assert(!UNITS || UPT * THREADS == BN * 4, "whole units per thread");
    static_assert((QT != CK_QT_INT4 && QT != WQ_NVFP4R) || BN * 2 == THREADS, "one 16-byte atom chunk per thread");
    constexpr bool NVF = QT == CK_QT_NVFP4 || QT == WQ_NVFP4R;
    extern __shared__ unsigned char smem_raw[];
    /* swizzle atoms need 1024-byte alignment */
    unsigned char *smem =
        smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    const uint32_t sbase = smem_addr(smem);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const int64_t n_tiles_n = gemm_col_tiles(a.mode, a.N, BN);
    const int64_t mt = blockIdx.x / n_tiles_n, nt = blockIdx.x % n_tiles_n;
    if (mt >= *a.n_tiles) return;
    const int e = a.tile_expert[mt];
    const int64_t row0 = a.tile_row0[mt], end = a.expert_end[e];
    const int64_t rows = end - row0 < BM ? end - row0 : BM;
    const bf16 *A = reinterpret_cast<const bf16 *>(a.A);
    const int64_t K = a.K, N = a.N;
    /* weight row (matrix column) of tile row r (GATEUP: rows [0, HALF) gate, [HALF, BN) up) */
    auto wrow = [&](int r) -> int64_t { return a.mode == CK_GEMM_GATEUP ? nt * HALF + (r % HALF) : nt * BN + r; };

    /* fixed per thread over K: source rows (NULL = zero fill) and swizzled destinations */
    const bf16 *a_src[A_CHUNKS];
    uint32_t a_dst[A_CHUNKS];
    int a_col[A_CHUNKS];
#pragma unroll
    for (int i = 0; i < A_CHUNKS; i++) {
        const int c = tid + i * THREADS, r = c >> 3, ch = c & 7;
        a_col[i] = ch * 8;
        a_dst[i] = sw128(r, ch);
        if (r < rows) {
            int64_t p = row0 + r;
            if (a.mode == CK_GEMM_GATEUP) p = a.row_src[p];
            a_src[i] = A + p * a.lda;
        } else {
            a_src[i] = nullptr;
        }
    }
    /* bf16 weights: W_CHUNKS 16-byte chunks per thread */
    const bf16 *w_src[W_CHUNKS];
    uint32_t w_dst[W_CHUNKS];
    int w_col[W_CHUNKS];
    /* NVFP4 / FP8: kernel v2's units u = tid + i * THREADS (tile row u / 4, K chunk u % 4), the row's
     * packed data u_q (row n clamped into the matrix) and NVFP4 scales u_x */
    int u_r[UPT], u_kc[UPT], u_n[UPT];
    const unsigned char *u_q[UPT], *u_x[UPT];
    /* INT4 / NVFP4 reordered: chunk `lane` of atom tid / 32 (tile rows 16 (tid / 32) ..); INT4 its zero words
     * zc0 / zc1, NVFP4 its 8 scale bytes (s_src: g * 8 into the scale atom) */
    const unsigned char *b_src = nullptr, *s_src = nullptr;
    const uint32_t *z_src = nullptr;
    bool b_ok = false, z_ok = false;
    int64_t zc0 = 0, zc1 = 0;
    uint32_t z_add = 8u;
    if constexpr (QT == WQ_BF16) {
        const bf16 *w0 = reinterpret_cast<const bf16 *>(a.W0[e]);
        const bf16 *w1 = a.mode == CK_GEMM_GATEUP ? reinterpret_cast<const bf16 *>(a.W1[e]) : nullptr;
#pragma unroll
        for (int i = 0; i < W_CHUNKS; i++) {
            const int c = tid + i * THREADS, r = c >> 3, ch = c & 7;
            w_col[i] = ch * 8;
            w_dst[i] = sw128(r, ch);
            const int64_t n = wrow(r);
            const bf16 *base = a.mode == CK_GEMM_GATEUP && r >= HALF ? w1 : w0;
            w_src[i] = n < N ? base + n * K : nullptr;
        }
    } else if constexpr (UNITS) {
#pragma unroll
        for (int i = 0; i < UPT; i++) {
            const int u = tid + i * THREADS;
            u_r[i] = u / 4;
            u_kc[i] = u % 4;
            u_n[i] = (int)wrow(u_r[i]);
            const ck_qmat *m = a.mode == CK_GEMM_GATEUP && u_r[i] >= HALF ? &a.W1[e] : &a.W0[e];
            const int64_t n = u_n[i] < N ? u_n[i] : 0;
            const unsigned char *q = static_cast<const unsigned char *>(m->q);
            u_q[i] = QT == CK_QT_NVFP4 ? q + n * (K / 2) : q + n * K;
            u_x[i] = static_cast<const unsigned char *>(m->scale);
        }
    } else {
        const int c = (tid >> 5) * 16;
        const ck_qmat *m = a.mode == CK_GEMM_GATEUP && c >= HALF ? &a.W1[e] : &a.W0[e];
        int64_t n = wrow(c);
        b_ok = n < N;
        n = b_ok ? n : 0;
        b_src = static_cast<const unsigned char *>(m->q) + CK_INT4R_ATOM_OFF(n / 16, (int64_t)0, (K + 63) / 64) +
                lane * 16;
        if (QT == WQ_NVFP4R)
            s_src = static_cast<const unsigned char *>(m->scale) +
                    CK_NVF4R_SC_ATOM_OFF(n / 16, (int64_t)0, (K + 63) / 64) + g * 8;
        z_ok = QT == CK_QT_INT4 && b_ok && a.has_zeros;
        z_add = a.has_zeros ? 1u : 8u;
        if (QT == CK_QT_INT4 && a.has_zeros) { /* words of columns n + g and n + 8 + g, clamped to the row (as v3) */
            z_src = static_cast<const uint32_t *>(m->zeros);
            zc0 = n / 8 < N / 8 ? n / 8 : N / 8 - 1;
            zc1 = n / 8 + 1 < N / 8 ? n / 8 + 1 : N / 8 - 1;
        }
    }

    /* stage layout: [A hi: BM rows][A lo: BM rows if split][W: BN rows bf16][packed bytes] */
    auto load_stage = [&](int kt, int stage) {
        const int64_t k0 = (int64_t)kt * WG_BK;
        unsigned char *st = smem + stage * STAGE;
#pragma unroll
        for (int i = 0; i < A_CHUNKS; i++) {
            const bool ok = a_src[i] != nullptr;
            const bf16 *src = ok ? a_src[i] + k0 + a_col[i] : A;
            cp_async16(st + a_dst[i], src, ok);
            if (SPLIT == 2) cp_async16(st + BM * ROW_BYTES + a_dst[i], ok ? src + K : A, ok); /* lo half */
        }
        if constexpr (QT == WQ_BF16) {
#pragma unroll
            for (int i = 0; i < W_CHUNKS; i++) {
                const bool ok = w_src[i] != nullptr;
                cp_async16(st + W_OFF + w_dst[i], ok ? w_src[i] + k0 + w_col[i] : A, ok);
            }
        } else if constexpr (UNITS) {
            unsigned char *pk = st + PK_OFF;
            uint32_t *aux = reinterpret_cast<uint32_t *>(pk + BN * 4 * UB);
#pragma unroll
            for (int i = 0; i < UPT; i++) {
                const int u = tid + i * THREADS;
                const int64_t kk = k0 + u_kc[i] * 16;
                const bool ok = u_n[i] < N;
                if (QT == CK_QT_NVFP4) {
                    cp_async8(pk + u * UB, u_q[i] + kk / 2, ok);
                    const int64_t si = (ok ? (int64_t)u_n[i] : 0) * (K / 16) + kk / 16;
                    cp_async4(aux + u, u_x[i] + (si & ~(int64_t)3), ok);
                } else {
                    cp_async16(pk + u * UB, u_q[i] + kk, ok);
                }
            }
        } else if constexpr (QT == WQ_NVFP4R) {
            unsigned char *pk = st + PK_OFF;
            cp_async16(pk + tid * 16, b_ok ? b_src + (int64_t)kt * CK_INT4R_ATOM_BYTES : b_src, b_ok);
            cp_async8(pk + BN * 32 + tid * 8, b_ok ? s_src + (int64_t)kt * CK_NVF4R_SC_ATOM_BYTES : b_src, b_ok);
        } else {
            unsigned char *pk = st + PK_OFF;
            cp_async16(pk + tid * 16, b_ok ? b_src + (int64_t)kt * CK_INT4R_ATOM_BYTES : b_src, b_ok);
            /* zero words (symmetric: zero-filled; no branch on has_zeros here or in the decode: a loop
             * unswitched on it made ptxas serialize the wgmma groups) */
            const uint32_t *zr = z_ok ? z_src + (k0 / a.group) * (N / 8) : reinterpret_cast<const uint32_t *>(A);
            uint32_t *zaux = reinterpret_cast<uint32_t *>(pk + BN * 32);
            cp_async4(zaux + 2 * tid, z_ok ? zr + zc0 : zr, z_ok);
            cp_async4(zaux + 2 * tid + 1, z_ok ? zr + zc1 : zr, z_ok);
        }
    };

    /* this thread's own packed bytes of stage st (tile kt) -> the stage's bf16 weight tile */
    auto dequant_stage = [&](int kt, unsigned char *st) {
        const unsigned char *pk = st + PK_OFF;
        unsigned char *wt = st + W_OFF;
        if constexpr (UNITS) {
            const uint32_t *aux = reinterpret_cast<const uint32_t *>(pk + BN * 4 * UB);
#pragma unroll
            for (int i = 0; i < UPT; i++) {
                const int u = tid + i * THREADS;
                uint32_t outw[8];
                if constexpr (QT == CK_QT_NVFP4) {
                    const int64_t kk = (int64_t)kt * WG_BK + u_kc[i] * 16;
                    const int64_t si = (int64_t)u_n[i] * (K / 16) + kk / 16;
                    qdec_nvfp4(*reinterpret_cast<const uint2 *>(pk + u * UB), (aux[u] >> (8 * (int)(si & 3))) & 0xFFu,
                               outw);
                } else {
                    qdec_fp8(*reinterpret_cast<const uint4 *>(pk + u * UB), outw);
                }
                /* K values 16 kc .. 16 kc + 15 of tile row u / 4: 16-byte chunks 2 kc, 2 kc + 1 */
                *reinterpret_cast<uint4 *>(wt + sw128(u_r[i], 2 * u_kc[i])) = make_uint4(outw[0], outw[1], outw[2], outw[3]);
                *reinterpret_cast<uint4 *>(wt + sw128(u_r[i], 2 * u_kc[i] + 1)) =
                    make_uint4(outw[4], outw[5], outw[6], outw[7]);
            }
        } else if constexpr (QT == CK_QT_INT4) {
            /* chunk `lane` (g, t) of atom tid / 32: word kc, register p = 2 ni + j holds K 16 kc + 8 j + 2 t, +1
             * of column 8 ni + g of the atom (cuda_qbits.h) */
            const uint4 w = *reinterpret_cast<const uint4 *>(pk + tid * 16);
            /* bf16x2 128 + zero: asymmetric 128 + nibble + 1, symmetric (words zero-filled) 128 + 0 + 8 */
            uint32_t zz[2];
#pragma unroll
            for (int ni = 0; ni < 2; ni++) {
                const uint32_t z =
                    128u + ((reinterpret_cast<const uint32_t *>(pk + BN * 32)[2 * tid + ni] >> (4 * g)) & 15u) + z_add;
                zz[ni] = u32_of(__floats2bfloat162_rn((float)z, (float)z)); /* exact: 129..144 */
            }
            const int r0 = (tid >> 5) * 16 + g;
#pragma unroll
            for (int kc = 0; kc < 4; kc++) {
                const uint32_t word = kc == 0 ? w.x : kc == 1 ? w.y : kc == 2 ? w.z : w.w;
#pragma unroll
                for (int p = 0; p < 4; p++)
                    *reinterpret_cast<uint32_t *>(wt + sw128(r0 + 8 * (p >> 1), 2 * kc + (p & 1)) + 4 * t) =
                        qdec_int4r(word, p, zz[p >> 1]);
            }
        } else if constexpr (QT == WQ_NVFP4R) {
            /* as INT4's chunk, decoded by qdec_nvf4r with the scale pair of chunk kc (16-bit half kc % 2 of
             * scale word kc / 2) */
            const uint4 w = *reinterpret_cast<const uint4 *>(pk + tid * 16);
            const uint2 sc = *reinterpret_cast<const uint2 *>(pk + BN * 32 + tid * 8);
            const int r0 = (tid >> 5) * 16 + g;
#pragma unroll
            for (int kc = 0; kc < 4; kc++) {
                const uint32_t word = kc == 0 ? w.x : kc == 1 ? w.y : kc == 2 ? w.z : w.w;
                uint32_t sh[2], r4[4];
                qdec_nvf4r_scales((kc < 2 ? sc.x : sc.y) >> (16 * (kc & 1)), sh);
                qdec_nvf4r(word, sh, r4);
#pragma unroll
                for (int p = 0; p < 4; p++)
                    *reinterpret_cast<uint32_t *>(wt + sw128(r0 + 8 * (p >> 1), 2 * kc + (p & 1)) + 4 * t) = r4[p];
            }
        }
    };

    float acc[NR], part[FOLD ? NR : 1];
#pragma unroll
    for (int i = 0; i < NR; i++) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < (FOLD ? NR : 1); i++) part[i] = 0.0f;

    /* FOLD: the scales of this thread's columns 8 j + 2 t (+1) for group grp: FP8 one f32 per j (block_r % 8 == 0:
     * the 8 columns share a block), INT4 the f16 pair of columns 8 j + 2 t, +1 */
    uint32_t scw[FOLD ? NR / 4 : 1];
    auto load_scales = [&](int64_t grp) {
        if constexpr (FOLD) {
            const ck_qmat *m0 = &a.W0[e], *m1 = a.mode == CK_GEMM_GATEUP ? &a.W1[e] : &a.W0[e];
            const void *s0 = m0->scale, *s1 = m1->scale;
#pragma unroll
            for (int j = 0; j < NR / 4; j++) {
                const void *sp = a.mode == CK_GEMM_GATEUP && 8 * j >= HALF ? s1 : s0;
                if constexpr (QT == CK_QT_FP8) {
                    int64_t n = wrow(8 * j);
                    n = n < N ? n : 0;
                    const int64_t nbc = (K + a.block_c - 1) / a.block_c;
                    scw[j] = __float_as_uint(__ldg(static_cast<const float *>(sp) + (n / a.block_r) * nbc + grp));
                } else {
                    int64_t n = wrow(8 * j) + 2 * t;
                    n = n < N ? n : 0;
                    scw[j] = __ldg(reinterpret_cast<const unsigned int *>(static_cast<const __half *>(sp) + grp * N + n));
                }
            }
        }
    };
    /* acc = fmaf(part, scale, acc); part = 0 (v2's fold) */
    auto fold = [&]() {
        if constexpr (FOLD) {
#pragma unroll
            for (int j = 0; j < NR / 4; j++) {
                float s[2];
                if constexpr (QT == CK_QT_FP8) {
                    s[0] = s[1] = __uint_as_float(scw[j]);
                } else {
                    s[0] = __half2float(__ushort_as_half((unsigned short)(scw[j] & 0xFFFFu)));
                    s[1] = __half2float(__ushort_as_half((unsigned short)(scw[j] >> 16)));
                }
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    acc[4 * j + q] = fmaf(part[4 * j + q], s[q & 1], acc[4 * j + q]);
                    part[4 * j + q] = 0.0f;
                }
            }
        }
    };
    const int ktiles = (int)(K / WG_BK);
    int64_t fold_g = 1;
    if constexpr (QT == CK_QT_FP8) fold_g = a.block_c;
    if constexpr (QT == CK_QT_INT4) fold_g = a.group;
    /* a scale group ends with tile kt (group widths are multiples of 64; the last group may be short) */
    auto group_ends = [&](int kt) { return ((int64_t)(kt + 1) * WG_BK) % fold_g == 0 || kt == ktiles - 1; };
    /* the wgmma group of one stage (4 k16 chunks, hi then lo each) into d */
    auto mma_stage = [&](float (&d)[NR], uint32_t st) {
        const uint32_t a_hi = st + (uint32_t)(wg * 64 * ROW_BYTES), w_t = st + (uint32_t)W_OFF;
        acc_fence(d);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < WG_BK / 16; ks++) { /* 16-wide K chunks: +32 bytes inside the swizzled rows */
            const uint64_t db = wg_desc(w_t + ks * 32);
            wgmma_k16<BN>(d, wg_desc(a_hi + ks * 32), db);
            if (SPLIT == 2) wgmma_k16<BN>(d, wg_desc(a_hi + BM * ROW_BYTES + ks * 32), db);
        }
        wg_commit();
        wg_wait<1>();
        acc_fence(d);
    };

    /* Schedule: stage s holds K tile kt with s = kt % STAGES; AHEAD tiles are loaded ahead.
     * bf16 (AHEAD = STAGES - 1): iteration kt waits for tile kt's copies, barrier (everyone's landed),
     * issues tile kt's wgmma group, waits until at most that group is in flight (tile kt - 1's is done),
     * barrier (every warpgroup's is), then refills tile kt - 1's stage with tile kt + STAGES - 1 while
     * tile kt's MMAs run.
     * Packed (AHEAD = STAGES - 2): the stage refilled in iteration kt (that of tile kt - 2) was read by the
     * wgmma group of iteration kt - 2, which every warpgroup completed (wait_group 1 at the end of kt - 1)
     * before the barrier of kt; the weight tile of stage kt % STAGES, written by the decode of kt before
     * that barrier, was last read by the wgmma group of kt - STAGES (<= kt - 3), complete in every
     * warpgroup before the barrier of kt - 1; the decode reads only the bytes its own thread copied
     * (cp.async.wait_group). */
    constexpr int AHEAD = QT == WQ_BF16 ? STAGES - 1 : STAGES - 2;
#pragma unroll
    for (int s = 0; s < AHEAD; s++) {
        if (s < ktiles) load_stage(s, s);
        cp_async_commit();
    }
    int kt = 0;
    do { /* ktiles >= 1 (K >= 64): no path around the loop (ptxas then serialized the wgmma groups) */
        cp_async_wait<AHEAD - 1>(); /* this thread's copies of tile kt landed */
        const bool fold_now = FOLD && kt > 0 && group_ends(kt - 1);
        if (fold_now) load_scales((int64_t)(kt - 1) * WG_BK / fold_g);
        if constexpr (QT != WQ_BF16) dequant_stage(kt, smem + (kt % STAGES) * STAGE);
        fence_proxy_async();
        __syncthreads(); /* everyone's copies (and, packed, decodes) landed */
        if constexpr (QT != WQ_BF16) { /* tile kt - 2's stage is free */
            if (kt + AHEAD < ktiles) load_stage(kt + AHEAD, (kt + AHEAD) % STAGES);
            cp_async_commit();
        }
        const uint32_t st = sbase + (uint32_t)((kt % STAGES) * STAGE);
        if constexpr (FOLD) {
            if (fold_now) { /* the group that ended with tile kt - 1: its wgmma group done, part final */
                wg_wait<0>();
                acc_fence(part);
                fold();
            }
            mma_stage(part, st);
        } else {
            mma_stage(acc, st);
        }
        if constexpr (QT == WQ_BF16) {
            __syncthreads(); /* tile kt - 1's stage is read by no one any more (wait_group 1 in mma_stage) */
            if (kt + AHEAD < ktiles) load_stage(kt + AHEAD, (kt + AHEAD) % STAGES);
            cp_async_commit();
        }
    } while (++kt < ktiles);
    wg_wait<0>();
    if constexpr (FOLD) {
        acc_fence(part);
        load_scales((int64_t)(ktiles - 1) * WG_BK / fold_g); /* the last tile ends a group */
        fold();
    }
    acc_fence(acc);
    cp_async_wait<0>();

    /* NVFP4: the per-tensor global of the column's matrix (v2's epilogue) */
    float gs0 = 1.0f, gs1 = 1.0f;
    int gdiv = 0;
    if constexpr (NVF) {
        gs0 = a.W0[e].global;
        gs1 = a.mode == CK_GEMM_GATEUP ? a.W1[e].global : gs0;
        gdiv = a.global_div;
    }
    auto fin = [&](float v, int m) -> float {
        if constexpr (NVF) return gdiv ? v / (m ? gs1 : gs0) : v * (m ? gs1 : gs0);
        else return v;
    };
    /* accumulator layout (per warp of the warpgroup: 16 rows): acc[4j + q] at row g (q < 2) or g + 8,
     * column 8j + 2t + (q & 1), g = lane / 4, t = lane % 4 */
    wg_epilogue<BN, HALF, SPLIT>(acc, a.mode == CK_GEMM_DOWN, a.Y, a.ldy, reinterpret_cast<bf16 *>(a.H), a.N, row0,
                                 rows, nt, wg * 64 + (warp & 3) * 16 + g, t, fin);
#else
    __trap(); /* not built for sm_90a: the host never launches this (ck_gemm_wgmma refuses) */
#endif
}

template <int QT, int BM, int SPLIT> cudaError_t launch_wgmma(const typename wg_args<QT>::type *a, cudaStream_t st) {
    constexpr int smem = wg_smem_bytes<QT, BM, SPLIT>();
    static unsigned done = 0; /* devices whose limit is raised */
    cudaError_t e = allow_smem(wgmma_gemm_kernel<QT, BM, SPLIT>, smem, &done);
    if (e != cudaSuccess) return e;
    constexpr int BN = wg_bn<QT, BM>();
    unsigned blocks;
    e = gemm_grid(a->mode, a->max_tiles, a->N, BN, &blocks);
    if (e != cudaSuccess || !blocks) return e;
    wgmma_gemm_kernel<QT, BM, SPLIT><<<blocks, BM * 2, smem, st>>>(*a);
    return cudaGetLastError();
}

template <int QT> cudaError_t launch_qwgmma(const ck_qgemm_args *a, cudaStream_t st) {
    return a->split == 2 ? launch_wgmma<QT, 128, 2>(a, st) : launch_wgmma<QT, 128, 1>(a, st);
}

} /* namespace */

extern "C" {

int ck_wgmma_built(void) {
#ifdef CLEF_CUDA_WGMMA
    return 1;
#else
    return 0;
#endif
}

cudaError_t ck_gemm_wgmma(const ck_gemm_args *a, cudaStream_t st) {
#ifndef CLEF_CUDA_WGMMA
    (void)a, (void)st;
    return cudaErrorNotSupported;
#else
    if (a->mode != CK_GEMM_GATEUP && a->mode != CK_GEMM_DOWN) return cudaErrorInvalidValue;
    if (a->K < WG_BK || a->K % WG_BK || a->lda % 8 || (a->big != 0 && a->big != 1)) return cudaErrorInvalidValue;
    if (a->mode == CK_GEMM_DOWN && (a->ldy % 2 || ((uintptr_t)a->Y & 7))) return cudaErrorInvalidValue; /* float2 stores */
    if (a->split == 2) return a->big ? launch_wgmma<WQ_BF16, 128, 2>(a, st) : launch_wgmma<WQ_BF16, 64, 2>(a, st);
    if (a->split != 1) return cudaErrorInvalidValue;
    return a->big ? launch_wgmma<WQ_BF16, 128, 1>(a, st) : launch_wgmma<WQ_BF16, 64, 1>(a, st);
#endif
}

int ck_qgemm_wgmma_fits(const ck_qgemm_args *a) {
    if (!ck_wgmma_built()) return 0;
    if (a->mode != CK_GEMM_GATEUP && a->mode != CK_GEMM_DOWN) return 0;
    if (a->K < WG_BK || a->K % WG_BK || a->lda % 8 || a->N < 1 || a->N > 0x7fff0000LL || (a->split != 1 && a->split != 2))
        return 0;
    switch (a->qtype) {
    case CK_QT_NVFP4: return 1;
    case CK_QT_FP8: return a->block_c > 0 && a->block_c % WG_BK == 0 && a->block_r > 0 && a->block_r % 8 == 0;
    case CK_QT_INT4: return a->int4_reordered && a->group > 0 && a->group % WG_BK == 0 && a->N % 8 == 0;
    default: return 0;
    }
}

cudaError_t ck_qgemm_wgmma(const ck_qgemm_args *a, cudaStream_t st) {
#ifndef CLEF_CUDA_WGMMA
    (void)a, (void)st;
    return cudaErrorNotSupported;
#else
    if (!ck_qgemm_wgmma_fits(a) || a->bm != 128) return cudaErrorInvalidValue;
    if (a->mode == CK_GEMM_DOWN && (a->ldy % 2 || ((uintptr_t)a->Y & 7))) return cudaErrorInvalidValue; /* float2 stores */
    switch (a->qtype) {
    case CK_QT_NVFP4: return a->nvfp4_reordered ? launch_qwgmma<WQ_NVFP4R>(a, st) : launch_qwgmma<CK_QT_NVFP4>(a, st);
    case CK_QT_FP8: return launch_qwgmma<CK_QT_FP8>(a, st);
    default: return launch_qwgmma<CK_QT_INT4>(a, st);
    }
#endif
}

} /* extern "C" */
