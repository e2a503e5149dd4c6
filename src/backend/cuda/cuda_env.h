/* cuda_env.h — the CUDA backend's settings, parsed and checked in plain C so
 * that a mistyped value is an error, with or without a GPU
 * (tests/unit/test_cuda_env.c), instead of silently meaning a default.
 *
 * Two kinds:
 *   - user settings (clef_cuda_env), read from the process environment when
 *     a backend is created: the numerics (CLEF_CUDA_PRECISE,
 *     CLEF_CUDA_NUMERICS), W8A8 experts (CLEF_CUDA_FP8_MMA: changes
 *     numerics), CUDA graphs (CLEF_CUDA_GRAPHS) and per-op profiling
 *     (CLEF_CUDA_PROFILE);
 *   - kernel switches (clef_cuda_knobs): the A/B choices between kernels
 *     that give the same results (or, for CLEF_CUDA_ATTN, results within the
 *     stated tolerances) at different speeds.  The backend never reads them
 *     from the environment: it runs the defaults (the fastest measured,
 *     chosen by cuda_select.h) unless clef_cuda_options.knobs says
 *     otherwise.  Test and bench programs set them, by the same names, from
 *     their own environment (clef_cuda_knobs_from_env) or per backend
 *     (clef_cuda_knobs_set). */
#ifndef CLEF_BACKEND_CUDA_ENV_H
#define CLEF_BACKEND_CUDA_ENV_H

#include "backend/numerics.h" /* CLEF_PRECISE_* bits of precise_parts */
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct clef_cuda_env {
    /* CLEF_CUDA_PRECISE ("0", "none", "fast" = 0; "1", "all" = every part; or a comma list of dense,
     * experts, attention), else CLEF_CUDA_NUMERICS (fast = 0, balanced = dense + attention,
     * precise = all); default: the parts of CLEF_NUMERICS_DEFAULT (fast: none) */
    int precise_parts;
    int profile;     /* CLEF_CUDA_PROFILE: 0 (default) or 1 = per-op timing */
    int graphs;      /* CLEF_CUDA_GRAPHS: 0 = off, 1 (default) = repeated thinker forwards replayed as CUDA graphs */
    int fp8_mma;     /* CLEF_CUDA_FP8_MMA: 0 (default) = FP8-block experts decoded to bf16; 1 = W8A8 on wgmma
                      * e4m3 (activations quantized per token per 128 columns: changes numerics) */
} clef_cuda_env;

/* Kernel switches; every value gives the default's results (bitwise, except
 * attn: within the stated tolerances).  The names are the variables
 * clef_cuda_knobs_from_env reads. */
typedef struct clef_cuda_knobs {
    int gemm_custom; /* CLEF_CUDA_GEMM: cublaslt (default, 0) or custom (1): the dense products' kernel */
    int tune;        /* CLEF_CUDA_TUNE: 0..7, kernel-shape bits; default 7 (cuda_select.h) */
    int wgmma;       /* CLEF_CUDA_WGMMA: 0 = never, 1 = every pass, 2 (default) = from wgmma_rows / qwgmma_rows */
    int qwgmma;      /* CLEF_CUDA_QWGMMA: 0, 1 (default: NVFP4 and INT4) or 2 (every format) */
    int int4;        /* CLEF_CUDA_QGEMM_INT4: 6 = v5 (default: kernel v5 for fast passes of 32-row tiles,
                      * v3 for the rest), 3 = v3 everywhere, 2 = v2, 4 = v3-2blk, 5 = v4 (v3 fed by a
                      * loading warp on Hopper: measured slower, kept for A/B; cuda_qgemm.cu) */
    int nvfp4;       /* CLEF_CUDA_QGEMM_NVFP4: 5 = v5 (default, as INT4), 3 = v3, 2 = v2, 4 = v4 (as INT4) */
    int lt_splitk;   /* CLEF_CUDA_LT_SPLITK: 0, 1 (default) or 2 */
    int attn;        /* CLEF_CUDA_ATTN: 0 = per mode, segment length and call size (default), 1 = v1, 2 = v2,
                      * 3 = v2w, 4 = v2s (the fast mode's 64-row blocks; v2 in the precise mode) */
    int wgmma_rows;  /* CLEF_CUDA_WGMMA_ROWS: expert rows per pass from which wgmma = 2 uses wgmma (BF16); 8000 */
    int qwgmma_rows; /* CLEF_CUDA_QWGMMA_ROWS: the same for packed experts; default 8192 */
    int tma;         /* CLEF_CUDA_TMA: 0 = off, 1 (default) = small BF16 expert passes on the TMA kernel */
    int wgmma_ws;    /* CLEF_CUDA_WGMMA_WS: 0 = off, 1 (default) = BF16 wgmma passes of 128-row tiles on the
                      * persistent warp-specialised kernel (ck_gemm_wgmma_ws), 2 = the same in CTA pairs
                      * sharing weight tiles (CK_WS_PAIRS) */
    int v5_rows;     /* CLEF_CUDA_V5_ROWS: packed INT4 / NVFP4 fast passes averaging up to this many rows per
                      * expert run kernel v5 on 32-row tiles (default 1024: ahead of the packed wgmma kernel
                      * too; on an H200 INT4 1 x 2,000 33% less time, 32 x 1,000 27% more tokens/s, NVFP4
                      * 1 x 2,000 14% less, 8 x 1,000 equal; 64 was the default before, 16.5% less time than
                      * v3 at 1 x 1,000) */
} clef_cuda_knobs;

/* Reads the user settings above from the process environment into *e (an
 * unset or empty variable takes its default).  Returns 0, or -1 with err set
 * (500, param "settings" or "numerics"; the message names the variable,
 * what it accepts and the value given) for any value it does not know; *e
 * is then unspecified.  Reads only: the environment is not changed.  The
 * kernel-switch variables are not read here. */
int clef_cuda_env_read(clef_cuda_env *e, clef_err *err);

/* The default kernel switches (the fastest measured). */
void clef_cuda_knobs_default(clef_cuda_knobs *k);

/* Sets one switch by its variable name (e.g. "CLEF_CUDA_WGMMA", "1"); a NULL
 * or empty value sets that switch's default.  Returns 1 when done, 0 when
 * `name` is not a kernel switch (k unchanged), -1 with err (500, param
 * "settings", the same messages as clef_cuda_env_read) for a bad value. */
int clef_cuda_knobs_set(clef_cuda_knobs *k, const char *name, const char *value, clef_err *err);

/* The switches' names, ", "-separated, into buf (cap bytes, truncated, NUL-terminated when cap > 0). */
void clef_cuda_knob_names(char *buf, size_t cap);

/* For test and bench programs: the defaults, then every switch whose
 * variable is set in the process environment.  Returns 0 or -1 + err. */
int clef_cuda_knobs_from_env(clef_cuda_knobs *k, clef_err *err);

#ifdef __cplusplus
}
#endif

#endif
