/* cpu_attention.c — interleaved M-RoPE and attention over packed segments. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

/* Which position axis (0 T, 1 H, 2 W) frequency j reads (SPEC §6.3). */
static int rope_axis(int64_t j, const int64_t section[3]) {
    if (j % 3 == 1 && j < 3 * section[1]) return 1;
    if (j % 3 == 2 && j < 3 * section[2]) return 2;
    return 0;
}

/* cos/sin of the D/2 frequencies of token t (of T) into cs, sn. */
static void rope_angles(const int32_t *pos, int64_t T, int64_t t, const clef_rope_desc *r, float *cs, float *sn) {
    for (int64_t j = 0; j < r->head_dim / 2; j++) {
        /* angle rounded to f32 exactly as fp32(pos) * inv_freq in torch */
        float ang = (float)pos[rope_axis(j, r->section) * T + t] * r->inv_freq[j];
        cs[j] = cosf(ang);
        sn[j] = sinf(ang);
    }
}

/* Rotate the rotate-half pairs (j, j + D/2) of `heads` consecutive heads at v. */
static void rope_heads(float *v0, int64_t heads, int64_t D, const float *cs, const float *sn) {
    const int64_t half = D / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *v = v0 + h * D;
        for (int64_t j = 0; j < half; j++) {
            float x1 = v[j], x2 = v[j + half];
            v[j] = x1 * cs[j] - x2 * sn[j];
            v[j + half] = x2 * cs[j] + x1 * sn[j];
        }
    }
}

int cpu_rope(clef_backend *be, float *x, int64_t T, int64_t heads, const int32_t *pos, const clef_rope_desc *r,
             clef_err *err) {
    cpu_ctx *c = cpu_of(be);
    const int64_t D = r->head_dim;
    if (D <= 0 || D % 2 || D > 4096)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU rope: head_dim %lld", (long long)D);
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (T * heads * D > 65536)
    for (int64_t t = 0; t < T; t++) {
        float cs[2048], sn[2048];
        rope_angles(pos, T, t, r, cs, sn);
        rope_heads(x + t * heads * D, heads, D, cs, sn);
    }
    return 0;
}

int cpu_qk_norm_rope(clef_backend *be, float *q, int64_t q_stride, float *k, int64_t k_stride, int64_t T, int64_t nq,
                     int64_t nk, const float *q_w, const float *k_w, float eps, const int32_t *pos,
                     const clef_rope_desc *r, clef_err *err) {
    cpu_ctx *c = cpu_of(be);
    const int64_t D = r->head_dim;
    if (D <= 0 || D % 2 || D > 4096 || nq < 0 || nk < 0 || q_stride < nq * D || k_stride < nk * D)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU q/k norm + rope: %lld + %lld heads of %lld, strides %lld, %lld",
                         (long long)nq, (long long)nk, (long long)D, (long long)q_stride, (long long)k_stride);
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (T * (nq + nk) * D > 65536)
    for (int64_t t = 0; t < T; t++) {
        float cs[2048], sn[2048];
        float *qt = q + t * q_stride, *kt = k + t * k_stride;
        for (int64_t h = 0; h < nq; h++) cpu_rmsnorm_row(qt + h * D, q_w, qt + h * D, D, eps);
        for (int64_t h = 0; h < nk; h++) cpu_rmsnorm_row(kt + h * D, k_w, kt + h * D, D, eps);
        rope_angles(pos, T, t, r, cs, sn);
        rope_heads(qt, nq, D, cs, sn);
        rope_heads(kt, nk, D, cs, sn);
    }
    return 0;
}

/* Query rows per attention block. */
#define ATTN_BLOCK 64

/* max of x[0..n), n >= 1.  Four running maxima break the dependency chain;
 * max is exact, so the split cannot change the result. */
static float row_max(const float *x, int64_t n) {
    float m[4] = {x[0], x[0], x[0], x[0]};
    int64_t j = 0;
    for (; j + 4 <= n; j += 4)
        for (int u = 0; u < 4; u++) m[u] = x[j + u] > m[u] ? x[j + u] : m[u];
    for (; j < n; j++) m[0] = x[j] > m[0] ? x[j] : m[0];
    float a = m[0] > m[1] ? m[0] : m[1], b = m[2] > m[3] ? m[2] : m[3];
    return a > b ? a : b;
}

/* v[u] = e^v[u] for 8 lanes, v <= 0 (scores minus their row max): Cephes'
 * single-precision exp (range reduction by ln 2 split in two, degree-6
 * polynomial, ~1 ulp), written with constant trip counts so it vectorises at
 * -O2.  Attention of a small head_dim is bound by exp, and glibc's expf is a
 * call per key.  Each lane's arithmetic is independent of the others, so a
 * value never depends on its neighbours.  A NaN lane stays NaN (as expf
 * keeps it): a NaN score comes from a NaN/Inf weight or activation, and it
 * must reach the head's no-NaN check instead of becoming a finite e^-87. */
void cpu_exp8(float *v) {
    for (int u = 0; u < 8; u++) {
        /* x = max(v, -87) as a bit select: a ternary is a branch here and
         * would stop the vectoriser; NaN is clamped too (for the int cast)
         * and put back at the end */
        const float lo = -87.0f;
        const float x0 = v[u];
        float x = x0;
        int32_t xb, lb, m = -(int32_t)!(x >= lo); /* NaN too: never an out-of-range int cast */
        memcpy(&xb, &x, sizeof xb);
        memcpy(&lb, &lo, sizeof lb);
        xb = (xb & ~m) | (lb & m);
        memcpy(&x, &xb, sizeof x);
        /* fx = floor(t) via truncation (floorf does not vectorise at -O2) */
        const float t = x * 1.44269504088896341f + 0.5f;
        int32_t n = (int32_t)t;
        n -= (int32_t)((float)n > t);
        const float fx = (float)n;
        x = x - fx * 0.693359375f;
        x = x - fx * -2.12194440e-4f;
        float z = x * x;
        float y = 1.9875691500e-4f;
        y = y * x + 1.3981999507e-3f;
        y = y * x + 8.3334519073e-3f;
        y = y * x + 4.1665795894e-2f;
        y = y * x + 1.6666665459e-1f;
        y = y * x + 5.0000001201e-1f;
        y = y * z + x + 1.0f;
        int32_t bits = (n + 127) << 23;
        float scale;
        memcpy(&scale, &bits, sizeof scale);
        /* result = isnan(x0) ? x0 : y * scale, as a bit select again */
        float r = y * scale;
        int32_t rb, nb, nan_m = -(int32_t)(x0 != x0);
        memcpy(&rb, &r, sizeof rb);
        memcpy(&nb, &x0, sizeof nb);
        rb = (rb & ~nan_m) | (nb & nan_m);
        memcpy(&v[u], &rb, sizeof rb);
    }
}

/* x[j] = e^(x[j] - mx) for j < n; returns their sum (in key order). */
static float exp_shift_sum(float *x, int64_t n, float mx) {
    float sum = 0.0f, t[8];
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        for (int u = 0; u < 8; u++) t[u] = x[j + u] - mx;
        cpu_exp8(t);
        for (int u = 0; u < 8; u++) sum += x[j + u] = t[u];
    }
    if (j < n) { /* the tail through the same lanes, padded */
        int64_t r = n - j;
        for (int u = 0; u < 8; u++) t[u] = u < r ? x[j + u] - mx : 0.0f;
        cpu_exp8(t);
        for (int u = 0; u < r; u++) sum += x[j + u] = t[u];
    }
    return sum;
}

/* Rows [i0, i1) of segment s, query head h: S = (Q K^T) * scale over the keys
 * the block may see, masked softmax per row in f32 (keys after the query get
 * probability 0), then O = P V.  Both products are cpu_gemm_cols's fixed
 * chains (the keys read in place as rows, the values as k-major panels), and
 * the block's keys depend only on the segment (its length and the block
 * index), never on the rows packed around it, so a record's attention is
 * bitwise the same alone or packed.  Causal: i0, i1 are absolute positions
 * (key indices) of the block's queries, the segment's queries being its last
 * ql of kl positions (off = kl - ql: a cached prefix of off keys, engine's
 * state cache); blocks are cut at multiples of ATTN_BLOCK of the absolute
 * position, so with off a multiple of ATTN_BLOCK a query row sees exactly
 * the block, keys and sums of the full pass.  Not causal: i0, i1 are query
 * rows.  S: scratch [ATTN_BLOCK, keys]; gs: the GEMM's scratch. */
static void attend_block(cpu_isa isa, const clef_attn_desc *a, const float *q, const float *k, const float *v,
                         float *out, int64_t s, int64_t h, int64_t i0, int64_t i1, float *S, float *gs) {
    const int64_t D = a->head_dim, hk = h / (a->n_q_heads / a->n_kv_heads);
    const int64_t q0 = a->q_off[s], kv0 = a->kv_off[s], len = a->kv_off[s + 1] - kv0;
    const int64_t off = a->causal ? len - (a->q_off[s + 1] - q0) : 0;
    const int64_t M = i1 - i0, nk = a->causal ? i1 : len;
    const cpu_gemm_b kb = {.kind = CPU_B_NK, .m = k + kv0 * a->k_stride + hk * D, .ld = a->k_stride, .N = nk, .K = D};
    const float *qa = q + (q0 + i0 - off) * a->q_stride + h * D;
    cpu_gemm_cols(isa, qa, a->q_stride, M, &kb, 0, nk, NULL, S, nk, gs);
    for (int64_t r = 0; r < M; r++) {
        float *sr = S + r * nk;
        const int64_t n = a->causal ? i0 + r + 1 : nk;
        for (int64_t j = 0; j < n; j++) sr[j] *= a->scale;
        const float mx = row_max(sr, n);
        const float inv = 1.0f / exp_shift_sum(sr, n, mx);
        for (int64_t j = 0; j < n; j++) sr[j] *= inv;
        for (int64_t j = n; j < nk; j++) sr[j] = 0.0f;
    }
    const cpu_gemm_b vb = {.kind = CPU_B_KN, .m = v + kv0 * a->v_stride + hk * D, .ld = a->v_stride, .N = D, .K = nk};
    float *o = out + (q0 + i0 - off) * a->o_stride + h * D;
    cpu_gemm_cols(isa, S, nk, M, &vb, 0, D, NULL, o, a->o_stride, gs);
}

/* One unit of attention work: a block of query rows of one head. */
typedef struct attn_item {
    int64_t seg, head, i0, i1;
    double cost; /* queries x keys it sees */
} attn_item;

/* Largest blocks first (a causal segment's last blocks see the most keys),
 * ties in (segment, head, block) order: the dynamic schedule then ends on
 * small blocks. */
static int attn_item_cmp(const void *pa, const void *pb) {
    const attn_item *a = pa, *b = pb;
    if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1;
    if (a->seg != b->seg) return a->seg < b->seg ? -1 : 1;
    if (a->head != b->head) return a->head < b->head ? -1 : 1;
    return a->i0 < b->i0 ? -1 : a->i0 > b->i0;
}

int cpu_attention(clef_backend *be, const float *q, const float *k, const float *v, float *out,
                  const clef_attn_desc *a, clef_err *err) {
    cpu_ctx *c = cpu_of(be);
    const int64_t nh = a->n_q_heads, nkv = a->n_kv_heads, D = a->head_dim;
    if (nh <= 0 || nkv <= 0 || nh % nkv || D <= 0 || a->n_seg < 0)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU attention: %lld query / %lld kv heads of %lld",
                         (long long)nh, (long long)nkv, (long long)D);
    int64_t kvmax = 0, n_items = 0;
    double work = 0;
    for (int64_t s = 0; s < a->n_seg; s++) {
        int64_t ql = a->q_off[s + 1] - a->q_off[s], kl = a->kv_off[s + 1] - a->kv_off[s];
        if (ql < 0 || kl < 0 || (ql > 0 && kl == 0) || (a->causal && ql > kl) || kl > INT32_MAX / ATTN_BLOCK)
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                             "CPU attention: segment %lld has %lld queries and %lld keys", (long long)s,
                             (long long)ql, (long long)kl);
        if (kl > kvmax) kvmax = kl;
        /* causal: blocks of absolute positions [off, kl), cut at multiples of ATTN_BLOCK */
        const int64_t off = a->causal ? kl - ql : 0, b0 = off / ATTN_BLOCK;
        n_items += nh * ((off + ql + ATTN_BLOCK - 1) / ATTN_BLOCK - b0);
        work += (double)ql * (double)kl * (double)(nh * D);
    }
    if (n_items == 0) return 0;
    attn_item *items = cpu_slot(c, CPU_SLOT_ATTN, (size_t)n_items * sizeof *items, err);
    const size_t s_floats = ((size_t)(ATTN_BLOCK * kvmax) + 15) & ~(size_t)15; /* the GEMM scratch stays aligned */
    if (!items || cpu_thread_scratch(c, s_floats + cpu_gemm_scratch_floats(c->isa), err) != 0) return -1;
    int64_t m = 0;
    for (int64_t s = 0; s < a->n_seg; s++) {
        const int64_t ql = a->q_off[s + 1] - a->q_off[s], kl = a->kv_off[s + 1] - a->kv_off[s];
        const int64_t off = a->causal ? kl - ql : 0, end = off + ql;
        for (int64_t h = 0; h < nh; h++)
            for (int64_t i0 = off; i0 < end;) {
                const int64_t cut = (i0 / ATTN_BLOCK + 1) * ATTN_BLOCK, i1 = cut < end ? cut : end;
                items[m++] = (attn_item){s, h, i0, i1, (double)(i1 - i0) * (double)(a->causal ? i1 : kl)};
                i0 = i1;
            }
    }
    qsort(items, (size_t)n_items, sizeof *items, attn_item_cmp);
#pragma omp parallel for schedule(dynamic, 1) num_threads(c->n_threads) if (work > 1e5 && n_items > 1)
    for (int64_t i = 0; i < n_items; i++)
        attend_block(c->isa, a, q, k, v, out, items[i].seg, items[i].head, items[i].i0, items[i].i1,
                     c->thread_buf[omp_get_thread_num()], c->thread_buf[omp_get_thread_num()] + s_floats);
    return 0;
}
