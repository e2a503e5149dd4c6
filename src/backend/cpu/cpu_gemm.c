/* cpu_gemm.c — the CPU backend's blocked GEMM (contract in cpu_gemm.h).
 *
 * Shape of the work: cpu_gemm_cols computes a range of output columns, NR
 * (a panel) at a time, for every row of A.  For each block of KC k values it fills the panel P[KC][NR] (B's
 * values for those k and columns, k-major, zero past the last column: the
 * weight rows decoded and transposed), then runs the MR x NR microkernel
 * over A's rows in tiles of at most MR rows.  The microkernel keeps one
 * accumulator per (row, column) in a vector lane and adds one fused
 * multiply-add per k; between k blocks the accumulators go to C and come
 * back unchanged.  So C[m, n] is the same chain of fmaf over k = 0..K-1
 * whatever the tile sizes, the k block, the panel or the instruction set —
 * the GEMM has no other reduction.
 *
 * Compiled with -ffp-contract=off (CMakeLists.txt): the only fused
 * multiply-adds are the explicit ones (fmaf, _mm*_fmadd_ps).
 */
#include "backend/cpu/cpu_gemm.h"

#include <math.h>
#include <string.h>

#include "quant/fp.h"
#include "quant/qweight.h"
#include "tensor/dtype.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define CPU_GEMM_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

/* Widest panel of any variant, and rows decoded at a time on the generic path. */
#define NR_MAX 64
#define TMP_ROWS 16

/* Cache lines of the block a thread fills next, prefetched while it fills
 * this one, so that block's reads from memory overlap the kernel's work on
 * this one (weight rows are many short streams the hardware prefetcher
 * barely follows).  Lines run along `per_row` lines of a row, then the next
 * row `stride` bytes on; `left` lines remain. */
typedef struct pf_cursor {
    const char *row;
    int64_t stride;
    int per_row, line;
    int64_t left;
} pf_cursor;

/* The next `k` lines of the cursor (NULL: none). */
static inline __attribute__((always_inline)) void pf_issue(pf_cursor *c, int64_t k) {
    if (!c) return;
    for (; k > 0 && c->left > 0; k--, c->left--) {
        __builtin_prefetch(c->row + 64 * c->line, 0, 0); /* non-temporal: measured best (prefetcht0 stalls) */
        if (++c->line == c->per_row) {
            c->line = 0;
            c->row += c->stride;
        }
    }
}

/* A cursor over `rows` rows of `bytes` bytes each, the first at p, `stride` apart. */
static pf_cursor pf_rows(const void *p, int64_t stride, int64_t rows, int64_t bytes) {
    const uintptr_t a = (uintptr_t)p & ~(uintptr_t)63;
    const int per_row = (int)(((uintptr_t)p - a + (uintptr_t)bytes + 63) / 64);
    return (pf_cursor){.row = (const char *)a, .stride = stride, .per_row = per_row, .line = 0,
                       .left = rows > 0 && bytes > 0 ? rows * per_row : 0};
}

const char *cpu_isa_name(cpu_isa isa) {
    static const char *const names[CPU_ISA_COUNT] = {"scalar", "avx2", "avx512"};
    return (unsigned)isa < CPU_ISA_COUNT ? names[isa] : "?";
}

#ifdef CPU_GEMM_X86
/* F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports
 * does not know "f16c" (a compile error there), gcc's does. */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

int cpu_isa_supported(cpu_isa isa) {
    switch (isa) {
    case CPU_ISA_SCALAR: return 1;
#ifdef CPU_GEMM_X86
    case CPU_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case CPU_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("fma") && has_f16c();
#endif
    default: return 0;
    }
}

cpu_isa cpu_isa_best(void) {
    for (int i = CPU_ISA_COUNT - 1; i > 0; i--)
        if (cpu_isa_supported((cpu_isa)i)) return (cpu_isa)i;
    return CPU_ISA_SCALAR;
}

cpu_isa cpu_isa_parse(const char *name) {
    for (int i = 0; i < CPU_ISA_COUNT; i++)
        if (name && !strcmp(name, cpu_isa_name((cpu_isa)i))) return (cpu_isa)i;
    return CPU_ISA_COUNT;
}

size_t cpu_gemm_scratch_floats(cpu_isa isa) {
    (void)isa;
    return (size_t)CPU_GEMM_KC * NR_MAX + (size_t)TMP_ROWS * CPU_GEMM_KC;
}

/* ---- one variant: its microkernel and (optionally) faster panel fills ---- */

/* C tile [mr, nv] at c (row stride ldc) = chain over kc k values of the A
 * rows at a (stride lda) and the panel rows at p (stride ldp, >= nv valid
 * columns, NR wide); load_c: the chain continues from C's values, else from
 * +0.  mr <= MR, nv <= NR. */
typedef void (*kern_fn)(int mr, int64_t kc, const float *a, int64_t lda, const float *p, int64_t ldp, float *c,
                        int64_t ldc, int nv, int load_c);
/* P[k * ldp + r] = src[r * lds + k] for r < rows (<= 16), k < kc; zero for
 * rows <= r < 16.  src f32 (bf16 for the bf16 fill).  Issues pf_step of
 * pf's prefetches per 16 k. */
typedef void (*rows_fn)(const void *src, int64_t lds, int rows, int64_t kc, float *P, int64_t ldp, pf_cursor *pf,
                        int64_t pf_step);
/* The INT4 weight's columns [n0, n0 + nr) x k [k0, k0 + kc) (k0, kc multiples
 * of 8) decoded straight into P[k][NR]; pf_step prefetches per 8 k. */
typedef void (*int4_fn)(const clef_weight *w, int64_t n0, int64_t nr, int64_t k0, int64_t kc, float *P,
                        pf_cursor *pf, int64_t pf_step);

/* Rows [n0, n0 + rows) (rows <= 16) x k [k0, k0 + kc) of an NVFP4 or FP8
 * weight decoded into P[k * ldp + r] (zero for rows <= r < 16), each value
 * bitwise clef_qweight_tile_f32's.  NVFP4: k0, kc multiples of 16; FP8: k0
 * a multiple of 16, block_c % 8 == 0.  pf_step prefetches per 16 k. */
typedef void (*qrows_fn)(const clef_weight *w, int64_t n0, int rows, int64_t k0, int64_t kc, float *P, int64_t ldp,
                         pf_cursor *pf, int64_t pf_step);

typedef struct isa_impl {
    int nr, mr;
    kern_fn kern;
    rows_fn rows_f32;  /* transpose 16 f32 rows (generic decode, CPU_B_NK, f32 weights) */
    rows_fn rows_bf16; /* NULL: bf16 weights take the generic decode */
    int4_fn int4;      /* NULL: INT4 weights take the generic decode */
    qrows_fn nvfp4;    /* NULL: NVFP4 weights (both forms) take the generic decode */
    qrows_fn fp8;      /* NULL: FP8-block weights take the generic decode */
} isa_impl;

/* ---- plain C ---- */

#define SC_MR 4
#define SC_NR 16

static void kern_scalar(int mr, int64_t kc, const float *a, int64_t lda, const float *p, int64_t ldp, float *c,
                        int64_t ldc, int nv, int load_c) {
    float acc[SC_MR][SC_NR];
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < SC_NR; j++) acc[r][j] = load_c && j < nv ? c[r * ldc + j] : 0.0f;
    for (int64_t k = 0; k < kc; k++) {
        const float *pk = p + k * ldp;
        for (int r = 0; r < mr; r++) {
            const float av = a[r * lda + k];
            for (int j = 0; j < SC_NR; j++) acc[r][j] = fmaf(av, pk[j], acc[r][j]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nv; j++) c[r * ldc + j] = acc[r][j];
}

static void rows_f32_scalar(const void *src, int64_t lds, int rows, int64_t kc, float *P, int64_t ldp,
                            pf_cursor *pf, int64_t pf_step) {
    const float *s = src;
    pf_issue(pf, pf_step * ((kc + 15) / 16));
    for (int64_t k = 0; k < kc; k++)
        for (int r = 0; r < 16; r++) P[k * ldp + r] = r < rows ? s[r * lds + k] : 0.0f;
}

/* ---- AVX2 + FMA ---- */

#ifdef CPU_GEMM_X86
#define T256 __attribute__((target("avx2,fma,f16c")))
#define AV2_MR 6
#define AV2_NR 16

/* Lane mask (all ones where the lane's column is < nv) for 8 lanes at column off. */
static inline __attribute__((always_inline)) T256 __m256i mask8(int nv, int off) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(nv - off), idx);
}

static inline __attribute__((always_inline)) T256 void k256_body(const int MR, int64_t kc, const float *a,
                                                                   int64_t lda, const float *p, int64_t ldp, float *c,
                                                                   int64_t ldc, int nv, int load_c) {
    __m256 c0[AV2_MR], c1[AV2_MR];
    const __m256i m0 = mask8(nv, 0), m1 = mask8(nv, 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) {
        if (load_c) {
            c0[r] = _mm256_maskload_ps(c + r * ldc, m0);
            c1[r] = _mm256_maskload_ps(c + r * ldc + 8, m1);
        } else {
            c0[r] = _mm256_setzero_ps();
            c1[r] = _mm256_setzero_ps();
        }
    }
    for (int64_t k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_loadu_ps(p + k * ldp), b1 = _mm256_loadu_ps(p + k * ldp + 8);
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            const __m256 av = _mm256_broadcast_ss(a + r * lda + k);
            c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) {
        _mm256_maskstore_ps(c + r * ldc, m0, c0[r]);
        _mm256_maskstore_ps(c + r * ldc + 8, m1, c1[r]);
    }
}

static T256 void kern_avx2(int mr, int64_t kc, const float *a, int64_t lda, const float *p, int64_t ldp, float *c,
                           int64_t ldc, int nv, int load_c) {
    switch (mr) {
    case 1: k256_body(1, kc, a, lda, p, ldp, c, ldc, nv, load_c); break;
    case 2: k256_body(2, kc, a, lda, p, ldp, c, ldc, nv, load_c); break;
    case 3: k256_body(3, kc, a, lda, p, ldp, c, ldc, nv, load_c); break;
    case 4: k256_body(4, kc, a, lda, p, ldp, c, ldc, nv, load_c); break;
    case 5: k256_body(5, kc, a, lda, p, ldp, c, ldc, nv, load_c); break;
    default: k256_body(6, kc, a, lda, p, ldp, c, ldc, nv, load_c); break;
    }
}

/* In-register transpose of 8 x 8 floats: on return r[c] holds column c
 * (element i = old r[i][c]).  Shuffles only: values are moved, never
 * changed. */
static inline __attribute__((always_inline)) T256 void tr8(__m256 r[8]) {
    __m256 t[8], s[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* t[0] = r0[0] r1[0] r0[1] r1[1] | r0[4] r1[4] r0[5] r1[5], t[1] the same with 2, 3 / 6, 7 */
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        s[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        s[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
        s[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        s[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
    }
    /* s[j] (j < 4): rows 0-3 of columns j | j + 4; s[4 + j]: rows 4-7 */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x20);
        r[4 + j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x31);
    }
}

/* f32 rows: 8 x 8 blocks (zero rows past `rows`; the kc tail through a
 * zeroed copy), transposed in registers, stored to panel columns 0-7 and
 * 8-15.  pf_step is per 16 k. */
static T256 void rows_f32_avx2(const void *src, int64_t lds, int rows, int64_t kc, float *P, int64_t ldp,
                               pf_cursor *pf, int64_t pf_step) {
    const float *s = src;
    for (int64_t kk = 0; kk < kc; kk += 8) {
        const int64_t kn = kc - kk < 8 ? kc - kk : 8;
        if (!(kk & 15)) pf_issue(pf, pf_step);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const int row = 8 * h + i;
                if (row >= rows) {
                    r[i] = _mm256_setzero_ps();
                } else if (kn == 8) {
                    r[i] = _mm256_loadu_ps(s + row * lds + kk);
                } else {
                    float t[8] = {0};
                    memcpy(t, s + row * lds + kk, (size_t)kn * sizeof(float));
                    r[i] = _mm256_loadu_ps(t);
                }
            }
            tr8(r);
            for (int q = 0; q < kn; q++) _mm256_storeu_ps(P + (kk + q) * ldp + 8 * h, r[q]);
        }
    }
}

/* bf16 rows: 16 k at a time, each 32-byte row load split without a shuffle
 * into its even k (the low halves shifted up: exact bf16 -> f32) and its odd
 * k (the high halves, masked), two 8 x 8 transposes per 8 rows (even k to
 * panel rows kk, kk + 2, ..., odd k to kk + 1, kk + 3, ...).  pf_step is per
 * 16 k. */
static T256 void rows_bf16_avx2(const void *src, int64_t lds, int rows, int64_t kc, float *P, int64_t ldp,
                                pf_cursor *pf, int64_t pf_step) {
    const uint16_t *s = src;
    const __m256i hi = _mm256_set1_epi32((int32_t)0xFFFF0000u);
    for (int64_t kk = 0; kk < kc; kk += 16) {
        const int64_t kn = kc - kk < 16 ? kc - kk : 16;
        pf_issue(pf, pf_step);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 e[8], o[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const int row = 8 * h + i;
                __m256i v;
                if (row >= rows) {
                    v = _mm256_setzero_si256();
                } else if (kn == 16) {
                    v = _mm256_loadu_si256((const __m256i *)(s + row * lds + kk));
                } else {
                    uint16_t t[16] = {0};
                    memcpy(t, s + row * lds + kk, (size_t)kn * sizeof(uint16_t));
                    v = _mm256_loadu_si256((const __m256i *)t);
                }
                e[i] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
                o[i] = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
            }
            tr8(e);
            tr8(o);
            if (kn == 16) {
#pragma GCC unroll 8
                for (int q = 0; q < 8; q++) {
                    _mm256_storeu_ps(P + (kk + 2 * q) * ldp + 8 * h, e[q]);
                    _mm256_storeu_ps(P + (kk + 2 * q + 1) * ldp + 8 * h, o[q]);
                }
            } else {
                for (int q = 0; 2 * q < kn; q++) {
                    _mm256_storeu_ps(P + (kk + 2 * q) * ldp + 8 * h, e[q]);
                    if (2 * q + 1 < kn) _mm256_storeu_ps(P + (kk + 2 * q + 1) * ldp + 8 * h, o[q]);
                }
            }
        }
    }
}

/* INT4 (auto_gptq) straight into the 16-wide panel, as int4_avx512: 8
 * consecutive outputs of one qweight word row are one vector, nibble j of
 * it is panel row k = 8 kp + j, each value f16 scale * (float)(nibble -
 * zero) (clef_qweight_tile_f32's formula, so bitwise its values); columns
 * past nr are +0. */
static T256 void int4_avx2(const clef_weight *w, int64_t n0, int64_t nr, int64_t k0, int64_t kc, float *P,
                           pf_cursor *pf, int64_t pf_step) {
    const int64_t R = w->rows, G = w->quant.group;
    const uint8_t *qw = w->data, *sc = w->quant.scale, *zs = w->quant.zeros;
    __m256i mk[2], z[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    __m256 s[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int v = 0; v < 2; v++) mk[v] = mask8((int)nr, 8 * v);
    const __m256i low4 = _mm256_set1_epi32(15);
    int64_t gcur = -1;
    for (int64_t kp = k0 / 8; kp < (k0 + kc) / 8; kp++) {
        const int64_t g = kp * 8 / G;
        if (g != gcur) {
            gcur = g;
            int32_t zz[AV2_NR];
            uint16_t hs[AV2_NR] = {0};
            for (int64_t j = 0; j < AV2_NR; j++) {
                zz[j] = 8; /* symmetric: stored 7 means 8 */
                if (j >= nr) continue;
                const int64_t n = n0 + j;
                memcpy(&hs[j], sc + 2 * (g * R + n), 2);
                if (zs) {
                    uint32_t zw;
                    memcpy(&zw, zs + 4 * (g * (R / 8) + n / 8), 4);
                    zz[j] = (int32_t)((zw >> (4 * (n % 8))) & 15u) + 1; /* v1 asymmetric: nibble + 1 */
                }
            }
            for (int v = 0; v < 2; v++) {
                s[v] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hs + 8 * v)));
                z[v] = _mm256_loadu_si256((const __m256i *)(zz + 8 * v));
            }
        }
        pf_issue(pf, pf_step);
        float *out = P + (kp * 8 - k0) * AV2_NR;
        if (nr == AV2_NR) { /* a whole panel: plain loads, nothing to mask */
#pragma GCC unroll 2
            for (int v = 0; v < 2; v++) {
                __m256i wv = _mm256_loadu_si256((const __m256i *)(qw + 4 * (kp * R + n0 + 8 * v)));
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    const __m256i q = _mm256_and_si256(wv, low4);
                    wv = _mm256_srli_epi32(wv, 4);
                    _mm256_storeu_ps(out + j * AV2_NR + 8 * v,
                                     _mm256_mul_ps(s[v], _mm256_cvtepi32_ps(_mm256_sub_epi32(q, z[v]))));
                }
            }
            continue;
        }
#pragma GCC unroll 2
        for (int v = 0; v < 2; v++) {
            const __m256i wv = _mm256_maskload_epi32((const int *)(qw + 4 * (kp * R + n0 + 8 * v)), mk[v]);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const __m256i q = _mm256_and_si256(_mm256_srli_epi32(wv, 4 * j), low4);
                const __m256 f = _mm256_mul_ps(s[v], _mm256_cvtepi32_ps(_mm256_sub_epi32(q, z[v])));
                _mm256_storeu_ps(out + j * AV2_NR + 8 * v, _mm256_and_ps(f, _mm256_castsi256_ps(mk[v])));
            }
        }
    }
}

/* NVFP4, both forms, 16 k (one scale group: k0 and kk are multiples of 16)
 * of 8 rows at a time.  Per row and group, the 8 magnitudes of the group
 * are computed as the scalar decoder computes them, T[m] = (fp4(m) * s) / g
 * (ModelOpt: * g), in one vector; a code's value is T[code & 7] (a lane
 * permute: vpermps reads the low 3 bits) with its sign bit flipped when
 * code & 8.  That is bitwise the decoder's (fp4(c) * s) / g: fp4(c | 8) =
 * -fp4(c), and negating an operand of a correctly rounded product or
 * quotient negates the result (±0 included).  The 8 bytes of a row's group
 * are 8 lanes; the low nibbles are the even k, the high ones the odd k, and
 * two 8 x 8 transposes put them in panel rows kk + 2q and kk + 2q + 1, as
 * the bf16 fill does. */
static T256 void nvfp4_avx2(const clef_weight *w, int64_t n0, int rows, int64_t k0, int64_t kc, float *P,
                            int64_t ldp, pf_cursor *pf, int64_t pf_step) {
    const int64_t half = w->cols / 2, ng = w->cols / 16;
    const uint8_t *pk = w->data, *sc = w->quant.scale;
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256 g = _mm256_set1_ps(w->quant.global);
    const __m256i sgn = _mm256_set1_epi32((int32_t)0x80000000u);
    const int div = w->quant.global_div;
    for (int64_t kk = 0; kk < kc; kk += 16) {
        pf_issue(pf, pf_step);
        const int64_t j = (k0 + kk) / 16;
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 e[8], o[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const int row = 8 * h + i;
                if (row >= rows) {
                    e[i] = o[i] = _mm256_setzero_ps();
                    continue;
                }
                const int64_t n = n0 + row;
                uint64_t b8;
                memcpy(&b8, pk + n * half + 8 * j, 8);
                const __m256i b = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)b8));
                const __m256 sm = _mm256_mul_ps(mag, _mm256_set1_ps(clef_fp8_e4m3_values[sc[n * ng + j]]));
                const __m256 t = div ? _mm256_div_ps(sm, g) : _mm256_mul_ps(sm, g);
                const __m256i se = _mm256_and_si256(_mm256_slli_epi32(b, 28), sgn);
                const __m256i so = _mm256_and_si256(_mm256_slli_epi32(b, 24), sgn);
                e[i] = _mm256_xor_ps(_mm256_permutevar8x32_ps(t, b), _mm256_castsi256_ps(se));
                o[i] = _mm256_xor_ps(_mm256_permutevar8x32_ps(t, _mm256_srli_epi32(b, 4)), _mm256_castsi256_ps(so));
            }
            tr8(e);
            tr8(o);
#pragma GCC unroll 8
            for (int q = 0; q < 8; q++) {
                _mm256_storeu_ps(P + (kk + 2 * q) * ldp + 8 * h, e[q]);
                _mm256_storeu_ps(P + (kk + 2 * q + 1) * ldp + 8 * h, o[q]);
            }
        }
    }
}

/* FP8 E4M3 bytes -> the f16 with the same sign, exponent field and
 * mantissa (s.eeee.mmm -> s.0eeee.mmm0000000), converted by F16C: an f16
 * with exponent bias 15 instead of 7, so the f32 is fp8(q) * 2^-8 exactly
 * (E4M3 subnormals are f16 subnormals: (m/8) 2^-6 -> (m/8) 2^-14), for
 * every code but the NaNs (0x7F, 0xFF: the load-time finite scan refuses
 * them).  8 bytes in the low half of v. */
static inline __attribute__((always_inline)) T256 __m256 e4m3_lo8(__m128i v) {
    const __m128i x = _mm_unpacklo_epi8(_mm_setzero_si128(), v); /* byte << 8 in 16-bit lanes */
    return _mm256_cvtph_ps(_mm_and_si128(_mm_srai_epi16(x, 1), _mm_set1_epi16((short)0xBFFF)));
}

/* FP8 block: 16 k of 8 rows at a time (each 16-byte row load two 8-k
 * halves, each inside one scale block: block_c % 8 == 0), decoded by
 * e4m3_lo8 and multiplied by 256 s, which is the decoder's fp8(q) * s
 * bitwise: (fp8(q) 2^-8) (2^8 s) is the same real product, rounded once,
 * as long as 2^8 s is exact (finite); else by 256 then by s (both exact
 * then one rounding).  The k tail through a zeroed copy (code 0 is +0). */
static T256 void fp8_avx2(const clef_weight *w, int64_t n0, int rows, int64_t k0, int64_t kc, float *P, int64_t ldp,
                          pf_cursor *pf, int64_t pf_step) {
    const int64_t C = w->cols, bc = w->quant.block_c, br = w->quant.block_r, nbc = (C + bc - 1) / bc;
    const uint8_t *q = w->data;
    const char *sc = w->quant.scale; /* f32, any alignment */
    const __m256 two8 = _mm256_set1_ps(256.0f);
    const char *srows[16]; /* each row's scale row (no division per step) */
    for (int i = 0; i < rows; i++) srows[i] = sc + 4 * (((n0 + i) / br) * nbc);
    for (int64_t kk = 0; kk < kc; kk += 16) {
        const int64_t kn = kc - kk < 16 ? kc - kk : 16;
        const int64_t b0 = (k0 + kk) / bc, b1 = (k0 + kk + 8) / bc;
        pf_issue(pf, pf_step);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 lo[8], hi[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const int row = 8 * h + i;
                if (row >= rows) {
                    lo[i] = hi[i] = _mm256_setzero_ps();
                    continue;
                }
                const int64_t n = n0 + row;
                __m128i v;
                if (kn == 16) {
                    v = _mm_loadu_si128((const __m128i *)(q + n * C + k0 + kk));
                } else {
                    uint8_t t[16] = {0};
                    memcpy(t, q + n * C + k0 + kk, (size_t)kn);
                    v = _mm_loadu_si128((const __m128i *)t);
                }
                const char *srow = srows[row];
                float s0, s1;
                memcpy(&s0, srow + 4 * b0, 4);
                if (kn > 8) memcpy(&s1, srow + 4 * b1, 4);
                else s1 = s0;
                const __m256 d0 = e4m3_lo8(v), d1 = e4m3_lo8(_mm_unpackhi_epi64(v, v));
                const float t0 = s0 * 256.0f, t1 = s1 * 256.0f;
                lo[i] = isinf(t0) ? _mm256_mul_ps(_mm256_mul_ps(d0, two8), _mm256_set1_ps(s0))
                                  : _mm256_mul_ps(d0, _mm256_set1_ps(t0));
                hi[i] = isinf(t1) ? _mm256_mul_ps(_mm256_mul_ps(d1, two8), _mm256_set1_ps(s1))
                                  : _mm256_mul_ps(d1, _mm256_set1_ps(t1));
            }
            tr8(lo);
            tr8(hi);
            if (kn == 16) {
#pragma GCC unroll 8
                for (int r = 0; r < 8; r++) {
                    _mm256_storeu_ps(P + (kk + r) * ldp + 8 * h, lo[r]);
                    _mm256_storeu_ps(P + (kk + 8 + r) * ldp + 8 * h, hi[r]);
                }
            } else {
                for (int r = 0; r < kn; r++) _mm256_storeu_ps(P + (kk + r) * ldp + 8 * h, r < 8 ? lo[r] : hi[r - 8]);
            }
        }
    }
}

/* ---- AVX-512 ---- */

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define AV5_MR 6
#define AV5_NR 64

static inline __attribute__((always_inline)) T512 __mmask16 mask16(int64_t nv, int64_t off) {
    const int64_t n = nv - off;
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

static inline __attribute__((always_inline)) T512 void k512_body(const int MR, int64_t kc, const float *a,
                                                                   int64_t lda, const float *p, int64_t ldp, float *c,
                                                                   int64_t ldc, int nv, int load_c) {
    __m512 c0[AV5_MR], c1[AV5_MR], c2[AV5_MR], c3[AV5_MR];
    const __mmask16 m0 = mask16(nv, 0), m1 = mask16(nv, 16), m2 = mask16(nv, 32), m3 = mask16(nv, 48);
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) {
        if (load_c) {
            c0[r] = _mm512_maskz_loadu_ps(m0, c + r * ldc);
            c1[r] = _mm512_maskz_loadu_ps(m1, c + r * ldc + 16);
            c2[r] = _mm512_maskz_loadu_ps(m2, c + r * ldc + 32);
            c3[r] = _mm512_maskz_loadu_ps(m3, c + r * ldc + 48);
        } else {
            c0[r] = c1[r] = c2[r] = c3[r] = _mm512_setzero_ps();
        }
    }
    for (int64_t k = 0; k < kc; k++) {
        const float *pk = p + k * ldp;
        const __m512 b0 = _mm512_loadu_ps(pk), b1 = _mm512_loadu_ps(pk + 16), b2 = _mm512_loadu_ps(pk + 32),
                     b3 = _mm512_loadu_ps(pk + 48);
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            const __m512 av = _mm512_set1_ps(a[r * lda + k]);
            c0[r] = _mm512_fmadd_ps(av, b0, c0[r]);
            c1[r] = _mm512_fmadd_ps(av, b1, c1[r]);
            c2[r] = _mm512_fmadd_ps(av, b2, c2[r]);
            c3[r] = _mm512_fmadd_ps(av, b3, c3[r]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) {
        _mm512_mask_storeu_ps(c + r * ldc, m0, c0[r]);
        _mm512_mask_storeu_ps(c + r * ldc + 16, m1, c1[r]);
        _mm512_mask_storeu_ps(c + r * ldc + 32, m2, c2[r]);
        _mm512_mask_storeu_ps(c + r * ldc + 48, m3, c3[r]);
    }
}

static T512 void kern_avx512(int mr, int64_t kc, const float *a, int64_t lda, const float *p, int64_t ldp, float *c,
                             int64_t ldc, int nv, int load_c) {
    switch (mr) {
    case 1: k512_body(1, kc, a, lda, p, ldp, c, ldc, nv, load_c); break;
    case 2: k512_body(2, kc, a, lda, p, ldp, c, ldc, nv, load_c); break;
    case 3: k512_body(3, kc, a, lda, p, ldp, c, ldc, nv, load_c); break;
    case 4: k512_body(4, kc, a, lda, p, ldp, c, ldc, nv, load_c); break;
    case 5: k512_body(5, kc, a, lda, p, ldp, c, ldc, nv, load_c); break;
    default: k512_body(6, kc, a, lda, p, ldp, c, ldc, nv, load_c); break;
    }
}

/* In-register transpose of 16 x 16 floats: on return r[c] holds column c
 * (element i = old r[i][c]).  Shuffles only: values are moved, never
 * changed. */
static inline __attribute__((always_inline)) T512 void tr16(__m512 r[16]) {
    __m512 u[16];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const __m512 t0 = _mm512_unpacklo_ps(r[4 * i], r[4 * i + 1]), t1 = _mm512_unpackhi_ps(r[4 * i], r[4 * i + 1]);
        const __m512 t2 = _mm512_unpacklo_ps(r[4 * i + 2], r[4 * i + 3]),
                     t3 = _mm512_unpackhi_ps(r[4 * i + 2], r[4 * i + 3]);
        u[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2)));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2)));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3)));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3)));
    }
    /* u[4i + j], 128-bit lane L: rows 4i..4i+3 of column 4L + j */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88), v1 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xdd);
        const __m512 w0 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88),
                     w1 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xdd);
        r[j] = _mm512_shuffle_f32x4(v0, w0, 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(v0, w0, 0xdd);
        r[4 + j] = _mm512_shuffle_f32x4(v1, w1, 0x88);
        r[12 + j] = _mm512_shuffle_f32x4(v1, w1, 0xdd);
    }
}

/* f32 rows: 16 x 16 blocks loaded (masked at the kc tail, zero rows past
 * `rows`), transposed in registers, stored. */
static T512 void rows_f32_avx512(const void *src, int64_t lds, int rows, int64_t kc, float *P, int64_t ldp,
                                 pf_cursor *pf, int64_t pf_step) {
    for (int64_t kk = 0; kk < kc; kk += 16) {
        const int64_t kn = kc - kk < 16 ? kc - kk : 16;
        const __mmask16 km = mask16(kn, 0);
        __m512 r[16];
        pf_issue(pf, pf_step);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            r[i] = i < rows ? _mm512_maskz_loadu_ps(km, (const float *)src + i * lds + kk) : _mm512_setzero_ps();
        }
        tr16(r);
        if (kn == 16) {
#pragma GCC unroll 16
            for (int q = 0; q < 16; q++) _mm512_storeu_ps(P + (kk + q) * ldp, r[q]);
        } else {
            for (int q = 0; q < kn; q++) _mm512_storeu_ps(P + (kk + q) * ldp, r[q]);
        }
    }
}

/* bf16 rows: 32 k at a time, each 64-byte row load split without a shuffle
 * into its even k (the low halves shifted up: exact bf16 -> f32) and its odd
 * k (the high halves, masked), two 16 x 16 transposes (even k to panel rows
 * kk, kk + 2, ..., odd k to kk + 1, kk + 3, ...).  pf_step is per 16 k. */
static T512 void rows_bf16_avx512(const void *src, int64_t lds, int rows, int64_t kc, float *P, int64_t ldp,
                                  pf_cursor *pf, int64_t pf_step) {
    const __m512i hi = _mm512_set1_epi32((int32_t)0xFFFF0000u);
    for (int64_t kk = 0; kk < kc; kk += 32) {
        const int64_t kn = kc - kk < 32 ? kc - kk : 32;
        const __mmask32 km = kn == 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << kn) - 1u);
        __m512 e[16], o[16];
        pf_issue(pf, 2 * pf_step);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            if (i >= rows) {
                e[i] = o[i] = _mm512_setzero_ps();
            } else {
                const __m512i v = _mm512_maskz_loadu_epi16(km, (const uint16_t *)src + i * lds + kk);
                e[i] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
                o[i] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
            }
        }
        tr16(e);
        tr16(o);
        if (kn == 32) {
#pragma GCC unroll 16
            for (int q = 0; q < 16; q++) {
                _mm512_storeu_ps(P + (kk + 2 * q) * ldp, e[q]);
                _mm512_storeu_ps(P + (kk + 2 * q + 1) * ldp, o[q]);
            }
        } else {
            for (int q = 0; 2 * q < kn; q++) {
                _mm512_storeu_ps(P + (kk + 2 * q) * ldp, e[q]);
                if (2 * q + 1 < kn) _mm512_storeu_ps(P + (kk + 2 * q + 1) * ldp, o[q]);
            }
        }
    }
}

/* INT4 (auto_gptq) straight into the panel: qweight[k/8, n] is a u32 whose
 * nibble j is input 8 (k/8) + j of output n, so 16 consecutive outputs of
 * one word row are one vector, and nibble j of it is panel row k = 8 kp + j.
 * Each value is f16 scale * (float)(nibble - zero), the formula of
 * clef_qweight_tile_f32, so the decoded weights are bitwise the same. */
static T512 void int4_avx512(const clef_weight *w, int64_t n0, int64_t nr, int64_t k0, int64_t kc, float *P,
                             pf_cursor *pf, int64_t pf_step) {
    const int64_t R = w->rows, G = w->quant.group;
    const uint8_t *qw = w->data, *sc = w->quant.scale, *zs = w->quant.zeros;
    __mmask16 mk[4];
    __m512 s[4];
    __m512i z[4];
    for (int v = 0; v < 4; v++) mk[v] = mask16(nr, 16 * v);
    const __m512i low4 = _mm512_set1_epi32(15);
    int64_t gcur = -1;
    for (int64_t kp = k0 / 8; kp < (k0 + kc) / 8; kp++) {
        const int64_t g = kp * 8 / G;
        if (g != gcur) {
            gcur = g;
            int32_t zz[AV5_NR];
            for (int64_t j = 0; j < AV5_NR; j++) {
                zz[j] = 8; /* symmetric: stored 7 means 8 */
                if (zs && j < nr) {
                    const int64_t n = n0 + j;
                    uint32_t zw;
                    memcpy(&zw, zs + 4 * (g * (R / 8) + n / 8), 4);
                    zz[j] = (int32_t)((zw >> (4 * (n % 8))) & 15u) + 1; /* v1 asymmetric: nibble + 1 */
                }
            }
            for (int v = 0; v < 4; v++) {
                s[v] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk[v], sc + 2 * (g * R + n0 + 16 * v)));
                z[v] = _mm512_loadu_si512(zz + 16 * v);
            }
        }
        pf_issue(pf, pf_step);
        float *out = P + (kp * 8 - k0) * AV5_NR;
        for (int v = 0; v < 4; v++) {
            if (!mk[v]) {
                for (int j = 0; j < 8; j++) _mm512_storeu_ps(out + j * AV5_NR + 16 * v, _mm512_setzero_ps());
                continue;
            }
            const __m512i wv = _mm512_maskz_loadu_epi32(mk[v], qw + 4 * (kp * R + n0 + 16 * v));
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const __m512i q = _mm512_and_si512(_mm512_srl_epi32(wv, _mm_cvtsi32_si128(4 * j)), low4);
                const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(q, z[v]));
                _mm512_storeu_ps(out + j * AV5_NR + 16 * v, _mm512_maskz_mul_ps(mk[v], s[v], f));
            }
        }
    }
}
/* NVFP4, both forms, as nvfp4_avx2 but 32 k (two scale groups) of 16 rows
 * at a time: a row's 16 bytes are 16 lanes, lanes 0-7 in group j and 8-15
 * in group j + 1, so the row's two 8-value tables T (nvfp4_avx2) sit in the
 * two halves of one vector and a lane's index is its code's magnitude
 * (low 3 bits) plus 8 in the upper half.  kc % 32 == 16: the last step is
 * one group (lanes 8-15 zero). */
static T512 void nvfp4_avx512(const clef_weight *w, int64_t n0, int rows, int64_t k0, int64_t kc, float *P,
                              int64_t ldp, pf_cursor *pf, int64_t pf_step) {
    const int64_t half = w->cols / 2, ng = w->cols / 16;
    const uint8_t *pk = w->data, *sc = w->quant.scale;
    const __m512 mag = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, 0.0f, 0.5f, 1.0f, 1.5f, 2.0f,
                                      3.0f, 4.0f, 6.0f);
    const __m512 g = _mm512_set1_ps(w->quant.global);
    const __m512i sgn = _mm512_set1_epi32((int32_t)0x80000000u), low3 = _mm512_set1_epi32(7);
    const __m512i up8 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8);
    const int div = w->quant.global_div;
    for (int64_t kk = 0; kk < kc; kk += 32) {
        const int two = kc - kk >= 32; /* both groups */
        const int64_t j = (k0 + kk) / 16;
        const __mmask16 bm = two ? (__mmask16)0xFFFF : (__mmask16)0x00FF;
        __m512 e[16], o[16];
        pf_issue(pf, 2 * pf_step);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            if (i >= rows) {
                e[i] = o[i] = _mm512_setzero_ps();
                continue;
            }
            const int64_t n = n0 + i;
            const __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(bm, pk + n * half + 8 * j));
            const float s0 = clef_fp8_e4m3_values[sc[n * ng + j]], s1 = two ? clef_fp8_e4m3_values[sc[n * ng + j + 1]] : 0.0f;
            const __m512 sv = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(s0)), _mm256_set1_ps(s1), 1);
            const __m512 sm = _mm512_mul_ps(mag, sv);
            const __m512 t = div ? _mm512_div_ps(sm, g) : _mm512_mul_ps(sm, g);
            const __m512i ie = _mm512_or_si512(_mm512_and_si512(b, low3), up8);
            const __m512i io = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(b, 4), low3), up8);
            const __m512i se = _mm512_and_si512(_mm512_slli_epi32(b, 28), sgn);
            const __m512i so = _mm512_and_si512(_mm512_slli_epi32(b, 24), sgn);
            e[i] = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_permutexvar_ps(ie, t)), se));
            o[i] = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_permutexvar_ps(io, t)), so));
        }
        tr16(e);
        tr16(o);
        const int nq = two ? 16 : 8;
        for (int q = 0; q < nq; q++) {
            _mm512_storeu_ps(P + (kk + 2 * q) * ldp, e[q]);
            _mm512_storeu_ps(P + (kk + 2 * q + 1) * ldp, o[q]);
        }
    }
}

/* FP8 block, as fp8_avx2 but 16 k of 16 rows at a time: a row's 16 bytes
 * (masked at the k tail: code 0 is +0) through the f16 trick to 16 lanes,
 * lanes 0-7 in block (k0 + kk) / Bc and 8-15 in block (k0 + kk + 8) / Bc,
 * times 256 s (or 256 then s where 256 s overflows), one 16 x 16
 * transpose. */
static T512 void fp8_avx512(const clef_weight *w, int64_t n0, int rows, int64_t k0, int64_t kc, float *P,
                            int64_t ldp, pf_cursor *pf, int64_t pf_step) {
    const int64_t C = w->cols, bc = w->quant.block_c, br = w->quant.block_r, nbc = (C + bc - 1) / bc;
    const uint8_t *q = w->data;
    const char *sc = w->quant.scale; /* f32, any alignment */
    const __m512 two8 = _mm512_set1_ps(256.0f);
    const __m256i keep = _mm256_set1_epi16((short)0xBFFF);
    const char *srows[16]; /* each row's scale row (no division per step) */
    for (int i = 0; i < rows; i++) srows[i] = sc + 4 * (((n0 + i) / br) * nbc);
    for (int64_t kk = 0; kk < kc; kk += 16) {
        const int64_t kn = kc - kk < 16 ? kc - kk : 16;
        const __mmask16 km = mask16(kn, 0);
        const int64_t b0 = (k0 + kk) / bc, b1 = (k0 + kk + 8) / bc;
        __m512 r[16];
        pf_issue(pf, pf_step);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            if (i >= rows) {
                r[i] = _mm512_setzero_ps();
                continue;
            }
            const int64_t n = n0 + i;
            const __m256i x = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(km, q + n * C + k0 + kk)), 8);
            const __m512 d = _mm512_cvtph_ps(_mm256_and_si256(_mm256_srai_epi16(x, 1), keep));
            const char *srow = srows[i];
            float s0, s1;
            memcpy(&s0, srow + 4 * b0, 4);
            if (kn > 8) memcpy(&s1, srow + 4 * b1, 4);
            else s1 = s0;
            const float t0 = s0 * 256.0f, t1 = s1 * 256.0f;
            if (isinf(t0) || isinf(t1))
                r[i] = _mm512_mul_ps(_mm512_mul_ps(d, two8), _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(s0)),
                                                                                _mm256_set1_ps(s1), 1));
            else
                r[i] = _mm512_mul_ps(d, _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(t0)), _mm256_set1_ps(t1), 1));
        }
        tr16(r);
        if (kn == 16) {
#pragma GCC unroll 16
            for (int qq = 0; qq < 16; qq++) _mm512_storeu_ps(P + (kk + qq) * ldp, r[qq]);
        } else {
            for (int qq = 0; qq < kn; qq++) _mm512_storeu_ps(P + (kk + qq) * ldp, r[qq]);
        }
    }
}
#endif /* CPU_GEMM_X86 */

static const isa_impl impls[CPU_ISA_COUNT] = {
    [CPU_ISA_SCALAR] = {.nr = SC_NR, .mr = SC_MR, .kern = kern_scalar, .rows_f32 = rows_f32_scalar},
#ifdef CPU_GEMM_X86
    [CPU_ISA_AVX2] = {.nr = AV2_NR, .mr = AV2_MR, .kern = kern_avx2, .rows_f32 = rows_f32_avx2,
                      .rows_bf16 = rows_bf16_avx2, .int4 = int4_avx2, .nvfp4 = nvfp4_avx2, .fp8 = fp8_avx2},
    [CPU_ISA_AVX512] = {.nr = AV5_NR, .mr = AV5_MR, .kern = kern_avx512, .rows_f32 = rows_f32_avx512,
                        .rows_bf16 = rows_bf16_avx512, .int4 = int4_avx512, .nvfp4 = nvfp4_avx512,
                        .fp8 = fp8_avx512},
#else
    [CPU_ISA_AVX2] = {.nr = SC_NR, .mr = SC_MR, .kern = kern_scalar, .rows_f32 = rows_f32_scalar},
    [CPU_ISA_AVX512] = {.nr = SC_NR, .mr = SC_MR, .kern = kern_scalar, .rows_f32 = rows_f32_scalar},
#endif
};

int cpu_gemm_nr(cpu_isa isa) { return impls[isa].nr; }

/* ---- panels ---- */

/* The bytes block (n0, k0, nr, kc) of b reads from memory, as a prefetch
 * cursor (packed formats: their codes; scales are small and shared). */
static pf_cursor block_lines(const cpu_gemm_b *b, int64_t n0, int64_t nr, int64_t k0, int64_t kc) {
    const pf_cursor none = {0};
    if (b->kind == CPU_B_NK) return pf_rows(b->m + n0 * b->ld + k0, b->ld * 4, nr, kc * 4);
    if (b->kind != CPU_B_WEIGHT) return none; /* values: read in place by the kernel, in order */
    const clef_weight *w = b->w;
    const int64_t K = w->cols;
    const char *d = w->data;
    switch (w->quant.type) {
    case CLEF_QT_NONE: {
        const int64_t es = (int64_t)clef_dtype_size(w->dtype);
        return pf_rows(d + (n0 * K + k0) * es, K * es, nr, kc * es);
    }
    case CLEF_QT_INT4_GPTQ: return pf_rows(d + 4 * ((k0 / 8) * w->rows + n0), 4 * w->rows, kc / 8, nr * 4);
    case CLEF_QT_NVFP4: return pf_rows(d + n0 * (K / 2) + k0 / 2, K / 2, nr, (kc + 1) / 2);
    case CLEF_QT_FP8_BLOCK: return pf_rows(d + n0 * K + k0, K, nr, kc);
    default: return none;
    }
}

/* The ways fill_panel fills a panel. */
typedef enum fill_kind {
    FILL_KN,      /* f32 by k: copied */
    FILL_NK,      /* f32 by n: rows_f32 */
    FILL_INT4,    /* im->int4 */
    FILL_BF16,    /* im->rows_bf16 */
    FILL_F32,     /* f32 weight: rows_f32 */
    FILL_NVFP4,   /* im->nvfp4 */
    FILL_FP8,     /* im->fp8 */
    FILL_GENERIC, /* clef_qweight_tile_f32 into tmp, then rows_f32 */
    FILL_COUNT
} fill_kind;

static fill_kind fill_of(const isa_impl *im, const cpu_gemm_b *b) {
    if (b->kind == CPU_B_KN) return FILL_KN;
    if (b->kind == CPU_B_NK) return FILL_NK;
    const clef_weight *w = b->w;
    switch (w->quant.type) {
    case CLEF_QT_INT4_GPTQ: return im->int4 ? FILL_INT4 : FILL_GENERIC;
    case CLEF_QT_NVFP4: return im->nvfp4 && w->quant.group == 16 && w->cols % 16 == 0 ? FILL_NVFP4 : FILL_GENERIC;
    case CLEF_QT_FP8_BLOCK:
        return im->fp8 && w->quant.block_c > 0 && w->quant.block_c % 8 == 0 && w->quant.block_r > 0 ? FILL_FP8
                                                                                                   : FILL_GENERIC;
    case CLEF_QT_NONE:
        if (w->dtype == CLEF_DT_BF16 && im->rows_bf16 && ((uintptr_t)w->data & 1) == 0) return FILL_BF16;
        if (w->dtype == CLEF_DT_F32 && ((uintptr_t)w->data & 3) == 0) return FILL_F32;
        return FILL_GENERIC;
    default: return FILL_GENERIC;
    }
}

const char *cpu_gemm_fill_name(cpu_isa isa, const cpu_gemm_b *b) {
    static const char *const names[FILL_COUNT] = {"kn-copy", "nk-rows", "int4", "bf16", "f32", "nvfp4", "fp8", "generic"};
    return names[fill_of(&impls[isa], b)];
}

/* P[k * NR + j] = B(k0 + k, n0 + j) for k < kc, j < nr; 0 for nr <= j < NR,
 * prefetching pf's lines along the way. */
static void fill_panel(const isa_impl *im, const cpu_gemm_b *b, int64_t n0, int64_t nr, int64_t k0, int64_t kc,
                       float *P, float *tmp, pf_cursor *pf) {
    const int NR = im->nr;
    const int64_t groups = (nr + 15) / 16, steps = groups * ((kc + 15) / 16);
    const int64_t pf_step = pf && pf->left ? (pf->left + steps - 1) / steps : 0; /* per 16 k of a 16-row group */
    const fill_kind fk = fill_of(im, b);
    if (fk == FILL_KN) {
        for (int64_t k = 0; k < kc; k++) {
            memcpy(P + k * NR, b->m + (k0 + k) * b->ld + n0, (size_t)nr * sizeof(float));
            memset(P + k * NR + nr, 0, (size_t)(NR - nr) * sizeof(float));
        }
        return;
    }
    const clef_weight *w = b->w;
    int64_t done = groups * 16; /* columns the fills wrote (whole 16-row groups) */
    switch (fk) {
    case FILL_NK:
        for (int64_t g = 0; g < nr; g += 16)
            im->rows_f32(b->m + (n0 + g) * b->ld + k0, b->ld, (int)(nr - g < 16 ? nr - g : 16), kc, P + g, NR, pf,
                         pf_step);
        break;
    case FILL_INT4:
        im->int4(w, n0, nr, k0, kc, P, pf, pf && pf->left ? (pf->left + kc / 8 - 1) / (kc / 8) : 0);
        done = NR;
        break;
    case FILL_BF16: {
        const uint16_t *src = (const uint16_t *)w->data;
        for (int64_t g = 0; g < nr; g += 16)
            im->rows_bf16(src + (n0 + g) * w->cols + k0, w->cols, (int)(nr - g < 16 ? nr - g : 16), kc, P + g, NR,
                          pf, pf_step);
        break;
    }
    case FILL_F32: {
        const float *src = (const float *)w->data;
        for (int64_t g = 0; g < nr; g += 16)
            im->rows_f32(src + (n0 + g) * w->cols + k0, w->cols, (int)(nr - g < 16 ? nr - g : 16), kc, P + g, NR, pf,
                         pf_step);
        break;
    }
    case FILL_NVFP4:
    case FILL_FP8: {
        const qrows_fn f = fk == FILL_NVFP4 ? im->nvfp4 : im->fp8;
        for (int64_t g = 0; g < nr; g += 16)
            f(w, n0 + g, (int)(nr - g < 16 ? nr - g : 16), k0, kc, P + g, NR, pf, pf_step);
        break;
    }
    default: { /* any dtype or packed format: decode 16 rows x kc into tmp, then transpose */
        const clef_qweight q = {.dtype = w->dtype, .rows = w->rows, .cols = w->cols, .data = w->data, .quant = w->quant};
        for (int64_t g = 0; g < nr; g += 16) {
            const int rows = (int)(nr - g < 16 ? nr - g : 16);
            clef_qweight_tile_f32(&q, n0 + g, n0 + g + rows, k0, k0 + kc, tmp, CPU_GEMM_KC);
            im->rows_f32(tmp, CPU_GEMM_KC, rows, kc, P + g, NR, pf, pf_step);
        }
        break;
    }
    }
    pf_issue(pf, pf ? pf->left : 0); /* whatever rounding left over */
    if (done < NR)
        for (int64_t k = 0; k < kc; k++) memset(P + k * NR + done, 0, (size_t)(NR - done) * sizeof(float));
}

void cpu_gemm_fill(cpu_isa isa, const cpu_gemm_b *b, int64_t n0, int64_t nr, int64_t k0, int64_t kc, float *scratch) {
    fill_panel(&impls[isa], b, n0, nr, k0, kc, scratch, scratch + (size_t)CPU_GEMM_KC * NR_MAX, NULL);
}

void cpu_gemm_cols(cpu_isa isa, const float *A, int64_t lda, int64_t M, const cpu_gemm_b *b, int64_t n_begin,
                   int64_t n_end, const float *bias, float *C, int64_t ldc, float *scratch) {
    const isa_impl *im = &impls[isa];
    const int NR = im->nr, MR = im->mr;
    const int64_t K = b->K;
    if (n_end > b->N) n_end = b->N;
    if (M <= 0 || n_begin >= n_end) return;
    float *P = scratch, *tmp = scratch + (size_t)CPU_GEMM_KC * NR_MAX;
    /* row tiles of near-equal size (e.g. 19 rows: 5, 5, 5, 4), only for speed */
    const int64_t nt = (M + MR - 1) / MR, base = M / nt, extra = M % nt;
    for (int64_t n0 = n_begin; n0 < n_end; n0 += NR) {
        const int64_t nr = n_end - n0 < NR ? n_end - n0 : NR;
        for (int64_t k0 = 0; k0 < K; k0 += CPU_GEMM_KC) {
            const int64_t kc = K - k0 < CPU_GEMM_KC ? K - k0 : CPU_GEMM_KC;
            const float *p = P;
            int64_t ldp = NR;
            if (b->kind == CPU_B_KN && nr == NR) { /* already k-major: read B in place */
                p = b->m + k0 * b->ld + n0;
                ldp = b->ld;
            } else {
                /* the block filled next: this panel's next k block, else the next panel's first */
                pf_cursor pf = {0};
                if (k0 + kc < K)
                    pf = block_lines(b, n0, nr, k0 + kc, K - k0 - kc < CPU_GEMM_KC ? K - k0 - kc : CPU_GEMM_KC);
                else if (n0 + NR < n_end)
                    pf = block_lines(b, n0 + NR, n_end - n0 - NR < NR ? n_end - n0 - NR : NR, 0,
                                     K < CPU_GEMM_KC ? K : CPU_GEMM_KC);
                fill_panel(im, b, n0, nr, k0, kc, P, tmp, &pf);
            }
            int64_t m0 = 0;
            for (int64_t t = 0; t < nt; t++) {
                const int mr = (int)(base + (t < extra));
                im->kern(mr, kc, A + m0 * lda + k0, lda, p, ldp, C + m0 * ldc + n0, ldc, (int)nr, k0 > 0);
                m0 += mr;
            }
        }
        if (K <= 0)
            for (int64_t m = 0; m < M; m++) memset(C + m * ldc + n0, 0, (size_t)nr * sizeof(float));
        if (bias)
            for (int64_t m = 0; m < M; m++) {
                float *cr = C + m * ldc + n0;
                for (int64_t j = 0; j < nr; j++) cr[j] = cr[j] + bias[n0 + j];
            }
    }
}
