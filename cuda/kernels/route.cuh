// The decode step's top-k routing by one warp (moe.cu's route_block by a whole block): the
// same selection (sigmoid(z) + bias, descending, ties to the lower expert; NaN and -inf
// scores through route_block's serial rule) and the same weights (the chosen experts'
// sigmoids, divided by their sum taken in slot order when norm), meant bit for bit (device
// test route_in_experts_gives_the_unfused_bits; not yet run on a device). For kernels
// that need the routing of the token they work on (mmvq.cu's moe_gate_up_route_*), so the
// routing needs no launch of its own.
#pragma once
#include "common.cuh"

// Experts per lane: E <= 32 * WR_PER_LANE.
#define WR_PER_LANE 8
#define WR_NONE 0x7fffffff

// The expert of slot k of the top-K of E scores (z: router logits, bias: the selection
// bias), by k + 1 rounds of a warp arg-max over the scores held WR_PER_LANE per lane (expert
// lane + 32 j). With ids_out (not null) the warp does all K rounds and writes the ids (u32
// bits), the weights and their copy (copy[0, K): ids, copy[K, 2K): weights). K <= 32 and K
// <= E <= 32 * WR_PER_LANE. Every lane returns the same expert.
__device__ __forceinline__ u32 warp_route(const float* __restrict__ z, const float* __restrict__ bias, int E,
                                          int K, int norm, int k, float* __restrict__ ids_out,
                                          float* __restrict__ w_out, float* __restrict__ copy) {
    int lane = threadIdx.x & 31;
    float v[WR_PER_LANE], sg[WR_PER_LANE];
    u32 avail = 0;
    bool odd = false;
    #pragma unroll
    for (int j = 0; j < WR_PER_LANE; j++) {
        int e = lane + 32 * j;
        sg[j] = 0.0f;
        v[j] = 0.0f;
        if (e < E) {
            float s = sigmoid_f(z[e]);
            sg[j] = s;
            v[j] = s + bias[e];
            avail |= 1u << j;
            if (!(v[j] > -LG_INF)) odd = true;
        }
    }
    odd = __any_sync(0xffffffffu, odd);
    int last = ids_out ? K - 1 : k;
    u32 mine = 0, my_id = 0;
    float my_w = 0.0f, sum = 0.0f;
    if (!odd) {
        for (int slot = 0; slot <= last; slot++) {
            // The lane's best: experts rise with j, so a strict > keeps the lower on ties.
            float bv = 0.0f;
            int be = WR_NONE;
            #pragma unroll
            for (int j = 0; j < WR_PER_LANE; j++)
                if ((avail >> j) & 1u && (be == WR_NONE || v[j] > bv)) {
                    bv = v[j];
                    be = lane + 32 * j;
                }
            #pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, bv, off);
                int oe = __shfl_xor_sync(0xffffffffu, be, off);
                if (oe != WR_NONE && (be == WR_NONE || ov > bv || (ov == bv && oe < be))) {
                    bv = ov;
                    be = oe;
                }
            }
            float own = 0.0f;
            #pragma unroll
            for (int j = 0; j < WR_PER_LANE; j++)
                if (j == (be >> 5)) own = sg[j];
            float sw = __shfl_sync(0xffffffffu, own, be & 31);
            if ((be & 31) == lane) avail &= ~(1u << (be >> 5));
            sum += sw;
            if (slot == k) mine = (u32)be;
            if (lane == slot) {
                my_id = (u32)be;
                my_w = sw;
            }
        }
    } else if (lane == 0) {
        // route_block's serial selection: NaN is never chosen, a taken expert's score
        // becomes -inf, and a slot with nothing left takes expert `slot`.
        u32 taken[WR_PER_LANE] = {};
        float ws[32];
        for (int slot = 0; slot <= last; slot++) {
            float bv = -LG_INF;
            int be = WR_NONE;
            for (int e = 0; e < E; e++) {
                float s = (taken[e >> 5] >> (e & 31)) & 1u ? -LG_INF : sigmoid_f(z[e]) + bias[e];
                if (!isnan(s) && (s > bv || (s == bv && e < be))) {
                    bv = s;
                    be = e;
                }
            }
            if (be == WR_NONE) be = slot;
            taken[be >> 5] |= 1u << (be & 31);
            ws[slot] = sigmoid_f(z[be]);
            if (slot == k) mine = (u32)be;
            if (ids_out) ids_out[slot] = __uint_as_float((u32)be);
        }
        if (ids_out) {
            float tot = 0.0f;
            for (int slot = 0; slot < K; slot++) tot += ws[slot];
            for (int slot = 0; slot < K; slot++) {
                float w = norm ? ws[slot] / tot : ws[slot];
                w_out[slot] = w;
                copy[slot] = ids_out[slot];
                copy[K + slot] = w;
            }
        }
    }
    __syncwarp();
    mine = __shfl_sync(0xffffffffu, mine, 0);
    if (ids_out && !odd && lane < K) {
        float w = norm ? my_w / sum : my_w;
        ids_out[lane] = __uint_as_float(my_id);
        w_out[lane] = w;
        copy[lane] = __uint_as_float(my_id);
        copy[K + lane] = w;
    }
    return mine;
}
