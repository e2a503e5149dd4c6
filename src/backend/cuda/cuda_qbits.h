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

#endif
