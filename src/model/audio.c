/* audio.c — the Qwen3-Omni audio tower (SPEC §9 "Audio", tower steps 1-9):
 * 100-frame chunks padded to the longest chunk, three 3x3 stride-2 Conv2d +
 * GELU, conv_out, a sinusoid restarting per chunk, the valid rows of each
 * chunk, windowed bidirectional attention per clip, ln_post, proj1, GELU,
 * proj2.
 *
 * Every step runs through the backend's op table: the convolutions as
 * im2col_3x3s2 + matmul with the Conv2d kernel viewed as [C_out, C_in*9],
 * the flattening for conv_out as a transpose, the sinusoid (a buffer made
 * when the tower is bound) and the choice of each chunk's valid rows as one
 * add per chunk.  The chunks are uploaded once, zero-padded to the longest,
 * and convolved in groups that bound the im2col memory (a chunk's result
 * does not depend on its group: the reference convolves all chunks padded
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

/* Scratch budget (floats) of one group of chunks: im2col columns + conv
 * activations; and at most this many rows per convolution product (a
 * device's launch grid bounds the rows of one product, e.g. 65535 for the
 * CUDA f32-weight GEMM that multiplies the 9-column conv2d1 kernel). */
#define AUDIO_GROUP_FLOATS ((int64_t)64 << 20)
#define AUDIO_GROUP_ROWS ((int64_t)32768)

/* Convolutions, conv_out and sinusoid of all chunks, each padded to T frames:
 * dchunks backend [n_chunks][mel][T] -> x backend rows [N, d_model], the
 * first c(c(c(cl[k]))) rows of chunk k in chunk order. */
static int chunks_embed(clef_towers *t, const float *dchunks, int64_t n_chunks, int64_t T, const int64_t *cl, float *x,
                        clef_err *err) {
    const clef_audio_config *c = &t->ac;
    const clef_backend_ops *op = t->be->ops;
    int64_t C = c->downsample_hidden_size, M = c->d_model;
    int64_t F[4] = {c->num_mel_bins, 0, 0, 0}, Ts[4] = {T, 0, 0, 0}, Ci[3] = {1, C, C};
    for (int i = 1; i < 4; i++) F[i] = conv_len(F[i - 1]), Ts[i] = conv_len(Ts[i - 1]);
    /* per chunk: the largest im2col / conv_out input, the largest conv output */
    int64_t cols1 = Ts[3] * C * F[3], act1 = 1;
    for (int l = 0; l < 3; l++) {
        int64_t n = F[l + 1] * Ts[l + 1];
        if (n * Ci[l] * 9 > cols1) cols1 = n * Ci[l] * 9;
        if (n * C > act1) act1 = n * C;
    }
    if (Ts[3] * M > act1) act1 = Ts[3] * M;
    int64_t G = AUDIO_GROUP_FLOATS / (cols1 + act1);
    if (G > AUDIO_GROUP_ROWS / (F[1] * Ts[1])) G = AUDIO_GROUP_ROWS / (F[1] * Ts[1]);
    if (G < 1) G = 1;
    if (G > n_chunks) G = n_chunks;
    float *cols = tw_alloc(t, (size_t)(G * cols1), err), *act = cols ? tw_alloc(t, (size_t)(G * act1), err) : NULL;
    int rc = act ? 0 : -1;
    int64_t at = 0;
    for (int64_t g0 = 0; g0 < n_chunks && rc == 0; g0 += G) {
        int64_t B = n_chunks - g0 < G ? n_chunks - g0 : G;
        const float *in = dchunks + g0 * F[0] * T; /* [B][mel][T][1] */
        for (int l = 0; l < 3 && rc == 0; l++) {
            int64_t n = B * F[l + 1] * Ts[l + 1];
            rc = op->im2col_3x3s2(t->be, in, B, F[l], Ts[l], Ci[l], cols, err) ||
                 tw_linear_fwd(t, &t->conv[l], cols, n, act, err) || op->gelu(t->be, act, act, n * C, err);
            in = act; /* [B][F][T][C] */
        }
        /* conv_out input per time step: feature ch*F3 + f of act[b][f][tt][ch] */
        if (rc == 0)
            rc = op->transpose(t->be, act, B, F[3], Ts[3] * C, cols, err) ||
                 op->matmul(t->be, cols, B * Ts[3], &t->conv_out, NULL, act, err);
        for (int64_t b = 0; b < B && rc == 0; b++) {
            int64_t keep = conv_len(conv_len(conv_len(cl[g0 + b])));
            rc = op->add(t->be, act + b * Ts[3] * M, t->sinusoid, x + at * M, keep, M, M, err);
            at += keep;
        }
    }
    tw_free(t, cols);
    tw_free(t, act);
    return rc ? -1 : 0;
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
    /* 1-2: the chunks zero-padded to T frames, [n_chunks][mel][T], one upload */
    float *chunk_host = clef_xcalloc((size_t)(n_chunks * mel * T), sizeof(float));
    int64_t k = 0;
    for (size_t i = 0; i < n_clips; i++) {
        const float *clip = features + i * (size_t)mel * n_frames;
        for (int64_t s = 0; s < feature_lens[i]; s += chunk, k++)
            for (int64_t f = 0; f < mel; f++)
                memcpy(chunk_host + (k * mel + f) * T, clip + (size_t)f * n_frames + (size_t)s,
                       sizeof(float) * (size_t)cl[k]);
    }
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
    float *x = NULL, *a = NULL, *q = NULL, *kk = NULL, *v = NULL, *att = NULL, *f1 = NULL, *o = NULL, *dch = NULL;
    int rc = off[n_win] != N ? clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "audio tower: window mismatch") : 0;
    if (rc == 0 && (dch = tw_alloc(t, (size_t)(n_chunks * mel * T), err)) && (x = tw_alloc(t, (size_t)(N * M), err)) &&
        (a = tw_alloc(t, (size_t)(N * M), err)) && (q = tw_alloc(t, (size_t)(N * M), err)) &&
        (kk = tw_alloc(t, (size_t)(N * M), err)) && (v = tw_alloc(t, (size_t)(N * M), err)) &&
        (att = tw_alloc(t, (size_t)(N * M), err)) && (f1 = tw_alloc(t, (size_t)(N * Fd), err)) &&
        (o = tw_alloc(t, (size_t)(N * c->output_dim), err))) {
        /* 3-6 */
        rc = tw_upload(t, dch, chunk_host, (size_t)(n_chunks * mel * T), err) ||
             chunks_embed(t, dch, n_chunks, T, cl, x, err);
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
    float *dev[] = {x, a, q, kk, v, att, f1, o, dch};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) tw_free(t, dev[i]);
    free(chunk_host);
    free(off);
    free(cl);
    return rc ? -1 : 0;
}
