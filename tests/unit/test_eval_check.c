/* test_eval_check.c — the pieces of `clef eval` that need no model:
 *   - clef_eval_check_response: the Decision Index kit's checks of an ok
 *     answer (decision_index/engines/base.py validate), each failure with its
 *     exact message, and the tolerance of the probability sums;
 *   - clef_eval_unsupported: which refusals the kit records as unsupported
 *     (capacity_exceeded, or a 400/413/422 holding one of its markers);
 *   - clef_lines: lines of plain and gzipped files (CRLF, NUL bytes, a last
 *     line without newline, a line over the limit, a truncated gzip stream,
 *     a directory).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "eval/check.h"
#include "eval/lines.h"
#include "testutil.h"

static const char QUESTIONS[] =
    "{\"d\":{\"type\":\"choice\",\"criteria\":{\"billing\":\"Payments\",\"technical\":\"Bugs\"}},"
    "\"u\":{\"type\":\"score\",\"criteria\":[\"low\",\"mid\",\"high\"]},"
    "\"o\":{\"type\":\"noul\"}}";

/* The answers of a response whose parts are `d`, `u` and `o` (JSON text of
 * each answer; NULL leaves the question out), plus `extra` answers. */
static json_value *response(const char *d, const char *u, const char *o, const char *extra) {
    clef_buf b = {0};
    clef_buf_puts(&b, "{\"model\":\"m\",\"answers\":{");
    int first = 1;
    const char *ids[] = {"d", "u", "o"}, *parts[] = {d, u, o};
    for (int i = 0; i < 3; i++)
        if (parts[i]) {
            clef_buf_printf(&b, "%s\"%s\":%s", first ? "" : ",", ids[i], parts[i]);
            first = 0;
        }
    if (extra) clef_buf_printf(&b, "%s%s", first ? "" : ",", extra);
    clef_buf_puts(&b, "},\"usage\":{\"input_tokens\":9,\"output_tokens\":0}}");
    clef_err err;
    json_value *v = json_parse(b.data, b.len, &err);
    if (!v) fail_msg("bad test response %s: %s", b.data, err.message);
    clef_buf_free(&b);
    return v;
}

#define D_OK "{\"type\":\"choice\",\"choice\":\"technical\",\"confidence\":0.6,\"probabilities\":{\"billing\":0.4,\"technical\":0.6}}"
#define U_OK "{\"type\":\"score\",\"score\":1.1,\"confidence\":0.5,\"legend\":{\"0\":\"low\",\"1\":\"mid\",\"2\":\"high\"},\"probabilities\":{\"0\":0.2,\"1\":0.5,\"2\":0.3}}"
#define O_OK "{\"type\":\"noul\",\"noul\":0.25}"

/* check(response) must pass (want == NULL) or fail with exactly `want` and `param`. */
static void want_check(const char *d, const char *u, const char *o, const char *extra, const char *want,
                         const char *param) {
    clef_err err;
    clef_err_clear(&err);
    json_value *q = json_parse(QUESTIONS, sizeof QUESTIONS - 1, &err), *r = response(d, u, o, extra);
    assert_non_null(q);
    int rc = clef_eval_check_response(q, r, &err);
    if (!want) {
        if (rc != 0) fail_msg("valid response refused: %s", err.message);
    } else {
        if (rc == 0) fail_msg("response passed, want '%s'", want);
        printf("  refused: %s (param %s)\n", err.message, err.param);
        assert_int_equal(err.status, 500);
        assert_string_equal(err.type, CLEF_E_INVALID_RESPONSE);
        assert_string_equal(err.message, want);
        assert_string_equal(err.param, param);
    }
    json_free(q);
    json_free(r);
}

static void test_valid_answers_pass(void **state) {
    (void)state;
    want_check(D_OK, U_OK, O_OK, NULL, NULL, NULL);
    /* within the kit's 0.01: 0.4 + 0.595 = 0.995, and 1.009 */
    want_check("{\"type\":\"choice\",\"choice\":\"billing\",\"probabilities\":{\"billing\":0.4,\"technical\":0.595}}",
                 U_OK, O_OK, NULL, NULL, NULL);
    want_check("{\"type\":\"choice\",\"choice\":\"billing\",\"probabilities\":{\"technical\":0.609,\"billing\":0.4}}",
                 U_OK, "{\"type\":\"noul\",\"noul\":1}", NULL, NULL, NULL);
    want_check(D_OK, U_OK, "{\"type\":\"noul\",\"noul\":0}", NULL, NULL, NULL);
}

static void test_each_failure_is_named(void **state) {
    (void)state;
    want_check("{\"type\":\"choice\",\"choice\":\"billing\",\"probabilities\":{\"billing\":0.4,\"technical\":0.58}}",
                 U_OK, O_OK, NULL, "d: probabilities sum to 0.9800, not 1 within 0.01", "questions.d");
    want_check("{\"type\":\"choice\",\"choice\":\"billing\",\"probabilities\":{\"billing\":0.4}}", U_OK, O_OK, NULL,
                 "d: probabilities name 1 options, the question has 2", "questions.d");
    want_check("{\"type\":\"choice\",\"choice\":\"billing\",\"probabilities\":{\"billing\":0.4,\"legal\":0.6}}", U_OK,
                 O_OK, NULL, "d: option 'technical' has no probability", "questions.d");
    want_check("{\"type\":\"choice\",\"choice\":\"legal\",\"probabilities\":{\"billing\":0.4,\"technical\":0.6}}", U_OK,
                 O_OK, NULL, "d: choice is not one of the options", "questions.d");
    want_check("{\"type\":\"choice\",\"choice\":\"billing\",\"probabilities\":{\"billing\":-0.4,\"technical\":1.4}}",
                 U_OK, O_OK, NULL, "d: option 'billing' has a probability that is not a number in [0, 1]", "questions.d");
    want_check("{\"type\":\"choice\",\"choice\":\"billing\",\"probabilities\":{\"billing\":NaN,\"technical\":0.6}}",
                 U_OK, O_OK, NULL, "d: option 'billing' has a probability that is not a number in [0, 1]", "questions.d");
    want_check("{\"type\":\"noul\",\"noul\":0.5}", U_OK, O_OK, NULL, "d: answer type differs from the question's",
                 "questions.d");
    want_check(D_OK, U_OK, "{\"type\":\"noul\",\"noul\":1.5}", NULL, "o: noul is not a number in [0, 1]",
                 "questions.o");
    want_check(D_OK, U_OK, "{\"type\":\"noul\",\"noul\":\"0.5\"}", NULL, "o: noul is not a number in [0, 1]",
                 "questions.o");
    want_check(D_OK, "{\"type\":\"score\",\"score\":2.5,\"probabilities\":{\"0\":0.2,\"1\":0.5,\"2\":0.3}}", O_OK, NULL,
                 "u: score is not a number in [0, 2]", "questions.u");
    want_check(D_OK, "{\"type\":\"score\",\"score\":1,\"probabilities\":{\"0\":0.2,\"1\":0.5,\"3\":0.3}}", O_OK, NULL,
                 "u: option '2' has no probability", "questions.u");
    want_check(D_OK, "{\"type\":\"score\",\"score\":1,\"probabilities\":{\"0\":0.2,\"1\":0.5,\"2\":0.2}}", O_OK, NULL,
                 "u: probabilities sum to 0.9000, not 1 within 0.01", "questions.u");
    want_check(D_OK, U_OK, NULL, NULL, "the response answers 2 questions, the request asks 3", "answers");
    want_check(D_OK, U_OK, NULL, "\"x\":" O_OK, "o: no answer", "questions.o");
}

static void test_unsupported_rule(void **state) {
    (void)state;
    clef_err e;
    clef_fail(&e, 422, CLEF_E_CAPACITY, "questions.q.criteria", "q: 256 options per choice exceed the limit of 255");
    assert_true(clef_eval_unsupported(&e));
    /* no marker, but a capacity error whatever its status: a forward out of memory */
    clef_fail(&e, 500, CLEF_E_CAPACITY, NULL, "the forward pass needs more memory");
    assert_true(clef_eval_unsupported(&e));
    /* too few score levels: invalid_request, but the kit sees "options per choice" */
    clef_fail(&e, 422, CLEF_E_REQUEST, "questions.q.criteria",
              "q: score criteria need at least 2 levels (got 1, below the minimum of 2 options per choice)");
    assert_true(clef_eval_unsupported(&e));
    clef_fail(&e, 422, CLEF_E_REQUEST, "questions", "at least one question is required");
    assert_false(clef_eval_unsupported(&e));
    clef_fail(&e, 413, CLEF_E_TOO_LARGE, NULL, "the row is 9 bytes, more than the limit of 8 bytes");
    assert_false(clef_eval_unsupported(&e));
    /* a marker outside 400/413/422 is the kit's error too */
    clef_fail(&e, 500, CLEF_E_INTERNAL, NULL, "too many tokens in flight");
    assert_false(clef_eval_unsupported(&e));
    clef_fail(&e, 400, CLEF_E_JSON, NULL, "invalid JSON at byte 3: maximum context length");
    assert_true(clef_eval_unsupported(&e));
}

/* ---- lines ------------------------------------------------------------- */

static void write_bytes(const char *path, const char *p, size_t n, int gz) {
    if (gz) {
        gzFile f = gzopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(gzwrite(f, p, (unsigned)n), (int)n);
        assert_int_equal(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(p, 1, n, f), n);
        fclose(f);
    }
}

/* The lines of `path` joined as "<no>:<text>|" ("<no>:LONG<n>|" for a line over the limit). */
static int read_lines(const char *path, size_t max_line, clef_buf *got, clef_err *err) {
    clef_lines *r = clef_lines_open(path, max_line, err);
    if (!r) return -1;
    clef_buf line = {0};
    size_t no, too_long;
    int rc;
    got->len = 0;
    clef_buf_puts(got, "");
    while ((rc = clef_lines_next(r, &line, &no, &too_long, err)) > 0) {
        if (rc == 2)
            clef_buf_printf(got, "%zu:LONG%zu|", no, too_long);
        else {
            clef_buf_printf(got, "%zu:", no);
            for (size_t i = 0; i < line.len; i++) clef_buf_putc(got, line.data[i] ? line.data[i] : '@');
            clef_buf_putc(got, '|');
        }
    }
    clef_buf_free(&line);
    clef_lines_close(r);
    return rc;
}

static void test_lines_plain_and_gzip(void **state) {
    (void)state;
    static const char text[] = "{\"a\":1}\r\n\nx\0y\nlong line here\nlast";
    char path[] = "/tmp/clef-lines-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    for (int gz = 0; gz < 2; gz++) {
        write_bytes(path, text, sizeof text - 1, gz);
        clef_buf got = {0};
        clef_err err;
        assert_int_equal(read_lines(path, 0, &got, &err), 0);
        assert_string_equal(got.data, "1:{\"a\":1}|2:|3:x@y|4:long line here|5:last|");
        /* a 14-byte line over a limit of 13: reported, and the next line still read */
        assert_int_equal(read_lines(path, 13, &got, &err), 0);
        assert_string_equal(got.data, "1:{\"a\":1}|2:|3:x@y|4:LONG14|5:last|");
        clef_lines *r = clef_lines_open(path, 0, &err);
        clef_buf line = {0};
        assert_int_equal(clef_lines_next(r, &line, NULL, NULL, &err), 1);
        assert_int_equal(clef_lines_gzipped(r), gz);
        clef_buf_free(&line);
        clef_lines_close(r);
        printf("  %s: %s\n", gz ? "gzip" : "plain", got.data);
        clef_buf_free(&got);
    }
    unlink(path);
}

static void test_lines_truncated_gzip(void **state) {
    (void)state;
    /* 2 MiB of rows, gzipped, then its last quarter cut off */
    clef_buf text = {0};
    for (int i = 0; text.len < (2u << 20); i++) clef_buf_printf(&text, "{\"row\":%d,\"pad\":\"%08x%08x\"}\n", i, i * 7919u, i * 104729u);
    char path[] = "/tmp/clef-lines-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_bytes(path, text.data, text.len, 1);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, st.st_size * 3 / 4), 0);
    clef_buf got = {0};
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(read_lines(path, 0, &got, &err), -1);
    printf("  %s\n", err.message);
    assert_non_null(strstr(err.message, "the gzip stream is truncated"));
    assert_non_null(strstr(err.message, "cannot read past line "));
    /* the lines before the cut were all returned */
    assert_true(got.len > 1000);
    clef_buf_free(&got);
    clef_buf_free(&text);
    unlink(path);

    assert_null(clef_lines_open("/tmp", 0, &err));
    assert_string_equal(err.message, "/tmp: is a directory, not a JSON-lines file");
    assert_null(clef_lines_open("/nonexistent/rows.jsonl", 0, &err));
    assert_string_equal(err.message, "/nonexistent/rows.jsonl: cannot open: No such file or directory");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_answers_pass),
        cmocka_unit_test(test_each_failure_is_named),
        cmocka_unit_test(test_unsupported_rule),
        cmocka_unit_test(test_lines_plain_and_gzip),
        cmocka_unit_test(test_lines_truncated_gzip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
