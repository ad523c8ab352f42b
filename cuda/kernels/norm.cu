// RMSNorm and RoPE.
#include "tc.cuh"

#define NORM_WARPS 4

// RMSNorm over groups of `glen` (lagoon_core::ops::norm::rms_norm): y = w * (x * r) with
// r = 1 / sqrt(mean(x^2) + eps). One warp per group (hidden size for layer norms, head_dim
// for QK-norm, the gain shared by every group). Grid ceil(n_groups / NORM_WARPS).
// With `oh` (rms_norm_h) each output is also written rounded to f16 as to_f16 rounds it
// (f16_range, nearest): the input of the tensor-core products that read the norm.
template <bool H>
__device__ __forceinline__ void rms_norm_t(const float* __restrict__ x, const float* __restrict__ w,
                                           float* __restrict__ out, unsigned short* __restrict__ oh, int glen,
                                           int n_groups, float eps) {
    int g = blockIdx.x * NORM_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (g >= n_groups) return;
    const float* xg = x + (size_t)g * glen;
    float* og = out + (size_t)g * glen;
    float ss = 0.0f;
    for (int i = lane; i < glen; i += 32) ss += xg[i] * xg[i];
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)glen + eps);
    for (int i = lane; i < glen; i += 32) {
        float y = w[i] * (xg[i] * r);
        og[i] = y;
        if constexpr (H) oh[(size_t)g * glen + i] = __half_as_ushort(__float2half_rn(f16_range(y)));
    }
}

extern "C" __global__ void __launch_bounds__(32 * NORM_WARPS)
rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
         int glen, int n_groups, float eps) { PDL_ENTRY();
    rms_norm_t<false>(x, w, out, nullptr, glen, n_groups, eps);
}

extern "C" __global__ void __launch_bounds__(32 * NORM_WARPS)
rms_norm_h(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
           unsigned short* __restrict__ oh, int glen, int n_groups, float eps) { PDL_ENTRY();
    rms_norm_t<true>(x, w, out, oh, glen, n_groups, eps);
}

// NeoX RoPE on the first `rd` dims of every `d`-wide head (lagoon_core::rope::RopeTable::
// apply), the rest copied: for i < rd / 2 at position p, a = p * inv_freq[i],
// c = cos(a) * scale, s = sin(a) * scale, (x_i, x_{i + rd/2}) -> (x_i c - x_{i+rd/2} s,
// x_{i+rd/2} c + x_i s). Token t sits at position params[P_POS0] + t. One thread per element.
extern "C" __global__ void rope(const float* __restrict__ x, float* __restrict__ out,
                                const float* __restrict__ inv_freq, float scale, int rd, int d,
                                int cols, int n, const u32* __restrict__ params) { PDL_ENTRY();
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)n * cols) return;
    int t = (int)(idx / cols);
    int k = (int)(idx % cols) % d;
    int half = rd / 2;
    if (k >= rd) {
        out[idx] = x[idx];
        return;
    }
    int i = k < half ? k : k - half;
    float p = (float)(params[P_POS0] + t);
    float a = p * inv_freq[i];
    float c = cosf(a) * scale, s = sinf(a) * scale;
    if (k < half) {
        float x0 = x[idx], x1 = x[idx + half];
        out[idx] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    } else {
        float x0 = x[idx - half], x1 = x[idx];
        out[idx] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    }
}
