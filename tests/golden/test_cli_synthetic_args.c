/* test_cli_synthetic_args.c — bad command lines around the --synthetic
 * surfaces of `clef serve`, `clef parity` and `clef bench`: each must exit 2
 * with a message naming the flag, before any work is done:
 *   serve --synthetic huge, --quant bogus or a missing --tokenizer bound the
 *   port, logged "listening on", then exited 1 from the loader thread;
 *   parity on an empty (or blank) requests file reported "top-1 agreement
 *   0/0 questions (100.00%)" and exited 0;
 *   bench --image-mp 1abc was read as 1 megapixel;
 *   synth --out into a non-empty directory wrote over what was there;
 * and the CUDA numerics names devcheck / parity accept (checked before any
 * model is loaded, so without a GPU too). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "util/buf.h"

#define MODEL CLEF_FIXTURES "/tiny-clef-omni"
#define TOKENIZER MODEL "/tokenizer.json"

/* Run `clef <args>` (at most 60 s), capturing stdout+stderr; returns the exit
 * status, or -1 - signal when it was killed. */
static int run_clef(const char *args, clef_buf *out) {
    char full[4096];
    snprintf(full, sizeof full, "exec 2>&1; timeout 60 %s %s", CLEF_BINARY, args);
    return tu_run_cmd(full, out);
}

/* `clef <args>` must exit with `want`, print `needle` and not `never`. */
static void expect(const char *args, int want, const char *needle, const char *never) {
    clef_buf out = {0};
    int rc = run_clef(args, &out);
    if (rc != want || !strstr(out.data, needle) || (never && strstr(out.data, never)))
        fail_msg("`clef %s`: exit %d (want %d), output:\n%s\n(want it to contain '%s'%s%s)", args, rc, want, out.data,
                 needle, never ? " and not '" : "", never ? never : "");
    printf("  exit %d: %.*s\n", rc, (int)strcspn(out.data, "\n"), out.data);
    clef_buf_free(&out);
}

static void test_serve_refuses_before_listening(void **state) {
    (void)state;
    expect("serve --synthetic huge --tokenizer " TOKENIZER " --port 0", 2, "unknown synthetic preset 'huge'",
           "listening");
    expect("serve --synthetic tiny --quant bogus --tokenizer " TOKENIZER " --port 0", 2,
           "--quant: unknown quantized format 'bogus'", "listening");
    expect("serve --synthetic tiny --tokenizer /nonexistent/tokenizer.json --port 0", 2,
           "--tokenizer /nonexistent/tokenizer.json: No such file", "listening");
    expect("serve --model " MODEL " --tokenizer /nonexistent/tokenizer.json --port 0", 2, "--tokenizer", "listening");
    expect("serve --model " MODEL " --synthetic tiny --port 0", 2, "give --model DIR or --synthetic P", "listening");
    expect("serve --model " MODEL " --quant int4 --port 0", 2, "--quant needs --synthetic", "listening");
    expect("serve --synthetic tiny --seed -1 --port 0", 2, "--seed wants a non-negative integer", "listening");
}

static void test_parity_refuses_empty_requests(void **state) {
    (void)state;
    char path[256];
    snprintf(path, sizeof path, "/tmp/clef_cli_synth_empty_%d.jsonl", (int)getpid());
    const char *contents[] = {"", "\n \n\t\n"};
    for (size_t k = 0; k < 2; k++) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(contents[k], f);
        fclose(f);
        char args[512];
        snprintf(args, sizeof args, "parity --synthetic tiny --quant-b int4 --tokenizer %s --device cpu --requests %s",
                 TOKENIZER, path);
        expect(args, 2, "holds no requests", "agreement");
    }
    unlink(path);
}

static void test_bench_media_flags_are_whole_numbers(void **state) {
    (void)state;
    const char *bad[] = {"1abc", "0x10", "inf", "nan", "", "0", "65"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        char args[256];
        snprintf(args, sizeof args, "bench --synthetic tiny --towers-only --device cpu --image-mp '%s'", bad[k]);
        expect(args, 2, "--image-mp in (0, 64]", NULL);
    }
    expect("bench --synthetic tiny --towers-only --device cpu --audio-s 2s", 2, "--audio-s in [0.1, 3600]", NULL);
    /* a well-formed value passes the parser: tiny then has no towers to time */
    expect("bench --synthetic tiny --towers-only --device cpu --image-mp 0.5", 1, "has no media towers", NULL);
}

static void test_synth_out_not_empty(void **state) {
    (void)state;
    char dir[256], mine[300], config[300], args[1024], want[1024];
    snprintf(dir, sizeof dir, "/tmp/clef_cli_synth_out_%d", (int)getpid());
    snprintf(mine, sizeof mine, "%s/mine.txt", dir);
    snprintf(config, sizeof config, "%s/config.json", dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    FILE *f = fopen(mine, "w");
    assert_non_null(f);
    fputs("keep", f);
    fclose(f);
    /* not empty: refused with exit 2 and the exact message, nothing written */
    snprintf(args, sizeof args, "synth --preset tiny --tokenizer %s --out %s", TOKENIZER, dir);
    snprintf(want, sizeof want,
             "clef synth: --out %s is not empty; give a new or empty directory, or add --force to write into it "
             "(files of the same names are replaced)",
             dir);
    expect(args, 2, want, NULL);
    assert_int_equal(access(config, F_OK), -1);
    /* --force writes the checkpoint beside the user's file and leaves that file alone */
    snprintf(args, sizeof args, "synth --preset tiny --tokenizer %s --out %s --force", TOKENIZER, dir);
    expect(args, 0, "", NULL);
    assert_int_equal(access(config, F_OK), 0);
    size_t n = 0;
    char *kept = tu_read_file(mine, &n);
    assert_int_equal(n, 4);
    assert_memory_equal(kept, "keep", 4);
    free(kept);
    /* a file is never a directory, --force or not */
    snprintf(args, sizeof args, "synth --preset tiny --tokenizer %s --out %s --force", TOKENIZER, mine);
    snprintf(want, sizeof want, "clef synth: --out %s exists and is not a directory", mine);
    expect(args, 2, want, NULL);
    expect("synth --help", 0, "--force", NULL);
    char rm[512];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    assert_int_equal(system(rm), 0);
}

static void test_numerics_names(void **state) {
    (void)state;
    expect("devcheck --synthetic tiny --requests /nonexistent.jsonl --numerics bogus", 2,
           "--numerics must be fast, balanced or precise", NULL);
    expect("parity --synthetic tiny --quant-b int4 --requests /nonexistent.jsonl --numerics-b bogus", 2,
           "--numerics-b must be fast, balanced or precise", NULL);
    expect("devcheck --help", 0, "fast|balanced|precise", NULL);
    /* every command that runs a model takes --numerics, checks the name before any work, and documents it */
    static const char *const cmds[] = {
        "decide --model " MODEL " /nonexistent.json", "bench --model " MODEL, "serve --model " MODEL " --port 0",
        "parity --synthetic tiny --requests /nonexistent.jsonl", "devcheck --synthetic tiny --requests /x.jsonl"};
    static const char *const names[] = {"decide", "bench", "serve", "parity", "devcheck"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        char args[512], help[64];
        snprintf(args, sizeof args, "%s --numerics exact", cmds[i]);
        expect(args, 2, "clef: --numerics must be fast, balanced or precise (got 'exact')", NULL);
        snprintf(help, sizeof help, "%s --help", names[i]);
        expect(help, 0, "--numerics M", NULL);
    }
    /* the CPU computes in f32 whatever the mode; bench says which numerics ran */
    expect("bench --model " MODEL " --device cpu --numerics precise --iters 1", 0, "numerics f32", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synth_out_not_empty),
        cmocka_unit_test(test_numerics_names),
        cmocka_unit_test(test_serve_refuses_before_listening),
        cmocka_unit_test(test_parity_refuses_empty_requests),
        cmocka_unit_test(test_bench_media_flags_are_whole_numbers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
