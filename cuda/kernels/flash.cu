// Tensor-core causal (optionally sliding-window) GQA attention for prefill steps, head_dim
// 128: flash-attention-2 style tiling over the KV rings of attention.cu.
//
// Scalar pseudo-code (lagoon_core::ops::attention): query position p = pos0 + t of head h
// sees keys j with first <= j <= p (first = max(0, p + 1 - window) on sliding layers);
// out = softmax(q . k_j / sqrt(d)) . v_j with the KV head h / (hq / n_kv).
//
// A block of 4 warps takes FA_BQ = 64 consecutive queries of one head; warp w owns queries
// 16 w .. 16 w + 16, held in registers as f16 mma A-fragments. Keys and values stream
// through shared memory 64 at a time as f16 [key][d] rows (padded to 272 bytes, so the eight
// rows of an ldmatrix phase fall on distinct banks); the warps read their B fragments with
// ldmatrix (K) and ldmatrix.trans (V). With a 16-bit cache (f16 or bf16) the tiles are
// copied by cp.async into two buffers, the next tile's copies in flight while the current one
// computes (keys past the step's last position zero-filled; a bf16 tile converted to f16 in
// place when it lands); with the f32 cache each tile is converted on the way in. Per key tile the warp computes
// S = Q K^T (f32 accumulation), masks it, updates the running row max and sum in f32 (base-2
// exponentials of log2(e)-scaled scores), rounds P to f16 and accumulates P V in f32 — the
// accumulator layout of S is the A-fragment layout of P, so P never leaves registers (after
// FlashAttention-2, Dao 2023, section 3). Queries and keys/values are rounded to f16
// (finite values beyond f16's range saturate), so results differ from the f32 kernel by
// about f16 rounding (~1e-3 relative); the reference path keeps attention.cu.
#include "merge.cuh"
#include "qk_rope.cuh"
#include "tc.cuh"

#define FA_D 128
#define FA_BQ 64
#define FA_BK 64
// Query heads per KV head in attention_decode_gqa (the rows of one m16 tile).
#define FA_GQA_MAX_G 16
#define FA_KLD (FA_D + 8)
// One buffer: K and V tiles of FA_BK rows of FA_KLD halves (manifest.rs FLASH_SMEM: two
// buffers for a 16-bit cache, one for the f32 cache).
#define FA_TILE_HALVES (2 * FA_BK * FA_KLD)
// The q8_0 cache's raw tiles, after the one f16 tile buffer (manifest.rs FLASH_SMEM_Q8): two
// stages of K then V quants (FA_BK rows of FA_Q8_LD bytes: 128 and 16 of padding, so a
// thread's 16-byte reads of its half-row spread over the banks), then K and V scales
// (FA_BK rows of 4 f16).
#define FA_Q8_LD (FA_D + 16)
#define FA_Q8_STAGE (2 * FA_BK * FA_Q8_LD + 2 * FA_BK * (FA_D / 32) * 2)

__device__ __forceinline__ u32 fa_pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(f16_sat(lo), f16_sat(hi));
    return *(u32*)&h;
}

__device__ __forceinline__ void fa_mma(float d[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ldmatrix.x4.trans: as ldmatrix_x4, each 8x8 matrix delivered transposed (lane l receives
// rows 2 (l % 4), + 1 of column l / 4).
__device__ __forceinline__ void fa_ldsm_t(u32 r[4], const unsigned short* p) {
    u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// A 16-byte cp.async that writes zeros instead when !valid (src-size 0; src is not read).
__device__ __forceinline__ void fa_cp16(void* dst, const void* src, bool valid) {
    u32 s = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

// A 16-bit cache (f16 or bf16) is staged by cp.async, as it is; a bf16 tile is then
// converted to f16 in place (fa_bf16_to_f16) once its copies have landed.
template <typename KV> __device__ constexpr bool fa_async() { return Kv<KV>::F16 || Kv<KV>::BF16; }

// Stages keys kb .. kb + FA_BK (ring rows j % cap; keys past p_last as zeros) into buf: K
// then V, [key][d] rows of the cache's 16-bit values. A 16-bit cache is copied by cp.async
// (the caller commits and waits); an f32 cache is loaded, rounded to f16 and stored.
template <typename KV>
__device__ __forceinline__ void fa_stage(unsigned short* buf, const KV* __restrict__ kc, const KV* __restrict__ vc,
                                         int kb, int p_last, int cap, int row, int kvh, int tid) {
    if constexpr (fa_async<KV>()) {
        // 64 keys x 16 chunks of 8 halves, K and V: thread t copies chunk t % 16 of keys
        // t / 16 + 8 m (m < 8). Ring rows from one modulo per tile.
        int ch = tid & 15, k0 = tid >> 4, r0 = kb % cap;
        #pragma unroll
        for (int m = 0; m < FA_BK / 8; m++) {
            int key = k0 + 8 * m, j = kb + key;
            bool ok = j <= p_last;
            int r = r0 + key;
            r = r < cap ? r : cap >= FA_BK ? r - cap : r % cap;
            size_t off = (size_t)r * row + (size_t)kvh * FA_D + 8 * ch;
            unsigned short* dst = buf + key * FA_KLD + 8 * ch;
            fa_cp16(dst, kc + off, ok);
            fa_cp16(dst + FA_BK * FA_KLD, vc + off, ok);
        }
    } else {
        for (int it = tid; it < 2 * FA_BK * (FA_D / 16); it += 128) {
            int half_v = it >= FA_BK * (FA_D / 16), i2 = it - half_v * FA_BK * (FA_D / 16);
            int key = i2 % FA_BK, dc = i2 / FA_BK;
            int j = kb + key;
            uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
            if (j <= p_last) {
                const KV* src = (half_v ? vc : kc) + (size_t)(j % cap) * row + (size_t)kvh * FA_D + 16 * dc;
                float4 v0 = Kv<KV>::ld4(src), v1 = Kv<KV>::ld4(src + 4), v2 = Kv<KV>::ld4(src + 8),
                       v3 = Kv<KV>::ld4(src + 12);
                lo = make_uint4(fa_pack(v0.x, v0.y), fa_pack(v0.z, v0.w), fa_pack(v1.x, v1.y), fa_pack(v1.z, v1.w));
                hi = make_uint4(fa_pack(v2.x, v2.y), fa_pack(v2.z, v2.w), fa_pack(v3.x, v3.y), fa_pack(v3.z, v3.w));
            }
            uint4* dst = (uint4*)(buf + half_v * FA_BK * FA_KLD + key * FA_KLD + 16 * dc);
            dst[0] = lo;
            dst[1] = hi;
        }
    }
}

// The chunks thread tid copied in fa_stage (chunk tid % 16 of keys tid / 16 + 8 m, K and V),
// bf16 bits turned into f16 in place (rounded to nearest, saturated as every f16 staging is;
// bf16 -> f16 is exact in f16's normal range). Only the thread's own copies, so it needs
// its own cp.async wait and no barrier: the caller's barrier before the tile is read follows.
__device__ __forceinline__ void fa_bf16_to_f16(unsigned short* buf, int tid) {
    int ch = tid & 15, k0 = tid >> 4;
    #pragma unroll
    for (int m = 0; m < 2 * (FA_BK / 8); m++) {
        int key = k0 + 8 * (m % (FA_BK / 8));
        uint4* p = (uint4*)(buf + (m >= FA_BK / 8) * FA_BK * FA_KLD + key * FA_KLD + 8 * ch);
        uint4 w = *p;
        w.x = fa_pack(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xFFFF0000u));
        w.y = fa_pack(__uint_as_float(w.y << 16), __uint_as_float(w.y & 0xFFFF0000u));
        w.z = fa_pack(__uint_as_float(w.z << 16), __uint_as_float(w.z & 0xFFFF0000u));
        w.w = fa_pack(__uint_as_float(w.w << 16), __uint_as_float(w.w & 0xFFFF0000u));
        *p = w;
    }
}

// A 4-byte cp.async (.ca: 4 is below .cg's 16) that writes zeros instead when !valid.
__device__ __forceinline__ void fa_cp4(void* dst, const void* src, bool valid) {
    u32 s = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(src), "r"(valid ? 4 : 0)
                 : "memory");
}

// The q8_0 cache's stage of keys kb .. kb + FA_BK into raw (an FA_Q8_STAGE area): thread tid
// copies half hf = tid % 2 of key tid / 2's K and V rows of this KV head (64 quants, two
// blocks, by four 16-byte cp.async each) and the two blocks' scales (one 4-byte cp.async
// each); keys past p_last as zeros (zero quants and scales read back as 0). The thread then
// converts exactly what it copied (fa_q8_to_f16), so no barrier sits between the two.
__device__ __forceinline__ void fa_stage_q8(unsigned char* raw, const kv_q8* __restrict__ kc,
                                            const kv_q8* __restrict__ vc, int kb, int p_last, int cap,
                                            int row, int kvh, int tid) {
    int key = tid >> 1, hf = tid & 1, j = kb + key;
    bool ok = j <= p_last;
    int r = (kb % cap) + key;
    r = r < cap ? r : cap >= FA_BK ? r - cap : r % cap;
    size_t e = (size_t)r * row + (size_t)kvh * FA_D + 64 * hf;
    const unsigned char* kq = (const unsigned char*)kc + e;
    const unsigned char* vq = (const unsigned char*)vc + e;
    unsigned char* dk = raw + key * FA_Q8_LD + 64 * hf;
    unsigned char* dv = dk + FA_BK * FA_Q8_LD;
    #pragma unroll
    for (int c = 0; c < 4; c++) {
        fa_cp16(dk + 16 * c, kq + 16 * c, ok);
        fa_cp16(dv + 16 * c, vq + 16 * c, ok);
    }
    unsigned short* sk = (unsigned short*)(raw + 2 * FA_BK * FA_Q8_LD) + key * (FA_D / 32) + 2 * hf;
    fa_cp4(sk, kvq8_scales(kc, cap, row) + e / 32, ok);
    fa_cp4(sk + FA_BK * (FA_D / 32), kvq8_scales(vc, cap, row) + e / 32, ok);
}

// Four q8_0 quants (one word, little-endian bytes) times the block's f16 scale d2, as two
// f16 pairs. A quant q becomes an exact f16 through the bias trick (byte q + 128 under the
// exponent 0x64 reads as 1024 + q + 128; subtract 1152), then __hmul2 rounds d * q to f16
// once: the exact product is at most 19 significant bits, so this is the rounding fa_pack
// gives the f32 product. Products beyond f16's range saturate to 65504 as f16_sat has them
// (a NaN scale stays NaN); only an infinite scale (a block whose |x| reached 127 * 65504)
// differs, reading back as 65504 instead of inf.
__device__ __forceinline__ void fa_q8x4(u32 w, __half2 d2, u32& lo, u32& hi) {
    u32 x = w ^ 0x80808080u;
    u32 a = __byte_perm(x, 0x64646464u, 0x4140), b = __byte_perm(x, 0x64646464u, 0x4342);
    const __half2 bias = __half2half2(__ushort_as_half((unsigned short)0x6480));
    const __half2 top = __half2half2(__ushort_as_half((unsigned short)0x7BFF));
    const __half2 bot = __half2half2(__ushort_as_half((unsigned short)0xFBFF));
    __half2 ha = __hmul2(__hsub2(*(__half2*)&a, bias), d2);
    __half2 hb = __hmul2(__hsub2(*(__half2*)&b, bias), d2);
    ha = __hmax2_nan(__hmin2_nan(ha, top), bot);
    hb = __hmax2_nan(__hmin2_nan(hb, top), bot);
    lo = *(u32*)&ha;
    hi = *(u32*)&hb;
}

// The quants and scales thread tid staged (fa_stage_q8) into the f16 tile buf, as f16(d) * q
// rounded to f16 (fa_q8x4: the f32 cache's rounding of the same values).
__device__ __forceinline__ void fa_q8_to_f16(unsigned short* buf, const unsigned char* raw, int tid) {
    int key = tid >> 1, hf = tid & 1;
    // Rolled: the callers hold a tile's accumulators in registers (unrolled, the prefill
    // kernel spills).
    #pragma unroll 1
    for (int kv = 0; kv < 2; kv++) {
        const unsigned char* src = raw + kv * FA_BK * FA_Q8_LD + key * FA_Q8_LD + 64 * hf;
        const unsigned short* sc =
            (const unsigned short*)(raw + 2 * FA_BK * FA_Q8_LD) + kv * FA_BK * (FA_D / 32) + key * (FA_D / 32) + 2 * hf;
        unsigned short* dst = buf + kv * FA_BK * FA_KLD + key * FA_KLD + 64 * hf;
        #pragma unroll
        for (int c = 0; c < 4; c++) {
            __half2 d2 = __half2half2(__ushort_as_half(sc[c >> 1]));
            uint4 w = *(const uint4*)(src + 16 * c);
            uint4 o0, o1;
            fa_q8x4(w.x, d2, o0.x, o0.y);
            fa_q8x4(w.y, d2, o0.z, o0.w);
            fa_q8x4(w.z, d2, o1.x, o1.y);
            fa_q8x4(w.w, d2, o1.z, o1.w);
            uint4* d4 = (uint4*)(dst + 16 * c);
            d4[0] = o0;
            d4[1] = o1;
        }
    }
}

// A walk over the key tiles kb = k0, k0 + FA_BK, .. <= last (keys past last staged as zeros):
// fa_first_tile stages the first before the loop (a 16-bit cache only: its tiles go through
// two buffers by cp.async), fa_tile returns tile `it` at kb, staged: with a 16-bit cache the
// next tile's copies go out before this one is waited for (and a bf16 tile is converted);
// an f32 cache converts the tile on the way into the one buffer. The caller synchronises the
// block before reading the tile, and again before the next call.
template <typename KV>
__device__ __forceinline__ void fa_first_tile(unsigned short* smem, const KV* kc, const KV* vc,
                                              int k0, int last, int cap, int row, int kvh, int tid) {
    if constexpr (Kv<KV>::Q8) {
        fa_stage_q8((unsigned char*)(smem + FA_TILE_HALVES), kc, vc, k0, last, cap, row, kvh, tid);
        cp_async_commit();
    } else if constexpr (fa_async<KV>()) {
        fa_stage<KV>(smem, kc, vc, k0, last, cap, row, kvh, tid);
        cp_async_commit();
    }
}
template <typename KV>
__device__ __forceinline__ const unsigned short* fa_tile(unsigned short* smem, const KV* kc,
                                                         const KV* vc, int kb, int it, int last, int cap,
                                                         int row, int kvh, int tid) {
    if constexpr (Kv<KV>::Q8) {
        // Raw stages after the one f16 buffer; the f16 buffer is free (the caller's barrier
        // after the previous tile), each thread converts its own landed copies into it.
        unsigned char* raw = (unsigned char*)(smem + FA_TILE_HALVES);
        if (kb + FA_BK <= last)
            fa_stage_q8(raw + ((it + 1) & 1) * FA_Q8_STAGE, kc, vc, kb + FA_BK, last, cap, row, kvh, tid);
        cp_async_commit();
        cp_async_wait<1>();
        fa_q8_to_f16(smem, raw + (it & 1) * FA_Q8_STAGE, tid);
        return smem;
    } else if constexpr (fa_async<KV>()) {
        if (kb + FA_BK <= last)
            fa_stage<KV>(smem + ((it + 1) & 1) * FA_TILE_HALVES, kc, vc, kb + FA_BK, last, cap, row, kvh, tid);
        cp_async_commit();
        cp_async_wait<1>();
        unsigned short* cur = smem + (it & 1) * FA_TILE_HALVES;
        if constexpr (Kv<KV>::BF16) fa_bf16_to_f16(cur, tid);
        return cur;
    } else {
        fa_stage<KV>(smem, kc, vc, kb, last, cap, row, kvh, tid);
        return smem;
    }
}

// S for n-tile nt (keys 8 nt .. 8 nt + 8) of the staged key tile ks against the warp's Q
// fragments qf: the 8 k16 steps over d, one ldmatrix.x4 giving the B fragments of two
// (mi, mr: the lane's ldmatrix matrix and row).
__device__ __forceinline__ void fa_qk_ntile(float (&s)[4], const u32 (&qf)[8][4], const unsigned short* ks, int nt,
                                            int mi, int mr) {
    #pragma unroll
    for (int e = 0; e < 4; e++) s[e] = 0.0f;
    #pragma unroll
    for (int st = 0; st < 8; st += 2) {
        u32 b[4];
        ldmatrix_x4(b, ks + (8 * nt + mr) * FA_KLD + 16 * (st + (mi >> 1)) + 8 * (mi & 1));
        fa_mma(s, qf[st][0], qf[st][1], qf[st][2], qf[st][3], b[0], b[1]);
        fa_mma(s, qf[st + 1][0], qf[st + 1][1], qf[st + 1][2], qf[st + 1][3], b[2], b[3]);
    }
}

// One key tile's online-softmax step for a thread's two rows of an m16 tile (a: row g, b: row
// g + 8): s holds NT n-tiles of masked, log2-scaled scores (−inf where not visible), na and nb
// the rows' maxima over this thread's share of them and the running maxima ma and mb. Takes
// the rows' new maxima over the lane quad, rescales the accumulator o and this thread's share
// of the sums la and lb to them, adds the tile's p = 2^(s − max) to the sums and returns them
// rounded to f16 as mma A-fragments in pf (the accumulator layout of S is the A-fragment
// layout of P). Rows with nothing visible yet keep max −inf: their p and correction are 0 / 1.
template <int NT>
__device__ __forceinline__ void fa_softmax_step(float (&s)[NT][4], float na, float nb, float& ma, float& mb,
                                                float& la, float& lb, float (&o)[16][4], u32 (&pf)[NT][2]) {
    na = fmaxf(na, __shfl_xor_sync(0xffffffffu, na, 1));
    na = fmaxf(na, __shfl_xor_sync(0xffffffffu, na, 2));
    nb = fmaxf(nb, __shfl_xor_sync(0xffffffffu, nb, 1));
    nb = fmaxf(nb, __shfl_xor_sync(0xffffffffu, nb, 2));
    float ca = na == -LG_INF ? 1.0f : exp2f(ma - na);
    float cb = nb == -LG_INF ? 1.0f : exp2f(mb - nb);
    float ba = na == -LG_INF ? 0.0f : na, bb = nb == -LG_INF ? 0.0f : nb;
    ma = na;
    mb = nb;
    la *= ca;
    lb *= cb;
    #pragma unroll
    for (int j = 0; j < 16; j++) {
        o[j][0] *= ca;
        o[j][1] *= ca;
        o[j][2] *= cb;
        o[j][3] *= cb;
    }
    #pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        float p0 = exp2f(s[nt][0] - ba), p1 = exp2f(s[nt][1] - ba);
        float p2 = exp2f(s[nt][2] - bb), p3 = exp2f(s[nt][3] - bb);
        la += p0 + p1;
        lb += p2 + p3;
        pf[nt][0] = fa_pack(p0, p1);
        pf[nt][1] = fa_pack(p2, p3);
    }
}

// Grid (hq, ceil(n / FA_BQ)), block 128, dynamic shared memory FA_TILE_HALVES halves per
// buffer (two with a 16-bit cache). Arguments as attention.cu's attention (no split), then the
// fused epilogue: with `g` (gcols per token, else null) each output is multiplied by the
// softplus output gate as gate_mul does (g per head or per element); with `oh` (else null)
// the result is written rounded to f16 as to_f16 rounds it, into oh instead of out (the
// output projection's tensor-core input). Either way the bits are those of the unfused
// gate_mul / to_f16 kernels.
// With an f16 cache (KV = unsigned short) the staged values are the cache's own: it holds
// what fa_pack would make of the f32 values, so both caches give the same bits.
template <typename KV>
__device__ void attention_prefill_t(const float* __restrict__ q, const KV* __restrict__ kc,
                                    const KV* __restrict__ vc, float* __restrict__ out, int cap, int hq,
                                    int n_kv, int window, int n, const u32* __restrict__ params,
                                    const float* __restrict__ gt, int gcols, unsigned short* __restrict__ oh) {
    extern __shared__ __align__(16) unsigned short fa_smem[];
    int h = blockIdx.x, t0 = blockIdx.y * FA_BQ;
    int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
    int kvh = h / (hq / n_kv);
    int row = n_kv * FA_D;
    int pos0 = (int)params[P_POS0];
    // This thread's two query rows (g and g + 8 of the warp's 16).
    int ta = t0 + 16 * w + g, tb = ta + 8;
    int pa = pos0 + ta, pb = pos0 + tb;
    // Q fragments for the 8 k16 steps over d: a0 (row g, d 16s + 2qd), a1 (row g + 8),
    // a2 (row g, +8), a3 (row g + 8, +8).
    u32 qf[8][4];
    {
        const float* qa = q + ((size_t)min(ta, n - 1) * hq + h) * FA_D;
        const float* qb = q + ((size_t)min(tb, n - 1) * hq + h) * FA_D;
        #pragma unroll
        for (int s = 0; s < 8; s++) {
            int d0 = 16 * s + 2 * qd;
            float2 x0 = *(const float2*)(qa + d0), x1 = *(const float2*)(qb + d0);
            float2 x2 = *(const float2*)(qa + d0 + 8), x3 = *(const float2*)(qb + d0 + 8);
            qf[s][0] = fa_pack(x0.x, x0.y);
            qf[s][1] = fa_pack(x1.x, x1.y);
            qf[s][2] = fa_pack(x2.x, x2.y);
            qf[s][3] = fa_pack(x3.x, x3.y);
        }
    }
    float o[16][4];
    #pragma unroll
    for (int j = 0; j < 16; j++)
        #pragma unroll
        for (int e = 0; e < 4; e++) o[j][e] = 0.0f;
    // Running max (log2 units) and this thread's share of the row sums, rows a and b.
    float ma = -LG_INF, mb = -LG_INF, la = 0.0f, lb = 0.0f;
    const float sl2 = 1.4426950408889634f / sqrtf((float)FA_D);

    int p_first = pos0 + t0, p_last = pos0 + min(t0 + FA_BQ, n) - 1;
    int k_begin = window > 0 ? max(0, p_first + 1 - window) : 0;
    // ldmatrix lane roles: matrix mi = lane / 8, its row lane % 8.
    int mi = lane >> 3, mr = lane & 7;
    fa_first_tile<KV>(fa_smem, kc, vc, k_begin, p_last, cap, row, kvh, tid);
    for (int kb = k_begin, it = 0; kb <= p_last; kb += FA_BK, it++) {
        const unsigned short* ks = fa_tile<KV>(fa_smem, kc, vc, kb, it, p_last, cap, row, kvh, tid);
        __syncthreads();
        const unsigned short* vs = ks + FA_BK * FA_KLD;

        // S = Q K^T for the warp's 16 queries x 64 keys: 8 n-tiles of 8 keys; one ldmatrix.x4
        // gives an n-tile's B fragments for two k16 steps.
        float s[8][4];
        #pragma unroll
        for (int nt = 0; nt < 8; nt++) fa_qk_ntile(s[nt], qf, ks, nt, mi, mr);
        // Mask, scale to log2 units, new row maxima.
        float na = ma, nb = mb;
        #pragma unroll
        for (int nt = 0; nt < 8; nt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int j = kb + 8 * nt + 2 * qd + (e & 1);
                int p = e < 2 ? pa : pb;
                bool vis = j <= p && (window <= 0 || j > p - window);
                float v = vis ? s[nt][e] * sl2 : -LG_INF;
                s[nt][e] = v;
                if (e < 2) na = fmaxf(na, v);
                else nb = fmaxf(nb, v);
            }
        u32 pf[8][2];
        fa_softmax_step<8>(s, na, nb, ma, mb, la, lb, o, pf);
        // O += P V: k16 step st covers keys 16 st .. + 16 (S tiles 2 st and 2 st + 1); 16
        // n-tiles of 8 dims, two per ldmatrix.x4.trans.
        #pragma unroll
        for (int st = 0; st < 4; st++) {
            #pragma unroll
            for (int dt = 0; dt < 16; dt += 2) {
                u32 b[4];
                fa_ldsm_t(b, vs + (16 * st + 8 * (mi & 1) + mr) * FA_KLD + 8 * (dt + (mi >> 1)));
                fa_mma(o[dt], pf[2 * st][0], pf[2 * st][1], pf[2 * st + 1][0], pf[2 * st + 1][1], b[0], b[1]);
                fa_mma(o[dt + 1], pf[2 * st][0], pf[2 * st][1], pf[2 * st + 1][0], pf[2 * st + 1][1], b[2], b[3]);
            }
        }
        __syncthreads();
    }
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
    float ia = 1.0f / la, ib = 1.0f / lb;
    int per = gt ? hq * FA_D / gcols : 1;
    // A gate per head (per == FA_D) is one softplus per row, taken once; a gate per element
    // takes one per output.
    bool head_gate = gt && per == FA_D;
    float ga = head_gate && ta < n ? softplus_f(gt[(size_t)ta * gcols + h]) : 1.0f;
    float gb = head_gate && tb < n ? softplus_f(gt[(size_t)tb * gcols + h]) : 1.0f;
    // The token's two outputs at dims d0, d0 + 1: gated, then stored as f32 or f16.
    auto store = [&](int t, float gh, int d0, float v0, float v1) {
        if (t >= n) return;
        size_t i = ((size_t)t * hq + h) * FA_D + d0;
        if (head_gate) {
            v0 *= gh;
            v1 *= gh;
        } else if (gt) {
            const float* gr = gt + (size_t)t * gcols;
            v0 *= softplus_f(gr[(h * FA_D + d0) / per]);
            v1 *= softplus_f(gr[(h * FA_D + d0 + 1) / per]);
        }
        if (oh) *(u32*)(oh + i) = pack_f16x2(f16_range(v0), f16_range(v1));
        else *(float2*)(out + i) = make_float2(v0, v1);
    };
    #pragma unroll
    for (int dt = 0; dt < 16; dt++) {
        int d0 = 8 * dt + 2 * qd;
        store(ta, ga, d0, o[dt][0] * ia, o[dt][1] * ia);
        store(tb, gb, d0, o[dt][2] * ib, o[dt][3] * ib);
    }
}

// One instantiation per KV cache type, three blocks per SM (their buffers fit: 34 KiB for the
// f32 cache's one, 68 KiB for the 16-bit caches' two, 72 KiB for the q8_0 cache's f16 tile and
// two raw stages; the register bound keeps them). The bf16 cache is copied as the f16 one is
// and each tile converted to f16 in shared memory when it lands (fa_bf16_to_f16); the q8_0
// cache's quants and scales go by cp.async into two raw stages (fa_stage_q8) and are
// dequantised into the one f16 buffer when they land (fa_q8_to_f16), the values the f32
// kernel stages from f16(d) * q.
#define PREFILL_KERNEL(sfx, KV)                                                                      \
    extern "C" __global__ void __launch_bounds__(128, 3) attention_prefill##sfx(                      \
        const float* __restrict__ q, const KV* __restrict__ kc, const KV* __restrict__ vc,           \
        float* __restrict__ out, int cap, int hq, int n_kv, int window, int n,                       \
        const u32* __restrict__ params, const float* __restrict__ g, int gcols,                      \
        unsigned short* __restrict__ oh) {                                                           \
        attention_prefill_t<KV>(q, kc, vc, out, cap, hq, n_kv, window, n, params, g, gcols, oh);     \
    }
PREFILL_KERNEL(, float)
PREFILL_KERNEL(_f16, unsigned short)
PREFILL_KERNEL(_bf16, kv_bf16)
PREFILL_KERNEL(_q8_0, kv_q8)

// Decode attention on the tensor cores, one block per (KV head, split) — the layout of
// llama.cpp's GQA-packed flash-attention decode (ggml-cuda/fattn-mma-f16.cuh, which puts the
// query heads sharing a KV head in the rows of one tile; restated here, not copied): the G =
// hq / n_kv query heads of KV head kvh are the 16 rows of one m16 tile (rows G .. 15 zero, G <=
// 16), so every key and value row is read once per KV head instead of once per query head,
// and the block streams its split's keys through shared memory FA_BK at a time with
// attention_prefill's fa_stage (two buffers and cp.async with a 16-bit cache). Warp w takes keys
// 16 w .. 16 w + 16 of each tile: S = Q K^T (two n-tiles of 8 keys), its own online softmax
// (running max and sum per row, base-2 exponentials), P rounded to f16, O += P V (16 n-tiles
// over d) — the warps never wait for each other inside a tile; their four states are merged
// through shared memory at the end. One token (the step's position); the split, visibility,
// gate and outputs are attention_decode's (attention.cu): one split writes out (times the
// softplus gate g when not null), more write the unnormalised state of every query head to
// part (natural-log max M, sum L), merged by merge.cuh. Queries, keys, values and P are f16
// (~1e-3 relative), as in attention_prefill. Grid (n_kv, 1, n_split), block 128, dynamic
// shared memory as attention_prefill's (manifest.rs FLASH_SMEM).
//
// QKF (attention_decode_gqa_qk_f16, an f16 cache): the step's QK-norm, RoPE and KV store
// done here instead of by fused.cu's qk_norm_rope_store, one launch fewer per layer: q, kin
// and vin are the raw projections. After the wait each block norms and rotates its G query
// heads into shared memory (qk_rope.cuh's norm_rope_head, the unfused kernel's arithmetic)
// and its KV head's key, and rounds that key and the value to the cache's f16; the block
// whose keys include the position writes them to the cache row, and patches them into its
// staged tile once the tile has landed (the tile's copy of that row may predate the write),
// so no block reads another's write and the values are those the cache would give: the
// outputs are bitwise those of the two kernels. Every split's block norms the queries (G
// heads, a few hundred loads); only the position's split has the key. The next kernel is
// let in after the wait (GQA_QK_TRIGGER_EARLY=1: at the start, as the unfused kernel does),
// since at its start the Q/K/V product before it may still be running; the two measured level
// (S 2.1 W4A16 tg64 261.5 / 261.4 against 261.4 / 261.4 t/s, session 38).
#ifndef GQA_QK_TRIGGER_EARLY
#define GQA_QK_TRIGGER_EARLY 0
#endif
template <typename KV, bool QKF = false>
__device__ void attention_decode_gqa_t(const float* __restrict__ q, const KV* __restrict__ kc,
                                       const KV* __restrict__ vc, float* __restrict__ out,
                                       float* __restrict__ part, int cap, int hq, int n_kv,
                                       int window, const u32* __restrict__ params,
                                       const float* __restrict__ gt, int gcols, int early,
                                       const float* __restrict__ kin = nullptr,
                                       const float* __restrict__ vin = nullptr,
                                       const float* __restrict__ qgain = nullptr,
                                       const float* __restrict__ kgain = nullptr,
                                       const float* __restrict__ inv_freq = nullptr, float rscale = 1.0f,
                                       int rd = 0, float eps = 0.0f) {
    static_assert(!QKF || Kv<KV>::F16, "the fused QK form stages an f16 cache only");
    extern __shared__ __align__(16) unsigned short fa_smem[];
    // The softplus gate's inputs of the block's heads (one split only), read at the start.
    __shared__ float gs[FA_GQA_MAX_G * FA_D];
    // QKF: the rotated queries, the position's key and value as the cache holds them, and
    // each warp's norm scratch.
    __shared__ __align__(16) float qsf[QKF ? FA_GQA_MAX_G : 1][QKF ? FA_D : 1];
    __shared__ KV kpos[QKF ? FA_D : 1], vpos[QKF ? FA_D : 1];
    __shared__ float ys[QKF ? 4 : 1][QKF ? FA_D : 1];
    int kvh = blockIdx.x, split = blockIdx.z, n_split = gridDim.z;
    int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, gr = lane >> 2, qd = lane & 3;
    int G = hq / n_kv, h0 = kvh * G;
    int row = n_kv * FA_D;
    int per = gt ? hq * FA_D / gcols : 1;
    // The next kernel is let in at this kernel's start, not after its wait, so a product
    // after it (the O projection, mv_stage) has its blocks resident and its first weights
    // requested while the QK-norm kernel still runs (S 2.1 W4A16 tg64 257.9 against 257.4
    // t/s with the trigger after the wait, one run each, session 30). Lab switch
    // ATTN_TRIGGER_LATE: after the wait, as before.
#ifndef ATTN_TRIGGER_LATE
    if (!QKF || GQA_QK_TRIGGER_EARLY) pdl_trigger();
#endif
    // early != 0: the host launched this kernel right after one that waits before it
    // triggers (qk_norm_rope_store), so every kernel before that one has finished: the step's
    // position and the gate (an output of the Q/K/V/gate product) are read before the wait,
    // and only the rotated queries and the step's own key and value need it. Otherwise both
    // after the wait, as before. (QKF: never early.)
    if (!early) pdl_wait();
#ifndef ATTN_TRIGGER_LATE
    if (QKF && !GQA_QK_TRIGGER_EARLY) pdl_trigger();
#endif
    int pos = (int)params[P_POS0];
    if (gt && n_split == 1)
        for (int r = 0; r < G; r++) gs[r * FA_D + tid] = gt[((h0 + r) * FA_D + tid) / per];
    if (early) pdl_wait();
#ifdef ATTN_TRIGGER_LATE
    pdl_trigger();
#endif
    int first, last;
    split_keys(pos, window, split, n_split, first, last);
    if constexpr (QKF) {
        // The first tile's copies go out before the heads are normed (its copy of the
        // position's row is replaced below).
        if (first <= last) fa_first_tile<KV>(fa_smem, kc, vc, first, last, cap, row, kvh, tid);
        u32 upos = (u32)pos;
        bool writer = first <= pos && pos <= last;
        size_t slot = (size_t)(upos % cap) * row + (size_t)kvh * FA_D;
        // Warp w: heads w, w + 4, ... of the G queries then the key (index G).
        for (int j = w; j <= G; j += 4) {
            if (j < G) {
                norm_rope_head(q + (size_t)(h0 + j) * FA_D, qgain, ys[w], FA_D, rd, upos, inv_freq, rscale, eps,
                               [&](int i, float o) { qsf[j][i] = o; });
            } else {
                norm_rope_head(kin + (size_t)kvh * FA_D, kgain, ys[w], FA_D, rd, upos, inv_freq, rscale, eps,
                               [&](int i, float o) {
                                   Kv<KV>::st(kpos + i, o);
                                   if (writer) Kv<KV>::st((KV*)kc + slot + i, o);
                               });
            }
            __syncwarp();
        }
        {
            float x = vin[(size_t)kvh * FA_D + tid];  // FA_D == blockDim.x
            Kv<KV>::st(vpos + tid, x);
            if (writer) Kv<KV>::st((KV*)vc + slot + tid, x);
        }
        __syncthreads();
    }
    // Q fragments (attention_prefill's layout) for rows gr and gr + 8: query heads h0 + gr
    // and h0 + gr + 8, zeros past the group.
    u32 qf[8][4];
    {
        bool va = gr < G, vb = gr + 8 < G;
        const float* qa = QKF ? &qsf[gr][0] : q + (size_t)(h0 + gr) * FA_D;
        const float* qb = QKF ? &qsf[gr + 8][0] : q + (size_t)(h0 + gr + 8) * FA_D;
        #pragma unroll
        for (int s = 0; s < 8; s++) {
            int d0 = 16 * s + 2 * qd;
            float2 z = make_float2(0.0f, 0.0f);
            float2 x0 = va ? *(const float2*)(qa + d0) : z, x1 = vb ? *(const float2*)(qb + d0) : z;
            float2 x2 = va ? *(const float2*)(qa + d0 + 8) : z, x3 = vb ? *(const float2*)(qb + d0 + 8) : z;
            qf[s][0] = fa_pack(x0.x, x0.y);
            qf[s][1] = fa_pack(x1.x, x1.y);
            qf[s][2] = fa_pack(x2.x, x2.y);
            qf[s][3] = fa_pack(x3.x, x3.y);
        }
    }
    float o[16][4];
    #pragma unroll
    for (int j = 0; j < 16; j++)
        #pragma unroll
        for (int e = 0; e < 4; e++) o[j][e] = 0.0f;
    float ma = -LG_INF, mb = -LG_INF, la = 0.0f, lb = 0.0f;
    const float sl2 = 1.4426950408889634f / sqrtf((float)FA_D);
    int mi = lane >> 3, mr = lane & 7;
    if (!QKF && first <= last) fa_first_tile<KV>(fa_smem, kc, vc, first, last, cap, row, kvh, tid);
    for (int kb = first, it = 0; kb <= last; kb += FA_BK, it++) {
        const unsigned short* ks = fa_tile<KV>(fa_smem, kc, vc, kb, it, last, cap, row, kvh, tid);
        __syncthreads();
        if constexpr (QKF) {
            // The position's row of the landed tile: the key and value made above.
            if (pos >= kb && pos < kb + FA_BK && pos <= last) {
                unsigned short* kt = (unsigned short*)ks + (pos - kb) * FA_KLD + tid;
                kt[0] = kpos[tid];
                kt[FA_BK * FA_KLD] = vpos[tid];
                __syncthreads();
            }
        }
        const unsigned short* vs = ks + FA_BK * FA_KLD;
        int kw = kb + 16 * w;  // the warp's first key
        if (kw <= last) {
            // S for the warp's 16 keys: n-tiles 2 w and 2 w + 1 of the tile.
            float s[2][4];
            #pragma unroll
            for (int i = 0; i < 2; i++) fa_qk_ntile(s[i], qf, ks, 2 * w + i, mi, mr);
            float na = ma, nb = mb;
            #pragma unroll
            for (int i = 0; i < 2; i++)
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    int j = kw + 8 * i + 2 * qd + (e & 1);
                    float v = j <= last ? s[i][e] * sl2 : -LG_INF;
                    s[i][e] = v;
                    if (e < 2) na = fmaxf(na, v);
                    else nb = fmaxf(nb, v);
                }
            u32 pf[2][2];
            fa_softmax_step<2>(s, na, nb, ma, mb, la, lb, o, pf);
            // O += P V over the warp's 16 keys (one k16 step), two n-tiles of 8 dims per
            // ldmatrix.x4.trans.
            #pragma unroll
            for (int dt = 0; dt < 16; dt += 2) {
                u32 b[4];
                fa_ldsm_t(b, vs + (16 * w + 8 * (mi & 1) + mr) * FA_KLD + 8 * (dt + (mi >> 1)));
                fa_mma(o[dt], pf[0][0], pf[0][1], pf[1][0], pf[1][1], b[0], b[1]);
                fa_mma(o[dt + 1], pf[0][0], pf[0][1], pf[1][0], pf[1][1], b[2], b[3]);
            }
        }
        __syncthreads();
    }
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
    // The four warps' states through shared memory (the tile buffers, free after the loop's
    // last barrier): wo[w][row][d], then each row's max and sum per warp.
    float* wo = (float*)fa_smem;
    float* wm = wo + 4 * 16 * FA_D;
    float* wl = wm + 4 * 16;
    #pragma unroll
    for (int dt = 0; dt < 16; dt++) {
        int d0 = 8 * dt + 2 * qd;
        *(float2*)(wo + (w * 16 + gr) * FA_D + d0) = make_float2(o[dt][0], o[dt][1]);
        *(float2*)(wo + (w * 16 + gr + 8) * FA_D + d0) = make_float2(o[dt][2], o[dt][3]);
    }
    if (qd == 0) {
        wm[w * 16 + gr] = ma;
        wm[w * 16 + gr + 8] = mb;
        wl[w * 16 + gr] = la;
        wl[w * 16 + gr + 8] = lb;
    }
    __syncthreads();
    int k = tid;  // FA_D == blockDim.x: one output dim per thread
    for (int r = 0; r < G; r++) {
        float M = -LG_INF;
        #pragma unroll
        for (int v = 0; v < 4; v++) M = fmaxf(M, wm[v * 16 + r]);
        float L = 0.0f, acc = 0.0f;
        #pragma unroll
        for (int v = 0; v < 4; v++) {
            float mv = wm[v * 16 + r];
            if (mv != -LG_INF) {
                float c = exp2f(mv - M);
                L += wl[v * 16 + r] * c;
                acc += wo[(v * 16 + r) * FA_D + k] * c;
            }
        }
        int h = h0 + r;
        if (n_split > 1) {
            float* ph = part + ((size_t)h * n_split + split) * (FA_D + 2);
            ph[k] = acc;
            // The merge takes natural-log maxima: 2^(m2) = e^(m2 ln 2).
            if (k == 0) {
                ph[FA_D] = M == -LG_INF ? M : M * 0.6931471805599453f;
                ph[FA_D + 1] = L;
            }
        } else {
            float v = acc / L;
            out[(size_t)h * FA_D + k] = gt ? v * softplus_f(gs[r * FA_D + k]) : v;
        }
    }
}

// Arguments as attention.cu's attention_decode (d must be FA_D; the host checks), then
// `early` (see above).
#define GQA_KERNEL(sfx, KV)                                                                          \
    extern "C" __global__ void __launch_bounds__(128, 3) attention_decode_gqa##sfx(                   \
        const float* __restrict__ q, const KV* __restrict__ kc, const KV* __restrict__ vc,           \
        float* __restrict__ out, float* __restrict__ part, int cap, int hq, int n_kv, int d,         \
        int window, const u32* __restrict__ params, const float* __restrict__ g, int gcols,          \
        int early) {                                                                                 \
        attention_decode_gqa_t<KV>(q, kc, vc, out, part, cap, hq, n_kv, window, params, g, gcols,    \
                                   early);                                                           \
    }
GQA_KERNEL(, float)
GQA_KERNEL(_f16, unsigned short)
GQA_KERNEL(_bf16, kv_bf16)
GQA_KERNEL(_q8_0, kv_q8)

// The fused QK form (QKF above), an f16 cache: attention.cu's attention_decode_qk's
// arguments (q, kin, vin the raw projections; grid (n_kv, 1, n_split) as attention_decode_gqa).
extern "C" __global__ void __launch_bounds__(128, 3) attention_decode_gqa_qk_f16(
    const float* __restrict__ q, const unsigned short* __restrict__ kc, const unsigned short* __restrict__ vc,
    float* __restrict__ out, float* __restrict__ part, int cap, int hq, int n_kv, int d, int window,
    const u32* __restrict__ params, const float* __restrict__ g, int gcols, const float* __restrict__ kin,
    const float* __restrict__ vin, const float* __restrict__ qw, const float* __restrict__ kw,
    const float* __restrict__ inv_freq, float rscale, int rd, float eps) {
    attention_decode_gqa_t<unsigned short, true>(q, kc, vc, out, part, cap, hq, n_kv, window, params, g, gcols, 0,
                                                 kin, vin, qw, kw, inv_freq, rscale, rd, eps);
}
