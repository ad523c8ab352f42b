// Tensor-core matrix products for prefill (steps of many tokens): the dense product
// out[t, r] = x[t] . W[r] and the expert-grouped gate/up (+ SwiGLU) and down products.
//
// Scalar pseudo-code: as matmul.cu and moe.cu. The numerics differ from those kernels: each
// weight is decoded exactly (quant.cuh, bit-identical to the CPU's dequantised value) and
// then rounded to f16; each activation is rounded to f16 (finite values beyond f16's range
// saturate to +-65504, so an outlier gives a clipped product, never an inf); products
// accumulate in f32 on the tensor cores (mma.sync m16n8k16). This is the numerics of
// llama.cpp's dequantise-to-f16 + cuBLAS prefill path; the quantised-activation
// (MMQ-like) alternative is future work.
//
// Tiling: a block of 8 warps computes GM_BM weight rows x GM_BN tokens, stepping K by GM_BK.
// Per stage every thread decodes one 32-element weight chunk (row t / 2, half t % 2) into
// shared memory as f16 and converts 16 activations (token t / 4, quarter t % 4); warp w then
// multiplies rows 32 (w % 4) .. + 32 by tokens 32 (w / 4) .. + 32 (2 x 4 mma tiles per k16).
// Shared rows are padded to GM_LDS halves so the fragment loads hit 32 distinct banks.
// (Fragment layouts: PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type".)
#include "quant.cuh"

#define GM_BM 128
#define GM_BN 64
#define GM_BK 64
#define GM_LDS (GM_BK + 8)
#define GM_LDW (GM_LDS / 2)
#define GM_THREADS 256

__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *(u32*)&h;
}

// An activation rounded to f16, finite values saturating at +-65504 (NaN and +-inf pass).
__device__ __forceinline__ float f16_range(float v) {
    float a = fabsf(v);
    return a > 65504.0f && a < LG_INF ? copysignf(65504.0f, v) : v;
}

// D += A B for one m16n8k16 tile: A row-major f16 (4 regs), B column-major f16 (2 regs).
__device__ __forceinline__ void mma_16816(float d[4], const u32 a[4], const u32 b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The accumulators of one thread: acc[mt][nt] is the m16n8 tile (rows 32 (w % 4) + 16 mt,
// tokens 32 (w / 4) + 8 nt); element e holds row + g + 8 (e / 2), token + 2 q + e % 2 with
// g = lane / 4, q = lane % 4.
struct GemmAcc {
    float v[2][4][4];
};

// Runs the K loop over `cols` (a multiple of 32). `arow`: this thread's weight row (shared
// row threadIdx.x / 2), null for a row past the matrix; `xrow`: this thread's activation row
// (token threadIdx.x / 4), null past the tile's tokens.
template <int T>
__device__ __forceinline__ void gemm_mainloop(const u8* __restrict__ arow, const float* __restrict__ xrow,
                                              int cols, GemmAcc& acc) {
    __shared__ __align__(16) unsigned short sa[GM_BM * GM_LDS];
    __shared__ __align__(16) unsigned short sb[GM_BN * GM_LDS];
    int t = threadIdx.x, lane = t & 31, w = t >> 5;
    int g = lane >> 2, q = lane & 3, wm = w & 3, wn = w >> 2;
    #pragma unroll
    for (int mt = 0; mt < 2; mt++)
        #pragma unroll
        for (int nt = 0; nt < 4; nt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) acc.v[mt][nt][e] = 0.0f;
    uint4* adst = (uint4*)(sa + (t >> 1) * GM_LDS + 32 * (t & 1));
    uint4* bdst = (uint4*)(sb + (t >> 2) * GM_LDS + 16 * (t & 3));
    const u32* A = (const u32*)sa;
    const u32* B = (const u32*)sb;
    for (int k0 = 0; k0 < cols; k0 += GM_BK) {
        // Stage: one weight chunk, 16 activations.
        int c = k0 / 32 + (t & 1);
        if (arow != nullptr && 32 * c < cols) {
            float wv[32];
            decode_chunk<T>(arow, c, cols, wv);
            #pragma unroll
            for (int j = 0; j < 4; j++)
                adst[j] = make_uint4(pack_f16x2(wv[8 * j], wv[8 * j + 1]), pack_f16x2(wv[8 * j + 2], wv[8 * j + 3]),
                                     pack_f16x2(wv[8 * j + 4], wv[8 * j + 5]), pack_f16x2(wv[8 * j + 6], wv[8 * j + 7]));
        } else {
            #pragma unroll
            for (int j = 0; j < 4; j++) adst[j] = make_uint4(0, 0, 0, 0);
        }
        int kx = k0 + 16 * (t & 3);
        if (xrow != nullptr && kx < cols) {
            const float4* xs = (const float4*)(xrow + kx);
            float4 v[4];
            #pragma unroll
            for (int j = 0; j < 4; j++) v[j] = xs[j];
            #pragma unroll
            for (int j = 0; j < 2; j++)
                bdst[j] = make_uint4(pack_f16x2(f16_range(v[2 * j].x), f16_range(v[2 * j].y)),
                                     pack_f16x2(f16_range(v[2 * j].z), f16_range(v[2 * j].w)),
                                     pack_f16x2(f16_range(v[2 * j + 1].x), f16_range(v[2 * j + 1].y)),
                                     pack_f16x2(f16_range(v[2 * j + 1].z), f16_range(v[2 * j + 1].w)));
        } else {
            bdst[0] = make_uint4(0, 0, 0, 0);
            bdst[1] = make_uint4(0, 0, 0, 0);
        }
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < GM_BK / 2; kk += 8) {
            u32 a[2][4], b[4][2];
            #pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                int r = (32 * wm + 16 * mt + g) * GM_LDW + kk + q;
                a[mt][0] = A[r];
                a[mt][1] = A[r + 8 * GM_LDW];
                a[mt][2] = A[r + 4];
                a[mt][3] = A[r + 8 * GM_LDW + 4];
            }
            #pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                int r = (32 * wn + 8 * nt + g) * GM_LDW + kk + q;
                b[nt][0] = B[r];
                b[nt][1] = B[r + 4];
            }
            #pragma unroll
            for (int mt = 0; mt < 2; mt++)
                #pragma unroll
                for (int nt = 0; nt < 4; nt++) mma_16816(acc.v[mt][nt], a[mt], b[nt]);
        }
        __syncthreads();
    }
}

// Position of accumulator element (mt, nt, e) relative to the block's first row and token.
__device__ __forceinline__ int acc_row(int mt, int e) {
    int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
    return 32 * (w & 3) + 16 * mt + g + 8 * (e >> 1);
}
__device__ __forceinline__ int acc_tok(int nt, int e) {
    int w = threadIdx.x >> 5, q = threadIdx.x & 3;
    return 32 * (w >> 2) + 8 * nt + 2 * q + (e & 1);
}

// out[t, r] = x[t] . W[r]. Grid (ceil(rows / GM_BM), ceil(n / GM_BN)), block GM_THREADS.
template <int T>
__device__ void gemm(const u8* __restrict__ W, u64 row_bytes, const float* __restrict__ x,
                     float* __restrict__ out, int rows, int cols, int n) {
    int r0 = blockIdx.x * GM_BM, t0 = blockIdx.y * GM_BN;
    int ar = r0 + (threadIdx.x >> 1), xt = t0 + (threadIdx.x >> 2);
    const u8* arow = ar < rows ? W + (size_t)ar * row_bytes : nullptr;
    const float* xrow = xt < n ? x + (size_t)xt * cols : nullptr;
    GemmAcc acc;
    gemm_mainloop<T>(arow, xrow, cols, acc);
    #pragma unroll
    for (int mt = 0; mt < 2; mt++)
        #pragma unroll
        for (int nt = 0; nt < 4; nt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = r0 + acc_row(mt, e), tk = t0 + acc_tok(nt, e);
                if (r < rows && tk < n) out[(size_t)tk * rows + r] = acc.v[mt][nt][e];
            }
}

// Grouped gate/up with SwiGLU: tiles from moe_group (group GM_BN). A block takes 64 rows of
// the expert's gate and the same 64 rows of its up: shared row s holds gate (s % 32 < 16) or
// up row r0 + 16 (s / 32) + s % 16, so a warp's tile mt = 0 is gate and mt = 1 is up at the
// same (row, pair) positions. act[p, r] = silu(gate) * up for sorted pair p (token p / K).
// Grid (ceil(I / 64), max_tiles).
template <int T>
__device__ void gemm_gate_up(const u8* __restrict__ Wg, const u8* __restrict__ Wu, u64 expert_bytes,
                             u64 row_bytes, const float* __restrict__ x, const u32* __restrict__ sorted,
                             const u32* __restrict__ tiles, float* __restrict__ act, int I, int H, int K) {
    const u32* tl = tiles + 3 * blockIdx.y;
    int cnt = (int)tl[2];
    if (cnt == 0) return;
    u32 e = tl[0], first = tl[1];
    int r0 = blockIdx.x * (GM_BM / 2);
    int s = threadIdx.x >> 1;
    int ar = r0 + 16 * (s >> 5) + (s & 15);
    const u8* mat = (s & 16) ? Wu : Wg;
    const u8* arow = ar < I ? mat + (size_t)e * expert_bytes + (size_t)ar * row_bytes : nullptr;
    int xt = threadIdx.x >> 2;
    const float* xrow = xt < cnt ? x + (size_t)(sorted[first + xt] / K) * H : nullptr;
    GemmAcc acc;
    gemm_mainloop<T>(arow, xrow, H, acc);
    int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
    #pragma unroll
    for (int nt = 0; nt < 4; nt++)
        #pragma unroll
        for (int e2 = 0; e2 < 4; e2++) {
            int r = r0 + 16 * (w & 3) + g + 8 * (e2 >> 1), tk = acc_tok(nt, e2);
            if (r < I && tk < cnt)
                act[(size_t)sorted[first + tk] * I + r] = silu_f(acc.v[0][nt][e2]) * acc.v[1][nt][e2];
        }
}

// Grouped down: ys[p, r] = act[p] . Wd_e[r] for the tile's sorted pairs p. Grid
// (ceil(H / GM_BM), max_tiles).
template <int T>
__device__ void gemm_down(const u8* __restrict__ Wd, u64 expert_bytes, u64 row_bytes,
                          const float* __restrict__ act, const u32* __restrict__ sorted,
                          const u32* __restrict__ tiles, float* __restrict__ ys, int H, int I) {
    const u32* tl = tiles + 3 * blockIdx.y;
    int cnt = (int)tl[2];
    if (cnt == 0) return;
    u32 e = tl[0], first = tl[1];
    int r0 = blockIdx.x * GM_BM;
    int ar = r0 + (threadIdx.x >> 1), xt = threadIdx.x >> 2;
    const u8* arow = ar < H ? Wd + (size_t)e * expert_bytes + (size_t)ar * row_bytes : nullptr;
    const float* xrow = xt < cnt ? act + (size_t)sorted[first + xt] * I : nullptr;
    GemmAcc acc;
    gemm_mainloop<T>(arow, xrow, I, acc);
    #pragma unroll
    for (int mt = 0; mt < 2; mt++)
        #pragma unroll
        for (int nt = 0; nt < 4; nt++)
            #pragma unroll
            for (int e2 = 0; e2 < 4; e2++) {
                int r = r0 + acc_row(mt, e2), tk = acc_tok(nt, e2);
                if (r < H && tk < cnt) ys[(size_t)sorted[first + tk] * H + r] = acc.v[mt][nt][e2];
            }
}

#define GEMM_TYPES(X) X(f32, WT_F32) X(f16, WT_F16) X(bf16, WT_BF16) X(q8_0, WT_Q8_0) X(q4_K, WT_Q4_K) X(q6_K, WT_Q6_K)

#define DEFINE_GEMM(name, T)                                                                       \
    extern "C" __global__ void __launch_bounds__(GM_THREADS) gemm_##name(                          \
        const u8* W, u64 row_bytes, const float* x, float* out, int rows, int cols, int n) {       \
        gemm<T>(W, row_bytes, x, out, rows, cols, n);                                              \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(GM_THREADS) gemm_gate_up_##name(                  \
        const u8* Wg, const u8* Wu, u64 expert_bytes, u64 row_bytes, const float* x,               \
        const u32* sorted, const u32* tiles, float* act, int I, int H, int K) {                    \
        gemm_gate_up<T>(Wg, Wu, expert_bytes, row_bytes, x, sorted, tiles, act, I, H, K);          \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(GM_THREADS) gemm_down_##name(                     \
        const u8* Wd, u64 expert_bytes, u64 row_bytes, const float* act, const u32* sorted,        \
        const u32* tiles, float* ys, int H, int I) {                                               \
        gemm_down<T>(Wd, expert_bytes, row_bytes, act, sorted, tiles, ys, H, I);                   \
    }
GEMM_TYPES(DEFINE_GEMM)
