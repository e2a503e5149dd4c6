/* cuda_attn.cu — interleaved M-RoPE and attention over packed segments.
 *
 * attn_tc_kernel is a FlashAttention-2-style forward (head sizes 64, 128,
 * and 72 = the vision tower's, padded with zero columns to 80): one block of 4 warps
 * owns 64 query rows of one head of one segment, keeps Q in registers,
 * walks the segment's keys in 64-row tiles (S = Q K^T and O += P V on the
 * tensor cores, bf16 inputs, f32 accumulation) with an online softmax in
 * f32, so no T x T matrix ever exists.  Tiles start at multiples of 64 from
 * the segment's first row, so a record's result does not depend on where it
 * sits in the packed batch.
 *
 * With split = 2 (the precise mode) the same kernel takes Q, K, V as
 * hi + lo bf16 pairs and runs three MMAs per product (see attn_tc_kernel).
 *
 * attn_f32_kernel handles any other head_dim in f32 (the head's single-head
 * summary attention of width W, small test models): one warp per (query
 * row, head), keys in order.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_ptx.cuh"

typedef __nv_bfloat16 bf16;

namespace {

/* ---- RoPE --------------------------------------------------------------- */

/* One block per token: the angles of its D/2 frequencies once (shared
 * memory), then every head's pairs. */
__global__ void rope_kernel(float *x, int64_t T, int64_t heads, int64_t D, const int32_t *__restrict__ pos, int64_t s1,
                            int64_t s2, const float *__restrict__ inv_freq) {
    extern __shared__ float cs[]; /* [D/2] cos, [D/2] sin */
    const int64_t t = blockIdx.x, half = D / 2;
    for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
        /* which position axis frequency j reads (SPEC §6.3) */
        const int axis = (j % 3 == 1 && j < 3 * s1) ? 1 : (j % 3 == 2 && j < 3 * s2) ? 2 : 0;
        const float ang = __fmul_rn((float)pos[axis * T + t], inv_freq[j]);
        cs[j] = cosf(ang);
        cs[half + j] = sinf(ang);
    }
    __syncthreads();
    float *xt = x + t * heads * D;
    for (int64_t i = threadIdx.x; i < heads * half; i += blockDim.x) {
        const int64_t h = i / half, j = i - h * half;
        float *v = xt + h * D;
        const float c = cs[j], sn = cs[half + j], x1 = v[j], x2 = v[j + half];
        v[j] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, sn));
        v[j + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, sn));
    }
}

/* ---- tensor-core flash attention ---------------------------------------- */

constexpr int FA_BM = 64, FA_BN = 64, FA_THREADS = 128;

/* Q, NBUF x (K, V); each of them twice (hi, lo) when split; DP = the head
 * size padded to the MMA's k of 16 */
template <int DP, int SPLIT, int NBUF> constexpr int fa_smem_bytes() {
    return SPLIT * (1 + 2 * NBUF) * FA_BM * (DP + 8) * 2;
}

/* SPLIT = 2: Q, K, V rows are [hi | lo] bf16 pairs (x = hi + lo to 2^-17)
 * and P is split the same way in registers; S = Qh.Kh + Qh.Kl + Ql.Kh and
 * O += Ph.Vh + Ph.Vl + Pl.Vh (the lo.lo term, ~2^-16 relative, is dropped),
 * three MMAs per fragment in that fixed order, f32 accumulation. */
/* D is the head size (a multiple of 8), DP >= D the multiple of 16 the MMAs
 * walk: columns D..DP-1 of every shared tile are zeros, so they add exact
 * zeros to S and produce output columns that are never written (the vision
 * tower's heads of 72 run as 80). */
template <int D, int DP, bool CAUSAL, int SPLIT, int NBUF>
__global__ void __launch_bounds__(FA_THREADS) attn_tc_kernel(const bf16 *__restrict__ Q, const bf16 *__restrict__ K,
                                                             const bf16 *__restrict__ V, float *__restrict__ out,
                                                             int64_t o_stride, const int32_t *__restrict__ tiles,
                                                             const int64_t *__restrict__ q_off,
                                                             const int64_t *__restrict__ kv_off, int nh, int nkv,
                                                             float scale_log2) {
    static_assert(D % 8 == 0 && DP % 16 == 0 && DP >= D && DP - D < 16, "head size padding");
    constexpr int P = DP + 8, CH = D / 8, KD = DP / 16;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* Qs [SPLIT][BM][P]; Kb, Vb [NBUF buffers][SPLIT][BN][P] */
    bf16 *Qs = reinterpret_cast<bf16 *>(smem_raw), *Kb = Qs + SPLIT * FA_BM * P, *Vb = Kb + NBUF * SPLIT * FA_BN * P;
    constexpr int TP = FA_BN * P; /* one tile */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
    const int s = tiles[2 * blockIdx.x], i0 = tiles[2 * blockIdx.x + 1], h = blockIdx.y;
    const int64_t q0 = q_off[s], ql = q_off[s + 1] - q0, kv0 = kv_off[s], kl = kv_off[s + 1] - kv0;
    const int hk = h / (nh / nkv);
    const int64_t qrs = (int64_t)SPLIT * nh * D, krs = (int64_t)SPLIT * nkv * D; /* row strides */
    if (DP > D) { /* zero the pad columns of every tile once; the loads below never touch them */
        constexpr int PADW = DP > D ? (DP - D) / 2 : 1; /* 32-bit words per row */
        uint32_t *all = reinterpret_cast<uint32_t *>(smem_raw);
        const int rows = SPLIT * (1 + 2 * NBUF) * FA_BM;
        for (int c = tid; c < rows * PADW; c += FA_THREADS)
            all[((c / PADW) * P + D) / 2 + c % PADW] = 0u;
    }

    for (int c = tid; c < FA_BM * CH; c += FA_THREADS) {
        const int r = c / CH, col = (c % CH) * 8;
        const bool ok = i0 + r < ql;
        const int64_t off = (q0 + i0 + r) * qrs + (int64_t)h * D + col;
        cp_async16(Qs + r * P + col, ok ? Q + off : Q, ok);
        if (SPLIT == 2) cp_async16(Qs + TP + r * P + col, ok ? Q + off + (int64_t)nh * D : Q, ok);
    }
    cp_async_commit();
    /* K/V tile j into buffer j & 1; rows past the segment are zeros (P = 0 there, 0 * 0 stays finite) */
    auto load_kv = [&](int64_t j0, int buf) {
        bf16 *Ks = Kb + buf * SPLIT * TP, *Vs = Vb + buf * SPLIT * TP;
        for (int c = tid; c < FA_BN * CH; c += FA_THREADS) {
            const int r = c / CH, col = (c % CH) * 8;
            const bool ok = j0 + r < kl;
            const int64_t off = (kv0 + j0 + r) * krs + (int64_t)hk * D + col;
            cp_async16(Ks + r * P + col, ok ? K + off : K, ok);
            cp_async16(Vs + r * P + col, ok ? V + off : V, ok);
            if (SPLIT == 2) {
                const int64_t lo = (int64_t)nkv * D;
                cp_async16(Ks + TP + r * P + col, ok ? K + off + lo : K, ok);
                cp_async16(Vs + TP + r * P + col, ok ? V + off + lo : V, ok);
            }
        }
        cp_async_commit();
    };

    const int64_t n_keys = CAUSAL ? (kl < i0 + FA_BM ? kl : i0 + FA_BM) : kl;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float o[DP / 8][4];
#pragma unroll
    for (int i = 0; i < DP / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    uint32_t qf[KD][4]; /* Q (hi) fragments, kept in registers; the lo half is re-read from Qs per tile */
    const int r0 = warp * 16 + g; /* this thread's rows r0 and r0 + 8 of the tile */

    if (n_keys > 0) load_kv(0, 0);
    for (int64_t j0 = 0; j0 < n_keys; j0 += FA_BN) {
        const int buf = NBUF == 2 ? (int)((j0 / FA_BN) & 1) : 0;
        if (NBUF == 2) {
            __syncthreads(); /* everyone is done with the buffer the next tile goes to */
            if (j0 + FA_BN < n_keys) {
                load_kv(j0 + FA_BN, buf ^ 1); /* in flight while this tile is computed */
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
        } else {
            cp_async_wait<0>(); /* one buffer: tile j0 was issued after the previous tile's compute */
        }
        __syncthreads();
        const bf16 *Ks = Kb + buf * SPLIT * TP, *Vs = Vb + buf * SPLIT * TP;
        if (j0 == 0) {
#pragma unroll
            for (int kk = 0; kk < KD; kk++)
                ldsm_x4(qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3],
                        Qs + (warp * 16 + (lane & 15)) * P + kk * 16 + (lane >> 4) * 8);
        }
        float sa[8][4];
#pragma unroll
        for (int i = 0; i < 8; i++) sa[i][0] = sa[i][1] = sa[i][2] = sa[i][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            uint32_t ql[4] = {0u, 0u, 0u, 0u};
            if (SPLIT == 2)
                ldsm_x4(ql[0], ql[1], ql[2], ql[3], Qs + TP + (warp * 16 + (lane & 15)) * P + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int nj = 0; nj < 4; nj++) {
                uint32_t b0, b1, b2, b3;
                const int koff = (nj * 16 + (lane & 7) + ((lane >> 4) << 3)) * P + kk * 16 + ((lane >> 3) & 1) * 8;
                ldsm_x4(b0, b1, b2, b3, Ks + koff);
                mma16816(sa[2 * nj], qf[kk], b0, b1);
                mma16816(sa[2 * nj + 1], qf[kk], b2, b3);
                if (SPLIT == 2) {
                    uint32_t c0, c1, c2, c3;
                    ldsm_x4(c0, c1, c2, c3, Ks + TP + koff);
                    mma16816(sa[2 * nj], qf[kk], c0, c1); /* Qh . Kl */
                    mma16816(sa[2 * nj + 1], qf[kk], c2, c3);
                    mma16816(sa[2 * nj], ql, b0, b1); /* Ql . Kh */
                    mma16816(sa[2 * nj + 1], ql, b2, b3);
                }
            }
        }
        /* scale (log2 domain), mask, online softmax */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int64_t key = j0 + nt * 8 + tig * 2 + (q & 1), qi = i0 + r0 + (q >> 1) * 8;
                float v = sa[nt][q] * scale_log2;
                if (key >= kl || (CAUSAL && key > qi)) v = -INFINITY;
                sa[nt][q] = v;
                mx[q >> 1] = fmaxf(mx[q >> 1], v);
            }
        float base[2], alpha[2];
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
            mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
            const float mnew = fmaxf(m[hh], mx[hh]);
            base[hh] = mnew == -INFINITY ? 0.0f : mnew; /* a fully masked row stays finite */
            alpha[hh] = exp2f(m[hh] - base[hh]);
            m[hh] = mnew;
        }
        float rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float p = exp2f(sa[nt][q] - base[q >> 1]);
                sa[nt][q] = p;
                rs[q >> 1] += p;
            }
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            rs[hh] += __shfl_xor_sync(0xffffffffu, rs[hh], 1);
            rs[hh] += __shfl_xor_sync(0xffffffffu, rs[hh], 2);
            l[hh] = l[hh] * alpha[hh] + rs[hh];
        }
#pragma unroll
        for (int i = 0; i < DP / 8; i++) {
            o[i][0] *= alpha[0];
            o[i][1] *= alpha[0];
            o[i][2] *= alpha[1];
            o[i][3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < FA_BN / 16; kk++) {
            const uint32_t pa[4] = {pack_bf16(sa[2 * kk][0], sa[2 * kk][1]), pack_bf16(sa[2 * kk][2], sa[2 * kk][3]),
                                    pack_bf16(sa[2 * kk + 1][0], sa[2 * kk + 1][1]),
                                    pack_bf16(sa[2 * kk + 1][2], sa[2 * kk + 1][3])};
            uint32_t pl[4] = {0u, 0u, 0u, 0u};
            if (SPLIT == 2) { /* p - bf16(p), element by element */
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const float *src = sa[2 * kk + (u >> 1)] + (u & 1) * 2;
                    const __nv_bfloat162 hb = *reinterpret_cast<const __nv_bfloat162 *>(&pa[u]);
                    pl[u] = pack_bf16(src[0] - __low2float(hb), src[1] - __high2float(hb));
                }
            }
#pragma unroll
            for (int dn = 0; dn < DP / 16; dn++) {
                uint32_t b0, b1, b2, b3;
                const int voff = (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + dn * 16 + (lane >> 4) * 8;
                ldsm_x4_t(b0, b1, b2, b3, Vs + voff);
                mma16816(o[2 * dn], pa, b0, b1);
                mma16816(o[2 * dn + 1], pa, b2, b3);
                if (SPLIT == 2) {
                    uint32_t c0, c1, c2, c3;
                    ldsm_x4_t(c0, c1, c2, c3, Vs + TP + voff);
                    mma16816(o[2 * dn], pa, c0, c1); /* Ph . Vl */
                    mma16816(o[2 * dn + 1], pa, c2, c3);
                    mma16816(o[2 * dn], pl, b0, b1); /* Pl . Vh */
                    mma16816(o[2 * dn + 1], pl, b2, b3);
                }
            }
        }
        if (NBUF == 1 && j0 + FA_BN < n_keys) {
            __syncthreads(); /* everyone is done with the buffer */
            load_kv(j0 + FA_BN, 0);
        }
    }
    const float inv[2] = {l[0] > 0.0f ? 1.0f / l[0] : 0.0f, l[1] > 0.0f ? 1.0f / l[1] : 0.0f};
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int r = r0 + hh * 8;
        if (i0 + r >= ql) continue;
        float *orow = out + (q0 + i0 + r) * o_stride + (int64_t)h * D;
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            orow[dt * 8 + tig * 2] = o[dt][hh * 2] * inv[hh];
            orow[dt * 8 + tig * 2 + 1] = o[dt][hh * 2 + 1] * inv[hh];
        }
    }
}

/* ---- f32 attention ------------------------------------------------------ */

constexpr int F32_WARPS = 4;

__global__ void __launch_bounds__(F32_WARPS * 32) attn_f32_kernel(
    const float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v, float *__restrict__ out,
    int64_t q_stride, int64_t k_stride, int64_t v_stride, int64_t o_stride, const int64_t *__restrict__ q_off,
    const int64_t *__restrict__ kv_off, int64_t n_seg, int64_t n_rows, int nh, int nkv, int D, float scale,
    int causal) {
    extern __shared__ float fsm[]; /* [F32_WARPS][2][D]: query row, accumulator */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t gw = (int64_t)blockIdx.x * F32_WARPS + warp;
    if (gw >= n_rows * nh) return;
    const int64_t row = gw / nh;
    const int h = (int)(gw % nh), hk = h / (nh / nkv);
    int64_t lo = 0, hi = n_seg - 1; /* the last segment starting at or before row */
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (q_off[mid] <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int64_t i = row - q_off[lo], kv0 = kv_off[lo], kl = kv_off[lo + 1] - kv0;
    const int64_t nk = causal ? i + 1 : kl;
    float *qs = fsm + (size_t)warp * 2 * D, *acc = qs + D;
    for (int d = lane; d < D; d += 32) {
        qs[d] = q[row * q_stride + (int64_t)h * D + d];
        acc[d] = 0.0f;
    }
    float m = -INFINITY, lsum = 0.0f;
    for (int64_t j = 0; j < nk; j++) {
        const float *kr = k + (kv0 + j) * k_stride + (int64_t)hk * D;
        float part = 0.0f;
        for (int d = lane; d < D; d += 32) part = fmaf(qs[d], kr[d], part);
        for (int o = 16; o; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o); /* same sum in every lane */
        const float sc = part * scale, mnew = fmaxf(m, sc);
        const float c = expf(m - mnew), p = expf(sc - mnew);
        lsum = lsum * c + p;
        const float *vr = v + (kv0 + j) * v_stride + (int64_t)hk * D;
        for (int d = lane; d < D; d += 32) acc[d] = acc[d] * c + p * vr[d];
        m = mnew;
    }
    const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
    for (int d = lane; d < D; d += 32) out[row * o_stride + (int64_t)h * D + d] = acc[d] * inv;
}

/* Raise a kernel's dynamic shared memory limit once per device. */
template <typename F> cudaError_t allow_smem(F *fn, int bytes, unsigned *done_mask) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev < 32 && (*done_mask >> dev) & 1u) return cudaSuccess;
    e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess && dev < 32) *done_mask |= 1u << dev;
    return e;
}

template <int D, int DP, bool CAUSAL, int SPLIT, int NBUF>
cudaError_t launch_tc(const bf16 *q, const bf16 *k, const bf16 *v, float *out, int64_t o_stride, const int32_t *tiles,
                      int64_t n_tiles, const int64_t *q_off, const int64_t *kv_off, int nh, int nkv, float scale_log2,
                      cudaStream_t st) {
    static unsigned done = 0;
    constexpr int smem = fa_smem_bytes<DP, SPLIT, NBUF>();
    cudaError_t e = allow_smem(attn_tc_kernel<D, DP, CAUSAL, SPLIT, NBUF>, smem, &done);
    if (e != cudaSuccess) return e;
    dim3 grid((unsigned)n_tiles, (unsigned)nh);
    attn_tc_kernel<D, DP, CAUSAL, SPLIT, NBUF><<<grid, FA_THREADS, smem, st>>>(q, k, v, out, o_stride, tiles, q_off, kv_off, nh,
                                                                    nkv, scale_log2);
    return cudaGetLastError();
}

template <int D, int DP>
cudaError_t launch_tc_d(const bf16 *q, const bf16 *k, const bf16 *v, float *out, int64_t o_stride,
                        const int32_t *tiles, int64_t n_tiles, const int64_t *q_off, const int64_t *kv_off, int nh,
                        int nkv, float sl2, int causal, int split, int one_buf, cudaStream_t st) {
    if (split == 2 && one_buf)
        return causal ? launch_tc<D, DP, true, 2, 1>(q, k, v, out, o_stride, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, st)
                      : launch_tc<D, DP, false, 2, 1>(q, k, v, out, o_stride, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2,
                                                  st);
    if (split == 2)
        return causal ? launch_tc<D, DP, true, 2, 2>(q, k, v, out, o_stride, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, st)
                      : launch_tc<D, DP, false, 2, 2>(q, k, v, out, o_stride, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2,
                                                  st);
    return causal ? launch_tc<D, DP, true, 1, 2>(q, k, v, out, o_stride, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, st)
                  : launch_tc<D, DP, false, 1, 2>(q, k, v, out, o_stride, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, st);
}

} /* namespace */

extern "C" {

cudaError_t ck_rope(float *x, int64_t T, int64_t heads, int64_t D, const int32_t *pos, int64_t s1, int64_t s2,
                    const float *inv_freq, cudaStream_t st) {
    if (T <= 0 || heads <= 0) return cudaSuccess;
    if (T > 0x7fffffffLL || D > 4096) return cudaErrorInvalidConfiguration;
    rope_kernel<<<(unsigned)T, 128, (size_t)D * sizeof(float), st>>>(x, T, heads, D, pos, s1, s2, inv_freq);
    return cudaGetLastError();
}

cudaError_t ck_attn_tc(const uint16_t *q, const uint16_t *k, const uint16_t *v, float *out, int64_t o_stride,
                       const int32_t *tiles, int64_t n_tiles, const int64_t *q_off, const int64_t *kv_off, int nh,
                       int nkv, int D, float scale, int causal, int split, cudaStream_t st) {
    if (n_tiles <= 0) return cudaSuccess;
    if (split != 1 && split != 2 && split != 3) return cudaErrorInvalidValue;
    const int one_buf = split == 3; /* split 3: the split kernel with one K/V buffer (two blocks per SM fit) */
    if (split == 3) split = 2;
    if (n_tiles > 0x7fffffffLL || nh > 65535) return cudaErrorInvalidConfiguration;
    const bf16 *Q = reinterpret_cast<const bf16 *>(q), *K = reinterpret_cast<const bf16 *>(k),
               *V = reinterpret_cast<const bf16 *>(v);
    const float sl2 = scale * 1.4426950408889634f;
    if (D == 128)
        return launch_tc_d<128, 128>(Q, K, V, out, o_stride, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, causal, split,
                                one_buf, st);
    if (D == 64)
        return launch_tc_d<64, 64>(Q, K, V, out, o_stride, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, causal, split,
                                   one_buf, st);
    if (D == 72) /* the vision tower's heads (1152 / 16) */
        return launch_tc_d<72, 80>(Q, K, V, out, o_stride, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, causal, split,
                                   one_buf, st);
    return cudaErrorInvalidValue;
}

cudaError_t ck_attn_f32(const float *q, const float *k, const float *v, float *out, int64_t q_stride,
                        int64_t k_stride, int64_t v_stride, int64_t o_stride, const int64_t *q_off,
                        const int64_t *kv_off, int64_t n_seg, int64_t n_rows, int nh, int nkv, int D, float scale,
                        int causal, cudaStream_t st) {
    if (n_rows <= 0 || n_seg <= 0) return cudaSuccess;
    const int64_t warps = n_rows * nh, blocks = (warps + F32_WARPS - 1) / F32_WARPS;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    const size_t smem = (size_t)F32_WARPS * 2 * (size_t)D * sizeof(float);
    if (smem > 48 * 1024) { /* rare (head_dim > 1536): set for this size each time */
        if (smem > 200 * 1024) return cudaErrorInvalidValue;
        cudaError_t e = cudaFuncSetAttribute(attn_f32_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    attn_f32_kernel<<<(unsigned)blocks, F32_WARPS * 32, smem, st>>>(q, k, v, out, q_stride, k_stride, v_stride,
                                                                     o_stride, q_off, kv_off, n_seg, n_rows, nh, nkv,
                                                                     D, scale, causal);
    return cudaGetLastError();
}

} /* extern "C" */
