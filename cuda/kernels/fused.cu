// Decode-step fusions of small ops (one token, quantised-activation path): each kernel here
// does the work of two to five graph nodes in one launch, since at batch 1 the launches,
// not the bytes, are what these ops cost.
#include "act.cuh"
#include "merge.cuh"
#include "qk_rope.cuh"

#define NQ_THREADS 1024
#define NQ_MAX 8192
// float4s a thread keeps in registers: NQ_MAX / 4 / NQ_THREADS.
#define NQ_VEC 2
#define QKR_WARPS 4
#define QKR_MAX_D 256

// RMSNorm of one row (norm.cu's rms_norm, block-wide sum) writing both the f32 output and
// its quantised copy for the products that read it. One block of NQ_THREADS; glen <= NQ_MAX
// and glen % 4 == 0. At batch 1 this kernel is a chain of latencies, not bytes (12 KB for
// S 2.1): thread t loads float4s t and t + NQ_THREADS of x and of w at once and keeps them,
// so the row is read once; one block-wide sum; then every 256-block is quantised by its own
// warp in a single round. (The 256-thread version that read x twice and quantised in two
// rounds took 7.8 µs per norm on the H200, ncu, S 2.1 decode.) Q: NQ_NONE writes the f32
// output only (rms_norm_row: the input of float-weight products, which read it as it is).
#define NQ_NONE 0
#define NQ_Q8K 1
#define NQ_Q8_0 2
template <int Q>
__device__ void rms_norm_quant(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                               u8* __restrict__ xq, int glen, float eps) {
    __shared__ __align__(16) float y[NQ_MAX];
    __shared__ float part[NQ_THREADS / 32];
    int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
    int n4 = glen / 4;
    float4 xv[NQ_VEC], wv[NQ_VEC];
    // The gain (a weight, likely evicted from L2 by the products since the last step) is
    // read before the wait, so only x, which the kernel before wrote, is read after it.
    #pragma unroll
    for (int k = 0; k < NQ_VEC; k++) {
        int i = tid + k * NQ_THREADS;
        if (i < n4) wv[k] = __ldg((const float4*)w + i);
    }
    PDL_ENTRY();
    #pragma unroll
    for (int k = 0; k < NQ_VEC; k++) {
        int i = tid + k * NQ_THREADS;
        if (i < n4) xv[k] = ((const float4*)x)[i];
    }
    // Block-wide sum of squares: a different order from rms_norm's one-warp sum, so the
    // normed values may differ from the unfused kernel's in the last bit, which can move a
    // quantised activation across a rounding boundary: the device tests bound this path by
    // the quantisation error, not by the exact path's 1e-6.
    float ss = 0.0f;
    #pragma unroll
    for (int k = 0; k < NQ_VEC; k++)
        if (tid + k * NQ_THREADS < n4)
            ss += xv[k].x * xv[k].x + xv[k].y * xv[k].y + xv[k].z * xv[k].z + xv[k].w * xv[k].w;
    ss = warp_sum(ss);
    if (lane == 0) part[warp] = ss;
    __syncthreads();
    float tot = lane < NQ_THREADS / 32 ? part[lane] : 0.0f;
    tot = warp_sum(tot);
    float r = 1.0f / sqrtf(tot / (float)glen + eps);
    #pragma unroll
    for (int k = 0; k < NQ_VEC; k++) {
        int i = tid + k * NQ_THREADS;
        if (i < n4) {
            float4 v = make_float4(wv[k].x * (xv[k].x * r), wv[k].y * (xv[k].y * r), wv[k].z * (xv[k].z * r),
                                   wv[k].w * (xv[k].w * r));
            if (Q != NQ_NONE) ((float4*)y)[i] = v;
            ((float4*)out)[i] = v;
        }
    }
    if (Q == NQ_NONE) return;
    __syncthreads();
    if (Q == NQ_Q8K) {
        for (int b = warp; b < glen / QK_K; b += NQ_THREADS / 32) warp_quantize_q8K(y + b * QK_K, xq, glen, b);
    } else {
        // Eight lanes per block; the loop's bound is the warp's, so every lane of a warp
        // reaches each group_quantize_q8_0.
        for (int b0 = warp * 4; b0 < glen / QK; b0 += NQ_THREADS / 8) {
            int b = b0 + (lane >> 3);
            group_quantize_q8_0(y + b * QK, xq, glen, b, b < glen / QK);
        }
    }
}

extern "C" __global__ void __launch_bounds__(NQ_THREADS)
rms_norm_q8_K(const float* x, const float* w, float* out, u8* xq, int glen, float eps) {
    rms_norm_quant<NQ_Q8K>(x, w, out, xq, glen, eps);
}

extern "C" __global__ void __launch_bounds__(NQ_THREADS)
rms_norm_q8_0(const float* x, const float* w, float* out, u8* xq, int glen, float eps) {
    rms_norm_quant<NQ_Q8_0>(x, w, out, xq, glen, eps);
}

// The same norm of one row without a quantised copy (xq unused).
extern "C" __global__ void __launch_bounds__(NQ_THREADS)
rms_norm_row(const float* x, const float* w, float* out, u8* xq, int glen, float eps) {
    rms_norm_quant<NQ_NONE>(x, w, out, xq, glen, eps);
}

// QK-norm, RoPE and the KV store of the step's tokens (graph nodes RmsNorm q, RmsNorm k,
// Rope q, Rope k, KvStore): one warp per (head, token) over the hq query heads then the n_kv
// key heads of token t = blockIdx.y. A query head is normed with qw (d wide), rotated
// (norm.cu's rope arithmetic) and written to q_out; a key head likewise with kw, written
// straight into the cache row of the token's position, and the matching value head copied
// next to it. The arithmetic is rms_norm's and rope's, in their order: the results are
// bitwise those of the five unfused kernels. Grid (ceil((hq + n_kv) / QKR_WARPS), n), block
// 32 * QKR_WARPS; d <= QKR_MAX_D; rows of q, k, v and q_out are hq d, n_kv d, n_kv d, hq d.
// The cache is f32 (qk_norm_rope_store), f16, bf16 or q8_0 (the _f16, _bf16 and _q8_0 twins,
// common.cuh's Kv). The gains and frequencies are read before the wait (norm_rope_weights),
// the head, the value and the position in one round after it.
template <typename KV>
__device__ void qk_norm_rope_store_t(const float* __restrict__ q, const float* __restrict__ k,
                                     const float* __restrict__ v, const float* __restrict__ qw,
                                     const float* __restrict__ kw, float* __restrict__ q_out, KV* __restrict__ kc,
                                     KV* __restrict__ vc, int cap, const float* __restrict__ inv_freq, float scale,
                                     int rd, int d, int hq, int n_kv, float eps, const u32* __restrict__ params) {
    __shared__ float ys[QKR_WARPS][QKR_MAX_D];
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int h = blockIdx.x * QKR_WARPS + warp;
    if (h >= hq + n_kv) {
        PDL_ENTRY();
        return;
    }
    bool is_q = h < hq;
    int hk = h - hq, t = blockIdx.y;
    // The gain and the frequencies are weights: read before the wait.
    float xv[NRH_J], wv[NRH_J], fv[NRH_J], vv[NRH_J];
    norm_rope_weights(is_q ? qw : kw, inv_freq, d, rd, wv, fv);
    PDL_ENTRY();
    q += (size_t)t * hq * d;
    q_out += (size_t)t * hq * d;
    k += (size_t)t * n_kv * d;
    v += (size_t)t * n_kv * d;
    const float* x = is_q ? q + (size_t)h * d : k + (size_t)hk * d;
    // The head's inputs (and a key head's value) in one round of loads with the position.
    u32 pos = params[P_POS0] + t;
    #pragma unroll
    for (int j = 0; j < NRH_J; j++) {
        int i = lane + 32 * j;
        if (i < d) {
            xv[j] = x[i];
            if (!is_q) vv[j] = v[(size_t)hk * d + i];
        }
    }
    // An f32 cache takes the query's and the key's values through one pointer; an f16 cache
    // stores the key's rounded (Kv).
    KV* kd = kc + (size_t)(pos % cap) * n_kv * d + (size_t)hk * d;
    float* qd = q_out + (size_t)h * d;
    if constexpr (sizeof(KV) == 4) qd = is_q ? qd : (float*)kd;
    // q8_0 (d a multiple of 32, the host checks): elements i = lane + 32 j of a head arrive
    // together from the warp, one block per j.
    size_t slot = (size_t)(pos % cap) * n_kv * d + (size_t)hk * d;
    norm_rope_head_pre(xv, wv, fv, ys[warp], d, rd, pos, scale, eps, [&](int i, float o) {
        if constexpr (sizeof(KV) == 4) qd[i] = o;
        else if (is_q) qd[i] = o;
        else if constexpr (Kv<KV>::Q8) kvq8_store_warp(kc, cap, n_kv * d, slot + (i & ~31), o);
        else Kv<KV>::st(kd + i, o);
    });
    if (!is_q) {
        KV* vd = vc + slot;
        #pragma unroll
        for (int j = 0; j < NRH_J; j++) {
            int i = lane + 32 * j;
            if (i >= d) break;
            if constexpr (Kv<KV>::Q8) kvq8_store_warp(vc, cap, n_kv * d, slot + (i & ~31), vv[j]);
            else Kv<KV>::st(vd + i, vv[j]);
        }
    }
}

#define QKR_KERNEL(sfx, KV)                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * QKR_WARPS) qk_norm_rope_store##sfx(            \
        const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,       \
        const float* __restrict__ qw, const float* __restrict__ kw, float* __restrict__ q_out,       \
        KV* __restrict__ kc, KV* __restrict__ vc, int cap, const float* __restrict__ inv_freq,       \
        float scale, int rd, int d, int hq, int n_kv, float eps, const u32* __restrict__ params) {   \
        qk_norm_rope_store_t<KV>(q, k, v, qw, kw, q_out, kc, vc, cap, inv_freq, scale, rd, d, hq,    \
                                 n_kv, eps, params);                                                 \
    }
QKR_KERNEL(, float)
QKR_KERNEL(_f16, unsigned short)
QKR_KERNEL(_bf16, kv_bf16)
QKR_KERNEL(_q8_0, kv_q8)

// attention_merge followed by the softplus output gate (GateMul): out = merged *
// softplus(g[c / per]) for element c of the token's hq * d outputs, per = hq * d / gcols.
// Grid (hq, 1), block 128.
extern "C" __global__ void attention_merge_gate(const float* __restrict__ part, const float* __restrict__ g,
                                                float* __restrict__ out, int hq, int d, int n_split, int gcols) { PDL_ENTRY();
    __shared__ float sms[MERGE_SPLITS_MAX], sls[MERGE_SPLITS_MAX], sw[MERGE_SPLITS_MAX], sM[1], sL[1];
    int h = blockIdx.x;
    const float* ps = part + (size_t)h * n_split * (d + 2);
    merge_weights(part, h, 1, d, n_split, sms, sls, sw, sM, sL);
    float L = sL[0];
    int per = hq * d / gcols;
    float* oh = out + (size_t)h * d;
    for (int k = threadIdx.x; k < d; k += blockDim.x)
        oh[k] = (merge_sum_w(ps, d, n_split, k, sms, sw) / L) * softplus_f(g[(h * d + k) / per]);
}

// attention_merge_gate followed by the output projection's activation quantiser (Q8_K or
// Q8_0, act.cuh): a block merges the split states of G consecutive heads (G d a multiple of
// the quantiser's block; G d <= MGQ_MAX), gates them, writes the f32 output as
// attention_merge_gate does, and quantises its G d values into the one-row scratch xq
// (cols = hq d) with act.cuh's functions, so the values and quants are bitwise those of
// attention_merge_gate then quantize_q8_K / quantize_q8_0. Grid (hq / G), block MGQ_THREADS.
#define MGQ_THREADS 128
#define MGQ_MAX 1024
template <bool Q8K>
__device__ void merge_gate_quant(const float* __restrict__ part, const float* __restrict__ g, float* __restrict__ out,
                                 u8* __restrict__ xq, int hq, int d, int n_split, int gcols, int G) {
    __shared__ __align__(16) float y[MGQ_MAX];
    __shared__ float sms[MERGE_MAX], sls[MERGE_MAX], sw[MERGE_MAX], hm[MGQ_MAX / 32], hl[MGQ_MAX / 32];
    int tid = threadIdx.x, h0 = blockIdx.x * G;
    // Each head's max, sum and split weights, as attention_merge_gate has them.
    merge_weights(part, h0, G, d, n_split, sms, sls, sw, hm, hl);
    int per = hq * d / gcols;
    for (int i = tid; i < G * d; i += MGQ_THREADS) {
        int hh = i / d, k = i - hh * d, h = h0 + hh;
        const float* ps = part + (size_t)h * n_split * (d + 2);
        float L = hl[hh];
        float v = (merge_sum_w(ps, d, n_split, k, sms + hh * n_split, sw + hh * n_split) / L) *
                  softplus_f(g[(h * d + k) / per]);
        out[(size_t)h * d + k] = v;
        y[i] = v;
    }
    __syncthreads();
    int cols = hq * d, first = h0 * d;
    if constexpr (Q8K) {
        for (int j = tid / 32; j < G * d / QK_K; j += MGQ_THREADS / 32)
            warp_quantize_q8K(y + j * QK_K, xq, cols, first / QK_K + j);
    } else {
        for (int j0 = (tid >> 5) * 4; j0 < G * d / QK; j0 += MGQ_THREADS / 8) {
            int j = j0 + ((tid & 31) >> 3);
            group_quantize_q8_0(y + j * QK, xq, cols, first / QK + j, j < G * d / QK);
        }
    }
}

extern "C" __global__ void __launch_bounds__(MGQ_THREADS)
attention_merge_gate_q8_K(const float* part, const float* g, float* out, u8* xq, int hq, int d, int n_split,
                          int gcols, int G) { PDL_ENTRY();
    merge_gate_quant<true>(part, g, out, xq, hq, d, n_split, gcols, G);
}

extern "C" __global__ void __launch_bounds__(MGQ_THREADS)
attention_merge_gate_q8_0(const float* part, const float* g, float* out, u8* xq, int hq, int d, int n_split,
                          int gcols, int G) { PDL_ENTRY();
    merge_gate_quant<false>(part, g, out, xq, hq, d, n_split, gcols, G);
}
