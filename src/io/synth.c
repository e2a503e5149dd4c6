/* synth.c — synthetic Clef-Omni checkpoints: presets, the tensor plan, the
 * counter-based weight generator, the streaming writer (`clef synth`) and the
 * in-memory checkpoint (clef_checkpoint_synthetic).  See io/synth.h. */
#include "io/synth.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/st_write.h"
#include "io/tensor_names.h"
#include "json/json.h"
#include "util/file.h"
#include "util/timer.h"

/* ---- presets ------------------------------------------------------------ */

static const clef_synth_preset PRESETS[] = {
    {.name = "tiny", .vocab = 152064, .hidden = 32, .layers = 3, .heads = 4, .kv_heads = 2, .head_dim = 16,
     .experts = 8, .experts_per_tok = 2, .moe_inter = 16, .inter = 64, .mrope_section = {4, 2, 2},
     .head_width = 64, .head_heads = 4, .head_ff = 128, .head_routing_layers = 2, .head_layers = 4},
    {.name = "small", .vocab = 152064, .hidden = 2048, .layers = 4, .heads = 32, .kv_heads = 4, .head_dim = 128,
     .experts = 128, .experts_per_tok = 8, .moe_inter = 768, .inter = 768, .mrope_section = {24, 20, 20},
     .head_width = 1024, .head_heads = 16, .head_ff = 4096, .head_routing_layers = 2, .head_layers = 4,
     .vision_depth = 4, .vision_deepstack = {1, 2, 3}, .audio_layers = 4},
    {.name = "full", .vocab = 152064, .hidden = 2048, .layers = 48, .heads = 32, .kv_heads = 4, .head_dim = 128,
     .experts = 128, .experts_per_tok = 8, .moe_inter = 768, .inter = 768, .mrope_section = {24, 20, 20},
     .head_width = 1024, .head_heads = 16, .head_ff = 4096, .head_routing_layers = 2, .head_layers = 4,
     .vision_depth = 27, .vision_deepstack = {8, 16, 24}, .audio_layers = 32},
};

const clef_synth_preset *clef_synth_preset_find(const char *name, clef_err *err) {
    for (size_t i = 0; name && i < sizeof PRESETS / sizeof *PRESETS; i++)
        if (strcmp(PRESETS[i].name, name) == 0) return &PRESETS[i];
    clef_fail(err, 500, CLEF_E_INTERNAL, "synthetic", "unknown synthetic preset '%s' (tiny, small or full)",
              name ? name : "(none)");
    return NULL;
}

/* ---- config files ------------------------------------------------------- */

/* The token ids of the real thinker_config (SPEC §6.1). */
#define TOK_IMAGE 151655
#define TOK_VIDEO 151656
#define TOK_AUDIO 151675
#define TOK_AUDIO_START 151669
#define TOK_VISION_START 151652

static void text_config_json(const clef_synth_preset *p, clef_buf *b) {
    clef_buf_printf(b,
                    "{\n"
                    "      \"attention_bias\": false,\n"
                    "      \"attention_dropout\": 0.0,\n"
                    "      \"decoder_sparse_step\": 1,\n"
                    "      \"head_dim\": %lld,\n"
                    "      \"hidden_act\": \"silu\",\n"
                    "      \"hidden_size\": %lld,\n"
                    "      \"initializer_range\": 0.02,\n"
                    "      \"intermediate_size\": %lld,\n"
                    "      \"max_position_embeddings\": 65536,\n"
                    "      \"mlp_only_layers\": [],\n"
                    "      \"model_type\": \"qwen3_omni_moe_text\",\n"
                    "      \"moe_intermediate_size\": %lld,\n"
                    "      \"norm_topk_prob\": true,\n"
                    "      \"num_attention_heads\": %lld,\n"
                    "      \"num_experts\": %lld,\n"
                    "      \"num_experts_per_tok\": %lld,\n"
                    "      \"num_hidden_layers\": %lld,\n"
                    "      \"num_key_value_heads\": %lld,\n"
                    "      \"output_router_logits\": false,\n"
                    "      \"rms_norm_eps\": 1e-06,\n"
                    "      \"rope_parameters\": {\n"
                    "        \"interleaved\": true,\n"
                    "        \"mrope_interleaved\": true,\n"
                    "        \"mrope_section\": [%lld, %lld, %lld],\n"
                    "        \"rope_theta\": 1000000.0,\n"
                    "        \"rope_type\": \"default\"\n"
                    "      },\n"
                    "      \"router_aux_loss_coef\": 0.001,\n"
                    "      \"sliding_window\": null,\n"
                    "      \"tie_word_embeddings\": false,\n"
                    "      \"use_cache\": true,\n"
                    "      \"vocab_size\": %lld\n"
                    "    }",
                    (long long)p->head_dim, (long long)p->hidden, (long long)p->inter, (long long)p->moe_inter,
                    (long long)p->heads, (long long)p->experts, (long long)p->experts_per_tok, (long long)p->layers,
                    (long long)p->kv_heads, (long long)p->mrope_section[0], (long long)p->mrope_section[1],
                    (long long)p->mrope_section[2], (long long)p->vocab);
}

/* The real Qwen3-Omni-30B-A3B tower widths (thinker_config.vision_config /
 * audio_config of the release); the depths come from the preset. */
#define TW_V_HIDDEN 1152
#define TW_V_HEADS 16
#define TW_V_INTER 4304
#define TW_V_POS 2304
#define TW_A_DMODEL 1280
#define TW_A_HEADS 20
#define TW_A_FFN 5120
#define TW_A_CONV 480
#define TW_A_MEL 128
#define TW_OUT 2048

static int has_towers(const clef_synth_preset *p) { return p->vision_depth > 0 && p->audio_layers > 0; }

/* ",\n    \"audio_config\": {...},\n    \"vision_config\": {...}" (nothing
 * without towers). */
static void towers_config_json(const clef_synth_preset *p, clef_buf *b) {
    if (!has_towers(p)) return;
    clef_buf_printf(b,
                    ",\n"
                    "    \"audio_config\": {\n"
                    "      \"activation_function\": \"gelu\",\n"
                    "      \"conv_chunksize\": 500,\n"
                    "      \"d_model\": %d,\n"
                    "      \"downsample_hidden_size\": %d,\n"
                    "      \"encoder_attention_heads\": %d,\n"
                    "      \"encoder_ffn_dim\": %d,\n"
                    "      \"encoder_layers\": %lld,\n"
                    "      \"max_source_positions\": 1500,\n"
                    "      \"model_type\": \"qwen3_omni_moe_audio_encoder\",\n"
                    "      \"n_window\": 50,\n"
                    "      \"n_window_infer\": 800,\n"
                    "      \"num_mel_bins\": %d,\n"
                    "      \"output_dim\": %d,\n"
                    "      \"scale_embedding\": false\n"
                    "    },\n"
                    "    \"vision_config\": {\n"
                    "      \"deepstack_visual_indexes\": [%lld, %lld, %lld],\n"
                    "      \"depth\": %lld,\n"
                    "      \"hidden_act\": \"gelu_pytorch_tanh\",\n"
                    "      \"hidden_size\": %d,\n"
                    "      \"in_channels\": 3,\n"
                    "      \"intermediate_size\": %d,\n"
                    "      \"model_type\": \"qwen3_omni_moe_vision_encoder\",\n"
                    "      \"num_heads\": %d,\n"
                    "      \"num_position_embeddings\": %d,\n"
                    "      \"out_hidden_size\": %d,\n"
                    "      \"patch_size\": 16,\n"
                    "      \"rope_parameters\": {\"rope_theta\": 10000.0, \"rope_type\": \"axial\"},\n"
                    "      \"spatial_merge_size\": 2,\n"
                    "      \"temporal_patch_size\": 2\n"
                    "    }",
                    TW_A_DMODEL, TW_A_CONV, TW_A_HEADS, TW_A_FFN, (long long)p->audio_layers, TW_A_MEL, TW_OUT,
                    (long long)p->vision_deepstack[0], (long long)p->vision_deepstack[1],
                    (long long)p->vision_deepstack[2], (long long)p->vision_depth, TW_V_HIDDEN, TW_V_INTER, TW_V_HEADS,
                    TW_V_POS, TW_OUT);
}

void clef_synth_config_json(const clef_synth_preset *p, uint64_t seed, clef_buf *out) {
    clef_buf_printf(out,
                    "{\n"
                    "  \"architectures\": [\"Qwen3OmniMoeForConditionalGeneration\"],\n"
                    "  \"assistant_token_id\": 77091,\n"
                    "  \"clef_synthetic\": {\"preset\": \"%s\", \"seed\": %llu, \"towers\": %s},\n"
                    "  \"enable_audio_output\": false,\n"
                    "  \"im_end_token_id\": 151645,\n"
                    "  \"im_start_token_id\": 151644,\n"
                    "  \"initializer_range\": 0.02,\n"
                    "  \"model_type\": \"qwen3_omni_moe\",\n"
                    "  \"system_token_id\": 8948,\n"
                    "  \"thinker_config\": {\n"
                    "    \"audio_start_token_id\": %d,\n"
                    "    \"audio_token_id\": %d,\n"
                    "    \"image_token_id\": %d,\n"
                    "    \"initializer_range\": 0.02,\n"
                    "    \"model_type\": \"qwen3_omni_moe_thinker\",\n"
                    "    \"position_id_per_seconds\": 13,\n"
                    "    \"text_config\": ",
                    p->name, (unsigned long long)seed, has_towers(p) ? "true" : "false", TOK_AUDIO_START, TOK_AUDIO,
                    TOK_IMAGE);
    text_config_json(p, out);
    towers_config_json(p, out);
    clef_buf_printf(out,
                    ",\n"
                    "    \"tie_word_embeddings\": false,\n"
                    "    \"user_token_id\": 872,\n"
                    "    \"video_token_id\": %d,\n"
                    "    \"vision_start_token_id\": %d\n"
                    "  },\n"
                    "  \"transformers_version\": \"5.17.0\",\n"
                    "  \"tts_bos_token_id\": 151672,\n"
                    "  \"tts_eos_token_id\": 151673,\n"
                    "  \"tts_pad_token_id\": 151671,\n"
                    "  \"user_token_id\": 872\n"
                    "}\n",
                    TOK_VIDEO, TOK_VISION_START);
}

void clef_synth_head_config_json(const clef_synth_preset *p, clef_buf *out) {
    clef_buf_printf(out,
                    "{\"hidden_size\": %lld, \"width\": %lld, \"routing_layers\": %lld, \"layers\": %lld, "
                    "\"heads\": %lld, \"feedforward\": %lld}\n",
                    (long long)p->hidden, (long long)p->head_width, (long long)p->head_routing_layers,
                    (long long)p->head_layers, (long long)p->head_heads, (long long)p->head_ff);
}

/* ---- the generator -------------------------------------------------------- */

#define SM_GAMMA 0x9E3779B97F4A7C15ULL

/* splitmix64's output function: a bijective 64-bit mix. */
static inline uint64_t sm_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Per-tensor stream key: FNV-1a of the name, mixed with the seed. */
static uint64_t tensor_key(uint64_t seed, const char *name) {
    uint64_t h = 0xCBF29CE484222325ULL;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) h = (h ^ *c) * 0x100000001B3ULL;
    return sm_mix(h ^ sm_mix(seed + SM_GAMMA));
}

/* f32 -> bf16, round to nearest even (values here are always finite). */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Irwin–Hall(4) of 16-bit lanes: 2*sum - 4*65535 is an even integer in
 * [-262140, 262140] with standard deviation 131072/sqrt(3)·(1 - 2^-32)^½;
 * Z_SCALE makes it unit variance. */
#define Z_SCALE (1.7320508075688772 / 131072.0)

/* The Irwin–Hall integer of element `i` of stream `key`. */
static inline int32_t ih_int(uint64_t key, size_t i) {
    uint64_t x = sm_mix(key + (uint64_t)(i + 1) * SM_GAMMA);
    uint32_t s = (uint32_t)(x & 0xFFFF) + (uint32_t)((x >> 16) & 0xFFFF) + (uint32_t)((x >> 32) & 0xFFFF) +
                 (uint32_t)(x >> 48);
    return 2 * (int32_t)s - 4 * 65535;
}

void clef_synth_fill(const clef_synth_tensor *t, size_t first, size_t count, uint16_t *out) {
    const uint64_t key = t->key;
    const size_t par = (size_t)1 << 16;
    if (t->mean == 0.0) {
        /* c (|c| < 2^19) and the scale are exact floats, so c * a is one
         * correctly rounded product: the same on every machine. */
        const float a = (float)(t->std * Z_SCALE);
#pragma omp parallel for schedule(static) if (count >= par)
        for (size_t i = 0; i < count; i++) out[i] = to_bf16((float)ih_int(key, first + i) * a);
        return;
    }
    /* With a mean: the product is taken in double, where c * a (19 + 24
     * bits) is exact, so a fused multiply-add and mul-then-add give the same
     * double whatever the compiler contracts; then one rounding to float. */
    const double mean = t->mean, a = (double)(float)(t->std * Z_SCALE);
#pragma omp parallel for schedule(static) if (count >= par)
    for (size_t i = 0; i < count; i++) out[i] = to_bf16((float)(mean + (double)ih_int(key, first + i) * a));
}

/* ---- the plan ------------------------------------------------------------- */

/* Mean of the q_norm / k_norm weights (see synth.h). */
#define QK_NORM_MEAN 3.0

/* Initial distribution of a tensor from its name and shape (see synth.h). */
static void init_for(clef_synth_tensor *t) {
    const char *name = t->name;
    size_t n = strlen(name);
    /* The module name: the component before the last '.' ("q_norm" of
     * "...self_attn.q_norm.weight"). */
    char module[256];
    const char *last = strrchr(name, '.');
    const char *m = last ? last : name + n;
    while (m > name && m[-1] != '.') m--;
    snprintf(module, sizeof module, "%.*s", (int)((last ? last : name + n) - m), m);
    t->mean = 0.0;
    if (t->ndim == 0) {
        t->std = 0.0;
        if (!strcmp(name, "prior_logit_scale") || !strcmp(name, "joint_logit_scale")) t->mean = log(10.0);
        /* residual_gate: 0 */
    } else if ((n >= 5 && !strcmp(name + n - 5, ".bias")) || (n >= 5 && !strcmp(name + n - 5, "_bias"))) {
        t->std = 0.02;
    } else if (t->ndim == 1 && (!strcmp(module, "q_norm") || !strcmp(module, "k_norm"))) {
        /* Sharp attention (score std ~9): averaging attention would pass the
         * part common to all tokens and damp the rest, and over 48 layers
         * that common part takes over the residual stream and every token
         * picks the same experts. */
        t->mean = QK_NORM_MEAN;
        t->std = 0.1 * QK_NORM_MEAN;
    } else if (t->ndim == 1 && (strstr(module, "norm") || !strncmp(module, "ln_", 3))) {
        t->mean = 1.0;
        t->std = 0.1;
    } else if (strstr(name, "embed_tokens") || strstr(name, "lm_head") || strstr(name, "type_embedding")) {
        t->std = 1.0;
    } else { /* fan-in: every dim after the first ([out, in] matrices, [out, in, k...] conv kernels) */
        double fan_in = 1.0;
        for (int d = 1; d < t->ndim; d++) fan_in *= (double)t->shape[d];
        if (t->ndim == 1) fan_in = (double)t->shape[0];
        t->std = 1.0 / sqrt(fan_in);
    }
}

typedef struct plan_builder {
    clef_synth_plan *plan;
    size_t cap;
} plan_builder;

static clef_synth_tensor *add_tensor_v(plan_builder *b, int ndim, const int64_t *shape, int expert, const char *fmt,
                                       va_list ap) {
    clef_synth_plan *p = b->plan;
    if (p->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 256;
        p->t = clef_xrealloc(p->t, b->cap * sizeof *p->t);
    }
    clef_synth_tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    char name[256];
    vsnprintf(name, sizeof name, fmt, ap);
    t->name = clef_xstrndup(name, strlen(name));
    t->ndim = ndim;
    t->numel = 1;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d], t->numel *= (size_t)shape[d];
    t->expert = expert;
    t->key = tensor_key(p->seed, t->name);
    init_for(t);
    return t;
}

static clef_synth_tensor *add_tensor(plan_builder *b, int ndim, int64_t d0, int64_t d1, int expert, const char *fmt,
                                     ...) __attribute__((format(printf, 6, 7)));
static clef_synth_tensor *add_tensor(plan_builder *b, int ndim, int64_t d0, int64_t d1, int expert, const char *fmt,
                                     ...) {
    const int64_t shape[2] = {d0, d1};
    va_list ap;
    va_start(ap, fmt);
    clef_synth_tensor *t = add_tensor_v(b, ndim, shape, expert, fmt, ap);
    va_end(ap);
    return t;
}

/* A tensor of up to 5 dims (tower conv kernels). */
static clef_synth_tensor *add_tensor_nd(plan_builder *b, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static clef_synth_tensor *add_tensor_nd(plan_builder *b, int ndim, const int64_t *shape, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    clef_synth_tensor *t = add_tensor_v(b, ndim, shape, 0, fmt, ap);
    va_end(ap);
    return t;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const clef_synth_tensor *)a)->name, ((const clef_synth_tensor *)b)->name);
}

/* The preset's widths in tensor_names.h's terms (its layers are all MoE: no dense MLP width). */
static clef_layer_dims synth_dims(const clef_synth_preset *p) {
    return (clef_layer_dims){.hidden = p->hidden,
                             .head_dim = p->head_dim,
                             .q_dim = p->heads * p->head_dim,
                             .kv_dim = p->kv_heads * p->head_dim,
                             .experts = p->experts,
                             .inter = 0,
                             .moe_inter = p->moe_inter,
                             .vocab = p->vocab};
}

/* Non-expert thinker tensors (SPEC §6.4), sorted by name. */
static void add_thinker_dense(plan_builder *b, const clef_synth_preset *p) {
    size_t start = b->plan->n;
    const clef_layer_dims d = synth_dims(p);
    for (int id = 0; id < CLEF_TT_COUNT; id++) {
        int vector = 0;
        int64_t r, k;
        char nb[256];
        clef_thinker_tensor_module(id, &vector);
        clef_thinker_tensor_shape(&d, id, &r, &k);
        add_tensor(b, vector ? 1 : 2, r, k, 0, "%s", clef_thinker_tensor_name(nb, sizeof nb, id, 1));
    }
    for (long long l = 0; l < p->layers; l++) /* every layer MoE: the table's tensors of MoE layers */
        for (int id = 0; id < CLEF_LT_COUNT; id++) {
            if (!clef_layer_has_tensor(id, 1)) continue;
            int vector = 0;
            int64_t r, k;
            char nb[256];
            clef_layer_tensor_module(id, &vector, NULL);
            clef_layer_tensor_shape(&d, id, &r, &k);
            add_tensor(b, vector ? 1 : 2, r, k, 0, "%s", clef_layer_tensor_name(nb, sizeof nb, l, id, 1));
        }
    qsort(b->plan->t + start, b->plan->n - start, sizeof *b->plan->t, by_name);
}

/* Per-expert tensors in (layer, expert, projection name) order: down, gate, up. */
static void add_thinker_experts(plan_builder *b, const clef_synth_preset *p) {
    const clef_layer_dims d = synth_dims(p);
    static const int order[3] = {CLEF_PROJ_DOWN, CLEF_PROJ_GATE, CLEF_PROJ_UP};
    for (long long l = 0; l < p->layers; l++)
        for (long long e = 0; e < p->experts; e++)
            for (int i = 0; i < 3; i++) {
                int64_t r, k;
                char nb[256];
                clef_expert_shape(&d, order[i], &r, &k);
                add_tensor(b, 2, r, k, 1, "%s", clef_expert_name(nb, sizeof nb, l, e, order[i], 1));
            }
}

/* LayerNorm weight + bias of [dim]. */
static void add_ln(plan_builder *b, int64_t dim, const char *prefix) {
    add_tensor(b, 1, dim, 0, 0, "%s.weight", prefix);
    add_tensor(b, 1, dim, 0, 0, "%s.bias", prefix);
}

/* nn.MultiheadAttention of width W: packed in_proj + out_proj. */
static void add_mha(plan_builder *b, int64_t W, const char *prefix) {
    add_tensor(b, 2, 3 * W, W, 0, "%s.in_proj_weight", prefix);
    add_tensor(b, 1, 3 * W, 0, 0, "%s.in_proj_bias", prefix);
    add_tensor(b, 2, W, W, 0, "%s.out_proj.weight", prefix);
    add_tensor(b, 1, W, 0, 0, "%s.out_proj.bias", prefix);
}

/* The joint head's 122 tensors (SPEC §7.2, for 2 routing + 4 decoder layers). */
static void add_head(plan_builder *b, const clef_synth_preset *p) {
    const int64_t H = p->hidden, W = p->head_width, F = p->head_ff;
    size_t start = b->plan->n;
    char pre[128];
    add_ln(b, H, "hidden_norm");
    static const char *const proj[] = {"memory", "question", "option_question", "global", "option_context",
                                       "option_lexical"};
    for (size_t i = 0; i < sizeof proj / sizeof *proj; i++) add_tensor(b, 2, W, H, 0, "%s_projection.weight", proj[i]);
    add_tensor(b, 2, 3, W, 0, "type_embedding.weight");
    for (long long r = 0; r < p->head_routing_layers; r++) {
        static const char *const norms[] = {"query_norm", "memory_norm", "feedforward_norm"};
        for (size_t i = 0; i < 3; i++) {
            snprintf(pre, sizeof pre, "evidence_layers.%lld.%s", r, norms[i]);
            add_ln(b, W, pre);
        }
        snprintf(pre, sizeof pre, "evidence_layers.%lld.attention", r);
        add_mha(b, W, pre);
        add_tensor(b, 2, F, W, 0, "evidence_layers.%lld.feedforward.0.weight", r);
        add_tensor(b, 1, F, 0, 0, "evidence_layers.%lld.feedforward.0.bias", r);
        add_tensor(b, 2, W, F, 0, "evidence_layers.%lld.feedforward.3.weight", r);
        add_tensor(b, 1, W, 0, 0, "evidence_layers.%lld.feedforward.3.bias", r);
    }
    add_ln(b, W, "option_summary_norm");
    add_ln(b, W, "field_norm");
    add_ln(b, W, "option_norm");
    for (long long l = 0; l < p->head_layers; l++) {
        snprintf(pre, sizeof pre, "layers.%lld.self_attn", l);
        add_mha(b, W, pre);
        snprintf(pre, sizeof pre, "layers.%lld.multihead_attn", l);
        add_mha(b, W, pre);
        add_tensor(b, 2, F, W, 0, "layers.%lld.linear1.weight", l);
        add_tensor(b, 1, F, 0, 0, "layers.%lld.linear1.bias", l);
        add_tensor(b, 2, W, F, 0, "layers.%lld.linear2.weight", l);
        add_tensor(b, 1, W, 0, 0, "layers.%lld.linear2.bias", l);
        for (int k = 1; k <= 3; k++) {
            snprintf(pre, sizeof pre, "layers.%lld.norm%d", l, k);
            add_ln(b, W, pre);
        }
    }
    add_tensor(b, 2, W, 4 * W, 0, "residual_scorer.0.weight");
    add_tensor(b, 1, W, 0, 0, "residual_scorer.0.bias");
    add_tensor(b, 2, 1, W, 0, "residual_scorer.3.weight");
    add_tensor(b, 1, 1, 0, 0, "residual_scorer.3.bias");
    add_tensor(b, 0, 0, 0, 0, "prior_logit_scale");
    add_tensor(b, 0, 0, 0, 0, "joint_logit_scale");
    add_tensor(b, 0, 0, 0, 0, "residual_gate");
    qsort(b->plan->t + start, b->plan->n - start, sizeof *b->plan->t, by_name);
    for (size_t i = start; i < b->plan->n; i++) b->plan->t[i].shard = -1;
}

/* Linear "<prefix>.weight" [out, in] + "<prefix>.bias" [out]. */
static void add_linear(plan_builder *b, int64_t out, int64_t in, const char *prefix) {
    add_tensor(b, 2, out, in, 0, "%s.weight", prefix);
    add_tensor(b, 1, out, 0, 0, "%s.bias", prefix);
}

/* The media towers' tensors (model/towers.c binds exactly these names and
 * shapes), sorted by name. */
static void add_towers(plan_builder *b, const clef_synth_preset *p) {
    if (!has_towers(p)) return;
    size_t start = b->plan->n;
    const int64_t D = TW_V_HIDDEN, D4 = 4 * D, M = TW_A_DMODEL, C = TW_A_CONV;
    char pre[160];
    const int64_t patch[5] = {D, 3, 2, 16, 16};
    add_tensor_nd(b, 5, patch, "thinker.visual.patch_embed.proj.weight");
    add_tensor(b, 1, D, 0, 0, "thinker.visual.patch_embed.proj.bias");
    add_tensor(b, 2, TW_V_POS, D, 0, "thinker.visual.pos_embed.weight");
    for (long long l = 0; l < p->vision_depth; l++) {
        snprintf(pre, sizeof pre, "thinker.visual.blocks.%lld.norm1", l);
        add_ln(b, D, pre);
        snprintf(pre, sizeof pre, "thinker.visual.blocks.%lld.norm2", l);
        add_ln(b, D, pre);
        snprintf(pre, sizeof pre, "thinker.visual.blocks.%lld.attn.qkv", l);
        add_linear(b, 3 * D, D, pre);
        snprintf(pre, sizeof pre, "thinker.visual.blocks.%lld.attn.proj", l);
        add_linear(b, D, D, pre);
        snprintf(pre, sizeof pre, "thinker.visual.blocks.%lld.mlp.linear_fc1", l);
        add_linear(b, TW_V_INTER, D, pre);
        snprintf(pre, sizeof pre, "thinker.visual.blocks.%lld.mlp.linear_fc2", l);
        add_linear(b, D, TW_V_INTER, pre);
    }
    for (int k = -1; k < 3; k++) { /* the main merger (LN over D), then the deepstack mergers (LN over 4D) */
        char mg[64];
        if (k < 0)
            snprintf(mg, sizeof mg, "thinker.visual.merger");
        else
            snprintf(mg, sizeof mg, "thinker.visual.merger_list.%d", k);
        snprintf(pre, sizeof pre, "%s.ln_q", mg);
        add_ln(b, k < 0 ? D : D4, pre);
        snprintf(pre, sizeof pre, "%s.mlp.0", mg);
        add_linear(b, D4, D4, pre);
        snprintf(pre, sizeof pre, "%s.mlp.2", mg);
        add_linear(b, TW_OUT, D4, pre);
    }
    for (int i = 0; i < 3; i++) {
        const int64_t k[4] = {C, i == 0 ? 1 : C, 3, 3};
        add_tensor_nd(b, 4, k, "thinker.audio_tower.conv2d%d.weight", i + 1);
        add_tensor(b, 1, C, 0, 0, "thinker.audio_tower.conv2d%d.bias", i + 1);
    }
    add_tensor(b, 2, M, C * (TW_A_MEL / 8), 0, "thinker.audio_tower.conv_out.weight");
    for (long long l = 0; l < p->audio_layers; l++) {
        static const char *const proj[] = {"q_proj", "k_proj", "v_proj", "out_proj"};
        snprintf(pre, sizeof pre, "thinker.audio_tower.layers.%lld.self_attn_layer_norm", l);
        add_ln(b, M, pre);
        snprintf(pre, sizeof pre, "thinker.audio_tower.layers.%lld.final_layer_norm", l);
        add_ln(b, M, pre);
        for (int j = 0; j < 4; j++) {
            snprintf(pre, sizeof pre, "thinker.audio_tower.layers.%lld.self_attn.%s", l, proj[j]);
            add_linear(b, M, M, pre);
        }
        snprintf(pre, sizeof pre, "thinker.audio_tower.layers.%lld.fc1", l);
        add_linear(b, TW_A_FFN, M, pre);
        snprintf(pre, sizeof pre, "thinker.audio_tower.layers.%lld.fc2", l);
        add_linear(b, M, TW_A_FFN, pre);
    }
    add_ln(b, M, "thinker.audio_tower.ln_post");
    add_linear(b, M, M, "thinker.audio_tower.proj1");
    add_linear(b, TW_OUT, M, "thinker.audio_tower.proj2");
    qsort(b->plan->t + start, b->plan->n - start, sizeof *b->plan->t, by_name);
}

void clef_synth_towers_plan_make(const clef_synth_preset *p, uint64_t seed, clef_synth_plan *plan) {
    memset(plan, 0, sizeof *plan);
    plan->preset = p;
    plan->seed = seed;
    plan_builder b = {.plan = plan};
    add_towers(&b, p);
    plan->n_shards = 1;
    plan->shard_bytes = clef_xcalloc(1, sizeof *plan->shard_bytes);
    for (size_t i = 0; i < plan->n; i++) plan->shard_bytes[0] += plan->t[i].numel * 2;
}

/* Greedy shards over the thinker tensors in plan order; the experts start a
 * new shard (as in the release and the tiny fixture). */
static void assign_shards(clef_synth_plan *p, size_t n_thinker, size_t max_bytes) {
    int shard = -1;
    size_t used = 0;
    p->shard_bytes = NULL;
    for (size_t i = 0; i < n_thinker; i++) {
        clef_synth_tensor *t = &p->t[i];
        size_t bytes = t->numel * 2;
        int first_expert = t->expert && (i == 0 || !p->t[i - 1].expert);
        if (shard < 0 || first_expert || used + bytes > max_bytes) {
            shard++;
            used = 0;
            p->shard_bytes = clef_xrealloc(p->shard_bytes, (size_t)(shard + 1) * sizeof *p->shard_bytes);
            p->shard_bytes[shard] = 0;
        }
        t->shard = shard;
        used += bytes;
        p->shard_bytes[shard] += bytes;
    }
    p->n_shards = shard + 1;
}

void clef_synth_plan_make(const clef_synth_preset *preset, uint64_t seed, size_t max_shard_bytes,
                          clef_synth_plan *plan) {
    memset(plan, 0, sizeof *plan);
    plan->preset = preset;
    plan->seed = seed;
    plan_builder b = {.plan = plan};
    add_thinker_dense(&b, preset);
    add_thinker_experts(&b, preset);
    size_t n_thinker = plan->n;
    add_head(&b, preset);
    assign_shards(plan, n_thinker, max_shard_bytes ? max_shard_bytes : CLEF_SYNTH_SHARD_BYTES);
    for (size_t i = n_thinker; i < plan->n; i++) plan->head_bytes += plan->t[i].numel * 2;
}

void clef_synth_plan_free(clef_synth_plan *plan) {
    if (!plan) return;
    for (size_t i = 0; i < plan->n; i++) free(plan->t[i].name);
    free(plan->t);
    free(plan->shard_bytes);
    memset(plan, 0, sizeof *plan);
}

void clef_synth_shard_name(int s, int n, char *out, size_t cap) {
    snprintf(out, cap, "model-%05d-of-%05d.safetensors", s + 1, n);
}

/* ---- writing files ------------------------------------------------------- */

#define PIECE_ELEMS ((size_t)32 << 20) /* 64 MiB of bf16 per generated piece */

static int io_fail(clef_err *err, const char *file, const char *what) {
    return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: %s: %s", file, what, strerror(errno));
}

/* Write `len` bytes to `dir/name`; on failure (a full disk: ENOSPC from the
 * write or from the flush in fclose) the partial file is removed. */
static int write_text(const char *dir, const char *name, const char *data, size_t len, clef_err *err) {
    clef_buf p = {0};
    clef_buf_printf(&p, "%s/%s", dir, name);
    FILE *f = fopen(p.data, "wb");
    int ok = f && fwrite(data, 1, len, f) == len;
    int e = errno;
    if (f && fclose(f) != 0 && ok) ok = 0, e = errno;
    if (!ok && f) unlink(p.data);
    clef_buf_free(&p);
    errno = e;
    return ok ? 0 : io_fail(err, name, "cannot write");
}

/* Copy the tokenizer file into `dir/tokenizer.json` (read through
 * clef_file_read: a FIFO or an endless file is refused, not waited on). */
static int copy_tokenizer(const char *src, const char *dir, clef_err *err) {
    char label[4200];
    snprintf(label, sizeof label, "tokenizer %s", src);
    size_t len = 0;
    char *text = clef_file_read(src, label, CLEF_FILE_MAX_TOKENIZER, &len, err);
    if (!text) return -1;
    int rc = write_text(dir, "tokenizer.json", text, len, err);
    free(text);
    return rc;
}

/* One safetensors file holding the plan's tensors [lo, hi). */
static int write_file(const clef_synth_plan *p, size_t lo, size_t hi, const char *path, const char *const *meta,
                      uint16_t *piece, clef_err *err) {
    st_wtensor *decl = clef_xcalloc(hi - lo + 1, sizeof *decl);
    for (size_t i = lo; i < hi; i++) {
        decl[i - lo] = (st_wtensor){.name = p->t[i].name, .dtype = CLEF_DT_BF16, .ndim = p->t[i].ndim};
        for (int d = 0; d < p->t[i].ndim; d++) decl[i - lo].shape[d] = p->t[i].shape[d];
    }
    st_writer *w = st_writer_create(path, decl, hi - lo, meta, err);
    free(decl);
    if (!w) return -1;
    for (size_t i = lo; i < hi; i++) {
        const clef_synth_tensor *t = &p->t[i];
        for (size_t first = 0; first < t->numel; first += PIECE_ELEMS) {
            size_t count = t->numel - first < PIECE_ELEMS ? t->numel - first : PIECE_ELEMS;
            clef_synth_fill(t, first, count, piece);
            if (st_writer_put(w, t->name, first * 2, piece, count * 2, err) != 0) {
                st_writer_abort(w);
                return -1;
            }
        }
    }
    return st_writer_finish(w, err);
}

static int ptr_by_name(const void *a, const void *b) {
    return strcmp((*(const clef_synth_tensor *const *)a)->name, (*(const clef_synth_tensor *const *)b)->name);
}

#define TOWERS_SHARD "model-towers.safetensors"

/* {"metadata":{"total_size":N},"weight_map":{name: shard, ...}} sorted by
 * name; the tower tensors (plan `tw`) map to TOWERS_SHARD. */
static int write_index(const clef_synth_plan *p, const clef_synth_plan *tw, const char *dir, clef_err *err) {
    size_t n_thinker = 0, total = 0;
    while (n_thinker < p->n && p->t[n_thinker].shard >= 0) total += p->t[n_thinker++].numel * 2;
    const clef_synth_tensor **sorted = clef_xcalloc(n_thinker + tw->n + 1, sizeof *sorted);
    for (size_t i = 0; i < n_thinker; i++) sorted[i] = &p->t[i];
    for (size_t i = 0; i < tw->n; i++) sorted[n_thinker + i] = &tw->t[i], total += tw->t[i].numel * 2;
    n_thinker += tw->n;
    qsort(sorted, n_thinker, sizeof *sorted, ptr_by_name);
    clef_buf b = {0};
    clef_buf_printf(&b, "{\n  \"metadata\": {\n    \"total_size\": %zu\n  },\n  \"weight_map\": {\n", total);
    char shard[64];
    for (size_t i = 0; i < n_thinker; i++) {
        int is_tower = sorted[i] >= tw->t && sorted[i] < tw->t + tw->n;
        if (is_tower)
            snprintf(shard, sizeof shard, "%s", TOWERS_SHARD);
        else
            clef_synth_shard_name(sorted[i]->shard, p->n_shards, shard, sizeof shard);
        clef_buf_puts(&b, "    ");
        json_render_string(sorted[i]->name, strlen(sorted[i]->name), &b);
        clef_buf_printf(&b, ": \"%s\"%s\n", shard, i + 1 < n_thinker ? "," : "");
    }
    clef_buf_puts(&b, "  }\n}\n");
    int rc = write_text(dir, "model.safetensors.index.json", b.data, b.len, err);
    clef_buf_free(&b);
    free(sorted);
    return rc;
}

/* The plan's tensors [lo, hi) of shard `s` (thinker: s >= 0; head: -1);
 * tensors of one shard are contiguous in the plan. */
static void shard_range(const clef_synth_plan *p, int s, size_t *lo, size_t *hi) {
    size_t i = 0;
    while (i < p->n && p->t[i].shard != s) i++;
    *lo = i;
    while (i < p->n && p->t[i].shard == s) i++;
    *hi = i;
}

static void progress_line(FILE *f, const char *what, size_t bytes, double t0) {
    if (!f) return;
    double s = clef_now() - t0;
    fprintf(f, "clef synth: %s: %.2f GiB in %.1f s (%.2f GB/s)\n", what, (double)bytes / (1 << 30), s,
            s > 0 ? (double)bytes / s / 1e9 : 0.0);
    fflush(f);
}

/* config.json, joint_head_config.json, tokenizer.json, the index. */
static int write_small_files(const clef_synth_options *opt, const clef_synth_plan *plan, const clef_synth_plan *tw,
                             clef_err *err) {
    clef_buf cfg = {0}, head = {0};
    clef_synth_config_json(plan->preset, plan->seed, &cfg);
    clef_synth_head_config_json(plan->preset, &head);
    int rc = write_text(opt->out_dir, "config.json", cfg.data, cfg.len, err);
    if (rc == 0) rc = write_text(opt->out_dir, "joint_head_config.json", head.data, head.len, err);
    if (rc == 0) rc = copy_tokenizer(opt->tokenizer, opt->out_dir, err);
    if (rc == 0) rc = write_index(plan, tw, opt->out_dir, err);
    clef_buf_free(&cfg);
    clef_buf_free(&head);
    return rc;
}

int clef_synth_write(const clef_synth_options *opt, clef_err *err) {
    const clef_synth_preset *pr = clef_synth_preset_find(opt->preset, err);
    if (!pr) return -1;
    if (!opt->out_dir || !opt->tokenizer)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "clef synth needs an output directory and a tokenizer");
    if (mkdir(opt->out_dir, 0755) != 0 && errno != EEXIST) return io_fail(err, opt->out_dir, "cannot create");
    clef_synth_plan plan, tw;
    clef_synth_plan_make(pr, opt->seed, opt->max_shard_bytes, &plan);
    clef_synth_towers_plan_make(pr, opt->seed, &tw);
    double t_all = clef_now();
    int rc = write_small_files(opt, &plan, &tw, err);
    uint16_t *piece = rc == 0 ? clef_xmalloc(PIECE_ELEMS * sizeof *piece) : NULL;
    static const char *const pt_meta[] = {"format", "pt", NULL};
    clef_buf path = {0};
    size_t total = plan.head_bytes;
    for (int s = -1; rc == 0 && s < plan.n_shards; s++) { /* -1: the head, first (small, fails fast) */
        char name[64];
        if (s < 0)
            snprintf(name, sizeof name, "joint_head.safetensors");
        else
            clef_synth_shard_name(s, plan.n_shards, name, sizeof name);
        size_t lo, hi;
        shard_range(&plan, s, &lo, &hi);
        path.len = 0;
        clef_buf_printf(&path, "%s/%s", opt->out_dir, name);
        double t0 = clef_now();
        rc = write_file(&plan, lo, hi, path.data, s < 0 ? NULL : pt_meta, piece, err);
        if (rc == 0) {
            progress_line(opt->progress, name, s < 0 ? plan.head_bytes : plan.shard_bytes[s], t0);
            if (s >= 0) total += plan.shard_bytes[s];
        }
    }
    if (rc == 0 && tw.n) { /* the media towers in a shard of their own */
        path.len = 0;
        clef_buf_printf(&path, "%s/%s", opt->out_dir, TOWERS_SHARD);
        double t0 = clef_now();
        rc = write_file(&tw, 0, tw.n, path.data, pt_meta, piece, err);
        if (rc == 0) progress_line(opt->progress, TOWERS_SHARD, tw.shard_bytes[0], t0), total += tw.shard_bytes[0];
    }
    if (rc == 0) {
        char what[160];
        snprintf(what, sizeof what, "preset %s seed %llu, %d shards + head, %zu tensors", pr->name,
                 (unsigned long long)opt->seed, plan.n_shards + (tw.n > 0), plan.n + tw.n);
        progress_line(opt->progress, what, total, t_all);
    }
    clef_buf_free(&path);
    free(piece);
    clef_synth_plan_free(&plan);
    clef_synth_plan_free(&tw);
    return rc;
}

/* ---- the in-memory checkpoint -------------------------------------------- */

#define MEM_ALIGN 64

/* One st_file over anonymous memory holding the plan's tensors [lo, hi),
 * drawn in place.  st_close unmaps it like a file map. */
static int build_mem_shard(const clef_synth_plan *p, size_t lo, size_t hi, const char *path, st_file *f,
                           clef_err *err) {
    size_t size = 0;
    for (size_t i = lo; i < hi; i++) size = (size + MEM_ALIGN - 1) / MEM_ALIGN * MEM_ALIGN + p->t[i].numel * 2;
    void *map = mmap(NULL, size ? size : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "%s: cannot allocate %zu bytes for synthetic weights: %s",
                         path, size, strerror(errno));
#ifdef MADV_HUGEPAGE
    madvise(map, size ? size : 1, MADV_HUGEPAGE); /* fewer page faults while drawing; advisory only */
#endif
    f->path = clef_xstrndup(path, strlen(path));
    f->map = map;
    f->size = size ? size : 1;
    f->tensors = clef_xcalloc(hi - lo + 1, sizeof *f->tensors);
    size_t off = 0;
    for (size_t i = lo; i < hi; i++) {
        const clef_synth_tensor *t = &p->t[i];
        st_tensor *s = &f->tensors[f->n++];
        off = (off + MEM_ALIGN - 1) / MEM_ALIGN * MEM_ALIGN;
        s->name = clef_xstrndup(t->name, strlen(t->name));
        s->dtype = CLEF_DT_BF16;
        s->ndim = t->ndim;
        for (int d = 0; d < t->ndim; d++) s->shape[d] = t->shape[d];
        s->numel = t->numel;
        s->nbytes = t->numel * 2;
        s->data = (char *)map + off;
        clef_synth_fill(t, 0, t->numel, (uint16_t *)((char *)map + off));
        off += s->nbytes;
    }
    return 0;
}

static int catalog_by_name(const void *a, const void *b) {
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

/* Config from the preset's own config texts, so file and memory agree. */
static int synth_config(const clef_synth_preset *pr, uint64_t seed, clef_config *cfg, clef_err *err) {
    clef_buf c = {0}, h = {0};
    clef_synth_config_json(pr, seed, &c);
    clef_synth_head_config_json(pr, &h);
    int rc = clef_config_parse(c.data, c.len, h.data, h.len, cfg, err);
    clef_buf_free(&c);
    clef_buf_free(&h);
    return rc;
}

/* The in-memory checkpoint: thinker shards, the towers' shard (if the preset
 * has towers), the head last (as clef_checkpoint_open orders them); with
 * `towers_only` just the towers' shard.  A preset with towers also keeps its
 * config.json text in ck->config_json (model/towers.c reads the tower
 * configs from it). */
static int synth_checkpoint(const char *preset, uint64_t seed, FILE *progress, int towers_only, clef_checkpoint *ck,
                            clef_err *err) {
    memset(ck, 0, sizeof *ck);
    const clef_synth_preset *pr = clef_synth_preset_find(preset, err);
    if (!pr || synth_config(pr, seed, &ck->config, err) != 0) return -1;
    if (towers_only && !has_towers(pr))
        return clef_fail(err, 500, CLEF_E_INTERNAL, "synthetic", "synthetic preset '%s' has no media towers", pr->name);
    if (has_towers(pr)) {
        clef_buf c = {0};
        clef_synth_config_json(pr, seed, &c);
        ck->config_json = clef_xstrndup(c.data, c.len);
        ck->config_json_len = c.len;
        clef_buf_free(&c);
    }
    double t0 = clef_now();
    clef_synth_plan plan, tw;
    clef_synth_plan_make(pr, seed, 0, &plan);
    clef_synth_towers_plan_make(pr, seed, &tw);
    ck->shards = clef_xcalloc((size_t)plan.n_shards + 2, sizeof *ck->shards);
    int rc = 0;
    size_t total = 0;
    /* s < n_shards: thinker shard s; n_shards: the towers; n_shards + 1: the head */
    for (int s = towers_only ? plan.n_shards : 0; rc == 0 && s <= plan.n_shards + 1; s++) {
        if (s == plan.n_shards && tw.n == 0) continue;
        if (s == plan.n_shards + 1 && towers_only) break;
        char path[128], name[64];
        if (s == plan.n_shards + 1)
            snprintf(name, sizeof name, "joint_head.safetensors");
        else if (s == plan.n_shards)
            snprintf(name, sizeof name, "%s", TOWERS_SHARD);
        else
            clef_synth_shard_name(s, plan.n_shards, name, sizeof name);
        snprintf(path, sizeof path, "synthetic-%s/%s", pr->name, name);
        size_t lo = 0, hi = tw.n;
        if (s != plan.n_shards) shard_range(&plan, s < plan.n_shards ? s : -1, &lo, &hi);
        rc = build_mem_shard(s == plan.n_shards ? &tw : &plan, lo, hi, path, &ck->shards[ck->n_shards], err);
        if (rc == 0) {
            ck->n_shards++;
            total += s < plan.n_shards ? plan.shard_bytes[s] : s == plan.n_shards ? tw.shard_bytes[0] : plan.head_bytes;
        }
    }
    if (rc == 0) {
        ck->catalog = clef_xcalloc(plan.n + tw.n + 1, sizeof *ck->catalog);
        for (size_t s = 0; s < ck->n_shards; s++)
            for (size_t i = 0; i < ck->shards[s].n; i++) ck->catalog[ck->n_tensors++] = &ck->shards[s].tensors[i];
        qsort(ck->catalog, ck->n_tensors, sizeof *ck->catalog, catalog_by_name);
        char what[160];
        snprintf(what, sizeof what, "synthetic %s%s seed %llu in memory, %zu tensors", pr->name,
                 towers_only ? " (towers only)" : "", (unsigned long long)seed, ck->n_tensors);
        progress_line(progress, what, total, t0);
    }
    clef_synth_plan_free(&plan);
    clef_synth_plan_free(&tw);
    if (rc != 0) clef_checkpoint_close(ck);
    return rc;
}

int clef_synth_checkpoint(const char *preset, uint64_t seed, FILE *progress, clef_checkpoint *ck, clef_err *err) {
    return synth_checkpoint(preset, seed, progress, 0, ck, err);
}

int clef_synth_towers_checkpoint(const char *preset, uint64_t seed, FILE *progress, clef_checkpoint *ck,
                                 clef_err *err) {
    return synth_checkpoint(preset, seed, progress, 1, ck, err);
}

int clef_checkpoint_synthetic(const char *preset, uint64_t seed, clef_checkpoint *ck, clef_err *err) {
    return clef_synth_checkpoint(preset, seed, NULL, ck, err);
}
