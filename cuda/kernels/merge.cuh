// Merging the split-K states of one head's attention (attention.cu's layout: per split s,
// the d unnormalised sums o_s, then the split's max M_s and sum L_s): with M = max_s M_s,
// out = sum_s o_s e^(M_s - M) / sum_s L_s e^(M_s - M); empty splits (M_s = -inf) count zero.
// Shared by attention.cu's merge and fused.cu's merges with the gate (and quantiser); the
// split-K kernels (attention.cu, flash.cu) take each split's keys from split_keys.
//
// A block merges nh heads (the heads h0 .. h0 + nh − 1 of part, each with n_split states).
// merge_weights loads every split's max and sum by its own thread (in flight together), takes
// each head's M as the max of its splits, computes each split's weight w_s = e^(M_s − M) once
// (not once per output element), and sums L over the splits in order, one thread per head;
// merge_sum_w then adds o_s[k] w_s over the splits in order, eight splits' loads at a time.
// (Session 15, H200: the first form, where every thread took the maxima, sums and weights
// itself one split after another, spent 8.2 µs per launch at 32 splits, 393 µs per S 2.1
// token at depth 32k; unrolling its loops by 8 gave 326.) Every value is the same expf of the
// same operands added in the same order as that form's, so the outputs kept its bits.
#pragma once
#include "common.cuh"

// The keys split `split` of n_split reads for a query at position pos: the visible keys
// first .. pos (first = max(0, pos + 1 − window) on sliding layers, window > 0) in n_split
// equal runs (the last ones may be short or empty: first > last).
__device__ __forceinline__ void split_keys(int pos, int window, int split, int n_split, int& first, int& last) {
    first = window > 0 ? max(0, pos + 1 - window) : 0;
    last = pos;
    if (n_split > 1) {
        int per = (pos + 1 - first + n_split - 1) / n_split;
        int lo = first + split * per;
        last = min(pos, lo + per - 1);
        first = lo;
    }
}

// Bounds of the shared scratch (session.rs checks them at compile time): MERGE_SPLITS_MAX
// splits (session.rs MAX_SPLITS), MERGE_MAX = 32 heads (the fused quantiser's most,
// manifest.rs MERGE_QUANT_HEADS) of that many.
#define MERGE_SPLITS_MAX 64
#define MERGE_MAX (32 * MERGE_SPLITS_MAX)

// Shared scratch: sms, sls, sw of nh n_split floats (the splits' maxima, sums and weights),
// sM and sL of nh (the heads' M and L). Called by the whole block; ends with a barrier.
__device__ __forceinline__ void merge_weights(const float* __restrict__ part, int h0, int nh, int d, int n_split,
                                              float* sms, float* sls, float* sw, float* sM, float* sL) {
    int n = nh * n_split;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        // Head h0 + i / n_split, split i % n_split: the states of consecutive heads follow
        // each other, so state i of the block is at (h0 n_split + i) (d + 2).
        const float* p = part + ((size_t)h0 * n_split + i) * (d + 2);
        sms[i] = p[d];
        sls[i] = p[d + 1];
    }
    __syncthreads();
    for (int hh = threadIdx.x; hh < nh; hh += blockDim.x) {
        float M = -LG_INF;
        for (int s = 0; s < n_split; s++) M = fmaxf(M, sms[hh * n_split + s]);
        sM[hh] = M;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float ms = sms[i];
        sw[i] = ms != -LG_INF ? expf(ms - sM[i / n_split]) : 0.0f;
    }
    __syncthreads();
    for (int hh = threadIdx.x; hh < nh; hh += blockDim.x) {
        float L = 0.0f;
        for (int s = 0; s < n_split; s++)
            if (sms[hh * n_split + s] != -LG_INF) L += sls[hh * n_split + s] * sw[hh * n_split + s];
        sL[hh] = L;
    }
    __syncthreads();
}

// The head's merged unnormalised output at dim k, from its states ps and its splits' maxima
// ms and weights w (merge_weights' shared scratch).
__device__ __forceinline__ float merge_sum_w(const float* __restrict__ ps, int d, int n_split, int k,
                                             const float* ms, const float* w) {
    float o = 0.0f;
    #pragma unroll 8
    for (int s = 0; s < n_split; s++)
        if (ms[s] != -LG_INF) o += ps[s * (d + 2) + k] * w[s];
    return o;
}
