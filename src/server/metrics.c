/* metrics.c — counters and histograms behind GET /metrics. */
#include "server/metrics.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda.h"
#include "clef_version.h"
#include "engine/placement.h"
#include "engine/state_cache.h"
#include "util/buf.h"

#define STATUS_MIN 100
#define STATUS_MAX 599

static const double LATENCY_BOUNDS[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5,   1,      2.5,   5,    10,    30,   60};
static const double RECORD_BOUNDS[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
static const double TOKEN_BOUNDS[] = {256, 1024, 4096, 16384, 65536, 262144};
#define N_LAT (sizeof LATENCY_BOUNDS / sizeof *LATENCY_BOUNDS)
#define N_REC (sizeof RECORD_BOUNDS / sizeof *RECORD_BOUNDS)
#define N_TOK (sizeof TOKEN_BOUNDS / sizeof *TOKEN_BOUNDS)

/* Cumulative-at-render histogram: per-bucket counts (last = +Inf), sum, count. */
typedef struct histogram {
    uint64_t bucket[N_LAT + 1]; /* sized for the largest bound list */
    double sum;
    uint64_t count;
} histogram;

struct clef_metrics {
    pthread_mutex_t lock;
    uint64_t requests[CLEF_ROUTE_COUNT][STATUS_MAX - STATUS_MIN + 1];
    histogram latency[CLEF_ROUTE_COUNT];
    histogram batch_records, batch_tokens, forward_seconds;
    uint64_t tokens, records;
    char device_path[16], device_detail[512]; /* clef_metrics_set_device; path "" until then */
};

static const char *ROUTE_LABELS[CLEF_ROUTE_COUNT] = {"/v1/systemone", "/v1/models", "/healthz", "/metrics", "/",
                                                      "/openapi.json", "other"};

const char *clef_route_label(clef_route r) { return r < CLEF_ROUTE_COUNT ? ROUTE_LABELS[r] : "other"; }

clef_metrics *clef_metrics_new(void) {
    clef_metrics *m = clef_xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->lock, NULL);
    return m;
}

void clef_metrics_free(clef_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static void observe(histogram *h, const double *bounds, size_t n_bounds, double x) {
    size_t i = 0;
    while (i < n_bounds && x > bounds[i]) i++;
    h->bucket[i]++;
    h->sum += x;
    h->count++;
}

void clef_metrics_request(clef_metrics *m, clef_route route, int status, double seconds) {
    if (route >= CLEF_ROUTE_COUNT) route = CLEF_ROUTE_OTHER;
    if (status < STATUS_MIN || status > STATUS_MAX) status = STATUS_MAX;
    pthread_mutex_lock(&m->lock);
    m->requests[route][status - STATUS_MIN]++;
    observe(&m->latency[route], LATENCY_BOUNDS, N_LAT, seconds);
    pthread_mutex_unlock(&m->lock);
}

void clef_metrics_batch(clef_metrics *m, size_t n_records, size_t n_tokens, double seconds) {
    pthread_mutex_lock(&m->lock);
    observe(&m->batch_records, RECORD_BOUNDS, N_REC, (double)n_records);
    observe(&m->batch_tokens, TOKEN_BOUNDS, N_TOK, (double)n_tokens);
    observe(&m->forward_seconds, LATENCY_BOUNDS, N_LAT, seconds);
    m->tokens += n_tokens;
    m->records += n_records;
    pthread_mutex_unlock(&m->lock);
}

void clef_metrics_set_device(clef_metrics *m, const char *path, const char *detail) {
    pthread_mutex_lock(&m->lock);
    snprintf(m->device_path, sizeof m->device_path, "%s", path ? path : "");
    snprintf(m->device_detail, sizeof m->device_detail, "%s", detail ? detail : "");
    pthread_mutex_unlock(&m->lock);
}

/* A label value in the exposition format: backslash, double quote and newline escaped. */
static void label_value(clef_buf *out, const char *v) {
    for (; *v; v++) {
        if (*v == '\\' || *v == '"') clef_buf_printf(out, "\\%c", *v);
        else if (*v == '\n') clef_buf_printf(out, "\\n");
        else clef_buf_printf(out, "%c", *v);
    }
}

static void header(clef_buf *out, const char *name, const char *type, const char *help) {
    clef_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Bucket lines (cumulative), _sum and _count; `labels` is "" or `key="v"`. */
static void render_histogram(clef_buf *out, const char *name, const char *labels, const histogram *h,
                             const double *bounds, size_t n_bounds) {
    const char *sep = labels[0] ? "," : "";
    uint64_t cum = 0;
    for (size_t i = 0; i <= n_bounds; i++) {
        cum += h->bucket[i];
        if (i < n_bounds)
            clef_buf_printf(out, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, bounds[i], (unsigned long long)cum);
        else
            clef_buf_printf(out, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)cum);
    }
    const char *open = labels[0] ? "{" : "", *close = labels[0] ? "}" : "";
    clef_buf_printf(out, "%s_sum%s%s%s %.9g\n%s_count%s%s%s %llu\n", name, open, labels, close, h->sum, name, open,
                    labels, close, (unsigned long long)h->count);
}

void clef_metrics_render(clef_metrics *m, size_t queue_depth, int loaded, double load_seconds, clef_buf *out) {
    pthread_mutex_lock(&m->lock);
    header(out, "clef_requests_total", "counter", "HTTP requests answered, by route and status.");
    for (int r = 0; r < CLEF_ROUTE_COUNT; r++)
        for (int s = 0; s <= STATUS_MAX - STATUS_MIN; s++)
            if (m->requests[r][s])
                clef_buf_printf(out, "clef_requests_total{route=\"%s\",status=\"%d\"} %llu\n", ROUTE_LABELS[r],
                                s + STATUS_MIN, (unsigned long long)m->requests[r][s]);
    header(out, "clef_request_duration_seconds", "histogram",
           "Time from the request's first call to its response being queued, by route.");
    for (int r = 0; r < CLEF_ROUTE_COUNT; r++) {
        if (!m->latency[r].count) continue;
        char labels[64];
        snprintf(labels, sizeof labels, "route=\"%s\"", ROUTE_LABELS[r]);
        render_histogram(out, "clef_request_duration_seconds", labels, &m->latency[r], LATENCY_BOUNDS, N_LAT);
    }
    header(out, "clef_tokens_processed_total", "counter", "Record tokens run through the thinker.");
    clef_buf_printf(out, "clef_tokens_processed_total %llu\n", (unsigned long long)m->tokens);
    header(out, "clef_records_processed_total", "counter", "Records run through the thinker and head.");
    clef_buf_printf(out, "clef_records_processed_total %llu\n", (unsigned long long)m->records);
    header(out, "clef_batch_records", "histogram", "Records packed into one forward pass.");
    render_histogram(out, "clef_batch_records", "", &m->batch_records, RECORD_BOUNDS, N_REC);
    header(out, "clef_batch_tokens", "histogram", "Tokens packed into one forward pass.");
    render_histogram(out, "clef_batch_tokens", "", &m->batch_tokens, TOKEN_BOUNDS, N_TOK);
    header(out, "clef_forward_duration_seconds", "histogram", "Wall time of one packed forward pass and its heads.");
    render_histogram(out, "clef_forward_duration_seconds", "", &m->forward_seconds, LATENCY_BOUNDS, N_LAT);
    pthread_mutex_unlock(&m->lock);
    header(out, "clef_queue_depth", "gauge", "Records waiting for the engine thread.");
    clef_buf_printf(out, "clef_queue_depth %zu\n", queue_depth);
    header(out, "clef_model_loaded", "gauge", "1 once the model is loaded and answering.");
    clef_buf_printf(out, "clef_model_loaded %d\n", loaded ? 1 : 0);
    header(out, "clef_model_load_seconds", "gauge", "Seconds the model took to load (0 while loading).");
    clef_buf_printf(out, "clef_model_load_seconds %.6f\n", load_seconds);
    header(out, "clef_build_info", "gauge", "The binary answering: version, commit, GPU architectures it holds.");
    clef_buf_printf(out, "clef_build_info{version=\"%s\",commit=\"%s\",cuda_archs=\"%s\"} 1\n", CLEF_VERSION,
                    CLEF_COMMIT, clef_cuda_built_archs());
    pthread_mutex_lock(&m->lock);
    if (m->device_path[0]) {
        header(out, "clef_device_info", "gauge", "The device the model runs on: kernel path and description.");
        clef_buf_printf(out, "clef_device_info{path=\"");
        label_value(out, m->device_path);
        clef_buf_printf(out, "\",detail=\"");
        label_value(out, m->device_detail);
        clef_buf_printf(out, "\"} 1\n");
    }
    pthread_mutex_unlock(&m->lock);
}

void clef_metrics_render_budgets(clef_budget *media, clef_budget *body, clef_buf *out) {
    clef_budget_stats st[2];
    clef_budget_stats_get(media, &st[0]);
    clef_budget_stats_get(body, &st[1]);
    static const char *const names[2] = {"media", "body"};
    static const char *const what[2] = {"decoded-media", "request-body"};
    for (int i = 0; i < 2; i++) {
        char name[64], help[160];
        snprintf(name, sizeof name, "clef_%s_budget_bytes", names[i]);
        snprintf(help, sizeof help, "Bytes of the %s budget in use.", what[i]);
        header(out, name, "gauge", help);
        clef_buf_printf(out, "%s %zu\n", name, st[i].used);
        snprintf(name, sizeof name, "clef_%s_budget_capacity_bytes", names[i]);
        snprintf(help, sizeof help, "Size of the %s budget in bytes (0 = unlimited).", what[i]);
        header(out, name, "gauge", help);
        clef_buf_printf(out, "%s %zu\n", name, st[i].capacity);
        snprintf(name, sizeof name, "clef_%s_budget_peak_bytes", names[i]);
        snprintf(help, sizeof help, "Most bytes of the %s budget in use at once so far.", what[i]);
        header(out, name, "gauge", help);
        clef_buf_printf(out, "%s %zu\n", name, st[i].peak);
    }
    header(out, "clef_budget_waits_total", "counter", "Memory-budget charges that had to wait for room, by budget.");
    for (int i = 0; i < 2; i++)
        clef_buf_printf(out, "clef_budget_waits_total{budget=\"%s\"} %llu\n", names[i], (unsigned long long)st[i].waited);
    header(out, "clef_budget_refusals_total", "counter", "Memory-budget charges refused (answered 503), by budget.");
    for (int i = 0; i < 2; i++)
        clef_buf_printf(out, "clef_budget_refusals_total{budget=\"%s\"} %llu\n", names[i],
                        (unsigned long long)st[i].refused);
}

void clef_metrics_render_connections(size_t open, size_t max, uint64_t over_limit, uint64_t timed_out_headers,
                                     uint64_t timed_out_body, size_t worker_queue, clef_buf *out) {
    header(out, "clef_connections_open", "gauge", "TCP connections open now.");
    clef_buf_printf(out, "clef_connections_open %zu\n", open);
    header(out, "clef_connections_max", "gauge",
           "Connections served at once (--max-connections); those past it get 503.");
    clef_buf_printf(out, "clef_connections_max %zu\n", max);
    header(out, "clef_connections_over_limit_total", "counter",
           "Connections accepted past --max-connections (their requests are answered 503).");
    clef_buf_printf(out, "clef_connections_over_limit_total %llu\n", (unsigned long long)over_limit);
    header(out, "clef_connections_timed_out_total", "counter",
           "Connections closed past their deadline, by phase (request head, body).");
    clef_buf_printf(out, "clef_connections_timed_out_total{phase=\"headers\"} %llu\n",
                    (unsigned long long)timed_out_headers);
    clef_buf_printf(out, "clef_connections_timed_out_total{phase=\"body\"} %llu\n", (unsigned long long)timed_out_body);
    header(out, "clef_worker_queue_depth", "gauge",
           "Requests with a complete body waiting for a worker thread (parse, validate, encode).");
    clef_buf_printf(out, "clef_worker_queue_depth %zu\n", worker_queue);
}

void clef_metrics_render_placement(const clef_place_plan *p, clef_buf *out) {
    header(out, "clef_gpu_memory_budget_bytes", "gauge", "The GPU memory budget (--gpu-memory); 0 = none.");
    clef_buf_printf(out, "clef_gpu_memory_budget_bytes %zu\n", p ? p->budget : 0);
    header(out, "clef_placement_resident_layers", "gauge",
           "MoE layers whose experts stay in GPU memory under the budget (0 without one: all resident).");
    clef_buf_printf(out, "clef_placement_resident_layers %lld\n", p ? (long long)p->n_resident : 0LL);
    header(out, "clef_placement_streamed_layers", "gauge",
           "MoE layers whose experts are streamed from pinned host memory every forward.");
    clef_buf_printf(out, "clef_placement_streamed_layers %lld\n", p ? (long long)p->n_streamed : 0LL);
    header(out, "clef_placement_streamed_bytes_per_forward", "gauge",
           "Host to GPU bytes every forward copies (the streamed layers' experts).");
    clef_buf_printf(out, "clef_placement_streamed_bytes_per_forward %zu\n", p ? p->streamed_bytes : 0);
}

void clef_metrics_render_state_cache(const clef_state_cache_stats *st, int enabled, clef_buf *out) {
    header(out, "clef_state_cache_enabled", "gauge", "1 when the state cache (--state-cache) is on.");
    clef_buf_printf(out, "clef_state_cache_enabled %d\n", enabled);
    header(out, "clef_state_cache_lookups_total", "counter", "Records looked up in the state cache.");
    clef_buf_printf(out, "clef_state_cache_lookups_total %llu\n", (unsigned long long)st->lookups);
    header(out, "clef_state_cache_hits_total", "counter", "Records that reused cached prefix blocks.");
    clef_buf_printf(out, "clef_state_cache_hits_total %llu\n", (unsigned long long)st->hits);
    header(out, "clef_state_cache_tokens_reused_total", "counter",
           "Tokens whose K/V and hidden rows came from the state cache instead of the thinker.");
    clef_buf_printf(out, "clef_state_cache_tokens_reused_total %llu\n", (unsigned long long)st->tokens_reused);
    header(out, "clef_state_cache_evictions_total", "counter", "State cache blocks evicted to make room.");
    clef_buf_printf(out, "clef_state_cache_evictions_total %llu\n", (unsigned long long)st->evictions);
    header(out, "clef_state_cache_bytes", "gauge", "Bytes the state cache holds now.");
    clef_buf_printf(out, "clef_state_cache_bytes %zu\n", st->bytes);
    header(out, "clef_state_cache_capacity_bytes", "gauge", "The state cache's bound in bytes (--state-cache).");
    clef_buf_printf(out, "clef_state_cache_capacity_bytes %zu\n", st->capacity);
    header(out, "clef_state_cache_blocks", "gauge", "64-token blocks the state cache holds now.");
    clef_buf_printf(out, "clef_state_cache_blocks %zu\n", st->blocks);
}
