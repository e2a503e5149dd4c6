/* The wire behaviour of `clef serve` on libmicrohttpd (issue 15, items 9, 7,
 * 6 and part of 1), over raw sockets on loopback so the test controls every
 * byte and every pause:
 *   - X-Request-Id and x-typesafe-request-id: either accepted (X-Request-Id
 *     wins), both sent with the same value;
 *   - refusals decided from the headers (401, 413, 415, 503 while loading)
 *     read by a client that writes its whole 4 MiB body without waiting;
 *   - Transfer-Encodings other than `chunked` answered 501 JSON at once;
 *   - SIGTERM with a stalled upload: the decision in flight gets 200 and the
 *     server exits 0 in seconds, not after the 60 s grace;
 *   - --max-connections-per-client: 100 stalled connections from 127.0.0.1
 *     leave room for a client on 127.0.0.2.
 * Every wait is bounded (poll with timeouts, counted loops). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "httputil.h"
#include "rawhttp.h"
#include "testutil.h"

/* ---- fixtures ------------------------------------------------------------ */



static int setup(void **state) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return 0;
}

static int teardown(void **state) {
    curl_global_cleanup();
    return 0;
}

/* ---- item 9: request ids ------------------------------------------------- */

static void get_ids(unsigned port, const char *path, const char *headers, int status, raw_reply *r) {
    char req[1024];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%sConnection: close\r\n\r\n", path,
                     headers);
    raw_roundtrip("127.0.0.1", port, req, (size_t)n, 5, r);
    if (r->status != status) fail_msg("GET %s with '%s': status %d, expected %d", path, headers, r->status, status);
}

static void test_request_ids(void **state) {
    hu_server srv;
    hu_start(&srv, NULL, NULL);
    raw_reply r;
    /* none given: one random id under both names */
    get_ids(srv.port, "/healthz", "", 200, &r);
    assert_int_equal(strlen(r.request_id), 16);
    assert_string_equal(r.request_id, r.typesafe_id);
    raw_reply_free(&r);
    /* the TypeSafe SDK's header alone is taken */
    get_ids(srv.port, "/healthz", "x-typesafe-request-id: ts-123\r\n", 200, &r);
    assert_string_equal(r.request_id, "ts-123");
    assert_string_equal(r.typesafe_id, "ts-123");
    raw_reply_free(&r);
    /* both valid: X-Request-Id wins */
    get_ids(srv.port, "/v1/models", "X-Request-Id: xr-1\r\nx-typesafe-request-id: ts-2\r\n", 200, &r);
    assert_string_equal(r.request_id, "xr-1");
    assert_string_equal(r.typesafe_id, "xr-1");
    raw_reply_free(&r);
    /* an invalid X-Request-Id (129 characters) gives way to a valid typesafe one */
    char hdr[400];
    memset(hdr, 0, sizeof hdr);
    strcpy(hdr, "X-Request-Id: ");
    memset(hdr + strlen(hdr), 'a', 129);
    strcat(hdr, "\r\nx-typesafe-request-id: ts-3\r\n");
    get_ids(srv.port, "/nowhere", hdr, 404, &r);
    assert_json_error("404 ids", &r, 404, "invalid_request", "no route GET /nowhere");
    assert_string_equal(r.request_id, "ts-3");
    raw_reply_free(&r);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);
}

/* ---- item 7: refusals from the headers reach a client that writes first -- */

#define BIG_BODY ((size_t)4 << 20)

/* Write the head and all of a 4 MiB body without reading, then read. */
static void refused_after_body(unsigned port, const char *extra, const char *content_type, raw_reply *r) {
    memset(r, 0, sizeof *r);
    char *head = raw_post_head(extra, content_type, BIG_BODY);
    char *body = malloc(BIG_BODY);
    assert_non_null(body);
    memset(body, ' ', BIG_BODY);
    int fd = raw_connect("127.0.0.1", port);
    assert_true(fd >= 0);
    int e = raw_send_all(fd, head, strlen(head), 10);
    if (!e) e = raw_send_all(fd, body, BIG_BODY, 10);
    if (e) fail_msg("writing the body: %s (the server stopped reading)", strerror(e));
    raw_read_reply(fd, 10, r);
    close(fd);
    free(head);
    free(body);
}

static void test_refusals_read_the_body(void **state) {
    hu_server srv;
    const char *args[] = {"--api-key", "sekrit", "--max-body-mb", "1", NULL};
    hu_start(&srv, args, NULL);
    raw_reply r;
    refused_after_body(srv.port, "Authorization: Bearer wrong\r\n", "application/json", &r);
    assert_json_error("401", &r, 401, "invalid_request", "missing or invalid API key");
    assert_string_equal(r.www_auth, "Bearer");
    raw_reply_free(&r);
    refused_after_body(srv.port, "Authorization: Bearer sekrit\r\n", "text/plain", &r);
    assert_json_error("415", &r, 415, "invalid_request", "Content-Type must be application/json, got 'text/plain'");
    raw_reply_free(&r);
    /* 4 MiB declared past the 1 MiB limit, within the 16 MiB read bound */
    refused_after_body(srv.port, "Authorization: Bearer sekrit\r\n", "application/json", &r);
    assert_json_error("413", &r, 413, "payload_too_large",
                      "request body of 4194304 bytes exceeds the limit of 1048576 bytes");
    raw_reply_free(&r);
    /* the connection stays usable for the next client: a decision */
    char *head = raw_post_head("Authorization: Bearer sekrit\r\nConnection: close\r\n", "application/json",
                           strlen(raw_triage));
    clef_buf req = {0};
    clef_buf_puts(&req, head);
    clef_buf_puts(&req, raw_triage);
    raw_roundtrip("127.0.0.1", srv.port, req.data, req.len, 30, &r);
    assert_int_equal(r.status, 200);
    raw_reply_free(&r);
    clef_buf_free(&req);
    free(head);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);

    /* 503 while the model loads */
    setenv("CLEF_SERVE_TEST_LOAD_DELAY_MS", "20000", 1);
    hu_start_nowait(&srv, NULL, NULL);
    unsetenv("CLEF_SERVE_TEST_LOAD_DELAY_MS");
    refused_after_body(srv.port, "", "application/json", &r);
    assert_json_error("503 loading", &r, 503, "model_loading", "the model is loading");
    raw_reply_free(&r);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);
}

/* ---- item 6: Transfer-Encodings that are not `chunked` -------------------- */

static void test_transfer_encoding_501(void **state) {
    hu_server srv;
    hu_start(&srv, NULL, NULL);
    static const char *const encodings[] = {"gzip, chunked", "identity", "chunked, gzip"};
    for (size_t i = 0; i < 3; i++) {
        char req[400], want[200];
        int n = snprintf(req, sizeof req,
                         "POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         "Transfer-Encoding: %s\r\n\r\n",
                         encodings[i]);
        raw_reply r;
        double t = raw_roundtrip("127.0.0.1", srv.port, req, (size_t)n, 1.0, &r);
        snprintf(want, sizeof want, "Transfer-Encoding '%s' is not supported", encodings[i]);
        assert_json_error(encodings[i], &r, 501, "invalid_request", want);
        if (t > 1.0) fail_msg("%s: answered after %.2f s", encodings[i], t);
        raw_reply_free(&r);
    }
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);
}

/* ---- item 6: SIGTERM with a stalled upload -------------------------------- */

static void test_stop_cuts_stalled_upload(void **state) {
    hu_server srv;
    setenv("CLEF_SERVE_TEST_FORWARD_DELAY_MS", "1500", 1);
    hu_start(&srv, NULL, NULL);
    unsetenv("CLEF_SERVE_TEST_FORWARD_DELAY_MS");
    /* a: half an upload, then silence */
    int a = raw_connect("127.0.0.1", srv.port);
    assert_true(a >= 0);
    char *head = raw_post_head("", "application/json", 1000);
    assert_int_equal(raw_send_all(a, head, strlen(head), 5), 0);
    assert_int_equal(raw_send_all(a, "{\"model\":", 9, 5), 0);
    free(head);
    /* b: a whole decision, held in the forward for 1.5 s */
    int b = raw_connect("127.0.0.1", srv.port);
    assert_true(b >= 0);
    head = raw_post_head("", "application/json", strlen(raw_triage));
    assert_int_equal(raw_send_all(b, head, strlen(head), 5), 0);
    assert_int_equal(raw_send_all(b, raw_triage, strlen(raw_triage), 5), 0);
    free(head);
    hu_sleep_ms(400);
    double t0 = hu_now();
    kill(srv.pid, SIGTERM);
    raw_reply r;
    memset(&r, 0, sizeof r);
    raw_read_reply(b, 10, &r);
    if (r.status != 200) fail_msg("the decision in flight: status %d: %.300s", r.status, r.raw.data ? r.raw.data : "");
    raw_reply_free(&r);
    int rc = hu_wait_exit(&srv);
    double took = hu_now() - t0;
    assert_int_equal(rc, 0);
    if (took > 3.5) fail_msg("the server took %.2f s to stop", took);
    close(a);
    close(b);
    char *log = hu_log(&srv);
    assert_non_null(strstr(log, "cutting 1 requests whose body had not arrived"));
    free(log);
    hu_remove_log(&srv);
}

/* ---- item 1 (part): the per-client connection cap ------------------------- */

static void test_per_client_cap(void **state) {
    hu_server srv;
    /* 64 slots: without the per-client cap the 100 stalled connections below take them all */
    const char *args[] = {"--max-connections", "64", "--max-connections-per-client", "16", NULL};
    hu_start(&srv, args, NULL);
    hu_wait_loopback_closed(&srv); /* hu_start's readiness probes would take one of the 16 slots */
    enum { N = 100 };
    int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = raw_connect("127.0.0.1", srv.port);
        assert_true(fds[i] >= 0);
        assert_int_equal(raw_send_all(fds[i], "G", 1, 2), 0);
    }
    /* the excess is closed at accept: count the connections the server ended (≤ 2 s) */
    int closed = 0;
    double deadline = hu_now() + 2;
    while (closed < N - 16 && hu_now() < deadline) {
        closed = 0;
        for (int i = 0; i < N; i++) {
            char c;
            ssize_t n = recv(fds[i], &c, 1, MSG_DONTWAIT | MSG_PEEK);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) closed++;
        }
        hu_sleep_ms(50);
    }
    assert_int_equal(closed, N - 16);
    /* another client address is served at once */
    raw_reply r;
    static const char health[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    double t = raw_roundtrip("127.0.0.2", srv.port, health, sizeof health - 1, 1.0, &r);
    if (r.status != 200 || t > 1.0) fail_msg("/healthz from 127.0.0.2: status %d after %.2f s", r.status, t);
    raw_reply_free(&r);
    char *head = raw_post_head("Connection: close\r\n", "application/json", strlen(raw_triage));
    clef_buf req = {0};
    clef_buf_puts(&req, head);
    clef_buf_puts(&req, raw_triage);
    t = raw_roundtrip("127.0.0.2", srv.port, req.data, req.len, 1.0, &r);
    if (r.status != 200 || t > 1.0) fail_msg("a decision from 127.0.0.2: status %d after %.2f s", r.status, t);
    raw_reply_free(&r);
    clef_buf_free(&req);
    free(head);
    for (int i = 0; i < N; i++) close(fds[i]);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_ids),
        cmocka_unit_test(test_refusals_read_the_body),
        cmocka_unit_test(test_transfer_encoding_501),
        cmocka_unit_test(test_stop_cuts_stalled_upload),
        cmocka_unit_test(test_per_client_cap),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
