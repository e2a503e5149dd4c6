#include "media/media.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "media/avdecode.h"
#include "media/dataurl.h"
#include "media/image.h"
#include "media/melspec.h"
#include "media/resize.h"
#include "util/buf.h"

#define WHY_MAX 256
/* The shortest clip the reference can featurise alone: its STFT reflect-pads
 * 200 samples, which needs more than 200 (project rule: also beside longer clips). */
#define CLEF_MIN_CLIP_SAMPLES 201

clef_media_limits clef_media_limits_default(void) {
    clef_media_limits l;
    l.max_images = 4;
    l.max_image_bytes = 4u << 20;
    l.max_image_pixels = 16000000;
    l.max_audio = 4;
    l.max_audio_bytes = 8u << 20;
    l.max_audio_seconds = 300.0;
    l.max_videos = 2;
    l.max_video_bytes = 16u << 20;
    l.max_video_seconds = 60.0;
    return l;
}

/* "images[2]: image payload is invalid: <why>", param "images[2]"; `rc` is
 * the decoder's return value: CLEF_MEDIA_OVER_LIMIT makes it a capacity
 * refusal (SPEC §2.2 rule 9's text, the type of the capacity cases). */
static int item_fail(clef_err *err, const char *field, size_t i, const char *kind, int rc, const char *why) {
    char param[64];
    snprintf(param, sizeof param, "%s[%zu]", field, i);
    return clef_fail(err, 422, rc == CLEF_MEDIA_OVER_LIMIT ? CLEF_E_CAPACITY : CLEF_E_REQUEST, param,
                     "%s: %s payload is invalid: %s", param, kind, why);
}

/* "images: 5 images exceed the limit of 4 images per context window". */
static int count_fail(clef_err *err, const char *field, size_t n, const char *noun, size_t max) {
    return clef_fail(err, 422, CLEF_E_CAPACITY, field, "%s: %zu %s exceed the limit of %zu %s per context window",
                     field, n, noun, max, noun);
}

/* Parse the data URL and check that its MIME type is `<top>/...`; returns
 * clef_dataurl_parse's value (CLEF_MEDIA_OVER_LIMIT for too many bytes). */
static int open_item(const clef_media_item *it, const char *top, size_t max_bytes, clef_dataurl *du, char *why) {
    int rc = clef_dataurl_parse(it->url, it->len, max_bytes, du, why, WHY_MAX);
    if (rc) return rc;
    size_t n = strlen(top);
    if (strncmp(du->mime, top, n) != 0 || du->mime[n] != '/') {
        snprintf(why, WHY_MAX, "MIME type %s is not %s/*", du->mime, top);
        clef_dataurl_free(du);
        return -1;
    }
    return 0;
}

static int decode_image(clef_media *m, size_t i, const clef_media_item *it, const clef_media_limits *lim,
                        clef_err *err) {
    char why[WHY_MAX];
    clef_dataurl du;
    int rc = open_item(it, "image", lim->max_image_bytes, &du, why);
    if (rc) return item_fail(err, "images", i, "image", rc, why);
    rc = clef_image_decode(du.data, du.size, lim->max_image_pixels, &m->images[i], why, sizeof why);
    clef_dataurl_free(&du);
    if (rc) return item_fail(err, "images", i, "image", rc, why);
    int32_t h, w;
    if (clef_smart_resize(m->images[i].h, m->images[i].w, CLEF_RESIZE_FACTOR, CLEF_IMAGE_MIN_PIXELS,
                          CLEF_IMAGE_MAX_PIXELS, &h, &w))
        return item_fail(err, "images", i, "image", -1, "aspect ratio is above 200");
    m->image_grids[i] = (clef_grid){1, h / CLEF_PATCH, w / CLEF_PATCH};
    return 0;
}

static int decode_video(clef_media *m, size_t i, const clef_media_item *it, const clef_media_limits *lim,
                        clef_dataurl *du, clef_err *err) {
    char why[WHY_MAX];
    int rc = open_item(it, "video", lim->max_video_bytes, du, why);
    if (rc) return item_fail(err, "videos", i, "video", rc, why);
    clef_rgb *frames;
    size_t n;
    rc = clef_av_decode_video(du->data, du->size, lim->max_video_seconds, lim->max_image_pixels, &frames, &n, why,
                              sizeof why);
    if (rc) return item_fail(err, "videos", i, "video", rc, why);
    if (n % CLEF_TEMPORAL_PATCH) { /* odd count: repeat the last frame */
        frames = clef_xrealloc(frames, (n + 1) * sizeof *frames);
        frames[n].w = frames[n - 1].w;
        frames[n].h = frames[n - 1].h;
        size_t bytes = (size_t)frames[n].w * frames[n].h * 3;
        frames[n].data = clef_xmalloc(bytes);
        memcpy(frames[n].data, frames[n - 1].data, bytes);
        n++;
    }
    m->frames[i] = frames;
    m->video_frames[i] = n;
    int32_t h, w;
    if (clef_smart_resize(frames[0].h, frames[0].w, CLEF_RESIZE_FACTOR, CLEF_VIDEO_MIN_PIXELS, CLEF_VIDEO_MAX_PIXELS,
                          &h, &w))
        return item_fail(err, "videos", i, "video", -1, "aspect ratio is above 200");
    m->video_grids[i] = (clef_grid){(int32_t)(n / CLEF_TEMPORAL_PATCH), h / CLEF_PATCH, w / CLEF_PATCH};
    m->video_second_per_grid[i] = CLEF_TEMPORAL_PATCH / 2.0; /* temporal_patch_size / fps, fps = 2 */
    return 0;
}

/* Decode clip `c` of the batch from `data`; `field`/`i`/`kind` name it in errors. */
static int decode_clip(clef_media *m, size_t c, const uint8_t *data, size_t size, double max_seconds,
                       const char *field, size_t i, const char *kind, const char *what, clef_err *err) {
    char why[WHY_MAX], msg[WHY_MAX + 32];
    int rc = clef_av_decode_audio(data, size, max_seconds, &m->clips[c], &m->clip_samples[c], why, sizeof why);
    if (rc) {
        snprintf(msg, sizeof msg, "%s%s", what, why);
        return item_fail(err, field, i, kind, rc, msg);
    }
    if (m->clip_samples[c] < CLEF_MIN_CLIP_SAMPLES) {
        snprintf(msg, sizeof msg, "%saudio is %zu samples long at 16 kHz; at least %d are needed", what,
                 m->clip_samples[c], CLEF_MIN_CLIP_SAMPLES);
        return item_fail(err, field, i, kind, -1, msg);
    }
    return 0;
}

static int decode_all(const clef_media_source *src, const clef_media_limits *lim, clef_media *m, clef_err *err) {
    if (src->n_images > lim->max_images) return count_fail(err, "images", src->n_images, "images", lim->max_images);
    if (src->n_audio > lim->max_audio) return count_fail(err, "audio", src->n_audio, "audio clips", lim->max_audio);
    if (src->n_videos > lim->max_videos) return count_fail(err, "videos", src->n_videos, "videos", lim->max_videos);

    m->n_images = src->n_images;
    m->images = clef_xcalloc(m->n_images, sizeof *m->images);
    m->image_grids = clef_xcalloc(m->n_images, sizeof *m->image_grids);
    for (size_t i = 0; i < m->n_images; i++)
        if (decode_image(m, i, &src->images[i], lim, err)) return -1;

    /* Videos first, to learn whether every one has a soundtrack (which then
     * joins the audio batch after the standalone clips). */
    m->n_videos = src->n_videos;
    m->frames = clef_xcalloc(m->n_videos, sizeof *m->frames);
    m->video_frames = clef_xcalloc(m->n_videos, sizeof *m->video_frames);
    m->video_grids = clef_xcalloc(m->n_videos, sizeof *m->video_grids);
    m->video_second_per_grid = clef_xcalloc(m->n_videos, sizeof *m->video_second_per_grid);
    clef_dataurl *vdu = clef_xcalloc(m->n_videos, sizeof *vdu);
    int rc = 0, all_audio = m->n_videos > 0;
    for (size_t i = 0; i < m->n_videos && rc == 0; i++) {
        rc = decode_video(m, i, &src->videos[i], lim, &vdu[i], err);
        if (rc == 0) {
            char why[WHY_MAX];
            int has = clef_av_has_audio(vdu[i].data, vdu[i].size, why, sizeof why);
            if (has < 0) rc = item_fail(err, "videos", i, "video", -1, why);
            if (has <= 0) all_audio = 0;
        }
    }
    m->use_audio_in_video = all_audio;

    m->n_audio = src->n_audio;
    m->n_clips = m->n_audio + (m->use_audio_in_video ? m->n_videos : 0);
    m->clips = clef_xcalloc(m->n_clips, sizeof *m->clips);
    m->clip_samples = clef_xcalloc(m->n_clips, sizeof *m->clip_samples);
    m->feature_lens = clef_xcalloc(m->n_clips, sizeof *m->feature_lens);
    m->audio_tokens = clef_xcalloc(m->n_clips, sizeof *m->audio_tokens);
    for (size_t i = 0; i < m->n_audio && rc == 0; i++) {
        char why[WHY_MAX];
        clef_dataurl du;
        int orc = open_item(&src->audio[i], "audio", lim->max_audio_bytes, &du, why);
        if (orc) {
            rc = item_fail(err, "audio", i, "audio", orc, why);
            break;
        }
        rc = decode_clip(m, i, du.data, du.size, lim->max_audio_seconds, "audio", i, "audio", "", err);
        clef_dataurl_free(&du);
    }
    for (size_t i = 0; i < m->n_videos && rc == 0 && m->use_audio_in_video; i++)
        rc = decode_clip(m, m->n_audio + i, vdu[i].data, vdu[i].size, lim->max_video_seconds, "videos", i, "video",
                         "soundtrack: ", err);
    for (size_t i = 0; i < m->n_videos; i++) clef_dataurl_free(&vdu[i]);
    free(vdu);
    if (rc) return -1;

    size_t l_max = 0;
    for (size_t c = 0; c < m->n_clips; c++)
        if (m->clip_samples[c] > l_max) l_max = m->clip_samples[c];
    m->n_frames = l_max / CLEF_HOP;
    for (size_t c = 0; c < m->n_clips; c++) {
        m->feature_lens[c] = clef_audio_frames(m->clip_samples[c], l_max);
        m->audio_tokens[c] = clef_audio_tokens(m->feature_lens[c]);
    }
    return 0;
}

int clef_media_decode(const clef_media_source *src, const clef_media_limits *lim, clef_media *out, clef_err *err) {
    memset(out, 0, sizeof *out);
    clef_media_limits dl = clef_media_limits_default();
    if (!lim) lim = &dl;
    if (decode_all(src, lim, out, err)) {
        clef_media_free(out);
        return -1;
    }
    return 0;
}

size_t clef_media_image_tokens(const clef_media *m, size_t i) {
    const clef_grid *g = &m->image_grids[i];
    return (size_t)g->t * g->h * g->w / (CLEF_MERGE * CLEF_MERGE);
}

size_t clef_media_video_tokens(const clef_media *m, size_t i) {
    const clef_grid *g = &m->video_grids[i];
    return (size_t)g->t * g->h * g->w / (CLEF_MERGE * CLEF_MERGE);
}

size_t clef_media_pad_tokens(const clef_media *m) {
    size_t n = 0;
    for (size_t i = 0; i < m->n_images; i++) n += clef_media_image_tokens(m, i);
    for (size_t i = 0; i < m->n_videos; i++) n += clef_media_video_tokens(m, i);
    for (size_t c = 0; c < m->n_clips; c++) n += (size_t)m->audio_tokens[c];
    return n;
}

int clef_media_empty(const clef_media *m) { return m->n_images == 0 && m->n_videos == 0 && m->n_clips == 0; }

/* Resize each frame to h x w and append its patch rows at `out`. */
static void frames_to_rows(clef_rgb *frames, size_t n, int32_t h, int32_t w, float *out) {
    uint8_t **resized = clef_xcalloc(n, sizeof *resized);
    for (size_t f = 0; f < n; f++) {
        if (f > 0 && frames[f].data == frames[f - 1].data) { /* an image's repeated frame */
            resized[f] = resized[f - 1];
            continue;
        }
        resized[f] = clef_xmalloc((size_t)w * h * 3);
        clef_resize_bicubic_aa_u8(frames[f].data, frames[f].w, frames[f].h, resized[f], w, h);
    }
    clef_patchify((const uint8_t *const *)resized, n, h, w, out);
    for (size_t f = 0; f < n; f++)
        if (f == 0 || resized[f] != resized[f - 1]) free(resized[f]);
    free(resized);
}

int clef_media_preprocess(clef_media *m, clef_err *err) {
    (void)err;
    m->image_rows = 0;
    for (size_t i = 0; i < m->n_images; i++)
        m->image_rows += (size_t)m->image_grids[i].t * m->image_grids[i].h * m->image_grids[i].w;
    m->video_rows = 0;
    for (size_t i = 0; i < m->n_videos; i++)
        m->video_rows += (size_t)m->video_grids[i].t * m->video_grids[i].h * m->video_grids[i].w;

    free(m->pixel_values);
    m->pixel_values = clef_xmalloc(sizeof(float) * CLEF_PATCH_DIM * (m->image_rows ? m->image_rows : 1));
    size_t row = 0;
    for (size_t i = 0; i < m->n_images; i++) {
        const clef_grid *g = &m->image_grids[i];
        /* An image is one temporal patch of the same frame twice. */
        clef_rgb pair[CLEF_TEMPORAL_PATCH] = {m->images[i], m->images[i]};
        frames_to_rows(pair, CLEF_TEMPORAL_PATCH, g->h * CLEF_PATCH, g->w * CLEF_PATCH,
                       m->pixel_values + row * CLEF_PATCH_DIM);
        row += (size_t)g->t * g->h * g->w;
        clef_rgb_free(&m->images[i]);
    }
    free(m->pixel_values_videos);
    m->pixel_values_videos = clef_xmalloc(sizeof(float) * CLEF_PATCH_DIM * (m->video_rows ? m->video_rows : 1));
    row = 0;
    for (size_t i = 0; i < m->n_videos; i++) {
        const clef_grid *g = &m->video_grids[i];
        frames_to_rows(m->frames[i], m->video_frames[i], g->h * CLEF_PATCH, g->w * CLEF_PATCH,
                       m->pixel_values_videos + row * CLEF_PATCH_DIM);
        row += (size_t)g->t * g->h * g->w;
        for (size_t f = 0; f < m->video_frames[i]; f++) clef_rgb_free(&m->frames[i][f]);
    }

    free(m->input_features);
    m->input_features = NULL;
    if (m->n_clips) {
        size_t l_max = 0;
        for (size_t c = 0; c < m->n_clips; c++)
            if (m->clip_samples[c] > l_max) l_max = m->clip_samples[c];
        m->input_features = clef_xmalloc(sizeof(float) * m->n_clips * CLEF_MEL_BINS * m->n_frames);
        if (clef_log_mel((const float *const *)m->clips, m->clip_samples, m->n_clips, l_max, m->input_features))
            return clef_fail(err, 422, CLEF_E_REQUEST, "audio", "audio: clips are too short");
        for (size_t c = 0; c < m->n_clips; c++) {
            free(m->clips[c]);
            m->clips[c] = NULL;
        }
    }
    return 0;
}

void clef_media_free(clef_media *m) {
    if (!m) return;
    for (size_t i = 0; m->images && i < m->n_images; i++) clef_rgb_free(&m->images[i]);
    free(m->images);
    free(m->image_grids);
    for (size_t i = 0; m->frames && i < m->n_videos; i++) {
        for (size_t f = 0; m->frames[i] && f < m->video_frames[i]; f++) clef_rgb_free(&m->frames[i][f]);
        free(m->frames[i]);
    }
    free(m->frames);
    free(m->video_frames);
    free(m->video_grids);
    free(m->video_second_per_grid);
    for (size_t c = 0; m->clips && c < m->n_clips; c++) free(m->clips[c]);
    free(m->clips);
    free(m->clip_samples);
    free(m->feature_lens);
    free(m->audio_tokens);
    free(m->pixel_values);
    free(m->pixel_values_videos);
    free(m->input_features);
    memset(m, 0, sizeof *m);
}
