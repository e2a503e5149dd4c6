/* test_checkpoint.c — checkpoint directory: index, shards, head, catalog
 * (SPEC.md §1.1) on the tiny fixture and on synthetic directories. */
#define _GNU_SOURCE
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "testutil.h"

static char tmproot[] = "/tmp/clef_ck_XXXXXX";
static int dir_counter;

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }
static int setup(void **state) { return mkdtemp(tmproot) ? 0 : -1; }
static int teardown(void **state) { return nftw(tmproot, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

static char *join(const char *dir, const char *name) {
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

static void write_text(const char *dir, const char *name, const char *text) {
    char *p = join(dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    free(p);
}

/* A safetensors file whose tensors are all U8 [1] at consecutive offsets;
 * `names` is NULL-terminated. */
static void write_shard(const char *dir, const char *file, const char *const *names) {
    clef_buf h = {0};
    clef_buf_putc(&h, '{');
    size_t n = 0;
    for (; names[n]; n++)
        clef_buf_printf(&h, "%s\"%s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[%zu,%zu]}", n ? "," : "",
                        names[n], n, n + 1);
    clef_buf_putc(&h, '}');
    char *p = join(dir, file);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    for (int i = 0; i < 8; i++)
        fputc((int)((uint64_t)h.len >> (8 * i)) & 0xff, f);
    fwrite(h.data, 1, h.len, f);
    for (size_t i = 0; i < n; i++)
        fputc(7, f);
    fclose(f);
    free(p);
    clef_buf_free(&h);
}

static void link_fixture(const char *dir, const char *name) {
    char *rel = join("tiny-clef-omni", name);
    char *src = tu_fixture(rel);
    char *dst = join(dir, name);
    assert_int_equal(symlink(src, dst), 0);
    free(rel);
    free(src);
    free(dst);
}

/* A fresh directory holding the fixture's configs and head. */
static char *new_ckpt_dir(int with_head) {
    char name[32];
    snprintf(name, sizeof name, "ck%d", dir_counter++);
    char *dir = join(tmproot, name);
    assert_int_equal(mkdir(dir, 0700), 0);
    link_fixture(dir, "config.json");
    link_fixture(dir, "joint_head_config.json");
    if (with_head) link_fixture(dir, "joint_head.safetensors");
    return dir;
}

static void expect_open_error(const char *dir, const char *frag1, const char *frag2) {
    clef_checkpoint ck;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_checkpoint_open(dir, &ck, &err), -1);
    assert_int_equal(err.status, 500);
    assert_string_equal(err.type, CLEF_E_INTERNAL);
    assert_null(ck.catalog);
    assert_int_equal(ck.n_shards, 0);
    if (!strstr(err.message, frag1)) fail_msg("message '%s' lacks '%s'", err.message, frag1);
    if (frag2 && !strstr(err.message, frag2)) fail_msg("message '%s' lacks '%s'", err.message, frag2);
}

static void test_fixture(void **state) {
    char *dir = tu_fixture("tiny-clef-omni");
    clef_checkpoint ck;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_checkpoint_open(dir, &ck, &err), 0);
    assert_int_equal(ck.n_shards, 3);
    assert_non_null(strstr(ck.shards[2].path, "joint_head.safetensors"));
    assert_int_equal(ck.n_tensors, 210 + 122); /* thinker (index) + head */
    assert_int_equal(ck.config.text.hidden_size, 32);
    assert_int_equal(ck.config.head.width, 64);
    for (size_t i = 1; i < ck.n_tensors; i++)
        assert_true(strcmp(ck.catalog[i - 1]->name, ck.catalog[i]->name) < 0);

    const int64_t emb[] = {152064, 32}, q[] = {64, 32}, ex[] = {32, 16}, gate[] = {8, 32};
    const unsigned bf16 = CLEF_DT_BIT(CLEF_DT_BF16);
    assert_non_null(clef_checkpoint_require(&ck, "thinker.model.embed_tokens.weight", bf16, 2, emb, &err));
    assert_non_null(clef_checkpoint_require(&ck, "thinker.lm_head.weight", bf16, 2, emb, &err));
    assert_non_null(clef_checkpoint_require(&ck, "thinker.model.layers.0.self_attn.q_proj.weight", bf16, 2, q, &err));
    assert_non_null(
        clef_checkpoint_require(&ck, "thinker.model.layers.2.mlp.experts.7.down_proj.weight", bf16, 2, ex, &err));
    assert_non_null(clef_checkpoint_require(&ck, "thinker.model.layers.2.mlp.gate.weight", 0, 2, gate, &err));
    assert_non_null(clef_checkpoint_require(&ck, "residual_gate", bf16, 0, NULL, &err));
    assert_non_null(clef_checkpoint_require(&ck, "layers.3.linear1.weight", bf16, -1, NULL, &err));
    assert_null(clef_checkpoint_find(&ck, "thinker.model.layers.3.self_attn.q_proj.weight"));
    assert_null(clef_checkpoint_find(&ck, "zzz"));

    /* Shape mismatch: the message names the tensor, the expectation and the truth. */
    const int64_t wrong[] = {64, 33};
    clef_err_clear(&err);
    assert_null(clef_checkpoint_require(&ck, "thinker.model.layers.0.self_attn.q_proj.weight", bf16, 2, wrong, &err));
    assert_int_equal(err.status, 500);
    assert_non_null(strstr(err.message, "tensor 'thinker.model.layers.0.self_attn.q_proj.weight': expected shape "
                                        "[64,33], found [64,32]"));
    assert_non_null(strstr(err.message, "model-00001-of-00002.safetensors"));
    /* Rank mismatch. */
    assert_null(clef_checkpoint_require(&ck, "joint_logit_scale", bf16, 1, (const int64_t[]){1}, &err));
    assert_non_null(strstr(err.message, "expected shape [1], found []"));
    /* Dtype mismatch. */
    assert_null(clef_checkpoint_require(&ck, "thinker.model.norm.weight",
                                        CLEF_DT_BIT(CLEF_DT_F32) | CLEF_DT_BIT(CLEF_DT_F16), -1, NULL, &err));
    assert_non_null(strstr(err.message, "tensor 'thinker.model.norm.weight': expected dtype F16 or F32, found BF16"));
    /* Absent. */
    assert_null(clef_checkpoint_require(&ck, "thinker.model.layers.9.mlp.gate.weight", 0, -1, NULL, &err));
    assert_non_null(strstr(err.message, "'thinker.model.layers.9.mlp.gate.weight' not found"));

    clef_checkpoint_close(&ck);
    assert_null(ck.catalog);
    clef_checkpoint_close(&ck);
    free(dir);
}

/* Single model.safetensors; talker/code2wav tensors are left out. */
static void test_single_file_and_skip(void **state) {
    char *dir = new_ckpt_dir(1);
    const char *names[] = {"thinker.a", "talker.x", "code2wav.y", "thinker.b", NULL};
    write_shard(dir, "model.safetensors", names);
    clef_checkpoint ck;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_checkpoint_open(dir, &ck, &err), 0);
    assert_int_equal(ck.n_shards, 2);
    assert_int_equal(ck.n_tensors, 2 + 122);
    assert_non_null(clef_checkpoint_find(&ck, "thinker.a"));
    assert_non_null(clef_checkpoint_find(&ck, "thinker.b"));
    assert_null(clef_checkpoint_find(&ck, "talker.x"));
    assert_null(clef_checkpoint_find(&ck, "code2wav.y"));
    assert_non_null(clef_checkpoint_find(&ck, "prior_logit_scale"));
    clef_checkpoint_close(&ck);
    free(dir);
}

/* An index whose skipped entries point at a shard that does not exist:
 * that shard is never opened. */
static void test_index_skips_speech_shards(void **state) {
    char *dir = new_ckpt_dir(1);
    const char *s1[] = {"thinker.a", NULL};
    const char *s2[] = {"thinker.b", "talker.z", NULL};
    write_shard(dir, "m-1.safetensors", s1);
    write_shard(dir, "m-2.safetensors", s2);
    write_text(dir, "model.safetensors.index.json",
               "{\"metadata\":{\"total_size\":2},\"weight_map\":{\"thinker.a\":\"m-1.safetensors\","
               "\"talker.y\":\"m-talker.safetensors\",\"thinker.b\":\"m-2.safetensors\","
               "\"talker.z\":\"m-2.safetensors\"}}");
    clef_checkpoint ck;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_checkpoint_open(dir, &ck, &err), 0);
    assert_int_equal(ck.n_shards, 3);
    assert_int_equal(ck.n_tensors, 2 + 122);
    clef_checkpoint_close(&ck);
    free(dir);
}

static void test_index_wrong_shard(void **state) {
    char *dir = new_ckpt_dir(1);
    const char *s1[] = {"thinker.a", NULL};
    const char *s2[] = {"thinker.b", NULL};
    write_shard(dir, "m-1.safetensors", s1);
    write_shard(dir, "m-2.safetensors", s2);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"thinker.a\":\"m-2.safetensors\",\"thinker.b\":\"m-2.safetensors\"}}");
    expect_open_error(dir, "model.safetensors.index.json", "'thinker.a' in m-2.safetensors");
    /* Named but in no shard at all. */
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"thinker.a\":\"m-1.safetensors\",\"thinker.c\":\"m-1.safetensors\"}}");
    expect_open_error(dir, "'thinker.c'", "does not contain");
    /* Shard missing on disk. */
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"thinker.a\":\"m-9.safetensors\"}}");
    expect_open_error(dir, "m-9.safetensors", "cannot open");
    /* Shard name escaping the directory. */
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"thinker.a\":\"../m-1.safetensors\"}}");
    expect_open_error(dir, "'thinker.a'", "plain file name");
    /* Not an index. */
    write_text(dir, "model.safetensors.index.json", "{\"metadata\":{}}");
    expect_open_error(dir, "model.safetensors.index.json", "weight_map");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":");
    expect_open_error(dir, "model.safetensors.index.json", "not valid JSON");
    free(dir);
}

static void test_duplicate_across_shards(void **state) {
    char *dir = new_ckpt_dir(1);
    const char *s1[] = {"thinker.a", "thinker.dup", NULL};
    const char *s2[] = {"thinker.dup", NULL};
    write_shard(dir, "m-1.safetensors", s1);
    write_shard(dir, "m-2.safetensors", s2);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"thinker.a\":\"m-1.safetensors\",\"thinker.dup\":\"m-2.safetensors\"}}");
    expect_open_error(dir, "tensor 'thinker.dup'", "duplicate");
    /* A head tensor name inside a thinker shard is a duplicate too. */
    const char *s3[] = {"thinker.a", "residual_gate", NULL};
    write_shard(dir, "m-1.safetensors", s3);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"thinker.a\":\"m-1.safetensors\"}}");
    expect_open_error(dir, "'residual_gate'", "duplicate");
    free(dir);
}

static void test_missing_parts(void **state) {
    char *dir = new_ckpt_dir(0);
    const char *s1[] = {"thinker.a", NULL};
    expect_open_error(dir, "model.safetensors", "found");
    write_shard(dir, "model.safetensors", s1);
    expect_open_error(dir, "joint_head.safetensors", "cannot open");
    free(dir);
    expect_open_error("/nonexistent/ckpt", "config.json", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture),
        cmocka_unit_test(test_single_file_and_skip),
        cmocka_unit_test(test_index_skips_speech_shards),
        cmocka_unit_test(test_index_wrong_shard),
        cmocka_unit_test(test_duplicate_across_shards),
        cmocka_unit_test(test_missing_parts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
