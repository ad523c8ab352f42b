// The KV cache store and causal (optionally sliding-window) GQA attention over it.
//
// Layer caches are rings of `cap` rows of `row = n_kv * d` elements, f32, f16 or bf16 (KV,
// see common.cuh's Kv; every kernel here has `_f16` and `_bf16` twins; the q8_0 cache only a
// store, kv_store_q8_0): position p lives in row p % cap
// (full layers: cap = n_ctx; sliding: window - 1 + ubatch, see cpu-experts/kv.rs).
#include "merge.cuh"
#include "qk_rope.cuh"

#define ATT_WARPS 4
#define ATT_MAX_D 256
// Keys whose value rows attention_decode loads together.
#define ATT_VB 4

// Writes the step's K and V rows at their positions. One thread per element.
template <typename KV>
__device__ void kv_store_t(const float* __restrict__ k, const float* __restrict__ v, KV* __restrict__ kc,
                           KV* __restrict__ vc, int cap, int row, int n, const u32* __restrict__ params) {
    PDL_ENTRY();
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)n * row) return;
    int t = (int)(idx / row), e = (int)(idx % row);
    size_t dst = (size_t)((params[P_POS0] + t) % cap) * row + e;
    Kv<KV>::st(kc + dst, k[idx]);
    Kv<KV>::st(vc + dst, v[idx]);
}

// One (query head h, token t) per block (grid (hq, n)); query position p = pos0 + t sees keys
// first..=p with first = max(0, p + 1 - window) on sliding layers (window > 0), else 0 —
// exactly the window p - W < j <= p. KV head = h / (hq / n_kv). Scores are scaled by
// 1/sqrt(d). Warp w takes keys first + w, first + w + ATT_WARPS, ... with an online softmax
// (running max m, sum l, accumulator acc over the lane's dims lane + 32 i); the warps'
// partial states are merged at the end. Mathematically the reference's softmax; the
// summation order differs.
//
// Split-K (flash-decoding) when gridDim.z = S > 1: split s takes the s-th of S equal runs of
// the visible keys and writes its unnormalised state (max M, sum L, sum of e^(score - M) v)
// to part[((t hq + h) S + s) (d + 2) ..]; attention_merge combines the S states. The number
// of visible keys is read from device memory, so a captured graph stays valid as the
// context grows.
template <typename KV>
__device__ void attention_t(const float* __restrict__ q, const KV* __restrict__ kc, const KV* __restrict__ vc,
                            float* __restrict__ out, float* __restrict__ part, int cap, int hq, int n_kv, int d,
                            int window, const u32* __restrict__ params) {
    PDL_ENTRY();
    int h = blockIdx.x, t = blockIdx.y;
    int split = blockIdx.z, n_split = gridDim.z;
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int kvh = h / (hq / n_kv);
    int row = n_kv * d;
    int pos = (int)params[P_POS0] + t;
    int first, last;
    split_keys(pos, window, split, n_split, first, last);
    float scale = 1.0f / sqrtf((float)d);
    const float* qh = q + ((size_t)t * hq + h) * d;
    float qr[ATT_MAX_D / 32], acc[ATT_MAX_D / 32];
    #pragma unroll
    for (int i = 0; i < ATT_MAX_D / 32; i++) {
        int k = lane + 32 * i;
        qr[i] = k < d ? qh[k] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -LG_INF, l = 0.0f;
    for (int j = first + warp; j <= last; j += ATT_WARPS) {
        const KV* kr = kc + (size_t)(j % cap) * row + (size_t)kvh * d;
        const KV* vr = vc + (size_t)(j % cap) * row + (size_t)kvh * d;
        float s = 0.0f;
        #pragma unroll
        for (int i = 0; i < ATT_MAX_D / 32; i++) {
            int k = lane + 32 * i;
            if (k < d) s += qr[i] * Kv<KV>::ld(kr + k);
        }
        s = warp_sum(s) * scale;
        float mn = fmaxf(m, s);
        float corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
        #pragma unroll
        for (int i = 0; i < ATT_MAX_D / 32; i++) {
            int k = lane + 32 * i;
            if (k < d) acc[i] = acc[i] * corr + p * Kv<KV>::ld(vr + k);
        }
        m = mn;
    }
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS];
    __shared__ float sacc[ATT_WARPS][ATT_MAX_D];
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
    #pragma unroll
    for (int i = 0; i < ATT_MAX_D / 32; i++) {
        int k = lane + 32 * i;
        if (k < d) sacc[warp][k] = acc[i];
    }
    __syncthreads();
    float M = -LG_INF;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w]);
    float L = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++) L += sm[w] == -LG_INF ? 0.0f : sl[w] * expf(sm[w] - M);
    float* oh = n_split > 1 ? part + (((size_t)t * hq + h) * n_split + split) * (d + 2)
                            : out + ((size_t)t * hq + h) * d;
    for (int k = threadIdx.x; k < d; k += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (sm[w] != -LG_INF) o += sacc[w][k] * expf(sm[w] - M);
        oh[k] = n_split > 1 ? o : o / L;
    }
    if (n_split > 1 && threadIdx.x == 0) {
        oh[d] = M;
        oh[d + 1] = L;
    }
}

// Combines the S split states of attention (grid (hq, n), block 128): with M = max_s M_s,
// out = sum_s o_s e^(M_s - M) / sum_s L_s e^(M_s - M). Empty splits (M_s = -inf) count zero.
extern "C" __global__ void attention_merge(const float* __restrict__ part, float* __restrict__ out,
                                           int hq, int d, int n_split) { PDL_ENTRY();
    __shared__ float sms[MERGE_SPLITS_MAX], sls[MERGE_SPLITS_MAX], sw[MERGE_SPLITS_MAX], sM[1], sL[1];
    int h = blockIdx.x, t = blockIdx.y;
    const float* ps = part + ((size_t)t * hq + h) * n_split * (d + 2);
    merge_weights(part, t * hq + h, 1, d, n_split, sms, sls, sw, sM, sL);
    float L = sL[0];
    float* oh = out + ((size_t)t * hq + h) * d;
    for (int k = threadIdx.x; k < d; k += blockDim.x) oh[k] = merge_sum_w(ps, d, n_split, k, sms, sw) / L;
}

// Decode attention for the quantised-activation path (one token; same grid, splits, outputs
// and visibility as `attention`, a different work split): each warp takes runs of 32 keys,
// lane l scoring key l of the run on its own (the whole d-wide dot from 16-byte loads, q in
// shared memory), so a run costs one warp max/sum instead of a shuffle reduction per key;
// then lanes switch to owning dim pairs (2 lane + 64 i, + 1) to add the run's p-weighted V
// rows (coalesced). Online softmax per warp, warps merged as in `attention`. The summation order
// differs from `attention` (and the CPU), so this kernel is not on the exact path. With one
// split and a gate g (not null), the output is multiplied by softplus(g[c / per]) as
// gate_mul does (per = hq d / gcols), fusing that node.
//
// QKF (attention_decode_qk): the step's QK-norm, RoPE and KV store done here instead of by
// fused.cu's qk_norm_rope_store, one launch fewer per layer. q, kin and vin are then the raw
// projections: warp 0 norms and rotates query head h into shared memory, warp 1 key head kvh
// and warp 2 copies value head kvh, both as the cache would return them (Kv round), and one
// block per key head (the first of its query heads, split 0) writes them to the cache row of
// the position. Every block takes the position's key and value from its own shared copy and
// never reads that cache row, so no block waits for another's write; the values are those
// the cache read would give, so the outputs are bitwise those of the unfused kernels.
template <typename KV, bool QKF>
__device__ void attention_decode_t(const float* __restrict__ q, const KV* __restrict__ kc, const KV* __restrict__ vc,
                                   float* __restrict__ out, float* __restrict__ part, int cap, int hq, int n_kv,
                                   int d, int window, const u32* __restrict__ params, const float* __restrict__ g,
                                   int gcols, const float* __restrict__ kin = nullptr,
                                   const float* __restrict__ vin = nullptr, const float* __restrict__ qw = nullptr,
                                   const float* __restrict__ kw = nullptr, const float* __restrict__ inv_freq = nullptr,
                                   float rscale = 1.0f, int rd = 0, float eps = 0.0f) {
    PDL_ENTRY();
    int h = blockIdx.x;
    int split = blockIdx.z, n_split = gridDim.z;
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int kvh = h / (hq / n_kv);
    int row = n_kv * d;
    int pos = (int)params[P_POS0];
    int first, last;
    split_keys(pos, window, split, n_split, first, last);
    __shared__ __align__(16) float qs[ATT_MAX_D];
    // The position's key and value (QKF), and the norm's scratch of warps 0 and 1.
    __shared__ __align__(16) float ks[QKF ? ATT_MAX_D : 1], vs[QKF ? ATT_MAX_D : 1];
    __shared__ float ys[QKF ? 2 : 1][QKF ? ATT_MAX_D : 1];
    if constexpr (QKF) {
        u32 upos = params[P_POS0];
        bool writer = h % (hq / n_kv) == 0 && split == 0;
        size_t slot = (size_t)(upos % cap) * row + (size_t)kvh * d;
        if (warp == 0) {
            norm_rope_head(q + (size_t)h * d, qw, ys[0], d, rd, upos, inv_freq, rscale, eps,
                           [&](int i, float o) { qs[i] = o; });
        } else if (warp == 1) {
            norm_rope_head(kin + (size_t)kvh * d, kw, ys[1], d, rd, upos, inv_freq, rscale, eps, [&](int i, float o) {
                ks[i] = Kv<KV>::round(o);
                if (writer) Kv<KV>::st((KV*)kc + slot + i, o);
            });
        } else if (warp == 2) {
            for (int i = lane; i < d; i += 32) {
                float x = vin[(size_t)kvh * d + i];
                vs[i] = Kv<KV>::round(x);
                if (writer) Kv<KV>::st((KV*)vc + slot + i, x);
            }
        }
    } else {
        for (int k = threadIdx.x; k < d; k += blockDim.x) qs[k] = q[(size_t)h * d + k];
    }
    __syncthreads();
    float scale = 1.0f / sqrtf((float)d);
    // Lane l holds output dims 2 l + 64 i and 2 l + 64 i + 1 (i < d / 64, rounded up): the
    // value rows are read as pairs (4 bytes per lane from an f16 cache, not 2). Each dim
    // still takes its keys one at a time in order, so the sums are those of a lane-per-dim
    // layout.
    float acc[ATT_MAX_D / 64][2];
    #pragma unroll
    for (int i = 0; i < ATT_MAX_D / 64; i++) acc[i][0] = acc[i][1] = 0.0f;
    float m = -LG_INF, l = 0.0f;
    for (int base = first + 32 * warp; base <= last; base += 32 * ATT_WARPS) {
        int j = base + lane;
        bool live = j <= last;
        float s = -LG_INF;
        if (live) {
            const KV* kr = kc + (size_t)(j % cap) * row + (size_t)kvh * d;
            const float4* q4 = (const float4*)qs;
            // The key's four values at element e: from the cache, or (QKF, the step's own
            // position) from the block's shared copy.
            auto dot = [&](auto ld4) {
                float a0 = 0.0f, a1 = 0.0f;
                // Unrolled so that eight iterations' key loads are in flight together (the
                // key row is 512 bytes of one lane's; rolled, each iteration waited for its
                // own).
                #pragma unroll 8
                for (int i = 0; i < d / 4; i += 2) {
                    float4 kv = ld4(4 * i), qv = q4[i];
                    a0 += kv.x * qv.x + kv.y * qv.y + kv.z * qv.z + kv.w * qv.w;
                    if (i + 1 < d / 4) {
                        float4 kv2 = ld4(4 * i + 4), qv2 = q4[i + 1];
                        a1 += kv2.x * qv2.x + kv2.y * qv2.y + kv2.z * qv2.z + kv2.w * qv2.w;
                    }
                }
                return (a0 + a1) * scale;
            };
            if (QKF && j == pos) s = dot([&](int e) { return *(const float4*)(ks + e); });
            else s = dot([&](int e) { return Kv<KV>::ld4(kr + e); });
        }
        float mn = fmaxf(m, warp_max(s));
        float corr = expf(m - mn);
        float p = live ? expf(s - mn) : 0.0f;
        l = l * corr + warp_sum(p);
        #pragma unroll
        for (int i = 0; i < ATT_MAX_D / 64; i++) {
            acc[i][0] *= corr;
            acc[i][1] *= corr;
        }
        int nk = min(32, last - base + 1);
        // Four keys' value rows are loaded before any is added (rolled, each key's loads
        // waited for their own round trip: 32 per chunk of keys); the additions keep the
        // one-key-at-a-time order.
        int jj = 0;
        for (; jj + ATT_VB <= nk; jj += ATT_VB) {
            float pv[ATT_VB];
            float2 xv[ATT_VB][ATT_MAX_D / 64];
            #pragma unroll
            for (int u = 0; u < ATT_VB; u++) {
                pv[u] = __shfl_sync(0xffffffffu, p, jj + u);
                const KV* vr = vc + (size_t)((base + jj + u) % cap) * row + (size_t)kvh * d;
                bool own = QKF && base + jj + u == pos;
                #pragma unroll
                for (int i = 0; i < ATT_MAX_D / 64; i++) {
                    int k = 2 * lane + 64 * i;
                    xv[u][i] = k >= d ? make_float2(0.0f, 0.0f)
                               : own  ? make_float2(vs[k], vs[k + 1])
                                      : Kv<KV>::ld2(vr + k);
                }
            }
            #pragma unroll
            for (int u = 0; u < ATT_VB; u++) {
                #pragma unroll
                for (int i = 0; i < ATT_MAX_D / 64; i++) {
                    if (2 * lane + 64 * i < d) {
                        acc[i][0] += pv[u] * xv[u][i].x;
                        acc[i][1] += pv[u] * xv[u][i].y;
                    }
                }
            }
        }
        for (; jj < nk; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            const KV* vr = vc + (size_t)((base + jj) % cap) * row + (size_t)kvh * d;
            bool own = QKF && base + jj == pos;
            #pragma unroll
            for (int i = 0; i < ATT_MAX_D / 64; i++) {
                int k = 2 * lane + 64 * i;
                if (k < d) {
                    float2 x = own ? make_float2(vs[k], vs[k + 1]) : Kv<KV>::ld2(vr + k);
                    acc[i][0] += pj * x.x;
                    acc[i][1] += pj * x.y;
                }
            }
        }
        m = mn;
    }
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS];
    __shared__ float sacc[ATT_WARPS][ATT_MAX_D];
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
    #pragma unroll
    for (int i = 0; i < ATT_MAX_D / 64; i++) {
        int k = 2 * lane + 64 * i;
        if (k < d) {
            sacc[warp][k] = acc[i][0];
            sacc[warp][k + 1] = acc[i][1];
        }
    }
    __syncthreads();
    float M = -LG_INF;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w]);
    float L = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++) L += sm[w] == -LG_INF ? 0.0f : sl[w] * expf(sm[w] - M);
    float* oh = n_split > 1 ? part + ((size_t)h * n_split + split) * (d + 2) : out + (size_t)h * d;
    int per = g ? hq * d / gcols : 1;
    for (int k = threadIdx.x; k < d; k += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (sm[w] != -LG_INF) o += sacc[w][k] * expf(sm[w] - M);
        if (n_split > 1) oh[k] = o;
        else oh[k] = g ? (o / L) * softplus_f(g[(h * d + k) / per]) : o / L;
    }
    if (n_split > 1 && threadIdx.x == 0) {
        oh[d] = M;
        oh[d + 1] = L;
    }
}

// The f32-, f16- and bf16-cache instantiations of the kernels above.
#define KV_KERNELS(sfx, KV)                                                                          \
    extern "C" __global__ void kv_store##sfx(const float* __restrict__ k, const float* __restrict__ v, \
                                             KV* __restrict__ kc, KV* __restrict__ vc, int cap, int row, \
                                             int n, const u32* __restrict__ params) {                \
        kv_store_t<KV>(k, v, kc, vc, cap, row, n, params);                                           \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS)                                     \
        attention##sfx(const float* __restrict__ q, const KV* __restrict__ kc, const KV* __restrict__ vc, \
                       float* __restrict__ out, float* __restrict__ part, int cap, int hq, int n_kv,  \
                       int d, int window, const u32* __restrict__ params) {                          \
        attention_t<KV>(q, kc, vc, out, part, cap, hq, n_kv, d, window, params);                     \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attention_decode##sfx(              \
        const float* __restrict__ q, const KV* __restrict__ kc, const KV* __restrict__ vc,           \
        float* __restrict__ out, float* __restrict__ part, int cap, int hq, int n_kv, int d,         \
        int window, const u32* __restrict__ params, const float* __restrict__ g, int gcols) {         \
        attention_decode_t<KV, false>(q, kc, vc, out, part, cap, hq, n_kv, d, window, params, g, gcols); \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attention_decode_qk##sfx(           \
        const float* __restrict__ q, KV* __restrict__ kc, KV* __restrict__ vc, float* __restrict__ out, \
        float* __restrict__ part, int cap, int hq, int n_kv, int d, int window,                      \
        const u32* __restrict__ params, const float* __restrict__ g, int gcols,                      \
        const float* __restrict__ kin, const float* __restrict__ vin, const float* __restrict__ qw,  \
        const float* __restrict__ kw, const float* __restrict__ inv_freq, float rscale, int rd,      \
        float eps) {                                                                                 \
        attention_decode_t<KV, true>(q, kc, vc, out, part, cap, hq, n_kv, d, window, params, g, gcols, kin, \
                                     vin, qw, kw, inv_freq, rscale, rd, eps);                        \
    }
KV_KERNELS(, float)
KV_KERNELS(_f16, unsigned short)
KV_KERNELS(_bf16, kv_bf16)

// kv_store into the q8_0 cache (common.cuh kv_q8): one thread per element as kv_store, each
// warp's 32 consecutive elements one q8_0 block (row a multiple of 32, blockDim of 32; the
// host checks), quantised together. Only the store: the q8_0 cache is read by flash.cu's
// kernels alone.
extern "C" __global__ void kv_store_q8_0(const float* __restrict__ k, const float* __restrict__ v,
                                         kv_q8* __restrict__ kc, kv_q8* __restrict__ vc, int cap, int row,
                                         int n, const u32* __restrict__ params) {
    PDL_ENTRY();
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)n * row) return;  // whole warps: n row is a multiple of 32
    int t = (int)(idx / row), e = (int)(idx % row);
    size_t b0 = (size_t)((params[P_POS0] + t) % cap) * row + (e & ~31);
    kvq8_store_warp(kc, cap, row, b0, k[idx]);
    kvq8_store_warp(vc, cap, row, b0, v[idx]);
}
