// Elementwise ops over `len` elements, one thread each.
#include "common.cuh"

// out = a + b (residual adds).
extern "C" __global__ void add(const float* __restrict__ a, const float* __restrict__ b,
                               float* __restrict__ out, u64 len) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) out[i] = a[i] + b[i];
}

// out = silu(gate) * up.
extern "C" __global__ void swiglu(const float* __restrict__ gate, const float* __restrict__ up,
                                  float* __restrict__ out, u64 len) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) out[i] = silu_f(gate[i]) * up[i];
}

// out = o * softplus(g), g per head (ocols / gcols = head_dim) or per element (ratio 1).
extern "C" __global__ void gate_mul(const float* __restrict__ o, const float* __restrict__ g,
                                    float* __restrict__ out, int ocols, int gcols, u64 len) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    u64 t = i / ocols;
    int c = (int)(i % ocols);
    int per = ocols / gcols;
    out[i] = o[i] * softplus_f(g[t * gcols + c / per]);
}

// dst[i] = src[i] (the last-row pick).
extern "C" __global__ void copy_f32(const float* __restrict__ src, float* __restrict__ dst, u64 len) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) dst[i] = src[i];
}
