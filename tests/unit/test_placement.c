/* test_placement.c — the weight-placement planner (engine/placement.h):
 *   - device bytes of one weight in every format against hand-computed
 *     sizes (cuda_backend.c's rule: 256-byte blocks, packed arrays with 256
 *     bytes of slack, INT4 / NVFP4 in the v3 kernels' reordered sizes);
 *   - the plan rule: no budget, all resident exactly at the budget and
 *     streaming one byte under it, the even spread of streamed layers
 *     (L = 48, n = 12: layers 3, 7, ..., 47), dense-MLP layers never
 *     streamed, and the does-not-fit message's numbers;
 *   - sizes of the tiny fixture checkpoint and its quantized copies (exact
 *     numbers; the experts also against clef_qweight_bind's own binding);
 *   - clef_place_sizes_of_preset equal to the sizes of the drawn preset,
 *     `tiny` in BF16 and in every quantized format.
 */
#include "quant_fixture.h"

#include "engine/placement.h"
#include "io/checkpoint.h"
#include "quant/format.h"
#include "quant/qsynth.h"
#include "quant/qweight.h"

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
/* every flag the advice may name (inspect --plan's set, plus --towers cpu) */
#define ADV_ALL (CLEF_PLACE_ADV_MAX_BATCH_TOKENS | CLEF_PLACE_ADV_TEXT_ONLY | CLEF_PLACE_ADV_TOWERS_CPU)

/* ---- weight bytes ---- */

static size_t wb(clef_dtype dt, int64_t r, int64_t c, clef_wquant q) {
    const clef_qweight w = {.dtype = dt, .rows = r, .cols = c, .quant = q};
    return clef_place_weight_bytes(&w);
}

static void test_weight_bytes(void **state) {
    (void)state;
    static const char zeros_mark = 0;
    /* plain: bf16 2 bytes, f16 / f32 4 bytes an element, blocks of 256 */
    assert_int_equal(wb(CLEF_DT_BF16, 768, 2048, (clef_wquant){0}), 768 * 2048 * 2);
    assert_int_equal(wb(CLEF_DT_F16, 768, 2048, (clef_wquant){0}), 768 * 2048 * 4);
    assert_int_equal(wb(CLEF_DT_F32, 3, 5, (clef_wquant){0}), 256);  /* 60 bytes */
    assert_int_equal(wb(CLEF_DT_BF16, 1, 1, (clef_wquant){0}), 256); /* 2 bytes */
    assert_int_equal(wb(CLEF_DT_BF16, 3, 100, (clef_wquant){0}), 768); /* 600 bytes */
    /* INT4 [768, 2048], G 128: data 48 x 32 atoms of 512 = 786432, scales 2 * 16 * 768 = 24576:
     * 786688 + 24832 = 811520; asymmetric: + zeros 4 * 16 * 96 = 6144 -> 6400 */
    const clef_wquant i4 = {.type = CLEF_QT_INT4_GPTQ, .group = 128};
    assert_int_equal(wb(CLEF_DT_I32, 768, 2048, i4), 811520);
    clef_wquant i4z = i4;
    i4z.zeros = &zeros_mark;
    assert_int_equal(wb(CLEF_DT_I32, 768, 2048, i4z), 811520 + 6400);
    /* INT4 [24, 40], G 8: reordered data padded to 2 x 1 atoms = 1024 (checkpoint layout 480),
     * scales 2 * 5 * 24 = 240: 1280 + 512 */
    const clef_wquant i4s = {.type = CLEF_QT_INT4_GPTQ, .group = 8};
    assert_int_equal(wb(CLEF_DT_I32, 24, 40, i4s), 1792);
    /* NVFP4 [768, 2048]: data 786432, scales 48 x 32 atoms of 64 = 98304: 786688 + 98560 */
    const clef_wquant nv = {.type = CLEF_QT_NVFP4, .group = 16};
    assert_int_equal(wb(CLEF_DT_U8, 768, 2048, nv), 885248);
    /* NVFP4 [32, 16]: data 2 atoms = 1024, scales 2 x 64 = 128: 1280 + 512 */
    assert_int_equal(wb(CLEF_DT_U8, 32, 16, nv), 1792);
    /* FP8 [768, 2048], blocks 128 x 128: data 1572864, scales 4 * 6 * 16 = 384: 1573120 + 768 */
    const clef_wquant f8 = {.type = CLEF_QT_FP8_BLOCK, .block_r = 128, .block_c = 128};
    assert_int_equal(wb(CLEF_DT_F8_E4M3, 768, 2048, f8), 1573888);
    /* FP8 [100, 48], blocks 128 x 16: data 4800 -> 5120 (+256 slack, 256 aligned), scales 4 * 1 * 3 = 12 -> 512 */
    const clef_wquant f8s = {.type = CLEF_QT_FP8_BLOCK, .block_r = 128, .block_c = 16};
    assert_int_equal(wb(CLEF_DT_F8_E4M3, 100, 48, f8s), 5120 + 512);
}

/* ---- the plan rule ---- */

/* 48 MoE layers of 256 MiB experts; non-expert 3 GiB, workspace 1 GiB, context 600 MiB. */
static clef_place_sizes sizes48(void) {
    clef_place_sizes s;
    memset(&s, 0, sizeof s);
    s.n_layers = 48;
    for (int l = 0; l < 48; l++) s.expert_bytes[l] = 256 * MIB;
    s.dense_bytes = 3 * GIB;
    s.workspace_bytes = GIB;
    s.context_bytes = CLEF_PLACE_CONTEXT_BYTES;
    s.batch_tokens = 16384;
    return s;
}

static size_t fixed_of(const clef_place_sizes *s) {
    return s->dense_bytes + s->tower_bytes + s->workspace_bytes + s->context_bytes;
}

static void assert_streamed(const clef_place_plan *p, const int *layers, int n) {
    int k = 0;
    for (int l = 0; l < p->n_layers; l++) {
        if (!p->streamed[l]) continue;
        assert_true(k < n);
        assert_int_equal(l, layers[k]);
        k++;
    }
    assert_int_equal(k, n);
    assert_int_equal(p->n_streamed, n);
}

static void test_plan_no_budget(void **state) {
    (void)state;
    clef_place_sizes s = sizes48();
    clef_place_plan p;
    clef_place_plan_make(&s, 0, ADV_ALL, &p);
    assert_int_equal(p.fits, 1);
    assert_int_equal(p.budget, 0);
    assert_int_equal(p.n_layers, 48);
    assert_int_equal(p.n_resident, 48);
    assert_int_equal(p.n_streamed, 0);
    assert_int_equal(p.slot_bytes, 0);
    assert_int_equal(p.streamed_bytes, 0);
    assert_int_equal(p.pinned_bytes, 0);
    assert_int_equal(p.device_bytes, fixed_of(&s) + 48 * 256 * MIB);
    assert_string_equal(p.message, "plan: no GPU memory budget (--gpu-memory): all 48 layers resident, 16.84 GiB");
}

static void test_plan_boundary(void **state) {
    (void)state;
    clef_place_sizes s = sizes48();
    const size_t all = fixed_of(&s) + 48 * 256 * MIB;
    clef_place_plan p;
    clef_place_plan_make(&s, all, ADV_ALL, &p); /* exactly at the budget: all resident */
    assert_int_equal(p.fits, 1);
    assert_int_equal(p.n_streamed, 0);
    assert_int_equal(p.n_resident, 48);
    assert_int_equal(p.device_bytes, all);
    assert_string_equal(p.message, "plan: all 48 layers resident, 16.84 GiB of 16.84 GiB");
    /* one byte under: two slots (512 MiB) are reserved, so 3 layers are streamed, spread evenly */
    clef_place_plan_make(&s, all - 1, ADV_ALL, &p);
    assert_int_equal(p.fits, 1);
    assert_int_equal(p.n_resident, 45);
    assert_int_equal(p.slot_bytes, 256 * MIB);
    const int three[] = {15, 31, 47};
    assert_streamed(&p, three, 3);
    assert_int_equal(p.streamed_bytes, 3 * 256 * MIB);
    assert_int_equal(p.pinned_bytes, 3 * 256 * MIB);
    assert_int_equal(p.device_bytes, fixed_of(&s) + 2 * 256 * MIB + 45 * 256 * MIB);
    assert_true(p.device_bytes <= all - 1);
}

static void test_plan_spread(void **state) {
    (void)state;
    clef_place_sizes s = sizes48();
    /* room for 36 resident layers + 2 slots exactly: 12 streamed */
    const size_t budget = fixed_of(&s) + 2 * 256 * MIB + 36 * 256 * MIB;
    clef_place_plan p;
    clef_place_plan_make(&s, budget, ADV_ALL, &p);
    assert_int_equal(p.fits, 1);
    assert_int_equal(p.n_resident, 36);
    const int twelve[] = {3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47};
    assert_streamed(&p, twelve, 12);
    assert_int_equal(p.streamed_bytes, 3 * GIB);
    assert_int_equal(p.device_bytes, budget);
    assert_string_equal(p.message, "plan: 36 of 48 layers' experts resident, 12 streamed (3.00 GiB a forward from "
                                   "pinned host memory), 14.34 GiB of 14.34 GiB");
    /* one byte less: 13 streamed, floor((l + 1) 13 / 48) > floor(l 13 / 48) */
    clef_place_plan_make(&s, budget - 1, ADV_ALL, &p);
    const int thirteen[] = {3, 7, 11, 14, 18, 22, 25, 29, 33, 36, 40, 44, 47};
    assert_streamed(&p, thirteen, 13);
    assert_int_equal(p.n_resident, 35);
    /* only the slots' room: everything streamed */
    clef_place_plan_make(&s, fixed_of(&s) + 2 * 256 * MIB, ADV_ALL, &p);
    assert_int_equal(p.fits, 1);
    assert_int_equal(p.n_streamed, 48);
    assert_int_equal(p.n_resident, 0);
    assert_int_equal(p.device_bytes, fixed_of(&s) + 2 * 256 * MIB);
    /* what clef inspect --plan prints */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    clef_place_plan_make(&s, budget, ADV_ALL, &p);
    clef_place_plan_print(&s, &p, f);
    fclose(f);
    assert_non_null(strstr(buf, "\nstreamed: 3 7 11 15 19 23 27 31 35 39 43 47\n"));
    assert_non_null(strstr(buf, "  resident experts         9.00 GiB     9663676416 bytes  36 of 48 MoE layers\n"));
    assert_non_null(strstr(buf, "  expert slots             0.50 GiB      536870912 bytes  2 x 268435456 bytes\n"));
    assert_int_equal(strncmp(buf, p.message, strlen(p.message)), 0);
    free(buf);
}

static void test_plan_dense_layers(void **state) {
    (void)state;
    clef_place_sizes s = sizes48();
    s.expert_bytes[0] = s.expert_bytes[24] = 0; /* dense-MLP layers: 46 MoE layers */
    const size_t budget = fixed_of(&s) + 2 * 256 * MIB + 40 * 256 * MIB; /* 6 streamed */
    clef_place_plan p;
    clef_place_plan_make(&s, budget, ADV_ALL, &p);
    assert_int_equal(p.fits, 1);
    assert_int_equal(p.n_layers, 48);
    assert_int_equal(p.n_resident, 40);
    assert_int_equal(p.n_streamed, 6);
    assert_int_equal(p.streamed[0], 0);
    assert_int_equal(p.streamed[24], 0);
    /* MoE layer j (layers 1..23 are j 0..22, 25..47 are j 23..45) streamed iff
     * floor((j + 1) 6 / 46) > floor(j 6 / 46): j = 7, 15, 22, 30, 38, 45 */
    const int six[] = {8, 16, 23, 32, 40, 47};
    assert_streamed(&p, six, 6);
    /* even with only the slots' room no dense layer is streamed */
    clef_place_plan_make(&s, fixed_of(&s) + 2 * 256 * MIB, ADV_ALL, &p);
    assert_int_equal(p.n_streamed, 46);
    assert_int_equal(p.streamed[0], 0);
    assert_int_equal(p.streamed[24], 0);
    /* a model with no MoE layer at all: nothing to stream */
    for (int l = 0; l < 48; l++) s.expert_bytes[l] = 0;
    clef_place_plan_make(&s, fixed_of(&s), ADV_ALL, &p);
    assert_int_equal(p.fits, 1);
    assert_int_equal(p.n_streamed, 0);
    clef_place_plan_make(&s, fixed_of(&s) - 1, ADV_ALL, &p);
    assert_int_equal(p.fits, 0);
}

static void test_plan_does_not_fit(void **state) {
    (void)state;
    clef_place_sizes s = sizes48();
    clef_place_plan p;
    /* smallest plan: 3 + 1 + 0.8359 + 0.5 = 5.3359 GiB -> 5.34 (rounded up) */
    clef_place_plan_make(&s, 4 * GIB, ADV_ALL, &p);
    assert_int_equal(p.fits, 0);
    assert_int_equal(p.budget, 4 * GIB);
    assert_string_equal(p.message,
                        "does not fit in 4.00 GiB: the smallest plan needs 5.34 GiB (non-expert weights 3.00 GiB, "
                        "workspace for 16384 tokens 1.00 GiB, context 0.84 GiB, two expert slots 0.50 GiB); use "
                        "--max-batch-tokens lower, a smaller format, or a budget of at least 5.34 GiB");
    /* one byte short of the smallest plan does not fit; the plan itself does */
    const size_t smallest = fixed_of(&s) + 2 * 256 * MIB;
    clef_place_plan_make(&s, smallest - 1, ADV_ALL, &p);
    assert_int_equal(p.fits, 0);
    clef_place_plan_make(&s, smallest, ADV_ALL, &p);
    assert_int_equal(p.fits, 1);
    /* with towers: named, and --text-only suggested */
    s.tower_bytes = 2 * GIB + 200 * MIB;
    clef_place_plan_make(&s, 6 * GIB, ADV_ALL, &p);
    assert_int_equal(p.fits, 0);
    assert_string_equal(p.message,
                        "does not fit in 6.00 GiB: the smallest plan needs 7.54 GiB (non-expert weights 3.00 GiB, "
                        "towers 2.20 GiB, workspace for 16384 tokens 1.00 GiB, context 0.84 GiB, two expert slots "
                        "0.50 GiB); use --max-batch-tokens lower, --text-only or --towers cpu, a smaller format, or "
                        "a budget of at least 7.54 GiB");
}

/* ---- sizes of the fixture checkpoints ---- */

/* Sum over layer l's experts of clef_place_weight_bytes of what clef_qweight_bind binds. */
static size_t bound_experts(const clef_checkpoint *ck, const clef_quant_config *qc, int64_t l) {
    const clef_text_config *c = &ck->config.text;
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    size_t b = 0;
    for (int64_t e = 0; e < c->num_experts; e++)
        for (int p = 0; p < 3; p++) {
            char m[256];
            snprintf(m, sizeof m, "thinker.model.layers.%lld.mlp.experts.%lld.%s", (long long)l, (long long)e, proj[p]);
            clef_qweight q;
            clef_err err;
            clef_err_clear(&err);
            const int64_t r = p == 2 ? c->hidden_size : c->moe_intermediate_size,
                          k = p == 2 ? c->moe_intermediate_size : c->hidden_size;
            tu_ok(clef_qweight_bind(ck, qc, m, r, k, &q, &err), &err);
            b += clef_place_weight_bytes(&q);
        }
    return b;
}

static void check_dir(const char *dir, size_t expert, size_t dense, size_t workspace) {
    clef_checkpoint ck;
    clef_err err;
    clef_err_clear(&err);
    tu_ok(clef_checkpoint_open(dir, &ck, &err), &err);
    clef_quant_config qc;
    tu_ok(clef_quant_detect(&ck, &qc, &err), &err);
    clef_place_sizes s;
    tu_ok(clef_place_sizes_of_checkpoint(&ck, &ck.config, &qc, 0, 16384, &s, &err), &err);
    assert_int_equal(s.n_layers, 3);
    for (int l = 0; l < 3; l++) {
        assert_int_equal(s.expert_bytes[l], expert);
        assert_int_equal(s.expert_bytes[l], bound_experts(&ck, &qc, l));
    }
    assert_int_equal(s.dense_bytes, dense);
    assert_int_equal(s.tower_bytes, 675072); /* the tiny towers' tensors as the backend holds them */
    assert_int_equal(s.workspace_bytes, workspace);
    assert_int_equal(s.context_bytes, CLEF_PLACE_CONTEXT_BYTES);
    assert_int_equal(s.batch_tokens, 16384);
    /* text only: no towers */
    tu_ok(clef_place_sizes_of_checkpoint(&ck, &ck.config, &qc, 1, 16384, &s, &err), &err);
    assert_int_equal(s.tower_bytes, 0);
    clef_quant_config_free(&qc);
    clef_checkpoint_close(&ck);
}

static void test_sizes_tiny_bf16(void **state) {
    (void)state;
    char *dir = tu_fixture("tiny-clef-omni");
    /* experts: 8 x 3 BF16 matrices of 16 x 32 (1024 bytes each) */
    check_dir(dir, 24 * 1024, 20360960, 81702912);
    free(dir);
}

static void test_sizes_tiny_quant(void **state) {
    (void)state;
    static const struct {
        const char *fixture;
        size_t expert, dense, workspace;
    } want[] = {
        /* NVFP4: gate / up [16, 32] 1280 bytes, down [32, 16] 1792: 8 x 4352 */
        {"nvfp4-ct", 34816, 20360960, 81703680},
        {"nvfp4-ct-stacked", 34816, 20360960, 81703680},
        {"nvfp4-modelopt", 34816, 20360960, 81703680},
        /* FP8: every expert matrix 512 bytes + 4 of scales: 1280 */
        {"fp8-block", 8 * 3 * 1280, 20360960, 81702912},
        /* INT4 (attention too, so q / k / v stay three weights): as NVFP4 for the experts */
        {"int4-autoround", 34816, 20348672, 81704448},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char *dir = qf_assemble(want[i].fixture);
        check_dir(dir, want[i].expert, want[i].dense, want[i].workspace);
        qf_remove(dir);
        free(dir);
    }
}

/* ---- a preset's sizes without drawing it ---- */

static void assert_sizes_equal(const clef_place_sizes *a, const clef_place_sizes *b) {
    assert_int_equal(a->n_layers, b->n_layers);
    for (int l = 0; l < CLEF_MAX_LAYERS; l++) assert_int_equal(a->expert_bytes[l], b->expert_bytes[l]);
    assert_int_equal(a->dense_bytes, b->dense_bytes);
    assert_int_equal(a->tower_bytes, b->tower_bytes);
    assert_int_equal(a->workspace_bytes, b->workspace_bytes);
    assert_int_equal(a->context_bytes, b->context_bytes);
    assert_int_equal(a->batch_tokens, b->batch_tokens);
}

static void test_preset_equals_drawn(void **state) {
    (void)state;
    static const char *const quants[] = {NULL, "int4", "fp8-block", "nvfp4", "nvfp4-modelopt"};
    for (size_t i = 0; i < sizeof quants / sizeof quants[0]; i++) {
        clef_checkpoint ck;
        clef_err err;
        clef_err_clear(&err);
        if (quants[i]) tu_ok(clef_qsynth_checkpoint("tiny", 7, quants[i], NULL, &ck, &err), &err);
        else tu_ok(clef_checkpoint_synthetic("tiny", 7, &ck, &err), &err);
        clef_quant_config qc;
        tu_ok(clef_quant_detect(&ck, &qc, &err), &err);
        for (int text_only = 0; text_only < 2; text_only++) {
            clef_place_sizes drawn, shapes;
            tu_ok(clef_place_sizes_of_checkpoint(&ck, &ck.config, &qc, text_only, 1000, &drawn, &err), &err);
            tu_ok(clef_place_sizes_of_preset("tiny", quants[i], text_only, 1000, &shapes, &err), &err);
            assert_sizes_equal(&drawn, &shapes);
            assert_true(drawn.expert_bytes[0] > 0);
        }
        clef_quant_config_free(&qc);
        clef_checkpoint_close(&ck);
    }
}

static void test_preset_errors_and_full(void **state) {
    (void)state;
    clef_place_sizes s;
    clef_err err;
    clef_err_clear(&err);
    assert_int_equal(clef_place_sizes_of_preset("huge", NULL, 0, 16, &s, &err), -1);
    assert_int_equal(err.status, 500);
    clef_err_clear(&err);
    assert_int_equal(clef_place_sizes_of_preset("tiny", "int3", 0, 16, &s, &err), -1);
    assert_int_equal(err.status, 400);
    assert_non_null(strstr(err.message, "int3"));
    /* full in INT4, from shapes: 128 experts x 3 matrices of 811520 bytes a layer */
    clef_err_clear(&err);
    tu_ok(clef_place_sizes_of_preset("full", "int4", 0, 16384, &s, &err), &err);
    assert_int_equal(s.n_layers, 48);
    for (int l = 0; l < 48; l++) assert_int_equal(s.expert_bytes[l], (size_t)128 * 3 * 811520);
    /* BF16: 3 x 768 x 2048 x 2 bytes an expert */
    tu_ok(clef_place_sizes_of_preset("full", "bf16", 1, 16384, &s, &err), &err);
    assert_int_equal(s.expert_bytes[47], (size_t)128 * 3 * 768 * 2048 * 2);
    assert_int_equal(s.tower_bytes, 0);
}

/* ---- issue 17's breaker findings ---- */

/* Item 1: a huge --max-batch-tokens saturates every size (SIZE_MAX), and a saturated size never fits,
 * not even under a budget of SIZE_MAX; before, 2^62 tokens wrapped into a small workspace that "fit". */
static void test_overflow_saturates(void **state) {
    (void)state;
    clef_place_sizes s;
    clef_place_plan p;
    clef_err err;
    clef_err_clear(&err);
    static const size_t huge[] = {(size_t)1 << 62, ((size_t)1 << 62) + 12345, SIZE_MAX / 4, SIZE_MAX};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        tu_ok(clef_place_sizes_of_preset("full", "int4", 0, huge[i], &s, &err), &err);
        assert_int_equal(s.workspace_bytes, SIZE_MAX);
        assert_int_equal(clef_place_fixed_bytes(&s), SIZE_MAX);
        assert_int_equal(clef_place_min_bytes(&s, NULL), SIZE_MAX);
        clef_place_plan_make(&s, 16 * GIB, ADV_ALL, &p);
        assert_int_equal(p.fits, 0);
        clef_place_plan_make(&s, SIZE_MAX, ADV_ALL, &p);
        assert_int_equal(p.fits, 0);
        assert_int_equal(p.n_streamed, 0);
    }
    /* the largest forward the CLI accepts is far from saturating, and grows monotonically */
    tu_ok(clef_place_sizes_of_preset("full", "int4", 0, CLEF_PLACE_MAX_TOKENS, &s, &err), &err);
    assert_true(s.workspace_bytes < SIZE_MAX / 1024);
    assert_true(s.workspace_bytes > 64 * GIB);
    /* saturated expert bytes (a hostile checkpoint's sizes) never fit either */
    s = sizes48();
    s.expert_bytes[3] = SIZE_MAX;
    clef_place_plan_make(&s, SIZE_MAX, ADV_ALL, &p);
    assert_int_equal(p.fits, 0);
}

/* Item 2: the "minimum" is min(all resident, fixed + two slots), with the preset's own sizes. */
static void test_minimum_is_real(void **state) {
    (void)state;
    clef_place_sizes s;
    clef_place_plan p;
    clef_err err;
    clef_err_clear(&err);
    tu_ok(clef_place_sizes_of_preset("full", "int4", 0, 16384, &s, &err), &err);
    assert_int_equal(s.dense_bytes, 3365163520);
    assert_int_equal(s.tower_bytes, 2380427264);
    assert_int_equal(s.workspace_bytes, 3870143232);
    assert_int_equal(s.expert_bytes[0], 311623680);
    const size_t fixed = 3365163520 + 2380427264 + 3870143232 + (size_t)CLEF_PLACE_CONTEXT_BYTES;
    assert_int_equal(clef_place_fixed_bytes(&s), fixed); /* 10244879616 */
    int streaming = -1;
    /* 48 layers: two slots (11136562432 bytes) are less than all resident */
    assert_int_equal(clef_place_min_bytes(&s, &streaming), fixed + 2 * 311623680);
    assert_int_equal(streaming, 1);
    clef_place_plan_make(&s, fixed + 2 * 311623680 - 1, CLEF_PLACE_ADVICE_INSPECT, &p);
    assert_int_equal(p.fits, 0);
    assert_string_equal(p.message,
                        "does not fit in 10.37 GiB: the smallest plan needs 10.38 GiB (non-expert weights 3.13 GiB, "
                        "towers 2.22 GiB, workspace for 16384 tokens 3.60 GiB, context 0.84 GiB, two expert slots "
                        "0.58 GiB); use --max-batch-tokens lower, --text-only or --towers cpu, a smaller format, or "
                        "a budget of at least 10.38 GiB");
    clef_place_plan_make(&s, fixed + 2 * 311623680, CLEF_PLACE_ADVICE_INSPECT, &p);
    assert_int_equal(p.fits, 1);
    assert_int_equal(p.n_streamed, 48);
    /* the same shapes cut to one MoE layer: all resident (10824938752) is less than two slots
     * (11136562432), so that is the minimum; before, the message asked for the two slots */
    s.n_layers = 1;
    assert_int_equal(clef_place_min_bytes(&s, &streaming), fixed + 311623680);
    assert_int_equal(streaming, 0);
    clef_place_plan_make(&s, 9 * GIB, CLEF_PLACE_ADVICE_INSPECT, &p);
    assert_int_equal(p.fits, 0);
    assert_string_equal(p.message,
                        "does not fit in 9.00 GiB: the smallest plan needs 10.09 GiB (non-expert weights 3.13 GiB, "
                        "towers 2.22 GiB, workspace for 16384 tokens 3.60 GiB, context 0.84 GiB, every layer's "
                        "experts resident 0.29 GiB); use --max-batch-tokens lower, --text-only or --towers cpu, a "
                        "smaller format, or a budget of at least 10.09 GiB");
    clef_place_plan_make(&s, fixed + 311623680 - 1, CLEF_PLACE_ADVICE_INSPECT, &p);
    assert_int_equal(p.fits, 0);
    clef_place_plan_make(&s, fixed + 311623680, CLEF_PLACE_ADVICE_INSPECT, &p);
    assert_int_equal(p.fits, 1);
    assert_int_equal(p.n_streamed, 0);
    assert_string_equal(p.message, "plan: the 1 layer resident, 10.08 GiB of 10.08 GiB");
}

/* Item 5: the advice names only the flags of the command that loads the model. */
static void test_advice_per_command(void **state) {
    (void)state;
    clef_place_sizes s;
    clef_place_plan p;
    clef_err err;
    clef_err_clear(&err);
    tu_ok(clef_place_sizes_of_preset("full", NULL, 0, 64000, &s, &err), &err);
    clef_place_plan_make(&s, 16 * GIB, CLEF_PLACE_ADVICE_DECIDE, &p); /* decide: --max-length, --towers */
    assert_int_equal(p.fits, 0);
    assert_string_equal(p.message,
                        "does not fit in 16.00 GiB: the smallest plan needs 20.02 GiB (non-expert weights 3.13 GiB, "
                        "towers 2.22 GiB, workspace for 64000 tokens 11.58 GiB, context 0.84 GiB, two expert slots "
                        "2.25 GiB); use --max-length lower, --towers cpu, a smaller format, or a budget of at least "
                        "20.02 GiB");
    clef_place_plan_make(&s, 16 * GIB, CLEF_PLACE_ADVICE_PARITY, &p); /* parity: --max-length only */
    assert_non_null(strstr(p.message, "; use --max-length lower, a smaller format, or a budget of at least 20.02 GiB"));
    tu_ok(clef_place_sizes_of_preset("full", NULL, 0, 16384, &s, &err), &err);
    clef_place_plan_make(&s, 8 * GIB, CLEF_PLACE_ADVICE_SERVE, &p); /* serve / eval */
    assert_string_equal(p.message,
                        "does not fit in 8.00 GiB: the smallest plan needs 12.05 GiB (non-expert weights 3.13 GiB, "
                        "towers 2.22 GiB, workspace for 16384 tokens 3.60 GiB, context 0.84 GiB, two expert slots "
                        "2.25 GiB); use --max-batch-tokens lower, --text-only or --towers cpu, a smaller format, or a "
                        "budget of at least 12.05 GiB");
    for (unsigned a = 0; a < 16; a++) { /* no set ever names a flag outside it */
        clef_place_plan_make(&s, 8 * GIB, a, &p);
        assert_int_equal(!!strstr(p.message, "--max-batch-tokens"), !!(a & CLEF_PLACE_ADV_MAX_BATCH_TOKENS));
        assert_int_equal(!!strstr(p.message, "--max-length"),
                         (a & CLEF_PLACE_ADV_MAX_LENGTH) && !(a & CLEF_PLACE_ADV_MAX_BATCH_TOKENS));
        assert_int_equal(!!strstr(p.message, "--text-only"), !!(a & CLEF_PLACE_ADV_TEXT_ONLY));
        assert_int_equal(!!strstr(p.message, "--towers cpu"), !!(a & CLEF_PLACE_ADV_TOWERS_CPU));
    }
    /* towers already on the host: nothing to suggest about them */
    clef_place_towers_on_host(&s);
    assert_int_equal(s.tower_bytes, 0);
    assert_int_equal(s.tower_host_bytes, 2380427264);
    clef_place_plan_make(&s, 8 * GIB, CLEF_PLACE_ADVICE_SERVE, &p);
    assert_non_null(strstr(p.message, "two expert slots 2.25 GiB); use --max-batch-tokens lower, a smaller format,"));
}

/* Item 4: under a plan the longest record is the workspace's forward. */
static void test_max_record(void **state) {
    (void)state;
    clef_place_sizes s = sizes48(); /* batch_tokens 16384 */
    assert_int_equal(clef_place_max_record(64000, &s), 16384);
    assert_int_equal(clef_place_max_record(8000, &s), 8000);
    s.batch_tokens = 64000;
    assert_int_equal(clef_place_max_record(64000, &s), 64000);
}

/* Item 6: units and grammar. */
static void test_wording(void **state) {
    (void)state;
    clef_place_sizes s;
    memset(&s, 0, sizeof s);
    s.n_layers = 1;
    s.expert_bytes[0] = 4096; /* non-zero, far under 0.01 GiB */
    s.dense_bytes = GIB;
    s.context_bytes = CLEF_PLACE_CONTEXT_BYTES;
    s.batch_tokens = 16;
    clef_place_plan p;
    clef_place_plan_make(&s, 0, ADV_ALL, &p);
    assert_string_equal(p.message, "plan: no GPU memory budget (--gpu-memory): the 1 layer resident, 1.84 GiB");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    clef_place_plan_print(&s, &p, f);
    fclose(f);
    assert_non_null(strstr(buf, "  resident experts        <0.01 GiB           4096 bytes  1 of 1 MoE layer\n"));
    assert_non_null(strstr(buf, "  towers                   0.00 GiB              0 bytes  text only\n"));
    assert_non_null(strstr(buf, "  streamed experts         0.00 GiB              0 bytes  0 layers, pinned"));
    assert_null(strstr(buf, "0.00 GiB           4096"));
    free(buf);
    /* one resident layer of 48 (streaming never leaves exactly one layer streamed: it would need
     * more than all resident) */
    s = sizes48();
    clef_place_plan_make(&s, fixed_of(&s) + 3 * 256 * MIB, ADV_ALL, &p);
    assert_int_equal(p.n_resident, 1);
    assert_int_equal(p.n_streamed, 47);
    f = open_memstream(&buf, &len);
    clef_place_plan_print(&s, &p, f);
    fclose(f);
    assert_non_null(strstr(buf, " bytes  1 of 48 MoE layers\n"));
    assert_non_null(strstr(buf, " bytes  47 layers, pinned host memory, copied every forward\n"));
    free(buf);
}

static void test_workspace_terms(void **state) {
    (void)state;
    clef_checkpoint ck;
    clef_err err;
    clef_err_clear(&err);
    char *dir = tu_fixture("tiny-clef-omni");
    tu_ok(clef_checkpoint_open(dir, &ck, &err), &err);
    free(dir);
    /* grows with the forward; the MoE scratch stops growing at 8192 tokens */
    const size_t w1 = clef_place_workspace_bytes(&ck.config, 1000), w2 = clef_place_workspace_bytes(&ck.config, 2000);
    assert_true(w2 > w1);
    assert_true(clef_place_workspace_bytes(&ck.config, 32768) > clef_place_workspace_bytes(&ck.config, 16384));
    clef_checkpoint_close(&ck);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weight_bytes),      cmocka_unit_test(test_plan_no_budget),
        cmocka_unit_test(test_plan_boundary),     cmocka_unit_test(test_plan_spread),
        cmocka_unit_test(test_plan_dense_layers), cmocka_unit_test(test_plan_does_not_fit),
        cmocka_unit_test(test_sizes_tiny_bf16),   cmocka_unit_test(test_sizes_tiny_quant),
        cmocka_unit_test(test_preset_equals_drawn), cmocka_unit_test(test_preset_errors_and_full),
        cmocka_unit_test(test_workspace_terms),
        cmocka_unit_test(test_overflow_saturates), cmocka_unit_test(test_minimum_is_real),
        cmocka_unit_test(test_advice_per_command), cmocka_unit_test(test_max_record),
        cmocka_unit_test(test_wording),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
