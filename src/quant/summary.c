/* summary.c — bytes per weight type of the modules the model binds. */
#include "quant/summary.h"

#include <stdio.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/tensor_names.h"

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
    const clef_layer_dims d = clef_layer_dims_of(c);
    const int moe = clef_layer_is_moe(c, l);
    char m[256];
    for (int id = 0; id < CLEF_LT_COUNT; id++) { /* the layer's matrices (tensor_names.h), not its norms */
        int vector = 0;
        int64_t r, k;
        clef_layer_tensor_module(id, &vector, NULL);
        if (vector || !clef_layer_has_tensor(id, moe)) continue;
        clef_layer_tensor_shape(&d, id, &r, &k);
        if (add_module(ck, qc, clef_layer_tensor_name(m, sizeof m, l, id, 0), r, k, 0, s, err)) return -1;
    }
    if (!moe) return 0;
    for (int64_t e = 0; e < c->num_experts; e++)
        for (int p = 0; p < 3; p++) {
            int64_t r, k;
            clef_expert_shape(&d, p, &r, &k);
            if (add_module(ck, qc, clef_expert_name(m, sizeof m, l, e, p, 0), r, k, 1, s, err)) return -1;
        }
    return 0;
}

/* Non-Linear tensors the model binds: embeddings, lm_head, norms, the head. */
static int other_tensor(const char *name) {
    if (strncmp(name, "thinker.", 8) != 0) return 1; /* joint_head.safetensors */
    for (int id = 0; id < CLEF_TT_COUNT; id++) { /* embeddings, lm_head, final norm (tensor_names.h) */
        char nb[128];
        if (!strcmp(name, clef_thinker_tensor_name(nb, sizeof nb, id, 1))) return 1;
    }
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
