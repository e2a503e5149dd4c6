/* cuda_env.c — the CUDA backend's environment settings (cuda_env.h).  Plain
 * C with no CUDA dependency: compiled in every build so the parsing is tested
 * on machines without a GPU. */
#include "backend/cuda/cuda_env.h"

#include <stdlib.h>
#include <string.h>

/* Non-empty value of `name`, or NULL. */
static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* `name` as a whole decimal integer in [lo, hi] (default dflt when unset). */
static int env_int(const char *name, int lo, int hi, int dflt, int *out, clef_err *err) {
    const char *v = env(name);
    if (!v) {
        *out = dflt;
        return 0;
    }
    long x = 0;
    const char *p = v;
    for (; *p >= '0' && *p <= '9' && x <= hi; p++) x = 10 * x + (*p - '0');
    if (p == v || *p || x < lo || x > hi)
        return clef_fail(err, 500, CLEF_E_INTERNAL, "settings",
                         "CUDA settings: %s must be an integer from %d to %d (got '%.40s')", name, lo, hi, v);
    *out = (int)x;
    return 0;
}

/* `name` as one of names[0..n) (its index; dflt when unset); an unknown value
 * fails with param `what` and the message "CUDA <what>: <name> must be ...". */
static int env_choice(const char *what, const char *name, const char *const *names, int n, int dflt,
                      const char *accepts, int *out, clef_err *err) {
    const char *v = env(name);
    if (!v) {
        *out = dflt;
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (names[i] && !strcmp(v, names[i])) {
            *out = i;
            return 0;
        }
    return clef_fail(err, 500, CLEF_E_INTERNAL, what, "CUDA %s: %s must be %s (got '%.40s')", what, name, accepts, v);
}

/* CLEF_CUDA_PRECISE's comma list of parts, or -1 for an unknown part or an empty item. */
static int precise_list(const char *v) {
    int m = 0;
    const char *p = v;
    for (;;) {
        const size_t n = strcspn(p, ",");
        if (n == 5 && !strncmp(p, "dense", 5)) m |= CLEF_PRECISE_DENSE;
        else if (n == 7 && !strncmp(p, "experts", 7)) m |= CLEF_PRECISE_EXPERTS;
        else if (n == 9 && !strncmp(p, "attention", 9)) m |= CLEF_PRECISE_ATTN;
        else return -1;
        if (!p[n]) return m;
        p += n + 1;
    }
}

static int read_numerics(clef_cuda_env *e, clef_err *err) {
    const char *v = env("CLEF_CUDA_PRECISE");
    if (v) {
        if (!strcmp(v, "0") || !strcmp(v, "none") || !strcmp(v, "fast")) e->precise_parts = 0;
        else if (!strcmp(v, "1") || !strcmp(v, "all")) e->precise_parts = CLEF_PRECISE_ALL;
        else if ((e->precise_parts = precise_list(v)) < 0)
            return clef_fail(err, 500, CLEF_E_INTERNAL, "numerics",
                             "CUDA numerics: CLEF_CUDA_PRECISE must be 0, 1, all or a comma list of dense, experts, "
                             "attention (got '%.40s')",
                             v);
        return 0;
    }
    static const char *const modes[] = {"fast", "balanced", "precise"};
    static const int parts[] = {0, CLEF_PRECISE_DENSE | CLEF_PRECISE_ATTN, CLEF_PRECISE_ALL};
    int m = 2;
    if (env_choice("numerics", "CLEF_CUDA_NUMERICS", modes, 3, 2, "fast, balanced or precise", &m, err)) return -1;
    e->precise_parts = parts[m];
    return 0;
}

int clef_cuda_env_read(clef_cuda_env *e, clef_err *err) {
    memset(e, 0, sizeof *e);
    static const char *const gemm[] = {"cublaslt", "custom"};
    static const char *const int4[] = {NULL, NULL, "v2", "v3", "v3-2blk"};
    static const char *const nvfp4[] = {NULL, NULL, "v2", "v3"};
    static const char *const attn[] = {NULL, "v1", "v2", "v2w"};
    int v3 = 3;
    if (read_numerics(e, err) ||
        env_choice("settings", "CLEF_CUDA_GEMM", gemm, 2, 0, "cublaslt or custom", &e->gemm_custom, err) ||
        env_int("CLEF_CUDA_PROFILE", 0, 1, 0, &e->profile, err) ||
        env_int("CLEF_CUDA_TUNE", 0, 7, 7, &e->tune, err) || env_int("CLEF_CUDA_WGMMA", 0, 2, 2, &e->wgmma, err) ||
        env_int("CLEF_CUDA_QWGMMA", 0, 2, 1, &e->qwgmma, err) ||
        env_choice("settings", "CLEF_CUDA_QGEMM_INT4", int4, 5, v3, "v2, v3 or v3-2blk", &e->int4, err) ||
        env_choice("settings", "CLEF_CUDA_QGEMM_NVFP4", nvfp4, 4, v3, "v2 or v3", &e->nvfp4, err) ||
        env_int("CLEF_CUDA_LT_SPLITK", 0, 2, 1, &e->lt_splitk, err) ||
        env_choice("settings", "CLEF_CUDA_ATTN", attn, 4, 0, "v1, v2 or v2w", &e->attn, err) ||
        env_int("CLEF_CUDA_WGMMA_ROWS", 1, 1 << 30, 8000, &e->wgmma_rows, err) ||
        env_int("CLEF_CUDA_QWGMMA_ROWS", 1, 1 << 30, 8192, &e->qwgmma_rows, err) ||
        env_int("CLEF_CUDA_GRAPHS", 0, 1, 1, &e->graphs, err) || env_int("CLEF_CUDA_TMA", 0, 1, 1, &e->tma, err) ||
        env_int("CLEF_CUDA_WGMMA_WS", 0, 2, 1, &e->wgmma_ws, err) ||
        env_int("CLEF_CUDA_FP8_MMA", 0, 1, 0, &e->fp8_mma, err))
        return -1;
    return 0;
}
