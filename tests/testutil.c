#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <zlib.h>

#include "backend/cuda/cuda.h"

char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    assert_non_null(p);
    if (fread(p, 1, (size_t)n, f) != (size_t)n) fail_msg("short read on %s", path);
    fclose(f);
    p[n] = '\0';
    if (len) *len = (size_t)n;
    return p;
}

/* Parse JSON-lines `text` (one document per non-empty line) and free it;
 * `path` names the source in failure messages. */
static json_value **parse_jsonl(char *text, size_t len, const char *path, size_t *n) {
    json_value **out = NULL;
    size_t count = 0;
    char *line = text;
    while (line < text + len) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(text + len - line);
        if (ll > 0) {
            clef_err err;
            clef_err_clear(&err);
            json_value *v = json_parse(line, ll, &err);
            if (!v) fail_msg("%s line %zu: %s", path, count + 1, err.message);
            out = realloc(out, (count + 1) * sizeof *out);
            out[count++] = v;
        }
        line += ll + 1;
    }
    free(text);
    *n = count;
    return out;
}

json_value **tu_read_jsonl(const char *path, size_t *n) {
    size_t len;
    char *text = tu_read_file(path, &len);
    return parse_jsonl(text, len, path, n);
}

json_value **tu_read_jsonl_gz(const char *path, size_t *n) {
    gzFile f = gzopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    size_t cap = 1 << 20, len = 0;
    char *text = malloc(cap);
    int got;
    while ((got = gzread(f, text + len, (unsigned)(cap - len - 1))) > 0) {
        len += (size_t)got;
        if (cap - len < 2) text = realloc(text, cap *= 2);
    }
    gzclose(f);
    text[len] = '\0';
    return parse_jsonl(text, len, path, n);
}

json_value **tu_load_goldens(const char *rel, size_t *n) {
    char *path = tu_fixture(rel);
    size_t pl = strlen(path);
    json_value **cases = pl > 3 && strcmp(path + pl - 3, ".gz") == 0 ? tu_read_jsonl_gz(path, n) : tu_read_jsonl(path, n);
    free(path);
    return cases;
}

void tu_free_goldens(json_value **cases, size_t n) {
    for (size_t i = 0; i < n; i++) json_free(cases[i]);
    free(cases);
}

const char *tu_case_name(const json_value *c) { return json_get(c, "name")->str; }

clef_tokenizer *tu_load_tokenizer(void) {
    char *path = tu_fixture("tiny-clef-omni/tokenizer.json");
    clef_err err;
    clef_err_clear(&err);
    clef_tokenizer *tok = clef_tokenizer_load(path, &err);
    free(path);
    if (!tok) fail_msg("tokenizer: %s", err.message);
    return tok;
}

int tu_golden_fixture_setup(void **state) {
    tu_golden_fixture *f = calloc(1, sizeof *f);
    f->tok = tu_load_tokenizer();
    f->cases = tu_load_goldens("goldens/goldens.jsonl", &f->n_cases);
    *state = f;
    return 0;
}

int tu_golden_fixture_teardown(void **state) {
    tu_golden_fixture *f = *state;
    tu_free_goldens(f->cases, f->n_cases);
    clef_tokenizer_free(f->tok);
    free(f);
    return 0;
}

clef_engine *tu_open_engine(const char *dir, int truncate_state, int n_threads) {
    clef_engine_options opt = {.model_dir = dir, .truncate_state = truncate_state, .n_threads = n_threads};
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e) fail_msg("engine %s: %s", dir, err.message);
    return e;
}

const json_value *tu_golden_question(const json_value *c, const char *qid) {
    const json_value *qs = json_get(c, "questions");
    for (size_t i = 0; i < qs->n; i++)
        if (!strcmp(json_get(qs->items[i], "id")->str, qid)) return qs->items[i];
    fail_msg("no golden question '%s'", qid);
    return NULL;
}

void tu_record_from_golden(const json_value *c, clef_record *r) {
    memset(r, 0, sizeof *r);
    const json_value *ids = json_get(c, "input_ids"), *qs = json_get(c, "questions");
    r->n_ids = ids->n;
    r->input_ids = malloc((ids->n + 1) * sizeof *r->input_ids);
    for (size_t i = 0; i < ids->n; i++) r->input_ids[i] = (int32_t)tu_int_at(ids, i);
    r->n_questions = qs->n;
    r->questions = calloc(qs->n, sizeof *r->questions);
    for (size_t i = 0; i < qs->n; i++) {
        const json_value *q = qs->items[i], *qsp = json_get(q, "question_span"), *os = json_get(q, "option_spans");
        clef_record_question *rq = &r->questions[i];
        int64_t type;
        assert_int_equal(json_as_i64(json_get(q, "type"), &type), 0);
        rq->type = (clef_qtype)type;
        rq->question = (clef_span){(int32_t)tu_int_at(qsp, 0), (int32_t)tu_int_at(qsp, 1)};
        rq->n_options = os->n;
        rq->options = calloc(os->n, sizeof *rq->options);
        for (size_t j = 0; j < os->n; j++)
            rq->options[j] = (clef_span){(int32_t)tu_int_at(os->items[j], 0), (int32_t)tu_int_at(os->items[j], 1)};
    }
}

/* The request's media array `key` as clef_media_items (strings borrowed;
 * caller frees the array). */
static clef_media_item *media_items(const json_value *req, const char *key, size_t *n) {
    const json_value *a = json_get(req, key);
    *n = a ? a->n : 0;
    clef_media_item *it = calloc(*n ? *n : 1, sizeof *it);
    for (size_t i = 0; i < *n; i++) it[i] = (clef_media_item){a->items[i]->str, a->items[i]->len};
    return it;
}

void tu_media_from_golden(const json_value *c, clef_media *m, int preprocess) {
    const json_value *req = json_get(c, "request");
    clef_media_source src;
    clef_media_item *im = media_items(req, "images", &src.n_images);
    clef_media_item *au = media_items(req, "audio", &src.n_audio);
    clef_media_item *vi = media_items(req, "videos", &src.n_videos);
    src.images = im, src.audio = au, src.videos = vi;
    clef_err err;
    clef_err_clear(&err);
    if (clef_media_decode(&src, NULL, m, &err)) fail_msg("%s: decode: %s", tu_case_name(c), err.message);
    if (preprocess && clef_media_preprocess(m, &err)) fail_msg("%s: preprocess: %s", tu_case_name(c), err.message);
    free(im);
    free(au);
    free(vi);
}

char *tu_fixture(const char *rel) {
    size_t n = strlen(CLEF_FIXTURES) + strlen(rel) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", CLEF_FIXTURES, rel);
    return p;
}

int tu_open_fixture(const char *rel, clef_checkpoint *ck) {
    clef_err err;
    clef_err_clear(&err);
    char *dir = tu_fixture(rel);
    const int rc = clef_checkpoint_open(dir, ck, &err);
    free(dir);
    if (rc != 0) fprintf(stderr, "checkpoint %s: %s\n", rel, err.message);
    return rc != 0 ? -1 : 0;
}

int64_t tu_int_at(const json_value *arr, size_t i) {
    assert_non_null(arr);
    assert_int_equal(arr->type, JSON_ARRAY);
    assert_true(i < arr->n);
    int64_t x;
    if (json_as_i64(arr->items[i], &x) != 0) fail_msg("element %zu is not an integer", i);
    return x;
}

double tu_num_at(const json_value *arr, size_t i) {
    assert_non_null(arr);
    assert_int_equal(arr->type, JSON_ARRAY);
    assert_true(i < arr->n);
    double x;
    if (json_as_double(arr->items[i], &x) != 0) fail_msg("element %zu is not a number", i);
    return x;
}

void tu_ok(int rc, const clef_err *err) {
    if (rc != 0) fail_msg("op failed: %d %s", err->status, err->message);
}

uint64_t tu_rand_u64(uint64_t *state) {
    uint64_t s = *state;
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return *state = s;
}

float tu_rand_f32(uint64_t *state) {
    return (float)((double)(tu_rand_u64(state) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

float *tu_rand_vec(uint64_t *state, size_t n, float scale) {
    float *v = malloc((n ? n : 1) * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++) v[i] = tu_rand_f32(state) * scale;
    return v;
}

void *tu_dput(clef_backend *g, const void *h, size_t bytes) {
    clef_err err;
    void *d = g->ops->alloc(g, bytes ? bytes : 4);
    assert_non_null(d);
    if (bytes) tu_ok(g->ops->upload(g, d, h, bytes, &err), &err);
    return d;
}

float *tu_dnan(clef_backend *g, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    float *d = tu_dput(g, h, n * sizeof *h);
    free(h);
    return d;
}

float *tu_dget(clef_backend *g, const float *d, size_t n) {
    clef_err err;
    float *h = malloc((n ? n : 1) * sizeof *h);
    assert_non_null(h);
    tu_ok(g->ops->download(g, h, d, n * sizeof *h, &err), &err);
    return h;
}

double tu_rel_l2(const float *got, const float *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return NAN;
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double tu_check_rel(const char *what, int what_w, const char *be, int be_w, const float *got, const float *want,
                    size_t n, double tol) {
    double r = tu_rel_l2(got, want, n);
    if (be)
        printf("  %-*s %-*s rel L2 %.3e  (tol %.0e, %zu values)\n", what_w, what, be_w, be, r, tol, n);
    else
        printf("  %-*s rel L2 %.3e  (tol %.0e, %zu values)\n", what_w, what, r, tol, n);
    if (!(r <= tol)) {
        if (be) fail_msg("%s (%s): relative L2 error %.3e > %.0e", what, be, r, tol);
        fail_msg("%s: relative L2 error %.3e > %.0e", what, r, tol);
    }
    return r;
}

int tu_cuda_devices(void **state) {
    *state = NULL;
    int n = clef_cuda_device_count();
    printf("  CUDA devices: %d\n", n);
    return n;
}

void tu_print_cuda_device(clef_backend *be) {
    char d[256];
    clef_cuda_describe(be, d, sizeof d);
    printf("  device: %s\n", d);
}

clef_backend *tu_cuda_backend_env(const clef_cuda_options *o, const char *const *env, clef_err *err) {
    enum { MAX_VARS = 8 };
    /* kernel switches: this test program's environment, then the list's (cuda_env.h); any other
     * variable (a user setting, which the backend reads itself) is set around its creation */
    clef_cuda_knobs knobs;
    if (clef_cuda_knobs_from_env(&knobs, err)) return NULL;
    char *old[MAX_VARS];
    int set[MAX_VARS], n = 0;
    for (; env[2 * n]; n++) {
        if (n == MAX_VARS) fail_msg("tu_cuda_backend_env: more than %d variables", MAX_VARS);
        old[n] = NULL;
        set[n] = 0;
        if (!env[2 * n + 1]) continue; /* left as the environment has it */
        const int r = clef_cuda_knobs_set(&knobs, env[2 * n], env[2 * n + 1], err);
        if (r < 0) return NULL;
        if (r > 0) continue;
        const char *v = getenv(env[2 * n]);
        old[n] = v ? strdup(v) : NULL;
        set[n] = 1;
        setenv(env[2 * n], env[2 * n + 1], 1);
    }
    clef_cuda_options oo = *o;
    if (!oo.knobs) oo.knobs = &knobs;
    clef_backend *be = clef_cuda_backend_create_ex(&oo, err);
    for (int i = 0; i < n; i++) {
        if (!set[i]) continue;
        if (old[i]) setenv(env[2 * i], old[i], 1);
        else unsetenv(env[2 * i]);
        free(old[i]);
    }
    return be;
}

float *tu_run_record(clef_model *m, const clef_record *r, size_t H, clef_err *err) {
    float *hidden = malloc(r->n_ids * H * sizeof *hidden);
    float *logits = malloc((clef_record_total_options(r) + 1) * sizeof *logits);
    int rc = clef_thinker_forward(m, r->input_ids, r->n_ids, hidden, NULL, err);
    if (rc == 0) rc = clef_head_forward(m, hidden, r, logits, err);
    free(hidden);
    if (rc != 0) {
        free(logits);
        return NULL;
    }
    return logits;
}

int tu_run_cmd(const char *cmd, clef_buf *out) {
    FILE *f = popen(cmd, "r");
    if (!f) fail_msg("cannot run: %s", cmd);
    char chunk[4096];
    size_t n;
    out->len = 0;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) clef_buf_append(out, chunk, n);
    clef_buf_append(out, "", 0); /* data set and terminated even when nothing was printed */
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? -1 - WTERMSIG(st) : -100;
}

int32_t *tu_pack_goldens(json_value *const *cases, const size_t *pick, size_t n, clef_record *r, size_t *seg) {
    seg[0] = 0;
    for (size_t i = 0; i < n; i++) {
        tu_record_from_golden(cases[pick[i]], &r[i]);
        seg[i + 1] = seg[i] + r[i].n_ids;
    }
    int32_t *ids = malloc((seg[n] ? seg[n] : 1) * sizeof *ids);
    for (size_t i = 0; i < n; i++) memcpy(ids + seg[i], r[i].input_ids, r[i].n_ids * sizeof *ids);
    return ids;
}
