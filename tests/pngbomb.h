/* pngbomb.h — decode-bomb PNGs for the memory-budget tests (test_budget,
 * test_http_budget): a w x h image of one colour, 16-bit RGBA (8 bytes a
 * pixel decoded), deflated row by row so a 4000 x 4000 one (128 MB of
 * rows) compresses to ~190 KB without a buffer of its size.  Header-only
 * (static functions): each test is one file plus testutil.c. */
#ifndef CLEF_TESTS_PNGBOMB_H
#define CLEF_TESTS_PNGBOMB_H

#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "testutil.h"
#include "util/buf.h"

#define PB_UNUSED __attribute__((unused))

static void pb_be32(clef_buf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    clef_buf_append(b, x, 4);
}

static void pb_chunk(clef_buf *b, const char *type, const void *data, size_t n) {
    pb_be32(b, (uint32_t)n);
    size_t at = b->len;
    clef_buf_append(b, type, 4);
    if (n) clef_buf_append(b, data, n);
    pb_be32(b, (uint32_t)crc32(0, (const Bytef *)b->data + at, (uInt)(n + 4)));
}

/* The PNG bytes (b.data, b.len; free with clef_buf_free). */
static PB_UNUSED clef_buf pb_png_rgba16(uint32_t w, uint32_t h) {
    clef_buf b = {0};
    clef_buf_append(&b, "\x89PNG\r\n\x1a\n", 8);
    uint8_t ihdr[13] = {(uint8_t)(w >> 24), (uint8_t)(w >> 16), (uint8_t)(w >> 8), (uint8_t)w,
                        (uint8_t)(h >> 24), (uint8_t)(h >> 16), (uint8_t)(h >> 8), (uint8_t)h,
                        16, 6, 0, 0, 0};
    pb_chunk(&b, "IHDR", ihdr, 13);
    size_t rowbytes = 1 + (size_t)w * 8;
    uint8_t *row = malloc(rowbytes);
    assert_non_null(row);
    row[0] = 0; /* filter: none */
    static const uint8_t px[8] = {0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xff, 0xff};
    for (uint32_t x = 0; x < w; x++) memcpy(row + 1 + (size_t)x * 8, px, 8);
    z_stream z;
    memset(&z, 0, sizeof z);
    assert_int_equal(deflateInit(&z, 9), Z_OK);
    clef_buf idat = {0};
    uint8_t out[1 << 16];
    for (uint32_t y = 0; y <= h; y++) {
        int last = y == h;
        z.next_in = last ? NULL : row;
        z.avail_in = last ? 0 : (uInt)rowbytes;
        int rc;
        do {
            z.next_out = out;
            z.avail_out = sizeof out;
            rc = deflate(&z, last ? Z_FINISH : Z_NO_FLUSH);
            clef_buf_append(&idat, out, sizeof out - z.avail_out);
        } while (z.avail_out == 0 || (last && rc != Z_STREAM_END));
    }
    deflateEnd(&z);
    free(row);
    pb_chunk(&b, "IDAT", idat.data, idat.len);
    clef_buf_free(&idat);
    pb_chunk(&b, "IEND", NULL, 0);
    return b;
}

/* "data:<mime>;base64,<data>" (caller frees). */
static PB_UNUSED char *pb_data_url(const char *mime, const void *data, size_t n) {
    size_t cap = strlen(mime) + 16 + 4 * (n / 3 + 1) + 1;
    char *s = malloc(cap);
    assert_non_null(s);
    int k = snprintf(s, cap, "data:%s;base64,", mime);
    EVP_EncodeBlock((unsigned char *)s + k, data, (int)n);
    return s;
}

#endif
