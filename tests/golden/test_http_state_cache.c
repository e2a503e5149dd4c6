/* test_http_state_cache.c — `clef serve` with its state cache (on by default):
 * one request with a ~600-token state answered twice, then under a second
 * question set, gives the same answer bytes as a server run with
 * `--state-cache 0`, and /metrics counts the hits, the tokens reused and the
 * bytes held (the cache off: enabled 0, nothing counted).  A malformed
 * --state-cache is a usage error naming the value. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "httputil.h"

/* A body over a state of `turns` deterministic lines, question set k. */
static char *body_of(int turns, int k) {
    clef_buf st = {0}, b = {0};
    for (int t = 0; t < turns; t++)
        clef_buf_printf(&st, "[turn %d] the order %d failed with code E%03d, retry %d.\n", t, 500 + t, (t * 31) % 1000,
                        t % 4);
    clef_buf_puts(&b, "{\"model\":\"clef-omni\",\"state\":");
    json_render_string(st.data, st.len, &b);
    clef_buf_printf(&b,
                    ",\"questions\":{\"team\":{\"type\":\"choice\",\"instructions\":\"Which team, set %d?\","
                    "\"criteria\":{\"billing\":\"Payments\",\"technical\":\"Bugs\"}},"
                    "\"urgent\":{\"type\":\"noul\",\"instructions\":\"Urgent (%d)?\"}}}",
                    k, k);
    clef_buf_free(&st);
    return b.data;
}

/* The answer of `body` without the request id (the whole JSON body). */
static char *answer(hu_server *srv, const char *body) {
    hu_response r;
    hu_post_json(NULL, srv, body, strlen(body), NULL, &r);
    if (r.status != 200) fail_msg("status %ld: %s", r.status, r.body.data ? r.body.data : "");
    char *s = strdup(r.body.data);
    hu_free(&r);
    return s;
}

static void test_metrics_and_answers(void **state) {
    (void)state;
    char *b1 = body_of(40, 1), *b2 = body_of(40, 2);
    hu_server on, off;
    hu_start(&on, NULL, NULL);
    const char *no_cache[] = {"--state-cache", "0", NULL};
    hu_start(&off, no_cache, NULL);
    char *a1 = answer(&on, b1), *a1b = answer(&on, b1), *a2 = answer(&on, b2);
    char *w1 = answer(&off, b1), *w2 = answer(&off, b2);
    assert_string_equal(a1, w1);
    assert_string_equal(a1b, w1);
    assert_string_equal(a2, w2);
    assert_true(strcmp(w1, w2) != 0); /* two question sets: other answers */
    hu_response r;
    hu_get(&on, "/metrics", NULL, &r);
    assert_int_equal(r.status, 200);
    const char *t = r.body.data;
    assert_true(hu_metric(t, "clef_state_cache_enabled") == 1);
    assert_true(hu_metric(t, "clef_state_cache_lookups_total") == 3);
    assert_true(hu_metric(t, "clef_state_cache_hits_total") == 2);
    const double reused = hu_metric(t, "clef_state_cache_tokens_reused_total");
    assert_true(reused >= 2 * 512 && (long)reused % 64 == 0);
    assert_true(hu_metric(t, "clef_state_cache_bytes") > 0);
    assert_true(hu_metric(t, "clef_state_cache_bytes") <= hu_metric(t, "clef_state_cache_capacity_bytes"));
    assert_true(hu_metric(t, "clef_state_cache_capacity_bytes") == (double)((size_t)2 << 30)); /* the default */
    /* no GPU memory budget on the CPU: the placement gauges say so */
    assert_true(hu_metric(t, "clef_gpu_memory_budget_bytes") == 0);
    assert_true(hu_metric(t, "clef_placement_streamed_layers") == 0);
    assert_true(hu_metric(t, "clef_placement_streamed_bytes_per_forward") == 0);
    assert_true(hu_metric(t, "clef_state_cache_blocks") >= 8);
    assert_non_null(strstr(t, "# TYPE clef_state_cache_hits_total counter\n"));
    assert_non_null(strstr(t, "# TYPE clef_state_cache_bytes gauge\n"));
    hu_free(&r);
    hu_get(&off, "/metrics", NULL, &r);
    t = r.body.data;
    assert_true(hu_metric(t, "clef_state_cache_enabled") == 0);
    assert_true(hu_metric(t, "clef_state_cache_hits_total") == 0);
    assert_true(hu_metric(t, "clef_state_cache_bytes") == 0);
    hu_free(&r);
    assert_int_equal(hu_stop(&on), 0);
    assert_int_equal(hu_stop(&off), 0);
    hu_remove_log(&on), hu_remove_log(&off);
    free(a1), free(a1b), free(a2), free(w1), free(w2), free(b1), free(b2);
}

static void test_bad_size(void **state) {
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s serve --model %s/tiny-clef-omni --state-cache 12Q 2>&1", CLEF_BINARY, CLEF_FIXTURES);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char out[4096] = {0};
    size_t n = fread(out, 1, sizeof out - 1, p);
    (void)n;
    int st = pclose(p);
    assert_int_equal(WEXITSTATUS(st), 2);
    assert_non_null(strstr(out, "--state-cache: '12Q' is not a size"));
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_metrics_and_answers), cmocka_unit_test(test_bad_size)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
