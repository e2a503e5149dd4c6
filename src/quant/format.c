/* format.c — quantization_config parsing and tensor-name cross-checks
 * (SPEC.md §10.3). */
#include "quant/format.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fnmatch.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/checkpoint.h"
#include "io/config.h"
#include "json/json.h"
#include "util/buf.h"

#define CFG_FILE "config.json"
#define HF_QUANT_FILE "hf_quant_config.json"

static const char *const format_names[CLEF_QF_COUNT] = {
    [CLEF_QF_NONE] = "bf16",
    [CLEF_QF_NVFP4_CT] = "nvfp4-ct",
    [CLEF_QF_NVFP4_MODELOPT] = "nvfp4-modelopt",
    [CLEF_QF_FP8_BLOCK] = "fp8-block",
    [CLEF_QF_INT4_AUTOROUND] = "int4-autoround",
};

/* Longer names for messages. */
static const char *const format_titles[CLEF_QF_COUNT] = {
    [CLEF_QF_NONE] = "unquantized (no quantization_config)",
    [CLEF_QF_NVFP4_CT] = "compressed-tensors NVFP4",
    [CLEF_QF_NVFP4_MODELOPT] = "ModelOpt NVFP4",
    [CLEF_QF_FP8_BLOCK] = "FP8-block",
    [CLEF_QF_INT4_AUTOROUND] = "AutoRound INT4",
};

const char *clef_quant_format_name(clef_quant_format f) {
    return (unsigned)f < CLEF_QF_COUNT ? format_names[f] : "?";
}

/* ---- small JSON readers (each names file and key in its error) ---- */

static const char *get_str(const json_value *obj, const char *key) {
    const json_value *v = json_get(obj, key);
    return v && v->type == JSON_STRING ? v->str : NULL;
}

/* Integer member; 1 = absent/null (*out untouched), -1 = not an integer. */
static int get_i64(const json_value *obj, const char *key, int64_t *out) {
    const json_value *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) return 1;
    return json_as_i64(v, out) == 0 ? 0 : -1;
}

static int expect_str(const json_value *obj, const char *path, const char *key, const char *want, int required,
                      const char *file, clef_err *err) {
    const json_value *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) {
        if (!required) return 0;
        return clef_fail_file(err, file, "%s.%s is missing (expected \"%s\")", path, key, want);
    }
    if (v->type != JSON_STRING || strcmp(v->str, want) != 0) {
        clef_buf b = {0};
        json_render(v, &b);
        int rc = clef_fail_file(err, file, "%s.%s is %s; clef reads \"%s\"", path, key, b.data, want);
        clef_buf_free(&b);
        return rc;
    }
    return 0;
}

static int expect_int(const json_value *obj, const char *path, const char *key, int64_t want, int required,
                      const char *file, clef_err *err) {
    int64_t x = 0;
    int rc = get_i64(obj, key, &x);
    if (rc == 1 && !required) return 0;
    if (rc != 0 || x != want) return clef_fail_file(err, file, "%s.%s must be %lld", path, key, (long long)want);
    return 0;
}

/* Copy a JSON array of strings (or null/absent = empty) into qc->excluded. */
static int take_patterns(clef_quant_config *qc, const json_value *arr, const char *path, const char *file,
                         clef_err *err) {
    if (!arr || arr->type == JSON_NULL) return 0;
    if (arr->type != JSON_ARRAY) return clef_fail_file(err, file, "%s must be a list of module names", path);
    qc->excluded = clef_xcalloc(arr->n ? arr->n : 1, sizeof *qc->excluded);
    qc->excluded_re = clef_xcalloc(arr->n ? arr->n : 1, sizeof *qc->excluded_re);
    for (size_t i = 0; i < arr->n; i++) {
        const json_value *s = arr->items[i];
        if (s->type != JSON_STRING) return clef_fail_file(err, file, "%s[%zu] must be a string", path, i);
        qc->excluded[qc->n_excluded++] = clef_xstrndup(s->str, s->len);
        if (qc->match == CLEF_QM_CT && strncmp(s->str, "re:", 3) == 0) {
            int code;
            PCRE2_SIZE off;
            pcre2_code *re = pcre2_compile((PCRE2_SPTR)(s->str + 3), s->len - 3, PCRE2_UTF, &code, &off, NULL);
            if (!re) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(code, msg, sizeof msg);
                return clef_fail_file(err, file, "%s[%zu] \"%s\": bad regular expression at %zu: %s", path, i, s->str,
                                      (size_t)off, (const char *)msg);
            }
            qc->excluded_re[i] = re;
        }
    }
    return 0;
}

/* ---- per-method parsers ---- */

/* The weights (and, for W4A4, input_activations) of one config group. */
static int parse_ct_group(clef_quant_config *qc, const json_value *g, const char *gname, int first, clef_err *err) {
    char path[256];
    snprintf(path, sizeof path, "quantization_config.config_groups.%s.weights", gname);
    const json_value *w = json_get(g, "weights");
    if (!w || w->type != JSON_OBJECT) return clef_fail_file(err, CFG_FILE, "%s is missing", path);
    if (expect_int(w, path, "num_bits", 4, 1, CFG_FILE, err) || expect_str(w, path, "type", "float", 1, CFG_FILE, err) ||
        expect_str(w, path, "strategy", "tensor_group", 1, CFG_FILE, err) ||
        expect_int(w, path, "group_size", 16, 1, CFG_FILE, err))
        return -1;
    const json_value *a = json_get(g, "input_activations");
    int w4a4 = a && a->type != JSON_NULL;
    if (w4a4) {
        snprintf(path, sizeof path, "quantization_config.config_groups.%s.input_activations", gname);
        if (a->type != JSON_OBJECT || expect_int(a, path, "num_bits", 4, 1, CFG_FILE, err) ||
            expect_str(a, path, "type", "float", 1, CFG_FILE, err) ||
            expect_str(a, path, "dynamic", "local", 1, CFG_FILE, err))
            return a->type != JSON_OBJECT ? clef_fail_file(err, CFG_FILE, "%s must be an object or null", path) : -1;
    }
    if (!first && w4a4 != qc->w4a4)
        return clef_fail_file(err, CFG_FILE,
                              "quantization_config.config_groups disagree on input_activations (W4A4 and W4A16 mixed)");
    qc->w4a4 = w4a4;
    return 0;
}

static int parse_ct(clef_quant_config *qc, const json_value *q, clef_err *err) {
    qc->format = CLEF_QF_NVFP4_CT;
    qc->group_size = 16;
    qc->match = CLEF_QM_CT;
    if (expect_str(q, "quantization_config", "format", "nvfp4-pack-quantized", 1, CFG_FILE, err)) return -1;
    const char *status = get_str(q, "quantization_status");
    if (status && strcmp(status, "compressed") != 0)
        return clef_fail_file(err, CFG_FILE,
                              "quantization_config.quantization_status is \"%s\"; clef reads \"compressed\"", status);
    const json_value *groups = json_get(q, "config_groups");
    if (!groups || groups->type != JSON_OBJECT || groups->n == 0)
        return clef_fail_file(err, CFG_FILE, "quantization_config.config_groups is missing or empty");
    for (size_t i = 0; i < groups->n; i++)
        if (parse_ct_group(qc, groups->items[i], groups->keys[i], i == 0, err)) return -1;
    return take_patterns(qc, json_get(q, "ignore"), "quantization_config.ignore", CFG_FILE, err);
}

/* `q` is quantization_config (from config.json, file CFG_FILE) or
 * hf_quant_config.json's "quantization" object. */
static int parse_modelopt(clef_quant_config *qc, const json_value *q, const char *file, const char *path,
                          clef_err *err) {
    qc->format = CLEF_QF_NVFP4_MODELOPT;
    qc->group_size = 16;
    qc->match = CLEF_QM_FNMATCH;
    if (expect_str(q, path, "quant_algo", "NVFP4", 1, file, err) || expect_int(q, path, "group_size", 16, 0, file, err))
        return -1;
    char p[128];
    snprintf(p, sizeof p, "%s.exclude_modules", path);
    return take_patterns(qc, json_get(q, "exclude_modules"), p, file, err);
}

static int parse_fp8(clef_quant_config *qc, const json_value *q, clef_err *err) {
    qc->format = CLEF_QF_FP8_BLOCK;
    qc->match = CLEF_QM_SUBSTRING;
    const json_value *b = json_get(q, "weight_block_size");
    if (!b || b->type == JSON_NULL)
        return clef_fail_file(err, CFG_FILE,
                              "quantization_config.weight_block_size is missing: clef reads block-scaled FP8 "
                              "(per-tensor FP8 is not supported)");
    if (b->type != JSON_ARRAY || b->n != 2 || json_as_i64(b->items[0], &qc->block[0]) ||
        json_as_i64(b->items[1], &qc->block[1]) || qc->block[0] < 1 || qc->block[1] < 1)
        return clef_fail_file(err, CFG_FILE,
                              "quantization_config.weight_block_size must be two positive integers [Br, Bc]");
    if (expect_str(q, "quantization_config", "activation_scheme", "dynamic", 0, CFG_FILE, err) ||
        expect_str(q, "quantization_config", "fmt", "e4m3", 0, CFG_FILE, err))
        return -1;
    return take_patterns(qc, json_get(q, "modules_to_not_convert"), "quantization_config.modules_to_not_convert",
                         CFG_FILE, err);
}

static int parse_bool(const json_value *obj, const char *key, int dflt, int *out) {
    const json_value *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) {
        *out = dflt;
        return 0;
    }
    if (v->type != JSON_TRUE && v->type != JSON_FALSE) return -1;
    *out = v->type == JSON_TRUE;
    return 0;
}

static int parse_autoround_extra(clef_quant_config *qc, const json_value *extra, clef_err *err) {
    if (!extra || extra->type == JSON_NULL) return 0;
    if (extra->type != JSON_OBJECT)
        return clef_fail_file(err, CFG_FILE, "quantization_config.extra_config must be an object keyed by module name");
    qc->overrides = clef_xcalloc(extra->n ? extra->n : 1, sizeof *qc->overrides);
    for (size_t i = 0; i < extra->n; i++) {
        const json_value *e = extra->items[i];
        const char *m = extra->keys[i];
        clef_quant_override *o = &qc->overrides[qc->n_overrides++];
        o->module = clef_xstrndup(m, strlen(m));
        o->sym = -1;
        if (e->type != JSON_OBJECT)
            return clef_fail_file(err, CFG_FILE, "quantization_config.extra_config[\"%s\"] must be an object", m);
        if (get_i64(e, "bits", &o->bits) < 0 || get_i64(e, "group_size", &o->group_size) < 0)
            return clef_fail_file(err, CFG_FILE,
                                  "quantization_config.extra_config[\"%s\"]: bits and group_size must be integers", m);
        if (o->bits != 0 && o->bits != 4 && o->bits < 16)
            return clef_fail_file(
                err, CFG_FILE,
                "quantization_config.extra_config[\"%s\"].bits = %lld; clef reads 4 (quantized) or 16 "
                "(unquantized)",
                m, (long long)o->bits);
        if (json_get(e, "group_size") && o->group_size < 1 && o->bits < 16)
            return clef_fail_file(err, CFG_FILE, "quantization_config.extra_config[\"%s\"].group_size must be positive",
                                  m);
        const json_value *sym = json_get(e, "sym");
        if (sym && sym->type != JSON_NULL) {
            if (sym->type != JSON_TRUE && sym->type != JSON_FALSE)
                return clef_fail_file(err, CFG_FILE, "quantization_config.extra_config[\"%s\"].sym must be a boolean",
                                      m);
            o->sym = sym->type == JSON_TRUE;
        }
    }
    return 0;
}

static int parse_autoround(clef_quant_config *qc, const json_value *q, clef_err *err) {
    qc->format = CLEF_QF_INT4_AUTOROUND;
    qc->match = CLEF_QM_SUBSTRING; /* no exclusion list: extra_config decides */
    const char *pf = get_str(q, "packing_format");
    if (!pf || strcmp(pf, "auto_round:auto_gptq") != 0)
        return clef_fail_file(err, CFG_FILE,
                              "quantization_config.packing_format is %s%s%s; clef reads \"auto_round:auto_gptq\"",
                              pf ? "\"" : "", pf ? pf : "missing", pf ? "\"" : "");
    if (expect_int(q, "quantization_config", "bits", 4, 1, CFG_FILE, err) ||
        expect_str(q, "quantization_config", "data_type", "int", 0, CFG_FILE, err))
        return -1;
    qc->bits = 4;
    if (get_i64(q, "group_size", &qc->group_size) != 0 || qc->group_size < 1)
        return clef_fail_file(err, CFG_FILE,
                              "quantization_config.group_size must be a positive integer (per-channel -1 is "
                              "not supported)");
    if (parse_bool(q, "sym", 1, &qc->sym) != 0)
        return clef_fail_file(err, CFG_FILE, "quantization_config.sym must be a boolean");
    return parse_autoround_extra(qc, json_get(q, "extra_config"), err);
}

/* hf_quant_config.json: {"producer":{"name":"modelopt",...},"quantization":{...}}. */
static int parse_hf_quant(clef_quant_config *qc, const json_value *hf, int have_cfg, clef_err *err) {
    const json_value *prod = json_get(hf, "producer");
    const char *name = prod ? get_str(prod, "name") : NULL;
    if (!name || strcmp(name, "modelopt") != 0)
        return clef_fail_file(err, HF_QUANT_FILE, "producer.name is %s; clef reads ModelOpt's (\"modelopt\")",
                              name ? name : "missing");
    const json_value *q = json_get(hf, "quantization");
    if (!q || q->type != JSON_OBJECT) return clef_fail_file(err, HF_QUANT_FILE, "\"quantization\" is missing");
    if (!have_cfg) return parse_modelopt(qc, q, HF_QUANT_FILE, "quantization", err);
    if (qc->format != CLEF_QF_NVFP4_MODELOPT)
        return clef_fail_file(err, HF_QUANT_FILE, "present (ModelOpt), but config.json's quantization_config is %s",
                              format_titles[qc->format]);
    return expect_str(q, "quantization", "quant_algo", "NVFP4", 1, HF_QUANT_FILE, err);
}

static int parse_method(clef_quant_config *qc, const json_value *q, clef_err *err) {
    if (q->type != JSON_OBJECT) return clef_fail_file(err, CFG_FILE, "quantization_config must be an object");
    const char *m = get_str(q, "quant_method");
    if (!m) return clef_fail_file(err, CFG_FILE, "quantization_config.quant_method is missing");
    snprintf(qc->method, sizeof qc->method, "%s", m);
    if (!strcmp(m, "compressed-tensors")) return parse_ct(qc, q, err);
    if (!strcmp(m, "modelopt")) return parse_modelopt(qc, q, CFG_FILE, "quantization_config", err);
    if (!strcmp(m, "fp8")) return parse_fp8(qc, q, err);
    if (!strcmp(m, "auto-round") || !strcmp(m, "intel/auto-round")) return parse_autoround(qc, q, err);
    return clef_fail_file(
        err, CFG_FILE,
        "quantization_config.quant_method \"%s\" is not supported (clef reads compressed-tensors NVFP4, "
        "modelopt NVFP4, fp8 with weight_block_size, auto-round INT4)",
        m);
}

int clef_quant_config_parse(const char *config_json, size_t config_len, const char *hf_quant_json, size_t hf_len,
                            clef_quant_config *qc, clef_err *err) {
    memset(qc, 0, sizeof *qc);
    clef_err jerr;
    clef_err_clear(&jerr);
    json_value *cfg = json_parse(config_json, config_len, &jerr);
    if (!cfg) return clef_fail_file(err, CFG_FILE, "not valid JSON: %s", jerr.message);
    const json_value *q = json_get(cfg, "quantization_config");
    if (!q || q->type == JSON_NULL) {
        const json_value *th = json_get(cfg, "thinker_config");
        q = th ? json_get(th, "quantization_config") : NULL;
    }
    int have_cfg = q && q->type != JSON_NULL;
    int rc = have_cfg ? parse_method(qc, q, err) : 0;
    json_free(cfg);
    if (rc != 0 || !hf_quant_json) return rc;
    json_value *hf = json_parse(hf_quant_json, hf_len, &jerr);
    if (!hf) return clef_fail_file(err, HF_QUANT_FILE, "not valid JSON: %s", jerr.message);
    rc = parse_hf_quant(qc, hf, have_cfg, err);
    json_free(hf);
    return rc;
}

int clef_quant_config_load(const char *dir, clef_quant_config *qc, clef_err *err) {
    memset(qc, 0, sizeof *qc);
    size_t clen = 0, hlen = 0;
    char *ctext = clef_read_text_file(dir, CFG_FILE, CLEF_FILE_MAX_CONFIG, &clen, err);
    if (!ctext) return -1;
    char *htext = NULL;
    clef_buf p = {0};
    clef_buf_printf(&p, "%s/%s", dir, HF_QUANT_FILE);
    struct stat sb;
    int present = stat(p.data, &sb) == 0; /* no open: a FIFO would block (the read below refuses it) */
    clef_buf_free(&p);
    if (present) {
        htext = clef_read_text_file(dir, HF_QUANT_FILE, CLEF_FILE_MAX_CONFIG, &hlen, err);
        if (!htext) {
            free(ctext);
            return -1;
        }
    }
    int rc = clef_quant_config_parse(ctext, clen, htext, hlen, qc, err);
    free(ctext);
    free(htext);
    return rc;
}

void clef_quant_config_free(clef_quant_config *qc) {
    if (!qc) return;
    for (size_t i = 0; i < qc->n_excluded; i++) {
        free(qc->excluded[i]);
        if (qc->excluded_re && qc->excluded_re[i]) pcre2_code_free((pcre2_code *)qc->excluded_re[i]);
    }
    free(qc->excluded);
    free(qc->excluded_re);
    for (size_t i = 0; i < qc->n_overrides; i++) free(qc->overrides[i].module);
    free(qc->overrides);
    memset(qc, 0, sizeof *qc);
}

/* ---- module rules ---- */

static const clef_quant_override *override_of(const clef_quant_config *qc, const char *module) {
    for (size_t i = 0; i < qc->n_overrides; i++)
        if (!strcmp(qc->overrides[i].module, module)) return &qc->overrides[i];
    return NULL;
}

/* Python re.match: anchored at the start, may stop before the end. */
static int re_match(void *code, const char *s) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern((pcre2_code *)code, NULL);
    int rc = pcre2_match((pcre2_code *)code, (PCRE2_SPTR)s, strlen(s), 0, PCRE2_ANCHORED, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

static int pattern_matches(const clef_quant_config *qc, size_t i, const char *module) {
    const char *p = qc->excluded[i];
    switch (qc->match) {
    case CLEF_QM_CT: {
        if (qc->excluded_re[i]) return re_match(qc->excluded_re[i], module);
        size_t lp = strlen(p), lm = strlen(module);
        return !strcmp(p, module) || (lm > lp && module[lm - lp - 1] == '.' && !strcmp(module + lm - lp, p));
    }
    case CLEF_QM_FNMATCH:
        return fnmatch(p, module, 0) == 0;
    case CLEF_QM_SUBSTRING:
        return strstr(module, p) != NULL;
    }
    return 0;
}

int clef_quant_module_excluded(const clef_quant_config *qc, const char *module) {
    if (qc->format == CLEF_QF_NONE) return 1;
    const clef_quant_override *o = override_of(qc, module);
    if (o && o->bits >= 16) return 1;
    for (size_t i = 0; i < qc->n_excluded; i++)
        if (pattern_matches(qc, i, module)) return 1;
    return 0;
}

int64_t clef_quant_group_size(const clef_quant_config *qc, const char *module) {
    if (qc->format == CLEF_QF_NVFP4_CT || qc->format == CLEF_QF_NVFP4_MODELOPT) return 16;
    if (qc->format != CLEF_QF_INT4_AUTOROUND) return 0;
    const clef_quant_override *o = override_of(qc, module);
    return o && o->group_size > 0 ? o->group_size : qc->group_size;
}

int clef_quant_module_sym(const clef_quant_config *qc, const char *module) {
    const clef_quant_override *o = override_of(qc, module);
    return o && o->sym >= 0 ? o->sym : qc->sym;
}

/* ---- tensor-name cross-check ---- */

/* Which format a tensor's name (and dtype, for a bare `.weight`) belongs to:
 * CLEF_QF_NONE for an ordinary tensor; CLEF_QF_COUNT for `weight_scale`,
 * shared by both NVFP4 forms. */
static clef_quant_format companion_format(const char *suffix, clef_dtype dt) {
    static const struct {
        const char *suffix;
        clef_quant_format f;
    } map[] = {
        {"weight_packed", CLEF_QF_NVFP4_CT},      {"weight_global_scale", CLEF_QF_NVFP4_CT},
        {"input_global_scale", CLEF_QF_NVFP4_CT}, {"weight_scale_2", CLEF_QF_NVFP4_MODELOPT},
        {"input_scale", CLEF_QF_NVFP4_MODELOPT},  {"weight_scale_inv", CLEF_QF_FP8_BLOCK},
        {"qweight", CLEF_QF_INT4_AUTOROUND},      {"qzeros", CLEF_QF_INT4_AUTOROUND},
        {"scales", CLEF_QF_INT4_AUTOROUND},       {"g_idx", CLEF_QF_INT4_AUTOROUND},
        {"weight_scale", CLEF_QF_COUNT},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(suffix, map[i].suffix)) return map[i].f;
    size_t n = strlen(suffix);
    if (n > 20 && !strcmp(suffix + n - 20, "_weight_global_scale")) return CLEF_QF_NVFP4_CT; /* stacked variant */
    if (!strcmp(suffix, "weight") && dt == CLEF_DT_U8) return CLEF_QF_NVFP4_MODELOPT;
    if (!strcmp(suffix, "weight") && dt == CLEF_DT_F8_E4M3) return CLEF_QF_FP8_BLOCK;
    return CLEF_QF_NONE;
}

static int has(const clef_checkpoint *ck, const char *module, const char *suffix) {
    clef_buf b = {0};
    clef_buf_printf(&b, "%s.%s", module, suffix);
    int found = clef_checkpoint_find(ck, b.data) != NULL;
    clef_buf_free(&b);
    return found;
}

/* The companions a quantized module of format `f` must carry. */
static const char *const *required_companions(const clef_quant_config *qc) {
    static const char *const ct[] = {"weight_packed", "weight_scale", "weight_global_scale", NULL};
    static const char *const ct_a4[] = {"weight_packed", "weight_scale", "weight_global_scale", "input_global_scale",
                                        NULL};
    static const char *const mo[] = {"weight", "weight_scale", "weight_scale_2", NULL};
    static const char *const fp8[] = {"weight", "weight_scale_inv", NULL};
    static const char *const int4[] = {"qweight", "qzeros", "scales", NULL};
    switch (qc->format) {
    case CLEF_QF_NVFP4_CT: return qc->w4a4 ? ct_a4 : ct;
    case CLEF_QF_NVFP4_MODELOPT: return mo;
    case CLEF_QF_FP8_BLOCK: return fp8;
    case CLEF_QF_INT4_AUTOROUND: return int4;
    default: return NULL;
    }
}

/* Stacked experts may spell the global scale "<module>_weight_global_scale". */
static int has_companion(const clef_checkpoint *ck, const char *module, const char *suffix) {
    if (has(ck, module, suffix)) return 1;
    if (strcmp(suffix, "weight_global_scale") != 0) return 0;
    clef_buf b = {0};
    clef_buf_printf(&b, "%s_weight_global_scale", module);
    int found = clef_checkpoint_find(ck, b.data) != NULL;
    clef_buf_free(&b);
    return found;
}

/* Tensor `name` is a companion of `f`'s: its module must be complete, and
 * must not be one the config keeps unquantized. */
static int check_module(const clef_checkpoint *ck, const clef_quant_config *qc, const char *name, const char *module,
                        clef_err *err) {
    const char *const *req = required_companions(qc);
    for (size_t i = 0; req && req[i]; i++)
        if (!has_companion(ck, module, req[i]))
            return clef_fail_file(err, "checkpoint", "tensor '%s' is a %s companion, but '%s.%s' is missing", name,
                                  format_titles[qc->format], module, req[i]);
    if (qc->format == CLEF_QF_NVFP4_CT && !qc->w4a4 && has(ck, module, "input_global_scale"))
        return clef_fail_file(err, "checkpoint",
                              "tensor '%s.input_global_scale' is present, but quantization_config has no "
                              "input_activations (W4A16)",
                              module);
    if (has(ck, module, "g_idx"))
        return clef_fail_file(err, "checkpoint",
                              "tensor '%s.g_idx' is present: act-order INT4 (g_idx) is not supported", module);
    if (clef_quant_module_excluded(qc, module))
        return clef_fail_file(err, "checkpoint",
                              "tensor '%s' is quantized, but quantization_config keeps module '%s' "
                              "unquantized",
                              name, module);
    return 0;
}

static int is_stacked_name(const char *name) {
    return strstr(name, ".mlp.experts.gate_up_proj") || strstr(name, ".mlp.experts.down_proj");
}

int clef_quant_detect(const clef_checkpoint *ck, clef_quant_config *qc, clef_err *err) {
    if (!ck->dir && !ck->config_json) { /* an in-memory synthetic checkpoint (io/synth.h): plain BF16 */
        memset(qc, 0, sizeof *qc);
        return 0;
    }
    if (!ck->dir) { /* in memory with its config text (quant/qsynth.h) */
        if (clef_quant_config_parse(ck->config_json, ck->config_json_len, ck->hf_quant_json, ck->hf_quant_json_len,
                                    qc, err) != 0)
            return -1;
    } else if (clef_quant_config_load(ck->dir, qc, err) != 0) {
        return -1;
    }
    char module[1024];
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const st_tensor *t = ck->catalog[i];
        const char *dot = strrchr(t->name, '.');
        if (!dot || (size_t)(dot - t->name) >= sizeof module) continue;
        clef_quant_format f = companion_format(dot + 1, t->dtype);
        if (f == CLEF_QF_NONE) continue;
        int nvfp4 = qc->format == CLEF_QF_NVFP4_CT || qc->format == CLEF_QF_NVFP4_MODELOPT;
        if (f != qc->format && !(f == CLEF_QF_COUNT && nvfp4))
            return clef_fail_file(err, "checkpoint",
                                  "tensor '%s' (%s) is a%s %s companion, but config.json's "
                                  "quantization_config is %s",
                                  t->name, clef_dtype_name(t->dtype), f == CLEF_QF_COUNT ? "n" : "",
                                  f == CLEF_QF_COUNT ? "NVFP4" : format_titles[f], format_titles[qc->format]);
        memcpy(module, t->name, (size_t)(dot - t->name));
        module[dot - t->name] = '\0';
        if (is_stacked_name(t->name)) qc->stacked = 1;
        if (strstr(dot + 1, "_weight_global_scale")) continue; /* "<module>_weight_global_scale": no module */
        if (check_module(ck, qc, t->name, module, err) != 0) return -1;
    }
    return 0;
}
