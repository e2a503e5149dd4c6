#include "engine/engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decision/answer.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "util/timer.h"

struct clef_engine {
    clef_checkpoint ck;
    clef_tokenizer *tok;
    clef_model *model;
    size_t max_length;
    int truncate_state;
    clef_limits limits;
    double load_seconds;
    pthread_mutex_t forward_lock; /* the model's workspace is single-user */
};

static void progress(const clef_engine_options *opt, const char *what, double t0) {
    if (opt->verbose) fprintf(stderr, "clef: %s (%.2f s)\n", what, clef_now() - t0);
}

clef_engine *clef_engine_open(const clef_engine_options *opt, clef_err *err) {
    double t0 = clef_now();
    if (!opt || !opt->model_dir) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "no model directory given");
        return NULL;
    }
    clef_engine *e = clef_xcalloc(1, sizeof *e);
    pthread_mutex_init(&e->forward_lock, NULL);
    e->limits = opt->limits.max_questions ? opt->limits : clef_limits_default();
    e->truncate_state = opt->truncate_state;
    if (clef_checkpoint_open(opt->model_dir, &e->ck, err) != 0) goto fail_ck;
    progress(opt, "checkpoint mapped", t0);
    size_t max_pos = (size_t)e->ck.config.text.max_position_embeddings;
    e->max_length = opt->max_length ? opt->max_length : CLEF_DEFAULT_MAX_LENGTH;
    if (e->max_length > max_pos) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "max_length %zu exceeds max_position_embeddings %zu",
                  e->max_length, max_pos);
        goto fail;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", opt->model_dir);
    e->tok = clef_tokenizer_load(path, err);
    if (!e->tok) goto fail;
    progress(opt, "tokenizer loaded", t0);
    e->model = clef_model_create(&e->ck, opt->n_threads, err);
    if (!e->model) goto fail;
    progress(opt, "model bound", t0);
    e->load_seconds = clef_now() - t0;
    return e;
fail:
    clef_checkpoint_close(&e->ck);
fail_ck:
    clef_tokenizer_free(e->tok);
    pthread_mutex_destroy(&e->forward_lock);
    free(e);
    return NULL;
}

void clef_engine_close(clef_engine *e) {
    if (!e) return;
    clef_model_free(e->model);
    clef_tokenizer_free(e->tok);
    clef_checkpoint_close(&e->ck);
    pthread_mutex_destroy(&e->forward_lock);
    free(e);
}

/* thinker + head for one encoded record; logits laid out as clef_head_forward. */
static int run_record(clef_engine *e, const clef_record *rec, float *logits, clef_err *err) {
    size_t hidden_size = (size_t)e->ck.config.text.hidden_size;
    float *hidden = malloc(rec->n_ids * hidden_size * sizeof *hidden);
    if (!hidden) return clef_fail(err, 422, CLEF_E_CAPACITY, NULL, "too many tokens: cannot allocate hidden states for %zu tokens", rec->n_ids);
    pthread_mutex_lock(&e->forward_lock);
    int rc = clef_thinker_forward(e->model, rec->input_ids, rec->n_ids, hidden, NULL, err);
    if (rc == 0) rc = clef_head_forward(e->model, hidden, rec, logits, err);
    pthread_mutex_unlock(&e->forward_lock);
    free(hidden);
    return rc;
}

int clef_engine_decide(clef_engine *e, const char *body, size_t len, const clef_decide_params *params, clef_buf *out,
                       clef_err *err) {
    clef_decide_params p = params ? *params : (clef_decide_params){.truncate_state = -1};
    size_t max_length = p.max_length && p.max_length < e->max_length ? p.max_length : e->max_length;
    clef_request req;
    if (clef_request_parse(body, len, &e->limits, &req, err) != 0) return -1;
    int truncate = req.truncate_state >= 0 ? req.truncate_state
                   : p.truncate_state >= 0 ? p.truncate_state
                                           : e->truncate_state;
    clef_record rec;
    int rc = -1;
    if (clef_encode_record(e->tok, &req, max_length, truncate, &rec, err) == 0) {
        float *logits = clef_xmalloc((clef_record_total_options(&rec) + 1) * sizeof *logits);
        if (run_record(e, &rec, logits, err) == 0) {
            clef_render_response(&req, &rec, logits, p.debug, out);
            rc = 0;
        }
        free(logits);
        clef_record_free(&rec);
    }
    clef_request_free(&req);
    return rc;
}

const clef_tokenizer *clef_engine_tokenizer(const clef_engine *e) { return e->tok; }
const clef_checkpoint *clef_engine_checkpoint(const clef_engine *e) { return &e->ck; }
clef_model *clef_engine_model(clef_engine *e) { return e->model; }
size_t clef_engine_max_length(const clef_engine *e) { return e->max_length; }
double clef_engine_load_seconds(const clef_engine *e) { return e->load_seconds; }
