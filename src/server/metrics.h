/* metrics.h — the server's counters, rendered in the Prometheus text
 * exposition format (version 0.0.4) for GET /metrics.
 *
 * Exposed series:
 *   clef_requests_total{route,status}        counter: answered HTTP requests
 *   clef_request_duration_seconds{route}     histogram: first byte in → response queued
 *   clef_tokens_processed_total              counter: record tokens through the thinker
 *   clef_records_processed_total             counter: records through the thinker
 *   clef_batch_records                       histogram: records per packed forward
 *   clef_batch_tokens                        histogram: tokens per packed forward
 *   clef_forward_duration_seconds            histogram: wall time of one packed forward + heads
 *   clef_queue_depth                         gauge: records waiting for the engine thread
 *   clef_model_loaded                        gauge: 1 once the model answers
 *   clef_model_load_seconds                  gauge: time clef_engine_open took
 *   clef_media_budget_bytes / _capacity_bytes / _peak_bytes
 *                                            gauges: decoded-media budget in use, its size (0 =
 *                                            unlimited), the most in use so far
 *   clef_body_budget_bytes / _capacity_bytes / _peak_bytes
 *                                            gauges: the same for request bodies held in memory
 *   clef_budget_waits_total{budget}          counter: charges that waited for room ("media", "body")
 *   clef_budget_refusals_total{budget}       counter: charges refused (answered 503)
 *   clef_build_info{version,commit,cuda_archs}
 *                                            gauge 1: what binary answers (`clef --version`)
 *   clef_device_info{path,detail}            gauge 1 once loaded: the kernel path the device takes
 *                                            ("cpu", "portable", "hopper") and the device's
 *                                            description (clef_cuda_describe; "" on the CPU)
 *   clef_connections_open                    gauge: TCP connections open now
 *   clef_connections_max                     gauge: --max-connections (those past it get 503)
 *   clef_connections_over_limit_total        counter: connections accepted past --max-connections
 *   clef_connections_timed_out_total{phase}  counter: connections closed past their deadline,
 *                                            phase="headers" (request head) or "body"
 *   clef_worker_queue_depth                  gauge: complete requests waiting for a worker thread
 *                                            (to be parsed, validated and encoded)
 *   clef_state_cache_enabled                 gauge: 1 when the state cache is on (0: off, or
 *                                            --state-cache given on a backend without it)
 *   clef_state_cache_lookups_total           counter: records looked up in the state cache
 *   clef_state_cache_hits_total              counter: records that reused cached blocks
 *   clef_state_cache_tokens_reused_total     counter: tokens taken from the cache instead of computed
 *   clef_state_cache_evictions_total         counter: blocks evicted to make room
 *   clef_state_cache_bytes / _capacity_bytes gauges: bytes held now, the bound (--state-cache)
 *   clef_state_cache_blocks                  gauge: 64-token blocks held now
 * All functions are thread-safe.
 */
#ifndef CLEF_SERVER_METRICS_H
#define CLEF_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "util/budget.h"
#include "util/buf.h"

/* Route labels; CLEF_ROUTE_OTHER covers every unknown path. */
typedef enum clef_route {
    CLEF_ROUTE_SYSTEMONE,
    CLEF_ROUTE_MODELS,
    CLEF_ROUTE_HEALTHZ,
    CLEF_ROUTE_METRICS,
    CLEF_ROUTE_UI,      /* GET /: the playground page (unless --no-ui) */
    CLEF_ROUTE_OPENAPI, /* GET /openapi.json */
    CLEF_ROUTE_OTHER,
    CLEF_ROUTE_COUNT
} clef_route;

/* The label text of a route ("/v1/systemone", ..., "other"). */
const char *clef_route_label(clef_route r);

typedef struct clef_metrics clef_metrics;

clef_metrics *clef_metrics_new(void);
void clef_metrics_free(clef_metrics *m);

/* One answered request: its route, HTTP status (100..599; others count as
 * 599) and latency in seconds. */
void clef_metrics_request(clef_metrics *m, clef_route route, int status, double seconds);

/* One packed forward: records, their total tokens, wall seconds. */
void clef_metrics_batch(clef_metrics *m, size_t n_records, size_t n_tokens, double seconds);

/* Append the exposition text.  queue_depth, loaded (0/1) and load_seconds
 * are gauges sampled by the caller. */
void clef_metrics_render(clef_metrics *m, size_t queue_depth, int loaded, double load_seconds, clef_buf *out);

/* The loaded model's device: its kernel path ("cpu", "portable", "hopper";
 * clef_cuda_kernel_path) and description (copied; NULL = ""), rendered as
 * clef_device_info.  Called once the engine is open. */
void clef_metrics_set_device(clef_metrics *m, const char *path, const char *detail);

/* Append the two memory budgets' series (read from the budgets themselves). */
void clef_metrics_render_budgets(clef_budget *media, clef_budget *body, clef_buf *out);

/* Append the connection series and the worker queue (values sampled by the
 * caller). */
/* The state cache's series (engine/state_cache.h stats; enabled 0/1). */
struct clef_state_cache_stats;
void clef_metrics_render_state_cache(const struct clef_state_cache_stats *st, int enabled, clef_buf *out);

/* The weight placement's series (engine/placement.h; plan NULL = no GPU
 * memory budget: every gauge 0). */
struct clef_place_plan;
void clef_metrics_render_placement(const struct clef_place_plan *plan, clef_buf *out);

void clef_metrics_render_connections(size_t open, size_t max, uint64_t over_limit, uint64_t timed_out_headers,
                                     uint64_t timed_out_body, size_t worker_queue, clef_buf *out);

#endif
