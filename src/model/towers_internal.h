/* towers_internal.h — bound tower weights and helpers shared by towers.c
 * (config, binding), vision.c and audio.c. */
#ifndef CLEF_MODEL_TOWERS_INTERNAL_H
#define CLEF_MODEL_TOWERS_INTERNAL_H

#include "model/towers.h"

/* Linear layer: W [out, in] on the backend, bias [out] f32 backend memory (or NULL). */
typedef struct tw_linear {
    clef_weight w;
    float *b;
} tw_linear;

typedef struct tw_norm {
    float *w, *b; /* [dim] f32 backend memory */
} tw_norm;

typedef struct vision_block {
    tw_norm norm1, norm2;
    tw_linear qkv, proj, fc1, fc2;
} vision_block;

/* PatchMerger: ln_q over D (main) or 4D (post-shuffle, deepstack), then
 * Linear 4D -> 4D, GELU(erf), Linear 4D -> out_hidden. */
typedef struct vision_merger {
    tw_norm ln;
    tw_linear fc0, fc2;
    int postshuffle;
} vision_merger;

typedef struct audio_layer {
    tw_norm ln1, ln2; /* self_attn_layer_norm, final_layer_norm */
    tw_linear q, k, v, o, fc1, fc2;
} audio_layer;

struct clef_towers {
    const clef_checkpoint *ck;
    clef_backend *be;
    int has_vision, has_audio;
    clef_vision_config vc;
    clef_audio_config ac;
    /* vision */
    tw_linear patch;        /* [D, 3*2*16*16] (Conv3d flattened in (C, t, y, x) order) */
    float *pos_table;       /* backend [num_position_embeddings, D] f32 */
    float *rope_inv;        /* backend [d/4] f32: 1/theta^(2j/(d/2)) (the rotary embedding's inv_freq) */
    vision_block *blocks;   /* [depth] */
    vision_merger merger;
    vision_merger *ds;      /* [n_deepstack] */
    /* audio */
    tw_linear conv[3];      /* [C, in*9] (Conv2d flattened in (c_in, ky, kx) order) */
    float *sinusoid;        /* backend [c(c(c(2*n_window))), d_model] f32: the positional sinusoid rows */
    clef_weight conv_out;   /* [d_model, C * (mel/8)] */
    audio_layer *layers;    /* [encoder_layers] */
    tw_norm ln_post;
    tw_linear proj1, proj2;
    /* backend memory and weights to release */
    void **owned;
    size_t n_owned, cap_owned;
    clef_weight **weights;
    size_t n_weights, cap_weights;
    float **host_f32;       /* f32 copies of narrow matrices bound as F32 (see bind_mat), freed last */
    size_t n_host_f32;
};

/* Backend scratch of `n` floats (NULL + 422 err when it cannot be had). */
float *tw_alloc(clef_towers *t, size_t n, clef_err *err);
void tw_free(clef_towers *t, void *p);
/* y[T, out] = x[T, in] . W^T + b */
int tw_linear_fwd(clef_towers *t, const tw_linear *l, const float *x, int64_t T, float *y, clef_err *err);
/* Host <-> backend copies of a call's inputs (pixels, log-mel chunks) and
 * outputs (merger / projection rows); every step between runs on the backend. */
int tw_download(clef_towers *t, float *host, const float *dev, size_t n, clef_err *err);
int tw_upload(clef_towers *t, float *dev, const float *host, size_t n, clef_err *err);

#endif
