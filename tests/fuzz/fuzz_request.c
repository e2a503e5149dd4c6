/* fuzz_request.c — libFuzzer target over what a connection thread of
 * `clef serve` does with an untrusted body: parse + validate
 * (clef_request_parse, SPEC.md §2.2) and encode (clef_encode_record, §3.4)
 * with the real tokenizer, plus the error body.  Build and run with
 * `make fuzz` (clang -fsanitize=fuzzer,address,undefined); the corpus is
 * seeded from the golden requests by seed_corpus.c.
 *
 * Besides memory errors and crashes it checks the invariants the server
 * relies on: a refusal is a 4xx with a type and a message, never 500; its
 * error body is valid JSON; an accepted record fits its token budget and
 * every span lies inside it, non-empty. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decision/answer.h"
#include "decision/encode.h"
#include "decision/request.h"
#include "json/json.h"
#include "text/tokenizer.h"
#include "fuzz_check.h"

#ifndef CLEF_FIXTURES
#define CLEF_FIXTURES "tests/fixtures"
#endif

static clef_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    clef_err err;
    clef_err_clear(&err);
    tok = clef_tokenizer_load(CLEF_FIXTURES "/tiny-clef-omni/tokenizer.json", &err);
    if (!tok) {
        fprintf(stderr, "fuzz_request: cannot load the tokenizer: %s\n", err.message);
        exit(1);
    }
    return 0;
}

/* A client mistake: 4xx with a type, a message, and a JSON error body. */
static void check_refusal(const clef_err *err) {
    CHECK(err->status == 400 || err->status == 422);
    CHECK(err->type != NULL);
    CHECK(err->message[0] != '\0');
    clef_buf body = {0};
    clef_render_error(err, &body);
    clef_err perr;
    json_value *v = json_parse(body.data, body.len, &perr);
    CHECK(v != NULL);
    json_free(v);
    clef_buf_free(&body);
}

static void check_record(const clef_record *rec, size_t max_length) {
    CHECK(rec->n_ids > 0 && rec->n_ids <= max_length);
    for (size_t q = 0; q < rec->n_questions; q++) {
        const clef_record_question *rq = &rec->questions[q];
        CHECK(rq->question.start < rq->question.end && (size_t)rq->question.end <= rec->n_ids);
        CHECK(rq->n_options > 0);
        for (size_t o = 0; o < rq->n_options; o++)
            CHECK(rq->options[o].start < rq->options[o].end && (size_t)rq->options[o].end <= rec->n_ids);
    }
}

static void encode(const clef_request *req, size_t max_length, int truncate) {
    clef_record rec;
    clef_err err;
    clef_err_clear(&err);
    if (clef_encode_record(tok, req, max_length, truncate, &rec, &err) == 0) {
        CHECK(rec.n_questions == req->n_questions);
        check_record(&rec, max_length);
        clef_record_free(&rec);
    } else {
        check_refusal(&err);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    clef_limits lim = clef_limits_default();
    clef_request req;
    clef_err err;
    clef_err_clear(&err);
    if (clef_request_parse((const char *)data, size, &lim, &req, &err) != 0) {
        check_refusal(&err);
        return 0;
    }
    CHECK(req.n_questions >= 1 && req.n_questions <= lim.max_questions);
    encode(&req, CLEF_DEFAULT_MAX_LENGTH, 0); /* the server's default: refuse cuts */
    encode(&req, 300, 1);                     /* the reference's cut, a small window */
    clef_request_free(&req);
    return 0;
}
