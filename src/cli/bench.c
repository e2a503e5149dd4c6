/* clef bench — time the forward (thinker + head) of records of a given token
 * count, alone or packed into batches, on a checkpoint or on synthetic
 * weights drawn in memory.  Output: one "key value" line per figure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "backend/cuda/cuda.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "model/model.h"
#include "util/timer.h"

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: clef bench (--model DIR | --synthetic tiny|small|full [--seed N] [--tokenizer PATH])\n"
            "                  [--tokens N] [--batch N] [--runs BxT,...] [--iters N] [--threads N]\n"
            "                  [--device D] [--profile]\n"
            "  Builds --batch triage-style requests whose states are cut so each record is --tokens\n"
            "  tokens (default 300), packs them into one forward (the engine's batch path), runs it\n"
            "  once to warm up and --iters times (default 5), and prints one \"key value\" line per\n"
            "  figure: latency_ms_p50/p95/min/max per forward, tokens_per_s, ..., peak_rss_mib last.\n"
            "  --runs 1x300,8x1000  several measurements on one loaded model (each block starts with\n"
            "                  \"run BxT\"); replaces --batch/--tokens\n"
            "  --device D      cpu, cuda, cuda:N (default: automatic)\n"
            "  --profile       CUDA: after each run's timing, 3 more forwards with per-op GPU timing and\n"
            "                  a table of where the time goes (\"profile BxT\" block)\n"
            "  --synthetic P   random weights of preset P drawn in memory (no files; full needs ~61 GB)\n"
            "  --seed N        seed of the synthetic weights (default 1)\n"
            "  --quant F       with --synthetic: experts quantized in memory to F (int4, fp8-block, nvfp4,\n"
            "                  nvfp4-modelopt), as `clef quantize` would write them (full int4 ~18 GB)\n"
            "  --tokenizer F   tokenizer.json (default %s with --synthetic,\n"
            "                  else the model directory's)\n",
            CLI_DEFAULT_TOKENIZER);
}

/* Word `w` of text variant `variant`: common support-ticket words mixed with
 * pseudo-words of 1-3 syllables, so a record has many distinct tokens (as
 * real text has) and the routers see varied inputs. */
static void bench_word(size_t w, size_t variant, clef_buf *body) {
    static const char *const common[] = {"the", "order", "payment", "server", "error", "customer", "checkout",
                                         "login", "invoice", "refund", "is", "not", "working", "since", "today",
                                         "please", "help", "account", "page", "timeout"};
    static const char cons[] = "bcdfghjklmnprstvwz", vow[] = "aeiou";
    uint64_t x = (uint64_t)(w + 1) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(variant + 1) * 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBULL;
    x ^= x >> 29;
    if (x % 3 == 0) {
        clef_buf_printf(body, " %s", common[(x >> 8) % (sizeof common / sizeof *common)]);
        return;
    }
    clef_buf_putc(body, ' ');
    for (uint64_t s = 0, n = 1 + (x >> 12) % 3; s < n; s++) {
        clef_buf_putc(body, cons[(x >> (16 + 8 * s)) % (sizeof cons - 1)]);
        clef_buf_putc(body, vow[(x >> (20 + 8 * s)) % (sizeof vow - 1)]);
    }
}

void cli_bench_body(size_t tokens, size_t variant, clef_buf *body) {
    /* A state long enough to be cut to `tokens` (every word is >= 1 token). */
    clef_buf_puts(body, "{\"model\":\"bench\",\"state\":\"");
    for (size_t w = 0; w < tokens + 16; w++) bench_word(w, variant, body);
    clef_buf_puts(body,
                  "\",\"questions\":{\"department\":{\"type\":\"choice\",\"instructions\":\"Which team?\","
                  "\"criteria\":{\"billing\":\"Payments\",\"technical\":\"Bugs\"}},"
                  "\"outage\":{\"type\":\"noul\",\"instructions\":\"Is a service down?\"}}}");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted ms[0..n). */
static double percentile(const double *ms, size_t n, double p) {
    size_t r = (size_t)ceil(p / 100.0 * (double)n);
    return ms[r ? r - 1 : 0];
}

#define MAX_RUNS 32

/* One measurement: `batch` records of `tokens` tokens packed per forward. */
typedef struct bench_run {
    size_t batch, tokens;
} bench_run;

typedef struct bench_args {
    const char *model, *synthetic, *tokenizer, *device, *runs_spec, *quant;
    size_t seed, tokens, batch, iters, threads;
    int profile;
    size_t n_runs;
    bench_run runs[MAX_RUNS];
} bench_args;

/* "1x300,8x1000" -> runs.  Returns 0 or -1 (printed). */
static int parse_runs(const char *spec, bench_args *a) {
    const char *p = spec;
    a->n_runs = 0;
    while (*p) {
        char *end;
        unsigned long long b = strtoull(p, &end, 10), t = 0;
        int ok = end != p && *end == 'x' && a->n_runs < MAX_RUNS && b > 0;
        if (ok) {
            p = end + 1;
            t = strtoull(p, &end, 10);
            ok = end != p && t > 0 && (*end == ',' || *end == '\0');
        }
        if (!ok) {
            fprintf(stderr, "clef bench: --runs wants BATCHxTOKENS[,...] (at most %d), got '%s'\n", MAX_RUNS, spec);
            return -1;
        }
        a->runs[a->n_runs++] = (bench_run){.batch = (size_t)b, .tokens = (size_t)t};
        p = *end ? end + 1 : end;
    }
    return a->n_runs ? 0 : -1;
}

/* Parse the flags; returns -1 to exit 0 (--help), 0 ok, 2 bad usage. */
static int parse_args(int argc, char **argv, bench_args *a) {
    *a = (bench_args){.seed = 1, .tokens = 300, .batch = 1, .iters = 5};
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = arg_str(argc, argv, &i, "--model", &a->model)) ||
            (r = arg_str(argc, argv, &i, "--synthetic", &a->synthetic)) ||
            (r = arg_str(argc, argv, &i, "--quant", &a->quant)) ||
            (r = arg_str(argc, argv, &i, "--tokenizer", &a->tokenizer)) ||
            (r = arg_str(argc, argv, &i, "--device", &a->device)) ||
            (r = arg_str(argc, argv, &i, "--runs", &a->runs_spec)) ||
            (r = arg_size(argc, argv, &i, "--seed", &a->seed)) ||
            (r = arg_size(argc, argv, &i, "--tokens", &a->tokens)) ||
            (r = arg_size(argc, argv, &i, "--batch", &a->batch)) ||
            (r = arg_size(argc, argv, &i, "--iters", &a->iters)) ||
            (r = arg_size(argc, argv, &i, "--threads", &a->threads))) {
            if (r < 0) return 2;
        } else if (!strcmp(argv[i], "--profile")) {
            a->profile = 1;
        } else {
            int help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            if (!help) fprintf(stderr, "clef bench: unknown argument %s\n", argv[i]);
            bench_usage(help ? stdout : stderr);
            return help ? -1 : 2;
        }
    }
    if (!a->model == !a->synthetic || (a->quant && !a->synthetic) || a->iters == 0 || a->tokens == 0 || a->batch == 0) {
        bench_usage(stderr);
        return 2;
    }
    if (a->runs_spec) {
        if (parse_runs(a->runs_spec, a) != 0) return 2;
    } else {
        a->n_runs = 1;
        a->runs[0] = (bench_run){.batch = a->batch, .tokens = a->tokens};
    }
    if (a->synthetic && !a->tokenizer) a->tokenizer = CLI_DEFAULT_TOKENIZER;
    return 0;
}

/* Parse and encode the run's request variants into jobs; returns the mean
 * encode time per record in ms, or -1 (printed) on failure. */
static double make_jobs(clef_engine *e, const bench_run *r, clef_job *jobs) {
    double t0 = clef_now();
    clef_decide_params params = {.max_length = r->tokens, .truncate_state = 1};
    for (size_t i = 0; i < r->batch; i++) {
        clef_buf body = {0};
        cli_bench_body(r->tokens, i, &body);
        clef_err err;
        clef_err_clear(&err);
        clef_request req;
        int rc = clef_engine_parse(e, body.data, body.len, &req, &err);
        if (rc == 0) rc = clef_engine_encode(e, &req, &params, &jobs[i], &err);
        clef_buf_free(&body);
        if (rc != 0) {
            fprintf(stderr, "clef bench: %s\n", err.message);
            return -1;
        }
    }
    return (clef_now() - t0) * 1e3 / (double)r->batch;
}

/* Warm-up + timed forwards; fills ms[0..iters).  Returns 0 or 1 (printed). */
static int run_forwards(clef_engine *e, const bench_run *r, size_t iters, clef_job *jobs, double *ms) {
    clef_job **ptrs = calloc(r->batch, sizeof *ptrs);
    clef_err *errs = calloc(r->batch, sizeof *errs);
    int rc = 0;
    for (size_t i = 0; i < r->batch; i++) ptrs[i] = &jobs[i];
    for (size_t it = 0; it <= iters && rc == 0; it++) {
        double t0 = clef_now();
        if (clef_engine_run(e, ptrs, r->batch, errs) != 0) {
            for (size_t i = 0; i < r->batch; i++)
                if (errs[i].status) fprintf(stderr, "clef bench: record %zu: %s\n", i, errs[i].message);
            rc = 1;
        }
        if (it > 0) ms[it - 1] = (clef_now() - t0) * 1e3;
    }
    free(ptrs);
    free(errs);
    return rc;
}

static void print_run(const bench_run *r, size_t iters, const clef_job *jobs, double encode_ms, double *ms) {
    size_t tokens = 0;
    for (size_t i = 0; i < r->batch; i++) tokens += jobs[i].rec.n_ids;
    qsort(ms, iters, sizeof *ms, cmp_double);
    double sum = 0, p50 = percentile(ms, iters, 50);
    for (size_t i = 0; i < iters; i++) sum += ms[i];
    printf("run %zux%zu\n", r->batch, r->tokens);
    printf("batch %zu\n", r->batch);
    printf("tokens_per_record %zu\n", jobs[0].rec.n_ids);
    printf("tokens_per_forward %zu\n", tokens);
    printf("iters %zu\n", iters);
    printf("encode_ms_per_record %.3f\n", encode_ms);
    printf("latency_ms_p50 %.3f\n", p50);
    printf("latency_ms_p95 %.3f\n", percentile(ms, iters, 95));
    printf("latency_ms_min %.3f\n", ms[0]);
    printf("latency_ms_max %.3f\n", ms[iters - 1]);
    printf("latency_ms_mean %.3f\n", sum / (double)iters);
    printf("tokens_per_s %.0f\n", (double)tokens / (p50 / 1e3));
    printf("records_per_s %.2f\n", (double)r->batch / (p50 / 1e3));
    fflush(stdout);
}

/* On CUDA: device memory now and at its peak; with `profile`, three more
 * forwards timed per op (backend/cuda/cuda.h) and their table. */
static int gpu_report(clef_engine *e, const bench_run *r, clef_job *jobs, double *ms, int profile) {
    clef_backend *be = clef_model_backend(clef_engine_model(e));
    if (!clef_backend_is_cuda(be)) return 0;
    printf("gpu_used_mib %.0f\n", (double)clef_cuda_used_bytes(be) / 1048576.0);
    printf("gpu_peak_mib %.0f\n", (double)clef_cuda_peak_bytes(be) / 1048576.0);
    if (!profile) return 0;
    clef_cuda_profile_dump(be, NULL);
    clef_cuda_set_profile(be, 1);
    int rc = run_forwards(e, r, 2, jobs, ms); /* a warm-up and 2 timed: 3 forwards profiled */
    printf("profile %zux%zu (3 forwards, GPU time per op)\n", r->batch, r->tokens);
    clef_cuda_profile_dump(be, stdout);
    clef_cuda_set_profile(be, 0);
    fflush(stdout);
    return rc;
}

/* One run: encode, warm up, time, print.  Returns 0 or 1. */
static int bench_one(clef_engine *e, const bench_run *r, size_t iters, int profile) {
    clef_job *jobs = calloc(r->batch, sizeof *jobs);
    double *ms = calloc(iters < 2 ? 2 : iters, sizeof *ms);
    double encode_ms = make_jobs(e, r, jobs);
    int rc = encode_ms < 0 ? 1 : run_forwards(e, r, iters, jobs, ms);
    if (rc == 0) print_run(r, iters, jobs, encode_ms, ms);
    if (rc == 0) rc = gpu_report(e, r, jobs, ms, profile);
    for (size_t i = 0; i < r->batch; i++) clef_job_free(&jobs[i]);
    free(jobs);
    free(ms);
    return rc;
}

int cli_bench(int argc, char **argv) {
    bench_args a;
    int prc = parse_args(argc, argv, &a);
    if (prc) return prc < 0 ? 0 : prc;
    size_t max_tokens = 0;
    for (size_t i = 0; i < a.n_runs; i++) max_tokens = a.runs[i].tokens > max_tokens ? a.runs[i].tokens : max_tokens;
    clef_engine_options opt = {.model_dir = a.model, .synthetic = a.synthetic, .seed = a.seed,
                               .synthetic_quant = a.quant, .tokenizer = a.tokenizer, .device = a.device, .max_length = max_tokens,
                               .truncate_state = 1, .n_threads = (int)a.threads, .verbose = 1};
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e) {
        fprintf(stderr, "clef bench: %s\n", err.message);
        return 1;
    }
    if (a.synthetic)
        printf("model synthetic:%s%s%s\nseed %zu\n", a.synthetic, a.quant ? ":" : "", a.quant ? a.quant : "", a.seed);
    else
        printf("model %s\n", a.model);
    printf("device %s\n", clef_model_backend(clef_engine_model(e))->ops->name);
    char detail[256];
    clef_cuda_describe(clef_model_backend(clef_engine_model(e)), detail, sizeof detail);
    if (*detail) printf("device_detail %s\n", detail);
    printf("load_s %.3f\n", clef_engine_load_seconds(e));
    int rc = 0;
    for (size_t i = 0; i < a.n_runs && rc == 0; i++) rc = bench_one(e, &a.runs[i], a.iters, a.profile);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("peak_rss_mib %.0f\n", (double)ru.ru_maxrss / 1024.0);
    clef_engine_close(e);
    return rc;
}
