/* test_cuda_golden.c — the golden cases of the tiny fixture on the CUDA
 * backend (thinker + joint schema head), in both numeric modes, plus
 * packed-vs-alone bitwise equality on the GPU.  Skipped without a device.
 *
 * Tolerances against the reference logits (goldens.jsonl):
 *   precise mode (--numerics precise: split-bf16 activations and attention):
 *     the CPU backend's rules — |dlogit| <= 1e-4 where the case's
 *     min_router_logit_gap >= 1e-3, <= 2e-3 otherwise.
 *   fast mode (the default numerics, CLEF_CUDA_NUMERICS=fast: bf16 activations into the
 *   tensor cores): |dlogit| <= 0.1 and
 *     per-question total-variation distance <= 0.02.  Rounding every
 *     activation of the tiny model (hidden 32) to bf16 on the CPU moved the
 *     logits by at most 2.2e-2 and the TV by at most 6.7e-3 over these cases
 *     (measured while writing this test), so the bounds leave ~3-4x margin;
 *     the real widths average far more terms (see the `small` parity run in
 *     scripts/gpu_check.sh for the model-level figures).
 * Packing: three records in one forward give bitwise the hidden states and
 * logits of each record alone.  The state cache stays off on CUDA, saying why. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "engine/state_cache.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "testutil.h"

typedef struct fixture {
    clef_checkpoint ck;
    clef_model *m[2]; /* fast, precise */
    json_value **cases;
    size_t n_cases;
} fixture;

static int setup(void **state) {
    if (tu_cuda_devices(state) == 0) return 0;
    fixture *f = calloc(1, sizeof *f);
    clef_err err;
    clef_err_clear(&err);
    if (tu_open_fixture("tiny-clef-omni", &f->ck) != 0) return -1;
    for (int i = 0; i < 2; i++) {
        clef_cuda_options o = {.device = 0, .precise = i, .gemm = -1, .profile = 0};
        clef_backend *be = tu_cuda_backend_env(&o, TU_NO_ENV, &err);
        if (!be || !(f->m[i] = clef_model_create_on(&f->ck, be, 1, &err))) {
            fprintf(stderr, "cuda model: %s\n", err.message);
            return -1;
        }
    }
    tu_print_cuda_device(clef_model_backend(f->m[0]));
    char *path = tu_fixture("goldens/goldens.jsonl");
    f->cases = tu_read_jsonl(path, &f->n_cases);
    free(path);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    for (size_t i = 0; i < f->n_cases; i++) json_free(f->cases[i]);
    free(f->cases);
    clef_model_free(f->m[0]);
    clef_model_free(f->m[1]);
    clef_checkpoint_close(&f->ck);
    free(f);
    return 0;
}

/* Every case on model `m`; precise = CPU rules, else the fast-mode bounds. */
static void golden_cases(fixture *f, clef_model *m, int precise) {
    const size_t H = (size_t)f->ck.config.text.hidden_size;
    double worst = 0, worst_tv = 0;
    size_t n_checked = 0;
    for (size_t ci = 0; ci < f->n_cases; ci++) {
        const json_value *c = f->cases[ci];
        if (json_get(c, "error")) continue;
        const char *name = json_get(c, "name")->str;
        clef_record r;
        tu_record_from_golden(c, &r);
        clef_err err;
        clef_err_clear(&err);
        float *logits = tu_run_record(m, &r, H, &err);
        if (strcmp(name, "question_id_empty") == 0) {
            assert_null(logits);
            assert_int_equal(err.status, 422);
            clef_record_free(&r);
            continue;
        }
        if (!logits) fail_msg("%s: %s", name, err.message);
        double gap;
        assert_int_equal(json_as_double(json_get(c, "min_router_logit_gap"), &gap), 0);
        const double tol = precise ? (gap >= 1e-3 ? 1e-4 : 2e-3) : 0.1;
        const json_value *qs = json_get(c, "questions");
        double case_max = 0, case_tv = 0;
        size_t k = 0;
        for (size_t i = 0; i < qs->n; i++) {
            const json_value *gl = json_get(qs->items[i], "logits"), *gp = json_get(qs->items[i], "probs");
            assert_int_equal(gl->n, r.questions[i].n_options);
            double mx = logits[k], sum = 0, tv = 0;
            for (size_t j = 1; j < gl->n; j++) mx = fmax(mx, logits[k + j]);
            for (size_t j = 0; j < gl->n; j++) sum += exp(logits[k + j] - mx);
            for (size_t j = 0; j < gl->n; j++, k++) {
                double d = fabs((double)logits[k] - tu_num_at(gl, j));
                if (!(d <= tol))
                    fail_msg("%s (%s) q%zu option %zu: logit %.9g, golden %.9g (tol %g, router gap %.3g)", name,
                             precise ? "precise" : "fast", i, j, logits[k], tu_num_at(gl, j), tol, gap);
                case_max = fmax(case_max, d);
                tv += fabs(exp(logits[k] - mx) / sum - tu_num_at(gp, j));
            }
            case_tv = fmax(case_tv, tv / 2);
        }
        if (!precise && !(case_tv <= 0.02)) fail_msg("%s (fast): total-variation distance %.3g > 0.02", name, case_tv);
        printf("  %-6s %-28s %5zu tokens  max |dlogit| %.2e  max TV %.2e  gap %.2e\n", precise ? "precise" : "fast",
               name, r.n_ids, case_max, case_tv, gap);
        worst = fmax(worst, case_max);
        worst_tv = fmax(worst_tv, case_tv);
        n_checked++;
        free(logits);
        clef_record_free(&r);
    }
    printf("  %s mode: %zu cases, max |dlogit| %.3e, max TV %.3e\n", precise ? "precise" : "fast", n_checked, worst,
           worst_tv);
    assert_int_equal(n_checked, 38);
}

static void test_golden_fast(void **state) {
    TU_NEED_GPU(state);
    fixture *f = *state;
    golden_cases(f, f->m[0], 0);
}

static void test_golden_precise(void **state) {
    TU_NEED_GPU(state);
    fixture *f = *state;
    golden_cases(f, f->m[1], 1);
}

/* Three records in one packed forward: hidden states and logits bitwise
 * those of each record alone (fast mode, the one that serves). */
static void test_packed_equals_alone(void **state) {
    TU_NEED_GPU(state);
    fixture *f = *state;
    clef_model *m = f->m[0];
    const size_t H = (size_t)f->ck.config.text.hidden_size;
    const size_t pick[3] = {1, 0, 4};
    clef_record r[3];
    size_t seg[4];
    int32_t *ids = tu_pack_goldens(f->cases, pick, 3, r, seg);
    float *packed = malloc(seg[3] * H * sizeof *packed);
    clef_err err;
    clef_err_clear(&err);
    if (clef_thinker_forward_batch(m, ids, seg[3], seg, 3, NULL, packed, NULL, &err) != 0) fail_msg("%s", err.message);
    for (int i = 0; i < 3; i++) {
        float *alone = malloc(r[i].n_ids * H * sizeof *alone);
        if (clef_thinker_forward(m, r[i].input_ids, r[i].n_ids, alone, NULL, &err) != 0) fail_msg("%s", err.message);
        assert_memory_equal(alone, packed + seg[i] * H, r[i].n_ids * H * sizeof(float));
        size_t n_opt = clef_record_total_options(&r[i]);
        float *la = malloc((n_opt + 1) * 4), *lp = malloc((n_opt + 1) * 4);
        if (clef_head_forward(m, alone, &r[i], la, &err) || clef_head_forward(m, packed + seg[i] * H, &r[i], lp, &err))
            fail_msg("%s", err.message);
        assert_memory_equal(la, lp, n_opt * 4);
        free(la), free(lp), free(alone);
    }
    printf("  3 records (%zu tokens) packed: hidden states and logits bitwise equal to alone\n", seg[3]);
    for (int i = 0; i < 3; i++) clef_record_free(&r[i]);
    free(ids), free(packed);
}

/* A precise CUDA model of the fixture with CLEF_CUDA_GRAPHS set to `graphs`. */
static clef_model *graph_model(fixture *f, const char *graphs) {
    clef_err err;
    clef_err_clear(&err);
    const clef_cuda_options o = {.device = 0, .precise = 1, .gemm = -1, .profile = 0};
    const char *const env[] = {"CLEF_CUDA_GRAPHS", graphs, NULL};
    clef_backend *be = tu_cuda_backend_env(&o, env, &err);
    clef_model *m = be ? clef_model_create_on(&f->ck, be, 1, &err) : NULL;
    if (!m) fail_msg("cuda model: %s", err.message);
    return m;
}

/* CUDA graphs (CLEF_CUDA_GRAPHS, on by default): a batch layout's first
 * forward runs plainly, the second is captured, later ones replay the graph.
 * Two layouts (three records packed; one alone) interleaved five times, the
 * token ids changing every other time (same layout, new data: the replay
 * must read them): every forward's hidden states bitwise those of a backend
 * with graphs off; one capture per layout, the rest replays, no failed
 * capture.  (The bigger layout goes first: its workspace then serves both,
 * so each layout keeps its buffer addresses, part of the key.) */
static void test_graph_replay(void **state) {
    TU_NEED_GPU(state);
    fixture *f = *state;
    clef_model *mg = graph_model(f, "1"), *mp = graph_model(f, "0");
    const size_t H = (size_t)f->ck.config.text.hidden_size;
    const size_t pick[3] = {2, 5, 1};
    clef_record r[3];
    size_t seg[4], one[2];
    int32_t *ids = tu_pack_goldens(f->cases, pick, 3, r, seg);
    int32_t *rev = malloc(seg[3] * sizeof *rev); /* each record's ids reversed */
    for (int i = 0; i < 3; i++)
        for (size_t j = seg[i]; j < seg[i + 1]; j++) rev[j] = ids[seg[i] + seg[i + 1] - 1 - j];
    one[0] = 0, one[1] = r[0].n_ids;
    float *want = malloc(seg[3] * H * sizeof *want), *got = malloc(seg[3] * H * sizeof *got);
    const size_t n[2] = {one[1], seg[3]}, n_seg[2] = {1, 3};
    const size_t *segs[2] = {one, seg};
    clef_err err;
    clef_err_clear(&err);
    for (int it = 0; it < 5; it++)
        for (int l = 1; l >= 0; l--) {
            const int32_t *x = it % 2 ? rev : ids;
            if (clef_thinker_forward_batch(mp, x, n[l], segs[l], n_seg[l], NULL, want, NULL, &err) != 0 ||
                clef_thinker_forward_batch(mg, x, n[l], segs[l], n_seg[l], NULL, got, NULL, &err) != 0)
                fail_msg("forward %d of layout %d: %s", it, l, err.message);
            assert_memory_equal(want, got, n[l] * H * sizeof(float));
        }
    long cap, rep, failed, cap_p, rep_p;
    clef_cuda_graph_stats(clef_model_backend(mg), &cap, &rep, &failed);
    clef_cuda_graph_stats(clef_model_backend(mp), &cap_p, &rep_p, NULL);
    printf("  graphs: %ld captured, %ld replayed, %ld failed over 2 layouts x 5 forwards: bitwise equal to "
           "graphs off\n", cap, rep, failed);
    assert_int_equal(failed, 0);
    assert_int_equal(cap, 2);
    assert_int_equal(rep, 6);
    assert_int_equal(cap_p + rep_p, 0);
    for (int i = 0; i < 3; i++) clef_record_free(&r[i]);
    free(ids), free(rev), free(want), free(got);
    clef_model_free(mg), clef_model_free(mp);
}

/* The state cache on CUDA (backend.h causal_prefix): a request over a long
 * state answered by an engine without the cache and twice by one with it
 * (a fill, then a reuse of every whole block of the state) gives the same
 * bytes each time, and the cache counts exactly what it reused.
 * tests/golden/test_state_cache.c runs on CUDA too (CLEF_DEVICE=cuda, the
 * GPU check's `tests` stage): logits bitwise over question sets, a
 * transcript, packed mixes and evictions. */
static void test_state_cache_cuda(void **state) {
    TU_NEED_GPU(state);
    (void)state;
    char *dir = tu_fixture("tiny-clef-omni");
    clef_engine *e[2];
    for (int k = 0; k < 2; k++) {
        clef_engine_options opt = {.model_dir = dir, .device = "cuda", .truncate_state = 1,
                                   .state_cache = k ? (size_t)64 << 20 : 0};
        clef_err err;
        clef_err_clear(&err);
        e[k] = clef_engine_open(&opt, &err);
        if (!e[k]) fail_msg("engine: %s", err.message);
    }
    assert_int_equal(clef_model_can_reuse(clef_engine_model(e[1])), 1);
    assert_null(clef_engine_state_cache_off_reason(e[1]));
    clef_buf body = {0}, want = {0}, got = {0};
    clef_buf_puts(&body, "{\"model\":\"clef-omni\",\"state\":\"");
    for (int w = 0; w < 120; w++) clef_buf_printf(&body, "ticket %d failed at step %d; ", 1000 + w, w % 7);
    clef_buf_puts(&body, "\",\"questions\":{\"team\":{\"type\":\"choice\",\"instructions\":\"Which team?\","
                         "\"criteria\":{\"billing\":\"Payments\",\"technical\":\"Bugs\"}},"
                         "\"urgent\":{\"type\":\"noul\",\"instructions\":\"Is it urgent?\"}}}");
    clef_err err;
    clef_err_clear(&err);
    if (clef_engine_decide(e[0], body.data, body.len, NULL, &want, &err)) fail_msg("decide: %s", err.message);
    for (int i = 0; i < 2; i++) {
        got.len = 0;
        if (clef_engine_decide(e[1], body.data, body.len, NULL, &got, &err)) fail_msg("decide: %s", err.message);
        assert_int_equal(got.len, want.len);
        assert_memory_equal(got.data, want.data, want.len);
    }
    clef_state_cache_stats st;
    clef_engine_state_cache_stats(e[1], &st);
    assert_int_equal(st.lookups, 2);
    assert_int_equal(st.hits, 1);
    assert_true(st.blocks_filled >= 8); /* ~1,200 state tokens: >= 8 whole blocks */
    assert_int_equal(st.tokens_reused, st.blocks_filled * 64);
    assert_int_equal(st.blocks, st.blocks_filled);
    clef_buf_free(&body), clef_buf_free(&want), clef_buf_free(&got);
    clef_engine_close(e[0]), clef_engine_close(e[1]);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_cache_cuda),
        cmocka_unit_test(test_golden_fast),
        cmocka_unit_test(test_golden_precise),
        cmocka_unit_test(test_packed_equals_alone),
        cmocka_unit_test(test_graph_replay),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
