/* test_cli_plan.c — `clef inspect --plan` (engine/placement.h) run as a
 * program: the exact plan of the tiny fixture (no budget and under one) and
 * of the synthetic `full` preset in INT4 under 16 GiB (from shapes alone:
 * it must not draw 60 GB, so it is timed), a plan that does not fit (exit
 * 1, the reason on stderr), and bad command lines (exit 2, a clear
 * message).  Plain `clef inspect --model DIR` is unchanged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "util/buf.h"

#define MODEL CLEF_FIXTURES "/tiny-clef-omni"

/* `clef <args>` (at most 60 s): stdout into *out, stderr into *err; returns the exit status. */
static int run(const char *args, clef_buf *out, clef_buf *err) {
    char path[128], cmd[4096];
    snprintf(path, sizeof path, "/tmp/clef_cli_plan_err_%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "exec 2>%s; timeout 60 %s %s", path, CLEF_BINARY, args);
    const int rc = tu_run_cmd(cmd, out);
    size_t n = 0;
    char *e = tu_read_file(path, &n);
    clef_buf_append(err, e ? e : "", e ? n : 0);
    if (!err->data) clef_buf_puts(err, "");
    free(e);
    remove(path);
    return rc;
}

static const char TINY_NO_BUDGET[] =
    "plan: no GPU memory budget (--gpu-memory): all 3 layers resident, 0.93 GiB\n"
    "  budget                   none\n"
    "  non-expert weights       0.02 GiB       20360960 bytes  embeddings, lm_head, attention, routers, norms, joint head\n"
    "  towers                  <0.01 GiB         675072 bytes  vision + audio\n"
    "  workspace                0.08 GiB       81702912 bytes  a forward of 16384 tokens\n"
    "  context                  0.84 GiB      897581056 bytes  CUDA context, cuBLASLt, driver, 256 MiB margin\n"
    "  resident experts        <0.01 GiB          73728 bytes  3 of 3 MoE layers\n"
    "  expert slots             0.00 GiB              0 bytes  2 x 0 bytes\n"
    "  device total             0.93 GiB     1000393728 bytes\n"
    "  streamed experts         0.00 GiB              0 bytes  0 layers, pinned host memory, copied every forward\n"
    "streamed: none\n";

static void test_tiny_fixture(void **state) {
    (void)state;
    clef_buf out = {0}, err = {0};
    assert_int_equal(run("inspect --plan --model " MODEL, &out, &err), 0);
    assert_string_equal(out.data, TINY_NO_BUDGET);
    assert_string_equal(err.data, "");
    clef_buf_free(&out), clef_buf_free(&err);
    /* "0" and "off" are no budget too */
    assert_int_equal(run("inspect --plan --model " MODEL " --gpu-memory off", &out, &err), 0);
    assert_string_equal(out.data, TINY_NO_BUDGET);
    clef_buf_free(&out), clef_buf_free(&err);
    /* under 1 GiB ("1G" = 2^30 bytes): everything resident; text only, 512 tokens */
    assert_int_equal(run("inspect --plan --model " MODEL " --gpu-memory=1G --text-only --max-batch-tokens 512", &out,
                         &err),
                     0);
    assert_non_null(strstr(out.data, "  budget                   1.00 GiB     1073741824 bytes  --gpu-memory\n"));
    assert_non_null(strstr(out.data, "  towers                   0.00 GiB              0 bytes  text only\n"));
    assert_non_null(strstr(out.data, "  workspace               <0.01 GiB        2683648 bytes  a forward of 512 tokens; a "
                                     "longer record is refused, or its state cut\n"));
    assert_int_equal(strncmp(out.data, "plan: all 3 layers resident, 0.86 GiB of 1.00 GiB\n", 50), 0);
    clef_buf_free(&out), clef_buf_free(&err);
    /* plain inspect is unchanged */
    assert_int_equal(run("inspect --model " MODEL, &out, &err), 0);
    assert_int_equal(strncmp(out.data, "checkpoint " MODEL "\nthinker text decoder:\n", strlen(MODEL) + 34), 0);
    assert_null(strstr(out.data, "plan:"));
    clef_buf_free(&out), clef_buf_free(&err);
}

static void test_synthetic_full_int4(void **state) {
    (void)state;
    clef_buf out = {0}, err = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(run("inspect --plan --synthetic full --quant int4 --gpu-memory 16GiB", &out, &err), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    /* shapes only: drawing full would take minutes and 60 GB */
    assert_true((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec) < 10.0);
    assert_string_equal(
        out.data,
        "plan: 19 of 48 layers' experts resident, 29 streamed (8.42 GiB a forward from pinned host memory), 15.89 GiB "
        "of 16.00 GiB\n"
        "  budget                  16.00 GiB    17179869184 bytes  --gpu-memory\n"
        "  non-expert weights       3.13 GiB     3365163520 bytes  embeddings, lm_head, attention, routers, norms, joint head\n"
        "  towers                   2.22 GiB     2380427264 bytes  vision + audio\n"
        "  workspace                3.60 GiB     3870143232 bytes  a forward of 16384 tokens; a longer record is "
        "refused, or its state cut\n"
        "  context                  0.84 GiB      897581056 bytes  CUDA context, cuBLASLt, driver, 256 MiB margin\n"
        "  resident experts         5.51 GiB     5920849920 bytes  19 of 48 MoE layers\n"
        "  expert slots             0.58 GiB      623247360 bytes  2 x 311623680 bytes\n"
        "  device total            15.89 GiB    17057412352 bytes\n"
        "  streamed experts         8.42 GiB     9037086720 bytes  29 layers, pinned host memory, copied every forward\n"
        "streamed: 1 3 4 6 8 9 11 13 14 16 18 19 21 23 24 26 28 29 31 33 34 36 38 39 41 43 44 46 47\n");
    assert_string_equal(err.data, "");
    clef_buf_free(&out), clef_buf_free(&err);
}

static void test_does_not_fit(void **state) {
    (void)state;
    clef_buf out = {0}, err = {0};
    assert_int_equal(run("inspect --plan --synthetic full --gpu-memory 8G", &out, &err), 1);
    assert_string_equal(err.data,
                        "clef inspect: does not fit in 8.00 GiB: the smallest plan needs 12.05 GiB (non-expert weights "
                        "3.13 GiB, towers 2.22 GiB, workspace for 16384 tokens 3.60 GiB, context 0.84 GiB, two expert "
                        "slots 2.25 GiB); use --max-batch-tokens lower, --text-only or --towers cpu, a smaller format, "
                        "or a budget of at least 12.05 GiB\n");
    assert_int_equal(strncmp(out.data, "does not fit in 8.00 GiB", 24), 0);
    clef_buf_free(&out), clef_buf_free(&err);
    assert_int_equal(run("inspect --plan --model " MODEL " --gpu-memory 100M", &out, &err), 1);
    assert_non_null(strstr(err.data, "clef inspect: does not fit in 0.10 GiB: the smallest plan needs 0.94 GiB"));
    clef_buf_free(&out), clef_buf_free(&err);
}

/* `clef inspect <args>` exits 2 and stderr holds `needle`. */
static void bad(const char *args, const char *needle) {
    char full[1024];
    snprintf(full, sizeof full, "inspect %s", args);
    clef_buf out = {0}, err = {0};
    const int rc = run(full, &out, &err);
    if (rc != 2 || !strstr(err.data, needle))
        fail_msg("`clef %s`: exit %d (want 2), stderr:\n%s\n(want '%s')", full, rc, err.data, needle);
    clef_buf_free(&out), clef_buf_free(&err);
}

static void test_bad_inputs(void **state) {
    (void)state;
    bad("--plan --model " MODEL " --gpu-memory 12XB",
        "clef: --gpu-memory: '12XB' is not a size (a number of bytes with an optional K, M, G or T suffix");
    bad("--plan --model " MODEL " --gpu-memory", "clef: --gpu-memory needs a value");
    bad("--plan --model " MODEL " --gpu-memory -1G", "'-1G' is not a size");
    bad("--plan", "clef inspect: --plan needs --model DIR or --synthetic P");
    bad("--gpu-memory 4G --model " MODEL,
        "clef inspect: --synthetic, --quant, --gpu-memory, --max-batch-tokens, --text-only and --towers go with --plan");
    bad("--towers cpu --model " MODEL,
        "clef inspect: --synthetic, --quant, --gpu-memory, --max-batch-tokens, --text-only and --towers go with --plan");
    bad("--plan --model " MODEL " --towers tpu", "clef: --towers must be cpu or gpu (got 'tpu')\n");
    bad("--plan --model " MODEL " --towers", "clef: --towers needs a value\n");
    /* a huge forward is a usage error naming the flag and its largest value (issue 17, item 1);
     * before, 2^62 wrapped the workspace size and the plan "fit" */
    bad("--plan --synthetic full --gpu-memory 16GiB --max-batch-tokens 4611686018427387904",
        "clef inspect: --max-batch-tokens is at most 16777216 (got 4611686018427387904)\n");
    bad("--plan --synthetic full --max-batch-tokens 16777217", "clef inspect: --max-batch-tokens is at most 16777216 (got 16777217)\n");
    bad("--plan --model " MODEL " --synthetic tiny", "clef inspect: --model and --synthetic are exclusive");
    bad("--plan --model " MODEL " --quant int4", "clef inspect: --quant goes with --synthetic");
    bad("--plan --synthetic huge", "clef inspect: unknown synthetic preset 'huge'");
    bad("--plan --synthetic tiny --quant int3", "clef inspect: --quant: unknown quantized format 'int3'");
    bad("--plan --model " MODEL " --max-batch-tokens 0", "clef inspect: --max-batch-tokens must be at least 1");
    bad("--plan --model " MODEL " --max-batch-tokens 1x", "--max-batch-tokens");
    bad("--plan --model " MODEL " --bogus", "clef inspect: unknown argument '--bogus'");
    /* --help: the usage, exit 0 */
    clef_buf out = {0}, err = {0};
    assert_int_equal(run("inspect --help", &out, &err), 0);
    assert_non_null(strstr(err.data, "clef inspect --plan (--model DIR | --synthetic P [--quant F]) [--gpu-memory SIZE]"));
    assert_non_null(strstr(err.data, "(default 16384)"));
    clef_buf_free(&out), clef_buf_free(&err);
}

/* --towers cpu (issue 17, item 7): the towers' bytes leave the device side, so more layers stay
 * resident; the full preset in BF16 at 16 GiB: 3 resident layers with the towers on the GPU, 5 with
 * them on the CPU (their 2,380,427,264 bytes shown on the host side). */
static void test_towers_cpu(void **state) {
    (void)state;
    clef_buf out = {0}, err = {0};
    assert_int_equal(run("inspect --plan --synthetic full --gpu-memory 16GiB --towers gpu", &out, &err), 0);
    assert_int_equal(strncmp(out.data, "plan: 3 of 48 layers' experts resident, 45 streamed (50.62 GiB a forward from "
                                       "pinned host memory), 15.42 GiB of 16.00 GiB\n", 118), 0);
    assert_non_null(strstr(out.data, "  towers                   2.22 GiB     2380427264 bytes  vision + audio\n"));
    assert_null(strstr(out.data, "host: towers"));
    clef_buf_free(&out), clef_buf_free(&err);
    /* the default is the GPU side */
    assert_int_equal(run("inspect --plan --synthetic full --gpu-memory 16GiB", &out, &err), 0);
    assert_int_equal(strncmp(out.data, "plan: 3 of 48 layers' experts resident", 38), 0);
    clef_buf_free(&out), clef_buf_free(&err);
    assert_int_equal(run("inspect --plan --synthetic full --gpu-memory 16GiB --towers cpu", &out, &err), 0);
    assert_string_equal(
        out.data,
        "plan: 5 of 48 layers' experts resident, 43 streamed (48.38 GiB a forward from pinned host memory), 15.45 GiB "
        "of 16.00 GiB\n"
        "  budget                  16.00 GiB    17179869184 bytes  --gpu-memory\n"
        "  non-expert weights       3.13 GiB     3365163520 bytes  embeddings, lm_head, attention, routers, norms, joint head\n"
        "  towers                   0.00 GiB              0 bytes  on the CPU (--towers cpu): not on the GPU\n"
        "  workspace                3.60 GiB     3869159936 bytes  a forward of 16384 tokens; a longer record is "
        "refused, or its state cut\n"
        "  context                  0.84 GiB      897581056 bytes  CUDA context, cuBLASLt, driver, 256 MiB margin\n"
        "  resident experts         5.62 GiB     6039797760 bytes  5 of 48 MoE layers\n"
        "  expert slots             2.25 GiB     2415919104 bytes  2 x 1207959552 bytes\n"
        "  device total            15.45 GiB    16587621376 bytes\n"
        "  streamed experts        48.38 GiB    51942260736 bytes  43 layers, pinned host memory, copied every forward\n"
        "  host: towers             2.22 GiB     2380427264 bytes  vision + audio on the CPU backend (--towers cpu)\n"
        "streamed: 1 2 3 4 5 6 7 8 10 11 12 13 14 15 16 17 18 20 21 22 23 24 25 26 27 29 30 31 32 33 34 35 36 37 39 40 "
        "41 42 43 44 45 46 47\n");
    assert_string_equal(err.data, "");
    clef_buf_free(&out), clef_buf_free(&err);
    /* a plan that does not fit with the towers on the CPU no longer suggests moving them */
    assert_int_equal(run("inspect --plan --synthetic full --gpu-memory 8G --towers cpu", &out, &err), 1);
    assert_non_null(strstr(err.data, "two expert slots 2.25 GiB); use --max-batch-tokens lower, a smaller format, or a "
                                     "budget of at least 9.83 GiB\n"));
    clef_buf_free(&out), clef_buf_free(&err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_fixture),
        cmocka_unit_test(test_synthetic_full_int4),
        cmocka_unit_test(test_does_not_fit),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_towers_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
