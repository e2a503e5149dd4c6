/* test_tokenizer.c — the Qwen3 byte-level BPE tokenizer (SPEC.md §5).
 *
 * Expected ids come from tokenizer_goldens.jsonl (HF tokenizers) and, for the
 * extra edge cases below, from HF tokenizers run on the same tokenizer.json. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "text/pretok.h"
#include "text/tokenizer.h"

static clef_tokenizer *tok;  /* the fixture tokenizer, loaded once */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Timing bounds hold only for an optimised build without sanitizers. */
#if defined(__OPTIMIZE__) && !defined(__SANITIZE_ADDRESS__)
#define TIMED 1
#else
#define TIMED 0
#endif

static int setup(void **state) {
    clef_err err;
    clef_err_clear(&err);
    char *path = tu_fixture("tiny-clef-omni/tokenizer.json");
    double t0 = now_s();
    tok = clef_tokenizer_load(path, &err);
    double dt = now_s() - t0;
    free(path);
    if (!tok) {
        fprintf(stderr, "load failed: %s\n", err.message);
        return -1;
    }
    print_message("tokenizer.json (11.4 MB) loaded in %.3f s\n", dt);
    return 0;
}

static int teardown(void **state) {
    clef_tokenizer_free(tok);
    return 0;
}

/* Tokenize `s` (NUL-terminated) into a fresh vector, asserting success. */
static clef_ids tok_ok(const char *s, size_t len) {
    clef_ids ids = {0};
    clef_err err;
    clef_err_clear(&err);
    if (clef_tokenize(tok, s, len, &ids, &err) != 0) fail_msg("tokenize failed: %s", err.message);
    return ids;
}

static void assert_ids(const char *s, size_t len, const int32_t *want, size_t n) {
    clef_ids ids = tok_ok(s, len);
    if (ids.n != n) fail_msg("\"%s\": %zu ids, want %zu", s, ids.n, n);
    for (size_t i = 0; i < n; i++)
        if (ids.v[i] != want[i]) fail_msg("\"%s\": id[%zu] = %d, want %d", s, i, ids.v[i], want[i]);
    clef_ids_free(&ids);
}

#define ASSERT_IDS(s, ...)                                                  \
    do {                                                                    \
        static const int32_t want_[] = {__VA_ARGS__};                       \
        assert_ids(s, sizeof(s) - 1, want_, sizeof want_ / sizeof *want_); \
    } while (0)

/* 32-bit FNV-1a over the id values, as computed for the HF reference ids. */
static uint32_t ids_fnv(const clef_ids *ids) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < ids->n; i++) h = (h ^ (uint32_t)ids->v[i]) * 16777619u;
    return h;
}

/* ---- goldens ---- */

static void test_goldens_all_90(void **state) {
    char *path = tu_fixture("goldens/tokenizer_goldens.jsonl");
    size_t n;
    json_value **lines = tu_read_jsonl(path, &n);
    free(path);
    assert_int_equal(n, 90);
    for (size_t i = 0; i < n; i++) {
        const json_value *text = json_get(lines[i], "text"), *want = json_get(lines[i], "ids");
        assert_non_null(text);
        assert_non_null(want);
        clef_ids ids = tok_ok(text->str, text->len);
        if (ids.n != want->n) fail_msg("golden %zu (%.40s): %zu ids, want %zu", i, text->str, ids.n, want->n);
        for (size_t k = 0; k < ids.n; k++)
            if (ids.v[k] != tu_int_at(want, k))
                fail_msg("golden %zu (%.40s): id[%zu] = %d, want %lld", i, text->str, k, ids.v[k],
                         (long long)tu_int_at(want, k));
        clef_ids_free(&ids);
        json_free(lines[i]);
    }
    free(lines);
}

/* ---- vocabulary facts (SPEC §5 sizes and table) ---- */

static void test_vocab_facts(void **state) {
    assert_int_equal(clef_tokenizer_size(tok), 151676);
    assert_int_equal(clef_token_id(tok, "<|im_end|>"), 151645);
    assert_int_equal(clef_token_id(tok, "<|im_start|>"), 151644);
    assert_int_equal(clef_token_id(tok, "<|endoftext|>"), 151643);
    assert_int_equal(clef_token_id(tok, "<think>"), 151667);
    assert_int_equal(clef_token_id(tok, "<|audio_pad|>"), 151675);
    assert_int_equal(clef_token_id(tok, "system"), 8948);
    assert_int_equal(clef_token_id(tok, "user"), 872);
    assert_int_equal(clef_token_id(tok, "assistant"), 77091);
    assert_int_equal(clef_token_id(tok, "\xc4\x8a"), 198);          /* "Ċ" = "\n" */
    assert_int_equal(clef_token_id(tok, "\xc4\x8a\xc4\x8a"), 271);  /* "\n\n" */
    assert_int_equal(clef_token_id(tok, "\xc4\xa0"), 220);          /* "Ġ" = " " */
    assert_int_equal(clef_token_id(tok, "<|im_end|"), -1);
    assert_int_equal(clef_token_id(tok, ""), -1);
    assert_int_equal(clef_token_id(tok, NULL), -1);
    assert_int_equal(clef_token_id(tok, "\n"), -1);  /* raw bytes are not vocab entries */
}

/* ---- SPEC §3.5 constant pieces ---- */

static void test_spec_pieces(void **state) {
    ASSERT_IDS("<|im_start|>system\nRead the complete state and schema. Decide every field jointly. Each answer must "
               "be exactly one of that field's allowed options.<|im_end|>\n<|im_start|>user\nSTATE:\n",
               151644, 8948, 198, 4418, 279, 4583, 1584, 323, 10802, 13, 98881, 1449, 2070, 52158, 13, 8886, 4226, 1969,
               387, 6896, 825, 315, 429, 2070, 594, 5420, 2606, 13, 151645, 198, 151644, 872, 198, 24628, 510);
    ASSERT_IDS("\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:", 198, 151645,
               198, 151644, 77091, 198, 151667, 271, 151668, 271, 26145, 3221, 7531, 35839, 42817, 24211, 50, 25);
    ASSERT_IDS("{\"description\":\"Payments or invoices\",\"option_id\":\"billing\"}", 4913, 4684, 3252, 87646,
               476, 64052, 2198, 2047, 842, 3252, 38637, 9207);
    ASSERT_IDS("OPTION 1: ", 34057, 220, 16, 25, 220);
}

/* ---- edge inputs ---- */

static void test_empty(void **state) {
    clef_ids ids = {0};
    clef_ids_push(&ids, 7);
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_tokenize(tok, "", 0, &ids, &err), 0);
    assert_int_equal(clef_tokenize(tok, NULL, 0, &ids, &err), 0);
    assert_int_equal(ids.n, 1);  /* appends nothing, keeps what was there */
    assert_int_equal(ids.v[0], 7);
    clef_ids_free(&ids);
}

static void test_added_tokens(void **state) {
    ASSERT_IDS("<|im_start|", 27, 91, 318, 4906, 91);  /* a partial marker is ordinary text */
    ASSERT_IDS("abc<|im_end|>def", 13683, 151645, 750);
    ASSERT_IDS("<<|im_end|>>", 27, 151645, 29);
    ASSERT_IDS("<|im_end|><|im_end|>", 151645, 151645);
    ASSERT_IDS("<tts_text_bos_single><tts_text_bos>", 151674, 151672);  /* longest match */
    /* Appending keeps earlier ids: the encoder concatenates pieces this way. */
    clef_ids ids = tok_ok("abc", 3);
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_tokenize(tok, "<|im_end|>", 10, &ids, &err), 0);
    assert_int_equal(ids.n, 2);
    assert_int_equal(ids.v[0], 13683);
    assert_int_equal(ids.v[1], 151645);
    clef_ids_free(&ids);
}

static void test_invalid_utf8(void **state) {
    static const char *const bad[] = {
        "\xff",             "abc\x80",         "\xc0\xaf",         /* stray, continuation, overlong '/' */
        "\xe0\x80\xaf",     "\xed\xa0\x80",    "\xf4\x90\x80\x80", /* overlong, surrogate, > U+10FFFF */
        "\xe2\x82",         "ok\xf0\x9f\x98",  "\xf8\x88\x80\x80\x80",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        clef_ids ids = {0};
        clef_ids_push(&ids, 42);
        clef_err err;
        clef_err_clear(&err);
        assert_int_equal(clef_tokenize(tok, bad[i], strlen(bad[i]), &ids, &err), -1);
        assert_int_equal(err.status, 400);
        assert_string_equal(err.type, CLEF_E_REQUEST);
        assert_non_null(strstr(err.message, "UTF-8"));
        assert_int_equal(ids.n, 1);  /* nothing appended */
        clef_ids_free(&ids);
    }
    /* Valid extremes: NUL, U+FFFF, U+10FFFF. */
    ASSERT_IDS("a\0b", 64, 188, 65);
    clef_ids ids = tok_ok("\xf4\x8f\xbf\xbf", 4);
    assert_int_equal(ids.n, 4);
    clef_ids_free(&ids);
}

static void test_nfd_normalised_to_nfc(void **state) {
    ASSERT_IDS("Cafe\xcc\x81", 34, 2577, 963);  /* NFD "Café" */
    ASSERT_IDS("Caf\xc3\xa9", 34, 2577, 963);   /* NFC "Café" */
    ASSERT_IDS("e\xcc\x81", 963);
    ASSERT_IDS("\xe2\x84\xab", 144044);              /* U+212B ANGSTROM SIGN -> U+00C5 */
    ASSERT_IDS("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", 126317);  /* Hangul jamo -> U+AC01 */
    /* HF's NFC data predates these: U+1AC0 stays after U+0345, U+11935+U+11930 stays apart. */
    ASSERT_IDS("x\xcd\x85\xe1\xab\x80", 87, 137, 227, 157, 104, 222);
    ASSERT_IDS("\xf0\x91\xa4\xb5\xf0\x91\xa4\xb0", 128240, 97, 113, 128240, 97, 108);
    ASSERT_IDS("\xf0\x91\xa4\xb8", 128240, 97, 116);
}

static void test_regex_unicode(void **state) {
    ASSERT_IDS(" \xc2\x85!", 220, 126, 227, 0);  /* U+0085 (NEL) is \s */
    ASSERT_IDS("\xc2\x85.a", 126, 227, 5849);
    ASSERT_IDS("\xe3\x80\x80\xe3\x80\x80x", 22441, 22441, 87);     /* U+3000 is \s */
    ASSERT_IDS("a\xe3\x80\x80\xe3\x80\x80" "b", 64, 22441, 22441, 65);
    ASSERT_IDS("don\xe2\x80\x99t", 15007, 1405);                   /* curly quote: no contraction */
    ASSERT_IDS("\xf0\x9e\x93\x90've", 172, 252, 241, 238, 3003);   /* U+1E4D0 is a letter (Unicode 15) */
}

/* A 100 KB run of one character is one pre-token: the merge loop must stay fast. */
static void check_run(const char *unit, size_t reps, size_t want_n, uint32_t want_fnv, int32_t want_id) {
    size_t ul = strlen(unit);
    char *s = malloc(ul * reps + 1);
    for (size_t i = 0; i < reps; i++) memcpy(s + i * ul, unit, ul);
    double t0 = now_s();
    clef_ids ids = tok_ok(s, ul * reps);
    double dt = now_s() - t0;
    print_message("run of %zu x \"%s\": %zu ids in %.3f s\n", reps, unit, ids.n, dt);
    assert_int_equal(ids.n, want_n);
    assert_int_equal(ids_fnv(&ids), want_fnv);
    if (want_id >= 0) assert_int_equal(ids.v[0], want_id);
    if (TIMED) assert_true(dt < 1.0);
    clef_ids_free(&ids);
    free(s);
}

static void test_long_runs(void **state) {
    check_run("x", 100000, 12500, 3453970581u, 44102);
    check_run(" ", 100000, 782, 4004670747u, 56940);
    check_run("\xc3\xa9", 50000, 50000, 3307091029u, 963);
    check_run("e\xcc\x81", 33333, 33333, 2380976702u, 963);
    check_run("1", 100000, 100000, 235836997u, 16);
    check_run("<", 100000, 12500, 3289655253u, 82128);
    check_run("<|im_end|>", 10000, 10000, 535725941u, 151645);
    check_run("\xe6\x9d\xb1", 33333, 33333, 547491683u, 102356);
}

/* A state of ~64k tokens: the goldens file 13 times over (96 KB of mixed text). */
static void test_state_64k(void **state) {
    char *path = tu_fixture("goldens/tokenizer_goldens.jsonl");
    size_t len;
    char *g = tu_read_file(path, &len);
    free(path);
    char *s = malloc(len * 13);
    for (int i = 0; i < 13; i++) memcpy(s + i * len, g, len);
    double t0 = now_s();
    clef_ids ids = tok_ok(s, len * 13);
    double dt = now_s() - t0;
    print_message("%zu-byte state: %zu ids in %.3f s\n", len * 13, ids.n, dt);
    assert_int_equal(ids.n, 64207);
    assert_int_equal(ids_fnv(&ids), 32097916u);
    if (TIMED) assert_true(dt < 1.0);
    clef_ids_free(&ids);
    free(s);
    free(g);
}

/* ---- concurrency: one loaded tokenizer, several threads ---- */

static void *thread_body(void *arg) {
    const clef_ids *want = arg;
    static const char text[] = "<|im_start|>user\nCaf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac don't 12345!!<|im_end|>";
    for (int round = 0; round < 200; round++) {
        clef_ids ids = {0};
        if (clef_tokenize(tok, text, sizeof text - 1, &ids, NULL) != 0 || ids.n != want->n ||
            memcmp(ids.v, want->v, ids.n * sizeof *ids.v) != 0) {
            clef_ids_free(&ids);
            return (void *)1;
        }
        clef_ids_free(&ids);
    }
    return NULL;
}

static void test_threads(void **state) {
    static const char text[] = "<|im_start|>user\nCaf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac don't 12345!!<|im_end|>";
    clef_ids want = tok_ok(text, sizeof text - 1);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, thread_body, &want), 0);
    for (int i = 0; i < 4; i++) {
        void *rv;
        pthread_join(th[i], &rv);
        assert_null(rv);
    }
    clef_ids_free(&want);
}

/* ---- the Split regex: JIT and interpreter agree; pieces cover the text ---- */

static const char qwen_pattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                   "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef struct pieces {
    size_t v[4096][2];
    size_t n;
} pieces;

static int collect(void *ctx, const char *text, size_t start, size_t end) {
    pieces *p = ctx;
    if (p->n < 4096) p->v[p->n][0] = start, p->v[p->n][1] = end;
    p->n++;
    return 0;
}

static void test_split_jit_matches_interpreter(void **state) {
    clef_err err;
    clef_err_clear(&err);
    pretok_regex *jit = pretok_regex_compile_opts(qwen_pattern, strlen(qwen_pattern), 1, &err);
    pretok_regex *interp = pretok_regex_compile_opts(qwen_pattern, strlen(qwen_pattern), 0, &err);
    assert_non_null(jit);
    assert_non_null(interp);
    char *path = tu_fixture("goldens/tokenizer_goldens.jsonl");
    size_t n;
    json_value **lines = tu_read_jsonl(path, &n);
    free(path);
    static pieces a, b;
    for (size_t i = 0; i < n; i++) {
        const json_value *text = json_get(lines[i], "text");
        a.n = b.n = 0;
        assert_int_equal(pretok_split(jit, text->str, text->len, collect, &a, &err), 0);
        assert_int_equal(pretok_split(interp, text->str, text->len, collect, &b, &err), 0);
        assert_int_equal(a.n, b.n);
        assert_memory_equal(a.v, b.v, (a.n < 4096 ? a.n : 4096) * sizeof a.v[0]);
        size_t at = 0;  /* Isolated: contiguous pieces covering everything */
        for (size_t k = 0; k < a.n && k < 4096; k++) {
            assert_int_equal(a.v[k][0], at);
            assert_true(a.v[k][1] > a.v[k][0]);
            at = a.v[k][1];
        }
        if (a.n <= 4096) assert_int_equal(at, text->len);
        json_free(lines[i]);
    }
    free(lines);
    /* "hello  world\n\n x": the \s+(?!\S) alternative leaves one space to the word. */
    a.n = 0;
    assert_int_equal(pretok_split(interp, "hello  world\n\n x", 16, collect, &a, &err), 0);
    assert_int_equal(a.n, 5);
    static const size_t want[5][2] = {{0, 5}, {5, 6}, {6, 12}, {12, 14}, {14, 16}};
    assert_memory_equal(a.v, want, sizeof want);
    pretok_regex_free(jit);
    pretok_regex_free(interp);
}

static void test_split_refuses_untranslatable(void **state) {
    static const char *const bad[] = {"[^\\S]", "[a[b]]", "[a&&b]", "\\h+", "(", "abc\\"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        clef_err err;
        clef_err_clear(&err);
        assert_null(pretok_regex_compile(bad[i], strlen(bad[i]), &err));
        assert_int_equal(err.status, 500);
    }
}

/* ---- a tiny synthetic tokenizer.json: both merge formats, ranks, errors ---- */

/* Write a tokenizer.json: the 256 byte-level symbols get ids 0..255 (byte
 * value order), `extra_vocab` is spliced into the vocab object, `merges` is
 * the JSON merges array, `model_extra`/`normalizer` are raw JSON. */
static char *write_tokenizer(const char *extra_vocab, const char *merges, const char *model_extra,
                             const char *normalizer, int with_bytes) {
    clef_buf b = {0};
    clef_buf_puts(&b, "{\"version\":\"1.0\",\"added_tokens\":[");
    clef_buf_puts(&b, "{\"id\":300,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
                      "\"normalized\":false,\"special\":true},");
    clef_buf_puts(&b, "{\"id\":301,\"content\":\"<s>x\",\"normalized\":false,\"special\":false}],");
    clef_buf_printf(&b, "\"normalizer\":%s,", normalizer);
    clef_buf_printf(&b, "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                        "{\"Regex\":\"%s\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
                        "\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]},",
                    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}"
                    "\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+");
    clef_buf_printf(&b, "\"post_processor\":null,\"decoder\":null,\"model\":{\"type\":\"BPE\"%s,\"vocab\":{",
                    model_extra);
    int k = 0;  /* rank among the 68 remapped bytes */
    for (int x = 0; x < 256 && with_bytes; x++) {
        int kept = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE);
        unsigned cp = kept ? (unsigned)x : 0x100 + (unsigned)k++;
        if (cp == '"' || cp == '\\') clef_buf_printf(&b, "\"\\%c\":%d,", cp, x);
        else if (cp < 0x80) clef_buf_printf(&b, "\"%c\":%d,", cp, x);
        else clef_buf_printf(&b, "\"\\u%04x\":%d,", cp, x);
    }
    clef_buf_printf(&b, "%s},\"merges\":%s}}", extra_vocab, merges);
    char *path = strdup("/tmp/clef_tok_test_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b.data, b.len), (ssize_t)b.len);
    close(fd);
    clef_buf_free(&b);
    return path;
}

#define SYN_VOCAB "\"ab\":256,\"abc\":257,\"\\u0120a\":258,\"aa\":260"

static clef_tokenizer *load_synthetic(const char *merges, const char *model_extra, const char *normalizer,
                                      int with_bytes, clef_err *err) {
    char *path = write_tokenizer(SYN_VOCAB, merges, model_extra, normalizer, with_bytes);
    clef_err_clear(err);
    clef_tokenizer *t = clef_tokenizer_load(path, err);
    if (!t) assert_non_null(strstr(err->message, path));  /* load errors name the file */
    unlink(path);
    free(path);
    return t;
}

static void syn_expect(clef_tokenizer *t, const char *text, const int32_t *want, size_t n) {
    clef_ids ids = {0};
    assert_int_equal(clef_tokenize(t, text, strlen(text), &ids, NULL), 0);
    if (ids.n != n) fail_msg("\"%s\": %zu ids, want %zu", text, ids.n, n);
    for (size_t i = 0; i < n; i++) assert_int_equal(ids.v[i], want[i]);
    clef_ids_free(&ids);
}

#define SYN_EXPECT(t, s, ...)                                          \
    do {                                                               \
        static const int32_t w_[] = {__VA_ARGS__};                     \
        syn_expect(t, s, w_, sizeof w_ / sizeof *w_);                  \
    } while (0)

static void test_synthetic_string_merges(void **state) {
    clef_err err;
    clef_tokenizer *t = load_synthetic("[\"a b\",\"ab c\",\"\\u0120 a\",\"a a\"]", "", "{\"type\":\"NFC\"}", 1, &err);
    assert_non_null(t);
    assert_int_equal(clef_tokenizer_size(t), 302);
    SYN_EXPECT(t, "abc abd", 257, 32, 256, 100);  /* "a b" (rank 0) beats "Ġ a" (rank 2) */
    SYN_EXPECT(t, "aaaaa", 260, 260, 97);          /* equal rank: leftmost first */
    SYN_EXPECT(t, "<s>x<s>", 301, 300);            /* longest added token */
    SYN_EXPECT(t, "\n", 0x0A);                     /* byte 0x0A -> U+010A, id 10 here */
    assert_int_equal(clef_token_id(t, "<s>x"), 301);
    assert_int_equal(clef_token_id(t, "abc"), 257);
    clef_tokenizer_free(t);
}

static void test_synthetic_array_merges(void **state) {
    clef_err err;
    clef_tokenizer *t =
        load_synthetic("[[\"\\u0120\",\"a\"],[\"a\",\"b\"],[\"ab\",\"c\"],[\"a\",\"a\"]]", "", "null", 1, &err);
    assert_non_null(t);
    SYN_EXPECT(t, "abc abd", 257, 258, 98, 100);  /* now "Ġ a" has rank 0 */
    SYN_EXPECT(t, "aaa", 260, 97);
    clef_tokenizer_free(t);
}

static void test_load_errors(void **state) {
    clef_err err;
    clef_err_clear(&err);
    assert_null(clef_tokenizer_load("/nonexistent/dir/tokenizer.json", &err));
    assert_int_equal(err.status, 500);
    assert_string_equal(err.type, CLEF_E_INTERNAL);
    assert_non_null(strstr(err.message, "/nonexistent/dir/tokenizer.json"));

    char *path = strdup("/tmp/clef_tok_bad_XXXXXX");
    int fd = mkstemp(path);
    assert_int_equal(write(fd, "{\"model\":", 9), 9);
    close(fd);
    clef_err_clear(&err);
    assert_null(clef_tokenizer_load(path, &err));
    assert_int_equal(err.status, 500);
    assert_non_null(strstr(err.message, path));
    unlink(path);
    free(path);

    static const struct { const char *merges, *model_extra, *normalizer, *want; int bytes; } cases[] = {
        {"[\"a q\"]", "", "null", "merges[0]", 1},                 /* "aq" not in vocab */
        {"[\"a  b\"]", "", "null", "merges[0]", 1},                /* two spaces */
        {"[[\"a\"]]", "", "null", "merges[0]", 1},                 /* one-element array */
        {"[]", "", "{\"type\":\"NFKC\"}", "NFC", 1},               /* unsupported normalizer */
        {"[]", ",\"byte_fallback\":true", "null", "byte_fallback", 1},
        {"[]", ",\"dropout\":0.1", "null", "dropout", 1},
        {"[]", "", "null", "byte-level symbol", 0},                /* vocab lacks the 256 bytes */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        assert_null(load_synthetic(cases[i].merges, cases[i].model_extra, cases[i].normalizer, cases[i].bytes, &err));
        assert_int_equal(err.status, 500);
        if (!strstr(err.message, cases[i].want)) fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err.message, cases[i].want);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens_all_90),
        cmocka_unit_test(test_vocab_facts),
        cmocka_unit_test(test_spec_pieces),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_nfd_normalised_to_nfc),
        cmocka_unit_test(test_regex_unicode),
        cmocka_unit_test(test_long_runs),
        cmocka_unit_test(test_state_64k),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_split_jit_matches_interpreter),
        cmocka_unit_test(test_split_refuses_untranslatable),
        cmocka_unit_test(test_synthetic_string_merges),
        cmocka_unit_test(test_synthetic_array_merges),
        cmocka_unit_test(test_load_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
