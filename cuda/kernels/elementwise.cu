// Elementwise ops over `len` elements, one thread each.
#include "common.cuh"

// out = a + b (residual adds).
extern "C" __global__ void add(const float* __restrict__ a, const float* __restrict__ b,
                               float* __restrict__ out, u64 len) { PDL_ENTRY();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) out[i] = a[i] + b[i];
}

// out = silu(gate) * up.
extern "C" __global__ void swiglu(const float* __restrict__ gate, const float* __restrict__ up,
                                  float* __restrict__ out, u64 len) { PDL_ENTRY();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) out[i] = silu_f(gate[i]) * up[i];
}

// out = o * softplus(g), g per head (ocols / gcols = head_dim) or per element (ratio 1).
extern "C" __global__ void gate_mul(const float* __restrict__ o, const float* __restrict__ g,
                                    float* __restrict__ out, int ocols, int gcols, u64 len) { PDL_ENTRY();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    u64 t = i / ocols;
    int c = (int)(i % ocols);
    int per = ocols / gcols;
    out[i] = o[i] * softplus_f(g[t * gcols + c / per]);
}

// dst[i] = src[i] (the last-row pick).
extern "C" __global__ void copy_f32(const float* __restrict__ src, float* __restrict__ dst, u64 len) { PDL_ENTRY();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) dst[i] = src[i];
}

// Busy-waits ~`cycles` SM clocks (one thread). The profiler launches it first so the host can
// queue a whole step behind it, and the step's kernels then run back to back.
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

// Streams `n` 16-byte words (grid-stride, 4 independent loads in flight per thread) and
// writes one xor per block, so the reads cannot be elided: the device's read-bandwidth floor
// (lagoon_cuda::read_bandwidth).
extern "C" __global__ void read_stream(const uint4* __restrict__ p, u64 n, u32* __restrict__ out) {
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u32 acc = 0;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
              d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicXor(out + blockIdx.x, acc);
}
