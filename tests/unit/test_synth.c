/* test_synth.c — synthetic checkpoints (io/synth.h): the tiny preset written
 * in the release layout (names, shapes, configs as the tiny fixture), loaded
 * by clef_checkpoint_open and answered by the engine; the in-memory
 * checkpoint holds the same bytes and gives bitwise the same logits;
 * generation is deterministic, order independent and seed dependent; the
 * weights have the documented scales. */
#define _GNU_SOURCE
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "io/checkpoint.h"
#include "io/synth.h"
#include "json/json.h"
#include "tensor/dtype.h"
#include "testutil.h"

static char tmproot[] = "/tmp/clef_synth_XXXXXX";

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }
static int setup(void **state) { return mkdtemp(tmproot) ? 0 : -1; }
static int teardown(void **state) { return nftw(tmproot, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

static const char REQUEST[] =
    "{\"model\":\"clef-omni\","
    "\"state\":\"Our checkout started returning errors and orders are blocked.\","
    "\"questions\":{"
    "\"department\":{\"type\":\"choice\",\"instructions\":\"Which team should handle the message?\","
    "\"criteria\":{\"billing\":\"Payments or invoices\",\"technical\":\"Bugs or outages\"}},"
    "\"urgency\":{\"type\":\"score\",\"criteria\":[\"Can wait\",\"This week\",\"Today\"]},"
    "\"outage\":{\"type\":\"noul\",\"instructions\":\"Is a service down?\"}}}";

/* Write the tiny preset for `seed` into tmproot/<sub>; returns the path. */
static char *write_tiny(const char *sub, uint64_t seed, size_t max_shard_bytes) {
    char *dir = malloc(strlen(tmproot) + strlen(sub) + 2);
    sprintf(dir, "%s/%s", tmproot, sub);
    char *tok = tu_fixture("tiny-clef-omni/tokenizer.json");
    clef_synth_options opt = {.preset = "tiny", .seed = seed, .out_dir = dir, .tokenizer = tok,
                              .max_shard_bytes = max_shard_bytes};
    clef_err err;
    clef_err_clear(&err);
    if (clef_synth_write(&opt, &err) != 0) fail_msg("clef_synth_write: %s", err.message);
    free(tok);
    return dir;
}

static float bf16_at(const st_tensor *t, size_t i) {
    const unsigned char *p = (const unsigned char *)t->data + 2 * i;
    uint32_t u = ((uint32_t)p[0] | (uint32_t)p[1] << 8) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Every tensor of `a` is in `b` with the same dtype, shape and bytes, and
 * the two catalogs have the same size. */
static void assert_same_tensors(const clef_checkpoint *a, const clef_checkpoint *b) {
    assert_int_equal(a->n_tensors, b->n_tensors);
    for (size_t i = 0; i < a->n_tensors; i++) {
        const st_tensor *x = a->catalog[i], *y = clef_checkpoint_find(b, x->name);
        if (!y) fail_msg("tensor %s missing", x->name);
        assert_int_equal(x->dtype, y->dtype);
        assert_int_equal(x->ndim, y->ndim);
        assert_memory_equal(x->shape, y->shape, sizeof x->shape[0] * (size_t)x->ndim);
        assert_int_equal(x->nbytes, y->nbytes);
        if (memcmp(x->data, y->data, x->nbytes) != 0) fail_msg("tensor %s: bytes differ", x->name);
    }
}

/* The plan covers exactly the fixture's text-decoder and head tensors, with
 * the fixture's shapes (the release layout), and 122 head tensors. */
static void test_plan_matches_fixture_layout(void **state) {
    clef_err err;
    clef_err_clear(&err);
    const clef_synth_preset *p = clef_synth_preset_find("tiny", &err);
    assert_non_null(p);
    clef_synth_plan plan;
    clef_synth_plan_make(p, 1, 0, &plan);
    char *fx = tu_fixture("tiny-clef-omni");
    clef_checkpoint ck;
    if (clef_checkpoint_open(fx, &ck, &err) != 0) fail_msg("%s", err.message);
    size_t head = 0, fixture_text = 0;
    for (size_t i = 0; i < plan.n; i++) {
        const st_tensor *t = clef_checkpoint_find(&ck, plan.t[i].name);
        if (!t) fail_msg("%s is not a fixture tensor", plan.t[i].name);
        assert_int_equal(t->ndim, plan.t[i].ndim);
        for (int d = 0; d < t->ndim; d++) assert_int_equal(t->shape[d], plan.t[i].shape[d]);
        head += plan.t[i].shard < 0;
    }
    for (size_t i = 0; i < ck.n_tensors; i++)
        fixture_text += strncmp(ck.catalog[i]->name, "thinker.visual.", 15) != 0 &&
                        strncmp(ck.catalog[i]->name, "thinker.audio_tower.", 20) != 0;
    assert_int_equal(plan.n, fixture_text);
    assert_int_equal(head, 122);
    assert_int_equal(plan.n, 224);
    /* Shards: non-expert tensors first, the experts in a shard of their own. */
    assert_int_equal(plan.n_shards, 2);
    for (size_t i = 0; i < plan.n; i++)
        if (plan.t[i].shard >= 0) assert_int_equal(plan.t[i].shard, plan.t[i].expert ? 1 : 0);
    clef_checkpoint_close(&ck);
    free(fx);
    clef_synth_plan_free(&plan);
}

/* The full preset's plan (nothing drawn): the real model's tensor set and
 * sizes — SPEC §1.2: 28,991,029,248 expert parameters, lm_head and
 * embed_tokens 311,427,072 each, the head 218,351,624 bytes of bf16 — in 15
 * shards of at most 4 GiB (as the release), the first without experts. */
static void test_full_plan_sizes(void **state) {
    clef_err err;
    clef_err_clear(&err);
    clef_synth_plan plan;
    clef_synth_plan_make(clef_synth_preset_find("full", &err), 1, 0, &plan);
    assert_int_equal(plan.n, 3 + 48 * 9 + 48 * 128 * 3 + 122);
    assert_int_equal(plan.head_bytes, 218351624);
    size_t expert = 0, other = 0, shard_sum = 0;
    for (size_t i = 0; i < plan.n; i++) {
        if (plan.t[i].shard < 0) continue;
        if (plan.t[i].expert)
            expert += plan.t[i].numel;
        else
            other += plan.t[i].numel;
        assert_int_equal(plan.t[i].shard == 0, !plan.t[i].expert);
    }
    assert_int_equal(expert, 28991029248ULL);
    /* embed + lm_head + per layer q, k, v, o, router, 4 norms; the final norm */
    assert_int_equal(other, 2 * 311427072ULL + 48 * (2 * 8388608 + 2 * 1048576 + 262144 + 2 * 2048 + 2 * 128) + 2048);
    assert_int_equal(plan.n_shards, 15);
    for (int s = 0; s < plan.n_shards; s++) {
        assert_true(plan.shard_bytes[s] <= CLEF_SYNTH_SHARD_BYTES);
        shard_sum += plan.shard_bytes[s];
    }
    assert_int_equal(shard_sum, 2 * (expert + other));
    clef_synth_plan_free(&plan);
}

/* Written tiny checkpoint: opens, its config equals the fixture's, the
 * engine answers a request with finite probabilities summing to 1. */
static void test_written_tiny_answers(void **state) {
    char *dir = write_tiny("tiny1", 1, 0);
    clef_err err;
    clef_err_clear(&err);
    clef_checkpoint ck, fx;
    if (clef_checkpoint_open(dir, &ck, &err) != 0) fail_msg("%s", err.message);
    char *fxdir = tu_fixture("tiny-clef-omni");
    assert_int_equal(clef_checkpoint_open(fxdir, &fx, &err), 0);
    assert_int_equal(ck.n_shards, 3);
    assert_non_null(strstr(ck.shards[0].path, "model-00001-of-00002.safetensors"));
    assert_non_null(strstr(ck.shards[2].path, "joint_head.safetensors"));
    assert_memory_equal(&ck.config, &fx.config, sizeof ck.config);
    clef_checkpoint_close(&fx);
    clef_checkpoint_close(&ck);
    free(fxdir);

    clef_engine_options opt = {.model_dir = dir, .truncate_state = 1};
    clef_engine *e = clef_engine_open(&opt, &err);
    if (!e) fail_msg("%s", err.message);
    clef_buf out = {0};
    if (clef_engine_decide(e, REQUEST, sizeof REQUEST - 1, NULL, &out, &err) != 0) fail_msg("%s", err.message);
    json_value *resp = json_parse(out.data, out.len, &err);
    assert_non_null(resp);
    const json_value *answers = json_get(resp, "answers");
    assert_non_null(answers);
    assert_int_equal(answers->n, 3);
    for (size_t q = 0; q < 2; q++) { /* department, urgency: probabilities */
        const json_value *probs = json_get(answers->items[q], "probabilities");
        assert_non_null(probs);
        double sum = 0;
        for (size_t j = 0; j < probs->n; j++) {
            double v;
            assert_int_equal(json_as_double(probs->items[j], &v), 0);
            assert_true(isfinite(v) && v >= 0 && v <= 1);
            sum += v;
        }
        assert_true(fabs(sum - 1) < 1e-3);
    }
    double noul;
    assert_int_equal(json_as_double(json_get(answers->items[2], "noul"), &noul), 0);
    assert_true(noul > 0 && noul < 1);
    json_free(resp);
    clef_buf_free(&out);
    clef_engine_close(e);
    free(dir);
}

/* Logits of REQUEST on an engine. */
static float *engine_logits(clef_engine *e, size_t *n) {
    clef_err err;
    clef_err_clear(&err);
    clef_request req;
    clef_job job;
    if (clef_engine_parse(e, REQUEST, sizeof REQUEST - 1, &req, &err) != 0 ||
        clef_engine_encode(e, &req, NULL, &job, &err) != 0)
        fail_msg("%s", err.message);
    clef_job *one = &job;
    if (clef_engine_run(e, &one, 1, &err) != 0) fail_msg("%s", err.message);
    *n = clef_record_total_options(&job.rec);
    float *out = malloc(*n * sizeof *out);
    memcpy(out, job.logits, *n * sizeof *out);
    clef_job_free(&job);
    return out;
}

/* In memory = on disk: same catalog bytes (also with small shards), and
 * bitwise the same logits through the engine. */
static void test_memory_equals_file(void **state) {
    char *dir = write_tiny("tiny7", 7, 0), *dir_small = write_tiny("tiny7s", 7, (size_t)1 << 20);
    clef_err err;
    clef_err_clear(&err);
    clef_checkpoint mem, file, file_small;
    if (clef_checkpoint_synthetic("tiny", 7, &mem, &err) != 0) fail_msg("%s", err.message);
    assert_null(mem.dir);
    assert_int_equal(clef_checkpoint_open(dir, &file, &err), 0);
    if (clef_checkpoint_open(dir_small, &file_small, &err) != 0) fail_msg("%s", err.message);
    assert_true(file_small.n_shards > 4); /* lm_head and embed_tokens alone, the rest split */
    assert_same_tensors(&mem, &file);
    assert_same_tensors(&file_small, &mem);
    assert_memory_equal(&mem.config, &file.config, sizeof mem.config);
    clef_checkpoint_close(&mem);
    clef_checkpoint_close(&file);
    clef_checkpoint_close(&file_small);

    char *tok = tu_fixture("tiny-clef-omni/tokenizer.json");
    clef_engine_options mopt = {.synthetic = "tiny", .seed = 7, .tokenizer = tok, .truncate_state = 1};
    clef_engine_options fopt = {.model_dir = dir, .truncate_state = 1};
    clef_engine *em = clef_engine_open(&mopt, &err), *ef = clef_engine_open(&fopt, &err);
    if (!em || !ef) fail_msg("%s", err.message);
    size_t nm, nf;
    float *lm = engine_logits(em, &nm), *lf = engine_logits(ef, &nf);
    assert_int_equal(nm, 7);
    assert_int_equal(nf, nm);
    assert_memory_equal(lm, lf, nm * sizeof *lm);
    for (size_t i = 0; i < nm; i++) assert_true(isfinite(lm[i]));
    free(lm);
    free(lf);
    clef_engine_close(em);
    clef_engine_close(ef);
    free(tok);
    free(dir);
    free(dir_small);
}

/* Same seed: identical bytes; another seed: different bytes (and different
 * logits); pieces drawn in any order equal the whole. */
static void test_determinism(void **state) {
    clef_err err;
    clef_err_clear(&err);
    clef_checkpoint a, b, c;
    assert_int_equal(clef_checkpoint_synthetic("tiny", 1, &a, &err), 0);
    assert_int_equal(clef_checkpoint_synthetic("tiny", 1, &b, &err), 0);
    assert_int_equal(clef_checkpoint_synthetic("tiny", 2, &c, &err), 0);
    assert_same_tensors(&a, &b);
    static const char *const names[] = {"thinker.model.embed_tokens.weight",
                                        "thinker.model.layers.1.mlp.experts.3.up_proj.weight",
                                        "thinker.model.layers.2.input_layernorm.weight", "layers.0.linear1.weight"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        const st_tensor *x = clef_checkpoint_find(&a, names[k]), *y = clef_checkpoint_find(&c, names[k]);
        assert_non_null(x);
        assert_non_null(y);
        size_t same = 0;
        for (size_t i = 0; i < x->numel; i++) same += bf16_at(x, i) == bf16_at(y, i);
        /* Different seeds: only chance coincidences of bf16 values remain. */
        if (same * 10 > x->numel) fail_msg("%s: %zu of %zu equal across seeds", names[k], same, x->numel);
    }
    /* Two tensors of one seed differ too (keys are per name). */
    const st_tensor *g = clef_checkpoint_find(&a, "thinker.model.layers.0.mlp.experts.0.gate_proj.weight"),
                    *u = clef_checkpoint_find(&a, "thinker.model.layers.0.mlp.experts.0.up_proj.weight");
    assert_int_equal(g->nbytes, u->nbytes);
    assert_memory_not_equal(g->data, u->data, g->nbytes);

    /* Order independence: pieces of the plan's embed_tokens, drawn back to
     * front in odd sizes, equal the whole tensor. */
    clef_synth_plan plan;
    clef_synth_plan_make(clef_synth_preset_find("tiny", &err), 1, 0, &plan);
    const clef_synth_tensor *t = NULL;
    for (size_t i = 0; i < plan.n; i++)
        if (!strcmp(plan.t[i].name, "thinker.model.embed_tokens.weight")) t = &plan.t[i];
    assert_non_null(t);
    uint16_t *whole = malloc(t->numel * 2), *pieces = malloc(t->numel * 2);
    clef_synth_fill(t, 0, t->numel, whole);
    for (size_t end = t->numel; end > 0;) {
        size_t len = end > 77777 ? 77777 : end;
        clef_synth_fill(t, end - len, len, pieces + end - len);
        end -= len;
    }
    assert_memory_equal(whole, pieces, t->numel * 2);
    assert_memory_equal(whole, clef_checkpoint_find(&a, t->name)->data, t->numel * 2);
    free(whole);
    free(pieces);
    clef_synth_plan_free(&plan);
    clef_checkpoint_close(&a);
    clef_checkpoint_close(&b);
    clef_checkpoint_close(&c);
}

/* Mean and standard deviation of a bf16 tensor. */
static void moments(const st_tensor *t, double *mean, double *sd, double *maxdev) {
    double s = 0, q = 0;
    for (size_t i = 0; i < t->numel; i++) s += bf16_at(t, i);
    *mean = s / (double)t->numel;
    *maxdev = 0;
    for (size_t i = 0; i < t->numel; i++) {
        double d = bf16_at(t, i) - *mean;
        q += d * d;
        if (fabs(d) > *maxdev) *maxdev = fabs(d);
    }
    *sd = sqrt(q / (double)t->numel);
}

/* The documented scales (synth.h). */
static void test_weight_scales(void **state) {
    clef_err err;
    clef_err_clear(&err);
    clef_checkpoint ck;
    assert_int_equal(clef_checkpoint_synthetic("tiny", 3, &ck, &err), 0);
    static const struct {
        const char *name;
        double mean, sd;
    } want[] = {
        {"thinker.model.embed_tokens.weight", 0, 1},
        {"thinker.lm_head.weight", 0, 1},
        {"thinker.model.layers.0.self_attn.q_proj.weight", 0, 0.17677669529663687},  /* 1/sqrt(32) */
        {"thinker.model.layers.0.self_attn.o_proj.weight", 0, 0.125},                /* 1/sqrt(64) */
        {"thinker.model.layers.1.mlp.experts.5.down_proj.weight", 0, 0.25},          /* 1/sqrt(16) */
        {"layers.2.linear2.weight", 0, 0.08838834764831845},                         /* 1/sqrt(128) */
        {"residual_scorer.0.weight", 0, 0.0625},                                     /* 1/sqrt(256) */
    };
    for (size_t k = 0; k < sizeof want / sizeof *want; k++) {
        const st_tensor *t = clef_checkpoint_find(&ck, want[k].name);
        assert_non_null(t);
        double mean, sd, maxdev;
        moments(t, &mean, &sd, &maxdev);
        double se = want[k].sd / sqrt((double)t->numel);
        if (fabs(mean - want[k].mean) > 5 * se + 1e-3 * want[k].sd || fabs(sd / want[k].sd - 1) > 0.05)
            fail_msg("%s: mean %g sd %g, want %g %g", want[k].name, mean, sd, want[k].mean, want[k].sd);
        /* Irwin–Hall(4) tails end at 2*sqrt(3) sd (+ bf16 rounding). */
        assert_true(maxdev <= 3.4641016 * want[k].sd * 1.01);
    }
    /* Norm weights around 1 (q/k norms around 3: sharp attention), biases small. */
    double mean, sd, maxdev;
    moments(clef_checkpoint_find(&ck, "thinker.model.layers.2.post_attention_layernorm.weight"), &mean, &sd, &maxdev);
    assert_true(fabs(mean - 1) < 0.1 && sd > 0.03 && sd < 0.2);
    moments(clef_checkpoint_find(&ck, "layers.3.norm2.weight"), &mean, &sd, &maxdev);
    assert_true(fabs(mean - 1) < 0.1 && sd > 0.03 && sd < 0.2);
    moments(clef_checkpoint_find(&ck, "thinker.model.layers.0.self_attn.k_norm.weight"), &mean, &sd, &maxdev);
    assert_true(fabs(mean - 3) < 0.3 && sd > 0.1 && sd < 0.6);
    moments(clef_checkpoint_find(&ck, "layers.1.self_attn.in_proj_bias"), &mean, &sd, &maxdev);
    assert_true(fabs(mean) < 0.01 && sd > 0.01 && sd < 0.03);
    /* Head scalars: ln 10 in bf16, and a zero gate. */
    const st_tensor *prior = clef_checkpoint_find(&ck, "prior_logit_scale");
    assert_int_equal(prior->ndim, 0);
    assert_true(bf16_at(prior, 0) == 2.296875f);
    assert_true(bf16_at(clef_checkpoint_find(&ck, "joint_logit_scale"), 0) == 2.296875f);
    assert_true(bf16_at(clef_checkpoint_find(&ck, "residual_gate"), 0) == 0.0f);
    clef_checkpoint_close(&ck);
}

static void test_errors(void **state) {
    clef_err err;
    clef_err_clear(&err);
    clef_checkpoint ck;
    assert_int_equal(clef_checkpoint_synthetic("huge", 1, &ck, &err), -1);
    assert_non_null(strstr(err.message, "unknown synthetic preset 'huge'"));
    assert_null(ck.catalog);

    clef_err_clear(&err);
    char dir[256];
    snprintf(dir, sizeof dir, "%s/bad", tmproot);
    clef_synth_options opt = {.preset = "tiny", .seed = 1, .out_dir = dir, .tokenizer = "/nonexistent/tok.json"};
    assert_int_equal(clef_synth_write(&opt, &err), -1);
    assert_non_null(strstr(err.message, "/nonexistent/tok.json"));

    clef_err_clear(&err);
    clef_engine_options eo = {.synthetic = "tiny", .seed = 1};
    assert_null(clef_engine_open(&eo, &err));
    assert_non_null(strstr(err.message, "tokenizer"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_matches_fixture_layout),
        cmocka_unit_test(test_full_plan_sizes),
        cmocka_unit_test(test_written_tiny_answers),
        cmocka_unit_test(test_memory_equals_file),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_weight_scales),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
