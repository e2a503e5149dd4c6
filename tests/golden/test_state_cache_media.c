/* test_state_cache_media.c — the state cache on media states: every
 * multimodal golden request (images, audio, video, mixes) answered by an
 * engine with the cache off and, twice (a fill, then a reuse whose prefix
 * may cover the PREFIX, the media block and the state's first blocks: then
 * the towers do not run), by one with it on: the logits bytewise equal.  The
 * cache keys media states by the SHA-256 of their tensors and by the 3-D
 * positions as well as the ids, so two different images of the same size
 * (the same ids) never share blocks (test_state_cache's test_keys checks
 * that a digest or positions make another key). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "engine/state_cache.h"

static clef_engine *open_engine(const char *dir, size_t cache) {
    clef_engine_options opt = {.model_dir = dir, .n_threads = 2, .truncate_state = 1, .state_cache = cache};
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e) fail_msg("engine: %s", err.message);
    return e;
}

/* Logits of one body (caller frees); *n their count; *reuse_ok the record's cacheable end. */
static float *answer(clef_engine *e, const char *body, size_t len, size_t *n, size_t *media_end) {
    clef_request req;
    clef_job job, *one = &job;
    clef_err err;
    clef_err_clear(&err);
    if (clef_engine_parse(e, body, len, &req, &err) || clef_engine_encode(e, &req, NULL, &job, &err) ||
        clef_engine_run(e, &one, 1, &err))
        fail_msg("%s", err.message);
    *n = clef_record_total_options(&job.rec);
    *media_end = job.rec.media_start + job.rec.media_len;
    float *l = malloc((*n + 1) * sizeof *l);
    memcpy(l, job.logits, *n * sizeof *l);
    clef_job_free(&job);
    return l;
}

static void test_media_states(void **state) {
    (void)state;
    size_t n_cases;
    json_value **cases = tu_load_goldens("goldens/mm_goldens.jsonl.gz", &n_cases);
    char *dir = tu_fixture("tiny-clef-omni");
    clef_engine *off = open_engine(dir, 0), *on = open_engine(dir, (size_t)256 << 20);
    size_t covered = 0;
    for (int pass = 0; pass < 2; pass++) /* pass 0 fills, 1 reuses */
        for (size_t i = 0; i < n_cases; i++) {
            clef_buf body = {0};
            json_render_opts(json_get(cases[i], "request"), 0, &body);
            size_t na, nb, me;
            clef_state_cache_stats before, after;
            clef_engine_state_cache_stats(on, &before);
            float *a = answer(off, body.data, body.len, &na, &me), *b = answer(on, body.data, body.len, &nb, &me);
            clef_engine_state_cache_stats(on, &after);
            assert_int_equal(na, nb);
            if (memcmp(a, b, na * sizeof *a) != 0)
                fail_msg("%s (pass %d): logits differ with the cache on", tu_case_name(cases[i]), pass);
            if (pass && after.tokens_reused - before.tokens_reused >= me) covered++;
            free(a), free(b);
            clef_buf_free(&body);
        }
    clef_state_cache_stats s;
    clef_engine_state_cache_stats(on, &s);
    print_message("%zu media requests x 2: %llu hits, %llu tokens reused, %zu reuses past the media block\n", n_cases,
                  (unsigned long long)s.hits, (unsigned long long)s.tokens_reused, covered);
    assert_int_equal(n_cases, 12);
    /* both ways: the towers skipped (media block inside the reused prefix) and run with some rows reused */
    assert_true(s.hits >= 10);
    assert_true(covered >= 2);
    assert_true(s.hits - covered >= 6);
    clef_engine_close(off), clef_engine_close(on);
    free(dir);
    tu_free_goldens(cases, n_cases);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_media_states)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
