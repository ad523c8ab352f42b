// Tensor-core causal (optionally sliding-window) GQA attention for prefill steps, head_dim
// 128: flash-attention-2 style tiling over the KV rings of attention.cu.
//
// Scalar pseudo-code (lagoon_core::ops::attention): query position p = pos0 + t of head h
// sees keys j with first <= j <= p (first = max(0, p + 1 - window) on sliding layers);
// out = softmax(q . k_j / sqrt(d)) . v_j with the KV head h / (hq / n_kv).
//
// A block of 4 warps takes FA_BQ = 64 consecutive queries of one head; warp w owns queries
// 16 w .. 16 w + 16, held in registers as f16 mma A-fragments. Keys and values stream
// through shared memory 64 at a time (rounded to f16: K as [key][d], V transposed as
// [d][key], rows padded for conflict-free fragment loads). Per key tile the warp computes
// S = Q K^T (f32 accumulation), masks it, updates the running row max and sum in f32 (base-2
// exponentials of log2(e)-scaled scores), rounds P to f16 and accumulates P V in f32 — the
// accumulator layout of S is the A-fragment layout of P, so P never leaves registers (after
// FlashAttention-2, Dao 2023, section 3). Queries and keys/values are rounded to f16
// (finite values beyond f16's range saturate), so results differ from the f32 kernel by
// about f16 rounding (~1e-3 relative); the reference path keeps attention.cu.
#include "common.cuh"

#define FA_D 128
#define FA_BQ 64
#define FA_BK 64
#define FA_KLD (FA_D + 8)
#define FA_VLD (FA_BK + 8)

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

// Grid (hq, ceil(n / FA_BQ)), block 128. Arguments as attention.cu's attention (no split).
// With an f16 cache (KV = unsigned short) the staged values are the cache's own: it holds
// what fa_pack would make of the f32 values, so both caches give the same bits.
template <typename KV>
__device__ void attention_prefill_t(const float* __restrict__ q, const KV* __restrict__ kc,
                                    const KV* __restrict__ vc, float* __restrict__ out, int cap, int hq,
                                    int n_kv, int window, int n, const u32* __restrict__ params) {
    __shared__ __align__(16) unsigned short ks[FA_BK * FA_KLD];
    __shared__ __align__(16) unsigned short vt[FA_D * FA_VLD];
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
    for (int kb = k_begin; kb <= p_last; kb += FA_BK) {
        // Stage keys kb .. kb + 64 (positions; ring rows j % cap): K as [key][d].
        for (int it = tid; it < FA_BK * (FA_D / 16); it += 128) {
            int key = it % FA_BK, dc = it / FA_BK;
            int j = kb + key;
            uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
            if (j <= p_last) {
                const KV* src = kc + (size_t)(j % cap) * row + (size_t)kvh * FA_D + 16 * dc;
                float4 v0 = Kv<KV>::ld4(src), v1 = Kv<KV>::ld4(src + 4), v2 = Kv<KV>::ld4(src + 8),
                       v3 = Kv<KV>::ld4(src + 12);
                lo = make_uint4(fa_pack(v0.x, v0.y), fa_pack(v0.z, v0.w), fa_pack(v1.x, v1.y), fa_pack(v1.z, v1.w));
                hi = make_uint4(fa_pack(v2.x, v2.y), fa_pack(v2.z, v2.w), fa_pack(v3.x, v3.y), fa_pack(v3.z, v3.w));
            }
            uint4* dst = (uint4*)(ks + key * FA_KLD + 16 * dc);
            dst[0] = lo;
            dst[1] = hi;
        }
        // V transposed: vt[d][key], a key pair per 32-bit word.
        for (int it = tid; it < (FA_BK / 2) * (FA_D / 16); it += 128) {
            int kp = it % (FA_BK / 2), dc = it / (FA_BK / 2);
            int j = kb + 2 * kp;
            float a[16], b[16];
            #pragma unroll
            for (int e = 0; e < 16; e++) a[e] = b[e] = 0.0f;
            if (j <= p_last) {
                const KV* src = vc + (size_t)(j % cap) * row + (size_t)kvh * FA_D + 16 * dc;
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    float4 v = Kv<KV>::ld4(src + 4 * e);
                    a[4 * e] = v.x; a[4 * e + 1] = v.y; a[4 * e + 2] = v.z; a[4 * e + 3] = v.w;
                }
            }
            if (j + 1 <= p_last) {
                const KV* src = vc + (size_t)((j + 1) % cap) * row + (size_t)kvh * FA_D + 16 * dc;
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    float4 v = Kv<KV>::ld4(src + 4 * e);
                    b[4 * e] = v.x; b[4 * e + 1] = v.y; b[4 * e + 2] = v.z; b[4 * e + 3] = v.w;
                }
            }
            u32* vw = (u32*)vt;
            #pragma unroll
            for (int e = 0; e < 16; e++) vw[(16 * dc + e) * (FA_VLD / 2) + kp] = fa_pack(a[e], b[e]);
        }
        __syncthreads();

        // S = Q K^T for the warp's 16 queries x 64 keys: 8 n-tiles of 8 keys.
        float s[8][4];
        const u32* kw = (const u32*)ks;
        #pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            #pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = 0.0f;
            #pragma unroll
            for (int st = 0; st < 8; st++) {
                int r = (8 * nt + g) * (FA_KLD / 2) + 8 * st + qd;
                fa_mma(s[nt], qf[st][0], qf[st][1], qf[st][2], qf[st][3], kw[r], kw[r + 4]);
            }
        }
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
        na = fmaxf(na, __shfl_xor_sync(0xffffffffu, na, 1));
        na = fmaxf(na, __shfl_xor_sync(0xffffffffu, na, 2));
        nb = fmaxf(nb, __shfl_xor_sync(0xffffffffu, nb, 1));
        nb = fmaxf(nb, __shfl_xor_sync(0xffffffffu, nb, 2));
        // Rows with nothing visible yet keep max -inf: their p and correction are 0 / 1.
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
        u32 pf[8][2];
        #pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            float p0 = exp2f(s[nt][0] - ba), p1 = exp2f(s[nt][1] - ba);
            float p2 = exp2f(s[nt][2] - bb), p3 = exp2f(s[nt][3] - bb);
            la += p0 + p1;
            lb += p2 + p3;
            pf[nt][0] = fa_pack(p0, p1);
            pf[nt][1] = fa_pack(p2, p3);
        }
        // O += P V: k16 step st covers keys 16 st .. + 16 (S tiles 2 st and 2 st + 1); 16
        // n-tiles of 8 dims.
        const u32* vw = (const u32*)vt;
        #pragma unroll
        for (int st = 0; st < 4; st++) {
            #pragma unroll
            for (int dt = 0; dt < 16; dt++) {
                int r = (8 * dt + g) * (FA_VLD / 2) + 8 * st + qd;
                fa_mma(o[dt], pf[2 * st][0], pf[2 * st][1], pf[2 * st + 1][0], pf[2 * st + 1][1], vw[r], vw[r + 4]);
            }
        }
        __syncthreads();
    }
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
    float ia = 1.0f / la, ib = 1.0f / lb;
    #pragma unroll
    for (int dt = 0; dt < 16; dt++) {
        int d0 = 8 * dt + 2 * qd;
        if (ta < n) *(float2*)(out + ((size_t)ta * hq + h) * FA_D + d0) = make_float2(o[dt][0] * ia, o[dt][1] * ia);
        if (tb < n) *(float2*)(out + ((size_t)tb * hq + h) * FA_D + d0) = make_float2(o[dt][2] * ib, o[dt][3] * ib);
    }
}

extern "C" __global__ void __launch_bounds__(128)
attention_prefill(const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
                  float* __restrict__ out, int cap, int hq, int n_kv, int window, int n,
                  const u32* __restrict__ params) {
    attention_prefill_t<float>(q, kc, vc, out, cap, hq, n_kv, window, n, params);
}

extern "C" __global__ void __launch_bounds__(128)
attention_prefill_f16(const float* __restrict__ q, const unsigned short* __restrict__ kc,
                      const unsigned short* __restrict__ vc, float* __restrict__ out, int cap, int hq, int n_kv,
                      int window, int n, const u32* __restrict__ params) {
    attention_prefill_t<unsigned short>(q, kc, vc, out, cap, hq, n_kv, window, n, params);
}
