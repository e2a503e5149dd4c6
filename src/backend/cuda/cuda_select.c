/* cuda_select.c — kernel selection for the CUDA backend (cuda_select.h):
 * plain C, no CUDA dependency. */
#include "backend/cuda/cuda_select.h"

int ck_caps_hopper(const ck_caps *c) { return c->sm90a_built && c->cc_major == 9 && c->cc_minor == 0; }

int ck_gemm_bm(int big) { return big == 2 ? 32 : big ? 128 : 64; }

int ck_qgemm_bm(int qtype, int64_t rows, int64_t n_experts) {
    if (rows <= 32 * n_experts) return 32;                /* <= 32 rows per expert on average: weight streaming */
    if (qtype == CK_QT_NVFP4 && rows >= 8192) return 128; /* no fold accumulators: room for 128-row tiles */
    return 64;
}

/* Whether a pass of `rows` expert rows runs on a wgmma kernel by the switch (0 never, 1 always, 2 from
 * the threshold) on a Hopper device. */
static int wgmma_pass(const ck_caps *caps, const clef_cuda_knobs *k, int64_t rows, int packed) {
    if (!ck_caps_hopper(caps)) return 0;
    return k->wgmma == 1 || (k->wgmma == 2 && rows >= (packed ? k->qwgmma_rows : k->wgmma_rows));
}

ck_experts_pick ck_pick_experts(const ck_caps *caps, const clef_cuda_knobs *k, int64_t rows, int64_t n_experts,
                                int64_t hidden, int64_t inter, int split, int tmaps_ok) {
    ck_experts_pick p;
    const int wg = wgmma_pass(caps, k, rows, 0) && hidden % 64 == 0 && inter % 64 == 0;
    const unsigned tune = (unsigned)k->tune;
    const int64_t wg_big = k->wgmma_rows < 8192 ? k->wgmma_rows : 8192;
    p.big = wg ? (rows >= wg_big && tune ? 1 : 0)
          : rows >= 8192 ? (split == 2 && (tune & 4) ? 0 : 1)
          : split == 2 && (tune & 1) && rows <= 32 * n_experts ? 2
                                                              : 0;
    p.bm = ck_gemm_bm(p.big);
    p.kernel = wg && p.big == 1 && k->wgmma_ws && tmaps_ok ? (k->wgmma_ws == 2 ? CK_EXPERTS_WGMMA_WS_PAIRS
                                                                               : CK_EXPERTS_WGMMA_WS)
             : wg ? CK_EXPERTS_WGMMA
             : k->tma && ck_caps_hopper(caps) && tmaps_ok && p.big != 1 ? CK_EXPERTS_TMA
                                                                       : CK_EXPERTS_MMA;
    return p;
}

ck_packed_pick ck_pick_packed(const ck_caps *caps, const clef_cuda_knobs *k, int qtype, int64_t rows,
                              int64_t n_experts, int split, int wgmma_fits, int fp8_mma, int fp8mma_fits) {
    ck_packed_pick p;
    if (fp8_mma && qtype == CK_QT_FP8 && fp8mma_fits && ck_caps_hopper(caps)) {
        p.kernel = CK_PACKED_FP8MMA; /* one 128-row tile shape at every pass size */
        p.bm = 128;
        return p;
    }
    const int v5 = split == 1 && rows <= (int64_t)k->v5_rows * n_experts &&
                   ((qtype == CK_QT_INT4 && k->int4 == 6) || (qtype == CK_QT_NVFP4 && k->nvfp4 == 5));
    /* v5 ahead of the packed wgmma kernel wherever it covers the pass (H200, full preset, fast: INT4 1 x 2,000
     * 78.2 -> 52.3 ms, 32 x 1,000 33.8k -> 42.9k tokens/s; NVFP4 1 x 2,000 69.3 -> 59.7 ms, 8 x 1,000 equal) */
    if (v5) {
        p.kernel = CK_PACKED_SKINNY;
        p.bm = 32;
        return p;
    }
    const int wg = k->qwgmma && (k->qwgmma == 2 || qtype != CK_QT_FP8) && wgmma_pass(caps, k, rows, 1) && wgmma_fits;
    p.kernel = wg ? CK_PACKED_WGMMA : CK_PACKED_MMA;
    p.bm = wg ? 128 : ck_qgemm_bm(qtype, rows, n_experts);
    if (!wg && ck_packed_tma(caps, k, qtype, p.bm)) p.kernel = CK_PACKED_TMA;
    return p;
}

int ck_packed_tma(const ck_caps *caps, const clef_cuda_knobs *k, int qtype, int bm) {
    const int on = (qtype == CK_QT_INT4 && k->int4 == 5) || (qtype == CK_QT_NVFP4 && k->nvfp4 == 4);
    return on && (bm == 32 || bm == 64) && ck_caps_hopper(caps);
}

int ck_pick_attention(const clef_cuda_knobs *k, int split, int64_t seg_len, int scale_ok) {
    if (!scale_ok) return 1;
    if (k->attn) return k->attn == 4 && split != 1 ? 2 : k->attn;
    return split == 2 && seg_len > CK_ATTN_SHORT ? 3 : 2;
}

int ck_attention_v2s(const clef_cuda_knobs *k, int split, int64_t blocks, int sms) {
    return k->attn == 0 && split == 1 && sms > 0 && blocks < (int64_t)CK_ATTN_V2S_PER_SM * sms;
}

int ck_attention_ksplit(const clef_cuda_knobs *k, int split) { return split == 2 && (k->tune & 2) ? 3 : split; }
