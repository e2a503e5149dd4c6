/* summary.c — bytes per weight type of the modules the model binds. */
#include "quant/summary.h"

#include <stdio.h>
#include <string.h>

#include "io/checkpoint.h"

static int add_module(const clef_checkpoint *ck, const clef_quant_config *qc, const char *module, int64_t rows,
                      int64_t cols, int expert, clef_quant_summary *s, clef_err *err) {
    clef_qweight w;
    if (clef_qweight_bind(ck, qc, module, rows, cols, &w, err) != 0) return -1;
    size_t b = clef_qweight_bytes(&w);
    s->modules[w.quant.type]++;
    s->bytes[w.quant.type] += b;
    s->linear_bf16_bytes += (size_t)rows * (size_t)cols * 2;
    if (expert) {
        s->expert_modules++;
        s->expert_bytes += b;
    }
    return 0;
}

static int add_layer(const clef_checkpoint *ck, const clef_quant_config *qc, int64_t l, clef_quant_summary *s,
                     clef_err *err) {
    const clef_text_config *c = &ck->config.text;
    const int64_t H = c->hidden_size, qd = c->num_attention_heads * c->head_dim, kd = c->num_key_value_heads * c->head_dim;
    char m[256];
    static const char *const attn[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    const int64_t rows[4] = {qd, kd, kd, H}, cols[4] = {H, H, H, qd};
    for (int i = 0; i < 4; i++) {
        snprintf(m, sizeof m, "thinker.model.layers.%lld.self_attn.%s", (long long)l, attn[i]);
        if (add_module(ck, qc, m, rows[i], cols[i], 0, s, err)) return -1;
    }
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    if (!clef_layer_is_moe(c, l)) {
        const int64_t I = c->intermediate_size;
        for (int k = 0; k < 3; k++) {
            snprintf(m, sizeof m, "thinker.model.layers.%lld.mlp.%s", (long long)l, proj[k]);
            if (add_module(ck, qc, m, k == 2 ? H : I, k == 2 ? I : H, 0, s, err)) return -1;
        }
        return 0;
    }
    snprintf(m, sizeof m, "thinker.model.layers.%lld.mlp.gate", (long long)l);
    if (add_module(ck, qc, m, c->num_experts, H, 0, s, err)) return -1;
    const int64_t I = c->moe_intermediate_size;
    for (int64_t e = 0; e < c->num_experts; e++)
        for (int k = 0; k < 3; k++) {
            snprintf(m, sizeof m, "thinker.model.layers.%lld.mlp.experts.%lld.%s", (long long)l, (long long)e, proj[k]);
            if (add_module(ck, qc, m, k == 2 ? H : I, k == 2 ? I : H, 1, s, err)) return -1;
        }
    return 0;
}

/* Non-Linear tensors the model binds: embeddings, lm_head, norms, the head. */
static int other_tensor(const char *name) {
    if (strncmp(name, "thinker.", 8) != 0) return 1; /* joint_head.safetensors */
    static const char *const exact[] = {"thinker.model.embed_tokens.weight", "thinker.lm_head.weight",
                                        "thinker.model.norm.weight"};
    for (size_t i = 0; i < 3; i++)
        if (!strcmp(name, exact[i])) return 1;
    if (strncmp(name, "thinker.model.layers.", 21) != 0) return 0;
    return strstr(name, "layernorm.weight") || strstr(name, "_norm.weight");
}

int clef_quant_summarize(const clef_checkpoint *ck, const clef_quant_config *qc, clef_quant_summary *s,
                         clef_err *err) {
    memset(s, 0, sizeof *s);
    for (int64_t l = 0; l < ck->config.text.num_hidden_layers; l++)
        if (add_layer(ck, qc, l, s, err)) return -1;
    for (size_t i = 0; i < ck->n_tensors; i++)
        if (other_tensor(ck->catalog[i]->name)) s->other_bytes += ck->catalog[i]->nbytes;
    return 0;
}
