/* clef devcheck — a device backend against the CPU reference, end to end:
 * parity of the answers (top-1 agreement, total-variation distance, as
 * `clef parity`) over a file of requests, and batch invariance on the
 * device (every record's logits bitwise equal whether it runs alone or
 * packed into batches of the given sizes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "engine/parity.h"
#include "model/model.h"
#include "util/timer.h"

static void devcheck_usage(FILE *f) {
    fprintf(f,
            "usage: clef devcheck (--model DIR | --synthetic tiny|small|full [--seed N] [--quant F] [--tokenizer F])\n"
            "                     --requests FILE.jsonl [--device cuda[:N]] [--batches 1,8,64] [--threads N]\n"
            "                     [--min-agreement F] [--max-mean-tv F]\n"
            "                     [--reference ANSWERS.jsonl | --save-reference ANSWERS.jsonl]\n"
            "                     [--numerics fast|balanced|precise]\n"
            "  Answers every request with the CPU backend (f32 reference) and with --device (default cuda),\n"
            "  reports top-1 agreement and mean/max total-variation distance over all questions, then\n"
            "  runs the first max(--batches) answerable requests on the device alone and packed into\n"
            "  batches of each size and checks every record's logits are bitwise identical.\n"
            "  Exit status 0 when agreement >= --min-agreement, mean TV <= --max-mean-tv and every\n"
            "  batch size is bitwise identical; 1 otherwise.  The bar defaults to the device's numerics:\n"
            "  precise 0.995 / 0.001 (f32-level agreement); fast and balanced 0.871 / 0.0159 (the\n"
            "  reference's own bf16 deployment against f32 on bench/parity/requests_200.jsonl).\n"
            "  --save-reference F  only answer the requests on the CPU and save the answers to F\n"
            "  --reference F       use answers saved by --save-reference instead of running the CPU\n"
            "  --quant F           with --synthetic: experts quantized in memory to F (int4, fp8-block,\n"
            "                      nvfp4, nvfp4-modelopt) for both backends\n"
            "  --cpu-batch N       CPU records packed per forward (default 16; bitwise the answers alone)\n"
            "                      (same weights and requests; the CPU side is slow on big presets)\n"
            "  --numerics M        GPU numerics: fast (default), balanced or precise (src/backend/numerics.h);\n"
            "                      wins over CLEF_CUDA_NUMERICS / CLEF_CUDA_PRECISE\n");
}

typedef struct dc_args {
    const char *model, *synthetic, *tokenizer, *requests, *device, *batches, *reference, *save_reference;
    const char *quant;    /* --quant: synthetic experts quantized in memory, or NULL */
    clef_numerics numerics; /* the device's numerics; CLEF_NUMERICS_ENV = the environment, else fast */
    size_t seed, threads, cpu_batch;
    double min_agree, max_tv;
} dc_args;

static clef_engine *open_engine(const dc_args *a, const char *device) {
    clef_engine_options opt = {.model_dir = a->model, .synthetic = a->synthetic, .seed = a->seed,
                               .synthetic_quant = a->quant, .tokenizer = a->tokenizer, .device = device, .truncate_state = 1,
                               .n_threads = (int)a->threads, .numerics = a->numerics, .verbose = 1};
    clef_err err;
    clef_err_clear(&err);
    double t0 = clef_now();
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e)
        fprintf(stderr, "clef devcheck: cannot open the %s engine: %s\n", device, err.message);
    else
        printf("engine %s loaded in %.1f s\n", device, clef_now() - t0);
    return e;
}

/* Records of the first `n` requests of the file that the engine accepts. */
static size_t load_jobs(clef_engine *e, const char *text, size_t len, size_t n, clef_job *jobs) {
    size_t got = 0;
    const char *p = text, *end = text + len;
    while (p < end && got < n) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t ll = nl ? (size_t)(nl - p) : (size_t)(end - p);
        json_value *line = ll ? json_parse(p, ll, NULL) : NULL;
        p += ll + 1;
        if (!line) continue;
        const json_value *r = json_get(line, "request");
        if (!r) r = line;
        clef_buf body = {0};
        json_render(r, &body);
        clef_err err;
        clef_err_clear(&err);
        clef_request req;
        if (clef_engine_parse(e, body.data, body.len, &req, &err) == 0 &&
            clef_engine_encode(e, &req, NULL, &jobs[got], &err) == 0)
            got++;
        clef_buf_free(&body);
        json_free(line);
    }
    return got;
}

/* Logits of every job after running them in batches of `bs`; returns 0 or 1. */
static int run_batched(clef_engine *e, clef_job *jobs, size_t n, size_t bs, double *ms) {
    clef_job **ptrs = calloc(bs, sizeof *ptrs);
    clef_err *errs = calloc(bs, sizeof *errs);
    int rc = 0;
    double t0 = clef_now();
    for (size_t i = 0; i < n && rc == 0; i += bs) {
        size_t m = n - i < bs ? n - i : bs;
        for (size_t j = 0; j < m; j++) ptrs[j] = &jobs[i + j];
        if (clef_engine_run(e, ptrs, m, errs) != 0) {
            for (size_t j = 0; j < m; j++)
                if (errs[j].status) fprintf(stderr, "clef devcheck: record %zu: %s\n", i + j, errs[j].message);
            rc = 1;
        }
    }
    *ms = (clef_now() - t0) * 1e3;
    free(ptrs);
    free(errs);
    return rc;
}

/* Batch invariance: returns the number of records whose logits differ from
 * their batch-of-1 logits at any size, or -1 on a run failure. */
static long batch_invariance(clef_engine *e, const char *text, size_t len, const char *sizes) {
    size_t bs[16], nb = 0, nmax = 1;
    for (const char *s = sizes; *s && nb < 16;) {
        char *end;
        unsigned long v = strtoul(s, &end, 10);
        if (end == s || v == 0) break;
        bs[nb++] = v;
        if (v > nmax) nmax = v;
        s = *end == ',' ? end + 1 : end;
    }
    clef_job *jobs = calloc(nmax, sizeof *jobs);
    size_t n = load_jobs(e, text, len, nmax, jobs);
    long bad = 0;
    float **ref = calloc(n, sizeof *ref);
    size_t tokens = 0;
    for (size_t i = 0; i < n; i++) tokens += jobs[i].rec.n_ids;
    double ms;
    if (run_batched(e, jobs, n, 1, &ms) != 0) bad = -1;
    for (size_t i = 0; i < n && bad == 0; i++) {
        size_t no = clef_record_total_options(&jobs[i].rec);
        ref[i] = malloc((no + 1) * sizeof **ref);
        memcpy(ref[i], jobs[i].logits, no * sizeof **ref);
    }
    printf("batch invariance: %zu records, %zu tokens; batch 1: %.1f ms\n", n, tokens, ms);
    for (size_t b = 0; b < nb && bad >= 0; b++) {
        if (bs[b] == 1) continue;
        for (size_t i = 0; i < n; i++) memset(jobs[i].logits, 0xff, clef_record_total_options(&jobs[i].rec) * 4);
        if (run_batched(e, jobs, n, bs[b], &ms) != 0) {
            bad = -1;
            break;
        }
        long diff = 0;
        for (size_t i = 0; i < n; i++)
            diff += memcmp(ref[i], jobs[i].logits, clef_record_total_options(&jobs[i].rec) * 4) != 0;
        printf("batch invariance: batches of %zu: %ld of %zu records differ from alone (%.1f ms)\n", bs[b], diff, n,
               ms);
        bad += diff;
    }
    for (size_t i = 0; i < n; i++) {
        free(ref[i]);
        clef_job_free(&jobs[i]);
    }
    free(ref);
    free(jobs);
    return bad;
}

/* One saved answer line: {"name", "status", "response"} (response with its
 * debug block, or null). */
static void write_answer(FILE *f, const clef_parity_answers *pa, size_t i) {
    clef_buf line = {0};
    clef_buf_puts(&line, "{\"name\":");
    json_render_string(pa->names[i], strlen(pa->names[i]), &line);
    clef_buf_printf(&line, ",\"status\":%d,\"response\":", pa->status[i]);
    if (pa->responses[i])
        json_render(pa->responses[i], &line);
    else
        clef_buf_puts(&line, "null");
    fprintf(f, "%s}\n", line.data);
    clef_buf_free(&line);
}

/* The engine's answers to every line of the file, as clef_parity_collect
 * gives them, but with the accepted records packed `batch` at a time into
 * one forward (the CPU backend's results do not depend on the packing, and
 * a packed forward converts each expert's weights once for all its tokens:
 * several times faster on the CPU).  With `save`, answers are written there
 * in file order as soon as they are known (a run cut short keeps a usable
 * prefix).  Returns 1 on success. */
static int collect_packed(clef_engine *e, const char *text, size_t len, size_t batch, clef_parity_answers *out,
                          FILE *save) {
    memset(out, 0, sizeof *out);
    size_t cap = 0, n_jobs = 0;
    clef_job *jobs = NULL;
    size_t *line_of = NULL; /* job -> answer index */
    for (const char *p = text, *end = text + len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t ll = nl ? (size_t)(nl - p) : (size_t)(end - p);
        const char *lp = p;
        p += ll + 1;
        size_t k = 0;
        while (k < ll && (lp[k] == ' ' || lp[k] == '\t' || lp[k] == '\r')) k++;
        if (k == ll) continue;
        json_value *line = json_parse(lp, ll, NULL);
        if (!line) {
            fprintf(stderr, "clef devcheck: line %zu is not JSON\n", out->n + 1);
            free(jobs);
            free(line_of);
            return 0;
        }
        if (out->n == cap) {
            cap = cap ? 2 * cap : 256;
            out->names = clef_xrealloc(out->names, cap * sizeof *out->names);
            out->responses = clef_xrealloc(out->responses, cap * sizeof *out->responses);
            out->status = clef_xrealloc(out->status, cap * sizeof *out->status);
            jobs = clef_xrealloc(jobs, cap * sizeof *jobs);
            line_of = clef_xrealloc(line_of, cap * sizeof *line_of);
        }
        const json_value *nm = json_get(line, "name"), *r = json_get(line, "request");
        char nb[64];
        snprintf(nb, sizeof nb, "line %zu", out->n + 1);
        const char *name = nm && nm->str ? nm->str : nb;
        out->names[out->n] = clef_xstrndup(name, strlen(name));
        out->responses[out->n] = NULL;
        out->status[out->n] = 0;
        clef_buf body = {0};
        json_render(r ? r : line, &body);
        clef_err err;
        clef_err_clear(&err);
        clef_request req;
        clef_decide_params params = {.debug = 1, .truncate_state = -1};
        if (clef_engine_parse(e, body.data, body.len, &req, &err) == 0 &&
            clef_engine_encode(e, &req, &params, &jobs[n_jobs], &err) == 0)
            line_of[n_jobs++] = out->n;
        else
            out->status[out->n] = err.status;
        clef_buf_free(&body);
        json_free(line);
        out->n++;
    }
    clef_job **ptrs = clef_xcalloc(batch, sizeof *ptrs);
    clef_err *errs = clef_xcalloc(batch, sizeof *errs);
    size_t written = 0;
    for (size_t i = 0; i < n_jobs; i += batch) {
        size_t m = n_jobs - i < batch ? n_jobs - i : batch;
        for (size_t j = 0; j < m; j++) ptrs[j] = &jobs[i + j];
        clef_engine_run(e, ptrs, m, errs);
        for (size_t j = 0; j < m; j++) {
            size_t a = line_of[i + j];
            if (errs[j].status) {
                out->status[a] = errs[j].status;
                continue;
            }
            clef_buf rb = {0};
            clef_engine_render(&jobs[i + j], &rb);
            out->responses[a] = json_parse(rb.data, rb.len, NULL);
            clef_buf_free(&rb);
        }
        fprintf(stderr, "clef devcheck: %zu of %zu records answered\n", i + m, n_jobs);
        if (save) { /* every line before the next unanswered record is final */
            size_t upto = i + m < n_jobs ? line_of[i + m] : out->n;
            for (; written < upto; written++) write_answer(save, out, written);
            fflush(save);
        }
    }
    if (save)
        for (; written < out->n; written++) write_answer(save, out, written);
    for (size_t i = 0; i < n_jobs; i++) clef_job_free(&jobs[i]);
    free(jobs);
    free(line_of);
    free(ptrs);
    free(errs);
    return 1;
}

/* Write the answers of `e` to `path`, one line per request (write_answer),
 * as they are computed. */
static int save_reference(clef_engine *e, const char *text, size_t len, size_t batch, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    clef_parity_answers pa = {0};
    double t0 = clef_now();
    int ok = collect_packed(e, text, len, batch, &pa, f);
    int bad = fclose(f) != 0 || !ok;
    if (!bad) printf("saved %zu CPU answers to %s in %.1f s\n", pa.n, path, clef_now() - t0);
    clef_parity_answers_free(&pa);
    return bad;
}

/* Read answers written by save_reference; 1 on success (printed on failure). */
static int load_reference(const char *path, clef_parity_answers *out) {
    size_t len = 0;
    char *text = read_all(path, &len);
    if (!text) return 0;
    memset(out, 0, sizeof *out);
    size_t cap = 0;
    int ok = 1;
    for (const char *p = text, *end = text + len; p < end && ok;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t ll = nl ? (size_t)(nl - p) : (size_t)(end - p);
        json_value *v = ll ? json_parse(p, ll, NULL) : NULL;
        p += ll + 1;
        if (!ll) continue;
        const json_value *name = v ? json_get(v, "name") : NULL, *resp = v ? json_get(v, "response") : NULL;
        int64_t status = 0;
        if (!name || !name->str || !resp || json_as_i64(json_get(v, "status"), &status) != 0) {
            fprintf(stderr, "clef devcheck: %s: a line is not a saved answer\n", path);
            json_free(v);
            ok = 0;
            break;
        }
        if (out->n == cap) {
            cap = cap ? 2 * cap : 256;
            out->names = clef_xrealloc(out->names, cap * sizeof *out->names);
            out->responses = clef_xrealloc(out->responses, cap * sizeof *out->responses);
            out->status = clef_xrealloc(out->status, cap * sizeof *out->status);
        }
        out->names[out->n] = clef_xstrndup(name->str, strlen(name->str));
        clef_buf b = {0};
        json_render(resp, &b);
        out->responses[out->n] = status ? NULL : json_parse(b.data, b.len, NULL);
        clef_buf_free(&b);
        out->status[out->n] = (int)status;
        out->n++;
        json_free(v);
    }
    free(text);
    if (ok) printf("loaded %zu reference answers from %s\n", out->n, path);
    return ok;
}

int cli_devcheck(int argc, char **argv) {
    dc_args a = {.seed = 1, .device = "cuda", .batches = "1,8,64", .min_agree = -1, .max_tv = -1, .cpu_batch = 16};
    for (int i = 1; i < argc; i++) {
        int r;
        const char *num = NULL;
        if ((r = arg_str(argc, argv, &i, "--model", &a.model)) ||
            (r = arg_str(argc, argv, &i, "--synthetic", &a.synthetic)) ||
            (r = arg_str(argc, argv, &i, "--quant", &a.quant)) ||
            (r = arg_str(argc, argv, &i, "--tokenizer", &a.tokenizer)) ||
            (r = arg_str(argc, argv, &i, "--requests", &a.requests)) ||
            (r = arg_str(argc, argv, &i, "--device", &a.device)) ||
            (r = arg_str(argc, argv, &i, "--batches", &a.batches)) ||
            (r = arg_str(argc, argv, &i, "--reference", &a.reference)) ||
            (r = arg_str(argc, argv, &i, "--save-reference", &a.save_reference)) ||
            (r = arg_numerics(argc, argv, &i, "--numerics", &a.numerics)) ||
            (r = arg_size(argc, argv, &i, "--seed", &a.seed)) ||
            (r = arg_size(argc, argv, &i, "--threads", &a.threads)) ||
            (r = arg_size(argc, argv, &i, "--cpu-batch", &a.cpu_batch))) {
            if (r < 0) return 2;
        } else if ((r = arg_str(argc, argv, &i, "--min-agreement", &num)) > 0) {
            a.min_agree = atof(num);
        } else if ((r = arg_str(argc, argv, &i, "--max-mean-tv", &num)) > 0) {
            a.max_tv = atof(num);
        } else {
            int help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            if (!help) fprintf(stderr, "clef devcheck: unknown argument %s\n", argv[i]);
            devcheck_usage(help ? stdout : stderr);
            return help ? 0 : 2;
        }
    }
    if (!a.model == !a.synthetic || !a.requests || (a.quant && !a.synthetic)) {
        devcheck_usage(stderr);
        return 2;
    }
    if (a.synthetic && !a.tokenizer && !(a.tokenizer = cli_default_tokenizer("clef devcheck"))) return 2;
    if (!a.cpu_batch) a.cpu_batch = 1;
    size_t len = 0;
    char *text = read_all(a.requests, &len);
    if (!text) return 2;
    int rc = 1;
    if (a.save_reference) {
        clef_engine *cpu = open_engine(&a, "cpu");
        rc = cpu ? save_reference(cpu, text, len, a.cpu_batch, a.save_reference) : 1;
        clef_engine_close(cpu);
        free(text);
        return rc;
    }
    clef_engine *cpu = a.reference ? NULL : open_engine(&a, "cpu");
    clef_engine *dev = cpu || a.reference ? open_engine(&a, a.device) : NULL;
    if ((cpu || a.reference) && dev) {
        char d[256];
        clef_cuda_describe(clef_model_backend(clef_engine_model(dev)), d, sizeof d);
        printf("device %s: %s\n", a.device, *d ? d : "(not CUDA)");
        /* the bar of the numerics the device runs (an option, else the environment, else fast) */
        const char *num = clef_numerics_of(clef_model_backend(clef_engine_model(dev)));
        double bar_agree, bar_tv;
        clef_numerics_bar(!strcmp(num, "precise") || !strcmp(num, "f32") ? CLEF_NUMERICS_PRECISE : CLEF_NUMERICS_FAST,
                          &bar_agree, &bar_tv);
        if (a.min_agree < 0) a.min_agree = bar_agree;
        if (a.max_tv < 0) a.max_tv = bar_tv;
        printf("numerics %s: bar top-1 >= %.2f%%, mean TV <= %.4f\n", num, 100.0 * a.min_agree, a.max_tv);
        clef_parity_answers pa = {0}, pb = {0};
        clef_parity_report rep = {0};
        clef_err err;
        clef_err_clear(&err);
        double t0 = clef_now();
        int ok = cpu ? collect_packed(cpu, text, len, a.cpu_batch, &pa, NULL) : load_reference(a.reference, &pa);
        double t1 = clef_now();
        ok = ok && clef_parity_collect(dev, text, len, &pb, &err) == 0;
        double t2 = clef_now();
        ok = ok && clef_parity_compare(&pa, &pb, &rep, &err) == 0;
        if (!ok) {
            fprintf(stderr, "clef devcheck: %s\n", err.message);
        } else {
            double agree = rep.questions ? (double)rep.agree / (double)rep.questions : 1.0;
            printf("parity cpu vs %s: %zu requests answered by both (%zu rejected by both, %zu by one only), "
                   "cpu %.1f s, %s %.1f s\n",
                   a.device, rep.requests, rep.rejected, rep.mismatched, t1 - t0, a.device, t2 - t1);
            printf("parity top-1 agreement %zu/%zu = %.4f%% (need >= %.2f%%)\n", rep.agree, rep.questions,
                   100.0 * agree, 100.0 * a.min_agree);
            printf("parity total variation: mean %.6f (need <= %.4f), max %.6f at %s\n", rep.mean_tv, a.max_tv,
                   rep.max_tv, rep.max_tv_where ? rep.max_tv_where : "-");
            for (size_t i = 0; i < rep.n_flips; i++)
                printf("  flip %s/%s: cpu %s (%.4f) -> %s %s (%.4f), TV %.4f\n", rep.flips[i].request,
                       rep.flips[i].question, rep.flips[i].option_a, rep.flips[i].p_a, a.device,
                       rep.flips[i].option_b, rep.flips[i].p_b, rep.flips[i].tv);
            long bad = batch_invariance(dev, text, len, a.batches);
            int pass = agree >= a.min_agree && rep.mean_tv <= a.max_tv && rep.mismatched == 0 && bad == 0;
            printf("devcheck %s\n", pass ? "PASS" : "FAIL");
            rc = pass ? 0 : 1;
        }
        clef_parity_report_free(&rep);
        clef_parity_answers_free(&pa);
        clef_parity_answers_free(&pb);
    }
    clef_engine_close(dev);
    clef_engine_close(cpu);
    free(text);
    return rc;
}
