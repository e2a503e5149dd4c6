/* model.h — Clef-Omni on a backend: the thinker text decoder (SPEC.md §6) and
 * the joint schema head (SPEC.md §7), with weights bound once by tensor name.
 *
 * The model borrows the checkpoint's mapped tensors (no copy on the CPU
 * backend, which converts weight row blocks to f32 on the fly); the
 * checkpoint must outlive the model.  Norm weights, biases and the head's
 * scalars are converted to f32 once at load.  Experts bind from per-expert
 * tensors (`mlp.experts.E.{gate,up,down}_proj.weight`, the release layout) or
 * the fused transformers-5 tensors (`mlp.experts.gate_up_proj` [E,2I,H], gate
 * rows first, and `mlp.experts.down_proj` [E,H,I]); layers that are not MoE
 * (mlp_only_layers, decoder_sparse_step) bind `mlp.{gate,up,down}_proj`.
 *
 * Numerics: everything in f32 as the fp32 reference (SPEC §11), with the
 * reference's operation order where it matters (router softmax then top-k
 * then renormalise; expert outputs summed in ascending expert order; M-RoPE
 * angles fp32(pos) * inv_freq).  A forward allocates one workspace sized
 * from its token count; forwards on one model must not run concurrently.
 */
#ifndef CLEF_MODEL_MODEL_H
#define CLEF_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "decision/record.h"
#include "io/checkpoint.h"
#include "util/err.h"

typedef struct clef_model clef_model;

/* Bind every thinker text-decoder and head tensor of `ck` (names, dtypes and
 * shapes checked against the config; a missing or mis-shaped tensor is an
 * error naming it).  `n_threads` <= 0 means all cores.  Returns NULL + err. */
clef_model *clef_model_create(const clef_checkpoint *ck, int n_threads, clef_err *err);
/* Same, on a backend the caller made (e.g. a device backend); with
 * `own_backend` the model destroys it in clef_model_free.  On failure the
 * backend is destroyed too when owned.  Returns NULL + err. */
clef_model *clef_model_create_on(const clef_checkpoint *ck, clef_backend *be, int own_backend, clef_err *err);
/* Same, placing the experts of the layers `plan` streams (engine/placement.h)
 * in the backend's streamed slots (backend.h experts_stream_begin): 500 when
 * the plan streams layers and the backend cannot stream.  plan NULL or
 * streaming nothing: clef_model_create_on. */
struct clef_place_plan;
clef_model *clef_model_create_placed(const clef_checkpoint *ck, clef_backend *be, int own_backend,
                                     const struct clef_place_plan *plan, clef_err *err);
void clef_model_free(clef_model *m);

/* The backend the model runs on (borrowed). */
clef_backend *clef_model_backend(clef_model *m);

const clef_config *clef_model_config(const clef_model *m);

/* Thinker forward over one record, text positions 0..n-1 on all three M-RoPE
 * axes.
 *   ids:            [n] token ids, each < vocab_size (else error 422)
 *   hidden:         out [n, H] f32, the final-norm hidden states
 *   layer_hidden:   optional out [(num_hidden_layers + 1), n, H] f32:
 *                   [0] = embeddings, [l+1] = after layer l (the last one is
 *                   replaced by the final-norm output, as in transformers'
 *                   hidden_states), or NULL
 * Returns 0 or -1 + err. */
int clef_thinker_forward(clef_model *m, const int32_t *ids, size_t n, float *hidden, float *layer_hidden,
                         clef_err *err);

/* Thinker forward over several records packed back to back into one pass.
 *   ids:          [n_total] token ids, each < vocab_size (else error 422)
 *   seg:          [n_seg + 1] record boundaries, seg[0] = 0, seg[n_seg] =
 *                 n_total, non-decreasing; attention never crosses a boundary
 *   positions:    optional [3][n_total] M-RoPE positions (T, H, W axes); NULL =
 *                 text positions 0..len-1 of each record on all three axes
 *   hidden:       out [n_total, H] f32, final-norm hidden states
 *   layer_hidden: optional out [(num_hidden_layers + 1), n_total, H] as in
 *                 clef_thinker_forward, or NULL
 * Every record's rows are bitwise identical to running it alone.  Workspace:
 * one backend allocation sized from n_total (failure: 422 "too many tokens").
 * Returns 0 or -1 + err. */
int clef_thinker_forward_batch(clef_model *m, const int32_t *ids, size_t n_total, const size_t *seg, size_t n_seg,
                               const int32_t *positions, float *hidden, float *layer_hidden, clef_err *err);

/* Media rows of one packed forward (SPEC §9 "Into the thinker"), host
 * arrays from the vision and audio towers (model/towers.h):
 *   rows/embeds:    the embedding of token rows[i] (ascending indices into
 *                   the packed ids: every image, video and audio pad) is
 *                   replaced by embeds[i, :H]
 *   ds_rows/deepstack: after decoder layer k < n_deepstack, deepstack[k][j, :H]
 *                   is added to row ds_rows[j] (the image and video pads) */
typedef struct clef_thinker_media {
    size_t n_rows;
    const size_t *rows;
    const float *embeds;    /* [n_rows, H] */
    size_t n_ds_rows;
    const size_t *ds_rows;
    size_t n_deepstack;
    const float *deepstack; /* [n_deepstack][n_ds_rows, H] */
} clef_thinker_media;

/* clef_thinker_forward_batch with media rows (NULL = none); `positions`
 * should then be the records' 3-D M-RoPE positions (clef_record.positions). */
int clef_thinker_forward_media(clef_model *m, const int32_t *ids, size_t n_total, const size_t *seg, size_t n_seg,
                               const int32_t *positions, const clef_thinker_media *media, float *hidden,
                               float *layer_hidden, clef_err *err);

/* clef_thinker_forward_media with the final-norm hidden states left in
 * backend memory: `hidden_be` [n_total, H] f32 was allocated with
 * clef_model_backend(m)->ops->alloc by the caller (who frees it), and is
 * what clef_head_forward_backend reads.  Saves the device-to-host copy of
 * every hidden row (and the copy back per record) on a device backend;
 * identical values.  Returns 0 or -1 + err. */
int clef_thinker_forward_backend(clef_model *m, const int32_t *ids, size_t n_total, const size_t *seg, size_t n_seg,
                                 const int32_t *positions, const clef_thinker_media *media, float *hidden_be,
                                 clef_err *err);

/* ---- Reuse of a cached prefix (the engine's state cache, engine/state_cache.h) ----
 *
 * A record's first tokens can be taken from blocks of CLEF_KV_BLOCK tokens
 * computed by an earlier forward: a causal decoder's K/V and final hidden
 * rows at position i depend only on positions 0..i (ids, M-RoPE positions,
 * media rows), so a forward over the remaining rows that reads the blocks'
 * K/V gives bitwise the rows of the full forward (per-row ops are packing
 * invariant; the attention's query blocks are cut at absolute positions, a
 * multiple of CLEF_KV_BLOCK: backend.h `causal_prefix`).
 *
 * One block is clef_kv_block_floats(m) f32 of backend memory, allocated by
 * the caller: for layer l (of L), K at block + 2 l B kd and V at
 * block + (2 l + 1) B kd (each [B, kd] rows, kd = num_key_value_heads *
 * head_dim; K after its q/k norm and M-RoPE at the tokens' absolute
 * positions), then the final-norm hidden rows [B, H] at block + 2 L B kd. */
#define CLEF_KV_BLOCK 64

typedef struct clef_thinker_reuse {
    const size_t *reuse; /* [n_seg] leading tokens of record s read from blocks: a multiple of CLEF_KV_BLOCK,
                            less than the record's length */
    float *const *read;  /* the read blocks, record by record (reuse[s] / CLEF_KV_BLOCK for record s) */
    const size_t *fill;  /* [n_seg] blocks this forward fills for record s: its positions
                            [reuse[s], reuse[s] + fill[s] B), which must lie inside the record */
    float *const *write; /* the blocks to fill, record by record */
} clef_thinker_reuse;

/* Floats of one cached block for this model (see above). */
size_t clef_kv_block_floats(const clef_model *m);

/* 1 when the model's forward can read and fill blocks: the backend has
 * `causal_prefix` and every layer multiplies q, k and v one by one (a fused
 * [q | k | v] layer keeps K in strided rows the block copies do not take). */
int clef_model_can_reuse(const clef_model *m);

/* clef_thinker_forward_backend with some records' leading rows read from
 * cached blocks and some blocks filled (reuse NULL, or every reuse[s] and
 * fill[s] 0: exactly clef_thinker_forward_backend).  hidden_be [n_total, H]
 * gets every row, the reused ones copied from their blocks; media rows that
 * fall in a reused prefix are skipped (media may then be NULL when none is
 * left).  Same errors, plus 500 for a reuse that is not block-aligned or
 * does not leave a row to compute. */
int clef_thinker_forward_reuse(clef_model *m, const int32_t *ids, size_t n_total, const size_t *seg, size_t n_seg,
                               const int32_t *positions, const clef_thinker_media *media,
                               const clef_thinker_reuse *reuse, float *hidden_be, clef_err *err);

/* Joint schema head over one record (SPEC §7.3), in f32.
 *   hidden: [rec->n_ids, H] from clef_thinker_forward
 *   logits: out [clef_record_total_options(rec)] in question order, then each
 *           question's options in encoding order.
 * Errors: an empty question span is 422 (invalid_request, param
 * "questions"); a record without questions, a question without options, an
 * empty or out-of-range option span, or a token id outside the vocabulary is
 * 500; a non-finite logit is 500 (never returned as NaN). */
int clef_head_forward(clef_model *m, const float *hidden, const clef_record *rec, float *logits, clef_err *err);

/* clef_head_forward reading the record's hidden rows [rec->n_ids, H] in
 * backend memory (a slice of clef_thinker_forward_backend's output),
 * borrowed and not modified.  Same errors and values. */
int clef_head_forward_backend(clef_model *m, const float *hidden_be, const clef_record *rec, float *logits,
                              clef_err *err);

#endif
