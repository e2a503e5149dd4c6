/* record.h — one encoded record: the token ids of a request and the spans the
 * joint schema head pools over (SPEC.md §3.4).  Produced by decision/encode,
 * consumed by model/head and decision/answer.
 */
#ifndef CLEF_DECISION_RECORD_H
#define CLEF_DECISION_RECORD_H

#include <stddef.h>
#include <stdint.h>

/* Question types; the value is also the row of `type_embedding` (SPEC §7.2). */
typedef enum clef_qtype { CLEF_NOUL = 0, CLEF_CHOICE = 1, CLEF_SCORE = 2 } clef_qtype;

/* Half-open [start, end) index range into clef_record.input_ids. */
typedef struct clef_span {
    int32_t start;
    int32_t end;
} clef_span;

typedef struct clef_record_question {
    clef_qtype type;
    clef_span question;  /* rendered-instructions tokens */
    size_t n_options;
    clef_span *options;  /* rendered option-JSON tokens, ENCODING order (SPEC §3.3) */
} clef_record_question;

typedef struct clef_record {
    int32_t *input_ids;  /* [n_ids], owned */
    size_t n_ids;
    size_t n_questions;
    clef_record_question *questions;  /* [n_questions], request order, owned */
    size_t state_tokens;       /* tokens of the rendered state before any cut; when it was cut, at least
                                  state_tokens_kept + 1 (tokenizing stops there, decision/encode.h) */
    size_t state_tokens_kept;  /* tokens of the state kept in input_ids */
    /* Media (SPEC §9), set only when the request carries images/audio/videos: */
    size_t media_start, media_len; /* the media block input_ids[media_start, +media_len), right after PREFIX;
                                      its <|image_pad|>/<|video_pad|>/<|audio_pad|> rows take the tower
                                      outputs in sequence order (no pad ids occur outside it) */
    int32_t *positions;  /* [3][n_ids] M-RoPE positions (T, H, W) from get_rope_index, owned;
                            NULL = text-only, positions 0..n_ids-1 on every axis */
} clef_record;

/* Total options over all questions (the length of the head's logit vector). */
size_t clef_record_total_options(const clef_record *r);
void clef_record_free(clef_record *r);

#endif
