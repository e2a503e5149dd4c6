/* check.h — the Decision Index kit's view of an answer: which refusals it
 * records as "unsupported", and the checks an "ok" result must pass.
 *
 * Both follow the kit (apolinario/decision-index):
 *  - decision_index/engines/http.py records a 400/413/422 as unsupported when
 *    its body holds one of CAPACITY_MARKERS (every clef limit refusal does:
 *    tests/unit/test_capacity_phrases.c); clef_eval_unsupported also counts
 *    every capacity_exceeded error, whatever its status (a forward that ran
 *    out of memory: "too many tokens: ...").
 *  - decision_index/engines/base.py validate(): the answers name exactly the
 *    questions, each with the question's type; a choice's `choice` is one of
 *    its options and its `probabilities` name exactly its options, each
 *    finite in [0, 1], summing to 1 within 0.01; a noul's `noul` is finite in
 *    [0, 1].  The kit's validate knows no score questions (its suite has
 *    none); clef checks them the same way: `probabilities` names exactly
 *    "0".."n-1" (n levels), each in [0, 1], summing to 1 within 0.01, and
 *    `score` is finite in [0, n-1].
 */
#ifndef CLEF_EVAL_CHECK_H
#define CLEF_EVAL_CHECK_H

#include "json/json.h"
#include "util/err.h"

/* Tolerance of the probability sums (the kit's). */
#define CLEF_EVAL_SUM_TOLERANCE 0.01

/* Error type of a response that fails the kit's checks (an engine fault;
 * not a wire type: it appears only in `clef eval` results). */
#define CLEF_E_INVALID_RESPONSE "invalid_response"

/* 1 when the kit records refusal `e` as unsupported (a capacity limit), 0
 * when it is an error. */
int clef_eval_unsupported(const clef_err *e);

/* Check `response` (a parsed SystemOne response object, with "answers")
 * against the request's `questions` object (as sent).  Returns 0, or -1
 * with err = 500 CLEF_E_INVALID_RESPONSE naming the first failing question
 * (param "questions.<id>") and what is wrong, e.g.
 * "d: probabilities sum to 0.9800, not 1 within 0.01". */
int clef_eval_check_response(const json_value *questions, const json_value *response, clef_err *err);

#endif
