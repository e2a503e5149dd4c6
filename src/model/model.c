/* model.c — binding the thinker text decoder and the joint schema head by
 * tensor name (SPEC §6.4, §7.2) onto a backend. */
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "model/model_internal.h"
#include "engine/placement.h"
#include "io/tensor_names.h"
#include "quant/qweight.h"
#include "util/buf.h"

/* Weight dtypes the model accepts for matrices and vectors. */
#define PLAIN_DTYPES (CLEF_DT_BIT(CLEF_DT_BF16) | CLEF_DT_BIT(CLEF_DT_F16) | CLEF_DT_BIT(CLEF_DT_F32))

#define NAME_MAX_LEN 256

/* printf into a fixed name buffer. */
static const char *name_of(char *buf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *name_of(char *buf, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, NAME_MAX_LEN, fmt, ap);
    va_end(ap);
    return buf;
}

/* Remember a backend weight for weight_release. */
static void track_weight(clef_model *m, clef_weight *w) {
    if (m->n_weights == m->cap_weights) {
        m->cap_weights = m->cap_weights ? 2 * m->cap_weights : 256;
        m->weights = clef_xrealloc(m->weights, m->cap_weights * sizeof *m->weights);
    }
    m->weights[m->n_weights++] = w;
}

/* Make host bytes a backend weight and remember it for weight_release. */
static int init_weight(clef_model *m, clef_weight *w, clef_dtype dt, int64_t rows, int64_t cols, const void *host,
                       clef_err *err) {
    if (m->be->ops->weight_init(m->be, w, dt, rows, cols, host, err) != 0) return -1;
    track_weight(m, w);
    return 0;
}

/* A weight resolved by clef_qweight_bind (plain or packed) made a backend
 * weight, remembered for weight_release. */
static int init_packed(clef_model *m, clef_weight *w, const clef_qweight *q, clef_err *err) {
    if (m->be->ops->weight_init_packed(m->be, w, q, err) != 0) return -1;
    track_weight(m, w);
    return 0;
}

/* Matrix `name` ("<module>.weight") of shape [rows, cols] as a backend
 * weight: clef_qweight_bind resolves the module to its plain or packed
 * (quantized) tensors, so model code never sees the checkpoint's format. */
static int bind_mat(clef_model *m, const char *name, int64_t rows, int64_t cols, clef_weight *w, clef_err *err) {
    size_t n = strlen(name);
    if (n <= 7 || strcmp(name + n - 7, ".weight") != 0)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "weight name '%s' does not end in .weight", name);
    char module[NAME_MAX_LEN];
    snprintf(module, sizeof module, "%.*s", (int)(n - 7), name);
    clef_qweight q;
    if (clef_qweight_bind(m->ck, &m->quant, module, rows, cols, &q, err) != 0) return -1;
    return init_packed(m, w, &q, err);
}

/* Backend memory owned by the model until clef_model_free. */
static void *own_alloc(clef_model *m, size_t bytes, clef_err *err) {
    void *p = m->be->ops->alloc(m->be, bytes);
    if (!p) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "cannot allocate %zu bytes of %s backend memory", bytes,
                  m->be->ops->name);
        return NULL;
    }
    if (m->n_owned == m->cap_owned) {
        m->cap_owned = m->cap_owned ? 2 * m->cap_owned : 64;
        m->owned = clef_xrealloc(m->owned, m->cap_owned * sizeof *m->owned);
    }
    m->owned[m->n_owned++] = p;
    return p;
}

/* Upload `n` host floats into new model-owned backend memory. */
static float *upload_f32(clef_model *m, const float *host, size_t n, clef_err *err) {
    float *p = own_alloc(m, n * sizeof(float), err);
    if (!p) return NULL;
    if (m->be->ops->upload(m->be, p, host, n * sizeof(float), err) != 0) return NULL;
    return p;
}

/* Vector `name` of length n (any plain dtype), converted to f32 on the
 * backend.  ndim 1, or 0 for a scalar read with bind_scalar. */
static int bind_vec(clef_model *m, const char *name, int64_t n, float **out, clef_err *err) {
    const st_tensor *t = clef_checkpoint_require(m->ck, name, PLAIN_DTYPES, 1, &n, err);
    if (!t) return -1;
    float *tmp = clef_xmalloc((size_t)n * sizeof *tmp);
    clef_to_f32(t->dtype, t->data, tmp, (size_t)n);
    *out = upload_f32(m, tmp, (size_t)n, err);
    free(tmp);
    return *out ? 0 : -1;
}

/* 0-d scalar `name` as a host float. */
static int bind_scalar(clef_model *m, const char *name, float *out, clef_err *err) {
    const st_tensor *t = clef_checkpoint_require(m->ck, name, PLAIN_DTYPES, 0, NULL, err);
    if (!t) return -1;
    clef_to_f32(t->dtype, t->data, out, 1);
    if (!isfinite(*out)) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "tensor '%s' is not finite", name);
    return 0;
}

/* Experts of layer l: per-expert tensors (the release layout) or the fused
 * transformers-5 tensors gate_up_proj [E, 2I, H] (gate rows first) and
 * down_proj [E, H, I], bound as per-expert row views. */
static int bind_experts(clef_model *m, int64_t l, thinker_layer *L, clef_err *err) {
    const clef_text_config *c = &m->cfg->text;
    const int64_t E = c->num_experts, H = c->hidden_size, NI = c->moe_intermediate_size;
    char nb[NAME_MAX_LEN];
    L->experts = clef_xcalloc((size_t)(3 * E), sizeof *L->experts);
    clef_weight *gate = L->experts, *up = gate + E, *down = up + E;
    const char *fused = clef_fused_experts_name(nb, sizeof nb, l, 0);
    if (clef_checkpoint_find(m->ck, fused)) {
        if (m->quant.format != CLEF_QF_NONE) /* never a silent BF16 fallback */
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                             "checkpoint: tensor '%s' is unquantized, but quantization_config (%s) quantizes the "
                             "experts", fused, clef_quant_format_name(m->quant.format));
        int64_t s_gu[3] = {E, 2 * NI, H}, s_d[3] = {E, H, NI};
        const st_tensor *gu = clef_checkpoint_require(m->ck, fused, PLAIN_DTYPES, 3, s_gu, err);
        if (!gu) return -1;
        const st_tensor *dn =
            clef_checkpoint_require(m->ck, clef_fused_experts_name(nb, sizeof nb, l, 1), PLAIN_DTYPES, 3, s_d, err);
        if (!dn) return -1;
        size_t es = clef_dtype_size(gu->dtype), ds = clef_dtype_size(dn->dtype);
        for (int64_t e = 0; e < E; e++) {
            const char *g0 = (const char *)gu->data + (size_t)(e * 2 * NI * H) * es;
            if (init_weight(m, &gate[e], gu->dtype, NI, H, g0, err) ||
                init_weight(m, &up[e], gu->dtype, NI, H, g0 + (size_t)(NI * H) * es, err) ||
                init_weight(m, &down[e], dn->dtype, H, NI,
                                        (const char *)dn->data + (size_t)(e * H * NI) * ds, err))
                return -1;
        }
    } else {
        const clef_layer_dims d = clef_layer_dims_of(c);
        clef_weight *const dst[3] = {gate, up, down};
        for (int64_t e = 0; e < E; e++)
            for (int p = 0; p < 3; p++) {
                int64_t r, k;
                clef_expert_shape(&d, p, &r, &k);
                if (bind_mat(m, clef_expert_name(nb, sizeof nb, l, e, p, 1), r, k, &dst[p][e], err)) return -1;
            }
    }
    L->moe = (clef_moe_weights){.n_experts = E, .hidden = H, .inter = NI, .gate = gate, .up = up, .down = down};
    return 0;
}

/* q, k and v projections of layer l.  On a backend that copies weights,
 * plain ones of one dtype become one weight L->qkv_proj [(nh + 2 nkv) D, H]
 * (rows q, then k, then v; a product with it gives each token's q | k | v
 * in one row) and L->fused_qkv is set; otherwise (CPU, or a quantized
 * projection) three weights. */
static int bind_qkv(clef_model *m, int64_t l, thinker_layer *L, clef_err *err) {
    const clef_layer_dims d = clef_layer_dims_of(&m->cfg->text);
    const int64_t H = d.hidden;
    static const int ids[3] = {CLEF_LT_Q_PROJ, CLEF_LT_K_PROJ, CLEF_LT_V_PROJ};
    clef_weight *sep[3] = {&L->q_proj, &L->k_proj, &L->v_proj};
    char module[NAME_MAX_LEN];
    clef_qweight q[3];
    int64_t rows[3], cols;
    int fuse = m->be->ops->copies_weights;
    for (int i = 0; i < 3; i++) {
        clef_layer_tensor_shape(&d, ids[i], &rows[i], &cols);
        clef_layer_tensor_name(module, sizeof module, l, ids[i], 0);
        if (clef_qweight_bind(m->ck, &m->quant, module, rows[i], cols, &q[i], err) != 0) return -1;
        fuse &= q[i].quant.type == CLEF_QT_NONE && q[i].dtype == q[0].dtype;
    }
    if (!fuse) {
        for (int i = 0; i < 3; i++)
            if (init_packed(m, sep[i], &q[i], err) != 0) return -1;
        return 0;
    }
    const size_t row_bytes = (size_t)H * clef_dtype_size(q[0].dtype);
    char *cat = clef_xmalloc((size_t)(rows[0] + rows[1] + rows[2]) * row_bytes);
    int64_t r0 = 0;
    for (int i = 0; i < 3; i++) {
        memcpy(cat + (size_t)r0 * row_bytes, q[i].data, (size_t)rows[i] * row_bytes);
        r0 += rows[i];
    }
    const int rc = init_weight(m, &L->qkv_proj, q[0].dtype, rows[0] + rows[1] + rows[2], H, cat, err);
    free(cat); /* the backend copied it */
    L->fused_qkv = rc == 0;
    return rc;
}

/* Layer l's tensor `id` with ".weight" into nb (NAME_MAX_LEN bytes); NULL with err if it did not fit. */
static const char *layer_name(char *nb, int64_t l, int id, clef_err *err) {
    const char *n = clef_layer_tensor_name(nb, NAME_MAX_LEN, l, id, 1);
    if (!n) clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "layer %lld: tensor name too long", (long long)l);
    return n;
}
/* Layer l's tensor `id` (tensor_names.h: its name and shape) bound as a vector (*out) or a matrix (w). */
static int bind_layer_vec(clef_model *m, const clef_layer_dims *d, int64_t l, int id, float **out, clef_err *err) {
    char nb[NAME_MAX_LEN];
    int64_t r, k;
    clef_layer_tensor_shape(d, id, &r, &k);
    return layer_name(nb, l, id, err) ? bind_vec(m, nb, r, out, err) : -1;
}
static int bind_layer_mat(clef_model *m, const clef_layer_dims *d, int64_t l, int id, clef_weight *w, clef_err *err) {
    char nb[NAME_MAX_LEN];
    int64_t r, k;
    clef_layer_tensor_shape(d, id, &r, &k);
    return layer_name(nb, l, id, err) ? bind_mat(m, nb, r, k, w, err) : -1;
}

static int bind_layer(clef_model *m, int64_t l, thinker_layer *L, clef_err *err) {
    const clef_text_config *c = &m->cfg->text;
    const clef_layer_dims d = clef_layer_dims_of(c);
    if (bind_layer_vec(m, &d, l, CLEF_LT_INPUT_NORM, &L->input_norm, err) ||
        bind_layer_vec(m, &d, l, CLEF_LT_POST_NORM, &L->post_norm, err) ||
        bind_layer_vec(m, &d, l, CLEF_LT_Q_NORM, &L->q_norm, err) ||
        bind_layer_vec(m, &d, l, CLEF_LT_K_NORM, &L->k_norm, err) || bind_qkv(m, l, L, err) ||
        bind_layer_mat(m, &d, l, CLEF_LT_O_PROJ, &L->o_proj, err))
        return -1;
    L->is_moe = clef_layer_is_moe(c, l);
    if (L->is_moe) {
        if (bind_layer_mat(m, &d, l, CLEF_LT_ROUTER, &L->router, err)) return -1;
        if (!m->plan || !m->plan->streamed[l]) return bind_experts(m, l, L, err);
        /* streamed: the experts' weights go to the backend's slot, their bytes to pinned host memory */
        if (m->be->ops->experts_stream_begin(m->be, m->plan->slot_bytes, err)) return -1;
        if (bind_experts(m, l, L, err)) return -1;
        return m->be->ops->experts_stream_end(m->be, &L->moe, err);
    }
    if (bind_layer_mat(m, &d, l, CLEF_LT_MLP_GATE, &L->mlp_gate, err) ||
        bind_layer_mat(m, &d, l, CLEF_LT_MLP_UP, &L->mlp_up, err) ||
        bind_layer_mat(m, &d, l, CLEF_LT_MLP_DOWN, &L->mlp_down, err))
        return -1;
    return 0;
}

/* inv_freq[j] = 1 / theta^(2j/D) in f32, as transformers computes it:
 * 1.0 / (base ** (arange(0, D, 2).float() / D)). */
static int bind_rope(clef_model *m, clef_err *err) {
    const int64_t D = m->cfg->text.head_dim;
    float *inv = clef_xmalloc((size_t)(D / 2) * sizeof *inv);
    const float theta = (float)m->cfg->text.rope_theta;
    for (int64_t j = 0; j < D / 2; j++) inv[j] = 1.0f / powf(theta, (float)(2 * j) / (float)D);
    m->inv_freq = upload_f32(m, inv, (size_t)(D / 2), err);
    free(inv);
    return m->inv_freq ? 0 : -1;
}

static int bind_thinker(clef_model *m, clef_err *err) {
    const clef_text_config *c = &m->cfg->text;
    const int64_t V = c->vocab_size, H = c->hidden_size;
    /* limits of the CPU kernels' fixed per-row buffers (rope tables, top-k) */
    if (c->head_dim > 4096)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                         "config.json: thinker_config.text_config.head_dim %lld is not supported (at most 4096)",
                         (long long)c->head_dim);
    if (c->num_experts_per_tok > 64)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                         "config.json: thinker_config.text_config.num_experts_per_tok %lld is not supported (at most 64)",
                         (long long)c->num_experts_per_tok);
    char nb[NAME_MAX_LEN];
    if (bind_mat(m, clef_thinker_tensor_name(nb, sizeof nb, CLEF_TT_EMBED, 1), V, H, &m->embed, err) ||
        bind_mat(m, clef_thinker_tensor_name(nb, sizeof nb, CLEF_TT_LM_HEAD, 1), V, H, &m->lm_head, err) ||
        bind_vec(m, clef_thinker_tensor_name(nb, sizeof nb, CLEF_TT_FINAL_NORM, 1), H, &m->final_norm, err) ||
        bind_rope(m, err))
        return -1;
    m->layers = clef_xcalloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    for (int64_t l = 0; l < c->num_hidden_layers; l++)
        if (bind_layer(m, l, &m->layers[l], err) != 0) return -1;
    return 0;
}

/* ---- head ---- */

/* `<prefix>.in_proj_weight` etc. of an nn.MultiheadAttention of width W. */
static int bind_mha(clef_model *m, const char *prefix, head_mha *a, clef_err *err) {
    const int64_t W = m->cfg->head.width;
    char nb[NAME_MAX_LEN];
    int64_t s_in[2] = {3 * W, W};
    const st_tensor *t =
        clef_checkpoint_require(m->ck, name_of(nb, "%s.in_proj_weight", prefix), PLAIN_DTYPES, 2, s_in, err);
    if (!t) return -1;
    size_t es = clef_dtype_size(t->dtype);
    if (init_weight(m, &a->in_proj, t->dtype, 3 * W, W, t->data, err) ||
        init_weight(m, &a->q_rows, t->dtype, W, W, t->data, err) ||
        init_weight(m, &a->kv_rows, t->dtype, 2 * W, W, (const char *)t->data + (size_t)(W * W) * es,
                                err) ||
        bind_vec(m, name_of(nb, "%s.in_proj_bias", prefix), 3 * W, &a->in_bias, err) ||
        bind_mat(m, name_of(nb, "%s.out_proj.weight", prefix), W, W, &a->out_proj, err) ||
        bind_vec(m, name_of(nb, "%s.out_proj.bias", prefix), W, &a->out_bias, err))
        return -1;
    return 0;
}

/* LayerNorm `<prefix>.weight` / `.bias` of length n. */
static int bind_ln(clef_model *m, const char *prefix, int64_t n, float **w, float **b, clef_err *err) {
    char nb[NAME_MAX_LEN];
    if (bind_vec(m, name_of(nb, "%s.weight", prefix), n, w, err)) return -1;
    return bind_vec(m, name_of(nb, "%s.bias", prefix), n, b, err);
}

/* Linear `<prefix>.weight` [rows, cols] and `.bias` [rows]. */
static int bind_linear(clef_model *m, const char *prefix, int64_t rows, int64_t cols, clef_weight *w, float **b,
                       clef_err *err) {
    char nb[NAME_MAX_LEN];
    if (bind_mat(m, name_of(nb, "%s.weight", prefix), rows, cols, w, err)) return -1;
    return bind_vec(m, name_of(nb, "%s.bias", prefix), rows, b, err);
}

static int bind_evidence(clef_model *m, int64_t i, head_evidence_layer *e, clef_err *err) {
    const int64_t W = m->cfg->head.width, F = m->cfg->head.feedforward;
    char nb[NAME_MAX_LEN];
    const long long li = (long long)i;
    if (bind_ln(m, name_of(nb, "evidence_layers.%lld.query_norm", li), W, &e->query_norm_w, &e->query_norm_b, err) ||
        bind_ln(m, name_of(nb, "evidence_layers.%lld.memory_norm", li), W, &e->memory_norm_w, &e->memory_norm_b,
                err) ||
        bind_ln(m, name_of(nb, "evidence_layers.%lld.feedforward_norm", li), W, &e->ff_norm_w, &e->ff_norm_b, err) ||
        bind_mha(m, name_of(nb, "evidence_layers.%lld.attention", li), &e->attn, err) ||
        bind_linear(m, name_of(nb, "evidence_layers.%lld.feedforward.0", li), F, W, &e->ff0, &e->ff0_b, err) ||
        bind_linear(m, name_of(nb, "evidence_layers.%lld.feedforward.3", li), W, F, &e->ff3, &e->ff3_b, err))
        return -1;
    return 0;
}

static int bind_decoder(clef_model *m, int64_t i, head_decoder_layer *d, clef_err *err) {
    const int64_t W = m->cfg->head.width, F = m->cfg->head.feedforward;
    char nb[NAME_MAX_LEN];
    const long long li = (long long)i;
    if (bind_mha(m, name_of(nb, "layers.%lld.self_attn", li), &d->self_attn, err) ||
        bind_mha(m, name_of(nb, "layers.%lld.multihead_attn", li), &d->cross_attn, err) ||
        bind_linear(m, name_of(nb, "layers.%lld.linear1", li), F, W, &d->linear1, &d->linear1_b, err) ||
        bind_linear(m, name_of(nb, "layers.%lld.linear2", li), W, F, &d->linear2, &d->linear2_b, err) ||
        bind_ln(m, name_of(nb, "layers.%lld.norm1", li), W, &d->norm1_w, &d->norm1_b, err) ||
        bind_ln(m, name_of(nb, "layers.%lld.norm2", li), W, &d->norm2_w, &d->norm2_b, err) ||
        bind_ln(m, name_of(nb, "layers.%lld.norm3", li), W, &d->norm3_w, &d->norm3_b, err))
        return -1;
    return 0;
}

/* The learned scales, as the reference applies them: exp(clamp(s, max=ln 100))
 * and sigmoid(residual_gate), in f32. */
static int bind_head_scalars(clef_model *m, head_weights *h, clef_err *err) {
    float prior, joint, gate;
    if (bind_scalar(m, "prior_logit_scale", &prior, err) || bind_scalar(m, "joint_logit_scale", &joint, err) ||
        bind_scalar(m, "residual_gate", &gate, err))
        return -1;
    const float ln100 = (float)4.605170185988092;
    h->prior_scale = expf(prior < ln100 ? prior : ln100);
    h->joint_scale = expf(joint < ln100 ? joint : ln100);
    h->gate = 1.0f / (1.0f + expf(-gate));
    return 0;
}

static int bind_head(clef_model *m, clef_err *err) {
    const clef_head_config *hc = &m->cfg->head;
    const int64_t H = hc->hidden_size, W = hc->width;
    head_weights *h = &m->head;
    if (H != m->cfg->text.hidden_size)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "joint head hidden_size %lld != thinker hidden_size %lld",
                         (long long)H, (long long)m->cfg->text.hidden_size);
    if (bind_ln(m, "hidden_norm", H, &h->hidden_norm_w, &h->hidden_norm_b, err) ||
        bind_mat(m, "memory_projection.weight", W, H, &h->memory, err) ||
        bind_mat(m, "question_projection.weight", W, H, &h->question, err) ||
        bind_mat(m, "option_question_projection.weight", W, H, &h->option_question, err) ||
        bind_mat(m, "global_projection.weight", W, H, &h->global, err) ||
        bind_mat(m, "option_context_projection.weight", W, H, &h->option_context, err) ||
        bind_mat(m, "option_lexical_projection.weight", W, H, &h->option_lexical, err) ||
        bind_mat(m, "type_embedding.weight", 3, W, &h->type_embedding, err) ||
        bind_ln(m, "option_summary_norm", W, &h->summary_norm_w, &h->summary_norm_b, err) ||
        bind_ln(m, "field_norm", W, &h->field_norm_w, &h->field_norm_b, err) ||
        bind_ln(m, "option_norm", W, &h->option_norm_w, &h->option_norm_b, err) ||
        bind_linear(m, "residual_scorer.0", W, 4 * W, &h->scorer0, &h->scorer0_b, err) ||
        bind_linear(m, "residual_scorer.3", 1, W, &h->scorer3, &h->scorer3_b, err) || bind_head_scalars(m, h, err))
        return -1;
    h->evidence = clef_xcalloc((size_t)hc->routing_layers, sizeof *h->evidence);
    for (int64_t i = 0; i < hc->routing_layers; i++)
        if (bind_evidence(m, i, &h->evidence[i], err)) return -1;
    h->decoder = clef_xcalloc((size_t)hc->layers, sizeof *h->decoder);
    for (int64_t i = 0; i < hc->layers; i++)
        if (bind_decoder(m, i, &h->decoder[i], err)) return -1;
    return 0;
}

clef_model *clef_model_create_on(const clef_checkpoint *ck, clef_backend *be, int own_backend, clef_err *err) {
    return clef_model_create_placed(ck, be, own_backend, NULL, err);
}

clef_model *clef_model_create_placed(const clef_checkpoint *ck, clef_backend *be, int own_backend,
                                     const clef_place_plan *plan, clef_err *err) {
    if (plan && plan->n_streamed && (!be->ops->experts_stream_begin || !be->ops->experts_stream_end)) {
        clef_fail(err, 500, CLEF_E_INTERNAL, "gpu_memory", "the %s backend cannot stream experts (--gpu-memory)",
                  be->ops->name);
        if (own_backend) be->ops->destroy(be);
        return NULL;
    }
    clef_model *m = clef_xcalloc(1, sizeof *m);
    m->plan = plan && plan->n_streamed ? plan : NULL;
    m->ck = ck;
    m->cfg = &ck->config;
    m->be = be;
    m->own_backend = own_backend;
    static atomic_uint_least64_t next_serial;
    m->serial = (uint64_t)atomic_fetch_add(&next_serial, 1) + 1;
    if (clef_quant_detect(ck, &m->quant, err) != 0 || bind_thinker(m, err) != 0 || bind_head(m, err) != 0) {
        clef_model_free(m);
        return NULL;
    }
    m->plan = NULL; /* the caller's; binding is done */
    return m;
}

clef_model *clef_model_create(const clef_checkpoint *ck, int n_threads, clef_err *err) {
    clef_backend *be = clef_backend_cpu_create(n_threads, err);
    if (!be) return NULL;
    return clef_model_create_on(ck, be, 1, err);
}

void clef_model_free(clef_model *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n_weights; i++) m->be->ops->weight_release(m->be, m->weights[i]);
    free(m->weights);
    for (size_t i = 0; i < m->n_owned; i++) m->be->ops->free(m->be, m->owned[i]);
    free(m->owned);
    if (m->ws_keep) m->be->ops->free(m->be, m->ws_keep);
    if (m->layers) {
        for (int64_t l = 0; l < m->cfg->text.num_hidden_layers; l++) free(m->layers[l].experts);
        free(m->layers);
    }
    free(m->head.evidence);
    free(m->head.decoder);
    if (m->own_backend && m->be) m->be->ops->destroy(m->be);
    clef_quant_config_free(&m->quant);
    free(m);
}

const clef_config *clef_model_config(const clef_model *m) { return m->cfg; }

clef_backend *clef_model_backend(clef_model *m) { return m->be; }
