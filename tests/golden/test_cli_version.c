/* test_cli_version.c — `clef --version` names the version, the commit the
 * binary was built from and the GPU architectures it holds code for (issue
 * 22): the default CUDA build (CLEF_CUDA_ARCHS=all) lists Ampere, Ada,
 * Hopper and Blackwell machine code plus the newest PTX. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clef_version.h"
#include "testutil.h"
#include "util/buf.h"

static void test_version_lines(void **state) {
    (void)state;
    clef_buf out = {0};
    assert_int_equal(tu_run_cmd(CLEF_BINARY " --version", &out), 0);
    char want[512];
    snprintf(want, sizeof want, "clef %s (commit %s)\ncuda: %s\n", CLEF_VERSION, CLEF_COMMIT,
             CLEF_CUDA_ARCH_LIST[0] ? CLEF_CUDA_ARCH_LIST : "not built (CPU only)");
    assert_string_equal(out.data, want);
    printf("  %s", out.data);
    /* `clef version` is the same */
    clef_buf again = {0};
    assert_int_equal(tu_run_cmd(CLEF_BINARY " version", &again), 0);
    assert_string_equal(again.data, out.data);
    clef_buf_free(&again);
    clef_buf_free(&out);
}

/* The commit is the source tree's HEAD (12 hex digits, "+dirty" with uncommitted changes), when the
 * tree is a git checkout and git answers; otherwise "unknown". */
static void test_commit_is_head(void **state) {
    (void)state;
    clef_buf head = {0};
    int rc = tu_run_cmd("git -C " CLEF_SOURCE_DIR " rev-parse --short=12 HEAD 2>/dev/null", &head);
    if (rc != 0 || head.len < 12) {
        assert_string_equal(CLEF_COMMIT, "unknown");
        clef_buf_free(&head);
        return;
    }
    assert_int_equal(strncmp(CLEF_COMMIT, head.data, 12), 0);
    assert_true(CLEF_COMMIT[12] == '\0' || !strcmp(CLEF_COMMIT + 12, "+dirty"));
    clef_buf_free(&head);
}

/* The architecture list follows the CMake setting: `all` is the six generations' machine code and
 * sm_120's PTX (CMakeLists.txt); a CPU-only build lists none. */
static void test_arch_list(void **state) {
    (void)state;
#ifndef CLEF_TEST_CUDA_ARCHS
    assert_string_equal(CLEF_CUDA_ARCH_LIST, "");
#else
    if (!strcmp(CLEF_TEST_CUDA_ARCHS, "all"))
        assert_string_equal(CLEF_CUDA_ARCH_LIST, "sm_80 sm_86 sm_89 sm_90a sm_100 sm_120 compute_120");
    else
        assert_true(CLEF_CUDA_ARCH_LIST[0] != '\0');
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_lines),
        cmocka_unit_test(test_commit_is_head),
        cmocka_unit_test(test_arch_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
