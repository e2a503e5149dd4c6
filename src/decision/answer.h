/* answer.h — probabilities, answers and the response envelope (SPEC.md §8),
 * matching `systemone()` / `systemone_answer` in joint_schema_model.py.
 */
#ifndef CLEF_DECISION_ANSWER_H
#define CLEF_DECISION_ANSWER_H

#include "decision/record.h"
#include "decision/request.h"
#include "util/buf.h"

/* Per-question softmax in f32 over `logits` (layout of clef_head_forward:
 * the questions' options concatenated in request order, each question's
 * options in ENCODING order; clef_record_total_options(rec) floats) into
 * `probs` (same layout).  Reproduces torch.softmax(logits, -1) on CPU bit for
 * bit (its exp polynomial, summation order and reciprocal multiply); all 212
 * golden probabilities match exactly.  NaN/inf logits give NaN: callers check
 * with clef_check_logits first. */
void clef_softmax_per_question(const clef_record *rec, const float *logits, float *probs);

/* 0 if every logit is finite; otherwise -1 with err 500 internal_error naming
 * the question (the response must never carry NaN, SPEC §2.2). */
int clef_check_logits(const clef_request *req, const clef_record *rec, const float *logits, clef_err *err);

/* Append the response JSON to `out`:
 *   {"model":...,"answers":{...},"usage":{"input_tokens":N,"output_tokens":0}}
 * Answers follow SPEC §8 (choice argmax/probabilities in request criteria
 * order, score expectation in double, Python round(x, 4) + repr).
 * With `debug`, a top-level "debug" object follows "usage": {"input_ids":[...],
 * "questions":[{"id","question_span":[s,e],"option_spans":[[s,e],...],
 * "option_ids":[...encoding order],"logits":[...unrounded, encoding order]}]}. */
void clef_render_response(const clef_request *req, const clef_record *rec, const float *logits, int debug,
                          clef_buf *out);

/* Append the error body {"error":{"message":...,"type":...,"param":...|null}}
 * (SPEC §2.2); an empty err->param renders as null, a NULL type as
 * "internal_error". */
void clef_render_error(const clef_err *err, clef_buf *out);

/* Python round(x, 4) of a double: the exact binary value rounded to 4
 * decimals (ties to even, which only exact ties such as 0.03125 reach), then
 * converted back with correct rounding.  Signed zeros, NaN and infinities
 * pass through as in Python.  Print the result with json_render_float. */
double clef_round4(double x);

#endif
