/* clef bench — time prefill + head for a record of a given token count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "util/timer.h"

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: clef bench --model DIR [--tokens N] [--iters N] [--threads N]\n"
            "  Builds a triage-style request whose state is cut so the record is exactly N tokens\n"
            "  (default 300), answers it --iters times (default 5) after one warm-up, and prints\n"
            "  prefill tokens/s and ms per decision (min / median).\n");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int cli_bench(int argc, char **argv) {
    const char *model = NULL;
    size_t tokens = 300, iters = 5, threads = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = arg_str(argc, argv, &i, "--model", &model)) || (r = arg_size(argc, argv, &i, "--tokens", &tokens)) ||
            (r = arg_size(argc, argv, &i, "--iters", &iters)) || (r = arg_size(argc, argv, &i, "--threads", &threads))) {
            if (r < 0) return 2;
        } else {
            bench_usage(strcmp(argv[i], "--help") ? stderr : stdout);
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (!model || iters == 0 || tokens == 0) {
        bench_usage(stderr);
        return 2;
    }
    clef_engine_options opt = {.model_dir = model, .max_length = tokens, .truncate_state = 1, .n_threads = (int)threads};
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e) {
        fprintf(stderr, "clef bench: %s\n", err.message);
        return 1;
    }
    /* A state long enough to be cut to `tokens`: ~1 token per word. */
    clef_buf body = {0};
    clef_buf_puts(&body, "{\"model\":\"bench\",\"state\":\"");
    for (size_t w = 0; w < tokens + 16; w++) clef_buf_printf(&body, "%s word%zu", w % 7 ? "and" : "ticket", w % 97);
    clef_buf_puts(&body,
                  "\",\"questions\":{\"department\":{\"type\":\"choice\",\"instructions\":\"Which team?\","
                  "\"criteria\":{\"billing\":\"Payments\",\"technical\":\"Bugs\"}},"
                  "\"outage\":{\"type\":\"noul\",\"instructions\":\"Is a service down?\"}}}");
    double *ms = calloc(iters, sizeof *ms);
    int rc = 0;
    for (size_t it = 0; it <= iters; it++) {
        clef_buf out = {0};
        double t0 = clef_now();
        if (clef_engine_decide(e, body.data, body.len, NULL, &out, &err) != 0) {
            fprintf(stderr, "clef bench: %s\n", err.message);
            rc = 1;
            clef_buf_free(&out);
            break;
        }
        if (it > 0) ms[it - 1] = (clef_now() - t0) * 1e3;
        clef_buf_free(&out);
    }
    if (rc == 0) {
        qsort(ms, iters, sizeof *ms, cmp_double);
        double med = ms[iters / 2];
        printf("model %s: %zu tokens, %zu iterations (cpu backend, load %.2f s)\n", model, tokens, iters,
               clef_engine_load_seconds(e));
        printf("ms per decision: min %.2f  median %.2f\n", ms[0], med);
        printf("prefill tokens/s: %.0f (median)\n", (double)tokens / (med / 1e3));
    }
    free(ms);
    clef_buf_free(&body);
    clef_engine_close(e);
    return rc;
}
