/* placement.c — the weight-placement planner (placement.h): device sizes of
 * a checkpoint or a synthetic preset from shapes alone, and the plan of
 * which layers' experts stay resident under a GPU memory budget. */
#include "engine/placement.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend/cuda/cuda_qbits.h"
#include "io/checkpoint.h"
#include "io/synth.h"
#include "io/tensor_names.h"
#include "quant/convert.h"
#include "quant/format.h"
#include "util/buf.h"

#define ALIGN_UP(x, a) (((x) + (a) - 1) & ~(size_t)((a) - 1))
#define GIB (1024.0 * 1024.0 * 1024.0)

/* Saturating size arithmetic: every size here can come from a flag
 * (--max-batch-tokens) or a checkpoint's shapes, so a sum or product past
 * SIZE_MAX stays SIZE_MAX (which no budget holds: the plan then does not
 * fit) instead of wrapping to a small number that would. */
static size_t sadd(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
static size_t smul(size_t a, size_t b) { return b && a > SIZE_MAX / b ? SIZE_MAX : a * b; }
static size_t smul3(size_t a, size_t b, size_t c) { return smul(smul(a, b), c); }
/* x rounded up to a multiple of a (a power of two), saturating. */
static size_t salign(size_t x, size_t a) { return x > SIZE_MAX - (a - 1) ? SIZE_MAX : ALIGN_UP(x, a); }
static void acc(size_t *into, size_t b) { *into = sadd(*into, b); }

/* ---- device bytes of one weight (cuda_backend.c's allocation rule) ---- */

/* arena_take: every weight block is rounded up to 256 bytes (an empty one
 * takes 256). */
static size_t arena_bytes(size_t bytes) { return salign(bytes ? bytes : 1, 256); }

size_t clef_place_weight_bytes(const clef_qweight *q) {
    const size_t R = (size_t)q->rows, C = (size_t)q->cols;
    if (q->quant.type == CLEF_QT_NONE) { /* cu_weight_init: bf16 stays bf16, f16 / f32 become f32 */
        const size_t es = q->dtype == CLEF_DT_BF16 ? 2 : 4;
        return arena_bytes(smul3(R, C, es));
    }
    /* packed_sizes, then the v3 kernels' reordered INT4 / NVFP4 sizes (the default) */
    size_t nd, ns, nz = 0;
    switch (q->quant.type) {
    case CLEF_QT_NVFP4:
        nd = (size_t)CK_NVF4R_BYTES(R, C);
        ns = (size_t)CK_NVF4R_SC_BYTES(R, C);
        break;
    case CLEF_QT_FP8_BLOCK: {
        const size_t br = (size_t)q->quant.block_r, bc = (size_t)q->quant.block_c;
        nd = R * C;
        ns = 4 * ((R + br - 1) / br) * ((C + bc - 1) / bc);
        break;
    }
    default: { /* INT4 GPTQ */
        const size_t G = (size_t)q->quant.group;
        nd = (size_t)CK_INT4R_BYTES(R, C);
        ns = 2 * (C / G) * R;
        nz = q->quant.zeros ? 4 * (C / G) * (R / 8) : 0;
        break;
    }
    }
    /* cu_weight_init_packed: data, scales, zeros each 256-aligned after 256 bytes of slack */
    const size_t os = salign(sadd(nd, 256), 256), oz = sadd(os, salign(sadd(ns, 256), 256));
    return arena_bytes(sadd(oz, nz ? salign(sadd(nz, 256), 256) : 0));
}

/* A vector uploaded as f32 into its own backend allocation (model.c
 * upload_f32, towers.c upload_owned: cudaMallocAsync, counted at the 256
 * bytes the allocator aligns to). */
static size_t vec_bytes(int64_t n) { return salign(smul((size_t)(n > 0 ? n : 1), 4), 256); }

/* SLOT_STAGE: what cu_weight_init_packed stages a reordered weight through
 * (checkpoint-layout data; NVFP4: and scales), grown to the largest and kept
 * (cu_slot adds a quarter and 256 bytes). */
static size_t stage_bytes(const clef_qweight *q) {
    const size_t R = (size_t)q->rows, C = (size_t)q->cols;
    size_t b;
    if (q->quant.type == CLEF_QT_INT4_GPTQ) b = R * C / 2;
    else if (q->quant.type == CLEF_QT_NVFP4) b = ALIGN_UP(R * C / 2, 256) + R * (C / 16);
    else return 0;
    return salign(sadd(sadd(b, b / 4), 256), 256);
}

/* ---- the workspace estimate ---- */

/* MoE passes run over at most this many tokens (cuda_backend.c MOE_CHUNK_TOKENS). */
#define PLACE_MOE_CHUNK_TOKENS 8192
/* Activation halves per tensor-core input: 2 = precise numerics (the worst case). */
#define PLACE_WS_SPLIT 2

static size_t ws64(size_t bytes) { return salign(bytes, 64); }                      /* model_ws ws_take */
static size_t cu_slot_bytes(size_t b) { return b ? salign(sadd(sadd(b, b / 4), 256), 256) : 0; } /* cu_slot's headroom */

static size_t max3(size_t a, size_t b, size_t c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

size_t clef_place_workspace_bytes(const clef_config *cfg, size_t T) {
    const clef_text_config *c = &cfg->text;
    const size_t H = (size_t)c->hidden_size, D = (size_t)c->head_dim, nh = (size_t)c->num_attention_heads,
                 nkv = (size_t)c->num_key_value_heads, qd = nh * D, kd = nkv * D, E = (size_t)c->num_experts,
                 k = (size_t)c->num_experts_per_tok, NI = (size_t)c->moe_intermediate_size,
                 W = (size_t)cfg->head.width, sp = PLACE_WS_SPLIT, f = sizeof(float);
    const size_t Tm = T < PLACE_MOE_CHUNK_TOKENS ? T : PLACE_MOE_CHUNK_TOKENS, TK = Tm * k;
    int any_dense = 0;
    for (int64_t l = 0; l < c->num_hidden_layers; l++) any_dense |= !clef_layer_is_moe(c, l);
    const size_t ND = any_dense ? (size_t)c->intermediate_size : 0;
    const size_t qw = qd + 2 * kd > H ? qd + 2 * kd : H;

    /* thinker.c ws_layout (fused and split q/k/v both counted: an upper bound of either); every
     * product saturates (T comes from --max-batch-tokens, which may be anything) */
    const size_t hidden = ws64(smul3(T, H, f));      /* h: the residual stream */
    const size_t hidden_out = ws64(smul3(T, H, f));  /* a: the engine's thinker-output buffer on the backend */
    const size_t qkv = sadd(ws64(smul3(T, qw, f)), smul(2, ws64(smul3(T, kd, f)))); /* q (| k | v fused), k, v split */
    const size_t att = ws64(smul3(T, qd, f));        /* attention output */
    const size_t route = sadd(ws64(smul3(T, E, f)), smul(2, ws64(smul3(T, k, 4)))); /* router logits, top-k weights, ids */
    const size_t dense_mlp = smul(2, ws64(smul3(T, ND, f))); /* g, u of dense-MLP layers */
    const size_t ids_pos = sadd(ws64(smul(T, 4)), ws64(smul3(3, T, 4)));
    /* head.c ws_layout, dominated by its per-token rows: hn [L, H], M, Mn [L, W], KV [L, 2W] */
    const size_t head = smul3(T, H + 4 * W, f);
    /* cuda_backend.c scratch slots */
    const size_t a16 = cu_slot_bytes(smul3(smul(T, max3(H, qd, ND)), sp, 2));    /* SLOT_A16: product inputs, bf16 */
    const size_t att16 = cu_slot_bytes(sadd(smul3(sadd(smul(T, qd), smul3(2, T, kd)), sp, 2), 64)); /* SLOT_ATT16 */
    const size_t split_y = cu_slot_bytes(smul3(2, T, max3(qw, H, E) * f));      /* SLOT_SPLIT_Y (precise) */
    const size_t moe_ix = cu_slot_bytes((2 * E + 2 * TK + 2 * (TK / 16 + 1 + E) + 1) * 4); /* SLOT_MOE_IX (Tm <= 8192) */
    const size_t moe_h = cu_slot_bytes(TK * NI * sp * 2);                     /* SLOT_MOE_H: SwiGLU out, bf16 */
    const size_t moe_y = cu_slot_bytes(TK * H * f);                           /* SLOT_MOE_Y: permuted outputs */
    const size_t terms[] = {hidden, hidden_out, qkv, att, route, dense_mlp, ids_pos, head,
                            a16, att16, split_y, moe_ix, moe_h, moe_y};
    size_t sum = 0;
    for (size_t i = 0; i < sizeof terms / sizeof terms[0]; i++) sum = sadd(sum, terms[i]);
    return sum;
}

/* ---- sizes of a checkpoint, from its catalog's headers ---- */

static int pl_fail(clef_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int pl_fail(clef_err *err, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s", msg);
}

static const st_tensor *find2(const clef_checkpoint *ck, const char *module, const char *suffix) {
    char name[512];
    snprintf(name, sizeof name, "%s.%s", module, suffix);
    return clef_checkpoint_find(ck, name);
}

/* Any non-NULL address: marks asymmetric INT4 zeros in a header-only qweight. */
static const char zeros_mark;

static int plain_dtype(clef_dtype d) { return d == CLEF_DT_BF16 || d == CLEF_DT_F16 || d == CLEF_DT_F32; }

/* What clef_qweight_bind resolves `module` [rows, cols] to, from headers
 * alone (data pointers NULL; the format's companions, the layer's stacked
 * NVFP4 experts, else the plain `module.weight`).  The INT4 group is read
 * from the scales' shape ([in/G, out]), which is the config's group for a
 * checkpoint that binds. */
static int weight_of(const clef_checkpoint *ck, const clef_quant_config *qc, const char *module, int64_t rows,
                     int64_t cols, clef_qweight *q, clef_err *err) {
    memset(q, 0, sizeof *q);
    q->rows = rows, q->cols = cols;
    const st_tensor *t;
    switch (qc->format) {
    case CLEF_QF_NVFP4_CT:
    case CLEF_QF_NVFP4_MODELOPT: {
        const int ct = qc->format == CLEF_QF_NVFP4_CT;
        t = find2(ck, module, ct ? "weight_packed" : "weight");
        int packed = t && t->dtype == CLEF_DT_U8;
        if (!packed && clef_expert_module(module, NULL, NULL)) { /* stacked per layer */
            char layer[320];
            snprintf(layer, sizeof layer, "%.*s", (int)(strstr(module, ".mlp.experts.") - module + 12), module);
            packed = find2(ck, layer, ct ? "gate_up_proj.weight_packed" : "gate_up_proj.weight") != NULL;
        }
        if (packed) {
            q->dtype = CLEF_DT_U8;
            q->quant = (clef_wquant){.type = CLEF_QT_NVFP4, .group = 16};
            return 0;
        }
        break;
    }
    case CLEF_QF_FP8_BLOCK:
        t = find2(ck, module, "weight");
        if (t && t->dtype == CLEF_DT_F8_E4M3) {
            q->dtype = CLEF_DT_F8_E4M3;
            q->quant = (clef_wquant){.type = CLEF_QT_FP8_BLOCK, .block_r = qc->block[0], .block_c = qc->block[1]};
            return 0;
        }
        break;
    case CLEF_QF_INT4_AUTOROUND:
        if (find2(ck, module, "qweight")) {
            const st_tensor *s = find2(ck, module, "scales");
            if (!s || s->ndim != 2 || s->shape[0] < 1 || cols % s->shape[0])
                return pl_fail(err, "module '%s': INT4 scales [in/G, out] missing or of an unexpected shape", module);
            q->dtype = CLEF_DT_I32;
            q->quant = (clef_wquant){.type = CLEF_QT_INT4_GPTQ, .group = cols / s->shape[0],
                                     .zeros = clef_quant_module_sym(qc, module) ? NULL : &zeros_mark};
            return 0;
        }
        break;
    default: break;
    }
    t = find2(ck, module, "weight");
    if (!t) return pl_fail(err, "tensor '%s.weight' not found", module);
    if (!plain_dtype(t->dtype) || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return pl_fail(err, "tensor '%s': expected a BF16/F16/F32 [%lld,%lld] weight, found %s with %d dims", t->name,
                       (long long)rows, (long long)cols, clef_dtype_name(t->dtype), t->ndim);
    q->dtype = t->dtype;
    return 0;
}

/* Accumulates device bytes while walking the model's bindings. */
typedef struct walk {
    const clef_checkpoint *ck;
    const clef_quant_config *qc;
    size_t stage; /* SLOT_STAGE: the largest staged weight */
    clef_err *err;
} walk;

/* A matrix bound by bind_mat: `*into` += its device bytes. */
static int mat(walk *w, size_t *into, const char *module, int64_t rows, int64_t cols) {
    clef_qweight q;
    if (weight_of(w->ck, w->qc, module, rows, cols, &q, w->err)) return -1;
    acc(into, clef_place_weight_bytes(&q));
    const size_t sb = stage_bytes(&q);
    if (sb > w->stage) w->stage = sb;
    return 0;
}

/* A vector bound by bind_vec (must exist, of length n). */
static int vec(walk *w, size_t *into, const char *name, int64_t n) {
    const st_tensor *t = clef_checkpoint_find(w->ck, name);
    if (!t) return pl_fail(w->err, "tensor '%s' not found", name);
    if (t->ndim != 1 || t->shape[0] != n)
        return pl_fail(w->err, "tensor '%s': expected shape [%lld]", name, (long long)n);
    acc(into, vec_bytes(n));
    return 0;
}

static int experts(walk *w, int64_t l, size_t *into) {
    const clef_text_config *c = &w->ck->config.text;
    const clef_layer_dims d = clef_layer_dims_of(c);
    const int64_t E = d.experts, H = d.hidden, NI = d.moe_inter;
    char nb[320];
    const st_tensor *gu = clef_checkpoint_find(w->ck, clef_fused_experts_name(nb, sizeof nb, l, 0));
    if (gu) { /* fused transformers-5 tensors, bound per expert (plain only) */
        const st_tensor *dn = clef_checkpoint_find(w->ck, clef_fused_experts_name(nb, sizeof nb, l, 1));
        if (!dn || !plain_dtype(gu->dtype) || !plain_dtype(dn->dtype))
            return pl_fail(w->err, "tensor '%s' (or its down_proj) missing or not BF16/F16/F32", gu->name);
        const clef_qweight g = {.dtype = gu->dtype, .rows = NI, .cols = H}, dq = {.dtype = dn->dtype, .rows = H, .cols = NI};
        acc(into, smul((size_t)E, sadd(smul(2, clef_place_weight_bytes(&g)), clef_place_weight_bytes(&dq))));
        return 0;
    }
    for (int64_t e = 0; e < E; e++)
        for (int p = 0; p < 3; p++) {
            int64_t r, k;
            clef_expert_shape(&d, p, &r, &k);
            if (mat(w, into, clef_expert_name(nb, sizeof nb, l, e, p, 0), r, k)) return -1;
        }
    return 0;
}

/* bind_qkv on a backend that copies weights: plain q, k, v of one dtype
 * become one weight, otherwise three. */
static int qkv(walk *w, int64_t l, size_t *into) {
    const clef_layer_dims d = clef_layer_dims_of(&w->ck->config.text);
    const int64_t H = d.hidden;
    static const int ids[3] = {CLEF_LT_Q_PROJ, CLEF_LT_K_PROJ, CLEF_LT_V_PROJ};
    clef_qweight q[3];
    int64_t rows[3], cols;
    int fuse = 1;
    for (int i = 0; i < 3; i++) {
        char nb[320];
        clef_layer_tensor_shape(&d, ids[i], &rows[i], &cols);
        if (weight_of(w->ck, w->qc, clef_layer_tensor_name(nb, sizeof nb, l, ids[i], 0), rows[i], cols, &q[i], w->err))
            return -1;
        fuse &= q[i].quant.type == CLEF_QT_NONE && q[i].dtype == q[0].dtype;
    }
    if (fuse) {
        const clef_qweight f = {.dtype = q[0].dtype, .rows = rows[0] + rows[1] + rows[2], .cols = H};
        acc(into, clef_place_weight_bytes(&f));
        return 0;
    }
    for (int i = 0; i < 3; i++) {
        acc(into, clef_place_weight_bytes(&q[i]));
        const size_t sb = stage_bytes(&q[i]);
        if (sb > w->stage) w->stage = sb;
    }
    return 0;
}

static int thinker(walk *w, clef_place_sizes *s) {
    const clef_text_config *c = &w->ck->config.text;
    const int64_t V = c->vocab_size, H = c->hidden_size, D = c->head_dim;
    size_t *dense = &s->dense_bytes;
    char tb[320];
    if (mat(w, dense, clef_thinker_tensor_name(tb, sizeof tb, CLEF_TT_EMBED, 0), V, H) ||
        mat(w, dense, clef_thinker_tensor_name(tb, sizeof tb, CLEF_TT_LM_HEAD, 0), V, H) ||
        vec(w, dense, clef_thinker_tensor_name(tb, sizeof tb, CLEF_TT_FINAL_NORM, 1), H))
        return -1;
    acc(dense, vec_bytes(D / 2)); /* rope inv_freq */
    const clef_layer_dims d = clef_layer_dims_of(c);
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        const int moe = clef_layer_is_moe(c, l);
        for (int id = 0; id < CLEF_LT_COUNT; id++) { /* the table's tensors of this layer, as bind_layer binds them */
            if (!clef_layer_has_tensor(id, moe)) continue;
            if (id == CLEF_LT_K_PROJ || id == CLEF_LT_V_PROJ) continue; /* with q: qkv() */
            if (id == CLEF_LT_Q_PROJ) {
                if (qkv(w, l, dense)) return -1;
                continue;
            }
            char nb[320];
            int vector = 0;
            int64_t r, k;
            clef_layer_tensor_module(id, &vector, NULL);
            clef_layer_tensor_shape(&d, id, &r, &k);
            if (vector ? vec(w, dense, clef_layer_tensor_name(nb, sizeof nb, l, id, 1), r)
                       : mat(w, dense, clef_layer_tensor_name(nb, sizeof nb, l, id, 0), r, k))
                return -1;
        }
        if (moe && experts(w, l, &s->expert_bytes[l])) return -1;
    }
    return 0;
}

/* bind_mha: in_proj_weight [3W, W] is uploaded three times (whole, q rows,
 * k|v rows), plus in_proj_bias, out_proj, out_proj.bias. */
static int mha(walk *w, size_t *into, const char *prefix) {
    const int64_t W = w->ck->config.head.width;
    char nb[320];
    snprintf(nb, sizeof nb, "%s.in_proj_weight", prefix);
    const st_tensor *t = clef_checkpoint_find(w->ck, nb);
    if (!t || !plain_dtype(t->dtype)) return pl_fail(w->err, "tensor '%s' missing or not BF16/F16/F32", nb);
    const clef_qweight a = {.dtype = t->dtype, .rows = 3 * W, .cols = W}, q = {.dtype = t->dtype, .rows = W, .cols = W},
                       kv = {.dtype = t->dtype, .rows = 2 * W, .cols = W};
    acc(into, sadd(sadd(clef_place_weight_bytes(&a), clef_place_weight_bytes(&q)), clef_place_weight_bytes(&kv)));
    char mb[320];
    snprintf(nb, sizeof nb, "%s.in_proj_bias", prefix);
    snprintf(mb, sizeof mb, "%s.out_proj", prefix);
    if (vec(w, into, nb, 3 * W) || mat(w, into, mb, W, W)) return -1;
    snprintf(nb, sizeof nb, "%s.out_proj.bias", prefix);
    return vec(w, into, nb, W);
}

static int ln(walk *w, size_t *into, const char *prefix, int64_t n) {
    char nb[320];
    snprintf(nb, sizeof nb, "%s.weight", prefix);
    if (vec(w, into, nb, n)) return -1;
    snprintf(nb, sizeof nb, "%s.bias", prefix);
    return vec(w, into, nb, n);
}

static int linear(walk *w, size_t *into, const char *prefix, int64_t rows, int64_t cols) {
    char nb[320];
    snprintf(nb, sizeof nb, "%s.bias", prefix);
    return mat(w, into, prefix, rows, cols) || vec(w, into, nb, rows) ? -1 : 0;
}

static int head(walk *w, size_t *into) {
    const clef_head_config *hc = &w->ck->config.head;
    const int64_t H = hc->hidden_size, W = hc->width, F = hc->feedforward;
    static const char *const proj[6] = {"memory_projection", "question_projection", "option_question_projection",
                                        "global_projection", "option_context_projection", "option_lexical_projection"};
    if (ln(w, into, "hidden_norm", H)) return -1;
    for (int i = 0; i < 6; i++)
        if (mat(w, into, proj[i], W, H)) return -1;
    if (mat(w, into, "type_embedding", 3, W) || ln(w, into, "option_summary_norm", W) ||
        ln(w, into, "field_norm", W) || ln(w, into, "option_norm", W) ||
        linear(w, into, "residual_scorer.0", W, 4 * W) || linear(w, into, "residual_scorer.3", 1, W))
        return -1;
    char nb[320];
    for (int64_t i = 0; i < hc->routing_layers; i++) {
        const long long li = (long long)i;
#define EV(sfx) (snprintf(nb, sizeof nb, "evidence_layers.%lld." sfx, li), nb)
        if (ln(w, into, EV("query_norm"), W) || ln(w, into, EV("memory_norm"), W) ||
            ln(w, into, EV("feedforward_norm"), W) || mha(w, into, EV("attention")) ||
            linear(w, into, EV("feedforward.0"), F, W) || linear(w, into, EV("feedforward.3"), W, F))
            return -1;
#undef EV
    }
    for (int64_t i = 0; i < hc->layers; i++) {
        const long long li = (long long)i;
#define DL(sfx) (snprintf(nb, sizeof nb, "layers.%lld." sfx, li), nb)
        if (mha(w, into, DL("self_attn")) || mha(w, into, DL("multihead_attn")) ||
            linear(w, into, DL("linear1"), F, W) || linear(w, into, DL("linear2"), W, F) ||
            ln(w, into, DL("norm1"), W) || ln(w, into, DL("norm2"), W) || ln(w, into, DL("norm3"), W))
            return -1;
#undef DL
    }
    return 0;
}

/* The towers as towers.c binds them, approximated from the catalog: every
 * thinker.visual.* / thinker.audio_tower.* tensor as stored, widened as the
 * backend holds it — 1-d tensors and the position table as f32 vectors,
 * matrices (conv kernels flattened to [out, prod(rest)]) bf16 or f32, f32
 * when a row is not a multiple of 8 values. */
static size_t towers(const clef_checkpoint *ck) {
    size_t b = 0;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const st_tensor *t = ck->catalog[i];
        if (strncmp(t->name, "thinker.visual.", 15) && strncmp(t->name, "thinker.audio_tower.", 20)) continue;
        if (t->ndim <= 1 || !strcmp(t->name, "thinker.visual.pos_embed.weight")) {
            b = sadd(b, vec_bytes((int64_t)t->numel));
            continue;
        }
        int64_t cols = 1;
        for (int d = 1; d < t->ndim; d++) cols *= t->shape[d];
        const clef_qweight q = {.dtype = cols % 8 ? CLEF_DT_F32 : t->dtype, .rows = t->shape[0], .cols = cols};
        b = sadd(b, clef_place_weight_bytes(&q));
    }
    return b;
}

int clef_place_sizes_of_checkpoint(const struct clef_checkpoint *ck, const clef_config *cfg,
                                   const clef_quant_config *qc, int text_only, size_t batch_tokens,
                                   clef_place_sizes *s, clef_err *err) {
    memset(s, 0, sizeof *s);
    if (cfg->text.num_hidden_layers < 1 || cfg->text.num_hidden_layers > CLEF_MAX_LAYERS)
        return pl_fail(err, "config: %lld decoder layers (1 to %d)", (long long)cfg->text.num_hidden_layers,
                       CLEF_MAX_LAYERS);
    /* the walk reads the shapes from ck->config; a caller's cfg must be that one */
    clef_checkpoint view = *ck;
    view.config = *cfg;
    walk w = {.ck = &view, .qc = qc, .err = err};
    s->n_layers = cfg->text.num_hidden_layers;
    if (thinker(&w, s) || head(&w, &s->dense_bytes)) {
        memset(s, 0, sizeof *s);
        return -1;
    }
    s->tower_bytes = text_only ? 0 : towers(ck);
    s->batch_tokens = batch_tokens;
    s->workspace_bytes = sadd(clef_place_workspace_bytes(cfg, batch_tokens), w.stage);
    s->context_bytes = CLEF_PLACE_CONTEXT_BYTES;
    return 0;
}

/* ---- sizes of a synthetic preset, without drawing it ---- */

static int by_name(const void *a, const void *b) {
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

/* Header of a companion `module.sfx`. */
static void companion(st_tensor *t, char **names, size_t *nn, const char *module, const char *sfx, clef_dtype dt,
                      int ndim, int64_t d0, int64_t d1) {
    clef_buf b = {0};
    clef_buf_printf(&b, "%s.%s", module, sfx);
    names[(*nn)++] = b.data;
    *t = (st_tensor){.name = b.data, .dtype = dt, .ndim = ndim, .shape = {d0, d1}};
    t->numel = ndim == 0 ? 1 : (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    t->nbytes = t->numel * clef_dtype_size(dt);
}

int clef_place_sizes_of_preset(const char *preset, const char *quant, int text_only, size_t batch_tokens,
                               clef_place_sizes *s, clef_err *err) {
    memset(s, 0, sizeof *s);
    const clef_synth_preset *pr = clef_synth_preset_find(preset, err);
    if (!pr) return -1;
    clef_quant_format f = CLEF_QF_NONE;
    if (quant && *quant && strcasecmp(quant, "bf16") && clef_quant_format_parse(quant, &f) != 0)
        return clef_fail(err, 400, CLEF_E_REQUEST, "quant",
                         "unknown quantized format '%s' (int4, fp8-block, nvfp4 or nvfp4-modelopt)", quant);
    /* the config as clef_checkpoint_synthetic / clef_qsynth_checkpoint parse it */
    clef_checkpoint ck;
    memset(&ck, 0, sizeof ck);
    clef_buf cj = {0}, hj = {0};
    clef_synth_config_json(pr, 0, &cj);
    clef_synth_head_config_json(pr, &hj);
    int rc = clef_config_parse(cj.data, cj.len, hj.data, hj.len, &ck.config, err);
    clef_buf_free(&cj);
    clef_buf_free(&hj);
    if (rc) return -1;
    /* the tensors the generator would draw (headers only), experts replaced
     * by the companions clef quantize writes (quant/convert.c companions_of:
     * INT4 group min(in, 128), symmetric; FP8 blocks 128x128; per-expert) */
    clef_synth_plan plan, tw;
    clef_synth_plan_make(pr, 0, 0, &plan);
    clef_synth_towers_plan_make(pr, 0, &tw);
    const size_t cap = 3 * (plan.n + tw.n) + 1;
    st_tensor *hdr = clef_xcalloc(cap, sizeof *hdr);
    char **names = clef_xcalloc(cap, sizeof *names);
    size_t n = 0, nn = 0;
    for (size_t pass = 0; pass < 2; pass++) {
        const clef_synth_plan *p = pass ? &tw : &plan;
        for (size_t i = 0; i < p->n; i++) {
            const clef_synth_tensor *g = &p->t[i];
            const size_t len = strlen(g->name);
            if (f != CLEF_QF_NONE && len > 7 && !strcmp(g->name + len - 7, ".weight") && g->ndim == 2) {
                char module[320];
                snprintf(module, sizeof module, "%.*s", (int)(len - 7), g->name);
                if (clef_expert_module(module, NULL, NULL)) {
                    const int64_t R = g->shape[0], C = g->shape[1], G = C < 128 ? C : 128;
                    switch (f) {
                    case CLEF_QF_NVFP4_CT:
                    case CLEF_QF_NVFP4_MODELOPT: {
                        const int ct = f == CLEF_QF_NVFP4_CT;
                        companion(&hdr[n++], names, &nn, module, ct ? "weight_packed" : "weight", CLEF_DT_U8, 2, R, C / 2);
                        companion(&hdr[n++], names, &nn, module, "weight_scale", CLEF_DT_F8_E4M3, 2, R, C / 16);
                        companion(&hdr[n++], names, &nn, module, ct ? "weight_global_scale" : "weight_scale_2",
                                  CLEF_DT_F32, ct ? 1 : 0, 1, 0);
                        break;
                    }
                    case CLEF_QF_FP8_BLOCK:
                        companion(&hdr[n++], names, &nn, module, "weight", CLEF_DT_F8_E4M3, 2, R, C);
                        companion(&hdr[n++], names, &nn, module, "weight_scale_inv", CLEF_DT_F32, 2, (R + 127) / 128,
                                  (C + 127) / 128);
                        break;
                    default:
                        companion(&hdr[n++], names, &nn, module, "qweight", CLEF_DT_I32, 2, C / 8, R);
                        companion(&hdr[n++], names, &nn, module, "qzeros", CLEF_DT_I32, 2, C / G, R / 8);
                        companion(&hdr[n++], names, &nn, module, "scales", CLEF_DT_F16, 2, C / G, R);
                        break;
                    }
                    continue;
                }
            }
            st_tensor *t = &hdr[n++];
            *t = (st_tensor){.name = g->name, .dtype = CLEF_DT_BF16, .ndim = g->ndim, .numel = g->numel,
                             .nbytes = g->numel * 2};
            memcpy(t->shape, g->shape, sizeof g->shape);
        }
    }
    ck.catalog = clef_xcalloc(n + 1, sizeof *ck.catalog);
    for (size_t i = 0; i < n; i++) ck.catalog[i] = &hdr[i];
    ck.n_tensors = n;
    qsort(ck.catalog, n, sizeof *ck.catalog, by_name);
    clef_quant_config qc;
    memset(&qc, 0, sizeof qc);
    qc.format = f;
    qc.group_size = f == CLEF_QF_INT4_AUTOROUND ? 128 : f == CLEF_QF_NONE || f == CLEF_QF_FP8_BLOCK ? 0 : 16;
    qc.block[0] = qc.block[1] = 128;
    qc.bits = 4;
    qc.sym = 1;
    rc = clef_place_sizes_of_checkpoint(&ck, &ck.config, &qc, text_only, batch_tokens, s, err);
    free(ck.catalog);
    for (size_t i = 0; i < nn; i++) free(names[i]);
    free(names);
    free(hdr);
    clef_synth_plan_free(&plan);
    clef_synth_plan_free(&tw);
    return rc;
}

/* ---- the plan ---- */

/* Sizes as the plan prints them: GiB with two decimals everywhere; a
 * non-zero size under 0.005 GiB is "<0.01 GiB", never "0.00 GiB".  `up`
 * rounds up to the next hundredth (a "needs" figure that is enough). */
static const char *gibs(char buf[32], size_t b, int up) {
    if (b == 0) snprintf(buf, 32, "0.00 GiB");
    else if (up) snprintf(buf, 32, "%.2f GiB", ceil((double)b / GIB * 100.0 - 1e-9) / 100.0);
    else if ((double)b / GIB < 0.005) snprintf(buf, 32, "<0.01 GiB");
    else snprintf(buf, 32, "%.2f GiB", (double)b / GIB);
    return buf;
}

/* "1 layer", "3 layers" */
static const char *layers_n(char buf[32], int64_t n) {
    snprintf(buf, 32, "%lld layer%s", (long long)n, n == 1 ? "" : "s");
    return buf;
}

/* The even spread: of m MoE layers, MoE layer j is streamed iff
 * floor((j + 1) n / m) > floor(j n / m). */
static int spread(int64_t j, int64_t n, int64_t m) { return (j + 1) * n / m > j * n / m; }

size_t clef_place_fixed_bytes(const clef_place_sizes *s) {
    return sadd(sadd(s->dense_bytes, s->tower_bytes), sadd(s->workspace_bytes, s->context_bytes));
}

/* The layers' experts: the layer count (n_layers clamped to [0, CLEF_MAX_LAYERS]), their bytes in
 * all (saturating), the largest layer's (one slot) and how many layers have experts (MoE). */
static int64_t expert_totals(const clef_place_sizes *s, size_t *total, size_t *slot, int64_t *moe) {
    const int64_t L = s->n_layers < 0 ? 0 : s->n_layers > CLEF_MAX_LAYERS ? CLEF_MAX_LAYERS : s->n_layers;
    *total = *slot = 0;
    *moe = 0;
    for (int64_t l = 0; l < L; l++) {
        *total = sadd(*total, s->expert_bytes[l]);
        if (s->expert_bytes[l] > *slot) *slot = s->expert_bytes[l];
        *moe += s->expert_bytes[l] > 0;
    }
    return L;
}

size_t clef_place_min_bytes(const clef_place_sizes *s, int *streaming) {
    size_t total, slot;
    int64_t moe;
    expert_totals(s, &total, &slot, &moe);
    const size_t fixed = clef_place_fixed_bytes(s), all = sadd(fixed, total), slots = sadd(fixed, smul(2, slot));
    if (streaming) *streaming = slots < all;
    return slots < all ? slots : all;
}

size_t clef_place_max_record(size_t max_length, const clef_place_sizes *s) {
    return s->batch_tokens && s->batch_tokens < max_length ? s->batch_tokens : max_length;
}

/* The advice of a plan that does not fit, naming only the flags `advice` holds (CLEF_PLACE_ADV_*). */
static void advise(char *o, size_t cap, const clef_place_sizes *s, unsigned advice, const char *need) {
    size_t n = 0;
    n += (size_t)snprintf(o + n, cap - n, "; use ");
    if (advice & CLEF_PLACE_ADV_MAX_BATCH_TOKENS) n += (size_t)snprintf(o + n, cap > n ? cap - n : 0, "--max-batch-tokens lower, ");
    else if (advice & CLEF_PLACE_ADV_MAX_LENGTH) n += (size_t)snprintf(o + n, cap > n ? cap - n : 0, "--max-length lower, ");
    if (s->tower_bytes && (advice & (CLEF_PLACE_ADV_TEXT_ONLY | CLEF_PLACE_ADV_TOWERS_CPU)))
        n += (size_t)snprintf(o + n, cap > n ? cap - n : 0, "%s, ",
                              (advice & CLEF_PLACE_ADV_TEXT_ONLY) && (advice & CLEF_PLACE_ADV_TOWERS_CPU)
                                  ? "--text-only or --towers cpu"
                              : advice & CLEF_PLACE_ADV_TEXT_ONLY ? "--text-only"
                                                                  : "--towers cpu");
    snprintf(o + n, cap > n ? cap - n : 0, "a smaller format, or a budget of at least %s", need);
}

void clef_place_plan_make(const clef_place_sizes *s, size_t budget, unsigned advice, clef_place_plan *p) {
    memset(p, 0, sizeof *p);
    p->budget = budget;
    size_t total, slot;
    int64_t m; /* MoE layers */
    const int64_t L = expert_totals(s, &total, &slot, &m);
    p->n_layers = L;
    const size_t fixed = clef_place_fixed_bytes(s);
    const size_t all = sadd(fixed, total), need = sadd(fixed, smul(2, slot));
    char g1[32], g2[32], g3[32], g4[32], g5[32], g6[32], ln[32];
    /* SIZE_MAX is a saturated sum (a size past what size_t holds): it never fits */
    if (all != SIZE_MAX && (budget == 0 || all <= budget)) {
        p->fits = 1;
        p->n_resident = m;
        p->device_bytes = all;
        const char *who = L == 1 ? "the 1 layer" : (snprintf(ln, sizeof ln, "all %lld layers", (long long)L), ln);
        if (budget)
            snprintf(p->message, sizeof p->message, "plan: %s resident, %s of %s", who, gibs(g1, all, 0),
                     gibs(g2, budget, 0));
        else
            snprintf(p->message, sizeof p->message, "plan: no GPU memory budget (--gpu-memory): %s resident, %s", who,
                     gibs(g1, all, 0));
        return;
    }
    int streaming = 0;
    const size_t least = clef_place_min_bytes(s, &streaming);
    if (!streaming || need == SIZE_MAX || need > budget) {
        /* the smallest plan: two slots and everything streamed, or everything resident when that is less
         * (a model of one or two MoE layers, or one much larger layer) */
        char towers_part[64] = "", experts_part[96] = "", advice_part[192];
        if (s->tower_bytes) snprintf(towers_part, sizeof towers_part, ", towers %s", gibs(g1, s->tower_bytes, 0));
        if (streaming) snprintf(experts_part, sizeof experts_part, ", two expert slots %s", gibs(g2, smul(2, slot), 0));
        else if (total) snprintf(experts_part, sizeof experts_part, ", every layer's experts resident %s", gibs(g2, total, 0));
        gibs(g6, least, 1);
        advise(advice_part, sizeof advice_part, s, advice, g6);
        snprintf(p->message, sizeof p->message,
                 "does not fit in %s: the smallest plan needs %s (non-expert weights %s%s, workspace for %zu tokens "
                 "%s, context %s%s)%s",
                 gibs(g3, budget, 0), g6, gibs(g4, s->dense_bytes, 0), towers_part, s->batch_tokens,
                 gibs(g5, s->workspace_bytes, 0), gibs(g1, s->context_bytes, 0), experts_part, advice_part);
        return;
    }
    /* the fewest streamed layers n (the most resident) that fit; n = m always does */
    for (int64_t n = 1; n <= m; n++) {
        size_t streamed = 0;
        for (int64_t l = 0, j = 0; l < L; l++) {
            if (!s->expert_bytes[l]) continue;
            if (spread(j, n, m)) streamed = sadd(streamed, s->expert_bytes[l]);
            j++;
        }
        if (sadd(need, total - streamed) > budget && n < m) continue;
        for (int64_t l = 0, j = 0; l < L; l++) {
            if (!s->expert_bytes[l]) continue;
            p->streamed[l] = (uint8_t)spread(j, n, m);
            j++;
        }
        p->fits = 1;
        p->n_streamed = n;
        p->n_resident = m - n;
        p->slot_bytes = slot;
        p->streamed_bytes = p->pinned_bytes = streamed;
        p->device_bytes = sadd(need, total - streamed);
        snprintf(p->message, sizeof p->message,
                 "plan: %lld of %lld layers' experts resident, %lld streamed (%s a forward from pinned host memory), "
                 "%s of %s",
                 (long long)p->n_resident, (long long)m, (long long)n, gibs(g1, streamed, 0),
                 gibs(g2, p->device_bytes, 0), gibs(g3, budget, 0));
        return;
    }
}

static void line(FILE *f, const char *what, size_t b, const char *note) {
    char g[32];
    fprintf(f, "  %-20s %12s %14zu bytes%s%s\n", what, gibs(g, b, 0), b, note && *note ? "  " : "", note ? note : "");
}

void clef_place_plan_print(const clef_place_sizes *s, const clef_place_plan *p, FILE *f) {
    char note[160], ln[32];
    fprintf(f, "%s\n", p->message);
    if (p->budget) line(f, "budget", p->budget, "--gpu-memory");
    else fprintf(f, "  %-20s %8s\n", "budget", "none");
    line(f, "non-expert weights", s->dense_bytes, "embeddings, lm_head, attention, routers, norms, joint head");
    if (s->tower_host_bytes)
        line(f, "towers", 0, "on the CPU (--towers cpu): not on the GPU");
    else
        line(f, "towers", s->tower_bytes, s->tower_bytes ? "vision + audio" : "text only");
    if (p->budget)
        snprintf(note, sizeof note, "a forward of %zu tokens; a longer record is refused, or its state cut", s->batch_tokens);
    else
        snprintf(note, sizeof note, "a forward of %zu tokens", s->batch_tokens);
    line(f, "workspace", s->workspace_bytes, note);
    line(f, "context", s->context_bytes, "CUDA context, cuBLASLt, driver, 256 MiB margin");
    size_t resident = 0, all = 0;
    int64_t m = 0;
    for (int64_t l = 0; l < p->n_layers; l++) {
        all = sadd(all, s->expert_bytes[l]);
        m += s->expert_bytes[l] > 0;
        if (!p->streamed[l]) resident = sadd(resident, s->expert_bytes[l]);
    }
    if (p->fits) {
        snprintf(note, sizeof note, "%lld of %lld MoE layer%s", (long long)p->n_resident, (long long)m, m == 1 ? "" : "s");
        line(f, "resident experts", resident, note);
        snprintf(note, sizeof note, "2 x %zu bytes", p->slot_bytes);
        line(f, "expert slots", 2 * p->slot_bytes, note);
        line(f, "device total", p->device_bytes, NULL);
        snprintf(note, sizeof note, "%s, pinned host memory, copied every forward", layers_n(ln, p->n_streamed));
        line(f, "streamed experts", p->streamed_bytes, note);
    } else {
        snprintf(note, sizeof note, "%lld MoE layer%s", (long long)m, m == 1 ? "" : "s");
        line(f, "all experts", all, note);
    }
    if (s->tower_host_bytes) line(f, "host: towers", s->tower_host_bytes, "vision + audio on the CPU backend (--towers cpu)");
    fprintf(f, "streamed:");
    if (!p->n_streamed) fprintf(f, " none");
    for (int64_t l = 0; l < p->n_layers; l++)
        if (p->streamed[l]) fprintf(f, " %lld", (long long)l);
    fprintf(f, "\n");
}

void clef_place_towers_on_host(clef_place_sizes *s) {
    s->tower_host_bytes = sadd(s->tower_host_bytes, s->tower_bytes);
    s->tower_bytes = 0;
}
