/* cuda_qbits.h — bit-level decodes shared by the packed-weight kernels of
 * cuda_qgemm.cu and their host-side checks (tests/unit/test_cuda_quant.c).
 * Plain C macros: no CUDA headers needed. */
#ifndef CLEF_CUDA_QBITS_H
#define CLEF_CUDA_QBITS_H

/* Two FP4 E2M1 values in one byte b (low nibble = first) -> the bits of a
 * bf16x2 (first in the low half) whose values times 2^126 are exactly the two
 * FP4 values: nibble s e1 e0 m lands at bf16 bit 15 (sign) and bits 8..6
 * (exponent LSBs + mantissa MSB), so e > 0 gives 2^(e-127) * (1 + m/2) and
 * e = 0 the bf16 subnormal m * 2^-127; the kernel multiplies by 2^126
 * (bf16 0x7E80), exactly.  Shared with tests/unit/test_cuda_quant.c, which
 * checks all 256 bytes on the host. */
#define CK_FP4X2_BF16_BITS(b) \
    ((((b) & 7u) << 6) | (((b) & 8u) << 12) | (((b) & 0x70u) << 18) | (((b) & 0x80u) << 24))
#define CK_BF16_2POW126 0x7E80u

#endif
