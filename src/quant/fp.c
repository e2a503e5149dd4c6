/* fp.c — FP4 E2M1 / FP8 E4M3fn / F16 tables and encoders (SPEC.md §10.2). */
#include "quant/fp.h"

#include <math.h>
#include <string.h>

const float clef_fp4_e2m1_values[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

/* Generated from the definition in SPEC.md §10.2 (and checked against it by
 * tests/unit/test_quant_formats.c). */
const float clef_fp8_e4m3_values[256] = {
    0.0f, 0x1p-9f, 0x1p-8f, 0x1.800p-8f, 0x1p-7f, 0x1.400p-7f, 0x1.800p-7f, 0x1.c00p-7f,
    0x1p-6f, 0x1.200p-6f, 0x1.400p-6f, 0x1.600p-6f, 0x1.800p-6f, 0x1.a00p-6f, 0x1.c00p-6f, 0x1.e00p-6f,
    0x1p-5f, 0x1.200p-5f, 0x1.400p-5f, 0x1.600p-5f, 0x1.800p-5f, 0x1.a00p-5f, 0x1.c00p-5f, 0x1.e00p-5f,
    0x1p-4f, 0x1.200p-4f, 0x1.400p-4f, 0x1.600p-4f, 0x1.800p-4f, 0x1.a00p-4f, 0x1.c00p-4f, 0x1.e00p-4f,
    0x1p-3f, 0x1.200p-3f, 0x1.400p-3f, 0x1.600p-3f, 0x1.800p-3f, 0x1.a00p-3f, 0x1.c00p-3f, 0x1.e00p-3f,
    0x1p-2f, 0x1.200p-2f, 0x1.400p-2f, 0x1.600p-2f, 0x1.800p-2f, 0x1.a00p-2f, 0x1.c00p-2f, 0x1.e00p-2f,
    0x1p-1f, 0x1.200p-1f, 0x1.400p-1f, 0x1.600p-1f, 0x1.800p-1f, 0x1.a00p-1f, 0x1.c00p-1f, 0x1.e00p-1f,
    0x1p+0f, 0x1.200p+0f, 0x1.400p+0f, 0x1.600p+0f, 0x1.800p+0f, 0x1.a00p+0f, 0x1.c00p+0f, 0x1.e00p+0f,
    0x1p+1f, 0x1.200p+1f, 0x1.400p+1f, 0x1.600p+1f, 0x1.800p+1f, 0x1.a00p+1f, 0x1.c00p+1f, 0x1.e00p+1f,
    0x1p+2f, 0x1.200p+2f, 0x1.400p+2f, 0x1.600p+2f, 0x1.800p+2f, 0x1.a00p+2f, 0x1.c00p+2f, 0x1.e00p+2f,
    0x1p+3f, 0x1.200p+3f, 0x1.400p+3f, 0x1.600p+3f, 0x1.800p+3f, 0x1.a00p+3f, 0x1.c00p+3f, 0x1.e00p+3f,
    0x1p+4f, 0x1.200p+4f, 0x1.400p+4f, 0x1.600p+4f, 0x1.800p+4f, 0x1.a00p+4f, 0x1.c00p+4f, 0x1.e00p+4f,
    0x1p+5f, 0x1.200p+5f, 0x1.400p+5f, 0x1.600p+5f, 0x1.800p+5f, 0x1.a00p+5f, 0x1.c00p+5f, 0x1.e00p+5f,
    0x1p+6f, 0x1.200p+6f, 0x1.400p+6f, 0x1.600p+6f, 0x1.800p+6f, 0x1.a00p+6f, 0x1.c00p+6f, 0x1.e00p+6f,
    0x1p+7f, 0x1.200p+7f, 0x1.400p+7f, 0x1.600p+7f, 0x1.800p+7f, 0x1.a00p+7f, 0x1.c00p+7f, 0x1.e00p+7f,
    0x1p+8f, 0x1.200p+8f, 0x1.400p+8f, 0x1.600p+8f, 0x1.800p+8f, 0x1.a00p+8f, 0x1.c00p+8f, NAN,
    -0.0f, -0x1p-9f, -0x1p-8f, -0x1.800p-8f, -0x1p-7f, -0x1.400p-7f, -0x1.800p-7f, -0x1.c00p-7f,
    -0x1p-6f, -0x1.200p-6f, -0x1.400p-6f, -0x1.600p-6f, -0x1.800p-6f, -0x1.a00p-6f, -0x1.c00p-6f, -0x1.e00p-6f,
    -0x1p-5f, -0x1.200p-5f, -0x1.400p-5f, -0x1.600p-5f, -0x1.800p-5f, -0x1.a00p-5f, -0x1.c00p-5f, -0x1.e00p-5f,
    -0x1p-4f, -0x1.200p-4f, -0x1.400p-4f, -0x1.600p-4f, -0x1.800p-4f, -0x1.a00p-4f, -0x1.c00p-4f, -0x1.e00p-4f,
    -0x1p-3f, -0x1.200p-3f, -0x1.400p-3f, -0x1.600p-3f, -0x1.800p-3f, -0x1.a00p-3f, -0x1.c00p-3f, -0x1.e00p-3f,
    -0x1p-2f, -0x1.200p-2f, -0x1.400p-2f, -0x1.600p-2f, -0x1.800p-2f, -0x1.a00p-2f, -0x1.c00p-2f, -0x1.e00p-2f,
    -0x1p-1f, -0x1.200p-1f, -0x1.400p-1f, -0x1.600p-1f, -0x1.800p-1f, -0x1.a00p-1f, -0x1.c00p-1f, -0x1.e00p-1f,
    -0x1p+0f, -0x1.200p+0f, -0x1.400p+0f, -0x1.600p+0f, -0x1.800p+0f, -0x1.a00p+0f, -0x1.c00p+0f, -0x1.e00p+0f,
    -0x1p+1f, -0x1.200p+1f, -0x1.400p+1f, -0x1.600p+1f, -0x1.800p+1f, -0x1.a00p+1f, -0x1.c00p+1f, -0x1.e00p+1f,
    -0x1p+2f, -0x1.200p+2f, -0x1.400p+2f, -0x1.600p+2f, -0x1.800p+2f, -0x1.a00p+2f, -0x1.c00p+2f, -0x1.e00p+2f,
    -0x1p+3f, -0x1.200p+3f, -0x1.400p+3f, -0x1.600p+3f, -0x1.800p+3f, -0x1.a00p+3f, -0x1.c00p+3f, -0x1.e00p+3f,
    -0x1p+4f, -0x1.200p+4f, -0x1.400p+4f, -0x1.600p+4f, -0x1.800p+4f, -0x1.a00p+4f, -0x1.c00p+4f, -0x1.e00p+4f,
    -0x1p+5f, -0x1.200p+5f, -0x1.400p+5f, -0x1.600p+5f, -0x1.800p+5f, -0x1.a00p+5f, -0x1.c00p+5f, -0x1.e00p+5f,
    -0x1p+6f, -0x1.200p+6f, -0x1.400p+6f, -0x1.600p+6f, -0x1.800p+6f, -0x1.a00p+6f, -0x1.c00p+6f, -0x1.e00p+6f,
    -0x1p+7f, -0x1.200p+7f, -0x1.400p+7f, -0x1.600p+7f, -0x1.800p+7f, -0x1.a00p+7f, -0x1.c00p+7f, -0x1.e00p+7f,
    -0x1p+8f, -0x1.200p+8f, -0x1.400p+8f, -0x1.600p+8f, -0x1.800p+8f, -0x1.a00p+8f, -0x1.c00p+8f, NAN,
};

/* Midpoints between neighbouring FP4 magnitudes; a tie goes to the even code,
 * i.e. the lower neighbour when its code is even (codes 0, 2, 4, 6). */
uint8_t clef_fp4_encode(float x) {
    if (isnan(x)) return 0;
    float a = fabsf(x);
    uint8_t code;
    if (a <= 0.25f) code = 0;
    else if (a < 0.75f) code = 1;
    else if (a <= 1.25f) code = 2;
    else if (a < 1.75f) code = 3;
    else if (a <= 2.5f) code = 4;
    else if (a < 3.5f) code = 5;
    else if (a <= 5.0f) code = 6;
    else code = 7;
    return (uint8_t)(code | (x < 0 && code ? 8 : 0)); /* never -0: a value that rounds to 0 is code 0 */
}

/* Scaling by powers of two is exact, so rintf (RNE in the default rounding
 * mode) on the mantissa grid of the target binade gives the correctly
 * rounded code; a carry into the next binade is handled by the code
 * arithmetic itself (mantissa 8 = next exponent, mantissa 0). */
uint8_t clef_fp8_e4m3_encode(float x) {
    if (isnan(x)) return 0x7F;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (a >= CLEF_FP8_E4M3_MAX) return (uint8_t)(sign | 0x7E);
    if (a < 0x1p-6f) return (uint8_t)(sign | (uint8_t)rintf(a * 0x1p9f)); /* subnormal: m·2^-9, m = 8 is 2^-6 */
    uint32_t u, pu;
    memcpy(&u, &a, 4);
    int e = (int)((u >> 23) & 0xFF) - 127; /* unbiased exponent of the normal float a, -6..8 */
    pu = (uint32_t)(3 - e + 127) << 23;    /* 2^(3-e), exact (-5..9): the scaling is exact */
    float p2;
    memcpy(&p2, &pu, 4);
    float m = rintf(a * p2); /* 8..16 */
    unsigned code = (unsigned)(e + 7) * 8u + (unsigned)m - 8u; /* m = 16 carries into e+1 */
    if (code > 0x7E) code = 0x7E;
    return (uint8_t)(sign | code);
}

uint16_t clef_f16_encode(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    float a = fabsf(x);
    if (isnan(x)) return (uint16_t)(sign | 0x7E00u);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7C00u); /* rounds past the largest half, 65504 */
    if (a < 0x1p-14f) return (uint16_t)(sign | (uint16_t)rintf(a * 0x1p24f)); /* subnormal; 1024 = 2^-14 */
    int ex;
    frexpf(a, &ex);
    int e = ex - 1; /* -14..15 */
    float m = rintf(ldexpf(a, 10 - e)); /* 1024..2048 */
    return (uint16_t)(sign | (uint16_t)((unsigned)(e + 15) * 1024u + (unsigned)m - 1024u));
}
