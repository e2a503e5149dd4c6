/* test_qsynth.c — quantized synthetic models (quant/qsynth.h) on the
 * `tiny` preset, CPU only:
 *   - the in-memory route (`--synthetic tiny --quant F`) holds bitwise the
 *     tensors and config.json that `clef synth` + `clef quantize` write, and
 *     answers bitwise as the written checkpoint does (all four formats);
 *   - `clef quantize --synthetic` writes byte-identical files to the file
 *     route (every file but quant_stats.json), per-expert and stacked;
 *   - `clef parity --synthetic` compares BF16 with its quantized copy, one
 *     model loaded at a time, and agrees with the library's comparison;
 *   - --layout stacked is refused, naming the format and its layouts, for
 *     every format but compressed-tensors NVFP4;
 *   - a W4A4 compressed-tensors config loads and runs as W4A16 (SPEC §10.3
 *     defines no activation quantization), and `clef inspect` says so.
 */
#include "quant_fixture.h"

#include <dirent.h>
#include <sys/wait.h>

#include "engine/engine.h"
#include "engine/parity.h"
#include "io/checkpoint.h"
#include "io/synth.h"
#include "json/json.h"
#include "quant/convert.h"
#include "quant/format.h"
#include "quant/qsynth.h"

#define SEED 7

static const struct {
    const char *name; /* CLI name */
    clef_quant_format f;
} FORMATS[] = {{"int4", CLEF_QF_INT4_AUTOROUND},
               {"fp8-block", CLEF_QF_FP8_BLOCK},
               {"nvfp4", CLEF_QF_NVFP4_CT},
               {"nvfp4-modelopt", CLEF_QF_NVFP4_MODELOPT}};
#define N_FORMATS 4

static char tmp[] = "/tmp/clef_qsynth_XXXXXX";
static char *bf16_dir, *tokenizer, *requests; /* requests: the first 6 lines of requests_200.jsonl */
static size_t requests_len;

/* <tmp>/<name> (heap). */
static char *tpath(const char *name) { return qf_path(tmp, name); }

/* <tmp>/file-<format>: `clef quantize --model bf16` of the written preset. */
static char *file_route(const char *fmt, int stacked) {
    char name[64];
    snprintf(name, sizeof name, "file-%s%s", fmt, stacked ? "-stacked" : "");
    char *out = tpath(name);
    struct stat sb;
    if (stat(out, &sb) == 0) return out;
    clef_quantize_options o = {.model_dir = bf16_dir, .out_dir = out, .stacked = stacked};
    assert_int_equal(clef_quant_format_parse(fmt, &o.format), 0);
    clef_err err;
    clef_err_clear(&err);
    if (clef_quantize_checkpoint(&o, NULL, &err) != 0) fail_msg("quantize %s: %s", fmt, err.message);
    return out;
}

static int setup(void **state) {
    (void)state;
    if (!mkdtemp(tmp)) return -1;
    bf16_dir = tpath("bf16");
    tokenizer = tu_fixture("tiny-clef-omni/tokenizer.json");
    clef_synth_options so = {.preset = "tiny", .seed = SEED, .out_dir = bf16_dir, .tokenizer = tokenizer};
    clef_err err;
    clef_err_clear(&err);
    if (clef_synth_write(&so, &err) != 0) {
        fprintf(stderr, "clef synth: %s\n", err.message);
        return -1;
    }
    char *path = qf_path(CLEF_FIXTURES, "../../bench/parity/requests_200.jsonl");
    size_t len = 0;
    char *all = tu_read_file(path, &len);
    free(path);
    if (!all) return -1;
    size_t lines = 0, end = 0;
    while (end < len && lines < 6)
        if (all[end++] == '\n') lines++;
    requests = all;
    requests_len = end;
    char *rp = tpath("requests6.jsonl");
    FILE *f = fopen(rp, "wb");
    fwrite(requests, 1, requests_len, f);
    fclose(f);
    free(rp);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    qf_remove(tmp);
    free(bf16_dir);
    free(tokenizer);
    free(requests);
    return 0;
}

static clef_engine *open_engine(const char *dir, const char *quant) {
    clef_engine_options o = {.model_dir = dir, .synthetic = dir ? NULL : "tiny", .seed = SEED,
                             .synthetic_quant = quant, .tokenizer = dir ? NULL : tokenizer, .device = "cpu",
                             .n_threads = 2, .truncate_state = 1};
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&o, &err);
    if (!e) fail_msg("engine %s/%s: %s", dir ? dir : "synthetic", quant ? quant : "bf16", err.message);
    return e;
}

/* The responses (debug block on) to every request line, concatenated. */
static void answer_all(clef_engine *e, clef_buf *out) {
    clef_parity_answers a;
    clef_err err;
    clef_err_clear(&err);
    if (clef_parity_collect(e, requests, requests_len, &a, &err) != 0) fail_msg("collect: %s", err.message);
    assert_int_equal(a.n, 6);
    for (size_t i = 0; i < a.n; i++) {
        assert_non_null(a.responses[i]);
        json_render(a.responses[i], out);
        clef_buf_putc(out, '\n');
    }
    clef_parity_answers_free(&a);
}

static void expect_same_file(const char *a_dir, const char *b_dir, const char *name) {
    char *a = qf_path(a_dir, name), *b = qf_path(b_dir, name);
    size_t la = 0, lb = 0;
    char *da = tu_read_file(a, &la), *db = tu_read_file(b, &lb);
    if (!da || !db) fail_msg("cannot read %s or %s", a, b);
    if (la != lb || memcmp(da, db, la)) fail_msg("%s and %s differ (%zu vs %zu bytes)", a, b, la, lb);
    free(da);
    free(db);
    free(a);
    free(b);
}

/* ---- in memory = files ---- */

static void test_memory_equals_files(void **state) {
    (void)state;
    for (int k = 0; k < N_FORMATS; k++) {
        char *dir = file_route(FORMATS[k].name, 0);
        clef_checkpoint fck, mck;
        clef_err err;
        clef_err_clear(&err);
        if (clef_checkpoint_open(dir, &fck, &err) != 0) fail_msg("open %s: %s", dir, err.message);
        if (clef_qsynth_checkpoint("tiny", SEED, FORMATS[k].name, NULL, &mck, &err) != 0)
            fail_msg("qsynth %s: %s", FORMATS[k].name, err.message);
        assert_null(mck.dir);
        assert_int_equal(mck.n_tensors, fck.n_tensors);
        size_t packed = 0;
        for (size_t i = 0; i < fck.n_tensors; i++) {
            const st_tensor *a = fck.catalog[i], *b = mck.catalog[i];
            assert_string_equal(a->name, b->name);
            assert_int_equal(a->dtype, b->dtype);
            assert_int_equal(a->ndim, b->ndim);
            for (int d = 0; d < a->ndim; d++) assert_int_equal(a->shape[d], b->shape[d]);
            assert_int_equal(a->nbytes, b->nbytes);
            if (memcmp(a->data, b->data, a->nbytes)) fail_msg("%s: tensor %s differs", FORMATS[k].name, a->name);
            packed += strstr(a->name, ".mlp.experts.") && a->dtype != CLEF_DT_BF16;
        }
        assert_true(packed >= 3 * 8 * 3 * 2); /* 3 layers x 8 experts x 3 projections, >= 2 packed companions */
        /* the config texts are the written files byte for byte */
        char *cp = qf_path(dir, "config.json");
        size_t clen = 0;
        char *ctext = tu_read_file(cp, &clen);
        assert_int_equal(mck.config_json_len, clen);
        assert_memory_equal(mck.config_json, ctext, clen);
        free(ctext);
        free(cp);
        char *hp = qf_path(dir, "hf_quant_config.json");
        size_t hlen = 0;
        char *htext = FORMATS[k].f == CLEF_QF_NVFP4_MODELOPT ? tu_read_file(hp, &hlen) : NULL;
        if (htext) {
            assert_int_equal(mck.hf_quant_json_len, hlen);
            assert_memory_equal(mck.hf_quant_json, htext, hlen);
        } else {
            assert_null(mck.hf_quant_json);
        }
        free(htext);
        free(hp);
        clef_quant_config qa, qb;
        assert_int_equal(clef_quant_detect(&fck, &qa, &err), 0);
        assert_int_equal(clef_quant_detect(&mck, &qb, &err), 0);
        assert_int_equal(qa.format, FORMATS[k].f);
        assert_int_equal(qb.format, FORMATS[k].f);
        clef_quant_config_free(&qa);
        clef_quant_config_free(&qb);
        assert_int_equal(mck.config.text.num_hidden_layers, fck.config.text.num_hidden_layers);
        clef_checkpoint_close(&fck);
        clef_checkpoint_close(&mck);
        free(dir);
    }
}

static void test_memory_answers_equal_files(void **state) {
    (void)state;
    clef_buf bf = {0};
    clef_engine *b = open_engine(NULL, NULL);
    answer_all(b, &bf);
    clef_engine_close(b);
    for (int k = 0; k < N_FORMATS; k++) { /* tensors are compared for all four above; answers for two */
        if (FORMATS[k].f != CLEF_QF_INT4_AUTOROUND && FORMATS[k].f != CLEF_QF_NVFP4_MODELOPT) continue;
        char *dir = file_route(FORMATS[k].name, 0);
        clef_buf fa = {0}, ma = {0};
        clef_engine *f = open_engine(dir, NULL), *m = open_engine(NULL, FORMATS[k].name);
        answer_all(f, &fa);
        answer_all(m, &ma);
        clef_engine_close(f);
        clef_engine_close(m);
        assert_int_equal(fa.len, ma.len);
        if (memcmp(fa.data, ma.data, fa.len)) fail_msg("%s: memory and file answers differ", FORMATS[k].name);
        if (fa.len == bf.len && !memcmp(fa.data, bf.data, bf.len))
            fail_msg("%s: answers equal the BF16 model's (nothing was quantized?)", FORMATS[k].name);
        clef_buf_free(&fa);
        clef_buf_free(&ma);
        free(dir);
    }
    clef_buf_free(&bf);
}

/* ---- clef quantize --synthetic ---- */

static void expect_same_dirs(const char *a, const char *b) {
    static const char *const files[] = {"config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors", "joint_head.safetensors",
                                        "joint_head_config.json", "tokenizer.json", NULL};
    for (size_t i = 0; files[i]; i++) expect_same_file(a, b, files[i]);
    /* and nothing else but quant_stats.json (+ hf_quant_config.json, compared when present) */
    for (int side = 0; side < 2; side++) {
        DIR *d = opendir(side ? b : a);
        assert_non_null(d);
        struct dirent *de;
        while ((de = readdir(d))) {
            const char *n = de->d_name;
            int known = n[0] == '.' || !strcmp(n, "quant_stats.json");
            for (size_t i = 0; files[i] && !known; i++) known = !strcmp(n, files[i]);
            if (!known && !strcmp(n, "hf_quant_config.json")) {
                expect_same_file(a, b, n);
                known = 1;
            }
            if (!known) fail_msg("unexpected file %s in %s", n, side ? b : a);
        }
        closedir(d);
    }
}

static void test_quantize_synthetic_files(void **state) {
    (void)state;
    for (int k = 0; k < N_FORMATS + 1; k++) {
        int stacked = k == N_FORMATS; /* last: compressed-tensors NVFP4, stacked */
        const char *fmt = stacked ? "nvfp4" : FORMATS[k].name;
        char *dir = file_route(fmt, stacked);
        char name[64];
        snprintf(name, sizeof name, "syn-%s%s", fmt, stacked ? "-stacked" : "");
        char *out = tpath(name);
        clef_quantize_options o = {.synthetic = "tiny", .seed = SEED, .tokenizer = tokenizer, .out_dir = out,
                                   .stacked = stacked};
        assert_int_equal(clef_quant_format_parse(fmt, &o.format), 0);
        clef_quantize_report rep;
        clef_err err;
        clef_err_clear(&err);
        if (clef_quantize_checkpoint(&o, &rep, &err) != 0) fail_msg("quantize --synthetic %s: %s", fmt, err.message);
        assert_int_equal(rep.quantized, 3 * 8 * 3);
        assert_true(rep.peak_rss_bytes > 0);
        assert_true(rep.bytes_out < rep.bytes_in);
        expect_same_dirs(dir, out);
        if (stacked) { /* loads as stacked */
            clef_checkpoint ck;
            assert_int_equal(clef_checkpoint_open(out, &ck, &err), 0);
            clef_quant_config qc;
            assert_int_equal(clef_quant_detect(&ck, &qc, &err), 0);
            assert_int_equal(qc.stacked, 1);
            clef_quant_config_free(&qc);
            clef_checkpoint_close(&ck);
        }
        free(out);
        free(dir);
    }
    /* the CLI: same files, peak RSS reported */
    char *out = tpath("cli-int4"), *dir = file_route("int4", 0);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s quantize --synthetic tiny --seed %d --format int4 --tokenizer %s --out %s --quiet",
             CLEF_BINARY, SEED, tokenizer, out);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[512];
    int saw_rss = 0;
    while (fgets(line, sizeof line, p)) saw_rss |= strstr(line, "peak RSS (VmHWM)") != NULL;
    assert_int_equal(pclose(p), 0);
    assert_true(saw_rss);
    expect_same_dirs(dir, out);
    free(out);
    free(dir);
}

/* ---- parity of two synthetic models ---- */

static void test_parity_synthetic(void **state) {
    (void)state;
    clef_parity_answers a, b, a2;
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = open_engine(NULL, NULL);
    assert_int_equal(clef_parity_collect(e, requests, requests_len, &a, &err), 0);
    assert_int_equal(clef_parity_collect(e, requests, requests_len, &a2, &err), 0);
    clef_engine_close(e);
    e = open_engine(NULL, "int4");
    assert_int_equal(clef_parity_collect(e, requests, requests_len, &b, &err), 0);
    clef_engine_close(e);
    clef_parity_report same, diff;
    assert_int_equal(clef_parity_compare(&a, &a2, &same, &err), 0);
    assert_int_equal(same.agree, same.questions);
    assert_true(same.max_tv == 0.0);
    assert_int_equal(clef_parity_compare(&a, &b, &diff, &err), 0);
    assert_int_equal(diff.requests, 6);
    assert_int_equal(diff.questions, same.questions);
    assert_true(diff.questions >= 6);
    assert_true(diff.mean_tv > 0.0 && diff.mean_tv < 0.3); /* tiny INT4 (group = width): visibly close */
    /* the CLI loads A, answers, frees it, then B: same figures */
    char *rp = tpath("requests6.jsonl");
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s parity --synthetic tiny --seed %d --quant-b int4 --device cpu --threads 2 --tokenizer %s "
             "--requests %s --json 2>/dev/null",
             CLEF_BINARY, SEED, tokenizer, rp);
    clef_buf out = {0};
    assert_int_equal(tu_run_cmd(cmd, &out), 0);
    json_value *r = json_parse(out.data, out.len, &err);
    if (!r) fail_msg("clef parity --json printed: %.*s", (int)out.len, out.data ? out.data : "");
    assert_int_equal(atoll(json_get(r, "requests")->str), 6);
    assert_int_equal(atoll(json_get(r, "questions")->str), (long long)diff.questions);
    assert_int_equal(atoll(json_get(r, "agree")->str), (long long)diff.agree);
    assert_float_equal(json_get(r, "mean_tv")->num, diff.mean_tv, 1e-12);
    json_free(r);
    clef_buf_free(&out);
    /* a --quant-b list: A answers once, one JSON line per B naming the pair */
    snprintf(cmd, sizeof cmd,
             "%s parity --synthetic tiny --seed %d --quant-b int4,bf16 --device cpu --threads 2 --tokenizer %s "
             "--requests %s --json 2>/dev/null",
             CLEF_BINARY, SEED, tokenizer, rp);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[1 << 16];
    int n_lines = 0;
    while (fgets(line, sizeof line, p)) {
        r = json_parse(line, strlen(line), &err);
        if (!r) fail_msg("line %d: %s", n_lines, line);
        assert_string_equal(json_get(r, "a")->str, "synthetic:tiny:bf16 seed 7");
        assert_string_equal(json_get(r, "b")->str, n_lines ? "synthetic:tiny:bf16 seed 7" : "synthetic:tiny:int4 seed 7");
        double tv = json_get(r, "mean_tv")->num;
        if (n_lines) assert_true(tv == 0.0);
        else assert_float_equal(tv, diff.mean_tv, 1e-12);
        json_free(r);
        n_lines++;
    }
    assert_int_equal(pclose(p), 0);
    assert_int_equal(n_lines, 2);
    free(rp);
    clef_parity_report_free(&same);
    clef_parity_report_free(&diff);
    clef_parity_answers_free(&a);
    clef_parity_answers_free(&a2);
    clef_parity_answers_free(&b);
}

/* ---- stacked layout ---- */

static void test_stacked_refusal(void **state) {
    (void)state;
    char *out = tpath("refused");
    for (int k = 0; k < N_FORMATS; k++) {
        if (FORMATS[k].f == CLEF_QF_NVFP4_CT) continue; /* written above */
        clef_quantize_options o = {.synthetic = "tiny", .seed = SEED, .tokenizer = tokenizer, .out_dir = out,
                                   .format = FORMATS[k].f, .stacked = 1};
        clef_err err;
        clef_err_clear(&err);
        assert_int_equal(clef_quantize_checkpoint(&o, NULL, &err), -1);
        char want[128];
        snprintf(want, sizeof want, "--layout stacked is not defined for %s", clef_quant_format_name(FORMATS[k].f));
        if (!strstr(err.message, want) || !strstr(err.message, "supports --layout per-expert only") ||
            !strstr(err.message, "compressed-tensors NVFP4 only"))
            fail_msg("message: %s", err.message);
        o.synthetic = NULL;
        o.model_dir = bf16_dir; /* the file route says the same */
        assert_int_equal(clef_quantize_checkpoint(&o, NULL, &err), -1);
        assert_non_null(strstr(err.message, want));
    }
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s quantize --synthetic tiny --format fp8-block --layout stacked --out %s 2>&1",
             CLEF_BINARY, out);
    clef_buf b = {0};
    assert_int_equal(tu_run_cmd(cmd, &b), 2); /* a usage error, refused before anything is drawn */
    if (!strstr(b.data, "clef quantize: --layout stacked is defined for --format nvfp4 only") ||
        !strstr(b.data, "fp8-block supports --layout per-expert") || strstr(b.data, "quantize: quantize:"))
        fail_msg("CLI said: %s", b.data);
    clef_buf_free(&b);
    free(out);
}

/* ---- W4A4 ---- */

/* <tmp>/w4a4: the NVFP4 (compressed-tensors) checkpoint with a W4A4 config
 * (input_activations: 4-bit float, dynamic "local") and an
 * input_global_scale per quantized module, as llm-compressor writes it.
 * With `scales` 0 the tensors are left out (an inconsistent checkpoint). */
static char *make_w4a4(const char *name, int scales) {
    char *src = file_route("nvfp4", 0), *dst = tpath(name);
    assert_int_equal(mkdir(dst, 0755), 0);
    static const char *const same[] = {"model-00001-of-00002.safetensors", "joint_head.safetensors",
                                       "joint_head_config.json", "tokenizer.json", NULL};
    for (size_t i = 0; same[i]; i++) qf_link(src, dst, same[i]);
    /* config: input_activations */
    char *cp = qf_path(src, "config.json");
    size_t len = 0;
    char *text = tu_read_file(cp, &len);
    const char *null_act = "\"input_activations\": null";
    char *at = strstr(text, null_act);
    assert_non_null(at);
    clef_buf c = {0};
    clef_buf_append(&c, text, (size_t)(at - text));
    clef_buf_puts(&c, "\"input_activations\": {\"dynamic\": \"local\", \"group_size\": 16, \"num_bits\": 4, "
                      "\"strategy\": \"tensor_group\", \"symmetric\": true, \"type\": \"float\"}");
    clef_buf_puts(&c, at + strlen(null_act));
    char *dp = qf_path(dst, "config.json");
    FILE *f = fopen(dp, "wb");
    fwrite(c.data, 1, c.len, f);
    fclose(f);
    free(dp);
    clef_buf_free(&c);
    free(text);
    free(cp);
    /* shard 2 (the experts) + one input_global_scale per module; the index lists them */
    char *sp = qf_path(src, "model-00002-of-00002.safetensors");
    st_file sf;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(st_open(sp, &sf, &err), 0);
    st_wtensor *decl = calloc(2 * sf.n, sizeof *decl);
    const void **datas = calloc(2 * sf.n, sizeof *datas);
    char **names = calloc(sf.n, sizeof *names);
    size_t n = 0, extra = 0;
    static const float input_global = 448.0f * 6.0f / 20.0f; /* an activation amax of 20 */
    char *ip = qf_path(src, "model.safetensors.index.json");
    text = tu_read_file(ip, &len);
    json_value *index = json_parse(text, len, &err);
    free(text);
    free(ip);
    json_value *wm = (json_value *)json_get(index, "weight_map");
    for (size_t i = 0; i < sf.n; i++) {
        const st_tensor *t = &sf.tensors[i];
        decl[n] = (st_wtensor){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
        memcpy(decl[n].shape, t->shape, sizeof t->shape);
        datas[n++] = t->data;
        size_t nl = strlen(t->name), sl = strlen(".weight_packed");
        if (scales && nl > sl && !strcmp(t->name + nl - sl, ".weight_packed")) {
            names[extra] = malloc(nl + 32);
            snprintf(names[extra], nl + 32, "%.*s.input_global_scale", (int)(nl - sl), t->name);
            decl[n] = (st_wtensor){.name = names[extra], .dtype = CLEF_DT_F32, .ndim = 1, .shape = {1}};
            datas[n++] = &input_global;
            json_object_set(wm, names[extra], strlen(names[extra]),
                            json_new_string("model-00002-of-00002.safetensors", 32));
            extra++;
        }
    }
    char *dsp = qf_path(dst, "model-00002-of-00002.safetensors");
    static const char *const meta[] = {"format", "pt", NULL};
    assert_int_equal(st_save(dsp, decl, datas, n, meta, &err), 0);
    clef_buf ib = {0};
    json_render(index, &ib);
    char *dip = qf_path(dst, "model.safetensors.index.json");
    f = fopen(dip, "wb");
    fwrite(ib.data, 1, ib.len, f);
    fclose(f);
    clef_buf_free(&ib);
    json_free(index);
    for (size_t i = 0; i < extra; i++) free(names[i]);
    if (scales) assert_int_equal(extra, 3 * 8 * 3);
    free(names);
    free(decl);
    free(datas);
    free(dip);
    free(dsp);
    free(sp);
    st_close(&sf);
    free(src);
    return dst;
}

static void test_w4a4_runs_as_w4a16(void **state) {
    (void)state;
    char *w4a4 = make_w4a4("w4a4", 1), *w4a16 = file_route("nvfp4", 0);
    clef_checkpoint ck;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_checkpoint_open(w4a4, &ck, &err), 0);
    clef_quant_config qc;
    if (clef_quant_detect(&ck, &qc, &err) != 0) fail_msg("detect: %s", err.message);
    assert_int_equal(qc.format, CLEF_QF_NVFP4_CT);
    assert_int_equal(qc.w4a4, 1);
    clef_quant_config_free(&qc);
    clef_checkpoint_close(&ck);
    /* the documented choice: activations stay unquantized, so the answers are the W4A16 model's */
    clef_buf a = {0}, b = {0};
    clef_engine *e = open_engine(w4a4, NULL);
    answer_all(e, &a);
    clef_engine_close(e);
    e = open_engine(w4a16, NULL);
    answer_all(e, &b);
    clef_engine_close(e);
    assert_int_equal(a.len, b.len);
    assert_memory_equal(a.data, b.data, a.len);
    clef_buf_free(&a);
    clef_buf_free(&b);
    /* clef inspect says so */
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s inspect --model %s 2>&1", CLEF_BINARY, w4a4);
    clef_buf o = {0};
    assert_int_equal(tu_run_cmd(cmd, &o), 0);
    if (!strstr(o.data, "W4A4 config: activations are not quantized (run as W4A16")) fail_msg("inspect: %s", o.data);
    clef_buf_free(&o);
    /* a W4A4 config without the input_global_scale tensors is inconsistent */
    char *bad = make_w4a4("w4a4-missing", 0);
    assert_int_equal(clef_checkpoint_open(bad, &ck, &err), 0);
    assert_int_equal(clef_quant_detect(&ck, &qc, &err), -1);
    if (!strstr(err.message, "input_global_scale' is missing")) fail_msg("message: %s", err.message);
    clef_quant_config_free(&qc);
    clef_checkpoint_close(&ck);
    free(bad);
    free(w4a4);
    free(w4a16);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_equals_files),    cmocka_unit_test(test_memory_answers_equal_files),
        cmocka_unit_test(test_quantize_synthetic_files), cmocka_unit_test(test_parity_synthetic),
        cmocka_unit_test(test_stacked_refusal),        cmocka_unit_test(test_w4a4_runs_as_w4a16),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
