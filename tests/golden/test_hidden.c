/* test_hidden.c — the thinker's hidden states against the reference
 * (SPEC §11 rule 3): the first golden case (`triage_text`, 295 tokens) layer
 * by layer against goldens/hidden.json, max |diff| <= 1e-4.  hidden.json:
 * {"case", "hidden_states": [embeddings, after layer 0, after layer 1,
 * final-norm output] each [L][H], "final": [L][H]}.  The per-layer figures are
 * printed so a mismatch shows where it starts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "model/model.h"
#include "testutil.h"

/* max |got - want| over an [L][H] JSON matrix. */
static double max_diff(const float *got, const json_value *want, size_t L, size_t H) {
    assert_int_equal(want->type, JSON_ARRAY);
    assert_int_equal(want->n, L);
    double mx = 0;
    for (size_t t = 0; t < L; t++) {
        const json_value *row = want->items[t];
        assert_int_equal(row->n, H);
        for (size_t i = 0; i < H; i++) {
            double d = fabs((double)got[t * H + i] - tu_num_at(row, i));
            if (!(d <= mx)) mx = isnan(d) ? INFINITY : d;
        }
    }
    return mx;
}

static void test_hidden_states(void **state) {
    clef_err err;
    clef_err_clear(&err);
    char *dir = tu_fixture("tiny-clef-omni");
    clef_checkpoint ck;
    if (clef_checkpoint_open(dir, &ck, &err) != 0) fail_msg("checkpoint: %s", err.message);
    clef_model *m = clef_model_create(&ck, 0, &err);
    if (!m) fail_msg("model: %s", err.message);

    char *path = tu_fixture("goldens/goldens.jsonl");
    size_t n_cases;
    json_value **cases = tu_read_jsonl(path, &n_cases);
    free(path);
    path = tu_fixture("goldens/hidden.json");
    size_t len;
    char *text = tu_read_file(path, &len);
    free(path);
    json_value *hid = json_parse(text, len, &err);
    free(text);
    assert_non_null(hid);
    assert_string_equal(json_get(hid, "case")->str, json_get(cases[0], "name")->str);

    const json_value *ids_j = json_get(cases[0], "input_ids");
    const size_t L = ids_j->n, H = (size_t)ck.config.text.hidden_size;
    const size_t NL = (size_t)ck.config.text.num_hidden_layers;
    int32_t *ids = malloc(L * sizeof *ids);
    for (size_t i = 0; i < L; i++) ids[i] = (int32_t)tu_int_at(ids_j, i);
    float *hidden = malloc(L * H * sizeof *hidden), *layers = malloc((NL + 1) * L * H * sizeof *layers);
    if (clef_thinker_forward(m, ids, L, hidden, layers, &err) != 0) fail_msg("forward: %s", err.message);

    const json_value *hs = json_get(hid, "hidden_states");
    assert_int_equal(hs->n, NL + 1);
    double worst = 0;
    for (size_t l = 0; l <= NL; l++) {
        double d = max_diff(layers + l * L * H, hs->items[l], L, H);
        printf("  hidden_states[%zu] (%s): max |diff| %.3g\n", l,
               l == 0 ? "embeddings" : l == NL ? "final norm" : "after layer", d);
        if (d > worst) worst = d;
    }
    double df = max_diff(hidden, json_get(hid, "final"), L, H);
    printf("  final: max |diff| %.3g (%zu tokens)\n", df, L);
    assert_true(worst <= 1e-4);
    assert_true(df <= 1e-4);
    /* the embeddings are exact bf16 rows */
    assert_true(max_diff(layers, hs->items[0], L, H) == 0.0);

    free(ids), free(hidden), free(layers);
    json_free(hid);
    for (size_t i = 0; i < n_cases; i++) json_free(cases[i]);
    free(cases);
    clef_model_free(m);
    clef_checkpoint_close(&ck);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_hidden_states)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
