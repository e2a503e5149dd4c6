/* tensor_names.c — the table of tensor_names.h. */
#include "io/tensor_names.h"

#include <stdio.h>

#define LAYERS "thinker.model.layers."

static const struct {
    const char *module;
    int vector, layers;
} TABLE[CLEF_LT_COUNT] = {
    [CLEF_LT_INPUT_NORM] = {"input_layernorm", 1, CLEF_LT_EVERY},
    [CLEF_LT_POST_NORM] = {"post_attention_layernorm", 1, CLEF_LT_EVERY},
    [CLEF_LT_Q_PROJ] = {"self_attn.q_proj", 0, CLEF_LT_EVERY},
    [CLEF_LT_K_PROJ] = {"self_attn.k_proj", 0, CLEF_LT_EVERY},
    [CLEF_LT_V_PROJ] = {"self_attn.v_proj", 0, CLEF_LT_EVERY},
    [CLEF_LT_O_PROJ] = {"self_attn.o_proj", 0, CLEF_LT_EVERY},
    [CLEF_LT_Q_NORM] = {"self_attn.q_norm", 1, CLEF_LT_EVERY},
    [CLEF_LT_K_NORM] = {"self_attn.k_norm", 1, CLEF_LT_EVERY},
    [CLEF_LT_ROUTER] = {"mlp.gate", 0, CLEF_LT_MOE_ONLY},
    [CLEF_LT_MLP_GATE] = {"mlp.gate_proj", 0, CLEF_LT_DENSE_ONLY},
    [CLEF_LT_MLP_UP] = {"mlp.up_proj", 0, CLEF_LT_DENSE_ONLY},
    [CLEF_LT_MLP_DOWN] = {"mlp.down_proj", 0, CLEF_LT_DENSE_ONLY},
};

clef_layer_dims clef_layer_dims_of(const clef_text_config *c) {
    return (clef_layer_dims){.hidden = c->hidden_size,
                             .head_dim = c->head_dim,
                             .q_dim = c->num_attention_heads * c->head_dim,
                             .kv_dim = c->num_key_value_heads * c->head_dim,
                             .experts = c->num_experts,
                             .inter = c->intermediate_size,
                             .moe_inter = c->moe_intermediate_size,
                             .vocab = c->vocab_size};
}

const char *clef_layer_tensor_module(int id, int *vector, int *layers) {
    if (id < 0 || id >= CLEF_LT_COUNT) return NULL;
    if (vector) *vector = TABLE[id].vector;
    if (layers) *layers = TABLE[id].layers;
    return TABLE[id].module;
}

int clef_layer_has_tensor(int id, int is_moe) {
    if (id < 0 || id >= CLEF_LT_COUNT) return 0;
    return TABLE[id].layers == CLEF_LT_EVERY || TABLE[id].layers == (is_moe ? CLEF_LT_MOE_ONLY : CLEF_LT_DENSE_ONLY);
}

void clef_layer_tensor_shape(const clef_layer_dims *d, int id, int64_t *rows, int64_t *cols) {
    int64_t r = 0, k = 0;
    switch (id) {
    case CLEF_LT_INPUT_NORM:
    case CLEF_LT_POST_NORM: r = d->hidden; break;
    case CLEF_LT_Q_NORM:
    case CLEF_LT_K_NORM: r = d->head_dim; break;
    case CLEF_LT_Q_PROJ: r = d->q_dim, k = d->hidden; break;
    case CLEF_LT_K_PROJ:
    case CLEF_LT_V_PROJ: r = d->kv_dim, k = d->hidden; break;
    case CLEF_LT_O_PROJ: r = d->hidden, k = d->q_dim; break;
    case CLEF_LT_ROUTER: r = d->experts, k = d->hidden; break;
    case CLEF_LT_MLP_GATE:
    case CLEF_LT_MLP_UP: r = d->inter, k = d->hidden; break;
    case CLEF_LT_MLP_DOWN: r = d->hidden, k = d->inter; break;
    default: break;
    }
    *rows = r, *cols = k;
}

/* snprintf into buf: buf, or NULL when it was cut. */
static const char *fits(char *buf, size_t n, int w) { return w >= 0 && (size_t)w < n ? buf : NULL; }

const char *clef_layer_tensor_name(char *buf, size_t n, int64_t l, int id, int weight) {
    if (id < 0 || id >= CLEF_LT_COUNT) return NULL;
    return fits(buf, n, snprintf(buf, n, LAYERS "%lld.%s%s", (long long)l, TABLE[id].module, weight ? ".weight" : ""));
}

static const struct {
    const char *module;
    int vector;
} THINKER[CLEF_TT_COUNT] = {
    [CLEF_TT_EMBED] = {"thinker.model.embed_tokens", 0},
    [CLEF_TT_LM_HEAD] = {"thinker.lm_head", 0},
    [CLEF_TT_FINAL_NORM] = {"thinker.model.norm", 1},
};

const char *clef_thinker_tensor_module(int id, int *vector) {
    if (id < 0 || id >= CLEF_TT_COUNT) return NULL;
    if (vector) *vector = THINKER[id].vector;
    return THINKER[id].module;
}

void clef_thinker_tensor_shape(const clef_layer_dims *d, int id, int64_t *rows, int64_t *cols) {
    *rows = id == CLEF_TT_FINAL_NORM ? d->hidden : id == CLEF_TT_EMBED || id == CLEF_TT_LM_HEAD ? d->vocab : 0;
    *cols = id == CLEF_TT_EMBED || id == CLEF_TT_LM_HEAD ? d->hidden : 0;
}

const char *clef_thinker_tensor_name(char *buf, size_t n, int id, int weight) {
    if (id < 0 || id >= CLEF_TT_COUNT) return NULL;
    return fits(buf, n, snprintf(buf, n, "%s%s", THINKER[id].module, weight ? ".weight" : ""));
}

const char *clef_expert_proj(int p) {
    static const char *const PROJ[3] = {"gate_proj", "up_proj", "down_proj"};
    return p >= 0 && p < 3 ? PROJ[p] : NULL;
}

void clef_expert_shape(const clef_layer_dims *d, int p, int64_t *rows, int64_t *cols) {
    *rows = p == CLEF_PROJ_DOWN ? d->hidden : d->moe_inter;
    *cols = p == CLEF_PROJ_DOWN ? d->moe_inter : d->hidden;
}

const char *clef_expert_name(char *buf, size_t n, int64_t l, int64_t e, int p, int weight) {
    const char *proj = clef_expert_proj(p);
    if (!proj) return NULL;
    return fits(buf, n,
                snprintf(buf, n, LAYERS "%lld.mlp.experts.%lld.%s%s", (long long)l, (long long)e, proj,
                         weight ? ".weight" : ""));
}

const char *clef_fused_experts_name(char *buf, size_t n, int64_t l, int down) {
    return fits(buf, n, snprintf(buf, n, LAYERS "%lld.mlp.experts.%s", (long long)l, down ? "down_proj" : "gate_up_proj"));
}
