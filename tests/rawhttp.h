/* rawhttp.h — raw HTTP/1.1 over loopback sockets for the HTTP tests that
 * must control every byte and every pause (tests/golden/test_http_wire.c,
 * test_http_slowloris.c, test_http_drain.c): connect from a chosen source address, write with
 * a bounded wait, read one response and parse its head, check a JSON error
 * body.  Header-only (static functions), like httputil.h.  Every wait is
 * bounded. */
#ifndef CLEF_TESTS_RAWHTTP_H
#define CLEF_TESTS_RAWHTTP_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "httputil.h"
#include "json/json.h"
#include "testutil.h"

/* The triage decision the HTTP tests send (a choice and a score question over the tiny fixture). */
static HU_UNUSED const char raw_triage[] =
    "{\"model\":\"clef-omni\",\"state\":\"Our checkout started returning errors and orders are blocked.\","
    "\"questions\":{\"department\":{\"type\":\"choice\",\"instructions\":\"Which team should handle the message?\","
    "\"criteria\":{\"billing\":\"Payments or invoices\",\"technical\":\"Bugs or outages\"}},"
    "\"urgency\":{\"type\":\"score\",\"criteria\":[\"Can wait\",\"This week\",\"Today\"]}}}";

/* A POST /v1/systemone head (heap string, caller frees) with `extra` header lines ("" or "Name: v\r\n..."). */
static HU_UNUSED char *raw_post_head(const char *extra, const char *content_type, size_t content_length) {
    clef_buf b = {0};
    clef_buf_printf(&b, "POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\n%s", extra);
    if (content_type) clef_buf_printf(&b, "Content-Type: %s\r\n", content_type);
    clef_buf_printf(&b, "Content-Length: %zu\r\n\r\n", content_length);
    return b.data;
}

/* A connection to 127.0.0.1:port from `from` ("127.0.0.1", "127.0.0.2"),
 * non-blocking.  Returns the fd or -1. */
static HU_UNUSED int raw_connect(const char *from, unsigned port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, from, &a.sin_addr);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    if (connect(fd, (struct sockaddr *)&to, sizeof to) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    struct pollfd p = {fd, POLLOUT, 0};
    int err = 0;
    socklen_t el = sizeof err;
    if (poll(&p, 1, 5000) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Write all of p (waiting for room up to `timeout_s` in all).  Returns 0, or
 * the errno that stopped it (EPIPE / ECONNRESET when the server closed). */
static HU_UNUSED int raw_send_all(int fd, const void *p, size_t n, double timeout_s) {
    const char *c = p;
    double deadline = hu_now() + timeout_s;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w > 0) {
            c += w, n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR) return errno;
        int left = (int)((deadline - hu_now()) * 1000);
        if (left <= 0) return ETIMEDOUT;
        struct pollfd q = {fd, POLLOUT, 0};
        poll(&q, 1, left < 100 ? left : 100);
    }
    return 0;
}

typedef struct raw_reply {
    int status;         /* 0: no complete response arrived */
    int recv_error;     /* errno of a failed recv (ECONNRESET), 0 if none */
    int closed;         /* the server closed (EOF) after or instead of the response */
    int head_only;      /* set by the caller: the answer to a HEAD (no body whatever its length) */
    clef_buf raw;       /* everything received */
    const char *body;   /* into raw */
    size_t body_len;
    char request_id[160], typesafe_id[160], retry_after[32], content_type[96], connection[32], www_auth[64];
} raw_reply;

static HU_UNUSED void raw_reply_free(raw_reply *r) {
    clef_buf_free(&r->raw);
    memset(r, 0, sizeof *r);
}

static HU_UNUSED void header_value(const char *head, size_t head_len, const char *name, char *out, size_t cap) {
    out[0] = '\0';
    size_t nl = strlen(name);
    for (const char *p = head; p && p < head + head_len;) {
        const char *eol = memchr(p, '\n', (size_t)(head + head_len - p));
        if (!eol) break;
        if ((size_t)(eol - p) > nl && !strncasecmp(p, name, nl) && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ') v++;
            size_t vl = (size_t)(eol - v);
            while (vl && (v[vl - 1] == '\r' || v[vl - 1] == ' ')) vl--;
            if (vl >= cap) vl = cap - 1;
            memcpy(out, v, vl);
            out[vl] = '\0';
            return;
        }
        p = eol + 1;
    }
}

/* Parse the first final (non-1xx) response in r->raw if complete; 1 when done. */
static HU_UNUSED int raw_parse(raw_reply *r) {
    size_t off = 0;
    for (;;) {
        if (r->raw.len < off + 12) return 0;
        const char *base = r->raw.data + off;
        const char *end = NULL;
        for (size_t i = 0; i + 3 < r->raw.len - off; i++)
            if (!memcmp(base + i, "\r\n\r\n", 4)) {
                end = base + i + 4;
                break;
            }
        if (!end) return 0;
        if (strncmp(base, "HTTP/1.", 7)) return 0;
        int status = atoi(base + 9);
        if (status >= 100 && status < 200) {
            off = (size_t)(end - r->raw.data);
            continue;
        }
        size_t head_len = (size_t)(end - base);
        char cl[32];
        header_value(base, head_len, "Content-Length", cl, sizeof cl);
        size_t want = cl[0] && !r->head_only ? strtoul(cl, NULL, 10) : 0;
        size_t have = r->raw.len - (size_t)(end - r->raw.data);
        if (cl[0] && have < want) return 0;
        if (!cl[0] && !r->closed && !r->head_only) return 0;
        r->status = status;
        r->body = end;
        r->body_len = cl[0] || r->head_only ? want : have;
        header_value(base, head_len, "X-Request-Id", r->request_id, sizeof r->request_id);
        header_value(base, head_len, "x-typesafe-request-id", r->typesafe_id, sizeof r->typesafe_id);
        header_value(base, head_len, "Retry-After", r->retry_after, sizeof r->retry_after);
        header_value(base, head_len, "Content-Type", r->content_type, sizeof r->content_type);
        header_value(base, head_len, "Connection", r->connection, sizeof r->connection);
        header_value(base, head_len, "WWW-Authenticate", r->www_auth, sizeof r->www_auth);
        return 1;
    }
}

/* Read what is there without waiting; returns 1 once a response is complete,
 * -1 when the connection ended without one, 0 to wait for more. */
static HU_UNUSED int raw_pump(int fd, raw_reply *r) {
    char buf[65536];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) {
            clef_buf_append(&r->raw, buf, (size_t)n);
            if (raw_parse(r)) return 1;
            continue;
        }
        if (n == 0) {
            r->closed = 1;
            clef_buf_reserve(&r->raw, 1);
            return raw_parse(r) ? 1 : -1;
        }
        if (errno == EAGAIN || errno == EINTR) return 0;
        r->recv_error = errno;
        return raw_parse(r) ? 1 : -1;
    }
}

/* Wait up to timeout_s for a complete response on fd. */
static HU_UNUSED void raw_read_reply(int fd, double timeout_s, raw_reply *r) {
    double deadline = hu_now() + timeout_s;
    for (;;) {
        int st = raw_pump(fd, r);
        if (st != 0) return;
        int left = (int)((deadline - hu_now()) * 1000);
        if (left <= 0) return;
        struct pollfd q = {fd, POLLIN, 0};
        poll(&q, 1, left);
    }
}

/* Connect from `from`, send `req` (len bytes) at once, read one response. */
static HU_UNUSED double raw_roundtrip(const char *from, unsigned port, const char *req, size_t len, double timeout_s,
                            raw_reply *r) {
    memset(r, 0, sizeof *r);
    double t0 = hu_now();
    int fd = raw_connect(from, port);
    if (fd < 0) fail_msg("cannot connect from %s to port %u", from, port);
    int e = raw_send_all(fd, req, len, timeout_s);
    if (e && e != EPIPE && e != ECONNRESET) fail_msg("send: %s", strerror(e));
    raw_read_reply(fd, timeout_s, r);
    close(fd);
    return hu_now() - t0;
}

/* The parsed JSON error body of a reply; fails unless it is
 * {"error":{"message":string,"type":string,"param":string|null}} with
 * type `type` and a message containing `message`. */
static HU_UNUSED void assert_json_error(const char *what, const raw_reply *r, int status, const char *type,
                                        const char *message) {
    if (r->status != status)
        fail_msg("%s: status %d (recv error %s), expected %d: %.300s", what, r->status,
                 r->recv_error ? strerror(r->recv_error) : "none", status, r->raw.data ? r->raw.data : "");
    if (strcmp(r->content_type, "application/json")) fail_msg("%s: Content-Type '%s'", what, r->content_type);
    clef_err perr;
    json_value *v = json_parse(r->body, r->body_len, &perr);
    if (!v) fail_msg("%s: body is not JSON: %.*s", what, (int)r->body_len, r->body);
    const json_value *e = json_get(v, "error");
    const json_value *m = e ? json_get(e, "message") : NULL, *t = e ? json_get(e, "type") : NULL,
                     *p = e ? json_get(e, "param") : NULL;
    if (!m || m->type != JSON_STRING || !t || t->type != JSON_STRING || !p ||
        (p->type != JSON_STRING && p->type != JSON_NULL))
        fail_msg("%s: not an error body: %.*s", what, (int)r->body_len, r->body);
    if (strcmp(t->str, type)) fail_msg("%s: type %s, expected %s", what, t->str, type);
    if (!strstr(m->str, message)) fail_msg("%s: message '%s' lacks '%s'", what, m->str, message);
    if (!r->request_id[0] || strcmp(r->request_id, r->typesafe_id))
        fail_msg("%s: request ids '%s' / '%s'", what, r->request_id, r->typesafe_id);
    if ((status == 503 || status == 429) && strcmp(r->retry_after, "1"))
        fail_msg("%s: Retry-After '%s'", what, r->retry_after);
    json_free(v);
}

#endif
