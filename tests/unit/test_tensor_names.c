/* test_tensor_names.c — the thinker's per-layer tensor table (io/tensor_names.h): exact names and
 * shapes for Clef-Omni's widths, which layers hold what, cut names refused, and every tensor the
 * table names present with the table's shape in the tiny release-layout fixture. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/tensor_names.h"
#include "testutil.h"

/* Qwen3-Omni-30B-A3B's thinker widths (SPEC §6.1). */
static clef_layer_dims omni_dims(void) {
    clef_text_config c;
    memset(&c, 0, sizeof c);
    c.hidden_size = 2048, c.head_dim = 128, c.num_attention_heads = 32, c.num_key_value_heads = 4;
    c.num_experts = 128, c.intermediate_size = 6144, c.moe_intermediate_size = 768, c.vocab_size = 152064;
    return clef_layer_dims_of(&c);
}

static void test_names_and_shapes(void **state) {
    (void)state;
    const clef_layer_dims d = omni_dims();
    assert_int_equal(d.q_dim, 4096);
    assert_int_equal(d.kv_dim, 512);
    static const struct {
        int id;
        const char *name;
        int64_t rows, cols;
        int vector;
    } want[] = {
        {CLEF_LT_INPUT_NORM, "thinker.model.layers.7.input_layernorm.weight", 2048, 0, 1},
        {CLEF_LT_POST_NORM, "thinker.model.layers.7.post_attention_layernorm.weight", 2048, 0, 1},
        {CLEF_LT_Q_PROJ, "thinker.model.layers.7.self_attn.q_proj.weight", 4096, 2048, 0},
        {CLEF_LT_K_PROJ, "thinker.model.layers.7.self_attn.k_proj.weight", 512, 2048, 0},
        {CLEF_LT_V_PROJ, "thinker.model.layers.7.self_attn.v_proj.weight", 512, 2048, 0},
        {CLEF_LT_O_PROJ, "thinker.model.layers.7.self_attn.o_proj.weight", 2048, 4096, 0},
        {CLEF_LT_Q_NORM, "thinker.model.layers.7.self_attn.q_norm.weight", 128, 0, 1},
        {CLEF_LT_K_NORM, "thinker.model.layers.7.self_attn.k_norm.weight", 128, 0, 1},
        {CLEF_LT_ROUTER, "thinker.model.layers.7.mlp.gate.weight", 128, 2048, 0},
        {CLEF_LT_MLP_GATE, "thinker.model.layers.7.mlp.gate_proj.weight", 6144, 2048, 0},
        {CLEF_LT_MLP_UP, "thinker.model.layers.7.mlp.up_proj.weight", 6144, 2048, 0},
        {CLEF_LT_MLP_DOWN, "thinker.model.layers.7.mlp.down_proj.weight", 2048, 6144, 0},
    };
    assert_int_equal(sizeof want / sizeof want[0], CLEF_LT_COUNT);
    for (size_t i = 0; i < CLEF_LT_COUNT; i++) {
        char nb[128];
        int64_t r = -1, k = -1;
        int vector = -1;
        assert_non_null(clef_layer_tensor_module(want[i].id, &vector, NULL));
        assert_int_equal(vector, want[i].vector);
        assert_string_equal(clef_layer_tensor_name(nb, sizeof nb, 7, want[i].id, 1), want[i].name);
        clef_layer_tensor_shape(&d, want[i].id, &r, &k);
        assert_int_equal(r, want[i].rows);
        assert_int_equal(k, want[i].cols);
    }
    char nb[128];
    assert_string_equal(clef_layer_tensor_name(nb, sizeof nb, 47, CLEF_LT_O_PROJ, 0), "thinker.model.layers.47.self_attn.o_proj");
    /* which layers hold what: the router only in MoE layers, the dense MLP only outside them */
    assert_true(clef_layer_has_tensor(CLEF_LT_ROUTER, 1));
    assert_false(clef_layer_has_tensor(CLEF_LT_ROUTER, 0));
    assert_true(clef_layer_has_tensor(CLEF_LT_MLP_DOWN, 0));
    assert_false(clef_layer_has_tensor(CLEF_LT_MLP_DOWN, 1));
    assert_true(clef_layer_has_tensor(CLEF_LT_Q_NORM, 0) && clef_layer_has_tensor(CLEF_LT_Q_NORM, 1));
    assert_false(clef_layer_has_tensor(CLEF_LT_COUNT, 1));
    assert_null(clef_layer_tensor_module(CLEF_LT_COUNT, NULL, NULL));
    assert_null(clef_layer_tensor_module(-1, NULL, NULL));
    assert_null(clef_layer_tensor_name(nb, sizeof nb, 0, CLEF_LT_COUNT, 1));

    /* experts: per-expert modules, their shapes, the fused transformers-5 names */
    assert_string_equal(clef_expert_name(nb, sizeof nb, 3, 127, CLEF_PROJ_GATE, 1),
                        "thinker.model.layers.3.mlp.experts.127.gate_proj.weight");
    assert_string_equal(clef_expert_name(nb, sizeof nb, 3, 0, CLEF_PROJ_DOWN, 0),
                        "thinker.model.layers.3.mlp.experts.0.down_proj");
    assert_string_equal(clef_expert_proj(CLEF_PROJ_UP), "up_proj");
    assert_null(clef_expert_proj(3));
    assert_null(clef_expert_name(nb, sizeof nb, 3, 0, 3, 0));
    int64_t r, k;
    clef_expert_shape(&d, CLEF_PROJ_UP, &r, &k);
    assert_int_equal(r, 768);
    assert_int_equal(k, 2048);
    clef_expert_shape(&d, CLEF_PROJ_DOWN, &r, &k);
    assert_int_equal(r, 2048);
    assert_int_equal(k, 768);
    /* outside the layers */
    static const struct {
        int id;
        const char *name;
        int64_t rows, cols;
        int vector;
    } top[] = {{CLEF_TT_EMBED, "thinker.model.embed_tokens.weight", 152064, 2048, 0},
               {CLEF_TT_LM_HEAD, "thinker.lm_head.weight", 152064, 2048, 0},
               {CLEF_TT_FINAL_NORM, "thinker.model.norm.weight", 2048, 0, 1}};
    assert_int_equal(sizeof top / sizeof top[0], CLEF_TT_COUNT);
    for (size_t i = 0; i < CLEF_TT_COUNT; i++) {
        int vector = -1;
        assert_non_null(clef_thinker_tensor_module(top[i].id, &vector));
        assert_int_equal(vector, top[i].vector);
        assert_string_equal(clef_thinker_tensor_name(nb, sizeof nb, top[i].id, 1), top[i].name);
        clef_thinker_tensor_shape(&d, top[i].id, &r, &k);
        assert_int_equal(r, top[i].rows);
        assert_int_equal(k, top[i].cols);
    }
    assert_string_equal(clef_thinker_tensor_name(nb, sizeof nb, CLEF_TT_LM_HEAD, 0), "thinker.lm_head");
    assert_null(clef_thinker_tensor_name(nb, sizeof nb, CLEF_TT_COUNT, 0));
    assert_null(clef_thinker_tensor_module(-1, NULL));
    assert_string_equal(clef_fused_experts_name(nb, sizeof nb, 12, 0), "thinker.model.layers.12.mlp.experts.gate_up_proj");
    assert_string_equal(clef_fused_experts_name(nb, sizeof nb, 12, 1), "thinker.model.layers.12.mlp.experts.down_proj");
}

/* A buffer one byte short of a name: NULL, never a cut name taken for a real one. */
static void test_cut_names(void **state) {
    (void)state;
    char nb[64];
    const char *full = "thinker.model.layers.7.self_attn.q_proj.weight"; /* 46 bytes + NUL */
    assert_non_null(clef_layer_tensor_name(nb, strlen(full) + 1, 7, CLEF_LT_Q_PROJ, 1));
    assert_null(clef_layer_tensor_name(nb, strlen(full), 7, CLEF_LT_Q_PROJ, 1));
    const char *ex = "thinker.model.layers.7.mlp.experts.5.up_proj";
    assert_non_null(clef_expert_name(nb, strlen(ex) + 1, 7, 5, CLEF_PROJ_UP, 0));
    assert_null(clef_expert_name(nb, strlen(ex), 7, 5, CLEF_PROJ_UP, 0));
    assert_null(clef_fused_experts_name(nb, 10, 7, 0));
}

/* The tiny fixture (release layout): every tensor the table names for each layer is there, BF16, with
 * the table's shape under the fixture's config; and the per-expert tensors likewise. */
static void test_fixture_layout(void **state) {
    (void)state;
    char *dir = tu_fixture("tiny-clef-omni");
    clef_checkpoint ck;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_checkpoint_open(dir, &ck, &err), 0);
    const clef_text_config *c = &ck.config.text;
    const clef_layer_dims d = clef_layer_dims_of(c);
    int checked = 0;
    for (int id = 0; id < CLEF_TT_COUNT; id++) {
        char nb[160];
        int vector = 0;
        int64_t shape[2];
        clef_thinker_tensor_module(id, &vector);
        clef_thinker_tensor_shape(&d, id, &shape[0], &shape[1]);
        if (!clef_checkpoint_require(&ck, clef_thinker_tensor_name(nb, sizeof nb, id, 1), CLEF_DT_BIT(CLEF_DT_BF16),
                                     vector ? 1 : 2, shape, &err))
            fail_msg("%s", err.message);
        checked++;
    }
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        const int moe = clef_layer_is_moe(c, l);
        for (int id = 0; id < CLEF_LT_COUNT; id++) {
            if (!clef_layer_has_tensor(id, moe)) continue;
            char nb[160];
            int vector = 0;
            int64_t r, k;
            clef_layer_tensor_module(id, &vector, NULL);
            clef_layer_tensor_shape(&d, id, &r, &k);
            const int64_t shape[2] = {r, k};
            if (!clef_checkpoint_require(&ck, clef_layer_tensor_name(nb, sizeof nb, l, id, 1),
                                         CLEF_DT_BIT(CLEF_DT_BF16), vector ? 1 : 2, shape, &err))
                fail_msg("%s", err.message);
            checked++;
        }
        if (!moe) continue;
        for (int64_t e = 0; e < c->num_experts; e++)
            for (int p = 0; p < 3; p++) {
                char nb[160];
                int64_t shape[2];
                clef_expert_shape(&d, p, &shape[0], &shape[1]);
                if (!clef_checkpoint_require(&ck, clef_expert_name(nb, sizeof nb, l, e, p, 1),
                                             CLEF_DT_BIT(CLEF_DT_BF16), 2, shape, &err))
                    fail_msg("%s", err.message);
                checked++;
            }
    }
    assert_true(checked > 0);
    printf("  %d thinker tensors of the fixture match the table\n", checked);
    clef_checkpoint_close(&ck);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_shapes),
        cmocka_unit_test(test_cut_names),
        cmocka_unit_test(test_fixture_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
