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

// Programmatic dependent launch (sm_90; see device.rs): a kernel launched with the
// programmatic-serialization attribute may start while the kernel before it in the stream
// is still running. pdl_wait blocks until that kernel has finished and its writes are
// visible (so it must come before the first read of anything an earlier kernel wrote, and
// before the first write of anything an earlier kernel reads); pdl_trigger lets the next
// kernel be scheduled. Both are no-ops in a launch without the attribute.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// The start of every kernel that may run under programmatic launch and reads nothing before
// it: wait for the kernel before, then let the next one be scheduled (its blocks take their
// places and wait, so its start costs no launch gap).
#define PDL_ENTRY()   \
    do {              \
        pdl_wait();   \
        pdl_trigger(); \
    } while (0)

// Asks for bytes [p, p + n) of global memory to be brought into L2 (Hopper's bulk prefetch:
// nothing is returned and nothing waits for it). Only whole 16-byte units inside the range
// are named, so the range must simply lie inside one allocation. For weights, which no
// kernel writes: a kernel may prefetch its weights before pdl_wait.
__device__ __forceinline__ void prefetch_l2(const void* p, u64 n) {
    u64 a = (u64)__cvta_generic_to_global(p);
    u64 lo = (a + 15) & ~15ull, hi = (a + n) & ~15ull;
    if (hi > lo)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(lo), "r"((u32)(hi - lo)) : "memory");
}
