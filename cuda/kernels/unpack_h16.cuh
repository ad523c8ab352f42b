// A quantised 32-weight chunk decoded straight to the f16 pairs a tensor-core tile stages
// (gemm.cu's shared-memory tiles, gemm_h.cu's f16 copy of a matrix).
#pragma once
#include "quant.cuh"
#include "tc.cuh"

// One 32-weight chunk as 16 f16 pairs for the tile: the type's exact decode (quant.cuh's
// chunk_unpack) rounded to f16. Compressed-tensors chunks take a shorter path to the same
// values: chunk_unpack's form at session 36's start (a dtype test per weight, round_bf16's
// early return a branch per weight, an int-to-float and up to four float/half conversions a
// weight) gave gemm_gate_up_ct8 1.56x the SASS instructions of gemm_gate_up_q4_K (3,680 with
// 197 BSSY against 2,360; now 2,368), and XS 2.1 W8A8 pp4096 rose 29% with this path
// (BENCHMARKS.md, session 36). Here the signed code q sits in an f32 as 2^23 + q + b (one byte
// permute or mask: CT8's byte with its sign bit flipped, b = 128; CT4's nibble, b = 8), one
// subtraction of 2^23 + b + z gives q - z exactly, and the product with the scale is exact
// too (at most 8 + 11 significant bits); then the scale dtype's rounding —
// cvt.rn.bf16x2 for bf16 (round_bf16 for finite and infinite values), f16's by the pack
// itself — and the pack to f16 as before. The same bits as chunk_unpack + pack (a NaN may
// carry another payload).
template <int T>
__device__ __forceinline__ void chunk_unpack_h16(const ChunkRaw<T>& r, u32 h[16]) {
    if constexpr (T == WT_CT4 || T == WT_CT8) {
        u32 hd = r.w[0];
        unsigned short sb = (unsigned short)(hd & 0xFFFF);
        bool bf = (hd >> 24) == WT_BF16;
        float s = bf ? bf16_to_f32(sb) : f16_to_f32(sb);
        float z = (float)(signed char)((hd >> 16) & 0xFF);
        float off = __fadd_rn(T == WT_CT8 ? 8388736.0f : 8388616.0f, z);  // 2^23 + 128 / 8, + z
        float y[32];
        #pragma unroll
        for (int i = 0; i < 32; i++) {
            u32 m = T == WT_CT8 ? __byte_perm(r.w[1 + i / 4] ^ 0x80808080u, 0x4B000000u, 0x7540u | (i % 4))
                                : ((r.w[1 + i / 8] >> (4 * (i % 8))) & 0xFu) | 0x4B000000u;
            y[i] = __fmul_rn(__fsub_rn(__uint_as_float(m), off), s);
        }
        if (bf) {
            #pragma unroll
            for (int j = 0; j < 16; j++) {
                u32 b = cvt_bf16x2(y[2 * j], y[2 * j + 1]);
                h[j] = pack_f16x2(__uint_as_float(b << 16), __uint_as_float(b & 0xFFFF0000u));
            }
        } else {
            #pragma unroll
            for (int j = 0; j < 16; j++) h[j] = pack_f16x2(y[2 * j], y[2 * j + 1]);
        }
    } else if constexpr (T == WT_Q8_0) {
        // d * q is exact in f32 and rounded once, by the pack: one f16 multiply (mul.rn.f16x2)
        // of d by q, which f16 holds exactly, rounds the same. q as 1024 + (q + 128) in f16 (the
        // byte with its sign bit flipped under exponent 10: a byte permute per pair), less
        // 1152. No conversion instruction at all: XS 2.1 Q8_0 pp512 / pp4096 +1.4% / +1.3%
        // (H200, session 36). The same trick as a general int-to-float (2^23 added to the
        // bits, then subtracted) in place of I2F for IQ4_XS, IQ3_XXS, Q5_K measured slower
        // (XS 2.1 IQ4_XS pp512 -3.7%): the conversion pipe is not their limit, the extra
        // instruction is.
        __half2 d2 = __half2half2(__ushort_as_half(r.d));
        __half2 bias = __half2half2(__ushort_as_half((unsigned short)0x6480));  // 1152
        #pragma unroll
        for (int k = 0; k < 8; k++) {
            u32 x = __funnelshift_r(r.win[k], r.win[k + 1], r.sh) ^ 0x80808080u;
            u32 p[2] = {__byte_perm(x, 0x64646464u, 0x5140), __byte_perm(x, 0x64646464u, 0x5342)};
            #pragma unroll
            for (int e = 0; e < 2; e++) {
                __half2 t = __hsub2(*(__half2*)&p[e], bias);
                __half2 y = __hmul2(t, d2);
                h[2 * k + e] = *(u32*)&y;
            }
        }
    } else {
        float w[32];
        chunk_unpack<T>(r, w);
        #pragma unroll
        for (int j = 0; j < 16; j++) h[j] = pack_f16x2(w[2 * j], w[2 * j + 1]);
    }
}
