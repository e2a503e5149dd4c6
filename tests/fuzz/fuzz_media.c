/* fuzz_media.c — libFuzzer target for the media decoders (issue 6).
 *
 * Each input is tried as an image, an audio clip and a video, through the
 * same path a request takes (data URL -> decode -> preprocess), with small
 * limits so one input stays cheap.  The fixtures in tests/fixtures/media are
 * valid seeds.  Build and run: `make fuzz-media` (clang, -fsanitize=fuzzer).
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
    lim.max_image_pixels = 1 << 20;
    lim.max_audio_seconds = 5.0;
    lim.max_video_seconds = 3.0;
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
        /* resampling large frames under ASan is slow and rarely new: only small media */
        if (clef_media_pad_tokens(&m) <= 300) clef_media_preprocess(&m, &err);
        clef_media_free(&m);
    } else if (err.status < 400 || err.status > 499) {
        abort(); /* every refusal of a payload must be a 4xx */
    }
    free(url);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    try_kind("image/png", data, size, 0);
    try_kind("audio/wav", data, size, 1);
    try_kind("video/x-matroska", data, size, 2);
    return 0;
}
