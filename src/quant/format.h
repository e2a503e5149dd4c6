/* format.h — which quantized checkpoint format a directory holds
 * (SPEC.md §10.3), read from config.json → quantization_config (and
 * hf_quant_config.json for NVIDIA ModelOpt) and cross-checked against the
 * tensor names of the checkpoint.
 *
 * Formats clef reads:
 *   nvfp4-ct        compressed-tensors "nvfp4-pack-quantized" (W4A16 or W4A4),
 *                   per-expert or experts stacked per layer
 *   nvfp4-modelopt  NVIDIA ModelOpt NVFP4
 *   fp8-block       quant_method "fp8" with weight_block_size [Br,Bc]
 *   int4-autoround  AutoRound "auto_round:auto_gptq" packing, 4 bits
 * Anything else under quantization_config (or quantized tensors without a
 * quantization_config) is a load error naming the key or tensor and what was
 * expected: clef never falls back to BF16 silently.
 */
#ifndef CLEF_QUANT_FORMAT_H
#define CLEF_QUANT_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

struct clef_checkpoint;

typedef enum clef_quant_format {
    CLEF_QF_NONE,           /* no quantization_config: every tensor as stored (BF16) */
    CLEF_QF_NVFP4_CT,       /* (a) compressed-tensors NVFP4 */
    CLEF_QF_NVFP4_MODELOPT, /* (b) NVIDIA ModelOpt NVFP4 */
    CLEF_QF_FP8_BLOCK,      /* (d) FP8 E4M3 with Br×Bc block scales */
    CLEF_QF_INT4_AUTOROUND, /* (e) AutoRound INT4, auto_gptq packing */
    CLEF_QF_COUNT
} clef_quant_format;

/* How a module-exclusion pattern list is matched against a module name such
 * as "thinker.model.layers.0.mlp.gate" (each publisher's own rule). */
typedef enum clef_quant_match {
    CLEF_QM_CT,        /* compressed-tensors `ignore`: "re:<regex>" = Python re.match (anchored at the
                          start), otherwise the exact name (or a ".name" suffix) */
    CLEF_QM_FNMATCH,   /* ModelOpt `exclude_modules`: shell glob over the whole name */
    CLEF_QM_SUBSTRING  /* transformers `modules_to_not_convert`: the entry occurs in the name */
} clef_quant_match;

/* An AutoRound `extra_config` entry (exact module name). */
typedef struct clef_quant_override {
    char *module;       /* owned */
    int64_t bits;       /* 16 (or more) = this module is not quantized; 0 = not given */
    int64_t group_size; /* 0 = not given (use the config's) */
    int sym;            /* -1 = not given */
} clef_quant_override;

/* The parsed quantization metadata.  Zero-initialise, fill with
 * clef_quant_config_parse / _load / clef_quant_detect, release with
 * clef_quant_config_free. */
typedef struct clef_quant_config {
    clef_quant_format format;
    char method[64];        /* quant_method as written ("compressed-tensors", "modelopt", "fp8", "auto-round") */
    int w4a4;               /* nvfp4-ct: input_activations present (dynamic "local"): the checkpoint
                               carries input_global_scale; clef computes activations unquantized */
    int64_t group_size;     /* NVFP4: 16; INT4: the default G (extra_config may override per module) */
    int64_t block[2];       /* FP8: weight_block_size [Br, Bc] */
    int bits;               /* INT4: 4 */
    int sym;                /* INT4: 1 symmetric (stored zero 7 means 8), 0 asymmetric v1 (zero = nibble + 1) */
    int stacked;            /* set by clef_quant_detect: experts stored stacked per layer
                               (mlp.experts.gate_up_proj / down_proj) */
    clef_quant_match match; /* how `excluded` is matched */
    size_t n_excluded;
    char **excluded;        /* [n_excluded] owned patterns (ignore / exclude_modules / modules_to_not_convert) */
    void **excluded_re;     /* [n_excluded] compiled "re:" patterns (pcre2_code *), NULL for others */
    size_t n_overrides;
    clef_quant_override *overrides; /* [n_overrides] INT4 extra_config */
} clef_quant_config;

/* Short name used by the CLI and `clef inspect`: "bf16", "nvfp4-ct",
 * "nvfp4-modelopt", "fp8-block", "int4-autoround". */
const char *clef_quant_format_name(clef_quant_format f);

/* Parse config.json text (quantization_config at the top level, or under
 * thinker_config) and, when `hf_quant_json` is non-NULL, the text of
 * hf_quant_config.json.  Errors (500): unknown quant_method / format /
 * quant_algo / packing_format, weights that are not 4-bit float groups of 16
 * (NVFP4), a block size that is not two positive integers (FP8), bits other
 * than 4 or a group size < 1 (INT4), an hf_quant_config.json that disagrees
 * with config.json, a "re:" pattern that does not compile — each message
 * names the file and key.  `qc` is zeroed first; free it even on error. */
int clef_quant_config_parse(const char *config_json, size_t config_len, const char *hf_quant_json, size_t hf_len,
                            clef_quant_config *qc, clef_err *err);

/* Read <dir>/config.json and, if present, <dir>/hf_quant_config.json, then
 * clef_quant_config_parse. */
int clef_quant_config_load(const char *dir, clef_quant_config *qc, clef_err *err);

/* clef_quant_config_load on the checkpoint's directory (an in-memory
 * checkpoint: clef_quant_config_parse of ck->config_json / hf_quant_json, or
 * CLEF_QF_NONE when it has none), then check its
 * tensor names: every companion tensor (weight_packed, weight_scale,
 * weight_global_scale, weight_scale_2, input_scale, input_global_scale,
 * weight_scale_inv, qweight, qzeros, scales) must belong to the detected
 * format, and each quantized module must carry all of its format's required
 * companions.  Sets qc->stacked.  Error (500) example:
 * "tensor 'thinker.model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv' is an FP8-block companion, but
 *  config.json's quantization_config is compressed-tensors NVFP4". */
int clef_quant_detect(const struct clef_checkpoint *ck, clef_quant_config *qc, clef_err *err);

void clef_quant_config_free(clef_quant_config *qc);

/* 1 when the config keeps Linear module `module` (e.g.
 * "thinker.model.layers.0.self_attn.q_proj", no ".weight") unquantized:
 * matched by the exclusion list, or an INT4 extra_config entry with
 * bits >= 16.  0 for CLEF_QF_NONE's nothing-is-quantized case is never
 * asked; it returns 1 there. */
int clef_quant_module_excluded(const clef_quant_config *qc, const char *module);

/* INT4 group size G for `module`: extra_config[module].group_size when
 * given, else the config's group_size.  NVFP4: 16.  Others: 0. */
int64_t clef_quant_group_size(const clef_quant_config *qc, const char *module);

/* INT4 symmetry for `module` (extra_config override, else the config's). */
int clef_quant_module_sym(const clef_quant_config *qc, const char *module);

#endif
