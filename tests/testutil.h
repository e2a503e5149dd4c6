/* testutil.h — helpers shared by the cmocka test programs. */
#ifndef CLEF_TESTS_TESTUTIL_H
#define CLEF_TESTS_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "decision/record.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "json/json.h"
#include "media/media.h"
#include "util/buf.h"
#include "model/model.h"
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

/* The records of golden cases cases[pick[0..n)] (tu_record_from_golden into
 * r[0..n)) packed back to back for one thinker forward: seg[0..n] are the
 * record boundaries; returns the packed ids [seg[n]] (caller frees; each
 * r[i] is released with clef_record_free). */
int32_t *tu_pack_goldens(json_value *const *cases, const size_t *pick, size_t n, clef_record *r, size_t *seg);

/* Decode the images / audio / videos of golden case `c`'s request into `m`
 * (default limits) and, when `preprocess`, build its tensors; fails the test
 * naming the case and the stage on error.  Caller frees with clef_media_free. */
void tu_media_from_golden(const json_value *c, clef_media *m, int preprocess);

/* Path under the fixtures directory (static buffer per call site is not
 * needed: returns a heap string the caller frees). */
char *tu_fixture(const char *rel);
/* Open the checkpoint at fixtures path `rel` into *ck; on failure print
 * "checkpoint <rel>: <reason>" to stderr and return -1 (for cmocka group
 * setups, which report by returning -1), else 0. */
int tu_open_fixture(const char *rel, clef_checkpoint *ck);

/* Element `i` of a JSON array of integers as int64 (fails the test otherwise). */
int64_t tu_int_at(const json_value *arr, size_t i);
/* Element `i` of a JSON array of numbers as double. */
double tu_num_at(const json_value *arr, size_t i);

/* ---- backend op tests (test_cuda_*.c, test_cpu_ops.c) ---------------------
 * Backend-agnostic: only the op table of backend/backend.h is used, so these
 * compile without CUDA. */

/* Skip the current cmocka test, printing "  no CUDA device: skipped", when
 * the group fixture in *state is NULL (the GPU tests' setup leaves it NULL
 * when clef_cuda_device_count() is 0). */
#define TU_NEED_GPU(state)                                                                                             \
    do {                                                                                                               \
        if (!*(state)) {                                                                                               \
            printf("  no CUDA device: skipped\n");                                                                     \
            skip();                                                                                                    \
        }                                                                                                              \
    } while (0)

/* Fail the test with "op failed: <status> <message>" when a backend op
 * returned rc != 0 (err is the clef_err it filled). */
void tu_ok(int rc, const clef_err *err);

/* Next value of the xorshift64 generator (13, 7, 17) whose state is *state
 * (nonzero; each test program keeps its own seed, so its inputs are fixed). */
uint64_t tu_rand_u64(uint64_t *state);

/* Uniform float in [-1, 1) from the top 53 bits of tu_rand_u64(state). */
float tu_rand_f32(uint64_t *state);

/* Heap array of n floats tu_rand_f32(state) * scale (caller frees; n = 0
 * gives a 1-element allocation). */
float *tu_rand_vec(uint64_t *state, size_t n, float scale);

/* Device copy of `bytes` host bytes on backend g (ops->alloc of at least 4
 * bytes, then ops->upload); fails the test on error.  Caller frees with
 * g->ops->free. */
void *tu_dput(clef_backend *g, const void *h, size_t bytes);

/* Device buffer of n floats (f32) filled with NaN, for op outputs: an
 * element the op forgot to write then fails the comparison.  Caller frees
 * with g->ops->free; fails the test on error. */
float *tu_dnan(clef_backend *g, size_t n);

/* Host copy (malloc'd, caller frees) of n floats at device pointer d of
 * backend g (ops->download); fails the test on error. */
float *tu_dget(clef_backend *g, const float *d, size_t n);

/* Relative L2 error ||got - want|| / ||want|| of n floats, in double
 * (the absolute norm ||got - want|| when want is all zero); NaN when any
 * element of got is not finite. */
double tu_rel_l2(const float *got, const float *want, size_t n);

/* Compare got with the reference want (n floats) by tu_rel_l2 and print
 *   "  <what> <be> rel L2 <r>  (tol <tol>, <n> values)"
 * with `what` left-justified in what_w columns and `be` (the backend or
 * mode label; NULL leaves the column out) in be_w columns.  Fails the test
 * when r > tol or r is NaN.  Returns r. */
double tu_check_rel(const char *what, int what_w, const char *be, int be_w, const float *got, const float *want,
                    size_t n, double tol);

/* First step of a GPU test group's setup: sets *state = NULL, prints
 * "  CUDA devices: <n>" and returns n = clef_cuda_device_count() (0 in a
 * build without CUDA: the setup then returns 0 leaving *state NULL, and
 * TU_NEED_GPU skips every test of the group). */
int tu_cuda_devices(void **state);

/* Print "  device: <clef_cuda_describe(be)>" (name, memory, compute
 * capability of the CUDA backend `be`). */
void tu_print_cuda_device(clef_backend *be);

/* clef_cuda_backend_create_ex(o) with CUDA settings given for this one
 * backend: env holds NAME, VALUE pairs ended by a NULL name (a NULL value
 * leaves that setting as the environment has it).  Kernel switches
 * (CLEF_CUDA_WGMMA, ... : backend/cuda/cuda_env.h) start from this test
 * program's environment and go to the backend as o->knobs (unless o sets
 * knobs); any other variable (a user setting) is set while the backend is
 * made and put back to its previous value, or unset, afterwards.  NULL + err
 * when creation fails. */
clef_backend *tu_cuda_backend_env(const clef_cuda_options *o, const char *const *env, clef_err *err);
/* An empty settings list for tu_cuda_backend_env: the kernel switches of this program's environment. */
#define TU_NO_ENV ((const char *const[]){NULL})

/* Thinker prefill + joint schema head over one record on model m (hidden
 * size H): returns the heap array of clef_record_total_options(r) option
 * logits (caller frees), or NULL with err filled when a forward fails. */
float *tu_run_record(clef_model *m, const clef_record *r, size_t H, clef_err *err);

/* Run shell command `cmd` through popen and collect what it prints on stdout
 * (add "2>&1" or "exec 2>&1;" to the command for stderr) into `out`, which
 * is reset first and always NUL-terminated (the NUL not counted in len).
 * Returns the exit status, -1 - signal when it was killed, -100 otherwise;
 * fails the test when the command cannot be started. */
int tu_run_cmd(const char *cmd, clef_buf *out);

#endif
