/* test_quant_formats.c — quantized checkpoint formats (SPEC.md §10).
 *
 * Every dequantization clef performs is compared bit for bit with a second,
 * independent implementation written here from SPEC.md (no clef tables, no
 * clef config parsing: element values from their bit definitions, indices
 * from the tensor layouts): on the five checkpoints quantized outside clef
 * (tests/fixtures/quant/) and on round trips (tiny BF16 → clef quantize →
 * load → dequant).  Also: the FP4/FP8/F16 encoders against brute force,
 * format detection, and the errors for unknown or inconsistent metadata.
 */
#define _GNU_SOURCE /* nftw */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant_fixture.h"

#include "backend/cpu/cpu.h"
#include "io/checkpoint.h"
#include "json/json.h"
#include "quant/convert.h"
#include "quant/format.h"
#include "quant/fp.h"
#include "quant/quantize.h"
#include "quant/qweight.h"

/* ======== the independent reference (SPEC.md §10.2, §10.3) ======== */

/* FP4 E2M1: s ee m; e = 0: m·0.5; else (1 + m/2)·2^(e-1). */
static float ref_fp4(unsigned nib) {
    unsigned e = (nib >> 1) & 3, m = nib & 1;
    float v = e == 0 ? 0.5f * (float)m : (1.0f + 0.5f * (float)m) * ldexpf(1.0f, (int)e - 1);
    return (nib & 8) ? -v : v;
}

/* FP8 E4M3fn: s eeee mmm, bias 7. */
static float ref_fp8(unsigned b) {
    unsigned e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    float v = e == 0 ? ((float)m / 8.0f) * ldexpf(1.0f, -6) : (1.0f + (float)m / 8.0f) * ldexpf(1.0f, (int)e - 7);
    return (b & 0x80) ? -v : v;
}

/* IEEE half. */
static float ref_f16(unsigned h) {
    unsigned e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf(1.0f + (float)m / 1024.0f, (int)e - 15);
    return (h & 0x8000) ? -v : v;
}

static float ref_bf16(unsigned h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t rd32(const st_tensor *t, size_t i) {
    uint32_t v;
    memcpy(&v, (const char *)t->data + 4 * i, 4);
    return v;
}
static float rdf32(const st_tensor *t, size_t i) {
    float v;
    memcpy(&v, (const char *)t->data + 4 * i, 4);
    return v;
}
static unsigned rd16(const st_tensor *t, size_t i) {
    uint16_t v;
    memcpy(&v, (const char *)t->data + 2 * i, 2);
    return v;
}
static unsigned rd8(const st_tensor *t, size_t i) { return ((const uint8_t *)t->data)[i]; }

static const st_tensor *tget(const clef_checkpoint *ck, const char *module, const char *suffix) {
    char name[1024];
    snprintf(name, sizeof name, "%s.%s", module, suffix);
    return clef_checkpoint_find(ck, name);
}

/* What the test reads from config.json itself (not through clef). */
typedef struct ref_cfg {
    json_value *cfg;
    const json_value *q; /* quantization_config or NULL */
    int modelopt;        /* hf_quant_config.json present */
} ref_cfg;

static void ref_cfg_load(const char *dir, ref_cfg *rc) {
    char *p = qf_path(dir, "config.json");
    size_t len;
    char *text = tu_read_file(p, &len);
    clef_err err;
    rc->cfg = json_parse(text, len, &err);
    assert_non_null(rc->cfg);
    rc->q = json_get(rc->cfg, "quantization_config");
    free(text);
    free(p);
    p = qf_path(dir, "hf_quant_config.json");
    rc->modelopt = access(p, F_OK) == 0;
    free(p);
}

static int64_t ref_group(const ref_cfg *rc, const char *module) {
    int64_t g = 0;
    const json_value *ex = json_get(rc->q, "extra_config");
    const json_value *o = ex ? json_get(ex, module) : NULL;
    if (o && json_get(o, "group_size")) assert_int_equal(json_as_i64(json_get(o, "group_size"), &g), 0);
    else assert_int_equal(json_as_i64(json_get(rc->q, "group_size"), &g), 0);
    return g;
}

/* NVFP4: w = fp4 · fp8(scale) / global (ct) or · scale_2 (ModelOpt). */
static float ref_nvfp4_elem(const st_tensor *pk, const st_tensor *sc, size_t row, int64_t cols, int64_t c, float g,
                            int divide) {
    unsigned byte = rd8(pk, row * (size_t)(cols / 2) + (size_t)(c / 2));
    unsigned nib = (c % 2) ? byte >> 4 : byte & 15;
    float a = ref_fp4(nib), b = ref_fp8(rd8(sc, row * (size_t)(cols / 16) + (size_t)(c / 16)));
    float p = a * b;
    return divide ? p / g : p * g;
}

/* Reference dequantization of Linear module `module` [rows, cols] into
 * out[rows * cols], deciding the layout from the tensors present. */
static void ref_dequant(const clef_checkpoint *ck, const ref_cfg *rc, const char *module, int64_t rows, int64_t cols,
                        float *out) {
    const st_tensor *t;
    if ((t = tget(ck, module, "weight_packed")) || ((t = tget(ck, module, "weight")) && t->dtype == CLEF_DT_U8)) {
        int ct = tget(ck, module, "weight_packed") != NULL;
        const st_tensor *sc = tget(ck, module, "weight_scale");
        const st_tensor *g = tget(ck, module, ct ? "weight_global_scale" : "weight_scale_2");
        assert_non_null(sc);
        assert_non_null(g);
        assert_int_equal(g->numel, 1);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                out[r * cols + c] = ref_nvfp4_elem(t, sc, (size_t)r, cols, c, rdf32(g, 0), ct);
        return;
    }
    if ((t = tget(ck, module, "weight")) && t->dtype == CLEF_DT_F8_E4M3) {
        const st_tensor *s = tget(ck, module, "weight_scale_inv");
        const json_value *bs = json_get(rc->q, "weight_block_size");
        int64_t br, bc;
        assert_int_equal(json_as_i64(bs->items[0], &br), 0);
        assert_int_equal(json_as_i64(bs->items[1], &bc), 0);
        int64_t nbc = (cols + bc - 1) / bc;
        assert_int_equal(s->numel, (size_t)(((rows + br - 1) / br) * nbc));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                out[r * cols + c] = ref_fp8(rd8(t, (size_t)(r * cols + c))) * rdf32(s, (size_t)((r / br) * nbc + c / bc));
        return;
    }
    if ((t = tget(ck, module, "qweight"))) {
        const st_tensor *s = tget(ck, module, "scales");
        int64_t G = ref_group(rc, module);
        /* W^T[k, n] = scales[k/G, n] · (nibble − 8); W[n, k] is its transpose */
        for (int64_t k = 0; k < cols; k++)
            for (int64_t n = 0; n < rows; n++) {
                unsigned nib = (rd32(t, (size_t)((k / 8) * rows + n)) >> (4 * (k % 8))) & 15;
                out[n * cols + k] = ref_f16(rd16(s, (size_t)((k / G) * rows + n))) * (float)((int)nib - 8);
            }
        return;
    }
    int64_t e = -1;
    int proj = -1;
    if (clef_expert_module(module, &e, &proj) && !tget(ck, module, "weight")) {
        /* stacked: <layer>.mlp.experts.{gate_up,down}_proj, expert-major, gate rows first */
        char layer[512];
        size_t lp = (size_t)(strstr(module, ".mlp.experts.") - module) + strlen(".mlp.experts");
        memcpy(layer, module, lp);
        layer[lp] = '\0';
        char smod[600];
        snprintf(smod, sizeof smod, "%s.%s", layer, proj == 2 ? "down_proj" : "gate_up_proj");
        const st_tensor *pk = tget(ck, smod, "weight_packed"), *sc = tget(ck, smod, "weight_scale");
        const st_tensor *g = tget(ck, smod, "weight_global_scale");
        assert_non_null(pk);
        assert_non_null(g);
        int64_t per = pk->shape[1], E = pk->shape[0];
        size_t gi = g->numel == 1 ? 0 : g->numel == (size_t)E ? (size_t)e : (size_t)(2 * e + (proj == 1));
        int64_t row0 = e * per + (proj == 1 ? rows : 0);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                out[r * cols + c] = ref_nvfp4_elem(pk, sc, (size_t)(row0 + r), cols, c, rdf32(g, gi), 1);
        return;
    }
    t = tget(ck, module, "weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, CLEF_DT_BF16);
    for (size_t i = 0; i < (size_t)(rows * cols); i++) out[i] = ref_bf16(rd16(t, i));
}

/* ======== helpers ======== */

typedef struct mod {
    char name[256];
    int64_t rows, cols;
    int expert;
} mod;

/* Every Linear of the tiny decoder: experts, then attention. */
static size_t list_modules(const clef_config *c, mod *m) {
    const clef_text_config *t = &c->text;
    int64_t H = t->hidden_size, I = t->moe_intermediate_size, D = t->head_dim;
    size_t n = 0;
    for (int64_t l = 0; l < t->num_hidden_layers; l++) {
        for (int64_t e = 0; e < t->num_experts; e++) {
            static const char *const p[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int k = 0; k < 3; k++) {
                snprintf(m[n].name, sizeof m[n].name, "thinker.model.layers.%lld.mlp.experts.%lld.%s", (long long)l,
                         (long long)e, p[k]);
                m[n].rows = k == 2 ? H : I;
                m[n].cols = k == 2 ? I : H;
                m[n++].expert = 1;
            }
        }
        static const char *const a[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        int64_t qd = t->num_attention_heads * D, kd = t->num_key_value_heads * D;
        int64_t rows[4] = {qd, kd, kd, H}, cols[4] = {H, H, H, qd};
        for (int k = 0; k < 4; k++) {
            snprintf(m[n].name, sizeof m[n].name, "thinker.model.layers.%lld.self_attn.%s", (long long)l, a[k]);
            m[n].rows = rows[k];
            m[n].cols = cols[k];
            m[n++].expert = 0;
        }
    }
    return n;
}

static void open_ck(const char *dir, clef_checkpoint *ck, clef_quant_config *qc) {
    clef_err err;
    clef_err_clear(&err);
    if (clef_checkpoint_open(dir, ck, &err)) fail_msg("open %s: %s", dir, err.message);
    if (clef_quant_detect(ck, qc, &err)) fail_msg("detect %s: %s", dir, err.message);
}

/* The BF16 original of `module` from the tiny checkpoint. */
static void original(const clef_checkpoint *tiny, const mod *m, float *out) {
    const st_tensor *t = tget(tiny, m->name, "weight");
    assert_non_null(t);
    for (size_t i = 0; i < (size_t)(m->rows * m->cols); i++) out[i] = ref_bf16(rd16(t, i));
}

typedef struct check_result {
    size_t quantized, plain, compared_floats;
    double rel_sum_experts; /* Σ relative L2 over expert matrices */
    size_t experts;
} check_result;

/* Bind every Linear of `dir`, dequantize it with clef (in two row ranges)
 * and with the reference, require bitwise equality, and measure the error
 * against the BF16 original. */
static check_result check_dir(const char *dir, const char *want_format, int want_stacked, int want_attn_quant) {
    clef_checkpoint ck, tiny;
    clef_quant_config qc;
    open_ck(dir, &ck, &qc);
    assert_string_equal(clef_quant_format_name(qc.format), want_format);
    assert_int_equal(qc.stacked, want_stacked);
    char *tdir = tu_fixture("tiny-clef-omni");
    clef_err err;
    assert_int_equal(clef_checkpoint_open(tdir, &tiny, &err), 0);
    free(tdir);
    ref_cfg rc;
    ref_cfg_load(dir, &rc);
    mod *mods = calloc(4096, sizeof *mods);
    size_t nm = list_modules(&ck.config, mods);
    check_result res = {0};
    for (size_t i = 0; i < nm; i++) {
        const mod *m = &mods[i];
        clef_qweight w;
        clef_err_clear(&err);
        if (clef_qweight_bind(&ck, &qc, m->name, m->rows, m->cols, &w, &err)) fail_msg("bind %s: %s", m->name, err.message);
        int quantized = w.quant.type != CLEF_QT_NONE;
        if (m->expert) assert_true(quantized);
        else assert_int_equal(quantized, want_attn_quant);
        res.quantized += quantized;
        res.plain += !quantized;
        size_t n = (size_t)(m->rows * m->cols);
        float *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want), *orig = malloc(n * sizeof *orig);
        int64_t half = m->rows / 2 + 1;
        clef_qweight_rows_f32(&w, 0, half, got);
        clef_qweight_rows_f32(&w, half, m->rows, got + half * m->cols);
        ref_dequant(&ck, &rc, m->name, m->rows, m->cols, want);
        for (size_t k = 0; k < n; k++)
            if (memcmp(&got[k], &want[k], 4))
                fail_msg("%s: %s element [%zu,%zu] clef %a, reference %a", dir, m->name, k / (size_t)m->cols,
                         k % (size_t)m->cols, got[k], want[k]);
        res.compared_floats += n;
        assert_true(clef_qweight_bytes(&w) > 0);
        if (m->expert) {
            original(&tiny, m, orig);
            double e2 = 0, n2 = 0;
            for (size_t k = 0; k < n; k++) {
                double d = (double)orig[k] - want[k];
                e2 += d * d;
                n2 += (double)orig[k] * orig[k];
            }
            res.rel_sum_experts += sqrt(e2 / n2);
            res.experts++;
        }
        free(got);
        free(want);
        free(orig);
    }
    free(mods);
    json_free(rc.cfg);
    clef_quant_config_free(&qc);
    clef_checkpoint_close(&ck);
    clef_checkpoint_close(&tiny);
    return res;
}

/* ======== element formats ======== */

static void test_fp_tables(void **state) {
    for (unsigned c = 0; c < 16; c++) {
        float r = ref_fp4(c);
        assert_memory_equal(&clef_fp4_e2m1_values[c], &r, 4);
    }
    for (unsigned b = 0; b < 256; b++) {
        float r = ref_fp8(b);
        if (isnan(r)) assert_true(isnan(clef_fp8_e4m3_values[b]));
        else assert_memory_equal(&clef_fp8_e4m3_values[b], &r, 4);
    }
    assert_true(clef_fp8_e4m3_values[0x7E] == 448.0f && clef_fp8_e4m3_values[0x01] == ldexpf(1, -9));
    assert_true(isnan(clef_fp8_e4m3_values[0x7F]) && isnan(clef_fp8_e4m3_values[0xFF]));
}

/* Nearest finite code by brute force; ties to the even code; saturating. */
static unsigned brute_fp8(float x) {
    unsigned best = 0;
    double bd = INFINITY;
    for (unsigned b = 0; b < 256; b++) {
        float v = ref_fp8(b);
        if (isnan(v) || (signbit(v) != signbit(x))) continue;
        double d = fabs((double)v - (double)x);
        if (d < bd || (d == bd && (b & 1) == 0)) bd = d, best = b;
    }
    return best;
}

static unsigned brute_fp4(float x) {
    unsigned best = 0;
    double bd = INFINITY;
    for (unsigned c = 0; c < 8; c++) {
        double d = fabs((double)ref_fp4(c) - fabs((double)x));
        if (d < bd || (d == bd && (c & 1) == 0)) bd = d, best = c;
    }
    return best | (x < 0 && best ? 8u : 0u);
}

static void test_encoders(void **state) {
    /* FP8: every code round-trips; every midpoint between neighbours, and
     * points just beside it, go where brute force says */
    for (unsigned b = 0; b < 256; b++) {
        float v = ref_fp8(b);
        if (isnan(v)) continue;
        assert_int_equal(clef_fp8_e4m3_encode(v), b);
        float nxt = ref_fp8((b & 0x80) | ((b & 0x7F) + 1));
        if ((b & 0x7F) < 0x7E) {
            float mid = (v + nxt) / 2.0f; /* exact: few mantissa bits */
            float probes[3] = {mid, nextafterf(mid, 0), nextafterf(mid, 2 * mid)};
            for (int k = 0; k < 3; k++) assert_int_equal(clef_fp8_e4m3_encode(probes[k]), brute_fp8(probes[k]));
        }
    }
    assert_int_equal(clef_fp8_e4m3_encode(1e9f), 0x7E);
    assert_int_equal(clef_fp8_e4m3_encode(-INFINITY), 0xFE);
    assert_int_equal(clef_fp8_e4m3_encode(464.0f), 0x7E); /* would round to 480: saturates */
    assert_int_equal(clef_fp8_e4m3_encode(NAN), 0x7F);
    assert_int_equal(clef_fp8_e4m3_encode(ldexpf(1, -11)), 0x00); /* quarter of the smallest subnormal */
    assert_int_equal(clef_fp8_e4m3_encode(ldexpf(3, -10)), 0x02); /* 1.5 · 2^-9 ties to even m = 2 */
    assert_int_equal(clef_fp8_e4m3_encode(ldexpf(5, -10)), 0x02); /* 2.5 · 2^-9 ties to even m = 2 */
    uint32_t s = 12345;
    for (int i = 0; i < 20000; i++) {
        s = s * 1664525u + 1013904223u;
        float x = ldexpf((float)(s >> 8) / 16777216.0f - 0.5f, (int)(s % 24) - 12);
        assert_int_equal(clef_fp8_e4m3_encode(x), brute_fp8(x));
    }
    /* FP4 grid midpoints (SPEC §10.2 values) */
    const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    const unsigned want[] = {0, 2, 2, 4, 4, 6, 6};
    for (int i = 0; i < 7; i++) {
        assert_int_equal(clef_fp4_encode(mids[i]), want[i]);
        assert_int_equal(clef_fp4_encode(-mids[i]), want[i] ? want[i] | 8 : 0);
        assert_int_equal(clef_fp4_encode(nextafterf(mids[i], 10)), brute_fp4(nextafterf(mids[i], 10)));
        assert_int_equal(clef_fp4_encode(nextafterf(mids[i], 0)), brute_fp4(nextafterf(mids[i], 0)));
    }
    assert_int_equal(clef_fp4_encode(100.0f), 7);
    assert_int_equal(clef_fp4_encode(-100.0f), 15);
    assert_int_equal(clef_fp4_encode(-0.1f), 0); /* rounds to zero: +0, never code 8 */
    /* F16: every finite half round-trips, halfway points tie to even */
    for (unsigned h = 0; h < 65536; h++) {
        float v = ref_f16(h);
        if (isnan(v) || isinf(v)) continue;
        if (v == 0 && h == 0x8000) {
            assert_int_equal(clef_f16_encode(v), 0x8000);
            continue;
        }
        assert_int_equal(clef_f16_encode(v), h);
        if ((h & 0x7FFF) < 0x7BFF) {
            float nxt = ref_f16(h + 1), mid = (float)(((double)v + nxt) / 2);
            unsigned even = (h & 1) ? h + 1 : h;
            assert_int_equal(clef_f16_encode(mid), even);
        }
    }
    assert_int_equal(clef_f16_encode(65520.0f), 0x7C00);
    assert_int_equal(clef_f16_encode(65519.0f), 0x7BFF);
}


/* ======== the CPU backend multiplies packed weights ======== */

/* matmul (and the grouped MoE op) with a packed weight equals, bit for bit,
 * the same op with an F32 copy of its dequantized rows: the backend only
 * swaps how a row block is decoded. */
static void test_backend_matmul(void **state) {
    clef_err err;
    clef_err_clear(&err);
    clef_backend *be = clef_backend_cpu_create(2, &err);
    assert_non_null(be);
    for (size_t f = 0; f < QF_N_FORMATS; f++) {
        char *dir = qf_assemble(QF_FORMATS[f]);
        clef_checkpoint ck;
        clef_quant_config qc;
        open_ck(dir, &ck, &qc);
        const int64_t T = 7;
        static const struct {
            const char *m;
            int64_t rows, cols;
        } mods[] = {{"thinker.model.layers.1.mlp.experts.5.gate_proj", 16, 32},
                    {"thinker.model.layers.2.mlp.experts.3.down_proj", 32, 16},
                    {"thinker.model.layers.0.self_attn.q_proj", 64, 32}};
        for (size_t i = 0; i < 3; i++) {
            clef_qweight q;
            assert_int_equal(clef_qweight_bind(&ck, &qc, mods[i].m, mods[i].rows, mods[i].cols, &q, &err), 0);
            size_t n = (size_t)(mods[i].rows * mods[i].cols);
            float *deq = malloc(n * sizeof *deq), *x = malloc((size_t)(T * mods[i].cols) * sizeof *x);
            float *y1 = calloc((size_t)(T * mods[i].rows), sizeof *y1), *y2 = calloc((size_t)(T * mods[i].rows), sizeof *y2);
            clef_qweight_rows_f32(&q, 0, q.rows, deq);
            for (int64_t k = 0; k < T * mods[i].cols; k++) x[k] = sinf(0.37f * (float)k) - 0.2f;
            clef_weight wq, wf;
            assert_int_equal(be->ops->weight_init_packed(be, &wq, &q, &err), 0);
            assert_int_equal(be->ops->weight_init(be, &wf, CLEF_DT_F32, q.rows, q.cols, deq, &err), 0);
            assert_int_equal(wq.quant.type == CLEF_QT_NONE, q.quant.type == CLEF_QT_NONE);
            assert_int_equal(be->ops->matmul(be, x, T, &wq, NULL, y1, &err), 0);
            assert_int_equal(be->ops->matmul(be, x, T, &wf, NULL, y2, &err), 0);
            assert_memory_equal(y1, y2, (size_t)(T * mods[i].rows) * sizeof *y1);
            be->ops->weight_release(be, &wq);
            be->ops->weight_release(be, &wf);
            free(deq);
            free(x);
            free(y1);
            free(y2);
        }
        clef_quant_config_free(&qc);
        clef_checkpoint_close(&ck);
        qf_remove(dir);
        free(dir);
    }
    be->ops->destroy(be);
}

/* ======== published-layout fixtures ======== */

static void test_fixture_dequant(void **state) {
    static const struct {
        const char *fixture, *format;
        int stacked, attn;
        double published; /* mean relative L2 error, shared/README.md */
    } cases[] = {
        {"nvfp4-ct", "nvfp4-ct", 0, 0, 0.095},         {"nvfp4-ct-stacked", "nvfp4-ct", 1, 0, 0.095},
        {"nvfp4-modelopt", "nvfp4-modelopt", 0, 0, 0.095}, {"fp8-block", "fp8-block", 0, 0, 0.026},
        {"int4-autoround", "int4-autoround", 0, 1, 0.076},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = qf_assemble(cases[i].fixture);
        check_result r = check_dir(dir, cases[i].format, cases[i].stacked, cases[i].attn);
        double mean = r.rel_sum_experts / (double)r.experts;
        printf("fixture %-17s detected %-15s %3zu quantized + %2zu BF16 Linear, %zu floats bit-identical, "
               "mean expert relative L2 %.2f%% (published %.1f%%)\n",
               cases[i].fixture, cases[i].format, r.quantized, r.plain, r.compared_floats, 100 * mean,
               100 * cases[i].published);
        assert_int_equal(r.experts, 72);
        assert_true(fabs(mean - cases[i].published) < 0.003);
        qf_remove(dir);
        free(dir);
    }
}

/* ======== round trips: tiny BF16 → clef quantize → load ======== */

static int files_equal(const char *a, const char *b) {
    size_t la, lb;
    char *x = tu_read_file(a, &la), *y = tu_read_file(b, &lb);
    int eq = la == lb && !memcmp(x, y, la);
    free(x);
    free(y);
    return eq;
}

static void test_round_trips(void **state) {
    static const struct {
        clef_quant_format f;
        int stacked;
        int64_t group, br, bc;
        const char *name;
        double max_rel;
    } cases[] = {
        {CLEF_QF_NVFP4_CT, 0, 0, 0, 0, "nvfp4-ct", 0.11},
        {CLEF_QF_NVFP4_CT, 1, 0, 0, 0, "nvfp4-ct", 0.11},
        {CLEF_QF_NVFP4_MODELOPT, 0, 0, 0, 0, "nvfp4-modelopt", 0.11},
        {CLEF_QF_FP8_BLOCK, 0, 0, 0, 0, "fp8-block", 0.03},
        {CLEF_QF_FP8_BLOCK, 0, 0, 8, 12, "fp8-block", 0.03}, /* several blocks, partial ones at the edges */
        {CLEF_QF_INT4_AUTOROUND, 0, 0, 0, 0, "int4-autoround", 0.09}, /* group min(128, in) */
        {CLEF_QF_INT4_AUTOROUND, 0, 16, 0, 0, "int4-autoround", 0.08},
    };
    char *tiny = tu_fixture("tiny-clef-omni");
    char *tiny_shard1 = qf_path(tiny, "model-00001-of-00002.safetensors");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char tmpl[] = "/tmp/clef_qrt_XXXXXX";
        assert_non_null(mkdtemp(tmpl));
        char *out = qf_path(tmpl, "out");
        clef_quantize_options o = {.model_dir = tiny, .out_dir = out, .format = cases[i].f,
                                   .stacked = cases[i].stacked, .group = cases[i].group,
                                   .block = {cases[i].br, cases[i].bc}};
        clef_quantize_report rep;
        clef_err err;
        clef_err_clear(&err);
        if (clef_quantize_checkpoint(&o, &rep, &err)) fail_msg("quantize: %s", err.message);
        assert_int_equal(rep.quantized, 72);
        assert_int_equal(rep.copied, 138);
        check_result r = check_dir(out, cases[i].name, cases[i].stacked, 0);
        double mean = r.rel_sum_experts / (double)r.experts;
        printf("round trip %-15s %-10s group %3lld block %lldx%lld: %zu floats bit-identical, mean expert relative "
               "L2 %.2f%% (quant_stats %.2f%%), peak RSS %.1f MiB\n",
               cases[i].name, cases[i].stacked ? "stacked" : "per-expert", (long long)cases[i].group,
               (long long)cases[i].br, (long long)cases[i].bc, r.compared_floats, 100 * mean,
               100 * rep.mean_matrix_rel_l2, (double)rep.peak_rss_bytes / 1048576.0);
        assert_true(mean < cases[i].max_rel && mean > 0.001);
        assert_true(fabs(mean - rep.mean_matrix_rel_l2) < 1e-6); /* quant_stats measures what was written */
        /* every non-expert tensor copied unchanged: shard 1 is byte-identical */
        char *s1 = qf_path(out, "model-00001-of-00002.safetensors");
        assert_true(files_equal(s1, tiny_shard1));
        free(s1);
        char *stats = qf_path(out, "quant_stats.json");
        size_t len;
        char *text = tu_read_file(stats, &len);
        json_value *st = json_parse(text, len, &err);
        assert_non_null(st);
        assert_int_equal(json_get(st, "layers")->n, 3);
        free(text);
        free(stats);
        json_free(st);
        qf_remove(tmpl);
        free(out);
    }
    free(tiny_shard1);
    free(tiny);
}

/* The quantizers on edge cases: all-zero rows and saturation. */
static void test_quantizer_edges(void **state) {
    float w[32 * 32];
    for (int i = 0; i < 32 * 32; i++) w[i] = (i / 32) == 3 ? 0.0f : sinf((float)i) * (i % 7 == 0 ? 5.0f : 0.5f);
    uint8_t pk[32 * 16], sc[32 * 2];
    float g = clef_nvfp4_global_scale(clef_amax(w, 32 * 32));
    clef_quantize_nvfp4(w, 32, 32, g, 1, pk, sc);
    clef_qweight q = {.dtype = CLEF_DT_U8, .rows = 32, .cols = 32, .data = pk,
                      .quant = {.type = CLEF_QT_NVFP4, .scale = sc, .group = 16, .global = g, .global_div = 1}};
    float d[32 * 32];
    clef_qweight_rows_f32(&q, 0, 32, d);
    for (int i = 0; i < 32 * 32; i++) {
        assert_true(isfinite(d[i]));
        if (i / 32 == 3) assert_true(d[i] == 0.0f);
    }
    uint32_t qw[4 * 32], qz[2 * 4];
    uint16_t ss[2 * 32];
    clef_quantize_int4(w, 32, 32, 16, qw, qz, ss);
    for (int i = 0; i < 8; i++) assert_int_equal(qz[i], 0x77777777u);
    clef_qweight q4 = {.dtype = CLEF_DT_I32, .rows = 32, .cols = 32, .data = qw,
                       .quant = {.type = CLEF_QT_INT4_GPTQ, .scale = ss, .group = 16}};
    clef_qweight_rows_f32(&q4, 0, 32, d);
    for (int n = 0; n < 32; n++)
        for (int g2 = 0; g2 < 2; g2++) {
            /* the group's largest magnitude is reproduced exactly (nibble 0) up to the F16 scale */
            float amax = 0, back = 0;
            for (int k = 16 * g2; k < 16 * g2 + 16; k++)
                if (fabsf(w[n * 32 + k]) > amax) amax = fabsf(w[n * 32 + k]), back = d[n * 32 + k];
            assert_true(fabsf(fabsf(back) - amax) <= amax * 1e-3f + 1e-6f);
        }
    uint8_t q8[32 * 32];
    float si[1];
    clef_quantize_fp8_block(w, 32, 32, 128, 128, q8, si);
    assert_true(fabsf(si[0] - clef_amax(w, 32 * 32) / 448.0f) == 0.0f);
}

/* ======== detection and errors ======== */

static void expect_parse_error(const char *cfg, const char *hf, const char *fragment) {
    clef_quant_config qc;
    clef_err err;
    clef_err_clear(&err);
    int rc = clef_quant_config_parse(cfg, strlen(cfg), hf, hf ? strlen(hf) : 0, &qc, &err);
    clef_quant_config_free(&qc);
    if (rc != -1) fail_msg("accepted: %s", cfg);
    assert_int_equal(err.status, 500);
    if (!strstr(err.message, fragment)) fail_msg("message '%s' lacks '%s'", err.message, fragment);
}

static void test_config_parse(void **state) {
    clef_quant_config qc;
    clef_err err;
    const char *none = "{\"model_type\":\"qwen3_omni_moe\"}";
    assert_int_equal(clef_quant_config_parse(none, strlen(none), NULL, 0, &qc, &err), 0);
    assert_int_equal(qc.format, CLEF_QF_NONE);
    clef_quant_config_free(&qc);
    const char *ar = "{\"quantization_config\":{\"quant_method\":\"intel/auto-round\",\"packing_format\":"
                     "\"auto_round:auto_gptq\",\"bits\":4,\"group_size\":128,\"sym\":true,\"extra_config\":{"
                     "\"m.gate\":{\"bits\":16,\"data_type\":\"float\"},\"m.x\":{\"group_size\":32}}}}";
    assert_int_equal(clef_quant_config_parse(ar, strlen(ar), NULL, 0, &qc, &err), 0);
    assert_int_equal(qc.format, CLEF_QF_INT4_AUTOROUND);
    assert_int_equal(clef_quant_module_excluded(&qc, "m.gate"), 1);
    assert_int_equal(clef_quant_module_excluded(&qc, "m.x"), 0);
    assert_int_equal(clef_quant_group_size(&qc, "m.x"), 32);
    assert_int_equal(clef_quant_group_size(&qc, "m.y"), 128);
    clef_quant_config_free(&qc);
    const char *ct = "{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"nvfp4-pack-quantized\","
                     "\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":4,\"type\":\"float\",\"strategy\":"
                     "\"tensor_group\",\"group_size\":16},\"input_activations\":{\"num_bits\":4,\"type\":\"float\","
                     "\"strategy\":\"tensor_group\",\"dynamic\":\"local\",\"group_size\":16}}},"
                     "\"ignore\":[\"lm_head\",\"re:.*mlp\\\\.gate$\"]}}";
    assert_int_equal(clef_quant_config_parse(ct, strlen(ct), NULL, 0, &qc, &err), 0);
    assert_int_equal(qc.w4a4, 1);
    assert_int_equal(clef_quant_module_excluded(&qc, "thinker.model.layers.0.mlp.gate"), 1);
    assert_int_equal(clef_quant_module_excluded(&qc, "thinker.model.layers.0.mlp.gate_proj"), 0);
    assert_int_equal(clef_quant_module_excluded(&qc, "thinker.lm_head"), 1);
    assert_int_equal(clef_quant_module_excluded(&qc, "thinker.model.layers.0.mlp.experts.1.up_proj"), 0);
    clef_quant_config_free(&qc);
    const char *mo_only = "{}";
    const char *hf = "{\"producer\":{\"name\":\"modelopt\"},\"quantization\":{\"quant_algo\":\"NVFP4\","
                     "\"exclude_modules\":[\"*mlp.gate\",\"*self_attn*\"]}}";
    assert_int_equal(clef_quant_config_parse(mo_only, 2, hf, strlen(hf), &qc, &err), 0);
    assert_int_equal(qc.format, CLEF_QF_NVFP4_MODELOPT);
    assert_int_equal(clef_quant_module_excluded(&qc, "a.self_attn.q_proj"), 1);
    assert_int_equal(clef_quant_module_excluded(&qc, "a.mlp.gate"), 1);
    assert_int_equal(clef_quant_module_excluded(&qc, "a.mlp.experts.0.gate_proj"), 0);
    clef_quant_config_free(&qc);

    expect_parse_error("{\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4}}", NULL,
                       "quant_method \"gptq\" is not supported");
    expect_parse_error("{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\"}}",
                       NULL, "quantization_config.format is \"pack-quantized\"");
    expect_parse_error("{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":"
                       "\"nvfp4-pack-quantized\",\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":8,\"type\":"
                       "\"float\",\"strategy\":\"tensor_group\",\"group_size\":16}}}}}",
                       NULL, "config_groups.g.weights.num_bits must be 4");
    expect_parse_error("{\"quantization_config\":{\"quant_method\":\"fp8\",\"activation_scheme\":\"dynamic\"}}", NULL,
                       "weight_block_size is missing");
    expect_parse_error("{\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[128,0]}}", NULL,
                       "two positive integers");
    expect_parse_error("{\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128],"
                       "\"activation_scheme\":\"static\"}}", NULL, "activation_scheme is \"static\"");
    expect_parse_error("{\"quantization_config\":{\"quant_method\":\"auto-round\",\"packing_format\":"
                       "\"auto_round:auto_awq\",\"bits\":4,\"group_size\":128}}", NULL, "auto_round:auto_awq");
    expect_parse_error("{\"quantization_config\":{\"quant_method\":\"auto-round\",\"packing_format\":"
                       "\"auto_round:auto_gptq\",\"bits\":8,\"group_size\":128}}", NULL, "bits must be 4");
    expect_parse_error("{\"quantization_config\":{\"quant_method\":\"auto-round\",\"packing_format\":"
                       "\"auto_round:auto_gptq\",\"bits\":4,\"group_size\":-1}}", NULL, "group_size must be a positive");
    expect_parse_error("{\"quantization_config\":{\"quant_method\":\"modelopt\",\"quant_algo\":\"FP8\"}}", NULL,
                       "quant_algo is \"FP8\"");
    expect_parse_error("{\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[128,128]}}", hf,
                       "present (ModelOpt), but config.json's quantization_config is FP8-block");
    expect_parse_error("{}", "{\"producer\":{\"name\":\"other\"},\"quantization\":{}}", "producer.name is other");
}

/* Copy `src` to `dst` with tensors named in `drop` removed and, when
 * `patch` is given, tensor `patch` overwritten by `bytes`. */
static void rewrite_shard(const char *src, const char *dst, const char *drop, const char *patch, const void *bytes) {
    st_file f;
    clef_err err;
    assert_int_equal(st_open(src, &f, &err), 0);
    st_wtensor *t = calloc(f.n, sizeof *t);
    const void **d = calloc(f.n, sizeof *d);
    size_t n = 0;
    for (size_t i = 0; i < f.n; i++) {
        if (drop && !strcmp(f.tensors[i].name, drop)) continue;
        t[n].name = f.tensors[i].name;
        t[n].dtype = f.tensors[i].dtype;
        t[n].ndim = f.tensors[i].ndim;
        memcpy(t[n].shape, f.tensors[i].shape, sizeof t[n].shape);
        d[n++] = patch && !strcmp(f.tensors[i].name, patch) ? bytes : f.tensors[i].data;
    }
    static const char *const meta[] = {"format", "pt", NULL};
    assert_int_equal(st_save(dst, t, d, n, meta, &err), 0);
    free(t);
    free(d);
    st_close(&f);
}

/* Replace <dir>/<name> (a symlink) by a file holding `text`. */
static void replace_text(const char *dir, const char *name, const char *text, size_t len) {
    char *p = qf_path(dir, name);
    unlink(p);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
    free(p);
}

/* The index with tensor `drop` removed from its weight_map. */
static void drop_from_index(const char *dir, const char *drop) {
    char *p = qf_path(dir, "model.safetensors.index.json");
    size_t len;
    char *text = tu_read_file(p, &len);
    clef_err err;
    json_value *ix = json_parse(text, len, &err);
    json_value *wm = (json_value *)json_get(ix, "weight_map");
    json_value *nw = json_new(JSON_OBJECT);
    for (size_t i = 0; i < wm->n; i++)
        if (strcmp(wm->keys[i], drop)) json_object_set(nw, wm->keys[i], wm->key_lens[i], json_clone(wm->items[i]));
    json_object_set(ix, "weight_map", 10, nw);
    clef_buf b = {0};
    json_render(ix, &b);
    replace_text(dir, "model.safetensors.index.json", b.data, b.len);
    clef_buf_free(&b);
    json_free(ix);
    free(text);
    free(p);
}

/* Open + detect + bind the module: the first failing step's message must
 * contain `fragment`. */
static void expect_load_error(const char *dir, const char *module, int64_t rows, int64_t cols, const char *fragment) {
    clef_checkpoint ck;
    clef_quant_config qc;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_checkpoint_open(dir, &ck, &err), 0);
    int rc = clef_quant_detect(&ck, &qc, &err);
    if (rc == 0 && module) {
        clef_qweight w;
        rc = clef_qweight_bind(&ck, &qc, module, rows, cols, &w, &err);
    }
    clef_quant_config_free(&qc);
    clef_checkpoint_close(&ck);
    if (rc != -1) fail_msg("%s: loaded", dir);
    if (!strstr(err.message, fragment)) fail_msg("message '%s' lacks '%s'", err.message, fragment);
    printf("  rejected: %s\n", err.message);
}

static char *read_fixture_text(const char *rel, size_t *len) {
    char *p = tu_fixture(rel);
    char *t = tu_read_file(p, len);
    free(p);
    return t;
}

static void test_inconsistent_metadata(void **state) {
    const char *E0G = "thinker.model.layers.0.mlp.experts.0.gate_proj";
    size_t len;
    /* 1. NVFP4 tensors under an FP8 config */
    char *dir = qf_assemble("nvfp4-ct");
    char *fp8cfg = read_fixture_text("quant/fp8-block/config.json", &len);
    replace_text(dir, "config.json", fp8cfg, len);
    expect_load_error(dir, NULL, 0, 0, "is a compressed-tensors NVFP4 companion, but config.json's quantization_config is FP8-block");
    qf_remove(dir);
    free(dir);
    /* 2. BF16 experts under a quantized config: never a silent BF16 fallback */
    char tmpl[] = "/tmp/clef_qbad_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char *tiny = tu_fixture("tiny-clef-omni");
    static const char *const files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                        "model.safetensors.index.json", "joint_head.safetensors",
                                        "joint_head_config.json", "tokenizer.json"};
    for (int i = 0; i < 6; i++) qf_link(tiny, tmpl, files[i]);
    replace_text(tmpl, "config.json", fp8cfg, len);
    expect_load_error(tmpl, E0G, 16, 32, "is BF16, but quantization_config (fp8-block) quantizes module");
    qf_remove(tmpl);
    free(fp8cfg);
    /* 3. a companion missing */
    dir = qf_assemble("nvfp4-ct");
    char *src = qf_path(dir, "model-00002-of-00002.safetensors");
    char *tmp = qf_path(dir, "shard2.tmp");
    char drop[256];
    snprintf(drop, sizeof drop, "%s.weight_scale", E0G);
    rewrite_shard(src, tmp, drop, NULL, NULL);
    unlink(src);
    assert_int_equal(rename(tmp, src), 0);
    drop_from_index(dir, drop);
    expect_load_error(dir, NULL, 0, 0, "'thinker.model.layers.0.mlp.experts.0.gate_proj.weight_scale' is missing");
    qf_remove(dir);
    free(dir);
    free(src);
    free(tmp);
    /* 4. symmetric INT4 whose stored zeros are not 7 */
    dir = qf_assemble("int4-autoround");
    src = qf_path(dir, "model-00002-of-00002.safetensors");
    tmp = qf_path(dir, "shard2.tmp");
    uint32_t zeros[4] = {0x77777777u, 0x77777777u, 0x77787777u, 0x77777777u};
    char patch[256];
    snprintf(patch, sizeof patch, "%s.qzeros", E0G);
    rewrite_shard(src, tmp, NULL, patch, zeros);
    unlink(src);
    assert_int_equal(rename(tmp, src), 0);
    expect_load_error(dir, E0G, 16, 32, "symmetric auto_gptq packing stores every zero nibble as 7");
    /* 5. a module the config keeps BF16 that carries quantized tensors */
    size_t clen;
    char *cfg = read_fixture_text("quant/int4-autoround/config.json", &clen);
    clef_err err;
    json_value *c = json_parse(cfg, clen, &err);
    json_value *ex = (json_value *)json_get(json_get(c, "quantization_config"), "extra_config");
    json_value *o = json_new(JSON_OBJECT);
    json_object_set(o, "bits", 4, json_new_int(16));
    json_object_set(ex, "thinker.model.layers.1.self_attn.q_proj", strlen("thinker.model.layers.1.self_attn.q_proj"), o);
    clef_buf b = {0};
    json_render(c, &b);
    replace_text(dir, "config.json", b.data, b.len);
    expect_load_error(dir, NULL, 0, 0, "keeps module 'thinker.model.layers.1.self_attn.q_proj' unquantized");
    clef_buf_free(&b);
    json_free(c);
    free(cfg);
    qf_remove(dir);
    free(dir);
    free(src);
    free(tmp);
    /* 6. a wrong shape names the tensor and what was expected */
    dir = qf_assemble("fp8-block");
    expect_load_error(dir, E0G, 16, 48, "expected shape [16,48], found [16,32]");
    qf_remove(dir);
    free(dir);
    free(tiny);
}

/* Already quantized inputs and impossible options are refused. */
static void test_quantize_refusals(void **state) {
    char *dir = qf_assemble("fp8-block");
    char tmpl[] = "/tmp/clef_qref_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    clef_quantize_options o = {.model_dir = dir, .out_dir = tmpl, .format = CLEF_QF_NVFP4_CT};
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_quantize_checkpoint(&o, NULL, &err), -1);
    assert_non_null(strstr(err.message, "is already quantized (fp8-block)"));
    char *tiny = tu_fixture("tiny-clef-omni");
    o = (clef_quantize_options){.model_dir = tiny, .out_dir = tmpl, .format = CLEF_QF_FP8_BLOCK, .stacked = 1};
    assert_int_equal(clef_quantize_checkpoint(&o, NULL, &err), -1);
    assert_non_null(strstr(err.message, "--layout stacked is not defined for fp8-block"));
    o = (clef_quantize_options){.model_dir = tiny, .out_dir = tiny, .format = CLEF_QF_FP8_BLOCK};
    assert_int_equal(clef_quantize_checkpoint(&o, NULL, &err), -1);
    assert_non_null(strstr(err.message, "--out must differ from --model"));
    o = (clef_quantize_options){.model_dir = tiny, .out_dir = tmpl, .format = CLEF_QF_INT4_AUTOROUND, .group = 12};
    assert_int_equal(clef_quantize_checkpoint(&o, NULL, &err), -1);
    assert_non_null(strstr(err.message, "--group must be a positive multiple of 8"));
    clef_quant_format f;
    assert_int_equal(clef_quant_format_parse("nvfp4", &f), 0);
    assert_int_equal(f, CLEF_QF_NVFP4_CT);
    assert_int_equal(clef_quant_format_parse("int3", &f), -1);
    free(tiny);
    qf_remove(tmpl);
    qf_remove(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp_tables),
        cmocka_unit_test(test_encoders),
        cmocka_unit_test(test_fixture_dequant),
        cmocka_unit_test(test_backend_matmul),
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_quantizer_edges),
        cmocka_unit_test(test_config_parse),
        cmocka_unit_test(test_inconsistent_metadata),
        cmocka_unit_test(test_quantize_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
