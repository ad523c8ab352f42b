// Helpers shared by every kernel: fp16/bf16 loads, warp reductions, the step parameters.
#pragma once
#include <cuda_fp16.h>
#include "blocks.cuh"

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

// The step parameters live in device memory (written once per step before any launch), so a
// captured CUDA graph replays with the new position: p[0] = first position, p[1] = number
// of tokens, p[2..2 + n] = token ids.
#define P_POS0 0
#define P_NTOK 1
#define P_TOKENS 2

// +infinity without <math_constants.h>.
#define LG_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float f16_to_f32(unsigned short bits) {
    return __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ float bf16_to_f32(unsigned short bits) {
    return __uint_as_float(((u32)bits) << 16);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// torch's softplus with threshold 20 (lagoon_core::ops::softplus).
__device__ __forceinline__ float softplus_f(float z) { return z > 20.0f ? z : log1pf(expf(z)); }

// 1 / (1 + exp(-z)), as lagoon_core::ops::sigmoid.
__device__ __forceinline__ float sigmoid_f(float z) { return 1.0f / (1.0f + expf(-z)); }

// z * sigmoid(z) written as z / (1 + exp(-z)), as lagoon_core::ops::silu.
__device__ __forceinline__ float silu_f(float z) { return z / (1.0f + expf(-z)); }
