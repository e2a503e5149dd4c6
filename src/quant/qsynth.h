/* qsynth.h — quantized models without BF16 files: the weights of a
 * synthetic preset (io/synth.h) drawn and quantized in one pass, either
 * into memory (an engine option: `--synthetic P --quant F`) or to a
 * checkpoint directory (`clef quantize --synthetic P`).
 *
 * Both routes run `clef quantize`'s own converter (quant/convert.c) with the
 * generator as its source instead of mapped shards: the same tensor plan,
 * shard names, expert order, quantizers, INT4 extra_config and
 * config.json text — so the in-memory checkpoint holds bitwise the tensors
 * and config that `clef synth` + `clef quantize` would write, and a model
 * bound on it answers bitwise as the file route does
 * (tests/unit/test_qsynth.c checks both on `tiny`).
 *
 * Host memory stays bounded: BF16 weights are drawn one matrix (experts) or
 * one 64 MiB piece (everything else) at a time; only the result is kept:
 * the BF16 non-expert tensors (≈ 3 GB for `full`) plus the packed experts
 * (`full`: INT4 ≈ 15 GB, NVFP4 ≈ 16 GB, FP8 ≈ 29 GB) in memory, nothing but
 * scratch when writing files.
 */
#ifndef CLEF_QUANT_QSYNTH_H
#define CLEF_QUANT_QSYNTH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/checkpoint.h"
#include "io/st_write.h"
#include "util/err.h"

/* ---- in-memory safetensors shards (the converter's memory sink) ---- */

/* A shard being filled in anonymous memory, laid out like st_writer's
 * file (declared up front, data put piecewise at known offsets), ending as
 * an st_file whose tensors point into the map. */
typedef struct clef_mem_shard clef_mem_shard;

/* Declare `n` tensors (names copied; each starts 64-byte aligned) and map
 * zeroed memory for them.  `path` names the shard in messages (e.g.
 * "synthetic-tiny-int4/model-00002-of-00002.safetensors").  Errors (500):
 * duplicate names, memory that cannot be mapped.  NULL + err. */
clef_mem_shard *clef_mem_shard_create(const char *path, const st_wtensor *tensors, size_t n, clef_err *err);

/* Copy `len` bytes of tensor `name`'s data to byte `off` of that tensor.
 * Errors (500): unknown name, a range past the tensor's end. */
int clef_mem_shard_put(clef_mem_shard *m, const char *name, size_t off, const void *data, size_t len,
                       clef_err *err);

/* Check that as many bytes were put as declared, and hand the memory over
 * as `*out` (header order = declaration order; st_close unmaps it).  Frees
 * `m` always.  Returns 0, or -1 + err naming the shard (then `out` is
 * zeroed and the memory released). */
int clef_mem_shard_finish(clef_mem_shard *m, st_file *out, clef_err *err);

/* Release a shard that will not be finished.  NULL is ok. */
void clef_mem_shard_abort(clef_mem_shard *m);

/* ---- quantized synthetic checkpoints ---- */

/* Draw preset `preset` ("tiny", "small", "full") for `seed` and quantize its
 * routed experts to `format` ("int4", "fp8-block", "nvfp4",
 * "nvfp4-modelopt"; also the names clef_quant_format_parse accepts) with the
 * defaults of `clef quantize` (INT4 group 128, FP8 block 128×128,
 * per-expert layout), into memory.  `ck` gets dir NULL, config_json (and
 * hf_quant_json for ModelOpt) holding what `clef quantize` would write, the
 * shards (experts' shards with their companions, the joint head last) and
 * the catalog.  Expert matrices are quantized on all OpenMP threads.
 * `progress` non-NULL: a line per shard and per layer on stderr (the
 * converter's) and a summary (sizes, seconds, peak RSS) on `progress`.  Errors (500): unknown preset or format,
 * memory that cannot be mapped.  On failure `ck` is zeroed; release with
 * clef_checkpoint_close. */
int clef_qsynth_checkpoint(const char *preset, uint64_t seed, const char *format, FILE *progress,
                           clef_checkpoint *ck, clef_err *err);

/* Peak resident set size of this process in bytes: VmHWM from
 * /proc/self/status, else getrusage's ru_maxrss. */
size_t clef_peak_rss_bytes(void);

#endif
