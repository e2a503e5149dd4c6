/* test_cpu_gemm.c — the CPU backend's GEMM (backend/cpu/cpu_gemm.h) holds
 * its one numerical rule: C[m, n] = fmaf chain over k = 0..K-1 from +0 (then
 * + bias), for every instruction set this processor runs, every weight
 * format, every B layout, and whatever the rows, tiles, k blocks, panels,
 * threads and other jobs around an element.
 *
 *   - each variant against a plain fmaf loop over the decoded weights
 *     (clef_qweight_rows_f32): bitwise, for f32 / bf16 / f16 / INT4
 *     (symmetric and asymmetric) / NVFP4 (both forms) / FP8-block weights and the
 *     attention layouts (keys by row, values by column), at shapes with
 *     tails in M, N and K;
 *   - the matmul driver (cpu_mm_run, threads over panels x row chunks):
 *     one job or many, any thread count, bitwise the same rows;
 *   - the grouped MoE at real-ish widths: tokens routed in several mixes
 *     (alone, slices, the batch reversed, duplicated) give bitwise the same
 *     rows, on bf16, INT4, NVFP4 (ModelOpt) and FP8 experts;
 *   - the vectorised fills (bf16 transposes, INT4 decoded in place) hold
 *     the decoder's values: a wrong nibble or lane would break the above;
 *   - the NVFP4 (both forms) and FP8 fills, panel by panel, bit for bit
 *     the decoder over every FP4 / E4M3 code and scale (NaNs excluded). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_internal.h"
#include "quant/qweight.h"
#include "testutil.h"

static uint64_t rng_state = 0x5851f42d4c957f2dull;
static float frand(void) { return tu_rand_f32(&rng_state); }
static uint32_t urand(void) { return (uint32_t)tu_rand_u64(&rng_state); }

/* A finite f16 of magnitude in [2^(e0-15), 2^(e0+ne-15)), random sign when `sign`. */
static uint16_t f16_rand(int e0, int ne, int sign) {
    return (uint16_t)((sign ? (urand() & 0x8000u) : 0u) | ((uint32_t)(e0 + (int)(urand() % (uint32_t)ne)) << 10) |
                      (urand() & 0x3FFu));
}

static void *xalloc(size_t bytes) {
    void *p = NULL;
    assert_int_equal(posix_memalign(&p, 64, bytes ? bytes : 64), 0);
    return p;
}

/* A weight of one format over random packed bytes, with its decoded f32 values. */
typedef struct test_w {
    clef_weight w;
    void *data, *scale, *zeros;
    float *f; /* [N, K] decoded */
    const char *name;
} test_w;

static void decode(test_w *t) {
    const clef_qweight q = {.dtype = t->w.dtype, .rows = t->w.rows, .cols = t->w.cols, .data = t->w.data,
                            .quant = t->w.quant};
    t->f = xalloc((size_t)(t->w.rows * t->w.cols) * sizeof(float));
    clef_qweight_rows_f32(&q, 0, t->w.rows, t->f);
}

enum { W_F32, W_BF16, W_F16, W_INT4, W_INT4_ASYM, W_NVFP4, W_NVFP4_MO, W_FP8, W_COUNT };

static test_w make_w(int kind, int64_t N, int64_t K) {
    test_w t = {.name = NULL};
    const size_t NK = (size_t)(N * K);
    switch (kind) {
    case W_F32: {
        float *d = xalloc(NK * sizeof *d);
        for (size_t i = 0; i < NK; i++) d[i] = frand();
        t.data = d, t.name = "f32";
        t.w = (clef_weight){.dtype = CLEF_DT_F32, .rows = N, .cols = K, .data = d};
        break;
    }
    case W_BF16:
    case W_F16: {
        uint16_t *d = xalloc(NK * sizeof *d);
        for (size_t i = 0; i < NK; i++) d[i] = kind == W_BF16 ? clef_f32_to_bf16(frand()) : f16_rand(11, 6, 1);
        t.data = d, t.name = kind == W_BF16 ? "bf16" : "f16";
        t.w = (clef_weight){.dtype = kind == W_BF16 ? CLEF_DT_BF16 : CLEF_DT_F16, .rows = N, .cols = K, .data = d};
        break;
    }
    case W_INT4:
    case W_INT4_ASYM: { /* K % G == 0, N % 8 == 0 */
        const int64_t G = 32;
        uint32_t *q = xalloc((size_t)(K / 8 * N) * 4), *z = xalloc((size_t)(K / G * N / 8) * 4);
        uint16_t *s = xalloc((size_t)(K / G * N) * 2);
        for (int64_t i = 0; i < K / 8 * N; i++) q[i] = urand();
        for (int64_t i = 0; i < K / G * N; i++) s[i] = f16_rand(8, 3, 0);
        for (int64_t i = 0; i < K / G * N / 8; i++) z[i] = urand();
        t.data = q, t.scale = s, t.zeros = z, t.name = kind == W_INT4 ? "int4" : "int4-asym";
        t.w = (clef_weight){.dtype = CLEF_DT_I32, .rows = N, .cols = K, .data = q,
                            .quant = {.type = CLEF_QT_INT4_GPTQ, .scale = s, .zeros = kind == W_INT4 ? NULL : z,
                                      .group = G}};
        break;
    }
    case W_NVFP4:
    case W_NVFP4_MO: { /* K % 16 == 0; compressed-tensors (divisor) or ModelOpt (multiplier) */
        uint8_t *q = xalloc(NK / 2), *s = xalloc(NK / 16);
        for (size_t i = 0; i < NK / 2; i++) q[i] = (uint8_t)urand();
        for (size_t i = 0; i < NK / 16; i++) s[i] = (uint8_t)(0x28 + urand() % 32); /* finite E4M3 */
        t.data = q, t.scale = s, t.name = kind == W_NVFP4 ? "nvfp4" : "nvfp4-modelopt";
        t.w = (clef_weight){.dtype = CLEF_DT_U8, .rows = N, .cols = K, .data = q,
                            .quant = {.type = CLEF_QT_NVFP4, .scale = s, .group = 16,
                                      .global = kind == W_NVFP4 ? 3.0f : 0.037f, .global_div = kind == W_NVFP4}};
        break;
    }
    case W_FP8: {
        const int64_t br = 16, bc = 32, nbr = (N + br - 1) / br, nbc = (K + bc - 1) / bc;
        uint8_t *q = xalloc(NK);
        float *s = xalloc((size_t)(nbr * nbc) * 4);
        for (size_t i = 0; i < NK; i++) {
            q[i] = (uint8_t)urand();
            if ((q[i] & 0x7F) == 0x7F) q[i] = 0; /* no NaN codes */
        }
        for (int64_t i = 0; i < nbr * nbc; i++) s[i] = 0.001f * (1.0f + frand());
        t.data = q, t.scale = s, t.name = "fp8-block";
        t.w = (clef_weight){.dtype = CLEF_DT_F8_E4M3, .rows = N, .cols = K, .data = q,
                            .quant = {.type = CLEF_QT_FP8_BLOCK, .scale = s, .block_r = br, .block_c = bc}};
        break;
    }
    }
    decode(&t);
    return t;
}

static void free_w(test_w *t) { free(t->data), free(t->scale), free(t->zeros), free(t->f); }

/* The contract itself, for C[m, n] with B(k, n) = bt(n, k). */
static void ref_chain(const float *A, int64_t lda, int64_t M, const float *Bnk, int64_t N, int64_t K, const float *bias,
                      float *C, int64_t ldc) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc = fmaf(A[m * lda + k], Bnk[n * K + k], acc);
            C[m * ldc + n] = bias ? acc + bias[n] : acc;
        }
}

/* Every column of b for isa into C (scratch from the heap): in one range,
 * or (split) panel by panel in reverse order. */
static void run_panels(cpu_isa isa, const float *A, int64_t lda, int64_t M, const cpu_gemm_b *b, const float *bias,
                       float *C, int64_t ldc, int split) {
    float *scratch = xalloc(cpu_gemm_scratch_floats(isa) * sizeof(float));
    const int64_t NR = cpu_gemm_nr(isa);
    if (!split)
        cpu_gemm_cols(isa, A, lda, M, b, 0, b->N, bias, C, ldc, scratch);
    else
        for (int64_t n0 = (b->N - 1) / NR * NR; n0 >= 0; n0 -= NR)
            cpu_gemm_cols(isa, A, lda, M, b, n0, n0 + NR, bias, C, ldc, scratch);
    free(scratch);
}

static int n_isas(cpu_isa *out) {
    int n = 0;
    for (int i = 0; i < CPU_ISA_COUNT; i++)
        if (cpu_isa_supported((cpu_isa)i)) out[n++] = (cpu_isa)i;
    return n;
}

/* First differing element of two [M, N] blocks (ld apart), or -1. */
static int64_t first_diff(const float *a, const float *b, int64_t M, int64_t N, int64_t ld) {
    for (int64_t m = 0; m < M; m++)
        if (memcmp(a + m * ld, b + m * ld, (size_t)N * sizeof(float)))
            for (int64_t n = 0; n < N; n++)
                if (memcmp(a + m * ld + n, b + m * ld + n, sizeof(float))) return m * ld + n;
    return -1;
}

/* Each supported variant, each weight format, shapes with tails everywhere. */
static void test_chain_every_isa_and_format(void **state) {
    cpu_isa isas[CPU_ISA_COUNT];
    const int ni = n_isas(isas);
    assert_true(ni >= 1);
    printf("  instruction sets here:");
    for (int i = 0; i < ni; i++) printf(" %s", cpu_isa_name(isas[i]));
    printf(" (best %s)\n", cpu_isa_name(cpu_isa_best()));
    /* M: 1 row, a partial tile, tiles of every size; N: a partial panel, several;
     * K: one short block, exactly one, two blocks and a tail (all multiples of 32 for
     * the packed formats' groups) */
    const int64_t Ms[] = {1, 5, 7, 19, 64};
    /* the last two: K not a multiple of 16 or 8 (a k tail inside a 16- or 32-k
     * step of the transposing fills) and 17 columns (one row in the last group),
     * for the unpacked dtypes only (packed formats need K % 32 here) */
    const int64_t NKs[][2] = {{8, 32}, {72, 160}, {136, 288}, {64, 512}, {40, 1056}, {17, 531}, {24, 37}};
    const size_t n_packed_ok = 5;
    size_t checked = 0;
    for (int kind = 0; kind < W_COUNT; kind++)
        for (size_t s = 0; s < sizeof NKs / sizeof *NKs; s++) {
            if (s >= n_packed_ok && kind != W_F32 && kind != W_BF16 && kind != W_F16) continue;
            const int64_t N = NKs[s][0], K = NKs[s][1];
            test_w t = make_w(kind, N, K);
            float *bias = tu_rand_vec(&rng_state, (size_t)N, 1.0f);
            for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
                const int64_t M = Ms[mi], lda = K + 3, ldc = N + 5;
                float *A = tu_rand_vec(&rng_state, (size_t)(M * lda), 1.0f);
                float *want = xalloc((size_t)(M * ldc) * sizeof(float)), *got = xalloc((size_t)(M * ldc) * sizeof(float));
                const float *bs = mi % 2 ? bias : NULL;
                ref_chain(A, lda, M, t.f, N, K, bs, want, ldc);
                const cpu_gemm_b b = {.kind = CPU_B_WEIGHT, .w = &t.w, .N = N, .K = K};
                for (int i = 0; i < ni; i++) {
                    memset(got, 0xA5, (size_t)(M * ldc) * sizeof(float));
                    run_panels(isas[i], A, lda, M, &b, bs, got, ldc, (int)(mi + s) % 2);
                    int64_t d = first_diff(got, want, M, N, ldc);
                    if (d >= 0)
                        fail_msg("%s %s: M %lld N %lld K %lld: C[%lld, %lld] = %.9g, chain %.9g", cpu_isa_name(isas[i]),
                                 t.name, (long long)M, (long long)N, (long long)K, (long long)(d / ldc),
                                 (long long)(d % ldc), got[d], want[d]);
                    /* nothing written outside the columns */
                    for (int64_t m = 0; m < M; m++)
                        for (int64_t n = N; n < ldc; n++) {
                            uint32_t u;
                            memcpy(&u, got + m * ldc + n, 4);
                            assert_int_equal(u, 0xA5A5A5A5u);
                        }
                    checked += (size_t)(M * N);
                }
                free(A), free(want), free(got);
            }
            free(bias);
            free_w(&t);
        }
    printf("  %zu elements over %d formats: every variant bitwise the fmaf chain\n", checked, W_COUNT);
}

/* The chain is a real constraint: a plain product-then-add loop, or the
 * same sum in double, differs from it on these inputs (so the test above
 * could fail). */
static void test_chain_is_not_trivial(void **state) {
    const int64_t M = 4, N = 16, K = 300;
    float *A = tu_rand_vec(&rng_state, (size_t)(M * K), 1.0f), *B = tu_rand_vec(&rng_state, (size_t)(N * K), 1.0f);
    float C[64], D[64], E[64];
    ref_chain(A, K, M, B, N, K, NULL, C, N);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            volatile float acc = 0.0f;
            double dd = 0;
            for (int64_t k = 0; k < K; k++) {
                volatile float p = A[m * K + k] * B[n * K + k];
                acc = acc + p;
                dd += (double)A[m * K + k] * B[n * K + k];
            }
            D[m * N + n] = acc;
            E[m * N + n] = (float)dd;
        }
    assert_true(memcmp(C, D, sizeof C) != 0);
    assert_true(memcmp(C, E, sizeof C) != 0);
    free(A), free(B);
}

/* Attention's layouts: keys as rows of a strided f32 matrix (CPU_B_NK), values
 * as k-major columns (CPU_B_KN, read in place for whole panels). */
static void test_attention_layouts(void **state) {
    cpu_isa isas[CPU_ISA_COUNT];
    const int ni = n_isas(isas);
    const int64_t D = 136, nk = 203, M = 13, ld = 300; /* D: two 64-panels and a tail */
    float *Q = tu_rand_vec(&rng_state, (size_t)(M * ld), 1.0f), *Km = tu_rand_vec(&rng_state, (size_t)(nk * ld), 1.0f);
    float *P = tu_rand_vec(&rng_state, (size_t)(M * nk), 1.0f);
    /* QK^T: B(k, n) = Km[n * ld + k], k < D */
    float *bt = xalloc((size_t)(nk * D) * 4), *want = xalloc((size_t)(M * nk) * 4), *got = xalloc((size_t)(M * nk) * 4);
    for (int64_t n = 0; n < nk; n++) memcpy(bt + n * D, Km + n * ld, (size_t)D * 4);
    ref_chain(Q, ld, M, bt, nk, D, NULL, want, nk);
    const cpu_gemm_b kb = {.kind = CPU_B_NK, .m = Km, .ld = ld, .N = nk, .K = D};
    for (int i = 0; i < ni; i++) {
        run_panels(isas[i], Q, ld, M, &kb, NULL, got, nk, i % 2);
        assert_int_equal(first_diff(got, want, M, nk, nk), -1);
    }
    /* PV: B(k, n) = Km[k * ld + n], k < nk, n < D */
    float *bv = xalloc((size_t)(D * nk) * 4), *w2 = xalloc((size_t)(M * D) * 4), *g2 = xalloc((size_t)(M * D) * 4);
    for (int64_t n = 0; n < D; n++)
        for (int64_t k = 0; k < nk; k++) bv[n * nk + k] = Km[k * ld + n];
    ref_chain(P, nk, M, bv, D, nk, NULL, w2, D);
    const cpu_gemm_b vb = {.kind = CPU_B_KN, .m = Km, .ld = ld, .N = D, .K = nk};
    for (int i = 0; i < ni; i++) {
        run_panels(isas[i], P, nk, M, &vb, NULL, g2, D, i % 2);
        assert_int_equal(first_diff(g2, w2, M, D, D), -1);
    }
    printf("  keys by row and values by column: bitwise the chain on %d variants\n", ni);
    free(Q), free(Km), free(P), free(bt), free(want), free(got), free(bv), free(w2), free(g2);
}

/* The driver: rows in one product, alone, in slices and next to other
 * products, on 1, 2 and 7 threads, bitwise the same (and the chain). */
static void test_driver_rows_and_threads(void **state) {
    clef_err err;
    clef_err_clear(&err);
    const int64_t T = 300, N = 520, K = 256;
    test_w t = make_w(W_BF16, N, K), t2 = make_w(W_INT4, 64, K);
    float *x = tu_rand_vec(&rng_state, (size_t)(T * K), 1.0f), *bias = tu_rand_vec(&rng_state, (size_t)N, 1.0f);
    float *want = xalloc((size_t)(T * N) * 4), *y = xalloc((size_t)(T * N) * 4), *y2 = xalloc((size_t)(T * 64) * 4);
    ref_chain(x, K, T, t.f, N, K, bias, want, N);
    const int threads[] = {1, 2, 7};
    for (size_t ti = 0; ti < 3; ti++) {
        clef_backend *be = clef_backend_cpu_create(threads[ti], &err);
        assert_non_null(be);
        tu_ok(be->ops->matmul(be, x, T, &t.w, bias, y, &err), &err);
        assert_int_equal(first_diff(y, want, T, N, N), -1);
        for (int64_t r = 0; r < T; r += 37) { /* alone */
            tu_ok(be->ops->matmul(be, x + r * K, 1, &t.w, bias, y, &err), &err);
            assert_memory_equal(y, want + r * N, (size_t)N * 4);
        }
        tu_ok(be->ops->matmul(be, x + 45 * K, 77, &t.w, bias, y, &err), &err); /* a slice from mid-tile */
        assert_memory_equal(y, want + 45 * N, (size_t)(77 * N) * 4);
        /* two jobs in one run (the q / k / v pattern) */
        cpu_mm_job jobs[2] = {{x, T, &t.w, bias, y, N}, {x + 10 * K, 30, &t2.w, NULL, y2, 64}};
        tu_ok(cpu_mm_run(cpu_of(be), jobs, 2, &err), &err);
        assert_int_equal(first_diff(y, want, T, N, N), -1);
        float *w2 = xalloc((size_t)(30 * 64) * 4);
        ref_chain(x + 10 * K, K, 30, t2.f, 64, K, NULL, w2, 64);
        assert_int_equal(first_diff(y2, w2, 30, 64, 64), -1);
        free(w2);
        be->ops->destroy(be);
    }
    printf("  %lld x %lld x %lld: whole, alone, sliced, with another job, on 1/2/7 threads: bitwise\n", (long long)T,
           (long long)N, (long long)K);
    free_w(&t), free_w(&t2), free(x), free(bias), free(want), free(y), free(y2);
}

/* The grouped MoE at real-ish widths (H 256, I 192, 16 experts, top 4):
 * tokens in several mixes give bitwise the rows of the whole batch. */
static void moe_mixes(int kind) {
    clef_err err;
    clef_err_clear(&err);
    const int64_t T = 150, H = 256, NI = 192, E = 16, k = 4;
    test_w g[16], u[16], d[16];
    clef_weight gw[16], uw[16], dw[16];
    for (int e = 0; e < E; e++) {
        g[e] = make_w(kind, NI, H), u[e] = make_w(kind, NI, H), d[e] = make_w(kind, H, NI);
        gw[e] = g[e].w, uw[e] = u[e].w, dw[e] = d[e].w;
    }
    const clef_moe_weights mw = {.n_experts = E, .hidden = H, .inter = NI, .gate = gw, .up = uw, .down = dw};
    float *x = tu_rand_vec(&rng_state, (size_t)(T * H), 1.0f), *rw = malloc((size_t)(T * k) * 4);
    int32_t *idx = malloc((size_t)(T * k) * 4);
    for (int64_t t = 0; t < T; t++) { /* expert 3 hot, expert 15 never */
        int used = 0;
        for (int64_t s = 0; s < k; s++) {
            int e;
            do e = (s == 0 && t % 2) ? 3 : (int)(urand() % 15);
            while (used & (1 << e));
            used |= 1 << e;
            idx[t * k + s] = e;
            rw[t * k + s] = 0.1f + 0.2f * (frand() + 1.0f);
        }
    }
    /* reversed and duplicated copies of the rows */
    float *xr = malloc((size_t)(2 * T * H) * 4), *rwr = malloc((size_t)(2 * T * k) * 4);
    int32_t *idxr = malloc((size_t)(2 * T * k) * 4);
    for (int64_t t = 0; t < T; t++)
        for (int c = 0; c < 2; c++) {
            const int64_t dst = c ? T + t : T - 1 - t;
            memcpy(xr + dst * H, x + t * H, (size_t)H * 4);
            memcpy(rwr + dst * k, rw + t * k, (size_t)k * 4);
            memcpy(idxr + dst * k, idx + t * k, (size_t)k * 4);
        }
    float *y = malloc((size_t)(T * H) * 4), *y1 = malloc((size_t)(2 * T * H) * 4);
    const int threads[] = {2, 5};
    for (size_t ti = 0; ti < 2; ti++) {
        clef_backend *be = clef_backend_cpu_create(threads[ti], &err);
        tu_ok(be->ops->moe(be, x, T, idx, rw, k, &mw, y, &err), &err);
        for (int64_t t = 0; t < T; t += 11) {
            tu_ok(be->ops->moe(be, x + t * H, 1, idx + t * k, rw + t * k, k, &mw, y1, &err), &err);
            assert_memory_equal(y1, y + t * H, (size_t)H * 4);
        }
        tu_ok(be->ops->moe(be, x + 17 * H, 61, idx + 17 * k, rw + 17 * k, k, &mw, y1, &err), &err);
        assert_memory_equal(y1, y + 17 * H, (size_t)(61 * H) * 4);
        tu_ok(be->ops->moe(be, xr, 2 * T, idxr, rwr, k, &mw, y1, &err), &err);
        for (int64_t t = 0; t < T; t++) {
            assert_memory_equal(y1 + (T - 1 - t) * H, y + t * H, (size_t)H * 4);
            assert_memory_equal(y1 + (T + t) * H, y + t * H, (size_t)H * 4);
        }
        be->ops->destroy(be);
    }
    /* and the rows are right: token 0 against a double-precision loop */
    double worst = 0;
    for (int64_t t = 0; t < 3; t++) {
        double ref[256] = {0};
        for (int64_t s = 0; s < k; s++) {
            const int e = idx[t * k + s];
            double act[192];
            for (int64_t i = 0; i < NI; i++) {
                double gg = 0, uu = 0;
                for (int64_t h = 0; h < H; h++) {
                    gg += (double)g[e].f[i * H + h] * x[t * H + h];
                    uu += (double)u[e].f[i * H + h] * x[t * H + h];
                }
                act[i] = gg / (1.0 + exp(-gg)) * uu;
            }
            for (int64_t h = 0; h < H; h++) {
                double dd = 0;
                for (int64_t i = 0; i < NI; i++) dd += (double)d[e].f[h * NI + i] * act[i];
                ref[h] += rw[t * k + s] * dd;
            }
        }
        for (int64_t h = 0; h < H; h++) {
            const double diff = fabs(y[t * H + h] - ref[h]) / (1.0 + fabs(ref[h]));
            if (diff > worst) worst = diff;
        }
    }
    printf("  moe %s: alone, sliced, reversed + duplicated, 2/5 threads: bitwise; vs double %.2g\n", g[0].name, worst);
    assert_true(worst < 1e-4);
    for (int e = 0; e < E; e++) free_w(&g[e]), free_w(&u[e]), free_w(&d[e]);
    free(x), free(rw), free(idx), free(xr), free(rwr), free(idxr), free(y), free(y1);
}

static void test_moe_mixes_bf16(void **state) { moe_mixes(W_BF16); }
static void test_moe_mixes_int4(void **state) { moe_mixes(W_INT4_ASYM); }
static void test_moe_mixes_nvfp4(void **state) { moe_mixes(W_NVFP4_MO); }
static void test_moe_mixes_fp8(void **state) { moe_mixes(W_FP8); }

/* ---- the packed-format fills against the decoder ---- */

/* Every panel block of t's weight from isa's fill against the decoded
 * weights (clef_qweight_rows_f32), bit for bit, +0 past the last column;
 * returns the elements compared. */
static size_t fills_match_decode(const test_w *t, cpu_isa isa) {
    const int64_t N = t->w.rows, K = t->w.cols, NR = cpu_gemm_nr(isa);
    const cpu_gemm_b b = {.kind = CPU_B_WEIGHT, .w = &t->w, .N = N, .K = K};
    float *P = xalloc(cpu_gemm_scratch_floats(isa) * sizeof(float));
    size_t n = 0;
    for (int64_t n0 = 0; n0 < N; n0 += NR)
        for (int64_t k0 = 0; k0 < K; k0 += CPU_GEMM_KC) {
            const int64_t nr = N - n0 < NR ? N - n0 : NR, kc = K - k0 < CPU_GEMM_KC ? K - k0 : CPU_GEMM_KC;
            memset(P, 0xA5, cpu_gemm_scratch_floats(isa) * sizeof(float));
            cpu_gemm_fill(isa, &b, n0, nr, k0, kc, P);
            for (int64_t k = 0; k < kc; k++)
                for (int64_t j = 0; j < NR; j++) {
                    const float want = j < nr ? t->f[(n0 + j) * K + k0 + k] : 0.0f;
                    uint32_t g, e;
                    memcpy(&g, P + k * NR + j, 4), memcpy(&e, &want, 4);
                    if (g != e)
                        fail_msg("%s fill %s (%s): W[%lld, %lld] = %a (0x%08x), decoder %a (0x%08x)", cpu_isa_name(isa),
                                 cpu_gemm_fill_name(isa, &b), t->name, (long long)(n0 + j), (long long)(k0 + k),
                                 (double)P[k * NR + j], g, (double)want, e);
                    n++;
                }
        }
    free(P);
    return n;
}

/* Shuffled in place. */
static void shuffle_bytes(uint8_t *p, size_t n) {
    for (size_t i = n; i > 1; i--) {
        const size_t j = urand() % i;
        const uint8_t x = p[i - 1];
        p[i - 1] = p[j], p[j] = x;
    }
}

/* n bytes cycling through the codes c (0..255) with !skip(c), shuffled: every such code appears when n >= their count. */
static void fill_codes(uint8_t *p, size_t n, int skip_nan) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) {
        while (skip_nan && (c & 0x7F) == 0x7F) c = (c + 1) & 255;
        p[i] = (uint8_t)c;
        c = (c + 1) & 255;
    }
    shuffle_bytes(p, n);
}

/* A random f32 bit pattern: any sign, any finite exponent (subnormals and
 * magnitudes past 2^120 included), now and then ±0. */
static float any_finite_f32(void) {
    const uint32_t r = urand();
    uint32_t u = (r & 0x807FFFFFu) | ((urand() % 255u) << 23);
    if (r % 61 == 0) u &= 0x80000000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* NVFP4 in both forms and FP8 blocks of several shapes: each supported
 * variant's fill bitwise the decoder, over every FP4 code in both nibbles,
 * every finite E4M3 scale code (NVFP4) and element code (FP8), per-tensor
 * scales whose results overflow or go subnormal, f32 block scales of every
 * exponent, and N, K with tails (a partial 16-row group, a partial 64-wide
 * panel, a partial k block, K % 16 != 0 for FP8).  On AVX2 and AVX-512
 * the NVFP4 and FP8 weights must take the vector fills, not the generic
 * decode (except FP8 with Bc % 8 != 0). */
static void test_fills_bitwise_decode(void **state) {
    cpu_isa isas[CPU_ISA_COUNT];
    const int ni = n_isas(isas);
    size_t checked = 0, n_weights = 0;
    /* NVFP4: N 37 = 16 + 16 + 5 rows, K 656 = 512 + 144 */
    const float globals[] = {3.0f, 2688.0f / 0.0173f, 0.37f, 1e35f, 1e-36f, 0x1p-126f};
    for (int form = 0; form < 2; form++)
        for (size_t gi = 0; gi < sizeof globals / sizeof *globals; gi++) {
            const int64_t N = 37, K = 656;
            test_w t = make_w(form ? W_NVFP4_MO : W_NVFP4, N, K);
            uint8_t *q = t.data, *s = t.scale;
            fill_codes(q, (size_t)(N * K / 2), 0); /* all 256 bytes: every code as low and as high nibble */
            fill_codes(s, (size_t)(N * K / 16), 1); /* the 254 finite E4M3 scales, negatives, ±0, subnormals */
            t.w.quant.global = globals[gi];
            free(t.f);
            decode(&t);
            for (int i = 0; i < ni; i++) {
                const cpu_gemm_b b = {.kind = CPU_B_WEIGHT, .w = &t.w, .N = N, .K = K};
                if (isas[i] != CPU_ISA_SCALAR) assert_string_equal(cpu_gemm_fill_name(isas[i], &b), "nvfp4");
                checked += fills_match_decode(&t, isas[i]);
            }
            n_weights++;
            free_w(&t);
        }
    /* FP8: blocks (Br, Bc); (3, 20) has Bc % 8 != 0, so the generic decode */
    const int64_t blocks[][2] = {{128, 128}, {16, 32}, {7, 24}, {1, 8}, {5, 40}, {3, 20}};
    const int64_t shapes[][2] = {{37, 531}, {21, 1040}, {8, 16}, {70, 9}};
    for (size_t bi = 0; bi < sizeof blocks / sizeof *blocks; bi++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            const int64_t N = shapes[si][0], K = shapes[si][1], br = blocks[bi][0], bc = blocks[bi][1];
            const int64_t nbr = (N + br - 1) / br, nbc = (K + bc - 1) / bc;
            uint8_t *q = xalloc((size_t)(N * K));
            float *s = xalloc((size_t)(nbr * nbc) * 4);
            fill_codes(q, (size_t)(N * K), 1); /* the 254 non-NaN codes */
            for (int64_t i = 0; i < nbr * nbc; i++) s[i] = any_finite_f32();
            if (nbr * nbc > 2) s[0] = 0x1p120f, s[1] = -0x1.fffffep127f; /* 256 s overflows: the two-multiply path */
            test_w t = {.data = q, .scale = s, .name = "fp8-block"};
            t.w = (clef_weight){.dtype = CLEF_DT_F8_E4M3, .rows = N, .cols = K, .data = q,
                                .quant = {.type = CLEF_QT_FP8_BLOCK, .scale = s, .block_r = br, .block_c = bc}};
            decode(&t);
            for (int i = 0; i < ni; i++) {
                const cpu_gemm_b b = {.kind = CPU_B_WEIGHT, .w = &t.w, .N = N, .K = K};
                if (isas[i] != CPU_ISA_SCALAR)
                    assert_string_equal(cpu_gemm_fill_name(isas[i], &b), bc % 8 ? "generic" : "fp8");
                checked += fills_match_decode(&t, isas[i]);
            }
            n_weights++;
            free_w(&t);
        }
    printf("  %zu weights, %zu panel elements: every variant's NVFP4 / ModelOpt / FP8 fill bitwise the decoder\n",
           n_weights, checked);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_every_isa_and_format),
        cmocka_unit_test(test_chain_is_not_trivial),
        cmocka_unit_test(test_attention_layouts),
        cmocka_unit_test(test_driver_rows_and_threads),
        cmocka_unit_test(test_moe_mixes_bf16),
        cmocka_unit_test(test_moe_mixes_int4),
        cmocka_unit_test(test_moe_mixes_nvfp4),
        cmocka_unit_test(test_moe_mixes_fp8),
        cmocka_unit_test(test_fills_bitwise_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
