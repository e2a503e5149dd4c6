/* tensor_names.h — the names and shapes of the thinker's tensors (SPEC §6.4,
 * the release layout: "thinker.model.layers.<l>.<module>.weight" per layer,
 * the embeddings, final norm and lm_head outside them),
 * in one table shared by what binds them (model/model.c), what sizes them
 * for a placement plan (engine/placement.c), what writes synthetic
 * checkpoints (io/synth.c) and what lists a checkpoint's quantizable
 * modules (quant/summary.c), so a name or a shape rule is spelled once.
 * Pure functions, no allocation. */
#ifndef CLEF_IO_TENSOR_NAMES_H
#define CLEF_IO_TENSOR_NAMES_H

#include <stddef.h>
#include <stdint.h>

#include "io/config.h"

/* The widths a layer tensor's shape is made of (elements). */
typedef struct {
    int64_t hidden;     /* H */
    int64_t head_dim;   /* D */
    int64_t q_dim;      /* attention heads x D */
    int64_t kv_dim;     /* key/value heads x D */
    int64_t experts;    /* E: router rows */
    int64_t inter;      /* dense MLP intermediate (non-MoE layers) */
    int64_t moe_inter;  /* one expert's intermediate */
    int64_t vocab;      /* V: embedding and lm_head rows */
} clef_layer_dims;

/* The dims of config c. */
clef_layer_dims clef_layer_dims_of(const clef_text_config *c);

/* A layer's tensors other than the experts, in this order. */
enum {
    CLEF_LT_INPUT_NORM, /* input_layernorm [H] */
    CLEF_LT_POST_NORM,  /* post_attention_layernorm [H] */
    CLEF_LT_Q_PROJ,     /* self_attn.q_proj [q_dim, H] */
    CLEF_LT_K_PROJ,     /* self_attn.k_proj [kv_dim, H] */
    CLEF_LT_V_PROJ,     /* self_attn.v_proj [kv_dim, H] */
    CLEF_LT_O_PROJ,     /* self_attn.o_proj [H, q_dim] */
    CLEF_LT_Q_NORM,     /* self_attn.q_norm [D] */
    CLEF_LT_K_NORM,     /* self_attn.k_norm [D] */
    CLEF_LT_ROUTER,     /* mlp.gate [E, H]: MoE layers */
    CLEF_LT_MLP_GATE,   /* mlp.gate_proj [inter, H]: dense layers */
    CLEF_LT_MLP_UP,     /* mlp.up_proj [inter, H]: dense layers */
    CLEF_LT_MLP_DOWN,   /* mlp.down_proj [H, inter]: dense layers */
    CLEF_LT_COUNT
};

/* Which layers hold a tensor. */
enum { CLEF_LT_EVERY = 0, CLEF_LT_MOE_ONLY = 1, CLEF_LT_DENSE_ONLY = 2 };

/* Tensor `id`'s module (e.g. "self_attn.q_proj"), whether it is a 1-d vector
 * (only rows meaningful, cols 0), which layers hold it; NULL past the table. */
const char *clef_layer_tensor_module(int id, int *vector, int *layers);

/* Whether layer l (MoE or not) holds tensor id. */
int clef_layer_has_tensor(int id, int is_moe);

/* Tensor id's shape under dims d: *rows, *cols (cols 0 for a vector). */
void clef_layer_tensor_shape(const clef_layer_dims *d, int id, int64_t *rows, int64_t *cols);

/* "thinker.model.layers.<l>.<module>" of tensor id into buf (n bytes), with
 * ".weight" when `weight`; buf, or NULL if it did not fit. */
const char *clef_layer_tensor_name(char *buf, size_t n, int64_t l, int id, int weight);

/* The thinker's tensors outside its layers. */
enum {
    CLEF_TT_EMBED,      /* thinker.model.embed_tokens [V, H] */
    CLEF_TT_LM_HEAD,    /* thinker.lm_head [V, H] */
    CLEF_TT_FINAL_NORM, /* thinker.model.norm [H] */
    CLEF_TT_COUNT
};

/* Tensor `id`'s module ("thinker.lm_head") and whether it is a vector; NULL past the table. */
const char *clef_thinker_tensor_module(int id, int *vector);

/* Its shape under dims d (cols 0 for a vector). */
void clef_thinker_tensor_shape(const clef_layer_dims *d, int id, int64_t *rows, int64_t *cols);

/* Its name into buf, with ".weight" when `weight`; buf, or NULL if it did not fit or id is past the table. */
const char *clef_thinker_tensor_name(char *buf, size_t n, int id, int weight);

/* The three expert projections. */
enum { CLEF_PROJ_GATE, CLEF_PROJ_UP, CLEF_PROJ_DOWN };

/* "gate_proj", "up_proj", "down_proj"; NULL past them. */
const char *clef_expert_proj(int p);

/* Projection p's shape for one expert: gate / up [moe_inter, H], down [H, moe_inter]. */
void clef_expert_shape(const clef_layer_dims *d, int p, int64_t *rows, int64_t *cols);

/* "thinker.model.layers.<l>.mlp.experts.<e>.<proj>" (the release layout's
 * per-expert module), with ".weight" when `weight`; buf, or NULL if it did not fit. */
const char *clef_expert_name(char *buf, size_t n, int64_t l, int64_t e, int p, int weight);

/* The fused transformers-5 expert tensors of layer l:
 * "thinker.model.layers.<l>.mlp.experts.gate_up_proj" [E, 2 moe_inter, H]
 * (down = 0) or ".down_proj" [E, H, moe_inter] (down = 1); buf or NULL. */
const char *clef_fused_experts_name(char *buf, size_t n, int64_t l, int down);

#endif
