/* cuda_ptx.cuh — inline PTX helpers shared by the tensor-core kernels
 * (cuda_gemm.cu, cuda_attn.cu): async global->shared copies, ldmatrix loads,
 * the m16n8k16 bf16 MMA with f32 accumulators, and bf16x2 packing.
 * Device code only; include from .cu files. */
#ifndef CLEF_BACKEND_CUDA_PTX_CUH
#define CLEF_BACKEND_CUDA_PTX_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h"

/* Shared-memory address of a generic pointer, for PTX operands. */
static __device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16-byte async copy global -> shared; valid = 0 fills the 16 bytes with zeros. */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
/* 4- and 8-byte async copies (cache at all levels); valid = 0 fills zeros. */
static __device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}
static __device__ __forceinline__ void cp_async8(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 8 : 0));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/* Wait until at most N committed copy groups are still in flight. */
template <int N> static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Four 8x8 b16 matrices from shared memory (row-major / transposed). */
static __device__ __forceinline__ void ldsm_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                                 const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
}

/* d += a . b for one m16n8k16 tile (bf16 inputs, f32 accumulators). */
static __device__ __forceinline__ void mma16816(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The output rows of tile mt of a GEMM launch (Args: ck_gemm_args or
 * ck_qgemm_args; BM rows per tile): DENSE: [mt BM, mt BM + BM) cut at M,
 * e = 0; grouped: tile mt of ck_moe_plan's plan, e its expert.  false past
 * *n_tiles (the grid is sized for the worst case): the block has no work. */
template <class Args>
static __device__ __forceinline__ bool gemm_tile_rows(const Args &a, int BM, int64_t mt, int64_t &row0, int64_t &rows,
                                                      int &e) {
    if (a.mode == CK_GEMM_DENSE) {
        e = 0;
        row0 = mt * BM;
        rows = a.M - row0 < BM ? a.M - row0 : BM;
        return true;
    }
    if (mt >= *a.n_tiles) return false;
    e = a.tile_expert[mt];
    row0 = a.tile_row0[mt];
    const int64_t end = a.expert_end[e];
    rows = end - row0 < BM ? end - row0 : BM;
    return true;
}

/* This thread's 16-byte activation chunks of a tile, fixed over K: chunk
 * i is c = tid + i THREADS, tile row r[i] = c / (BK / 8), column
 * col[i] = (c % (BK / 8)) 8; src[i] = the A row it copies (GATEUP gathers
 * through row_src; lda apart), NULL past the tile's rows (zero fill). */
template <int CHUNKS, int THREADS, int BK, class Args>
static __device__ __forceinline__ void gemm_a_chunks(const Args &a, const __nv_bfloat16 *A, int tid, int64_t row0,
                                                     int64_t rows, const __nv_bfloat16 *(&src)[CHUNKS],
                                                     int (&r)[CHUNKS], int (&col)[CHUNKS]) {
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {
        const int c = tid + i * THREADS;
        r[i] = c / (BK / 8);
        col[i] = (c % (BK / 8)) * 8;
        if (r[i] < rows) {
            int64_t p = row0 + r[i];
            if (a.mode == CK_GEMM_GATEUP) p = a.row_src[p];
            src[i] = A + p * a.lda;
        } else {
            src[i] = nullptr;
        }
    }
}

/* Two floats as a bf16x2 register, lo in the low half. */
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

#endif
