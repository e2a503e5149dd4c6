/* quantize.c — NVFP4, FP8-block and INT4 quantizers (see quantize.h). */
#include "quant/quantize.h"

#include <math.h>
#include <string.h>

#include "quant/fp.h"
#include "tensor/dtype.h"

float clef_amax(const float *x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > m) m = a;
    }
    return m;
}

float clef_nvfp4_global_scale(float amax) {
    return amax > 0.0f ? (CLEF_FP8_E4M3_MAX * CLEF_FP4_MAX) / amax : 1.0f;
}

float clef_nvfp4_scale_2(float amax) {
    return amax > 0.0f ? amax / (CLEF_FP4_MAX * CLEF_FP8_E4M3_MAX) : 1.0f;
}

/* One group of 16: its FP8 scale, then the codes of x / (scale / G) — in
 * double, so the only roundings are the FP8 and FP4 ones. */
static void nvfp4_group(const float *x, double to_block, double from_block, uint8_t *packed, uint8_t *scale) {
    float amax = clef_amax(x, 16);
    uint8_t s = clef_fp8_e4m3_encode((float)((double)amax / CLEF_FP4_MAX * to_block));
    double sv = (double)clef_fp8_e4m3_values[s] * from_block; /* the block's real scale */
    *scale = s;
    for (int k = 0; k < 8; k++) {
        uint8_t lo = sv > 0 ? clef_fp4_encode((float)(x[2 * k] / sv)) : 0;
        uint8_t hi = sv > 0 ? clef_fp4_encode((float)(x[2 * k + 1] / sv)) : 0;
        packed[k] = (uint8_t)(lo | (hi << 4));
    }
}

void clef_quantize_nvfp4(const float *w, int64_t rows, int64_t cols, float global, int global_div, uint8_t *packed,
                         uint8_t *scale) {
    /* real block scale = fp8 / G (ct) or fp8 · scale_2 (ModelOpt) */
    double to_block = global_div ? (double)global : 1.0 / (double)global;
    double from_block = global_div ? 1.0 / (double)global : (double)global;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols / 16; j++)
            nvfp4_group(w + r * cols + j * 16, to_block, from_block, packed + r * (cols / 2) + j * 8,
                        scale + r * (cols / 16) + j);
}

void clef_quantize_fp8_block(const float *w, int64_t rows, int64_t cols, int64_t br, int64_t bc, uint8_t *q,
                             float *scale_inv) {
    const int64_t nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
    for (int64_t bi = 0; bi < nbr; bi++) {
        int64_t r0 = bi * br, r1 = r0 + br < rows ? r0 + br : rows;
        for (int64_t bj = 0; bj < nbc; bj++) {
            int64_t c0 = bj * bc, c1 = c0 + bc < cols ? c0 + bc : cols;
            float amax = 0.0f;
            for (int64_t r = r0; r < r1; r++) {
                float m = clef_amax(w + r * cols + c0, (size_t)(c1 - c0));
                if (m > amax) amax = m;
            }
            float s = amax > 0.0f ? amax / CLEF_FP8_E4M3_MAX : 1.0f;
            scale_inv[bi * nbc + bj] = s;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) q[r * cols + c] = clef_fp8_e4m3_encode(w[r * cols + c] / s);
        }
    }
}

/* AutoRound's symmetric scale for one group of one output (see quantize.h). */
static uint16_t int4_scale(const float *w, int64_t cols, int64_t n, int64_t k0, int64_t group) {
    float wmax = 0.0f, wmin = 0.0f;
    for (int64_t k = k0; k < k0 + group; k++) {
        float v = w[n * cols + k];
        if (v > wmax) wmax = v;
        if (v < wmin) wmin = v;
    }
    float s = wmax < -wmin ? -wmin / 8.0f : -wmax / 8.0f;
    /* AutoRound's q_scale_thresh: |s| >= 1e-5 (an all-zero group gets +1e-5) */
    s = s < 0.0f ? fminf(s, -1e-5f) : fmaxf(s, 1e-5f);
    return clef_f16_encode(s);
}

void clef_quantize_int4(const float *w, int64_t rows, int64_t cols, int64_t group, uint32_t *qweight,
                        uint32_t *qzeros, uint16_t *scales) {
    memset(qweight, 0, (size_t)(cols / 8) * (size_t)rows * sizeof *qweight);
    for (size_t i = 0; i < (size_t)(cols / group) * (size_t)(rows / 8); i++) qzeros[i] = 0x77777777u;
    for (int64_t g = 0; g < cols / group; g++) {
        for (int64_t n = 0; n < rows; n++) {
            uint16_t sh = int4_scale(w, cols, n, g * group, group);
            scales[g * rows + n] = sh;
            float s = clef_f16_to_f32(sh);
            for (int64_t k = g * group; k < (g + 1) * group; k++) {
                int q = 8;
                if (s != 0.0f) {
                    float r = nearbyintf(w[n * cols + k] / s);
                    q = r < -8.0f ? 0 : r > 7.0f ? 15 : (int)r + 8;
                }
                qweight[(k / 8) * rows + n] |= (uint32_t)q << (4 * (k % 8));
            }
        }
    }
}
