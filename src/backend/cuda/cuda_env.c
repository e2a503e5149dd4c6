/* cuda_env.c — the CUDA backend's user settings and kernel switches
 * (cuda_env.h).  Plain C with no CUDA dependency: compiled in every build so
 * the parsing is tested on machines without a GPU. */
#include "backend/cuda/cuda_env.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Non-empty value of `name`, or NULL. */
static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* `v` (the value of variable `name`; NULL = unset) as a whole decimal integer in [lo, hi] (dflt when unset). */
static int parse_int(const char *name, const char *v, int lo, int hi, int dflt, int *out, clef_err *err) {
    if (!v || !*v) {
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

/* `v` as one of names[0..n) (its index; dflt when unset); an unknown value
 * fails with param `what` and the message "CUDA <what>: <name> must be ...". */
static int parse_choice(const char *what, const char *name, const char *v, const char *const *names, int n, int dflt,
                        const char *accepts, int *out, clef_err *err) {
    if (!v || !*v) {
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
    /* indexed by clef_numerics: the names numerics.c parses */
    static const char *const modes[] = {NULL, "fast", "balanced", "precise"};
    int m = CLEF_NUMERICS_DEFAULT;
    if (parse_choice("numerics", "CLEF_CUDA_NUMERICS", env("CLEF_CUDA_NUMERICS"), modes, 4, CLEF_NUMERICS_DEFAULT,
                     "fast, balanced or precise", &m, err))
        return -1;
    e->precise_parts = (int)clef_numerics_parts((clef_numerics)m);
    return 0;
}

int clef_cuda_env_read(clef_cuda_env *e, clef_err *err) {
    memset(e, 0, sizeof *e);
    if (read_numerics(e, err) ||
        parse_int("CLEF_CUDA_PROFILE", env("CLEF_CUDA_PROFILE"), 0, 1, 0, &e->profile, err) ||
        parse_int("CLEF_CUDA_GRAPHS", env("CLEF_CUDA_GRAPHS"), 0, 1, 1, &e->graphs, err) ||
        parse_int("CLEF_CUDA_FP8_MMA", env("CLEF_CUDA_FP8_MMA"), 0, 1, 0, &e->fp8_mma, err))
        return -1;
    return 0;
}

/* The kernel switches: name, kind (integer range or a name list), default, field. */
typedef struct knob_def {
    const char *name;
    int lo, hi, dflt;           /* integers lo..hi (names == NULL) */
    const char *const *names;   /* else the accepted names, indexed by value (NULL entries: none) */
    int n_names;
    const char *accepts;
    size_t offset;              /* of the int in clef_cuda_knobs */
} knob_def;

static const char *const GEMM_NAMES[] = {"cublaslt", "custom"};
static const char *const INT4_NAMES[] = {NULL, NULL, "v2", "v3", "v3-2blk", "v4", "v5"};
static const char *const NVFP4_NAMES[] = {NULL, NULL, "v2", "v3", "v4", "v5"};
static const char *const ATTN_NAMES[] = {NULL, "v1", "v2", "v2w", "v2s"};

#define KNOB_INT(n, lo, hi, d, f) {n, lo, hi, d, NULL, 0, NULL, offsetof(clef_cuda_knobs, f)}
#define KNOB_NAMES(n, names, cnt, d, acc, f) {n, 0, 0, d, names, cnt, acc, offsetof(clef_cuda_knobs, f)}
static const knob_def KNOBS[] = {
    KNOB_NAMES("CLEF_CUDA_GEMM", GEMM_NAMES, 2, 0, "cublaslt or custom", gemm_custom),
    KNOB_INT("CLEF_CUDA_TUNE", 0, 7, 7, tune),
    KNOB_INT("CLEF_CUDA_WGMMA", 0, 2, 2, wgmma),
    KNOB_INT("CLEF_CUDA_QWGMMA", 0, 2, 1, qwgmma),
    KNOB_NAMES("CLEF_CUDA_QGEMM_INT4", INT4_NAMES, 7, 6, "v2, v3, v3-2blk, v4 or v5", int4),
    KNOB_NAMES("CLEF_CUDA_QGEMM_NVFP4", NVFP4_NAMES, 6, 5, "v2, v3, v4 or v5", nvfp4),
    KNOB_INT("CLEF_CUDA_LT_SPLITK", 0, 2, 1, lt_splitk),
    KNOB_NAMES("CLEF_CUDA_ATTN", ATTN_NAMES, 5, 0, "v1, v2, v2w or v2s", attn),
    KNOB_INT("CLEF_CUDA_WGMMA_ROWS", 1, 1 << 30, 8000, wgmma_rows),
    KNOB_INT("CLEF_CUDA_QWGMMA_ROWS", 1, 1 << 30, 8192, qwgmma_rows),
    KNOB_INT("CLEF_CUDA_TMA", 0, 1, 1, tma),
    KNOB_INT("CLEF_CUDA_WGMMA_WS", 0, 2, 1, wgmma_ws),
    KNOB_INT("CLEF_CUDA_V5_ROWS", 1, 1 << 20, 1024, v5_rows),
};
enum { N_KNOBS = sizeof KNOBS / sizeof *KNOBS };

static int knob_apply(const knob_def *d, clef_cuda_knobs *k, const char *value, clef_err *err) {
    int *field = (int *)((char *)k + d->offset);
    return d->names ? parse_choice("settings", d->name, value, d->names, d->n_names, d->dflt, d->accepts, field, err)
                    : parse_int(d->name, value, d->lo, d->hi, d->dflt, field, err);
}

void clef_cuda_knobs_default(clef_cuda_knobs *k) {
    memset(k, 0, sizeof *k);
    for (int i = 0; i < N_KNOBS; i++) *(int *)((char *)k + KNOBS[i].offset) = KNOBS[i].dflt;
}

int clef_cuda_knobs_set(clef_cuda_knobs *k, const char *name, const char *value, clef_err *err) {
    for (int i = 0; i < N_KNOBS; i++)
        if (!strcmp(name, KNOBS[i].name)) return knob_apply(&KNOBS[i], k, value, err) ? -1 : 1;
    return 0;
}

void clef_cuda_knob_names(char *buf, size_t cap) {
    size_t n = 0;
    if (cap) buf[0] = 0;
    for (int i = 0; i < N_KNOBS && n < cap; i++) {
        const int w = snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", KNOBS[i].name);
        if (w < 0) break;
        n += (size_t)w;
    }
}

int clef_cuda_knobs_from_env(clef_cuda_knobs *k, clef_err *err) {
    clef_cuda_knobs_default(k);
    for (int i = 0; i < N_KNOBS; i++)
        if (knob_apply(&KNOBS[i], k, env(KNOBS[i].name), err)) return -1;
    return 0;
}
