/* resize.h — the Qwen2-VL image geometry and resampler (SPEC §9 "Images"
 * steps 2-4 and "Resampler").
 */
#ifndef CLEF_MEDIA_RESIZE_H
#define CLEF_MEDIA_RESIZE_H

#include <stddef.h>
#include <stdint.h>

#include "media/media.h"

/* Pixel bounds of smart_resize: images (the reference's size override) and
 * video frames (the Qwen3-Omni video defaults). */
#define CLEF_IMAGE_MIN_PIXELS 65536
#define CLEF_IMAGE_MAX_PIXELS 1048576
#define CLEF_VIDEO_MIN_PIXELS 131072
#define CLEF_VIDEO_MAX_PIXELS 786432
#define CLEF_RESIZE_FACTOR 32 /* patch 16 x merge 2 */

/* transformers' smart_resize(height, width, factor, min_pixels, max_pixels)
 * in double precision with Python's round (half to even).  Writes the target
 * size (multiples of `factor`) to *oh, *ow.  Returns -1 when the aspect ratio
 * max(h,w)/min(h,w) exceeds 200 (the reference's ValueError) or a side is 0. */
int clef_smart_resize(int32_t h, int32_t w, int32_t factor, int64_t min_pixels, int64_t max_pixels, int32_t *oh,
                      int32_t *ow);

/* PyTorch's CPU antialiased bicubic resize for uint8 (what torchvision
 * resize(BICUBIC, antialias=True) runs): separable, horizontal pass then
 * vertical pass, each rounding to uint8 with int16 weights of per-axis
 * precision; a pass whose size does not change is skipped.
 * src: [sh][sw][3] uint8; dst: [dh][dw][3] uint8 (caller-allocated). */
void clef_resize_bicubic_aa_u8(const uint8_t *src, int32_t sw, int32_t sh, uint8_t *dst, int32_t dw, int32_t dh);

/* Bytes clef_resize_bicubic_aa_u8 allocates besides `dst` for that resize:
 * the intermediate image of a two-pass resize and each pass's tap tables. */
size_t clef_resize_scratch_bytes(int32_t sw, int32_t sh, int32_t dw, int32_t dh);

/* Normalise and patch `n_frames` resized frames (each [h][w][3] uint8, h and
 * w multiples of 32, n_frames a multiple of 2) into rows of 1536 fp32 values:
 * x = (u - 127.5f) / 127.5f, vector order (C, t, y, x), row order
 * (t, block_row, block_col, in_row, in_col).  Writes
 * (n_frames/2)*(h/16)*(w/16) rows to `out`. */
void clef_patchify(const uint8_t *const *frames, size_t n_frames, int32_t h, int32_t w, float *out);

#endif
