// The weight formats of gemm_rf.cu's products: the block's shared-memory layout (RfLayout)
// and, per format (RfQ4K, RfQ6K, RfCt4, RfCt8), how a stage's rows are copied, how their scales are
// decoded into the warp's table, and how a lane decodes its mma A fragments (both k orders:
// mma.sync's and wgmma's). gemm_rf.cu's header comment describes the scheme and the k
// permutation; its mainloops call these.
#pragma once
#include "quant.cuh"
#include "tc.cuh"

// Weight rows and threads per block.
#define RF_BM 256
#define RF_THREADS 256

// Shared-memory layout of a block for weight format F and NT n8 tiles per warp (a tile of
// BN = 8 NT tokens; NT = 8, 12 or 16): the ring of STAGES stages (each the rows'
// super-blocks, F::SLOT bytes per row, then the tokens' 256 f16 activations, 512 bytes per token, no padding: token t's
// 16-byte chunk c sits at chunk c ^ 4 (t & 1), so the two tokens of each eight-lane phase of a
// 16-byte load fall on different banks), each warp's scale table for its 32 rows
// (F::SC_STRIDE bytes per row), the row and token pointer tables.
template <typename F, int NT>
struct RfLayout {
    static constexpr int BN = 8 * NT;
    static constexpr int STAGES = NT == 8 ? F::STAGES : 2;
    static constexpr int A_BYTES = RF_BM * F::SLOT;
    static constexpr int STAGE = A_BYTES + BN * 512;
    static constexpr int SC = STAGES * STAGE;
    static constexpr int TABLES = SC + RF_BM * F::SC_STRIDE;
    static constexpr int SMEM = TABLES + 8 * RF_BM + 8 * BN;
};

// Byte i (0..255) of v as a float plus 2^23, exactly (a byte permute into 0x4B0000xx).
__device__ __forceinline__ float rf_byte_f(u32 v, int i) {
    return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7440 + i));
}

// 8 bytes at a 2-byte-aligned shared address, from three aligned words.
__device__ __forceinline__ uint2 rf_lds8(const u8* p) {
    const u32* w = (const u32*)((size_t)p & ~(size_t)3);
    u32 sh = 8 * ((u32)(size_t)p & 3);
    u32 w0 = w[0], w1 = w[1], w2 = w[2];
    return make_uint2(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh));
}

// The rows of lane (g, q) of warp w within the block: m16 tile mt, half h (rows g, g + 8).
struct RfRows {
    int r[2][2];
    __device__ __forceinline__ RfRows(int w, int g) {
        #pragma unroll
        for (int mt = 0; mt < 2; mt++)
            #pragma unroll
            for (int h = 0; h < 2; h++) r[mt][h] = 32 * w + 16 * mt + 8 * h + g;
    }
};

// A stage's copy for formats whose per-row slot is P whole 16-byte pieces, 16-byte aligned in
// every row (Q4_K: 9, CT4: 10): thread t copies pieces c = t + 256 j (row c / P, bytes
// 16 (c % P) ..) to stage offset 16 c, through pointers taken once from the row table.
template <int P>
struct RfPieces {
    // Whether rf_loop picks the format's decode by the matrix's scale dtype (RfCt4).
    static constexpr bool BY_DTYPE = false;
    struct Copies {
        const u8* a[P];
    };
    static __device__ __forceinline__ Copies copies(const u8* const* arows, int t) {
        Copies c;
        #pragma unroll
        for (int j = 0; j < P; j++) {
            int i = t + RF_THREADS * j, r = i / P;
            c.a[j] = arows[r] + 16 * (i - P * r);
        }
        return c;
    }
    static __device__ __forceinline__ void load(u8* st, const Copies& c, int kb, int t) {
        #pragma unroll
        for (int j = 0; j < P; j++) cp_async16(st + 16 * (t + RF_THREADS * j), c.a[j] + 16 * P * (size_t)kb);
    }
};

// A format gives, for each of the eight 32-weight units u of a super-block (weights
// 32 u .. 32 u + 32), the A fragments of its two k16 steps: a[s2][mt][0..4] for lane (g, q),
// rows (mt, h) at the weights 32 u + 8 q + 4 s2 + {0, 1, 2, 3} (the permutation above).

// ---- Q4_K ----
//
// A stage holds one super-block (144 bytes) of each row, rows back to back, copied as nine
// 16-byte pieces per row (RfPieces<9>). The
// scale table holds each row's eight (d sc, dmin m) as float2, rows 72 bytes apart (8 bytes
// of padding, so the eight rows one 8-byte load touches fall on distinct banks). Unit u is
// group u / 2 (32 bytes of nibbles), sub-block u: low nibbles for even u, high for odd.
struct RfQ4K : RfPieces<9> {
    static constexpr int STAGES = 3, SLOT = 144, SC_STRIDE = 72;
    // Lane l of warp w: row 32 w + l's eight sub-block scales (k4_sub_scales: the
    // reference's products).
    static __device__ __forceinline__ void scales(const u8* st, u8* sc, int w, int lane, int) {
        uint4 hd = *(const uint4*)(st + 144 * (32 * w + lane));
        float2* dst = (float2*)(sc + SC_STRIDE * (32 * w + lane));
        #pragma unroll
        for (int j = 0; j < 8; j++) {
            float d1, m1;
            k4_sub_scales(hd, j, &d1, &m1);
            dst[j] = make_float2(d1, m1);
        }
    }
    // A weight is fmaf(d sc, q, -dmin m): the reference's fsub(fmul(d sc, q), dmin m) exactly,
    // since d sc q is exact in f32 (an f16 d of 11 significant bits times a 6-bit scale times
    // a 4-bit q: at most 21 bits), so the multiply-add rounds once where the reference does.
    static __device__ __forceinline__ void frags(const u8* st, const u8* sc, const RfRows& rw, int q, int, int u,
                                                 u32 a[2][2][4]) {
        #pragma unroll
        for (int mt = 0; mt < 2; mt++)
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                int row = rw.r[mt][h];
                uint2 qv = *(const uint2*)(st + 144 * row + 16 + 32 * (u >> 1) + 8 * q);
                float2 dm = *(const float2*)(sc + SC_STRIDE * row + 8 * u);
                #pragma unroll
                for (int s2 = 0; s2 < 2; s2++) {
                    u32 nib = ((s2 ? qv.y : qv.x) >> (4 * (u & 1))) & 0x0F0F0F0Fu;
                    float wv[4];
                    #pragma unroll
                    for (int i = 0; i < 4; i++) wv[i] = __fmaf_rn(dm.x, __fsub_rn(rf_byte_f(nib, i), 8388608.0f), -dm.y);
                    a[s2][mt][h] = pack_f16x2(wv[0], wv[1]);
                    a[s2][mt][2 + h] = pack_f16x2(wv[2], wv[3]);
                }
            }
    }

    // The wgmma mainloop's k order (B is read by the tensor cores from 16-byte chunks, so a
    // k16 step's logical k 0..7 and 8..15 must each be eight consecutive weights): step j
    // (0..3) of group G (bytes 32 G .. + 32 of the nibbles) takes k 0..7 from the low nibbles
    // of bytes 8 j .. 8 j + 8 (sub-block 2 G) and k 8..15 from their high nibbles (sub-block
    // 2 G + 1). Lane (g, q)'s fragment is then bytes 8 j + 2 q, + 1 of its rows: a[mt][h] their
    // low nibbles, a[mt][2 + h] their high ones. WgGroup holds the lane's rows' two sub-block
    // scales (d sc, dmin m) of the group.
    struct WgGroup {
        float2 lo[2][2], hi[2][2];
    };
    static __device__ __forceinline__ void wg_group(const u8* st, const u8* sc, const RfRows& rw, int G,
                                                    WgGroup& gr) {
        #pragma unroll
        for (int mt = 0; mt < 2; mt++)
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                int row = rw.r[mt][h];
                gr.lo[mt][h] = *(const float2*)(sc + SC_STRIDE * row + 16 * G);
                gr.hi[mt][h] = *(const float2*)(sc + SC_STRIDE * row + 16 * G + 8);
            }
    }
    // The fragments of step j of group G: each row's word holding bytes 8 j + 2 q, + 1 (at
    // half q % 2, shift sh = 16 (q % 2)).
    static __device__ __forceinline__ void wg_frags(const u8* st, const RfRows& rw, const WgGroup& gr, int q, int G,
                                                    int j, u32 a[2][4]) {
        u32 sh = 16 * (q & 1);
        #pragma unroll
        for (int mt = 0; mt < 2; mt++)
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                u32 v = *(const u32*)(st + 144 * rw.r[mt][h] + 16 + 32 * G + 8 * j + 4 * (q >> 1));
                u32 lo = (v >> sh) & 0x0F0Fu, hi = (v >> (sh + 4)) & 0x0F0Fu;
                float2 dl = gr.lo[mt][h], dh = gr.hi[mt][h];
                a[mt][h] = pack_f16x2(__fmaf_rn(dl.x, __fsub_rn(rf_byte_f(lo, 0), 8388608.0f), -dl.y),
                                      __fmaf_rn(dl.x, __fsub_rn(rf_byte_f(lo, 1), 8388608.0f), -dl.y));
                a[mt][2 + h] = pack_f16x2(__fmaf_rn(dh.x, __fsub_rn(rf_byte_f(hi, 0), 8388608.0f), -dh.y),
                                          __fmaf_rn(dh.x, __fsub_rn(rf_byte_f(hi, 1), 8388608.0f), -dh.y));
            }
    }
};

// ---- Q6_K ----
//
// Super-blocks are 210 bytes, so a stage's cannot be copied in aligned 16-byte pieces; rows
// of a multiple of four super-blocks (the session's condition: row_bytes % 8 == 0) keep every
// super-block at an even offset, 0, 2, 4 or 6 past an 8-byte boundary (sh = 210 kb % 8, the
// same for every row). Thread t copies row t's 216 bytes from that boundary (27 8-byte
// pieces; for a row's last super-block sh = 6, so nothing past the row is read) into a
// 216-byte slot, and the fields are read at slot + sh with rf_lds8. Two stages (88 KiB
// each). The scale table holds each row's sixteen d sc, rows 80 bytes apart. Unit u is half
// n = u / 4 (128 weights: ql[64 n ..], qh[32 n ..]), group g4 = u % 4: weight 32 u + l is
// ql[64 n + 32 (g4 % 2) + l] (low nibble for g4 < 2, high otherwise) with bits 2 g4 of
// qh[32 n + l], scale 8 n + 2 g4 + l / 16.
struct RfQ6K {
    static constexpr int STAGES = 2, SLOT = 216, SC_STRIDE = 80;
    static constexpr bool BY_DTYPE = false;
    struct Copies {
        const u8* a;
    };
    static __device__ __forceinline__ Copies copies(const u8* const* arows, int t) { return Copies{arows[t]}; }
    static __device__ __forceinline__ void load(u8* st, const Copies& c, int kb, int t) {
        const u8* src = c.a + ((210 * (size_t)kb) & ~(size_t)7);
        u8* dst = st + 216 * t;
        #pragma unroll
        for (int p = 0; p < 27; p++) cp_async8(dst + 8 * p, src + 8 * p);
    }
    static __device__ __forceinline__ void scales(const u8* st, u8* sc, int w, int lane, int kb) {
        const u8* p = st + 216 * (32 * w + lane) + ((210 * kb) & 7);
        float d = f16_to_f32(*(const unsigned short*)(p + 208));
        uint2 s0 = rf_lds8(p + 192), s1 = rf_lds8(p + 200);
        u32 sw[4] = {s0.x, s0.y, s1.x, s1.y};
        float* dst = (float*)(sc + SC_STRIDE * (32 * w + lane));
        #pragma unroll
        for (int i = 0; i < 16; i++) dst[i] = __fmul_rn(d, (float)(int)(signed char)((sw[i >> 2] >> (8 * (i & 3))) & 0xFF));
    }
    // A weight is fmul(d sc, q - 32), exact as the reference's (d sc q has at most 11 + 7 + 5
    // significant bits).
    static __device__ __forceinline__ void frags(const u8* st, const u8* sc, const RfRows& rw, int q, int kb, int u,
                                                 u32 a[2][2][4]) {
        int n = u >> 2, g4 = u & 3, sh = (210 * kb) & 7;
        #pragma unroll
        for (int mt = 0; mt < 2; mt++)
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                int row = rw.r[mt][h];
                const u8* p = st + 216 * row + sh;
                uint2 fl = rf_lds8(p + 64 * n + 32 * (g4 & 1) + 8 * q);
                uint2 fh = rf_lds8(p + 128 + 32 * n + 8 * q);
                float ds = *(const float*)(sc + SC_STRIDE * row + 4 * (8 * n + 2 * g4 + (q >> 1)));
                #pragma unroll
                for (int s2 = 0; s2 < 2; s2++) {
                    u32 qlw = s2 ? fl.y : fl.x, qhw = s2 ? fh.y : fh.x;
                    u32 q6 = ((qlw >> (4 * (g4 >> 1))) & 0x0F0F0F0Fu) | (((qhw >> (2 * g4)) & 0x03030303u) << 4);
                    float wv[4];
                    #pragma unroll
                    for (int i = 0; i < 4; i++) wv[i] = __fmul_rn(ds, __fsub_rn(rf_byte_f(q6, i), 8388640.0f));
                    a[s2][mt][h] = pack_f16x2(wv[0], wv[1]);
                    a[s2][mt][2 + h] = pack_f16x2(wv[2], wv[3]);
                }
            }
    }
};

// ---- CT4 (compressed-tensors int4 in 32-element blocks: blocks.cuh block_ct4) ----
//
// A stage holds eight 20-byte blocks (256 weights, 160 bytes) of each row, rows back to back:
// a CT4 row is 16-byte aligned (its matrix is, and rows of a multiple of 256 columns are
// multiples of 160 bytes), and so is each eight-block unit of it: ten 16-byte pieces per row
// (RfPieces<10>).
// No scale table: a lane reads each block's header word next to its code word. Unit u is
// block u; weight 32 u + k is nibble k % 2 of code byte k / 2, so lane q's weights
// 8 q .. 8 q + 8 are the code bytes 4 q .. 4 q + 4, one aligned word.
// Pairs of 16-bit floats in a u32 (low half first), each operation rounded once to nearest
// even (PTX fma.rn.bf16x2, sm_80; sub/mul.rn.f16x2, no flush of subnormals).
__device__ __forceinline__ u32 fma_bf16x2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ u32 sub_f16x2(u32 a, u32 b) {
    u32 d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ u32 mul_f16x2(u32 a, u32 b) {
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// The scale dtype T (WT_F16 or WT_BF16) is a template argument: it is the matrix's (one scale
// tensor per matrix), so rf_loop reads it once from the tile's first block and runs the
// mainloop of RfCt4T<T>, and the decode has no branch per block. (Was: a test of each block's
// header byte: 28 branches with their reconvergence points in the mainloop, 2,934 SASS
// instructions per 512 HMMAs against 1,977 now; most likely they also kept ptxas from
// interleaving the four rows' decodes with each other and with the mma, as the issue rate
// rose from 1.49 to 1.78 an SM cycle: BENCHMARKS.md, session 35.)
template <int T>
struct RfCt4T : RfPieces<10> {
    static constexpr int STAGES = 3, SLOT = 160, SC_STRIDE = 0;
    static __device__ __forceinline__ void scales(const u8*, u8*, int, int, int) {}
    // A weight is compressed-tensors' rnd((c - 8 - z) * s) in the scale dtype (quant.cuh's CT4
    // decode; c - 8 - z is an integer of at most 9 bits, so only the product is rounded), then
    // f16. Done two weights at a time in the scale's own 16-bit type, which gives that value
    // exactly: a code pair is made the floats m + c by a byte permute (f16) or a shift and a
    // mask (bf16) (m = 1024 for f16, whose unit there is 1; 64 for bf16, unit 1/2, so the code
    // goes in doubled), m + 8 + z is subtracted (exact: every integer involved is within the
    // type's exact range), and the product with the scale is the one rounding. A bf16 pair
    // then becomes f16 through f32.
    // (Was: each weight in f32, then rounded to the scale dtype by integer steps; the kernels
    // had 1.37x (gate/up) and 1.49x (down) the SASS instructions for the same HMMAs, and
    // S 2.1 W4A16 pp4096 went 6,898 -> 9,095 t/s with this form: BENCHMARKS.md, session 14.)
    static __device__ __forceinline__ void frags(const u8* st, const u8*, const RfRows& rw, int q, int, int u,
                                                 u32 a[2][2][4]) {
        #pragma unroll
        for (int mt = 0; mt < 2; mt++)
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const u8* b = st + 160 * rw.r[mt][h] + 20 * u;
                u32 hd = *(const u32*)b;
                u32 cw = *(const u32*)(b + 4 + 4 * q);
                u32 s2 = __byte_perm(hd, 0, 0x1010);
                int z = (int)(signed char)((hd >> 16) & 0xFF);
                if constexpr (T == WT_BF16) {
                    // 64 + c as bf16 is 0x4280 | 2c. Each shift-and-or makes one pair of
                    // elements four apart, (e, e + 4) of the lane's eight (code byte j holds
                    // elements 2j, 2j + 1 in its low and high nibbles): v[0] = (e0, e4),
                    // v[1] = (e1, e5), v[2] = (e2, e6), v[3] = (e3, e7). The arithmetic is per
                    // element, and the f32 -> f16 pack that follows takes its two halves from
                    // two pairs, so the fragments' (e0, e1) .. (e6, e7) come out without byte
                    // permutes.
                    u32 off = __byte_perm(__float_as_uint((float)(72 + z)), 0, 0x3232);
                    u32 v[4] = {cw << 1, cw >> 3, cw >> 7, cw >> 11};
                    #pragma unroll
                    for (int i = 0; i < 4; i++)
                        v[i] = fma_bf16x2(fma_bf16x2(off, 0xBF80BF80u, (v[i] & 0x001E001Eu) | 0x42804280u), s2,
                                          0x80008000u);
                    #pragma unroll
                    for (int p = 0; p < 2; p++) {
                        u32 x = v[2 * p], y = v[2 * p + 1];
                        a[0][mt][2 * p + h] = pack_f16x2(__uint_as_float(x << 16), __uint_as_float(y << 16));
                        a[1][mt][2 * p + h] =
                            pack_f16x2(__uint_as_float(x & 0xFFFF0000u), __uint_as_float(y & 0xFFFF0000u));
                    }
                } else {
                    // 1024 + c as f16 is 0x6400 | c.
                    u32 lo = cw & 0x0F0F0F0Fu, hi = (cw >> 4) & 0x0F0F0F0Fu;
                    u32 off = (u32)__half_as_ushort(__float2half_rn((float)(1032 + z))) * 0x10001u;
                    #pragma unroll
                    for (int s2i = 0; s2i < 2; s2i++) {
                        u32 nib = __byte_perm(lo, hi, s2i ? 0x7362 : 0x5140);
                        #pragma unroll
                        for (int p = 0; p < 2; p++) {
                            u32 m = __byte_perm(nib, 0x64646464u, p ? 0x4342 : 0x4140);
                            a[s2i][mt][2 * p + h] = mul_f16x2(sub_f16x2(m, off), s2);
                        }
                    }
                }
            }
    }
};
// A format decoded by scale dtype as the kernels name it (F<WT_F16> stands for it where a
// dtype-free member is read); rf_loop picks ByDtype<dtype> per matrix.
template <template <int> class F>
struct RfByDtype : F<WT_F16> {
    static constexpr bool BY_DTYPE = true;
    template <int T>
    using ByDtype = F<T>;
};
using RfCt4 = RfByDtype<RfCt4T>;

// ---- CT8 (compressed-tensors int8 in 32-element blocks: blocks.cuh block_ct8) ----
//
// A stage holds eight 36-byte blocks (256 weights, 288 bytes) of each row, rows back to back,
// copied as eighteen 16-byte pieces (RfPieces<18>: a CT8 row of a multiple of 256 columns is a
// multiple of 288 bytes). Two stages of 104 KiB, so 64-token tiles only (a 128-token stage
// would not fit twice). No scale table: a lane reads each block's header word next to its
// codes. Unit u is block u; lane q's weights 8 q .. 8 q + 8 are code bytes 8 q .. 8 q + 8, two
// aligned words. A weight is rnd((q - z) * s) in the scale dtype (quant.cuh's CT8 decode;
// q - z is an integer of at most 8 significant bits, exact in both dtypes), then f16: for f16
// scales two at a time in f16 (1024 + (q + 128) is the code byte with its sign bit flipped
// under 0x64, less 1152 + z, times the scale: one rounding, RfCt4T's scheme); for bf16 scales
// q - z is formed in f32 (2^23 + (q + 128) by a byte permute, less 2^23 + 128 + z: exact; no
// 16-bit magic holds an 8-bit code in bf16, whose unit is 2 above 256), taken to bf16 by its
// high half, multiplied two at a time in bf16 (the one rounding) and packed to f16 through
// f32. The dtype is a template argument, as for CT4 (rf_loop reads it once per tile).
template <int T>
struct RfCt8T : RfPieces<18> {
    static constexpr int STAGES = 2, SLOT = 288, SC_STRIDE = 0;
    static __device__ __forceinline__ void scales(const u8*, u8*, int, int, int) {}
    static __device__ __forceinline__ void frags(const u8* st, const u8*, const RfRows& rw, int q, int, int u,
                                                 u32 a[2][2][4]) {
        #pragma unroll
        for (int mt = 0; mt < 2; mt++)
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const u8* b = st + 288 * rw.r[mt][h] + 36 * u;
                u32 hd = *(const u32*)b;
                u32 cw[2] = {*(const u32*)(b + 4 + 8 * q), *(const u32*)(b + 8 + 8 * q)};
                int z = (int)(signed char)((hd >> 16) & 0xFF);
                if constexpr (T == WT_BF16) {
                    // q - z in f32 has its low 16 bits zero (at most 8 significant bits), so its
                    // high half is q - z in bf16: a byte permute pairs two of them, and one
                    // fma.rn.bf16x2 by the scale (plus -0) is the reference's one rounding.
                    u32 s2v = __byte_perm(hd, 0, 0x1010);
                    float off = (float)(8388736 + z);
                    #pragma unroll
                    for (int s2 = 0; s2 < 2; s2++) {
                        u32 x = cw[s2] ^ 0x80808080u;
                        u32 t[4];
                        #pragma unroll
                        for (int i = 0; i < 4; i++) t[i] = __float_as_uint(__fsub_rn(rf_byte_f(x, i), off));
                        #pragma unroll
                        for (int p = 0; p < 2; p++) {
                            u32 v = fma_bf16x2(__byte_perm(t[2 * p], t[2 * p + 1], 0x7632), s2v, 0x80008000u);
                            a[s2][mt][2 * p + h] = pack_f16x2(__uint_as_float(v << 16), __uint_as_float(v & 0xFFFF0000u));
                        }
                    }
                } else {
                    u32 s2v = __byte_perm(hd, 0, 0x1010);
                    u32 off = (u32)__half_as_ushort(__float2half_rn((float)(1152 + z))) * 0x10001u;
                    #pragma unroll
                    for (int s2 = 0; s2 < 2; s2++) {
                        u32 x = cw[s2] ^ 0x80808080u;
                        a[s2][mt][h] = mul_f16x2(sub_f16x2(__byte_perm(x, 0x64646464u, 0x5140), off), s2v);
                        a[s2][mt][2 + h] = mul_f16x2(sub_f16x2(__byte_perm(x, 0x64646464u, 0x5342), off), s2v);
                    }
                }
            }
    }
};
using RfCt8 = RfByDtype<RfCt8T>;
