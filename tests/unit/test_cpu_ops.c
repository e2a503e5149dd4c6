/* test_cpu_ops.c — every CPU backend op against a naive double-precision loop
 * on random inputs, plus the determinism promise of backend.h: a row (or a
 * segment) gives bitwise the same result alone as packed with others. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_internal.h"
#include "testutil.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* Uniform in [-1, 1). */
static float frand(void) { return tu_rand_f32(&rng_state); }

static float *rand_vec(size_t n, float scale) { return tu_rand_vec(&rng_state, n, scale); }

/* Random bf16 matrix, and its exact f32 values. */
static uint16_t *rand_bf16(size_t n, float scale, float **f32) {
    uint16_t *h = malloc(n * sizeof *h);
    *f32 = malloc(n * sizeof **f32);
    for (size_t i = 0; i < n; i++) {
        h[i] = clef_f32_to_bf16(frand() * scale);
        (*f32)[i] = clef_bf16_to_f32(h[i]);
    }
    return h;
}

static clef_backend *cpu(void) {
    clef_err err;
    clef_err_clear(&err);
    clef_backend *be = clef_backend_cpu_create(2, &err);
    assert_non_null(be);
    return be;
}

static void ok(int rc, const clef_err *err) {
    if (rc != 0) fail_msg("op failed: %s", err->message);
}

/* |got - want| <= tol for all n; prints the max diff under `what`. */
static void near(const char *what, const float *got, const double *want, size_t n, double tol) {
    double mx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= tol)) fail_msg("%s[%zu]: got %.9g want %.9g (tol %g)", what, i, got[i], want[i], tol);
        if (d > mx) mx = d;
    }
    printf("  %-22s max |diff| %.3g over %zu values\n", what, mx, n);
}

/* y = x W^T + b in double. */
static double *naive_matmul(const float *x, int64_t T, const float *w, int64_t out, int64_t in, const float *b) {
    double *y = malloc((size_t)(T * out) * sizeof *y);
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = 0; o < out; o++) {
            double s = b ? b[o] : 0.0;
            for (int64_t i = 0; i < in; i++) s += (double)x[t * in + i] * w[o * in + i];
            y[t * out + o] = s;
        }
    return y;
}

static void test_matmul_bf16(void **state) {
    clef_backend *be = cpu();
    clef_err err;
    const int64_t T = 300, in = 70, out = 133; /* partial tile, chunk and weight block */
    float *wf, *x = rand_vec((size_t)(T * in), 1.0f), *b = rand_vec((size_t)out, 1.0f);
    uint16_t *wh = rand_bf16((size_t)(out * in), 0.5f, &wf);
    clef_weight w;
    ok(be->ops->weight_init(be, &w, CLEF_DT_BF16, out, in, wh, &err), &err);
    float *y = malloc((size_t)(T * out) * sizeof *y);
    ok(be->ops->matmul(be, x, T, &w, b, y, &err), &err);
    double *ref = naive_matmul(x, T, wf, out, in, b);
    near("matmul bf16", y, ref, (size_t)(T * out), 2e-5);
    /* Every row alone, and a run of rows starting mid-tile, is bitwise the same. */
    float *y1 = malloc((size_t)(T * out) * sizeof *y1);
    for (int64_t t = 0; t < T; t += 7) {
        ok(be->ops->matmul(be, x + t * in, 1, &w, b, y1, &err), &err);
        assert_memory_equal(y1, y + t * out, (size_t)out * sizeof(float));
    }
    ok(be->ops->matmul(be, x + 45 * in, 77, &w, b, y1, &err), &err);
    assert_memory_equal(y1, y + 45 * out, (size_t)(77 * out) * sizeof(float));
    free(y1), free(ref), free(y), free(wh), free(wf), free(x), free(b);
    be->ops->destroy(be);
}

static void test_matmul_f32_f16(void **state) {
    clef_backend *be = cpu();
    clef_err err;
    const int64_t T = 5, in = 33, out = 65;
    float *x = rand_vec((size_t)(T * in), 1.0f), *wf = rand_vec((size_t)(out * in), 1.0f);
    clef_weight w;
    ok(be->ops->weight_init(be, &w, CLEF_DT_F32, out, in, wf, &err), &err);
    float *y = malloc((size_t)(T * out) * sizeof *y);
    ok(be->ops->matmul(be, x, T, &w, NULL, y, &err), &err);
    double *ref = naive_matmul(x, T, wf, out, in, NULL);
    near("matmul f32", y, ref, (size_t)(T * out), 2e-5);
    /* f16: 1.0 (0x3c00), -2.0 (0xc000), 0.5 (0x3800) in every row */
    uint16_t *wh = malloc((size_t)(out * in) * sizeof *wh);
    const uint16_t pat[3] = {0x3c00, 0xc000, 0x3800};
    const float val[3] = {1.0f, -2.0f, 0.5f};
    for (int64_t i = 0; i < out * in; i++) {
        wh[i] = pat[i % 3];
        wf[i] = val[i % 3];
    }
    ok(be->ops->weight_init(be, &w, CLEF_DT_F16, out, in, wh, &err), &err);
    ok(be->ops->matmul(be, x, T, &w, NULL, y, &err), &err);
    free(ref);
    ref = naive_matmul(x, T, wf, out, in, NULL);
    near("matmul f16", y, ref, (size_t)(T * out), 2e-5);
    /* An unsupported dtype is an error, not a crash. */
    assert_int_equal(be->ops->weight_init(be, &w, CLEF_DT_I32, out, in, wh, &err), -1);
    assert_int_equal(err.status, 500);
    free(wh), free(ref), free(y), free(wf), free(x);
    be->ops->destroy(be);
}

static void test_gather(void **state) {
    clef_backend *be = cpu();
    clef_err err;
    const int64_t V = 50, D = 24;
    float *tf;
    uint16_t *th = rand_bf16((size_t)(V * D), 1.0f, &tf);
    clef_weight t;
    ok(be->ops->weight_init(be, &t, CLEF_DT_BF16, V, D, th, &err), &err);
    int32_t ids[6] = {3, 0, 49, 3, 17, 8};
    float out[6 * 24];
    ok(be->ops->gather(be, &t, ids, 6, out, &err), &err);
    for (int i = 0; i < 6; i++) assert_memory_equal(out + i * D, tf + ids[i] * D, (size_t)D * sizeof(float));
    int32_t bad = 50;
    assert_int_equal(be->ops->gather(be, &t, &bad, 1, out, &err), -1);
    free(th), free(tf);
    be->ops->destroy(be);
}

static void test_norms(void **state) {
    clef_backend *be = cpu();
    clef_err err;
    const int64_t rows = 9, dim = 48;
    float *x = rand_vec((size_t)(rows * dim), 3.0f), *w = rand_vec((size_t)dim, 1.0f), *b = rand_vec((size_t)dim, 1.0f);
    float *y = malloc((size_t)(rows * dim) * sizeof *y);
    double *ref = malloc((size_t)(rows * dim) * sizeof *ref);
    ok(be->ops->rmsnorm(be, x, w, y, rows, dim, 1e-6f, &err), &err);
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < dim; i++) ss += (double)x[r * dim + i] * x[r * dim + i];
        double inv = 1.0 / sqrt(ss / dim + 1e-6);
        for (int64_t i = 0; i < dim; i++) ref[r * dim + i] = w[i] * x[r * dim + i] * inv;
    }
    near("rmsnorm", y, ref, (size_t)(rows * dim), 1e-6);
    ok(be->ops->layernorm(be, x, w, b, y, rows, dim, 1e-5f, &err), &err);
    for (int64_t r = 0; r < rows; r++) {
        double m = 0, v = 0;
        for (int64_t i = 0; i < dim; i++) m += x[r * dim + i];
        m /= dim;
        for (int64_t i = 0; i < dim; i++) v += (x[r * dim + i] - m) * (x[r * dim + i] - m);
        v /= dim;
        for (int64_t i = 0; i < dim; i++) ref[r * dim + i] = (x[r * dim + i] - m) / sqrt(v + 1e-5) * w[i] + b[i];
    }
    near("layernorm", y, ref, (size_t)(rows * dim), 2e-6);
    /* in place gives the same bytes */
    float *z = malloc((size_t)(rows * dim) * sizeof *z);
    memcpy(z, x, (size_t)(rows * dim) * sizeof *z);
    ok(be->ops->layernorm(be, z, w, b, z, rows, dim, 1e-5f, &err), &err);
    assert_memory_equal(z, y, (size_t)(rows * dim) * sizeof *z);
    free(z), free(ref), free(y), free(x), free(w), free(b);
    be->ops->destroy(be);
}

static void test_elementwise(void **state) {
    clef_backend *be = cpu();
    clef_err err;
    const int64_t n = 1000;
    float *a = rand_vec((size_t)n, 6.0f), *b = rand_vec((size_t)n, 2.0f), *y = malloc((size_t)n * sizeof *y);
    double *ref = malloc((size_t)n * sizeof *ref);
    ok(be->ops->swiglu(be, a, b, y, n, &err), &err);
    for (int64_t i = 0; i < n; i++) ref[i] = a[i] / (1.0 + exp(-(double)a[i])) * b[i];
    near("swiglu", y, ref, (size_t)n, 2e-6);
    ok(be->ops->gelu(be, a, y, n, &err), &err);
    for (int64_t i = 0; i < n; i++) ref[i] = 0.5 * a[i] * (1.0 + erf(a[i] / sqrt(2.0)));
    near("gelu", y, ref, (size_t)n, 2e-6);
    ok(be->ops->add(be, a, b, y, 10, 100, 100, &err), &err);
    for (int64_t i = 0; i < n; i++) ref[i] = (double)a[i] + b[i];
    near("add", y, ref, (size_t)n, 1e-6);
    ok(be->ops->add(be, a, b, y, 10, 100, 0, &err), &err); /* broadcast row 0 of b */
    for (int64_t i = 0; i < n; i++) ref[i] = (double)a[i] + b[i % 100];
    near("add broadcast", y, ref, (size_t)n, 1e-6);
    free(a), free(b), free(y), free(ref);
    be->ops->destroy(be);
}

static void test_head_rows(void **state) {
    clef_backend *be = cpu();
    clef_err err;
    const int64_t L = 20, dim = 12;
    float *x = rand_vec((size_t)(L * dim), 1.0f);
    clef_row_span spans[3] = {{0, 1}, {4, 11}, {19, 20}};
    float out[3 * 12];
    double ref[4 * 3 * 12];
    ok(be->ops->span_mean(be, x, dim, spans, 3, out, &err), &err);
    for (int i = 0; i < 3; i++)
        for (int64_t d = 0; d < dim; d++) {
            double s = 0;
            for (int64_t r = spans[i].start; r < spans[i].end; r++) s += x[r * dim + d];
            ref[i * dim + d] = s / (double)(spans[i].end - spans[i].start);
        }
    near("span_mean", out, ref, 3 * dim, 1e-6);
    clef_row_span empty = {5, 5};
    assert_int_equal(be->ops->span_mean(be, x, dim, &empty, 1, out, &err), -1);

    /* pair features and cosine, field rows picked per option */
    int32_t f_rows[3] = {1, 0, 1};
    float pf[3 * 4 * 12], cs[3];
    const float *F = x, *o = x + 5 * dim;
    ok(be->ops->pair_features(be, F, f_rows, o, 3, dim, pf, &err), &err);
    for (int i = 0; i < 3; i++)
        for (int64_t d = 0; d < dim; d++) {
            double f = F[f_rows[i] * dim + d], v = o[i * dim + d];
            ref[i * 48 + d] = f;
            ref[i * 48 + 12 + d] = v;
            ref[i * 48 + 24 + d] = f * v;
            ref[i * 48 + 36 + d] = fabs(f - v);
        }
    near("pair_features", pf, ref, 3 * 48, 1e-7);
    ok(be->ops->cosine(be, F, f_rows, o, 3, dim, 1e-8f, cs, &err), &err);
    for (int i = 0; i < 3; i++) {
        double na = 0, nb = 0, dot = 0;
        for (int64_t d = 0; d < dim; d++) {
            na += (double)F[f_rows[i] * dim + d] * F[f_rows[i] * dim + d];
            nb += (double)o[i * dim + d] * o[i * dim + d];
            dot += (double)F[f_rows[i] * dim + d] * o[i * dim + d];
        }
        ref[i] = dot / (sqrt(na) * sqrt(nb));
    }
    near("cosine", cs, ref, 3, 1e-6);
    float zero[12] = {0};
    ok(be->ops->cosine(be, zero, NULL, o, 1, dim, 1e-8f, cs, &err), &err);
    assert_true(cs[0] == 0.0f); /* eps clamp: no NaN for a zero vector */
    free(x);
    be->ops->destroy(be);
}

static void test_rope(void **state) {
    clef_backend *be = cpu();
    clef_err err;
    const int64_t T = 7, heads = 3, D = 16, half = 8;
    float inv[8];
    for (int j = 0; j < half; j++) inv[j] = 1.0f / powf(1e6f, (float)(2 * j) / (float)D);
    clef_rope_desc r = {.head_dim = D, .section = {4, 2, 2}, .inv_freq = inv};
    int32_t pos[3 * 7];
    for (int a = 0; a < 3; a++)
        for (int t = 0; t < T; t++) pos[a * T + t] = t * (a + 1) + 100 * a; /* three different axes */
    float *x = rand_vec((size_t)(T * heads * D), 1.0f), *y = malloc((size_t)(T * heads * D) * sizeof *y);
    memcpy(y, x, (size_t)(T * heads * D) * sizeof *y);
    ok(be->ops->rope(be, y, T, heads, pos, &r, &err), &err);
    double *ref = malloc((size_t)(T * heads * D) * sizeof *ref);
    /* tiny section [4,2,2]: T owns {0,3,6,7}, H {1,4}, W {2,5} (SPEC §6.3) */
    const int axis[8] = {0, 1, 2, 0, 1, 2, 0, 0};
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t j = 0; j < half; j++) {
                double ang = (float)((float)pos[axis[j] * T + t] * inv[j]);
                const float *v = x + (t * heads + h) * D;
                ref[(t * heads + h) * D + j] = v[j] * cos(ang) - v[j + half] * sin(ang);
                ref[(t * heads + h) * D + j + half] = v[j + half] * cos(ang) + v[j] * sin(ang);
            }
    near("rope (3 axes)", y, ref, (size_t)(T * heads * D), 1e-6);
    free(x), free(y), free(ref);
    be->ops->destroy(be);
}

/* The fused ops give bitwise the plain ops' bytes: add_rmsnorm = add then
 * rmsnorm (with and without the add); qk_norm_rope on q and k blocks of a
 * fused [T, q | k | v] row = rmsnorm per head then rope on contiguous q
 * and k (v's columns untouched). */
static void test_fused_row_ops(void **state) {
    clef_backend *be = cpu();
    clef_err err;
    const int64_t rows = 11, dim = 40;
    float *h = rand_vec((size_t)(rows * dim), 2.0f), *o = rand_vec((size_t)(rows * dim), 1.0f),
          *w = rand_vec((size_t)dim, 1.0f);
    float *h2 = malloc((size_t)(rows * dim) * sizeof *h2), *y = malloc((size_t)(rows * dim) * sizeof *y),
          *y2 = malloc((size_t)(rows * dim) * sizeof *y2);
    memcpy(h2, h, (size_t)(rows * dim) * sizeof *h2);
    ok(be->ops->add(be, h2, o, h2, rows, dim, dim, &err), &err);
    ok(be->ops->rmsnorm(be, h2, w, y2, rows, dim, 1e-6f, &err), &err);
    ok(be->ops->add_rmsnorm(be, h, o, w, y, rows, dim, 1e-6f, &err), &err);
    assert_memory_equal(h, h2, (size_t)(rows * dim) * sizeof *h);
    assert_memory_equal(y, y2, (size_t)(rows * dim) * sizeof *y);
    ok(be->ops->add_rmsnorm(be, h, NULL, w, y, rows, dim, 1e-6f, &err), &err); /* no add: h kept */
    assert_memory_equal(h, h2, (size_t)(rows * dim) * sizeof *h);
    assert_memory_equal(y, y2, (size_t)(rows * dim) * sizeof *y);
    free(h), free(h2), free(o), free(w), free(y), free(y2);

    const int64_t T = 5, nq = 4, nk = 2, D = 16, ld = (nq + 2 * nk) * D;
    float inv[8];
    for (int j = 0; j < 8; j++) inv[j] = 1.0f / powf(1e6f, (float)(2 * j) / (float)D);
    clef_rope_desc r = {.head_dim = D, .section = {4, 2, 2}, .inv_freq = inv};
    int32_t pos[3 * 5];
    for (int a = 0; a < 3; a++)
        for (int t = 0; t < T; t++) pos[a * T + t] = t * (a + 2) + 50 * a;
    float *qkv = rand_vec((size_t)(T * ld), 2.0f), *qw = rand_vec((size_t)D, 1.0f), *kw = rand_vec((size_t)D, 1.0f);
    float *q = malloc((size_t)(T * nq * D) * sizeof *q), *k = malloc((size_t)(T * nk * D) * sizeof *k);
    float *want = malloc((size_t)(T * ld) * sizeof *want);
    for (int64_t t = 0; t < T; t++) {
        memcpy(q + t * nq * D, qkv + t * ld, (size_t)(nq * D) * sizeof *q);
        memcpy(k + t * nk * D, qkv + t * ld + nq * D, (size_t)(nk * D) * sizeof *k);
    }
    ok(be->ops->rmsnorm(be, q, qw, q, T * nq, D, 1e-6f, &err), &err);
    ok(be->ops->rmsnorm(be, k, kw, k, T * nk, D, 1e-6f, &err), &err);
    ok(be->ops->rope(be, q, T, nq, pos, &r, &err), &err);
    ok(be->ops->rope(be, k, T, nk, pos, &r, &err), &err);
    memcpy(want, qkv, (size_t)(T * ld) * sizeof *want);
    for (int64_t t = 0; t < T; t++) {
        memcpy(want + t * ld, q + t * nq * D, (size_t)(nq * D) * sizeof *q);
        memcpy(want + t * ld + nq * D, k + t * nk * D, (size_t)(nk * D) * sizeof *k);
    }
    ok(be->ops->qk_norm_rope(be, qkv, ld, qkv + nq * D, ld, T, nq, nk, qw, kw, 1e-6f, pos, &r, &err), &err);
    assert_memory_equal(qkv, want, (size_t)(T * ld) * sizeof *qkv);
    /* a stride shorter than the heads is refused */
    assert_int_equal(be->ops->qk_norm_rope(be, qkv, nq * D - 1, qkv, ld, T, nq, nk, qw, kw, 1e-6f, pos, &r, &err), -1);
    assert_int_equal(err.status, 500);
    free(qkv), free(qw), free(kw), free(q), free(k), free(want);
    be->ops->destroy(be);
}

/* Naive attention over one segment for one query head. */
static void naive_attn(const float *q, const float *k, const float *v, int64_t qs, int64_t ks, int64_t vs,
                       int64_t nq, int64_t nk, int64_t D, double scale, int causal, double *out, int64_t os) {
    for (int64_t i = 0; i < nq; i++) {
        int64_t n = causal ? i + 1 : nk;
        double mx = -1e300, s[512], sum = 0;
        for (int64_t j = 0; j < n; j++) {
            double d = 0;
            for (int64_t c = 0; c < D; c++) d += (double)q[i * qs + c] * k[j * ks + c];
            s[j] = d * scale;
            if (s[j] > mx) mx = s[j];
        }
        for (int64_t j = 0; j < n; j++) sum += (s[j] = exp(s[j] - mx));
        for (int64_t c = 0; c < D; c++) {
            double o = 0;
            for (int64_t j = 0; j < n; j++) o += s[j] / sum * v[j * vs + c];
            out[i * os + c] = o;
        }
    }
}

static void test_attention_causal_gqa(void **state) {
    clef_backend *be = cpu();
    clef_err err;
    const int64_t nh = 4, nkv = 2, D = 16, n_seg = 3;
    int64_t off[4] = {0, 5, 6, 40}; /* lengths 5, 1, 34 */
    const int64_t T = off[n_seg], qw = nh * D, kw = nkv * D;
    float *q = rand_vec((size_t)(T * qw), 2.0f), *k = rand_vec((size_t)(T * kw), 2.0f),
          *v = rand_vec((size_t)(T * kw), 1.0f);
    float *o = malloc((size_t)(T * qw) * sizeof *o);
    clef_attn_desc a = {.n_seg = n_seg, .q_off = off, .kv_off = off, .n_q_heads = nh, .n_kv_heads = nkv,
                        .head_dim = D, .q_stride = qw, .k_stride = kw, .v_stride = kw, .o_stride = qw,
                        .scale = 0.25f, .causal = 1};
    ok(be->ops->attention(be, q, k, v, o, &a, &err), &err);
    double *ref = malloc((size_t)(T * qw) * sizeof *ref);
    for (int64_t s = 0; s < n_seg; s++)
        for (int64_t h = 0; h < nh; h++) {
            int64_t r0 = off[s], hk = h / (nh / nkv);
            naive_attn(q + r0 * qw + h * D, k + r0 * kw + hk * D, v + r0 * kw + hk * D, qw, kw, kw, off[s + 1] - r0,
                       off[s + 1] - r0, D, 0.25, 1, ref + r0 * qw + h * D, qw);
        }
    near("attention causal gqa", o, ref, (size_t)(T * qw), 1e-6);
    /* The last segment alone gives the same bytes as packed. */
    int64_t off1[2] = {0, 34};
    clef_attn_desc a1 = a;
    a1.n_seg = 1, a1.q_off = off1, a1.kv_off = off1;
    float *o1 = malloc((size_t)(34 * qw) * sizeof *o1);
    ok(be->ops->attention(be, q + 6 * qw, k + 6 * kw, v + 6 * kw, o1, &a1, &err), &err);
    assert_memory_equal(o1, o + 6 * qw, (size_t)(34 * qw) * sizeof(float));
    /* causal with unequal query/key lengths is refused */
    int64_t koff[4] = {0, 4, 6, 40};
    a.kv_off = koff;
    assert_int_equal(be->ops->attention(be, q, k, v, o, &a, &err), -1);
    free(q), free(k), free(v), free(o), free(o1), free(ref);
    be->ops->destroy(be);
}

static void test_attention_cross(void **state) {
    clef_backend *be = cpu();
    clef_err err;
    /* head style: packed [rows, 3W] in_proj output, K/V read with a stride;
     * two segments with different query and key counts, no mask. */
    const int64_t W = 24, nh = 3, D = 8, n_seg = 2;
    int64_t qoff[3] = {0, 1, 3}, kvoff[3] = {0, 4, 11};
    float *qkv = rand_vec((size_t)(11 * 3 * W), 1.5f);
    float *o = malloc((size_t)(3 * W) * sizeof *o);
    clef_attn_desc a = {.n_seg = n_seg, .q_off = qoff, .kv_off = kvoff, .n_q_heads = nh, .n_kv_heads = nh,
                        .head_dim = D, .q_stride = 3 * W, .k_stride = 3 * W, .v_stride = 3 * W, .o_stride = W,
                        .scale = 1.0f / sqrtf((float)D), .causal = 0};
    ok(be->ops->attention(be, qkv, qkv + W, qkv + 2 * W, o, &a, &err), &err);
    double ref[3 * 24];
    for (int64_t s = 0; s < n_seg; s++)
        for (int64_t h = 0; h < nh; h++)
            naive_attn(qkv + qoff[s] * 3 * W + h * D, qkv + kvoff[s] * 3 * W + W + h * D,
                       qkv + kvoff[s] * 3 * W + 2 * W + h * D, 3 * W, 3 * W, 3 * W, qoff[s + 1] - qoff[s],
                       kvoff[s + 1] - kvoff[s], D, 1.0 / sqrt((double)D), 0, ref + qoff[s] * W + h * D, W);
    near("attention cross", o, ref, (size_t)(3 * W), 1e-6);
    free(qkv), free(o);
    be->ops->destroy(be);
}

/* A NaN (or Inf) in one query or key must poison the attention output of
 * its head instead of being laundered into a finite softmax weight: a NaN
 * weight in q_proj/k_proj otherwise gives a confident but wrong answer that
 * the head's no-NaN check cannot see. */
static void test_attention_nan_propagates(void **state) {
    clef_backend *be = cpu();
    clef_err err;
    const int64_t nh = 2, nkv = 1, D = 16, T = 20, qw = nh * D, kw = nkv * D;
    int64_t off[2] = {0, T};
    clef_attn_desc a = {.n_seg = 1, .q_off = off, .kv_off = off, .n_q_heads = nh, .n_kv_heads = nkv,
                        .head_dim = D, .q_stride = qw, .k_stride = kw, .v_stride = kw, .o_stride = qw,
                        .scale = 0.25f, .causal = 1};
    float *o = malloc((size_t)(T * qw) * sizeof *o);
    for (int which = 0; which < 3; which++) {
        float *q = rand_vec((size_t)(T * qw), 2.0f), *k = rand_vec((size_t)(T * kw), 2.0f),
              *v = rand_vec((size_t)(T * kw), 1.0f);
        if (which == 0) q[7 * qw + 3] = NAN;      /* query row 7, head 0 */
        if (which == 1) k[7 * kw + 3] = NAN;      /* key 7: every query from row 7 on */
        if (which == 2) q[7 * qw + 3] = INFINITY; /* Inf * k gives +-Inf scores, Inf - Inf = NaN */
        ok(be->ops->attention(be, q, k, v, o, &a, &err), &err);
        for (int64_t t = 0; t < T; t++) {
            int poisoned = which == 1 ? t >= 7 : t == 7;
            for (int64_t d = 0; d < D; d++) {
                if (poisoned && !isnan(o[t * qw + d]))
                    fail_msg("case %d: row %lld head 0 dim %lld = %g, want NaN", which, (long long)t, (long long)d,
                             o[t * qw + d]);
                if (!poisoned && !isfinite(o[t * qw + d])) fail_msg("case %d: row %lld not finite", which, (long long)t);
            }
            /* head 1 reads q head 1 (finite) and the shared kv head: poisoned only by k */
            int p1 = which == 1 && t >= 7;
            for (int64_t d = 0; d < D; d++)
                if (p1 != !!isnan(o[t * qw + D + d])) fail_msg("case %d: head 1 row %lld", which, (long long)t);
        }
        free(q), free(k), free(v);
    }
    free(o);
    be->ops->destroy(be);
}

/* More threads than libgomp survives is refused at creation (it crashed in
 * the first parallel region with --threads 100000). */
static void test_thread_limit(void **state) {
    clef_err err;
    clef_err_clear(&err);
    assert_null(clef_backend_cpu_create(100000, &err));
    assert_int_equal(err.status, 500);
    assert_non_null(strstr(err.message, "100000 threads"));
    assert_null(clef_backend_cpu_create(CLEF_CPU_MAX_THREADS + 1, &err));
    clef_backend *be = clef_backend_cpu_create(CLEF_CPU_MAX_THREADS, &err);
    assert_non_null(be);
    be->ops->destroy(be);
}

static void test_router(void **state) {
    clef_backend *be = cpu();
    clef_err err;
    const int64_t T = 20, E = 8, k = 3;
    float *l = rand_vec((size_t)(T * E), 4.0f), w[20 * 3];
    int32_t idx[20 * 3];
    l[5 * E + 2] = l[5 * E + 6] = 9.0f; /* an exact tie: lower expert first */
    ok(be->ops->router_topk(be, l, T, E, k, 1, idx, w, &err), &err);
    double ref[20 * 3];
    for (int64_t t = 0; t < T; t++) {
        double p[8], mx = -1e300, sum = 0;
        for (int64_t e = 0; e < E; e++) mx = fmax(mx, l[t * E + e]);
        for (int64_t e = 0; e < E; e++) sum += (p[e] = exp(l[t * E + e] - mx));
        int taken[8] = {0};
        double ks = 0;
        for (int64_t s = 0; s < k; s++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || l[t * E + e] > l[t * E + best])) best = e;
            taken[best] = 1;
            assert_int_equal(idx[t * k + s], best);
            ref[t * k + s] = p[best] / sum;
            ks += p[best] / sum;
        }
        for (int64_t s = 0; s < k; s++) ref[t * k + s] /= ks;
    }
    assert_int_equal(idx[5 * k], 2);
    assert_int_equal(idx[5 * k + 1], 6);
    near("router top-k", w, ref, (size_t)(T * k), 1e-6);
    free(l);
    be->ops->destroy(be);
}

static void test_moe(void **state) {
    clef_backend *be = cpu();
    clef_err err;
    const int64_t T = 70, H = 40, NI = 24, E = 6, k = 2;
    float *gf[6], *uf[6], *df[6];
    uint16_t *gh[6], *uh[6], *dh[6];
    clef_weight gw[6], uw[6], dw[6];
    for (int e = 0; e < E; e++) {
        gh[e] = rand_bf16((size_t)(NI * H), 0.3f, &gf[e]);
        uh[e] = rand_bf16((size_t)(NI * H), 0.3f, &uf[e]);
        dh[e] = rand_bf16((size_t)(H * NI), 0.3f, &df[e]);
        ok(be->ops->weight_init(be, &gw[e], CLEF_DT_BF16, NI, H, gh[e], &err), &err);
        ok(be->ops->weight_init(be, &uw[e], CLEF_DT_BF16, NI, H, uh[e], &err), &err);
        ok(be->ops->weight_init(be, &dw[e], CLEF_DT_BF16, H, NI, dh[e], &err), &err);
    }
    clef_moe_weights mw = {.n_experts = E, .hidden = H, .inter = NI, .gate = gw, .up = uw, .down = dw};
    float *x = rand_vec((size_t)(T * H), 1.0f), *y = malloc((size_t)(T * H) * sizeof *y), rw[70 * 2];
    int32_t idx[70 * 2];
    for (int64_t t = 0; t < T; t++) { /* expert 5 never used; expert 0 gets many tokens */
        idx[t * k] = (int32_t)(t % 3 == 0 ? 0 : (t * 7) % 5);
        idx[t * k + 1] = (int32_t)((idx[t * k] + 1 + t % 4) % 5);
        rw[t * k] = 0.25f + 0.5f * (frand() + 1.0f) / 2.0f;
        rw[t * k + 1] = 1.0f - rw[t * k];
    }
    ok(be->ops->moe(be, x, T, idx, rw, k, &mw, y, &err), &err);
    double *ref = calloc((size_t)(T * H), sizeof *ref);
    for (int64_t t = 0; t < T; t++)
        for (int64_t s = 0; s < k; s++) {
            int e = idx[t * k + s];
            double act[24];
            for (int64_t i = 0; i < NI; i++) {
                double g = 0, u = 0;
                for (int64_t h = 0; h < H; h++) {
                    g += (double)gf[e][i * H + h] * x[t * H + h];
                    u += (double)uf[e][i * H + h] * x[t * H + h];
                }
                act[i] = g / (1.0 + exp(-g)) * u;
            }
            for (int64_t h = 0; h < H; h++) {
                double d = 0;
                for (int64_t i = 0; i < NI; i++) d += (double)df[e][h * NI + i] * act[i];
                ref[t * H + h] += rw[t * k + s] * d;
            }
        }
    near("moe grouped", y, ref, (size_t)(T * H), 1e-5);
    /* one token alone, and a slice, give the same bytes as in the full batch */
    float *y1 = malloc((size_t)(T * H) * sizeof *y1);
    for (int64_t t = 0; t < T; t += 9) {
        ok(be->ops->moe(be, x + t * H, 1, idx + t * k, rw + t * k, k, &mw, y1, &err), &err);
        assert_memory_equal(y1, y + t * H, (size_t)H * sizeof(float));
    }
    ok(be->ops->moe(be, x + 13 * H, 40, idx + 13 * k, rw + 13 * k, k, &mw, y1, &err), &err);
    assert_memory_equal(y1, y + 13 * H, (size_t)(40 * H) * sizeof(float));
    int32_t bad[2] = {0, 6};
    assert_int_equal(be->ops->moe(be, x, 1, bad, rw, k, &mw, y1, &err), -1);
    for (int e = 0; e < E; e++) free(gf[e]), free(uf[e]), free(df[e]), free(gh[e]), free(uh[e]), free(dh[e]);
    free(x), free(y), free(y1), free(ref);
    be->ops->destroy(be);
}

/* The attention softmax's exp against libm in double over [-87, 0]. */
static void test_exp8(void **state) {
    double worst = 0;
    for (int i = 0; i < 200000; i += 8) {
        float v[8], x[8];
        for (int u = 0; u < 8; u++) x[u] = v[u] = -87.0f * (float)(i + u) / 200000.0f;
        cpu_exp8(v);
        for (int u = 0; u < 8; u++) {
            double want = exp((double)x[u]), rel = fabs(v[u] - want) / want;
            if (rel > worst) worst = rel;
        }
    }
    float e[8] = {0.0f, -1.0f, -0.5f, -1e-8f, -100.0f, -INFINITY, NAN, -20.0f};
    cpu_exp8(e);
    assert_true(e[0] == 1.0f);
    assert_true(fabs(e[1] - exp(-1.0)) < 1e-7);
    assert_true(e[4] >= 0.0f && e[4] < 2e-38f && e[5] >= 0.0f && e[5] < 2e-38f); /* clamped, finite */
    assert_true(isnan(e[6])); /* a NaN score stays NaN: never laundered into a finite weight */
    assert_true(e[7] > 0.0f && fabs(e[7] - exp(-20.0)) < 1e-15); /* its neighbour lane is untouched */
    printf("  exp8                   max rel err %.3g (%.2f ulp)\n", worst, worst / 5.96e-8);
    assert_true(worst < 2.5e-7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_bf16),  cmocka_unit_test(test_matmul_f32_f16),
        cmocka_unit_test(test_gather),       cmocka_unit_test(test_norms),
        cmocka_unit_test(test_elementwise),  cmocka_unit_test(test_head_rows),
        cmocka_unit_test(test_rope),         cmocka_unit_test(test_fused_row_ops),
        cmocka_unit_test(test_attention_causal_gqa),
        cmocka_unit_test(test_attention_cross), cmocka_unit_test(test_router),
        cmocka_unit_test(test_moe),          cmocka_unit_test(test_exp8),
        cmocka_unit_test(test_attention_nan_propagates), cmocka_unit_test(test_thread_limit),
    };
    if (getenv("CPU_OPS_FILTER")) cmocka_set_test_filter(getenv("CPU_OPS_FILTER")); /* one test by name */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
