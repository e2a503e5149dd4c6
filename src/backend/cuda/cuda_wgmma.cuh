/* cuda_wgmma.cuh — Hopper warpgroup-MMA helpers shared by the wgmma kernels
 * (cuda_wgmma.cu: bf16 and packed experts; cuda_fp8mma.cu: W8A8 FP8
 * experts): the 128-byte-swizzled shared-memory layout and its descriptor,
 * the wgmma fence / commit / wait instructions, the async-proxy fence, the
 * mbarrier and 2-D tensor-copy (TMA) instructions, the warpgroup register
 * reallocation (setmaxnreg), the 64-accumulator operand list of the m64n128
 * instructions, the bf16 m64n128k16 / m64n256k16 MMAs and the grouped
 * products' epilogue.  Device code
 * only; the instruction wrappers exist where CLEF_WGMMA_DEVICE is defined
 * (sm_90a device passes and the host pass). */
#ifndef CLEF_BACKEND_CUDA_WGMMA_CUH
#define CLEF_BACKEND_CUDA_WGMMA_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "backend/cuda/cuda_ptx.cuh" /* put_bf16, silu_mul (wg_epilogue) */

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
#define CLEF_WGMMA_DEVICE 1
#endif

/* Bytes of one row of a 128B-swizzled tile: 64 bf16 or 128 FP8 K values. */
#define WG_ROW_BYTES 128

/* Byte offset of 16-byte chunk c (0..7) of row r in a 128B-swizzled tile
 * (8-row atoms of 1024 bytes; chunk index XOR row mod 8), the layout the
 * SWIZZLE_128B descriptors below describe. */
static __device__ __forceinline__ uint32_t sw128(int r, int c) {
    return (uint32_t)(r * WG_ROW_BYTES + ((c ^ (r & 7)) << 4));
}

/* wgmma shared-memory matrix descriptor, K-major, 128-byte swizzle: start
 * address >> 4, leading byte offset 1 (unused for swizzled K-major),
 * stride byte offset 1024 >> 4 (between 8-row atoms), layout type 1. */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

/* The 64 f32 accumulators d[0..63] of an m64n128 wgmma as asm operands %0..%63. */
#define WG_ACC64(d)                                                                                                    \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),       \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),          \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),         \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),         \
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),         \
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),         \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),         \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
/* The accumulator register list "{%0, ..., %63}" of those operands. */
#define WG_ACC64_REGS                                                                                                  \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "  \
    "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "   \
    "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

#ifdef CLEF_WGMMA_DEVICE
static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/* Wait until at most N committed wgmma groups are in flight. */
template <int N> static __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Orders this thread's (and, through the barriers it waited on, other threads') shared-memory
 * accesses in the generic proxy with later async-proxy ones: cp.async writes before wgmma reads,
 * ldmatrix reads before the tensor copy that overwrites the stage (gemm_tma_kernel). */
static __device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* mbarriers in shared memory (the TMA pipelines of cuda_gemm.cu's gemm_tma_kernel). */
static __device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"((uint32_t)__cvta_generic_to_shared(b)), "r"(count));
}
/* Wait until the phase of parity `parity` of b has completed. */
static __device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity) {
    /* the loop inside one asm block (labels are local to its braces): a waiting warp issues two
     * instructions per try, leaving the issue slots to the warps that work */
    asm volatile("{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT;\n}\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(b)),
                 "r"(parity)
                 : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared.b64 _, [%0];\n" ::"r"((uint32_t)__cvta_generic_to_shared(b)) : "memory");
}
/* One arrival that also expects `bytes` more of asynchronous transfer in the phase. */
static __device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;\n" ::"r"((uint32_t)__cvta_generic_to_shared(b)),
                 "r"(bytes)
                 : "memory");
}
/* An arrival on b once this thread's earlier cp.async copies have landed (counted in b's init count). */
static __device__ __forceinline__ void mbar_cp_async_arrive(uint64_t *b) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"((uint32_t)__cvta_generic_to_shared(b))
                 : "memory");
}
/* The box at (x = column, y = row) of the 2-D tensor map `map` (a CUtensorMap in global memory) into
 * shared memory at dst (1024-byte aligned for a 128B-swizzled map), completing its bytes on b. */
static __device__ __forceinline__ void tma_load_2d(void *dst, const void *map, int x, int y, uint64_t *b) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(map), "r"(x), "r"(y), "r"((uint32_t)__cvta_generic_to_shared(b))
                 : "memory");
}
/* Warpgroup register reallocation (warp-specialised kernels, cuda_wgmma_ws.cu): every warp of the
 * calling warpgroup lowers (dec) or raises (inc) its per-thread register budget to N.  Effective only
 * in a kernel with a register cap at entry (__launch_bounds__(threads, 1)), each role one branch. */
template <int N> static __device__ __forceinline__ void wg_setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> static __device__ __forceinline__ void wg_setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
/* Keeps the compiler from moving accumulator accesses across wgmma fences. */
template <int NR> static __device__ __forceinline__ void acc_fence(float (&d)[NR]) {
#pragma unroll
    for (int i = 0; i < NR; i++) asm volatile("" : "+f"(d[i])::"memory");
}
#endif

#ifdef CLEF_WGMMA_DEVICE
/* bf16 warpgroup MMAs, f32 accumulators (scale-d 1: d is always added to), operands through
 * wg_desc descriptors.
 * d[64x128] += A[64x16] . B[128x16]^T (both K-major in shared memory). */
static __device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_ACC64_REGS ", "
        "%64, %65, p, 1, 1, 0, 0;\n"
        "}\n"
        : WG_ACC64(d)
        : "l"(da), "l"(db), "r"(1));
}

/* d[64x256] += A[64x16] . B[256x16]^T (both K-major in shared memory). */
static __device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db) {
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
/* The m64nBNk16 MMA of a BN-column tile (128 or 256): d[BN / 2] per thread. */
template <int BN> __device__ __forceinline__ void wgmma_k16(float (&d)[BN / 2], uint64_t da, uint64_t db);
template <> __device__ __forceinline__ void wgmma_k16<128>(float (&d)[64], uint64_t da, uint64_t db) {
    wgmma_m64n128k16(d, da, db);
}
template <> __device__ __forceinline__ void wgmma_k16<256>(float (&d)[128], uint64_t da, uint64_t db) {
    wgmma_m64n256k16(d, da, db);
}
#endif

/* The epilogue of the grouped wgmma products (cuda_wgmma.cu's kernel,
 * cuda_fp8mma.cu's): this thread's accumulators of a tile of BN columns,
 * acc[4j + q] at tile row rbase + 8 (q >> 1) and column 8j + 2t + (q & 1)
 * (rows past `rows` dropped), each value through fin(v, m) (m = 0: the
 * gate / down matrix, 1: the up matrix; e.g. NVFP4's per-tensor global).
 * down: f32 columns nt BN .. (< N) of rows row0 + r of Y (ldy apart).
 * Else GATEUP (tile columns [0, HALF) gate, [HALF, BN) up of the same HALF
 * intermediate columns nt HALF ..): bf16 silu(g) u (the CPU backend's
 * formula) into H rows of N SPLIT values, with SPLIT = 2 the bf16 rest
 * (value - hi) at column N + col.  PAIRS (SPLIT = 1): the two values of
 * columns col, col + 1 as one 4-byte store where N is even and H 4-byte
 * aligned (the same values; fewer store instructions). */
template <int BN, int HALF, int SPLIT, bool PAIRS = false, int NR, class Fin>
static __device__ __forceinline__ void wg_epilogue(const float (&acc)[NR], bool down, float *Y, int64_t ldy,
                                                   __nv_bfloat16 *H, int64_t N, int64_t row0, int64_t rows,
                                                   int64_t nt, int rbase, int t, Fin fin) {
    if (down) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = rbase + h * 8;
            if (r >= rows) continue;
            float *y = Y + (row0 + r) * ldy;
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                const int64_t n = nt * BN + j * 8 + t * 2;
                if (n + 1 < N)
                    *reinterpret_cast<float2 *>(y + n) =
                        make_float2(fin(acc[4 * j + 2 * h], 0), fin(acc[4 * j + 2 * h + 1], 0));
                else if (n < N)
                    y[n] = fin(acc[4 * j + 2 * h], 0);
            }
        }
        return;
    }
    /* gate column c (n8 chunk j < HALF / 8) and up column c (chunk j + HALF / 8) sit in the same thread */
    const int64_t ldh = N * SPLIT;
    const bool pairs = PAIRS && SPLIT == 1 && !(N & 1) && !(reinterpret_cast<uintptr_t>(H) & 3);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = rbase + h * 8;
        if (r >= rows) continue;
        __nv_bfloat16 *hr = H + (row0 + r) * ldh;
#pragma unroll
        for (int j = 0; j < HALF / 8; j++) {
            if (pairs && nt * HALF + j * 8 + t * 2 + 1 < N) {
                const int64_t col = nt * HALF + j * 8 + t * 2;
                const float v0 = silu_mul(fin(acc[4 * j + 2 * h], 0), fin(acc[4 * (j + HALF / 8) + 2 * h], 1));
                const float v1 = silu_mul(fin(acc[4 * j + 2 * h + 1], 0), fin(acc[4 * (j + HALF / 8) + 2 * h + 1], 1));
                *reinterpret_cast<__nv_bfloat162 *>(hr + col) =
                    __halves2bfloat162(__float2bfloat16_rn(v0), __float2bfloat16_rn(v1));
                continue;
            }
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int64_t col = nt * HALF + j * 8 + t * 2 + q;
                if (col >= N) continue;
                put_bf16(hr, N, SPLIT, col,
                         silu_mul(fin(acc[4 * j + 2 * h + q], 0), fin(acc[4 * (j + HALF / 8) + 2 * h + q], 1)));
            }
        }
    }
}

#endif
