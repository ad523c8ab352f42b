// Decoding of one 32-element chunk of a weight row (chunk c = elements 32c .. 32c + 32), per
// weight type. The arithmetic is the reference decoder's (lagoon_core::quant), in the same
// f32 order, with explicit round-to-nearest multiplies so that no FMA contraction changes a
// dequantised value: the decoded weights are bit-identical to the CPU's.
#pragma once
#include "common.cuh"
#include "iq_grids.cuh"

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

__device__ __forceinline__ u32 byte_of(const u32 v[8], int i) { return (v[i >> 2] >> (8 * (i & 3))) & 0xFF; }

// ---- Two-phase chunk decoding ----
//
// chunk_fetch<T> issues the loads chunk c of a row needs into registers and chunk_unpack<T>
// computes from them the 32 dequantised values, so a pipelined loop (gemm.cu) can have one
// chunk's loads in flight while it works on the previous one. For the block types
// decode_chunk is exactly fetch + unpack. Float types here take whole, 16-byte-aligned
// chunks only (rows of a multiple of 32 elements: every matrix the tensor-core kernels see).
template <int T> struct ChunkRaw;
template <> struct ChunkRaw<WT_F32> { uint4 v[8]; };
template <> struct ChunkRaw<WT_F16> { uint4 v[4]; };
template <> struct ChunkRaw<WT_BF16> { uint4 v[4]; };
// Q8_0: d and the nine aligned words covering the 32 quants.
template <> struct ChunkRaw<WT_Q8_0> { u32 win[9]; u32 sh; unsigned short d; };
// Q4_K: the 16-byte header (d, dmin, scales[12]) and the 32 bytes of packed nibbles.
template <> struct ChunkRaw<WT_Q4_K> { uint4 hd, lo, hi; int j; };
// Q6_K: the windows of ql and qh, the two 8-bit scales and d.
template <> struct ChunkRaw<WT_Q6_K> { u32 ql[9], qh[9]; u32 shl, shh; int s0, s1; unsigned short d; int j; };
// CT4: the block's five words (header, then the 16 code bytes).
template <> struct ChunkRaw<WT_CT4> { u32 w[5]; };
// CT8: the block's nine words (header, then the 32 code bytes).
template <> struct ChunkRaw<WT_CT8> { u32 w[9]; };
// Q5_K: the 16-byte header, all 32 bytes of fifth bits, the 32 bytes of packed nibbles.
template <> struct ChunkRaw<WT_Q5_K> { uint4 hd, h0, h1, lo, hi; int j; };
// IQ4_XS: the 8-byte header (d, scales_h, scales_l) and the sub-block's 16 index bytes.
template <> struct ChunkRaw<WT_IQ4_XS> { uint2 hd, q0, q1; int j; };
// The grid IQ types (2-byte-aligned blocks, so 16-bit loads): d and the sub-block's bytes.
// IQ3_XXS (98 B): 8 grid indices, then the sub-block's word of four 7-bit sign indices and a
// 4-bit scale. IQ2_XXS (66 B): the sub-block's 8 bytes (4 grid indices, then that word).
// IQ2_S (82 B): 4 low index bytes, 4 sign bytes, and the qh and scale bytes (hs: qh | sc << 8).
template <> struct ChunkRaw<WT_IQ3_XXS> { u32 q0, q1, a; unsigned short d; };
template <> struct ChunkRaw<WT_IQ2_XXS> { u32 q, a; unsigned short d; };
template <> struct ChunkRaw<WT_IQ2_S> { u32 q, s, hs; unsigned short d; };

// Four bytes at a 2-byte-aligned address as one little-endian word.
__device__ __forceinline__ u32 ld_u32_a2(const u8* p) {
    const unsigned short* h = (const unsigned short*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}

// One 8-weight run of a grid IQ type (lagoon_core::quant::iq2 iq2_run / iq3 iq3_run):
// y[j] = (db * magnitude byte j) * (sign bit j ? -1 : 1), the magnitudes being the grid
// point's bytes (lo: bytes 0-3, hi: bytes 4-7).
__device__ __forceinline__ void grid_run(float db, u32 lo, u32 hi, u32 signs, float* y) {
    #pragma unroll
    for (int j = 0; j < 8; j++) {
        u32 g = ((j < 4 ? lo : hi) >> (8 * (j & 3))) & 0xFF;
        float v = __fmul_rn(db, (float)g);
        y[j] = (signs >> j) & 1 ? -v : v;
    }
}

// kvalues_iq4nl (core/src/quant/tables/kvalues.rs) as four little-endian words of int8.
#define IQ4NL_W0 0xBFAD9881u  // -127 -104 -83 -65
#define IQ4NL_W1 0xF6EADDCFu  // -49 -35 -22 -10
#define IQ4NL_W2 0x26190D01u  // 1 13 25 38
#define IQ4NL_W3 0x71594535u  // 53 69 89 113

// kvalues_iq4nl[q] for q in 0..16 (two byte permutes and a select).
__device__ __forceinline__ int iq4nl_value(u32 q) {
    u32 lo = __byte_perm(IQ4NL_W0, IQ4NL_W1, q & 7), hi = __byte_perm(IQ4NL_W2, IQ4NL_W3, q & 7);
    return (int)(signed char)((q & 8 ? hi : lo) & 0xFF);
}

// x rounded to bf16 (round to nearest even, as half::bf16::from_f32 for finite values) and
// back.
// A select, not an early return for NaN: the early return was a branch per weight in the CT
// decoders (BSSY/BSYNC pairs in their SASS).
__device__ __forceinline__ float round_bf16(float x) {
    u32 u = __float_as_uint(x);
    u32 r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return (u & 0x7fffffffu) > 0x7f800000u ? x : __uint_as_float(r);
}

// x rounded to f16 and back.
__device__ __forceinline__ float round_f16(float x) { return __half2float(__float2half_rn(x)); }

// The nine aligned words covering 32 bytes at 2-byte-aligned p and the shift that takes the
// 8 little-endian words out of them (__funnelshift_r(win[k], win[k + 1], sh); a shift of 0
// gives the low word). Reads up to 4 bytes past p + 32: inside the block for every caller
// but Q8_0, whose last block is followed by the weight buffer's slack.
__device__ __forceinline__ void window32(const u8* p, u32 win[9], u32* sh) {
    const u32* w = (const u32*)((size_t)p & ~(size_t)3);
    *sh = 8u * (u32)((size_t)p & 3);
    #pragma unroll
    for (int k = 0; k < 9; k++) win[k] = w[k];
}

// Byte i (0..11) of a Q4_K block's scales, from the header words hd.y, hd.z, hd.w.
__device__ __forceinline__ int q4k_scale_byte(uint4 hd, int i) {
    u32 w = i < 4 ? hd.y : i < 8 ? hd.z : hd.w;
    return (int)((w >> (8 * (i & 3))) & 0xFF);
}

// Sub-block j's d·sc and dmin·m from a Q4_K / Q5_K header (d, dmin, scales[12]) held as one
// uint4: scale_min_k4 on the header's scale bytes, then the reference's two products.
__device__ __forceinline__ void k4_sub_scales(const uint4& hd, int j, float* d1, float* m1) {
    int sc, m;
    if (j < 4) {
        sc = q4k_scale_byte(hd, j) & 63;
        m = q4k_scale_byte(hd, j + 4) & 63;
    } else {
        sc = (q4k_scale_byte(hd, j + 4) & 0xF) | ((q4k_scale_byte(hd, j - 4) >> 6) << 4);
        m = (q4k_scale_byte(hd, j + 4) >> 4) | ((q4k_scale_byte(hd, j) >> 6) << 4);
    }
    *d1 = __fmul_rn(f16_to_f32((unsigned short)(hd.x & 0xFFFF)), (float)sc);
    *m1 = __fmul_rn(f16_to_f32((unsigned short)(hd.x >> 16)), (float)m);
}

template <int T>
__device__ __forceinline__ void chunk_fetch(const u8* __restrict__ row, int c, ChunkRaw<T>& r) {
    if constexpr (T == WT_F32) {
        const uint4* p = (const uint4*)(row + 128 * (size_t)c);
        #pragma unroll
        for (int i = 0; i < 8; i++) r.v[i] = p[i];
    } else if constexpr (T == WT_F16 || T == WT_BF16) {
        const uint4* p = (const uint4*)(row + 64 * (size_t)c);
        #pragma unroll
        for (int i = 0; i < 4; i++) r.v[i] = p[i];
    } else if constexpr (T == WT_Q8_0) {
        const u8* b = row + 34 * (size_t)c;
        r.d = *(const unsigned short*)b;
        window32(b + 2, r.win, &r.sh);
    } else if constexpr (T == WT_CT4) {
        const u32* b = (const u32*)(row + 20 * (size_t)c);
        #pragma unroll
        for (int i = 0; i < 5; i++) r.w[i] = b[i];
    } else if constexpr (T == WT_CT8) {
        const u32* b = (const u32*)(row + 36 * (size_t)c);
        #pragma unroll
        for (int i = 0; i < 9; i++) r.w[i] = b[i];
    } else if constexpr (T == WT_Q5_K) {
        const u8* b = row + 176 * (size_t)(c / 8);
        r.j = c % 8;
        const uint4* p = (const uint4*)b;
        r.hd = p[0];
        r.h0 = p[1];
        r.h1 = p[2];
        const uint4* q4 = (const uint4*)(b + 48 + 32 * (r.j / 2));
        r.lo = q4[0];
        r.hi = q4[1];
    } else if constexpr (T == WT_IQ4_XS) {
        const u8* b = row + 136 * (size_t)(c / 8);
        r.j = c % 8;
        r.hd = *(const uint2*)b;
        const uint2* q = (const uint2*)(b + 8 + 16 * r.j);
        r.q0 = q[0];
        r.q1 = q[1];
    } else if constexpr (T == WT_IQ3_XXS) {
        const u8* b = row + 98 * (size_t)(c / 8);
        int ib = c % 8;
        r.d = *(const unsigned short*)b;
        r.q0 = ld_u32_a2(b + 2 + 8 * ib);
        r.q1 = ld_u32_a2(b + 6 + 8 * ib);
        r.a = ld_u32_a2(b + 66 + 4 * ib);
    } else if constexpr (T == WT_IQ2_XXS) {
        const u8* b = row + 66 * (size_t)(c / 8);
        int ib = c % 8;
        r.d = *(const unsigned short*)b;
        r.q = ld_u32_a2(b + 2 + 8 * ib);
        r.a = ld_u32_a2(b + 6 + 8 * ib);
    } else if constexpr (T == WT_IQ2_S) {
        const u8* b = row + 82 * (size_t)(c / 8);
        int ib = c % 8;
        r.d = *(const unsigned short*)b;
        r.q = ld_u32_a2(b + 2 + 4 * ib);
        r.s = ld_u32_a2(b + 34 + 4 * ib);
        r.hs = (u32)b[66 + ib] | ((u32)b[74 + ib] << 8);
    } else if constexpr (T == WT_Q4_K) {
        const u8* b = row + 144 * (size_t)(c / 8);
        r.j = c % 8;
        r.hd = *(const uint4*)b;
        const uint4* q4 = (const uint4*)(b + 16 + 32 * (r.j / 2));
        r.lo = q4[0];
        r.hi = q4[1];
    } else {
        const u8* b = row + 210 * (size_t)(c / 8);
        int j = c % 8, n = j / 4, g = j % 4;
        r.j = j;
        window32(b + 64 * n + 32 * (g & 1), r.ql, &r.shl);
        window32(b + 128 + 32 * n, r.qh, &r.shh);
        r.s0 = (int)(signed char)b[192 + 2 * j];
        r.s1 = (int)(signed char)b[192 + 2 * j + 1];
        r.d = *(const unsigned short*)(b + 208);
    }
}

// The reference decoder's arithmetic (see decode_chunk's comments), from registers.
template <int T>
__device__ __forceinline__ void chunk_unpack(const ChunkRaw<T>& r, float w[32]) {
    if constexpr (T == WT_F32) {
        #pragma unroll
        for (int i = 0; i < 8; i++) {
            w[4 * i] = __uint_as_float(r.v[i].x);
            w[4 * i + 1] = __uint_as_float(r.v[i].y);
            w[4 * i + 2] = __uint_as_float(r.v[i].z);
            w[4 * i + 3] = __uint_as_float(r.v[i].w);
        }
    } else if constexpr (T == WT_F16 || T == WT_BF16) {
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            u32 q[4] = {r.v[i].x, r.v[i].y, r.v[i].z, r.v[i].w};
            #pragma unroll
            for (int k = 0; k < 4; k++) {
                unsigned short lo = q[k] & 0xFFFF, hi = q[k] >> 16;
                w[8 * i + 2 * k] = T == WT_F16 ? f16_to_f32(lo) : bf16_to_f32(lo);
                w[8 * i + 2 * k + 1] = T == WT_F16 ? f16_to_f32(hi) : bf16_to_f32(hi);
            }
        }
    } else if constexpr (T == WT_Q8_0) {
        float d = f16_to_f32(r.d);
        u32 q[8];
        #pragma unroll
        for (int k = 0; k < 8; k++) q[k] = __funnelshift_r(r.win[k], r.win[k + 1], r.sh);
        #pragma unroll
        for (int j = 0; j < 32; j++) w[j] = __fmul_rn(d, (float)(signed char)byte_of(q, j));
    } else if constexpr (T == WT_CT4 || T == WT_CT8) {
        // compressed-tensors' dequantize in the scale dtype: rnd(rnd(q - z) * s), q the signed
        // code (CT4: nibble - 8; CT8: the code byte), from the block's header word (scale
        // bits, zero point, dtype).
        // The inner rounding is left out: q - z is an integer of magnitude at most 255 (eight
        // significant bits), exact in bf16 and f16. The dtype is tested once per chunk, not
        // per weight (it is the matrix's, so every thread of a warp takes the same side).
        u32 h = r.w[0];
        unsigned short sb = (unsigned short)(h & 0xFFFF);
        float z = (float)(signed char)((h >> 16) & 0xFF);
        auto code = [&](int i) {
            return T == WT_CT4 ? (int)((r.w[1 + i / 8] >> (4 * (i % 8))) & 0xF) - 8
                               : (int)(signed char)((r.w[1 + i / 4] >> (8 * (i % 4))) & 0xFF);
        };
        if ((h >> 24) == WT_BF16) {
            float s = bf16_to_f32(sb);
            #pragma unroll
            for (int i = 0; i < 32; i++) w[i] = round_bf16(__fmul_rn(__fsub_rn((float)code(i), z), s));
        } else {
            float s = f16_to_f32(sb);
            #pragma unroll
            for (int i = 0; i < 32; i++) w[i] = round_f16(__fmul_rn(__fsub_rn((float)code(i), z), s));
        }
    } else if constexpr (T == WT_Q5_K) {
        // lagoon_core::quant::q5_k: y = d1 * (nibble | bit << 4) - min1, d1 = d * sc,
        // min1 = dmin * m (no fused multiply-add, as the reference).
        int j = r.j;
        float d1, m1;
        k4_sub_scales(r.hd, j, &d1, &m1);
        u32 q[8] = {r.lo.x, r.lo.y, r.lo.z, r.lo.w, r.hi.x, r.hi.y, r.hi.z, r.hi.w};
        u32 h[8] = {r.h0.x, r.h0.y, r.h0.z, r.h0.w, r.h1.x, r.h1.y, r.h1.z, r.h1.w};
        int shift = 4 * (j & 1);
        #pragma unroll
        for (int l = 0; l < 32; l++) {
            u32 v = ((byte_of(q, l) >> shift) & 0xF) | (((byte_of(h, l) >> j) & 1) << 4);
            w[l] = __fsub_rn(__fmul_rn(d1, (float)v), m1);
        }
    } else if constexpr (T == WT_IQ4_XS) {
        // lagoon_core::quant::iq4: dl = d * (ls - 32), y = dl * kvalues[q].
        int ib = r.j;
        u32 sl = (r.hd.y >> (8 * (ib / 2))) & 0xFF;
        u32 low4 = (sl >> (4 * (ib % 2))) & 0xF;
        u32 high2 = ((r.hd.x >> 16) >> (2 * ib)) & 3;
        float dl = __fmul_rn(f16_to_f32((unsigned short)(r.hd.x & 0xFFFF)), (float)((int)(low4 | (high2 << 4)) - 32));
        u32 q[4] = {r.q0.x, r.q0.y, r.q1.x, r.q1.y};
        #pragma unroll
        for (int l = 0; l < 16; l++) {
            u32 b = (q[l >> 2] >> (8 * (l & 3))) & 0xFF;
            w[l] = __fmul_rn(dl, (float)iq4nl_value(b & 0xF));
            w[l + 16] = __fmul_rn(dl, (float)iq4nl_value(b >> 4));
        }
    } else if constexpr (T == WT_IQ3_XXS) {
        // lagoon_core::quant::iq3: db = d * (0.5 + (a >> 28)) * 0.5; run l takes sign
        // pattern ksigns[(a >> 7 l) & 127] and grid points qs[2 l], qs[2 l + 1].
        float db = __fmul_rn(__fmul_rn(f16_to_f32(r.d), __fadd_rn(0.5f, (float)(r.a >> 28))), 0.5f);
        u32 q[2] = {r.q0, r.q1};
        #pragma unroll
        for (int l = 0; l < 4; l++) {
            u32 signs = __ldg(&ksigns_iq2xs[(r.a >> (7 * l)) & 127]);
            u32 i0 = (q[l / 2] >> (16 * (l & 1))) & 0xFF, i1 = (q[l / 2] >> (16 * (l & 1) + 8)) & 0xFF;
            grid_run(db, __ldg(&iq3xxs_grid[i0]), __ldg(&iq3xxs_grid[i1]), signs, w + 8 * l);
        }
    } else if constexpr (T == WT_IQ2_XXS) {
        // lagoon_core::quant::iq2: db = d * (0.5 + (a >> 28)) * 0.25; run l takes sign
        // pattern ksigns[(a >> 7 l) & 127] and grid point qs[l].
        float db = __fmul_rn(__fmul_rn(f16_to_f32(r.d), __fadd_rn(0.5f, (float)(r.a >> 28))), 0.25f);
        #pragma unroll
        for (int l = 0; l < 4; l++) {
            u32 signs = __ldg(&ksigns_iq2xs[(r.a >> (7 * l)) & 127]);
            unsigned long long p = __ldg(&iq2xxs_grid[(r.q >> (8 * l)) & 0xFF]);
            grid_run(db, (u32)p, (u32)(p >> 32), signs, w + 8 * l);
        }
    } else if constexpr (T == WT_IQ2_S) {
        // lagoon_core::quant::iq2: runs 0-1 of the sub-block scale by its low nibble, 2-3 by
        // its high one, db = d * (0.5 + s) * 0.25; the grid index is qs[r] with two high bits
        // from qh, the signs a whole byte per run.
        float d = f16_to_f32(r.d);
        u32 qh = r.hs & 0xFF, sc = r.hs >> 8;
        #pragma unroll
        for (int l = 0; l < 4; l++) {
            u32 s = l < 2 ? (sc & 0xF) : (sc >> 4);
            float db = __fmul_rn(__fmul_rn(d, __fadd_rn(0.5f, (float)s)), 0.25f);
            u32 idx = ((r.q >> (8 * l)) & 0xFF) | (((qh >> (2 * l)) & 3) << 8);
            unsigned long long p = __ldg(&iq2s_grid[idx]);
            grid_run(db, (u32)p, (u32)(p >> 32), (r.s >> (8 * l)) & 0xFF, w + 8 * l);
        }
    } else if constexpr (T == WT_Q4_K) {
        int j = r.j;
        float d1, m1;
        k4_sub_scales(r.hd, j, &d1, &m1);
        u32 q[8] = {r.lo.x, r.lo.y, r.lo.z, r.lo.w, r.hi.x, r.hi.y, r.hi.z, r.hi.w};
        int shift = 4 * (j & 1);
        #pragma unroll
        for (int l = 0; l < 32; l++)
            w[l] = __fsub_rn(__fmul_rn(d1, (float)((byte_of(q, l) >> shift) & 0xF)), m1);
    } else {
        int g = r.j % 4;
        float d = f16_to_f32(r.d);
        u32 ql[8], qh[8];
        #pragma unroll
        for (int k = 0; k < 8; k++) {
            ql[k] = __funnelshift_r(r.ql[k], r.ql[k + 1], r.shl);
            qh[k] = __funnelshift_r(r.qh[k], r.qh[k + 1], r.shh);
        }
        float ds0 = __fmul_rn(d, (float)r.s0);
        float ds1 = __fmul_rn(d, (float)r.s1);
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
    } else {
        // Block types: y[j] = d * qs[j] (Q8_0); sub-block j = c % 8 of super-block c / 8,
        // nibble (j & 1) of qs[32 (j / 2) + l], y = (d * sc) * q - dmin * m (Q4_K); half
        // n = j / 4, group g = j % 4, low 4 bits from ql[64 n + l + 32 (g & 1)] (high nibble
        // for g >= 2), high 2 bits (qh[32 n + l] >> 2 g) & 3, y = d * scales[i / 16] * (q - 32)
        // (Q6_K); rnd(rnd((q - 8) - z) * s) (CT4); Q4_K's with a fifth bit from qh (Q5_K);
        // (d * (ls - 32)) * kvalues_iq4nl[q] (IQ4_XS); rnd(rnd(q - z) * s) (CT8). Blocks: Q4_K
        // 144 B and Q5_K 176 B (16-byte aligned), IQ4_XS 136 B (8-byte), Q6_K 210 B and Q8_0
        // 34 B (2-byte), CT4 20 B and CT8 36 B (4-byte).
        ChunkRaw<T> r;
        chunk_fetch<T>(row, c, r);
        chunk_unpack<T>(r, w);
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
