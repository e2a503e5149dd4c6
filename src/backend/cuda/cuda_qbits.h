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

/* ---- NVFP4 reordered for the register-dequant kernel (v3) ----------------
 * The checkpoint layout (data u8 [N, K/2]: element (n, k) the nibble
 * 4 (k % 2) of byte n K/2 + k/2; scales E4M3 u8 [N, K/16]) is rewritten once
 * at upload into the INT4 atoms above: the data array takes exactly the
 * nibble permutation of CK_INT4R_K / CK_INT4R_N (lane l's 16 bytes of atom
 * (nb, kb), word kc = its B fragments of K chunk 64 kb + 16 kc: register p =
 * 2 ni + j from the even-k nibble at bits 4p and the odd-k one at bits
 * 16 + 4p), CK_NVF4R_BYTES(N, K) = CK_INT4R_BYTES(N, K) bytes; the scales
 * go into a second array of 64-byte scale atoms, same (nb, kb) order: byte
 * g * 8 + 2 kc + ni of atom (nb, kb) = the scale of column 16 nb + 8 ni + g,
 * group 4 kb + kc, so lane (g, t) reads its 8 bytes at g * 8 and the pair of
 * chunk kc (ni = 0 low byte, ni = 1 high) is its 16-bit half kc % 2 of word
 * kc / 2.  Outside [0,K) x [0,N): nibbles and scale bytes 0.
 * Register decode, exactly qdec_nvfp4's arithmetic (cuda_qdecode.cuh) with
 * other bit moves: for the register pair h (p = 2h, 2h + 1: one column half
 * ni = h, j = 0 and 1) CK_NVF4R_SEL(word, h) is the __byte_perm selector
 * whose nibbles 0..3 are the magnitude codes (& 7) of p = 2h even, 2h + 1
 * even, 2h odd, 2h + 1 odd; t = __byte_perm(CK_FP4_T2_LO, CK_FP4_T2_HI, sel)
 * are their 2 |fp4| bytes in that order; CK_NVF4R_REG(t, j) = bf16x2
 * (128 + T_even, 128 + T_odd) of register 2h + j; CK_NVF4R_SIGN(word, p) the
 * two sign bits at bits 15 and 31.  Then as v2: minus CK_BF16X2_128, OR the
 * sign, times the scale / 2 (exact).  Shared by the device reorder, the v3
 * and wgmma kernels and tests/unit/test_cuda_quant.c. */
#define CK_NVF4R_BYTES(N, K) CK_INT4R_BYTES(N, K)
#define CK_NVF4R_SC_ATOM_BYTES 64
#define CK_NVF4R_SC_BYTES(N, K) ((((N) + 15) / 16) * (((K) + 63) / 64) * CK_NVF4R_SC_ATOM_BYTES)
#define CK_NVF4R_SC_ATOM_OFF(nb, kb, K64) (((nb) * (K64) + (kb)) * CK_NVF4R_SC_ATOM_BYTES)
/* byte b of the reordered scales: its column and its 16-group (K / 16 index) */
#define CK_NVF4R_SC_N(b, K64) (((b) / 64 / (K64)) * 16 + (((b) % 2) * 8) + ((b) % 64) / 8)
#define CK_NVF4R_SC_G(b, K64) (((b) / 64 % (K64)) * 4 + ((b) % 8) / 2)
#define CK_NVF4R_SEL(word, h) ((((word) >> (8 * (h))) & 0x77u) | (((word) >> (8 + 8 * (h))) & 0x7700u))
#define CK_NVF4R_REG(t, j) ((((t) >> (8 * (j))) & 0x00FF00FFu) | CK_BF16X2_128)
#define CK_NVF4R_SIGN(word, p) (((word) << (12 - 4 * (p))) & 0x80008000u)

#endif
