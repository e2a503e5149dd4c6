/* cpu_elementwise.c — norms, activations, adds and the head's small row ops. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

/* Parallelise only when there is enough work to pay for the threads. */
#define PAR_MIN 65536

void cpu_rmsnorm_row(const float *xr, const float *w, float *yr, int64_t dim, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
    float var = (float)(ss / (double)dim);
    float inv = 1.0f / sqrtf(var + eps);
    for (int64_t i = 0; i < dim; i++) yr[i] = w[i] * (xr[i] * inv);
}

int cpu_rmsnorm(clef_backend *be, const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps,
                clef_err *err) {
    cpu_ctx *c = cpu_of(be);
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (rows * dim > PAR_MIN)
    for (int64_t r = 0; r < rows; r++) cpu_rmsnorm_row(x + r * dim, w, y + r * dim, dim, eps);
    return 0;
}

/* The add then the norm, row by row (a row's add is done before its norm
 * reads it, as in add followed by rmsnorm over all rows). */
int cpu_add_rmsnorm(clef_backend *be, float *h, const float *o, const float *w, float *y, int64_t rows, int64_t dim,
                    float eps, clef_err *err) {
    cpu_ctx *c = cpu_of(be);
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (rows * dim > PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float *hr = h + r * dim;
        if (o)
            for (int64_t i = 0; i < dim; i++) hr[i] = hr[i] + o[r * dim + i];
        cpu_rmsnorm_row(hr, w, y + r * dim, dim, eps);
    }
    return 0;
}

int cpu_layernorm(clef_backend *be, const float *x, const float *w, const float *b, float *y, int64_t rows,
                  int64_t dim, float eps, clef_err *err) {
    cpu_ctx *c = cpu_of(be);
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (rows * dim > PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        double s = 0.0, ss = 0.0;
        for (int64_t i = 0; i < dim; i++) s += xr[i];
        double mean = s / (double)dim;
        for (int64_t i = 0; i < dim; i++) ss += ((double)xr[i] - mean) * ((double)xr[i] - mean);
        float fmean = (float)mean;
        float rstd = 1.0f / sqrtf((float)(ss / (double)dim) + eps);
        for (int64_t i = 0; i < dim; i++) yr[i] = (xr[i] - fmean) * rstd * w[i] + b[i];
    }
    return 0;
}

int cpu_swiglu(clef_backend *be, const float *gate, const float *up, float *out, int64_t n, clef_err *err) {
    cpu_ctx *c = cpu_of(be);
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float z = gate[i];
        out[i] = z / (1.0f + expf(-z)) * up[i];
    }
    return 0;
}

int cpu_add(clef_backend *be, const float *a, const float *b, float *y, int64_t rows, int64_t dim, int64_t b_stride,
            clef_err *err) {
    cpu_ctx *c = cpu_of(be);
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (rows * dim > PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *ar = a + r * dim, *br = b + r * b_stride;
        float *yr = y + r * dim;
        for (int64_t i = 0; i < dim; i++) yr[i] = ar[i] + br[i];
    }
    return 0;
}

int cpu_gelu(clef_backend *be, const float *x, float *y, int64_t n, clef_err *err) {
    cpu_ctx *c = cpu_of(be);
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * 0.5f * (1.0f + erff(x[i] * (float)M_SQRT1_2));
    return 0;
}

int cpu_span_mean(clef_backend *be, const float *x, int64_t dim, const clef_row_span *spans, int64_t n, float *out,
                  clef_err *err) {
    for (int64_t i = 0; i < n; i++)
        if (spans[i].end <= spans[i].start || spans[i].start < 0)
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU span_mean: span %lld is [%lld,%lld)", (long long)i,
                             (long long)spans[i].start, (long long)spans[i].end);
    for (int64_t i = 0; i < n; i++) {
        float *o = out + i * dim;
        for (int64_t d = 0; d < dim; d++) o[d] = 0.0f;
        for (int64_t r = spans[i].start; r < spans[i].end; r++) {
            const float *xr = x + r * dim;
            for (int64_t d = 0; d < dim; d++) o[d] += xr[d];
        }
        float cnt = (float)(spans[i].end - spans[i].start);
        for (int64_t d = 0; d < dim; d++) o[d] /= cnt;
    }
    return 0;
}

int cpu_pair_features(clef_backend *be, const float *F, const int32_t *f_rows, const float *o, int64_t n,
                      int64_t dim, float *out, clef_err *err) {
    for (int64_t i = 0; i < n; i++) {
        const float *f = F + (int64_t)f_rows[i] * dim, *oi = o + i * dim;
        float *r = out + i * 4 * dim;
        for (int64_t d = 0; d < dim; d++) {
            r[d] = f[d];
            r[dim + d] = oi[d];
            r[2 * dim + d] = f[d] * oi[d];
            r[3 * dim + d] = fabsf(f[d] - oi[d]);
        }
    }
    return 0;
}

/* |v| clamped below at eps, norm accumulated in double. */
static float norm_clamped(const float *v, int64_t dim, float eps) {
    double ss = 0.0;
    for (int64_t d = 0; d < dim; d++) ss += (double)v[d] * v[d];
    float nrm = (float)sqrt(ss);
    return nrm > eps ? nrm : eps;
}

int cpu_cosine(clef_backend *be, const float *a, const int32_t *a_rows, const float *b, int64_t n, int64_t dim,
               float eps, float *out, clef_err *err) {
    for (int64_t i = 0; i < n; i++) {
        const float *ar = a + (a_rows ? (int64_t)a_rows[i] : i) * dim, *br = b + i * dim;
        float na = norm_clamped(ar, dim, eps), nb = norm_clamped(br, dim, eps);
        double dot = 0.0;
        for (int64_t d = 0; d < dim; d++) dot += (double)(ar[d] / na) * (double)(br[d] / nb);
        out[i] = (float)dot;
    }
    return 0;
}
