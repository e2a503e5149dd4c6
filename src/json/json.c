/* json.c — JSON parse / access / render with Python `json` semantics.
 *
 * Why our own parser and not a library: no Debian JSON library gives the
 * semantics of Python's json.loads that the reference sees (SPEC.md §4.1):
 * exact arbitrary-size integers, the NaN / Infinity / -Infinity literals,
 * duplicate keys keeping the first position with the last value, rejection
 * of lone surrogates, and the 4300-digit integer limit.  The renderer must
 * likewise reproduce json.dumps(ensure_ascii=False, separators=(",",":"),
 * sort_keys=True) byte for byte, including Python's float repr (§4.2).
 *
 * Container storage: `items` (and `keys` / `key_lens` of objects) always have
 * capacity json_cap(n) (0 for n == 0, else max(4, next power of two >= n)),
 * so json_array_push / json_object_set can grow them without a capacity
 * field.  The parser grows its vectors by doubling from 4, which keeps this
 * invariant.
 *
 * Locale: strtod / snprintf("%e") are used for floats and assume the "C"
 * LC_NUMERIC locale (the default; clef never calls setlocale).
 */
#include "json/json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Container capacity rule (see top comment).                          */

static size_t json_cap(size_t n) {
    if (n == 0) return 0;
    size_t c = 4;
    while (c < n) c <<= 1;
    return c;
}

/* True when a container of n elements has no free slot left. */
static int json_full(size_t n) { return json_cap(n) == n; }

static void *grow(void *p, size_t n, size_t elem) {
    /* called when json_full(n): make room for element n */
    return clef_xrealloc(p, json_cap(n + 1) * elem);
}

/* ------------------------------------------------------------------ */
/* Parser                                                              */

typedef struct parser {
    const unsigned char *s;
    size_t len;
    size_t pos;
    int depth;
    clef_err *err;
    clef_buf scratch; /* reused while decoding strings */
} parser;

static json_value *parse_value(parser *p);

static void perr(parser *p, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void perr(parser *p, size_t at, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    clef_fail(p->err, 400, CLEF_E_JSON, NULL, "invalid JSON at byte %zu: %s", at, what);
}

/* JSON whitespace is exactly space, tab, LF, CR (Python's WHITESPACE). */
static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int match_word(parser *p, const char *w) {
    size_t n = strlen(w);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, w, n) != 0) return 0;
    p->pos += n;
    return 1;
}

/* Describe the byte at `at` for error messages. */
static const char *describe_at(parser *p, size_t at, char *tmp, size_t tmpn) {
    if (at >= p->len) return "end of input";
    unsigned char c = p->s[at];
    if (c >= 0x21 && c < 0x7f)
        snprintf(tmp, tmpn, "'%c'", c);
    else
        snprintf(tmp, tmpn, "byte 0x%02x", c);
    return tmp;
}

static json_value *new_node(json_type t) {
    json_value *v = clef_xcalloc(1, sizeof *v);
    v->type = t;
    return v;
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* Number grammar of Python's NUMBER_RE:
 *   -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?
 * Integers stay exact digit strings; anything with a fraction or exponent
 * goes through strtod (glibc rounds correctly; overflow gives ±inf and
 * underflow ±0.0 or a subnormal, as Python's float() does). */
static json_value *parse_number(parser *p) {
    size_t start = p->pos;
    int neg = 0;
    if (p->s[p->pos] == '-') {
        neg = 1;
        p->pos++;
        if (p->pos < p->len && p->s[p->pos] == 'I') {
            if (match_word(p, "Infinity")) {
                json_value *v = new_node(JSON_FLOAT);
                v->num = -INFINITY;
                return v;
            }
        }
        if (p->pos >= p->len || !is_digit(p->s[p->pos])) {
            perr(p, start, "expecting value");
            return NULL;
        }
    }
    size_t int_start = p->pos;
    if (p->s[p->pos] == '0') {
        p->pos++;
        if (p->pos < p->len && is_digit(p->s[p->pos])) {
            perr(p, int_start, "leading zeros in a number are not allowed");
            return NULL;
        }
    } else {
        while (p->pos < p->len && is_digit(p->s[p->pos])) p->pos++;
    }
    size_t int_digits = p->pos - int_start;
    int is_float = 0;
    if (p->pos < p->len && p->s[p->pos] == '.') {
        if (p->pos + 1 >= p->len || !is_digit(p->s[p->pos + 1])) {
            perr(p, p->pos, "expecting a digit after the decimal point");
            return NULL;
        }
        p->pos++;
        while (p->pos < p->len && is_digit(p->s[p->pos])) p->pos++;
        is_float = 1;
    }
    if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        size_t q = p->pos + 1;
        if (q < p->len && (p->s[q] == '+' || p->s[q] == '-')) q++;
        if (q >= p->len || !is_digit(p->s[q])) {
            perr(p, p->pos, "expecting digits in the exponent");
            return NULL;
        }
        while (q < p->len && is_digit(p->s[q])) q++;
        p->pos = q;
        is_float = 1;
    }
    size_t n = p->pos - start;
    if (!is_float) {
        if (int_digits > JSON_MAX_INT_DIGITS) {
            perr(p, start, "integer has %zu digits, more than the limit of %d", int_digits,
                 JSON_MAX_INT_DIGITS);
            return NULL;
        }
        json_value *v = new_node(JSON_INT);
        if (neg && int_digits == 1 && p->s[int_start] == '0') {
            v->str = clef_xstrndup("0", 1); /* Python: int("-0") == 0 */
            v->len = 1;
        } else {
            v->str = clef_xstrndup((const char *)p->s + start, n);
            v->len = n;
        }
        return v;
    }
    /* strtod needs a NUL-terminated copy (the input is not terminated). */
    char small[128];
    char *buf = n < sizeof small ? small : clef_xmalloc(n + 1);
    memcpy(buf, p->s + start, n);
    buf[n] = '\0';
    json_value *v = new_node(JSON_FLOAT);
    v->num = strtod(buf, NULL);
    if (buf != small) free(buf);
    return v;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Read the 4 hex digits of a \uXXXX escape whose backslash is at `at`. */
static int read_u4(parser *p, size_t at, unsigned *out) {
    if (at + 6 > p->len || p->s[at] != '\\' || p->s[at + 1] != 'u') return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p->s[at + 2 + i]);
        if (h < 0) return -1;
        v = (v << 4) | (unsigned)h;
    }
    *out = v;
    return 0;
}

static void put_utf8(clef_buf *b, unsigned cp) {
    char t[4];
    size_t n;
    if (cp < 0x80) {
        t[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        t[0] = (char)(0xC0 | (cp >> 6));
        t[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12));
        t[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        t[0] = (char)(0xF0 | (cp >> 18));
        t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    clef_buf_append(b, t, n);
}

/* Length of the well-formed UTF-8 sequence at s[0..avail), or 0 when it is
 * malformed (overlong, encoded surrogate, above U+10FFFF, truncated, stray
 * continuation byte) — the Unicode "well-formed byte sequences" table. */
static size_t utf8_seq_len(const unsigned char *s, size_t avail) {
    unsigned char c = s[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the 2nd byte */
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c == 0xE0) { n = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) n = 3;
    else if (c == 0xED) { n = 3; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) n = 3;
    else if (c == 0xF0) { n = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) n = 4;
    else if (c == 0xF4) { n = 4; hi = 0x8F; }
    else return 0;
    if (avail < n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

/* Decode a string whose opening quote is at p->pos into p->scratch. */
static int parse_string_raw(parser *p) {
    size_t open = p->pos;
    clef_buf *b = &p->scratch;
    b->len = 0;
    p->pos++;
    for (;;) {
        /* copy the run of plain ASCII bytes in one go */
        size_t run = p->pos;
        while (run < p->len) {
            unsigned char c = p->s[run];
            if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
            run++;
        }
        if (run > p->pos) clef_buf_append(b, p->s + p->pos, run - p->pos);
        p->pos = run;
        if (p->pos >= p->len) {
            perr(p, open, "unterminated string");
            return -1;
        }
        unsigned char c = p->s[p->pos];
        if (c == '"') {
            p->pos++;
            clef_buf_reserve(b, 1);
            b->data[b->len] = '\0';
            return 0;
        }
        if (c < 0x20) {
            perr(p, p->pos, "invalid control character 0x%02x in string", c);
            return -1;
        }
        if (c >= 0x80) {
            size_t n = utf8_seq_len(p->s + p->pos, p->len - p->pos);
            if (n == 0) {
                perr(p, p->pos, "invalid UTF-8 byte 0x%02x", c);
                return -1;
            }
            clef_buf_append(b, p->s + p->pos, n);
            p->pos += n;
            continue;
        }
        /* backslash escape */
        size_t esc = p->pos;
        if (esc + 1 >= p->len) {
            perr(p, open, "unterminated string");
            return -1;
        }
        unsigned char e = p->s[esc + 1];
        char out = 0;
        switch (e) {
        case '"': out = '"'; break;
        case '\\': out = '\\'; break;
        case '/': out = '/'; break;
        case 'b': out = '\b'; break;
        case 'f': out = '\f'; break;
        case 'n': out = '\n'; break;
        case 'r': out = '\r'; break;
        case 't': out = '\t'; break;
        case 'u': break;
        default:
            perr(p, esc, "invalid escape \\%c", e >= 0x21 && e < 0x7f ? e : '?');
            return -1;
        }
        if (e != 'u') {
            clef_buf_putc(b, out);
            p->pos = esc + 2;
            continue;
        }
        unsigned cp;
        if (read_u4(p, esc, &cp) < 0) {
            perr(p, esc, "invalid \\uXXXX escape");
            return -1;
        }
        p->pos = esc + 6;
        if (cp >= 0xDC00 && cp <= 0xDFFF) {
            perr(p, esc, "lone surrogate \\u%04x", cp);
            return -1;
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            unsigned lo;
            if (read_u4(p, p->pos, &lo) < 0 || lo < 0xDC00 || lo > 0xDFFF) {
                perr(p, esc, "lone surrogate \\u%04x", cp);
                return -1;
            }
            p->pos += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        put_utf8(b, cp);
    }
}

static json_value *parse_string(parser *p) {
    if (parse_string_raw(p) < 0) return NULL;
    json_value *v = new_node(JSON_STRING);
    v->str = clef_xstrndup(p->scratch.data, p->scratch.len);
    v->len = p->scratch.len;
    return v;
}

/* Step over the '[' or '{' at p->pos and the whitespace after it, refusing
 * nesting past JSON_MAX_DEPTH.  Returns 0 when members follow (depth is now
 * one deeper), 1 when `close` follows at once (empty container, consumed,
 * depth unchanged), or -1 with the parse error set. */
static int open_container(parser *p, char close) {
    if (p->depth >= JSON_MAX_DEPTH) {
        perr(p, p->pos, "nesting deeper than %d", JSON_MAX_DEPTH);
        return -1;
    }
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return 1;
    }
    p->depth++;
    return 0;
}

/* After an array element or object member: skip whitespace, then consume
 * ',' (returns 1: another member follows) or `close` (returns 0: the
 * container ends; depth back one).  Anything else is the parse error
 * "expecting ',' or '<close>' in <kind>, found ..." and returns -1. */
static int member_end(parser *p, char close, const char *kind) {
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ',') {
        p->pos++;
        return 1;
    }
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        p->depth--;
        return 0;
    }
    char tmp[32];
    perr(p, p->pos, "expecting ',' or '%c' in %s, found %s", close, kind, describe_at(p, p->pos, tmp, sizeof tmp));
    return -1;
}

static json_value *parse_array(parser *p) {
    int opened = open_container(p, ']');
    if (opened < 0) return NULL;
    json_value *arr = new_node(JSON_ARRAY);
    if (opened == 1) return arr;
    for (;;) {
        skip_ws(p);
        json_value *item = parse_value(p);
        if (!item) goto fail;
        json_array_push(arr, item);
        int more = member_end(p, ']', "array");
        if (more < 0) goto fail;
        if (!more) break;
    }
    return arr;
fail:
    json_free(arr);
    return NULL;
}

/* ---- duplicate-key detection for objects ---------------------------- */
/* Small objects scan linearly; from KEYSET_MIN members on, a hash set of
 * member indexes (open addressing) keeps parsing O(n) for the 151k-entry
 * tokenizer vocabulary. */
#define KEYSET_MIN 16

typedef struct keyset {
    size_t *slot; /* member index + 1; 0 = empty */
    size_t cap;   /* power of two */
} keyset;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static void keyset_insert(keyset *ks, const json_value *obj, size_t idx) {
    size_t mask = ks->cap - 1;
    size_t i = (size_t)hash_bytes(obj->keys[idx], obj->key_lens[idx]) & mask;
    while (ks->slot[i]) i = (i + 1) & mask;
    ks->slot[i] = idx + 1;
}

static void keyset_rebuild(keyset *ks, const json_value *obj) {
    free(ks->slot);
    ks->cap = 64;
    while (ks->cap < obj->n * 2 + 2) ks->cap <<= 1;
    ks->slot = clef_xcalloc(ks->cap, sizeof *ks->slot);
    for (size_t i = 0; i < obj->n; i++) keyset_insert(ks, obj, i);
}

/* Index of key in obj, or (size_t)-1. */
static size_t find_key(const json_value *obj, const keyset *ks, const char *k, size_t kn) {
    if (!ks || !ks->slot) {
        for (size_t i = 0; i < obj->n; i++)
            if (obj->key_lens[i] == kn && memcmp(obj->keys[i], k, kn) == 0) return i;
        return (size_t)-1;
    }
    size_t mask = ks->cap - 1;
    size_t i = (size_t)hash_bytes(k, kn) & mask;
    while (ks->slot[i]) {
        size_t j = ks->slot[i] - 1;
        if (obj->key_lens[j] == kn && memcmp(obj->keys[j], k, kn) == 0) return j;
        i = (i + 1) & mask;
    }
    return (size_t)-1;
}

/* Append a new member (no duplicate check); takes ownership of key and item. */
static void object_append(json_value *obj, char *key, size_t kn, json_value *item) {
    if (json_full(obj->n)) {
        obj->items = grow(obj->items, obj->n, sizeof *obj->items);
        obj->keys = grow(obj->keys, obj->n, sizeof *obj->keys);
        obj->key_lens = grow(obj->key_lens, obj->n, sizeof *obj->key_lens);
    }
    obj->keys[obj->n] = key;
    obj->key_lens[obj->n] = kn;
    obj->items[obj->n] = item;
    obj->n++;
}

static json_value *parse_object(parser *p) {
    int opened = open_container(p, '}');
    if (opened < 0) return NULL;
    json_value *obj = new_node(JSON_OBJECT);
    if (opened == 1) return obj;
    keyset ks = {0};
    for (;;) {
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != '"') {
            char tmp[32];
            perr(p, p->pos, "expecting property name enclosed in double quotes, found %s",
                 describe_at(p, p->pos, tmp, sizeof tmp));
            goto fail;
        }
        if (parse_string_raw(p) < 0) goto fail;
        size_t kn = p->scratch.len;
        size_t dup = find_key(obj, &ks, p->scratch.data, kn);
        char *key = dup == (size_t)-1 ? clef_xstrndup(p->scratch.data, kn) : NULL;
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':') {
            char tmp[32];
            perr(p, p->pos, "expecting ':' after property name, found %s", describe_at(p, p->pos, tmp, sizeof tmp));
            free(key);
            goto fail;
        }
        p->pos++;
        skip_ws(p);
        json_value *item = parse_value(p);
        if (!item) {
            free(key);
            goto fail;
        }
        if (dup != (size_t)-1) {
            /* Python dict: first position, last value */
            json_free(obj->items[dup]);
            obj->items[dup] = item;
        } else {
            object_append(obj, key, kn, item);
            if (ks.slot) {
                if (obj->n * 2 + 2 > ks.cap) keyset_rebuild(&ks, obj);
                else keyset_insert(&ks, obj, obj->n - 1);
            } else if (obj->n >= KEYSET_MIN) {
                keyset_rebuild(&ks, obj);
            }
        }
        int more = member_end(p, '}', "object");
        if (more < 0) goto fail;
        if (!more) break;
    }
    free(ks.slot);
    return obj;
fail:
    free(ks.slot);
    json_free(obj);
    return NULL;
}

static json_value *parse_value(parser *p) {
    if (p->pos >= p->len) {
        perr(p, p->pos, "expecting value, found end of input");
        return NULL;
    }
    unsigned char c = p->s[p->pos];
    json_value *v;
    switch (c) {
    case '{': return parse_object(p);
    case '[': return parse_array(p);
    case '"': return parse_string(p);
    case 'n':
        if (match_word(p, "null")) return new_node(JSON_NULL);
        break;
    case 't':
        if (match_word(p, "true")) return new_node(JSON_TRUE);
        break;
    case 'f':
        if (match_word(p, "false")) return new_node(JSON_FALSE);
        break;
    case 'N':
        if (match_word(p, "NaN")) {
            v = new_node(JSON_FLOAT);
            v->num = NAN;
            return v;
        }
        break;
    case 'I':
        if (match_word(p, "Infinity")) {
            v = new_node(JSON_FLOAT);
            v->num = INFINITY;
            return v;
        }
        break;
    default:
        if (c == '-' || is_digit(c)) return parse_number(p);
        break;
    }
    char tmp[32];
    perr(p, p->pos, "expecting value, found %s", describe_at(p, p->pos, tmp, sizeof tmp));
    return NULL;
}

json_value *json_parse(const char *text, size_t len, clef_err *err) {
    parser p = {.s = (const unsigned char *)text, .len = len, .err = err};
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
        perr(&p, 0, "unexpected UTF-8 BOM");
        return NULL;
    }
    skip_ws(&p);
    json_value *v = parse_value(&p);
    if (v) {
        skip_ws(&p);
        if (p.pos != p.len) {
            char tmp[32];
            perr(&p, p.pos, "extra data after the document: %s", describe_at(&p, p.pos, tmp, sizeof tmp));
            json_free(v);
            v = NULL;
        }
    }
    clef_buf_free(&p.scratch);
    return v;
}

/* ------------------------------------------------------------------ */
/* Tree ownership and access                                           */

void json_free(json_value *v) {
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) {
        json_free(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->key_lens);
    free(v->str);
    free(v);
}

const json_value *json_get(const json_value *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT || !key) return NULL;
    size_t kn = strlen(key);
    for (size_t i = 0; i < obj->n; i++)
        if (obj->key_lens[i] == kn && memcmp(obj->keys[i], key, kn) == 0) return obj->items[i];
    return NULL;
}

int json_truthy(const json_value *v) {
    if (!v) return 0;
    switch (v->type) {
    case JSON_NULL:
    case JSON_FALSE: return 0;
    case JSON_TRUE: return 1;
    case JSON_INT: return !(v->len == 1 && v->str[0] == '0');
    case JSON_FLOAT: return v->num != 0.0; /* NaN is truthy in Python */
    case JSON_STRING: return v->len > 0;
    case JSON_ARRAY:
    case JSON_OBJECT: return v->n > 0;
    }
    return 0;
}

int json_as_i64(const json_value *v, int64_t *out) {
    if (!v) return -1;
    if (v->type == JSON_FLOAT) {
        double x = v->num;
        /* [-2^63, 2^63) and integral; NaN fails both comparisons */
        if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0) || x != trunc(x)) return -1;
        *out = (int64_t)x;
        return 0;
    }
    if (v->type != JSON_INT) return -1;
    const char *s = v->str;
    int neg = *s == '-';
    if (neg) s++;
    /* accumulate as a negative number so INT64_MIN fits */
    int64_t acc = 0;
    for (; *s; s++) {
        int d = *s - '0';
        if (acc < (INT64_MIN + d) / 10) return -1;
        acc = acc * 10 - d;
    }
    if (!neg) {
        if (acc == INT64_MIN) return -1;
        acc = -acc;
    }
    *out = acc;
    return 0;
}

int json_as_double(const json_value *v, double *out) {
    if (!v) return -1;
    if (v->type == JSON_FLOAT) {
        *out = v->num;
        return 0;
    }
    if (v->type != JSON_INT) return -1;
    /* correctly rounded like Python float(int); too large -> OverflowError there, -1 here */
    double x = strtod(v->str, NULL);
    if (isinf(x)) return -1;
    *out = x;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Constructors                                                        */

json_value *json_new(json_type type) { return new_node(type); }

json_value *json_new_string(const char *s, size_t len) {
    json_value *v = new_node(JSON_STRING);
    v->str = clef_xstrndup(s ? s : "", s ? len : 0);
    v->len = s ? len : 0;
    return v;
}

json_value *json_new_float(double x) {
    json_value *v = new_node(JSON_FLOAT);
    v->num = x;
    return v;
}

json_value *json_new_int(int64_t x) {
    char t[32];
    int n = snprintf(t, sizeof t, "%lld", (long long)x);
    json_value *v = new_node(JSON_INT);
    v->str = clef_xstrndup(t, (size_t)n);
    v->len = (size_t)n;
    return v;
}

json_value *json_clone(const json_value *v) {
    if (!v) return NULL;
    json_value *c = new_node(v->type);
    c->num = v->num;
    if (v->str) {
        c->str = clef_xstrndup(v->str, v->len);
        c->len = v->len;
    }
    if (v->n) {
        size_t cap = json_cap(v->n);
        c->items = clef_xmalloc(cap * sizeof *c->items);
        if (v->keys) {
            c->keys = clef_xmalloc(cap * sizeof *c->keys);
            c->key_lens = clef_xmalloc(cap * sizeof *c->key_lens);
        }
        for (size_t i = 0; i < v->n; i++) {
            c->items[i] = json_clone(v->items[i]);
            if (v->keys) {
                c->keys[i] = clef_xstrndup(v->keys[i], v->key_lens[i]);
                c->key_lens[i] = v->key_lens[i];
            }
        }
        c->n = v->n;
    }
    return c;
}

void json_array_push(json_value *arr, json_value *item) {
    if (!arr || arr->type != JSON_ARRAY) {
        json_free(item); /* ownership was transferred; do not leak */
        return;
    }
    if (json_full(arr->n)) arr->items = grow(arr->items, arr->n, sizeof *arr->items);
    arr->items[arr->n++] = item;
}

void json_object_set(json_value *obj, const char *key, size_t key_len, json_value *item) {
    if (!obj || obj->type != JSON_OBJECT) {
        json_free(item);
        return;
    }
    size_t i = find_key(obj, NULL, key, key_len);
    if (i != (size_t)-1) {
        json_free(obj->items[i]);
        obj->items[i] = item;
        return;
    }
    object_append(obj, clef_xstrndup(key, key_len), key_len, item);
}

/* ------------------------------------------------------------------ */
/* Rendering                                                           */

void json_render_string(const char *s, size_t len, clef_buf *out) {
    static const char hex[] = "0123456789abcdef";
    clef_buf_reserve(out, len + 2);
    clef_buf_putc(out, '"');
    size_t run = 0; /* start of the pending run of bytes emitted raw */
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        clef_buf_append(out, s + run, i - run);
        run = i + 1;
        switch (c) {
        case '"': clef_buf_append(out, "\\\"", 2); break;
        case '\\': clef_buf_append(out, "\\\\", 2); break;
        case '\n': clef_buf_append(out, "\\n", 2); break;
        case '\r': clef_buf_append(out, "\\r", 2); break;
        case '\t': clef_buf_append(out, "\\t", 2); break;
        case '\b': clef_buf_append(out, "\\b", 2); break;
        case '\f': clef_buf_append(out, "\\f", 2); break;
        default: {
            char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            clef_buf_append(out, u, 6);
        }
        }
    }
    clef_buf_append(out, s + run, len - run);
    clef_buf_putc(out, '"');
}

/* Digits d1..dn (no sign, no point) and scientific exponent e of the
 * %.{p}e rendering of positive finite x. */
static int sci_digits(double x, int p, char *dig, int *exp10) {
    char t[40];
    snprintf(t, sizeof t, "%.*e", p, x);
    int n = 0;
    const char *q = t;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') dig[n++] = *q;
    dig[n] = '\0';
    *exp10 = atoi(q + 1);
    return n;
}

static int digits_roundtrip(const char *dig, int n, int e, double x) {
    char t[48];
    snprintf(t, sizeof t, "%.*se%d", n, dig, e - (n - 1));
    return strtod(t, NULL) == x;
}

/* Move the n-digit string one unit in the last place up (dir=+1) or down
 * (dir=-1), keeping n digits and adjusting the exponent on carry/borrow. */
static void digits_step(char *dig, int n, int *e, int dir) {
    int i = n - 1;
    if (dir > 0) {
        while (i >= 0 && dig[i] == '9') dig[i--] = '0';
        if (i >= 0) {
            dig[i]++;
        } else { /* 99..9 + 1 = 100..0: one more power of ten */
            dig[0] = '1';
            (*e)++;
        }
    } else {
        while (i >= 0 && dig[i] == '0') dig[i--] = '9';
        dig[i]--; /* i >= 0: the leading digit is never 0 */
        if (dig[0] == '0') { /* 100..0 - 1 = 99..9 (n digits, one power of ten less) */
            memmove(dig, dig + 1, (size_t)n - 1);
            dig[n - 1] = '9';
            (*e)--;
        }
    }
}

/* Shortest digit string that round-trips to x (Python repr / David Gay
 * mode 0): for each length take the correctly rounded digits; when they do
 * not round-trip (possible at power-of-two boundaries, where the rounding
 * interval is lopsided) try their neighbours at the same length. */
static int shortest_digits(double x, char *dig, int *exp10) {
    for (int p = 0; p < 17; p++) {
        int n = sci_digits(x, p, dig, exp10);
        if (digits_roundtrip(dig, n, *exp10, x)) return n;
        for (int dir = -1; dir <= 1; dir += 2) {
            char alt[24];
            int e = *exp10;
            memcpy(alt, dig, (size_t)n + 1);
            digits_step(alt, n, &e, dir);
            if (digits_roundtrip(alt, n, e, x)) {
                memcpy(dig, alt, (size_t)n + 1);
                *exp10 = e;
                return n;
            }
        }
    }
    return sci_digits(x, 16, dig, exp10); /* 17 digits always round-trip */
}

void json_render_float(double x, clef_buf *out) {
    if (isnan(x)) {
        clef_buf_puts(out, "NaN");
        return;
    }
    if (isinf(x)) {
        clef_buf_puts(out, x > 0 ? "Infinity" : "-Infinity");
        return;
    }
    if (signbit(x)) clef_buf_putc(out, '-');
    x = fabs(x);
    if (x == 0.0) {
        clef_buf_puts(out, "0.0");
        return;
    }
    char dig[24];
    int e;
    int n = shortest_digits(x, dig, &e);
    while (n > 1 && dig[n - 1] == '0') dig[--n] = '\0';
    if (e >= -4 && e < 16) {
        if (e < 0) { /* 0.000ddd */
            clef_buf_puts(out, "0.");
            for (int i = 0; i < -e - 1; i++) clef_buf_putc(out, '0');
            clef_buf_append(out, dig, (size_t)n);
        } else if (n <= e + 1) { /* integral: ddd000.0 */
            clef_buf_append(out, dig, (size_t)n);
            for (int i = n; i < e + 1; i++) clef_buf_putc(out, '0');
            clef_buf_puts(out, ".0");
        } else { /* ddd.ddd */
            clef_buf_append(out, dig, (size_t)e + 1);
            clef_buf_putc(out, '.');
            clef_buf_append(out, dig + e + 1, (size_t)(n - e - 1));
        }
        return;
    }
    clef_buf_putc(out, dig[0]);
    if (n > 1) {
        clef_buf_putc(out, '.');
        clef_buf_append(out, dig + 1, (size_t)n - 1);
    }
    clef_buf_printf(out, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
}

typedef struct member_ref {
    const char *key;
    size_t len;
    const json_value *item;
} member_ref;

/* Code point order == UTF-8 byte order; a proper prefix sorts first. */
static int member_cmp(const void *a, const void *b) {
    const member_ref *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->key, y->key, n);
    if (c) return c;
    return (x->len > y->len) - (x->len < y->len);
}

static void render_object(const json_value *v, int sort_keys, clef_buf *out) {
    clef_buf_putc(out, '{');
    member_ref *m = clef_xmalloc((v->n ? v->n : 1) * sizeof *m);
    for (size_t i = 0; i < v->n; i++) m[i] = (member_ref){v->keys[i], v->key_lens[i], v->items[i]};
    if (sort_keys) qsort(m, v->n, sizeof *m, member_cmp);
    for (size_t i = 0; i < v->n; i++) {
        if (i) clef_buf_putc(out, ',');
        json_render_string(m[i].key, m[i].len, out);
        clef_buf_putc(out, ':');
        json_render_opts(m[i].item, sort_keys, out);
    }
    free(m);
    clef_buf_putc(out, '}');
}

void json_render_opts(const json_value *v, int sort_keys, clef_buf *out) {
    if (!v) {
        clef_buf_puts(out, "null");
        return;
    }
    switch (v->type) {
    case JSON_NULL: clef_buf_puts(out, "null"); break;
    case JSON_FALSE: clef_buf_puts(out, "false"); break;
    case JSON_TRUE: clef_buf_puts(out, "true"); break;
    case JSON_INT: clef_buf_append(out, v->str, v->len); break;
    case JSON_FLOAT: json_render_float(v->num, out); break;
    case JSON_STRING: json_render_string(v->str, v->len, out); break;
    case JSON_ARRAY:
        clef_buf_putc(out, '[');
        for (size_t i = 0; i < v->n; i++) {
            if (i) clef_buf_putc(out, ',');
            json_render_opts(v->items[i], sort_keys, out);
        }
        clef_buf_putc(out, ']');
        break;
    case JSON_OBJECT: render_object(v, sort_keys, out); break;
    }
}

void json_render(const json_value *v, clef_buf *out) { json_render_opts(v, 1, out); }
