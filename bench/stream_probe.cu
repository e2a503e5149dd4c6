/* stream_probe.cu — how fast can the expert GEMM's weight-loading pattern
 * stream the experts' weights from HBM, with no arithmetic?  A probe for the
 * 300-token expert GEMM (docs/BENCHMARKS.md): 128 experts x 1,536 rows x
 * 2,048 bf16 (the gate+up weights of one layer, 805 MB), one block per
 * (expert, 128-row tile), each streaming its 128 x 2,048 tile through shared
 * memory stage by stage, like gemm_kernel's W loads.
 *
 *   layout 0: rows of the checkpoint (a stage = 128 rows x BK columns, row stride 4 KiB)
 *   layout 1: tile-contiguous (a stage = one contiguous 128 x BK block)
 *   copy  0: cp.async 16 B by all 256 threads;  1: one cp.async.bulk per stage (TMA, mbarrier)
 * then with the GEMM's work (32-row [hi | lo] activation tiles and the MMAs): "gemm now" = every
 * warp loads and computes, a block-wide barrier per stage (gemm_kernel's shape); "gemm ws TMA" =
 * a ninth warp loads the weight tile with one 2-D tensor copy and the activation rows with
 * cp.async, full / empty mbarriers (gemm_tma_kernel's shape), with tensor maps in kernel
 * parameters or in global memory, one or two boxes per stage, private or shared activation rows.
 * On the H200 (2026-11-30): pure streaming ~4.5 TB/s in every layout; gemm now 237 us, ws TMA
 * 207 us (docs/BENCHMARKS.md).  Weights are zeros: timing only.
 *
 * build: the CMake target stream_probe (CUDA builds for sm_90a), or
 *        nvcc -O3 -std=c++17 --generate-code=arch=compute_90a,code=sm_90a -Isrc -Iinclude \
 *             -o stream_probe bench/stream_probe.cu
 * usage: stream_probe  (GB/s per variant, the best of 20 runs; PROBE_ALL=1 adds the layout and
 *        copy-engine variants) */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_cuda.h"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

BENCH_CK_PROGRAM("stream_probe")

constexpr int E = 128, N = 1536, K = 2048, TN = 128;

static __device__ __forceinline__ uint32_t sa(const void *p) { return smem_addr(p); }

/* Keeps the probe's work alive: the sum of its accumulators stored only in an impossible case. */
template <int M, int N> static __device__ __forceinline__ void sink_acc(const float (&acc)[M][N], float *sink) {
    float t = 0.f;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) t += acc[i][j];
    if (t == 12345.f) sink[0] = t;
}

/* One non-tensor bulk copy of `bytes` global -> shared, completing on mbarrier b. */
static __device__ __forceinline__ void bulk_copy(void *dst, const void *src, int bytes, uint64_t *b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     sa(dst)),
                 "l"(src), "r"(bytes), "r"(sa(b))
                 : "memory");
}

template <int BK, int STAGES, int LAYOUT>
__global__ void __launch_bounds__(256) probe_cpasync(const uint16_t *__restrict__ W, float *sink) {
    extern __shared__ __align__(128) uint16_t sm[];
    const int tile = blockIdx.x, e = tile / (N / TN), nt = tile % (N / TN), tid = threadIdx.x;
    const uint16_t *base = W + ((int64_t)e * N + nt * TN) * K;
    constexpr int CH = TN * BK / 8 / 256; /* 16-byte chunks per thread per stage */
    auto load = [&](int kt, int s) {
#pragma unroll
        for (int i = 0; i < CH; i++) {
            const int c = tid + i * 256, r = c / (BK / 8), col = (c % (BK / 8)) * 8;
            const uint16_t *src = LAYOUT == 0 ? base + (int64_t)r * K + kt * BK + col
                                              : base + (int64_t)kt * TN * BK + c * 8;
            cp_async16(sm + s * TN * BK + c * 8, src, true);
        }
    };
    float acc[1][1] = {};
    cp_ring<STAGES>(K / BK, load, [&](int, int s) { acc[0][0] += (float)sm[s * TN * BK + tid * 8]; });
    sink_acc(acc, sink);
}

/* TMA bulk: thread 0 issues one contiguous copy per stage (tile layout only). */
template <int BK, int STAGES>
__global__ void __launch_bounds__(128) probe_bulk(const uint16_t *__restrict__ W, float *sink) {
    extern __shared__ __align__(128) uint16_t sm[];
    __shared__ __align__(8) uint64_t full[STAGES];
    const int tile = blockIdx.x, e = tile / (N / TN), nt = tile % (N / TN), tid = threadIdx.x;
    const uint16_t *base = W + ((int64_t)e * N + nt * TN) * K;
    constexpr int BYTES = TN * BK * 2, KT = K / BK;
    if (tid == 0)
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1);
    fence_proxy_async();
    __syncthreads();
    auto issue = [&](int kt, int s) {
        mbar_arrive_expect_tx(&full[s], BYTES);
        bulk_copy(sm + s * TN * BK, base + (int64_t)kt * TN * BK, BYTES, &full[s]);
    };
    if (tid == 0)
        for (int s = 0; s < STAGES && s < KT; s++) issue(s, s);
    float acc[1][1] = {};
    for (int kt = 0; kt < KT; kt++) {
        const int s = kt % STAGES;
        mbar_wait(&full[s], (kt / STAGES) & 1);
        acc[0][0] += (float)sm[s * TN * BK + tid * 8];
        __syncthreads(); /* every thread done with stage s before it is refilled */
        if (tid == 0 && kt + STAGES < KT) issue(kt + STAGES, s);
    }
    sink_acc(acc, sink);
}


/* ---- with the GEMM's work: 32-row A tiles ([hi | lo], from an L2-sized buffer) and the MMAs ---- */
constexpr int PITCH = 72, BK = 64, BMR = 32;
/* one stage's MMAs of warp (wm, wn): 16 x 32 warp tile, hi then lo; waddr(row, chunk): the shared address
 * of 16-byte chunk `chunk` of weight row `row` of the stage (padded rows or the 128-byte swizzle) */
template <class WAddr>
__device__ __forceinline__ void stage_mma(const uint16_t *as, int wm, int wn, int lane, float (&acc)[4][4], WAddr waddr) {
#pragma unroll
    for (int ks = 0; ks < BK / 16; ks++) {
        uint32_t af[4], b[4][2];
        ldsm_x4(af[0], af[1], af[2], af[3], as + (wm * 16 + (lane & 15)) * PITCH + ks * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int nj = 0; nj < 2; nj++)
            ldsm_x4(b[2 * nj][0], b[2 * nj][1], b[2 * nj + 1][0], b[2 * nj + 1][1],
                    waddr(wn * 32 + nj * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
#pragma unroll
        for (int ni = 0; ni < 4; ni++) mma16816(acc[ni], af, b[ni][0], b[ni][1]);
        ldsm_x4(af[0], af[1], af[2], af[3], as + BMR * PITCH + (wm * 16 + (lane & 15)) * PITCH + ks * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int ni = 0; ni < 4; ni++) mma16816(acc[ni], af, b[ni][0], b[ni][1]);
    }
}
/* the padded weight rows of a stage at ws */
static __device__ __forceinline__ auto padded(const uint16_t *ws) {
    return [ws](int row, int chunk) { return (const void *)(ws + row * PITCH + chunk * 8); };
}
constexpr int STAGE_EL = (2 * BMR + TN) * PITCH; /* A hi, A lo, W */

/* today's shape: all 8 warps load (cp.async) and compute; a block-wide wait per stage */
template <int STAGES, int LOADA = 1, int DOMMA = 1>
__global__ void __launch_bounds__(256, 2) probe_gemm_now(const uint16_t *__restrict__ W, const uint16_t *__restrict__ A,
                                                         float *sink) {
    extern __shared__ __align__(128) uint16_t sm[];
    const int tile = blockIdx.x, e = tile / (N / TN), nt = tile % (N / TN), tid = threadIdx.x, lane = tid & 31,
              warp = tid >> 5, wm = warp / 4, wn = warp % 4;
    const uint16_t *wb = W + ((int64_t)e * N + nt * TN) * K, *ab = A + (int64_t)e * BMR * 2 * K;
    auto load = [&](int kt, int s) {
        uint16_t *st = sm + s * STAGE_EL;
        if (LOADA) { /* A: 64 rows (hi 32, lo 32) x 8 chunks = 2 per thread */
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int c = tid + i * 256, r = c / 8, col = (c % 8) * 8, half = r / BMR, rr = r % BMR;
                cp_async16(st + r * PITCH + col, ab + (int64_t)rr * 2 * K + half * K + kt * BK + col, true);
            }
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int c = tid + i * 256, r = c / 8, col = (c % 8) * 8;
            cp_async16(st + (2 * BMR + r) * PITCH + col, wb + (int64_t)r * K + kt * BK + col, true);
        }
    };
    float acc[4][4] = {};
    cp_ring<STAGES>(K / BK, load, [&](int, int s) {
        const uint16_t *st = sm + s * STAGE_EL;
        if (DOMMA) stage_mma(st, wm, wn, lane, acc, padded(st + 2 * BMR * PITCH));
        else acc[0][0] += (float)st[tid];
    });
    sink_acc(acc, sink);
}

/* warp-specialised: warp 8 issues one bulk copy per smem row (128 B) into the padded stage, full/empty
 * mbarriers; warps 0-7 only compute */
template <int STAGES>
__global__ void __launch_bounds__(288, 2) probe_gemm_ws(const uint16_t *__restrict__ W, const uint16_t *__restrict__ A,
                                                        float *sink) {
    extern __shared__ __align__(128) uint16_t sm[];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    const int tile = blockIdx.x, e = tile / (N / TN), nt = tile % (N / TN), tid = threadIdx.x, lane = tid & 31,
              warp = tid >> 5;
    const uint16_t *wb = W + ((int64_t)e * N + nt * TN) * K, *ab = A + (int64_t)e * BMR * 2 * K;
    constexpr int KT = K / BK, ROWS = 2 * BMR + TN, BYTES = ROWS * BK * 2;
    if (tid == 0)
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 8);
        }
    fence_proxy_async();
    __syncthreads();
    if (warp == 8) {
        for (int kt = 0; kt < KT; kt++) {
            const int s = kt % STAGES;
            if (kt >= STAGES) mbar_wait(&empty[s], ((kt / STAGES) - 1) & 1);
            if (lane == 0) mbar_arrive_expect_tx(&full[s], BYTES);
            __syncwarp();
            uint16_t *st = sm + s * STAGE_EL;
            for (int r = lane; r < ROWS; r += 32) {
                const uint16_t *src = r < 2 * BMR ? ab + (int64_t)(r % BMR) * 2 * K + (r / BMR) * K + kt * BK
                                                  : wb + (int64_t)(r - 2 * BMR) * K + kt * BK;
                bulk_copy(st + r * PITCH, src, BK * 2, &full[s]);
            }
        }
        return;
    }
    const int wm = warp / 4, wn = warp % 4;
    float acc[4][4] = {};
    for (int kt = 0; kt < KT; kt++) {
        const int s = kt % STAGES;
        mbar_wait(&full[s], (kt / STAGES) & 1);
        const uint16_t *st = sm + s * STAGE_EL;
        stage_mma(st, wm, wn, lane, acc, padded(st + 2 * BMR * PITCH));
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
    }
    sink_acc(acc, sink);
}


/* warp-specialised with the tensor-copy engine: warp 8 loads W with one 2-D TMA per stage (64 x 128 box,
 * 128-byte swizzle) and the A rows with cp.async (completion counted on the same mbarrier); warps 0-7
 * compute (W fragments read with the swizzled addresses). */
constexpr int WS_W_BYTES = TN * BK * 2, WS_A_EL = 2 * BMR * PITCH;
constexpr int WS_STAGE_BYTES = ((WS_W_BYTES + WS_A_EL * 2) + 1023) / 1024 * 1024;
template <int STAGES, int GMAP = 0, int AMODE = 0>
__global__ void __launch_bounds__(288, 2) probe_gemm_tma(const __grid_constant__ CUtensorMap tmap,
                                                         const uint16_t *__restrict__ A, float *sink,
                                                         const CUtensorMap *gmaps = nullptr) {
    extern __shared__ __align__(1024) unsigned char smb[];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    unsigned char *sm = smb + ((1024 - (sa(smb) & 1023)) & 1023);
    const int tile = blockIdx.x, e = tile / (N / TN), nt = tile % (N / TN), tid = threadIdx.x, lane = tid & 31,
              warp = tid >> 5;
    const uint16_t *ab = A + (int64_t)e * BMR * 2 * K;
    constexpr int KT = K / BK;
    if (tid == 0)
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 33);
            mbar_init(&empty[s], 8);
        }
    fence_proxy_async();
    __syncthreads();
    if (warp == 8) {
        const void *mp = GMAP ? (const void *)&gmaps[e] : (const void *)&tmap;
        const int ybase = GMAP ? nt * TN : e * N + nt * TN;
        if (GMAP == 2 && lane == 0) asm volatile("prefetch.tensormap [%0];\n" ::"l"(mp) : "memory");
        for (int kt = 0; kt < KT; kt++) {
            const int s = kt % STAGES;
            if (kt >= STAGES) mbar_wait(&empty[s], ((kt / STAGES) - 1) & 1);
            unsigned char *st = sm + s * WS_STAGE_BYTES;
            if (lane == 0) {
                mbar_arrive_expect_tx(&full[s], WS_W_BYTES);
                if (GMAP < 3) {
                    tma_load_2d(st, mp, kt * BK, ybase, &full[s]);
                } else {
                const void *m0 = GMAP == 3 ? (const void *)&gmaps[e] : (const void *)&tmap;
                const void *m1 = GMAP == 3 ? (const void *)&gmaps[(e + 64) % E] : (const void *)&tmap;
                const int y0 = GMAP == 3 ? nt * 64 : e * N + nt * 64, y1 = GMAP == 3 ? nt * 64 : e * N + 768 + nt * 64;
                    tma_load_2d(st, m0, kt * BK, y0, &full[s]);
                    tma_load_2d(st + 8192, m1, kt * BK, y1, &full[s]);
                }
            }
            uint16_t *as = reinterpret_cast<uint16_t *>(st + WS_W_BYTES);
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const int c = lane + i * 32, r = c / 8, col = (c % 8) * 8, half = r / BMR, rr = r % BMR;
                if (AMODE == 0) {
                    cp_async16(as + r * PITCH + col, ab + (int64_t)rr * 2 * K + half * K + kt * BK + col, true);
                } else { /* AMODE 1: rows of a 300-row pool, each shared by ~96 blocks; 2: + rows >= 19 zero-filled */
                    const int tok = (int)(((unsigned)e * 2654435761u + (unsigned)rr * 40503u) % 300u);
                    const bool ok = AMODE == 1 || rr < 19;
                    const uint16_t *src = ok ? A + (int64_t)tok * 2 * K + half * K + kt * BK + col : A;
                    cp_async16(as + r * PITCH + col, src, ok);
                }
            }
            mbar_cp_async_arrive(&full[s]);
        }
        return;
    }
    const int wm = warp / 4, wn = warp % 4;
    float acc[4][4] = {};
    for (int kt = 0; kt < KT; kt++) {
        const int s = kt % STAGES;
        mbar_wait(&full[s], (kt / STAGES) & 1);
        const unsigned char *st = sm + s * WS_STAGE_BYTES;
        /* W fragments at the copy's 128-byte-swizzled addresses (cuda_wgmma.cuh's sw128) */
        stage_mma(reinterpret_cast<const uint16_t *>(st + WS_W_BYTES), wm, wn, lane, acc,
                  [st](int row, int chunk) { return (const void *)(st + sw128(row, chunk)); });
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
    }
    sink_acc(acc, sink);
}

template <class F> static void timeit(const char *name, F launch) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    launch();
    CK(cudaDeviceSynchronize());
    float best = 1e9f;
    for (int i = 0; i < 20; i++) {
        CK(cudaEventRecord(a));
        launch();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (ms < best) best = ms;
    }
    const double bytes = (double)E * N * K * 2;
    printf("%-34s %8.1f us  %7.0f GB/s\n", name, best * 1e3, bytes / (best * 1e-3) / 1e9);
}

/* One probe kernel over the grid of (expert, 128-row tile) blocks with `smem` bytes of dynamic
 * shared memory, timed under `name`. */
template <class... P, class... Args>
static void run(const char *name, void (*kernel)(P...), int threads, int smem, Args... args) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    timeit(name, [&] { kernel<<<E * N / TN, threads, smem>>>(args...); });
    CK(cudaGetLastError());
}
template <int BK, int STAGES, int LAYOUT> static void run_cp(const uint16_t *W, float *sink, const char *name) {
    run(name, probe_cpasync<BK, STAGES, LAYOUT>, 256, STAGES * TN * BK * 2, W, sink);
}
template <int BK, int STAGES> static void run_bulk(const uint16_t *W, float *sink, const char *name) {
    run(name, probe_bulk<BK, STAGES>, 128, STAGES * TN * BK * 2, W, sink);
}
template <int STAGES, int LA = 1, int MM = 1>
static void run_now(const uint16_t *W, const uint16_t *A, float *sink, const char *name) {
    run(name, probe_gemm_now<STAGES, LA, MM>, 256, STAGES * STAGE_EL * 2, W, A, sink);
}
template <int STAGES> static void run_ws(const uint16_t *W, const uint16_t *A, float *sink, const char *name) {
    run(name, probe_gemm_ws<STAGES>, 288, STAGES * STAGE_EL * 2, W, A, sink);
}
template <int STAGES, int GMAP = 0, int AM = 0>
static void run_tma(const CUtensorMap &m, const uint16_t *A, float *sink, const char *name,
                    const CUtensorMap *g = nullptr) {
    run(name, probe_gemm_tma<STAGES, GMAP, AM>, 288, STAGES * WS_STAGE_BYTES + 1024, m, A, sink, g);
}

static CUtensorMap make_map(const uint16_t *W, cuuint64_t rows = (cuuint64_t)E * N, cuuint32_t brows = TN) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = nullptr;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&enc, 12000, cudaEnableDefault, &q));
    if (!enc) { fprintf(stderr, "no cuTensorMapEncodeTiled\n"); exit(1); }
    CUtensorMap m;
    cuuint64_t dims[2] = {(cuuint64_t)K, rows}, strides[1] = {(cuuint64_t)K * 2};
    cuuint32_t box[2] = {BK, brows}, es[2] = {1, 1};
    CUresult r = enc(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)W, dims, strides, box, es,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) { fprintf(stderr, "encode %d\n", (int)r); exit(1); }
    return m;
}
int main(void) {
    uint16_t *W;
    float *sink;
    const size_t bytes = (size_t)E * N * K * 2;
    CK(cudaMalloc(&W, bytes + (64 << 20)));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(W, 1, bytes));
    uint16_t *big;
    CK(cudaMalloc(&big, bytes));
    timeit("memcpy d2d (read+write, counts 1x)", [&] { CK(cudaMemcpyAsync(big, W, bytes, cudaMemcpyDeviceToDevice)); });
    if (getenv("PROBE_ALL")) {
    run_cp<64, 4, 0>(W, sink, "cp.async rows   BK64  4 st");
    run_cp<64, 4, 1>(W, sink, "cp.async tiles  BK64  4 st");
    run_cp<64, 6, 0>(W, sink, "cp.async rows   BK64  6 st");
    run_cp<64, 6, 1>(W, sink, "cp.async tiles  BK64  6 st");
    run_cp<128, 3, 0>(W, sink, "cp.async rows   BK128 3 st");
    run_cp<128, 3, 1>(W, sink, "cp.async tiles  BK128 3 st");
    run_cp<64, 8, 0>(W, sink, "cp.async rows   BK64  8 st");
    run_bulk<64, 4>(W, sink, "bulk tiles      BK64  4 st");
    run_bulk<64, 6>(W, sink, "bulk tiles      BK64  6 st");
    run_bulk<64, 8>(W, sink, "bulk tiles      BK64  8 st");
    run_bulk<128, 4>(W, sink, "bulk tiles      BK128 4 st");
    run_bulk<128, 6>(W, sink, "bulk tiles      BK128 6 st");
    }
    uint16_t *A;
    CK(cudaMalloc(&A, (size_t)E * BMR * 2 * K * 2));
    CK(cudaMemset(A, 0, (size_t)E * BMR * 2 * K * 2));
    CK(cudaMemset(W, 0, bytes));
    run_now<4>(W, A, sink, "gemm now (all warps)  4 st");

    if (getenv("PROBE_ALL")) {
    run_now<4, 0, 1>(W, A, sink, "gemm now, no A loads  4 st");
    run_now<4, 1, 0>(W, A, sink, "gemm now, no MMA      4 st");
    run_ws<2>(W, A, sink, "gemm ws (bulk rows)   2 st");
    }
    const CUtensorMap m = make_map(W);
    run_tma<4>(m, A, sink, "gemm ws TMA 2-D       4 st");
    run_tma<3>(m, A, sink, "gemm ws TMA 2-D       3 st");
    CUtensorMap hm[E], *dm;
    for (int e = 0; e < E; e++) hm[e] = make_map(W + (size_t)e * N * K, N);
    CK(cudaMalloc(&dm, sizeof hm));
    CK(cudaMemcpy(dm, hm, sizeof hm, cudaMemcpyHostToDevice));
    run_tma<4, 1>(m, A, sink, "gemm ws TMA, maps in global 4 st", dm);
    run_tma<4, 2>(m, A, sink, "  same + prefetch.tensormap  4 st", dm);
    run_tma<4, 0>(m, A, sink, "gemm ws TMA 2-D (param)     4 st");
    CUtensorMap hm64[E], *dm64;
    for (int e = 0; e < E; e++) hm64[e] = make_map(W + (size_t)e * N * K, N, 64);
    CK(cudaMalloc(&dm64, sizeof hm64));
    CK(cudaMemcpy(dm64, hm64, sizeof hm64, cudaMemcpyHostToDevice));
    const CUtensorMap m64 = make_map(W, (cuuint64_t)E * N, 64);
    run_tma<4, 3>(m64, A, sink, "2 x 64-row boxes, 2 global maps", dm64);
    run_tma<4, 3, 1>(m64, A, sink, "  + A rows from a 300-row pool ", dm64);
    run_tma<4, 3, 2>(m64, A, sink, "  + rows >= 19 zero-filled     ", dm64);
    run_tma<4, 0, 1>(m, A, sink, "1 map, A from 300-row pool     ");
    run_tma<4, 0, 2>(m, A, sink, "1 map, pool + zero-fill        ");
    return 0;
}
