/* qweight.h — packed quantized weights: how a Linear weight W[out, in] of a
 * quantized checkpoint is laid out in memory, how it is found by name, and
 * how its rows decode to f32 (SPEC.md §10.3).
 *
 * A bound weight stays packed (it points into the mapped checkpoint); rows
 * are dequantized on demand, a block at a time, by the backend's matmul.
 * Model code never sees the format: binding resolves a module name to a
 * clef_qweight, the backend dispatches on `quant.type`.
 *
 * Decoding (each exactly one f32 rounding, as SPEC.md writes the formula):
 *   NVFP4 (compressed-tensors): w = (fp4(q) · fp8(scale[r, c/16])) / global
 *   NVFP4 (ModelOpt):           w = (fp4(q) · fp8(scale[r, c/16])) · scale_2
 *       (fp4 · fp8 is exact in f32, so the result is correctly rounded)
 *   FP8 block:                  w = fp8(q[r, c]) · scale_inv[r / Br, c / Bc]
 *   INT4 auto_gptq, symmetric:  w[r, c] = f16(scales[c / G, r]) · (nibble(c, r) − 8)
 *   INT4 asymmetric (v1):       ... · (nibble − (zero nibble + 1))
 */
#ifndef CLEF_QUANT_QWEIGHT_H
#define CLEF_QUANT_QWEIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "quant/format.h"
#include "tensor/dtype.h"
#include "util/err.h"

struct clef_checkpoint;

/* The quantized "dtypes" of a weight. */
typedef enum clef_wqtype {
    CLEF_QT_NONE,      /* plain BF16 / F16 / F32 elements */
    CLEF_QT_NVFP4,     /* FP4 E2M1 pairs (U8, low nibble = even column), FP8 scale per 16 columns, one
                          per-tensor f32 (divisor or multiplier) */
    CLEF_QT_FP8_BLOCK, /* FP8 E4M3 elements, f32 multiplier per Br×Bc block */
    CLEF_QT_INT4_GPTQ, /* 4-bit ints packed 8 per u32 along the input dim, F16 scale per G inputs */
    CLEF_QT_COUNT
} clef_wqtype;

/* Scale data of a quantized weight (all pointers borrow the checkpoint map;
 * any alignment).  Zero-initialised = CLEF_QT_NONE. */
typedef struct clef_wquant {
    clef_wqtype type;
    const void *scale;  /* NVFP4: F8_E4M3 [out, in/16]; FP8: F32 [ceil(out/Br), ceil(in/Bc)];
                           INT4: F16 [in/G, out] */
    const void *zeros;  /* INT4 asymmetric: u32 [in/G, out/8]; NULL when symmetric */
    int64_t group;      /* NVFP4: 16; INT4: G */
    int64_t block_r;    /* FP8: Br */
    int64_t block_c;    /* FP8: Bc */
    float global;       /* NVFP4: weight_global_scale (global_div = 1) or weight_scale_2 (global_div = 0) */
    int global_div;
} clef_wquant;

/* A Linear weight as bound from a checkpoint: logical shape [rows = out,
 * cols = in]; `data` holds plain elements of `dtype` (row-major [out, in]),
 * or the packed container: NVFP4 U8 [out, in/2], FP8 F8_E4M3 [out, in],
 * INT4 I32 qweight [in/8, out]. */
typedef struct clef_qweight {
    clef_dtype dtype;
    int64_t rows;
    int64_t cols;
    const void *data;
    clef_wquant quant;
} clef_qweight;

/* Name of a qtype for messages and `clef inspect`: "plain", "nvfp4",
 * "fp8-block", "int4". */
const char *clef_wqtype_name(clef_wqtype t);

/* Resolve Linear module `module` (e.g. "thinker.model.layers.0.self_attn.q_proj"
 * or "thinker.model.layers.2.mlp.experts.5.down_proj", no ".weight") of
 * logical shape [rows, cols] in `ck` under the detected config `qc`:
 *   - per-module companions of qc's format (weight_packed/weight_scale/
 *     weight_global_scale; weight U8/weight_scale/weight_scale_2;
 *     weight F8_E4M3/weight_scale_inv; qweight/qzeros/scales);
 *   - for an expert, else the layer's stacked tensors
 *     (mlp.experts.gate_up_proj.* [E, 2I, ...] gate rows first, mlp.experts.down_proj.*),
 *     as a view of expert e's rows;
 *   - else the plain `module.weight` (BF16/F16/F32).
 * Every dtype and shape is checked; scales must be finite; symmetric INT4
 * zeros must be stored as 7.  A decoder module (thinker.model.layers.*) that
 * qc says is quantized but only has a plain weight is an error (experts in
 * every format; any module outside INT4, whose builds differ).  Errors (500)
 * name the tensor and what was expected.  `w` borrows the checkpoint. */
int clef_qweight_bind(const struct clef_checkpoint *ck, const clef_quant_config *qc, const char *module, int64_t rows,
                      int64_t cols, clef_qweight *w, clef_err *err);

/* Rows [r0, r1) of W decoded to f32 at dst[(r1-r0) * cols] (plain dtypes
 * converted exactly; quantized ones by the formulas above).  0 <= r0 <= r1
 * <= rows; the caller checks. */
void clef_qweight_rows_f32(const clef_qweight *w, int64_t r0, int64_t r1, float *dst);

/* The tile rows [r0, r1) x columns [c0, c1) of W decoded to f32: row r at
 * dst + (r - r0) * ld floats (ld >= c1 - c0), each element bitwise what
 * clef_qweight_rows_f32 gives for it.  0 <= r0 <= r1 <= rows, 0 <= c0 <=
 * c1 <= cols; for INT4, c0 and c1 multiples of 8.  The caller checks.  The
 * CPU backend's GEMM decodes a weight a cache-sized tile at a time with it. */
void clef_qweight_tile_f32(const clef_qweight *w, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float *dst,
                           int64_t ld);

/* Bytes the weight occupies in memory: data plus scales (and zeros). */
size_t clef_qweight_bytes(const clef_qweight *w);

/* Whether `module` names a routed expert projection
 * ("<layer>.mlp.experts.<e>.{gate,up,down}_proj"); sets *expert (and
 * *proj to 0 gate / 1 up / 2 down) when non-NULL. */
int clef_expert_module(const char *module, int64_t *expert, int *proj);

#endif
