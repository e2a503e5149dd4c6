/* config.h — the parts of config.json and joint_head_config.json clef uses.
 *
 * Thinker text config (SPEC.md §6.1) is read from
 * thinker_config.text_config, in either RoPE form: transformers-5
 * `rope_parameters` or older `rope_scaling` + `rope_theta`.  A rope_type other
 * than "default", or `interleaved`/`mrope_interleaved` present and false, is
 * rejected.  Head config from joint_head_config.json (SPEC.md §7.1); its
 * hidden_size must equal the thinker's.
 */
#ifndef CLEF_IO_CONFIG_H
#define CLEF_IO_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"
#include "util/file.h"

#define CLEF_MAX_LAYERS 256

typedef struct clef_text_config {
    int64_t vocab_size;          /* 152064 */
    int64_t hidden_size;         /* H: 2048 */
    int64_t num_hidden_layers;   /* 48 */
    int64_t num_attention_heads; /* n_h: 32 */
    int64_t num_key_value_heads; /* n_kv: 4 */
    int64_t head_dim;            /* D: 128 (hidden/heads if absent) */
    double rms_norm_eps;         /* 1e-6 */
    int64_t num_experts;         /* 128 */
    int64_t num_experts_per_tok; /* k: 8 */
    int64_t moe_intermediate_size; /* 768 */
    int64_t intermediate_size;   /* dense MLP width (unused by Clef-Omni) */
    int norm_topk_prob;          /* 1 */
    int64_t decoder_sparse_step; /* 1 */
    uint8_t mlp_only[CLEF_MAX_LAYERS]; /* 1 = layer listed in mlp_only_layers */
    int64_t max_position_embeddings; /* 65536 */
    double rope_theta;           /* 1e6 */
    int64_t mrope_section[3];    /* [24,20,20] */
} clef_text_config;

typedef struct clef_head_config {
    int64_t hidden_size;    /* H, must equal the thinker's */
    int64_t width;          /* W: 1024 */
    int64_t routing_layers; /* 2 */
    int64_t layers;         /* 4 */
    int64_t heads;          /* 16 */
    int64_t feedforward;    /* F: 4096 */
} clef_head_config;

typedef struct clef_config {
    clef_text_config text;
    clef_head_config head;
    /* thinker token ids (thinker_config), -1 if absent */
    int64_t image_token_id, video_token_id, audio_token_id, audio_start_token_id, vision_start_token_id;
    int64_t position_id_per_seconds;
} clef_config;

/* Parse `<dir>/config.json` and `<dir>/joint_head_config.json` into `cfg`.
 * Returns 0 or -1 with err (500, "internal_error", message naming file and
 * key, e.g. "config.json: required key thinker_config.text_config.hidden_size
 * is missing").
 *
 * Required (no default): vocab_size, hidden_size, num_hidden_layers,
 * num_attention_heads, num_key_value_heads, num_experts, num_experts_per_tok,
 * moe_intermediate_size, rms_norm_eps, and θ (rope_parameters.rope_theta or
 * rope_theta); all six head fields.  Optional, with the SPEC §6.1 Clef-Omni
 * value when absent: head_dim (hidden/heads), norm_topk_prob (true),
 * decoder_sparse_step (1), mlp_only_layers ([]), max_position_embeddings
 * (65536), mrope_section ([24,20,20]), intermediate_size (0; required only if
 * some layer is dense).  Checked: sizes positive, heads % kv_heads == 0,
 * k <= num_experts, layers <= CLEF_MAX_LAYERS, head_dim even, head hidden ==
 * thinker hidden, head width % heads == 0, token ids inside the vocabulary. */
int clef_config_load(const char *dir, clef_config *cfg, clef_err *err);

/* Parse the two files' text directly (used by tests and by the loader);
 * same rules and errors as clef_config_load.  `cfg` is zeroed first. */
int clef_config_parse(const char *config_json, size_t config_len, const char *head_json, size_t head_len,
                      clef_config *cfg, clef_err *err);

/* Read `<dir>/<name>` whole into a NUL-terminated heap buffer (caller frees)
 * and set *len to its byte length, through clef_file_read: a file that is not
 * regular (a FIFO, /dev/zero) or is over `max_bytes` (CLEF_FILE_MAX_CONFIG,
 * CLEF_FILE_MAX_INDEX of util/file.h) is refused before it is read.  Returns
 * NULL with err (500, message naming "<dir>/<name>", trailing slashes of
 * `dir` dropped) when it cannot be read. */
char *clef_read_text_file(const char *dir, const char *name, size_t max_bytes, size_t *len, clef_err *err);

/* Whether layer `l` uses the MoE block (SPEC §6.1). */
int clef_layer_is_moe(const clef_text_config *c, int64_t l);

#endif
