/* avdecode.h — audio and video containers decoded with FFmpeg from memory,
 * as the reference does with PyAV (SPEC §9 "Audio", "Video").
 *
 * Only a fixed list of demuxers is allowed (WAV, Matroska/WebM, MP4/MOV,
 * Ogg, MP3, FLAC, AAC/ADTS, AIFF, AVI); playlists and other demuxers that
 * open further URLs are never probed.  Decoding is single-threaded.
 */
#ifndef CLEF_MEDIA_AVDECODE_H
#define CLEF_MEDIA_AVDECODE_H

#include <stddef.h>
#include <stdint.h>

#include "media/media.h"

/* Largest frame the reference hands to the processor unscaled (PyAV
 * to_ndarray(width, height) above it, SPEC §9 "Conversion and downscale"). */
#define CLEF_VIDEO_FRAME_MAX_PIXELS 262144

/* What a container's headers say, read without decoding a packet
 * (avformat_open_input alone: no stream-info pass). */
typedef struct clef_av_header {
    int has_video, has_audio;  /* a stream of that kind exists */
    int32_t width, height;     /* the first video stream's coded size; 0 = not in the headers */
    size_t frame_bytes;        /* one decoded frame of it in the codec's pixel format; 0 = not known */
    double video_seconds;      /* the first video / audio stream's duration (or the container's); */
    double audio_seconds;      /*   < 0 = not in the headers */
} clef_av_header;

/* Read the headers of `data`.  Returns 0, or -1 when the container cannot
 * be opened (clef_av_decode_* then fail at that same first step). */
int clef_av_probe(const uint8_t *data, size_t size, clef_av_header *out);

/* Memory accounting of one decode (media.c's decoded-media budget).
 * `granted` bytes were charged from the header; before the decoder holds
 * more than that in what it keeps (audio: the sample buffer's capacity;
 * video: the kept rgb24 frames and their array) it calls grow(ctx, extra)
 * for the difference and adds it to `granted`: grow returns 0 when granted,
 * -1 when refused, which fails the decode (why "decoded-media budget
 * refused more memory"; the callback keeps its own reason).  NULL = no
 * accounting.  The decoder's own working frames are not tracked (they are
 * part of the header's charge). */
typedef struct clef_av_allowance {
    size_t granted;
    int (*grow)(void *ctx, size_t extra);
    void *ctx;
} clef_av_allowance;

/* 1 if the container has at least one audio stream, 0 if not, -1 (with
 * `why`) if it cannot be opened. */
int clef_av_has_audio(const uint8_t *data, size_t size, char *why, size_t why_len);

/* Decode the first audio stream to mono fp32 at 16 kHz (libswresample;
 * PCM16 gives s/32768 exactly).  Fails when there is no audio stream, the
 * data is invalid or it decodes to no samples (-1), lasts longer than
 * `max_seconds` (CLEF_MEDIA_OVER_LIMIT, media.h; "audio lasts longer than
 * 300 s, the most the context window takes"), or `allow` refuses more memory
 * (-1).  *samples is malloc'd (caller frees). */
int clef_av_decode_audio(const uint8_t *data, size_t size, double max_seconds, clef_av_allowance *allow,
                         float **samples, size_t *n_samples, char *why, size_t why_len);

/* Decode the first video stream and keep a frame when
 * time + 1e-6 >= kept/2 (2 fps; time = pts * time_base as PyAV's frame.time),
 * converted to rgb24 and, above 262,144 px, scaled down by swscale
 * (bilinear) to max(2, round(side*s/2)*2) with s = sqrt(262144/(w*h)).
 * An odd number of kept frames is NOT padded here.  Fails (-1) on invalid
 * data, no video stream, no frames, frames of different sizes, or `allow`
 * refusing more memory; returns CLEF_MEDIA_OVER_LIMIT (media.h) for a frame
 * larger than `max_pixels` ("... the canvas holds at most N pixels"), one
 * later than `max_seconds` or more than 20,000 decoded frames ("... the most
 * the context window takes").  *frames is malloc'd: an array
 * of *n_frames clef_rgb (free each with clef_rgb_free, then the array). */
int clef_av_decode_video(const uint8_t *data, size_t size, double max_seconds, size_t max_pixels,
                         clef_av_allowance *allow, clef_rgb **frames, size_t *n_frames, char *why, size_t why_len);

/* The downscaled size of a w x h frame (unchanged at or below 262,144 px). */
void clef_video_frame_size(int32_t w, int32_t h, int32_t *ow, int32_t *oh);

#endif
