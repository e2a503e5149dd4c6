/* Media outside the wire format (issue 6): `clef decide` reads file paths
 * in images/audio/videos and sends them as data URLs (the answer must be
 * identical to the data-URL request's), `clef serve`'s media limit
 * flags reach the request validator (422 naming the field over HTTP), and
 * `clef serve --text-only` refuses any media payload with one 422. */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "httputil.h"
#include "testutil.h"
#include "util/buf.h"

static char tmpdir[64];

static int setup(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/clef-media-paths-XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    return 0;
}

static int teardown(void **state) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* "data:<mime>;base64,<bytes of fixture media/<name>>" (OpenSSL's encoder,
 * independent of the CLI's). */
static char *data_url(const char *mime, const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "media/%s", name);
    char *path = tu_fixture(rel);
    size_t n;
    char *bytes = tu_read_file(path, &n);
    free(path);
    size_t head = strlen(mime) + 14;
    char *url = malloc(head + 4 * ((n + 2) / 3) + 1);
    int k = snprintf(url, head + 1, "data:%s;base64,", mime);
    EVP_EncodeBlock((unsigned char *)url + k, (const unsigned char *)bytes, (int)n);
    free(bytes);
    return url;
}

/* A request asking about a picture and a sound, with the given media
 * members (",\"images\":[...]" etc., or ""). */
static char *request(const char *media) {
    clef_buf b = {0};
    clef_buf_printf(&b,
                    "{\"model\":\"clef-omni\",\"state\":\"What is in the attachment?\",\"questions\":{"
                    "\"red\":{\"type\":\"noul\",\"instructions\":\"Is something red?\"},"
                    "\"shape\":{\"type\":\"choice\",\"criteria\":{\"circle\":\"round\",\"square\":\"four corners\","
                    "\"none\":\"no shape\"}}}%s}",
                    media);
    return b.data;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

/* `clef decide --debug` on `body`, run from the media fixture directory so
 * relative paths resolve there.  Returns the exit status, output in *out. */
static int decide(const char *body, clef_buf *out) {
    char req[128], cmd[2048];
    snprintf(req, sizeof req, "%s/request.json", tmpdir);
    write_file(req, body);
    snprintf(cmd, sizeof cmd, "cd '%s/media' && OMP_NUM_THREADS=1 %s decide --model %s/tiny-clef-omni --debug '%s' 2>&1",
             CLEF_FIXTURES, CLEF_BINARY, CLEF_FIXTURES, req);
    return tu_run_cmd(cmd, out);
}

/* The path request and the data-URL request give the same bytes out. */
static void expect_same_answer(const char *path_media, const char *url_media) {
    char *a = request(path_media), *b = request(url_media);
    clef_buf pa = {0}, pb = {0};
    int ra = decide(a, &pa), rb = decide(b, &pb);
    if (ra != 0 || rb != 0) fail_msg("exit %d / %d: %s / %s", ra, rb, pa.data, pb.data);
    assert_null(strstr(pa.data, "\"error\""));
    assert_non_null(strstr(pa.data, "\"debug\""));
    assert_string_equal(pa.data, pb.data);
    clef_buf_free(&pa);
    clef_buf_free(&pb);
    free(a);
    free(b);
}

/* input_tokens of a response. */
static long input_tokens(const char *resp) {
    const char *p = strstr(resp, "\"input_tokens\":");
    assert_non_null(p);
    return strtol(p + strlen("\"input_tokens\":"), NULL, 10);
}

static void test_image_path_equals_data_url(void **state) {
    char *url = data_url("image/png", "red_circle.png");
    clef_buf media = {0};
    clef_buf_printf(&media, ",\"images\":[\"%s\"]", url);
    expect_same_answer(",\"images\":[\"red_circle.png\"]", media.data);

    /* the image really went in: 256x256 -> 16x16 patches -> 64 tokens more than the text alone */
    clef_buf with = {0}, without = {0};
    char *a = request(",\"images\":[\"red_circle.png\"]"), *b = request("");
    assert_int_equal(decide(a, &with), 0);
    assert_int_equal(decide(b, &without), 0);
    long extra = input_tokens(with.data) - input_tokens(without.data);
    assert_true(extra >= 64);
    clef_buf_free(&with);
    clef_buf_free(&without);
    clef_buf_free(&media);
    free(a);
    free(b);
    free(url);
}

/* Sniffing WAV and Matroska (the soundtrack joins the audio batch, so a
 * wrong MIME top-level type would be refused). */
static void test_audio_and_video_paths(void **state) {
    char *wav = data_url("audio/wav", "tone_440hz_1.6s.wav");
    char *mkv = data_url("video/x-matroska", "square_1s_audio.mkv");
    clef_buf media = {0};
    clef_buf_printf(&media, ",\"audio\":[\"%s\"],\"videos\":[\"%s\"]", wav, mkv);
    /* a path and a data URL mixed in one field works too */
    expect_same_answer(",\"audio\":[\"./tone_440hz_1.6s.wav\"],\"videos\":[\"square_1s_audio.mkv\"]", media.data);
    clef_buf_free(&media);
    free(wav);
    free(mkv);
}

static void expect_error(const char *media, int status, const char *want) {
    char *body = request(media);
    clef_buf out = {0};
    int rc = decide(body, &out);
    if (rc != status || !strstr(out.data, want)) fail_msg("exit %d, want %d; output %s; want %s", rc, status, out.data, want);
    clef_buf_free(&out);
    free(body);
}

static void test_path_errors(void **state) {
    /* an unreadable file is a rejected request naming the field: exact body, exit 2 */
    expect_error(",\"images\":[\"red_circle.png\",\"nope.png\"]", 2,
                 "{\"error\":{\"message\":\"images[1]: cannot read file 'nope.png': No such file or directory\","
                 "\"type\":\"invalid_request\",\"param\":\"images[1]\"}}\n");
    expect_error(",\"audio\":[\"..\"]", 2, "audio[0]: cannot read file '..': Is a directory");
    expect_error(",\"videos\":[\"https://example.com/a.mp4\"]", 2,
                 "videos[0]: URLs are not fetched; give a file path or a data URL");

    /* the bytes win over the extension: a PNG named .wav is image/png, which audio refuses */
    char fake[128], media[256];
    snprintf(fake, sizeof fake, "%s/circle.wav", tmpdir);
    char *png = tu_fixture("media/red_circle.png");
    size_t n;
    char *bytes = tu_read_file(png, &n);
    FILE *f = fopen(fake, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    fclose(f);
    snprintf(media, sizeof media, ",\"audio\":[\"%s\"]", fake);
    expect_error(media, 2, "audio[0]: audio payload is invalid: MIME type image/png is not audio/*");
    /* an unknown file falls back to its extension (none here): octet-stream, refused by the engine */
    snprintf(fake, sizeof fake, "%s/noise", tmpdir);
    write_file(fake, "just some text, no media");
    snprintf(media, sizeof media, ",\"images\":[\"%s\"]", fake);
    expect_error(media, 2, "images[0]: image payload is invalid: MIME type application/octet-stream is not image/*");
    free(bytes);
    free(png);
}

/* --help lists the media flags; bad values are refused before anything loads. */
static void test_serve_flag_usage(void **state) {
    char cmd[1024];
    clef_buf out = {0};
    snprintf(cmd, sizeof cmd, "%s serve --help", CLEF_BINARY);
    assert_int_equal(tu_run_cmd(cmd, &out), 0);
    const char *flags[] = {"--max-images N",        "--max-audio N",         "--max-videos N",
                           "--max-image-mb N",      "--max-audio-mb N",      "--max-video-mb N",
                           "--max-image-megapixels N", "--max-audio-seconds N", "--max-video-seconds N"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strstr(out.data, flags[i])) fail_msg("serve --help lacks %s", flags[i]);
    assert_non_null(strstr(out.data, "images per request (default 4;"));
    assert_non_null(strstr(out.data, "decoded bytes per video, MiB (default 16)"));
    assert_non_null(strstr(out.data, "duration per audio clip (default 300)"));
    clef_buf_free(&out);

    snprintf(cmd, sizeof cmd, "%s serve --model /nonexistent --max-image-mb 0 2>&1", CLEF_BINARY);
    assert_int_equal(tu_run_cmd(cmd, &out), 2);
    assert_non_null(strstr(out.data, "--max-image-mb wants 1..1048576"));
    clef_buf_free(&out);
    snprintf(cmd, sizeof cmd, "%s serve --model /nonexistent --max-video-seconds 86401 2>&1", CLEF_BINARY);
    assert_int_equal(tu_run_cmd(cmd, &out), 2);
    assert_non_null(strstr(out.data, "--max-video-seconds wants 1..86400"));
    clef_buf_free(&out);
}

static void post_expect(const hu_server *s, const char *media, long status, const char *want) {
    char *body = request(media);
    hu_response r;
    hu_post_json(NULL, s, body, strlen(body), NULL, &r);
    if (r.status != status || !strstr(r.body.data ? r.body.data : "", want))
        fail_msg("HTTP %ld, want %ld; body %s; want %s", r.status, status, r.body.data, want);
    hu_free(&r);
    free(body);
}

/* The limits the flags set are the ones requests meet. */
static void test_serve_media_limits(void **state) {
    hu_server s;
    const char *args[] = {"--max-images", "1", "--max-audio", "0", "--max-image-megapixels", "1",
                          "--max-video-seconds", "1", NULL};
    hu_start(&s, args, NULL);
    char *small = data_url("image/png", "red_circle.png");
    char *large = data_url("image/png", "large_checker.png"); /* 1500x1000 */
    char *wav = data_url("audio/wav", "tone_440hz_1.6s.wav");
    char *mkv = data_url("video/x-matroska", "square_audio.mkv");
    clef_buf m = {0};

    clef_buf_printf(&m, ",\"images\":[\"%s\"]", small);
    post_expect(&s, m.data, 200, "\"usage\"");
    m.len = 0;
    clef_buf_printf(&m, ",\"images\":[\"%s\",\"%s\"]", small, small);
    post_expect(&s, m.data, 422,
                "{\"error\":{\"message\":\"images: 2 images exceed the limit of 1 images per context window\","
                "\"type\":\"capacity_exceeded\","
                "\"param\":\"images\"}}");
    m.len = 0;
    clef_buf_printf(&m, ",\"images\":[\"%s\"]", large);
    post_expect(&s, m.data, 422, "images[0]: image payload is invalid: image is 1500x1000 = 1500000 pixels; the canvas holds at "
                                 "most 1000000 pixels\",\"type\":\"capacity_exceeded\"");
    m.len = 0;
    clef_buf_printf(&m, ",\"audio\":[\"%s\"]", wav);
    post_expect(&s, m.data, 422, "audio: 1 audio clips exceed the limit of 0 audio clips per context window");
    m.len = 0;
    clef_buf_printf(&m, ",\"videos\":[\"%s\"]", mkv);
    post_expect(&s, m.data, 422, "\"param\":\"videos[0]\"");
    /* a path is never read by the server: it is just not a data URL */
    post_expect(&s, ",\"images\":[\"/etc/hostname\"]", 422, "images[0]: image payload is invalid: not a data URL");

    assert_int_equal(hu_stop(&s), 0);
    hu_remove_log(&s);
    clef_buf_free(&m);
    free(small);
    free(large);
    free(wav);
    free(mkv);
}

/* `clef serve --text-only` gives every media request one answer, the same
 * 422 for a well-formed payload and for one that would not decode (it is
 * refused before it is decoded), and still answers text. */
static void test_serve_text_only(void **state) {
    hu_server s;
    const char *args[] = {"--text-only", NULL};
    hu_start(&s, args, NULL);
    char *png = data_url("image/png", "red_circle.png");
    char *wav = data_url("audio/wav", "tone_440hz_1.6s.wav");
    char *mkv = data_url("video/x-matroska", "square_audio.mkv");
    const struct {
        const char *field, *payload;
    } cases[] = {
        {"images", png}, {"images", "data:image/png;base64,AAAA"}, {"images", "/etc/hostname"},
        {"audio", wav},  {"audio", "data:audio/wav;base64,!!!!"},  {"videos", mkv},
        {"videos", "data:video/x-matroska;base64,AAAA"},
    };
    clef_buf m = {0}, want = {0};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        m.len = want.len = 0;
        clef_buf_printf(&m, ",\"%s\":[\"%s\"]", cases[i].field, cases[i].payload);
        clef_buf_printf(&want,
                        "{\"error\":{\"message\":\"%s: media inputs are not available with this checkpoint "
                        "(text-only: the media towers were not loaded)\",\"type\":\"invalid_request\",\"param\":\"%s\"}}",
                        cases[i].field, cases[i].field);
        post_expect(&s, m.data, 422, want.data);
    }
    post_expect(&s, "", 200, "\"usage\"");
    assert_int_equal(hu_stop(&s), 0);
    hu_remove_log(&s);
    clef_buf_free(&m);
    clef_buf_free(&want);
    free(png);
    free(wav);
    free(mkv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_image_path_equals_data_url), cmocka_unit_test(test_audio_and_video_paths),
        cmocka_unit_test(test_path_errors),                cmocka_unit_test(test_serve_flag_usage),
        cmocka_unit_test(test_serve_media_limits),         cmocka_unit_test(test_serve_text_only),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
