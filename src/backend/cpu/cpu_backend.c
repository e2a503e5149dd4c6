/* cpu_backend.c — the CPU backend's op table, memory and scratch. */
#include "backend/cpu/cpu.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

#define CPU_ALIGN 64

static void *aligned_alloc_bytes(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = CPU_ALIGN;
    if (posix_memalign(&p, CPU_ALIGN, bytes) != 0) return NULL;
    return p;
}

void *cpu_slot(cpu_ctx *c, int s, size_t bytes, clef_err *err) {
    if (c->slot_bytes[s] >= bytes && c->slot[s]) return c->slot[s];
    free(c->slot[s]);
    c->slot_bytes[s] = 0;
    c->slot[s] = aligned_alloc_bytes(bytes);
    if (!c->slot[s]) {
        clef_fail(err, 422, CLEF_E_CAPACITY, NULL, "too many tokens: cannot allocate %zu bytes of CPU scratch", bytes);
        return NULL;
    }
    c->slot_bytes[s] = bytes;
    return c->slot[s];
}

int cpu_thread_scratch(cpu_ctx *c, size_t floats, clef_err *err) {
    if (c->thread_floats >= floats) return 0;
    for (int i = 0; i < c->n_threads; i++) {
        free(c->thread_buf[i]);
        c->thread_buf[i] = aligned_alloc_bytes(floats * sizeof(float));
        if (!c->thread_buf[i]) {
            c->thread_floats = 0;
            for (int j = 0; j < c->n_threads; j++) {
                free(c->thread_buf[j]);
                c->thread_buf[j] = NULL;
            }
            return clef_fail(err, 422, CLEF_E_CAPACITY, NULL,
                             "too many tokens: cannot allocate %zu floats of per-thread CPU scratch", floats);
        }
    }
    c->thread_floats = floats;
    return 0;
}

static void cpu_destroy(clef_backend *be) {
    if (!be) return;
    cpu_ctx *c = cpu_of(be);
    if (c) {
        for (int i = 0; i < c->n_threads; i++) free(c->thread_buf[i]);
        free(c->thread_buf);
        for (int s = 0; s < CPU_SLOT_COUNT; s++) free(c->slot[s]);
        free(c);
    }
    free(be);
}

static void *cpu_alloc(clef_backend *be, size_t bytes) { return aligned_alloc_bytes(bytes); }
static void cpu_free(clef_backend *be, void *p) { free(p); }

static int cpu_memcpy(clef_backend *be, void *dst, const void *src, size_t bytes, clef_err *err) {
    if (bytes) memmove(dst, src, bytes);
    return 0;
}

static int cpu_copy_2d(clef_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                       int64_t rows, int64_t cols, clef_err *err) {
    (void)be;
    if (rows < 0 || cols < 0 || dst_stride < cols || src_stride < cols)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "copy_2d: %lld rows of %lld floats, strides %lld / %lld",
                         (long long)rows, (long long)cols, (long long)dst_stride, (long long)src_stride);
    for (int64_t r = 0; r < rows; r++) memcpy(dst + r * dst_stride, src + r * src_stride, (size_t)cols * sizeof *dst);
    return 0;
}

static int cpu_copy_many(clef_backend *be, const clef_copy *list, size_t n, clef_err *err) {
    (void)be, (void)err;
    for (size_t i = 0; i < n; i++)
        if (list[i].bytes) memcpy(list[i].dst, list[i].src, list[i].bytes);
    return 0;
}

static int cpu_weight_init(clef_backend *be, clef_weight *w, clef_dtype dtype, int64_t rows, int64_t cols,
                           const void *host, clef_err *err) {
    if (!cpu_weight_dtype_ok(dtype))
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU backend: weight dtype %s is not supported",
                         clef_dtype_name(dtype));
    if (rows < 0 || cols < 0 || (!host && rows * cols > 0))
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU backend: invalid weight [%lld,%lld]",
                         (long long)rows, (long long)cols);
    /* every other field (scales of a quantized weight) zeroed: a plain weight */
    *w = (clef_weight){.dtype = dtype, .rows = rows, .cols = cols, .data = host}; /* borrowed from the map */
    return 0;
}

static int cpu_weight_init_packed(clef_backend *be, clef_weight *w, const clef_qweight *q, clef_err *err) {
    if (q->quant.type == CLEF_QT_NONE) return cpu_weight_init(be, w, q->dtype, q->rows, q->cols, q->data, err);
    if (q->rows < 1 || q->cols < 1 || !q->data || !q->quant.scale)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU backend: invalid %s weight [%lld,%lld]",
                         clef_wqtype_name(q->quant.type), (long long)q->rows, (long long)q->cols);
    *w = (clef_weight){.dtype = q->dtype, .rows = q->rows, .cols = q->cols, .data = q->data, .quant = q->quant};
    return 0; /* borrowed, packed: rows are dequantized per block by the matmul */
}

static void cpu_weight_release(clef_backend *be, clef_weight *w) {
    if (w) memset(w, 0, sizeof *w);
}

/* backend.h moe_add_rmsnorm: the moe op into a scratch o (CPU_SLOT_MOE_OUT), then add_rmsnorm (the same
 * ops, so bitwise them; the thinker's path through it is the CUDA backend's). */
static int cpu_moe_add_rmsnorm(clef_backend *be, const float *x, int64_t T, const int32_t *idx, const float *w,
                               int64_t k, const clef_moe_weights *ex, float *h, const float *nw, float eps, float *y,
                               clef_err *err) {
    if (T <= 0) return 0;
    float *o = cpu_slot(cpu_of(be), CPU_SLOT_MOE_OUT, (size_t)T * (size_t)ex->hidden * sizeof(float), err);
    if (!o) return -1;
    return cpu_moe(be, x, T, idx, w, k, ex, o, err) || cpu_add_rmsnorm(be, h, o, nw, y, T, ex->hidden, eps, err) ? -1 : 0;
}

static const clef_backend_ops cpu_ops = {
    .name = "cpu",
    .causal_prefix = 1,
    .copies_weights = 0,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .copy = cpu_memcpy,
    .copy_2d = cpu_copy_2d,
    .copy_many = cpu_copy_many,
    .weight_init = cpu_weight_init,
    .weight_release = cpu_weight_release,
    .weight_init_packed = cpu_weight_init_packed,
    .matmul = cpu_matmul,
    .gather = cpu_gather,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .add_rmsnorm = cpu_add_rmsnorm,
    .qk_norm_rope = cpu_qk_norm_rope,
    .attention = cpu_attention,
    .router_topk = cpu_router_topk,
    .moe = cpu_moe,
    .moe_add_rmsnorm = cpu_moe_add_rmsnorm,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .layernorm = cpu_layernorm,
    .gelu = cpu_gelu,
    .span_mean = cpu_span_mean,
    .pair_features = cpu_pair_features,
    .cosine = cpu_cosine,
    .gelu_tanh = cpu_gelu_tanh,
    .rope_2d = cpu_rope_2d,
    .mix_rows = cpu_mix_rows,
    .im2col_3x3s2 = cpu_im2col_3x3s2,
    .transpose = cpu_transpose,
};

clef_backend *clef_backend_cpu_create(int n_threads, clef_err *err) {
    const int asked = n_threads;
    if (n_threads <= 0) n_threads = omp_get_max_threads(); /* OMP_NUM_THREADS if set, else every core */
    if (n_threads <= 0) n_threads = 1;
    if (n_threads > CLEF_CPU_MAX_THREADS) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU backend: %d threads%s; at most %d", n_threads,
                  asked <= 0 ? " (OMP_NUM_THREADS)" : "", CLEF_CPU_MAX_THREADS);
        return NULL;
    }
    clef_backend *be = calloc(1, sizeof *be);
    cpu_ctx *c = calloc(1, sizeof *c);
    float **bufs = calloc((size_t)n_threads, sizeof *bufs);
    if (!be || !c || !bufs) {
        free(be);
        free(c);
        free(bufs);
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CPU backend: out of memory");
        return NULL;
    }
    c->n_threads = n_threads;
    c->isa = cpu_isa_best(); /* every variant gives the same bits: this only picks the fastest */
    c->thread_buf = bufs;
    be->ops = &cpu_ops;
    be->ctx = c;
    return be;
}
