/* test_http_synthetic.c — `clef serve --synthetic P --seed N --quant F`: a
 * server over random weights drawn (and quantized) in memory, no files
 * (issue 4: bench and serve accept --synthetic).  Its answers are the very
 * bytes an in-process engine on the same synthetic model gives, and
 * /v1/models names the synthetic model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clef.h"
#include "httputil.h"
#include "testutil.h"

static const char *REQ =
    "{\"model\":\"clef-omni\",\"state\":\"The parcel arrived crushed and the invoice is wrong.\","
    "\"questions\":{\"team\":{\"type\":\"choice\",\"instructions\":\"Which team?\","
    "\"criteria\":{\"billing\":\"Payments\",\"shipping\":\"Deliveries\",\"other\":null}},"
    "\"urgent\":{\"type\":\"noul\",\"instructions\":\"Is it urgent?\"},"
    "\"severity\":{\"type\":\"score\",\"instructions\":\"How bad is it?\",\"criteria\":[\"Can wait\",\"This week\",\"Today\"]}}}";

static void test_serve_synthetic(void **state) {
    (void)state;
    char *tok = tu_fixture("tiny-clef-omni/tokenizer.json");
    /* in-process reference: the same preset, seed and format */
    clef_engine_options opt = {.synthetic = "tiny", .seed = 7, .synthetic_quant = "int4", .tokenizer = tok,
                               .device = "cpu", .n_threads = 1};
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e) fail_msg("cannot open synthetic tiny int4: %s", err.message);
    clef_buf want = {0};
    if (clef_engine_decide(e, REQ, strlen(REQ), NULL, &want, &err) != 0) fail_msg("decide: %s", err.message);

    const char *args[] = {"--synthetic", "tiny", "--seed", "7", "--quant", "int4", "--tokenizer", tok,
                          "--device", "cpu", NULL};
    hu_server srv;
    hu_start(&srv, args, NULL);
    hu_response r;
    hu_post_json(NULL, &srv, REQ, strlen(REQ), NULL, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body.len, want.len);
    assert_memory_equal(r.body.data, want.data, want.len);
    hu_free(&r);
    hu_get(&srv, "/v1/models", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body.data, "\"name\":\"clef-omni\",\"description\":\"Clef-Omni typed-decision model "
                                        "(SystemOne API), served by clef; random weights of synthetic preset tiny, "
                                        "experts int4\",\"release_date\":null}"));
    hu_free(&r);
    char *log = hu_log(&srv);
    assert_non_null(strstr(log, "loading from synthetic preset tiny"));
    free(log);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);

    /* another seed answers differently (the seed reaches the generator) */
    clef_engine_options o2 = opt;
    o2.seed = 8;
    clef_engine *e2 = clef_engine_open(&o2, &err);
    if (!e2) fail_msg("cannot open synthetic tiny int4 seed 8: %s", err.message);
    clef_buf other = {0};
    if (clef_engine_decide(e2, REQ, strlen(REQ), NULL, &other, &err) != 0) fail_msg("decide: %s", err.message);
    assert_false(other.len == want.len && memcmp(other.data, want.data, want.len) == 0);

    clef_buf_free(&want), clef_buf_free(&other);
    clef_engine_close(e), clef_engine_close(e2);
    free(tok);
}

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_serve_synthetic)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
