/* test_synth_disk_full.c — `clef synth` on a full disk fails with the
 * reason and removes the file it could not finish (it used to leave a
 * truncated file behind).
 *
 * The full disk is /dev/full, which answers every write with ENOSPC: each
 * file synth writes is, in turn, a symlink to it in an otherwise empty --out
 * directory (synth opens the name with O_TRUNC and writes through the link).
 * That needs no mount and no root, so it runs the same in CI.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/synth.h"
#include "testutil.h"

static char tmproot[] = "/tmp/clef_full_XXXXXX";

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }
static int setup(void **state) { return mkdtemp(tmproot) ? 0 : -1; }
static int teardown(void **state) { return nftw(tmproot, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

/* Every file of the tiny preset, text files and safetensors. */
static const char *const outputs[] = {"config.json",
                                      "joint_head_config.json",
                                      "tokenizer.json",
                                      "model.safetensors.index.json",
                                      "joint_head.safetensors",
                                      "model-00001-of-00002.safetensors",
                                      "model-00002-of-00002.safetensors",
                                      NULL};

static void test_cli_disk_full(void **state) {
    for (int i = 0; outputs[i]; i++) {
        char dir[512], target[700], cmd[2048], want[700];
        snprintf(dir, sizeof dir, "%s/out%d", tmproot, i);
        assert_int_equal(mkdir(dir, 0700), 0);
        snprintf(target, sizeof target, "%s/%s", dir, outputs[i]);
        assert_int_equal(symlink("/dev/full", target), 0);
        char *tok = tu_fixture("tiny-clef-omni/tokenizer.json");
        snprintf(cmd, sizeof cmd, "exec 2>&1; %s synth --preset tiny --out %s --force --tokenizer %s", CLEF_BINARY,
                 dir, tok);
        free(tok);
        clef_buf out = {0};
        int rc = tu_run_cmd(cmd, &out);
        snprintf(want, sizeof want, "clef synth: %s: cannot write: No space left on device\n", outputs[i]);
        if (rc != 1 || !strstr(out.data, want))
            fail_msg("%s on /dev/full: exit %d, output '%s' (want exit 1 and '%s')", outputs[i], rc, out.data, want);
        struct stat st;
        if (lstat(target, &st) == 0 || errno != ENOENT) fail_msg("%s was left behind", target);
        clef_buf_free(&out);
    }
}

/* The library call reports the same error (500 naming the file). */
static void test_library_disk_full(void **state) {
    char dir[512], target[700];
    snprintf(dir, sizeof dir, "%s/lib", tmproot);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(target, sizeof target, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(symlink("/dev/full", target), 0);
    char *tok = tu_fixture("tiny-clef-omni/tokenizer.json");
    clef_synth_options o = {.preset = "tiny", .seed = 1, .out_dir = dir, .tokenizer = tok};
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_synth_write(&o, &err), -1);
    assert_int_equal(err.status, 500);
    assert_string_equal(err.message, "model-00002-of-00002.safetensors: cannot write: No space left on device");
    struct stat st;
    assert_int_equal(lstat(target, &st), -1);
    /* the files finished before it are whole */
    snprintf(target, sizeof target, "%s/model-00001-of-00002.safetensors", dir);
    assert_int_equal(stat(target, &st), 0);
    assert_true(S_ISREG(st.st_mode) && st.st_size > 0);
    free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli_disk_full),
        cmocka_unit_test(test_library_disk_full),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
