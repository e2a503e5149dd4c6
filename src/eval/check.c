/* check.c — the kit's unsupported rule and answer checks.  See check.h. */
#include "eval/check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* decision_index/engines/http.py CAPACITY_MARKERS, verbatim. */
static const char *const CAPACITY_MARKERS[] = {
    "options per choice",   "a choice needs at least two options", "a score takes 2 to 10 levels",
    "the canvas holds",     "maximum context length",              "maximum model length",
    "longer than the maximum model length", "context window",      "too many tokens",
};

int clef_eval_unsupported(const clef_err *e) {
    if (e->type && !strcmp(e->type, CLEF_E_CAPACITY)) return 1;
    if (e->status != 400 && e->status != 413 && e->status != 422) return 0;
    for (size_t i = 0; i < sizeof CAPACITY_MARKERS / sizeof *CAPACITY_MARKERS; i++)
        if (strstr(e->message, CAPACITY_MARKERS[i])) return 1;
    return 0;
}

/* Member of `obj` named by the `len` bytes of `key` (NUL bytes allowed), or NULL. */
static const json_value *member(const json_value *obj, const char *key, size_t len) {
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    for (size_t i = 0; i < obj->n; i++)
        if (obj->key_lens[i] == len && !memcmp(obj->keys[i], key, len)) return obj->items[i];
    return NULL;
}

/* A probability: a finite number in [0, 1]; -1 otherwise. */
static int probability(const json_value *v, double *p) {
    return v && json_as_double(v, p) == 0 && isfinite(*p) && *p >= 0.0 && *p <= 1.0 ? 0 : -1;
}

/* Fail naming question `id` (first 200 bytes shown). */
#define BAD(...) bad(err, id, id_len, __VA_ARGS__)
static int bad(clef_err *err, const char *id, size_t id_len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int bad(clef_err *err, const char *id, size_t id_len, const char *fmt, ...) {
    char what[512], param[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    int shown = id_len < 200 ? (int)id_len : 200;
    snprintf(param, sizeof param, "questions.%.*s", shown, id);
    return clef_fail(err, 500, CLEF_E_INVALID_RESPONSE, param, "%.*s%s: %s", shown, id, id_len > 200 ? "..." : "",
                     what);
}

/* `probabilities` of one answer names exactly the options (n of them, the
 * i-th named by names[i]/lens[i] or, when names is NULL, by the decimal i),
 * each a probability, summing to 1 within the tolerance. */
static int check_distribution(const json_value *probs, const json_value *opts, size_t n, const char *id, size_t id_len,
                              clef_err *err) {
    if (!probs || probs->type != JSON_OBJECT) return BAD("probabilities missing or not an object");
    if (probs->n != n) return BAD("probabilities name %zu options, the question has %zu", probs->n, n);
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        char num[24];
        const char *k = num;
        size_t kl;
        if (opts) {
            k = opts->keys[i];
            kl = opts->key_lens[i];
        } else {
            kl = (size_t)snprintf(num, sizeof num, "%zu", i);
        }
        const json_value *v = member(probs, k, kl);
        double p;
        if (!v) return BAD("option '%.*s' has no probability", kl < 100 ? (int)kl : 100, k);
        if (probability(v, &p)) return BAD("option '%.*s' has a probability that is not a number in [0, 1]",
                                           kl < 100 ? (int)kl : 100, k);
        sum += p;
    }
    if (fabs(sum - 1.0) > CLEF_EVAL_SUM_TOLERANCE)
        return BAD("probabilities sum to %.4f, not 1 within %.2f", sum, CLEF_EVAL_SUM_TOLERANCE);
    return 0;
}

int clef_eval_check_response(const json_value *questions, const json_value *response, clef_err *err) {
    const json_value *answers = response && response->type == JSON_OBJECT ? json_get(response, "answers") : NULL;
    if (!questions || questions->type != JSON_OBJECT)
        return clef_fail(err, 500, CLEF_E_INVALID_RESPONSE, "questions", "the request's questions are not an object");
    if (!answers || answers->type != JSON_OBJECT)
        return clef_fail(err, 500, CLEF_E_INVALID_RESPONSE, "answers", "the response has no answers object");
    if (answers->n != questions->n)
        return clef_fail(err, 500, CLEF_E_INVALID_RESPONSE, "answers",
                         "the response answers %zu questions, the request asks %zu", answers->n, questions->n);
    for (size_t q = 0; q < questions->n; q++) {
        const char *id = questions->keys[q];
        size_t id_len = questions->key_lens[q];
        const json_value *qv = questions->items[q], *a = member(answers, id, id_len);
        const json_value *type = json_get(qv, "type"), *criteria = json_get(qv, "criteria");
        if (!a || a->type != JSON_OBJECT) return BAD("no answer");
        const json_value *at = json_get(a, "type");
        if (!type || type->type != JSON_STRING || !at || at->type != JSON_STRING || at->len != type->len ||
            memcmp(at->str, type->str, type->len))
            return BAD("answer type differs from the question's");
        if (!strcmp(type->str, "choice")) {
            const json_value *choice = json_get(a, "choice");
            if (!criteria || criteria->type != JSON_OBJECT) return BAD("choice criteria are not an object");
            if (!choice || choice->type != JSON_STRING || !member(criteria, choice->str, choice->len))
                return BAD("choice is not one of the options");
            if (check_distribution(json_get(a, "probabilities"), criteria, criteria->n, id, id_len, err)) return -1;
        } else if (!strcmp(type->str, "noul")) {
            double p;
            if (probability(json_get(a, "noul"), &p)) return BAD("noul is not a number in [0, 1]");
        } else if (!strcmp(type->str, "score")) {
            if (!criteria || criteria->type != JSON_ARRAY) return BAD("score criteria are not an array");
            double s;
            const json_value *score = json_get(a, "score");
            if (!score || json_as_double(score, &s) || !isfinite(s) || s < 0.0 || s > (double)criteria->n - 1.0)
                return BAD("score is not a number in [0, %zu]", criteria->n ? criteria->n - 1 : 0);
            if (check_distribution(json_get(a, "probabilities"), NULL, criteria->n, id, id_len, err)) return -1;
        } else {
            return BAD("unknown question type");
        }
    }
    return 0;
}
