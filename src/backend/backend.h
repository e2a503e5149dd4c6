/* backend.h — the op table every compute device implements (ggml-backend
 * style): a small struct of function pointers over backend memory.  Model code
 * (src/model/) calls only these ops and never knows which device runs them.
 *
 * src/backend/cpu/ is the reference implementation (f32, OpenBLAS + OpenMP);
 * a device backend (CUDA) implements the same table and is tested against it
 * on random inputs.
 *
 * Conventions for every op:
 *   - "backend memory" is a pointer returned by `alloc` (CPU: host memory;
 *     CUDA: device memory).  Model code never dereferences it; it moves data
 *     with `upload` / `download`.
 *   - Arguments marked (host) are plain host arrays that shape the work
 *     (segment offsets, spans, row indices); the backend copies them if it
 *     needs them on the device.
 *   - Activations are f32, row-major, contiguous unless a stride is given.
 *     Weights are `clef_weight` views of any supported dtype.
 *   - Every op returns 0, or -1 with `err` filled (422 "capacity_exceeded"
 *     "too many tokens: ..." when scratch memory cannot be had, 500 for an
 *     unsupported dtype or invalid arguments).
 *   - Determinism: every output element is computed by one fixed reduction
 *     order that depends only on its own row (and, for attention, its own
 *     segment), never on the number of rows, the other rows packed next to it
 *     or the thread count.  The same record gives bitwise identical results
 *     alone or packed with others.  (BLAS kernels round a row differently by
 *     its position inside a tile, so an implementation must not let a row's
 *     tile position depend on the rows packed before it: the CPU backend
 *     multiplies weights one token at a time and tiles attention per
 *     segment.)
 *   - Ops own no per-call heap memory in steady state: scratch is kept by the
 *     backend and grown only when a larger problem arrives.
 */
#ifndef CLEF_BACKEND_BACKEND_H
#define CLEF_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "quant/qweight.h"
#include "tensor/dtype.h"
#include "util/err.h"

typedef struct clef_backend clef_backend;

/* A weight matrix W[rows, cols] = [out, in] resident on a backend, rows
 * contiguous (row r at data + r * cols * elem_size).  A view of part of a
 * larger tensor (one expert of a fused [E, 2I, H] tensor, the K rows of a
 * packed in_proj) is just another clef_weight with an offset data pointer.
 * A quantized weight (NVFP4, FP8 block, INT4 GPTQ: src/quant/qweight.h) keeps
 * its packed bytes in `data` (dtype = the container: U8, F8_E4M3, I32) and
 * its scales in `quant`; ops dequantize row blocks on the fly, so model code
 * treats it like any other dtype. */
typedef struct clef_weight {
    clef_dtype dtype;  /* CPU backend: BF16, F16 or F32, or a quantized container */
    int64_t rows;      /* out features */
    int64_t cols;      /* in features */
    const void *data;  /* backend memory (CPU: points into the mapped checkpoint) */
    clef_wquant quant; /* quant.type != CLEF_QT_NONE: packed layout and scales; zero for plain dtypes */
} clef_weight;

/* The experts of one MoE layer: arrays of `n_experts` weight views.
 *   gate[e], up[e]: [inter, hidden];  down[e]: [hidden, inter]. */
typedef struct clef_moe_weights {
    int64_t n_experts;
    int64_t hidden;
    int64_t inter;
    const clef_weight *gate;
    const clef_weight *up;
    const clef_weight *down;
} clef_moe_weights;

/* Attention over packed variable-length segments (records, or the option
 * groups of the head).  Segment s owns query rows [q_off[s], q_off[s+1]) and
 * key/value rows [kv_off[s], kv_off[s+1]); no row attends outside its segment.
 * Row r of q holds n_q_heads heads of head_dim floats at q + r * q_stride;
 * likewise k / v with n_kv_heads heads; out row r at out + r * o_stride holds
 * n_q_heads * head_dim floats.  Query head i reads KV head
 * i / (n_q_heads / n_kv_heads) (GQA).  `causal` requires at most as many
 * queries as keys per segment: with ql queries and kl keys, query i is at
 * position i + (kl - ql) of the segment and sees keys j <= that position (kl >
 * ql: the first kl - ql keys are a cached prefix whose queries are not in
 * this pass; only on a backend with `causal_prefix`, else ql = kl).
 * Softmax in f32; scores are (q . k) * scale. */
typedef struct clef_attn_desc {
    int64_t n_seg;
    const int64_t *q_off;  /* (host) [n_seg + 1], q_off[0] = 0 */
    const int64_t *kv_off; /* (host) [n_seg + 1], kv_off[0] = 0 */
    int64_t n_q_heads;
    int64_t n_kv_heads;
    int64_t head_dim;
    int64_t q_stride, k_stride, v_stride, o_stride; /* floats between rows */
    float scale;
    int causal;
} clef_attn_desc;

/* Interleaved M-RoPE (SPEC §6.3) parameters. */
typedef struct clef_rope_desc {
    int64_t head_dim;        /* D, even */
    int64_t section[3];      /* mrope_section: frequencies owned by T, H, W */
    const float *inv_freq;   /* backend memory [D/2]: 1/theta^(2j/D) in f32 */
} clef_rope_desc;

/* One backend -> backend copy of copy_many. */
typedef struct clef_copy {
    void *dst;
    const void *src;
    size_t bytes;
} clef_copy;

/* Half-open row range [start, end) used by span_mean. */
typedef struct clef_row_span {
    int64_t start;
    int64_t end;
} clef_row_span;

typedef struct clef_backend_ops {
    const char *name;
    /* 1 when weight_init copies the bytes into backend memory (a device
     * backend): the model may then upload the q, k and v projections of a
     * layer as one [q | k | v] weight (one product instead of three, no
     * extra memory).  0 when weights borrow the host bytes (CPU: a fused
     * copy would add memory), and the model multiplies them one by one. */
    int copies_weights;
    /* 1 when `attention` takes causal segments with more keys than queries
     * (a cached prefix, clef_attn_desc) and a query row's value does not
     * depend on how many prefix keys came from the cache, provided the
     * prefix is a multiple of CLEF_KV_BLOCK tokens (CPU: its query blocks are
     * cut at absolute positions; CUDA: its key tiles start at fixed positions
     * and a tile past a row adds exactly nothing, cuda_attn.cu).  0: the
     * engine's state cache stays off. */
    int causal_prefix;
    void (*destroy)(clef_backend *be);

    /* ---- memory ---- */
    /* `bytes` of backend memory (64-byte aligned), or NULL. */
    void *(*alloc)(clef_backend *be, size_t bytes);
    void (*free)(clef_backend *be, void *p);
    /* host -> backend, backend -> host, backend -> backend copies. */
    int (*upload)(clef_backend *be, void *dst, const void *src, size_t bytes, clef_err *err);
    int (*download)(clef_backend *be, void *dst, const void *src, size_t bytes, clef_err *err);
    int (*copy)(clef_backend *be, void *dst, const void *src, size_t bytes, clef_err *err);
    /* backend -> backend copy of `rows` rows of `cols` floats: row r from
     * src + r * src_stride to dst + r * dst_stride (strides in floats, >=
     * cols); the regions must not overlap.  One call for a strided block (the
     * k or v columns of fused q | k | v rows). */
    int (*copy_2d)(clef_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                   int64_t rows, int64_t cols, clef_err *err);
    /* backend -> backend copies list[0..n) (host array), none overlapping
     * another's destination: one launch for many small copies (the cached
     * blocks' K/V rows, engine/state_cache.h). */
    int (*copy_many)(clef_backend *be, const clef_copy *list, size_t n, clef_err *err);
    /* Make a weight whose bytes are at host address `host` usable by the
     * backend: fills `w` (CPU: borrows the host pointer; a device backend
     * uploads and owns a copy, released by weight_release). */
    int (*weight_init)(clef_backend *be, clef_weight *w, clef_dtype dtype, int64_t rows, int64_t cols,
                       const void *host, clef_err *err);
    void (*weight_release)(clef_backend *be, clef_weight *w);
    /* Like weight_init for a weight bound from the checkpoint by
     * clef_qweight_bind, plain or quantized (quant/qweight.h): the CPU borrows
     * the packed bytes and scales; a device backend uploads them. */
    int (*weight_init_packed)(clef_backend *be, clef_weight *w, const clef_qweight *q, clef_err *err);
    /* Optional (NULL: callers run `body` themselves).  Runs body(ctx, err), a
     * sequence of this backend's ops, and may keep what it launched to replay
     * it, instead of calling body, for a later call with the same `key`
     * (key_bytes bytes, compared whole).  The caller promises that the key
     * determines everything body passes to the ops (sizes, backend pointers,
     * host argument arrays), so only the contents of backend memory (uploaded
     * before the call) differ between calls; body must not upload, download,
     * alloc or free.  CUDA: CUDA graphs (a key seen twice is captured, then
     * replayed; see cuda.h).  Returns body's status, or -1 with err. */
    int (*graph_run)(clef_backend *be, const void *key, size_t key_bytes, int (*body)(void *ctx, clef_err *err),
                     void *ctx, clef_err *err);
    /* Optional (NULL: every weight stays resident; engine/placement.h).  A
     * layer's experts streamed from host memory: the weights bound between
     * experts_stream_begin (slot_bytes: the plan's slot size) and
     * experts_stream_end(ex) are placed in one of two device slots
     * (alternating over the streamed layers in binding order) instead of
     * resident memory; _end keeps the slot's bytes in pinned host memory and
     * registers `ex` (the layer's experts, by its gate array's address): every
     * moe over them first waits for their copy into the slot.  Streamed
     * layers must then run in the order they were bound (the thinker's layer
     * order), which lets each copy start while earlier layers compute; any
     * other order stays correct, only slower.  Values are bitwise those of
     * resident weights. */
    int (*experts_stream_begin)(clef_backend *be, size_t slot_bytes, clef_err *err);
    int (*experts_stream_end)(clef_backend *be, const clef_moe_weights *ex, clef_err *err);
    /* Optional.  Device memory budget in bytes (0 = none), as the driver
     * counts it (context included): allocations past it fail with 422
     * capacity_exceeded (a forward) or 500 (loading weights), naming it. */
    int (*set_memory_budget)(clef_backend *be, size_t bytes, clef_err *err);

    /* ---- thinker ops ---- */
    /* y[T, w.rows] = x[T, w.cols] . W^T (+ bias[w.rows] if non-NULL), f32
     * accumulation from any weight dtype.  x and y must not overlap. */
    int (*matmul)(clef_backend *be, const float *x, int64_t T, const clef_weight *w, const float *bias, float *y,
                  clef_err *err);
    /* out[n, table.cols] = f32(table[ids[i]]) — embedding lookup.  ids:
     * backend memory [n], each in [0, table.rows) (checked by the caller). */
    int (*gather)(clef_backend *be, const clef_weight *table, const int32_t *ids, int64_t n, float *out,
                  clef_err *err);
    /* RMSNorm of `rows` rows of `dim` floats: y = w * (x * rsqrt(mean(x^2) + eps)).
     * Per-head q/k norm is rows = T * heads, dim = head_dim.  y may equal x. */
    int (*rmsnorm)(clef_backend *be, const float *x, const float *w, float *y, int64_t rows, int64_t dim,
                   float eps, clef_err *err);
    /* In-place interleaved M-RoPE on x[T, heads, D] (rotate-half pairs
     * (j, j + D/2)).  pos: backend memory int32 [3][T] (T, H, W axes). */
    int (*rope)(clef_backend *be, float *x, int64_t T, int64_t heads, const int32_t *pos,
                const clef_rope_desc *rope, clef_err *err);
    /* Residual add fused with the next RMSNorm: when `o` is non-NULL,
     * h[r, :] += o[r, :] in place for r < rows (rows of `dim` floats), then
     * y = rmsnorm(h) as `rmsnorm`; bitwise the `add` op followed by the
     * `rmsnorm` op (one pass over h instead of three).  `o` NULL: only the
     * norm.  y must not overlap h or o.  A device backend may also keep y's
     * rows converted for the matmul that follows (CUDA: the bf16 [hi | lo]
     * rows its products read). */
    int (*add_rmsnorm)(clef_backend *be, float *h, const float *o, const float *w, float *y, int64_t rows,
                       int64_t dim, float eps, clef_err *err);
    /* The thinker's per-head q/k RMSNorm followed by interleaved M-RoPE,
     * in place, on T rows of nq query heads (row r at q + r * q_stride
     * floats) and nk key heads (row r at k + r * k_stride), heads of
     * rope->head_dim floats: each query head y = q_w * norm(x), each key
     * head with k_w, then `rope` with positions pos [3][T].  Bitwise the
     * ops rmsnorm (rows = T * heads, dim = head_dim) and rope on contiguous
     * rows (CPU: always; CUDA: for heads under 512 floats, the model's 128,
     * where its rmsnorm reduces a row in one warp too; wider heads, up to
     * CUDA's limit of 1,024, agree to f32 rounding); the strides let q and
     * k be column blocks of one fused [T, q | k | v] projection.  q and k
     * heads must not overlap. */
    int (*qk_norm_rope)(clef_backend *be, float *q, int64_t q_stride, float *k, int64_t k_stride, int64_t T,
                        int64_t nq, int64_t nk, const float *q_w, const float *k_w, float eps, const int32_t *pos,
                        const clef_rope_desc *rope, clef_err *err);
    /* Attention over packed segments, see clef_attn_desc.  out must not
     * overlap q, k or v. */
    int (*attention)(clef_backend *be, const float *q, const float *k, const float *v, float *out,
                     const clef_attn_desc *a, clef_err *err);
    /* Router: p = softmax(logits[t, 0..E)) in f32, the k largest p (ties: lower
     * expert first) in descending order into idx[T, k] / w[T, k]; with `norm`
     * the k weights are divided by their sum. */
    int (*router_topk)(clef_backend *be, const float *logits, int64_t T, int64_t E, int64_t k, int norm,
                       int32_t *idx, float *w, clef_err *err);
    /* Grouped MoE expert block: tokens are permuted by expert (token order
     * kept within an expert), each expert multiplies only its own tokens:
     * y_e = down_e . (silu(gate_e . x) * (up_e . x)); then
     * y[t] = sum over t's k experts in ascending expert order of w[t,s] * y_e[t]
     * (the reference's index_add order).  x, y: [T, hidden]; idx, w: [T, k]. */
    int (*moe)(clef_backend *be, const float *x, int64_t T, const int32_t *idx, const float *w, int64_t k,
               const clef_moe_weights *experts, float *y, clef_err *err);
    /* Optional (NULL: the model runs moe then add_rmsnorm): the MoE block
     * with the residual add and the next RMSNorm in its combine, bitwise
     * moe(x) into a scratch o then add_rmsnorm(h, o, nw, y): h[t, :] += the
     * combined expert rows, y = rmsnorm(h) * nw (eps), no o written.  y may
     * be x (each pass's rows are read before they are written); y must not
     * overlap h.  x, h, y: [T, hidden]; nw: [hidden]. */
    int (*moe_add_rmsnorm)(clef_backend *be, const float *x, int64_t T, const int32_t *idx, const float *w, int64_t k,
                           const clef_moe_weights *experts, float *h, const float *nw, float eps, float *y,
                           clef_err *err);
    /* out[i] = silu(gate[i]) * up[i], silu(z) = z / (1 + exp(-z)).  n floats. */
    int (*swiglu)(clef_backend *be, const float *gate, const float *up, float *out, int64_t n, clef_err *err);
    /* y[r, :] = a[r, :] + b[r * b_stride, :] for r < rows (b_stride 0
     * broadcasts one row of b, b_stride = dim is an elementwise add).  y may
     * equal a or b. */
    int (*add)(clef_backend *be, const float *a, const float *b, float *y, int64_t rows, int64_t dim,
               int64_t b_stride, clef_err *err);

    /* ---- head ops ---- */
    /* Affine LayerNorm over rows of `dim` (biased variance): y = (x - mean) *
     * rsqrt(var + eps) * w + b.  y may equal x. */
    int (*layernorm)(clef_backend *be, const float *x, const float *w, const float *b, float *y, int64_t rows,
                     int64_t dim, float eps, clef_err *err);
    /* y = 0.5 x (1 + erf(x / sqrt 2)), n floats (exact GELU); y may equal x. */
    int (*gelu)(clef_backend *be, const float *x, float *y, int64_t n, clef_err *err);
    /* out[i, :] = mean of rows x[spans[i].start .. spans[i].end) (sum in row
     * order, then divided by the count); spans (host), non-empty. */
    int (*span_mean)(clef_backend *be, const float *x, int64_t dim, const clef_row_span *spans, int64_t n,
                     float *out, clef_err *err);
    /* Residual-scorer input (SPEC §7.3 step 14): for option i with field row
     * f = f_rows[i] (host), out[i] = [F[f] ; o[i] ; F[f] * o[i] ; |F[f] - o[i]|],
     * out: [n, 4 dim]. */
    int (*pair_features)(clef_backend *be, const float *F, const int32_t *f_rows, const float *o, int64_t n,
                         int64_t dim, float *out, clef_err *err);
    /* out[i] = <a[r] / max(|a[r]|, eps), b[i] / max(|b[i]|, eps)> with
     * r = a_rows ? a_rows[i] : i (a_rows host).  Cosine similarity as torch
     * (normalise, then dot). */
    int (*cosine)(clef_backend *be, const float *a, const int32_t *a_rows, const float *b, int64_t n, int64_t dim,
                  float eps, float *out, clef_err *err);

    /* ---- media tower ops (model/towers.h: vision and audio towers) ---- */
    /* y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), n floats: torch's
     * gelu(approximate="tanh") in f32 (the vision blocks' MLP activation),
     * with the cube and the inner sum rounded one step at a time (no FMA).
     * Elementwise, so trivially row-independent; y may equal x. */
    int (*gelu_tanh)(clef_backend *be, const float *x, float *y, int64_t n, clef_err *err);
    /* Vision 2-D (axial) RoPE, in place, on rows r < N of x (row r at
     * x + r * stride floats), `heads` consecutive heads of d floats per row
     * (d % 4 == 0; the q and k blocks of a fused qkv row are 2 * heads heads
     * when they are adjacent).  pos: backend int32 [N, 2] = (patch row y,
     * patch column x) at full resolution; inv_freq: backend f32 [d/4].  With
     * q = d/4, frequency i < d/2 has angle a_i = (float)y * inv_freq[i] for
     * i < q and (float)x * inv_freq[i - q] otherwise (products in f32; the
     * table duplicated to d as rotate-half), and each pair (i, i + d/2) of
     * every head becomes
     *   v_i' = v_i cos a_i - v_{i+d/2} sin a_i,
     *   v_{i+d/2}' = v_{i+d/2} cos a_i + v_i sin a_i
     * (products and the sum rounded one at a time).  cos/sin in f32 (CPU:
     * libm cosf/sinf; a device may differ by its f32 cos/sin error, a few
     * ulp).  Each row depends on its own position only. */
    int (*rope_2d)(clef_backend *be, float *x, int64_t N, int64_t stride, int64_t heads, int64_t d,
                   const int32_t *pos, const float *inv_freq, clef_err *err);
    /* Weighted gather of 4 rows (bilinear sampling of the vision position
     * table): for r < N, with i_k = idx[4r + k] and w_k = w[4r + k],
     *   out[r, :] = ((table[i_0] w_0 + table[i_1] w_1) + table[i_2] w_2) + table[i_3] w_3,
     * every product and sum rounded in this order (no FMA), so it is bitwise
     * the same on every backend.  table: backend f32 [rows, dim]; idx:
     * backend int32 [N, 4], each in [0, rows) (checked by the caller); w:
     * backend f32 [N, 4]; out: backend f32 [N, dim], not overlapping table. */
    int (*mix_rows)(clef_backend *be, const float *table, int64_t dim, const int32_t *idx, const float *w, int64_t N,
                    float *out, clef_err *err);
    /* Columns of a 3x3, stride-2, padding-1 convolution over B images:
     * in [B, Fi, Ti, Ci] (channels last) -> cols [B, Fo, To, Ci * 9] with
     * Fo = ceil(Fi / 2), To = ceil(Ti / 2) and
     *   cols[b, fo, to, ci * 9 + ky * 3 + kx] = in[b, 2 fo - 1 + ky, 2 to - 1 + kx, ci]
     * (0 outside the image): the Conv2d kernel [C_out, Ci, 3, 3] viewed as
     * [C_out, Ci * 9] then multiplies the cols rows with `matmul`.  A pure
     * copy (bitwise on every backend); in and cols must not overlap. */
    int (*im2col_3x3s2)(clef_backend *be, const float *in, int64_t B, int64_t Fi, int64_t Ti, int64_t Ci, float *cols,
                        clef_err *err);
    /* Batched transpose y[b, c, r] = x[b, r, c] for b < B, r < R, c < C (a
     * pure copy; x and y must not overlap). */
    int (*transpose)(clef_backend *be, const float *x, int64_t B, int64_t R, int64_t C, float *y, clef_err *err);
} clef_backend_ops;

struct clef_backend {
    const clef_backend_ops *ops;
    void *ctx; /* the implementation's state */
};

#endif
