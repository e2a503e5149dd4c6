/* test_hostile_checkpoint.c — corrupted copies of the tiny fixture that load
 * (every header, shape and dtype is valid) but must never produce an answer:
 *   1. a NaN or Inf weight anywhere in the thinker's attention (q_proj,
 *      k_proj) or elsewhere must make clef_engine_decide refuse with an
 *      error, never answer: the attention softmax used to clamp a NaN score
 *      to e^-87, so a NaN in q/k gave a finite, confident, wrong answer;
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

/* Overwrite bf16 element `index` of tensor `name` in the copied shard. */
static void poke_bf16(const char *shard, const char *copy, const char *name, size_t index, uint16_t bits) {
    char src[4096];
    snprintf(src, sizeof src, "%s/%s", FIX_DIR, shard);
    st_file f;
    clef_err err;
    clef_err_clear(&err);
    if (st_open(src, &f, &err) != 0) fail_msg("st_open %s: %s", src, err.message);
    const st_tensor *t = st_find(&f, name);
    if (!t || t->dtype != CLEF_DT_BF16 || index >= t->numel) fail_msg("tensor %s", name);
    long off = (long)((const char *)t->data - (const char *)f.map) + (long)(2 * index);
    st_close(&f);
    FILE *o = fopen(copy, "r+b");
    assert_non_null(o);
    assert_int_equal(fseek(o, off, SEEK_SET), 0);
    unsigned char b[2] = {(unsigned char)(bits & 0xff), (unsigned char)(bits >> 8)}; /* little-endian */
    assert_int_equal(fwrite(b, 1, 2, o), 2);
    fclose(o);
}

/* Load `dir`, answer REQUEST; returns the decide status (0 = answered) and
 * the error.  The engine must load: these checkpoints are well-formed. */
static int decide_in(const char *dir, clef_buf *out, clef_err *err) {
    clef_engine_options opt = {.model_dir = dir, .truncate_state = 1, .n_threads = 1};
    clef_err_clear(err);
    clef_engine *e = clef_engine_open(&opt, err);
    if (!e) fail_msg("engine on %s: %s", dir, err->message);
    int rc = clef_engine_decide(e, REQUEST, sizeof REQUEST - 1, NULL, out, err);
    clef_engine_close(e);
    return rc;
}

typedef struct poison {
    const char *shard, *tensor;
    size_t index;
    uint16_t bits;
} poison;

static void test_nonfinite_weights_refused(void **state) {
    const char *s1 = "model-00001-of-00002.safetensors", *s2 = "model-00002-of-00002.safetensors";
    const poison cases[] = {
        {s1, "thinker.model.layers.0.self_attn.q_proj.weight", 5, 0x7fc0},  /* NaN: was answered */
        {s1, "thinker.model.layers.1.self_attn.k_proj.weight", 0, 0x7fc0},  /* NaN: was answered */
        {s1, "thinker.model.layers.0.self_attn.q_proj.weight", 5, 0x7f80},  /* +Inf: was answered */
        {s1, "thinker.model.layers.1.self_attn.v_proj.weight", 0, 0x7fc0},  /* NaN */
        {s2, "thinker.model.layers.0.mlp.experts.3.down_proj.weight", 0, 0xffc0}, /* -NaN in an expert */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char copy[4096];
        char *dir = make_dir(cases[i].shard, copy, sizeof copy);
        poke_bf16(cases[i].shard, copy, cases[i].tensor, cases[i].index, cases[i].bits);
        clef_buf out = {0};
        clef_err err;
        int rc = decide_in(dir, &out, &err);
        if (rc == 0) fail_msg("%s = 0x%04x: answered %s", cases[i].tensor, cases[i].bits, out.data);
        assert_int_equal(err.status, 500);
        assert_non_null(strstr(err.message, "non-finite"));
        printf("  %-52s 0x%04x refused: %s\n", cases[i].tensor, cases[i].bits, err.message);
        clef_buf_free(&out);
        remove_dir(dir);
    }
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
        cmocka_unit_test(test_nonfinite_weights_refused),
        cmocka_unit_test(test_tokenizer_past_vocab_is_load_error),
        cmocka_unit_test(test_config_limits_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
