/* file.h — opening and reading the files a checkpoint is made of, safely.
 *
 * Every loader reads its files through these two functions, so a wrong path
 * fails fast with an error naming the file instead of blocking or growing
 * memory: the file is opened with O_NONBLOCK (a FIFO does not wait for a
 * writer), its type is checked with fstat before a byte is read (a FIFO, a
 * device such as /dev/zero, a directory or a socket is refused), and a read
 * is capped (the size from fstat is checked first, and a file that grows
 * while it is read is refused at the cap).
 */
#ifndef CLEF_UTIL_FILE_H
#define CLEF_UTIL_FILE_H

#include <stddef.h>

#include "util/err.h"

/* Read caps, bytes.  JSON configs are a few KB; config.json can carry a
 * quantization_config with long ignore lists, hence 4 MiB rather than 1.
 * The Qwen3 tokenizer.json is 11.4 MB; an index of the full model ~2 MB. */
#define CLEF_FILE_MAX_CONFIG ((size_t)4 << 20)     /* config.json, joint_head_config.json, hf_quant_config.json */
#define CLEF_FILE_MAX_TOKENIZER ((size_t)64 << 20) /* tokenizer.json */
#define CLEF_FILE_MAX_INDEX ((size_t)64 << 20)     /* model.safetensors.index.json */

/* Open `path` read-only (O_RDONLY | O_NONBLOCK | O_CLOEXEC; O_NONBLOCK is
 * cleared again once the file is known to be regular) and check that it is
 * a regular file (symlinks are followed).  Returns the descriptor (caller
 * closes) and its size in *size, or -1 with err (500 internal_error):
 *   "<label>: cannot open: <strerror>"
 *   "<label>: not a regular file (a FIFO)"   (or a directory, a character
 *                                             device, a block device, a socket)
 * `label` names the file in messages (e.g. its path, or "config.json"). */
int clef_file_open_regular(const char *path, const char *label, size_t *size, clef_err *err);

/* Read the regular file `path` whole into a NUL-terminated heap buffer
 * (caller frees; the NUL is not counted in *len).  A file over `max_bytes`
 * is refused before reading ("<label>: file is N bytes, more than the limit
 * of M bytes"), as is one that grows past it while being read.  Other
 * errors as clef_file_open_regular, and "<label>: read error: <strerror>".
 * Returns NULL with err on failure. */
char *clef_file_read(const char *path, const char *label, size_t max_bytes, size_t *len, clef_err *err);

/* `dir` + "/" + `name` as a new heap string (caller frees), with trailing
 * slashes of `dir` dropped ("m/" + "config.json" = "m/config.json"; "/" stays
 * "/"). */
char *clef_path_join(const char *dir, const char *name);

/* Length of `dir` without its trailing slashes (at least 1 for "/"). */
size_t clef_path_trim_len(const char *dir);

#endif
