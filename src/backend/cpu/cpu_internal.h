/* cpu_internal.h — state and helpers shared by the CPU backend's files. */
#ifndef CLEF_BACKEND_CPU_INTERNAL_H
#define CLEF_BACKEND_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_gemm.h"

/* Scratch slots kept by the backend and grown on demand (no per-op malloc in
 * steady state).  Each op owns its slots; ops never run concurrently on one
 * backend. */
enum cpu_slot {
    CPU_SLOT_MM_ITEMS,  /* matmul work items */
    CPU_SLOT_MOE,       /* permuted rows and expert intermediates */
    CPU_SLOT_MOE_INDEX, /* per-expert counts, offsets, slot positions */
    CPU_SLOT_ATTN,      /* attention work items */
    CPU_SLOT_MOE_OUT,   /* moe_add_rmsnorm: the MoE rows before the add */
    CPU_SLOT_COUNT
};

typedef struct cpu_ctx {
    int n_threads;
    cpu_isa isa;           /* GEMM kernels (cpu_gemm.h): the best this processor runs, set at create */
    float **thread_buf;    /* [n_threads] per-thread scratch */
    size_t thread_floats;  /* capacity of each thread_buf, floats */
    void *slot[CPU_SLOT_COUNT];
    size_t slot_bytes[CPU_SLOT_COUNT];
} cpu_ctx;

static inline cpu_ctx *cpu_of(clef_backend *be) { return (cpu_ctx *)be->ctx; }

/* Slot `s` with at least `bytes` bytes (contents not kept on growth), or
 * NULL + err (422 "too many tokens"). */
void *cpu_slot(cpu_ctx *c, int s, size_t bytes, clef_err *err);
/* Make every thread's buffer hold at least `floats` floats. */
int cpu_thread_scratch(cpu_ctx *c, size_t floats, clef_err *err);

/* Most column panels one matmul work item covers (consecutive panels let
 * the GEMM prefetch the next one's weight rows while it works on one). */
#define CPU_MM_PANELS_MAX 8
/* Most rows of A one matmul work item multiplies (a larger product is cut
 * into row chunks; where the cut falls never changes a value). */
#define CPU_MM_ROWS_MAX 512
/* Fewest rows a chunk is cut to when a product has too few panels to keep
 * every thread busy. */
#define CPU_MM_ROWS_MIN 32

/* One product y[T, w.rows] (+bias) = x[T, w.cols] . W^T for the batched
 * matmul driver; y rows are `ldy` floats apart. */
typedef struct cpu_mm_job {
    const float *x;
    int64_t T;
    const clef_weight *w;
    const float *bias;
    float *y;
    int64_t ldy;
} cpu_mm_job;

/* Run `n` products in parallel over (job, column panel, row chunk), the
 * largest items first: every output element is cpu_gemm_cols's chain, so
 * the split (which depends on the thread count and the other jobs) never
 * changes a value. */
int cpu_mm_run(cpu_ctx *c, const cpu_mm_job *jobs, int64_t n, clef_err *err);

/* Whether the CPU backend can multiply by this weight dtype. */
int cpu_weight_dtype_ok(clef_dtype t);
/* Convert rows [r0, r1) of w to f32 at dst ([r1-r0, w.cols]). */
void cpu_weight_rows_f32(const clef_weight *w, int64_t r0, int64_t r1, float *dst);

int cpu_matmul(clef_backend *be, const float *x, int64_t T, const clef_weight *w, const float *bias, float *y,
               clef_err *err);
int cpu_gather(clef_backend *be, const clef_weight *table, const int32_t *ids, int64_t n, float *out, clef_err *err);
int cpu_router_topk(clef_backend *be, const float *logits, int64_t T, int64_t E, int64_t k, int norm, int32_t *idx,
                    float *w, clef_err *err);
int cpu_moe(clef_backend *be, const float *x, int64_t T, const int32_t *idx, const float *w, int64_t k,
            const clef_moe_weights *experts, float *y, clef_err *err);

/* v[u] = e^v[u] for 8 lanes with v <= 0 (below -87 clamped to -87; NaN gives
 * e^-87), ~1 ulp, vectorised; the softmax exp of attention. */
void cpu_exp8(float *v);

int cpu_rope(clef_backend *be, float *x, int64_t T, int64_t heads, const int32_t *pos, const clef_rope_desc *rope,
             clef_err *err);
int cpu_attention(clef_backend *be, const float *q, const float *k, const float *v, float *out,
                  const clef_attn_desc *a, clef_err *err);

int cpu_rmsnorm(clef_backend *be, const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps,
                clef_err *err);
/* One row of cpu_rmsnorm: yr[i] = w[i] * (xr[i] * rsqrt(mean(xr^2) + eps)),
 * sum of squares in f64 in index order; yr may equal xr.  Shared by the
 * fused ops so their rows are bitwise the plain op's. */
void cpu_rmsnorm_row(const float *xr, const float *w, float *yr, int64_t dim, float eps);
int cpu_add_rmsnorm(clef_backend *be, float *h, const float *o, const float *w, float *y, int64_t rows, int64_t dim,
                    float eps, clef_err *err);
int cpu_qk_norm_rope(clef_backend *be, float *q, int64_t q_stride, float *k, int64_t k_stride, int64_t T, int64_t nq,
                     int64_t nk, const float *q_w, const float *k_w, float eps, const int32_t *pos,
                     const clef_rope_desc *r, clef_err *err);
int cpu_layernorm(clef_backend *be, const float *x, const float *w, const float *b, float *y, int64_t rows,
                  int64_t dim, float eps, clef_err *err);
int cpu_swiglu(clef_backend *be, const float *gate, const float *up, float *out, int64_t n, clef_err *err);
int cpu_add(clef_backend *be, const float *a, const float *b, float *y, int64_t rows, int64_t dim, int64_t b_stride,
            clef_err *err);
int cpu_gelu(clef_backend *be, const float *x, float *y, int64_t n, clef_err *err);
int cpu_span_mean(clef_backend *be, const float *x, int64_t dim, const clef_row_span *spans, int64_t n, float *out,
                  clef_err *err);
int cpu_pair_features(clef_backend *be, const float *F, const int32_t *f_rows, const float *o, int64_t n,
                      int64_t dim, float *out, clef_err *err);
int cpu_cosine(clef_backend *be, const float *a, const int32_t *a_rows, const float *b, int64_t n, int64_t dim,
               float eps, float *out, clef_err *err);

/* media tower ops (cpu_tower.c; contracts in backend.h) */
int cpu_gelu_tanh(clef_backend *be, const float *x, float *y, int64_t n, clef_err *err);
int cpu_rope_2d(clef_backend *be, float *x, int64_t N, int64_t stride, int64_t heads, int64_t d, const int32_t *pos,
                const float *inv_freq, clef_err *err);
int cpu_mix_rows(clef_backend *be, const float *table, int64_t dim, const int32_t *idx, const float *w, int64_t N,
                 float *out, clef_err *err);
int cpu_im2col_3x3s2(clef_backend *be, const float *in, int64_t B, int64_t Fi, int64_t Ti, int64_t Ci, float *cols,
                     clef_err *err);
int cpu_transpose(clef_backend *be, const float *x, int64_t B, int64_t R, int64_t C, float *y, clef_err *err);

#endif
