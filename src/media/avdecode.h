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

/* 1 if the container has at least one audio stream, 0 if not, -1 (with
 * `why`) if it cannot be opened. */
int clef_av_has_audio(const uint8_t *data, size_t size, char *why, size_t why_len);

/* Decode the first audio stream to mono fp32 at 16 kHz (libswresample;
 * PCM16 gives s/32768 exactly).  Fails when there is no audio stream, the
 * data is invalid or it decodes to no samples (-1), or it lasts longer than
 * `max_seconds` (CLEF_MEDIA_OVER_LIMIT, media.h; "audio lasts longer than
 * 300 s, the most the context window takes").  *samples is malloc'd (caller
 * frees). */
int clef_av_decode_audio(const uint8_t *data, size_t size, double max_seconds, float **samples, size_t *n_samples,
                         char *why, size_t why_len);

/* Decode the first video stream and keep a frame when
 * time + 1e-6 >= kept/2 (2 fps; time = pts * time_base as PyAV's frame.time),
 * converted to rgb24 and, above 262,144 px, scaled down by swscale
 * (bilinear) to max(2, round(side*s/2)*2) with s = sqrt(262144/(w*h)).
 * An odd number of kept frames is NOT padded here.  Fails (-1) on invalid
 * data, no video stream, no frames, or frames of different sizes; returns
 * CLEF_MEDIA_OVER_LIMIT (media.h) for a frame larger than `max_pixels`
 * ("... the canvas holds at most N pixels"), one later than `max_seconds` or
 * more than 20,000 decoded frames ("... the most the context window
 * takes").  *frames is malloc'd: an array
 * of *n_frames clef_rgb (free each with clef_rgb_free, then the array). */
int clef_av_decode_video(const uint8_t *data, size_t size, double max_seconds, size_t max_pixels, clef_rgb **frames,
                         size_t *n_frames, char *why, size_t why_len);

/* The downscaled size of a w x h frame (unchanged at or below 262,144 px). */
void clef_video_frame_size(int32_t w, int32_t h, int32_t *ow, int32_t *oh);

#endif
