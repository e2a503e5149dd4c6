/* cuda_ptx.cuh — inline PTX helpers shared by the tensor-core kernels
 * (cuda_gemm.cu, cuda_attn.cu): async global->shared copies, ldmatrix loads,
 * the m16n8k16 bf16 MMA with f32 accumulators, and bf16x2 packing; with the
 * launch helpers they share (column tiles, the shared-memory limit).
 * Include from .cu files. */
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

/* d = a . b + 0 for one m16n8k16 tile: mma16816 on accumulators that hold +0, without setting them. */
static __device__ __forceinline__ void mma16816_c0(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

/* Value v as the bf16 rows the tensor-core products read (ck_rows_to_bf16's split): hi = bf16(v) at
 * d[i], and with split 2 the rest lo = bf16(v - hi) at d[K + i]. */
static __device__ __forceinline__ void put_bf16(__nv_bfloat16 *d, int64_t K, int split, int64_t i, float v) {
    const __nv_bfloat16 hi = __float2bfloat16_rn(v);
    d[i] = hi;
    if (split == 2) d[K + i] = __float2bfloat16_rn(v - __bfloat162float(hi));
}

/* silu(g) * u, the CPU backend's SwiGLU (g / (1 + e^-g), then the product).  A plain product, as the
 * GEMM epilogues always had it: the compiler may fuse it with a following subtraction (put_bf16's rest). */
static __device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* Column tiles of a GEMM over N output columns in blocks of bn columns:
 * GATEUP blocks hold bn / 2 gate and bn / 2 up columns of the intermediate
 * (N = its width), the other modes bn columns.  Host and device. */
static __host__ __device__ __forceinline__ int64_t gemm_col_tiles(int mode, int64_t N, int bn) {
    const int64_t w = mode == CK_GEMM_GATEUP ? bn / 2 : bn;
    return (N + w - 1) / w;
}

/* Host: the 1-D grid of a GEMM launch, row_tiles x gemm_col_tiles(mode, N,
 * bn) block tiles (row_tiles: DENSE ceil(M / BM), grouped the plan's bound
 * max_tiles), in *blocks.  cudaSuccess with *blocks = 0 when there is
 * nothing to launch; cudaErrorInvalidConfiguration past 2^31 - 1 blocks. */
static __host__ cudaError_t gemm_grid(int mode, int64_t row_tiles, int64_t N, int bn, unsigned *blocks) {
    const int64_t b = row_tiles * gemm_col_tiles(mode, N, bn);
    *blocks = b > 0 && b <= 0x7fffffffLL ? (unsigned)b : 0u;
    return b > 0x7fffffffLL ? cudaErrorInvalidConfiguration : cudaSuccess;
}

/* Host: raise kernel fn's dynamic shared memory limit to `bytes` once per
 * device (bit `dev` of *done_mask; a benign race: every thread writes the
 * same value).  cudaFuncSetAttribute's error, else cudaSuccess. */
template <typename F> static cudaError_t allow_smem(F *fn, int bytes, unsigned *done_mask) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev < 32 && (*done_mask >> dev) & 1u) return cudaSuccess;
    e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess && dev < 32) *done_mask |= 1u << dev;
    return e;
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

/* The block tile of this block (blockIdx.x = mt x col tiles + nt) of a GEMM
 * launch over BM x BN tiles (gemm_grid): its column tile nt and
 * gemm_tile_rows' row0, rows, e; false: the block has no work. */
template <class Args>
static __device__ __forceinline__ bool gemm_block_tile(const Args &a, int BM, int BN, int64_t &nt, int64_t &row0,
                                                       int64_t &rows, int &e) {
    const int64_t n_tiles_n = gemm_col_tiles(a.mode, a.N, BN);
    const int64_t mt = blockIdx.x / n_tiles_n;
    nt = blockIdx.x % n_tiles_n;
    return gemm_tile_rows(a, BM, mt, row0, rows, e);
}

/* This thread's 16-byte activation chunks of a tile, fixed over K: chunk
 * i is c = tid + i THREADS, tile row r = c / (BK / 8), column
 * col[i] = (c % (BK / 8)) 8, shared offset dst[i] = r PITCH + col[i] (bf16
 * elements); src[i] = the A row it copies (GATEUP gathers through row_src;
 * lda apart), NULL past the tile's rows (zero fill). */
template <int CHUNKS, int THREADS, int BK, int PITCH, class Args>
static __device__ __forceinline__ void gemm_a_chunks(const Args &a, const __nv_bfloat16 *A, int tid, int64_t row0,
                                                     int64_t rows, const __nv_bfloat16 *(&src)[CHUNKS],
                                                     int (&dst)[CHUNKS], int (&col)[CHUNKS]) {
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {
        const int c = tid + i * THREADS, r = c / (BK / 8);
        col[i] = (c % (BK / 8)) * 8;
        dst[i] = r * PITCH + col[i];
        if (r < rows) {
            int64_t p = row0 + r;
            if (a.mode == CK_GEMM_GATEUP) p = a.row_src[p];
            src[i] = A + p * a.lda;
        } else {
            src[i] = nullptr;
        }
    }
}

/* The cp.async copies of this thread's activation chunks (gemm_a_chunks) for
 * the K stage starting at column k0 into the stage's tiles at `as`: the hi
 * tile, and with SPLIT = 2 the lo tile (columns K.. of each row) a_tile
 * elements later, hi then lo per chunk; chunks past the row or past K
 * zero-filled (A: any valid address for the skipped source). */
template <int CHUNKS, int SPLIT>
static __device__ __forceinline__ void gemm_a_load(__nv_bfloat16 *as, int a_tile,
                                                   const __nv_bfloat16 *const (&src)[CHUNKS],
                                                   const int (&dst)[CHUNKS], const int (&col)[CHUNKS], int64_t k0,
                                                   int64_t K, const __nv_bfloat16 *A) {
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {
        const int64_t kc = k0 + col[i];
        const bool ok = src[i] && kc < K;
#pragma unroll
        for (int h = 0; h < SPLIT; h++) cp_async16(as + h * a_tile + dst[i], ok ? src[i] + h * K + kc : A, ok);
    }
}

/* The cp.async ring of the kernels whose every thread loads (gemm_kernel, the packed v3): stages
 * 0..STAGES-2 in flight (load(kt, stage) issues K tile kt into ring stage `stage`; empty groups past
 * ktiles keep the wait counts right), then per K tile kt: wait for this thread's copies of kt, a
 * block-wide barrier (every thread's copies visible, stage kt - 1 consumed by all), issue tile
 * kt + STAGES - 1 into the freed stage, use(kt, kt % STAGES). */
template <int STAGES, class Load, class Use>
static __device__ __forceinline__ void cp_ring(int ktiles, Load load, Use use) {
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ktiles) load(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (kt + STAGES - 1 < ktiles) load(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
        cp_async_commit();
        use(kt, kt % STAGES);
    }
}

/* Every value of an M x N array of m16n8 accumulator fragments = 0. */
template <int M, int N> static __device__ __forceinline__ void zero_frags(float (&acc)[M][N][4]) {
#pragma unroll
    for (int i = 0; i < M; i++)
#pragma unroll
        for (int j = 0; j < N; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;
}

/* cos / sin of interleaved M-RoPE frequency j (< D/2) at token t of T
 * (SPEC §6.3): the position axis frequency j reads (T, H or W by j % 3 and
 * the mrope sections s1, s2), the angle fp32(pos) * inv_freq[j] rounded
 * once; the one formula of rope_kernel and qk_norm_rope_kernel. */
static __device__ __forceinline__ void mrope_cos_sin(const int32_t *__restrict__ pos, int64_t T, int64_t t, int64_t j,
                                                     int64_t s1, int64_t s2, const float *__restrict__ inv_freq,
                                                     float &c, float &s) {
    const int axis = (j % 3 == 1 && j < 3 * s1) ? 1 : (j % 3 == 2 && j < 3 * s2) ? 2 : 0;
    const float ang = __fmul_rn((float)pos[axis * T + t], inv_freq[j]);
    c = cosf(ang);
    s = sinf(ang);
}

/* The epilogue of the mma.sync GEMMs (cuda_gemm.cu's kernel, cuda_qgemm.cu's
 * v2 and v3): the warp's MI x NI m16n8 accumulator fragments (warp tile
 * WTM x WTN at (wm, wn) of a BM x BN block tile; lane g = lane / 4,
 * tig = lane % 4), each value v of output column n passed through
 * fin(v, n) (a bias, a global scale, or nothing).
 *   DENSE / DOWN: Y[row0 + r][n] (ldy apart) for r < rows, n < N with
 *     n = nt BN + wn WTN + ni 8 + tig 2 + q.
 *   GATEUP (BN = 64 gate + 64 up columns): the tile through Cs [BM][BN + 4]
 *     over `smem` (this syncs the block first: every warp must be done with
 *     the pipeline's buffers), then H[row0 + r][nt 64 + j] = silu(gate_j) *
 *     up_j as bf16 (rows N * split apart; split 2: [hi | lo]).
 * named: the block's THREADS MMA threads sync on named barrier 1 instead of
 * the whole block (a warp-specialised kernel whose loading warp has left). */
template <int BM, int BN, int WTM, int WTN, int THREADS, int MI, int NI, class Args, class Fin>
static __device__ __forceinline__ void mma_epilogue(const Args &a, const float (&acc)[MI][NI][4], int64_t N, int split,
                                                    int64_t row0, int64_t rows, int64_t nt, int wm, int wn, int lane,
                                                    int tid, unsigned char *smem, Fin fin, bool named = false) {
    auto sync = [named] {
        if (named)
            asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
        else
            __syncthreads();
    };
    const int g = lane >> 2, tig = lane & 3;
    if (a.mode != CK_GEMM_GATEUP) {
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = wm * WTM + mi * 16 + g + h * 8;
                    if (r >= rows) continue;
                    float *y = a.Y + (row0 + r) * a.ldy;
#pragma unroll
                    for (int q = 0; q < 2; q++) {
                        const int64_t n = nt * BN + wn * WTN + ni * 8 + tig * 2 + q;
                        if (n < N) y[n] = fin(acc[mi][ni][h * 2 + q], n);
                    }
                }
        return;
    }
    sync();
    float *Cs = reinterpret_cast<float *>(smem);
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int q = 0; q < 2; q++)
                    Cs[(wm * WTM + mi * 16 + g + h * 8) * (BN + 4) + wn * WTN + ni * 8 + tig * 2 + q] =
                        fin(acc[mi][ni][h * 2 + q], (int64_t)-1);
    sync();
    __nv_bfloat16 *H = reinterpret_cast<__nv_bfloat16 *>(a.H);
    const int64_t ldh = N * split;
    for (int i = tid; i < BM * 64; i += THREADS) {
        const int r = i >> 6, j = i & 63;
        const int64_t col = nt * 64 + j;
        if (r >= rows || col >= N) continue;
        const float gv = Cs[r * (BN + 4) + j], uv = Cs[r * (BN + 4) + 64 + j];
        put_bf16(H + (row0 + r) * ldh, N, split, col, silu_mul(gv, uv));
    }
}

/* Two floats as a bf16x2 register, lo in the low half. */
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
/* The rests of the same two floats once rounded to `packed` (pack_bf16(lo, hi)): bf16x2 of
 * lo - its bf16, hi - its bf16 (put_bf16's split, two values at a time). */
static __device__ __forceinline__ uint32_t pack_bf16_rest(float lo, float hi, uint32_t packed) {
    const __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162 *>(&packed);
    return pack_bf16(lo - __low2float(h), hi - __high2float(h));
}

/* The k expert rows of token t in the combine's order (moe_combine_kernel, moe_combine_norm_kernel):
 * slots by ascending expert, ties in slot order (the reference's index_add order); row[r] the element
 * offset of rank r's row in the permuted outputs (slot_pos * H), ws[r] its weight.  Threads 0..k-1 of
 * the block (k <= 64, blockDim >= k) fill the shared arrays; every thread returns after a barrier. */
static __device__ __forceinline__ void moe_rank_rows(const int32_t *__restrict__ idx, const float *__restrict__ w,
                                                     const int32_t *__restrict__ slot_pos, int64_t t, int k, int64_t H,
                                                     int64_t *row, float *ws, int *ex) {
    const int s = threadIdx.x;
    if (s < k) ex[s] = idx[t * k + s];
    __syncthreads();
    if (s < k) {
        int rank = 0;
        for (int j = 0; j < k; j++) rank += ex[j] < ex[s] || (ex[j] == ex[s] && j < s);
        row[rank] = (int64_t)slot_pos[t * k + s] * H;
        ws[rank] = w[t * k + s];
    }
    __syncthreads();
}

/* Element h..h+3 of token t's combined row: sum over ranks of w x y (product then sum, each rounded, as the
 * CPU backend; rank 0 starts the sum).  KT: k at compile time (the thinker's 8: every row's load issued
 * before the first sum needs it), or 0 for k at run time; the same operations either way. */
template <int KT = 0>
static __device__ __forceinline__ float4 moe_combine4(const float *__restrict__ yp, const int64_t *row, const float *ws,
                                                      int k, int64_t h) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    const int kn = KT ? KT : k;
#pragma unroll(KT ? KT : 1)
    for (int i = 0; i < kn; i++) {
        const float4 v = *reinterpret_cast<const float4 *>(yp + row[i] + h);
        const float c = ws[i];
        if (i == 0) {
            acc = make_float4(__fmul_rn(v.x, c), __fmul_rn(v.y, c), __fmul_rn(v.z, c), __fmul_rn(v.w, c));
        } else {
            acc.x = __fadd_rn(acc.x, __fmul_rn(v.x, c));
            acc.y = __fadd_rn(acc.y, __fmul_rn(v.y, c));
            acc.z = __fadd_rn(acc.z, __fmul_rn(v.z, c));
            acc.w = __fadd_rn(acc.w, __fmul_rn(v.w, c));
        }
    }
    return acc;
}

#endif
