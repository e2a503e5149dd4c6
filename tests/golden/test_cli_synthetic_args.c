/* test_cli_synthetic_args.c — bad command lines around the --synthetic
 * surfaces of `clef serve`, `clef parity` and `clef bench`: each must exit 2
 * with a message naming the flag, before any work is done:
 *   serve --synthetic huge, --quant bogus or a missing --tokenizer bound the
 *   port, logged "listening on", then exited 1 from the loader thread;
 *   parity on an empty (or blank) requests file reported "top-1 agreement
 *   0/0 questions (100.00%)" and exited 0;
 *   bench --image-mp 1abc was read as 1 megapixel. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_serve_refuses_before_listening),
        cmocka_unit_test(test_parity_refuses_empty_requests),
        cmocka_unit_test(test_bench_media_flags_are_whole_numbers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
