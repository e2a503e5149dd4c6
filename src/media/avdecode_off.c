/* avdecode_off.c — media/avdecode.h for builds without FFmpeg (CMake
 * CLEF_MEDIA=OFF, e.g. a GPU-only binary that must stay small): audio and
 * video containers are refused with a clear reason (the request then fails
 * with 422 naming the item, as for any undecodable payload); images
 * (libjpeg/libpng/libwebp) and the log-mel features still work.  Compiled
 * instead of avdecode.c, never together with it. */
#include <math.h>
#include <stdio.h>

#include "media/avdecode.h"

static const char NOT_BUILT[] = "audio/video support not built (clef was built with CLEF_MEDIA=OFF)";

int clef_av_has_audio(const uint8_t *data, size_t size, char *why, size_t why_len) {
    (void)data, (void)size;
    snprintf(why, why_len, "%s", NOT_BUILT);
    return -1;
}

int clef_av_probe(const uint8_t *data, size_t size, clef_av_header *out) {
    (void)data, (void)size;
    *out = (clef_av_header){0, 0, 0, 0, 0, -1.0, -1.0};
    return -1; /* the decoders refuse every container: nothing to charge */
}

int clef_av_decode_audio(const uint8_t *data, size_t size, double max_seconds, clef_av_allowance *allow,
                         float **samples, size_t *n_samples, char *why, size_t why_len) {
    (void)data, (void)size, (void)max_seconds, (void)allow;
    *samples = NULL;
    *n_samples = 0;
    snprintf(why, why_len, "%s", NOT_BUILT);
    return -1;
}

int clef_av_decode_video(const uint8_t *data, size_t size, double max_seconds, size_t max_pixels,
                         clef_av_allowance *allow, clef_rgb **frames, size_t *n_frames, char *why, size_t why_len) {
    (void)data, (void)size, (void)max_seconds, (void)max_pixels, (void)allow;
    *frames = NULL;
    *n_frames = 0;
    snprintf(why, why_len, "%s", NOT_BUILT);
    return -1;
}

/* Same formula as avdecode.c (pure arithmetic, kept so callers that size
 * frames still link). */
void clef_video_frame_size(int32_t w, int32_t h, int32_t *ow, int32_t *oh) {
    *ow = w;
    *oh = h;
    if ((int64_t)w * h <= CLEF_VIDEO_FRAME_MAX_PIXELS) return;
    double s = sqrt((double)CLEF_VIDEO_FRAME_MAX_PIXELS / ((double)w * (double)h));
    double rw = rint(w * s / 2.0) * 2.0, rh = rint(h * s / 2.0) * 2.0; /* Python round: half to even */
    *ow = rw < 2 ? 2 : (int32_t)rw;
    *oh = rh < 2 ? 2 : (int32_t)rh;
}
