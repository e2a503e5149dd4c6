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
 * Causal segments may have more keys than queries (kl > ql: the first
 * kl - ql keys are a cached prefix, engine/state_cache.h): query i is then
 * key position i + kl - ql.  A row's value depends only on that position and
 * on the key tiles (multiples of 64, or 32, from the segment's first key): a
 * tile past a row's position adds p = 0 exactly and rescales by exactly 1,
 * so where the query tiles start (another multiple of 64 with a prefix)
 * changes no bit.
 *
 * With split = 2 (the precise mode) the same kernel takes Q, K, V as
 * hi + lo bf16 pairs and runs three MMAs per product (see attn_tc_kernel).
 * attn2_kernel (v2, the default; CLEF_CUDA_ATTN=v1 selects attn_tc_kernel)
 * is the same algorithm reorganised for throughput: 128-row blocks in the
 * fast mode, masks only where needed, skipped causal tiles (see there).
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
    for (int64_t j = threadIdx.x; j < half; j += blockDim.x) mrope_cos_sin(pos, T, t, j, s1, s2, inv_freq, cs[j], cs[half + j]);
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

/* Two adjacent outputs (columns col, col + 1 of head h) of query row `row` also as the bf16 rows the
 * next product reads, when dst.out16 is set: ck_rows_to_bf16's values of the f32 outputs (hi, and with
 * split16 = 2 lo = bf16(v - hi) nh * D later in the row), so the o product skips its conversion. */
__device__ __forceinline__ void put_o16(const ck_attn_out &dst, int64_t row, int nh, int D, int h, int col, float v0,
                                        float v1) {
    if (!dst.out16) return;
    bf16 *r = reinterpret_cast<bf16 *>(dst.out16) + row * (int64_t)nh * D * dst.split16 + (int64_t)h * D + col;
    const uint32_t hi = pack_bf16(v0, v1);
    *reinterpret_cast<uint32_t *>(r) = hi;
    if (dst.split16 == 2) *reinterpret_cast<uint32_t *>(r + (int64_t)nh * D) = pack_bf16_rest(v0, v1, hi);
}

/* Pieces shared by attn_tc_kernel and attn2_kernel (THREADS threads; tile rows P bf16 apart, CH = D / 8
 * 16-byte chunks per row). */

/* Zero pad columns D..DP-1 of the `rows` shared rows at smem once (the loads never touch them). */
template <int D, int DP, int P, int THREADS>
__device__ __forceinline__ void fa_zero_pad(unsigned char *smem, int rows, int tid) {
    if (DP > D) {
        constexpr int PADW = DP > D ? (DP - D) / 2 : 1; /* 32-bit words per row */
        uint32_t *all = reinterpret_cast<uint32_t *>(smem);
        for (int c = tid; c < rows * PADW; c += THREADS) all[((c / PADW) * P + D) / 2 + c % PADW] = 0u;
    }
}

/* cp.async of the BM x D query tile of head h, rows i0.. of the segment at row q0 (ql rows; rows past it
 * zero-filled; Q rows qrs apart) into Qs, with SPLIT = 2 the lo halves (nh * D later in a row) into the
 * tile qt elements later.  I: the kernel's integer type of i0 and ql. */
template <int SPLIT, int CH, int P, int THREADS, int BM, class I>
__device__ __forceinline__ void fa_load_q(bf16 *Qs, int qt, const bf16 *__restrict__ Q, int64_t q0, I i0, I ql,
                                          int64_t qrs, int nh, int h, int D, int tid) {
    for (int c = tid; c < BM * CH; c += THREADS) {
        const int r = c / CH, col = (c % CH) * 8;
        const bool ok = i0 + r < ql;
        const int64_t off = (q0 + i0 + r) * qrs + (int64_t)h * D + col;
        cp_async16(Qs + r * P + col, ok ? Q + off : Q, ok);
        if (SPLIT == 2) cp_async16(Qs + qt + r * P + col, ok ? Q + off + (int64_t)nh * D : Q, ok);
    }
}

/* cp.async of the BN-row K and V tiles of kv head hk, keys j0.. of the segment at row kv0 (kl keys; rows
 * past it zero-filled; rows krs apart) into Ks and Vs, with SPLIT = 2 the lo halves (nkv * D later in a
 * row) into the tiles tp elements later.  One 16-byte chunk per thread per step. */
template <int SPLIT, int CH, int P, int THREADS, int BN, class I>
__device__ __forceinline__ void fa_load_kv(bf16 *Ks, bf16 *Vs, int tp, const bf16 *__restrict__ K,
                                           const bf16 *__restrict__ V, int64_t kv0, I j0, I kl, int64_t krs, int nkv,
                                           int hk, int D, int tid) {
    for (int c = tid; c < BN * CH; c += THREADS) {
        const int r = c / CH, col = (c % CH) * 8;
        const bool ok = j0 + r < kl;
        const int64_t off = (kv0 + j0 + r) * krs + (int64_t)hk * D + col;
        cp_async16(Ks + r * P + col, ok ? K + off : K, ok);
        cp_async16(Vs + r * P + col, ok ? V + off : V, ok);
        if (SPLIT == 2) {
            const int64_t lo = (int64_t)nkv * D;
            cp_async16(Ks + tp + r * P + col, ok ? K + off + lo : K, ok);
            cp_async16(Vs + tp + r * P + col, ok ? V + off + lo : V, ok);
        }
    }
}

/* P of one 16-key chunk as bf16 A fragments from two m16n8 score fragments s0, s1: pa = bf16(p), with
 * SPLIT = 2 also pl = bf16(p - pa), element by element. */
template <int SPLIT>
__device__ __forceinline__ void fa_p_frags(const float *s0, const float *s1, uint32_t (&pa)[4], uint32_t *pl) {
    pa[0] = pack_bf16(s0[0], s0[1]);
    pa[1] = pack_bf16(s0[2], s0[3]);
    pa[2] = pack_bf16(s1[0], s1[1]);
    pa[3] = pack_bf16(s1[2], s1[3]);
    if (SPLIT == 2) {
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const float *src = (u >> 1 ? s1 : s0) + (u & 1) * 2;
            pl[u] = pack_bf16_rest(src[0], src[1], pa[u]);
        }
    }
}

/* Query row `row` (of the packed batch) of head h: its D / 8 pairs of outputs o[dt][2 hh], o[dt][2 hh + 1]
 * (columns 8 dt + 2 tig, + 1) times inv into dst.out, and as bf16 into dst.out16 (put_o16). */
template <int D, int NO>
__device__ __forceinline__ void fa_store_row(const ck_attn_out &dst, int64_t row, int nh, int h, int tig, int hh,
                                             const float (&o)[NO][4], float inv) {
    float *orow = dst.out + row * dst.stride + (int64_t)h * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
        const float v0 = o[dt][hh * 2] * inv, v1 = o[dt][hh * 2 + 1] * inv;
        orow[dt * 8 + tig * 2] = v0;
        orow[dt * 8 + tig * 2 + 1] = v1;
        put_o16(dst, row, nh, D, h, dt * 8 + tig * 2, v0, v1);
    }
}

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
                                                             const bf16 *__restrict__ V, const ck_attn_out dst,
                                                              const int32_t *__restrict__ tiles,
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
    /* causal with a cached prefix (kl > ql): query i is key position i + pre */
    const int64_t pre = CAUSAL ? kl - ql : 0;
    const int64_t qrs = (int64_t)SPLIT * nh * D, krs = (int64_t)SPLIT * nkv * D; /* row strides */
    fa_zero_pad<D, DP, P, FA_THREADS>(smem_raw, SPLIT * (1 + 2 * NBUF) * FA_BM, tid);
    fa_load_q<SPLIT, CH, P, FA_THREADS, FA_BM>(Qs, TP, Q, q0, (int64_t)i0, ql, qrs, nh, h, D, tid);
    cp_async_commit();
    /* K/V tile j into buffer j & 1; rows past the segment are zeros (P = 0 there, 0 * 0 stays finite) */
    auto load_kv = [&](int64_t j0, int buf) {
        fa_load_kv<SPLIT, CH, P, FA_THREADS, FA_BN>(Kb + buf * SPLIT * TP, Vb + buf * SPLIT * TP, TP, K, V, kv0, j0,
                                                    kl, krs, nkv, hk, D, tid);
        cp_async_commit();
    };

    const int64_t n_keys = CAUSAL ? (kl < pre + i0 + FA_BM ? kl : pre + i0 + FA_BM) : kl;
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
                const int64_t key = j0 + nt * 8 + tig * 2 + (q & 1), qi = pre + i0 + r0 + (q >> 1) * 8;
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
            uint32_t pa[4], pl[4] = {0u, 0u, 0u, 0u};
            fa_p_frags<SPLIT>(sa[2 * kk], sa[2 * kk + 1], pa, pl);
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
        fa_store_row<D>(dst, q0 + i0 + r, nh, h, tig, hh, o, inv[hh]);
    }
}

/* ---- tensor-core flash attention, v2 ------------------------------------- */

/* attn2_kernel: the same algorithm and numerics contract as attn_tc_kernel,
 * reorganised for throughput (CLEF_CUDA_ATTN=v1 selects the kernel above):
 *  - MT m16 tiles per warp: with MT = 2 a block of 4 warps owns 128 query rows
 *    (32 per warp), so every K / V fragment read from shared memory feeds two
 *    MMAs instead of one and every K / V tile fetched from L2 serves twice the
 *    rows; Q is then re-read from shared memory per tile (registers hold the
 *    two O accumulators of 32 x DP instead);
 *  - the mask is applied only on the tiles that need it (the causal diagonal,
 *    the segment's last partial tile), and a warp skips a causal tile that
 *    lies wholly above its rows (its rows' result would not change: such a
 *    tile adds p = 0 exactly and rescales by exp2(0) = 1);
 *  - exp2f(s * scale_log2 - max * scale_log2) as one FFMA per score, the
 *    running max kept on the raw scores (scale_log2 > 0); O is rescaled only
 *    when a row's max moved (a factor of exactly 1 otherwise);
 *  - a 1-D grid with the query heads fastest: the 8 query heads of a KV head
 *    run side by side on the same K / V tiles (L2 hits), heaviest tiles first.
 * Batch invariance is as in v1: a block holds rows of one segment, K / V tiles
 * start at multiples of 64 from the segment's first key, and which tiles a
 * warp computes or masks depends only on positions within the segment. */
constexpr int FA2_THREADS = 128;

/* keys per K / V tile: 32 with two m tiles per warp (the scores of 32 x 64 would leave too few
 * registers next to the 32 x DP accumulator: spills), else 64 */
template <int MT> __host__ __device__ constexpr int fa2_bn() { return MT == 2 ? 32 : 64; }

template <int DP, int SPLIT, int NBUF, int MT, int BNK> constexpr int fa2_smem_bytes() {
    return SPLIT * (64 * MT + 2 * NBUF * BNK) * (DP + 8) * 2;
}

/* BNK: keys per K / V tile (fa2_bn by default).  MT = 1 with BNK = 32 is v2s: the fast mode's 32-key
 * tiles under 64-row blocks, every row's operations those of MT = 2 on the same tiles (bitwise v2), for
 * calls of too few 128-row blocks to fill the device. */
template <int D, int DP, bool CAUSAL, int SPLIT, int NBUF, int MT, int BNK = fa2_bn<MT>()>
__global__ void __launch_bounds__(FA2_THREADS) attn2_kernel(const bf16 *__restrict__ Q, const bf16 *__restrict__ K,
                                                            const bf16 *__restrict__ V, const ck_attn_out dst,
                                                             const int32_t *__restrict__ tiles,
                                                            const int64_t *__restrict__ q_off,
                                                            const int64_t *__restrict__ kv_off, int nh, int nkv,
                                                            float scale_log2) {
    static_assert(D % 8 == 0 && DP % 16 == 0 && DP >= D && DP - D < 16, "head size padding");
    constexpr int BM = 64 * MT, BN = BNK, NT = BN / 8, P = DP + 8, CH = D / 8, KD = DP / 16, WR = 16 * MT;
    constexpr bool QREG = MT == 1; /* one m tile: Q (hi) fragments stay in registers as in v1 */
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* Qs [SPLIT][BM][P]; Kb, Vb [NBUF buffers][SPLIT][BN][P] */
    constexpr int QT = BM * P, TP = BN * P; /* one Q tile, one K or V tile */
    bf16 *Qs = reinterpret_cast<bf16 *>(smem_raw), *Kb = Qs + SPLIT * QT, *Vb = Kb + NBUF * SPLIT * TP;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
    const int tile = (int)(blockIdx.x / (unsigned)nh), h = (int)(blockIdx.x % (unsigned)nh);
    const int s = tiles[2 * tile], i0 = tiles[2 * tile + 1];
    /* positions within a segment fit in int (the host checks kl <= INT32_MAX) */
    const int64_t q0 = q_off[s], kv0 = kv_off[s];
    const int ql = (int)(q_off[s + 1] - q0), kl = (int)(kv_off[s + 1] - kv0);
    const int pre = CAUSAL ? kl - ql : 0; /* causal with a cached prefix (kl > ql): query i is key i + pre */
    const int hk = h / (nh / nkv);
    const int64_t qrs = (int64_t)SPLIT * nh * D, krs = (int64_t)SPLIT * nkv * D; /* row strides */
    fa_zero_pad<D, DP, P, FA2_THREADS>(smem_raw, SPLIT * (BM + 2 * NBUF * BN), tid);
    fa_load_q<SPLIT, CH, P, FA2_THREADS, BM>(Qs, QT, Q, q0, i0, ql, qrs, nh, h, D, tid);
    cp_async_commit();
    /* K/V tile j into buffer buf; rows past the segment are zeros (P = 0 there, 0 * 0 stays finite) */
    /* a thread copies the same 16-byte column of rows r, r + RS, ... when CH divides the block
     * (D = 64, 128): one row offset per tile instead of one per copy, which keeps registers free */
    constexpr bool REG = FA2_THREADS % CH == 0;
    constexpr int RS = REG ? FA2_THREADS / CH : 1;
    const int kr0 = tid / CH, kcol = (tid % CH) * 8;
    auto load_kv = [&](int j0, int buf) {
        bf16 *Ks = Kb + buf * SPLIT * TP, *Vs = Vb + buf * SPLIT * TP;
        const int64_t lo = (int64_t)nkv * D;
        if (REG) {
            const int64_t off = (kv0 + j0 + kr0) * krs + (int64_t)hk * D + kcol;
#pragma unroll
            for (int i = 0; i < (REG ? BN / RS : 1); i++) {
                const int r = kr0 + i * RS;
                const bool ok = j0 + r < kl;
                const int64_t oi = off + (int64_t)i * RS * krs;
                cp_async16(Ks + r * P + kcol, ok ? K + oi : K, ok);
                cp_async16(Vs + r * P + kcol, ok ? V + oi : V, ok);
                if (SPLIT == 2) {
                    cp_async16(Ks + TP + r * P + kcol, ok ? K + oi + lo : K, ok);
                    cp_async16(Vs + TP + r * P + kcol, ok ? V + oi + lo : V, ok);
                }
            }
        } else {
            fa_load_kv<SPLIT, CH, P, FA2_THREADS, BN>(Ks, Vs, TP, K, V, kv0, j0, kl, krs, nkv, hk, D, tid);
        }
        cp_async_commit();
    };

    const int n_keys = CAUSAL ? (kl - pre - i0 < BM ? kl : pre + i0 + BM) : kl;
    const int wr0 = warp * WR;      /* this warp's first row in the block */
    const int wq0 = pre + i0 + wr0; /* ... as a key position within the segment */
    float m[MT][2], l[MT][2];           /* running max (raw scores) and sum, rows g and g + 8 of each m tile */
    float o[MT][DP / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int i = 0; i < DP / 8; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
    }
    uint32_t qf[QREG ? KD : 1][4]; /* MT = 1: Q (hi) fragments, loaded on the first tile */
    const int arow = (lane & 15) * P + (lane >> 4) * 8; /* ldmatrix A-operand address within an m tile */

    if (n_keys > 0) load_kv(0, 0);
    for (int j0 = 0; j0 < n_keys; j0 += BN) {
        const int buf = NBUF == 2 ? (j0 / BN) & 1 : 0;
        if (NBUF == 2) {
            __syncthreads(); /* everyone is done with the buffer the next tile goes to */
            if (j0 < n_keys - BN) {
                load_kv(j0 + BN, buf ^ 1); /* in flight while this tile is computed */
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
        } else {
            cp_async_wait<0>(); /* one buffer: tile j0 was issued after the previous tile's compute */
        }
        __syncthreads();
        const bf16 *Ks = Kb + buf * SPLIT * TP, *Vs = Vb + buf * SPLIT * TP;
        if (QREG && j0 == 0) {
#pragma unroll
            for (int kk = 0; kk < (QREG ? KD : 0); kk++)
                ldsm_x4(qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], Qs + wr0 * P + arow + kk * 16);
        }
        /* causal: a tile whose first key is past this warp's last row adds nothing to its rows */
        const bool active = !CAUSAL || j0 - WR < wq0;
        if (active) {
            float sa[MT][NT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int i = 0; i < NT; i++) sa[mt][i][0] = sa[mt][i][1] = sa[mt][i][2] = sa[mt][i][3] = 0.0f;
            /* MT = 2: not unrolled over kk (Q is re-read per kk anyway), or the
             * compiler's prefetching of fragments runs out of registers */
#pragma unroll(QREG ? KD : 1)
            for (int kk = 0; kk < KD; kk++) {
                uint32_t qa[MT][4], qlo[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const bf16 *qp = Qs + (wr0 + mt * 16) * P + arow + kk * 16;
                    if (QREG) {
                        qa[mt][0] = qf[QREG ? kk : 0][0], qa[mt][1] = qf[QREG ? kk : 0][1];
                        qa[mt][2] = qf[QREG ? kk : 0][2], qa[mt][3] = qf[QREG ? kk : 0][3];
                    } else {
                        ldsm_x4(qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3], qp);
                    }
                    if (SPLIT == 2) ldsm_x4(qlo[mt][0], qlo[mt][1], qlo[mt][2], qlo[mt][3], qp + QT);
                }
#pragma unroll
                for (int nj = 0; nj < BN / 16; nj++) {
                    uint32_t b0, b1, b2, b3;
                    const int koff = (nj * 16 + (lane & 7) + ((lane >> 4) << 3)) * P + kk * 16 + ((lane >> 3) & 1) * 8;
                    ldsm_x4(b0, b1, b2, b3, Ks + koff);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816(sa[mt][2 * nj], qa[mt], b0, b1);
                        mma16816(sa[mt][2 * nj + 1], qa[mt], b2, b3);
                    }
                    if (SPLIT == 2) {
                        uint32_t c0, c1, c2, c3;
                        ldsm_x4(c0, c1, c2, c3, Ks + TP + koff);
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            mma16816(sa[mt][2 * nj], qa[mt], c0, c1); /* Qh . Kl */
                            mma16816(sa[mt][2 * nj + 1], qa[mt], c2, c3);
                            mma16816(sa[mt][2 * nj], qlo[mt], b0, b1); /* Ql . Kh */
                            mma16816(sa[mt][2 * nj + 1], qlo[mt], b2, b3);
                        }
                    }
                }
            }
            /* mask (diagonal and last tiles only), online softmax on the raw scores */
            uint32_t pa[MT][BN / 16][4], pl[MT][SPLIT == 2 ? BN / 16 : 1][4]; /* P (hi, lo) as A fragments */
            const bool masked = (CAUSAL && j0 - wq0 > 1 - BN) || j0 > kl - BN;
            /* relative to j0 and this thread's first column tig * 2: the last key a row may see
             * (the segment's end; causal: the row itself, warp row 0 is key wq0 - j0) */
            const int kend = (kl - j0 < BN ? kl - j0 : BN) - 1 - tig * 2;
            const int rdiag = (wq0 - j0 < BN ? wq0 - j0 : BN) - tig * 2; /* >= -WR on an active tile */
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                float mx[2] = {-INFINITY, -INFINITY};
                int last[2];
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int d = rdiag + mt * 16 + g + hh * 8;
                    last[hh] = CAUSAL && d < kend ? d : kend;
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        if (masked && nt * 8 + (q & 1) > last[q >> 1]) sa[mt][nt][q] = -INFINITY;
                        mx[q >> 1] = fmaxf(mx[q >> 1], sa[mt][nt][q]);
                    }
                float base[2], alpha[2];
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
                    mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
                    const float mnew = fmaxf(m[mt][hh], mx[hh]);
                    base[hh] = mnew == -INFINITY ? 0.0f : mnew * scale_log2; /* a fully masked row stays finite */
                    /* an unchanged max rescales by exactly 1 (the FFMA would leave a rounding residual) */
                    alpha[hh] = m[mt][hh] == mnew ? 1.0f : exp2f(fmaf(m[mt][hh], scale_log2, -base[hh]));
                    m[mt][hh] = mnew;
                }
                float rs[2] = {0.0f, 0.0f};
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const float p = exp2f(fmaf(sa[mt][nt][q], scale_log2, -base[q >> 1]));
                        sa[mt][nt][q] = p;
                        rs[q >> 1] += p;
                    }
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    rs[hh] += __shfl_xor_sync(0xffffffffu, rs[hh], 1);
                    rs[hh] += __shfl_xor_sync(0xffffffffu, rs[hh], 2);
                    l[mt][hh] = l[mt][hh] * alpha[hh] + rs[hh];
                }
                /* rescale O only when some row's max moved (x * 1.0f == x: skipping is exact) */
                if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
                    for (int i = 0; i < DP / 8; i++) {
                        o[mt][i][0] *= alpha[0];
                        o[mt][i][1] *= alpha[0];
                        o[mt][i][2] *= alpha[1];
                        o[mt][i][3] *= alpha[1];
                    }
                }
                /* P as bf16 A fragments right away (half the registers of the f32 scores) */
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++) {
                    fa_p_frags<SPLIT>(sa[mt][2 * kk], sa[mt][2 * kk + 1], pa[mt][kk], pl[mt][SPLIT == 2 ? kk : 0]);
                }
            }
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
#pragma unroll
                for (int dn = 0; dn < DP / 16; dn++) {
                    uint32_t b0, b1, b2, b3;
                    const int voff = (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + dn * 16 + (lane >> 4) * 8;
                    ldsm_x4_t(b0, b1, b2, b3, Vs + voff);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816(o[mt][2 * dn], pa[mt][kk], b0, b1);
                        mma16816(o[mt][2 * dn + 1], pa[mt][kk], b2, b3);
                    }
                    if (SPLIT == 2) {
                        uint32_t c0, c1, c2, c3;
                        ldsm_x4_t(c0, c1, c2, c3, Vs + TP + voff);
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            mma16816(o[mt][2 * dn], pa[mt][kk], c0, c1); /* Ph . Vl */
                            mma16816(o[mt][2 * dn + 1], pa[mt][kk], c2, c3);
                            mma16816(o[mt][2 * dn], pl[mt][SPLIT == 2 ? kk : 0], b0, b1); /* Pl . Vh */
                            mma16816(o[mt][2 * dn + 1], pl[mt][SPLIT == 2 ? kk : 0], b2, b3);
                        }
                    }
                }
            }
        }
        if (NBUF == 1 && j0 < n_keys - BN) {
            __syncthreads(); /* everyone is done with the buffer */
            load_kv(j0 + BN, 0);
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int r = wr0 + mt * 16 + g + hh * 8;
            if (i0 + r >= ql) continue;
            fa_store_row<D>(dst, q0 + i0 + r, nh, h, tig, hh, o[mt], l[mt][hh] > 0.0f ? 1.0f / l[mt][hh] : 0.0f);
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
    const int64_t nk = causal ? kl - (q_off[lo + 1] - q_off[lo]) + i + 1 : kl; /* causal: after a cached prefix */
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

template <int D, int DP, bool CAUSAL, int SPLIT, int NBUF>
cudaError_t launch_tc(const bf16 *q, const bf16 *k, const bf16 *v, const ck_attn_out &dst, const int32_t *tiles,
                      int64_t n_tiles, const int64_t *q_off, const int64_t *kv_off, int nh, int nkv, float scale_log2,
                      cudaStream_t st) {
    static unsigned done = 0;
    constexpr int smem = fa_smem_bytes<DP, SPLIT, NBUF>();
    cudaError_t e = allow_smem(attn_tc_kernel<D, DP, CAUSAL, SPLIT, NBUF>, smem, &done);
    if (e != cudaSuccess) return e;
    dim3 grid((unsigned)n_tiles, (unsigned)nh);
    attn_tc_kernel<D, DP, CAUSAL, SPLIT, NBUF><<<grid, FA_THREADS, smem, st>>>(q, k, v, dst, tiles, q_off, kv_off, nh,
                                                                    nkv, scale_log2);
    return cudaGetLastError();
}

template <int D, int DP>
cudaError_t launch_tc_d(const bf16 *q, const bf16 *k, const bf16 *v, const ck_attn_out &dst,
                        const int32_t *tiles, int64_t n_tiles, const int64_t *q_off, const int64_t *kv_off, int nh,
                        int nkv, float sl2, int causal, int split, int one_buf, cudaStream_t st) {
    if (split == 2 && one_buf)
        return causal ? launch_tc<D, DP, true, 2, 1>(q, k, v, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, st)
                      : launch_tc<D, DP, false, 2, 1>(q, k, v, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2,
                                                  st);
    if (split == 2)
        return causal ? launch_tc<D, DP, true, 2, 2>(q, k, v, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, st)
                      : launch_tc<D, DP, false, 2, 2>(q, k, v, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2,
                                                  st);
    return causal ? launch_tc<D, DP, true, 1, 2>(q, k, v, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, st)
                  : launch_tc<D, DP, false, 1, 2>(q, k, v, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, st);
}

template <int D, int DP, bool CAUSAL, int SPLIT, int NBUF, int MT, int BNK = fa2_bn<MT>()>
cudaError_t launch2(const bf16 *q, const bf16 *k, const bf16 *v, const ck_attn_out &dst, const int32_t *tiles,
                    int64_t n_tiles, const int64_t *q_off, const int64_t *kv_off, int nh, int nkv, float scale_log2,
                    cudaStream_t st) {
    static unsigned done = 0;
    constexpr int smem = fa2_smem_bytes<DP, SPLIT, NBUF, MT, BNK>();
    cudaError_t e = allow_smem(attn2_kernel<D, DP, CAUSAL, SPLIT, NBUF, MT, BNK>, smem, &done);
    if (e != cudaSuccess) return e;
    const int64_t blocks = n_tiles * nh; /* block = tile * nh + head */
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    attn2_kernel<D, DP, CAUSAL, SPLIT, NBUF, MT, BNK><<<(unsigned)blocks, FA2_THREADS, smem, st>>>(
        q, k, v, dst, tiles, q_off, kv_off, nh, nkv, scale_log2);
    return cudaGetLastError();
}

/* v2 configurations: fast: 128-row blocks on 32-key tiles, two K/V buffers
 * (68 KB of shared memory at D = 128; registers allow two blocks per SM), or (variant 4, v2s) 64-row
 * blocks on the same tiles (52 KB; bitwise the same results, twice the blocks);
 * precise: 64-row blocks on 64-key tiles with one or two K/V buffers as v1
 * (Q hi in registers), or (variant 3) 128-row blocks on 32-key tiles with one
 * buffer (102 KB, two blocks per SM). */
template <int D, int DP, bool CAUSAL>
cudaError_t launch2_d(const bf16 *q, const bf16 *k, const bf16 *v, const ck_attn_out &dst,
                      const int32_t *tiles, int64_t n_tiles, const int64_t *q_off, const int64_t *kv_off, int nh,
                      int nkv, float sl2, int split, int one_buf, int variant, cudaStream_t st) {
    if (split == 1 && variant == 4)
        return launch2<D, DP, CAUSAL, 1, 2, 1, 32>(q, k, v, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, st);
    if (variant == 4) return cudaErrorInvalidValue; /* v2s: the fast mode's kernel only */
    if (split == 1)
        return launch2<D, DP, CAUSAL, 1, 2, 2>(q, k, v, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, st);
    if (variant == 3)
        return launch2<D, DP, CAUSAL, 2, 1, 2>(q, k, v, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, st);
    if (one_buf)
        return launch2<D, DP, CAUSAL, 2, 1, 1>(q, k, v, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, st);
    return launch2<D, DP, CAUSAL, 2, 2, 1>(q, k, v, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, st);
}

} /* namespace */

extern "C" {

int ck_attn_tc_rows(int split, int variant) {
    if (variant == 1 || variant == 4) return 64;
    if (variant == 3) return 128;
    return split == 1 ? 128 : 64;
}

cudaError_t ck_rope(float *x, int64_t T, int64_t heads, int64_t D, const int32_t *pos, int64_t s1, int64_t s2,
                    const float *inv_freq, cudaStream_t st) {
    if (T <= 0 || heads <= 0) return cudaSuccess;
    if (T > 0x7fffffffLL || D > 4096) return cudaErrorInvalidConfiguration;
    rope_kernel<<<(unsigned)T, 128, (size_t)D * sizeof(float), st>>>(x, T, heads, D, pos, s1, s2, inv_freq);
    return cudaGetLastError();
}

cudaError_t ck_attn_tc(const uint16_t *q, const uint16_t *k, const uint16_t *v, float *out, int64_t o_stride,
                       uint16_t *out16, int split16, const int32_t *tiles, int64_t n_tiles, const int64_t *q_off,
                       const int64_t *kv_off, int nh, int nkv, int D, float scale, int causal, int split, int variant,
                       cudaStream_t st) {
    if (n_tiles <= 0) return cudaSuccess;
    if (split != 1 && split != 2 && split != 3) return cudaErrorInvalidValue;
    if (variant < 1 || variant > 4 || (out16 && split16 != 1 && split16 != 2) || ((uintptr_t)out16 & 3))
        return cudaErrorInvalidValue;
    const ck_attn_out dst = {out, o_stride, out16, out16 ? split16 : 1};
    const int one_buf = split == 3; /* split 3: the split kernel with one K/V buffer (two blocks per SM fit) */
    if (split == 3) split = 2;
    if (n_tiles > 0x7fffffffLL || nh > 65535) return cudaErrorInvalidConfiguration;
    const bf16 *Q = reinterpret_cast<const bf16 *>(q), *K = reinterpret_cast<const bf16 *>(k),
               *V = reinterpret_cast<const bf16 *>(v);
    const float sl2 = scale * 1.4426950408889634f;
    if (variant != 1) {
        if (!(sl2 > 0.0f && sl2 < INFINITY)) return cudaErrorInvalidValue; /* the max is taken on raw scores */
        if (D == 128)
            return causal ? launch2_d<128, 128, true>(Q, K, V, dst, tiles, n_tiles, q_off, kv_off, nh, nkv,
                                                      sl2, split, one_buf, variant, st)
                          : launch2_d<128, 128, false>(Q, K, V, dst, tiles, n_tiles, q_off, kv_off, nh, nkv,
                                                       sl2, split, one_buf, variant, st);
        if (D == 64)
            return causal ? launch2_d<64, 64, true>(Q, K, V, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2,
                                                    split, one_buf, variant, st)
                          : launch2_d<64, 64, false>(Q, K, V, dst, tiles, n_tiles, q_off, kv_off, nh, nkv,
                                                     sl2, split, one_buf, variant, st);
        if (D == 72)
            return causal ? launch2_d<72, 80, true>(Q, K, V, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2,
                                                    split, one_buf, variant, st)
                          : launch2_d<72, 80, false>(Q, K, V, dst, tiles, n_tiles, q_off, kv_off, nh, nkv,
                                                     sl2, split, one_buf, variant, st);
        return cudaErrorInvalidValue;
    }
    if (D == 128)
        return launch_tc_d<128, 128>(Q, K, V, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, causal, split,
                                one_buf, st);
    if (D == 64)
        return launch_tc_d<64, 64>(Q, K, V, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, causal, split,
                                   one_buf, st);
    if (D == 72) /* the vision tower's heads (1152 / 16) */
        return launch_tc_d<72, 80>(Q, K, V, dst, tiles, n_tiles, q_off, kv_off, nh, nkv, sl2, causal, split,
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
