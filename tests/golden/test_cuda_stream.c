/* test_cuda_stream.c — streamed experts on CUDA (issue 17; engine/placement.h,
 * backend/cuda/cuda_place.c): a model whose every MoE layer's experts are
 * streamed from pinned host memory through the two device slots gives
 * bitwise the hidden states of the same model fully resident, for the tiny
 * BF16 fixture and each quantized fixture (NVFP4 compressed-tensors per
 * expert and stacked, NVFP4 ModelOpt, FP8 block, INT4 AutoRound), in
 * batches of 1, 8 and 64 records, each layout run three times (plain,
 * captured as a CUDA graph, replayed), with a slot overwritten between
 * forwards (the replay must restore it).  The slot size is the planner's
 * (clef_place_sizes_of_checkpoint), so a disagreement between the planner's
 * byte rule and the upload fails here.  Also: a device memory budget below
 * what the weights need refuses the load with a message naming the budget.
 * Skipped without a device. */
#define _GNU_SOURCE /* nftw (quant_fixture.h); before any include */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "engine/placement.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "quant/format.h"
#include "quant_fixture.h"
#include "testutil.h"

static int setup(void **state) {
    if (tu_cuda_devices(state) > 0) *state = (void *)1; /* non-NULL: TU_NEED_GPU runs the tests */
    return 0;
}

/* A plan streaming every MoE layer of ck, slots of the planner's size. */
static void plan_all(const clef_checkpoint *ck, clef_place_plan *p) {
    clef_quant_config qc;
    clef_place_sizes sz;
    clef_err err;
    clef_err_clear(&err);
    if (clef_quant_detect(ck, &qc, &err) ||
        clef_place_sizes_of_checkpoint(ck, &ck->config, &qc, 1, 512, &sz, &err))
        fail_msg("sizes: %s", err.message);
    memset(p, 0, sizeof *p);
    p->fits = 1;
    p->n_layers = sz.n_layers;
    for (int64_t l = 0; l < sz.n_layers; l++) {
        if (!sz.expert_bytes[l]) continue;
        p->streamed[l] = 1;
        p->n_streamed++;
        if (sz.expert_bytes[l] > p->slot_bytes) p->slot_bytes = sz.expert_bytes[l];
    }
    assert_true(p->n_streamed >= 3); /* both slots, one of them alternating */
}

static clef_model *model_on_cuda(const clef_checkpoint *ck, const clef_place_plan *plan) {
    clef_cuda_options o = {.device = 0, .precise = -1, .numerics = CLEF_NUMERICS_FAST, .gemm = -1, .profile = 0};
    clef_err err;
    clef_err_clear(&err);
    clef_backend *be = tu_cuda_backend_env(&o, TU_NO_ENV, &err);
    clef_model *m = be ? clef_model_create_placed(ck, be, 1, plan, &err) : NULL;
    if (!m) fail_msg("cuda model: %s", err.message);
    return m;
}

/* n_rec records of pseudo-random ids, lengths 5..68, packed. */
static int32_t *random_batch(size_t n_rec, uint64_t seed, int64_t vocab, size_t *seg) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    seg[0] = 0;
    for (size_t r = 0; r < n_rec; r++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        seg[r + 1] = seg[r] + 5 + (size_t)(x % 64);
    }
    int32_t *ids = malloc(seg[n_rec] * sizeof *ids);
    for (size_t i = 0; i < seg[n_rec]; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)vocab);
    }
    return ids;
}

static void check_checkpoint(const char *name, const clef_checkpoint *ck) {
    clef_place_plan plan;
    plan_all(ck, &plan);
    clef_model *mr = model_on_cuda(ck, NULL), *ms = model_on_cuda(ck, &plan);
    clef_backend *bs = clef_model_backend(ms);
    uint64_t layers = 0, copies0 = 0, copies1 = 0, bytes = 0;
    clef_cuda_stream_stats(bs, &layers, &copies0, &bytes);
    assert_int_equal(layers, (uint64_t)plan.n_streamed);
    const size_t H = (size_t)ck->config.text.hidden_size;
    const size_t batches[3] = {1, 8, 64};
    size_t forwards = 0;
    for (int b = 0; b < 3; b++) {
        const size_t n_rec = batches[b];
        size_t *seg = malloc((n_rec + 1) * sizeof *seg);
        int32_t *ids = random_batch(n_rec, 7 + (uint64_t)b, ck->config.text.vocab_size, seg);
        const size_t n = seg[n_rec];
        float *hr = malloc(n * H * sizeof *hr), *hs = malloc(n * H * sizeof *hs);
        clef_err err;
        clef_err_clear(&err);
        if (clef_thinker_forward_batch(mr, ids, n, seg, n_rec, NULL, hr, NULL, &err)) fail_msg("%s", err.message);
        for (int it = 0; it < 3; it++) { /* plain, captured, replayed */
            if (it == 2) clef_cuda_pinned_copy_gbps(bs); /* overwrites slot 0: the replay restores it */
            memset(hs, 0xff, n * H * sizeof *hs);
            if (clef_thinker_forward_batch(ms, ids, n, seg, n_rec, NULL, hs, NULL, &err))
                fail_msg("%s streamed: %s", name, err.message);
            if (memcmp(hr, hs, n * H * sizeof *hr))
                fail_msg("%s: %zu records, forward %d: streamed hidden states differ from resident", name, n_rec, it);
            forwards++;
        }
        free(seg), free(ids), free(hr), free(hs);
    }
    clef_cuda_stream_stats(bs, NULL, &copies1, &bytes);
    long cap, rep, failed;
    clef_cuda_graph_stats(bs, &cap, &rep, &failed);
    printf("  %-18s %lld layers streamed, slots of %zu bytes: 9 forwards bitwise resident (batches 1/8/64), "
           "%llu copies, graphs %ld captured / %ld replayed / %ld failed\n",
           name, (long long)plan.n_streamed, plan.slot_bytes, (unsigned long long)(copies1 - copies0), cap, rep,
           failed);
    assert_int_equal(failed, 0);
    assert_true(rep >= 3);
    /* every forward copies at least the layers that share a slot with another: n - 2 of n */
    assert_true(copies1 - copies0 >= forwards * (uint64_t)(plan.n_streamed - 2));
    clef_model_free(mr);
    clef_model_free(ms);
}

static void test_bf16_streamed_equals_resident(void **state) {
    TU_NEED_GPU(state);
    clef_checkpoint ck;
    if (tu_open_fixture("tiny-clef-omni", &ck) != 0) fail_msg("fixture");
    check_checkpoint("bf16", &ck);
    clef_checkpoint_close(&ck);
}

static void test_quantized_streamed_equals_resident(void **state) {
    TU_NEED_GPU(state);
    for (int fi = 0; fi < QF_N_FORMATS; fi++) {
        char *dir = qf_assemble(QF_FORMATS[fi]);
        clef_checkpoint ck;
        clef_err err;
        clef_err_clear(&err);
        if (clef_checkpoint_open(dir, &ck, &err) != 0) fail_msg("%s: %s", QF_FORMATS[fi], err.message);
        check_checkpoint(QF_FORMATS[fi], &ck);
        clef_checkpoint_close(&ck);
        qf_remove(dir);
        free(dir);
    }
}

/* A budget a little above what the device already uses: the weights do not fit, and the load says so. */
static void test_budget_refuses_load(void **state) {
    TU_NEED_GPU(state);
    clef_checkpoint ck;
    if (tu_open_fixture("tiny-clef-omni", &ck) != 0) fail_msg("fixture");
    clef_cuda_options o = {.device = 0, .precise = -1, .numerics = CLEF_NUMERICS_FAST, .gemm = -1, .profile = 0};
    clef_err err;
    clef_err_clear(&err);
    clef_backend *be = tu_cuda_backend_env(&o, TU_NO_ENV, &err);
    if (!be) fail_msg("%s", err.message);
    const size_t used = clef_cuda_used_bytes(be);
    /* below the device's use: refused at once */
    assert_int_equal(be->ops->set_memory_budget(be, used / 2, &err), -1);
    assert_non_null(strstr(err.message, "less than the"));
    printf("  budget %zu: %s\n", used / 2, err.message);
    clef_err_clear(&err);
    /* 1 MiB above: the tiny model's ~20 MB of weights cannot be placed */
    assert_int_equal(be->ops->set_memory_budget(be, used + ((size_t)1 << 20), &err), 0);
    clef_model *m = clef_model_create_placed(&ck, be, 1, NULL, &err);
    assert_null(m);
    assert_non_null(strstr(err.message, "GPU memory budget exceeded"));
    printf("  budget used + 1 MiB: %s\n", err.message);
    clef_checkpoint_close(&ck);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_streamed_equals_resident),
        cmocka_unit_test(test_quantized_streamed_equals_resident),
        cmocka_unit_test(test_budget_refuses_load),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
