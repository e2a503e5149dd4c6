/* routes.c — the HTTP request handler: routing, auth, body intake, the four
 * routes, error bodies, request ids and the access log.  See server.h.
 *
 * libmicrohttpd calls the handler several times per request: once when the
 * headers are in (we decide everything that needs no body there: route,
 * method, auth, loading, content type, declared length), once per body
 * chunk, and once more when the body is complete.
 *
 * The handler runs on one of libmicrohttpd's few polling threads, which
 * serve every connection, so it never waits there.  Whatever can wait is
 * handed off while the connection is suspended (MHD_suspend_connection;
 * libmicrohttpd then neither reads it nor calls the handler) and the worker
 * that finishes it resumes the connection, after which libmicrohttpd calls
 * the handler again at the same step:
 *   - a body-budget wait (the body's Content-Length at the headers, or a
 *     chunked body's buffer growing): to s->body_waiter;
 *   - the decision (parse, validate, encode, media decoding and its budget
 *     waits): to s->deciders, whose task queues the record on the scheduler
 *     without waiting; the engine thread's callback resumes the connection,
 *     and the handler renders and queues the answer.
 * While suspended, the request_ctx belongs to the one worker (or engine
 * callback) that will resume it; each touches nothing of it after
 * MHD_resume_connection, which also orders its writes before the handler's
 * next reads (libmicrohttpd takes a mutex on both sides). */
#define _GNU_SOURCE /* strcasestr */
#include <ctype.h>
#include <netdb.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "decision/answer.h"
#include "engine/state_cache.h"
#include "json/json.h"
#include "server/auth.h"
#include "server/embedded.h"
#include "server/server_internal.h"
#include "util/timer.h"

#define REQUEST_ID_MAX 128
#define REQUEST_ID_HEADER "X-Request-Id"
#define TYPESAFE_ID_HEADER "x-typesafe-request-id"
#define LOG_PATH_MAX 200

typedef struct extra_header {
    const char *name, *value;
} extra_header;

/* A body-budget wait handed to s->body_waiter. */
typedef enum body_wait { WAIT_NONE, WAIT_HEAD, WAIT_GROW } body_wait;
/* The decision handed to s->deciders (then the scheduler). */
typedef enum decide_state { DECIDE_NONE, DECIDE_RUNNING, DECIDE_DONE } decide_state;

/* Per-request state, from the first call to the completion callback. */
typedef struct request_ctx {
    clef_server *s;            /* for the worker and engine threads */
    struct MHD_Connection *c;
    clef_conn *conn;           /* the connection's state (conns.c); NULL only if never announced */
    double t0;
    clef_route route;
    char method[16];
    char path[LOG_PATH_MAX + 1];  /* printable copy for the log */
    char id[REQUEST_ID_MAX + 1];
    clef_buf body;
    size_t body_charged; /* bytes of the body budget `body` holds (its capacity) */
    clef_err *over_budget; /* a chunked body the body budget refused: the rest is discarded, 503 at the end */
    int too_large;  /* body passed the limit: the rest is discarded, 413 at the end */
    int responded;
    int headers_checked; /* first_call ran (on the first call, or deferred to the last) */
    /* A refusal decided from the headers of a request that announced a body
     * is held, not queued: libmicrohttpd would close without reading the
     * body, and a client that writes its body at once would get EPIPE
     * instead of the status.  The body is read and discarded (at most
     * discard_left bytes), then the held answer is queued. */
    int holding;          /* 1 while first_call runs: respond() holds instead of queueing */
    int held;             /* an answer is held in held_* */
    int held_status;
    const char *held_type; /* a string literal */
    clef_buf held_body;
    extra_header held_extra[2]; /* names and values are string literals */
    size_t held_n_extra;
    unsigned long long discard_left; /* body bytes still read and dropped before the held answer */
    int body_complete;    /* the last call came: counted in clef_server.deciding until completion */
    int hold_ok;          /* a refusal from the headers may be held (chunked, or declared <= discard_bound) */
    int close_after;      /* answer with Connection: close (a connection over --max-connections) */
    /* A body-budget wait, while the connection is suspended: */
    body_wait wait;       /* which step resumes (WAIT_NONE: none pending) */
    size_t wait_bytes;    /* bytes asked of the body budget */
    size_t grow_cap;      /* WAIT_GROW: the buffer capacity those bytes are for */
    double wait_deadline; /* clef_now() at the ask + --budget-wait-ms */
    int wait_granted;     /* set by the waiter: 1 = the bytes are held, 0 = refused (wait_err) */
    clef_err wait_err;
    /* The decision, while the connection is suspended: */
    decide_state decide;
    clef_job job;         /* the encoded request, owned while job_live */
    int job_live;
    clef_err decide_err;  /* DECIDE_DONE: status 0 = job's logits are filled, else the answer */
    size_t tokens;  /* input tokens of an answered decision, for the log */
} request_ctx;

/* ---- small helpers -------------------------------------------------- */

static clef_route route_of(const char *url) {
    if (!strcmp(url, "/v1/systemone")) return CLEF_ROUTE_SYSTEMONE;
    if (!strcmp(url, "/v1/models")) return CLEF_ROUTE_MODELS;
    if (!strcmp(url, "/healthz")) return CLEF_ROUTE_HEALTHZ;
    if (!strcmp(url, "/metrics")) return CLEF_ROUTE_METRICS;
    if (!strcmp(url, "/")) return CLEF_ROUTE_UI;
    if (!strcmp(url, "/openapi.json")) return CLEF_ROUTE_OPENAPI;
    return CLEF_ROUTE_OTHER;
}

static void copy_printable(char *dst, size_t cap, const char *src) {
    size_t n = 0;
    for (; src && src[n] && n + 1 < cap; n++) dst[n] = (src[n] > 0x20 && src[n] < 0x7f) ? src[n] : '?';
    dst[n] = '\0';
}

/* 1 if a client's request id is 1..REQUEST_ID_MAX visible ASCII characters. */
static int request_id_ok(const char *given) {
    size_t n = given ? strlen(given) : 0;
    int ok = n > 0 && n <= REQUEST_ID_MAX;
    for (size_t i = 0; ok && i < n; i++) ok = given[i] > 0x20 && given[i] < 0x7f;
    return ok;
}

/* The client's X-Request-Id when valid, else its x-typesafe-request-id (the
 * TypeSafe SDK's name) when valid, else 16 random hex digits.  Sent back
 * under both names (respond). */
static void request_id(struct MHD_Connection *c, char *out) {
    static const char *const names[] = {REQUEST_ID_HEADER, TYPESAFE_ID_HEADER};
    for (size_t k = 0; k < 2; k++) {
        const char *given = MHD_lookup_connection_value(c, MHD_HEADER_KIND, names[k]);
        if (request_id_ok(given)) {
            memcpy(out, given, strlen(given) + 1);
            return;
        }
    }
    unsigned char rnd[8];
    static atomic_ulong counter;
    if (RAND_bytes(rnd, sizeof rnd) != 1) {
        unsigned long x = atomic_fetch_add(&counter, 1) ^ ((unsigned long)getpid() << 32);
        memcpy(rnd, &x, sizeof rnd);
    }
    for (size_t i = 0; i < sizeof rnd; i++) sprintf(out + 2 * i, "%02x", rnd[i]);
}

static void client_address(struct MHD_Connection *c, char *out, size_t cap) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    snprintf(out, cap, "-");
    if (!ci || !ci->client_addr) return;
    socklen_t len = ci->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (getnameinfo(ci->client_addr, len, out, (socklen_t)cap, NULL, 0, NI_NUMERICHOST) != 0) snprintf(out, cap, "-");
}

/* One line per request, written with a single write(2) so lines from
 * concurrent connections never interleave. */
static void access_log(struct MHD_Connection *c, const request_ctx *r, int status, double ms) {
    char addr[64], line[512];
    if (r->conn) snprintf(addr, sizeof addr, "%s", r->conn->addr);
    else client_address(c, addr, sizeof addr);
    int n = snprintf(line, sizeof line, "clef: %s \"%s %s\" %d tokens=%zu ms=%.1f id=%s\n", addr, r->method, r->path,
                     status, r->tokens, ms, r->id);
    if (n > 0) {
        ssize_t w = write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)w;
    }
}

/* ---- responses ------------------------------------------------------ */

/* Queue `body` (taken; may be empty) with status and content type, the
 * request id (under both names), Retry-After on 503, any extra headers;
 * count and log it.  While r->holding, keep it in r->held_* instead. */
static enum MHD_Result respond(clef_server *s, struct MHD_Connection *c, request_ctx *r, int status,
                               const char *content_type, clef_buf *body, const extra_header *extra, size_t n_extra) {
    if (r->holding) { /* a refusal from the headers: held until the body is read (request_ctx) */
        r->held = 1;
        r->held_status = status;
        r->held_type = content_type;
        r->held_body = *body;
        *body = (clef_buf){0};
        r->held_n_extra = n_extra < 2 ? n_extra : 2;
        for (size_t i = 0; i < r->held_n_extra; i++) r->held_extra[i] = extra[i];
        r->responded = 1;
        return MHD_YES;
    }
    struct MHD_Response *resp;
    if (body->len) {
        resp = MHD_create_response_from_buffer(body->len, body->data, MHD_RESPMEM_MUST_FREE);
        if (resp) *body = (clef_buf){0};
    } else {
        resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    }
    clef_buf_free(body);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    MHD_add_response_header(resp, REQUEST_ID_HEADER, r->id);
    MHD_add_response_header(resp, TYPESAFE_ID_HEADER, r->id);
    if (status == 503) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (r->close_after || atomic_load(&s->stopping)) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    for (size_t i = 0; i < n_extra; i++) MHD_add_response_header(resp, extra[i].name, extra[i].value);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->responded = 1;
    double seconds = clef_now() - r->t0;
    clef_metrics_request(s->metrics, r->route, status, seconds);
    access_log(c, r, status, seconds * 1e3);
    return rc;
}

static enum MHD_Result respond_json(clef_server *s, struct MHD_Connection *c, request_ctx *r, int status,
                                    const char *json) {
    clef_buf b = {0};
    clef_buf_puts(&b, json);
    return respond(s, c, r, status, "application/json", &b, NULL, 0);
}

static enum MHD_Result respond_error(clef_server *s, struct MHD_Connection *c, request_ctx *r, const clef_err *err,
                                     const extra_header *extra, size_t n_extra) {
    clef_buf b = {0};
    clef_render_error(err, &b);
    int status = err->status >= 400 && err->status <= 599 ? err->status : 500;
    return respond(s, c, r, status, "application/json", &b, extra, n_extra);
}

static enum MHD_Result fail_now(clef_server *s, struct MHD_Connection *c, request_ctx *r, int status,
                                const char *type, const char *param, const char *message) {
    clef_err e;
    clef_fail(&e, status, type, param, "%s", message);
    return respond_error(s, c, r, &e, NULL, 0);
}

/* ---- GET routes ----------------------------------------------------- */

static enum MHD_Result get_healthz(clef_server *s, struct MHD_Connection *c, request_ctx *r) {
    if (atomic_load(&s->stopping)) return respond_json(s, c, r, 503, "{\"status\":\"stopping\"}");
    if (atomic_load_explicit(&s->state, memory_order_acquire) != SERVER_READY)
        return respond_json(s, c, r, 503, "{\"status\":\"loading\"}");
    return respond_json(s, c, r, 200, "{\"status\":\"ok\"}");
}

/* Both listing conventions in one object (SPEC §2.3). */
static enum MHD_Result get_models(clef_server *s, struct MHD_Connection *c, request_ctx *r) {
    clef_buf b = {0};
    size_t n = strlen(s->listed_name);
    clef_buf_puts(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
    json_render_string(s->listed_name, n, &b);
    clef_buf_puts(&b, ",\"object\":\"model\",\"owned_by\":\"clef\",\"capabilities\":[\"systemone\"]}],"
                      "\"models\":[{\"name\":");
    json_render_string(s->listed_name, n, &b);
    clef_buf d = {0};
    clef_buf_puts(&d, "Clef-Omni typed-decision model (SystemOne API), served by clef");
    if (s->opt.synthetic) /* say what answers: random weights, not the model */
        clef_buf_printf(&d, "; random weights of synthetic preset %s%s%s", s->opt.synthetic,
                        s->opt.synthetic_quant ? ", experts " : "", s->opt.synthetic_quant ? s->opt.synthetic_quant : "");
    clef_buf_puts(&b, ",\"description\":");
    json_render_string(d.data, d.len, &b);
    clef_buf_free(&d);
    clef_buf_puts(&b, ",\"release_date\":");
    if (s->release_date[0])
        json_render_string(s->release_date, strlen(s->release_date), &b);
    else
        clef_buf_puts(&b, "null");
    clef_buf_puts(&b, "}]}");
    return respond(s, c, r, 200, "application/json", &b, NULL, 0);
}

static enum MHD_Result get_metrics(clef_server *s, struct MHD_Connection *c, request_ctx *r) {
    int ready = atomic_load_explicit(&s->state, memory_order_acquire) == SERVER_READY;
    clef_buf b = {0};
    clef_metrics_render(s->metrics, ready ? clef_scheduler_queue_depth(s->sched) : 0, ready,
                        ready ? clef_engine_load_seconds(s->engine) : 0.0, &b);
    clef_metrics_render_budgets(s->media_budget, s->body_budget, &b);
    clef_state_cache_stats sc = {0};
    if (ready) clef_engine_state_cache_stats(s->engine, &sc);
    clef_metrics_render_state_cache(&sc, ready && sc.capacity > 0, &b);
    clef_metrics_render_placement(ready ? clef_engine_plan(s->engine) : NULL, &b);
    clef_conn_stats cs;
    clef_conns_stats(s, &cs);
    clef_metrics_render_connections(cs.open, s->opt.max_connections, cs.over_limit_total, cs.cut_headers_total,
                                    cs.cut_body_total, clef_workq_pending(s->deciders), &b);
    return respond(s, c, r, 200, "text/plain; version=0.0.4; charset=utf-8", &b, NULL, 0);
}

/* ---- static files: GET / (the playground) and GET /openapi.json ------ */

/* The page may load nothing but itself: inline script and style, data: /
 * blob: images and media (attachment previews), fetch to this origin. */
#define UI_CSP                                                                                                         \
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; "              \
    "media-src data: blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

static enum MHD_Result get_static(clef_server *s, struct MHD_Connection *c, request_ctx *r, const unsigned char *bytes,
                                  size_t len, const char *content_type, int page) {
    clef_buf b = {0};
    clef_buf_append(&b, bytes, len);
    static const extra_header page_headers[] = {{"Content-Security-Policy", UI_CSP},
                                                {"X-Content-Type-Options", "nosniff"},
                                                {"Referrer-Policy", "no-referrer"}};
    static const extra_header doc_headers[] = {{"X-Content-Type-Options", "nosniff"}};
    return page ? respond(s, c, r, 200, content_type, &b, page_headers, 3)
                : respond(s, c, r, 200, content_type, &b, doc_headers, 1);
}

/* ---- POST /v1/systemone --------------------------------------------- */

/* application/json, optionally with parameters; a charset must be UTF-8
 * (JSON text is UTF-8, RFC 8259).  An absent header is accepted. */
static int content_type_ok(const char *ct) {
    if (!ct) return 1;
    while (*ct == ' ' || *ct == '\t') ct++;
    static const char want[] = "application/json";
    if (strncasecmp(ct, want, sizeof want - 1)) return 0;
    const char *p = ct + sizeof want - 1;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '\0') return 1;
    if (*p != ';') return 0;
    const char *cs = strcasestr(p, "charset=");
    if (!cs) return 1;
    cs += 8;
    if (*cs == '"') cs++;
    return !strncasecmp(cs, "utf-8", 5) || !strncasecmp(cs, "utf8", 4);
}

/* ---- body-budget waits, off the polling threads ---------------------- */

/* On s->body_waiter: wait for r->wait_bytes until r->wait_deadline, then
 * resume the connection (nothing of r is touched after that). */
static void body_wait_task(void *arg) {
    request_ctx *r = arg;
    clef_server *s = r->s;
    struct MHD_Connection *c = r->c;
    clef_err_clear(&r->wait_err);
    r->wait_granted = clef_budget_acquire_until(s->body_budget, r->wait_bytes, r->wait_deadline,
                                                s->opt.budget_wait_ms, &r->wait_err) == 0;
    MHD_resume_connection(c);
}

/* Suspend the connection and hand a wait for `bytes` of the body budget to
 * the waiter thread; libmicrohttpd calls the handler again at the same step
 * once it is decided (finish_head_wait / finish_grow_wait).  When the waiter
 * no longer takes work (stopping), the wait is refused at once and the
 * connection resumed right away. */
static void start_wait(clef_server *s, struct MHD_Connection *c, request_ctx *r, body_wait kind, size_t bytes) {
    r->wait = kind;
    r->wait_bytes = bytes;
    r->wait_deadline = clef_now() + (double)s->opt.budget_wait_ms / 1000.0;
    r->wait_granted = 0;
    clef_conn_hold(s, r->conn); /* the wait is the server's: it does not count against the body's deadline */
    MHD_suspend_connection(c);
    if (clef_workq_submit(s->body_waiter, body_wait_task, r) != 0) {
        clef_fail(&r->wait_err, 503, CLEF_E_OVERLOADED, NULL, "the server is shutting down");
        MHD_resume_connection(c);
    }
}

/* Take `need` bytes of the body budget without blocking this thread.
 * Returns 0 when they are held, 1 when a wait was started (the connection
 * is suspended), -1 when refused at once (no wait configured): *e says why. */
static int charge_body(clef_server *s, struct MHD_Connection *c, request_ctx *r, body_wait kind, size_t need,
                       clef_err *e) {
    if (clef_budget_try_acquire(s->body_budget, need) == 0) return 0;
    if (s->opt.budget_wait_ms > 0) {
        start_wait(s, c, r, kind, need);
        return 1;
    }
    return clef_budget_acquire(s->body_budget, need, 0, e) == 0 ? 0 : -1; /* counts the refusal */
}

/* The exact-size buffer of a declared body whose bytes are charged. */
static void declared_buffer(request_ctx *r, size_t bytes) {
    r->body_charged = bytes;
    r->body.data = clef_xmalloc(bytes); /* exact size: no doubling spike for large bodies */
    r->body.cap = bytes;
    r->body.data[0] = '\0';
}

/* Checks that need only the headers.  A refusal here is held while the body
 * is read and dropped (clef_server_handle), then sent; a client waiting on
 * Expect: 100-continue gets 100 Continue first. */
static enum MHD_Result systemone_headers(clef_server *s, struct MHD_Connection *c, request_ctx *r) {
    if (atomic_load(&s->stopping))
        return fail_now(s, c, r, 503, CLEF_E_OVERLOADED, NULL, "the server is shutting down");
    if (atomic_load_explicit(&s->state, memory_order_acquire) != SERVER_READY)
        return fail_now(s, c, r, 503, CLEF_E_LOADING, NULL, "the model is loading; retry shortly");
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!content_type_ok(ct)) {
        char msg[300], shown[128];
        copy_printable(shown, sizeof shown, ct);
        snprintf(msg, sizeof msg, "Content-Type must be application/json, got '%s'", shown);
        return fail_now(s, c, r, 415, CLEF_E_REQUEST, NULL, msg);
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
    if (declared > s->opt.max_body_bytes) {
        char msg[160];
        snprintf(msg, sizeof msg, "request body of %llu bytes exceeds the limit of %zu bytes", declared,
                 s->opt.max_body_bytes);
        return fail_now(s, c, r, 413, CLEF_E_TOO_LARGE, NULL, msg);
    }
    if (declared > 0) { /* the body budget first: the bytes of every body held in memory */
        clef_err e;
        int rc = charge_body(s, c, r, WAIT_HEAD, (size_t)declared + 1, &e);
        if (rc < 0) return respond_error(s, c, r, &e, NULL, 0);
        if (rc == 0) declared_buffer(r, (size_t)declared + 1);
    }
    return MHD_YES;
}

/* Called again after a wait started at the headers: the buffer, or the
 * refusal (held like the other refusals from the headers). */
static enum MHD_Result finish_head_wait(clef_server *s, struct MHD_Connection *c, request_ctx *r) {
    r->wait = WAIT_NONE;
    clef_conn_unhold(s, r->conn);
    if (r->wait_granted) {
        declared_buffer(r, r->wait_bytes);
        return MHD_YES;
    }
    r->holding = r->hold_ok;
    enum MHD_Result rc = respond_error(s, c, r, &r->wait_err, NULL, 0);
    r->holding = 0;
    return rc;
}

/* Free the body and give its bytes back to the body budget. */
static void drop_body(clef_server *s, request_ctx *r) {
    clef_buf_free(&r->body);
    r->body = (clef_buf){0};
    clef_budget_release(s->body_budget, r->body_charged);
    r->body_charged = 0;
}

/* A chunked body the body budget refused: drop it and discard the rest
 * (503 at the end, with `e`). */
static void refuse_growth(clef_server *s, request_ctx *r, const clef_err *e) {
    r->over_budget = clef_xmalloc(sizeof *r->over_budget);
    *r->over_budget = *e;
    drop_body(s, r);
}

static void grow_to(request_ctx *r, size_t cap) {
    r->body.data = clef_xrealloc(r->body.data, cap);
    r->body.cap = cap;
    r->body_charged = cap;
}

/* Called again after a wait for a chunked body's growth. */
static void finish_grow_wait(clef_server *s, request_ctx *r) {
    r->wait = WAIT_NONE;
    clef_conn_unhold(s, r->conn);
    if (r->wait_granted) grow_to(r, r->grow_cap);
    else refuse_growth(s, r, &r->wait_err);
}

/* Grow a chunked body's buffer to hold `need` bytes (doubling, at most the
 * limit + 1), charging the growth to the body budget first.  Returns 0 when
 * grown, 1 when a wait was started (the connection is suspended: the chunk
 * is taken again when it resumes), -1 when the budget refused (the body is
 * dropped, r->over_budget says why). */
static int grow_body(clef_server *s, struct MHD_Connection *c, request_ctx *r, size_t need) {
    size_t cap = r->body.cap ? 2 * r->body.cap : 4096;
    if (cap > s->opt.max_body_bytes + 1) cap = s->opt.max_body_bytes + 1;
    if (cap < need) cap = need;
    clef_err e;
    r->grow_cap = cap;
    int rc = charge_body(s, c, r, WAIT_GROW, cap - r->body_charged, &e);
    if (rc == 0) grow_to(r, cap);
    else if (rc < 0) refuse_growth(s, r, &e);
    return rc;
}

/* Keep a body chunk, or once past the limit (or refused by the body budget)
 * drop the buffer and discard the rest (a chunked upload declares no length
 * up front).  Returns 1 when the connection was suspended for a budget wait
 * (the chunk is not taken), else 0. */
static int absorb(clef_server *s, struct MHD_Connection *c, request_ctx *r, const char *data, size_t n) {
    if (r->too_large || r->over_budget) return 0;
    if (r->body.len + n > s->opt.max_body_bytes) {
        r->too_large = 1;
        drop_body(s, r);
        return 0;
    }
    if (r->body.len + n + 1 > r->body.cap) {
        int rc = grow_body(s, c, r, r->body.len + n + 1);
        if (rc) return rc > 0;
    }
    clef_buf_append(&r->body, data, n);
    return 0;
}

static int model_matches(const clef_server *s, const clef_request *req) {
    const char *pinned = s->opt.served_model_name;
    return !pinned || (strlen(pinned) == req->model_len && !memcmp(pinned, req->model, req->model_len));
}

/* ---- the decision, off the polling threads ---------------------------- */

/* On the engine thread, after the record's forward. */
static void on_decided(void *ctx, clef_job *job, const clef_err *err) {
    request_ctx *r = ctx;
    struct MHD_Connection *c = r->c;
    (void)job; /* r->job */
    r->decide_err = *err;
    r->decide = DECIDE_DONE;
    MHD_resume_connection(c);
}

/* On s->deciders: parse + validate + encode, then queue the record on the
 * scheduler without waiting (on_decided resumes the connection); on a
 * refusal, resume it with the answer in r->decide_err. */
static void decide_task(void *arg) {
    request_ctx *r = arg;
    clef_server *s = r->s;
    struct MHD_Connection *c = r->c;
    clef_err err;
    clef_err_clear(&err);
    clef_request req;
    int parsed = clef_engine_parse(s->engine, r->body.data ? r->body.data : "", r->body.len, &req, &err) == 0;
    drop_body(s, r); /* the request tree holds what is needed */
    if (parsed && !model_matches(s, &req)) {
        char shown[160];
        size_t n = req.model_len < 120 ? req.model_len : 120;
        memcpy(shown, req.model, n);
        shown[n] = '\0';
        clef_fail(&err, 404, CLEF_E_REQUEST, "model", "model '%s%s' is not served here; this server serves '%s'", shown,
                  req.model_len > n ? "..." : "", s->opt.served_model_name);
        clef_request_free(&req);
        parsed = 0;
    }
    if (parsed) {
        clef_decide_params params = {.truncate_state = -1};
        if (clef_engine_encode(s->engine, &req, &params, &r->job, &err) == 0) {
            r->job_live = 1;
            if (clef_scheduler_submit_async(s->sched, &r->job, on_decided, r, &err) == 0) return;
            clef_job_free(&r->job);
            r->job_live = 0;
        }
    }
    r->decide_err = err;
    r->decide = DECIDE_DONE;
    MHD_resume_connection(c);
}

/* The complete body: refusals decided while it arrived are answered here;
 * otherwise the decision is handed to s->deciders (the connection is
 * suspended until it is done, then this is called again and answers). */
static enum MHD_Result systemone_body(clef_server *s, struct MHD_Connection *c, request_ctx *r) {
    clef_err err;
    clef_err_clear(&err);
    if (r->decide == DECIDE_DONE) {
        if (r->decide_err.status) return respond_error(s, c, r, &r->decide_err, NULL, 0);
        clef_buf out = {0};
        clef_engine_render(&r->job, &out);
        r->tokens = r->job.rec.n_ids;
        clef_job_free(&r->job);
        r->job_live = 0;
        return respond(s, c, r, 200, "application/json", &out, NULL, 0);
    }
    if (r->decide == DECIDE_RUNNING) return MHD_YES; /* not reached: the connection is suspended */
    if (r->too_large) {
        clef_fail(&err, 413, CLEF_E_TOO_LARGE, NULL, "request body exceeds the limit of %zu bytes",
                  s->opt.max_body_bytes);
        return respond_error(s, c, r, &err, NULL, 0);
    }
    if (r->over_budget) return respond_error(s, c, r, r->over_budget, NULL, 0);
    r->decide = DECIDE_RUNNING;
    MHD_suspend_connection(c);
    if (clef_workq_submit(s->deciders, decide_task, r) != 0) { /* stopping: no more workers */
        clef_fail(&r->decide_err, 503, CLEF_E_OVERLOADED, NULL, "the server is shutting down");
        r->decide = DECIDE_DONE;
        MHD_resume_connection(c);
    }
    return MHD_YES;
}

/* ---- dispatch ------------------------------------------------------- */

/* Does the request announce a body (Content-Length > 0 or chunked)? */
static int has_body(struct MHD_Connection *c) {
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > 0) return 1;
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) != NULL;
}

static int is_get(const char *method) { return !strcmp(method, "GET") || !strcmp(method, "HEAD"); }

/* Everything decided on the headers: the connection limit, route, method,
 * auth, then the route's own header checks.  Returns with a response
 * queued (or held), with a body-budget wait started (the connection
 * suspended), or MHD_YES to read the body. */
static enum MHD_Result first_call(clef_server *s, struct MHD_Connection *c, request_ctx *r, const char *method,
                                  const char *url) {
    if (r->route == CLEF_ROUTE_UI && s->opt.no_ui) r->route = CLEF_ROUTE_OTHER; /* --no-ui: 404 as any path */
    if (r->conn && r->conn->over_limit) { /* accepted past --max-connections: answered, then closed */
        char msg[200];
        snprintf(msg, sizeof msg, "the server is at its connection limit (%zu connections); retry later",
                 s->opt.max_connections);
        r->close_after = 1;
        return fail_now(s, c, r, 503, CLEF_E_OVERLOADED, NULL, msg);
    }
    if (r->route == CLEF_ROUTE_OTHER) {
        char msg[400];
        snprintf(msg, sizeof msg,
                 "no route %s %s; routes are POST /v1/systemone, GET /v1/models, GET /healthz, GET /metrics, "
                 "GET /openapi.json%s",
                 r->method, r->path, s->opt.no_ui ? "" : ", GET /");
        return fail_now(s, c, r, 404, CLEF_E_REQUEST, NULL, msg);
    }
    int post_route = r->route == CLEF_ROUTE_SYSTEMONE;
    if (post_route ? strcmp(method, "POST") : !is_get(method)) {
        char msg[200];
        snprintf(msg, sizeof msg, "method %s is not allowed on %s; use %s", r->method, url, post_route ? "POST" : "GET");
        clef_err e;
        clef_fail(&e, 405, CLEF_E_REQUEST, NULL, "%s", msg);
        extra_header allow = {MHD_HTTP_HEADER_ALLOW, post_route ? "POST" : "GET, HEAD"};
        return respond_error(s, c, r, &e, &allow, 1);
    }
    /* the page needs no key (it is static and asks for the key itself) */
    if (r->route != CLEF_ROUTE_HEALTHZ && r->route != CLEF_ROUTE_UI && s->opt.api_key && s->opt.api_key[0] &&
        !clef_auth_bearer_ok(MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
                             s->opt.api_key)) {
        clef_err e;
        clef_fail(&e, 401, CLEF_E_REQUEST, NULL, "missing or invalid API key; send 'Authorization: Bearer <key>'");
        extra_header challenge = {MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer"};
        return respond_error(s, c, r, &e, &challenge, 1);
    }
    switch (r->route) {
    case CLEF_ROUTE_HEALTHZ: return get_healthz(s, c, r);
    case CLEF_ROUTE_MODELS: return get_models(s, c, r);
    case CLEF_ROUTE_METRICS: return get_metrics(s, c, r);
    case CLEF_ROUTE_UI:
        return get_static(s, c, r, clef_embed_index_html, clef_embed_index_html_len, "text/html; charset=utf-8", 1);
    case CLEF_ROUTE_OPENAPI:
        return get_static(s, c, r, clef_embed_openapi_json, clef_embed_openapi_json_len, "application/json", 0);
    default: return systemone_headers(s, c, r);
    }
}

/* The most body bytes read and discarded before a refusal decided from the
 * headers is sent: max(2 x the body limit, 16 MiB).  A request declaring
 * more is answered at once (and libmicrohttpd closes without reading). */
static unsigned long long discard_bound(const clef_server *s) {
    unsigned long long twice = 2ull * s->opt.max_body_bytes, floor = 16ull << 20;
    return twice > floor ? twice : floor;
}

/* A Transfer-Encoding other than exactly "chunked" (compared like
 * libmicrohttpd does, ignoring case): libmicrohttpd takes such a body as one
 * of unknown length that only the client's close ends, so it is refused
 * with 501 before any of it is read. */
static enum MHD_Result refuse_encoding(clef_server *s, struct MHD_Connection *c, request_ctx *r, const char *te) {
    char shown[128], msg[300];
    size_t n = 0;
    for (; te[n] && n + 1 < sizeof shown; n++) shown[n] = (te[n] >= 0x20 && te[n] < 0x7f) ? te[n] : '?';
    shown[n] = '\0';
    snprintf(msg, sizeof msg,
             "Transfer-Encoding '%s%s' is not supported; send a Content-Length or Transfer-Encoding: chunked", shown,
             te[n] ? "..." : "");
    return fail_now(s, c, r, 501, CLEF_E_REQUEST, NULL, msg);
}

/* A chunked body past the discard bound while an answer is held:
 * libmicrohttpd cannot queue an answer mid-body, so the connection is cut. */
static enum MHD_Result cut_held_upload(clef_server *s, struct MHD_Connection *c, request_ctx *r) {
    char line[400];
    int n = snprintf(line, sizeof line, "clef: %s \"%s %s\" closed: body past %llu bytes before its %d answer id=%s\n",
                     r->conn ? r->conn->addr : "-", r->method, r->path, discard_bound(s), r->held_status, r->id);
    if (n > 0) {
        ssize_t w = write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)w;
    }
    return MHD_NO;
}

enum MHD_Result clef_server_handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                   const char *version, const char *upload_data, size_t *upload_data_size,
                                   void **con_cls) {
    clef_server *s = cls;
    request_ctx *r = *con_cls;
    if (!r) {
        r = clef_xcalloc(1, sizeof *r);
        *con_cls = r;
        atomic_fetch_add(&s->in_flight, 1);
        r->s = s;
        r->c = c;
        r->conn = clef_conn_of(c);
        clef_conn_set_phase(s, r->conn, CONN_BODY); /* the head is in: the body's deadline starts */
        r->t0 = clef_now();
        r->route = route_of(url);
        copy_printable(r->method, sizeof r->method, method);
        copy_printable(r->path, sizeof r->path, url);
        request_id(c, r->id);
        /* A request without a body is answered on the next call: a
         * response queued this early makes libmicrohttpd close the
         * connection (it assumes an unread body), which would break
         * keep-alive for every GET.  A request with a body is judged now;
         * a refusal is held while the body is read and dropped (up to
         * discard_bound), so a client writing its whole body first still
         * reads the answer. */
        if (!has_body(c)) return MHD_YES;
        r->headers_checked = 1;
        const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
        if (te && strcasecmp(te, "chunked")) return refuse_encoding(s, c, r, te);
        const char *cl = te ? NULL : MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0, bound = discard_bound(s);
        r->hold_ok = te != NULL || declared <= bound;
        r->holding = r->hold_ok;
        enum MHD_Result rc = first_call(s, c, r, method, url);
        r->holding = 0;
        r->discard_left = te ? bound : declared;
        return rc;
    }
    /* Called again after a body-budget wait: the step it interrupted. */
    if (r->wait == WAIT_HEAD) return finish_head_wait(s, c, r);
    if (r->wait == WAIT_GROW) finish_grow_wait(s, r);
    if (*upload_data_size) {
        if (r->held) {
            if (*upload_data_size > r->discard_left) return cut_held_upload(s, c, r);
            r->discard_left -= *upload_data_size;
        } else if (!r->responded) {
            if (absorb(s, c, r, upload_data, *upload_data_size)) return MHD_YES; /* suspended; taken on resume */
        }
        clef_conn_body_bytes(s, r->conn, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (!r->body_complete) { /* from here on a stop waits for this request (server.c drain) */
        r->body_complete = 1;
        atomic_fetch_add(&s->deciding, 1);
        if (clef_conn_body_complete(s, r->conn) != 0) return MHD_NO; /* past its deadline: being closed */
    }
    if (r->held) {
        r->held = 0;
        return respond(s, c, r, r->held_status, r->held_type, &r->held_body, r->held_extra, r->held_n_extra);
    }
    if (r->responded) return MHD_YES;
    if (!r->headers_checked) {
        r->headers_checked = 1;
        enum MHD_Result rc = first_call(s, c, r, method, url);
        if (r->responded || rc != MHD_YES) return rc;
    }
    return systemone_body(s, c, r);
}

void clef_server_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    clef_server *s = cls;
    request_ctx *r = *con_cls;
    if (!r) return;
    clef_conn_set_phase(s, r->conn, CONN_WAITING); /* the next request head's deadline starts */
    drop_body(s, r);
    clef_buf_free(&r->held_body);
    free(r->over_budget);
    if (r->job_live) clef_job_free(&r->job);
    if (r->body_complete) atomic_fetch_sub(&s->deciding, 1);
    free(r);
    *con_cls = NULL;
    atomic_fetch_sub(&s->in_flight, 1);
}
