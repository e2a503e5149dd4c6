/* test_packing_mixes.c — on the CPU a record's logits are bitwise the same
 * alone or packed with other records, in several mixes, and the same on
 * every instruction set the CPU GEMM has (backend/cpu/cpu_gemm.h):
 *
 *   models: the BF16 tiny fixture and the quantized fixtures (INT4
 *           auto_gptq, NVFP4 compressed-tensors, FP8 block);
 *   records: the golden cases of at most 400 tokens, built from their
 *           input_ids (tu_record_from_golden), eight of them;
 *   mixes:  all in order; all reversed; pairs (i, n-1-i); one record three
 *           times beside another; all on a 3-thread backend;
 *   variants: every instruction set this processor runs (AVX2, AVX-512;
 *           scalar on the tiny fixture), each giving bitwise the logits of
 *           the first.
 * On the tiny fixture the records alone are also checked against the
 * goldens' logits (within the 2e-3 near-tie allowance; test_model_logits
 * applies the full rule), so the bitwise checks compare real answers. */
#define _GNU_SOURCE /* nftw (quant_fixture.h) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant_fixture.h"

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_internal.h"
#include "io/checkpoint.h"
#include "model/model.h"

#define MAX_RECORDS 8
#define MAX_TOKENS 400

static json_value **cases;
static size_t n_cases;

static int setup(void **state) {
    cases = tu_load_goldens("goldens/goldens.jsonl", &n_cases);
    return cases ? 0 : -1;
}

static int teardown(void **state) {
    tu_free_goldens(cases, n_cases);
    return 0;
}

/* The cases used: answered ones, at most MAX_TOKENS tokens. */
static size_t pick_cases(size_t *pick) {
    size_t n = 0;
    for (size_t i = 0; i < n_cases && n < MAX_RECORDS; i++) {
        const json_value *c = cases[i];
        if (json_get(c, "error") || !strcmp(tu_case_name(c), "question_id_empty")) continue;
        if (json_get(c, "input_ids")->n > MAX_TOKENS) continue;
        pick[n++] = i;
    }
    return n;
}

typedef struct logits_set {
    float *v[MAX_RECORDS];
    size_t n[MAX_RECORDS];
} logits_set;

/* Logits of records pick[order[0..k)] packed in one thinker forward, the
 * head run per record on its rows; out[j] gets record order[j]'s. */
static void run_mix(clef_model *m, const size_t *pick, const size_t *order, size_t k, float **out) {
    const size_t H = (size_t)clef_model_config(m)->text.hidden_size;
    size_t sel[3 * MAX_RECORDS], seg[3 * MAX_RECORDS + 1];
    clef_record r[3 * MAX_RECORDS];
    for (size_t j = 0; j < k; j++) sel[j] = pick[order[j]];
    int32_t *ids = tu_pack_goldens(cases, sel, k, r, seg);
    float *hidden = malloc(seg[k] * H * sizeof *hidden);
    clef_err err;
    clef_err_clear(&err);
    if (clef_thinker_forward_batch(m, ids, seg[k], seg, k, NULL, hidden, NULL, &err) != 0) fail_msg("%s", err.message);
    for (size_t j = 0; j < k; j++) {
        out[j] = malloc((clef_record_total_options(&r[j]) + 1) * sizeof(float));
        if (clef_head_forward(m, hidden + seg[j] * H, &r[j], out[j], &err) != 0) fail_msg("%s", err.message);
        clef_record_free(&r[j]);
    }
    free(hidden);
    free(ids);
}

static void expect_same(const char *what, const logits_set *ref, size_t rec, const float *got) {
    if (memcmp(ref->v[rec], got, ref->n[rec] * sizeof(float)))
        fail_msg("%s: record %zu differs from alone", what, rec);
}

/* The mixes on model m against `ref` (each record alone on the first variant). */
static size_t check_mixes(clef_model *m, const size_t *pick, size_t n, const logits_set *ref, const char *label) {
    size_t order[3 * MAX_RECORDS], checked = 0;
    float *out[3 * MAX_RECORDS];
    char what[256];
    /* all in order, all reversed */
    for (int rev = 0; rev < 2; rev++) {
        for (size_t j = 0; j < n; j++) order[j] = rev ? n - 1 - j : j;
        run_mix(m, pick, order, n, out);
        snprintf(what, sizeof what, "%s: %zu records %s", label, n, rev ? "reversed" : "in order");
        for (size_t j = 0; j < n; j++) expect_same(what, ref, order[j], out[j]), free(out[j]), checked++;
    }
    /* pairs from both ends */
    for (size_t j = 0; j < n / 2; j++) {
        order[0] = j, order[1] = n - 1 - j;
        run_mix(m, pick, order, 2, out);
        snprintf(what, sizeof what, "%s: pair (%zu, %zu)", label, j, n - 1 - j);
        for (size_t q = 0; q < 2; q++) expect_same(what, ref, order[q], out[q]), free(out[q]), checked++;
    }
    /* one record three times around another */
    const size_t dup[4] = {1, 0, 1, 1};
    run_mix(m, pick, dup, 4, out);
    snprintf(what, sizeof what, "%s: record 1 three times beside record 0", label);
    for (size_t q = 0; q < 4; q++) expect_same(what, ref, dup[q], out[q]), free(out[q]), checked++;
    return checked;
}

/* strict_goldens: the tiny fixture (also checked against its goldens, and
 * on the scalar kernels, whose libm fmaf calls are slow; every format meets
 * them in test_cpu_gemm).  One thread per model (the tiny model's ops are
 * too small to pay for OpenMP's barriers), then the whole mix on 3. */
static void check_model(const clef_checkpoint *ck, const char *label, int strict_goldens) {
    size_t pick[MAX_RECORDS];
    const size_t n = pick_cases(pick);
    assert_true(n >= 6);
    clef_err err;
    clef_err_clear(&err);
    logits_set ref;
    memset(&ref, 0, sizeof ref);
    size_t checked = 0, variants = 0;
    double worst = 0;
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        if (!cpu_isa_supported((cpu_isa)isa) || (isa == CPU_ISA_SCALAR && !strict_goldens)) continue;
        clef_backend *be = clef_backend_cpu_create(1, &err);
        assert_non_null(be);
        cpu_of(be)->isa = (cpu_isa)isa;
        clef_model *m = clef_model_create_on(ck, be, 1, &err);
        if (!m) fail_msg("%s: %s", label, err.message);
        const size_t H = (size_t)clef_model_config(m)->text.hidden_size;
        char name[96];
        snprintf(name, sizeof name, "%s, %s", label, cpu_isa_name((cpu_isa)isa));
        for (size_t j = 0; j < n; j++) {
            clef_record r;
            tu_record_from_golden(cases[pick[j]], &r);
            float *alone = tu_run_record(m, &r, H, &err);
            if (!alone) fail_msg("%s: %s", name, err.message);
            if (!ref.v[j]) {
                ref.v[j] = alone;
                ref.n[j] = clef_record_total_options(&r);
                /* against the goldens: the answers are real */
                if (strict_goldens) {
                    const json_value *qs = json_get(cases[pick[j]], "questions");
                    size_t o = 0;
                    for (size_t q = 0; q < qs->n; q++) {
                        const json_value *gl = json_get(qs->items[q], "logits");
                        for (size_t i = 0; i < gl->n; i++, o++) worst = fmax(worst, fabs(alone[o] - tu_num_at(gl, i)));
                    }
                    assert_int_equal(o, ref.n[j]);
                }
            } else {
                if (memcmp(ref.v[j], alone, ref.n[j] * sizeof(float)))
                    fail_msg("%s: record %zu alone differs from the first instruction set's", name, j);
                free(alone);
            }
            clef_record_free(&r);
        }
        checked += check_mixes(m, pick, n, &ref, name);
        clef_model_free(m);
        variants++;
    }
    /* and the thread count changes nothing (other row chunks, other item order) */
    clef_backend *be3 = clef_backend_cpu_create(3, &err);
    clef_model *m3 = clef_model_create_on(ck, be3, 1, &err);
    assert_non_null(m3);
    size_t order[MAX_RECORDS] = {0};
    float *out[MAX_RECORDS];
    for (size_t j = 0; j < n; j++) order[j] = j;
    run_mix(m3, pick, order, n, out);
    for (size_t j = 0; j < n; j++) expect_same("3 threads", &ref, j, out[j]), free(out[j]), checked++;
    clef_model_free(m3);
    printf("  %-22s %zu records, %zu instruction sets, %zu packed answers bitwise alone%s", label, n, variants,
           checked, strict_goldens ? "" : "\n");
    if (strict_goldens) printf("; alone vs goldens max |dlogit| %.3g\n", worst);
    if (strict_goldens) assert_true(worst <= 2e-3);
    for (size_t j = 0; j < n; j++) free(ref.v[j]);
}

static void test_tiny_bf16(void **state) {
    clef_checkpoint ck;
    assert_int_equal(tu_open_fixture("tiny-clef-omni", &ck), 0);
    check_model(&ck, "tiny (bf16)", 1);
    clef_checkpoint_close(&ck);
}

static void quant_fixture(const char *format) {
    char *dir = qf_assemble(format);
    clef_checkpoint ck;
    clef_err err;
    clef_err_clear(&err);
    if (clef_checkpoint_open(dir, &ck, &err) != 0) fail_msg("%s: %s", format, err.message);
    check_model(&ck, format, 0);
    clef_checkpoint_close(&ck);
    qf_remove(dir);
    free(dir);
}

static void test_int4(void **state) { quant_fixture("int4-autoround"); }
static void test_nvfp4(void **state) { quant_fixture("nvfp4-ct"); }
static void test_fp8(void **state) { quant_fixture("fp8-block"); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_bf16),
        cmocka_unit_test(test_int4),
        cmocka_unit_test(test_nvfp4),
        cmocka_unit_test(test_fp8),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
