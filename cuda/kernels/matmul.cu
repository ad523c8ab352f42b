// Matrix products against weights in their stored encoding, and the embedding lookup.
//
// Scalar pseudo-code (lagoon_core::ops::matmul): out[t, r] = sum_k x[t, k] * W[r, k].
// One warp per output row; lane l decodes chunks l, l + 32, ... of the row once (see
// quant.cuh) and dots each with up to MM_TOKENS tokens, so a weight row is read once per
// MM_TOKENS tokens. Decode (n = 1) and prefill use the same kernel; tensor-core GEMM for
// prefill is future work.
#include "quant.cuh"

#define MM_WARPS 4
#define MM_TOKENS 8

// Dots chunk-decoded row `row` with `nt` (<= NT) token rows x[t * cols ..]; the sums land in
// every lane of acc after the reduction.
template <int T, int NT>
__device__ __forceinline__ void warp_dot_rows(const u8* __restrict__ row, const float* __restrict__ x,
                                              int cols, int nt, float acc[NT]) {
    int lane = threadIdx.x & 31;
    #pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    int chunks = (cols + 31) / 32;
    for (int c = lane; c < chunks; c += 32) {
        float w[32];
        decode_chunk<T>(row, c, cols, w);
        int kmax = min(32, cols - 32 * c);
        #pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < nt) {
                float s = dot_chunk(w, x + (size_t)t * cols + 32 * c, kmax);
                acc[t] += s;
            }
        }
    }
    #pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = warp_sum(acc[t]);
}

// out[t, r] = x[t] . W[r] for t < n. Grid (ceil(rows / MM_WARPS), ceil(n / MM_TOKENS)),
// block 32 * MM_WARPS.
template <int T>
__device__ void matmul(const u8* __restrict__ W, u64 row_bytes, const float* __restrict__ x,
                       float* __restrict__ out, int rows, int cols, int n) {
    int r = blockIdx.x * MM_WARPS + threadIdx.x / 32;
    int t0 = blockIdx.y * MM_TOKENS;
    if (r >= rows) return;
    int nt = min(MM_TOKENS, n - t0);
    float acc[MM_TOKENS];
    warp_dot_rows<T, MM_TOKENS>(W + (size_t)r * row_bytes, x + (size_t)t0 * cols, cols, nt, acc);
    if ((threadIdx.x & 31) == 0) {
        #pragma unroll
        for (int t = 0; t < MM_TOKENS; t++)
            if (t < nt) out[(size_t)(t0 + t) * rows + r] = acc[t];
    }
}

// out[t] = W[token t] (decoded). Grid (ceil(chunks / 128), n), block 128; thread = chunk.
template <int T>
__device__ void embed(const u8* __restrict__ W, u64 row_bytes, const u32* __restrict__ params,
                      float* __restrict__ out, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int t = blockIdx.y;
    if (32 * c >= cols) return;
    u32 tok = params[P_TOKENS + t];
    float w[32];
    decode_chunk<T>(W + (size_t)tok * row_bytes, c, cols, w);
    float* o = out + (size_t)t * cols + 32 * c;
    int kmax = min(32, cols - 32 * c);
    for (int j = 0; j < kmax; j++) o[j] = w[j];
}

#define MATMUL_TYPES(X) X(f32, WT_F32) X(f16, WT_F16) X(bf16, WT_BF16) X(q8_0, WT_Q8_0) X(q4_K, WT_Q4_K) X(q6_K, WT_Q6_K) X(ct4, WT_CT4) \
    X(q5_K, WT_Q5_K) X(iq4_xs, WT_IQ4_XS) X(iq3_xxs, WT_IQ3_XXS) X(iq2_xxs, WT_IQ2_XXS) X(iq2_s, WT_IQ2_S) X(ct8, WT_CT8)

#define DEFINE_MATMUL(name, T)                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * MM_WARPS) matmul_##name(                   \
        const u8* W, u64 row_bytes, const float* x, float* out, int rows, int cols, int n) { PDL_ENTRY();      \
        matmul<T>(W, row_bytes, x, out, rows, cols, n);                                           \
    }                                                                                             \
    extern "C" __global__ void embed_##name(const u8* W, u64 row_bytes, const u32* params,        \
                                            float* out, int cols) { PDL_ENTRY();                               \
        embed<T>(W, row_bytes, params, out, cols);                                                \
    }
MATMUL_TYPES(DEFINE_MATMUL)
