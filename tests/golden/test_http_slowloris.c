/* Slow clients against `clef serve` on libmicrohttpd's event loop (issue 15,
 * item 1), over raw sockets on loopback:
 *   - 1,000 connections from 127.0.0.1 that trickle a request head byte by
 *     byte (no per-client cap): the server keeps its thread count (no thread
 *     per connection) and ~its memory, and a client on 127.0.0.2 gets
 *     /healthz 200 and a decision 200 within a second each; every slow
 *     connection is closed at --header-timeout-s, the trickled bytes
 *     notwithstanding;
 *   - the deadlines one by one: a trickled head, an idle keep-alive
 *     connection, a body slower than --min-body-rate-kb, each closed at its
 *     deadline (± DEADLINE_SLACK_S), while a body slow but faster than the
 *     rate is answered 200;
 *   - past --max-connections: 503 "overloaded" JSON with Retry-After: 1 and
 *     Connection: close (a GET, and a POST whose body is read first), and
 *     service again once the slots are free.
 * Every wait is bounded; the test takes ~15 s. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "httputil.h"
#include "rawhttp.h"
#include "testutil.h"

#define N_SLOW 1000
#define SLOW_HEADER_TIMEOUT "4"
#define SLOW_HEADER_TIMEOUT_S 4.0
/* The sweeper looks every 100 ms; the rest is scheduling on a loaded 2-core box. */
#define DEADLINE_SLACK_S 0.7
#define RSS_GROWTH_LIMIT_KIB (32L << 10) /* thread per connection: +76 MiB for 1,000 */
#define THREAD_GROWTH_LIMIT 4            /* thread per connection: +1,000 */


static const char health[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";

/* A whole POST /v1/systemone of `body` with `extra` header lines. */
static char *post_request(const char *extra, const char *body) {
    char *head = raw_post_head(extra, "application/json", strlen(body));
    clef_buf b = {0};
    clef_buf_printf(&b, "%s%s", head, body);
    free(head);
    return b.data;
}

static int setup(void **state) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return 0;
}

static int teardown(void **state) {
    curl_global_cleanup();
    return 0;
}

/* The soft open-file limit raised to the hard one; returns the soft limit. */
static size_t raise_nofile(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit up = {rl.rlim_max, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
    }
    return rl.rlim_cur == RLIM_INFINITY ? (size_t)1 << 20 : (size_t)rl.rlim_cur;
}

/* 1 if the server ended the connection (EOF or reset), without waiting. */
static int peer_closed(int fd) {
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/* Wait up to timeout_s for the server to end fd; returns the time it did
 * (hu_now), or -1.  Reads and drops what arrives before. */
static double wait_closed(int fd, double timeout_s) {
    double deadline = hu_now() + timeout_s;
    for (;;) {
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return hu_now();
        if (n > 0) continue;
        int left = (int)((deadline - hu_now()) * 1000);
        if (left <= 0) return -1;
        struct pollfd q = {fd, POLLIN, 0};
        poll(&q, 1, left < 20 ? left : 20);
    }
}

static double metric_now(const hu_server *srv, const char *series) {
    hu_response r;
    hu_get(srv, "/metrics", NULL, &r);
    assert_int_equal(r.status, 200);
    double v = hu_metric(r.body.data, series);
    hu_free(&r);
    return v;
}

/* ---- 1,000 slow connections from one address ----------------------------- */

static void test_thousand_slow_connections(void **state) {
    size_t fds = raise_nofile(), n = N_SLOW;
    if (fds < n + 128) {
        n = fds > 256 ? fds - 128 : 128;
        printf("the open-file limit is %zu: %zu slow connections instead of %d\n", fds, n, N_SLOW);
    }
    hu_server srv;
    const char *args[] = {"--max-connections-per-client", "0", "--header-timeout-s", SLOW_HEADER_TIMEOUT, NULL};
    hu_start(&srv, args, NULL);
    long rss0 = hu_rss_kib(&srv), threads0 = hu_threads(&srv);

    int *fd = calloc(n, sizeof *fd);
    double *opened = calloc(n, sizeof *opened), *closed_at = calloc(n, sizeof *closed_at);
    assert_true(fd && opened && closed_at);
    static const char head[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    for (size_t i = 0; i < n; i++) {
        fd[i] = raw_connect("127.0.0.1", srv.port);
        if (fd[i] < 0) fail_msg("slow connection %zu: cannot connect", i);
        opened[i] = hu_now();
        assert_int_equal(raw_send_all(fd[i], head, sizeof head - 1, 2), 0);
    }
    double t_all = hu_now();
    printf("%zu slow connections open in %.2f s\n", n, t_all - opened[0]);
    /* one more header byte on each every 250 ms, never the blank line; note which the server ends */
    size_t n_closed = 0;
    double next_byte = hu_now();
    int measured = 0;
    while (n_closed < n && hu_now() < t_all + SLOW_HEADER_TIMEOUT_S + 3) {
        int send_now = hu_now() >= next_byte;
        if (send_now) next_byte += 0.25;
        for (size_t i = 0; i < n; i++) {
            if (closed_at[i] > 0) continue;
            if (peer_closed(fd[i]) || (send_now && send(fd[i], "x", 1, MSG_NOSIGNAL) != 1)) {
                closed_at[i] = hu_now();
                n_closed++;
            }
        }
        if (!measured && hu_now() >= t_all + 0.5) {
            measured = 1;
            long rss1 = hu_rss_kib(&srv), threads1 = hu_threads(&srv);
            printf("server with %zu slow connections: RSS %ld -> %ld KiB (+%.1f MiB), threads %ld -> %ld\n", n, rss0,
                   rss1, (rss1 - rss0) / 1024.0, threads0, threads1);
            /* another address is served at once, status and time asserted */
            raw_reply r;
            double t = raw_roundtrip("127.0.0.2", srv.port, health, sizeof health - 1, 1.0, &r);
            if (r.status != 200 || t > 1.0) fail_msg("/healthz from 127.0.0.2: status %d after %.2f s", r.status, t);
            assert_memory_equal(r.body, "{\"status\":\"ok\"}", 15);
            raw_reply_free(&r);
            char *req = post_request("Connection: close\r\n", raw_triage);
            t = raw_roundtrip("127.0.0.2", srv.port, req, strlen(req), 1.0, &r);
            if (r.status != 200 || t > 1.0) fail_msg("a decision from 127.0.0.2: status %d after %.2f s", r.status, t);
            assert_non_null(strstr(r.body, "\"answers\":{\"department\":{\"type\":\"choice\""));
            raw_reply_free(&r);
            free(req);
            if (n_closed) fail_msg("%zu slow connections were closed before their deadline", n_closed);
            if (threads1 > threads0 + THREAD_GROWTH_LIMIT)
                fail_msg("%zu idle connections cost %ld threads", n, threads1 - threads0);
            if (RSS_BOUND_MEANINGFUL && rss1 - rss0 > RSS_GROWTH_LIMIT_KIB)
                fail_msg("%zu idle connections cost %ld KiB", n, rss1 - rss0);
        }
        hu_sleep_ms(20);
    }
    assert_true(measured);
    /* every one closed at its deadline, counted from its accept (the trickled bytes did not move it) */
    double early = 1e9, late = -1e9;
    for (size_t i = 0; i < n; i++) {
        if (closed_at[i] <= 0)
            fail_msg("slow connection %zu still open %.1f s after its accept", i, hu_now() - opened[i]);
        double d = closed_at[i] - opened[i] - SLOW_HEADER_TIMEOUT_S;
        if (d < early) early = d;
        if (d > late) late = d;
    }
    printf("closed %.2f .. %.2f s after their deadline\n", early, late);
    if (early < -0.1 || late > DEADLINE_SLACK_S + 0.3)
        fail_msg("slow connections closed %.2f .. %.2f s off their deadline", early, late);
    assert_true(metric_now(&srv, "clef_connections_timed_out_total{phase=\"headers\"}") == (double)n);
    for (size_t i = 0; i < n; i++) close(fd[i]);
    free(fd);
    free(opened);
    free(closed_at);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);
}

/* ---- each deadline ------------------------------------------------------- */

typedef struct probe {
    unsigned port;
    int kind;      /* 0 trickled head, 1 idle keep-alive, 2 body below the rate, 3 body above it */
    double took;   /* seconds from the phase's start to the server's close (0-2), or to the answer (3) */
    int status;    /* 3: the answer's status */
    char why[160]; /* a failure, "" if none */
} probe;

#define DEADLINE_S 2.0

static void *probe_main(void *arg) {
    probe *p = arg;
    int fd = raw_connect("127.0.0.1", p->port);
    if (fd < 0) {
        snprintf(p->why, sizeof p->why, "cannot connect");
        return NULL;
    }
    double t0 = hu_now(), closed = -1;
    if (p->kind == 0) { /* a head, one byte every 200 ms, never finished */
        raw_send_all(fd, "GET /healthz HTTP/1.1\r\nX-Slow: ", 31, 1);
        for (int i = 0; i < 40 && closed < 0; i++) {
            closed = wait_closed(fd, 0.2);
            if (closed < 0 && send(fd, "x", 1, MSG_NOSIGNAL) != 1) closed = hu_now();
        }
    } else if (p->kind == 1) { /* one request on a keep-alive connection, then nothing */
        static const char ka[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
        raw_send_all(fd, ka, sizeof ka - 1, 1);
        raw_reply r;
        memset(&r, 0, sizeof r);
        raw_read_reply(fd, 2, &r);
        if (r.status != 200 || r.closed) snprintf(p->why, sizeof p->why, "keep-alive /healthz: %d", r.status);
        raw_reply_free(&r);
        t0 = hu_now(); /* the deadline runs from the answer */
        closed = wait_closed(fd, 8);
    } else if (p->kind == 2) { /* 8 bytes every 100 ms of a 100000-byte body: ~80 B/s, below 1 KiB/s */
        static const char head[] = "POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                   "Content-Length: 100000\r\n\r\n";
        raw_send_all(fd, head, sizeof head - 1, 1);
        t0 = hu_now();
        for (int i = 0; i < 80 && closed < 0; i++) {
            closed = wait_closed(fd, 0.1);
            if (closed < 0 && send(fd, "        ", 8, MSG_NOSIGNAL) != 8) closed = hu_now();
        }
    } else { /* a 6000-byte request at 2000 B/s: 3 s, past --body-timeout-s but above the rate */
        clef_buf body = {0};
        clef_buf_printf(&body, "{\"model\":\"m\",\"state\":\"Our checkout is down.\",\"questions\":{\"q\":{\"type\":"
                               "\"noul\",\"instructions\":\"Is a service down?\"}},\"metadata\":\"");
        while (body.len < 6000 - 2) clef_buf_puts(&body, "x");
        clef_buf_puts(&body, "\"}");
        char head[256];
        int hn = snprintf(head, sizeof head,
                          "POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Connection: close\r\nContent-Length: %zu\r\n\r\n",
                          body.len);
        raw_send_all(fd, head, (size_t)hn, 1);
        t0 = hu_now();
        for (size_t off = 0; off < body.len; off += 600) {
            size_t k = body.len - off < 600 ? body.len - off : 600;
            if (raw_send_all(fd, body.data + off, k, 1) != 0) {
                snprintf(p->why, sizeof p->why, "the server closed a body arriving at 2000 B/s after %.2f s",
                         hu_now() - t0);
                break;
            }
            if (off + k < body.len) hu_sleep_ms(300);
        }
        raw_reply r;
        memset(&r, 0, sizeof r);
        raw_read_reply(fd, 10, &r);
        p->status = r.status;
        p->took = hu_now() - t0;
        raw_reply_free(&r);
        clef_buf_free(&body);
        close(fd);
        return NULL;
    }
    if (closed < 0) snprintf(p->why, sizeof p->why, "not closed by the server");
    p->took = closed - t0;
    close(fd);
    return NULL;
}

static void test_deadlines(void **state) {
    hu_server srv;
    const char *args[] = {"--header-timeout-s", "2", "--body-timeout-s", "2", "--min-body-rate-kb", "1", NULL};
    hu_start(&srv, args, NULL);
    static const char *const what[4] = {"a trickled head", "an idle keep-alive connection",
                                        "a body below --min-body-rate-kb", "a body above --min-body-rate-kb"};
    probe p[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        p[i] = (probe){.port = srv.port, .kind = i};
        assert_int_equal(pthread_create(&th[i], NULL, probe_main, &p[i]), 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        printf("%s: %.2f s%s%s\n", what[i], p[i].took, p[i].why[0] ? ": " : "", p[i].why);
        if (p[i].why[0]) fail_msg("%s: %s", what[i], p[i].why);
    }
    /* closed at the deadline: 2 s, for the slow body plus its ~200 bytes at 1 KiB/s */
    for (int i = 0; i < 3; i++)
        if (p[i].took < DEADLINE_S - 0.1 || p[i].took > DEADLINE_S + DEADLINE_SLACK_S + (i == 2 ? 0.3 : 0))
            fail_msg("%s closed after %.2f s, deadline %.1f s", what[i], p[i].took, DEADLINE_S);
    if (p[3].status != 200) fail_msg("%s: status %d after %.2f s", what[3], p[3].status, p[3].took);
    assert_true(p[3].took > DEADLINE_S); /* it did outlast --body-timeout-s */
    assert_true(metric_now(&srv, "clef_connections_timed_out_total{phase=\"headers\"}") == 2);
    assert_true(metric_now(&srv, "clef_connections_timed_out_total{phase=\"body\"}") == 1);
    assert_int_equal(hu_stop(&srv), 0);
    char *log = hu_log(&srv);
    assert_non_null(strstr(log, "clef serve: closed 1 connection whose request body was not complete 2 s + 1 s per "
                                "1 KiB received after its head"));
    free(log);
    hu_remove_log(&srv);
}

/* ---- past --max-connections ---------------------------------------------- */

static void test_over_limit_503(void **state) {
    hu_server srv;
    const char *args[] = {"--max-connections", "4", "--max-connections-per-client", "0", NULL};
    hu_start(&srv, args, NULL);
    /* four connections take the four slots: each gets one answer (so the server has accepted and
     * admitted it; a connection still in the listen backlog would not count yet), then stays open */
    static const char get[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    int stalled[4];
    raw_reply r;
    for (int i = 0; i < 4; i++) {
        stalled[i] = raw_connect("127.0.0.1", srv.port);
        assert_true(stalled[i] >= 0);
        assert_int_equal(raw_send_all(stalled[i], get, sizeof get - 1, 2), 0);
        memset(&r, 0, sizeof r);
        raw_read_reply(stalled[i], 2, &r);
        if (r.status != 200 || r.closed) fail_msg("slot %d: status %d, closed %d", i, r.status, r.closed);
        raw_reply_free(&r);
        assert_int_equal(raw_send_all(stalled[i], "G", 1, 2), 0); /* and a head begun */
    }
    /* a GET on a keep-alive connection: 503 JSON, then the server closes it */
    memset(&r, 0, sizeof r);
    double t0 = hu_now();
    int fd = raw_connect("127.0.0.1", srv.port);
    assert_true(fd >= 0);
    assert_int_equal(raw_send_all(fd, get, sizeof get - 1, 2), 0);
    raw_read_reply(fd, 2, &r);
    double t = hu_now() - t0;
    assert_json_error("GET past the limit", &r, 503, "overloaded",
                      "the server is at its connection limit (4 connections); retry later");
    assert_string_equal(r.connection, "close");
    if (t > 1.0) fail_msg("the 503 took %.2f s", t);
    if (wait_closed(fd, 2) < 0) fail_msg("the connection past the limit stayed open after its 503");
    close(fd);
    raw_reply_free(&r);
    /* a POST written at once: its body is read, then the same 503 */
    char *req = post_request("", raw_triage);
    t = raw_roundtrip("127.0.0.2", srv.port, req, strlen(req), 2, &r);
    assert_json_error("POST past the limit", &r, 503, "overloaded", "connection limit (4 connections)");
    if (t > 1.0) fail_msg("the 503 took %.2f s", t);
    raw_reply_free(&r);
    /* the slots free: served again */
    for (int i = 0; i < 4; i++) close(stalled[i]);
    double deadline = hu_now() + 2;
    int st = 0;
    while (hu_now() < deadline && st != 200) {
        raw_roundtrip("127.0.0.1", srv.port, health, sizeof health - 1, 1, &r);
        st = r.status;
        raw_reply_free(&r);
        if (st != 200) hu_sleep_ms(20);
    }
    assert_int_equal(st, 200);
    raw_roundtrip("127.0.0.2", srv.port, req, strlen(req), 5, &r);
    assert_int_equal(r.status, 200);
    raw_reply_free(&r);
    free(req);
    assert_true(metric_now(&srv, "clef_connections_over_limit_total") >= 2);
    assert_true(metric_now(&srv, "clef_connections_max") == 4);
    assert_int_equal(hu_stop(&srv), 0);
    hu_remove_log(&srv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thousand_slow_connections),
        cmocka_unit_test(test_deadlines),
        cmocka_unit_test(test_over_limit_503),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
