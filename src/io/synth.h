/* synth.h — synthetic (random-weight) Clef-Omni checkpoints for tests and
 * benchmarks: `clef synth` writes one in the release layout (SPEC.md §1.1),
 * clef_checkpoint_synthetic (io/checkpoint.h) draws the same weights straight
 * into memory.
 *
 * Presets (text decoder sizes; the head is SPEC §7.1's, at the preset width):
 *   tiny   the tiny fixture's sizes: hidden 32, 3 layers, 4/2 heads of 16,
 *          8 experts of 16, top-2, mrope_section [4,2,2]; head W 64, 4 heads,
 *          F 128 (≈ 20 MB)
 *   small  real widths, 4 layers: hidden 2048, 32/4 heads of 128, 128
 *          experts of 768, top-8, [24,20,20]; head W 1024, 16 heads, F 4096
 *          (≈ 6.2 GB)
 *   full   the real shapes: as small with 48 layers (≈ 61 GB)
 * small and full also carry the media towers at the real widths (full: the
 * real depths, vision 27 blocks with deepstack at 8/16/24 and audio 32
 * layers, ≈ 2.4 GB; small: 4 blocks with deepstack at 1/2/3 and 4 audio
 * layers), in their own shard model-towers.safetensors; tiny has none.
 * clef_synth_towers_checkpoint draws the towers alone (to time them without
 * the thinker's experts).
 * All presets use the real vocabulary (152064) so the real tokenizer's ids
 * are valid.  Only the thinker's text decoder (+ lm_head) and the joint head
 * are drawn, plus the towers above; never a talker.
 *
 * Weights (bf16).  Element i of tensor `name` is a function of (seed, name,
 * i) alone — a splitmix64 hash of a per-tensor key plus the counter, turned
 * into an approximately normal value (Irwin–Hall sum of four 16-bit uniforms,
 * exact unit variance, tails cut at ±3.46σ) — so tensors and their pieces can
 * be drawn in parallel and in any order with bitwise identical results, and
 * the written and the in-memory checkpoints of one seed hold identical bytes.
 * Scales keep activations O(1) through the layers:
 *   embed_tokens, lm_head, type_embedding   N(0, 1)
 *   every other matrix [out,in]             N(0, 1/in)   (router included:
 *                                           logits ~N(0,1), routing spread)
 *   norm weights (RMSNorm/LayerNorm, the    1 + N(0, 0.1²)
 *   towers' ln_q / ln_post too)
 *   tower conv kernels [out, in, k...]      N(0, 1/fan_in), fan_in = in·k...
 *                                           (likewise every matrix: the
 *                                           product of the dims after the
 *                                           first)
 *   q_norm, k_norm weights                  3 + N(0, 0.3²): attention scores of
 *                                           std ~9, so attention is sharp.  With
 *                                           weights ~1 attention averages over the
 *                                           context, passing what all tokens share
 *                                           and damping the rest; layer by layer
 *                                           that shared part took over the residual
 *                                           stream (78% after 24 layers) and most
 *                                           tokens chose the same experts (measured
 *                                           on a 512-wide 48-layer model: 32 of 128
 *                                           experts used at layer 47; with 3: 124,
 *                                           shared part 22%)
 *   biases                                  N(0, 0.02²)
 *   prior_logit_scale, joint_logit_scale    ln 10 (bf16: 2.296875)
 *   residual_gate                           0 (gate σ(0) = 0.5)
 */
#ifndef CLEF_IO_SYNTH_H
#define CLEF_IO_SYNTH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/checkpoint.h"
#include "util/buf.h"
#include "util/err.h"

/* Shards of a written synthetic checkpoint hold at most this many bytes of
 * tensor data (a single larger tensor gets a shard of its own). */
#define CLEF_SYNTH_SHARD_BYTES ((size_t)4 << 30)

/* Sizes of one preset (the config.json / joint_head_config.json values). */
typedef struct clef_synth_preset {
    const char *name;
    int64_t vocab, hidden, layers, heads, kv_heads, head_dim;
    int64_t experts, experts_per_tok, moe_inter, inter;
    int64_t mrope_section[3];
    int64_t head_width, head_heads, head_ff, head_routing_layers, head_layers;
    /* Media towers (thinker.visual.*, thinker.audio_tower.*) at the real
     * Qwen3-Omni-30B-A3B widths (vision hidden 1152, 16 heads, MLP 4304,
     * out 2048, position table 48x48; audio d_model 1280, 20 heads, FFN
     * 5120, 480 conv channels, out 2048, n_window 50 / 800): these depths,
     * 0 = no towers (the preset's config.json then has no vision_config /
     * audio_config). */
    int64_t vision_depth, vision_deepstack[3], audio_layers;
} clef_synth_preset;

/* Preset by name ("tiny", "small", "full"), or NULL with err (500, message
 * listing the valid names). */
const clef_synth_preset *clef_synth_preset_find(const char *name, clef_err *err);

/* The preset's config.json (transformers-5 nested form: thinker_config.
 * text_config with rope_parameters, as the tiny fixture's) and
 * joint_head_config.json texts, appended to `out`.  The seed is recorded in
 * config.json under "clef_synthetic" for provenance. */
void clef_synth_config_json(const clef_synth_preset *p, uint64_t seed, clef_buf *out);
void clef_synth_head_config_json(const clef_synth_preset *p, clef_buf *out);

/* One tensor to draw. */
typedef struct clef_synth_tensor {
    char *name;          /* owned by the plan; thinker names carry "thinker.", head names are bare */
    int ndim;            /* 0..5 (tower conv kernels are 4-d and 5-d) */
    int64_t shape[5];
    size_t numel;
    double mean, std;    /* value = bf16(mean + std * z), z ~ unit-variance Irwin–Hall(4) */
    uint64_t key;        /* per-tensor stream key from (seed, name) */
    int shard;           /* thinker shard index 0..n_shards-1, or -1 = joint_head.safetensors */
    int expert;          /* 1 = a per-expert tensor (written after every non-expert tensor) */
} clef_synth_tensor;

/* Every tensor of a preset, thinker tensors in shard order (non-expert ones
 * first, sorted by name; then experts by layer, expert, projection), then the
 * 122 head tensors. */
typedef struct clef_synth_plan {
    const clef_synth_preset *preset;
    uint64_t seed;
    size_t n;
    clef_synth_tensor *t;  /* [n] */
    int n_shards;          /* thinker shards */
    size_t *shard_bytes;   /* [n_shards] tensor data bytes per shard */
    size_t head_bytes;     /* joint head data bytes */
} clef_synth_plan;

/* The media tower tensors of preset `p` (none when it has no towers), sorted
 * by name, all in thinker shard 0 of their own plan (n_shards 1; head_bytes
 * 0).  Free with clef_synth_plan_free. */
void clef_synth_towers_plan_make(const clef_synth_preset *p, uint64_t seed, clef_synth_plan *plan);

/* Build the plan of preset `p` for `seed`; shards hold at most
 * `max_shard_bytes` of data (0 = CLEF_SYNTH_SHARD_BYTES).  Free with
 * clef_synth_plan_free (safe on a zeroed plan). */
void clef_synth_plan_make(const clef_synth_preset *p, uint64_t seed, size_t max_shard_bytes, clef_synth_plan *plan);
void clef_synth_plan_free(clef_synth_plan *plan);

/* Draw elements [first, first + count) of tensor `t` as bf16 (little-endian
 * u16) into out[0..count).  Pure function of (t->key, t->mean, t->std, index);
 * uses OpenMP threads when count is large.  Deterministic across machines and
 * compilers (integer hash; the one float product is exact in double). */
void clef_synth_fill(const clef_synth_tensor *t, size_t first, size_t count, uint16_t *out);

/* Shard file name of thinker shard `s` of `n` ("model-00001-of-00016.safetensors")
 * into out[0..cap). */
void clef_synth_shard_name(int s, int n, char *out, size_t cap);

/* Options of clef_synth_write. */
typedef struct clef_synth_options {
    const char *preset;       /* "tiny", "small" or "full" */
    uint64_t seed;
    const char *out_dir;      /* created if absent; existing files of the same names are replaced */
    const char *tokenizer;    /* tokenizer.json to copy into out_dir */
    size_t max_shard_bytes;   /* 0 = CLEF_SYNTH_SHARD_BYTES */
    FILE *progress;           /* a line per shard (bytes, seconds, GB/s), or NULL */
} clef_synth_options;

/* Write a synthetic checkpoint directory: model-NNNNN-of-MMMMM.safetensors
 * shards (metadata {"format":"pt"}) + model.safetensors.index.json,
 * config.json, joint_head.safetensors (122 tensors) + joint_head_config.json,
 * and a copy of the tokenizer.  Streams tensor by tensor in pieces of at most
 * 64 MiB, so memory stays bounded whatever the preset.  Returns 0, or -1 with
 * err (500, message naming the file) — a failed shard is deleted. */
int clef_synth_write(const clef_synth_options *opt, clef_err *err);

/* clef_checkpoint_synthetic (io/checkpoint.h) with a progress line (bytes,
 * seconds, GB/s) on `progress` when not NULL. */
int clef_synth_checkpoint(const char *preset, uint64_t seed, FILE *progress, clef_checkpoint *ck, clef_err *err);

/* Only the media towers of `preset` in memory (one shard,
 * "synthetic-<preset>/model-towers.safetensors"), bitwise the tower tensors
 * of clef_synth_checkpoint, with the preset's config (ck->config and
 * ck->config_json, so model/towers.h binds them).  Errors (500): unknown
 * preset, a preset without towers, memory that cannot be mapped.  Release
 * with clef_checkpoint_close. */
int clef_synth_towers_checkpoint(const char *preset, uint64_t seed, FILE *progress, clef_checkpoint *ck,
                                 clef_err *err);

#endif
