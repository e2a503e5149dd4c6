/* cuda_env.h — the CUDA backend's settings from the environment (the
 * variables backend/cuda/cuda.h documents), parsed and checked in plain C so
 * that a mistyped value is an error at backend creation, with or without a
 * GPU (tests/unit/test_cuda_env.c), instead of silently meaning a default. */
#ifndef CLEF_BACKEND_CUDA_ENV_H
#define CLEF_BACKEND_CUDA_ENV_H

#include "util/err.h"

/* Bits of clef_cuda_env.precise_parts: which products run precise (split bf16). */
enum { CLEF_PRECISE_DENSE = 1, CLEF_PRECISE_EXPERTS = 2, CLEF_PRECISE_ATTN = 4, CLEF_PRECISE_ALL = 7 };

typedef struct clef_cuda_env {
    /* CLEF_CUDA_PRECISE ("0", "none", "fast" = 0; "1", "all" = every part; or a comma list of dense,
     * experts, attention), else CLEF_CUDA_NUMERICS (fast = 0, balanced = dense + attention,
     * precise = all); default all */
    int precise_parts;
    int gemm_custom; /* CLEF_CUDA_GEMM: cublaslt (default, 0) or custom (1): the dense products' kernel */
    int profile;     /* CLEF_CUDA_PROFILE: 0 (default) or 1 = per-op timing */
    int tune;        /* CLEF_CUDA_TUNE: 0..7, kernel-shape bits; default 7 */
    int wgmma;       /* CLEF_CUDA_WGMMA: 0, 1 or 2 (default) */
    int qwgmma;      /* CLEF_CUDA_QWGMMA: 0, 1 (default) or 2 */
    int int4;        /* CLEF_CUDA_QGEMM_INT4: 3 = v3 (default), 2 = v2, 4 = v3-2blk */
    int nvfp4;       /* CLEF_CUDA_QGEMM_NVFP4: 3 = v3 (default), 2 = v2 */
    int lt_splitk;   /* CLEF_CUDA_LT_SPLITK: 0, 1 (default) or 2 */
    int attn;        /* CLEF_CUDA_ATTN: 0 = per mode and segment length (default), 1 = v1, 2 = v2, 3 = v2w */
    int wgmma_rows;  /* CLEF_CUDA_WGMMA_ROWS: expert rows per pass from which CLEF_CUDA_WGMMA=2 uses wgmma (BF16); default 8000 */
    int qwgmma_rows; /* CLEF_CUDA_QWGMMA_ROWS: the same for packed experts; default 8192 */
    int graphs;      /* CLEF_CUDA_GRAPHS: 0 = off, 1 (default) = repeated thinker forwards replayed as CUDA graphs */
    int tma;         /* CLEF_CUDA_TMA: 0 = off, 1 (default) = small expert passes on the TMA kernel */
    int wgmma_ws;    /* CLEF_CUDA_WGMMA_WS: 0 = off, 1 (default) = BF16 wgmma passes of 128-row tiles on the
                      * persistent warp-specialised kernel (ck_gemm_wgmma_ws), 2 = the same in CTA pairs
                      * sharing weight tiles (CK_WS_PAIRS) */
    int fp8_mma;     /* CLEF_CUDA_FP8_MMA: 0 (default) = FP8-block experts decoded to bf16; 1 = W8A8 on wgmma
                      * e4m3 (activations quantized per token per 128 columns: changes numerics) */
} clef_cuda_env;

/* Reads every variable above from the process environment into *e (an
 * unset or empty variable takes its default).  Returns 0, or -1 with err set
 * (500, param "settings"; the message names the variable, what it accepts
 * and the value given) for any value it does not know; *e is then
 * unspecified.  Reads only: the environment is not changed. */
int clef_cuda_env_read(clef_cuda_env *e, clef_err *err);

#endif
