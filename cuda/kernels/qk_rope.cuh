// QK-norm then partial RoPE of one head by one warp: the arithmetic of the graph's RmsNorm
// and Rope nodes (norm.cu's rms_norm and rope, in their order), shared by fused.cu's
// qk_norm_rope_store and attention.cu's attention_decode_qk so that the two give the same
// values bit for bit.
#pragma once
#include "common.cuh"

// x: the head's d inputs; w: the norm gain (d); ys: d floats of shared memory for this warp;
// the rotation at position pos over the first rd dims (inv_freq: rd / 2 frequencies, scale:
// the YaRN magnitude factor, 1 for plain RoPE); store(i, o) receives output element i (each
// element once, by the lane that computed it).
template <class Store>
__device__ __forceinline__ void norm_rope_head(const float* __restrict__ x, const float* __restrict__ w, float* ys,
                                               int d, int rd, u32 pos, const float* __restrict__ inv_freq, float scale,
                                               float eps, Store store) {
    int lane = threadIdx.x & 31;
    float ss = 0.0f;
    for (int i = lane; i < d; i += 32) ss += x[i] * x[i];
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)d + eps);
    for (int i = lane; i < d; i += 32) ys[i] = w[i] * (x[i] * r);
    __syncwarp();
    int half = rd / 2;
    float p = (float)pos;
    for (int i = lane; i < d; i += 32) {
        float o;
        if (i >= rd) {
            o = ys[i];
        } else {
            int f = i < half ? i : i - half;
            float a = p * inv_freq[f];
            float c = cosf(a) * scale, s = sinf(a) * scale;
            o = i < half ? __fsub_rn(__fmul_rn(ys[i], c), __fmul_rn(ys[i + half], s))
                         : __fadd_rn(__fmul_rn(ys[i], c), __fmul_rn(ys[i - half], s));
        }
        store(i, o);
    }
}

// norm_rope_head with the head's inputs already in registers: lane l holds elements
// i = l + 32 j (j < NRH_J, i < d) of x (xv), of the gain (wv) and, for i < rd, the frequency
// inv_freq[i mod rd / 2] (fv). The arithmetic is norm_rope_head's, term for term, so the
// outputs are bitwise the same; what differs is when the loads are issued: the caller reads
// the gain and the frequencies (weights) before its pdl_wait and x with its other inputs in
// one round after it, where norm_rope_head's loops made three dependent rounds (x, then
// the gain, then the frequencies). d <= 32 NRH_J.
#define NRH_J 8
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
