/* test_json.c — Python-compatible JSON parse / render (SPEC.md §4).
 *
 * Expected values come from CPython 3 json.loads / json.dumps(ensure_ascii=
 * False, separators=(",", ":"), sort_keys=True) and from the golden
 * `state_numbers` case. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- helpers ---------------------------------------------------------- */

static json_value *parse_ok(const char *text, size_t len) {
    clef_err err;
    clef_err_clear(&err);
    json_value *v = json_parse(text, len, &err);
    if (!v) fail_msg("rejected %.*s: %s", (int)(len > 80 ? 80 : len), text, err.message);
    return v;
}

static json_value *parse_str(const char *text) { return parse_ok(text, strlen(text)); }

/* Parse `in` and render it sorted; compare with `want`. */
static void check_roundtrip(const char *in, const char *want) {
    json_value *v = parse_str(in);
    clef_buf b = {0};
    json_render(v, &b);
    if (strcmp(b.data, want) != 0) fail_msg("render(%s) = %s, want %s", in, b.data, want);
    clef_buf_free(&b);
    json_free(v);
}

static void check_float(double x, const char *want) {
    clef_buf b = {0};
    json_render_float(x, &b);
    if (strcmp(b.data, want) != 0) fail_msg("repr(%.17g) = %s, want %s", x, b.data, want);
    clef_buf_free(&b);
}

/* Parse must fail with the invalid_json error shape; returns the byte offset
 * named in the message. */
static long parse_bad(const char *text, size_t len) {
    clef_err err;
    clef_err_clear(&err);
    json_value *v = json_parse(text, len, &err);
    if (v) {
        json_free(v);
        fail_msg("accepted invalid input %.*s", (int)(len > 60 ? 60 : len), text);
    }
    assert_int_equal(err.status, 400);
    assert_string_equal(err.type, CLEF_E_JSON);
    assert_string_equal(err.param, "");
    long at = -1;
    if (sscanf(err.message, "invalid JSON at byte %ld:", &at) != 1) fail_msg("bad message: %s", err.message);
    return at;
}

/* ---- numbers ---------------------------------------------------------- */

static void test_numbers_golden(void **state) {
    (void)state;
    /* The golden request's `state` is exactly SPEC §4.2's example. */
    const char *want =
        "{\"a\":1.0,\"b\":1e-05,\"c\":1e+16,\"d\":0.1,\"e\":-0.0,\"f\":3.14159,\"g\":12345678901234567890,"
        "\"h\":2.5e-08,\"i\":100.0,\"j\":123456789.0,\"k\":1e+22,\"l\":-7,\"m\":0.000123}";
    char *path = tu_fixture("goldens/goldens.jsonl");
    size_t n;
    json_value **cases = tu_read_jsonl(path, &n);
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        const json_value *name = json_get(cases[i], "name");
        if (!name || strcmp(name->str, "state_numbers") != 0) continue;
        const json_value *st = json_get(json_get(cases[i], "request"), "state");
        assert_non_null(st);
        clef_buf b = {0};
        json_render(st, &b);
        assert_string_equal(b.data, want);
        clef_buf_free(&b);
        found = 1;
    }
    assert_true(found);
    for (size_t i = 0; i < n; i++) json_free(cases[i]);
    free(cases);
    free(path);
    check_roundtrip(want, want);
}

static void test_numbers_edges(void **state) {
    (void)state;
    check_roundtrip("[5e-324,1e400,-1e400,-1e-400,1e-400,NaN,Infinity,-Infinity,1E2,1e2,-0,-0.0,0,0.0]",
                    "[5e-324,Infinity,-Infinity,-0.0,0.0,NaN,Infinity,-Infinity,100.0,100.0,0,-0.0,0,0.0]");
    check_roundtrip("[1e16,1e15,9999999999999998.0,0.0001,0.00001,1.5e300,123.456,1E+2,2.5E-3]",
                    "[1e+16,1000000000000000.0,9999999999999998.0,0.0001,1e-05,1.5e+300,123.456,100.0,0.0025]");
    check_roundtrip("[0.1,0.2,0.30000000000000004,1.7976931348623157e308,2.2250738585072014e-308]",
                    "[0.1,0.2,0.30000000000000004,1.7976931348623157e+308,2.2250738585072014e-308]");
    check_float(0.1 + 0.2, "0.30000000000000004");
    check_float(1.0 / 3.0, "0.3333333333333333");
    check_float(-2.0, "-2.0");
    check_float(ldexp(1.0, 60), "1.152921504606847e+18");
    check_float(ldexp(1.0, -1074), "5e-324");
    check_float(123456789012345680.0, "1.2345678901234568e+17");
    /* power of two whose correctly rounded 16-digit string does not round-trip
     * but its neighbour does (lopsided rounding interval); CPython repr */
    check_float(ldexp(1.0, 122), "5.316911983139664e+36");

    /* exact integers, any size */
    json_value *v = parse_str("[12345678901234567890123, -9223372036854775808, 9223372036854775807, "
                              "9223372036854775808, -0, 3.0, 2.5, \"7\"]");
    assert_int_equal(v->items[0]->type, JSON_INT);
    assert_string_equal(v->items[0]->str, "12345678901234567890123");
    int64_t x;
    assert_int_equal(json_as_i64(v->items[0], &x), -1);
    assert_int_equal(json_as_i64(v->items[1], &x), 0);
    assert_true(x == INT64_MIN);
    assert_int_equal(json_as_i64(v->items[2], &x), 0);
    assert_true(x == INT64_MAX);
    assert_int_equal(json_as_i64(v->items[3], &x), -1);
    assert_int_equal(json_as_i64(v->items[4], &x), 0);
    assert_int_equal(x, 0);
    assert_string_equal(v->items[4]->str, "0");
    assert_int_equal(json_as_i64(v->items[5], &x), 0);
    assert_int_equal(x, 3);
    assert_int_equal(json_as_i64(v->items[6], &x), -1);
    assert_int_equal(json_as_i64(v->items[7], &x), -1);
    double d;
    assert_int_equal(json_as_double(v->items[0], &d), 0);
    assert_true(d == 12345678901234567890123.0);
    assert_int_equal(json_as_double(v->items[6], &d), 0);
    assert_true(d == 2.5);
    assert_int_equal(json_as_double(v->items[7], &d), -1);
    json_free(v);

    /* 4300 digits is Python's limit: accepted; 4301 rejected */
    char big[4310];
    big[0] = '-';
    memset(big + 1, '7', 4300);
    v = parse_ok(big, 4301);
    assert_int_equal(v->len, 4301);
    json_free(v);
    memset(big, '7', 4301);
    assert_int_equal(parse_bad(big, 4301), 0);
}

/* ---- strings ---------------------------------------------------------- */

static void test_string_escapes(void **state) {
    (void)state;
    /* controls: short escapes, else lowercase \u00XX; DEL, U+2028, '/' raw */
    check_roundtrip("\"a\\u0000b\\u001F\\u0001\\n\\r\\t\\b\\f\\\"\\\\\\/\x7f\\u2028\\u00e9\\ud83d\\ude00\"",
                    "\"a\\u0000b\\u001f\\u0001\\n\\r\\t\\b\\f\\\"\\\\/\x7f\xe2\x80\xa8\xc3\xa9\xf0\x9f\x98\x80\"");
    json_value *v = parse_str("\"x\\u0000y\"");
    assert_int_equal(v->type, JSON_STRING);
    assert_int_equal(v->len, 3);
    assert_memory_equal(v->str, "x\0y", 4);
    json_free(v);
    /* raw multi-byte UTF-8 up to U+10FFFF passes through */
    check_roundtrip("[\"\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf\xf0\x90\x80\x80\xf4\x8f\xbf\xbf\"]",
                    "[\"\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf\xf0\x90\x80\x80\xf4\x8f\xbf\xbf\"]");
    clef_buf b = {0};
    json_render_string("q\"\x1f", 3, &b);
    assert_string_equal(b.data, "\"q\\\"\\u001f\"");
    clef_buf_free(&b);
}

/* ---- objects ---------------------------------------------------------- */

static void test_key_order(void **state) {
    (void)state;
    /* code point order: U+1F600 (4-byte UTF-8) sorts after U+FFFF; prefix first */
    check_roundtrip("{\"\\ud83d\\ude00\":1,\"\\uffff\":2,\"b\":3,\"a\":{\"z\":1,\"y\":[{\"d\":1,\"c\":2}]},"
                    "\"ab\":4,\"\":5,\"B\":6,\"\\u00e9\":7}",
                    "{\"\":5,\"B\":6,\"a\":{\"y\":[{\"c\":2,\"d\":1}],\"z\":1},\"ab\":4,\"b\":3,"
                    "\"\xc3\xa9\":7,\"\xef\xbf\xbf\":2,\"\xf0\x9f\x98\x80\":1}");
    /* unsorted rendering keeps first-occurrence order */
    json_value *v = parse_str("{\"b\":1,\"a\":[true,false,null],\"c\":{}}");
    clef_buf b = {0};
    json_render_opts(v, 0, &b);
    assert_string_equal(b.data, "{\"b\":1,\"a\":[true,false,null],\"c\":{}}");
    clef_buf_free(&b);
    json_free(v);
}

static void test_duplicates(void **state) {
    (void)state;
    json_value *v = parse_str("{\"q2\":1,\"q1\":2,\"q2\":3,\"q3\":4,\"q1\":{\"x\":5}}");
    assert_int_equal(v->n, 3);
    assert_string_equal(v->keys[0], "q2");
    assert_string_equal(v->keys[1], "q1");
    assert_string_equal(v->keys[2], "q3");
    assert_string_equal(json_get(v, "q2")->str, "3");
    assert_int_equal(json_get(v, "q1")->type, JSON_OBJECT);
    assert_null(json_get(v, "q4"));
    json_free(v);

    /* many keys (hash-set path) with duplicates at the start and end */
    clef_buf in = {0};
    clef_buf_puts(&in, "{");
    for (int i = 0; i < 1000; i++) clef_buf_printf(&in, "\"k%d\":%d,", i, i);
    clef_buf_puts(&in, "\"k0\":-1,\"k999\":-2,\"k500\":-3}");
    v = parse_ok(in.data, in.len);
    assert_int_equal(v->n, 1000);
    assert_string_equal(v->keys[0], "k0");
    assert_string_equal(v->keys[999], "k999");
    assert_string_equal(json_get(v, "k0")->str, "-1");
    assert_string_equal(json_get(v, "k999")->str, "-2");
    assert_string_equal(json_get(v, "k500")->str, "-3");
    assert_string_equal(json_get(v, "k501")->str, "501");
    json_free(v);
    clef_buf_free(&in);
}

/* ---- rejection -------------------------------------------------------- */

typedef struct bad_case {
    const char *text;
    long at; /* expected byte offset, -1 = not checked */
} bad_case;

static void test_rejections(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {"+1", 0},
        {".5", 0},
        {"1.", 1},
        {"01", 0},
        {"-01", 1},
        {"[1,]", 3},
        {"{\"a\":1,}", 7},
        {"// c\n1", 0},
        {"/* c */ 1", 0},
        {"[1] // c", 4},
        {"'a'", 0},
        {"\"a\x01" "b\"", 2},
        {"\"\x1f\"", 1},
        {"\xef\xbb\xbf{}", 0},
        {"\"\\ud800\"", 1},
        {"\"\\udc00\"", 1},
        {"\"ab\\ud800\\u0041\"", 3},
        {"\"\\ud83d\"", 1},
        {"\"\xff\"", 1},
        {"\"\xc0\xaf\"", 1},         /* overlong '/' */
        {"\"\xe0\x80\xaf\"", 1},     /* overlong, 3 bytes */
        {"\"\xed\xa0\x80\"", 1},     /* surrogate encoded in UTF-8 */
        {"\"\xf4\x90\x80\x80\"", 1}, /* above U+10FFFF */
        {"\"\xe2\x82\"", 1},         /* truncated */
        {"\"\x80\"", 1},             /* stray continuation */
        {"", 0},
        {"   ", 3},
        {"1 2", 2},
        {"{} x", 3},
        {"nan", 0},
        {"-NaN", 0},
        {"infinity", 0},
        {"[1 2]", 3},
        {"{\"a\" 1}", 5},
        {"{1:2}", 1},
        {"tru", 0},
        {"\"\\x41\"", 1},
        {"\"\\u12\"", 1},
        {"1e", 1},
        {"1e+", 1},
        {"-", 0},
        {"\"abc", 0},
        {"[", 1},
        {"\t\x0b" "1", 1},
        {"0x10", 1},
        {"[-]", 1},
        {"\"\\U0041\"", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        long at = parse_bad(cases[i].text, strlen(cases[i].text));
        if (cases[i].at >= 0 && at != cases[i].at)
            fail_msg("case %zu (%s): error at byte %ld, want %ld", i, cases[i].text, at, cases[i].at);
    }
    /* the length is honoured: a NUL byte inside the input is not the end */
    parse_bad("1\0", 2);
}

static void test_depth(void **state) {
    (void)state;
    enum { DEEP = 10000 };
    char *s = malloc(2 * DEEP + 1);
    memset(s, '[', DEEP);
    memset(s + DEEP, ']', DEEP);
    assert_int_equal(parse_bad(s, 2 * DEEP), JSON_MAX_DEPTH);
    /* exactly JSON_MAX_DEPTH levels is fine */
    json_value *v = parse_ok(s + DEEP - JSON_MAX_DEPTH, 2 * JSON_MAX_DEPTH);
    json_free(v);
    /* objects count too */
    clef_buf b = {0};
    for (int i = 0; i < DEEP; i++) clef_buf_puts(&b, "{\"a\":");
    assert_int_equal(parse_bad(b.data, b.len), 5L * JSON_MAX_DEPTH);
    clef_buf_free(&b);
    free(s);
}

/* ---- accessors and constructors --------------------------------------- */

static void test_truthy_and_build(void **state) {
    (void)state;
    json_value *v = parse_str("[null,false,true,0,1,0.0,-0.0,NaN,\"\",\"0\",[],[0],{},{\"\":0}]");
    static const int want[] = {0, 0, 1, 0, 1, 0, 0, 1, 0, 1, 0, 1, 0, 1};
    assert_int_equal(v->n, 14);
    for (size_t i = 0; i < v->n; i++) assert_int_equal(json_truthy(v->items[i]), want[i]);
    json_free(v);

    json_value *o = json_new(JSON_OBJECT);
    json_object_set(o, "model", 5, json_new_string("clef", 4));
    json_value *arr = json_new(JSON_ARRAY);
    for (int i = 0; i < 9; i++) json_array_push(arr, json_new_int(i - 4));
    json_object_set(o, "ids", 3, arr);
    json_object_set(o, "p", 1, json_new_float(0.5));
    json_object_set(o, "model", 5, json_new_float(1e-7)); /* replaces in place */
    json_value *c = json_clone(o);
    json_array_push(arr, json_new(JSON_NULL));
    clef_buf b = {0};
    json_render_opts(o, 0, &b);
    assert_string_equal(b.data, "{\"model\":1e-07,\"ids\":[-4,-3,-2,-1,0,1,2,3,4,null],\"p\":0.5}");
    b.len = 0;
    json_render(c, &b);
    assert_string_equal(b.data, "{\"ids\":[-4,-3,-2,-1,0,1,2,3,4],\"model\":1e-07,\"p\":0.5}");
    clef_buf_free(&b);
    json_free(o);
    json_free(c);
}

/* ---- tokenizer.json: size and speed ----------------------------------- */

static void test_tokenizer_file(void **state) {
    (void)state;
    char *path = tu_fixture("tiny-clef-omni/tokenizer.json");
    size_t len;
    char *text = tu_read_file(path, &len);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    json_value *v = parse_ok(text, len);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    const json_value *model = json_get(v, "model");
    const json_value *vocab = json_get(model, "vocab");
    const json_value *merges = json_get(model, "merges");
    assert_non_null(vocab);
    assert_non_null(merges);
    printf("tokenizer.json: %zu bytes parsed in %.3f s; vocab %zu, merges %zu\n", len, s, vocab->n, merges->n);
    assert_int_equal(vocab->n, 151643);
    assert_int_equal(merges->n, 151387);
    assert_string_equal(json_get(model, "type")->str, "BPE");
    int64_t id;
    assert_int_equal(json_as_i64(json_get(vocab, "!"), &id), 0);
    assert_int_equal(id, 0);
    json_free(v);
    free(text);
    free(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numbers_golden), cmocka_unit_test(test_numbers_edges),
        cmocka_unit_test(test_string_escapes), cmocka_unit_test(test_key_order),
        cmocka_unit_test(test_duplicates),     cmocka_unit_test(test_rejections),
        cmocka_unit_test(test_depth),          cmocka_unit_test(test_truthy_and_build),
        cmocka_unit_test(test_tokenizer_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
