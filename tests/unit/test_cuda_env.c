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
                                   "CLEF_CUDA_TMA",     "CLEF_CUDA_WGMMA_WS"};

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

static void test_defaults(void **state) {
    (void)state;
    clef_cuda_env e;
    clef_err err;
    assert_int_equal(read_with(NULL, NULL, &e, &err), 0);
    assert_int_equal(e.precise_parts, CLEF_PRECISE_ALL);
    assert_int_equal(e.gemm_custom, 0);
    assert_int_equal(e.profile, 0);
    assert_int_equal(e.tune, 7);
    assert_int_equal(e.wgmma, 2);
    assert_int_equal(e.qwgmma, 1);
    assert_int_equal(e.int4, 3);
    assert_int_equal(e.nvfp4, 3);
    assert_int_equal(e.lt_splitk, 1);
    assert_int_equal(e.attn, 0);
    assert_int_equal(e.graphs, 1);
    assert_int_equal(e.tma, 1);
    assert_int_equal(e.wgmma_ws, 1);
    assert_int_equal(e.wgmma_rows, 8000);
    assert_int_equal(e.qwgmma_rows, 8192);
    assert_int_equal(e.fp8_mma, 0);
    /* an empty value is the default too */
    assert_int_equal(read_with("CLEF_CUDA_WGMMA", "", &e, &err), 0);
    assert_int_equal(e.wgmma, 2);
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
    clef_cuda_env e;
    clef_err err;
    assert_int_equal(read_with("CLEF_CUDA_WGMMA", "0", &e, &err), 0);
    assert_int_equal(e.wgmma, 0);
    assert_int_equal(read_with("CLEF_CUDA_QWGMMA", "2", &e, &err), 0);
    assert_int_equal(e.qwgmma, 2);
    assert_int_equal(read_with("CLEF_CUDA_TUNE", "0", &e, &err), 0);
    assert_int_equal(e.tune, 0);
    assert_int_equal(read_with("CLEF_CUDA_LT_SPLITK", "2", &e, &err), 0);
    assert_int_equal(e.lt_splitk, 2);
    assert_int_equal(read_with("CLEF_CUDA_PROFILE", "1", &e, &err), 0);
    assert_int_equal(e.profile, 1);
    assert_int_equal(read_with("CLEF_CUDA_GEMM", "custom", &e, &err), 0);
    assert_int_equal(e.gemm_custom, 1);
    assert_int_equal(read_with("CLEF_CUDA_GEMM", "cublaslt", &e, &err), 0);
    assert_int_equal(e.gemm_custom, 0);
    assert_int_equal(read_with("CLEF_CUDA_GRAPHS", "0", &e, &err), 0);
    assert_int_equal(e.graphs, 0);
    assert_int_equal(read_with("CLEF_CUDA_TMA", "0", &e, &err), 0);
    assert_int_equal(e.tma, 0);
    assert_int_equal(read_with("CLEF_CUDA_WGMMA_WS", "0", &e, &err), 0);
    assert_int_equal(e.wgmma_ws, 0);
    assert_int_equal(read_with("CLEF_CUDA_WGMMA_WS", "2", &e, &err), 0);
    assert_int_equal(e.wgmma_ws, 2);
    const char *int4[] = {"v2", "v3", "v3-2blk"};
    const int int4_want[] = {2, 3, 4};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(read_with("CLEF_CUDA_QGEMM_INT4", int4[i], &e, &err), 0);
        assert_int_equal(e.int4, int4_want[i]);
    }
    const char *nvfp4[] = {"v2", "v3"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(read_with("CLEF_CUDA_QGEMM_NVFP4", nvfp4[i], &e, &err), 0);
        assert_int_equal(e.nvfp4, i + 2);
        assert_int_equal(e.int4, 3); /* the INT4 switch is its own */
    }
    const char *attn[] = {"v1", "v2", "v2w"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(read_with("CLEF_CUDA_ATTN", attn[i], &e, &err), 0);
        assert_int_equal(e.attn, i + 1);
    }
    assert_int_equal(read_with("CLEF_CUDA_FP8_MMA", "1", &e, &err), 0);
    assert_int_equal(e.fp8_mma, 1);
    assert_int_equal(read_with("CLEF_CUDA_FP8_MMA", "0", &e, &err), 0);
    assert_int_equal(e.fp8_mma, 0);
    expect_error("CLEF_CUDA_FP8_MMA", "2", "CUDA settings: CLEF_CUDA_FP8_MMA must be an integer from 0 to 1 (got '2')");
    expect_error("CLEF_CUDA_FP8_MMA", "on", "CUDA settings: CLEF_CUDA_FP8_MMA must be an integer from 0 to 1 (got 'on')");
    expect_error("CLEF_CUDA_WGMMA", "yes", "CUDA settings: CLEF_CUDA_WGMMA must be an integer from 0 to 2 (got 'yes')");
    expect_error("CLEF_CUDA_WGMMA", "3", "CUDA settings: CLEF_CUDA_WGMMA must be an integer from 0 to 2 (got '3')");
    expect_error("CLEF_CUDA_WGMMA", "-1", "CUDA settings: CLEF_CUDA_WGMMA must be an integer from 0 to 2 (got '-1')");
    expect_error("CLEF_CUDA_TUNE", "99999999999999999999",
                 "CUDA settings: CLEF_CUDA_TUNE must be an integer from 0 to 7 (got '99999999999999999999')");
    expect_error("CLEF_CUDA_QWGMMA", "1 ", "CUDA settings: CLEF_CUDA_QWGMMA must be an integer from 0 to 2 (got '1 ')");
    expect_error("CLEF_CUDA_PROFILE", "on", "CUDA settings: CLEF_CUDA_PROFILE must be an integer from 0 to 1 (got 'on')");
    assert_int_equal(read_with("CLEF_CUDA_QWGMMA_ROWS", "2048", &e, &err), 0);
    assert_int_equal(e.qwgmma_rows, 2048);
    expect_error("CLEF_CUDA_WGMMA_ROWS", "0",
                 "CUDA settings: CLEF_CUDA_WGMMA_ROWS must be an integer from 1 to 1073741824 (got '0')");
    expect_error("CLEF_CUDA_TMA", "2", "CUDA settings: CLEF_CUDA_TMA must be an integer from 0 to 1 (got '2')");
    expect_error("CLEF_CUDA_WGMMA_WS", "on",
                 "CUDA settings: CLEF_CUDA_WGMMA_WS must be an integer from 0 to 2 (got 'on')");
    expect_error("CLEF_CUDA_WGMMA_WS", "3",
                 "CUDA settings: CLEF_CUDA_WGMMA_WS must be an integer from 0 to 2 (got '3')");
    expect_error("CLEF_CUDA_GRAPHS", "yes", "CUDA settings: CLEF_CUDA_GRAPHS must be an integer from 0 to 1 (got 'yes')");
    expect_error("CLEF_CUDA_ATTN", "v3", "CUDA settings: CLEF_CUDA_ATTN must be v1, v2 or v2w (got 'v3')");
    expect_error("CLEF_CUDA_QGEMM_INT4", "marlin",
                 "CUDA settings: CLEF_CUDA_QGEMM_INT4 must be v2, v3 or v3-2blk (got 'marlin')");
    expect_error("CLEF_CUDA_QGEMM_NVFP4", "v3-2blk",
                 "CUDA settings: CLEF_CUDA_QGEMM_NVFP4 must be v2 or v3 (got 'v3-2blk')");
    expect_error("CLEF_CUDA_QGEMM_NVFP4", "V3", "CUDA settings: CLEF_CUDA_QGEMM_NVFP4 must be v2 or v3 (got 'V3')");
    expect_error("CLEF_CUDA_GEMM", "cublas", "CUDA settings: CLEF_CUDA_GEMM must be cublaslt or custom (got 'cublas')");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_defaults, clear_env),
        cmocka_unit_test_setup(test_numerics, clear_env),
        cmocka_unit_test_setup(test_kernel_switches, clear_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
