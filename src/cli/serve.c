/* clef serve — the SystemOne HTTP server (src/server/server.h). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "engine/placement.h"
#include "engine/state_cache.h"
#include "cli/cli.h"
#include "engine/scheduler.h"
#include "io/synth.h"
#include "quant/convert.h"
#include "server/server.h"

static void serve_usage(FILE *f) {
    clef_limits d = clef_limits_default();
    fprintf(f,
            "usage: clef serve (--model DIR | --synthetic tiny|small|full [--seed N] [--quant F]\n"
            "                   [--tokenizer F]) [options]\n"
            "  Serves SystemOne decisions over HTTP: POST /v1/systemone, GET /v1/models, GET /healthz,\n"
            "  GET /metrics, GET /openapi.json (the OpenAPI 3.1 description) and GET / (the playground:\n"
            "  a page to write a request and see every option's probability; see docs/API.md).  The model\n"
            "  loads in the background; /healthz answers 503 until it is ready.  SIGINT/SIGTERM stop\n"
            "  accepting (new connections are refused; requests on open ones get 503 \"stopping\"),\n"
            "  answer the requests already received and exit 0, within --drain-timeout-s.\n"
            "\n"
            "  --model DIR               checkpoint directory\n"
            "  --synthetic P             instead of --model: random weights of preset P drawn into memory\n"
            "                            (no files; full needs ~61 GB), for --seed N (default 1); --quant F\n"
            "                            quantizes its experts in memory (int4, fp8-block, nvfp4,\n"
            "                            nvfp4-modelopt); --tokenizer F (default " CLI_DEFAULT_TOKENIZER ")\n"
            "  --host ADDR               address to bind (default 127.0.0.1; 0.0.0.0 or :: for all)\n"
            "  --port N                  TCP port (default %d; 0 = any free port, logged on stderr)\n"
            "  --served-model-name NAME  pin the model name: a request whose \"model\" differs gets 404;\n"
            "                            without it any name is accepted and echoed\n"
            "  --api-key KEY             require 'Authorization: Bearer KEY' on every route except\n"
            "                            /healthz (default: env CLEF_API_KEY; unset = no auth)\n"
            "  --max-body-mb N           request body limit in MiB (default %zu); larger bodies get 413\n"
            "  --body-budget-mb N        request bodies held in memory across all connections, MiB\n"
            "                            (default %d x --max-body-mb; 0 = unlimited; at least\n"
            "                            --max-body-mb); a body that does not fit gets 503\n"
            "  --media-budget-mb N       decoded media across all requests, MiB, charged from each\n"
            "                            item's header before decoding (default %zu; 0 = unlimited); a\n"
            "                            request that does not fit gets 503; one larger than the budget\n"
            "                            runs when nothing else holds it\n"
            "  --budget-wait-ms N        how long a request waits for room in either budget before its\n"
            "                            503 (default %d; 0 = no wait; at most 60000)\n"
            "  --max-length N            token budget per record (default 64000, at most\n"
            "                            max_position_embeddings)\n"
            "  --truncate-state          cut an over-long state's tail like the reference; by default the\n"
            "                            server refuses it with 422 (a request's \"truncate_state\" wins)\n"
            "  --max-batch-tokens N      tokens packed into one forward pass (default %d); a longer\n"
            "                            record runs alone\n"
            "  --max-queue N             records waiting for the engine before 503 (default %d)\n"
            "  --state-cache SIZE        memory for cached state prefixes (per-layer K/V and final hidden\n"
            "                            rows of 64-token blocks, reused by requests that share a state or\n"
            "                            its start; least recently used blocks go first): e.g. 512M, 4G;\n"
            "                            0 or off = none (default 2G; on a GPU within --gpu-memory)\n"
            "  --max-connections N       concurrent HTTP connections served (default: as many as the\n"
            "                            open-file limit allows, at most %d; the soft limit is raised to the\n"
            "                            hard one); past it, while descriptors last, each request gets 503\n"
            "                            JSON + Retry-After and its connection is closed\n"
            "  --max-connections-per-client N\n"
            "                            concurrent connections from one client IP address (default %d;\n"
            "                            0 = no cap); one past it is closed at once, unanswered\n"
            "  --header-timeout-s N      seconds a connection has to send a complete request head, from\n"
            "                            its accept or its previous answer; bytes trickled in do not\n"
            "                            extend it; then it is closed (default %d; 0 = none; at most 3600)\n"
            "  --body-timeout-s N        seconds a request has for its body after its head, plus 1 s per\n"
            "                            --min-body-rate-kb KiB received; then it is closed (default %d;\n"
            "                            0 = none; at most 86400)\n"
            "  --min-body-rate-kb N      each N KiB of body received extends --body-timeout-s by 1 s, i.e.\n"
            "                            the slowest average rate past it, KiB/s (default %zu; 0 = none:\n"
            "                            the whole body within --body-timeout-s)\n"
            "  --drain-timeout-s N       on SIGINT/SIGTERM, seconds the requests already received have to\n"
            "                            be answered; then the process exits anyway, status 1 if one is\n"
            "                            unanswered (default %d; 1..%d; Kubernetes:\n"
            "                            terminationGracePeriodSeconds above it)\n"
            "  --threads N               compute threads of the model (default: all cores); idle ones\n"
            "                            sleep rather than spin (OMP_WAIT_POLICY=passive is set unless\n"
            "                            OMP_WAIT_POLICY or GOMP_SPINCOUNT is already in the environment)\n"
            "  --no-ui                   no playground page: GET / is 404 like any unknown path\n"
            "  --text-only               do not load the media towers (their memory, ~2.4 GB on the full\n"
            "                            model, stays free); requests with media get 422\n"
            "  --device D                cpu, cuda, cuda:N (default: CUDA when a GPU is present, else cpu)\n"
            "  --numerics M              GPU numerics: fast (default; bf16 activations, closer to f32 than\n"
            "                            the reference's own bf16), balanced, or precise (f32-level\n"
            "                            agreement, slower); the CPU is always f32\n"
            "  --gpu-memory SIZE         GPU memory budget, e.g. 16GiB (a CUDA device only; default: none,\n"
            "                            every weight resident): the experts of the layers that do not fit\n"
            "                            are streamed from pinned host memory each forward; workspace is\n"
            "                            planned for --max-batch-tokens (at most %zu), which is then also\n"
            "                            the longest record accepted (a longer one gets 422, or its state\n"
            "                            cut with truncation); `clef inspect --plan` shows the plan\n"
            "  --towers cpu|gpu          where the vision and audio towers run (default: gpu on a CUDA\n"
            "                            device, else cpu); cpu keeps their weights off the GPU and out of\n"
            "                            --gpu-memory\n"
            "  --max-questions N         questions per request (default %zu)\n"
            "  --max-options N           options per choice question (default %zu)\n"
            "  --min-score-levels N      levels per score question, minimum (default %zu)\n"
            "  --max-score-levels N      levels per score question, maximum (default %zu)\n",
            8000, CLEF_SERVER_DEFAULT_MAX_BODY >> 20, CLEF_SERVER_DEFAULT_BODY_BUDGET_BODIES,
            CLEF_SERVER_DEFAULT_MEDIA_BUDGET >> 20, CLEF_SERVER_DEFAULT_BUDGET_WAIT_MS, CLEF_SCHED_DEFAULT_MAX_BATCH_TOKENS,
            CLEF_SCHED_DEFAULT_MAX_QUEUE, CLEF_SERVER_AUTO_MAX_CONNECTIONS,
            CLEF_SERVER_DEFAULT_MAX_CONNECTIONS_PER_CLIENT, CLEF_SERVER_DEFAULT_HEADER_TIMEOUT_S,
            CLEF_SERVER_DEFAULT_BODY_TIMEOUT_S, CLEF_SERVER_DEFAULT_MIN_BODY_RATE >> 10,
            CLEF_SERVER_DEFAULT_DRAIN_TIMEOUT_S, CLEF_SERVER_MAX_DRAIN_TIMEOUT_S, (size_t)CLEF_PLACE_MAX_TOKENS,
            d.max_questions, d.max_choice_options,
            d.min_score_levels, d.max_score_levels);
    const clef_media_limits *m = &d.media;
    fprintf(f,
            "\n"
            "  Media (\"images\", \"audio\", \"videos\": base64 data URLs; over a limit = 422 naming the item):\n"
            "  --max-images N            images per request (default %zu; 0 refuses images)\n"
            "  --max-audio N             audio clips per request (default %zu; 0 refuses audio)\n"
            "  --max-videos N            videos per request (default %zu; 0 refuses videos)\n"
            "  --max-image-mb N          decoded bytes per image, MiB (default %zu)\n"
            "  --max-audio-mb N          decoded bytes per audio clip, MiB (default %zu)\n"
            "  --max-video-mb N          decoded bytes per video, MiB (default %zu)\n"
            "  --max-image-megapixels N  width x height per image and per video frame, millions\n"
            "                            (default %zu)\n"
            "  --max-audio-seconds N     duration per audio clip (default %.0f)\n"
            "  --max-video-seconds N     duration per video, frames and soundtrack (default %.0f)\n"
            "  The request body must hold them too: raise --max-body-mb with the byte limits (base64\n"
            "  adds a third).\n",
            m->max_images, m->max_audio, m->max_videos, m->max_image_bytes >> 20, m->max_audio_bytes >> 20,
            m->max_video_bytes >> 20, m->max_image_pixels / 1000000, m->max_audio_seconds, m->max_video_seconds);
}

void cli_serve_wait_policy(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return; /* the operator's choice */
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    execv("/proc/self/exe", argv);
    fprintf(stderr, "clef %s: cannot re-execute with OMP_WAIT_POLICY=passive (%s); compute threads will spin\n",
            argv[1], strerror(errno));
    unsetenv("OMP_WAIT_POLICY");
}

/* Upper bounds of the media flags: far above any real need, low enough that
 * the byte and pixel products cannot overflow. */
#define MEDIA_MAX_MB ((size_t)1 << 20)
#define MEDIA_MAX_MEGAPIXELS ((size_t)1000000)
#define MEDIA_MAX_SECONDS ((size_t)86400)
#define BUDGET_MAX_MB ((size_t)1 << 20) /* 1 TiB */

/* Media flags as given (MiB, megapixels, seconds) before they become limits. */
typedef struct media_flags {
    size_t image_mb, audio_mb, video_mb, megapixels, audio_s, video_s;
} media_flags;

static media_flags media_flags_default(const clef_media_limits *m) {
    return (media_flags){m->max_image_bytes >> 20, m->max_audio_bytes >> 20, m->max_video_bytes >> 20,
                         m->max_image_pixels / 1000000, (size_t)m->max_audio_seconds, (size_t)m->max_video_seconds};
}

/* Check `v` of `flag` is 1..max; prints the error otherwise. */
static int in_range(const char *flag, size_t v, size_t max) {
    if (v >= 1 && v <= max) return 1;
    fprintf(stderr, "clef serve: %s wants 1..%zu\n", flag, max);
    return 0;
}

/* Check the media flags and store them in `m` (counts are stored as parsed). */
static int apply_media_flags(const media_flags *g, clef_media_limits *m) {
    if (!in_range("--max-image-mb", g->image_mb, MEDIA_MAX_MB) || !in_range("--max-audio-mb", g->audio_mb, MEDIA_MAX_MB) ||
        !in_range("--max-video-mb", g->video_mb, MEDIA_MAX_MB) ||
        !in_range("--max-image-megapixels", g->megapixels, MEDIA_MAX_MEGAPIXELS) ||
        !in_range("--max-audio-seconds", g->audio_s, MEDIA_MAX_SECONDS) ||
        !in_range("--max-video-seconds", g->video_s, MEDIA_MAX_SECONDS))
        return -1;
    m->max_image_bytes = g->image_mb << 20;
    m->max_audio_bytes = g->audio_mb << 20;
    m->max_video_bytes = g->video_mb << 20;
    m->max_image_pixels = g->megapixels * 1000000;
    m->max_audio_seconds = (double)g->audio_s;
    m->max_video_seconds = (double)g->video_s;
    return 0;
}

/* Parse one media flag at argv[*i]; same contract as arg_size. */
static int media_arg(int argc, char **argv, int *i, clef_media_limits *m, media_flags *g) {
    int r;
    if ((r = arg_size(argc, argv, i, "--max-images", &m->max_images)) ||
        (r = arg_size(argc, argv, i, "--max-audio", &m->max_audio)) ||
        (r = arg_size(argc, argv, i, "--max-videos", &m->max_videos)) ||
        (r = arg_size(argc, argv, i, "--max-image-mb", &g->image_mb)) ||
        (r = arg_size(argc, argv, i, "--max-audio-mb", &g->audio_mb)) ||
        (r = arg_size(argc, argv, i, "--max-video-mb", &g->video_mb)) ||
        (r = arg_size(argc, argv, i, "--max-image-megapixels", &g->megapixels)) ||
        (r = arg_size(argc, argv, i, "--max-audio-seconds", &g->audio_s)) ||
        (r = arg_size(argc, argv, i, "--max-video-seconds", &g->video_s)))
        return r;
    return 0;
}

/* Sizes that must be at least 1 when given. */
static int positive(const char *flag, size_t v) {
    if (v > 0) return 1;
    fprintf(stderr, "clef serve: %s must be at least 1\n", flag);
    return 0;
}

int cli_serve(int argc, char **argv) {
    clef_server_options o = {.port = 8000, .limits = clef_limits_default(), .state_cache = CLEF_STATE_CACHE_DEFAULT_BYTES};
    size_t port = 8000, body_mb = CLEF_SERVER_DEFAULT_MAX_BODY >> 20, threads = 0, seed = 1,
           per_client = CLEF_SERVER_DEFAULT_MAX_CONNECTIONS_PER_CLIENT;
    size_t media_budget_mb = CLEF_SERVER_DEFAULT_MEDIA_BUDGET >> 20, wait_ms = CLEF_SERVER_DEFAULT_BUDGET_WAIT_MS;
    size_t body_budget_mb = SIZE_MAX; /* SIZE_MAX = not given: the default multiple of --max-body-mb */
    size_t header_s = CLEF_SERVER_DEFAULT_HEADER_TIMEOUT_S, body_s = CLEF_SERVER_DEFAULT_BODY_TIMEOUT_S,
           rate_kb = CLEF_SERVER_DEFAULT_MIN_BODY_RATE >> 10, drain_s = CLEF_SERVER_DEFAULT_DRAIN_TIMEOUT_S;
    media_flags mf = media_flags_default(&o.limits.media);
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = arg_str(argc, argv, &i, "--model", &o.model_dir)) || (r = arg_str(argc, argv, &i, "--host", &o.host)) ||
            (r = arg_str(argc, argv, &i, "--synthetic", &o.synthetic)) ||
            (r = arg_str(argc, argv, &i, "--quant", &o.synthetic_quant)) ||
            (r = arg_str(argc, argv, &i, "--tokenizer", &o.tokenizer)) ||
            (r = arg_size(argc, argv, &i, "--seed", &seed)) ||
            (r = arg_size(argc, argv, &i, "--port", &port)) ||
            (r = arg_str(argc, argv, &i, "--served-model-name", &o.served_model_name)) ||
            (r = arg_str(argc, argv, &i, "--api-key", &o.api_key)) ||
            (r = arg_size(argc, argv, &i, "--max-body-mb", &body_mb)) ||
            (r = arg_size(argc, argv, &i, "--body-budget-mb", &body_budget_mb)) ||
            (r = arg_size(argc, argv, &i, "--media-budget-mb", &media_budget_mb)) ||
            (r = arg_size(argc, argv, &i, "--budget-wait-ms", &wait_ms)) ||
            (r = arg_size(argc, argv, &i, "--max-length", &o.max_length)) ||
            (r = arg_size(argc, argv, &i, "--max-batch-tokens", &o.max_batch_tokens)) ||
            (r = arg_size(argc, argv, &i, "--max-queue", &o.max_queue)) ||
            (r = arg_bytes(argc, argv, &i, "--state-cache", &o.state_cache)) ||
            (r = arg_bytes(argc, argv, &i, "--gpu-memory", &o.gpu_memory)) ||
            (r = arg_towers(argc, argv, &i, &o.towers)) ||
            (r = arg_size(argc, argv, &i, "--max-connections", &o.max_connections)) ||
            (r = arg_size(argc, argv, &i, "--max-connections-per-client", &per_client)) ||
            (r = arg_size(argc, argv, &i, "--header-timeout-s", &header_s)) ||
            (r = arg_size(argc, argv, &i, "--body-timeout-s", &body_s)) ||
            (r = arg_size(argc, argv, &i, "--min-body-rate-kb", &rate_kb)) ||
            (r = arg_size(argc, argv, &i, "--drain-timeout-s", &drain_s)) ||
            (r = arg_size(argc, argv, &i, "--threads", &threads)) ||
            (r = arg_str(argc, argv, &i, "--device", &o.device)) ||
            (r = arg_numerics(argc, argv, &i, "--numerics", &o.numerics)) ||
            (r = arg_size(argc, argv, &i, "--max-questions", &o.limits.max_questions)) ||
            (r = arg_size(argc, argv, &i, "--max-options", &o.limits.max_choice_options)) ||
            (r = arg_size(argc, argv, &i, "--min-score-levels", &o.limits.min_score_levels)) ||
            (r = arg_size(argc, argv, &i, "--max-score-levels", &o.limits.max_score_levels)) ||
            (r = media_arg(argc, argv, &i, &o.limits.media, &mf))) {
            if (r < 0) return 2;
        } else if (!strcmp(argv[i], "--truncate-state")) {
            o.truncate_state = 1;
        } else if (!strcmp(argv[i], "--text-only")) {
            o.text_only = 1;
        } else if (!strcmp(argv[i], "--no-ui")) {
            o.no_ui = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            serve_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "clef serve: unknown argument %s\n\n", argv[i]);
            serve_usage(stderr);
            return 2;
        }
    }
    if (!o.model_dir == !o.synthetic || (o.synthetic_quant && !o.synthetic)) {
        fprintf(stderr, "clef serve: give --model DIR or --synthetic P (--quant needs --synthetic)\n\n");
        serve_usage(stderr);
        return 2;
    }
    o.seed = seed;
    o.max_connections_per_client = per_client ? per_client : CLEF_SERVER_NO_CAP;
    if (o.synthetic && !o.tokenizer && !(o.tokenizer = cli_default_tokenizer("clef serve"))) return 2;
    /* Refuse what the loader thread would refuse, before the port is bound:
     * a bad preset, format or tokenizer is a usage error (exit 2), not a
     * server that listens and then exits 1. */
    clef_err err;
    clef_err_clear(&err);
    clef_quant_format qf;
    if (o.synthetic && !clef_synth_preset_find(o.synthetic, &err)) {
        fprintf(stderr, "clef serve: --synthetic: %s\n", err.message);
        return 2;
    }
    if (o.synthetic_quant && clef_quant_format_parse(o.synthetic_quant, &qf) != 0) {
        fprintf(stderr, "clef serve: --quant: unknown quantized format '%s' (int4, fp8-block, nvfp4 or nvfp4-modelopt)\n",
                o.synthetic_quant);
        return 2;
    }
    if (o.tokenizer && access(o.tokenizer, R_OK) != 0) {
        fprintf(stderr, "clef serve: --tokenizer %s: %s\n", o.tokenizer, strerror(errno));
        return 2;
    }
    if (cli_check_placement("clef serve", o.device, o.gpu_memory, o.towers,
                            o.max_batch_tokens ? o.max_batch_tokens : CLEF_SCHED_DEFAULT_MAX_BATCH_TOKENS,
                            "--max-batch-tokens"))
        return 2;
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
    if (apply_media_flags(&mf, &o.limits.media)) return 2;
    if (media_budget_mb > BUDGET_MAX_MB || (body_budget_mb != SIZE_MAX && body_budget_mb > BUDGET_MAX_MB)) {
        fprintf(stderr, "clef serve: --media-budget-mb and --body-budget-mb are at most %zu\n", BUDGET_MAX_MB);
        return 2;
    }
    if (body_budget_mb != SIZE_MAX && body_budget_mb != 0 && body_budget_mb < body_mb) {
        fprintf(stderr, "clef serve: --body-budget-mb %zu is below --max-body-mb %zu: a body under the limit could never be held\n",
                body_budget_mb, body_mb);
        return 2;
    }
    if (header_s > 3600 || body_s > 86400 || rate_kb > ((size_t)1 << 20)) {
        fprintf(stderr, "clef serve: %s\n",
                header_s > 3600 ? "--header-timeout-s is at most 3600"
                : body_s > 86400 ? "--body-timeout-s is at most 86400"
                                 : "--min-body-rate-kb is at most 1048576");
        return 2;
    }
    if (drain_s < 1 || drain_s > CLEF_SERVER_MAX_DRAIN_TIMEOUT_S) {
        fprintf(stderr, "clef serve: --drain-timeout-s wants 1..%d (seconds a stop may take)\n",
                CLEF_SERVER_MAX_DRAIN_TIMEOUT_S);
        return 2;
    }
    o.drain_timeout_s = (double)drain_s;
    o.header_timeout_s = header_s ? (double)header_s : -1;
    o.body_timeout_s = body_s ? (double)body_s : -1;
    o.min_body_rate = rate_kb ? rate_kb << 10 : CLEF_SERVER_NO_CAP;
    if (wait_ms > 60000) {
        fprintf(stderr, "clef serve: --budget-wait-ms is at most 60000\n");
        return 2;
    }
    o.media_budget_bytes = media_budget_mb ? media_budget_mb << 20 : CLEF_SERVER_BUDGET_UNLIMITED;
    o.body_budget_bytes = body_budget_mb == SIZE_MAX ? 0 /* the default */
                          : body_budget_mb ? body_budget_mb << 20
                                           : CLEF_SERVER_BUDGET_UNLIMITED;
    o.budget_wait_ms = wait_ms ? (long)wait_ms : -1;
    o.port = (unsigned)port;
    o.max_body_bytes = body_mb << 20;
    o.n_threads = (int)threads;
    if (!o.api_key) o.api_key = getenv("CLEF_API_KEY");
    return clef_server_run(&o);
}
