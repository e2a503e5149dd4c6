/* audio.c — the Qwen3-Omni audio tower (SPEC §9 "Audio", tower steps 1-9):
 * 100-frame chunks padded to the longest chunk, three 3x3 stride-2 Conv2d +
 * GELU, conv_out, a sinusoid restarting per chunk, the valid rows of each
 * chunk, windowed bidirectional attention per clip, ln_post, proj1, GELU,
 * proj2.
 *
 * The convolutions run as im2col on the host followed by the backend's
 * matmul with the Conv2d kernel viewed as [C_out, C_in*9]; one chunk at a
 * time bounds the im2col memory (the reference convolves all chunks padded
 * to the same length, which is what each chunk sees here too).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/towers_internal.h"
#include "util/buf.h"

#define AUDIO_LN_EPS 1e-5f

static int64_t conv_len(int64_t x) { return (x + 1) / 2; } /* ceil(x/2): 3x3, stride 2, padding 1 */

/* Audio tokens of m frames (media/melspec.h's f(m), for any n_window). */
static int64_t after_cnn(int64_t m, int64_t chunk) {
    return (m / chunk) * conv_len(conv_len(conv_len(chunk))) + conv_len(conv_len(conv_len(m % chunk)));
}

/* Columns of a 3x3/stride-2/pad-1 convolution: in [Fi][Ti][Ci] (host) ->
 * cols [(Fo*To), Ci*9] with index ci*9 + ky*3 + kx (the kernel's layout). */
static void im2col(const float *in, int64_t Fi, int64_t Ti, int64_t Ci, float *cols) {
    int64_t Fo = conv_len(Fi), To = conv_len(Ti);
    for (int64_t fo = 0; fo < Fo; fo++)
        for (int64_t to = 0; to < To; to++) {
            float *row = cols + (fo * To + to) * Ci * 9;
            for (int ky = 0; ky < 3; ky++)
                for (int kx = 0; kx < 3; kx++) {
                    int64_t fi = 2 * fo - 1 + ky, ti = 2 * to - 1 + kx;
                    int inside = fi >= 0 && fi < Fi && ti >= 0 && ti < Ti;
                    for (int64_t ci = 0; ci < Ci; ci++)
                        row[ci * 9 + ky * 3 + kx] = inside ? in[(fi * Ti + ti) * Ci + ci] : 0.0f;
                }
        }
}

/* SinusoidsPositionEmbedding row t (f32 as torch builds it). */
static void sinusoid_row(int64_t t, int64_t C, float *out) {
    double inc = log(10000.0) / (double)(C / 2 - 1);
    for (int64_t i = 0; i < C / 2; i++) {
        float inv = expf((float)(-inc) * (float)i);
        float a = (float)t * inv;
        out[i] = sinf(a);
        out[C / 2 + i] = cosf(a);
    }
}

/* Convolutions, conv_out and sinusoid of one chunk padded to T frames:
 * chunk [mel][T] host -> rows [c3(T), d_model] host. */
static int chunk_embed(clef_towers *t, const float *chunk, int64_t T, float *rows, clef_err *err) {
    const clef_audio_config *c = &t->ac;
    const clef_backend_ops *op = t->be->ops;
    int64_t C = c->downsample_hidden_size, M = c->d_model;
    int64_t F[4] = {c->num_mel_bins, 0, 0, 0}, Ts[4] = {T, 0, 0, 0}, Ci[3] = {1, C, C};
    for (int i = 1; i < 4; i++) F[i] = conv_len(F[i - 1]), Ts[i] = conv_len(Ts[i - 1]);
    size_t big = (size_t)(F[1] * Ts[1] * C * 9 > F[1] * Ts[1] * C ? F[1] * Ts[1] * C * 9 : F[1] * Ts[1] * C);
    float *act = clef_xmalloc(sizeof(float) * (size_t)(F[0] * Ts[0] * (C > 1 ? C : 1)));
    float *cols = clef_xmalloc(sizeof(float) * big);
    size_t out_n = (size_t)(F[1] * Ts[1] * C > Ts[3] * M ? F[1] * Ts[1] * C : Ts[3] * M);
    float *dcols = tw_alloc(t, big, err), *dout = dcols ? tw_alloc(t, out_n, err) : NULL;
    int rc = dout ? 0 : -1;
    memcpy(act, chunk, sizeof(float) * (size_t)(F[0] * T)); /* [mel][T][1] */
    for (int l = 0; l < 3 && rc == 0; l++) {
        int64_t n = F[l + 1] * Ts[l + 1];
        im2col(act, F[l], Ts[l], Ci[l], cols);
        rc = tw_upload(t, dcols, cols, (size_t)(n * Ci[l] * 9), err) ||
             tw_linear_fwd(t, &t->conv[l], dcols, n, dout, err) || op->gelu(t->be, dout, dout, n * C, err) ||
             tw_download(t, act, dout, (size_t)(n * C), err);
    }
    /* conv_out input per time step: feature c*F3 + f of act[f][t][c] */
    int64_t F3 = F[3], T3 = Ts[3];
    for (int64_t tt = 0; rc == 0 && tt < T3; tt++)
        for (int64_t ch = 0; ch < C; ch++)
            for (int64_t f = 0; f < F3; f++) cols[(tt * C + ch) * F3 + f] = act[(f * T3 + tt) * C + ch];
    if (rc == 0)
        rc = tw_upload(t, dcols, cols, (size_t)(T3 * C * F3), err) ||
             op->matmul(t->be, dcols, T3, &t->conv_out, NULL, dout, err) ||
             tw_download(t, rows, dout, (size_t)(T3 * M), err);
    float *pe = clef_xmalloc(sizeof(float) * (size_t)M);
    for (int64_t tt = 0; rc == 0 && tt < T3; tt++) {
        sinusoid_row(tt, M, pe);
        for (int64_t k = 0; k < M; k++) rows[tt * M + k] += pe[k];
    }
    free(pe);
    tw_free(t, dcols);
    tw_free(t, dout);
    free(act);
    free(cols);
    return rc ? -1 : 0;
}

/* One pre-LN encoder layer over x [N, M] with attention segments `ad`. */
static int audio_layer_fwd(clef_towers *t, const audio_layer *L, float *x, int64_t N, const clef_attn_desc *ad,
                           float *a, float *q, float *k, float *v, float *att, float *f1, clef_err *err) {
    const clef_backend_ops *op = t->be->ops;
    int64_t M = t->ac.d_model, Fd = t->ac.encoder_ffn_dim;
    return op->layernorm(t->be, x, L->ln1.w, L->ln1.b, a, N, M, AUDIO_LN_EPS, err) ||
                   tw_linear_fwd(t, &L->q, a, N, q, err) || tw_linear_fwd(t, &L->k, a, N, k, err) ||
                   tw_linear_fwd(t, &L->v, a, N, v, err) || op->attention(t->be, q, k, v, att, ad, err) ||
                   tw_linear_fwd(t, &L->o, att, N, a, err) || op->add(t->be, x, a, x, N, M, M, err) ||
                   op->layernorm(t->be, x, L->ln2.w, L->ln2.b, a, N, M, AUDIO_LN_EPS, err) ||
                   tw_linear_fwd(t, &L->fc1, a, N, f1, err) || op->gelu(t->be, f1, f1, N * Fd, err) ||
                   tw_linear_fwd(t, &L->fc2, f1, N, a, err) || op->add(t->be, x, a, x, N, M, M, err)
               ? -1
               : 0;
}

/* Chunk lengths of every clip: 2*n_window frames, the last the remainder. */
static int64_t *chunk_lengths(const int32_t *lens, size_t n_clips, int64_t chunk, int64_t *n_chunks) {
    int64_t n = 0;
    for (size_t i = 0; i < n_clips; i++) n += (lens[i] + chunk - 1) / chunk;
    int64_t *cl = clef_xmalloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    int64_t k = 0;
    for (size_t i = 0; i < n_clips; i++)
        for (int64_t s = 0; s < lens[i]; s += chunk) cl[k++] = lens[i] - s < chunk ? lens[i] - s : chunk;
    *n_chunks = n;
    return cl;
}

int clef_audio_forward(clef_towers *t, const float *features, size_t n_clips, size_t n_frames,
                       const int32_t *feature_lens, float *out, clef_err *err) {
    if (!t->has_audio) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "the checkpoint has no audio tower");
    const clef_audio_config *c = &t->ac;
    int64_t M = c->d_model, mel = c->num_mel_bins, chunk = 2 * c->n_window;
    for (size_t i = 0; i < n_clips; i++)
        if (feature_lens[i] <= 0 || (size_t)feature_lens[i] > n_frames)
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "audio tower: bad frame count");
    int64_t n_chunks, T = 0, N = 0;
    int64_t *cl = chunk_lengths(feature_lens, n_clips, chunk, &n_chunks);
    for (int64_t k = 0; k < n_chunks; k++) {
        if (cl[k] > T) T = cl[k];
        N += conv_len(conv_len(conv_len(cl[k])));
    }
    /* 1-6: per chunk embedding, valid rows concatenated in batch order */
    float *x_host = clef_xmalloc(sizeof(float) * (size_t)(N * M));
    float *chunk_buf = clef_xmalloc(sizeof(float) * (size_t)(mel * T));
    float *rows = clef_xmalloc(sizeof(float) * (size_t)(conv_len(conv_len(conv_len(T))) * M));
    int rc = 0;
    int64_t k = 0, at = 0;
    for (size_t i = 0; i < n_clips && rc == 0; i++) {
        const float *clip = features + i * (size_t)mel * n_frames;
        for (int64_t s = 0; s < feature_lens[i] && rc == 0; s += chunk, k++) {
            memset(chunk_buf, 0, sizeof(float) * (size_t)(mel * T));
            for (int64_t f = 0; f < mel; f++)
                memcpy(chunk_buf + f * T, clip + (size_t)f * n_frames + (size_t)s, sizeof(float) * (size_t)cl[k]);
            rc = chunk_embed(t, chunk_buf, T, rows, err);
            int64_t keep = conv_len(conv_len(conv_len(cl[k])));
            memcpy(x_host + at * M, rows, sizeof(float) * (size_t)(keep * M));
            at += keep;
        }
    }
    free(chunk_buf);
    free(rows);
    /* 7: attention windows per clip */
    int64_t window = conv_len(conv_len(conv_len(T))) * (c->n_window_infer / chunk), n_win = 0;
    int64_t *off = clef_xmalloc(sizeof(int64_t) * (size_t)(N + 2));
    off[0] = 0;
    for (size_t i = 0; i < n_clips; i++) {
        int64_t len = after_cnn(feature_lens[i], chunk);
        for (int64_t s = 0; s < len; s += window, n_win++) off[n_win + 1] = off[n_win] + (len - s < window ? len - s : window);
    }
    int64_t H = c->encoder_attention_heads, d = M / H, Fd = c->encoder_ffn_dim;
    clef_attn_desc ad = {n_win, off, off, H, H, d, M, M, M, M, 1.0f / sqrtf((float)d), 0};
    /* 8-9: layers, ln_post, proj1, GELU, proj2 */
    float *x = NULL, *a = NULL, *q = NULL, *kk = NULL, *v = NULL, *att = NULL, *f1 = NULL, *o = NULL;
    if (rc == 0 && off[n_win] != N) rc = clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "audio tower: window mismatch");
    if (rc == 0 && (x = tw_alloc(t, (size_t)(N * M), err)) && (a = tw_alloc(t, (size_t)(N * M), err)) &&
        (q = tw_alloc(t, (size_t)(N * M), err)) && (kk = tw_alloc(t, (size_t)(N * M), err)) &&
        (v = tw_alloc(t, (size_t)(N * M), err)) && (att = tw_alloc(t, (size_t)(N * M), err)) &&
        (f1 = tw_alloc(t, (size_t)(N * Fd), err)) && (o = tw_alloc(t, (size_t)(N * c->output_dim), err))) {
        rc = tw_upload(t, x, x_host, (size_t)(N * M), err);
        for (int64_t l = 0; rc == 0 && l < c->encoder_layers; l++)
            rc = audio_layer_fwd(t, &t->layers[l], x, N, &ad, a, q, kk, v, att, f1, err);
        if (rc == 0)
            rc = t->be->ops->layernorm(t->be, x, t->ln_post.w, t->ln_post.b, a, N, M, AUDIO_LN_EPS, err) ||
                 tw_linear_fwd(t, &t->proj1, a, N, q, err) || t->be->ops->gelu(t->be, q, q, N * M, err) ||
                 tw_linear_fwd(t, &t->proj2, q, N, o, err) ||
                 tw_download(t, out, o, (size_t)(N * c->output_dim), err);
    } else if (rc == 0) {
        rc = -1;
    }
    float *dev[] = {x, a, q, kk, v, att, f1, o};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) tw_free(t, dev[i]);
    free(x_host);
    free(off);
    free(cl);
    return rc ? -1 : 0;
}
