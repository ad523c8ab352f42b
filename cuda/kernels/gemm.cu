// Tensor-core matrix products for prefill (steps of many tokens): the dense product
// out[t, r] = x[t] . W[r] and the expert-grouped gate/up (+ SwiGLU) and down products.
//
// Scalar pseudo-code: as matmul.cu and moe.cu. The numerics differ from those kernels: each
// weight is decoded exactly (quant.cuh, bit-identical to the CPU's dequantised value) and
// then rounded to f16; each activation is rounded to f16 once per product by to_f16 (finite
// values beyond f16's range saturate to +-65504, so an outlier gives a clipped product, never
// an inf; the kernels take the f16 rows); products
// accumulate in f32 on the tensor cores (mma.sync m16n8k16). This is the numerics of
// llama.cpp's dequantise-to-f16 + cuBLAS prefill path; the quantised-activation
// (MMQ-like) alternative is future work.
//
// Tiling: a block of 8 warps computes GM_BM weight rows x BN tokens (64, or 32 for small
// grids and sparsely used experts), stepping K by GM_BK.
// Per stage every thread decodes GM_CPT 32-element weight chunks of one row (gm_srow) into
// shared memory as f16 and copies 64 / (256 / BN) f16 activations of token t / (256 / BN);
// warp w then multiplies rows GM_MW (w % 4) .. + GM_MW by tokens (BN / 2) (w / 4) .. + BN / 2
// (GM_MT x BN / 16 mma tiles per k16). Warps of 64 rows (rather than 32) halve the shared
// memory each mma reads for its B fragments and each block's activation traffic per weight.
// Shared rows are padded to GM_LDS halves (144 B) so the eight 16-byte rows of each
// ldmatrix phase hit 32 distinct banks.
// (Fragment layouts: PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type".)
#include "quant.cuh"
#include "tc.cuh"
#include "unpack_h16.cuh"

// Weight rows per warp (GM_MW), per block (4 warps along the rows), and 16-row mma tiles per
// warp; each thread stages GM_CPT 32-element chunks of one weight row per stage.
#define GM_MW 64
#define GM_BM (4 * GM_MW)
#define GM_MT (GM_MW / 16)
#define GM_CPT (GM_BM / 128)
#define GM_BK 64
#define GM_LDS (GM_BK + 8)
#define GM_THREADS 256

// The accumulators of one thread for a BN-token tile: v[mt][nt] is the m16n8 tile (rows
// GM_MW (w % 4) + 16 mt, tokens (BN / 2) (w / 4) + 8 nt); element e holds row + g + 8 (e / 2),
// token + 2 q + e % 2 with g = lane / 4, q = lane % 4.
template <int BN>
struct GemmAcc {
    float v[GM_MT][BN / 16][4];
};

// The shared (tile) row whose weights thread t stages: chunks GM_CPT t % 2 .. + GM_CPT of the
// stage's two.
__device__ __forceinline__ int gm_srow() { return (threadIdx.x * GM_CPT) / 2; }

// Runs the K loop over `cols` (a multiple of 32) for a tile of BN (64 or 32) tokens. `arow`:
// this thread's weight row (shared row gm_srow()), null for a row past the matrix;
// `xrow`: this thread's f16 activation row (token threadIdx.x / (GM_THREADS / BN)), null
// past the tile's tokens.
template <int T, int BN>
__device__ __forceinline__ void gemm_mainloop(const u8* __restrict__ arow, const unsigned short* __restrict__ xrow,
                                              int cols, GemmAcc<BN>& acc) {
    constexpr int NT = BN / 16;              // n8 tiles per warp
    constexpr int XT = GM_THREADS / BN;      // threads per token row
    constexpr int XK = GM_BK / XT;           // activations each stages per stage (16 or 8)
    __shared__ __align__(16) unsigned short sa[GM_BM * GM_LDS];
    __shared__ __align__(16) unsigned short sb[BN * GM_LDS];
    int t = threadIdx.x, lane = t & 31, w = t >> 5;
    int wm = w & 3, wn = w >> 2;
    #pragma unroll
    for (int mt = 0; mt < GM_MT; mt++)
        #pragma unroll
        for (int nt = 0; nt < NT; nt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) acc.v[mt][nt][e] = 0.0f;
    int c_first = (t * GM_CPT) % 2;  // the first of this thread's chunks within a stage
    uint4* adst = (uint4*)(sa + gm_srow() * GM_LDS + 32 * c_first);
    uint4* bdst = (uint4*)(sb + (t / XT) * GM_LDS + XK * (t % XT));
    // ldmatrix row addresses (halves) of this lane: A tiles (rows +0..15, k +0..15) as
    // matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) = a0..a3; B tiles of
    // two n8 tiles (tokens +0..15) as (tok 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15,
    // 8-15) = b[nt][0], b[nt][1], b[nt + 1][0], b[nt + 1][1].
    const unsigned short* la = sa + (GM_MW * wm + (lane & 7) + 8 * ((lane >> 3) & 1)) * GM_LDS + 8 * (lane >> 4);
    const unsigned short* lb = sb + ((BN / 2) * wn + (lane & 7) + 8 * (lane >> 4)) * GM_LDS + 8 * ((lane >> 3) & 1);
    // Software pipeline: the loads of stage k + 1 (one weight chunk, XK activations) are
    // issued into registers before the tensor-core work of stage k, and decoded into shared
    // memory after it, so their latency hides behind the mma loop.
    // With two chunks per thread (GM_MW 64) the weights' raw bytes would not fit in the
    // register budget next to the larger accumulator tile: those are fetched at the stage.
    constexpr bool A_PIPE = GM_CPT == 1;
    ChunkRaw<T> raw[GM_CPT];
    uint4 xr[XK / 8];
    auto fetch = [&](int k0) {
        #pragma unroll
        for (int cc = 0; cc < GM_CPT; cc++) {
            int c = k0 / 32 + c_first + cc;
            if (A_PIPE && arow != nullptr && 32 * c < cols) chunk_fetch<T>(arow, c, raw[cc]);
        }
        int kx = k0 + XK * (t % XT);
        if (xrow != nullptr && kx < cols) {
            #pragma unroll
            for (int j = 0; j < XK / 8; j++) xr[j] = *(const uint4*)(xrow + kx + 8 * j);
        }
    };
    fetch(0);
    for (int k0 = 0; k0 < cols; k0 += GM_BK) {
        #pragma unroll
        for (int cc = 0; cc < GM_CPT; cc++) {
            int c = k0 / 32 + c_first + cc;
            uint4* dst = adst + 4 * cc;
            if (arow != nullptr && 32 * c < cols) {
                u32 hv[16];
                if (!A_PIPE) chunk_fetch<T>(arow, c, raw[cc]);
                chunk_unpack_h16<T>(raw[cc], hv);
                #pragma unroll
                for (int j = 0; j < 4; j++) dst[j] = make_uint4(hv[4 * j], hv[4 * j + 1], hv[4 * j + 2], hv[4 * j + 3]);
            } else {
                #pragma unroll
                for (int j = 0; j < 4; j++) dst[j] = make_uint4(0, 0, 0, 0);
            }
        }
        int kx = k0 + XK * (t % XT);
        bool xon = xrow != nullptr && kx < cols;
        #pragma unroll
        for (int j = 0; j < XK / 8; j++) bdst[j] = xon ? xr[j] : make_uint4(0, 0, 0, 0);
        __syncthreads();
        if (k0 + GM_BK < cols) fetch(k0 + GM_BK);
        #pragma unroll
        for (int kk = 0; kk < GM_BK; kk += 16) {
            u32 a[GM_MT][4], b[NT][2], t4[4];
            #pragma unroll
            for (int mt = 0; mt < GM_MT; mt++) ldmatrix_x4(a[mt], la + 16 * mt * GM_LDS + kk);
            #pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                ldmatrix_x4(t4, lb + 16 * np * GM_LDS + kk);
                b[2 * np][0] = t4[0];
                b[2 * np][1] = t4[1];
                b[2 * np + 1][0] = t4[2];
                b[2 * np + 1][1] = t4[3];
            }
            #pragma unroll
            for (int mt = 0; mt < GM_MT; mt++)
                #pragma unroll
                for (int nt = 0; nt < NT; nt++) mma_16816(acc.v[mt][nt], a[mt], b[nt]);
        }
        __syncthreads();
    }
}

// Position of accumulator element (mt, nt, e) relative to the block's first row and token.
__device__ __forceinline__ int acc_row(int mt, int e) {
    int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
    return GM_MW * (w & 3) + 16 * mt + g + 8 * (e >> 1);
}
template <int BN>
__device__ __forceinline__ int acc_tok(int nt, int e) {
    int w = threadIdx.x >> 5, q = threadIdx.x & 3;
    return (BN / 2) * (w >> 2) + 8 * nt + 2 * q + (e & 1);
}

// out[t, r] = x[t] . W[r]. Grid (ceil(rows / GM_BM), ceil(n / BN)), block GM_THREADS.
template <int T, int BN>
__device__ void gemm(const u8* __restrict__ W, u64 row_bytes, const unsigned short* __restrict__ x,
                     float* __restrict__ out, int rows, int cols, int n) {
    int r0 = blockIdx.x * GM_BM, t0 = blockIdx.y * BN;
    int ar = r0 + gm_srow(), xt = t0 + threadIdx.x / (GM_THREADS / BN);
    const u8* arow = ar < rows ? W + (size_t)ar * row_bytes : nullptr;
    const unsigned short* xrow = xt < n ? x + (size_t)xt * cols : nullptr;
    GemmAcc<BN> acc;
    gemm_mainloop<T, BN>(arow, xrow, cols, acc);
    #pragma unroll
    for (int mt = 0; mt < GM_MT; mt++)
        #pragma unroll
        for (int nt = 0; nt < BN / 16; nt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = r0 + acc_row(mt, e), tk = t0 + acc_tok<BN>(nt, e);
                if (r < rows && tk < n) out[(size_t)tk * rows + r] = acc.v[mt][nt][e];
            }
}

// Grouped gate/up with SwiGLU: tiles of up to BN pairs from moe_group. A block takes GM_BM / 2
// rows of the expert's gate and the same rows of its up: within warp wm's GM_MW shared rows,
// the first GM_MT / 2 mma tiles hold gate rows and the last GM_MT / 2 the same up rows, so
// tile mt and mt + GM_MT / 2 of a thread are gate and up at the same (row, pair) positions.
// Shared row s is row r0 + (GM_MW / 2) (s / GM_MW) + 16 (mt % (GM_MT / 2)) + s % 16 of gate
// (mt = (s % GM_MW) / 16 < GM_MT / 2) or up. act[p, r] = silu(gate) * up for sorted pair p
// (token p / K), stored rounded to f16 (as to_f16 would) for gemm_down. Grid
// (ceil(I / (GM_BM / 2)), max_tiles).
template <int T, int BN>
__device__ void gemm_gate_up(const u8* __restrict__ Wg, const u8* __restrict__ Wu, u64 expert_bytes,
                             u64 row_bytes, const unsigned short* __restrict__ x, const u32* __restrict__ sorted,
                             const u32* __restrict__ tiles, unsigned short* __restrict__ act, int I, int H, int K) {
    constexpr int HALF = GM_MT / 2;
    const u32* tl = tiles + 3 * blockIdx.y;
    int cnt = (int)tl[2];
    if (cnt == 0) return;
    u32 e = tl[0], first = tl[1];
    int r0 = blockIdx.x * (GM_BM / 2);
    int s = gm_srow();
    int mt_s = (s % GM_MW) / 16;
    int ar = r0 + (GM_MW / 2) * (s / GM_MW) + 16 * (mt_s % HALF) + (s & 15);
    const u8* mat = mt_s >= HALF ? Wu : Wg;
    const u8* arow = ar < I ? mat + (size_t)e * expert_bytes + (size_t)ar * row_bytes : nullptr;
    int xt = threadIdx.x / (GM_THREADS / BN);
    const unsigned short* xrow = xt < cnt ? x + (size_t)(sorted[first + xt] / K) * H : nullptr;
    GemmAcc<BN> acc;
    gemm_mainloop<T, BN>(arow, xrow, H, acc);
    int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
    #pragma unroll
    for (int mt = 0; mt < HALF; mt++)
        #pragma unroll
        for (int nt = 0; nt < BN / 16; nt++)
            #pragma unroll
            for (int e2 = 0; e2 < 4; e2++) {
                int r = r0 + (GM_MW / 2) * (w & 3) + 16 * mt + g + 8 * (e2 >> 1), tk = acc_tok<BN>(nt, e2);
                if (r < I && tk < cnt)
                    act[(size_t)sorted[first + tk] * I + r] = __half_as_ushort(
                        __float2half_rn(f16_range(silu_f(acc.v[mt][nt][e2]) * acc.v[mt + HALF][nt][e2])));
            }
}

// Grouped down: ys[p, r] = act[p] . Wd_e[r] for the tile's sorted pairs p. Grid
// (ceil(H / GM_BM), max_tiles).
template <int T, int BN>
__device__ void gemm_down(const u8* __restrict__ Wd, u64 expert_bytes, u64 row_bytes,
                          const unsigned short* __restrict__ act, const u32* __restrict__ sorted,
                          const u32* __restrict__ tiles, float* __restrict__ ys, int H, int I) {
    const u32* tl = tiles + 3 * blockIdx.y;
    int cnt = (int)tl[2];
    if (cnt == 0) return;
    u32 e = tl[0], first = tl[1];
    int r0 = blockIdx.x * GM_BM;
    int ar = r0 + gm_srow(), xt = threadIdx.x / (GM_THREADS / BN);
    const u8* arow = ar < H ? Wd + (size_t)e * expert_bytes + (size_t)ar * row_bytes : nullptr;
    const unsigned short* xrow = xt < cnt ? act + (size_t)sorted[first + xt] * I : nullptr;
    GemmAcc<BN> acc;
    gemm_mainloop<T, BN>(arow, xrow, I, acc);
    #pragma unroll
    for (int mt = 0; mt < GM_MT; mt++)
        #pragma unroll
        for (int nt = 0; nt < BN / 16; nt++)
            #pragma unroll
            for (int e2 = 0; e2 < 4; e2++) {
                int r = r0 + acc_row(mt, e2), tk = acc_tok<BN>(nt, e2);
                if (r < H && tk < cnt) ys[(size_t)sorted[first + tk] * H + r] = acc.v[mt][nt][e2];
            }
}

// (name, type, blocks per SM the register budget is set for: 2, so the pipelined loop (a
// stage's raw chunk and activations in registers on top of the accumulators) never spills)
// y[i] = x[i] rounded to f16, finite values beyond f16's range saturating (f16_range): the
// activations of the tensor-core products, converted once per product instead of once per
// row-block (ncu: the f32 activation tiles were most of the blocks' L1 traffic). Four
// elements per thread; len % 4 == 0.
extern "C" __global__ void to_f16(const float4* __restrict__ x, uint2* __restrict__ y, u64 len4) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len4) return;
    float4 v = x[i];
    y[i] = make_uint2(pack_f16x2(f16_range(v.x), f16_range(v.y)), pack_f16x2(f16_range(v.z), f16_range(v.w)));
}

#define GEMM_TYPES(X) X(f32, WT_F32, 2) X(f16, WT_F16, 2) X(bf16, WT_BF16, 2) X(q8_0, WT_Q8_0, 2) X(q4_K, WT_Q4_K, 2) X(q6_K, WT_Q6_K, 2) X(ct4, WT_CT4, 2) \
    X(q5_K, WT_Q5_K, 2) X(iq4_xs, WT_IQ4_XS, 2) \
    X(iq3_xxs, WT_IQ3_XXS, 2) X(iq2_xxs, WT_IQ2_XXS, 2) X(iq2_s, WT_IQ2_S, 2) X(ct8, WT_CT8, 2)

#define DEFINE_GEMM_BN(name, T, MINB, BN, sfx)                                                     \
    extern "C" __global__ void __launch_bounds__(GM_THREADS, MINB) gemm##sfx##_##name(             \
        const u8* W, u64 row_bytes, const unsigned short* x, float* out, int rows, int cols, int n) {\
        gemm<T, BN>(W, row_bytes, x, out, rows, cols, n);                                          \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(GM_THREADS, MINB) gemm_gate_up##sfx##_##name(     \
        const u8* Wg, const u8* Wu, u64 expert_bytes, u64 row_bytes, const unsigned short* x,      \
        const u32* sorted, const u32* tiles, unsigned short* act, int I, int H, int K) {           \
        gemm_gate_up<T, BN>(Wg, Wu, expert_bytes, row_bytes, x, sorted, tiles, act, I, H, K);      \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(GM_THREADS, MINB) gemm_down##sfx##_##name(        \
        const u8* Wd, u64 expert_bytes, u64 row_bytes, const unsigned short* act, const u32* sorted,\
        const u32* tiles, float* ys, int H, int I) {                                               \
        gemm_down<T, BN>(Wd, expert_bytes, row_bytes, act, sorted, tiles, ys, H, I);               \
    }
// Tiles of 64 tokens (gemm_*) and of 32 (gemm32_*, gemm_gate_up32_*, gemm_down32_*: small
// grids and experts with few pairs each).
#define DEFINE_GEMM(name, T, MINB) DEFINE_GEMM_BN(name, T, MINB, 64, ) DEFINE_GEMM_BN(name, T, MINB, 32, 32)
GEMM_TYPES(DEFINE_GEMM)
