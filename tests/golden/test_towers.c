/* test_towers.c — the vision tower (main merger + deepstack sets) and the
 * audio tower on the CPU backend against the 12 multimodal goldens'
 * visual_calls / audio_calls (SPEC §11 rule 8: |diff| <= 1e-5).
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "decision/encode.h"
#include "decision/request.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "media/media.h"
#include "model/model.h"
#include "model/towers.h"
#include "text/tokenizer.h"

static json_value **cases;
static size_t n_cases;
static clef_checkpoint ck;
static clef_backend *be;
static clef_towers *tw;

static int setup(void **state) {
    (void)state;
    cases = tu_load_goldens("goldens/mm_goldens.jsonl.gz", &n_cases);
    clef_err err;
    clef_err_clear(&err);
    char *p = tu_fixture("tiny-clef-omni");
    if (clef_checkpoint_open(p, &ck, &err)) fail_msg("checkpoint: %s", err.message);
    free(p);
    be = clef_backend_cpu_create(2, &err);
    assert_non_null(be);
    tw = clef_towers_create(&ck, be, &err);
    if (!tw) fail_msg("towers: %s", err.message);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    clef_towers_free(tw);
    be->ops->destroy(be);
    clef_checkpoint_close(&ck);
    tu_free_goldens(cases, n_cases);
    return 0;
}

/* max |got - want| over a [rows][cols] JSON array vs host floats. */
static double max_diff(const json_value *want, const float *got, size_t rows, size_t cols, const char *what,
                       const char *name) {
    if (want->n != rows) fail_msg("%s: %s has %zu rows, golden %zu", name, what, rows, want->n);
    double worst = 0, sum = 0;
    size_t wr = 0, wk = 0;
    for (size_t r = 0; r < rows; r++) {
        assert_int_equal(want->items[r]->n, cols);
        for (size_t k = 0; k < cols; k++) {
            double d = fabs(tu_num_at(want->items[r], k) - got[r * cols + k]);
            sum += d;
            if (!(d <= worst)) worst = d, wr = r, wk = k;
        }
    }
    if (getenv("CLEF_TEST_VERBOSE"))
        print_message("  %s %s: mean %.3g max %.3g at row %zu col %zu\n", name, what, sum / (rows * cols), worst, wr,
                      wk);
    return worst;
}

/* One vision call (images or videos) against its golden entry. */
static double check_vision_call(const json_value *call, const float *pixels, size_t rows, const clef_grid *grids,
                                size_t n_items, const char *name) {
    const clef_vision_config *vc = clef_towers_vision_config(tw);
    size_t O = (size_t)vc->out_hidden_size, M = rows / 4;
    float *out = malloc(sizeof(float) * M * O), *ds = malloc(sizeof(float) * M * O * (size_t)vc->n_deepstack);
    clef_err err;
    if (clef_vision_forward(tw, pixels, rows, grids, n_items, out, ds, &err)) fail_msg("%s: %s", name, err.message);
    const json_value *po = json_get(call, "pooler_output");
    assert_int_equal(po->n, n_items);
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n_items; i++) {
        size_t tok = (size_t)grids[i].t * grids[i].h * grids[i].w / 4;
        double d = max_diff(po->items[i], out + at * O, tok, O, "pooler_output", name);
        if (d > worst) worst = d;
        at += tok;
    }
    const json_value *dsw = json_get(call, "deepstack_features");
    assert_int_equal(dsw->n, vc->n_deepstack);
    for (int64_t k = 0; k < vc->n_deepstack; k++) {
        double d = max_diff(dsw->items[k], ds + (size_t)k * M * O, M, O, "deepstack", name);
        if (d > worst) worst = d;
    }
    free(out);
    free(ds);
    return worst;
}

static void test_vision_tower(void **state) {
    (void)state;
    double worst = 0;
    size_t calls = 0;
    for (size_t ci = 0; ci < n_cases; ci++) {
        const json_value *c = cases[ci];
        const json_value *vcalls = json_get(c, "visual_calls");
        if (!vcalls->n) continue;
        clef_media m;
        tu_media_from_golden(c, &m, 1);
        size_t k = 0;
        double d;
        if (m.n_images) {
            d = check_vision_call(vcalls->items[k++], m.pixel_values, m.image_rows, m.image_grids, m.n_images,
                                  tu_case_name(c));
            if (d > worst) worst = d;
            calls++;
        }
        if (m.n_videos) {
            d = check_vision_call(vcalls->items[k++], m.pixel_values_videos, m.video_rows, m.video_grids, m.n_videos,
                                  tu_case_name(c));
            if (d > worst) worst = d;
            calls++;
        }
        assert_int_equal(k, vcalls->n);
        if (worst > 1e-5) fail_msg("%s: vision max |diff| %.3g", tu_case_name(c), worst);
        clef_media_free(&m);
    }
    print_message("vision tower: %zu calls, max |diff| %.3g\n", calls, worst);
    assert_int_equal(calls, 10); /* 6 image calls, 4 video calls ("everything" has both) */
}

static void test_audio_tower(void **state) {
    (void)state;
    double worst = 0;
    size_t calls = 0;
    for (size_t ci = 0; ci < n_cases; ci++) {
        const json_value *c = cases[ci];
        const json_value *acalls = json_get(c, "audio_calls");
        if (!acalls->n) continue;
        clef_media m;
        tu_media_from_golden(c, &m, 1);
        size_t rows = 0;
        for (size_t i = 0; i < m.n_clips; i++) rows += (size_t)m.audio_tokens[i];
        size_t O = (size_t)clef_towers_audio_config(tw)->output_dim;
        float *out = malloc(sizeof(float) * rows * O);
        clef_err err;
        if (clef_audio_forward(tw, m.input_features, m.n_clips, m.n_frames, m.feature_lens, out, &err))
            fail_msg("%s: %s", tu_case_name(c), err.message);
        double d = max_diff(acalls->items[0], out, rows, O, "audio", tu_case_name(c));
        if (d > worst) worst = d;
        if (d > 1e-5) fail_msg("%s: audio max |diff| %.3g", tu_case_name(c), d);
        calls++;
        free(out);
        clef_media_free(&m);
    }
    print_message("audio tower: %zu calls, max |diff| %.3g\n", calls, worst);
    assert_int_equal(calls, 7);
}

/* The whole multimodal request through the engine on the CPU backend:
 * parse -> record (ids, 3-D positions) -> media tensors -> towers -> thinker
 * with media rows and deepstack -> head -> response.  With the debug block:
 * input ids and spans exact, logits within 1e-4 of the reference (SPEC §11
 * rules 1, 4, 8); the response equals the reference's. */
static void test_engine_responses(void **state) {
    (void)state;
    clef_err err;
    clef_err_clear(&err);
    char *dir = tu_fixture("tiny-clef-omni");
    clef_engine_options opt = {0};
    opt.model_dir = dir;
    opt.n_threads = 2;
    opt.truncate_state = 1;
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e) fail_msg("engine: %s", err.message);
    clef_decide_params dp = {.debug = 1, .truncate_state = -1};
    double worst = 0;
    size_t n_logits = 0;
    for (size_t ci = 0; ci < n_cases; ci++) {
        const json_value *c = cases[ci];
        clef_buf body = {0}, out = {0}, want = {0}, got = {0};
        json_render_opts(json_get(c, "request"), 0, &body);
        if (clef_engine_decide(e, body.data, body.len, &dp, &out, &err))
            fail_msg("%s: decide: %s", tu_case_name(c), err.message);
        json_value *resp = json_parse(out.data, out.len, &err);
        assert_non_null(resp);
        /* debug block: ids, spans, logits */
        const json_value *dbg = json_get(resp, "debug");
        assert_non_null(dbg);
        const json_value *ids = json_get(dbg, "input_ids"), *gids = json_get(c, "input_ids");
        assert_int_equal(ids->n, gids->n);
        for (size_t i = 0; i < ids->n; i++) assert_int_equal(tu_int_at(ids, i), tu_int_at(gids, i));
        const json_value *qs = json_get(dbg, "questions"), *gq = json_get(c, "questions");
        assert_int_equal(qs->n, gq->n);
        for (size_t q = 0; q < qs->n; q++) {
            const json_value *sp = json_get(qs->items[q], "question_span"), *gsp = json_get(gq->items[q], "question_span");
            assert_int_equal(tu_int_at(sp, 0), tu_int_at(gsp, 0));
            assert_int_equal(tu_int_at(sp, 1), tu_int_at(gsp, 1));
            const json_value *os = json_get(qs->items[q], "option_spans"), *gos = json_get(gq->items[q], "option_spans");
            assert_int_equal(os->n, gos->n);
            for (size_t j = 0; j < os->n; j++) {
                assert_int_equal(tu_int_at(os->items[j], 0), tu_int_at(gos->items[j], 0));
                assert_int_equal(tu_int_at(os->items[j], 1), tu_int_at(gos->items[j], 1));
            }
            const json_value *lg = json_get(qs->items[q], "logits"), *glg = json_get(gq->items[q], "logits");
            assert_int_equal(lg->n, glg->n);
            for (size_t j = 0; j < lg->n; j++, n_logits++) {
                double d = fabs(tu_num_at(lg, j) - tu_num_at(glg, j));
                if (d > worst) worst = d;
                if (!(d <= 1e-4))
                    fail_msg("%s: question %zu option %zu logit %.7g, reference %.7g", tu_case_name(c), q, j,
                             tu_num_at(lg, j), tu_num_at(glg, j));
            }
        }
        /* the response itself, without the debug block */
        json_value *plain = json_new(JSON_OBJECT);
        for (size_t k = 0; k < resp->n; k++)
            if (strcmp(resp->keys[k], "debug"))
                json_object_set(plain, resp->keys[k], resp->key_lens[k], json_clone(resp->items[k]));
        json_render_opts(plain, 1, &got);
        json_render_opts(json_get(c, "response"), 1, &want);
        if (strcmp(got.data, want.data))
            fail_msg("%s: response %s, reference %s", tu_case_name(c), got.data, want.data);
        json_free(plain);
        json_free(resp);
        clef_buf_free(&body);
        clef_buf_free(&out);
        clef_buf_free(&want);
        clef_buf_free(&got);
    }
    print_message("multimodal engine: 12 responses equal, %zu logits, max |diff| %.3g\n", n_logits, worst);
    assert_int_equal(n_logits, 34);
    clef_engine_close(e);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vision_tower),
        cmocka_unit_test(test_audio_tower),
        cmocka_unit_test(test_engine_responses),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
