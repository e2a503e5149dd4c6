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

/* From the header only (PNG: IHDR; JPEG: the markers up to the first scan;
 * WebP: the bitstream features), nothing decoded: the image's size and the
 * most bytes clef_image_decode holds at once for it, its RGB output
 * included:
 *   PNG   the decoded rows (w*h*channels*bytes per sample, channels after
 *         palette expansion), the row pointers (8*h), the RGB output (3*w*h)
 *         and libpng's row and zlib buffers;
 *   JPEG  the RGB output, libjpeg's strip buffers and, for a progressive
 *         JPEG, its whole-image coefficient arrays (128 bytes per 8x8 block
 *         of each component);
 *   WebP  the RGB output and libwebp's planes: for lossless (or alpha) the
 *         ARGB image (4*w*h) and its Huffman tables, an estimate of what
 *         libwebp touches (5 KiB per Huffman group, at most 65536 groups).
 * Returns 0, or -1 when the header cannot be read, is refused (a side of 0,
 * over `max_pixels`, CMYK, animated) or the format is unknown: then
 * clef_image_decode fails at that same header step, before any pixel buffer
 * is allocated. */
typedef struct clef_image_header {
    int32_t w, h;
    size_t decode_bytes;
} clef_image_header;

int clef_image_probe(const uint8_t *data, size_t size, size_t max_pixels, clef_image_header *out);

void clef_rgb_free(clef_rgb *img);

#endif
