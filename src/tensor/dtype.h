/* dtype.h — element types of checkpoint tensors and scalar conversions.
 *
 * Conversions follow SPEC.md §10.2: BF16 is the top half of an IEEE f32;
 * F16 is IEEE half; F8_E4M3 is the "fn" variant (bias 7, no inf, 0x7F/0xFF NaN,
 * max 448).
 */
#ifndef CLEF_TENSOR_DTYPE_H
#define CLEF_TENSOR_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum clef_dtype {
    CLEF_DT_BF16,
    CLEF_DT_F16,
    CLEF_DT_F32,
    CLEF_DT_F8_E4M3,
    CLEF_DT_U8,
    CLEF_DT_I8,
    CLEF_DT_I32,
    CLEF_DT_I64,
    CLEF_DT_COUNT
} clef_dtype;

/* Bytes per element (2 for BF16/F16, 4 for F32/I32, 1 for F8_E4M3/U8/I8,
 * 8 for I64); 0 for a value outside the enum. */
size_t clef_dtype_size(clef_dtype t);
/* safetensors dtype string ("BF16", "F8_E4M3", ...); "?" outside the enum.
 * The string is static. */
const char *clef_dtype_name(clef_dtype t);
/* Parse a safetensors dtype string (exact, case-sensitive, as written by the
 * safetensors library); returns 0 and sets *out, or -1 for an unknown one
 * (*out untouched). */
int clef_dtype_parse(const char *s, clef_dtype *out);
/* Bit of `t` in a dtype mask (as taken by clef_checkpoint_require). */
#define CLEF_DT_BIT(t) (1u << (unsigned)(t))

/* BF16 -> f32, exact (BF16 is the top 16 bits of an f32). */
static inline float clef_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round-to-nearest-even f32 -> bf16 (NaN stays NaN). */
static inline uint16_t clef_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* IEEE binary16 -> f32, exact: subnormals (down to 2^-24), ±0, ±inf and NaN
 * are all preserved. */
float clef_f16_to_f32(uint16_t h);
/* FP8 E4M3fn -> f32 (SPEC §10.2), exact: e = 0 gives ±(m/8)·2^-6, otherwise
 * ±(1+m/8)·2^(e-7); 0x7F and 0xFF are NaN; no infinities; max ±448. */
float clef_fp8e4m3_to_f32(uint8_t b);
/* FP4 E2M1 code (low 4 bits of `nibble`) -> f32 (SPEC §10.2): codes 0..7 are
 * 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign. */
float clef_fp4e2m1_to_f32(uint8_t nibble);

/* Convert `n` elements of dtype `t` at `src` (little-endian, any alignment)
 * to f32 at `dst[0..n)`.  BF16/F16/F8_E4M3 are exact; integer dtypes are
 * converted by value (I32/I64 round to nearest f32).  The caller owns both
 * buffers; they must not overlap. */
void clef_to_f32(clef_dtype t, const void *src, float *dst, size_t n);

#endif
