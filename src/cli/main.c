/* clef — command-line entry point; one file per subcommand in src/cli/. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: clef <command> [options]\n"
            "\n"
            "commands:\n"
            "  decide   --model DIR [--max-length N] [--debug] FILE|-   answer one SystemOne request\n"
            "  demo     [--model DIR]                                    answer the built-in triage request\n"
            "  inspect  --model DIR [--plan [--gpu-memory SIZE]]         describe a checkpoint; --plan: what fits a GPU\n"
            "  bench    --model DIR|--synthetic P [--tokens N] [--batch N] time forwards (p50/p95, tokens/s)\n"
            "  serve    --model DIR [--host H] [--port N] ...            SystemOne HTTP server (docs/API.md)\n"
            "  quantize --model DIR --format F --out DIR [--layout L]    write a quantized checkpoint\n"
            "  parity   --model A --model B --requests FILE.jsonl        compare two models' answers\n"
            "  synth    --preset tiny|small|full --out DIR [--seed N]    write a random-weight checkpoint\n"
            "  devcheck --synthetic P --requests FILE [--device cuda]    a device vs the CPU: parity, batch invariance\n"
            "  eval     --model DIR --rows ROWS.jsonl[.gz] --out DIR     answer Decision Index rows, write its results\n"
            "\n"
            "`clef <command> --help` describes a command's flags; `clef --version` prints the version,\n"
            "the commit and the GPU architectures the binary holds.\n");
}

static int dispatch(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) return cli_version(stdout);
    if (!strcmp(cmd, "decide")) return cli_decide(argc - 1, argv + 1);
    if (!strcmp(cmd, "demo")) return cli_demo(argc - 1, argv + 1);
    if (!strcmp(cmd, "inspect")) return cli_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cli_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return cli_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) return cli_quantize(argc - 1, argv + 1);
    if (!strcmp(cmd, "parity")) return cli_parity(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth")) return cli_synth(argc - 1, argv + 1);
    if (!strcmp(cmd, "devcheck")) return cli_devcheck(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return cli_eval(argc - 1, argv + 1);
    fprintf(stderr, "clef: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}

int main(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "serve") || !strcmp(argv[1], "eval"))) cli_serve_wait_policy(argv);
    int rc = dispatch(argc, argv);
    /* A response that could not be written (disk full, closed pipe) must not
     * exit 0 as if it had been delivered. */
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "clef: cannot write the output: %s\n", errno ? strerror(errno) : "write error");
        return rc ? rc : 1;
    }
    return rc;
}
