/* cuda_qdecode.cuh — register decodes of packed weight units to exact bf16
 * codes, shared by the packed-weight kernels (cuda_qgemm.cu: qgemm2/qgemm3;
 * cuda_wgmma.cu: the packed wgmma variant), so that every kernel feeds the
 * tensor cores bitwise the same weight values.  A unit is 16 consecutive K
 * values of one weight row; the decode gives 8 bf16x2 words, word j = the
 * values (2j, 2j + 1), first in the low half.  Device code only. */
#ifndef CLEF_BACKEND_CUDA_QDECODE_CUH
#define CLEF_BACKEND_CUDA_QDECODE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_qbits.h"

/* bf16x2 <-> its bits. */
static __device__ __forceinline__ __nv_bfloat162 bf2(uint32_t u) { return *reinterpret_cast<__nv_bfloat162 *>(&u); }
static __device__ __forceinline__ uint32_t u32_of(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t *>(&v); }

/* NVFP4: 8 bytes d of FP4 E2M1 pairs (low nibble first) with the E4M3 scale
 * byte sb of their 16-group -> fp4 * scale, exact (cuda_qbits.h). */
static __device__ __forceinline__ void qdec_nvfp4(uint2 d, uint32_t sb, uint32_t (&outw)[8]) {
    const __half2 sh = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(sb | (sb << 8)), __NV_E4M3);
    const float2 sf = __half22float2(sh);
    const __nv_bfloat162 sh2 = __floats2bfloat162_rn(0.5f * sf.x, 0.5f * sf.y); /* scale / 2: exact */
    const __nv_bfloat162 c128 = bf2(CK_BF16X2_128);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const uint32_t byte = ((j < 4 ? d.x : d.y) >> (8 * (j & 3))) & 0xFFu;
        const uint32_t t2 = __byte_perm(CK_FP4_T2_LO, CK_FP4_T2_HI, CK_FP4X2_PRMT_SEL(byte));
        const uint32_t mag = u32_of(__hsub2(bf2((t2 & 0x00FF00FFu) | CK_BF16X2_128), c128));
        outw[j] = u32_of(__hmul2(bf2(mag | CK_FP4X2_SIGN(byte)), sh2));
    }
}

/* FP8 E4M3: 16 bytes -> their values (exact in bf16). */
static __device__ __forceinline__ void qdec_fp8(uint4 d, uint32_t (&outw)[8]) {
    const uint32_t w4[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const uint32_t pair = (w4[j >> 1] >> (16 * (j & 1))) & 0xFFFFu;
        const float2 f = __half22float2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)pair, __NV_E4M3));
        outw[j] = pack_bf16(f.x, f.y);
    }
}

/* INT4 (GPTQ words of one column: d.x = K 0..7, d.y = K 8..15, nibble k at
 * bits 4 (k % 8)) with zero z (1..16 asymmetric, 8 symmetric) -> q - z,
 * exact: (128 + q) - (128 + z) in bf16. */
static __device__ __forceinline__ void qdec_int4(uint2 d, int z, uint32_t (&outw)[8]) {
    const __nv_bfloat162 zz = __floats2bfloat162_rn(128.0f + (float)z, 128.0f + (float)z);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const uint32_t t = (j < 4 ? d.x : d.y) >> (8 * (j & 3));
        const uint32_t p = (t & 0xFu) | ((t & 0xF0u) << 12) | 0x43004300u;
        outw[j] = u32_of(__hsub2(bf2(p), zz));
    }
}

/* INT4 reordered (cuda_qbits.h, kernel v3): bf16x2 (128 + zero) of a zero
 * nibble (asymmetric: nibble + 1) or the symmetric 8. */
static __device__ __forceinline__ uint32_t qdec_int4r_zero(int has_zeros, uint32_t nibble) {
    if (!has_zeros) return 0x43084308u; /* 136 = 128 + 8 */
    const uint32_t z = 128u + nibble + 1u; /* 129..144, exact in bf16 */
    return u32_of(__floats2bfloat162_rn((float)z, (float)z));
}
/* CK_INT4R_REG's (v & 0x000F000F) | 0x43004300 as one lop3 (the compiler emits an AND and an OR for the
 * two constants; lop3 takes one from a register). */
static __device__ __forceinline__ uint32_t int4r_bits(uint32_t v) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(v), "n"(0x000F000F), "n"(0x43004300));
    return d;
}
/* Register p of a reordered word minus the bf16x2 (128 + zero): (q - zero) x 2, exact. */
static __device__ __forceinline__ uint32_t qdec_int4r(uint32_t word, int p, uint32_t zz) {
    return u32_of(__hsub2(bf2(int4r_bits(word >> (4 * p))), bf2(zz)));
}

/* NVFP4 reordered (cuda_qbits.h, kernel v3): the scale pair of a chunk (low
 * byte: column half ni = 0, high: ni = 1) -> bf16x2 (scale / 2, scale / 2)
 * of each half, the conversion of qdec_nvfp4 (E4M3 -> f16 -> f32, times 0.5,
 * -> bf16: exact). */
static __device__ __forceinline__ void qdec_nvf4r_scales(uint32_t pair, uint32_t (&sh)[2]) {
    const float2 sf = __half22float2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(pair & 0xFFFFu), __NV_E4M3));
    const __nv_bfloat16 s0 = __float2bfloat16_rn(0.5f * sf.x), s1 = __float2bfloat16_rn(0.5f * sf.y);
    sh[0] = u32_of(__halves2bfloat162(s0, s0));
    sh[1] = u32_of(__halves2bfloat162(s1, s1));
}
/* The 4 registers of one reordered word (p = 2 ni + j) -> fp4 * scale, exact:
 * qdec_nvfp4's steps (128 + T, minus 128, OR the sign, times scale / 2). */
static __device__ __forceinline__ void qdec_nvf4r(uint32_t word, const uint32_t (&sh)[2], uint32_t (&out)[4]) {
    const __nv_bfloat162 c128 = bf2(CK_BF16X2_128);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint32_t t = __byte_perm(CK_FP4_T2_LO, CK_FP4_T2_HI, CK_NVF4R_SEL(word, h));
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const uint32_t mag = u32_of(__hsub2(bf2(CK_NVF4R_REG(t, j)), c128));
            out[2 * h + j] = u32_of(__hmul2(bf2(mag | CK_NVF4R_SIGN(word, 2 * h + j)), bf2(sh[h])));
        }
    }
}

/* NVFP4 reordered, kernel v5's form: every value scaled by 2^-9 (v5 multiplies its f32 sums by 2^9: the
 * same bits as qdec_nvf4r's sums unless a product falls below 2^-117, every product and partial sum
 * scaled by one power of two), so one bf16x2 multiply per register decodes it.  The E2M1 magnitude bits
 * (e1 e0 m) of a nibble set as bf16 bits 8..6 (the exponent's two low bits and the top mantissa bit), the
 * sign as bit 15, read as fp4 x 2^-126 for every code (code 1, 0.5, is the subnormal 2^-127: the two formats' subnormal steps
 * line up); times bf16 (scale x 2^117) (qdec_nvf4r9_scales) that is fp4 x scale x 2^-9 exactly (at most
 * 6 significant bits, within 2^-19 .. 2^12).  Register p = 2 ni + j of a word holds nibbles p and p + 4
 * (CK_NVF4R_SEL's order); sh[ni] the scale of its column half. */
static __device__ __forceinline__ void qdec_nvf4r9(uint32_t word, const uint32_t (&sh)[2], uint32_t (&out)[4]) {
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const uint32_t mag = (p < 2 ? word << (6 - 4 * p) : word >> (4 * p - 6)) & 0x01C001C0u;
        uint32_t bits; /* mag | (sign bits 3 + 4p, 19 + 4p moved to 15, 31) */
        asm("lop3.b32 %0, %1, %2, %3, 0xF8;\n" : "=r"(bits) : "r"(mag), "r"(word << (12 - 4 * p)), "n"(0x80008000));
        out[p] = u32_of(__hmul2(bf2(bits), bf2(sh[p >> 1])));
    }
}
/* The scale pair of a chunk (qdec_nvf4r_scales' pair) -> bf16x2 (scale x 2^117, scale x 2^117) of each
 * half: E4M3 -> f16 -> f32 exactly, times 2^117 exactly (<= 448 x 2^117 < 2^126), -> bf16 exactly. */
static __device__ __forceinline__ void qdec_nvf4r9_scales(uint32_t pair, uint32_t (&sh)[2]) {
    const float2 sf = __half22float2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(pair & 0xFFFFu), __NV_E4M3));
    const float s0 = __fmul_rn(sf.x, 0x1p117f), s1 = __fmul_rn(sf.y, 0x1p117f);
    sh[0] = u32_of(__floats2bfloat162_rn(s0, s0));
    sh[1] = u32_of(__floats2bfloat162_rn(s1, s1));
}

#endif
