/* vision.c — the Qwen3-Omni vision tower (SPEC §9 "Vision tower"): patch
 * embed, interpolated position table, 2-D RoPE, pre-LN blocks with attention
 * per temporal slice, the main merger and the deepstack mergers.
 *
 * Shapes (N patch rows, D hidden, d = D/heads, I intermediate):
 *   pixels [N, 1536] -> patch_embed -> h [N, D] -> blocks -> merger [N/4, out]
 * Rows are in the processor's patch-row order, so the 4 rows of a 2x2 merge
 * block are consecutive.
 *
 * Every per-row step runs through the backend's op table (position table by
 * mix_rows, RoPE by rope_2d, the MLP's tanh GELU by gelu_tanh), so the tower
 * runs on any backend with one upload of the pixels and the shaping data
 * (patch positions, bilinear taps: a few ints per row, computed on the host
 * as transformers computes them in Python) and one download per merger.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/towers_internal.h"
#include "util/buf.h"

#define VISION_LN_EPS 1e-6f

/* One axis of transformers' get_vision_interpolation_indices_and_weights
 * (bilinear, align_corners): src = i*(side-1)/(n-1) in f32, taps floor and
 * floor+1 (clamped), weights 1 - |src - floor - offset| (clamped at 0). */
static void interp_axis(int64_t i, int64_t n, int64_t side, int64_t tap[2], float w[2]) {
    float src = ((float)i * (float)(side - 1)) / (float)(n > 1 ? n - 1 : 1);
    float fl = floorf(src);
    for (int o = 0; o < 2; o++) {
        int64_t k = (int64_t)fl + o;
        tap[o] = k < 0 ? 0 : k > side - 1 ? side - 1 : k;
        float wt = 1.0f - fabsf((src - fl) - (float)o);
        w[o] = wt > 0.0f ? wt : 0.0f;
    }
}

/* Per-row shaping data of the vision tower for all items, rows in patch-row
 * order (t, block_row, block_col, in_row, in_col):
 *   pos [N, 2]  (row y, column x) of the patch, for the 2-D RoPE;
 *   idx [N, 4], wts [N, 4]  the bilinear (align_corners) taps of the
 *   side x side position table at (y, x) of the item's gh x gw grid:
 *   (y0,x0), (y0,x1), (y1,x0), (y1,x1) with weights wy*wx, for mix_rows. */
static void vision_shaping(const clef_towers *t, const clef_grid *grids, size_t n_items, int32_t *pos, int32_t *idx,
                           float *wts) {
    int64_t side = (int64_t)llround(sqrt((double)t->vc.num_position_embeddings));
    size_t row = 0;
    for (size_t it = 0; it < n_items; it++) {
        int64_t gt = grids[it].t, gh = grids[it].h, gw = grids[it].w;
        for (int64_t tt = 0; tt < gt; tt++)
            for (int64_t br = 0; br < gh / CLEF_MERGE; br++)
                for (int64_t bc = 0; bc < gw / CLEF_MERGE; bc++)
                    for (int ir = 0; ir < CLEF_MERGE; ir++)
                        for (int ic = 0; ic < CLEF_MERGE; ic++, row++) {
                            int64_t y = br * CLEF_MERGE + ir, x = bc * CLEF_MERGE + ic;
                            int64_t ty[2], tx[2];
                            float wy[2], wx[2];
                            interp_axis(y, gh, side, ty, wy);
                            interp_axis(x, gw, side, tx, wx);
                            pos[2 * row] = (int32_t)y, pos[2 * row + 1] = (int32_t)x;
                            int32_t *ix = idx + 4 * row;
                            float *w = wts + 4 * row;
                            ix[0] = (int32_t)(ty[0] * side + tx[0]), ix[1] = (int32_t)(ty[0] * side + tx[1]);
                            ix[2] = (int32_t)(ty[1] * side + tx[0]), ix[3] = (int32_t)(ty[1] * side + tx[1]);
                            w[0] = wy[0] * wx[0], w[1] = wy[0] * wx[1], w[2] = wy[1] * wx[0], w[3] = wy[1] * wx[1];
                        }
    }
}

/* Backend memory of one vision call (pos / idx hold int32 in float-sized slots). */
typedef struct vision_ws {
    float *x0, *h, *a, *qkv, *att, *tmp, *f1, *P, *m_in, *m_mid, *m_out, *pos, *idx, *wts;
} vision_ws;

static void vision_ws_free(clef_towers *t, vision_ws *w) {
    float **dev[] = {&w->x0, &w->h,     &w->a,     &w->qkv,   &w->att, &w->tmp, &w->f1,
                     &w->P,  &w->m_in,  &w->m_mid, &w->m_out, &w->pos, &w->idx, &w->wts};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) tw_free(t, *dev[i]);
}

/* Merger over h [N, D]: LN per patch (main) or per merge block (deepstack),
 * then Linear 4D->4D, GELU(erf), Linear 4D->out.  out: host [N/4, out]. */
static int run_merger(clef_towers *t, const vision_merger *mg, vision_ws *w, const float *h, int64_t N, float *out,
                      clef_err *err) {
    const clef_backend_ops *op = t->be->ops;
    int64_t D = t->vc.hidden_size, D4 = 4 * D, M = N / 4, O = t->vc.out_hidden_size;
    int rc = mg->postshuffle ? op->layernorm(t->be, h, mg->ln.w, mg->ln.b, w->m_in, M, D4, VISION_LN_EPS, err)
                             : op->layernorm(t->be, h, mg->ln.w, mg->ln.b, w->m_in, N, D, VISION_LN_EPS, err);
    if (rc || tw_linear_fwd(t, &mg->fc0, w->m_in, M, w->m_mid, err) || op->gelu(t->be, w->m_mid, w->m_mid, M * D4, err) ||
        tw_linear_fwd(t, &mg->fc2, w->m_mid, M, w->m_out, err))
        return -1;
    return tw_download(t, out, w->m_out, (size_t)(M * O), err);
}

/* One pre-LN block: h += proj(attn(norm1 h)); h += fc2(gelu_tanh(fc1(norm2 h))).
 * RoPE on q and k at once: they are the first 2H heads of every qkv row. */
static int run_block(clef_towers *t, const vision_block *b, vision_ws *w, int64_t N, const clef_attn_desc *ad,
                     clef_err *err) {
    const clef_backend_ops *op = t->be->ops;
    int64_t D = t->vc.hidden_size, H = t->vc.num_heads, d = D / H, I = t->vc.intermediate_size;
    return op->layernorm(t->be, w->h, b->norm1.w, b->norm1.b, w->a, N, D, VISION_LN_EPS, err) ||
                   tw_linear_fwd(t, &b->qkv, w->a, N, w->qkv, err) ||
                   op->rope_2d(t->be, w->qkv, N, 3 * D, 2 * H, d, (const int32_t *)w->pos, t->rope_inv, err) ||
                   op->attention(t->be, w->qkv, w->qkv + D, w->qkv + 2 * D, w->att, ad, err) ||
                   tw_linear_fwd(t, &b->proj, w->att, N, w->tmp, err) ||
                   op->add(t->be, w->h, w->tmp, w->h, N, D, D, err) ||
                   op->layernorm(t->be, w->h, b->norm2.w, b->norm2.b, w->a, N, D, VISION_LN_EPS, err) ||
                   tw_linear_fwd(t, &b->fc1, w->a, N, w->f1, err) || op->gelu_tanh(t->be, w->f1, w->f1, N * I, err) ||
                   tw_linear_fwd(t, &b->fc2, w->f1, N, w->tmp, err) || op->add(t->be, w->h, w->tmp, w->h, N, D, D, err)
               ? -1
               : 0;
}

int clef_vision_forward(clef_towers *t, const float *pixels, size_t rows, const clef_grid *grids, size_t n_items,
                        float *out, float *deepstack, clef_err *err) {
    if (!t->has_vision) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "the checkpoint has no vision tower");
    const clef_vision_config *c = &t->vc;
    int64_t D = c->hidden_size, H = c->num_heads, d = D / H, I = c->intermediate_size, N = (int64_t)rows;
    int64_t n_seg = 0, total = 0;
    for (size_t i = 0; i < n_items; i++) {
        if (grids[i].t <= 0 || grids[i].h <= 0 || grids[i].w <= 0 || grids[i].h % CLEF_MERGE || grids[i].w % CLEF_MERGE)
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "vision tower: bad grid");
        n_seg += grids[i].t;
        total += (int64_t)grids[i].t * grids[i].h * grids[i].w;
    }
    if (total != N || N == 0) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "vision tower: grids do not cover the rows");
    /* attention segments: one per temporal slice of each item */
    int64_t *off = clef_xmalloc(sizeof(int64_t) * (size_t)(n_seg + 1));
    off[0] = 0;
    for (size_t i = 0, s = 0; i < n_items; i++)
        for (int32_t tt = 0; tt < grids[i].t; tt++, s++) off[s + 1] = off[s] + (int64_t)grids[i].h * grids[i].w;
    clef_attn_desc ad = {n_seg, off, off, H, H, d, 3 * D, 3 * D, 3 * D, D, 1.0f / sqrtf((float)d), 0};

    int32_t *pos = clef_xmalloc(sizeof(int32_t) * (size_t)(2 * N)), *idx = clef_xmalloc(sizeof(int32_t) * (size_t)(4 * N));
    float *wts = clef_xmalloc(sizeof(float) * (size_t)(4 * N));
    vision_shaping(t, grids, n_items, pos, idx, wts);

    const clef_backend_ops *op = t->be->ops;
    vision_ws w = {0};
    int rc = -1;
    if ((w.x0 = tw_alloc(t, (size_t)(N * CLEF_PATCH_DIM), err)) && (w.h = tw_alloc(t, (size_t)(N * D), err)) &&
        (w.a = tw_alloc(t, (size_t)(N * D), err)) && (w.qkv = tw_alloc(t, (size_t)(N * 3 * D), err)) &&
        (w.att = tw_alloc(t, (size_t)(N * D), err)) && (w.tmp = tw_alloc(t, (size_t)(N * D), err)) &&
        (w.f1 = tw_alloc(t, (size_t)(N * I), err)) && (w.P = tw_alloc(t, (size_t)(N * D), err)) &&
        (w.m_in = tw_alloc(t, (size_t)(N * D), err)) && (w.m_mid = tw_alloc(t, (size_t)(N * D), err)) &&
        (w.m_out = tw_alloc(t, (size_t)(N / 4 * c->out_hidden_size), err)) &&
        (w.pos = tw_alloc(t, (size_t)(2 * N), err)) && (w.idx = tw_alloc(t, (size_t)(4 * N), err)) &&
        (w.wts = tw_alloc(t, (size_t)(4 * N), err))) {
        /* the pixels and the shaping data in one upload each; everything after runs on the backend */
        rc = tw_upload(t, w.x0, pixels, (size_t)(N * CLEF_PATCH_DIM), err) ||
             op->upload(t->be, w.pos, pos, sizeof(int32_t) * (size_t)(2 * N), err) ||
             op->upload(t->be, w.idx, idx, sizeof(int32_t) * (size_t)(4 * N), err) ||
             tw_upload(t, w.wts, wts, (size_t)(4 * N), err) || tw_linear_fwd(t, &t->patch, w.x0, N, w.h, err) ||
             op->mix_rows(t->be, t->pos_table, D, (const int32_t *)w.idx, w.wts, N, w.P, err) ||
             op->add(t->be, w.h, w.P, w.h, N, D, D, err);
        for (int64_t l = 0; rc == 0 && l < c->depth; l++) {
            rc = run_block(t, &t->blocks[l], &w, N, &ad, err);
            for (int64_t k = 0; rc == 0 && deepstack && k < c->n_deepstack; k++)
                if (c->deepstack_visual_indexes[k] == l)
                    rc = run_merger(t, &t->ds[k], &w, w.h, N, deepstack + (size_t)k * (size_t)(N / 4 * c->out_hidden_size),
                                    err);
        }
        if (rc == 0) rc = run_merger(t, &t->merger, &w, w.h, N, out, err);
    }
    vision_ws_free(t, &w);
    free(pos);
    free(idx);
    free(wts);
    free(off);
    return rc ? -1 : 0;
}
