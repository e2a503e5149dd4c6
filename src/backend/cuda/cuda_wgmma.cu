/* cuda_wgmma.cu — the grouped expert GEMMs (GATEUP with SwiGLU, DOWN) on
 * Hopper's warpgroup MMA (wgmma.mma_async, sm_90a).
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

typedef __nv_bfloat16 bf16;

namespace {

constexpr int WG_BK = 64;    /* K per stage: one 128-byte swizzle row */
constexpr int ROW_BYTES = WG_BK * 2;
constexpr int SMEM_STAGES_MAX = 200 * 1024; /* pipeline bytes per CTA (one CTA per SM) */

/* Output columns per CTA: 128 on 64-row tiles, 256 on 128-row tiles (half
 * the activation traffic per MMA); GATEUP splits them into BN/2 gate and
 * BN/2 up columns of the same intermediate indices. */
template <int BM> __host__ __device__ constexpr int wg_bn() { return BM == 128 ? 256 : 128; }
/* Every stage holds SPLIT activation tiles of BM rows and one weight tile
 * of BN rows, 128 bytes a row; as many stages as fit SMEM_STAGES_MAX. */
template <int BM, int SPLIT> __host__ __device__ constexpr int wg_stage_bytes() {
    return (SPLIT * BM + wg_bn<BM>()) * ROW_BYTES;
}
template <int BM, int SPLIT> __host__ __device__ constexpr int wg_stages() {
    return SMEM_STAGES_MAX / wg_stage_bytes<BM, SPLIT>() > 8 ? 8 : SMEM_STAGES_MAX / wg_stage_bytes<BM, SPLIT>();
}
template <int BM, int SPLIT> constexpr int wg_smem_bytes() {
    return wg_stages<BM, SPLIT>() * wg_stage_bytes<BM, SPLIT>() + 1024; /* + alignment slack */
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
#define CLEF_WGMMA_DEVICE 1
#endif

/* Byte offset of 16-byte chunk c (0..7) of row r in a 128B-swizzled tile
 * (8-row atoms of 1024 bytes; chunk index XOR row mod 8), the layout the
 * SWIZZLE_128B descriptors below describe. */
__device__ __forceinline__ uint32_t sw128(int r, int c) { return (uint32_t)(r * ROW_BYTES + ((c ^ (r & 7)) << 4)); }

/* wgmma shared-memory matrix descriptor, K-major, 128-byte swizzle: start
 * address >> 4, leading byte offset 1 (unused for swizzled K-major),
 * stride byte offset 1024 >> 4 (between 8-row atoms), layout type 1. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

#ifdef CLEF_WGMMA_DEVICE
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* cp.async writes (generic proxy) visible to the wgmma reads (async proxy). */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* Keeps the compiler from moving accumulator accesses across wgmma fences. */
template <int NR> __device__ __forceinline__ void acc_fence(float (&d)[NR]) {
#pragma unroll
    for (int i = 0; i < NR; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* d[64x128] += A[64x16] . B[128x16]^T (both K-major in shared memory). */
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(1));
}

/* d[64x256] += A[64x16] . B[256x16]^T (both K-major in shared memory). */
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(1));
}
template <int BN> __device__ __forceinline__ void wgmma_k16(float (&d)[BN / 2], uint64_t da, uint64_t db);
template <> __device__ __forceinline__ void wgmma_k16<128>(float (&d)[64], uint64_t da, uint64_t db) {
    wgmma_m64n128k16(d, da, db);
}
template <> __device__ __forceinline__ void wgmma_k16<256>(float (&d)[128], uint64_t da, uint64_t db) {
    wgmma_m64n256k16(d, da, db);
}
#endif

/* One BM x BN tile of a grouped product (a.mode GATEUP or DOWN). */
template <int BM, int SPLIT>
__global__ void __launch_bounds__(BM * 2, 1) wgmma_gemm_kernel(const ck_gemm_args a) {
#ifdef CLEF_WGMMA_DEVICE
    constexpr int THREADS = BM * 2, STAGES = wg_stages<BM, SPLIT>(), STAGE = wg_stage_bytes<BM, SPLIT>();
    constexpr int BN = wg_bn<BM>(), HALF = BN / 2, NR = BN / 2; /* NR: accumulators per thread */
    constexpr int A_CHUNKS = BM * 8 / THREADS, W_CHUNKS = BN * 8 / THREADS; /* 16-byte chunks per thread */
    static_assert(STAGES >= 2, "the schedule loads STAGES - 1 tiles ahead");
    extern __shared__ unsigned char smem_raw[];
    /* swizzle atoms need 1024-byte alignment */
    unsigned char *smem =
        smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    const uint32_t sbase = smem_addr(smem);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int64_t n_tiles_n = a.mode == CK_GEMM_GATEUP ? (a.N + HALF - 1) / HALF : (a.N + BN - 1) / BN;
    const int64_t mt = blockIdx.x / n_tiles_n, nt = blockIdx.x % n_tiles_n;
    if (mt >= *a.n_tiles) return;
    const int e = a.tile_expert[mt];
    const int64_t row0 = a.tile_row0[mt], end = a.expert_end[e];
    const int64_t rows = end - row0 < BM ? end - row0 : BM;
    const bf16 *w0 = reinterpret_cast<const bf16 *>(a.W0[e]);
    const bf16 *w1 = a.mode == CK_GEMM_GATEUP ? reinterpret_cast<const bf16 *>(a.W1[e]) : nullptr;
    const bf16 *A = reinterpret_cast<const bf16 *>(a.A);
    const int64_t K = a.K;

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
    const bf16 *w_src[W_CHUNKS];
    uint32_t w_dst[W_CHUNKS];
    int w_col[W_CHUNKS];
#pragma unroll
    for (int i = 0; i < W_CHUNKS; i++) {
        const int c = tid + i * THREADS, r = c >> 3, ch = c & 7;
        w_col[i] = ch * 8;
        w_dst[i] = sw128(r, ch);
        int64_t n;
        const bf16 *base;
        if (a.mode == CK_GEMM_GATEUP) { /* rows [0, HALF) gate, [HALF, BN) up, of columns nt * HALF + r % HALF */
            n = nt * HALF + (r % HALF);
            base = r < HALF ? w0 : w1;
        } else {
            n = nt * BN + r;
            base = w0;
        }
        w_src[i] = n < a.N ? base + n * K : nullptr;
    }
    /* stage layout: [A hi: BM rows][A lo: BM rows if split][W: 128 rows] */
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
#pragma unroll
        for (int i = 0; i < W_CHUNKS; i++) {
            const bool ok = w_src[i] != nullptr;
            cp_async16(st + SPLIT * BM * ROW_BYTES + w_dst[i], ok ? w_src[i] + k0 + w_col[i] : A, ok);
        }
    };

    float acc[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) acc[i] = 0.0f;

    /* Schedule: stage s holds K tile kt with s = kt % STAGES, STAGES - 1 tiles loaded ahead.  Iteration
     * kt: wait for tile kt's copies, barrier (everyone's landed), issue tile kt's wgmma group, wait until
     * at most that group is in flight (tile kt - 1's is done), barrier (every warpgroup's is), refill
     * tile kt - 1's stage with tile kt + STAGES - 1 while tile kt's MMAs run. */
    const int ktiles = (int)(K / WG_BK);
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ktiles) load_stage(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<STAGES - 2>(); /* this thread's copies of tile kt landed */
        fence_proxy_async();
        __syncthreads(); /* everyone's */
        const uint32_t st = sbase + (uint32_t)((kt % STAGES) * STAGE);
        const uint32_t a_hi = st + (uint32_t)(wg * 64 * ROW_BYTES), w_t = st + (uint32_t)(SPLIT * BM * ROW_BYTES);
        acc_fence(acc);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < WG_BK / 16; ks++) { /* 16-wide K chunks: +32 bytes inside the swizzled rows */
            const uint64_t db = wg_desc(w_t + ks * 32);
            wgmma_k16<BN>(acc, wg_desc(a_hi + ks * 32), db);
            if (SPLIT == 2) wgmma_k16<BN>(acc, wg_desc(a_hi + BM * ROW_BYTES + ks * 32), db);
        }
        wg_commit();
        wg_wait<1>();
        acc_fence(acc);
        __syncthreads(); /* tile kt - 1's stage is read by no one any more */
        if (kt + STAGES - 1 < ktiles) load_stage(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
        cp_async_commit();
    }
    wg_wait<0>();
    acc_fence(acc);
    cp_async_wait<0>();

    /* accumulator layout (per warp of the warpgroup: 16 rows): acc[4j + q] at row g (q < 2) or g + 8,
     * column 8j + 2t + (q & 1), g = lane / 4, t = lane % 4 */
    const int g = lane >> 2, t = lane & 3;
    const int rbase = wg * 64 + (warp & 3) * 16 + g;
    if (a.mode == CK_GEMM_DOWN) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = rbase + h * 8;
            if (r >= rows) continue;
            float *y = a.Y + (row0 + r) * a.ldy;
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                const int64_t n = nt * BN + j * 8 + t * 2;
                if (n + 1 < a.N) {
                    *reinterpret_cast<float2 *>(y + n) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
                } else if (n < a.N) {
                    y[n] = acc[4 * j + 2 * h];
                }
            }
        }
        return;
    }
    /* GATEUP: gate column c (n8 chunk j < HALF / 8) and up column c (chunk j + HALF / 8) sit in the same thread */
    bf16 *H = reinterpret_cast<bf16 *>(a.H);
    const int64_t ldh = a.N * SPLIT;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = rbase + h * 8;
        if (r >= rows) continue;
        bf16 *hr = H + (row0 + r) * ldh;
#pragma unroll
        for (int j = 0; j < HALF / 8; j++)
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int64_t col = nt * HALF + j * 8 + t * 2 + q;
                if (col >= a.N) continue;
                const float gv = acc[4 * j + 2 * h + q], uv = acc[4 * (j + HALF / 8) + 2 * h + q];
                const float hv = gv / (1.0f + expf(-gv)) * uv; /* silu(g) * u, as the CPU backend */
                const bf16 hb = __float2bfloat16_rn(hv);
                hr[col] = hb;
                if (SPLIT == 2) hr[a.N + col] = __float2bfloat16_rn(hv - __bfloat162float(hb));
            }
    }
#else
    __trap(); /* not built for sm_90a: the host never launches this (ck_gemm_wgmma refuses) */
#endif
}

template <int BM, int SPLIT> cudaError_t launch_wgmma(const ck_gemm_args *a, cudaStream_t st) {
    constexpr int smem = wg_smem_bytes<BM, SPLIT>();
    static unsigned done = 0; /* devices whose limit is raised (same value from any thread: a benign race) */
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev >= 32 || !((done >> dev) & 1u)) {
        e = cudaFuncSetAttribute(wgmma_gemm_kernel<BM, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return e;
        if (dev < 32) done |= 1u << dev;
    }
    constexpr int BN = wg_bn<BM>();
    const int64_t nt = a->mode == CK_GEMM_GATEUP ? (a->N + BN / 2 - 1) / (BN / 2) : (a->N + BN - 1) / BN;
    const int64_t blocks = a->max_tiles * nt;
    if (blocks <= 0) return cudaSuccess;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    wgmma_gemm_kernel<BM, SPLIT><<<(unsigned)blocks, BM * 2, smem, st>>>(*a);
    return cudaGetLastError();
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
    if (a->K % WG_BK || a->lda % 8 || (a->big != 0 && a->big != 1)) return cudaErrorInvalidValue;
    if (a->mode == CK_GEMM_DOWN && (a->ldy % 2 || ((uintptr_t)a->Y & 7))) return cudaErrorInvalidValue; /* float2 stores */
    if (a->split == 2) return a->big ? launch_wgmma<128, 2>(a, st) : launch_wgmma<64, 2>(a, st);
    if (a->split != 1) return cudaErrorInvalidValue;
    return a->big ? launch_wgmma<128, 1>(a, st) : launch_wgmma<64, 1>(a, st);
#endif
}

} /* extern "C" */
