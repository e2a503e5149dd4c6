/* test_quant_goldens.c — quantized checkpoints end to end (SPEC.md §10, §11).
 *
 * 1. Every checkpoint quantized outside clef (tests/fixtures/quant/, five
 *    published layouts) loads, is detected as the right format and
 *    reproduces its goldens.jsonl (12 cases answered by the reference with the
 *    dequantized weights): token ids and spans exact (from the same-named case
 *    of goldens/goldens.jsonl), option ids exact, logits within 1e-4 (every
 *    case: none needs the 2e-3 near-tie allowance), responses equal after
 *    rounding.
 * 2. The CLI: quantize, inspect and parity; quantize refuses an --out
 *    directory that is not empty (exit 2, nothing written) unless --force,
 *    which writes into it and deletes nothing.
 * (Round-trip parity of clef's own quantizations: test_quant_parity.c.)
 */
#define _GNU_SOURCE /* nftw */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "quant_fixture.h"

#include "engine/engine.h"
#include "engine/parity.h"
#include "json/json.h"
#include "quant/convert.h"
#include "quant/format.h"

#define LOGIT_TOL 1e-4

static json_value **base;
static size_t n_base;

static int setup(void **state) {
    base = tu_load_goldens("goldens/goldens.jsonl", &n_base);
    return n_base == 49 ? 0 : -1;
}

static int teardown(void **state) {
    tu_free_goldens(base, n_base);
    return 0;
}

static const json_value *base_case(const char *name) {
    for (size_t i = 0; i < n_base; i++)
        if (!strcmp(json_get(base[i], "name")->str, name)) return base[i];
    fail_msg("no case %s in goldens.jsonl", name);
    return NULL;
}

/* One thread: the tiny model's ops are too small to pay for OpenMP barriers. */
static clef_engine *open_engine(const char *dir) { return tu_open_engine(dir, 1, 1); }

static void assert_json_equal(const char *what, const json_value *a, const json_value *b) {
    clef_buf x = {0}, y = {0};
    json_render_opts(a, 0, &x);
    json_render_opts(b, 0, &y);
    if (strcmp(x.data, y.data)) fail_msg("%s: %s, golden %s", what, x.data, y.data);
    clef_buf_free(&x);
    clef_buf_free(&y);
}

/* Python round(x, 4) boundary: within `tol` of a half unit of the 4th decimal. */
static int near_boundary(double x, double tol) {
    double scaled = x * 1e4, frac = scaled - floor(scaled);
    return fabs(frac - 0.5) * 1e-4 <= tol;
}

/* SPEC §11 rule 5 on one number: equal after rounding, or one unit apart
 * when the golden's unrounded value (from its own logits) sits within 1e-5 of
 * a rounding boundary. */
static int allowances;
static void compare_number(const char *where, double got, double want, const double *unrounded, size_t n) {
    if (got == want) return;
    for (size_t i = 0; i < n; i++)
        if (fabs(got - want) <= 1.0001e-4 && near_boundary(unrounded[i], 1e-5)) {
            allowances++;
            return;
        }
    fail_msg("%s = %.6f, golden %.6f", where, got, want);
}

/* Walk two answer objects; numbers by rule 5, everything else exactly. */
static void compare_value(const char *where, const json_value *g, const json_value *w, const double *unrounded,
                          size_t n) {
    if ((g->type == JSON_FLOAT || g->type == JSON_INT) && (w->type == JSON_FLOAT || w->type == JSON_INT)) {
        double a, b;
        json_as_double(g, &a);
        json_as_double(w, &b);
        compare_number(where, a, b, unrounded, n);
        return;
    }
    if (g->type != w->type || ((g->type == JSON_OBJECT || g->type == JSON_ARRAY) && g->n != w->n)) {
        assert_json_equal(where, g, w);
        return;
    }
    if (g->type != JSON_OBJECT && g->type != JSON_ARRAY) {
        assert_json_equal(where, g, w);
        return;
    }
    for (size_t i = 0; i < w->n; i++) {
        char sub[512];
        if (g->type == JSON_OBJECT) {
            if (strcmp(g->keys[i], w->keys[i])) fail_msg("%s: key %s, golden %s", where, g->keys[i], w->keys[i]);
            snprintf(sub, sizeof sub, "%s.%s", where, w->keys[i]);
        } else {
            snprintf(sub, sizeof sub, "%s[%zu]", where, i);
        }
        compare_value(sub, g->items[i], w->items[i], unrounded, n);
    }
}

/* The unrounded quantities a response rounds: probabilities, their max and
 * the score expectation, from the golden logits. */
static size_t unrounded_of(const json_value *logits, double *out) {
    size_t n = logits->n, k = 0;
    double mx = -INFINITY, s = 0, p[64], score = 0, best = 0;
    assert_true(n <= 64);
    for (size_t i = 0; i < n; i++) mx = fmax(mx, tu_num_at(logits, i));
    for (size_t i = 0; i < n; i++) s += (p[i] = exp(tu_num_at(logits, i) - mx));
    for (size_t i = 0; i < n; i++) {
        p[i] /= s;
        out[k++] = p[i];
        score += (double)i * p[i];
        best = fmax(best, p[i]);
    }
    out[k++] = score;
    out[k++] = best;
    return k;
}

static void check_fixture(const char *fixture, const char *want_format, double *max_dev) {
    char *dir = qf_assemble(fixture);
    clef_engine *e = open_engine(dir);
    clef_quant_config qc;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_quant_detect(clef_engine_checkpoint(e), &qc, &err), 0);
    assert_string_equal(clef_quant_format_name(qc.format), want_format);
    clef_quant_config_free(&qc);
    char *gp = qf_path(dir, "goldens.jsonl");
    size_t n;
    json_value **cases = tu_read_jsonl(gp, &n);
    assert_int_equal(n, 12);
    for (size_t c = 0; c < n; c++) {
        const char *name = json_get(cases[c], "name")->str;
        const json_value *b = base_case(name);
        int64_t max_length = 64000;
        json_as_i64(json_get(cases[c], "max_length"), &max_length);
        clef_buf body = {0}, out = {0};
        json_render_opts(json_get(cases[c], "request"), 0, &body);
        clef_decide_params p = {.debug = 1, .max_length = (size_t)max_length, .truncate_state = -1};
        if (clef_engine_decide(e, body.data, body.len, &p, &out, &err)) fail_msg("%s/%s: %s", fixture, name, err.message);
        json_value *got = json_parse(out.data, out.len, &err);
        assert_non_null(got);
        const json_value *dbg = json_get(got, "debug");
        assert_json_equal(name, json_get(dbg, "input_ids"), json_get(b, "input_ids"));
        const json_value *gq = json_get(dbg, "questions"), *wq = json_get(cases[c], "questions"),
                         *bq = json_get(b, "questions");
        assert_int_equal(gq->n, wq->n);
        for (size_t q = 0; q < wq->n; q++) {
            const json_value *g = gq->items[q], *w = wq->items[q], *bb = bq->items[q];
            assert_string_equal(json_get(g, "id")->str, json_get(w, "id")->str);
            assert_json_equal(name, json_get(g, "option_ids"), json_get(w, "option_ids"));
            assert_json_equal(name, json_get(g, "question_span"), json_get(bb, "question_span"));
            assert_json_equal(name, json_get(g, "option_spans"), json_get(bb, "option_spans"));
            const json_value *gl = json_get(g, "logits"), *wl = json_get(w, "logits");
            assert_int_equal(gl->n, wl->n);
            for (size_t k = 0; k < wl->n; k++) {
                double d = fabs(tu_num_at(gl, k) - tu_num_at(wl, k));
                if (d > LOGIT_TOL)
                    fail_msg("%s/%s/%s option %zu: logit %.8f, golden %.8f", fixture, name, json_get(w, "id")->str, k,
                             tu_num_at(gl, k), tu_num_at(wl, k));
                *max_dev = fmax(*max_dev, d);
            }
        }
        /* response: same envelope, answers equal after rounding */
        const json_value *wr = json_get(cases[c], "response");
        assert_json_equal(name, json_get(got, "usage"), json_get(wr, "usage"));
        assert_json_equal(name, json_get(got, "model"), json_get(wr, "model"));
        const json_value *ga = json_get(got, "answers"), *wa = json_get(wr, "answers");
        assert_int_equal(ga->n, wa->n);
        for (size_t q = 0; q < wa->n; q++) {
            double un[70];
            const json_value *wl = NULL;
            for (size_t k = 0; k < wq->n; k++)
                if (!strcmp(json_get(wq->items[k], "id")->str, wa->keys[q])) wl = json_get(wq->items[k], "logits");
            assert_non_null(wl);
            char where[256];
            snprintf(where, sizeof where, "%s/%s/%s", fixture, name, wa->keys[q]);
            assert_string_equal(ga->keys[q], wa->keys[q]);
            compare_value(where, ga->items[q], wa->items[q], un, unrounded_of(wl, un));
        }
        json_free(got);
        clef_buf_free(&body);
        clef_buf_free(&out);
        json_free(cases[c]);
    }
    free(cases);
    free(gp);
    clef_engine_close(e);
    qf_remove(dir);
    free(dir);
}

static void test_fixture_goldens(void **state) {
    static const char *const want[QF_N_FORMATS] = {"nvfp4-ct", "nvfp4-ct", "nvfp4-modelopt", "fp8-block",
                                                   "int4-autoround"};
    for (size_t i = 0; i < QF_N_FORMATS; i++) {
        double max_dev = 0;
        allowances = 0;
        check_fixture(QF_FORMATS[i], want[i], &max_dev);
        printf("fixture %-17s detected %-15s 12/12 goldens: ids and spans exact, max |logit diff| %.2e, "
               "responses equal (%d boundary allowances)\n", QF_FORMATS[i], want[i], max_dev, allowances);
    }
}

/* ---- CLI ---- */

/* tu_run_cmd, the output handed to the caller (frees it). */
static int run(const char *cmd, char **output) {
    clef_buf b = {0};
    int rc = tu_run_cmd(cmd, &b);
    *output = b.data;
    return rc;
}

static void test_cli(void **state) {
    char tmpl[] = "/tmp/clef_qcli_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char *tiny = tu_fixture("tiny-clef-omni");
    char cmd[4096], *out;
    snprintf(cmd, sizeof cmd, "%s quantize --model %s --format fp8-block --out %s/q --quiet", CLEF_BINARY, tiny, tmpl);
    assert_int_equal(run(cmd, &out), 0);
    assert_non_null(strstr(out, "quantized 72 expert matrices to fp8-block"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s quantize --model %s --format int3 --out %s/x 2>&1", CLEF_BINARY, tiny, tmpl);
    assert_int_equal(run(cmd, &out), 2);
    assert_non_null(strstr(out, "unknown format 'int3'"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s inspect --model %s/q", CLEF_BINARY, tmpl);
    assert_int_equal(run(cmd, &out), 0);
    assert_non_null(strstr(out, "quantization: fp8-block (quant_method fp8), blocks 128x128"));
    assert_non_null(strstr(out, "fp8-block     72 decoder Linear modules"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s/quant_requests.jsonl", tmpl);
    FILE *f = fopen(cmd, "w");
    fputs("{\"model\":\"clef-omni\",\"state\":\"The build is red.\",\"questions\":{\"ok\":{\"type\":\"noul\"}}}\n\n"
          "{\"name\":\"bad\",\"request\":{\"model\":\"clef-omni\"}}\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s parity --model %s --model %s/q --requests %s/quant_requests.jsonl --json",
             CLEF_BINARY, tiny, tmpl, tmpl);
    assert_int_equal(run(cmd, &out), 0);
    clef_err err;
    json_value *r = json_parse(out, strlen(out), &err);
    if (!r) fail_msg("parity --json printed: %s", out);
    int64_t v;
    assert_int_equal(json_as_i64(json_get(r, "requests"), &v), 0);
    assert_int_equal(v, 1);
    assert_int_equal(json_as_i64(json_get(r, "rejected"), &v), 0);
    assert_int_equal(v, 1);
    assert_int_equal(json_as_i64(json_get(r, "questions"), &v), 0);
    assert_int_equal(v, 1);
    json_free(r);
    free(out);
    snprintf(cmd, sizeof cmd, "%s parity --model %s --requests x 2>&1", CLEF_BINARY, tiny);
    assert_int_equal(run(cmd, &out), 2);
    free(out);
    free(tiny);
    qf_remove(tmpl);
}

/* 1 if `path` exists. */
static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static void test_cli_out_not_empty(void **state) {
    char tmpl[] = "/tmp/clef_qout_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char *dir = qf_path(tmpl, "out"), *mine = qf_path(dir, "mine.txt"), *config = qf_path(dir, "config.json");
    assert_int_equal(mkdir(dir, 0755), 0);
    char cmd[4096], *out, want[1024];
    /* an empty directory is fine without --force */
    snprintf(cmd, sizeof cmd, "%s quantize --synthetic tiny --format int4 --out %s --quiet 2>&1", CLEF_BINARY, dir);
    assert_int_equal(run(cmd, &out), 0);
    free(out);
    assert_true(exists(config));
    /* now it is not empty: refused, exact message, nothing touched */
    FILE *f = fopen(mine, "w");
    fputs("keep", f);
    fclose(f);
    assert_int_equal(unlink(config), 0);
    assert_int_equal(run(cmd, &out), 2);
    snprintf(want, sizeof want,
             "clef quantize: --out %s is not empty; give a new or empty directory, or add --force to write into it "
             "(files of the same names are replaced)\n",
             dir);
    assert_string_equal(out, want);
    free(out);
    assert_false(exists(config)); /* refused before anything was written */
    /* --force writes into it and leaves the user's file alone */
    snprintf(cmd, sizeof cmd, "%s quantize --synthetic tiny --format int4 --out %s --quiet --force 2>&1", CLEF_BINARY,
             dir);
    assert_int_equal(run(cmd, &out), 0);
    assert_non_null(strstr(out, "quantized 72 expert matrices to int4"));
    free(out);
    assert_true(exists(config));
    size_t n = 0;
    char *kept = tu_read_file(mine, &n);
    assert_int_equal(n, 4);
    assert_memory_equal(kept, "keep", 4);
    free(kept);
    /* a file is never a directory, --force or not */
    snprintf(cmd, sizeof cmd, "%s quantize --synthetic tiny --format int4 --out %s --force 2>&1", CLEF_BINARY, mine);
    assert_int_equal(run(cmd, &out), 2);
    snprintf(want, sizeof want, "clef quantize: --out %s exists and is not a directory\n", mine);
    assert_string_equal(out, want);
    free(out);
    /* the usage names the flag */
    snprintf(cmd, sizeof cmd, "%s quantize --help", CLEF_BINARY);
    assert_int_equal(run(cmd, &out), 0);
    assert_non_null(strstr(out, "--force "));
    free(out);
    free(config);
    free(mine);
    free(dir);
    qf_remove(tmpl);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_goldens),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_cli_out_not_empty),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
