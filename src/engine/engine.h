/* engine.h — a loaded Clef-Omni model and the decision pipeline over it:
 *   body → decision/request → decision/encode → model/thinker → model/head
 *        → decision/answer → response JSON.
 * The engine owns the checkpoint (mapped weights), the tokenizer and the model
 * bound on a backend.  The CLI and the server only talk to this API.
 */
#ifndef CLEF_ENGINE_ENGINE_H
#define CLEF_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/numerics.h"
#include "decision/encode.h"
#include "decision/request.h"
#include "io/checkpoint.h"
#include "util/buf.h"
#include "util/err.h"

/* Where the vision and audio towers run (clef_engine_options.towers, `--towers cpu|gpu`). */
enum {
    CLEF_TOWERS_DEFAULT = 0, /* on the thinker's backend: the GPU when the device is CUDA, else the CPU */
    CLEF_TOWERS_CPU = 1,     /* on a CPU backend of their own while the thinker runs on its device; their
                                weights are then not on the GPU nor counted in a --gpu-memory budget */
    CLEF_TOWERS_GPU = 2,     /* on the thinker's CUDA device (a CPU device refuses it) */
};

typedef struct clef_engine_options {
    const char *model_dir;   /* checkpoint directory (SPEC §1.1); required unless `synthetic` is set */
    const char *synthetic;   /* NULL, or a synthetic preset ("tiny", "small", "full"; io/synth.h): random
                                weights drawn into memory for `seed` instead of reading model_dir */
    uint64_t seed;           /* seed of the synthetic weights */
    const char *synthetic_quant; /* with `synthetic`: NULL (BF16), or a quantized format ("int4",
                                "fp8-block", "nvfp4", "nvfp4-modelopt"): the preset's experts quantized
                                in memory while drawn, bitwise what `clef quantize` writes
                                (quant/qsynth.h) */
    const char *tokenizer;   /* tokenizer.json path; NULL = <model_dir>/tokenizer.json (required with
                                `synthetic`) */
    const char *device;      /* "cpu", "cuda", "cuda:N"; NULL = automatic: $CLEF_DEVICE when set, else CUDA
                                device 0 when a GPU is present, else the CPU (backend/device.h) */
    int n_threads;           /* CPU threads; <= 0 = all cores */
    clef_numerics numerics;  /* GPU numerics (backend/numerics.h); CLEF_NUMERICS_ENV (0) = the environment,
                                else fast; the CPU computes in f32 whatever it says */
    size_t max_length;       /* token budget per record; 0 = CLEF_DEFAULT_MAX_LENGTH; must not exceed
                                max_position_embeddings */
    int truncate_state;      /* default when the request says nothing: 1 = cut the state (reference,
                                `clef decide`), 0 = refuse over-long records (server default) */
    clef_limits limits;      /* request limits; zeroed = clef_limits_default() */
    int verbose;             /* progress lines on stderr while loading */
    int text_only;           /* 1 = do not bind the media towers (saves their memory, ~2.4 GB of bf16 on
                                the full model); media requests are then refused with 422 */
    size_t state_cache;      /* bytes of the state cache (engine/state_cache.h: cached prefix K/V and
                                hidden rows in the model backend's memory); 0 = off.  Off, with
                                clef_engine_state_cache_off_reason saying why, on a backend whose
                                attention cannot read a cached prefix (CUDA today) */
    size_t gpu_memory;       /* device memory budget in bytes (--gpu-memory; 0 = none: every weight resident).
                                With a budget the engine plans the placement (engine/placement.h) from the
                                checkpoint's shapes: layers whose experts do not fit are streamed from
                                pinned host memory each forward; a budget nothing fits in is a load error
                                saying what would.  Needs a backend that streams (CUDA); else 500 */
    size_t batch_tokens;     /* the largest forward the plan keeps workspace for; 0 =
                                CLEF_SCHED_DEFAULT_MAX_BATCH_TOKENS (pass the scheduler's max_batch_tokens, or
                                max_length for one record a forward).  Under a budget it is also the longest
                                record accepted: the engine's max_length is lowered to it
                                (clef_place_max_record), so a longer record is refused at admission (or its
                                state cut when truncation is asked) */
    unsigned plan_advice;    /* CLEF_PLACE_ADV_* (engine/placement.h): the calling command's flags that a
                                "does not fit" message may suggest */
    int towers;              /* CLEF_TOWERS_DEFAULT, _CPU or _GPU */
} clef_engine_options;

/* The checks of the placement options that need no checkpoint: a
 * --gpu-memory budget or `--towers gpu` with a device that resolves to the
 * CPU (`device` as in clef_engine_options, NULL = automatic), a towers value
 * out of range, a budget's forward past CLEF_PLACE_MAX_TOKENS.  0, or -1 +
 * err (400, param naming the option, a message naming the flag) — what
 * clef_engine_open checks first, before loading anything, and what the CLI
 * calls to make it a usage error (exit 2). */
int clef_engine_check_placement(const char *device, size_t gpu_memory, int towers, size_t batch_tokens,
                                clef_err *err);

typedef struct clef_engine clef_engine;

/* Open the checkpoint, load the tokenizer, bind the model.  Returns NULL with
 * err (500, message naming the file/tensor) on failure. */
clef_engine *clef_engine_open(const clef_engine_options *opt, clef_err *err);
void clef_engine_close(clef_engine *e);

/* The weight placement the engine loaded with (engine/placement.h), or NULL
 * when no --gpu-memory budget was given (everything resident). */
struct clef_place_plan;
const struct clef_place_plan *clef_engine_plan(const clef_engine *e);

/* Per-call settings of clef_engine_decide; NULL = the engine's defaults. */
typedef struct clef_decide_params {
    int debug;          /* 1 = add the debug block of answer.h */
    size_t max_length;  /* 0 = the engine's; larger than the engine's is clamped to it */
    int truncate_state; /* -1 = the engine's default; 0/1 override it (a request's own
                           "truncate_state" field still wins) */
} clef_decide_params;

/* Answer one SystemOne request body.  On success appends the response JSON
 * (SPEC §8) to `out` and returns 0.  On a rejected request returns -1 with err
 * holding status/type/message/param (SPEC §2.2); nothing is appended.
 * Thread-safe (forwards are serialised). */
int clef_engine_decide(clef_engine *e, const char *body, size_t len, const clef_decide_params *params, clef_buf *out,
                       clef_err *err);

/* ---- The pieces of clef_engine_decide, for callers that schedule forwards
 * themselves (the HTTP server parses and encodes on connection threads and
 * packs several records into one forward on an engine thread). ----------- */

/* One request on its way through the engine: validated, encoded, then
 * answered by a forward pass (alone or packed with other records). */
typedef struct clef_job {
    clef_request req;  /* the validated request, owned */
    clef_record rec;   /* its encoding (ids, spans), owned */
    int debug;         /* 1 = the response carries the debug block of answer.h */
    float *logits;     /* [clef_record_total_options(&rec)] f32 head logits, owned; filled by
                          clef_engine_run (question order, each question's options in
                          encoding order, as clef_head_forward) */
    unsigned char media_digest[32]; /* SHA-256 of the record's media tensors (grids, pixels, log-mel),
                          the state cache's key for them; set by clef_engine_encode when the
                          record has media and the cache is on, else zero */
} clef_job;

/* Parse + validate a body with the engine's limits (SPEC §2.2 rules 2-9).
 * Returns 0 with `req` filled (free with clef_request_free) or -1 + err
 * (400/422, message naming the field).  Media that need a tower the engine
 * does not have (text-only, or a checkpoint without it) are refused with
 * 422 "<field>: media inputs are not available with this checkpoint (<why>)"
 * (or "...has no vision/audio tower") before any payload is decoded, so a
 * malformed payload gets the same answer as a well-formed one. */
int clef_engine_parse(const clef_engine *e, const char *body, size_t len, clef_request *req, clef_err *err);

/* Encode a parsed request into `job` (SPEC §3.4).  Takes ownership of `req`
 * (moved into job->req; freed on error too).  The record's truncation is the
 * request's "truncate_state" if present, else params->truncate_state if >= 0,
 * else the engine's default; max_length as in clef_decide_params.  Returns 0
 * or -1 + err (422 capacity / empty question span).  Free with clef_job_free. */
int clef_engine_encode(const clef_engine *e, clef_request *req, const clef_decide_params *params, clef_job *job,
                       clef_err *err);

/* Run the thinker and the head for `n_jobs` encoded records and fill each
 * job's logits.  The records are packed back to back into one thinker forward
 * (positions restart at 0 per record, attention never crosses records), so
 * each record's logits are bitwise those of running it alone.  If the packed
 * forward fails (e.g. workspace too large) each record is retried alone, so
 * one record's failure never fails the others.  errs[i] (cleared first) holds
 * job i's error; returns 0 when every job succeeded, else -1.
 * Thread-safe (forwards are serialised). */
int clef_engine_run(clef_engine *e, clef_job *const *jobs, size_t n_jobs, clef_err *errs);

/* Append the response JSON (SPEC §8) of a job whose logits are filled. */
void clef_engine_render(const clef_job *job, clef_buf *out);

/* Free a job's request, record and logits; leaves it zeroed.  Safe on a zeroed job. */
void clef_job_free(clef_job *job);

/* The tokenizer / checkpoint / config the engine loaded (borrowed). */
const struct clef_tokenizer *clef_engine_tokenizer(const clef_engine *e);
const clef_checkpoint *clef_engine_checkpoint(const clef_engine *e);
struct clef_model *clef_engine_model(clef_engine *e);
size_t clef_engine_max_length(const clef_engine *e);

/* The state cache's counters (engine/state_cache.h; all zero when it is off).  Thread-safe. */
struct clef_state_cache_stats;
void clef_engine_state_cache_stats(clef_engine *e, struct clef_state_cache_stats *out);
/* NULL when the state cache is on or was not asked for; else why it is off (a static or engine-owned string). */
const char *clef_engine_state_cache_off_reason(const clef_engine *e);

/* bypass 1: later forwards neither read nor fill the state cache (what is held stays); 0: they do
 * again.  For measuring the cache against no cache on one loaded model (`clef bench --state-workload`). */
void clef_engine_state_cache_bypass(clef_engine *e, int bypass);

/* Seconds spent in clef_engine_open. */
double clef_engine_load_seconds(const clef_engine *e);

#endif
