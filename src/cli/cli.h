/* cli.h — subcommands of the `clef` program.  Each takes argc/argv with
 * argv[0] = the subcommand name and returns the process exit status
 * (0 ok, 1 runtime failure, 2 bad usage or a rejected request). */
#ifndef CLEF_CLI_CLI_H
#define CLEF_CLI_CLI_H

#include <stddef.h>
#include <stdio.h>

int cli_decide(int argc, char **argv);
int cli_demo(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_serve(int argc, char **argv);
int cli_quantize(int argc, char **argv);
int cli_parity(int argc, char **argv);
int cli_synth(int argc, char **argv);
/* `clef --version`: "clef VERSION (commit C)" and "cuda: sm_80 ... compute_120" (or "not built") on f; 0. */
int cli_version(FILE *f);
int cli_devcheck(int argc, char **argv);
int cli_eval(int argc, char **argv);

/* `clef serve`'s (and `clef eval`'s: its worker threads parse and encode
 * beside the compute threads as connection threads do; 2,000 rows on 2 busy
 * cores: 75-94 rows/s spinning, 123-139 passive, docs/BENCHMARKS.md) OpenMP
 * wait policy, applied before anything else runs.
 * libgomp reads OMP_WAIT_POLICY / GOMP_SPINCOUNT once, when it is loaded, and
 * by default its idle compute threads spin for a while after every parallel
 * region; on a busy machine they then take the cores the connection threads
 * need (16 clients on 2 cores: 13-34 req/s and a 2 s p99 against 90-120 req/s
 * and 0.25-0.4 s, docs/BENCHMARKS.md).  When neither variable is set, this sets
 * OMP_WAIT_POLICY=passive and re-executes the program (/proc/self/exe, same
 * argv and pid) so libgomp starts with it; a set variable is left alone.
 * Returns only if nothing was changed or the re-exec failed (then it warns
 * on stderr and the server runs with libgomp's default). */
void cli_serve_wait_policy(char **argv);

/* Tokenizer used with synthetic weights when --tokenizer is not given (as
 * written in usage texts: relative to the repository root), and where
 * `cmake --install` puts a copy (relative to the install prefix). */
#define CLI_DEFAULT_TOKENIZER "tests/fixtures/tiny-clef-omni/tokenizer.json"
#define CLI_INSTALLED_TOKENIZER "share/clef/tokenizer.json"

/* The default tokenizer's path: the first readable one of
 * CLI_DEFAULT_TOKENIZER in the working directory, next to the binary
 * (<dir of clef>/../CLI_DEFAULT_TOKENIZER: build/clef in a checkout;
 * <dir of clef>/../CLI_INSTALLED_TOKENIZER: an installed clef), and in the
 * source tree the binary was built from (CLEF_SOURCE_DIR).  So
 * `clef ... --synthetic P` works from any directory, installed or not.  When
 * none exists, prints to stderr, prefixed by `cmd` (e.g. "clef bench"), the
 * places it looked and that --tokenizer PATH is needed, and returns NULL.
 * Static storage. */
const char *cli_default_tokenizer(const char *cmd);

/* Append a triage-style request body (a 2-option choice and a noul question) whose state
 * holds about tokens + 16 words, so that cutting the state to a max_length
 * of `tokens` gives a record of exactly that length; `variant` changes the
 * words (records of one batch differ).  Used by bench and synth --check. */
struct clef_buf;
void cli_bench_body(size_t tokens, size_t variant, struct clef_buf *body);

#endif
