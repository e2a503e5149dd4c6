/* tokenizer.c — load tokenizer.json and run the §5 pipeline (see tokenizer.h).
 *
 * Loading checks that the file has the shape SPEC.md §5 describes (BPE model,
 * NFC or no normaliser, Split(Isolated)+ByteLevel pre-tokenizer, plain added
 * tokens) and refuses anything else, because an option we ignored would
 * silently change the ids.
 */
#include "text/tokenizer.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json/json.h"
#include "text/bpe.h"
#include "text/pretok.h"
#include "util/file.h"

struct clef_tokenizer {
    bpe_strmap vocab;       /* byte-level token string -> id */
    bpe_pairmap merges;     /* (left id, right id) -> rank, merged id */
    int32_t byte_id[256];   /* vocab id of each byte's byte-level symbol */
    pretok_trie added;      /* added tokens, matched on raw text */
    pretok_regex *split;    /* Split pre-tokenizer */
    int nfc;                /* normaliser is NFC (else none) */
    size_t size;            /* largest id + 1 */
    size_t max_token_bytes; /* bytes of the longest vocab token (128 for Qwen3): a piece of n bytes gives at
                               least ceil(n / max_token_bytes) ids */
};

/* ---- load helpers ---- */

/* 500 error naming the file. */
__attribute__((format(printf, 3, 4))) static int load_fail(clef_err *err, const char *path, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "tokenizer %s: %s", path, msg);
}

/* tokenizer.json through clef_file_read: a FIFO or device is refused before
 * it is read, and so is a file over CLEF_FILE_MAX_TOKENIZER (the Qwen3 file
 * is 11.4 MB), so a wrong path cannot hang or fill memory. */
static char *read_whole_file(const char *path, size_t *len, clef_err *err) {
    char label[CLEF_ERR_MESSAGE_MAX / 2];
    snprintf(label, sizeof label, "tokenizer %s", path);
    return clef_file_read(path, label, CLEF_FILE_MAX_TOKENIZER, len, err);
}

static int is_type(const json_value *v, const char *type) {
    const json_value *t = json_get(v, "type");
    return t && t->type == JSON_STRING && strcmp(t->str, type) == 0;
}

/* A member that must be absent, null, false or "" (an option we do not implement). */
static int is_off(const json_value *obj, const char *key) {
    const json_value *v = json_get(obj, key);
    return !v || v->type == JSON_NULL || v->type == JSON_FALSE || (v->type == JSON_STRING && v->len == 0);
}

static void note_id(clef_tokenizer *t, int64_t id) {
    if ((size_t)id + 1 > t->size) t->size = (size_t)id + 1;
}

/* Ids above this are not a real vocabulary (and keep `size` small). */
#define MAX_TOKEN_ID ((int64_t)1 << 24)

static int load_vocab(clef_tokenizer *t, const json_value *model, const char *path, clef_err *err) {
    const json_value *vocab = json_get(model, "vocab");
    if (!vocab || vocab->type != JSON_OBJECT || vocab->n == 0)
        return load_fail(err, path, "model.vocab is missing or not a non-empty object");
    for (size_t i = 0; i < vocab->n; i++) {
        int64_t id;
        if (json_as_i64(vocab->items[i], &id) || id < 0 || id >= MAX_TOKEN_ID)
            return load_fail(err, path, "model.vocab[\"%s\"] is not an id in [0, %lld)", vocab->keys[i],
                             (long long)MAX_TOKEN_ID);
        bpe_strmap_put(&t->vocab, vocab->keys[i], vocab->key_lens[i], (int32_t)id);
        note_id(t, id);
        size_t chars = 0; /* byte-level spelling: one character per byte of the token */
        for (size_t k = 0; k < vocab->key_lens[i]; k++) chars += ((uint8_t)vocab->keys[i][k] & 0xC0) != 0x80;
        if (chars > t->max_token_bytes) t->max_token_bytes = chars;
    }
    return 0;
}

/* The two symbols of merge `m`: "a b" (split at its only space) or ["a","b"]. */
static int merge_parts(const json_value *m, const char **a, size_t *al, const char **b, size_t *bl) {
    if (m->type == JSON_ARRAY) {
        if (m->n != 2 || m->items[0]->type != JSON_STRING || m->items[1]->type != JSON_STRING) return -1;
        *a = m->items[0]->str, *al = m->items[0]->len;
        *b = m->items[1]->str, *bl = m->items[1]->len;
        return 0;
    }
    if (m->type != JSON_STRING) return -1;
    const char *sp = memchr(m->str, ' ', m->len);
    if (!sp || memchr(sp + 1, ' ', m->len - (size_t)(sp - m->str) - 1)) return -1;  /* exactly one space */
    *a = m->str, *al = (size_t)(sp - m->str);
    *b = sp + 1, *bl = m->len - *al - 1;
    return 0;
}

static int load_merges(clef_tokenizer *t, const json_value *model, const char *path, clef_err *err) {
    const json_value *merges = json_get(model, "merges");
    if (!merges || merges->type != JSON_ARRAY) return load_fail(err, path, "model.merges is missing or not an array");
    clef_buf cat = {0};
    int rc = 0;
    for (size_t i = 0; i < merges->n && rc == 0; i++) {
        const char *a, *b;
        size_t al, bl;
        if (merge_parts(merges->items[i], &a, &al, &b, &bl)) {
            rc = load_fail(err, path, "model.merges[%zu] is neither \"a b\" nor [\"a\",\"b\"]", i);
            break;
        }
        cat.len = 0;
        clef_buf_append(&cat, a, al);
        clef_buf_append(&cat, b, bl);
        int32_t ia = bpe_strmap_get(&t->vocab, a, al), ib = bpe_strmap_get(&t->vocab, b, bl);
        int32_t in = bpe_strmap_get(&t->vocab, cat.data, cat.len);
        if (ia < 0 || ib < 0 || in < 0)
            rc = load_fail(err, path, "model.merges[%zu] (\"%.*s\" + \"%.*s\") uses a token missing from vocab", i,
                           (int)al, a, (int)bl, b);
        else
            bpe_pairmap_put(&t->merges, ia, ib, (bpe_merge){.rank = (int32_t)i, .new_id = in});
    }
    clef_buf_free(&cat);
    return rc;
}

static int load_model(clef_tokenizer *t, const json_value *root, const char *path, clef_err *err) {
    const json_value *model = json_get(root, "model");
    if (!model || model->type != JSON_OBJECT) return load_fail(err, path, "no \"model\" object");
    if (json_get(model, "type") && !is_type(model, "BPE")) return load_fail(err, path, "model.type is not \"BPE\"");
    static const char *const unsupported[] = {"dropout", "byte_fallback", "ignore_merges",
                                              "continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++)
        if (!is_off(model, unsupported[i])) return load_fail(err, path, "model.%s is not supported", unsupported[i]);
    if (load_vocab(t, model, path, err) || load_merges(t, model, path, err)) return -1;
    return 0;
}

/* Code point of byte b under GPT-2's byte-level mapping (SPEC §5 step 4). */
static uint32_t byte_level_cp(int b) {
    int kept = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (kept) return (uint32_t)b;
    uint32_t k = 0;  /* rank of b among the 68 remapped bytes */
    for (int x = 0; x < b; x++) k += !((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE));
    return 0x100 + k;
}

static int load_byte_ids(clef_tokenizer *t, const char *path, clef_err *err) {
    for (int b = 0; b < 256; b++) {
        uint32_t cp = byte_level_cp(b);
        char u[2];
        size_t n = 1;
        if (cp < 0x80) u[0] = (char)cp;
        else u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F)), n = 2;  /* cp < 0x800 */
        if ((t->byte_id[b] = bpe_strmap_get(&t->vocab, u, n)) < 0)
            return load_fail(err, path, "model.vocab lacks the byte-level symbol U+%04X of byte 0x%02X", cp, b);
    }
    return 0;
}

static int load_added(clef_tokenizer *t, const json_value *root, const char *path, clef_err *err) {
    pretok_trie_init(&t->added);
    const json_value *added = json_get(root, "added_tokens");
    if (!added || added->type == JSON_NULL) return 0;
    if (added->type != JSON_ARRAY) return load_fail(err, path, "added_tokens is not an array");
    static const char *const unsupported[] = {"single_word", "lstrip", "rstrip", "normalized"};
    for (size_t i = 0; i < added->n; i++) {
        const json_value *a = added->items[i], *content = json_get(a, "content"), *jid = json_get(a, "id");
        int64_t id;
        if (!content || content->type != JSON_STRING || content->len == 0 || !jid || json_as_i64(jid, &id) ||
            id < 0 || id >= MAX_TOKEN_ID)
            return load_fail(err, path, "added_tokens[%zu] needs a non-empty content and an id", i);
        for (size_t k = 0; k < sizeof unsupported / sizeof *unsupported; k++)
            if (!is_off(a, unsupported[k]))
                return load_fail(err, path, "added_tokens[%zu] (%s): %s=true is not supported", i, content->str,
                                 unsupported[k]);
        pretok_trie_add(&t->added, content->str, content->len, (int32_t)id);
        note_id(t, id);
    }
    return 0;
}

static int load_normalizer(clef_tokenizer *t, const json_value *root, const char *path, clef_err *err) {
    const json_value *n = json_get(root, "normalizer");
    if (!n || n->type == JSON_NULL) return 0;
    const json_value *seq = json_get(n, "normalizers");
    if (is_type(n, "Sequence") && seq && seq->type == JSON_ARRAY && seq->n == 1) n = seq->items[0];
    if (!is_type(n, "NFC")) return load_fail(err, path, "only an NFC normalizer (or none) is supported");
    t->nfc = 1;
    return 0;
}

static int load_split(clef_tokenizer *t, const json_value *split, const char *path, clef_err *err) {
    const json_value *pattern = json_get(split, "pattern"), *beh = json_get(split, "behavior");
    const json_value *pat = pattern ? json_get(pattern, "Regex") : NULL;
    if (!pat || pat->type != JSON_STRING) return load_fail(err, path, "Split needs a {\"Regex\": ...} pattern");
    if (!beh || beh->type != JSON_STRING || strcmp(beh->str, "Isolated") != 0 || !is_off(split, "invert"))
        return load_fail(err, path, "only Split behavior \"Isolated\" without invert is supported");
    clef_err e;
    clef_err_clear(&e);
    if (!(t->split = pretok_regex_compile(pat->str, pat->len, &e))) return load_fail(err, path, "%s", e.message);
    return 0;
}

static int load_pretokenizer(clef_tokenizer *t, const json_value *root, const char *path, clef_err *err) {
    const json_value *p = json_get(root, "pre_tokenizer"), *seq = p ? json_get(p, "pretokenizers") : NULL;
    const char *want = "pre_tokenizer must be Sequence[Split(Isolated), ByteLevel(add_prefix_space=false, "
                       "use_regex=false)]";
    if (!is_type(p, "Sequence") || !seq || seq->type != JSON_ARRAY || seq->n != 2) return load_fail(err, path, "%s", want);
    const json_value *bl = seq->items[1];
    if (!is_type(seq->items[0], "Split") || !is_type(bl, "ByteLevel") || !is_off(bl, "add_prefix_space") ||
        !is_off(bl, "use_regex"))
        return load_fail(err, path, "%s", want);
    return load_split(t, seq->items[0], path, err);
}

static int load_all(clef_tokenizer *t, const json_value *root, const char *path, clef_err *err) {
    if (root->type != JSON_OBJECT) return load_fail(err, path, "top level is not an object");
    if (load_model(t, root, path, err) || load_byte_ids(t, path, err) || load_added(t, root, path, err) ||
        load_normalizer(t, root, path, err) || load_pretokenizer(t, root, path, err))
        return -1;
    return 0;
}

clef_tokenizer *clef_tokenizer_load(const char *path, clef_err *err) {
    if (!path) {
        clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "tokenizer: no path given");
        return NULL;
    }
    size_t len;
    char *text = read_whole_file(path, &len, err);
    if (!text) return NULL;
    clef_err jerr;
    clef_err_clear(&jerr);
    json_value *root = json_parse(text, len, &jerr);
    free(text);
    if (!root) {
        load_fail(err, path, "not valid JSON: %s", jerr.message);
        return NULL;
    }
    clef_tokenizer *t = clef_xcalloc(1, sizeof *t);
    int rc = load_all(t, root, path, err);
    json_free(root);
    if (rc) {
        clef_tokenizer_free(t);
        return NULL;
    }
    return t;
}

void clef_tokenizer_free(clef_tokenizer *t) {
    if (!t) return;
    bpe_strmap_free(&t->vocab);
    bpe_pairmap_free(&t->merges);
    pretok_trie_free(&t->added);
    pretok_regex_free(t->split);
    free(t);
}

/* ---- encode ---- */

typedef struct encode_ctx {
    const clef_tokenizer *t;
    clef_ids *out;
    bpe_scratch scratch;
    size_t n0;          /* out->n before this call */
    size_t max_ids;     /* stop once more ids than this are certain */
    int keep_prefix;    /* stop only after appending (the ids so far are then the exact prefix) */
    size_t at_least;    /* when stopped: the text has at least this many ids */
    int stopped;
    size_t ws_min, bpe_long_min; /* pretok_split_ws / bpe_encode_piece_ex thresholds */
    size_t seg_len;     /* bytes of the segment being split */
    int stop_at_seg_end; /* the stop came after the segment's last piece */
} encode_ctx;

static size_t ids_so_far(const encode_ctx *c) { return c->out->n - c->n0; }

/* Stretches shorter than this are tokenized rather than bounded: cheap, and
 * it keeps the count exact when only the last pieces cross max_ids. */
#define BOUND_MIN_BYTES 4096

/* Whether a stretch of `bytes` bytes still to be BPE'd makes the total
 * certainly exceed max_ids (each id covers at most max_token_bytes bytes);
 * only used when the caller does not need the ids themselves. */
static int bound_exceeds(encode_ctx *c, size_t bytes) {
    if (c->keep_prefix || c->max_ids == SIZE_MAX || bytes < BOUND_MIN_BYTES) return 0;
    size_t lb = ids_so_far(c) + (bytes + c->t->max_token_bytes - 1) / c->t->max_token_bytes;
    if (lb <= c->max_ids) return 0;
    c->at_least = lb;
    c->stopped = 1;
    c->stop_at_seg_end = 0;
    return 1;
}

/* After appending: stop once more than max_ids ids are out. */
static int count_exceeds(encode_ctx *c) {
    if (ids_so_far(c) <= c->max_ids) return 0;
    c->at_least = ids_so_far(c);
    c->stopped = 1;
    return 1;
}

static int encode_piece(void *vctx, const char *text, size_t start, size_t end) {
    encode_ctx *c = vctx;
    if (bound_exceeds(c, end - start)) return 1;
    bpe_encode_piece_ex(&c->t->merges, c->t->byte_id, (const uint8_t *)text + start, end - start, c->bpe_long_min,
                        &c->scratch, c->out);
    if (!count_exceeds(c)) return 0;
    c->stop_at_seg_end = end == c->seg_len;
    return 1;
}

static int is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] >= 0x80) return 0;
    return 1;
}

/* Normalise, split and BPE one stretch of text between added tokens. */
static int encode_segment(encode_ctx *c, const char *s, size_t n, clef_err *err) {
    if (n == 0) return 0;
    if (!c->t->nfc || is_ascii(s, n)) {
        c->seg_len = n;
        if (bound_exceeds(c, n)) return 0;
        return pretok_split_ws(c->t->split, s, n, c->ws_min, encode_piece, c, err) < 0 ? -1 : 0;
    }
    size_t nn;
    char *norm = pretok_nfc(s, n, &nn, err);
    if (!norm) return -1;
    c->seg_len = nn;
    int rc = bound_exceeds(c, nn) ? 0 : pretok_split_ws(c->t->split, norm, nn, c->ws_min, encode_piece, c, err);
    free(norm);
    return rc < 0 ? -1 : 0;
}

/* Cut out added tokens (longest match, leftmost first) and encode the rest. */
static int encode_text(encode_ctx *c, const char *text, size_t len, clef_err *err) {
    const pretok_trie *added = &c->t->added;
    size_t seg = 0;
    for (size_t i = 0; i < len;) {
        int32_t id;
        size_t m = added->first[(uint8_t)text[i]] ? pretok_trie_match(added, text + i, len - i, &id) : 0;
        if (!m) {
            i++;
            continue;
        }
        if (encode_segment(c, text + seg, i - seg, err)) return -1;
        if (c->stopped) return 0;
        clef_ids_push(c->out, id);
        seg = i += m;
        if (count_exceeds(c)) {
            if (seg == len) c->stopped = 0; /* it was the last token: the count is complete */
            return 0;
        }
    }
    int rc = encode_segment(c, text + seg, len - seg, err);
    if (c->stopped && c->stop_at_seg_end) c->stopped = 0; /* the last piece took it over: complete */
    return rc;
}

static int tokenize_run(const clef_tokenizer *t, const char *text, size_t len, size_t max_ids, int keep_prefix,
                        size_t ws_min, size_t bpe_long_min, clef_ids *out, size_t *n_ids, clef_err *err) {
    if (!t || !out || (!text && len)) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "clef_tokenize: bad arguments");
    size_t bad = pretok_utf8_invalid_at(text, len);
    if (bad < len)
        return clef_fail(err, 400, CLEF_E_REQUEST, NULL, "text is not valid UTF-8 (invalid byte 0x%02x at offset %zu)",
                         (uint8_t)text[bad], bad);
    if (n_ids) *n_ids = 0;
    if (len == 0) return 0;
    if (len > (size_t)INT32_MAX)  /* the merge loop indexes symbols with int32 */
        return clef_fail(err, 400, CLEF_E_REQUEST, NULL, "text of %zu bytes is too long to tokenize", len);
    encode_ctx c = {.t = t, .out = out, .n0 = out->n, .max_ids = max_ids, .keep_prefix = keep_prefix,
                    .ws_min = ws_min, .bpe_long_min = bpe_long_min};
    int rc = encode_text(&c, text, len, err);
    bpe_scratch_free(&c.scratch);
    if (rc) {
        out->n = c.n0;  /* all or nothing: never hand back a partial encoding */
        return -1;
    }
    if (c.stopped && !keep_prefix) out->n = c.n0;
    if (n_ids) *n_ids = c.stopped ? c.at_least : ids_so_far(&c);
    return c.stopped;
}

int clef_tokenize_bounded(const clef_tokenizer *t, const char *text, size_t len, size_t max_ids, int keep_prefix,
                          clef_ids *out, size_t *n_ids, clef_err *err) {
    return tokenize_run(t, text, len, max_ids, keep_prefix, PRETOK_WS_RUN_MIN, BPE_LONG_PIECE, out, n_ids, err);
}

int clef_tokenize(const clef_tokenizer *t, const char *text, size_t len, clef_ids *out, clef_err *err) {
    return clef_tokenize_bounded(t, text, len, SIZE_MAX, 1, out, NULL, err) < 0 ? -1 : 0;
}

int clef_tokenize_tuned(const clef_tokenizer *t, const char *text, size_t len, size_t ws_min, size_t bpe_long_min,
                        clef_ids *out, clef_err *err) {
    return tokenize_run(t, text, len, SIZE_MAX, 1, ws_min, bpe_long_min, out, NULL, err) < 0 ? -1 : 0;
}

size_t clef_tokenizer_max_token_bytes(const clef_tokenizer *t) { return t ? t->max_token_bytes : 0; }

size_t clef_tokenizer_size(const clef_tokenizer *t) { return t ? t->size : 0; }

int32_t clef_token_id(const clef_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    size_t len = strlen(token);
    int32_t id = pretok_trie_exact(&t->added, token, len);  /* added tokens first, as HF token_to_id */
    return id >= 0 ? id : bpe_strmap_get(&t->vocab, token, len);
}
