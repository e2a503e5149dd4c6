/* cpu_tower.c — the media towers' ops on the CPU (backend.h "media tower
 * ops"): tanh GELU, the vision 2-D RoPE, the position table's weighted
 * 4-row gather, 3x3/stride-2 im2col and a batched transpose.  The formulas
 * are the ones the towers computed on the host before these ops existed
 * (model/vision.c, model/audio.c), term for term, so the tower goldens see
 * bitwise the same values. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

/* Parallelise only when there is enough work to pay for the threads. */
#define PAR_MIN 65536
/* Largest vision head (the real tower's is 72). */
#define ROPE2D_MAX_D 1024

int cpu_gelu_tanh(clef_backend *be, const float *x, float *y, int64_t n, clef_err *err) {
    cpu_ctx *c = cpu_of(be);
    const float beta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], cube = v * v * v;
        y[i] = 0.5f * v * (1.0f + tanhf(beta * (v + kappa * cube)));
    }
    return 0;
}

int cpu_rope_2d(clef_backend *be, float *x, int64_t N, int64_t stride, int64_t heads, int64_t d, const int32_t *pos,
                const float *inv_freq, clef_err *err) {
    cpu_ctx *c = cpu_of(be);
    if (d <= 0 || d % 4 || d > ROPE2D_MAX_D || heads < 0 || N < 0)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU rope_2d: head size %lld (a multiple of 4 up to %d)",
                         (long long)d, ROPE2D_MAX_D);
    const int64_t q = d / 4, h2 = d / 2;
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (N * heads * d > PAR_MIN)
    for (int64_t r = 0; r < N; r++) {
        float cs[ROPE2D_MAX_D / 2], sn[ROPE2D_MAX_D / 2];
        const float y = (float)pos[2 * r], xx = (float)pos[2 * r + 1];
        for (int64_t j = 0; j < q; j++) {
            float ay = y * inv_freq[j], ax = xx * inv_freq[j];
            cs[j] = cosf(ay), sn[j] = sinf(ay);
            cs[q + j] = cosf(ax), sn[q + j] = sinf(ax);
        }
        for (int64_t hd = 0; hd < heads; hd++) {
            float *v = x + r * stride + hd * d;
            for (int64_t i = 0; i < h2; i++) {
                float a = v[i], b = v[i + h2];
                v[i] = a * cs[i] + (-b) * sn[i];
                v[i + h2] = b * cs[i] + a * sn[i];
            }
        }
    }
    return 0;
}

int cpu_mix_rows(clef_backend *be, const float *table, int64_t dim, const int32_t *idx, const float *w, int64_t N,
                 float *out, clef_err *err) {
    cpu_ctx *c = cpu_of(be);
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (N * dim > PAR_MIN)
    for (int64_t r = 0; r < N; r++) {
        const int32_t *ix = idx + 4 * r;
        const float *wr = w + 4 * r;
        const float *t0 = table + (int64_t)ix[0] * dim, *t1 = table + (int64_t)ix[1] * dim;
        const float *t2 = table + (int64_t)ix[2] * dim, *t3 = table + (int64_t)ix[3] * dim;
        const float w0 = wr[0], w1 = wr[1], w2 = wr[2], w3 = wr[3];
        float *o = out + r * dim;
        for (int64_t k = 0; k < dim; k++) o[k] = t0[k] * w0 + t1[k] * w1 + t2[k] * w2 + t3[k] * w3;
    }
    return 0;
}

int cpu_im2col_3x3s2(clef_backend *be, const float *in, int64_t B, int64_t Fi, int64_t Ti, int64_t Ci, float *cols,
                     clef_err *err) {
    cpu_ctx *c = cpu_of(be);
    const int64_t Fo = (Fi + 1) / 2, To = (Ti + 1) / 2, rows = B * Fo * To;
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (rows * Ci * 9 > PAR_MIN)
    for (int64_t rr = 0; rr < rows; rr++) {
        const int64_t b = rr / (Fo * To), fo = rr / To % Fo, to = rr % To;
        const float *img = in + b * Fi * Ti * Ci;
        float *row = cols + rr * Ci * 9;
        for (int ky = 0; ky < 3; ky++)
            for (int kx = 0; kx < 3; kx++) {
                const int64_t fi = 2 * fo - 1 + ky, ti = 2 * to - 1 + kx;
                const int inside = fi >= 0 && fi < Fi && ti >= 0 && ti < Ti;
                for (int64_t ci = 0; ci < Ci; ci++)
                    row[ci * 9 + ky * 3 + kx] = inside ? img[(fi * Ti + ti) * Ci + ci] : 0.0f;
            }
    }
    return 0;
}

int cpu_transpose(clef_backend *be, const float *x, int64_t B, int64_t R, int64_t C, float *y, clef_err *err) {
    cpu_ctx *c = cpu_of(be);
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (B * R * C > PAR_MIN)
    for (int64_t bc = 0; bc < B * C; bc++) {
        const int64_t b = bc / C, cc = bc % C;
        const float *src = x + b * R * C + cc;
        float *dst = y + bc * R;
        for (int64_t r = 0; r < R; r++) dst[r] = src[r * C];
    }
    return 0;
}
