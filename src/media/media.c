#include "media/media.h"

#include <math.h>
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
    l.budget = NULL;
    l.budget_wait_ms = 0;
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

/* ---- the decoded-media budget's charge (clef_media_charge_bytes) -------- */

/* FFmpeg per decode: format, codec and resampler contexts, the I/O buffer. */
#define AV_LIB_BYTES ((size_t)2 << 20)
/* avformat_find_stream_info buffers packets up to its probesize (default). */
#define AV_PROBE_BYTES ((size_t)5000000)
/* Frames an FFmpeg video decoder may hold: H.264's 16 references, the frame
 * being decoded and one waiting for output. */
#define VIDEO_DECODER_FRAMES 18
/* clef_log_mel: the filter bank (201 x 128 doubles) and the FFT buffers. */
#define MEL_SCRATCH_BYTES ((size_t)256 << 10)

/* Sums and maxima over the items read so far. */
typedef struct media_plan {
    size_t payload;          /* decoded data URLs (bytes) */
    size_t keep;             /* decoded outputs kept until preprocessing */
    size_t decode_extra;     /* max: one decoder's working memory beyond what it keeps */
    size_t tensor;           /* pixel_values + pixel_values_videos rows */
    size_t pre_scratch;      /* max: one item's resize working set */
    size_t n_clips, l_max;   /* clips (standalone + soundtracks) and the longest's samples */
    size_t *video_keep;      /* [n_videos] what each video's decoder keeps (its allowance); owned */
    size_t *clip_keep;       /* [n_audio + n_videos] each clip's sample buffer (its allowance); owned */
} media_plan;

static void max_into(size_t *m, size_t v) {
    if (v > *m) *m = v;
}

/* The audio decoder's sample buffer: 16384 floats, doubled until it holds n. */
static size_t clip_buffer_bytes(size_t n) {
    size_t cap = 16384;
    while (cap < n) cap *= 2;
    return cap * sizeof(float);
}

/* Samples of a clip of `seconds` (< 0 = unknown: the limit), one second of
 * slack for codec padding and the resampler's tail. */
static size_t clip_samples_bound(double seconds, double max_seconds) {
    double d = seconds >= 0 && seconds < max_seconds ? seconds : max_seconds;
    return (size_t)ceil(d * CLEF_SAMPLE_RATE) + CLEF_SAMPLE_RATE;
}

static void plan_clip(media_plan *p, size_t c, size_t samples, size_t payload) {
    p->clip_keep[c] = clip_buffer_bytes(samples);
    p->keep += p->clip_keep[c];
    max_into(&p->decode_extra, AV_LIB_BYTES + (payload < AV_PROBE_BYTES ? payload : AV_PROBE_BYTES));
    p->n_clips++;
    max_into(&p->l_max, samples);
}

/* One image from its header; -1 = decoding stops at this item. */
static int plan_image(media_plan *p, const clef_media_item *it, const clef_media_limits *lim) {
    char why[WHY_MAX];
    clef_dataurl du;
    if (open_item(it, "image", lim->max_image_bytes, &du, why)) return -1;
    clef_image_header hd;
    int rc = clef_image_probe(du.data, du.size, lim->max_image_pixels, &hd);
    size_t payload = du.size;
    clef_dataurl_free(&du);
    if (rc) return -1;
    size_t rgb = (size_t)hd.w * hd.h * 3;
    p->payload += payload;
    p->keep += rgb;
    max_into(&p->decode_extra, hd.decode_bytes - rgb);
    int32_t h, w;
    if (clef_smart_resize(hd.h, hd.w, CLEF_RESIZE_FACTOR, CLEF_IMAGE_MIN_PIXELS, CLEF_IMAGE_MAX_PIXELS, &h, &w))
        return -1;
    p->tensor += (size_t)(h / CLEF_PATCH) * (w / CLEF_PATCH) * CLEF_PATCH_DIM * sizeof(float);
    max_into(&p->pre_scratch, (size_t)h * w * 3 + clef_resize_scratch_bytes(hd.w, hd.h, w, h));
    return 0;
}

/* One video (and its soundtrack, if it has one) from its headers. */
static int plan_video(media_plan *p, size_t i, size_t n_audio, const clef_media_item *it,
                      const clef_media_limits *lim) {
    char why[WHY_MAX];
    clef_dataurl du;
    if (open_item(it, "video", lim->max_video_bytes, &du, why)) return -1;
    clef_av_header hd;
    int rc = clef_av_probe(du.data, du.size, &hd);
    size_t payload = du.size;
    clef_dataurl_free(&du);
    /* No video stream in the headers: decoding fails at this item ("no
     * video stream"); were one to appear later, its kept frames would ask
     * the budget as they come (their allowance is 0). */
    if (rc || !hd.has_video) return -1;
    /* Not in the headers: the largest frame the limit allows. */
    int32_t w = hd.width, h = hd.height;
    if (!w || !h) w = h = (int32_t)sqrt((double)lim->max_image_pixels);
    if ((uint64_t)w * (uint64_t)h > lim->max_image_pixels) return -1; /* refused from the same header */
    int32_t fw, fh;
    clef_video_frame_size(w, h, &fw, &fh);
    double d = hd.video_seconds >= 0 && hd.video_seconds < lim->max_video_seconds ? hd.video_seconds
                                                                                  : lim->max_video_seconds;
    size_t n = (size_t)floor(2.0 * d) + 1; /* frames kept at 2 fps from t = 0 */
    size_t cap = 16;
    while (cap < n) cap *= 2;
    n += n % 2; /* padded to an even count */
    size_t frame = (size_t)fw * fh * 3;
    p->video_keep[i] = n * frame + cap * sizeof(clef_rgb);
    p->payload += payload;
    p->keep += p->video_keep[i];
    size_t coded = hd.frame_bytes ? hd.frame_bytes : (size_t)w * h * 6;
    max_into(&p->decode_extra, VIDEO_DECODER_FRAMES * coded + AV_LIB_BYTES + (payload < AV_PROBE_BYTES ? payload : AV_PROBE_BYTES));
    if (hd.has_audio) /* a soundtrack */
        plan_clip(p, n_audio + i, clip_samples_bound(hd.audio_seconds, lim->max_video_seconds), payload);
    int32_t rh, rw;
    if (clef_smart_resize(fh, fw, CLEF_RESIZE_FACTOR, CLEF_VIDEO_MIN_PIXELS, CLEF_VIDEO_MAX_PIXELS, &rh, &rw))
        return -1;
    /* n frames: n/2 temporal patches of (rh/16)(rw/16) rows of 1536 floats */
    p->tensor += n / CLEF_TEMPORAL_PATCH * (size_t)(rh / CLEF_PATCH) * (rw / CLEF_PATCH) * CLEF_PATCH_DIM * sizeof(float);
    max_into(&p->pre_scratch, n * (size_t)rh * rw * 3 + clef_resize_scratch_bytes(fw, fh, rw, rh));
    return 0;
}

/* One standalone audio clip from its headers. */
static int plan_audio(media_plan *p, size_t i, const clef_media_item *it, const clef_media_limits *lim) {
    char why[WHY_MAX];
    clef_dataurl du;
    if (open_item(it, "audio", lim->max_audio_bytes, &du, why)) return -1;
    clef_av_header hd;
    int rc = clef_av_probe(du.data, du.size, &hd);
    size_t payload = du.size;
    clef_dataurl_free(&du);
    if (rc || !hd.has_audio) return -1; /* decoding fails here: "no audio stream" (see plan_video) */
    p->payload += payload;
    plan_clip(p, i, clip_samples_bound(hd.audio_seconds, lim->max_audio_seconds), payload);
    return 0;
}

/* Read every header (decoding order, up to the first unreadable one) and
 * total the charge; `plan` is filled (free its arrays with plan_free). */
static size_t plan_media(const clef_media_source *src, const clef_media_limits *lim, media_plan *p) {
    memset(p, 0, sizeof *p);
    p->video_keep = clef_xcalloc(src->n_videos + 1, sizeof *p->video_keep);
    p->clip_keep = clef_xcalloc(src->n_audio + src->n_videos + 1, sizeof *p->clip_keep);
    int ok = 1;
    for (size_t i = 0; ok && i < src->n_images; i++) ok = plan_image(p, &src->images[i], lim) == 0;
    for (size_t i = 0; ok && i < src->n_videos; i++) ok = plan_video(p, i, src->n_audio, &src->videos[i], lim) == 0;
    for (size_t i = 0; ok && i < src->n_audio; i++) ok = plan_audio(p, i, &src->audio[i], lim) == 0;
    /* input_features [n_clips][128][l_max / 160], and the two tensors'
     * one-row minimum (clef_media_preprocess) */
    size_t tensors = p->tensor + p->n_clips * CLEF_MEL_BINS * (p->l_max / CLEF_HOP) * sizeof(float) +
                     2 * CLEF_PATCH_DIM * sizeof(float);
    size_t pre_scratch = p->pre_scratch;
    if (p->n_clips) max_into(&pre_scratch, MEL_SCRATCH_BYTES);
    size_t decode = p->payload + p->keep + p->decode_extra, pre = p->keep + tensors + pre_scratch;
    return decode > pre ? decode : pre;
}

static void plan_free(media_plan *p) {
    free(p->video_keep);
    free(p->clip_keep);
    memset(p, 0, sizeof *p);
}

/* An allowance's grow callback: more of the budget for a decode whose
 * output passed its header's length. */
typedef struct budget_grow {
    clef_media *m;
    int refused;
    clef_err err;
} budget_grow;

static int grow_charge(void *ctx, size_t extra) {
    budget_grow *g = ctx;
    if (clef_budget_acquire(g->m->budget, extra, g->m->budget_wait_ms, &g->err)) {
        g->refused = 1;
        return -1;
    }
    g->m->charged += extra;
    return 0;
}

static int count_checks(const clef_media_source *src, const clef_media_limits *lim, clef_err *err);

int clef_media_charge_bytes(const clef_media_source *src, const clef_media_limits *lim, size_t *bytes, clef_err *err) {
    clef_media_limits dl = clef_media_limits_default();
    if (!lim) lim = &dl;
    *bytes = 0;
    if (count_checks(src, lim, err)) return -1;
    media_plan p;
    *bytes = plan_media(src, lim, &p);
    plan_free(&p);
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

/* The allowance of a decode that keeps `granted` bytes by the plan (NULL
 * without a budget). */
static clef_av_allowance *allowance(clef_av_allowance *a, budget_grow *g, size_t granted) {
    if (!g->m->budget) return NULL;
    *a = (clef_av_allowance){granted, grow_charge, g};
    return a;
}

static int decode_video(clef_media *m, size_t i, const clef_media_item *it, const clef_media_limits *lim,
                        clef_dataurl *du, const media_plan *plan, clef_err *err) {
    char why[WHY_MAX];
    int rc = open_item(it, "video", lim->max_video_bytes, du, why);
    if (rc) return item_fail(err, "videos", i, "video", rc, why);
    clef_rgb *frames;
    size_t n;
    budget_grow g = {m, 0, {0}};
    clef_av_allowance a;
    rc = clef_av_decode_video(du->data, du->size, lim->max_video_seconds, lim->max_image_pixels,
                              allowance(&a, &g, plan->video_keep[i]), &frames, &n, why, sizeof why);
    if (rc) {
        if (g.refused) return *err = g.err, -1;
        return item_fail(err, "videos", i, "video", rc, why);
    }
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
                       const media_plan *plan, const char *field, size_t i, const char *kind, const char *what,
                       clef_err *err) {
    char why[WHY_MAX], msg[WHY_MAX + 32];
    budget_grow g = {m, 0, {0}};
    clef_av_allowance a;
    int rc = clef_av_decode_audio(data, size, max_seconds, allowance(&a, &g, plan->clip_keep[c]), &m->clips[c],
                                  &m->clip_samples[c], why, sizeof why);
    if (rc) {
        if (g.refused) return *err = g.err, -1;
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

static int decode_items(const clef_media_source *src, const clef_media_limits *lim, const media_plan *plan,
                        clef_media *m, clef_err *err);

static int count_checks(const clef_media_source *src, const clef_media_limits *lim, clef_err *err) {
    if (src->n_images > lim->max_images) return count_fail(err, "images", src->n_images, "images", lim->max_images);
    if (src->n_audio > lim->max_audio) return count_fail(err, "audio", src->n_audio, "audio clips", lim->max_audio);
    if (src->n_videos > lim->max_videos) return count_fail(err, "videos", src->n_videos, "videos", lim->max_videos);
    return 0;
}

static int decode_all(const clef_media_source *src, const clef_media_limits *lim, clef_media *m, clef_err *err) {
    if (count_checks(src, lim, err)) return -1;
    media_plan plan;
    memset(&plan, 0, sizeof plan);
    if (lim->budget) { /* the whole charge from the headers, before anything is decoded */
        size_t bytes = plan_media(src, lim, &plan);
        if (clef_budget_acquire(lim->budget, bytes, lim->budget_wait_ms, err)) {
            plan_free(&plan);
            return -1;
        }
        m->budget = lim->budget;
        m->charged = bytes;
        m->budget_wait_ms = lim->budget_wait_ms;
    } else {
        plan.video_keep = clef_xcalloc(src->n_videos + 1, sizeof *plan.video_keep);
        plan.clip_keep = clef_xcalloc(src->n_audio + src->n_videos + 1, sizeof *plan.clip_keep);
    }
    int rc = decode_items(src, lim, &plan, m, err);
    plan_free(&plan);
    return rc;
}

static int decode_items(const clef_media_source *src, const clef_media_limits *lim, const media_plan *plan,
                        clef_media *m, clef_err *err) {

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
        rc = decode_video(m, i, &src->videos[i], lim, &vdu[i], plan, err);
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
        rc = decode_clip(m, i, du.data, du.size, lim->max_audio_seconds, plan, "audio", i, "audio", "", err);
        clef_dataurl_free(&du);
    }
    for (size_t i = 0; i < m->n_videos && rc == 0 && m->use_audio_in_video; i++)
        rc = decode_clip(m, m->n_audio + i, vdu[i].data, vdu[i].size, lim->max_video_seconds, plan, "videos", i,
                         "video", "soundtrack: ", err);
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
    /* The decoded pixels and samples are gone: keep only the tensors'
     * bytes charged, until clef_media_free. */
    size_t tensors = sizeof(float) * CLEF_PATCH_DIM * ((m->image_rows ? m->image_rows : 1) + (m->video_rows ? m->video_rows : 1)) +
                     (m->n_clips ? sizeof(float) * m->n_clips * CLEF_MEL_BINS * m->n_frames : 0);
    if (m->budget && m->charged > tensors) {
        clef_budget_release(m->budget, m->charged - tensors);
        m->charged = tensors;
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
    if (m->budget) clef_budget_release(m->budget, m->charged);
    memset(m, 0, sizeof *m);
}
