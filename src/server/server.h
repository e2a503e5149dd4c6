/* server.h — the SystemOne HTTP server (`clef serve`), on libmicrohttpd.
 *
 * Routes (SPEC.md §2.3):
 *   POST /v1/systemone   the SystemOne request/response of SPEC §2 and §8
 *   GET  /v1/models      the served model (Jev/TypeSafe "models" and OpenAI "data" listings)
 *   GET  /healthz        503 {"status":"loading"} until the model answers, then 200 {"status":"ok"}
 *   GET  /metrics        Prometheus text (see server/metrics.h)
 *   GET  /               the playground page (src/server/ui/index.html; off with no_ui)
 *   GET  /openapi.json   the OpenAPI 3.1 description of these routes (src/server/openapi.json)
 *
 * Threads: libmicrohttpd's event loop (epoll) on CLEF_SERVER_POLL_THREADS
 * polling threads serves every connection: it reads the headers and the
 * body (refusing it early when over the limit) and never waits.  A complete
 * body is handed, with its connection suspended, to a pool of worker
 * threads (one per core) that parse, validate and encode it (engine.h
 * clef_engine_parse/clef_engine_encode) and queue the record on the
 * scheduler (engine/scheduler.h) without waiting; its single engine thread
 * packs waiting records into one forward and resumes each connection, whose
 * polling thread renders and sends the answer.  Body-budget waits run on
 * one more thread.  A sweeper thread closes connections past their
 * deadlines (a request head within header_timeout_s, a body within
 * body_timeout_s + its bytes / min_body_rate).  The model loads on a
 * background thread after the listener is up, so /healthz answers 503 while
 * loading.
 *
 * Errors are always {"error":{"message","type","param"}} with
 * Content-Type: application/json (SPEC §2.2); 503s carry Retry-After.  Every
 * response carries X-Request-Id and x-typesafe-request-id, the same value:
 * the client's X-Request-Id when valid, else its x-typesafe-request-id when
 * valid, else a random one.
 * One access-log line per request goes to stderr:
 *   clef: <client> "<METHOD> <path>" <status> tokens=<n> ms=<t> id=<request id>
 */
#ifndef CLEF_SERVER_SERVER_H
#define CLEF_SERVER_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "backend/numerics.h"
#include "decision/request.h"

#define CLEF_SERVER_DEFAULT_PORT 8000
#define CLEF_SERVER_DEFAULT_MAX_BODY ((size_t)32 << 20)
/* --max-connections left at 0: as many as the open-file limit allows (its
 * soft limit raised to the hard one at start, CLEF_SERVER_RESERVED_FDS kept
 * for the model's files and logs), at most this many. */
#define CLEF_SERVER_AUTO_MAX_CONNECTIONS 4096
#define CLEF_SERVER_RESERVED_FDS 64
/* libmicrohttpd itself accepts up to the open-file limit (at most this
 * many), so connections past --max-connections are answered 503 rather
 * than closed unanswered. */
#define CLEF_SERVER_MAX_OPEN_CONNECTIONS 65536
/* libmicrohttpd polling threads (each an epoll loop over its share of the
 * connections). */
#define CLEF_SERVER_POLL_THREADS 2
/* Worker threads for decisions: one per online core, within these bounds. */
#define CLEF_SERVER_MIN_WORKERS 2
#define CLEF_SERVER_MAX_WORKERS 64
#define CLEF_SERVER_DEFAULT_HEADER_TIMEOUT_S 10
#define CLEF_SERVER_DEFAULT_BODY_TIMEOUT_S 30
#define CLEF_SERVER_DEFAULT_MIN_BODY_RATE ((size_t)64 << 10) /* bytes per second */
#define CLEF_SERVER_DEFAULT_MAX_CONNECTIONS_PER_CLIENT 32
#define CLEF_SERVER_DEFAULT_DRAIN_TIMEOUT_S 60 /* --drain-timeout-s */
#define CLEF_SERVER_MAX_DRAIN_TIMEOUT_S 3600
#define CLEF_SERVER_NO_CAP SIZE_MAX /* max_connections_per_client: no per-client cap */
#define CLEF_SERVER_DEFAULT_MEDIA_BUDGET ((size_t)1024 << 20)
#define CLEF_SERVER_DEFAULT_BODY_BUDGET_BODIES 4 /* the body budget: 4 x max_body_bytes by default */
#define CLEF_SERVER_DEFAULT_BUDGET_WAIT_MS 2000
#define CLEF_SERVER_BUDGET_UNLIMITED SIZE_MAX
/* The name GET /v1/models lists when no --served-model-name is pinned. */
#define CLEF_SERVER_DEFAULT_LISTED_NAME "clef-omni"

typedef struct clef_server_options {
    const char *model_dir;         /* checkpoint directory; required unless `synthetic` is set */
    const char *synthetic;         /* NULL, or a synthetic preset ("tiny", "small", "full"): random
                                      weights drawn into memory for `seed` (io/synth.h), no files */
    uint64_t seed;                 /* with `synthetic` */
    const char *synthetic_quant;   /* with `synthetic`: NULL (BF16) or a quantized format (int4,
                                      fp8-block, nvfp4, nvfp4-modelopt), quantized in memory */
    const char *tokenizer;         /* tokenizer.json; NULL = <model_dir>/tokenizer.json (required
                                      with `synthetic`) */
    const char *host;              /* address to bind (IPv4 or IPv6 literal or name); NULL = "127.0.0.1" */
    unsigned port;                 /* TCP port; 0 = one the kernel picks (logged on stderr) */
    const char *served_model_name; /* pinned name: a request whose "model" differs gets 404; NULL =
                                      accept any string (GET /v1/models then lists the directory's
                                      base name) */
    const char *api_key;           /* NULL or "" = no authentication */
    size_t max_body_bytes;         /* request body limit; 0 = CLEF_SERVER_DEFAULT_MAX_BODY */
    size_t max_length;             /* token budget per record; 0 = 64000 */
    size_t max_batch_tokens;       /* tokens per packed forward; 0 = the scheduler's default */
    size_t max_queue;              /* records waiting before 503; 0 = the scheduler's default */
    size_t max_connections;        /* concurrent connections served; 0 = as many as the open-file limit
                                      allows, at most CLEF_SERVER_AUTO_MAX_CONNECTIONS; a larger N than
                                      the limit allows is lowered to it (logged).  Connections past it
                                      (libmicrohttpd accepts up to the open-file limit) get 503
                                      "overloaded" + Retry-After to each request, then are closed */
    size_t max_connections_per_client; /* concurrent connections from one client IP address
                                      (libmicrohttpd's per-IP limit: a connection past it is closed
                                      at accept, without an answer); 0 =
                                      CLEF_SERVER_DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
                                      CLEF_SERVER_NO_CAP = none */
    int n_threads;                 /* compute threads of the model; <= 0 = all cores */
    const char *device;            /* "cpu", "cuda", "cuda:N"; NULL = automatic (backend/device.h) */
    clef_numerics numerics;        /* GPU numerics (backend/numerics.h); 0 = environment, else fast */
    int text_only;                 /* 1: do not load the media towers; media requests get 422 */
    size_t state_cache;            /* state cache bytes (engine/state_cache.h); 0 = off */
    size_t gpu_memory;             /* GPU memory budget (clef_engine_options.gpu_memory); 0 = none */
    int towers;                    /* clef_engine_options.towers (CLEF_TOWERS_*) */
    int truncate_state;            /* 0 (default): refuse over-long records with 422; 1: cut the state
                                      like the reference.  A request's "truncate_state" wins. */
    clef_limits limits;            /* request limits; zeroed = clef_limits_default() (limits.media.budget
                                      is set by the server from media_budget_bytes) */
    size_t media_budget_bytes;     /* server-wide budget of decoded media (util/budget.h), charged from
                                      each request's media headers before decoding (media/media.h);
                                      0 = CLEF_SERVER_DEFAULT_MEDIA_BUDGET, CLEF_SERVER_BUDGET_UNLIMITED
                                      = none (still counted in the metrics) */
    size_t body_budget_bytes;      /* server-wide budget of request bodies held in memory, charged from
                                      Content-Length before the buffer is allocated (a chunked upload:
                                      as its buffer grows), given back once the body is parsed; 0 =
                                      CLEF_SERVER_DEFAULT_BODY_BUDGET_BODIES x max_body_bytes,
                                      CLEF_SERVER_BUDGET_UNLIMITED = none */
    long budget_wait_ms;           /* how long a request waits for room in either budget before its
                                      503; 0 = CLEF_SERVER_DEFAULT_BUDGET_WAIT_MS, < 0 = no wait */
    double header_timeout_s;       /* seconds a connection has for a complete request head, from its
                                      accept or its previous answer (idle keep-alive included); bytes do
                                      not restart it; 0 = CLEF_SERVER_DEFAULT_HEADER_TIMEOUT_S, < 0 = none */
    double body_timeout_s;         /* seconds a request has for its body, from its head, plus one second
                                      per min_body_rate bytes received (server-side budget waits do not
                                      count); 0 = CLEF_SERVER_DEFAULT_BODY_TIMEOUT_S, < 0 = none */
    size_t min_body_rate;          /* bytes per second that extend the body deadline; 0 =
                                      CLEF_SERVER_DEFAULT_MIN_BODY_RATE, CLEF_SERVER_NO_CAP = none (the
                                      body must arrive within body_timeout_s whatever its size) */
    double drain_timeout_s;        /* on SIGINT/SIGTERM, the bound of the stop: the requests whose
                                      body is complete (being decided or answered) have this long to be
                                      answered; uploads still arriving are cut at once; when the bound
                                      passes the process exits whatever is left (status 1 if a received
                                      request is unanswered, else 0); 0 = CLEF_SERVER_DEFAULT_DRAIN_TIMEOUT_S */
    int no_ui;                     /* 1: no playground page, GET / is 404 like any unknown path */
} clef_server_options;

/* Listen, load the model in the background, serve until SIGINT or SIGTERM,
 * then stop accepting, finish the requests whose body is complete (and so the
 * queue), cut the uploads still arriving, and return.  The stop is bounded:
 * drain_timeout_s after the signal the process exits (_exit) with whatever
 * is left, status 1 if a request whose body was complete is unanswered, else
 * 0.  Raises the soft RLIMIT_NOFILE to the hard limit.
 * Installs handlers for SIGINT/SIGTERM (a second one while stopping exits
 * the process at once with status 1) and ignores SIGPIPE.  Returns 0 after a
 * clean stop, 1 when the listener cannot start or the model fails to load
 * (the reason is logged). */
int clef_server_run(const clef_server_options *opt);

#endif
