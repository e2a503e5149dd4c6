/* test_model_logits.c — thinker + joint schema head against the reference
 * logits of every golden case (SPEC §11 rules 4 and 6).  Records are built
 * directly from the goldens' input_ids, types and spans (option spans in
 * encoding order), so this tests the model math alone.
 *   |dlogit| <= 1e-4 where the case's min_router_logit_gap >= 1e-3 (no expert
 *   can flip), <= 2e-3 otherwise; probabilities (fp32 softmax) within 1e-5
 *   where the logit rule is 1e-4.
 * `question_id_empty` (empty question span) must be refused with 422.
 * Packing: three records in one thinker forward give bitwise the hidden
 * states of running each alone, with any thread count. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/checkpoint.h"
#include "model/model.h"
#include "testutil.h"

typedef struct fixture {
    clef_checkpoint ck;
    clef_model *m;
    json_value **cases;
    size_t n_cases;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    clef_err err;
    clef_err_clear(&err);
    if (tu_open_fixture("tiny-clef-omni", &f->ck) != 0) return -1;
    f->m = clef_model_create(&f->ck, 0, &err);
    if (!f->m) {
        fprintf(stderr, "model: %s\n", err.message);
        return -1;
    }
    f->cases = tu_load_goldens("goldens/goldens.jsonl", &f->n_cases);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    tu_free_goldens(f->cases, f->n_cases);
    clef_model_free(f->m);
    clef_checkpoint_close(&f->ck);
    free(f);
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_logits_all_cases(void **state) {
    fixture *f = *state;
    const size_t H = (size_t)f->ck.config.text.hidden_size;
    double max_strict = 0, max_loose = 0, max_prob = 0;
    size_t n_checked = 0, n_options = 0, n_tokens = 0;
    double t_all = 0;
    for (size_t ci = 0; ci < f->n_cases; ci++) {
        const json_value *c = f->cases[ci];
        if (json_get(c, "error")) continue;
        const char *name = tu_case_name(c);
        clef_record r;
        tu_record_from_golden(c, &r);
        clef_err err;
        clef_err_clear(&err);
        double t0 = now_s();
        float *logits = tu_run_record(f->m, &r, H, &err);
        double dt = now_s() - t0;
        t_all += dt;
        if (strcmp(name, "question_id_empty") == 0) {
            /* the reference returns NaN here; clef refuses the record */
            assert_null(logits);
            assert_int_equal(err.status, 422);
            printf("  %-28s refused: %d %s\n", name, err.status, err.message);
            clef_record_free(&r);
            continue;
        }
        if (!logits) fail_msg("%s: %s", name, err.message);
        double gap;
        assert_int_equal(json_as_double(json_get(c, "min_router_logit_gap"), &gap), 0);
        const double tol = gap >= 1e-3 ? 1e-4 : 2e-3;
        const json_value *qs = json_get(c, "questions");
        double case_max = 0, case_pmax = 0;
        size_t k = 0;
        for (size_t i = 0; i < qs->n; i++) {
            const json_value *gl = json_get(qs->items[i], "logits"), *gp = json_get(qs->items[i], "probs");
            assert_int_equal(gl->n, r.questions[i].n_options);
            /* fp32 softmax of this question's logits */
            float mx = logits[k];
            for (size_t j = 1; j < gl->n; j++) mx = fmaxf(mx, logits[k + j]);
            float sum = 0;
            for (size_t j = 0; j < gl->n; j++) sum += expf(logits[k + j] - mx);
            for (size_t j = 0; j < gl->n; j++, k++) {
                double d = fabs((double)logits[k] - tu_num_at(gl, j));
                if (!(d <= tol)) fail_msg("%s q%zu option %zu: logit %.9g, golden %.9g (tol %g, router gap %.3g)",
                                          name, i, j, logits[k], tu_num_at(gl, j), tol, gap);
                if (d > case_max) case_max = d;
                double dp = fabs((double)(expf(logits[k] - mx) / sum) - tu_num_at(gp, j));
                if (tol == 1e-4 && !(dp <= 1e-5)) fail_msg("%s q%zu option %zu: prob off by %.3g", name, i, j, dp);
                if (dp > case_pmax) case_pmax = dp;
            }
        }
        printf("  %-28s %5zu tokens %3zu options  max |dlogit| %.2e  |dprob| %.2e  gap %.2e  %6.1f ms\n", name,
               r.n_ids, k, case_max, case_pmax, gap, dt * 1e3);
        if (tol == 1e-4) {
            max_strict = fmax(max_strict, case_max);
            max_prob = fmax(max_prob, case_pmax);
        } else {
            max_loose = fmax(max_loose, case_max);
        }
        n_checked++;
        n_options += k;
        n_tokens += r.n_ids;
        free(logits);
        clef_record_free(&r);
    }
    printf("  %zu cases, %zu options, %zu tokens in %.2f s: max |dlogit| %.3g (gap >= 1e-3), %.3g (near ties); "
           "max |dprob| %.3g\n",
           n_checked, n_options, n_tokens, t_all, max_strict, max_loose, max_prob);
    assert_int_equal(n_checked, 38);
}

/* Three records in one packed forward: each record's rows are bitwise those
 * of its forward alone, and the positions restart per record. */
static void test_packed_equals_alone(void **state) {
    fixture *f = *state;
    const size_t H = (size_t)f->ck.config.text.hidden_size;
    const size_t pick[3] = {1, 0, 4};
    clef_record r[3];
    size_t seg[4];
    int32_t *ids = tu_pack_goldens(f->cases, pick, 3, r, seg);
    float *packed = malloc(seg[3] * H * sizeof *packed);
    clef_err err;
    clef_err_clear(&err);
    if (clef_thinker_forward_batch(f->m, ids, seg[3], seg, 3, NULL, packed, NULL, &err) != 0)
        fail_msg("packed: %s", err.message);
    for (int i = 0; i < 3; i++) {
        float *alone = malloc(r[i].n_ids * H * sizeof *alone);
        if (clef_thinker_forward(f->m, r[i].input_ids, r[i].n_ids, alone, NULL, &err) != 0)
            fail_msg("alone: %s", err.message);
        assert_memory_equal(alone, packed + seg[i] * H, r[i].n_ids * H * sizeof(float));
        free(alone);
        clef_record_free(&r[i]);
    }
    /* and the thread count changes nothing either */
    clef_model *m1 = clef_model_create(&f->ck, 1, &err);
    assert_non_null(m1);
    float *one = malloc(seg[3] * H * sizeof *one);
    if (clef_thinker_forward_batch(m1, ids, seg[3], seg, 3, NULL, one, NULL, &err) != 0)
        fail_msg("1 thread: %s", err.message);
    assert_memory_equal(one, packed, seg[3] * H * sizeof(float));
    clef_model_free(m1);
    free(one);
    free(ids);
    free(packed);
}

/* Errors, not crashes: a token id outside the vocabulary, an empty record,
 * an option span past the end. */
static void test_bad_inputs(void **state) {
    fixture *f = *state;
    const size_t H = (size_t)f->ck.config.text.hidden_size;
    clef_err err;
    clef_err_clear(&err);
    float hidden[4 * 32];
    assert_true(H <= 32);
    int32_t bad[2] = {1, (int32_t)f->ck.config.text.vocab_size};
    assert_int_equal(clef_thinker_forward(f->m, bad, 2, hidden, NULL, &err), -1);
    assert_int_equal(err.status, 422);
    assert_int_equal(clef_thinker_forward(f->m, bad, 0, hidden, NULL, &err), -1);
    clef_record r;
    tu_record_from_golden(f->cases[0], &r);
    float *h = calloc(r.n_ids * H, sizeof *h), logits[64];
    r.questions[0].options[0].end = (int32_t)r.n_ids + 1;
    assert_int_equal(clef_head_forward(f->m, h, &r, logits, &err), -1);
    assert_int_equal(err.status, 500);
    free(h);
    clef_record_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_all_cases),
        cmocka_unit_test(test_packed_equals_alone),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
