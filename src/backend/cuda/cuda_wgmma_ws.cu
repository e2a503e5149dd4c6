/* cuda_wgmma_ws.cu — the grouped BF16 expert GEMMs (GATEUP with SwiGLU, DOWN)
 * for large passes: a persistent, warp-specialised Hopper kernel
 * (wgmma.mma_async m64n256k16, sm_90a), ck_gemm_wgmma_ws.
 *
 * Same contract and bitwise the same results as ck_gemm_wgmma / ck_gemm
 * (cuda_kernels.h): the tile plan of ck_moe_plan with BM = 128, [hi | lo]
 * activation rows when split = 2, bf16 weights [N, K] row-major.  Every
 * output element is accumulated in f32 over K in ascending 16-wide chunks,
 * one wgmma k16 per chunk into the same accumulators (hi then lo when
 * split = 2), never split over K, then wg_epilogue (SwiGLU by silu_mul,
 * bf16 rounding as put_bf16): its value depends on its A row and weight row
 * only, never on which CTA computed its tile or what ran beside it.
 *
 * Shape.  A CTA of 384 threads lives on each SM (grid = min(SMs, tiles)) and
 * walks the output tiles t = blockIdx.x, blockIdx.x + gridDim.x, ... of the
 * pass (a static schedule: tile t is m-tile t / C, column tile t % C, C =
 * gemm_col_tiles(mode, N, 256); the m-tiles are the plan's, so CTAs that run
 * at the same time share an expert's weights and an m-tile's rows in L2).
 * Output tiles are 128 rows x 256 columns (GATEUP: 128 gate + 128 up columns
 * of the same intermediate indices); K is walked in 64-wide stages through a
 * ring of STAGES shared-memory stages (4 at split 1, 3 at split 2), each
 *   [ weight tile: 256 rows x 128 bytes | A hi: 128 rows x 128 bytes | A lo ]
 * 128-byte swizzled (cuda_wgmma.cuh sw128), 1024-byte aligned.
 *
 * Roles (one branch each, setmaxnreg):
 *   warpgroup 0, the producer (56 registers): per stage, thread 0 arms the
 *     stage's full barrier with the weight tile's 32 KiB and issues its
 *     tensor copies from the per-expert maps of ck_gemm_args.wmaps (GATEUP:
 *     gate rows nt 128 + [0, 64), + [64, 128), then up likewise, 64-row boxes;
 *     DOWN: rows nt 256 + [0, 128), + [128, 256), 128-row boxes; rows past
 *     N and columns past K zero-filled by the copy engine); all 128 threads
 *     copy the stage's activation rows with cp.async (8 row pointers per
 *     thread kept in registers, GATEUP gathered through row_src, rows past
 *     the tile zero-filled) and arrive on the full barrier when their copies
 *     land (cp.async.mbarrier.arrive.noinc).
 *   warpgroups 1 and 2, the consumers (224 registers): warpgroup c owns tile
 *     rows 64 c .. 64 c + 63 and all 256 columns (128 f32 accumulators per
 *     thread); per stage it waits on the full barrier, issues the 4 (x split)
 *     m64n256k16 MMAs as one wgmma group, waits until only that group is in
 *     flight and then releases the previous stage (one arrival per warp on
 *     its empty barrier).  After a tile's last stage it writes the tile
 *     (wg_epilogue) straight from the accumulators while the producer is
 *     already filling the next tile's stages.
 * Barriers per stage s: full[s] (count 1 + 128: the armed arrival plus one
 * cp.async arrival per producer thread; the copy engine's bytes complete
 * it), empty[s] (count 8: one per consumer warp).  Stage use u of a ring
 * slot waits full parity u & 1 (consumers) and empty parity (u & 1) ^ 1
 * (producer: a fresh barrier's parity 1 counts as complete, so the first
 * use of each slot does not wait).  Proxies: the consumers read the stages
 * with wgmma (async proxy) while the activation rows are written by cp.async
 * (generic proxy): each consumer thread fences (fence.proxy.async) after its
 * full-barrier wait, each producer thread before its copies into a stage
 * that the MMAs released.
 *
 * A variant in CTA pairs (CK_WS_PAIRS: two CTAs of a cluster share each weight tile by TMA multicast)
 * is described at the kernel; it is correct but was slower on the H200 (docs/BENCHMARKS.md).
 *
 * Built only when the CUDA architectures include sm_90a (CLEF_CUDA_WGMMA);
 * elsewhere ck_gemm_wgmma_ws reports cudaErrorNotSupported. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

/* CLEF_WS_WATCHDOG (default 1): a barrier wait that spins past ~2^26 failed tries traps, so a deadlock
 * shows as a launch error instead of a hung device (the builds measured and tested on the H200 had it
 * on; only a failed try counts, so it costs nothing while the pipeline flows); 0 = mbar_wait's plain
 * two-instruction loop. */
#ifndef CLEF_WS_WATCHDOG
#define CLEF_WS_WATCHDOG 1
#endif

typedef __nv_bfloat16 bf16;

namespace {

constexpr int WS_BM = 128, WS_BN = 256, WS_BK = 64;
constexpr int WS_THREADS = 384;                       /* producer warpgroup + 2 consumer warpgroups */
constexpr int WS_ROW = WS_BK * 2;                     /* bytes of one stage row: one 128-byte swizzle row */
constexpr int WS_W_BYTES = WS_BN * WS_ROW;            /* the stage's weight tile: 32 KiB */
constexpr int WS_A_BYTES = WS_BM * WS_ROW;            /* one activation tile (hi or lo): 16 KiB */
constexpr int WS_PRODUCER_REGS = 56, WS_CONSUMER_REGS = 224; /* 128 x 56 + 256 x 224 <= 64 Ki registers */
static_assert(WS_ROW == WG_ROW_BYTES, "one stage row is one swizzle row (cuda_wgmma.cuh)");

template <int SPLIT> __host__ __device__ constexpr int ws_stage_bytes() { return WS_W_BYTES + SPLIT * WS_A_BYTES; }
template <int SPLIT> __host__ __device__ constexpr int ws_stages() { return SPLIT == 1 ? 4 : 3; }
template <int SPLIT> constexpr int ws_smem_bytes() {
    return ws_stages<SPLIT>() * ws_stage_bytes<SPLIT>() + 1024; /* + the alignment slack */
}
static_assert(ws_smem_bytes<1>() <= 227 * 1024 && ws_smem_bytes<2>() <= 227 * 1024, "one CTA per SM fits");

#ifdef CLEF_WGMMA_DEVICE
/* mbar_wait (cuda_wgmma.cuh), or with CLEF_WS_WATCHDOG a bounded one */
__device__ __forceinline__ void ws_wait(uint64_t *b, uint32_t parity) {
#if CLEF_WS_WATCHDOG
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(b);
    for (uint32_t n = 0;; n++) {
        uint32_t done;
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(addr), "r"(parity)
                     : "memory");
        if (done) break;
        if (n > (1u << 26)) __trap();
    }
    __syncwarp(); /* the lanes together again before the next .aligned instruction */
#else
    mbar_wait(b, parity);
#endif
}

/* CTA pairs (PAIR kernels, clusters of 2 along x). */
__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t cluster_id() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t cluster_count() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%nclusterid.x;\n" : "=r"(r));
    return r;
}
/* Every thread of both CTAs of the cluster: arrive (release), then wait (acquire). */
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
/* One arrival on the mbarrier at the same shared offset as b in CTA `rank` of the cluster. */
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t *b, uint32_t rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(b)), "r"(rank));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
/* mbar_wait with cluster-scope acquire (the empty barriers that the partner CTA's consumers arrive on). */
__device__ __forceinline__ void ws_wait_cluster(uint64_t *b, uint32_t parity) {
    const uint32_t addr = smem_addr(b);
#if CLEF_WS_WATCHDOG
    for (uint32_t n = 0;; n++) {
        uint32_t done;
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(addr), "r"(parity)
                     : "memory");
        if (done) break;
        if (n > (1u << 26)) __trap();
    }
    __syncwarp();
#else
    asm volatile("{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT;\n}\n" ::"r"(addr),
                 "r"(parity)
                 : "memory");
#endif
}
/* tma_load_2d into both CTAs of the pair: the box lands at dst's offset in each, its bytes completing
 * on the mbarrier at b's offset in each. */
__device__ __forceinline__ void tma_load_2d_pair(void *dst, const void *map, int x, int y, uint64_t *b) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
                 "[%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_addr(dst)),
                 "l"(map), "r"(x), "r"(y), "r"(smem_addr(b)), "h"((uint16_t)3)
                 : "memory");
}
#endif

/* The persistent warp-specialised kernel (see the file comment).  CFENCE = false leaves out the consumers'
 * proxy fence (bench/expert_gemm measures what it costs; the backend always fences).
 *
 * PAIR: launched in clusters of two CTAs (x), which walk the output tiles in pairs: pair q (q = cluster id,
 * + cluster count, ...) is m-tiles 2 (q / C), 2 (q / C) + 1 (the CTA of rank r takes the second + r; past
 * the plan's last m-tile a CTA runs a tile of no rows) at column tile q % C.  When both m-tiles are of one
 * expert (the common case) they need the same weight tile: each CTA copies half of it (GATEUP: rank 0 the
 * gate rows, rank 1 the up rows; DOWN: rank r rows 128 r ..) into both CTAs' stages at once (TMA
 * multicast), halving the weight traffic from L2; else each CTA copies its own whole tile.  Either way a
 * stage of either CTA may be written by both producers, so the consumers release a stage in both CTAs
 * (empty barriers count 16: the 8 consumer warps of each) and the producers wait on their own empty
 * barrier with cluster scope; the pair starts and ends with a cluster barrier (no CTA leaves while its
 * partner may still arrive on its barriers).  Each output element is still one CTA's sum over its own
 * stages in the same order: bitwise the single-CTA kernel. */
template <int SPLIT, bool CFENCE = true, bool PAIR = false>
__global__ void __launch_bounds__(WS_THREADS, 1) wgmma_ws_kernel(const ck_gemm_args a) {
#ifdef CLEF_WGMMA_DEVICE
    constexpr int STAGES = ws_stages<SPLIT>(), SB = ws_stage_bytes<SPLIT>();
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    unsigned char *sm = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const bool gateup = a.mode == CK_GEMM_GATEUP;
    const int64_t ncol = gemm_col_tiles(a.mode, a.N, WS_BN), n_mt = *a.n_tiles;
    /* the work items this CTA walks: output tiles, or with PAIR tile pairs (see above) */
    const uint32_t rank = PAIR ? cluster_rank() : 0u;
    const int64_t total = PAIR ? (n_mt + 1) / 2 * ncol : n_mt * ncol;
    const int64_t first = PAIR ? (int64_t)cluster_id() : (int64_t)blockIdx.x;
    const int64_t step = PAIR ? (int64_t)cluster_count() : (int64_t)gridDim.x;
    const int64_t K = a.K;
    const int ktiles = (int)(K / WS_BK);
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1 + 128);
            mbar_init(&empty[s], PAIR ? 16 : 8);
        }
    }
    fence_proxy_async(); /* the barriers' initialisation visible to the copy engine */
    if (PAIR) {
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        cluster_sync(); /* ... and to the partner CTA */
    } else {
        __syncthreads();
    }
    /* work item w -> its m-tile, column tile, whether the pair shares its weight tile, and the expert whose
     * weights this CTA copies (a pair's row-less partner copies its partner's) */
    auto item = [&](int64_t w, int64_t &mt, int64_t &nt, bool &shared, int &e, int &ew) {
        nt = w % ncol;
        if (PAIR) {
            const int64_t m0 = 2 * (w / ncol);
            const int e0 = a.tile_expert[m0], e1 = m0 + 1 < n_mt ? a.tile_expert[m0 + 1] : e0;
            mt = m0 + rank;
            shared = e0 == e1;
            e = rank ? e1 : e0;
        } else {
            mt = w / ncol;
            shared = false;
            e = a.tile_expert[mt];
        }
        ew = e;
    };
    /* rows of m-tile mt (0 past the plan: a pair's row-less partner) */
    auto tile_rows = [&](int64_t mt, int e, int64_t &row0) -> int64_t {
        if (mt >= n_mt) {
            row0 = 0;
            return 0;
        }
        row0 = a.tile_row0[mt];
        const int64_t end = a.expert_end[e];
        return end - row0 < WS_BM ? end - row0 : WS_BM;
    };

    if (warp < 4) { /* ---- producer warpgroup ---- */
        wg_setmaxnreg_dec<WS_PRODUCER_REGS>();
        const bf16 *A = reinterpret_cast<const bf16 *>(a.A);
        /* this thread's activation chunks: 16-byte chunk ch of tile rows rb + 16 j (j < 8) */
        const int ch = tid & 7, rb = tid >> 3;
        const uint32_t a_dst = (uint32_t)WS_W_BYTES + sw128(rb, ch); /* + j 2048 (rows 16 j further) */
        int s = 0;
        uint32_t ph = 0;
        for (int64_t w = first; w < total; w += step) {
            int64_t mt, nt, row0;
            bool shared;
            int e, ew;
            item(w, mt, nt, shared, e, ew);
            const int64_t rows = tile_rows(mt, e, row0);
            const bf16 *rp[8];
            unsigned vmask = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int r = rb + 16 * j;
                if (r < rows) {
                    int64_t p = row0 + r;
                    if (gateup) p = a.row_src[p];
                    rp[j] = A + p * a.lda + ch * 8;
                    vmask |= 1u << j;
                } else {
                    rp[j] = A;
                }
            }
            const void *m0 = &a.wmaps[ew], *m1 = &a.wmaps[a.n_experts + ew];
            const int y0 = (int)(gateup ? nt * (WS_BN / 2) : nt * WS_BN);
            for (int kt = 0; kt < ktiles; kt++) {
                if (PAIR) ws_wait_cluster(&empty[s], ph ^ 1u);
                else ws_wait(&empty[s], ph ^ 1u);
                unsigned char *st = sm + s * SB;
                const int k0 = kt * WS_BK;
                if (PAIR && shared) {
                    if (tid == 0) { /* this CTA's half of the shared weight tile, into both CTAs */
                        mbar_arrive_expect_tx(&full[s], WS_W_BYTES);
                        unsigned char *hb = st + rank * (WS_W_BYTES / 2);
                        if (gateup) {
                            const void *m = rank ? m1 : m0;
                            tma_load_2d_pair(hb, m, k0, y0, &full[s]);
                            tma_load_2d_pair(hb + WS_W_BYTES / 4, m, k0, y0 + 64, &full[s]);
                        } else {
                            tma_load_2d_pair(hb, m0, k0, y0 + 128 * (int)rank, &full[s]);
                        }
                    }
                } else if (tid == 0) {
                    mbar_arrive_expect_tx(&full[s], WS_W_BYTES);
                    if (gateup) {
                        tma_load_2d(st, m0, k0, y0, &full[s]);
                        tma_load_2d(st + WS_W_BYTES / 4, m0, k0, y0 + 64, &full[s]);
                        tma_load_2d(st + WS_W_BYTES / 2, m1, k0, y0, &full[s]);
                        tma_load_2d(st + 3 * WS_W_BYTES / 4, m1, k0, y0 + 64, &full[s]);
                    } else {
                        tma_load_2d(st, m0, k0, y0, &full[s]);
                        tma_load_2d(st + WS_W_BYTES / 2, m0, k0, y0 + 128, &full[s]);
                    }
                }
                /* the stage's last MMAs read it through the async proxy; these copies write it through
                 * the generic one */
                fence_proxy_async();
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const bool ok = (vmask >> j) & 1u;
#pragma unroll
                    for (int h = 0; h < SPLIT; h++)
                        cp_async16(st + a_dst + h * WS_A_BYTES + j * 2048, ok ? rp[j] + h * K + k0 : A, ok);
                }
                mbar_cp_async_arrive(&full[s]);
                if (++s == STAGES) s = 0, ph ^= 1u;
            }
        }
        /* copies may still be in flight: the consumers' full barriers account for them */
    } else { /* ---- consumer warpgroups ---- */
        wg_setmaxnreg_inc<WS_CONSUMER_REGS>();
        const int cw = warp - 4, cwg = cw >> 2, g = lane >> 2, t4 = lane & 3;
        const uint32_t sbase = smem_addr(sm);
        float acc[WS_BN / 2];
        int s = 0, sprev = 0;
        uint32_t ph = 0;
        for (int64_t w = first; w < total; w += step) {
            int64_t mt, nt, row0;
            bool shared;
            int e, ew;
            item(w, mt, nt, shared, e, ew);
#pragma unroll
            for (int i = 0; i < WS_BN / 2; i++) acc[i] = 0.0f;
            for (int kt = 0; kt < ktiles; kt++) {
                ws_wait(&full[s], ph);
                if (CFENCE) fence_proxy_async(); /* cp.async's generic-proxy rows before the wgmma reads */
                const uint32_t st = sbase + (uint32_t)(s * SB);
                const uint32_t a_t = st + (uint32_t)(WS_W_BYTES + cwg * 64 * WS_ROW);
                acc_fence(acc);
                wg_fence();
#pragma unroll
                for (int ks = 0; ks < WS_BK / 16; ks++) { /* 16-wide K chunks: +32 bytes inside the swizzled rows */
                    const uint64_t db = wg_desc(st + ks * 32);
                    wgmma_k16<WS_BN>(acc, wg_desc(a_t + ks * 32), db);
                    if (SPLIT == 2) wgmma_k16<WS_BN>(acc, wg_desc(a_t + WS_A_BYTES + ks * 32), db);
                }
                wg_commit();
                wg_wait<1>(); /* the previous stage's group is done: release that stage */
                acc_fence(acc);
                if (kt > 0 && lane == 0) {
                    mbar_arrive(&empty[sprev]);
                    if (PAIR) mbar_arrive_cluster(&empty[sprev], rank ^ 1u);
                }
                __syncwarp();
                sprev = s;
                if (++s == STAGES) s = 0, ph ^= 1u;
            }
            wg_wait<0>();
            acc_fence(acc);
            if (lane == 0) {
                mbar_arrive(&empty[sprev]);
                if (PAIR) mbar_arrive_cluster(&empty[sprev], rank ^ 1u);
            }
            __syncwarp();
            const int64_t rows = tile_rows(mt, e, row0);
            wg_epilogue<WS_BN, WS_BN / 2, SPLIT, true>(acc, !gateup, a.Y, a.ldy, reinterpret_cast<bf16 *>(a.H), a.N,
                                                       row0, rows, nt, cwg * 64 + (cw & 3) * 16 + g, t4,
                                                       [](float v, int) { return v; });
        }
    }
    if (PAIR) cluster_sync(); /* the partner's last arrivals on this CTA's barriers are in */
#else
    __trap(); /* not built for sm_90a: the host never launches this (ck_gemm_wgmma_ws refuses) */
#endif
}

#ifdef CLEF_CUDA_WGMMA
template <int SPLIT, bool CFENCE, bool PAIR> cudaError_t launch_ws(const ck_gemm_args *a, cudaStream_t st) {
    constexpr int smem = ws_smem_bytes<SPLIT>();
    auto *kernel = wgmma_ws_kernel<SPLIT, CFENCE, PAIR>;
    static unsigned done = 0; /* devices whose limit is raised */
    cudaError_t e = allow_smem(kernel, smem, &done);
    if (e != cudaSuccess) return e;
    int dev = 0, sms = 0;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess) return e;
    if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return e;
    const int64_t ncol = gemm_col_tiles(a->mode, a->N, WS_BN);
    if (a->max_tiles <= 0) return cudaSuccess;
    if (!PAIR) {
        const int64_t tiles = a->max_tiles * ncol; /* the plan's bound */
        const unsigned blocks = (unsigned)(tiles < sms ? tiles : sms);
        kernel<<<blocks, WS_THREADS, smem, st>>>(*a);
        return cudaGetLastError();
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 2, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(WS_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    /* as many pairs as are resident at once (a persistent grid must not run in waves) */
    static int pairs_of[32]; /* per device, 0 = not asked yet (a benign race: the same value) */
    if (dev >= 32) return cudaErrorInvalidDevice;
    if (!pairs_of[dev]) {
        cfg.gridDim = dim3((unsigned)(sms / 2 * 2));
        int n = 0;
        if ((e = cudaOccupancyMaxActiveClusters(&n, kernel, &cfg)) != cudaSuccess) return e;
        if (n < 1) return cudaErrorInvalidConfiguration;
        pairs_of[dev] = n;
    }
    const int64_t items = (a->max_tiles + 1) / 2 * ncol;
    cfg.gridDim = dim3(2u * (unsigned)(items < pairs_of[dev] ? items : pairs_of[dev]));
    e = cudaLaunchKernelEx(&cfg, kernel, *a);
    return e != cudaSuccess ? e : cudaGetLastError();
}
#endif

} /* namespace */

extern "C" {

cudaError_t ck_gemm_wgmma_ws_opts(const ck_gemm_args *a, int opts, cudaStream_t st) {
#ifndef CLEF_CUDA_WGMMA
    (void)a, (void)opts, (void)st;
    return cudaErrorNotSupported;
#else
    if ((a->mode != CK_GEMM_GATEUP && a->mode != CK_GEMM_DOWN) || !a->wmaps || a->n_experts < 1 || a->big != 1)
        return cudaErrorInvalidValue;
    if (a->K < WS_BK || a->K % WS_BK || a->K > 0x7fffffffLL || a->lda % 8 || ((uintptr_t)a->A & 15) || a->N < 1 ||
        a->N > 0x7fff0000LL)
        return cudaErrorInvalidValue;
    if (a->mode == CK_GEMM_DOWN && (a->ldy % 2 || ((uintptr_t)a->Y & 7))) return cudaErrorInvalidValue; /* float2 stores */
    if (opts != 0 && opts != CK_WS_NOFENCE && opts != CK_WS_PAIRS) return cudaErrorInvalidValue;
    if (a->split != 1 && a->split != 2) return cudaErrorInvalidValue;
    if (opts == CK_WS_PAIRS) return a->split == 2 ? launch_ws<2, true, true>(a, st) : launch_ws<1, true, true>(a, st);
    if (opts == CK_WS_NOFENCE) return a->split == 2 ? launch_ws<2, false, false>(a, st) : launch_ws<1, false, false>(a, st);
    return a->split == 2 ? launch_ws<2, true, false>(a, st) : launch_ws<1, true, false>(a, st);
#endif
}

cudaError_t ck_gemm_wgmma_ws(const ck_gemm_args *a, cudaStream_t st) { return ck_gemm_wgmma_ws_opts(a, 0, st); }

} /* extern "C" */
