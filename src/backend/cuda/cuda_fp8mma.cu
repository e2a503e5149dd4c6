/* cuda_fp8mma.cu — W8A8 FP8-block experts on Hopper's FP8 tensor cores
 * (CLEF_CUDA_FP8_MMA=1; cuda.h): activation rows quantized per row per 128
 * columns to E4M3 (ck_fp8_quant_rows), then the grouped GATEUP / DOWN
 * products as wgmma.mma_async m64n128k32 e4m3 x e4m3 -> f32 with per-block
 * promotion (ck_fp8mma).
 *
 * Tiles: 128 rows (two warpgroups of 64) x 128 weight rows (GATEUP: 64 gate
 * + 64 up rows of the same intermediate indices), K walked in 128-wide
 * blocks: one block of an FP8 row is 128 bytes, exactly one row of a
 * 128-byte swizzle atom, so each stage holds one K block of A and W in the
 * swizzled layout the wgmma descriptors read (cuda_wgmma.cu's layout, 32-byte
 * K steps).  Per K block kb the four k32 wgmmas sum into `part` from zero
 * (scale-d = 0 on the first); then, part final (wait_group 0),
 *     acc = fmaf(part, a_scale[row][kb] * w_scale[n / 128][kb], acc)
 * in f32 (the promotion also bounds the FP8 MMA's limited internal
 * accumulator precision to 128 products).  Every output element is thus one
 * fixed-order computation over its own A row and weight row: it depends on
 * neither the tile it lands in nor the rows beside it (backend.h rule), and
 * one kernel shape serves every pass size.
 *
 * Built for sm_90a only (CLEF_CUDA_WGMMA from CMake); elsewhere ck_fp8mma
 * reports cudaErrorNotSupported.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

typedef __nv_bfloat16 bf16;

namespace {

constexpr int QB = 128;                  /* K values per activation / weight scale block */
constexpr int BM = 128, BN = 128, HALF = BN / 2, THREADS = 256, NR = BN / 2;
constexpr int ROWB = 128;                /* bytes of one tile row per stage (one K block of FP8) */
static_assert(ROWB == WG_ROW_BYTES, "one K block of a row is one swizzle row (cuda_wgmma.cuh)");
constexpr int STAGE = (BM + BN) * ROWB;  /* 32 KiB */
constexpr int STAGES = 6;
constexpr int SMEM = STAGES * STAGE + 1024; /* + alignment slack for the 1024-byte swizzle atoms */


/* f32 -> FP8 E4M3fn byte: clef_fp8_e4m3_encode (src/quant/fp.c) statement
 * for statement (RNE, saturating to +-448, NaN 0x7F, sign of zero kept), so
 * that the host mirrors the device bit for bit. */
__device__ __forceinline__ uint32_t e4m3_encode(float x) {
    if (isnan(x)) return 0x7Fu;
    const uint32_t sign = signbit(x) ? 0x80u : 0u;
    const float a = fabsf(x);
    if (a >= 448.0f) return sign | 0x7Eu;
    if (a < 0x1p-6f) return sign | (uint32_t)rintf(__fmul_rn(a, 0x1p9f));
    const int e = (int)((__float_as_uint(a) >> 23) & 0xFF) - 127;
    const float p2 = __uint_as_float((uint32_t)(3 - e + 127) << 23);
    const float m = rintf(__fmul_rn(a, p2));
    unsigned code = (unsigned)(e + 7) * 8u + (unsigned)m - 8u;
    if (code > 0x7Eu) code = 0x7Eu;
    return sign | code;
}

template <typename T> __device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<bf16>(bf16 v) { return __bfloat162float(v); }

/* One warp per (row, 128-column block): lane l holds columns 4l .. 4l + 3. */
template <typename T>
__global__ void fp8_quant_kernel(const T *x, int64_t rows, int64_t K, int64_t ldx, uint8_t *q, float *s) {
    const int64_t nb = K / QB, w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= rows * nb) return; /* whole warps (blockDim % 32 == 0) */
    const int64_t r = w / nb, b = w % nb;
    const T *xr = x + r * ldx + b * QB + lane * 4;
    float v[4], m = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[i] = to_f32<T>(xr[i]);
        m = fmaxf(m, fabsf(v[i]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    /* 1 where amax / 448 is 0: an all-zero block, or amax below ~2^-140 (the division would underflow
     * and x / 0 give inf or NaN) */
    float sc = __fdiv_rn(m, 448.0f);
    if (!(sc > 0.0f)) sc = 1.0f;
    uint32_t packed = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) packed |= e4m3_encode(__fdiv_rn(v[i], sc)) << (8 * i);
    reinterpret_cast<uint32_t *>(q + r * K + b * QB)[lane] = packed;
    if (lane == 0) s[r * nb + b] = sc;
}

#ifdef CLEF_WGMMA_DEVICE
/* d[64x128] (+)= A[64x32] . B[128x32]^T, E4M3 operands K-major in shared memory; accumulate = 0: d = A.B. */
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " WG_ACC64_REGS ", "
        "%64, %65, p, 1, 1;\n"
        "}\n"
        : WG_ACC64(d)
        : "l"(da), "l"(db), "r"(accumulate));
}
#endif

/* One 128 x 128 tile of a grouped W8A8 product (a.mode GATEUP or DOWN). */
__global__ void __launch_bounds__(THREADS, 1) fp8mma_kernel(const ck_fp8mma_args a) {
#ifdef CLEF_WGMMA_DEVICE
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    const uint32_t sbase = smem_addr(smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const bool gateup = a.mode == CK_GEMM_GATEUP;
    const int64_t N = a.N, K = a.K, nkb = K / QB;
    const int64_t n_tiles_n = gateup ? (N + HALF - 1) / HALF : (N + BN - 1) / BN;
    const int64_t mt = blockIdx.x / n_tiles_n, nt = blockIdx.x % n_tiles_n;
    if (mt >= *a.n_tiles) return;
    const int e = a.tile_expert[mt];
    const int64_t row0 = a.tile_row0[mt], end = a.expert_end[e];
    const int64_t rows = end - row0 < BM ? end - row0 : BM;
    /* A row (token row for GATEUP) of tile row r < rows */
    auto arow = [&](int r) -> int64_t { return gateup ? (int64_t)a.row_src[row0 + r] : row0 + r; };
    /* weight row of tile row r (GATEUP: rows [0, HALF) gate, [HALF, BN) up) */
    auto wrow = [&](int r) -> int64_t { return gateup ? nt * HALF + (r % HALF) : nt * BN + r; };

    /* copies, fixed over K: 4 chunks of 16 bytes of A and 4 of W per thread */
    const uint8_t *a_src[4], *w_src[4];
    uint32_t dst[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int c = tid + i * THREADS, r = c >> 3, ch = c & 7;
        dst[i] = sw128(r, ch);
        a_src[i] = r < rows ? a.A + arow(r) * K + ch * 16 : nullptr;
        const int64_t n = wrow(r);
        const uint8_t *wq = static_cast<const uint8_t *>((gateup && r >= HALF ? a.W1 : a.W0)[e].q);
        w_src[i] = n < N ? wq + n * K + ch * 16 : nullptr;
    }
    auto load_stage = [&](int64_t kb, int stage) {
        unsigned char *st = smem + stage * STAGE;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            cp_async16(st + dst[i], a_src[i] ? a_src[i] + kb * QB : a.A, a_src[i] != nullptr);
            cp_async16(st + BM * ROWB + dst[i], w_src[i] ? w_src[i] + kb * QB : a.A, w_src[i] != nullptr);
        }
    };

    /* scales: this thread's accumulator rows rbase, rbase + 8 (rows past the tile: row 0's, times zeros);
     * its weight block row (GATEUP: the gate block in W0, the up block in W1) */
    const int rbase = wg * 64 + (warp & 3) * 16 + g;
    const float *as0 = a.As + arow(rbase < rows ? rbase : 0) * nkb;
    const float *as1 = a.As + arow(rbase + 8 < rows ? rbase + 8 : 0) * nkb;
    const int64_t wb = gateup ? (nt * HALF) / QB : (nt * BN) / QB;
    const float *ws0 = static_cast<const float *>(a.W0[e].scale) + wb * nkb;
    const float *ws1 = gateup ? static_cast<const float *>(a.W1[e].scale) + wb * nkb : ws0;

    float acc[NR], part[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) acc[i] = part[i] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES; s++) {
        if (s < nkb) load_stage(s, s);
        cp_async_commit();
    }
    int64_t kb = 0;
    do { /* nkb >= 1 */
        cp_async_wait<STAGES - 1>(); /* this thread's copies of block kb landed */
        fence_proxy_async();
        __syncthreads();             /* everyone's did */
        const float sa0 = __ldg(as0 + kb), sa1 = __ldg(as1 + kb), sw0 = __ldg(ws0 + kb), sw1 = __ldg(ws1 + kb);
        const uint32_t st = sbase + (uint32_t)((kb % STAGES) * STAGE);
        acc_fence(part);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < QB / 32; ks++) /* 32-wide K steps: +32 bytes inside the swizzled rows */
            wgmma_m64n128k32_e4m3(part, wg_desc(st + (uint32_t)(wg * 64 * ROWB) + ks * 32),
                                  wg_desc(st + (uint32_t)(BM * ROWB) + ks * 32), ks);
        wg_commit();
        wg_wait<0>();
        acc_fence(part);
        __syncthreads(); /* both warpgroups are done with this stage */
        if (kb + STAGES < nkb) load_stage(kb + STAGES, (int)(kb % STAGES));
        cp_async_commit();
        /* promotion: acc[4j + q] is row rbase + 8 (q >> 1), column 8j + 2t + (q & 1) of the tile */
        const float s00 = sa0 * sw0, s01 = sa0 * sw1, s10 = sa1 * sw0, s11 = sa1 * sw1;
#pragma unroll
        for (int j = 0; j < NR / 4; j++) {
            const bool up = gateup && 8 * j >= HALF;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float sc = q < 2 ? (up ? s01 : s00) : (up ? s11 : s10);
                acc[4 * j + q] = fmaf(part[4 * j + q], sc, acc[4 * j + q]);
            }
        }
    } while (++kb < nkb);
    cp_async_wait<0>();

    wg_epilogue<BN, HALF, 1>(acc, !gateup, a.Y, a.ldy, reinterpret_cast<bf16 *>(a.H), N, row0, rows, nt, rbase, t,
                             [](float v, int) { return v; });
#else
    __trap(); /* not built for sm_90a: ck_fp8mma refuses before launching */
#endif
}

} /* namespace */

extern "C" {

cudaError_t ck_fp8_quant_rows(const void *x, int x_bf16, int64_t rows, int64_t K, int64_t ldx, uint8_t *q, float *s,
                              cudaStream_t st) {
    if (rows < 0 || K < QB || K % QB || ldx < K || ((uintptr_t)q & 3)) return cudaErrorInvalidValue;
    const int64_t warps = rows * (K / QB);
    if (warps == 0) return cudaSuccess;
    const int64_t blocks = (warps + 7) / 8;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    if (x_bf16)
        fp8_quant_kernel<bf16><<<(unsigned)blocks, 256, 0, st>>>(static_cast<const bf16 *>(x), rows, K, ldx, q, s);
    else
        fp8_quant_kernel<float><<<(unsigned)blocks, 256, 0, st>>>(static_cast<const float *>(x), rows, K, ldx, q, s);
    return cudaGetLastError();
}

int ck_fp8mma_fits(int64_t K, int64_t N, int64_t block_r, int64_t block_c) {
    return ck_wgmma_built() && K >= QB && K % QB == 0 && N >= 1 && N <= 0x7fff0000LL && block_r == QB &&
           block_c == QB;
}

cudaError_t ck_fp8mma(const ck_fp8mma_args *a, cudaStream_t st) {
#ifndef CLEF_CUDA_WGMMA
    (void)a, (void)st;
    return cudaErrorNotSupported;
#else
    if ((a->mode != CK_GEMM_GATEUP && a->mode != CK_GEMM_DOWN) || !ck_fp8mma_fits(a->K, a->N, QB, QB))
        return cudaErrorInvalidValue;
    if (((uintptr_t)a->A & 15) || (a->mode == CK_GEMM_DOWN && (a->ldy % 2 || ((uintptr_t)a->Y & 7))))
        return cudaErrorInvalidValue;
    static unsigned done = 0; /* devices whose shared-memory limit is raised */
    cudaError_t e = allow_smem(fp8mma_kernel, SMEM, &done);
    if (e != cudaSuccess) return e;
    unsigned blocks;
    e = gemm_grid(a->mode, a->max_tiles, a->N, BN, &blocks);
    if (e != cudaSuccess || !blocks) return e;
    fp8mma_kernel<<<blocks, THREADS, SMEM, st>>>(*a);
    return cudaGetLastError();
#endif
}

} /* extern "C" */
