/* cuda_ctx.h — the CUDA backend's state (cuda_ctx) and the small helpers
 * its C files share: cuda_backend.c (the op table, weights, products,
 * graphs) and cuda_place.c (the memory budget and streamed experts,
 * engine/placement.h).  Internal to src/backend/cuda; compiled only with
 * CLEF_HAVE_CUDA. */
#ifndef CLEF_BACKEND_CUDA_CTX_H
#define CLEF_BACKEND_CUDA_CTX_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "backend/cuda/cuda.h"
#include "backend/cuda/cuda_env.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_select.h"

/* Scratch slots (device memory kept by the backend, grown on demand). */
enum cu_slot {
    SLOT_A16,   /* activation rows as bf16 (matmul, expert input) */
    SLOT_META,  /* small host arrays staged to the device (offsets, spans, rows) */
    SLOT_MOE_IX, /* expert counts, offsets, permutation, tiles */
    SLOT_MOE_H, /* SwiGLU output of the experts, bf16 */
    SLOT_MOE_Y, /* expert outputs in permuted order, f32 */
    SLOT_ATT16, /* Q, K, V as bf16 */
    SLOT_SPLIT_Y, /* precise dense products through cuBLASLt: the hi and lo halves' outputs, f32 */
    SLOT_STAGE, /* INT4 / NVFP4 upload: the checkpoint-layout bytes before ck_int4_reorder / ck_nvfp4_reorder */
    SLOT_FP8,   /* W8A8 experts (CLEF_CUDA_FP8_MMA=1): E4M3 input and intermediate rows + their scales */
    SLOT_COUNT
};

/* A cuBLASLt algorithm fixed for one weight shape, and the layouts used with
 * it.  The algorithm may split K (a split count and reduction scheme fixed
 * here, the same for every call: see lt_candidates). */
typedef struct lt_plan {
    int64_t N, K;
    int split; /* 2: planned for split products (precise dense): 2M stacked rows, then ck_split_sum */
    int ok; /* 0 = no batch-invariant algorithm or the custom kernel was faster: the custom kernel */
    int64_t max_rows; /* stacked rows per cuBLASLt call: the algorithm's workspace fits up to this many */
    cublasLtMatmulAlgo_t algo;
    cublasLtMatrixLayout_t a, b, d;
} lt_plan;

/* Device copies of one MoE layer's expert pointer arrays [gate E | up E | down E]. */
typedef struct moe_ptrs {
    const clef_weight *gate, *up, *down; /* the layer's host arrays (key) */
    int64_t E;
    const void **host; /* [3E] the device pointers as last uploaded (checked on every use) */
    void *dev;
    /* ck_gemm_tma's (and ck_gemm_wgmma_ws's) tensor maps of the same weights [gate E | up E | down E]
     * (expert_maps(c)), encoded and uploaded with the pointers; maps_ok = 0: some weight has no map (its
     * layout does not allow one): the layer keeps the mma.sync / wgmma kernels */
    ck_tmap *maps_host;
    ck_tmap *maps_dev;
    int maps_ok;
} moe_ptrs;

/* Device table of one MoE layer's packed expert weights (ck_qmat [gate E |
 * up E | down E]), keyed like moe_ptrs; the host copy is compared on every use. */
typedef struct qmoe_tab {
    const clef_weight *gate, *up, *down;
    int64_t E;
    ck_qmat *host; /* [3E] */
    void *dev;
} qmoe_tab;

/* A weight arena: one cudaMalloc holding many weights. */
typedef struct arena {
    char *base;
    size_t size, used;
    size_t live; /* weights still bound in it */
} arena;

#define ARENA_BYTES ((size_t)1 << 30)
#define ALIGN_UP(x, a) (((x) + (a) - 1) & ~(size_t)((a) - 1))

/* Profiling: per-op totals from CUDA events. */
typedef struct prof_key {
    char name[64];
    double ms;
    long calls;
} prof_key;
typedef struct prof_ev {
    int key;
    cudaEvent_t a, b;
} prof_ev;

/* Most graph_run keys remembered (least recently used ones are dropped). */
#define GRAPH_KEEP 16

/* One graph_run key: seen once (state 1, ran as plain launches) or recorded
 * (state 2: exec replays it).  `meta` are device copies of the host argument
 * arrays its ops staged while it was captured (the graph's kernels read them;
 * freed with it). */
typedef struct cu_graph {
    void *key;
    size_t key_bytes;
    uint64_t hash;
    int state;
    cudaGraphExec_t exec;
    unsigned slot_gen; /* c->slot_gen when captured: the slots it uses must not have moved since */
    uint64_t last_use;
    void **meta;
    size_t n_meta;
    size_t last_meta_bytes; /* the last staged array (reused when the next one repeats it) */
    char *last_meta_host;
    int sx_in[2], sx_out[2]; /* streamed experts: which layer each slot held when capture began / ended */
    uint64_t sx_copies, sx_bytes; /* and the copies the graph makes (counted again at every replay) */
} cu_graph;


/* Which q / k rows are staged as attention's bf16 rows: qk_norm_rope records them, attention converts
 * only v when its own rows are the same (att_stage_eq). */
typedef struct att_stage {
    const float *q, *k;
    int64_t T, q_stride, k_stride, nq, nk, D;
    int split;
} att_stage;

/* One streamed layer's experts (cuda_place.c): the host array of its gate
 * weights (the key the moe op finds it by) and the pinned image of its slot. */
typedef struct sx_layer {
    const clef_weight *gate;
    char *host;   /* cudaMallocHost: the slot's bytes as the upload left them (reordered, device layout) */
    size_t bytes;
} sx_layer;

/* Streamed experts (engine/placement.h): two device slots; streamed layer i
 * (in binding order, = forward order) lives in slot i % 2 and its weights'
 * device pointers point there; a copy stream brings each layer's image in
 * after the slot's previous layer is done. */
typedef struct sx_state {
    char *slot[2];
    size_t slot_bytes;
    int binding;       /* between experts_stream_begin and _end: arena_take carves from slot[bind_slot] */
    int bind_slot;
    size_t bind_used;
    sx_layer *layers;
    size_t n, cap;
    int holds[2];      /* the streamed layer each slot holds, or will once its queued copy lands; -1 unknown */
    int pending[2];    /* a copy into the slot was queued that st has not waited for */
    cudaStream_t cp;
    cudaEvent_t ready[2], done[2];
    uint64_t copies, copied_bytes;
} sx_state;

typedef struct cuda_ctx {
    int device;
    int precise, gemm_custom, profile;
    int gemm_lt_only; /* options gemm = 2: never pick the custom kernel for a shape that has a cuBLASLt algorithm */
    /* what the device and the binary can run, and the kernel switches (clef_cuda_options.knobs, else the
     * defaults): every kernel choice is ck_pick_* of these (cuda_select.h) */
    ck_caps caps;
    clef_cuda_knobs k;
    /* the layers' tensor maps are built (expert_maps): for the TMA kernel below the wgmma threshold or the
     * persistent wgmma kernel above (k.tma or k.wgmma_ws) on a Hopper device (ck_caps_hopper) */
    int expert_maps_on;
    /* FP8-block experts as W8A8 on the FP8 tensor cores (cuda_fp8mma.cu): CLEF_CUDA_FP8_MMA, default 0;
     * cleared where the build lacks sm_90a or the device is not compute capability 9.0 */
    int fp8_mma; /* CLEF_CUDA_FP8_MMA (a user setting: it changes numerics), where ck_caps_hopper */
    /* the q and k rows qk_norm_rope also left as attention's bf16 rows in SLOT_ATT16 (the q16 / k16 layout
     * of cu_attention), valid until the next op other than attention: att_valid */
    att_stage att;
    int att_valid;
    /* which parts run precise (split-bf16 products, f32 attention): PRECISE_* bits */
    unsigned precise_parts;
    cudaStream_t st;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t lt_desc;
    void *lt_ws;
    size_t lt_ws_bytes;
    lt_plan *plans;
    size_t n_plans, cap_plans;
    void *slot[SLOT_COUNT];
    size_t slot_bytes[SLOT_COUNT];
    char *host; /* host staging for small argument arrays */
    /* what SLOT_META holds (the bytes last staged into it; meta_cached = 0: unknown), so ops whose
     * arguments repeat (every layer's attention over one batch) skip the upload */
    char *meta_cache;
    size_t meta_cache_cap, meta_cached;
    size_t host_bytes;
    arena *arenas;
    size_t n_arenas, cap_arenas;
    moe_ptrs *moe;
    size_t n_moe, cap_moe;
    qmoe_tab *qmoe; /* packed-expert tables (quantized checkpoints) */
    int int4_v2;    /* knob QGEMM_INT4=v2: INT4 kept in the GPTQ layout, kernel v2; else reordered, v3 */
    int int4_2blk;  /* knob QGEMM_INT4=v3-2blk: v3 with 32-row tiles bounded for 2 blocks/SM (tuning) */
    int nvfp4_v2;   /* knob QGEMM_NVFP4=v2: NVFP4 kept in the checkpoint layout, kernel v2; else reordered, v3 */
    size_t n_qmoe, cap_qmoe;
    /* the last activation rows converted to bf16 (reused by consecutive
     * matmuls of the same input, e.g. q/k/v); any other op clears it */
    const float *cvt_x;
    int64_t cvt_rows, cvt_K, cvt_ld;
    int cvt_split, cvt_valid;
    /* moe_add_rmsnorm in progress (cu_moe_add_rmsnorm): every pass's combine adds its rows to h and norms
     * them into y (ck_moe_combine_norm; a16: also as bf16 rows of split halves, NULL: not kept) */
    struct {
        int on;
        float *h, *y;
        const float *nw;
        float eps;
        uint16_t *a16;
        int split;
    } tail;
    size_t peak_used; /* device memory in use at the fullest point seen (driver's view) */
    size_t total_mem;
    /* CUDA graphs (graph_run): the kept forwards, the one being captured, counters */
    int graphs_on;      /* CLEF_CUDA_GRAPHS */
    int capturing;      /* a graph_run body is being captured on st: ops must not sync, alloc or grow slots */
    struct cu_graph *graphs, *cap;
    size_t n_graphs;
    unsigned slot_gen;  /* bumped whenever a scratch slot moves (kept graphs hold slot addresses) */
    uint64_t graph_clock;
    long graph_captures, graph_replays, graph_failed;
    cudaStream_t side;  /* non-blocking stream for staging a captured graph's argument arrays */
    /* profiling */
    prof_key *keys;
    size_t n_keys, cap_keys;
    prof_ev *ev;
    size_t n_ev, cap_ev, used_ev;
    int cur_key;
    char desc[256];
    /* memory budget (--gpu-memory; 0 = none): allocations that would take the driver's view past it are
     * refused (cu_budget_admit) */
    size_t budget;
    sx_state sx;
} cuda_ctx;

/* Parts of the precise mode (cuda_env.h). */
enum {
    PRECISE_DENSE = CLEF_PRECISE_DENSE,
    PRECISE_EXPERTS = CLEF_PRECISE_EXPERTS,
    PRECISE_ATTN = CLEF_PRECISE_ATTN,
    PRECISE_ALL = CLEF_PRECISE_ALL
};

static inline cuda_ctx *cu_of(clef_backend *be) { return (cuda_ctx *)be->ctx; }

/* bf16 halves per activation value in the products of precise part `part`: 2 ([hi | lo] rows) or 1.
 * An op that leaves converted rows for another op's product uses the consumer's part. */
static inline int split_of(const cuda_ctx *c, unsigned part) { return c->precise_parts & part ? 2 : 1; }

/* Head sizes of the tensor-core attention (cuda_attn.cu); others run ck_attn_f32. */
static inline int attn_tc_head(int64_t D) { return D == 64 || D == 72 || D == 128; }

/* 0, or -1 with err 500 naming the CUDA error. */
static inline int cu_check(cudaError_t e, const char *what, clef_err *err) {
    if (e == cudaSuccess) return 0;
    return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA %s: %s (%s)", what, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}

static inline int lt_check(cublasStatus_t s, const char *what, clef_err *err) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "cuBLASLt %s: %s (%d)", what, cublasLtGetStatusString(s), (int)s);
}

/* The host-memory failure of the backend's tables: a 500 internal error; returns -1. */
static inline int host_oom(clef_err *err) {
    return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "CUDA backend: out of host memory");
}


/* ---- cuda_place.c: memory budget and streamed experts ---------------------- */

/* 0 when `bytes` more device memory keeps the driver's view within c->budget
 * (always without a budget; `pooled`: the stream-ordered pool serves it, so
 * memory the pool holds free counts as available); else -1 with err 422
 * capacity_exceeded naming `what`, the budget and what is in use. */
int cu_budget_admit(cuda_ctx *c, size_t bytes, int pooled, const char *what, clef_err *err);
/* While binding a streamed layer: `bytes` (256-aligned) of its slot, or NULL + err (500: the slot planned
 * too small). */
void *cu_sx_take(cuda_ctx *c, size_t bytes, clef_err *err);
/* The streamed layer index of `ex` (-1: resident). */
int cu_sx_find(const cuda_ctx *c, const clef_moe_weights *ex);
/* Before a moe over streamed layer i: its bytes in its slot (a copy queued now if the slot holds another
 * layer) and st waiting for them.  After: the slot's next layer (i + 2, wrapping to the first of the same
 * parity) queued on the copy stream behind this layer's use. */
int cu_sx_before(cuda_ctx *c, int i, clef_err *err);
int cu_sx_after(cuda_ctx *c, int i, clef_err *err);
/* st waits for every copy queued and not yet waited for: before a graph capture begins (no wait on a
 * copy from outside it) and before it ends (the copy stream rejoins the capture).  A replay of a graph
 * captured with slots holding `want` first brings them to that (cu_sx_restore). */
int cu_sx_settle(cuda_ctx *c, clef_err *err);
int cu_sx_restore(cuda_ctx *c, const int want[2], clef_err *err);
int cu_experts_stream_begin(clef_backend *be, size_t slot_bytes, clef_err *err);
int cu_experts_stream_end(clef_backend *be, const clef_moe_weights *ex, clef_err *err);
int cu_set_budget(clef_backend *be, size_t bytes, clef_err *err);
void cu_sx_destroy(cuda_ctx *c);

#endif
