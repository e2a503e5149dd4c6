/* config.c — thinker text config and joint head config (SPEC.md §6.1, §7.1).
 *
 * Every size the model uses is read from the files; keys SPEC §6.1 treats as
 * essential are required, so a wrong or partial config fails loudly instead
 * of picking up transformers' class defaults (Qwen2.5-Omni leftovers).
 */
#include "io/config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json/json.h"
#include "util/buf.h"
#include "util/file.h"

#define CFG_FILE "config.json"
#define HEAD_FILE "joint_head_config.json"
#define TEXT_PATH "thinker_config.text_config"

/* Dimensions are kept well inside int32 so later index arithmetic in int
 * cannot overflow on any size a config can declare. */
#define CFG_MAX_DIM ((int64_t)1 << 30)

/* Integer at obj[key] into *out; an integral float such as 2048.0 is
 * accepted (some config writers emit them).  Returns 0, 1 when the key is
 * absent or null and not `required` (*out untouched), or -1 with err (absent
 * and required, or not an integer), naming `path`.`key`. */
static int get_int(const json_value *obj, const char *path, const char *key, int required, int64_t *out, clef_err *err,
                   const char *file) {
    const json_value *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) {
        if (required) return clef_fail_file(err, file, "required key %s.%s is missing", path, key);
        return 1;
    }
    if ((v->type != JSON_INT && v->type != JSON_FLOAT) || json_as_i64(v, out) != 0)
        return clef_fail_file(err, file, "%s.%s must be an integer", path, key);
    return 0;
}

/* Like get_int, with the value required to lie in [lo, hi]. */
static int get_int_in(const json_value *obj, const char *path, const char *key, int required, int64_t lo, int64_t hi,
                      int64_t *out, clef_err *err, const char *file) {
    int rc = get_int(obj, path, key, required, out, err, file);
    if (rc != 0) return rc;
    if (*out < lo || *out > hi)
        return clef_fail_file(err, file, "%s.%s = %lld is out of range [%lld, %lld]", path, key, (long long)*out,
                              (long long)lo, (long long)hi);
    return 0;
}

/* Boolean at obj[key]; 1 when absent (`*out` untouched). */
static int get_bool(const json_value *obj, const char *path, const char *key, int *out, clef_err *err,
                    const char *file) {
    const json_value *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) return 1;
    if (v->type != JSON_TRUE && v->type != JSON_FALSE)
        return clef_fail_file(err, file, "%s.%s must be a boolean", path, key);
    *out = v->type == JSON_TRUE;
    return 0;
}

/* The required sizes of §6.1, each a positive integer. */
static int parse_text_sizes(const json_value *tc, clef_text_config *c, clef_err *err) {
    struct {
        const char *key;
        int64_t *dst;
    } req[] = {
        {"vocab_size", &c->vocab_size},
        {"hidden_size", &c->hidden_size},
        {"num_hidden_layers", &c->num_hidden_layers},
        {"num_attention_heads", &c->num_attention_heads},
        {"num_key_value_heads", &c->num_key_value_heads},
        {"num_experts", &c->num_experts},
        {"num_experts_per_tok", &c->num_experts_per_tok},
        {"moe_intermediate_size", &c->moe_intermediate_size},
    };
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
        if (get_int_in(tc, TEXT_PATH, req[i].key, 1, 1, CFG_MAX_DIM, req[i].dst, err, CFG_FILE) != 0) return -1;
    const json_value *eps = json_get(tc, "rms_norm_eps");
    if (!eps || eps->type == JSON_NULL)
        return clef_fail_file(err, CFG_FILE, "required key " TEXT_PATH ".rms_norm_eps is missing");
    if (json_as_double(eps, &c->rms_norm_eps) != 0 || !(c->rms_norm_eps > 0) || !isfinite(c->rms_norm_eps))
        return clef_fail_file(err, CFG_FILE, TEXT_PATH ".rms_norm_eps must be a positive finite number");
    return 0;
}

/* head_dim: explicit, or hidden/heads as in the reference config class. */
static int parse_head_dim(const json_value *tc, clef_text_config *c, clef_err *err) {
    int rc = get_int_in(tc, TEXT_PATH, "head_dim", 0, 1, CFG_MAX_DIM, &c->head_dim, err, CFG_FILE);
    if (rc < 0) return -1;
    if (rc == 1) {
        if (c->hidden_size % c->num_attention_heads != 0)
            return clef_fail_file(err, CFG_FILE,
                                  TEXT_PATH ".head_dim is absent and hidden_size %lld is not divisible by "
                                            "num_attention_heads %lld",
                                  (long long)c->hidden_size, (long long)c->num_attention_heads);
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    if (c->head_dim % 2 != 0)
        return clef_fail_file(err, CFG_FILE, TEXT_PATH ".head_dim %lld must be even (rotate-half RoPE)",
                              (long long)c->head_dim);
    return 0;
}

/* Keys whose Clef-Omni value (SPEC §6.1 table) is used when absent. */
static int parse_text_optional(const json_value *tc, clef_text_config *c, clef_err *err) {
    c->intermediate_size = 0; /* dense MLP width: only needed if some layer is dense (checked below) */
    c->norm_topk_prob = 1;
    c->decoder_sparse_step = 1;
    c->max_position_embeddings = 65536;
    if (get_int_in(tc, TEXT_PATH, "intermediate_size", 0, 0, CFG_MAX_DIM, &c->intermediate_size, err, CFG_FILE) < 0 ||
        get_bool(tc, TEXT_PATH, "norm_topk_prob", &c->norm_topk_prob, err, CFG_FILE) < 0 ||
        get_int_in(tc, TEXT_PATH, "decoder_sparse_step", 0, 1, CFG_MAX_DIM, &c->decoder_sparse_step, err, CFG_FILE) <
            0 ||
        get_int_in(tc, TEXT_PATH, "max_position_embeddings", 0, 1, CFG_MAX_DIM, &c->max_position_embeddings, err,
                   CFG_FILE) < 0)
        return -1;
    memset(c->mlp_only, 0, sizeof c->mlp_only);
    const json_value *mlp = json_get(tc, "mlp_only_layers");
    if (!mlp || mlp->type == JSON_NULL) return 0;
    if (mlp->type != JSON_ARRAY) return clef_fail_file(err, CFG_FILE, TEXT_PATH ".mlp_only_layers must be an array");
    for (size_t i = 0; i < mlp->n; i++) {
        int64_t l;
        if (mlp->items[i]->type != JSON_INT || json_as_i64(mlp->items[i], &l) != 0 || l < 0 ||
            l >= c->num_hidden_layers)
            return clef_fail_file(err, CFG_FILE, TEXT_PATH ".mlp_only_layers[%zu] is not a layer index in [0, %lld)", i,
                                  (long long)c->num_hidden_layers);
        c->mlp_only[l] = 1;
    }
    return 0;
}

/* Reject RoPE variants the engine does not implement (SPEC §6.1): any
 * rope_type other than "default", or a non-interleaved M-RoPE layout. */
static int check_rope_dict(const json_value *d, const char *path, clef_err *err) {
    if (d->type != JSON_OBJECT) return clef_fail_file(err, CFG_FILE, "%s must be an object", path);
    static const char *const type_keys[] = {"rope_type", "type"};
    for (int i = 0; i < 2; i++) {
        const json_value *t = json_get(d, type_keys[i]);
        if (!t || t->type == JSON_NULL) continue;
        if (t->type != JSON_STRING) return clef_fail_file(err, CFG_FILE, "%s.%s must be a string", path, type_keys[i]);
        if (strcmp(t->str, "default") != 0 || t->len != 7)
            return clef_fail_file(err, CFG_FILE, "%s.%s '%s' is not supported (only \"default\" M-RoPE)", path,
                                  type_keys[i], t->str);
    }
    static const char *const layout_keys[] = {"interleaved", "mrope_interleaved"};
    for (int i = 0; i < 2; i++) {
        int on = 1;
        if (get_bool(d, path, layout_keys[i], &on, err, CFG_FILE) < 0) return -1;
        if (!on)
            return clef_fail_file(err, CFG_FILE, "%s.%s is false: only the interleaved M-RoPE layout is supported",
                                  path, layout_keys[i]);
    }
    return 0;
}

/* mrope_section from `d` if it has one: returns 1 if absent. */
static int get_mrope_section(const json_value *d, const char *path, int64_t out[3], clef_err *err) {
    const json_value *s = json_get(d, "mrope_section");
    if (!s || s->type == JSON_NULL) return 1;
    if (s->type != JSON_ARRAY || s->n != 3)
        return clef_fail_file(err, CFG_FILE, "%s.mrope_section must be an array of 3 integers", path);
    for (int i = 0; i < 3; i++)
        if (s->items[i]->type != JSON_INT || json_as_i64(s->items[i], &out[i]) != 0 || out[i] < 0 ||
            out[i] > CFG_MAX_DIM)
            return clef_fail_file(err, CFG_FILE, "%s.mrope_section[%d] is not a non-negative integer", path, i);
    return 0;
}

/* θ and mrope_section from either RoPE form (SPEC §6.1 "Resolution"). */
static int parse_rope(const json_value *tc, clef_text_config *c, clef_err *err) {
    const json_value *params = json_get(tc, "rope_parameters");
    const json_value *scaling = json_get(tc, "rope_scaling");
    if (params && params->type == JSON_NULL) params = NULL;
    if (scaling && scaling->type == JSON_NULL) scaling = NULL;
    if (params && check_rope_dict(params, TEXT_PATH ".rope_parameters", err) != 0) return -1;
    if (scaling && check_rope_dict(scaling, TEXT_PATH ".rope_scaling", err) != 0) return -1;

    const json_value *theta = params ? json_get(params, "rope_theta") : NULL;
    const char *theta_key = TEXT_PATH ".rope_parameters.rope_theta";
    if (!theta || theta->type == JSON_NULL) {
        theta = json_get(tc, "rope_theta");
        theta_key = TEXT_PATH ".rope_theta";
    }
    if (!theta || theta->type == JSON_NULL)
        return clef_fail_file(err, CFG_FILE,
                              "required key " TEXT_PATH ".rope_parameters.rope_theta (or " TEXT_PATH
                              ".rope_theta) is missing");
    if (json_as_double(theta, &c->rope_theta) != 0 || !(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return clef_fail_file(err, CFG_FILE, "%s must be a positive finite number", theta_key);

    c->mrope_section[0] = 24, c->mrope_section[1] = 20, c->mrope_section[2] = 20;
    int rc = params ? get_mrope_section(params, TEXT_PATH ".rope_parameters", c->mrope_section, err) : 1;
    if (rc == 1 && scaling) rc = get_mrope_section(scaling, TEXT_PATH ".rope_scaling", c->mrope_section, err);
    return rc < 0 ? -1 : 0;
}

/* Cross-field sanity checks; the model code relies on all of these. */
static int check_text(const clef_text_config *c, clef_err *err) {
    if (c->num_hidden_layers > CLEF_MAX_LAYERS)
        return clef_fail_file(err, CFG_FILE, TEXT_PATH ".num_hidden_layers %lld exceeds the supported %d",
                              (long long)c->num_hidden_layers, CLEF_MAX_LAYERS);
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return clef_fail_file(err, CFG_FILE,
                              TEXT_PATH ".num_attention_heads %lld is not divisible by num_key_value_heads %lld",
                              (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
    if (c->num_experts_per_tok > c->num_experts)
        return clef_fail_file(err, CFG_FILE, TEXT_PATH ".num_experts_per_tok %lld exceeds num_experts %lld",
                              (long long)c->num_experts_per_tok, (long long)c->num_experts);
    /* Interleaved M-RoPE (SPEC §6.3) gives each of the head_dim/2 frequencies
     * to one axis; the three sections must cover them exactly (transformers
     * slices past the end silently, so a wrong section would just rotate
     * some frequencies with the wrong axis). */
    const int64_t ms = c->mrope_section[0] + c->mrope_section[1] + c->mrope_section[2];
    if (ms != c->head_dim / 2)
        return clef_fail_file(err, CFG_FILE,
                              TEXT_PATH ".mrope_section [%lld,%lld,%lld] sums to %lld, but head_dim %lld has %lld "
                                        "rotary frequencies (head_dim/2)",
                              (long long)c->mrope_section[0], (long long)c->mrope_section[1],
                              (long long)c->mrope_section[2], (long long)ms, (long long)c->head_dim,
                              (long long)(c->head_dim / 2));
    for (int64_t l = 0; l < c->num_hidden_layers; l++)
        if (!clef_layer_is_moe(c, l) && c->intermediate_size <= 0)
            return clef_fail_file(err, CFG_FILE,
                                  "layer %lld is a dense MLP but " TEXT_PATH ".intermediate_size is missing",
                                  (long long)l);
    return 0;
}

/* thinker_config token ids: -1 when absent (only media paths need them). */
static int parse_token_ids(const json_value *thinker, clef_config *cfg, clef_err *err) {
    struct {
        const char *key;
        int64_t *dst;
    } ids[] = {
        {"image_token_id", &cfg->image_token_id},
        {"video_token_id", &cfg->video_token_id},
        {"audio_token_id", &cfg->audio_token_id},
        {"audio_start_token_id", &cfg->audio_start_token_id},
        {"vision_start_token_id", &cfg->vision_start_token_id},
        {"position_id_per_seconds", &cfg->position_id_per_seconds},
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        *ids[i].dst = -1;
        int64_t hi = i < 5 ? cfg->text.vocab_size - 1 : CFG_MAX_DIM;
        if (get_int_in(thinker, "thinker_config", ids[i].key, 0, 0, hi, ids[i].dst, err, CFG_FILE) < 0) return -1;
    }
    return 0;
}

static int parse_config_doc(const json_value *root, clef_config *cfg, clef_err *err) {
    if (root->type != JSON_OBJECT) return clef_fail_file(err, CFG_FILE, "top level is not a JSON object");
    const json_value *thinker = json_get(root, "thinker_config");
    if (!thinker || thinker->type != JSON_OBJECT)
        return clef_fail_file(err, CFG_FILE, "required key thinker_config is missing or not an object");
    const json_value *tc = json_get(thinker, "text_config");
    if (!tc || tc->type != JSON_OBJECT)
        return clef_fail_file(err, CFG_FILE, "required key " TEXT_PATH " is missing or not an object");
    clef_text_config *c = &cfg->text;
    if (parse_text_sizes(tc, c, err) != 0 || parse_head_dim(tc, c, err) != 0 || parse_text_optional(tc, c, err) != 0 ||
        parse_rope(tc, c, err) != 0 || check_text(c, err) != 0)
        return -1;
    return parse_token_ids(thinker, cfg, err);
}

/* joint_head_config.json: all six fields required (SPEC §7.1). */
static int parse_head_doc(const json_value *root, int64_t thinker_hidden, clef_head_config *h, clef_err *err) {
    if (root->type != JSON_OBJECT) return clef_fail_file(err, HEAD_FILE, "top level is not a JSON object");
    struct {
        const char *key;
        int64_t *dst;
    } req[] = {
        {"hidden_size", &h->hidden_size}, {"width", &h->width}, {"routing_layers", &h->routing_layers},
        {"layers", &h->layers},           {"heads", &h->heads}, {"feedforward", &h->feedforward},
    };
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
        const json_value *v = json_get(root, req[i].key);
        if (!v || v->type == JSON_NULL) return clef_fail_file(err, HEAD_FILE, "required key %s is missing", req[i].key);
        if ((v->type != JSON_INT && v->type != JSON_FLOAT) || json_as_i64(v, req[i].dst) != 0 || *req[i].dst < 1 ||
            *req[i].dst > CFG_MAX_DIM)
            return clef_fail_file(err, HEAD_FILE, "%s must be a positive integer", req[i].key);
    }
    if (h->hidden_size != thinker_hidden)
        return clef_fail_file(err, HEAD_FILE, "hidden_size %lld does not match the thinker's hidden_size %lld",
                              (long long)h->hidden_size, (long long)thinker_hidden);
    if (h->width % h->heads != 0)
        return clef_fail_file(err, HEAD_FILE, "width %lld is not divisible by heads %lld", (long long)h->width,
                              (long long)h->heads);
    return 0;
}

/* json_parse reports 400 invalid_json (request semantics); a broken config
 * file is a server-side 500 naming the file. */
static json_value *parse_file_text(const char *text, size_t len, const char *file, clef_err *err) {
    clef_err jerr;
    clef_err_clear(&jerr);
    json_value *v = json_parse(text, len, &jerr);
    if (!v) clef_fail_file(err, file, "not valid JSON: %s", jerr.message);
    return v;
}

int clef_config_parse(const char *config_json, size_t config_len, const char *head_json, size_t head_len,
                      clef_config *cfg, clef_err *err) {
    memset(cfg, 0, sizeof *cfg);
    json_value *root = parse_file_text(config_json, config_len, CFG_FILE, err);
    if (!root) return -1;
    int rc = parse_config_doc(root, cfg, err);
    json_free(root);
    if (rc != 0) return -1;
    json_value *head = parse_file_text(head_json, head_len, HEAD_FILE, err);
    if (!head) return -1;
    rc = parse_head_doc(head, cfg->text.hidden_size, &cfg->head, err);
    json_free(head);
    return rc;
}

char *clef_read_text_file(const char *dir, const char *name, size_t max_bytes, size_t *len, clef_err *err) {
    char *path = clef_path_join(dir, name);
    char *text = clef_file_read(path, path, max_bytes, len, err);
    free(path);
    return text;
}

int clef_config_load(const char *dir, clef_config *cfg, clef_err *err) {
    size_t clen = 0, hlen = 0;
    char *ctext = clef_read_text_file(dir, CFG_FILE, CLEF_FILE_MAX_CONFIG, &clen, err);
    if (!ctext) return -1;
    char *htext = clef_read_text_file(dir, HEAD_FILE, CLEF_FILE_MAX_CONFIG, &hlen, err);
    if (!htext) {
        free(ctext);
        return -1;
    }
    int rc = clef_config_parse(ctext, clen, htext, hlen, cfg, err);
    free(ctext);
    free(htext);
    return rc;
}

/* SPEC §6.1: MoE iff not in mlp_only_layers, num_experts > 0 and
 * (l+1) % decoder_sparse_step == 0. */
int clef_layer_is_moe(const clef_text_config *c, int64_t l) {
    if (l < 0 || l >= CLEF_MAX_LAYERS || c->mlp_only[l]) return 0;
    return c->num_experts > 0 && c->decoder_sparse_step > 0 && (l + 1) % c->decoder_sparse_step == 0;
}
