#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

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
