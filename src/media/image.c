#include "media/image.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>
#include <webp/decode.h>

clef_image_format clef_image_sniff(const uint8_t *d, size_t n) {
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n >= 8 && memcmp(d, png_sig, 8) == 0) return CLEF_IMG_PNG;
    if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return CLEF_IMG_JPEG;
    if (n >= 12 && memcmp(d, "RIFF", 4) == 0 && memcmp(d + 8, "WEBP", 4) == 0) return CLEF_IMG_WEBP;
    return CLEF_IMG_UNKNOWN;
}

void clef_rgb_free(clef_rgb *img) {
    if (!img) return;
    free(img->data);
    img->data = NULL;
    img->w = img->h = 0;
}

/* The header check that must run before any pixel allocation: -1 for an
 * empty image, CLEF_MEDIA_OVER_LIMIT for one over the pixel limit. */
static int check_dims(uint64_t w, uint64_t h, size_t max_pixels, char *why, size_t why_len) {
    if (w == 0 || h == 0) {
        snprintf(why, why_len, "image is %llux%llu", (unsigned long long)w, (unsigned long long)h);
        return -1;
    }
    if (w > 0x7fffffff || h > 0x7fffffff || w * h > max_pixels) {
        snprintf(why, why_len, "image is %llux%llu = %llu pixels; the canvas holds at most %zu pixels",
                 (unsigned long long)w, (unsigned long long)h, (unsigned long long)(w * h), max_pixels);
        return CLEF_MEDIA_OVER_LIMIT;
    }
    return 0;
}

/* ---- JPEG (libjpeg-turbo) ------------------------------------------------ */

typedef struct jpeg_fail {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    int truncated;
    char msg[JMSG_LENGTH_MAX];
} jpeg_fail;

static void jpeg_on_error(j_common_ptr c) {
    jpeg_fail *f = (jpeg_fail *)c->err;
    (*c->err->format_message)(c, f->msg);
    longjmp(f->jb, 1);
}

/* Warnings are silent, except that a premature end of data is remembered:
 * Pillow refuses truncated JPEGs ("image file is truncated") where libjpeg
 * would fill the rest with grey. */
static void jpeg_on_message(j_common_ptr c, int level) {
    jpeg_fail *f = (jpeg_fail *)c->err;
    if (level < 0) {
        if (c->err->msg_code == JWRN_JPEG_EOF) f->truncated = 1;
        c->err->num_warnings++;
    }
}

/* Progressive JPEGs with thousands of scans cost quadratic time (the
 * libjpeg-turbo "scan limit" advisory); refuse them like TurboJPEG does. */
typedef struct jpeg_progress {
    struct jpeg_progress_mgr pub;
    j_decompress_ptr cinfo;
} jpeg_progress;

static void jpeg_on_progress(j_common_ptr c) {
    j_decompress_ptr d = (j_decompress_ptr)c;
    if (d->is_decompressor && d->input_scan_number > 500) {
        jpeg_fail *f = (jpeg_fail *)c->err;
        snprintf(f->msg, sizeof f->msg, "JPEG has more than 500 scans");
        longjmp(f->jb, 1);
    }
}

static int decode_jpeg(const uint8_t *data, size_t size, size_t max_pixels, clef_rgb *out, char *why, size_t why_len) {
    struct jpeg_decompress_struct cinfo;
    jpeg_fail fail;
    jpeg_progress prog;
    uint8_t *volatile pixels = NULL;
    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&fail.pub);
    fail.pub.error_exit = jpeg_on_error;
    fail.pub.emit_message = jpeg_on_message;
    fail.truncated = 0;
    fail.msg[0] = '\0';
    if (setjmp(fail.jb)) {
        jpeg_destroy_decompress(&cinfo);
        free(pixels);
        snprintf(why, why_len, "invalid JPEG data (%s)", fail.msg);
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    prog.pub.progress_monitor = jpeg_on_progress;
    prog.cinfo = &cinfo;
    cinfo.progress = &prog.pub;
    cinfo.mem->max_memory_to_use = 512L << 20;
    jpeg_mem_src(&cinfo, data, (unsigned long)size);
    jpeg_read_header(&cinfo, TRUE);
    int dims = check_dims(cinfo.image_width, cinfo.image_height, max_pixels, why, why_len);
    if (dims) {
        jpeg_destroy_decompress(&cinfo);
        return dims;
    }
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        jpeg_destroy_decompress(&cinfo);
        snprintf(why, why_len, "CMYK JPEG images are not supported");
        return -1;
    }
    /* libjpeg defaults: JDCT_ISLOW, do_fancy_upsampling = TRUE (Pillow's). */
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    size_t w = cinfo.output_width, h = cinfo.output_height;
    dims = cinfo.output_components == 3 ? check_dims(w, h, max_pixels, why, why_len) : -1;
    if (dims) {
        jpeg_destroy_decompress(&cinfo);
        if (cinfo.output_components != 3) snprintf(why, why_len, "unsupported JPEG colour layout");
        return dims;
    }
    pixels = malloc(w * h * 3);
    if (!pixels) {
        jpeg_destroy_decompress(&cinfo);
        snprintf(why, why_len, "out of memory");
        return -1;
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = pixels + (size_t)cinfo.output_scanline * w * 3;
        jpeg_read_scanlines(&cinfo, &row, 1);
        if (fail.truncated) break;
    }
    if (fail.truncated) {
        jpeg_destroy_decompress(&cinfo);
        free(pixels);
        snprintf(why, why_len, "truncated JPEG data");
        return -1;
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    out->w = (int32_t)w;
    out->h = (int32_t)h;
    out->data = pixels;
    return 0;
}

/* ---- PNG (libpng) -------------------------------------------------------- */

typedef struct png_src {
    const uint8_t *data;
    size_t size, pos;
    char msg[200];
} png_src;

static void png_on_error(png_structp png, png_const_charp msg) {
    png_src *s = png_get_error_ptr(png);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) { (void)png, (void)msg; }

static void png_on_read(png_structp png, png_bytep out, png_size_t n) {
    png_src *s = png_get_io_ptr(png);
    if (n > s->size - s->pos) png_error(png, "truncated PNG data");
    memcpy(out, s->data + s->pos, n);
    s->pos += n;
}

/* Convert one decoded row of `ch` channels of `depth` bits to RGB8 as
 * Pillow's convert("RGB") does: alpha dropped; 16-bit keeps the high byte,
 * except plain 16-bit grey ("I;16"), which clips at 255. */
static void png_row_to_rgb(const uint8_t *in, uint8_t *out, size_t w, int ch, int depth) {
    for (size_t x = 0; x < w; x++) {
        uint8_t v[3];
        if (depth == 16) {
            const uint8_t *p = in + x * ch * 2;
            if (ch == 1) {
                unsigned s = ((unsigned)p[0] << 8) | p[1];
                v[0] = v[1] = v[2] = (uint8_t)(s > 255 ? 255 : s);
            } else if (ch == 2) {
                v[0] = v[1] = v[2] = p[0];
            } else {
                v[0] = p[0], v[1] = p[2], v[2] = p[4];
            }
        } else {
            const uint8_t *p = in + x * ch;
            if (ch <= 2) v[0] = v[1] = v[2] = p[0];
            else v[0] = p[0], v[1] = p[1], v[2] = p[2];
        }
        memcpy(out + x * 3, v, 3);
    }
}

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

static int decode_png(const uint8_t *data, size_t size, size_t max_pixels, clef_rgb *out, char *why, size_t why_len) {
    /* IHDR is the first chunk: refuse oversized images from its 24 bytes,
     * before libpng reads (or allocates) anything else. */
    if (size >= 24 && memcmp(data + 12, "IHDR", 4) == 0) {
        int dims = check_dims(be32(data + 16), be32(data + 20), max_pixels, why, why_len);
        if (dims) return dims;
    }
    png_src src = {data, size, 0, {0}};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
    if (!png) {
        snprintf(why, why_len, "out of memory");
        return -1;
    }
    png_infop info = png_create_info_struct(png);
    uint8_t *volatile raw = NULL;
    uint8_t *volatile pixels = NULL;
    png_bytep *volatile rows = NULL;
    if (!info || setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, info ? &info : NULL, NULL);
        free(raw);
        free(pixels);
        free(rows);
        snprintf(why, why_len, "invalid PNG data (%s)", src.msg[0] ? src.msg : "out of memory");
        return -1;
    }
    png_set_read_fn(png, &src, png_on_read);
    png_set_chunk_malloc_max(png, 8u << 20);
    /* Text, ICC and suggested-palette chunks change no pixel, but libpng
     * would keep up to 1000 of them of up to 8 MB each (zTXt / iTXt
     * decompressed): skip them, so an image costs its pixels
     * (clef_image_probe counts on it). */
    static const png_byte ignored[] = "tEXt\0zTXt\0iTXt\0sPLT\0iCCP\0eXIf";
    png_set_keep_unknown_chunks(png, PNG_HANDLE_CHUNK_NEVER, ignored, 6);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    int dims = check_dims(w, h, max_pixels, why, why_len);
    if (dims) {
        png_destroy_read_struct(&png, &info, NULL);
        return dims;
    }
    int color = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    int ch = png_get_channels(png, info), odepth = png_get_bit_depth(png, info);
    size_t rowbytes = png_get_rowbytes(png, info);
    if (ch < 1 || ch > 4 || (odepth != 8 && odepth != 16) || rowbytes < (size_t)w * ch * (odepth / 8))
        png_error(png, "unsupported PNG layout");
    raw = malloc(rowbytes * h);
    rows = malloc(sizeof(png_bytep) * h);
    pixels = malloc((size_t)w * h * 3);
    if (!raw || !rows || !pixels) png_error(png, "out of memory");
    for (png_uint_32 y = 0; y < h; y++) rows[y] = raw + rowbytes * y;
    png_read_image(png, rows);
    for (png_uint_32 y = 0; y < h; y++) png_row_to_rgb(rows[y], pixels + (size_t)y * w * 3, w, ch, odepth);
    png_destroy_read_struct(&png, &info, NULL);
    free(raw);
    free(rows);
    out->w = (int32_t)w;
    out->h = (int32_t)h;
    out->data = pixels;
    return 0;
}

/* ---- WebP (libwebp) ------------------------------------------------------ */

static int decode_webp(const uint8_t *data, size_t size, size_t max_pixels, clef_rgb *out, char *why, size_t why_len) {
    WebPBitstreamFeatures f;
    if (WebPGetFeatures(data, size, &f) != VP8_STATUS_OK) {
        snprintf(why, why_len, "invalid WebP data");
        return -1;
    }
    int dims = check_dims((uint64_t)(f.width < 0 ? 0 : f.width), (uint64_t)(f.height < 0 ? 0 : f.height), max_pixels,
                          why, why_len);
    if (dims) return dims;
    if (f.has_animation) {
        snprintf(why, why_len, "animated WebP images are not supported");
        return -1;
    }
    size_t stride = (size_t)f.width * 3, n = stride * (size_t)f.height;
    uint8_t *pixels = malloc(n);
    if (!pixels) {
        snprintf(why, why_len, "out of memory");
        return -1;
    }
    /* MODE_RGB: the unpremultiplied colour channels, alpha dropped. */
    if (!WebPDecodeRGBInto(data, size, pixels, n, (int)stride)) {
        free(pixels);
        snprintf(why, why_len, "invalid WebP data");
        return -1;
    }
    out->w = f.width;
    out->h = f.height;
    out->data = pixels;
    return 0;
}

/* ---- header probes (clef_image_probe) ------------------------------------ */

/* Bytes libpng holds besides the image: two rows of the stored image (at
 * most 8 bytes a pixel), zlib's state and window, the structs. */
#define PNG_LIB_BYTES(w) (2 * (8 * (size_t)(w) + 64) + ((size_t)256 << 10))

static int probe_png(const uint8_t *data, size_t size, size_t max_pixels, clef_image_header *out) {
    /* libpng refuses a file whose first chunk is not IHDR; decode_png checks
     * the same 24 bytes first. */
    char why[160];
    if (size < 26 || memcmp(data + 12, "IHDR", 4) != 0) return -1;
    uint32_t w = be32(data + 16), h = be32(data + 20);
    if (check_dims(w, h, max_pixels, why, sizeof why)) return -1;
    int depth = data[24], color = data[25];
    /* Channels after decode_png's transforms: palette expands to RGB, or to
     * RGBA with a tRNS chunk (counted as 4); grey below 8 bits to 8 bits. */
    size_t ch = color == PNG_COLOR_TYPE_GRAY         ? 1
                : color == PNG_COLOR_TYPE_GRAY_ALPHA ? 2
                : color == PNG_COLOR_TYPE_RGB        ? 3
                                                     : 4;
    size_t bps = depth == 16 ? 2 : 1;
    out->w = (int32_t)w;
    out->h = (int32_t)h;
    out->decode_bytes = (size_t)w * h * ch * bps + sizeof(png_bytep) * (size_t)h + (size_t)w * h * 3 + PNG_LIB_BYTES(w);
    return 0;
}

/* libjpeg's fixed overhead (tables, Huffman state, the source manager). */
#define JPEG_LIB_BYTES ((size_t)1 << 20)

static int probe_jpeg(const uint8_t *data, size_t size, size_t max_pixels, clef_image_header *out) {
    struct jpeg_decompress_struct cinfo;
    jpeg_fail fail;
    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&fail.pub);
    fail.pub.error_exit = jpeg_on_error;
    fail.pub.emit_message = jpeg_on_message;
    fail.truncated = 0;
    fail.msg[0] = '\0';
    if (setjmp(fail.jb)) {
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, (unsigned long)size);
    jpeg_read_header(&cinfo, TRUE);
    char why[160];
    if (check_dims(cinfo.image_width, cinfo.image_height, max_pixels, why, sizeof why) ||
        cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK || cinfo.num_components < 1) {
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    size_t w = cinfo.image_width, h = cinfo.image_height;
    int max_h = 1, max_v = 1;
    for (int c = 0; c < cinfo.num_components; c++) {
        if (cinfo.comp_info[c].h_samp_factor > max_h) max_h = cinfo.comp_info[c].h_samp_factor;
        if (cinfo.comp_info[c].v_samp_factor > max_v) max_v = cinfo.comp_info[c].v_samp_factor;
    }
    size_t mcu_cols = (w + 8 * max_h - 1) / (8 * max_h), mcu_rows = (h + 8 * max_v - 1) / (8 * max_v);
    /* Strip buffers (main, context rows, upsampling, colour conversion):
     * well under 64 rows of the padded width per component. */
    size_t bytes = w * h * 3 + 64 * mcu_cols * 8 * max_h * (size_t)cinfo.num_components + JPEG_LIB_BYTES;
    if (jpeg_has_multiple_scans(&cinfo)) /* whole-image coefficient arrays, one JBLOCK per block */
        for (int c = 0; c < cinfo.num_components; c++)
            bytes += mcu_cols * (size_t)cinfo.comp_info[c].h_samp_factor * mcu_rows *
                     (size_t)cinfo.comp_info[c].v_samp_factor * sizeof(JBLOCK);
    jpeg_destroy_decompress(&cinfo);
    out->w = (int32_t)w;
    out->h = (int32_t)h;
    out->decode_bytes = bytes;
    return 0;
}

/* libwebp's fixed overhead and an estimate of a lossless image's Huffman
 * tables as libwebp touches them (5 root tables of 1 KiB per group, one
 * group per 4x4 block at most, 65536 groups at most). */
#define WEBP_LIB_BYTES ((size_t)1 << 20)
#define WEBP_HUFFMAN_GROUP_BYTES ((size_t)5 << 10)

static int probe_webp(const uint8_t *data, size_t size, size_t max_pixels, clef_image_header *out) {
    WebPBitstreamFeatures f;
    char why[160];
    if (WebPGetFeatures(data, size, &f) != VP8_STATUS_OK || f.has_animation ||
        check_dims((uint64_t)(f.width < 0 ? 0 : f.width), (uint64_t)(f.height < 0 ? 0 : f.height), max_pixels, why,
                   sizeof why))
        return -1;
    size_t w = (size_t)f.width, h = (size_t)f.height, px = w * h;
    size_t bytes = px * 3 + WEBP_LIB_BYTES + 64 * w * 4; /* output, lossy planes' rows */
    if (f.format != 1 || f.has_alpha) {                    /* lossless (or mixed), or an alpha plane (lossless-coded) */
        size_t groups = ((w + 3) / 4) * ((h + 3) / 4);
        if (groups > 65536) groups = 65536;
        bytes += 4 * (px + 32 * w) + px + groups * WEBP_HUFFMAN_GROUP_BYTES;
    }
    out->w = f.width;
    out->h = f.height;
    out->decode_bytes = bytes;
    return 0;
}

int clef_image_probe(const uint8_t *data, size_t size, size_t max_pixels, clef_image_header *out) {
    memset(out, 0, sizeof *out);
    if (size == 0) return -1;
    switch (clef_image_sniff(data, size)) {
    case CLEF_IMG_PNG: return probe_png(data, size, max_pixels, out);
    case CLEF_IMG_JPEG: return probe_jpeg(data, size, max_pixels, out);
    case CLEF_IMG_WEBP: return probe_webp(data, size, max_pixels, out);
    default: return -1;
    }
}

int clef_image_decode(const uint8_t *data, size_t size, size_t max_pixels, clef_rgb *out, char *why, size_t why_len) {
    memset(out, 0, sizeof *out);
    if (size == 0) {
        snprintf(why, why_len, "payload is empty");
        return -1;
    }
    switch (clef_image_sniff(data, size)) {
    case CLEF_IMG_PNG: return decode_png(data, size, max_pixels, out, why, why_len);
    case CLEF_IMG_JPEG: return decode_jpeg(data, size, max_pixels, out, why, why_len);
    case CLEF_IMG_WEBP: return decode_webp(data, size, max_pixels, out, why, why_len);
    default: snprintf(why, why_len, "not a PNG, JPEG or WebP image"); return -1;
    }
}
