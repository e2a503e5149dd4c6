/* request.c — SystemOne request parsing and validation (SPEC.md §2).
 *
 * The checks run as separate passes in the order of SPEC §2.2 so that the
 * first failing RULE wins, not the first failing question: a request whose
 * second question has an unknown type and whose first has array choice
 * criteria fails on the type (rule 6) exactly as the reference's validation
 * loop does before it ever reaches encoding (where it would crash on rule 7).
 */
#include "decision/request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"

/* Default noul descriptions (SPEC §3.1 NOUL_TRUE / NOUL_FALSE).  Static nodes:
 * the request points at them and never frees them. */
#define NOUL_TRUE_TEXT "The proposition is true or the answer is yes."
#define NOUL_FALSE_TEXT "The proposition is false or the answer is no."
static const json_value noul_true_default = {
    .type = JSON_STRING, .str = (char *)NOUL_TRUE_TEXT, .len = sizeof NOUL_TRUE_TEXT - 1};
static const json_value noul_false_default = {
    .type = JSON_STRING, .str = (char *)NOUL_FALSE_TEXT, .len = sizeof NOUL_FALSE_TEXT - 1};

clef_limits clef_limits_default(void) {
    clef_limits l = {.max_questions = 64, .max_choice_options = 255, .min_score_levels = 2, .max_score_levels = 255};
    l.media = clef_media_limits_default();
    return l;
}

/* ---- small helpers ----------------------------------------------------- */

const char *clef_question_name(const char *id) { return id[0] ? id : "\"\""; }

const char *clef_question_param(char *buf, size_t cap, const char *id, const char *field) {
    if (!id[0])
        snprintf(buf, cap, "questions");
    else if (field)
        snprintf(buf, cap, "questions.%s.%s", id, field);
    else
        snprintf(buf, cap, "questions.%s", id);
    return buf;
}

static int is_string(const json_value *v) { return v && v->type == JSON_STRING; }

static int string_is(const json_value *v, const char *s) {
    size_t n = strlen(s);
    return is_string(v) && v->len == n && memcmp(v->str, s, n) == 0;
}

/* ---- rules 3-5: envelope ---------------------------------------------- */

static int check_envelope(const json_value *root, clef_err *err) {
    if (!root || root->type != JSON_OBJECT)
        return clef_fail(err, 400, CLEF_E_REQUEST, NULL, "request body must be a JSON object");
    const json_value *model = json_get(root, "model");
    if (!is_string(model)) return clef_fail(err, 400, CLEF_E_REQUEST, "model", "model and state are required");
    if (!json_get(root, "state")) return clef_fail(err, 400, CLEF_E_REQUEST, "state", "model and state are required");
    const json_value *qs = json_get(root, "questions");
    if (!qs || qs->type != JSON_OBJECT)
        return clef_fail(err, 400, CLEF_E_REQUEST, "questions", "at least one question is required");
    if (qs->n == 0) return clef_fail(err, 422, CLEF_E_REQUEST, "questions", "at least one question is required");
    return 0;
}

/* ---- rule 6: reference step 3 (type, non-empty criteria) --------------- */

static int parse_type(const json_value *t, clef_qtype *out) {
    if (string_is(t, "noul")) *out = CLEF_NOUL;
    else if (string_is(t, "choice")) *out = CLEF_CHOICE;
    else if (string_is(t, "score")) *out = CLEF_SCORE;
    else return -1;
    return 0;
}

static int check_question_reference(const char *id, const json_value *q, clef_qtype *type, clef_err *err) {
    char param[CLEF_ERR_PARAM_MAX];
    const char *name = clef_question_name(id);
    if (q->type != JSON_OBJECT)
        return clef_fail(err, 400, CLEF_E_REQUEST, clef_question_param(param, sizeof param, id, NULL),
                         "%s: question must be an object", name);
    const json_value *t = json_get(q, "type");
    if (parse_type(t, type) != 0) {
        /* A non-string type is malformed (400); an unknown type string is a
         * well-formed but unsupported value (422).  Same reference message. */
        int status = is_string(t) ? 422 : 400;
        return clef_fail(err, status, CLEF_E_REQUEST, clef_question_param(param, sizeof param, id, "type"),
                         "%s: type must be noul, choice, or score", name);
    }
    if (*type != CLEF_NOUL && !json_truthy(json_get(q, "criteria")))
        return clef_fail(err, 422, CLEF_E_REQUEST, clef_question_param(param, sizeof param, id, "criteria"),
                         "%s: criteria must not be empty", name);
    return 0;
}

/* ---- rule 7: criteria container types ---------------------------------- */

static int check_question_containers(const char *id, const json_value *q, clef_qtype type, clef_err *err) {
    char param[CLEF_ERR_PARAM_MAX];
    const char *name = clef_question_name(id);
    const json_value *c = json_get(q, "criteria");
    clef_question_param(param, sizeof param, id, "criteria");
    switch (type) {
    case CLEF_CHOICE:
        if (c->type != JSON_OBJECT)
            return clef_fail(err, 400, CLEF_E_REQUEST, param, "%s: choice criteria must be an object", name);
        break;
    case CLEF_SCORE:
        if (c->type != JSON_ARRAY)
            return clef_fail(err, 400, CLEF_E_REQUEST, param, "%s: score criteria must be an array", name);
        break;
    case CLEF_NOUL:
        if (c && c->type != JSON_NULL && c->type != JSON_OBJECT)
            return clef_fail(err, 400, CLEF_E_REQUEST, param, "%s: noul criteria must be an object", name);
        break;
    }
    return 0;
}

/* ---- rule 8: limits ---------------------------------------------------- */

static int check_question_limits(const char *id, const json_value *q, clef_qtype type, const clef_limits *lim,
                                 clef_err *err) {
    char param[CLEF_ERR_PARAM_MAX];
    const char *name = clef_question_name(id);
    const json_value *c = json_get(q, "criteria");
    clef_question_param(param, sizeof param, id, "criteria");
    if (type == CLEF_CHOICE && c->n > lim->max_choice_options)
        return clef_fail(err, 422, CLEF_E_CAPACITY, param, "%s: %zu options per choice exceed the limit of %zu", name,
                         c->n, lim->max_choice_options);
    if (type == CLEF_SCORE && c->n < lim->min_score_levels)
        return clef_fail(err, 422, CLEF_E_REQUEST, param,
                         "%s: score criteria need at least %zu levels (got %zu, below the minimum of %zu options per "
                         "choice)",
                         name, lim->min_score_levels, c->n, lim->min_score_levels);
    if (type == CLEF_SCORE && c->n > lim->max_score_levels)
        return clef_fail(err, 422, CLEF_E_CAPACITY, param,
                         "%s: %zu score levels exceed the limit of %zu options per choice", name, c->n,
                         lim->max_score_levels);
    return 0;
}

/* ---- rule 9: media fields, truncate_state, media_kwargs ----------------- */

static const char *const media_fields[] = {"images", "audio", "videos"};

/* `null` counts as absent: the reference reads these lists with a default. */
static int check_media_types(const json_value *root, clef_err *err) {
    for (size_t f = 0; f < 3; f++) {
        const json_value *m = json_get(root, media_fields[f]);
        if (!m || m->type == JSON_NULL) continue;
        if (m->type != JSON_ARRAY)
            return clef_fail(err, 400, CLEF_E_REQUEST, media_fields[f], "%s must be an array of strings",
                             media_fields[f]);
        for (size_t i = 0; i < m->n; i++) {
            if (m->items[i]->type == JSON_STRING) continue;
            char param[64];
            snprintf(param, sizeof param, "%s[%zu]", media_fields[f], i);
            return clef_fail(err, 400, CLEF_E_REQUEST, param, "%s must be an array of strings", media_fields[f]);
        }
    }
    return 0;
}

/* media_kwargs would change the processor's behaviour; refused (SPEC §2.2). */
static int check_media_kwargs(const json_value *root, clef_err *err) {
    if (json_get(root, "media_kwargs"))
        return clef_fail(err, 422, CLEF_E_REQUEST, "media_kwargs", "media_kwargs is not supported");
    return 0;
}

/* n[f] = items of media field f (media_fields order); 0 when absent or
 * null.  Read after check_media_types, so a present field is an array. */
static void media_counts(const json_value *root, size_t n[3]) {
    for (size_t f = 0; f < 3; f++) {
        const json_value *m = json_get(root, media_fields[f]);
        n[f] = m && m->type == JSON_ARRAY ? m->n : 0;
    }
}

/* The last check of rule 9: decode every media item (media/media.h). */
static int decode_media(const json_value *root, const clef_limits *lim, clef_media *out, clef_err *err) {
    clef_media_item *items[3] = {NULL, NULL, NULL};
    size_t n[3];
    media_counts(root, n);
    for (size_t f = 0; f < 3; f++) {
        if (!n[f]) continue;
        const json_value *m = json_get(root, media_fields[f]);
        items[f] = clef_xcalloc(n[f], sizeof *items[f]);
        for (size_t i = 0; i < n[f]; i++) items[f][i] = (clef_media_item){m->items[i]->str, m->items[i]->len};
    }
    clef_media_source src = {items[0], n[0], items[1], n[1], items[2], n[2]};
    const clef_media_limits *ml = &lim->media;
    clef_media_limits dflt = clef_media_limits_default();
    dflt.budget = ml->budget;
    dflt.budget_wait_ms = ml->budget_wait_ms;
    if (!ml->max_image_bytes && !ml->max_audio_bytes && !ml->max_video_bytes) ml = &dflt;
    int rc = clef_media_decode(&src, ml, out, err);
    for (size_t f = 0; f < 3; f++) free(items[f]);
    return rc;
}

static int parse_truncate_state(const json_value *root, int *out, clef_err *err) {
    const json_value *t = json_get(root, "truncate_state");
    if (!t) *out = -1;
    else if (t->type == JSON_TRUE) *out = 1;
    else if (t->type == JSON_FALSE) *out = 0;
    else return clef_fail(err, 400, CLEF_E_REQUEST, "truncate_state", "truncate_state must be a boolean");
    return 0;
}

/* ---- options in encoding order (SPEC §3.3) ----------------------------- */

static void options_alloc(clef_question *q, size_t n) {
    q->n_options = n;
    q->options = clef_xcalloc(n, sizeof *q->options);
    q->request_order = clef_xcalloc(n, sizeof *q->request_order);
    for (size_t k = 0; k < n; k++) q->request_order[k] = k;
}

/* noul: true then false; defaults overlaid by criteria["true"/"false"]
 * (explicit null removes the description, other keys are ignored). */
static void resolve_noul(clef_question *q) {
    options_alloc(q, 2);
    static const char *const ids[2] = {"true", "false"};
    const json_value *defaults[2] = {&noul_true_default, &noul_false_default};
    for (size_t k = 0; k < 2; k++) {
        q->options[k].id = ids[k];
        q->options[k].id_len = strlen(ids[k]);
        const json_value *d = defaults[k];
        if (q->criteria && q->criteria->type == JSON_OBJECT) {
            const json_value *o = json_get(q->criteria, ids[k]);
            if (o) d = o->type == JSON_NULL ? NULL : o;
        }
        q->options[k].description = d;
    }
}

/* Byte order of UTF-8 strings = code point order (SPEC §3.3). */
static int bytes_cmp(const char *a, size_t an, const char *b, size_t bn) {
    int c = memcmp(a, b, an < bn ? an : bn);
    if (c) return c;
    return (an > bn) - (an < bn);
}

/* One criteria key with its position, sorted without global state so that
 * requests can be parsed from many threads at once. */
typedef struct choice_key {
    const char *key;
    size_t len;
    size_t index; /* position in the request's criteria */
} choice_key;

static int choice_key_cmp(const void *pa, const void *pb) {
    const choice_key *a = pa, *b = pb;
    return bytes_cmp(a->key, a->len, b->key, b->len);
}

/* choice: ids sorted by UTF-8 bytes; request_order maps criteria order back. */
static void resolve_choice(clef_question *q) {
    const json_value *c = q->criteria;
    options_alloc(q, c->n);
    choice_key *sorted = clef_xmalloc(c->n * sizeof *sorted);
    for (size_t i = 0; i < c->n; i++) sorted[i] = (choice_key){c->keys[i], c->key_lens[i], i};
    /* Keys are unique after the parser's duplicate handling, so the order is
     * total and qsort's instability does not matter. */
    qsort(sorted, c->n, sizeof *sorted, choice_key_cmp);
    for (size_t k = 0; k < c->n; k++) {
        size_t i = sorted[k].index;
        q->options[k].id = c->keys[i];
        q->options[k].id_len = c->key_lens[i];
        q->options[k].description = c->items[i]->type == JSON_NULL ? NULL : c->items[i];
        q->request_order[i] = k;
    }
    free(sorted);
}

/* score: ids "0".."n-1" in array order, description = criteria[i]. */
static void resolve_score(clef_question *q) {
    const json_value *c = q->criteria;
    options_alloc(q, c->n);
    q->option_id_text = clef_xmalloc(c->n * 24);
    for (size_t i = 0; i < c->n; i++) {
        char *slot = q->option_id_text + i * 24;
        int len = snprintf(slot, 24, "%zu", i);
        q->options[i].id = slot;
        q->options[i].id_len = (size_t)len;
        q->options[i].description = c->items[i]->type == JSON_NULL ? NULL : c->items[i];
    }
}

/* ---- entry points ------------------------------------------------------ */

static int validate(const json_value *root, const clef_limits *lim, clef_qtype *types, clef_err *err) {
    if (check_envelope(root, err)) return -1;
    const json_value *qs = json_get(root, "questions");
    for (size_t i = 0; i < qs->n; i++)
        if (check_question_reference(qs->keys[i], qs->items[i], &types[i], err)) return -1;
    for (size_t i = 0; i < qs->n; i++)
        if (check_question_containers(qs->keys[i], qs->items[i], types[i], err)) return -1;
    if (qs->n > lim->max_questions)
        return clef_fail(err, 422, CLEF_E_CAPACITY, "questions",
                         "%zu questions exceed the limit of %zu questions per context window", qs->n,
                         lim->max_questions);
    for (size_t i = 0; i < qs->n; i++)
        if (check_question_limits(qs->keys[i], qs->items[i], types[i], lim, err)) return -1;
    if (check_media_types(root, err)) return -1;
    int truncate_state;
    if (parse_truncate_state(root, &truncate_state, err)) return -1;
    return check_media_kwargs(root, err);
}

static int from_json(json_value *root, const clef_limits *lim, clef_media_gate gate, const void *gate_ctx,
                     clef_request *out, clef_err *err) {
    memset(out, 0, sizeof *out);
    clef_limits dflt = clef_limits_default();
    if (!lim) lim = &dflt;
    const json_value *qs = json_get(root, "questions");
    size_t nq = qs && qs->type == JSON_OBJECT ? qs->n : 0;
    clef_qtype *types = clef_xcalloc(nq ? nq : 1, sizeof *types);
    if (validate(root, lim, types, err)) {
        free(types);
        json_free(root);
        return -1;
    }
    out->root = root;
    const json_value *model = json_get(root, "model");
    out->model = model->str;
    out->model_len = model->len;
    out->state = json_get(root, "state");
    parse_truncate_state(root, &out->truncate_state, NULL);
    out->n_questions = nq;
    out->questions = clef_xcalloc(nq, sizeof *out->questions);
    for (size_t i = 0; i < nq; i++) {
        clef_question *q = &out->questions[i];
        q->id = qs->keys[i];
        q->id_len = qs->key_lens[i];
        q->type = types[i];
        q->instructions = json_get(qs->items[i], "instructions");
        q->criteria = json_get(qs->items[i], "criteria");
        if (q->type == CLEF_NOUL) resolve_noul(q);
        else if (q->type == CLEF_CHOICE) resolve_choice(q);
        else resolve_score(q);
    }
    free(types);
    size_t n_items[3];
    media_counts(root, n_items);
    if ((gate && gate(gate_ctx, n_items, err)) || decode_media(root, lim, &out->media, err)) {
        clef_request_free(out);
        return -1;
    }
    return 0;
}

int clef_request_from_json(json_value *root, const clef_limits *lim, clef_request *out, clef_err *err) {
    return from_json(root, lim, NULL, NULL, out, err);
}

int clef_request_parse_gated(const char *body, size_t len, const clef_limits *lim, clef_media_gate gate,
                             const void *gate_ctx, clef_request *out, clef_err *err) {
    memset(out, 0, sizeof *out);
    json_value *root = json_parse(body, len, err);
    if (!root) return -1;
    return from_json(root, lim, gate, gate_ctx, out, err);
}

int clef_request_parse(const char *body, size_t len, const clef_limits *lim, clef_request *out, clef_err *err) {
    return clef_request_parse_gated(body, len, lim, NULL, NULL, out, err);
}

void clef_request_free(clef_request *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n_questions; i++) {
        free(r->questions[i].options);
        free(r->questions[i].request_order);
        free(r->questions[i].option_id_text);
    }
    free(r->questions);
    clef_media_free(&r->media);
    json_free(r->root);
    memset(r, 0, sizeof *r);
}
