/* clef parity — compare two models' answers on a file of requests
 * (src/engine/parity.h computes the metric; this file is flags and output). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "engine/placement.h"
#include "cli/cli.h"
#include "engine/parity.h"
#include "json/json.h"
#include "quant/convert.h"
#include "util/buf.h"
#include "util/timer.h"

static void parity_usage(FILE *f) {
    fprintf(f,
            "usage: clef parity (--model A --model B | --synthetic P [--seed N] [--quant-a F] [--quant-b F]\n"
            "                   [--tokenizer F]) --requests FILE.jsonl [--device D] [--max-length N] [--threads N]\n"
            "                   [--numerics M] [--numerics-a M] [--numerics-b M] [--gpu-memory SIZE] [--json]\n"
            "  Answers every request of FILE (one SystemOne request per line, or an object with \"request\",\n"
            "  optional \"name\" and \"max_length\", as in goldens.jsonl) with both models and reports, over all\n"
            "  questions: top-1 agreement, mean and max total-variation distance between the per-option\n"
            "  distributions (unrounded, from the logits), and the questions whose top-1 option flipped.\n"
            "  One model is loaded at a time: A answers every request and is freed, then B is loaded (so\n"
            "  the full preset in BF16 and a quantized copy never have to fit together).\n"
            "  --synthetic P   both models are synthetic preset P (tiny, small, full) drawn in memory for\n"
            "                  --seed N (default 1); --quant-a / --quant-b F quantize that side's experts in\n"
            "                  memory to F (int4, fp8-block, nvfp4, nvfp4-modelopt; bitwise what `clef\n"
            "                  quantize` writes); a side without --quant-x (or with bf16) is BF16.  E.g. BF16 vs INT4:\n"
            "                  --synthetic full --quant-b int4.  --quant-b may list several formats\n"
            "                  (int4,fp8-block,nvfp4): A answers once, then each B in turn is loaded,\n"
            "                  answers, is compared with A and freed (one report each; with --json one\n"
            "                  JSON object per line, with \"a\" and \"b\" naming the models).\n"
            "                  Tokenizer --tokenizer F (default\n"
            "                  " CLI_DEFAULT_TOKENIZER ")\n"
            "  --device D      cpu, cuda, cuda:N for both models (default: automatic)\n"
            "  --numerics M    GPU numerics of both sides: fast (default), balanced or precise (see `clef\n"
            "                  decide --help`); --numerics-a / --numerics-b M set one side's (they win over\n"
            "                  --numerics): e.g. BF16 precise vs BF16 fast\n"
            "  --gpu-memory SIZE\n"
            "                  GPU memory budget of each model (e.g. 16GiB; a CUDA device only): experts\n"
            "                  that do not fit are streamed from pinned host memory (`clef inspect --plan`);\n"
            "                  the workspace is for one record of --max-length tokens (default 64000)\n"
            "  --json prints the report as one JSON object.  Exit status 1 if a model cannot be loaded.\n");
}

/* One side of the comparison: a directory, or the synthetic preset (BF16
 * when quant is NULL). */
typedef struct parity_side {
    const char *dir, *quant;
    clef_numerics numerics; /* this side's GPU numerics; CLEF_NUMERICS_ENV = the environment, else fast */
    char label[256]; /* printed as "A <label>" */
} parity_side;

typedef struct parity_common {
    const char *synthetic, *tokenizer, *device;
    size_t seed, max_length, threads, gpu_memory;
} parity_common;

static clef_engine *open_model(const parity_side *side, const parity_common *c) {
    clef_engine_options opt = {.model_dir = side->dir, .max_length = c->max_length, .truncate_state = 1,
                               .n_threads = (int)c->threads, .device = c->device, .numerics = side->numerics,
                               .gpu_memory = c->gpu_memory, .verbose = c->synthetic != NULL,
                               /* one request a forward: the plan's workspace is for --max-length */
                               .batch_tokens = c->max_length ? c->max_length : CLEF_DEFAULT_MAX_LENGTH,
                               .plan_advice = CLEF_PLACE_ADVICE_PARITY};
    if (!side->dir) {
        opt.synthetic = c->synthetic;
        opt.seed = c->seed;
        opt.synthetic_quant = side->quant;
        opt.tokenizer = c->tokenizer;
    }
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e) fprintf(stderr, "clef parity: cannot load %s: %s\n", side->label, err.message);
    return e;
}

/* Load `side`, answer every line, free the model.  0, 1 (cannot load) or
 * 2 (bad requests file). */
static int answer_all(const parity_side *side, const parity_common *c, const char *text, size_t len,
                      clef_parity_answers *out) {
    double t0 = clef_now();
    clef_engine *e = open_model(side, c);
    if (!e) return 1;
    double t1 = clef_now();
    clef_err err;
    clef_err_clear(&err);
    int rc = clef_parity_collect(e, text, len, out, &err);
    if (rc != 0) fprintf(stderr, "clef parity: %s\n", err.message);
    else
        fprintf(stderr, "clef parity: %s: loaded in %.1f s, answered %zu lines in %.1f s\n", side->label, t1 - t0,
                out->n, clef_now() - t1);
    clef_engine_close(e);
    return rc == 0 ? 0 : err.status == 400 ? 2 : 1;
}

static void print_report(const char *a, const char *b, const clef_parity_report *r) {
    printf("A %s\nB %s\n", a, b);
    printf("requests %zu answered by both, %zu rejected by both, %zu answered by one only\n", r->requests,
           r->rejected, r->mismatched);
    printf("top-1 agreement %zu/%zu questions (%.2f%%)\n", r->agree, r->questions,
           r->questions ? 100.0 * (double)r->agree / (double)r->questions : 100.0);
    printf("total variation distance: mean %.6f, max %.6f%s%s\n", r->mean_tv, r->max_tv,
           r->max_tv_where ? " at " : "", r->max_tv_where ? r->max_tv_where : "");
    printf("flipped questions: %zu\n", r->n_flips);
    for (size_t i = 0; i < r->n_flips; i++) {
        const clef_parity_flip *f = &r->flips[i];
        printf("  %s/%s: A %s (%.4f) -> B %s (%.4f), TV %.4f\n", f->request, f->question, f->option_a, f->p_a,
               f->option_b, f->p_b, f->tv);
    }
}

int cli_parity(int argc, char **argv) {
    const char *models[2] = {NULL, NULL}, *requests = NULL, *m = NULL, *quant[2] = {NULL, NULL};
    clef_numerics numerics[2] = {CLEF_NUMERICS_ENV, CLEF_NUMERICS_ENV}, both = CLEF_NUMERICS_ENV;
    parity_common c = {.seed = 1};
    size_t n_models = 0;
    int as_json = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = arg_str(argc, argv, &i, "--model", &m)) > 0) {
            if (n_models == 2) {
                fprintf(stderr, "clef parity: give exactly two --model\n");
                return 2;
            }
            models[n_models++] = m;
        } else if (r < 0) {
            return 2;
        } else if ((r = arg_str(argc, argv, &i, "--requests", &requests)) ||
                   (r = arg_str(argc, argv, &i, "--synthetic", &c.synthetic)) ||
                   (r = arg_str(argc, argv, &i, "--quant-a", &quant[0])) ||
                   (r = arg_str(argc, argv, &i, "--quant-b", &quant[1])) ||
                   (r = arg_numerics(argc, argv, &i, "--numerics-a", &numerics[0])) ||
                   (r = arg_numerics(argc, argv, &i, "--numerics-b", &numerics[1])) ||
                   (r = arg_numerics(argc, argv, &i, "--numerics", &both)) ||
                   (r = arg_str(argc, argv, &i, "--tokenizer", &c.tokenizer)) ||
                   (r = arg_str(argc, argv, &i, "--device", &c.device)) ||
                   (r = arg_size(argc, argv, &i, "--seed", &c.seed)) ||
                   (r = arg_size(argc, argv, &i, "--max-length", &c.max_length)) ||
                   (r = arg_size(argc, argv, &i, "--threads", &c.threads)) ||
                   (r = arg_bytes(argc, argv, &i, "--gpu-memory", &c.gpu_memory))) {
            if (r < 0) return 2;
        } else if (!strcmp(argv[i], "--json")) {
            as_json = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            parity_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "clef parity: unknown argument %s\n", argv[i]);
            parity_usage(stderr);
            return 2;
        }
    }
    if (cli_check_placement("clef parity", c.device, c.gpu_memory, CLEF_TOWERS_DEFAULT,
                            c.max_length ? c.max_length : CLEF_DEFAULT_MAX_LENGTH, "--max-length"))
        return 2;
    int synth = c.synthetic != NULL;
    if (synth && !c.tokenizer && !(c.tokenizer = cli_default_tokenizer("clef parity"))) return 2;
    if (!requests || (synth ? n_models != 0 : n_models != 2 || quant[0] || quant[1])) {
        if (synth && n_models) fprintf(stderr, "clef parity: give two --model or --synthetic P, not both\n");
        else if (!synth && (quant[0] || quant[1])) fprintf(stderr, "clef parity: --quant-a/--quant-b need --synthetic P\n");
        parity_usage(stderr);
        return 2;
    }
    for (int k = 0; k < 2; k++)
        if (numerics[k] == CLEF_NUMERICS_ENV) numerics[k] = both;
    /* B: one side, or one per format of a --quant-b list */
    char bq[256] = "";
    const char *bquants[8] = {quant[1]};
    size_t n_b = 1;
    if (quant[1] && strchr(quant[1], ',')) {
        snprintf(bq, sizeof bq, "%s", quant[1]);
        n_b = 0;
        for (char *save = NULL, *tok = strtok_r(bq, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (n_b == sizeof bquants / sizeof *bquants) {
                fprintf(stderr, "clef parity: --quant-b lists at most 8 formats\n");
                return 2;
            }
            bquants[n_b++] = tok;
        }
    }
    /* check every format before A spends minutes answering */
    for (size_t k = 0; k <= n_b; k++) {
        const char *q = k == n_b ? quant[0] : bquants[k];
        clef_quant_format f;
        if (q && strcmp(q, "bf16") && clef_quant_format_parse(q, &f) != 0) {
            fprintf(stderr, "clef parity: unknown format '%s' (bf16, int4, fp8-block, nvfp4, nvfp4-modelopt)\n", q);
            return 2;
        }
    }
    parity_side a = {.dir = models[0], .quant = quant[0] && strcmp(quant[0], "bf16") ? quant[0] : NULL,
                     .numerics = numerics[0]};
    if (synth)
        snprintf(a.label, sizeof a.label, "synthetic:%s:%s seed %zu", c.synthetic, quant[0] ? quant[0] : "bf16",
                 c.seed);
    else
        snprintf(a.label, sizeof a.label, "%s", models[0]);
    if (numerics[0])
        snprintf(a.label + strlen(a.label), sizeof a.label - strlen(a.label), " (%s)", clef_numerics_name(numerics[0]));
    size_t len = 0;
    char *text = read_all(requests, &len);
    if (!text) return 2;
    size_t nonblank = 0;
    while (nonblank < len && strchr(" \t\r\n", text[nonblank]) && text[nonblank]) nonblank++;
    if (nonblank == len) { /* 0/0 questions would report 100% agreement */
        fprintf(stderr, "clef parity: %s holds no requests (a JSON object per line)\n", requests);
        free(text);
        return 2;
    }
    clef_parity_answers ans_a;
    memset(&ans_a, 0, sizeof ans_a);
    int rc = answer_all(&a, &c, text, len, &ans_a);
    for (size_t k = 0; rc == 0 && k < n_b; k++) {
        parity_side b = {.dir = models[1], .quant = bquants[k] && strcmp(bquants[k], "bf16") ? bquants[k] : NULL,
                         .numerics = numerics[1]};
        if (synth)
            snprintf(b.label, sizeof b.label, "synthetic:%s:%s seed %zu", c.synthetic,
                     bquants[k] ? bquants[k] : "bf16", c.seed);
        else
            snprintf(b.label, sizeof b.label, "%s", models[1]);
        if (numerics[1])
            snprintf(b.label + strlen(b.label), sizeof b.label - strlen(b.label), " (%s)",
                     clef_numerics_name(numerics[1]));
        clef_parity_answers ans_b;
        memset(&ans_b, 0, sizeof ans_b);
        rc = answer_all(&b, &c, text, len, &ans_b);
        clef_parity_report rep;
        clef_err err;
        clef_err_clear(&err);
        if (rc != 0) {
            memset(&rep, 0, sizeof rep);
        } else if (clef_parity_compare(&ans_a, &ans_b, &rep, &err) != 0) {
            fprintf(stderr, "clef parity: %s\n", err.message);
            rc = err.status == 400 ? 2 : 1;
        } else if (as_json) {
            clef_buf out = {0};
            clef_parity_render(&rep, &out);
            if (n_b > 1) { /* name the pair: {"a":..,"b":.., <the report's members>} */
                clef_buf named = {0};
                clef_buf_puts(&named, "{\"a\":");
                json_render_string(a.label, strlen(a.label), &named);
                clef_buf_puts(&named, ",\"b\":");
                json_render_string(b.label, strlen(b.label), &named);
                clef_buf_printf(&named, ",%s", out.data + 1);
                printf("%s\n", named.data);
                clef_buf_free(&named);
            } else {
                printf("%s\n", out.data);
            }
            clef_buf_free(&out);
        } else {
            if (k) printf("\n");
            print_report(a.label, b.label, &rep);
        }
        fflush(stdout);
        clef_parity_report_free(&rep);
        clef_parity_answers_free(&ans_b);
    }
    clef_parity_answers_free(&ans_a);
    free(text);
    return rc;
}
