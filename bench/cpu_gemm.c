/* cpu_gemm.c — the CPU backend's GEMM (src/backend/cpu/cpu_gemm.h) against
 * OpenBLAS sgemm on the thinker's shapes, in one run, so the "ceiling" and
 * the kernel are measured under the same load (docs/BENCHMARKS.md).
 *
 *   build/cpu_gemm_bench [--threads N] [--reps R] [--tokens T] [--experts E] [--isa scalar|avx2|avx512]
 *                        [--moe-only] [--moe-formats bf16,int4,nvfp4,fp8]
 *
 * Shapes (T tokens, default 300; top-8 of 128 experts, so ~T/16 rows per expert):
 *   square   2048 x 2048 x 2048          OpenBLAS's ceiling on this machine (all threads)
 *   q_proj   T x 4096 x 2048             dense products of a layer
 *   o_proj   T x 2048 x 4096
 *   experts  E x (T/16 x 768 x 2048)     gate (or up) of one layer: one GEMM per expert (E = 128;
 *   down     E x (T/16 x 2048 x 768)     fewer keeps the weights in cache: the kernel without DRAM)
 * OpenBLAS runs each single GEMM on all threads (openblas_set_num_threads),
 * and the 128 expert GEMMs as an OpenMP loop of one-thread sgemms (the best
 * it can do for a grouped GEMM).  The backend runs every shape through its
 * matmul driver (cpu_mm_run) with f32 weights (the same bytes sgemm reads),
 * bf16 weights (what the model runs) and INT4 weights (G = 128).  Each
 * figure is the minimum over R repetitions (default 5), in GFLOP/s (2 M N K
 * per GEMM), from wall time, and per core-second from the process's CPU
 * time (what other work on the machine does not dilute; OpenBLAS's waiting
 * threads count against it as ours do).  Output: one "key value" line per
 * figure.
 *
 * Then one MoE layer through the backend's moe op (cpu_moe: tokens grouped
 * by expert, gate and up, SwiGLU, down, the ordered combine): T tokens of
 * width 2048 routed to 8 distinct experts each, uniformly at random over E
 * (default 128) experts of 768 x 2048 / 2048 x 768, BF16, INT4 (G = 128),
 * NVFP4 (compressed-tensors) and FP8 (128 x 128 blocks) weights (--moe-formats
 * picks some): moe_<fmt>_ms (minimum wall time over R), moe_<fmt>_gflops (2 T 8
 * 3 2048 768 multiply-adds per layer) and moe_<fmt>_cpu_ms (process CPU
 * time).  A full-preset forward runs 48 such layers.  --moe-only skips the
 * GEMM shapes.
 */
#include <cblas.h>
#undef I
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_internal.h"
#include "tensor/dtype.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of the whole process (every thread): a figure per core-second
 * that other work on the machine's cores does not dilute. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *rand_f32(size_t n, float scale) {
    float *p = NULL;
    if (posix_memalign((void **)&p, 64, n * sizeof *p)) abort();
    for (size_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}

/* The bf16 rounding of f (and f replaced by it, so f32 and bf16 runs multiply the same values). */
static uint16_t *to_bf16(float *f, size_t n) {
    uint16_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        h[i] = clef_f32_to_bf16(f[i]);
        f[i] = clef_bf16_to_f32(h[i]);
    }
    return h;
}

/* Symmetric INT4 auto_gptq layout of an [N, K] weight (random nibbles, f16 scales 1/64). */
typedef struct int4_w {
    uint32_t *q;
    uint16_t *s;
    clef_weight w;
} int4_w;

static void make_int4(int4_w *o, int64_t N, int64_t K) {
    const int64_t G = 128;
    o->q = malloc((size_t)(K / 8 * N) * sizeof *o->q);
    o->s = malloc((size_t)(K / G * N) * sizeof *o->s);
    for (int64_t i = 0; i < K / 8 * N; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        o->q[i] = (uint32_t)rng;
    }
    for (int64_t i = 0; i < K / G * N; i++) o->s[i] = 0x2400; /* 2^-6 */
    o->w = (clef_weight){.dtype = CLEF_DT_I32, .rows = N, .cols = K, .data = o->q,
                         .quant = {.type = CLEF_QT_INT4_GPTQ, .scale = o->s, .group = G}};
}

/* NVFP4 (compressed-tensors: global divisor) of an [N, K] weight: random
 * nibbles (every FP4 code), random finite E4M3 scales near 1, global 64. */
typedef struct nvfp4_w {
    uint8_t *q, *s;
    clef_weight w;
} nvfp4_w;

static void make_nvfp4(nvfp4_w *o, int64_t N, int64_t K) {
    o->q = malloc((size_t)(N * K / 2));
    o->s = malloc((size_t)(N * K / 16));
    for (int64_t i = 0; i < N * K / 2; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        o->q[i] = (uint8_t)rng;
    }
    for (int64_t i = 0; i < N * K / 16; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        o->s[i] = (uint8_t)(0x30 + rng % 16);
    }
    o->w = (clef_weight){.dtype = CLEF_DT_U8, .rows = N, .cols = K, .data = o->q,
                         .quant = {.type = CLEF_QT_NVFP4, .scale = o->s, .group = 16, .global = 64.0f, .global_div = 1}};
}

/* FP8 E4M3 with 128 x 128 f32 block scales (the published layout): random
 * non-NaN bytes, scales 2^-10. */
typedef struct fp8_w {
    uint8_t *q;
    float *s;
    clef_weight w;
} fp8_w;

static void make_fp8(fp8_w *o, int64_t N, int64_t K) {
    const int64_t B = 128, nbr = (N + B - 1) / B, nbc = (K + B - 1) / B;
    o->q = malloc((size_t)(N * K));
    o->s = malloc((size_t)(nbr * nbc) * sizeof *o->s);
    for (int64_t i = 0; i < N * K; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        o->q[i] = (uint8_t)rng;
        if ((o->q[i] & 0x7F) == 0x7F) o->q[i] = 0x7E;
    }
    for (int64_t i = 0; i < nbr * nbc; i++) o->s[i] = 0x1p-10f;
    o->w = (clef_weight){.dtype = CLEF_DT_F8_E4M3, .rows = N, .cols = K, .data = o->q,
                         .quant = {.type = CLEF_QT_FP8_BLOCK, .scale = o->s, .block_r = B, .block_c = B}};
}

/* One MoE layer (see the top of the file) in BF16, INT4, NVFP4 and FP8
 * (those whose bit is set in `fmts`: 1 bf16, 2 int4, 4 nvfp4, 8 fp8). */
static void bench_moe(clef_backend *be, int64_t T, int64_t E, int reps, unsigned fmts) {
    const int64_t H = 2048, NI = 768, k = 8;
    clef_err err;
    clef_err_clear(&err);
    if (E < k) E = k;
    float *x = rand_f32((size_t)(T * H), 1.0f), *y = rand_f32((size_t)(T * H), 0.0f);
    float *rw = rand_f32((size_t)(T * k), 0.1f);
    int32_t *idx = malloc((size_t)(T * k) * sizeof *idx);
    for (int64_t t = 0; t < T; t++)
        for (int64_t s = 0; s < k; s++) {
            int e, dup;
            do {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                e = (int)(rng % (uint64_t)E), dup = 0;
                for (int64_t q = 0; q < s; q++) dup |= idx[t * k + q] == e;
            } while (dup);
            idx[t * k + s] = e;
            rw[t * k + s] = fabsf(rw[t * k + s]) + 0.01f;
        }
    clef_weight *w = calloc((size_t)(3 * E), sizeof *w);
    uint16_t **h = calloc((size_t)(3 * E), sizeof *h);
    int4_w *q = calloc((size_t)(3 * E), sizeof *q);
    nvfp4_w *q4 = calloc((size_t)(3 * E), sizeof *q4);
    fp8_w *q8 = calloc((size_t)(3 * E), sizeof *q8);
    clef_weight *qw = calloc((size_t)(3 * E), sizeof *qw), *nw = calloc((size_t)(3 * E), sizeof *nw),
                *fw = calloc((size_t)(3 * E), sizeof *fw);
    for (int64_t i = 0; i < 3 * E; i++) {
        const int64_t N = i < 2 * E ? NI : H, K = i < 2 * E ? H : NI;
        if (fmts & 1) {
            float *f = rand_f32((size_t)(N * K), 0.05f);
            h[i] = to_bf16(f, (size_t)(N * K));
            free(f);
            be->ops->weight_init(be, &w[i], CLEF_DT_BF16, N, K, h[i], &err);
        }
        if (fmts & 2) make_int4(&q[i], N, K), qw[i] = q[i].w;
        if (fmts & 4) make_nvfp4(&q4[i], N, K), nw[i] = q4[i].w;
        if (fmts & 8) make_fp8(&q8[i], N, K), fw[i] = q8[i].w;
    }
    const clef_moe_weights mb = {.n_experts = E, .hidden = H, .inter = NI, .gate = w, .up = w + E, .down = w + 2 * E};
    const clef_moe_weights mq = {.n_experts = E, .hidden = H, .inter = NI, .gate = qw, .up = qw + E, .down = qw + 2 * E};
    const clef_moe_weights mn = {.n_experts = E, .hidden = H, .inter = NI, .gate = nw, .up = nw + E, .down = nw + 2 * E};
    const clef_moe_weights mf = {.n_experts = E, .hidden = H, .inter = NI, .gate = fw, .up = fw + E, .down = fw + 2 * E};
    const double flops = 2.0 * (double)T * (double)k * 3.0 * (double)H * (double)NI;
    const struct {
        const char *name;
        const clef_moe_weights *m;
    } runs[] = {{"bf16", &mb}, {"int4", &mq}, {"nvfp4", &mn}, {"fp8", &mf}};
    printf("moe_tokens %lld\nmoe_experts %lld\n", (long long)T, (long long)E);
    for (int ri = 0; ri < 4; ri++) {
        if (!(fmts & (1u << ri))) continue;
        double best = 1e30, cbest = 1e30;
        for (int r = 0; r <= reps; r++) { /* r == 0 warms up */
            const double c0 = cpu_s(), t0 = now_s();
            if (be->ops->moe(be, x, T, idx, rw, k, runs[ri].m, y, &err) != 0) fprintf(stderr, "%s\n", err.message);
            const double t1 = now_s(), c1 = cpu_s();
            if (r == 0) continue;
            if (t1 - t0 < best) best = t1 - t0;
            if (c1 - c0 < cbest) cbest = c1 - c0;
        }
        printf("moe_%s_ms %.1f\nmoe_%s_gflops %.1f\nmoe_%s_cpu_ms %.1f\n", runs[ri].name, best * 1e3, runs[ri].name,
               flops / best * 1e-9, runs[ri].name, cbest * 1e3);
        fflush(stdout);
    }
    for (int64_t i = 0; i < 3 * E; i++)
        free(h[i]), free(q[i].q), free(q[i].s), free(q4[i].q), free(q4[i].s), free(q8[i].q), free(q8[i].s);
    free(h), free(q), free(qw), free(q4), free(nw), free(q8), free(fw), free(w), free(x), free(y), free(rw), free(idx);
}

typedef struct shape {
    const char *name;
    int64_t M, N, K, batch;
} shape;

int main(int argc, char **argv) {
    int threads = omp_get_max_threads(), reps = 5, moe_only = 0;
    unsigned fmts = 15;
    int64_t T = 300, E = 128;
    const char *isa_name = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) isa_name = argv[++i];
        else if (!strcmp(argv[i], "--experts") && i + 1 < argc) E = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--moe-only")) moe_only = 1;
        else if (!strcmp(argv[i], "--moe-formats") && i + 1 < argc) {
            const char *names[] = {"bf16", "int4", "nvfp4", "fp8"};
            fmts = 0;
            for (int f = 0; f < 4; f++)
                if (strstr(argv[i + 1], names[f])) fmts |= 1u << f;
            i++;
        } else {
            fprintf(stderr, "usage: cpu_gemm_bench [--threads N] [--reps R] [--tokens T] [--experts E] [--isa scalar|avx2|avx512] [--moe-only] [--moe-formats bf16,int4,nvfp4,fp8]\n");
            return 2;
        }
    }
    clef_err err;
    clef_err_clear(&err);
    clef_backend *be = clef_backend_cpu_create(threads, &err);
    if (!be) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    cpu_ctx *c = cpu_of(be);
    if (isa_name) {
        cpu_isa isa = cpu_isa_parse(isa_name);
        if (isa == CPU_ISA_COUNT || !cpu_isa_supported(isa)) {
            fprintf(stderr, "isa %s: unknown or not supported here\n", isa_name);
            return 2;
        }
        c->isa = isa;
    }
    const int64_t me = (T * 8 + 127) / 128; /* rows per expert, evenly routed */
    const shape shapes[] = {{"square", 2048, 2048, 2048, 1}, {"q_proj", T, 4096, 2048, 1}, {"o_proj", T, 2048, 4096, 1},
                            {"experts", me, 768, 2048, E},    {"down", me, 2048, 768, E}};
    printf("openblas_core %s\n", openblas_get_corename());
    printf("threads %d\nisa %s\ntokens %lld\nrows_per_expert %lld\nexperts %lld\nreps %d\n", threads,
           cpu_isa_name(c->isa), (long long)T, (long long)me, (long long)E, reps);
    for (size_t si = 0; !moe_only && si < sizeof shapes / sizeof *shapes; si++) {
        const shape *s = &shapes[si];
        const int64_t B = s->batch, M = s->M, N = s->N, K = s->K;
        const double flops = 2.0 * (double)M * (double)N * (double)K * (double)B;
        float *A = rand_f32((size_t)(B * M * K), 1.0f), *W = rand_f32((size_t)(B * N * K), 0.05f);
        float *C = rand_f32((size_t)(B * M * N), 0.0f);
        uint16_t *Wh = to_bf16(W, (size_t)(B * N * K));
        int4_w *q4 = calloc((size_t)B, sizeof *q4);
        for (int64_t b = 0; b < B; b++) make_int4(&q4[b], N, K);
        clef_weight *wf = calloc((size_t)B, sizeof *wf), *wh = calloc((size_t)B, sizeof *wh);
        cpu_mm_job *jf = calloc((size_t)B, sizeof *jf), *jh = calloc((size_t)B, sizeof *jh),
                   *j4 = calloc((size_t)B, sizeof *j4);
        for (int64_t b = 0; b < B; b++) {
            be->ops->weight_init(be, &wf[b], CLEF_DT_F32, N, K, W + b * N * K, &err);
            be->ops->weight_init(be, &wh[b], CLEF_DT_BF16, N, K, Wh + b * N * K, &err);
            jf[b] = (cpu_mm_job){A + b * M * K, M, &wf[b], NULL, C + b * M * N, N};
            jh[b] = (cpu_mm_job){A + b * M * K, M, &wh[b], NULL, C + b * M * N, N};
            j4[b] = (cpu_mm_job){A + b * M * K, M, &q4[b].w, NULL, C + b * M * N, N};
        }
        double best[4] = {1e30, 1e30, 1e30, 1e30}, cbest[4] = {1e30, 1e30, 1e30, 1e30};
        for (int r = 0; r <= reps; r++) { /* r == 0 warms up */
            double c0 = cpu_s(), t0 = now_s();
            if (B == 1) {
                openblas_set_num_threads(threads);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, A, (int)K, W,
                            (int)K, 0.0f, C, (int)N);
            } else {
                openblas_set_num_threads(1);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
                for (int64_t b = 0; b < B; b++)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, A + b * M * K,
                                (int)K, W + b * N * K, (int)K, 0.0f, C + b * M * N, (int)N);
            }
            double t1 = now_s(), c1 = cpu_s();
            if (cpu_mm_run(c, jf, B, &err) != 0) fprintf(stderr, "%s\n", err.message);
            double t2 = now_s(), c2 = cpu_s();
            if (cpu_mm_run(c, jh, B, &err) != 0) fprintf(stderr, "%s\n", err.message);
            double t3 = now_s(), c3 = cpu_s();
            if (cpu_mm_run(c, j4, B, &err) != 0) fprintf(stderr, "%s\n", err.message);
            double t4 = now_s(), c4 = cpu_s();
            if (r == 0) continue;
            const double d[4] = {t1 - t0, t2 - t1, t3 - t2, t4 - t3}, cd[4] = {c1 - c0, c2 - c1, c3 - c2, c4 - c3};
            for (int i = 0; i < 4; i++) {
                if (d[i] < best[i]) best[i] = d[i];
                if (cd[i] < cbest[i]) cbest[i] = cd[i];
            }
        }
        char label[64];
        snprintf(label, sizeof label, "%s_%lldx%lldx%lld%s", s->name, (long long)M, (long long)N, (long long)K,
                 B > 1 ? "_xE" : "");
        printf("%s_sgemm_gflops %.1f\n", label, flops / best[0] * 1e-9);
        printf("%s_clef_f32_gflops %.1f\n", label, flops / best[1] * 1e-9);
        printf("%s_clef_bf16_gflops %.1f\n", label, flops / best[2] * 1e-9);
        printf("%s_clef_int4_gflops %.1f\n", label, flops / best[3] * 1e-9);
        printf("%s_clef_bf16_pct_of_sgemm %.1f\n", label, 100.0 * best[0] / best[2]);
        printf("%s_per_core_gflops sgemm %.1f clef_f32 %.1f clef_bf16 %.1f clef_int4 %.1f\n", label,
               flops / cbest[0] * 1e-9, flops / cbest[1] * 1e-9, flops / cbest[2] * 1e-9, flops / cbest[3] * 1e-9);
        fflush(stdout);
        for (int64_t b = 0; b < B; b++) free(q4[b].q), free(q4[b].s);
        free(q4), free(wf), free(wh), free(jf), free(jh), free(j4), free(A), free(W), free(C), free(Wh);
    }
    bench_moe(be, T, E, reps, fmts);
    be->ops->destroy(be);
    return 0;
}
