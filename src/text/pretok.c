/* pretok.c — UTF-8 validation, added-token trie, NFC and the Split regex
 * (see pretok.h). */
#include "text/pretok.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "util/buf.h"

/* ---- UTF-8 ---- */

size_t pretok_utf8_invalid_at(const char *s, size_t n) {
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
        else return i;  /* stray continuation byte or 0xF8.. */
        if (n - i < len) return i;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += len;
    }
    return n;
}

/* ---- added-token trie ---- */

static uint32_t trie_new_node(pretok_trie *t, uint8_t byte) {
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 64;
        t->nodes = clef_xrealloc(t->nodes, t->cap * sizeof *t->nodes);
    }
    t->nodes[t->n] = (struct pretok_node){.id = -1, .child = 0, .sibling = 0, .byte = byte};
    return (uint32_t)t->n++;
}

void pretok_trie_init(pretok_trie *t) {
    memset(t, 0, sizeof *t);
    trie_new_node(t, 0);  /* root */
}

/* Child of `node` on `byte`, or 0. */
static uint32_t trie_child(const pretok_trie *t, uint32_t node, uint8_t byte) {
    for (uint32_t c = t->nodes[node].child; c; c = t->nodes[c].sibling)
        if (t->nodes[c].byte == byte) return c;
    return 0;
}

void pretok_trie_add(pretok_trie *t, const char *s, size_t len, int32_t id) {
    uint32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)s[i];
        uint32_t c = trie_child(t, node, b);
        if (!c) {
            c = trie_new_node(t, b);  /* may move t->nodes: index again below */
            t->nodes[c].sibling = t->nodes[node].child;
            t->nodes[node].child = c;
        }
        node = c;
    }
    t->nodes[node].id = id;
    t->first[(uint8_t)s[0]] = 1;
}

size_t pretok_trie_match(const pretok_trie *t, const char *s, size_t n, int32_t *id) {
    size_t best = 0;
    uint32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        node = trie_child(t, node, (uint8_t)s[i]);
        if (!node) break;
        if (t->nodes[node].id >= 0) {
            best = i + 1;
            *id = t->nodes[node].id;
        }
    }
    return best;
}

int32_t pretok_trie_exact(const pretok_trie *t, const char *s, size_t len) {
    uint32_t node = 0;
    for (size_t i = 0; i < len; i++)
        if (!(node = trie_child(t, node, (uint8_t)s[i]))) return -1;
    return len ? t->nodes[node].id : -1;
}

void pretok_trie_free(pretok_trie *t) {
    free(t->nodes);
    memset(t, 0, sizeof *t);
}

/* ---- NFC ---- */

/* Code points whose canonical combining class or decomposition utf8proc
 * knows but HF tokenizers' NFC does not: its normaliser (the
 * unicode-normalization-alignments crate) carries Unicode 9 data, so marks
 * and compositions added since (e.g. U+1ABF..U+1ACE, U+11935+U+11930 ->
 * U+11938) stay inert there: starters that never reorder or compose.
 * Found by comparing both NFCs over every code point (reordering around
 * ccc 240 and ccc 1 marks, NFD, and recomposition of each decomposition). */
static const uint32_t nfc_inert[][2] = {
    {0x7FD, 0x7FD}, {0x898, 0x89F}, {0x8CA, 0x8D3}, {0x9FE, 0x9FE}, {0xC3C, 0xC3C}, {0xD3B, 0xD3C}, {0xEBA, 0xEBA},
    {0x1715, 0x1715}, {0x1ABF, 0x1ACE}, {0x1DF6, 0x1DFA}, {0xA82C, 0xA82C}, {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC},
    {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50}, {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B},
    {0x1145E, 0x1145E}, {0x11839, 0x1183A}, {0x11930, 0x11930}, {0x11935, 0x11935}, {0x11938, 0x11938},
    {0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47},
    {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45}, {0x11D97, 0x11D97}, {0x11F41, 0x11F42},
    {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF},
    {0x1E4EC, 0x1E4EF},
};

static int nfc_is_inert(uint32_t cp) {
    size_t lo = 0, hi = sizeof nfc_inert / sizeof *nfc_inert;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < nfc_inert[mid][0]) hi = mid;
        else if (cp > nfc_inert[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

/* Decode the valid UTF-8 character at s[0..]; returns its length. */
static size_t utf8_decode(const uint8_t *s, uint32_t *cp) {
    if (s[0] < 0x80) return *cp = s[0], 1;
    if (s[0] < 0xE0) return *cp = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F), 2;
    if (s[0] < 0xF0) return *cp = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F), 3;
    *cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
          (s[3] & 0x3F);
    return 4;
}

/* Append utf8proc's NFC of s[0..n) to out. */
static int nfc_run(const char *s, size_t n, clef_buf *out, clef_err *err) {
    if (n == 0) return 0;
    utf8proc_uint8_t *dst = NULL;
    /* No UTF8PROC_NULLTERM: the length bounds the input, so U+0000 is kept. */
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "NFC normalisation failed: %s", utf8proc_errmsg(r));
    clef_buf_append(out, dst, (size_t)r);
    free(dst);
    return 0;
}

char *pretok_nfc(const char *s, size_t n, size_t *out_n, clef_err *err) {
    clef_buf out = {0};
    clef_buf_reserve(&out, n);
    size_t run = 0;  /* start of the stretch not yet normalised */
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = utf8_decode((const uint8_t *)s + i, &cp);
        if (cp >= 0x7FD && nfc_is_inert(cp)) {  /* a barrier: NFC(before) + cp + NFC(after) */
            if (nfc_run(s + run, i - run, &out, err)) {
                clef_buf_free(&out);
                return NULL;
            }
            clef_buf_append(&out, s + i, k);
            run = i + k;
        }
        i += k;
    }
    if (nfc_run(s + run, n - run, &out, err)) {
        clef_buf_free(&out);
        return NULL;
    }
    *out_n = out.len;
    return out.data;
}

/* ---- Split regex ---- */

struct pretok_regex {
    pcre2_code *code;
    int jit;       /* pcre2_jit_compile succeeded */
    int qwen2_ws;  /* the pattern is PRETOK_QWEN2_PATTERN: long whitespace runs are split without PCRE2 */
};

/* Unicode White_Space, the set Oniguruma's \s matches on UTF-8 text. */
#define WS_CLASS_BODY \
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* Letters (L) and numbers (N) assigned in Unicode 15.0-16.0.  HF tokenizers'
 * Oniguruma knows Unicode 16; Debian 12's PCRE2 10.42 stops at Unicode 14
 * and treats these as unassigned, which splits e.g. CJK Extension H/I text
 * differently.  Adding them to \p{L} / \p{N} makes the two agree on every
 * code point (checked against HF tokenizers over all of U+0000..U+10FFFF). */
#define EXTRA_L_BODY \
    "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}\\x{10D4A}-\\x{10D65}" \
    "\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}\\x{11380}-\\x{11389}\\x{1138B}" \
    "\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}\\x{113D3}\\x{11BC0}-\\x{11BE0}\\x{11F02}" \
    "\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}" \
    "\\x{16100}-\\x{1611D}\\x{16D40}-\\x{16D6C}\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}" \
    "\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}" \
    "\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"
#define EXTRA_N_BODY \
    "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}" \
    "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}" \
    "\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}"

static int regex_refuse(clef_err *err, const char *what, size_t at) {
    return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "split regex: %s at byte %zu is not supported", what, at);
}

/* Emit a class body, bracketed unless we are already inside a class. */
static void put_class(clef_buf *out, int in_class, const char *body) {
    if (!in_class) clef_buf_putc(out, '[');
    clef_buf_puts(out, body);
    if (!in_class) clef_buf_putc(out, ']');
}

/* Copy the backslash escape at pat[i] (i+1 < n), rewriting \s, \S, \p{L} and
 * \p{N} to their Oniguruma meaning.  Returns the pattern bytes consumed, or
 * -1 with err for an escape that PCRE2 reads differently. */
static long regex_escape(const char *pat, size_t n, size_t i, int in_class, clef_buf *out, clef_err *err) {
    char d = pat[i + 1];
    if (d == 's') {
        put_class(out, in_class, WS_CLASS_BODY);
    } else if (d == 'S') {
        if (in_class) return regex_refuse(err, "\\S inside a class", i);
        clef_buf_puts(out, "[^" WS_CLASS_BODY "]");
    } else if (d == 'p' && n - i >= 5 && (memcmp(pat + i, "\\p{L}", 5) == 0 || memcmp(pat + i, "\\p{N}", 5) == 0)) {
        int letter = pat[i + 3] == 'L';
        put_class(out, in_class, letter ? "\\p{L}" EXTRA_L_BODY : "\\p{N}" EXTRA_N_BODY);
        return 5;
    } else if (d == 'h' || d == 'H' || d == 'Q') {
        return regex_refuse(err, "an escape whose meaning differs in PCRE2", i);  /* Onig \h = hex digit */
    } else {
        clef_buf_append(out, pat + i, 2);
    }
    return 2;
}

/* Rewrite an Oniguruma pattern into PCRE2 syntax with the same meaning. */
static int regex_translate(const char *pat, size_t n, clef_buf *out, clef_err *err) {
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '\\') {
            if (i + 1 >= n) return regex_refuse(err, "a trailing backslash", i);
            long used = regex_escape(pat, n, i, in_class, out, err);
            if (used < 0) return -1;
            i += (size_t)used - 1;
            continue;
        }
        if (in_class) {
            if (c == '[' && !(i + 1 < n && pat[i + 1] == ':')) return regex_refuse(err, "a nested class", i);
            if (c == '&' && i + 1 < n && pat[i + 1] == '&') return regex_refuse(err, "class intersection", i);
            if (c == ']') in_class = 0;
            clef_buf_putc(out, c);
            continue;
        }
        clef_buf_putc(out, c);
        if (c != '[') continue;
        in_class = 1;  /* a ']' right after '[' or '[^' is a literal, not the end */
        if (i + 1 < n && pat[i + 1] == '^') clef_buf_putc(out, pat[++i]);
        if (i + 1 < n && pat[i + 1] == ']') clef_buf_putc(out, pat[++i]);
    }
    if (in_class) return regex_refuse(err, "an unterminated class", n);
    return 0;
}

pretok_regex *pretok_regex_compile(const char *pattern, size_t len, clef_err *err) {
    return pretok_regex_compile_opts(pattern, len, 1, err);
}

pretok_regex *pretok_regex_compile_opts(const char *pattern, size_t len, int use_jit, clef_err *err) {
    clef_buf pat = {0};
    if (regex_translate(pattern, len, &pat, err)) {
        clef_buf_free(&pat);
        return NULL;
    }
    int code_err;
    PCRE2_SIZE off;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)(pat.data ? pat.data : ""), pat.len, PCRE2_UTF | PCRE2_UCP,
                                     &code_err, &off, NULL);
    clef_buf_free(&pat);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code_err, msg, sizeof msg);
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "split regex does not compile: %s (translated offset %zu)",
                  (const char *)msg, (size_t)off);
        return NULL;
    }
    pretok_regex *re = clef_xcalloc(1, sizeof *re);
    re->code = code;
    re->jit = use_jit && pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;  /* else: interpreter */
    re->qwen2_ws = len == sizeof PRETOK_QWEN2_PATTERN - 1 && memcmp(pattern, PRETOK_QWEN2_PATTERN, len) == 0;
    return re;
}

void pretok_regex_free(pretok_regex *re) {
    if (!re) return;
    pcre2_code_free(re->code);
    free(re);
}

/* One match from `off`: 1 found (ovector set), 0 none, -1 error. */
static int regex_next(const pretok_regex *re, const char *text, size_t n, size_t off, pcre2_match_data *md,
                      clef_err *err) {
    /* The caller validated UTF-8 once; re-checking per call would be O(n^2). */
    uint32_t opts = PCRE2_NO_UTF_CHECK | (re->jit ? 0 : PCRE2_NO_JIT);
    int rc = pcre2_match(re->code, (PCRE2_SPTR)text, n, off, opts, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  /* the interpreter keeps its frames on the heap */
        rc = pcre2_match(re->code, (PCRE2_SPTR)text, n, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "split regex failed at byte %zu: %s", off, (const char *)msg);
        return -1;
    }
    return 1;
}

static size_t utf8_char_len(uint8_t c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/* Byte length of the White_Space character (the regex's \s, WS_CLASS_BODY)
 * at s[0..n), or 0 when s[0] starts no such character.  Text is valid UTF-8. */
static size_t ws_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || c == 0x20;
    if (c == 0xC2) return n >= 2 && (s[1] == 0x85 || s[1] == 0xA0) ? 2 : 0;
    if (n < 3) return 0;
    if (c == 0xE1) return s[1] == 0x9A && s[2] == 0x80 ? 3 : 0;                     /* U+1680 */
    if (c == 0xE2 && s[1] == 0x80)                                                  /* U+2000-200A, 2028, 2029, 202F */
        return s[2] <= 0x8A || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF ? 3 : 0;
    if (c == 0xE2) return s[1] == 0x81 && s[2] == 0x9F ? 3 : 0;                     /* U+205F */
    if (c == 0xE3) return s[1] == 0x80 && s[2] == 0x80 ? 3 : 0;                     /* U+3000 */
    return 0;
}

/* The next piece of the Qwen2 regex at `off` when a run of whitespace of at
 * least `ws_min` bytes starts there, computed without PCRE2 (whose
 * `\s*[\r\n]+` backtracks over the whole run and hits its match limit near
 * 10 MiB).  Returns the piece's end, or 0 when PCRE2 should take this
 * position (no such run, or a single whitespace character, which may belong
 * to the next word).
 *
 * Derivation, for a maximal whitespace run [off, e) followed by a non-space
 * character at e or by the end of the text (the previous piece ended at off,
 * and every position starts a match of some alternative):
 *  - with two or more characters, alternatives 1-4 fail at off (each needs a
 *    letter, digit, apostrophe or other character at off or off+1);
 *  - `\s*[\r\n]+` then matches up to just after the run's last CR or LF,
 *    if it has one (\s* backs off to that character);
 *  - otherwise `\s+(?!\S)` matches the whole run at the end of the text, or
 *    all of it but its last character before a non-space (the lookahead
 *    fails at e and holds one character earlier); that last character is
 *    then left to PCRE2, with what follows it (" word", " !!", or alone). */
static size_t ws_run_piece(const char *text, size_t n, size_t off, size_t ws_min) {
    const uint8_t *s = (const uint8_t *)text;
    size_t e = off, last_nl = SIZE_MAX, last_start = off, chars = 0, k;
    while (e < n && (k = ws_len(s + e, n - e)) > 0) {
        if (s[e] == '\n' || s[e] == '\r') last_nl = e;
        last_start = e;
        e += k;
        chars++;
    }
    if (e - off < ws_min || chars == 0) return 0;
    if (last_nl != SIZE_MAX) return last_nl + 1;
    if (chars < 2) return 0;
    return e == n ? n : last_start;
}

/* The split loop; `ws_min` > 0 enables ws_run_piece for runs of at least
 * that many bytes (only valid for the Qwen2 pattern). */
static int split_run(const pretok_regex *re, const char *text, size_t n, size_t ws_min, pretok_piece_fn fn, void *ctx,
                     clef_err *err) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re->code, NULL);
    if (!md) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "out of memory for regex match data");
    size_t prev = 0, off = 0;  /* prev: end of the last piece; off: where to search next */
    int rc = 0;
    while (off < n) {
        size_t ws_end = ws_min && prev == off ? ws_run_piece(text, n, off, ws_min) : 0;
        if (ws_end) {
            if (fn(ctx, text, off, ws_end)) {
                rc = 1;
                break;
            }
            prev = off = ws_end;
            continue;
        }
        if ((rc = regex_next(re, text, n, off, md, err)) != 1) break;
        rc = 0;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {  /* an empty match is no piece; step over one character */
            off = ms + (ms < n ? utf8_char_len((uint8_t)text[ms]) : 1);
            continue;
        }
        if (ms > prev && fn(ctx, text, prev, ms)) {
            rc = 1;
            break;
        }
        if (fn(ctx, text, ms, me)) {
            rc = 1;
            break;
        }
        prev = off = me;
    }
    pcre2_match_data_free(md);
    if (rc < 0) return -1;
    if (rc == 1) return 1;
    if (prev < n && fn(ctx, text, prev, n)) return 1;
    return 0;
}

int pretok_split(const pretok_regex *re, const char *text, size_t n, pretok_piece_fn fn, void *ctx, clef_err *err) {
    return split_run(re, text, n, re->qwen2_ws ? PRETOK_WS_RUN_MIN : 0, fn, ctx, err);
}

int pretok_split_ws(const pretok_regex *re, const char *text, size_t n, size_t ws_min, pretok_piece_fn fn, void *ctx,
                    clef_err *err) {
    return split_run(re, text, n, re->qwen2_ws ? ws_min : 0, fn, ctx, err);
}

int pretok_regex_is_qwen2(const pretok_regex *re) { return re->qwen2_ws; }
