/* tokenizer.h — the Qwen3 byte-level BPE tokenizer from an HF tokenizer.json.
 *
 * Reproduces HF `tokenizers` encode(text, add_special_tokens=False) for the
 * Qwen3-Omni tokenizer.json (SPEC.md §5): added tokens matched first on the
 * raw text (longest match), NFC (utf8proc) on the remaining segments, the
 * Split pre-tokenizer regex (PCRE2, UTF+UCP), byte-level mapping, BPE by merge
 * rank, no post-processor.
 *
 * Unicode versions are aligned with HF tokenizers, not with the Debian
 * libraries: the regex's \p{L}/\p{N} include Unicode 16 letters and numbers
 * (Oniguruma's tables), and NFC leaves alone the handful of marks newer than
 * HF's Unicode 9 normalisation tables.  Checked id-for-id against HF
 * tokenizers on every code point in context and on random mixed text.
 *
 * Internals: text/pretok.h (UTF-8, added-token trie, NFC, split regex) and
 * text/bpe.h (vocab/merge hash tables, heap-based merge loop).
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
 * (merges as "a b" strings or ["a","b"] pairs are both accepted).  Options
 * that would change ids and are not implemented (BPE dropout, byte_fallback,
 * ignore_merges, subword prefixes, normalisers other than NFC, added tokens
 * with lstrip/rstrip/single_word/normalized) are refused, not ignored.
 * About 0.3 s for the 11.4 MB Qwen3 file at -O2.  Free with
 * clef_tokenizer_free. */
clef_tokenizer *clef_tokenizer_load(const char *path, clef_err *err);

void clef_tokenizer_free(clef_tokenizer *t);

/* Tokenize `len` bytes of UTF-8 `text` (NUL bytes allowed) and APPEND the
 * ids to `out`.  An empty text appends nothing.  Returns 0, or -1 with err
 * (400, "invalid_request") if `text` is not valid UTF-8 (strict: no
 * overlongs, surrogates or code points above U+10FFFF) or longer than
 * INT32_MAX bytes; (500) on an internal regex/normaliser failure.  On error
 * `out` is left as it was.  Linear-ish in `len`: a 100 KB run of one
 * character takes tens of milliseconds; a run of whitespace of any length
 * is split without PCRE2's backtracking limit (text/pretok.h), so 16 MiB of
 * spaces tokenize too. */
int clef_tokenize(const clef_tokenizer *t, const char *text, size_t len, clef_ids *out, clef_err *err);

/* clef_tokenize that stops as soon as the text is certain to give more than
 * `max_ids` ids (SIZE_MAX: never), so an over-long text costs about the
 * tokenizing of its first max_ids ids, not of all of it.  Pieces are
 * tokenized in order from one split of the whole text, so the ids appended
 * before a stop are exactly the first ids of the whole encoding.
 *   keep_prefix = 1: stop only after a piece (or added token) whose ids take
 *     the count past max_ids; `out` then holds those first *n_ids ids
 *     (*n_ids > max_ids).  For a cut to the first max_ids ids.
 *   keep_prefix = 0: may also stop before a piece or a stretch between added
 *     tokens of 4096 bytes or more when its bytes alone prove the count (every
 *     id covers at most the longest vocab token's bytes, 128 for Qwen3);
 *     nothing is appended then, and *n_ids is a lower bound of the count
 *     (> max_ids).  For a refusal.
 * A stop right after the text's last piece counts as complete (rc 0, exact
 * count).
 * Returns 0 when the whole text was tokenized (*n_ids = ids appended, which
 * may exceed max_ids when the last piece took it past), 1 when it stopped
 * early, or -1 with err as clef_tokenize (`out` as it was).  `n_ids` may be
 * NULL. */
int clef_tokenize_bounded(const clef_tokenizer *t, const char *text, size_t len, size_t max_ids, int keep_prefix,
                          clef_ids *out, size_t *n_ids, clef_err *err);

/* clef_tokenize with the long-input paths' thresholds chosen, for tests
 * that check they change nothing: whitespace runs of at least `ws_min` bytes
 * split without PCRE2 (0: never; text/pretok.h), pieces of at least
 * `bpe_long_min` bytes merged through rank buckets (SIZE_MAX: never;
 * text/bpe.h).  clef_tokenize uses PRETOK_WS_RUN_MIN and BPE_LONG_PIECE. */
int clef_tokenize_tuned(const clef_tokenizer *t, const char *text, size_t len, size_t ws_min, size_t bpe_long_min,
                        clef_ids *out, clef_err *err);

/* Bytes of the longest vocabulary token (128 for Qwen3): the bound behind
 * clef_tokenize_bounded's early stop. */
size_t clef_tokenizer_max_token_bytes(const clef_tokenizer *t);

/* Number of ids the tokenizer can produce: largest vocab or added-token id
 * + 1 (151676 for Qwen3-Omni; the embedding has 152064 rows). */
size_t clef_tokenizer_size(const clef_tokenizer *t);

/* Id of an exact token string, or -1: an added token's content (e.g.
 * "<|im_end|>" -> 151645) or a vocab entry in its byte-level spelling (e.g.
 * "\xc4\x8a" = "Ċ" -> 198 for "\n").  Added tokens are looked up first. */
int32_t clef_token_id(const clef_tokenizer *t, const char *token);

#endif
