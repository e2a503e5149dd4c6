/* media.h — images, audio and video of a request, decoded and preprocessed
 * exactly as the reference's Qwen3-Omni processor does (SPEC.md §9).
 *
 * A request's media go through two phases so that the token cost is known
 * (and the capacity check of SPEC §3.4 can run) before the large tensors are
 * built:
 *
 *   clef_media_decode      data URLs -> pixels / samples, grids, token counts
 *   clef_media_preprocess  -> pixel_values, pixel_values_videos, input_features
 *
 * Then clef_media_prompt_ids (media/prompt.h) gives the media block of the
 * prompt and clef_media_positions the 3-D M-RoPE positions.
 *
 * Shapes follow the processor's tensors:
 *   pixel_values         [image_rows, 1536] fp32  (all images, request order)
 *   pixel_values_videos  [video_rows, 1536] fp32  (all videos, request order)
 *   input_features       [n_clips, 128, n_frames] fp32 (standalone clips in
 *                        request order, then the videos' soundtracks)
 * Each 1536-value row is one 16x16 patch over 2 temporal frames in
 * (channel, t, y, x) order; rows run (t, block_row, block_col, in_row, in_col)
 * over 2x2 merge blocks.
 *
 * Errors: 422 naming the item, e.g. param "images[0]", message
 * "images[0]: image payload is invalid: <why>".  A malformed item is
 * invalid_request; an item over a configured limit (bytes, pixels, duration,
 * decoded frames) is capacity_exceeded and its <why> holds one of the
 * Decision Index kit's capacity phrases ("the canvas holds" for pixels,
 * "context window" for the rest); too many items is capacity_exceeded
 * "images: 5 images exceed the limit of 4 images per context window"
 * (param "images").
 */
#ifndef CLEF_MEDIA_MEDIA_H
#define CLEF_MEDIA_MEDIA_H

#include <stddef.h>
#include <stdint.h>

#include "util/budget.h"
#include "util/err.h"

/* Patch geometry of the Qwen3-Omni processors (SPEC §9). */
#define CLEF_PATCH 16           /* spatial patch side, pixels */
#define CLEF_TEMPORAL_PATCH 2   /* frames per temporal patch */
#define CLEF_MERGE 2            /* 2x2 patches merge into one LLM token */
#define CLEF_PATCH_DIM (3 * CLEF_TEMPORAL_PATCH * CLEF_PATCH * CLEF_PATCH) /* 1536 values per row */
#define CLEF_MEL_BINS 128
#define CLEF_HOP 160            /* samples per log-mel frame at 16 kHz */
#define CLEF_SAMPLE_RATE 16000

/* What the item decoders (clef_dataurl_parse, clef_image_decode,
 * clef_av_decode_audio, clef_av_decode_video) return when they refuse an
 * item for a configured capacity limit (decoded bytes, pixels, duration,
 * decoded frames) rather than because it is malformed (-1).  `why` is filled
 * either way; clef_media_decode turns this one into 422 capacity_exceeded. */
#define CLEF_MEDIA_OVER_LIMIT (-2)

/* Configurable limits (issue 6).  Byte limits apply to the decoded payload,
 * pixel limits to the header's width x height (checked before any pixel
 * buffer is allocated), seconds to the decoded duration. */
typedef struct clef_media_limits {
    size_t max_images;        /* 4 */
    size_t max_image_bytes;   /* 4 MiB */
    size_t max_image_pixels;  /* 16,000,000 (also bounds each video frame) */
    size_t max_audio;         /* 4 */
    size_t max_audio_bytes;   /* 8 MiB */
    double max_audio_seconds; /* 300 */
    size_t max_videos;        /* 2 */
    size_t max_video_bytes;   /* 16 MiB */
    double max_video_seconds; /* 60 (frames and soundtrack) */
    clef_budget *budget;      /* server-wide decoded-media budget, borrowed; NULL (the default, and
                                 the CLI) = no accounting.  See clef_media_decode. */
    long budget_wait_ms;      /* how long a request waits for room in `budget` (0 = not at all) */
} clef_media_limits;

clef_media_limits clef_media_limits_default(void);

/* One media item as it arrived: a data URL "data:<type>/<subtype>;base64,<b64>",
 * borrowed (not NUL-terminated necessarily). */
typedef struct clef_media_item {
    const char *url;
    size_t len;
} clef_media_item;

/* The request's media, borrowed from the request body. */
typedef struct clef_media_source {
    const clef_media_item *images;
    size_t n_images;
    const clef_media_item *audio;
    size_t n_audio;
    const clef_media_item *videos;
    size_t n_videos;
} clef_media_source;

/* Patch grid (t, h, w) of one image or video: t temporal patches, h x w
 * spatial patches of 16 px.  LLM tokens = t*h*w/4. */
typedef struct clef_grid {
    int32_t t, h, w;
} clef_grid;

/* Interleaved RGB, 8 bits per channel, rows top to bottom: data[(y*w + x)*3 + c]. */
typedef struct clef_rgb {
    int32_t w, h;
    uint8_t *data; /* owned */
} clef_rgb;

/* A decoded request's media and (after clef_media_preprocess) its tensors.
 * Owns everything it points to; release with clef_media_free. */
typedef struct clef_media {
    /* images, request order */
    size_t n_images;
    clef_rgb *images;          /* decoded RGB (freed by preprocess) */
    clef_grid *image_grids;    /* [n_images] */
    /* videos, request order */
    size_t n_videos;
    size_t *video_frames;      /* [n_videos] kept frames after padding to even */
    clef_rgb **frames;         /* [n_videos][video_frames[i]] rgb24 frames (freed by preprocess) */
    clef_grid *video_grids;    /* [n_videos] */
    double *video_second_per_grid; /* [n_videos], 2/fps = 1.0 */
    int use_audio_in_video;    /* 1 iff n_videos > 0 and every video has an audio track */
    /* audio clips, batch order: standalone clips then (if use_audio_in_video) soundtracks */
    size_t n_clips;
    size_t n_audio;            /* standalone clips (the first n_audio of the batch) */
    float **clips;             /* [n_clips] mono fp32 16 kHz samples (freed by preprocess) */
    size_t *clip_samples;      /* [n_clips] */
    int32_t *feature_lens;     /* [n_clips] m: log-mel frames of each clip (feature mask sum) */
    int32_t *audio_tokens;     /* [n_clips] f(m) */

    /* tensors (clef_media_preprocess) */
    float *pixel_values;        /* [image_rows, 1536] */
    size_t image_rows;
    float *pixel_values_videos; /* [video_rows, 1536] */
    size_t video_rows;
    float *input_features;      /* [n_clips, 128, n_frames] */
    size_t n_frames;            /* floor(L_max / 160) */

    /* the decoded-media budget's charge (clef_media_limits.budget) */
    clef_budget *budget;        /* borrowed; NULL = none */
    size_t charged;             /* bytes of `budget` held; given back by clef_media_free */
    long budget_wait_ms;
} clef_media;

/* Decode every item (SPEC §9): parse the data URL, check the limits, decode
 * images to RGB (alpha dropped), audio to mono fp32 16 kHz, video frames at
 * 2 fps (rgb24, odd counts padded with the last frame) and, when every video
 * has one, the soundtracks; compute grids, frame counts and token counts.
 * `lim` NULL = defaults.  `out` is zeroed first; on error it is freed and
 * `err` holds 422 naming the item (SPEC §2.2 rule 9): invalid_request for a
 * malformed item, capacity_exceeded for one over a limit or too many items.
 *
 * With lim->budget, before anything is decoded, every item's header is read
 * (clef_image_probe, clef_av_probe; nothing decoded) and the request's
 * worst-case decoded working memory (clef_media_charge_bytes) is taken from
 * the budget in one charge, waiting up to lim->budget_wait_ms; no room is
 * 503 "overloaded" (util/budget.h's message, naming the budget and the
 * numbers), param null, and nothing is decoded.  A container whose decoded
 * length passes its header's asks the budget for the difference as it
 * decodes (refused: the same 503).  The charge is held in out->charged:
 * clef_media_preprocess lowers it to the tensors' bytes, clef_media_free
 * gives it back. */
int clef_media_decode(const clef_media_source *src, const clef_media_limits *lim, clef_media *out, clef_err *err);

/* The bytes clef_media_decode charges `src` with: the larger of
 *   decode:     the payloads + every decoded output kept until preprocessing
 *               (RGB images, rgb24 video frames, audio sample buffers) + the
 *               largest decoder's own working memory (clef_image_probe's,
 *               or FFmpeg's: 18 reference frames of the codec's pixel format,
 *               its packet buffers up to the payload, 2 MiB of contexts);
 *   preprocess: the decoded outputs + the tensors (pixel_values,
 *               pixel_values_videos, input_features) + the largest resize
 *               working set (resized frames, clef_resize_scratch_bytes).
 * Durations and frame counts come from the headers, else the limits.  Items
 * are read in decoding order (images, videos, audio) up to the first whose
 * header cannot be read: decoding fails at that item anyway.  Returns 0, or
 * -1 with `err` like clef_media_decode's count checks. */
int clef_media_charge_bytes(const clef_media_source *src, const clef_media_limits *lim, size_t *bytes, clef_err *err);

/* Build the processor tensors from the decoded media and release the decoded
 * pixels and samples; a budget charge is lowered to the tensors' bytes.
 * Errors: none expected beyond allocation (aborts). */
int clef_media_preprocess(clef_media *m, clef_err *err);

/* LLM tokens of image i / video i: grid t*h*w / 4. */
size_t clef_media_image_tokens(const clef_media *m, size_t i);
size_t clef_media_video_tokens(const clef_media *m, size_t i);
/* Total media pad tokens (image + video + audio pads; markers not counted). */
size_t clef_media_pad_tokens(const clef_media *m);
/* 1 if the request carries no media at all. */
int clef_media_empty(const clef_media *m);

void clef_media_free(clef_media *m);

#endif
