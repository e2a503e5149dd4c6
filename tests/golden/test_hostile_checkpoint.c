#define _GNU_SOURCE /* nftw (quant_fixture.h) */
/* test_hostile_checkpoint.c — corrupted copies of the tiny fixture that
 * parse (every header, shape and dtype is valid) but must never produce an
 * answer:
 *   1. a NaN or Inf in any weight — the embeddings, a norm, the router, the
 *      attention, an expert, lm_head, the joint head (matrices, biases,
 *      scalars), the media towers, a quantized checkpoint's scales (INT4 F16
 *      group scales, NVFP4 E4M3 group scales and F32 global scales) or its
 *      FP8 weights — is a load error naming the tensor, the file and the
 *      element: clef_engine_open fails, `clef decide` exits 1 and `clef
 *      serve` exits 1 without ever reporting ready.  Such checkpoints used
 *      to load and /healthz said ok; every decision then failed with 500
 *      "head: option 0 has a non-finite logit" naming no tensor (and before
 *      that, a NaN in q/k gave a finite, confident, wrong answer);
 *   2. a tokenizer whose ids reach past the embedding rows is a load error
 *      naming tokenizer.json (it used to load, then refuse every request
 *      with a 422 that blamed the client's input);
 *   3. a config past the kernels' limits names the key and the limit (it
 *      said "head_dim 8192 / 2 experts per token unsupported").
 * Each case is a temporary directory of symlinks to the fixture plus one
 * patched copy. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clef.h"
#include "io/safetensors.h"
#include "quant_fixture.h"
#include "testutil.h"

#define FIX_DIR CLEF_FIXTURES "/tiny-clef-omni"

static const char *const FILES[] = {"config.json",
                                    "joint_head_config.json",
                                    "joint_head.safetensors",
                                    "model-00001-of-00002.safetensors",
                                    "model-00002-of-00002.safetensors",
                                    "model.safetensors.index.json",
                                    "tokenizer.json"};
#define N_FILES (sizeof FILES / sizeof *FILES)

static const char REQUEST[] =
    "{\"model\":\"m\",\"state\":\"Our checkout started returning errors.\",\"questions\":{"
    "\"department\":{\"type\":\"choice\",\"criteria\":{\"billing\":\"Payments\",\"technical\":\"Bugs\"}},"
    "\"outage\":{\"type\":\"noul\",\"instructions\":\"Is a service down?\"}}}";

/* A temporary checkpoint directory: symlinks to every fixture file except
 * `copied`, which is a writable copy (its path goes to *copy_path). */
static char *make_dir(const char *copied, char *copy_path, size_t cap) {
    char tmpl[] = "/tmp/clef_hostile_XXXXXX";
    char *dir = mkdtemp(tmpl);
    assert_non_null(dir);
    dir = strdup(dir);
    char src[4096], dst[4096];
    for (size_t i = 0; i < N_FILES; i++) {
        snprintf(src, sizeof src, "%s/%s", FIX_DIR, FILES[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, FILES[i]);
        if (strcmp(FILES[i], copied) != 0) {
            assert_int_equal(symlink(src, dst), 0);
            continue;
        }
        size_t len;
        char *data = tu_read_file(src, &len);
        FILE *f = fopen(dst, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(data, 1, len, f), len);
        fclose(f);
        free(data);
        snprintf(copy_path, cap, "%s", dst);
    }
    return dir;
}

static void remove_dir(char *dir) {
    char p[4096];
    for (size_t i = 0; i < N_FILES; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, FILES[i]);
        unlink(p);
    }
    rmdir(dir);
    free(dir);
}

/* Overwrite element `index` of tensor `name` (bits little-endian, the
 * tensor's element size) in the copied file `copy`, located through the
 * original `src`. */
static void poke(const char *src, const char *copy, const char *name, size_t index, uint32_t bits) {
    st_file f;
    clef_err err;
    clef_err_clear(&err);
    if (st_open(src, &f, &err) != 0) fail_msg("st_open %s: %s", src, err.message);
    const st_tensor *t = st_find(&f, name);
    if (!t || index >= t->numel) fail_msg("tensor %s", name);
    size_t es = clef_dtype_size(t->dtype);
    long off = (long)((const char *)t->data - (const char *)f.map) + (long)(es * index);
    st_close(&f);
    FILE *o = fopen(copy, "r+b");
    assert_non_null(o);
    assert_int_equal(fseek(o, off, SEEK_SET), 0);
    unsigned char b[4];
    for (size_t i = 0; i < es; i++) b[i] = (unsigned char)(bits >> (8 * i));
    assert_int_equal(fwrite(b, 1, es, o), es);
    fclose(o);
}

static void poke_fixture(const char *shard, const char *copy, const char *name, size_t index, uint32_t bits) {
    char src[4096];
    snprintf(src, sizeof src, "%s/%s", FIX_DIR, shard);
    poke(src, copy, name, index, bits);
}

typedef struct poison {
    const char *shard, *tensor;
    size_t index;
    uint32_t bits;
    const char *kind; /* as the message names it */
} poison;

static const char S1[] = "model-00001-of-00002.safetensors", S2[] = "model-00002-of-00002.safetensors",
                  HEAD[] = "joint_head.safetensors";

/* One tensor of every kind the model and the towers bind (all BF16 in the
 * tiny fixture). */
static const poison CASES[] = {
    {S1, "thinker.model.embed_tokens.weight", 4242, 0x7fc0, "NaN"},
    {S1, "thinker.model.layers.1.input_layernorm.weight", 3, 0x7f80, "+Inf"},
    {S1, "thinker.model.layers.2.post_attention_layernorm.weight", 31, 0xff80, "-Inf"},
    {S1, "thinker.model.norm.weight", 0, 0x7fc1, "NaN"},
    {S1, "thinker.model.layers.0.self_attn.q_proj.weight", 5, 0x7fc0, "NaN"}, /* was answered, confidently */
    {S1, "thinker.model.layers.1.self_attn.k_proj.weight", 0, 0x7f80, "+Inf"},
    {S1, "thinker.model.layers.1.self_attn.v_proj.weight", 7, 0x7fc0, "NaN"},
    {S1, "thinker.model.layers.2.self_attn.o_proj.weight", 100, 0xffc0, "NaN"},
    {S1, "thinker.model.layers.0.self_attn.q_norm.weight", 15, 0x7f80, "+Inf"},
    {S1, "thinker.model.layers.2.mlp.gate.weight", 17, 0xff80, "-Inf"}, /* the router */
    {S1, "thinker.lm_head.weight", 151675 * 32 + 1, 0x7fc0, "NaN"},
    {S2, "thinker.model.layers.0.mlp.experts.3.down_proj.weight", 0, 0xffc0, "NaN"},
    {S2, "thinker.model.layers.2.mlp.experts.7.up_proj.weight", 511, 0x7f80, "+Inf"},
    {HEAD, "memory_projection.weight", 9, 0x7fc0, "NaN"},
    {HEAD, "layers.3.linear2.bias", 63, 0x7f80, "+Inf"},
    {HEAD, "evidence_layers.1.attention.in_proj_weight", 64 * 64, 0x7fc0, "NaN"},
    {HEAD, "prior_logit_scale", 0, 0xff80, "-Inf"},
    {S1, "thinker.visual.blocks.0.attn.qkv.weight", 2, 0x7fc0, "NaN"},
    {S1, "thinker.visual.merger.mlp.2.bias", 0, 0x7f80, "+Inf"},
    {S1, "thinker.audio_tower.conv2d1.weight", 1, 0xff80, "-Inf"},
    {S1, "thinker.audio_tower.layers.0.fc1.weight", 12, 0x7fc0, "NaN"},
};

static void expect_load_error(const char *dir, int text_only, const char *want) {
    clef_engine_options opt = {.model_dir = dir, .truncate_state = 1, .n_threads = 2, .text_only = text_only};
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&opt, &err);
    if (e) {
        clef_buf out = {0};
        int rc = clef_engine_decide(e, REQUEST, sizeof REQUEST - 1, NULL, &out, &err);
        fail_msg("loaded; a request then gave %d: %s", rc, rc ? err.message : out.data);
    }
    assert_int_equal(err.status, 500);
    assert_string_equal(err.type, CLEF_E_INTERNAL);
    assert_string_equal(err.message, want);
}

static void test_nonfinite_weights_refused_at_load(void **state) {
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        const poison *c = &CASES[i];
        char copy[4096], want[1024];
        char *dir = make_dir(c->shard, copy, sizeof copy);
        poke_fixture(c->shard, copy, c->tensor, c->index, c->bits);
        snprintf(want, sizeof want, "%s: tensor '%s' holds a non-finite value (%s) at element %zu", c->shard,
                 c->tensor, c->kind, c->index);
        expect_load_error(dir, 0, want);
        printf("  %s\n", want);
        remove_dir(dir);
    }
}

/* The first bad element in file order is the one named, however many there
 * are and however the scan is split over threads. */
static void test_first_nonfinite_named(void **state) {
    char copy[4096];
    char *dir = make_dir(S1, copy, sizeof copy);
    /* lm_head lies before embed_tokens in the shard; the scan reads it in 4 MiB chunks */
    poke_fixture(S1, copy, "thinker.lm_head.weight", 4500000, 0x7fc0); /* third chunk */
    poke_fixture(S1, copy, "thinker.lm_head.weight", 3000000, 0xff80); /* second chunk */
    poke_fixture(S1, copy, "thinker.model.embed_tokens.weight", 7, 0x7fc0);
    for (int threads = 1; threads <= 2; threads++) {
        clef_engine_options opt = {.model_dir = dir, .n_threads = threads};
        clef_err err;
        clef_err_clear(&err);
        assert_null(clef_engine_open(&opt, &err));
        assert_string_equal(err.message, "model-00001-of-00002.safetensors: tensor 'thinker.lm_head.weight' "
                                         "holds a non-finite value (-Inf) at element 3000000");
    }
    remove_dir(dir);
}

/* --text-only does not load the towers, so their bytes are not checked
 * either: a NaN there leaves text decisions answered. */
static void test_text_only_skips_tower_check(void **state) {
    char copy[4096];
    char *dir = make_dir(S1, copy, sizeof copy);
    poke_fixture(S1, copy, "thinker.visual.blocks.0.attn.qkv.weight", 2, 0x7fc0);
    clef_engine_options opt = {.model_dir = dir, .n_threads = 2, .text_only = 1, .truncate_state = 1};
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e) fail_msg("text-only load: %s", err.message);
    clef_buf out = {0};
    assert_int_equal(clef_engine_decide(e, REQUEST, sizeof REQUEST - 1, NULL, &out, &err), 0);
    assert_non_null(strstr(out.data, "\"answers\":{"));
    clef_buf_free(&out);
    clef_engine_close(e);
    remove_dir(dir);
}

/* Quantized checkpoints: the scales and FP8 weights are checked too. */
static void test_nonfinite_quant_scales(void **state) {
    const struct {
        const char *format, *tensor, *kind;
        size_t index;
        uint32_t bits;
    } q[] = {
        {"int4-autoround", "thinker.model.layers.0.mlp.experts.0.gate_proj.scales", "NaN", 3, 0x7e00},   /* F16 */
        {"int4-autoround", "thinker.model.layers.1.mlp.experts.5.down_proj.scales", "-Inf", 0, 0xfc00},  /* F16 */
        {"nvfp4-ct", "thinker.model.layers.0.mlp.experts.2.up_proj.weight_scale", "NaN", 1, 0x7f},       /* E4M3 */
        {"nvfp4-ct", "thinker.model.layers.2.mlp.experts.6.gate_proj.weight_global_scale", "+Inf", 0, 0x7f800000},
        {"nvfp4-modelopt", "thinker.model.layers.1.mlp.experts.1.down_proj.weight_scale", "NaN", 4, 0xff},
        {"fp8-block", "thinker.model.layers.0.mlp.experts.4.gate_proj.weight", "NaN", 9, 0xff},          /* E4M3 */
        {"fp8-block", "thinker.model.layers.2.mlp.experts.0.up_proj.weight_scale_inv", "NaN", 0, 0x7fc00000},
    };
    for (size_t i = 0; i < sizeof q / sizeof *q; i++) {
        char *dir = qf_assemble(q[i].format);
        char *link = qf_path(dir, S2), target[4096];
        ssize_t n = readlink(link, target, sizeof target - 1);
        assert_true(n > 0);
        target[n] = '\0';
        size_t len;
        char *data = tu_read_file(target, &len); /* the symlink becomes a writable copy */
        unlink(link);
        FILE *f = fopen(link, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(data, 1, len, f), len);
        fclose(f);
        free(data);
        poke(target, link, q[i].tensor, q[i].index, q[i].bits);
        char want[1024];
        snprintf(want, sizeof want, "%s: tensor '%s' holds a non-finite value (%s) at element %zu", S2, q[i].tensor,
                 q[i].kind, q[i].index);
        expect_load_error(dir, 0, want);
        printf("  %s: %s\n", q[i].format, want);
        free(link);
        qf_remove(dir);
        free(dir);
    }
}

/* The commands: decide exits 1 with the message; serve exits 1 before it
 * ever says ready (and so before /healthz could answer ok). */
static void test_nonfinite_commands(void **state) {
    char copy[4096];
    char *dir = make_dir(S2, copy, sizeof copy);
    poke_fixture(S2, copy, "thinker.model.layers.1.mlp.experts.2.gate_proj.weight", 33, 0x7fc0);
    const char *want = "model-00002-of-00002.safetensors: tensor "
                       "'thinker.model.layers.1.mlp.experts.2.gate_proj.weight' holds a non-finite value (NaN) at "
                       "element 33";
    char req[4200], cmd[8192];
    snprintf(req, sizeof req, "%s/req.json", dir);
    FILE *f = fopen(req, "wb");
    assert_non_null(f);
    fputs(REQUEST, f);
    fclose(f);
    clef_buf out = {0};
    snprintf(cmd, sizeof cmd, "exec 2>&1; timeout 60 %s decide --model %s %s", CLEF_BINARY, dir, req);
    assert_int_equal(tu_run_cmd(cmd, &out), 1);
    if (!strstr(out.data, want)) fail_msg("decide said '%s'", out.data);
    snprintf(cmd, sizeof cmd, "exec 2>&1; timeout 60 %s serve --model %s --port 0", CLEF_BINARY, dir);
    assert_int_equal(tu_run_cmd(cmd, &out), 1);
    if (!strstr(out.data, want) || strstr(out.data, "ready")) fail_msg("serve said '%s'", out.data);
    printf("  serve: %.*s\n", (int)strcspn(strstr(out.data, "cannot load"), "\n"), strstr(out.data, "cannot load"));
    clef_buf_free(&out);
    unlink(req);
    remove_dir(dir);
}

static void test_tokenizer_past_vocab_is_load_error(void **state) {
    char copy[4096];
    char *dir = make_dir("tokenizer.json", copy, sizeof copy);
    size_t len;
    char *text = tu_read_file(copy, &len);
    char *at = strstr(text, "\"id\": 151644,"); /* <|im_start|>, first token of every record */
    assert_non_null(at);
    memcpy(at, "\"id\": 152100,", 13); /* same length; the embedding has 152064 rows */
    FILE *f = fopen(copy, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
    free(text);
    clef_engine_options opt = {.model_dir = dir, .truncate_state = 1, .n_threads = 1};
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&opt, &err);
    if (e) {
        clef_buf out = {0};
        clef_engine_decide(e, REQUEST, sizeof REQUEST - 1, NULL, &out, &err);
        clef_engine_close(e);
        fail_msg("loaded; a request then gave %d %s", err.status, err.message);
    }
    assert_non_null(strstr(err.message, "tokenizer.json"));
    assert_non_null(strstr(err.message, "152100"));
    assert_non_null(strstr(err.message, "vocab_size 152064"));
    remove_dir(dir);
}

/* Replace the first `from` in the copied text file by `to`. */
static void replace_in(const char *path, const char *from, const char *to) {
    size_t len;
    char *text = tu_read_file(path, &len);
    char *at = strstr(text, from);
    if (!at) fail_msg("'%s' not in %s", from, path);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(text, 1, (size_t)(at - text), f);
    fputs(to, f);
    fputs(at + strlen(from), f);
    fclose(f);
    free(text);
}

static void test_config_limits_named(void **state) {
    /* from, to, a second from / to (or NULL), the message */
    const char *edits[][5] = {
        {"\"head_dim\": 16,", "\"head_dim\": 8192,", /* with an M-RoPE section that covers 8192/2 */
         "\"mrope_section\": [\n          4,\n          2,\n          2\n        ]",
         "\"mrope_section\": [2048, 1024, 1024]", "head_dim 8192 is not supported (at most 4096)"},
        {"\"num_experts\": 8,\n      \"num_experts_per_tok\": 2,", "\"num_experts\": 80,\n      \"num_experts_per_tok\": 65,",
         NULL, NULL, "num_experts_per_tok 65 is not supported (at most 64)"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        char copy[4096];
        char *dir = make_dir("config.json", copy, sizeof copy);
        replace_in(copy, edits[i][0], edits[i][1]);
        if (edits[i][2]) replace_in(copy, edits[i][2], edits[i][3]);
        clef_engine_options opt = {.model_dir = dir, .truncate_state = 1, .n_threads = 1};
        clef_err err;
        clef_err_clear(&err);
        clef_engine *e = clef_engine_open(&opt, &err);
        if (e) clef_engine_close(e);
        assert_null(e);
        if (!strstr(err.message, edits[i][4]) || !strstr(err.message, "config.json"))
            fail_msg("message '%s' does not say '%s'", err.message, edits[i][4]);
        remove_dir(dir);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nonfinite_weights_refused_at_load),
        cmocka_unit_test(test_first_nonfinite_named),
        cmocka_unit_test(test_text_only_skips_tower_check),
        cmocka_unit_test(test_nonfinite_quant_scales),
        cmocka_unit_test(test_nonfinite_commands),
        cmocka_unit_test(test_tokenizer_past_vocab_is_load_error),
        cmocka_unit_test(test_config_limits_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
