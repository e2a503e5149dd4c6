/* head.c — the joint schema head (SPEC §7.3) over one record, in f32, written
 * against the backend op table only.  Shapes: L tokens, H thinker width, W
 * head width, F feed-forward width, Q questions, N options (all questions),
 * NT option tokens. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "util/buf.h"

/* Host-side layout of a record: spans and indices the ops are shaped by. */
typedef struct head_plan {
    int64_t L, Q, N, NT;
    clef_row_span *q_spans;   /* [Q] question spans */
    clef_row_span *o_spans;   /* [N] option spans */
    clef_row_span *lex_spans; /* [N] option spans rebased into the gathered lexical rows */
    int32_t *lex_ids;         /* [NT] token ids of every option token, option by option */
    int32_t *f_rows;          /* [N] question of each option */
    int64_t *q_off;           /* [Q+1] 0..Q: one query row (b_i) per question */
    int64_t *o_off;           /* [Q+1] option offsets per question */
    int32_t *types;           /* [Q] */
} head_plan;

/* Backend activations, carved from one allocation. */
typedef struct head_ws {
    float *X, *hn, *M, *Mn, *KV;               /* [L,H] [L,H] [L,W] [L,W] [L,2W] */
    float *qv, *qg;                            /* [Q,H] */
    float *cv, *lv;                            /* [N,H] */
    float *lex;                                /* [NT,H] */
    int32_t *lex_ids, *types;                  /* [NT] [Q] */
    float *R, *Rn, *tmp, *att, *o;             /* [N,W] */
    float *qkv;                                /* [N,3W] */
    float *ff;                                 /* [N,F] */
    float *bq, *tq, *S, *F, *Fn, *temb;        /* [Q,W] */
    float *Gg;                                 /* [1,W] */
    float *feats;                              /* [N,4W] */
    float *r1;                                 /* [N,W] */
    float *res, *cosv, *prior;                 /* [N] */
} head_ws;

static void plan_free(head_plan *p) {
    free(p->q_spans);
    free(p->o_spans);
    free(p->lex_spans);
    free(p->lex_ids);
    free(p->f_rows);
    free(p->q_off);
    free(p->o_off);
    free(p->types);
    memset(p, 0, sizeof *p);
}

/* Validate the record's spans (SPEC §2.2 rule 12: an empty question span is
 * refused, never averaged into NaN) and build the plan. */
static int plan_build(const clef_model *m, const clef_record *rec, head_plan *p, clef_err *err) {
    const int64_t L = (int64_t)rec->n_ids, Q = (int64_t)rec->n_questions, V = m->cfg->text.vocab_size;
    memset(p, 0, sizeof *p);
    if (L <= 0 || Q <= 0) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "head: record has no tokens or questions");
    int64_t N = 0, NT = 0;
    for (int64_t i = 0; i < Q; i++) {
        const clef_record_question *q = &rec->questions[i];
        if (q->question.start == q->question.end)
            return clef_fail(err, 422, CLEF_E_REQUEST, "questions",
                             "question %lld: question instructions render to no tokens; give non-empty instructions "
                             "or a non-empty question id",
                             (long long)i);
        if (q->question.start < 0 || q->question.end > L || q->question.start > q->question.end)
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "head: question %lld span [%d,%d) outside %lld tokens",
                             (long long)i, (int)q->question.start, (int)q->question.end, (long long)L);
        if (q->n_options == 0 || (int)q->type < 0 || (int)q->type > 2)
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "head: question %lld has no options or a bad type",
                             (long long)i);
        for (size_t j = 0; j < q->n_options; j++) {
            clef_span s = q->options[j];
            if (s.start < 0 || s.end > L || s.start >= s.end)
                return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "head: question %lld option %zu span [%d,%d) invalid",
                                 (long long)i, j, (int)s.start, (int)s.end);
            NT += s.end - s.start;
        }
        N += (int64_t)q->n_options;
    }
    for (int64_t t = 0; t < L; t++)
        if (rec->input_ids[t] < 0 || rec->input_ids[t] >= V)
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "head: token id %d outside the vocabulary",
                             (int)rec->input_ids[t]);
    p->L = L, p->Q = Q, p->N = N, p->NT = NT;
    p->q_spans = clef_xmalloc((size_t)Q * sizeof *p->q_spans);
    p->o_spans = clef_xmalloc((size_t)N * sizeof *p->o_spans);
    p->lex_spans = clef_xmalloc((size_t)N * sizeof *p->lex_spans);
    p->lex_ids = clef_xmalloc((size_t)NT * sizeof *p->lex_ids);
    p->f_rows = clef_xmalloc((size_t)N * sizeof *p->f_rows);
    p->q_off = clef_xmalloc((size_t)(Q + 1) * sizeof *p->q_off);
    p->o_off = clef_xmalloc((size_t)(Q + 1) * sizeof *p->o_off);
    p->types = clef_xmalloc((size_t)Q * sizeof *p->types);
    int64_t n = 0, nt = 0;
    for (int64_t i = 0; i < Q; i++) {
        const clef_record_question *q = &rec->questions[i];
        p->q_spans[i] = (clef_row_span){q->question.start, q->question.end};
        p->q_off[i] = i;
        p->o_off[i] = n;
        p->types[i] = (int32_t)q->type;
        for (size_t j = 0; j < q->n_options; j++, n++) {
            clef_span s = q->options[j];
            p->o_spans[n] = (clef_row_span){s.start, s.end};
            p->lex_spans[n] = (clef_row_span){nt, nt + (s.end - s.start)};
            p->f_rows[n] = (int32_t)i;
            for (int32_t t = s.start; t < s.end; t++) p->lex_ids[nt++] = rec->input_ids[t];
        }
    }
    p->q_off[Q] = Q;
    p->o_off[Q] = N;
    return 0;
}

/* Plan (base NULL) or carve the head workspace; no X rows when the hidden
 * states are read in place from backend memory. */
static void ws_layout(const clef_head_config *hc, const head_plan *p, int hidden_on_be, model_ws *w, head_ws *t) {
    const size_t L = (size_t)p->L, Q = (size_t)p->Q, N = (size_t)p->N, NT = (size_t)p->NT,
                 H = (size_t)hc->hidden_size, W = (size_t)hc->width, F = (size_t)hc->feedforward;
    const size_t f = sizeof(float);
    t->X = hidden_on_be ? NULL : ws_take(w, L * H, f);
    t->hn = ws_take(w, L * H, f);
    t->M = ws_take(w, L * W, f);
    t->Mn = ws_take(w, L * W, f);
    t->KV = ws_take(w, L * 2 * W, f);
    t->qv = ws_take(w, Q * H, f);
    t->qg = ws_take(w, Q * H, f);
    t->cv = ws_take(w, N * H, f);
    t->lv = ws_take(w, N * H, f);
    t->lex = ws_take(w, NT * H, f);
    t->lex_ids = ws_take(w, NT, sizeof(int32_t));
    t->types = ws_take(w, Q, sizeof(int32_t));
    t->R = ws_take(w, N * W, f);
    t->Rn = ws_take(w, N * W, f);
    t->tmp = ws_take(w, N * W, f);
    t->att = ws_take(w, N * W, f);
    t->o = ws_take(w, N * W, f);
    t->qkv = ws_take(w, N * 3 * W, f);
    t->ff = ws_take(w, N * F, f);
    t->bq = ws_take(w, Q * W, f);
    t->tq = ws_take(w, Q * W, f);
    t->S = ws_take(w, Q * W, f);
    t->F = ws_take(w, Q * W, f);
    t->Fn = ws_take(w, Q * W, f);
    t->temb = ws_take(w, Q * W, f);
    t->Gg = ws_take(w, W, f);
    t->feats = ws_take(w, N * 4 * W, f);
    t->r1 = ws_take(w, N * W, f);
    t->res = ws_take(w, N, f);
    t->cosv = ws_take(w, N, f);
    t->prior = ws_take(w, N, f);
}

/* out[nq, W] = MHA(xq, xkv, xkv) with packed in_proj, no mask.  xq == xkv is
 * self-attention (one [nq, 3W] projection); otherwise Q from xq and K/V from
 * xkv ([nk, 2W]). */
static int mha(clef_model *m, const head_mha *a, const float *xq, int64_t nq, const float *xkv, int64_t nk,
               head_ws *t, float *out, clef_err *err) {
    clef_backend *be = m->be;
    const int64_t W = m->cfg->head.width, nh = m->cfg->head.heads, d = W / nh;
    int64_t q_off[2] = {0, nq}, kv_off[2] = {0, nk};
    clef_attn_desc ad = {.n_seg = 1, .q_off = q_off, .kv_off = kv_off, .n_q_heads = nh, .n_kv_heads = nh,
                         .head_dim = d, .o_stride = W, .scale = (float)(1.0 / sqrt((double)d)), .causal = 0};
    const float *q, *k, *v;
    if (xq == xkv) {
        if (be->ops->matmul(be, xq, nq, &a->in_proj, a->in_bias, t->qkv, err)) return -1;
        q = t->qkv, k = t->qkv + W, v = t->qkv + 2 * W;
        ad.q_stride = ad.k_stride = ad.v_stride = 3 * W;
    } else {
        if (be->ops->matmul(be, xq, nq, &a->q_rows, a->in_bias, t->qkv, err) ||
            be->ops->matmul(be, xkv, nk, &a->kv_rows, a->in_bias + W, t->KV, err))
            return -1;
        q = t->qkv, k = t->KV, v = t->KV + W;
        ad.q_stride = W;
        ad.k_stride = ad.v_stride = 2 * W;
    }
    if (be->ops->attention(be, q, k, v, t->att, &ad, err)) return -1;
    return be->ops->matmul(be, t->att, nq, &a->out_proj, a->out_bias, out, err);
}

/* Steps 1-4: memory, question and option vectors, option queries R. */
static int head_inputs(clef_model *m, const head_plan *p, const float *hidden, int hidden_on_be, head_ws *t,
                       clef_err *err) {
    clef_backend *be = m->be;
    const head_weights *hw = &m->head;
    const int64_t H = m->cfg->head.hidden_size, W = m->cfg->head.width;
    const float *X = hidden_on_be ? hidden : t->X; /* hidden rows already on the backend are read in place */
    if ((!hidden_on_be && be->ops->upload(be, t->X, hidden, (size_t)(p->L * H) * sizeof(float), err)) ||
        be->ops->upload(be, t->lex_ids, p->lex_ids, (size_t)p->NT * sizeof(int32_t), err) ||
        be->ops->upload(be, t->types, p->types, (size_t)p->Q * sizeof(int32_t), err) ||
        be->ops->layernorm(be, X, hw->hidden_norm_w, hw->hidden_norm_b, t->hn, p->L, H, 1e-5f, err) ||
        be->ops->matmul(be, t->hn, p->L, &hw->memory, NULL, t->M, err) ||
        be->ops->span_mean(be, t->hn, H, p->q_spans, p->Q, t->qv, err) ||
        be->ops->span_mean(be, t->hn, H, p->o_spans, p->N, t->cv, err) ||
        be->ops->gather(be, &m->lm_head, t->lex_ids, p->NT, t->lex, err) ||
        be->ops->span_mean(be, t->lex, H, p->lex_spans, p->N, t->lv, err))
        return -1;
    /* R = W_oc c + W_ol l + W_oq q (the question term broadcast over its options) */
    if (be->ops->matmul(be, t->cv, p->N, &hw->option_context, NULL, t->R, err) ||
        be->ops->matmul(be, t->lv, p->N, &hw->option_lexical, NULL, t->tmp, err) ||
        be->ops->add(be, t->R, t->tmp, t->R, p->N, W, W, err) ||
        be->ops->matmul(be, t->qv, p->Q, &hw->option_question, NULL, t->tq, err))
        return -1;
    for (int64_t i = 0; i < p->Q; i++) {
        float *r = t->R + p->o_off[i] * W;
        if (be->ops->add(be, r, t->tq + i * W, r, p->o_off[i + 1] - p->o_off[i], W, 0, err)) return -1;
    }
    return 0;
}

/* Step 5: evidence routing layers (options attend to memory only). */
static int head_evidence(clef_model *m, const head_plan *p, head_ws *t, clef_err *err) {
    clef_backend *be = m->be;
    const int64_t W = m->cfg->head.width, F = m->cfg->head.feedforward, N = p->N;
    for (int64_t i = 0; i < m->cfg->head.routing_layers; i++) {
        const head_evidence_layer *e = &m->head.evidence[i];
        if (be->ops->layernorm(be, t->M, e->memory_norm_w, e->memory_norm_b, t->Mn, p->L, W, 1e-5f, err) ||
            be->ops->layernorm(be, t->R, e->query_norm_w, e->query_norm_b, t->Rn, N, W, 1e-5f, err) ||
            mha(m, &e->attn, t->Rn, N, t->Mn, p->L, t, t->tmp, err) ||
            be->ops->add(be, t->R, t->tmp, t->R, N, W, W, err) ||
            be->ops->layernorm(be, t->R, e->ff_norm_w, e->ff_norm_b, t->Rn, N, W, 1e-5f, err) ||
            be->ops->matmul(be, t->Rn, N, &e->ff0, e->ff0_b, t->ff, err) || be->ops->gelu(be, t->ff, t->ff, N * F, err) ||
            be->ops->matmul(be, t->ff, N, &e->ff3, e->ff3_b, t->tmp, err) ||
            be->ops->add(be, t->R, t->tmp, t->R, N, W, W, err))
            return -1;
    }
    return 0;
}

/* Steps 6-8: per-question option summary and the field vectors F. */
static int head_fields(clef_model *m, const head_plan *p, head_ws *t, clef_err *err) {
    clef_backend *be = m->be;
    const head_weights *hw = &m->head;
    const int64_t W = m->cfg->head.width, H = m->cfg->head.hidden_size, Q = p->Q;
    /* s_ij = R_ij . b_i / sqrt(W), w = softmax_j, S_i = sum_j w_j R_ij: one
     * single-head attention per question over its own options. */
    clef_attn_desc ad = {.n_seg = Q, .q_off = p->q_off, .kv_off = p->o_off, .n_q_heads = 1, .n_kv_heads = 1,
                         .head_dim = W, .q_stride = W, .k_stride = W, .v_stride = W, .o_stride = W,
                         .scale = (float)(1.0 / sqrt((double)W)), .causal = 0};
    const float *g = t->hn + (p->L - 1) * H;
    if (be->ops->matmul(be, t->qv, Q, &hw->question, NULL, t->bq, err) ||
        be->ops->attention(be, t->bq, t->R, t->R, t->S, &ad, err) ||
        be->ops->layernorm(be, t->S, hw->summary_norm_w, hw->summary_norm_b, t->S, Q, W, 1e-5f, err) ||
        be->ops->add(be, t->bq, t->S, t->F, Q, W, W, err) || be->ops->matmul(be, g, 1, &hw->global, NULL, t->Gg, err) ||
        be->ops->add(be, t->F, t->Gg, t->F, Q, W, 0, err) ||
        be->ops->gather(be, &hw->type_embedding, t->types, Q, t->temb, err) ||
        be->ops->add(be, t->F, t->temb, t->F, Q, W, W, err))
        return -1;
    return 0;
}

/* Steps 9-13: the norm-first transformer decoder over the Q fields; memory
 * is the un-normalised M. */
static int head_decoder(clef_model *m, const head_plan *p, head_ws *t, clef_err *err) {
    clef_backend *be = m->be;
    const int64_t W = m->cfg->head.width, F = m->cfg->head.feedforward, Q = p->Q;
    for (int64_t i = 0; i < m->cfg->head.layers; i++) {
        const head_decoder_layer *d = &m->head.decoder[i];
        if (be->ops->layernorm(be, t->F, d->norm1_w, d->norm1_b, t->Fn, Q, W, 1e-5f, err) ||
            mha(m, &d->self_attn, t->Fn, Q, t->Fn, Q, t, t->tmp, err) ||
            be->ops->add(be, t->F, t->tmp, t->F, Q, W, W, err) ||
            be->ops->layernorm(be, t->F, d->norm2_w, d->norm2_b, t->Fn, Q, W, 1e-5f, err) ||
            mha(m, &d->cross_attn, t->Fn, Q, t->M, p->L, t, t->tmp, err) ||
            be->ops->add(be, t->F, t->tmp, t->F, Q, W, W, err) ||
            be->ops->layernorm(be, t->F, d->norm3_w, d->norm3_b, t->Fn, Q, W, 1e-5f, err) ||
            be->ops->matmul(be, t->Fn, Q, &d->linear1, d->linear1_b, t->ff, err) ||
            be->ops->gelu(be, t->ff, t->ff, Q * F, err) ||
            be->ops->matmul(be, t->ff, Q, &d->linear2, d->linear2_b, t->tmp, err) ||
            be->ops->add(be, t->F, t->tmp, t->F, Q, W, W, err))
            return -1;
    }
    return be->ops->layernorm(be, t->F, m->head.field_norm_w, m->head.field_norm_b, t->F, Q, W, 1e-5f, err);
}

/* Step 14: prior, cosine and residual terms of every option, combined on the
 * host with the learned scales. */
static int head_scores(clef_model *m, const head_plan *p, head_ws *t, float *logits, clef_err *err) {
    clef_backend *be = m->be;
    const head_weights *hw = &m->head;
    const int64_t W = m->cfg->head.width, H = m->cfg->head.hidden_size, N = p->N;
    const float *g = t->hn + (p->L - 1) * H;
    if (be->ops->layernorm(be, t->R, hw->option_norm_w, hw->option_norm_b, t->o, N, W, 1e-5f, err) ||
        be->ops->cosine(be, t->F, p->f_rows, t->o, N, W, 1e-8f, t->cosv, err) ||
        be->ops->pair_features(be, t->F, p->f_rows, t->o, N, W, t->feats, err) ||
        be->ops->matmul(be, t->feats, N, &hw->scorer0, hw->scorer0_b, t->r1, err) ||
        be->ops->gelu(be, t->r1, t->r1, N * W, err) ||
        be->ops->matmul(be, t->r1, N, &hw->scorer3, hw->scorer3_b, t->res, err) ||
        be->ops->add(be, t->qv, g, t->qg, p->Q, H, 0, err) ||
        be->ops->cosine(be, t->qg, p->f_rows, t->lv, N, H, 1e-12f, t->prior, err))
        return -1;
    float *host = clef_xmalloc((size_t)(3 * N) * sizeof *host);
    int rc = be->ops->download(be, host, t->prior, (size_t)N * sizeof(float), err);
    if (rc == 0) rc = be->ops->download(be, host + N, t->cosv, (size_t)N * sizeof(float), err);
    if (rc == 0) rc = be->ops->download(be, host + 2 * N, t->res, (size_t)N * sizeof(float), err);
    for (int64_t i = 0; rc == 0 && i < N; i++) {
        float prior = hw->prior_scale * host[i];
        logits[i] = prior + hw->gate * (hw->joint_scale * host[N + i] + host[2 * N + i]);
        if (!isfinite(logits[i]))
            rc = clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "head: option %lld has a non-finite logit", (long long)i);
    }
    free(host);
    return rc;
}

/* The head behind both entry points: hidden in host or backend memory. */
static int head_forward(clef_model *m, const float *hidden, int hidden_on_be, const clef_record *rec, float *logits,
                        clef_err *err) {
    head_plan p;
    if (plan_build(m, rec, &p, err) != 0) {
        plan_free(&p);
        return -1;
    }
    model_ws w = {0};
    head_ws t;
    ws_layout(&m->cfg->head, &p, hidden_on_be, &w, &t);
    w.base = m->be->ops->alloc(m->be, w.used);
    int rc;
    if (!w.base) {
        rc = clef_fail(err, 422, CLEF_E_CAPACITY, NULL, "too many tokens: cannot allocate a %zu-byte head workspace",
                       w.used);
    } else {
        w.used = 0;
        ws_layout(&m->cfg->head, &p, hidden_on_be, &w, &t);
        rc = head_inputs(m, &p, hidden, hidden_on_be, &t, err);
        if (rc == 0) rc = head_evidence(m, &p, &t, err);
        if (rc == 0) rc = head_fields(m, &p, &t, err);
        if (rc == 0) rc = head_decoder(m, &p, &t, err);
        if (rc == 0) rc = head_scores(m, &p, &t, logits, err);
        m->be->ops->free(m->be, w.base);
    }
    plan_free(&p);
    return rc;
}

int clef_head_forward(clef_model *m, const float *hidden, const clef_record *rec, float *logits, clef_err *err) {
    return head_forward(m, hidden, 0, rec, logits, err);
}

int clef_head_forward_backend(clef_model *m, const float *hidden_be, const clef_record *rec, float *logits,
                              clef_err *err) {
    return head_forward(m, hidden_be, 1, rec, logits, err);
}
