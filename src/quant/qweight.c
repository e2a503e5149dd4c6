/* qweight.c — binding quantized Linear weights by name and decoding their
 * rows (SPEC.md §10.3). */
#include "quant/qweight.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/tensor_names.h"
#include "quant/fp.h"
#include "util/buf.h"

const char *clef_wqtype_name(clef_wqtype t) {
    static const char *const names[CLEF_QT_COUNT] = {"plain", "nvfp4", "fp8-block", "int4"};
    return (unsigned)t < CLEF_QT_COUNT ? names[t] : "?";
}

static int qw_fail(clef_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int qw_fail(clef_err *err, const char *fmt, ...) {
    char what[CLEF_ERR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "checkpoint: %s", what);
}

/* ---- names ---- */

int clef_expert_module(const char *module, int64_t *expert, int *proj) {
    const char *p = strstr(module, ".mlp.experts.");
    if (!p) return 0;
    p += strlen(".mlp.experts.");
    if (*p < '0' || *p > '9') return 0;
    int64_t e = 0;
    while (*p >= '0' && *p <= '9' && e < ((int64_t)1 << 40)) e = e * 10 + (*p++ - '0');
    if (*p++ != '.') return 0;
    for (int i = 0; i < 3; i++) {
        if (!strcmp(p, clef_expert_proj(i))) {
            if (expert) *expert = e;
            if (proj) *proj = i;
            return 1;
        }
    }
    return 0;
}

/* `<module>.<suffix>` or NULL. */
static const st_tensor *find2(const clef_checkpoint *ck, const char *module, const char *suffix) {
    clef_buf b = {0};
    clef_buf_printf(&b, "%s.%s", module, suffix);
    const st_tensor *t = clef_checkpoint_find(ck, b.data);
    clef_buf_free(&b);
    return t;
}

/* Like clef_checkpoint_require on `<module>.<suffix>`. */
static const st_tensor *require2(const clef_checkpoint *ck, const char *module, const char *suffix, clef_dtype dt,
                                 int ndim, const int64_t *shape, clef_err *err) {
    clef_buf b = {0};
    clef_buf_printf(&b, "%s.%s", module, suffix);
    const st_tensor *t = clef_checkpoint_require(ck, b.data, CLEF_DT_BIT(dt), ndim, shape, err);
    clef_buf_free(&b);
    return t;
}

/* One f32 per-tensor scale (shape [] or [1]), finite and positive. */
static int scalar_scale(const st_tensor *t, float *out, clef_err *err) {
    if (t->dtype != CLEF_DT_F32 || t->numel != 1)
        return qw_fail(err, "tensor '%s': expected one F32 value (shape [] or [1]), found %s with %zu elements",
                       t->name, clef_dtype_name(t->dtype), t->numel);
    memcpy(out, t->data, 4);
    if (!isfinite(*out) || *out <= 0.0f)
        return qw_fail(err, "tensor '%s': per-tensor scale %g is not a positive finite number", t->name, *out);
    return 0;
}

/* ---- scale checks: a NaN/inf scale would poison every product ---- */

static int check_fp8_scales(const st_tensor *t, clef_err *err) {
    const uint8_t *s = t->data;
    for (size_t i = 0; i < t->numel; i++)
        if ((s[i] & 0x7F) == 0x7F) return qw_fail(err, "tensor '%s': element %zu is an FP8 NaN (0x%02X)", t->name, i, s[i]);
    return 0;
}

static int check_f32_scales(const st_tensor *t, clef_err *err) {
    for (size_t i = 0; i < t->numel; i++) {
        float v;
        memcpy(&v, (const char *)t->data + 4 * i, 4);
        if (!isfinite(v)) return qw_fail(err, "tensor '%s': element %zu is not finite (%g)", t->name, i, v);
    }
    return 0;
}

static int check_f16_scales(const st_tensor *t, clef_err *err) {
    for (size_t i = 0; i < t->numel; i++) {
        uint16_t h;
        memcpy(&h, (const char *)t->data + 2 * i, 2);
        if ((h & 0x7C00) == 0x7C00) return qw_fail(err, "tensor '%s': element %zu is an F16 inf/NaN (0x%04X)", t->name, i, h);
    }
    return 0;
}

/* ---- per-format binding ---- */

static int bind_nvfp4(const clef_checkpoint *ck, const clef_quant_config *qc, const char *module, int64_t rows,
                      int64_t cols, clef_qweight *w, clef_err *err) {
    int ct = qc->format == CLEF_QF_NVFP4_CT;
    if (cols % 16)
        return qw_fail(err, "module '%s': NVFP4 needs the input width to be a multiple of 16, found %lld", module,
                       (long long)cols);
    int64_t ps[2] = {rows, cols / 2}, ss[2] = {rows, cols / 16};
    const st_tensor *p = require2(ck, module, ct ? "weight_packed" : "weight", CLEF_DT_U8, 2, ps, err);
    const st_tensor *s = p ? require2(ck, module, "weight_scale", CLEF_DT_F8_E4M3, 2, ss, err) : NULL;
    if (!s || check_fp8_scales(s, err)) return -1;
    const char *gname = ct ? "weight_global_scale" : "weight_scale_2";
    const st_tensor *g = find2(ck, module, gname);
    if (!g) return qw_fail(err, "tensor '%s.%s' (F32 per-tensor scale of %s) not found", module, gname, p->name);
    float gv;
    if (scalar_scale(g, &gv, err)) return -1;
    *w = (clef_qweight){.dtype = CLEF_DT_U8, .rows = rows, .cols = cols, .data = p->data,
                        .quant = {.type = CLEF_QT_NVFP4, .scale = s->data, .group = 16, .global = gv, .global_div = ct}};
    return 0;
}

static int bind_fp8(const clef_checkpoint *ck, const clef_quant_config *qc, const char *module, int64_t rows,
                    int64_t cols, clef_qweight *w, clef_err *err) {
    int64_t br = qc->block[0], bc = qc->block[1];
    int64_t ws[2] = {rows, cols}, ss[2] = {(rows + br - 1) / br, (cols + bc - 1) / bc};
    const st_tensor *q = require2(ck, module, "weight", CLEF_DT_F8_E4M3, 2, ws, err);
    const st_tensor *s = q ? require2(ck, module, "weight_scale_inv", CLEF_DT_F32, 2, ss, err) : NULL;
    if (!s || check_f32_scales(s, err)) return -1;
    *w = (clef_qweight){.dtype = CLEF_DT_F8_E4M3, .rows = rows, .cols = cols, .data = q->data,
                        .quant = {.type = CLEF_QT_FP8_BLOCK, .scale = s->data, .block_r = br, .block_c = bc}};
    return 0;
}

/* Symmetric checkpoints store every zero nibble as 7 (GPTQ v1 "zero − 1"
 * of 8); anything else means the metadata does not describe the tensors. */
static int check_sym_zeros(const st_tensor *z, clef_err *err) {
    for (size_t i = 0; i < z->numel; i++) {
        uint32_t v;
        memcpy(&v, (const char *)z->data + 4 * i, 4);
        if (v != 0x77777777u)
            return qw_fail(err, "tensor '%s': element %zu is 0x%08X; symmetric auto_gptq packing stores every zero "
                           "nibble as 7 (0x77777777)", z->name, i, v);
    }
    return 0;
}

static int bind_int4(const clef_checkpoint *ck, const clef_quant_config *qc, const char *module, int64_t rows,
                     int64_t cols, clef_qweight *w, clef_err *err) {
    int64_t G = clef_quant_group_size(qc, module);
    int sym = clef_quant_module_sym(qc, module);
    if (G < 8 || G % 8 || cols % G || rows % 8)
        return qw_fail(err, "module '%s' [%lld,%lld]: INT4 auto_gptq needs out %% 8 = 0, a group_size (%lld) that "
                       "is a multiple of 8 and divides in", module, (long long)rows, (long long)cols, (long long)G);
    int64_t qs[2] = {cols / 8, rows}, zs[2] = {cols / G, rows / 8}, ss[2] = {cols / G, rows};
    const st_tensor *q = require2(ck, module, "qweight", CLEF_DT_I32, 2, qs, err);
    const st_tensor *z = q ? require2(ck, module, "qzeros", CLEF_DT_I32, 2, zs, err) : NULL;
    const st_tensor *s = z ? require2(ck, module, "scales", CLEF_DT_F16, 2, ss, err) : NULL;
    if (!s || check_f16_scales(s, err) || (sym && check_sym_zeros(z, err))) return -1;
    *w = (clef_qweight){.dtype = CLEF_DT_I32, .rows = rows, .cols = cols, .data = q->data,
                        .quant = {.type = CLEF_QT_INT4_GPTQ, .scale = s->data, .zeros = sym ? NULL : z->data,
                                  .group = G}};
    return 0;
}

/* The primary tensor that marks `module` as quantized in qc's format. */
static const st_tensor *primary_tensor(const clef_checkpoint *ck, const clef_quant_config *qc, const char *module) {
    const st_tensor *t;
    switch (qc->format) {
    case CLEF_QF_NVFP4_CT: return find2(ck, module, "weight_packed");
    case CLEF_QF_NVFP4_MODELOPT:
        t = find2(ck, module, "weight");
        return t && t->dtype == CLEF_DT_U8 ? t : NULL;
    case CLEF_QF_FP8_BLOCK:
        t = find2(ck, module, "weight");
        return t && t->dtype == CLEF_DT_F8_E4M3 ? t : NULL;
    case CLEF_QF_INT4_AUTOROUND: return find2(ck, module, "qweight");
    default: return NULL;
    }
}

static int bind_module(const clef_checkpoint *ck, const clef_quant_config *qc, const char *module, int64_t rows,
                       int64_t cols, clef_qweight *w, clef_err *err) {
    switch (qc->format) {
    case CLEF_QF_NVFP4_CT:
    case CLEF_QF_NVFP4_MODELOPT: return bind_nvfp4(ck, qc, module, rows, cols, w, err);
    case CLEF_QF_FP8_BLOCK: return bind_fp8(ck, qc, module, rows, cols, w, err);
    case CLEF_QF_INT4_AUTOROUND: return bind_int4(ck, qc, module, rows, cols, w, err);
    default: return qw_fail(err, "module '%s': no quantized format", module);
    }
}

/* ---- stacked experts (SPEC §10.3 c) ---- */

/* The per-tensor scale of expert e (gate_up: `up` picks column 1 of an
 * [E,2] tensor). */
static int stacked_global(const clef_checkpoint *ck, const char *smod, const char *gname, int64_t E, int64_t e,
                          int up, float *out, clef_err *err) {
    const st_tensor *g = find2(ck, smod, gname);
    if (!g) {
        clef_buf b = {0};
        clef_buf_printf(&b, "%s_%s", smod, gname);
        g = clef_checkpoint_find(ck, b.data);
        clef_buf_free(&b);
    }
    if (!g) return qw_fail(err, "tensor '%s.%s' (or '%s_%s') not found", smod, gname, smod, gname);
    if (g->dtype != CLEF_DT_F32) return qw_fail(err, "tensor '%s': expected F32, found %s", g->name, clef_dtype_name(g->dtype));
    size_t idx;
    if (g->numel == 1) idx = 0;
    else if (g->ndim == 1 && g->shape[0] == E) idx = (size_t)e;
    else if (g->ndim == 2 && g->shape[0] == E && g->shape[1] == 2 && strstr(smod, "gate_up_proj")) idx = (size_t)(2 * e + up);
    else
        return qw_fail(err, "tensor '%s': expected shape [%lld]%s or [1], found a %d-d tensor of %zu elements",
                       g->name, (long long)E, strstr(smod, "gate_up_proj") ? ", [E,2]" : "", g->ndim, g->numel);
    memcpy(out, (const char *)g->data + 4 * idx, 4);
    if (!isfinite(*out) || *out <= 0.0f)
        return qw_fail(err, "tensor '%s': element %zu = %g is not a positive finite scale", g->name, idx, *out);
    return 0;
}

/* Expert `e`'s gate (proj 0), up (1) or down (2) rows of the stacked NVFP4
 * tensors of layer prefix `layer` ("….mlp.experts"). */
static int bind_stacked_nvfp4(const clef_checkpoint *ck, const clef_quant_config *qc, const char *layer, int64_t e,
                              int proj, int64_t rows, int64_t cols, clef_qweight *w, clef_err *err) {
    int ct = qc->format == CLEF_QF_NVFP4_CT;
    clef_buf smod = {0};
    clef_buf_printf(&smod, "%s.%s", layer, proj == 2 ? "down_proj" : "gate_up_proj");
    int64_t per = proj == 2 ? rows : 2 * rows; /* rows of one expert in the stacked tensor */
    int rc = -1;
    const st_tensor *p = find2(ck, smod.data, ct ? "weight_packed" : "weight");
    const st_tensor *s = find2(ck, smod.data, "weight_scale");
    if (!p || !s) {
        qw_fail(err, "tensor '%s.%s' and '%s.weight_scale' not found", smod.data, ct ? "weight_packed" : "weight", smod.data);
    } else if (cols % 16) {
        qw_fail(err, "tensor '%s': NVFP4 input width %lld is not a multiple of 16", p->name, (long long)cols);
    } else {
        int64_t E = p->ndim == 3 ? p->shape[0] : 0;
        int64_t ps[3] = {E, per, cols / 2}, ss[3] = {E, per, cols / 16};
        float gv;
        if (E <= e) {
            qw_fail(err, "tensor '%s': expected [E > %lld, %lld, %lld] (experts stacked, gate rows first)", p->name,
                    (long long)e, (long long)per, (long long)(cols / 2));
        } else if (clef_checkpoint_require(ck, p->name, CLEF_DT_BIT(CLEF_DT_U8), 3, ps, err) &&
                   clef_checkpoint_require(ck, s->name, CLEF_DT_BIT(CLEF_DT_F8_E4M3), 3, ss, err) &&
                   check_fp8_scales(s, err) == 0 &&
                   stacked_global(ck, smod.data, ct ? "weight_global_scale" : "weight_scale_2", E, e, proj == 1, &gv,
                                  err) == 0) {
            int64_t row0 = e * per + (proj == 1 ? rows : 0);
            *w = (clef_qweight){.dtype = CLEF_DT_U8, .rows = rows, .cols = cols,
                                .data = (const uint8_t *)p->data + row0 * (cols / 2),
                                .quant = {.type = CLEF_QT_NVFP4, .scale = (const uint8_t *)s->data + row0 * (cols / 16),
                                          .group = 16, .global = gv, .global_div = ct}};
            rc = 0;
        }
    }
    clef_buf_free(&smod);
    return rc;
}

/* Whether `<layer>.gate_up_proj` / `.down_proj` companions exist at all. */
static int stacked_present(const clef_checkpoint *ck, const char *layer) {
    static const char *const sfx[] = {"gate_up_proj.weight_packed", "gate_up_proj.weight", "down_proj.weight_packed",
                                      "down_proj.weight", "gate_up_proj.qweight", "down_proj.qweight"};
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++)
        if (find2(ck, layer, sfx[i])) return 1;
    return 0;
}

static int bind_stacked(const clef_checkpoint *ck, const clef_quant_config *qc, const char *module, int64_t e,
                        int proj, int64_t rows, int64_t cols, clef_qweight *w, clef_err *err) {
    size_t lp = (size_t)(strstr(module, ".mlp.experts.") - module) + strlen(".mlp.experts");
    char *layer = clef_xstrndup(module, lp);
    int rc;
    if (qc->format == CLEF_QF_NVFP4_CT || qc->format == CLEF_QF_NVFP4_MODELOPT)
        rc = bind_stacked_nvfp4(ck, qc, layer, e, proj, rows, cols, w, err);
    else
        rc = qw_fail(err, "module '%s': experts stacked per layer ('%s.gate_up_proj') are read for NVFP4 only, "
                     "not %s", module, layer, clef_quant_format_name(qc->format));
    free(layer);
    return rc;
}

/* ---- plain weights and the "never a silent BF16 fallback" rule ---- */

static int must_be_quantized(const clef_quant_config *qc, const char *module, int is_expert) {
    if (qc->format == CLEF_QF_NONE || strncmp(module, "thinker.model.layers.", 21) != 0) return 0;
    if (clef_quant_module_excluded(qc, module)) return 0;
    return is_expert || qc->format != CLEF_QF_INT4_AUTOROUND;
}

static const char *expected_companions(clef_quant_format f) {
    switch (f) {
    case CLEF_QF_NVFP4_CT: return "weight_packed U8 + weight_scale F8_E4M3 + weight_global_scale F32";
    case CLEF_QF_NVFP4_MODELOPT: return "weight U8 + weight_scale F8_E4M3 + weight_scale_2 F32";
    case CLEF_QF_FP8_BLOCK: return "weight F8_E4M3 + weight_scale_inv F32";
    case CLEF_QF_INT4_AUTOROUND: return "qweight I32 + qzeros I32 + scales F16";
    default: return "?";
    }
}

static int bind_plain(const clef_checkpoint *ck, const clef_quant_config *qc, const char *module, int64_t rows,
                      int64_t cols, int is_expert, clef_qweight *w, clef_err *err) {
    const st_tensor *t = find2(ck, module, "weight");
    if (must_be_quantized(qc, module, is_expert)) {
        if (t)
            return qw_fail(err, "tensor '%s' is %s, but quantization_config (%s) quantizes module '%s': expected %s",
                           t->name, clef_dtype_name(t->dtype), clef_quant_format_name(qc->format), module,
                           expected_companions(qc->format));
        return qw_fail(err, "module '%s' not found: expected %s (%s)%s", module, expected_companions(qc->format),
                       clef_quant_format_name(qc->format), is_expert ? " or the layer's stacked experts" : "");
    }
    int64_t shape[2] = {rows, cols};
    clef_buf b = {0};
    clef_buf_printf(&b, "%s.weight", module);
    t = clef_checkpoint_require(ck, b.data, CLEF_DT_BIT(CLEF_DT_BF16) | CLEF_DT_BIT(CLEF_DT_F16) | CLEF_DT_BIT(CLEF_DT_F32),
                                2, shape, err);
    clef_buf_free(&b);
    if (!t) return -1;
    *w = (clef_qweight){.dtype = t->dtype, .rows = rows, .cols = cols, .data = t->data};
    return 0;
}

int clef_qweight_bind(const clef_checkpoint *ck, const clef_quant_config *qc, const char *module, int64_t rows,
                      int64_t cols, clef_qweight *w, clef_err *err) {
    memset(w, 0, sizeof *w);
    if (rows < 1 || cols < 1) return qw_fail(err, "module '%s': empty shape [%lld,%lld]", module, (long long)rows, (long long)cols);
    int64_t e = 0;
    int proj = 0;
    int is_expert = clef_expert_module(module, &e, &proj);
    if (qc->format != CLEF_QF_NONE) {
        if (primary_tensor(ck, qc, module)) return bind_module(ck, qc, module, rows, cols, w, err);
        if (is_expert) {
            size_t lp = (size_t)(strstr(module, ".mlp.experts.") - module) + strlen(".mlp.experts");
            char *layer = clef_xstrndup(module, lp);
            int stacked = stacked_present(ck, layer);
            free(layer);
            if (stacked) return bind_stacked(ck, qc, module, e, proj, rows, cols, w, err);
        }
    }
    return bind_plain(ck, qc, module, rows, cols, is_expert, w, err);
}

/* ---- decoding ---- */

/* Every decoder writes rows [r0, r1) x columns [c0, c1) of W at dst, row
 * r - r0 at dst + (r - r0) * ld; each element is its format's formula,
 * so any tile of W holds the values of the whole-row decode. */

static void tile_nvfp4(const clef_qweight *w, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float *dst,
                       int64_t ld) {
    const int64_t C = w->cols, half = C / 2, ng = C / 16;
    const uint8_t *pk = w->data, *sc = w->quant.scale;
    const float g = w->quant.global;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *prow = pk + r * half, *srow = sc + r * ng;
        float *d = dst + (r - r0) * ld - c0;
        for (int64_t j = c0 / 16; j * 16 < c1; j++) {
            const float s = clef_fp8_e4m3_values[srow[j]];
            const int64_t a = j * 16 > c0 ? j * 16 : c0, b = j * 16 + 16 < c1 ? j * 16 + 16 : c1;
            if (w->quant.global_div)
                for (int64_t c = a; c < b; c++)
                    d[c] = (clef_fp4_e2m1_values[(prow[c / 2] >> (4 * (c & 1))) & 15] * s) / g;
            else
                for (int64_t c = a; c < b; c++)
                    d[c] = (clef_fp4_e2m1_values[(prow[c / 2] >> (4 * (c & 1))) & 15] * s) * g;
        }
    }
}

static void tile_fp8(const clef_qweight *w, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float *dst, int64_t ld) {
    const int64_t C = w->cols, bc = w->quant.block_c, br = w->quant.block_r, nbc = (C + bc - 1) / bc;
    const uint8_t *q = w->data;
    const char *sc = w->quant.scale;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *qrow = q + r * C;
        float *d = dst + (r - r0) * ld - c0;
        for (int64_t b = c0 / bc; b * bc < c1; b++) {
            float s;
            memcpy(&s, sc + 4 * ((r / br) * nbc + b), 4);
            const int64_t a = b * bc > c0 ? b * bc : c0, e = (b + 1) * bc < c1 ? (b + 1) * bc : c1;
            for (int64_t c = a; c < e; c++) d[c] = clef_fp8_e4m3_values[qrow[c]] * s;
        }
    }
}

/* qweight is [in/8, out] u32: the 8 nibbles of qweight[k/8, n] are inputs
 * k..k+7 of output n, so a block of output rows reads contiguous words.
 * Scales (and zeros) are decoded once per group and row block (G % 8 == 0,
 * checked at bind).  c0 and c1 are multiples of 8 (so is every INT4 width). */
static void tile_int4(const clef_qweight *w, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float *dst,
                      int64_t ld) {
    enum { RB = 64 };
    const int64_t R = w->rows, G = w->quant.group;
    const char *qw = w->data, *sc = w->quant.scale, *zs = w->quant.zeros;
    float s[RB];
    int z[RB];
    for (int64_t b0 = r0; b0 < r1; b0 += RB) {
        const int64_t b1 = b0 + RB < r1 ? b0 + RB : r1;
        for (int64_t g = c0 / G; g * G < c1; g++) {
            for (int64_t n = b0; n < b1; n++) {
                uint16_t h;
                memcpy(&h, sc + 2 * (g * R + n), 2);
                s[n - b0] = clef_f16_to_f32(h);
                z[n - b0] = 8; /* symmetric: stored 7 means 8 */
                if (zs) {
                    uint32_t zw;
                    memcpy(&zw, zs + 4 * (g * (R / 8) + n / 8), 4);
                    z[n - b0] = (int)((zw >> (4 * (n % 8))) & 15u) + 1; /* v1 asymmetric: nibble + 1 */
                }
            }
            const int64_t kp0 = (g * G > c0 ? g * G : c0) / 8, kp1 = ((g + 1) * G < c1 ? (g + 1) * G : c1) / 8;
            for (int64_t kp = kp0; kp < kp1; kp++) {
                for (int64_t n = b0; n < b1; n++) {
                    uint32_t word;
                    memcpy(&word, qw + 4 * (kp * R + n), 4);
                    float *d = dst + (n - r0) * ld + kp * 8 - c0;
                    for (int j = 0; j < 8; j++) d[j] = s[n - b0] * (float)((int)((word >> (4 * j)) & 15u) - z[n - b0]);
                }
            }
        }
    }
}

void clef_qweight_tile_f32(const clef_qweight *w, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float *dst,
                           int64_t ld) {
    if (r1 <= r0 || c1 <= c0) return;
    switch (w->quant.type) {
    case CLEF_QT_NVFP4: tile_nvfp4(w, r0, r1, c0, c1, dst, ld); return;
    case CLEF_QT_FP8_BLOCK: tile_fp8(w, r0, r1, c0, c1, dst, ld); return;
    case CLEF_QT_INT4_GPTQ: tile_int4(w, r0, r1, c0, c1, dst, ld); return;
    default: break;
    }
    const size_t es = clef_dtype_size(w->dtype);
    for (int64_t r = r0; r < r1; r++)
        clef_to_f32(w->dtype, (const char *)w->data + ((size_t)r * (size_t)w->cols + (size_t)c0) * es,
                    dst + (r - r0) * ld, (size_t)(c1 - c0));
}

void clef_qweight_rows_f32(const clef_qweight *w, int64_t r0, int64_t r1, float *dst) {
    clef_qweight_tile_f32(w, r0, r1, 0, w->cols, dst, w->cols);
}

size_t clef_qweight_bytes(const clef_qweight *w) {
    size_t R = (size_t)w->rows, C = (size_t)w->cols;
    switch (w->quant.type) {
    case CLEF_QT_NVFP4: return R * C / 2 + R * C / 16 + 4;
    case CLEF_QT_FP8_BLOCK: {
        size_t br = (size_t)w->quant.block_r, bc = (size_t)w->quant.block_c;
        return R * C + 4 * ((R + br - 1) / br) * ((C + bc - 1) / bc);
    }
    case CLEF_QT_INT4_GPTQ: {
        size_t G = (size_t)w->quant.group;
        return R * C / 2 + 2 * (C / G) * R + (C / G) * (R / 8) * 4;
    }
    default: return R * C * clef_dtype_size(w->dtype);
    }
}
