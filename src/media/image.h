/* image.h — still-image decoding to 8-bit RGB as Pillow's open() +
 * convert("RGB") does (SPEC §9 "Images" step 1).
 *
 * Formats are recognised by their signature, not by the declared MIME type:
 * PNG (libpng), JPEG (libjpeg-turbo: ISLOW IDCT, fancy upsampling, no EXIF
 * rotation) and WebP (libwebp, still images).  Alpha is dropped, never
 * composited; palette and greyscale become RGB; 16-bit samples become 8-bit
 * as Pillow does (high byte, except 16-bit greyscale without alpha, which
 * Pillow's I;16 -> RGB conversion clips at 255).
 */
#ifndef CLEF_MEDIA_IMAGE_H
#define CLEF_MEDIA_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "media/media.h"

typedef enum clef_image_format {
    CLEF_IMG_UNKNOWN = 0,
    CLEF_IMG_PNG,
    CLEF_IMG_JPEG,
    CLEF_IMG_WEBP
} clef_image_format;

/* Format by signature bytes. */
clef_image_format clef_image_sniff(const uint8_t *data, size_t size);

/* Decode `data` into `out` (out->data malloc'd, owned by the caller).
 * The header's width and height are checked BEFORE any pixel buffer is
 * allocated: each must be >= 1, and w*h <= max_pixels.
 * Returns 0; -1 with a short reason in `why` for a malformed image
 * ("truncated PNG data", ...); CLEF_MEDIA_OVER_LIMIT (media.h) when it has
 * more than `max_pixels` ("image is 10000x10000 = 100000000 pixels; the
 * canvas holds at most 16000000 pixels"). */
int clef_image_decode(const uint8_t *data, size_t size, size_t max_pixels, clef_rgb *out, char *why, size_t why_len);

void clef_rgb_free(clef_rgb *img);

#endif
