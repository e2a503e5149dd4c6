/* checkpoint.h — a Clef-Omni checkpoint directory (SPEC.md §1.1).
 *
 * Opens config.json, model.safetensors.index.json (or a single
 * model.safetensors), every shard it names, and joint_head.safetensors, and
 * builds one catalog of tensors by name.  Tensors named `talker.*` and
 * `code2wav.*` are skipped.  The index's weight_map must agree with the
 * shards (a tensor the index names must be in that shard).
 */
#ifndef CLEF_IO_CHECKPOINT_H
#define CLEF_IO_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "io/config.h"
#include "io/safetensors.h"
#include "util/err.h"

typedef struct clef_checkpoint {
    char *dir;                 /* owned; NULL for an in-memory synthetic checkpoint */
    clef_config config;        /* thinker text config + head config */
    size_t n_shards;
    st_file *shards;           /* [n_shards] thinker shards, then joint_head.safetensors last */
    size_t n_tensors;          /* catalog size (skipped tensors excluded) */
    const st_tensor **catalog; /* sorted by name for bsearch; points into shards */
    char *config_json;         /* owned; an in-memory checkpoint's config.json text (e.g. a quantized
                                  synthetic one, quant/qsynth.h, whose quantization_config the model reads
                                  from here), NULL otherwise */
    size_t config_json_len;
    char *hf_quant_json;       /* owned; its hf_quant_config.json text (ModelOpt), or NULL */
    size_t hf_quant_json_len;
} clef_checkpoint;

/* Open `dir`: load both configs (clef_config_load), read the index (or fall
 * back to a single model.safetensors), st_open each distinct shard the index
 * names for a kept tensor exactly once, then joint_head.safetensors
 * (required), and build the catalog.  Errors (500, "internal_error", message
 * naming the file): a missing/invalid file, a shard name that is not a plain
 * file name, a tensor name present in two files ("duplicate name"), a tensor
 * the weight_map puts in a shard that does not hold it.  On failure `ck` is
 * left zeroed; on success release with clef_checkpoint_close. */
int clef_checkpoint_open(const char *dir, clef_checkpoint *ck, clef_err *err);
/* Unmap every shard and free the catalog; every st_tensor pointer obtained
 * from `ck` dies here.  Safe on a zeroed struct; leaves `ck` zeroed. */
void clef_checkpoint_close(clef_checkpoint *ck);

/* An in-memory synthetic checkpoint (io/synth.h): the random bf16 weights of
 * `preset` ("tiny", "small" or "full") for `seed`, drawn in parallel (OpenMP)
 * into anonymous memory maps — bitwise the tensors `clef synth` writes for the
 * same preset and seed — with the config filled from the preset.  Same
 * catalog as a directory checkpoint, so clef_model_create binds it the same
 * way; `dir` is NULL (no config files; the weights are plain BF16) and shard
 * paths read "synthetic-<preset>/model-00001-of-0000N.safetensors".  Errors
 * (500): unknown preset, memory that cannot be mapped (full needs ≈ 61 GB).
 * On failure `ck` is left zeroed; release with clef_checkpoint_close. */
int clef_checkpoint_synthetic(const char *preset, uint64_t seed, clef_checkpoint *ck, clef_err *err);

/* Tensor by name (thinker names carry the "thinker." prefix; head names are
 * bare as in joint_head.safetensors), or NULL.  O(log n) bsearch. */
const st_tensor *clef_checkpoint_find(const clef_checkpoint *ck, const char *name);

/* Like clef_checkpoint_find, but an absent tensor, a dtype not in
 * `allowed_dtypes_mask` (bit i = clef_dtype i, see CLEF_DT_BIT; 0 = any), or
 * a shape differing from `shape[0..ndim)` is an error (500) naming the file,
 * the tensor and what was expected, e.g.
 *   "model-00001-of-00002.safetensors: tensor
 *    'thinker.model.layers.0.self_attn.q_proj.weight': expected shape [64,32],
 *    found [64,33]"
 * ndim < 0 skips the shape check (shape may then be NULL); ndim 0 demands a
 * 0-d scalar. */
const st_tensor *clef_checkpoint_require(const clef_checkpoint *ck, const char *name, unsigned allowed_dtypes_mask,
                                         int ndim, const int64_t *shape, clef_err *err);

/* Refuse a checkpoint holding a NaN or Inf weight (io/finite.c): every
 * catalog tensor of a floating dtype (BF16, F16, F32, F8_E4M3: weights,
 * norms, biases, the head, the media towers, and the quantization scales of
 * a quantized checkpoint) is read once, in parallel on `n_threads` (<= 0:
 * all OpenMP threads).  With `skip_towers` the thinker.visual.* and
 * thinker.audio_tower.* tensors are left out (they are not loaded then).
 * Integer and packed tensors (U8 FP4/INT4 codes, I32...) cannot hold a
 * non-finite value and are not read.  Sets *checked_bytes (if not NULL) to
 * the bytes read.  Returns 0, or -1 with err (500) naming the first bad
 * element in file order, e.g. "model-00001-of-00002.safetensors: tensor
 * 'thinker.model.norm.weight' holds a non-finite value (NaN) at element 3"
 * (or "+Inf" / "-Inf"; E4M3 has NaN only).  On a mapped checkpoint this
 * touches every page of those tensors (disk reads on a cold cache). */
int clef_checkpoint_check_finite(const clef_checkpoint *ck, int skip_towers, int n_threads, size_t *checked_bytes,
                                 clef_err *err);

#endif
