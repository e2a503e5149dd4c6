/* tokenizer.h — the Qwen3 byte-level BPE tokenizer from an HF tokenizer.json.
 *
 * Reproduces HF `tokenizers` encode(text, add_special_tokens=False) for the
 * Qwen3-Omni tokenizer.json (SPEC.md §5): added tokens matched first on the
 * raw text (longest match), NFC (utf8proc) on the remaining segments, the
 * Split pre-tokenizer regex (PCRE2, UTF+UCP), byte-level mapping, BPE by merge
 * rank, no post-processor.
 *
 * Thread safety: a loaded tokenizer is immutable; clef_tokenize may be called
 * from many threads at once.
 */
#ifndef CLEF_TEXT_TOKENIZER_H
#define CLEF_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"
#include "util/err.h"

typedef struct clef_tokenizer clef_tokenizer;

/* Load `path` (tokenizer.json).  Returns NULL with err (status 500,
 * "internal_error", message naming the file and the problem) when the file is
 * missing, not JSON, or not a BPE/ByteLevel tokenizer of the expected shape
 * (merges as "a b" strings or ["a","b"] pairs are both accepted). */
clef_tokenizer *clef_tokenizer_load(const char *path, clef_err *err);

void clef_tokenizer_free(clef_tokenizer *t);

/* Tokenize `len` bytes of UTF-8 `text` and APPEND the ids to `out`.
 * An empty text appends nothing.  Returns 0, or -1 with err (400,
 * "invalid_request") if `text` is not valid UTF-8. */
int clef_tokenize(const clef_tokenizer *t, const char *text, size_t len, clef_ids *out, clef_err *err);

/* Number of ids the tokenizer can produce (vocab + added tokens, e.g. 151676). */
size_t clef_tokenizer_size(const clef_tokenizer *t);

/* Id of an exact token string (vocab entry or added token), or -1. */
int32_t clef_token_id(const clef_tokenizer *t, const char *token);

#endif
