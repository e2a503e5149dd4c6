/* test_state_cache.c — the state cache (engine/state_cache.h) changes no bit
 * of any answer: every request is answered by an engine with the cache off
 * and one with it on, and the logits are compared bytewise (memcmp), on
 *   - the golden requests (each twice on the cached engine: a fill, then a reuse),
 *   - 10 question sets over one ~2,900-token state (9 hits, the state's whole
 *     blocks reused each time),
 *   - a synthetic 20-step growing transcript (each step reuses the previous
 *     step's blocks),
 *   - packed batches mixing cached, new and repeated states,
 *   - a bound of a few blocks (evictions; bytes held never above the bound).
 * Plus the cache's own rules (keys include the media digest and positions; LRU
 * evicts leaves only) and `--state-cache` size parsing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "engine/state_cache.h"

static char *tiny;

static clef_engine *open_engine(size_t cache) {
    clef_engine_options opt = {.model_dir = tiny, .n_threads = 2, .truncate_state = 1, .state_cache = cache};
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e) fail_msg("engine: %s", err.message);
    return e;
}

/* Answer bodies[0..n) in one clef_engine_run (packed); logits[i] owned by the caller, n_logits[i] their count. */
static void run_bodies(clef_engine *e, const char *const *bodies, size_t n, float **logits, size_t *n_logits) {
    clef_job *jobs = calloc(n, sizeof *jobs);
    clef_job **ptr = calloc(n, sizeof *ptr);
    clef_err *errs = calloc(n, sizeof *errs), err;
    clef_err_clear(&err);
    for (size_t i = 0; i < n; i++) {
        clef_request req;
        if (clef_engine_parse(e, bodies[i], strlen(bodies[i]), &req, &err) ||
            clef_engine_encode(e, &req, NULL, &jobs[i], &err))
            fail_msg("request %zu: %s", i, err.message);
        ptr[i] = &jobs[i];
    }
    if (clef_engine_run(e, ptr, n, errs) != 0)
        for (size_t i = 0; i < n; i++)
            if (errs[i].status) fail_msg("request %zu: %s", i, errs[i].message);
    for (size_t i = 0; i < n; i++) {
        n_logits[i] = clef_record_total_options(&jobs[i].rec);
        logits[i] = malloc((n_logits[i] + 1) * sizeof(float));
        memcpy(logits[i], jobs[i].logits, n_logits[i] * sizeof(float));
        clef_job_free(&jobs[i]);
    }
    free(jobs), free(ptr), free(errs);
}

/* Each body alone on `off` and in one packed run on `on`: bytewise equal logits. */
static void check_same(clef_engine *off, clef_engine *on, const char *const *bodies, size_t n, const char *what) {
    float **a = calloc(n, sizeof *a), **b = calloc(n, sizeof *b);
    size_t *na = calloc(n, sizeof *na), *nb = calloc(n, sizeof *nb);
    for (size_t i = 0; i < n; i++) run_bodies(off, &bodies[i], 1, &a[i], &na[i]);
    run_bodies(on, bodies, n, b, nb);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(na[i], nb[i]);
        assert_true(na[i] > 0);
        if (memcmp(a[i], b[i], na[i] * sizeof(float)) != 0)
            fail_msg("%s: request %zu: logits differ with the cache on (%.9g vs %.9g)", what, i, a[i][0], b[i][0]);
        free(a[i]), free(b[i]);
    }
    free(a), free(b), free(na), free(nb);
}

static clef_state_cache_stats stats(clef_engine *e) {
    clef_state_cache_stats s;
    clef_engine_state_cache_stats(e, &s);
    return s;
}

/* A request body over `state` with question set k (names and options vary with k). */
static char *body_of(const char *state, int k) {
    clef_buf b = {0};
    clef_buf_puts(&b, "{\"model\":\"clef-omni\",\"state\":");
    json_render_string(state, strlen(state), &b);
    clef_buf_printf(&b,
                    ",\"questions\":{\"team_%d\":{\"type\":\"choice\",\"instructions\":\"Which team handles case %d?\","
                    "\"criteria\":{\"billing\":\"Payments %d\",\"technical\":\"Bugs %d\",\"sales\":\"Deals\"}},"
                    "\"urgent_%d\":{\"type\":\"noul\",\"instructions\":\"Is step %d urgent?\"},"
                    "\"level\":{\"type\":\"score\",\"criteria\":[\"low\",\"mid %d\",\"high\"]}}}",
                    k, k, k, k, k, k, k);
    return b.data;
}

/* A transcript of `turns` turns (deterministic text, ~40 tokens a turn). */
static char *transcript_of(const char *tag, int turns) {
    clef_buf b = {0};
    clef_buf_puts(&b, tag);
    static const char *const who[] = {"user", "agent", "tool"};
    for (int t = 0; t < turns; t++)
        clef_buf_printf(&b, "[%s %d] The order %d failed at step %d with code E%03d; retrying the payment of %d.%02d "
                            "USD after checking the ledger entry %d.\n",
                        who[t % 3], t, 1000 + 7 * t, t % 5, (t * 37) % 1000, 10 + t, (t * 13) % 100, 90000 + t);
    clef_buf_putc(&b, '\0');
    return b.data;
}

static char *transcript(int turns) { return transcript_of("", turns); }

static void test_goldens(void **state) {
    (void)state;
    size_t n_cases;
    json_value **cases = tu_load_goldens("goldens/goldens.jsonl", &n_cases);
    clef_engine *off = open_engine(0), *on = open_engine((size_t)256 << 20);
    size_t used = 0;
    for (size_t i = 0; i < n_cases; i++) {
        const json_value *c = cases[i];
        if (json_get(c, "error") || !strcmp(tu_case_name(c), "question_id_empty")) continue;
        clef_buf body = {0};
        json_render_opts(json_get(c, "request"), 0, &body);
        const char *two[1] = {body.data};
        check_same(off, on, two, 1, tu_case_name(c)); /* fills */
        check_same(off, on, two, 1, tu_case_name(c)); /* reuses what it filled, if the state spans a block */
        clef_buf_free(&body);
        used++;
    }
    clef_state_cache_stats s = stats(on);
    print_message("goldens: %zu requests twice, %llu hits, %llu tokens reused, %zu bytes held\n", used,
                  (unsigned long long)s.hits, (unsigned long long)s.tokens_reused, s.bytes);
    assert_true(used >= 35);
    assert_true(s.hits >= 5);
    assert_true(s.tokens_reused >= 5 * 64);
    assert_int_equal(s.tokens_reused % 64, 0);
    assert_true(s.bytes > 0 && s.bytes <= s.capacity);
    clef_engine_state_cache_stats(off, &s);
    assert_int_equal(s.lookups, 0);
    assert_null(clef_engine_state_cache_off_reason(on));
    clef_engine_close(off), clef_engine_close(on);
    tu_free_goldens(cases, n_cases);
}

static void test_question_sets(void **state) {
    (void)state;
    clef_engine *off = open_engine(0), *on = open_engine((size_t)256 << 20);
    char *st = transcript(60); /* ~2,900 tokens (clef bench --state-workload times 4,000) */
    char *bodies[10];
    for (int k = 0; k < 10; k++) bodies[k] = body_of(st, k);
    /* the record's state end, for the expected reuse */
    clef_request req;
    clef_job job;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_engine_parse(on, bodies[0], strlen(bodies[0]), &req, &err), 0);
    assert_int_equal(clef_engine_encode(on, &req, NULL, &job, &err), 0);
    const size_t state_end = job.rec.media_start + job.rec.state_tokens_kept;
    assert_true(job.rec.state_tokens_kept > 2000);
    clef_job_free(&job);
    for (int k = 0; k < 10; k++) check_same(off, on, (const char *const *)&bodies[k], 1, "question sets");
    clef_state_cache_stats s = stats(on);
    print_message("10 question sets over a %zu-token state: %llu hits, %llu tokens reused\n", state_end,
                  (unsigned long long)s.hits, (unsigned long long)s.tokens_reused);
    assert_int_equal(s.lookups, 10);
    assert_int_equal(s.hits, 9);
    assert_int_equal(s.tokens_reused, 9 * (state_end / 64 * 64));
    assert_int_equal(s.blocks, state_end / 64);
    /* again, all ten in one packed batch: every one reuses */
    check_same(off, on, (const char *const *)bodies, 10, "question sets packed");
    s = stats(on);
    assert_int_equal(s.hits, 19);
    assert_int_equal(s.tokens_reused, 19 * (state_end / 64 * 64));
    for (int k = 0; k < 10; k++) free(bodies[k]);
    free(st);
    clef_engine_close(off), clef_engine_close(on);
}

/* 20 steps of a growing transcript (`two`: two conversations, growing in
 * turn); `cache` bytes; returns the stats. */
static clef_state_cache_stats run_transcript(clef_engine *off, size_t cache, int check_reuse, int two) {
    clef_engine *on = open_engine(cache);
    uint64_t last = 0;
    for (int step = 1; step <= 20; step++) {
        char *st = two ? transcript_of(step % 2 ? "Chat A.\n" : "Chat B.\n", 3 * ((step + 1) / 2))
                       : transcript(2 * step);
        char *b = body_of(st, step);
        check_same(off, on, (const char *const *)&b, 1, "transcript");
        clef_state_cache_stats s = stats(on);
        if (check_reuse && step > 1) {
            /* the previous step's state (2 turns of >= 35 tokens a step) is a prefix up to its last few tokens */
            if (s.tokens_reused - last < (uint64_t)(2 * (step - 1) * 35 / 64 * 64) - 64)
                fail_msg("step %d reused only %llu tokens", step, (unsigned long long)(s.tokens_reused - last));
        }
        assert_true(s.bytes <= s.capacity);
        last = s.tokens_reused;
        free(b), free(st);
    }
    clef_state_cache_stats s = stats(on);
    clef_engine_close(on);
    return s;
}

static void test_transcript(void **state) {
    (void)state;
    clef_engine *off = open_engine(0);
    clef_state_cache_stats s = run_transcript(off, (size_t)256 << 20, 1, 0);
    print_message("20-step transcript: %llu hits, %llu tokens reused, %zu blocks\n", (unsigned long long)s.hits,
                  (unsigned long long)s.tokens_reused, s.blocks);
    assert_int_equal(s.lookups, 20);
    assert_int_equal(s.hits, 19);
    assert_int_equal(s.evictions, 0);
    clef_engine_close(off);
}

static void test_eviction(void **state) {
    (void)state;
    clef_engine *off = open_engine(0);
    /* block size of the tiny model: 3 layers, 2 KV heads?  measured from an engine */
    clef_engine *probe = open_engine((size_t)64 << 20);
    char *st = transcript(6);
    char *b = body_of(st, 0);
    float *l;
    size_t nl;
    run_bodies(probe, (const char *const *)&b, 1, &l, &nl);
    clef_state_cache_stats p = stats(probe);
    assert_true(p.blocks >= 1);
    const size_t per_block = p.bytes / p.blocks;
    free(l), free(b), free(st);
    clef_engine_close(probe);
    const size_t bound = 5 * per_block + per_block / 2; /* five blocks and a half */
    clef_state_cache_stats s = run_transcript(off, bound, 0, 1);
    print_message("bound %zu bytes (%zu a block): %llu evictions, %llu tokens reused, %zu bytes held\n", bound,
                  per_block, (unsigned long long)s.evictions, (unsigned long long)s.tokens_reused, s.bytes);
    assert_true(s.evictions > 0);
    assert_true(s.bytes <= bound);
    assert_int_equal(s.blocks, 5);
    assert_true(s.hits > 0); /* each conversation's first block survives the other's turn */
    /* a bound below one block: nothing is ever held, answers unchanged */
    s = run_transcript(off, per_block - 1, 0, 1);
    assert_int_equal(s.blocks, 0);
    assert_int_equal(s.bytes, 0);
    assert_int_equal(s.hits, 0);
    clef_engine_close(off);
}

static void test_packed_mixes(void **state) {
    (void)state;
    clef_engine *off = open_engine(0), *on = open_engine((size_t)256 << 20);
    char *s1 = transcript(30), *s2 = transcript(45), *s3 = transcript_of("Another case.\n", 12);
    char *warm = body_of(s1, 1);
    check_same(off, on, (const char *const *)&warm, 1, "warm");
    /* cached (s1), its extension (s2), a new state twice in one batch (s3), a short state (no block) */
    char *bodies[6] = {body_of(s1, 2), body_of(s2, 3), body_of(s3, 4), body_of(s3, 5), body_of("short", 6),
                       body_of(s1, 7)};
    check_same(off, on, (const char *const *)bodies, 6, "packed");
    clef_state_cache_stats s = stats(on);
    assert_int_equal(s.lookups, 7);
    assert_int_equal(s.hits, 3); /* s1 twice and s2 (s1's blocks) */
    /* s3's blocks were filled once (the second copy's were dropped): the next batch reuses them */
    const size_t blocks = s.blocks;
    check_same(off, on, (const char *const *)&bodies[3], 1, "after packed");
    s = stats(on);
    assert_int_equal(s.hits, 4);
    assert_int_equal(s.blocks, blocks);
    for (int i = 0; i < 6; i++) free(bodies[i]);
    free(warm), free(s1), free(s2), free(s3);
    clef_engine_close(off), clef_engine_close(on);
}

/* The cache's rules on its own API, over a CPU backend. */
static void test_keys(void **state) {
    (void)state;
    clef_engine *e = open_engine((size_t)1 << 20);
    clef_backend *be = clef_model_backend(clef_engine_model(e));
    const size_t bf = 16; /* floats a block: the data itself is never read here */
    assert_null(clef_state_cache_new(be, 0, bf));
    int32_t ids[300], pos[900];
    for (int i = 0; i < 300; i++) ids[i] = 100 + i % 37, pos[i] = pos[300 + i] = pos[600 + i] = i;
    uint8_t d1[32] = {1}, d2[32] = {2};
    clef_sc_key k = {.ids = ids, .n_ids = 300, .cacheable = 200};
    clef_sc_plan p;
    /* a block's bytes, measured: then a cache that holds 8 and a half */
    clef_state_cache *c = clef_state_cache_new(be, 1 << 20, bf);
    clef_state_cache_plan(c, &k, 1, &p);
    clef_state_cache_finish(c, &k, &p, 1);
    clef_state_cache_stats s;
    clef_state_cache_stats_get(c, &s);
    assert_int_equal(s.blocks, 3);
    const size_t per = s.bytes / 3;
    assert_true(per >= bf * sizeof(float) + 64 * sizeof(int32_t));
    clef_state_cache_free(c);
    c = clef_state_cache_new(be, 8 * per + per / 2, bf);
    clef_state_cache_plan(c, &k, 1, &p);
    assert_int_equal(p.reuse[0], 0);
    assert_int_equal(p.fill[0], 3); /* 200 / 64 whole blocks */
    clef_state_cache_finish(c, &k, &p, 1);
    clef_state_cache_plan(c, &k, 1, &p);
    assert_int_equal(p.reuse[0], 192);
    assert_int_equal(p.fill[0], 0);
    clef_state_cache_finish(c, &k, &p, 1);
    /* the same ids with explicit positions, or a media digest, are other keys */
    clef_sc_key kp = k, km1 = k, km2 = k;
    kp.positions = pos;
    kp.cacheable = 64; /* one block (a block with positions holds them too: more bytes) */
    km1.digest = d1, km2.digest = d2;
    clef_state_cache_plan(c, &kp, 1, &p);
    assert_int_equal(p.reuse[0], 0);
    clef_state_cache_finish(c, &kp, &p, 0); /* a failed forward adds nothing */
    clef_state_cache_plan(c, &km1, 1, &p);
    assert_int_equal(p.reuse[0], 0);
    clef_state_cache_finish(c, &km1, &p, 1);
    clef_state_cache_plan(c, &km2, 1, &p);
    assert_int_equal(p.reuse[0], 0);
    clef_state_cache_finish(c, &km2, &p, 1);
    clef_state_cache_plan(c, &km1, 1, &p);
    assert_int_equal(p.reuse[0], 192);
    clef_state_cache_finish(c, &km1, &p, 1);
    /* a changed token in block 1: block 0 still reused */
    int32_t ids2[300];
    memcpy(ids2, ids, sizeof ids2);
    ids2[100] = 7;
    clef_sc_key k2 = k;
    k2.ids = ids2;
    clef_state_cache_plan(c, &k2, 1, &p);
    assert_int_equal(p.reuse[0], 64);
    assert_int_equal(p.fill[0], 2);
    clef_state_cache_finish(c, &k2, &p, 1);
    clef_state_cache_stats_get(c, &s);
    assert_true(s.bytes <= s.capacity);
    assert_int_equal(s.blocks, 8); /* the bound holds 8: the least recent leaves went */
    assert_true(s.evictions >= 1);
    /* km1's chain was touched after km2's and k's first: all of it is still there */
    clef_state_cache_plan(c, &km1, 1, &p);
    assert_int_equal(p.reuse[0], 192);
    clef_state_cache_finish(c, &km1, &p, 1);
    clef_state_cache_free(c);
    clef_engine_close(e);
}

static void test_parse_size(void **state) {
    (void)state;
    clef_err err;
    size_t v = 1;
    assert_int_equal(clef_parse_size("--state-cache", "0", &v, &err), 0);
    assert_int_equal(v, 0);
    assert_int_equal(clef_parse_size("--state-cache", "off", &v, &err), 0);
    assert_int_equal(v, 0);
    assert_int_equal(clef_parse_size("--state-cache", "512M", &v, &err), 0);
    assert_int_equal(v, (size_t)512 << 20);
    assert_int_equal(clef_parse_size("--state-cache", "4G", &v, &err), 0);
    assert_int_equal(v, (size_t)4 << 30);
    assert_int_equal(clef_parse_size("--state-cache", "4gib", &v, &err), 0);
    assert_int_equal(v, (size_t)4 << 30);
    assert_int_equal(clef_parse_size("--state-cache", "1000", &v, &err), 0);
    assert_int_equal(v, 1000);
    assert_int_equal(clef_parse_size("--state-cache", "64KB", &v, &err), 0);
    assert_int_equal(v, 65536);
    const char *bad[] = {"", "G", "-1", "4X", "4 G", "1.5G", "99999999999999999999", "16777216T", "4GG"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        clef_err_clear(&err);
        if (clef_parse_size("--state-cache", bad[i], &v, &err) != -1) fail_msg("'%s' was accepted", bad[i]);
        assert_int_equal(err.status, 400);
        assert_non_null(strstr(err.message, "--state-cache"));
    }
}

static int setup(void **state) {
    (void)state;
    tiny = tu_fixture("tiny-clef-omni");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    free(tiny);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_size),  cmocka_unit_test(test_keys),        cmocka_unit_test(test_goldens),
        cmocka_unit_test(test_question_sets), cmocka_unit_test(test_transcript), cmocka_unit_test(test_packed_mixes),
        cmocka_unit_test(test_eviction),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
