/* test_cli_placement.c — the placement flags of the commands that load a
 * model (issue 17), as programs, on the CPU:
 *   - `--gpu-memory` with a CPU device is a usage error (exit 2, one exact
 *     line on stderr) before anything is read: the same answer for the tiny
 *     fixture and for a model directory that does not exist, and fast;
 *   - `--towers cpu|gpu`: a bad value, or gpu on a CPU device, is exit 2 with
 *     an exact message; `--towers cpu` on a CPU device is accepted and a
 *     media request's answer is the same bytes as without it;
 *   - `--max-batch-tokens` / `--max-length` past the planner's largest
 *     forward under a budget: exit 2 naming the flag and the largest value;
 *   - the --help texts name --towers;
 *   - clef_engine_open makes the same checks before it opens the checkpoint. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "engine/engine.h"
#include "util/buf.h"

#define MODEL CLEF_FIXTURES "/tiny-clef-omni"
#define MEDIA CLEF_FIXTURES "/media"

/* `cd dir && CLEF_DEVICE=cpu clef <args>` (at most 60 s): stdout into *out, stderr into *err; the exit status. */
static int run_in(const char *dir, const char *args, clef_buf *out, clef_buf *err) {
    char path[128], cmd[4096];
    snprintf(path, sizeof path, "/tmp/clef_cli_placement_err_%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "cd %s && exec 2>%s; CLEF_DEVICE=cpu timeout 60 %s %s", dir, path, CLEF_BINARY, args);
    const int rc = tu_run_cmd(cmd, out);
    size_t n = 0;
    char *e = tu_read_file(path, &n);
    clef_buf_append(err, e ? e : "", e ? n : 0);
    if (!err->data) clef_buf_puts(err, "");
    if (!out->data) clef_buf_puts(out, "");
    free(e);
    remove(path);
    return rc;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* `clef <args>` exits 2 with exactly `want` on stderr, in under 15 s.  The exact message is what
 * shows nothing was loaded (the model paths do not exist, so a load would fail with another one);
 * the bound only catches a hang: a 2 s bound failed under the CI's parallel load (2.1 s). */
static void usage_error(const char *args, const char *want) {
    clef_buf out = {0}, err = {0};
    const double t0 = now();
    const int rc = run_in(".", args, &out, &err);
    const double dt = now() - t0;
    if (rc != 2 || strcmp(err.data, want))
        fail_msg("`clef %s`: exit %d (want 2), stderr:\n%s\n(want exactly:\n%s)", args, rc, err.data, want);
    if (dt > 15.0) fail_msg("`clef %s`: %.1f s, want a refusal before loading", args, dt);
    assert_string_equal(out.data, "");
    clef_buf_free(&out), clef_buf_free(&err);
}

static void test_gpu_memory_on_cpu(void **state) {
    (void)state;
    static const char want_cpu[] =
        "clef decide: --gpu-memory applies to a CUDA device; this run is on the cpu (--device cpu)\n";
    usage_error("decide --model " MODEL " --device cpu --gpu-memory 16GiB -", want_cpu);
    /* nothing is read first: the same for a checkpoint and a request file that do not exist */
    usage_error("decide --model /nonexistent/model --device cpu --gpu-memory 16GiB /nonexistent/req.json", want_cpu);
    /* the automatic device (CLEF_DEVICE=cpu here, as on a machine without a GPU) */
    usage_error("decide --model /nonexistent/model --gpu-memory 1G -",
                "clef decide: --gpu-memory applies to a CUDA device; this run is on the cpu (chosen automatically: "
                "no GPU, or CLEF_DEVICE=cpu)\n");
    usage_error("serve --model /nonexistent/model --device cpu --gpu-memory 16GiB --port 0",
                "clef serve: --gpu-memory applies to a CUDA device; this run is on the cpu (--device cpu)\n");
    usage_error("bench --model /nonexistent/model --device cpu --gpu-memory 16GiB",
                "clef bench: --gpu-memory applies to a CUDA device; this run is on the cpu (--device cpu)\n");
    usage_error("eval --model /nonexistent/model --device cpu --gpu-memory 16GiB --rows /nonexistent/rows.jsonl "
                "--out /nonexistent/out",
                "clef eval: --gpu-memory applies to a CUDA device; this run is on the cpu (--device cpu)\n");
    usage_error("parity --model /nonexistent/a --model /nonexistent/b --device cpu --gpu-memory 16GiB --requests "
                "/nonexistent/r.jsonl",
                "clef parity: --gpu-memory applies to a CUDA device; this run is on the cpu (--device cpu)\n");
    /* no budget (0 / off): nothing to refuse, the run goes on to its own errors */
    clef_buf out = {0}, err = {0};
    assert_int_equal(run_in(".", "decide --model /nonexistent/model --device cpu --gpu-memory off /nonexistent/r.json",
                            &out, &err),
                     1);
    assert_null(strstr(err.data, "--gpu-memory"));
    clef_buf_free(&out), clef_buf_free(&err);
}

static void test_huge_forward(void **state) {
    (void)state;
    usage_error("serve --model /nonexistent/model --device cuda --gpu-memory 16GiB --max-batch-tokens "
                "4611686018427387904",
                "clef serve: --max-batch-tokens is at most 16777216 with --gpu-memory (got 4611686018427387904)\n");
    usage_error("eval --model /nonexistent/model --device cuda --gpu-memory 16GiB --max-batch-tokens 16777217 "
                "--rows /nonexistent/rows.jsonl --out /nonexistent/out",
                "clef eval: --max-batch-tokens is at most 16777216 with --gpu-memory (got 16777217)\n");
    usage_error("decide --model /nonexistent/model --device cuda --gpu-memory 16GiB --max-length 4611686018427387904 -",
                "clef decide: --max-length is at most 16777216 with --gpu-memory (got 4611686018427387904)\n");
}

static void test_towers_flag(void **state) {
    (void)state;
    usage_error("decide --model " MODEL " --towers tpu -", "clef: --towers must be cpu or gpu (got 'tpu')\n");
    usage_error("serve --model " MODEL " --towers", "clef: --towers needs a value\n");
    usage_error("eval --model " MODEL " --towers=GPU --rows x --out y", "clef: --towers must be cpu or gpu (got 'GPU')\n");
    usage_error("bench --model " MODEL " --towers none", "clef: --towers must be cpu or gpu (got 'none')\n");
    usage_error("decide --model /nonexistent/model --device cpu --towers gpu -",
                "clef decide: --towers gpu needs a CUDA device; this run is on the cpu (--device cpu)\n");
    usage_error("serve --model /nonexistent/model --towers gpu --port 0",
                "clef serve: --towers gpu needs a CUDA device; this run is on the cpu (chosen automatically: no GPU, "
                "or CLEF_DEVICE=cpu)\n");
    /* --towers cpu on the CPU: accepted, and a media request's answer is unchanged */
    static const char req[] =
        "printf '%s' '{\"model\":\"clef-omni\",\"state\":\"What is in the picture?\",\"images\":[\"red_circle.png\"],"
        "\"questions\":{\"shape\":{\"type\":\"choice\",\"criteria\":{\"circle\":\"Round\",\"square\":\"Square\"}}}}'"
        " > /tmp/clef_cli_placement_req.json";
    assert_int_equal(system(req), 0);
    clef_buf a = {0}, b = {0}, ea = {0}, eb = {0};
    assert_int_equal(run_in(MEDIA, "decide --model " MODEL " --device cpu /tmp/clef_cli_placement_req.json", &a, &ea), 0);
    assert_int_equal(
        run_in(MEDIA, "decide --model " MODEL " --device cpu --towers cpu /tmp/clef_cli_placement_req.json", &b, &eb), 0);
    assert_non_null(strstr(a.data, "\"answers\":{\"shape\":"));
    assert_string_equal(a.data, b.data);
    clef_buf_free(&a), clef_buf_free(&b), clef_buf_free(&ea), clef_buf_free(&eb);
    assert_int_equal(run_in(MEDIA, "decide --model " MODEL " --towers cpu /tmp/clef_cli_placement_req.json", &b, &eb), 0);
    assert_non_null(strstr(b.data, "\"answers\":{\"shape\":"));
    clef_buf_free(&b), clef_buf_free(&eb);
    remove("/tmp/clef_cli_placement_req.json");
}

static void test_help(void **state) {
    (void)state;
    static const char *const cmds[] = {"decide", "serve", "bench", "eval"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        char args[64];
        snprintf(args, sizeof args, "%s --help", cmds[i]);
        clef_buf out = {0}, err = {0};
        assert_int_equal(run_in(".", args, &out, &err), 0);
        if (!strstr(out.data, "--towers cpu|gpu") || !strstr(out.data, "--gpu-memory SIZE"))
            fail_msg("`clef %s` does not name --towers cpu|gpu and --gpu-memory SIZE:\n%s", args, out.data);
        clef_buf_free(&out), clef_buf_free(&err);
    }
}

/* The engine itself checks first (clef_engine_open before the checkpoint): a missing directory is not
 * even looked at. */
static void test_engine_checks_first(void **state) {
    (void)state;
    clef_err err;
    clef_err_clear(&err);
    clef_engine_options opt = {.model_dir = "/nonexistent/model", .device = "cpu", .gpu_memory = (size_t)16 << 30};
    assert_null(clef_engine_open(&opt, &err));
    assert_int_equal(err.status, 400);
    assert_string_equal(err.param, "gpu_memory");
    assert_string_equal(err.message, "--gpu-memory applies to a CUDA device; this run is on the cpu (--device cpu)");
    opt.gpu_memory = 0;
    opt.towers = CLEF_TOWERS_GPU;
    clef_err_clear(&err);
    assert_null(clef_engine_open(&opt, &err));
    assert_string_equal(err.param, "towers");
    opt.towers = 7;
    clef_err_clear(&err);
    assert_null(clef_engine_open(&opt, &err));
    assert_string_equal(err.message, "--towers must be cpu or gpu");
    /* --towers cpu on the CPU: accepted (the towers share the CPU backend), media requests answered */
    opt = (clef_engine_options){.model_dir = MODEL, .device = "cpu", .towers = CLEF_TOWERS_CPU, .truncate_state = 1};
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e) fail_msg("open: %s", err.message);
    clef_engine_close(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_memory_on_cpu),
        cmocka_unit_test(test_huge_forward),
        cmocka_unit_test(test_towers_flag),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_engine_checks_first),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
