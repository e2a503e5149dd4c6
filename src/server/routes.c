/* routes.c — the HTTP request handler: routing, auth, body intake, the four
 * routes, error bodies, request ids and the access log.  See server.h.
 *
 * libmicrohttpd calls the handler several times per request: once when the
 * headers are in (we decide everything that needs no body there: route,
 * method, auth, loading, content type, declared length), once per body
 * chunk, and once more when the body is complete. */
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

/* Per-request state, from the first call to the completion callback. */
typedef struct request_ctx {
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
    client_address(c, addr, sizeof addr);
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
    if (atomic_load(&s->stopping)) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
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
    if (cl) {
        char *end;
        unsigned long long declared = strtoull(cl, &end, 10);
        if (declared > s->opt.max_body_bytes) {
            char msg[160];
            snprintf(msg, sizeof msg, "request body of %llu bytes exceeds the limit of %zu bytes", declared,
                     s->opt.max_body_bytes);
            return fail_now(s, c, r, 413, CLEF_E_TOO_LARGE, NULL, msg);
        }
        /* The body budget first: the bytes of every body held in memory. */
        clef_err e;
        if (clef_budget_acquire(s->body_budget, (size_t)declared + 1, s->opt.budget_wait_ms, &e))
            return respond_error(s, c, r, &e, NULL, 0);
        r->body_charged = (size_t)declared + 1;
        /* Exact-size buffer: no doubling spike for large bodies. */
        r->body.data = clef_xmalloc((size_t)declared + 1);
        r->body.cap = (size_t)declared + 1;
        r->body.data[0] = '\0';
    }
    return MHD_YES;
}

/* Free the body and give its bytes back to the body budget. */
static void drop_body(clef_server *s, request_ctx *r) {
    clef_buf_free(&r->body);
    r->body = (clef_buf){0};
    clef_budget_release(s->body_budget, r->body_charged);
    r->body_charged = 0;
}

/* Grow a chunked body's buffer to hold `need` bytes (doubling, at most the
 * limit + 1), charging the growth to the body budget first; -1 when the
 * budget refuses (the body is dropped, r->over_budget says why). */
static int grow_body(clef_server *s, request_ctx *r, size_t need) {
    size_t cap = r->body.cap ? 2 * r->body.cap : 4096;
    if (cap > s->opt.max_body_bytes + 1) cap = s->opt.max_body_bytes + 1;
    if (cap < need) cap = need;
    clef_err e;
    if (clef_budget_acquire(s->body_budget, cap - r->body_charged, s->opt.budget_wait_ms, &e)) {
        r->over_budget = clef_xmalloc(sizeof *r->over_budget);
        *r->over_budget = e;
        drop_body(s, r);
        return -1;
    }
    r->body.data = clef_xrealloc(r->body.data, cap);
    r->body.cap = cap;
    r->body_charged = cap;
    return 0;
}

/* Keep a body chunk, or once past the limit (or refused by the body budget)
 * drop the buffer and discard the rest (a chunked upload declares no length
 * up front). */
static void absorb(clef_server *s, request_ctx *r, const char *data, size_t n) {
    if (r->too_large || r->over_budget) return;
    if (r->body.len + n > s->opt.max_body_bytes) {
        r->too_large = 1;
        drop_body(s, r);
        return;
    }
    if (r->body.len + n + 1 > r->body.cap && grow_body(s, r, r->body.len + n + 1)) return;
    clef_buf_append(&r->body, data, n);
}

static int model_matches(const clef_server *s, const clef_request *req) {
    const char *pinned = s->opt.served_model_name;
    return !pinned || (strlen(pinned) == req->model_len && !memcmp(pinned, req->model, req->model_len));
}

/* The complete body: parse + validate + encode here, forward on the engine
 * thread, render here. */
static enum MHD_Result systemone_body(clef_server *s, struct MHD_Connection *c, request_ctx *r) {
    clef_err err;
    clef_err_clear(&err);
    if (r->too_large) {
        clef_fail(&err, 413, CLEF_E_TOO_LARGE, NULL, "request body exceeds the limit of %zu bytes",
                  s->opt.max_body_bytes);
        return respond_error(s, c, r, &err, NULL, 0);
    }
    if (r->over_budget) return respond_error(s, c, r, r->over_budget, NULL, 0);
    clef_request req;
    if (clef_engine_parse(s->engine, r->body.data ? r->body.data : "", r->body.len, &req, &err) != 0)
        return respond_error(s, c, r, &err, NULL, 0);
    drop_body(s, r); /* the request tree holds what is needed */
    if (!model_matches(s, &req)) {
        char shown[160];
        size_t n = req.model_len < 120 ? req.model_len : 120;
        memcpy(shown, req.model, n);
        shown[n] = '\0';
        clef_fail(&err, 404, CLEF_E_REQUEST, "model", "model '%s%s' is not served here; this server serves '%s'", shown,
                  req.model_len > n ? "..." : "", s->opt.served_model_name);
        clef_request_free(&req);
        return respond_error(s, c, r, &err, NULL, 0);
    }
    clef_job job;
    clef_decide_params params = {.truncate_state = -1};
    if (clef_engine_encode(s->engine, &req, &params, &job, &err) != 0) return respond_error(s, c, r, &err, NULL, 0);
    if (clef_scheduler_submit(s->sched, &job, &err) != 0) {
        clef_job_free(&job);
        return respond_error(s, c, r, &err, NULL, 0);
    }
    clef_buf out = {0};
    clef_engine_render(&job, &out);
    r->tokens = job.rec.n_ids;
    clef_job_free(&job);
    return respond(s, c, r, 200, "application/json", &out, NULL, 0);
}

/* ---- dispatch ------------------------------------------------------- */

/* Does the request announce a body (Content-Length > 0 or chunked)? */
static int has_body(struct MHD_Connection *c) {
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > 0) return 1;
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) != NULL;
}

static int is_get(const char *method) { return !strcmp(method, "GET") || !strcmp(method, "HEAD"); }

/* Everything decided on the headers: route, method, auth, then the route's
 * own header checks.  Returns with a response queued, or MHD_YES to read
 * the body. */
static enum MHD_Result first_call(clef_server *s, struct MHD_Connection *c, request_ctx *r, const char *method,
                                  const char *url) {
    if (r->route == CLEF_ROUTE_UI && s->opt.no_ui) r->route = CLEF_ROUTE_OTHER; /* --no-ui: 404 as any path */
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

enum MHD_Result clef_server_handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                   const char *version, const char *upload_data, size_t *upload_data_size,
                                   void **con_cls) {
    clef_server *s = cls;
    request_ctx *r = *con_cls;
    if (!r) {
        r = clef_xcalloc(1, sizeof *r);
        *con_cls = r;
        atomic_fetch_add(&s->in_flight, 1);
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
        r->holding = te != NULL || declared <= bound;
        enum MHD_Result rc = first_call(s, c, r, method, url);
        r->holding = 0;
        r->discard_left = te ? bound : declared;
        return rc;
    }
    if (*upload_data_size) {
        if (r->held) {
            if (*upload_data_size > r->discard_left) {
                /* a chunked body past the bound: libmicrohttpd cannot queue
                 * an answer mid-body, so the connection is cut */
                char addr[64], line[400];
                client_address(c, addr, sizeof addr);
                int n = snprintf(line, sizeof line,
                                 "clef: %s \"%s %s\" closed: body past %llu bytes before its %d answer id=%s\n", addr,
                                 r->method, r->path, discard_bound(s), r->held_status, r->id);
                if (n > 0) {
                    ssize_t w = write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
                    (void)w;
                }
                return MHD_NO;
            }
            r->discard_left -= *upload_data_size;
        } else if (!r->responded) {
            absorb(s, r, upload_data, *upload_data_size);
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (!r->body_complete) { /* from here on a stop waits for this request (server.c drain) */
        r->body_complete = 1;
        atomic_fetch_add(&s->deciding, 1);
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
    drop_body(s, r);
    clef_buf_free(&r->held_body);
    free(r->over_budget);
    if (r->body_complete) atomic_fetch_sub(&s->deciding, 1);
    free(r);
    *con_cls = NULL;
    atomic_fetch_sub(&s->in_flight, 1);
}
