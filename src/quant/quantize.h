/* quantize.h — clef's quantizers: one BF16/F32 weight matrix W[rows = out,
 * cols = in] (row-major f32) to the packed tensors of a published format
 * (SPEC.md §10.3).  Each fills caller-owned output arrays whose sizes are
 * given below; outputs are little-endian as written to safetensors.
 *
 *   NVFP4      min-max scale per 16 inputs: block scale = fp8(amax16 / 6 · G)
 *              (G the per-tensor global scale, 448·6 / amax), code =
 *              RNE onto the FP4 grid of x · G / fp8(scale), saturating at ±6.
 *              Gate and up of one expert share one G (the caller passes it).
 *   FP8 block  per Br×Bc tile: scale = amax / 448 (1 for an all-zero tile),
 *              code = saturating RNE cast of x / scale.
 *   INT4       symmetric round-to-nearest per group of G inputs and output,
 *              AutoRound's signed scale: s = −max / 8 when the largest
 *              magnitude is positive, |min| / 8 otherwise (so the extreme
 *              value lands exactly on nibble 0), |s| at least 1e-5, stored as F16; nibble =
 *              clamp(RNE(x / s) + 8, 0, 15); every stored zero is 7 (GPTQ v1).
 */
#ifndef CLEF_QUANT_QUANTIZE_H
#define CLEF_QUANT_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>

/* Largest |x| of n values (0 for n = 0; NaN is ignored). */
float clef_amax(const float *x, size_t n);

/* compressed-tensors global scale 448·6 / amax in f32 (1 when amax = 0). */
float clef_nvfp4_global_scale(float amax);
/* ModelOpt weight_scale_2 = amax / (6·448) in f32 (1 when amax = 0). */
float clef_nvfp4_scale_2(float amax);

/* NVFP4 of w (cols % 16 == 0).  `global` is weight_global_scale when
 * `global_div` (compressed-tensors: dequant divides by it) or weight_scale_2
 * otherwise (ModelOpt: dequant multiplies by it).
 *   packed: out [rows, cols/2] (low nibble = even column)
 *   scale:  out [rows, cols/16] FP8 E4M3 */
void clef_quantize_nvfp4(const float *w, int64_t rows, int64_t cols, float global, int global_div, uint8_t *packed,
                         uint8_t *scale);

/* FP8 E4M3 with Br×Bc block scales (edge blocks partial).
 *   q:         out [rows, cols]
 *   scale_inv: out [ceil(rows/Br), ceil(cols/Bc)] f32 multipliers */
void clef_quantize_fp8_block(const float *w, int64_t rows, int64_t cols, int64_t br, int64_t bc, uint8_t *q,
                             float *scale_inv);

/* INT4 auto_gptq, symmetric (cols % group == 0, cols % 8 == 0, rows % 8 == 0).
 *   qweight: out [cols/8, rows] u32;  qzeros: out [cols/group, rows/8] u32
 *   scales:  out [cols/group, rows] F16 bits */
void clef_quantize_int4(const float *w, int64_t rows, int64_t cols, int64_t group, uint32_t *qweight,
                        uint32_t *qzeros, uint16_t *scales);

#endif
