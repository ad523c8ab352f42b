// Prefill dense products through f16 weights: a matrix of any stored type is first decoded
// once per step into an f16 copy (dequant_f16_*), then multiplied by the step's f16
// activations with a plain f16 tensor-core GEMM (gemm_h16). For a step of many tokens this
// decodes each weight once instead of once per token tile (gemm_rf.cu's kernels are bound by
// that per-lane decode, see BENCHMARKS.md), at the price of writing and re-reading the f16
// copy (2 bytes per weight).
//
// Numerics: gemm.cu's and gemm_rf.cu's. Each weight is decoded exactly by quant.cuh's
// decode_chunk (bit-identical to the CPU) and rounded to f16; the activations are to_f16's;
// f32 accumulation. Only the order of the f32 sums differs.
//
// gemm_h16: out[t, r] = x[t] . W[r] for W f16 [rows][cols], x f16 [n][cols] (cols % 32 == 0),
// out f32 [n][rows]. A block of 8 warps takes 128 rows x 128 tokens; warp (wm, wn) = (w / 4,
// w % 4) owns rows 64 wm .. + 64 and tokens 32 wn .. + 32 (4 x 4 m16n8 tiles). K advances 32
// per stage through a four-stage cp.async ring (rows of 64 bytes, 16-byte chunk c of row r
// stored at chunk c ^ (r / 2 % 4), so the eight rows of an ldmatrix phase fall on distinct
// banks); A and B fragments come from ldmatrix.x4. (The multistage cp.async mainloop with
// ldmatrix fragments as in CUTLASS's sm80 GEMMs.)
#include "quant.cuh"
#include "tc.cuh"
#include "unpack_h16.cuh"

#define GH_BM 128
#define GH_BN 128
#define GH_BK 32
#define GH_STAGES 4
#define GH_A_BYTES (GH_BM * GH_BK * 2)
#define GH_STAGE (GH_A_BYTES + GH_BN * GH_BK * 2)
// Dynamic shared memory (manifest.rs GEMM_H16_SMEM says the same; a unit test checks).
#define GH_SMEM 65536
static_assert(GH_STAGES * GH_STAGE == GH_SMEM, "GH_SMEM");

// Byte offset of 16-byte chunk c (0..3) of row r in a tile of 64-byte rows.
__device__ __forceinline__ int gh_off(int r, int c) { return 64 * r + 16 * (c ^ ((r >> 1) & 3)); }

// Grid (ceil(n / 128), ceil(rows / 128)), block 256, GH_SMEM bytes of dynamic shared memory.
// Token tiles vary fastest, so the blocks in flight share a few weight row tiles (each read
// from DRAM about once) and the step's activations (which fit in L2).
extern "C" __global__ void __launch_bounds__(256, 2)
gemm_h16(const unsigned short* __restrict__ W, const unsigned short* __restrict__ x, float* __restrict__ out,
         int rows, int cols, int n) {
    extern __shared__ __align__(128) u8 gh_smem[];
    int r0 = blockIdx.y * GH_BM, t0 = blockIdx.x * GH_BN;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int wm = warp >> 2, wn = warp & 3;
    // Copies: each stage is 512 16-byte chunks of A and 512 of B; thread t takes chunks
    // t and t + 256 of each (row i / 4, chunk i % 4). Rows past the matrix and tokens past
    // the step read a valid row (their outputs are never stored).
    const unsigned short* asrc[2];
    const unsigned short* bsrc[2];
    int dst[2];
    #pragma unroll
    for (int j = 0; j < 2; j++) {
        int i = tid + 256 * j, r = i >> 2, c = i & 3;
        asrc[j] = W + (size_t)min(r0 + r, rows - 1) * cols + 8 * c;
        bsrc[j] = x + (size_t)min(t0 + r, n - 1) * cols + 8 * c;
        dst[j] = gh_off(r, c);
    }
    int nk = cols / GH_BK;
    auto load = [&](int s, int kb) {
        u8* st = gh_smem + GH_STAGE * s;
        #pragma unroll
        for (int j = 0; j < 2; j++) {
            cp_async16(st + dst[j], asrc[j] + GH_BK * (size_t)kb);
            cp_async16(st + GH_A_BYTES + dst[j], bsrc[j] + GH_BK * (size_t)kb);
        }
    };
    #pragma unroll
    for (int s = 0; s < GH_STAGES - 1; s++) {
        if (s < nk) load(s, s);
        cp_async_commit();
    }
    float acc[4][4][4];
    #pragma unroll
    for (int mt = 0; mt < 4; mt++)
        #pragma unroll
        for (int nt = 0; nt < 4; nt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;
    // ldmatrix lane roles: matrix mi = lane / 8, its row lane % 8.
    int mi = lane >> 3, mr = lane & 7;
    for (int kb = 0; kb < nk; kb++) {
        cp_async_wait<GH_STAGES - 2>();
        __syncthreads();
        int nx = kb + GH_STAGES - 1;
        if (nx < nk) load(nx % GH_STAGES, nx);
        cp_async_commit();
        const u8* sa = gh_smem + GH_STAGE * (kb % GH_STAGES);
        const u8* sb = sa + GH_A_BYTES;
        #pragma unroll
        for (int ks = 0; ks < 2; ks++) {
            // A: matrices (rows 0-7, k lo), (rows 8-15, k lo), (rows 0-7, k hi), (rows 8-15,
            // k hi) of each m16 tile: a0..a3 in mma order.
            u32 a[4][4];
            #pragma unroll
            for (int mt = 0; mt < 4; mt++)
                ldmatrix_x4(a[mt], (const unsigned short*)(sa + gh_off(64 * wm + 16 * mt + 8 * (mi & 1) + mr,
                                                                      2 * ks + (mi >> 1))));
            // B: matrices (tile 2 p, k lo), (tile 2 p, k hi), (tile 2 p + 1, k lo), (tile 2 p + 1,
            // k hi) of token rows: two n8 tiles' fragments per ldmatrix.
            u32 b[4][2];
            #pragma unroll
            for (int p = 0; p < 2; p++) {
                u32 r[4];
                ldmatrix_x4(r, (const unsigned short*)(sb + gh_off(32 * wn + 8 * (2 * p + (mi >> 1)) + mr,
                                                                  2 * ks + (mi & 1))));
                b[2 * p][0] = r[0];
                b[2 * p][1] = r[1];
                b[2 * p + 1][0] = r[2];
                b[2 * p + 1][1] = r[3];
            }
            #pragma unroll
            for (int mt = 0; mt < 4; mt++)
                #pragma unroll
                for (int nt = 0; nt < 4; nt++) mma_16816(acc[mt][nt], a[mt], b[nt]);
        }
    }
    int g = lane >> 2, q = lane & 3;
    #pragma unroll
    for (int mt = 0; mt < 4; mt++)
        #pragma unroll
        for (int nt = 0; nt < 4; nt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = r0 + 64 * wm + 16 * mt + g + 8 * (e >> 1);
                int t = t0 + 32 * wn + 8 * nt + 2 * q + (e & 1);
                if (r < rows && t < n) out[(size_t)t * rows + r] = acc[mt][nt][e];
            }
}

// W (rows x cols of type T, rows row_bytes apart) decoded exactly and rounded to f16 into
// wh [rows][cols] (cols % 32 == 0): one thread per 32-weight chunk. Grid ceil(rows cols / 32
// / 256), block 256.
template <int T>
__device__ __forceinline__ void dequant_f16(const u8* __restrict__ W, u64 row_bytes, unsigned short* __restrict__ wh,
                                            int rows, int cols) {
    int chunks = cols / 32;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * chunks) return;
    int r = (int)(i / chunks), c = (int)(i - (size_t)r * chunks);
    uint4* dst = (uint4*)(wh + (size_t)r * cols + 32 * c);
    if constexpr (T == WT_CT4 || T == WT_CT8 || T == WT_Q8_0) {
        // gemm.cu's path (unpack_h16.cuh), so the f16 copy's exact test covers it.
        ChunkRaw<T> raw;
        chunk_fetch<T>(W + (size_t)r * row_bytes, c, raw);
        u32 h[16];
        chunk_unpack_h16<T>(raw, h);
        #pragma unroll
        for (int j = 0; j < 4; j++) dst[j] = make_uint4(h[4 * j], h[4 * j + 1], h[4 * j + 2], h[4 * j + 3]);
        return;
    }
    float w[32];
    decode_chunk<T>(W + (size_t)r * row_bytes, c, cols, w);
    #pragma unroll
    for (int j = 0; j < 4; j++)
        dst[j] = make_uint4(pack_f16x2(w[8 * j], w[8 * j + 1]), pack_f16x2(w[8 * j + 2], w[8 * j + 3]),
                            pack_f16x2(w[8 * j + 4], w[8 * j + 5]), pack_f16x2(w[8 * j + 6], w[8 * j + 7]));
}

#define DEQUANT_TYPES(X) X(f32, WT_F32) X(f16, WT_F16) X(bf16, WT_BF16) X(q8_0, WT_Q8_0) X(q4_K, WT_Q4_K) \
    X(q6_K, WT_Q6_K) X(ct4, WT_CT4) X(q5_K, WT_Q5_K) X(iq4_xs, WT_IQ4_XS) X(iq3_xxs, WT_IQ3_XXS) X(iq2_xxs, WT_IQ2_XXS) X(iq2_s, WT_IQ2_S) X(ct8, WT_CT8)
#define DEFINE_DEQUANT(name, T)                                                                   \
    extern "C" __global__ void dequant_f16_##name(const u8* W, u64 row_bytes, unsigned short* wh,  \
                                                  int rows, int cols) {                           \
        dequant_f16<T>(W, row_bytes, wh, rows, cols);                                             \
    }
DEQUANT_TYPES(DEFINE_DEQUANT)
