/* cpu_gemm.h — the CPU backend's blocked GEMM: one panel of output columns
 * at a time, the weights decoded a cache-sized tile at a time, microkernels
 * for AVX-512, AVX2+FMA and plain C chosen at run time.
 *
 * The one numerical rule (what makes a record's answer independent of the
 * rows packed around it, and of the instruction set):
 *
 *     C[m, n] = acc (+ bias[n], one f32 add) where acc starts at +0.0f and
 *     takes acc = fmaf(A[m, k], B(k, n), acc) for k = 0, 1, ..., K-1,
 *
 * one fused multiply-add per k in ascending k, whatever M, the row's
 * position in a tile, the k blocking, the panel or the thread.  Every kernel
 * variant keeps exactly this chain (a lane of a vector register is one
 * (m, n) chain; k blocks store and reload acc exactly), so the AVX-512, AVX2
 * and scalar variants give bitwise the same C (tests/unit/test_cpu_gemm.c).
 *
 * B is described by a cpu_gemm_b: a weight W[N, K] of any dtype the backend
 * takes (B(k, n) = W[n, k]: y = x W^T), an f32 matrix stored by n (B(k, n)
 * = m[n * ld + k]: attention's keys) or by k (B(k, n) = m[k * ld + n]: its
 * values).  cpu_gemm_cols decodes the K x NR slice of each panel of NR
 * columns one k block at a time into per-thread scratch ([KC][NR] floats,
 * k-major) and multiplies every row of A by it, so each weight element is
 * decoded once per call however many rows A has.
 */
#ifndef CLEF_BACKEND_CPU_GEMM_H
#define CLEF_BACKEND_CPU_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* Instruction sets with a kernel.  Each one is bitwise the others. */
typedef enum cpu_isa {
    CPU_ISA_SCALAR, /* plain C, fmaf (a libm call where the target has no FMA: slow, but the same numbers) */
    CPU_ISA_AVX2,   /* AVX2 + FMA + F16C: 6 x 16 microkernel, 8 x 8 in-register transposes, INT4 decoded in
                       place, NVFP4 / FP8 decoded by lane permutes / F16C then transposed */
    CPU_ISA_AVX512, /* AVX-512 F/BW/VL/DQ: 6 x 64 microkernel, in-register transposes, INT4 decoded in place,
                       NVFP4 / FP8 as AVX2 on 16 lanes */
    CPU_ISA_COUNT
} cpu_isa;

/* "scalar", "avx2", "avx512". */
const char *cpu_isa_name(cpu_isa isa);
/* Whether this processor runs `isa` (__builtin_cpu_supports). */
int cpu_isa_supported(cpu_isa isa);
/* The fastest supported instruction set. */
cpu_isa cpu_isa_best(void);
/* CPU_ISA_COUNT when `name` names none of them. */
cpu_isa cpu_isa_parse(const char *name);

/* k values per panel block (a multiple of 16): 512 x 64 floats = 128 KiB,
 * L2-resident, and 1 KiB of each bf16 weight row read per block. */
#define CPU_GEMM_KC 512

/* How B(k, n) is read.  N, K: B's logical shape [K, N] (n < N, k < K). */
typedef enum cpu_b_kind {
    CPU_B_WEIGHT, /* B(k, n) = w[n, k] (decoded from w's dtype or packed format) */
    CPU_B_NK,     /* B(k, n) = m[n * ld + k], f32 */
    CPU_B_KN      /* B(k, n) = m[k * ld + n], f32 */
} cpu_b_kind;

typedef struct cpu_gemm_b {
    cpu_b_kind kind;
    const clef_weight *w; /* CPU_B_WEIGHT (N = w->rows, K = w->cols) */
    const float *m;       /* CPU_B_NK / CPU_B_KN */
    int64_t ld;           /* floats between m's rows */
    int64_t N, K;
} cpu_gemm_b;

/* Output columns per panel for `isa` (64 AVX-512, 16 otherwise). */
int cpu_gemm_nr(cpu_isa isa);
/* Floats of per-thread scratch cpu_gemm_panel needs (any K). */
size_t cpu_gemm_scratch_floats(cpu_isa isa);

/* Columns [n_begin, n_end) of C, single-threaded: for m < M and n in that
 * range (n_end clipped to N),
 *     C[m * ldc + n] = the chain above (+ bias[n] when bias is non-NULL).
 * A: M rows of K floats, row m at A + m * lda.  n_begin is a multiple of
 * cpu_gemm_nr(isa).  Panels are done in order, and while a k block is
 * decoded the next one's bytes are prefetched (the next panel's first block
 * after a panel's last), so a longer range streams the weight better.
 * scratch: cpu_gemm_scratch_floats(isa) floats, 64-byte aligned, owned by
 * the calling thread.  C must not overlap A, B or bias.  An INT4 weight
 * needs K % 8 == 0 (always true: bind checks group % 8). */
void cpu_gemm_cols(cpu_isa isa, const float *A, int64_t lda, int64_t M, const cpu_gemm_b *b, int64_t n_begin,
                   int64_t n_end, const float *bias, float *C, int64_t ldc, float *scratch);

/* For tests: the weight panel cpu_gemm_cols would multiply, columns [n0,
 * n0 + nr) (nr <= cpu_gemm_nr(isa), n0 a multiple of it) x k [k0, k0 + kc)
 * (k0 a multiple of CPU_GEMM_KC, kc <= CPU_GEMM_KC, k0 + kc <= K): B(k0 +
 * k, n0 + j) at scratch[k * cpu_gemm_nr(isa) + j], +0 for nr <= j.  And
 * the name of the fill that makes it ("bf16", "int4", "nvfp4", "fp8",
 * "f32", "generic" for clef_qweight_tile_f32 then a transpose, ...). */
void cpu_gemm_fill(cpu_isa isa, const cpu_gemm_b *b, int64_t n0, int64_t nr, int64_t k0, int64_t kc, float *scratch);
const char *cpu_gemm_fill_name(cpu_isa isa, const cpu_gemm_b *b);

#endif
