/* pretok.h — internal to src/text: everything before BPE (SPEC.md §5 steps
 * 1–3): UTF-8 validation, the added-token matcher on raw text, NFC, and the
 * Split pre-tokenizer regex.
 *
 * Everything here is read-only after construction; per-call state (PCRE2
 * match data) is created per call, so concurrent use is safe.
 */
#ifndef CLEF_TEXT_PRETOK_H
#define CLEF_TEXT_PRETOK_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

/* Byte offset of the first invalid UTF-8 sequence in `s[0..n)` (strict
 * RFC 3629, as Python's decoder: no overlongs, surrogates or code points
 * above U+10FFFF), or `n` when the whole text is valid. */
size_t pretok_utf8_invalid_at(const char *s, size_t n);

/* ---- added tokens: a byte trie, longest match (HF AddedVocabulary with
 * all tokens normalized:false, aho-corasick LeftmostLongest) ---- */
typedef struct pretok_trie {
    struct pretok_node {
        int32_t id;          /* added-token id ending here, or -1 */
        uint32_t child;      /* first child node index, 0 = none (root is 0) */
        uint32_t sibling;    /* next sibling, 0 = none */
        uint8_t byte;
    } *nodes;
    size_t n, cap;
    uint8_t first[256];      /* 1 if some token starts with this byte */
} pretok_trie;

void pretok_trie_init(pretok_trie *t);
/* Add `s[0..len)` (len >= 1) with `id`; a repeated content keeps the later id. */
void pretok_trie_add(pretok_trie *t, const char *s, size_t len, int32_t id);
/* Longest token that starts at s[0] within s[0..n): returns its byte length
 * and sets *id, or returns 0 when none matches. */
size_t pretok_trie_match(const pretok_trie *t, const char *s, size_t n, int32_t *id);
/* Exact lookup of a whole string: id or -1. */
int32_t pretok_trie_exact(const pretok_trie *t, const char *s, size_t len);
void pretok_trie_free(pretok_trie *t);

/* ---- NFC ---- */

/* NFC of valid UTF-8 `s[0..n)` as HF tokenizers computes it: utf8proc
 * (STABLE|COMPOSE; NUL bytes are kept), except that the few marks and
 * compositions newer than HF's Unicode 9 tables are left inert (the text is
 * normalised piecewise around them).  Returns a malloc'd buffer (caller frees) and its length in *out_n,
 * or NULL with err (500) if utf8proc fails.  Pure ASCII is already NFC and is
 * not passed here by the caller (fast path). */
char *pretok_nfc(const char *s, size_t n, size_t *out_n, clef_err *err);

/* ---- Split pre-tokenizer ---- */
typedef struct pretok_regex pretok_regex;

/* Compile an HF Split regex (Oniguruma syntax) with PCRE2 UTF|UCP.
 * `\s` / `\S` are spelled out as Unicode White_Space, which is what
 * Oniguruma means by them (so the set does not depend on PCRE2's own UCP
 * definition), and `\p{L}` / `\p{N}` gain the letters and numbers of
 * Unicode 15-16 that PCRE2 10.42 does not know.  Constructs PCRE2 cannot
 * express the same way (`\S` inside a class, nested classes, `&&`) are
 * refused.  JIT-compiled when available.  NULL with err (500) on failure. */
pretok_regex *pretok_regex_compile(const char *pattern, size_t len, clef_err *err);
/* As pretok_regex_compile; use_jit = 0 forces the PCRE2 interpreter (the
 * unit test checks that both give the same pieces). */
pretok_regex *pretok_regex_compile_opts(const char *pattern, size_t len, int use_jit, clef_err *err);
void pretok_regex_free(pretok_regex *re);

/* The Split regex of the Qwen2 / Qwen3 tokenizers (SPEC §5 step 3), as
 * tokenizer.json spells it. */
#define PRETOK_QWEN2_PATTERN                                                                                           \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"     \
    "\\s+(?!\\S)|\\s+"

/* Whitespace runs of at least this many bytes are split without PCRE2
 * (pretok_split, Qwen2 pattern only). */
#define PRETOK_WS_RUN_MIN 64

/* Called once per piece [start, end) of `text`, in order.  Return 0 to go
 * on, nonzero to stop the split there. */
typedef int (*pretok_piece_fn)(void *ctx, const char *text, size_t start, size_t end);

/* Split valid UTF-8 `text[0..n)` with behaviour Isolated: every non-empty
 * match is a piece, and so is each non-empty stretch between matches.
 * Pieces come in order, from one scan of the whole text, so the pieces
 * passed before a stop are exactly the first pieces of the whole split.
 * With the Qwen2 pattern (PRETOK_QWEN2_PATTERN), a whitespace run of
 * PRETOK_WS_RUN_MIN bytes or more is split by the rule PCRE2 would apply
 * (see ws_run_piece in pretok.c), because PCRE2 backtracks over the whole
 * run and fails with "match limit exceeded" near 10 MiB of spaces; the
 * pieces are the same (test_tokenizer_long checks it on random text).  The
 * work per piece is then bounded by the piece's length.
 * Returns 0 when the whole text was split, 1 when `fn` stopped it, or -1
 * with err (500) if PCRE2 reports an error (e.g. a match limit, possible
 * only with other patterns) — the text is then not (fully) split. */
int pretok_split(const pretok_regex *re, const char *text, size_t n, pretok_piece_fn fn, void *ctx, clef_err *err);

/* pretok_split with the whitespace-run threshold `ws_min` in bytes (0 = every
 * run through PCRE2); for tests, which compare both ways.  Patterns other than
 * the Qwen2 one always go through PCRE2. */
int pretok_split_ws(const pretok_regex *re, const char *text, size_t n, size_t ws_min, pretok_piece_fn fn, void *ctx,
                    clef_err *err);

/* Whether `re` was compiled from PRETOK_QWEN2_PATTERN. */
int pretok_regex_is_qwen2(const pretok_regex *re);

#endif
