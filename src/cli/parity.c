/* clef parity — compare two models' answers on a file of requests
 * (src/engine/parity.h computes the metric; this file is flags and output). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "engine/parity.h"

static void parity_usage(FILE *f) {
    fprintf(f,
            "usage: clef parity --model A --model B --requests FILE.jsonl [--max-length N] [--threads N] [--json]\n"
            "  Answers every request of FILE (one SystemOne request per line, or an object with \"request\",\n"
            "  optional \"name\" and \"max_length\", as in goldens.jsonl) with both models and reports, over all\n"
            "  questions: top-1 agreement, mean and max total-variation distance between the per-option\n"
            "  distributions (unrounded, from the logits), and the questions whose top-1 option flipped.\n"
            "  --json prints the report as one JSON object.  Exit status 1 if a model cannot be loaded.\n");
}

static clef_engine *open_model(const char *dir, size_t max_length, size_t threads) {
    clef_engine_options opt = {.model_dir = dir, .max_length = max_length, .truncate_state = 1,
                               .n_threads = (int)threads};
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e) fprintf(stderr, "clef parity: cannot load %s: %s\n", dir, err.message);
    return e;
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
    const char *models[2] = {NULL, NULL}, *requests = NULL, *m = NULL;
    size_t max_length = 0, threads = 0, n_models = 0;
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
                   (r = arg_size(argc, argv, &i, "--max-length", &max_length)) ||
                   (r = arg_size(argc, argv, &i, "--threads", &threads))) {
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
    if (n_models != 2 || !requests) {
        parity_usage(stderr);
        return 2;
    }
    size_t len = 0;
    char *text = read_all(requests, &len);
    if (!text) return 2;
    clef_engine *a = open_model(models[0], max_length, threads);
    clef_engine *b = a ? open_model(models[1], max_length, threads) : NULL;
    int rc = 1;
    if (a && b) {
        clef_parity_report rep;
        clef_err err;
        clef_err_clear(&err);
        if (clef_parity_run(a, b, text, len, &rep, &err) != 0) {
            fprintf(stderr, "clef parity: %s\n", err.message);
            rc = err.status == 400 ? 2 : 1;
        } else {
            if (as_json) {
                clef_buf out = {0};
                clef_parity_render(&rep, &out);
                printf("%s\n", out.data);
                clef_buf_free(&out);
            } else {
                print_report(models[0], models[1], &rep);
            }
            rc = 0;
        }
        clef_parity_report_free(&rep);
    }
    clef_engine_close(a);
    clef_engine_close(b);
    free(text);
    return rc;
}
