/* encode.c — record encoding (SPEC.md §3), reproducing `encode_record` of
 * Cloudflare's joint_schema_model.py.
 *
 * Every piece is tokenized on its own and the id lists are concatenated
 * (SPEC §3.2): tokenizing the prompt as one string would merge tokens across
 * piece boundaries and change the ids the model was trained on.
 */
#include "decision/encode.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json/json.h"
#include "media/prompt.h"
#include "util/buf.h"

/* Constant strings of SPEC §3.1. */
#define SYSTEM_TEXT                                                                                                \
    "Read the complete state and schema. Decide every field jointly. Each answer must be exactly one of that "   \
    "field's allowed options."
static const char PREFIX[] = "<|im_start|>system\n" SYSTEM_TEXT "<|im_end|>\n<|im_start|>user\nSTATE:\n";
static const char SCHEMA_HEAD[] = "\n\nSCHEMA FIELDS:\n";
static const char OPTIONS_HEAD[] = "\nALLOWED OPTIONS:\n";
static const char OPTION_TAIL[] = "\n";
static const char FIELD_TAIL[] = "END FIELD\n";
static const char SUFFIX[] =
    "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:";

static const char *const type_names[] = {"noul", "choice", "score"};

static int tok_bytes(const clef_tokenizer *tok, const char *s, size_t n, clef_ids *out, clef_err *err) {
    return clef_tokenize(tok, s, n, out, err);
}

static int tok_buf(const clef_tokenizer *tok, const clef_buf *b, clef_ids *out, clef_err *err) {
    return clef_tokenize(tok, b->data ? b->data : "", b->len, out, err);
}

/* render(v) of SPEC §3.2: a JSON string's raw characters, otherwise the
 * compact key-sorted JSON text. */
static void render_value(const json_value *v, clef_buf *out) {
    if (v->type == JSON_STRING)
        clef_buf_append(out, v->str, v->len);
    else
        json_render(v, out);
}

/* Instructions, or the question id when they are missing, null or "".  Other
 * falsy values (0, false, [], {}) are kept and rendered (SPEC §3.4 1.2.2), so
 * this is not a truthiness test. */
static void render_instructions(const clef_question *q, clef_buf *out) {
    const json_value *v = q->instructions;
    if (!v || v->type == JSON_NULL || (v->type == JSON_STRING && v->len == 0))
        clef_buf_append(out, q->id, q->id_len);
    else
        render_value(v, out);
}

/* The option JSON {"description": d, "option_id": id} with keys sorted
 * ("description" < "option_id"); description omitted when NULL. */
static void render_option_sem(const clef_option *o, clef_buf *out) {
    clef_buf_putc(out, '{');
    if (o->description) {
        clef_buf_puts(out, "\"description\":");
        json_render(o->description, out);
        clef_buf_putc(out, ',');
    }
    clef_buf_puts(out, "\"option_id\":");
    json_render_string(o->id, o->id_len, out);
    clef_buf_putc(out, '}');
}

/* Append one question's field block to the schema ids `S`; spans are
 * relative to the start of S.  Fills `rq` (options allocated here). */
static int encode_field(const clef_tokenizer *tok, const clef_question *q, size_t k, clef_ids *S,
                        clef_record_question *rq, clef_buf *scratch, clef_err *err) {
    scratch->len = 0;
    clef_buf_printf(scratch, "\nFIELD %zu\nID: ", k);
    clef_buf_append(scratch, q->id, q->id_len);
    clef_buf_printf(scratch, "\nTYPE: %s\nINSTRUCTION: ", type_names[q->type]);
    if (tok_buf(tok, scratch, S, err)) return -1;

    rq->type = q->type;
    rq->question.start = (int32_t)S->n;
    scratch->len = 0;
    render_instructions(q, scratch);
    if (tok_buf(tok, scratch, S, err)) return -1;
    rq->question.end = (int32_t)S->n;

    if (tok_bytes(tok, OPTIONS_HEAD, sizeof OPTIONS_HEAD - 1, S, err)) return -1;
    rq->n_options = q->n_options;
    rq->options = clef_xcalloc(q->n_options ? q->n_options : 1, sizeof *rq->options);
    for (size_t j = 0; j < q->n_options; j++) {
        scratch->len = 0;
        clef_buf_printf(scratch, "OPTION %zu: ", j + 1);
        if (tok_buf(tok, scratch, S, err)) return -1;
        rq->options[j].start = (int32_t)S->n;
        scratch->len = 0;
        render_option_sem(&q->options[j], scratch);
        if (tok_buf(tok, scratch, S, err)) return -1;
        rq->options[j].end = (int32_t)S->n;
        if (tok_bytes(tok, OPTION_TAIL, sizeof OPTION_TAIL - 1, S, err)) return -1;
    }
    return tok_bytes(tok, FIELD_TAIL, sizeof FIELD_TAIL - 1, S, err);
}

/* Schema ids S (SPEC §3.4 step 1) and the record's question table. */
static int encode_schema(const clef_tokenizer *tok, const clef_request *req, clef_ids *S, clef_record *out,
                         clef_err *err) {
    if (tok_bytes(tok, SCHEMA_HEAD, sizeof SCHEMA_HEAD - 1, S, err)) return -1;
    out->n_questions = req->n_questions;
    out->questions = clef_xcalloc(req->n_questions ? req->n_questions : 1, sizeof *out->questions);
    clef_buf scratch = {0};
    int rc = 0;
    for (size_t i = 0; i < req->n_questions && rc == 0; i++)
        rc = encode_field(tok, &req->questions[i], i + 1, S, &out->questions[i], &scratch, err);
    clef_buf_free(&scratch);
    return rc;
}

/* SPEC §2.2 rule 12: an empty question span would pool over nothing (NaN in
 * the reference, spread to every question by the head's self-attention). */
static int check_question_spans(const clef_request *req, const clef_record *rec, clef_err *err) {
    for (size_t i = 0; i < rec->n_questions; i++) {
        if (rec->questions[i].question.start != rec->questions[i].question.end) continue;
        char param[CLEF_ERR_PARAM_MAX];
        const char *id = req->questions[i].id;
        return clef_fail(err, 422, CLEF_E_REQUEST, clef_question_param(param, sizeof param, id, "instructions"),
                         "%s: question instructions render to no tokens; give non-empty instructions or a non-empty "
                         "question id",
                         clef_question_name(id));
    }
    return 0;
}

static void shift_spans(clef_record *rec, int32_t off) {
    for (size_t i = 0; i < rec->n_questions; i++) {
        clef_record_question *q = &rec->questions[i];
        q->question.start += off;
        q->question.end += off;
        for (size_t j = 0; j < q->n_options; j++) {
            q->options[j].start += off;
            q->options[j].end += off;
        }
    }
}

/* Pieces P (prefix + media), T (state), S (schema), X (suffix); the media
 * block is P[prefix_n, P.n). */
typedef struct pieces {
    clef_ids P, T, S, X;
    size_t prefix_n;
} pieces;

static void pieces_free(pieces *p) {
    clef_ids_free(&p->P);
    clef_ids_free(&p->T);
    clef_ids_free(&p->S);
    clef_ids_free(&p->X);
}

/* P, S and X: everything but the state. */
static int tokenize_fixed(const clef_tokenizer *tok, const clef_request *req, pieces *p, clef_record *out,
                          clef_err *err) {
    if (encode_schema(tok, req, &p->S, out, err)) return -1;
    if (tok_bytes(tok, PREFIX, sizeof PREFIX - 1, &p->P, err)) return -1;
    p->prefix_n = p->P.n;
    /* SPEC §3.4 step 2: the media placeholders, one piece, pads expanded (§9). */
    if (clef_media_prompt_ids(tok, &req->media, &p->P, err)) return -1;
    return tok_bytes(tok, SUFFIX, sizeof SUFFIX - 1, &p->X, err);
}

/* Capacity (rule 10), then the state T, cut (rule 11) or refused: sets how
 * many state tokens are kept.  The state is tokenized only as far as it
 * must be (clef_tokenize_bounded): once it certainly needs more than the room
 * left, a refusal stops there and says "more than N" (N a lower bound), and
 * a cut stops with the exact first `room` ids in T. */
static int tokenize_state(const clef_tokenizer *tok, const clef_request *req, pieces *p, size_t max_length,
                          int truncate_state, size_t *kept, size_t *state_tokens, clef_err *err) {
    size_t fixed = p->P.n + p->S.n + p->X.n;
    if (fixed > max_length)
        return clef_fail(err, 422, CLEF_E_CAPACITY, "questions",
                         "maximum context length: schema requires %zu tokens before state; maximum is %zu", fixed,
                         max_length);
    size_t room = max_length - fixed, n = 0;
    clef_buf state = {0};
    render_value(req->state, &state);
    int rc = clef_tokenize_bounded(tok, state.data ? state.data : "", state.len, room, truncate_state, &p->T, &n, err);
    clef_buf_free(&state);
    if (rc < 0) return -1;
    if (n > room && !truncate_state) {
        if (rc == 1) /* stopped early: n is a lower bound */
            return clef_fail(err, 422, CLEF_E_CAPACITY, "state",
                             "maximum context length: record requires more than %zu tokens; maximum is %zu",
                             fixed + n - 1, max_length);
        return clef_fail(err, 422, CLEF_E_CAPACITY, "state",
                         "maximum context length: record requires %zu tokens; maximum is %zu", fixed + n, max_length);
    }
    /* The reference keeps the head of the state: T[0 : max_length - fixed]. */
    *kept = n < room ? n : room;
    *state_tokens = n;
    return 0;
}

/* 3-D M-RoPE positions of a record with media (SPEC §9 "3-D positions"). */
static int media_positions(const clef_tokenizer *tok, const clef_request *req, clef_record *rec, clef_err *err) {
    clef_media_tokens t;
    if (clef_media_tokens_resolve(tok, &t, err)) return -1;
    rec->positions = clef_xmalloc(3 * rec->n_ids * sizeof *rec->positions);
    return clef_media_positions(rec->input_ids, rec->n_ids, rec->media_start, rec->media_len, &req->media, &t,
                                rec->positions, err);
}

int clef_encode_record(const clef_tokenizer *tok, const clef_request *req, size_t max_length, int truncate_state,
                       clef_record *out, clef_err *err) {
    memset(out, 0, sizeof *out);
    if (max_length == 0 || max_length > INT32_MAX)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "max_length %zu is out of range", max_length);
    pieces p = {0};
    size_t kept = 0, state_tokens = 0;
    if (tokenize_fixed(tok, req, &p, out, err) ||
        tokenize_state(tok, req, &p, max_length, truncate_state, &kept, &state_tokens, err) ||
        check_question_spans(req, out, err)) {
        pieces_free(&p);
        clef_record_free(out);
        return -1;
    }
    out->state_tokens = state_tokens;
    out->state_tokens_kept = kept;
    out->n_ids = p.P.n + kept + p.S.n + p.X.n;
    out->input_ids = clef_xmalloc(out->n_ids * sizeof *out->input_ids);
    int32_t *dst = out->input_ids;
    const clef_ids *parts[4] = {&p.P, &p.T, &p.S, &p.X};
    size_t counts[4] = {p.P.n, kept, p.S.n, p.X.n};
    for (size_t i = 0; i < 4; i++) {
        if (counts[i]) memcpy(dst, parts[i]->v, counts[i] * sizeof *dst);
        dst += counts[i];
    }
    shift_spans(out, (int32_t)(p.P.n + kept));
    out->media_start = p.prefix_n;
    out->media_len = p.P.n - p.prefix_n;
    pieces_free(&p);
    if (out->media_len && media_positions(tok, req, out, err)) {
        clef_record_free(out);
        return -1;
    }
    return 0;
}
