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

/* Bytes per element. */
size_t clef_dtype_size(clef_dtype t);
/* safetensors dtype string ("BF16", ...). */
const char *clef_dtype_name(clef_dtype t);
/* Parse a safetensors dtype string; returns -1 for an unknown one. */
int clef_dtype_parse(const char *s, clef_dtype *out);

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

float clef_f16_to_f32(uint16_t h);
float clef_fp8e4m3_to_f32(uint8_t b);

/* Convert `n` elements of BF16/F16/F32 at `src` to f32 at `dst`. */
void clef_to_f32(clef_dtype t, const void *src, float *dst, size_t n);

#endif
