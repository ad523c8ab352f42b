// The routed-expert half of a MoE layer: the router (sigmoid, biased top-k, normalisation)
// and the selected experts' SwiGLU MLPs.
#include "quant.cuh"

#define MOE_WARPS 4
// Most experts a router handles (16 per lane).
#define ROUTE_MAX_EXPERTS 512

// Router, one warp per token (lagoon_core::ops::router::route): sel[e] = sigmoid(z[e]) +
// bias[e]; k times pick the largest sel (ties to the lower id, NaN never wins; all-NaN
// picks id = slot) and knock it out; weights are the unbiased sigmoids of the chosen,
// divided by their sum when `norm`. ids are written as u32 bits into the f32 arena.
extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS)
route(const float* __restrict__ z, const float* __restrict__ bias, float* __restrict__ ids,
      float* __restrict__ weights, int E, int K, int norm, int n) { PDL_ENTRY();
    int t = blockIdx.x * MOE_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (t >= n) return;
    const float* zt = z + (size_t)t * E;
    float sel[ROUTE_MAX_EXPERTS / 32];
    #pragma unroll
    for (int i = 0; i < ROUTE_MAX_EXPERTS / 32; i++) {
        int e = lane + 32 * i;
        sel[i] = e < E ? sigmoid_f(zt[e]) + bias[e] : __int_as_float(0x7fc00000);
    }
    u32* idt = (u32*)ids + (size_t)t * K;
    float* wt = weights + (size_t)t * K;
    float sum = 0.0f;
    for (int slot = 0; slot < K; slot++) {
        float bv = -LG_INF;
        int be = 0x7fffffff;
        #pragma unroll
        for (int i = 0; i < ROUTE_MAX_EXPERTS / 32; i++) {
            float v = sel[i];
            int e = lane + 32 * i;
            if (!isnan(v) && (v > bv || (v == bv && e < be))) { bv = v; be = e; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (ov > bv || (ov == bv && oe < be)) { bv = ov; be = oe; }
        }
        if (be == 0x7fffffff) be = slot;
        #pragma unroll
        for (int i = 0; i < ROUTE_MAX_EXPERTS / 32; i++)
            if (lane + 32 * i == be) sel[i] = -LG_INF;
        if (lane == 0) {
            float w = sigmoid_f(zt[be]);
            idt[slot] = (u32)be;
            wt[slot] = w;
            sum += w;
        }
    }
    if (lane == 0 && norm)
        for (int slot = 0; slot < K; slot++) wt[slot] = wt[slot] / sum;
}

// The same routing with one block of RB_THREADS per token: each expert's rank among the
// biased scores (larger first, ties to the lower id) is counted in parallel, and the experts
// of rank < K fill the slots. That equals route's K sequential picks whenever every score is
// finite; a token with a NaN or -inf score (where route's knock-out-to--inf rules decide)
// or K > E takes route's sequential algorithm on one thread. The slots' weights are kept in
// shared memory for the normalisation (the same sum, in slot order, as route's) rather than
// read back from global memory one by one; that made no measurable difference to S 2.1
// decode (BENCHMARKS.md), so the kernel's 9.4 µs per launch in the profile is spent
// elsewhere. Each expert's sigmoid is taken once (sg) for its weight. Grid (n), block
// RB_THREADS; K <= RB_MAX_K. (Not kept, session 25: a first round keeping each group of 32's
// K best as candidates, then ranking only those — exact, ~1/3 of the comparisons — but its
// extra barrier, shared atomics and serial candidate loop made S 2.1 Q4_K_M decode 303.3 ->
// 292 t/s on the H200.)
#define RB_THREADS 256
#define RB_MAX_K 64
// How many of keys[0 .. n) come before key v at index i (larger first, ties to the lower
// index): v's 0-based rank among them.
__device__ __forceinline__ int rank_among(const float* __restrict__ keys, int n, float v, int i) {
    int rank = 0;
    if ((n & 3) == 0) {
        // Four keys per shared load, eight loads unrolled: the plain loop's dependent loads
        // were thought the critical path of a one-block kernel (an estimate, not measured;
        // the counts are exact either way).
        const float4* k4 = (const float4*)keys;
        #pragma unroll 8
        for (int j4 = 0; j4 < n / 4; j4++) {
            float4 o = k4[j4];
            int j = 4 * j4;
            rank += (o.x > v || (o.x == v && j < i)) ? 1 : 0;
            rank += (o.y > v || (o.y == v && j + 1 < i)) ? 1 : 0;
            rank += (o.z > v || (o.z == v && j + 2 < i)) ? 1 : 0;
            rank += (o.w > v || (o.w == v && j + 3 < i)) ? 1 : 0;
        }
    } else {
        for (int j = 0; j < n; j++) {
            float o = keys[j];
            rank += (o > v || (o == v && j < i)) ? 1 : 0;
        }
    }
    return rank;
}
extern "C" __global__ void __launch_bounds__(RB_THREADS)
route_block(const float* __restrict__ z, const float* __restrict__ bias, float* __restrict__ ids,
            float* __restrict__ weights, int E, int K, int norm, int n) {
    __shared__ __align__(16) float sel[ROUTE_MAX_EXPERTS];
    __shared__ float sg[ROUTE_MAX_EXPERTS];
    __shared__ float ws[RB_MAX_K];
    __shared__ float wsum;
    __shared__ int odd;
    int t = blockIdx.x, tid = threadIdx.x;
    // The bias (a weight) before the wait: only the router's logits need it.
    float bv[ROUTE_MAX_EXPERTS / RB_THREADS];
    #pragma unroll
    for (int j = 0; j < ROUTE_MAX_EXPERTS / RB_THREADS; j++)
        if (tid + j * RB_THREADS < E) bv[j] = __ldg(bias + tid + j * RB_THREADS);
    PDL_ENTRY();
    if (t >= n) return;
    const float* zt = z + (size_t)t * E;
    if (tid == 0) odd = K > E;
    __syncthreads();
    #pragma unroll
    for (int j = 0; j < ROUTE_MAX_EXPERTS / RB_THREADS; j++) {
        int e = tid + j * RB_THREADS;
        if (e >= E) break;
        float s = sigmoid_f(zt[e]);
        float v = s + bv[j];
        sg[e] = s;
        sel[e] = v;
        if (!(v > -LG_INF)) odd = 1;
    }
    __syncthreads();
    u32* idt = (u32*)ids + (size_t)t * K;
    float* wt = weights + (size_t)t * K;
    if (odd) {
        if (tid == 0) {
            for (int slot = 0; slot < K; slot++) {
                float bv = -LG_INF;
                int be = 0x7fffffff;
                for (int e = 0; e < E; e++) {
                    float v = sel[e];
                    if (!isnan(v) && (v > bv || (v == bv && e < be))) { bv = v; be = e; }
                }
                if (be == 0x7fffffff) be = slot;
                if (be < E) sel[be] = -LG_INF;
                idt[slot] = (u32)be;
                ws[slot] = be < E ? sg[be] : sigmoid_f(zt[be]);
            }
        }
    } else {
        for (int e = tid; e < E; e += RB_THREADS) {
            float v = sel[e];
            int rank = rank_among(sel, E, v, e);
            if (rank < K) {
                idt[rank] = (u32)e;
                ws[rank] = sg[e];
            }
        }
    }
    __syncthreads();
    if (norm && tid == 0) {
        float sum = 0.0f;
        for (int slot = 0; slot < K; slot++) sum += ws[slot];
        wsum = sum;
    }
    if (norm) __syncthreads();
    if (tid < K) wt[tid] = norm ? ws[tid] / wsum : ws[tid];
}

// Warp dot of one decoded weight row with one f32 vector.
template <int T>
__device__ __forceinline__ float warp_dot(const u8* __restrict__ row, const float* __restrict__ x, int cols) {
    int lane = threadIdx.x & 31;
    float acc = 0.0f;
    for (int c = lane; c < (cols + 31) / 32; c += 32) {
        float w[32];
        decode_chunk<T>(row, c, cols, w);
        int kmax = min(32, cols - 32 * c);
        acc += dot_chunk(w, x + 32 * c, kmax);
    }
    return warp_sum(acc);
}

// act[p, r] = silu(gate_e[r] . x[t]) * (up_e[r] . x[t]) for pair p = (t, slot), e = ids[p].
// Grid (ceil(I / MOE_WARPS), n * K); expert e's matrix starts at e * expert_bytes.
template <int T>
__device__ void moe_gate_up(const u8* __restrict__ Wg, const u8* __restrict__ Wu, u64 expert_bytes,
                            u64 row_bytes, const float* __restrict__ x, const float* __restrict__ ids,
                            float* __restrict__ act, int I, int H, int K) {
    int r = blockIdx.x * MOE_WARPS + threadIdx.x / 32;
    int p = blockIdx.y;
    if (r >= I) return;
    int t = p / K;
    u32 e = __float_as_uint(ids[p]);
    size_t off = (size_t)e * expert_bytes + (size_t)r * row_bytes;
    const float* xt = x + (size_t)t * H;
    float g = warp_dot<T>(Wg + off, xt, H);
    float u = warp_dot<T>(Wu + off, xt, H);
    if ((threadIdx.x & 31) == 0) act[(size_t)p * I + r] = silu_f(g) * u;
}

// ys[p, r] = down_e[r] . act[p] for pair p = (t, slot), e = ids[p]: every (row, pair) is
// its own warp, so the K experts of a token run in parallel. Grid (ceil(H / MOE_WARPS), n * K).
template <int T>
__device__ void moe_down(const u8* __restrict__ Wd, u64 expert_bytes, u64 row_bytes,
                         const float* __restrict__ act, const float* __restrict__ ids,
                         float* __restrict__ ys, int H, int I) {
    int r = blockIdx.x * MOE_WARPS + threadIdx.x / 32;
    int p = blockIdx.y;
    if (r >= H) return;
    u32 e = __float_as_uint(ids[p]);
    float y = warp_dot<T>(Wd + (size_t)e * expert_bytes + (size_t)r * row_bytes, act + (size_t)p * I, I);
    if ((threadIdx.x & 31) == 0) ys[(size_t)p * H + r] = y;
}

// out[t, r] = scale * sum_k weights[t, k] * ys[t * K + k, r], the experts taken in ascending
// (id, slot) order (the CPU's and transformers' summation order). One block of COMBINE_THREADS
// per token: the K slots' order is ranked once into shared memory, then each thread sums its
// outputs r = tid, tid + COMBINE_THREADS, ... in that order.
#define COMBINE_THREADS 256
#define COMBINE_MAX_K 64
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS)
moe_combine(const float* __restrict__ ys, const float* __restrict__ ids, const float* __restrict__ weights,
            float* __restrict__ out, int H, int K, int n, float scale) { PDL_ENTRY();
    __shared__ int order[COMBINE_MAX_K];
    __shared__ float wt[COMBINE_MAX_K];
    int t = blockIdx.x;
    if (t >= n) return;
    const u32* idt = (const u32*)ids + (size_t)t * K;
    if ((int)threadIdx.x < K) {
        int k = threadIdx.x;
        long long mine = (long long)idt[k] * K + k;
        int rank = 0;
        for (int j = 0; j < K; j++) rank += ((long long)idt[j] * K + j) < mine ? 1 : 0;
        order[rank] = k;
        wt[rank] = weights[(size_t)t * K + k];
    }
    __syncthreads();
    for (int r = threadIdx.x; r < H; r += COMBINE_THREADS) {
        float acc = 0.0f;
        for (int s = 0; s < K; s++) acc += ys[((size_t)t * K + order[s]) * H + r] * wt[s];
        out[(size_t)t * H + r] = acc * scale;
    }
}

// ---- Expert-grouped path for prefill (n > 1) ----
//
// moe_group sorts the step's (token, slot) pairs by expert and cuts each expert's run into
// tiles of up to `group` pairs (GROUP_PAIRS for the
// kernels below, 64 or 32 for the tensor-core ones of gemm.cu); the grouped
// kernels then decode each expert row once per tile instead of once per pair. Each pair's
// result is the same arithmetic as the per-pair kernels (same chunk order, same warp sum), so
// the two paths agree bit for bit.

#define GROUP_PAIRS 8

// One block of 1024 threads. tiles[3 i .. 3 i + 3) = (expert, first sorted index, count);
// tiles past the last are written with count 0 (max_tiles = ceil(n_pairs / group) + E).
// Counting and placing use shared-memory atomics, so the order of an expert's pairs within
// its run is not fixed: every grouped kernel computes each pair in its own column (its own
// dot products), so results do not depend on it. (The former ballot scan read every pair
// once per expert: ~170 us per layer at 5120 pairs over 256 experts.)
extern "C" __global__ void __launch_bounds__(1024)
moe_group(const float* __restrict__ ids, u32* __restrict__ sorted, u32* __restrict__ tiles,
          int n_pairs, int E, int max_tiles, int group) { PDL_ENTRY();
    __shared__ u32 cnt[ROUTE_MAX_EXPERTS], off[ROUTE_MAX_EXPERTS + 1], toff[ROUTE_MAX_EXPERTS + 1];
    const u32* id = (const u32*)ids;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) atomicAdd(&cnt[id[p]], 1u);
    __syncthreads();
    if (threadIdx.x == 0) {
        off[0] = 0;
        toff[0] = 0;
        for (int e = 0; e < E; e++) {
            off[e + 1] = off[e] + cnt[e];
            toff[e + 1] = toff[e] + (cnt[e] + group - 1) / group;
        }
    }
    __syncthreads();
    // cnt becomes each expert's placement cursor.
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) {
        u32 e = id[p];
        sorted[off[e] + atomicAdd(&cnt[e], 1u)] = (u32)p;
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        u32 c = off[e + 1] - off[e];
        u32 nt = (c + group - 1) / group;
        for (u32 i = 0; i < nt; i++) {
            u32* tl = tiles + 3 * (toff[e] + i);
            tl[0] = (u32)e;
            tl[1] = off[e] + group * i;
            tl[2] = min((u32)group, c - group * i);
        }
    }
    for (int i = toff[E] + threadIdx.x; i < max_tiles; i += blockDim.x) tiles[3 * i + 2] = 0;
}

// Dots one decoded weight row with up to NT vectors xs[q] (q < nt); sums land in every lane.
// The per-vector arithmetic is warp_dot's.
template <int T, int NT>
__device__ __forceinline__ void warp_dot_multi(const u8* __restrict__ row, const float* const xs[NT],
                                               int cols, int nt, float acc[NT]) {
    int lane = threadIdx.x & 31;
    #pragma unroll
    for (int q = 0; q < NT; q++) acc[q] = 0.0f;
    for (int c = lane; c < (cols + 31) / 32; c += 32) {
        float w[32];
        decode_chunk<T>(row, c, cols, w);
        int kmax = min(32, cols - 32 * c);
        #pragma unroll
        for (int q = 0; q < NT; q++)
            if (q < nt) acc[q] += dot_chunk(w, xs[q] + 32 * c, kmax);
    }
    #pragma unroll
    for (int q = 0; q < NT; q++) acc[q] = warp_sum(acc[q]);
}

// Grouped gate/up: grid (ceil(I / MOE_WARPS), max_tiles). act[p, r] as moe_gate_up.
template <int T>
__device__ void moe_gate_up_grouped(const u8* __restrict__ Wg, const u8* __restrict__ Wu, u64 expert_bytes,
                                    u64 row_bytes, const float* __restrict__ x, const u32* __restrict__ sorted,
                                    const u32* __restrict__ tiles, float* __restrict__ act, int I, int H, int K) {
    int r = blockIdx.x * MOE_WARPS + threadIdx.x / 32;
    const u32* tl = tiles + 3 * blockIdx.y;
    int nt = (int)tl[2];
    if (r >= I || nt == 0) return;
    u32 e = tl[0], first = tl[1];
    const float* xs[GROUP_PAIRS];
    #pragma unroll
    for (int q = 0; q < GROUP_PAIRS; q++) xs[q] = x + (size_t)(sorted[first + min(q, nt - 1)] / K) * H;
    size_t off = (size_t)e * expert_bytes + (size_t)r * row_bytes;
    float g[GROUP_PAIRS], u[GROUP_PAIRS];
    warp_dot_multi<T, GROUP_PAIRS>(Wg + off, xs, H, nt, g);
    warp_dot_multi<T, GROUP_PAIRS>(Wu + off, xs, H, nt, u);
    if ((threadIdx.x & 31) == 0) {
        #pragma unroll
        for (int q = 0; q < GROUP_PAIRS; q++)
            if (q < nt) act[(size_t)sorted[first + q] * I + r] = silu_f(g[q]) * u[q];
    }
}

// Grouped down: grid (ceil(H / MOE_WARPS), max_tiles). ys[p, r] as moe_down.
template <int T>
__device__ void moe_down_grouped(const u8* __restrict__ Wd, u64 expert_bytes, u64 row_bytes,
                                 const float* __restrict__ act, const u32* __restrict__ sorted,
                                 const u32* __restrict__ tiles, float* __restrict__ ys, int H, int I) {
    int r = blockIdx.x * MOE_WARPS + threadIdx.x / 32;
    const u32* tl = tiles + 3 * blockIdx.y;
    int nt = (int)tl[2];
    if (r >= H || nt == 0) return;
    u32 e = tl[0], first = tl[1];
    const float* xs[GROUP_PAIRS];
    #pragma unroll
    for (int q = 0; q < GROUP_PAIRS; q++) xs[q] = act + (size_t)sorted[first + min(q, nt - 1)] * I;
    float y[GROUP_PAIRS];
    warp_dot_multi<T, GROUP_PAIRS>(Wd + (size_t)e * expert_bytes + (size_t)r * row_bytes, xs, I, nt, y);
    if ((threadIdx.x & 31) == 0) {
        #pragma unroll
        for (int q = 0; q < GROUP_PAIRS; q++)
            if (q < nt) ys[(size_t)sorted[first + q] * H + r] = y[q];
    }
}

#define DEFINE_MOE_GROUPED(name, T)                                                                \
    extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS) moe_gate_up_grouped_##name(      \
        const u8* Wg, const u8* Wu, u64 expert_bytes, u64 row_bytes, const float* x,               \
        const u32* sorted, const u32* tiles, float* act, int I, int H, int K) { PDL_ENTRY();                    \
        moe_gate_up_grouped<T>(Wg, Wu, expert_bytes, row_bytes, x, sorted, tiles, act, I, H, K);   \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS) moe_down_grouped_##name(         \
        const u8* Wd, u64 expert_bytes, u64 row_bytes, const float* act, const u32* sorted,        \
        const u32* tiles, float* ys, int H, int I) { PDL_ENTRY();                                               \
        moe_down_grouped<T>(Wd, expert_bytes, row_bytes, act, sorted, tiles, ys, H, I);            \
    }

#define MOE_TYPES(X) X(f32, WT_F32) X(f16, WT_F16) X(bf16, WT_BF16) X(q8_0, WT_Q8_0) X(q4_K, WT_Q4_K) X(q6_K, WT_Q6_K) X(ct4, WT_CT4) \
    X(q5_K, WT_Q5_K) X(iq4_xs, WT_IQ4_XS) X(iq3_xxs, WT_IQ3_XXS) X(iq2_xxs, WT_IQ2_XXS) X(iq2_s, WT_IQ2_S) X(ct8, WT_CT8)

#define DEFINE_MOE(name, T)                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS) moe_gate_up_##name(              \
        const u8* Wg, const u8* Wu, u64 expert_bytes, u64 row_bytes, const float* x,               \
        const float* ids, float* act, int I, int H, int K) { PDL_ENTRY();                                       \
        moe_gate_up<T>(Wg, Wu, expert_bytes, row_bytes, x, ids, act, I, H, K);                     \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS) moe_down_##name(                 \
        const u8* Wd, u64 expert_bytes, u64 row_bytes, const float* act, const float* ids,         \
        float* ys, int H, int I) { PDL_ENTRY();                                                                 \
        moe_down<T>(Wd, expert_bytes, row_bytes, act, ids, ys, H, I);                              \
    }
MOE_TYPES(DEFINE_MOE)
MOE_TYPES(DEFINE_MOE_GROUPED)
