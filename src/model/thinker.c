/* thinker.c — the Qwen3-Omni thinker text decoder (SPEC §6.2) over packed
 * records, written against the backend op table only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "util/buf.h"

/* Activations of one forward, carved out of one backend allocation. */
typedef struct thinker_ws {
    float *h;     /* [n, H] residual stream */
    float *a;     /* [n, H] normed input of a block */
    float *q;     /* [n, n_h D], or [n, (n_h + 2 n_kv) D] rows q | k | v for a fused_qkv layer */
    float *k, *v; /* [n, n_kv D] (layers without fused_qkv) */
    float *att;   /* [n, n_h D] attention output */
    float *o;     /* [n, H] block output (attention or MLP) */
    float *router;  /* [n, E] router logits */
    float *rw;      /* [n, k] routing weights */
    int32_t *ridx;  /* [n, k] experts */
    float *g, *u;   /* [n, I] dense MLP (only when some layer is dense) */
    int32_t *ids;   /* [n] */
    int32_t *pos;   /* [3, n] */
} thinker_ws;

/* Plan (base NULL) or carve (base set) the workspace for n tokens.
 * Buffers whose lives do not overlap share memory, which bounds the peak at
 * 32k tokens: `o` (a block's output) lives in `q`'s rows, which are dead
 * once attention has run and are rewritten only after the next block's
 * norm has added `o` into h; `a` (a block's normed input) is the caller's
 * hidden buffer when the hidden states are written to backend memory
 * (`a_be`, [n, H]), since the final norm is its last use. */
static void ws_layout(const clef_model *m, size_t n, float *a_be, model_ws *w, thinker_ws *t) {
    const clef_text_config *c = &m->cfg->text;
    const size_t H = (size_t)c->hidden_size, qd = (size_t)(c->num_attention_heads * c->head_dim),
                 kd = (size_t)(c->num_key_value_heads * c->head_dim), E = (size_t)c->num_experts,
                 k = (size_t)c->num_experts_per_tok;
    int any_dense = 0, any_fused = 0, any_split = 0;
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        any_dense |= !clef_layer_is_moe(c, l);
        any_fused |= m->layers[l].fused_qkv;
        any_split |= !m->layers[l].fused_qkv;
    }
    const size_t NI = any_dense ? (size_t)c->intermediate_size : 0, kv = any_split ? kd : 0;
    size_t qw = any_fused ? qd + 2 * kd : qd;
    if (qw < H) qw = H;
    t->h = ws_take(w, n * H, sizeof(float));
    t->a = a_be ? a_be : ws_take(w, n * H, sizeof(float));
    t->q = ws_take(w, n * qw, sizeof(float));
    t->k = ws_take(w, n * kv, sizeof(float));
    t->v = ws_take(w, n * kv, sizeof(float));
    t->att = ws_take(w, n * qd, sizeof(float));
    t->o = t->q;
    t->router = ws_take(w, n * E, sizeof(float));
    t->rw = ws_take(w, n * k, sizeof(float));
    t->ridx = ws_take(w, n * k, sizeof(int32_t));
    t->g = ws_take(w, n * NI, sizeof(float));
    t->u = ws_take(w, n * NI, sizeof(float));
    t->ids = ws_take(w, n, sizeof(int32_t));
    t->pos = ws_take(w, 3 * n, sizeof(int32_t));
}

/* The rows of one reuse forward: full-pass segments `seg` (the K/V layout,
 * as in the full pass), the computed rows' segments `sseg` (record s's rows
 * [seg[s] + reuse[s], seg[s + 1]) packed back to back), the blocks. */
typedef struct reuse_plan {
    size_t n_seg;
    const size_t *seg, *sseg, *reuse, *fill;
    float *const *read, *const *write;
    size_t *read_at, *write_at; /* [n_seg] first block of record s in read / write */
    float *kk, *vv;             /* [n_total, kd] K and V of every row, full-pass layout */
    size_t kd, B, L;
    clef_copy *cp;              /* scratch: 2 x (blocks read + blocks filled) + n_seg copies */
} reuse_plan;

static int reuse_kv_in(clef_backend *be, const reuse_plan *p, size_t l, const float *k, const float *v,
                       int64_t kv_stride, clef_err *err);

/* Self-attention block: a = input_norm(h + pend) (h updated; pend is the
 * previous block's output not yet added, or NULL), then
 * h += o_proj(attn(rope(qnorm(q)), rope(knorm(k)), v)) and
 * a = post_norm(h), both by add_rmsnorm (the residual add fused with the
 * norm that follows it).  q, k, v come from one product on a fused_qkv
 * layer (column blocks of t->q's rows), else from three.  With a reuse plan
 * `rp` (clef_thinker_forward_reuse; layer l) the n rows are the computed
 * ones and attention reads every record's K/V in the full-pass layout
 * (rp->kk / rp->vv, ad's k / v strides; its queries the last rows of each
 * segment: backend.h causal_prefix).  `normed`: the previous MLP block
 * already left h updated and a = input_norm(h) (mlp_block's next_norm), so
 * the first add_rmsnorm is skipped (and pend not read). */
static int attention_block(clef_model *m, const thinker_layer *L, thinker_ws *t, size_t n, const float *pend,
                           int normed, const clef_attn_desc *ad, const clef_rope_desc *rd, const reuse_plan *rp,
                           size_t l, clef_err *err) {
    clef_backend *be = m->be;
    const clef_text_config *c = &m->cfg->text;
    const int64_t T = (int64_t)n, H = c->hidden_size, D = c->head_dim, nh = c->num_attention_heads,
                  nkv = c->num_key_value_heads, qd = nh * D, kd = nkv * D;
    const float eps = (float)c->rms_norm_eps;
    clef_attn_desc a = *ad;
    float *q = t->q, *k = t->k, *v = t->v;
    int64_t ks = kd; /* row stride of k and v as the products leave them */
    if (!normed && be->ops->add_rmsnorm(be, t->h, pend, L->input_norm, t->a, T, H, eps, err)) return -1;
    if (L->fused_qkv) {
        k = q + qd, v = k + kd;
        a.q_stride = ks = qd + 2 * kd;
        if (!rp) a.k_stride = a.v_stride = ks;
        if (be->ops->matmul(be, t->a, T, &L->qkv_proj, NULL, q, err)) return -1;
    } else if (be->ops->matmul(be, t->a, T, &L->q_proj, NULL, q, err) ||
               be->ops->matmul(be, t->a, T, &L->k_proj, NULL, k, err) ||
               be->ops->matmul(be, t->a, T, &L->v_proj, NULL, v, err)) {
        return -1;
    }
    if (be->ops->qk_norm_rope(be, q, a.q_stride, k, ks, T, nh, nkv, L->q_norm, L->k_norm, eps, t->pos, rd, err))
        return -1;
    if (rp) {
        if (reuse_kv_in(be, rp, l, k, v, ks, err)) return -1;
        k = rp->kk, v = rp->vv;
    }
    if (be->ops->attention(be, q, k, v, t->att, &a, err) ||
        be->ops->matmul(be, t->att, T, &L->o_proj, NULL, t->o, err) ||
        be->ops->add_rmsnorm(be, t->h, t->o, L->post_norm, t->a, T, H, eps, err))
        return -1;
    return 0;
}

/* MLP block on a = post_norm(h): o = MoE(a) or the dense SwiGLU MLP.  The
 * residual add h += o is left to the next block's norm (add_rmsnorm).  With
 * `next_norm` (the norm that follows: the next layer's input norm or the
 * final norm) on a MoE layer whose backend has moe_add_rmsnorm, that add and
 * norm run in the MoE op instead: h += MoE(a), a = next_norm(h), *normed = 1
 * (bitwise the same h and a; o not written). */
static int mlp_block(clef_model *m, const thinker_layer *L, thinker_ws *t, size_t n, const float *next_norm,
                     int *normed, clef_err *err) {
    clef_backend *be = m->be;
    const clef_text_config *c = &m->cfg->text;
    const int64_t T = (int64_t)n, E = c->num_experts, k = c->num_experts_per_tok;
    *normed = 0;
    if (L->is_moe) {
        if (be->ops->matmul(be, t->a, T, &L->router, NULL, t->router, err) ||
            be->ops->router_topk(be, t->router, T, E, k, c->norm_topk_prob, t->ridx, t->rw, err))
            return -1;
        if (next_norm && be->ops->moe_add_rmsnorm) {
            if (be->ops->moe_add_rmsnorm(be, t->a, T, t->ridx, t->rw, k, &L->moe, t->h, next_norm,
                                         (float)c->rms_norm_eps, t->a, err))
                return -1;
            *normed = 1;
            return 0;
        }
        return be->ops->moe(be, t->a, T, t->ridx, t->rw, k, &L->moe, t->o, err) ? -1 : 0;
    }
    const int64_t NI = c->intermediate_size;
    if (be->ops->matmul(be, t->a, T, &L->mlp_gate, NULL, t->g, err) ||
        be->ops->matmul(be, t->a, T, &L->mlp_up, NULL, t->u, err) ||
        be->ops->swiglu(be, t->g, t->u, t->g, T * NI, err) ||
        be->ops->matmul(be, t->g, T, &L->mlp_down, NULL, t->o, err))
        return -1;
    return 0;
}

/* Check ids and segments; fill host positions when none were given. */
static int check_inputs(const clef_model *m, const int32_t *ids, size_t n, const size_t *seg, size_t n_seg,
                        clef_err *err) {
    const int64_t V = m->cfg->text.vocab_size;
    if (n == 0 || n_seg == 0) return clef_fail(err, 422, CLEF_E_REQUEST, NULL, "the record has no tokens");
    if (seg[0] != 0 || seg[n_seg] != n)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "thinker: segments do not cover the %zu tokens", n);
    for (size_t s = 0; s < n_seg; s++)
        if (seg[s + 1] < seg[s]) return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "thinker: segment %zu ends early", s);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return clef_fail(err, 422, CLEF_E_REQUEST, "input_ids", "token id %d at %zu is outside the vocabulary of %lld",
                             (int)ids[i], i, (long long)V);
    if (n > (size_t)INT32_MAX)
        return clef_fail(err, 422, CLEF_E_CAPACITY, NULL, "too many tokens: %zu", n);
    return 0;
}

/* Upload ids and positions ([3][n]; text positions restart per record). */
static int upload_inputs(clef_model *m, thinker_ws *t, const int32_t *ids, size_t n, const size_t *seg, size_t n_seg,
                         const int32_t *positions, clef_err *err) {
    clef_backend *be = m->be;
    if (be->ops->upload(be, t->ids, ids, n * sizeof(int32_t), err)) return -1;
    if (positions) return be->ops->upload(be, t->pos, positions, 3 * n * sizeof(int32_t), err);
    int32_t *pos = clef_xmalloc(3 * n * sizeof *pos);
    for (size_t s = 0; s < n_seg; s++)
        for (size_t i = seg[s]; i < seg[s + 1]; i++) pos[i] = pos[n + i] = pos[2 * n + i] = (int32_t)(i - seg[s]);
    int rc = be->ops->upload(be, t->pos, pos, 3 * n * sizeof(int32_t), err);
    free(pos);
    return rc;
}

/* Media rows: replace (add = 0) or add to (add = 1) rows of h from `src`
 * [n_rows, H], one download/upload per run of consecutive rows (the op table
 * has no scatter; media rows come in long runs). */
static int media_rows(clef_model *m, float *h, const size_t *rows, size_t n_rows, const float *src, int add,
                      clef_err *err) {
    clef_backend *be = m->be;
    const size_t H = (size_t)m->cfg->text.hidden_size;
    float *tmp = add ? clef_xmalloc((n_rows ? n_rows : 1) * H * sizeof *tmp) : NULL;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n_rows;) {
        size_t j = i + 1;
        while (j < n_rows && rows[j] == rows[j - 1] + 1) j++;
        size_t bytes = (j - i) * H * sizeof(float);
        float *dst = h + rows[i] * H;
        if (add) {
            rc = be->ops->download(be, tmp, dst, bytes, err);
            for (size_t q = 0; rc == 0 && q < (j - i) * H; q++) tmp[q] += src[i * H + q];
            if (rc == 0) rc = be->ops->upload(be, dst, tmp, bytes, err);
        } else {
            rc = be->ops->upload(be, dst, src + i * H, bytes, err);
        }
        i = j;
    }
    free(tmp);
    return rc;
}

/* One forward's layer work without media: what graph_run may record and replay. */
typedef struct layers_job {
    clef_model *m;
    thinker_ws *t;
    size_t n;
    const clef_attn_desc *ad;
    const clef_rope_desc *rd;
} layers_job;

/* Embedding gather, every decoder layer, the final norm into t->a (graph_run body). */
static int layers_body(void *ctx, clef_err *err) {
    const layers_job *j = ctx;
    clef_model *m = j->m;
    clef_backend *be = m->be;
    const clef_text_config *c = &m->cfg->text;
    thinker_ws *t = j->t;
    int rc = be->ops->gather(be, &m->embed, t->ids, (int64_t)j->n, t->h, err);
    int normed = 0; /* the last MLP block left h updated and a normed (mlp_block's next_norm) */
    const int64_t nl = c->num_hidden_layers;
    for (int64_t l = 0; rc == 0 && l < nl; l++) {
        rc = attention_block(m, &m->layers[l], t, j->n, l ? t->o : NULL, normed, j->ad, j->rd, NULL, 0, err);
        if (rc == 0)
            rc = mlp_block(m, &m->layers[l], t, j->n, l + 1 < nl ? m->layers[l + 1].input_norm : m->final_norm,
                           &normed, err);
    }
    /* the last MLP output joins h in the final norm */
    if (rc == 0 && !normed)
        rc = be->ops->add_rmsnorm(be, t->h, nl ? t->o : NULL, m->final_norm, t->a, (int64_t)j->n, c->hidden_size,
                                  (float)c->rms_norm_eps, err);
    return rc;
}

/* layers_body through the backend's graph_run where it has one: the key is
 * everything the body's launches depend on besides backend memory (the
 * model by its serial, not its address, which a later model may reuse; the
 * workspace and output addresses, the token count and the segments), so a
 * repeated batch layout replays the recorded launches. */
static int run_layers_graph(layers_job *j, const size_t *seg, size_t n_seg, clef_err *err) {
    clef_backend *be = j->m->be;
    if (!be->ops->graph_run) return layers_body(j, err);
    const void *head[3] = {j->t->h, j->t->a, j->t->ids};
    const uint64_t serial = j->m->serial;
    const size_t hb = sizeof serial + sizeof head, kb = hb + (n_seg + 2) * sizeof(size_t);
    char *key = clef_xmalloc(kb);
    memcpy(key, &serial, sizeof serial);
    memcpy(key + sizeof serial, head, sizeof head);
    memcpy(key + hb, &n_seg, sizeof n_seg);
    memcpy(key + hb + sizeof n_seg, seg, (n_seg + 1) * sizeof *seg);
    int rc = be->ops->graph_run(be, key, kb, layers_body, j, err);
    free(key);
    return rc;
}

/* The decoder layers; the final-norm rows go to `hidden`: host memory, or
 * backend memory when `hidden_on_be` (then written in place, no copy). */
static int run_layers(clef_model *m, thinker_ws *t, size_t n, const size_t *seg, size_t n_seg,
                      const clef_thinker_media *media, float *hidden, int hidden_on_be, float *layer_hidden,
                      clef_err *err) {
    clef_backend *be = m->be;
    const clef_text_config *c = &m->cfg->text;
    const size_t H = (size_t)c->hidden_size, bytes = n * H * sizeof(float);
    const int64_t nl = c->num_hidden_layers;
    int64_t *off = clef_xmalloc((n_seg + 1) * sizeof *off);
    for (size_t s = 0; s <= n_seg; s++) off[s] = (int64_t)seg[s];
    const int64_t qd = c->num_attention_heads * c->head_dim, kd = c->num_key_value_heads * c->head_dim;
    clef_attn_desc ad = {.n_seg = (int64_t)n_seg, .q_off = off, .kv_off = off, .n_q_heads = c->num_attention_heads,
                         .n_kv_heads = c->num_key_value_heads, .head_dim = c->head_dim, .q_stride = qd,
                         .k_stride = kd, .v_stride = kd, .o_stride = qd,
                         .scale = (float)(1.0 / sqrt((double)c->head_dim)), .causal = 1};
    clef_rope_desc rd = {.head_dim = c->head_dim,
                         .section = {c->mrope_section[0], c->mrope_section[1], c->mrope_section[2]},
                         .inv_freq = m->inv_freq};
    int rc = 0;
    if (!media && !layer_hidden) { /* text only: the path graph_run may replay */
        layers_job j = {.m = m, .t = t, .n = n, .ad = &ad, .rd = &rd};
        rc = run_layers_graph(&j, seg, n_seg, err);
        if (rc == 0 && !hidden_on_be) rc = be->ops->download(be, hidden, t->a, bytes, err);
        free(off);
        return rc;
    }
    rc = be->ops->gather(be, &m->embed, t->ids, (int64_t)n, t->h, err);
    if (rc == 0 && media) rc = media_rows(m, t->h, media->rows, media->n_rows, media->embeds, 0, err);
    if (rc == 0 && layer_hidden) rc = be->ops->download(be, layer_hidden, t->h, bytes, err);
    for (int64_t l = 0; rc == 0 && l < nl; l++) {
        /* h is complete after every layer here (deepstack rows, layer_hidden): the MLP output is added at once */
        int normed;
        rc = attention_block(m, &m->layers[l], t, n, NULL, 0, &ad, &rd, NULL, 0, err);
        if (rc == 0) rc = mlp_block(m, &m->layers[l], t, n, NULL, &normed, err);
        if (rc == 0) rc = be->ops->add(be, t->h, t->o, t->h, (int64_t)n, (int64_t)H, (int64_t)H, err);
        /* deepstack: visual features added after the first decoder layers */
        if (rc == 0 && media && (size_t)l < media->n_deepstack)
            rc = media_rows(m, t->h, media->ds_rows, media->n_ds_rows,
                            media->deepstack + (size_t)l * media->n_ds_rows * H, 1, err);
        if (rc == 0 && layer_hidden && l + 1 < nl)
            rc = be->ops->download(be, layer_hidden + (size_t)(l + 1) * n * H, t->h, bytes, err);
    }
    /* with hidden_on_be, t->a is the caller's hidden buffer (ws_layout) */
    if (rc == 0) rc = be->ops->rmsnorm(be, t->h, m->final_norm, t->a, (int64_t)n, (int64_t)H, (float)c->rms_norm_eps, err);
    if (rc == 0 && !hidden_on_be) rc = be->ops->download(be, hidden, t->a, bytes, err);
    if (rc == 0 && layer_hidden) memcpy(layer_hidden + (size_t)nl * n * H, hidden, bytes);
    free(off);
    return rc;
}

/* Media rows must lie inside the sequence, ascending. */
static int check_media(const clef_thinker_media *md, size_t n, clef_err *err) {
    if (!md) return 0;
    for (size_t i = 0; i < md->n_rows; i++)
        if (md->rows[i] >= n || (i && md->rows[i] <= md->rows[i - 1]))
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "thinker: media row %zu is out of order or range", i);
    for (size_t i = 0; i < md->n_ds_rows; i++)
        if (md->ds_rows[i] >= n || (i && md->ds_rows[i] <= md->ds_rows[i - 1]))
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "thinker: deepstack row %zu is out of order or range", i);
    return 0;
}

int clef_thinker_forward_batch(clef_model *m, const int32_t *ids, size_t n, const size_t *seg, size_t n_seg,
                               const int32_t *positions, float *hidden, float *layer_hidden, clef_err *err) {
    return clef_thinker_forward_media(m, ids, n, seg, n_seg, positions, NULL, hidden, layer_hidden, err);
}

/* Workspaces up to this size are kept between forwards (ws_acquire): 32,000
 * tokens of the full model take ~1.5 GB. */
#define WS_KEEP_MAX ((size_t)2 << 30)

/* A workspace of >= `bytes` backend bytes: the kept one when it is large
 * enough (taken out of the model while in use), else a new allocation (the
 * kept one, too small, is freed first); NULL when the backend has none. */
static char *ws_acquire(clef_model *m, size_t bytes) {
    if (m->ws_keep && m->ws_keep_bytes >= bytes) {
        char *p = m->ws_keep;
        m->ws_keep = NULL;
        return p;
    }
    if (m->ws_keep) m->be->ops->free(m->be, m->ws_keep);
    m->ws_keep = NULL;
    m->ws_keep_bytes = 0;
    return m->be->ops->alloc(m->be, bytes);
}

/* Done with the workspace from ws_acquire (`used` bytes of it were needed):
 * kept for the next forward where the backend replays graphs and it is not
 * oversized, else freed. */
static void ws_release(clef_model *m, char *base, size_t used) {
    if (m->be->ops->graph_run && !m->ws_keep && used <= WS_KEEP_MAX) {
        if (m->ws_keep_bytes < used) m->ws_keep_bytes = used;
        m->ws_keep = base;
        return;
    }
    m->be->ops->free(m->be, base);
    m->ws_keep_bytes = m->ws_keep ? m->ws_keep_bytes : 0;
}

/* The forward behind both entry points: hidden in host or backend memory. */
static int thinker_forward(clef_model *m, const int32_t *ids, size_t n, const size_t *seg, size_t n_seg,
                           const int32_t *positions, const clef_thinker_media *media, float *hidden, int hidden_on_be,
                           float *layer_hidden, clef_err *err) {
    if (check_inputs(m, ids, n, seg, n_seg, err) != 0 || check_media(media, n, err) != 0) return -1;
    model_ws w = {0};
    thinker_ws t;
    float *a_be = hidden_on_be ? hidden : NULL;
    ws_layout(m, n, a_be, &w, &t);
    w.base = ws_acquire(m, w.used);
    if (!w.base)
        return clef_fail(err, 422, CLEF_E_CAPACITY, NULL, "too many tokens: cannot allocate a %zu-byte workspace for %zu tokens",
                         w.used, n);
    w.used = 0;
    ws_layout(m, n, a_be, &w, &t);
    int rc = upload_inputs(m, &t, ids, n, seg, n_seg, positions, err);
    if (rc == 0) rc = run_layers(m, &t, n, seg, n_seg, media, hidden, hidden_on_be, layer_hidden, err);
    ws_release(m, w.base, w.used);
    return rc;
}

int clef_thinker_forward_media(clef_model *m, const int32_t *ids, size_t n, const size_t *seg, size_t n_seg,
                               const int32_t *positions, const clef_thinker_media *media, float *hidden,
                               float *layer_hidden, clef_err *err) {
    return thinker_forward(m, ids, n, seg, n_seg, positions, media, hidden, 0, layer_hidden, err);
}

int clef_thinker_forward_backend(clef_model *m, const int32_t *ids, size_t n, const size_t *seg, size_t n_seg,
                                 const int32_t *positions, const clef_thinker_media *media, float *hidden_be,
                                 clef_err *err) {
    return thinker_forward(m, ids, n, seg, n_seg, positions, media, hidden_be, 1, NULL, err);
}

int clef_thinker_forward(clef_model *m, const int32_t *ids, size_t n, float *hidden, float *layer_hidden,
                         clef_err *err) {
    size_t seg[2] = {0, n};
    return clef_thinker_forward_batch(m, ids, n, seg, 1, NULL, hidden, layer_hidden, err);
}

/* ---- forward with a reused prefix (clef_thinker_forward_reuse) ---- */

size_t clef_kv_block_floats(const clef_model *m) {
    const clef_text_config *c = &m->cfg->text;
    const size_t kd = (size_t)(c->num_key_value_heads * c->head_dim);
    return (2 * (size_t)c->num_hidden_layers * kd + (size_t)c->hidden_size) * CLEF_KV_BLOCK;
}

int clef_model_can_reuse(const clef_model *m) { return m->be->ops->causal_prefix && m->be->ops->copy_2d; }

/* Layer l's K/V of every record into the full-pass layout (cached prefix
 * rows from the read blocks, the computed rows from k / v: rows kv_stride
 * floats apart, kd or the fused q | k | v width), then the filled blocks'
 * K/V from it: one copy_many for the reads, one copy_2d per record and
 * computed matrix, one copy_many for the fills (p->cp: room for the most). */
static int reuse_kv_in(clef_backend *be, const reuse_plan *p, size_t l, const float *k, const float *v,
                       int64_t kv_stride, clef_err *err) {
    const size_t B = p->B, kd = p->kd, blk = B * kd * sizeof(float);
    size_t n = 0;
    for (size_t s = 0; s < p->n_seg; s++)
        for (size_t b = 0, base = p->seg[s]; b < p->reuse[s] / B; b++) {
            const float *x = p->read[p->read_at[s] + b];
            p->cp[n++] = (clef_copy){p->kk + (base + b * B) * kd, x + 2 * l * B * kd, blk};
            p->cp[n++] = (clef_copy){p->vv + (base + b * B) * kd, x + (2 * l + 1) * B * kd, blk};
        }
    if (be->ops->copy_many(be, p->cp, n, err)) return -1;
    for (size_t s = 0; s < p->n_seg; s++) {
        const size_t at = p->seg[s] + p->reuse[s];
        const int64_t ikd = (int64_t)kd, rows = (int64_t)(p->sseg[s + 1] - p->sseg[s]), ks = kv_stride;
        if (rows && (be->ops->copy_2d(be, p->kk + at * kd, ikd, k + (int64_t)p->sseg[s] * ks, ks, rows, ikd, err) ||
                     be->ops->copy_2d(be, p->vv + at * kd, ikd, v + (int64_t)p->sseg[s] * ks, ks, rows, ikd, err)))
            return -1;
    }
    n = 0;
    for (size_t s = 0; s < p->n_seg; s++)
        for (size_t b = 0, at = p->seg[s] + p->reuse[s]; b < p->fill[s]; b++) {
            float *x = p->write[p->write_at[s] + b];
            p->cp[n++] = (clef_copy){x + 2 * l * B * kd, p->kk + (at + b * B) * kd, blk};
            p->cp[n++] = (clef_copy){x + (2 * l + 1) * B * kd, p->vv + (at + b * B) * kd, blk};
        }
    return be->ops->copy_many(be, p->cp, n, err);
}

/* Media rows of the full pass moved to the computed rows (rows in a reused
 * prefix dropped): out arrays owned by the caller (free_media_view). */
static void media_view(const clef_thinker_media *md, const reuse_plan *p, size_t H, clef_thinker_media *out,
                       size_t **rows_out, size_t **ds_out, float **emb_out, float **dsv_out) {
    memset(out, 0, sizeof *out);
    *rows_out = *ds_out = NULL;
    *emb_out = *dsv_out = NULL;
    if (!md) return;
    size_t *rows = clef_xmalloc((md->n_rows + 1) * sizeof *rows), *ds = clef_xmalloc((md->n_ds_rows + 1) * sizeof *ds);
    float *emb = clef_xmalloc((md->n_rows * H + 1) * sizeof *emb);
    float *dsv = clef_xmalloc((md->n_deepstack * md->n_ds_rows * H + 1) * sizeof *dsv);
    size_t nr = 0, nd = 0, s = 0;
    for (size_t i = 0; i < md->n_rows; i++) {
        while (md->rows[i] >= p->seg[s + 1]) s++;
        const size_t local = md->rows[i] - p->seg[s];
        if (local < p->reuse[s]) continue;
        rows[nr] = p->sseg[s] + local - p->reuse[s];
        memcpy(emb + nr * H, md->embeds + i * H, H * sizeof *emb);
        nr++;
    }
    size_t *keep = clef_xmalloc((md->n_ds_rows + 1) * sizeof *keep);
    s = 0;
    for (size_t i = 0; i < md->n_ds_rows; i++) {
        while (md->ds_rows[i] >= p->seg[s + 1]) s++;
        const size_t local = md->ds_rows[i] - p->seg[s];
        if (local < p->reuse[s]) continue;
        keep[nd] = i;
        ds[nd++] = p->sseg[s] + local - p->reuse[s];
    }
    for (size_t k = 0; k < md->n_deepstack; k++)
        for (size_t j = 0; j < nd; j++)
            memcpy(dsv + (k * nd + j) * H, md->deepstack + (k * md->n_ds_rows + keep[j]) * H, H * sizeof *dsv);
    free(keep);
    *out = (clef_thinker_media){.n_rows = nr, .rows = rows, .embeds = emb, .n_ds_rows = nd, .ds_rows = ds,
                                .n_deepstack = nd ? md->n_deepstack : 0, .deepstack = dsv};
    *rows_out = rows, *ds_out = ds, *emb_out = emb, *dsv_out = dsv;
}

/* One reuse forward's launches (run_layers_reuse; a graph_run body when there are no media). */
typedef struct reuse_job {
    clef_model *m;
    thinker_ws *t;
    size_t n;
    const reuse_plan *p;
    const clef_thinker_media *md;
    float *hidden_be;
    const clef_attn_desc *ad;
    const clef_rope_desc *rd;
} reuse_job;

static int reuse_body(void *ctx, clef_err *err) {
    const reuse_job *j = ctx;
    clef_model *m = j->m;
    clef_backend *be = m->be;
    const clef_text_config *c = &m->cfg->text;
    thinker_ws *t = j->t;
    const reuse_plan *p = j->p;
    const clef_thinker_media *md = j->md;
    const size_t n = j->n, H = (size_t)c->hidden_size, B = p->B, L = p->L;
    float *hidden_be = j->hidden_be;
    int rc = be->ops->gather(be, &m->embed, t->ids, (int64_t)n, t->h, err);
    if (rc == 0 && md && md->n_rows) rc = media_rows(m, t->h, md->rows, md->n_rows, md->embeds, 0, err);
    for (size_t l = 0; rc == 0 && l < L; l++) {
        /* h complete after every layer (as the media path): the MLP output is added at once */
        int normed;
        rc = attention_block(m, &m->layers[l], t, n, NULL, 0, j->ad, j->rd, p, l, err);
        if (rc == 0) rc = mlp_block(m, &m->layers[l], t, n, NULL, &normed, err);
        if (rc == 0) rc = be->ops->add(be, t->h, t->o, t->h, (int64_t)n, (int64_t)H, (int64_t)H, err);
        if (rc == 0 && md && l < md->n_deepstack && md->n_ds_rows)
            rc = media_rows(m, t->h, md->ds_rows, md->n_ds_rows, md->deepstack + l * md->n_ds_rows * H, 1, err);
    }
    if (rc == 0) rc = be->ops->rmsnorm(be, t->h, m->final_norm, t->a, (int64_t)n, (int64_t)H, (float)c->rms_norm_eps, err);
    /* the hidden rows: reused ones from the read blocks, computed ones from t->a, then the filled blocks'
     * from t->a */
    const size_t hoff = 2 * L * B * p->kd, hb = B * H * sizeof(float); /* a block's hidden rows */
    size_t nc = 0;
    for (size_t s = 0; s < p->n_seg; s++) {
        float *dst = hidden_be + p->seg[s] * H;
        for (size_t b = 0; b < p->reuse[s] / B; b++)
            p->cp[nc++] = (clef_copy){dst + b * B * H, p->read[p->read_at[s] + b] + hoff, hb};
        const size_t rows = p->sseg[s + 1] - p->sseg[s];
        if (rows) p->cp[nc++] = (clef_copy){dst + p->reuse[s] * H, t->a + p->sseg[s] * H, rows * H * sizeof(float)};
    }
    for (size_t s = 0; s < p->n_seg; s++)
        for (size_t b = 0; b < p->fill[s]; b++)
            p->cp[nc++] = (clef_copy){p->write[p->write_at[s] + b] + hoff, t->a + (p->sseg[s] + b * B) * H, hb};
    if (rc == 0) rc = be->ops->copy_many(be, p->cp, nc, err);
    return rc;
}

/* The layers of a reuse forward over the n computed rows (ids / positions
 * uploaded), then every record's hidden rows into hidden_be. */
static int run_layers_reuse(clef_model *m, thinker_ws *t, size_t n, const reuse_plan *p, const clef_thinker_media *md,
                            float *hidden_be, clef_err *err) {
    clef_backend *be = m->be;
    const clef_text_config *c = &m->cfg->text;
    const size_t B = p->B;
    int64_t *qo = clef_xmalloc((p->n_seg + 1) * sizeof *qo), *ko = clef_xmalloc((p->n_seg + 1) * sizeof *ko);
    for (size_t s = 0; s <= p->n_seg; s++) qo[s] = (int64_t)p->sseg[s], ko[s] = (int64_t)p->seg[s];
    const int64_t qd = c->num_attention_heads * c->head_dim, kd = (int64_t)p->kd;
    clef_attn_desc ad = {.n_seg = (int64_t)p->n_seg, .q_off = qo, .kv_off = ko, .n_q_heads = c->num_attention_heads,
                         .n_kv_heads = c->num_key_value_heads, .head_dim = c->head_dim, .q_stride = qd,
                         .k_stride = kd, .v_stride = kd, .o_stride = qd,
                         .scale = (float)(1.0 / sqrt((double)c->head_dim)), .causal = 1};
    clef_rope_desc rd = {.head_dim = c->head_dim,
                         .section = {c->mrope_section[0], c->mrope_section[1], c->mrope_section[2]},
                         .inv_freq = m->inv_freq};
    reuse_job j = {.m = m, .t = t, .n = n, .p = p, .md = md, .hidden_be = hidden_be, .ad = &ad, .rd = &rd};
    int rc;
    if (md || !be->ops->graph_run) {
        rc = reuse_body(&j, err);
    } else {
        /* the key: everything the launches depend on besides backend memory (as run_layers_graph's, plus
         * the kept-block pointers and counts: a repeated state under a same-length question set replays) */
        const void *head[6] = {t->h, t->a, t->ids, p->kk, p->vv, hidden_be};
        const uint64_t serial = m->serial;
        size_t nr = 0, nw = 0;
        for (size_t s = 0; s < p->n_seg; s++) nr += p->reuse[s] / B, nw += p->fill[s];
        const size_t kb = sizeof serial + sizeof head + (3 * p->n_seg + 3) * sizeof(size_t) + (nr + nw) * sizeof(float *);
        char *key = clef_xmalloc(kb), *k = key;
        memcpy(k, &serial, sizeof serial), k += sizeof serial;
        memcpy(k, head, sizeof head), k += sizeof head;
        memcpy(k, &p->n_seg, sizeof p->n_seg), k += sizeof p->n_seg;
        memcpy(k, p->seg, (p->n_seg + 1) * sizeof *p->seg), k += (p->n_seg + 1) * sizeof *p->seg;
        memcpy(k, p->sseg, (p->n_seg + 1) * sizeof *p->sseg), k += (p->n_seg + 1) * sizeof *p->sseg;
        memcpy(k, p->fill, p->n_seg * sizeof *p->fill), k += p->n_seg * sizeof *p->fill;
        memcpy(k, p->read, nr * sizeof *p->read), k += nr * sizeof *p->read;
        memcpy(k, p->write, nw * sizeof *p->write);
        rc = be->ops->graph_run(be, key, kb, reuse_body, &j, err);
        free(key);
    }
    free(qo);
    free(ko);
    return rc;
}

int clef_thinker_forward_reuse(clef_model *m, const int32_t *ids, size_t n_total, const size_t *seg, size_t n_seg,
                               const int32_t *positions, const clef_thinker_media *media,
                               const clef_thinker_reuse *reuse, float *hidden_be, clef_err *err) {
    int any = 0;
    for (size_t s = 0; reuse && s < n_seg; s++) any |= reuse->reuse[s] || reuse->fill[s];
    if (!any) return thinker_forward(m, ids, n_total, seg, n_seg, positions, media, hidden_be, 1, NULL, err);
    if (check_inputs(m, ids, n_total, seg, n_seg, err) != 0 || check_media(media, n_total, err) != 0) return -1;
    if (!clef_model_can_reuse(m))
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "thinker: this model cannot reuse cached blocks");
    const clef_text_config *c = &m->cfg->text;
    const size_t B = CLEF_KV_BLOCK;
    reuse_plan p = {.n_seg = n_seg, .seg = seg, .reuse = reuse->reuse, .fill = reuse->fill, .read = reuse->read,
                    .write = reuse->write, .kd = (size_t)(c->num_key_value_heads * c->head_dim), .B = B,
                    .L = (size_t)c->num_hidden_layers};
    size_t *sseg = clef_xmalloc((n_seg + 1) * sizeof *sseg);
    p.read_at = clef_xmalloc((n_seg + 1) * sizeof *p.read_at);
    p.write_at = clef_xmalloc((n_seg + 1) * sizeof *p.write_at);
    sseg[0] = 0;
    size_t ra = 0, wa = 0;
    for (size_t s = 0; s < n_seg; s++) {
        const size_t len = seg[s + 1] - seg[s];
        if (p.reuse[s] % B || p.reuse[s] >= len || p.reuse[s] + p.fill[s] * B > len) {
            free(sseg), free(p.read_at), free(p.write_at);
            return clef_fail(err, 500, CLEF_E_INTERNAL, NULL,
                             "thinker: record %zu reuses %zu and fills %zu blocks of its %zu tokens", s, p.reuse[s],
                             p.fill[s], len);
        }
        p.read_at[s] = ra, p.write_at[s] = wa;
        ra += p.reuse[s] / B, wa += p.fill[s];
        sseg[s + 1] = sseg[s] + len - p.reuse[s];
    }
    p.sseg = sseg;
    p.cp = clef_xmalloc((2 * (ra + wa) + n_seg + 1) * sizeof *p.cp);
    const size_t n = sseg[n_seg];
    /* the computed rows' ids and positions */
    int32_t *sids = clef_xmalloc(n * sizeof *sids), *spos = clef_xmalloc(3 * n * sizeof *spos);
    for (size_t s = 0; s < n_seg; s++)
        for (size_t i = seg[s] + p.reuse[s], r = sseg[s]; i < seg[s + 1]; i++, r++) {
            sids[r] = ids[i];
            for (size_t ax = 0; ax < 3; ax++)
                spos[ax * n + r] = positions ? positions[ax * n_total + i] : (int32_t)(i - seg[s]);
        }
    clef_thinker_media mv;
    size_t *mrows, *mds;
    float *memb, *mdsv;
    media_view(media, &p, (size_t)c->hidden_size, &mv, &mrows, &mds, &memb, &mdsv);
    model_ws w = {0};
    thinker_ws t;
    ws_layout(m, n, NULL, &w, &t);
    const size_t kvb = ((n_total * p.kd * sizeof(float)) + 63) & ~(size_t)63;
    const size_t need = ((w.used + 63) & ~(size_t)63) + 2 * kvb;
    char *base = ws_acquire(m, need);
    int rc = -1;
    if (!base) {
        clef_fail(err, 422, CLEF_E_CAPACITY, NULL, "too many tokens: cannot allocate a %zu-byte workspace for %zu tokens",
                  need, n_total);
    } else {
        w.base = base;
        w.used = 0;
        ws_layout(m, n, NULL, &w, &t);
        const size_t at = (w.used + 63) & ~(size_t)63;
        p.kk = (float *)(base + at);
        p.vv = (float *)(base + at + kvb);
        rc = m->be->ops->upload(m->be, t.ids, sids, n * sizeof *sids, err) ||
                     m->be->ops->upload(m->be, t.pos, spos, 3 * n * sizeof *spos, err)
                 ? -1
                 : run_layers_reuse(m, &t, n, &p, media ? &mv : NULL, hidden_be, err);
        ws_release(m, base, need);
    }
    free(sids), free(spos), free(mrows), free(mds), free(memb), free(mdsv);
    free(sseg), free(p.read_at), free(p.write_at), free(p.cp);
    return rc;
}
