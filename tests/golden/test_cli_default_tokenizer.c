/* test_cli_default_tokenizer.c — where `clef ... --synthetic P` finds its
 * default tokenizer when --tokenizer is not given: the working directory,
 * then next to the binary (a build directory of a checkout:
 * <bin>/../tests/fixtures/tiny-clef-omni/tokenizer.json; an installed clef:
 * <bin>/../share/clef/tokenizer.json, which `cmake --install` writes), then
 * the source tree it was built from.
 *
 * The binary-relative places are checked with a copy of the binary in a
 * temporary tree whose tokenizer has one extra added token, "<|zz|>" (id
 * 151700): the request's state "<|zz|>" encodes to that id only when the
 * copy's tokenizer was the one loaded (the source tree's has no such token).
 */
#define _GNU_SOURCE
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static char tmproot[] = "/tmp/clef_deftok_XXXXXX";

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }
static int setup(void **state) { return mkdtemp(tmproot) ? 0 : -1; }
static int teardown(void **state) { return nftw(tmproot, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

static void run_ok(const char *cmd, clef_buf *out) {
    int rc = tu_run_cmd(cmd, out);
    if (rc != 0) fail_msg("`%s`: exit %d, output:\n%s", cmd, rc, out->data);
}

/* mkdir -p for a path under tmproot. */
static void mkdirs(const char *path) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", path);
    clef_buf out = {0};
    run_ok(cmd, &out);
    clef_buf_free(&out);
}

/* The fixture tokenizer plus the added token "<|zz|>" = 151700, at `path`. */
static void write_marked_tokenizer(const char *path) {
    char *src = tu_fixture("tiny-clef-omni/tokenizer.json");
    size_t len;
    char *text = tu_read_file(src, &len);
    const char *at = strstr(text, "\"added_tokens\": [");
    assert_non_null(at);
    at += strlen("\"added_tokens\": [");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(text, 1, (size_t)(at - text), f);
    fputs("{\"id\":151700,\"content\":\"<|zz|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
          "\"normalized\":false,\"special\":true},",
          f);
    fwrite(at, 1, len - (size_t)(at - text), f);
    assert_int_equal(fclose(f), 0);
    free(text);
    free(src);
}

static void copy_binary(const char *dst) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", CLEF_BINARY, dst);
    clef_buf out = {0};
    run_ok(cmd, &out);
    clef_buf_free(&out);
}

/* Run `<bin> decide --synthetic tiny --debug` on the state "<|zz|>" from
 * working directory `cwd`; returns whether id 151700 was in the input ids. */
static int decide_sees_marker(const char *bin, const char *cwd) {
    char req[600];
    snprintf(req, sizeof req, "%s/req.json", tmproot);
    FILE *f = fopen(req, "wb");
    assert_non_null(f);
    fputs("{\"model\":\"m\",\"state\":\"<|zz|>\",\"questions\":{\"q\":{\"type\":\"noul\"}}}", f);
    assert_int_equal(fclose(f), 0);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cd '%s' && timeout 120 '%s' decide --synthetic tiny --debug '%s'", cwd, bin, req);
    clef_buf out = {0};
    run_ok(cmd, &out);
    int seen = strstr(out.data, "151700") != NULL;
    assert_non_null(strstr(out.data, "\"input_ids\":[151644,")); /* it did encode */
    clef_buf_free(&out);
    return seen;
}

/* The case: bench from outside the checkout (it said "tokenizer
 * tests/fixtures/tiny-clef-omni/tokenizer.json: cannot open"). */
static void test_bench_from_elsewhere(void **state) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cd '%s' && timeout 120 %s bench --synthetic tiny --tokens 256 --iters 1", tmproot,
             CLEF_BINARY);
    clef_buf out = {0};
    run_ok(cmd, &out);
    assert_non_null(strstr(out.data, "latency_ms_p50 "));
    assert_non_null(strstr(out.data, "load_s "));
    clef_buf_free(&out);
}

/* A copy of clef at TMP/<root>/<bin_dir>/clef beside a marked tokenizer at
 * TMP/<root>/<tok_dir>/tokenizer.json; returns whether the copy's `decide`
 * (run from TMP) sees the marker. */
static int layout_sees_marker(const char *root, const char *bin_dir, const char *tok_dir) {
    char bin[800], tok[800];
    snprintf(bin, sizeof bin, "%s/%s/%s", tmproot, root, bin_dir);
    mkdirs(bin);
    snprintf(tok, sizeof tok, "%s/%s/%s", tmproot, root, tok_dir);
    mkdirs(tok);
    strcat(tok, "/tokenizer.json");
    write_marked_tokenizer(tok);
    strcat(bin, "/clef");
    copy_binary(bin);
    return decide_sees_marker(bin, tmproot);
}

/* An installed clef (PREFIX/bin/clef) uses PREFIX/share/clef/tokenizer.json. */
static void test_installed_layout(void **state) {
    assert_true(layout_sees_marker("prefix", "bin", "share/clef"));
    /* the plain binary, run from the same directory, has the source tree's */
    assert_false(decide_sees_marker(CLEF_BINARY, tmproot));
}

/* A build directory of a checkout (CHECKOUT/build/clef) uses
 * CHECKOUT/tests/fixtures/tiny-clef-omni/tokenizer.json. */
static void test_build_layout(void **state) {
    assert_true(layout_sees_marker("checkout", "build", "tests/fixtures/tiny-clef-omni"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bench_from_elsewhere),
        cmocka_unit_test(test_installed_layout),
        cmocka_unit_test(test_build_layout),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
