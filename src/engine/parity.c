/* parity.c — top-1 agreement and TV distance between two engines (parity.h). */
#include "engine/parity.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json/json.h"

/* Softmax of a question's logits (JSON numbers) in double. */
static int softmax(const json_value *logits, double *p) {
    double mx = -INFINITY;
    for (size_t i = 0; i < logits->n; i++) {
        if (json_as_double(logits->items[i], &p[i]) != 0 || !isfinite(p[i])) return -1;
        if (p[i] > mx) mx = p[i];
    }
    double s = 0;
    for (size_t i = 0; i < logits->n; i++) s += (p[i] = exp(p[i] - mx));
    for (size_t i = 0; i < logits->n; i++) p[i] /= s;
    return 0;
}

static size_t argmax(const double *p, size_t n) {
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (p[i] > p[b]) b = i;
    return b;
}

static char *dup_str(const char *s) { return clef_xstrndup(s, strlen(s)); }

/* Answer `body` with the debug block; returns the parsed response, or NULL
 * with *status set (the request was rejected). */
static json_value *answer(clef_engine *e, const char *body, size_t len, size_t max_length, int *status) {
    clef_decide_params p = {.debug = 1, .max_length = max_length, .truncate_state = -1};
    clef_buf out = {0};
    clef_err err;
    clef_err_clear(&err);
    json_value *v = NULL;
    if (clef_engine_decide(e, body, len, &p, &out, &err) == 0) v = json_parse(out.data, out.len, &err);
    else *status = err.status;
    clef_buf_free(&out);
    return v;
}

/* Compare one request's questions. */
static int compare(clef_parity_report *rep, const char *name, const json_value *ra, const json_value *rb,
                   double *tv_sum, clef_err *err) {
    const json_value *qa = json_get(json_get(ra, "debug"), "questions");
    const json_value *qb = json_get(json_get(rb, "debug"), "questions");
    if (!qa || !qb || qa->n != qb->n)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: the models encoded different questions", name);
    for (size_t i = 0; i < qa->n; i++) {
        const json_value *a = qa->items[i], *b = qb->items[i];
        const json_value *ida = json_get(a, "option_ids"), *idb = json_get(b, "option_ids");
        const json_value *la = json_get(a, "logits"), *lb = json_get(b, "logits");
        const char *qid = json_get(a, "id")->str;
        clef_buf x = {0}, y = {0};
        json_render(ida, &x);
        json_render(idb, &y);
        int same = !strcmp(x.data, y.data) && la->n == ida->n && lb->n == ida->n && ida->n > 0;
        clef_buf_free(&x);
        clef_buf_free(&y);
        if (!same)
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: question %s has different options", name, qid);
        double *p = clef_xcalloc(2 * la->n, sizeof *p), *q = p + la->n;
        if (softmax(la, p) || softmax(lb, q)) {
            free(p);
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: question %s has a non-finite logit", name, qid);
        }
        double tv = 0;
        for (size_t k = 0; k < la->n; k++) tv += fabs(p[k] - q[k]);
        tv *= 0.5;
        size_t ta = argmax(p, la->n), tb = argmax(q, la->n);
        rep->questions++;
        *tv_sum += tv;
        if (tv > rep->max_tv || !rep->max_tv_where) {
            rep->max_tv = tv;
            free(rep->max_tv_where);
            clef_buf w = {0};
            clef_buf_printf(&w, "%s/%s", name, qid);
            rep->max_tv_where = w.data;
        }
        if (ta == tb) {
            rep->agree++;
        } else {
            rep->flips = clef_xrealloc(rep->flips, (rep->n_flips + 1) * sizeof *rep->flips);
            rep->flips[rep->n_flips++] = (clef_parity_flip){dup_str(name), dup_str(qid), dup_str(ida->items[ta]->str),
                                                            dup_str(ida->items[tb]->str), p[ta], q[tb], tv};
        }
        free(p);
    }
    return 0;
}

/* Answer one line; appends to `out`. */
static int collect_line(clef_engine *e, const char *line, size_t len, size_t lineno, clef_parity_answers *out,
                        clef_err *err) {
    clef_err jerr;
    json_value *doc = json_parse(line, len, &jerr);
    if (!doc || doc->type != JSON_OBJECT) {
        json_free(doc);
        return clef_fail(err, 400, CLEF_E_JSON, NULL, "line %zu: not a JSON object", lineno);
    }
    const json_value *req = json_get(doc, "request");
    if (!req) req = doc;
    if (req->type != JSON_OBJECT) {
        json_free(doc);
        return clef_fail(err, 400, CLEF_E_REQUEST, NULL, "line %zu: \"request\" is not an object", lineno);
    }
    char namebuf[64];
    const json_value *nm = json_get(doc, "name");
    snprintf(namebuf, sizeof namebuf, "line %zu", lineno);
    const char *name = nm && nm->type == JSON_STRING ? nm->str : namebuf;
    int64_t max_length = 0;
    const json_value *ml = json_get(doc, "max_length");
    if (ml) json_as_i64(ml, &max_length);
    clef_buf body = {0};
    json_render_opts(req, 0, &body);
    size_t i = out->n++;
    out->names = clef_xrealloc(out->names, out->n * sizeof *out->names);
    out->responses = clef_xrealloc(out->responses, out->n * sizeof *out->responses);
    out->status = clef_xrealloc(out->status, out->n * sizeof *out->status);
    out->names[i] = dup_str(name);
    out->status[i] = 0;
    out->responses[i] = answer(e, body.data, body.len, max_length > 0 ? (size_t)max_length : 0, &out->status[i]);
    clef_buf_free(&body);
    json_free(doc);
    return 0;
}

int clef_parity_collect(clef_engine *e, const char *jsonl, size_t len, clef_parity_answers *out, clef_err *err) {
    memset(out, 0, sizeof *out);
    size_t lineno = 0;
    for (size_t pos = 0; pos < len;) {
        const char *nl = memchr(jsonl + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - jsonl) : len;
        lineno++;
        size_t s = pos;
        while (s < end && (jsonl[s] == ' ' || jsonl[s] == '\t' || jsonl[s] == '\r')) s++;
        if (s < end && collect_line(e, jsonl + s, end - s, lineno, out, err) != 0) return -1;
        pos = end + 1;
    }
    return 0;
}

void clef_parity_answers_free(clef_parity_answers *a) {
    if (!a) return;
    for (size_t i = 0; i < a->n; i++) {
        free(a->names[i]);
        json_free(a->responses[i]);
    }
    free(a->names);
    free(a->responses);
    free(a->status);
    memset(a, 0, sizeof *a);
}

int clef_parity_compare(const clef_parity_answers *a, const clef_parity_answers *b, clef_parity_report *rep,
                        clef_err *err) {
    memset(rep, 0, sizeof *rep);
    if (a->n != b->n) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "parity: %zu answers against %zu", a->n, b->n);
    double tv_sum = 0;
    for (size_t i = 0; i < a->n; i++) {
        const json_value *ra = a->responses[i], *rb = b->responses[i];
        if (ra && rb) {
            rep->requests++;
            if (compare(rep, a->names[i], ra, rb, &tv_sum, err) != 0) return -1;
        } else if (!ra && !rb && a->status[i] == b->status[i]) {
            rep->rejected++;
        } else {
            rep->mismatched++;
        }
    }
    rep->mean_tv = rep->questions ? tv_sum / (double)rep->questions : 0;
    return 0;
}

int clef_parity_run(clef_engine *a, clef_engine *b, const char *jsonl, size_t len, clef_parity_report *rep,
                    clef_err *err) {
    memset(rep, 0, sizeof *rep);
    clef_parity_answers x, y;
    int rc = clef_parity_collect(a, jsonl, len, &x, err);
    if (rc == 0) rc = clef_parity_collect(b, jsonl, len, &y, err);
    else memset(&y, 0, sizeof y);
    if (rc == 0) rc = clef_parity_compare(&x, &y, rep, err);
    clef_parity_answers_free(&x);
    clef_parity_answers_free(&y);
    return rc;
}

void clef_parity_report_free(clef_parity_report *rep) {
    if (!rep) return;
    for (size_t i = 0; i < rep->n_flips; i++) {
        clef_parity_flip *f = &rep->flips[i];
        free(f->request);
        free(f->question);
        free(f->option_a);
        free(f->option_b);
    }
    free(rep->flips);
    free(rep->max_tv_where);
    memset(rep, 0, sizeof *rep);
}

static void set_str(json_value *o, const char *k, const char *v) {
    json_object_set(o, k, strlen(k), v ? json_new_string(v, strlen(v)) : json_new(JSON_NULL));
}

void clef_parity_render(const clef_parity_report *rep, clef_buf *out) {
    json_value *o = json_new(JSON_OBJECT), *fl = json_new(JSON_ARRAY);
    json_object_set(o, "requests", 8, json_new_int((int64_t)rep->requests));
    json_object_set(o, "rejected", 8, json_new_int((int64_t)rep->rejected));
    json_object_set(o, "mismatched", 10, json_new_int((int64_t)rep->mismatched));
    json_object_set(o, "questions", 9, json_new_int((int64_t)rep->questions));
    json_object_set(o, "agree", 5, json_new_int((int64_t)rep->agree));
    json_object_set(o, "agreement", 9,
                    json_new_float(rep->questions ? (double)rep->agree / (double)rep->questions : 1.0));
    json_object_set(o, "mean_tv", 7, json_new_float(rep->mean_tv));
    json_object_set(o, "max_tv", 6, json_new_float(rep->max_tv));
    set_str(o, "max_tv_where", rep->max_tv_where);
    for (size_t i = 0; i < rep->n_flips; i++) {
        const clef_parity_flip *f = &rep->flips[i];
        json_value *j = json_new(JSON_OBJECT);
        set_str(j, "request", f->request);
        set_str(j, "question", f->question);
        set_str(j, "top_a", f->option_a);
        set_str(j, "top_b", f->option_b);
        json_object_set(j, "p_a", 3, json_new_float(f->p_a));
        json_object_set(j, "p_b", 3, json_new_float(f->p_b));
        json_object_set(j, "tv", 2, json_new_float(f->tv));
        json_array_push(fl, j);
    }
    json_object_set(o, "flipped", 7, fl);
    json_render_opts(o, 0, out);
    json_free(o);
}
