/* towers.c — tower configs from config.json and binding of
 * thinker.visual.* / thinker.audio_tower.* by tensor name. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json/json.h"
#include "model/towers_internal.h"
#include "io/config.h"
#include "util/buf.h"

#define PLAIN_DTYPES (CLEF_DT_BIT(CLEF_DT_BF16) | CLEF_DT_BIT(CLEF_DT_F16) | CLEF_DT_BIT(CLEF_DT_F32))
#define TW_NAME 256

/* ---- config -------------------------------------------------------------- */

static int cfg_int(const json_value *o, const char *path, const char *key, int64_t *out, clef_err *err) {
    const json_value *v = json_get(o, key);
    if (!v || json_as_i64(v, out) != 0)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "config.json: required key %s.%s is missing or not an integer",
                         path, key);
    return 0;
}

static int vision_config(const json_value *vc, clef_vision_config *c, clef_err *err) {
    const char *p = "thinker_config.vision_config";
    if (cfg_int(vc, p, "depth", &c->depth, err) || cfg_int(vc, p, "hidden_size", &c->hidden_size, err) ||
        cfg_int(vc, p, "num_heads", &c->num_heads, err) ||
        cfg_int(vc, p, "intermediate_size", &c->intermediate_size, err) ||
        cfg_int(vc, p, "out_hidden_size", &c->out_hidden_size, err) ||
        cfg_int(vc, p, "num_position_embeddings", &c->num_position_embeddings, err) ||
        cfg_int(vc, p, "patch_size", &c->patch_size, err) ||
        cfg_int(vc, p, "temporal_patch_size", &c->temporal_patch_size, err) ||
        cfg_int(vc, p, "spatial_merge_size", &c->spatial_merge_size, err))
        return -1;
    c->in_channels = 3;
    const json_value *ic = json_get(vc, "in_channels");
    if (ic && json_as_i64(ic, &c->in_channels) != 0) c->in_channels = -1;
    if (c->patch_size != CLEF_PATCH || c->temporal_patch_size != CLEF_TEMPORAL_PATCH ||
        c->spatial_merge_size != CLEF_MERGE || c->in_channels != 3)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                         "config.json: %s: only patch 16, temporal patch 2, merge 2 and 3 channels are supported", p);
    if (c->depth <= 0 || c->num_heads <= 0 || c->hidden_size % c->num_heads || (c->hidden_size / c->num_heads) % 4)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "config.json: %s: bad depth/hidden_size/num_heads", p);
    int64_t side = (int64_t)llround(sqrt((double)c->num_position_embeddings));
    if (side * side != c->num_position_embeddings)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "config.json: %s.num_position_embeddings is not a square", p);
    const json_value *act = json_get(vc, "hidden_act");
    if (!act || act->type != JSON_STRING || strcmp(act->str, "gelu_pytorch_tanh") != 0)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "config.json: %s.hidden_act must be gelu_pytorch_tanh", p);
    const json_value *ds = json_get(vc, "deepstack_visual_indexes");
    c->n_deepstack = 0;
    if (ds && ds->type == JSON_ARRAY) {
        if (ds->n > 8) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "config.json: too many deepstack indexes");
        for (size_t i = 0; i < ds->n; i++) {
            int64_t k;
            if (json_as_i64(ds->items[i], &k) != 0 || k < 0 || k >= c->depth)
                return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "config.json: bad %s.deepstack_visual_indexes", p);
            c->deepstack_visual_indexes[c->n_deepstack++] = k;
        }
    }
    c->rope_theta = 10000.0;
    const json_value *rp = json_get(vc, "rope_parameters");
    const json_value *th = rp ? json_get(rp, "rope_theta") : json_get(vc, "rope_theta");
    if (th && json_as_double(th, &c->rope_theta) != 0)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "config.json: bad %s rope_theta", p);
    const json_value *rt = rp ? json_get(rp, "rope_type") : NULL;
    if (rt && (rt->type != JSON_STRING || strcmp(rt->str, "axial") != 0))
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "config.json: %s.rope_parameters.rope_type must be axial", p);
    return 0;
}

static int audio_config(const json_value *ac, clef_audio_config *c, clef_err *err) {
    const char *p = "thinker_config.audio_config";
    if (cfg_int(ac, p, "d_model", &c->d_model, err) ||
        cfg_int(ac, p, "encoder_attention_heads", &c->encoder_attention_heads, err) ||
        cfg_int(ac, p, "encoder_layers", &c->encoder_layers, err) ||
        cfg_int(ac, p, "encoder_ffn_dim", &c->encoder_ffn_dim, err) ||
        cfg_int(ac, p, "downsample_hidden_size", &c->downsample_hidden_size, err) ||
        cfg_int(ac, p, "output_dim", &c->output_dim, err) || cfg_int(ac, p, "num_mel_bins", &c->num_mel_bins, err) ||
        cfg_int(ac, p, "n_window", &c->n_window, err) || cfg_int(ac, p, "n_window_infer", &c->n_window_infer, err) ||
        cfg_int(ac, p, "max_source_positions", &c->max_source_positions, err))
        return -1;
    if (c->num_mel_bins != CLEF_MEL_BINS || c->d_model <= 0 || c->encoder_attention_heads <= 0 ||
        c->d_model % c->encoder_attention_heads || c->d_model % 2 || c->n_window <= 0 ||
        c->n_window_infer < 2 * c->n_window)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "config.json: %s: unsupported sizes", p);
    const json_value *act = json_get(ac, "activation_function");
    if (act && (act->type != JSON_STRING || strcmp(act->str, "gelu") != 0))
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "config.json: %s.activation_function must be gelu", p);
    const json_value *se = json_get(ac, "scale_embedding");
    if (se && json_truthy(se))
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "config.json: %s.scale_embedding is not supported", p);
    return 0;
}

/* The tower configs from the checkpoint's config.json: its text when the
 * checkpoint carries it (in-memory synthetic or converted checkpoints), else
 * <dir>/config.json. */
static int load_configs(clef_towers *t, clef_err *err) {
    clef_buf b = {0};
    if (t->ck->config_json) {
        clef_buf_append(&b, t->ck->config_json, t->ck->config_json_len);
    } else if (t->ck->dir) {
        size_t len = 0;
        char *text = clef_read_text_file(t->ck->dir, "config.json", CLEF_FILE_MAX_CONFIG, &len, err);
        if (!text) return -1;
        clef_buf_append(&b, text, len);
        free(text);
    } else { /* a synthetic checkpoint drawn without towers */
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "this synthetic model has no media towers");
    }
    json_value *root = json_parse(b.data ? b.data : "", b.len, err);
    clef_buf_free(&b);
    if (!root) return -1;
    const json_value *th = json_get(root, "thinker_config");
    const json_value *vc = th ? json_get(th, "vision_config") : NULL;
    const json_value *ac = th ? json_get(th, "audio_config") : NULL;
    int rc = 0;
    t->has_vision = vc && vc->type == JSON_OBJECT;
    t->has_audio = ac && ac->type == JSON_OBJECT;
    if (t->has_vision) rc = vision_config(vc, &t->vc, err);
    if (rc == 0 && t->has_audio) rc = audio_config(ac, &t->ac, err);
    json_free(root);
    return rc;
}

/* ---- binding ------------------------------------------------------------- */

static void *own(clef_towers *t, void *p) {
    if (t->n_owned == t->cap_owned) {
        t->cap_owned = t->cap_owned ? 2 * t->cap_owned : 64;
        t->owned = clef_xrealloc(t->owned, t->cap_owned * sizeof *t->owned);
    }
    t->owned[t->n_owned++] = p;
    return p;
}

/* Matrix `name` with `ndim` dims `shape`, bound as [rows, cols] (a conv
 * kernel is its flattened row-major matrix).  A matrix whose row length is
 * not a multiple of 8 (the audio conv2d1 kernel, [C, 9]) is widened to f32
 * first: exact, and the CPU's products do not change (it multiplies f32
 * rows either way), while a device's bf16 GEMM needs rows of 8 values. */
static int bind_mat(clef_towers *t, const char *name, int ndim, const int64_t *shape, clef_weight *w, clef_err *err) {
    const st_tensor *st = clef_checkpoint_require(t->ck, name, PLAIN_DTYPES, ndim, shape, err);
    if (!st) return -1;
    int64_t cols = 1;
    for (int i = 1; i < ndim; i++) cols *= shape[i];
    clef_dtype dt = st->dtype;
    const void *data = st->data;
    if (cols % 8 && dt != CLEF_DT_F32) {
        size_t n = (size_t)(shape[0] * cols);
        float *f = clef_xmalloc((n ? n : 1) * sizeof *f);
        clef_to_f32(st->dtype, st->data, f, n);
        t->host_f32 = clef_xrealloc(t->host_f32, (t->n_host_f32 + 1) * sizeof *t->host_f32);
        t->host_f32[t->n_host_f32++] = f;
        dt = CLEF_DT_F32, data = f;
    }
    if (t->be->ops->weight_init(t->be, w, dt, shape[0], cols, data, err) != 0) return -1;
    if (t->n_weights == t->cap_weights) {
        t->cap_weights = t->cap_weights ? 2 * t->cap_weights : 128;
        t->weights = clef_xrealloc(t->weights, t->cap_weights * sizeof *t->weights);
    }
    t->weights[t->n_weights++] = w;
    return 0;
}

/* n floats of host data copied to new backend memory owned by the towers. */
static int upload_owned(clef_towers *t, const char *what, const float *host, size_t n, float **out, clef_err *err) {
    *out = t->be->ops->alloc(t->be, (n ? n : 1) * sizeof(float));
    if (!*out) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "cannot allocate backend memory for %s", what);
    own(t, *out);
    return t->be->ops->upload(t->be, *out, host, n * sizeof(float), err);
}

static int bind_vec(clef_towers *t, const char *name, int64_t n, float **out, clef_err *err) {
    const st_tensor *st = clef_checkpoint_require(t->ck, name, PLAIN_DTYPES, 1, &n, err);
    if (!st) return -1;
    float *tmp = clef_xmalloc((size_t)n * sizeof *tmp);
    clef_to_f32(st->dtype, st->data, tmp, (size_t)n);
    int rc = upload_owned(t, name, tmp, (size_t)n, out, err);
    free(tmp);
    return rc;
}

static const char *nm(char *buf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *nm(char *buf, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, TW_NAME, fmt, ap);
    va_end(ap);
    return buf;
}

/* "<prefix>.weight" [out, in] and "<prefix>.bias" [out]. */
static int bind_linear(clef_towers *t, const char *prefix, int64_t out, int64_t in, int bias, tw_linear *l,
                       clef_err *err) {
    char n[TW_NAME];
    int64_t shape[2] = {out, in};
    if (bind_mat(t, nm(n, "%s.weight", prefix), 2, shape, &l->w, err)) return -1;
    l->b = NULL;
    return bias ? bind_vec(t, nm(n, "%s.bias", prefix), out, &l->b, err) : 0;
}

static int bind_norm(clef_towers *t, const char *prefix, int64_t dim, tw_norm *nrm, clef_err *err) {
    char n[TW_NAME];
    return bind_vec(t, nm(n, "%s.weight", prefix), dim, &nrm->w, err) ||
                   bind_vec(t, nm(n, "%s.bias", prefix), dim, &nrm->b, err)
               ? -1
               : 0;
}

static int bind_merger(clef_towers *t, const char *prefix, int postshuffle, vision_merger *mg, clef_err *err) {
    char n[TW_NAME];
    int64_t D = t->vc.hidden_size, D4 = 4 * D;
    mg->postshuffle = postshuffle;
    return bind_norm(t, nm(n, "%s.ln_q", prefix), postshuffle ? D4 : D, &mg->ln, err) ||
                   bind_linear(t, nm(n, "%s.mlp.0", prefix), D4, D4, 1, &mg->fc0, err) ||
                   bind_linear(t, nm(n, "%s.mlp.2", prefix), t->vc.out_hidden_size, D4, 1, &mg->fc2, err)
               ? -1
               : 0;
}

static int bind_vision(clef_towers *t, clef_err *err) {
    const clef_vision_config *c = &t->vc;
    int64_t D = c->hidden_size;
    char n[TW_NAME];
    int64_t pshape[5] = {D, 3, CLEF_TEMPORAL_PATCH, CLEF_PATCH, CLEF_PATCH};
    if (bind_mat(t, "thinker.visual.patch_embed.proj.weight", 5, pshape, &t->patch.w, err) ||
        bind_vec(t, "thinker.visual.patch_embed.proj.bias", D, &t->patch.b, err))
        return -1;
    int64_t tshape[2] = {c->num_position_embeddings, D};
    const st_tensor *pe = clef_checkpoint_require(t->ck, "thinker.visual.pos_embed.weight", PLAIN_DTYPES, 2, tshape, err);
    if (!pe) return -1;
    size_t n_pe = (size_t)(c->num_position_embeddings * D);
    float *table = clef_xmalloc(sizeof(float) * n_pe);
    clef_to_f32(pe->dtype, pe->data, table, n_pe);
    int rc = upload_owned(t, "thinker.visual.pos_embed.weight", table, n_pe, &t->pos_table, err);
    free(table);
    if (rc) return -1;
    /* the rotary embedding's inv_freq buffer, f32 as torch builds it */
    int64_t d = D / c->num_heads, q = d / 4;
    float *inv = clef_xmalloc(sizeof(float) * (size_t)q);
    for (int64_t j = 0; j < q; j++) inv[j] = 1.0f / powf((float)c->rope_theta, (float)(2 * j) / (float)(d / 2));
    rc = upload_owned(t, "the vision RoPE frequencies", inv, (size_t)q, &t->rope_inv, err);
    free(inv);
    if (rc) return -1;
    t->blocks = clef_xcalloc((size_t)c->depth, sizeof *t->blocks);
    for (int64_t l = 0; l < c->depth; l++) {
        vision_block *b = &t->blocks[l];
        if (bind_norm(t, nm(n, "thinker.visual.blocks.%lld.norm1", (long long)l), D, &b->norm1, err) ||
            bind_norm(t, nm(n, "thinker.visual.blocks.%lld.norm2", (long long)l), D, &b->norm2, err) ||
            bind_linear(t, nm(n, "thinker.visual.blocks.%lld.attn.qkv", (long long)l), 3 * D, D, 1, &b->qkv, err) ||
            bind_linear(t, nm(n, "thinker.visual.blocks.%lld.attn.proj", (long long)l), D, D, 1, &b->proj, err) ||
            bind_linear(t, nm(n, "thinker.visual.blocks.%lld.mlp.linear_fc1", (long long)l), c->intermediate_size, D,
                        1, &b->fc1, err) ||
            bind_linear(t, nm(n, "thinker.visual.blocks.%lld.mlp.linear_fc2", (long long)l), D, c->intermediate_size,
                        1, &b->fc2, err))
            return -1;
    }
    if (bind_merger(t, "thinker.visual.merger", 0, &t->merger, err)) return -1;
    t->ds = clef_xcalloc((size_t)(c->n_deepstack ? c->n_deepstack : 1), sizeof *t->ds);
    for (int64_t k = 0; k < c->n_deepstack; k++)
        if (bind_merger(t, nm(n, "thinker.visual.merger_list.%lld", (long long)k), 1, &t->ds[k], err)) return -1;
    return 0;
}

static int bind_audio(clef_towers *t, clef_err *err) {
    const clef_audio_config *c = &t->ac;
    int64_t C = c->downsample_hidden_size, M = c->d_model;
    int64_t f3 = ((((c->num_mel_bins + 1) / 2) + 1) / 2 + 1) / 2; /* mel after three stride-2 convs */
    char n[TW_NAME];
    for (int i = 0; i < 3; i++) {
        int64_t shape[4] = {C, i == 0 ? 1 : C, 3, 3};
        if (bind_mat(t, nm(n, "thinker.audio_tower.conv2d%d.weight", i + 1), 4, shape, &t->conv[i].w, err) ||
            bind_vec(t, nm(n, "thinker.audio_tower.conv2d%d.bias", i + 1), C, &t->conv[i].b, err))
            return -1;
    }
    int64_t oshape[2] = {M, C * f3};
    if (bind_mat(t, "thinker.audio_tower.conv_out.weight", 2, oshape, &t->conv_out, err)) return -1;
    /* SinusoidsPositionEmbedding rows 0 .. c(c(c(chunk)))-1 (f32 as torch
     * builds the buffer); t restarts in every chunk, so these are all used */
    int64_t c1 = (2 * c->n_window + 1) / 2, c2 = (c1 + 1) / 2, rows = (c2 + 1) / 2;
    float *pe = clef_xmalloc(sizeof(float) * (size_t)(rows * M));
    double inc = log(10000.0) / (double)(M / 2 - 1);
    for (int64_t tt = 0; tt < rows; tt++)
        for (int64_t i = 0; i < M / 2; i++) {
            float inv = expf((float)(-inc) * (float)i);
            float a = (float)tt * inv;
            pe[tt * M + i] = sinf(a);
            pe[tt * M + M / 2 + i] = cosf(a);
        }
    int rc = upload_owned(t, "the audio sinusoid", pe, (size_t)(rows * M), &t->sinusoid, err);
    free(pe);
    if (rc) return -1;
    t->layers = clef_xcalloc((size_t)c->encoder_layers, sizeof *t->layers);
    for (int64_t l = 0; l < c->encoder_layers; l++) {
        audio_layer *a = &t->layers[l];
        const char *p = "thinker.audio_tower.layers";
        long long L = (long long)l;
        if (bind_norm(t, nm(n, "%s.%lld.self_attn_layer_norm", p, L), M, &a->ln1, err) ||
            bind_norm(t, nm(n, "%s.%lld.final_layer_norm", p, L), M, &a->ln2, err) ||
            bind_linear(t, nm(n, "%s.%lld.self_attn.q_proj", p, L), M, M, 1, &a->q, err) ||
            bind_linear(t, nm(n, "%s.%lld.self_attn.k_proj", p, L), M, M, 1, &a->k, err) ||
            bind_linear(t, nm(n, "%s.%lld.self_attn.v_proj", p, L), M, M, 1, &a->v, err) ||
            bind_linear(t, nm(n, "%s.%lld.self_attn.out_proj", p, L), M, M, 1, &a->o, err) ||
            bind_linear(t, nm(n, "%s.%lld.fc1", p, L), c->encoder_ffn_dim, M, 1, &a->fc1, err) ||
            bind_linear(t, nm(n, "%s.%lld.fc2", p, L), M, c->encoder_ffn_dim, 1, &a->fc2, err))
            return -1;
    }
    return bind_norm(t, "thinker.audio_tower.ln_post", M, &t->ln_post, err) ||
                   bind_linear(t, "thinker.audio_tower.proj1", M, M, 1, &t->proj1, err) ||
                   bind_linear(t, "thinker.audio_tower.proj2", c->output_dim, M, 1, &t->proj2, err)
               ? -1
               : 0;
}

clef_towers *clef_towers_create(const clef_checkpoint *ck, clef_backend *be, clef_err *err) {
    clef_towers *t = clef_xcalloc(1, sizeof *t);
    t->ck = ck;
    t->be = be;
    if (load_configs(t, err) || (t->has_vision && bind_vision(t, err)) || (t->has_audio && bind_audio(t, err))) {
        clef_towers_free(t);
        return NULL;
    }
    return t;
}

void clef_towers_free(clef_towers *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n_weights; i++) t->be->ops->weight_release(t->be, t->weights[i]);
    free(t->weights);
    for (size_t i = 0; i < t->n_owned; i++) t->be->ops->free(t->be, t->owned[i]);
    free(t->owned);
    for (size_t i = 0; i < t->n_host_f32; i++) free(t->host_f32[i]);
    free(t->host_f32);
    free(t->blocks);
    free(t->ds);
    free(t->layers);
    free(t);
}

const clef_vision_config *clef_towers_vision_config(const clef_towers *t) { return t->has_vision ? &t->vc : NULL; }
const clef_audio_config *clef_towers_audio_config(const clef_towers *t) { return t->has_audio ? &t->ac : NULL; }

/* ---- helpers shared by vision.c and audio.c ------------------------------ */

float *tw_alloc(clef_towers *t, size_t n, clef_err *err) {
    float *p = t->be->ops->alloc(t->be, (n ? n : 1) * sizeof(float));
    if (!p) clef_fail(err, 422, CLEF_E_CAPACITY, NULL, "too many tokens: cannot allocate %zu floats for a media tower", n);
    return p;
}

void tw_free(clef_towers *t, void *p) {
    if (p) t->be->ops->free(t->be, p);
}

int tw_linear_fwd(clef_towers *t, const tw_linear *l, const float *x, int64_t T, float *y, clef_err *err) {
    return t->be->ops->matmul(t->be, x, T, &l->w, l->b, y, err);
}

int tw_download(clef_towers *t, float *host, const float *dev, size_t n, clef_err *err) {
    return t->be->ops->download(t->be, host, dev, n * sizeof(float), err);
}

int tw_upload(clef_towers *t, float *dev, const float *host, size_t n, clef_err *err) {
    return t->be->ops->upload(t->be, dev, host, n * sizeof(float), err);
}
