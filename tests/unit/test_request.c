/* test_request.c — request validation (SPEC §2.1/§2.2), option order (§3.3),
 * error body and Python round(x, 4) (§8). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decision/answer.h"
#include "decision/request.h"
#include "testutil.h"
#include "util/buf.h"

typedef struct bad_case {
    const char *name;
    const char *body;
    int status;
    const char *type;
    const char *message; /* NULL: not checked (parser messages) */
    const char *param;   /* NULL: JSON null */
} bad_case;

#define REQ(qs) "{\"model\":\"m\",\"state\":\"x\",\"questions\":" qs "}"
#define REQX(qs, extra) "{\"model\":\"m\",\"state\":\"x\",\"questions\":" qs "," extra "}"
#define NOUL_Q "{\"q\":{\"type\":\"noul\"}}"

static const char *const TYPE_MSG = "q: type must be noul, choice, or score";
static const char *const EMPTY_MSG = "q: criteria must not be empty";

static const bad_case bad_cases[] = {
    {"not an object", "[1,2]", 400, CLEF_E_REQUEST, "request body must be a JSON object", NULL},
    {"string body", "\"x\"", 400, CLEF_E_REQUEST, "request body must be a JSON object", NULL},
    {"invalid json", "{\"model\":", 400, CLEF_E_JSON, NULL, NULL},
    {"lone surrogate", "{\"model\":\"\\ud800\"}", 400, CLEF_E_JSON, NULL, NULL},
    {"missing model", "{\"state\":\"x\",\"questions\":" NOUL_Q "}", 400, CLEF_E_REQUEST,
     "model and state are required", "model"},
    {"model number", "{\"model\":5,\"state\":\"x\",\"questions\":" NOUL_Q "}", 400, CLEF_E_REQUEST,
     "model and state are required", "model"},
    {"model null", "{\"model\":null,\"state\":\"x\",\"questions\":" NOUL_Q "}", 400, CLEF_E_REQUEST,
     "model and state are required", "model"},
    {"missing state", "{\"model\":\"m\",\"questions\":" NOUL_Q "}", 400, CLEF_E_REQUEST,
     "model and state are required", "state"},
    {"missing state beats missing questions", "{\"model\":\"m\"}", 400, CLEF_E_REQUEST,
     "model and state are required", "state"},
    {"questions missing", "{\"model\":\"m\",\"state\":\"x\"}", 400, CLEF_E_REQUEST,
     "at least one question is required", "questions"},
    {"questions array", REQ("[{\"type\":\"noul\"}]"), 400, CLEF_E_REQUEST, "at least one question is required",
     "questions"},
    {"questions null", REQ("null"), 400, CLEF_E_REQUEST, "at least one question is required", "questions"},
    {"questions empty", REQ("{}"), 422, CLEF_E_REQUEST, "at least one question is required", "questions"},
    {"question not an object", REQ("{\"q\":5}"), 400, CLEF_E_REQUEST, "q: question must be an object",
     "questions.q"},
    {"question array", REQ("{\"q\":[]}"), 400, CLEF_E_REQUEST, "q: question must be an object", "questions.q"},
    {"type number", REQ("{\"q\":{\"type\":1}}"), 400, CLEF_E_REQUEST, TYPE_MSG, "questions.q.type"},
    {"type missing", REQ("{\"q\":{}}"), 400, CLEF_E_REQUEST, TYPE_MSG, "questions.q.type"},
    {"type list (unhashable)", REQ("{\"q\":{\"type\":[\"noul\"]}}"), 400, CLEF_E_REQUEST, TYPE_MSG,
     "questions.q.type"},
    {"unknown type", REQ("{\"q\":{\"type\":\"yesno\"}}"), 422, CLEF_E_REQUEST, TYPE_MSG, "questions.q.type"},
    {"type wrong case", REQ("{\"q\":{\"type\":\"Noul\"}}"), 422, CLEF_E_REQUEST, TYPE_MSG, "questions.q.type"},
    {"choice criteria missing", REQ("{\"q\":{\"type\":\"choice\"}}"), 422, CLEF_E_REQUEST, EMPTY_MSG,
     "questions.q.criteria"},
    {"choice criteria null", REQ("{\"q\":{\"type\":\"choice\",\"criteria\":null}}"), 422, CLEF_E_REQUEST, EMPTY_MSG,
     "questions.q.criteria"},
    {"choice criteria {}", REQ("{\"q\":{\"type\":\"choice\",\"criteria\":{}}}"), 422, CLEF_E_REQUEST, EMPTY_MSG,
     "questions.q.criteria"},
    {"choice criteria []", REQ("{\"q\":{\"type\":\"choice\",\"criteria\":[]}}"), 422, CLEF_E_REQUEST, EMPTY_MSG,
     "questions.q.criteria"},
    {"choice criteria \"\"", REQ("{\"q\":{\"type\":\"choice\",\"criteria\":\"\"}}"), 422, CLEF_E_REQUEST,
     EMPTY_MSG, "questions.q.criteria"},
    {"choice criteria 0", REQ("{\"q\":{\"type\":\"choice\",\"criteria\":0}}"), 422, CLEF_E_REQUEST, EMPTY_MSG,
     "questions.q.criteria"},
    {"choice criteria 0.0", REQ("{\"q\":{\"type\":\"choice\",\"criteria\":0.0}}"), 422, CLEF_E_REQUEST, EMPTY_MSG,
     "questions.q.criteria"},
    {"choice criteria false", REQ("{\"q\":{\"type\":\"choice\",\"criteria\":false}}"), 422, CLEF_E_REQUEST,
     EMPTY_MSG, "questions.q.criteria"},
    {"score criteria []", REQ("{\"q\":{\"type\":\"score\",\"criteria\":[]}}"), 422, CLEF_E_REQUEST, EMPTY_MSG,
     "questions.q.criteria"},
    {"choice criteria array", REQ("{\"q\":{\"type\":\"choice\",\"criteria\":[\"a\",\"b\"]}}"), 400, CLEF_E_REQUEST,
     "q: choice criteria must be an object", "questions.q.criteria"},
    {"choice criteria string", REQ("{\"q\":{\"type\":\"choice\",\"criteria\":\"ab\"}}"), 400, CLEF_E_REQUEST,
     "q: choice criteria must be an object", "questions.q.criteria"},
    {"score criteria object", REQ("{\"q\":{\"type\":\"score\",\"criteria\":{\"a\":1,\"b\":2}}}"), 400,
     CLEF_E_REQUEST, "q: score criteria must be an array", "questions.q.criteria"},
    {"score criteria string", REQ("{\"q\":{\"type\":\"score\",\"criteria\":\"abc\"}}"), 400, CLEF_E_REQUEST,
     "q: score criteria must be an array", "questions.q.criteria"},
    {"score criteria number", REQ("{\"q\":{\"type\":\"score\",\"criteria\":3}}"), 400, CLEF_E_REQUEST,
     "q: score criteria must be an array", "questions.q.criteria"},
    {"noul criteria array", REQ("{\"q\":{\"type\":\"noul\",\"criteria\":[\"yes\"]}}"), 400, CLEF_E_REQUEST,
     "q: noul criteria must be an object", "questions.q.criteria"},
    {"noul criteria false", REQ("{\"q\":{\"type\":\"noul\",\"criteria\":false}}"), 400, CLEF_E_REQUEST,
     "q: noul criteria must be an object", "questions.q.criteria"},
    /* Rule 6 runs over every question before rule 7: the later bad type wins. */
    {"type error beats earlier container error",
     REQ("{\"a\":{\"type\":\"choice\",\"criteria\":[\"x\"]},\"q\":{\"type\":\"bad\"}}"), 422, CLEF_E_REQUEST,
     TYPE_MSG, "questions.q.type"},
    {"first bad question wins",
     REQ("{\"a.b c\":{\"type\":\"x\"},\"q\":{\"type\":\"choice\"}}"), 422, CLEF_E_REQUEST,
     "a.b c: type must be noul, choice, or score", "questions.a.b c.type"},
    {"unicode id raw", REQ("{\"gr\\u00f6\\u00dfe\":{\"type\":\"score\"}}"), 422, CLEF_E_REQUEST,
     "gr\xc3\xb6\xc3\x9f" "e: criteria must not be empty", "questions.gr\xc3\xb6\xc3\x9f" "e.criteria"},
    {"one score level", REQ("{\"q\":{\"type\":\"score\",\"criteria\":[\"only\"]}}"), 422, CLEF_E_REQUEST,
     "q: score criteria need at least 2 levels (got 1, below the minimum of 2 options per choice)",
     "questions.q.criteria"},
    /* the empty id: named "" in messages, param "questions" (no "questions..type") */
    {"empty id, unknown type", REQ("{\"\":{\"type\":\"x\"}}"), 422, CLEF_E_REQUEST,
     "\"\": type must be noul, choice, or score", "questions"},
    {"empty id, empty criteria", REQ("{\"\":{\"type\":\"choice\",\"criteria\":{}}}"), 422, CLEF_E_REQUEST,
     "\"\": criteria must not be empty", "questions"},
    {"empty id, array choice criteria", REQ("{\"\":{\"type\":\"choice\",\"criteria\":[1]}}"), 400,
     CLEF_E_REQUEST, "\"\": choice criteria must be an object", "questions"},
    {"empty id, not an object", REQ("{\"\":5}"), 400, CLEF_E_REQUEST, "\"\": question must be an object",
     "questions"},
    {"images not an array", REQX(NOUL_Q, "\"images\":\"x\""), 400, CLEF_E_REQUEST,
     "images must be an array of strings", "images"},
    {"images of numbers", REQX(NOUL_Q, "\"images\":[\"a\",1]"), 400, CLEF_E_REQUEST,
     "images must be an array of strings", "images[1]"},
    {"audio object", REQX(NOUL_Q, "\"audio\":{}"), 400, CLEF_E_REQUEST, "audio must be an array of strings",
     "audio"},
    /* Media items are decoded at the end of rule 9 (media/media.h). */
    {"images not a data URL", REQX(NOUL_Q, "\"images\":[\"x\"]"), 422, CLEF_E_REQUEST,
     "images[0]: image payload is invalid: not a data URL (expected data:<type>/<subtype>;base64,...)",
     "images[0]"},
    {"audio not a container", REQX(NOUL_Q, "\"audio\":[\"data:audio/wav;base64,AAAA\"]"), 422, CLEF_E_REQUEST,
     "audio[0]: audio payload is invalid: not a supported audio/video container", "audio[0]"},
    {"videos not a data URL", REQX(NOUL_Q, "\"images\":[],\"videos\":[\"v\"]"), 422, CLEF_E_REQUEST,
     "videos[0]: video payload is invalid: not a data URL (expected data:<type>/<subtype>;base64,...)",
     "videos[0]"},
    {"media_kwargs beats undecodable media", REQX(NOUL_Q, "\"images\":[\"x\"],\"media_kwargs\":{}"), 422,
     CLEF_E_REQUEST, "media_kwargs is not supported", "media_kwargs"},
    {"media type error beats unsupported media", REQX(NOUL_Q, "\"images\":[\"x\"],\"videos\":5"), 400,
     CLEF_E_REQUEST, "videos must be an array of strings", "videos"},
    {"media_kwargs", REQX(NOUL_Q, "\"media_kwargs\":{\"fps\":2}"), 422, CLEF_E_REQUEST,
     "media_kwargs is not supported", "media_kwargs"},
    {"truncate_state string", REQX(NOUL_Q, "\"truncate_state\":\"yes\""), 400, CLEF_E_REQUEST,
     "truncate_state must be a boolean", "truncate_state"},
    {"truncate_state number", REQX(NOUL_Q, "\"truncate_state\":1"), 400, CLEF_E_REQUEST,
     "truncate_state must be a boolean", "truncate_state"},
};

static void check_bad(const bad_case *c, const char *body, size_t len) {
    clef_limits lim = clef_limits_default();
    clef_request r;
    clef_err err;
    clef_err_clear(&err);
    int rc = clef_request_parse(body, len, &lim, &r, &err);
    if (rc != -1) fail_msg("%s: accepted", c->name);
    if (err.status != c->status) fail_msg("%s: status %d, want %d (%s)", c->name, err.status, c->status, err.message);
    if (strcmp(err.type, c->type) != 0) fail_msg("%s: type %s, want %s", c->name, err.type, c->type);
    if (c->message && strcmp(err.message, c->message) != 0)
        fail_msg("%s: message \"%s\", want \"%s\"", c->name, err.message, c->message);
    const char *want_param = c->param ? c->param : "";
    if (c->message && strcmp(err.param, want_param) != 0)
        fail_msg("%s: param \"%s\", want \"%s\"", c->name, err.param, want_param);
}

static void test_bad_requests(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++)
        check_bad(&bad_cases[i], bad_cases[i].body, strlen(bad_cases[i].body));
}

/* {"q":{"type":<type>,"criteria":<n generated options>}} bodies. */
static char *generated_body(const char *type, size_t n, size_t n_questions) {
    clef_buf b = {0};
    clef_buf_puts(&b, "{\"model\":\"m\",\"state\":\"x\",\"questions\":{");
    for (size_t q = 0; q < n_questions; q++) {
        clef_buf_printf(&b, q ? ",\"q%zu\":" : "\"q%zu\":", q);
        clef_buf_printf(&b, "{\"type\":\"%s\",\"criteria\":", type);
        int obj = strcmp(type, "choice") == 0;
        clef_buf_putc(&b, obj ? '{' : '[');
        for (size_t i = 0; i < n; i++) {
            if (i) clef_buf_putc(&b, ',');
            if (obj) clef_buf_printf(&b, "\"o%zu\":\"d\"", i);
            else clef_buf_printf(&b, "\"level %zu\"", i);
        }
        clef_buf_puts(&b, obj ? "}}" : "]}");
    }
    clef_buf_puts(&b, "}}");
    return b.data;
}

static int parses(const char *body) {
    clef_limits lim = clef_limits_default();
    clef_request r;
    clef_err err;
    int rc = clef_request_parse(body, strlen(body), &lim, &r, &err);
    if (rc == 0) clef_request_free(&r);
    return rc == 0;
}

static void test_limits(void **state) {
    (void)state;
    struct {
        const char *name, *type;
        size_t n, nq;
        const char *message, *param;
    } cases[] = {
        {"256 options", "choice", 256, 1, "q0: 256 options per choice exceed the limit of 255", "questions.q0.criteria"},
        {"256 score levels", "score", 256, 1, "q0: 256 score levels exceed the limit of 255 options per choice",
         "questions.q0.criteria"},
        {"65 questions", "score", 3, 65, "65 questions exceed the limit of 64 questions per context window",
         "questions"},
    };
    for (size_t i = 0; i < 3; i++) {
        char *body = generated_body(cases[i].type, cases[i].n, cases[i].nq);
        bad_case c = {cases[i].name, body, 422, CLEF_E_CAPACITY, cases[i].message, cases[i].param};
        check_bad(&c, body, strlen(body));
        free(body);
    }
    /* The limits themselves are accepted. */
    char *ok[] = {generated_body("choice", 255, 1), generated_body("score", 255, 1), generated_body("score", 2, 64),
                  generated_body("choice", 1, 1)};
    for (size_t i = 0; i < 4; i++) {
        assert_true(parses(ok[i]));
        free(ok[i]);
    }
    /* Configured limits are honoured. */
    clef_limits lim = {.max_questions = 2, .max_choice_options = 3, .min_score_levels = 3, .max_score_levels = 4};
    clef_request r;
    clef_err err;
    char *b = generated_body("score", 2, 1);
    assert_int_equal(clef_request_parse(b, strlen(b), &lim, &r, &err), -1);
    assert_string_equal(err.message,
                        "q0: score criteria need at least 3 levels (got 2, below the minimum of 3 options per choice)");
    free(b);
    b = generated_body("choice", 4, 1);
    assert_int_equal(clef_request_parse(b, strlen(b), &lim, &r, &err), -1);
    assert_string_equal(err.message, "q0: 4 options per choice exceed the limit of 3");
    free(b);
    b = generated_body("choice", 3, 3);
    assert_int_equal(clef_request_parse(b, strlen(b), &lim, &r, &err), -1);
    assert_string_equal(err.message, "3 questions exceed the limit of 2 questions per context window");
    free(b);
}

static clef_request parse_ok(const char *body) {
    clef_limits lim = clef_limits_default();
    clef_request r;
    clef_err err;
    clef_err_clear(&err);
    if (clef_request_parse(body, strlen(body), &lim, &r, &err) != 0) fail_msg("rejected: %s", err.message);
    return r;
}

static void assert_option(const clef_option *o, const char *id, const char *desc /* NULL = none */) {
    assert_int_equal(o->id_len, strlen(id));
    assert_memory_equal(o->id, id, o->id_len);
    if (!desc) {
        assert_null(o->description);
        return;
    }
    assert_non_null(o->description);
    clef_buf b = {0};
    json_render(o->description, &b);
    assert_string_equal(b.data, desc);
    clef_buf_free(&b);
}

static void test_accepted_shapes(void **state) {
    (void)state;
    /* state null, empty media arrays, extra fields, truncate_state. */
    clef_request r = parse_ok("{\"model\":\"clef\",\"state\":null,\"questions\":" NOUL_Q
                              ",\"images\":[],\"audio\":[],\"videos\":[],\"id\":\"x\",\"temperature\":0.5}");
    assert_int_equal(r.state->type, JSON_NULL);
    assert_int_equal(r.truncate_state, -1);
    assert_int_equal(r.model_len, 4);
    assert_memory_equal(r.model, "clef", 4);
    clef_request_free(&r);
    r = parse_ok(REQX(NOUL_Q, "\"truncate_state\":false"));
    assert_int_equal(r.truncate_state, 0);
    clef_request_free(&r);
    r = parse_ok(REQX(NOUL_Q, "\"truncate_state\":true,\"images\":null"));
    assert_int_equal(r.truncate_state, 1);
    clef_request_free(&r);
    /* noul criteria null / {} / unrelated keys are the defaults. */
    assert_true(parses(REQ("{\"q\":{\"type\":\"noul\",\"criteria\":null}}")));
    assert_true(parses(REQ("{\"q\":{\"type\":\"noul\",\"criteria\":{\"maybe\":1}}}")));
}

static void test_option_order(void **state) {
    (void)state;
    /* choice: UTF-8 byte order; request_order maps criteria order back (golden choice_sort_order). */
    clef_request r = parse_ok(REQ("{\"c\":{\"type\":\"choice\",\"criteria\":{\"b\":\"bee\",\"a\":\"ay\",\"B\":\"big "
                                  "bee\",\"10\":\"ten\",\"9\":\"nine\",\"\\u00e9\":\"e acute\",\"_\":\"underscore\","
                                  "\"a b\":\"space\",\"Z\":null}}}"));
    const char *sorted[] = {"10", "9", "B", "Z", "_", "a", "a b", "b", "\xc3\xa9"};
    const clef_question *q = &r.questions[0];
    assert_int_equal(q->type, CLEF_CHOICE);
    assert_int_equal(q->n_options, 9);
    for (size_t k = 0; k < 9; k++) {
        assert_int_equal(q->options[k].id_len, strlen(sorted[k]));
        assert_memory_equal(q->options[k].id, sorted[k], strlen(sorted[k]));
    }
    assert_null(q->options[3].description); /* "Z": null */
    const size_t want_order[] = {7, 5, 2, 0, 1, 8, 4, 6, 3}; /* b a B 10 9 é _ "a b" Z */
    for (size_t k = 0; k < 9; k++) assert_int_equal(q->request_order[k], want_order[k]);
    clef_request_free(&r);

    /* Duplicate keys: last value, first position. */
    r = parse_ok(REQ("{\"c\":{\"type\":\"choice\",\"criteria\":{\"b\":1,\"a\":2,\"b\":3}}}"));
    q = &r.questions[0];
    assert_int_equal(q->n_options, 2);
    assert_option(&q->options[0], "a", "2");
    assert_option(&q->options[1], "b", "3");
    assert_int_equal(q->request_order[0], 1);
    assert_int_equal(q->request_order[1], 0);
    clef_request_free(&r);

    /* noul: defaults, overlay, explicit null removes, other keys ignored. */
    r = parse_ok(REQ("{\"n\":{\"type\":\"noul\"},\"o\":{\"type\":\"noul\",\"criteria\":{\"true\":null,"
                     "\"false\":{\"k\":[1]},\"other\":\"x\"}}}"));
    assert_option(&r.questions[0].options[0], "true", "\"The proposition is true or the answer is yes.\"");
    assert_option(&r.questions[0].options[1], "false", "\"The proposition is false or the answer is no.\"");
    assert_option(&r.questions[1].options[0], "true", NULL);
    assert_option(&r.questions[1].options[1], "false", "{\"k\":[1]}");
    assert_int_equal(r.questions[1].request_order[1], 1);
    clef_request_free(&r);

    /* score: "0".."n-1", description = criteria[i], null = none. */
    r = parse_ok(REQ("{\"s\":{\"type\":\"score\",\"criteria\":[{\"min\":0},null,3,\"three\",[4],"
                     "1,2,3,4,5,6,7]}}"));
    q = &r.questions[0];
    assert_int_equal(q->type, CLEF_SCORE);
    assert_int_equal(q->n_options, 12);
    assert_option(&q->options[0], "0", "{\"min\":0}");
    assert_option(&q->options[1], "1", NULL);
    assert_option(&q->options[3], "3", "\"three\"");
    assert_option(&q->options[11], "11", "7");
    for (size_t k = 0; k < 12; k++) assert_int_equal(q->request_order[k], k);
    clef_request_free(&r);
}

static void test_error_body(void **state) {
    (void)state;
    clef_err err;
    clef_fail(&err, 422, CLEF_E_REQUEST, "questions.q\"x.type", "q\"x: type must be %s", "noul, choice, or score");
    clef_buf b = {0};
    clef_render_error(&err, &b);
    assert_string_equal(b.data, "{\"error\":{\"message\":\"q\\\"x: type must be noul, choice, or score\","
                                "\"type\":\"invalid_request\",\"param\":\"questions.q\\\"x.type\"}}");
    b.len = 0;
    clef_fail(&err, 400, CLEF_E_REQUEST, NULL, "request body must be a JSON object");
    clef_render_error(&err, &b);
    assert_string_equal(b.data,
                        "{\"error\":{\"message\":\"request body must be a JSON object\",\"type\":\"invalid_request\","
                        "\"param\":null}}");
    clef_buf_free(&b);
}

/* Expectations printed by Python 3.11: repr(round(x, 4)). */
static void test_round4(void **state) {
    (void)state;
    struct {
        double x;
        const char *want;
    } cases[] = {
        {0.4477357864379883, "0.4477"},   /* seed request outage */
        {0.44765, "0.4476"},              /* the double is just below the tie */
        {0.4476499855518341, "0.4476"},   /* f32(0.44765) */
        {0.44775, "0.4477"},              /* double below the tie */
        {0.4477500021457672, "0.4478"},   /* f32(0.44775) is above it */
        {1.0569, "1.0569"},
        {1.05694, "1.0569"},
        {1.05695, "1.057"},
        {0.99995, "1.0"},                 /* double above the tie: carries */
        {0.9999499917030334, "0.9999"},   /* f32(0.99995) */
        {0.99994999, "0.9999"},
        {5e-05, "0.0001"},                /* double 5e-05 lies above 0.00005 */
        {4.999999873689376e-05, "0.0"},   /* f32(5e-05) lies below */
        {4.999e-05, "0.0"},
        {0.03125, "0.0312"},              /* exact tie: to even */
        {0.09375, "0.0938"},              /* exact tie: to even */
        {-1e-05, "-0.0"},
        {-0.4477357864379883, "-0.4477"},
        {2.37369481, "2.3737"},
        {254.99995, "255.0"},
        {1e-300, "0.0"},
        {5e16, "5e+16"},
        {0.5172566175460815, "0.5173"},
        {0.1436113715171814, "0.1436"},
        {0.0, "0.0"},
        {-0.0, "-0.0"},
    };
    clef_buf b = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        b.len = 0;
        json_render_float(clef_round4(cases[i].x), &b);
        if (strcmp(b.data, cases[i].want) != 0)
            fail_msg("round(%.17g, 4): got %s, want %s", cases[i].x, b.data, cases[i].want);
    }
    clef_buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_requests), cmocka_unit_test(test_limits),    cmocka_unit_test(test_accepted_shapes),
        cmocka_unit_test(test_option_order), cmocka_unit_test(test_error_body), cmocka_unit_test(test_round4),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
