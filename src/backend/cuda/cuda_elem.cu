/* cuda_elem.cu — norms, activations, adds and the head's small row ops on
 * the GPU, in f32 with the CPU backend's formulas.  Products and sums that
 * the CPU rounds one at a time are written with __fmul_rn / __fadd_rn so
 * the compiler does not fuse them into FMAs (values then differ from the
 * CPU only through the order of the row reductions).  Reductions have one
 * fixed shape per row (warp/block trees), so results never depend on how
 * many rows run together.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_ptx.cuh"

namespace {

constexpr int ROW_WARPS = 8;

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (every thread gets the same value); sm >= 32 doubles. */
__device__ double block_sum_d(double v, double *sm) {
    v = warp_sum_d(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sm[warp] = v;
    __syncthreads();
    double t = 0.0;
    for (int w = 0; w < nw; w++) t += sm[w];
    return t;
}

unsigned grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535LL * 16) b = 65535LL * 16;
    return (unsigned)b;
}

unsigned row_blocks(int64_t rows) { return (unsigned)((rows + ROW_WARPS - 1) / ROW_WARPS); }

/* Four consecutive values of y (element i, i % 4 == 0) as put_bf16 writes them one by one, in one
 * 8-byte store per half (d 8-byte aligned at i: dim % 4 == 0): the scalar 2-byte stores of four
 * elements 8 bytes apart per warp-wide store made the wide add_rmsnorm ~2x slower. */
__device__ __forceinline__ void put_bf16x4(__nv_bfloat16 *d, int64_t K, int split, int64_t i, float4 v) {
    const uint2 hw = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
    *reinterpret_cast<uint2 *>(d + i) = hw;
    if (split == 2)
        *reinterpret_cast<uint2 *>(d + K + i) =
            make_uint2(pack_bf16_rest(v.x, v.y, hw.x), pack_bf16_rest(v.z, v.w, hw.y));
}

/* Wide rows (dim % 4 == 0, 512 <= dim <= 8192): one block of 256 threads per
 * row, the row held in registers (read once), float4 accesses. */
constexpr int WIDE_THREADS = 256, WIDE_MAX4 = 8; /* up to 8 float4 per thread */

/* v + b elementwise, each sum rounded (the residual add of the wide norms). */
__device__ __forceinline__ float4 add4_rn(float4 v, float4 b) {
    return make_float4(__fadd_rn(v.x, b.x), __fadd_rn(v.y, b.y), __fadd_rn(v.z, b.z), __fadd_rn(v.w, b.w));
}

/* This thread's part of the sum of squares of four values, in f64, in the wide norms' order. */
__device__ __forceinline__ double sq4(float4 v) {
    return (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
}

/* The wide norms' second half, for the row this block holds in registers (v[u]: float4 threadIdx.x + 256 u
 * of the row, n4 of them) with this thread's sum of squares ss: the block's f64 sum (sm: >= 32 doubles),
 * inv = 1 / sqrt(mean + eps), then yr = w * (v * inv) and, with d, the same as bf16 (put_bf16x4). */
__device__ __forceinline__ void wide_norm_store(const float4 (&v)[WIDE_MAX4], double ss, double *sm, int64_t n4,
                                                int64_t dim, float eps, const float *__restrict__ w, float *y,
                                                __nv_bfloat16 *d, int split) {
    ss = block_sum_d(ss, sm);
    const float var = (float)(ss / (double)dim), inv = 1.0f / sqrtf(var + eps);
    const float4 *w4 = reinterpret_cast<const float4 *>(w);
    float4 *yr = reinterpret_cast<float4 *>(y);
#pragma unroll
    for (int u = 0; u < WIDE_MAX4; u++) {
        const int64_t i = threadIdx.x + (int64_t)u * WIDE_THREADS;
        if (i < n4) {
            const float4 g = w4[i];
            const float4 z = make_float4(__fmul_rn(g.x, __fmul_rn(v[u].x, inv)), __fmul_rn(g.y, __fmul_rn(v[u].y, inv)),
                                         __fmul_rn(g.z, __fmul_rn(v[u].z, inv)), __fmul_rn(g.w, __fmul_rn(v[u].w, inv)));
            yr[i] = z;
            if (d) put_bf16x4(d, dim, split, 4 * i, z);
        }
    }
}


/* h += o (o NULL: no add, h only read), y = w * h * rsqrt(mean(h^2) + eps)
 * with one warp per row (a fixed f64 reduction shape per row; y may be h
 * when o is NULL: each lane reads its elements before writing them); with
 * a16 y's row also as bf16 (put_bf16, rows dim * split apart).  The rmsnorm
 * op is this kernel with o = NULL, so the fused op is bitwise add then
 * rmsnorm. */
__global__ void add_rmsnorm_kernel(float *h, const float *o, const float *__restrict__ w, float *y,
                                   __nv_bfloat16 *a16, int split, int64_t rows, int64_t dim, float eps) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * ROW_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    float *hr = h + r * dim;
    double ss = 0.0;
    for (int64_t i = lane; i < dim; i += 32) {
        float v = hr[i];
        if (o) hr[i] = v = __fadd_rn(v, o[r * dim + i]);
        ss += (double)v * v;
    }
    ss = warp_sum_d(ss);
    const float var = (float)(ss / (double)dim), inv = 1.0f / sqrtf(var + eps);
    float *yr = y + r * dim;
    for (int64_t i = lane; i < dim; i += 32) {
        const float v = __fmul_rn(w[i], __fmul_rn(hr[i], inv));
        yr[i] = v;
        if (a16) put_bf16(a16 + r * dim * split, dim, split, i, v);
    }
}

/* The same for wide rows (dim % 4 == 0, 512 <= dim <= 8192): one block of
 * 256 threads per row, the row held in registers (read once, before any
 * write: y may be h when o is NULL), float4 accesses; h, o, y and w 16-byte
 * aligned. */
__global__ void __launch_bounds__(WIDE_THREADS) add_rmsnorm_wide_kernel(float *h, const float *o,
                                                                       const float *__restrict__ w, float *y,
                                                                       __nv_bfloat16 *a16, int split, int64_t dim,
                                                                       float eps) {
    __shared__ double sm[32];
    const int64_t r = blockIdx.x, n4 = dim / 4;
    float4 *hr = reinterpret_cast<float4 *>(h + r * dim);
    const float4 *orow = o ? reinterpret_cast<const float4 *>(o + r * dim) : nullptr;
    float4 v[WIDE_MAX4];
    double ss = 0.0;
#pragma unroll
    for (int u = 0; u < WIDE_MAX4; u++) {
        const int64_t i = threadIdx.x + (int64_t)u * WIDE_THREADS;
        if (i < n4) {
            v[u] = hr[i];
            if (orow) {
                v[u] = add4_rn(v[u], orow[i]);
                hr[i] = v[u];
            }
            ss += sq4(v[u]);
        }
    }
    wide_norm_store(v, ss, sm, n4, dim, eps, w, y + r * dim, a16 ? a16 + r * dim * split : nullptr, split);
}

/* The MoE combine fused with the residual add and the next RMSNorm (ck_moe_combine_norm), one block of
 * 256 threads per token, wide rows only (rmsnorm_wide's shape: dim % 4 == 0, 512 <= dim <= 8192, all
 * pointers 16-byte aligned): token t's k expert rows of yp combined as moe_combine_kernel (moe_combine4:
 * the same products and sums per element), added to h and normed exactly as add_rmsnorm_wide_kernel (the
 * same register layout, f64 sum and block tree), so the result is bitwise the combine into o followed
 * by the add_rmsnorm op; no o is written.  y may be the expert input (its rows were consumed by the
 * products before this kernel runs); a16 as add_rmsnorm_wide_kernel's. */
template <int KT> /* k at compile time (moe_combine4), or 0 */
__global__ void __launch_bounds__(WIDE_THREADS) moe_combine_norm_kernel(
    const float *__restrict__ yp, const int32_t *__restrict__ idx, const float *__restrict__ w,
    const int32_t *__restrict__ slot_pos, int k, float *h, const float *__restrict__ nw, float *y, __nv_bfloat16 *a16,
    int split, int64_t dim, float eps) {
    __shared__ double sm[32];
    __shared__ int64_t row[64];
    __shared__ float ws[64];
    __shared__ int ex[64];
    const int64_t r = blockIdx.x, n4 = dim / 4;
    moe_rank_rows(idx, w, slot_pos, r, k, dim, row, ws, ex);
    float4 *hr = reinterpret_cast<float4 *>(h + r * dim);
    float4 v[WIDE_MAX4];
    double ss = 0.0;
#pragma unroll
    for (int u = 0; u < WIDE_MAX4; u++) {
        const int64_t i = threadIdx.x + (int64_t)u * WIDE_THREADS;
        if (i < n4) {
            const float4 b = moe_combine4<KT>(yp, row, ws, k, 4 * i);
            v[u] = add4_rn(hr[i], b);
            hr[i] = v[u];
            ss += sq4(v[u]);
        }
    }
    wide_norm_store(v, ss, sm, n4, dim, eps, nw, y + r * dim, a16 ? a16 + r * dim * split : nullptr, split);
}

/* q/k per-head RMSNorm then M-RoPE, one token per block: its angles once
 * in shared memory (as rope_kernel), then each of the QKR_WARPS warps takes
 * heads in turn (queries first), reduces the head as add_rmsnorm_kernel does,
 * keeps the normed head in its shared row and writes the rotated pairs
 * back; for heads under 512 floats every value is computed as the rmsnorm
 * op (its one-warp kernel) then rope_kernel compute it (wider heads: the
 * rmsnorm op's block-wide sum, another order).  (One warp per (token, head)
 * with its own angles was faster at 300
 * tokens but recomputed the angles per head: 2x slower at 32,000.) */
/* Head hh of token t in place: query head hh (< nq) of q's row t, else key head hh - nq of k's row t. */
__device__ __forceinline__ float *qk_head(float *q, int64_t qs, float *k, int64_t ks, int64_t t, int nq, int D, int hh) {
    return hh < nq ? q + t * qs + (int64_t)hh * D : k + t * ks + (int64_t)(hh - nq) * D;
}

/* Where head hh of token t goes in the bf16 rows attention reads (ck_rows_to_bf16's layout: q rows of
 * nq * D * split16, k rows of nk * D * split16, [hi | lo]); NULL when not staged. */
__device__ __forceinline__ __nv_bfloat16 *qkr16(__nv_bfloat16 *q16, __nv_bfloat16 *k16, int split16, int64_t t, int nq,
                                               int nk, int D, int hh) {
    if (!q16) return nullptr;
    return hh < nq ? q16 + t * nq * D * split16 + (int64_t)hh * D : k16 + t * nk * D * split16 + (int64_t)(hh - nq) * D;
}

/* M-RoPE of one normed head (buf, D floats; cs: the token's cos | sin) back into x, and into d16 (when
 * set) as put_bf16 writes a value, its lo half one row-half ((nq or nk) * D) later. */
__device__ __forceinline__ void rope_head(float *x, const float *buf, const float *cs, int half, int lane,
                                          __nv_bfloat16 *d16, int nq, int nk, int D, int hh, int split16) {
    const int64_t lo_off = (int64_t)(hh < nq ? nq : nk) * D;
    for (int64_t j = lane; j < half; j += 32) {
        const float c = cs[j], sn = cs[half + j], x1 = buf[j], x2 = buf[j + half];
        const float y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, sn)), y2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, sn));
        x[j] = y1;
        x[j + half] = y2;
        if (d16) put_bf16(d16, lo_off, split16, j, y1), put_bf16(d16, lo_off, split16, j + half, y2);
    }
}

constexpr int QKR_WARPS = 8, QKR_PREFETCH = 5; /* 5 x 8 >= the thinker's 32 + 4 heads */

__global__ void __launch_bounds__(QKR_WARPS * 32) qk_norm_rope_kernel(float *q, int64_t qs, float *k, int64_t ks,
                                                                      int64_t T, int nq, int nk,
                                                                      const float *__restrict__ qw,
                                                                      const float *__restrict__ kw, float eps, int D,
                                                                      const int32_t *__restrict__ pos, int64_t s1,
                                                                      int64_t s2, const float *__restrict__ inv_freq,
                                                                      __nv_bfloat16 *q16, __nv_bfloat16 *k16,
                                                                      int split16) {
    extern __shared__ float qkr_sm[]; /* [D/2] cos, [D/2] sin, then QKR_WARPS rows of D */
    const int64_t t = blockIdx.x;
    const int half = D / 2, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *cs = qkr_sm, *buf = qkr_sm + D + warp * D;
    for (int64_t j = threadIdx.x; j < half; j += blockDim.x) mrope_cos_sin(pos, T, t, j, s1, s2, inv_freq, cs[j], cs[half + j]);
    __syncthreads();
    if (D <= 128) { /* the thinker's heads: QKR_PREFETCH heads' values loaded up front, one memory latency for
                     * them all instead of one per head (the same operations on the same values) */
        for (int hb = warp; hb < nq + nk; hb += QKR_WARPS * QKR_PREFETCH) {
            float v[QKR_PREFETCH][4];
#pragma unroll
            for (int gi = 0; gi < QKR_PREFETCH; gi++) {
                const int hh = hb + gi * QKR_WARPS;
                const float *x = qk_head(q, qs, k, ks, t, nq, D, hh);
#pragma unroll
                for (int u = 0; u < 4; u++) v[gi][u] = hh < nq + nk && lane + 32 * u < D ? x[lane + 32 * u] : 0.0f;
            }
#pragma unroll
            for (int gi = 0; gi < QKR_PREFETCH; gi++) {
                const int hh = hb + gi * QKR_WARPS;
                if (hh >= nq + nk) break;
                float *x = qk_head(q, qs, k, ks, t, nq, D, hh);
                const float *w = hh < nq ? qw : kw;
                double ss = 0.0;
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (lane + 32 * u < D) ss += (double)v[gi][u] * v[gi][u];
                ss = warp_sum_d(ss);
                const float var = (float)(ss / (double)D), inv = 1.0f / sqrtf(var + eps);
                __nv_bfloat16 *d16 = qkr16(q16, k16, split16, t, nq, nk, D, hh);
                if (D == 128) { /* the lane holds both halves of its two rotation pairs (j, j + 64): the
                                 * rotation in registers, rope_head's operations without the row buffer */
                    float nv[4];
#pragma unroll
                    for (int u = 0; u < 4; u++) nv[u] = __fmul_rn(w[lane + 32 * u], __fmul_rn(v[gi][u], inv));
                    const int64_t lo_off = (int64_t)(hh < nq ? nq : nk) * D;
#pragma unroll
                    for (int u = 0; u < 2; u++) {
                        const int j = lane + 32 * u;
                        const float c = cs[j], sn = cs[64 + j], x1 = nv[u], x2 = nv[u + 2];
                        const float y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, sn)),
                                    y2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, sn));
                        x[j] = y1;
                        x[j + 64] = y2;
                        if (d16) put_bf16(d16, lo_off, split16, j, y1), put_bf16(d16, lo_off, split16, j + 64, y2);
                    }
                    continue;
                }
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int i = lane + 32 * u;
                    if (i < D) buf[i] = __fmul_rn(w[i], __fmul_rn(v[gi][u], inv));
                }
                __syncwarp();
                rope_head(x, buf, cs, half, lane, d16, nq, nk, D, hh, split16);
                __syncwarp();
            }
        }
        return;
    }
    for (int hh = warp; hh < nq + nk; hh += QKR_WARPS) {
        float *x = qk_head(q, qs, k, ks, t, nq, D, hh);
        const float *w = hh < nq ? qw : kw;
        double ss = 0.0;
        for (int64_t i = lane; i < D; i += 32) ss += (double)x[i] * x[i];
        ss = warp_sum_d(ss);
        const float var = (float)(ss / (double)D), inv = 1.0f / sqrtf(var + eps);
        for (int64_t i = lane; i < D; i += 32) buf[i] = __fmul_rn(w[i], __fmul_rn(x[i], inv));
        __syncwarp();
        rope_head(x, buf, cs, half, lane, qkr16(q16, k16, split16, t, nq, nk, D, hh), nq, nk, D, hh, split16);
        __syncwarp();
    }
}

__global__ void layernorm_kernel(const float *x, const float *__restrict__ w, const float *__restrict__ b, float *y,
                                 int64_t rows, int64_t dim, float eps) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * ROW_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    const float *xr = x + r * dim;
    float *yr = y + r * dim;
    double s = 0.0;
    for (int64_t i = lane; i < dim; i += 32) s += xr[i];
    const double mean = warp_sum_d(s) / (double)dim;
    double ss = 0.0;
    for (int64_t i = lane; i < dim; i += 32) ss += ((double)xr[i] - mean) * ((double)xr[i] - mean);
    ss = warp_sum_d(ss);
    const float fmean = (float)mean, rstd = 1.0f / sqrtf((float)(ss / (double)dim) + eps);
    for (int64_t i = lane; i < dim; i += 32)
        yr[i] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(xr[i], fmean), rstd), w[i]), b[i]);
}

/* Wide rows as add_rmsnorm_wide_kernel: the row in registers, mean and variance
 * in double with two passes over the registers (as the CPU: mean first). */
__global__ void __launch_bounds__(WIDE_THREADS) layernorm_wide_kernel(const float *x, const float *__restrict__ w,
                                                                     const float *__restrict__ b, float *y,
                                                                     int64_t dim, float eps) {
    __shared__ double sm[32];
    const int64_t r = blockIdx.x, n4 = dim / 4;
    const float4 *xr = reinterpret_cast<const float4 *>(x + r * dim);
    float4 v[WIDE_MAX4];
    double s = 0.0;
#pragma unroll
    for (int u = 0; u < WIDE_MAX4; u++) {
        const int64_t i = threadIdx.x + (int64_t)u * WIDE_THREADS;
        if (i < n4) {
            v[u] = xr[i];
            s += (double)v[u].x + (double)v[u].y + (double)v[u].z + (double)v[u].w;
        }
    }
    const double mean = block_sum_d(s, sm) / (double)dim;
    double ss = 0.0;
#pragma unroll
    for (int u = 0; u < WIDE_MAX4; u++) {
        const int64_t i = threadIdx.x + (int64_t)u * WIDE_THREADS;
        if (i < n4) {
            const double a = v[u].x - mean, bb = v[u].y - mean, c = v[u].z - mean, d = v[u].w - mean;
            ss += a * a + bb * bb + c * c + d * d;
        }
    }
    ss = block_sum_d(ss, sm);
    const float fmean = (float)mean, rstd = 1.0f / sqrtf((float)(ss / (double)dim) + eps);
    const float4 *w4 = reinterpret_cast<const float4 *>(w), *b4 = reinterpret_cast<const float4 *>(b);
    float4 *yr = reinterpret_cast<float4 *>(y + r * dim);
#pragma unroll
    for (int u = 0; u < WIDE_MAX4; u++) {
        const int64_t i = threadIdx.x + (int64_t)u * WIDE_THREADS;
        if (i < n4) {
            const float4 g = w4[i], bb = b4[i];
            yr[i] = make_float4(__fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(v[u].x, fmean), rstd), g.x), bb.x),
                                __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(v[u].y, fmean), rstd), g.y), bb.y),
                                __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(v[u].z, fmean), rstd), g.z), bb.z),
                                __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(v[u].w, fmean), rstd), g.w), bb.w));
        }
    }
}

__global__ void swiglu_kernel(const float *g, const float *u, float *out, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float z = g[i];
        out[i] = silu_mul(z, u[i]);
    }
}

__global__ void add_kernel(const float *a, const float *b, float *y, int64_t rows, int64_t dim, int64_t b_stride) {
    /* blockIdx.y strides over rows: no 64-bit division per element */
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const float *ar = a + r * dim, *br = b + r * b_stride;
        float *yr = y + r * dim;
        for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < dim; c += (int64_t)gridDim.x * blockDim.x)
            yr[c] = __fadd_rn(ar[c], br[c]);
    }
}

__global__ void add_flat4_kernel(const float4 *a, const float4 *b, float4 *y, int64_t n4) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        const float4 p = a[i], q = b[i];
        y[i] = make_float4(__fadd_rn(p.x, q.x), __fadd_rn(p.y, q.y), __fadd_rn(p.z, q.z), __fadd_rn(p.w, q.w));
    }
}

__global__ void gelu_kernel(const float *x, float *y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = x[i];
        y[i] = __fmul_rn(__fmul_rn(v, 0.5f), __fadd_rn(1.0f, erff(__fmul_rn(v, 0.70710678118654752f))));
    }
}

/* One block per span, threads over columns: rows summed in order, then / count. */
__global__ void span_mean_kernel(const float *__restrict__ x, int64_t dim, const int64_t *__restrict__ spans,
                                 float *__restrict__ out) {
    const int64_t i = blockIdx.x, r0 = spans[2 * i], r1 = spans[2 * i + 1];
    const float cnt = (float)(r1 - r0);
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
        float s = 0.0f;
        for (int64_t r = r0; r < r1; r++) s = __fadd_rn(s, x[r * dim + d]);
        out[i * dim + d] = s / cnt;
    }
}

__global__ void pair_features_kernel(const float *__restrict__ F, const int32_t *__restrict__ f_rows,
                                     const float *__restrict__ o, int64_t n, int64_t dim, float *__restrict__ out) {
    const int64_t total = n * dim;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = k / dim, d = k - i * dim;
        const float f = F[(int64_t)f_rows[i] * dim + d], v = o[i * dim + d];
        float *r = out + i * 4 * dim;
        r[d] = f;
        r[dim + d] = v;
        r[2 * dim + d] = __fmul_rn(f, v);
        r[3 * dim + d] = fabsf(__fsub_rn(f, v));
    }
}

/* One block per pair: norms in double, clamped at eps, then the dot of the
 * normalised rows in double (torch's cosine_similarity). */
__global__ void cosine_kernel(const float *__restrict__ a, const int32_t *__restrict__ a_rows,
                              const float *__restrict__ b, int64_t dim, float eps, float *__restrict__ out) {
    __shared__ double sm[32];
    const int64_t i = blockIdx.x, ra = a_rows ? (int64_t)a_rows[i] : i;
    const float *ar = a + ra * dim, *br = b + i * dim;
    double sa = 0.0, sb = 0.0;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
        sa += (double)ar[d] * ar[d];
        sb += (double)br[d] * br[d];
    }
    sa = block_sum_d(sa, sm);
    sb = block_sum_d(sb, sm);
    float na = (float)sqrt(sa), nb = (float)sqrt(sb);
    na = na > eps ? na : eps;
    nb = nb > eps ? nb : eps;
    double dot = 0.0;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dot += (double)(ar[d] / na) * (double)(br[d] / nb);
    dot = block_sum_d(dot, sm);
    if (threadIdx.x == 0) out[i] = (float)dot;
}

} /* namespace */

extern "C" {
cudaError_t ck_image_check(void) {
    cudaFuncAttributes a;
    return cudaFuncGetAttributes(&a, add_flat4_kernel);
}


static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Whether ck_rmsnorm takes the wide kernel for these rows (the fused ops take the same shape). */
static bool rmsnorm_wide(const float *x, const float *w, const float *y, int64_t rows, int64_t dim) {
    return dim % 4 == 0 && dim >= 512 && dim <= 4 * WIDE_THREADS * WIDE_MAX4 && rows <= 0x7fffffffLL && aligned16(x) &&
           aligned16(y) && aligned16(w);
}

cudaError_t ck_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps, cudaStream_t st) {
    if (rows <= 0) return cudaSuccess;
    if (rmsnorm_wide(x, w, y, rows, dim)) {
        /* the add_rmsnorm kernels without an add only read h */
        add_rmsnorm_wide_kernel<<<(unsigned)rows, WIDE_THREADS, 0, st>>>(const_cast<float *>(x), nullptr, w, y,
                                                                          nullptr, 1, dim, eps);
        return cudaGetLastError();
    }
    add_rmsnorm_kernel<<<row_blocks(rows), ROW_WARPS * 32, 0, st>>>(const_cast<float *>(x), nullptr, w, y, nullptr, 1,
                                                                    rows, dim, eps);
    return cudaGetLastError();
}

cudaError_t ck_add_rmsnorm(float *h, const float *o, const float *w, float *y, int64_t rows, int64_t dim, float eps,
                           uint16_t *a16, int split, cudaStream_t st) {
    if (rows <= 0) return cudaSuccess;
    if (split != 1 && split != 2) return cudaErrorInvalidValue;
    __nv_bfloat16 *d = reinterpret_cast<__nv_bfloat16 *>(a16);
    if (rmsnorm_wide(h, w, y, rows, dim)) {
        /* the float4 add and the 8-byte bf16 stores need them; workspaces are aligned */
        if ((o && !aligned16(o)) || ((uintptr_t)a16 & 7)) return cudaErrorInvalidValue;
        add_rmsnorm_wide_kernel<<<(unsigned)rows, WIDE_THREADS, 0, st>>>(h, o, w, y, d, split, dim, eps);
        return cudaGetLastError();
    }
    add_rmsnorm_kernel<<<row_blocks(rows), ROW_WARPS * 32, 0, st>>>(h, o, w, y, d, split, rows, dim, eps);
    return cudaGetLastError();
}

int ck_moe_combine_norm_fits(const float *yp, const float *h, const float *nw, const float *y, int64_t H) {
    return rmsnorm_wide(h, nw, y, 1, H) && aligned16(yp);
}

cudaError_t ck_moe_combine_norm(const float *yp, const int32_t *idx, const float *w, const int32_t *slot_pos,
                                int64_t T, int k, int64_t H, float *h, const float *nw, float *y, uint16_t *a16,
                                int split, float eps, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    if (T > 0x7fffffffLL || k > 64 || k <= 0 || (split != 1 && split != 2) ||
        !ck_moe_combine_norm_fits(yp, h, nw, y, H) || ((uintptr_t)a16 & 7))
        return cudaErrorInvalidValue;
    __nv_bfloat16 *d16 = reinterpret_cast<__nv_bfloat16 *>(a16);
    if (k == 8)
        moe_combine_norm_kernel<8><<<(unsigned)T, WIDE_THREADS, 0, st>>>(yp, idx, w, slot_pos, k, h, nw, y, d16, split,
                                                                         H, eps);
    else
        moe_combine_norm_kernel<0><<<(unsigned)T, WIDE_THREADS, 0, st>>>(yp, idx, w, slot_pos, k, h, nw, y, d16, split,
                                                                         H, eps);
    return cudaGetLastError();
}

cudaError_t ck_qk_norm_rope(float *q, int64_t q_stride, float *k, int64_t k_stride, int64_t T, int nq, int nk,
                            const float *q_w, const float *k_w, float eps, int D, const int32_t *pos, int64_t s1,
                            int64_t s2, const float *inv_freq, uint16_t *q16, uint16_t *k16, int split16,
                            cudaStream_t st) {
    if (T <= 0 || nq + nk <= 0) return cudaSuccess;
    if (D <= 0 || D % 2 || D > 1024 || T > 0x7fffffffLL || (q16 && (!k16 || (split16 != 1 && split16 != 2))))
        return cudaErrorInvalidValue;
    const size_t smem = (size_t)(1 + QKR_WARPS) * (size_t)D * sizeof(float);
    qk_norm_rope_kernel<<<(unsigned)T, QKR_WARPS * 32, smem, st>>>(q, q_stride, k, k_stride, T, nq, nk, q_w, k_w, eps,
                                                                   D, pos, s1, s2, inv_freq,
                                                                   reinterpret_cast<__nv_bfloat16 *>(q16),
                                                                   reinterpret_cast<__nv_bfloat16 *>(k16), split16);
    return cudaGetLastError();
}

cudaError_t ck_layernorm(const float *x, const float *w, const float *b, float *y, int64_t rows, int64_t dim,
                         float eps, cudaStream_t st) {
    if (rows <= 0) return cudaSuccess;
    if (dim % 4 == 0 && dim >= 512 && dim <= 4 * WIDE_THREADS * WIDE_MAX4 && rows <= 0x7fffffffLL && aligned16(x) &&
        aligned16(y) && aligned16(w) && aligned16(b)) {
        layernorm_wide_kernel<<<(unsigned)rows, WIDE_THREADS, 0, st>>>(x, w, b, y, dim, eps);
        return cudaGetLastError();
    }
    layernorm_kernel<<<row_blocks(rows), ROW_WARPS * 32, 0, st>>>(x, w, b, y, rows, dim, eps);
    return cudaGetLastError();
}

cudaError_t ck_swiglu(const float *g, const float *u, float *out, int64_t n, cudaStream_t st) {
    if (n <= 0) return cudaSuccess;
    swiglu_kernel<<<grid_for(n, 256), 256, 0, st>>>(g, u, out, n);
    return cudaGetLastError();
}

/* blockIdx.y = the copy; its blocks stride over it */
__global__ void copy_many_kernel(const ck_copy *__restrict__ list) {
    const ck_copy cp = list[blockIdx.y];
    const size_t stride = (size_t)gridDim.x * blockDim.x, t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if ((((uintptr_t)cp.dst | (uintptr_t)cp.src | cp.bytes) & 15) == 0) {
        uint4 *d = reinterpret_cast<uint4 *>(cp.dst);
        const uint4 *s = reinterpret_cast<const uint4 *>(cp.src);
        for (size_t i = t0; i < cp.bytes / 16; i += stride) d[i] = s[i];
    } else {
        unsigned char *d = reinterpret_cast<unsigned char *>(cp.dst);
        const unsigned char *s = reinterpret_cast<const unsigned char *>(cp.src);
        for (size_t i = t0; i < cp.bytes; i += stride) d[i] = s[i];
    }
}

cudaError_t ck_copy_many(const ck_copy *list, int n, size_t most, cudaStream_t st) {
    if (n <= 0 || most == 0) return cudaSuccess;
    if (n > 65535) { /* grid.y: in chunks */
        for (int i = 0; i < n; i += 65535) {
            cudaError_t e = ck_copy_many(list + i, n - i < 65535 ? n - i : 65535, most, st);
            if (e != cudaSuccess) return e;
        }
        return cudaSuccess;
    }
    const size_t per_block = 256 * 16 * 4; /* four 16-byte vectors a thread */
    const size_t bx = (most + per_block - 1) / per_block;
    dim3 grid((unsigned)(bx < 256 ? bx : 256), (unsigned)n);
    copy_many_kernel<<<grid, 256, 0, st>>>(list);
    return cudaGetLastError();
}

cudaError_t ck_add(const float *a, const float *b, float *y, int64_t rows, int64_t dim, int64_t b_stride,
                   cudaStream_t st) {
    if (rows <= 0 || dim <= 0) return cudaSuccess;
    if (b_stride == dim && (rows * dim) % 4 == 0 && aligned16(a) && aligned16(b) && aligned16(y)) {
        const int64_t n4 = rows * dim / 4;
        add_flat4_kernel<<<grid_for(n4, 256), 256, 0, st>>>(reinterpret_cast<const float4 *>(a),
                                                             reinterpret_cast<const float4 *>(b),
                                                             reinterpret_cast<float4 *>(y), n4);
        return cudaGetLastError();
    }
    const int64_t bx = (dim + 255) / 256;
    dim3 grid((unsigned)(bx < 64 ? bx : 64), (unsigned)(rows < 65535 ? rows : 65535));
    add_kernel<<<grid, 256, 0, st>>>(a, b, y, rows, dim, b_stride);
    return cudaGetLastError();
}

cudaError_t ck_gelu(const float *x, float *y, int64_t n, cudaStream_t st) {
    if (n <= 0) return cudaSuccess;
    gelu_kernel<<<grid_for(n, 256), 256, 0, st>>>(x, y, n);
    return cudaGetLastError();
}

cudaError_t ck_span_mean(const float *x, int64_t dim, const int64_t *spans, int64_t n, float *out, cudaStream_t st) {
    if (n <= 0) return cudaSuccess;
    if (n > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    span_mean_kernel<<<(unsigned)n, 256, 0, st>>>(x, dim, spans, out);
    return cudaGetLastError();
}

cudaError_t ck_pair_features(const float *F, const int32_t *f_rows, const float *o, int64_t n, int64_t dim, float *out,
                             cudaStream_t st) {
    if (n <= 0) return cudaSuccess;
    pair_features_kernel<<<grid_for(n * dim, 256), 256, 0, st>>>(F, f_rows, o, n, dim, out);
    return cudaGetLastError();
}

cudaError_t ck_cosine(const float *a, const int32_t *a_rows, const float *b, int64_t n, int64_t dim, float eps,
                      float *out, cudaStream_t st) {
    if (n <= 0) return cudaSuccess;
    if (n > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    cosine_kernel<<<(unsigned)n, 256, 0, st>>>(a, a_rows, b, dim, eps, out);
    return cudaGetLastError();
}

} /* extern "C" */
