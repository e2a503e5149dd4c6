/* cuda_gemm.cu — weight products of the CUDA backend: f32 -> bf16 activation
 * rows, the tensor-core GEMM (dense, and grouped over experts with the
 * SwiGLU fused into the gate/up epilogue), the MoE permutation and combine,
 * the router top-k and the embedding gather.
 *
 * The GEMM is a plain Ampere-style kernel (cp.async 3-stage pipeline,
 * ldmatrix, mma.sync m16n8k16 bf16 -> f32).  Its one numerical promise:
 * every output element is the dot product of its A row and W row
 * accumulated over K in ascending 16-wide chunks by one thread, whatever the
 * tile shape, the grid or the rows around it, so results are bitwise
 * independent of batch composition (backend.h determinism rule).
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

typedef __nv_bfloat16 bf16;

namespace {

/* ---- activations to bf16 ------------------------------------------------ */

/* Rows on blockIdx.y (grid-stride), columns in pairs on x: no 64-bit division per element. */
__global__ void rows_to_bf16_kernel(const float *__restrict__ x, int64_t rows, int64_t K, int64_t ldx,
                                    bf16 *__restrict__ dst, int split) {
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const float *xr = x + r * ldx;
        bf16 *d = dst + r * K * split;
        for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < K; c += (int64_t)gridDim.x * blockDim.x) {
            put_bf16(d, K, split, c, xr[c]);
        }
    }
}

/* Up to three row blocks in one launch: blockIdx.x runs over every part's
 * column blocks (part p owns xb[p] of them, so no block is idle), rows on
 * y; each element as rows_to_bf16_kernel converts it.  The part's fields
 * are picked by selects (a dynamic index into the parameters would copy
 * them to local memory in every thread). */
__global__ void rows_to_bf16_multi_kernel(const ck_rows_bf16_job jobs, int xb0, int xb1, int split) {
    const int bx = (int)blockIdx.x, z = bx < xb0 ? 0 : bx < xb0 + xb1 ? 1 : 2;
    const ck_rows_bf16_part j = z == 0 ? jobs.p[0] : z == 1 ? jobs.p[1] : jobs.p[2];
    const int x0 = z == 0 ? 0 : z == 1 ? xb0 : xb0 + xb1, nxb = z == 0 ? xb0 : z == 1 ? xb1 : (int)gridDim.x - xb0 - xb1;
    const float *__restrict__ x = j.x;
    bf16 *__restrict__ dst = reinterpret_cast<bf16 *>(j.dst);
    for (int64_t r = blockIdx.y; r < j.rows; r += gridDim.y) {
        const float *xr = x + r * j.ldx;
        bf16 *d = dst + r * j.K * split;
        for (int64_t c = (int64_t)(bx - x0) * blockDim.x + threadIdx.x; c < j.K; c += (int64_t)nxb * blockDim.x) {
            put_bf16(d, j.K, split, c, xr[c]);
        }
    }
}

/* ---- the GEMM ----------------------------------------------------------- */

constexpr int BN = 128;     /* output columns per block (GATEUP: 64 gate + 64 up) */
constexpr int BK = 64;      /* K per pipeline stage */
constexpr int PITCH = BK + 8; /* smem row pitch in bf16: 144 bytes, conflict-free ldmatrix */
constexpr int THREADS = 256; /* 8 warps: 2 along M, 4 along N */
constexpr int WARPS_M = 2, WARPS_N = 4;

/* Pipeline depth: 4 stages for the small-row tiles (weight streaming, more
 * bytes in flight), 3 for the big ones (two blocks per SM still fit) and for
 * the split kernels (their stages hold two activation tiles). */
template <int BM, int SPLIT> __host__ __device__ constexpr int gemm_stages() {
    return BM == 32 ? 4 : SPLIT == 2 ? 3 : BM == 64 ? 4 : 3;
}

template <int BM, int SPLIT> constexpr int gemm_smem_bytes() {
    return gemm_stages<BM, SPLIT>() * (SPLIT * BM + BN) * PITCH * 2 > BM * (BN + 4) * 4
               ? gemm_stages<BM, SPLIT>() * (SPLIT * BM + BN) * PITCH * 2
               : BM * (BN + 4) * 4;
}

/* The MMAs of one BK-wide pipeline stage for warp (wm, wn) of a BM-row tile:
 * per 16-wide K chunk ks, the warp's A fragments from `as` (rows PITCH
 * apart; with SPLIT = 2 the lo tile follows BM rows later) and its weight
 * fragments from waddr(row, chunk) (the shared address of 16-byte chunk
 * `chunk` (0..7) of weight row `row` (0..BN-1) of the stage, whatever the
 * layout), each weight fragment multiplied with the hi and then the lo
 * fragment into the same accumulators.  The one MMA order of gemm_kernel and
 * gemm_tma_kernel: their sums are bitwise the same. */
template <int BM, int SPLIT, int WTM, int WTN, int MI, int NI, class WAddr>
__device__ __forceinline__ void mma_stage(float (&acc)[MI][NI][4], const bf16 *as, int wm, int wn, int lane,
                                          WAddr waddr) {
#pragma unroll
    for (int ks = 0; ks < BK / 16; ks++) {
        uint32_t af[MI][4], bfr[NI][2];
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
            ldsm_x4(af[mi][0], af[mi][1], af[mi][2], af[mi][3],
                    as + (wm * WTM + mi * 16 + (lane & 15)) * PITCH + ks * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int nj = 0; nj < NI / 2; nj++)
            ldsm_x4(bfr[2 * nj][0], bfr[2 * nj][1], bfr[2 * nj + 1][0], bfr[2 * nj + 1][1],
                    waddr(wn * WTN + nj * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int ni = 0; ni < NI; ni++) mma16816(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
        if (SPLIT == 2) { /* the lo tile with the same weight fragments */
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
                ldsm_x4(af[mi][0], af[mi][1], af[mi][2], af[mi][3],
                        as + BM * PITCH + (wm * WTM + mi * 16 + (lane & 15)) * PITCH + ks * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int ni = 0; ni < NI; ni++) mma16816(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
        }
    }
}

/* SPLIT = 2: every stage holds the hi and the lo activation tile of the same
 * K range beside one weight tile; each weight fragment feeds two MMAs (hi,
 * then lo, into the same accumulator), so W is read once and K walked once. */
template <int BM, int SPLIT>
__global__ void __launch_bounds__(THREADS, 2) gemm_kernel(const ck_gemm_args a) {
    constexpr int STAGES = gemm_stages<BM, SPLIT>();
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N; /* warp tile */
    constexpr int MI = WTM / 16, NI = WTN / 8;
    constexpr int A_CHUNKS = BM * (BK / 8) / THREADS; /* 16-byte chunks per thread per stage */
    constexpr int W_CHUNKS = BN * (BK / 8) / THREADS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *As = reinterpret_cast<bf16 *>(smem_raw);            /* [STAGES][SPLIT][BM][PITCH] */
    bf16 *Ws = As + STAGES * SPLIT * BM * PITCH;              /* [STAGES][BN][PITCH] */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;

    /* This block's rows: [row0, row0 + rows) of A / the output, and its weights. */
    int64_t nt, row0, rows;
    int e;
    if (!gemm_block_tile(a, BM, BN, nt, row0, rows, e)) return;
    const bf16 *w0 = reinterpret_cast<const bf16 *>(a.mode == CK_GEMM_DENSE ? a.W : a.W0[e]);
    const bf16 *w1 = a.mode == CK_GEMM_GATEUP ? reinterpret_cast<const bf16 *>(a.W1[e]) : nullptr;
    const bf16 *A = reinterpret_cast<const bf16 *>(a.A);
    const int64_t K = a.K;

    /* Source rows of this thread's chunks (NULL = zero fill), fixed over K. */
    const bf16 *a_src[A_CHUNKS];
    int a_dst[A_CHUNKS], a_col[A_CHUNKS];
    gemm_a_chunks<A_CHUNKS, THREADS, BK, PITCH>(a, A, tid, row0, rows, a_src, a_dst, a_col);
    const bf16 *w_src[W_CHUNKS];
    int w_dst[W_CHUNKS], w_col[W_CHUNKS];
#pragma unroll
    for (int i = 0; i < W_CHUNKS; i++) {
        const int c = tid + i * THREADS, r = c / (BK / 8);
        w_col[i] = (c % (BK / 8)) * 8;
        w_dst[i] = r * PITCH + w_col[i];
        int64_t n;
        const bf16 *base;
        if (a.mode == CK_GEMM_GATEUP) { /* rows 0..63 gate, 64..127 up, both of columns j0 + r % 64 */
            n = nt * 64 + (r & 63);
            base = r < 64 ? w0 : w1;
        } else {
            n = nt * BN + r;
            base = w0;
        }
        w_src[i] = n < a.N ? base + n * K : nullptr;
    }

    auto load_stage = [&](int kt, int stage) {
        const int64_t k0 = (int64_t)kt * BK;
        bf16 *ws = Ws + stage * BN * PITCH;
        gemm_a_load<A_CHUNKS, SPLIT>(As + stage * SPLIT * BM * PITCH, BM * PITCH, a_src, a_dst, a_col, k0, K, A);
#pragma unroll
        for (int i = 0; i < W_CHUNKS; i++) {
            const int64_t kc = k0 + w_col[i];
            const bool ok = w_src[i] && kc < K;
            cp_async16(ws + w_dst[i], ok ? w_src[i] + kc : A, ok);
        }
    };

    float acc[MI][NI][4];
    zero_frags(acc);

    cp_ring<STAGES>((int)((K + BK - 1) / BK), load_stage, [&](int, int stage) {
        const bf16 *as = As + stage * SPLIT * BM * PITCH, *ws = Ws + stage * BN * PITCH;
        mma_stage<BM, SPLIT, WTM, WTN>(acc, as, wm, wn, lane,
                                       [ws](int row, int chunk) { return (const void *)(ws + row * PITCH + chunk * 8); });
    });
    cp_async_wait<0>();

    const float *bias = a.bias; /* DENSE only (the grouped modes have none) */
    mma_epilogue<BM, BN, WTM, WTN, THREADS>(a, acc, a.N, SPLIT, row0, rows, nt, wm, wn, lane, tid, smem_raw,
                                            [bias](float v, int64_t n) { return bias && n >= 0 ? v + bias[n] : v; });
}


/* ---- the warp-specialised grouped GEMM for small passes (Hopper: TMA) ---- */
#ifdef CLEF_CUDA_WGMMA
/* gemm_kernel's tiles and MMAs (BM = 32 or 64 rows x BN = 128 columns, the
 * same 8 MMA warps, mma_stage) fed by one more warp: per K stage it issues
 * one 2-D tensor copy of the 128 x 64 weight tile (two 64-row boxes for
 * GATEUP: gate, then up; 128-byte swizzle, out-of-range rows and columns
 * zero-filled by the copy engine) and the cp.async copies of the stage's
 * activation rows, and refills a stage as soon as the 8 MMA warps have
 * released it (full / empty mbarriers).  No block-wide barrier in the K
 * loop: the weights stream at ~3.9 TB/s on the H200 where gemm_kernel's
 * load-by-every-warp pipeline reaches ~3.4 (bench/stream_probe.cu).  Sums
 * bitwise gemm_kernel's (same fragments, same mma_stage order). */
constexpr int TMA_THREADS = THREADS + 32; /* + the loading warp */
constexpr int TMA_W_BYTES = BN * BK * 2;  /* the stage's weight tile: 16 KiB */
constexpr int TMA_SMEM = 110 * 1024;      /* two blocks per SM */

template <int BM, int SPLIT> __host__ __device__ constexpr int tma_stage_bytes() {
    return (TMA_W_BYTES + SPLIT * BM * PITCH * 2 + 1023) / 1024 * 1024; /* tiles stay 1024-byte aligned */
}
template <int BM, int SPLIT> __host__ __device__ constexpr int tma_stages() {
    return (TMA_SMEM - 1024) / tma_stage_bytes<BM, SPLIT>() < 6 ? (TMA_SMEM - 1024) / tma_stage_bytes<BM, SPLIT>() : 6;
}
template <int BM, int SPLIT> constexpr int tma_smem_bytes() {
    return tma_stages<BM, SPLIT>() * tma_stage_bytes<BM, SPLIT>() + 1024; /* + the alignment slack */
}

template <int BM, int SPLIT>
__global__ void __launch_bounds__(TMA_THREADS, 2) gemm_tma_kernel(const ck_gemm_args a) {
#ifdef CLEF_WGMMA_DEVICE
    constexpr int STAGES = tma_stages<BM, SPLIT>(), SB = tma_stage_bytes<BM, SPLIT>();
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N, MI = WTM / 16, NI = WTN / 8;
    static_assert(STAGES >= 2 && BM * (BN + 4) * 4 <= STAGES * SB, "pipeline and epilogue fit");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    __shared__ const bf16 *arow[BM];
    unsigned char *sm = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int64_t nt, row0, rows;
    int e;
    if (!gemm_block_tile(a, BM, BN, nt, row0, rows, e)) return;
    const bf16 *A = reinterpret_cast<const bf16 *>(a.A);
    const int64_t K = a.K;
    const int ktiles = (int)((K + BK - 1) / BK);
    if (tid < BM) { /* the tile's A rows (GATEUP gathers through row_src); NULL past its rows: zero fill */
        int64_t p = row0 + tid;
        if (tid < rows && a.mode == CK_GEMM_GATEUP) p = a.row_src[p];
        arow[tid] = tid < rows ? A + p * a.lda : nullptr;
    }
    if (tid == 0)
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1 + 32); /* the copy's expect_tx arrival + one cp.async arrival per lane */
            mbar_init(&empty[s], WARPS_M * WARPS_N);
        }
    fence_proxy_async();
    __syncthreads();

    if (warp == WARPS_M * WARPS_N) { /* the loading warp */
        const void *m0 = &a.wmaps[e], *m1 = &a.wmaps[a.n_experts + e];
        const int y0 = (int)(a.mode == CK_GEMM_GATEUP ? nt * 64 : nt * BN);
        /* this lane's activation chunks, fixed over K: column col of rows lane / 8 + 4 j (j < RPL), hi
         * (and lo) half; their row pointers in registers (few instructions per copy: the loading warp
         * shares its scheduler with MMA warps) */
        constexpr int RPL = BM / 4;
        const int col = (lane & 7) * 8;
        const bf16 *rp[RPL];
        unsigned vmask = 0;
#pragma unroll
        for (int j = 0; j < RPL; j++) {
            const bf16 *p = arow[(lane >> 3) + 4 * j];
            rp[j] = p ? p + col : A;
            vmask |= p ? 1u << j : 0u;
        }
        for (int kt = 0; kt < ktiles; kt++) {
            const int s = kt % STAGES;
            if (kt >= STAGES) mbar_wait(&empty[s], (uint32_t)((kt / STAGES - 1) & 1));
            unsigned char *st = sm + s * SB;
            if (lane == 0) {
                /* the MMA warps read the stage's last weights with ldmatrix (generic proxy) and the
                 * copy engine overwrites them (async proxy): the empty barrier orders the two only
                 * with a proxy fence between them, here in the issuing thread.  Without it a warp
                 * could read a weight tile that the next copy was already overwriting
                 * (bench/expert_gemm: a few columns of one warp's 32 rows in one tile of ~2,000 per
                 * down product at 64-row tiles, found on the H200 at 1,000 tokens; 300-token cost <= 1%) */
                fence_proxy_async();
                mbar_arrive_expect_tx(&full[s], TMA_W_BYTES);
                if (a.mode == CK_GEMM_GATEUP) {
                    tma_load_2d(st, m0, kt * BK, y0, &full[s]);
                    tma_load_2d(st + TMA_W_BYTES / 2, m1, kt * BK, y0, &full[s]);
                } else {
                    tma_load_2d(st, m0, kt * BK, y0, &full[s]);
                }
            }
            bf16 *as = reinterpret_cast<bf16 *>(st + TMA_W_BYTES);
            const int64_t k0 = (int64_t)kt * BK;
            const bool kin = k0 + col < K;
#pragma unroll
            for (int j = 0; j < RPL; j++) {
                const bool ok = kin && ((vmask >> j) & 1u);
#pragma unroll
                for (int h = 0; h < SPLIT; h++)
                    cp_async16(as + (h * BM + (lane >> 3) + 4 * j) * PITCH + col, ok ? rp[j] + h * K + k0 : A, ok);
            }
            mbar_cp_async_arrive(&full[s]);
        }
        /* no commit group is open, so this waits for nothing: the consumers' full barriers, not this
         * warp, account for its copies (it may leave with copies in flight; the block lives on) */
        cp_async_wait<0>();
        return;
    }

    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    float acc[MI][NI][4];
    zero_frags(acc);
    for (int kt = 0; kt < ktiles; kt++) {
        const int s = kt % STAGES;
        mbar_wait(&full[s], (uint32_t)((kt / STAGES) & 1));
        const unsigned char *st = sm + s * SB;
        mma_stage<BM, SPLIT, WTM, WTN>(acc, reinterpret_cast<const bf16 *>(st + TMA_W_BYTES), wm, wn, lane,
                                       [st](int row, int chunk) { return (const void *)(st + sw128(row, chunk)); });
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
    }
    mma_epilogue<BM, BN, WTM, WTN, THREADS>(a, acc, a.N, SPLIT, row0, rows, nt, wm, wn, lane, tid, sm,
                                            [](float v, int64_t) { return v; }, true);
#endif
}
#endif /* CLEF_CUDA_WGMMA */

/* ---- f32 fallback GEMM and bias ----------------------------------------- */

__global__ void gemm_f32_kernel(const float *__restrict__ x, int64_t M, int64_t K, const float *__restrict__ W,
                                int64_t N, const float *__restrict__ bias, float *__restrict__ Y) {
    const int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (n >= N || r >= M) return;
    const float *xr = x + r * K, *wr = W + n * K;
    float s = 0.0f;
    for (int64_t k = 0; k < K; k++) s = fmaf(xr[k], wr[k], s);
    Y[r * N + n] = bias ? s + bias[n] : s;
}

__global__ void add_bias_kernel(float *Y, int64_t M, int64_t N, int64_t ldy, const float *bias) {
    const int64_t total = M * N;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / N, c = i - r * N;
        Y[r * ldy + c] += bias[c];
    }
}

/* y[r, n] = D[2r, n] + D[2r + 1, n] (+ bias[n]): the hi and lo halves of a
 * split product computed as 2M stacked rows (float4 over n; N % 4 == 0). */
__global__ void split_sum_kernel(const float4 *__restrict__ D, int64_t M, int64_t N4, const float4 *__restrict__ bias,
                                 float4 *__restrict__ y) {
    const int64_t total = M * N4;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / N4, c = i - r * N4;
        const float4 h = D[2 * r * N4 + c], l = D[(2 * r + 1) * N4 + c];
        float4 v = make_float4(__fadd_rn(h.x, l.x), __fadd_rn(h.y, l.y), __fadd_rn(h.z, l.z), __fadd_rn(h.w, l.w));
        if (bias) {
            const float4 b = bias[c];
            v = make_float4(__fadd_rn(v.x, b.x), __fadd_rn(v.y, b.y), __fadd_rn(v.z, b.z), __fadd_rn(v.w, b.w));
        }
        y[i] = v;
    }
}

/* ---- MoE permutation ---------------------------------------------------- */

__global__ void moe_count_kernel(const int32_t *__restrict__ idx, int64_t TK, int E, int32_t *cnt) {
    extern __shared__ int32_t hist[];
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    __syncthreads();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < TK; i += (int64_t)gridDim.x * blockDim.x) {
        const int e = idx[i];
        if (e >= 0 && e < E) atomicAdd(&hist[e], 1); /* integer counts: the total is order-free */
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        if (hist[e]) atomicAdd(&cnt[e], hist[e]);
}

constexpr int PLACE_THREADS = 256, PLACE_PER_THREAD = 8;
/* SELF blocks of passes of up to PLACE_STAGE entries keep them in shared memory (32 KiB): read from
 * global memory once, by independent loads, instead of once for the counts and once for the compaction */
constexpr int PLACE_STAGE = 8192;

/* Sum of v over the block (every thread gets it); sm: >= 32 ints. */
__device__ int block_sum(int v, int *sm) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sm[warp] = v;
    __syncthreads();
    int t = 0;
    for (int w = 0; w < nw; w++) t += sm[w];
    return t;
}

/* One block per expert: its offset and tiles from the counts, then a stable
 * compaction of its entries in entry order (= token order).  SELF: every
 * block first counts all entries itself (a histogram in shared memory, E
 * ints), for small passes where the separate count kernel and the zeroing
 * of cnt are most of the plan's time; the counts are exact either way.
 * STAGE (SELF, TK <= PLACE_STAGE): the entries are copied to shared memory
 * as they are counted and compacted from there (the same integers). */
template <bool SELF, bool STAGE>
__global__ void __launch_bounds__(PLACE_THREADS) moe_place_kernel(const int32_t *__restrict__ idx, int64_t TK, int k,
                                                                  int E, int BM, const int32_t *__restrict__ cnt_in,
                                                                  int32_t *expert_end, int32_t *row_tok,
                                                                  int32_t *slot_pos, int32_t *tile_expert,
                                                                  int32_t *tile_row0, int32_t *n_tiles) {
    __shared__ int sm[32];
    __shared__ int warp_tot[PLACE_THREADS / 32];
    extern __shared__ int32_t hist[]; /* SELF: [E]; STAGE: then the TK entries */
    static_assert(SELF || !STAGE, "staged entries come with the block's own counts");
    int32_t *sidx = hist + E;
    const int32_t *src = STAGE ? sidx : idx; /* where the compaction reads the entries */
    const int e = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (SELF) {
        for (int j = tid; j < E; j += blockDim.x) hist[j] = 0;
        __syncthreads();
        constexpr int U = 4; /* loads in flight per thread */
        for (int64_t i0 = tid; i0 < TK; i0 += (int64_t)U * PLACE_THREADS) {
            int x[U];
#pragma unroll
            for (int u = 0; u < U; u++) x[u] = i0 + u * PLACE_THREADS < TK ? idx[i0 + u * PLACE_THREADS] : -1;
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (STAGE && i0 + u * PLACE_THREADS < TK) sidx[i0 + u * PLACE_THREADS] = x[u];
                if (x[u] >= 0 && x[u] < E) atomicAdd(&hist[x[u]], 1); /* integer counts: the total is order-free */
            }
        }
        __syncthreads();
    }
    const int32_t *cnt = SELF ? hist : cnt_in;
    int my_off = 0, my_tiles = 0, all_tiles = 0;
    for (int j = tid; j < E; j += blockDim.x) {
        const int c = cnt[j], t = (c + BM - 1) / BM;
        if (j < e) {
            my_off += c;
            my_tiles += t;
        }
        all_tiles += t;
    }
    const int off = block_sum(my_off, sm), tstart = block_sum(my_tiles, sm), total = block_sum(all_tiles, sm);
    const int ce = cnt[e], nt = (ce + BM - 1) / BM;
    if (tid == 0) {
        expert_end[e] = off + ce;
        if (e == 0) *n_tiles = total;
    }
    for (int t = tid; t < nt; t += blockDim.x) {
        tile_expert[tstart + t] = e;
        tile_row0[tstart + t] = off + t * BM;
    }
    int base = off;
    for (int64_t c0 = 0; c0 < TK && base - off < ce; c0 += (int64_t)PLACE_THREADS * PLACE_PER_THREAD) {
        const int64_t i0 = c0 + (int64_t)tid * PLACE_PER_THREAD;
        int flags = 0, n = 0;
#pragma unroll
        for (int u = 0; u < PLACE_PER_THREAD; u++) {
            const int64_t i = i0 + u;
            if (i < TK && src[i] == e) {
                flags |= 1 << u;
                n++;
            }
        }
        /* exclusive prefix of n over the block, in thread order */
        int incl = n;
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        __syncthreads();
        if (lane == 31) warp_tot[warp] = incl;
        __syncthreads();
        int before = 0, all = 0;
        for (int w = 0; w < PLACE_THREADS / 32; w++) {
            if (w < warp) before += warp_tot[w];
            all += warp_tot[w];
        }
        int pos = base + before + incl - n;
#pragma unroll
        for (int u = 0; u < PLACE_PER_THREAD; u++)
            if (flags & (1 << u)) {
                const int64_t i = i0 + u;
                row_tok[pos] = (int32_t)(i / k);
                slot_pos[i] = pos;
                pos++;
            }
        base += all;
    }
}

template <int KT> /* k at compile time (moe_combine4), or 0 */
__global__ void moe_combine_kernel(const float *__restrict__ yp, const int32_t *__restrict__ idx,
                                   const float *__restrict__ w, const int32_t *__restrict__ slot_pos, int k, int64_t H,
                                   float *__restrict__ y, int vec) {
    __shared__ int64_t row[64];
    __shared__ float ws[64];
    __shared__ int ex[64];
    const int64_t t = blockIdx.x;
    moe_rank_rows(idx, w, slot_pos, t, k, H, row, ws, ex);
    /* product then sum, as the CPU backend; float4 when rows allow it */
    if (vec) {
        for (int64_t h = 4 * (int64_t)threadIdx.x; h < H; h += 4 * (int64_t)blockDim.x)
            *reinterpret_cast<float4 *>(y + t * H + h) = moe_combine4<KT>(yp, row, ws, k, h);
        return;
    }
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < k; i++) {
            const float term = __fmul_rn(yp[row[i] + h], ws[i]);
            acc = i == 0 ? term : __fadd_rn(acc, term);
        }
        y[t * H + h] = acc;
    }
}

/* ---- router ------------------------------------------------------------- */

constexpr int ROUTER_WARPS = 4;

/* The warp's best (p, expert) from each lane's (bv, be) (be == E: none): larger p wins, ties the lower
 * expert; every lane gets it.  (A macro, not a function: the kernels keep their PTX as written inline.) */
#define WARP_ARGMAX(bv, be, E)                                                                                      \
    for (int o = 16; o; o >>= 1) {                                                                                  \
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);                                                       \
        const int oe = __shfl_xor_sync(0xffffffffu, be, o);                                                         \
        if (oe != E && (be == E || ov > bv || (ov == bv && oe < be))) {                                             \
            bv = ov;                                                                                                \
            be = oe;                                                                                                \
        }                                                                                                           \
    }

__global__ void router_kernel(const float *__restrict__ logits, int64_t T, int E, int k, int norm, int32_t *idx,
                              float *wout) {
    extern __shared__ float rp[]; /* [ROUTER_WARPS][E] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t t = (int64_t)blockIdx.x * ROUTER_WARPS + warp;
    if (t >= T) return;
    float *p = rp + warp * E;
    const float *l = logits + t * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double s = 0.0;
    for (int e = lane; e < E; e += 32) {
        p[e] = expf(l[e] - mx);
        s += p[e];
    }
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float fsum = (float)s;
    for (int e = lane; e < E; e += 32) p[e] = p[e] / fsum;
    __syncwarp();
    float wsel[64];
    int isel[64];
    for (int j = 0; j < k; j++) {
        float bv = -1.0f;
        int be = E;
        for (int e = lane; e < E; e += 32)
            if (p[e] >= 0.0f && (be == E || p[e] > bv)) {
                bv = p[e];
                be = e;
            }
        WARP_ARGMAX(bv, be, E)
        wsel[j] = bv;
        isel[j] = be;
        __syncwarp();
        if (lane == 0 && be < E) p[be] = -1.0f;
        __syncwarp();
    }
    if (lane == 0) {
        float ws = 0.0f;
        if (norm)
            for (int j = 0; j < k; j++) ws += wsel[j];
        for (int j = 0; j < k; j++) {
            idx[t * k + j] = isel[j];
            wout[t * k + j] = norm ? wsel[j] / ws : wsel[j];
        }
    }
}

/* router_kernel for E = 32 PER (PER <= 8) and k <= 32 with every value in registers: lane l holds the
 * probabilities of experts l, l + 32, ..  (v[i]: expert l + 32 i) and lane j the j-th choice, so there is
 * no shared row, no local array and no loop of run-time length.  Bitwise router_kernel: the same max, the
 * same exp, the same f64 sum per lane in ascending expert order then the same shuffle tree, the same
 * division, the same choice per round (in each lane the first valid then strictly larger value in
 * ascending expert order, then across lanes larger p or, tied, the lower expert), the same f32 sum of the
 * chosen weights in choice order and the same normalising division. */
template <int PER>
__global__ void __launch_bounds__(ROUTER_WARPS * 32) router_reg_kernel(const float *__restrict__ logits, int64_t T,
                                                                       int k, int norm, int32_t *idx, float *wout) {
    constexpr int E = 32 * PER;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t t = (int64_t)blockIdx.x * ROUTER_WARPS + warp;
    if (t >= T) return;
    const float *l = logits + t * E;
    float v[PER];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        v[i] = l[lane + 32 * i];
        mx = fmaxf(mx, v[i]);
    }
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        v[i] = expf(v[i] - mx);
        s += v[i];
    }
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float fsum = (float)s;
#pragma unroll
    for (int i = 0; i < PER; i++) v[i] = v[i] / fsum;
    float mine_w = 0.0f; /* lane j: choice j */
    int mine_e = E;
    for (int j = 0; j < k; j++) {
        float bv = -1.0f;
        int be = E;
#pragma unroll
        for (int i = 0; i < PER; i++)
            if (v[i] >= 0.0f && (be == E || v[i] > bv)) {
                bv = v[i];
                be = lane + 32 * i;
            }
        WARP_ARGMAX(bv, be, E)
        if (lane == j) mine_w = bv, mine_e = be;
        if (be < E && (be & 31) == lane) {
#pragma unroll
            for (int i = 0; i < PER; i++)
                if (i == be >> 5) v[i] = -1.0f;
        }
    }
    float ws = 0.0f;
    if (norm)
        for (int j = 0; j < k; j++) ws += __shfl_sync(0xffffffffu, mine_w, j);
    if (lane < k) {
        idx[t * k + lane] = mine_e;
        wout[t * k + lane] = norm ? mine_w / ws : mine_w;
    }
}

/* ---- gather ------------------------------------------------------------- */

__global__ void gather_kernel(const void *__restrict__ table, int is_f32, int64_t rows, int64_t cols,
                              const int32_t *__restrict__ ids, int64_t n, float *__restrict__ out) {
    const int64_t total = n * cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, c = i - r * cols;
        const int64_t id = ids[r];
        float v = 0.0f;
        if (id >= 0 && id < rows)
            v = is_f32 ? reinterpret_cast<const float *>(table)[id * cols + c]
                       : __bfloat162float(reinterpret_cast<const bf16 *>(table)[id * cols + c]);
        out[i] = v;
    }
}

/* Grid for a grid-stride loop over n elements. */
unsigned grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535LL * 16) b = 65535LL * 16;
    return (unsigned)b;
}

template <int BM, int SPLIT> cudaError_t launch_gemm(const ck_gemm_args *a, cudaStream_t st) {
    constexpr int smem = gemm_smem_bytes<BM, SPLIT>();
    static unsigned done = 0; /* devices whose limit is raised */
    cudaError_t e = allow_smem(gemm_kernel<BM, SPLIT>, smem, &done);
    if (e != cudaSuccess) return e;
    unsigned blocks;
    e = gemm_grid(a->mode, a->mode == CK_GEMM_DENSE ? (a->M + BM - 1) / BM : a->max_tiles, a->N, BN, &blocks);
    if (e != cudaSuccess || !blocks) return e;
    gemm_kernel<BM, SPLIT><<<blocks, THREADS, smem, st>>>(*a);
    return cudaGetLastError();
}

#ifdef CLEF_CUDA_WGMMA
template <int BM, int SPLIT> cudaError_t launch_gemm_tma(const ck_gemm_args *a, cudaStream_t st) {
    constexpr int smem = tma_smem_bytes<BM, SPLIT>();
    static unsigned done = 0;
    cudaError_t e = allow_smem(gemm_tma_kernel<BM, SPLIT>, smem, &done);
    if (e != cudaSuccess) return e;
    unsigned blocks;
    e = gemm_grid(a->mode, a->max_tiles, a->N, BN, &blocks);
    if (e != cudaSuccess || !blocks) return e;
    gemm_tma_kernel<BM, SPLIT><<<blocks, TMA_THREADS, smem, st>>>(*a);
    return cudaGetLastError();
}
#endif

} /* namespace */

extern "C" {

cudaError_t ck_rows_to_bf16(const float *x, int64_t rows, int64_t K, int64_t ldx, uint16_t *dst, int split,
                            cudaStream_t st) {
    if (rows <= 0 || K <= 0) return cudaSuccess;
    const int64_t bx = (K + 255) / 256;
    dim3 grid((unsigned)(bx < 64 ? bx : 64), (unsigned)(rows < 65535 ? rows : 65535));
    rows_to_bf16_kernel<<<grid, 256, 0, st>>>(x, rows, K, ldx, reinterpret_cast<bf16 *>(dst), split);
    return cudaGetLastError();
}

cudaError_t ck_rows_to_bf16_multi(const ck_rows_bf16_job *jobs, int n, int split, cudaStream_t st) {
    if (n < 1 || n > 3) return cudaErrorInvalidValue;
    int64_t rows = 0;
    int xb[3] = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        const ck_rows_bf16_part *p = &jobs->p[i];
        if (p->rows <= 0 || p->K <= 0) continue;
        const int64_t b = (p->K + 255) / 256;
        xb[i] = (int)(b < 64 ? b : 64);
        if (p->rows > rows) rows = p->rows;
    }
    if (rows <= 0) return cudaSuccess;
    dim3 grid((unsigned)(xb[0] + xb[1] + xb[2]), (unsigned)(rows < 65535 ? rows : 65535));
    rows_to_bf16_multi_kernel<<<grid, 256, 0, st>>>(*jobs, xb[0], xb[1], split);
    return cudaGetLastError();
}


cudaError_t ck_gemm(const ck_gemm_args *a, cudaStream_t st) {
    if (a->big < 0 || a->big > 2) return cudaErrorInvalidValue;
    if (a->split == 2)
        return a->big == 2 ? launch_gemm<32, 2>(a, st) : a->big ? launch_gemm<128, 2>(a, st) : launch_gemm<64, 2>(a, st);
    if (a->split != 1) return cudaErrorInvalidValue;
    return a->big == 2 ? launch_gemm<32, 1>(a, st) : a->big ? launch_gemm<128, 1>(a, st) : launch_gemm<64, 1>(a, st);
}

cudaError_t ck_tmap_bf16(ck_tmap *m, const void *base, int64_t rows, int64_t cols, int box_rows) {
#ifndef CLEF_CUDA_WGMMA
    (void)m, (void)base, (void)rows, (void)cols, (void)box_rows;
    return cudaErrorNotSupported;
#else
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr; /* the same value from any thread */
    if (!encode) {
        cudaDriverEntryPointQueryResult q;
        void *fn = nullptr;
        cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
        if (e != cudaSuccess) return e;
        if (q != cudaDriverEntryPointSuccess || !fn) return cudaErrorNotSupported;
        encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    }
    if (rows < 1 || cols < 8 || cols % 8 || ((uintptr_t)base & 15) || rows > 0x7fffffffLL || cols > 0x7fffffffLL ||
        box_rows < 1 || box_rows > 256)
        return cudaErrorInvalidValue;
    static_assert(sizeof(ck_tmap) == sizeof(CUtensorMap), "ck_tmap holds a CUtensorMap");
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)cols * 2};
    const cuuint32_t box[2] = {(cuuint32_t)BK, (cuuint32_t)box_rows}, step[2] = {1, 1};
    const CUresult r = encode(reinterpret_cast<CUtensorMap *>(m), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                              const_cast<void *>(base), dims, strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
#endif
}

cudaError_t ck_gemm_tma(const ck_gemm_args *a, cudaStream_t st) {
#ifndef CLEF_CUDA_WGMMA
    (void)a, (void)st;
    return cudaErrorNotSupported;
#else
    if ((a->mode != CK_GEMM_GATEUP && a->mode != CK_GEMM_DOWN) || !a->wmaps || a->n_experts < 1 || a->K < 8 ||
        a->K % 8 || a->lda % 8 || ((uintptr_t)a->A & 15) || (a->big != 0 && a->big != 2))
        return cudaErrorInvalidValue;
    if (a->split == 2) return a->big == 2 ? launch_gemm_tma<32, 2>(a, st) : launch_gemm_tma<64, 2>(a, st);
    if (a->split != 1) return cudaErrorInvalidValue;
    return a->big == 2 ? launch_gemm_tma<32, 1>(a, st) : launch_gemm_tma<64, 1>(a, st);
#endif
}

cudaError_t ck_gemm_f32(const float *x, int64_t M, int64_t K, const float *W, int64_t N, const float *bias, float *Y,
                        cudaStream_t st) {
    if (M <= 0 || N <= 0) return cudaSuccess;
    /* one block row per token: launches of at most 65535 rows (the grid's y limit); rows are independent */
    for (int64_t m0 = 0; m0 < M; m0 += 65535) {
        const int64_t m = M - m0 < 65535 ? M - m0 : 65535;
        dim3 grid((unsigned)((N + 127) / 128), (unsigned)m);
        gemm_f32_kernel<<<grid, 128, 0, st>>>(x + m0 * K, m, K, W, N, bias, Y + m0 * N);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t ck_add_bias(float *Y, int64_t M, int64_t N, int64_t ldy, const float *bias, cudaStream_t st) {
    if (M <= 0 || N <= 0) return cudaSuccess;
    add_bias_kernel<<<grid_for(M * N, 256), 256, 0, st>>>(Y, M, N, ldy, bias);
    return cudaGetLastError();
}

cudaError_t ck_split_sum(const float *D, int64_t M, int64_t N, const float *bias, float *y, cudaStream_t st) {
    if (M <= 0 || N <= 0) return cudaSuccess;
    if (N % 4 || ((uintptr_t)D & 15) || ((uintptr_t)y & 15) || ((uintptr_t)bias & 15)) return cudaErrorInvalidValue;
    split_sum_kernel<<<grid_for(M * (N / 4), 256), 256, 0, st>>>(reinterpret_cast<const float4 *>(D), M, N / 4,
                                                                 reinterpret_cast<const float4 *>(bias),
                                                                 reinterpret_cast<float4 *>(y));
    return cudaGetLastError();
}

cudaError_t ck_moe_plan(const int32_t *idx, int64_t T, int k, int E, int BM, int32_t *cnt, int32_t *expert_end,
                        int32_t *row_tok, int32_t *slot_pos, int32_t *tile_expert, int32_t *tile_row0,
                        int32_t *n_tiles, cudaStream_t st) {
    const int64_t TK = T * k;
    if (TK <= PLACE_STAGE && E <= 512) { /* one launch, the entries staged in shared memory */
        moe_place_kernel<true, true><<<(unsigned)E, PLACE_THREADS, (size_t)(E + TK) * sizeof(int32_t), st>>>(
            idx, TK, k, E, BM, cnt, expert_end, row_tok, slot_pos, tile_expert, tile_row0, n_tiles);
        return cudaGetLastError();
    }
    if (TK <= 16384 && E <= 512) { /* one launch: each block counts for itself (E x TK reads in all) */
        moe_place_kernel<true, false><<<(unsigned)E, PLACE_THREADS, (size_t)E * sizeof(int32_t), st>>>(
            idx, TK, k, E, BM, cnt, expert_end, row_tok, slot_pos, tile_expert, tile_row0, n_tiles);
        return cudaGetLastError();
    }
    cudaError_t e = cudaMemsetAsync(cnt, 0, (size_t)E * sizeof(int32_t), st);
    if (e != cudaSuccess) return e;
    if (TK > 0) {
        int64_t blocks = (TK + 1023) / 1024;
        if (blocks > 4096) blocks = 4096;
        moe_count_kernel<<<(unsigned)blocks, 256, (size_t)E * sizeof(int32_t), st>>>(idx, TK, E, cnt);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    moe_place_kernel<false, false><<<(unsigned)E, PLACE_THREADS, 0, st>>>(idx, TK, k, E, BM, cnt, expert_end, row_tok, slot_pos,
                                                            tile_expert, tile_row0, n_tiles);
    return cudaGetLastError();
}

cudaError_t ck_moe_combine(const float *yp, const int32_t *idx, const float *w, const int32_t *slot_pos, int64_t T,
                           int k, int64_t H, float *y, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    if (T > 0x7fffffffLL || k > 64) return cudaErrorInvalidConfiguration;
    const int vec = (H & 3) == 0 && ((uintptr_t)yp & 15) == 0 && ((uintptr_t)y & 15) == 0;
    if (k == 8)
        moe_combine_kernel<8><<<(unsigned)T, 256, 0, st>>>(yp, idx, w, slot_pos, k, H, y, vec);
    else
        moe_combine_kernel<0><<<(unsigned)T, 256, 0, st>>>(yp, idx, w, slot_pos, k, H, y, vec);
    return cudaGetLastError();
}

cudaError_t ck_router_topk(const float *logits, int64_t T, int64_t E, int64_t k, int norm, int32_t *idx, float *w,
                           cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    if (k > 64 || E > 8192) return cudaErrorInvalidConfiguration;
    const unsigned blocks = (unsigned)((T + ROUTER_WARPS - 1) / ROUTER_WARPS);
    if (E % 32 == 0 && E <= 256 && k <= 32) { /* the registers-only form (the thinker's 128 experts, top 8) */
        switch (E / 32) {
#define ROUTER_REG(P) \
    case P: router_reg_kernel<P><<<blocks, ROUTER_WARPS * 32, 0, st>>>(logits, T, (int)k, norm, idx, w); break;
            ROUTER_REG(1) ROUTER_REG(2) ROUTER_REG(3) ROUTER_REG(4) ROUTER_REG(5) ROUTER_REG(6) ROUTER_REG(7)
            ROUTER_REG(8)
#undef ROUTER_REG
        }
        return cudaGetLastError();
    }
    const size_t smem = (size_t)ROUTER_WARPS * (size_t)E * sizeof(float);
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(router_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    router_kernel<<<blocks, ROUTER_WARPS * 32, smem, st>>>(
        logits, T, (int)E, (int)k, norm, idx, w);
    return cudaGetLastError();
}

cudaError_t ck_gather(const void *table, int is_f32, int64_t rows, int64_t cols, const int32_t *ids, int64_t n,
                      float *out, cudaStream_t st) {
    if (n <= 0 || cols <= 0) return cudaSuccess;
    gather_kernel<<<grid_for(n * cols, 256), 256, 0, st>>>(table, is_f32, rows, cols, ids, n, out);
    return cudaGetLastError();
}

} /* extern "C" */
