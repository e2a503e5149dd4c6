/* test_cuda_towers.c — the media towers on the CUDA backend against the CPU
 * reference backend (skipped when no CUDA device is present):
 *
 *   - each media tower op (backend.h: gelu_tanh, rope_2d, mix_rows,
 *     im2col_3x3s2, transpose) on fresh random inputs.  mix_rows, im2col and
 *     transpose are copies or products/sums in a fixed order: bitwise equal.
 *     gelu_tanh and rope_2d differ only by the device's tanhf / cosf / sinf:
 *     relative L2 <= 1e-6 (TOL_F32);
 *   - the whole vision tower (main merger and deepstack sets) and audio tower
 *     of the tiny fixture on the 12 multimodal goldens' media, CUDA vs CPU:
 *     default mode (bf16 tensor-core products) relative L2 <= 2e-2 per call
 *     output (TOL_TOWER_BF16: ~3e-3 per product, compounded over the blocks),
 *     precise mode (CLEF_CUDA_PRECISE=1: split-bf16 products, f32 attention)
 *     <= 1e-4 (TOL_TOWER_PRECISE).  Every figure is printed.
 *     The GPU build has no FFmpeg (CLEF_MEDIA=OFF): golden cases with audio
 *     or video inputs are then reported and left out, and the audio tower is
 *     also checked on synthetic clips (a 30 s tone with a sweep and a 1.65 s
 *     tone, log-mel by media/melspec.h) so it is always exercised.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cuda/cuda.h"
#include "io/checkpoint.h"
#include "media/media.h"
#include "media/melspec.h"
#include "model/towers.h"
#include "testutil.h"

#define TOL_F32 1e-6
#define TOL_TOWER_BF16 2e-2
#define TOL_TOWER_PRECISE 1e-4

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void) { return tu_rand_f32(&rng_state); }

static float *rand_vec(size_t n, float scale) { return tu_rand_vec(&rng_state, n, scale); }

/* CPU reference, CUDA default mode, CUDA precise mode. */
typedef struct fx {
    clef_backend *cpu, *gpu, *precise;
} fx;

static int setup(void **state) {
    if (tu_cuda_devices(state) == 0) return 0;
    fx *f = calloc(1, sizeof *f);
    clef_err err;
    clef_err_clear(&err);
    f->cpu = clef_backend_cpu_create(2, &err);
    clef_cuda_options o = {.device = 0, .precise = 0, .gemm = -1, .profile = 0};
    f->gpu = tu_cuda_backend_env(&o, TU_NO_ENV, &err);
    o.precise = 1;
    f->precise = f->gpu ? tu_cuda_backend_env(&o, TU_NO_ENV, &err) : NULL;
    if (!f->cpu || !f->gpu || !f->precise) {
        fprintf(stderr, "backend: %s\n", err.message);
        return -1;
    }
    tu_print_cuda_device(f->gpu);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = *state;
    if (!f) return 0;
    f->gpu->ops->destroy(f->gpu);
    f->precise->ops->destroy(f->precise);
    f->cpu->ops->destroy(f->cpu);
    free(f);
    return 0;
}

/* One relative-L2 comparison line (tu_check_rel) for `what`. */
static void check(const char *what, const float *got, const float *want, size_t n, double tol) {
    tu_check_rel(what, 40, NULL, 0, got, want, n, tol);
}

static void check_bitwise(const char *what, const float *got, const float *want, size_t n) {
    if (memcmp(got, want, n * sizeof *got) != 0) {
        size_t i = 0;
        while (i < n && !memcmp(&got[i], &want[i], sizeof *got)) i++;
        fail_msg("%s: element %zu differs: %.9g vs %.9g", what, i, got[i], want[i]);
    }
    printf("  %-40s bitwise equal (%zu values)\n", what, n);
}

/* ---- ops ----------------------------------------------------------------- */

static void test_gelu_tanh(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    clef_err err;
    const size_t n = 100003;
    float *x = rand_vec(n, 6.0f), *ref = malloc(n * sizeof *ref);
    tu_ok(f->cpu->ops->gelu_tanh(f->cpu, x, ref, (int64_t)n, &err), &err);
    clef_backend *g = f->gpu;
    float *dx = tu_dput(g, x, n * 4), *dy = tu_dnan(g, n);
    tu_ok(g->ops->gelu_tanh(g, dx, dy, (int64_t)n, &err), &err);
    float *y = tu_dget(g, dy, n);
    check("gelu_tanh n=100003", y, ref, n, TOL_F32);
    /* in place (y == x) */
    tu_ok(g->ops->gelu_tanh(g, dx, dx, (int64_t)n, &err), &err);
    float *y2 = tu_dget(g, dx, n);
    check_bitwise("gelu_tanh in place vs out of place", y2, y, n);
    free(x), free(ref), free(y), free(y2);
    g->ops->free(g, dx), g->ops->free(g, dy);
}

/* q and k of a fused qkv row (2H heads, stride 3D), head sizes of the real
 * tower (72) and of the tiny fixture (16). */
static void rope_case(fx *f, int64_t N, int64_t H, int64_t d) {
    clef_err err;
    const int64_t D = H * d, q = d / 4, n = N * 3 * D;
    float *x = rand_vec((size_t)n, 2.0f), *inv = malloc(sizeof(float) * (size_t)q);
    for (int64_t j = 0; j < q; j++) inv[j] = 1.0f / powf(10000.0f, (float)(2 * j) / (float)(d / 2));
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(2 * N));
    for (int64_t r = 0; r < 2 * N; r++) pos[r] = (int32_t)((frand() + 1.0f) * 40.0f); /* 0..80 */
    float *ref = malloc(sizeof(float) * (size_t)n);
    memcpy(ref, x, sizeof(float) * (size_t)n);
    tu_ok(f->cpu->ops->rope_2d(f->cpu, ref, N, 3 * D, 2 * H, d, pos, inv, &err), &err);
    clef_backend *g = f->gpu;
    float *dx = tu_dput(g, x, sizeof(float) * (size_t)n), *dinv = tu_dput(g, inv, sizeof(float) * (size_t)q);
    int32_t *dpos = tu_dput(g, pos, sizeof(int32_t) * (size_t)(2 * N));
    tu_ok(g->ops->rope_2d(g, dx, N, 3 * D, 2 * H, d, dpos, dinv, &err), &err);
    float *y = tu_dget(g, dx, (size_t)n);
    char what[64];
    snprintf(what, sizeof what, "rope_2d N=%lld heads=2x%lld d=%lld", (long long)N, (long long)H, (long long)d);
    check(what, y, ref, (size_t)n, TOL_F32);
    /* the v block (outside the 2H heads) is untouched */
    for (int64_t r = 0; r < N; r++)
        if (memcmp(y + r * 3 * D + 2 * D, x + r * 3 * D + 2 * D, sizeof(float) * (size_t)D))
            fail_msg("rope_2d wrote outside its heads (row %lld)", (long long)r);
    free(x), free(inv), free(pos), free(ref), free(y);
    g->ops->free(g, dx), g->ops->free(g, dinv), g->ops->free(g, dpos);
}

static void test_rope_2d(void **state) {
    TU_NEED_GPU(state);
    rope_case(*state, 1000, 16, 72);
    rope_case(*state, 77, 2, 16);
}

static void test_mix_rows(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    clef_err err;
    const int64_t rows = 2304, dim = 1152, N = 3001;
    float *table = rand_vec((size_t)(rows * dim), 1.0f), *w = rand_vec((size_t)(4 * N), 1.0f);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(4 * N));
    for (int64_t i = 0; i < 4 * N; i++) idx[i] = (int32_t)(((double)frand() + 1.0) * 0.5 * (rows - 1));
    float *ref = malloc(sizeof(float) * (size_t)(N * dim));
    tu_ok(f->cpu->ops->mix_rows(f->cpu, table, dim, idx, w, N, ref, &err), &err);
    clef_backend *g = f->gpu;
    float *dt = tu_dput(g, table, sizeof(float) * (size_t)(rows * dim)),
          *dw = tu_dput(g, w, sizeof(float) * (size_t)(4 * N));
    int32_t *di = tu_dput(g, idx, sizeof(int32_t) * (size_t)(4 * N));
    float *dout = tu_dnan(g, (size_t)(N * dim));
    tu_ok(g->ops->mix_rows(g, dt, dim, di, dw, N, dout, &err), &err);
    float *y = tu_dget(g, dout, (size_t)(N * dim));
    check_bitwise("mix_rows N=3001 dim=1152", y, ref, (size_t)(N * dim));
    free(table), free(w), free(idx), free(ref), free(y);
    g->ops->free(g, dt), g->ops->free(g, dw), g->ops->free(g, di), g->ops->free(g, dout);
}

static void im2col_case(fx *f, int64_t B, int64_t Fi, int64_t Ti, int64_t Ci) {
    clef_err err;
    const int64_t Fo = (Fi + 1) / 2, To = (Ti + 1) / 2, n_in = B * Fi * Ti * Ci, n_out = B * Fo * To * Ci * 9;
    float *in = rand_vec((size_t)n_in, 1.0f), *ref = malloc(sizeof(float) * (size_t)n_out);
    tu_ok(f->cpu->ops->im2col_3x3s2(f->cpu, in, B, Fi, Ti, Ci, ref, &err), &err);
    clef_backend *g = f->gpu;
    float *din = tu_dput(g, in, sizeof(float) * (size_t)n_in), *dout = tu_dnan(g, (size_t)n_out);
    tu_ok(g->ops->im2col_3x3s2(g, din, B, Fi, Ti, Ci, dout, &err), &err);
    float *y = tu_dget(g, dout, (size_t)n_out);
    char what[80];
    snprintf(what, sizeof what, "im2col_3x3s2 B=%lld F=%lld T=%lld C=%lld", (long long)B, (long long)Fi, (long long)Ti,
             (long long)Ci);
    check_bitwise(what, y, ref, (size_t)n_out);
    free(in), free(ref), free(y);
    g->ops->free(g, din), g->ops->free(g, dout);
}

static void test_im2col(void **state) {
    TU_NEED_GPU(state);
    im2col_case(*state, 3, 128, 100, 1); /* conv2d1 of three 100-frame chunks */
    im2col_case(*state, 2, 64, 50, 48);  /* conv2d2-like, fewer channels */
    im2col_case(*state, 1, 31, 7, 5);    /* odd sizes: padding on both ends */
}

static void test_transpose(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    clef_err err;
    const int64_t shapes[3][3] = {{4, 16, 13 * 480}, {1, 33, 65}, {7, 1, 40}};
    for (int s = 0; s < 3; s++) {
        const int64_t B = shapes[s][0], R = shapes[s][1], C = shapes[s][2], n = B * R * C;
        float *x = rand_vec((size_t)n, 1.0f), *ref = malloc(sizeof(float) * (size_t)n);
        tu_ok(f->cpu->ops->transpose(f->cpu, x, B, R, C, ref, &err), &err);
        /* the CPU reference itself: y[b, c, r] = x[b, r, c] */
        for (int64_t i = 0; i < n; i += 97) {
            const int64_t b = i / (R * C), r = i / C % R, c = i % C;
            if (ref[(b * C + c) * R + r] != x[i]) fail_msg("CPU transpose: element %lld misplaced", (long long)i);
        }
        clef_backend *g = f->gpu;
        float *dx = tu_dput(g, x, sizeof(float) * (size_t)n), *dy = tu_dnan(g, (size_t)n);
        tu_ok(g->ops->transpose(g, dx, B, R, C, dy, &err), &err);
        float *y = tu_dget(g, dy, (size_t)n);
        char what[64];
        snprintf(what, sizeof what, "transpose B=%lld R=%lld C=%lld", (long long)B, (long long)R, (long long)C);
        check_bitwise(what, y, ref, (size_t)n);
        free(x), free(ref), free(y);
        g->ops->free(g, dx), g->ops->free(g, dy);
    }
}

/* ---- whole towers on the tiny fixture ------------------------------------ */

/* The towers of the tiny fixture on the CPU and on both CUDA modes, and the
 * goldens' media. */
typedef struct tower_fx {
    clef_checkpoint ck;
    clef_towers *cpu, *gpu, *precise;
    json_value **cases;
    size_t n_cases;
} tower_fx;

static void towers_open(fx *f, tower_fx *t) {
    clef_err err;
    clef_err_clear(&err);
    memset(t, 0, sizeof *t);
    char *p = tu_fixture("tiny-clef-omni");
    if (clef_checkpoint_open(p, &t->ck, &err)) fail_msg("checkpoint: %s", err.message);
    free(p);
    if (!(t->cpu = clef_towers_create(&t->ck, f->cpu, &err)) || !(t->gpu = clef_towers_create(&t->ck, f->gpu, &err)) ||
        !(t->precise = clef_towers_create(&t->ck, f->precise, &err)))
        fail_msg("towers: %s", err.message);
    t->cases = tu_load_goldens("goldens/mm_goldens.jsonl.gz", &t->n_cases);
}

static void towers_close(tower_fx *t) {
    clef_towers_free(t->cpu);
    clef_towers_free(t->gpu);
    clef_towers_free(t->precise);
    clef_checkpoint_close(&t->ck);
    tu_free_goldens(t->cases, t->n_cases);
}

/* The golden's media decoded and preprocessed, or -1 (printed) when this
 * build cannot decode them (audio / video without FFmpeg); with
 * `images_only`, a case whose other media cannot be decoded keeps its
 * images. */
static int golden_media(const json_value *c, clef_media *m, int images_only) {
    const json_value *req = json_get(c, "request");
    const char *keys[3] = {"images", "audio", "videos"};
    clef_media_item *it[3];
    size_t n[3];
    for (int k = 0; k < 3; k++) {
        const json_value *a = json_get(req, keys[k]);
        n[k] = a ? a->n : 0;
        it[k] = calloc(n[k] ? n[k] : 1, sizeof *it[k]);
        for (size_t i = 0; i < n[k]; i++) it[k][i] = (clef_media_item){a->items[i]->str, a->items[i]->len};
    }
    clef_media_source src = {.images = it[0], .n_images = n[0], .audio = it[1], .n_audio = n[1], .videos = it[2],
                             .n_videos = n[2]};
    clef_err err;
    clef_err_clear(&err);
    int rc = clef_media_decode(&src, NULL, m, &err);
    if (rc != 0 && images_only && n[0]) { /* the images alone decode in every build */
        printf("  %s: images only, the rest cannot be decoded here (%s)\n", tu_case_name(c), err.message);
        src.n_audio = src.n_videos = 0;
        rc = clef_media_decode(&src, NULL, m, &err);
    }
    if (rc == 0 && clef_media_preprocess(m, &err)) fail_msg("%s: preprocess: %s", tu_case_name(c), err.message);
    if (rc != 0) printf("  %s: left out, its media cannot be decoded here (%s)\n", tu_case_name(c), err.message);
    for (int k = 0; k < 3; k++) free(it[k]);
    return rc;
}

/* Worst relative L2 of one vision call (main output and every deepstack
 * set) on `tw` against the CPU. */
static double vision_call(tower_fx *t, clef_towers *tw, const float *pixels, size_t rows, const clef_grid *grids,
                          size_t n_items, const char *name, const char *mode, double tol) {
    const clef_vision_config *vc = clef_towers_vision_config(t->cpu);
    size_t O = (size_t)vc->out_hidden_size, M = rows / 4, nds = (size_t)vc->n_deepstack;
    float *ref = malloc(sizeof(float) * M * O), *rds = malloc(sizeof(float) * M * O * nds);
    float *out = malloc(sizeof(float) * M * O), *ds = malloc(sizeof(float) * M * O * nds);
    clef_err err;
    if (clef_vision_forward(t->cpu, pixels, rows, grids, n_items, ref, rds, &err)) fail_msg("%s", err.message);
    if (clef_vision_forward(tw, pixels, rows, grids, n_items, out, ds, &err)) fail_msg("%s", err.message);
    double worst = tu_rel_l2(out, ref, M * O);
    for (size_t k = 0; k < nds; k++) {
        double r = tu_rel_l2(ds + k * M * O, rds + k * M * O, M * O);
        if (!(r <= worst)) worst = r;
    }
    printf("  vision %-24s %-8s %5zu patches: worst rel L2 %.3e\n", name, mode, rows, worst);
    if (!(worst <= tol)) fail_msg("%s vision (%s): relative L2 %.3e > %.0e", name, mode, worst, tol);
    free(ref), free(rds), free(out), free(ds);
    return worst;
}

static void test_vision_tower(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    tower_fx t;
    towers_open(f, &t);
    size_t calls = 0;
    double worst[2] = {0, 0};
    for (size_t ci = 0; ci < t.n_cases; ci++) {
        const json_value *c = t.cases[ci];
        if (!json_get(c, "visual_calls")->n) continue;
        clef_media m;
        if (golden_media(c, &m, 1)) continue;
        for (int mode = 0; mode < 2; mode++) {
            clef_towers *tw = mode ? t.precise : t.gpu;
            const char *mn = mode ? "precise" : "default";
            double tol = mode ? TOL_TOWER_PRECISE : TOL_TOWER_BF16, r;
            if (m.n_images) {
                r = vision_call(&t, tw, m.pixel_values, m.image_rows, m.image_grids, m.n_images, tu_case_name(c), mn, tol);
                if (r > worst[mode]) worst[mode] = r;
                calls += mode == 0;
            }
            if (m.n_videos) {
                r = vision_call(&t, tw, m.pixel_values_videos, m.video_rows, m.video_grids, m.n_videos, tu_case_name(c),
                                mn, tol);
                if (r > worst[mode]) worst[mode] = r;
                calls += mode == 0;
            }
        }
        clef_media_free(&m);
    }
    printf("  vision tower CUDA vs CPU, %zu of the 10 golden calls: default worst %.3e, precise worst %.3e\n", calls,
           worst[0], worst[1]);
    assert_true(calls >= 6); /* the 6 image calls decode in every build; the 4 video calls need FFmpeg */
    assert_true(calls == 6 || calls == 10);
    towers_close(&t);
}

static void test_audio_tower(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    tower_fx t;
    towers_open(f, &t);
    size_t calls = 0;
    double worst[2] = {0, 0};
    for (size_t ci = 0; ci < t.n_cases; ci++) {
        const json_value *c = t.cases[ci];
        if (!json_get(c, "audio_calls")->n) continue;
        clef_media m;
        if (golden_media(c, &m, 0)) continue;
        size_t rows = 0, O = (size_t)clef_towers_audio_config(t.cpu)->output_dim;
        for (size_t i = 0; i < m.n_clips; i++) rows += (size_t)m.audio_tokens[i];
        float *ref = malloc(sizeof(float) * rows * O), *out = malloc(sizeof(float) * rows * O);
        clef_err err;
        if (clef_audio_forward(t.cpu, m.input_features, m.n_clips, m.n_frames, m.feature_lens, ref, &err))
            fail_msg("%s", err.message);
        for (int mode = 0; mode < 2; mode++) {
            for (size_t i = 0; i < rows * O; i++) out[i] = NAN;
            if (clef_audio_forward(mode ? t.precise : t.gpu, m.input_features, m.n_clips, m.n_frames, m.feature_lens,
                                   out, &err))
                fail_msg("%s", err.message);
            double r = tu_rel_l2(out, ref, rows * O), tol = mode ? TOL_TOWER_PRECISE : TOL_TOWER_BF16;
            printf("  audio  %-24s %-8s %5zu rows: rel L2 %.3e\n", tu_case_name(c), mode ? "precise" : "default",
                   rows, r);
            if (!(r <= tol)) fail_msg("%s audio: relative L2 %.3e > %.0e", tu_case_name(c), r, tol);
            if (r > worst[mode]) worst[mode] = r;
        }
        calls++;
        free(ref), free(out);
        clef_media_free(&m);
    }
    printf("  audio tower CUDA vs CPU, %zu of the 7 golden calls: default worst %.3e, precise worst %.3e\n", calls,
           worst[0], worst[1]);
    towers_close(&t);
}

/* Two synthetic clips in one call: 30 s of a 440 Hz tone with a slow sweep
 * and 1.65 s of a 1 kHz tone (a 3000-frame batch: 30 full chunks and a
 * partial one, windows of 104 rows and a remainder). */
static void test_audio_tower_synthetic(void **state) {
    TU_NEED_GPU(state);
    fx *f = *state;
    tower_fx t;
    towers_open(f, &t);
    const size_t len[2] = {480000, 26400};
    float *clip[2];
    for (int k = 0; k < 2; k++) {
        clip[k] = malloc(sizeof(float) * len[k]);
        for (size_t i = 0; i < len[k]; i++) {
            double s = (double)i / 16000.0;
            clip[k][i] = (float)(k ? 0.3 * sin(2 * M_PI * 1000.0 * s)
                                   : 0.4 * sin(2 * M_PI * (440.0 + 20.0 * s) * s) + 0.02 * frand());
        }
    }
    const size_t frames = len[0] / 160, mel = 128;
    float *feat = malloc(sizeof(float) * 2 * mel * frames);
    const float *clips[2] = {clip[0], clip[1]};
    assert_int_equal(clef_log_mel(clips, len, 2, len[0], feat), 0);
    int32_t lens[2] = {clef_audio_frames(len[0], len[0]), clef_audio_frames(len[1], len[0])};
    size_t rows = (size_t)clef_audio_tokens(lens[0]) + (size_t)clef_audio_tokens(lens[1]);
    assert_int_equal(rows, 390 + 22);
    size_t O = (size_t)clef_towers_audio_config(t.cpu)->output_dim;
    float *ref = malloc(sizeof(float) * rows * O), *out = malloc(sizeof(float) * rows * O);
    clef_err err;
    if (clef_audio_forward(t.cpu, feat, 2, frames, lens, ref, &err)) fail_msg("%s", err.message);
    for (int mode = 0; mode < 2; mode++) {
        for (size_t i = 0; i < rows * O; i++) out[i] = NAN;
        if (clef_audio_forward(mode ? t.precise : t.gpu, feat, 2, frames, lens, out, &err)) fail_msg("%s", err.message);
        double r = tu_rel_l2(out, ref, rows * O), tol = mode ? TOL_TOWER_PRECISE : TOL_TOWER_BF16;
        printf("  audio  %-24s %-8s %5zu rows: rel L2 %.3e\n", "synthetic 30 s + 1.65 s", mode ? "precise" : "default",
               rows, r);
        if (!(r <= tol)) fail_msg("synthetic audio: relative L2 %.3e > %.0e", r, tol);
    }
    free(clip[0]), free(clip[1]), free(feat), free(ref), free(out);
    towers_close(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gelu_tanh), cmocka_unit_test(test_rope_2d),      cmocka_unit_test(test_mix_rows),
        cmocka_unit_test(test_im2col),    cmocka_unit_test(test_transpose),    cmocka_unit_test(test_vision_tower),
        cmocka_unit_test(test_audio_tower), cmocka_unit_test(test_audio_tower_synthetic),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
