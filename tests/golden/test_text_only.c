/* test_text_only.c — an engine opened with clef_engine_options.text_only
 * binds no media towers: text requests answer byte for byte as with the
 * towers loaded, and a request with an image is a 422 naming "images".  A
 * malformed image, audio or video payload gets that same text-only 422 (it
 * is refused before it is decoded), not the decoder's complaint. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "engine/engine.h"
#include "testutil.h"

static clef_engine *open_engine(int text_only) {
    char *dir = tu_fixture("tiny-clef-omni");
    clef_engine_options opt = {.model_dir = dir, .device = "cpu", .n_threads = 1, .text_only = text_only};
    clef_err err;
    clef_err_clear(&err);
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e) fail_msg("cannot open %s: %s", dir, err.message);
    free(dir);
    return e;
}

static int decide(clef_engine *e, const char *body, clef_buf *out, clef_err *err) {
    clef_err_clear(err);
    return clef_engine_decide(e, body, strlen(body), NULL, out, err);
}

/* err is the text-only engine's answer to a request with media in `field`:
 * status, param and message exactly. */
static void expect_text_only(const clef_err *err, const char *field) {
    char want[256];
    snprintf(want, sizeof want,
             "%s: media inputs are not available with this checkpoint (text-only: the media towers were not loaded)",
             field);
    assert_int_equal(err->status, 422);
    assert_string_equal(err->param, field);
    assert_string_equal(err->message, want);
}

/* Malformed payloads: the engine with towers gives the decoder's 422 on the
 * item (so they really are malformed); the text-only one gives exactly its
 * text-only 422, the same as for a well-formed payload. */
static void test_malformed_media(void **state) {
    (void)state;
    clef_engine *full = open_engine(0), *text = open_engine(1);
    static const struct {
        const char *field, *payload, *want; /* want: the decoder's message with the towers loaded */
    } cases[] = {
        {"images", "data:image/png;base64,AAAA", "images[0]: image payload is invalid"},
        {"images", "/etc/hostname", "images[0]: image payload is invalid: not a data URL"},
        {"audio", "data:audio/wav;base64,!!!!", "audio[0]: audio payload is invalid"},
        {"audio", "data:audio/wav;base64,AAAA", "audio[0]: audio payload is invalid"},
        {"videos", "data:video/x-matroska;base64,AAAA", "videos[0]: video payload is invalid"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"model\":\"clef-omni\",\"state\":\"What is attached?\",\"questions\":{\"red\":{\"type\":"
                 "\"noul\",\"instructions\":\"Is it red?\"}},\"%s\":[\"%s\"]}",
                 cases[i].field, cases[i].payload);
        clef_buf out = {0};
        clef_err err;
        assert_int_equal(decide(full, body, &out, &err), -1);
        assert_int_equal(err.status, 422);
        if (strncmp(err.message, cases[i].want, strlen(cases[i].want)))
            fail_msg("case %zu with towers: %s", i, err.message);
        assert_int_equal(decide(text, body, &out, &err), -1);
        expect_text_only(&err, cases[i].field);
        assert_int_equal(out.len, 0);
    }
    clef_engine_close(full);
    clef_engine_close(text);
}

static void test_text_only(void **state) {
    (void)state;
    clef_engine *full = open_engine(0), *text = open_engine(1);
    const char *req = "{\"model\":\"clef-omni\",\"state\":\"Refund my order, it arrived broken.\","
                      "\"questions\":{\"route\":{\"type\":\"choice\",\"instructions\":\"Which team?\","
                      "\"criteria\":{\"billing\":\"Payments\",\"shipping\":\"Deliveries\"}},"
                      "\"urgent\":{\"type\":\"noul\",\"instructions\":\"Is it urgent?\"}}}";
    clef_buf a = {0}, b = {0};
    clef_err err;
    if (decide(full, req, &a, &err) != 0) fail_msg("%s", err.message);
    assert_int_equal(decide(text, req, &b, &err), 0);
    assert_int_equal(a.len, b.len);
    assert_memory_equal(a.data, b.data, a.len);

    /* a real PNG from the media fixtures as a data URL */
    char *png_path = tu_fixture("media/red_circle.png");
    size_t n = 0;
    char *png = tu_read_file(png_path, &n);
    char *b64 = malloc(4 * (n / 3 + 1) + 1);
    EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)png, (int)n);
    const char *fmt = "{\"model\":\"clef-omni\",\"state\":\"What is in the picture?\","
                      "\"questions\":{\"red\":{\"type\":\"noul\",\"instructions\":\"Is it red?\"}},\"images\":[\"data:image/png;base64,%s\"]}";
    size_t cap = strlen(fmt) + strlen(b64) + 1;
    char *media_req = malloc(cap);
    snprintf(media_req, cap, fmt, b64);
    clef_buf c = {0}, d = {0};
    if (decide(full, media_req, &c, &err) != 0) fail_msg("%s", err.message); /* the towers answer it */
    assert_int_equal(decide(text, media_req, &d, &err), -1);
    expect_text_only(&err, "images");
    assert_int_equal(d.len, 0);

    clef_buf_free(&a), clef_buf_free(&b), clef_buf_free(&c), clef_buf_free(&d);
    free(media_req), free(b64), free(png), free(png_path);
    clef_engine_close(full);
    clef_engine_close(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_text_only), cmocka_unit_test(test_malformed_media)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
