/* test_model_layouts.c — the other checkpoint layouts clef_model_create binds
 * (SPEC §6.1, §6.4), built in a temporary directory from the tiny fixture:
 *   1. transformers-5 fused experts: mlp.experts.gate_up_proj [E, 2I, H]
 *      (gate rows first) and mlp.experts.down_proj [E, H, I] instead of
 *      per-expert tensors must give bitwise the logits of the release layout
 *      (and so match the goldens);
 *   2. dense MLP layers (mlp_only_layers, intermediate_size,
 *      mlp.{gate,up,down}_proj): a model whose layers are all dense must give
 *      bitwise the hidden states of a one-expert top-1 MoE with the same
 *      weights (routing weight exactly 1.0), which exercises the dense path
 *      end to end;
 *   3. a mis-shaped tensor is a load error naming it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "io/checkpoint.h"
#include "io/st_write.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "testutil.h"
#include "util/buf.h"

#define FIX_DIR CLEF_FIXTURES "/tiny-clef-omni"

/* A list of tensors to write with st_save. */
typedef struct wlist {
    st_wtensor *t;
    const void **d;
    char **names;
    void **owned;
    size_t n, n_owned;
} wlist;

static void wl_add(wlist *w, const char *name, clef_dtype dt, int ndim, const int64_t *shape, const void *data) {
    w->t = realloc(w->t, (w->n + 1) * sizeof *w->t);
    w->d = realloc(w->d, (w->n + 1) * sizeof *w->d);
    w->names = realloc(w->names, (w->n + 1) * sizeof *w->names);
    w->names[w->n] = strdup(name);
    st_wtensor t = {.name = w->names[w->n], .dtype = dt, .ndim = ndim};
    for (int i = 0; i < ndim; i++) t.shape[i] = shape[i];
    w->t[w->n] = t;
    w->d[w->n] = data;
    w->n++;
}

static void *wl_own(wlist *w, size_t bytes) {
    w->owned = realloc(w->owned, (w->n_owned + 1) * sizeof *w->owned);
    return w->owned[w->n_owned++] = malloc(bytes);
}

static void wl_save(wlist *w, const char *path) {
    clef_err err;
    clef_err_clear(&err);
    if (st_save(path, w->t, w->d, w->n, NULL, &err) != 0) fail_msg("st_save %s: %s", path, err.message);
    for (size_t i = 0; i < w->n; i++) free(w->names[i]);
    for (size_t i = 0; i < w->n_owned; i++) free(w->owned[i]);
    free(w->t), free(w->d), free(w->names), free(w->owned);
    memset(w, 0, sizeof *w);
}

static void wl_copy(wlist *w, const st_tensor *t) { wl_add(w, t->name, t->dtype, t->ndim, t->shape, t->data); }

static char *path_in(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static void link_fixture(const char *dir, const char *name) {
    char *src = path_in(FIX_DIR, name), *dst = path_in(dir, name);
    if (symlink(src, dst) != 0) fail_msg("symlink %s", dst);
    free(src), free(dst);
}

static void write_text(const char *dir, const char *name, const char *text, size_t len) {
    char *p = path_in(dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
    free(p);
}

static void remove_dir(const char *dir) {
    const char *names[] = {"config.json", "joint_head_config.json", "joint_head.safetensors",
                           "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json", "model.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char *p = path_in(dir, names[i]);
        unlink(p);
        free(p);
    }
    rmdir(dir);
}

/* config.json of the fixture with text_config fields changed. */
static void write_config(const char *dir, int64_t n_experts, int64_t top_k, int64_t dense_inter, int all_dense,
                         int64_t n_layers) {
    size_t len;
    char *text = tu_read_file(FIX_DIR "/config.json", &len);
    clef_err err;
    json_value *cfg = json_parse(text, len, &err);
    free(text);
    assert_non_null(cfg);
    json_value *tc = (json_value *)json_get(json_get(cfg, "thinker_config"), "text_config");
    assert_non_null(tc);
    json_object_set(tc, "num_experts", 11, json_new_int(n_experts));
    json_object_set(tc, "num_experts_per_tok", 19, json_new_int(top_k));
    json_object_set(tc, "intermediate_size", 17, json_new_int(dense_inter));
    json_value *only = json_new(JSON_ARRAY);
    for (int64_t l = 0; all_dense && l < n_layers; l++) json_array_push(only, json_new_int(l));
    json_object_set(tc, "mlp_only_layers", 15, only);
    clef_buf b = {0};
    json_render(cfg, &b);
    write_text(dir, "config.json", b.data, b.len);
    clef_buf_free(&b);
    json_free(cfg);
}

static char *make_dir(void) {
    char tmpl[] = "/tmp/clef_layouts_XXXXXX";
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return strdup(d);
}

/* thinker forward + head for golden case `ci`; logits and (optionally) all
 * layer hidden states. */
static float *run_case(clef_model *m, const clef_config *cfg, const json_value *c, float **layers_out, size_t *n_out) {
    const json_value *ids_j = json_get(c, "input_ids"), *qs = json_get(c, "questions");
    clef_record r = {0};
    r.n_ids = ids_j->n;
    r.input_ids = malloc(r.n_ids * sizeof *r.input_ids);
    for (size_t i = 0; i < r.n_ids; i++) r.input_ids[i] = (int32_t)tu_int_at(ids_j, i);
    r.n_questions = qs->n;
    r.questions = calloc(qs->n, sizeof *r.questions);
    size_t n_opt = 0;
    for (size_t i = 0; i < qs->n; i++) {
        const json_value *q = qs->items[i], *os = json_get(q, "option_spans"), *qsp = json_get(q, "question_span");
        int64_t type;
        json_as_i64(json_get(q, "type"), &type);
        r.questions[i].type = (clef_qtype)type;
        r.questions[i].question = (clef_span){(int32_t)tu_int_at(qsp, 0), (int32_t)tu_int_at(qsp, 1)};
        r.questions[i].n_options = os->n;
        r.questions[i].options = calloc(os->n, sizeof(clef_span));
        for (size_t j = 0; j < os->n; j++)
            r.questions[i].options[j] =
                (clef_span){(int32_t)tu_int_at(os->items[j], 0), (int32_t)tu_int_at(os->items[j], 1)};
        n_opt += os->n;
    }
    const size_t H = (size_t)cfg->text.hidden_size, NL = (size_t)cfg->text.num_hidden_layers;
    float *hidden = malloc(r.n_ids * H * sizeof *hidden), *logits = malloc(n_opt * sizeof *logits);
    float *layers = malloc((NL + 1) * r.n_ids * H * sizeof *layers);
    clef_err err;
    clef_err_clear(&err);
    if (clef_thinker_forward(m, r.input_ids, r.n_ids, hidden, layers, &err) != 0 ||
        clef_head_forward(m, hidden, &r, logits, &err) != 0)
        fail_msg("forward: %s", err.message);
    *n_out = n_opt;
    if (layers_out) {
        *layers_out = layers;
        *n_out = (NL + 1) * r.n_ids * H;
    } else {
        free(layers);
        *n_out = n_opt;
    }
    free(hidden);
    for (size_t i = 0; i < r.n_questions; i++) free(r.questions[i].options);
    free(r.questions);
    free(r.input_ids);
    return logits;
}

static json_value **load_cases(size_t *n) {
    char *path = tu_fixture("goldens/goldens.jsonl");
    json_value **cases = tu_read_jsonl(path, n);
    free(path);
    return cases;
}

static void free_cases(json_value **cases, size_t n) {
    for (size_t i = 0; i < n; i++) json_free(cases[i]);
    free(cases);
}

static clef_model *open_model(const char *dir, clef_checkpoint *ck) {
    clef_err err;
    clef_err_clear(&err);
    if (clef_checkpoint_open(dir, ck, &err) != 0) fail_msg("checkpoint %s: %s", dir, err.message);
    clef_model *m = clef_model_create(ck, 0, &err);
    if (!m) fail_msg("model %s: %s", dir, err.message);
    return m;
}

static void test_fused_experts(void **state) {
    clef_checkpoint ck0;
    clef_model *m0 = open_model(FIX_DIR, &ck0);
    const clef_text_config *c = &ck0.config.text;
    const int64_t E = c->num_experts, H = c->hidden_size, NI = c->moe_intermediate_size, NL = c->num_hidden_layers;
    char *dir = make_dir();
    link_fixture(dir, "config.json");
    link_fixture(dir, "joint_head_config.json");
    link_fixture(dir, "joint_head.safetensors");
    link_fixture(dir, "model-00001-of-00002.safetensors");
    /* shard 2: fused experts, and an index naming them */
    wlist w = {0};
    clef_buf idx = {0};
    size_t len;
    char *itext = tu_read_file(FIX_DIR "/model.safetensors.index.json", &len);
    clef_err err;
    json_value *index = json_parse(itext, len, &err);
    free(itext);
    const json_value *wm = json_get(index, "weight_map");
    clef_buf_puts(&idx, "{\"metadata\":{},\"weight_map\":{");
    int first = 1;
    for (size_t i = 0; i < wm->n; i++) {
        if (strstr(wm->keys[i], ".mlp.experts.")) continue;
        clef_buf_printf(&idx, "%s\"%s\":\"%s\"", first ? "" : ",", wm->keys[i], wm->items[i]->str);
        first = 0;
    }
    for (int64_t l = 0; l < NL; l++) {
        const size_t es = 2; /* bf16 */
        char *gu = wl_own(&w, (size_t)(E * 2 * NI * H) * es), *dn = wl_own(&w, (size_t)(E * H * NI) * es);
        for (int64_t e = 0; e < E; e++) {
            char name[256];
            const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int p = 0; p < 3; p++) {
                snprintf(name, sizeof name, "thinker.model.layers.%lld.mlp.experts.%lld.%s.weight", (long long)l,
                         (long long)e, proj[p]);
                const st_tensor *t = clef_checkpoint_find(&ck0, name);
                assert_non_null(t);
                assert_int_equal(t->dtype, CLEF_DT_BF16);
                if (p < 2)
                    memcpy(gu + (size_t)((e * 2 + p) * NI * H) * es, t->data, t->nbytes);
                else
                    memcpy(dn + (size_t)(e * H * NI) * es, t->data, t->nbytes);
            }
        }
        char n1[128], n2[128];
        snprintf(n1, sizeof n1, "thinker.model.layers.%lld.mlp.experts.gate_up_proj", (long long)l);
        snprintf(n2, sizeof n2, "thinker.model.layers.%lld.mlp.experts.down_proj", (long long)l);
        int64_t s1[3] = {E, 2 * NI, H}, s2[3] = {E, H, NI};
        wl_add(&w, n1, CLEF_DT_BF16, 3, s1, gu);
        wl_add(&w, n2, CLEF_DT_BF16, 3, s2, dn);
        clef_buf_printf(&idx, ",\"%s\":\"model-00002-of-00002.safetensors\",\"%s\":\"model-00002-of-00002.safetensors\"",
                        n1, n2);
    }
    clef_buf_puts(&idx, "}}");
    json_free(index);
    char *shard = path_in(dir, "model-00002-of-00002.safetensors");
    wl_save(&w, shard);
    free(shard);
    write_text(dir, "model.safetensors.index.json", idx.data, idx.len);
    clef_buf_free(&idx);

    clef_checkpoint ck1;
    clef_model *m1 = open_model(dir, &ck1);
    assert_null(clef_checkpoint_find(&ck1, "thinker.model.layers.0.mlp.experts.0.gate_proj.weight"));
    size_t n_cases;
    json_value **cases = load_cases(&n_cases);
    const size_t pick[2] = {0, 21}; /* triage_text, choice_sort_order */
    for (int i = 0; i < 2; i++) {
        size_t n0, n1;
        float *l0 = run_case(m0, &ck0.config, cases[pick[i]], NULL, &n0);
        float *l1 = run_case(m1, &ck1.config, cases[pick[i]], NULL, &n1);
        assert_int_equal(n0, n1);
        assert_memory_equal(l0, l1, n0 * sizeof(float));
        printf("  fused experts: %s, %zu logits bitwise equal to the per-expert layout\n",
               json_get(cases[pick[i]], "name")->str, n0);
        free(l0), free(l1);
    }
    free_cases(cases, n_cases);
    clef_model_free(m1);
    clef_checkpoint_close(&ck1);
    clef_model_free(m0);
    clef_checkpoint_close(&ck0);
    remove_dir(dir);
    free(dir);
}

/* A single-file checkpoint from the fixture's text tensors whose layers are
 * either one-expert MoE (dense = 0) or dense MLPs (dense = 1), both using
 * expert 0 of the fixture and row 0 of its router. */
static void write_one_expert_model(const clef_checkpoint *ck, const char *dir, int dense) {
    const clef_text_config *c = &ck->config.text;
    const int64_t H = c->hidden_size, NL = c->num_hidden_layers;
    wlist w = {0};
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const st_tensor *t = ck->catalog[i];
        if (strncmp(t->name, "thinker.model.", 14) != 0 && strcmp(t->name, "thinker.lm_head.weight") != 0) continue;
        if (strstr(t->name, ".mlp.")) continue;
        wl_copy(&w, t);
    }
    for (int64_t l = 0; l < NL; l++) {
        char src[256], dst[256];
        const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
        for (int p = 0; p < 3; p++) {
            snprintf(src, sizeof src, "thinker.model.layers.%lld.mlp.experts.0.%s.weight", (long long)l, proj[p]);
            const st_tensor *t = clef_checkpoint_find(ck, src);
            assert_non_null(t);
            if (dense)
                snprintf(dst, sizeof dst, "thinker.model.layers.%lld.mlp.%s.weight", (long long)l, proj[p]);
            else
                snprintf(dst, sizeof dst, "%s", src);
            wl_add(&w, dst, t->dtype, t->ndim, t->shape, t->data);
        }
        if (!dense) {
            snprintf(src, sizeof src, "thinker.model.layers.%lld.mlp.gate.weight", (long long)l);
            const st_tensor *t = clef_checkpoint_find(ck, src);
            int64_t shape[2] = {1, H};
            wl_add(&w, src, t->dtype, 2, shape, t->data); /* row 0 */
        }
    }
    char *p = path_in(dir, "model.safetensors");
    wl_save(&w, p);
    free(p);
    write_config(dir, 1, 1, c->moe_intermediate_size, dense, NL);
    link_fixture(dir, "joint_head_config.json");
    link_fixture(dir, "joint_head.safetensors");
}

static void test_dense_layers(void **state) {
    clef_checkpoint ck0;
    clef_err err;
    clef_err_clear(&err);
    if (clef_checkpoint_open(FIX_DIR, &ck0, &err) != 0) fail_msg("%s", err.message);
    char *dir_moe = make_dir(), *dir_dense = make_dir();
    write_one_expert_model(&ck0, dir_moe, 0);
    write_one_expert_model(&ck0, dir_dense, 1);
    clef_checkpoint ck_moe, ck_dense;
    clef_model *m_moe = open_model(dir_moe, &ck_moe), *m_dense = open_model(dir_dense, &ck_dense);
    for (int64_t l = 0; l < ck_dense.config.text.num_hidden_layers; l++) {
        assert_false(clef_layer_is_moe(&ck_dense.config.text, l));
        assert_true(clef_layer_is_moe(&ck_moe.config.text, l));
    }
    size_t n_cases;
    json_value **cases = load_cases(&n_cases);
    float *h_moe, *h_dense;
    size_t n1, n2;
    float *l_moe = run_case(m_moe, &ck_moe.config, cases[0], &h_moe, &n1);
    float *l_dense = run_case(m_dense, &ck_dense.config, cases[0], &h_dense, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(h_moe, h_dense, n1 * sizeof(float));
    assert_memory_equal(l_moe, l_dense, 7 * sizeof(float));
    /* and the layers really changed the stream: it is not the embedding */
    const size_t L = json_get(cases[0], "input_ids")->n, H = (size_t)ck0.config.text.hidden_size;
    assert_true(memcmp(h_dense, h_dense + L * H, L * H * sizeof(float)) != 0);
    printf("  dense MLP layers: %zu hidden values and 7 logits bitwise equal to one-expert top-1 MoE\n", n1);
    free(l_moe), free(l_dense), free(h_moe), free(h_dense);
    free_cases(cases, n_cases);
    clef_model_free(m_moe);
    clef_model_free(m_dense);
    clef_checkpoint_close(&ck_moe);
    clef_checkpoint_close(&ck_dense);

    /* a dense layer with a mis-shaped down_proj is refused, naming the tensor */
    remove_dir(dir_dense);
    assert_int_equal(mkdir(dir_dense, 0700), 0);
    write_one_expert_model(&ck0, dir_dense, 1);
    write_config(dir_dense, 1, 1, ck0.config.text.moe_intermediate_size + 1, 1, ck0.config.text.num_hidden_layers);
    clef_checkpoint ck_bad;
    if (clef_checkpoint_open(dir_dense, &ck_bad, &err) != 0) fail_msg("%s", err.message);
    assert_null(clef_model_create(&ck_bad, 1, &err));
    assert_int_equal(err.status, 500);
    assert_non_null(strstr(err.message, "thinker.model.layers.0.mlp.gate_proj"));
    printf("  mis-shaped dense weight: %s\n", err.message);
    clef_checkpoint_close(&ck_bad);

    clef_checkpoint_close(&ck0);
    remove_dir(dir_moe);
    remove_dir(dir_dense);
    free(dir_moe), free(dir_dense);
}

/* The CPU backend with copies_weights set: weight_init copies the bytes (as
 * a device backend does), so the model binds each layer's q, k and v as one
 * [q | k | v] weight and the thinker takes the fused, strided path that
 * otherwise only runs on CUDA. */
static void *copied[4096];
static size_t n_copied;
static const clef_backend_ops *cpu_real;
static int copying_weight_init(clef_backend *be, clef_weight *w, clef_dtype dt, int64_t rows, int64_t cols,
                               const void *host, clef_err *err) {
    const size_t bytes = (size_t)(rows * cols) * clef_dtype_size(dt);
    void *p = malloc(bytes ? bytes : 1);
    memcpy(p, host, bytes);
    assert_true(n_copied < sizeof copied / sizeof *copied);
    copied[n_copied++] = p;
    return cpu_real->weight_init(be, w, dt, rows, cols, p, err);
}

/* The fused q/k/v product (one weight, strided q, k, v column blocks, the
 * MLP residual add deferred into the next norm) gives bitwise the hidden
 * states of three products, on the text path (no per-layer states) and on
 * the path that adds each MLP output at once (per-layer states). */
static void test_fused_qkv(void **state) {
    clef_checkpoint ck;
    clef_err err;
    clef_err_clear(&err);
    clef_model *m0 = open_model(FIX_DIR, &ck);
    const clef_text_config *c = &ck.config.text;
    clef_backend *cpu = clef_backend_cpu_create(0, &err);
    assert_non_null(cpu);
    cpu_real = cpu->ops;
    clef_backend_ops ops = *cpu->ops;
    ops.copies_weights = 1;
    ops.weight_init = copying_weight_init;
    clef_backend be = {.ops = &ops, .ctx = cpu->ctx};
    clef_model *m1 = clef_model_create_on(&ck, &be, 0, &err);
    if (!m1) fail_msg("model: %s", err.message);
    for (int64_t l = 0; l < c->num_hidden_layers; l++) assert_true(m1->layers[l].fused_qkv);

    size_t n_cases;
    json_value **cases = load_cases(&n_cases);
    const json_value *idv = json_get(cases[0], "input_ids");
    const size_t n = idv->n, H = (size_t)c->hidden_size, NL = (size_t)c->num_hidden_layers;
    int32_t *ids = malloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)tu_int_at(idv, i);
    float *h0 = malloc(n * H * sizeof *h0), *h1 = malloc(n * H * sizeof *h1);
    float *l0 = malloc((NL + 1) * n * H * sizeof *l0), *l1 = malloc((NL + 1) * n * H * sizeof *l1);
    for (int with_layers = 0; with_layers < 2; with_layers++) {
        if (clef_thinker_forward(m0, ids, n, h0, with_layers ? l0 : NULL, &err) != 0 ||
            clef_thinker_forward(m1, ids, n, h1, with_layers ? l1 : NULL, &err) != 0)
            fail_msg("forward: %s", err.message);
        assert_memory_equal(h0, h1, n * H * sizeof *h0);
        if (with_layers) assert_memory_equal(l0, l1, (NL + 1) * n * H * sizeof *l0);
    }
    printf("  fused q/k/v on %zu layers: %zu hidden values bitwise the three products\n", NL, n * H);

    /* layers mixing both: layer 1's q_proj as F32 (the same values) is not fused, the others are */
    char *dir = make_dir();
    wlist w = {0};
    for (size_t i = 0; i < ck.n_tensors; i++) {
        const st_tensor *t = ck.catalog[i];
        if (strncmp(t->name, "thinker.", 8) != 0) continue;
        if (strcmp(t->name, "thinker.model.layers.1.self_attn.q_proj.weight") == 0 && t->dtype == CLEF_DT_BF16) {
            const size_t ne = (size_t)(t->shape[0] * t->shape[1]);
            float *f = wl_own(&w, ne * sizeof *f);
            clef_to_f32(t->dtype, t->data, f, ne);
            wl_add(&w, t->name, CLEF_DT_F32, t->ndim, t->shape, f);
        } else {
            wl_copy(&w, t);
        }
    }
    char *mp = path_in(dir, "model.safetensors");
    wl_save(&w, mp);
    free(mp);
    link_fixture(dir, "config.json");
    link_fixture(dir, "joint_head_config.json");
    link_fixture(dir, "joint_head.safetensors");
    clef_checkpoint ck2;
    clef_model *m2 = open_model(dir, &ck2), *m3 = clef_model_create_on(&ck2, &be, 0, &err);
    if (!m3) fail_msg("model: %s", err.message);
    for (int64_t l = 0; l < c->num_hidden_layers; l++) assert_int_equal(m3->layers[l].fused_qkv, l != 1);
    for (int with_layers = 0; with_layers < 2; with_layers++) {
        if (clef_thinker_forward(m2, ids, n, h0, with_layers ? l0 : NULL, &err) != 0 ||
            clef_thinker_forward(m3, ids, n, h1, with_layers ? l1 : NULL, &err) != 0)
            fail_msg("forward: %s", err.message);
        assert_memory_equal(h0, h1, n * H * sizeof *h0);
        if (with_layers) assert_memory_equal(l0, l1, (NL + 1) * n * H * sizeof *l0);
    }
    printf("  fused q/k/v on layers 0 and 2, three products on layer 1: bitwise\n");
    clef_model_free(m3);
    clef_model_free(m2);
    clef_checkpoint_close(&ck2);
    remove_dir(dir);
    free(dir);
    free(ids), free(h0), free(h1), free(l0), free(l1);
    free_cases(cases, n_cases);
    clef_model_free(m1);
    clef_model_free(m0);
    cpu->ops->destroy(cpu);
    for (size_t i = 0; i < n_copied; i++) free(copied[i]);
    clef_checkpoint_close(&ck);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_experts),
        cmocka_unit_test(test_dense_layers),
        cmocka_unit_test(test_fused_qkv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
