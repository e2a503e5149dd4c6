/* convert.c — `clef quantize`: BF16 checkpoint → quantized checkpoint, one
 * shard and one expert matrix at a time (see convert.h). */
#include "quant/convert.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "io/st_write.h"
#include "io/synth.h"
#include "json/json.h"
#include "quant/qsynth.h"
#include "quant/qweight.h"
#include "quant/quantize.h"
#include "util/buf.h"
#include "util/file.h"
#include "util/timer.h"

#define INDEX_FILE "model.safetensors.index.json"
#define SINGLE_FILE "model.safetensors"
#define CFG_FILE "config.json"
#define HF_QUANT_FILE "hf_quant_config.json"
#define STATS_FILE "quant_stats.json"

static int cv_fail(clef_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cv_fail(clef_err *err, const char *fmt, ...) {
    char what[CLEF_ERR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return clef_fail(err, 500, CLEF_E_INTERNAL, NULL, "quantize: %s", what);
}

int clef_quant_format_parse(const char *s, clef_quant_format *out) {
    static const struct {
        const char *name;
        clef_quant_format f;
    } names[] = {
        {"nvfp4", CLEF_QF_NVFP4_CT},          {"nvfp4-ct", CLEF_QF_NVFP4_CT},  {"nvfp4-modelopt", CLEF_QF_NVFP4_MODELOPT},
        {"fp8-block", CLEF_QF_FP8_BLOCK},     {"fp8", CLEF_QF_FP8_BLOCK},      {"int4", CLEF_QF_INT4_AUTOROUND},
        {"int4-autoround", CLEF_QF_INT4_AUTOROUND},
    };
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) {
            *out = names[i].f;
            return 0;
        }
    return -1;
}

/* ---- the tensors a quantized matrix becomes ---- */

typedef struct companion {
    const char *suffix;
    clef_dtype dtype;
    int ndim;
    int64_t shape[3];
    size_t bytes;
} companion;

/* Companions of one [rows, cols] matrix in format `f` (per-expert layout);
 * returns how many (2 or 3). */
static int companions_of(clef_quant_format f, int64_t rows, int64_t cols, int64_t group, int64_t br, int64_t bc,
                         companion *c) {
    switch (f) {
    case CLEF_QF_NVFP4_CT:
    case CLEF_QF_NVFP4_MODELOPT: {
        int ct = f == CLEF_QF_NVFP4_CT;
        c[0] = (companion){ct ? "weight_packed" : "weight", CLEF_DT_U8, 2, {rows, cols / 2}, 0};
        c[1] = (companion){"weight_scale", CLEF_DT_F8_E4M3, 2, {rows, cols / 16}, 0};
        c[2] = ct ? (companion){"weight_global_scale", CLEF_DT_F32, 1, {1}, 0}
                  : (companion){"weight_scale_2", CLEF_DT_F32, 0, {0}, 0};
        break;
    }
    case CLEF_QF_FP8_BLOCK:
        c[0] = (companion){"weight", CLEF_DT_F8_E4M3, 2, {rows, cols}, 0};
        c[1] = (companion){"weight_scale_inv", CLEF_DT_F32, 2, {(rows + br - 1) / br, (cols + bc - 1) / bc}, 0};
        break;
    case CLEF_QF_INT4_AUTOROUND:
        c[0] = (companion){"qweight", CLEF_DT_I32, 2, {cols / 8, rows}, 0};
        c[1] = (companion){"qzeros", CLEF_DT_I32, 2, {cols / group, rows / 8}, 0};
        c[2] = (companion){"scales", CLEF_DT_F16, 2, {cols / group, rows}, 0};
        break;
    default: return 0;
    }
    int n = f == CLEF_QF_FP8_BLOCK ? 2 : 3;
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < c[i].ndim; d++) numel *= (size_t)c[i].shape[d];
        c[i].bytes = numel * clef_dtype_size(c[i].dtype);
    }
    return n;
}

/* ---- source catalog ---- */

typedef struct src_tensor {
    const st_tensor *t;
    size_t shard;
} src_tensor;

/* An expert matrix of the thinker decoder. */
typedef struct expert_mat {
    const st_tensor *t;
    size_t shard;
    int64_t layer, expert;
    int proj; /* 0 gate, 1 up, 2 down */
} expert_mat;

typedef struct layer_stats {
    double err2, norm2, matrix_rel_sum;
    size_t matrices, expected;
} layer_stats;

typedef struct conv {
    const clef_quantize_options *o;
    clef_quant_format f;
    int64_t group, br, bc;
    size_t n_shards;
    char **shard_names; /* [n_shards] */
    st_file *shards;    /* [n_shards] */
    src_tensor *cat;    /* all tensors, sorted by name */
    size_t n_cat;
    expert_mat *ex;     /* [n_ex] sorted by layer, expert, proj */
    size_t n_ex;
    int64_t n_layers;   /* 1 + largest layer with experts */
    int64_t n_experts;  /* 1 + largest expert index */
    layer_stats *stats; /* [n_layers] */
    json_value *weight_map;
    json_value *overrides; /* INT4 extra_config being built */
    size_t bytes_in, bytes_out, copied, quantized;
    double matrix_rel_sum;
    double t0;
    /* expert matrices in flight (write_experts) */
    struct slot *slots;
    size_t n_slots;
    /* synthetic source (o->synthetic): the generator's plan; gen[s][i] draws shards[s].tensors[i],
       whose data pointers are NULL */
    clef_synth_plan gen_plan, gen_towers;
    const clef_synth_tensor ***gen;
    uint16_t *u16;
    size_t u16_n;
    /* memory sink (o->memory): the finished shards, the config texts */
    st_file *mem;
    clef_buf config_text, hf_text;
} conv;

/* Where one output shard goes: a file, or memory. */
typedef struct sink {
    st_writer *w;
    clef_mem_shard *m;
} sink;

static int sink_put(sink *k, const char *name, size_t off, const void *data, size_t len, clef_err *err) {
    return k->m ? clef_mem_shard_put(k->m, name, off, data, len, err) : st_writer_put(k->w, name, off, data, len, err);
}

static void *grow(void *p, size_t *cap, size_t need) {
    if (need <= *cap) return p;
    free(p);
    *cap = need;
    return clef_xmalloc(need ? need : 1);
}

static int cat_cmp(const void *a, const void *b) {
    return strcmp(((const src_tensor *)a)->t->name, ((const src_tensor *)b)->t->name);
}

static int catalog_by_name(const void *a, const void *b) {
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

static const src_tensor *cat_find(const conv *cv, const char *name) {
    st_tensor key = {.name = (char *)name};
    src_tensor k = {.t = &key};
    return bsearch(&k, cv->cat, cv->n_cat, sizeof *cv->cat, cat_cmp);
}

/* Drop source pages we are done with from our resident set (they stay in
 * the page cache); without this, mapping a 61 GB checkpoint would show up
 * as 61 GB of RSS by the end. */
static void release_pages(const void *p, size_t n) {
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p, s = (a + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1),
              e = (a + n) & ~(uintptr_t)(page - 1);
    if (e > s) madvise((void *)s, e - s, MADV_DONTNEED);
}

/* "thinker.model.layers.<l>.mlp.experts.<e>.<p>_proj.weight" with a float
 * 2-d tensor → an expert matrix. */
static int parse_expert(const st_tensor *t, int64_t *layer, int64_t *expert, int *proj) {
    static const char pre[] = "thinker.model.layers.";
    size_t n = strlen(t->name);
    if (strncmp(t->name, pre, sizeof pre - 1) || n < 8 || strcmp(t->name + n - 7, ".weight")) return 0;
    if (t->ndim != 2 || (t->dtype != CLEF_DT_BF16 && t->dtype != CLEF_DT_F16 && t->dtype != CLEF_DT_F32)) return 0;
    char module[1024];
    if (n - 7 >= sizeof module) return 0;
    memcpy(module, t->name, n - 7);
    module[n - 7] = '\0';
    if (!clef_expert_module(module, expert, proj)) return 0;
    *layer = strtoll(t->name + sizeof pre - 1, NULL, 10);
    return 1;
}

static int ex_cmp(const void *a, const void *b) {
    const expert_mat *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    if (x->expert != y->expert) return x->expert < y->expert ? -1 : 1;
    return x->proj - y->proj;
}

/* Shard names in index order (every shard, talker-only ones included). */
static int read_shard_names(conv *cv, clef_err *err) {
    const char *dir = cv->o->model_dir;
    clef_buf p = {0};
    clef_buf_printf(&p, "%s/%s", dir, INDEX_FILE);
    int have_index = access(p.data, R_OK) == 0;
    clef_buf_free(&p);
    if (!have_index) {
        cv->shard_names = clef_xcalloc(1, sizeof *cv->shard_names);
        cv->shard_names[cv->n_shards++] = clef_xstrndup(SINGLE_FILE, strlen(SINGLE_FILE));
        return 0;
    }
    size_t len;
    char *text = clef_read_text_file(dir, INDEX_FILE, CLEF_FILE_MAX_INDEX, &len, err);
    if (!text) return -1;
    clef_err jerr;
    json_value *ix = json_parse(text, len, &jerr);
    free(text);
    const json_value *wm = ix ? json_get(ix, "weight_map") : NULL;
    if (!wm || wm->type != JSON_OBJECT) {
        json_free(ix);
        return cv_fail(err, "%s: \"weight_map\" is missing", INDEX_FILE);
    }
    cv->shard_names = clef_xcalloc(wm->n ? wm->n : 1, sizeof *cv->shard_names);
    for (size_t i = 0; i < wm->n; i++) {
        const json_value *s = wm->items[i];
        if (s->type != JSON_STRING || strchr(s->str, '/')) {
            json_free(ix);
            return cv_fail(err, "%s: weight_map entry for '%s' is not a file name", INDEX_FILE, wm->keys[i]);
        }
        size_t j = 0;
        while (j < cv->n_shards && strcmp(cv->shard_names[j], s->str)) j++;
        if (j == cv->n_shards) cv->shard_names[cv->n_shards++] = clef_xstrndup(s->str, s->len);
    }
    json_free(ix);
    return 0;
}

/* Source shard `s` of the synthetic preset: the plan's tensors of plan
 * shard `shard` (all of them when shard < 0), as an st_file without data. */
static void synth_shard(conv *cv, size_t s, const char *name, const clef_synth_plan *p, int shard) {
    cv->shard_names[s] = clef_xstrndup(name, strlen(name));
    clef_buf path = {0};
    clef_buf_printf(&path, "synthetic-%s/%s", cv->o->synthetic, name);
    cv->shards[s].path = clef_xstrndup(path.data, path.len);
    clef_buf_free(&path);
    size_t n = 0;
    for (size_t i = 0; i < p->n; i++) n += shard < 0 || p->t[i].shard == shard;
    cv->shards[s].tensors = clef_xcalloc(n ? n : 1, sizeof *cv->shards[s].tensors);
    cv->gen[s] = clef_xcalloc(n ? n : 1, sizeof *cv->gen[s]);
    for (size_t i = 0; i < p->n; i++) {
        const clef_synth_tensor *g = &p->t[i];
        if (shard >= 0 && g->shard != shard) continue;
        st_tensor *t = &cv->shards[s].tensors[cv->shards[s].n];
        cv->gen[s][cv->shards[s].n++] = g;
        t->name = clef_xstrndup(g->name, strlen(g->name));
        t->dtype = CLEF_DT_BF16;
        t->ndim = g->ndim;
        for (int d = 0; d < g->ndim; d++) t->shape[d] = g->shape[d];
        t->numel = g->numel;
        t->nbytes = g->numel * 2;
    }
}

/* The synthetic preset's thinker shards, then its media towers' shard
 * (model-towers.safetensors, when the preset has towers), as `clef synth`
 * writes and indexes them. */
static int open_synthetic(conv *cv, clef_err *err) {
    const clef_synth_preset *pr = clef_synth_preset_find(cv->o->synthetic, err);
    if (!pr) return -1;
    clef_synth_plan *p = &cv->gen_plan, *tw = &cv->gen_towers;
    clef_synth_plan_make(pr, cv->o->seed, 0, p);
    clef_synth_towers_plan_make(pr, cv->o->seed, tw);
    cv->n_shards = (size_t)p->n_shards + (tw->n > 0);
    cv->shard_names = clef_xcalloc(cv->n_shards, sizeof *cv->shard_names);
    cv->shards = clef_xcalloc(cv->n_shards, sizeof *cv->shards);
    cv->gen = clef_xcalloc(cv->n_shards, sizeof *cv->gen);
    for (int s = 0; s < p->n_shards; s++) {
        char name[64];
        clef_synth_shard_name(s, p->n_shards, name, sizeof name);
        synth_shard(cv, (size_t)s, name, p, s);
    }
    if (tw->n) synth_shard(cv, (size_t)p->n_shards, "model-towers.safetensors", tw, -1);
    return 0;
}

/* The generator tensor behind source tensor `t` of shard `s` (synthetic
 * source), else NULL. */
static const clef_synth_tensor *gen_of(const conv *cv, const st_tensor *t, size_t s) {
    return cv->gen ? cv->gen[s][t - cv->shards[s].tensors] : NULL;
}

static int open_sources(conv *cv, clef_err *err) {
    size_t total = 0;
    if (cv->o->synthetic) {
        if (open_synthetic(cv, err)) return -1;
        for (size_t s = 0; s < cv->n_shards; s++) total += cv->shards[s].n;
    } else {
        if (read_shard_names(cv, err)) return -1;
        cv->shards = clef_xcalloc(cv->n_shards, sizeof *cv->shards);
        for (size_t s = 0; s < cv->n_shards; s++) {
            clef_buf p = {0};
            clef_buf_printf(&p, "%s/%s", cv->o->model_dir, cv->shard_names[s]);
            int rc = st_open(p.data, &cv->shards[s], err);
            clef_buf_free(&p);
            if (rc) return -1;
            total += cv->shards[s].n;
        }
    }
    cv->cat = clef_xcalloc(total ? total : 1, sizeof *cv->cat);
    cv->ex = clef_xcalloc(total ? total : 1, sizeof *cv->ex);
    for (size_t s = 0; s < cv->n_shards; s++)
        for (size_t i = 0; i < cv->shards[s].n; i++) {
            const st_tensor *t = &cv->shards[s].tensors[i];
            cv->cat[cv->n_cat++] = (src_tensor){t, s};
            expert_mat m = {.t = t, .shard = s};
            if (parse_expert(t, &m.layer, &m.expert, &m.proj)) cv->ex[cv->n_ex++] = m;
        }
    qsort(cv->cat, cv->n_cat, sizeof *cv->cat, cat_cmp);
    for (size_t i = 1; i < cv->n_cat; i++)
        if (!strcmp(cv->cat[i - 1].t->name, cv->cat[i].t->name))
            return cv_fail(err, "tensor '%s' is in two shards", cv->cat[i].t->name);
    qsort(cv->ex, cv->n_ex, sizeof *cv->ex, ex_cmp);
    if (cv->n_ex == 0) return cv_fail(err, "no expert weights (thinker.model.layers.*.mlp.experts.*.*_proj.weight) found");
    for (size_t i = 0; i < cv->n_ex; i++) {
        if (cv->ex[i].layer + 1 > cv->n_layers) cv->n_layers = cv->ex[i].layer + 1;
        if (cv->ex[i].expert + 1 > cv->n_experts) cv->n_experts = cv->ex[i].expert + 1;
    }
    cv->stats = clef_xcalloc((size_t)cv->n_layers, sizeof *cv->stats);
    for (size_t i = 0; i < cv->n_ex; i++) cv->stats[cv->ex[i].layer].expected++;
    return 0;
}

/* The other matrices of expert (layer, e): proj 0/1/2 or NULL. */
static const expert_mat *find_mat(const conv *cv, int64_t layer, int64_t e, int proj) {
    expert_mat key = {.layer = layer, .expert = e, .proj = proj};
    return bsearch(&key, cv->ex, cv->n_ex, sizeof *cv->ex, ex_cmp);
}

/* The group size used for a module of input width `cols`. */
static int64_t group_for(const conv *cv, int64_t cols) { return cols < cv->group ? cols : cv->group; }

/* Shapes the format can pack; a clear error otherwise. */
static int check_packable(const conv *cv, const st_tensor *t, clef_err *err) {
    int64_t rows = t->shape[0], cols = t->shape[1];
    switch (cv->f) {
    case CLEF_QF_NVFP4_CT:
    case CLEF_QF_NVFP4_MODELOPT:
        if (cols % 16) return cv_fail(err, "tensor '%s' [%lld,%lld]: NVFP4 needs the input width to be a multiple of 16", t->name, (long long)rows, (long long)cols);
        return 0;
    case CLEF_QF_INT4_AUTOROUND: {
        int64_t g = group_for(cv, cols);
        if (cols % 8 || rows % 8 || cols % g)
            return cv_fail(err, "tensor '%s' [%lld,%lld]: INT4 auto_gptq needs in %% 8 = 0, out %% 8 = 0 and in %% "
                           "group (%lld) = 0", t->name, (long long)rows, (long long)cols, (long long)g);
        return 0;
    }
    default: return 0;
    }
}

/* ---- planning one output shard ---- */

typedef struct plan {
    st_wtensor *t;
    size_t n, cap;
} plan;

static void plan_add(plan *p, const char *name, clef_dtype dt, int ndim, const int64_t *shape) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 64;
        p->t = clef_xrealloc(p->t, p->cap * sizeof *p->t);
    }
    st_wtensor *w = &p->t[p->n++];
    memset(w, 0, sizeof *w);
    w->name = clef_xstrndup(name, strlen(name));
    w->dtype = dt;
    w->ndim = ndim;
    for (int d = 0; d < ndim; d++) w->shape[d] = shape[d];
}

static void plan_free(plan *p) {
    for (size_t i = 0; i < p->n; i++) free((char *)p->t[i].name);
    free(p->t);
    memset(p, 0, sizeof *p);
}

/* "<module>" of an expert matrix tensor name (strip ".weight"). */
static char *module_of(const st_tensor *t) { return clef_xstrndup(t->name, strlen(t->name) - 7); }

/* "thinker.model.layers.<l>.mlp.experts" */
static char *experts_prefix(const st_tensor *t) {
    const char *p = strstr(t->name, ".mlp.experts.");
    return clef_xstrndup(t->name, (size_t)(p - t->name) + strlen(".mlp.experts"));
}

static void map_put(conv *cv, const char *name, size_t shard) {
    json_object_set(cv->weight_map, name, strlen(name),
                    json_new_string(cv->shard_names[shard], strlen(cv->shard_names[shard])));
}

/* The stacked tensors of a layer: gate_up (proj 0) or down (proj 2). */
static void plan_stacked(conv *cv, plan *p, const expert_mat *m0, size_t shard) {
    char *pre = experts_prefix(m0->t);
    int64_t E = cv->n_experts, rows = m0->t->shape[0], cols = m0->t->shape[1];
    int64_t per = m0->proj == 2 ? rows : 2 * rows;
    const char *what = m0->proj == 2 ? "down_proj" : "gate_up_proj";
    clef_buf n = {0};
    int64_t s1[3] = {E, per, cols / 2}, s2[3] = {E, per, cols / 16}, s3[1] = {E};
    clef_buf_printf(&n, "%s.%s.weight_packed", pre, what);
    plan_add(p, n.data, CLEF_DT_U8, 3, s1);
    map_put(cv, n.data, shard);
    n.len = 0;
    clef_buf_printf(&n, "%s.%s.weight_scale", pre, what);
    plan_add(p, n.data, CLEF_DT_F8_E4M3, 3, s2);
    map_put(cv, n.data, shard);
    n.len = 0;
    clef_buf_printf(&n, "%s.%s.weight_global_scale", pre, what);
    plan_add(p, n.data, CLEF_DT_F32, 1, s3);
    map_put(cv, n.data, shard);
    clef_buf_free(&n);
    free(pre);
}

/* Every layer's experts must be complete (gate, up, down of 0..E-1, one
 * shape per projection) before a stacked tensor can hold them. */
static int check_stacked(const conv *cv, clef_err *err) {
    for (size_t i = 0; i < cv->n_ex; i++) {
        const expert_mat *m = &cv->ex[i];
        for (int64_t e = 0; e < cv->n_experts; e++) {
            const expert_mat *o = find_mat(cv, m->layer, e, m->proj);
            if (!o)
                return cv_fail(err, "stacked layout: layer %lld has no expert %lld %s_proj (needs all %lld experts)",
                               (long long)m->layer, (long long)e, m->proj == 2 ? "down" : m->proj ? "up" : "gate",
                               (long long)cv->n_experts);
            if (o->t->shape[0] != m->t->shape[0] || o->t->shape[1] != m->t->shape[1])
                return cv_fail(err, "stacked layout: tensor '%s' differs in shape from '%s'", o->t->name, m->t->name);
        }
        if (m->proj == 1) {
            const expert_mat *g = find_mat(cv, m->layer, m->expert, 0);
            if (g->t->shape[0] != m->t->shape[0] || g->t->shape[1] != m->t->shape[1])
                return cv_fail(err, "stacked layout: '%s' and '%s' differ in shape", g->t->name, m->t->name);
        }
    }
    return 0;
}

static void note_group_override(conv *cv, const char *module, int64_t g) {
    if (g == cv->group) return;
    json_value *o = json_new(JSON_OBJECT);
    json_object_set(o, "group_size", 10, json_new_int(g));
    json_object_set(cv->overrides, module, strlen(module), o);
}

static int plan_shard(conv *cv, size_t s, plan *p, clef_err *err) {
    const st_file *f = &cv->shards[s];
    for (size_t i = 0; i < f->n; i++) {
        const st_tensor *t = &f->tensors[i];
        expert_mat key;
        if (!parse_expert(t, &key.layer, &key.expert, &key.proj)) {
            plan_add(p, t->name, t->dtype, t->ndim, t->shape);
            map_put(cv, t->name, s);
            continue;
        }
        if (check_packable(cv, t, err)) return -1;
        if (cv->o->stacked) {
            if (key.expert == 0 && key.proj != 1) plan_stacked(cv, p, find_mat(cv, key.layer, 0, key.proj), s);
            continue;
        }
        char *module = module_of(t);
        int64_t g = group_for(cv, t->shape[1]);
        if (cv->f == CLEF_QF_INT4_AUTOROUND) note_group_override(cv, module, g);
        companion c[3];
        int nc = companions_of(cv->f, t->shape[0], t->shape[1], g, cv->br, cv->bc, c);
        for (int k = 0; k < nc; k++) {
            clef_buf n = {0};
            clef_buf_printf(&n, "%s.%s", module, c[k].suffix);
            plan_add(p, n.data, c[k].dtype, c[k].ndim, c[k].shape);
            map_put(cv, n.data, s);
            clef_buf_free(&n);
        }
        free(module);
    }
    return 0;
}

/* ---- writing ---- */

static int copy_tensor(conv *cv, sink *w, const st_tensor *t, size_t shard, clef_err *err) {
    const size_t chunk = (size_t)64 << 20;
    const clef_synth_tensor *g = gen_of(cv, t, shard);
    if (g) cv->u16 = grow(cv->u16, &cv->u16_n, t->nbytes < chunk ? t->nbytes : chunk);
    for (size_t off = 0; off < t->nbytes; off += chunk) {
        size_t n = t->nbytes - off < chunk ? t->nbytes - off : chunk;
        const void *src = (const char *)t->data + off;
        if (g) { /* draw the piece (bf16: 2 bytes an element) */
            clef_synth_fill(g, off / 2, n / 2, cv->u16);
            src = cv->u16;
        }
        if (sink_put(w, t->name, off, src, n, err)) return -1;
    }
    if (!g) release_pages(t->data, t->nbytes);
    cv->bytes_in += t->nbytes;
    cv->bytes_out += t->nbytes;
    cv->copied++;
    return 0;
}

/* The scratch of one expert matrix in flight: write_shard quantizes a batch
 * of matrices in parallel (one slot each, OpenMP), then writes them and
 * accumulates their statistics in order, so the output and quant_stats.json
 * do not depend on the thread count. */
typedef struct slot {
    const expert_mat *m;
    float *fa, *fb, *fdq;
    size_t fa_n, fb_n, fdq_n;
    uint16_t *u16;
    size_t u16_n;
    uint8_t *qb[3];   /* the companions' bytes */
    size_t qb_n[3];
    float global;     /* NVFP4 global scale / scale_2 */
    float amax;       /* largest |w| of the matrix (NVFP4) */
    double e2, n2;    /* Σ(W − deq)², ΣW² */
} slot;

static void slot_free(slot *sl) {
    free(sl->fa);
    free(sl->fb);
    free(sl->fdq);
    free(sl->u16);
    for (int k = 0; k < 3; k++) free(sl->qb[k]);
    memset(sl, 0, sizeof *sl);
}

/* Source matrix (tensor `t` of shard `shard`) as f32 in `*buf`: converted
 * from the map (whose pages are then dropped), or drawn by the generator.
 * Thread-safe (scratch from `sl`). */
static float *load_f32(const conv *cv, const st_tensor *t, size_t shard, float **buf, size_t *cap, slot *sl) {
    *buf = grow(*buf, cap, t->numel * sizeof(float));
    const clef_synth_tensor *g = gen_of(cv, t, shard);
    if (g) {
        sl->u16 = grow(sl->u16, &sl->u16_n, t->numel * 2);
        clef_synth_fill(g, 0, t->numel, sl->u16);
        clef_to_f32(CLEF_DT_BF16, sl->u16, *buf, t->numel);
        return *buf;
    }
    clef_to_f32(t->dtype, t->data, *buf, t->numel);
    release_pages(t->data, t->nbytes);
    return *buf;
}

/* Quantize w [rows, cols] into sl->qb[0..2] (the companions' bytes) and
 * describe the result as a clef_qweight for the error measurement. */
static void quantize_into(const conv *cv, slot *sl, const float *w, int64_t rows, int64_t cols, float global,
                          clef_qweight *qw) {
    int64_t g = group_for(cv, cols);
    companion c[3];
    int nc = companions_of(cv->f, rows, cols, g, cv->br, cv->bc, c);
    for (int k = 0; k < nc; k++) sl->qb[k] = grow(sl->qb[k], &sl->qb_n[k], c[k].bytes);
    memset(qw, 0, sizeof *qw);
    qw->rows = rows;
    qw->cols = cols;
    qw->data = sl->qb[0];
    switch (cv->f) {
    case CLEF_QF_NVFP4_CT:
    case CLEF_QF_NVFP4_MODELOPT: {
        int ct = cv->f == CLEF_QF_NVFP4_CT;
        clef_quantize_nvfp4(w, rows, cols, global, ct, sl->qb[0], sl->qb[1]);
        memcpy(sl->qb[2], &global, 4);
        qw->dtype = CLEF_DT_U8;
        qw->quant = (clef_wquant){.type = CLEF_QT_NVFP4, .scale = sl->qb[1], .group = 16, .global = global, .global_div = ct};
        break;
    }
    case CLEF_QF_FP8_BLOCK:
        clef_quantize_fp8_block(w, rows, cols, cv->br, cv->bc, sl->qb[0], (float *)(void *)sl->qb[1]);
        qw->dtype = CLEF_DT_F8_E4M3;
        qw->quant = (clef_wquant){.type = CLEF_QT_FP8_BLOCK, .scale = sl->qb[1], .block_r = cv->br, .block_c = cv->bc};
        break;
    case CLEF_QF_INT4_AUTOROUND:
        clef_quantize_int4(w, rows, cols, g, (uint32_t *)(void *)sl->qb[0], (uint32_t *)(void *)sl->qb[1],
                           (uint16_t *)(void *)sl->qb[2]);
        qw->dtype = CLEF_DT_I32;
        qw->quant = (clef_wquant){.type = CLEF_QT_INT4_GPTQ, .scale = sl->qb[2], .group = g};
        break;
    default: break;
    }
}

/* Squared error of what will be written, measured through the reader's own
 * dequantization, into sl->e2 / sl->n2. */
static void measure(slot *sl, const float *w, const clef_qweight *qw) {
    const int64_t R = qw->rows, C = qw->cols, B = 64;
    sl->fdq = grow(sl->fdq, &sl->fdq_n, (size_t)(B * C) * sizeof(float));
    double e2 = 0, n2 = 0;
    for (int64_t r0 = 0; r0 < R; r0 += B) {
        int64_t r1 = r0 + B < R ? r0 + B : R;
        clef_qweight_rows_f32(qw, r0, r1, sl->fdq);
        for (int64_t i = 0; i < (r1 - r0) * C; i++) {
            double x = w[r0 * C + i], d = x - (double)sl->fdq[i];
            e2 += d * d;
            n2 += x * x;
        }
    }
    sl->e2 = e2;
    sl->n2 = n2;
}

/* Add a written matrix's error to the statistics (in order); a progress
 * line when its layer is complete. */
static void record(conv *cv, const slot *sl) {
    const expert_mat *m = sl->m;
    layer_stats *ls = &cv->stats[m->layer];
    double rel = sl->n2 > 0 ? sqrt(sl->e2 / sl->n2) : 0.0;
    ls->err2 += sl->e2;
    ls->norm2 += sl->n2;
    ls->matrix_rel_sum += rel;
    ls->matrices++;
    cv->matrix_rel_sum += rel;
    cv->quantized++;
    cv->bytes_in += m->t->nbytes;
    if (cv->o->progress && ls->matrices == ls->expected) {
        fprintf(stderr, "clef quantize: layer %lld/%lld: %zu expert matrices, relative L2 error %.2f%% "
                "(%.1f s, peak RSS %.0f MiB)\n", (long long)m->layer + 1, (long long)cv->n_layers, ls->matrices,
                100.0 * sqrt(ls->err2 / (ls->norm2 > 0 ? ls->norm2 : 1)), clef_now() - cv->t0,
                (double)clef_peak_rss_bytes() / (1024.0 * 1024.0));
        fflush(stderr);
    }
}

/* The global scale expert matrix `m` is quantized with (gate and up share
 * one, from the amax over both).  `partner_amax` >= 0: the partner's amax,
 * already known (same batch); otherwise the partner is loaded. */
static float global_for(const conv *cv, slot *sl, const expert_mat *m, float amax_self, float partner_amax) {
    float amax = amax_self;
    if (m->proj != 2 && partner_amax >= 0) {
        if (partner_amax > amax) amax = partner_amax;
    } else if (m->proj != 2) {
        const expert_mat *o = find_mat(cv, m->layer, m->expert, 1 - m->proj);
        if (o) {
            load_f32(cv, o->t, o->shard, &sl->fb, &sl->fb_n, sl); /* re-touched source pages are dropped again */
            float a2 = clef_amax(sl->fb, o->t->numel);
            if (a2 > amax) amax = a2;
        }
    }
    return cv->f == CLEF_QF_NVFP4_CT ? clef_nvfp4_global_scale(amax) : clef_nvfp4_scale_2(amax);
}

static int is_nvfp4(clef_quant_format f) { return f == CLEF_QF_NVFP4_CT || f == CLEF_QF_NVFP4_MODELOPT; }

/* Draw/convert expert matrix `m` into `sl` (and its amax for NVFP4).
 * Thread-safe: reads only shared state. */
static void load_expert(const conv *cv, slot *sl, const expert_mat *m) {
    sl->m = m;
    load_f32(cv, m->t, m->shard, &sl->fa, &sl->fa_n, sl);
    sl->amax = is_nvfp4(cv->f) ? clef_amax(sl->fa, m->t->numel) : 0;
}

/* Quantize and measure the matrix loaded in `sl`; `partner_amax` as in
 * global_for.  Thread-safe. */
static void quantize_expert(const conv *cv, slot *sl, float partner_amax) {
    const expert_mat *m = sl->m;
    const int64_t R = m->t->shape[0], C = m->t->shape[1];
    const float *x = sl->fa;
    sl->global = is_nvfp4(cv->f) ? global_for(cv, sl, m, sl->amax, partner_amax) : 0;
    clef_qweight qw;
    quantize_into(cv, sl, x, R, C, sl->global, &qw);
    measure(sl, x, &qw);
}

/* Per-expert layout: write a quantized matrix's companions. */
static int put_expert(conv *cv, sink *w, const slot *sl, clef_err *err) {
    const expert_mat *m = sl->m;
    const int64_t R = m->t->shape[0], C = m->t->shape[1];
    companion c[3];
    int nc = companions_of(cv->f, R, C, group_for(cv, C), cv->br, cv->bc, c);
    char *module = module_of(m->t);
    int rc = 0;
    for (int k = 0; k < nc && rc == 0; k++) {
        clef_buf n = {0};
        clef_buf_printf(&n, "%s.%s", module, c[k].suffix);
        rc = sink_put(w, n.data, 0, sl->qb[k], c[k].bytes, err);
        cv->bytes_out += c[k].bytes;
        clef_buf_free(&n);
    }
    free(module);
    if (rc == 0) record(cv, sl);
    return rc;
}

/* Stacked layout: expert e's slice of the layer's gate_up (gate rows, then
 * up rows) or down tensors. */
static int put_stacked(conv *cv, sink *w, const slot *sl, clef_err *err) {
    const expert_mat *m = sl->m;
    const int64_t R = m->t->shape[0], C = m->t->shape[1], per = m->proj == 2 ? R : 2 * R;
    const int64_t row_in_expert = m->proj == 1 ? R : 0;
    const char *what = m->proj == 2 ? "down_proj" : "gate_up_proj";
    char *pre = experts_prefix(m->t);
    clef_buf n = {0};
    size_t row0 = (size_t)(m->expert * per + row_in_expert);
    clef_buf_printf(&n, "%s.%s.weight_packed", pre, what);
    int rc = sink_put(w, n.data, row0 * (size_t)(C / 2), sl->qb[0], (size_t)(R * C / 2), err);
    n.len = 0;
    clef_buf_printf(&n, "%s.%s.weight_scale", pre, what);
    if (rc == 0) rc = sink_put(w, n.data, row0 * (size_t)(C / 16), sl->qb[1], (size_t)(R * C / 16), err);
    n.len = 0;
    clef_buf_printf(&n, "%s.%s.weight_global_scale", pre, what);
    if (rc == 0 && m->proj != 1) rc = sink_put(w, n.data, 4 * (size_t)m->expert, &sl->global, 4, err);
    cv->bytes_out += (size_t)(R * C / 2 + R * C / 16) + (m->proj != 1 ? 4 : 0);
    clef_buf_free(&n);
    free(pre);
    if (rc == 0) record(cv, sl);
    return rc;
}

/* Slot of the batch holding the gate/up partner of the matrix in slot j,
 * or -1 (down, or the partner is not in this batch). */
static long partner_slot(const conv *cv, long j, long nb) {
    const expert_mat *m = cv->slots[j].m;
    if (m->proj == 2) return -1;
    for (long k = j > 0 ? j - 1 : 0; k < nb && k <= j + 1; k++) /* (layer, expert, proj) order: a neighbour */
        if (k != j && cv->slots[k].m->layer == m->layer && cv->slots[k].m->expert == m->expert &&
            cv->slots[k].m->proj == 1 - m->proj)
            return k;
    return -1;
}

/* Quantize and write the expert matrices indexed by todo[0..n) (in order),
 * a batch of cv->n_slots at a time in parallel: every matrix of the batch
 * is loaded first, so NVFP4's shared gate/up global scale takes the
 * partner's amax from its slot instead of loading the partner again. */
static int write_experts(conv *cv, sink *w, const size_t *todo, size_t n, clef_err *err) {
    int rc = 0;
    for (size_t b = 0; rc == 0 && b < n; b += cv->n_slots) {
        long nb = (long)(n - b < cv->n_slots ? n - b : cv->n_slots);
        const conv *ccv = cv;
#pragma omp parallel for schedule(dynamic, 1)
        for (long j = 0; j < nb; j++) load_expert(ccv, &cv->slots[j], &ccv->ex[todo[b + (size_t)j]]);
#pragma omp parallel for schedule(dynamic, 1)
        for (long j = 0; j < nb; j++) {
            long k = partner_slot(ccv, j, nb);
            quantize_expert(ccv, &cv->slots[j], k >= 0 ? cv->slots[k].amax : -1.0f);
        }
        for (long j = 0; rc == 0 && j < nb; j++)
            rc = cv->o->stacked ? put_stacked(cv, w, &cv->slots[j], err) : put_expert(cv, w, &cv->slots[j], err);
    }
    return rc;
}

static int write_shard(conv *cv, size_t s, clef_err *err) {
    plan p = {0};
    clef_buf path = {0};
    if (cv->o->memory)
        clef_buf_printf(&path, "synthetic-%s-%s/%s", cv->o->synthetic, clef_quant_format_name(cv->f), cv->shard_names[s]);
    else
        clef_buf_printf(&path, "%s/%s", cv->o->out_dir, cv->shard_names[s]);
    int rc = plan_shard(cv, s, &p, err);
    static const char *const meta[] = {"format", "pt", NULL};
    sink sk = {0}, *w = &sk;
    if (rc == 0 && cv->o->memory) sk.m = clef_mem_shard_create(path.data, p.t, p.n, err);
    else if (rc == 0) sk.w = st_writer_create(path.data, p.t, p.n, meta, err);
    if (!sk.m && !sk.w) rc = -1;
    if (cv->o->progress && rc == 0)
        fprintf(stderr, "clef quantize: %s: %zu tensors in, %zu out\n", cv->shard_names[s], cv->shards[s].n, p.n);
    const st_file *f = &cv->shards[s];
    for (size_t i = 0; rc == 0 && i < f->n; i++) {
        const st_tensor *t = &f->tensors[i];
        expert_mat key;
        if (!parse_expert(t, &key.layer, &key.expert, &key.proj)) rc = copy_tensor(cv, w, t, s, err);
    }
    /* experts in (layer, expert, proj) order; stacked slices go wherever the
     * layer's expert 0 put the stacked tensor */
    size_t *todo = clef_xcalloc(cv->n_ex + 1, sizeof *todo), n_todo = 0;
    for (size_t i = 0; i < cv->n_ex; i++) {
        const expert_mat *m = &cv->ex[i];
        size_t home = cv->o->stacked ? find_mat(cv, m->layer, 0, m->proj == 2 ? 2 : 0)->shard : m->shard;
        if (home == s) todo[n_todo++] = i;
    }
    if (rc == 0) rc = write_experts(cv, w, todo, n_todo, err);
    free(todo);
    if (sk.w) {
        if (rc == 0) rc = st_writer_finish(sk.w, err);
        else st_writer_abort(sk.w);
    }
    if (sk.m) {
        if (rc == 0) rc = clef_mem_shard_finish(sk.m, &cv->mem[s], err);
        else clef_mem_shard_abort(sk.m);
    }
    plan_free(&p);
    clef_buf_free(&path);
    return rc;
}

/* ---- JSON files ---- */

/* json.dumps(v, indent=2, sort_keys=True) with non-ASCII kept as UTF-8. */
static void render_pretty(const json_value *v, int depth, clef_buf *out) {
    if ((v->type != JSON_ARRAY && v->type != JSON_OBJECT) || v->n == 0) {
        json_render(v, out);
        return;
    }
    size_t n = v->n, *ord = clef_xcalloc(n, sizeof *ord);
    for (size_t i = 0; i < n; i++) ord[i] = i;
    if (v->type == JSON_OBJECT) /* insertion sort by key bytes: configs are small */
        for (size_t i = 1; i < n; i++)
            for (size_t j = i; j > 0 && strcmp(v->keys[ord[j - 1]], v->keys[ord[j]]) > 0; j--) {
                size_t t = ord[j];
                ord[j] = ord[j - 1];
                ord[j - 1] = t;
            }
    clef_buf_putc(out, v->type == JSON_OBJECT ? '{' : '[');
    for (size_t i = 0; i < n; i++) {
        clef_buf_printf(out, "%s\n%*s", i ? "," : "", 2 * (depth + 1), "");
        if (v->type == JSON_OBJECT) {
            json_render_string(v->keys[ord[i]], v->key_lens[ord[i]], out);
            clef_buf_puts(out, ": ");
        }
        render_pretty(v->items[ord[i]], depth + 1, out);
    }
    clef_buf_printf(out, "\n%*s%c", 2 * depth, "", v->type == JSON_OBJECT ? '}' : ']');
    free(ord);
}

static int write_text(const char *dir, const char *name, const char *text, size_t len, clef_err *err) {
    clef_buf p = {0};
    clef_buf_printf(&p, "%s/%s", dir, name);
    FILE *f = fopen(p.data, "wb");
    int ok = f && fwrite(text, 1, len, f) == len;
    if (f && fclose(f) != 0) ok = 0;
    clef_buf_free(&p);
    return ok ? 0 : cv_fail(err, "cannot write %s/%s: %s", dir, name, strerror(errno));
}

static int write_json(const char *dir, const char *name, const json_value *v, clef_err *err) {
    clef_buf b = {0};
    render_pretty(v, 0, &b);
    clef_buf_putc(&b, '\n');
    int rc = write_text(dir, name, b.data, b.len, err);
    clef_buf_free(&b);
    return rc;
}

/* Modules clef leaves in BF16, in each publisher's pattern language. */
static const char *const KEEP_CT[] = {"lm_head", "re:.*self_attn.*", "re:.*mlp\\\\.gate$", "re:.*visual.*",
                                      "re:.*audio_tower.*", "re:.*talker.*", "re:.*code2wav.*", NULL};
static const char *const KEEP_GLOB[] = {"lm_head", "*self_attn*", "*mlp.gate", "*visual*", "*audio_tower*",
                                        "*talker*", "*code2wav*", NULL};
static const char *const KEEP_SUB[] = {"lm_head", "mlp.gate", "self_attn", "visual", "audio_tower", "talker",
                                       "code2wav", NULL};

static void put_list(clef_buf *b, const char *const *items) {
    clef_buf_putc(b, '[');
    for (size_t i = 0; items[i]; i++) clef_buf_printf(b, "%s\"%s\"", i ? "," : "", items[i]);
    clef_buf_putc(b, ']');
}

/* The text of the format's quantization_config. */
static void quant_config_text(conv *cv, clef_buf *b) {
    switch (cv->f) {
    case CLEF_QF_NVFP4_CT:
        clef_buf_puts(b, "{\"quant_method\":\"compressed-tensors\",\"format\":\"nvfp4-pack-quantized\","
                         "\"quantization_status\":\"compressed\",\"global_compression_ratio\":null,"
                         "\"kv_cache_scheme\":null,\"config_groups\":{\"group_0\":{\"targets\":[\"Linear\"],"
                         "\"input_activations\":null,\"output_activations\":null,\"weights\":{\"num_bits\":4,"
                         "\"type\":\"float\",\"strategy\":\"tensor_group\",\"group_size\":16,\"symmetric\":true,"
                         "\"dynamic\":false,\"observer\":\"minmax\",\"actorder\":null,\"block_structure\":null}}},"
                         "\"ignore\":");
        put_list(b, KEEP_CT);
        clef_buf_putc(b, '}');
        break;
    case CLEF_QF_NVFP4_MODELOPT:
        clef_buf_puts(b, "{\"quant_method\":\"modelopt\",\"quant_algo\":\"NVFP4\",\"group_size\":16,"
                         "\"kv_cache_quant_algo\":null,\"exclude_modules\":");
        put_list(b, KEEP_GLOB);
        clef_buf_putc(b, '}');
        break;
    case CLEF_QF_FP8_BLOCK:
        clef_buf_printf(b, "{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"activation_scheme\":\"dynamic\","
                           "\"weight_block_size\":[%lld,%lld],\"modules_to_not_convert\":",
                        (long long)cv->br, (long long)cv->bc);
        put_list(b, KEEP_SUB);
        clef_buf_putc(b, '}');
        break;
    case CLEF_QF_INT4_AUTOROUND: {
        clef_buf_printf(b, "{\"quant_method\":\"auto-round\",\"packing_format\":\"auto_round:auto_gptq\","
                           "\"bits\":4,\"group_size\":%lld,\"sym\":true,\"data_type\":\"int\",\"iters\":0,"
                           "\"autoround_version\":\"clef\",\"block_name_to_quantize\":\"thinker.model.layers\","
                           "\"extra_config\":", (long long)cv->group);
        json_render(cv->overrides, b);
        clef_buf_putc(b, '}');
        break;
    }
    default: clef_buf_puts(b, "null");
    }
}

/* INT4: every decoder Linear clef leaves in BF16 is listed with bits 16
 * (AutoRound's convention: an unlisted module of a quantized block is
 * expected packed). */
static void int4_keep_bf16(conv *cv) {
    static const char *const lin[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                      "mlp.gate"};
    for (int64_t l = 0; l < cv->n_layers; l++)
        for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
            clef_buf m = {0};
            clef_buf_printf(&m, "thinker.model.layers.%lld.%s", (long long)l, lin[i]);
            clef_buf w = {0};
            clef_buf_printf(&w, "%s.weight", m.data);
            if (cat_find(cv, w.data)) {
                json_value *o = json_new(JSON_OBJECT);
                json_object_set(o, "bits", 4, json_new_int(16));
                json_object_set(o, "data_type", 9, json_new_string("float", 5));
                json_object_set(cv->overrides, m.data, m.len, o);
            }
            clef_buf_free(&m);
            clef_buf_free(&w);
        }
}

/* config.json (+ hf_quant_config.json for ModelOpt) as pretty JSON texts
 * into cv->config_text / hf_text; written to out_dir unless in memory. */
static int write_configs(conv *cv, clef_err *err) {
    const char *in = cv->o->model_dir, *out = cv->o->out_dir;
    size_t len;
    char *text;
    if (cv->o->synthetic) { /* the text `clef synth` writes */
        clef_buf b = {0};
        clef_synth_config_json(cv->gen_plan.preset, cv->o->seed, &b);
        text = b.data;
        len = b.len;
        in = "synthetic";
    } else if (!(text = clef_read_text_file(in, CFG_FILE, CLEF_FILE_MAX_CONFIG, &len, err))) {
        return -1;
    }
    clef_err jerr;
    json_value *cfg = json_parse(text, len, &jerr);
    free(text);
    if (!cfg || cfg->type != JSON_OBJECT) {
        json_free(cfg);
        return cv_fail(err, "%s/%s is not a JSON object", in, CFG_FILE);
    }
    clef_buf qt = {0};
    quant_config_text(cv, &qt);
    json_value *q = json_parse(qt.data, qt.len, &jerr);
    clef_buf_free(&qt);
    json_object_set(cfg, "quantization_config", strlen("quantization_config"), q);
    render_pretty(cfg, 0, &cv->config_text);
    clef_buf_putc(&cv->config_text, '\n');
    json_free(cfg);
    int rc = cv->o->memory ? 0 : write_text(out, CFG_FILE, cv->config_text.data, cv->config_text.len, err);
    if (rc == 0 && cv->f == CLEF_QF_NVFP4_MODELOPT) {
        clef_buf h = {0};
        clef_buf_puts(&h, "{\"producer\":{\"name\":\"modelopt\",\"version\":\"clef\"},\"quantization\":{"
                          "\"quant_algo\":\"NVFP4\",\"kv_cache_quant_algo\":null,\"group_size\":16,\"exclude_modules\":");
        put_list(&h, KEEP_GLOB);
        clef_buf_puts(&h, "}}");
        json_value *hv = json_parse(h.data, h.len, &jerr);
        clef_buf_free(&h);
        render_pretty(hv, 0, &cv->hf_text);
        clef_buf_putc(&cv->hf_text, '\n');
        json_free(hv);
        if (!cv->o->memory) rc = write_text(out, HF_QUANT_FILE, cv->hf_text.data, cv->hf_text.len, err);
    }
    return rc;
}

static int write_index(conv *cv, clef_err *err) {
    if (cv->o->memory) return 0;
    if (cv->n_shards == 1 && !strcmp(cv->shard_names[0], SINGLE_FILE)) return 0;
    json_value *ix = json_new(JSON_OBJECT), *meta = json_new(JSON_OBJECT);
    json_object_set(meta, "total_size", 10, json_new_int((int64_t)cv->bytes_out));
    json_object_set(ix, "metadata", 8, meta);
    json_object_set(ix, "weight_map", 10, cv->weight_map);
    cv->weight_map = NULL;
    int rc = write_json(cv->o->out_dir, INDEX_FILE, ix, err);
    json_free(ix);
    return rc;
}

static int write_stats(conv *cv, clef_quantize_report *rep, clef_err *err) {
    json_value *st = json_new(JSON_OBJECT), *layers = json_new(JSON_ARRAY);
    const char *fname = clef_quant_format_name(cv->f);
    json_object_set(st, "format", 6, json_new_string(fname, strlen(fname)));
    const char *layout = cv->o->stacked ? "stacked" : "per-expert";
    json_object_set(st, "layout", 6, json_new_string(layout, strlen(layout)));
    double sum = 0;
    size_t n = 0;
    for (int64_t l = 0; l < cv->n_layers; l++) {
        const layer_stats *ls = &cv->stats[l];
        if (!ls->matrices) continue;
        double rel = ls->norm2 > 0 ? sqrt(ls->err2 / ls->norm2) : 0;
        json_value *o = json_new(JSON_OBJECT);
        json_object_set(o, "layer", 5, json_new_int(l));
        json_object_set(o, "rel_l2", 6, json_new_float(rel));
        json_object_set(o, "mean_matrix_rel_l2", 18, json_new_float(ls->matrix_rel_sum / (double)ls->matrices));
        json_object_set(o, "matrices", 8, json_new_int((int64_t)ls->matrices));
        json_array_push(layers, o);
        sum += rel;
        n++;
    }
    rep->mean_rel_l2 = n ? sum / (double)n : 0;
    rep->mean_matrix_rel_l2 = cv->quantized ? cv->matrix_rel_sum / (double)cv->quantized : 0;
    rep->peak_rss_bytes = clef_peak_rss_bytes();
    rep->seconds = clef_now() - cv->t0;
    if (cv->o->memory) {
        json_free(st);
        json_free(layers);
        return 0;
    }
    json_object_set(st, "layers", 6, layers);
    json_object_set(st, "mean_rel_l2", 11, json_new_float(rep->mean_rel_l2));
    json_object_set(st, "mean_matrix_rel_l2", 18, json_new_float(rep->mean_matrix_rel_l2));
    json_object_set(st, "peak_rss_bytes", 14, json_new_int((int64_t)rep->peak_rss_bytes));
    json_object_set(st, "seconds", 7, json_new_float(rep->seconds));
    json_object_set(st, "bytes_in", 8, json_new_int((int64_t)cv->bytes_in));
    json_object_set(st, "bytes_out", 9, json_new_int((int64_t)cv->bytes_out));
    int rc = write_json(cv->o->out_dir, STATS_FILE, st, err);
    json_free(st);
    return rc;
}

/* Copy every other regular file (tokenizer, joint head, generation config...). */
static int copy_other_files(conv *cv, clef_err *err) {
    DIR *d = opendir(cv->o->model_dir);
    if (!d) return cv_fail(err, "cannot list %s: %s", cv->o->model_dir, strerror(errno));
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        const char *n = de->d_name;
        int skip = n[0] == '.' || !strcmp(n, INDEX_FILE) || !strcmp(n, CFG_FILE) || !strcmp(n, HF_QUANT_FILE) ||
                   !strcmp(n, STATS_FILE);
        for (size_t s = 0; !skip && s < cv->n_shards; s++) skip = !strcmp(n, cv->shard_names[s]);
        if (skip) continue;
        clef_buf src = {0}, dst = {0};
        clef_buf_printf(&src, "%s/%s", cv->o->model_dir, n);
        clef_buf_printf(&dst, "%s/%s", cv->o->out_dir, n);
        struct stat sb;
        if (stat(src.data, &sb) == 0 && S_ISREG(sb.st_mode)) {
            int in = open(src.data, O_RDONLY | O_CLOEXEC), out = open(dst.data, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            char buf[1 << 16];
            ssize_t k = 0;
            while (in >= 0 && out >= 0 && (k = read(in, buf, sizeof buf)) > 0)
                if (write(out, buf, (size_t)k) != k) k = -1, errno = EIO;
            if (in < 0 || out < 0 || k < 0) rc = cv_fail(err, "cannot copy %s: %s", src.data, strerror(errno));
            if (in >= 0) close(in);
            if (out >= 0 && close(out) != 0 && rc == 0) rc = cv_fail(err, "cannot write %s", dst.data);
        }
        clef_buf_free(&src);
        clef_buf_free(&dst);
    }
    closedir(d);
    return rc;
}

/* The synthetic preset's joint head (shard -1 of the generator's plan) as
 * one shard: joint_head.safetensors in out_dir (no metadata, as `clef
 * synth` writes it) or in memory. */
static int synth_head(conv *cv, st_file *mem_out, clef_err *err) {
    const clef_synth_plan *p = &cv->gen_plan;
    size_t lo = 0;
    while (lo < p->n && p->t[lo].shard != -1) lo++;
    size_t n = p->n - lo;
    st_wtensor *decl = clef_xcalloc(n + 1, sizeof *decl);
    for (size_t i = 0; i < n; i++) {
        const clef_synth_tensor *t = &p->t[lo + i];
        decl[i] = (st_wtensor){.name = t->name, .dtype = CLEF_DT_BF16, .ndim = t->ndim};
        decl[i].shape[0] = t->shape[0];
        decl[i].shape[1] = t->shape[1];
    }
    clef_buf path = {0};
    if (mem_out) clef_buf_printf(&path, "synthetic-%s-%s/joint_head.safetensors", cv->o->synthetic,
                                 clef_quant_format_name(cv->f));
    else clef_buf_printf(&path, "%s/joint_head.safetensors", cv->o->out_dir);
    sink sk = {0};
    if (mem_out) sk.m = clef_mem_shard_create(path.data, decl, n, err);
    else sk.w = st_writer_create(path.data, decl, n, NULL, err);
    int rc = sk.m || sk.w ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const clef_synth_tensor *t = &p->t[lo + i];
        cv->u16 = grow(cv->u16, &cv->u16_n, t->numel * 2);
        clef_synth_fill(t, 0, t->numel, cv->u16);
        rc = sink_put(&sk, t->name, 0, cv->u16, t->numel * 2, err);
    }
    if (sk.w) rc = rc == 0 ? st_writer_finish(sk.w, err) : (st_writer_abort(sk.w), -1);
    if (sk.m) rc = rc == 0 ? clef_mem_shard_finish(sk.m, mem_out, err) : (clef_mem_shard_abort(sk.m), -1);
    clef_buf_free(&path);
    free(decl);
    return rc;
}

/* The synthetic preset's other files: joint head, its config, the tokenizer. */
static int synth_other_files(conv *cv, clef_err *err) {
    clef_buf h = {0};
    clef_synth_head_config_json(cv->gen_plan.preset, &h);
    int rc = write_text(cv->o->out_dir, "joint_head_config.json", h.data, h.len, err);
    clef_buf_free(&h);
    size_t len = 0;
    char *tok = NULL;
    if (rc == 0) {
        char label[4200];
        snprintf(label, sizeof label, "tokenizer %s", cv->o->tokenizer);
        if (!(tok = clef_file_read(cv->o->tokenizer, label, CLEF_FILE_MAX_TOKENIZER, &len, err))) rc = -1;
    }
    if (rc == 0) rc = write_text(cv->o->out_dir, "tokenizer.json", tok ? tok : "", len, err);
    free(tok);
    if (rc == 0) rc = synth_head(cv, NULL, err);
    return rc;
}

/* Memory sink: hand the finished shards (+ the head) and the config over to
 * o->memory as a checkpoint. */
static int assemble_memory(conv *cv, clef_err *err) {
    clef_checkpoint *ck = cv->o->memory;
    ck->shards = clef_xcalloc(cv->n_shards + 1, sizeof *ck->shards);
    if (synth_head(cv, &ck->shards[cv->n_shards], err)) return -1;
    memcpy(ck->shards, cv->mem, cv->n_shards * sizeof *cv->mem);
    memset(cv->mem, 0, cv->n_shards * sizeof *cv->mem); /* owned by ck now */
    ck->n_shards = cv->n_shards + 1;
    size_t total = 0;
    for (size_t s = 0; s < ck->n_shards; s++) total += ck->shards[s].n;
    ck->catalog = clef_xcalloc(total + 1, sizeof *ck->catalog);
    for (size_t s = 0; s < ck->n_shards; s++)
        for (size_t i = 0; i < ck->shards[s].n; i++) ck->catalog[ck->n_tensors++] = &ck->shards[s].tensors[i];
    qsort(ck->catalog, ck->n_tensors, sizeof *ck->catalog, catalog_by_name);
    ck->config_json = clef_xstrndup(cv->config_text.data, cv->config_text.len);
    ck->config_json_len = cv->config_text.len;
    if (cv->hf_text.len) {
        ck->hf_quant_json = clef_xstrndup(cv->hf_text.data, cv->hf_text.len);
        ck->hf_quant_json_len = cv->hf_text.len;
    }
    clef_buf h = {0};
    clef_synth_head_config_json(cv->gen_plan.preset, &h);
    int rc = clef_config_parse(ck->config_json, ck->config_json_len, h.data, h.len, &ck->config, err);
    clef_buf_free(&h);
    return rc;
}

/* ---- driver ---- */

/* Layouts a format can be written in (SPEC §10.3: the stacked-per-layer
 * expert form (c) is defined for compressed-tensors NVFP4 only). */
static const char *layouts_of(clef_quant_format f) {
    return f == CLEF_QF_NVFP4_CT ? "per-expert or stacked" : "per-expert only";
}

static int check_options(conv *cv, clef_err *err) {
    const clef_quantize_options *o = cv->o;
    if (!o->model_dir == !o->synthetic) return cv_fail(err, "give a model directory (--model) or --synthetic, not both");
    if (!o->out_dir == !o->memory) return cv_fail(err, "--out is required");
    if (o->memory && !o->synthetic) return cv_fail(err, "quantizing into memory needs a synthetic source");
    if (o->synthetic && !o->memory && !o->tokenizer) return cv_fail(err, "--synthetic needs a tokenizer to copy");
    if (o->format != CLEF_QF_NVFP4_CT && o->format != CLEF_QF_NVFP4_MODELOPT && o->format != CLEF_QF_FP8_BLOCK &&
        o->format != CLEF_QF_INT4_AUTOROUND)
        return cv_fail(err, "unknown target format");
    if (o->stacked && o->format != CLEF_QF_NVFP4_CT)
        return cv_fail(err,
                       "--layout stacked is not defined for %s: SPEC §10.3 (c) defines stacked experts "
                       "(mlp.experts.gate_up_proj / down_proj) for compressed-tensors NVFP4 only; %s supports "
                       "--layout %s (use --format nvfp4 for stacked)",
                       clef_quant_format_name(o->format), clef_quant_format_name(o->format), layouts_of(o->format));
    if (o->group < 0 || (o->group && o->group % 8))
        return cv_fail(err, "--group must be a positive multiple of 8");
    if (o->block[0] < 0 || o->block[1] < 0) return cv_fail(err, "the FP8 block size must be positive");
    cv->f = o->format;
    cv->group = o->group ? o->group : 128;
    cv->br = o->block[0] ? o->block[0] : 128;
    cv->bc = o->block[1] ? o->block[1] : 128;
    if (o->memory) return 0;
    if (o->synthetic) {
        if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST)
            return cv_fail(err, "cannot create %s: %s", o->out_dir, strerror(errno));
        return 0;
    }
    clef_quant_config qc;
    int rc = clef_quant_config_load(o->model_dir, &qc, err);
    int already = rc == 0 && qc.format != CLEF_QF_NONE;
    clef_quant_format was = qc.format;
    clef_quant_config_free(&qc);
    if (rc) return -1;
    if (already)
        return cv_fail(err, "%s is already quantized (%s); quantize a BF16 checkpoint", o->model_dir,
                       clef_quant_format_name(was));
    if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST)
        return cv_fail(err, "cannot create %s: %s", o->out_dir, strerror(errno));
    char a[PATH_MAX], b[PATH_MAX];
    if (!realpath(o->model_dir, a) || !realpath(o->out_dir, b))
        return cv_fail(err, "cannot resolve %s or %s", o->model_dir, o->out_dir);
    if (!strcmp(a, b)) return cv_fail(err, "--out must differ from --model");
    return 0;
}

static void conv_free(conv *cv) {
    for (size_t s = 0; s < cv->n_shards; s++) {
        if (cv->shards) st_close(&cv->shards[s]);
        if (cv->mem) st_close(&cv->mem[s]);
        if (cv->gen) free(cv->gen[s]);
        free(cv->shard_names[s]);
    }
    free(cv->mem);
    free(cv->gen);
    free(cv->u16);
    clef_synth_plan_free(&cv->gen_plan);
    clef_synth_plan_free(&cv->gen_towers);
    clef_buf_free(&cv->config_text);
    clef_buf_free(&cv->hf_text);
    free(cv->shards);
    free(cv->shard_names);
    free(cv->cat);
    free(cv->ex);
    free(cv->stats);
    json_free(cv->weight_map);
    json_free(cv->overrides);
    for (size_t i = 0; cv->slots && i < cv->n_slots; i++) slot_free(&cv->slots[i]);
    free(cv->slots);
}

int clef_quantize_checkpoint(const clef_quantize_options *o, clef_quantize_report *rep_out, clef_err *err) {
    conv cv = {.o = o, .t0 = clef_now()};
    clef_quantize_report rep = {0};
    if (o->memory) memset(o->memory, 0, sizeof *o->memory);
    cv.weight_map = json_new(JSON_OBJECT);
    cv.overrides = json_new(JSON_OBJECT);
    int rc = check_options(&cv, err);
    if (rc == 0) rc = open_sources(&cv, err);
    if (rc == 0 && o->stacked) rc = check_stacked(&cv, err);
    if (rc == 0 && cv.f == CLEF_QF_INT4_AUTOROUND) int4_keep_bf16(&cv);
    if (rc == 0 && o->memory) cv.mem = clef_xcalloc(cv.n_shards, sizeof *cv.mem);
    /* about two matrices in flight per thread, a multiple of 3 so an expert's gate, up and down
       share a batch (at most 63: ~17 MB of scratch each for the real shapes) */
    cv.n_slots = (size_t)(2 * omp_get_max_threads() + 2) / 3 * 3;
    if (cv.n_slots > 63) cv.n_slots = 63;
    if (cv.n_slots < 3) cv.n_slots = 3;
    cv.slots = clef_xcalloc(cv.n_slots, sizeof *cv.slots);
    for (size_t s = 0; rc == 0 && s < cv.n_shards; s++) rc = write_shard(&cv, s, err);
    if (rc == 0) rc = write_configs(&cv, err);
    if (rc == 0) rc = write_index(&cv, err);
    if (rc == 0) rc = o->memory ? assemble_memory(&cv, err) : o->synthetic ? synth_other_files(&cv, err)
                                                                           : copy_other_files(&cv, err);
    if (rc == 0) {
        rep.shards = cv.n_shards;
        rep.copied = cv.copied;
        rep.quantized = cv.quantized;
        rep.bytes_in = cv.bytes_in;
        rep.bytes_out = cv.bytes_out;
        rc = write_stats(&cv, &rep, err);
    }
    if (rc == 0 && rep_out) *rep_out = rep;
    if (rc != 0 && o->memory) clef_checkpoint_close(o->memory);
    conv_free(&cv);
    return rc;
}
