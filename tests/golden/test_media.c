/* test_media.c — media preprocessing against the 12 multimodal goldens
 * (SPEC §9, §11 rule 8): grids, feature-mask sums, the media block of
 * input_ids, 3-D positions (exact); pixel tensors bit-exact (numpy pairwise
 * float64 sums to the last digit, first rows bit for bit); log-mel first
 * frames within 1e-4.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decision/encode.h"
#include "decision/request.h"
#include "media/media.h"
#include "media/melspec.h"
#include "media/prompt.h"
#include "text/tokenizer.h"

#define PREFIX_TOKENS 35 /* SPEC §3.5: the media block starts right after PREFIX */

static json_value **cases;
static size_t n_cases;
static clef_tokenizer *tok;

static int setup(void **state) {
    (void)state;
    cases = tu_load_goldens("goldens/mm_goldens.jsonl.gz", &n_cases);
    tok = tu_load_tokenizer();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_free_goldens(cases, n_cases);
    clef_tokenizer_free(tok);
    return 0;
}

/* numpy's pairwise summation (PW_BLOCKSIZE 128, 8 accumulators). */
static double np_pairwise(const double *a, size_t n) {
    if (n < 8) {
        double r = 0.;
        for (size_t i = 0; i < n; i++) r += a[i];
        return r;
    }
    if (n <= 128) {
        double r[8];
        size_t i;
        for (int j = 0; j < 8; j++) r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    size_t n2 = n / 2;
    n2 -= n2 % 8;
    return np_pairwise(a, n2) + np_pairwise(a + n2, n - n2);
}

/* float64 sum of an fp32 tensor as numpy computes x.astype(np.float64).sum(). */
static double f64_sum(const float *x, size_t n) {
    double *d = malloc(sizeof(double) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    double s = np_pairwise(d, n);
    free(d);
    return s;
}

static double num_of(const json_value *c, const char *key) {
    double x;
    const json_value *v = json_get(c, key);
    if (!v || json_as_double(v, &x)) fail_msg("%s: no number %s", tu_case_name(c), key);
    return x;
}

static void check_grids(const json_value *c, const char *key, const clef_grid *g, size_t n) {
    const json_value *media = json_get(c, "media");
    const json_value *v = json_get(media, key);
    size_t want = v ? v->n : 0;
    if (want != n) fail_msg("%s: %zu %s, golden %zu", tu_case_name(c), n, key, want);
    for (size_t i = 0; i < n; i++) {
        const json_value *r = v->items[i];
        int32_t got[3] = {g[i].t, g[i].h, g[i].w};
        for (int k = 0; k < 3; k++)
            if (tu_num_at(r, k) != got[k])
                fail_msg("%s: %s[%zu][%d] = %d, golden %g", tu_case_name(c), key, i, k, got[k], tu_num_at(r, k));
    }
}

/* Grids, second_per_grid, use_audio_in_video and feature-mask sums, exact. */
static void test_grids_and_frames(void **state) {
    (void)state;
    assert_int_equal(n_cases, 12);
    for (size_t ci = 0; ci < n_cases; ci++) {
        const json_value *c = cases[ci];
        clef_media m;
        tu_media_from_golden(c, &m, 0);
        check_grids(c, "image_grid_thw_values", m.image_grids, m.n_images);
        check_grids(c, "video_grid_thw_values", m.video_grids, m.n_videos);
        const json_value *media = json_get(c, "media");
        const json_value *spg = json_get(media, "video_second_per_grid_values");
        for (size_t i = 0; i < m.n_videos; i++) assert_true(tu_num_at(spg, i) == m.video_second_per_grid[i]);
        assert_int_equal(m.use_audio_in_video, json_get(media, "use_audio_in_video")->type == JSON_TRUE);
        const json_value *fams = json_get(c, "feature_attention_mask_sums");
        assert_int_equal(m.n_clips, fams ? fams->n : 0);
        for (size_t k = 0; k < m.n_clips; k++)
            if (tu_num_at(fams, k) != m.feature_lens[k])
                fail_msg("%s: clip %zu has %d frames, golden %g", tu_case_name(c), k, m.feature_lens[k],
                         tu_num_at(fams, k));
        const json_value *feat = json_get(media, "input_features");
        if (feat) assert_int_equal(tu_int_at(feat, 2), m.n_frames);
        clef_media_free(&m);
    }
}

/* The media block (golden input_ids from index 35) and the 3-D positions of
 * the whole golden sequence, exact. */
static void test_media_block_and_positions(void **state) {
    (void)state;
    clef_media_tokens t;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_media_tokens_resolve(tok, &t, &err), 0);
    for (size_t ci = 0; ci < n_cases; ci++) {
        const json_value *c = cases[ci];
        clef_media m;
        tu_media_from_golden(c, &m, 0);
        clef_ids block = {0};
        if (clef_media_prompt_ids(tok, &m, &block, &err)) fail_msg("%s: %s", tu_case_name(c), err.message);
        const json_value *gids = json_get(c, "input_ids");
        size_t n = gids->n;
        assert_true(PREFIX_TOKENS + block.n < n);
        for (size_t i = 0; i < block.n; i++)
            if (tu_int_at(gids, PREFIX_TOKENS + i) != block.v[i])
                fail_msg("%s: media id %zu = %d, golden %lld", tu_case_name(c), i, block.v[i],
                         (long long)tu_int_at(gids, PREFIX_TOKENS + i));
        /* the block ends where the state begins: its last token is the "\n" of the last placeholder */
        assert_int_equal(block.v[block.n - 1], 198);
        int32_t *ids = malloc(sizeof(int32_t) * n), *pos = malloc(sizeof(int32_t) * 3 * n);
        for (size_t i = 0; i < n; i++) ids[i] = (int32_t)tu_int_at(gids, i);
        if (clef_media_positions(ids, n, PREFIX_TOKENS, block.n, &m, &t, pos, &err))
            fail_msg("%s: positions: %s", tu_case_name(c), err.message);
        const json_value *gp = json_get(c, "position_ids");
        assert_int_equal(gp->n, 3);
        for (int a = 0; a < 3; a++) {
            assert_int_equal(gp->items[a]->n, n);
            for (size_t i = 0; i < n; i++)
                if (tu_num_at(gp->items[a], i) != pos[a * n + i])
                    fail_msg("%s: position[%d][%zu] = %d, golden %g", tu_case_name(c), a, i, pos[a * n + i],
                             tu_num_at(gp->items[a], i));
        }
        free(ids);
        free(pos);
        clef_ids_free(&block);
        clef_media_free(&m);
    }
}

/* pixel_values / pixel_values_videos: shapes, float64 pairwise sums equal to
 * the last digit, first rows bit for bit. */
static void test_pixels_bit_exact(void **state) {
    (void)state;
    size_t checked = 0;
    for (size_t ci = 0; ci < n_cases; ci++) {
        const json_value *c = cases[ci];
        clef_media m;
        tu_media_from_golden(c, &m, 1);
        const json_value *media = json_get(c, "media");
        const json_value *shape = json_get(media, "pixel_values");
        if (shape) {
            assert_int_equal(tu_int_at(shape, 0), m.image_rows);
            assert_int_equal(tu_int_at(shape, 1), CLEF_PATCH_DIM);
            double want = num_of(c, "pixel_values_sum");
            double got = f64_sum(m.pixel_values, m.image_rows * CLEF_PATCH_DIM);
            if (got != want) fail_msg("%s: pixel_values sum %.17g, golden %.17g", tu_case_name(c), got, want);
            const json_value *rows = json_get(c, "pixel_values_first_rows");
            assert_int_equal(rows->n, 2);
            for (size_t r = 0; r < 2; r++) {
                assert_int_equal(rows->items[r]->n, CLEF_PATCH_DIM);
                for (size_t k = 0; k < CLEF_PATCH_DIM; k++) {
                    float g = (float)tu_num_at(rows->items[r], k);
                    if (memcmp(&g, &m.pixel_values[r * CLEF_PATCH_DIM + k], sizeof g) != 0)
                        fail_msg("%s: pixel_values[%zu][%zu] = %.9g, golden %.9g", tu_case_name(c), r, k,
                                 m.pixel_values[r * CLEF_PATCH_DIM + k], g);
                }
            }
            checked++;
        }
        shape = json_get(media, "pixel_values_videos");
        if (shape) {
            assert_int_equal(tu_int_at(shape, 0), m.video_rows);
            double want = num_of(c, "pixel_values_videos_sum");
            double got = f64_sum(m.pixel_values_videos, m.video_rows * CLEF_PATCH_DIM);
            if (got != want) fail_msg("%s: pixel_values_videos sum %.17g, golden %.17g", tu_case_name(c), got, want);
            checked++;
        }
        clef_media_free(&m);
    }
    assert_int_equal(checked, 10); /* 6 image cases + 4 video cases */
}

/* input_features[0, :, 0:3] within 1e-4 of the golden; shape exact. */
static void test_log_mel(void **state) {
    (void)state;
    size_t checked = 0;
    double worst = 0;
    for (size_t ci = 0; ci < n_cases; ci++) {
        const json_value *c = cases[ci];
        const json_value *ff = json_get(c, "input_features_first_frames");
        if (!ff) continue;
        clef_media m;
        tu_media_from_golden(c, &m, 1);
        const json_value *shape = json_get(json_get(c, "media"), "input_features");
        assert_int_equal(tu_int_at(shape, 0), m.n_clips);
        assert_int_equal(tu_int_at(shape, 1), CLEF_MEL_BINS);
        assert_int_equal(tu_int_at(shape, 2), m.n_frames);
        assert_int_equal(ff->n, 3);
        for (size_t t = 0; t < 3; t++)
            for (size_t k = 0; k < CLEF_MEL_BINS; k++) {
                double g = tu_num_at(ff->items[t], k), v = m.input_features[k * m.n_frames + t];
                double d = fabs(g - v);
                if (d > worst) worst = d;
                if (!(d <= 1e-4))
                    fail_msg("%s: input_features[0][%zu][%zu] = %.8g, golden %.8g", tu_case_name(c), k, t, v, g);
            }
        checked++;
        clef_media_free(&m);
    }
    print_message("log-mel first frames: %zu cases, max |diff| %.3g\n", checked, worst);
    assert_int_equal(checked, 7);
}

static void check_span(const char *name, const json_value *want, clef_span got) {
    if (tu_int_at(want, 0) != got.start || tu_int_at(want, 1) != got.end)
        fail_msg("%s: span [%d,%d), golden [%lld,%lld)", name, got.start, got.end, (long long)tu_int_at(want, 0),
                 (long long)tu_int_at(want, 1));
}

/* The whole record through decision/request + decision/encode: input_ids
 * (media block included), spans and 3-D positions, exact. */
static void test_encode_records(void **state) {
    (void)state;
    for (size_t ci = 0; ci < n_cases; ci++) {
        const json_value *c = cases[ci];
        clef_buf body = {0};
        json_render_opts(json_get(c, "request"), 0, &body); /* keep question order */
        clef_request req;
        clef_record rec;
        clef_err err;
        clef_err_clear(&err);
        if (clef_request_parse(body.data, body.len, NULL, &req, &err))
            fail_msg("%s: parse: %s", tu_case_name(c), err.message);
        if (clef_encode_record(tok, &req, CLEF_DEFAULT_MAX_LENGTH, 1, &rec, &err))
            fail_msg("%s: encode: %s", tu_case_name(c), err.message);
        const json_value *gids = json_get(c, "input_ids");
        assert_int_equal(rec.n_ids, gids->n);
        for (size_t i = 0; i < rec.n_ids; i++)
            if (rec.input_ids[i] != tu_int_at(gids, i))
                fail_msg("%s: input_ids[%zu] = %d, golden %lld", tu_case_name(c), i, rec.input_ids[i],
                         (long long)tu_int_at(gids, i));
        assert_int_equal(rec.media_start, PREFIX_TOKENS);
        assert_true(rec.media_len > 0);
        const json_value *qs = json_get(c, "questions");
        assert_int_equal(rec.n_questions, qs->n);
        for (size_t q = 0; q < qs->n; q++) {
            check_span(tu_case_name(c), json_get(qs->items[q], "question_span"), rec.questions[q].question);
            const json_value *os = json_get(qs->items[q], "option_spans");
            assert_int_equal(rec.questions[q].n_options, os->n);
            for (size_t j = 0; j < os->n; j++) check_span(tu_case_name(c), os->items[j], rec.questions[q].options[j]);
        }
        const json_value *gp = json_get(c, "position_ids");
        assert_non_null(rec.positions);
        for (int a = 0; a < 3; a++)
            for (size_t i = 0; i < rec.n_ids; i++)
                if (tu_num_at(gp->items[a], i) != rec.positions[a * rec.n_ids + i])
                    fail_msg("%s: positions[%d][%zu] = %d, golden %g", tu_case_name(c), a, i,
                             rec.positions[a * rec.n_ids + i], tu_num_at(gp->items[a], i));
        /* usage.input_tokens of the reference response counts the media tokens */
        int64_t used;
        assert_int_equal(json_as_i64(json_get(json_get(json_get(c, "response"), "usage"), "input_tokens"), &used), 0);
        assert_int_equal(used, rec.n_ids);
        clef_record_free(&rec);
        clef_request_free(&req);
        clef_buf_free(&body);
    }
}

/* Media tokens count toward max_length: the capacity error names the fixed
 * part with the media block in it; and marker tokens in the state are refused. */
static void test_capacity_and_markers(void **state) {
    (void)state;
    const json_value *c = cases[0]; /* image_one: 287 tokens, 64 image pads */
    clef_buf body = {0};
    json_render_opts(json_get(c, "request"), 0, &body);
    clef_request req;
    clef_record rec;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_request_parse(body.data, body.len, NULL, &req, &err), 0);
    assert_int_equal(clef_encode_record(tok, &req, CLEF_DEFAULT_MAX_LENGTH, 1, &rec, &err), 0);
    size_t fixed = rec.n_ids - rec.state_tokens_kept; /* prefix + 67 media ids + schema + suffix */
    assert_int_equal(rec.media_len, 1 + 64 + 1 + 1);
    clef_record_free(&rec);
    assert_int_equal(clef_encode_record(tok, &req, fixed - 1, 1, &rec, &err), -1);
    assert_int_equal(err.status, 422);
    char want[200];
    snprintf(want, sizeof want, "maximum context length: schema requires %zu tokens before state; maximum is %zu",
             fixed, fixed - 1);
    assert_string_equal(err.message, want);
    assert_int_equal(clef_encode_record(tok, &req, fixed, 1, &rec, &err), 0); /* the state is cut to nothing */
    assert_int_equal(rec.n_ids, fixed);
    clef_record_free(&rec);
    clef_request_free(&req);
    clef_buf_free(&body);

    const char *bad = "{\"model\":\"m\",\"state\":\"look <|image_pad|>\",\"questions\":{\"q\":{\"type\":\"noul\"}},"
                      "\"images\":[\"%s\"]}";
    const char *url = json_get(json_get(c, "request"), "images")->items[0]->str;
    size_t n = strlen(bad) + strlen(url);
    char *b = malloc(n);
    snprintf(b, n, bad, url);
    assert_int_equal(clef_request_parse(b, strlen(b), NULL, &req, &err), 0);
    assert_int_equal(clef_encode_record(tok, &req, CLEF_DEFAULT_MAX_LENGTH, 1, &rec, &err), -1);
    assert_int_equal(err.status, 422);
    assert_non_null(strstr(err.message, "media marker token"));
    clef_request_free(&req);
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grids_and_frames),
        cmocka_unit_test(test_media_block_and_positions),
        cmocka_unit_test(test_pixels_bit_exact),
        cmocka_unit_test(test_log_mel),
        cmocka_unit_test(test_encode_records),
        cmocka_unit_test(test_capacity_and_markers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
