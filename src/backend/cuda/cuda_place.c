/* cuda_place.c — the CUDA backend's memory budget and streamed experts
 * (engine/placement.h, backend.h experts_stream_begin / _end,
 * set_memory_budget).
 *
 * Streamed experts.  The planner names the layers whose experts do not stay
 * resident.  Each is bound like any weight (cu_weight_init[_packed]: upload,
 * INT4 / NVFP4 reorder), but into one of two device slots instead of an
 * arena (arena_take -> cu_sx_take), streamed layer i into slot i % 2; once
 * bound, the slot's bytes are copied into a pinned host image.  So every
 * streamed layer's weights keep fixed device addresses (its slot's, at the
 * same offsets as in every other layer of that slot), the expert tables,
 * tensor maps and CUDA graphs of the resident path work unchanged, and the
 * kernels read bitwise the bytes they would read resident.
 *
 * A forward: before the moe over streamed layer i, st waits for the copy of
 * i's image into its slot (queued earlier; queued now, and waited for, only
 * if the slot holds another layer); after it, the copy of the slot's next
 * layer (i + 2, or at the end the first layer of the same parity, for the
 * next forward) is queued on the copy stream behind an event on st, so it
 * overlaps the layers computed in between.  With the planner's even spread
 * (placement.h) that is (L - n) / n resident layers of compute per copy.
 *
 * CUDA graphs: the copies and the event edges are captured with the rest
 * (memcpy nodes from pinned memory); a graph remembers which layer each slot
 * held when it was captured and a replay first restores that (cu_sx_restore:
 * after a failed forward, say), so a replay never reads a wrong layer.
 *
 * Budget: cu_budget_admit before every device allocation of the backend
 * (arenas, slots, workspaces, the two expert slots): the driver's view
 * (cudaMemGetInfo: context, every allocation, the pool's cache) plus the
 * request must stay within c->budget.  Pool allocations may be served from
 * memory the pool already holds free, so that part counts as available. */
#include "backend/cuda/cuda.h"

#ifdef CLEF_HAVE_CUDA

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_ctx.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

int cu_budget_admit(cuda_ctx *c, size_t bytes, int pooled, const char *what, clef_err *err) {
    if (!c->budget) return 0;
    size_t fr = 0, tot = 0;
    if (cu_check(cudaMemGetInfo(&fr, &tot), "memory info", err)) return -1;
    const size_t used = tot - fr;
    size_t need = bytes;
    if (pooled) {
        cudaMemPool_t pool;
        uint64_t reserved = 0, in_use = 0;
        if (cudaDeviceGetDefaultMemPool(&pool, c->device) == cudaSuccess &&
            cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess &&
            cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &in_use) == cudaSuccess &&
            reserved > in_use)
            need = bytes > reserved - in_use ? bytes - (size_t)(reserved - in_use) : 0;
    }
    if (used + need <= c->budget) return 0;
    return clef_fail(err, 422, CLEF_E_CAPACITY, NULL,
                     "GPU memory budget exceeded: %s needs %.3f GiB more, %.3f of the %.3f GiB budget "
                     "(--gpu-memory) are in use; raise --gpu-memory (or plan for fewer tokens a forward)",
                     what, (double)need / GIB, (double)used / GIB, (double)c->budget / GIB);
}

int cu_set_budget(clef_backend *be, size_t bytes, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    cudaSetDevice(c->device);
    size_t fr = 0, tot = 0;
    if (cu_check(cudaMemGetInfo(&fr, &tot), "memory info", err)) return -1;
    if (bytes && tot - fr > bytes)
        return clef_fail(err, 500, CLEF_E_INTERNAL, "gpu_memory",
                         "--gpu-memory %.2f GiB is less than the %.2f GiB the device already uses (context and "
                         "other processes)", (double)bytes / GIB, (double)(tot - fr) / GIB);
    if (bytes > tot)
        return clef_fail(err, 500, CLEF_E_INTERNAL, "gpu_memory",
                         "--gpu-memory %.2f GiB is more than the device's %.2f GiB", (double)bytes / GIB,
                         (double)tot / GIB);
    c->budget = bytes;
    return 0;
}

/* The slots, copy stream and events, made at the first streamed layer. */
static int sx_init(cuda_ctx *c, size_t slot_bytes, clef_err *err) {
    sx_state *s = &c->sx;
    if (s->slot[0]) {
        if (slot_bytes > s->slot_bytes)
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                             "streamed experts: slot of %zu bytes asked after slots of %zu were made", slot_bytes,
                             s->slot_bytes);
        return 0;
    }
    s->slot_bytes = ALIGN_UP(slot_bytes ? slot_bytes : 256, 256);
    s->holds[0] = s->holds[1] = -1;
    for (int i = 0; i < 2; i++) {
        if (cu_budget_admit(c, s->slot_bytes, 0, "a streamed-expert slot", err)) return -1;
        if (cu_check(cudaMalloc((void **)&s->slot[i], s->slot_bytes), "streamed-expert slot", err)) return -1;
        if (cu_check(cudaEventCreateWithFlags(&s->ready[i], cudaEventDisableTiming), "event", err) ||
            cu_check(cudaEventCreateWithFlags(&s->done[i], cudaEventDisableTiming), "event", err))
            return -1;
    }
    return cu_check(cudaStreamCreateWithFlags(&s->cp, cudaStreamNonBlocking), "copy stream", err);
}

int cu_experts_stream_begin(clef_backend *be, size_t slot_bytes, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    cudaSetDevice(c->device);
    if (c->sx.binding) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "streamed experts: begin without end");
    if (sx_init(c, slot_bytes, err)) return -1;
    /* the slot may hold the layer bound before into it: nothing reads it before the first forward */
    c->sx.binding = 1;
    c->sx.bind_slot = (int)(c->sx.n % 2);
    c->sx.bind_used = 0;
    return 0;
}

void *cu_sx_take(cuda_ctx *c, size_t bytes, clef_err *err) {
    sx_state *s = &c->sx;
    bytes = ALIGN_UP(bytes ? bytes : 1, 256);
    if (bytes > s->slot_bytes - s->bind_used) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                  "streamed experts: a layer's experts need more than the planned slot of %zu bytes "
                  "(engine/placement.c and the upload disagree)", s->slot_bytes);
        return NULL;
    }
    void *p = s->slot[s->bind_slot] + s->bind_used;
    s->bind_used += bytes;
    return p;
}

int cu_experts_stream_end(clef_backend *be, const clef_moe_weights *ex, clef_err *err) {
    cuda_ctx *c = cu_of(be);
    sx_state *s = &c->sx;
    if (!s->binding) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "streamed experts: end without begin");
    s->binding = 0;
    cudaSetDevice(c->device);
    if (s->n == s->cap) {
        const size_t nc = s->cap ? 2 * s->cap : 64;
        sx_layer *g = realloc(s->layers, nc * sizeof *g);
        if (!g) return host_oom(err);
        s->layers = g, s->cap = nc;
    }
    sx_layer *L = &s->layers[s->n];
    memset(L, 0, sizeof *L);
    if (cu_check(cudaMallocHost((void **)&L->host, s->bind_used ? s->bind_used : 256), "pinned host memory", err))
        return -1;
    L->bytes = s->bind_used;
    L->gate = ex->gate;
    /* the uploads (and reorders) of this layer are queued on st: copy the slot out after them */
    if (cu_check(cudaMemcpyAsync(L->host, s->slot[s->bind_slot], L->bytes, cudaMemcpyDeviceToHost, c->st),
                 "streamed-expert image", err) ||
        cu_check(cudaStreamSynchronize(c->st), "streamed-expert image", err)) {
        cudaFreeHost(L->host);
        return -1;
    }
    s->holds[s->bind_slot] = (int)s->n;
    s->n++;
    return 0;
}

int cu_sx_find(const cuda_ctx *c, const clef_moe_weights *ex) {
    for (size_t i = 0; i < c->sx.n; i++)
        if (c->sx.layers[i].gate == ex->gate) return (int)i;
    return -1;
}

/* Queue the copy of streamed layer i into its slot on the copy stream, after everything queued on st so
 * far (the slot's previous layer's reads). */
static int sx_load(cuda_ctx *c, int i, clef_err *err) {
    sx_state *s = &c->sx;
    const int slot = i % 2;
    const sx_layer *L = &s->layers[i];
    s->holds[slot] = -1;
    if (cu_check(cudaEventRecord(s->done[slot], c->st), "event", err) ||
        cu_check(cudaStreamWaitEvent(s->cp, s->done[slot], 0), "event wait", err) ||
        cu_check(cudaMemcpyAsync(s->slot[slot], L->host, L->bytes, cudaMemcpyHostToDevice, s->cp),
                 "streamed-expert copy", err) ||
        cu_check(cudaEventRecord(s->ready[slot], s->cp), "event", err))
        return -1;
    s->holds[slot] = i;
    s->pending[slot] = 1;
    s->copies++;
    s->copied_bytes += L->bytes;
    return 0;
}

/* st waits for the copy queued into `slot`, if one is pending. */
static int sx_wait(cuda_ctx *c, int slot, clef_err *err) {
    if (!c->sx.pending[slot]) return 0;
    if (cu_check(cudaStreamWaitEvent(c->st, c->sx.ready[slot], 0), "event wait", err)) return -1;
    c->sx.pending[slot] = 0;
    return 0;
}

int cu_sx_before(cuda_ctx *c, int i, clef_err *err) {
    const int slot = i % 2;
    if (c->sx.holds[slot] != i && sx_load(c, i, err)) return -1;
    return sx_wait(c, slot, err);
}

int cu_sx_after(cuda_ctx *c, int i, clef_err *err) {
    const int n = (int)c->sx.n, next = i + 2 < n ? i + 2 : i % 2;
    if (next == i || next >= n) return 0; /* the slot's only layer stays */
    return sx_load(c, next, err);
}

int cu_sx_settle(cuda_ctx *c, clef_err *err) {
    return sx_wait(c, 0, err) || sx_wait(c, 1, err) ? -1 : 0;
}

int cu_sx_restore(cuda_ctx *c, const int want[2], clef_err *err) {
    for (int slot = 0; slot < 2; slot++) {
        if (want[slot] < 0 || c->sx.holds[slot] == want[slot]) continue;
        if (sx_load(c, want[slot], err) || sx_wait(c, slot, err)) return -1;
    }
    return 0;
}

void cu_sx_destroy(cuda_ctx *c) {
    sx_state *s = &c->sx;
    if (s->cp) cudaStreamSynchronize(s->cp);
    for (size_t i = 0; i < s->n; i++) cudaFreeHost(s->layers[i].host);
    free(s->layers);
    for (int i = 0; i < 2; i++) {
        if (s->slot[i]) cudaFree(s->slot[i]);
        if (s->ready[i]) cudaEventDestroy(s->ready[i]);
        if (s->done[i]) cudaEventDestroy(s->done[i]);
    }
    if (s->cp) cudaStreamDestroy(s->cp);
    memset(s, 0, sizeof *s);
}

void clef_cuda_stream_stats(clef_backend *be, uint64_t *layers, uint64_t *copies, uint64_t *bytes) {
    const cuda_ctx *c = cu_of(be);
    if (layers) *layers = c->sx.n;
    if (copies) *copies = c->sx.copies;
    if (bytes) *bytes = c->sx.copied_bytes;
}

double clef_cuda_pinned_copy_gbps(clef_backend *be) {
    cuda_ctx *c = cu_of(be);
    sx_state *s = &c->sx;
    if (!s->n || c->capturing) return 0;
    cudaSetDevice(c->device);
    cudaEvent_t a = NULL, b = NULL;
    double best = 0;
    if (cudaStreamSynchronize(c->st) == cudaSuccess && cudaStreamSynchronize(s->cp) == cudaSuccess &&
        cudaEventCreate(&a) == cudaSuccess && cudaEventCreate(&b) == cudaSuccess) {
        s->holds[0] = -1; /* overwritten below: the next moe over slot 0 copies its layer again */
        s->pending[0] = 0;
        for (int it = 0; it < 5; it++) {
            float ms = 0;
            if (cudaEventRecord(a, s->cp) != cudaSuccess ||
                cudaMemcpyAsync(s->slot[0], s->layers[0].host, s->layers[0].bytes, cudaMemcpyHostToDevice, s->cp) !=
                    cudaSuccess ||
                cudaEventRecord(b, s->cp) != cudaSuccess || cudaEventSynchronize(b) != cudaSuccess ||
                cudaEventElapsedTime(&ms, a, b) != cudaSuccess)
                break;
            const double g = ms > 0 ? (double)s->layers[0].bytes / (ms * 1e-3) / 1e9 : 0;
            if (g > best) best = g;
        }
    }
    cudaGetLastError();
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    return best;
}

#else

double clef_cuda_pinned_copy_gbps(clef_backend *be) { return (void)be, 0; }

void clef_cuda_stream_stats(clef_backend *be, uint64_t *layers, uint64_t *copies, uint64_t *bytes) {
    (void)be;
    if (layers) *layers = 0;
    if (copies) *copies = 0;
    if (bytes) *bytes = 0;
}

#endif
