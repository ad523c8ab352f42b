// Decoding of one 32-element chunk of a weight row (chunk c = elements 32c .. 32c + 32), per
// weight type. The arithmetic is the reference decoder's (lagoon_core::quant), in the same
// f32 order, with explicit round-to-nearest multiplies so that no FMA contraction changes a
// dequantised value: the decoded weights are bit-identical to the CPU's.
#pragma once
#include "common.cuh"

// ggml get_scale_min_k4 (core/src/quant/mod.rs): the 6-bit scale and min of sub-block j.
__device__ __forceinline__ void scale_min_k4(int j, const u8* s, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// 32 bytes at a 2-byte-aligned address, as 8 little-endian words: the covering window of
// nine aligned words is read and shifted (a shift of 0 returns the low word). Reads up to 4
// bytes past p + 32 (inside the block for every caller but Q8_0, whose last block is
// followed by the weight buffer's slack).
__device__ __forceinline__ void load32_a2(const u8* p, u32 out[8]) {
    const u32* w = (const u32*)((size_t)p & ~(size_t)3);
    u32 sh = 8u * (u32)((size_t)p & 3);
    u32 win[9];
    #pragma unroll
    for (int k = 0; k < 9; k++) win[k] = w[k];
    #pragma unroll
    for (int k = 0; k < 8; k++) out[k] = __funnelshift_r(win[k], win[k + 1], sh);
}

__device__ __forceinline__ u32 byte_of(const u32 v[8], int i) { return (v[i >> 2] >> (8 * (i & 3))) & 0xFF; }

// Decodes chunk c of `row` (a row of `cols` elements of type T) into w[0..32). Float types
// zero-fill past `cols`; block types always have whole chunks. Loads are as wide as the
// layout's alignment allows (rows start 256-byte aligned on the device).
template <int T>
__device__ __forceinline__ void decode_chunk(const u8* __restrict__ row, int c, int cols, float w[32]) {
    if (T == WT_F32) {
        const float* r = (const float*)row + 32 * c;
        if (32 * c + 32 <= cols && ((size_t)r & 15) == 0) {
            #pragma unroll
            for (int j = 0; j < 32; j += 4) {
                float4 v = *(const float4*)(r + j);
                w[j] = v.x; w[j + 1] = v.y; w[j + 2] = v.z; w[j + 3] = v.w;
            }
        } else {
            #pragma unroll
            for (int j = 0; j < 32; j++) w[j] = 32 * c + j < cols ? r[j] : 0.0f;
        }
    } else if (T == WT_F16 || T == WT_BF16) {
        const unsigned short* r = (const unsigned short*)row + 32 * c;
        if (32 * c + 32 <= cols && ((size_t)r & 15) == 0) {
            #pragma unroll
            for (int j = 0; j < 32; j += 8) {
                uint4 v = *(const uint4*)(r + j);
                u32 q[4] = {v.x, v.y, v.z, v.w};
                #pragma unroll
                for (int i = 0; i < 4; i++) {
                    unsigned short lo = q[i] & 0xFFFF, hi = q[i] >> 16;
                    w[j + 2 * i] = T == WT_F16 ? f16_to_f32(lo) : bf16_to_f32(lo);
                    w[j + 2 * i + 1] = T == WT_F16 ? f16_to_f32(hi) : bf16_to_f32(hi);
                }
            }
        } else {
            #pragma unroll
            for (int j = 0; j < 32; j++)
                w[j] = 32 * c + j < cols ? (T == WT_F16 ? f16_to_f32(r[j]) : bf16_to_f32(r[j])) : 0.0f;
        }
    } else if (T == WT_Q8_0) {
        // y[j] = d * qs[j]
        const block_q8_0* b = (const block_q8_0*)row + c;
        float d = f16_to_f32(b->d);
        u32 q[8];
        load32_a2((const u8*)b->qs, q);
        #pragma unroll
        for (int j = 0; j < 32; j++) w[j] = __fmul_rn(d, (float)(signed char)byte_of(q, j));
    } else if (T == WT_Q4_K) {
        // Sub-block j = c % 8 of super-block c / 8: nibble (j & 1) of qs[32 (j / 2) + l],
        // y = (d * sc) * q - dmin * m. Blocks are 144 B, so qs (at +16) is 16-byte aligned.
        const block_q4_K* b = (const block_q4_K*)row + c / 8;
        int j = c % 8, sc, m;
        scale_min_k4(j, b->scales, &sc, &m);
        float d1 = __fmul_rn(f16_to_f32(b->d), (float)sc);
        float m1 = __fmul_rn(f16_to_f32(b->dmin), (float)m);
        const uint4* q4 = (const uint4*)(b->qs + 32 * (j / 2));
        uint4 lo = q4[0], hi = q4[1];
        u32 q[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        int shift = 4 * (j & 1);
        #pragma unroll
        for (int l = 0; l < 32; l++)
            w[l] = __fsub_rn(__fmul_rn(d1, (float)((byte_of(q, l) >> shift) & 0xF)), m1);
    } else if (T == WT_Q6_K) {
        // Elements i = 32 j + l of super-block c / 8 (j = c % 8): half n = j / 4, group
        // g = j % 4; low 4 bits from ql[64 n + l + 32 (g & 1)] (high nibble for g >= 2),
        // high 2 bits (qh[32 n + l] >> 2 g) & 3; y = d * scales[i / 16] * (q - 32).
        const block_q6_K* b = (const block_q6_K*)row + c / 8;
        int j = c % 8, n = j / 4, g = j % 4;
        float d = f16_to_f32(b->d);
        u32 ql[8], qh[8];
        load32_a2(b->ql + 64 * n + 32 * (g & 1), ql);
        load32_a2(b->qh + 32 * n, qh);
        float ds0 = __fmul_rn(d, (float)b->scales[2 * j]);
        float ds1 = __fmul_rn(d, (float)b->scales[2 * j + 1]);
        #pragma unroll
        for (int l = 0; l < 32; l++) {
            u32 lb = byte_of(ql, l);
            int low4 = g < 2 ? (lb & 0xF) : (lb >> 4);
            int high2 = (byte_of(qh, l) >> (2 * g)) & 3;
            int q = (low4 | (high2 << 4)) - 32;
            w[l] = __fmul_rn(l < 16 ? ds0 : ds1, (float)q);
        }
    }
}

// sum_j w[j] * x[j] over one chunk (kmax = 32 unless the row ends inside it), in j order.
__device__ __forceinline__ float dot_chunk(const float w[32], const float* __restrict__ x, int kmax) {
    float s = 0.0f;
    if (kmax == 32 && ((size_t)x & 15) == 0) {
        #pragma unroll
        for (int j = 0; j < 32; j += 4) {
            float4 v = *(const float4*)(x + j);
            s += w[j] * v.x;
            s += w[j + 1] * v.y;
            s += w[j + 2] * v.z;
            s += w[j + 3] * v.w;
        }
    } else {
        for (int j = 0; j < kmax; j++) s += w[j] * x[j];
    }
    return s;
}
