/* answer.h — probabilities, answers and the response envelope (SPEC.md §8),
 * matching `systemone()` / `systemone_answer` in joint_schema_model.py.
 */
#ifndef CLEF_DECISION_ANSWER_H
#define CLEF_DECISION_ANSWER_H

#include "decision/record.h"
#include "decision/request.h"
#include "util/buf.h"

/* Per-question softmax in f32 over `logits` (layout of clef_head_forward)
 * into `probs` (same layout). */
void clef_softmax_per_question(const clef_record *rec, const float *logits, float *probs);

/* Append the response JSON to `out`:
 *   {"model":...,"answers":{...},"usage":{"input_tokens":N,"output_tokens":0}}
 * Answers follow SPEC §8 (choice argmax/probabilities in request criteria
 * order, score expectation in double, Python round(x, 4) + repr).
 * With `debug`, a top-level "debug" object follows "usage": {"input_ids":[...],
 * "questions":[{"id","question_span":[s,e],"option_spans":[[s,e],...],
 * "option_ids":[...encoding order],"logits":[...unrounded, encoding order]}]}. */
void clef_render_response(const clef_request *req, const clef_record *rec, const float *logits, int debug,
                          clef_buf *out);

/* Append the error body {"error":{"message":...,"type":...,"param":...|null}}. */
void clef_render_error(const clef_err *err, clef_buf *out);

/* Python round(x, 4) of a double (correctly rounded on the exact binary
 * value, ties to even). */
double clef_round4(double x);

#endif
