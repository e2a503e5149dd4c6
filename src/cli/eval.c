/* clef eval — answer the Decision Index kit's rows (ROWS.jsonl[.gz]) through
 * the engine in packed batches and write the kit's results (src/eval/eval.h):
 * DIR/results.jsonl, DIR/environment.json, DIR/status.json.  A progress bar
 * (a tty) or plain progress lines on stderr. */
#include <errno.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "backend/cuda/cuda.h"
#include "cli/args.h"
#include "engine/state_cache.h"
#include "cli/cli.h"
#include "clef_version.h"
#include "engine/placement.h"
#include "engine/scheduler.h"
#include "eval/eval.h"
#include "json/json.h"
#include "model/model.h"
#include "quant/format.h"
#include "util/timer.h"

#define EVAL_DEFAULT_PROGRESS_S 10

static void eval_usage(FILE *f) {
    fprintf(f,
            "usage: clef eval (--model DIR | --synthetic tiny|small|full [--seed N] [--quant F]) --rows ROWS.jsonl[.gz]\n"
            "                 --out DIR [options]\n"
            "  Answers the Decision Index kit's rows (one JSON object a line with \"state\", \"questions\" and\n"
            "  \"_evaluation\" with a \"run_id\"; gzip-compressed or plain, the bytes decide) through the engine\n"
            "  in packed batches, as the server does, and writes the kit's results:\n"
            "    DIR/results.jsonl     one line per row: the _evaluation fields, line, engine, started_utc,\n"
            "                          completed_utc, total_wall_ms, model_request_wall_ms, status (ok,\n"
            "                          unsupported = a capacity refusal, error = anything else) and response\n"
            "                          (the SystemOne response) or error ({message, type, param})\n"
            "    DIR/environment.json  engine, model, format, device, numerics, build, loaded_seconds\n"
            "    DIR/status.json       the last progress event (loading, ready, progress, complete, failed)\n"
            "  Resumable: rerun the same command and rows whose run_id already has an ok or unsupported\n"
            "  result are skipped (error rows are answered again); a truncated last line is cut off.\n"
            "  Every ok answer is checked as the kit checks it (every question and option answered,\n"
            "  probabilities summing to 1 within 0.01); a failing answer is an error row and counted.\n"
            "  Exit status: 0 every row has a result and every answer passed the checks; 1 the run could\n"
            "  not finish (unreadable or truncated ROWS, DIR not writable, model not loaded) or an answer\n"
            "  failed the checks; 2 bad usage.\n"
            "\n"
            "  --rows F              the rows (JSON lines, plain or gzipped)\n"
            "  --out DIR             where the results go (created when missing; an existing one resumes)\n"
            "  --model DIR           checkpoint directory\n"
            "  --synthetic P         instead of --model: random weights of preset P drawn into memory, for\n"
            "                        --seed N (default 1); --quant F quantizes its experts in memory (int4,\n"
            "                        fp8-block, nvfp4, nvfp4-modelopt)\n"
            "  --tokenizer F         tokenizer.json (default: the model directory's; with --synthetic\n"
            "                        " CLI_DEFAULT_TOKENIZER ")\n"
            "  --device D            cpu, cuda, cuda:N (default: CUDA when a GPU is present, else cpu)\n"
            "  --numerics M          GPU numerics: fast (default), balanced or precise (see `clef decide\n"
            "                        --help`); the CPU is always f32\n"
            "  --gpu-memory SIZE     GPU memory budget (e.g. 16GiB; a CUDA device only): experts that do not\n"
            "                        fit are streamed from pinned host memory (`clef inspect --plan`); the\n"
            "                        workspace is for --max-batch-tokens, also the longest record then\n"
            "  --towers cpu|gpu      where the media towers run (default: gpu on a CUDA device, else cpu);\n"
            "                        cpu keeps their weights off the GPU and out of --gpu-memory\n"
            "  --threads N           compute threads, 1..%d (default: all cores, or OMP_NUM_THREADS)\n"
            "  --max-batch-tokens N  tokens packed into one forward pass (default %d); a longer record\n"
            "                        runs alone\n"
            "  --in-flight N         rows in the engine at once, so batches pack (default %d, 1..4096)\n"
            "  --max-length N        token budget per record (default 64000)\n"
            "  --state-cache SIZE    memory for cached state prefixes, reused by rows that share a state or\n"
            "                        its start (e.g. 512M, 4G; 0 or off = none; default 2G); answers are\n"
            "                        bitwise the same either way\n"
            "  --truncate-state      cut an over-long state like the reference; by default it is refused\n"
            "                        (unsupported, \"maximum context length\"), as the Decision Index requires\n"
            "  --text-only           do not load the media towers\n"
            "  --model-name NAME     the \"model\" sent with each row and echoed in responses (default %s)\n"
            "  --max-row-mb N        a longer row is an error row (default %zu)\n"
            "  --progress-every S    seconds between progress lines when stderr is not a terminal\n"
            "                        (default %d; 0 = only the summary); a terminal gets a bar\n"
            "  --quiet               no progress, only the summary and errors\n"
            "  --force               resume into DIR even if its environment.json names another model\n",
            CLEF_CPU_MAX_THREADS, CLEF_SCHED_DEFAULT_MAX_BATCH_TOKENS, CLEF_EVAL_DEFAULT_IN_FLIGHT,
            CLEF_EVAL_DEFAULT_MODEL_NAME, CLEF_EVAL_DEFAULT_MAX_ROW_BYTES >> 20, EVAL_DEFAULT_PROGRESS_S);
}

typedef struct eval_args {
    const char *model, *synthetic, *quant, *tokenizer, *device, *rows, *out, *model_name;
    size_t seed, threads, max_batch_tokens, in_flight, max_length, max_row_mb, progress_every, state_cache,
        gpu_memory;
    clef_numerics numerics;
    int truncate_state, text_only, quiet, force, towers;
} eval_args;

/* Parse the flags; -1 = --help (exit 0), 0 ok, 2 bad usage (printed). */
static int parse_args(int argc, char **argv, eval_args *a) {
    *a = (eval_args){.seed = 1, .in_flight = CLEF_EVAL_DEFAULT_IN_FLIGHT,
                     .max_row_mb = CLEF_EVAL_DEFAULT_MAX_ROW_BYTES >> 20, .progress_every = EVAL_DEFAULT_PROGRESS_S,
                     .state_cache = CLEF_STATE_CACHE_DEFAULT_BYTES};
    int max_length_given = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = arg_str(argc, argv, &i, "--model", &a->model)) ||
            (r = arg_str(argc, argv, &i, "--synthetic", &a->synthetic)) ||
            (r = arg_str(argc, argv, &i, "--quant", &a->quant)) ||
            (r = arg_str(argc, argv, &i, "--tokenizer", &a->tokenizer)) ||
            (r = arg_str(argc, argv, &i, "--device", &a->device)) ||
            (r = arg_str(argc, argv, &i, "--rows", &a->rows)) || (r = arg_str(argc, argv, &i, "--out", &a->out)) ||
            (r = arg_str(argc, argv, &i, "--model-name", &a->model_name)) ||
            (r = arg_numerics(argc, argv, &i, "--numerics", &a->numerics)) ||
            (r = arg_size(argc, argv, &i, "--seed", &a->seed)) ||
            (r = arg_size(argc, argv, &i, "--threads", &a->threads)) ||
            (r = arg_size(argc, argv, &i, "--max-batch-tokens", &a->max_batch_tokens)) ||
            (r = arg_size(argc, argv, &i, "--in-flight", &a->in_flight)) ||
            (r = arg_bytes(argc, argv, &i, "--state-cache", &a->state_cache)) ||
            (r = arg_bytes(argc, argv, &i, "--gpu-memory", &a->gpu_memory)) ||
            (r = arg_towers(argc, argv, &i, &a->towers)) ||
            (r = arg_size(argc, argv, &i, "--max-row-mb", &a->max_row_mb)) ||
            (r = arg_size(argc, argv, &i, "--progress-every", &a->progress_every))) {
            if (r < 0) return 2;
        } else if ((r = arg_size(argc, argv, &i, "--max-length", &a->max_length))) {
            if (r < 0) return 2;
            max_length_given = 1;
        } else if (!strcmp(argv[i], "--truncate-state")) {
            a->truncate_state = 1;
        } else if (!strcmp(argv[i], "--text-only")) {
            a->text_only = 1;
        } else if (!strcmp(argv[i], "--quiet")) {
            a->quiet = 1;
        } else if (!strcmp(argv[i], "--force")) {
            a->force = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            eval_usage(stdout);
            return -1;
        } else {
            fprintf(stderr, "clef eval: unknown argument %s\n\n", argv[i]);
            eval_usage(stderr);
            return 2;
        }
    }
    const char *why = !a->model == !a->synthetic ? (a->model ? "give --model DIR or --synthetic P, not both"
                                                             : "--model DIR or --synthetic P is required")
                      : a->quant && !a->synthetic ? "--quant needs --synthetic P"
                      : !a->rows                  ? "--rows ROWS.jsonl[.gz] is required"
                      : !a->out                   ? "--out DIR is required"
                                                  : NULL;
    if (why) {
        fprintf(stderr, "clef eval: %s\n\n", why);
        eval_usage(stderr);
        return 2;
    }
    /* placement flags before any file is looked at */
    if (cli_check_placement("clef eval", a->device, a->gpu_memory, a->towers,
                            a->max_batch_tokens ? a->max_batch_tokens : CLEF_SCHED_DEFAULT_MAX_BATCH_TOKENS,
                            "--max-batch-tokens"))
        return 2;
    if (max_length_given && a->max_length == 0) return fprintf(stderr, "clef eval: --max-length must be at least 1\n"), 2;
    if (a->threads > CLEF_CPU_MAX_THREADS)
        return fprintf(stderr, "clef eval: --threads %zu is more than the limit of %d\n", a->threads,
                       CLEF_CPU_MAX_THREADS), 2;
    if (a->in_flight < 1 || a->in_flight > 4096) return fprintf(stderr, "clef eval: --in-flight wants 1..4096\n"), 2;
    if (a->max_row_mb < 1 || a->max_row_mb > ((size_t)1 << 20))
        return fprintf(stderr, "clef eval: --max-row-mb wants 1..%zu\n", (size_t)1 << 20), 2;
    if (a->model_name && !*a->model_name) return fprintf(stderr, "clef eval: --model-name must not be empty\n"), 2;
    struct stat st;
    if (stat(a->rows, &st) != 0)
        return fprintf(stderr, "clef eval: --rows %s: %s\n", a->rows, strerror(errno)), 2;
    if (S_ISDIR(st.st_mode)) return fprintf(stderr, "clef eval: --rows %s is a directory\n", a->rows), 2;
    if (stat(a->out, &st) == 0 && !S_ISDIR(st.st_mode))
        return fprintf(stderr, "clef eval: --out %s exists and is not a directory\n", a->out), 2;
    if (a->synthetic && !a->tokenizer && !(a->tokenizer = cli_default_tokenizer("clef eval"))) return 2;
    return 0;
}

/* What the results were made with, as environment.json names it: the
 * absolute checkpoint directory, or "synthetic:P[:F] seed N". */
static void model_label(const eval_args *a, char *out, size_t cap) {
    if (a->synthetic) {
        snprintf(out, cap, "synthetic:%s%s%s seed %zu", a->synthetic, a->quant ? ":" : "", a->quant ? a->quant : "",
                 a->seed);
        return;
    }
    char *abs = realpath(a->model, NULL);
    snprintf(out, cap, "%s", abs ? abs : a->model);
    free(abs);
}

/* Refuse to resume into a DIR whose environment.json names another model
 * (its results would be mixed with this model's), unless --force.
 * 0 ok, 2 refused (printed). */
static int check_previous_model(const eval_args *a, const char *label) {
    char path[4200];
    snprintf(path, sizeof path, "%s/environment.json", a->out);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    clef_buf b = {0};
    char chunk[8192];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0 && b.len < (1u << 20)) clef_buf_append(&b, chunk, n);
    fclose(f);
    clef_err err;
    json_value *env = b.len ? json_parse(b.data, b.len, &err) : NULL;
    const json_value *m = env ? json_get(env, "model") : NULL;
    int differs = m && m->type == JSON_STRING && strcmp(m->str, label);
    if (differs && !a->force)
        fprintf(stderr,
                "clef eval: %s holds results of model '%s', not '%s'; use another --out, or add --force to "
                "add this model's results to them\n",
                a->out, m->str, label);
    json_free(env);
    clef_buf_free(&b);
    return differs && !a->force ? 2 : 0;
}

static void put_key_str(clef_buf *b, const char *key, const char *v) {
    clef_buf_printf(b, ",\"%s\":", key);
    if (v)
        json_render_string(v, strlen(v), b);
    else
        clef_buf_puts(b, "null");
}

/* The "model name" of /proc/cpuinfo into out ("" when unknown). */
static void cpu_model(char *out, size_t cap) {
    out[0] = '\0';
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            const char *v = strchr(line, ':');
            if (v) {
                v++;
                while (*v == ' ') v++;
                snprintf(out, cap, "%s", v);
                out[strcspn(out, "\n")] = '\0';
            }
            break;
        }
    fclose(f);
}

#ifndef CLEF_BUILD_TYPE
#define CLEF_BUILD_TYPE "unknown"
#endif

/* environment.json: the engine, its options, the model and its format, the
 * device and numerics, the build, the host and the load time. */
static int write_environment(const eval_args *a, clef_engine *e, const char *label, clef_err *err) {
    clef_backend *be = clef_model_backend(clef_engine_model(e));
    clef_quant_config qc;
    clef_err qerr;
    const char *format = clef_quant_detect(clef_engine_checkpoint(e), &qc, &qerr) == 0 ? clef_quant_format_name(qc.format)
                                                                                       : "unknown";
    char detail[512], cpu[256];
    clef_cuda_describe(be, detail, sizeof detail);
    cpu_model(cpu, sizeof cpu);
    clef_buf b = {0};
    clef_buf_printf(&b, "{\"engine\":\"%s\"", CLEF_EVAL_ENGINE_NAME);
    put_key_str(&b, "model", label);
    put_key_str(&b, "format", format);
    put_key_str(&b, "device", be->ops->name);
    put_key_str(&b, "device_detail", *detail ? detail : NULL);
    put_key_str(&b, "kernel_path", clef_cuda_kernel_path(be)); /* "cpu", "portable", "hopper" */
    put_key_str(&b, "numerics", clef_numerics_of(be));
    clef_buf_printf(&b, ",\"loaded_seconds\":%.3f", clef_engine_load_seconds(e));
    clef_buf_puts(&b, ",\"engine_options\":{");
    /* the CPU backend's threads: --threads, else OMP_NUM_THREADS, else every core (backend/cpu/cpu.h) */
    clef_buf_printf(&b, "\"threads\":%zu,\"max_batch_tokens\":%zu,\"in_flight\":%zu,\"max_length\":%zu,"
                        "\"truncate_state\":%s,\"text_only\":%s",
                    a->threads ? a->threads : (size_t)omp_get_max_threads(), a->max_batch_tokens ? a->max_batch_tokens : (size_t)CLEF_SCHED_DEFAULT_MAX_BATCH_TOKENS,
                    a->in_flight, clef_engine_max_length(e), a->truncate_state ? "true" : "false",
                    a->text_only ? "true" : "false");
    put_key_str(&b, "model_name", a->model_name ? a->model_name : CLEF_EVAL_DEFAULT_MODEL_NAME);
    put_key_str(&b, "device_requested", a->device);
    /* where the media towers ran: --towers as given (null: the thinker's device) */
    put_key_str(&b, "towers", a->towers == CLEF_TOWERS_CPU ? "cpu" : a->towers == CLEF_TOWERS_GPU ? "gpu" : NULL);
    /* the state cache's bound (0: off, or off on this backend: state_cache_off says why) and the GPU
     * memory budget with the placement it gave (null: none, every weight resident) */
    clef_buf_printf(&b, ",\"state_cache_bytes\":%zu", a->state_cache);
    put_key_str(&b, "state_cache_off", clef_engine_state_cache_off_reason(e));
    const clef_place_plan *pl = clef_engine_plan(e);
    if (pl)
        clef_buf_printf(&b, ",\"gpu_memory_bytes\":%zu,\"placement\":{\"resident_layers\":%lld,"
                            "\"streamed_layers\":%lld,\"streamed_bytes_per_forward\":%zu,\"device_bytes_planned\":%zu}",
                        pl->budget, (long long)pl->n_resident, (long long)pl->n_streamed, pl->streamed_bytes,
                        pl->device_bytes);
    else
        clef_buf_puts(&b, ",\"gpu_memory_bytes\":null,\"placement\":null");
    clef_buf_puts(&b, "}");
#ifdef __clang__
    static const char COMPILER[] = "clang " __clang_version__;
#else
    static const char COMPILER[] = "gcc " __VERSION__;
#endif
    clef_buf_puts(&b, ",\"build\":{\"compiler\":");
    json_render_string(COMPILER, sizeof COMPILER - 1, &b);
    put_key_str(&b, "build_type", CLEF_BUILD_TYPE);
    put_key_str(&b, "version", CLEF_VERSION);
    put_key_str(&b, "commit", CLEF_COMMIT);
    put_key_str(&b, "cuda_archs", CLEF_CUDA_ARCH_LIST); /* "" without CUDA, as `clef --version` */
#ifdef CLEF_HAVE_CUDA
    clef_buf_puts(&b, ",\"cuda\":true}");
#else
    clef_buf_puts(&b, ",\"cuda\":false}");
#endif
    clef_buf_puts(&b, ",\"host\":{\"cpu\":");
    json_render_string(cpu, strlen(cpu), &b);
    clef_buf_printf(&b, ",\"cpus_online\":%ld", sysconf(_SC_NPROCESSORS_ONLN));
    put_key_str(&b, "OMP_NUM_THREADS", getenv("OMP_NUM_THREADS"));
    put_key_str(&b, "OMP_WAIT_POLICY", getenv("OMP_WAIT_POLICY")); /* passive unless set (cli.h) */
    clef_buf_puts(&b, "}");
    char *rows = realpath(a->rows, NULL);
    put_key_str(&b, "rows_path", rows ? rows : a->rows);
    free(rows);
    clef_buf_puts(&b, ",\"latency\":");
    static const char LATENCY[] = "total_wall_ms: the row's parse, encode, packed forward (queue wait included), "
                                  "render and check on the engine's host; model_request_wall_ms: the time in the "
                                  "scheduler (queue wait + packed forward); excludes model loading";
    json_render_string(LATENCY, sizeof LATENCY - 1, &b);
    clef_buf_puts(&b, "}\n");
    int rc = clef_eval_write_file(a->out, "environment.json", b.data, b.len, err);
    clef_buf_free(&b);
    clef_quant_config_free(&qc); /* format.h: freed after a failed detect too */
    return rc;
}

/* ---- progress on stderr -------------------------------------------------- */

typedef struct progress_ctx {
    int tty, quiet;
    double every_s, last;
    int drawn; /* a bar is on the terminal's last line */
} progress_ctx;

static void eta_text(double s, char *out, size_t cap) {
    if (s < 0) {
        snprintf(out, cap, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(out, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(out, cap, "%ld:%02ld", t / 60, t % 60);
}

static void on_progress(void *ctx, const clef_eval_progress *p) {
    progress_ctx *pc = ctx;
    int end = strcmp(p->event, "progress") != 0;
    if (pc->quiet || end) return; /* the summary is printed by cli_eval */
    double now = clef_now();
    size_t done = p->skipped + p->answered;
    char eta[32];
    eta_text(p->eta_s, eta, sizeof eta);
    if (pc->tty) {
        if (now - pc->last < 0.2) return;
        pc->last = now;
        char bar[31];
        size_t fill = p->total ? done * 30 / p->total : 0;
        for (size_t i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = '\0';
        fprintf(stderr, "\r\033[K[%s] %zu/%zu rows  %.1f rows/s  ETA %s  ok %zu  unsupported %zu  error %zu", bar, done,
                p->total, p->rows_per_s, eta, p->ok, p->unsupported, p->error);
        pc->drawn = 1;
    } else {
        if (pc->every_s <= 0 || now - pc->last < pc->every_s) return;
        pc->last = now;
        fprintf(stderr, "clef eval: %zu/%zu rows (%.1f%%), %.1f rows/s, ETA %s; ok %zu, unsupported %zu, error %zu\n",
                done, p->total, p->total ? 100.0 * (double)done / (double)p->total : 100.0, p->rows_per_s, eta, p->ok,
                p->unsupported, p->error);
    }
}

int cli_eval(int argc, char **argv) {
    eval_args a;
    int prc = parse_args(argc, argv, &a);
    if (prc) return prc < 0 ? 0 : prc;
    char label[4200];
    model_label(&a, label, sizeof label);
    if (check_previous_model(&a, label)) return 2;

    clef_err err;
    clef_err_clear(&err);
    clef_eval_progress st = {.event = "loading", .eta_s = -1};
    /* DIR (and its missing parents) now, for the "loading" status */
    if (clef_eval_make_dir(a.out, &err) != 0 || clef_eval_write_status(a.out, &st, &err) != 0) {
        fprintf(stderr, "clef eval: %s\n", err.message);
        return 1;
    }
    clef_engine_options opt = {.model_dir = a.model, .synthetic = a.synthetic, .seed = a.seed,
                               .synthetic_quant = a.quant, .tokenizer = a.tokenizer, .device = a.device,
                               .numerics = a.numerics, .max_length = a.max_length, .truncate_state = a.truncate_state,
                               .n_threads = (int)a.threads, .text_only = a.text_only, .verbose = !a.quiet,
                               .state_cache = a.state_cache, .gpu_memory = a.gpu_memory,
                               .batch_tokens = a.max_batch_tokens, .towers = a.towers,
                               .plan_advice = CLEF_PLACE_ADVICE_EVAL};
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e) {
        fprintf(stderr, "clef eval: cannot load model from %s: %s\n", label, err.message);
        st.event = "failed";
        st.failure = err.message;
        clef_err serr;
        clef_eval_write_status(a.out, &st, &serr);
        return 1;
    }
    if (write_environment(&a, e, label, &err) != 0) {
        fprintf(stderr, "clef eval: %s\n", err.message);
        clef_engine_close(e);
        return 1;
    }
    st.event = "ready";
    clef_eval_write_status(a.out, &st, &err);

    progress_ctx pc = {.tty = isatty(STDERR_FILENO), .quiet = a.quiet, .every_s = (double)a.progress_every,
                       .last = clef_now()};
    clef_eval_options eo = {.rows_path = a.rows, .out_dir = a.out, .model_name = a.model_name,
                            .in_flight = a.in_flight, .max_batch_tokens = a.max_batch_tokens,
                            .max_row_bytes = a.max_row_mb << 20, .truncate_state = a.truncate_state,
                            .on_progress = on_progress, .ctx = &pc};
    clef_eval_progress fin;
    int rc = clef_eval_run(e, &eo, &fin, &err);
    clef_engine_close(e);
    if (pc.drawn) fputc('\n', stderr);
    fprintf(stderr,
            "clef eval: %s: %zu of %zu rows have a result (%zu answered now, %zu kept from an earlier run) in %.1f s, "
            "%.1f rows/s; ok %zu, unsupported %zu, error %zu; %zu answers failed the kit's checks; %zu forwards of "
            "%.1f records / %.0f tokens on average; %s/results.jsonl\n",
            rc == 0 ? "complete" : "failed", fin.skipped + fin.answered, fin.total, fin.answered, fin.skipped,
            fin.elapsed_s, fin.rows_per_s, fin.ok, fin.unsupported, fin.error, fin.violations, fin.batches,
            fin.batches ? (double)fin.batch_records / (double)fin.batches : 0.0,
            fin.batches ? (double)fin.batch_tokens / (double)fin.batches : 0.0, a.out);
    if (fin.unreadable_results)
        fprintf(stderr, "clef eval: %zu earlier result lines could not be read and were ignored\n",
                fin.unreadable_results);
    if (rc != 0) {
        fprintf(stderr, "clef eval: %s\n", err.message);
        return 1;
    }
    if (fin.violations) {
        fprintf(stderr, "clef eval: %zu answers failed the kit's checks (status error, see their \"error\"); they are "
                        "answered again on a rerun\n", fin.violations);
        return 1;
    }
    return 0;
}
