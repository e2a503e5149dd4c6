/* test_loader_files.c — every file a checkpoint is read from is checked
 * before it is read (util/file.h): a FIFO in place of config.json, a shard,
 * the head, hf_quant_config.json or tokenizer.json is refused at once (it
 * used to block forever in open), a device (/dev/zero) is refused, a file
 * over its cap is refused from its size (a 1 GiB sparse tokenizer.json used
 * to be read whole), and `--model DIR/` names DIR/config.json in errors.
 *
 * Every test runs under alarm(): a loader that blocks on a FIFO fails the
 * test by SIGALRM instead of hanging the suite.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/config.h"
#include "io/synth.h"
#include "quant/format.h"
#include "testutil.h"
#include "util/file.h"

static char tmproot[] = "/tmp/clef_files_XXXXXX";
static int dir_counter;

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }
static int setup(void **state) { return mkdtemp(tmproot) ? 0 : -1; }
static int teardown(void **state) { return nftw(tmproot, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

/* Each test must finish well inside this many seconds (a blocked open would
 * otherwise hang; SIGALRM's default action ends the program: a failure). */
#define TEST_SECONDS 20
static int arm(void **state) {
    alarm(TEST_SECONDS);
    return 0;
}
static int disarm(void **state) {
    alarm(0);
    return 0;
}

static char *join(const char *dir, const char *name) {
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

static const char *const fixture_files[] = {"config.json", "joint_head_config.json", "joint_head.safetensors",
                                            "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                            "model.safetensors.index.json", "tokenizer.json", NULL};

/* A fresh directory of symlinks to the tiny fixture's files, except `fifo`
 * (if not NULL), which is a FIFO nobody writes to. */
static char *tiny_copy(const char *fifo) {
    char name[32];
    snprintf(name, sizeof name, "ck%d", dir_counter++);
    char *dir = join(tmproot, name);
    assert_int_equal(mkdir(dir, 0700), 0);
    for (size_t i = 0; fixture_files[i]; i++) {
        char *dst = join(dir, fixture_files[i]);
        if (fifo && !strcmp(fifo, fixture_files[i])) {
            assert_int_equal(mkfifo(dst, 0600), 0);
        } else {
            char rel[128];
            snprintf(rel, sizeof rel, "tiny-clef-omni/%s", fixture_files[i]);
            char *src = tu_fixture(rel);
            assert_int_equal(symlink(src, dst), 0);
            free(src);
        }
        free(dst);
    }
    return dir;
}

/* Replace `dir/name` by a sparse regular file of `bytes` bytes. */
static void sparse_file(const char *dir, const char *name, off_t bytes) {
    char *p = join(dir, name);
    unlink(p);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, bytes), 0);
    close(fd);
    free(p);
}

/* clef_checkpoint_open(dir) fails with exactly `want` ("%s" = dir). */
static void expect_open_error(const char *dir, const char *want_fmt) {
    char want[1024];
    snprintf(want, sizeof want, want_fmt, dir);
    clef_checkpoint ck;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_checkpoint_open(dir, &ck, &err), -1);
    assert_int_equal(err.status, 500);
    assert_string_equal(err.type, CLEF_E_INTERNAL);
    assert_string_equal(err.message, want);
}

static void test_fifo_config(void **state) {
    char *dir = tiny_copy("config.json");
    expect_open_error(dir, "%s/config.json: not a regular file (a FIFO)");
    free(dir);
    dir = tiny_copy("joint_head_config.json");
    expect_open_error(dir, "%s/joint_head_config.json: not a regular file (a FIFO)");
    free(dir);
    dir = tiny_copy("model.safetensors.index.json");
    expect_open_error(dir, "%s/model.safetensors.index.json: not a regular file (a FIFO)");
    free(dir);
}

static void test_fifo_shards(void **state) {
    char *dir = tiny_copy("model-00002-of-00002.safetensors");
    expect_open_error(dir, "model-00002-of-00002.safetensors: not a regular file (a FIFO)");
    free(dir);
    dir = tiny_copy("joint_head.safetensors");
    expect_open_error(dir, "joint_head.safetensors: not a regular file (a FIFO)");
    free(dir);
    /* A device is no shard either (and st_open alone says so). */
    st_file f;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(st_open("/dev/zero", &f, &err), -1);
    assert_string_equal(err.message, "zero: not a regular file (a character device)");
}

static void test_fifo_hf_quant_config(void **state) {
    char *dir = tiny_copy(NULL);
    char *hq = join(dir, "hf_quant_config.json");
    assert_int_equal(mkfifo(hq, 0600), 0);
    clef_quant_config qc;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_quant_config_load(dir, &qc, &err), -1);
    clef_quant_config_free(&qc);
    char want[1024];
    snprintf(want, sizeof want, "%s/hf_quant_config.json: not a regular file (a FIFO)", dir);
    assert_string_equal(err.message, want);
    free(hq);
    free(dir);
}

static void expect_tokenizer_error(const char *path, const char *what) {
    clef_err err;
    clef_err_clear(&err);
    assert_null(clef_tokenizer_load(path, &err));
    char want[1024];
    snprintf(want, sizeof want, "tokenizer %s: %s", path, what);
    assert_int_equal(err.status, 500);
    assert_string_equal(err.message, want);
}

static void test_tokenizer_files(void **state) {
    char *dir = tiny_copy("tokenizer.json");
    char *tok = join(dir, "tokenizer.json");
    expect_tokenizer_error(tok, "not a regular file (a FIFO)");
    expect_tokenizer_error("/dev/zero", "not a regular file (a character device)");
    expect_tokenizer_error(dir, "not a regular file (a directory)");
    /* A 1 GiB sparse file is refused from its size, before a byte is read. */
    unlink(tok);
    sparse_file(dir, "tokenizer.json", (off_t)1 << 30);
    expect_tokenizer_error(tok, "file is 1073741824 bytes, more than the limit of 67108864 bytes");
    /* The engine names the same file for a checkpoint directory. */
    clef_engine_options o = {.model_dir = dir, .n_threads = 1};
    clef_err err;
    clef_err_clear(&err);
    assert_null(clef_engine_open(&o, &err));
    char want[1024];
    snprintf(want, sizeof want, "tokenizer %s: file is 1073741824 bytes, more than the limit of 67108864 bytes", tok);
    assert_string_equal(err.message, want);
    /* clef synth copies --tokenizer through the same check. */
    char *out = join(tmproot, "synth-out");
    clef_synth_options so = {.preset = "tiny", .seed = 1, .out_dir = out, .tokenizer = tok};
    clef_err_clear(&err);
    assert_int_equal(clef_synth_write(&so, &err), -1);
    assert_string_equal(err.message, want);
    free(out);
    free(tok);
    free(dir);
}

static void test_oversized_configs(void **state) {
    char *dir = tiny_copy(NULL);
    sparse_file(dir, "config.json", (off_t)5 << 20);
    expect_open_error(dir, "%s/config.json: file is 5242880 bytes, more than the limit of 4194304 bytes");
    free(dir);
    dir = tiny_copy(NULL);
    sparse_file(dir, "model.safetensors.index.json", (off_t)65 << 20);
    expect_open_error(dir,
                      "%s/model.safetensors.index.json: file is 68157440 bytes, more than the limit of 67108864 bytes");
    free(dir);
}

/* `--model DIR/`: the files are DIR/config.json etc., and messages that name
 * the directory say DIR, never "" (the base name of "DIR/"). */
static void test_trailing_slash(void **state) {
    char *dir = tiny_copy(NULL);
    char slashed[1024];
    snprintf(slashed, sizeof slashed, "%s//", dir);
    clef_checkpoint ck;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_checkpoint_open(slashed, &ck, &err), 0);
    assert_string_equal(ck.dir, dir);
    /* A tensor missing from the catalog is reported against the directory's name. */
    assert_null(clef_checkpoint_require(&ck, "no.such.tensor", 0, -1, NULL, &err));
    const char *base = strrchr(dir, '/') + 1;
    char want[1024];
    snprintf(want, sizeof want, "%s: tensor 'no.such.tensor' not found in the checkpoint", base);
    assert_string_equal(err.message, want);
    clef_checkpoint_close(&ck);

    char *cfg = join(dir, "config.json");
    unlink(cfg);
    snprintf(want, sizeof want, "%s/config.json: cannot open: No such file or directory", dir);
    clef_err_clear(&err);
    assert_int_equal(clef_checkpoint_open(slashed, &ck, &err), -1);
    assert_string_equal(err.message, want);
    /* The same through the CLI: exit 1 and the message on stderr. */
    clef_buf out = {0};
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "exec 2>&1; echo '{}' | %s decide --model %s/ -", CLEF_BINARY, dir);
    assert_int_equal(tu_run_cmd(cmd, &out), 1);
    if (!strstr(out.data, want)) fail_msg("stderr '%s' lacks '%s'", out.data, want);
    clef_buf_free(&out);
    free(cfg);
    free(dir);
}

static void test_path_join(void **state) {
    char *p = clef_path_join("m///", "config.json");
    assert_string_equal(p, "m/config.json");
    free(p);
    p = clef_path_join("/", "x");
    assert_string_equal(p, "/x");
    free(p);
    p = clef_path_join("a/b", "c");
    assert_string_equal(p, "a/b/c");
    free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fifo_config, arm, disarm),
        cmocka_unit_test_setup_teardown(test_fifo_shards, arm, disarm),
        cmocka_unit_test_setup_teardown(test_fifo_hf_quant_config, arm, disarm),
        cmocka_unit_test_setup_teardown(test_tokenizer_files, arm, disarm),
        cmocka_unit_test_setup_teardown(test_oversized_configs, arm, disarm),
        cmocka_unit_test_setup_teardown(test_trailing_slash, arm, disarm),
        cmocka_unit_test(test_path_join),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
