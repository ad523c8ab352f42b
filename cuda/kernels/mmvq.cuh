// Integer dot products of one weight row with one quantised activation row (act.cu), the
// decode path's inner loop. The pairing is the CPU's (ggml's): K-quants against Q8_K, Q8_0
// against Q8_0, with dp4a doing four int8 products per instruction.
//
// Work split (after llama.cpp's mmvq.cu, ggml/src/ggml-cuda/mmvq.cu and vecdotq.cuh, which
// give each thread a contiguous slice of a block so a warp's loads coalesce): for K-quants
// eight lanes share a 256-super-block, each taking 16 bytes of its packed quants, so one warp
// covers four super-blocks per iteration; for Q8_0 a lane takes one 34-byte block.
//
// Numerics: each lane's integer sums are exact; each lane scales its share by the
// super-block's (d_a·d_w) and (d_a·dmin_w) as the CPU kernel scales the whole super-block
// (cpu-experts/src/kernels/scalar.rs k_dot), and the shares are added per lane then by a
// warp tree — the float rounding differs from the CPU's by a few ulp per term.
#pragma once
#include "quant.cuh"

// Weight loads of the batch-1 products. Each weight byte is read once per step, so these
// loads carry the evict-first hint (ld.global.cs): the weights stream through L1 without
// pushing out the activation row that every warp of the SM rereads. Kernel lab (H200,
// examples/kernel_lab.rs --types bf16; BENCHMARKS.md "Session 12 on the H200"): the lab's
// evict-first copy of mv_bf16 took the Q projection shape 21.3 -> 16.6 µs in one call; the
// production kernels with the hint, old and new binaries in one call: mv_bf16 19.4 -> 18.5,
// mv_q4_K 10.2 -> 9.5, mv_ct4 9.0 -> 8.5 µs; S 2.1 decode +3.7% (W4A16), +1.2% (Q4_K_M). The Q6_K windows and Q8_0's 34-byte blocks
// keep __ldg (not yet measured with the hint): there neighbouring lanes' later loads reuse the
// 32-byte sectors an earlier instruction brought into L1. CT4's 20-byte blocks share sectors
// the same way but take the hint (mv_ct4 measured 9.0 -> 8.5 µs with it, same section).
__device__ __forceinline__ uint4 ldw4(const void* p) { return __ldcs((const uint4*)p); }
__device__ __forceinline__ float4 ldw4f(const void* p) { return __ldcs((const float4*)p); }
__device__ __forceinline__ u32 ldw(const void* p) { return __ldcs((const unsigned int*)p); }

// The kernel's pdl_wait inside a product loop that has issued its first weight loads (the
// WAIT variants below): the whole warp reconverges and waits at the same instruction. A wait
// reached by different lanes at different places (lanes with no pieces waiting after the
// loop) gave wrong results under programmatic launch on the H200 (tiny models, 64-wide rows:
// rel L2 1.3 against the CPU), and none with the same kernels waiting first.
__device__ __forceinline__ void warp_pdl_wait() {
    __syncwarp();
    pdl_wait();
}

// A load a kernel wants issued as soon as its wait is over (a residual read at the end of a
// row, say): the WAIT loops below take it and issue it right after the wait, so its latency
// passes under the row's own loads instead of after them. p null: none.
// q (mv_rinv): up to 64 float4s of a sum's partial terms, the lane's pieces q[lane] and
// q[lane + 32] of the first n4, kept raw in q0/q1 (summed only where the row's sum is, so
// the warp does not stall on them in the loop).
struct AfterWait {
    const float* p;
    float v;
    const float4* q = nullptr;
    int n4 = 0;
    float4 q0 = {0.0f, 0.0f, 0.0f, 0.0f}, q1 = {0.0f, 0.0f, 0.0f, 0.0f};
};
__device__ __forceinline__ void after_wait_loads(AfterWait* aw) {
    if (!aw) return;
    if (aw->p) aw->v = *aw->p;
    if (aw->q) {
        int lane = threadIdx.x & 31;
        if (lane < aw->n4) aw->q0 = aw->q[lane];
        if (lane + 32 < aw->n4) aw->q1 = aw->q[lane + 32];
    }
}
__device__ __forceinline__ void warp_pdl_wait(AfterWait* aw) {
    warp_pdl_wait();
    after_wait_loads(aw);
}

// Byte offsets of a padded activation row's parts (act.cu's layout).
__device__ __forceinline__ const float* q8k_d(const u8* row, int cols) { return (const float*)(row + cols); }
__device__ __forceinline__ const short* q8k_bsums(const u8* row, int cols) {
    return (const short*)(row + cols + 4 * (cols / QK_K));
}
__device__ __forceinline__ const float* q8_0_d(const u8* row, int cols) { return (const float*)(row + cols); }

// 16 bytes at a 2-byte-aligned address as four little-endian words (five aligned loads and
// funnel shifts; reads up to 2 bytes past p + 16).
__device__ __forceinline__ void load16_a2(const u8* p, u32 out[4]) {
    const u32* w = (const u32*)((size_t)p & ~(size_t)3);
    u32 sh = 8u * (u32)((size_t)p & 3);
    u32 win[5];
    #pragma unroll
    for (int k = 0; k < 5; k++) win[k] = __ldg(w + k);
    #pragma unroll
    for (int k = 0; k < 4; k++) out[k] = __funnelshift_r(win[k], win[k + 1], sh);
}

__device__ __forceinline__ int dp4a4(const u32 w[4], const int4 a, int acc) {
    acc = __dp4a((int)w[0], a.x, acc);
    acc = __dp4a((int)w[1], a.y, acc);
    acc = __dp4a((int)w[2], a.z, acc);
    acc = __dp4a((int)w[3], a.w, acc);
    return acc;
}

// Q6_K lane part p (0..7), its share of sumi = Σ_j sc_j Σ q·a: half n = p / 4, e = (p / 2) % 2, l0 = 16 (p % 2). ql bytes
// 64n + 32e + l0 + [0, 16) hold the low 4 bits of elements 128n + 32e + l0 + l (low nibble)
// and 128n + 32(e + 2) + l0 + l (high nibble); qh bytes 32n + l0 + [0, 16) their top two
// bits at shifts 2e and 2(e + 2). q = that − 32, so Σ q·a = Σ u·a − 32 bsum.
__device__ __forceinline__ int q6k_part(const u8* __restrict__ blk, int p, const u8* __restrict__ aq,
                                        const short* __restrict__ bs) {
    int n = p >> 2, e = (p >> 1) & 1, h = p & 1;
    u32 ql[4], qh[4];
    load16_a2(blk + 64 * n + 32 * e + 16 * h, ql);
    load16_a2(blk + 128 + 32 * n + 16 * h, qh);
    u32 lo[4], hi[4];
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        lo[k] = (ql[k] & 0x0F0F0F0Fu) | (((qh[k] >> (2 * e)) & 0x03030303u) << 4);
        hi[k] = ((ql[k] >> 4) & 0x0F0F0F0Fu) | (((qh[k] >> (2 * e + 4)) & 0x03030303u) << 4);
    }
    int jlo = 8 * n + 2 * e + h, jhi = jlo + 4;
    int4 alo = *(const int4*)(aq + 16 * jlo);
    int4 ahi = *(const int4*)(aq + 16 * jhi);
    int dlo = dp4a4(lo, alo, 0) - 32 * (int)bs[jlo];
    int dhi = dp4a4(hi, ahi, 0) - 32 * (int)bs[jhi];
    const signed char* sc = (const signed char*)(blk + 192);
    return (int)sc[jlo] * dlo + (int)sc[jhi] * dhi;
}

// ---- Q4_K with the loads issued first ----
// GU_MEMONLY=1 (lab switch, off; wrong outputs): the expert gate/up's Q4_K and CT4 row-pair
// loops (warp_gate_up_q4k_rows, warp_dot2_ct4) keep their weight loads and replace the
// arithmetic and the activation reads with a checksum of the loaded words, so a traced or
// timed step shows what the current access pattern costs alone (the ceiling of the loop's
// loads) against the whole kernel. Measured (session 29, S 2.1 tg64 alternating, two rounds,
// and a traced step): Q4_K_M 323.08 / 323.00 t/s against 313.15 / 313.21, the gate/up on the
// critical path 13.79 µs against 16.45; W4A16 252.03 / 252.24 against 248.70 / 248.52, 14.40
// against 16.42 µs. So the arithmetic holds only 2.0-2.7 µs of these kernels: their loads
// alone stream 35-39 MB at 2.6-2.7 TB/s, ~57% of the read floor, where the time is.
#ifndef GU_MEMONLY
#define GU_MEMONLY 0
#endif
__device__ __forceinline__ float memonly_sum(u32 x) { return (float)(x & 0xFFu) * 1e-9f; }

// Q4K_ACC_SCALES4=0 (lab switch): q4k_acc unpacks its two scales and mins byte by byte.
#ifndef Q4K_ACC_SCALES4
#define Q4K_ACC_SCALES4 1
#endif
// A Q4_K super-block is 144 bytes, 16-byte aligned in every row: a 16-byte header (d, dmin,
// the 12 scale bytes) then 128 packed bytes. A lane's whole share of one super-block is two
// 16-byte loads, the header (the same address for the block's eight lanes, one transaction)
// and its 16 packed bytes, so a lane can fetch all of its super-blocks of a row (or of
// several rows) before it computes any: the loads are then in flight together, where the
// loop it replaced (warp_dot_q6k's loop, for Q4_K) issued the scale bytes one by one after
// the quants (measured with ncu on the full S 2.1 decode: 20-38% of the read floor; with
// this, gate/up 22.6 -> 18.3 µs, down 20.6 -> 18.5 µs). Each lane's terms and their order
// are that loop's.
struct Q4kLoad {
    uint4 hd;
    uint4 qs;
};

__device__ __forceinline__ Q4kLoad q4k_load(const u8* __restrict__ blk, int p) {
    Q4kLoad l;
    l.hd = ldw4(blk);
    l.qs = ldw4(blk + 16 + 16 * p);
    return l;
}

// scale_min_k4 for sub-block j from the header's scale words (s[0..4) = hd.y, s[4..8) =
// hd.z, s[8..12) = hd.w).
__device__ __forceinline__ void q4k_scale_min(const uint4& hd, int j, int* sc, int* m) {
    u32 sh = 8u * (u32)(j & 3);
    int y = (int)((hd.y >> sh) & 0xFF), z = (int)((hd.z >> sh) & 0xFF), w = (int)((hd.w >> sh) & 0xFF);
    if (j < 4) {
        *sc = y & 63;
        *m = z & 63;
    } else {
        *sc = (w & 0xF) | ((y >> 6) << 4);
        *m = (w >> 4) | ((z >> 6) << 4);
    }
}

// The scales and mins of sub-blocks 2g and 2g + 1 (ggml's get_scale_min_k4 for j < 4 and
// j >= 4, done on whole words: bytes 0-3 of sc/mn are sub-blocks 0-3 or 4-7).
__device__ __forceinline__ void q4k_scales4(const uint4& hd, int g, int* sc0, int* sc1, int* m0, int* m1) {
    u32 sc, mn;
    if (g < 2) {
        sc = hd.y & 0x3F3F3F3Fu;
        mn = hd.z & 0x3F3F3F3Fu;
    } else {
        sc = (hd.w & 0x0F0F0F0Fu) | ((hd.y >> 2) & 0x30303030u);
        mn = ((hd.w >> 4) & 0x0F0F0F0Fu) | ((hd.z >> 2) & 0x30303030u);
    }
    u32 sh = 16u * (u32)(g & 1);
    sc >>= sh;
    mn >>= sh;
    *sc0 = (int)(sc & 0xFF);
    *sc1 = (int)((sc >> 8) & 0xFF);
    *m0 = (int)(mn & 0xFF);
    *m1 = (int)((mn >> 8) & 0xFF);
}

// A lane's share of one Q8_K activation super-block for Q4_K part p = 2g + h (eight lanes
// per super-block): its two 16-byte windows of quants, its two bsums and the block's d. Held
// in registers by a warp that dots several rows against the same activation (the lab's
// moe_gate_up_r_q4_K), loaded per row by q4k_acc.
struct Q8kPiece {
    int4 lo, hi;
    int bs0, bs1;
    float d;
};

__device__ __forceinline__ Q8kPiece q8k_piece(const u8* __restrict__ aq, const short* __restrict__ bs, float da,
                                              int p) {
    int g = p >> 1, h = p & 1;
    Q8kPiece a;
    a.lo = *(const int4*)(aq + 64 * g + 16 * h);
    a.hi = *(const int4*)(aq + 64 * g + 32 + 16 * h);
    a.bs0 = (int)bs[4 * g + h];
    a.bs1 = (int)bs[4 * g + 2 + h];
    a.d = da;
    return a;
}

// acc += (d_a·d)·sumi − (d_a·dmin)·summ for a lane's part p of a loaded super-block against
// its activation piece a: q4k_part's sums.
__device__ __forceinline__ float q4k_acc_a(float acc, const Q4kLoad& l, int p, const Q8kPiece& a) {
    int g = p >> 1;
    u32 q[4] = {l.qs.x, l.qs.y, l.qs.z, l.qs.w};
    u32 lo[4], hi[4];
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        lo[k] = q[k] & 0x0F0F0F0Fu;
        hi[k] = (q[k] >> 4) & 0x0F0F0F0Fu;
    }
    int dlo = dp4a4(lo, a.lo, 0), dhi = dp4a4(hi, a.hi, 0);
    int sc0, m0, sc1, m1;
    // Sub-blocks 2g and 2g + 1, the same pair as the four-lane part g's: unpacked word-wide
    // (q4k_scales4) instead of byte by byte with a lane-dependent branch per sub-block
    // (q4k_scale_min); the same integers (both compiled for the host and compared on 80 M
    // random (header, part) pairs, session 26), ~7% fewer SASS instructions in the gate/up
    // kernel (1,752 -> 1,624), same 116 registers. Measured on the H200 (session 27, S 2.1
    // Q4_K_M tg64 alternating, two rounds): 308.06 / 308.17 t/s against 303.08 / 303.12.
    if (Q4K_ACC_SCALES4) q4k_scales4(l.hd, g, &sc0, &sc1, &m0, &m1);
    else {
        q4k_scale_min(l.hd, 2 * g, &sc0, &m0);
        q4k_scale_min(l.hd, 2 * g + 1, &sc1, &m1);
    }
    int sumi = sc0 * dlo + sc1 * dhi;
    int summ = m0 * a.bs0 + m1 * a.bs1;
    float d = f16_to_f32((unsigned short)(l.hd.x & 0xFFFF));
    float dmin = f16_to_f32((unsigned short)(l.hd.x >> 16));
    acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(a.d, d), (float)sumi));
    return __fsub_rn(acc, __fmul_rn(__fmul_rn(a.d, dmin), (float)summ));
}

// q4k_acc_a with the activation piece read from aq (its super-block's quants), bs (its 16
// bsums) and da (its d).
__device__ __forceinline__ float q4k_acc(float acc, const Q4kLoad& l, int p, const u8* __restrict__ aq,
                                         const short* __restrict__ bs, float da) {
    return q4k_acc_a(acc, l, p, q8k_piece(aq, bs, da, p));
}

// Super-blocks a lane fetches before computing: 3 covers rows up to 3072 wide (S 2.1's
// hidden size) in one round.
#define Q4K_BATCH 3

// NR Q4_K rows dotted with one Q8_K activation row; out[i] in every lane.
template <int NR>
__device__ __forceinline__ void warp_dot_q4k_rows(const u8* const* rows, const u8* __restrict__ a, int cols,
                                                  float* out) {
    int lane = threadIdx.x & 31;
    int p = lane & 7;
    int nb = cols / QK_K;
    const float* ad = q8k_d(a, cols);
    const short* bs = q8k_bsums(a, cols);
    float acc[NR];
    #pragma unroll
    for (int i = 0; i < NR; i++) acc[i] = 0.0f;
    for (int b0 = lane >> 3; b0 < nb; b0 += 4 * Q4K_BATCH) {
        Q4kLoad l[NR][Q4K_BATCH];
        #pragma unroll
        for (int u = 0; u < Q4K_BATCH; u++) {
            int b = b0 + 4 * u;
            if (b < nb) {
                #pragma unroll
                for (int i = 0; i < NR; i++) l[i][u] = q4k_load(rows[i] + (size_t)b * 144, p);
            }
        }
        #pragma unroll
        for (int u = 0; u < Q4K_BATCH; u++) {
            int b = b0 + 4 * u;
            if (b < nb) {
                float da = ad[b];
                #pragma unroll
                for (int i = 0; i < NR; i++) acc[i] = q4k_acc(acc[i], l[i][u], p, a + (size_t)b * QK_K, bs + 16 * b, da);
            }
        }
    }
    #pragma unroll
    for (int i = 0; i < NR; i++) out[i] = warp_sum(acc[i]);
}

// The lane's activation pieces of super-blocks j + 4v of the Q8_K row a (H columns), for
// q4k_pair_swiglu; none when MEMONLY (GU_MEMONLY reads no activation).
template <bool MEMONLY>
__device__ __forceinline__ void q8k_lane_pieces(Q8kPiece (&ap)[Q4K_BATCH], const u8* __restrict__ a, int H, int j,
                                                int p) {
    int nb = H / QK_K;
    const float* ad = q8k_d(a, H);
    const short* bs = q8k_bsums(a, H);
    #pragma unroll
    for (int v = 0; v < Q4K_BATCH; v++) {
        int b = j + 4 * v;
        if (b < nb && !MEMONLY) ap[v] = q8k_piece(a + (size_t)b * QK_K, bs + 16 * b, ad[b], p);
    }
}

// *out = silu(g . a) · (u . a), written by lane 0, from the lane's loads l[0] (gate) and l[1]
// (up) of super-blocks j + 4v of a row pair and its activation pieces ap (warp_gate_up_q4k_rows
// and the kernel lab's shared-memory form). MEMONLY: GU_MEMONLY's checksum of the words instead.
template <bool MEMONLY>
__device__ __forceinline__ void q4k_pair_swiglu(const Q4kLoad (&l)[2][Q4K_BATCH], const Q8kPiece (&ap)[Q4K_BATCH],
                                                int j, int nb, int p, float* out) {
    float acc[2] = {0.0f, 0.0f};
    #pragma unroll
    for (int v = 0; v < Q4K_BATCH; v++) {
        if (j + 4 * v < nb) {
            #pragma unroll
            for (int m = 0; m < 2; m++) {
                if (MEMONLY) {
                    const Q4kLoad& w = l[m][v];
                    acc[m] += memonly_sum(w.hd.x ^ w.hd.y ^ w.hd.z ^ w.hd.w ^ w.qs.x ^ w.qs.y ^ w.qs.z ^ w.qs.w);
                } else {
                    acc[m] = q4k_acc_a(acc[m], l[m][v], p, ap[v]);
                }
            }
        }
    }
    float y0 = warp_sum(acc[0]), y1 = warp_sum(acc[1]);
    if ((threadIdx.x & 31) == 0) *out = silu_f(y0) * y1;
}

// Row pairs r0 .. r0 + RPW (below I) of a SwiGLU gate g and up u (Q4_K rows of H columns,
// at most 4 · Q4K_BATCH super-blocks): act[r] = silu(g[r] . a) · (u[r] . a), written by lane
// 0. The lane's activation pieces (Q8kPiece, one per super-block it takes) are loaded once
// into registers for all RPW pairs, so each pair needs only its weight loads, where
// warp_dot_q4k_rows re-reads five activation values per piece and row (L1 hits, but loads and
// address arithmetic in a kernel issuing at ~0.5 instructions per scheduler cycle with 48% of
// its cycles without an eligible warp, session 27's ncu of moe_gate_up_q_q4_K). PIPE: the
// next pair's weights are requested before the current pair is computed, so the warp keeps
// loads in flight through its arithmetic (twice the load registers). Each row's terms and
// their order are warp_dot_q4k_rows<2>'s: the same output bits.
template <int RPW, bool PIPE>
__device__ __forceinline__ void warp_gate_up_q4k_rows(const u8* __restrict__ g, const u8* __restrict__ u,
                                                      u64 row_bytes, int r0, int I, const u8* __restrict__ a,
                                                      int H, float* __restrict__ act) {
    int lane = threadIdx.x & 31, p = lane & 7, j = lane >> 3;
    int nb = H / QK_K;
    auto load = [&](Q4kLoad(&l)[2][Q4K_BATCH], int r) {
        #pragma unroll
        for (int v = 0; v < Q4K_BATCH; v++) {
            int b = j + 4 * v;
            if (b < nb) {
                l[0][v] = q4k_load(g + (size_t)r * row_bytes + (size_t)b * 144, p);
                l[1][v] = q4k_load(u + (size_t)r * row_bytes + (size_t)b * 144, p);
            }
        }
    };
    Q4kLoad l[PIPE ? 2 : 1][2][Q4K_BATCH];
    load(l[0], r0);
    Q8kPiece ap[Q4K_BATCH];
    q8k_lane_pieces<GU_MEMONLY>(ap, a, H, j, p);
    #pragma unroll
    for (int i = 0; i < RPW; i++) {
        int r = r0 + i;
        if (r >= I) break;
        auto& cur = l[PIPE ? (i & 1) : 0];
        if (!PIPE && i > 0) load(cur, r);
        if (PIPE && i + 1 < RPW && r + 1 < I) load(l[(i + 1) & (PIPE ? 1 : 0)], r + 1);
        q4k_pair_swiglu<GU_MEMONLY>(cur, ap, j, nb, p, act + r);
    }
}

// ---- Q4_K, four lanes per super-block ----
// Lane part g (0..3) of a super-block takes the 32 packed bytes 32g .. 32g + 32, i.e.
// sub-blocks 2g (low nibbles) and 2g + 1 (high nibbles) whole: the header (d, dmin and the
// scale bytes) is decoded once per 64 weights instead of once per 32 as with eight lanes,
// the scale bytes of all eight sub-blocks are unpacked with word-wide masks (no per-lane
// branch), and the bsums come as one pair of words: ~3.5 instead of ~6.3 SASS instructions
// per weight byte in the loop (cuda/dev/sass.sh). Why that matters: with the eight-lane
// loop fed from shared memory (the lab's mvs_q4_K), ncu found the kernel issue-bound (0.75
// warp instructions per scheduler cycle at 57% of DRAM bandwidth, lm_head shape).
struct Q4kLoad4 {
    uint4 hd;
    uint4 q0, q1;
};

__device__ __forceinline__ Q4kLoad4 q4k_load4(const u8* __restrict__ blk, int g) {
    Q4kLoad4 l;
    l.hd = ldw4(blk);
    l.q0 = ldw4(blk + 16 + 32 * g);
    l.q1 = ldw4(blk + 32 + 32 * g);
    return l;
}

// A four-lane part g's share of one Q8_K activation super-block: its 64 quants (sub-blocks
// 2g, 2g + 1), the two pairs of bsums as words, the block's d.
struct Q8kPiece4 {
    int4 a[4];
    u32 bA, bB;
    float d;
};

__device__ __forceinline__ Q8kPiece4 q8k_piece4(const u8* __restrict__ aq, const short* __restrict__ bs, float da,
                                                int g) {
    Q8kPiece4 p;
    const int4* a4 = (const int4*)(aq + 64 * g);
    #pragma unroll
    for (int k = 0; k < 4; k++) p.a[k] = a4[k];
    const u32* b2 = (const u32*)(bs + 4 * g);
    p.bA = b2[0];
    p.bB = b2[1];
    p.d = da;
    return p;
}

// acc += (d_a·d)·sumi − (d_a·dmin)·summ over lane part g of a loaded super-block against its
// activation piece a.
__device__ __forceinline__ float q4k_acc4_a(float acc, const Q4kLoad4& l, int g, const Q8kPiece4& a) {
    u32 q[8] = {l.q0.x, l.q0.y, l.q0.z, l.q0.w, l.q1.x, l.q1.y, l.q1.z, l.q1.w};
    u32 lo[8], hi[8];
    #pragma unroll
    for (int k = 0; k < 8; k++) {
        lo[k] = q[k] & 0x0F0F0F0Fu;
        hi[k] = (q[k] >> 4) & 0x0F0F0F0Fu;
    }
    int dlo = dp4a4(lo + 4, a.a[1], dp4a4(lo, a.a[0], 0));
    int dhi = dp4a4(hi + 4, a.a[3], dp4a4(hi, a.a[2], 0));
    int sc0, sc1, m0, m1;
    q4k_scales4(l.hd, g, &sc0, &sc1, &m0, &m1);
    int s01 = (int)(short)(a.bA & 0xFFFF) + ((int)a.bA >> 16);
    int s23 = (int)(short)(a.bB & 0xFFFF) + ((int)a.bB >> 16);
    int sumi = sc0 * dlo + sc1 * dhi;
    int summ = m0 * s01 + m1 * s23;
    float d = f16_to_f32((unsigned short)(l.hd.x & 0xFFFF));
    float dmin = f16_to_f32((unsigned short)(l.hd.x >> 16));
    acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(a.d, d), (float)sumi));
    return __fsub_rn(acc, __fmul_rn(__fmul_rn(a.d, dmin), (float)summ));
}

// q4k_acc4_a with the piece read from aq (the super-block's activation quants), bs (its 16
// bsums) and da (its d).
__device__ __forceinline__ float q4k_acc4(float acc, const Q4kLoad4& l, int g, const u8* __restrict__ aq,
                                          const short* __restrict__ bs, float da) {
    return q4k_acc4_a(acc, l, g, q8k_piece4(aq, bs, da, g));
}

// Sum over the lanes of one group of 4·G lanes (G = 8: the warp; G = 4: a half warp).
template <int G>
__device__ __forceinline__ float group_sum(float v) {
    #pragma unroll
    for (int o = 2 * G; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One Q4_K row dotted with one Q8_K activation row by G groups of four lanes (G = 8: the
// whole warp on this row; G = 4: each half warp on its own row, the caller passing each
// half its row). Group j (lanes 4j .. 4j + 3 of the 4G) takes super-blocks j, j + G, ...,
// fetching Q4K_BATCH of them before computing any. group_part_q4k returns the lane's share,
// group_dot_q4k the group's sum (in every lane of the group). WAIT: the kernel's pdl_wait is
// issued here, after the lane's first weight loads (see lane_part_waiting).
template <int G, bool WAIT = false>
__device__ __forceinline__ float group_part_q4k(const u8* __restrict__ row, const u8* __restrict__ a, int cols,
                                                AfterWait* aw = nullptr) {
    int lane = threadIdx.x & (4 * G - 1);
    int g = lane & 3;
    int nb = cols / QK_K;
    const float* ad = q8k_d(a, cols);
    const short* bs = q8k_bsums(a, cols);
    float acc = 0.0f;
    Q4kLoad4 l[Q4K_BATCH];
    auto fetch = [&](int b0) {
        #pragma unroll
        for (int u = 0; u < Q4K_BATCH; u++) {
            int b = b0 + G * u;
            if (b < nb) l[u] = q4k_load4(row + (size_t)b * 144, g);
        }
    };
    // Rounds of Q4K_BATCH super-blocks: each fetched whole, then computed (the first fetch
    // before the loop, so WAIT can put the warp's wait after it).
    int b0 = lane >> 2;
    fetch(b0);
    if (WAIT) warp_pdl_wait(aw);
    while (b0 < nb) {
        // (Requesting the round's activation pieces together first, as the gate/up does
        // (warp_gate_up_q4k_rows), was slower here: 76 -> 125 registers in mv_q4_K, lab
        // q_proj 9.5 -> 12.0 µs, S 2.1 Q4_K_M tg64 313.3 -> 299.8 t/s; session 27.)
        #pragma unroll
        for (int u = 0; u < Q4K_BATCH; u++) {
            int b = b0 + G * u;
            if (b < nb) acc = q4k_acc4(acc, l[u], g, a + (size_t)b * QK_K, bs + 16 * b, ad[b]);
        }
        b0 += G * Q4K_BATCH;
        if (b0 < nb) fetch(b0);
    }
    return acc;
}

template <int G>
__device__ __forceinline__ float group_dot_q4k(const u8* __restrict__ row, const u8* __restrict__ a, int cols) {
    return group_sum<G>(group_part_q4k<G>(row, a, cols));
}

// Warp dot of Q6_K row `row` (cols = 256 nb, 210-byte super-blocks) with the Q8_K
// activation row `a`; the result is in every lane. Eight lanes share a super-block (q6k_part)
// and each lane scales its own share of the integer sum by (d_a·d_w) instead of the eight
// lanes first adding theirs exactly: no shuffles inside the loop, so its iterations are
// independent and their loads can be in flight together (the exact-per-super-block variant
// ran at ~20–35% of the read floor on S 2.1 shapes). Rounding differs from the CPU's
// per-super-block float terms by a few ulp of each partial.
__device__ __forceinline__ float lane_part_q6k(const u8* __restrict__ row, const u8* __restrict__ a, int cols) {
    int lane = threadIdx.x & 31;
    int p = lane & 7;
    int nb = cols / QK_K;
    const float* ad = q8k_d(a, cols);
    const short* bs = q8k_bsums(a, cols);
    float acc = 0.0f;
    #pragma unroll 4
    for (int b = lane >> 3; b < nb; b += 4) {
        const u8* blk = row + (size_t)b * 210;
        int sumi = q6k_part(blk, p, a + (size_t)b * QK_K, bs + 16 * b);
        float d = f16_to_f32(__ldg((const unsigned short*)(blk + 208)));
        acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(ad[b], d), (float)sumi));
    }
    return acc;
}

__device__ __forceinline__ float warp_dot_q6k(const u8* __restrict__ row, const u8* __restrict__ a, int cols) {
    return warp_sum(lane_part_q6k(row, a, cols));
}

// Two Q6_K rows (a SwiGLU's gate and up) dotted with the same activation row in one loop,
// so both rows' loads are in flight together; each result is warp_dot_q6k's bit for bit.
__device__ __forceinline__ float2 warp_dot2_q6k(const u8* __restrict__ r0, const u8* __restrict__ r1,
                                                const u8* __restrict__ a, int cols) {
    int lane = threadIdx.x & 31;
    int p = lane & 7;
    int nb = cols / QK_K;
    const float* ad = q8k_d(a, cols);
    const short* bs = q8k_bsums(a, cols);
    float acc0 = 0.0f, acc1 = 0.0f;
    #pragma unroll 2
    for (int b = lane >> 3; b < nb; b += 4) {
        const u8* b0 = r0 + (size_t)b * 210;
        const u8* b1 = r1 + (size_t)b * 210;
        int si0 = q6k_part(b0, p, a + (size_t)b * QK_K, bs + 16 * b);
        int si1 = q6k_part(b1, p, a + (size_t)b * QK_K, bs + 16 * b);
        float d0 = f16_to_f32(__ldg((const unsigned short*)(b0 + 208)));
        float d1 = f16_to_f32(__ldg((const unsigned short*)(b1 + 208)));
        float da = ad[b];
        acc0 = __fadd_rn(acc0, __fmul_rn(__fmul_rn(da, d0), (float)si0));
        acc1 = __fadd_rn(acc1, __fmul_rn(__fmul_rn(da, d1), (float)si1));
    }
    return make_float2(warp_sum(acc0), warp_sum(acc1));
}

// Warp dot of Q8_0 row `row` (cols = 32 nb) with the Q8_0 activation row `a`: lane l takes
// blocks l, l + 32, ...; per block acc += sumi · (d_w · d_a), as the CPU's legacy_dot. Each
// lane fetches Q8_BATCH blocks' bytes (d and the aligned words covering the quants) before
// computing them, as warp_dot_q4k_rows does.
#define Q8_BATCH 4
// A Q8_0 weight block's bytes as fetched: d, and the nine aligned words covering its 32
// quants (blocks are 34 bytes, 2-byte aligned) with the shift that lines them up; q8_0_acc
// is its term. (lane_part_q8_0 below does the same inline: written through these two, its
// mat-vec and gate/up SASS differ only in an FMUL's operand order, but moe_down_q_q8_0's
// schedule changes (1,648 -> 1,584 SASS lines), not yet timed; so it stays as it is.)
struct Q8Win {
    u32 w[9];
    u32 sh;
    unsigned short d;
};

__device__ __forceinline__ Q8Win q8_0_fetch(const u8* __restrict__ blk) {
    Q8Win v;
    v.d = __ldg((const unsigned short*)blk);
    const u32* w = (const u32*)((size_t)(blk + 2) & ~(size_t)3);
    v.sh = 8u * (u32)((size_t)(blk + 2) & 3);
    #pragma unroll
    for (int k = 0; k < 9; k++) v.w[k] = __ldg(w + k);
    return v;
}

// acc + sumi · (d_w · d_a) of a fetched block against the activation block's quants (a0,
// a1) and its d (da).
__device__ __forceinline__ float q8_0_acc(float acc, const Q8Win& v, int4 a0, int4 a1, float da) {
    u32 w0[4], w1[4];
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        w0[k] = __funnelshift_r(v.w[k], v.w[k + 1], v.sh);
        w1[k] = __funnelshift_r(v.w[k + 4], v.w[k + 5], v.sh);
    }
    int s = dp4a4(w1, a1, dp4a4(w0, a0, 0));
    return __fadd_rn(acc, __fmul_rn((float)s, __fmul_rn(f16_to_f32(v.d), da)));
}

__device__ __forceinline__ float lane_part_q8_0(const u8* __restrict__ row, const u8* __restrict__ a, int cols) {
    int lane = threadIdx.x & 31;
    int nb = cols / QK;
    const float* ad = q8_0_d(a, cols);
    float acc = 0.0f;
    for (int b0 = lane; b0 < nb; b0 += 32 * Q8_BATCH) {
        u32 win[Q8_BATCH][9];
        unsigned short dw[Q8_BATCH];
        u32 sh[Q8_BATCH];
        #pragma unroll
        for (int i = 0; i < Q8_BATCH; i++) {
            int b = b0 + 32 * i;
            if (b < nb) {
                const u8* blk = row + (size_t)b * 34;
                dw[i] = __ldg((const unsigned short*)blk);
                const u32* w = (const u32*)((size_t)(blk + 2) & ~(size_t)3);
                sh[i] = 8u * (u32)((size_t)(blk + 2) & 3);
                #pragma unroll
                for (int k = 0; k < 9; k++) win[i][k] = __ldg(w + k);
            }
        }
        #pragma unroll
        for (int i = 0; i < Q8_BATCH; i++) {
            int b = b0 + 32 * i;
            if (b < nb) {
                u32 w0[4], w1[4];
                #pragma unroll
                for (int k = 0; k < 4; k++) {
                    w0[k] = __funnelshift_r(win[i][k], win[i][k + 1], sh[i]);
                    w1[k] = __funnelshift_r(win[i][k + 4], win[i][k + 5], sh[i]);
                }
                const int4* aq = (const int4*)(a + (size_t)b * QK);
                int s = dp4a4(w1, aq[1], dp4a4(w0, aq[0], 0));
                acc = __fadd_rn(acc, __fmul_rn((float)s, __fmul_rn(f16_to_f32(dw[i]), ad[b])));
            }
        }
    }
    return acc;
}

__device__ __forceinline__ float warp_dot_q8_0(const u8* __restrict__ row, const u8* __restrict__ a, int cols) {
    return warp_sum(lane_part_q8_0(row, a, cols));
}

// Gate and up Q8_0 rows against one Q8_0 activation (warp_dot2_q's Q8_0 case) when GU_Q8_PAIR
// (on by default; 0 keeps the two warp_dot_q8_0 calls): both rows' GU_Q8_BATCH blocks per
// lane fetched before any is computed, each block's activation read once for the two. Why:
// the SASS of moe_gate_up_q_q8_0 (two warp_dot_q8_0 calls) requests the up row's weights
// only after the gate row is computed and reduced, and reads each block's activation just
// before its dot, twice. Each row's terms and order are lane_part_q8_0's: the same sums.
// Measured on the H200 (session 28): 68 -> 92 registers; XS 2.1 Q8_0 (synth) tg64
// alternating, two rounds, 454.75 / 454.91 t/s against 453.20 / 453.19 (+0.35%, the runs'
// ranges apart); tests quantised_mat_vec, expert_gate_up, decode_graph_replay pass with it.
#ifndef GU_Q8_PAIR
#define GU_Q8_PAIR 1
#endif
#ifndef GU_Q8_BATCH
#define GU_Q8_BATCH 3
#endif
__device__ __forceinline__ float2 warp_dot2_q8_0(const u8* __restrict__ r0, const u8* __restrict__ r1,
                                                 const u8* __restrict__ a, int cols) {
    int lane = threadIdx.x & 31;
    int nb = cols / QK;
    const float* ad = q8_0_d(a, cols);
    float acc0 = 0.0f, acc1 = 0.0f;
    for (int b0 = lane; b0 < nb; b0 += 32 * GU_Q8_BATCH) {
        Q8Win v0[GU_Q8_BATCH], v1[GU_Q8_BATCH];
        #pragma unroll
        for (int i = 0; i < GU_Q8_BATCH; i++) {
            int b = b0 + 32 * i;
            if (b < nb) {
                v0[i] = q8_0_fetch(r0 + (size_t)b * 34);
                v1[i] = q8_0_fetch(r1 + (size_t)b * 34);
            }
        }
        #pragma unroll
        for (int i = 0; i < GU_Q8_BATCH; i++) {
            int b = b0 + 32 * i;
            if (b < nb) {
                const int4* aq = (const int4*)(a + (size_t)b * QK);
                int4 a0 = aq[0], a1 = aq[1];
                float da = ad[b];
                acc0 = q8_0_acc(acc0, v0[i], a0, a1, da);
                acc1 = q8_0_acc(acc1, v1[i], a0, a1, da);
            }
        }
    }
    return make_float2(warp_sum(acc0), warp_sum(acc1));
}

// ---- CT4 (compressed-tensors int4 in 32-element blocks, blocks.cuh block_ct4) against Q8_0 ----
// The CPU's pairing (cpu-experts/src/kernels/ct.rs): per block the exact Σ (c − 8)·q of the
// codes c with the activation quants q, times d_a, times the block's scale s; an asymmetric
// block then takes off s·(z·ds), ds = d_a·Σ q being the Q8_0 row's second per-block word
// (act.cuh). Σ c·q is four pairs of dp4a on the codes put back in element order (byte j of
// the codes holds elements 2j and 2j + 1 in its low and high nibbles), Σ q a dp4a of the
// quants with ones. Lane l takes blocks l, l + 32, ..., CT4_BATCH of them fetched before any
// is computed (five aligned words each: blocks are 20 bytes, 4-byte aligned). The float
// rounding differs from the CPU's by a few ulp per block (the CPU subtracts the zero-point
// terms of the whole row at its end).
#define CT4_BATCH 4

// A block's scale from its header word (bits 0-15, the scale dtype in bits 24-31).
__device__ __forceinline__ float ct4_scale(u32 h) {
    u32 bits = h & 0xFFFFu;
    return (h >> 24) == WT_BF16 ? __uint_as_float(bits << 16) : f16_to_f32((unsigned short)bits);
}

// ct4_block_dot against a block's activation quants already in registers (qa) with their sum
// sq = Σ q (ct4_qsum).
__device__ __forceinline__ float ct4_block_dot_q(const u32 w[5], const int qa[8], int sq, float da, float ds) {
    int sc = 0;
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        u32 lo = w[1 + k] & 0x0F0F0F0Fu, hi = (w[1 + k] >> 4) & 0x0F0F0F0Fu;
        sc = __dp4a((int)__byte_perm(lo, hi, 0x5140), qa[2 * k], sc);
        sc = __dp4a((int)__byte_perm(lo, hi, 0x7362), qa[2 * k + 1], sc);
    }
    float s = ct4_scale(w[0]);
    float v = __fmul_rn(s, __fmul_rn(da, (float)(sc - 8 * sq)));
    int z = (int)(signed char)((w[0] >> 16) & 0xFFu);
    return z != 0 ? __fsub_rn(v, __fmul_rn(s, __fmul_rn((float)z, ds))) : v;
}

// A Q8_0 block's 32 quants as eight words, and their sum.
__device__ __forceinline__ int ct4_quants(const u8* __restrict__ aqb, int qa[8]) {
    const int4* a4 = (const int4*)aqb;
    int4 a0 = a4[0], a1 = a4[1];
    qa[0] = a0.x, qa[1] = a0.y, qa[2] = a0.z, qa[3] = a0.w;
    qa[4] = a1.x, qa[5] = a1.y, qa[6] = a1.z, qa[7] = a1.w;
    int sq = 0;
    #pragma unroll
    for (int k = 0; k < 8; k++) sq = __dp4a(qa[k], 0x01010101, sq);
    return sq;
}

__device__ __forceinline__ float ct4_block_dot(const u32 w[5], const u8* __restrict__ aqb, float da, float ds) {
    int qa[8];
    int sq = ct4_quants(aqb, qa);
    return ct4_block_dot_q(w, qa, sq, da, ds);
}

// CT8 (compressed-tensors int8 in 32-element blocks, blocks.cuh block_ct8) against Q8_0: the
// same pairing with signed 8-bit codes, so Σ c·q is eight dp4a of the code words as they are
// (no offset to take off), then s·(d_a·Σ) less the zero point's s·(z·ds).
__device__ __forceinline__ float ct8_block_dot(const u32 w[9], const u8* __restrict__ aqb, float da, float ds) {
    const int4* a4 = (const int4*)aqb;
    int4 a0 = a4[0], a1 = a4[1];
    int qa[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    int sc = 0;
    #pragma unroll
    for (int k = 0; k < 8; k++) sc = __dp4a((int)w[1 + k], qa[k], sc);
    float s = ct4_scale(w[0]);
    float v = __fmul_rn(s, __fmul_rn(da, (float)sc));
    int z = (int)(signed char)((w[0] >> 16) & 0xFFu);
    return z != 0 ? __fsub_rn(v, __fmul_rn(s, __fmul_rn((float)z, ds))) : v;
}

// Block b's WORDS 4-byte words of a CT row: five for CT4 (blocks.cuh block_ct4: the header
// word, then the codes), nine for CT8. CT4's tried as one 16-byte code load and one scale load (a split layout's access
// pattern, lab switch CT4_SPLIT_LAB, session 39, S 2.1 W4A16 tg64 alternating, two rounds):
// 2-byte scales 259.27 / 259.28 t/s, 4-byte scales (the same bytes as now) 253.83 / 253.83,
// against 261.84 / 261.78 -- slower, as session 26's wide CT4 loads were; removed.
template <int WORDS>
__device__ __forceinline__ void ct_fetch(const u8* __restrict__ row, int b, u32 w[WORDS]) {
    const u32* p = (const u32*)(row + (size_t)b * (4 * WORDS));
    #pragma unroll
    for (int k = 0; k < WORDS; k++) w[k] = ldw(p + k);
}

// A lane's share of a CT4 (T = WT_CT4: 20-byte blocks, five words) or CT8 (WT_CT8: 36 bytes,
// nine words) row against a Q8_0 activation: blocks lane, lane + 32, ..., CT4_BATCH of them
// fetched before any is computed.
template <int T, bool WAIT = false>
__device__ __forceinline__ float lane_part_ct(const u8* __restrict__ row, const u8* __restrict__ a, int cols,
                                              AfterWait* aw = nullptr) {
    constexpr int WORDS = T == WT_CT8 ? 9 : 5;
    int lane = threadIdx.x & 31;
    int nb = cols / QK;
    const float* ad = q8_0_d(a, cols);
    const float* ads = ad + nb;
    float acc = 0.0f;
    u32 w[CT4_BATCH][WORDS];
    auto fetch = [&](int b0) {
        #pragma unroll
        for (int i = 0; i < CT4_BATCH; i++) {
            int b = b0 + 32 * i;
            if (b < nb) ct_fetch<WORDS>(row, b, w[i]);
        }
    };
    int b0 = lane;
    fetch(b0);
    if (WAIT) warp_pdl_wait(aw);
    while (b0 < nb) {
        #pragma unroll
        for (int i = 0; i < CT4_BATCH; i++) {
            int b = b0 + 32 * i;
            if (b < nb) {
                float p;
                if constexpr (T == WT_CT8) p = ct8_block_dot(w[i], a + (size_t)b * QK, ad[b], ads[b]);
                else p = ct4_block_dot(w[i], a + (size_t)b * QK, ad[b], ads[b]);
                acc = __fadd_rn(acc, p);
            }
        }
        b0 += 32 * CT4_BATCH;
        if (b0 < nb) fetch(b0);
    }
    return acc;
}
// Gate and up CT4 rows against one Q8_0 activation (warp_dot2_q's CT4 case): lane l takes
// blocks l, l + 32, ... of both rows, GU_CT4_BATCH of each fetched before any is computed,
// and each block's activation quants and their sum read once for the two rows. Each row's
// terms and their order are lane_part_ct's: the same sums as two lane_part_ct calls.
// Measured on the H200 (session 27, S 2.1 W4A16 tg64 alternating, two rounds): 248.21 /
// 248.16 t/s against 246.14 / 246.08 (+0.85%); the gate/up kernels take 66-72 registers
// against 50-64. GU_CT4_PAIR=0 (lab switch): the two lane_part_ct calls, one row after the
// other.
#ifndef GU_CT4_PAIR
#define GU_CT4_PAIR 1
#endif
#ifndef GU_CT4_BATCH
#define GU_CT4_BATCH 3
#endif
__device__ __forceinline__ float2 warp_dot2_ct4(const u8* __restrict__ r0, const u8* __restrict__ r1,
                                                const u8* __restrict__ a, int cols) {
    int lane = threadIdx.x & 31;
    int nb = cols / QK;
    const float* ad = q8_0_d(a, cols);
    const float* ads = ad + nb;
    float acc0 = 0.0f, acc1 = 0.0f;
    u32 w[2][GU_CT4_BATCH][5];
    auto fetch = [&](int b0) {
        #pragma unroll
        for (int i = 0; i < GU_CT4_BATCH; i++) {
            int b = b0 + 32 * i;
            if (b < nb) {
                ct_fetch<5>(r0, b, w[0][i]);
                ct_fetch<5>(r1, b, w[1][i]);
            }
        }
    };
    int b0 = lane;
    fetch(b0);
    while (b0 < nb) {
        #pragma unroll
        for (int i = 0; i < GU_CT4_BATCH; i++) {
            int b = b0 + 32 * i;
            if (b < nb && GU_MEMONLY) {
                const u32* x = w[0][i];
                const u32* y = w[1][i];
                acc0 += memonly_sum(x[0] ^ x[1] ^ x[2] ^ x[3] ^ x[4]);
                acc1 += memonly_sum(y[0] ^ y[1] ^ y[2] ^ y[3] ^ y[4]);
            } else if (b < nb) {
                int qa[8];
                int sq = ct4_quants(a + (size_t)b * QK, qa);
                float da = ad[b], ds = ads[b];
                acc0 = __fadd_rn(acc0, ct4_block_dot_q(w[0][i], qa, sq, da, ds));
                acc1 = __fadd_rn(acc1, ct4_block_dot_q(w[1][i], qa, sq, da, ds));
            }
        }
        b0 += 32 * GU_CT4_BATCH;
        if (b0 < nb) fetch(b0);
    }
    return make_float2(warp_sum(acc0), warp_sum(acc1));
}

// ---- BF16 / F16 against the f32 activation itself ----
// No quantisation: `a` is the f32 input row. Lane l takes the 8-element (16-byte) pieces
// l, l + 32, ... of the row, H_BATCH of them fetched before any is used (a 3072-wide bf16 row
// is 12 pieces per lane: two rounds of 6). Widening bf16/f16 to f32 is exact; the products
// are f32 FMAs, so the sum differs from the CPU's only in order (the batch size does not
// change it). Rows 16-byte aligned, cols % 8 == 0.
// H_BATCH 6 (was 8) measured on the H200 (session 39, S 2.1 W4A16 tg64 alternating, two
// rounds, DOWN_BATCH 4 in both): 268.16 / 268.23 t/s against 265.04 / 265.08 (+1.2%); 12
// (one round) was slower in the sweep before (259.2 against 260.7). The Q/K/V/gate kernel
// `mv_rinv_bf16` takes 63 registers instead of 71 (eight blocks per SM instead of seven);
// `mv_stage_bf16` (the O projection) keeps 80 but asks for fewer pieces before its wait,
// while the attention runs. Q4_K_M (float products only in its router and shared pieces) was
// not re-measured.
#ifndef H_BATCH
#define H_BATCH 6
#endif
// H_MEMONLY=1 (lab switch, off; wrong outputs): lane_parts_h -- under the float mat-vecs that
// read their activation row from global memory (the Q/K/V/gate `mv_rinv_*`, and `mv_bf16` /
// `mv_f16` and the other kernels that take lane_part_h; not the O projection's ring or the
// shared expert's HRowPart) -- keeps its weight loads and replaces the activation reads and
// the FMAs with GU_MEMONLY's checksum, so a run shows what the loads alone stream. Why:
// session 38's ncu had the 617 MB lm_head at 3.52 TB/s, ~76% of the read floor, where no ramp
// or tail can matter, and the Q/K/V/gate at 3.24; this splits the access pattern's share of
// that from the arithmetic's. Written in session 40, not yet measured (which kernel runs the
// lm_head is to be read off the trace first).
#ifndef H_MEMONLY
#define H_MEMONLY 0
#endif

template <int T>
__device__ __forceinline__ float h_lo(u32 w) {
    if constexpr (T == WT_BF16) return __uint_as_float(w << 16);
    else return f16_to_f32((unsigned short)(w & 0xFFFFu));
}

template <int T>
__device__ __forceinline__ float h_hi(u32 w) {
    if constexpr (T == WT_BF16) return __uint_as_float(w & 0xFFFF0000u);
    else return f16_to_f32((unsigned short)(w >> 16));
}

template <int T>
__device__ __forceinline__ float h_dot8(const uint4& w, const float4& x0, const float4& x1, float acc) {
    acc = fmaf(h_lo<T>(w.x), x0.x, acc);
    acc = fmaf(h_hi<T>(w.x), x0.y, acc);
    acc = fmaf(h_lo<T>(w.y), x0.z, acc);
    acc = fmaf(h_hi<T>(w.y), x0.w, acc);
    acc = fmaf(h_lo<T>(w.z), x1.x, acc);
    acc = fmaf(h_hi<T>(w.z), x1.y, acc);
    acc = fmaf(h_lo<T>(w.w), x1.z, acc);
    return fmaf(h_hi<T>(w.w), x1.w, acc);
}

// The lane's shares of R float rows (R = 1 or 2: a row, or gate and up) against one f32
// activation, not reduced: warp w of W on the rows takes pieces of 8 elements w·32 + lane,
// (w + W)·32 + lane, ..., B pieces per row fetched (all rows' pieces in flight together)
// before any is added, each piece's activation read once for all R rows. WAIT: the first
// fetch goes out before the kernel's pdl_wait (weights are never written by a kernel).
// NORM (mv_norm_multi): `a` is the RMSNorm's input x and g its gain; each piece's x is
// multiplied by g before the dots and *ss gets the lane's sum of squares of x (the caller
// scales the reduced dot by the norm's 1 / rms).
template <int T, int R, int W, int B, bool WAIT, bool NORM = false>
__device__ __forceinline__ void lane_parts_h(const u8* const __restrict__ rows[R], const u8* __restrict__ a,
                                             int cols, int w, float acc[R], AfterWait* aw = nullptr,
                                             const float* __restrict__ g = nullptr, float* ss = nullptr) {
    int lane = threadIdx.x & 31;
    const float4* x4 = (const float4*)a;
    float sq = 0.0f;
    int n8 = cols / 8;
    uint4 wv[R][B];
    #pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    auto fetch = [&](int i0) {
        #pragma unroll
        for (int u = 0; u < B; u++) {
            int i = i0 + 32 * W * u;
            if (i < n8) {
                #pragma unroll
                for (int r = 0; r < R; r++) wv[r][u] = ldw4((const uint4*)rows[r] + i);
            }
        }
    };
    int i0 = 32 * w + lane;
    fetch(i0);
    if (WAIT) warp_pdl_wait(aw);
    while (i0 < n8) {
        #pragma unroll
        for (int u = 0; u < B; u++) {
            int i = i0 + 32 * W * u;
            if (i < n8 && H_MEMONLY) {
                #pragma unroll
                for (int r = 0; r < R; r++) {
                    const uint4& v = wv[r][u];
                    acc[r] += memonly_sum(v.x ^ v.y ^ v.z ^ v.w);
                }
            } else if (i < n8) {
                float4 x0 = x4[2 * i], x1 = x4[2 * i + 1];
                if constexpr (NORM) {
                    const float4* g4 = (const float4*)g;
                    float4 g0 = __ldg(g4 + 2 * i), g1 = __ldg(g4 + 2 * i + 1);
                    sq = fmaf(x0.x, x0.x, fmaf(x0.y, x0.y, fmaf(x0.z, x0.z, fmaf(x0.w, x0.w, sq))));
                    sq = fmaf(x1.x, x1.x, fmaf(x1.y, x1.y, fmaf(x1.z, x1.z, fmaf(x1.w, x1.w, sq))));
                    x0 = make_float4(x0.x * g0.x, x0.y * g0.y, x0.z * g0.z, x0.w * g0.w);
                    x1 = make_float4(x1.x * g1.x, x1.y * g1.y, x1.z * g1.z, x1.w * g1.w);
                }
                #pragma unroll
                for (int r = 0; r < R; r++) acc[r] = h_dot8<T>(wv[r][u], x0, x1, acc[r]);
            }
        }
        i0 += 32 * W * B;
        if (i0 < n8) fetch(i0);
    }
    if constexpr (NORM) *ss = sq;
}

// A lane's share of one float row, one warp on the row, H_BATCH pieces in flight.
template <int T, bool WAIT = false>
__device__ __forceinline__ float lane_part_h(const u8* __restrict__ row, const u8* __restrict__ a, int cols,
                                             AfterWait* aw = nullptr) {
    const u8* rows[1] = {row};
    float acc[1];
    lane_parts_h<T, 1, 1, H_BATCH, WAIT>(rows, a, cols, 0, acc, aw);
    return acc[0];
}

// lane_part_h split in two: `load` issues the lane's first B pieces of a row (weights only,
// so it may run before pdl_wait), `finish` adds them against the activation and streams the
// rest of the row B pieces at a time. Same terms in the same order as lane_part_h (whose
// batch is H_BATCH; B changes only how many loads are in flight, not the sum).
template <int T, int B>
struct HRowPart {
    uint4 w[B];
    __device__ __forceinline__ void load(const u8* __restrict__ row, int cols) {
        int lane = threadIdx.x & 31;
        const uint4* w4 = (const uint4*)row;
        int n8 = cols / 8;
        #pragma unroll
        for (int u = 0; u < B; u++) {
            int i = lane + 32 * u;
            if (i < n8) w[u] = ldw4(w4 + i);
        }
    }
    __device__ __forceinline__ float finish(const u8* __restrict__ row, const u8* __restrict__ a, int cols) {
        int lane = threadIdx.x & 31;
        const uint4* w4 = (const uint4*)row;
        const float4* x4 = (const float4*)a;
        int n8 = cols / 8;
        float acc = 0.0f;
        int i0 = lane;
        while (i0 < n8) {
            #pragma unroll
            for (int u = 0; u < B; u++) {
                int i = i0 + 32 * u;
                if (i < n8) acc = h_dot8<T>(w[u], x4[2 * i], x4[2 * i + 1], acc);
            }
            i0 += 32 * B;
            if (i0 < n8) load(row + (size_t)(i0 - lane) * 16, cols - (i0 - lane) * 8);
        }
        return acc;
    }
};

// Warp w's share (of W warps on one row pair) of two float rows (gate and up) against one
// activation, reduced over the warp: it takes pieces w·32 + lane, (w + W)·32 + lane, ..., both
// rows' pieces in flight together. W = 1: one warp per row pair (warp_dot2_q). W > 1 lets a
// short matrix (a shared expert's 1024 rows) put W warps per row in flight, the caller adding
// the warps' sums (one warp per row gave 256 blocks for 132 SMs at 1024 rows: 0.98 TB/s,
// H200).
template <int T, int W, bool WAIT = false>
__device__ __forceinline__ float2 warp_parts2_h(const u8* __restrict__ r0, const u8* __restrict__ r1,
                                                const u8* __restrict__ a, int cols, int w) {
    const u8* rows[2] = {r0, r1};
    float acc[2];
    lane_parts_h<T, 2, W, H_BATCH / 2, WAIT>(rows, a, cols, w, acc);
    return make_float2(warp_sum(acc[0]), warp_sum(acc[1]));
}

// Warp w's share (of W warps on one row) of a float row against the f32 activation, not
// reduced: warp_parts2_h for a single row (pieces w·32 + lane, (w + W)·32 + lane, ...).
template <int T, int W, bool WAIT = false>
__device__ __forceinline__ float lane_part_h_split(const u8* __restrict__ row, const u8* __restrict__ a, int cols,
                                                   int w) {
    const u8* rows[1] = {row};
    float acc[1];
    lane_parts_h<T, 1, W, H_BATCH / 2, WAIT>(rows, a, cols, w, acc);
    return acc[0];
}

// Four grid magnitudes (bytes of g) with their signs applied: bit j of s4 negates byte j
// (the bit spread to a 0x00/0xFF byte mask, then (g ^ m) - m per byte).
__device__ __forceinline__ int iq_signed4(u32 g, u32 s4) {
    u32 m = ((s4 * 0x00204081u) & 0x01010101u) * 0xFFu;
    return (int)__vsub4(g ^ m, m);
}

// The integer sum of sub-block ib (32 weights) of a grid-IQ super-block blk against its 32
// activation bytes x0, x1, as the CPU's vec_dot_*_q8k adds it (ggml's
// ggml_vec_dot_*_q8_K): each 8-weight run's grid magnitudes signed and dotted by dp4a, times
// the run's scale 2 s + 1, exactly.
// IQ3_XXS (98 B: d, 64 grid-index bytes, then per sub-block a word of four 7-bit sign indices
// and a 4-bit scale): run l takes grid points qs[8 ib + 2 l], qs[8 ib + 2 l + 1] (4 magnitudes
// each) and signs ksigns[(a >> 7 l) & 127]. IQ2_XXS (66 B: d, then per sub-block 4 grid
// indices and that word): run l takes grid point qs[l] (8 magnitudes). IQ2_S (82 B: d, 32 low
// index bytes, 32 sign bytes, 8 qh bytes, 8 scale bytes): run l takes grid point
// qs[4 ib + l] | (qh >> 2 l & 3) << 8, sign byte signs[4 ib + l], scale nibble l / 2.
// Word i (0..7, a constant once unrolled) of the 32 activation bytes x0, x1.
__device__ __forceinline__ int iq_x(int4 x0, int4 x1, int i) {
    int4 x = i < 4 ? x0 : x1;
    return (i & 3) == 0 ? x.x : (i & 3) == 1 ? x.y : (i & 3) == 2 ? x.z : x.w;
}

template <int T>
__device__ __forceinline__ int iq_sub_sum(const u8* __restrict__ blk, int ib, int4 x0, int4 x1) {
    if constexpr (T == WT_IQ3_XXS) {
        u32 q0 = ld_u32_a2(blk + 2 + 8 * ib), q1 = ld_u32_a2(blk + 6 + 8 * ib);
        u32 aw = ld_u32_a2(blk + 66 + 4 * ib);
        int s = 0;
        #pragma unroll
        for (int l = 0; l < 4; l++) {
            u32 signs = __ldg(&ksigns_iq2xs[(aw >> (7 * l)) & 127]);
            u32 w = (l < 2 ? q0 : q1) >> (16 * (l & 1));
            u32 g0 = __ldg(&iq3xxs_grid[w & 0xFF]), g1 = __ldg(&iq3xxs_grid[(w >> 8) & 0xFF]);
            s = __dp4a(iq_signed4(g0, signs & 0xF), iq_x(x0, x1, 2 * l), s);
            s = __dp4a(iq_signed4(g1, signs >> 4), iq_x(x0, x1, 2 * l + 1), s);
        }
        return (2 * (int)(aw >> 28) + 1) * s;
    } else if constexpr (T == WT_IQ2_XXS) {
        u32 qw = ld_u32_a2(blk + 2 + 8 * ib), aw = ld_u32_a2(blk + 6 + 8 * ib);
        int s = 0;
        #pragma unroll
        for (int l = 0; l < 4; l++) {
            u32 signs = __ldg(&ksigns_iq2xs[(aw >> (7 * l)) & 127]);
            unsigned long long p = __ldg(&iq2xxs_grid[(qw >> (8 * l)) & 0xFF]);
            s = __dp4a(iq_signed4((u32)p, signs & 0xF), iq_x(x0, x1, 2 * l), s);
            s = __dp4a(iq_signed4((u32)(p >> 32), signs >> 4), iq_x(x0, x1, 2 * l + 1), s);
        }
        return (2 * (int)(aw >> 28) + 1) * s;
    } else {
        u32 qw = ld_u32_a2(blk + 2 + 4 * ib), sw = ld_u32_a2(blk + 34 + 4 * ib);
        u32 qh = blk[66 + ib], sc = blk[74 + ib];
        int sumi = 0;
        #pragma unroll
        for (int l = 0; l < 4; l++) {
            u32 idx = ((qw >> (8 * l)) & 0xFF) | (((qh >> (2 * l)) & 3) << 8);
            unsigned long long p = __ldg(&iq2s_grid[idx]);
            u32 sb = (sw >> (8 * l)) & 0xFF;
            int s = __dp4a(iq_signed4((u32)p, sb & 0xF), iq_x(x0, x1, 2 * l), 0);
            s = __dp4a(iq_signed4((u32)(p >> 32), sb >> 4), iq_x(x0, x1, 2 * l + 1), s);
            u32 ls = l < 2 ? (sc & 0xF) : (sc >> 4);
            sumi += (2 * (int)ls + 1) * s;
        }
        return sumi;
    }
}

// A lane's share of a grid-IQ row (IQ3_XXS, IQ2_XXS, IQ2_S) dotted with the Q8_K activation
// a: lane (b % 4, ib) takes sub-block ib of super-blocks b = lane / 8, + 4, ...; its integer
// sum (iq_sub_sum) times (d_w · d_a), and the CPU's final factor (1/4 for IQ3_XXS, 1/8 for
// the IQ2 types). Each lane scales its own sub-block's sum instead of the super-block's
// (lane_part_q6k's reason): the rounding differs from the CPU's by a few ulp.
template <int T>
__device__ __forceinline__ float lane_part_iq(const u8* __restrict__ row, const u8* __restrict__ a, int cols) {
    constexpr int BYTES = T == WT_IQ3_XXS ? 98 : T == WT_IQ2_XXS ? 66 : 82;
    int lane = threadIdx.x & 31;
    int ib = lane & 7;
    int nb = cols / QK_K;
    const float* ad = q8k_d(a, cols);
    float acc = 0.0f;
    #pragma unroll 2
    for (int b = lane >> 3; b < nb; b += 4) {
        const u8* blk = row + (size_t)b * BYTES;
        float d = f16_to_f32(__ldg((const unsigned short*)blk));
        const int4* qa = (const int4*)(a + (size_t)b * QK_K + 32 * ib);
        int4 x0 = qa[0], x1 = qa[1];
        int sumi = iq_sub_sum<T>(blk, ib, x0, x1);
        acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(d, ad[b]), (float)sumi));
    }
    return __fmul_rn(acc, T == WT_IQ3_XXS ? 0.25f : 0.125f);
}

// ---- Q5_K and IQ4_XS against Q8_K ----
// Both take lane_part_iq's split: lane (b % 4, ib) takes sub-block ib (32 weights) of
// super-blocks b = lane / 8, + 4, ..., and scales its own exact integer sum (lane_part_q6k's
// reason: no shuffles in the loop; the rounding differs from the CPU's per-super-block terms
// by a few ulp).
//
// Q5_K (176 B: d, dmin, Q4_K's 12 scale bytes, qh[32], qs[128]; vec_dot_q5k_q8k in
// cpu-experts/src/kernels/scalar.rs): element l of sub-block ib has its low four bits in
// nibble ib % 2 of qs[32 (ib / 2) + l] and its fifth bit in bit ib of qh[l]; with the
// sub-block's 6-bit scale sc and min m, sumi = sc Σ q a and summ = m (bsum[2 ib] +
// bsum[2 ib + 1]) (the Q8_K sums of its two 16-element halves), and the lane adds
// (d_a d) sumi − (d_a dmin) summ, k_dot's terms for one sub-block.
__device__ __forceinline__ float lane_part_q5k(const u8* __restrict__ row, const u8* __restrict__ a, int cols) {
    int lane = threadIdx.x & 31;
    int ib = lane & 7;
    int nb = cols / QK_K;
    const float* ad = q8k_d(a, cols);
    const short* bs = q8k_bsums(a, cols);
    float acc = 0.0f;
    #pragma unroll 2
    for (int b = lane >> 3; b < nb; b += 4) {
        const u8* blk = row + (size_t)b * 176;
        uint4 hd = ldw4(blk), h0 = ldw4(blk + 16), h1 = ldw4(blk + 32);
        uint4 q0 = ldw4(blk + 48 + 32 * (ib >> 1)), q1 = ldw4(blk + 64 + 32 * (ib >> 1));
        const int4* qa = (const int4*)(a + (size_t)b * QK_K + 32 * ib);
        int4 x0 = qa[0], x1 = qa[1];
        u32 q[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        u32 h[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        int ns = 4 * (ib & 1), s = 0;
        #pragma unroll
        for (int k = 0; k < 8; k++) {
            u32 v = ((q[k] >> ns) & 0x0F0F0F0Fu) | (((h[k] >> ib) & 0x01010101u) << 4);
            s = __dp4a((int)v, iq_x(x0, x1, k), s);
        }
        int sc, m;
        q4k_scale_min(hd, ib, &sc, &m);
        int summ = m * ((int)bs[16 * b + 2 * ib] + (int)bs[16 * b + 2 * ib + 1]);
        float d = f16_to_f32((unsigned short)(hd.x & 0xFFFF));
        float dmin = f16_to_f32((unsigned short)(hd.x >> 16));
        float da = ad[b];
        acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(da, d), (float)(sc * s)));
        acc = __fsub_rn(acc, __fmul_rn(__fmul_rn(da, dmin), (float)summ));
    }
    return acc;
}

// Four IQ4_NL codebook values (int8, packed) for the four indices 0..15 in the low nibbles of
// v's bytes: byte permutes of the codebook's low and high eight bytes by the indices' low
// three bits, then bit 3 picks between them.
__device__ __forceinline__ int iq4nl_lut4(u32 v) {
    u32 s = v & 0x07070707u;
    u32 sel = (s & 0xFu) | ((s >> 4) & 0xF0u) | ((s >> 8) & 0xF00u) | ((s >> 12) & 0xF000u);
    u32 lo = __byte_perm(IQ4NL_W0, IQ4NL_W1, sel), hi = __byte_perm(IQ4NL_W2, IQ4NL_W3, sel);
    u32 m = ((v >> 3) & 0x01010101u) * 0xFFu;
    return (int)((lo & ~m) | (hi & m));
}

// IQ4_XS (136 B, 8-byte aligned: d, scales_h:u16, scales_l[4], qs[128]; vec_dot_iq4_xs_q8k
// in cpu-experts/src/kernels/scalar/iq.rs): sub-block ib's scale is ls − 32 (ls: nibble ib % 2
// of scales_l[ib / 2], bits 2 ib of scales_h above it); its element j < 16 is the codebook
// value of the low nibble of qs[16 ib + j], element j + 16 that of the high nibble. The lane
// adds (d_w d_a) (ls − 32) Σ q a (the CPU's factor is 1).
__device__ __forceinline__ float lane_part_iq4xs(const u8* __restrict__ row, const u8* __restrict__ a, int cols) {
    int lane = threadIdx.x & 31;
    int ib = lane & 7;
    int nb = cols / QK_K;
    const float* ad = q8k_d(a, cols);
    float acc = 0.0f;
    #pragma unroll 2
    for (int b = lane >> 3; b < nb; b += 4) {
        const u8* blk = row + (size_t)b * 136;
        uint2 hd = __ldcs((const uint2*)blk);
        uint2 q0 = __ldcs((const uint2*)(blk + 8 + 16 * ib)), q1 = __ldcs((const uint2*)(blk + 16 + 16 * ib));
        const int4* qa = (const int4*)(a + (size_t)b * QK_K + 32 * ib);
        int4 x0 = qa[0], x1 = qa[1];
        u32 q[4] = {q0.x, q0.y, q1.x, q1.y};
        int s = 0;
        #pragma unroll
        for (int k = 0; k < 4; k++) {
            s = __dp4a(iq4nl_lut4(q[k] & 0x0F0F0F0Fu), iq_x(x0, x1, k), s);
            s = __dp4a(iq4nl_lut4((q[k] >> 4) & 0x0F0F0F0Fu), iq_x(x0, x1, 4 + k), s);
        }
        int ls = (int)((hd.y >> (8 * (ib >> 1) + 4 * (ib & 1))) & 0xFu) | (int)(((hd.x >> (16 + 2 * ib)) & 3u) << 4);
        float d = f16_to_f32((unsigned short)(hd.x & 0xFFFF));
        acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(d, ad[b]), (float)((ls - 32) * s)));
    }
    return acc;
}

// Dispatch by weight type: the K-quants, IQ4_XS and the grid IQ types against Q8_K, Q8_0, CT4 and CT8 against Q8_0,
// BF16/F16 against the f32 activation.
template <int T>
__device__ __forceinline__ float warp_dot_q(const u8* __restrict__ row, const u8* __restrict__ a, int cols) {
    if constexpr (T == WT_Q8_0) return warp_dot_q8_0(row, a, cols);
    else if constexpr (T == WT_CT4 || T == WT_CT8) return warp_sum(lane_part_ct<T>(row, a, cols));
    else if constexpr (T == WT_BF16 || T == WT_F16) return warp_sum(lane_part_h<T>(row, a, cols));
    // Q4_K rows on their own (mv_multi, the generic down loop): four lanes per super-block
    // (kernel lab, H200: Q projection 9216x3072 18.1 -> 9.5 us, lm_head shape 152 -> 61 us
    // against the eight-lane loop; the pair kernels below keep warp_dot_q4k_rows<2>, which
    // measured faster for gate/up: 17.1 us against 19.6 with half warps of four-lane groups).
    else if constexpr (T == WT_Q4_K) return group_dot_q4k<8>(row, a, cols);
    else if constexpr (T == WT_IQ3_XXS || T == WT_IQ2_XXS || T == WT_IQ2_S) return warp_sum(lane_part_iq<T>(row, a, cols));
    else if constexpr (T == WT_Q5_K) return warp_sum(lane_part_q5k(row, a, cols));
    else if constexpr (T == WT_IQ4_XS) return warp_sum(lane_part_iq4xs(row, a, cols));
    else return warp_dot_q6k(row, a, cols);
}

// A lane's share of warp_dot_q (the warp's sum of these is warp_dot_q's result): for callers
// that add several products' shares per lane and reduce the warp once.
template <int T>
__device__ __forceinline__ float lane_part_q(const u8* __restrict__ row, const u8* __restrict__ a, int cols) {
    if constexpr (T == WT_Q8_0) return lane_part_q8_0(row, a, cols);
    else if constexpr (T == WT_CT4 || T == WT_CT8) return lane_part_ct<T>(row, a, cols);
    else if constexpr (T == WT_BF16 || T == WT_F16) return lane_part_h<T>(row, a, cols);
    else if constexpr (T == WT_Q4_K) return group_part_q4k<8>(row, a, cols);
    else if constexpr (T == WT_IQ3_XXS || T == WT_IQ2_XXS || T == WT_IQ2_S) return lane_part_iq<T>(row, a, cols);
    else if constexpr (T == WT_Q5_K) return lane_part_q5k(row, a, cols);
    else if constexpr (T == WT_IQ4_XS) return lane_part_iq4xs(row, a, cols);
    else return lane_part_q6k(row, a, cols);
}

// lane_part_q for a kernel's first product, with the kernel's pdl_wait inside: the lane's
// first batch of weight loads is issued before the wait (weights are never written by a
// kernel), so under programmatic launch a mat-vec whose blocks take their places while the
// kernel before still runs has its first weights in flight when that kernel ends, instead of
// starting its reads then. Types whose loops do not take WAIT wait first.
template <int T>
__device__ __forceinline__ float lane_part_waiting(const u8* __restrict__ row, const u8* __restrict__ a, int cols,
                                                  AfterWait* aw = nullptr) {
    if constexpr (T == WT_CT4 || T == WT_CT8) return lane_part_ct<T, true>(row, a, cols, aw);
    else if constexpr (T == WT_BF16 || T == WT_F16) return lane_part_h<T, true>(row, a, cols, aw);
    else if constexpr (T == WT_Q4_K) return group_part_q4k<8, true>(row, a, cols, aw);
    else {
        warp_pdl_wait(aw);
        return lane_part_q<T>(row, a, cols);
    }
}

// GU_Q4K_HALVES=1 (lab switch, LAGOON_CUDA_DEFINES): a Q4_K gate/up row pair on half warps
// with four lanes per super-block instead of warp_dot_q4k_rows<2>'s eight. Measured slower
// on the H200 (session 26; kernel_lab S 2.1 gate/up 18.7 against 17.4 µs, tg64 294.2 against
// 302.6 t/s). ncu of one launch: L1/TEX throughput 76% against 39% (Mem Busy 62% against
// 33%), DRAM 39% against 44%, at 44% occupancy against 25%. A four-lane lane's three 16-byte
// loads per super-block put eight super-blocks, ~10 L1 lines, in each warp instruction where
// the eight-lane form's two loads cover four: the L1 is then the limit, not the issue rate.
// (A repacked layout with each instruction's pieces contiguous would remove that.)
#ifndef GU_Q4K_HALVES
#define GU_Q4K_HALVES 0
#endif

// Gate and up rows against one activation: the Q4_K / Q6_K pair loops, or two Q8_0 dots.
template <int T>
__device__ __forceinline__ float2 warp_dot2_q(const u8* __restrict__ r0, const u8* __restrict__ r1,
                                              const u8* __restrict__ a, int cols) {
    if constexpr (T == WT_Q8_0) {
        if (GU_Q8_PAIR) return warp_dot2_q8_0(r0, r1, a, cols);
        return make_float2(warp_dot_q8_0(r0, a, cols), warp_dot_q8_0(r1, a, cols));
    }
    else if constexpr (T == WT_CT4 || T == WT_CT8) {
        // (A version fetching both rows' blocks before computing either, 79 registers
        // against 48, measured no faster: gate/up 789 -> 810 µs per S 2.1 token, H200.
        // warp_dot2_ct4 also reads each block's activation once for both rows.)
        if constexpr (T == WT_CT4) {
            if (GU_CT4_PAIR) return warp_dot2_ct4(r0, r1, a, cols);
        }
        float p0 = lane_part_ct<T>(r0, a, cols), p1 = lane_part_ct<T>(r1, a, cols);
        return make_float2(warp_sum(p0), warp_sum(p1));
    }
    else if constexpr (T == WT_BF16 || T == WT_F16) return warp_parts2_h<T, 1>(r0, r1, a, cols, 0);
    else if constexpr (T == WT_Q4_K) {
        if (GU_Q4K_HALVES) {
            // Half warp h on row h, four lanes per super-block (group_part_q4k<4>): fewer
            // instructions (70 registers against 118) but slower, see GU_Q4K_HALVES.
            int half = (threadIdx.x >> 4) & 1;
            float s = group_sum<4>(group_part_q4k<4>(half ? r1 : r0, a, cols));
            return make_float2(__shfl_sync(0xffffffffu, s, 0), __shfl_sync(0xffffffffu, s, 16));
        }
        const u8* rows[2] = {r0, r1};
        float y[2];
        warp_dot_q4k_rows<2>(rows, a, cols, y);
        return make_float2(y[0], y[1]);
    }
    else if constexpr (T == WT_IQ3_XXS || T == WT_IQ2_XXS || T == WT_IQ2_S || T == WT_Q5_K || T == WT_IQ4_XS) {
        float p0 = lane_part_q<T>(r0, a, cols), p1 = lane_part_q<T>(r1, a, cols);
        return make_float2(warp_sum(p0), warp_sum(p1));
    }
    else return warp_dot2_q6k(r0, r1, a, cols);
}
