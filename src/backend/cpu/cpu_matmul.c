/* cpu_matmul.c — weight products on the CPU: the batched matmul driver
 * (column panels x row chunks of every product on the OpenMP threads, each
 * range by cpu_gemm_cols: the weight decoded a tile at a time, once per
 * item, never per token), embedding gather, router top-k and the grouped
 * MoE expert block. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

int cpu_weight_dtype_ok(clef_dtype t) { return t == CLEF_DT_BF16 || t == CLEF_DT_F16 || t == CLEF_DT_F32; }

void cpu_weight_rows_f32(const clef_weight *w, int64_t r0, int64_t r1, float *dst) {
    if (w->quant.type != CLEF_QT_NONE) { /* packed: dequantize just these rows */
        const clef_qweight q = {.dtype = w->dtype, .rows = w->rows, .cols = w->cols, .data = w->data, .quant = w->quant};
        clef_qweight_rows_f32(&q, r0, r1, dst);
        return;
    }
    size_t n = (size_t)(r1 - r0) * (size_t)w->cols;
    size_t off = (size_t)r0 * (size_t)w->cols;
    if (w->dtype == CLEF_DT_BF16 && ((uintptr_t)w->data & 1) == 0) {
        const uint16_t *src = (const uint16_t *)w->data + off;
        for (size_t i = 0; i < n; i++) dst[i] = clef_bf16_to_f32(src[i]);
    } else {
        clef_to_f32(w->dtype, (const char *)w->data + off * clef_dtype_size(w->dtype), dst, n);
    }
}

/* One unit of parallel work: output columns [n0, n1) of job `job` (whole
 * panels but the weight's last) for its rows [m0, m1). */
typedef struct mm_item {
    int64_t job;
    int64_t n0, n1;
    int64_t m0, m1;
    double cost; /* multiply-adds, for the largest-first order */
} mm_item;

/* Largest items first (ties: job, then column, then row order), so the
 * dynamic schedule does not end on one big expert. */
static int item_cmp(const void *pa, const void *pb) {
    const mm_item *a = pa, *b = pb;
    if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1;
    if (a->job != b->job) return a->job < b->job ? -1 : 1;
    if (a->n0 != b->n0) return a->n0 < b->n0 ? -1 : 1;
    return a->m0 < b->m0 ? -1 : a->m0 > b->m0;
}

/* Row chunk of a job when the run has `col_items` column ranges in all:
 * whole (up to CPU_MM_ROWS_MAX rows) when there are enough for 4 items per
 * thread, else cut so there are. */
static int64_t rows_per_item(int64_t T, int64_t col_items, int n_threads) {
    int64_t chunks = (T + CPU_MM_ROWS_MAX - 1) / CPU_MM_ROWS_MAX;
    const int64_t want = 4 * (int64_t)n_threads;
    if (col_items * chunks < want) {
        int64_t more = (want + col_items - 1) / col_items, cap = T / CPU_MM_ROWS_MIN;
        if (more > cap) more = cap;
        if (more > chunks) chunks = more;
    }
    if (chunks < 1) chunks = 1;
    return (T + chunks - 1) / chunks;
}

/* Column ranges of a weight of `panels` panels at `per` panels each (the
 * ranges as even as whole panels allow). */
static int64_t col_ranges(int64_t panels, int64_t per) { return (panels + per - 1) / per; }

int cpu_mm_run(cpu_ctx *c, const cpu_mm_job *jobs, int64_t n, clef_err *err) {
    const int64_t NR = cpu_gemm_nr(c->isa);
    int64_t total_panels = 0;
    double work = 0; /* multiply-adds: below ~1e5 threads cost more than they save */
    for (int64_t i = 0; i < n; i++) {
        const cpu_mm_job *j = &jobs[i];
        if (j->w->quant.type == CLEF_QT_NONE && !cpu_weight_dtype_ok(j->w->dtype))
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU matmul: weight dtype %s is not supported",
                             clef_dtype_name(j->w->dtype));
        if (j->w->quant.type == CLEF_QT_INT4_GPTQ && j->w->cols % 8)
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU matmul: INT4 weight of width %lld",
                             (long long)j->w->cols);
        if (j->T <= 0 || j->w->rows <= 0) continue;
        total_panels += (j->w->rows + NR - 1) / NR;
        work += (double)j->T * (double)j->w->rows * (double)j->w->cols;
    }
    if (total_panels == 0) return 0;
    /* panels per item: up to CPU_MM_PANELS_MAX while there are 4 per thread */
    int64_t per = total_panels / (4 * (int64_t)c->n_threads);
    per = per < 1 ? 1 : per > CPU_MM_PANELS_MAX ? CPU_MM_PANELS_MAX : per;
    int64_t col_items = 0, n_items = 0;
    for (int64_t i = 0; i < n; i++)
        if (jobs[i].T > 0 && jobs[i].w->rows > 0) col_items += col_ranges((jobs[i].w->rows + NR - 1) / NR, per);
    for (int64_t i = 0; i < n; i++) {
        const cpu_mm_job *j = &jobs[i];
        if (j->T <= 0 || j->w->rows <= 0) continue;
        const int64_t rc = rows_per_item(j->T, col_items, c->n_threads);
        n_items += col_ranges((j->w->rows + NR - 1) / NR, per) * ((j->T + rc - 1) / rc);
    }
    if (cpu_thread_scratch(c, cpu_gemm_scratch_floats(c->isa), err) != 0) return -1;
    mm_item *items = cpu_slot(c, CPU_SLOT_MM_ITEMS, (size_t)n_items * sizeof *items, err);
    if (!items) return -1;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        const cpu_mm_job *j = &jobs[i];
        if (j->T <= 0 || j->w->rows <= 0) continue;
        const int64_t rc = rows_per_item(j->T, col_items, c->n_threads), panels = (j->w->rows + NR - 1) / NR,
                      nc = col_ranges(panels, per);
        for (int64_t q = 0; q < nc; q++) {
            const int64_t n0 = q * panels / nc * NR, n1 = (q + 1) * panels / nc * NR;
            for (int64_t m0 = 0; m0 < j->T; m0 += rc) {
                const int64_t m1 = m0 + rc < j->T ? m0 + rc : j->T;
                const int64_t cols = (n1 < j->w->rows ? n1 : j->w->rows) - n0;
                items[m++] = (mm_item){i, n0, n1, m0, m1, (double)(m1 - m0) * (double)cols * (double)j->w->cols};
            }
        }
    }
    qsort(items, (size_t)n_items, sizeof *items, item_cmp);
    const cpu_isa isa = c->isa;
#pragma omp parallel for schedule(dynamic, 1) num_threads(c->n_threads) if (work > 1e5 && n_items > 1)
    for (int64_t i = 0; i < n_items; i++) {
        const mm_item *it = &items[i];
        const cpu_mm_job *j = &jobs[it->job];
        const int64_t K = j->w->cols;
        const cpu_gemm_b b = {.kind = CPU_B_WEIGHT, .w = j->w, .N = j->w->rows, .K = K};
        cpu_gemm_cols(isa, j->x + it->m0 * K, K, it->m1 - it->m0, &b, it->n0, it->n1, j->bias, j->y + it->m0 * j->ldy,
                      j->ldy, c->thread_buf[omp_get_thread_num()]);
    }
    return 0;
}

int cpu_matmul(clef_backend *be, const float *x, int64_t T, const clef_weight *w, const float *bias, float *y,
               clef_err *err) {
    cpu_mm_job j = {.x = x, .T = T, .w = w, .bias = bias, .y = y, .ldy = w->rows};
    return cpu_mm_run(cpu_of(be), &j, 1, err);
}

int cpu_gather(clef_backend *be, const clef_weight *table, const int32_t *ids, int64_t n, float *out,
               clef_err *err) {
    cpu_ctx *c = cpu_of(be);
    if (table->quant.type == CLEF_QT_NONE && !cpu_weight_dtype_ok(table->dtype))
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU gather: dtype %s is not supported",
                         clef_dtype_name(table->dtype));
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= table->rows)
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU gather: row %d outside [0,%lld)", (int)ids[i],
                             (long long)table->rows);
    const int64_t D = table->cols;
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (n * D > 65536)
    for (int64_t i = 0; i < n; i++) cpu_weight_rows_f32(table, ids[i], ids[i] + 1, out + i * D);
    return 0;
}

/* Top-k of one token's router probabilities. */
static void router_row(const float *l, int64_t E, int64_t k, int norm, float *p, int32_t *idx, float *w) {
    float mx = l[0];
    for (int64_t e = 1; e < E; e++)
        if (l[e] > mx) mx = l[e];
    double sum = 0.0;
    for (int64_t e = 0; e < E; e++) {
        p[e] = expf(l[e] - mx);
        sum += p[e];
    }
    float fsum = (float)sum;
    for (int64_t e = 0; e < E; e++) p[e] = p[e] / fsum;
    for (int64_t s = 0; s < k; s++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            if (p[e] < 0) continue; /* already taken */
            if (best < 0 || p[e] > p[best]) best = e;
        }
        idx[s] = (int32_t)best;
        w[s] = p[best];
        p[best] = -1.0f;
    }
    if (norm) {
        float ws = 0.0f;
        for (int64_t s = 0; s < k; s++) ws += w[s];
        for (int64_t s = 0; s < k; s++) w[s] = w[s] / ws;
    }
}

int cpu_router_topk(clef_backend *be, const float *logits, int64_t T, int64_t E, int64_t k, int norm, int32_t *idx,
                    float *w, clef_err *err) {
    cpu_ctx *c = cpu_of(be);
    if (E <= 0 || k <= 0 || k > E)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU router: top-%lld of %lld experts", (long long)k,
                         (long long)E);
    if (cpu_thread_scratch(c, (size_t)E, err) != 0) return -1;
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (T * E > 16384)
    for (int64_t t = 0; t < T; t++)
        router_row(logits + t * E, E, k, norm, c->thread_buf[omp_get_thread_num()], idx + t * k, w + t * k);
    return 0;
}

/* ---- grouped MoE ---- */

/* Sum of one token's expert outputs in ascending expert order, each scaled by
 * its routing weight (the reference's index_add_ loop over experts). */
static void moe_combine_row(int64_t t, int64_t k, int64_t H, const int32_t *idx, const float *w,
                            const int64_t *slot_pos, const float *yp, float *y) {
    int64_t order[64];
    for (int64_t s = 0; s < k; s++) {
        int64_t j = s;
        while (j > 0 && idx[t * k + order[j - 1]] > idx[t * k + s]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = s;
    }
    float *yr = y + t * H;
    for (int64_t i = 0; i < k; i++) {
        int64_t s = order[i];
        const float *er = yp + slot_pos[t * k + s] * H;
        float ws = w[t * k + s];
        if (i == 0)
            for (int64_t h = 0; h < H; h++) yr[h] = er[h] * ws;
        else
            for (int64_t h = 0; h < H; h++) yr[h] += er[h] * ws;
    }
}

int cpu_moe(clef_backend *be, const float *x, int64_t T, const int32_t *idx, const float *w, int64_t k,
            const clef_moe_weights *ex, float *y, clef_err *err) {
    cpu_ctx *c = cpu_of(be);
    const int64_t E = ex->n_experts, H = ex->hidden, NI = ex->inter, TK = T * k;
    if (T <= 0) return 0;
    if (k <= 0 || k > 64 || k > E)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU moe: %lld experts per token", (long long)k);
    for (int64_t i = 0; i < TK; i++)
        if (idx[i] < 0 || idx[i] >= E)
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU moe: expert %d outside [0,%lld)", (int)idx[i],
                             (long long)E);
    /* index slot: cnt[E] off[E+1] fill[E] slot_pos[TK] row_tok[TK], then jobs[2E] */
    size_t n_idx = (size_t)(3 * E + 1 + 2 * TK);
    char *ib = cpu_slot(c, CPU_SLOT_MOE_INDEX, n_idx * sizeof(int64_t) + (size_t)(2 * E) * sizeof(cpu_mm_job), err);
    if (!ib) return -1;
    int64_t *cnt = (int64_t *)ib, *off = cnt + E, *fill = off + E + 1, *slot_pos = fill + E, *row_tok = slot_pos + TK;
    cpu_mm_job *jobs = (cpu_mm_job *)(ib + n_idx * sizeof(int64_t));
    float *xp = cpu_slot(c, CPU_SLOT_MOE, (size_t)TK * (size_t)(2 * H + 2 * NI) * sizeof(float), err);
    if (!xp) return -1;
    float *g = xp + TK * H, *u = g + TK * NI, *yp = u + TK * NI;

    /* Permute token rows by expert, keeping token order within an expert. */
    memset(cnt, 0, (size_t)E * sizeof *cnt);
    for (int64_t i = 0; i < TK; i++) cnt[idx[i]]++;
    off[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        off[e + 1] = off[e] + cnt[e];
        fill[e] = 0;
    }
    for (int64_t i = 0; i < TK; i++) {
        int64_t e = idx[i], pos = off[e] + fill[e]++;
        slot_pos[i] = pos;
        row_tok[pos] = i / k;
    }
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (TK * H > 65536)
    for (int64_t p = 0; p < TK; p++) memcpy(xp + p * H, x + row_tok[p] * H, (size_t)H * sizeof(float));

    /* gate and up of every expert that has tokens */
    int64_t nj = 0;
    for (int64_t e = 0; e < E; e++) {
        if (!cnt[e]) continue;
        jobs[nj++] = (cpu_mm_job){xp + off[e] * H, cnt[e], &ex->gate[e], NULL, g + off[e] * NI, NI};
        jobs[nj++] = (cpu_mm_job){xp + off[e] * H, cnt[e], &ex->up[e], NULL, u + off[e] * NI, NI};
    }
    if (cpu_mm_run(c, jobs, nj, err) != 0) return -1;
    if (cpu_swiglu(be, g, u, g, TK * NI, err) != 0) return -1;
    nj = 0;
    for (int64_t e = 0; e < E; e++) {
        if (!cnt[e]) continue;
        jobs[nj++] = (cpu_mm_job){g + off[e] * NI, cnt[e], &ex->down[e], NULL, yp + off[e] * H, H};
    }
    if (cpu_mm_run(c, jobs, nj, err) != 0) return -1;
#pragma omp parallel for schedule(static) num_threads(c->n_threads) if (TK * H > 65536)
    for (int64_t t = 0; t < T; t++) moe_combine_row(t, k, H, idx, w, slot_pos, yp, y);
    return 0;
}
