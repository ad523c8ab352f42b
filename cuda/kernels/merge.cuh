// Merging the split-K states of one head's attention (attention.cu's layout: per split s,
// the d unnormalised sums o_s, then the split's max M_s and sum L_s): with M = max_s M_s,
// out = sum_s o_s e^(M_s - M) / sum_s L_s e^(M_s - M); empty splits (M_s = -inf) count zero.
// Shared by attention.cu's merge and fused.cu's merges with the gate (and quantiser).
// The loops over the splits are unrolled by 8 so that eight splits' loads are in flight
// together (rolled, each load waits for its own round trip; with 32 splits a merge took 8.2
// µs per launch on the H200, session 15, which those serial round trips would explain); the
// order of the sums is unchanged.
#pragma once
#include "common.cuh"

// The head's M and L from its n_split states at ps.
__device__ __forceinline__ void merge_stats(const float* __restrict__ ps, int d, int n_split, float& M, float& L) {
    M = -LG_INF;
    #pragma unroll 8
    for (int s = 0; s < n_split; s++) M = fmaxf(M, ps[s * (d + 2) + d]);
    L = 0.0f;
    #pragma unroll 8
    for (int s = 0; s < n_split; s++) {
        float ms = ps[s * (d + 2) + d];
        if (ms != -LG_INF) L += ps[s * (d + 2) + d + 1] * expf(ms - M);
    }
}

// The head's merged unnormalised output at dim k: sum_s o_s[k] e^(M_s - M), splits in order.
__device__ __forceinline__ float merge_sum(const float* __restrict__ ps, int d, int n_split, int k, float M) {
    float o = 0.0f;
    #pragma unroll 8
    for (int s = 0; s < n_split; s++) {
        float ms = ps[s * (d + 2) + d];
        if (ms != -LG_INF) o += ps[s * (d + 2) + k] * expf(ms - M);
    }
    return o;
}
