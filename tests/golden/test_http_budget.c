/* The server's memory budgets against a real `clef serve` (issue 15):
 *
 *  - decoded media: N_BOMBS concurrent requests, each one 4000 x 4000 16-bit
 *    RGBA PNG of one colour (~190 KB; ~176 MB to decode), with a 256 MiB
 *    media budget: every request is answered 200 or 503 "overloaded" JSON
 *    with Retry-After (no 500, no reset), at least one 200, and the server's
 *    peak RSS stays under its RSS before the burst + the budget + SLACK;
 *  - request bodies: N_BODIES concurrent 8 MiB bodies uploaded slowly, with
 *    a 17 MiB body budget: 200 or 503 JSON only, at least two 200s (two
 *    bodies fit), and peak RSS under base + the budget + SLACK;
 *  - a chunked body whose buffer must grow while another upload holds the
 *    body budget: its connection waits (suspended, the upload paused) and is
 *    admitted when the holder goes, or refused with the budget's 503 after
 *    --budget-wait-ms (read to its end first);
 *  - both servers answer a normal request afterwards, and /metrics shows the
 *    budgets empty again with as many refusals as 503s.
 *
 * SLACK (64 MiB) is what the budgets do not hold: the engine thread's one
 * media record at a time (the towers' copy of its 25 MB of pixel_values),
 * the parse trees of the bodies being parsed, the connection threads'
 * stacks and malloc arenas.  Without the budgets the peaks are ~1 GB (media:
 * N_BOMBS x 176 MB) and ~base + 128 MiB (bodies: N_BODIES x 8 MiB), far over
 * these bounds.  Every wait is bounded; the test takes ~15 s. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "httputil.h"
#include "pngbomb.h"
#include "rawhttp.h"
#include "testutil.h"

#define N_BOMBS 6
#define BOMB_SIDE 4000
#define MEDIA_BUDGET_MB 256
#define N_BODIES 16
#define BODY_MB 8
#define BODY_BUDGET_MB 17 /* two bodies of 8 MiB + 1 (the buffer's NUL) fit, three do not */
#define SLACK_MIB 64

static const char SMALL_REQUEST[] =
    "{\"model\":\"m\",\"state\":\"Our checkout is down.\",\"questions\":{\"q\":{\"type\":\"noul\","
    "\"instructions\":\"Is a service down?\"}}}";

/* VmHWM / VmRSS of the server in KiB. */
static long status_kib(const hu_server *s, const char *key) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)s->pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    long kib = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) kib = strtol(line + n, NULL, 10);
    fclose(f);
    return kib;
}

static void expect_small_request_ok(const hu_server *srv) {
    hu_response r;
    hu_post_json(NULL, srv, SMALL_REQUEST, strlen(SMALL_REQUEST), NULL, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body.data, "\"answers\":{\"q\":{\"type\":\"noul\""));
    hu_free(&r);
}

static double metric(const hu_server *srv, const char *series) {
    hu_response r;
    hu_get(srv, "/metrics", NULL, &r);
    assert_int_equal(r.status, 200);
    double v = hu_metric(r.body.data, series);
    hu_free(&r);
    return v;
}

/* ---- decoded media ------------------------------------------------------ */

typedef struct bomb_client {
    const hu_server *srv;
    const char *body;
    size_t len;
    hu_response resp;
} bomb_client;

static void *bomb_thread(void *arg) {
    bomb_client *c = arg;
    hu_request_on(NULL, c->srv, "POST", "/v1/systemone", (const char *const[]){"Content-Type: application/json", NULL},
                  c->body, c->len, 0, 180, &c->resp);
    return NULL;
}

static void test_media_budget(void **state) {
    (void)state;
    clef_buf png = pb_png_rgba16(BOMB_SIDE, BOMB_SIDE);
    char *url = pb_data_url("image/png", png.data, png.len);
    /* The charge the server will compute for it (default limits). */
    clef_media_item item = {url, strlen(url)};
    clef_media_source src = {.images = &item, .n_images = 1};
    size_t charge;
    clef_err err;
    assert_int_equal(clef_media_charge_bytes(&src, NULL, &charge, &err), 0);
    clef_buf body = {0};
    clef_buf_printf(&body,
                    "{\"model\":\"m\",\"state\":\"What does the picture show?\",\"questions\":{\"q\":{\"type\":\"noul\","
                    "\"instructions\":\"Is it blue?\"}},\"images\":[\"%s\"]}",
                    url);
    printf("decode bomb: %ux%u RGBA16 PNG of %zu bytes, body %zu bytes, charged %zu bytes\n", BOMB_SIDE, BOMB_SIDE,
           png.len, body.len, charge);

    hu_server srv;
    char budget[16];
    snprintf(budget, sizeof budget, "%d", MEDIA_BUDGET_MB);
    hu_start(&srv, (const char *const[]){"--media-budget-mb", budget, NULL}, NULL);
    expect_small_request_ok(&srv);
    long base = status_kib(&srv, "VmRSS:"), hwm0 = status_kib(&srv, "VmHWM:");

    bomb_client c[N_BOMBS];
    pthread_t t[N_BOMBS];
    double t0 = hu_now();
    for (int i = 0; i < N_BOMBS; i++) {
        c[i] = (bomb_client){&srv, body.data, body.len, {0}};
        assert_int_equal(pthread_create(&t[i], NULL, bomb_thread, &c[i]), 0);
    }
    for (int i = 0; i < N_BOMBS; i++) pthread_join(t[i], NULL);
    double secs = hu_now() - t0;
    long hwm = status_kib(&srv, "VmHWM:");
    long bound = base + (MEDIA_BUDGET_MB + SLACK_MIB) * 1024L;

    char want_head[128], want_tail[128];
    snprintf(want_head, sizeof want_head,
             "{\"error\":{\"message\":\"the decoded-media budget is full: %zu bytes are needed and ", charge);
    snprintf(want_tail, sizeof want_tail,
             " of its %d bytes are free after waiting 2000 ms; retry later\",\"type\":\"overloaded\",\"param\":null}}",
             MEDIA_BUDGET_MB << 20);
    int n200 = 0, n503 = 0;
    const char *first200 = NULL;
    for (int i = 0; i < N_BOMBS; i++) {
        hu_response *r = &c[i].resp;
        printf("request %d: curl %d, status %ld, %s\n", i, r->curl_code, r->status, r->body.data);
        assert_int_equal(r->curl_code, CURLE_OK);
        if (r->status == 200) {
            n200++;
            assert_non_null(strstr(r->body.data, "\"answers\":{\"q\":{\"type\":\"noul\""));
            if (!first200) first200 = r->body.data;
            assert_string_equal(r->body.data, first200);
        } else {
            assert_int_equal(r->status, 503);
            n503++;
            assert_string_equal(r->retry_after, "1");
            assert_string_equal(r->content_type, "application/json");
            assert_memory_equal(r->body.data, want_head, strlen(want_head));
            assert_true(r->body.len > strlen(want_tail));
            assert_string_equal(r->body.data + r->body.len - strlen(want_tail), want_tail);
        }
    }
    printf("%d concurrent decode bombs in %.1f s: %d x 200, %d x 503; RSS before %ld KiB (peak %ld), peak after %ld "
           "KiB, bound %ld KiB (base + %d MiB budget + %d MiB)\n",
           N_BOMBS, secs, n200, n503, base, hwm0, hwm, bound, MEDIA_BUDGET_MB, SLACK_MIB);
    if (RSS_BOUND_MEANINGFUL) assert_true(hwm <= bound);
    else printf("(sanitizer build: RSS bound not applied)\n");
    assert_true(n200 >= 1);
    assert_int_equal(n200 + n503, N_BOMBS);

    expect_small_request_ok(&srv);
    assert_true(metric(&srv, "clef_media_budget_bytes") == 0);
    assert_true(metric(&srv, "clef_media_budget_capacity_bytes") == (double)(MEDIA_BUDGET_MB << 20));
    double peak = metric(&srv, "clef_media_budget_peak_bytes");
    assert_true(peak >= (double)charge && peak <= (double)(MEDIA_BUDGET_MB << 20));
    assert_true(metric(&srv, "clef_budget_refusals_total{budget=\"media\"}") == n503);
    assert_true(metric(&srv, "clef_budget_waits_total{budget=\"media\"}") >= n503);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);
    for (int i = 0; i < N_BOMBS; i++) hu_free(&c[i].resp);
    clef_buf_free(&body);
    free(url);
    clef_buf_free(&png);
}

/* ---- request bodies ----------------------------------------------------- */

/* A valid request of exactly BODY_MB MiB: the padding is an ignored field. */
static const char BODY_HEAD[] = "{\"model\":\"m\",\"state\":\"Our checkout is down.\",\"questions\":{\"q\":{\"type\":"
                                "\"noul\",\"instructions\":\"Is a service down?\"}},\"metadata\":\"";
static const char BODY_TAIL[] = "\"}";
#define BODY_BYTES ((size_t)BODY_MB << 20)

typedef struct slow_body {
    size_t sent;
} slow_body;

/* 64 KiB every 10 ms: the upload takes ~1.3 s, so bodies are in flight together. */
static size_t slow_read(char *p, size_t size, size_t n, void *ud) {
    slow_body *b = ud;
    size_t room = size * n, k = 0;
    if (room > 65536) room = 65536;
    hu_sleep_ms(10);
    while (k < room && b->sent < BODY_BYTES) {
        size_t head = sizeof BODY_HEAD - 1, tail = sizeof BODY_TAIL - 1;
        if (b->sent < head) p[k] = BODY_HEAD[b->sent];
        else if (b->sent >= BODY_BYTES - tail) p[k] = BODY_TAIL[b->sent - (BODY_BYTES - tail)];
        else p[k] = 'x';
        k++, b->sent++;
    }
    return k;
}

typedef struct body_client {
    const hu_server *srv;
    hu_response resp;
} body_client;

static void *body_thread(void *arg) {
    body_client *c = arg;
    hu_response *out = &c->resp;
    CURL *curl = curl_easy_init();
    if (!curl) return NULL;
    char url[128];
    snprintf(url, sizeof url, "%s/v1/systemone", c->srv->base);
    struct curl_slist *hl = curl_slist_append(NULL, "Content-Type: application/json");
    slow_body sb = {0};
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, slow_read);
    curl_easy_setopt(curl, CURLOPT_READDATA, &sb);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)BODY_BYTES);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, hu_body_cb);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &out->body);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, hu_header_cb);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, out);
    out->curl_code = curl_easy_perform(curl);
    if (out->curl_code == CURLE_OK) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &out->status);
    clef_buf_reserve(&out->body, 0);
    out->body.data[out->body.len] = '\0';
    curl_slist_free_all(hl);
    curl_easy_cleanup(curl);
    return NULL;
}

static void test_body_budget(void **state) {
    (void)state;
    hu_server srv;
    char max_body[16], budget[16];
    snprintf(max_body, sizeof max_body, "%d", BODY_MB);
    snprintf(budget, sizeof budget, "%d", BODY_BUDGET_MB);
    hu_start(&srv, (const char *const[]){"--max-body-mb", max_body, "--body-budget-mb", budget, "--budget-wait-ms", "300", NULL},
             NULL);
    expect_small_request_ok(&srv);
    long base = status_kib(&srv, "VmRSS:");

    body_client c[N_BODIES];
    pthread_t t[N_BODIES];
    double t0 = hu_now();
    for (int i = 0; i < N_BODIES; i++) {
        c[i] = (body_client){&srv, {0}};
        assert_int_equal(pthread_create(&t[i], NULL, body_thread, &c[i]), 0);
    }
    for (int i = 0; i < N_BODIES; i++) pthread_join(t[i], NULL);
    double secs = hu_now() - t0;
    long hwm = status_kib(&srv, "VmHWM:");
    long bound = base + (BODY_BUDGET_MB + SLACK_MIB) * 1024L;

    char want_head[128], want_tail[128];
    snprintf(want_head, sizeof want_head,
             "{\"error\":{\"message\":\"the request-body budget is full: %zu bytes are needed and ", BODY_BYTES + 1);
    snprintf(want_tail, sizeof want_tail,
             " of its %d bytes are free after waiting 300 ms; retry later\",\"type\":\"overloaded\",\"param\":null}}",
             BODY_BUDGET_MB << 20);
    int n200 = 0, n503 = 0;
    for (int i = 0; i < N_BODIES; i++) {
        hu_response *r = &c[i].resp;
        printf("body %d: curl %d, status %ld, %.160s\n", i, r->curl_code, r->status, r->body.data ? r->body.data : "");
        assert_int_equal(r->curl_code, CURLE_OK);
        if (r->status == 200) {
            n200++;
            assert_non_null(strstr(r->body.data, "\"answers\":{\"q\":{\"type\":\"noul\""));
        } else {
            assert_int_equal(r->status, 503);
            n503++;
            assert_string_equal(r->retry_after, "1");
            assert_memory_equal(r->body.data, want_head, strlen(want_head));
            assert_true(r->body.len > strlen(want_tail));
            assert_string_equal(r->body.data + r->body.len - strlen(want_tail), want_tail);
        }
    }
    printf("%d concurrent %d MiB bodies in %.1f s: %d x 200, %d x 503; RSS before %ld KiB, peak %ld KiB, bound %ld "
           "KiB (base + %d MiB budget + %d MiB)\n",
           N_BODIES, BODY_MB, secs, n200, n503, base, hwm, bound, BODY_BUDGET_MB, SLACK_MIB);
    if (RSS_BOUND_MEANINGFUL) assert_true(hwm <= bound);
    else printf("(sanitizer build: RSS bound not applied)\n");
    assert_true(n200 >= 2);
    assert_true(n503 >= 1);
    assert_int_equal(n200 + n503, N_BODIES);

    expect_small_request_ok(&srv);
    assert_true(metric(&srv, "clef_body_budget_bytes") == 0);
    assert_true(metric(&srv, "clef_body_budget_capacity_bytes") == (double)(BODY_BUDGET_MB << 20));
    double peak = metric(&srv, "clef_body_budget_peak_bytes");
    assert_true(peak >= 2.0 * (BODY_BYTES + 1) && peak <= (double)(BODY_BUDGET_MB << 20));
    assert_true(metric(&srv, "clef_budget_refusals_total{budget=\"body\"}") == n503);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);
    for (int i = 0; i < N_BODIES; i++) hu_free(&c[i].resp);
}

/* ---- a chunked body's growth waits for the budget ---------------------- */

#define HOLDER_BYTES 1048576 /* declared by the holder (the 1 MiB limit): 1048577 of the 2 MiB budget charged */
/* A chunked body of the limit itself: its buffer ends at 1048577 bytes, whatever the chunks, and the
 * holder leaves 1048575 free, so its last growth must wait */
#define CHUNKED_BYTES 1048576

typedef struct chunked_client {
    const hu_server *srv;
    hu_response resp;
    double took;
} chunked_client;

static void *chunked_thread(void *arg) {
    chunked_client *c = arg;
    const char *h[] = {"Content-Type: application/json", NULL};
    double t0 = hu_now();
    hu_request_on(NULL, c->srv, "POST", "/v1/systemone", h, NULL, 0, CHUNKED_BYTES, 30, &c->resp);
    c->took = hu_now() - t0;
    return NULL;
}

/* Connect and declare a HOLDER_BYTES body, send one byte of it and stall:
 * the server holds its charge until the connection goes. */
static int hold_body_budget(const hu_server *srv) {
    char head[256];
    int n = snprintf(head, sizeof head,
                     "POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: %d\r\n\r\n{",
                     HOLDER_BYTES);
    int fd = raw_connect("127.0.0.1", srv->port);
    assert_true(fd >= 0);
    assert_int_equal(raw_send_all(fd, head, (size_t)n, 2), 0);
    for (int i = 0; i < 200 && metric(srv, "clef_body_budget_bytes") < HOLDER_BYTES; i++) hu_sleep_ms(10);
    assert_true(metric(srv, "clef_body_budget_bytes") == HOLDER_BYTES + 1);
    return fd;
}

static void test_chunked_growth_waits(void **state) {
    (void)state;
    hu_server srv;
    hu_start(&srv, (const char *const[]){"--max-body-mb", "1", "--body-budget-mb", "2", "--budget-wait-ms", "1000", NULL},
             NULL);
    /* admitted: the holder leaves 500 ms into the wait */
    int holder = hold_body_budget(&srv);
    chunked_client c = {&srv, {0}, 0};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, chunked_thread, &c), 0);
    for (int i = 0; i < 300 && metric(&srv, "clef_budget_waits_total{budget=\"body\"}") < 1; i++) hu_sleep_ms(10);
    assert_true(metric(&srv, "clef_budget_waits_total{budget=\"body\"}") == 1);
    hu_sleep_ms(500);
    close(holder);
    pthread_join(t, NULL);
    printf("chunked body admitted after its wait: %ld in %.2f s: %.120s\n", c.resp.status, c.took, c.resp.body.data);
    /* the whole body arrived after the wait: 800000 bytes of 'x' are not JSON */
    assert_int_equal(c.resp.curl_code, CURLE_OK);
    assert_int_equal(c.resp.status, 400);
    assert_non_null(strstr(c.resp.body.data, "\"type\":\"invalid_json\""));
    assert_true(c.took >= 0.45 && c.took < 5);
    hu_free(&c.resp);
    assert_true(metric(&srv, "clef_budget_refusals_total{budget=\"body\"}") == 0);
    /* refused: the holder stays past --budget-wait-ms */
    holder = hold_body_budget(&srv);
    c = (chunked_client){&srv, {0}, 0};
    assert_int_equal(pthread_create(&t, NULL, chunked_thread, &c), 0);
    pthread_join(t, NULL);
    printf("chunked body refused after its wait: %ld in %.2f s: %.200s\n", c.resp.status, c.took, c.resp.body.data);
    assert_int_equal(c.resp.curl_code, CURLE_OK);
    assert_int_equal(c.resp.status, 503);
    assert_string_equal(c.resp.retry_after, "1");
    static const char head[] = "{\"error\":{\"message\":\"the request-body budget is full: ",
                      tail[] = " of its 2097152 bytes are free after waiting 1000 ms; retry later\",\"type\":\"overloaded\","
                               "\"param\":null}}";
    assert_memory_equal(c.resp.body.data, head, sizeof head - 1);
    assert_true(c.resp.body.len > sizeof tail);
    assert_string_equal(c.resp.body.data + c.resp.body.len - (sizeof tail - 1), tail);
    assert_true(c.took >= 0.95 && c.took < 5);
    hu_free(&c.resp);
    close(holder);
    for (int i = 0; i < 200 && metric(&srv, "clef_body_budget_bytes") > 0; i++) hu_sleep_ms(10);
    assert_true(metric(&srv, "clef_body_budget_bytes") == 0);
    assert_true(metric(&srv, "clef_budget_refusals_total{budget=\"body\"}") == 1);
    expect_small_request_ok(&srv);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);
}

/* A body budget below the body limit could never hold a body under the
 * limit: a usage error, exit 2, before anything listens. */
static void test_body_budget_below_limit(void **state) {
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s serve --model %s/tiny-clef-omni --port 0 --max-body-mb 8 --body-budget-mb 4 2>&1", CLEF_BINARY,
             CLEF_FIXTURES);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char out[512] = {0};
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 2);
    assert_string_equal(out, "clef serve: --body-budget-mb 4 is below --max-body-mb 8: a body under the limit could "
                             "never be held\n");
}

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_media_budget),
        cmocka_unit_test(test_body_budget),
        cmocka_unit_test(test_chunked_growth_waits),
        cmocka_unit_test(test_body_budget_below_limit),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
