/* test_encode.c — record encoding against the 49 reference goldens (SPEC §3,
 * §11 rules 1-2): token ids, question/option spans, option ids and types
 * exact; the reference's error messages verbatim (capacity with the
 * project's "maximum context length: " prefix); question_id_empty refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decision/encode.h"
#include "decision/request.h"
#include "testutil.h"

typedef tu_golden_fixture fixture;

static size_t case_max_length(const json_value *c) {
    int64_t m;
    assert_int_equal(json_as_i64(json_get(c, "max_length"), &m), 0);
    return (size_t)m;
}

/* Validate and encode one golden request (the reference's defaults:
 * clef_limits_default, truncate_state = 1). */
static int encode_case(const fixture *f, const json_value *c, clef_request *req, clef_record *rec, clef_err *err) {
    clef_limits lim = clef_limits_default();
    clef_err_clear(err);
    if (clef_request_from_json(json_clone(json_get(c, "request")), &lim, req, err)) return -1;
    int rc = clef_encode_record(f->tok, req, case_max_length(c), 1, rec, err);
    if (rc) clef_request_free(req);
    return rc;
}

static void assert_span(const char *name, const char *what, clef_span got, const json_value *want) {
    int64_t s = tu_int_at(want, 0), e = tu_int_at(want, 1);
    if (got.start != s || got.end != e)
        fail_msg("%s: %s [%d,%d), golden [%lld,%lld)", name, what, got.start, got.end, (long long)s, (long long)e);
}

static void check_success(const char *name, const json_value *c, const clef_request *req, const clef_record *rec) {
    const json_value *ids = json_get(c, "input_ids");
    if (rec->n_ids != ids->n) fail_msg("%s: %zu ids, golden %zu", name, rec->n_ids, ids->n);
    for (size_t i = 0; i < ids->n; i++)
        if (rec->input_ids[i] != tu_int_at(ids, i))
            fail_msg("%s: id %zu is %d, golden %lld", name, i, rec->input_ids[i], (long long)tu_int_at(ids, i));
    const json_value *qs = json_get(c, "questions");
    assert_int_equal(rec->n_questions, qs->n);
    for (size_t q = 0; q < qs->n; q++) {
        const json_value *gq = qs->items[q];
        const clef_record_question *rq = &rec->questions[q];
        const json_value *gid = json_get(gq, "id");
        assert_int_equal(req->questions[q].id_len, gid->len);
        assert_memory_equal(req->questions[q].id, gid->str, gid->len);
        int64_t type;
        assert_int_equal(json_as_i64(json_get(gq, "type"), &type), 0);
        assert_int_equal(rq->type, type);
        assert_span(name, "question span", rq->question, json_get(gq, "question_span"));
        const json_value *spans = json_get(gq, "option_spans"), *oids = json_get(gq, "option_ids");
        assert_int_equal(rq->n_options, spans->n);
        assert_int_equal(req->questions[q].n_options, oids->n);
        for (size_t j = 0; j < spans->n; j++) {
            assert_span(name, "option span", rq->options[j], spans->items[j]);
            const clef_option *o = &req->questions[q].options[j];
            if (o->id_len != oids->items[j]->len || memcmp(o->id, oids->items[j]->str, o->id_len) != 0)
                fail_msg("%s: option %zu id %.*s, golden %s", name, j, (int)o->id_len, o->id, oids->items[j]->str);
        }
    }
    assert_true(rec->state_tokens_kept <= rec->state_tokens);
}

/* Status the project gives each reference error (SPEC §2.2). */
static int expected_status(const char *name) {
    static const char *const bad_request[] = {"err_missing_model", "err_model_not_string", "err_missing_state",
                                              "err_questions_list"};
    for (size_t i = 0; i < 4; i++)
        if (strcmp(name, bad_request[i]) == 0) return 400;
    return 422;
}

static void check_error(const char *name, const json_value *c, int rc, const clef_err *err) {
    const char *golden = json_get(c, "error")->str;
    const char *prefix = "ValueError: ";
    assert_memory_equal(golden, prefix, strlen(prefix));
    golden += strlen(prefix);
    if (rc == 0) fail_msg("%s: accepted, golden error \"%s\"", name, golden);
    char want[CLEF_ERR_MESSAGE_MAX];
    if (strcmp(name, "schema_too_long") == 0) {
        snprintf(want, sizeof want, "maximum context length: %s", golden);
        assert_string_equal(err->type, CLEF_E_CAPACITY);
    } else {
        snprintf(want, sizeof want, "%s", golden);
        assert_string_equal(err->type, CLEF_E_REQUEST);
    }
    if (strcmp(err->message, want) != 0) fail_msg("%s: message \"%s\", want \"%s\"", name, err->message, want);
    if (err->status != expected_status(name)) fail_msg("%s: status %d", name, err->status);
}

static void test_goldens(void **state) {
    fixture *f = *state;
    size_t n_ok = 0, n_err = 0, n_empty = 0;
    for (size_t i = 0; i < f->n_cases; i++) {
        const json_value *c = f->cases[i];
        const char *name = tu_case_name(c);
        clef_request req;
        clef_record rec;
        clef_err err;
        int rc = encode_case(f, c, &req, &rec, &err);
        if (json_get(c, "error")) {
            check_error(name, c, rc, &err);
            n_err++;
        } else if (strcmp(name, "question_id_empty") == 0) {
            /* The reference emits NaN here; the project refuses (rule 12). */
            if (rc == 0) fail_msg("%s: accepted", name);
            assert_int_equal(err.status, 422);
            assert_string_equal(err.type, CLEF_E_REQUEST);
            assert_string_equal(err.message, "\"\": question instructions render to no tokens; give non-empty "
                                             "instructions or a non-empty question id");
            assert_string_equal(err.param, "questions"); /* the empty id has no dotted path */
            n_empty++;
        } else {
            if (rc != 0) fail_msg("%s: %s", name, err.message);
            check_success(name, c, &req, &rec);
            clef_record_free(&rec);
            clef_request_free(&req);
            n_ok++;
        }
    }
    printf("encode goldens: %zu exact, %zu reference errors, %zu empty-span refusals\n", n_ok, n_err, n_empty);
    assert_int_equal(n_ok, 38);
    assert_int_equal(n_err, 10);
    assert_int_equal(n_empty, 1);
}

static const json_value *find_case(const fixture *f, const char *name) {
    for (size_t i = 0; i < f->n_cases; i++)
        if (strcmp(tu_case_name(f->cases[i]), name) == 0) return f->cases[i];
    fail_msg("no golden %s", name);
    return NULL;
}

/* The seed request's fixed facts (SPEC §3.5) and the state cut. */
static void test_seed_and_cut(void **state) {
    fixture *f = *state;
    clef_request req;
    clef_record rec;
    clef_err err;
    assert_int_equal(encode_case(f, find_case(f, "triage_text"), &req, &rec, &err), 0);
    assert_int_equal(rec.n_ids, 295);
    assert_int_equal(rec.state_tokens, 10);
    assert_int_equal(rec.state_tokens_kept, 10);
    assert_int_equal(clef_record_total_options(&rec), 7);
    assert_int_equal(rec.input_ids[rec.n_ids - 1], 25);
    clef_record_free(&rec);
    clef_request_free(&req);

    /* truncate_state (max_length 300): the head of the state is kept. */
    const json_value *c = find_case(f, "truncate_state");
    assert_int_equal(encode_case(f, c, &req, &rec, &err), 0);
    assert_int_equal(rec.n_ids, 300);
    assert_true(rec.state_tokens > rec.state_tokens_kept);
    size_t fixed = 300 - rec.state_tokens_kept;
    clef_record_free(&rec);
    /* truncate_state = 0 refuses the same record (rule 11).  Tokenizing stops
     * at the first piece that takes the state past the room left (300 -
     * fixed), so the message gives a lower bound: here that piece was one
     * token, so "more than 300". */
    clef_record full;
    assert_int_equal(clef_encode_record(f->tok, &req, CLEF_DEFAULT_MAX_LENGTH, 0, &full, &err), 0);
    char want[256];
    clef_err_clear(&err);
    assert_int_equal(clef_encode_record(f->tok, &req, 300, 0, &rec, &err), -1);
    assert_int_equal(err.status, 422);
    assert_string_equal(err.type, CLEF_E_CAPACITY);
    assert_string_equal(err.message, "maximum context length: record requires more than 300 tokens; maximum is 300");
    assert_string_equal(err.param, "state");
    /* When only the last piece takes it over, the whole state was tokenized:
     * the message names the record's exact size. */
    snprintf(want, sizeof want, "maximum context length: record requires %zu tokens; maximum is %zu", full.n_ids,
             full.n_ids - 1);
    clef_err_clear(&err);
    assert_int_equal(clef_encode_record(f->tok, &req, full.n_ids - 1, 0, &rec, &err), -1);
    assert_string_equal(err.message, want);
    assert_string_equal(err.param, "state");
    /* A record that fits exactly is accepted without a cut. */
    assert_int_equal(clef_encode_record(f->tok, &req, full.n_ids, 0, &rec, &err), 0);
    assert_int_equal(rec.n_ids, full.n_ids);
    assert_int_equal(rec.state_tokens_kept, rec.state_tokens);
    assert_int_equal(fixed + rec.state_tokens, full.n_ids);
    clef_record_free(&rec);
    clef_record_free(&full);
    clef_request_free(&req);
}

/* Instructions fallback: missing / null / "" -> the id; 0, false, [], {} kept. */
static void test_instructions_fallback(void **state) {
    fixture *f = *state;
    const char *vals[] = {"0", "false", "[]", "{}", "\"\"", "null"};
    const char *rendered[] = {"0", "false", "[]", "{}", "qid", "qid"};
    for (size_t i = 0; i < 6; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"model\":\"m\",\"state\":\"x\",\"questions\":{\"qid\":{\"type\":\"noul\",\"instructions\":%s}}}",
                 vals[i]);
        clef_request req;
        clef_record rec;
        clef_err err;
        clef_limits lim = clef_limits_default();
        assert_int_equal(clef_request_parse(body, strlen(body), &lim, &req, &err), 0);
        assert_int_equal(clef_encode_record(f->tok, &req, CLEF_DEFAULT_MAX_LENGTH, 1, &rec, &err), 0);
        clef_ids want = {0};
        assert_int_equal(clef_tokenize(f->tok, rendered[i], strlen(rendered[i]), &want, &err), 0);
        clef_span s = rec.questions[0].question;
        assert_int_equal((size_t)(s.end - s.start), want.n);
        assert_memory_equal(rec.input_ids + s.start, want.v, want.n * sizeof *want.v);
        clef_ids_free(&want);
        clef_record_free(&rec);
        clef_request_free(&req);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens),
        cmocka_unit_test(test_seed_and_cut),
        cmocka_unit_test(test_instructions_fallback),
    };
    return cmocka_run_group_tests(tests, tu_golden_fixture_setup, tu_golden_fixture_teardown);
}
