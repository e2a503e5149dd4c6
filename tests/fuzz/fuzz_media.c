/* fuzz_media.c — libFuzzer target for the media decoders (issue 6).
 *
 * Each input goes through the path a request's item takes (data URL ->
 * decode -> preprocess) as the kind its magic number names: PNG / JPEG /
 * WebP -> image; WAV / FLAC / Ogg / MP3 / AAC (ADTS) / AIFF -> audio;
 * Matroska / WebM / MP4 / MOV / AVI -> video; anything else as the kind its
 * first byte picks (byte % 3).  It used to try every input as all three,
 * which tripled the decoder start-up per input and sent most of the run's
 * time into futile probes.  Limits are small (a 512 x 512 image, 2 s of
 * audio or video, preprocessing only up to 128 pad tokens) so an input
 * stays cheap, and `make fuzz-media` compiles
 * the numeric kernels (resize.c, melspec.c) without coverage tracing,
 * which spent most of the time in their inner loops; with the magic-number
 * dictionary fuzz_media.dict (chunk and box names too) a short run gets past
 * the containers' headers.  The fixtures in tests/fixtures/media are the
 * seeds.  Build and run: `make fuzz-media` (clang, -fsanitize=fuzzer).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "media/media.h"

static char *to_data_url(const char *mime, const uint8_t *data, size_t n) {
    size_t cap = strlen(mime) + 16 + 4 * (n / 3 + 1) + 1;
    char *s = malloc(cap);
    int k = snprintf(s, cap, "data:%s;base64,", mime);
    EVP_EncodeBlock((unsigned char *)s + k, data, (int)n);
    return s;
}

static void try_kind(const char *mime, const uint8_t *data, size_t n, int kind) {
    clef_media_limits lim = clef_media_limits_default();
    lim.max_image_pixels = 512 * 512;
    lim.max_audio_seconds = 2.0;
    lim.max_video_seconds = 2.0;
    char *url = to_data_url(mime, data, n);
    clef_media_item it = {url, strlen(url)};
    clef_media_source src = {0};
    if (kind == 0) src.images = &it, src.n_images = 1;
    if (kind == 1) src.audio = &it, src.n_audio = 1;
    if (kind == 2) src.videos = &it, src.n_videos = 1;
    clef_media m;
    clef_err err;
    clef_err_clear(&err);
    if (clef_media_decode(&src, &lim, &m, &err) == 0) {
        /* resampling under ASan is slow and rarely new past a few frames: only media of at most 128 pad
         * tokens (every fixture image; preprocessing was most of the run's time at 300) */
        if (clef_media_pad_tokens(&m) <= 128) clef_media_preprocess(&m, &err);
        clef_media_free(&m);
    } else if (err.status < 400 || err.status > 499) {
        abort(); /* every refusal of a payload must be a 4xx */
    }
    free(url);
}

static int starts(const uint8_t *d, size_t n, size_t at, const char *magic) {
    size_t k = strlen(magic);
    return n >= at + k && memcmp(d + at, magic, k) == 0;
}

/* 0 image, 1 audio, 2 video, -1 unknown. */
static int kind_of(const uint8_t *d, size_t n) {
    if (starts(d, n, 0, "\x89PNG") || starts(d, n, 0, "\xff\xd8\xff") ||
        (starts(d, n, 0, "RIFF") && starts(d, n, 8, "WEBP")))
        return 0;
    if ((starts(d, n, 0, "RIFF") && starts(d, n, 8, "WAVE")) || starts(d, n, 0, "fLaC") || starts(d, n, 0, "OggS") ||
        starts(d, n, 0, "ID3") || (starts(d, n, 0, "FORM") && starts(d, n, 8, "AIFF")) ||
        (n >= 2 && d[0] == 0xff && (d[1] & 0xe0) == 0xe0)) /* MPEG audio / ADTS frame sync */
        return 1;
    if (starts(d, n, 0, "\x1a\x45\xdf\xa3") || starts(d, n, 4, "ftyp") || (starts(d, n, 0, "RIFF") && starts(d, n, 8, "AVI ")))
        return 2;
    return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0 || size > (1u << 20)) return 0;
    static const char *const mime[3] = {"image/png", "audio/wav", "video/x-matroska"};
    int kind = kind_of(data, size);
    if (kind < 0) kind = data[0] % 3;
    try_kind(mime[kind], data, size, kind);
    return 0;
}
