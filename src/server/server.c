/* server.c — lifecycle of `clef serve`: listen, load the model in the
 * background, wait for SIGINT/SIGTERM, drain, stop.  See server.h. */
#include <errno.h>
#include <malloc.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/cuda/cuda.h"
#include "io/config.h"
#include "json/json.h"
#include "engine/placement.h"
#include "model/model.h"
#include "server/server_internal.h"
#include "util/timer.h"

void clef_server_say(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}

/* libmicrohttpd's own log lines, except the one it writes for every
 * connection the sweeper shut down mid-request (the hang-up it then reads:
 * "... due to the error: detected connection closure"): conns.c logs those
 * cuts itself, one line per deadline at most every 10 s, so a thousand slow
 * clients are not a thousand lines. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = '\0';
    if (strstr(msg, "when reading request due to the error: detected connection closure")) return;
    clef_server_say("clef serve: libmicrohttpd: %s", msg);
}

/* The name GET /v1/models lists: the name clients are served under, i.e.
 * the pinned --served-model-name, else "clef-omni" (without a pin any name
 * is accepted and echoed; the listing names the model, not its directory). */
static void listed_name(const clef_server_options *o, char *out, size_t cap) {
    snprintf(out, cap, "%s", o->served_model_name ? o->served_model_name : CLEF_SERVER_DEFAULT_LISTED_NAME);
}

/* 1 if s is a YYYY-MM-DD calendar date (month 01-12, day 01-31). */
static int is_date(const char *s, size_t n) {
    if (n != 10 || s[4] != '-' || s[7] != '-') return 0;
    for (size_t i = 0; i < 10; i++)
        if (i != 4 && i != 7 && (s[i] < '0' || s[i] > '9')) return 0;
    int month = (s[5] - '0') * 10 + (s[6] - '0'), day = (s[8] - '0') * 10 + (s[9] - '0');
    return month >= 1 && month <= 12 && day >= 1 && day <= 31;
}

/* The listing's "release_date": config.json's top-level "release_date" when
 * the checkpoint records one (a YYYY-MM-DD string), else "" (listed as
 * null).  A file date would change with every copy of the checkpoint, so
 * none is made up.  A value of another shape is reported and ignored. */
static void release_date(const char *dir, char *out, size_t cap) {
    out[0] = '\0';
    if (!dir) return; /* synthetic weights have no release */
    clef_err err;
    size_t len = 0;
    char *text = clef_read_text_file(dir, "config.json", CLEF_FILE_MAX_CONFIG, &len, &err);
    if (!text) return; /* the loader reports the missing file */
    json_value *root = json_parse(text, len, &err);
    free(text);
    const json_value *d = root && root->type == JSON_OBJECT ? json_get(root, "release_date") : NULL;
    if (d && d->type == JSON_STRING && is_date(d->str, d->len) && d->len < cap)
        snprintf(out, cap, "%.*s", (int)d->len, d->str);
    else if (d && d->type != JSON_NULL)
        clef_server_say("clef serve: %s/config.json: release_date is not a YYYY-MM-DD string; /v1/models lists null", dir);
    json_free(root);
}

/* Test hook: milliseconds every forward is stretched by, so the tests can
 * hold requests in flight (graceful stop, queue full); 0 in production. */
static long test_forward_delay_ms;

static void on_batch(void *ctx, size_t n_records, size_t n_tokens, double seconds) {
    clef_metrics_batch(ctx, n_records, n_tokens, seconds);
    if (test_forward_delay_ms > 0) {
        struct timespec ts = {test_forward_delay_ms / 1000, (test_forward_delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Background: open the engine, start the scheduler, then publish READY. */
static void *load_model(void *arg) {
    clef_server *s = arg;
    clef_engine_options eo = {.model_dir = s->opt.model_dir,
                              .synthetic = s->opt.synthetic,
                              .seed = s->opt.seed,
                              .synthetic_quant = s->opt.synthetic_quant,
                              .tokenizer = s->opt.tokenizer,
                              .n_threads = s->opt.n_threads,
                              .device = s->opt.device,
                              .numerics = s->opt.numerics,
                              .max_length = s->opt.max_length,
                              .truncate_state = s->opt.truncate_state, .text_only = s->opt.text_only,
                              .state_cache = s->opt.state_cache,
                              .gpu_memory = s->opt.gpu_memory,
                              .batch_tokens = s->opt.max_batch_tokens,
                              .towers = s->opt.towers,
                              .plan_advice = CLEF_PLACE_ADVICE_SERVE,
                              .limits = s->opt.limits,
                              .verbose = 1};
    clef_err_clear(&s->load_err);
    /* Test hooks: a slow load, so the tests can watch the loading answers;
     * slow forwards (see on_batch). */
    const char *fwd = getenv("CLEF_SERVE_TEST_FORWARD_DELAY_MS");
    if (fwd) test_forward_delay_ms = strtol(fwd, NULL, 10);
    const char *delay = getenv("CLEF_SERVE_TEST_LOAD_DELAY_MS");
    if (delay) {
        long ms = strtol(delay, NULL, 10);
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        if (ms > 0) nanosleep(&ts, NULL);
    }
    s->engine = clef_engine_open(&eo, &s->load_err);
    if (s->engine) {
        clef_scheduler_options so = {.max_queue = s->opt.max_queue,
                                     .max_batch_tokens = s->opt.max_batch_tokens,
                                     .on_batch = on_batch,
                                     .ctx = s->metrics};
        s->sched = clef_scheduler_start(s->engine, &so, &s->load_err);
    }
    if (!s->engine || !s->sched) {
        atomic_store_explicit(&s->state, SERVER_FAILED, memory_order_release);
        return NULL;
    }
    {
        clef_backend *be = clef_model_backend(clef_engine_model(s->engine));
        char detail[512];
        clef_cuda_describe(be, detail, sizeof detail);
        clef_metrics_set_device(s->metrics, clef_cuda_kernel_path(be), detail);
    }
    clef_server_say("clef serve: model loaded in %.2f s; ready", clef_engine_load_seconds(s->engine));
    atomic_store_explicit(&s->state, SERVER_READY, memory_order_release);
    return NULL;
}

static struct MHD_Daemon *start_daemon(clef_server *s) {
    char port[16];
    snprintf(port, sizeof port, "%u", s->opt.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(s->opt.host, port, &hints, &ai);
    if (gai != 0 || !ai) {
        clef_server_say("clef serve: cannot resolve host '%s': %s", s->opt.host, gai_strerror(gai));
        return NULL;
    }
    /* The event loop: a few polling threads serve every connection (an idle
     * one costs its socket and a small buffer, not a thread); the handler
     * suspends a connection while its work runs elsewhere (routes.c). */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    flags |= MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES ? MHD_USE_EPOLL : MHD_USE_AUTO;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d =
        MHD_start_daemon(flags, (uint16_t)s->opt.port, NULL, NULL, clef_server_handle, s,
                         MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                         MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                         MHD_OPTION_NOTIFY_COMPLETED, clef_server_completed, s,
                         MHD_OPTION_NOTIFY_CONNECTION, clef_server_notify_connection, s,
                         MHD_OPTION_THREAD_POOL_SIZE, (unsigned)CLEF_SERVER_POLL_THREADS,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->open_limit,
                         MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                         s->opt.max_connections_per_client == CLEF_SERVER_NO_CAP
                             ? 0u
                             : (unsigned)s->opt.max_connections_per_client,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                         MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) clef_server_say("clef serve: cannot listen on %s:%s", s->opt.host, port);
    return d;
}

/* SIGINT/SIGTERM: the first asks for a graceful stop (polled by
 * wait_for_stop); a second one while stopping exits at once.  A handler
 * rather than a blocked mask + sigwait, because threads that libraries start
 * on their own (OpenBLAS, OpenMP) keep the default mask and would otherwise
 * take a second signal with the default action. */
static volatile sig_atomic_t stop_signal, stop_count;

static void on_stop_signal(int sig) {
    if (stop_count++ > 0) {
        static const char msg[] = "clef serve: second signal; exiting without finishing\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        _exit(1);
    }
    stop_signal = sig;
}

static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* Wait for SIGINT/SIGTERM (returns 0) or a failed load (returns 1). */
static int wait_for_stop(clef_server *s) {
    for (;;) {
        if (stop_signal) {
            clef_server_say("clef serve: %s received; stopping", stop_signal == SIGINT ? "SIGINT" : "SIGTERM");
            return 0;
        }
        if (atomic_load_explicit(&s->state, memory_order_acquire) == SERVER_FAILED) {
            clef_server_say("clef serve: cannot load the model from %s%s: %s", s->opt.model_dir ? "" : "synthetic preset ",
                s->opt.model_dir ? s->opt.model_dir : s->opt.synthetic, s->load_err.message);
            return 1;
        }
        struct timespec tick = {0, 50 * 1000 * 1000};
        nanosleep(&tick, NULL);
    }
}

/* The bound of a stop (--drain-timeout-s): a thread that sleeps until the
 * deadline and then ends the process, unless the stop finishes first
 * (stop_watchdog_end).  What can outlast the deadline is a forward still
 * running for received requests, or a body-budget wait (up to
 * --budget-wait-ms); neither can be interrupted, so the process exits
 * around them: status 1 when a request whose body was complete goes
 * unanswered (the clients see their connection closed), 0 when only
 * uploads still arriving are cut (as a stop always cuts them). */
typedef struct stop_watchdog {
    clef_server *s;
    double deadline; /* clef_now() */
    pthread_mutex_t lock;
    pthread_cond_t wake; /* CLOCK_MONOTONIC, like clef_now() */
    int done, running;
    pthread_t thread;
} stop_watchdog;

static void *stop_watchdog_main(void *arg) {
    stop_watchdog *w = arg;
    struct timespec until;
    until.tv_sec = (time_t)w->deadline;
    until.tv_nsec = (long)((w->deadline - (double)until.tv_sec) * 1e9);
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&w->lock);
    int timed_out = 0;
    while (!w->done && !timed_out) timed_out = pthread_cond_timedwait(&w->wake, &w->lock, &until) == ETIMEDOUT;
    int done = w->done;
    pthread_mutex_unlock(&w->lock);
    if (done) return NULL;
    clef_server *s = w->s;
    long left = atomic_load(&s->deciding), cut = atomic_load(&s->in_flight) - left;
    if (left > 0) {
        clef_server_say("clef serve: %ld requests still being decided after --drain-timeout-s %.0f s; exiting without "
            "their answers", left, s->opt.drain_timeout_s);
        _exit(1);
    }
    clef_server_say("clef serve: stop not finished after --drain-timeout-s %.0f s; exiting (%ld requests whose body had "
        "not arrived are cut)", s->opt.drain_timeout_s, cut > 0 ? cut : 0);
    _exit(0);
}

static void stop_watchdog_start(stop_watchdog *w, clef_server *s, double deadline) {
    memset(w, 0, sizeof *w);
    w->s = s;
    w->deadline = deadline;
    pthread_mutex_init(&w->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->wake, &ca);
    pthread_condattr_destroy(&ca);
    w->running = pthread_create(&w->thread, NULL, stop_watchdog_main, w) == 0;
    if (!w->running) clef_server_say("clef serve: cannot start the drain watchdog; the stop is not bounded");
}

static void stop_watchdog_end(stop_watchdog *w) {
    pthread_mutex_lock(&w->lock);
    w->done = 1;
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
    if (w->running) pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->wake);
    pthread_mutex_destroy(&w->lock);
}

/* Stop accepting (the listening socket is closed: new connections are
 * refused, which a load balancer takes as "try another replica"; requests
 * on connections already open get 503 "stopping" + Connection: close), let
 * the requests whose body is complete (being decided or answered, and so
 * the queue) finish; the caller then settles what is still handed off
 * (settle) and its MHD_stop_daemon cuts the rest: uploads still arriving,
 * which could otherwise hold the stop until the deadline.  The watchdog,
 * started first, bounds all of it. */
static void drain(clef_server *s, stop_watchdog *w) {
    atomic_store(&s->stopping, 1);
    stop_watchdog_start(w, s, clef_now() + s->opt.drain_timeout_s);
    MHD_socket listen_fd = MHD_quiesce_daemon(s->daemon);
    if (listen_fd != MHD_INVALID_SOCKET) close(listen_fd);
    while (atomic_load(&s->deciding) > 0) { /* the watchdog ends the process at the deadline */
        struct timespec ms10 = {0, 10 * 1000 * 1000};
        nanosleep(&ms10, NULL);
    }
    long cut = atomic_load(&s->in_flight) - atomic_load(&s->deciding);
    if (cut > 0) clef_server_say("clef serve: cutting %ld requests whose body had not arrived", cut);
}

/* Every suspended connection resumed before MHD_stop_daemon (libmicrohttpd
 * aborts on one still suspended): the body-budget waits end (each by its
 * deadline), the deciders run what is queued, the scheduler finishes its
 * records; each of them resumes its connection.  Work handed off from here
 * on is refused with 503 "the server is shutting down" without suspending
 * (routes.c), so nothing is suspended again. */
static void settle(clef_server *s) {
    clef_workq_stop(s->body_waiter);
    clef_workq_stop(s->deciders);
    clef_scheduler_stop(s->sched);
}

/* Raise the soft open-file limit to the hard one and fit max_connections
 * into it (CLEF_SERVER_RESERVED_FDS kept for everything else); *open_limit
 * is what libmicrohttpd itself may hold: all the descriptors there are (at
 * most CLEF_SERVER_MAX_OPEN_CONNECTIONS), so that connections past
 * max_connections can still be answered. */
static void fit_connections(clef_server_options *o, size_t *open_limit) {
    struct rlimit rl = {0, 0};
    size_t allowed = CLEF_SERVER_AUTO_MAX_CONNECTIONS;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur < rl.rlim_max) {
            struct rlimit raised = {rl.rlim_max, rl.rlim_max};
            if (setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
        }
        if (rl.rlim_cur != RLIM_INFINITY)
            allowed = rl.rlim_cur > 2 * CLEF_SERVER_RESERVED_FDS ? (size_t)rl.rlim_cur - CLEF_SERVER_RESERVED_FDS
                                                                 : CLEF_SERVER_RESERVED_FDS;
    }
    if (!o->max_connections) {
        o->max_connections = allowed < CLEF_SERVER_AUTO_MAX_CONNECTIONS ? allowed : CLEF_SERVER_AUTO_MAX_CONNECTIONS;
    } else if (o->max_connections > allowed) {
        clef_server_say("clef serve: --max-connections %zu exceeds what the open-file limit (%llu) allows; using %zu",
            o->max_connections, (unsigned long long)rl.rlim_cur, allowed);
        o->max_connections = allowed;
    }
    if (o->max_connections > UINT32_MAX) o->max_connections = UINT32_MAX;
    *open_limit = allowed < CLEF_SERVER_MAX_OPEN_CONNECTIONS ? allowed : CLEF_SERVER_MAX_OPEN_CONNECTIONS;
    if (*open_limit < o->max_connections) *open_limit = o->max_connections;
}

static void fill_defaults(clef_server_options *o, size_t *open_limit) {
    if (!o->host) o->host = "127.0.0.1";
    if (!o->max_body_bytes) o->max_body_bytes = CLEF_SERVER_DEFAULT_MAX_BODY;
    fit_connections(o, open_limit);
    if (!o->max_connections_per_client) o->max_connections_per_client = CLEF_SERVER_DEFAULT_MAX_CONNECTIONS_PER_CLIENT;
    if (o->max_connections_per_client != CLEF_SERVER_NO_CAP && o->max_connections_per_client > UINT32_MAX)
        o->max_connections_per_client = CLEF_SERVER_NO_CAP;
    if (!o->limits.max_questions) o->limits = clef_limits_default();
    if (o->drain_timeout_s <= 0) o->drain_timeout_s = CLEF_SERVER_DEFAULT_DRAIN_TIMEOUT_S;
    if (o->api_key && !o->api_key[0]) o->api_key = NULL;
    if (!o->media_budget_bytes) o->media_budget_bytes = CLEF_SERVER_DEFAULT_MEDIA_BUDGET;
    if (!o->body_budget_bytes) o->body_budget_bytes = CLEF_SERVER_DEFAULT_BODY_BUDGET_BODIES * o->max_body_bytes;
    if (!o->budget_wait_ms) o->budget_wait_ms = CLEF_SERVER_DEFAULT_BUDGET_WAIT_MS;
    if (o->budget_wait_ms < 0) o->budget_wait_ms = 0;
    /* The deadlines: 0 = the default; below that, none (kept as 0 from here on). */
    if (!o->header_timeout_s) o->header_timeout_s = CLEF_SERVER_DEFAULT_HEADER_TIMEOUT_S;
    if (o->header_timeout_s < 0) o->header_timeout_s = 0;
    if (!o->body_timeout_s) o->body_timeout_s = CLEF_SERVER_DEFAULT_BODY_TIMEOUT_S;
    if (o->body_timeout_s < 0) o->body_timeout_s = 0;
    if (!o->min_body_rate) o->min_body_rate = CLEF_SERVER_DEFAULT_MIN_BODY_RATE;
    if (o->min_body_rate == CLEF_SERVER_NO_CAP) o->min_body_rate = 0;
}

/* Worker threads for decisions: one per online core, within bounds. */
static size_t worker_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < CLEF_SERVER_MIN_WORKERS) n = CLEF_SERVER_MIN_WORKERS;
    if (n > CLEF_SERVER_MAX_WORKERS) n = CLEF_SERVER_MAX_WORKERS;
    return (size_t)n;
}

/* The deadlines, for the start-up log. */
static void deadline_text(const clef_server_options *o, char *out, size_t cap) {
    char head[48], body[96];
    if (o->header_timeout_s > 0) snprintf(head, sizeof head, "%.0f s", o->header_timeout_s);
    else snprintf(head, sizeof head, "none");
    if (o->body_timeout_s <= 0) snprintf(body, sizeof body, "none");
    else if (o->min_body_rate) snprintf(body, sizeof body, "%.0f s + 1 s per %zu KiB received", o->body_timeout_s,
                                        o->min_body_rate >> 10);
    else snprintf(body, sizeof body, "%.0f s", o->body_timeout_s);
    snprintf(out, cap, "request head within %s, body within %s", head, body);
}

/* The two memory budgets (util/budget.h); UNLIMITED becomes capacity 0. */
static void open_budgets(clef_server *s) {
    size_t media = s->opt.media_budget_bytes, body = s->opt.body_budget_bytes;
    s->media_budget = clef_budget_new("decoded-media", media == CLEF_SERVER_BUDGET_UNLIMITED ? 0 : media);
    s->body_budget = clef_budget_new("request-body", body == CLEF_SERVER_BUDGET_UNLIMITED ? 0 : body);
    s->opt.limits.media.budget = s->media_budget;
    s->opt.limits.media.budget_wait_ms = s->opt.budget_wait_ms;
}

static void budget_text(size_t bytes, char *out, size_t cap) {
    if (bytes == CLEF_SERVER_BUDGET_UNLIMITED) snprintf(out, cap, "unlimited");
    else snprintf(out, cap, "%zu bytes", bytes);
}

static void close_budgets(clef_server *s) {
    clef_budget_free(s->media_budget);
    clef_budget_free(s->body_budget);
}

/* Everything clef_server_run made, once no daemon serves (never started, or
 * stopped): the sweeper, the worker queues (what they hold has run), the
 * scheduler and engine (NULL until loaded), metrics, budgets, s itself.
 * Every free below takes NULL. */
static void free_server(clef_server *s) {
    clef_conns_destroy(s);
    clef_workq_free(s->deciders);
    clef_workq_free(s->body_waiter);
    clef_scheduler_free(s->sched);
    clef_engine_close(s->engine);
    clef_metrics_free(s->metrics);
    close_budgets(s);
    free(s);
}

int clef_server_run(const clef_server_options *opt) {
    clef_server *s = clef_xcalloc(1, sizeof *s);
    s->opt = *opt;
    fill_defaults(&s->opt, &s->open_limit);
    listed_name(&s->opt, s->listed_name, sizeof s->listed_name);
    release_date(s->opt.model_dir, s->release_date, sizeof s->release_date);
    s->metrics = clef_metrics_new();
    open_budgets(s);
    atomic_init(&s->state, SERVER_LOADING);

    install_signals();
    /* A fixed mmap threshold: buffers of 1 MiB and more (bodies, hidden
     * states, forward workspaces) are mapped and unmapped, so the server's
     * RSS returns to its base after a burst instead of keeping glibc's
     * dynamically raised threshold's worth of heap. */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);

    clef_conns_init(s);
    s->deciders = clef_workq_start("clef-decide", worker_count());
    s->body_waiter = clef_workq_start("clef-bodywait", 1);
    if (!s->deciders || !s->body_waiter || clef_conns_start_sweeper(s) != 0) {
        clef_server_say("clef serve: cannot start the worker threads");
        free_server(s);
        return 1;
    }
    s->daemon = start_daemon(s);
    if (!s->daemon) {
        free_server(s);
        return 1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    clef_server_say("clef serve: listening on http://%s%s%s:%u (model %s loading from %s%s)", strchr(s->opt.host, ':') ? "[" : "",
        s->opt.host, strchr(s->opt.host, ':') ? "]" : "", di ? di->port : s->opt.port, s->listed_name,
        s->opt.model_dir ? "" : "synthetic preset ", s->opt.model_dir ? s->opt.model_dir : s->opt.synthetic);
    char media[48], body[48];
    budget_text(s->opt.media_budget_bytes, media, sizeof media);
    budget_text(s->opt.body_budget_bytes, body, sizeof body);
    clef_server_say("clef serve: memory budgets: decoded media %s, request bodies %s (a request waits up to %ld ms for room)", media,
        body, s->opt.budget_wait_ms);
    char per_client[64], deadlines[200];
    if (s->opt.max_connections_per_client == CLEF_SERVER_NO_CAP)
        snprintf(per_client, sizeof per_client, "no per-client cap");
    else
        snprintf(per_client, sizeof per_client, "%zu per client address", s->opt.max_connections_per_client);
    deadline_text(&s->opt, deadlines, sizeof deadlines);
    clef_server_say("clef serve: connections: at most %zu served (up to %zu more answered 503), %s; %s; %u polling threads, %zu "
        "workers",
        s->opt.max_connections, s->open_limit - s->opt.max_connections, per_client, deadlines,
        (unsigned)CLEF_SERVER_POLL_THREADS, clef_workq_threads(s->deciders));
    if (pthread_create(&s->loader, NULL, load_model, s) != 0) {
        clef_server_say("clef serve: cannot start the loader thread");
        MHD_stop_daemon(s->daemon);
        return 1;
    }
    int rc = wait_for_stop(s);
    if (atomic_load_explicit(&s->state, memory_order_acquire) == SERVER_LOADING) {
        /* Loading cannot be interrupted; a stop request while loading
         * means nothing is queued, so leave without waiting for it. */
        atomic_store(&s->stopping, 1);
        MHD_stop_daemon(s->daemon);
        clef_server_say("clef serve: stopped while the model was loading");
        _exit(0);
    }
    stop_watchdog w;
    if (rc == 0) drain(s, &w);
    else atomic_store(&s->stopping, 1);
    pthread_join(s->loader, NULL);
    settle(s);
    MHD_stop_daemon(s->daemon);
    if (rc == 0) stop_watchdog_end(&w);
    free_server(s);
    if (rc == 0) clef_server_say("clef serve: stopped");
    return rc;
}
