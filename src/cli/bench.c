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
#include "engine/placement.h"
#include "cli/cli.h"
#include "backend/device.h"
#include "engine/engine.h"
#include "engine/state_cache.h"
#include "io/synth.h"
#include "media/media.h"
#include "media/melspec.h"
#include "model/model.h"
#include "model/towers.h"
#include "text/tokenizer.h"
#include "util/timer.h"

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: clef bench (--model DIR | --synthetic tiny|small|full [--seed N] [--tokenizer PATH])\n"
            "                  [--tokens N] [--batch N] [--runs BxT,...] [--iters N] [--threads N]\n"
            "                  [--device D] [--numerics M] [--profile] [--image-mp X] [--audio-s S]\n"
            "                  [--gpu-memory SIZE] [--towers cpu|gpu] [--towers-only] [--kernel NAME=VALUE]\n"
            "  Builds --batch triage-style requests whose states are cut so each record is --tokens\n"
            "  tokens (default 300), packs them into one forward (the engine's batch path), runs it\n"
            "  twice to warm up (CUDA: the second records the batch's CUDA graph) and --iters times\n"
            "  (default 5), and prints one \"key value\" line per figure: latency_ms_p50/p95/min/max\n"
            "  per forward, cpu_ms_p50/min (the process's CPU time per forward: what other work on\n"
            "  shared cores does not stretch), tokens_per_s, ..., cuda_graphs_captured/_replayed/_failed\n"
            "  (so far),\n"
            "  peak_rss_mib last.\n"
            "  --runs 1x300,8x1000  several measurements on one loaded model (each block starts with\n"
            "                  \"run BxT\"); replaces --batch/--tokens\n"
            "  --device D      cpu, cuda, cuda:N (default: automatic)\n"
            "  --numerics M    GPU numerics: fast (default), balanced or precise (see `clef decide --help`);\n"
            "                  printed as \"numerics M\"; the CPU is always f32\n"
            "  --gpu-memory SIZE\n"
            "                  GPU memory budget (e.g. 16GiB; a CUDA device only): the plan for the largest\n"
            "                  run's tokens, experts that do not fit streamed each forward; prints\n"
            "                  streamed_layers, streamed_mb_per_forward and the copy bandwidth reached\n"
            "  --profile       CUDA: after each run's timing, 3 more forwards with per-op GPU timing and\n"
            "                  a table of where the time goes (\"profile BxT\" block); with\n"
            "                  --state-workload, one more cached request so timed\n"
            "  --kernel NAME=VALUE\n"
            "                  CUDA: set a kernel switch for an A/B run (repeatable; the switches give the\n"
            "                  default's results at another speed: e.g. CLEF_CUDA_QGEMM_INT4=v3,\n"
            "                  CLEF_CUDA_V5_ROWS=32; README \"CUDA kernel switches\"); printed in device_detail\n"
            "  --synthetic P   random weights of preset P drawn in memory (no files; full needs ~61 GB)\n"
            "  --seed N        seed of the synthetic weights (default 1)\n"
            "  --image-mp X    also time the vision tower on one image of about X megapixels (a square\n"
            "                  of side a multiple of 32: 1 -> 1024x1024, 4096 patches, 1024 tokens; random\n"
            "                  pixels) and --audio-s S the audio tower on S seconds of a tone (log-mel of\n"
            "                  media/melspec.h): \"towers\" block, p50 over --iters (CUDA: after a warm-up;\n"
            "                  with --profile one more call of each timed per op)\n"
            "  --towers-only   with --synthetic: draw and time only the media towers (no thinker)\n"
            "  --text-only     do not load the media towers (a text deployment's GPU memory)\n"
            "  --towers cpu|gpu\n"
            "                  where the media towers run (default: gpu on a CUDA device, else cpu); cpu\n"
            "                  keeps their weights off the GPU and out of --gpu-memory\n"
            "  --quant F       with --synthetic: experts quantized in memory to F (int4, fp8-block, nvfp4,\n"
            "                  nvfp4-modelopt), as `clef quantize` would write them (full int4 ~18 GB)\n"
            "  --tokenizer F   tokenizer.json (default %s with --synthetic,\n"
            "                  else the model directory's)\n"
            "  --state-workload questions|transcript\n"
            "                  instead of the runs: the state cache's two workloads, each request alone,\n"
            "                  first with the cache bypassed, then with it (a fresh cache): questions =\n"
            "                  --sets N (default 10) question sets over one state of --state-tokens N\n"
            "                  (default 4000) tokens; transcript = --steps N (default 20) steps of a\n"
            "                  transcript growing to --state-tokens.  Prints the total and per-request\n"
            "                  ms both ways, the speedup, the cache's hits / tokens reused / bytes, and\n"
            "                  answers_identical (1: every answer bitwise the same; else exit 1)\n"
            "  --state-cache SIZE  the cache's bound for --state-workload (default 2G)\n",
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
    const char *model, *synthetic, *tokenizer, *device, *runs_spec, *quant, *image_mp, *audio_s;
    size_t seed, tokens, batch, iters, threads;
    clef_numerics numerics;
    int profile, towers_only, text_only, towers;
    const char *workload;      /* --state-workload questions|transcript, or NULL */
    size_t state_tokens, sets, steps, state_cache, gpu_memory;
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

/* A whole decimal number ("1", "0.5", "2e1"), or NaN for anything else
 * ("1abc", "", "0x10"), which every range check then refuses. */
static double decimal(const char *s) {
    char *end;
    double v = strtod(s, &end);
    return end != s && *end == '\0' && !strpbrk(s, "xXnN") ? v : NAN;
}

/* Parse the flags; returns -1 to exit 0 (--help), 0 ok, 2 bad usage. */
static int parse_args(int argc, char **argv, bench_args *a) {
    *a = (bench_args){.seed = 1, .tokens = 300, .batch = 1, .iters = 5, .state_tokens = 4000, .sets = 10, .steps = 20,
                      .state_cache = CLEF_STATE_CACHE_DEFAULT_BYTES};
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = arg_str(argc, argv, &i, "--model", &a->model)) ||
            (r = arg_str(argc, argv, &i, "--synthetic", &a->synthetic)) ||
            (r = arg_str(argc, argv, &i, "--quant", &a->quant)) ||
            (r = arg_str(argc, argv, &i, "--tokenizer", &a->tokenizer)) ||
            (r = arg_str(argc, argv, &i, "--device", &a->device)) ||
            (r = arg_numerics(argc, argv, &i, "--numerics", &a->numerics)) ||
            (r = arg_str(argc, argv, &i, "--runs", &a->runs_spec)) ||
            (r = arg_str(argc, argv, &i, "--image-mp", &a->image_mp)) ||
            (r = arg_str(argc, argv, &i, "--audio-s", &a->audio_s)) ||
            (r = arg_size(argc, argv, &i, "--seed", &a->seed)) ||
            (r = arg_size(argc, argv, &i, "--tokens", &a->tokens)) ||
            (r = arg_size(argc, argv, &i, "--batch", &a->batch)) ||
            (r = arg_size(argc, argv, &i, "--iters", &a->iters)) ||
            (r = arg_size(argc, argv, &i, "--threads", &a->threads)) ||
            (r = arg_str(argc, argv, &i, "--state-workload", &a->workload)) ||
            (r = arg_size(argc, argv, &i, "--state-tokens", &a->state_tokens)) ||
            (r = arg_size(argc, argv, &i, "--sets", &a->sets)) ||
            (r = arg_size(argc, argv, &i, "--steps", &a->steps)) ||
            (r = arg_bytes(argc, argv, &i, "--state-cache", &a->state_cache)) ||
            (r = arg_bytes(argc, argv, &i, "--gpu-memory", &a->gpu_memory)) ||
            (r = arg_towers(argc, argv, &i, &a->towers))) {
            if (r < 0) return 2;
        } else if (!strcmp(argv[i], "--kernel")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "clef bench: --kernel needs NAME=VALUE (e.g. CLEF_CUDA_QGEMM_INT4=v3)\n");
                return 2;
            }
            char kv[128];
            const char *eq = strchr(argv[++i], '=');
            if (!eq || eq == argv[i] || strlen(argv[i]) >= sizeof kv) {
                fprintf(stderr, "clef bench: --kernel needs NAME=VALUE (got '%s')\n", argv[i]);
                return 2;
            }
            memcpy(kv, argv[i], (size_t)(eq - argv[i]));
            kv[eq - argv[i]] = 0;
            clef_err kerr;
            clef_err_clear(&kerr);
            if (clef_cuda_set_switch(kv, eq + 1, &kerr)) {
                fprintf(stderr, "clef bench: --kernel: %s\n", kerr.message);
                return 2;
            }
        } else if (!strcmp(argv[i], "--profile")) {
            a->profile = 1;
        } else if (!strcmp(argv[i], "--towers-only")) {
            a->towers_only = 1;
        } else if (!strcmp(argv[i], "--text-only")) {
            a->text_only = 1;
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
    if (a->synthetic && !a->tokenizer && !(a->tokenizer = cli_default_tokenizer("clef bench"))) return 2;
    if (a->workload && ((strcmp(a->workload, "questions") && strcmp(a->workload, "transcript")) || a->sets < 2 ||
                        a->sets > 1000 || a->steps < 2 || a->steps > 1000 || a->state_tokens < 64 ||
                        a->state_tokens > 1000000 || a->state_cache == 0)) {
        fprintf(stderr, "clef bench: --state-workload is questions or transcript; --sets and --steps in [2, 1000], "
                        "--state-tokens in [64, 1000000], --state-cache not 0\n");
        return 2;
    }
    if ((a->text_only && (a->towers_only || a->image_mp || a->audio_s)) ||
        (a->towers_only && (!a->synthetic || (!a->image_mp && !a->audio_s))) ||
        (a->image_mp && !(decimal(a->image_mp) > 0 && decimal(a->image_mp) <= 64)) ||
        (a->audio_s && !(decimal(a->audio_s) >= 0.1 && decimal(a->audio_s) <= 3600))) {
        fprintf(stderr, "clef bench: --towers-only needs --synthetic and --image-mp or --audio-s; --image-mp in "
                        "(0, 64], --audio-s in [0.1, 3600]; --text-only takes none of the three\n");
        return 2;
    }
    size_t max_forward = 0; /* the plan's forward: the largest run, B x T (saturating) */
    for (size_t i = 0; i < a->n_runs; i++) {
        const size_t b = a->runs[i].batch, t = a->runs[i].tokens, f = t && b > SIZE_MAX / t ? SIZE_MAX : b * t;
        max_forward = f > max_forward ? f : max_forward;
    }
    if (cli_check_placement("clef bench", a->towers_only && a->towers == CLEF_TOWERS_CPU ? "cpu" : a->device,
                            a->gpu_memory, a->towers, max_forward, "--batch x --tokens (the largest run)"))
        return 2;
    return 0;
}

/* ---- media towers ---------------------------------------------------------- */

static uint64_t bench_rng = 0x9E3779B97F4A7C15ULL;

static float bench_frand(void) { /* xorshift64: uniform in [-1, 1) */
    bench_rng ^= bench_rng << 13, bench_rng ^= bench_rng >> 7, bench_rng ^= bench_rng << 17;
    return (float)((double)(bench_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* ms[0..n) sorted; prints "<key>_ms_p50/min/max". */
static void print_ms(const char *key, double *ms, size_t n) {
    qsort(ms, n, sizeof *ms, cmp_double);
    printf("%s_ms_p50 %.3f\n%s_ms_min %.3f\n%s_ms_max %.3f\n", key, percentile(ms, n, 50), key, ms[0], key,
           ms[n - 1]);
}

/* One square image of about `mp` megapixels (side rounded up to a multiple
 * of 32, as the processor's 2x2 merge of 16-pixel patches needs: 1 ->
 * 1024x1024) as patch rows of random normalised pixels, through the vision
 * tower (main merger + deepstack).  `warm`: one untimed call first. */
static int bench_vision(clef_towers *t, double mp, size_t iters, int warm, double *ms) {
    int64_t side = (int64_t)ceil(sqrt(mp * 1e6) / 32.0 - 1e-9) * 32;
    if (side < 32) side = 32;
    const clef_vision_config *vc = clef_towers_vision_config(t);
    if (!vc) return fprintf(stderr, "clef bench: the checkpoint has no vision tower\n"), 1;
    clef_grid g = {1, (int32_t)(side / 16), (int32_t)(side / 16)};
    size_t rows = (size_t)g.h * (size_t)g.w, O = (size_t)vc->out_hidden_size, nds = (size_t)vc->n_deepstack;
    float *px = malloc(sizeof(float) * rows * CLEF_PATCH_DIM), *out = malloc(sizeof(float) * rows / 4 * O);
    float *ds = malloc(sizeof(float) * (nds ? nds : 1) * rows / 4 * O);
    for (size_t i = 0; i < rows * CLEF_PATCH_DIM; i++) px[i] = bench_frand();
    int rc = 0;
    for (size_t it = warm ? 0 : 1; it <= iters && rc == 0; it++) {
        clef_err err;
        clef_err_clear(&err);
        double t0 = clef_now();
        if (clef_vision_forward(t, px, rows, &g, 1, out, ds, &err) != 0) {
            fprintf(stderr, "clef bench: vision tower: %s\n", err.message);
            rc = 1;
        }
        if (it > 0) ms[it - 1] = (clef_now() - t0) * 1e3; /* it 0: the warm-up (only when warm) */
    }
    if (rc == 0) {
        printf("tower_image_px %lldx%lld\ntower_image_patches %zu\ntower_image_tokens %zu\n", (long long)side,
               (long long)side, rows, rows / 4);
        print_ms("tower_image", ms, iters);
    }
    free(px), free(out), free(ds);
    return rc;
}

/* `seconds` of a 440 Hz tone with a slow sweep, as log-mel features,
 * through the audio tower. */
static int bench_audio(clef_towers *t, double seconds, size_t iters, int warm, double *ms) {
    const clef_audio_config *ac = clef_towers_audio_config(t);
    if (!ac) return fprintf(stderr, "clef bench: the checkpoint has no audio tower\n"), 1;
    size_t len = (size_t)llround(seconds * 16000.0), frames = len / 160;
    float *clip = malloc(sizeof(float) * len), *feat = malloc(sizeof(float) * CLEF_MEL_BINS * frames);
    for (size_t i = 0; i < len; i++) {
        double s = (double)i / 16000.0;
        clip[i] = (float)(0.4 * sin(2 * M_PI * (440.0 + 20.0 * s) * s)) + 0.01f * bench_frand();
    }
    const float *clips[1] = {clip};
    int rc = clef_log_mel(clips, &len, 1, len, feat) != 0;
    int32_t m = clef_audio_frames(len, len);
    size_t rows = (size_t)clef_audio_tokens(m);
    float *out = malloc(sizeof(float) * (rows ? rows : 1) * (size_t)ac->output_dim);
    for (size_t it = warm ? 0 : 1; it <= iters && rc == 0; it++) {
        clef_err err;
        clef_err_clear(&err);
        double t0 = clef_now();
        if (clef_audio_forward(t, feat, 1, frames, &m, out, &err) != 0) {
            fprintf(stderr, "clef bench: audio tower: %s\n", err.message);
            rc = 1;
        }
        if (it > 0) ms[it - 1] = (clef_now() - t0) * 1e3; /* it 0: the warm-up (only when warm) */
    }
    if (rc == 0) {
        printf("tower_audio_s %.2f\ntower_audio_frames %d\ntower_audio_tokens %zu\n", seconds, m, rows);
        print_ms("tower_audio", ms, iters);
    }
    free(clip), free(feat), free(out);
    return rc;
}

/* The "towers" block: the media towers bound on `be` from `ck`, timed. */
static int bench_towers(const bench_args *a, const clef_checkpoint *ck, clef_backend *be) {
    clef_err err;
    clef_err_clear(&err);
    double t0 = clef_now();
    clef_towers *t = clef_towers_create(ck, be, &err);
    if (!t) return fprintf(stderr, "clef bench: media towers: %s\n", err.message), 1;
    printf("towers\ntowers_bind_s %.3f\n", clef_now() - t0);
    const clef_vision_config *vc = clef_towers_vision_config(t);
    const clef_audio_config *ac = clef_towers_audio_config(t);
    if (vc) printf("vision_depth %lld\nvision_hidden %lld\n", (long long)vc->depth, (long long)vc->hidden_size);
    if (ac) printf("audio_layers %lld\naudio_d_model %lld\n", (long long)ac->encoder_layers, (long long)ac->d_model);
    double *ms = calloc(a->iters + 1, sizeof *ms);
    /* a warm-up call on CUDA (GEMM plans, pool growth); the CPU has nothing to warm */
    const int warm = clef_backend_is_cuda(be);
    int rc = a->image_mp ? bench_vision(t, strtod(a->image_mp, NULL), a->iters, warm, ms) : 0;
    if (rc == 0 && a->audio_s) rc = bench_audio(t, strtod(a->audio_s, NULL), a->iters, warm, ms);
    if (rc == 0 && clef_backend_is_cuda(be)) printf("gpu_peak_mib %.0f\n", (double)clef_cuda_peak_bytes(be) / 1048576.0);
    if (rc == 0 && a->profile && clef_backend_is_cuda(be)) { /* one more call of each, timed per op */
        clef_cuda_profile_dump(be, NULL);
        clef_cuda_set_profile(be, 1);
        if (a->image_mp && bench_vision(t, strtod(a->image_mp, NULL), 1, 0, ms) == 0) {
            printf("profile tower_image (1 call, GPU time per op)\n");
            clef_cuda_profile_dump(be, stdout);
        }
        if (a->audio_s && bench_audio(t, strtod(a->audio_s, NULL), 1, 0, ms) == 0) {
            printf("profile tower_audio (1 call, GPU time per op)\n");
            clef_cuda_profile_dump(be, stdout);
        }
        clef_cuda_set_profile(be, 0);
    }
    fflush(stdout);
    free(ms);
    clef_towers_free(t);
    return rc;
}

/* --towers-only: the preset's towers drawn alone, on the chosen backend. */
static int bench_towers_only(const bench_args *a) {
    clef_err err;
    clef_err_clear(&err);
    clef_checkpoint ck;
    double t0 = clef_now();
    if (clef_synth_towers_checkpoint(a->synthetic, a->seed, stderr, &ck, &err) != 0)
        return fprintf(stderr, "clef bench: %s\n", err.message), 1;
    clef_backend *be = clef_backend_open(a->towers == CLEF_TOWERS_CPU ? "cpu" : a->device, (int)a->threads,
                                         a->numerics, &err);
    if (!be) {
        clef_checkpoint_close(&ck);
        return fprintf(stderr, "clef bench: %s\n", err.message), 1;
    }
    printf("model synthetic:%s (towers only)\nseed %zu\ndevice %s\n", a->synthetic, a->seed, be->ops->name);
    char detail[256];
    clef_cuda_describe(be, detail, sizeof detail);
    if (*detail) printf("device_detail %s\n", detail);
    printf("load_s %.3f\n", clef_now() - t0);
    int rc = bench_towers(a, &ck, be);
    be->ops->destroy(be);
    clef_checkpoint_close(&ck);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("peak_rss_mib %.0f\n", (double)ru.ru_maxrss / 1024.0);
    return rc;
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
            if (err.status == 422 && strstr(err.message, "before state"))
                fprintf(stderr, "clef bench: %zu tokens per record is too few for the benchmark's request (%s); "
                                "use --tokens / --runs with more\n",
                        r->tokens, err.message);
            else
                fprintf(stderr, "clef bench: %s\n", err.message);
            return -1;
        }
    }
    return (clef_now() - t0) * 1e3 / (double)r->batch;
}

/* CPU seconds of the process (all threads). */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* `warm` untimed forwards, then `iters` timed ones into ms[0..iters) (wall)
 * and, when cpu_ms is non-NULL, cpu_ms[0..iters) (the process's CPU time).
 * Returns 0 or 1 (printed). */
static int run_forwards(clef_engine *e, const bench_run *r, size_t warm, size_t iters, clef_job *jobs, double *ms,
                        double *cpu_ms) {
    clef_job **ptrs = calloc(r->batch, sizeof *ptrs);
    clef_err *errs = calloc(r->batch, sizeof *errs);
    int rc = 0;
    for (size_t i = 0; i < r->batch; i++) ptrs[i] = &jobs[i];
    for (size_t it = 0; it < warm + iters && rc == 0; it++) {
        double t0 = clef_now(), c0 = cpu_now();
        if (clef_engine_run(e, ptrs, r->batch, errs) != 0) {
            for (size_t i = 0; i < r->batch; i++)
                if (errs[i].status) fprintf(stderr, "clef bench: record %zu: %s\n", i, errs[i].message);
            rc = 1;
        }
        if (it >= warm) ms[it - warm] = (clef_now() - t0) * 1e3;
        if (it >= warm && cpu_ms) cpu_ms[it - warm] = (cpu_now() - c0) * 1e3;
    }
    free(ptrs);
    free(errs);
    return rc;
}

static void print_run(const bench_run *r, size_t iters, const clef_job *jobs, double encode_ms, double *ms,
                      double *cpu_ms) {
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
    /* CPU time: what other work on shared cores does not stretch (idle
     * OpenMP threads that spin count in it: OMP_WAIT_POLICY=passive) */
    qsort(cpu_ms, iters, sizeof *cpu_ms, cmp_double);
    printf("cpu_ms_p50 %.3f\n", percentile(cpu_ms, iters, 50));
    printf("cpu_ms_min %.3f\n", cpu_ms[0]);
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
    long cap, rep, failed;
    clef_cuda_graph_stats(be, &cap, &rep, &failed);
    printf("cuda_graphs_captured %ld\ncuda_graphs_replayed %ld\ncuda_graphs_failed %ld\n", cap, rep, failed);
    if (!profile) return 0;
    clef_cuda_profile_dump(be, NULL);
    clef_cuda_set_profile(be, 1);
    int rc = run_forwards(e, r, 1, 2, jobs, ms, NULL); /* a warm-up and 2 timed: 3 forwards profiled */
    printf("profile %zux%zu (3 forwards, GPU time per op)\n", r->batch, r->tokens);
    clef_cuda_profile_dump(be, stdout);
    clef_cuda_set_profile(be, 0);
    fflush(stdout);
    return rc;
}

/* One run: encode, warm up, time, print.  Returns 0 or 1. */
static int bench_one(clef_engine *e, const bench_run *r, size_t iters, int profile) {
    clef_job *jobs = calloc(r->batch, sizeof *jobs);
    double *ms = calloc(iters < 2 ? 2 : iters, sizeof *ms), *cpu_ms = calloc(iters, sizeof *cpu_ms);
    double encode_ms = make_jobs(e, r, jobs);
    /* two warm-ups: the first fixes kernels and scratch, the second records the CUDA graph */
    clef_backend *be = clef_model_backend(clef_engine_model(e));
    uint64_t n_streamed = 0, copies0 = 0, bytes0 = 0, copies1 = 0, bytes1 = 0;
    clef_cuda_stream_stats(be, &n_streamed, &copies0, &bytes0);
    int rc = encode_ms < 0 ? 1 : run_forwards(e, r, 2, iters, jobs, ms, cpu_ms);
    clef_cuda_stream_stats(be, NULL, &copies1, &bytes1);
    if (rc == 0) print_run(r, iters, jobs, encode_ms, ms, cpu_ms);
    if (rc == 0 && n_streamed) { /* --gpu-memory streamed experts: bytes per forward against the link */
        const double per = (double)(bytes1 - bytes0) / (double)(2 + iters);
        const double gbps = clef_cuda_pinned_copy_gbps(be);
        printf("streamed_layers %llu\nstreamed_copies_per_forward %.2f\nstreamed_mb_per_forward %.1f\n",
               (unsigned long long)n_streamed, (double)(copies1 - copies0) / (double)(2 + iters), per / 1048576.0);
        if (gbps > 0) printf("pinned_copy_gb_per_s %.1f\nstream_floor_ms %.2f\n", gbps, per / (gbps * 1e9) * 1e3);
    }
    if (rc == 0) rc = gpu_report(e, r, jobs, ms, profile);
    for (size_t i = 0; i < r->batch; i++) clef_job_free(&jobs[i]);
    free(jobs);
    free(ms);
    free(cpu_ms);
    return rc;
}

/* ---- the state cache's workloads (--state-workload) ---------------------- */

/* Body k of a workload: a state of the first `words` bench words (variant 0,
 * so a shorter state is a prefix of a longer one) and question set k. */
static void state_body(size_t words, size_t k, clef_buf *b) {
    clef_buf_puts(b, "{\"model\":\"bench\",\"state\":\"");
    for (size_t w = 0; w < words; w++) bench_word(w, 0, b);
    clef_buf_printf(b,
                    "\",\"questions\":{\"team_%zu\":{\"type\":\"choice\",\"instructions\":\"Which team handles "
                    "ticket %zu?\",\"criteria\":{\"billing\":\"Payments\",\"technical\":\"Bugs %zu\",\"sales\":"
                    "\"Deals\"}},\"urgent_%zu\":{\"type\":\"noul\",\"instructions\":\"Is request %zu urgent?\"},"
                    "\"level\":{\"type\":\"score\",\"criteria\":[\"low\",\"mid\",\"high %zu\"]}}}",
                    k, k, k, k, k, k);
}

/* Answer body i of the workload alone; its logits into *out (owned), its
 * tokens into *tokens; the wall ms returned (encode included), < 0 on error. */
static double state_request(clef_engine *e, const bench_args *a, size_t full_words, size_t i, float **out,
                            size_t *n_out, size_t *tokens) {
    const int q = !strcmp(a->workload, "questions");
    const size_t words = q ? full_words : full_words * (i + 1) / a->steps;
    clef_buf body = {0};
    state_body(words, q ? i : 0, &body);
    double t0 = clef_now();
    clef_err err;
    clef_err_clear(&err);
    clef_request req;
    clef_job job, *one = &job;
    clef_decide_params params = {.truncate_state = 0};
    int rc = clef_engine_parse(e, body.data, body.len, &req, &err);
    if (rc == 0) rc = clef_engine_encode(e, &req, &params, &job, &err);
    if (rc == 0 && (rc = clef_engine_run(e, &one, 1, &err)) != 0) clef_job_free(&job);
    double ms = (clef_now() - t0) * 1e3;
    clef_buf_free(&body);
    if (rc != 0) {
        fprintf(stderr, "clef bench: request %zu: %s\n", i, err.message);
        return -1;
    }
    *n_out = clef_record_total_options(&job.rec);
    *out = malloc((*n_out + 1) * sizeof **out);
    memcpy(*out, job.logits, *n_out * sizeof **out);
    *tokens = job.rec.n_ids;
    clef_job_free(&job);
    return ms;
}

static int bench_state(clef_engine *e, const bench_args *a) {
    const int q = !strcmp(a->workload, "questions");
    const size_t n = q ? a->sets : a->steps;
    if (clef_engine_state_cache_off_reason(e)) {
        fprintf(stderr, "clef bench: %s\n", clef_engine_state_cache_off_reason(e));
        return 1;
    }
    float **want = calloc(n, sizeof *want), **got = calloc(n, sizeof *got);
    size_t *nw = calloc(n, sizeof *nw), *ng = calloc(n, sizeof *ng), tokens = 0, total_tokens = 0;
    double *off_ms = calloc(n, sizeof *off_ms), *on_ms = calloc(n, sizeof *on_ms), off = 0, on = 0;
    int rc = 0, same = 1;
    /* words for a state of about --state-tokens tokens (the words' tokens per word, measured) */
    clef_buf st = {0};
    for (size_t w = 0; w < a->state_tokens; w++) bench_word(w, 0, &st);
    clef_ids ids = {0};
    clef_err terr;
    clef_err_clear(&terr);
    size_t words = a->state_tokens;
    if (clef_tokenize(clef_engine_tokenizer(e), st.data, st.len, &ids, &terr) == 0 && ids.n)
        words = (size_t)((double)a->state_tokens * (double)a->state_tokens / (double)ids.n + 0.5);
    clef_ids_free(&ids);
    clef_buf_free(&st);
    clef_engine_state_cache_bypass(e, 1);
    float *w0;
    size_t n0;
    if (state_request(e, a, words, 0, &w0, &n0, &tokens) < 0) rc = 1; /* warm-up: pages, scratch */
    else free(w0);
    for (size_t i = 0; i < n && rc == 0; i++) {
        off_ms[i] = state_request(e, a, words, i, &want[i], &nw[i], &tokens);
        if (off_ms[i] < 0) rc = 1;
        off += off_ms[i];
        total_tokens += tokens;
    }
    clef_engine_state_cache_bypass(e, 0);
    for (size_t i = 0; i < n && rc == 0; i++) {
        on_ms[i] = state_request(e, a, words, i, &got[i], &ng[i], &tokens);
        if (on_ms[i] < 0) rc = 1;
        on += on_ms[i];
        if (rc == 0 && (ng[i] != nw[i] || memcmp(got[i], want[i], nw[i] * sizeof(float)) != 0)) same = 0;
    }
    if (rc == 0) {
        clef_state_cache_stats st;
        clef_engine_state_cache_stats(e, &st);
        printf("workload %s\n", a->workload);
        printf("requests %zu\n", n);
        printf("state_words %zu\n", words);
        printf("tokens_per_request_last %zu\n", tokens);
        printf("tokens_total %zu\n", total_tokens);
        printf("cache_off_ms_total %.1f\n", off);
        printf("cache_on_ms_total %.1f\n", on);
        printf("speedup %.2f\n", off / on);
        printf("cache_off_ms_first %.1f\ncache_on_ms_first %.1f\n", off_ms[0], on_ms[0]);
        double offr = 0, onr = 0;
        for (size_t i = 1; i < n; i++) offr += off_ms[i], onr += on_ms[i];
        printf("cache_off_ms_mean_after_first %.1f\ncache_on_ms_mean_after_first %.1f\n", offr / (double)(n - 1),
               onr / (double)(n - 1));
        printf("speedup_after_first %.2f\n", offr / onr);
        printf("state_cache_hits %llu\nstate_cache_tokens_reused %llu\nstate_cache_bytes %zu\nstate_cache_blocks %zu\n",
               (unsigned long long)st.hits, (unsigned long long)st.tokens_reused, st.bytes, st.blocks);
        printf("answers_identical %d\n", same);
        clef_backend *be = clef_model_backend(clef_engine_model(e));
        if (clef_backend_is_cuda(be)) {
            long cap, rep, failed;
            clef_cuda_graph_stats(be, &cap, &rep, &failed);
            printf("cuda_graphs_captured %ld\ncuda_graphs_replayed %ld\ncuda_graphs_failed %ld\n", cap, rep, failed);
            if (a->profile) { /* one more cached request (the last one again), timed per op */
                float *x = NULL;
                size_t nx = 0, tk = 0;
                clef_cuda_profile_dump(be, NULL);
                clef_cuda_set_profile(be, 1);
                const double ms = state_request(e, a, words, n - 1, &x, &nx, &tk);
                free(x);
                printf("profile cached request (1 request, %.1f ms wall, GPU time per op)\n", ms);
                clef_cuda_profile_dump(be, stdout);
                clef_cuda_set_profile(be, 0);
            }
        }
        fflush(stdout);
        if (!same) fprintf(stderr, "clef bench: answers differ with the state cache on\n");
    }
    for (size_t i = 0; i < n; i++) free(want[i]), free(got[i]);
    free(want), free(got), free(nw), free(ng), free(off_ms), free(on_ms);
    return rc ? rc : !same;
}

int cli_bench(int argc, char **argv) {
    bench_args a;
    int prc = parse_args(argc, argv, &a);
    if (prc) return prc < 0 ? 0 : prc;
    if (a.towers_only) return bench_towers_only(&a);
    size_t max_tokens = 0, max_forward = 0; /* the longest record; the largest forward (the plan's workspace) */
    for (size_t i = 0; i < a.n_runs; i++) {
        max_tokens = a.runs[i].tokens > max_tokens ? a.runs[i].tokens : max_tokens;
        const size_t f = a.runs[i].tokens * a.runs[i].batch;
        max_forward = f > max_forward ? f : max_forward;
    }
    clef_engine_options opt = {.model_dir = a.model, .synthetic = a.synthetic, .seed = a.seed,
                               .synthetic_quant = a.quant, .tokenizer = a.tokenizer, .device = a.device,
                               .numerics = a.numerics, .max_length = max_tokens,
                               .truncate_state = 1, .n_threads = (int)a.threads, .verbose = 1,
                               .text_only = a.text_only, .state_cache = a.workload ? a.state_cache : 0,
                               .gpu_memory = a.gpu_memory, .batch_tokens = max_forward, .towers = a.towers,
                               .plan_advice = CLEF_PLACE_ADVICE_BENCH};
    if (a.workload) opt.max_length = 0; /* the engine's default budget: the whole state */
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
    printf("numerics %s\n", clef_numerics_of(clef_model_backend(clef_engine_model(e))));
    printf("load_s %.3f\n", clef_engine_load_seconds(e));
    int rc = 0;
    if (a.workload) rc = bench_state(e, &a);
    for (size_t i = 0; !a.workload && i < a.n_runs && rc == 0; i++) rc = bench_one(e, &a.runs[i], a.iters, a.profile);
    if (rc == 0 && (a.image_mp || a.audio_s)) {
        clef_backend *mbe = clef_model_backend(clef_engine_model(e)), *tbe = mbe;
        if (a.towers == CLEF_TOWERS_CPU && strcmp(mbe->ops->name, "cpu")) /* the towers where the engine runs them */
            tbe = clef_backend_open("cpu", (int)a.threads, a.numerics, &err);
        rc = tbe ? bench_towers(&a, clef_engine_checkpoint(e), tbe) : (fprintf(stderr, "clef bench: %s\n", err.message), 1);
        if (tbe && tbe != mbe) tbe->ops->destroy(tbe);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("peak_rss_mib %.0f\n", (double)ru.ru_maxrss / 1024.0);
    clef_engine_close(e);
    return rc;
}
