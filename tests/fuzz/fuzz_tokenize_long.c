/* fuzz_tokenize_long.c — libFuzzer target for tokenizing long inputs with
 * the real Qwen3 tokenizer (issue 15; the request fuzzer stops at 16 KB):
 *   first byte even: the rest is the text;
 *   odd: the rest is a run-length program of (count, length, unit) records,
 *     each unit repeated 1 + count^2 / 16 times (so runs of up to 4k spaces,
 *     tabs, newlines or words come cheaply), invalid UTF-8 replaced by '?',
 *     at most 64 KiB in all.
 * Checked: no 500 for valid UTF-8; the whitespace-run rule and the rank-bucket
 * merge forced on every run and piece give the default's ids, and so does
 * plain PCRE2 + binary heap up to 16 KiB (the new paths start at 64-byte
 * runs and 256-byte pieces, so small inputs reach them; beyond, the plain
 * path's own cost under ASan would dominate); the bounded tokenizer's prefix
 * equals the full encoding's and its count is a lower bound (up to 64 KiB).
 * Build and run: `make fuzz` (-max_len 1 MiB).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/pretok.h"
#include "text/tokenizer.h"
#include "fuzz_check.h"

#ifndef CLEF_FIXTURES
#define CLEF_FIXTURES "tests/fixtures"
#endif

#define MAX_TEXT ((size_t)1 << 20)
#define MAX_EXPANDED ((size_t)64 << 10)
#define PLAIN_MAX ((size_t)16 << 10)

static clef_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    clef_err err;
    clef_err_clear(&err);
    tok = clef_tokenizer_load(CLEF_FIXTURES "/tiny-clef-omni/tokenizer.json", &err);
    if (!tok) {
        fprintf(stderr, "fuzz_tokenize_long: %s\n", err.message);
        abort();
    }
    return 0;
}

/* Expand the run-length program; replace invalid UTF-8 by '?'. */
static void expand(const uint8_t *p, size_t n, clef_buf *out) {
    for (size_t i = 0; i + 2 <= n && out->len < MAX_EXPANDED;) {
        size_t reps = 1 + (size_t)p[i] * p[i] / 16, len = 1 + p[i + 1] % 8;
        i += 2;
        if (i + len > n) len = n - i;
        if (!len) break;
        for (size_t r = 0; r < reps && out->len + len <= MAX_EXPANDED; r++) clef_buf_append(out, p + i, len);
        i += len;
    }
    for (size_t at = 0; at < out->len;) { /* resume after each fix: one pass over the text */
        at += pretok_utf8_invalid_at(out->data + at, out->len - at);
        if (at < out->len) out->data[at++] = '?';
    }
}

static void same(const clef_ids *a, const clef_ids *b) {
    CHECK(a->n == b->n);
    CHECK(a->n == 0 || memcmp(a->v, b->v, a->n * sizeof *a->v) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > MAX_TEXT + 1) return 0;
    clef_buf text = {0};
    if (data[0] & 1)
        expand(data + 1, size - 1, &text);
    else
        clef_buf_append(&text, data + 1, size - 1);
    const char *s = text.data ? text.data : "";
    clef_ids a = {0}, b = {0}, c = {0};
    clef_err err;
    clef_err_clear(&err);
    int rc = clef_tokenize(tok, s, text.len, &a, &err);
    if (rc != 0) {
        CHECK(err.status == 400 && pretok_utf8_invalid_at(s, text.len) < text.len);
        clef_buf_free(&text);
        return 0;
    }
    CHECK(clef_tokenize_tuned(tok, s, text.len, 1, 2, &b, &err) == 0);
    same(&a, &b);
    if (text.len <= PLAIN_MAX) {
        CHECK(clef_tokenize_tuned(tok, s, text.len, 0, SIZE_MAX, &c, &err) == 0);
        same(&a, &c);
    }
    if (a.n >= 2 && text.len <= MAX_EXPANDED) {
        size_t max_ids = a.n / 2, got = 0;
        clef_ids p = {0};
        rc = clef_tokenize_bounded(tok, s, text.len, max_ids, 1, &p, &got, &err);
        CHECK(rc == 1 || (rc == 0 && got == a.n));
        CHECK(got > max_ids && got <= a.n && p.n == got && memcmp(p.v, a.v, got * sizeof *a.v) == 0);
        clef_ids_free(&p);
        rc = clef_tokenize_bounded(tok, s, text.len, max_ids, 0, &p, &got, &err);
        CHECK(rc >= 0 && got > max_ids && got <= a.n && p.n == (rc == 1 ? 0 : a.n));
        clef_ids_free(&p);
    }
    clef_ids_free(&a);
    clef_ids_free(&b);
    clef_ids_free(&c);
    clef_buf_free(&text);
    return 0;
}
