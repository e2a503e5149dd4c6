/* The stop of `clef serve` as a load balancer or Kubernetes sees it (issue
 * 21, part 3): on SIGTERM
 *   - a decision already received is answered 200 with its exact bytes;
 *   - a new connection is refused (the listener is closed at once, so a
 *     balancer moves the request to another replica);
 *   - a request on a keep-alive connection opened before the signal gets
 *     503 {"status":"stopping"} (GET /healthz, the readiness probe) or 503
 *     JSON "the server is shutting down" (a decision), with Connection: close;
 *   - the process exits 0 once they are answered, well before
 *     --drain-timeout-s;
 * and --drain-timeout-s bounds the stop: a decision still running when it
 * passes is given up (its connection closed unanswered), the log says so and
 * the exit status is 1, within the bound.  Bad values of the flag are usage
 * errors (exit 2).  Forwards are stretched with CLEF_SERVE_TEST_FORWARD_DELAY_MS
 * so that a decision is surely in flight at the signal.  Every wait is bounded. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "httputil.h"
#include "rawhttp.h"
#include "testutil.h"


static int setup(void **state) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return 0;
}

static int teardown(void **state) {
    curl_global_cleanup();
    return 0;
}

/* A keep-alive POST of the raw_triage request on an open connection. */
static void send_decision(int fd) {
    char *head = raw_post_head("", "application/json", strlen(raw_triage));
    assert_int_equal(raw_send_all(fd, head, strlen(head), 5), 0);
    assert_int_equal(raw_send_all(fd, raw_triage, strlen(raw_triage), 5), 0);
    free(head);
}

static void send_healthz(int fd) {
    static const char req[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    assert_int_equal(raw_send_all(fd, req, sizeof req - 1, 5), 0);
}

/* The body of a reply as a string (caller frees). */
static char *body_of(const raw_reply *r) {
    char *s = malloc(r->body_len + 1);
    assert_non_null(s);
    memcpy(s, r->body, r->body_len);
    s[r->body_len] = '\0';
    return s;
}

/* The answer of a server without a stop in the way: what the decision in
 * flight must get, byte for byte. */
static char *direct_answer(unsigned port) {
    int fd = raw_connect("127.0.0.1", port);
    assert_true(fd >= 0);
    send_decision(fd);
    raw_reply r;
    memset(&r, 0, sizeof r);
    raw_read_reply(fd, 30, &r);
    close(fd);
    if (r.status != 200) fail_msg("direct decision: status %d: %.300s", r.status, r.raw.data ? r.raw.data : "");
    char *s = body_of(&r);
    raw_reply_free(&r);
    return s;
}

static void test_stop_drains(void **state) {
    hu_server srv;
    setenv("CLEF_SERVE_TEST_FORWARD_DELAY_MS", "1500", 1);
    const char *args[] = {"--drain-timeout-s", "20", NULL};
    hu_start(&srv, args, NULL);
    unsetenv("CLEF_SERVE_TEST_FORWARD_DELAY_MS");
    char *expected = direct_answer(srv.port);
    /* two keep-alive connections opened (and used) before the signal */
    int probe = raw_connect("127.0.0.1", srv.port), again = raw_connect("127.0.0.1", srv.port);
    assert_true(probe >= 0 && again >= 0);
    raw_reply r;
    memset(&r, 0, sizeof r);
    send_healthz(probe);
    raw_read_reply(probe, 5, &r);
    assert_int_equal(r.status, 200);
    raw_reply_free(&r);
    send_healthz(again);
    raw_read_reply(again, 5, &r);
    assert_int_equal(r.status, 200);
    raw_reply_free(&r);
    /* a decision in flight (held 1.5 s in its forward) */
    int busy = raw_connect("127.0.0.1", srv.port);
    assert_true(busy >= 0);
    send_decision(busy);
    hu_sleep_ms(300);
    double t0 = hu_now();
    kill(srv.pid, SIGTERM);
    hu_sleep_ms(200); /* the server polls for the signal every 50 ms */
    /* a new connection is refused */
    int late = raw_connect("127.0.0.1", srv.port);
    if (late >= 0) {
        close(late);
        fail_msg("a connection made after SIGTERM was accepted");
    }
    /* the readiness probe on an open connection: 503 stopping, and the connection closed */
    send_healthz(probe);
    raw_read_reply(probe, 5, &r);
    assert_int_equal(r.status, 503);
    char *b = body_of(&r);
    assert_string_equal(b, "{\"status\":\"stopping\"}");
    free(b);
    assert_string_equal(r.connection, "close");
    raw_reply_free(&r);
    /* a decision on an open connection: 503 JSON, retryable elsewhere */
    send_decision(again);
    raw_read_reply(again, 5, &r);
    assert_json_error("a decision after SIGTERM", &r, 503, "overloaded", "the server is shutting down");
    assert_string_equal(r.connection, "close");
    raw_reply_free(&r);
    /* the decision in flight: 200, the same bytes as without the stop */
    raw_read_reply(busy, 10, &r);
    if (r.status != 200) fail_msg("the decision in flight: status %d: %.300s", r.status, r.raw.data ? r.raw.data : "");
    b = body_of(&r);
    assert_string_equal(b, expected);
    free(b);
    raw_reply_free(&r);
    int rc = hu_wait_exit(&srv);
    double took = hu_now() - t0;
    assert_int_equal(rc, 0);
    if (took > 5.0) fail_msg("the stop took %.2f s (the decision needed 1.2 s more)", took);
    close(probe);
    close(again);
    close(busy);
    free(expected);
    char *log = hu_log(&srv);
    const char *sig = strstr(log, "SIGTERM received");
    assert_non_null(sig);
    assert_non_null(strstr(sig, "\"POST /v1/systemone\" 200"));
    assert_non_null(strstr(sig, "clef serve: stopped"));
    assert_null(strstr(sig, "drain-timeout-s"));
    free(log);
    hu_remove_log(&srv);
}

/* A decision that outlasts --drain-timeout-s: the process exits at the bound
 * with status 1, saying so, and the client's connection is closed unanswered
 * (a balancer retries it on another replica). */
static void test_drain_timeout_bounds_stop(void **state) {
    hu_server srv;
    setenv("CLEF_SERVE_TEST_FORWARD_DELAY_MS", "6000", 1);
    const char *args[] = {"--drain-timeout-s", "1", NULL};
    hu_start(&srv, args, NULL);
    unsetenv("CLEF_SERVE_TEST_FORWARD_DELAY_MS");
    int busy = raw_connect("127.0.0.1", srv.port);
    assert_true(busy >= 0);
    send_decision(busy);
    hu_sleep_ms(300);
    double t0 = hu_now();
    kill(srv.pid, SIGTERM);
    int rc = hu_wait_exit(&srv);
    double took = hu_now() - t0;
    assert_int_equal(rc, 1);
    if (took < 0.9 || took > 2.5) fail_msg("exit %.2f s after SIGTERM with --drain-timeout-s 1", took);
    raw_reply r;
    memset(&r, 0, sizeof r);
    raw_read_reply(busy, 5, &r);
    if (r.status != 0) fail_msg("the cut decision got status %d", r.status);
    assert_true(r.closed || r.recv_error);
    raw_reply_free(&r);
    close(busy);
    char *log = hu_log(&srv);
    assert_non_null(strstr(log, "clef serve: 1 requests still being decided after --drain-timeout-s 1 s; exiting "
                                "without their answers"));
    assert_null(strstr(log, "clef serve: stopped"));
    free(log);
    hu_remove_log(&srv);
}

/* Out-of-range values: exit 2 with the range, before anything listens. */
static void test_drain_timeout_flag(void **state) {
    const char *bad[] = {"0", "3601", "-1", "ten"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "%s serve --model %s/tiny-clef-omni --port 0 --drain-timeout-s %s 2>&1", CLEF_BINARY,
                 CLEF_FIXTURES, bad[i]);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        char out[4096];
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = '\0';
        int st = pclose(p);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 2) fail_msg("--drain-timeout-s %s: status %d: %s", bad[i], st, out);
        if (!strstr(out, "--drain-timeout-s")) fail_msg("--drain-timeout-s %s: the message names no flag: %s", bad[i], out);
        if (strstr(out, "listening on")) fail_msg("--drain-timeout-s %s: the server started: %s", bad[i], out);
    }
    FILE *p = popen(CLEF_BINARY " serve --help", "r");
    assert_non_null(p);
    char out[16384];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    assert_int_equal(pclose(p), 0);
    assert_non_null(strstr(out, "--drain-timeout-s N"));
    assert_non_null(strstr(out, "(default 60; 1..3600;"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_drains),
        cmocka_unit_test(test_drain_timeout_bounds_stop),
        cmocka_unit_test(test_drain_timeout_flag),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
