/* httputil.h — helpers for the HTTP tests (tests/golden/test_http_*.c): start a
 * real `clef serve` process on 127.0.0.1 (port 0, the port read back from its
 * log), talk to it with libcurl, stop it with SIGTERM.  Header-only (static
 * functions) because the test glob builds each test from one file plus
 * testutil.c.  Every wait is bounded. */
#ifndef CLEF_TESTS_HTTPUTIL_H
#define CLEF_TESTS_HTTPUTIL_H

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "util/buf.h"

#define HU_UNUSED __attribute__((unused))

typedef struct hu_server {
    pid_t pid;
    unsigned port;
    char log_path[64];
    char base[64]; /* "http://127.0.0.1:PORT" */
} hu_server;

typedef struct hu_response {
    long status;          /* HTTP status; 0 when no response came (see curl_code) */
    int curl_code;        /* CURLE_OK or the transport error */
    clef_buf body;
    char request_id[160]; /* X-Request-Id */
    char retry_after[32];
    char content_type[96];
    char allow[64];
} hu_response;

static HU_UNUSED double hu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static HU_UNUSED void hu_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The whole log of a server so far (caller frees). */
static HU_UNUSED char *hu_log(const hu_server *s) {
    FILE *f = fopen(s->log_path, "rb");
    clef_buf b = {0};
    if (f) {
        char chunk[4096];
        size_t n;
        while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) clef_buf_append(&b, chunk, n);
        fclose(f);
    }
    clef_buf_reserve(&b, 0);
    b.data[b.len] = '\0';
    return b.data;
}

/* Servers still running, killed at exit so a failed assertion (which
 * longjmps past hu_stop) never leaves a process behind. */
#define HU_MAX_SERVERS 16
static pid_t hu_running[HU_MAX_SERVERS];
static char hu_logs[HU_MAX_SERVERS][64];

static void hu_kill_all(void) {
    for (int i = 0; i < HU_MAX_SERVERS; i++) {
        if (hu_running[i] > 0) {
            kill(hu_running[i], SIGKILL);
            waitpid(hu_running[i], NULL, 0);
            hu_running[i] = 0;
        }
        if (hu_logs[i][0]) unlink(hu_logs[i]);
        hu_logs[i][0] = '\0';
    }
}

static void hu_track(pid_t pid, const char *log, int on) {
    static int registered;
    if (!registered) atexit(hu_kill_all), registered = 1;
    for (int i = 0; i < HU_MAX_SERVERS; i++) {
        if (on && hu_running[i] == 0) {
            hu_running[i] = pid;
            snprintf(hu_logs[i], sizeof hu_logs[i], "%s", log);
            return;
        }
        if (!on && hu_running[i] == pid) {
            hu_running[i] = 0;
            return;
        }
    }
}

/* Start `clef serve --model <tiny> --port 0 <args...>` (args NULL-terminated)
 * with `env_key` as CLEF_API_KEY (NULL = unset).  Waits (≤ 30 s) for the
 * "listening on" line; does not wait for the model. */
static HU_UNUSED void hu_start_nowait(hu_server *s, const char *const *args, const char *env_key) {
    memset(s, 0, sizeof *s);
    snprintf(s->log_path, sizeof s->log_path, "/tmp/clef-http-test-XXXXXX");
    int fd = mkstemp(s->log_path);
    assert_true(fd >= 0);
    char model[1024];
    snprintf(model, sizeof model, "%s/tiny-clef-omni", CLEF_FIXTURES);
    const char *argv[64] = {CLEF_BINARY, "serve", "--model", model, "--port", "0", "--threads", "1"};
    int argc = 8;
    for (size_t i = 0; args && args[i]; i++)
        if (!strcmp(args[i], "--synthetic")) { /* a synthetic model instead of the tiny fixture */
            argv[2] = "--threads", argv[3] = "1", argc = 6;
            break;
        }
    for (size_t i = 0; args && args[i] && argc < 62; i++) argv[argc++] = args[i];
    argv[argc] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd, STDERR_FILENO);
        int devnull = open("/dev/null", O_RDWR);
        if (devnull >= 0) dup2(devnull, STDOUT_FILENO);
        if (env_key) setenv("CLEF_API_KEY", env_key, 1);
        else unsetenv("CLEF_API_KEY");
        execv(CLEF_BINARY, (char *const *)argv);
        _exit(127);
    }
    close(fd);
    s->pid = pid;
    hu_track(pid, s->log_path, 1);
    double deadline = hu_now() + 30;
    while (hu_now() < deadline) {
        char *log = hu_log(s);
        const char *p = strstr(log, "listening on http://127.0.0.1:");
        if (p) s->port = (unsigned)strtoul(p + strlen("listening on http://127.0.0.1:"), NULL, 10);
        free(log);
        if (s->port) break;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) fail_msg("clef serve exited early (status %d)", st);
        hu_sleep_ms(20);
    }
    if (!s->port) fail_msg("clef serve did not start listening");
    snprintf(s->base, sizeof s->base, "http://127.0.0.1:%u", s->port);
}

static HU_UNUSED void hu_free(hu_response *r) {
    clef_buf_free(&r->body);
    memset(r, 0, sizeof *r);
}

static size_t hu_body_cb(char *p, size_t size, size_t n, void *ud) {
    clef_buf_append(ud, p, size * n);
    return size * n;
}

static void hu_copy_header(const char *line, size_t len, const char *name, char *dst, size_t cap) {
    size_t nl = strlen(name);
    if (len <= nl || strncasecmp(line, name, nl) || line[nl] != ':') return;
    const char *v = line + nl + 1;
    size_t vl = len - nl - 1;
    while (vl && (*v == ' ')) v++, vl--;
    while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' ')) vl--;
    if (vl >= cap) vl = cap - 1;
    memcpy(dst, v, vl);
    dst[vl] = '\0';
}

static size_t hu_header_cb(char *p, size_t size, size_t n, void *ud) {
    hu_response *r = ud;
    size_t len = size * n;
    hu_copy_header(p, len, "X-Request-Id", r->request_id, sizeof r->request_id);
    hu_copy_header(p, len, "Retry-After", r->retry_after, sizeof r->retry_after);
    hu_copy_header(p, len, "Content-Type", r->content_type, sizeof r->content_type);
    hu_copy_header(p, len, "Allow", r->allow, sizeof r->allow);
    return len;
}

/* Streams `remaining` bytes of 'x' (a chunked upload of any size without a
 * buffer that large). */
typedef struct hu_stream {
    size_t remaining;
} hu_stream;

static size_t hu_read_cb(char *p, size_t size, size_t n, void *ud) {
    hu_stream *st = ud;
    size_t k = size * n < st->remaining ? size * n : st->remaining;
    memset(p, 'x', k);
    st->remaining -= k;
    return k;
}

/* One request on `curl` (NULL = a fresh handle).  `headers` is a
 * NULL-terminated list of "Name: value" lines.  body == NULL with a POST sends
 * an empty body.  If `stream_bytes` > 0 the body is that many bytes streamed
 * chunked instead.  Times out after `timeout_s`. */
static HU_UNUSED void hu_request_on(CURL *curl, const hu_server *s, const char *method, const char *path,
                                    const char *const *headers, const char *body, size_t body_len,
                                    size_t stream_bytes, long timeout_s, hu_response *out) {
    memset(out, 0, sizeof *out);
    int own = curl == NULL;
    if (own) curl = curl_easy_init();
    assert_non_null(curl);
    char url[512];
    snprintf(url, sizeof url, "%s%s", s->base, path);
    struct curl_slist *hl = NULL;
    for (size_t i = 0; headers && headers[i]; i++) hl = curl_slist_append(hl, headers[i]);
    hu_stream st = {stream_bytes};
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, timeout_s);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, hu_body_cb);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &out->body);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, hu_header_cb);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, out);
    if (!strcmp(method, "POST")) {
        curl_easy_setopt(curl, CURLOPT_POST, 1L);
        if (stream_bytes) {
            hl = curl_slist_append(hl, "Transfer-Encoding: chunked");
            curl_easy_setopt(curl, CURLOPT_READFUNCTION, hu_read_cb);
            curl_easy_setopt(curl, CURLOPT_READDATA, &st);
        } else {
            curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body ? body : "");
            curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? body_len : 0));
        }
    } else if (!strcmp(method, "GET")) {
        curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
    } else {
        curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
    }
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hl);
    out->curl_code = curl_easy_perform(curl);
    if (out->curl_code == CURLE_OK) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &out->status);
    clef_buf_reserve(&out->body, 0);
    out->body.data[out->body.len] = '\0';
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, NULL);
    curl_slist_free_all(hl);
    if (own) curl_easy_cleanup(curl);
}

static HU_UNUSED void hu_get(const hu_server *s, const char *path, const char *const *headers, hu_response *out) {
    hu_request_on(NULL, s, "GET", path, headers, NULL, 0, 0, 30, out);
}

/* POST a JSON body with Content-Type: application/json (plus `headers`). */
static HU_UNUSED void hu_post_json(CURL *curl, const hu_server *s, const char *body, size_t len,
                                   const char *const *headers, hu_response *out) {
    const char *h[16] = {"Content-Type: application/json"};
    size_t n = 1;
    for (size_t i = 0; headers && headers[i] && n < 15; i++) h[n++] = headers[i];
    h[n] = NULL;
    hu_request_on(curl, s, "POST", "/v1/systemone", h, body, len, 0, 60, out);
}

/* Poll /healthz until 200 (≤ 30 s). */
static HU_UNUSED void hu_wait_ready(const hu_server *s) {
    double deadline = hu_now() + 30;
    while (hu_now() < deadline) {
        hu_response r;
        hu_get(s, "/healthz", NULL, &r);
        long st = r.status;
        hu_free(&r);
        if (st == 200) return;
        hu_sleep_ms(20);
    }
    fail_msg("server on port %u never became ready", s->port);
}

static HU_UNUSED void hu_start(hu_server *s, const char *const *args, const char *env_key) {
    hu_start_nowait(s, args, env_key);
    hu_wait_ready(s);
}

/* Wait (≤ 30 s) for the server to exit by itself; returns the exit status
 * (-1 if killed by a signal or not exiting in time, after SIGKILL). */
static HU_UNUSED int hu_wait_exit(hu_server *s) {
    if (s->pid <= 0) return -1;
    double deadline = hu_now() + 30;
    int st = 0;
    pid_t w = 0;
    while (hu_now() < deadline && (w = waitpid(s->pid, &st, WNOHANG)) == 0) hu_sleep_ms(10);
    hu_track(s->pid, NULL, 0);
    if (w != s->pid) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, &st, 0);
        s->pid = 0;
        return -1;
    }
    s->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* SIGTERM, then hu_wait_exit. */
static HU_UNUSED int hu_stop(hu_server *s) {
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    return hu_wait_exit(s);
}

static HU_UNUSED void hu_remove_log(hu_server *s) { unlink(s->log_path); }

/* The number after `field` (e.g. "VmRSS:", "Threads:") in the server
 * process's /proc/PID/status; -1 when the line is absent. */
static HU_UNUSED long hu_proc_status(const hu_server *s, const char *field) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)s->pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    const size_t n = strlen(field);
    long v = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n)) v = strtol(line + n, NULL, 10);
    fclose(f);
    return v;
}

/* Resident set of the server process in KiB (VmRSS). */
static HU_UNUSED long hu_rss_kib(const hu_server *s) { return hu_proc_status(s, "VmRSS:"); }

/* Threads of the server process. */
static HU_UNUSED long hu_threads(const hu_server *s) { return hu_proc_status(s, "Threads:"); }

/* Whether an RSS bound can be asserted: not under AddressSanitizer, whose
 * shadow memory and quarantine of freed blocks (up to 256 MiB) make RSS
 * grow by design and are not the server's working set; there the tests
 * print the bound, and LeakSanitizer checks the server at its exit
 * (hu_stop asserts a clean exit). */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_BOUND_MEANINGFUL 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RSS_BOUND_MEANINGFUL 0
#endif
#endif
#ifndef RSS_BOUND_MEANINGFUL
#define RSS_BOUND_MEANINGFUL 1
#endif

/* Value of a Prometheus sample line "name{labels} value" / "name value"
 * (exact prefix up to the value), or -1. */
static HU_UNUSED double hu_metric(const char *text, const char *series) {
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
    }
    return -1;
}

/* Waits (at most 10 s, else fails the test) until the server has closed every connection from
 * 127.0.0.1: for tests that then open exactly a per-client cap's worth (test_http_concurrency's
 * rounds of 32 clients at the default --max-connections-per-client 32, test_http_wire's 16).
 * libmicrohttpd closes a connection past that cap at accept, unanswered (docs/API.md), and a
 * connection the client has closed (a finished round, hu_start's readiness probes) still counts
 * until the server's polling thread has read its end and closed it too; on a loaded machine that
 * can come after the next connects (seen: curl 56 in test_32_clients, 85 closed instead of 84 in
 * test_per_client_cap).  The poll asks /metrics from 127.0.0.2 (outside 127.0.0.1's cap) on one
 * keep-alive connection, so clef_connections_open == 1 is that connection alone. */
static HU_UNUSED void hu_wait_loopback_closed(const hu_server *s) {
    CURL *curl = curl_easy_init();
    assert_non_null(curl);
    curl_easy_setopt(curl, CURLOPT_INTERFACE, "host!127.0.0.2");
    double deadline = hu_now() + 10, open = -1;
    for (;;) {
        hu_response r;
        hu_request_on(curl, s, "GET", "/metrics", NULL, NULL, 0, 0, 30, &r);
        if (r.curl_code != CURLE_OK || r.status != 200)
            fail_msg("/metrics from 127.0.0.2: curl %d status %ld", r.curl_code, r.status);
        open = hu_metric(r.body.data, "clef_connections_open");
        hu_free(&r);
        if (open == 1 || hu_now() > deadline) break;
        hu_sleep_ms(5);
    }
    curl_easy_cleanup(curl);
    if (open != 1) fail_msg("connections still open 10 s after the clients closed them: %.0f besides /metrics", open - 1);
}

#endif
