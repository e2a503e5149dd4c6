/* cli.h — subcommands of the `clef` program.  Each takes argc/argv with
 * argv[0] = the subcommand name and returns the process exit status
 * (0 ok, 1 runtime failure, 2 bad usage or a rejected request). */
#ifndef CLEF_CLI_CLI_H
#define CLEF_CLI_CLI_H

#include <stddef.h>

int cli_decide(int argc, char **argv);
int cli_demo(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_serve(int argc, char **argv);
int cli_quantize(int argc, char **argv);
int cli_parity(int argc, char **argv);
int cli_synth(int argc, char **argv);
int cli_devcheck(int argc, char **argv);

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
