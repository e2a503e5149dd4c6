/* test_dtype.c — dtype names/sizes and exact scalar conversions (SPEC.md §10.2). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/dtype.h"
#include "testutil.h"

static void test_names_sizes_parse(void **state) {
    static const char *names[] = {"BF16", "F16", "F32", "F8_E4M3", "U8", "I8", "I32", "I64"};
    static const size_t sizes[] = {2, 2, 4, 1, 1, 1, 4, 8};
    for (int t = 0; t < CLEF_DT_COUNT; t++) {
        assert_string_equal(clef_dtype_name((clef_dtype)t), names[t]);
        assert_int_equal(clef_dtype_size((clef_dtype)t), sizes[t]);
        clef_dtype got = CLEF_DT_COUNT;
        assert_int_equal(clef_dtype_parse(names[t], &got), 0);
        assert_int_equal(got, t);
    }
    clef_dtype keep = CLEF_DT_I8;
    assert_int_equal(clef_dtype_parse("bf16", &keep), -1);
    assert_int_equal(clef_dtype_parse("F8_E5M2", &keep), -1);
    assert_int_equal(clef_dtype_parse("", &keep), -1);
    assert_int_equal(clef_dtype_parse("F64", &keep), -1);
    assert_int_equal(keep, CLEF_DT_I8);
    assert_int_equal(clef_dtype_size(CLEF_DT_COUNT), 0);
    assert_int_equal(CLEF_DT_BIT(CLEF_DT_F32), 4u);
}

static void test_f16(void **state) {
    assert_true(clef_f16_to_f32(0x3c00) == 1.0f);
    assert_true(clef_f16_to_f32(0xc000) == -2.0f);
    assert_true(clef_f16_to_f32(0x3555) == 0x1.554p-2f); /* 0.333251953125 */
    assert_true(clef_f16_to_f32(0x7bff) == 65504.0f);    /* max finite */
    assert_true(clef_f16_to_f32(0x0400) == 0x1p-14f);    /* min normal */
    assert_true(clef_f16_to_f32(0x0001) == 0x1p-24f);    /* min subnormal */
    assert_true(clef_f16_to_f32(0x03ff) == 0x3ffp-24f);  /* max subnormal */
    assert_true(clef_f16_to_f32(0x8001) == -0x1p-24f);
    float z = clef_f16_to_f32(0x0000), nz = clef_f16_to_f32(0x8000);
    assert_true(z == 0.0f && !signbit(z));
    assert_true(nz == 0.0f && signbit(nz));
    assert_true(isinf(clef_f16_to_f32(0x7c00)) && clef_f16_to_f32(0x7c00) > 0);
    assert_true(isinf(clef_f16_to_f32(0xfc00)) && clef_f16_to_f32(0xfc00) < 0);
    assert_true(isnan(clef_f16_to_f32(0x7e00)));
    assert_true(isnan(clef_f16_to_f32(0xfc01)));
}

static void test_fp8_e4m3(void **state) {
    assert_true(clef_fp8e4m3_to_f32(0x38) == 1.0f);   /* e=7, m=0 */
    assert_true(clef_fp8e4m3_to_f32(0x7e) == 448.0f); /* max: e=15, m=6 */
    assert_true(clef_fp8e4m3_to_f32(0xfe) == -448.0f);
    assert_true(clef_fp8e4m3_to_f32(0x01) == 0x1p-9f); /* min subnormal (1/8)·2^-6 */
    assert_true(clef_fp8e4m3_to_f32(0x07) == 0x7p-9f); /* max subnormal */
    assert_true(clef_fp8e4m3_to_f32(0x08) == 0x1p-6f); /* min normal */
    assert_true(clef_fp8e4m3_to_f32(0x3c) == 1.5f);
    assert_true(clef_fp8e4m3_to_f32(0x40) == 2.0f);
    assert_true(clef_fp8e4m3_to_f32(0xb8) == -1.0f);
    assert_true(clef_fp8e4m3_to_f32(0x78) == 256.0f); /* e=15, m=0 is a number in "fn" */
    float z = clef_fp8e4m3_to_f32(0x00), nz = clef_fp8e4m3_to_f32(0x80);
    assert_true(z == 0.0f && !signbit(z));
    assert_true(nz == 0.0f && signbit(nz));
    assert_true(isnan(clef_fp8e4m3_to_f32(0x7f)));
    assert_true(isnan(clef_fp8e4m3_to_f32(0xff)));
    /* Exactly two NaNs, no infinities, and the positive codes increase. */
    int nans = 0;
    float prev = -1.0f;
    for (int b = 0; b < 256; b++) {
        float v = clef_fp8e4m3_to_f32((uint8_t)b);
        assert_false(isinf(v));
        if (isnan(v)) {
            nans++;
            continue;
        }
        assert_true(fabsf(v) <= 448.0f);
        if (b < 0x7f) {
            assert_true(v > prev);
            prev = v;
        }
        assert_true(clef_fp8e4m3_to_f32((uint8_t)(b ^ 0x80)) == -v);
    }
    assert_int_equal(nans, 2);
}

static void test_fp4_e2m1(void **state) {
    static const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int c = 0; c < 16; c++)
        assert_true(clef_fp4e2m1_to_f32((uint8_t)c) == want[c]);
    assert_true(signbit(clef_fp4e2m1_to_f32(8)));
    assert_true(clef_fp4e2m1_to_f32(0xf7) == 6.0f); /* only the low nibble counts */
}

static void test_bf16_roundtrip(void **state) {
    assert_true(clef_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(clef_bf16_to_f32(0xc0a0) == -5.0f);
    assert_int_equal(clef_f32_to_bf16(1.0f), 0x3f80);
    /* 1 + 2^-8 is halfway between 1 and 1+2^-7: ties to even (1.0). */
    assert_int_equal(clef_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(clef_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    assert_true(isnan(clef_bf16_to_f32(clef_f32_to_bf16(NAN))));
}

static void test_to_f32(void **state) {
    /* Unaligned source: convert from offset 1 of a byte buffer. */
    unsigned char raw[1 + 8 * 3];
    float out[3];
    uint16_t bf[3] = {0x3f80, 0xc040, 0x0000}; /* 1, -3, 0 */
    memcpy(raw + 1, bf, sizeof bf);
    clef_to_f32(CLEF_DT_BF16, raw + 1, out, 3);
    assert_true(out[0] == 1.0f && out[1] == -3.0f && out[2] == 0.0f);

    uint16_t h[3] = {0x3c00, 0x0001, 0xbc00}; /* 1, 2^-24, -1 */
    memcpy(raw + 1, h, sizeof h);
    clef_to_f32(CLEF_DT_F16, raw + 1, out, 3);
    assert_true(out[0] == 1.0f && out[1] == 0x1p-24f && out[2] == -1.0f);

    float f[3] = {0.25f, -7.5f, 1e30f};
    memcpy(raw + 1, f, sizeof f);
    clef_to_f32(CLEF_DT_F32, raw + 1, out, 3);
    assert_true(out[0] == 0.25f && out[1] == -7.5f && out[2] == 1e30f);

    uint8_t q[3] = {0x38, 0x7e, 0x81};
    clef_to_f32(CLEF_DT_F8_E4M3, q, out, 3);
    assert_true(out[0] == 1.0f && out[1] == 448.0f && out[2] == -0x1p-9f);

    uint8_t u[3] = {0, 200, 255};
    clef_to_f32(CLEF_DT_U8, u, out, 3);
    assert_true(out[0] == 0.0f && out[1] == 200.0f && out[2] == 255.0f);
    clef_to_f32(CLEF_DT_I8, u, out, 3);
    assert_true(out[0] == 0.0f && out[1] == -56.0f && out[2] == -1.0f);

    int32_t i32[3] = {-5, 7, 1 << 24};
    memcpy(raw + 1, i32, sizeof i32);
    clef_to_f32(CLEF_DT_I32, raw + 1, out, 3);
    assert_true(out[0] == -5.0f && out[1] == 7.0f && out[2] == 16777216.0f);

    int64_t i64[3] = {-1, 3, (int64_t)1 << 40};
    memcpy(raw + 1, i64, sizeof i64);
    clef_to_f32(CLEF_DT_I64, raw + 1, out, 3);
    assert_true(out[0] == -1.0f && out[1] == 3.0f && out[2] == 0x1p40f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_sizes_parse), cmocka_unit_test(test_f16),
        cmocka_unit_test(test_fp8_e4m3),          cmocka_unit_test(test_fp4_e2m1),
        cmocka_unit_test(test_bf16_roundtrip),    cmocka_unit_test(test_to_f32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
