/* testutil.h — helpers shared by the cmocka test programs. */
#ifndef CLEF_TESTS_TESTUTIL_H
#define CLEF_TESTS_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "decision/record.h"
#include "engine/engine.h"
#include "json/json.h"
#include "media/media.h"
#include "text/tokenizer.h"

/* Read a whole file into a NUL-terminated heap buffer (caller frees); fails
 * the test if it cannot. `len` may be NULL. */
char *tu_read_file(const char *path, size_t *len);

/* Read a JSON-lines file: returns an array of parsed documents (caller frees
 * each with json_free and the array with free); fails the test on error. */
json_value **tu_read_jsonl(const char *path, size_t *n);

/* tu_read_jsonl for a gzip-compressed JSON-lines file (the multimodal
 * goldens ship as .jsonl.gz); same ownership, fails the test on error. */
json_value **tu_read_jsonl_gz(const char *path, size_t *n);

/* The golden cases of fixture file `rel` (e.g. "goldens/goldens.jsonl" or
 * "goldens/mm_goldens.jsonl.gz": a name ending in .gz is read through zlib),
 * one parsed document per case.  Release with tu_free_goldens. */
json_value **tu_load_goldens(const char *rel, size_t *n);

/* Free the `n` documents of tu_load_goldens / tu_read_jsonl and the array. */
void tu_free_goldens(json_value **cases, size_t n);

/* A golden case's "name" string (borrowed from the case). */
const char *tu_case_name(const json_value *c);

/* The tiny checkpoint's tokenizer (fixtures tiny-clef-omni/tokenizer.json);
 * caller frees with clef_tokenizer_free; fails the test if it cannot load. */
clef_tokenizer *tu_load_tokenizer(void);

/* Open an engine on checkpoint `dir` with `truncate_state` (0/1) and
 * `n_threads` (0 = default); fails the test naming `dir` if it cannot.
 * Caller closes with clef_engine_close. */
clef_engine *tu_open_engine(const char *dir, int truncate_state, int n_threads);

/* The golden question with id `qid` of case `c` (borrowed); fails the test
 * when there is none. */
const json_value *tu_golden_question(const json_value *c, const char *qid);

/* Group fixture of the text golden tests: the tiny tokenizer and the 49
 * cases of goldens/goldens.jsonl (all owned). */
typedef struct tu_golden_fixture {
    clef_tokenizer *tok;
    json_value **cases;
    size_t n_cases;
} tu_golden_fixture;

/* cmocka group setup / teardown that create / free a tu_golden_fixture in
 * *state (setup fails the test if the tokenizer or goldens cannot load). */
int tu_golden_fixture_setup(void **state);
int tu_golden_fixture_teardown(void **state);

/* A record straight from a golden case's input_ids and questions (type,
 * question_span, option_spans in encoding order), without the encoder; no
 * media, positions NULL.  Caller frees with clef_record_free. */
void tu_record_from_golden(const json_value *c, clef_record *r);

/* Decode the images / audio / videos of golden case `c`'s request into `m`
 * (default limits) and, when `preprocess`, build its tensors; fails the test
 * naming the case and the stage on error.  Caller frees with clef_media_free. */
void tu_media_from_golden(const json_value *c, clef_media *m, int preprocess);

/* Path under the fixtures directory (static buffer per call site is not
 * needed: returns a heap string the caller frees). */
char *tu_fixture(const char *rel);

/* Element `i` of a JSON array of integers as int64 (fails the test otherwise). */
int64_t tu_int_at(const json_value *arr, size_t i);
/* Element `i` of a JSON array of numbers as double. */
double tu_num_at(const json_value *arr, size_t i);

#endif
