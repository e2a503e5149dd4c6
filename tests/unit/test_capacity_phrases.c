/* test_capacity_phrases.c — every refusal for a limit carries a phrase the
 * Decision Index kit recognises (issue 15 item 10).
 *
 * The kit (apolinario/decision-index, decision_index/engines/http.py) records
 * a 400/413/422 as "unsupported" only when the response body contains one of
 * CAPACITY_MARKERS below; anything else is logged as an error and retried on
 * resume.  Each case produces one refusal through the library's request path
 * (clef_request_parse, then clef_encode_record with the tiny tokenizer, as
 * the server does) and checks the exact status, type, param and message, and
 * that the message holds a marker.  The two "too many tokens: ..." refusals
 * (no memory for a forward pass) cannot be provoked here; their texts start
 * with the marker itself (src/engine/engine.c, src/model/thinker.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "decision/encode.h"
#include "decision/request.h"
#include "testutil.h"
#include "util/buf.h"

/* The kit's CAPACITY_MARKERS, verbatim. */
static const char *const CAPACITY_MARKERS[] = {
    "options per choice",   "a choice needs at least two options", "a score takes 2 to 10 levels",
    "the canvas holds",     "maximum context length",              "maximum model length",
    "longer than the maximum model length", "context window",      "too many tokens",
};

static int has_marker(const char *message) {
    for (size_t i = 0; i < sizeof CAPACITY_MARKERS / sizeof *CAPACITY_MARKERS; i++)
        if (strstr(message, CAPACITY_MARKERS[i])) return 1;
    return 0;
}

typedef struct cap_case {
    const char *name;
    char *body;           /* owned */
    clef_limits lim;
    size_t max_length;    /* 0 = CLEF_DEFAULT_MAX_LENGTH */
    const char *type;     /* CLEF_E_CAPACITY, or CLEF_E_REQUEST for too few score levels */
    const char *param;
    char message[512];    /* exact */
} cap_case;

/* {"q":{"type":<type>,"criteria":<n generated options>}} x n_questions, with
 * `state` (JSON text) and `extra` (",\"images\":[...]" or ""). */
static char *body_of(const char *type, size_t n, size_t n_questions, const char *state, const char *extra) {
    clef_buf b = {0};
    clef_buf_printf(&b, "{\"model\":\"m\",\"state\":%s,\"questions\":{", state);
    for (size_t q = 0; q < n_questions; q++) {
        clef_buf_printf(&b, q ? ",\"q%zu\":" : "\"q%zu\":", q);
        clef_buf_printf(&b, "{\"type\":\"%s\",\"instructions\":\"Pick one.\"", type);
        if (strcmp(type, "noul")) {
            int obj = !strcmp(type, "choice");
            clef_buf_puts(&b, obj ? ",\"criteria\":{" : ",\"criteria\":[");
            for (size_t i = 0; i < n; i++) {
                if (i) clef_buf_putc(&b, ',');
                if (obj) clef_buf_printf(&b, "\"o%zu\":\"d\"", i);
                else clef_buf_printf(&b, "\"level %zu\"", i);
            }
            clef_buf_putc(&b, obj ? '}' : ']');
        }
        clef_buf_putc(&b, '}');
    }
    clef_buf_printf(&b, "}%s}", extra);
    return b.data;
}

/* ",\"<field>\":[url, url, ...]" with `n` copies of the data URL of fixture `rel`. */
static char *media_field(const char *field, const char *mime, const char *rel, size_t n, size_t *file_bytes) {
    char *path = tu_fixture(rel);
    size_t len;
    char *data = tu_read_file(path, &len);
    free(path);
    char *b64 = malloc(4 * (len / 3 + 1) + 1);
    EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)data, (int)len);
    clef_buf b = {0};
    clef_buf_printf(&b, ",\"%s\":[", field);
    for (size_t i = 0; i < n; i++) clef_buf_printf(&b, "%s\"data:%s;base64,%s\"", i ? "," : "", mime, b64);
    clef_buf_putc(&b, ']');
    free(b64);
    free(data);
    if (file_bytes) *file_bytes = len;
    return b.data;
}

static cap_case with_media(const char *name, const char *field, const char *mime, const char *rel, size_t n,
                           size_t *file_bytes) {
    char *extra = media_field(field, mime, rel, n, file_bytes);
    cap_case c = {.name = name, .body = body_of("noul", 0, 1, "\"x\"", extra), .lim = clef_limits_default(),
                  .type = CLEF_E_CAPACITY};
    free(extra);
    return c;
}

/* The message names the field of `param` first: "<id>: " for
 * "questions.<id>.criteria", "<param>: " for "images" or "images[0]" (the
 * request-wide "questions" and "state" are named by the text itself). */
static int names_field(const char *param, const char *message) {
    char want[128];
    if (!strcmp(param, "questions") || !strcmp(param, "state")) return 1;
    if (!strncmp(param, "questions.", 10)) {
        const char *id = param + 10, *dot = strchr(id, '.');
        snprintf(want, sizeof want, "%.*s: ", (int)(dot ? (size_t)(dot - id) : strlen(id)), id);
    } else {
        snprintf(want, sizeof want, "%s: ", param);
    }
    return !strncmp(message, want, strlen(want));
}

/* Run one case through parse + encode; returns the refusal. */
static clef_err refuse(const clef_tokenizer *tok, const cap_case *c) {
    clef_err err;
    clef_err_clear(&err);
    clef_request req;
    if (clef_request_parse(c->body, strlen(c->body), &c->lim, &req, &err) == 0) {
        clef_record rec;
        int rc = clef_encode_record(tok, &req, c->max_length ? c->max_length : CLEF_DEFAULT_MAX_LENGTH, 0, &rec, &err);
        if (rc == 0) {
            clef_record_free(&rec);
            clef_request_free(&req);
            fail_msg("%s: accepted", c->name);
        }
        clef_request_free(&req);
    }
    return err;
}

static void test_every_capacity_refusal_has_a_marker(void **state) {
    (void)state;
    clef_tokenizer *tok = tu_load_tokenizer();
    cap_case cases[24];
    size_t n = 0, bytes;

    /* rule 8: question, option and level limits */
    cases[n] = (cap_case){"65 questions", body_of("noul", 0, 65, "\"x\"", ""), clef_limits_default(), 0,
                          CLEF_E_CAPACITY, "questions", "65 questions exceed the limit of 64 questions per context window"};
    n++;
    cases[n] = (cap_case){"256 options", body_of("choice", 256, 1, "\"x\"", ""), clef_limits_default(), 0,
                          CLEF_E_CAPACITY, "questions.q0.criteria", "q0: 256 options per choice exceed the limit of 255"};
    n++;
    cases[n] = (cap_case){"256 score levels", body_of("score", 256, 1, "\"x\"", ""), clef_limits_default(), 0,
                          CLEF_E_CAPACITY, "questions.q0.criteria",
                          "q0: 256 score levels exceed the limit of 255 options per choice"};
    n++;
    cases[n] = (cap_case){"1 score level", body_of("score", 1, 1, "\"x\"", ""), clef_limits_default(), 0,
                          CLEF_E_REQUEST, "questions.q0.criteria",
                          "q0: score criteria need at least 2 levels (got 1, below the minimum of 2 options per "
                          "choice)"};
    n++;
    cap_case tight = {"configured limits", body_of("score", 2, 1, "\"x\"", ""), clef_limits_default(), 0,
                      CLEF_E_REQUEST, "questions.q0.criteria",
                      "q0: score criteria need at least 3 levels (got 2, below the minimum of 3 options per choice)"};
    tight.lim.min_score_levels = 3;
    cases[n++] = tight;

    /* rules 10-11: the token window (schema alone; record without truncation) */
    cases[n] = (cap_case){"schema over the window", body_of("noul", 0, 1, "\"x\"", ""), clef_limits_default(), 40,
                          CLEF_E_CAPACITY, "questions",
                          "maximum context length: schema requires 137 tokens before state; maximum is 40"};
    n++;
    cases[n] = (cap_case){"record over the window", body_of("noul", 0, 1, "\"a b c d e f g h i j\"", ""),
                          clef_limits_default(), 145, CLEF_E_CAPACITY, "state",
                          "maximum context length: record requires more than 145 tokens; maximum is 145"};
    n++;

    /* media counts */
    cases[n] = with_media("5 images", "images", "image/png", "media/red_circle.png", 5, NULL);
    cases[n].param = "images";
    snprintf(cases[n++].message, 512, "images: 5 images exceed the limit of 4 images per context window");
    cases[n] = with_media("5 audio clips", "audio", "audio/wav", "media/tone_440hz_1.6s.wav", 5, NULL);
    cases[n].param = "audio";
    snprintf(cases[n++].message, 512, "audio: 5 audio clips exceed the limit of 4 audio clips per context window");
    cases[n] = with_media("3 videos", "videos", "video/x-matroska", "media/square.mkv", 3, NULL);
    cases[n].param = "videos";
    snprintf(cases[n++].message, 512, "videos: 3 videos exceed the limit of 2 videos per context window");
    cases[n] = with_media("an image with --max-images 0", "images", "image/png", "media/red_circle.png", 1, NULL);
    cases[n].lim.media.max_images = 0;
    cases[n].param = "images";
    snprintf(cases[n++].message, 512, "images: 1 images exceed the limit of 0 images per context window");

    /* media sizes: decoded bytes, pixels, durations */
    cases[n] = with_media("image bytes", "images", "image/png", "media/red_circle.png", 1, &bytes);
    cases[n].lim.media.max_image_bytes = bytes - 1;
    cases[n].param = "images[0]";
    snprintf(cases[n++].message, 512,
             "images[0]: image payload is invalid: payload is %zu bytes; the context window takes at most %zu bytes "
             "per item",
             bytes, bytes - 1);
    cases[n] = with_media("image pixels", "images", "image/png", "media/red_circle.png", 1, NULL);
    cases[n].lim.media.max_image_pixels = 256 * 256 - 1;
    cases[n].param = "images[0]";
    snprintf(cases[n++].message, 512,
             "images[0]: image payload is invalid: image is 256x256 = 65536 pixels; the canvas holds at most 65535 "
             "pixels");
    cases[n] = with_media("JPEG pixels", "images", "image/jpeg", "media/gradient.jpg", 1, NULL);
    cases[n].lim.media.max_image_pixels = 320 * 200 - 1;
    cases[n].param = "images[0]";
    snprintf(cases[n++].message, 512,
             "images[0]: image payload is invalid: image is 320x200 = 64000 pixels; the canvas holds at most 63999 "
             "pixels");
    cases[n] = with_media("audio bytes", "audio", "audio/wav", "media/tone_440hz_1.6s.wav", 1, &bytes);
    cases[n].lim.media.max_audio_bytes = bytes - 1;
    cases[n].param = "audio[0]";
    snprintf(cases[n++].message, 512,
             "audio[0]: audio payload is invalid: payload is %zu bytes; the context window takes at most %zu bytes "
             "per item",
             bytes, bytes - 1);
    cases[n] = with_media("audio seconds", "audio", "audio/wav", "media/tone_440hz_1.6s.wav", 1, NULL);
    cases[n].lim.media.max_audio_seconds = 1;
    cases[n].param = "audio[0]";
    snprintf(cases[n++].message, 512,
             "audio[0]: audio payload is invalid: audio lasts longer than 1 s, the most the context window takes");
    cases[n] = with_media("video bytes", "videos", "video/x-matroska", "media/square.mkv", 1, &bytes);
    cases[n].lim.media.max_video_bytes = bytes - 1;
    cases[n].param = "videos[0]";
    snprintf(cases[n++].message, 512,
             "videos[0]: video payload is invalid: payload is %zu bytes; the context window takes at most %zu bytes "
             "per item",
             bytes, bytes - 1);
    cases[n] = with_media("video seconds", "videos", "video/x-matroska", "media/square.mkv", 1, NULL);
    cases[n].lim.media.max_video_seconds = 1;
    cases[n].param = "videos[0]";
    snprintf(cases[n++].message, 512,
             "videos[0]: video payload is invalid: video lasts longer than 1 s, the most the context window takes");
    cases[n] = with_media("video frame pixels", "videos", "video/x-matroska", "media/square.mkv", 1, NULL);
    cases[n].lim.media.max_image_pixels = 128 * 96 - 1;
    cases[n].param = "videos[0]";
    snprintf(cases[n++].message, 512,
             "videos[0]: video payload is invalid: video is 128x96 = 12288 pixels a frame; the canvas holds at most "
             "12287 pixels");
    assert_true(n <= sizeof cases / sizeof *cases);

    for (size_t i = 0; i < n; i++) {
        const cap_case *c = &cases[i];
        clef_err err = refuse(tok, c);
        if (err.status != 422) fail_msg("%s: status %d (%s)", c->name, err.status, err.message);
        if (strcmp(err.type, c->type)) fail_msg("%s: type %s, want %s", c->name, err.type, c->type);
        if (strcmp(err.param, c->param)) fail_msg("%s: param '%s', want '%s'", c->name, err.param, c->param);
        if (strcmp(err.message, c->message)) fail_msg("%s: message\n  '%s'\nwant\n  '%s'", c->name, err.message, c->message);
        if (!has_marker(err.message)) fail_msg("%s: no Decision Index capacity marker in '%s'", c->name, err.message);
        if (!names_field(c->param, err.message))
            fail_msg("%s: message '%s' does not start with the field of %s", c->name, err.message, c->param);
        free(cases[i].body);
    }
    clef_tokenizer_free(tok);
}

/* Malformed media stay invalid_request: only limits are capacity. */
static void test_malformed_media_is_not_capacity(void **state) {
    (void)state;
    const char *body = "{\"model\":\"m\",\"state\":\"x\",\"questions\":{\"q\":{\"type\":\"noul\"}},"
                       "\"images\":[\"data:image/png;base64,AAAA\"]}";
    clef_limits lim = clef_limits_default();
    clef_request req;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_request_parse(body, strlen(body), &lim, &req, &err), -1);
    assert_int_equal(err.status, 422);
    assert_string_equal(err.type, CLEF_E_REQUEST);
    assert_string_equal(err.param, "images[0]");
    assert_string_equal(err.message, "images[0]: image payload is invalid: not a PNG, JPEG or WebP image");
    assert_false(has_marker(err.message));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_capacity_refusal_has_a_marker),
        cmocka_unit_test(test_malformed_media_is_not_capacity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
