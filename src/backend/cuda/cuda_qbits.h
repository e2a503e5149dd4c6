/* cuda_qbits.h — bit-level decodes shared by the packed-weight kernels of
 * cuda_qgemm.cu and their host-side checks (tests/unit/test_cuda_quant.c).
 * Plain C macros: no CUDA headers needed. */
#ifndef CLEF_CUDA_QBITS_H
#define CLEF_CUDA_QBITS_H

/* Two FP4 E2M1 values in one byte b (low nibble = first) -> bf16x2 (first
 * in the low half) with normal numbers and exact steps only (no subnormal):
 *   T = 2 * |fp4| is the integer 0, 1, 2, 3, 4, 6, 8, 12 of the magnitude
 *       code m = nibble & 7: a byte table in two words (CK_FP4_T2_LO: codes
 *       0..3, CK_FP4_T2_HI: 4..7) indexed by __byte_perm with selector
 *       CK_FP4X2_PRMT_SEL(b) (code of the first value in selector nibble 0,
 *       of the second in nibble 2; the other result bytes are masked off);
 *   bf16 0x43TT = 128 + T exactly (as the INT4 decode), minus bf16 128
 *       (CK_BF16X2_128) = T exactly; OR the sign bits CK_FP4X2_SIGN(b);
 *   times the FP8 scale / 2 (exact in bf16): fp4 * scale, exact (<= 6
 *       significant bits), and -0 for the code 8 as the v1 table.
 * Shared with tests/unit/test_cuda_quant.c, which replays it on all 256
 * bytes and every E4M3 scale on the host. */
#define CK_FP4_T2_LO 0x03020100u
#define CK_FP4_T2_HI 0x0C080604u
#define CK_FP4X2_PRMT_SEL(b) (((b) & 7u) | (((b) & 0x70u) << 4))
#define CK_FP4X2_SIGN(b) ((((b) & 8u) << 12) | (((b) & 0x80u) << 24))
#define CK_BF16X2_128 0x43004300u

/* ---- INT4 (auto_gptq) reordered for the register-dequant kernel (v3) ----
 * The GPTQ layout q u32 [K/8, N] (row k of column n at bits 4 (k % 8) of word
 * [k / 8, n]) is rewritten once at upload into ATOMS of 16 columns x 64 K
 * (512 bytes): atom (nb, kb) = columns 16 nb .. 16 nb + 15, K 64 kb ..
 * 64 kb + 63, stored at byte CK_INT4R_ATOM_OFF(nb, kb, K64), nb-major.  Lane l
 * (g = l / 4, t = l % 4) of the warp that multiplies the atom reads the 16
 * bytes at l * 16 of it: word kc (0..3) holds everything the lane needs for
 * the K chunk 64 kb + 16 kc .. +15, i.e. its mma.m16n8k16 B fragments of the
 * two 8-column halves ni = 0, 1 of the atom:
 *   b0 = {B[k = 2t, 2t+1][n = g]},  b1 = {B[k = 2t+8, 2t+9][n = g]},
 * as four bf16x2 registers p = 2 ni + j (j = 0: b0, 1: b1): the nibble of the
 * even k at bits 4p, of the odd k at bits 16 + 4p.  So register p is
 * ((word >> 4p) & 0x000F000F) | 0x43004300 = bf16x2 (128 + q_even, 128 + q_odd)
 * exactly, minus bf16x2 (128 + zero) = the codes (q - zero), exact (as v2).
 * Nibble slot s (0..7, bits 4s) of word w (u32 index in the reordered array):
 * CK_INT4R_K / CK_INT4R_N give its source (k, n); outside [0,K) x [0,N) the
 * nibble is 0 (padding: N16 = ceil(N/16) atoms across, K64 = ceil(K/64) down).
 * Shared by the device reorder (cuda_qgemm.cu), the v3 kernel and the host
 * checks of tests/unit/test_cuda_quant.c. */
#define CK_INT4R_ATOM_BYTES 512
#define CK_INT4R_BYTES(N, K) ((((N) + 15) / 16) * (((K) + 63) / 64) * CK_INT4R_ATOM_BYTES)
#define CK_INT4R_ATOM_OFF(nb, kb, K64) (((nb) * (K64) + (kb)) * CK_INT4R_ATOM_BYTES)
/* word w: atom w / 128, lane (w % 128) / 4, chunk kc = w % 4; slot s: p = s % 4 (ni = p / 2, j = p % 2),
 * half = s / 4 (k odd) */
#define CK_INT4R_K(w, s, K64) \
    (((w) / 128 % (K64)) * 64 + ((w) % 4) * 16 + (((s) & 3) & 1) * 8 + 2 * (((w) % 128 / 4) & 3) + ((s) >> 2))
#define CK_INT4R_N(w, s, K64) (((w) / 128 / (K64)) * 16 + (((s) & 3) >> 1) * 8 + ((w) % 128 / 4) / 4)
/* bf16x2 register p of a reordered word, before the zero is subtracted: (128 + q_even, 128 + q_odd) */
#define CK_INT4R_REG(word, p) ((((word) >> (4 * (p))) & 0x000F000Fu) | 0x43004300u)

#endif
