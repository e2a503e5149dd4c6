/* test_cli_hostile.c — `clef decide` on bad command lines and inputs: each
 * must end with a clear message and a sensible exit status (2 usage, 1 input
 * or model that cannot be used), never a signal, a silent substitute value
 * or a reported success whose output was lost:
 *   --threads 100000 crashed OpenMP (SIGSEGV), --threads 4294967297 wrapped
 *   to 1 thread, OMP_NUM_THREADS=100000 crashed too; --max-length 0 silently
 *   meant 64000; an endless or huge input was read until memory ran out
 *   (abort); a directory gave "error reading" without the reason; a response
 *   written to a full disk exited 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "util/buf.h"

#define MODEL CLEF_FIXTURES "/tiny-clef-omni"

static char request_path[256];

/* Run a shell command, capturing stdout+stderr; returns the exit status, or
 * -1 - signal when it was killed. */
static int run_cmd(const char *cmd, clef_buf *out) {
    char full[4096 + 16]; /* "exec 2>&1; " + a command of up to 4 KiB */
    snprintf(full, sizeof full, "exec 2>&1; %s", cmd); /* stderr to the pipe, whatever cmd does with stdout */
    return tu_run_cmd(full, out);
}

/* `clef decide <args>` must exit with `want` and print `needle`. */
static void expect(const char *args, int want, const char *needle) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s decide %s", CLEF_BINARY, args);
    clef_buf out = {0};
    int rc = run_cmd(cmd, &out);
    if (rc != want || !strstr(out.data, needle))
        fail_msg("`clef decide %s`: exit %d (want %d), output:\n%s\n(want it to contain '%s')", args, rc, want, out.data,
                 needle);
    printf("  exit %d: %.*s\n", rc, (int)strcspn(out.data, "\n"), out.data);
    clef_buf_free(&out);
}

static int setup(void **state) {
    snprintf(request_path, sizeof request_path, "/tmp/clef_cli_hostile_%d.json", (int)getpid());
    FILE *f = fopen(request_path, "w");
    assert_non_null(f);
    fputs("{\"model\":\"m\",\"state\":\"s\",\"questions\":{\"q\":{\"type\":\"noul\"}}}", f);
    fclose(f);
    return 0;
}

static int teardown(void **state) {
    unlink(request_path);
    return 0;
}

static void test_threads(void **state) {
    char a[1024];
    snprintf(a, sizeof a, "--model %s --threads 100000 %s", MODEL, request_path);
    expect(a, 2, "--threads 100000 is more than the limit of 1024");
    snprintf(a, sizeof a, "--model %s --threads 4294967297 %s", MODEL, request_path);
    expect(a, 2, "more than the limit");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=100000 %s decide --model %s %s", CLEF_BINARY, MODEL, request_path);
    clef_buf out = {0};
    int rc = run_cmd(cmd, &out);
    if (rc != 1 || !strstr(out.data, "100000 threads (OMP_NUM_THREADS); at most 1024"))
        fail_msg("OMP_NUM_THREADS=100000: exit %d: %s", rc, out.data);
    clef_buf_free(&out);
    snprintf(a, sizeof a, "--model %s --threads 2 %s", MODEL, request_path);
    expect(a, 0, "\"noul\":");
}

static void test_max_length_zero(void **state) {
    char a[1024];
    snprintf(a, sizeof a, "--model %s --max-length 0 %s", MODEL, request_path);
    expect(a, 2, "--max-length must be at least 1");
}

static void test_input_limits(void **state) {
    char a[1024];
    /* a stream that never ends */
    snprintf(a, sizeof a, "--model %s --max-body-mb 1 /dev/zero", MODEL);
    expect(a, 1, "/dev/zero is more than the limit of 1048576 bytes");
    snprintf(a, sizeof a, "--model %s --max-body-mb 1 - < /dev/zero", MODEL);
    expect(a, 1, "stdin is more than the limit of 1048576 bytes");
    /* a (sparse) 300 MiB file is refused from its size, before reading */
    char big[256];
    snprintf(big, sizeof big, "/tmp/clef_cli_hostile_big_%d.json", (int)getpid());
    FILE *f = fopen(big, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(truncate(big, 300L << 20), 0);
    snprintf(a, sizeof a, "--model %s %s", MODEL, big);
    expect(a, 1, "is 314572800 bytes, more than the limit of 268435456 bytes");
    unlink(big);
    snprintf(a, sizeof a, "--model %s --max-body-mb 0 %s", MODEL, request_path);
    expect(a, 2, "--max-body-mb wants 1..");
    snprintf(a, sizeof a, "--model %s /tmp", MODEL);
    expect(a, 1, "error reading /tmp: Is a directory");
}

static void test_lost_output_is_an_error(void **state) {
    if (access("/dev/full", W_OK) != 0) skip();
    char a[1024];
    snprintf(a, sizeof a, "--model %s %s > /dev/full", MODEL, request_path);
    expect(a, 1, "cannot write the output: No space left on device");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_max_length_zero),
        cmocka_unit_test(test_input_limits),
        cmocka_unit_test(test_lost_output_is_an_error),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
