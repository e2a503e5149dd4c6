#include "engine/engine.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "backend/device.h"
#include "engine/placement.h"
#include "engine/scheduler.h"
#include "engine/state_cache.h"
#include "decision/answer.h"
#include "io/synth.h"
#include "media/prompt.h"
#include "model/model.h"
#include "model/towers.h"
#include "quant/qsynth.h"
#include "text/tokenizer.h"
#include "util/timer.h"

struct clef_engine {
    clef_checkpoint ck;
    clef_place_plan *plan; /* --gpu-memory: the placement loaded with; NULL = all resident */
    clef_tokenizer *tok;
    clef_model *model;
    size_t max_length;
    int truncate_state;
    clef_limits limits;
    double load_seconds;
    pthread_mutex_t forward_lock; /* the model's workspace is single-user */
    clef_towers *towers;          /* vision + audio towers; NULL when they cannot be bound */
    clef_backend *tower_be;       /* --towers cpu on a non-CPU device: the towers' own CPU backend (owned); NULL =
                                     the towers run on the model's backend */
    char towers_why[CLEF_ERR_MESSAGE_MAX]; /* why not (reported to media requests) */
    float *hidden;     /* thinker output rows in the model backend's memory (on a GPU they stay there for
                          the head), reused by every forward (under forward_lock) */
    size_t hidden_cap; /* floats in `hidden` */
    clef_state_cache *cache; /* NULL = off */
    const char *cache_off;   /* why the cache asked for is off, or NULL */
    int cache_bypass;        /* 1: forwards neither read nor fill the cache (clef_engine_state_cache_bypass) */
};

/* Largest hidden-state buffer kept between forwards (512 MiB = 64k tokens of
 * hidden 2048): a fresh buffer costs a page fault per 4 KiB on its first
 * write, which for a 32k-token batch took longer than copying it. */
#define HIDDEN_KEEP_FLOATS ((size_t)128 << 20)

static void progress(const clef_engine_options *opt, const char *what, double t0) {
    if (opt->verbose) fprintf(stderr, "clef: %s (%.2f s)\n", what, clef_now() - t0);
}

/* "cpu" or "cuda" for a device string (NULL / "" = automatic, as clef_backend_open resolves it). */
static const char *device_kind(const char *device, int *automatic) {
    *automatic = !device || !*device;
    if (*automatic) device = clef_backend_auto_name();
    return strcmp(device, "cpu") ? "cuda" : "cpu";
}

int clef_engine_check_placement(const char *device, size_t gpu_memory, int towers, size_t batch_tokens,
                                clef_err *err) {
    int automatic;
    const char *kind = device_kind(device, &automatic);
    const char *on = automatic ? "the cpu (chosen automatically: no GPU, or CLEF_DEVICE=cpu)" : "the cpu (--device cpu)";
    if (towers < CLEF_TOWERS_DEFAULT || towers > CLEF_TOWERS_GPU)
        return clef_fail(err, 400, CLEF_E_REQUEST, "towers", "--towers must be cpu or gpu");
    if (gpu_memory && !strcmp(kind, "cpu"))
        return clef_fail(err, 400, CLEF_E_REQUEST, "gpu_memory",
                         "--gpu-memory applies to a CUDA device; this run is on %s", on);
    if (towers == CLEF_TOWERS_GPU && !strcmp(kind, "cpu"))
        return clef_fail(err, 400, CLEF_E_REQUEST, "towers",
                         "--towers gpu needs a CUDA device; this run is on %s", on);
    if (gpu_memory && batch_tokens > CLEF_PLACE_MAX_TOKENS)
        return clef_fail(err, 400, CLEF_E_REQUEST, "batch_tokens",
                         "with --gpu-memory a forward is planned for at most %zu tokens (got %zu)",
                         (size_t)CLEF_PLACE_MAX_TOKENS, batch_tokens);
    return 0;
}

/* --gpu-memory: the placement of e->ck under opt->gpu_memory on `be` (engine/placement.h) into e->plan,
 * printed when verbose, the budget set on the backend and the engine's max_length lowered to the
 * planned forward.  -1 + err: a backend without streaming or a budget, or a budget the model does not
 * fit (the planner's message). */
static int place(clef_engine *e, const clef_engine_options *opt, clef_backend *be, double t0, clef_err *err) {
    if (!be->ops->set_memory_budget || !be->ops->experts_stream_begin)
        return clef_fail(err, 500, CLEF_E_INTERNAL, "gpu_memory",
                         "--gpu-memory applies to a CUDA device; this run is on the %s (--device)", be->ops->name);
    clef_quant_config qc;
    clef_place_sizes sz;
    if (clef_quant_detect(&e->ck, &qc, err) ||
        clef_place_sizes_of_checkpoint(&e->ck, &e->ck.config, &qc, opt->text_only,
                                       opt->batch_tokens ? opt->batch_tokens : CLEF_SCHED_DEFAULT_MAX_BATCH_TOKENS,
                                       &sz, err))
        return -1;
    if (opt->towers == CLEF_TOWERS_CPU) clef_place_towers_on_host(&sz);
    e->plan = clef_xcalloc(1, sizeof *e->plan);
    clef_place_plan_make(&sz, opt->gpu_memory, opt->plan_advice, e->plan);
    if (!e->plan->fits) return clef_fail(err, 500, CLEF_E_INTERNAL, "gpu_memory", "%s", e->plan->message);
    if (opt->verbose) clef_place_plan_print(&sz, e->plan, stderr);
    /* the workspace is for sz.batch_tokens: no record may be longer (a longer one ran alone past it) */
    const size_t longest = clef_place_max_record(e->max_length, &sz);
    if (longest < e->max_length && opt->verbose)
        fprintf(stderr, "clef: records of at most %zu tokens under this plan (was %zu): the workspace is for %zu\n",
                longest, e->max_length, sz.batch_tokens);
    e->max_length = longest;
    if (be->ops->set_memory_budget(be, opt->gpu_memory, err)) return -1;
    progress(opt, "placement planned", t0);
    return 0;
}

clef_engine *clef_engine_open(const clef_engine_options *opt, clef_err *err) {
    double t0 = clef_now();
    if (!opt || (!opt->model_dir && !opt->synthetic)) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "no model directory given");
        return NULL;
    }
    if (opt->synthetic && !opt->tokenizer) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "a synthetic model needs a tokenizer path");
        return NULL;
    }
    /* placement options that need no checkpoint are checked before anything is loaded */
    if (clef_engine_check_placement(opt->device, opt->gpu_memory, opt->towers,
                                    opt->batch_tokens ? opt->batch_tokens : CLEF_SCHED_DEFAULT_MAX_BATCH_TOKENS, err))
        return NULL;
    clef_engine *e = clef_xcalloc(1, sizeof *e);
    pthread_mutex_init(&e->forward_lock, NULL);
    e->limits = opt->limits.max_questions ? opt->limits : clef_limits_default();
    e->truncate_state = opt->truncate_state;
    if (opt->synthetic_quant && !opt->synthetic) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "a quantized synthetic model needs a synthetic preset");
        goto fail_ck;
    }
    if (opt->synthetic && opt->synthetic_quant
            ? clef_qsynth_checkpoint(opt->synthetic, opt->seed, opt->synthetic_quant, opt->verbose ? stderr : NULL,
                                     &e->ck, err)
        : opt->synthetic ? clef_synth_checkpoint(opt->synthetic, opt->seed, opt->verbose ? stderr : NULL, &e->ck, err)
                         : clef_checkpoint_open(opt->model_dir, &e->ck, err))
        goto fail_ck;
    progress(opt, opt->synthetic ? "synthetic weights drawn" : "checkpoint mapped", t0);
    /* Every weight finite, checked once on the host before any backend sees
     * it (a CUDA upload copies these same bytes), so a NaN is a load error
     * naming the tensor instead of a 500 on every decision. */
    size_t checked = 0;
    if (clef_checkpoint_check_finite(&e->ck, opt->text_only, opt->n_threads, &checked, err)) goto fail;
    if (opt->verbose) fprintf(stderr, "clef: weights checked finite: %.2f GB (%.2f s)\n", (double)checked / 1e9,
                              clef_now() - t0);
    size_t max_pos = (size_t)e->ck.config.text.max_position_embeddings;
    e->max_length = opt->max_length ? opt->max_length : CLEF_DEFAULT_MAX_LENGTH;
    if (e->max_length > max_pos) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "max_length %zu exceeds max_position_embeddings %zu",
                  e->max_length, max_pos);
        goto fail;
    }
    char path[4096];
    if (opt->tokenizer)
        snprintf(path, sizeof path, "%s", opt->tokenizer);
    else
        snprintf(path, sizeof path, "%s/tokenizer.json", e->ck.dir); /* the directory without trailing slashes */
    e->tok = clef_tokenizer_load(path, err);
    if (!e->tok) goto fail;
    /* A tokenizer that can emit ids past the embedding rows is a broken
     * checkpoint: refuse it here, rather than fail every request with an
     * error that blames the client's input. */
    if (clef_tokenizer_size(e->tok) > (size_t)e->ck.config.text.vocab_size) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: token ids reach %zu, past the model's vocab_size %lld", path,
                  clef_tokenizer_size(e->tok) - 1, (long long)e->ck.config.text.vocab_size);
        goto fail;
    }
    progress(opt, "tokenizer loaded", t0);
    clef_backend *be = clef_backend_open(opt->device, opt->n_threads, opt->numerics, err); /* cpu, cuda[:N] or automatic */
    if (be && opt->gpu_memory && place(e, opt, be, t0, err)) {
        be->ops->destroy(be);
        goto fail;
    }
    e->model = be ? clef_model_create_placed(&e->ck, be, 1, e->plan, err) : NULL;
    if (!e->model) goto fail;
    progress(opt, "model bound", t0);
    /* Media towers on the model's backend.  A checkpoint without them still
     * answers text requests; media requests are then refused with the reason. */
    clef_err terr;
    clef_err_clear(&terr);
    clef_backend *tbe = clef_model_backend(e->model);
    if (!opt->text_only && opt->towers == CLEF_TOWERS_CPU && strcmp(tbe->ops->name, "cpu")) {
        /* --towers cpu beside a GPU thinker: a CPU backend of the towers' own (their outputs are host
         * rows either way, towers.h), so their weights never take device memory */
        e->tower_be = clef_backend_open("cpu", opt->n_threads, opt->numerics, &terr);
        tbe = e->tower_be;
    }
    e->towers = opt->text_only || !tbe ? NULL : clef_towers_create(&e->ck, tbe, &terr);
    if (e->towers)
        progress(opt, e->tower_be ? "media towers bound on the cpu (--towers cpu)" : "media towers bound", t0);
    else if (opt->text_only)
        snprintf(e->towers_why, sizeof e->towers_why, "text-only: the media towers were not loaded");
    else
        snprintf(e->towers_why, sizeof e->towers_why, "%s", terr.message);
    if (opt->state_cache) {
        /* under --gpu-memory the cache's blocks (backend memory) get what the plan leaves of the budget */
        size_t bound = opt->state_cache;
        const size_t block = clef_kv_block_floats(e->model) * sizeof(float);
        if (e->plan && e->plan->budget) {
            const size_t left = e->plan->budget > e->plan->device_bytes ? e->plan->budget - e->plan->device_bytes : 0;
            if (left < bound) bound = left;
        }
        if (!clef_model_can_reuse(e->model))
            e->cache_off = "the state cache is off: this backend's attention cannot read a cached prefix";
        else if (bound < block)
            e->cache_off = "the state cache is off: the --gpu-memory budget leaves no room for one block of cached "
                           "state";
        else
            e->cache = clef_state_cache_new(clef_model_backend(e->model), bound, block / sizeof(float));
        if (e->cache_off && opt->verbose) fprintf(stderr, "clef: %s\n", e->cache_off);
    }
    e->load_seconds = clef_now() - t0;
    return e;
fail:
    clef_checkpoint_close(&e->ck);
fail_ck:
    free(e->plan);
    clef_tokenizer_free(e->tok);
    pthread_mutex_destroy(&e->forward_lock);
    free(e);
    return NULL;
}

const clef_place_plan *clef_engine_plan(const clef_engine *e) { return e->plan; }

void clef_engine_close(clef_engine *e) {
    if (!e) return;
    free(e->plan);
    clef_state_cache_free(e->cache);
    clef_towers_free(e->towers);
    if (e->tower_be) e->tower_be->ops->destroy(e->tower_be);
    if (e->hidden) clef_model_backend(e->model)->ops->free(clef_model_backend(e->model), e->hidden);
    clef_model_free(e->model);
    clef_tokenizer_free(e->tok);
    clef_checkpoint_close(&e->ck);
    pthread_mutex_destroy(&e->forward_lock);
    free(e);
}

/* 422 when media need a tower this engine does not have: n_images, n_audio,
 * n_videos items, of which n_clips (standalone clips + soundtracks) need the
 * audio tower. */
static int check_towers(const clef_engine *e, size_t n_images, size_t n_audio, size_t n_videos, size_t n_clips,
                        clef_err *err) {
    const char *field = n_images ? "images" : n_audio ? "audio" : "videos";
    if (!e->towers)
        return clef_fail(err, 422, CLEF_E_REQUEST, field, "%s: media inputs are not available with this checkpoint (%s)",
                         field, e->towers_why);
    if ((n_images || n_videos) && !clef_towers_vision_config(e->towers))
        return clef_fail(err, 422, CLEF_E_REQUEST, n_images ? "images" : "videos",
                         "%s: this checkpoint has no vision tower", n_images ? "images" : "videos");
    if (n_clips && !clef_towers_audio_config(e->towers))
        return clef_fail(err, 422, CLEF_E_REQUEST, n_audio ? "audio" : "videos",
                         "%s: this checkpoint has no audio tower", n_audio ? "audio" : "videos");
    return 0;
}

/* The parse gate: media that need a missing tower are refused before they are
 * decoded, so a text-only engine gives every media request the same 422
 * whatever its payload.  A video's soundtrack is known only once decoded
 * (clef_engine_encode checks it). */
static int media_gate(const void *ctx, const size_t n[3], clef_err *err) {
    return n[0] || n[1] || n[2] ? check_towers(ctx, n[0], n[1], n[2], n[1], err) : 0;
}

int clef_engine_parse(const clef_engine *e, const char *body, size_t len, clef_request *req, clef_err *err) {
    return clef_request_parse_gated(body, len, &e->limits, media_gate, e, req, err);
}

static void digest_put(EVP_MD_CTX *x, const void *p, size_t n) {
    if (n) EVP_DigestUpdate(x, p, n);
}

/* SHA-256 of everything the towers and the 3-D positions read: counts,
 * grids, frame / token counts and the preprocessed tensors (state cache key). */
static void media_digest(const clef_media *m, unsigned char out[32]) {
    EVP_MD_CTX *x = EVP_MD_CTX_new();
    unsigned len = 0;
    EVP_DigestInit_ex(x, EVP_sha256(), NULL);
    const uint64_t n[6] = {m->n_images, m->n_videos, m->n_clips, m->n_audio, (uint64_t)m->use_audio_in_video,
                           m->n_frames};
    digest_put(x, n, sizeof n);
    digest_put(x, m->image_grids, m->n_images * sizeof *m->image_grids);
    digest_put(x, m->video_grids, m->n_videos * sizeof *m->video_grids);
    digest_put(x, m->video_frames, m->n_videos * sizeof *m->video_frames);
    digest_put(x, m->video_second_per_grid, m->n_videos * sizeof *m->video_second_per_grid);
    digest_put(x, m->clip_samples, m->n_clips * sizeof *m->clip_samples);
    digest_put(x, m->feature_lens, m->n_clips * sizeof *m->feature_lens);
    digest_put(x, m->audio_tokens, m->n_clips * sizeof *m->audio_tokens);
    const uint64_t rows[2] = {m->image_rows, m->video_rows};
    digest_put(x, rows, sizeof rows);
    digest_put(x, m->pixel_values, m->image_rows * 1536 * sizeof(float));
    digest_put(x, m->pixel_values_videos, m->video_rows * 1536 * sizeof(float));
    digest_put(x, m->input_features, m->n_clips * 128 * m->n_frames * sizeof(float));
    EVP_DigestFinal_ex(x, out, &len);
    EVP_MD_CTX_free(x);
}

int clef_engine_encode(const clef_engine *e, clef_request *req, const clef_decide_params *params, clef_job *job,
                       clef_err *err) {
    clef_decide_params p = params ? *params : (clef_decide_params){.truncate_state = -1};
    size_t max_length = p.max_length && p.max_length < e->max_length ? p.max_length : e->max_length;
    int truncate = req->truncate_state >= 0 ? req->truncate_state
                   : p.truncate_state >= 0  ? p.truncate_state
                                            : e->truncate_state;
    memset(job, 0, sizeof *job);
    job->req = *req;
    memset(req, 0, sizeof *req);
    job->debug = p.debug;
    if (clef_encode_record(e->tok, &job->req, max_length, truncate, &job->rec, err) != 0) {
        clef_job_free(job);
        return -1;
    }
    /* Media: the towers must exist for them; the processor tensors are built
     * here, on the caller's thread, so the engine thread only runs models. */
    const clef_media *m = &job->req.media;
    if (job->rec.media_len && (check_towers(e, m->n_images, m->n_audio, m->n_videos, m->n_clips, err) ||
                               clef_media_preprocess(&job->req.media, err))) {
        clef_job_free(job);
        return -1;
    }
    if (job->rec.media_len && e->cache) media_digest(&job->req.media, job->media_digest);
    job->logits = clef_xmalloc((clef_record_total_options(&job->rec) + 1) * sizeof *job->logits);
    return 0;
}

/* The head over one record's hidden states, then the no-NaN check. */
static int run_head(clef_engine *e, const float *hidden, clef_job *job, clef_err *err) {
    if (clef_head_forward_backend(e->model, hidden, &job->rec, job->logits, err) != 0) return -1;
    return clef_check_logits(&job->req, &job->rec, job->logits, err);
}

/* Hidden states for `n_tokens` rows of H floats: the engine's buffer, grown
 * when needed (callers hold forward_lock and give it back with
 * release_hidden), or NULL with a capacity error (a client asking for too
 * many tokens is a 422, not a crash). */
static float *alloc_hidden(clef_engine *e, size_t n_tokens, clef_err *err) {
    size_t h = (size_t)e->ck.config.text.hidden_size;
    if (n_tokens > SIZE_MAX / sizeof(float) / (h ? h : 1)) {
        clef_fail(err, 422, CLEF_E_CAPACITY, NULL, "too many tokens: cannot allocate hidden states for %zu tokens",
                  n_tokens);
        return NULL;
    }
    if (e->hidden_cap < n_tokens * h) {
        clef_backend *be = clef_model_backend(e->model);
        if (e->hidden) be->ops->free(be, e->hidden);
        e->hidden_cap = 0;
        e->hidden = be->ops->alloc(be, (n_tokens * h > 0 ? n_tokens * h : 1) * sizeof *e->hidden);
        if (!e->hidden) {
            clef_fail(err, 422, CLEF_E_CAPACITY, NULL, "too many tokens: cannot allocate hidden states for %zu tokens",
                      n_tokens);
            return NULL;
        }
        e->hidden_cap = n_tokens * h;
    }
    return e->hidden;
}

/* Done with the buffer: an oversized one is not kept (bounded RSS). */
static void release_hidden(clef_engine *e) {
    if (e->hidden_cap > HIDDEN_KEEP_FLOATS) {
        clef_model_backend(e->model)->ops->free(clef_model_backend(e->model), e->hidden);
        e->hidden = NULL;
        e->hidden_cap = 0;
    }
}

/* The state cache's key of a job: its ids, positions, media digest and the
 * end of its state (PREFIX + media block + the state's kept tokens). */
static void job_key(const clef_job *j, clef_sc_key *k) {
    const clef_record *r = &j->rec;
    *k = (clef_sc_key){.ids = r->input_ids, .n_ids = r->n_ids, .positions = r->positions,
                       .digest = r->media_len ? j->media_digest : NULL,
                       .cacheable = r->media_start + r->media_len + r->state_tokens_kept};
}

/* The thinker over n_jobs records packed back to back (seg), through the
 * state cache when it is on: look up / allocate, forward, then add the
 * filled blocks (or drop them when the forward failed).  `media` only with
 * one record; towers_fn (may be NULL) is called with the plan's reuse of
 * record 0 to build it, after the lookup (a media block inside the reused
 * prefix needs no towers). */
typedef int (*media_fn)(clef_engine *e, clef_job *job, size_t reuse, clef_media_embeds *me, int *have, clef_err *err);

static int thinker_run(clef_engine *e, clef_job *const *jobs, size_t n_jobs, const int32_t *ids, const size_t *seg,
                       media_fn towers, float *hidden, clef_err *err) {
    const size_t n_total = seg[n_jobs];
    clef_sc_key *keys = clef_xcalloc(n_jobs + 1, sizeof *keys);
    for (size_t i = 0; i < n_jobs; i++) job_key(jobs[i], &keys[i]);
    clef_sc_plan plan;
    clef_state_cache *cache = e->cache_bypass ? NULL : e->cache;
    clef_state_cache_plan(cache, keys, n_jobs, &plan);
    clef_media_embeds me;
    int have_media = 0, rc = 0;
    if (towers) rc = towers(e, jobs[0], plan.reuse ? plan.reuse[0] : 0, &me, &have_media, err);
    const int32_t *positions = n_jobs == 1 ? jobs[0]->rec.positions : NULL;
    if (rc == 0) {
        clef_thinker_reuse ru = {.reuse = plan.reuse, .read = plan.read, .fill = plan.fill, .write = plan.write};
        rc = clef_thinker_forward_reuse(e->model, ids, n_total, seg, n_jobs, positions, have_media ? &me.view : NULL,
                                        plan.reuse ? &ru : NULL, hidden, err);
    }
    if (have_media) clef_media_embeds_free(&me);
    clef_state_cache_finish(cache, keys, &plan, rc == 0);
    free(keys);
    return rc;
}

/* The towers of a media record, unless its whole media block lies in the
 * reused prefix (then no media rows are left to compute). */
static int media_towers(clef_engine *e, clef_job *job, size_t reuse, clef_media_embeds *me, int *have, clef_err *err) {
    *have = 0;
    if (reuse >= job->rec.media_start + job->rec.media_len) return 0;
    clef_media_tokens t;
    if (clef_media_tokens_resolve(e->tok, &t, err) ||
        clef_towers_embed(e->towers, &job->req.media, job->rec.input_ids, job->rec.n_ids, 0, t.image_pad, t.video_pad,
                          t.audio_pad, e->ck.config.text.hidden_size, me, err))
        return -1;
    *have = 1;
    return 0;
}

/* A record with media: towers, then the thinker with the media rows and the
 * record's 3-D positions (SPEC §9), then the head. */
static int run_media(clef_engine *e, clef_job *job, clef_err *err) {
    float *hidden = alloc_hidden(e, job->rec.n_ids, err);
    size_t seg[2] = {0, job->rec.n_ids};
    clef_job *one[1] = {job};
    int rc = hidden ? thinker_run(e, one, 1, job->rec.input_ids, seg, media_towers, hidden, err) : -1;
    if (rc == 0) rc = run_head(e, hidden, job, err);
    release_hidden(e);
    return rc;
}

/* One record alone: thinker over its ids, then the head. */
static int run_alone(clef_engine *e, clef_job *job, clef_err *err) {
    if (job->rec.media_len) return run_media(e, job, err);
    float *hidden = alloc_hidden(e, job->rec.n_ids, err);
    if (!hidden) return -1;
    size_t seg[2] = {0, job->rec.n_ids};
    clef_job *one[1] = {job};
    int rc = thinker_run(e, one, 1, job->rec.input_ids, seg, NULL, hidden, err);
    if (rc == 0) rc = run_head(e, hidden, job, err);
    release_hidden(e);
    return rc;
}

/* Several records packed back to back into one thinker forward (segment i
 * covers rows [seg[i], seg[i+1])), then the head per record.  Returns -1
 * without touching the jobs' results when the packed forward itself fails. */
static int run_packed(clef_engine *e, clef_job *const *jobs, size_t n_jobs, clef_err *errs, clef_err *batch_err) {
    size_t *seg = clef_xmalloc((n_jobs + 1) * sizeof *seg);
    seg[0] = 0;
    for (size_t i = 0; i < n_jobs; i++) seg[i + 1] = seg[i] + jobs[i]->rec.n_ids;
    size_t n_total = seg[n_jobs];
    int32_t *ids = clef_xmalloc((n_total + 1) * sizeof *ids);
    for (size_t i = 0; i < n_jobs; i++)
        memcpy(ids + seg[i], jobs[i]->rec.input_ids, jobs[i]->rec.n_ids * sizeof *ids);
    float *hidden = alloc_hidden(e, n_total, batch_err);
    size_t h = (size_t)e->ck.config.text.hidden_size;
    int rc = -1;
    if (hidden && thinker_run(e, jobs, n_jobs, ids, seg, NULL, hidden, batch_err) == 0) {
        for (size_t i = 0; i < n_jobs; i++) run_head(e, hidden + seg[i] * h, jobs[i], &errs[i]);
        rc = 0;
    }
    release_hidden(e);
    free(ids);
    free(seg);
    return rc;
}

int clef_engine_run(clef_engine *e, clef_job *const *jobs, size_t n_jobs, clef_err *errs) {
    for (size_t i = 0; i < n_jobs; i++) clef_err_clear(&errs[i]);
    pthread_mutex_lock(&e->forward_lock);
    clef_err batch_err;
    clef_err_clear(&batch_err);
    /* Records with media run alone (their tower rows and positions are their
     * own); the text records are packed. */
    clef_job **text = clef_xmalloc((n_jobs + 1) * sizeof *text);
    clef_err *text_errs = clef_xcalloc(n_jobs + 1, sizeof *text_errs);
    size_t *where = clef_xmalloc((n_jobs + 1) * sizeof *where), n_text = 0;
    for (size_t i = 0; i < n_jobs; i++) {
        if (jobs[i]->rec.media_len) {
            run_media(e, jobs[i], &errs[i]);
        } else {
            where[n_text] = i;
            text[n_text++] = jobs[i];
        }
    }
    if (n_text == 1 || (n_text > 1 && run_packed(e, text, n_text, text_errs, &batch_err) != 0)) {
        /* Alone, or the packed forward failed as a whole: give every record
         * its own chance so one oversized record cannot fail its batch. */
        for (size_t i = 0; i < n_text; i++) run_alone(e, text[i], &text_errs[i]);
    }
    for (size_t i = 0; i < n_text; i++) errs[where[i]] = text_errs[i];
    free(text);
    free(text_errs);
    free(where);
    pthread_mutex_unlock(&e->forward_lock);
    int rc = 0;
    for (size_t i = 0; i < n_jobs; i++)
        if (errs[i].status) rc = -1;
    return rc;
}

void clef_engine_render(const clef_job *job, clef_buf *out) {
    clef_render_response(&job->req, &job->rec, job->logits, job->debug, out);
}

void clef_job_free(clef_job *job) {
    if (!job) return;
    clef_record_free(&job->rec);
    clef_request_free(&job->req);
    free(job->logits);
    memset(job, 0, sizeof *job);
}

/* decide = parse + encode + run + render: the single-request path of the CLI. */
int clef_engine_decide(clef_engine *e, const char *body, size_t len, const clef_decide_params *params, clef_buf *out,
                       clef_err *err) {
    clef_request req;
    if (clef_engine_parse(e, body, len, &req, err) != 0) return -1;
    clef_job job;
    if (clef_engine_encode(e, &req, params, &job, err) != 0) return -1;
    clef_job *one = &job;
    int rc = clef_engine_run(e, &one, 1, err);
    if (rc == 0) clef_engine_render(&job, out);
    clef_job_free(&job);
    return rc;
}

const clef_tokenizer *clef_engine_tokenizer(const clef_engine *e) { return e->tok; }
const clef_checkpoint *clef_engine_checkpoint(const clef_engine *e) { return &e->ck; }
clef_model *clef_engine_model(clef_engine *e) { return e->model; }
size_t clef_engine_max_length(const clef_engine *e) { return e->max_length; }
double clef_engine_load_seconds(const clef_engine *e) { return e->load_seconds; }
void clef_engine_state_cache_stats(clef_engine *e, clef_state_cache_stats *out) {
    clef_state_cache_stats_get(e->cache, out);
}
const char *clef_engine_state_cache_off_reason(const clef_engine *e) { return e->cache_off; }
void clef_engine_state_cache_bypass(clef_engine *e, int bypass) {
    pthread_mutex_lock(&e->forward_lock);
    e->cache_bypass = bypass;
    pthread_mutex_unlock(&e->forward_lock);
}
