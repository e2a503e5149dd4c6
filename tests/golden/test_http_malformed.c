/* Malformed-input table against a real `clef serve` (SPEC.md §2.2): each
 * hostile or broken request gets the right 4xx with a JSON error body naming
 * the problem, and the server keeps answering /healthz after every one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "httputil.h"
#include "json/json.h"
#include "testutil.h"

static hu_server srv;

/* The Decision Index kit's CAPACITY_MARKERS (decision_index/engines/http.py):
 * it records a 400/413/422 whose body holds one as "unsupported". */
static const char *const kit_markers[] = {
    "options per choice", "a choice needs at least two options", "a score takes 2 to 10 levels",
    "the canvas holds", "maximum context length", "maximum model length",
    "longer than the maximum model length", "context window", "too many tokens",
};

static int has_kit_marker(const char *body) {
    for (size_t i = 0; i < sizeof kit_markers / sizeof *kit_markers; i++)
        if (strstr(body, kit_markers[i])) return 1;
    return 0;
}

static int setup(void **state) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    hu_start(&srv, NULL, NULL);
    return 0;
}

static int teardown(void **state) {
    int rc = hu_stop(&srv);
    hu_remove_log(&srv);
    curl_global_cleanup();
    return rc == 0 ? 0 : -1;
}

typedef struct bad_case {
    const char *name;
    char *body; /* heap; may hold NUL bytes */
    size_t len;
    const char *content_type; /* NULL = application/json; "" = none */
    size_t stream_bytes;      /* > 0: a chunked upload of this many bytes instead of body */
    long status;
    const char *type;    /* expected error.type */
    const char *message; /* substring of error.message */
} bad_case;

static char *dup_text(const char *s, size_t *len) {
    *len = strlen(s);
    return clef_xstrndup(s, *len);
}

/* A request around `questions` (a JSON fragment). */
static char *with_questions(const char *questions, size_t *len) {
    clef_buf b = {0};
    clef_buf_printf(&b, "{\"model\":\"m\",\"state\":\"x\",\"questions\":%s}", questions);
    *len = b.len;
    return b.data;
}

static char *choice_with_options(size_t n, size_t *len) {
    clef_buf q = {0};
    clef_buf_puts(&q, "{\"q\":{\"type\":\"choice\",\"criteria\":{");
    for (size_t i = 0; i < n; i++) clef_buf_printf(&q, "%s\"o%zu\":null", i ? "," : "", i);
    clef_buf_puts(&q, "}}}");
    char *out = with_questions(q.data, len);
    clef_buf_free(&q);
    return out;
}

static char *many_questions(size_t n, size_t *len) {
    clef_buf q = {0};
    clef_buf_putc(&q, '{');
    for (size_t i = 0; i < n; i++) clef_buf_printf(&q, "%s\"q%zu\":{\"type\":\"noul\"}", i ? "," : "", i);
    clef_buf_putc(&q, '}');
    char *out = with_questions(q.data, len);
    clef_buf_free(&q);
    return out;
}

/* A state of ~70k tokens: " w" + digit pairs tokenize to about 2 tokens each. */
static char *long_state(size_t *len) {
    clef_buf b = {0};
    clef_buf_puts(&b, "{\"model\":\"m\",\"state\":\"");
    for (size_t i = 0; i < 70000; i++) clef_buf_puts(&b, " word");
    clef_buf_puts(&b, "\",\"questions\":{\"q\":{\"type\":\"noul\"}}}");
    *len = b.len;
    return b.data;
}

static char *deep_state(size_t depth, size_t *len) {
    clef_buf b = {0};
    clef_buf_puts(&b, "{\"model\":\"m\",\"state\":");
    for (size_t i = 0; i < depth; i++) clef_buf_putc(&b, '[');
    for (size_t i = 0; i < depth; i++) clef_buf_putc(&b, ']');
    clef_buf_puts(&b, ",\"questions\":{\"q\":{\"type\":\"noul\"}}}");
    *len = b.len;
    return b.data;
}

/* The raw bytes `pre` + byte + `post`. */
static char *with_byte(const char *pre, unsigned char byte, const char *post, size_t *len) {
    clef_buf b = {0};
    clef_buf_puts(&b, pre);
    clef_buf_putc(&b, (char)byte);
    clef_buf_puts(&b, post);
    *len = b.len;
    return b.data;
}

static void check_healthy(const char *after) {
    hu_response r;
    hu_get(&srv, "/healthz", NULL, &r);
    if (r.status != 200) fail_msg("after %s: /healthz answered %ld (curl %d)", after, r.status, r.curl_code);
    hu_free(&r);
}

static void run_case(const bad_case *c) {
    const char *h[3] = {NULL, NULL, NULL};
    char ct[128];
    if (!c->content_type) h[0] = "Content-Type: application/json";
    else if (c->content_type[0]) snprintf(ct, sizeof ct, "Content-Type: %s", c->content_type), h[0] = ct;
    hu_response r;
    hu_request_on(NULL, &srv, "POST", "/v1/systemone", h[0] ? h : NULL, c->body, c->len, c->stream_bytes, 60, &r);
    if (r.curl_code != CURLE_OK) fail_msg("%s: transport error %d", c->name, r.curl_code);
    if (r.status != c->status) fail_msg("%s: status %ld, expected %ld: %s", c->name, r.status, c->status, r.body.data);
    clef_err perr;
    json_value *body = json_parse(r.body.data, r.body.len, &perr);
    if (!body) fail_msg("%s: body is not JSON: %s", c->name, r.body.data);
    const json_value *e = json_get(body, "error");
    if (!e || !json_get(e, "message") || !json_get(e, "type") || !json_get(e, "param"))
        fail_msg("%s: not an error body: %s", c->name, r.body.data);
    if (strcmp(json_get(e, "type")->str, c->type))
        fail_msg("%s: type %s, expected %s", c->name, json_get(e, "type")->str, c->type);
    if (!strstr(json_get(e, "message")->str, c->message))
        fail_msg("%s: message '%s' lacks '%s'", c->name, json_get(e, "message")->str, c->message);
    if (!strcmp(c->type, "capacity_exceeded") && !has_kit_marker(r.body.data))
        fail_msg("%s: capacity refusal without a Decision Index marker: %s", c->name, r.body.data);
    assert_string_equal(r.content_type, "application/json");
    assert_true(r.request_id[0] != '\0');
    json_free(body);
    hu_free(&r);
    check_healthy(c->name);
}

static void test_malformed_table(void **state) {
    bad_case cs[32];
    size_t n = 0;
#define ADD(...) (cs[n++] = (bad_case){__VA_ARGS__})
    size_t len;
    char *b;
    b = dup_text("{\"model\":\"m\",\"state\":", &len);
    ADD("truncated JSON", b, len, NULL, 0, 400, "invalid_json", "invalid JSON at byte 21");
    b = dup_text("", &len);
    ADD("empty body", b, len, NULL, 0, 400, "invalid_json", "invalid JSON");
    b = dup_text("[1,2]", &len);
    ADD("array body", b, len, NULL, 0, 400, "invalid_request", "");
    b = with_questions("{\"q\":{\"type\":\"noul\"}}", &len);
    ADD("text/plain", b, len, "text/plain", 0, 415, "invalid_request", "Content-Type must be application/json");
    b = with_questions("{\"q\":{\"type\":\"noul\"}}", &len);
    ADD("form content type", b, len, "application/x-www-form-urlencoded", 0, 415, "invalid_request", "got 'application/x-www-form-urlencoded'");
    b = with_questions("{\"q\":{\"type\":\"noul\"}}", &len);
    ADD("latin-1 charset", b, len, "application/json; charset=iso-8859-1", 0, 415, "invalid_request", "Content-Type");
    /* 33 MiB with Content-Length: refused on the headers, before the body */
    len = (size_t)33 << 20;
    b = clef_xmalloc(len);
    memset(b, ' ', len);
    ADD("33 MiB body", b, len, NULL, 0, 413, "payload_too_large", "exceeds the limit of 33554432 bytes");
    ADD("33 MiB chunked body", NULL, 0, NULL, (size_t)33 << 20, 413, "payload_too_large", "exceeds the limit");
    b = with_questions("[{\"type\":\"noul\"}]", &len);
    ADD("questions as a list", b, len, NULL, 0, 400, "invalid_request", "at least one question is required");
    b = with_questions("{\"q\":5}", &len);
    ADD("non-object question", b, len, NULL, 0, 400, "invalid_request", "q: question must be an object");
    b = with_questions("{\"q\":{\"type\":7}}", &len);
    ADD("non-string type", b, len, NULL, 0, 400, "invalid_request", "q: type must be noul, choice, or score");
    b = with_questions("{\"q\":{\"type\":\"yesno\"}}", &len);
    ADD("unknown type", b, len, NULL, 0, 422, "invalid_request", "q: type must be noul, choice, or score");
    b = with_questions("{\"q\":{\"type\":\"choice\",\"criteria\":[\"a\",\"b\"]}}", &len);
    ADD("choice criteria list", b, len, NULL, 0, 400, "invalid_request", "q: choice criteria must be an object");
    b = choice_with_options(256, &len);
    ADD("256 options", b, len, NULL, 0, 422, "capacity_exceeded", "q: 256 options per choice exceed the limit of 255");
    b = with_questions("{\"q\":{\"type\":\"score\",\"criteria\":[\"only\"]}}", &len);
    ADD("1 score level", b, len, NULL, 0, 422, "invalid_request", "q: score criteria need at least 2 levels (got 1, below the minimum of 2 options per choice)");
    b = many_questions(65, &len);
    ADD("65 questions", b, len, NULL, 0, 422, "capacity_exceeded", "65 questions exceed the limit of 64 questions per context window");
    b = long_state(&len);
    ADD("70k-token state", b, len, NULL, 0, 422, "capacity_exceeded",
        "maximum context length: record requires ");
    b = with_byte("{\"model\":\"m\",\"state\":\"a", 0x00, "b\",\"questions\":{\"q\":{\"type\":\"noul\"}}}", &len);
    ADD("raw NUL byte in a string", b, len, NULL, 0, 400, "invalid_json", "control character");
    b = with_byte("{\"model\":\"m\",\"state\":\"a", 0xff, "b\",\"questions\":{\"q\":{\"type\":\"noul\"}}}", &len);
    ADD("invalid UTF-8 (0xff)", b, len, NULL, 0, 400, "invalid_json", "UTF-8");
    b = with_byte("{\"model\":\"m\",\"state\":\"a", 0xc3, "(\",\"questions\":{\"q\":{\"type\":\"noul\"}}}", &len);
    ADD("invalid UTF-8 (truncated sequence)", b, len, NULL, 0, 400, "invalid_json", "UTF-8");
    b = with_byte("{\"model\":\"m\",\"state\":\"x\",\"questions\":{\"q\":{\"type\":\"noul\",\"instructions\":\"", 0xed,
                  "\\u0000\"}}}", &len);
    ADD("invalid UTF-8 in instructions", b, len, NULL, 0, 400, "invalid_json", "UTF-8");
    b = dup_text("{\"model\":\"m\",\"state\":\"\\ud800\",\"questions\":{\"q\":{\"type\":\"noul\"}}}", &len);
    ADD("lone high surrogate escape", b, len, NULL, 0, 400, "invalid_json", "lone surrogate");
    b = dup_text("{\"model\":\"m\",\"state\":\"x\",\"questions\":{\"\\udc00\":{\"type\":\"noul\"}}}", &len);
    ADD("lone low surrogate in a key", b, len, NULL, 0, 400, "invalid_json", "lone surrogate");
    b = deep_state(10000, &len);
    ADD("10k-deep nesting", b, len, NULL, 0, 400, "invalid_json", "nesting deeper than");
    b = dup_text("{\"model\":\"m\",\"state\":1,\"questions\":{\"q\":{\"type\":\"noul\"}},\"media_kwargs\":{}}", &len);
    ADD("media_kwargs", b, len, NULL, 0, 422, "invalid_request", "media_kwargs is not supported");
    b = dup_text("{\"model\":\"m\",\"state\":1,\"questions\":{\"q\":{\"type\":\"noul\"}}} trailing", &len);
    ADD("trailing garbage", b, len, NULL, 0, 400, "invalid_json", "invalid JSON");
    b = dup_text("\xef\xbb\xbf{\"model\":\"m\",\"state\":1,\"questions\":{\"q\":{\"type\":\"noul\"}}}", &len);
    ADD("leading BOM", b, len, NULL, 0, 400, "invalid_json", "invalid JSON");
    b = dup_text("{\"model\":\"m\",\"state\":\"x\",\"questions\":{\"\":{\"type\":\"noul\"}}}", &len);
    ADD("empty question span", b, len, NULL, 0, 422, "invalid_request", "question instructions render to no tokens");
#undef ADD
    for (size_t i = 0; i < n; i++) {
        run_case(&cs[i]);
        free(cs[i].body);
    }
    printf("%zu malformed requests refused with the expected status; server healthy after each\n", n);
}

/* Escaped NULs are valid JSON and answered; every answer is valid JSON. */
static void test_escaped_nul_is_answered(void **state) {
    const char *body = "{\"model\":\"m\\u0000x\",\"state\":\"a\\u0000b\",\"questions\":{\"q\\u0000\":"
                       "{\"type\":\"choice\",\"criteria\":{\"\\u0000\":\"nul\",\"b\":null}}}}";
    hu_response r;
    hu_post_json(NULL, &srv, body, strlen(body), NULL, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body.data, "{\"model\":\"m\\u0000x\",\"answers\":{\"q\\u0000\":{\"type\":\"choice\""));
    clef_err perr;
    json_value *v = json_parse(r.body.data, r.body.len, &perr);
    assert_non_null(v);
    json_free(v);
    hu_free(&r);
    check_healthy("escaped NULs");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_table),
        cmocka_unit_test(test_escaped_nul_is_answered),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
