// QK-norm then partial RoPE of one head by one warp: the arithmetic of the graph's RmsNorm
// and Rope nodes (norm.cu's rms_norm and rope, in their order), shared by fused.cu's
// qk_norm_rope_store and attention.cu's attention_decode_qk so that the two give the same
// values bit for bit.
#pragma once
#include "common.cuh"

// Elements a lane holds: i = lane + 32 j for j < NRH_J, i < d (d <= 32 NRH_J).
#define NRH_J 8

// The lane's weights for norm_rope_head_pre: the gain w (wv) and, for i < rd, the frequency
// inv_freq[i mod rd / 2] (fv). Both are never written by a kernel, so a caller may read them
// before its pdl_wait.
__device__ __forceinline__ void norm_rope_weights(const float* __restrict__ w, const float* __restrict__ inv_freq,
                                                  int d, int rd, float (&wv)[NRH_J], float (&fv)[NRH_J]) {
    int lane = threadIdx.x & 31;
    int half = rd / 2;
    #pragma unroll
    for (int j = 0; j < NRH_J; j++) {
        int i = lane + 32 * j;
        if (i < d) {
            wv[j] = __ldg(w + i);
            fv[j] = i < rd ? __ldg(inv_freq + (i < half ? i : i - half)) : 0.0f;
        }
    }
}

// One head with its inputs in registers: lane l holds elements i = l + 32 j of x (xv) and
// its weights (norm_rope_weights); ys: d floats of shared memory for this warp; the rotation
// at position pos over the first rd dims (scale: the YaRN magnitude factor, 1 for plain
// RoPE); store(i, o) receives output element i (each element once, by the lane that computed
// it). Taking the inputs in registers lets a caller issue all its loads in one round (and the
// weights before its wait) instead of the three dependent rounds of loops that read x, then
// the gain, then the frequencies.
template <class Store>
__device__ __forceinline__ void norm_rope_head_pre(const float (&xv)[NRH_J], const float (&wv)[NRH_J],
                                                   const float (&fv)[NRH_J], float* ys, int d, int rd, u32 pos,
                                                   float scale, float eps, Store store) {
    int lane = threadIdx.x & 31;
    float ss = 0.0f;
    #pragma unroll
    for (int j = 0; j < NRH_J; j++)
        if (lane + 32 * j < d) ss += xv[j] * xv[j];
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)d + eps);
    #pragma unroll
    for (int j = 0; j < NRH_J; j++)
        if (lane + 32 * j < d) ys[lane + 32 * j] = wv[j] * (xv[j] * r);
    __syncwarp();
    int half = rd / 2;
    float p = (float)pos;
    #pragma unroll
    for (int j = 0; j < NRH_J; j++) {
        int i = lane + 32 * j;
        if (i >= d) break;
        float o;
        if (i >= rd) {
            o = ys[i];
        } else {
            float a = p * fv[j];
            float c = cosf(a) * scale, s = sinf(a) * scale;
            o = i < half ? __fsub_rn(__fmul_rn(ys[i], c), __fmul_rn(ys[i + half], s))
                         : __fadd_rn(__fmul_rn(ys[i], c), __fmul_rn(ys[i - half], s));
        }
        store(i, o);
    }
}

// The same with the inputs in memory: x the head's d inputs, w the gain (d), inv_freq the
// rd / 2 frequencies, all read here in one round.
template <class Store>
__device__ __forceinline__ void norm_rope_head(const float* __restrict__ x, const float* __restrict__ w, float* ys,
                                               int d, int rd, u32 pos, const float* __restrict__ inv_freq, float scale,
                                               float eps, Store store) {
    int lane = threadIdx.x & 31;
    float xv[NRH_J], wv[NRH_J], fv[NRH_J];
    norm_rope_weights(w, inv_freq, d, rd, wv, fv);
    #pragma unroll
    for (int j = 0; j < NRH_J; j++)
        if (lane + 32 * j < d) xv[j] = x[lane + 32 * j];
    norm_rope_head_pre(xv, wv, fv, ys, d, rd, pos, scale, eps, store);
}
