/* args.h — tiny flag helpers shared by the subcommands. */
#ifndef CLEF_CLI_ARGS_H
#define CLEF_CLI_ARGS_H

#include <stddef.h>

#include "backend/numerics.h"

/* If argv[*i] is `name`, consume its value (argv[*i+1]) into *out and return 1;
 * a missing value prints an error and returns -1; otherwise returns 0.
 * Also accepts `name=value`. */
int arg_str(int argc, char **argv, int *i, const char *name, const char **out);
/* Same for a non-negative integer (rejects junk, signs and overflow). */
int arg_size(int argc, char **argv, int *i, const char *name, size_t *out);

/* Same for a byte size (`--state-cache`: 512M, 4G, 0 or off; engine/state_cache.h
 * clef_parse_size); a malformed one prints "clef: <the parser's message>" and returns -1. */
int arg_bytes(int argc, char **argv, int *i, const char *name, size_t *out);

/* Same for a numeric mode (backend/numerics.h): `name` (e.g. "--numerics")
 * takes fast, balanced or precise; any other value prints
 * "clef: <name> must be fast, balanced or precise (got '<v>')" and returns -1. */
int arg_numerics(int argc, char **argv, int *i, const char *name, clef_numerics *out);

/* Same for `--towers cpu|gpu` (engine/engine.h CLEF_TOWERS_CPU / _GPU); any
 * other value prints "clef: --towers must be cpu or gpu (got '<v>')" and
 * returns -1. */
int arg_towers(int argc, char **argv, int *i, int *out);

/* The placement flags of a command that opens an engine, checked before
 * anything is loaded: `tokens` (the forward the plan is for, given by flag
 * `tokens_flag`) at most CLEF_PLACE_MAX_TOKENS under a budget, then
 * clef_engine_check_placement (--gpu-memory or --towers gpu on a CPU device).
 * 0, or 2 with "<cmd>: <why>" printed (a usage error). */
int cli_check_placement(const char *cmd, const char *device, size_t gpu_memory, int towers, size_t tokens,
                        const char *tokens_flag);

/* Read a whole file (or stdin for "-") into a heap buffer; returns NULL and
 * prints an error on failure. */
char *read_all(const char *path, size_t *len);
/* Same, refusing (NULL, error printed) an input of more than `max_bytes`:
 * a regular file by its size before reading, a stream (stdin, a pipe,
 * /dev/zero) as soon as it passes the limit, so an endless input ends with
 * an error instead of exhausting memory. */
char *read_all_max(const char *path, size_t max_bytes, size_t *len);

/* An output directory flag (`--out DIR` of `cmd`, e.g. "clef quantize")
 * must name a missing or empty directory, unless `force` (then any
 * directory): a mistyped path never mixes new files into old ones.  Returns
 * 0, or 2 with the reason printed to stderr prefixed by `cmd`: not a
 * directory (even with force), not empty, or not listable. */
int cli_check_out_dir(const char *cmd, const char *dir, int force);

#endif
