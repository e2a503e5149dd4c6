/* convert.h — `clef quantize`: write a quantized checkpoint from a BF16 one
 * (SPEC.md §10.3 naming, loadable by transformers / vLLM and by clef).
 *
 * Streams shard by shard with bounded host memory: every input shard is
 * mapped (not read), each routed expert of the thinker decoder
 * (thinker.model.layers.<l>.mlp.experts.<e>.{gate,up,down}_proj.weight) is
 * converted to f32 one matrix at a time, quantized and written at its final
 * offset in the output shard; every other tensor (attention, routers,
 * norms, embeddings, towers, talker, ...) is copied byte for byte.  Source
 * pages are released (madvise) after use, so resident memory stays at a few
 * matrices whatever the model size.
 *
 * Output directory: the same shard file names (same tensor → shard
 * assignment, experts replaced by their companions), config.json with the
 * format's quantization_config (+ hf_quant_config.json for ModelOpt), the
 * index, every other file of the input directory copied (tokenizer, joint
 * head, ...), and quant_stats.json:
 *   {"format", "layout", "layers": [{"layer", "rel_l2", "mean_matrix_rel_l2", "matrices"}],
 *    "mean_rel_l2", "mean_matrix_rel_l2", "peak_rss_bytes", "seconds", "bytes_in", "bytes_out"}
 * with rel_l2 = sqrt(Σ‖W − deq(Q(W))‖² / Σ‖W‖²) over the layer's expert
 * matrices (deq = clef_qweight_rows_f32 on what was written).
 */
#ifndef CLEF_QUANT_CONVERT_H
#define CLEF_QUANT_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "quant/format.h"
#include "util/err.h"

struct clef_checkpoint;

typedef struct clef_quantize_options {
    const char *model_dir;     /* BF16 checkpoint (no quantization_config); NULL with `synthetic` */
    const char *synthetic;     /* instead of model_dir: a synthetic preset ("tiny", "small", "full";
                                  io/synth.h) drawn for `seed` tensor by tensor — the tensors, shard names
                                  and config.json `clef synth` would write (quant/qsynth.h) */
    uint64_t seed;             /* seed of the synthetic weights */
    const char *tokenizer;     /* synthetic to files: tokenizer.json copied into out_dir (required) */
    const char *out_dir;       /* created if missing; must differ from model_dir; NULL with `memory` */
    struct clef_checkpoint *memory; /* non-NULL: build the quantized checkpoint in memory here instead
                                  of writing out_dir (no quant_stats.json; config_json holds the
                                  config.json text); zeroed first, release with clef_checkpoint_close */
    clef_quant_format format;  /* NVFP4_CT, NVFP4_MODELOPT, FP8_BLOCK or INT4_AUTOROUND */
    int stacked;               /* NVFP4 (compressed-tensors) only: experts stacked per layer */
    int64_t group;             /* INT4 group size; 0 = 128.  A module narrower than the group uses its
                                  width (recorded in extra_config) */
    int64_t block[2];          /* FP8 block; {0,0} = 128×128 */
    int progress;              /* progress lines on stderr */
} clef_quantize_options;

typedef struct clef_quantize_report {
    size_t shards;              /* shard files written */
    size_t copied;              /* tensors copied unchanged */
    size_t quantized;           /* expert matrices quantized */
    size_t bytes_in, bytes_out; /* tensor data bytes read / written (all shards) */
    double mean_rel_l2;         /* mean over layers of the per-layer pooled relative L2 error */
    double mean_matrix_rel_l2;  /* mean over expert matrices of their relative L2 error */
    size_t peak_rss_bytes;      /* peak RSS at the end (VmHWM, clef_peak_rss_bytes) */
    double seconds;
} clef_quantize_report;

/* Quantize `o->model_dir` (or the synthetic preset) into `o->out_dir` (or
 * into `*o->memory`).  Errors (500, naming the file or tensor): an input
 * that is already quantized, an expert whose shape the format cannot pack
 * (NVFP4: in % 16; INT4: in % 8, out % 8), --layout stacked for a format
 * SPEC §10.3 defines no stacked form for (every format but
 * compressed-tensors NVFP4; the message names the format and its layouts),
 * stacked layout with a layer's experts incomplete, I/O failures.  On
 * error the output directory may hold partial files.  `rep` may be NULL. */
int clef_quantize_checkpoint(const clef_quantize_options *o, clef_quantize_report *rep, clef_err *err);

/* Parse a CLI format name: "nvfp4" (compressed-tensors), "nvfp4-modelopt",
 * "fp8-block", "int4"; also the detected names ("nvfp4-ct",
 * "int4-autoround").  Returns -1 for anything else. */
int clef_quant_format_parse(const char *s, clef_quant_format *out);

#endif
