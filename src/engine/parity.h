/* parity.h — how closely two models answer the same requests (`clef parity`):
 * the metric quantized checkpoints publish against their BF16 original.
 *
 * Each request is answered by both engines with the debug block on; per
 * question, the unrounded option logits (encoding order) are turned into
 * probabilities with a softmax in double, then:
 *   top-1 agreement  the argmax option (first on ties) is the same;
 *   TV distance      ½ Σ_options |p_A − p_B|  (0 = identical, 1 = disjoint).
 * A question whose top-1 differs is a "flip".  Requests both engines reject
 * (same status) are counted and skipped; a request only one rejects is a
 * mismatch.
 */
#ifndef CLEF_ENGINE_PARITY_H
#define CLEF_ENGINE_PARITY_H

#include <stddef.h>

#include "engine/engine.h"
#include "util/buf.h"
#include "util/err.h"

/* One question whose top-1 option differs between the models. */
typedef struct clef_parity_flip {
    char *request;   /* the line's "name", or "line <n>" (owned) */
    char *question;  /* question id (owned) */
    char *option_a;  /* top-1 option id under model A (owned) */
    char *option_b;  /* top-1 option id under model B (owned) */
    double p_a, p_b; /* each model's probability of its own top-1 option */
    double tv;       /* the question's TV distance */
} clef_parity_flip;

typedef struct clef_parity_report {
    size_t requests;    /* answered by both */
    size_t rejected;    /* rejected by both with the same status (skipped) */
    size_t mismatched;  /* answered by one model, rejected by the other */
    size_t questions;   /* questions compared */
    size_t agree;       /* questions with the same top-1 option */
    double mean_tv;     /* mean TV distance over questions */
    double max_tv;
    char *max_tv_where; /* "<request>/<question>" of max_tv (owned, NULL when no question) */
    size_t n_flips;
    clef_parity_flip *flips; /* [n_flips] in request order */
} clef_parity_report;

/* One engine's answers to a requests file (so one side can be reused
 * against several others). */
typedef struct clef_parity_answers {
    size_t n;               /* non-empty lines */
    char **names;           /* [n] "name" of the line or "line <k>" (owned) */
    json_value **responses; /* [n] parsed response with its debug block, NULL when rejected (owned) */
    int *status;            /* [n] the rejection's status (0 when answered) */
} clef_parity_answers;

/* Answer every non-empty line of `jsonl` with `e` (see clef_parity_run for
 * the line format).  Errors (400) as clef_parity_run; free `out` with
 * clef_parity_answers_free even on error. */
int clef_parity_collect(clef_engine *e, const char *jsonl, size_t len, clef_parity_answers *out, clef_err *err);
void clef_parity_answers_free(clef_parity_answers *a);

/* Compare two collections of the same file line by line. */
int clef_parity_compare(const clef_parity_answers *a, const clef_parity_answers *b, clef_parity_report *rep,
                        clef_err *err);

/* Compare engines `a` and `b` on every non-empty line of `jsonl` (len
 * bytes).  A line is a SystemOne request object, or an object holding one
 * under "request" (as goldens.jsonl does) with optional "name" and
 * "max_length".  Errors (400): a line that is not JSON or has no request; a
 * question whose option ids differ between the engines (500).  `rep` is
 * zeroed first; free it with clef_parity_report_free even on error. */
int clef_parity_run(clef_engine *a, clef_engine *b, const char *jsonl, size_t len, clef_parity_report *rep,
                    clef_err *err);

void clef_parity_report_free(clef_parity_report *rep);

/* The report as JSON: {"requests","rejected","mismatched","questions",
 * "agree","agreement","mean_tv","max_tv","max_tv_where","flipped":[{...}]}. */
void clef_parity_render(const clef_parity_report *rep, clef_buf *out);

#endif
