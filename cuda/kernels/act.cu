// Activation quantiser kernels (layout and values: act.cuh).
#include "act.cuh"

#define ACT_WARPS 4

// One warp per 256-block. Grid ceil(rows * nb / ACT_WARPS), block 32 * ACT_WARPS. Row r of
// x starts at x + r * cols, of out at out + r * stride.
extern "C" __global__ void __launch_bounds__(32 * ACT_WARPS)
quantize_q8_K(const float* __restrict__ x, u8* __restrict__ out, int cols, u64 stride, int rows) { PDL_ENTRY();
    int nb = cols / QK_K;
    int w = blockIdx.x * ACT_WARPS + threadIdx.x / 32;
    if (w >= rows * nb) return;
    int r = w / nb, b = w % nb;
    warp_quantize_q8K(x + (size_t)r * cols + (size_t)b * QK_K, out + (size_t)r * stride, cols, b);
}

// Eight lanes per 32-block (group_quantize_q8_0). Grid ceil(rows * nb / 16), block 128.
extern "C" __global__ void __launch_bounds__(128)
quantize_q8_0(const float* __restrict__ x, u8* __restrict__ out, int cols, u64 stride, int rows) { PDL_ENTRY();
    int nb = cols / QK;
    int i = (blockIdx.x * blockDim.x + threadIdx.x) >> 3;
    // Whole warps past the end leave (warp-uniform: the group shuffles span the warp).
    if ((blockIdx.x * blockDim.x + (threadIdx.x & ~31)) >> 3 >= rows * nb) return;
    bool live = i < rows * nb;
    int r = live ? i / nb : 0, b = live ? i % nb : 0;
    group_quantize_q8_0(x + (size_t)r * cols + (size_t)b * QK, out + (size_t)r * stride, cols, b, live);
}
