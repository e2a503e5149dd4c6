/* cuda_backend.c — the CUDA backend's op table (backend.h) in C: argument
 * checks, device memory (weights in arenas, workspaces from the
 * stream-ordered pool, scratch slots grown on demand), host arrays staged to
 * the device, cuBLASLt for dense products, and the launches of the kernels
 * in cuda_*.cu (cuda_kernels.h).  Everything runs on one stream per backend;
 * the only host synchronisation in a forward is the download of its result.
 *
 * Without CLEF_HAVE_CUDA (CMake CLEF_CUDA=OFF) only the stubs at the end are
 * compiled. */
#include "backend/cuda/cuda.h"

#include "clef_version.h" /* CLEF_CUDA_ARCH_LIST */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The kernel switches of the backends clef_cuda_backend_create makes (clef_cuda_set_switch: `clef
 * bench --kernel`); the defaults until one is set. */
static clef_cuda_knobs g_switches;
static int g_switches_set;

int clef_cuda_set_switch(const char *name, const char *value, clef_err *err) {
    if (!g_switches_set) clef_cuda_knobs_default(&g_switches);
    const int r = clef_cuda_knobs_set(&g_switches, name, value, err);
    if (r == 0) {
        char names[512];
        clef_cuda_knob_names(names, sizeof names);
        return clef_fail(err, 400, CLEF_E_REQUEST, "kernel", "'%s' is not a CUDA kernel switch (%s)", name, names);
    }
    if (r < 0) return -1;
    g_switches_set = 1;
    return 0;
}

#ifdef CLEF_HAVE_CUDA

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_env.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_select.h"
#include "backend/cuda/cuda_qbits.h"

#include "backend/cuda/cuda_ctx.h"

static void graph_clear(cu_graph *g);
static const clef_backend_ops cuda_ops;

/* Room for element n of a growable host array (`items`, *cap elements of `size` bytes): when n == *cap
 * the array is reallocated to twice the capacity (`first` elements the first time) and *cap updated.
 * Returns the array (moved or not), or NULL when out of host memory (then the old array stays as it was,
 * still the caller's). */
static void *grow_room(void *items, size_t *cap, size_t n, size_t size, size_t first) {
    if (n < *cap) return items;
    const size_t nc = *cap ? 2 * *cap : first;
    void *p = realloc(items, nc * size);
    if (p) *cap = nc;
    return p;
}

/* ---- profiling ----------------------------------------------------------- */

static int prof_key_of(cuda_ctx *c, const char *name) {
    for (size_t i = 0; i < c->n_keys; i++)
        if (strcmp(c->keys[i].name, name) == 0) return (int)i;
    prof_key *keys = grow_room(c->keys, &c->cap_keys, c->n_keys, sizeof *keys, 64);
    if (!keys) return -1;
    c->keys = keys;
    prof_key *k = &c->keys[c->n_keys];
    memset(k, 0, sizeof *k);
    snprintf(k->name, sizeof k->name, "%s", name);
    return (int)c->n_keys++;
}

/* Fold every recorded event pair into the totals (waits for the last). */
static void prof_collect(cuda_ctx *c) {
    if (!c->used_ev) return;
    cudaEventSynchronize(c->ev[c->used_ev - 1].b);
    for (size_t i = 0; i < c->used_ev; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, c->ev[i].a, c->ev[i].b) == cudaSuccess && c->ev[i].key >= 0) {
            c->keys[c->ev[i].key].ms += ms;
            c->keys[c->ev[i].key].calls++;
        }
    }
    c->used_ev = 0;
}

/* Start timing `name` (no-op unless profiling). */
static void prof_begin(cuda_ctx *c, const char *name) {
    c->cur_key = -1;
    if (!c->profile) return;
    if (c->used_ev == c->cap_ev && c->cap_ev >= 8192) prof_collect(c);
    if (c->used_ev == c->n_ev) {
        prof_ev *ev = grow_room(c->ev, &c->cap_ev, c->n_ev, sizeof *ev, 256);
        if (!ev) return;
        c->ev = ev;
        if (cudaEventCreate(&c->ev[c->n_ev].a) != cudaSuccess) return;
        if (cudaEventCreate(&c->ev[c->n_ev].b) != cudaSuccess) {
            cudaEventDestroy(c->ev[c->n_ev].a);
            return;
        }
        c->n_ev++;
    }
    c->cur_key = prof_key_of(c, name);
    c->ev[c->used_ev].key = c->cur_key;
    cudaEventRecord(c->ev[c->used_ev].a, c->st);
}

static void prof_end(cuda_ctx *c) {
    if (!c->profile || c->cur_key < 0) return;
    cudaEventRecord(c->ev[c->used_ev].b, c->st);
    c->used_ev++;
    c->cur_key = -1;
}

static int cmp_key_ms(const void *a, const void *b) {
    double x = ((const prof_key *)a)->ms, y = ((const prof_key *)b)->ms;
    return (x < y) - (x > y);
}

void clef_cuda_profile_dump(clef_backend *be, FILE *f) {
    if (!clef_backend_is_cuda(be)) return;
    cuda_ctx *c = cu_of(be);
    if (!c->profile) return;
    cudaSetDevice(c->device);
    prof_collect(c);
    if (!f) {
        c->n_keys = 0;
        return;
    }
    qsort(c->keys, c->n_keys, sizeof *c->keys, cmp_key_ms);
    double total = 0;
    for (size_t i = 0; i < c->n_keys; i++) total += c->keys[i].ms;
    fprintf(f, "%-44s %8s %11s %9s %6s\n", "op", "calls", "total ms", "mean us", "share");
    for (size_t i = 0; i < c->n_keys; i++) {
        const prof_key *k = &c->keys[i];
        if (!k->calls) continue;
        fprintf(f, "%-44s %8ld %11.3f %9.1f %5.1f%%\n", k->name, k->calls, k->ms, 1e3 * k->ms / (double)k->calls,
                total > 0 ? 100.0 * k->ms / total : 0.0);
    }
    fprintf(f, "%-44s %8s %11.3f\n", "sum of op times", "", total);
    c->n_keys = 0;
}

void clef_cuda_set_profile(clef_backend *be, int on) {
    if (!clef_backend_is_cuda(be)) return;
    cuda_ctx *c = cu_of(be);
    cudaSetDevice(c->device);
    prof_collect(c);
    c->profile = on != 0;
}

/* Every op: select the device, forget the converted rows (unless the op is
 * a matmul, which manages them), start the op's timer. */
static void op_begin(cuda_ctx *c, const char *name, int keep_cvt) {
    cudaSetDevice(c->device);
    if (!keep_cvt) c->cvt_valid = 0;
    c->att_valid = 0; /* attention reads it before its own op_begin */
    prof_begin(c, name);
}

/* Close the op's timer; passes rc through. */
static int op_end(cuda_ctx *c, int rc) {
    prof_end(c);
    return rc;
}

/* ---- memory -------------------------------------------------------------- */

static void note_usage(cuda_ctx *c) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot - fr > c->peak_used) c->peak_used = tot - fr;
}

/* Slot `s` with at least `bytes` (contents not kept on growth), or NULL +
 * err (422 too many tokens).  Growth frees in stream order, so work still
 * queued on the old buffer is safe. */
static void *cu_slot(cuda_ctx *c, int s, size_t bytes, clef_err *err) {
    if (c->slot[s] && c->slot_bytes[s] >= bytes) return c->slot[s];
    if (c->capturing) { /* cannot free or sync inside a capture: fail it (graph_run then runs the ops plainly) */
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA graph capture: scratch slot %d must grow", s);
        return NULL;
    }
    c->slot_gen++;
    if (c->slot[s]) {
        /* growth is rare: give the smaller block back to the driver instead of
         * leaving it cached in the pool (it would count towards the peak) */
        cudaFreeAsync(c->slot[s], c->st);
        cudaMemPool_t pool;
        if (cudaStreamSynchronize(c->st) == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, c->device) == cudaSuccess)
            cudaMemPoolTrimTo(pool, 0);
    }
    c->slot[s] = NULL;
    c->slot_bytes[s] = 0;
    size_t want = ALIGN_UP(bytes + bytes / 4 + 256, 256); /* a little headroom: fewer regrowths */
    if (c->budget && cu_budget_admit(c, want, 1, "scratch", NULL)) want = ALIGN_UP(bytes + 256, 256);
    if (cu_budget_admit(c, want, 1, "CUDA scratch", err)) return NULL;
    void *p = NULL;
    cudaError_t e = cudaMallocAsync(&p, want, c->st);
    if (e != cudaSuccess) {
        cudaGetLastError();
        clef_fail(err, 422, CLEF_E_CAPACITY, NULL, "too many tokens: cannot allocate %zu bytes of CUDA scratch (%s)",
                  want, cudaGetErrorString(e));
        return NULL;
    }
    c->slot[s] = p;
    c->slot_bytes[s] = want;
    if (s == SLOT_A16) c->cvt_valid = 0;
    if (s == SLOT_ATT16) c->att_valid = 0;
    if (s == SLOT_META) c->meta_cached = 0;
    return p;
}

/* Host staging buffer of at least `bytes`. */
static void *cu_host(cuda_ctx *c, size_t bytes, clef_err *err) {
    if (c->host_bytes >= bytes) return c->host;
    char *h = realloc(c->host, bytes);
    if (!h) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA backend: out of host memory (%zu bytes)", bytes);
        return NULL;
    }
    c->host = h;
    c->host_bytes = bytes;
    return h;
}

/* stage_meta while a graph is captured: the graph's own device copy of the
 * staged bytes (a pageable copy cannot be captured, and the META slot is
 * rewritten by later plain launches), copied now on the side stream; an
 * array equal to the previous one (every layer's attention) is shared. */
static void *stage_meta_captured(cuda_ctx *c, size_t bytes, clef_err *err) {
    cu_graph *g = c->cap;
    if (g->n_meta && bytes == g->last_meta_bytes && memcmp(g->last_meta_host, c->host, bytes) == 0)
        return g->meta[g->n_meta - 1];
    void **m = realloc(g->meta, (g->n_meta + 1) * sizeof *m);
    char *h = malloc(bytes ? bytes : 1);
    if (!m || !h) {
        if (m) g->meta = m;
        free(h);
        return host_oom(err), NULL;
    }
    g->meta = m;
    void *d = NULL;
    if (cu_check(cudaMalloc(&d, bytes ? bytes : 1), "graph arguments", err)) {
        free(h);
        return NULL;
    }
    g->meta[g->n_meta++] = d;
    if (cu_check(cudaMemcpyAsync(d, c->host, bytes, cudaMemcpyHostToDevice, c->side), "graph arguments", err) ||
        cu_check(cudaStreamSynchronize(c->side), "graph arguments", err)) {
        free(h);
        return NULL;
    }
    memcpy(h, c->host, bytes);
    free(g->last_meta_host);
    g->last_meta_host = h;
    g->last_meta_bytes = bytes;
    return d;
}

/* Copy the host staging buffer's first `bytes` into the META slot. */
static void *stage_meta(cuda_ctx *c, size_t bytes, clef_err *err) {
    if (c->capturing) return stage_meta_captured(c, bytes, err);
    void *d = cu_slot(c, SLOT_META, bytes, err);
    if (!d) return NULL;
    /* the bytes the slot already holds (stream order: every earlier staging is before any later use):
     * no copy.  A pageable copy may wait for the stream, which would stall the host's launches once
     * per layer. */
    if (bytes && bytes == c->meta_cached && memcmp(c->meta_cache, c->host, bytes) == 0) return d;
    c->meta_cached = 0;
    /* from pageable memory: returns once the bytes are staged, so the host
     * buffer may be reused at once; the device write is stream-ordered */
    if (cu_check(cudaMemcpyAsync(d, c->host, bytes, cudaMemcpyHostToDevice, c->st), "stage arguments", err)) return NULL;
    if (bytes > c->meta_cache_cap) {
        char *m = realloc(c->meta_cache, bytes);
        if (!m) return d; /* no record: the next staging copies again */
        c->meta_cache = m;
        c->meta_cache_cap = bytes;
    }
    memcpy(c->meta_cache, c->host, bytes);
    c->meta_cached = bytes;
    return d;
}

static void *cu_alloc(clef_backend *be, size_t bytes) {
    cuda_ctx *c = cu_of(be);
    if (c->capturing) return NULL; /* graph_run bodies do not allocate (backend.h) */
    cudaSetDevice(c->device);
    if (cu_budget_admit(c, bytes ? bytes : 256, 1, "a workspace", NULL)) return NULL;
    void *p = NULL;
    if (cudaMallocAsync(&p, bytes ? bytes : 256, c->st) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_free(clef_backend *be, void *p) {
    if (!p) return;
    cuda_ctx *c = cu_of(be);
    cudaSetDevice(c->device);
    note_usage(c);
    cudaFreeAsync(p, c->st);
}

static int cu_upload(clef_backend *be, void *dst, const void *src, size_t bytes, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    if (!bytes) return 0;
    op_begin(c, "upload", 0);
    return op_end(c, cu_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->st), "upload", err));
}

static int cu_download(clef_backend *be, void *dst, const void *src, size_t bytes, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    if (!bytes) return 0;
    op_begin(c, "download", 1);
    int rc = cu_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->st), "download", err);
    op_end(c, rc);
    /* the forward's one synchronisation: surfaces any fault of the queued kernels */
    if (rc == 0) rc = cu_check(cudaStreamSynchronize(c->st), "synchronize", err);
    note_usage(c);
    return rc;
}

static int cu_copy(clef_backend *be, void *dst, const void *src, size_t bytes, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    if (!bytes) return 0;
    op_begin(c, "copy", 0);
    return op_end(c, cu_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->st), "copy", err));
}

static int cu_copy_2d(clef_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                      int64_t rows, int64_t cols, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    if (rows < 0 || cols < 0 || dst_stride < cols || src_stride < cols)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA copy_2d: %lld rows of %lld floats, strides %lld / %lld",
                         (long long)rows, (long long)cols, (long long)dst_stride, (long long)src_stride);
    if (!rows || !cols) return 0;
    op_begin(c, "copy", 0);
    const size_t f = sizeof(float);
    return op_end(c, cu_check(cudaMemcpy2DAsync(dst, (size_t)dst_stride * f, src, (size_t)src_stride * f,
                                                (size_t)cols * f, (size_t)rows, cudaMemcpyDeviceToDevice, c->st),
                              "copy_2d", err));
}

/* The list staged as ck_copy records (META slot), one kernel; a single copy as a memcpy. */
static int cu_copy_many(clef_backend *be, const clef_copy *list, size_t n, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    if (n == 0) return 0;
    if (n == 1) return cu_copy(be, list[0].dst, list[0].src, list[0].bytes, err);
    if (n > 0x7fffffff / 2) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA copy_many: %zu copies", n);
    op_begin(c, "copy", 0);
    ck_copy *h = cu_host(c, n * sizeof *h, err);
    if (!h) return op_end(c, -1);
    size_t most = 0;
    for (size_t i = 0; i < n; i++) {
        h[i] = (ck_copy){list[i].dst, list[i].src, list[i].bytes};
        most = list[i].bytes > most ? list[i].bytes : most;
    }
    const ck_copy *d = stage_meta(c, n * sizeof *h, err);
    if (!d) return op_end(c, -1);
    return op_end(c, cu_check(ck_copy_many(d, (int)n, most, c->st), "copy_many", err));
}

/* ---- weights ------------------------------------------------------------- */

/* `bytes` of weight memory (256-byte aligned) from the arenas. */
static void *arena_take(cuda_ctx *c, size_t bytes, clef_err *err) {
    if (c->sx.binding) return cu_sx_take(c, bytes, err); /* a streamed layer's experts: its slot */
    bytes = ALIGN_UP(bytes ? bytes : 1, 256);
    if (c->n_arenas) {
        arena *a = &c->arenas[c->n_arenas - 1];
        if (a->size - a->used >= bytes) {
            void *p = a->base + a->used;
            a->used += bytes;
            a->live++;
            return p;
        }
    }
    arena *grown = grow_room(c->arenas, &c->cap_arenas, c->n_arenas, sizeof *grown, 64);
    if (!grown) return host_oom(err), NULL;
    c->arenas = grown;
    size_t size = bytes > ARENA_BYTES / 4 ? bytes : ARENA_BYTES; /* big tensors get their own */
    if (c->budget && size > bytes && cu_budget_admit(c, size, 0, "weights", NULL)) size = bytes; /* no room for a
                                                                                                   whole arena */
    if (cu_budget_admit(c, size, 0, "weights", err)) return NULL;
    void *base = NULL;
    cudaError_t e = cudaMalloc(&base, size);
    if (e != cudaSuccess && size > bytes) { /* near the end of memory: just this tensor */
        cudaGetLastError();
        size = bytes;
        e = cudaMalloc(&base, size);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA: cannot allocate %zu bytes for weights: %s", size,
                  cudaGetErrorString(e));
        return NULL;
    }
    /* the fuller arena stays last, so small tensors keep filling it */
    arena na = {.base = base, .size = size, .used = bytes, .live = 1};
    if (c->n_arenas && size == bytes) {
        c->arenas[c->n_arenas] = c->arenas[c->n_arenas - 1];
        c->arenas[c->n_arenas - 1] = na;
    } else {
        c->arenas[c->n_arenas] = na;
    }
    c->n_arenas++;
    return base;
}

static void arena_release(cuda_ctx *c, const void *p) {
    for (size_t i = 0; i < c->n_arenas; i++) {
        arena *a = &c->arenas[i];
        if ((const char *)p < a->base || (const char *)p >= a->base + a->size) continue;
        if (a->live && --a->live == 0) {
            cudaFree(a->base);
            c->arenas[i] = c->arenas[--c->n_arenas];
        }
        return;
    }
}

static int cu_weight_init(clef_backend *be, clef_weight *w, clef_dtype dtype, int64_t rows, int64_t cols,
                          const void *host, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    if (dtype != CLEF_DT_BF16 && dtype != CLEF_DT_F16 && dtype != CLEF_DT_F32)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "unsupported weight dtype on cuda: %s",
                         clef_dtype_name(dtype));
    if (rows < 0 || cols < 0 || (!host && rows * cols > 0))
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA backend: invalid weight [%lld,%lld]", (long long)rows,
                         (long long)cols);
    cudaSetDevice(c->device);
    const size_t n = (size_t)rows * (size_t)cols;
    /* bf16 stays bf16 (the tensor cores' input); f16 widens to f32 exactly */
    const clef_dtype dev_dtype = dtype == CLEF_DT_BF16 ? CLEF_DT_BF16 : CLEF_DT_F32;
    const size_t bytes = n * clef_dtype_size(dev_dtype);
    void *d = arena_take(c, bytes, err);
    if (!d) return -1;
    int rc;
    if (dtype == CLEF_DT_F16) {
        float *tmp = malloc(n ? n * sizeof *tmp : 1);
        if (!tmp) {
            arena_release(c, d);
            return host_oom(err);
        }
        clef_to_f32(CLEF_DT_F16, host, tmp, n);
        rc = cu_check(cudaMemcpyAsync(d, tmp, bytes, cudaMemcpyHostToDevice, c->st), "weight upload", err);
        free(tmp); /* pageable source: staged before the call returned */
    } else {
        rc = bytes ? cu_check(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, c->st), "weight upload", err) : 0;
    }
    if (rc != 0) {
        arena_release(c, d);
        return -1;
    }
    *w = (clef_weight){.dtype = dev_dtype, .rows = rows, .cols = cols, .data = d};
    return 0;
}

/* Byte sizes of the packed arrays of q (data, scales, zeros). */
static void packed_sizes(const clef_qweight *q, size_t *data, size_t *scale, size_t *zeros) {
    const size_t R = (size_t)q->rows, C = (size_t)q->cols;
    *zeros = 0;
    switch (q->quant.type) {
    case CLEF_QT_NVFP4:
        *data = R * C / 2;
        *scale = R * (C / 16);
        break;
    case CLEF_QT_FP8_BLOCK: {
        const size_t br = (size_t)q->quant.block_r, bc = (size_t)q->quant.block_c;
        *data = R * C;
        *scale = 4 * ((R + br - 1) / br) * ((C + bc - 1) / bc);
        break;
    }
    default: { /* INT4 */
        const size_t G = (size_t)q->quant.group;
        *data = R * C / 2;
        *scale = 2 * (C / G) * R;
        *zeros = q->quant.zeros ? 4 * (C / G) * (R / 8) : 0;
        break;
    }
    }
}

/* A weight bound by clef_qweight_bind: plain ones as cu_weight_init;
 * quantized ones uploaded as they are (packed bytes, scales, zeros: the
 * sizes of clef_qweight_bytes, no bf16 copy) into one arena block, each
 * array 256-byte aligned with 256 bytes of slack after it (ck_qmat), the
 * device pointers in w->quant.  INT4 data is reordered on the device into
 * the layout of kernel v3 (cuda_qbits.h CK_INT4R_*; same size for N % 16 ==
 * 0 and K % 64 == 0, padded otherwise; the GPTQ layout is not kept) unless
 * CLEF_CUDA_QGEMM_INT4=v2 was set when the backend was created; NVFP4 data
 * and scales likewise (CK_NVF4R_*, ck_nvfp4_reorder) unless
 * CLEF_CUDA_QGEMM_NVFP4=v2.  The host arrays are never changed.  An expert
 * view of a stacked tensor uploads just its rows.  Shapes the kernels cannot
 * tile fail with 500. */
static int cu_weight_init_packed(clef_backend *be, clef_weight *w, const clef_qweight *q, clef_err *err) {
    if (q->quant.type == CLEF_QT_NONE) return cu_weight_init(be, w, q->dtype, q->rows, q->cols, q->data, err);
    cuda_ctx *c = cu_of(be);
    const clef_wquant *qu = &q->quant;
    const int64_t R = q->rows, C = q->cols;
    int shape_ok = R > 0 && C >= 16 && C % 16 == 0 && R < ((int64_t)1 << 30) && q->data && qu->scale;
    if (qu->type == CLEF_QT_FP8_BLOCK) shape_ok = shape_ok && qu->block_r >= 1 && qu->block_c >= 16 && qu->block_c % 16 == 0;
    else if (qu->type == CLEF_QT_INT4_GPTQ) shape_ok = shape_ok && R % 8 == 0 && qu->group >= 16 && qu->group % 16 == 0 && C % qu->group == 0;
    else if (qu->type != CLEF_QT_NVFP4) shape_ok = 0;
    if (!shape_ok)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                         "unsupported weight dtype on cuda: %s [%lld,%lld] (group %lld, block %lldx%lld); the CUDA "
                         "kernels need scales, in %% 16 == 0, INT4 groups and FP8 block columns a multiple of 16",
                         clef_wqtype_name(qu->type), (long long)R, (long long)C, (long long)qu->group,
                         (long long)qu->block_r, (long long)qu->block_c);
    size_t nd, ns, nz;
    packed_sizes(q, &nd, &ns, &nz);
    /* INT4 / NVFP4 (default): the data (NVFP4: and scales) reordered on the device for kernel v3 (replacing the
     * checkpoint layout, no copy kept) */
    const int reorder = qu->type == CLEF_QT_INT4_GPTQ && !c->int4_v2;
    const int reorder_nvf = qu->type == CLEF_QT_NVFP4 && !c->nvfp4_v2;
    const size_t nq = nd, nsq = ns;
    if (reorder) nd = (size_t)CK_INT4R_BYTES(R, C);
    if (reorder_nvf) nd = (size_t)CK_NVF4R_BYTES(R, C), ns = (size_t)CK_NVF4R_SC_BYTES(R, C);
    const size_t od = 0, os = ALIGN_UP(nd + 256, 256), oz = os + ALIGN_UP(ns + 256, 256);
    const size_t total = oz + (nz ? ALIGN_UP(nz + 256, 256) : 0);
    cudaSetDevice(c->device);
    char *d = arena_take(c, total, err);
    if (!d) return -1;
    int rc;
    if (reorder) {
        void *stage = cu_slot(c, SLOT_STAGE, nq, err);
        rc = stage ? 0 : -1;
        if (rc == 0) rc = cu_check(cudaMemcpyAsync(stage, q->data, nq, cudaMemcpyHostToDevice, c->st), "weight upload", err);
        if (rc == 0) rc = cu_check(ck_int4_reorder(stage, C, R, d + od, c->st), "INT4 reorder", err);
    } else if (reorder_nvf) {
        const size_t oss = ALIGN_UP(nq, 256); /* the scales after the data in the stage */
        char *stage = cu_slot(c, SLOT_STAGE, oss + nsq, err);
        rc = stage ? 0 : -1;
        if (rc == 0) rc = cu_check(cudaMemcpyAsync(stage, q->data, nq, cudaMemcpyHostToDevice, c->st), "weight upload", err);
        if (rc == 0)
            rc = cu_check(cudaMemcpyAsync(stage + oss, qu->scale, nsq, cudaMemcpyHostToDevice, c->st), "scale upload", err);
        if (rc == 0) rc = cu_check(ck_nvfp4_reorder(stage, stage + oss, C, R, d + od, d + os, c->st), "NVFP4 reorder", err);
    } else {
        rc = cu_check(cudaMemcpyAsync(d + od, q->data, nd, cudaMemcpyHostToDevice, c->st), "weight upload", err);
    }
    if (rc == 0 && !reorder_nvf)
        rc = cu_check(cudaMemcpyAsync(d + os, qu->scale, ns, cudaMemcpyHostToDevice, c->st), "scale upload", err);
    if (rc == 0 && nz) rc = cu_check(cudaMemcpyAsync(d + oz, qu->zeros, nz, cudaMemcpyHostToDevice, c->st), "zeros upload", err);
    if (rc != 0) {
        arena_release(c, d);
        return -1;
    }
    *w = (clef_weight){.dtype = q->dtype, .rows = R, .cols = C, .data = d + od, .quant = *qu};
    w->quant.scale = d + os;
    w->quant.zeros = nz ? d + oz : NULL;
    note_usage(c);
    return 0;
}

static void cu_weight_release(clef_backend *be, clef_weight *w) {
    if (!w) return;
    cuda_ctx *c = cu_of(be);
    if (w->data) {
        cudaSetDevice(c->device);
        arena_release(c, w->data);
    }
    memset(w, 0, sizeof *w);
}

/* ---- dense products ------------------------------------------------------ */

/* An op wrote [p, p + bytes): forget the converted rows if they overlap. */
static void cvt_clobber(cuda_ctx *c, const void *p, size_t bytes) {
    if (c->cvt_valid && (const char *)p < (const char *)(c->cvt_x + c->cvt_rows * c->cvt_ld) &&
        (const char *)p + bytes > (const char *)c->cvt_x)
        c->cvt_valid = 0;
}

/* SLOT_A16 now holds x [rows, K] (rows ldx apart) as bf16 rows, `split` halves each. */
static void cvt_remember(cuda_ctx *c, const float *x, int64_t rows, int64_t K, int64_t ldx, int split) {
    c->cvt_x = x, c->cvt_rows = rows, c->cvt_K = K, c->cvt_ld = ldx, c->cvt_split = split, c->cvt_valid = 1;
}

/* Where SLOT_A16 already holds x [rows, K] (rows ldx apart) as bf16 rows of `split` halves: the
 * remembered conversion's rows, or a run of them (a chunk of the expert block's passes); NULL when it
 * does not. */
static uint16_t *converted_rows(const cuda_ctx *c, const float *x, int64_t rows, int64_t K, int64_t ldx, int split) {
    if (!(c->cvt_valid && c->cvt_K == K && c->cvt_ld == ldx && c->cvt_split == split && ldx > 0 &&
          (uintptr_t)x >= (uintptr_t)c->cvt_x))
        return NULL;
    const uintptr_t d = (uintptr_t)x - (uintptr_t)c->cvt_x, row_bytes = (uintptr_t)ldx * sizeof(float);
    if (d % row_bytes || (int64_t)(d / row_bytes) + rows > c->cvt_rows) return NULL;
    return (uint16_t *)c->slot[SLOT_A16] + (size_t)(d / row_bytes) * (size_t)K * (size_t)split;
}

/* x [rows, K] (rows ldx apart) as bf16 rows in SLOT_A16 ([hi | lo] when
 * precise), reusing the last conversion when it is of the same rows. */
static const uint16_t *convert_rows(cuda_ctx *c, const float *x, int64_t rows, int64_t K, int64_t ldx, int split,
                                    clef_err *err) {
    const uint16_t *kept = converted_rows(c, x, rows, K, ldx, split);
    if (kept) return kept;
    uint16_t *d = cu_slot(c, SLOT_A16, (size_t)rows * (size_t)K * (size_t)split * 2, err);
    if (!d) return NULL;
    if (cu_check(ck_rows_to_bf16(x, rows, K, ldx, d, split, c->st), "activation to bf16", err)) return NULL;
    cvt_remember(c, x, rows, K, ldx, split);
    return d;
}

/* Layout rows x cols (column-major, ld) of `type`. */
static int lt_layout(cublasLtMatrixLayout_t *l, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                     clef_err *err) {
    return lt_check(cublasLtMatrixLayoutCreate(l, type, (uint64_t)rows, (uint64_t)cols, ld), "layout", err);
}

/* Split count and reduction scheme of a cuBLASLt algorithm configuration. */
static void lt_algo_split(const cublasLtMatmulAlgo_t *a, uint32_t *splitk, uint32_t *scheme) {
    size_t got = 0;
    *splitk = 1, *scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, splitk, sizeof *splitk, &got);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, scheme, sizeof *scheme, &got);
}

static const char *lt_scheme_name(uint32_t s) {
    return s == CUBLASLT_REDUCTION_SCHEME_NONE           ? "none"
           : s == CUBLASLT_REDUCTION_SCHEME_INPLACE      ? "inplace"
           : s == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE ? "compute-type"
           : s == CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE  ? "output-type"
                                                         : "?";
}

/* Split-K and batch invariance.  A split-K algorithm cuts K into SPLITK_NUM
 * slices, accumulates each in its own CTA, then sums the slices' partials.
 * It is admitted only as configured once here (split count and reduction
 * scheme fixed per weight shape, the same for every M) and only with one of
 * the reduction schemes of cublasLt.h (cublasLtReductionScheme_t):
 *  - INPLACE: "reduction is performed in place using the output buffer ...
 *    and counters (in workspace) to guarantee the sequentiality": read as
 *    the slices adding into the output one after the other in slice order
 *    (a counter turnstile, like CUTLASS's serial split-K), no float atomics;
 *  - COMPUTE_TYPE / OUTPUT_TYPE: the partials are stored in the workspace
 *    (f32 either way here: the output is f32) and "reduced in a separate
 *    step" by a reduction kernel.
 * Either way each output element is the sum of its own SPLITK_NUM partials,
 * each a fixed-order dot product over a K slice whose bounds depend on K and
 * the split count only: a row's result depends on that row only, whatever M
 * (the argument that already holds for the non-split algorithms).  Run to
 * run, cuBLAS documents bitwise-identical results for one toolkit version on
 * GPUs of one architecture and SM count, with one stream or a user-owned
 * workspace per stream ("Results reproducibility", cuBLAS docs; one stream
 * and one workspace per backend here).  In NVIDIA/CUDALibrarySamples issue
 * 243 ("Nondeterministic reductions") a user saw split-K results vary; the
 * maintainer's reply there explains differences between split counts, and
 * advises a reduction-scheme mask of NONE only to exclude split-K: that is
 * what CLEF_CUDA_LT_SPLITK=0 does.  As run-to-run and row independence are
 * thus reasoned rather than documented for split-K, each split-K candidate
 * is also checked on the GPU before it is timed (lt_verify: bitwise equal
 * twice, alone and in batches); and its K slices must be whole
 * multiples of 128 (a cuBLAS split-K bug reported on H100 drops a ragged K
 * tail: facebookexperimental/triton PR 2767). */

/* Stacked rows of the ladder at which an algorithm must be accepted (up to
 * at least 2048; as far as its workspace fits, 65536 at most). */
static const int64_t lt_ladder[] = {1, 7, 64, 300, 600, 1024, 2048, 4097, 8192, 16384, 32768, 65536};

/* Whether algorithm `a` (as configured) may serve plan p, not being one of
 * out[0 .. n): split-K only as described above; cublasLtMatmulAlgoCheck
 * accepts it within the workspace at every ladder row count up to
 * *max_rows >= 2048 (the rows a call is then limited to). */
static int lt_admit(cuda_ctx *c, lt_plan *p, const cublasLtMatmulAlgo_t *a, const cublasLtMatmulAlgo_t *out, int n,
                    int64_t *max_rows) {
    uint32_t splitk, scheme;
    lt_algo_split(a, &splitk, &scheme);
    if (splitk > 1) {
        if (!c->k.lt_splitk || p->K % (128 * (int64_t)splitk)) return 0;
        if (scheme != CUBLASLT_REDUCTION_SCHEME_INPLACE && scheme != CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE &&
            scheme != CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)
            return 0;
    } else if (scheme != CUBLASLT_REDUCTION_SCHEME_NONE)
        return 0;
    for (int j = 0; j < n; j++)
        if (memcmp(&out[j], a, sizeof *a) == 0) return 0;
    int64_t cap = 0;
    for (size_t j = 0; j < sizeof lt_ladder / sizeof *lt_ladder; j++) {
        cublasLtMatrixLayoutSetAttribute(p->b, CUBLASLT_MATRIX_LAYOUT_COLS, &lt_ladder[j], sizeof lt_ladder[j]);
        cublasLtMatrixLayoutSetAttribute(p->d, CUBLASLT_MATRIX_LAYOUT_COLS, &lt_ladder[j], sizeof lt_ladder[j]);
        cublasLtMatmulHeuristicResult_t chk;
        if (cublasLtMatmulAlgoCheck(c->lt, c->lt_desc, p->a, p->b, p->d, p->d, a, &chk) != CUBLAS_STATUS_SUCCESS ||
            chk.workspaceSize > c->lt_ws_bytes)
            break;
        cap = lt_ladder[j];
    }
    *max_rows = cap;
    return cap >= 2048;
}

/* Candidate algorithms for weight shape [N, K] (out, with the rows each
 * call may have in rows): cuBLASLt heuristics at 4096, 300 (x2 stacked when
 * split) and 256 rows, split-K ones included unless CLEF_CUDA_LT_SPLITK=0;
 * and split-K variants (2, 4, 8, 16 slices; INPLACE and COMPUTE_TYPE) of the
 * heuristic's first three non-split algorithms at the small row counts, as
 * the heuristic may offer none there although few CTAs run without.  Each
 * admitted by lt_admit.  Returns the count (<= cap). */
static int lt_candidates(cuda_ctx *c, lt_plan *p, cublasLtMatmulAlgo_t *out, int64_t *rows, int cap) {
    cublasLtMatmulPreference_t pref;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return 0;
    uint64_t ws = c->lt_ws_bytes;
    uint32_t al_ab = 256, al_cd = 16;
    uint32_t mask = c->k.lt_splitk ? CUBLASLT_REDUCTION_SCHEME_MASK : CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_ab, sizeof al_ab);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_ab, sizeof al_ab);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_cd, sizeof al_cd);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_cd, sizeof al_cd);
    const int64_t probe[] = {4096, 300 * p->split, 256};
    cublasLtMatmulAlgo_t base[3];
    int n = 0, nb = 0;
    for (size_t pi = 0; pi < sizeof probe / sizeof *probe; pi++) {
        cublasLtMatmulHeuristicResult_t res[16];
        int n_res = 0;
        cublasLtMatrixLayoutSetAttribute(p->b, CUBLASLT_MATRIX_LAYOUT_COLS, &probe[pi], sizeof probe[pi]);
        cublasLtMatrixLayoutSetAttribute(p->d, CUBLASLT_MATRIX_LAYOUT_COLS, &probe[pi], sizeof probe[pi]);
        if (cublasLtMatmulAlgoGetHeuristic(c->lt, c->lt_desc, p->a, p->b, p->d, p->d, pref, 16, res, &n_res) !=
            CUBLAS_STATUS_SUCCESS)
            continue;
        for (int i = 0; i < n_res; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
            uint32_t splitk, scheme;
            lt_algo_split(&res[i].algo, &splitk, &scheme);
            if (pi > 0 && splitk == 1 && nb < 3) {
                int dup = 0;
                for (int j = 0; j < nb && !dup; j++) dup = memcmp(&base[j], &res[i].algo, sizeof base[j]) == 0;
                if (!dup) base[nb++] = res[i].algo;
            }
            if (n < cap && lt_admit(c, p, &res[i].algo, out, n, &rows[n])) out[n++] = res[i].algo;
        }
    }
    cublasLtMatmulPreferenceDestroy(pref);
    static const uint32_t splits[] = {2, 4, 8, 16};
    static const uint32_t schemes[] = {CUBLASLT_REDUCTION_SCHEME_INPLACE, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE};
    for (int b = 0; b < nb && c->k.lt_splitk; b++)
        for (size_t s = 0; s < sizeof splits / sizeof *splits; s++)
            for (size_t r = 0; r < sizeof schemes / sizeof *schemes; r++) {
                cublasLtMatmulAlgo_t a = base[b];
                if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits[s],
                                                         sizeof splits[s]) != CUBLAS_STATUS_SUCCESS ||
                    cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &schemes[r],
                                                         sizeof schemes[r]) != CUBLAS_STATUS_SUCCESS)
                    continue;
                if (n < cap && lt_admit(c, p, &a, out, n, &rows[n])) out[n++] = a;
            }
    return n;
}

/* Rows per cuBLASLt call of a split product (2x that many stacked rows). */
#define SPLIT_LT_ROWS 8192

/* Rows (tokens) per cuBLASLt call of plan p with an algorithm limited to
 * max_rows stacked rows. */
static int64_t lt_chunk(const lt_plan *p, int64_t max_rows) {
    if (p->split == 1) return max_rows;
    return max_rows / 2 < SPLIT_LT_ROWS ? max_rows / 2 : SPLIT_LT_ROWS;
}

/* y[T, N] = bf16(x) . W^T with `algo` on plan p's layouts, in calls of
 * lt_chunk rows (rows are independent: no value changes).  Split plans: a16
 * rows are [hi | lo], read as 2T rows of K (hi_0, lo_0, hi_1, ...) into the
 * scratch d (2 * min(T, chunk) * N floats), then y = hi + lo (+ bias) by
 * ck_split_sum; other plans write y directly and ignore bias.  Returns 0;
 * 1 with *ls = the cuBLASLt status; 2 with *cs = the CUDA error. */
static int lt_run(cuda_ctx *c, lt_plan *p, const cublasLtMatmulAlgo_t *algo, int64_t max_rows, const void *w,
                  const uint16_t *a16, int64_t T, const float *bias, float *y, float *d, cublasStatus_t *ls,
                  cudaError_t *cs) {
    const float one = 1.0f, zero = 0.0f;
    const int64_t chunk = lt_chunk(p, max_rows);
    for (int64_t r0 = 0; r0 < T; r0 += chunk) {
        const int64_t n = T - r0 < chunk ? T - r0 : chunk, rows = n * p->split;
        float *o = p->split == 2 ? d : y + r0 * p->N;
        cublasLtMatrixLayoutSetAttribute(p->b, CUBLASLT_MATRIX_LAYOUT_COLS, &rows, sizeof rows);
        cublasLtMatrixLayoutSetAttribute(p->d, CUBLASLT_MATRIX_LAYOUT_COLS, &rows, sizeof rows);
        *ls = cublasLtMatmul(c->lt, c->lt_desc, &one, w, p->a, a16 + r0 * p->split * p->K, p->b, &zero, o, p->d, o,
                             p->d, algo, c->lt_ws, c->lt_ws_bytes, c->st);
        if (*ls != CUBLAS_STATUS_SUCCESS) return 1;
        if (p->split == 2 && (*cs = ck_split_sum(d, n, p->N, bias, y + r0 * p->N, c->st)) != cudaSuccess) return 2;
    }
    return 0;
}

/* Milliseconds of one product of M rows with `algo` (NULL = the custom
 * kernel): best of 3 after a warm-up, or a huge value if it fails. */
static double time_candidate(cuda_ctx *c, lt_plan *p, const cublasLtMatmulAlgo_t *algo, int64_t max_rows,
                             const void *w, const uint16_t *a16, float *y, float *y2, int64_t M) {
    cudaEvent_t e0, e1;
    if (cudaEventCreate(&e0) != cudaSuccess) return 1e30;
    if (cudaEventCreate(&e1) != cudaSuccess) {
        cudaEventDestroy(e0);
        return 1e30;
    }
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        cudaEventRecord(e0, c->st);
        int ok;
        if (algo) {
            cublasStatus_t ls;
            cudaError_t cs;
            ok = lt_run(c, p, algo, max_rows, w, a16, M, NULL, p->split == 2 ? y2 : y, y, &ls, &cs) == 0;
        } else {
            ck_gemm_args g = {.mode = CK_GEMM_DENSE, .A = a16, .lda = p->K * p->split, .K = p->K, .split = p->split,
                              .N = p->N, .W = w, .M = M, .Y = y, .ldy = p->N, .big = M >= 1024};
            ok = ck_gemm(&g, c->st) == cudaSuccess;
        }
        cudaEventRecord(e1, c->st);
        float ms = 0;
        if (!ok || cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
            cudaGetLastError();
            best = 1e30;
            break;
        }
        if (rep > 0 && ms < best) best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return best;
}

/* Checks split-K candidate `algo` on this GPU before it may be chosen (the
 * split-K note above): on R = 64 random rows written at the start of a16
 * (MB rows room; y, y2 as for time_candidate), the R rows' result must be
 * bitwise the same twice, alone (row 0), and as the first rows of batches of
 * 300 and MB rows, and within 1e-4 (relative L2) of the custom kernel's.
 * Returns NULL if it passes, else what failed. */
static const char *lt_verify(cuda_ctx *c, lt_plan *p, const cublasLtMatmulAlgo_t *algo, int64_t max_rows,
                             const void *w, uint16_t *a16, float *y, float *y2, int64_t MB) {
    enum { R = 64 };
    const size_t na = (size_t)(R * p->split * p->K), ny = (size_t)(R * p->N);
    uint16_t *h = malloc(na * sizeof *h);
    float *ref = malloc(ny * sizeof *ref), *got = malloc(ny * sizeof *got);
    const char *why = NULL;
    if (!h || !ref || !got) {
        why = "out of host memory";
        goto done;
    }
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < na; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        h[i] = clef_f32_to_bf16((float)(int64_t)(s >> 40) / (float)(1 << 23) - 1.0f);
    }
    float *out = p->split == 2 ? y2 : y;
    ck_gemm_args g = {.mode = CK_GEMM_DENSE, .A = a16, .lda = p->K * p->split, .K = p->K, .split = p->split,
                      .N = p->N, .W = w, .M = R, .Y = out, .ldy = p->N};
    if (cudaMemcpyAsync(a16, h, na * sizeof *h, cudaMemcpyHostToDevice, c->st) != cudaSuccess ||
        ck_gemm(&g, c->st) != cudaSuccess ||
        cudaMemcpyAsync(ref, out, ny * sizeof *ref, cudaMemcpyDeviceToHost, c->st) != cudaSuccess ||
        cudaStreamSynchronize(c->st) != cudaSuccess) {
        why = "custom kernel reference failed";
        goto done;
    }
    /* the first run against the custom kernel; then it is the reference of the others */
    cublasStatus_t ls;
    cudaError_t cs;
    if (lt_run(c, p, algo, max_rows, w, a16, R, NULL, out, y, &ls, &cs) ||
        cudaMemcpyAsync(got, out, ny * sizeof *got, cudaMemcpyDeviceToHost, c->st) != cudaSuccess ||
        cudaStreamSynchronize(c->st) != cudaSuccess) {
        why = "a call failed";
        goto done;
    }
    double e2 = 0, r2 = 0;
    for (size_t i = 0; i < ny; i++) {
        const double d = (double)got[i] - ref[i];
        e2 += d * d, r2 += (double)ref[i] * ref[i];
    }
    if (!(e2 <= 1e-8 * r2)) {
        why = "differs from the custom kernel";
        goto done;
    }
    memcpy(ref, got, ny * sizeof *got);
    static const char *names[] = {"64 rows again", "1 row", "300 rows", "the big batch"};
    const int64_t ms[] = {R, 1, 300, MB};
    for (int k = 0; k < 4 && !why; k++) {
        const size_t n = (size_t)((ms[k] < R ? ms[k] : R) * p->N);
        if (lt_run(c, p, algo, max_rows, w, a16, ms[k], NULL, out, y, &ls, &cs) ||
            cudaMemcpyAsync(got, out, n * sizeof *got, cudaMemcpyDeviceToHost, c->st) != cudaSuccess ||
            cudaStreamSynchronize(c->st) != cudaSuccess)
            why = "a call failed";
        else if (memcmp(got, ref, n * sizeof *got) != 0)
            why = names[k];
    }
done:
    cudaGetLastError();
    free(h), free(ref), free(got);
    return why;
}

/* The algorithm for weight shape [N, K] (w: the weight), chosen once, so
 * each row is reduced the same way whatever the batch and the choice
 * depends only on the shape (split-K ones: see the note above lt_admit).
 * Candidates (cuBLASLt algorithms and the custom kernel) are timed at 300
 * and 8192 rows: 300 is the latency case (one decision of ~300 tokens),
 * 8192 the batched throughput case.  The pick minimises 2 x (slowdown at
 * 300 vs the best there) + (slowdown at 8192 vs the best there): the
 * latency case counts double, so an algorithm 10% faster at 300 rows may be
 * up to ~20% slower at 8192 (ties within 3%: the earlier, i.e. the
 * heuristic's order).  CLEF_CUDA_LT_SPLITK=2 allows only split-K algorithms
 * where a shape has any (tests).  CLEF_CUDA_LT_LOG=1 prints the timings,
 * split counts and reduction schemes. */
static lt_plan *lt_plan_for(cuda_ctx *c, int64_t N, int64_t K, int split, const void *w, clef_err *err) {
    for (size_t i = 0; i < c->n_plans; i++)
        if (c->plans[i].N == N && c->plans[i].K == K && c->plans[i].split == split) return &c->plans[i];
    lt_plan *np = grow_room(c->plans, &c->cap_plans, c->n_plans, sizeof *np, 32);
    if (!np) return host_oom(err), NULL;
    c->plans = np;
    lt_plan *p = &c->plans[c->n_plans];
    memset(p, 0, sizeof *p);
    p->N = N, p->K = K, p->split = split;
    if (lt_layout(&p->a, CUDA_R_16BF, K, N, K, err) || lt_layout(&p->b, CUDA_R_16BF, K, 4096, K, err) ||
        lt_layout(&p->d, CUDA_R_32F, N, 4096, N, err))
        return NULL;
    c->n_plans++;
    enum { MAXC = 64 };
    cublasLtMatmulAlgo_t cand[MAXC];
    int64_t rows[MAXC];
    const int nc = lt_candidates(c, p, cand, rows, MAXC);
    /* scratch for the timings: 8192 rows of activations and outputs */
    const int64_t MB = 8192, MS = 300;
    void *buf = NULL;
    const size_t a_bytes = ALIGN_UP((size_t)(MB * K * split) * 2, 256),
                 y_bytes = ALIGN_UP((size_t)(MB * N * split) * sizeof(float), 256),
                 y2_bytes = split == 2 ? (size_t)(MB * N) * sizeof(float) : 0;
    if (nc == 0 || cudaMallocAsync(&buf, a_bytes + y_bytes + y2_bytes, c->st) != cudaSuccess) {
        cudaGetLastError();
        return p; /* no usable cuBLASLt algorithm: the custom kernel */
    }
    /* 0x3c3c: bf16 0.0115 everywhere (not zeros, which run faster than real data) */
    cudaMemsetAsync(buf, 0x3c, a_bytes, c->st);
    uint16_t *a16 = buf;
    float *y = (float *)((char *)buf + a_bytes), *y2 = (float *)((char *)buf + a_bytes + y_bytes);
    double t[MAXC + 1][2], best[2] = {1e30, 1e30};
    uint32_t sk[MAXC + 1], sch[MAXC + 1];
    const char *bad[MAXC + 1];
    int any_splitk = 0;
    for (int i = 0; i <= nc; i++) { /* i == nc: the custom kernel */
        const cublasLtMatmulAlgo_t *al = i < nc ? &cand[i] : NULL;
        sk[i] = 1, sch[i] = CUBLASLT_REDUCTION_SCHEME_NONE, bad[i] = NULL;
        if (al) lt_algo_split(al, &sk[i], &sch[i]);
        if (sk[i] > 1) bad[i] = lt_verify(c, p, al, rows[i], w, a16, y, y2, MB);
        if (bad[i]) {
            t[i][0] = t[i][1] = 1e30;
            continue;
        }
        any_splitk |= sk[i] > 1;
        t[i][0] = time_candidate(c, p, al, al ? rows[i] : 0, w, a16, y, y2, MS);
        t[i][1] = time_candidate(c, p, al, al ? rows[i] : 0, w, a16, y, y2, MB);
        for (int j = 0; j < 2; j++)
            if (t[i][j] < best[j]) best[j] = t[i][j];
    }
    cudaFreeAsync(buf, c->st);
    const int only_splitk = c->k.lt_splitk == 2 && any_splitk;
    int pick = -1;
    double pick_cost = 1e30;
    for (int i = 0; i <= nc; i++) {
        if (i == nc && (c->gemm_lt_only || only_splitk)) break;
        if (bad[i] || (only_splitk && sk[i] == 1)) continue;
        const double cost = 2.0 * t[i][0] / best[0] + t[i][1] / best[1];
        if (cost < pick_cost * 0.97) {
            pick = i;
            pick_cost = cost;
        }
    }
    if (getenv("CLEF_CUDA_LT_LOG")) {
        for (int i = 0; i <= nc; i++) {
            char how[96];
            if (i == nc)
                snprintf(how, sizeof how, "custom kernel %d", i);
            else
                snprintf(how, sizeof how, "cublaslt algo %d (split-K %u %s, <= %lld rows a call)", i, sk[i],
                         lt_scheme_name(sch[i]), (long long)rows[i]);
            if (bad[i])
                fprintf(stderr, "clef cuda: [%lld x %lld]%s %s: rejected: %s\n", (long long)N, (long long)K,
                        split == 2 ? " split" : "", how, bad[i]);
            else
                fprintf(stderr, "clef cuda: [%lld x %lld]%s %s: %.1f us at %lld rows, %.1f us at %lld rows%s\n",
                        (long long)N, (long long)K, split == 2 ? " split" : "", how, 1e3 * t[i][0], (long long)MS,
                        1e3 * t[i][1], (long long)MB, i == pick ? "  <- chosen" : "");
        }
    }
    if (pick >= 0 && pick < nc) {
        p->algo = cand[pick];
        p->max_rows = rows[pick];
        p->ok = 1;
    }
    return p;
}

/* y[T, N] = bf16(x) . W^T through the fixed cuBLASLt algorithm of W's shape
 * (lt_run; the split plans' hi and lo rows go through SLOT_SPLIT_Y).  Each
 * stacked row is reduced by the same fixed algorithm whatever its
 * neighbours, so a row's result depends on that row only.  Bias added here
 * only for split plans. */
static int lt_matmul(cuda_ctx *c, lt_plan *p, const uint16_t *a16, int64_t T, const clef_weight *w,
                     const float *bias, float *y, clef_err *err) {
    float *d = NULL;
    if (p->split == 2) {
        const int64_t chunk = lt_chunk(p, p->max_rows);
        d = cu_slot(c, SLOT_SPLIT_Y, (size_t)(2 * (T < chunk ? T : chunk) * p->N) * sizeof(float), err);
        if (!d) return -1;
    }
    cublasStatus_t ls = CUBLAS_STATUS_SUCCESS;
    cudaError_t cs = cudaSuccess;
    const int rc = lt_run(c, p, &p->algo, p->max_rows, w->data, a16, T, p->split == 2 ? bias : NULL, y, d, &ls, &cs);
    return rc == 1 ? lt_check(ls, "matmul", err) : rc == 2 ? cu_check(cs, "split sum", err) : 0;
}

static int weight_plain_bf16_ok(const clef_weight *w, const char *what, clef_err *err) {
    if (w->quant.type != CLEF_QT_NONE || (w->dtype != CLEF_DT_BF16 && w->dtype != CLEF_DT_F32))
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "unsupported weight dtype on cuda: %s in %s",
                         w->quant.type != CLEF_QT_NONE ? clef_wqtype_name(w->quant.type) : clef_dtype_name(w->dtype),
                         what);
    if (w->dtype == CLEF_DT_BF16 && (w->cols % 8 || ((uintptr_t)w->data & 15)))
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                         "CUDA %s: weight [%lld,%lld] needs a multiple of 8 columns and 16-byte alignment", what,
                         (long long)w->rows, (long long)w->cols);
    return 0;
}

/* ---- packed quantized weights (cuda_qgemm.cu) ---------------------------- */

/* The kernel's view of a weight uploaded by cu_weight_init_packed. */
static ck_qmat qmat_of_weight(const clef_weight *w) {
    return (ck_qmat){.q = w->data, .scale = w->quant.scale, .zeros = w->quant.zeros, .global = w->quant.global};
}

/* The format fields of ck_qgemm_args from a packed weight (uploaded by c). */
static void qargs_format(const cuda_ctx *c, ck_qgemm_args *g, const clef_weight *w) {
    g->int4_reordered = c->int4_v2 ? 0 : c->int4_2blk ? 2 : 1;
    g->nvfp4_reordered = !c->nvfp4_v2;
    g->qtype = w->quant.type == CLEF_QT_NVFP4 ? CK_QT_NVFP4 : w->quant.type == CLEF_QT_FP8_BLOCK ? CK_QT_FP8 : CK_QT_INT4;
    g->global_div = w->quant.global_div;
    g->has_zeros = w->quant.zeros != NULL;
    g->group = w->quant.group;
    g->block_r = w->quant.block_r;
    g->block_c = w->quant.block_c;
}

/* matmul with a packed weight: bf16 activation rows ([hi | lo] in the precise
 * dense mode) times the weight dequantized tile by tile (ck_qgemm DENSE),
 * then the bias. */
static int cu_matmul_packed(cuda_ctx *c, const float *x, int64_t T, const clef_weight *w, const float *bias, float *y,
                            clef_err *err) {
    char name[64];
    snprintf(name, sizeof name, "matmul %s %lldx%lld", clef_wqtype_name(w->quant.type), (long long)w->rows,
             (long long)w->cols);
    op_begin(c, name, 1);
    const int64_t N = w->rows, K = w->cols;
    const int split = split_of(c, PRECISE_DENSE);
    const uint16_t *a16 = convert_rows(c, x, T, K, K, split, err);
    if (!a16) return op_end(c, -1);
    ck_qgemm_args g = {.mode = CK_GEMM_DENSE, .A = a16, .lda = K * split, .K = K, .split = split, .N = N,
                       .W = qmat_of_weight(w), .M = T, .Y = y, .ldy = N};
    qargs_format(c, &g, w);
    g.bm = ck_qgemm_bm(g.qtype, T, 1);
    g.tma = ck_packed_tma(&c->caps, &c->k, g.qtype, g.bm);
    int rc = cu_check(ck_qgemm(&g, c->st), "matmul (packed weight)", err);
    if (rc == 0 && bias) rc = cu_check(ck_add_bias(y, T, N, N, bias, c->st), "bias", err);
    cvt_clobber(c, y, (size_t)(T * N) * sizeof(float));
    return op_end(c, rc);
}

static int cu_matmul(clef_backend *be, const float *x, int64_t T, const clef_weight *w, const float *bias, float *y,
                     clef_err *err) {
    if (w->quant.type != CLEF_QT_NONE && T > 0 && w->rows > 0) return cu_matmul_packed(cu_of(be), x, T, w, bias, y, err);
    cuda_ctx *c = cu_of(be);
    if (T <= 0 || w->rows <= 0) return 0;
    char name[64];
    snprintf(name, sizeof name, "matmul %lldx%lld", (long long)w->rows, (long long)w->cols);
    op_begin(c, name, 1);
    if (weight_plain_bf16_ok(w, "matmul", err)) return op_end(c, -1);
    const int64_t N = w->rows, K = w->cols;
    int rc;
    if (w->dtype == CLEF_DT_F32) {
        c->cvt_valid = 0;
        rc = cu_check(ck_gemm_f32(x, T, K, w->data, N, bias, y, c->st), "matmul f32", err);
    } else {
        const int split = split_of(c, PRECISE_DENSE);
        const uint16_t *a16 = convert_rows(c, x, T, K, K, split, err);
        if (!a16) return op_end(c, -1);
        lt_plan *p = NULL;
        if (!c->gemm_custom && !((uintptr_t)y & 15) && !(N % 4) && !(split == 2 && bias && ((uintptr_t)bias & 15))) {
            p = lt_plan_for(c, N, K, split, w->data, err);
            if (!p) return op_end(c, -1);
        }
        if (p && p->ok) {
            rc = lt_matmul(c, p, a16, T, w, bias, y, err);
            if (rc == 0 && bias && split == 1) rc = cu_check(ck_add_bias(y, T, N, N, bias, c->st), "bias", err);
        } else {
            ck_gemm_args g = {.mode = CK_GEMM_DENSE, .A = a16, .lda = K * split, .K = K,
                              .split = split, .N = N, .W = w->data, .M = T, .bias = bias, .Y = y,
                              .ldy = N, .big = T >= 1024};
            rc = cu_check(ck_gemm(&g, c->st), "matmul", err);
        }
    }
    cvt_clobber(c, y, (size_t)(T * N) * sizeof(float)); /* y may overlap the rows cached as converted */
    return op_end(c, rc);
}

static int cu_gather(clef_backend *be, const clef_weight *table, const int32_t *ids, int64_t n, float *out,
                     clef_err *err) {
    cuda_ctx *c = cu_of(be);
    op_begin(c, "gather", 0);
    if (table->quant.type != CLEF_QT_NONE || (table->dtype != CLEF_DT_BF16 && table->dtype != CLEF_DT_F32))
        return op_end(c, clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "unsupported weight dtype on cuda: %s in gather",
                                   clef_dtype_name(table->dtype)));
    return op_end(c, cu_check(ck_gather(table->data, table->dtype == CLEF_DT_F32, table->rows, table->cols, ids, n, out,
                                        c->st),
                              "gather", err));
}

/* ---- thinker ops --------------------------------------------------------- */

static int cu_rmsnorm(clef_backend *be, const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps,
                      clef_err *err) {
    cuda_ctx *c = cu_of(be);
    op_begin(c, "rmsnorm", 0);
    return op_end(c, cu_check(ck_rmsnorm(x, w, y, rows, dim, eps, c->st), "rmsnorm", err));
}

static int cu_rope(clef_backend *be, float *x, int64_t T, int64_t heads, const int32_t *pos, const clef_rope_desc *r,
                   clef_err *err) {
    cuda_ctx *c = cu_of(be);
    const int64_t D = r->head_dim;
    if (D <= 0 || D % 2 || D > 4096)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA rope: head_dim %lld", (long long)D);
    op_begin(c, "rope", 0);
    return op_end(c, cu_check(ck_rope(x, T, heads, D, pos, r->section[1], r->section[2], r->inv_freq, c->st), "rope",
                              err));
}

/* The add, the norm and, for the product that reads y next, y's rows as
 * bf16 in SLOT_A16 (split by the dense products' mode) remembered as
 * converted: that matmul (and the router's, the experts') skips its own
 * conversion pass. */
static int cu_add_rmsnorm(clef_backend *be, float *h, const float *o, const float *w, float *y, int64_t rows,
                          int64_t dim, float eps, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    op_begin(c, o ? "add + rmsnorm" : "rmsnorm", 0);
    if (rows <= 0) return op_end(c, 0);
    const int split = split_of(c, PRECISE_DENSE);
    uint16_t *a16 = NULL;
    if (dim % 8 == 0) { /* the products' row alignment (ck_rows_to_bf16) */
        a16 = cu_slot(c, SLOT_A16, (size_t)rows * (size_t)dim * (size_t)split * 2, err);
        if (!a16) return op_end(c, -1);
    }
    if (cu_check(ck_add_rmsnorm(h, o, w, y, rows, dim, eps, a16, split, c->st), "add + rmsnorm", err))
        return op_end(c, -1);
    if (a16) cvt_remember(c, y, rows, dim, dim, split);
    return op_end(c, 0);
}

static int cu_qk_norm_rope(clef_backend *be, float *q, int64_t q_stride, float *k, int64_t k_stride, int64_t T,
                           int64_t nq, int64_t nk, const float *q_w, const float *k_w, float eps, const int32_t *pos,
                           const clef_rope_desc *r, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    const int64_t D = r->head_dim;
    if (D <= 0 || D % 2 || D > 1024 || nq < 0 || nk < 0 || nq + nk > 65535 || q_stride < nq * D || k_stride < nk * D)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                         "CUDA q/k norm + rope: %lld + %lld heads of %lld, strides %lld, %lld (heads of an even size "
                         "up to 1024, strides covering them)",
                         (long long)nq, (long long)nk, (long long)D, (long long)q_stride, (long long)k_stride);
    op_begin(c, "q/k norm + rope", 0);
    /* the tensor-core attention's head sizes: also leave q and k as the bf16 rows it reads (SLOT_ATT16, with
     * room for v after them), so that attention converts only v */
    const int split = split_of(c, PRECISE_ATTN), stage = attn_tc_head(D) && T > 0;
    uint16_t *q16 = NULL, *k16 = NULL;
    if (stage) {
        const size_t qn = (size_t)(T * nq * D) * split, kn = (size_t)(T * nk * D) * split;
        q16 = cu_slot(c, SLOT_ATT16, (qn + 2 * kn) * 2 + 64, err);
        if (!q16) return op_end(c, -1);
        k16 = q16 + qn;
    }
    const int rc = cu_check(ck_qk_norm_rope(q, q_stride, k, k_stride, T, (int)nq, (int)nk, q_w, k_w, eps, (int)D, pos,
                                            r->section[1], r->section[2], r->inv_freq, q16, k16, split, c->st),
                            "q/k norm + rope", err);
    if (rc == 0 && stage) {
        c->att = (att_stage){q, k, T, q_stride, k_stride, nq, nk, D, split};
        c->att_valid = 1;
    }
    return op_end(c, rc);
}

static int att_stage_eq(const att_stage *x, const att_stage *y) {
    return x->q == y->q && x->k == y->k && x->T == y->T && x->q_stride == y->q_stride && x->k_stride == y->k_stride &&
           x->nq == y->nq && x->nk == y->nk && x->D == y->D && x->split == y->split;
}

/* Segments of at most CK_ATTN_SHORT queries run the 64-row attention kernel (v2) in the precise mode
 * by default, longer ones the 128-row one (v2w): for a 300-token record 32 heads x 3 tiles of 128
 * rows leave most of the H200 idle (precise 1 x 300: 26.8 -> 26.0 ms with v2 everywhere, 1 x 1,000:
 * 56.7 -> 57.1).  A segment's variant depends on its own length only, so its result does not depend
 * on the batch around it. */

/* The attention variant of segment s (ck_attn_tc_rows): ck_pick_attention's for its length, which for a
 * causal segment is its key count (the record's length, whether or not a cached prefix leaves fewer
 * queries: the variants differ in their key tiles, so the prefix must not change the choice). */
static int attn_variant_of(const cuda_ctx *c, const clef_attn_desc *a, int64_t s, int split) {
    const int64_t len = a->causal ? a->kv_off[s + 1] - a->kv_off[s] : a->q_off[s + 1] - a->q_off[s];
    return ck_pick_attention(&c->k, split, len, a->scale > 0.0f);
}

/* Query tiles of the segments of variant `want` (rows bm) into t (pairs segment, first row; NULL: count
 * only), the heaviest (latest first row) first; returns how many. */
static int64_t attn_tiles(const cuda_ctx *c, const clef_attn_desc *a, int split, int want, int64_t bm, int32_t *t) {
    int64_t maxq = 0, m = 0;
    for (int64_t s = 0; s < a->n_seg; s++)
        if (attn_variant_of(c, a, s, split) == want && a->q_off[s + 1] - a->q_off[s] > maxq)
            maxq = a->q_off[s + 1] - a->q_off[s];
    for (int64_t i0 = ((maxq + bm - 1) / bm - 1) * bm; i0 >= 0; i0 -= bm)
        for (int64_t s = 0; s < a->n_seg; s++)
            if (attn_variant_of(c, a, s, split) == want && a->q_off[s + 1] - a->q_off[s] > i0) {
                if (t) t[2 * m] = (int32_t)s, t[2 * m + 1] = (int32_t)i0;
                m++;
            }
    return m;
}

/* Attention: offsets (and, on the tensor-core path, the 64- or 128-row query tiles,
 * heaviest first, per variant) staged in one copy; Q, K, V converted to bf16 rows. */
static int cu_attention(clef_backend *be, const float *q, const float *k, const float *v, float *out,
                        const clef_attn_desc *a, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    const int64_t nh = a->n_q_heads, nkv = a->n_kv_heads, D = a->head_dim, ns = a->n_seg;
    if (nh <= 0 || nkv <= 0 || nh % nkv || D <= 0 || ns < 0 || nh > 65535)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA attention: %lld query / %lld kv heads of %lld",
                         (long long)nh, (long long)nkv, (long long)D);
    const int tc = attn_tc_head(D), split = split_of(c, PRECISE_ATTN);
    /* default: v2 in the fast mode, v2w (128-row tiles) in the precise one for long segments: the fastest of
     * each on the H200 (CLEF_ATTN_BENCH: 8 x 4096 fast v2 214 vs v1 176 TFLOP/s; precise v2w 112, v1 108,
     * v2 95), v2 for the precise mode's short segments (CK_ATTN_SHORT) */
    const int ksplit = ck_attention_ksplit(&c->k, split);
    const int fixed = !(a->scale > 0.0f) ? 1 : c->k.attn == 4 && split != 1 ? 2 : c->k.attn;
    for (int64_t s = 0; s < ns; s++) {
        int64_t ql = a->q_off[s + 1] - a->q_off[s], kl = a->kv_off[s + 1] - a->kv_off[s];
        if (ql < 0 || kl < 0 || (ql > 0 && kl == 0) || (a->causal && ql > kl) || kl > INT32_MAX)
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                             "CUDA attention: segment %lld has %lld queries and %lld keys", (long long)s,
                             (long long)ql, (long long)kl);
    }
    const int64_t nq = ns ? a->q_off[ns] : 0, nk = ns ? a->kv_off[ns] : 0;
    if (nq == 0) return 0;
    /* the segments' variants: at most two kinds per call (v2, v2w), one launch each; the fast mode's v2
     * segments launched as v2s (bitwise v2) when their 128-row blocks would leave SMs idle */
    const int kinds[2] = {fixed ? fixed : 2, 3}, n_kinds = fixed || split != 2 ? 1 : 2;
    int launch[2] = {kinds[0], kinds[1]};
    int64_t nt[2] = {0, 0};
    for (int i = 0; tc && i < n_kinds; i++)
        nt[i] = attn_tiles(c, a, split, kinds[i], ck_attn_tc_rows(ksplit, kinds[i]), NULL);
    if (tc && kinds[0] == 2 && ck_attention_v2s(&c->k, split, nt[0] * nh, c->caps.sms)) {
        launch[0] = 4;
        nt[0] = attn_tiles(c, a, split, kinds[0], ck_attn_tc_rows(ksplit, 4), NULL);
    }
    /* q and k left converted by qk_norm_rope for exactly these rows (self-attention over all T rows) */
    const att_stage want = {q, k, nq, a->q_stride, a->k_stride, nh, nkv, D, split};
    const int staged = tc && c->att_valid && nk == nq && att_stage_eq(&c->att, &want);
    op_begin(c, !tc ? "attention (f32)" : split == 2 ? "attention (tensor cores, split)" : "attention (tensor cores)",
             0);
    const size_t off_bytes = (size_t)(ns + 1) * sizeof(int64_t);
    const size_t meta = 2 * off_bytes + (size_t)(nt[0] + nt[1]) * 2 * sizeof(int32_t);
    char *h = cu_host(c, meta, err);
    if (!h) return op_end(c, -1);
    memcpy(h, a->q_off, off_bytes);
    memcpy(h + off_bytes, a->kv_off, off_bytes);
    int32_t *ht = (int32_t *)(h + 2 * off_bytes);
    for (int i = 0; tc && i < n_kinds; i++)
        attn_tiles(c, a, split, kinds[i], ck_attn_tc_rows(ksplit, launch[i]), ht + (i ? 2 * nt[0] : 0));
    char *d = stage_meta(c, meta, err);
    if (!d) return op_end(c, -1);
    const int64_t *dq = (const int64_t *)d, *dk = (const int64_t *)(d + off_bytes);
    int rc;
    if (tc) {
        const size_t qn = (size_t)(nq * nh * D) * split, kn = (size_t)(nk * nkv * D) * split;
        uint16_t *b16 = cu_slot(c, SLOT_ATT16, (qn + 2 * kn) * 2 + 64, err);
        if (!b16) return op_end(c, -1);
        uint16_t *q16 = b16, *k16 = q16 + qn, *v16 = k16 + kn;
        const ck_rows_bf16_job cj = {.p = {{q, nq, nh * D, a->q_stride, q16},
                                            {k, nk, nkv * D, a->k_stride, k16},
                                            {v, nk, nkv * D, a->v_stride, v16}}};
        if (staged) {
            const ck_rows_bf16_job vj = {.p = {cj.p[2]}};
            rc = cu_check(ck_rows_to_bf16_multi(&vj, 1, split, c->st), "attention v to bf16", err);
        } else {
            rc = cu_check(ck_rows_to_bf16_multi(&cj, 3, split, c->st), "attention q, k, v to bf16", err);
        }
        /* contiguous output rows (the thinker's): also written as the bf16 rows the o product reads, which
         * then skips its conversion (convert_rows finds them remembered) */
        const int dsplit = split_of(c, PRECISE_DENSE);
        uint16_t *o16 = NULL;
        if (rc == 0 && a->o_stride == nh * D) {
            o16 = cu_slot(c, SLOT_A16, (size_t)(nq * nh * D) * (size_t)dsplit * 2, err);
            if (!o16) return op_end(c, -1);
        }
        const int32_t *dt = (const int32_t *)(d + 2 * off_bytes);
        for (int i = 0; rc == 0 && i < n_kinds; i++)
            if (nt[i] > 0)
                rc = cu_check(ck_attn_tc(q16, k16, v16, out, a->o_stride, o16, dsplit, dt + (i ? 2 * nt[0] : 0), nt[i],
                                         dq, dk, (int)nh, (int)nkv, (int)D, a->scale, a->causal, ksplit, launch[i],
                                         c->st),
                              "attention", err);
        if (rc == 0 && o16) cvt_remember(c, out, nq, nh * D, a->o_stride, dsplit);
    } else {
        rc = cu_check(ck_attn_f32(q, k, v, out, a->q_stride, a->k_stride, a->v_stride, a->o_stride, dq, dk, ns, nq,
                                  (int)nh, (int)nkv, (int)D, a->scale, a->causal, c->st),
                      "attention f32", err);
    }
    return op_end(c, rc);
}

static int cu_router_topk(clef_backend *be, const float *logits, int64_t T, int64_t E, int64_t k, int norm,
                          int32_t *idx, float *w, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    if (E <= 0 || k <= 0 || k > E || k > 64 || E > 8192)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA router: top-%lld of %lld experts", (long long)k,
                         (long long)E);
    op_begin(c, "router top-k", 1); /* the experts then reuse the rows the router matmul converted */
    cvt_clobber(c, idx, (size_t)(T * k) * sizeof(int32_t));
    cvt_clobber(c, w, (size_t)(T * k) * sizeof(float));
    return op_end(c, cu_check(ck_router_topk(logits, T, E, k, norm, idx, w, c->st), "router", err));
}

/* Whether the experts' tensor maps are made: a kernel that reads them is on (TMA below the wgmma
 * threshold, the persistent wgmma kernel above). */
static int expert_maps(const cuda_ctx *c) { return c->expert_maps_on; }

/* Device pointer arrays of a layer's experts (and, with expert_maps(c), their
 * tensor maps), uploaded once and re-checked against the layer's weights on
 * every use (cheap: host memory only). */
static const moe_ptrs *moe_pointers(cuda_ctx *c, const clef_moe_weights *ex, clef_err *err) {
    const int64_t E = ex->n_experts;
    moe_ptrs *m = NULL;
    for (size_t i = 0; i < c->n_moe && !m; i++)
        if (c->moe[i].gate == ex->gate && c->moe[i].up == ex->up && c->moe[i].down == ex->down && c->moe[i].E == E)
            m = &c->moe[i];
    if (m) {
        int same = 1;
        for (int64_t e = 0; e < E && same; e++)
            same = m->host[e] == ex->gate[e].data && m->host[E + e] == ex->up[e].data &&
                   m->host[2 * E + e] == ex->down[e].data;
        if (same) return m;
    } else {
        moe_ptrs *grown = grow_room(c->moe, &c->cap_moe, c->n_moe, sizeof *grown, 64);
        if (!grown) return host_oom(err), NULL;
        c->moe = grown;
        m = &c->moe[c->n_moe];
        memset(m, 0, sizeof *m);
        m->host = calloc((size_t)(3 * E), sizeof *m->host);
        if (expert_maps(c)) m->maps_host = aligned_alloc(64, (size_t)(3 * E) * sizeof(ck_tmap));
        if (!m->host || (expert_maps(c) && !m->maps_host)) {
            free(m->host);
            free(m->maps_host);
            return host_oom(err), NULL;
        }
        if (cu_check(cudaMalloc(&m->dev, (size_t)(3 * E) * sizeof(void *)), "expert table", err) ||
            (expert_maps(c) &&
             cu_check(cudaMalloc((void **)&m->maps_dev, (size_t)(3 * E) * sizeof(ck_tmap)), "expert table", err))) {
            if (m->dev) cudaFree(m->dev);
            free(m->host);
            free(m->maps_host);
            return NULL;
        }
        m->gate = ex->gate, m->up = ex->up, m->down = ex->down, m->E = E;
        c->n_moe++;
    }
    for (int64_t e = 0; e < E; e++) {
        const clef_weight *ws[3] = {&ex->gate[e], &ex->up[e], &ex->down[e]};
        for (int j = 0; j < 3; j++) {
            if (weight_plain_bf16_ok(ws[j], "moe", err)) return NULL;
            if (ws[j]->dtype != CLEF_DT_BF16) {
                clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "unsupported weight dtype on cuda: %s experts",
                          clef_dtype_name(ws[j]->dtype));
                return NULL;
            }
        }
        m->host[e] = ex->gate[e].data;
        m->host[E + e] = ex->up[e].data;
        m->host[2 * E + e] = ex->down[e].data;
    }
    /* host arrays owned by the table: the copies are staged before the calls return */
    if (cu_check(cudaMemcpyAsync(m->dev, m->host, (size_t)(3 * E) * sizeof(void *), cudaMemcpyHostToDevice, c->st),
                 "expert table", err))
        return NULL;
    /* gate / up boxes of 64 rows (the 64 gate + 64 up columns of a tile), down of 128.  Changed
     * pointers re-encode the maps into the same device buffer between kernel launches (no device-side
     * tensormap fence); test_moe_tma uploads its experts afresh for every run and stays bitwise the
     * mma.sync kernel, and serving never changes a layer's pointers. */
    if (expert_maps(c)) {
        m->maps_ok = 1;
        for (int64_t i = 0; i < 3 * E && m->maps_ok; i++) {
            const clef_weight *w = i < E ? &ex->gate[i] : i < 2 * E ? &ex->up[i - E] : &ex->down[i - 2 * E];
            m->maps_ok = ck_tmap_bf16(&m->maps_host[i], m->host[i], w->rows, w->cols, i < 2 * E ? 64 : 128) ==
                         cudaSuccess;
        }
        if (m->maps_ok && cu_check(cudaMemcpyAsync(m->maps_dev, m->maps_host, (size_t)(3 * E) * sizeof(ck_tmap),
                                                   cudaMemcpyHostToDevice, c->st),
                                   "expert table", err))
            return NULL;
    }
    return m;
}

/* Tokens per pass of the expert block: bounds the permuted expert outputs
 * (chunk * k * hidden f32: 512 MiB at 8192 x 8 x 2048) whatever the batch.
 * A token's result does not depend on the tokens beside it, so chunking
 * changes no value. */
#define MOE_CHUNK_TOKENS 8192

/* The routing plan of one pass of the expert block (ck_moe_plan): tokens
 * permuted by expert into tiles of BM rows, as device arrays carved from
 * SLOT_MOE_IX: per-expert row ends, the source token of each permuted row,
 * each (token, slot)'s permuted row, and each tile's expert and first row. */
typedef struct moe_plan {
    int32_t *end, *row_tok, *slot_pos, *t_exp, *t_row, *n_tiles;
    int64_t max_tiles;
} moe_plan;

static int moe_plan_make(cuda_ctx *c, const int32_t *idx, int64_t T, int64_t k, int64_t E, int BM, moe_plan *p,
                         clef_err *err) {
    const int64_t TK = T * k;
    p->max_tiles = (TK + BM - 1) / BM + E;
    int32_t *ix = cu_slot(c, SLOT_MOE_IX, (size_t)(2 * E + 2 * TK + 2 * p->max_tiles + 1) * sizeof(int32_t), err);
    if (!ix) return -1;
    int32_t *cnt = ix;
    p->end = cnt + E, p->row_tok = p->end + E, p->slot_pos = p->row_tok + TK, p->t_exp = p->slot_pos + TK;
    p->t_row = p->t_exp + p->max_tiles, p->n_tiles = p->t_row + p->max_tiles;
    return cu_check(ck_moe_plan(idx, T, (int)k, (int)E, BM, cnt, p->end, p->row_tok, p->slot_pos, p->t_exp, p->t_row,
                                p->n_tiles, c->st),
                    "moe permutation", err);
}

/* The ordered combine of a pass's expert outputs yp into y [T, H]: y never
 * overlaps the expert input, so rows converted for the next pass (a later
 * chunk of the same input) stay valid.  Under moe_add_rmsnorm (c->tail.on)
 * y is the pass's rows of the norm's output instead: h's rows += the
 * combined rows, y = their norm (one kernel where the wide norm's shape
 * allows, else the combine into y then add_rmsnorm over y in place: each
 * of its threads reads its elements of o before it writes them to y). */
static int moe_combine(cuda_ctx *c, const float *yp, const int32_t *idx, const float *w, const int32_t *slot_pos,
                       int64_t T, int64_t k, int64_t H, float *y, clef_err *err) {
    if (c->tail.on) {
        op_begin(c, "moe: combine + add + rmsnorm", 1);
        const int64_t r0 = (int64_t)(y - c->tail.y) / H;
        float *h = c->tail.h + r0 * H;
        uint16_t *a16 = c->tail.a16 ? c->tail.a16 + (size_t)r0 * (size_t)H * (size_t)c->tail.split : NULL;
        int rc;
        if (ck_moe_combine_norm_fits(yp, h, c->tail.nw, y, H))
            rc = cu_check(ck_moe_combine_norm(yp, idx, w, slot_pos, T, (int)k, H, h, c->tail.nw, y, a16, c->tail.split,
                                              c->tail.eps, c->st),
                          "moe combine + add + rmsnorm", err);
        else
            rc = cu_check(ck_moe_combine(yp, idx, w, slot_pos, T, (int)k, H, y, c->st), "moe combine", err) ||
                 cu_check(ck_add_rmsnorm(h, y, c->tail.nw, y, T, H, c->tail.eps, a16, c->tail.split, c->st),
                          "moe add + rmsnorm", err);
        if (!c->tail.a16) cvt_clobber(c, y, (size_t)(T * H) * sizeof(float));
        return op_end(c, rc ? -1 : 0);
    }
    op_begin(c, "moe: combine", 1);
    const int rc = cu_check(ck_moe_combine(yp, idx, w, slot_pos, T, (int)k, H, y, c->st), "moe combine", err);
    cvt_clobber(c, y, (size_t)(T * H) * sizeof(float));
    return op_end(c, rc);
}

/* The start of an expert pass (moe_pass, moe_pass_packed; inside their "moe: permutation" op, which
 * this ends): the permutation plan of the T x k routing into tiles of BM rows (*pl), then the T token
 * rows x [T, H] as bf16 rows of split halves (op "moe: input to bf16").  The rows (workspace), or NULL
 * with err set. */
static const uint16_t *moe_pass_begin(cuda_ctx *c, const float *x, int64_t T, const int32_t *idx, int64_t k, int64_t E,
                                      int64_t H, int BM, int split, moe_plan *pl, clef_err *err) {
    if (moe_plan_make(c, idx, T, k, E, BM, pl, err)) return op_end(c, -1), NULL;
    op_end(c, 0);
    op_begin(c, "moe: input to bf16", 1);
    const uint16_t *a16 = convert_rows(c, x, T, H, H, split, err);
    op_end(c, a16 ? 0 : -1);
    return a16;
}

/* ck_gemm_wgmma_ws in CTA pairs (CLEF_CUDA_WGMMA_WS=2) */
static cudaError_t ws_pairs(const ck_gemm_args *a, cudaStream_t st) { return ck_gemm_wgmma_ws_opts(a, CK_WS_PAIRS, st); }

/* One pass of the grouped expert block over T tokens: permutation on the
 * device, the gate/up GEMM with SwiGLU fused, the down GEMM, the ordered
 * combine. */
static int moe_pass(cuda_ctx *c, const float *x, int64_t T, const int32_t *idx, const float *w, int64_t k,
                    const clef_moe_weights *ex, const moe_ptrs *tab, float *y, clef_err *err) {
    const void *const *ptrs = (const void *const *)tab->dev;
    const int64_t E = ex->n_experts, H = ex->hidden, NI = ex->inter, TK = T * k;
    op_begin(c, "moe: permutation", 1);
    const int split = split_of(c, PRECISE_EXPERTS);
    /* kernel and tile rows (cuda_select.h): wgmma for big passes (on its persistent warp-specialised form
     * where the tensor maps exist), the TMA kernel (32- and 64-row tiles) below, mma.sync where neither
     * runs; bitwise the same sums */
    const ck_experts_pick pick = ck_pick_experts(&c->caps, &c->k, TK, E, H, NI, split, tab->maps_ok);
    const int big = pick.big, BM = pick.bm;
    cudaError_t (*const gemm)(const ck_gemm_args *, cudaStream_t) =
        pick.kernel == CK_EXPERTS_WGMMA_WS_PAIRS ? ws_pairs
        : pick.kernel == CK_EXPERTS_WGMMA_WS     ? ck_gemm_wgmma_ws
        : pick.kernel == CK_EXPERTS_WGMMA        ? ck_gemm_wgmma
        : pick.kernel == CK_EXPERTS_TMA          ? ck_gemm_tma
                                                 : ck_gemm;
    moe_plan pl;
    const uint16_t *a16 = moe_pass_begin(c, x, T, idx, k, E, H, BM, split, &pl, err);
    if (!a16) return -1;
    int32_t *end = pl.end, *row_tok = pl.row_tok, *slot_pos = pl.slot_pos, *t_exp = pl.t_exp, *t_row = pl.t_row,
            *n_tiles = pl.n_tiles;
    const int64_t max_tiles = pl.max_tiles;

    op_begin(c, "moe: gate+up GEMM (SwiGLU)", 1);
    uint16_t *hbuf = cu_slot(c, SLOT_MOE_H, (size_t)TK * (size_t)(NI * split) * 2, err);
    if (!hbuf) return op_end(c, -1);
    ck_gemm_args g = {.mode = CK_GEMM_GATEUP, .A = a16, .lda = H * split, .K = H, .split = split, .N = NI,
                      .W0 = (const uint16_t *const *)ptrs, .W1 = (const uint16_t *const *)(ptrs + E),
                      .tile_expert = t_exp, .tile_row0 = t_row, .expert_end = end, .n_tiles = n_tiles,
                      .max_tiles = max_tiles, .row_src = row_tok, .H = hbuf, .big = big, .wmaps = tab->maps_dev,
                      .n_experts = E};
    if (cu_check(gemm(&g, c->st), "moe gate/up", err))
        return op_end(c, -1);
    op_end(c, 0);

    op_begin(c, "moe: down GEMM", 1);
    float *yp = cu_slot(c, SLOT_MOE_Y, (size_t)TK * (size_t)H * sizeof(float), err);
    if (!yp) return op_end(c, -1);
    ck_gemm_args d = {.mode = CK_GEMM_DOWN, .A = hbuf, .lda = NI * split, .K = NI, .split = split, .N = H,
                      .W0 = (const uint16_t *const *)(ptrs + 2 * E), .tile_expert = t_exp, .tile_row0 = t_row,
                      .expert_end = end, .n_tiles = n_tiles, .max_tiles = max_tiles, .Y = yp, .ldy = H, .big = big,
                      .wmaps = tab->maps_dev ? tab->maps_dev + 2 * E : NULL, .n_experts = E};
    if (cu_check(gemm(&d, c->st), "moe down", err))
        return op_end(c, -1);
    op_end(c, 0);

    return moe_combine(c, yp, idx, w, slot_pos, T, k, H, y, err);
}

/* The device table of a layer's packed experts (uploaded once, re-checked
 * against the weights on every use); every expert must share one format. */
static const ck_qmat *qmoe_table(cuda_ctx *c, const clef_moe_weights *ex, clef_err *err) {
    const int64_t E = ex->n_experts;
    const clef_weight *w0 = &ex->gate[0];
    for (int64_t e = 0; e < E; e++) {
        const clef_weight *ws[3] = {&ex->gate[e], &ex->up[e], &ex->down[e]};
        for (int j = 0; j < 3; j++) {
            const clef_weight *v = ws[j];
            const int64_t rr = j == 2 ? ex->hidden : ex->inter, cc = j == 2 ? ex->inter : ex->hidden;
            if (v->quant.type != w0->quant.type || v->quant.global_div != w0->quant.global_div ||
                v->quant.group != w0->quant.group || v->quant.block_r != w0->quant.block_r ||
                v->quant.block_c != w0->quant.block_c || (v->quant.zeros != NULL) != (w0->quant.zeros != NULL) ||
                v->rows != rr || v->cols != cc) {
                clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                          "CUDA moe: expert %lld %s is %s [%lld,%lld]; every expert of a layer must be %s [%lld,%lld] "
                          "with the same scale layout", (long long)e, j == 0 ? "gate" : j == 1 ? "up" : "down",
                          clef_wqtype_name(v->quant.type), (long long)v->rows, (long long)v->cols,
                          clef_wqtype_name(w0->quant.type), (long long)rr, (long long)cc);
                return NULL;
            }
        }
    }
    qmoe_tab *m = NULL;
    for (size_t i = 0; i < c->n_qmoe && !m; i++)
        if (c->qmoe[i].gate == ex->gate && c->qmoe[i].up == ex->up && c->qmoe[i].down == ex->down && c->qmoe[i].E == E)
            m = &c->qmoe[i];
    if (!m) {
        qmoe_tab *grown = grow_room(c->qmoe, &c->cap_qmoe, c->n_qmoe, sizeof *grown, 64);
        if (!grown) return host_oom(err), NULL;
        c->qmoe = grown;
        m = &c->qmoe[c->n_qmoe];
        memset(m, 0, sizeof *m);
        m->host = calloc((size_t)(3 * E), sizeof *m->host);
        if (!m->host) return host_oom(err), NULL;
        if (cu_check(cudaMalloc(&m->dev, (size_t)(3 * E) * sizeof(ck_qmat)), "expert table", err)) {
            free(m->host);
            return NULL;
        }
        m->gate = ex->gate, m->up = ex->up, m->down = ex->down, m->E = E;
        c->n_qmoe++;
        note_usage(c);
    } else {
        int same = 1;
        for (int64_t e = 0; e < E && same; e++) {
            const ck_qmat a = qmat_of_weight(&ex->gate[e]), b = qmat_of_weight(&ex->up[e]),
                          d = qmat_of_weight(&ex->down[e]);
            same = !memcmp(&m->host[e], &a, sizeof a) && !memcmp(&m->host[E + e], &b, sizeof b) &&
                   !memcmp(&m->host[2 * E + e], &d, sizeof d);
        }
        if (same) return m->dev;
    }
    for (int64_t e = 0; e < E; e++) {
        m->host[e] = qmat_of_weight(&ex->gate[e]);
        m->host[E + e] = qmat_of_weight(&ex->up[e]);
        m->host[2 * E + e] = qmat_of_weight(&ex->down[e]);
    }
    if (cu_check(cudaMemcpyAsync(m->dev, m->host, (size_t)(3 * E) * sizeof(ck_qmat), cudaMemcpyHostToDevice, c->st),
                 "expert table", err))
        return NULL;
    return m->dev;
}

/* moe_pass with packed experts: the same permutation (tiles of ck_qgemm_bm rows), the
 * packed gate/up GEMM with the SwiGLU fused, the packed down GEMM, the same
 * ordered combine. */
static int moe_pass_packed(cuda_ctx *c, const float *x, int64_t T, const int32_t *idx, const float *w, int64_t k,
                           const clef_moe_weights *ex, const ck_qmat *tab, float *y, clef_err *err) {
    const int64_t E = ex->n_experts, H = ex->hidden, NI = ex->inter, TK = T * k;
    op_begin(c, "moe: permutation", 1);
    ck_qgemm_args fmt = {0};
    qargs_format(c, &fmt, &ex->gate[0]);
    const int split = split_of(c, PRECISE_EXPERTS);
    /* the wgmma kernel (128-row tiles) under the bf16 rule of moe_pass, when both products qualify
     * (cuda_select.h ck_pick_packed) */
    ck_qgemm_args fg = {.mode = CK_GEMM_GATEUP, .lda = H * split, .K = H, .split = split, .N = NI},
                  fd = {.mode = CK_GEMM_DOWN, .lda = NI * split, .K = NI, .split = split, .N = H};
    qargs_format(c, &fg, &ex->gate[0]);
    qargs_format(c, &fd, &ex->down[0]);
    const ck_packed_pick pick = ck_pick_packed(&c->caps, &c->k, fmt.qtype, TK, E, split,
                                               ck_qgemm_wgmma_fits(&fg) && ck_qgemm_wgmma_fits(&fd), 0, 0);
    const int wg = pick.kernel == CK_PACKED_WGMMA, tma = pick.kernel == CK_PACKED_TMA,
              v5 = pick.kernel == CK_PACKED_SKINNY, BM = pick.bm;
    moe_plan pl;
    const uint16_t *a16 = moe_pass_begin(c, x, T, idx, k, E, H, BM, split, &pl, err);
    if (!a16) return -1;
    int32_t *end = pl.end, *row_tok = pl.row_tok, *slot_pos = pl.slot_pos, *t_exp = pl.t_exp, *t_row = pl.t_row,
            *n_tiles = pl.n_tiles;
    const int64_t max_tiles = pl.max_tiles;

    op_begin(c,
             wg    ? "moe: packed gate+up GEMM (SwiGLU, wgmma)"
             : tma ? "moe: packed gate+up GEMM (SwiGLU, v4)"
             : v5  ? "moe: packed gate+up GEMM (SwiGLU, v5)"
                   : "moe: packed gate+up GEMM (SwiGLU)",
             1);
    uint16_t *hbuf = cu_slot(c, SLOT_MOE_H, (size_t)TK * (size_t)(NI * split) * 2, err);
    if (!hbuf) return op_end(c, -1);
    ck_qgemm_args g = {.mode = CK_GEMM_GATEUP, .A = a16, .lda = H * split, .K = H, .split = split, .N = NI,
                       .W0 = tab, .W1 = tab + E, .tile_expert = t_exp, .tile_row0 = t_row, .expert_end = end,
                       .n_tiles = n_tiles, .max_tiles = max_tiles, .row_src = row_tok, .H = hbuf};
    qargs_format(c, &g, &ex->gate[0]);
    g.bm = BM;
    g.tma = tma;
    g.skinny = v5;
    if (cu_check(wg ? ck_qgemm_wgmma(&g, c->st) : ck_qgemm(&g, c->st), "moe packed gate/up", err)) return op_end(c, -1);
    op_end(c, 0);

    op_begin(c,
             wg    ? "moe: packed down GEMM (wgmma)"
             : tma ? "moe: packed down GEMM (v4)"
             : v5  ? "moe: packed down GEMM (v5)"
                   : "moe: packed down GEMM",
             1);
    float *yp = cu_slot(c, SLOT_MOE_Y, (size_t)TK * (size_t)H * sizeof(float), err);
    if (!yp) return op_end(c, -1);
    ck_qgemm_args d = {.mode = CK_GEMM_DOWN, .A = hbuf, .lda = NI * split, .K = NI, .split = split, .N = H,
                       .W0 = tab + 2 * E, .tile_expert = t_exp, .tile_row0 = t_row, .expert_end = end,
                       .n_tiles = n_tiles, .max_tiles = max_tiles, .Y = yp, .ldy = H};
    qargs_format(c, &d, &ex->down[0]);
    d.bm = BM;
    d.tma = tma;
    d.skinny = v5;
    if (cu_check(wg ? ck_qgemm_wgmma(&d, c->st) : ck_qgemm(&d, c->st), "moe packed down", err)) return op_end(c, -1);
    op_end(c, 0);

    return moe_combine(c, yp, idx, w, slot_pos, T, k, H, y, err);
}

/* moe_pass_packed for FP8-block experts with CLEF_CUDA_FP8_MMA=1 (W8A8,
 * cuda_fp8mma.cu): the permutation (128-row tiles at every pass size: one
 * kernel shape, so batch composition changes no value), the input rows
 * quantized per token per 128 columns (E4M3 + f32 scales), the gate/up
 * product on the FP8 tensor cores with the SwiGLU into bf16 rows, those rows
 * quantized the same way, the down product, the ordered combine.  The
 * precise / fast expert setting does not apply (activations are FP8). */
static int moe_pass_fp8mma(cuda_ctx *c, const float *x, int64_t T, const int32_t *idx, const float *w, int64_t k,
                           const clef_moe_weights *ex, const ck_qmat *tab, float *y, clef_err *err) {
    const int64_t E = ex->n_experts, H = ex->hidden, NI = ex->inter, TK = T * k;
    op_begin(c, "moe: permutation", 1);
    moe_plan pl;
    if (moe_plan_make(c, idx, T, k, E, 128, &pl, err)) return op_end(c, -1);
    op_end(c, 0);

    /* SLOT_FP8: [x codes T x H][x scales T x H/128][h codes TK x NI][h scales TK x NI/128], 256-byte aligned parts */
    const size_t bx = ALIGN_UP((size_t)(T * H), 256), bxs = ALIGN_UP((size_t)(T * (H / 128)) * 4, 256),
                 bh = ALIGN_UP((size_t)(TK * NI), 256), bhs = ALIGN_UP((size_t)(TK * (NI / 128)) * 4, 256);
    unsigned char *f8 = cu_slot(c, SLOT_FP8, bx + bxs + bh + bhs, err);
    if (!f8) return -1;
    uint8_t *qx = f8, *qh = f8 + bx + bxs;
    float *sx = (float *)(f8 + bx), *sh = (float *)(f8 + bx + bxs + bh);

    op_begin(c, "moe: input to fp8", 1);
    if (cu_check(ck_fp8_quant_rows(x, 0, T, H, H, qx, sx, c->st), "moe input to fp8", err)) return op_end(c, -1);
    op_end(c, 0);

    op_begin(c, "moe: fp8 gate+up GEMM (SwiGLU, fp8 wgmma)", 1);
    uint16_t *hbuf = cu_slot(c, SLOT_MOE_H, (size_t)TK * (size_t)NI * 2, err);
    if (!hbuf) return op_end(c, -1);
    ck_fp8mma_args g = {.mode = CK_GEMM_GATEUP, .A = qx, .As = sx, .K = H, .N = NI, .W0 = tab, .W1 = tab + E,
                        .tile_expert = pl.t_exp, .tile_row0 = pl.t_row, .expert_end = pl.end, .n_tiles = pl.n_tiles,
                        .max_tiles = pl.max_tiles, .row_src = pl.row_tok, .H = hbuf};
    if (cu_check(ck_fp8mma(&g, c->st), "moe fp8 gate/up", err)) return op_end(c, -1);
    op_end(c, 0);

    op_begin(c, "moe: intermediate to fp8", 1);
    if (cu_check(ck_fp8_quant_rows(hbuf, 1, TK, NI, NI, qh, sh, c->st), "moe intermediate to fp8", err))
        return op_end(c, -1);
    op_end(c, 0);

    op_begin(c, "moe: fp8 down GEMM (fp8 wgmma)", 1);
    float *yp = cu_slot(c, SLOT_MOE_Y, (size_t)TK * (size_t)H * sizeof(float), err);
    if (!yp) return op_end(c, -1);
    ck_fp8mma_args d = {.mode = CK_GEMM_DOWN, .A = qh, .As = sh, .K = NI, .N = H, .W0 = tab + 2 * E,
                        .tile_expert = pl.t_exp, .tile_row0 = pl.t_row, .expert_end = pl.end, .n_tiles = pl.n_tiles,
                        .max_tiles = pl.max_tiles, .Y = yp, .ldy = H};
    if (cu_check(ck_fp8mma(&d, c->st), "moe fp8 down", err)) return op_end(c, -1);
    op_end(c, 0);

    return moe_combine(c, yp, idx, w, pl.slot_pos, T, k, H, y, err);
}

/* Whether a layer's packed experts run as W8A8 (moe_pass_fp8mma): ck_pick_packed's choice. */
static int fp8mma_layer(const cuda_ctx *c, const clef_moe_weights *ex) {
    const clef_weight *g = &ex->gate[0], *d = &ex->down[0];
    if (g->quant.type != CLEF_QT_FP8_BLOCK) return 0;
    const int fits = ck_fp8mma_fits(ex->hidden, ex->inter, g->quant.block_r, g->quant.block_c) &&
                     ck_fp8mma_fits(ex->inter, ex->hidden, d->quant.block_r, d->quant.block_c);
    return ck_pick_packed(&c->caps, &c->k, CK_QT_FP8, 0, ex->n_experts, 1, 0, c->fp8_mma, fits).kernel ==
           CK_PACKED_FP8MMA;
}

/* The moe op with packed experts (called by cu_moe after its checks). */
static int cu_moe_packed(cuda_ctx *c, const float *x, int64_t T, const int32_t *idx, const float *w, int64_t k,
                         const clef_moe_weights *ex, float *y, clef_err *err) {
    const int64_t H = ex->hidden;
    if (H % 16 || ex->inter % 16)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA moe: packed experts need hidden and inter %% 16 == 0");
    op_begin(c, "moe: expert table", 1);
    const ck_qmat *tab = qmoe_table(c, ex, err);
    op_end(c, 0);
    if (!tab) return -1;
    for (int64_t t0 = 0; t0 < T; t0 += MOE_CHUNK_TOKENS) {
        const int64_t n = T - t0 < MOE_CHUNK_TOKENS ? T - t0 : MOE_CHUNK_TOKENS;
        if ((fp8mma_layer(c, ex) ? moe_pass_fp8mma : moe_pass_packed)(c, x + t0 * H, n, idx + t0 * k, w + t0 * k, k, ex,
                                                                       tab, y + t0 * H, err) != 0)
            return -1;
    }
    return 0;
}

static int moe_resident(cuda_ctx *c, const float *x, int64_t T, const int32_t *idx, const float *w, int64_t k,
                        const clef_moe_weights *ex, float *y, clef_err *err);

/* Grouped expert block (backend.h moe), in passes of MOE_CHUNK_TOKENS tokens. */
static int cu_moe(clef_backend *be, const float *x, int64_t T, const int32_t *idx, const float *w, int64_t k,
                  const clef_moe_weights *ex, float *y, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    const int64_t E = ex->n_experts, H = ex->hidden, NI = ex->inter;
    if (T <= 0) return 0;
    if (k <= 0 || k > 64 || k > E || E > 65535 || H % 8 || NI % 8 || T * k > INT32_MAX / 2)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA moe: %lld of %lld experts, hidden %lld, inter %lld",
                         (long long)k, (long long)E, (long long)H, (long long)NI);
    const int si = cu_sx_find(c, ex); /* a streamed layer: its bytes into its slot first */
    if (si >= 0) {
        op_begin(c, "moe: streamed-expert wait", 1);
        if (op_end(c, cu_sx_before(c, si, err))) return -1;
        const int rc = moe_resident(c, x, T, idx, w, k, ex, y, err);
        return rc ? rc : cu_sx_after(c, si, err);
    }
    return moe_resident(c, x, T, idx, w, k, ex, y, err);
}

/* cu_moe over weights in device memory (resident, or a streamed layer's slot once filled). */
static int moe_resident(cuda_ctx *c, const float *x, int64_t T, const int32_t *idx, const float *w, int64_t k,
                        const clef_moe_weights *ex, float *y, clef_err *err) {
    const int64_t H = ex->hidden;
    if (ex->gate[0].quant.type != CLEF_QT_NONE) return cu_moe_packed(c, x, T, idx, w, k, ex, y, err);
    op_begin(c, "moe: expert table", 1);
    const moe_ptrs *tab = moe_pointers(c, ex, err);
    op_end(c, 0);
    if (!tab) return -1;
    for (int64_t t0 = 0; t0 < T; t0 += MOE_CHUNK_TOKENS) {
        const int64_t n = T - t0 < MOE_CHUNK_TOKENS ? T - t0 : MOE_CHUNK_TOKENS;
        if (moe_pass(c, x + t0 * H, n, idx + t0 * k, w + t0 * k, k, ex, tab, y + t0 * H, err) != 0) return -1;
    }
    return 0;
}

/* backend.h moe_add_rmsnorm: cu_moe with every pass's combine fused with the residual add and the norm
 * (moe_combine under c->tail).  y's rows are also left as the next product's bf16 rows (SLOT_A16, as
 * cu_add_rmsnorm leaves them) when every pass finds its input rows already converted there in the same
 * split (x's rows, all T, by the norm before the router): then no pass converts into SLOT_A16 after an
 * earlier pass's combine wrote its rows there. */
static int cu_moe_add_rmsnorm(clef_backend *be, const float *x, int64_t T, const int32_t *idx, const float *w,
                              int64_t k, const clef_moe_weights *ex, float *h, const float *nw, float eps, float *y,
                              clef_err *err) {
    cuda_ctx *c = cu_of(be);
    if (T <= 0) return 0;
    const int64_t H = ex->hidden;
    const int split = split_of(c, PRECISE_DENSE);
    /* x's rows from the start of the slot (so y's, written over them, are the slot's rows from its start) */
    const uint16_t *xr = converted_rows(c, x, T, H, H, split);
    const int keep = H % 8 == 0 && split == split_of(c, PRECISE_EXPERTS) && xr && xr == c->slot[SLOT_A16];
    c->tail.on = 1, c->tail.h = h, c->tail.y = y, c->tail.nw = nw, c->tail.eps = eps, c->tail.split = split;
    c->tail.a16 = keep ? (uint16_t *)c->slot[SLOT_A16] : NULL;
    const int rc = cu_moe(be, x, T, idx, w, k, ex, y, err);
    c->tail.on = 0;
    /* (without keep every pass's combine already forgot the rows it overwrote) */
    if (rc == 0 && keep) cvt_remember(c, y, T, H, H, split);
    return rc;
}

static int cu_swiglu(clef_backend *be, const float *g, const float *u, float *out, int64_t n, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    op_begin(c, "swiglu", 0);
    return op_end(c, cu_check(ck_swiglu(g, u, out, n, c->st), "swiglu", err));
}

static int cu_add(clef_backend *be, const float *a, const float *b, float *y, int64_t rows, int64_t dim,
                  int64_t b_stride, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    op_begin(c, "add", 0);
    return op_end(c, cu_check(ck_add(a, b, y, rows, dim, b_stride, c->st), "add", err));
}

/* ---- head ops ------------------------------------------------------------ */

static int cu_layernorm(clef_backend *be, const float *x, const float *w, const float *b, float *y, int64_t rows,
                        int64_t dim, float eps, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    op_begin(c, "layernorm", 0);
    return op_end(c, cu_check(ck_layernorm(x, w, b, y, rows, dim, eps, c->st), "layernorm", err));
}

static int cu_gelu(clef_backend *be, const float *x, float *y, int64_t n, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    op_begin(c, "gelu", 0);
    return op_end(c, cu_check(ck_gelu(x, y, n, c->st), "gelu", err));
}

static int cu_span_mean(clef_backend *be, const float *x, int64_t dim, const clef_row_span *spans, int64_t n,
                        float *out, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    for (int64_t i = 0; i < n; i++)
        if (spans[i].end <= spans[i].start || spans[i].start < 0)
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA span_mean: span %lld is [%lld,%lld)",
                             (long long)i, (long long)spans[i].start, (long long)spans[i].end);
    if (n <= 0) return 0;
    op_begin(c, "span_mean", 0);
    int64_t *h = cu_host(c, (size_t)(2 * n) * sizeof(int64_t), err);
    if (!h) return op_end(c, -1);
    for (int64_t i = 0; i < n; i++) h[2 * i] = spans[i].start, h[2 * i + 1] = spans[i].end;
    const int64_t *d = stage_meta(c, (size_t)(2 * n) * sizeof(int64_t), err);
    if (!d) return op_end(c, -1);
    return op_end(c, cu_check(ck_span_mean(x, dim, d, n, out, c->st), "span_mean", err));
}

static int cu_pair_features(clef_backend *be, const float *F, const int32_t *f_rows, const float *o, int64_t n,
                            int64_t dim, float *out, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    if (n <= 0) return 0;
    op_begin(c, "pair_features", 0);
    int32_t *h = cu_host(c, (size_t)n * sizeof(int32_t), err);
    if (!h) return op_end(c, -1);
    memcpy(h, f_rows, (size_t)n * sizeof(int32_t));
    const int32_t *d = stage_meta(c, (size_t)n * sizeof(int32_t), err);
    if (!d) return op_end(c, -1);
    return op_end(c, cu_check(ck_pair_features(F, d, o, n, dim, out, c->st), "pair_features", err));
}

static int cu_cosine(clef_backend *be, const float *a, const int32_t *a_rows, const float *b, int64_t n, int64_t dim,
                     float eps, float *out, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    if (n <= 0) return 0;
    op_begin(c, "cosine", 0);
    const int32_t *d = NULL;
    if (a_rows) {
        int32_t *h = cu_host(c, (size_t)n * sizeof(int32_t), err);
        if (!h) return op_end(c, -1);
        memcpy(h, a_rows, (size_t)n * sizeof(int32_t));
        if (!(d = stage_meta(c, (size_t)n * sizeof(int32_t), err))) return op_end(c, -1);
    }
    return op_end(c, cu_check(ck_cosine(a, d, b, n, dim, eps, out, c->st), "cosine", err));
}

/* ---- media tower ops (kernels in cuda_tower.cu) ------------------------- */

static int cu_gelu_tanh(clef_backend *be, const float *x, float *y, int64_t n, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    op_begin(c, "gelu_tanh", 0);
    return op_end(c, cu_check(ck_gelu_tanh(x, y, n, c->st), "gelu_tanh", err));
}

static int cu_rope_2d(clef_backend *be, float *x, int64_t N, int64_t stride, int64_t heads, int64_t d,
                      const int32_t *pos, const float *inv_freq, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    if (d <= 0 || d % 4 || heads < 0 || N < 0)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA rope_2d: head size %lld (a multiple of 4)", (long long)d);
    op_begin(c, "rope_2d", 0);
    return op_end(c, cu_check(ck_rope_2d(x, N, stride, heads, d, pos, inv_freq, c->st), "rope_2d", err));
}

static int cu_mix_rows(clef_backend *be, const float *table, int64_t dim, const int32_t *idx, const float *w,
                       int64_t N, float *out, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    op_begin(c, "mix_rows", 0);
    return op_end(c, cu_check(ck_mix_rows(table, dim, idx, w, N, out, c->st), "mix_rows", err));
}

static int cu_im2col_3x3s2(clef_backend *be, const float *in, int64_t B, int64_t Fi, int64_t Ti, int64_t Ci,
                           float *cols, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    op_begin(c, "im2col_3x3s2", 0);
    return op_end(c, cu_check(ck_im2col_3x3s2(in, B, Fi, Ti, Ci, cols, c->st), "im2col_3x3s2", err));
}

static int cu_transpose(clef_backend *be, const float *x, int64_t B, int64_t R, int64_t C, float *y, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    if (B > 65535)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA transpose: %lld matrices (at most 65535)", (long long)B);
    op_begin(c, "transpose", 0);
    return op_end(c, cu_check(ck_transpose(x, B, R, C, y, c->st), "transpose", err));
}

/* ---- lifetime ------------------------------------------------------------ */

static void cu_destroy(clef_backend *be) {
    if (!be) return;
    cuda_ctx *c = cu_of(be);
    if (c) {
        cudaSetDevice(c->device);
        if (c->st) cudaStreamSynchronize(c->st);
        cu_sx_destroy(c);
        for (int s = 0; s < SLOT_COUNT; s++)
            if (c->slot[s]) cudaFreeAsync(c->slot[s], c->st);
        if (c->st) cudaStreamSynchronize(c->st);
        for (size_t i = 0; i < c->n_plans; i++) {
            if (c->plans[i].a) cublasLtMatrixLayoutDestroy(c->plans[i].a);
            if (c->plans[i].b) cublasLtMatrixLayoutDestroy(c->plans[i].b);
            if (c->plans[i].d) cublasLtMatrixLayoutDestroy(c->plans[i].d);
        }
        free(c->plans);
        for (size_t i = 0; i < c->n_moe; i++) {
            cudaFree(c->moe[i].dev);
            free(c->moe[i].host);
            if (c->moe[i].maps_dev) cudaFree(c->moe[i].maps_dev);
            free(c->moe[i].maps_host);
        }
        free(c->moe);
        for (size_t i = 0; i < c->n_qmoe; i++) {
            cudaFree(c->qmoe[i].dev);
            free(c->qmoe[i].host);
        }
        free(c->qmoe);
        for (size_t i = 0; i < c->n_arenas; i++) cudaFree(c->arenas[i].base);
        free(c->arenas);
        for (size_t i = 0; i < c->n_ev; i++) {
            cudaEventDestroy(c->ev[i].a);
            cudaEventDestroy(c->ev[i].b);
        }
        free(c->ev);
        free(c->keys);
        for (size_t i = 0; i < c->n_graphs; i++) {
            graph_clear(&c->graphs[i]);
            free(c->graphs[i].key);
        }
        free(c->graphs);
        if (c->side) cudaStreamDestroy(c->side);
        if (c->lt_ws) cudaFree(c->lt_ws);
        if (c->lt_desc) cublasLtMatmulDescDestroy(c->lt_desc);
        if (c->lt) cublasLtDestroy(c->lt);
        if (c->st) cudaStreamDestroy(c->st);
        free(c->host), free(c->meta_cache);
        free(c);
    }
    free(be);
}

/* ---- CUDA graphs ----------------------------------------------------------- */

/* FNV-1a of the key bytes. */
static uint64_t key_hash(const void *key, size_t n) {
    const unsigned char *p = key;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Forget what graph g recorded (its exec and argument arrays); the key stays. */
static void graph_clear(cu_graph *g) {
    if (g->exec) cudaGraphExecDestroy(g->exec);
    g->exec = NULL;
    for (size_t i = 0; i < g->n_meta; i++) cudaFree(g->meta[i]);
    free(g->meta), free(g->last_meta_host);
    g->meta = NULL, g->last_meta_host = NULL;
    g->n_meta = g->last_meta_bytes = 0;
    g->state = 1;
}

/* The entry of `key`, or a new one (state 0; the least recently used entry is
 * reused when GRAPH_KEEP are kept), or NULL when out of host memory. */
static cu_graph *graph_entry(cuda_ctx *c, const void *key, size_t kb) {
    const uint64_t h = key_hash(key, kb);
    for (size_t i = 0; i < c->n_graphs; i++) {
        cu_graph *g = &c->graphs[i];
        if (g->hash == h && g->key_bytes == kb && memcmp(g->key, key, kb) == 0) return g;
    }
    void *k = malloc(kb ? kb : 1);
    if (!k) return NULL;
    memcpy(k, key, kb);
    cu_graph *g;
    if (c->n_graphs < GRAPH_KEEP) {
        g = &c->graphs[c->n_graphs++];
    } else {
        g = &c->graphs[0];
        for (size_t i = 1; i < c->n_graphs; i++)
            if (c->graphs[i].last_use < g->last_use) g = &c->graphs[i];
        graph_clear(g);
        free(g->key);
    }
    memset(g, 0, sizeof *g);
    g->key = k, g->key_bytes = kb, g->hash = h;
    return g;
}

/* graph_run (backend.h).  A key's first call runs the body's launches
 * plainly (it also sizes the scratch slots and fixes each product's
 * cuBLASLt algorithm, which synchronise); the second captures them into a
 * graph and launches that; later calls launch the graph alone.  A capture
 * that fails (an op needing a sync, a slot to grow, ...) is thrown away and
 * the body run plainly, so results never depend on whether a graph ran. */
static int cu_graph_run(clef_backend *be, const void *key, size_t kb, int (*body)(void *ctx, clef_err *err), void *ctx,
                        clef_err *err) {
    cuda_ctx *c = cu_of(be);
    if (!c->graphs_on || c->profile || c->capturing) return body(ctx, err);
    cudaSetDevice(c->device);
    cu_graph *g = graph_entry(c, key, kb);
    if (!g) return body(ctx, err);
    g->last_use = ++c->graph_clock;
    if (g->state == 2 && g->slot_gen != c->slot_gen) graph_clear(g); /* a slot moved: capture again */
    if (g->state == 2) {
        c->cvt_valid = c->att_valid = 0; /* the graph rewrote the activations the host believes converted */
        if (c->sx.n && cu_sx_restore(c, g->sx_in, err)) return -1; /* the slots as the capture found them */
        if (cu_check(cudaGraphLaunch(g->exec, c->st), "CUDA graph launch", err)) return -1;
        if (c->sx.n) {
            c->sx.holds[0] = g->sx_out[0], c->sx.holds[1] = g->sx_out[1];
            c->sx.copies += g->sx_copies, c->sx.copied_bytes += g->sx_bytes;
        }
        c->graph_replays++;
        return 0;
    }
    if (g->state == 0) {
        g->state = 1;
        return body(ctx, err);
    }
    if (g->state == 3) return body(ctx, err); /* its capture failed before: plain launches */
    /* second call: capture */
    c->cvt_valid = c->att_valid = 0; /* no conversion from before the graph may be reused inside it */
    const unsigned gen = c->slot_gen;
    if (c->sx.n && cu_sx_settle(c, err)) return -1; /* no copy queued outside the capture is waited for in it */
    g->sx_in[0] = c->sx.holds[0], g->sx_in[1] = c->sx.holds[1];
    const uint64_t sx_c0 = c->sx.copies, sx_b0 = c->sx.copied_bytes;
    if (cudaStreamBeginCapture(c->st, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
        cudaGetLastError();
        g->state = 3;
        c->graph_failed++;
        return body(ctx, err);
    }
    c->capturing = 1;
    c->cap = g;
    clef_err cerr;
    clef_err_clear(&cerr);
    int rc = body(ctx, &cerr);
    if (rc == 0 && c->sx.n) rc = cu_sx_settle(c, &cerr); /* the copy stream rejoins st inside the capture */
    c->capturing = 0;
    c->cap = NULL;
    g->sx_out[0] = c->sx.holds[0], g->sx_out[1] = c->sx.holds[1];
    g->sx_copies = c->sx.copies - sx_c0, g->sx_bytes = c->sx.copied_bytes - sx_b0;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(c->st, &graph);
    cudaGraphExec_t exec = NULL;
    if (rc == 0 && e == cudaSuccess && graph && c->slot_gen == gen) e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    c->cvt_valid = c->att_valid = 0;
    if (rc != 0 || e != cudaSuccess || !exec || c->slot_gen != gen) {
        cudaGetLastError(); /* capture errors are not sticky: clear and run the ops plainly */
        if (exec) cudaGraphExecDestroy(exec);
        graph_clear(g);
        g->state = 3;
        c->graph_failed++;
        /* the captured copies never ran: the slots hold what they held before, or (a copy queued
         * before the failure) something unknown */
        c->sx.holds[0] = c->sx.holds[1] = -1;
        c->sx.pending[0] = c->sx.pending[1] = 0;
        return body(ctx, err);
    }
    g->exec = exec;
    g->state = 2;
    g->slot_gen = gen;
    c->graph_captures++;
    if (cu_check(cudaGraphLaunch(g->exec, c->st), "CUDA graph launch", err)) return -1;
    return 0;
}

void clef_cuda_graph_stats(clef_backend *be, long *captures, long *replays, long *failed) {
    long z[3] = {0, 0, 0};
    if (clef_backend_is_cuda(be)) {
        const cuda_ctx *c = cu_of(be);
        z[0] = c->graph_captures, z[1] = c->graph_replays, z[2] = c->graph_failed;
    }
    if (captures) *captures = z[0];
    if (replays) *replays = z[1];
    if (failed) *failed = z[2];
}

static const clef_backend_ops cuda_ops = {
    .name = "cuda",
    .copies_weights = 1,
    .causal_prefix = 1,
    .destroy = cu_destroy,
    .graph_run = cu_graph_run,
    .experts_stream_begin = cu_experts_stream_begin,
    .experts_stream_end = cu_experts_stream_end,
    .set_memory_budget = cu_set_budget,
    .alloc = cu_alloc,
    .free = cu_free,
    .upload = cu_upload,
    .download = cu_download,
    .copy = cu_copy,
    .copy_2d = cu_copy_2d,
    .copy_many = cu_copy_many,
    .weight_init = cu_weight_init,
    .weight_release = cu_weight_release,
    .weight_init_packed = cu_weight_init_packed,
    .matmul = cu_matmul,
    .gather = cu_gather,
    .rmsnorm = cu_rmsnorm,
    .rope = cu_rope,
    .add_rmsnorm = cu_add_rmsnorm,
    .qk_norm_rope = cu_qk_norm_rope,
    .attention = cu_attention,
    .router_topk = cu_router_topk,
    .moe = cu_moe,
    .moe_add_rmsnorm = cu_moe_add_rmsnorm,
    .swiglu = cu_swiglu,
    .add = cu_add,
    .layernorm = cu_layernorm,
    .gelu = cu_gelu,
    .span_mean = cu_span_mean,
    .pair_features = cu_pair_features,
    .cosine = cu_cosine,
    .gelu_tanh = cu_gelu_tanh,
    .rope_2d = cu_rope_2d,
    .mix_rows = cu_mix_rows,
    .im2col_3x3s2 = cu_im2col_3x3s2,
    .transpose = cu_transpose,
};

int clef_backend_is_cuda(const clef_backend *be) { return be && be->ops == &cuda_ops; }

int clef_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver / no device: not an error here */
        return 0;
    }
    return n;
}

/* Create the stream, cuBLASLt handle and workspace, and keep freed pool
 * memory cached (workspaces come back every forward). */
static int ctx_init(cuda_ctx *c, clef_err *err) {
    if (cu_check(cudaSetDevice(c->device), "set device", err)) return -1;
    struct cudaDeviceProp prop;
    if (cu_check(cudaGetDeviceProperties(&prop, c->device), "device properties", err)) return -1;
    /* sm_80 is the floor: every kernel multiplies on bf16 tensor cores (mma.sync m16n8k16 bf16, cp.async),
     * which Turing (T4, sm_75) and older lack (docs/DESIGN.md "GPU architectures") */
    if (prop.major < 8)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                         "CUDA device %d (%s) has compute capability %d.%d; clef's GPU kernels need bf16 tensor cores, "
                         "compute capability 8.0 (Ampere) or newer; use --device cpu on this machine",
                         c->device, prop.name, prop.major, prop.minor);
    /* the binary must hold machine code for this device, or PTX the driver can compile for it: ask for one
     * kernel's attributes before anything is allocated, so a missing architecture is one clear error */
    {
        const cudaError_t e = ck_image_check();
        if (e != cudaSuccess) {
            cudaGetLastError();
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                             "CUDA device %d (%s, compute capability %d.%d) cannot run this clef binary's GPU code "
                             "(it holds %s): rebuild with -DCLEF_CUDA_ARCHS=native on this machine or add %d%d to "
                             "CLEF_CUDA_ARCHS (%s)",
                             c->device, prop.name, prop.major, prop.minor, clef_cuda_built_archs(), prop.major,
                             prop.minor, cudaGetErrorString(e));
        }
    }
    int rt = 0;
    cudaRuntimeGetVersion(&rt);
    c->total_mem = prop.totalGlobalMem;
    snprintf(c->desc, sizeof c->desc, "%.128s, %d SMs, %.1f GiB, CUDA runtime %d.%d", prop.name,
             prop.multiProcessorCount, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), rt / 1000,
             (rt % 1000) / 10);
    if (cu_check(cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking), "stream", err) ||
        cu_check(cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking), "stream", err))
        return -1;
    c->graphs = calloc(GRAPH_KEEP, sizeof *c->graphs);
    if (!c->graphs) return host_oom(err);
    cudaMemPool_t pool;
    if (cu_check(cudaDeviceGetDefaultMemPool(&pool, c->device), "memory pool", err)) return -1;
    uint64_t keep = UINT64_MAX;
    if (cu_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "memory pool", err)) return -1;
    if (lt_check(cublasLtCreate(&c->lt), "create", err)) return -1;
    if (lt_check(cublasLtMatmulDescCreate(&c->lt_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "descriptor", err)) return -1;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    if (lt_check(cublasLtMatmulDescSetAttribute(c->lt_desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "desc", err) ||
        lt_check(cublasLtMatmulDescSetAttribute(c->lt_desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "desc", err))
        return -1;
    /* the sm_90a kernels (wgmma, FP8 MMA, TMA) need that build and a compute capability 9.0 device:
     * ck_pick_* ask ck_caps_hopper; the experts' tensor maps (the TMA kernel below the wgmma threshold,
     * the persistent wgmma kernel above) and W8A8 follow it here */
    c->caps = (ck_caps){.cc_major = prop.major, .cc_minor = prop.minor, .sm90a_built = ck_wgmma_built(),
                        .sms = prop.multiProcessorCount};
    c->expert_maps_on = (c->k.tma || c->k.wgmma_ws) && ck_caps_hopper(&c->caps);
    if (!ck_caps_hopper(&c->caps)) c->fp8_mma = 0;
    /* 64 MiB, allocated once: split-K algorithms whose reduction goes through the workspace
     * (COMPUTE_TYPE / OUTPUT_TYPE partials, split x rows x N floats) are called on as many rows as
     * fit (lt_plan.max_rows); the others need at most a few counters. */
    c->lt_ws_bytes = (size_t)64 << 20;
    if (cu_check(cudaMalloc(&c->lt_ws, c->lt_ws_bytes), "cuBLASLt workspace", err)) return -1;
    note_usage(c);
    return 0;
}

clef_backend *clef_cuda_backend_create_ex(const clef_cuda_options *opt, clef_err *err) {
    int n = clef_cuda_device_count();
    if (n == 0) {
        clef_fail(err, 500, CLEF_E_INTERNAL, "device", "no CUDA device is available (driver or GPU missing)");
        return NULL;
    }
    if (opt->device < 0 || opt->device >= n) {
        clef_fail(err, 500, CLEF_E_INTERNAL, "device", "CUDA device %d does not exist (%d present)", opt->device, n);
        return NULL;
    }
    clef_backend *be = calloc(1, sizeof *be);
    cuda_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA backend: out of memory");
        return NULL;
    }
    c->device = opt->device;
    clef_cuda_env env;
    if (clef_cuda_env_read(&env, err)) { /* every CLEF_CUDA_* setting checked, also those opt overrides */
        free(be);
        free(c);
        return NULL;
    }
    c->precise_parts = (unsigned)(opt->precise >= 0                      ? (opt->precise ? PRECISE_ALL : 0)
                                  : opt->numerics != CLEF_NUMERICS_ENV ? clef_numerics_parts(opt->numerics)
                                                                       : (unsigned)env.precise_parts);
    c->precise = c->precise_parts == PRECISE_ALL;
    if (opt->knobs) c->k = *opt->knobs;
    else clef_cuda_knobs_default(&c->k);
    if (opt->gemm >= 0) {
        c->gemm_custom = opt->gemm == 1;
        c->gemm_lt_only = opt->gemm == 2;
    } else {
        c->gemm_custom = c->k.gemm_custom;
    }
    c->profile = opt->profile >= 0 ? opt->profile : env.profile;
    c->fp8_mma = env.fp8_mma;
    c->int4_v2 = c->k.int4 == 2;
    c->int4_2blk = c->k.int4 == 4;
    c->nvfp4_v2 = c->k.nvfp4 == 2;
    c->graphs_on = env.graphs;
    be->ops = &cuda_ops;
    be->ctx = c;
    if (ctx_init(c, err) != 0) {
        cu_destroy(be);
        return NULL;
    }
    return be;
}

clef_backend *clef_cuda_backend_create(int device, clef_numerics numerics, clef_err *err) {
    clef_cuda_options o = {.device = device, .precise = -1, .numerics = numerics, .gemm = -1, .profile = -1,
                           .knobs = g_switches_set ? &g_switches : NULL};
    return clef_cuda_backend_create_ex(&o, err);
}

const char *clef_numerics_of(clef_backend *be) {
    if (!clef_backend_is_cuda(be)) return "f32";
    static const char *const names[8] = {"fast",    "dense",           "experts",           "dense,experts",
                                         "attention", "balanced", "experts,attention", "precise"};
    return names[cu_of(be)->precise_parts & 7];
}

const char *clef_cuda_kernel_path(clef_backend *be) {
    if (!clef_backend_is_cuda(be)) return "cpu";
    return ck_caps_hopper(&cu_of(be)->caps) ? "hopper" : "portable";
}

const char *clef_cuda_built_archs(void) { return CLEF_CUDA_ARCH_LIST; }

void clef_cuda_describe(clef_backend *be, char *buf, size_t cap) {
    if (!cap) return;
    if (!clef_backend_is_cuda(be)) {
        buf[0] = '\0';
        return;
    }
    cuda_ctx *c = cu_of(be);
    char wg[96] = "";
    const int hopper = ck_caps_hopper(&c->caps);
    if (hopper && c->k.wgmma == 1) snprintf(wg, sizeof wg, ", wgmma experts");
    else if (hopper && c->k.wgmma == 2)
        snprintf(wg, sizeof wg, ", wgmma experts from %d rows (packed %d)", c->k.wgmma_rows, c->k.qwgmma_rows);
    char v5[96] = ""; /* ck_pick_packed: v5 ahead of the packed wgmma kernel for fast INT4 / NVFP4 passes */
    if (split_of(c, PRECISE_EXPERTS) == 1)
        snprintf(v5, sizeof v5, ", packed INT4 / NVFP4 on v5 up to %d rows per expert", c->k.v5_rows);
    snprintf(buf, cap, "%s, %s kernels%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s", c->desc, clef_cuda_kernel_path(be),
             c->precise ? ", precise" : !c->precise_parts ? ", fast (bf16)" : "",
             !c->precise && (c->precise_parts & PRECISE_DENSE) ? ", precise dense" : "",
             !c->precise && (c->precise_parts & PRECISE_EXPERTS) ? ", precise experts" : "",
             !c->precise && (c->precise_parts & PRECISE_ATTN) ? ", precise attention" : "",
             c->gemm_custom ? ", custom dense GEMM" : ", cuBLASLt dense GEMM", wg,
             hopper && c->k.wgmma && !c->k.qwgmma ? " (packed: mma.sync)" : "",
             hopper && c->k.wgmma && c->k.wgmma_ws ? (c->k.wgmma_ws == 2 ? ", persistent wgmma experts (CTA pairs)"
                                                                        : ", persistent wgmma experts")
                                                   : "",
             c->expert_maps_on && c->k.tma ? ", TMA expert kernel below" : "",
             hopper && c->k.int4 == 5 ? ", packed INT4 v4" : c->k.int4 == 3 ? ", packed INT4 v3" : "",
             hopper && c->k.nvfp4 == 4 ? ", packed NVFP4 v4" : c->k.nvfp4 == 3 ? ", packed NVFP4 v3" : "", v5,
             c->fp8_mma ? ", fp8-block experts W8A8 (fp8 wgmma)" : "",
             c->k.attn == 1   ? ", attention v1"
             : c->k.attn == 2 ? ", attention v2"
             : c->k.attn == 3 ? ", attention v2w"
             : c->k.attn == 4 ? ", attention v2s"
                                    : "",
             c->graphs_on ? "" : ", CUDA graphs off");
}

size_t clef_cuda_peak_bytes(clef_backend *be) {
    if (!clef_backend_is_cuda(be)) return 0;
    cuda_ctx *c = cu_of(be);
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->st);
    note_usage(c);
    return c->peak_used;
}

size_t clef_cuda_weight_bytes(clef_backend *be) {
    if (!clef_backend_is_cuda(be)) return 0;
    cuda_ctx *c = cu_of(be);
    size_t n = 0;
    for (size_t i = 0; i < c->n_arenas; i++) n += c->arenas[i].used;
    return n;
}

size_t clef_cuda_used_bytes(clef_backend *be) {
    if (!clef_backend_is_cuda(be)) return 0;
    cuda_ctx *c = cu_of(be);
    size_t fr = 0, tot = 0;
    cudaSetDevice(c->device);
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return 0;
    return tot - fr;
}

int clef_cuda_fp8_quant_rows(clef_backend *be, const void *x, int x_bf16, int64_t rows, int64_t K, uint8_t *q, float *s,
                             clef_err *err) {
    if (!clef_backend_is_cuda(be))
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "clef_cuda_fp8_quant_rows: not a CUDA backend");
    cuda_ctx *c = cu_of(be);
    cudaSetDevice(c->device);
    return cu_check(ck_fp8_quant_rows(x, x_bf16, rows, K, K, q, s, c->st), "fp8 quantization of rows", err);
}

#else /* !CLEF_HAVE_CUDA: the same API, no device */

int clef_cuda_device_count(void) { return 0; }

clef_backend *clef_cuda_backend_create_ex(const clef_cuda_options *opt, clef_err *err) {
    (void)opt;
    clef_fail(err, 500, CLEF_E_INTERNAL, "device", "this build of clef has no CUDA support (CMake CLEF_CUDA=OFF)");
    return NULL;
}

clef_backend *clef_cuda_backend_create(int device, clef_numerics numerics, clef_err *err) {
    clef_cuda_options o = {.device = device, .precise = -1, .numerics = numerics, .gemm = -1, .profile = -1,
                           .knobs = g_switches_set ? &g_switches : NULL};
    return clef_cuda_backend_create_ex(&o, err);
}

const char *clef_cuda_kernel_path(clef_backend *be) { return (void)be, "cpu"; }
const char *clef_cuda_built_archs(void) { return ""; }
void clef_cuda_describe(clef_backend *be, char *buf, size_t cap) {
    (void)be;
    if (cap) buf[0] = '\0';
}
const char *clef_numerics_of(clef_backend *be) { return (void)be, "f32"; }
size_t clef_cuda_peak_bytes(clef_backend *be) { return (void)be, 0; }
size_t clef_cuda_used_bytes(clef_backend *be) { return (void)be, 0; }
size_t clef_cuda_weight_bytes(clef_backend *be) { return (void)be, 0; }
void clef_cuda_profile_dump(clef_backend *be, FILE *f) { (void)be, (void)f; }
void clef_cuda_set_profile(clef_backend *be, int on) { (void)be, (void)on; }
int clef_backend_is_cuda(const clef_backend *be) { return (void)be, 0; }
void clef_cuda_graph_stats(clef_backend *be, long *captures, long *replays, long *failed) {
    (void)be;
    if (captures) *captures = 0;
    if (replays) *replays = 0;
    if (failed) *failed = 0;
}
int clef_cuda_fp8_quant_rows(clef_backend *be, const void *x, int x_bf16, int64_t rows, int64_t K, uint8_t *q, float *s,
                             clef_err *err) {
    (void)be, (void)x, (void)x_bf16, (void)rows, (void)K, (void)q, (void)s;
    return clef_fail(err, 500, CLEF_E_INTERNAL, "device", "this build of clef has no CUDA support (CMake CLEF_CUDA=OFF)");
}

#endif
