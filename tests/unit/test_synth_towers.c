/* test_synth_towers.c — the synthetic presets' media towers (io/synth.h):
 * the full preset's tower tensors have the real Qwen3-Omni-30B-A3B shapes
 * (plan only, nothing drawn); the small preset's towers drawn alone bind
 * with model/towers.h on the CPU backend and keep activations O(1) on an
 * image and 2 s of audio; the towers-only checkpoint holds bitwise the
 * tower tensors of the whole in-memory checkpoint's plan; tiny has none.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "io/checkpoint.h"
#include "io/synth.h"
#include "media/media.h"
#include "media/melspec.h"
#include "model/towers.h"
#include "testutil.h"

/* Element count of the plan tensor `name` (fails when absent). */
static size_t plan_numel(const clef_synth_plan *p, const char *name, int ndim, const int64_t *shape) {
    for (size_t i = 0; i < p->n; i++)
        if (!strcmp(p->t[i].name, name)) {
            assert_int_equal(p->t[i].ndim, ndim);
            for (int d = 0; d < ndim; d++) assert_int_equal(p->t[i].shape[d], shape[d]);
            return p->t[i].numel;
        }
    fail_msg("%s is not in the towers plan", name);
    return 0;
}

static void test_full_tower_shapes(void **state) {
    clef_err err;
    clef_err_clear(&err);
    clef_synth_plan tw;
    clef_synth_towers_plan_make(clef_synth_preset_find("full", &err), 1, &tw);
    const int64_t patch[5] = {1152, 3, 2, 16, 16}, pos[2] = {2304, 1152}, qkv[2] = {3456, 1152},
                  fc1[2] = {4304, 1152}, mg0[2] = {4608, 4608}, mg2[2] = {2048, 4608}, dsln[1] = {4608},
                  conv1[4] = {480, 1, 3, 3}, conv2[4] = {480, 480, 3, 3}, conv_out[2] = {1280, 7680},
                  afc1[2] = {5120, 1280}, proj2[2] = {2048, 1280};
    plan_numel(&tw, "thinker.visual.patch_embed.proj.weight", 5, patch);
    plan_numel(&tw, "thinker.visual.pos_embed.weight", 2, pos);
    plan_numel(&tw, "thinker.visual.blocks.26.attn.qkv.weight", 2, qkv);
    plan_numel(&tw, "thinker.visual.blocks.26.mlp.linear_fc1.weight", 2, fc1);
    plan_numel(&tw, "thinker.visual.merger.mlp.0.weight", 2, mg0);
    plan_numel(&tw, "thinker.visual.merger_list.2.mlp.2.weight", 2, mg2);
    plan_numel(&tw, "thinker.visual.merger_list.0.ln_q.weight", 1, dsln);
    plan_numel(&tw, "thinker.audio_tower.conv2d1.weight", 4, conv1);
    plan_numel(&tw, "thinker.audio_tower.conv2d3.weight", 4, conv2);
    plan_numel(&tw, "thinker.audio_tower.conv_out.weight", 2, conv_out);
    plan_numel(&tw, "thinker.audio_tower.layers.31.fc1.weight", 2, afc1);
    plan_numel(&tw, "thinker.audio_tower.proj2.weight", 2, proj2);
    /* 27 blocks x 12 + patch 2 + pos 1 + 4 mergers x 6; 3 convs x 2 + conv_out + 32 layers x 16 + 6 */
    assert_int_equal(tw.n, 27 * 12 + 3 + 4 * 6 + 3 * 2 + 1 + 32 * 16 + 6);
    printf("  full towers: %zu tensors, %.2f GB bf16\n", tw.n, (double)tw.shard_bytes[0] / 1e9);
    /* LayerNorm weights around 1, matrices N(0, 1/fan_in) */
    for (size_t i = 0; i < tw.n; i++) {
        const clef_synth_tensor *t = &tw.t[i];
        if (strstr(t->name, "ln_q.weight") || strstr(t->name, "ln_post.weight") || strstr(t->name, "norm1.weight"))
            assert_true(t->mean == 1.0);
        if (!strcmp(t->name, "thinker.audio_tower.conv2d2.weight")) assert_true(fabs(t->std - 1 / sqrt(4320.0)) < 1e-12);
    }
    clef_synth_plan_free(&tw);
    clef_synth_plan none;
    clef_synth_towers_plan_make(clef_synth_preset_find("tiny", &err), 1, &none);
    assert_int_equal(none.n, 0);
    clef_synth_plan_free(&none);
}

/* Standard deviation of n floats (fails on a non-finite value). */
static double stdev(const float *x, size_t n) {
    double s = 0, ss = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) fail_msg("non-finite tower output at %zu", i);
        s += x[i], ss += (double)x[i] * x[i];
    }
    double m = s / (double)n;
    return sqrt(ss / (double)n - m * m);
}

static void test_small_towers_run(void **state) {
    clef_err err;
    clef_err_clear(&err);
    clef_checkpoint ck;
    if (clef_synth_towers_checkpoint("small", 3, NULL, &ck, &err)) fail_msg("%s", err.message);
    assert_non_null(ck.config_json);
    assert_int_equal(ck.n_shards, 1);
    /* bitwise the plan's draw (what the whole checkpoint and `clef synth` hold) */
    clef_synth_plan tw;
    clef_synth_towers_plan_make(clef_synth_preset_find("small", &err), 3, &tw);
    assert_int_equal(ck.n_tensors, tw.n);
    const clef_synth_tensor *pt = NULL;
    for (size_t i = 0; i < tw.n; i++)
        if (!strcmp(tw.t[i].name, "thinker.audio_tower.conv2d1.weight")) pt = &tw.t[i];
    assert_non_null(pt);
    uint16_t *want = malloc(pt->numel * 2);
    clef_synth_fill(pt, 0, pt->numel, want);
    assert_memory_equal(clef_checkpoint_find(&ck, pt->name)->data, want, pt->numel * 2);
    free(want);
    clef_synth_plan_free(&tw);

    clef_backend *be = clef_backend_cpu_create(2, &err);
    clef_towers *t = clef_towers_create(&ck, be, &err);
    if (!t) fail_msg("towers: %s", err.message);
    const clef_vision_config *vc = clef_towers_vision_config(t);
    assert_int_equal(vc->depth, 4);
    assert_int_equal(vc->hidden_size, 1152);
    assert_int_equal(vc->n_deepstack, 3);
    assert_int_equal(clef_towers_audio_config(t)->encoder_layers, 4);
    /* one 128x96-pixel image: 8x6 patches */
    clef_grid g = {1, 8, 6};
    size_t rows = 48, O = 2048;
    float *px = malloc(sizeof(float) * rows * CLEF_PATCH_DIM), *out = malloc(sizeof(float) * rows / 4 * O);
    float *ds = malloc(sizeof(float) * 3 * rows / 4 * O);
    for (size_t i = 0; i < rows * CLEF_PATCH_DIM; i++) px[i] = (float)sin(0.37 * (double)i) * 0.8f;
    if (clef_vision_forward(t, px, rows, &g, 1, out, ds, &err)) fail_msg("%s", err.message);
    double sv = stdev(out, rows / 4 * O), sd = stdev(ds, 3 * rows / 4 * O);
    printf("  small vision tower: output std %.3f, deepstack std %.3f\n", sv, sd);
    assert_true(sv > 0.05 && sv < 20 && sd > 0.05 && sd < 20);
    /* 2 s of a 440 Hz tone */
    const size_t len = 32000, frames = len / 160;
    float *clip = malloc(sizeof(float) * len), *feat = malloc(sizeof(float) * 128 * frames);
    for (size_t i = 0; i < len; i++) clip[i] = (float)(0.4 * sin(2 * M_PI * 440.0 * (double)i / 16000.0));
    const float *clips[1] = {clip};
    assert_int_equal(clef_log_mel(clips, &len, 1, len, feat), 0);
    int32_t m = clef_audio_frames(len, len);
    size_t arows = (size_t)clef_audio_tokens(m);
    assert_int_equal(arows, 26);
    float *aout = malloc(sizeof(float) * arows * O);
    if (clef_audio_forward(t, feat, 1, frames, &m, aout, &err)) fail_msg("%s", err.message);
    double sa = stdev(aout, arows * O);
    printf("  small audio tower: output std %.3f\n", sa);
    assert_true(sa > 0.05 && sa < 20);
    free(px), free(out), free(ds), free(clip), free(feat), free(aout);
    clef_towers_free(t);
    be->ops->destroy(be);
    clef_checkpoint_close(&ck);
    /* tiny has no towers */
    assert_int_equal(clef_synth_towers_checkpoint("tiny", 1, NULL, &ck, &err), -1);
    assert_non_null(strstr(err.message, "no media towers"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_tower_shapes),
        cmocka_unit_test(test_small_towers_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
