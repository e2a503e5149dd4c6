/* encode.h — record encoding (SPEC.md §3): per-piece tokenization of the
 * prompt, question/option spans, the state cut.  Matches `encode_record` in
 * Cloudflare's joint_schema_model.py.
 */
#ifndef CLEF_DECISION_ENCODE_H
#define CLEF_DECISION_ENCODE_H

#include <stddef.h>

#include "decision/record.h"
#include "decision/request.h"
#include "text/tokenizer.h"
#include "util/err.h"

#define CLEF_DEFAULT_MAX_LENGTH 64000

/* Encode `req` into `out` (SPEC §3.4).
 *   max_length:     token budget (default CLEF_DEFAULT_MAX_LENGTH)
 *   truncate_state: 1 = cut the state's tail to fit (reference behaviour);
 *                   0 = refuse an over-long record with 422
 *                   "maximum context length: record requires <total> tokens; maximum is <max_length>",
 *                   or, when the state was so long that tokenizing stopped as soon
 *                   as it was certain not to fit (clef_tokenize_bounded),
 *                   "maximum context length: record requires more than <n> tokens; maximum is <max_length>"
 *                   with n >= max_length a lower bound
 * The state is tokenized last and only as far as needed: a refusal stops
 * once the record certainly exceeds max_length (a 16 MiB state is refused
 * from its byte count at once), and a cut stops after its first
 * max_length - fixed ids; out->state_tokens is then the count where it
 * stopped (> state_tokens_kept), not necessarily the whole state's.
 * Errors: 422 capacity_exceeded "maximum context length: schema requires
 * <fixed> tokens before state; maximum is <max_length>"; 422
 * "<id>: question instructions render to no tokens; give non-empty
 * instructions or a non-empty question id" (param questions.<id>.instructions;
 * the empty id, the one that can produce it, is named "" with param
 * "questions") for an empty question span (SPEC §2.2 rule 12).
 * With media (req->media non-empty) the media block follows PREFIX and counts
 * toward `fixed`; the record gets media_start/media_len and the 3-D positions
 * (422 if the state or schema text holds pad/<|audio_start|> marker tokens,
 * which the reference cannot encode either). */
int clef_encode_record(const clef_tokenizer *tok, const clef_request *req, size_t max_length, int truncate_state,
                       clef_record *out, clef_err *err);

#endif
