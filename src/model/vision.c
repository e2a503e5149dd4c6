/* vision.c — the Qwen3-Omni vision tower (SPEC §9 "Vision tower"): patch
 * embed, interpolated position table, 2-D RoPE, pre-LN blocks with attention
 * per temporal slice, the main merger and the deepstack mergers.
 *
 * Shapes (N patch rows, D hidden, d = D/heads, I intermediate):
 *   pixels [N, 1536] -> patch_embed -> h [N, D] -> blocks -> merger [N/4, out]
 * Rows are in the processor's patch-row order, so the 4 rows of a 2x2 merge
 * block are consecutive.
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

/* Bilinear (align_corners) resample of the side x side position table to a
 * gh x gw grid: out [gh*gw, D] in raster order; the four taps
 * (y0,x0), (y0,x1), (y1,x0), (y1,x1) summed in that order. */
static void interp_pos(const float *table, int64_t side, int64_t D, int64_t gh, int64_t gw, float *out) {
    for (int64_t r = 0; r < gh; r++) {
        int64_t ty[2], tx[2];
        float wy[2], wx[2];
        interp_axis(r, gh, side, ty, wy);
        for (int64_t c = 0; c < gw; c++) {
            interp_axis(c, gw, side, tx, wx);
            const float *t00 = table + (ty[0] * side + tx[0]) * D, *t01 = table + (ty[0] * side + tx[1]) * D;
            const float *t10 = table + (ty[1] * side + tx[0]) * D, *t11 = table + (ty[1] * side + tx[1]) * D;
            float w00 = wy[0] * wx[0], w01 = wy[0] * wx[1], w10 = wy[1] * wx[0], w11 = wy[1] * wx[1];
            float *o = out + (r * gw + c) * D;
            for (int64_t k = 0; k < D; k++) o[k] = t00[k] * w00 + t01[k] * w01 + t10[k] * w10 + t11[k] * w11;
        }
    }
}

/* Per-row position embedding P [N, D] and RoPE cos/sin [N, d] for all items,
 * rows in patch-row order (t, block_row, block_col, in_row, in_col). */
static void vision_tables(const clef_towers *t, const clef_grid *grids, size_t n_items, float *P, float *cosb,
                          float *sinb) {
    const clef_vision_config *c = &t->vc;
    int64_t D = c->hidden_size, d = D / c->num_heads, q = d / 4;
    int64_t side = (int64_t)llround(sqrt((double)c->num_position_embeddings));
    float inv[64];
    for (int64_t j = 0; j < q && j < 64; j++)
        inv[j] = 1.0f / powf((float)c->rope_theta, (float)(2 * j) / (float)(d / 2));
    size_t row = 0;
    for (size_t it = 0; it < n_items; it++) {
        int64_t gt = grids[it].t, gh = grids[it].h, gw = grids[it].w;
        float *grid = clef_xmalloc(sizeof(float) * (size_t)(gh * gw * D));
        interp_pos(t->pos_table, side, D, gh, gw, grid);
        for (int64_t tt = 0; tt < gt; tt++)
            for (int64_t br = 0; br < gh / CLEF_MERGE; br++)
                for (int64_t bc = 0; bc < gw / CLEF_MERGE; bc++)
                    for (int ir = 0; ir < CLEF_MERGE; ir++)
                        for (int ic = 0; ic < CLEF_MERGE; ic++, row++) {
                            int64_t y = br * CLEF_MERGE + ir, x = bc * CLEF_MERGE + ic;
                            memcpy(P + row * D, grid + (y * gw + x) * D, sizeof(float) * (size_t)D);
                            float *cr = cosb + row * d, *sr = sinb + row * d;
                            for (int64_t j = 0; j < q; j++) {
                                float ay = (float)y * inv[j], ax = (float)x * inv[j];
                                cr[j] = cosf(ay), sr[j] = sinf(ay);
                                cr[q + j] = cosf(ax), sr[q + j] = sinf(ax);
                            }
                            memcpy(cr + 2 * q, cr, sizeof(float) * (size_t)(2 * q));
                            memcpy(sr + 2 * q, sr, sizeof(float) * (size_t)(2 * q));
                        }
        free(grid);
    }
}

/* x*cos + rotate_half(x)*sin on `heads` heads of d floats per row, rows at
 * x + r*stride. */
static void rope_rows(float *x, int64_t N, int64_t stride, int64_t heads, int64_t d, const float *cosb,
                      const float *sinb) {
    int64_t h2 = d / 2;
    for (int64_t r = 0; r < N; r++)
        for (int64_t hd = 0; hd < heads; hd++) {
            float *v = x + r * stride + hd * d;
            const float *cr = cosb + r * d, *sr = sinb + r * d;
            for (int64_t i = 0; i < h2; i++) {
                float a = v[i], b = v[i + h2];
                v[i] = a * cr[i] + (-b) * sr[i];
                v[i + h2] = b * cr[i + h2] + a * sr[i + h2];
            }
        }
}

/* gelu(approximate="tanh") as torch computes it in f32. */
static void gelu_tanh(float *x, size_t n) {
    const float beta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
    for (size_t i = 0; i < n; i++) {
        float v = x[i], cube = v * v * v;
        x[i] = 0.5f * v * (1.0f + tanhf(beta * (v + kappa * cube)));
    }
}

typedef struct vision_ws {
    float *x0, *h, *a, *qkv, *att, *tmp, *f1, *P, *m_in, *m_mid, *m_out;
    float *host; /* [N * max(3D, I)] */
} vision_ws;

static void vision_ws_free(clef_towers *t, vision_ws *w) {
    float **dev[] = {&w->x0, &w->h, &w->a, &w->qkv, &w->att, &w->tmp, &w->f1, &w->P, &w->m_in, &w->m_mid, &w->m_out};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) tw_free(t, *dev[i]);
    free(w->host);
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

/* One pre-LN block: h += proj(attn(norm1 h)); h += fc2(gelu_tanh(fc1(norm2 h))). */
static int run_block(clef_towers *t, const vision_block *b, vision_ws *w, int64_t N, const clef_attn_desc *ad,
                     const float *cosb, const float *sinb, clef_err *err) {
    const clef_backend_ops *op = t->be->ops;
    int64_t D = t->vc.hidden_size, H = t->vc.num_heads, d = D / H, I = t->vc.intermediate_size;
    if (op->layernorm(t->be, w->h, b->norm1.w, b->norm1.b, w->a, N, D, VISION_LN_EPS, err) ||
        tw_linear_fwd(t, &b->qkv, w->a, N, w->qkv, err) || tw_download(t, w->host, w->qkv, (size_t)(N * 3 * D), err))
        return -1;
    rope_rows(w->host, N, 3 * D, H, d, cosb, sinb);     /* q */
    rope_rows(w->host + D, N, 3 * D, H, d, cosb, sinb); /* k */
    if (tw_upload(t, w->qkv, w->host, (size_t)(N * 3 * D), err) ||
        op->attention(t->be, w->qkv, w->qkv + D, w->qkv + 2 * D, w->att, ad, err) ||
        tw_linear_fwd(t, &b->proj, w->att, N, w->tmp, err) || op->add(t->be, w->h, w->tmp, w->h, N, D, D, err) ||
        op->layernorm(t->be, w->h, b->norm2.w, b->norm2.b, w->a, N, D, VISION_LN_EPS, err) ||
        tw_linear_fwd(t, &b->fc1, w->a, N, w->f1, err) || tw_download(t, w->host, w->f1, (size_t)(N * I), err))
        return -1;
    gelu_tanh(w->host, (size_t)(N * I));
    return tw_upload(t, w->f1, w->host, (size_t)(N * I), err) || tw_linear_fwd(t, &b->fc2, w->f1, N, w->tmp, err) ||
                   op->add(t->be, w->h, w->tmp, w->h, N, D, D, err)
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

    float *P = clef_xmalloc(sizeof(float) * (size_t)(N * D));
    float *cosb = clef_xmalloc(sizeof(float) * (size_t)(N * d)), *sinb = clef_xmalloc(sizeof(float) * (size_t)(N * d));
    vision_tables(t, grids, n_items, P, cosb, sinb);

    vision_ws w = {0};
    int64_t wide = 3 * D > I ? 3 * D : I;
    w.host = clef_xmalloc(sizeof(float) * (size_t)(N * wide));
    int rc = -1;
    if ((w.x0 = tw_alloc(t, (size_t)(N * CLEF_PATCH_DIM), err)) && (w.h = tw_alloc(t, (size_t)(N * D), err)) &&
        (w.a = tw_alloc(t, (size_t)(N * D), err)) && (w.qkv = tw_alloc(t, (size_t)(N * 3 * D), err)) &&
        (w.att = tw_alloc(t, (size_t)(N * D), err)) && (w.tmp = tw_alloc(t, (size_t)(N * D), err)) &&
        (w.f1 = tw_alloc(t, (size_t)(N * I), err)) && (w.P = tw_alloc(t, (size_t)(N * D), err)) &&
        (w.m_in = tw_alloc(t, (size_t)(N * D), err)) && (w.m_mid = tw_alloc(t, (size_t)(N * D), err)) &&
        (w.m_out = tw_alloc(t, (size_t)(N / 4 * c->out_hidden_size), err))) {
        rc = tw_upload(t, w.x0, pixels, (size_t)(N * CLEF_PATCH_DIM), err) ||
             tw_linear_fwd(t, &t->patch, w.x0, N, w.h, err) || tw_upload(t, w.P, P, (size_t)(N * D), err) ||
             t->be->ops->add(t->be, w.h, w.P, w.h, N, D, D, err);
        for (int64_t l = 0; rc == 0 && l < c->depth; l++) {
            rc = run_block(t, &t->blocks[l], &w, N, &ad, cosb, sinb, err);
            for (int64_t k = 0; rc == 0 && deepstack && k < c->n_deepstack; k++)
                if (c->deepstack_visual_indexes[k] == l)
                    rc = run_merger(t, &t->ds[k], &w, w.h, N, deepstack + (size_t)k * (size_t)(N / 4 * c->out_hidden_size),
                                    err);
        }
        if (rc == 0) rc = run_merger(t, &t->merger, &w, w.h, N, out, err);
    }
    vision_ws_free(t, &w);
    free(P);
    free(cosb);
    free(sinb);
    free(off);
    return rc ? -1 : 0;
}
