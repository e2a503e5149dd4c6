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
#include "media/media.h"
#include "util/err.h"

/* Server-configurable limits (SPEC §2.2 rule 8).  Defaults: clef_limits_default. */
typedef struct clef_limits {
    size_t max_questions;      /* 64 */
    size_t max_choice_options; /* 255 */
    size_t min_score_levels;   /* 2 */
    size_t max_score_levels;   /* 255 */
    clef_media_limits media;   /* clef_media_limits_default(); all three byte limits 0 = defaults */
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
    clef_media media;         /* images/audio/videos decoded at rule 9 (grids, token counts; the tensors
                                 are built later by clef_media_preprocess), owned; empty without media */
} clef_request;

/* Parse and validate a request body (`len` bytes of UTF-8 JSON) with the
 * limits `lim` (NULL = clef_limits_default()).  On success fills `out` (free
 * with clef_request_free) and returns 0.  On error returns -1 with err set to
 * the status, type, message and param of the first failing SPEC §2.2 rule;
 * each rule is applied to every question before the next rule runs:
 *   2  invalid JSON                                  400 invalid_json (parser message)
 *   3  body not an object                            400 "request body must be a JSON object"
 *   4  model not a string / state absent             400 "model and state are required" (param model|state)
 *   5  questions missing or not an object / {}       400 / 422 "at least one question is required"
 *   6  question not an object                        400 "<id>: question must be an object"
 *      type not a string / unknown type string       400 / 422 "<id>: type must be noul, choice, or score"
 *      choice/score criteria missing or falsy        422 "<id>: criteria must not be empty"
 *   7  container types                               400 "<id>: choice criteria must be an object" (etc.)
 *   8  limits                                        422 capacity_exceeded "<n> questions exceed the limit
 *                                                    of <max> questions per context window", "<id>: <n>
 *                                                    options per choice exceed the limit of <max>", "<id>:
 *                                                    <n> score levels exceed the limit of <max> options per
 *                                                    choice"; 422 invalid_request "<id>: score criteria
 *                                                    need at least <min> levels (got <n>, below the minimum
 *                                                    of <min> options per choice)"
 *   9  images/audio/videos not arrays of strings     400 "<field> must be an array of strings"
 *      truncate_state not a boolean                  400 "truncate_state must be a boolean"
 *      media_kwargs present (any value)              422 "media_kwargs is not supported"
 *      too many / over-limit media                   422 capacity_exceeded "images: 5 images exceed the limit
 *                                                    of 4 images per context window" (param images),
 *                                                    "images[0]: image payload is invalid: <why>" (param
 *                                                    images[0]); undecodable media: the latter as
 *                                                    invalid_request; likewise audio[i], videos[i]
 *                                                    (media/media.h)
 * Every refusal for a limit (rule 8, media limits; the encoder's window and
 * the forward's memory) contains one of the Decision Index kit's capacity
 * phrases ("options per choice", "context window", "the canvas holds",
 * "maximum context length", "too many tokens").
 * Question ids appear raw in messages and params ("questions.<id>.criteria"),
 * except the empty id: its messages name it "" and its param is "questions"
 * (clef_question_name, clef_question_param).
 * A media field that is null counts as absent.  Thread-safe. */
int clef_request_parse(const char *body, size_t len, const clef_limits *lim, clef_request *out, clef_err *err);

/* How errors name question `id` (NUL-terminated): the id itself, or "\"\""
 * (two quote characters) for the empty id.  Static or borrowed from `id`. */
const char *clef_question_name(const char *id);

/* The error param of question `id`: "questions.<id>" or, with `field`,
 * "questions.<id>.<field>", written to `buf` (`cap` bytes, cut to fit) and
 * returned.  The empty id gets "questions": "questions..<field>" would read
 * as a path with a missing segment. */
const char *clef_question_param(char *buf, size_t cap, const char *id, const char *field);

/* Same, from an already parsed document; takes ownership of `root` (freed on
 * error too). */
int clef_request_from_json(json_value *root, const clef_limits *lim, clef_request *out, clef_err *err);

/* A check on the media a request carries, run by clef_request_parse_gated
 * after every other rule and before any media item is decoded (so a payload
 * the server refuses anyway is never read).  n_items[0..2] = the number of
 * items in "images", "audio", "videos" (0 when absent or null).  Returns 0 to
 * go on, or -1 with `err` set: the parse then fails with that error. */
typedef int (*clef_media_gate)(const void *ctx, const size_t n_items[3], clef_err *err);

/* clef_request_parse with `gate(gate_ctx, ...)` run just before the media
 * are decoded (a NULL gate = clef_request_parse).  Thread-safe if the gate is. */
int clef_request_parse_gated(const char *body, size_t len, const clef_limits *lim, clef_media_gate gate,
                             const void *gate_ctx, clef_request *out, clef_err *err);

void clef_request_free(clef_request *r);

#endif
