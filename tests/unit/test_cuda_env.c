/* test_cuda_env.c — the CUDA backend's environment settings
 * (src/backend/cuda/cuda_env.c), parsed without a GPU: defaults, every
 * documented value, and an error naming the variable for anything else
 * (before, atoi() read CLEF_CUDA_WGMMA=yes as 0 and an unknown
 * CLEF_CUDA_ATTN as v2, silently). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_env.h"
#include "testutil.h"

static const char *const VARS[] = {"CLEF_CUDA_PRECISE", "CLEF_CUDA_NUMERICS", "CLEF_CUDA_GEMM",
                                   "CLEF_CUDA_PROFILE", "CLEF_CUDA_TUNE",     "CLEF_CUDA_WGMMA",
                                   "CLEF_CUDA_QWGMMA",  "CLEF_CUDA_QGEMM_INT4", "CLEF_CUDA_QGEMM_NVFP4",
                                   "CLEF_CUDA_LT_SPLITK", "CLEF_CUDA_ATTN",    "CLEF_CUDA_GRAPHS",
                                   "CLEF_CUDA_FP8_MMA", "CLEF_CUDA_WGMMA_ROWS", "CLEF_CUDA_QWGMMA_ROWS",
                                   "CLEF_CUDA_TMA",     "CLEF_CUDA_WGMMA_WS", "CLEF_CUDA_V5_ROWS"};

static int clear_env(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof VARS / sizeof *VARS; i++) unsetenv(VARS[i]);
    return 0;
}

/* Read with one variable set; returns the status, *e and err filled. */
static int read_with(const char *name, const char *value, clef_cuda_env *e, clef_err *err) {
    clear_env(NULL);
    if (name) setenv(name, value, 1);
    clef_err_clear(err);
    const int rc = clef_cuda_env_read(e, err);
    clear_env(NULL);
    return rc;
}

static void expect_error(const char *name, const char *value, const char *message) {
    clef_cuda_env e;
    clef_err err;
    assert_int_equal(read_with(name, value, &e, &err), -1);
    assert_int_equal(err.status, 500);
    assert_string_equal(err.message, message);
}

/* Read the kernel switches with one variable set (clef_cuda_knobs_from_env, as test programs do). */
static int knobs_with(const char *name, const char *value, clef_cuda_knobs *k, clef_err *err) {
    clear_env(NULL);
    if (name) setenv(name, value, 1);
    clef_err_clear(err);
    const int rc = clef_cuda_knobs_from_env(k, err);
    clear_env(NULL);
    return rc;
}

static void expect_knob_error(const char *name, const char *value, const char *message) {
    clef_cuda_knobs k;
    clef_err err;
    assert_int_equal(knobs_with(name, value, &k, &err), -1);
    assert_int_equal(err.status, 500);
    assert_string_equal(err.message, message);
    /* clef_cuda_knobs_set gives the same error for the same pair */
    clef_cuda_knobs_default(&k);
    clef_err_clear(&err);
    assert_int_equal(clef_cuda_knobs_set(&k, name, value, &err), -1);
    assert_string_equal(err.message, message);
}

static void test_defaults(void **state) {
    (void)state;
    clef_cuda_env e;
    clef_err err;
    assert_int_equal(read_with(NULL, NULL, &e, &err), 0);
    assert_int_equal(e.precise_parts, 0 /* fast: the default numerics (backend/numerics.h) */);
    assert_int_equal(e.profile, 0);
    assert_int_equal(e.graphs, 1);
    assert_int_equal(e.fp8_mma, 0);
    clef_cuda_knobs k;
    clef_cuda_knobs_default(&k);
    assert_int_equal(k.gemm_custom, 0);
    assert_int_equal(k.tune, 7);
    assert_int_equal(k.wgmma, 2);
    assert_int_equal(k.qwgmma, 1);
    assert_int_equal(k.int4, 6); /* v5 */
    assert_int_equal(k.nvfp4, 5);
    assert_int_equal(k.lt_splitk, 1);
    assert_int_equal(k.attn, 0);
    assert_int_equal(k.tma, 1);
    assert_int_equal(k.wgmma_rows, 8000);
    assert_int_equal(k.wgmma_ws, 1);
    assert_int_equal(k.qwgmma_rows, 8192);
    clef_cuda_knobs from_env;
    assert_int_equal(knobs_with(NULL, NULL, &from_env, &err), 0);
    assert_memory_equal(&from_env, &k, sizeof k);
    /* an empty value is the default too */
    assert_int_equal(knobs_with("CLEF_CUDA_WGMMA", "", &from_env, &err), 0);
    assert_int_equal(from_env.wgmma, 2);
}

/* The backend reads only user settings from the environment: a kernel switch there, even a bad
 * value, is not looked at by clef_cuda_env_read (test and bench programs read those themselves). */
static void test_switches_not_user_settings(void **state) {
    (void)state;
    clef_cuda_env e;
    clef_err err;
    assert_int_equal(read_with("CLEF_CUDA_WGMMA", "yes", &e, &err), 0);
    assert_int_equal(read_with("CLEF_CUDA_ATTN", "v9", &e, &err), 0);
    clef_cuda_knobs k;
    clef_cuda_knobs_default(&k);
    assert_int_equal(clef_cuda_knobs_set(&k, "CLEF_CUDA_PRECISE", "1", &err), 0); /* not a switch */
    assert_int_equal(clef_cuda_knobs_set(&k, "CLEF_CUDA_FP8_MMA", "1", &err), 0);
    assert_int_equal(clef_cuda_knobs_set(&k, "CLEF_CUDA_WGMMA", "1", &err), 1);
    assert_int_equal(k.wgmma, 1);
    assert_int_equal(clef_cuda_knobs_set(&k, "CLEF_CUDA_WGMMA", NULL, &err), 1); /* back to the default */
    assert_int_equal(k.wgmma, 2);
}

static void test_numerics(void **state) {
    (void)state;
    const struct {
        const char *name, *value;
        int parts;
    } ok[] = {
        {"CLEF_CUDA_NUMERICS", "fast", 0},
        {"CLEF_CUDA_NUMERICS", "balanced", CLEF_PRECISE_DENSE | CLEF_PRECISE_ATTN},
        {"CLEF_CUDA_NUMERICS", "precise", CLEF_PRECISE_ALL},
        {"CLEF_CUDA_PRECISE", "0", 0},
        {"CLEF_CUDA_PRECISE", "none", 0},
        {"CLEF_CUDA_PRECISE", "1", CLEF_PRECISE_ALL},
        {"CLEF_CUDA_PRECISE", "all", CLEF_PRECISE_ALL},
        {"CLEF_CUDA_PRECISE", "experts", CLEF_PRECISE_EXPERTS},
        {"CLEF_CUDA_PRECISE", "dense,attention", CLEF_PRECISE_DENSE | CLEF_PRECISE_ATTN},
        {"CLEF_CUDA_PRECISE", "attention,dense,experts", CLEF_PRECISE_ALL},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        clef_cuda_env e;
        clef_err err;
        if (read_with(ok[i].name, ok[i].value, &e, &err) != 0 || e.precise_parts != ok[i].parts)
            fail_msg("%s=%s: parts %d (want %d) %s", ok[i].name, ok[i].value, e.precise_parts, ok[i].parts,
                     err.message);
    }
    /* CLEF_CUDA_PRECISE wins over CLEF_CUDA_NUMERICS */
    clef_cuda_env e;
    clef_err err;
    clear_env(NULL);
    setenv("CLEF_CUDA_NUMERICS", "fast", 1);
    setenv("CLEF_CUDA_PRECISE", "experts", 1);
    assert_int_equal(clef_cuda_env_read(&e, &err), 0);
    assert_int_equal(e.precise_parts, CLEF_PRECISE_EXPERTS);
    clear_env(NULL);
    expect_error("CLEF_CUDA_NUMERICS", "exact",
                 "CUDA numerics: CLEF_CUDA_NUMERICS must be fast, balanced or precise (got 'exact')");
    expect_error("CLEF_CUDA_PRECISE", "dense,bogus",
                 "CUDA numerics: CLEF_CUDA_PRECISE must be 0, 1, all or a comma list of dense, experts, attention "
                 "(got 'dense,bogus')");
    expect_error("CLEF_CUDA_PRECISE", "dense,", /* an empty item */
                 "CUDA numerics: CLEF_CUDA_PRECISE must be 0, 1, all or a comma list of dense, experts, attention "
                 "(got 'dense,')");
}

static void test_kernel_switches(void **state) {
    (void)state;
    clef_cuda_knobs e;
    clef_cuda_env u;
    clef_err err;
    assert_int_equal(knobs_with("CLEF_CUDA_WGMMA", "0", &e, &err), 0);
    assert_int_equal(e.wgmma, 0);
    assert_int_equal(knobs_with("CLEF_CUDA_QWGMMA", "2", &e, &err), 0);
    assert_int_equal(e.qwgmma, 2);
    assert_int_equal(knobs_with("CLEF_CUDA_TUNE", "0", &e, &err), 0);
    assert_int_equal(e.tune, 0);
    assert_int_equal(knobs_with("CLEF_CUDA_LT_SPLITK", "2", &e, &err), 0);
    assert_int_equal(e.lt_splitk, 2);
    assert_int_equal(read_with("CLEF_CUDA_PROFILE", "1", &u, &err), 0);
    assert_int_equal(u.profile, 1);
    assert_int_equal(knobs_with("CLEF_CUDA_GEMM", "custom", &e, &err), 0);
    assert_int_equal(e.gemm_custom, 1);
    assert_int_equal(knobs_with("CLEF_CUDA_GEMM", "cublaslt", &e, &err), 0);
    assert_int_equal(e.gemm_custom, 0);
    assert_int_equal(read_with("CLEF_CUDA_GRAPHS", "0", &u, &err), 0);
    assert_int_equal(u.graphs, 0);
    assert_int_equal(knobs_with("CLEF_CUDA_TMA", "0", &e, &err), 0);
    assert_int_equal(e.tma, 0);
    assert_int_equal(knobs_with("CLEF_CUDA_WGMMA_WS", "0", &e, &err), 0);
    assert_int_equal(e.wgmma_ws, 0);
    assert_int_equal(knobs_with("CLEF_CUDA_WGMMA_WS", "2", &e, &err), 0);
    assert_int_equal(e.wgmma_ws, 2);
    expect_knob_error("CLEF_CUDA_WGMMA_WS", "on", "CUDA settings: CLEF_CUDA_WGMMA_WS must be an integer from 0 to 2 (got 'on')");
    expect_knob_error("CLEF_CUDA_WGMMA_WS", "3", "CUDA settings: CLEF_CUDA_WGMMA_WS must be an integer from 0 to 2 (got '3')");
    const char *int4[] = {"v2", "v3", "v3-2blk", "v4", "v5"};
    const int int4_want[] = {2, 3, 4, 5, 6};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(knobs_with("CLEF_CUDA_QGEMM_INT4", int4[i], &e, &err), 0);
        assert_int_equal(e.int4, int4_want[i]);
    }
    const char *nvfp4[] = {"v2", "v3", "v4", "v5"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(knobs_with("CLEF_CUDA_QGEMM_NVFP4", nvfp4[i], &e, &err), 0);
        assert_int_equal(e.nvfp4, i + 2);
        assert_int_equal(e.int4, 6); /* the INT4 switch is its own (default v5) */
    }
    const char *attn[] = {"v1", "v2", "v2w", "v2s"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(knobs_with("CLEF_CUDA_ATTN", attn[i], &e, &err), 0);
        assert_int_equal(e.attn, i + 1);
    }
    assert_int_equal(read_with("CLEF_CUDA_FP8_MMA", "1", &u, &err), 0);
    assert_int_equal(u.fp8_mma, 1);
    assert_int_equal(read_with("CLEF_CUDA_FP8_MMA", "0", &u, &err), 0);
    assert_int_equal(u.fp8_mma, 0);
    expect_error("CLEF_CUDA_FP8_MMA", "2", "CUDA settings: CLEF_CUDA_FP8_MMA must be an integer from 0 to 1 (got '2')");
    expect_error("CLEF_CUDA_FP8_MMA", "on", "CUDA settings: CLEF_CUDA_FP8_MMA must be an integer from 0 to 1 (got 'on')");
    expect_knob_error("CLEF_CUDA_WGMMA", "yes", "CUDA settings: CLEF_CUDA_WGMMA must be an integer from 0 to 2 (got 'yes')");
    expect_knob_error("CLEF_CUDA_WGMMA", "3", "CUDA settings: CLEF_CUDA_WGMMA must be an integer from 0 to 2 (got '3')");
    expect_knob_error("CLEF_CUDA_WGMMA", "-1", "CUDA settings: CLEF_CUDA_WGMMA must be an integer from 0 to 2 (got '-1')");
    expect_knob_error("CLEF_CUDA_TUNE", "99999999999999999999",
                 "CUDA settings: CLEF_CUDA_TUNE must be an integer from 0 to 7 (got '99999999999999999999')");
    expect_knob_error("CLEF_CUDA_QWGMMA", "1 ", "CUDA settings: CLEF_CUDA_QWGMMA must be an integer from 0 to 2 (got '1 ')");
    expect_error("CLEF_CUDA_PROFILE", "on", "CUDA settings: CLEF_CUDA_PROFILE must be an integer from 0 to 1 (got 'on')");
    assert_int_equal(knobs_with("CLEF_CUDA_QWGMMA_ROWS", "2048", &e, &err), 0);
    assert_int_equal(e.qwgmma_rows, 2048);
    expect_knob_error("CLEF_CUDA_WGMMA_ROWS", "0",
                 "CUDA settings: CLEF_CUDA_WGMMA_ROWS must be an integer from 1 to 1073741824 (got '0')");
    char names[512];
    clef_cuda_knob_names(names, sizeof names);
    assert_non_null(strstr(names, "CLEF_CUDA_GEMM, CLEF_CUDA_TUNE, "));
    assert_non_null(strstr(names, ", CLEF_CUDA_WGMMA_WS, CLEF_CUDA_V5_ROWS"));
    clef_cuda_knob_names(names, 10); /* truncated, terminated */
    assert_int_equal(strlen(names), 9);
    assert_int_equal(knobs_with("CLEF_CUDA_V5_ROWS", "64", &e, &err), 0);
    assert_int_equal(e.v5_rows, 64);
    expect_knob_error("CLEF_CUDA_V5_ROWS", "0",
                 "CUDA settings: CLEF_CUDA_V5_ROWS must be an integer from 1 to 1048576 (got '0')");
    expect_knob_error("CLEF_CUDA_TMA", "2", "CUDA settings: CLEF_CUDA_TMA must be an integer from 0 to 1 (got '2')");
    expect_error("CLEF_CUDA_GRAPHS", "yes", "CUDA settings: CLEF_CUDA_GRAPHS must be an integer from 0 to 1 (got 'yes')");
    expect_knob_error("CLEF_CUDA_ATTN", "v3", "CUDA settings: CLEF_CUDA_ATTN must be v1, v2, v2w or v2s (got 'v3')");
    expect_knob_error("CLEF_CUDA_QGEMM_INT4", "marlin",
                 "CUDA settings: CLEF_CUDA_QGEMM_INT4 must be v2, v3, v3-2blk, v4 or v5 (got 'marlin')");
    expect_knob_error("CLEF_CUDA_QGEMM_NVFP4", "v3-2blk",
                 "CUDA settings: CLEF_CUDA_QGEMM_NVFP4 must be v2, v3, v4 or v5 (got 'v3-2blk')");
    expect_knob_error("CLEF_CUDA_QGEMM_NVFP4", "V3", "CUDA settings: CLEF_CUDA_QGEMM_NVFP4 must be v2, v3, v4 or v5 (got 'V3')");
    expect_knob_error("CLEF_CUDA_GEMM", "cublas", "CUDA settings: CLEF_CUDA_GEMM must be cublaslt or custom (got 'cublas')");
}

/* The mode names every command's --numerics takes (backend/numerics.c), their parts and bars. */
static void test_numerics_modes(void **state) {
    (void)state;
    clef_numerics m = CLEF_NUMERICS_ENV;
    assert_int_equal(clef_numerics_parse("fast", &m), 0);
    assert_int_equal(m, CLEF_NUMERICS_FAST);
    assert_int_equal(clef_numerics_parse("balanced", &m), 0);
    assert_int_equal(m, CLEF_NUMERICS_BALANCED);
    assert_int_equal(clef_numerics_parse("precise", &m), 0);
    assert_int_equal(m, CLEF_NUMERICS_PRECISE);
    static const char *const bad[] = {"", "Fast", "exact", "default", "fast ", "f32"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        m = CLEF_NUMERICS_BALANCED;
        assert_int_equal(clef_numerics_parse(bad[i], &m), -1);
        assert_int_equal(m, CLEF_NUMERICS_BALANCED); /* left alone */
    }
    assert_int_equal(clef_numerics_parse(NULL, &m), -1);
    assert_string_equal(clef_numerics_name(CLEF_NUMERICS_FAST), "fast");
    assert_string_equal(clef_numerics_name(CLEF_NUMERICS_PRECISE), "precise");
    assert_string_equal(clef_numerics_name(CLEF_NUMERICS_ENV), "default");
    /* the default is fast: no precise part; a zeroed option means the default */
    assert_int_equal(CLEF_NUMERICS_DEFAULT, CLEF_NUMERICS_FAST);
    assert_int_equal(clef_numerics_parts(CLEF_NUMERICS_ENV), 0);
    assert_int_equal(clef_numerics_parts(CLEF_NUMERICS_FAST), 0);
    assert_int_equal(clef_numerics_parts(CLEF_NUMERICS_BALANCED), CLEF_PRECISE_DENSE | CLEF_PRECISE_ATTN);
    assert_int_equal(clef_numerics_parts(CLEF_NUMERICS_PRECISE), CLEF_PRECISE_ALL);
    /* bars: precise f32-level; fast and balanced the reference's bf16 deployment */
    double agree = 0, tv = 0;
    clef_numerics_bar(CLEF_NUMERICS_PRECISE, &agree, &tv);
    assert_true(agree == 0.995 && tv == 0.001);
    clef_numerics_bar(CLEF_NUMERICS_FAST, &agree, &tv);
    assert_true(agree == 0.871 && tv == 0.0159);
    clef_numerics_bar(CLEF_NUMERICS_ENV, &agree, &tv);
    assert_true(agree == 0.871 && tv == 0.0159);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numerics_modes),
        cmocka_unit_test_setup(test_defaults, clear_env),
        cmocka_unit_test_setup(test_switches_not_user_settings, clear_env),
        cmocka_unit_test_setup(test_numerics, clear_env),
        cmocka_unit_test_setup(test_kernel_switches, clear_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
