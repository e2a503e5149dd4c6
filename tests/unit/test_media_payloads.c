/* test_media_payloads.c — bad media payloads are answered with a 4xx naming
 * the item, never a crash (issue 6; SPEC §2.2 rule 9), plus the image
 * conversions Pillow applies (palette, grey, 16-bit, alpha), WebP, limits
 * and the small formulas of SPEC §9 (smart_resize ties, audio frames and
 * tokens, the video downscale size).
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <openssl/evp.h>
#include <webp/encode.h>

#include "media/avdecode.h"
#include "media/image.h"
#include "media/media.h"
#include "media/melspec.h"
#include "media/resize.h"
#include "util/buf.h"

/* ---- building payloads --------------------------------------------------- */

static char *data_url(const char *mime, const void *data, size_t n) {
    size_t cap = strlen(mime) + 16 + 4 * (n / 3 + 1) + 1;
    char *s = malloc(cap);
    int k = snprintf(s, cap, "data:%s;base64,", mime);
    EVP_EncodeBlock((unsigned char *)s + k, data, (int)n);
    return s;
}

static void be32(clef_buf *b, uint32_t v) {
    uint8_t x[4] = {v >> 24, v >> 16, v >> 8, v};
    clef_buf_append(b, x, 4);
}

static void png_chunk(clef_buf *b, const char *type, const void *data, size_t n) {
    be32(b, (uint32_t)n);
    size_t at = b->len;
    clef_buf_append(b, type, 4);
    if (n) clef_buf_append(b, data, n);
    be32(b, (uint32_t)crc32(0, (const Bytef *)b->data + at, (uInt)(n + 4)));
}

/* A PNG of `rows` (h rows of rowbytes, unfiltered) or, rows == NULL, only the
 * signature and IHDR (a header that promises pixels it does not have). */
static clef_buf make_png(uint32_t w, uint32_t h, int depth, int color, const uint8_t *rows, size_t rowbytes,
                         const uint8_t *plte, size_t plte_n, const uint8_t *trns, size_t trns_n) {
    clef_buf b = {0};
    clef_buf_append(&b, "\x89PNG\r\n\x1a\n", 8);
    uint8_t ihdr[13] = {w >> 24, w >> 16, w >> 8, w, h >> 24, h >> 16, h >> 8, h, (uint8_t)depth, (uint8_t)color,
                        0, 0, 0};
    png_chunk(&b, "IHDR", ihdr, 13);
    if (!rows) return b;
    if (plte) png_chunk(&b, "PLTE", plte, plte_n);
    if (trns) png_chunk(&b, "tRNS", trns, trns_n);
    size_t raw_n = h * (rowbytes + 1);
    uint8_t *raw = malloc(raw_n);
    for (uint32_t y = 0; y < h; y++) {
        raw[y * (rowbytes + 1)] = 0; /* filter: none */
        memcpy(raw + y * (rowbytes + 1) + 1, rows + y * rowbytes, rowbytes);
    }
    uLongf zn = compressBound(raw_n);
    uint8_t *z = malloc(zn);
    assert_int_equal(compress(z, &zn, raw, raw_n), Z_OK);
    png_chunk(&b, "IDAT", z, zn);
    png_chunk(&b, "IEND", NULL, 0);
    free(raw);
    free(z);
    return b;
}

/* 16 kHz mono PCM16 WAV of n samples (value i*7 mod 2000). */
static clef_buf make_wav(size_t n) {
    clef_buf b = {0};
    uint32_t data = (uint32_t)(n * 2);
    uint8_t h[44] = "RIFF....WAVEfmt \x10\0\0\0\x01\0\x01\0\x80\x3e\0\0\0\x7d\0\0\x02\0\x10\0data....";
    uint32_t riff = 36 + data;
    memcpy(h + 4, &riff, 4);
    memcpy(h + 40, &data, 4);
    clef_buf_append(&b, h, 44);
    for (size_t i = 0; i < n; i++) {
        int16_t s = (int16_t)((i * 7) % 2000);
        clef_buf_append(&b, &s, 2);
    }
    return b;
}

static char *read_fixture(const char *rel, size_t *n) {
    char *p = tu_fixture(rel);
    char *d = tu_read_file(p, n);
    free(p);
    return d;
}

/* ---- the bad-payload table ----------------------------------------------- */

typedef struct bad_case {
    const char *name;
    const char *field; /* images / audio / videos */
    char *url;         /* owned */
    const char *why;   /* expected substring of the message */
} bad_case;

static clef_media_source one_item(const char *field, const clef_media_item *it) {
    clef_media_source s = {0};
    if (!strcmp(field, "images")) s.images = it, s.n_images = 1;
    if (!strcmp(field, "audio")) s.audio = it, s.n_audio = 1;
    if (!strcmp(field, "videos")) s.videos = it, s.n_videos = 1;
    return s;
}

static void expect_refused(const char *name, const clef_media_source *src, const clef_media_limits *lim,
                           const char *param, const char *prefix, const char *why) {
    clef_media m;
    clef_err err;
    clef_err_clear(&err);
    int rc = clef_media_decode(src, lim, &m, &err);
    if (rc != -1) fail_msg("%s: accepted", name);
    if (err.status != 422) fail_msg("%s: status %d (%s)", name, err.status, err.message);
    if (strcmp(err.param, param)) fail_msg("%s: param '%s', want '%s'", name, err.param, param);
    if (strncmp(err.message, prefix, strlen(prefix))) fail_msg("%s: message '%s'", name, err.message);
    if (why && !strstr(err.message, why)) fail_msg("%s: message '%s' lacks '%s'", name, err.message, why);
    assert_null(m.images); /* freed on error */
}

static void test_bad_payloads(void **state) {
    (void)state;
    size_t png_n, jpg_n, wav_n, mkv_n;
    char *png = read_fixture("media/red_circle.png", &png_n);
    char *jpg = read_fixture("media/gradient.jpg", &jpg_n);
    char *wav = read_fixture("media/tone_440hz_1.6s.wav", &wav_n);
    char *mkv = read_fixture("media/square.mkv", &mkv_n);
    const char *html = "<!DOCTYPE html><html><head><title>Not an image</title></head><body>hello</body></html>\n";

    /* a JPEG whose SOF0 claims 10000x10000 */
    char *big_jpg = malloc(jpg_n);
    memcpy(big_jpg, jpg, jpg_n);
    int patched = 0;
    for (size_t i = 2; i + 9 < jpg_n; i++)
        if ((uint8_t)big_jpg[i] == 0xFF && ((uint8_t)big_jpg[i + 1] == 0xC0 || (uint8_t)big_jpg[i + 1] == 0xC2)) {
            big_jpg[i + 5] = (char)(10000 >> 8), big_jpg[i + 6] = (char)(10000 & 255); /* height */
            big_jpg[i + 7] = (char)(10000 >> 8), big_jpg[i + 8] = (char)(10000 & 255); /* width */
            patched = 1;
            break;
        }
    assert_true(patched);
    /* WebP VP8X header with a 10000x10000 canvas */
    uint8_t vp8x[30] = "RIFF\x16\0\0\0WEBPVP8X\x0a\0\0\0\0\0\0\0";
    uint32_t wm1 = 9999;
    memcpy(vp8x + 24, &wm1, 3);
    memcpy(vp8x + 27, &wm1, 3);

    /* the silent video with its clusters replaced by one empty Cluster
     * (a timestamp, no blocks): a valid video track without frames */
    size_t cluster = 0;
    for (size_t i = 0; i + 4 <= mkv_n && !cluster; i++)
        if (!memcmp(mkv + i, "\x1f\x43\xb6\x75", 4)) cluster = i;
    assert_true(cluster > 0);
    char *no_frames = malloc(cluster + 8);
    memcpy(no_frames, mkv, cluster);
    memcpy(no_frames + cluster, "\x1f\x43\xb6\x75\x83\xe7\x81\x00", 8);

    clef_buf png0 = make_png(0, 0, 8, 2, NULL, 0, NULL, 0, NULL, 0);
    clef_buf png_big = make_png(10000, 10000, 8, 2, NULL, 0, NULL, 0, NULL, 0);
    uint8_t thin_rows[201 * 3] = {0};
    clef_buf png_thin = make_png(201, 1, 8, 2, thin_rows, sizeof thin_rows, NULL, 0, NULL, 0);
    clef_buf wav1 = make_wav(1);
    clef_buf wav0 = make_wav(0);
    const char *not_audio = "RIFF\x40\0\0\0WAVEfmt \x10\0\0\0\x34\x12\x07\0\x11\x11\0\0\0\0\0\0\0\0\0\0data";

    bad_case cases[] = {
        {"empty string", "images", strdup(""), "not a data URL"},
        {"http URL", "images", strdup("https://example.com/cat.png"), "not a data URL"},
        {"empty payload", "images", strdup("data:image/png;base64,"), "empty"},
        {"no base64 marker", "images", strdup("data:image/png,abcd"), "base64"},
        {"bad base64", "images", strdup("data:image/png;base64,@@@@"), "base64"},
        {"bad base64 length", "images", strdup("data:image/png;base64,iVBORw0"), "base64"},
        {"truncated PNG", "images", data_url("image/png", png, png_n / 2), "PNG"},
        {"truncated JPEG", "images", data_url("image/jpeg", jpg, jpg_n / 2), "JPEG"},
        {"wrong MIME", "images", data_url("text/html", png, png_n), "MIME"},
        {"HTML as JPEG", "images", data_url("image/jpeg", html, strlen(html)), "not a PNG, JPEG or WebP"},
        {"0x0 PNG", "images", data_url("image/png", png0.data, png0.len), "image is 0x0"},
        {"10000x10000 PNG header", "images", data_url("image/png", png_big.data, png_big.len), "the canvas holds at most"},
        {"10000x10000 JPEG header", "images", data_url("image/jpeg", big_jpg, jpg_n), "the canvas holds at most"},
        {"10000x10000 WebP header", "images", data_url("image/webp", vp8x, sizeof vp8x), NULL},
        {"aspect ratio 201", "images", data_url("image/png", png_thin.data, png_thin.len), "aspect ratio"},
        {"image as audio", "audio", data_url("image/png", png, png_n), "MIME"},
        {"1-sample audio", "audio", data_url("audio/wav", wav1.data, wav1.len), "at least"},
        {"0-sample audio", "audio", data_url("audio/wav", wav0.data, wav0.len), NULL},
        {"WAV that is not audio", "audio", data_url("audio/wav", not_audio, 64), NULL},
        {"HTML as WAV", "audio", data_url("audio/wav", html, strlen(html)), NULL},
        {"truncated WAV", "audio", data_url("audio/wav", wav, 30), NULL},
        {"video without frames (a WAV)", "videos", data_url("video/x-matroska", wav, wav_n), "no video stream"},
        {"video without frames (no clusters)", "videos", data_url("video/x-matroska", no_frames, cluster + 8), "no frames"},
        {"truncated video", "videos", data_url("video/x-matroska", mkv, 300), NULL},
        {"HTML as video", "videos", data_url("video/mp4", html, strlen(html)), NULL},
        {"image as video", "videos", data_url("video/mp4", png, png_n), NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bad_case *c = &cases[i];
        clef_media_item it = {c->url, strlen(c->url)};
        clef_media_source src = one_item(c->field, &it);
        char param[32], prefix[96];
        const char *kind = !strcmp(c->field, "images") ? "image" : !strcmp(c->field, "audio") ? "audio" : "video";
        snprintf(param, sizeof param, "%s[0]", c->field);
        snprintf(prefix, sizeof prefix, "%s[0]: %s payload is invalid: ", c->field, kind);
        expect_refused(c->name, &src, NULL, param, prefix, c->why);
        free(c->url);
    }
    clef_buf_free(&png0);
    clef_buf_free(&png_big);
    clef_buf_free(&png_thin);
    clef_buf_free(&wav1);
    clef_buf_free(&wav0);
    free(big_jpg);
    free(no_frames);
    free(png);
    free(jpg);
    free(wav);
    free(mkv);
}

/* Counts, bytes and durations are configurable limits; the second item is
 * named when it is the bad one. */
static void test_limits(void **state) {
    (void)state;
    size_t png_n, wav_n, mkv_n;
    char *png = read_fixture("media/red_circle.png", &png_n);
    char *wav = read_fixture("media/tone_440hz_1.6s.wav", &wav_n);
    char *mkv = read_fixture("media/square.mkv", &mkv_n);
    char *png_url = data_url("image/png", png, png_n), *wav_url = data_url("audio/wav", wav, wav_n);
    char *mkv_url = data_url("video/x-matroska", mkv, mkv_n);
    clef_media_item img = {png_url, strlen(png_url)}, aud = {wav_url, strlen(wav_url)}, vid = {mkv_url, strlen(mkv_url)};
    clef_media_item five[5] = {img, img, img, img, img};
    clef_media_source src = {0};

    src.images = five, src.n_images = 5;
    expect_refused("5 images", &src, NULL, "images", "images: 5 images exceed the limit of 4 images per context window",
                   NULL);
    src = (clef_media_source){0};
    src.audio = five, src.n_audio = 5;
    expect_refused("5 clips", &src, NULL, "audio", "audio: 5 audio clips exceed the limit of 4 audio clips per context window", NULL);
    src = (clef_media_source){0};
    src.videos = five, src.n_videos = 3;
    expect_refused("3 videos", &src, NULL, "videos", "videos: 3 videos exceed the limit of 2 videos per context window",
                   NULL);

    clef_media_limits lim = clef_media_limits_default();
    lim.max_image_bytes = png_n - 1;
    src = (clef_media_source){0};
    src.images = five, src.n_images = 1;
    expect_refused("image bytes", &src, &lim, "images[0]", "images[0]: image payload is invalid: ", "the context window takes at most");
    lim = clef_media_limits_default();
    lim.max_image_pixels = 256 * 256 - 1;
    expect_refused("image pixels", &src, &lim, "images[0]", "images[0]: image payload is invalid: ", "pixels");
    lim = clef_media_limits_default();
    lim.max_audio_seconds = 1.0;
    src = (clef_media_source){0};
    clef_media_item two[2] = {aud, aud};
    src.audio = two, src.n_audio = 2;
    expect_refused("audio seconds", &src, &lim, "audio[0]", "audio[0]: audio payload is invalid: ", "longer than 1 s");
    lim = clef_media_limits_default();
    lim.max_audio_bytes = wav_n - 1;
    expect_refused("audio bytes", &src, &lim, "audio[0]", "audio[0]: audio payload is invalid: ", "the context window takes at most");
    lim = clef_media_limits_default();
    lim.max_video_seconds = 1.0;
    src = (clef_media_source){0};
    src.videos = &vid, src.n_videos = 1;
    expect_refused("video seconds", &src, &lim, "videos[0]", "videos[0]: video payload is invalid: ", "longer than 1 s");
    lim = clef_media_limits_default();
    lim.max_video_bytes = mkv_n - 1;
    expect_refused("video bytes", &src, &lim, "videos[0]", "videos[0]: video payload is invalid: ", "the context window takes at most");

    /* the second item is the bad one */
    char *bad = strdup("data:image/png;base64,AAAA");
    clef_media_item mixed[2] = {img, {bad, strlen(bad)}};
    src = (clef_media_source){0};
    src.images = mixed, src.n_images = 2;
    expect_refused("second image", &src, NULL, "images[1]", "images[1]: image payload is invalid: ", NULL);
    free(bad);

    /* at the limits everything is accepted */
    clef_media m;
    clef_err err;
    clef_err_clear(&err);
    src = (clef_media_source){0};
    src.images = five, src.n_images = 4;
    assert_int_equal(clef_media_decode(&src, NULL, &m, &err), 0);
    assert_int_equal(clef_media_pad_tokens(&m), 4 * 64);
    clef_media_free(&m);
    free(png_url);
    free(wav_url);
    free(mkv_url);
    free(png);
    free(wav);
    free(mkv);
}

/* ---- decoding conversions ------------------------------------------------ */

static clef_rgb decode_ok(const void *data, size_t n) {
    clef_rgb img;
    char why[256];
    if (clef_image_decode(data, n, 16000000, &img, why, sizeof why)) fail_msg("decode: %s", why);
    return img;
}

/* Palette (4-bit, with tRNS), 2-bit grey, 16-bit grey, 16-bit grey+alpha and
 * 16-bit RGBA convert to RGB as Pillow's convert("RGB"). */
static void test_png_conversions(void **state) {
    (void)state;
    /* palette 4-bit, 3x1: indices 0,1,2 */
    uint8_t plte[9] = {10, 20, 30, 40, 50, 60, 70, 80, 90}, trns[2] = {0, 128};
    uint8_t prow[2] = {0x01, 0x20};
    clef_buf b = make_png(3, 1, 4, 3, prow, 2, plte, 9, trns, 2);
    clef_rgb img = decode_ok(b.data, b.len);
    uint8_t want_p[9] = {10, 20, 30, 40, 50, 60, 70, 80, 90};
    assert_int_equal(img.w, 3);
    assert_memory_equal(img.data, want_p, 9);
    clef_rgb_free(&img);
    clef_buf_free(&b);

    /* grey 2-bit, 4x1: levels 0..3 -> 0, 85, 170, 255 */
    uint8_t grow[1] = {0x1B};
    b = make_png(4, 1, 2, 0, grow, 1, NULL, 0, NULL, 0);
    img = decode_ok(b.data, b.len);
    uint8_t want_g[12] = {0, 0, 0, 85, 85, 85, 170, 170, 170, 255, 255, 255};
    assert_memory_equal(img.data, want_g, 12);
    clef_rgb_free(&img);
    clef_buf_free(&b);

    /* grey 16-bit, 3x1: 0x0012 -> 18, 0x00FF -> 255, 0x1234 -> 255 (Pillow I;16 -> RGB clips) */
    uint8_t g16[6] = {0x00, 0x12, 0x00, 0xFF, 0x12, 0x34};
    b = make_png(3, 1, 16, 0, g16, 6, NULL, 0, NULL, 0);
    img = decode_ok(b.data, b.len);
    uint8_t want_g16[9] = {18, 18, 18, 255, 255, 255, 255, 255, 255};
    assert_memory_equal(img.data, want_g16, 9);
    clef_rgb_free(&img);
    clef_buf_free(&b);

    /* grey+alpha 16-bit, 1x1: high byte of grey, alpha dropped */
    uint8_t ga16[4] = {0x12, 0x34, 0x00, 0x00};
    b = make_png(1, 1, 16, 4, ga16, 4, NULL, 0, NULL, 0);
    img = decode_ok(b.data, b.len);
    uint8_t want_ga[3] = {0x12, 0x12, 0x12};
    assert_memory_equal(img.data, want_ga, 3);
    clef_rgb_free(&img);
    clef_buf_free(&b);

    /* RGBA 16-bit, 1x1: high bytes, alpha dropped (not composited) */
    uint8_t rgba16[8] = {0xAB, 0xCD, 0x01, 0x02, 0xFE, 0xFF, 0x00, 0x00};
    b = make_png(1, 1, 16, 6, rgba16, 8, NULL, 0, NULL, 0);
    img = decode_ok(b.data, b.len);
    uint8_t want_rgba[3] = {0xAB, 0x01, 0xFE};
    assert_memory_equal(img.data, want_rgba, 3);
    clef_rgb_free(&img);
    clef_buf_free(&b);

    /* RGBA 8-bit with alpha 0: colour kept */
    uint8_t rgba8[4] = {0, 200, 0, 0};
    b = make_png(1, 1, 8, 6, rgba8, 4, NULL, 0, NULL, 0);
    img = decode_ok(b.data, b.len);
    uint8_t want_a[3] = {0, 200, 0};
    assert_memory_equal(img.data, want_a, 3);
    clef_rgb_free(&img);
    clef_buf_free(&b);
}

/* Lossless WebP decodes to the encoded pixels; the label does not have to
 * name the format (formats are sniffed, as Pillow does). */
static void test_webp_and_sniffing(void **state) {
    (void)state;
    enum { W = 40, H = 30 };
    uint8_t px[W * H * 3];
    for (int i = 0; i < W * H * 3; i++) px[i] = (uint8_t)(i * 37 + (i / 3) * 11);
    uint8_t *enc = NULL;
    size_t n = WebPEncodeLosslessRGB(px, W, H, W * 3, &enc);
    assert_true(n > 0);
    assert_int_equal(clef_image_sniff(enc, n), CLEF_IMG_WEBP);
    clef_rgb img = decode_ok(enc, n);
    assert_int_equal(img.w, W);
    assert_int_equal(img.h, H);
    assert_memory_equal(img.data, px, sizeof px);
    clef_rgb_free(&img);

    char *url = data_url("image/png", enc, n); /* mislabelled but valid */
    clef_media_item it = {url, strlen(url)};
    clef_media_source src = {0};
    src.images = &it, src.n_images = 1;
    clef_media m;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_media_decode(&src, NULL, &m, &err), 0);
    /* 30x40 -> round to 32x32 -> below 65,536 px -> scaled up: 224x320 */
    assert_int_equal(m.image_grids[0].h, 14);
    assert_int_equal(m.image_grids[0].w, 20);
    assert_int_equal(clef_media_preprocess(&m, &err), 0);
    assert_int_equal(m.image_rows, 14 * 20);
    clef_media_free(&m);
    free(url);
    WebPFree(enc);
}

/* ---- synthetic videos (FFmpeg encoders, in memory) ------------------------ */

/* An FFV1/yuv420p Matroska video of `n` solid frames of colour (r, g, b), w x h,
 * `fps` frames per second.  Returns the bytes (caller frees) and their size. */
static uint8_t *make_video(int w, int h, int n, int fps, uint8_t r, uint8_t g, uint8_t b, size_t *size) {
    AVFormatContext *fmt = NULL;
    assert_true(avformat_alloc_output_context2(&fmt, NULL, "matroska", NULL) >= 0);
    const AVCodec *codec = avcodec_find_encoder(AV_CODEC_ID_FFV1);
    assert_non_null(codec);
    AVStream *st = avformat_new_stream(fmt, NULL);
    AVCodecContext *enc = avcodec_alloc_context3(codec);
    enc->width = w, enc->height = h, enc->pix_fmt = AV_PIX_FMT_YUV420P;
    enc->time_base = (AVRational){1, fps};
    enc->framerate = (AVRational){fps, 1};
    enc->thread_count = 1;
    assert_true(avcodec_open2(enc, codec, NULL) >= 0);
    assert_true(avcodec_parameters_from_context(st->codecpar, enc) >= 0);
    st->time_base = enc->time_base;
    assert_true(avio_open_dyn_buf(&fmt->pb) >= 0);
    assert_true(avformat_write_header(fmt, NULL) >= 0);
    AVFrame *f = av_frame_alloc();
    f->width = w, f->height = h, f->format = AV_PIX_FMT_YUV420P;
    assert_true(av_frame_get_buffer(f, 0) >= 0);
    /* BT.601 limited range, the swscale default for YUV input */
    int Y = (int)(16 + (65.481 * r + 128.553 * g + 24.966 * b) / 255 + 0.5);
    int U = (int)(128 + (-37.797 * r - 74.203 * g + 112.0 * b) / 255 + 0.5);
    int V = (int)(128 + (112.0 * r - 93.786 * g - 18.214 * b) / 255 + 0.5);
    AVPacket *pkt = av_packet_alloc();
    for (int i = 0; i <= n; i++) {
        AVFrame *in = NULL;
        if (i < n) {
            assert_true(av_frame_make_writable(f) >= 0);
            for (int y = 0; y < h; y++) memset(f->data[0] + y * f->linesize[0], Y, (size_t)w);
            for (int y = 0; y < h / 2; y++) {
                memset(f->data[1] + y * f->linesize[1], U, (size_t)w / 2);
                memset(f->data[2] + y * f->linesize[2], V, (size_t)w / 2);
            }
            f->pts = i;
            in = f;
        }
        assert_true(avcodec_send_frame(enc, in) >= 0);
        while (avcodec_receive_packet(enc, pkt) == 0) {
            av_packet_rescale_ts(pkt, enc->time_base, st->time_base);
            pkt->stream_index = st->index;
            assert_true(av_interleaved_write_frame(fmt, pkt) >= 0);
        }
    }
    assert_true(av_write_trailer(fmt) >= 0);
    uint8_t *buf;
    int len = avio_close_dyn_buf(fmt->pb, &buf);
    fmt->pb = NULL;
    uint8_t *out = malloc((size_t)len);
    memcpy(out, buf, (size_t)len);
    av_free(buf);
    *size = (size_t)len;
    av_packet_free(&pkt);
    av_frame_free(&f);
    avcodec_free_context(&enc);
    avformat_free_context(fmt);
    return out;
}

static void decode_video_ok(const uint8_t *v, size_t n, clef_media *m) {
    char *url = data_url("video/x-matroska", v, n);
    clef_media_item it = {url, strlen(url)};
    clef_media_source src = {0};
    src.videos = &it, src.n_videos = 1;
    clef_err err;
    clef_err_clear(&err);
    if (clef_media_decode(&src, NULL, m, &err)) fail_msg("video: %s", err.message);
    free(url);
}

/* A YUV video above 262,144 px: frames converted to rgb24 and scaled down to
 * even sides before the processor (SPEC §9 "Conversion and downscale"); 2 fps
 * by timestamp; an odd count padded with the last frame. */
static void test_video_downscale_and_sampling(void **state) {
    (void)state;
    size_t n;
    uint8_t *v = make_video(640, 480, 5, 4, 200, 30, 60, &n); /* t = 0, .25, .5, .75, 1: keep 0, .5, 1 */
    clef_media m;
    decode_video_ok(v, n, &m);
    assert_int_equal(m.video_frames[0], 4); /* 3 kept + the last repeated */
    assert_int_equal(m.frames[0][0].w, 592); /* round(640*0.9238/2)*2 */
    assert_int_equal(m.frames[0][0].h, 444);
    assert_memory_equal(m.frames[0][2].data, m.frames[0][3].data, 592 * 444 * 3);
    /* colour survives the YUV round trip */
    const uint8_t *px = m.frames[0][0].data + (100 * 592 + 100) * 3;
    assert_true(abs(px[0] - 200) <= 3 && abs(px[1] - 30) <= 3 && abs(px[2] - 60) <= 3);
    /* smart_resize(444, 592) with the video bounds: 448 x 576 (18.5 rounds to 18) */
    assert_int_equal(m.video_grids[0].t, 2);
    assert_int_equal(m.video_grids[0].h, 28);
    assert_int_equal(m.video_grids[0].w, 36);
    assert_int_equal(m.use_audio_in_video, 0);
    clef_err err;
    assert_int_equal(clef_media_preprocess(&m, &err), 0);
    assert_int_equal(m.video_rows, 2 * 28 * 36);
    clef_media_free(&m);
    free(v);

    /* 3 fps: t = 0, 1/3, 2/3, 1, 4/3 -> keep 0, 2/3, 1 (1 + 1e-6 >= 1) */
    v = make_video(128, 96, 5, 3, 10, 20, 30, &n);
    decode_video_ok(v, n, &m);
    assert_int_equal(m.video_frames[0], 4);
    assert_int_equal(m.frames[0][0].w, 128);
    clef_media_free(&m);
    free(v);
}


/* ---- the decoded-media budget's probes and allowances --------------------- */

typedef struct grow_log {
    size_t asked, calls;
    int refuse;
} grow_log;

static int grow_cb(void *ctx, size_t extra) {
    grow_log *g = ctx;
    g->calls++;
    if (g->refuse) return -1;
    g->asked += extra;
    return 0;
}

/* Headers read without decoding (clef_av_probe), and decoders that ask their
 * allowance before keeping more than was charged (and fail when refused). */
static void test_budget_probes_and_allowances(void **state) {
    (void)state;
    size_t wav_n;
    char *wav = read_fixture("media/tone_440hz_1.6s.wav", &wav_n);
    clef_av_header hd;
    assert_int_equal(clef_av_probe((const uint8_t *)wav, wav_n, &hd), 0);
    assert_int_equal(hd.has_audio, 1);
    assert_int_equal(hd.has_video, 0);
    assert_true(fabs(hd.audio_seconds - 1.6) < 1e-3);
    assert_int_equal(clef_av_probe((const uint8_t *)"<html>", 6, &hd), -1);

    char why[256];
    float *samples;
    size_t n;
    grow_log g = {0, 0, 0};
    clef_av_allowance a = {0, grow_cb, &g};
    assert_int_equal(clef_av_decode_audio((const uint8_t *)wav, wav_n, 300, &a, &samples, &n, why, sizeof why), 0);
    assert_int_equal(n, 25600); /* 1.6 s at 16 kHz */
    assert_int_equal(a.granted, 32768 * sizeof(float)); /* the buffer: 16384 floats, doubled once */
    assert_int_equal(g.asked, a.granted);
    free(samples);
    g = (grow_log){0, 0, 1};
    a = (clef_av_allowance){16384 * sizeof(float), grow_cb, &g}; /* room for the first buffer only */
    assert_int_equal(clef_av_decode_audio((const uint8_t *)wav, wav_n, 300, &a, &samples, &n, why, sizeof why), -1);
    assert_string_equal(why, "decoded-media budget refused more memory");
    assert_int_equal(g.calls, 1);
    assert_null(samples);

    size_t vn;
    uint8_t *v = make_video(640, 480, 5, 4, 200, 30, 60, &vn); /* keeps 3 frames of 592 x 444 */
    assert_int_equal(clef_av_probe(v, vn, &hd), 0);
    assert_int_equal(hd.has_video, 1);
    assert_int_equal(hd.has_audio, 0);
    assert_int_equal(hd.width, 640);
    assert_int_equal(hd.height, 480);
    assert_int_equal(hd.frame_bytes, 0); /* FFV1's pixel format is in its codec data, not the headers */
    assert_true(hd.video_seconds >= 1.0 && hd.video_seconds <= 1.5);
    clef_rgb *frames;
    g = (grow_log){0, 0, 0};
    a = (clef_av_allowance){0, grow_cb, &g};
    assert_int_equal(clef_av_decode_video(v, vn, 60, 16000000, &a, &frames, &n, why, sizeof why), 0);
    assert_int_equal(n, 3);
    assert_int_equal(g.asked, 16 * sizeof(clef_rgb) + 3 * (size_t)592 * 444 * 3);
    for (size_t i = 0; i < n; i++) clef_rgb_free(&frames[i]);
    free(frames);
    g = (grow_log){0, 0, 1};
    a = (clef_av_allowance){16 * sizeof(clef_rgb) + (size_t)592 * 444 * 3, grow_cb, &g}; /* one frame's room */
    assert_int_equal(clef_av_decode_video(v, vn, 60, 16000000, &a, &frames, &n, why, sizeof why), -1);
    assert_string_equal(why, "decoded-media budget refused more memory");
    assert_null(frames);

    /* Through clef_media_decode with a budget: the header's charge covers the
     * decode (no top-up), is lowered to the tensors, then given back. */
    char *url = data_url("video/x-matroska", v, vn);
    clef_media_item it = {url, strlen(url)};
    clef_media_source src = {0};
    src.videos = &it, src.n_videos = 1;
    size_t charge;
    clef_err err;
    assert_int_equal(clef_media_charge_bytes(&src, NULL, &charge, &err), 0);
    clef_budget *b = clef_budget_new("decoded-media", 0);
    clef_media_limits lim = clef_media_limits_default();
    lim.budget = b;
    clef_media m;
    assert_int_equal(clef_media_decode(&src, &lim, &m, &err), 0);
    assert_int_equal(m.charged, charge);
    assert_int_equal(clef_media_preprocess(&m, &err), 0);
    assert_int_equal(m.charged, (size_t)(1 + 2 * 28 * 36) * 1536 * sizeof(float)); /* image minimum + video rows */
    clef_budget_stats st;
    clef_budget_stats_get(b, &st);
    assert_int_equal(st.used, m.charged);
    clef_media_free(&m);
    clef_budget_stats_get(b, &st);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.peak, charge);
    clef_budget_free(b);
    free(url);
    free(v);
    free(wav);
}

/* ---- formulas ------------------------------------------------------------ */

static void test_formulas(void **state) {
    (void)state;
    int32_t h, w;
    /* 272/32 = 8.5 rounds half to even: 256, not 288 */
    assert_int_equal(clef_smart_resize(272, 272, 32, 65536, 1048576, &h, &w), 0);
    assert_int_equal(h, 256);
    assert_int_equal(w, 256);
    /* 304/32 = 9.5 rounds to 10 (even) */
    assert_int_equal(clef_smart_resize(304, 304, 32, 65536, 1048576, &h, &w), 0);
    assert_int_equal(h, 320);
    /* 1000x1500 above the maximum: beta = sqrt(1.5e6/1048576) */
    assert_int_equal(clef_smart_resize(1000, 1500, 32, 65536, 1048576, &h, &w), 0);
    assert_int_equal(h, 832);
    assert_int_equal(w, 1248);
    /* a 128x96 video frame with the video bounds: 320x448 */
    assert_int_equal(clef_smart_resize(96, 128, 32, 131072, 786432, &h, &w), 0);
    assert_int_equal(h, 320);
    assert_int_equal(w, 448);
    assert_int_equal(clef_smart_resize(1, 201, 32, 65536, 1048576, &h, &w), -1);
    assert_int_equal(clef_smart_resize(1, 200, 32, 65536, 1048576, &h, &w), 0);

    /* audio tokens: 13 per 100 frames plus c(c(c(r))), c(0) = 0 */
    assert_int_equal(clef_audio_tokens(0), 0);
    assert_int_equal(clef_audio_tokens(1), 1);
    assert_int_equal(clef_audio_tokens(100), 13);
    assert_int_equal(clef_audio_tokens(160), 21);
    assert_int_equal(clef_audio_tokens(165), 22);
    assert_int_equal(clef_audio_tokens(200), 26);
    assert_int_equal(clef_audio_tokens(330), 43);
    assert_int_equal(clef_audio_tokens(3000), 390);
    /* frames: min(ceil(l/160), floor(L_max/160)) */
    assert_int_equal(clef_audio_frames(26241, 52800), 165);
    assert_int_equal(clef_audio_frames(52800, 52800), 330);
    assert_int_equal(clef_audio_frames(26241, 26241), 164);

    /* video frames above 262,144 px are scaled to even sides */
    int32_t ow, oh;
    clef_video_frame_size(128, 96, &ow, &oh);
    assert_int_equal(ow, 128);
    assert_int_equal(oh, 96);
    clef_video_frame_size(1920, 1080, &ow, &oh);
    assert_int_equal(ow, 682);
    assert_int_equal(oh, 384);
    clef_video_frame_size(512, 512, &ow, &oh);
    assert_int_equal(ow, 512);
    clef_video_frame_size(513, 512, &ow, &oh);
    assert_int_equal(ow, 512);
    assert_int_equal(oh, 512);
}

/* Resampler identities: same size copies; a constant image stays constant. */
static void test_resampler(void **state) {
    (void)state;
    enum { SW = 37, SH = 23, DW = 64, DH = 32 };
    uint8_t src[SW * SH * 3], dst[DW * DH * 3], same[SW * SH * 3];
    memset(src, 77, sizeof src);
    clef_resize_bicubic_aa_u8(src, SW, SH, dst, DW, DH);
    for (size_t i = 0; i < sizeof dst; i++) assert_int_equal(dst[i], 77);
    for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 13);
    clef_resize_bicubic_aa_u8(src, SW, SH, same, SW, SH);
    assert_memory_equal(src, same, sizeof src);
    /* downscale of a constant image too (weights sum to 2^p exactly or round) */
    uint8_t big[128 * 96 * 3], small[32 * 32 * 3];
    memset(big, 255, sizeof big);
    clef_resize_bicubic_aa_u8(big, 128, 96, small, 32, 32);
    for (size_t i = 0; i < sizeof small; i++) assert_int_equal(small[i], 255);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_payloads),    cmocka_unit_test(test_limits),
        cmocka_unit_test(test_png_conversions), cmocka_unit_test(test_webp_and_sniffing),
        cmocka_unit_test(test_formulas),        cmocka_unit_test(test_resampler),
        cmocka_unit_test(test_video_downscale_and_sampling),
        cmocka_unit_test(test_budget_probes_and_allowances),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
