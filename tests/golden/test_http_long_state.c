/* test_http_long_state.c — huge states through a real `clef serve`: 16 MiB
 * of spaces and 12 MiB of tabs used to get 500 "split regex failed at byte
 * 0: match limit exceeded" (8 MiB got the 422 after seconds of tokenizing),
 * and a 31 MiB state cost 22 s of tokenizing before its 422.  Now each gets
 * the capacity 422 at once, from its byte count (no token can cover more
 * than 128 bytes), with the lower bound in the message; with
 * "truncate_state": true the state is cut and answered.  The server keeps
 * answering afterwards.  Times are printed, not asserted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decision/encode.h"
#include "decision/request.h"
#include "httputil.h"
#include "testutil.h"

#define MAX_LENGTH 2048

static hu_server srv;
static size_t fixed; /* tokens of the record around the state */

static const char QUESTIONS[] = "{\"q\":{\"type\":\"noul\",\"instructions\":\"Is it long?\"}}";

static int setup(void **state) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const char *args[] = {"--max-length", "2048", NULL};
    hu_start(&srv, args, NULL);
    /* the record's size without state, from the library */
    clef_tokenizer *tok = tu_load_tokenizer();
    char body[256];
    int len = snprintf(body, sizeof body, "{\"model\":\"m\",\"state\":\"\",\"questions\":%s}", QUESTIONS);
    clef_request req;
    clef_record rec;
    clef_err err;
    clef_err_clear(&err);
    if (clef_request_parse(body, (size_t)len, NULL, &req, &err)) fail_msg("%s", err.message);
    if (clef_encode_record(tok, &req, MAX_LENGTH, 0, &rec, &err)) fail_msg("%s", err.message);
    fixed = rec.n_ids;
    clef_record_free(&rec);
    clef_request_free(&req);
    clef_tokenizer_free(tok);
    return 0;
}

static int teardown(void **state) {
    int rc = hu_stop(&srv);
    hu_remove_log(&srv);
    curl_global_cleanup();
    return rc == 0 ? 0 : -1;
}

/* A request whose state is `reps` copies of the JSON-escaped unit `unit`. */
static char *body_of(const char *unit, size_t reps, const char *extra, size_t *len) {
    clef_buf b = {0};
    size_t ul = strlen(unit);
    clef_buf_reserve(&b, ul * reps + 256);
    clef_buf_puts(&b, "{\"model\":\"m\",\"state\":\"");
    for (size_t i = 0; i < reps; i++) memcpy(b.data + b.len + i * ul, unit, ul);
    b.len += ul * reps;
    clef_buf_printf(&b, "\",%s\"questions\":%s}", extra, QUESTIONS);
    *len = b.len;
    return b.data;
}

static void post(const char *body, size_t len, hu_response *r, double *seconds) {
    CURL *curl = curl_easy_init();
    double t0 = hu_now();
    hu_post_json(curl, &srv, body, len, NULL, r);
    *seconds = hu_now() - t0;
    curl_easy_cleanup(curl);
}

/* State of `bytes` bytes (unit repeated), refused with the lower bound
 * ceil(bytes / 128) state tokens. */
static void expect_refused(const char *what, const char *unit, size_t unit_bytes, size_t bytes) {
    size_t len;
    char *body = body_of(unit, bytes / unit_bytes, "", &len);
    hu_response r;
    double dt;
    post(body, len, &r, &dt);
    char want[512];
    snprintf(want, sizeof want,
             "{\"error\":{\"message\":\"maximum context length: record requires more than %zu tokens; maximum is %d\","
             "\"type\":\"capacity_exceeded\",\"param\":\"state\"}}",
             fixed + (bytes + 127) / 128 - 1, MAX_LENGTH);
    print_message("%s (%zu-byte body): %ld in %.2f s\n", what, len, r.status, dt);
    assert_int_equal(r.status, 422);
    assert_string_equal(r.body.data, want);
    hu_free(&r);
    free(body);
}

static void test_huge_states_refused(void **state) {
    expect_refused("16 MiB of spaces", " ", 1, (size_t)16 << 20);
    expect_refused("12 MiB of tabs", "\\t", 1, (size_t)12 << 20); /* "\t" in JSON: one tab per 2 body bytes */
    expect_refused("8 MiB of spaces", " ", 1, (size_t)8 << 20);
    expect_refused("31 MiB of words", "word ", 5, (size_t)31 << 20);
    hu_response r;
    hu_get(&srv, "/healthz", NULL, &r);
    assert_int_equal(r.status, 200);
    hu_free(&r);
}

/* With truncate_state the state is tokenized up to its first MAX_LENGTH -
 * fixed ids (all of the one 16 MiB piece here) and the record is cut. */
static void test_huge_state_truncated(void **state) {
    size_t len;
    char *body = body_of(" ", (size_t)16 << 20, "\"truncate_state\":true,", &len);
    hu_response r;
    double dt;
    post(body, len, &r, &dt);
    print_message("16 MiB of spaces, truncate_state: %ld in %.2f s\n", r.status, dt);
    assert_int_equal(r.status, 200);
    char want[128];
    snprintf(want, sizeof want, "\"usage\":{\"input_tokens\":%d,\"output_tokens\":0}}", MAX_LENGTH);
    if (!strstr(r.body.data, want)) fail_msg("response %s lacks %s", r.body.data, want);
    hu_free(&r);
    free(body);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_huge_states_refused),
        cmocka_unit_test(test_huge_state_truncated),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
