/* test_config.c — thinker text config and joint head config (SPEC.md §6.1, §7.1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/config.h"
#include "testutil.h"

/* The fixture's config.json and joint_head_config.json as parsed trees,
 * mutated per test and re-rendered for clef_config_parse. */
typedef struct docs {
    json_value *cfg, *head;
} docs;

static json_value *parse_fixture(const char *rel) {
    char *path = tu_fixture(rel);
    size_t len;
    char *text = tu_read_file(path, &len);
    clef_err err;
    json_value *v = json_parse(text, len, &err);
    if (!v) fail_msg("%s: %s", path, err.message);
    free(text);
    free(path);
    return v;
}

static int setup(void **state) {
    docs *d = calloc(1, sizeof *d);
    d->cfg = parse_fixture("tiny-clef-omni/config.json");
    d->head = parse_fixture("tiny-clef-omni/joint_head_config.json");
    *state = d;
    return 0;
}

static int teardown(void **state) {
    docs *d = *state;
    json_free(d->cfg);
    json_free(d->head);
    free(d);
    return 0;
}

static json_value *mut(const json_value *v) { return (json_value *)v; }

static json_value *text_config(docs *d) { return mut(json_get(json_get(d->cfg, "thinker_config"), "text_config")); }

/* Copy of object `obj` without member `key`. */
static json_value *without(const json_value *obj, const char *key) {
    json_value *o = json_new(JSON_OBJECT);
    for (size_t i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) != 0)
            json_object_set(o, obj->keys[i], obj->key_lens[i], json_clone(obj->items[i]));
    return o;
}

static void remove_text_key(docs *d, const char *key) {
    json_value *thinker = mut(json_get(d->cfg, "thinker_config"));
    json_object_set(thinker, "text_config", 11, without(text_config(d), key));
}

static void set(json_value *obj, const char *key, json_value *v) { json_object_set(obj, key, strlen(key), v); }

static json_value *parse_text(const char *s) {
    clef_err err;
    json_value *v = json_parse(s, strlen(s), &err);
    if (!v) fail_msg("test JSON: %s", err.message);
    return v;
}

static int run_parse(docs *d, clef_config *cfg, clef_err *err) {
    clef_buf a = {0}, b = {0};
    json_render(d->cfg, &a);
    json_render(d->head, &b);
    clef_err_clear(err);
    int rc = clef_config_parse(a.data, a.len, b.data, b.len, cfg, err);
    clef_buf_free(&a);
    clef_buf_free(&b);
    return rc;
}

/* Parsing must fail with 500 and a message containing both fragments. */
static void expect_reject(docs *d, const char *frag1, const char *frag2) {
    clef_config cfg;
    clef_err err;
    assert_int_equal(run_parse(d, &cfg, &err), -1);
    assert_int_equal(err.status, 500);
    assert_string_equal(err.type, CLEF_E_INTERNAL);
    if (!strstr(err.message, frag1)) fail_msg("message '%s' lacks '%s'", err.message, frag1);
    if (frag2 && !strstr(err.message, frag2)) fail_msg("message '%s' lacks '%s'", err.message, frag2);
}

static void check_fixture_values(const clef_config *cfg) {
    const clef_text_config *t = &cfg->text;
    assert_int_equal(t->vocab_size, 152064);
    assert_int_equal(t->hidden_size, 32);
    assert_int_equal(t->num_hidden_layers, 3);
    assert_int_equal(t->num_attention_heads, 4);
    assert_int_equal(t->num_key_value_heads, 2);
    assert_int_equal(t->head_dim, 16);
    assert_true(t->rms_norm_eps == 1e-6);
    assert_int_equal(t->num_experts, 8);
    assert_int_equal(t->num_experts_per_tok, 2);
    assert_int_equal(t->moe_intermediate_size, 16);
    assert_int_equal(t->intermediate_size, 64);
    assert_int_equal(t->norm_topk_prob, 1);
    assert_int_equal(t->decoder_sparse_step, 1);
    assert_int_equal(t->max_position_embeddings, 65536);
    assert_true(t->rope_theta == 1e6);
    assert_int_equal(t->mrope_section[0], 4);
    assert_int_equal(t->mrope_section[1], 2);
    assert_int_equal(t->mrope_section[2], 2);
    for (int l = 0; l < 3; l++)
        assert_true(clef_layer_is_moe(t, l));
    assert_false(clef_layer_is_moe(t, -1));
}

static void test_fixture_load(void **state) {
    char *dir = tu_fixture("tiny-clef-omni");
    clef_config cfg;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_config_load(dir, &cfg, &err), 0);
    check_fixture_values(&cfg);
    const clef_head_config *h = &cfg.head;
    assert_int_equal(h->hidden_size, 32);
    assert_int_equal(h->width, 64);
    assert_int_equal(h->heads, 4);
    assert_int_equal(h->routing_layers, 2);
    assert_int_equal(h->layers, 4);
    assert_int_equal(h->feedforward, 128);
    assert_int_equal(cfg.image_token_id, 151655);
    assert_int_equal(cfg.video_token_id, 151656);
    assert_int_equal(cfg.audio_token_id, 151675);
    assert_int_equal(cfg.audio_start_token_id, 151669);
    assert_int_equal(cfg.vision_start_token_id, 151652);
    assert_int_equal(cfg.position_id_per_seconds, 13);
    free(dir);
}

static void test_load_missing_dir(void **state) {
    clef_config cfg;
    clef_err err;
    assert_int_equal(clef_config_load("/nonexistent/clef", &cfg, &err), -1);
    assert_int_equal(err.status, 500);
    assert_non_null(strstr(err.message, "config.json"));
}

/* The pre-transformers-5 form: rope_theta next to rope_scaling. */
static void test_older_rope_form(void **state) {
    docs *d = *state;
    remove_text_key(d, "rope_parameters");
    json_value *tc = text_config(d);
    set(tc, "rope_theta", json_new_int(1000000));
    set(tc, "rope_scaling",
        parse_text("{\"rope_type\":\"default\",\"type\":\"default\",\"mrope_section\":[4,2,2],"
                   "\"interleaved\":true,\"mrope_interleaved\":true}"));
    clef_config cfg;
    clef_err err;
    assert_int_equal(run_parse(d, &cfg, &err), 0);
    check_fixture_values(&cfg);

    /* θ is really read from rope_theta, and the section from rope_scaling. */
    set(tc, "rope_theta", json_new_float(5e5));
    set(tc, "rope_scaling", parse_text("{\"type\":\"default\",\"mrope_section\":[6,1,1]}"));
    assert_int_equal(run_parse(d, &cfg, &err), 0);
    assert_true(cfg.text.rope_theta == 5e5);
    assert_int_equal(cfg.text.mrope_section[0], 6);
    assert_int_equal(cfg.text.mrope_section[1], 1);
    assert_int_equal(cfg.text.mrope_section[2], 1);
}

static void test_rope_resolution(void **state) {
    docs *d = *state;
    json_value *tc = text_config(d);
    /* rope_parameters without θ falls back to rope_theta; section defaults. */
    set(tc, "rope_parameters", parse_text("{\"rope_type\":\"default\"}"));
    set(tc, "rope_theta", json_new_float(2.5e4));
    set(tc, "head_dim", json_new_int(128)); /* the default section [24,20,20] covers 128/2 frequencies */
    clef_config cfg;
    clef_err err;
    assert_int_equal(run_parse(d, &cfg, &err), 0);
    assert_true(cfg.text.rope_theta == 2.5e4);
    assert_int_equal(cfg.text.mrope_section[0], 24);
    assert_int_equal(cfg.text.mrope_section[1], 20);
    assert_int_equal(cfg.text.mrope_section[2], 20);
    set(tc, "head_dim", json_new_int(16));
    /* rope_parameters.rope_theta wins over rope_theta. */
    set(tc, "rope_parameters", parse_text("{\"rope_theta\":1e6,\"mrope_section\":[4,2,2]}"));
    assert_int_equal(run_parse(d, &cfg, &err), 0);
    assert_true(cfg.text.rope_theta == 1e6);
    assert_int_equal(cfg.text.mrope_section[0], 4);
    /* No θ anywhere. */
    set(tc, "rope_parameters", parse_text("{\"rope_type\":\"default\"}"));
    remove_text_key(d, "rope_theta");
    expect_reject(d, "rope_theta", "missing");
}

static void test_reject_rope_variants(void **state) {
    docs *d = *state;
    json_value *tc = text_config(d);
    set(tc, "rope_parameters", parse_text("{\"rope_type\":\"yarn\",\"rope_theta\":1e6}"));
    expect_reject(d, "config.json", "yarn");
    set(tc, "rope_parameters", parse_text("{\"rope_theta\":1e6,\"interleaved\":false}"));
    expect_reject(d, "rope_parameters.interleaved", "false");
    set(tc, "rope_parameters", parse_text("{\"rope_theta\":1e6,\"mrope_interleaved\":false}"));
    expect_reject(d, "mrope_interleaved", "false");
    set(tc, "rope_parameters", parse_text("{\"rope_theta\":1e6}"));
    set(tc, "rope_scaling", parse_text("{\"type\":\"linear\",\"factor\":2.0}"));
    expect_reject(d, "rope_scaling.type", "linear");
    set(tc, "rope_scaling", parse_text("{\"type\":\"default\",\"interleaved\":false}"));
    expect_reject(d, "rope_scaling.interleaved", NULL);
    set(tc, "rope_scaling", parse_text("{\"mrope_section\":[4,2]}"));
    expect_reject(d, "mrope_section", NULL);
}

static void test_missing_required_keys(void **state) {
    static const char *required[] = {"vocab_size",          "hidden_size",           "num_hidden_layers",
                                     "num_attention_heads", "num_key_value_heads",   "num_experts",
                                     "num_experts_per_tok", "moe_intermediate_size", "rms_norm_eps"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        docs *d = *state;
        json_value *saved = json_clone(text_config(d));
        remove_text_key(d, required[i]);
        char want[128];
        snprintf(want, sizeof want, "thinker_config.text_config.%s", required[i]);
        expect_reject(d, want, "missing");
        json_object_set(mut(json_get(d->cfg, "thinker_config")), "text_config", 11, saved);
    }
}

static void test_head_dim_default(void **state) {
    docs *d = *state;
    remove_text_key(d, "head_dim");
    set(text_config(d), "rope_parameters", parse_text("{\"rope_theta\":1e6,\"mrope_section\":[2,1,1]}"));
    clef_config cfg;
    clef_err err;
    assert_int_equal(run_parse(d, &cfg, &err), 0);
    assert_int_equal(cfg.text.head_dim, 8); /* 32 / 4 */
}

/* mrope_section must give each of the head_dim/2 rotary frequencies to one
 * axis: a section that sums to more or less is refused, from either RoPE dict
 * and for the default section too. */
static void test_mrope_section_sum(void **state) {
    docs *d = *state;
    json_value *tc = text_config(d);
    clef_config cfg;
    clef_err err;
    set(tc, "rope_parameters", parse_text("{\"rope_theta\":1e6,\"mrope_section\":[4,2,3]}"));
    assert_int_equal(run_parse(d, &cfg, &err), -1);
    assert_int_equal(err.status, 500);
    assert_string_equal(err.type, CLEF_E_INTERNAL);
    assert_string_equal(err.message, "config.json: thinker_config.text_config.mrope_section [4,2,3] sums to 9, but "
                                     "head_dim 16 has 8 rotary frequencies (head_dim/2)");
    set(tc, "rope_parameters", parse_text("{\"rope_theta\":1e6,\"mrope_section\":[4,2,1]}"));
    expect_reject(d, "mrope_section [4,2,1] sums to 7", "head_dim 16 has 8");
    remove_text_key(d, "rope_parameters");
    set(text_config(d), "rope_theta", json_new_int(1000000));
    set(text_config(d), "rope_scaling", parse_text("{\"type\":\"default\",\"mrope_section\":[8,4,4]}"));
    expect_reject(d, "mrope_section [8,4,4] sums to 16", NULL);
    remove_text_key(d, "rope_scaling"); /* the default [24,20,20] does not fit head_dim 16 either */
    expect_reject(d, "mrope_section [24,20,20] sums to 64, but head_dim 16 has 8", NULL);
    set(text_config(d), "rope_scaling", parse_text("{\"type\":\"default\",\"mrope_section\":[4,2,2]}"));
    assert_int_equal(run_parse(d, &cfg, &err), 0);
}

static void test_sanity_checks(void **state) {
    docs *d = *state;
    json_value *tc = text_config(d);
    set(tc, "num_key_value_heads", json_new_int(3));
    expect_reject(d, "num_attention_heads", "num_key_value_heads");
    set(tc, "num_key_value_heads", json_new_int(2));
    set(tc, "num_experts_per_tok", json_new_int(9));
    expect_reject(d, "num_experts_per_tok", "num_experts");
    set(tc, "num_experts_per_tok", json_new_int(2));
    set(tc, "num_hidden_layers", json_new_int(CLEF_MAX_LAYERS + 1));
    expect_reject(d, "num_hidden_layers", NULL);
    set(tc, "num_hidden_layers", json_new_int(3));
    set(tc, "hidden_size", json_new_int(0));
    expect_reject(d, "hidden_size", NULL);
    set(tc, "hidden_size", json_new_string("32", 2));
    expect_reject(d, "hidden_size", "integer");
    set(tc, "hidden_size", json_new_int(32));
    set(tc, "rms_norm_eps", json_new_int(-1));
    expect_reject(d, "rms_norm_eps", NULL);
    set(tc, "rms_norm_eps", json_new_float(1e-6));
    set(tc, "mlp_only_layers", parse_text("[3]"));
    expect_reject(d, "mlp_only_layers", NULL);
    set(tc, "mlp_only_layers", parse_text("[]"));
    clef_config cfg;
    clef_err err;
    assert_int_equal(run_parse(d, &cfg, &err), 0);
}

static void test_dense_layers(void **state) {
    docs *d = *state;
    json_value *tc = text_config(d);
    set(tc, "mlp_only_layers", parse_text("[0]"));
    set(tc, "decoder_sparse_step", json_new_int(2));
    clef_config cfg;
    clef_err err;
    assert_int_equal(run_parse(d, &cfg, &err), 0);
    assert_false(clef_layer_is_moe(&cfg.text, 0)); /* listed in mlp_only_layers */
    assert_true(clef_layer_is_moe(&cfg.text, 1));  /* (1+1) % 2 == 0 */
    assert_false(clef_layer_is_moe(&cfg.text, 2)); /* (2+1) % 2 != 0 */
    /* A dense layer needs intermediate_size. */
    remove_text_key(d, "intermediate_size");
    expect_reject(d, "intermediate_size", NULL);
}

static void test_head_config(void **state) {
    docs *d = *state;
    set(d->head, "hidden_size", json_new_int(48));
    expect_reject(d, "joint_head_config.json", "hidden_size 48 does not match the thinker's hidden_size 32");
    set(d->head, "hidden_size", json_new_int(32));
    set(d->head, "heads", json_new_int(5));
    expect_reject(d, "joint_head_config.json", "not divisible");
    set(d->head, "heads", json_new_int(4));
    json_value *h = without(d->head, "feedforward");
    json_free(d->head);
    d->head = h;
    expect_reject(d, "joint_head_config.json", "feedforward");
}

static void test_not_json(void **state) {
    clef_config cfg;
    clef_err err;
    const char *head =
        "{\"hidden_size\":32,\"width\":64,\"routing_layers\":2,\"layers\":4,\"heads\":4,\"feedforward\":128}";
    assert_int_equal(clef_config_parse("{\"thinker_config\":", 18, head, strlen(head), &cfg, &err), -1);
    assert_int_equal(err.status, 500);
    assert_string_equal(err.type, CLEF_E_INTERNAL);
    assert_non_null(strstr(err.message, "config.json"));
    assert_int_equal(clef_config_parse("{}", 2, head, strlen(head), &cfg, &err), -1);
    assert_non_null(strstr(err.message, "thinker_config"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_load),
        cmocka_unit_test(test_load_missing_dir),
        cmocka_unit_test_setup_teardown(test_older_rope_form, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rope_resolution, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reject_rope_variants, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_required_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_head_dim_default, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mrope_section_sum, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sanity_checks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dense_layers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_head_config, setup, teardown),
        cmocka_unit_test(test_not_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
