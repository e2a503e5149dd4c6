/* eval.h — answer the Decision Index kit's rows through the engine and write
 * the kit's results (`clef eval`).
 *
 * Input: ROWS, one JSON object a line (plain or gzip-compressed; blank lines
 * are skipped), each with `state`, `questions` and `_evaluation` (an object
 * with at least `run_id`).  Rows carry no `model`: each is sent as exactly
 * {"model": <model_name>, "state", "questions"}, as the kit's HTTP engine
 * sends it (other fields of the row are never seen by the engine).
 *
 * Output, in DIR:
 *   results.jsonl  one line per answered row, in row order:
 *                    the `_evaluation` fields (in their order), then "line"
 *                    (1-based line of the row in ROWS), "engine",
 *                    "started_utc", "completed_utc" (ISO 8601, +00:00),
 *                    "total_wall_ms" (row parsed -> answer checked),
 *                    "model_request_wall_ms" (time in the scheduler: queue
 *                    wait + the packed forward), "status", and "response"
 *                    (the SystemOne response: model, answers, usage) for
 *                    "ok", else "error" ({"message","type","param"}).
 *                  status: "ok"; "unsupported" for a capacity refusal
 *                  (check.h: clef_eval_unsupported); "error" for anything
 *                  else (malformed row, invalid request, an answer failing
 *                  the kit's checks, a forward failure).  No row stops the run.
 *   status.json    the last progress event (clef_eval_write_status).
 * (environment.json is the caller's: the CLI writes it.)
 *
 * Rows are answered as the server answers requests: worker threads parse
 * and encode (clef_engine_parse / clef_engine_encode with truncation off
 * unless asked, as the Index requires), hand the record to a scheduler
 * (engine/scheduler.h) whose engine thread packs the waiting records into
 * one forward, and render and check the answer; up to `in_flight` rows are
 * in the engine at once so batches pack.  Answers are bitwise what each row
 * gets alone (clef decide).
 *
 * Resume: a row's identity is its `_evaluation.run_id` (compared as JSON:
 * "7" and 7 differ), as in the kit's runner.  When DIR/results.jsonl exists,
 * a row whose run_id already has a result with a status other than "error"
 * is skipped (not recomputed); the last line of a run_id wins.  Error rows
 * (and rows without a readable run_id, which are always errors) are answered
 * again and their new line appended.  A last line without its newline (a
 * killed run) is cut off first; other lines that are not JSON objects with a
 * run_id and a status are ignored (counted in `unreadable_results`).
 */
#ifndef CLEF_EVAL_EVAL_H
#define CLEF_EVAL_EVAL_H

#include <stddef.h>

#include "engine/engine.h"
#include "util/buf.h"
#include "util/err.h"

#define CLEF_EVAL_DEFAULT_IN_FLIGHT 64
#define CLEF_EVAL_DEFAULT_MAX_ROW_BYTES ((size_t)256 << 20)
#define CLEF_EVAL_DEFAULT_MODEL_NAME "clef-omni"
#define CLEF_EVAL_ENGINE_NAME "clef"

/* Where a run stands; passed to the progress callback and written to
 * status.json.  Counts are rows of ROWS (skipped ones included). */
typedef struct clef_eval_progress {
    const char *event;        /* "loading", "ready", "progress", "complete" or "failed" (static) */
    size_t total;             /* non-blank lines of ROWS (0 while loading) */
    size_t skipped;           /* rows whose earlier result was kept (resume) */
    size_t answered;          /* rows answered by this run */
    size_t ok, unsupported, error; /* statuses of every row with a result: kept + this run */
    size_t violations;        /* of this run's rows, answers that failed the kit's checks (status error) */
    size_t unreadable_results; /* earlier result lines that could not be read (ignored) */
    size_t batches;           /* packed forwards run */
    size_t batch_records;     /* records in them (sum) */
    size_t batch_tokens;      /* tokens in them (sum) */
    double elapsed_s;         /* since the run started (after loading) */
    double rows_per_s;        /* answered / elapsed_s */
    double eta_s;             /* rows left / rows_per_s; -1 when unknown */
    const char *failure;      /* "failed": why (borrowed), else NULL */
} clef_eval_progress;

typedef struct clef_eval_options {
    const char *rows_path;     /* ROWS (.jsonl or .jsonl.gz; the bytes decide) */
    const char *out_dir;       /* DIR; created when missing (its parent must exist) */
    const char *model_name;    /* "model" sent with each row; NULL = CLEF_EVAL_DEFAULT_MODEL_NAME */
    size_t in_flight;          /* rows in the engine at once (worker threads); 0 = CLEF_EVAL_DEFAULT_IN_FLIGHT */
    size_t max_batch_tokens;   /* tokens per packed forward; 0 = the scheduler's default */
    size_t max_row_bytes;      /* a longer line is an error row; 0 = CLEF_EVAL_DEFAULT_MAX_ROW_BYTES */
    int truncate_state;        /* 0 = refuse over-long records (unsupported, the Index's rule); 1 = cut */
    /* Called on the calling thread after each result line is written and at
     * the end (event "complete" or "failed"); may be NULL. */
    void (*on_progress)(void *ctx, const clef_eval_progress *p);
    void *ctx;
    double status_every_s;     /* status.json is rewritten at most this often while running; 0 = 1 s */
} clef_eval_options;

/* Run the rows of o->rows_path through `e` (borrowed) into o->out_dir.
 * Returns 0 when every row of ROWS has a result (whatever its status), with
 * *final (may be NULL) the last progress.  Returns -1 + err (500) when the run
 * cannot go on: ROWS unreadable or its gzip stream truncated or damaged
 * (the rows before the damage are answered and written first), DIR or its
 * files not writable.  status.json then holds the "failed" event. */
int clef_eval_run(clef_engine *e, const clef_eval_options *o, clef_eval_progress *final, clef_err *err);

/* Write `p` as DIR/status.json (atomically: a temporary file renamed over it):
 * {"time","event","engine","completed","total","counts":{"ok","unsupported",
 * "error"},"skipped","answered","violations","elapsed_seconds","rows_per_s",
 * "eta_seconds"(null when unknown),"batches","mean_batch_records",
 * "mean_batch_tokens"[,"error"]}.  Returns 0 or -1 + err (500). */
int clef_eval_write_status(const char *out_dir, const clef_eval_progress *p, clef_err *err);

/* Write `len` bytes of `text` to DIR/<name> atomically (temporary + rename).
 * Returns 0 or -1 + err (500, naming the file and the reason). */
int clef_eval_write_file(const char *out_dir, const char *name, const char *text, size_t len, clef_err *err);

/* Create `dir` and every missing parent (mkdir -p).  Returns 0 (also when it
 * exists) or -1 + err (500: a component cannot be created or is not a
 * directory). */
int clef_eval_make_dir(const char *dir, clef_err *err);

/* "2026-12-01T10:11:12.123456+00:00" (Python datetime.isoformat() of UTC
 * now) into out[0..cap), cap >= 33. */
void clef_eval_utc_now(char *out, size_t cap);

#endif
