/* dtype.c — safetensors element types and their scalar conversions to f32
 * (SPEC.md §10.1, §10.2). */
#include "tensor/dtype.h"

#include <math.h>

/* Indexed by clef_dtype; the strings are the safetensors header spellings. */
static const char *const dtype_names[CLEF_DT_COUNT] = {
    [CLEF_DT_BF16] = "BF16", [CLEF_DT_F16] = "F16", [CLEF_DT_F32] = "F32", [CLEF_DT_F8_E4M3] = "F8_E4M3",
    [CLEF_DT_U8] = "U8",     [CLEF_DT_I8] = "I8",   [CLEF_DT_I32] = "I32", [CLEF_DT_I64] = "I64",
};

static const size_t dtype_sizes[CLEF_DT_COUNT] = {
    [CLEF_DT_BF16] = 2, [CLEF_DT_F16] = 2, [CLEF_DT_F32] = 4, [CLEF_DT_F8_E4M3] = 1,
    [CLEF_DT_U8] = 1,   [CLEF_DT_I8] = 1,  [CLEF_DT_I32] = 4, [CLEF_DT_I64] = 8,
};

size_t clef_dtype_size(clef_dtype t) { return (unsigned)t < CLEF_DT_COUNT ? dtype_sizes[t] : 0; }

const char *clef_dtype_name(clef_dtype t) { return (unsigned)t < CLEF_DT_COUNT ? dtype_names[t] : "?"; }

int clef_dtype_parse(const char *s, clef_dtype *out) {
    if (!s) return -1;
    for (int t = 0; t < CLEF_DT_COUNT; t++) {
        if (strcmp(s, dtype_names[t]) == 0) {
            *out = (clef_dtype)t;
            return 0;
        }
    }
    return -1;
}

/* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.  Every half
 * value is exactly representable in f32, so the conversion is exact; ldexpf
 * keeps the subnormal case free of bit tricks. */
float clef_f16_to_f32(uint16_t h) {
    unsigned sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float v;
    if (exp == 0) {
        v = ldexpf((float)man, -24); /* subnormal (and zero): man * 2^-14 / 2^10 */
    } else if (exp == 31) {
        v = man ? NAN : INFINITY;
    } else {
        v = ldexpf((float)(man | 0x400), (int)exp - 25); /* (1024+man) * 2^(e-15-10) */
    }
    return sign ? -v : v;
}

/* FP8 E4M3 "fn" (SPEC §10.2): bias 7, no infinities, S.1111.111 is NaN. */
float clef_fp8e4m3_to_f32(uint8_t b) {
    unsigned sign = b >> 7, exp = (b >> 3) & 0xf, man = b & 7;
    float v;
    if (exp == 15 && man == 7) {
        v = NAN;
    } else if (exp == 0) {
        v = ldexpf((float)man, -9); /* (m/8) * 2^-6 */
    } else {
        v = ldexpf((float)(man | 8), (int)exp - 10); /* (1+m/8) * 2^(e-7) */
    }
    return sign ? -v : v;
}

float clef_fp4e2m1_to_f32(uint8_t nibble) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[nibble & 7];
    return (nibble & 8) ? -v : v;
}

/* Elements are read with memcpy because safetensors data is only guaranteed
 * to be aligned at the start of the data section, not per tensor.  One loop
 * per dtype keeps the hot BF16 path free of a per-element switch. */
#define CONVERT_LOOP(ctype, expr)                                                                                      \
    for (size_t i = 0; i < n; i++) {                                                                                   \
        ctype x;                                                                                                       \
        memcpy(&x, p + sizeof(ctype) * i, sizeof(ctype));                                                              \
        dst[i] = (expr);                                                                                               \
    }

void clef_to_f32(clef_dtype t, const void *src, float *dst, size_t n) {
    const unsigned char *p = src;
    switch (t) {
    case CLEF_DT_BF16: CONVERT_LOOP(uint16_t, clef_bf16_to_f32(x)) break;
    case CLEF_DT_F16: CONVERT_LOOP(uint16_t, clef_f16_to_f32(x)) break;
    case CLEF_DT_F32: memcpy(dst, src, n * 4); break;
    case CLEF_DT_F8_E4M3: CONVERT_LOOP(uint8_t, clef_fp8e4m3_to_f32(x)) break;
    case CLEF_DT_U8: CONVERT_LOOP(uint8_t, (float)x) break;
    case CLEF_DT_I8: CONVERT_LOOP(int8_t, (float)x) break;
    case CLEF_DT_I32: CONVERT_LOOP(int32_t, (float)x) break;
    case CLEF_DT_I64: CONVERT_LOOP(int64_t, (float)x) break;
    default: memset(dst, 0, n * sizeof *dst); break;
    }
}
