/* test_finite_scan.c — clef_checkpoint_check_finite (io/finite.c) against
 * the dtype conversions, bit pattern by bit pattern: every BF16, F16 and
 * F8_E4M3 pattern and a sweep of F32 patterns (all of exponent 255 with
 * mantissas of every bit position, and a random sample), each placed at an
 * unaligned address and at every position of a 64-bit word.  A pattern is
 * refused exactly when clef_to_f32 of it is not finite, named NaN / +Inf /
 * -Inf as the conversion says, at the element where it was put; integer
 * dtypes are never read. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "tensor/dtype.h"
#include "testutil.h"

#define N_ELEM 37 /* not a multiple of any lane count */

/* A one-tensor catalog over `bytes` (an unaligned heap copy). */
typedef struct fake {
    clef_checkpoint ck;
    st_file shard;
    st_tensor t;
    const st_tensor *cat[1];
    unsigned char *raw;
} fake;

static void fake_init(fake *f, clef_dtype dt, size_t n) {
    memset(f, 0, sizeof *f);
    f->raw = calloc(n * clef_dtype_size(dt) + 1, 1);
    f->t = (st_tensor){.name = "w", .dtype = dt, .ndim = 1, .shape = {(int64_t)n}, .numel = n,
                       .data = f->raw + 1, .nbytes = n * clef_dtype_size(dt)};
    f->shard = (st_file){.path = "dir/shard.safetensors", .n = 1, .tensors = &f->t};
    f->cat[0] = &f->t;
    f->ck = (clef_checkpoint){.n_shards = 1, .shards = &f->shard, .n_tensors = 1, .catalog = f->cat};
}

/* Put `bits` at element `at` of a zero tensor and check the verdict. */
static void check_pattern(fake *f, uint32_t bits, size_t at) {
    size_t es = clef_dtype_size(f->t.dtype);
    unsigned char *d = f->raw + 1;
    memset(d, 0, f->t.nbytes);
    for (size_t i = 0; i < es; i++) d[at * es + i] = (unsigned char)(bits >> (8 * i));
    float v;
    clef_to_f32(f->t.dtype, d + at * es, &v, 1);
    clef_err err;
    clef_err_clear(&err);
    int rc = clef_checkpoint_check_finite(&f->ck, 0, 1, NULL, &err);
    if (isfinite(v)) {
        if (rc != 0) fail_msg("%s 0x%x (%g) refused: %s", clef_dtype_name(f->t.dtype), bits, v, err.message);
        return;
    }
    if (rc != -1) fail_msg("%s 0x%x (%g) at %zu passed", clef_dtype_name(f->t.dtype), bits, v, at);
    char want[256];
    snprintf(want, sizeof want, "shard.safetensors: tensor 'w' holds a non-finite value (%s) at element %zu",
             isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf", at);
    if (strcmp(err.message, want)) fail_msg("%s 0x%x: '%s', want '%s'", clef_dtype_name(f->t.dtype), bits, err.message, want);
}

static void sweep16(clef_dtype dt, size_t *bad_out) {
    fake f;
    fake_init(&f, dt, N_ELEM);
    size_t bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        check_pattern(&f, b, b % N_ELEM);
        float v;
        uint16_t h = (uint16_t)b;
        clef_to_f32(dt, &h, &v, 1);
        bad += !isfinite(v);
    }
    *bad_out = bad;
    free(f.raw);
}

static void test_bf16_all_patterns(void **state) {
    size_t bad;
    sweep16(CLEF_DT_BF16, &bad);
    assert_int_equal(bad, 2 * 128); /* exponent 0xff, either sign, any of 128 mantissas */
}

static void test_f16_all_patterns(void **state) {
    size_t bad;
    sweep16(CLEF_DT_F16, &bad);
    assert_int_equal(bad, 2 * 1024);
}

static void test_e4m3_all_patterns(void **state) {
    fake f;
    fake_init(&f, CLEF_DT_F8_E4M3, N_ELEM);
    size_t bad = 0;
    for (uint32_t b = 0; b < 256; b++) {
        for (size_t at = 0; at < 8; at++) check_pattern(&f, b, at); /* every byte of a word */
        bad += !isfinite(clef_fp8e4m3_to_f32((uint8_t)b));
    }
    assert_int_equal(bad, 2); /* 0x7f and 0xff: E4M3 has no Inf */
    free(f.raw);
}

static void test_f32_patterns(void **state) {
    fake f;
    fake_init(&f, CLEF_DT_F32, N_ELEM);
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t e = 250; e < 256; e++) {
            for (int m = -1; m < 23; m++) { /* mantissa 0, then each single bit */
                uint32_t bits = sign << 31 | e << 23 | (m < 0 ? 0 : 1u << m);
                check_pattern(&f, bits, (size_t)(m + 1) % N_ELEM);
            }
            check_pattern(&f, sign << 31 | e << 23 | 0x7fffff, 36);
        }
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 200000; i++) {
        uint32_t bits = (uint32_t)tu_rand_u64(&rng);
        check_pattern(&f, bits, (size_t)i % N_ELEM);
    }
    free(f.raw);
}

/* Integer tensors are not read (their bytes may be anything). */
static void test_integers_not_read(void **state) {
    const clef_dtype ints[] = {CLEF_DT_U8, CLEF_DT_I8, CLEF_DT_I32, CLEF_DT_I64};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        fake f;
        fake_init(&f, ints[i], N_ELEM);
        memset(f.raw + 1, 0xff, f.t.nbytes);
        clef_err err;
        size_t checked = 7;
        assert_int_equal(clef_checkpoint_check_finite(&f.ck, 0, 2, &checked, &err), 0);
        assert_int_equal(checked, 0);
        free(f.raw);
    }
}

/* A large tensor (many chunks, two threads): the first bad element wins. */
static void test_many_chunks(void **state) {
    const size_t n = (size_t)40 << 20; /* 80 MiB of BF16 = 20 chunks */
    fake f;
    fake_init(&f, CLEF_DT_BF16, n);
    uint16_t *d = calloc(n, 2);
    const size_t at[] = {n - 1, (size_t)31 << 20, (size_t)9 << 20 | 5};
    const uint16_t bits[] = {0x7fc0, 0xff80, 0x7f80};
    for (size_t k = 0; k < 3; k++) {
        d[at[k]] = bits[k];
        memcpy(f.raw + 1, d, 2 * n);
        clef_err err;
        clef_err_clear(&err);
        size_t checked = 0;
        assert_int_equal(clef_checkpoint_check_finite(&f.ck, 0, 2, &checked, &err), -1);
        assert_int_equal(checked, 2 * n);
        char want[256];
        snprintf(want, sizeof want, "shard.safetensors: tensor 'w' holds a non-finite value (%s) at element %zu",
                 k == 0 ? "NaN" : k == 1 ? "-Inf" : "+Inf", at[k]);
        assert_string_equal(err.message, want);
    }
    free(d);
    free(f.raw);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_all_patterns), cmocka_unit_test(test_f16_all_patterns),
        cmocka_unit_test(test_e4m3_all_patterns), cmocka_unit_test(test_f32_patterns),
        cmocka_unit_test(test_integers_not_read), cmocka_unit_test(test_many_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
