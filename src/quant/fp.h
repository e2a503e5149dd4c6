/* fp.h — the low-precision element formats of quantized checkpoints
 * (SPEC.md §10.2): decode tables and round-to-nearest-even encoders.
 *
 * Decoding is a table lookup (exact: every FP4/FP8 value is an f32).
 * Encoding rounds an f32 to the nearest representable value, ties to the
 * even code (IEEE RNE), and saturates instead of overflowing — what the
 * published quantizers (compressed-tensors, ModelOpt, torch's
 * float8_e4m3fn cast after clamping) produce.
 */
#ifndef CLEF_QUANT_FP_H
#define CLEF_QUANT_FP_H

#include <stdint.h>

/* FP4 E2M1 code (0..15) -> value: 0, .5, 1, 1.5, 2, 3, 4, 6; bit 3 = sign
 * (codes 8..15 are the negatives, code 8 is -0.0). */
extern const float clef_fp4_e2m1_values[16];

/* FP8 E4M3fn byte -> value (bias 7, e = 0 subnormal (m/8)·2^-6; 0x7F/0xFF
 * are NaN; max ±448). */
extern const float clef_fp8_e4m3_values[256];

/* Largest finite magnitudes. */
#define CLEF_FP4_MAX 6.0f
#define CLEF_FP8_E4M3_MAX 448.0f

/* f32 -> FP4 E2M1 code, round to nearest with ties to the even code
 * (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
 * 5 -> 4), |x| > 6 saturates to ±6.  The sign bit is set for x < 0 unless
 * the magnitude rounds to 0 (code 0, never -0 = code 8: compressed-tensors
 * packs the already rounded value, whose -0.0 is not < 0); NaN gives 0. */
uint8_t clef_fp4_encode(float x);

/* f32 -> FP8 E4M3fn byte, RNE, saturating to ±448 (±inf included); NaN gives
 * 0x7F.  The sign of -0.0 and of negative values that round to zero is kept
 * (0x80), as torch's cast does. */
uint8_t clef_fp8_e4m3_encode(float x);

/* f32 -> IEEE binary16 bits, RNE; overflow gives ±inf, NaN stays NaN.
 * (The inverse is clef_f16_to_f32 in tensor/dtype.h.) */
uint16_t clef_f16_encode(float x);

#endif
