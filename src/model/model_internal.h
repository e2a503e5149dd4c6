/* model_internal.h — the bound weights of the thinker text decoder and the
 * joint schema head, shared by model.c (binding), thinker.c and head.c.
 *
 * Matrices are clef_weight views on the backend (CPU: borrowed from the
 * mapped checkpoint, any supported dtype).  Vectors (norm weights, biases)
 * are converted to f32 once at load and live in backend memory owned by the
 * model (`owned` list).  Scalars of the head are host floats.
 */
#ifndef CLEF_MODEL_INTERNAL_H
#define CLEF_MODEL_INTERNAL_H

#include "backend/backend.h"
#include "model/model.h"
#include "quant/format.h"

/* One decoder layer of the thinker (SPEC §6.2, §6.4). */
typedef struct thinker_layer {
    float *input_norm;      /* [H] */
    float *post_norm;       /* [H] */
    float *q_norm, *k_norm; /* [D] */
    clef_weight q_proj;     /* [n_h D, H] (unused when fused_qkv) */
    clef_weight k_proj;     /* [n_kv D, H] (unused when fused_qkv) */
    clef_weight v_proj;     /* [n_kv D, H] (unused when fused_qkv) */
    int fused_qkv;          /* q, k, v rows in qkv_proj (model.c bind_qkv) */
    clef_weight qkv_proj;   /* [(n_h + 2 n_kv) D, H]: rows q, k, v */
    clef_weight o_proj;     /* [H, n_h D] */
    int is_moe;
    /* MoE (is_moe) */
    clef_weight router;     /* mlp.gate [E, H] */
    clef_weight *experts;   /* [3E]: gate[0..E), up[E..2E), down[2E..3E), owned array */
    clef_moe_weights moe;   /* points into `experts` */
    /* dense SwiGLU MLP (!is_moe) */
    clef_weight mlp_gate, mlp_up; /* [I, H] */
    clef_weight mlp_down;         /* [H, I] */
} thinker_layer;

/* nn.MultiheadAttention with packed in_proj (SPEC §7.3). */
typedef struct head_mha {
    clef_weight in_proj; /* [3W, W]: rows Q, K, V */
    clef_weight q_rows;  /* view: rows [0, W) */
    clef_weight kv_rows; /* view: rows [W, 3W) */
    float *in_bias;      /* [3W] */
    clef_weight out_proj; /* [W, W] */
    float *out_bias;      /* [W] */
} head_mha;

typedef struct head_evidence_layer {
    float *query_norm_w, *query_norm_b;
    float *memory_norm_w, *memory_norm_b;
    float *ff_norm_w, *ff_norm_b;
    head_mha attn;
    clef_weight ff0, ff3; /* [F, W], [W, F] */
    float *ff0_b, *ff3_b;
} head_evidence_layer;

/* nn.TransformerDecoderLayer, norm_first, GELU. */
typedef struct head_decoder_layer {
    head_mha self_attn, cross_attn;
    clef_weight linear1, linear2; /* [F, W], [W, F] */
    float *linear1_b, *linear2_b;
    float *norm1_w, *norm1_b, *norm2_w, *norm2_b, *norm3_w, *norm3_b;
} head_decoder_layer;

typedef struct head_weights {
    float *hidden_norm_w, *hidden_norm_b; /* [H] */
    clef_weight memory, question, option_question, global, option_context, option_lexical; /* [W, H] */
    clef_weight type_embedding;           /* [3, W], a gather table */
    head_evidence_layer *evidence;        /* [routing_layers] */
    head_decoder_layer *decoder;          /* [layers] */
    float *summary_norm_w, *summary_norm_b, *field_norm_w, *field_norm_b, *option_norm_w, *option_norm_b;
    clef_weight scorer0;                  /* [W, 4W] */
    float *scorer0_b;                     /* [W] */
    clef_weight scorer3;                  /* [1, W] */
    float *scorer3_b;                     /* [1] */
    float prior_scale; /* exp(min(prior_logit_scale, ln 100)) */
    float joint_scale; /* exp(min(joint_logit_scale, ln 100)) */
    float gate;        /* sigmoid(residual_gate) */
} head_weights;

struct clef_model {
    const clef_checkpoint *ck;
    const clef_config *cfg;
    clef_quant_config quant; /* detected quantization (format NONE for BF16), see quant/format.h */
    clef_backend *be;
    int own_backend;
    const struct clef_place_plan *plan; /* while binding: the layers whose experts are streamed (NULL: none) */
    /* thinker */
    clef_weight embed;   /* [V, H] */
    clef_weight lm_head; /* [V, H], lexical rows of the head only */
    float *final_norm;   /* [H] */
    float *inv_freq;     /* [D/2] backend memory */
    thinker_layer *layers;
    /* head */
    head_weights head;
    /* backend memory owned by the model (vectors), freed at clef_model_free */
    void **owned;
    size_t n_owned, cap_owned;
    /* every bound weight, for weight_release at clef_model_free */
    clef_weight **weights;
    size_t n_weights, cap_weights;
    /* the thinker's last workspace, kept between forwards on a backend with
     * graph_run (so a repeated batch layout finds its buffers at the same
     * addresses and replays); NULL while a forward holds it (thinker.c) */
    void *ws_keep;
    size_t ws_keep_bytes;
    /* unique per model created in this process (never reused, unlike the
     * model's address once freed): part of the thinker's graph_run key, so a
     * backend shared by a freed model and a new one never replays the freed
     * one's launches (its weight addresses) for the new one */
    uint64_t serial;
};

/* A bump allocator over one backend allocation, so a forward does one
 * allocation sized from its token count instead of one per tensor. */
typedef struct model_ws {
    size_t used;  /* bytes planned / taken */
    char *base;   /* NULL while planning */
} model_ws;

/* Reserve `n` elements of `size` bytes (64-byte aligned).  While planning
 * (base NULL) returns NULL and only counts. */
static inline void *ws_take(model_ws *ws, size_t n, size_t size) {
    size_t off = ws->used;
    ws->used += (n * size + 63) & ~(size_t)63;
    return ws->base ? ws->base + off : NULL;
}

#endif
