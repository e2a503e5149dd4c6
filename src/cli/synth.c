/* clef synth — write a random-weight checkpoint in the release layout, or
 * (--check) draw one in memory and report how activations and routing behave
 * on it: the residual stream's magnitude per layer, the expert load per MoE
 * layer, the head's probabilities and the time per decision. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "io/synth.h"
#include "model/model.h"
#include "util/timer.h"

static void synth_usage(FILE *f) {
    fprintf(f,
            "usage: clef synth --preset tiny|small|full --out DIR [--seed N] [--tokenizer PATH] [--force]\n"
            "       clef synth --preset tiny|small|full --check [--seed N] [--tokens N] [--threads N]\n"
            "  Writes a checkpoint of random bf16 weights in the release layout: sharded safetensors\n"
            "  (<= 4 GiB each, per-expert tensor names) + model.safetensors.index.json, config.json,\n"
            "  joint_head.safetensors + joint_head_config.json and a copy of the tokenizer.  The same\n"
            "  preset and seed always give the same bytes (also as `clef bench --synthetic`).\n"
            "  tiny = the test fixture's sizes (~20 MB), small = real widths with 4 layers (~6.2 GB),\n"
            "  full = the real shapes (~61 GB; text decoder + lm_head + head, no vision/audio towers).\n"
            "  --out DIR       created if missing; a DIR that is not empty is refused (exit 2)\n"
            "  --force         write into a DIR that is not empty: files of the same names are replaced,\n"
            "                  nothing else is touched\n"
            "  --seed N        default 1\n"
            "  --tokenizer F   default %s\n"
            "  --check         draw the weights in memory (no files), run one --tokens record (default\n"
            "                  300) on the CPU and print the hidden-state RMS per layer, the expert\n"
            "                  load per layer (histogram of --layer, default 0), the probabilities and\n"
            "                  the time per decision\n",
            CLI_DEFAULT_TOKENIZER);
}

/* ---- --check: routing statistics through a wrapped router op ------------- */

static int (*g_router_topk)(clef_backend *, const float *, int64_t, int64_t, int64_t, int, int32_t *, float *,
                            clef_err *);
static int64_t *g_load;  /* [layers][E] tokens routed to each expert */
static int64_t g_layer, g_layers;

/* The backend's router, then count the chosen experts of each token. */
static int counting_router_topk(clef_backend *be, const float *logits, int64_t T, int64_t E, int64_t k, int norm,
                                int32_t *idx, float *w, clef_err *err) {
    if (g_router_topk(be, logits, T, E, k, norm, idx, w, err) != 0) return -1;
    int32_t *host = malloc((size_t)(T * k) * sizeof *host);
    int rc = be->ops->download(be, host, idx, (size_t)(T * k) * sizeof *host, err);
    for (int64_t i = 0; rc == 0 && g_layer < g_layers && i < T * k; i++)
        if (host[i] >= 0 && host[i] < E) g_load[g_layer * E + host[i]]++;
    g_layer++;
    free(host);
    return rc;
}

/* RMS and max |x| over rows x[n, H], and the share of the mean square that
 * is common to all rows: |mean_t x_t|^2 / mean_t |x_t|^2 (1/n for unrelated
 * rows, 1 when every row is the same; a large share makes every token pick
 * the same experts). */
static void row_stats(const float *x, size_t n, size_t H, double *rms, double *maxabs, double *common) {
    double s = 0, m = 0, c = 0;
    for (size_t i = 0; i < n * H; i++) {
        s += (double)x[i] * x[i];
        if (fabs(x[i]) > m) m = fabs(x[i]);
    }
    for (size_t j = 0; j < H; j++) {
        double mean = 0;
        for (size_t t = 0; t < n; t++) mean += x[t * H + j];
        mean /= (double)n;
        c += mean * mean;
    }
    *rms = sqrt(s / (double)(n * H));
    *maxabs = m;
    *common = s > 0 ? c / (s / (double)n) : 0;
}

/* layer_hidden[0] = embeddings, [l] = after layer l-1, [L] = final norm. */
static void print_hidden(const clef_config *c, const float *layer_hidden, size_t n) {
    const size_t H = (size_t)c->text.hidden_size;
    const int64_t L = c->text.num_hidden_layers;
    for (int64_t l = 0; l <= L; l++) {
        double rms, mx, common;
        row_stats(layer_hidden + (size_t)l * n * H, n, H, &rms, &mx, &common);
        char what[32];
        if (l == 0)
            snprintf(what, sizeof what, "embeddings");
        else if (l < L)
            snprintf(what, sizeof what, "after_layer_%lld", (long long)(l - 1));
        else
            snprintf(what, sizeof what, "final_norm");
        printf("hidden_rms %s %.4f max_abs %.3f common %.3f\n", what, rms, mx, common);
    }
}

static void print_load(const clef_config *c, size_t n, int64_t show_layer) {
    const int64_t E = c->text.num_experts, k = c->text.num_experts_per_tok;
    for (int64_t l = 0; l < g_layers; l++) {
        const int64_t *ld = g_load + l * E;
        int64_t mn = ld[0], mx = ld[0], used = 0;
        double mean = (double)n * (double)k / (double)E, var = 0;
        for (int64_t e = 0; e < E; e++) {
            mn = ld[e] < mn ? ld[e] : mn;
            mx = ld[e] > mx ? ld[e] : mx;
            used += ld[e] > 0;
            var += (ld[e] - mean) * (ld[e] - mean);
        }
        printf("expert_load layer %lld: min %lld max %lld mean %.1f cv %.3f experts_used %lld/%lld\n", (long long)l,
               (long long)mn, (long long)mx, mean, sqrt(var / (double)E) / mean, (long long)used, (long long)E);
    }
    if (show_layer >= 0 && show_layer < g_layers) {
        printf("expert_histogram layer %lld:", (long long)show_layer);
        for (int64_t e = 0; e < E; e++) printf(" %lld", (long long)g_load[show_layer * E + e]);
        printf("\n");
    }
}

/* Head logits → per-question softmax, printed with the logit spread. */
static void print_answers(const clef_record *rec, const float *logits) {
    size_t off = 0;
    for (size_t q = 0; q < rec->n_questions; q++) {
        size_t no = rec->questions[q].n_options;
        double mx = -INFINITY, sum = 0, lo = INFINITY;
        for (size_t j = 0; j < no; j++) {
            mx = logits[off + j] > mx ? logits[off + j] : mx;
            lo = logits[off + j] < lo ? logits[off + j] : lo;
        }
        for (size_t j = 0; j < no; j++) sum += exp(logits[off + j] - mx);
        printf("question %zu: logit_range %.4f probs", q, mx - lo);
        for (size_t j = 0; j < no; j++) printf(" %.4f", exp(logits[off + j] - mx) / sum);
        printf("\n");
        off += no;
    }
}

/* Forward of the job's record on a model bound over a counting backend. */
static int probe(clef_engine *e, const clef_job *job, int threads, int64_t show_layer) {
    const clef_checkpoint *ck = clef_engine_checkpoint(e);
    const clef_config *c = &ck->config;
    clef_err err;
    clef_err_clear(&err);
    clef_backend *be = clef_backend_cpu_create(threads, &err);
    if (!be) {
        fprintf(stderr, "clef synth: %s\n", err.message);
        return 1;
    }
    static clef_backend_ops ops;
    ops = *be->ops;
    g_router_topk = ops.router_topk;
    ops.router_topk = counting_router_topk;
    be->ops = &ops;
    clef_model *m = clef_model_create_on(ck, be, 1, &err);
    if (!m) {
        fprintf(stderr, "clef synth: %s\n", err.message);
        return 1;
    }
    const size_t n = job->rec.n_ids, H = (size_t)c->text.hidden_size;
    g_layers = c->text.num_hidden_layers;
    g_layer = 0;
    g_load = calloc((size_t)(g_layers * c->text.num_experts), sizeof *g_load);
    float *layer_hidden = malloc((size_t)(g_layers + 1) * n * H * sizeof *layer_hidden);
    float *hidden = malloc(n * H * sizeof *hidden);
    float *logits = malloc((clef_record_total_options(&job->rec) + 1) * sizeof *logits);
    int rc = clef_thinker_forward(m, job->rec.input_ids, n, hidden, layer_hidden, &err);
    if (rc == 0) rc = clef_head_forward(m, hidden, &job->rec, logits, &err);
    if (rc == 0) {
        print_hidden(c, layer_hidden, n);
        print_load(c, n, show_layer);
        print_answers(&job->rec, logits);
    } else {
        fprintf(stderr, "clef synth: %s\n", err.message);
    }
    free(layer_hidden);
    free(hidden);
    free(logits);
    free(g_load);
    clef_model_free(m);
    return rc ? 1 : 0;
}

/* Median ms of `iters` decisions (after one warm-up) on the engine's model. */
static int time_decisions(clef_engine *e, clef_job *job, size_t iters, double *median) {
    double *ms = calloc(iters, sizeof *ms);
    clef_err err;
    clef_err_clear(&err);
    for (size_t it = 0; it <= iters; it++) {
        double t0 = clef_now();
        if (clef_engine_run(e, &job, 1, &err) != 0) {
            fprintf(stderr, "clef synth: %s\n", err.message);
            free(ms);
            return 1;
        }
        if (it > 0) ms[it - 1] = (clef_now() - t0) * 1e3;
    }
    for (size_t i = 1; i < iters; i++) /* tiny n: insertion sort */
        for (size_t j = i; j > 0 && ms[j - 1] > ms[j]; j--) {
            double t = ms[j];
            ms[j] = ms[j - 1];
            ms[j - 1] = t;
        }
    *median = ms[iters / 2];
    free(ms);
    return 0;
}

static int check(const char *preset, size_t seed, const char *tokenizer, size_t tokens, size_t threads,
                 size_t layer) {
    clef_engine_options opt = {.synthetic = preset, .seed = seed, .tokenizer = tokenizer, .max_length = tokens,
                               .truncate_state = 1, .n_threads = (int)threads, .verbose = 1};
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e) {
        fprintf(stderr, "clef synth: %s\n", err.message);
        return 1;
    }
    clef_buf body = {0};
    cli_bench_body(tokens, 0, &body);
    clef_request req;
    clef_job job;
    memset(&job, 0, sizeof job);
    int rc = clef_engine_parse(e, body.data, body.len, &req, &err) || clef_engine_encode(e, &req, NULL, &job, &err);
    clef_buf_free(&body);
    if (rc) fprintf(stderr, "clef synth: %s\n", err.message);
    double ms = 0;
    if (!rc) rc = time_decisions(e, &job, 3, &ms);
    if (!rc) {
        printf("preset %s seed %zu tokens %zu\n", preset, seed, job.rec.n_ids);
        printf("load_s %.3f\n", clef_engine_load_seconds(e));
        printf("ms_per_decision %.1f (median of 3, cpu)\n", ms);
        rc = probe(e, &job, (int)threads, (int64_t)layer);
    }
    clef_job_free(&job);
    clef_engine_close(e);
    return rc;
}

int cli_synth(int argc, char **argv) {
    const char *preset = NULL, *out = NULL, *tokenizer = NULL;
    size_t seed = 1, tokens = 300, threads = 0, layer = 0, shard_mib = 0;
    int do_check = 0, force = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = arg_str(argc, argv, &i, "--preset", &preset)) || (r = arg_str(argc, argv, &i, "--out", &out)) ||
            (r = arg_str(argc, argv, &i, "--tokenizer", &tokenizer)) ||
            (r = arg_size(argc, argv, &i, "--seed", &seed)) || (r = arg_size(argc, argv, &i, "--tokens", &tokens)) ||
            (r = arg_size(argc, argv, &i, "--threads", &threads)) ||
            (r = arg_size(argc, argv, &i, "--layer", &layer)) ||
            (r = arg_size(argc, argv, &i, "--shard-mib", &shard_mib))) {
            if (r < 0) return 2;
        } else if (!strcmp(argv[i], "--check")) {
            do_check = 1;
        } else if (!strcmp(argv[i], "--force")) {
            force = 1;
        } else {
            int help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            if (!help) fprintf(stderr, "clef synth: unknown argument %s\n", argv[i]);
            synth_usage(help ? stdout : stderr);
            return help ? 0 : 2;
        }
    }
    if (!preset || (!out && !do_check) || tokens == 0) {
        synth_usage(stderr);
        return 2;
    }
    if (!tokenizer && !(tokenizer = cli_default_tokenizer("clef synth"))) return 2;
    if (do_check) return check(preset, seed, tokenizer, tokens, threads, layer);
    if (cli_check_out_dir("clef synth", out, force)) return 2; /* before anything is drawn or written */
    clef_synth_options opt = {.preset = preset, .seed = seed, .out_dir = out, .tokenizer = tokenizer,
                              .max_shard_bytes = shard_mib << 20, .progress = stderr};
    clef_err err;
    clef_err_clear(&err);
    if (clef_synth_write(&opt, &err) != 0) {
        fprintf(stderr, "clef synth: %s\n", err.message);
        return 1;
    }
    return 0;
}
