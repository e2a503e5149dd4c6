/* test_tokenizer_long.c — long inputs through the tokenizer:
 *   - the whitespace-run rule of text/pretok.c (long runs split without
 *     PCRE2) gives exactly PCRE2's pieces, and the rank-bucket merge of long
 *     pieces (text/bpe.c) exactly the binary heap's ids, on random mixtures
 *     of spaces, tabs, newlines, CR LF, Unicode spaces, letters, digits, CJK,
 *     emoji, punctuation, contractions, NFD text and added tokens (both new
 *     paths forced on every run and piece, against both off);
 *   - 16 MiB of spaces and 12 MiB of tabs tokenize (they failed with 500
 *     "split regex failed at byte 0: match limit exceeded"), to the ids the
 *     vocabulary implies;
 *   - clef_tokenize_bounded stops early: with keep_prefix the ids it gives
 *     are the first ids of the whole encoding; without, its count is a
 *     lower bound, and a 16 MiB state is refused from its size at once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"
#include "text/pretok.h"
#include "text/tokenizer.h"

static clef_tokenizer *tok;
static pretok_regex *re;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int setup(void **state) {
    tok = tu_load_tokenizer();
    clef_err err;
    clef_err_clear(&err);
    re = pretok_regex_compile(PRETOK_QWEN2_PATTERN, strlen(PRETOK_QWEN2_PATTERN), &err);
    return tok && re ? 0 : -1;
}

static int teardown(void **state) {
    clef_tokenizer_free(tok);
    pretok_regex_free(re);
    return 0;
}

/* ---- random mixtures ---- */

static const char *const ATOMS[] = {
    " ", " ", " ", "\t", "\n", "\r\n", "\r", "\x0b", "\x0c", "\xe3\x80\x80" /* U+3000 */, "\xc2\xa0" /* NBSP */,
    "\xe2\x80\xa8" /* U+2028 */, "\xc2\x85" /* NEL */, "\xe2\x80\x83" /* EM SPACE */, "a", "word", "Z", "\xc3\xa9",
    "e\xcc\x81" /* NFD */, "\xd0\xb6", "\xe6\x9d\xb1", "\xe4\xba\xac", "\xf0\x9f\x98\x80" /* emoji */,
    "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x92\xbb" /* ZWJ sequence */, "1", "42", "\xd9\xa3" /* Arabic-Indic 3 */, "!",
    "...", "'s", "'ll", "'", "-", "(", "\xe3\x80\x82" /* 。 */, "<|im_end|>", "<|im_start|", "\\", "\"",
};
#define N_ATOMS (sizeof ATOMS / sizeof *ATOMS)

/* Repeat counts: mostly 1, sometimes long, rarely very long. */
static size_t reps(uint64_t *rng) {
    uint64_t r = tu_rand_u64(rng) % 1000;
    if (r < 550) return 1;
    if (r < 850) return 2 + tu_rand_u64(rng) % 4;
    if (r < 980) return 6 + tu_rand_u64(rng) % 95;
    return 100 + tu_rand_u64(rng) % 3000;
}

static void random_text(uint64_t *rng, size_t target, clef_buf *b) {
    b->len = 0;
    while (b->len < target) {
        const char *a = ATOMS[tu_rand_u64(rng) % N_ATOMS];
        size_t k = reps(rng);
        if (tu_rand_u64(rng) % 200 == 0 && (a[0] == ' ' || a[0] == '\n' || a[0] == '\t')) k = 20000; /* a long run */
        for (size_t i = 0; i < k; i++) clef_buf_puts(b, a);
    }
    clef_buf_reserve(b, 0);
}

typedef struct piece_list {
    size_t (*v)[2];
    size_t n, cap;
} piece_list;

static int collect(void *ctx, const char *text, size_t start, size_t end) {
    piece_list *p = ctx;
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 1024;
        p->v = realloc(p->v, p->cap * sizeof *p->v);
    }
    p->v[p->n][0] = start, p->v[p->n][1] = end;
    p->n++;
    return 0;
}

static void assert_same_ids(const clef_ids *a, const clef_ids *b, const char *what, size_t text_i) {
    if (a->n != b->n) fail_msg("text %zu: %s gives %zu ids, PCRE2 + heap %zu", text_i, what, b->n, a->n);
    for (size_t i = 0; i < a->n; i++)
        if (a->v[i] != b->v[i]) fail_msg("text %zu: %s differs at id %zu (%d vs %d)", text_i, what, i, b->v[i], a->v[i]);
}

static void test_random_mixtures(void **state) {
    uint64_t rng = 0x5eed1234abcdULL;
    clef_buf text = {0};
    piece_list plain = {0}, fast = {0};
    size_t bytes = 0, ids_total = 0, runs_long = 0;
    for (size_t t = 0; t < 160; t++) {
        random_text(&rng, 2000 + tu_rand_u64(&rng) % 30000, &text);
        bytes += text.len;
        /* pieces: every run through PCRE2, against every run of two or more bytes by the rule */
        clef_err err;
        clef_err_clear(&err);
        plain.n = fast.n = 0;
        assert_int_equal(pretok_split_ws(re, text.data, text.len, 0, collect, &plain, &err), 0);
        assert_int_equal(pretok_split_ws(re, text.data, text.len, 1, collect, &fast, &err), 0);
        if (plain.n != fast.n) fail_msg("text %zu: %zu pieces by PCRE2, %zu with the run rule", t, plain.n, fast.n);
        for (size_t i = 0; i < plain.n; i++)
            if (plain.v[i][0] != fast.v[i][0] || plain.v[i][1] != fast.v[i][1])
                fail_msg("text %zu: piece %zu is [%zu,%zu) by PCRE2, [%zu,%zu) with the run rule", t, i,
                         plain.v[i][0], plain.v[i][1], fast.v[i][0], fast.v[i][1]);
        for (size_t i = 0; i < plain.n; i++) runs_long += plain.v[i][1] - plain.v[i][0] >= 256;
        /* ids: both new paths off, both forced on, and the defaults */
        clef_ids a = {0}, b = {0}, c = {0};
        assert_int_equal(clef_tokenize_tuned(tok, text.data, text.len, 0, SIZE_MAX, &a, &err), 0);
        assert_int_equal(clef_tokenize_tuned(tok, text.data, text.len, 1, 2, &b, &err), 0);
        assert_int_equal(clef_tokenize(tok, text.data, text.len, &c, &err), 0);
        assert_same_ids(&a, &b, "run rule + rank buckets everywhere", t);
        assert_same_ids(&a, &c, "clef_tokenize", t);
        ids_total += a.n;
        clef_ids_free(&a);
        clef_ids_free(&b);
        clef_ids_free(&c);
    }
    print_message("160 random texts, %zu bytes, %zu ids, %zu pieces of 256+ bytes: identical\n", bytes, ids_total,
                  runs_long);
    assert_true(runs_long > 20); /* the long paths did run */
    free(plain.v);
    free(fast.v);
    clef_buf_free(&text);
}

/* Short texts made mostly of whitespace of every kind, with one character of
 * each other class between: every run boundary the rule must get right. */
static void test_whitespace_dense(void **state) {
    static const char *const ws_atoms[] = {" ", " ", "\t", "\n", "\r", "\r\n", "\x0b", "\xc2\xa0", "\xe3\x80\x80",
                                           "\xe2\x80\xa8", "\xc2\x85", "a", "\xc3\xa9", "1", "!", "'s", "\xe6\x9d\xb1",
                                           "-", "\xf0\x9f\x98\x80", "\x00"};
    const size_t n_atoms = sizeof ws_atoms / sizeof *ws_atoms;
    uint64_t rng = 0xdeadbeefULL;
    clef_buf text = {0};
    piece_list plain = {0}, fast = {0};
    for (int t = 0; t < 20000; t++) {
        text.len = 0;
        size_t k = 1 + tu_rand_u64(&rng) % 24;
        for (size_t i = 0; i < k; i++) {
            const char *a = ws_atoms[tu_rand_u64(&rng) % n_atoms];
            clef_buf_append(&text, a, a[0] ? strlen(a) : 1);
        }
        clef_err err;
        plain.n = fast.n = 0;
        assert_int_equal(pretok_split_ws(re, text.data, text.len, 0, collect, &plain, &err), 0);
        assert_int_equal(pretok_split_ws(re, text.data, text.len, 1, collect, &fast, &err), 0);
        int same = plain.n == fast.n;
        for (size_t i = 0; same && i < plain.n; i++)
            same = plain.v[i][0] == fast.v[i][0] && plain.v[i][1] == fast.v[i][1];
        if (!same) {
            clef_buf hex = {0};
            for (size_t i = 0; i < text.len; i++) clef_buf_printf(&hex, "%02x ", (unsigned char)text.data[i]);
            fail_msg("text %d (%s): %zu pieces by PCRE2, %zu with the run rule", t, hex.data, plain.n, fast.n);
        }
    }
    free(plain.v);
    free(fast.v);
    clef_buf_free(&text);
}

/* ---- the sizes that failed ---- */

/* `n` copies of byte `c`, tokenized: every id is the token of `per` copies. */
static void check_uniform_run(char c, size_t n, const char *sym, size_t per) {
    char *s = malloc(n);
    memset(s, c, n);
    char tokstr[1024] = "";
    for (size_t i = 0; i < per; i++) strcat(tokstr, sym);
    int32_t want = clef_token_id(tok, tokstr);
    assert_true(want >= 0);
    clef_ids ids = {0};
    clef_err err;
    clef_err_clear(&err);
    double t0 = now_s();
    int rc = clef_tokenize(tok, s, n, &ids, &err);
    double dt = now_s() - t0;
    if (rc) fail_msg("%zu x 0x%02x: %s", n, (unsigned)c, err.message);
    print_message("%zu x 0x%02x: %zu ids in %.2f s\n", n, (unsigned)c, ids.n, dt);
    assert_int_equal(ids.n, n / per);
    for (size_t i = 0; i < ids.n; i++)
        if (ids.v[i] != want) fail_msg("id %zu is %d, want %d", i, ids.v[i], want);
    clef_ids_free(&ids);
    /* one piece: the split alone */
    piece_list p = {0};
    assert_int_equal(pretok_split(re, s, n, collect, &p, &err), 0);
    assert_int_equal(p.n, 1);
    free(p.v);
    free(s);
}

static void test_16mib_spaces(void **state) { check_uniform_run(' ', (size_t)16 << 20, "\xc4\xa0", 128); }
static void test_12mib_tabs(void **state) { check_uniform_run('\t', (size_t)12 << 20, "\xc4\x89", 16); }

/* Long runs between words split as PCRE2 splits short ones. */
static void test_long_run_pieces(void **state) {
    const size_t n = (size_t)12 << 20;
    char *s = malloc(n + 8);
    clef_err err;
    clef_err_clear(&err);
    /* "x" + spaces + "y": "x", all spaces but one, " y" */
    s[0] = 'x';
    memset(s + 1, ' ', n);
    s[n + 1] = 'y';
    piece_list p = {0};
    assert_int_equal(pretok_split(re, s, n + 2, collect, &p, &err), 0);
    assert_int_equal(p.n, 3);
    assert_int_equal(p.v[1][0], 1);
    assert_int_equal(p.v[1][1], n);
    assert_int_equal(p.v[2][1], n + 2);
    /* "x\n" + spaces + "\n" + tabs + "!": one piece up to the last newline, then the tabs but one, "\t!" is
     * split into "\t" and "!" (a tab does not join punctuation) */
    p.n = 0;
    s[1] = '\n';
    s[n / 2] = '\n';
    memset(s + n / 2 + 1, '\t', n - n / 2);
    s[n + 1] = '!';
    assert_int_equal(pretok_split(re, s, n + 2, collect, &p, &err), 0);
    assert_int_equal(p.n, 5);
    assert_int_equal(p.v[1][0], 1);
    assert_int_equal(p.v[1][1], n / 2 + 1); /* "\n" + spaces + "\n" */
    assert_int_equal(p.v[2][1], n);         /* the tabs but the last */
    assert_int_equal(p.v[3][1], n + 1);     /* the last tab */
    assert_int_equal(p.v[4][1], n + 2);     /* "!" */
    free(p.v);
    free(s);
}

/* ---- bounded tokenizing ---- */

static void test_bounded_prefix_and_bound(void **state) {
    uint64_t rng = 0xb0b0ULL;
    clef_buf text = {0};
    int stopped = 0;
    for (int t = 0; t < 40; t++) {
        random_text(&rng, 30000 + tu_rand_u64(&rng) % 60000, &text);
        clef_ids full = {0};
        clef_err err;
        clef_err_clear(&err);
        assert_int_equal(clef_tokenize(tok, text.data, text.len, &full, &err), 0);
        size_t max_ids = full.n / 4 + tu_rand_u64(&rng) % (full.n / 2);
        /* keep_prefix: the first ids, exactly (all of them when the last piece was
         * the one that went past max_ids: then it is complete, rc 0) */
        clef_ids pre = {0};
        clef_ids_push(&pre, 7); /* appended after what is there */
        size_t n = 0;
        int rc = clef_tokenize_bounded(tok, text.data, text.len, max_ids, 1, &pre, &n, &err);
        assert_true(rc == 1 || (rc == 0 && n == full.n));
        assert_true(n > max_ids && n <= full.n);
        assert_int_equal(pre.n, 1 + n);
        assert_int_equal(pre.v[0], 7);
        assert_memory_equal(pre.v + 1, full.v, n * sizeof *full.v);
        stopped += rc == 1;
        /* no prefix: a lower bound above max_ids, nothing appended */
        clef_ids none = {0};
        rc = clef_tokenize_bounded(tok, text.data, text.len, max_ids, 0, &none, &n, &err);
        assert_true(rc == 1 || (rc == 0 && n == full.n));
        assert_true(n > max_ids && n <= full.n);
        assert_int_equal(none.n, rc == 1 ? 0 : full.n);
        none.n = 0;
        /* a budget it fits: complete, exact */
        rc = clef_tokenize_bounded(tok, text.data, text.len, full.n, 0, &none, &n, &err);
        assert_int_equal(rc, 0);
        assert_int_equal(n, full.n);
        assert_int_equal(none.n, full.n);
        clef_ids_free(&none);
        clef_ids_free(&pre);
        clef_ids_free(&full);
    }
    assert_true(stopped >= 30);
    clef_buf_free(&text);
}

/* A 16 MiB state against the default budget is refused from its bytes:
 * 16 MiB / 128 bytes per token at most = 131072 ids at least. */
static void test_bounded_huge_is_instant(void **state) {
    const size_t n = (size_t)16 << 20;
    char *s = malloc(n);
    memset(s, ' ', n);
    assert_int_equal(clef_tokenizer_max_token_bytes(tok), 128);
    clef_ids ids = {0};
    size_t at_least = 0;
    clef_err err;
    clef_err_clear(&err);
    double t0 = now_s();
    assert_int_equal(clef_tokenize_bounded(tok, s, n, 64000, 0, &ids, &at_least, &err), 1);
    print_message("16 MiB of spaces, budget 64000: refused in %.4f s\n", now_s() - t0);
    assert_int_equal(at_least, 131072);
    assert_int_equal(ids.n, 0);
    /* words: stops after about 64000 ids, with a true lower bound */
    for (size_t i = 0; i + 5 <= n; i += 5) memcpy(s + i, "word ", 5);
    t0 = now_s();
    assert_int_equal(clef_tokenize_bounded(tok, s, n, 64000, 1, &ids, &at_least, &err), 1);
    print_message("16 MiB of words, budget 64000: stopped after %zu ids in %.4f s\n", at_least, now_s() - t0);
    assert_int_equal(at_least, 64001);
    assert_int_equal(ids.n, 64001);
    clef_ids_free(&ids);
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_mixtures),
        cmocka_unit_test(test_whitespace_dense),
        cmocka_unit_test(test_16mib_spaces),
        cmocka_unit_test(test_12mib_tabs),
        cmocka_unit_test(test_long_run_pieces),
        cmocka_unit_test(test_bounded_prefix_and_bound),
        cmocka_unit_test(test_bounded_huge_is_instant),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
