/* cuda_tower.cu — the media towers' ops on the GPU (backend.h "media tower
 * ops"; the CPU versions are in backend/cpu/cpu_tower.c): tanh GELU, the
 * vision 2-D RoPE, the position table's weighted 4-row gather, the
 * 3x3/stride-2 im2col of the audio convolutions and a batched transpose.
 *
 * f32 with the CPU's formulas: products and sums are written with
 * __fmul_rn / __fadd_rn so nothing is fused into an FMA, hence mix_rows,
 * im2col and transpose are bitwise the CPU's, and gelu_tanh / rope_2d differ
 * only by the device's tanhf / cosf / sinf (a few ulp).  Every thread owns
 * its output elements, so results never depend on how many rows run
 * together.  Grid-stride loops over 64-bit element counts.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h"

namespace {

constexpr int THREADS = 256;

unsigned blocks_for(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS;
    if (b < 1) b = 1;
    if (b > 65535LL * 32) b = 65535LL * 32;
    return (unsigned)b;
}

__global__ void gelu_tanh_kernel(const float *x, float *y, int64_t n) {
    const float beta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = x[i], cube = __fmul_rn(__fmul_rn(v, v), v);
        const float t = tanhf(__fmul_rn(beta, __fadd_rn(v, __fmul_rn(kappa, cube))));
        y[i] = __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, t));
    }
}

/* One thread per (row, head, pair i < d/2). */
__global__ void rope_2d_kernel(float *x, int64_t N, int64_t stride, int64_t heads, int64_t d, const int32_t *pos,
                               const float *inv_freq) {
    const int64_t h2 = d / 2, q = d / 4, total = N * heads * h2;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e % h2, hd = (e / h2) % heads, r = e / (h2 * heads);
        const float p = (float)(i < q ? pos[2 * r] : pos[2 * r + 1]);
        const float ang = __fmul_rn(p, inv_freq[i < q ? i : i - q]);
        const float c = cosf(ang), s = sinf(ang);
        float *v = x + r * stride + hd * d;
        const float a = v[i], b = v[i + h2];
        v[i] = __fadd_rn(__fmul_rn(a, c), __fmul_rn(-b, s));
        v[i + h2] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
}

__global__ void mix_rows_kernel(const float *table, int64_t dim, const int32_t *idx, const float *w, int64_t N,
                                float *out) {
    const int64_t total = N * dim;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / dim, k = e % dim;
        const int32_t *ix = idx + 4 * r;
        const float *wr = w + 4 * r;
        float acc = __fmul_rn(table[(int64_t)ix[0] * dim + k], wr[0]);
        acc = __fadd_rn(acc, __fmul_rn(table[(int64_t)ix[1] * dim + k], wr[1]));
        acc = __fadd_rn(acc, __fmul_rn(table[(int64_t)ix[2] * dim + k], wr[2]));
        out[e] = __fadd_rn(acc, __fmul_rn(table[(int64_t)ix[3] * dim + k], wr[3]));
    }
}

/* One thread per (output position, tap, input channel), channel fastest so
 * the reads of neighbouring threads are adjacent. */
__global__ void im2col_3x3s2_kernel(const float *in, int64_t B, int64_t Fi, int64_t Ti, int64_t Ci, float *cols) {
    const int64_t Fo = (Fi + 1) / 2, To = (Ti + 1) / 2, total = B * Fo * To * 9 * Ci;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t ci = e % Ci, tap = (e / Ci) % 9, rr = e / (Ci * 9);
        const int64_t b = rr / (Fo * To), fo = rr / To % Fo, to = rr % To;
        const int64_t fi = 2 * fo - 1 + tap / 3, ti = 2 * to - 1 + tap % 3;
        const bool inside = fi >= 0 && fi < Fi && ti >= 0 && ti < Ti;
        cols[rr * Ci * 9 + ci * 9 + tap] = inside ? in[((b * Fi + fi) * Ti + ti) * Ci + ci] : 0.0f;
    }
}

/* 32x32 tiles through shared memory: coalesced reads and writes. */
__global__ void transpose_kernel(const float *x, int64_t R, int64_t C, float *y) {
    __shared__ float tile[32][33];
    const int64_t b = blockIdx.z, r0 = (int64_t)blockIdx.y * 32, c0 = (int64_t)blockIdx.x * 32;
    const float *xb = x + b * R * C;
    float *yb = y + b * R * C;
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        const int64_t r = r0 + j, c = c0 + threadIdx.x;
        if (r < R && c < C) tile[j][threadIdx.x] = xb[r * C + c];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        const int64_t c = c0 + j, r = r0 + threadIdx.x;
        if (r < R && c < C) yb[c * R + r] = tile[threadIdx.x][j];
    }
}

} // namespace

extern "C" {

cudaError_t ck_gelu_tanh(const float *x, float *y, int64_t n, cudaStream_t st) {
    if (n <= 0) return cudaSuccess;
    gelu_tanh_kernel<<<blocks_for(n), THREADS, 0, st>>>(x, y, n);
    return cudaGetLastError();
}

cudaError_t ck_rope_2d(float *x, int64_t N, int64_t stride, int64_t heads, int64_t d, const int32_t *pos,
                       const float *inv_freq, cudaStream_t st) {
    if (N <= 0 || heads <= 0) return cudaSuccess;
    rope_2d_kernel<<<blocks_for(N * heads * (d / 2)), THREADS, 0, st>>>(x, N, stride, heads, d, pos, inv_freq);
    return cudaGetLastError();
}

cudaError_t ck_mix_rows(const float *table, int64_t dim, const int32_t *idx, const float *w, int64_t N, float *out,
                        cudaStream_t st) {
    if (N <= 0 || dim <= 0) return cudaSuccess;
    mix_rows_kernel<<<blocks_for(N * dim), THREADS, 0, st>>>(table, dim, idx, w, N, out);
    return cudaGetLastError();
}

cudaError_t ck_im2col_3x3s2(const float *in, int64_t B, int64_t Fi, int64_t Ti, int64_t Ci, float *cols,
                            cudaStream_t st) {
    const int64_t n = B * ((Fi + 1) / 2) * ((Ti + 1) / 2) * 9 * Ci;
    if (n <= 0) return cudaSuccess;
    im2col_3x3s2_kernel<<<blocks_for(n), THREADS, 0, st>>>(in, B, Fi, Ti, Ci, cols);
    return cudaGetLastError();
}

cudaError_t ck_transpose(const float *x, int64_t B, int64_t R, int64_t C, float *y, cudaStream_t st) {
    if (B <= 0 || R <= 0 || C <= 0) return cudaSuccess;
    if (B > 65535 || (R + 31) / 32 > 65535 || (C + 31) / 32 > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)((R + 31) / 32), (unsigned)B);
    transpose_kernel<<<grid, dim3(32, 8), 0, st>>>(x, R, C, y);
    return cudaGetLastError();
}

} /* extern "C" */
