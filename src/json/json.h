/* json.h — JSON documents with Python `json` semantics.
 *
 * Parsing reproduces what the reference sees after Python's `json.loads`
 * (SPEC.md §4.1): integers keep their exact digits (any size, at most 4300
 * digits), other numbers become correctly rounded doubles (overflow -> ±inf,
 * underflow -> ±0.0), the literals NaN / Infinity / -Infinity are accepted,
 * duplicate keys keep the position of their first occurrence with the value
 * of the last, lone surrogates are rejected, and everything Python rejects
 * (leading '+', ".5", "1.", leading zeros, comments, trailing commas, raw
 * control characters in strings, a leading BOM, invalid UTF-8) is an error.
 *
 * Rendering reproduces `json.dumps(v, ensure_ascii=False,
 * separators=(",", ":"), sort_keys=True)` (SPEC.md §4.2).
 *
 * Ownership: a parsed document is one tree of heap nodes owned by the root;
 * free it with json_free(root).  Strings are UTF-8, may contain NUL bytes
 * (always use the length), and are NUL-terminated for convenience.
 */
#ifndef CLEF_JSON_JSON_H
#define CLEF_JSON_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"
#include "util/err.h"

typedef enum json_type {
    JSON_NULL,
    JSON_FALSE,
    JSON_TRUE,
    JSON_INT,    /* exact integer: `str` holds its canonical decimal digits ("-0" -> "0") */
    JSON_FLOAT,  /* IEEE double in `num` */
    JSON_STRING, /* UTF-8 in `str` / `len` */
    JSON_ARRAY,  /* `items[0..n)` */
    JSON_OBJECT  /* `keys[0..n)` / `key_lens` / `items[0..n)`, in first-occurrence order */
} json_type;

typedef struct json_value json_value;
struct json_value {
    json_type type;
    double num;          /* JSON_FLOAT */
    char *str;           /* JSON_STRING (decoded text) or JSON_INT (digits); NUL-terminated */
    size_t len;          /* byte length of `str` */
    size_t n;            /* number of items (array) or members (object) */
    json_value **items;  /* array elements or object values */
    char **keys;         /* object keys, decoded UTF-8, NUL-terminated */
    size_t *key_lens;    /* byte lengths of keys */
};

/* Maximum nesting depth accepted by json_parse: JSON_MAX_DEPTH nested
 * arrays/objects parse, one more is an error (checked before recursing, so
 * any input depth is safe; Python would raise RecursionError near 1000). */
#define JSON_MAX_DEPTH 512
/* Python refuses integers with more digits than this (int max str digits). */
#define JSON_MAX_INT_DIGITS 4300

/* Parse `len` bytes of `text` as one JSON document (surrounding whitespace
 * allowed).  Returns a new tree, or NULL with `err` set to status 400, type
 * "invalid_json" and a message naming the problem and its byte offset, e.g.
 * "invalid JSON at byte 17: lone surrogate \\ud800". */
json_value *json_parse(const char *text, size_t len, clef_err *err);

/* Free a tree returned by json_parse or built with json_new_*.  NULL is ok. */
void json_free(json_value *v);

/* Member lookup in an object by key (byte comparison); NULL when `obj` is not
 * an object or has no such key.  Linear in the member count: to index a large
 * object (the tokenizer vocabulary) iterate keys[] / items[] instead.  Keys
 * containing NUL bytes cannot be looked up here (compare keys[] directly). */
const json_value *json_get(const json_value *obj, const char *key);

/* Python truthiness: null/false/0/0.0/""/[]/{} are falsy (SPEC §2.1 step 3.2). */
int json_truthy(const json_value *v);

/* Convert a JSON_INT (or an integral JSON_FLOAT) to int64; returns -1 if the
 * value is not a number or does not fit. */
int json_as_i64(const json_value *v, int64_t *out);
/* Convert JSON_INT or JSON_FLOAT to double (integers correctly rounded, like
 * Python float(int)); returns -1 if not a number or if an integer is too
 * large for a double (Python raises OverflowError there). */
int json_as_double(const json_value *v, double *out);

/* Append the Python json.dumps rendering of `v` (sort_keys, ensure_ascii=False,
 * compact separators) to `out`. */
void json_render(const json_value *v, clef_buf *out);

/* Like json_render, but with `sort_keys` = 0 objects keep their stored
 * (first-occurrence) order — used for the response envelope, whose key order
 * is fixed by SPEC.md §8, and for echoed values such as score legends. */
void json_render_opts(const json_value *v, int sort_keys, clef_buf *out);

/* Append the Python-escaped quoted form of a UTF-8 string ("..." with \" \\
 * \n \r \t \b \f and lowercase \u00XX for other controls). */
void json_render_string(const char *s, size_t len, clef_buf *out);

/* Append Python repr(float) of `x`: shortest round-trip digits, fixed
 * notation for exponents in [-4,16), otherwise d.ddde±XX; "NaN",
 * "Infinity", "-Infinity", "0.0", "-0.0". */
void json_render_float(double x, clef_buf *out);

/* Constructors for building documents in C (the response, the debug block).
 * Each returns a new node owned by the caller (or by the container it is
 * added to). */
json_value *json_new(json_type type);
json_value *json_new_string(const char *s, size_t len);
json_value *json_new_float(double x);
json_value *json_new_int(int64_t x);
/* Deep copy of any value. */
json_value *json_clone(const json_value *v);
/* Append to an array / set a key in an object (replacing an existing key's
 * value in place).  Takes ownership of `item`. */
void json_array_push(json_value *arr, json_value *item);
void json_object_set(json_value *obj, const char *key, size_t key_len, json_value *item);

#endif
