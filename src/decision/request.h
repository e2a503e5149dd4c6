/* request.h — a validated SystemOne request (SPEC.md §2).
 *
 * clef_request_parse applies the project rules of SPEC §2.2 in order (JSON
 * validity, object shape, reference messages of §2.1, container types,
 * configurable limits, media field types) and resolves each question's
 * options in encoding order (§3.3).  The encoder and the answer builder read
 * only this struct, never the raw JSON.
 */
#ifndef CLEF_DECISION_REQUEST_H
#define CLEF_DECISION_REQUEST_H

#include <stddef.h>

#include "decision/record.h"
#include "json/json.h"
#include "util/err.h"

/* Server-configurable limits (SPEC §2.2 rule 8).  Defaults: clef_limits_default. */
typedef struct clef_limits {
    size_t max_questions;      /* 64 */
    size_t max_choice_options; /* 255 */
    size_t min_score_levels;   /* 2 */
    size_t max_score_levels;   /* 255 */
} clef_limits;

clef_limits clef_limits_default(void);

typedef struct clef_option {
    const char *id;              /* option id: choice key, "true"/"false", or "0".."n-1"; owned by the request */
    size_t id_len;
    const json_value *description; /* NULL = no description (omitted from the option JSON) */
} clef_option;

typedef struct clef_question {
    const char *id;  /* question id (object key), borrowed from `root` */
    size_t id_len;
    clef_qtype type;
    const json_value *instructions; /* NULL when absent */
    const json_value *criteria;     /* NULL when absent */
    size_t n_options;
    clef_option *options;   /* [n_options] in ENCODING order (SPEC §3.3), owned */
    size_t *request_order;  /* [n_options]: request_order[k] = index into `options` of the k-th
                               option in the request's criteria order (choice); identity otherwise */
    char *option_id_text;   /* owned storage behind score ids "0".."n-1" (NULL for noul/choice) */
} clef_question;

typedef struct clef_request {
    json_value *root;        /* the parsed body, owned */
    const char *model;       /* borrowed from root */
    size_t model_len;
    const json_value *state; /* any JSON value, borrowed */
    size_t n_questions;
    clef_question *questions; /* request order, owned */
    int truncate_state;       /* -1 absent, 0 false, 1 true (the request's "truncate_state") */
} clef_request;

/* Parse and validate a request body.  On error returns -1 with err set to
 * the status, type, message and param of SPEC §2.2 (reference messages
 * verbatim, e.g. 400 "model and state are required").  Media fields present
 * and non-empty are rejected (422, "images: media inputs are not supported
 * by this build") until media support lands; `media_kwargs` is rejected with
 * 422 "media_kwargs is not supported". */
int clef_request_parse(const char *body, size_t len, const clef_limits *lim, clef_request *out, clef_err *err);

/* Same, from an already parsed document; takes ownership of `root` (freed on
 * error too). */
int clef_request_from_json(json_value *root, const clef_limits *lim, clef_request *out, clef_err *err);

void clef_request_free(clef_request *r);

#endif
