/* media_embed.c — tower outputs laid out as the thinker's media rows
 * (SPEC §9 "Into the thinker": masked_scatter of the image, video and audio
 * features at their pad tokens; deepstack sets at the image and video pads). */
#include <stdlib.h>
#include <string.h>

#include "model/towers.h"
#include "util/buf.h"

void clef_media_embeds_free(clef_media_embeds *e) {
    if (!e) return;
    free(e->rows);
    free(e->ds_rows);
    free(e->embeds);
    free(e->deepstack);
    memset(e, 0, sizeof *e);
}

/* Tower outputs of one request: image call, video call, audio call. */
typedef struct tower_out {
    float *img, *img_ds, *vid, *vid_ds, *aud;
    size_t n_img, n_vid, n_aud; /* rows (LLM tokens) of each */
} tower_out;

static void tower_out_free(tower_out *o) {
    free(o->img);
    free(o->img_ds);
    free(o->vid);
    free(o->vid_ds);
    free(o->aud);
}

static int run_towers(clef_towers *t, const clef_media *m, int64_t H, tower_out *o, clef_err *err) {
    const clef_vision_config *vc = clef_towers_vision_config(t);
    const clef_audio_config *ac = clef_towers_audio_config(t);
    if ((m->n_images || m->n_videos) && !vc)
        return clef_fail(err, 422, CLEF_E_REQUEST, m->n_images ? "images" : "videos",
                         "%s: this model has no vision tower", m->n_images ? "images" : "videos");
    if (m->n_clips && !ac) return clef_fail(err, 422, CLEF_E_REQUEST, "audio", "audio: this model has no audio tower");
    if ((vc && vc->out_hidden_size != H) || (ac && ac->output_dim != H))
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "tower output width differs from the thinker's hidden size");
    size_t nds = vc ? (size_t)vc->n_deepstack : 0;
    if (m->n_images) {
        o->n_img = m->image_rows / 4;
        o->img = clef_xmalloc(sizeof(float) * o->n_img * (size_t)H);
        o->img_ds = clef_xmalloc(sizeof(float) * (nds ? nds : 1) * o->n_img * (size_t)H);
        if (clef_vision_forward(t, m->pixel_values, m->image_rows, m->image_grids, m->n_images, o->img, o->img_ds, err))
            return -1;
    }
    if (m->n_videos) {
        o->n_vid = m->video_rows / 4;
        o->vid = clef_xmalloc(sizeof(float) * o->n_vid * (size_t)H);
        o->vid_ds = clef_xmalloc(sizeof(float) * (nds ? nds : 1) * o->n_vid * (size_t)H);
        if (clef_vision_forward(t, m->pixel_values_videos, m->video_rows, m->video_grids, m->n_videos, o->vid,
                                o->vid_ds, err))
            return -1;
    }
    if (m->n_clips) {
        for (size_t c = 0; c < m->n_clips; c++) o->n_aud += (size_t)m->audio_tokens[c];
        o->aud = clef_xmalloc(sizeof(float) * o->n_aud * (size_t)H);
        if (clef_audio_forward(t, m->input_features, m->n_clips, m->n_frames, m->feature_lens, o->aud, err)) return -1;
    }
    return 0;
}

int clef_towers_embed(clef_towers *t, const clef_media *m, const int32_t *ids, size_t n, size_t row0,
                      int32_t image_pad, int32_t video_pad, int32_t audio_pad, int64_t H, clef_media_embeds *out,
                      clef_err *err) {
    memset(out, 0, sizeof *out);
    tower_out o = {0};
    if (run_towers(t, m, H, &o, err)) {
        tower_out_free(&o);
        return -1;
    }
    const clef_vision_config *vc = clef_towers_vision_config(t);
    size_t nds = vc && (m->n_images || m->n_videos) ? (size_t)vc->n_deepstack : 0, h = (size_t)H;
    size_t n_rows = o.n_img + o.n_vid + o.n_aud, n_vis = o.n_img + o.n_vid;
    out->rows = clef_xmalloc(sizeof(size_t) * (n_rows ? n_rows : 1));
    out->embeds = clef_xmalloc(sizeof(float) * (n_rows ? n_rows : 1) * h);
    out->ds_rows = clef_xmalloc(sizeof(size_t) * (n_vis ? n_vis : 1));
    out->deepstack = clef_xmalloc(sizeof(float) * (nds ? nds : 1) * (n_vis ? n_vis : 1) * h);
    size_t ii = 0, vi = 0, ai = 0, r = 0, d = 0;
    int extra = 0; /* a pad beyond the tower rows */
    for (size_t i = 0; i < n && !extra; i++) {
        const float *src = NULL, *ds = NULL;
        size_t ds_n = 0, ds_i = 0;
        if (ids[i] == image_pad) {
            if (ii >= o.n_img) { extra = 1; break; }
            src = o.img + ii * h, ds = o.img_ds, ds_n = o.n_img, ds_i = ii++;
        } else if (ids[i] == video_pad) {
            if (vi >= o.n_vid) { extra = 1; break; }
            src = o.vid + vi * h, ds = o.vid_ds, ds_n = o.n_vid, ds_i = vi++;
        } else if (ids[i] == audio_pad) {
            if (ai >= o.n_aud) { extra = 1; break; }
            src = o.aud + ai * h, ai++;
        } else {
            continue;
        }
        out->rows[r] = row0 + i;
        memcpy(out->embeds + r * h, src, sizeof(float) * h);
        r++;
        if (ds) {
            out->ds_rows[d] = row0 + i;
            for (size_t k = 0; k < nds; k++)
                memcpy(out->deepstack + (k * n_vis + d) * h, ds + (k * ds_n + ds_i) * h, sizeof(float) * h);
            d++;
        }
    }
    tower_out_free(&o);
    if (extra || r != n_rows || d != n_vis) {
        clef_media_embeds_free(out);
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                         "media pads in the record (%zu) do not match the tower rows (%zu)", r, n_rows);
    }
    out->view = (clef_thinker_media){n_rows, out->rows, out->embeds, n_vis, out->ds_rows, nds, out->deepstack};
    return 0;
}
