/* clef decide / clef demo — answer one request and print the response. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "cli/media_paths.h"
#include "decision/answer.h"
#include "engine/engine.h"
#include "engine/placement.h"

/* The seed triage request of SPEC.md §3.5 (what `make demo` answers). */
static const char TRIAGE_REQUEST[] =
    "{\"model\":\"clef-omni\","
    "\"state\":\"Our checkout started returning errors and orders are blocked.\","
    "\"questions\":{"
    "\"department\":{\"type\":\"choice\",\"instructions\":\"Which team should handle the message?\","
    "\"criteria\":{\"billing\":\"Payments or invoices\",\"technical\":\"Bugs or outages\"}},"
    "\"urgency\":{\"type\":\"score\",\"criteria\":[\"Can wait\",\"This week\",\"Today\"]},"
    "\"outage\":{\"type\":\"noul\",\"instructions\":\"Is a service down?\"}}}";

#define DEFAULT_DEMO_MODEL "tests/fixtures/tiny-clef-omni"

/* Default request size limit of decide, MiB: far above any request that
 * fits max_length, low enough that reading /dev/zero by mistake ends. */
#define DECIDE_DEFAULT_MAX_BODY_MB 256

/* Print the response or the error body; exit status 0 / 2 (rejected) / 1 (internal). */
static int answer(clef_engine *e, const char *body, size_t len, int debug) {
    clef_buf out = {0};
    clef_err err;
    clef_err_clear(&err);
    clef_decide_params params = {.debug = debug, .truncate_state = -1};
    int rc = clef_engine_decide(e, body, len, &params, &out, &err);
    if (rc != 0) {
        clef_buf eb = {0};
        clef_render_error(&err, &eb);
        printf("%s\n", eb.data);
        clef_buf_free(&eb);
        return err.status >= 500 ? 1 : 2;
    }
    printf("%s\n", out.data);
    clef_buf_free(&out);
    return 0;
}

/* Media entries that name files become data URLs (media_paths.h); a file
 * that cannot be read is a rejected request: its error body on stdout, 2.
 * Each file may be as large as the request file may be. */
static int inline_media_paths(char **body, size_t *len, size_t max_file_bytes) {
    clef_err err;
    clef_err_clear(&err);
    char *inlined;
    size_t n;
    if (cli_media_inline_paths(*body, *len, max_file_bytes, &inlined, &n, &err)) {
        clef_buf eb = {0};
        clef_render_error(&err, &eb);
        printf("%s\n", eb.data);
        clef_buf_free(&eb);
        return -1;
    }
    if (inlined) {
        free(*body);
        *body = inlined;
        *len = n;
    }
    return 0;
}

/* Where the weights come from: a directory, or a synthetic preset (io/synth.h). */
typedef struct model_source {
    const char *model, *synthetic, *tokenizer, *device, *quant;
    size_t seed, gpu_memory;
    clef_numerics numerics;
    int towers; /* CLEF_TOWERS_* */
} model_source;

static clef_engine *open_engine(const model_source *src, size_t max_length, int threads) {
    clef_engine_options opt = {.model_dir = src->model, .synthetic = src->synthetic, .seed = src->seed,
                               .synthetic_quant = src->quant,
                               .tokenizer = src->tokenizer,
                               .max_length = max_length, .truncate_state = 1, .n_threads = threads,
                               .device = src->device, .numerics = src->numerics,
                               .gpu_memory = src->gpu_memory, .towers = src->towers,
                               /* one record a forward: the plan's workspace is for --max-length */
                               .batch_tokens = max_length ? max_length : CLEF_DEFAULT_MAX_LENGTH,
                               .plan_advice = CLEF_PLACE_ADVICE_DECIDE};
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e)
        fprintf(stderr, "clef: cannot load model from %s%s: %s\n", src->synthetic ? "synthetic preset " : "",
                src->synthetic ? src->synthetic : src->model, err.message);
    return e;
}

static void decide_usage(FILE *f) {
    fprintf(f,
            "usage: clef decide --model DIR|--synthetic P [--device D] [--numerics M] [--max-length N] [--threads N]\n"
            "                   [--gpu-memory SIZE] [--towers cpu|gpu] [--max-body-mb N] [--debug] FILE|-\n"
            "  Answers one SystemOne request (JSON body in FILE, or stdin for -) and prints the\n"
            "  response JSON.  A rejected request prints {\"error\":{...}} and exits with status 2.\n"
            "  Entries of \"images\", \"audio\" and \"videos\" may be file paths (relative to the current\n"
            "  directory) instead of data URLs: the file is read, its MIME type taken from its bytes\n"
            "  (or extension), and sent as a data URL; an unreadable file is a rejected request.\n"
            "  --synthetic P    instead of --model: random weights of preset P (tiny, small, full) drawn\n"
            "                   in memory for --seed N (default 1), tokenizer --tokenizer F (default\n"
            "                   " CLI_DEFAULT_TOKENIZER ")\n"
            "  --quant F        with --synthetic: experts quantized in memory to F (int4, fp8-block, nvfp4,\n"
            "                   nvfp4-modelopt), bitwise what `clef quantize` writes\n"
            "  --max-length N   token budget per record, >= 1 (default 64000); the state's tail is cut\n"
            "                   to fit, as the reference does; with --gpu-memory also the forward the\n"
            "                   plan keeps workspace for\n"
            "  --threads N      compute threads, 1..%d (default: all cores, or OMP_NUM_THREADS)\n"
            "  --device D       cpu, cuda, cuda:N (default: CUDA when a GPU is present, else cpu)\n"
            "  --numerics M     GPU numerics: fast (default; bf16 activations, closer to f32 than the\n"
            "                   reference's own bf16), balanced, or precise (f32-level agreement, slower);\n"
            "                   wins over CLEF_CUDA_NUMERICS / CLEF_CUDA_PRECISE; the CPU is always f32\n"
            "  --gpu-memory SIZE\n"
            "                   GPU memory budget (e.g. 16GiB, 24G; a CUDA device only): experts that do not\n"
            "                   fit are streamed from pinned host memory each forward (`clef inspect --plan`\n"
            "                   shows the plan)\n"
            "  --towers cpu|gpu where the vision and audio towers run (default: gpu on a CUDA device, else\n"
            "                   cpu); cpu keeps their weights off the GPU and out of --gpu-memory\n"
            "  --max-body-mb N  refuse a request file (or a media file it names) larger than N MiB\n"
            "                   (default %d)\n"
            "  --debug          add a \"debug\" object: input_ids and per question spans, option ids, raw logits\n",
            CLEF_CPU_MAX_THREADS, DECIDE_DEFAULT_MAX_BODY_MB);
}

int cli_decide(int argc, char **argv) {
    const char *file = NULL;
    model_source src = {.seed = 1};
    size_t max_length = 0, threads = 0, body_mb = DECIDE_DEFAULT_MAX_BODY_MB;
    int debug = 0, max_length_given = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = arg_str(argc, argv, &i, "--model", &src.model)) ||
            (r = arg_str(argc, argv, &i, "--synthetic", &src.synthetic)) ||
            (r = arg_str(argc, argv, &i, "--quant", &src.quant)) ||
            (r = arg_str(argc, argv, &i, "--tokenizer", &src.tokenizer)) ||
            (r = arg_str(argc, argv, &i, "--device", &src.device)) ||
            (r = arg_numerics(argc, argv, &i, "--numerics", &src.numerics)) ||
            (r = arg_bytes(argc, argv, &i, "--gpu-memory", &src.gpu_memory)) ||
            (r = arg_towers(argc, argv, &i, &src.towers)) ||
            (r = arg_size(argc, argv, &i, "--seed", &src.seed)) || (r = arg_size(argc, argv, &i, "--threads", &threads)) ||
            (r = arg_size(argc, argv, &i, "--max-body-mb", &body_mb))) {
            if (r < 0) return 2;
        } else if ((r = arg_size(argc, argv, &i, "--max-length", &max_length))) {
            if (r < 0) return 2;
            max_length_given = 1;
        } else if (!strcmp(argv[i], "--debug")) {
            debug = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            decide_usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "clef decide: unknown flag %s\n", argv[i]);
            decide_usage(stderr);
            return 2;
        } else if (file) {
            fprintf(stderr, "clef decide: more than one request file\n");
            return 2;
        } else {
            file = argv[i];
        }
    }
    if (!src.model == !src.synthetic || !file || (src.quant && !src.synthetic)) {
        fprintf(stderr, "clef decide: %s\n",
                !file ? "no request file (FILE or - for stdin)"
                : src.quant && !src.synthetic ? "--quant needs --synthetic P"
                : src.model ? "give --model DIR or --synthetic P, not both" : "--model DIR is required");
        decide_usage(stderr);
        return 2;
    }
    if (src.synthetic && !src.tokenizer && !(src.tokenizer = cli_default_tokenizer("clef decide"))) return 2;
    /* 0 would silently mean the default budget, and a thread count past the
     * backend's limit crashed OpenMP (or wrapped when cast to int). */
    if (max_length_given && max_length == 0) {
        fprintf(stderr, "clef decide: --max-length must be at least 1\n");
        return 2;
    }
    if (threads > CLEF_CPU_MAX_THREADS) {
        fprintf(stderr, "clef decide: --threads %zu is more than the limit of %d\n", threads, CLEF_CPU_MAX_THREADS);
        return 2;
    }
    if (body_mb == 0 || body_mb > SIZE_MAX >> 20) {
        fprintf(stderr, "clef decide: --max-body-mb wants 1..%zu\n", (size_t)(SIZE_MAX >> 20));
        return 2;
    }
    /* before the request or the checkpoint is read */
    if (cli_check_placement("clef decide", src.device, src.gpu_memory, src.towers,
                            max_length ? max_length : CLEF_DEFAULT_MAX_LENGTH, "--max-length"))
        return 2;
    size_t len;
    char *body = read_all_max(file, body_mb << 20, &len);
    if (!body) return 1;
    if (inline_media_paths(&body, &len, body_mb << 20)) {
        free(body);
        return 2;
    }
    clef_engine *e = open_engine(&src, max_length, (int)threads);
    if (!e) {
        free(body);
        return 1;
    }
    int rc = answer(e, body, len, debug);
    clef_engine_close(e);
    free(body);
    return rc;
}

int cli_demo(int argc, char **argv) {
    const char *model = DEFAULT_DEMO_MODEL;
    for (int i = 1; i < argc; i++) {
        int r = arg_str(argc, argv, &i, "--model", &model);
        if (r < 0) return 2;
        if (r == 0) {
            fprintf(stderr, "usage: clef demo [--model DIR]   (default %s)\n", DEFAULT_DEMO_MODEL);
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    fprintf(stderr, "clef demo: answering the built-in triage request with the checkpoint in %s\n", model);
    fprintf(stderr, "request: %s\n", TRIAGE_REQUEST);
    model_source src = {.model = model};
    clef_engine *e = open_engine(&src, 0, 0);
    if (!e) return 1;
    int rc = answer(e, TRIAGE_REQUEST, sizeof TRIAGE_REQUEST - 1, 0);
    clef_engine_close(e);
    return rc;
}
