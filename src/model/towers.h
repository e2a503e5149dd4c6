/* towers.h — the Qwen3-Omni vision tower (with deepstack mergers) and audio
 * tower of the thinker (SPEC.md §9 "Vision tower", "Audio" tower), bound by
 * tensor name from the checkpoint and run on a backend's op table, in f32 as
 * the fp32 reference.
 *
 * Inputs are the processor tensors of media/media.h; outputs are host f32
 * rows that replace the thinker's media pad embeddings (and, for deepstack,
 * are added after decoder layers 0..n_deepstack-1).
 */
#ifndef CLEF_MODEL_TOWERS_H
#define CLEF_MODEL_TOWERS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "io/checkpoint.h"
#include "media/media.h"
#include "model/model.h"
#include "util/err.h"

/* thinker_config.vision_config */
typedef struct clef_vision_config {
    int64_t depth, hidden_size, num_heads, intermediate_size, out_hidden_size;
    int64_t num_position_embeddings, patch_size, temporal_patch_size, spatial_merge_size, in_channels;
    int64_t n_deepstack;
    int64_t deepstack_visual_indexes[8];
    double rope_theta; /* rope_parameters.rope_theta (10000) */
} clef_vision_config;

/* thinker_config.audio_config */
typedef struct clef_audio_config {
    int64_t d_model, encoder_attention_heads, encoder_layers, encoder_ffn_dim;
    int64_t downsample_hidden_size, output_dim, num_mel_bins, n_window, n_window_infer, max_source_positions;
} clef_audio_config;

typedef struct clef_towers clef_towers;

/* Read the tower configs from `<ck->dir>/config.json` and bind
 * thinker.visual.* and thinker.audio_tower.* on `be` (borrowed; must outlive
 * the towers).  Unsupported settings (hidden_act other than
 * gelu_pytorch_tanh, rope_type other than axial, scale_embedding) and missing
 * or mis-shaped tensors are errors (500) naming the key or tensor.  Returns
 * NULL + err. */
clef_towers *clef_towers_create(const clef_checkpoint *ck, clef_backend *be, clef_err *err);
void clef_towers_free(clef_towers *t);

const clef_vision_config *clef_towers_vision_config(const clef_towers *t);
const clef_audio_config *clef_towers_audio_config(const clef_towers *t);

/* One vision-tower call over all images (or all videos) of a request.
 *   pixels:    host [rows, 3*temporal*patch*patch] f32 patch rows (media.h order)
 *   grids:     [n_items] patch grids, rows = sum t*h*w
 *   out:       host [rows/4, out_hidden_size] main merger output (items in order)
 *   deepstack: host [n_deepstack][rows/4, out_hidden_size], or NULL
 * Returns 0 or -1 + err (422 "too many tokens" when activations cannot be allocated). */
int clef_vision_forward(clef_towers *t, const float *pixels, size_t rows, const clef_grid *grids, size_t n_items,
                        float *out, float *deepstack, clef_err *err);

/* One audio-tower call over all clips of a request.
 *   features:     host [n_clips, num_mel_bins, n_frames] log-mel (media.h)
 *   feature_lens: [n_clips] frames m of each clip (<= n_frames)
 *   out:          host [sum f(m_i), output_dim]
 * Returns 0 or -1 + err. */
int clef_audio_forward(clef_towers *t, const float *features, size_t n_clips, size_t n_frames,
                       const int32_t *feature_lens, float *out, clef_err *err);

/* The thinker's media rows of one record (model.h clef_thinker_media),
 * owning its arrays; `view` points into them. */
typedef struct clef_media_embeds {
    clef_thinker_media view;
    size_t *rows, *ds_rows;
    float *embeds, *deepstack;
} clef_media_embeds;

/* Run the towers on a record's preprocessed media (clef_media_preprocess
 * done) and lay their rows out by pad token: scanning ids[0..n), the k-th
 * image/video/audio pad takes the k-th row of the image call / video call /
 * audio call (SPEC §9 "Into the thinker"); deepstack rows go to the image
 * and video pads.  Row indices are offset by `row0` (the record's first row
 * in a packed forward).  pad ids: thinker_config image/video/audio_token_id.
 * Errors: 500 when the pads do not match the tower rows or a tower's output
 * width differs from the thinker's hidden size `H`; the towers' own errors. */
int clef_towers_embed(clef_towers *t, const clef_media *m, const int32_t *ids, size_t n, size_t row0,
                      int32_t image_pad, int32_t video_pad, int32_t audio_pad, int64_t H, clef_media_embeds *out,
                      clef_err *err);
void clef_media_embeds_free(clef_media_embeds *e);

#endif
