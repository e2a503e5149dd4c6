#include "media/resize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"

int clef_smart_resize(int32_t h, int32_t w, int32_t factor, int64_t min_pixels, int64_t max_pixels, int32_t *oh,
                      int32_t *ow) {
    if (h <= 0 || w <= 0) return -1;
    double hd = h, wd = w, f = factor;
    if ((h > w ? hd / wd : wd / hd) > 200.0) return -1;
    /* rint() rounds half to even in the default rounding mode: Python's round. */
    int64_t hb = (int64_t)rint(hd / f) * factor, wb = (int64_t)rint(wd / f) * factor;
    if (hb * wb > max_pixels) {
        double beta = sqrt(hd * wd / (double)max_pixels);
        hb = (int64_t)floor(hd / beta / f) * factor;
        wb = (int64_t)floor(wd / beta / f) * factor;
        if (hb < factor) hb = factor;
        if (wb < factor) wb = factor;
    } else if (hb * wb < min_pixels) {
        double beta = sqrt((double)min_pixels / (hd * wd));
        hb = (int64_t)ceil(hd * beta / f) * factor;
        wb = (int64_t)ceil(wd * beta / f) * factor;
    }
    *oh = (int32_t)hb;
    *ow = (int32_t)wb;
    return 0;
}

/* ---- PyTorch uint8 antialiased bicubic ----------------------------------- */

/* Keys cubic, a = -0.5, in the Horner forms of PyTorch's cubic_convolution1/2
 * (the exact expression matters: the weights are rounded to int16). */
static double aa_bicubic(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0.0;
}

/* Taps of one axis: output i reads inputs [x0[i], x0[i]+xs[i]) with int16
 * weights k[i*taps + j] at `precision` bits. */
typedef struct aa_axis {
    int32_t taps;
    int32_t *x0, *xs;
    int16_t *k;
    int precision;
} aa_axis;

/* _compute_index_ranges_int16_weights: float weights as in
 * _compute_indices_min_size_weights_aa (align_corners_delta 0), then one
 * precision per axis from the largest weight. */
static void aa_axis_init(aa_axis *ax, int32_t n_in, int32_t n_out) {
    double scale = (double)n_in / (double)n_out;
    double support = (scale >= 1.0) ? 2.0 * scale : 2.0;
    double invscale = (scale >= 1.0) ? 1.0 / scale : 1.0;
    int32_t taps = (int32_t)ceil(support) * 2 + 1;
    double *wf = clef_xcalloc((size_t)n_out * taps, sizeof *wf);
    ax->taps = taps;
    ax->x0 = clef_xmalloc(sizeof(int32_t) * n_out);
    ax->xs = clef_xmalloc(sizeof(int32_t) * n_out);
    ax->k = clef_xcalloc((size_t)n_out * taps, sizeof(int16_t));
    double wt_max = 0.0;
    for (int32_t i = 0; i < n_out; i++) {
        double center = scale * (i + 0.5);
        int64_t xmin = (int64_t)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int64_t xmax = (int64_t)(center + support + 0.5);
        if (xmax > n_in) xmax = n_in;
        int64_t xsize = xmax - xmin;
        if (xsize < 0) xsize = 0;
        if (xsize > taps) xsize = taps;
        double *w = wf + (size_t)i * taps, total = 0.0;
        for (int64_t j = 0; j < xsize; j++) {
            w[j] = aa_bicubic(((double)(j + xmin) - center + 0.5) * invscale);
            total += w[j];
        }
        if (total != 0.0)
            for (int64_t j = 0; j < xsize; j++) {
                w[j] /= total;
                if (w[j] > wt_max) wt_max = w[j];
            }
        ax->x0[i] = (int32_t)xmin;
        ax->xs[i] = (int32_t)xsize;
    }
    int p;
    for (p = 0; p < 22; p++)
        if ((int)(0.5 + wt_max * (double)(1 << (p + 1))) >= (1 << 15)) break;
    ax->precision = p;
    for (size_t q = 0; q < (size_t)n_out * taps; q++) {
        double v = wf[q] * (double)(1 << p);
        ax->k[q] = (int16_t)((v < 0) ? (int)(-0.5 + v) : (int)(0.5 + v));
    }
    free(wf);
}

static void aa_axis_free(aa_axis *ax) {
    free(ax->x0);
    free(ax->xs);
    free(ax->k);
}

static inline uint8_t aa_round(int64_t acc, int precision) {
    int64_t v = acc >> precision; /* arithmetic shift, as _mm_srai_epi32 */
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* [h][sw][3] -> [h][dw][3] */
static void aa_horizontal(const uint8_t *src, int32_t sw, int32_t h, uint8_t *dst, int32_t dw) {
    aa_axis ax;
    aa_axis_init(&ax, sw, dw);
    int64_t init = (int64_t)1 << (ax.precision - 1);
    for (int32_t y = 0; y < h; y++) {
        const uint8_t *row = src + (size_t)y * sw * 3;
        uint8_t *out = dst + (size_t)y * dw * 3;
        for (int32_t i = 0; i < dw; i++) {
            const int16_t *k = ax.k + (size_t)i * ax.taps;
            const uint8_t *p = row + (size_t)ax.x0[i] * 3;
            int64_t a0 = init, a1 = init, a2 = init;
            for (int32_t j = 0; j < ax.xs[i]; j++) {
                a0 += (int64_t)k[j] * p[j * 3 + 0];
                a1 += (int64_t)k[j] * p[j * 3 + 1];
                a2 += (int64_t)k[j] * p[j * 3 + 2];
            }
            out[i * 3 + 0] = aa_round(a0, ax.precision);
            out[i * 3 + 1] = aa_round(a1, ax.precision);
            out[i * 3 + 2] = aa_round(a2, ax.precision);
        }
    }
    aa_axis_free(&ax);
}

/* [sh][w][3] -> [dh][w][3] */
static void aa_vertical(const uint8_t *src, int32_t w, int32_t sh, uint8_t *dst, int32_t dh) {
    aa_axis ax;
    aa_axis_init(&ax, sh, dh);
    int64_t init = (int64_t)1 << (ax.precision - 1);
    size_t stride = (size_t)w * 3;
    int64_t *acc = clef_xmalloc(sizeof(int64_t) * stride);
    for (int32_t i = 0; i < dh; i++) {
        const int16_t *k = ax.k + (size_t)i * ax.taps;
        for (size_t c = 0; c < stride; c++) acc[c] = init;
        for (int32_t j = 0; j < ax.xs[i]; j++) {
            const uint8_t *row = src + (size_t)(ax.x0[i] + j) * stride;
            int64_t kj = k[j];
            for (size_t c = 0; c < stride; c++) acc[c] += kj * row[c];
        }
        uint8_t *out = dst + (size_t)i * stride;
        for (size_t c = 0; c < stride; c++) out[c] = aa_round(acc[c], ax.precision);
    }
    free(acc);
    aa_axis_free(&ax);
}

/* Bytes of one pass's tables (aa_axis_init: float weights, then int16
 * weights and two index arrays). */
static size_t axis_bytes(int32_t n_in, int32_t n_out) {
    double scale = (double)n_in / (double)n_out;
    double support = (scale >= 1.0) ? 2.0 * scale : 2.0;
    size_t taps = (size_t)ceil(support) * 2 + 1;
    return (size_t)n_out * taps * (sizeof(double) + sizeof(int16_t)) + 2 * sizeof(int32_t) * (size_t)n_out;
}

size_t clef_resize_scratch_bytes(int32_t sw, int32_t sh, int32_t dw, int32_t dh) {
    int need_h = sw != dw, need_v = sh != dh;
    size_t bytes = 0;
    if (need_h) bytes = axis_bytes(sw, dw);
    if (need_v) { /* the vertical pass's tables and its int64 accumulator row */
        size_t v = axis_bytes(sh, dh) + sizeof(int64_t) * (size_t)(need_h ? dw : sw) * 3;
        if (v > bytes) bytes = v;
    }
    if (need_h && need_v) bytes += (size_t)dw * sh * 3; /* the horizontal pass's output */
    return bytes;
}

void clef_resize_bicubic_aa_u8(const uint8_t *src, int32_t sw, int32_t sh, uint8_t *dst, int32_t dw, int32_t dh) {
    int need_h = sw != dw, need_v = sh != dh;
    if (!need_h && !need_v) {
        memcpy(dst, src, (size_t)sw * sh * 3);
    } else if (need_h && !need_v) {
        aa_horizontal(src, sw, sh, dst, dw);
    } else if (!need_h && need_v) {
        aa_vertical(src, sw, sh, dst, dh);
    } else {
        uint8_t *tmp = clef_xmalloc((size_t)dw * sh * 3);
        aa_horizontal(src, sw, sh, tmp, dw);
        aa_vertical(tmp, dw, sh, dst, dh);
        free(tmp);
    }
}

/* ---- normalisation and patch order --------------------------------------- */

void clef_patchify(const uint8_t *const *frames, size_t n_frames, int32_t h, int32_t w, float *out) {
    /* (u - 127.5f)/127.5f per level: mean = std = 0.5 folded with 1/255. */
    float lut[256];
    for (int u = 0; u < 256; u++) lut[u] = ((float)u - 127.5f) / 127.5f;
    const int P = CLEF_PATCH, TP = CLEF_TEMPORAL_PATCH, M = CLEF_MERGE;
    int32_t gh = h / P, gw = w / P;
    size_t row = 0;
    for (size_t t = 0; t < n_frames / TP; t++)
        for (int32_t br = 0; br < gh / M; br++)
            for (int32_t bc = 0; bc < gw / M; bc++)
                for (int ir = 0; ir < M; ir++)
                    for (int ic = 0; ic < M; ic++, row++) {
                        float *v = out + row * CLEF_PATCH_DIM;
                        int32_t y0 = (br * M + ir) * P, x0 = (bc * M + ic) * P;
                        for (int c = 0; c < 3; c++)
                            for (int tt = 0; tt < TP; tt++) {
                                const uint8_t *f = frames[t * TP + tt];
                                for (int y = 0; y < P; y++) {
                                    const uint8_t *px = f + ((size_t)(y0 + y) * w + x0) * 3 + c;
                                    for (int x = 0; x < P; x++) *v++ = lut[px[x * 3]];
                                }
                            }
                    }
}
