/* clef serve — the SystemOne HTTP server (src/server/server.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "engine/scheduler.h"
#include "server/server.h"

static void serve_usage(FILE *f) {
    clef_limits d = clef_limits_default();
    fprintf(f,
            "usage: clef serve --model DIR [options]\n"
            "  Serves SystemOne decisions over HTTP: POST /v1/systemone, GET /v1/models, GET /healthz,\n"
            "  GET /metrics (see docs/API.md).  The model loads in the background; /healthz answers 503\n"
            "  until it is ready.  SIGINT/SIGTERM stop accepting, finish queued work and exit 0.\n"
            "\n"
            "  --model DIR               checkpoint directory (required)\n"
            "  --host ADDR               address to bind (default 127.0.0.1; 0.0.0.0 or :: for all)\n"
            "  --port N                  TCP port (default %d; 0 = any free port, logged on stderr)\n"
            "  --served-model-name NAME  pin the model name: a request whose \"model\" differs gets 404;\n"
            "                            without it any name is accepted and echoed\n"
            "  --api-key KEY             require 'Authorization: Bearer KEY' on every route except\n"
            "                            /healthz (default: env CLEF_API_KEY; unset = no auth)\n"
            "  --max-body-mb N           request body limit in MiB (default %zu); larger bodies get 413\n"
            "  --max-length N            token budget per record (default 64000, at most\n"
            "                            max_position_embeddings)\n"
            "  --truncate-state          cut an over-long state's tail like the reference; by default the\n"
            "                            server refuses it with 422 (a request's \"truncate_state\" wins)\n"
            "  --max-batch-tokens N      tokens packed into one forward pass (default %d); a longer\n"
            "                            record runs alone\n"
            "  --max-queue N             records waiting for the engine before 503 (default %d)\n"
            "  --max-connections N       concurrent HTTP connections (default %d)\n"
            "  --threads N               compute threads of the model (default: all cores)\n"
            "  --max-questions N         questions per request (default %zu)\n"
            "  --max-options N           options per choice question (default %zu)\n"
            "  --min-score-levels N      levels per score question, minimum (default %zu)\n"
            "  --max-score-levels N      levels per score question, maximum (default %zu)\n",
            8000, CLEF_SERVER_DEFAULT_MAX_BODY >> 20, CLEF_SCHED_DEFAULT_MAX_BATCH_TOKENS,
            CLEF_SCHED_DEFAULT_MAX_QUEUE, CLEF_SERVER_DEFAULT_MAX_CONNECTIONS, d.max_questions, d.max_choice_options,
            d.min_score_levels, d.max_score_levels);
}

/* Sizes that must be at least 1 when given. */
static int positive(const char *flag, size_t v) {
    if (v > 0) return 1;
    fprintf(stderr, "clef serve: %s must be at least 1\n", flag);
    return 0;
}

int cli_serve(int argc, char **argv) {
    clef_server_options o = {.port = 8000, .limits = clef_limits_default()};
    size_t port = 8000, body_mb = CLEF_SERVER_DEFAULT_MAX_BODY >> 20, threads = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = arg_str(argc, argv, &i, "--model", &o.model_dir)) || (r = arg_str(argc, argv, &i, "--host", &o.host)) ||
            (r = arg_size(argc, argv, &i, "--port", &port)) ||
            (r = arg_str(argc, argv, &i, "--served-model-name", &o.served_model_name)) ||
            (r = arg_str(argc, argv, &i, "--api-key", &o.api_key)) ||
            (r = arg_size(argc, argv, &i, "--max-body-mb", &body_mb)) ||
            (r = arg_size(argc, argv, &i, "--max-length", &o.max_length)) ||
            (r = arg_size(argc, argv, &i, "--max-batch-tokens", &o.max_batch_tokens)) ||
            (r = arg_size(argc, argv, &i, "--max-queue", &o.max_queue)) ||
            (r = arg_size(argc, argv, &i, "--max-connections", &o.max_connections)) ||
            (r = arg_size(argc, argv, &i, "--threads", &threads)) ||
            (r = arg_size(argc, argv, &i, "--max-questions", &o.limits.max_questions)) ||
            (r = arg_size(argc, argv, &i, "--max-options", &o.limits.max_choice_options)) ||
            (r = arg_size(argc, argv, &i, "--min-score-levels", &o.limits.min_score_levels)) ||
            (r = arg_size(argc, argv, &i, "--max-score-levels", &o.limits.max_score_levels))) {
            if (r < 0) return 2;
        } else if (!strcmp(argv[i], "--truncate-state")) {
            o.truncate_state = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            serve_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "clef serve: unknown argument %s\n\n", argv[i]);
            serve_usage(stderr);
            return 2;
        }
    }
    if (!o.model_dir) {
        serve_usage(stderr);
        return 2;
    }
    if (port > 65535) {
        fprintf(stderr, "clef serve: --port must be 0..65535\n");
        return 2;
    }
    if (!positive("--max-body-mb", body_mb) || !positive("--max-questions", o.limits.max_questions) ||
        !positive("--max-options", o.limits.max_choice_options) ||
        !positive("--max-score-levels", o.limits.max_score_levels))
        return 2;
    if (body_mb > ((size_t)1 << 20)) {
        fprintf(stderr, "clef serve: --max-body-mb is at most %zu\n", (size_t)1 << 20);
        return 2;
    }
    if (o.limits.min_score_levels > o.limits.max_score_levels) {
        fprintf(stderr, "clef serve: --min-score-levels exceeds --max-score-levels\n");
        return 2;
    }
    o.port = (unsigned)port;
    o.max_body_bytes = body_mb << 20;
    o.n_threads = (int)threads;
    if (!o.api_key) o.api_key = getenv("CLEF_API_KEY");
    return clef_server_run(&o);
}
