/* test_cuda_select.c — the CUDA backend's kernel choice
 * (src/backend/cuda/cuda_select.c) for every device generation, pass size,
 * format and numerics split, without a GPU: the function the backend asks,
 * so a table here is what an H200, an A100 or an RTX 50xx would run. */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_select.h"
#include "testutil.h"

static const ck_caps H200 = {9, 0, 1, 132};      /* Hopper, sm_90a kernels built */
static const ck_caps H100_PTX = {9, 0, 0, 132};  /* Hopper, a build without sm_90a */
static const ck_caps A100 = {8, 0, 1, 108};
static const ck_caps L40S = {8, 9, 1, 142};
static const ck_caps B200 = {10, 0, 1, 148};
static const ck_caps RTX5090 = {12, 0, 1, 170};

enum { E = 128, H = 2048, NI = 768 }; /* Clef-Omni's experts */

static void expect_experts(const ck_caps *caps, const clef_cuda_knobs *k, int64_t rows, int64_t hid, int split,
                           int maps, ck_experts_kernel kernel, int bm) {
    const ck_experts_pick p = ck_pick_experts(caps, k, rows, E, hid, NI, split, maps);
    if (p.kernel != kernel || p.bm != bm || ck_gemm_bm(p.big) != p.bm)
        fail_msg("cc %d.%d rows %lld split %d maps %d: kernel %d bm %d big %d, want kernel %d bm %d", caps->cc_major,
                 caps->cc_minor, (long long)rows, split, maps, p.kernel, p.bm, p.big, kernel, bm);
}

static void test_caps(void **state) {
    (void)state;
    assert_true(ck_caps_hopper(&H200));
    assert_false(ck_caps_hopper(&H100_PTX));
    assert_false(ck_caps_hopper(&A100));
    assert_false(ck_caps_hopper(&L40S));
    assert_false(ck_caps_hopper(&B200)); /* sm_90a code runs on 9.0 only */
    assert_false(ck_caps_hopper(&RTX5090));
}

static void test_bf16_experts(void **state) {
    (void)state;
    clef_cuda_knobs k;
    clef_cuda_knobs_default(&k);
    /* H200, defaults: 300 tokens x 8 = 2,400 rows, 1,000 tokens 8,000, 4,000 tokens 32,000 */
    expect_experts(&H200, &k, 2400, H, 1, 1, CK_EXPERTS_TMA, 64);
    expect_experts(&H200, &k, 2400, H, 2, 1, CK_EXPERTS_TMA, 32); /* precise, <= 32 rows per expert */
    expect_experts(&H200, &k, 4097, H, 2, 1, CK_EXPERTS_TMA, 64);
    expect_experts(&H200, &k, 7999, H, 1, 1, CK_EXPERTS_TMA, 64);
    expect_experts(&H200, &k, 7999, H, 2, 1, CK_EXPERTS_TMA, 64);
    expect_experts(&H200, &k, 8000, H, 1, 1, CK_EXPERTS_WGMMA_WS, 128); /* 1,000 tokens: the persistent kernel */
    expect_experts(&H200, &k, 8192, H, 1, 1, CK_EXPERTS_WGMMA_WS, 128);
    expect_experts(&H200, &k, 32000, H, 2, 1, CK_EXPERTS_WGMMA_WS, 128);
    expect_experts(&H200, &k, 32000, H, 1, 0, CK_EXPERTS_WGMMA, 128); /* no tensor maps: the cp.async wgmma kernel */
    expect_experts(&H200, &k, 2400, H, 1, 0, CK_EXPERTS_MMA, 64);    /* no tensor maps */
    expect_experts(&H200, &k, 32000, 2000, 1, 1, CK_EXPERTS_MMA, 128); /* hidden % 64 != 0: no wgmma */
    /* every other device (and a Hopper build without sm_90a): the portable mma.sync kernel */
    const ck_caps *portable[] = {&H100_PTX, &A100, &L40S, &B200, &RTX5090};
    for (size_t i = 0; i < sizeof portable / sizeof *portable; i++) {
        expect_experts(portable[i], &k, 2400, H, 1, 1, CK_EXPERTS_MMA, 64);
        expect_experts(portable[i], &k, 2400, H, 2, 1, CK_EXPERTS_MMA, 32);
        expect_experts(portable[i], &k, 8000, H, 1, 1, CK_EXPERTS_MMA, 64);
        expect_experts(portable[i], &k, 32000, H, 1, 1, CK_EXPERTS_MMA, 128);
    }
    /* the switches */
    k.tune = 0; /* wgmma always on 64-row tiles (so never the persistent kernel); precise small passes not on 32 */
    expect_experts(&H200, &k, 32000, H, 1, 1, CK_EXPERTS_WGMMA, 64);
    expect_experts(&H200, &k, 2400, H, 2, 1, CK_EXPERTS_TMA, 64);
    clef_cuda_knobs_default(&k);
    k.wgmma = 0;
    expect_experts(&H200, &k, 32000, H, 1, 1, CK_EXPERTS_MMA, 128); /* 128-row tiles: mma.sync, not TMA */
    expect_experts(&H200, &k, 32000, H, 2, 1, CK_EXPERTS_TMA, 64);  /* precise big pass, tune bit 4 */
    k.wgmma = 1;
    expect_experts(&H200, &k, 2400, H, 1, 1, CK_EXPERTS_WGMMA, 64);
    expect_experts(&H200, &k, 9000, H, 1, 1, CK_EXPERTS_WGMMA_WS, 128);
    expect_experts(&A100, &k, 2400, H, 1, 1, CK_EXPERTS_MMA, 64); /* a switch cannot ask for what the device lacks */
    k.wgmma = 2;
    k.wgmma_rows = 2048; /* wgmma from 2,048 rows: 128-row tiles from there too */
    expect_experts(&H200, &k, 2400, H, 1, 1, CK_EXPERTS_WGMMA_WS, 128);
    k.wgmma_rows = 8192;
    expect_experts(&H200, &k, 8000, H, 1, 1, CK_EXPERTS_TMA, 64);
    expect_experts(&H200, &k, 8192, H, 1, 1, CK_EXPERTS_WGMMA_WS, 128);
    k.wgmma_rows = 16384; /* tiles of 128 rows from 8,192 at most */
    expect_experts(&H200, &k, 16384, H, 1, 1, CK_EXPERTS_WGMMA_WS, 128);
    clef_cuda_knobs_default(&k);
    k.wgmma_ws = 2;
    expect_experts(&H200, &k, 32000, H, 1, 1, CK_EXPERTS_WGMMA_WS_PAIRS, 128);
    k.wgmma_ws = 0;
    expect_experts(&H200, &k, 32000, H, 1, 1, CK_EXPERTS_WGMMA, 128);
    clef_cuda_knobs_default(&k);
    k.tma = 0;
    expect_experts(&H200, &k, 2400, H, 1, 1, CK_EXPERTS_MMA, 64);
}

static void expect_packed_split(const ck_caps *caps, const clef_cuda_knobs *k, int qt, int64_t rows, int split,
                                int fits, int fp8, int fp8_fits, ck_packed_kernel kernel, int bm) {
    const ck_packed_pick p = ck_pick_packed(caps, k, qt, rows, E, split, fits, fp8, fp8_fits);
    if (p.kernel != kernel || p.bm != bm)
        fail_msg("cc %d.%d qtype %d rows %lld split %d fits %d fp8 %d/%d: kernel %d bm %d, want kernel %d bm %d",
                 caps->cc_major, caps->cc_minor, qt, (long long)rows, split, fits, fp8, fp8_fits, p.kernel, p.bm,
                 kernel, bm);
}
/* a fast pass (split 1) */
static void expect_packed(const ck_caps *caps, const clef_cuda_knobs *k, int qt, int64_t rows, int fits, int fp8,
                          int fp8_fits, ck_packed_kernel kernel, int bm) {
    expect_packed_split(caps, k, qt, rows, 1, fits, fp8, fp8_fits, kernel, bm);
}

static void test_packed_experts(void **state) {
    (void)state;
    clef_cuda_knobs k;
    clef_cuda_knobs_default(&k);
    /* v5 (swapped operands, 32-row tiles) for fast INT4 / NVFP4 passes averaging up to 1024 rows per expert
     * on every device, ahead of wgmma; v3 (mma.sync) for the rest below the wgmma threshold; v4 (a loading warp) on Hopper
     * when its switch asks for it, INT4 and NVFP4 each by its own switch, 32- and 64-row tiles */
    expect_packed(&H200, &k, CK_QT_NVFP4, 2400, 1, 0, 0, CK_PACKED_SKINNY, 32);
    expect_packed(&A100, &k, CK_QT_NVFP4, 2400, 1, 0, 0, CK_PACKED_SKINNY, 32);
    expect_packed(&RTX5090, &k, CK_QT_INT4, 2400, 1, 0, 0, CK_PACKED_SKINNY, 32);
    expect_packed_split(&H200, &k, CK_QT_INT4, 2400, 2, 1, 0, 0, CK_PACKED_MMA, 32); /* precise: v3 */
    expect_packed(&H200, &k, CK_QT_NVFP4, 8000, 1, 0, 0, CK_PACKED_SKINNY, 32); /* 1 x 1,000: 62.5 per expert */
    expect_packed(&H200, &k, CK_QT_INT4, 2400, 1, 0, 0, CK_PACKED_SKINNY, 32);
    expect_packed(&H200, &k, CK_QT_INT4, 4097, 1, 0, 0, CK_PACKED_SKINNY, 32); /* ck_qgemm_bm's 64: still v5 */
    expect_packed(&H200, &k, CK_QT_INT4, 8000, 1, 0, 0, CK_PACKED_SKINNY, 32);
    /* v5 ahead of wgmma up to 1024 rows per expert (every fast pass of the thinker: <= 512) */
    expect_packed(&H200, &k, CK_QT_INT4, 8193, 0, 0, 0, CK_PACKED_SKINNY, 32);
    expect_packed(&H200, &k, CK_QT_INT4, 8192, 1, 0, 0, CK_PACKED_SKINNY, 32);
    expect_packed(&H200, &k, CK_QT_INT4, 65536, 1, 0, 0, CK_PACKED_SKINNY, 32); /* a pass of 8,192 tokens */
    expect_packed(&A100, &k, CK_QT_INT4, 65536, 0, 0, 0, CK_PACKED_SKINNY, 32);
    expect_packed(&H200, &k, CK_QT_INT4, 1024 * 128 + 1, 1, 0, 0, CK_PACKED_WGMMA, 128);
    expect_packed_split(&H200, &k, CK_QT_INT4, 65536, 2, 1, 0, 0, CK_PACKED_WGMMA, 128); /* precise: wgmma */
    expect_packed(&H200, &k, CK_QT_NVFP4, 8192, 1, 0, 0, CK_PACKED_SKINNY, 32); /* NVFP4 the same */
    expect_packed(&H200, &k, CK_QT_NVFP4, 65536, 1, 0, 0, CK_PACKED_SKINNY, 32);
    expect_packed(&H200, &k, CK_QT_NVFP4, 1024 * 128 + 1, 1, 0, 0, CK_PACKED_WGMMA, 128);
    expect_packed(&H200, &k, CK_QT_NVFP4, 1024 * 128 + 1, 0, 0, 0, CK_PACKED_MMA, 128); /* does not fit */
    k.v5_rows = 64; /* CLEF_CUDA_V5_ROWS=64 (the default before 2026-12-04) */
    expect_packed(&H200, &k, CK_QT_INT4, 8193, 0, 0, 0, CK_PACKED_MMA, 64); /* past 64 per expert, no wgmma fit */
    expect_packed(&H200, &k, CK_QT_INT4, 8192, 1, 0, 0, CK_PACKED_SKINNY, 32); /* v5 ahead of wgmma at 64 */
    expect_packed(&H200, &k, CK_QT_INT4, 8193, 1, 0, 0, CK_PACKED_WGMMA, 128);
    k.v5_rows = 32; /* CLEF_CUDA_V5_ROWS=32 (the default before 2026-12-03): v3 on 64-row tiles past 32 */
    expect_packed(&H200, &k, CK_QT_INT4, 4097, 1, 0, 0, CK_PACKED_MMA, 64);
    expect_packed(&H200, &k, CK_QT_NVFP4, 8000, 1, 0, 0, CK_PACKED_MMA, 64);
    expect_packed(&H200, &k, CK_QT_INT4, 4096, 1, 0, 0, CK_PACKED_SKINNY, 32);
    k.v5_rows = 1024;
    expect_packed(&H200, &k, CK_QT_FP8, 2400, 1, 0, 0, CK_PACKED_MMA, 32);
    k.int4 = 3; /* CLEF_CUDA_QGEMM_INT4=v3 */
    expect_packed(&H200, &k, CK_QT_INT4, 2400, 1, 0, 0, CK_PACKED_MMA, 32);
    expect_packed(&H200, &k, CK_QT_NVFP4, 2400, 1, 0, 0, CK_PACKED_SKINNY, 32); /* NVFP4 has its own switch */
    k.nvfp4 = 3;
    expect_packed(&H200, &k, CK_QT_NVFP4, 2400, 1, 0, 0, CK_PACKED_MMA, 32);
    clef_cuda_knobs_default(&k);
    assert_int_equal(ck_packed_tma(&H200, &k, CK_QT_INT4, 64), 0);
    k.int4 = 5; /* CLEF_CUDA_QGEMM_INT4=v4 */
    expect_packed(&H200, &k, CK_QT_INT4, 2400, 1, 0, 0, CK_PACKED_TMA, 32);
    expect_packed(&H200, &k, CK_QT_INT4, 8000, 1, 0, 0, CK_PACKED_TMA, 64);
    expect_packed(&H200, &k, CK_QT_INT4, 32000, 0, 0, 0, CK_PACKED_TMA, 64); /* does not fit wgmma */
    expect_packed(&H200, &k, CK_QT_NVFP4, 2400, 1, 0, 0, CK_PACKED_SKINNY, 32);
    expect_packed(&A100, &k, CK_QT_INT4, 2400, 1, 0, 0, CK_PACKED_MMA, 32);   /* Hopper only */
    expect_packed(&RTX5090, &k, CK_QT_INT4, 2400, 1, 0, 0, CK_PACKED_MMA, 32);
    assert_int_equal(ck_packed_tma(&H200, &k, CK_QT_INT4, 128), 0); /* v4 has 32- and 64-row tiles */
    assert_int_equal(ck_packed_tma(&H200, &k, CK_QT_INT4, 64), 1);  /* the dense packed matmul asks this */
    k.nvfp4 = 4; /* CLEF_CUDA_QGEMM_NVFP4=v4 */
    expect_packed(&H200, &k, CK_QT_NVFP4, 2400, 1, 0, 0, CK_PACKED_TMA, 32);
    expect_packed(&H200, &k, CK_QT_FP8, 2400, 1, 0, 0, CK_PACKED_MMA, 32);
    clef_cuda_knobs_default(&k);
    expect_packed(&H200, &k, CK_QT_NVFP4, 8192, 1, 0, 0, CK_PACKED_SKINNY, 32);
    expect_packed(&H200, &k, CK_QT_INT4, 32000, 1, 0, 0, CK_PACKED_SKINNY, 32); /* 250 per expert: v5 first */
    expect_packed(&H200, &k, CK_QT_INT4, 200000, 1, 0, 0, CK_PACKED_WGMMA, 128); /* past v5's 1024 */
    expect_packed(&H200, &k, CK_QT_INT4, 200000, 0, 0, 0, CK_PACKED_MMA, 64); /* does not fit wgmma */
    expect_packed(&H200, &k, CK_QT_FP8, 32000, 1, 0, 0, CK_PACKED_MMA, 64);  /* FP8 stays on mma.sync */
    expect_packed(&A100, &k, CK_QT_NVFP4, 32000, 1, 0, 0, CK_PACKED_SKINNY, 32); /* no wgmma: v5 to 1024 */
    expect_packed(&A100, &k, CK_QT_NVFP4, 200000, 1, 0, 0, CK_PACKED_MMA, 128);
    expect_packed(&RTX5090, &k, CK_QT_INT4, 32000, 1, 0, 0, CK_PACKED_SKINNY, 32);
    expect_packed(&RTX5090, &k, CK_QT_INT4, 200000, 1, 0, 0, CK_PACKED_MMA, 64);
    /* W8A8 where asked for, on Hopper only, at every pass size */
    expect_packed(&H200, &k, CK_QT_FP8, 300, 1, 1, 1, CK_PACKED_FP8MMA, 128);
    expect_packed(&H200, &k, CK_QT_FP8, 32000, 1, 1, 0, CK_PACKED_MMA, 64); /* blocks do not fit */
    expect_packed(&H200, &k, CK_QT_INT4, 300, 1, 1, 1, CK_PACKED_SKINNY, 32); /* W8A8 is for FP8 blocks */
    expect_packed(&L40S, &k, CK_QT_FP8, 32000, 1, 1, 1, CK_PACKED_MMA, 64);
    k.qwgmma = 2;
    expect_packed(&H200, &k, CK_QT_FP8, 32000, 1, 0, 0, CK_PACKED_WGMMA, 128);
    k.qwgmma = 0;
    expect_packed(&H200, &k, CK_QT_NVFP4, 32000, 1, 0, 0, CK_PACKED_SKINNY, 32);
    expect_packed(&H200, &k, CK_QT_NVFP4, 200000, 1, 0, 0, CK_PACKED_MMA, 128);
    clef_cuda_knobs_default(&k);
    k.qwgmma_rows = 1024;
    expect_packed(&H200, &k, CK_QT_NVFP4, 2400, 1, 0, 0, CK_PACKED_SKINNY, 32); /* v5 ahead */
    k.v5_rows = 8;
    expect_packed(&H200, &k, CK_QT_NVFP4, 2400, 1, 0, 0, CK_PACKED_WGMMA, 128);
    /* the tile rule itself */
    assert_int_equal(ck_qgemm_bm(CK_QT_NVFP4, 4096, 128), 32);
    assert_int_equal(ck_qgemm_bm(CK_QT_NVFP4, 4097, 128), 64);
    assert_int_equal(ck_qgemm_bm(CK_QT_NVFP4, 8192, 128), 128);
    assert_int_equal(ck_qgemm_bm(CK_QT_INT4, 8192, 128), 64);
    assert_int_equal(ck_qgemm_bm(CK_QT_FP8, 300, 1), 64); /* a dense product of 300 rows */
}

static void test_attention(void **state) {
    (void)state;
    clef_cuda_knobs k;
    clef_cuda_knobs_default(&k);
    assert_int_equal(ck_pick_attention(&k, 1, 300, 1), 2);
    assert_int_equal(ck_pick_attention(&k, 1, 4000, 1), 2);
    assert_int_equal(ck_pick_attention(&k, 2, 300, 1), 2);
    assert_int_equal(ck_pick_attention(&k, 2, CK_ATTN_SHORT, 1), 2);
    assert_int_equal(ck_pick_attention(&k, 2, CK_ATTN_SHORT + 1, 1), 3);
    assert_int_equal(ck_pick_attention(&k, 2, 1000, 0), 1); /* no positive scale: v1 */
    /* v2s by call size: a 300-token record's 3 tiles x 32 heads on 132 SMs, not 32 x 1,000's 8,192 */
    assert_int_equal(ck_attention_v2s(&k, 1, 3 * 32, 132), 1);
    assert_int_equal(ck_attention_v2s(&k, 1, 2 * 132 - 1, 132), 1);
    assert_int_equal(ck_attention_v2s(&k, 1, 2 * 132, 132), 0);
    assert_int_equal(ck_attention_v2s(&k, 1, 256 * 32, 132), 0);
    assert_int_equal(ck_attention_v2s(&k, 2, 3 * 32, 132), 0); /* precise: v2's 64-row kernel already */
    assert_int_equal(ck_attention_v2s(&k, 1, 3 * 32, 0), 0);   /* SM count unknown */
    k.attn = 2;
    assert_int_equal(ck_attention_v2s(&k, 1, 3 * 32, 132), 0); /* a forced variant stays */
    k.attn = 4;
    assert_int_equal(ck_pick_attention(&k, 1, 300, 1), 4);
    assert_int_equal(ck_pick_attention(&k, 2, 300, 1), 2); /* v2s is the fast mode's kernel */
    assert_int_equal(ck_pick_attention(&k, 1, 300, 0), 1);
    assert_int_equal(ck_attention_v2s(&k, 1, 3 * 32, 132), 0);
    k.attn = 3;
    assert_int_equal(ck_pick_attention(&k, 1, 300, 1), 3);
    assert_int_equal(ck_attention_ksplit(&k, 2), 3); /* tune bit 2: one K/V buffer */
    assert_int_equal(ck_attention_ksplit(&k, 1), 1);
    k.tune = 0;
    assert_int_equal(ck_attention_ksplit(&k, 2), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_caps),
        cmocka_unit_test(test_bf16_experts),
        cmocka_unit_test(test_packed_experts),
        cmocka_unit_test(test_attention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
