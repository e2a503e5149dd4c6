/* test_cuda_ops.c — every CUDA backend op against the CPU reference backend
 * on fresh random inputs (relative L2 error printed), and the determinism
 * promise of backend.h on the GPU: a row / token / segment gives bitwise the
 * same result alone, in a slice, or packed into a larger batch (including
 * batches large enough to switch the GEMM to its big tiles).  Skipped when
 * no CUDA device is present.
 *
 * Tolerances (relative L2 error vs the CPU's f32 result):
 *   f32 ops (norms, RoPE, adds, activations, router, head row ops,
 *   f32 attention, gather)                                    1e-6 .. 1e-5
 *     the CPU and GPU differ only in reduction order and libm ulps.
 *   bf16-activation products (matmul, grouped experts)         1e-2
 *     each activation is rounded to bf16 (relative error <= 2^-9 ≈ 2e-3,
 *     rms ≈ 1.1e-3); a dot product of K such terms with random signs has a
 *     relative error of the same order (observed ~3e-3), accumulation is
 *     f32.  1e-2 leaves ~3x margin and still fails on any indexing bug
 *     (which gives errors of order 1).
 *   tensor-core attention (bf16 Q, K, V and probabilities)      1e-2 (same argument)
 *   precise mode (the default: split bf16 activations)          1e-5
 *     x = hi + lo to 2^-17 relative, weights are exactly bf16 (observed
 *     ~1e-6 .. 6e-6: the CPU's f32 sums differ in order only).
 *   precise tensor-core attention (hi.hi + hi.lo + lo.hi)       3e-5
 *     each factor of Q K^T and P V is hi + lo to 2^-17 and the dropped
 *     lo.lo term is <= 2^-16 of a product, so a score or an output term is
 *     off by a few 1e-6 relative; the softmax (exp2 of scaled scores) adds
 *     f32 ulps.  3e-5 is ~300x below the bf16 kernel's error, so any
 *     missing term (hi.lo alone is ~2^-9) fails it.
 * The precise mode is checked with both dense paths: cuBLASLt on the
 * stacked [hi; lo] rows (gemm = 2 forces cuBLASLt where an algorithm
 * exists) and the split custom kernel; and with CLEF_CUDA_TUNE=0 (64-row
 * expert tiles, two K/V buffers in attention), bitwise equal to the default.
 * Two more backends (fast and precise) run with CLEF_CUDA_LT_SPLITK=2: the
 * dense products use a split-K cuBLASLt algorithm wherever a shape has one
 * that passed the backend's checks, so the matmul tests (the model's
 * projection shapes at 1, 300 and 8300 rows included) hold split-K to the
 * same CPU agreement and bitwise row invariance.
 * Attention is also checked with the v1 kernel (CLEF_CUDA_ATTN=v1, fast and
 * precise), with 128-row tiles in the precise mode (CLEF_CUDA_ATTN=v2w), and
 * in the fast mode with v2 and v2s forced (CLEF_CUDA_ATTN=v2 / v2s: 128- and
 * 64-row blocks on the same 32-key tiles), both bitwise the default.
 * With CLEF_ATTN_BENCH=1 the attention op is timed at 8 x 4096 and 32 x 1000
 * tokens (32 query heads of 128, 4 KV heads, causal) for every kernel and mode.
 * Every GPU output is poisoned with NaN before the op, so an element the
 * op forgot to write fails the check. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "backend/cuda/cuda.h"
#include "testutil.h"

#define TOL_F32 1e-6
#define TOL_BF16 1e-2
#define TOL_PRECISE 1e-5
#define TOL_PRECISE_ATTN 3e-5
#define N_GPU 7

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float frand(void) { return tu_rand_f32(&rng_state); }

static float *rand_vec(size_t n, float scale) { return tu_rand_vec(&rng_state, n, scale); }

static uint16_t *rand_bf16(size_t n, float scale) {
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = clef_f32_to_bf16(frand() * scale);
    return h;
}

/* The backends under test: cuBLASLt dense products, the custom kernel for
 * them, and the precise mode; plus the CPU reference. */
/* attention-only backends: the v1 kernel (fast, precise), v2 with 128-row tiles when precise, and the
 * fast mode's v2 (128-row blocks) and v2s (64-row blocks) forced */
enum { A_V1, A_V1_PRECISE, A_V2_PRECISE, A_V2, A_V2S, N_ALT };
/* the precise default is v2w (128-row tiles): the alternative checks v2's 64-row precise kernel */
static const char *const ALT_ENV[N_ALT] = {"v1", "v1", "v2", "v2", "v2s"};
static const char *const ALT_NAME[N_ALT] = {"v1", "v1-prec", "v2-prec", "v2", "v2s"};
static const int ALT_PRECISE[N_ALT] = {0, 1, 1, 0, 0};

typedef struct fx {
    clef_backend *cpu;
    clef_backend *gpu[N_GPU];
    const char *name[N_GPU];
    double tol_mm[N_GPU]; /* products */
    clef_backend *alt[N_ALT];
} fx;

/* fast cuBLASLt, fast custom kernel, precise with cuBLASLt, precise with the custom kernel, precise
 * with CLEF_CUDA_TUNE=0 (64-row expert tiles, two K/V buffers: must give bitwise G_PRECISE's results),
 * fast and precise cuBLASLt with CLEF_CUDA_LT_SPLITK=2 (split-K algorithms wherever a shape has one;
 * only the dense products differ, so only the matmul tests use them) */
enum { G_LT, G_CUSTOM, G_PRECISE, G_PRECISE_CUSTOM, G_PRECISE_T0, G_LT_SPLITK, G_PRECISE_SPLITK };

static int setup(void **state) {
    if (tu_cuda_devices(state) == 0) return 0;
    fx *f = calloc(1, sizeof *f);
    clef_err err;
    clef_err_clear(&err);
    f->cpu = clef_backend_cpu_create(2, &err);
    const clef_cuda_options o[N_GPU] = {{.device = 0, .precise = 0, .gemm = 2, .profile = 0},
                                        {.device = 0, .precise = 0, .gemm = 1, .profile = 0},
                                        {.device = 0, .precise = 1, .gemm = 2, .profile = 0},
                                        {.device = 0, .precise = 1, .gemm = 1, .profile = 0},
                                        {.device = 0, .precise = 1, .gemm = 2, .profile = 0},
                                        {.device = 0, .precise = 0, .gemm = 2, .profile = 0},
                                        {.device = 0, .precise = 1, .gemm = 2, .profile = 0}};
    const char *names[N_GPU] = {"cublaslt", "custom", "precise", "prec-cust", "prec-t0", "lt-splitk", "prec-spk"};
    const double tols[N_GPU] = {TOL_BF16, TOL_BF16, TOL_PRECISE, TOL_PRECISE, TOL_PRECISE, TOL_BF16, TOL_PRECISE};
    for (int i = 0; i < N_GPU; i++) {
        const char *const env[] = {"CLEF_CUDA_TUNE",      i == G_PRECISE_T0 ? "0" : NULL,
                                   "CLEF_CUDA_LT_SPLITK", i >= G_LT_SPLITK ? "2" : NULL, NULL};
        f->gpu[i] = tu_cuda_backend_env(&o[i], env, &err);
        if (!f->gpu[i]) {
            fprintf(stderr, "cuda backend: %s\n", err.message);
            return -1;
        }
        f->name[i] = names[i];
        f->tol_mm[i] = tols[i];
    }
    for (int i = 0; i < N_ALT; i++) {
        const clef_cuda_options oa = {.device = 0, .precise = ALT_PRECISE[i], .gemm = 2, .profile = 0};
        const char *const env[] = {"CLEF_CUDA_ATTN", ALT_ENV[i], NULL};
        f->alt[i] = tu_cuda_backend_env(&oa, env, &err);
        if (!f->alt[i]) {
            fprintf(stderr, "cuda backend: %s\n", err.message);
            return -1;
        }
    }
    tu_print_cuda_device(f->gpu[0]);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    if (!f) return 0;
    for (int i = 0; i < N_GPU; i++)
        if (f->gpu[i]) f->gpu[i]->ops->destroy(f->gpu[i]);
    for (int i = 0; i < N_ALT; i++)
        if (f->alt[i]) f->alt[i]->ops->destroy(f->alt[i]);
    f->cpu->ops->destroy(f->cpu);
    free(f);
    return 0;
}

/* One relative-L2 comparison line (tu_check_rel) for op `what` on backend `be`. */
static void check(const char *what, const char *be, const float *got, const float *want, size_t n, double tol) {
    tu_check_rel(what, 34, be, 9, got, want, n, tol);
}

/* ---- matmul -------------------------------------------------------------- */

/* One weight shape on every GPU backend: CPU agreement, and bitwise row
 * invariance (alone, in a slice, in a batch of T rows). */
static void matmul_case(fx *f, int64_t T, int64_t K, int64_t N, int with_bias) {
    clef_err err;
    float *x = rand_vec((size_t)(T * K), 1.0f), *b = with_bias ? rand_vec((size_t)N, 1.0f) : NULL;
    uint16_t *wh = rand_bf16((size_t)(N * K), 1.0f / sqrtf((float)K));
    clef_weight wc;
    tu_ok(f->cpu->ops->weight_init(f->cpu, &wc, CLEF_DT_BF16, N, K, wh, &err), &err);
    float *ref = malloc((size_t)(T * N) * sizeof *ref);
    tu_ok(f->cpu->ops->matmul(f->cpu, x, T, &wc, b, ref, &err), &err);
    char what[64];
    snprintf(what, sizeof what, "matmul T=%lld K=%lld N=%lld%s", (long long)T, (long long)K, (long long)N,
             b ? "+b" : "");
    for (int gi = 0; gi < N_GPU; gi++) {
        clef_backend *g = f->gpu[gi];
        clef_weight w;
        tu_ok(g->ops->weight_init(g, &w, CLEF_DT_BF16, N, K, wh, &err), &err);
        float *dx = tu_dput(g, x, (size_t)(T * K) * sizeof(float)), *db = b ? tu_dput(g, b, (size_t)N * 4) : NULL;
        float *dy = tu_dnan(g, (size_t)(T * N)), *dy1 = tu_dnan(g, (size_t)(T * N));
        tu_ok(g->ops->matmul(g, dx, T, &w, db, dy, &err), &err);
        float *y = tu_dget(g, dy, (size_t)(T * N));
        check(what, f->name[gi], y, ref, (size_t)(T * N), f->tol_mm[gi]);
        /* rows alone and a slice give the same bytes as inside the batch */
        const int64_t picks[4] = {0, 7, T / 2, T - 1};
        for (int i = 0; i < 4; i++) {
            tu_ok(g->ops->matmul(g, dx + picks[i] * K, 1, &w, db, dy1, &err), &err);
            float *y1 = tu_dget(g, dy1, (size_t)N);
            if (memcmp(y1, y + picks[i] * N, (size_t)N * sizeof(float)) != 0)
                fail_msg("%s on %s: row %lld alone differs from the batch", what, f->name[gi], (long long)picks[i]);
            free(y1);
        }
        const int64_t s0 = T / 3, sn = T / 2;
        tu_ok(g->ops->matmul(g, dx + s0 * K, sn, &w, db, dy1, &err), &err);
        float *ys = tu_dget(g, dy1, (size_t)(sn * N));
        if (memcmp(ys, y + s0 * N, (size_t)(sn * N) * sizeof(float)) != 0)
            fail_msg("%s on %s: a slice of %lld rows differs from the batch", what, f->name[gi], (long long)sn);
        printf("  %-34s %-9s rows alone / slice of %lld: bitwise equal\n", what, f->name[gi], (long long)sn);
        free(ys), free(y);
        g->ops->free(g, dx), g->ops->free(g, dy), g->ops->free(g, dy1);
        if (db) g->ops->free(g, db);
        g->ops->weight_release(g, &w);
    }
    free(x), free(b), free(wh), free(ref);
}

static void test_matmul(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    matmul_case(f, 300, 264, 200, 1);   /* K not a multiple of 64, N not of 128, bias */
    matmul_case(f, 1500, 2048, 512, 0); /* big tiles for the batch, small ones for the slices */
    matmul_case(f, 33, 64, 1, 1);       /* one output column (the head's scorer) */
    matmul_case(f, 8300, 64, 128, 1);   /* precise cuBLASLt: two calls of <= 8192 rows; row 8299 alone */
}

/* A model projection shape [N x K] at T rows (> 8192: two precise cuBLASLt
 * calls), the latency case of 300 rows and single rows: the first 300 rows
 * against the CPU; bitwise, the 300-row call, rows alone, a 300-row slice
 * from the middle and a second call of all T rows against the T-row call.
 * The CPU reference covers 300 rows only (T rows of a 4096 x 2048 product
 * would take the CPU tens of seconds). */
static void matmul_shape_case(fx *f, int64_t T, int64_t K, int64_t N) {
    enum { S = 300 };
    clef_err err;
    float *x = rand_vec((size_t)(T * K), 1.0f);
    uint16_t *wh = rand_bf16((size_t)(N * K), 1.0f / sqrtf((float)K));
    clef_weight wc;
    tu_ok(f->cpu->ops->weight_init(f->cpu, &wc, CLEF_DT_BF16, N, K, wh, &err), &err);
    float *ref = malloc((size_t)(S * N) * sizeof *ref);
    tu_ok(f->cpu->ops->matmul(f->cpu, x, S, &wc, NULL, ref, &err), &err);
    char what[64];
    snprintf(what, sizeof what, "matmul [%lld x %lld] T=%lld", (long long)N, (long long)K, (long long)T);
    for (int gi = 0; gi < N_GPU; gi++) {
        clef_backend *g = f->gpu[gi];
        clef_weight w;
        tu_ok(g->ops->weight_init(g, &w, CLEF_DT_BF16, N, K, wh, &err), &err);
        float *dx = tu_dput(g, x, (size_t)(T * K) * sizeof(float));
        float *dy = tu_dnan(g, (size_t)(T * N)), *dy1 = tu_dnan(g, (size_t)(T * N));
        tu_ok(g->ops->matmul(g, dx, T, &w, NULL, dy, &err), &err);
        float *y = tu_dget(g, dy, (size_t)(T * N));
        tu_ok(g->ops->matmul(g, dx, S, &w, NULL, dy1, &err), &err);
        float *ys = tu_dget(g, dy1, (size_t)(S * N));
        check(what, f->name[gi], ys, ref, (size_t)(S * N), f->tol_mm[gi]);
        if (memcmp(ys, y, (size_t)(S * N) * sizeof(float)) != 0)
            fail_msg("%s on %s: the first %d rows alone differ from the batch", what, f->name[gi], S);
        free(ys);
        const int64_t s0 = T / 2 - 1;
        tu_ok(g->ops->matmul(g, dx + s0 * K, S, &w, NULL, dy1, &err), &err);
        ys = tu_dget(g, dy1, (size_t)(S * N));
        if (memcmp(ys, y + s0 * N, (size_t)(S * N) * sizeof(float)) != 0)
            fail_msg("%s on %s: a slice of %d rows differs from the batch", what, f->name[gi], S);
        free(ys);
        const int64_t picks[4] = {0, S - 1, T / 2, T - 1};
        for (int i = 0; i < 4; i++) {
            tu_ok(g->ops->matmul(g, dx + picks[i] * K, 1, &w, NULL, dy1, &err), &err);
            float *y1 = tu_dget(g, dy1, (size_t)N);
            if (memcmp(y1, y + picks[i] * N, (size_t)N * sizeof(float)) != 0)
                fail_msg("%s on %s: row %lld alone differs from the batch", what, f->name[gi], (long long)picks[i]);
            free(y1);
        }
        tu_ok(g->ops->matmul(g, dx, T, &w, NULL, dy1, &err), &err);
        float *y2 = tu_dget(g, dy1, (size_t)(T * N));
        if (memcmp(y2, y, (size_t)(T * N) * sizeof(float)) != 0)
            fail_msg("%s on %s: a second call differs from the first", what, f->name[gi]);
        printf("  %-34s %-9s %d rows / a slice / rows alone / again: bitwise equal\n", what, f->name[gi], S);
        free(y2), free(y);
        g->ops->free(g, dx), g->ops->free(g, dy), g->ops->free(g, dy1);
        g->ops->weight_release(g, &w);
    }
    f->cpu->ops->weight_release(f->cpu, &wc);
    free(x), free(wh), free(ref);
}

/* The thinker's dense projections (q, k and v, o, router) at their real
 * shapes: what CLEF_CUDA_LT_SPLITK=2 puts on split-K. */
static void test_matmul_model_shapes(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    matmul_shape_case(f, 8300, 2048, 512);  /* k, v */
    matmul_shape_case(f, 8300, 2048, 128);  /* router */
    matmul_shape_case(f, 8300, 4096, 2048); /* o */
    matmul_shape_case(f, 8300, 2048, 4096); /* q */
}

static void test_matmul_f32_weight(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    clef_err err;
    const int64_t T = 70001, K = 37, N = 45; /* more rows than one launch's grid (65535): two launches */
    float *x = rand_vec((size_t)(T * K), 1.0f), *w = rand_vec((size_t)(N * K), 1.0f), *b = rand_vec((size_t)N, 1.0f);
    clef_weight wc, wg;
    float *ref = malloc((size_t)(T * N) * sizeof *ref);
    tu_ok(f->cpu->ops->weight_init(f->cpu, &wc, CLEF_DT_F32, N, K, w, &err), &err);
    tu_ok(f->cpu->ops->matmul(f->cpu, x, T, &wc, b, ref, &err), &err);
    clef_backend *g = f->gpu[G_LT];
    tu_ok(g->ops->weight_init(g, &wg, CLEF_DT_F32, N, K, w, &err), &err);
    float *dx = tu_dput(g, x, (size_t)(T * K) * 4), *db = tu_dput(g, b, (size_t)N * 4),
          *dy = tu_dnan(g, (size_t)(T * N));
    tu_ok(g->ops->matmul(g, dx, T, &wg, db, dy, &err), &err);
    float *y = tu_dget(g, dy, (size_t)(T * N));
    check("matmul f32 weight", "cuda", y, ref, (size_t)(T * N), TOL_F32);
    /* a quantized weight without its scales is refused with a clear 500 */
    clef_qweight q = {.dtype = CLEF_DT_U8, .rows = 16, .cols = 32, .data = x, .quant = {.type = CLEF_QT_NVFP4}};
    clef_weight wq;
    assert_int_equal(g->ops->weight_init_packed(g, &wq, &q, &err), -1);
    assert_int_equal(err.status, 500);
    assert_non_null(strstr(err.message, "unsupported weight dtype on cuda"));
    printf("  quantized weight refused: %s\n", err.message);
    g->ops->weight_release(g, &wg);
    g->ops->free(g, dx), g->ops->free(g, db), g->ops->free(g, dy);
    free(x), free(w), free(b), free(ref), free(y);
}

/* ---- row ops ------------------------------------------------------------- */

static void test_gather_norms_elementwise(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    clef_backend *g = f->gpu[G_LT], *c = f->cpu;
    clef_err err;
    /* gather from a bf16 table: exact */
    const int64_t V = 1000, D = 256, n = 77;
    uint16_t *th = rand_bf16((size_t)(V * D), 1.0f);
    int32_t ids[77];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 131 + 7) % V);
    clef_weight tc, tg;
    tu_ok(c->ops->weight_init(c, &tc, CLEF_DT_BF16, V, D, th, &err), &err);
    tu_ok(g->ops->weight_init(g, &tg, CLEF_DT_BF16, V, D, th, &err), &err);
    float *ref = malloc((size_t)(n * D) * sizeof *ref);
    tu_ok(c->ops->gather(c, &tc, ids, n, ref, &err), &err);
    int32_t *dids = tu_dput(g, ids, sizeof ids);
    float *dout = tu_dnan(g, (size_t)(n * D));
    tu_ok(g->ops->gather(g, &tg, dids, n, dout, &err), &err);
    float *got = tu_dget(g, dout, (size_t)(n * D));
    assert_memory_equal(got, ref, (size_t)(n * D) * sizeof(float));
    printf("  %-34s %-9s bitwise equal\n", "gather bf16", "cuda");
    free(got), free(ref), free(th);
    g->ops->free(g, dids), g->ops->free(g, dout), g->ops->weight_release(g, &tg);

    /* RMSNorm (hidden rows and per-head rows) and LayerNorm, in place too */
    const int64_t shapes[2][2] = {{300, 2048}, {1000, 128}};
    for (int s = 0; s < 2; s++) {
        const int64_t rows = shapes[s][0], dim = shapes[s][1], nn = rows * dim;
        float *x = rand_vec((size_t)nn, 3.0f), *w = rand_vec((size_t)dim, 1.0f), *b = rand_vec((size_t)dim, 1.0f);
        float *r1 = malloc((size_t)nn * 4), *r2 = malloc((size_t)nn * 4);
        tu_ok(c->ops->rmsnorm(c, x, w, r1, rows, dim, 1e-6f, &err), &err);
        tu_ok(c->ops->layernorm(c, x, w, b, r2, rows, dim, 1e-5f, &err), &err);
        float *dx = tu_dput(g, x, (size_t)nn * 4), *dw = tu_dput(g, w, (size_t)dim * 4),
              *dbb = tu_dput(g, b, (size_t)dim * 4);
        float *dy = tu_dnan(g, (size_t)nn);
        tu_ok(g->ops->rmsnorm(g, dx, dw, dy, rows, dim, 1e-6f, &err), &err);
        float *y = tu_dget(g, dy, (size_t)nn);
        check(s ? "rmsnorm (q/k heads)" : "rmsnorm (hidden)", "cuda", y, r1, (size_t)nn, TOL_F32);
        free(y);
        tu_ok(g->ops->layernorm(g, dx, dw, dbb, dy, rows, dim, 1e-5f, &err), &err);
        y = tu_dget(g, dy, (size_t)nn);
        check("layernorm", "cuda", y, r2, (size_t)nn, TOL_F32);
        tu_ok(g->ops->layernorm(g, dx, dw, dbb, dx, rows, dim, 1e-5f, &err), &err); /* in place */
        float *yi = tu_dget(g, dx, (size_t)nn);
        assert_memory_equal(yi, y, (size_t)nn * 4);
        free(yi), free(y), free(x), free(w), free(b), free(r1), free(r2);
        g->ops->free(g, dx), g->ops->free(g, dw), g->ops->free(g, dbb), g->ops->free(g, dy);
    }

    /* SwiGLU, GELU, add (elementwise and broadcast) */
    const int64_t m = 100000;
    float *a = rand_vec((size_t)m, 6.0f), *bb = rand_vec((size_t)m, 2.0f), *r = malloc((size_t)m * 4);
    float *da = tu_dput(g, a, (size_t)m * 4), *db = tu_dput(g, bb, (size_t)m * 4), *dy = tu_dnan(g, (size_t)m);
    tu_ok(c->ops->swiglu(c, a, bb, r, m, &err), &err);
    tu_ok(g->ops->swiglu(g, da, db, dy, m, &err), &err);
    float *y = tu_dget(g, dy, (size_t)m);
    check("swiglu", "cuda", y, r, (size_t)m, TOL_F32);
    free(y);
    tu_ok(c->ops->gelu(c, a, r, m, &err), &err);
    tu_ok(g->ops->gelu(g, da, dy, m, &err), &err);
    y = tu_dget(g, dy, (size_t)m);
    check("gelu", "cuda", y, r, (size_t)m, TOL_F32);
    free(y);
    tu_ok(c->ops->add(c, a, bb, r, 100, 1000, 1000, &err), &err);
    tu_ok(g->ops->add(g, da, db, dy, 100, 1000, 1000, &err), &err);
    y = tu_dget(g, dy, (size_t)m);
    check("add", "cuda", y, r, (size_t)m, 0.0);
    free(y);
    tu_ok(c->ops->add(c, a, bb, r, 100, 1000, 0, &err), &err);
    tu_ok(g->ops->add(g, da, db, dy, 100, 1000, 0, &err), &err);
    y = tu_dget(g, dy, (size_t)m);
    check("add broadcast", "cuda", y, r, (size_t)m, 0.0);
    free(y), free(a), free(bb), free(r);
    g->ops->free(g, da), g->ops->free(g, db), g->ops->free(g, dy);
}

static void test_head_rows(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    clef_backend *g = f->gpu[G_LT], *c = f->cpu;
    clef_err err;
    const int64_t L = 120, dim = 256, n = 9, nF = 3;
    float *x = rand_vec((size_t)(L * dim), 2.0f);
    clef_row_span spans[9];
    for (int i = 0; i < n; i++) spans[i] = (clef_row_span){i * 11, i * 11 + 1 + (i * 5) % 9};
    float *ref = malloc((size_t)(n * dim) * 4);
    tu_ok(c->ops->span_mean(c, x, dim, spans, n, ref, &err), &err);
    float *dx = tu_dput(g, x, (size_t)(L * dim) * 4), *dy = tu_dnan(g, (size_t)(n * dim));
    tu_ok(g->ops->span_mean(g, dx, dim, spans, n, dy, &err), &err);
    float *y = tu_dget(g, dy, (size_t)(n * dim));
    check("span_mean", "cuda", y, ref, (size_t)(n * dim), TOL_F32);
    free(y), free(ref);
    /* pair features and both cosine forms */
    float *F = rand_vec((size_t)(nF * dim), 1.0f), *o = rand_vec((size_t)(n * dim), 1.0f);
    int32_t rows[9] = {0, 0, 1, 1, 1, 2, 2, 0, 2};
    float *pf = malloc((size_t)(n * 4 * dim) * 4), cs[9], cs2[9];
    tu_ok(c->ops->pair_features(c, F, rows, o, n, dim, pf, &err), &err);
    tu_ok(c->ops->cosine(c, F, rows, o, n, dim, 1e-8f, cs, &err), &err);
    tu_ok(c->ops->cosine(c, o, NULL, x, n, dim, 1e-12f, cs2, &err), &err);
    float *dF = tu_dput(g, F, (size_t)(nF * dim) * 4), *dO = tu_dput(g, o, (size_t)(n * dim) * 4);
    float *dpf = tu_dnan(g, (size_t)(n * 4 * dim)), *dcs = tu_dnan(g, (size_t)n);
    tu_ok(g->ops->pair_features(g, dF, rows, dO, n, dim, dpf, &err), &err);
    y = tu_dget(g, dpf, (size_t)(n * 4 * dim));
    check("pair_features", "cuda", y, pf, (size_t)(n * 4 * dim), 0.0);
    free(y);
    tu_ok(g->ops->cosine(g, dF, rows, dO, n, dim, 1e-8f, dcs, &err), &err);
    y = tu_dget(g, dcs, (size_t)n);
    check("cosine (rows)", "cuda", y, cs, (size_t)n, TOL_F32);
    free(y);
    tu_ok(g->ops->cosine(g, dO, NULL, dx, n, dim, 1e-12f, dcs, &err), &err);
    y = tu_dget(g, dcs, (size_t)n);
    check("cosine", "cuda", y, cs2, (size_t)n, TOL_F32);
    free(y), free(x), free(F), free(o), free(pf);
    g->ops->free(g, dx), g->ops->free(g, dy), g->ops->free(g, dF), g->ops->free(g, dO), g->ops->free(g, dpf);
    g->ops->free(g, dcs);
}

static void test_rope(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    clef_backend *g = f->gpu[G_LT], *c = f->cpu;
    clef_err err;
    const int64_t T = 100, heads = 4, D = 128;
    float *x = rand_vec((size_t)(T * heads * D), 2.0f), inv[64];
    for (int j = 0; j < 64; j++) inv[j] = 1.0f / powf(1000000.0f, (float)(2 * j) / (float)D);
    int32_t *pos = malloc((size_t)(3 * T) * sizeof *pos);
    for (int64_t i = 0; i < 3 * T; i++) pos[i] = (int32_t)((i * 2654435761u) % 4000);
    clef_rope_desc rc = {.head_dim = D, .section = {24, 20, 20}, .inv_freq = inv};
    float *ref = malloc((size_t)(T * heads * D) * 4);
    memcpy(ref, x, (size_t)(T * heads * D) * 4);
    tu_ok(c->ops->rope(c, ref, T, heads, pos, &rc, &err), &err);
    float *dx = tu_dput(g, x, (size_t)(T * heads * D) * 4), *dinv = tu_dput(g, inv, sizeof inv);
    int32_t *dpos = tu_dput(g, pos, (size_t)(3 * T) * 4);
    clef_rope_desc rg = rc;
    rg.inv_freq = dinv;
    tu_ok(g->ops->rope(g, dx, T, heads, dpos, &rg, &err), &err);
    float *y = tu_dget(g, dx, (size_t)(T * heads * D));
    check("rope (M-RoPE, pos < 4000)", "cuda", y, ref, (size_t)(T * heads * D), TOL_F32);
    free(y), free(x), free(ref), free(pos);
    g->ops->free(g, dx), g->ops->free(g, dinv), g->ops->free(g, dpos);
}

/* The fused row ops: add_rmsnorm bitwise add then rmsnorm on the GPU (wide
 * and narrow rows, with and without the add), within TOL_F32 of the CPU;
 * the bf16 rows it leaves for the next product give that product bitwise
 * the result it computes from its own conversion (fast and precise);
 * qk_norm_rope on the q and k blocks of fused [T, q | k | v] rows bitwise
 * rmsnorm then rope on contiguous copies, v untouched, within TOL_F32 of
 * the CPU's fused op. */
static void test_fused_row_ops(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    clef_backend *c = f->cpu;
    clef_err err;
    const int64_t shapes[2][2] = {{300, 2048}, {37, 64}};
    const int bes[2] = {G_LT, G_PRECISE};
    for (int bi = 0; bi < 2; bi++) {
        clef_backend *g = f->gpu[bes[bi]];
        for (int s = 0; s < 2; s++) {
            const int64_t rows = shapes[s][0], dim = shapes[s][1], nn = rows * dim, N = 96;
            float *h = rand_vec((size_t)nn, 2.0f), *o = rand_vec((size_t)nn, 1.0f), *w = rand_vec((size_t)dim, 1.0f);
            float *hc = malloc((size_t)nn * 4), *yc = malloc((size_t)nn * 4);
            memcpy(hc, h, (size_t)nn * 4);
            tu_ok(c->ops->add_rmsnorm(c, hc, o, w, yc, rows, dim, 1e-6f, &err), &err);
            float *dh = tu_dput(g, h, (size_t)nn * 4), *dh2 = tu_dput(g, h, (size_t)nn * 4),
                  *dO = tu_dput(g, o, (size_t)nn * 4), *dw = tu_dput(g, w, (size_t)dim * 4);
            float *dy = tu_dnan(g, (size_t)nn), *dy2 = tu_dnan(g, (size_t)nn);
            /* the plain ops, then the product converting y itself */
            uint16_t *wh = rand_bf16((size_t)(N * dim), 1.0f);
            clef_weight wt;
            tu_ok(g->ops->weight_init(g, &wt, CLEF_DT_BF16, N, dim, wh, &err), &err);
            float *dp = tu_dnan(g, (size_t)(rows * N)), *dp2 = tu_dnan(g, (size_t)(rows * N));
            tu_ok(g->ops->add(g, dh2, dO, dh2, rows, dim, dim, &err), &err);
            tu_ok(g->ops->rmsnorm(g, dh2, dw, dy2, rows, dim, 1e-6f, &err), &err);
            tu_ok(g->ops->matmul(g, dy2, rows, &wt, NULL, dp2, &err), &err);
            /* the fused op, then the product on the rows it left converted */
            tu_ok(g->ops->add_rmsnorm(g, dh, dO, dw, dy, rows, dim, 1e-6f, &err), &err);
            tu_ok(g->ops->matmul(g, dy, rows, &wt, NULL, dp, &err), &err);
            float *gh = tu_dget(g, dh, (size_t)nn), *gh2 = tu_dget(g, dh2, (size_t)nn);
            float *gy = tu_dget(g, dy, (size_t)nn), *gy2 = tu_dget(g, dy2, (size_t)nn);
            float *gp = tu_dget(g, dp, (size_t)(rows * N)), *gp2 = tu_dget(g, dp2, (size_t)(rows * N));
            assert_memory_equal(gh, gh2, (size_t)nn * 4);
            assert_memory_equal(gy, gy2, (size_t)nn * 4);
            assert_memory_equal(gp, gp2, (size_t)(rows * N) * 4);
            check(s ? "add + rmsnorm (narrow)" : "add + rmsnorm (wide)", f->name[bes[bi]], gy, yc, (size_t)nn, TOL_F32);
            check("add + rmsnorm: h", f->name[bes[bi]], gh, hc, (size_t)nn, 0.0);
            printf("  %-34s %-9s bitwise add + rmsnorm, product bitwise\n", "add + rmsnorm", f->name[bes[bi]]);
            /* no add: h unchanged, y = rmsnorm(h) */
            tu_ok(g->ops->add_rmsnorm(g, dh, NULL, dw, dy, rows, dim, 1e-6f, &err), &err);
            free(gy), free(gh);
            gy = tu_dget(g, dy, (size_t)nn), gh = tu_dget(g, dh, (size_t)nn);
            assert_memory_equal(gh, gh2, (size_t)nn * 4);
            assert_memory_equal(gy, gy2, (size_t)nn * 4);
            free(gh), free(gh2), free(gy), free(gy2), free(gp), free(gp2), free(h), free(o), free(w), free(hc), free(yc);
            free(wh);
            g->ops->weight_release(g, &wt);
            g->ops->free(g, dh), g->ops->free(g, dh2), g->ops->free(g, dO), g->ops->free(g, dw), g->ops->free(g, dy);
            g->ops->free(g, dy2), g->ops->free(g, dp), g->ops->free(g, dp2);
        }
    }

    clef_backend *g = f->gpu[G_LT];
    const int64_t T = 100, nq = 32, nk = 4, D = 128, ld = (nq + 2 * nk) * D;
    float inv[64];
    for (int j = 0; j < 64; j++) inv[j] = 1.0f / powf(1000000.0f, (float)(2 * j) / (float)D);
    int32_t *pos = malloc((size_t)(3 * T) * sizeof *pos);
    for (int64_t i = 0; i < 3 * T; i++) pos[i] = (int32_t)((i * 2654435761u) % 4000);
    clef_rope_desc rc = {.head_dim = D, .section = {24, 20, 20}, .inv_freq = inv};
    float *qkv = rand_vec((size_t)(T * ld), 2.0f), *qw = rand_vec((size_t)D, 1.0f), *kw = rand_vec((size_t)D, 1.0f);
    float *ref = malloc((size_t)(T * ld) * 4);
    memcpy(ref, qkv, (size_t)(T * ld) * 4);
    tu_ok(c->ops->qk_norm_rope(c, ref, ld, ref + nq * D, ld, T, nq, nk, qw, kw, 1e-6f, pos, &rc, &err), &err);
    float *q = malloc((size_t)(T * nq * D) * 4), *k = malloc((size_t)(T * nk * D) * 4);
    for (int64_t t = 0; t < T; t++) {
        memcpy(q + t * nq * D, qkv + t * ld, (size_t)(nq * D) * 4);
        memcpy(k + t * nk * D, qkv + t * ld + nq * D, (size_t)(nk * D) * 4);
    }
    float *dqkv = tu_dput(g, qkv, (size_t)(T * ld) * 4), *dq = tu_dput(g, q, (size_t)(T * nq * D) * 4),
          *dk = tu_dput(g, k, (size_t)(T * nk * D) * 4), *dqw = tu_dput(g, qw, (size_t)D * 4),
          *dkw = tu_dput(g, kw, (size_t)D * 4), *dinv = tu_dput(g, inv, sizeof inv);
    int32_t *dpos = tu_dput(g, pos, (size_t)(3 * T) * 4);
    clef_rope_desc rg = rc;
    rg.inv_freq = dinv;
    tu_ok(g->ops->rmsnorm(g, dq, dqw, dq, T * nq, D, 1e-6f, &err), &err);
    tu_ok(g->ops->rmsnorm(g, dk, dkw, dk, T * nk, D, 1e-6f, &err), &err);
    tu_ok(g->ops->rope(g, dq, T, nq, dpos, &rg, &err), &err);
    tu_ok(g->ops->rope(g, dk, T, nk, dpos, &rg, &err), &err);
    tu_ok(g->ops->qk_norm_rope(g, dqkv, ld, dqkv + nq * D, ld, T, nq, nk, dqw, dkw, 1e-6f, dpos, &rg, &err), &err);
    float *got = tu_dget(g, dqkv, (size_t)(T * ld)), *gq = tu_dget(g, dq, (size_t)(T * nq * D)),
          *gk = tu_dget(g, dk, (size_t)(T * nk * D));
    for (int64_t t = 0; t < T; t++) {
        assert_memory_equal(got + t * ld, gq + t * nq * D, (size_t)(nq * D) * 4);
        assert_memory_equal(got + t * ld + nq * D, gk + t * nk * D, (size_t)(nk * D) * 4);
        assert_memory_equal(got + t * ld + (nq + nk) * D, qkv + t * ld + (nq + nk) * D, (size_t)(nk * D) * 4);
    }
    check("q/k norm + rope (fused rows)", "cuda", got, ref, (size_t)(T * ld), TOL_F32);
    printf("  %-34s %-9s bitwise rmsnorm + rope\n", "q/k norm + rope", "cuda");
    free(got), free(gq), free(gk), free(q), free(k), free(qkv), free(qw), free(kw), free(ref), free(pos);
    g->ops->free(g, dqkv), g->ops->free(g, dq), g->ops->free(g, dk), g->ops->free(g, dqw), g->ops->free(g, dkw);
    g->ops->free(g, dinv), g->ops->free(g, dpos);
}

/* ---- attention ----------------------------------------------------------- */

/* Packed segments on every GPU backend (and the attention-only ones) vs the
 * CPU; then each segment alone vs its rows in the packed result, bitwise. */
static void attention_case(fx *f, const char *what, int64_t n_seg, const int64_t *qoff, const int64_t *kvoff,
                           int64_t nh, int64_t nkv, int64_t D, int causal, int strided) {
    clef_err err;
    const int64_t nq = qoff[n_seg], nk = kvoff[n_seg];
    /* strided: head style, q/k/v live in one [rows, 3 W] buffer */
    const int64_t qs = strided ? 3 * nh * D : nh * D, ks = strided ? 3 * nh * D : nkv * D, os = nh * D;
    const int64_t kvrows = strided ? (nq > nk ? nq : nk) : nk;
    float *q = rand_vec((size_t)(nq * qs), 1.5f), *kv = rand_vec((size_t)(kvrows * ks * (strided ? 1 : 2)), 1.5f);
    const float *k = kv, *v = strided ? kv + nh * D : kv + nk * ks;
    if (strided) k = kv + 0, v = kv + nh * D;
    clef_attn_desc a = {.n_seg = n_seg, .q_off = qoff, .kv_off = kvoff, .n_q_heads = nh, .n_kv_heads = nkv,
                        .head_dim = D, .q_stride = qs, .k_stride = ks, .v_stride = ks, .o_stride = os,
                        .scale = 1.0f / sqrtf((float)D), .causal = causal};
    float *ref = malloc((size_t)(nq * os) * 4), *prec_o = NULL, *fast_o = NULL;
    tu_ok(f->cpu->ops->attention(f->cpu, q, k, v, ref, &a, &err), &err);
    for (int gi = 0; gi < N_GPU + N_ALT; gi++) {
        if (gi == G_CUSTOM || gi == G_PRECISE_CUSTOM || (gi >= G_LT_SPLITK && gi < N_GPU))
            continue; /* attention does not depend on the GEMM choice */
        clef_backend *g = gi < N_GPU ? f->gpu[gi] : f->alt[gi - N_GPU];
        const char *gname = gi < N_GPU ? f->name[gi] : ALT_NAME[gi - N_GPU];
        const size_t kvn = (size_t)(kvrows * ks * (strided ? 1 : 2));
        float *dq = tu_dput(g, q, (size_t)(nq * qs) * 4), *dkv = tu_dput(g, kv, kvn * 4),
              *dout = tu_dnan(g, (size_t)(nq * os));
        const float *dk = dkv + (k - kv), *dv = dkv + (v - kv);
        tu_ok(g->ops->attention(g, dq, dk, dv, dout, &a, &err), &err);
        float *o = tu_dget(g, dout, (size_t)(nq * os));
        const int tc = D == 64 || D == 72 || D == 128,
                  prec = gi == G_PRECISE || gi == G_PRECISE_T0 || gi == N_GPU + A_V1_PRECISE || gi == N_GPU + A_V2_PRECISE;
        char w2[96];
        snprintf(w2, sizeof w2, "%s%s", what, !tc ? " [f32]" : prec ? " [tc split]" : " [tc]");
        check(w2, gname, o, ref, (size_t)(nq * os), !tc ? TOL_PRECISE : prec ? TOL_PRECISE_ATTN : TOL_BF16);
        if (gi == G_PRECISE) {
            free(prec_o);
            prec_o = malloc((size_t)(nq * os) * 4);
            memcpy(prec_o, o, (size_t)(nq * os) * 4);
        } else if (gi == G_PRECISE_T0 && memcmp(prec_o, o, (size_t)(nq * os) * 4) != 0) {
            fail_msg("%s: CLEF_CUDA_TUNE=0 (two K/V buffers) differs from the default", what);
        } else if (gi == G_LT) {
            free(fast_o);
            fast_o = malloc((size_t)(nq * os) * 4);
            memcpy(fast_o, o, (size_t)(nq * os) * 4);
        } else if (tc && (gi == N_GPU + A_V2 || gi == N_GPU + A_V2S)) {
            if (memcmp(fast_o, o, (size_t)(nq * os) * 4) != 0)
                fail_msg("%s: CLEF_CUDA_ATTN=%s differs from the fast default", what, gname);
            printf("  %-34s %-9s bitwise the fast default\n", what, gname);
        }
        for (int64_t s = 0; s < n_seg; s++) {
            const int64_t ql = qoff[s + 1] - qoff[s], kl = kvoff[s + 1] - kvoff[s];
            if (!ql) continue;
            int64_t q1[2] = {0, ql}, k1[2] = {0, kl};
            clef_attn_desc a1 = a;
            a1.n_seg = 1, a1.q_off = q1, a1.kv_off = k1;
            float *d1 = tu_dnan(g, (size_t)(ql * os));
            tu_ok(g->ops->attention(g, dq + qoff[s] * qs, dk + kvoff[s] * ks, dv + kvoff[s] * ks, d1, &a1, &err), &err);
            float *o1 = tu_dget(g, d1, (size_t)(ql * os));
            if (memcmp(o1, o + qoff[s] * os, (size_t)(ql * os) * 4) != 0)
                fail_msg("%s on %s: segment %lld alone differs from packed", what, gname, (long long)s);
            free(o1);
            g->ops->free(g, d1);
        }
        printf("  %-34s %-9s every segment alone: bitwise equal to packed\n", what, gname);
        free(o);
        g->ops->free(g, dq), g->ops->free(g, dkv), g->ops->free(g, dout);
    }
    free(q), free(kv), free(ref), free(prec_o), free(fast_o);
}

static void test_attention(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    const int64_t off[7] = {0, 1, 64, 128, 193, 330, 337}; /* 1, 63, 64, 65, 137, 7 */
    attention_case(f, "attn causal GQA D=128", 6, off, off, 8, 2, 128, 1, 0);
    attention_case(f, "attn causal GQA D=16", 6, off, off, 4, 2, 16, 1, 0);
    const int64_t qo[4] = {0, 3, 4, 9}, ko[4] = {0, 70, 75, 200};
    attention_case(f, "attn cross D=64 (head MHA)", 3, qo, ko, 4, 4, 64, 0, 1);
    const int64_t so[3] = {0, 2, 5}, sk[3] = {0, 4, 13};
    attention_case(f, "attn single head D=1024", 2, so, sk, 1, 1, 1024, 0, 0);
    /* the vision tower's heads: 72 wide (run padded to 80), full attention per image */
    const int64_t vo[4] = {0, 64, 100, 357};
    attention_case(f, "attn vision D=72 (padded to 80)", 3, vo, vo, 16, 16, 72, 0, 1);
    attention_case(f, "attn causal GQA D=72", 6, off, off, 8, 2, 72, 1, 0);
    attention_case(f, "attn causal GQA D=64", 6, off, off, 8, 2, 64, 1, 0);
    /* several 128-row tiles per segment: skipped and masked causal tiles per warp, partial last tiles */
    const int64_t lo[6] = {0, 300, 301, 429, 690, 1000}; /* 300, 1, 128, 261, 310 */
    attention_case(f, "attn causal GQA D=128 long", 5, lo, lo, 8, 2, 128, 1, 0);
    attention_case(f, "attn full GQA D=128", 5, lo, lo, 4, 2, 128, 0, 0);
    attention_case(f, "attn cross D=128", 3, qo, ko, 4, 2, 128, 0, 0);
    /* precise: segments up to 512 queries on the 64-row kernel, longer ones on the 128-row one, both
     * kinds in one call (two launches): each segment alone still bitwise equal to packed */
    const int64_t mo[6] = {0, 300, 1000, 1001, 1514, 2026}; /* 300, 700, 1, 513, 512 */
    attention_case(f, "attn causal GQA D=128 short + long", 5, mo, mo, 8, 2, 128, 1, 0);
    /* causal after a cached prefix (the state cache: more keys than queries, query i at key i + kl - ql) */
    const int64_t pq[4] = {0, 50, 350, 351}, pk[4] = {0, 300, 700, 765}; /* 50 of 300, 300 of 400, 1 of 65 */
    attention_case(f, "attn causal GQA D=128 cached prefix", 3, pq, pk, 8, 2, 128, 1, 0);
    /* 18 tiles x 16 heads: more 128-row blocks than two per SM of an H200, so the default runs v2 */
    const int64_t bo[3] = {0, 1000, 2200};
    attention_case(f, "attn causal D=128 16 heads x 2,200", 2, bo, bo, 16, 2, 128, 1, 0);
}

/* The tensor-core attention also writes its contiguous output rows as the bf16 rows the next product
 * reads (the o product then skips its conversion): that product must be bitwise the product of the
 * same rows converted by the product itself (a copy of the output at another address), fast and
 * precise, both attention kernels (a 300-query segment on 64-row tiles, a 600-query one on 128). */
static void test_attention_then_product(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    clef_err err;
    const int64_t nh = 8, nkv = 2, D = 128, W = nh * D, N = 96, off[3] = {0, 300, 900}, T = 900;
    const int bes[2] = {G_LT, G_PRECISE};
    float *q = rand_vec((size_t)(T * W), 1.0f), *kv = rand_vec((size_t)(T * 2 * nkv * D), 1.0f);
    uint16_t *wh = rand_bf16((size_t)(N * W), 1.0f / sqrtf((float)W));
    for (int bi = 0; bi < 2; bi++) {
        clef_backend *g = f->gpu[bes[bi]];
        clef_weight wt;
        tu_ok(g->ops->weight_init(g, &wt, CLEF_DT_BF16, N, W, wh, &err), &err);
        float *dq = tu_dput(g, q, (size_t)(T * W) * 4), *dkv = tu_dput(g, kv, (size_t)(T * 2 * nkv * D) * 4);
        float *dout = tu_dnan(g, (size_t)(T * W)), *dcopy = tu_dnan(g, (size_t)(T * W)), *zero = tu_dnan(g, (size_t)(T * W));
        float *dp = tu_dnan(g, (size_t)(T * N)), *dp2 = tu_dnan(g, (size_t)(T * N));
        const clef_attn_desc a = {.n_seg = 2, .q_off = off, .kv_off = off, .n_q_heads = nh, .n_kv_heads = nkv,
                                  .head_dim = D, .q_stride = W, .k_stride = 2 * nkv * D, .v_stride = 2 * nkv * D,
                                  .o_stride = W, .scale = 1.0f / sqrtf((float)D), .causal = 1};
        float *zh = calloc((size_t)(T * W), 4);
        tu_ok(g->ops->upload(g, zero, zh, (size_t)(T * W) * 4, &err), &err);
        tu_ok(g->ops->attention(g, dq, dkv, dkv + nkv * D, dout, &a, &err), &err);
        tu_ok(g->ops->matmul(g, dout, T, &wt, NULL, dp, &err), &err);     /* reads the rows attention left */
        tu_ok(g->ops->add(g, dout, zero, dcopy, T, W, W, &err), &err);     /* the same values elsewhere */
        tu_ok(g->ops->matmul(g, dcopy, T, &wt, NULL, dp2, &err), &err);   /* converts them itself */
        float *p1 = tu_dget(g, dp, (size_t)(T * N)), *p2 = tu_dget(g, dp2, (size_t)(T * N));
        assert_memory_equal(p1, p2, (size_t)(T * N) * 4);
        printf("  %-34s %-9s product on attention's bf16 rows: bitwise its own conversion\n", "attention -> product",
               f->name[bes[bi]]);
        free(p1), free(p2), free(zh);
        g->ops->weight_release(g, &wt);
        g->ops->free(g, dq), g->ops->free(g, dkv), g->ops->free(g, dout), g->ops->free(g, dcopy);
        g->ops->free(g, zero), g->ops->free(g, dp), g->ops->free(g, dp2);
    }
    free(q), free(kv), free(wh);

    /* qk_norm_rope also leaves q and k as the bf16 rows attention reads (attention then converts only v):
     * attention right after it must be bitwise attention after another op in between (which makes it
     * convert q, k and v itself), fused [q | k | v] rows as the thinker's */
    const int64_t ld = (nh + 2 * nkv) * D;
    float inv[64];
    for (int j = 0; j < 64; j++) inv[j] = 1.0f / powf(1000000.0f, (float)(2 * j) / (float)D);
    int32_t *pos = malloc((size_t)(3 * T) * sizeof *pos);
    for (int64_t i = 0; i < 3 * T; i++) pos[i] = (int32_t)(i % T);
    float *qkv = rand_vec((size_t)(T * ld), 2.0f), *qw = rand_vec((size_t)D, 1.0f), *kw = rand_vec((size_t)D, 1.0f);
    for (int bi = 0; bi < 2; bi++) {
        clef_backend *g = f->gpu[bes[bi]];
        float *da = tu_dput(g, qkv, (size_t)(T * ld) * 4), *db = tu_dput(g, qkv, (size_t)(T * ld) * 4);
        float *dqw = tu_dput(g, qw, (size_t)D * 4), *dkw = tu_dput(g, kw, (size_t)D * 4), *dinv = tu_dput(g, inv, sizeof inv);
        int32_t *dpos = tu_dput(g, pos, (size_t)(3 * T) * 4);
        float *oa = tu_dnan(g, (size_t)(T * W)), *ob = tu_dnan(g, (size_t)(T * W)), *sc = tu_dnan(g, 64);
        const clef_rope_desc rg = {.head_dim = D, .section = {24, 20, 20}, .inv_freq = dinv};
        const clef_attn_desc a = {.n_seg = 2, .q_off = off, .kv_off = off, .n_q_heads = nh, .n_kv_heads = nkv,
                                  .head_dim = D, .q_stride = ld, .k_stride = ld, .v_stride = ld, .o_stride = W,
                                  .scale = 1.0f / sqrtf((float)D), .causal = 1};
        tu_ok(g->ops->qk_norm_rope(g, da, ld, da + W, ld, T, nh, nkv, dqw, dkw, 1e-6f, dpos, &rg, &err), &err);
        tu_ok(g->ops->attention(g, da, da + W, da + W + nkv * D, oa, &a, &err), &err);
        tu_ok(g->ops->qk_norm_rope(g, db, ld, db + W, ld, T, nh, nkv, dqw, dkw, 1e-6f, dpos, &rg, &err), &err);
        tu_ok(g->ops->add(g, sc, sc, sc, 1, 64, 64, &err), &err); /* any other op: the staged rows are forgotten */
        tu_ok(g->ops->attention(g, db, db + W, db + W + nkv * D, ob, &a, &err), &err);
        float *ga = tu_dget(g, oa, (size_t)(T * W)), *gb = tu_dget(g, ob, (size_t)(T * W));
        assert_memory_equal(ga, gb, (size_t)(T * W) * 4);
        printf("  %-34s %-9s attention on q/k rows qk_norm_rope staged: bitwise its own conversion\n",
               "qk_norm_rope -> attention", f->name[bes[bi]]);
        free(ga), free(gb);
        g->ops->free(g, da), g->ops->free(g, db), g->ops->free(g, dqw), g->ops->free(g, dkw), g->ops->free(g, dinv);
        g->ops->free(g, dpos), g->ops->free(g, oa), g->ops->free(g, ob), g->ops->free(g, sc);
    }
    free(pos), free(qkv), free(qw), free(kw);
}

/* ---- attention timing (CLEF_ATTN_BENCH=1) ------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The thinker's attention (32 query heads of 128, 4 KV heads, causal) at
 * 8 x 4096 and 32 x 1000 tokens: ms per call of the attention op (which
 * includes converting Q, K, V to bf16) and TFLOP/s of the causal products
 * (4 D per query-key pair per head; the precise mode runs 3x the MMAs). */
static void test_attention_bench(void **state) {
    TU_NEED_GPU(state);
    const char *env = getenv("CLEF_ATTN_BENCH");
    if (!env || strcmp(env, "1")) {
        printf("  CLEF_ATTN_BENCH unset: timing skipped\n");
        skip();
    }
    fx *f = *state;
    clef_err err;
    const int64_t nh = 32, nkv = 4, D = 128, TMAX = 8 * 4096;
    float *q = rand_vec((size_t)(TMAX * nh * D), 1.0f), *kv = rand_vec((size_t)(2 * TMAX * nkv * D), 1.0f);
    struct {
        clef_backend *be;
        const char *name;
    } const ks[5] = {{f->alt[A_V1], "v1 fast"},           {f->gpu[G_LT], "v2 fast"},
                     {f->alt[A_V1_PRECISE], "v1 precise"}, {f->alt[A_V2_PRECISE], "v2 precise"},
                     {f->gpu[G_PRECISE], "v2w precise (default)"}};
    const int64_t n_seg[2] = {8, 32}, len[2] = {4096, 1000};
    float *ref[2] = {NULL, NULL}; /* v1's output, fast and precise */
    for (int c = 0; c < 2; c++) {
        const int64_t ns = n_seg[c], T = ns * len[c];
        int64_t off[33];
        double pairs = 0;
        for (int64_t s = 0; s <= ns; s++) off[s] = s * len[c];
        for (int64_t s = 0; s < ns; s++) pairs += 0.5 * (double)len[c] * (double)(len[c] + 1);
        const double flop = 4.0 * (double)D * (double)nh * pairs;
        clef_attn_desc a = {.n_seg = ns, .q_off = off, .kv_off = off, .n_q_heads = nh, .n_kv_heads = nkv,
                            .head_dim = D, .q_stride = nh * D, .k_stride = nkv * D, .v_stride = nkv * D,
                            .o_stride = nh * D, .scale = 1.0f / sqrtf((float)D), .causal = 1};
        for (int i = 0; i < 5; i++) {
            clef_backend *g = ks[i].be;
            float *dq = tu_dput(g, q, (size_t)(T * nh * D) * 4), *dkv = tu_dput(g, kv, (size_t)(2 * T * nkv * D) * 4),
                  *dout = tu_dnan(g, (size_t)(T * nh * D));
            const float *dk = dkv, *dv = dkv + T * nkv * D;
            tu_ok(g->ops->attention(g, dq, dk, dv, dout, &a, &err), &err); /* warm-up */
            float *s0 = tu_dget(g, dout, 1);
            free(s0);
            const int reps = 10;
            const double t0 = now_s();
            for (int r = 0; r < reps; r++) tu_ok(g->ops->attention(g, dq, dk, dv, dout, &a, &err), &err);
            float *s1 = tu_dget(g, dout, 1);
            free(s1);
            const double ms = (now_s() - t0) * 1e3 / reps;
            const int prec = i >= 2;
            printf("  attention %2lld x %4lld  %-12s %8.3f ms/layer %7.1f TFLOP/s%s (x48 layers: %.1f ms)\n",
                   (long long)ns, (long long)len[c], ks[i].name, ms, flop / (ms * 1e-3) / 1e12,
                   prec ? " (x3 MMA work)" : "              ", 48.0 * ms);
            /* long records: every kernel agrees with v1 of its mode (the CPU would take minutes here) */
            float *o = tu_dget(g, dout, (size_t)(T * nh * D));
            if (i == 0 || i == 2) {
                free(ref[i / 2]);
                ref[i / 2] = o;
            } else {
                char w[64];
                snprintf(w, sizeof w, "attn %lld x %lld vs v1", (long long)ns, (long long)len[c]);
                check(w, ks[i].name, o, ref[prec], (size_t)(T * nh * D), prec ? TOL_PRECISE_ATTN : TOL_BF16);
                free(o);
            }
            g->ops->free(g, dq), g->ops->free(g, dkv), g->ops->free(g, dout);
        }
    }
    free(q), free(kv), free(ref[0]), free(ref[1]);
}

/* ---- router and experts -------------------------------------------------- */

/* Top-k of T x E router logits (ck_router_topk: registers only for E % 32 == 0 up to 256, the shared-row
 * kernel otherwise): the CPU's expert choices exactly (an exact tie: lower expert first), weights within
 * f32 tolerance. */
static void router_case(fx *f, int64_t T, int64_t E, int64_t k) {
    clef_backend *g = f->gpu[G_LT], *c = f->cpu;
    clef_err err;
    float *l = rand_vec((size_t)(T * E), 3.0f);
    l[5 * E + 2] = l[5 * E + 6] = 20.0f; /* an exact tie: lower expert first */
    int32_t *ri = malloc((size_t)(T * k) * 4);
    float *rw = malloc((size_t)(T * k) * 4);
    tu_ok(c->ops->router_topk(c, l, T, E, k, 1, ri, rw, &err), &err);
    float *dl = tu_dput(g, l, (size_t)(T * E) * 4), *dw = tu_dnan(g, (size_t)(T * k));
    int32_t *di = (int32_t *)tu_dnan(g, (size_t)(T * k));
    tu_ok(g->ops->router_topk(g, dl, T, E, k, 1, di, dw, &err), &err);
    float *w = tu_dget(g, dw, (size_t)(T * k));
    int32_t *gi = (int32_t *)tu_dget(g, (const float *)di, (size_t)(T * k));
    size_t diff = 0;
    for (int64_t i = 0; i < T * k; i++) diff += gi[i] != ri[i];
    char what[64];
    snprintf(what, sizeof what, "router top-%lld of %lld", (long long)k, (long long)E);
    printf("  %-34s %-9s %zu of %lld expert choices differ\n", what, "cuda", diff, (long long)(T * k));
    assert_int_equal(diff, 0);
    assert_int_equal(gi[5 * k], 2);
    assert_int_equal(gi[5 * k + 1], 6);
    check("router weights", "cuda", w, rw, (size_t)(T * k), TOL_F32);
    free(l), free(ri), free(rw), free(w), free(gi);
    g->ops->free(g, dl), g->ops->free(g, dw), g->ops->free(g, di);
}

static void test_router(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    router_case(f, 300, 128, 8); /* the thinker's */
    router_case(f, 77, 96, 5);
    router_case(f, 50, 100, 8); /* the shared-row kernel */
}

/* Experts: T tokens routed by the CPU router over random logits. */
/* The experts of wc (bf16 host data wh) uploaded to backend g into wg (E <= 16 per matrix: gate, up,
 * down); returns the moe view of them.  Fails the test on an upload error. */
static clef_moe_weights upload_experts(clef_backend *g, clef_weight wc[3][16], uint16_t *wh[3][16],
                                       int64_t E, int64_t H, int64_t NI, clef_weight wg[3][16]) {
    clef_err err;
    for (int j = 0; j < 3; j++)
        for (int64_t e = 0; e < E; e++)
            tu_ok(g->ops->weight_init(g, &wg[j][e], CLEF_DT_BF16, wc[j][e].rows, wc[j][e].cols, wh[j][e], &err), &err);
    return (clef_moe_weights){.n_experts = E, .hidden = H, .inter = NI, .gate = wg[0], .up = wg[1], .down = wg[2]};
}

static void release_experts(clef_backend *g, clef_weight wg[3][16], int64_t E) {
    for (int j = 0; j < 3; j++)
        for (int64_t e = 0; e < E; e++) g->ops->weight_release(g, &wg[j][e]);
}

/* The moe op on backend g over T tokens (x [T, H], routing idx / rw [T, k]) with the experts wc / wh
 * uploaded for this one call: the heap array y [T, H] (caller frees). */
static float *moe_once(clef_backend *g, clef_weight wc[3][16], uint16_t *wh[3][16], int64_t E, int64_t H, int64_t NI,
                       const float *x, const int32_t *idx, const float *rw, int64_t T, int64_t k) {
    clef_err err;
    clef_weight wg[3][16];
    const clef_moe_weights mg = upload_experts(g, wc, wh, E, H, NI, wg);
    float *dx = tu_dput(g, x, (size_t)(T * H) * 4), *dw = tu_dput(g, rw, (size_t)(T * k) * 4);
    int32_t *di = tu_dput(g, idx, (size_t)(T * k) * 4);
    float *dy = tu_dnan(g, (size_t)(T * H));
    tu_ok(g->ops->moe(g, dx, T, di, dw, k, &mg, dy, &err), &err);
    float *y = tu_dget(g, dy, (size_t)(T * H));
    g->ops->free(g, dx), g->ops->free(g, dw), g->ops->free(g, di), g->ops->free(g, dy);
    release_experts(g, wg, E);
    return y;
}

/* E <= 16 random bf16 experts (gate, up [NI, H]; down [H, NI]; entries ~ 1/sqrt(fan-in)) into wh
 * (heap, caller frees) and bound on the CPU backend in wc: the CPU reference's expert weights. */
static clef_moe_weights cpu_experts(fx *f, int64_t E, int64_t H, int64_t NI, uint16_t *wh[3][16],
                                    clef_weight wc[3][16]) {
    clef_err err;
    for (int j = 0; j < 3; j++)
        for (int64_t e = 0; e < E; e++) {
            const int64_t r = j == 2 ? H : NI, cc = j == 2 ? NI : H;
            wh[j][e] = rand_bf16((size_t)(r * cc), 1.0f / sqrtf((float)cc));
            tu_ok(f->cpu->ops->weight_init(f->cpu, &wc[j][e], CLEF_DT_BF16, r, cc, wh[j][e], &err), &err);
        }
    return (clef_moe_weights){.n_experts = E, .hidden = H, .inter = NI, .gate = wc[0], .up = wc[1], .down = wc[2]};
}

static void test_moe(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    clef_err err;
    /* TB * k >= 8192: big tiles; TB > 8192: two passes of the chunked expert block */
    const int64_t E = 16, H = 256, NI = 128, k = 4, T = 300, TB = 8300;
    uint16_t *wh[3][16];
    clef_weight wc[3][16];
    clef_moe_weights mc = cpu_experts(f, E, H, NI, wh, wc);
    float *x = rand_vec((size_t)(TB * H), 1.0f), *logits = rand_vec((size_t)(TB * E), 2.0f);
    int32_t *idx = malloc((size_t)(TB * k) * 4);
    float *rw = malloc((size_t)(TB * k) * 4);
    tu_ok(f->cpu->ops->router_topk(f->cpu, logits, TB, E, k, 1, idx, rw, &err), &err);
    float *ref = malloc((size_t)(T * H) * 4), *prec_y = NULL, *fast_y = NULL;
    tu_ok(f->cpu->ops->moe(f->cpu, x, T, idx, rw, k, &mc, ref, &err), &err);
    for (int gi = 0; gi < N_GPU; gi++) {
        if (gi == G_CUSTOM || gi == G_PRECISE_CUSTOM || gi >= G_LT_SPLITK)
            continue; /* the experts always use the custom kernel */
        clef_backend *g = f->gpu[gi];
        clef_weight wg[3][16];
        const clef_moe_weights mg = upload_experts(g, wc, wh, E, H, NI, wg);
        float *dx = tu_dput(g, x, (size_t)(TB * H) * 4), *dw = tu_dput(g, rw, (size_t)(TB * k) * 4);
        int32_t *di = tu_dput(g, idx, (size_t)(TB * k) * 4);
        float *dy = tu_dnan(g, (size_t)(TB * H)), *dy1 = tu_dnan(g, (size_t)(TB * H));
        tu_ok(g->ops->moe(g, dx, T, di, dw, k, &mg, dy, &err), &err);
        float *y = tu_dget(g, dy, (size_t)(T * H));
        check("moe 16 experts top-4 T=300", f->name[gi], y, ref, (size_t)(T * H), f->tol_mm[gi]);
        if (gi == G_LT) {
            fast_y = malloc((size_t)(T * H) * 4);
            memcpy(fast_y, y, (size_t)(T * H) * 4);
        } else if (gi == G_PRECISE) {
            prec_y = malloc((size_t)(T * H) * 4);
            memcpy(prec_y, y, (size_t)(T * H) * 4);
        } else if (gi == G_PRECISE_T0 && memcmp(prec_y, y, (size_t)(T * H) * 4) != 0) {
            fail_msg("moe: CLEF_CUDA_TUNE=0 differs from the default");
        }
        /* tokens alone, a slice, and the first T rows of a big-tile batch */
        const int64_t picks[3] = {0, 99, T - 1};
        for (int i = 0; i < 3; i++) {
            tu_ok(g->ops->moe(g, dx + picks[i] * H, 1, di + picks[i] * k, dw + picks[i] * k, k, &mg, dy1, &err), &err);
            float *y1 = tu_dget(g, dy1, (size_t)H);
            if (memcmp(y1, y + picks[i] * H, (size_t)H * 4) != 0)
                fail_msg("moe on %s: token %lld alone differs from the batch", f->name[gi], (long long)picks[i]);
            free(y1);
        }
        tu_ok(g->ops->moe(g, dx + 13 * H, 40, di + 13 * k, dw + 13 * k, k, &mg, dy1, &err), &err);
        float *ys = tu_dget(g, dy1, (size_t)(40 * H));
        assert_memory_equal(ys, y + 13 * H, (size_t)(40 * H) * 4);
        free(ys);
        tu_ok(g->ops->moe(g, dx, TB, di, dw, k, &mg, dy1, &err), &err);
        float *yb = tu_dget(g, dy1, (size_t)(TB * H));
        if (memcmp(yb, y, (size_t)(T * H) * 4) != 0)
            fail_msg("moe on %s: the first %lld tokens differ inside a batch of %lld (big tiles)", f->name[gi],
                     (long long)T, (long long)TB);
        /* the plan's three forms: entries staged in shared memory (T * k <= 8192: the passes above), counted
         * by each block from global memory (<= 16384: 3,000 x 4 here), a count kernel first (the batch) */
        tu_ok(g->ops->moe(g, dx, 3000, di, dw, k, &mg, dy, &err), &err);
        float *ym = tu_dget(g, dy, (size_t)(3000 * H));
        if (memcmp(ym, yb, (size_t)(3000 * H) * 4) != 0)
            fail_msg("moe on %s: 3,000 tokens differ from the first 3,000 of the batch of %lld", f->name[gi],
                     (long long)TB);
        free(ym);
        const int64_t late[2] = {8191, 8250}; /* the end of the first pass, inside the second */
        for (int i = 0; i < 2; i++) {
            tu_ok(g->ops->moe(g, dx + late[i] * H, 1, di + late[i] * k, dw + late[i] * k, k, &mg, dy, &err), &err);
            float *y1 = tu_dget(g, dy, (size_t)H);
            if (memcmp(y1, yb + late[i] * H, (size_t)H * 4) != 0)
                fail_msg("moe on %s: token %lld alone differs from the batch of %lld", f->name[gi],
                         (long long)late[i], (long long)TB);
            free(y1);
        }
        /* input rows left converted by add_rmsnorm: both passes of the batch read runs of them, bitwise
         * the passes converting their own rows (after a plain rmsnorm) */
        {
            float *ones = malloc((size_t)H * 4);
            for (int64_t i = 0; i < H; i++) ones[i] = 1.0f;
            float *d1 = tu_dput(g, ones, (size_t)H * 4), *dn = tu_dnan(g, (size_t)(TB * H)),
                  *dn2 = tu_dnan(g, (size_t)(TB * H));
            tu_ok(g->ops->rmsnorm(g, dx, d1, dn2, TB, H, 1e-6f, &err), &err);
            tu_ok(g->ops->moe(g, dn2, TB, di, dw, k, &mg, dy1, &err), &err);
            float *yr = tu_dget(g, dy1, (size_t)(TB * H));
            tu_ok(g->ops->add_rmsnorm(g, dx, NULL, d1, dn, TB, H, 1e-6f, &err), &err);
            tu_ok(g->ops->moe(g, dn, TB, di, dw, k, &mg, dy1, &err), &err);
            float *yc = tu_dget(g, dy1, (size_t)(TB * H));
            if (memcmp(yr, yc, (size_t)(TB * H) * 4) != 0)
                fail_msg("moe on %s: input rows converted by add_rmsnorm give other sums", f->name[gi]);
            free(ones), free(yr), free(yc);
            g->ops->free(g, d1), g->ops->free(g, dn), g->ops->free(g, dn2);
        }
        printf("  %-34s %-9s tokens alone / slice / batch of %lld: bitwise equal (also on rows add_rmsnorm converted)\n",
               "moe", f->name[gi], (long long)TB);
        free(yb), free(y);
        g->ops->free(g, dx), g->ops->free(g, dw), g->ops->free(g, di), g->ops->free(g, dy), g->ops->free(g, dy1);
        release_experts(g, wg, E);
    }
    /* The default (CLEF_CUDA_WGMMA=2 where built for sm_90a on a compute capability 9.0 device) runs
     * the TMA (or mma.sync) expert kernel below 8192 expert rows and the wgmma one above (the batch of TB
     * above: its bitwise check against T = 300 already crosses kernels).  Here the wgmma kernel at
     * every size (CLEF_CUDA_WGMMA=1, 64-row tiles at T = 300) must give bitwise the mma.sync results:
     * mixing them by batch size relies on it. */
    for (int pr = 0; pr < 2; pr++) {
        const clef_cuda_options o = {.device = 0, .precise = pr, .gemm = 2, .profile = 0};
        const char *const env[] = {"CLEF_CUDA_WGMMA", "1", NULL};
        clef_backend *g = tu_cuda_backend_env(&o, env, &err);
        tu_ok(g ? 0 : -1, &err);
        float *y = moe_once(g, wc, wh, E, H, NI, x, idx, rw, T, k);
        const char *nm = pr ? "prec-wg" : "fast-wg";
        check("moe 16 experts top-4 T=300", nm, y, ref, (size_t)(T * H), pr ? TOL_PRECISE : TOL_BF16);
        const float *dflt = pr ? prec_y : fast_y;
        double md = 0.0;
        for (size_t i = 0; i < (size_t)(T * H); i++) {
            const double d = fabs((double)y[i] - (double)dflt[i]);
            if (d > md) md = d;
        }
        char buf[256];
        clef_cuda_describe(g, buf, sizeof buf);
        const int has_wg = strstr(buf, "wgmma") != NULL, same = memcmp(y, dflt, (size_t)(T * H) * 4) == 0;
        printf("  %-34s %-9s %s vs the default at T=300: %s (max |diff| %.3g)\n", "moe", nm,
               has_wg ? "wgmma kernel" : "(no wgmma on this build/device)", same ? "bitwise equal" : "DIFFER", md);
        if (!same) fail_msg("moe: the wgmma expert kernel differs from the mma.sync one (%s)", nm);
        free(y);
        g->ops->destroy(g);
    }
    for (int j = 0; j < 3; j++)
        for (int e = 0; e < E; e++) free(wh[j][e]);
    free(x), free(logits), free(idx), free(rw), free(ref), free(prec_y), free(fast_y);
}

/* An A/B of two expert kernels that must give bitwise the same sums: the reference backend's
 * settings (env_ref), the tested backend's (env_test: NULL-terminated name, value pairs), the words
 * of the tested backend's description when it runs the kernel (has), and names for the messages. */
typedef struct kernel_ab {
    const char *const *env_ref, *const *env_test;
    const char *has, *kernel, *ref;
} kernel_ab;

/* The mma.sync expert kernel (CLEF_CUDA_TMA=0) vs the default's TMA kernel below the wgmma threshold. */
static const char *const ENV_TMA_OFF[] = {"CLEF_CUDA_TMA", "0", NULL}, *const ENV_DEFAULT[] = {NULL};
static const kernel_ab AB_TMA = {ENV_TMA_OFF, ENV_DEFAULT, "TMA expert kernel", "TMA kernel", "CLEF_CUDA_TMA=0"};

/* Two CUDA backends in numerics mode `precise` (0 fast, 1 precise): gb[0] with ab->env_ref, gb[1] with
 * ab->env_test; returns whether gb[1] runs the tested kernel (its description names ab->has: an sm_90a
 * build on a compute capability 9.0 device).  The caller destroys both. */
static int kernel_backend_pair(int precise, const kernel_ab *ab, clef_backend *gb[2]) {
    clef_err err;
    const clef_cuda_options o = {.device = 0, .precise = precise, .gemm = 2, .profile = 0};
    gb[0] = tu_cuda_backend_env(&o, ab->env_ref, &err);
    tu_ok(gb[0] ? 0 : -1, &err);
    gb[1] = tu_cuda_backend_env(&o, ab->env_test, &err);
    tu_ok(gb[1] ? 0 : -1, &err);
    char buf[512];
    clef_cuda_describe(gb[1], buf, sizeof buf);
    return strstr(buf, ab->has) != NULL;
}

static int tma_backend_pair(int precise, clef_backend *gb[2]) { return kernel_backend_pair(precise, &AB_TMA, gb); }

/* The warp-specialised TMA expert kernel (default for passes below the wgmma threshold on sm_90a /
 * compute capability 9.0) against the mma.sync kernel (CLEF_CUDA_TMA=0): bitwise the same sums, on
 * shapes whose tiles are cut at both ends (hidden 136 = two 64-wide K stages + 8; inter 72 = one
 * full and one 8-column gate/up tile, a K tail in the down product; down's 136 rows = 128 + 8), with
 * 32-row tiles (precise, few rows per expert), 64-row tiles (fast; precise with more rows), a token
 * alone and the CPU within the mode's tolerance. */
/* moe_add_rmsnorm (the MoE block with the residual add and the next norm in its combine) against the moe
 * op then add_rmsnorm on the same backend, bitwise: h and y, and a product of y afterwards (which reads the
 * bf16 rows the fused op keeps, where the unfused path's add_rmsnorm keeps its own).  The input rows come
 * from an add_rmsnorm, as in the thinker (so they are cached as converted); y is the input, as there.
 * Hidden 2048 takes the one-kernel combine + norm, 256 the two-kernel fallback; 8,300 tokens two passes. */
static void moe_add_rmsnorm_case(fx *f, int gi, int64_t H, int64_t T, int64_t k) {
    clef_err err;
    const int64_t E = 16, NI = 128, N = 64;
    clef_backend *g = f->gpu[gi];
    uint16_t *wh[3][16];
    clef_weight wc[3][16], wg[3][16];
    const clef_moe_weights mc = cpu_experts(f, E, H, NI, wh, wc);
    const clef_moe_weights mg = upload_experts(g, wc, wh, E, H, NI, wg);
    uint16_t *ph = rand_bf16((size_t)(N * H), 1.0f / sqrtf((float)H));
    clef_weight wp;
    tu_ok(g->ops->weight_init(g, &wp, CLEF_DT_BF16, N, H, ph, &err), &err);
    float *h0 = rand_vec((size_t)(T * H), 1.0f), *p = rand_vec((size_t)(T * H), 1.0f);
    float *pw = rand_vec((size_t)H, 1.0f), *nw = rand_vec((size_t)H, 1.0f), *logits = rand_vec((size_t)(T * E), 2.0f);
    int32_t *idx = malloc((size_t)(T * k) * 4);
    float *rw = malloc((size_t)(T * k) * 4);
    tu_ok(f->cpu->ops->router_topk(f->cpu, logits, T, E, k, 1, idx, rw, &err), &err);
    float *dp = tu_dput(g, p, (size_t)(T * H) * 4), *dpw = tu_dput(g, pw, (size_t)H * 4),
          *dnw = tu_dput(g, nw, (size_t)H * 4), *dw = tu_dput(g, rw, (size_t)(T * k) * 4);
    int32_t *di = tu_dput(g, idx, (size_t)(T * k) * 4);
    float *got[2][3]; /* [fused][h, y, product of y] */
    for (int fu = 0; fu < 2; fu++) {
        float *dh = tu_dput(g, h0, (size_t)(T * H) * 4), *da = tu_dnan(g, (size_t)(T * H)),
              *dpr = tu_dnan(g, (size_t)(T * N));
        tu_ok(g->ops->add_rmsnorm(g, dh, dp, dpw, da, T, H, 1e-6f, &err), &err);
        if (fu) {
            tu_ok(g->ops->moe_add_rmsnorm(g, da, T, di, dw, k, &mg, dh, dnw, 1e-6f, da, &err), &err);
        } else {
            float *dox = tu_dnan(g, (size_t)(T * H));
            tu_ok(g->ops->moe(g, da, T, di, dw, k, &mg, dox, &err), &err);
            tu_ok(g->ops->add_rmsnorm(g, dh, dox, dnw, da, T, H, 1e-6f, &err), &err);
            g->ops->free(g, dox);
        }
        tu_ok(g->ops->matmul(g, da, T, &wp, NULL, dpr, &err), &err);
        got[fu][0] = tu_dget(g, dh, (size_t)(T * H));
        got[fu][1] = tu_dget(g, da, (size_t)(T * H));
        got[fu][2] = tu_dget(g, dpr, (size_t)(T * N));
        g->ops->free(g, dh), g->ops->free(g, da), g->ops->free(g, dpr);
    }
    static const char *const PART[3] = {"h", "y", "the product of y"};
    const size_t n[3] = {(size_t)(T * H), (size_t)(T * H), (size_t)(T * N)};
    for (int i = 0; i < 3; i++)
        if (memcmp(got[0][i], got[1][i], n[i] * 4) != 0)
            fail_msg("moe_add_rmsnorm on %s (hidden %lld, %lld tokens): %s differs from moe + add_rmsnorm",
                     f->name[gi], (long long)H, (long long)T, PART[i]);
    for (size_t i = 0; i < n[1]; i++)
        if (!isfinite(got[1][1][i])) fail_msg("moe_add_rmsnorm: y[%zu] = %g", i, (double)got[1][1][i]);
    printf("  moe_add_rmsnorm H %-5lld T %-5lld %-9s h, y, the next product: = moe + add_rmsnorm bitwise\n",
           (long long)H, (long long)T, f->name[gi]);
    if (T <= 300) { /* and the CPU's same block within the mode's tolerance */
        float *hc = malloc((size_t)(T * H) * 4), *ac = malloc((size_t)(T * H) * 4), *oc = malloc((size_t)(T * H) * 4);
        memcpy(hc, h0, (size_t)(T * H) * 4);
        tu_ok(f->cpu->ops->add_rmsnorm(f->cpu, hc, p, pw, ac, T, H, 1e-6f, &err), &err);
        tu_ok(f->cpu->ops->moe(f->cpu, ac, T, idx, rw, k, &mc, oc, &err), &err);
        tu_ok(f->cpu->ops->add_rmsnorm(f->cpu, hc, oc, nw, ac, T, H, 1e-6f, &err), &err);
        char what[64];
        snprintf(what, sizeof what, "moe_add_rmsnorm H %lld top-%lld: y", (long long)H, (long long)k);
        check(what, f->name[gi], got[1][1], ac, (size_t)(T * H), f->tol_mm[gi]);
        free(hc), free(ac), free(oc);
    }
    for (int fu = 0; fu < 2; fu++)
        for (int i = 0; i < 3; i++) free(got[fu][i]);
    g->ops->free(g, dp), g->ops->free(g, dpw), g->ops->free(g, dnw), g->ops->free(g, dw), g->ops->free(g, di);
    g->ops->weight_release(g, &wp);
    release_experts(g, wg, E);
    for (int j = 0; j < 3; j++)
        for (int64_t e = 0; e < E; e++) f->cpu->ops->weight_release(f->cpu, &wc[j][e]), free(wh[j][e]);
    free(ph), free(h0), free(p), free(pw), free(nw), free(logits), free(idx), free(rw);
}

static void test_moe_add_rmsnorm(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    const int bes[2] = {G_LT, G_PRECISE};
    for (int b = 0; b < 2; b++) {
        moe_add_rmsnorm_case(f, bes[b], 2048, 300, 4);
        moe_add_rmsnorm_case(f, bes[b], 2048, 300, 8); /* top-8: the combines' compile-time k */
        moe_add_rmsnorm_case(f, bes[b], 256, 300, 8);
    }
    moe_add_rmsnorm_case(f, G_LT, 2048, 8300, 4);
    moe_add_rmsnorm_case(f, G_PRECISE, 256, 8300, 4);
}

static void test_moe_tma(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    clef_err err;
    const int64_t E = 8, H = 136, NI = 72, k = 2, TMAX = 300;
    uint16_t *wh[3][16];
    clef_weight wc[3][16];
    clef_moe_weights mc = cpu_experts(f, E, H, NI, wh, wc);
    float *x = rand_vec((size_t)(TMAX * H), 1.0f), *logits = rand_vec((size_t)(TMAX * E), 2.0f);
    int32_t *idx = malloc((size_t)(TMAX * k) * 4);
    float *rw = malloc((size_t)(TMAX * k) * 4), *ref = malloc((size_t)(TMAX * H) * 4);
    tu_ok(f->cpu->ops->router_topk(f->cpu, logits, TMAX, E, k, 1, idx, rw, &err), &err);
    tu_ok(f->cpu->ops->moe(f->cpu, x, TMAX, idx, rw, k, &mc, ref, &err), &err);
    for (int pr = 0; pr < 2; pr++) {
        clef_backend *gb[2];
        const int has_tma = tma_backend_pair(pr, gb);
        const int64_t Ts[3] = {1, 100, TMAX}; /* T k = 2, 200 (32-row tiles when precise), 600 rows */
        for (int ti = 0; ti < 3; ti++) {
            const int64_t T = Ts[ti];
            float *got[2];
            for (int b = 0; b < 2; b++) got[b] = moe_once(gb[b], wc, wh, E, H, NI, x, idx, rw, T, k);
            char what[96];
            snprintf(what, sizeof what, "moe 8 experts 136/72 T=%lld", (long long)T);
            check(what, pr ? "prec-tma" : "fast-tma", got[1], ref, (size_t)(T * H), pr ? TOL_PRECISE : TOL_BF16);
            const int same = memcmp(got[0], got[1], (size_t)(T * H) * 4) == 0;
            printf("  %-34s %-9s %s vs CLEF_CUDA_TMA=0: %s\n", what, pr ? "prec-tma" : "fast-tma",
                   has_tma ? "TMA kernel" : "(no TMA kernel on this build/device)", same ? "bitwise equal" : "DIFFER");
            if (!same) fail_msg("moe: the TMA expert kernel differs from the mma.sync one (%s, T=%lld)", what, (long long)T);
            free(got[0]), free(got[1]);
        }
        gb[0]->ops->destroy(gb[0]), gb[1]->ops->destroy(gb[1]);
    }
    for (int j = 0; j < 3; j++)
        for (int e = 0; e < E; e++) free(wh[j][e]);
    free(x), free(logits), free(idx), free(rw), free(ref);
}

/* The reference kernel of ab (e.g. CLEF_CUDA_TMA=0: mma.sync) vs the tested one on E experts of H / NI
 * with top-k routing, for each token count in Ts: the reference sums once, then the tested kernel's
 * `reps` times on the same device inputs, fast (pr 0) and precise (pr 1): every run must be bitwise
 * equal to them (a stale or overwritten stage shows as a difference that comes and goes).  With
 * `need`, a backend that does not run the tested kernel on a device that runs wgmma fails. */
static void kernel_repeats(fx *f, const kernel_ab *ab, int need, int64_t E, int64_t k, int64_t H, int64_t NI,
                           const int64_t *Ts, int nT, int reps) {
    clef_err err;
    int64_t TMAX = 0;
    for (int i = 0; i < nT; i++) TMAX = Ts[i] > TMAX ? Ts[i] : TMAX;
    uint16_t **wh[3];
    clef_weight *wg[3];
    for (int j = 0; j < 3; j++) {
        wh[j] = malloc((size_t)E * sizeof *wh[j]);
        wg[j] = malloc((size_t)E * sizeof *wg[j]);
        assert_non_null(wh[j]), assert_non_null(wg[j]);
        for (int64_t e = 0; e < E; e++) {
            const int64_t r = j == 2 ? H : NI, cc = j == 2 ? NI : H;
            wh[j][e] = rand_bf16((size_t)(r * cc), 1.0f / sqrtf((float)cc));
        }
    }
    float *x = rand_vec((size_t)(TMAX * H), 1.0f), *logits = rand_vec((size_t)(TMAX * E), 2.0f);
    int32_t *idx = malloc((size_t)(TMAX * k) * 4);
    float *rw = malloc((size_t)(TMAX * k) * 4);
    tu_ok(f->cpu->ops->router_topk(f->cpu, logits, TMAX, E, k, 1, idx, rw, &err), &err);
    for (int pr = 0; pr < 2; pr++) {
        clef_backend *gb[2];
        const int has_k = kernel_backend_pair(pr, ab, gb);
        if (need && !has_k) {
            char buf[512];
            clef_cuda_describe(gb[1], buf, sizeof buf);
            if (strstr(buf, "wgmma experts")) fail_msg("moe: the backend does not run the %s (%s)", ab->kernel, buf);
        }
        for (int ti = 0; ti < nT; ti++) {
            const int64_t T = Ts[ti];
            float *ref = NULL;
            int bad = 0;
            for (int b = 0; b < 2; b++) {
                clef_backend *g = gb[b];
                for (int j = 0; j < 3; j++)
                    for (int64_t e = 0; e < E; e++)
                        tu_ok(g->ops->weight_init(g, &wg[j][e], CLEF_DT_BF16, j == 2 ? H : NI, j == 2 ? NI : H,
                                                  wh[j][e], &err),
                              &err);
                const clef_moe_weights mg = {.n_experts = E, .hidden = H, .inter = NI, .gate = wg[0], .up = wg[1],
                                             .down = wg[2]};
                float *dx = tu_dput(g, x, (size_t)(T * H) * 4), *dw = tu_dput(g, rw, (size_t)(T * k) * 4);
                int32_t *di = tu_dput(g, idx, (size_t)(T * k) * 4);
                float *dy = tu_dnan(g, (size_t)(T * H));
                for (int rep = 0; rep < (b ? reps : 1); rep++) {
                    tu_ok(g->ops->moe(g, dx, T, di, dw, k, &mg, dy, &err), &err);
                    float *y = tu_dget(g, dy, (size_t)(T * H));
                    if (!b) ref = y;
                    else {
                        bad += memcmp(y, ref, (size_t)(T * H) * 4) != 0;
                        free(y);
                    }
                }
                g->ops->free(g, dx), g->ops->free(g, dw), g->ops->free(g, di), g->ops->free(g, dy);
                for (int j = 0; j < 3; j++)
                    for (int64_t e = 0; e < E; e++) g->ops->weight_release(g, &wg[j][e]);
            }
            printf("  moe %3lld experts %lld/%lld top-%lld T=%-5lld %-8s %s vs %s, %d runs: %d differ\n", (long long)E,
                   (long long)H, (long long)NI, (long long)k, (long long)T, pr ? "precise" : "fast",
                   has_k ? ab->kernel : "(kernel not on this build/device)", ab->ref, reps, bad);
            if (bad)
                fail_msg("moe %lld experts %lld/%lld T=%lld: %d of %d %s runs differ from the sums of %s", (long long)E,
                         (long long)H, (long long)NI, (long long)T, bad, reps, ab->kernel, ab->ref);
            free(ref);
        }
        gb[0]->ops->destroy(gb[0]), gb[1]->ops->destroy(gb[1]);
    }
    for (int j = 0; j < 3; j++) {
        for (int64_t e = 0; e < E; e++) free(wh[j][e]);
        free(wh[j]), free(wg[j]);
    }
    free(x), free(logits), free(idx), free(rw);
}

/* The TMA expert kernel at the model's widths, where every pipeline stage is refilled many times
 * (test_moe_tma's shapes refill at most once): 8 experts of hidden 2048 / inter 768 (gate/up 32 K
 * stages, down 12 stages over 16 column tiles) and of hidden 1920 / inter 704 (30 and 11 stages: not
 * multiples of the 3 to 5 stages in flight; 15 down column tiles), 60 and 300 tokens (32- and
 * 64-row tiles), ten TMA runs each; then one full layer (128 experts, top-8) at 1,000 tokens: 8,000
 * expert rows in ~2,000 blocks per product, full 64-row tiles — the load at which the H200 showed a
 * missing proxy fence (a warp reading a weight stage the next tensor copy was overwriting) in a few
 * values of every run. */
static void test_moe_tma_wide(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    const int64_t Ts[2] = {60, 300}, Tfull[1] = {1000};
    kernel_repeats(f, &AB_TMA, 0, 8, 2, 2048, 768, Ts, 2, 10);
    kernel_repeats(f, &AB_TMA, 0, 8, 2, 1920, 704, Ts, 2, 10);
    kernel_repeats(f, &AB_TMA, 0, 128, 8, 2048, 768, Tfull, 1, 5);
}

/* The persistent warp-specialised wgmma kernel (ck_gemm_wgmma_ws: the default for BF16 passes of
 * >= 8192 expert rows, 128-row tiles) against the mma.sync kernel at every size (CLEF_CUDA_WGMMA=0,
 * the same 128-row plan), bitwise, fast and precise, several runs each:
 *   8 experts of hidden 320 / inter 192, top-2: gate+up 2 column tiles of 128 + 128 (the second half
 *     empty: its weight boxes wholly past the matrix), 5 K stages; down 2 column tiles of 256 (the
 *     second 64 wide), 3 K stages (fewer than the ring's stages: a tile's stages wrap across tiles);
 *     4,200 tokens (8,400 rows, one pass, about one tile per CTA) and 16,384 tokens (two passes of
 *     16,384 rows: each CTA walks several tiles, partial m-tiles at every expert's end);
 *   32 experts at the model's widths (2048 / 768, top-8), 2,048 tokens: 16,384 rows, ~800 tiles of
 *     32 and 12 stages over the SMs (every ring slot refilled many times).
 * The same in CTA pairs (CLEF_CUDA_WGMMA_WS=2: pairs of m-tiles of one expert share each weight tile;
 * at every expert's end a pair of two experts loads its own, and a last odd m-tile runs beside a
 * row-less partner).  Also fails where the device runs wgmma but the backend does not pick the kernel. */
static void test_moe_wgmma_ws(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    static const char *const ref[] = {"CLEF_CUDA_WGMMA", "0", "CLEF_CUDA_TMA", "0", NULL},
                             *const pairs[] = {"CLEF_CUDA_WGMMA_WS", "2", NULL};
    const kernel_ab ab[2] = {
        {ref, ENV_DEFAULT, "persistent wgmma experts", "persistent wgmma kernel", "CLEF_CUDA_WGMMA=0"},
        {ref, pairs, "persistent wgmma experts (CTA pairs)", "persistent wgmma kernel in CTA pairs",
         "CLEF_CUDA_WGMMA=0"}};
    const int64_t Ts[2] = {4200, 16384}, Tw[1] = {2048};
    for (int i = 0; i < 2; i++) {
        kernel_repeats(f, &ab[i], 1, 8, 2, 320, 192, Ts, 2, 3);
        kernel_repeats(f, &ab[i], 1, 32, 8, 2048, 768, Tw, 1, 3);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),      cmocka_unit_test(test_matmul_model_shapes),
        cmocka_unit_test(test_matmul_f32_weight),
        cmocka_unit_test(test_gather_norms_elementwise), cmocka_unit_test(test_head_rows),
        cmocka_unit_test(test_rope), cmocka_unit_test(test_fused_row_ops),        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_then_product),
        cmocka_unit_test(test_router),      cmocka_unit_test(test_moe),   cmocka_unit_test(test_moe_tma), cmocka_unit_test(test_moe_add_rmsnorm), cmocka_unit_test(test_moe_tma_wide),
        cmocka_unit_test(test_moe_wgmma_ws),
        cmocka_unit_test(test_attention_bench),
    };
    /* CLEF_TEST_FILTER=test_moe_tma* runs only the matching tests (e.g. under compute-sanitizer) */
    const char *filter = getenv("CLEF_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, setup, teardown);
}
