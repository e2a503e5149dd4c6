/* HTTP acceptance against a real `clef serve` on 127.0.0.1 (SPEC.md §2, §8,
 * §11): every golden case POSTed gives the golden response (numbers within
 * SPEC §11 rule 5) and the very bytes `clef_engine_decide` gives in-process,
 * or the golden error with its status; /healthz (loading and ready),
 * /v1/models, /metrics, request ids, auth on and off, a pinned model name,
 * and the server's no-truncation default. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clef.h"
#include "decision/answer.h"
#include "httputil.h"
#include "clef_version.h"
#include "testutil.h"

static json_value **cases;
static size_t n_cases;
static clef_engine *engine; /* in-process reference for byte equality */

static int setup(void **state) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    cases = tu_load_goldens("goldens/goldens.jsonl", &n_cases);
    assert_int_equal(n_cases, 49);
    char *dir = tu_fixture("tiny-clef-omni");
    engine = tu_open_engine(dir, 0, 1);
    free(dir);
    return 0;
}

static int teardown(void **state) {
    tu_free_goldens(cases, n_cases);
    clef_engine_close(engine);
    curl_global_cleanup();
    return 0;
}

static int64_t case_max_length(const json_value *c) {
    int64_t m = 64000;
    json_as_i64(json_get(c, "max_length"), &m);
    return m;
}

/* The body to POST: the golden request; the reference cuts long states, so
 * the cases made with a cut ask for it explicitly ("truncate_state": true). */
static void case_body(const json_value *c, clef_buf *body) {
    json_value *req = json_clone(json_get(c, "request"));
    if (!strncmp(tu_case_name(c), "truncate_state", 14))
        json_object_set(req, "truncate_state", 14, json_new(JSON_TRUE));
    json_render_opts(req, 0, body);
    json_free(req);
}

/* ---- SPEC §11 rule 5 comparison ---------------------------------------- */

static int near_boundary(double x) {
    double frac = x * 1e4 - floor(x * 1e4);
    return fabs(frac - 0.5) * 1e-4 <= 1e-5 + 1e-9;
}

/* The golden unrounded value behind a response number (from "probs"). */
static double golden_unrounded(const json_value *gq, const char *field, const char *opt) {
    const json_value *probs = json_get(gq, "probs"), *ids = json_get(gq, "option_ids");
    double acc = 0;
    if (!strcmp(field, "noul")) return tu_num_at(probs, 0);
    if (!strcmp(field, "probabilities")) {
        for (size_t k = 0; k < ids->n; k++)
            if (!strcmp(ids->items[k]->str, opt)) return tu_num_at(probs, k);
        return NAN;
    }
    for (size_t k = 0; k < probs->n; k++)
        acc = !strcmp(field, "score") ? acc + (double)k * tu_num_at(probs, k) : fmax(acc, tu_num_at(probs, k));
    return acc;
}

static int allowances;

static void compare_number(const char *name, const char *field, const char *opt, const json_value *g,
                           const json_value *w, const json_value *gq) {
    double a, b;
    assert_int_equal(json_as_double(g, &a), 0);
    assert_int_equal(json_as_double(w, &b), 0);
    if (a == b) return;
    double u = golden_unrounded(gq, field, opt);
    if (fabs(a - b) <= 1.0001e-4 && !isnan(u) && near_boundary(u)) {
        allowances++;
        return;
    }
    fail_msg("%s: %s%s%s = %.6f over HTTP, golden %.6f (unrounded %.8f)", name, field, opt ? "." : "", opt ? opt : "",
             a, b, u);
}

static void compare_rendered(const char *name, const char *what, const json_value *g, const json_value *w) {
    clef_buf x = {0}, y = {0};
    json_render_opts(g, 0, &x);
    json_render_opts(w, 0, &y);
    if (strcmp(x.data, y.data)) fail_msg("%s: %s = %s over HTTP, golden %s", name, what, x.data, y.data);
    clef_buf_free(&x);
    clef_buf_free(&y);
}

static void compare_response(const json_value *c, const json_value *got) {
    const char *name = tu_case_name(c);
    const json_value *want = json_get(c, "response");
    assert_int_equal(got->type, JSON_OBJECT);
    assert_int_equal(got->n, 3);
    assert_string_equal(got->keys[0], "model");
    assert_string_equal(got->keys[1], "answers");
    assert_string_equal(got->keys[2], "usage");
    compare_rendered(name, "model", json_get(got, "model"), json_get(want, "model"));
    compare_rendered(name, "usage", json_get(got, "usage"), json_get(want, "usage"));
    const json_value *ga = json_get(got, "answers"), *wa = json_get(want, "answers");
    assert_int_equal(ga->n, wa->n);
    for (size_t q = 0; q < wa->n; q++) {
        assert_string_equal(ga->keys[q], wa->keys[q]);
        const json_value *gq = tu_golden_question(c, wa->keys[q]), *g = ga->items[q], *w = wa->items[q];
        assert_int_equal(g->n, w->n);
        for (size_t f = 0; f < w->n; f++) {
            const char *key = w->keys[f];
            assert_string_equal(g->keys[f], key);
            if (!strcmp(key, "probabilities")) {
                assert_int_equal(g->items[f]->n, w->items[f]->n);
                for (size_t k = 0; k < w->items[f]->n; k++) {
                    assert_string_equal(g->items[f]->keys[k], w->items[f]->keys[k]);
                    compare_number(name, key, w->items[f]->keys[k], g->items[f]->items[k], w->items[f]->items[k], gq);
                }
            } else if (!strcmp(key, "noul") || !strcmp(key, "score") || !strcmp(key, "confidence")) {
                compare_number(name, key, NULL, g->items[f], w->items[f], gq);
            } else {
                compare_rendered(name, key, g->items[f], w->items[f]);
            }
        }
    }
}

/* Status the project gives each golden error (SPEC §2.2 table). */
static long expected_error_status(const char *name) {
    static const char *const bad_request[] = {"err_missing_model", "err_model_not_string", "err_missing_state",
                                              "err_questions_list"};
    for (size_t i = 0; i < sizeof bad_request / sizeof *bad_request; i++)
        if (!strcmp(name, bad_request[i])) return 400;
    return 422;
}

static void check_error(const json_value *c, const hu_response *r) {
    const char *name = tu_case_name(c);
    clef_err perr;
    json_value *body = json_parse(r->body.data, r->body.len, &perr);
    if (!body) fail_msg("%s: error body is not JSON: %s", name, r->body.data);
    const json_value *e = json_get(body, "error");
    assert_non_null(e);
    const char *msg = json_get(e, "message")->str, *type = json_get(e, "type")->str;
    assert_non_null(json_get(e, "param"));
    char want[600];
    if (!strcmp(name, "question_id_empty")) {
        snprintf(want, sizeof want, "\"\": question instructions render to no tokens; give non-empty instructions "
                                    "or a non-empty question id");
        assert_string_equal(json_get(e, "param")->str, "questions");
    } else {
        const char *g = json_get(c, "error")->str;
        if (!strncmp(g, "ValueError: ", 12)) g += 12;
        snprintf(want, sizeof want, "%s%s", !strcmp(name, "schema_too_long") ? "maximum context length: " : "", g);
    }
    if (strcmp(msg, want)) fail_msg("%s: message '%s', golden '%s'", name, msg, want);
    long status = expected_error_status(name);
    if (r->status != status) fail_msg("%s: status %ld, expected %ld", name, r->status, status);
    assert_string_equal(type, !strcmp(name, "schema_too_long") ? "capacity_exceeded" : "invalid_request");
    assert_string_equal(r->content_type, "application/json");
    json_free(body);
}

/* The in-process single-request answer for the same body. */
static void decide_alone(const json_value *c, const clef_buf *body, clef_buf *out) {
    clef_decide_params p = {.max_length = (size_t)case_max_length(c), .truncate_state = -1};
    clef_err err;
    clef_err_clear(&err);
    if (clef_engine_decide(engine, body->data, body->len, &p, out, &err) != 0)
        fail_msg("%s: in-process decide failed: %s", tu_case_name(c), err.message);
}

/* One server per max_length the goldens use (64000, 300, 250, 200). */
static void test_golden_cases(void **state) {
    int64_t lengths[8];
    size_t n_lengths = 0;
    for (size_t i = 0; i < n_cases; i++) {
        int64_t m = case_max_length(cases[i]);
        size_t k = 0;
        while (k < n_lengths && lengths[k] != m) k++;
        if (k == n_lengths) lengths[n_lengths++] = m;
    }
    int answered = 0, rejected = 0;
    for (size_t L = 0; L < n_lengths; L++) {
        char ml[32];
        snprintf(ml, sizeof ml, "%lld", (long long)lengths[L]);
        const char *args[] = {"--max-length", ml, NULL};
        hu_server srv;
        hu_start(&srv, args, NULL);
        CURL *curl = curl_easy_init();
        for (size_t i = 0; i < n_cases; i++) {
            const json_value *c = cases[i];
            if (case_max_length(c) != lengths[L]) continue;
            clef_buf body = {0};
            case_body(c, &body);
            hu_response r;
            hu_post_json(curl, &srv, body.data, body.len, NULL, &r);
            assert_int_equal(r.curl_code, CURLE_OK);
            if (json_get(c, "error") || !strcmp(tu_case_name(c), "question_id_empty")) {
                check_error(c, &r);
                rejected++;
            } else {
                if (r.status != 200) fail_msg("%s: status %ld: %s", tu_case_name(c), r.status, r.body.data);
                clef_err perr;
                json_value *got = json_parse(r.body.data, r.body.len, &perr);
                if (!got) fail_msg("%s: response is not JSON: %s", tu_case_name(c), r.body.data);
                compare_response(c, got);
                json_free(got);
                clef_buf alone = {0};
                decide_alone(c, &body, &alone);
                if (strcmp(alone.data, r.body.data))
                    fail_msg("%s: HTTP answer differs from the in-process answer:\n%s\n%s", tu_case_name(c),
                             r.body.data, alone.data);
                clef_buf_free(&alone);
                answered++;
            }
            hu_free(&r);
            clef_buf_free(&body);
        }
        curl_easy_cleanup(curl);
        assert_int_equal(hu_stop(&srv), 0);
        hu_remove_log(&srv);
    }
    printf("over HTTP: answered %d, rejected %d, rounding allowances %d\n", answered, rejected, allowances);
    assert_int_equal(answered, 38);
    assert_int_equal(rejected, 11);
}

/* /healthz, /v1/models, /metrics, request ids, unknown routes, methods. */
static void test_routes(void **state) {
    hu_server srv;
    hu_start(&srv, NULL, NULL);
    hu_response r;

    hu_get(&srv, "/healthz", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body.data, "{\"status\":\"ok\"}");
    assert_string_equal(r.content_type, "application/json");
    assert_int_equal(strlen(r.request_id), 16); /* generated */
    hu_free(&r);

    /* the served name ("clef-omni" when none is pinned), not the directory's;
     * the fixture's config.json records no release date: null */
    hu_get(&srv, "/v1/models", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body.data, "{\"object\":\"list\",\"data\":[{\"id\":\"clef-omni\",\"object\":\"model\","
                                     "\"owned_by\":\"clef\",\"capabilities\":[\"systemone\"]}],\"models\":[{\"name\":"
                                     "\"clef-omni\",\"description\":\"Clef-Omni typed-decision model (SystemOne API), "
                                     "served by clef\",\"release_date\":null}]}");
    hu_free(&r);

    /* one decision, with the client's request id echoed */
    const json_value *triage = json_get(cases[0], "request");
    clef_buf body = {0};
    json_render_opts(triage, 0, &body);
    const char *rid[] = {"X-Request-Id: trace-42/abc", NULL};
    hu_post_json(NULL, &srv, body.data, body.len, rid, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.request_id, "trace-42/abc");
    assert_non_null(strstr(r.body.data, "\"usage\":{\"input_tokens\":295,\"output_tokens\":0}"));
    hu_free(&r);
    /* charset parameter accepted */
    const char *h_utf8[] = {"Content-Type: application/json; charset=UTF-8", NULL};
    hu_request_on(NULL, &srv, "POST", "/v1/systemone", h_utf8, body.data, body.len, 0, 30, &r);
    assert_int_equal(r.status, 200);
    hu_free(&r);
    clef_buf_free(&body);

    hu_get(&srv, "/metrics", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.content_type, "text/plain"));
    const char *t = r.body.data;
    assert_true(hu_metric(t, "clef_requests_total{route=\"/v1/systemone\",status=\"200\"}") == 2);
    assert_true(hu_metric(t, "clef_requests_total{route=\"/healthz\",status=\"200\"}") >= 2);
    assert_true(hu_metric(t, "clef_request_duration_seconds_count{route=\"/v1/systemone\"}") == 2);
    assert_true(hu_metric(t, "clef_request_duration_seconds_bucket{route=\"/v1/systemone\",le=\"+Inf\"}") == 2);
    assert_true(hu_metric(t, "clef_tokens_processed_total") == 590);
    assert_true(hu_metric(t, "clef_records_processed_total") == 2);
    assert_true(hu_metric(t, "clef_batch_records_count") >= 1);
    assert_true(hu_metric(t, "clef_queue_depth") == 0);
    assert_true(hu_metric(t, "clef_model_loaded") == 1);
    assert_true(hu_metric(t, "clef_model_load_seconds") > 0);
    assert_non_null(strstr(t, "# TYPE clef_request_duration_seconds histogram\n"));
    /* what answers: the binary (its version, commit and GPU architectures) and the device's kernel
     * path; the tests run the server on the CPU (CLEF_DEVICE=cpu) */
    char build[256];
    snprintf(build, sizeof build, "clef_build_info{version=\"%s\",commit=\"%s\",cuda_archs=\"%s\"} 1\n", CLEF_VERSION,
             CLEF_COMMIT, CLEF_CUDA_ARCH_LIST);
    assert_non_null(strstr(t, build));
    assert_non_null(strstr(t, "clef_device_info{path=\"cpu\",detail=\"\"} 1\n"));
    hu_free(&r);

    hu_get(&srv, "/nope", NULL, &r);
    assert_int_equal(r.status, 404);
    assert_non_null(strstr(r.body.data, "\"type\":\"invalid_request\""));
    hu_free(&r);
    hu_get(&srv, "/v1/systemone", NULL, &r);
    assert_int_equal(r.status, 405);
    assert_string_equal(r.allow, "POST");
    assert_non_null(strstr(r.body.data, "{\"error\":{\"message\":\"method GET is not allowed"));
    hu_free(&r);
    hu_request_on(NULL, &srv, "DELETE", "/healthz", NULL, NULL, 0, 0, 30, &r);
    assert_int_equal(r.status, 405);
    hu_free(&r);

    /* the access log has one line per request */
    assert_int_equal(hu_stop(&srv), 0);
    char *log = hu_log(&srv);
    assert_non_null(strstr(log, "\"POST /v1/systemone\" 200 tokens=295 ms="));
    assert_non_null(strstr(log, "id=trace-42/abc\n"));
    assert_non_null(strstr(log, "\"GET /nope\" 404 tokens=0"));
    assert_non_null(strstr(log, "clef serve: stopped"));
    free(log);
    hu_remove_log(&srv);
}

/* While the model loads: /healthz 503 loading, decisions 503 with
 * Retry-After, /metrics says not loaded. */
static void test_loading(void **state) {
    setenv("CLEF_SERVE_TEST_LOAD_DELAY_MS", "1500", 1);
    hu_server srv;
    hu_start_nowait(&srv, NULL, NULL);
    unsetenv("CLEF_SERVE_TEST_LOAD_DELAY_MS");
    hu_response r;
    hu_get(&srv, "/healthz", NULL, &r);
    assert_int_equal(r.status, 503);
    assert_string_equal(r.body.data, "{\"status\":\"loading\"}");
    assert_string_equal(r.retry_after, "1");
    hu_free(&r);
    hu_post_json(NULL, &srv, "{}", 2, NULL, &r);
    assert_int_equal(r.status, 503);
    assert_string_equal(r.retry_after, "1");
    assert_non_null(strstr(r.body.data, "\"type\":\"model_loading\""));
    hu_free(&r);
    hu_get(&srv, "/metrics", NULL, &r);
    assert_true(hu_metric(r.body.data, "clef_model_loaded") == 0);
    hu_free(&r);
    hu_wait_ready(&srv);
    hu_get(&srv, "/healthz", NULL, &r);
    assert_int_equal(r.status, 200);
    hu_free(&r);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);
}

/* A copy of the tiny checkpoint in a temporary directory (symlinks) whose
 * config.json gets `"release_date": <date_json>` as its first key.  Returns
 * the directory (caller frees after remove_checkpoint_copy). */
static char *checkpoint_with_release_date(const char *date_json) {
    char *dir = strdup("/tmp/clef-models-XXXXXX");
    assert_non_null(mkdtemp(dir));
    char *src = tu_fixture("tiny-clef-omni");
    const char *files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json", "joint_head.safetensors", "joint_head_config.json",
                           "tokenizer.json"};
    char from[2048], to[2048];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(from, sizeof from, "%s/%s", src, files[i]);
        snprintf(to, sizeof to, "%s/%s", dir, files[i]);
        assert_int_equal(symlink(from, to), 0);
    }
    snprintf(from, sizeof from, "%s/config.json", src);
    size_t len;
    char *cfg = tu_read_file(from, &len);
    char *brace = strchr(cfg, '{');
    assert_non_null(brace);
    snprintf(to, sizeof to, "%s/config.json", dir);
    FILE *f = fopen(to, "w");
    assert_non_null(f);
    fprintf(f, "{\"release_date\": %s,%s", date_json, brace + 1);
    fclose(f);
    free(cfg);
    free(src);
    return dir;
}

static void remove_checkpoint_copy(const char *dir) {
    const char *files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json", "joint_head.safetensors", "joint_head_config.json",
                           "tokenizer.json", "config.json"};
    char p[2048];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* /v1/models lists the served name and the release date the checkpoint
 * records (config.json "release_date"); a date of another shape is null. */
static void test_models_listing(void **state) {
    char *dir = checkpoint_with_release_date("\"2025-09-22\"");
    const char *args[] = {"--model", dir, "--served-model-name", "jev-1.13.0", NULL};
    hu_server srv;
    hu_start(&srv, args, NULL);
    hu_response r;
    hu_get(&srv, "/v1/models", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body.data, "{\"object\":\"list\",\"data\":[{\"id\":\"jev-1.13.0\",\"object\":\"model\","
                                     "\"owned_by\":\"clef\",\"capabilities\":[\"systemone\"]}],\"models\":[{\"name\":"
                                     "\"jev-1.13.0\",\"description\":\"Clef-Omni typed-decision model (SystemOne API), "
                                     "served by clef\",\"release_date\":\"2025-09-22\"}]}");
    hu_free(&r);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);
    remove_checkpoint_copy(dir);
    free(dir);

    dir = checkpoint_with_release_date("\"22.09.2025\"");
    const char *args2[] = {"--model", dir, NULL};
    hu_start(&srv, args2, NULL);
    hu_get(&srv, "/v1/models", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body.data, "\"models\":[{\"name\":\"clef-omni\","));
    assert_non_null(strstr(r.body.data, ",\"release_date\":null}]}"));
    hu_free(&r);
    char *log = hu_log(&srv);
    assert_non_null(strstr(log, "config.json: release_date is not a YYYY-MM-DD string; /v1/models lists null"));
    free(log);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);
    remove_checkpoint_copy(dir);
    free(dir);
}

/* The value of `name` in the environment of process `pid` (/proc), or "" (caller frees). */
static char *process_env(pid_t pid, const char *name) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    FILE *f = fopen(path, "rb"); /* a /proc file has no size to stat: read it to the end */
    assert_non_null(f);
    clef_buf b = {0};
    char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) clef_buf_append(&b, chunk, got);
    fclose(f);
    clef_buf_putc(&b, '\0');
    char *env = b.data;
    size_t len = b.len - 1;
    size_t n = strlen(name);
    char *value = strdup("");
    for (size_t at = 0; at < len; at += strlen(env + at) + 1)
        if (!strncmp(env + at, name, n) && env[at + n] == '=') {
            free(value);
            value = strdup(env + at + n + 1);
        }
    free(env);
    return value;
}

/* `clef serve` runs libgomp with OMP_WAIT_POLICY=passive (re-executed with it,
 * same pid) unless the environment already sets the policy or a spin count. */
static void test_wait_policy(void **state) {
    const char *vars[] = {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"};
    char *saved[2];
    for (size_t i = 0; i < 2; i++) {
        saved[i] = getenv(vars[i]) ? strdup(getenv(vars[i])) : NULL;
        unsetenv(vars[i]);
    }
    struct {
        const char *set_name, *set_value, *want_policy;
    } runs[] = {{NULL, NULL, "passive"}, {"OMP_WAIT_POLICY", "active", "active"}, {"GOMP_SPINCOUNT", "300000", ""}};
    for (size_t i = 0; i < 3; i++) {
        if (runs[i].set_name) setenv(runs[i].set_name, runs[i].set_value, 1);
        hu_server srv;
        hu_start(&srv, NULL, NULL); /* waits for /healthz 200 from the tracked pid's server */
        char *policy = process_env(srv.pid, "OMP_WAIT_POLICY");
        if (strcmp(policy, runs[i].want_policy))
            fail_msg("run %zu: OMP_WAIT_POLICY='%s', want '%s'", i, policy, runs[i].want_policy);
        free(policy);
        assert_int_equal(hu_stop(&srv), 0); /* the signal reaches the server: same pid */
        hu_remove_log(&srv);
        if (runs[i].set_name) unsetenv(runs[i].set_name);
    }
    for (size_t i = 0; i < 2; i++)
        if (saved[i]) {
            setenv(vars[i], saved[i], 1);
            free(saved[i]);
        }
}

/* Auth on (flag and env) and a pinned model name. */
static void test_auth_and_served_name(void **state) {
    const char *args[] = {"--api-key", "s3cret-key", "--served-model-name", "clef-omni", NULL};
    hu_server srv;
    hu_start(&srv, args, NULL);
    hu_response r;
    const char *good[] = {"Authorization: Bearer s3cret-key", NULL};
    const char *wrong[] = {"Authorization: Bearer s3cret-kez", NULL};
    const char *longer[] = {"Authorization: Bearer s3cret-key-and-more", NULL};
    const char *basic[] = {"Authorization: Basic s3cret-key", NULL};

    hu_get(&srv, "/healthz", NULL, &r); /* open */
    assert_int_equal(r.status, 200);
    hu_free(&r);
    const char *const *bad_sets[] = {NULL, wrong, longer, basic};
    const char *paths[] = {"/v1/models", "/metrics"};
    for (size_t p = 0; p < 2; p++) {
        for (size_t b = 0; b < 4; b++) {
            hu_get(&srv, paths[p], bad_sets[b], &r);
            if (r.status != 401) fail_msg("%s with credentials #%zu: %ld", paths[p], b, r.status);
            assert_non_null(strstr(r.body.data, "{\"error\":{\"message\":\"missing or invalid API key"));
            hu_free(&r);
        }
        hu_get(&srv, paths[p], good, &r);
        assert_int_equal(r.status, 200);
        hu_free(&r);
    }
    clef_buf body = {0};
    json_render_opts(json_get(cases[0], "request"), 0, &body); /* model "clef-omni" */
    hu_post_json(NULL, &srv, body.data, body.len, NULL, &r);
    assert_int_equal(r.status, 401);
    hu_free(&r);
    hu_post_json(NULL, &srv, body.data, body.len, good, &r);
    assert_int_equal(r.status, 200);
    hu_free(&r);
    hu_get(&srv, "/v1/models", good, &r);
    assert_non_null(strstr(r.body.data, "\"name\":\"clef-omni\""));
    hu_free(&r);
    /* a model the server does not serve */
    const char *other = "{\"model\":\"jev-latest\",\"state\":\"x\",\"questions\":{\"q\":{\"type\":\"noul\"}}}";
    hu_post_json(NULL, &srv, other, strlen(other), good, &r);
    assert_int_equal(r.status, 404);
    assert_string_equal(r.body.data, "{\"error\":{\"message\":\"model 'jev-latest' is not served here; this server "
                                     "serves 'clef-omni'\",\"type\":\"invalid_request\",\"param\":\"model\"}}");
    hu_free(&r);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);

    /* key from the environment; no pinned name: any model string is echoed */
    hu_start(&srv, NULL, "env-key");
    hu_post_json(NULL, &srv, other, strlen(other), NULL, &r);
    assert_int_equal(r.status, 401);
    hu_free(&r);
    const char *env_good[] = {"Authorization: bearer   env-key", NULL};
    hu_post_json(NULL, &srv, other, strlen(other), env_good, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body.data, "{\"model\":\"jev-latest\",\"answers\":"));
    hu_free(&r);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);

    /* auth off: no header needed */
    hu_start(&srv, NULL, NULL);
    hu_post_json(NULL, &srv, body.data, body.len, NULL, &r);
    assert_int_equal(r.status, 200);
    hu_free(&r);
    hu_get(&srv, "/v1/models", wrong, &r);
    assert_int_equal(r.status, 200);
    hu_free(&r);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);
    clef_buf_free(&body);
}

/* The server refuses over-long records unless asked to cut (SPEC §2.2 rule
 * 11); --truncate-state makes the reference's cut the default. */
static void test_truncation_default(void **state) {
    const json_value *c = NULL;
    for (size_t i = 0; i < n_cases; i++)
        if (!strcmp(tu_case_name(cases[i]), "truncate_state")) c = cases[i];
    assert_non_null(c);
    clef_buf body = {0};
    json_render_opts(json_get(c, "request"), 0, &body); /* no truncate_state field */
    const char *args[] = {"--max-length", "300", NULL};
    hu_server srv;
    hu_start(&srv, args, NULL);
    hu_response r;
    hu_post_json(NULL, &srv, body.data, body.len, NULL, &r);
    assert_int_equal(r.status, 422);
    assert_non_null(strstr(r.body.data, "{\"error\":{\"message\":\"maximum context length: record requires "));
    assert_non_null(strstr(r.body.data, " tokens; maximum is 300\",\"type\":\"capacity_exceeded\""));
    hu_free(&r);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);

    const char *args_cut[] = {"--max-length", "300", "--truncate-state", NULL};
    hu_start(&srv, args_cut, NULL);
    hu_post_json(NULL, &srv, body.data, body.len, NULL, &r);
    assert_int_equal(r.status, 200);
    clef_err perr;
    json_value *got = json_parse(r.body.data, r.body.len, &perr);
    assert_non_null(got);
    compare_response(c, got);
    json_free(got);
    hu_free(&r);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);
    clef_buf_free(&body);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_cases),
        cmocka_unit_test(test_routes),
        cmocka_unit_test(test_models_listing),
        cmocka_unit_test(test_wait_policy),
        cmocka_unit_test(test_loading),
        cmocka_unit_test(test_auth_and_served_name),
        cmocka_unit_test(test_truncation_default),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
