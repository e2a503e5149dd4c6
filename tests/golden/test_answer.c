/* test_answer.c — probabilities and the response JSON against the reference
 * goldens (SPEC §8, §11 rules 4-5).  The head's logits are taken from the
 * goldens, so these tests isolate softmax, rounding and rendering. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decision/answer.h"
#include "decision/encode.h"
#include "decision/request.h"
#include "testutil.h"

typedef tu_golden_fixture fixture;

/* One golden case decoded: request, record and the golden logits as f32 in
 * the head's layout (questions in request order, options in encoding order). */
typedef struct decoded {
    const char *name;
    clef_request req;
    clef_record rec;
    float *logits;
    double *golden_probs;
    size_t n;
} decoded;

static void decode_case(const fixture *f, const json_value *c, decoded *d) {
    d->name = tu_case_name(c);
    clef_limits lim = clef_limits_default();
    clef_err err;
    clef_err_clear(&err);
    int64_t max_length;
    assert_int_equal(json_as_i64(json_get(c, "max_length"), &max_length), 0);
    if (clef_request_from_json(json_clone(json_get(c, "request")), &lim, &d->req, &err))
        fail_msg("%s: %s", d->name, err.message);
    if (clef_encode_record(f->tok, &d->req, (size_t)max_length, 1, &d->rec, &err))
        fail_msg("%s: %s", d->name, err.message);
    d->n = clef_record_total_options(&d->rec);
    d->logits = calloc(d->n, sizeof *d->logits);
    d->golden_probs = calloc(d->n, sizeof *d->golden_probs);
    const json_value *qs = json_get(c, "questions");
    size_t k = 0;
    for (size_t q = 0; q < qs->n; q++) {
        const json_value *l = json_get(qs->items[q], "logits"), *p = json_get(qs->items[q], "probs");
        assert_int_equal(l->n, d->rec.questions[q].n_options);
        for (size_t j = 0; j < l->n; j++, k++) {
            d->logits[k] = (float)tu_num_at(l, j);
            d->golden_probs[k] = tu_num_at(p, j);
        }
    }
    assert_int_equal(k, d->n);
}

static void decoded_free(decoded *d) {
    free(d->logits);
    free(d->golden_probs);
    clef_record_free(&d->rec);
    clef_request_free(&d->req);
}

static int answerable(const json_value *c) {
    return !json_get(c, "error") && strcmp(tu_case_name(c), "question_id_empty") != 0;
}

/* ---- field-by-field comparison (SPEC §11 rule 5) ------------------------ */

typedef struct compare_stats {
    size_t numbers, boundary_deviations;
} compare_stats;

/* Within 1e-5 of a 4-decimal rounding boundary (k + 0.5)·1e-4. */
static int near_boundary(double x) {
    double scaled = x * 1e4;
    return fabs(scaled - floor(scaled) - 0.5) * 1e-4 <= 1e-5;
}

static void compare_number(const char *where, const json_value *got, const json_value *want, double unrounded,
                           compare_stats *st) {
    double g, w;
    if (json_as_double(got, &g) || json_as_double(want, &w)) fail_msg("%s: not a number", where);
    st->numbers++;
    if (g == w) return;
    if (fabs(g - w) <= 1.0001e-4 && near_boundary(unrounded)) {
        st->boundary_deviations++;
        return;
    }
    fail_msg("%s: %.17g, golden %.17g (unrounded %.17g)", where, g, w, unrounded);
}

/* Exact equality of two values, key order included (rendered unsorted). */
static void compare_exact(const char *where, const json_value *got, const json_value *want) {
    clef_buf a = {0}, b = {0};
    json_render_opts(got, 0, &a);
    json_render_opts(want, 0, &b);
    if (strcmp(a.data, b.data) != 0) fail_msg("%s: %s, golden %s", where, a.data, b.data);
    clef_buf_free(&a);
    clef_buf_free(&b);
}

static void compare_keys(const char *where, const json_value *got, const json_value *want) {
    assert_int_equal(got->type, JSON_OBJECT);
    assert_int_equal(want->type, JSON_OBJECT);
    if (got->n != want->n) fail_msg("%s: %zu keys, golden %zu", where, got->n, want->n);
    for (size_t i = 0; i < got->n; i++)
        if (got->key_lens[i] != want->key_lens[i] || memcmp(got->keys[i], want->keys[i], got->key_lens[i]) != 0)
            fail_msg("%s: key %zu is \"%s\", golden \"%s\"", where, i, got->keys[i], want->keys[i]);
}

static void compare_answer(const decoded *d, size_t q, const float *probs, const json_value *got,
                           const json_value *want, compare_stats *st) {
    const clef_question *qq = &d->req.questions[q];
    char where[512];
    snprintf(where, sizeof where, "%s.%s", d->name, qq->id);
    compare_keys(where, got, want);
    compare_exact(where, json_get(got, "type"), json_get(want, "type"));
    if (qq->type == CLEF_NOUL) {
        compare_number(where, json_get(got, "noul"), json_get(want, "noul"), probs[0], st);
        return;
    }
    const json_value *gp = json_get(got, "probabilities"), *wp = json_get(want, "probabilities");
    compare_keys(where, gp, wp);
    double pmax = 0, score = 0;
    for (size_t k = 0; k < qq->n_options; k++) {
        size_t j = qq->request_order[k];
        compare_number(where, gp->items[k], wp->items[k], probs[j], st);
        if (probs[j] > pmax) pmax = probs[j];
        score += (double)k * probs[k];
    }
    compare_number(where, json_get(got, "confidence"), json_get(want, "confidence"), pmax, st);
    if (qq->type == CLEF_CHOICE) {
        compare_exact(where, json_get(got, "choice"), json_get(want, "choice"));
    } else {
        compare_number(where, json_get(got, "score"), json_get(want, "score"), score, st);
        compare_keys(where, json_get(got, "legend"), json_get(want, "legend"));
        compare_exact(where, json_get(got, "legend"), json_get(want, "legend"));
    }
}

static void test_responses(void **state) {
    fixture *f = *state;
    compare_stats st = {0};
    size_t n_cases = 0, n_byte_exact = 0;
    for (size_t i = 0; i < f->n_cases; i++) {
        const json_value *c = f->cases[i];
        if (!answerable(c)) continue;
        decoded d;
        decode_case(f, c, &d);
        clef_buf out = {0};
        clef_render_response(&d.req, &d.rec, d.logits, 0, &out);
        clef_err err;
        json_value *got = json_parse(out.data, out.len, &err);
        if (!got) fail_msg("%s: response is not JSON: %s", d.name, err.message);
        const json_value *want = json_get(c, "response");
        /* Envelope: key order model, answers, usage (the golden line's text order). */
        compare_keys(d.name, got, want);
        compare_exact(d.name, json_get(got, "model"), json_get(want, "model"));
        compare_exact(d.name, json_get(got, "usage"), json_get(want, "usage"));
        const json_value *ga = json_get(got, "answers"), *wa = json_get(want, "answers");
        compare_keys(d.name, ga, wa);
        float *probs = calloc(d.n, sizeof *probs);
        clef_softmax_per_question(&d.rec, d.logits, probs);
        size_t off = 0;
        for (size_t q = 0; q < d.req.n_questions; q++) {
            compare_answer(&d, q, probs + off, ga->items[q], wa->items[q], &st);
            off += d.req.questions[q].n_options;
        }
        /* Byte for byte: Python's json.dumps(response, ensure_ascii=False,
         * separators=(",", ":")) of the golden object. */
        clef_buf py = {0};
        json_render_opts(want, 0, &py);
        if (strcmp(py.data, out.data) == 0) n_byte_exact++;
        else printf("%s: not byte-identical:\n  ours   %s\n  golden %s\n", d.name, out.data, py.data);
        clef_buf_free(&py);
        free(probs);
        json_free(got);
        clef_buf_free(&out);
        decoded_free(&d);
        n_cases++;
    }
    printf("responses: %zu cases, %zu numbers compared, %zu boundary deviations (rule 5), %zu byte-identical\n",
           n_cases, st.numbers, st.boundary_deviations, n_byte_exact);
    assert_int_equal(n_cases, 38);
    assert_true(st.numbers > 200);
    /* The softmax is bit-exact on the golden logits, so nothing may deviate. */
    assert_int_equal(st.boundary_deviations, 0);
    assert_int_equal(n_byte_exact, n_cases);
}

/* Our f32 softmax reproduces the reference's probabilities (rule 4: 1e-5;
 * in fact bit for bit). */
static void test_probabilities(void **state) {
    fixture *f = *state;
    size_t n = 0, n_exact = 0;
    double max_diff = 0;
    for (size_t i = 0; i < f->n_cases; i++) {
        if (!answerable(f->cases[i])) continue;
        decoded d;
        decode_case(f, f->cases[i], &d);
        float *probs = calloc(d.n, sizeof *probs);
        clef_softmax_per_question(&d.rec, d.logits, probs);
        for (size_t k = 0; k < d.n; k++, n++) {
            double diff = fabs((double)probs[k] - d.golden_probs[k]);
            if (diff > max_diff) max_diff = diff;
            if (diff == 0) n_exact++;
            if (diff > 1e-5) fail_msg("%s: prob %zu %.9g, golden %.9g", d.name, k, probs[k], d.golden_probs[k]);
        }
        free(probs);
        decoded_free(&d);
    }
    printf("probabilities: %zu compared, %zu bit-identical, max |diff| %.3g\n", n, n_exact, max_diff);
    assert_int_equal(n, 212);
    assert_int_equal(n_exact, n);
}

/* The debug block echoes ids, spans, encoding-order option ids and the raw logits. */
static void test_debug_block(void **state) {
    fixture *f = *state;
    const json_value *c = NULL;
    for (size_t i = 0; i < f->n_cases; i++)
        if (strcmp(json_get(f->cases[i], "name")->str, "choice_sort_order") == 0) c = f->cases[i];
    assert_non_null(c);
    decoded d;
    decode_case(f, c, &d);
    clef_buf out = {0};
    clef_render_response(&d.req, &d.rec, d.logits, 1, &out);
    clef_err err;
    json_value *got = json_parse(out.data, out.len, &err);
    assert_non_null(got);
    assert_int_equal(got->n, 4);
    assert_string_equal(got->keys[3], "debug");
    const json_value *dbg = json_get(got, "debug");
    compare_exact("input_ids", json_get(dbg, "input_ids"), json_get(c, "input_ids"));
    const json_value *gq = json_get(dbg, "questions")->items[0], *wq = json_get(c, "questions")->items[0];
    const char *fields[] = {"id", "question_span", "option_spans", "option_ids", "logits"};
    for (size_t i = 0; i < 5; i++) compare_exact(fields[i], json_get(gq, fields[i]), json_get(wq, fields[i]));
    json_free(got);
    clef_buf_free(&out);
    decoded_free(&d);
}

/* Parse request `body` with the default limits and encode it at the default
 * max length with the state cut on; asserts both succeed.  Caller frees req
 * and rec. */
static void parse_and_encode(const fixture *f, const char *body, clef_request *req, clef_record *rec) {
    clef_limits lim = clef_limits_default();
    clef_err err;
    assert_int_equal(clef_request_parse(body, strlen(body), &lim, req, &err), 0);
    assert_int_equal(clef_encode_record(f->tok, req, CLEF_DEFAULT_MAX_LENGTH, 1, rec, &err), 0);
}

/* question_id_empty: the golden's NaN logits are caught before rendering. */
static void test_non_finite_logits(void **state) {
    fixture *f = *state;
    const char *body = "{\"model\":\"m\",\"state\":\"x\",\"questions\":{\"a\":{\"type\":\"noul\"},"
                       "\"b\":{\"type\":\"score\",\"criteria\":[1,2]}}}";
    clef_request req;
    clef_record rec;
    clef_err err;
    parse_and_encode(f, body, &req, &rec);
    float logits[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    assert_int_equal(clef_check_logits(&req, &rec, logits, &err), 0);
    logits[3] = NAN;
    assert_int_equal(clef_check_logits(&req, &rec, logits, &err), -1);
    assert_int_equal(err.status, 500);
    assert_string_equal(err.message, "b: the head produced a non-finite logit");
    logits[3] = -INFINITY;
    assert_int_equal(clef_check_logits(&req, &rec, logits, &err), -1);
    clef_record_free(&rec);
    clef_request_free(&req);
}

/* Choice ties: the first maximum in REQUEST order wins, not in encoding order. */
static void test_choice_tie(void **state) {
    fixture *f = *state;
    const char *body = "{\"model\":\"m\",\"state\":\"x\",\"questions\":{\"c\":{\"type\":\"choice\","
                       "\"criteria\":{\"z\":null,\"a\":null,\"m\":null}}}}";
    clef_request req;
    clef_record rec;
    parse_and_encode(f, body, &req, &rec);
    float logits[3] = {1.0f, 0.0f, 1.0f}; /* encoding order a, m, z: a and z tie */
    clef_buf out = {0};
    clef_render_response(&req, &rec, logits, 0, &out);
    char want[512];
    snprintf(want, sizeof want,
             "{\"model\":\"m\",\"answers\":{\"c\":{\"type\":\"choice\",\"choice\":\"z\",\"confidence\":0.4223,"
             "\"probabilities\":{\"z\":0.4223,\"a\":0.4223,\"m\":0.1554}}},\"usage\":{\"input_tokens\":%zu,"
             "\"output_tokens\":0}}",
             rec.n_ids);
    assert_string_equal(out.data, want);
    clef_buf_free(&out);
    clef_record_free(&rec);
    clef_request_free(&req);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probabilities),    cmocka_unit_test(test_responses),
        cmocka_unit_test(test_debug_block),      cmocka_unit_test(test_non_finite_logits),
        cmocka_unit_test(test_choice_tie),
    };
    return cmocka_run_group_tests(tests, tu_golden_fixture_setup, tu_golden_fixture_teardown);
}
