/* cpu_attention.c — interleaved M-RoPE and attention over packed segments. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

/* Which position axis (0 T, 1 H, 2 W) frequency j reads (SPEC §6.3). */
static int rope_axis(int64_t j, const int64_t section[3]) {
    if (j % 3 == 1 && j < 3 * section[1]) return 1;
    if (j % 3 == 2 && j < 3 * section[2]) return 2;
    return 0;
}

int cpu_rope(clef_backend *be, float *x, int64_t T, int64_t heads, const int32_t *pos, const clef_rope_desc *r,
             clef_err *err) {
    cpu_ctx *c = cpu_of(be);
    const int64_t D = r->head_dim, half = D / 2;
    if (D <= 0 || D % 2 || D > 4096)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU rope: head_dim %lld", (long long)D);
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (T * heads * D > 65536)
    for (int64_t t = 0; t < T; t++) {
        float cs[2048], sn[2048];
        for (int64_t j = 0; j < half; j++) {
            /* angle rounded to f32 exactly as fp32(pos) * inv_freq in torch */
            float ang = (float)pos[rope_axis(j, r->section) * T + t] * r->inv_freq[j];
            cs[j] = cosf(ang);
            sn[j] = sinf(ang);
        }
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + (t * heads + h) * D;
            for (int64_t j = 0; j < half; j++) {
                float x1 = v[j], x2 = v[j + half];
                v[j] = x1 * cs[j] - x2 * sn[j];
                v[j + half] = x2 * cs[j] + x1 * sn[j];
            }
        }
    }
    return 0;
}

/* Segment holding row r: the last s with off[s] <= r, which skips empty
 * segments (off ascending, off[n_seg] > r). */
static int64_t seg_of(const int64_t *q_off, int64_t n_seg, int64_t r) {
    int64_t lo = 0, hi = n_seg - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (q_off[mid] <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* One query row of one head: softmax(q.K^T * scale) . V over `n` keys.
 * kT holds the segment's keys of this KV head transposed ([D][ld]), so the
 * scores vectorise across keys while each score is still the plain
 * sequential sum over the D dimensions. */
static void attend_row(const float *restrict q, const float *restrict kT, int64_t ld, const float *restrict v,
                       int64_t vs, int64_t n, int64_t D, float scale, float *restrict s, float *restrict o) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) { /* 8 keys in registers; each a sequential sum over i */
        float acc[8] = {0};
        for (int64_t i = 0; i < D; i++) {
            const float qi = q[i], *kr = kT + i * ld + j;
            for (int jj = 0; jj < 8; jj++) acc[jj] += qi * kr[jj];
        }
        for (int jj = 0; jj < 8; jj++) s[j + jj] = acc[jj];
    }
    for (; j < n; j++) {
        float acc = 0.0f;
        for (int64_t i = 0; i < D; i++) acc += q[i] * kT[i * ld + j];
        s[j] = acc;
    }
    float mx = -INFINITY;
    for (j = 0; j < n; j++) {
        s[j] *= scale;
        if (s[j] > mx) mx = s[j];
    }
    float sum = 0.0f;
    for (j = 0; j < n; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    for (j = 0; j < n; j++) s[j] = s[j] / sum;
    /* o[i] = sum_j p_j v_j[i] in key order; 8 dimensions at a time so the
     * accumulators stay in registers (constant trip counts vectorise at -O2) */
    int64_t i = 0;
    for (; i + 8 <= D; i += 8) {
        float acc[8] = {0};
        for (j = 0; j < n; j++) {
            const float p = s[j], *vj = v + j * vs + i;
            for (int ii = 0; ii < 8; ii++) acc[ii] += p * vj[ii];
        }
        for (int ii = 0; ii < 8; ii++) o[i + ii] = acc[ii];
    }
    for (; i < D; i++) {
        float acc = 0.0f;
        for (j = 0; j < n; j++) acc += s[j] * v[j * vs + i];
        o[i] = acc;
    }
}

/* Transpose every segment's keys: for segment s (key rows [kv0, kv1), len
 * rows) and KV head h, kT[kv0 * nkv * D + h * D * len + i * len + j] =
 * k[(kv0 + j) * k_stride + h * D + i]. */
static void transpose_keys(const float *k, const clef_attn_desc *a, float *kT, int n_threads) {
    const int64_t nkv = a->n_kv_heads, D = a->head_dim, total = a->kv_off[a->n_seg];
#pragma omp parallel for schedule(static) num_threads(n_threads) if (total * nkv * D > 65536)
    for (int64_t r = 0; r < total; r++) {
        int64_t s = seg_of(a->kv_off, a->n_seg, r);
        const int64_t kv0 = a->kv_off[s], len = a->kv_off[s + 1] - kv0, j = r - kv0;
        for (int64_t h = 0; h < nkv; h++) {
            float *dst = kT + kv0 * nkv * D + h * D * len + j;
            const float *src = k + r * a->k_stride + h * D;
            for (int64_t i = 0; i < D; i++) dst[i * len] = src[i];
        }
    }
}

int cpu_attention(clef_backend *be, const float *q, const float *k, const float *v, float *out,
                  const clef_attn_desc *a, clef_err *err) {
    cpu_ctx *c = cpu_of(be);
    const int64_t nh = a->n_q_heads, nkv = a->n_kv_heads, D = a->head_dim;
    if (nh <= 0 || nkv <= 0 || nh % nkv || D <= 0 || a->n_seg < 0)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU attention: %lld query / %lld kv heads of %lld",
                         (long long)nh, (long long)nkv, (long long)D);
    if (a->n_seg == 0) return 0;
    int64_t kvmax = 0, work = 0;
    for (int64_t s = 0; s < a->n_seg; s++) {
        int64_t ql = a->q_off[s + 1] - a->q_off[s], kl = a->kv_off[s + 1] - a->kv_off[s];
        if (ql < 0 || kl < 0 || (ql > 0 && kl == 0) || (a->causal && ql != kl))
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                             "CPU attention: segment %lld has %lld queries and %lld keys", (long long)s,
                             (long long)ql, (long long)kl);
        if (kl > kvmax) kvmax = kl;
        work += ql * kl;
    }
    const int64_t kv_total = a->kv_off[a->n_seg];
    float *kT = cpu_slot(c, CPU_SLOT_ATTN, (size_t)(kv_total * nkv * D) * sizeof(float) + 64, err);
    if (!kT || cpu_thread_scratch(c, (size_t)kvmax, err) != 0) return -1;
    transpose_keys(k, a, kT, c->n_threads);
    const int64_t rows = a->q_off[a->n_seg], group = nh / nkv;
#pragma omp parallel for schedule(dynamic, 16) num_threads(c->n_threads) if (work * nh * D > 65536)
    for (int64_t i = 0; i < rows * nh; i++) {
        int64_t r = i / nh, h = i % nh;
        int64_t s = seg_of(a->q_off, a->n_seg, r);
        int64_t qi = r - a->q_off[s], kv0 = a->kv_off[s], len = a->kv_off[s + 1] - kv0;
        int64_t n = a->causal ? qi + 1 : len;
        int64_t hk = h / group;
        attend_row(q + r * a->q_stride + h * D, kT + kv0 * nkv * D + hk * D * len, len,
                   v + kv0 * a->v_stride + hk * D, a->v_stride, n, D, a->scale, c->thread_buf[omp_get_thread_num()],
                   out + r * a->o_stride + h * D);
    }
    return 0;
}
