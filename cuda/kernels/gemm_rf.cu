// Tensor-core Q4_K products for prefill with the weights decoded straight into mma
// fragments ("register fragments"): the dense product out[t, r] = x[t] . W[r] and the
// expert-grouped gate/up (+ SwiGLU) and down products, for 64-token tiles.
//
// Numerics: gemm.cu's. Each weight is decoded exactly as the CPU decodes it
// (fsub(fmul(d·sc, q), dmin·m), no contraction) and rounded to f16; the activations are
// to_f16's f16 rows; the tensor cores accumulate in f32. Only the order of the f32 sums
// differs from gemm.cu.
//
// Why: gemm.cu decodes each stage's weights into an f16 tile in shared memory and reads it
// back with ldmatrix, with the stage's global loads not in flight during the mma loop (ncu:
// tensor pipe active 19% of cycles, L1/shared at 77%). Here
// - a three-stage cp.async ring brings, per stage, one Q4_K super-block (144 bytes) of each
//   of the block's 256 rows and 256 f16 activations of each of its 64 tokens, so the loads
//   of stages k + 1 and k + 2 are in flight while stage k computes;
// - each warp owns 32 weight rows (two m16 tiles) and all 64 tokens (eight n8 tiles), and
//   each lane decodes the weights of its own mma fragments from the raw bytes: no f16 weight
//   tile, no ldmatrix for A, each weight decoded once per block as before.
//
// The k order inside a k16 step is permuted (a dot product does not care, as long as the
// weights and the activations use the same permutation). For the 64 weights of a Q4_K group
// (32 bytes of nibbles: low nibbles are sub-block 2i, high nibbles 2i + 1), lane (g, q) = (lane
// / 4, lane % 4) reads bytes 8q .. 8q + 8 of each of its rows; k16 step s of the group maps the
// fragment's logical columns {2q, 2q + 1, 2q + 8, 2q + 9} to the weights at sub-block 2i + s / 2,
// positions 8q + 4 (s % 2) + {0, 1, 2, 3}: the four nibbles of one byte-aligned word. The
// matching B fragment (logical k rows {2q, 2q + 1} and {2q + 8, 2q + 9} of token g) is then the
// four consecutive activations at the same positions: one 8-byte half of a 16-byte shared load
// that serves two steps. (Fragment layouts: PTX ISA, "Matrix fragments for mma.m16n8k16 with
// floating point type"; the multi-stage cp.async ring as in CUTLASS's sm80 mainloops and
// llama.cpp's ggml-cuda/mma.cuh users; the direct-to-register dequantisation as in Marlin
// (IST-DASLab/marlin), here without a repacked layout.)
#include "quant.cuh"
#include "tc.cuh"

#define RF_BM 256
#define RF_BN 64
#define RF_THREADS 256
#define RF_STAGES 3
// One super-block of each row (144 bytes, rows back to back).
#define RF_A_BYTES (RF_BM * 144)
// One token's 256 f16 activations (512 bytes, no padding: token t's 16-byte chunk c sits at
// chunk c ^ 4 (t & 1), so the two tokens of each eight-lane phase of a 16-byte load fall on
// different banks).
#define RF_B_BYTES (RF_BN * 512)
#define RF_STAGE_BYTES (RF_A_BYTES + RF_B_BYTES)
// After the ring: each warp's table of its 32 rows' (d sc, dmin m) for the current
// super-block, rows RF_SC_STRIDE bytes apart (8 float2 + 8 bytes of padding, so the eight rows
// one 8-byte load touches fall on distinct banks); then the row and token pointer tables.
#define RF_SC_STRIDE 72
#define RF_SC (RF_STAGES * RF_STAGE_BYTES)
#define RF_TABLES (RF_SC + RF_BM * RF_SC_STRIDE)
// Dynamic shared memory per block (manifest.rs GEMM_RF_SMEM says the same; a unit test checks).
#define RF_SMEM_BYTES 229888
static_assert(RF_SMEM_BYTES == RF_TABLES + 8 * RF_BM + 8 * RF_BN, "RF_SMEM_BYTES");

// This thread's share of every stage's copies: nine 16-byte pieces of the rows' super-blocks
// (piece c = t + 256 j of the stage's 2304: row c / 9, bytes 16 (c % 9) .., at stage offset 16 c)
// and eight of the tokens' activations (token t / 32 + 8 j, bytes 16 (t % 32) ..). The source
// pointers are taken once from the block's tables; a stage adds its super-block's offset.
// Rows past the matrix and tokens past the tile point at a valid row or token instead (the
// tables clamp them): what they load only reaches outputs that are never stored (an mma
// output row depends on its A row alone, a column on its B column alone).
struct RfCopies {
    const u8* a[9];
    const u8* x[8];
};

__device__ __forceinline__ RfCopies rf_copies(const u8* smem, int t) {
    const u8* const* arows = (const u8* const*)(smem + RF_TABLES);
    const u8* const* xrows = (const u8* const*)(smem + RF_TABLES + 8 * RF_BM);
    RfCopies c;
    #pragma unroll
    for (int j = 0; j < 9; j++) {
        int i = t + RF_THREADS * j, r = i / 9;
        c.a[j] = arows[r] + 16 * (i - 9 * r);
    }
    #pragma unroll
    for (int j = 0; j < 8; j++) c.x[j] = xrows[(t >> 5) + 8 * j] + 16 * (t & 31);
    return c;
}

// Issues this thread's copies of super-block kb into stage st.
__device__ __forceinline__ void rf_load(u8* st, const RfCopies& c, int kb, int t) {
    #pragma unroll
    for (int j = 0; j < 9; j++) cp_async16(st + 16 * (t + RF_THREADS * j), c.a[j] + 144 * (size_t)kb);
    // Token (t / 32 + 8 j)'s chunk t % 32, swizzled by the token's parity (t / 32 % 2).
    u8* sb = st + RF_A_BYTES + 16 * ((t & 31) ^ (((t >> 5) & 1) << 2)) + 512 * (t >> 5);
    #pragma unroll
    for (int j = 0; j < 8; j++) cp_async16(sb + 512 * 8 * j, c.x[j] + 512 * (size_t)kb);
}

// Byte i (a nibble, 0..15) of v as a float, exactly: 2^23 + n built by a byte permute, minus 2^23.
__device__ __forceinline__ float rf_nib(u32 v, int i) {
    return __fsub_rn(__uint_as_float(__byte_perm(v, 0x4B000000u, 0x7440 + i)), 8388608.0f);
}

// Lane l of warp w writes row 32 w + l's eight sub-block scales (d sc, dmin m) of the
// super-block in stage st into the warp's table (k4_sub_scales: the reference's products).
__device__ __forceinline__ void rf_scales(const u8* st, u8* sc, int w, int lane) {
    uint4 hd = *(const uint4*)(st + 144 * (32 * w + lane));
    float2* dst = (float2*)(sc + RF_SC_STRIDE * (32 * w + lane));
    #pragma unroll
    for (int j = 0; j < 8; j++) {
        float d1, m1;
        k4_sub_scales(hd, j, &d1, &m1);
        dst[j] = make_float2(d1, m1);
    }
}

// acc += this warp's 32 rows x 64 tokens over the super-block in stage st, its scales in sc.
// A weight is fmaf(d sc, q, -dmin m): the reference's fsub(fmul(d sc, q), dmin m) exactly,
// since d sc q is exact in f32 (an f16 d of 11 significant bits times a 6-bit scale times a
// 4-bit q: at most 21 bits), so the multiply-add rounds once where the reference does.
__device__ __forceinline__ void rf_compute(const u8* st, const u8* sc, float acc[2][8][4], int w, int lane) {
    int g = lane >> 2, q = lane & 3;
    const u8* sb = st + RF_A_BYTES;
    int rows[2][2];
    #pragma unroll
    for (int mt = 0; mt < 2; mt++)
        #pragma unroll
        for (int h = 0; h < 2; h++) rows[mt][h] = 32 * w + 16 * mt + 8 * h + g;
    #pragma unroll
    for (int grp = 0; grp < 4; grp++) {
        uint2 qv[2][2];
        #pragma unroll
        for (int mt = 0; mt < 2; mt++)
            #pragma unroll
            for (int h = 0; h < 2; h++) qv[mt][h] = *(const uint2*)(st + 144 * rows[mt][h] + 16 + 32 * grp + 8 * q);
        #pragma unroll
        for (int half = 0; half < 2; half++) {
            float2 dm[2][2];
            #pragma unroll
            for (int mt = 0; mt < 2; mt++)
                #pragma unroll
                for (int h = 0; h < 2; h++)
                    dm[mt][h] = *(const float2*)(sc + RF_SC_STRIDE * rows[mt][h] + 8 * (2 * grp + half));
            uint4 b[8];
            int chunk = (8 * grp + 4 * half + q) ^ ((g & 1) << 2);
            #pragma unroll
            for (int nt = 0; nt < 8; nt++) b[nt] = *(const uint4*)(sb + 512 * (8 * nt + g) + 16 * chunk);
            #pragma unroll
            for (int s2 = 0; s2 < 2; s2++) {
                u32 a[2][4];
                #pragma unroll
                for (int mt = 0; mt < 2; mt++)
                    #pragma unroll
                    for (int h = 0; h < 2; h++) {
                        u32 word = s2 ? qv[mt][h].y : qv[mt][h].x;
                        u32 nib = (word >> (4 * half)) & 0x0F0F0F0Fu;
                        float d1 = dm[mt][h].x, nm1 = -dm[mt][h].y;
                        float w0 = __fmaf_rn(d1, rf_nib(nib, 0), nm1);
                        float w1 = __fmaf_rn(d1, rf_nib(nib, 1), nm1);
                        float w2 = __fmaf_rn(d1, rf_nib(nib, 2), nm1);
                        float w3 = __fmaf_rn(d1, rf_nib(nib, 3), nm1);
                        a[mt][h] = pack_f16x2(w0, w1);
                        a[mt][2 + h] = pack_f16x2(w2, w3);
                    }
                #pragma unroll
                for (int nt = 0; nt < 8; nt++) {
                    u32 bb[2] = {s2 ? b[nt].z : b[nt].x, s2 ? b[nt].w : b[nt].y};
                    mma_16816(acc[0][nt], a[0], bb);
                    mma_16816(acc[1][nt], a[1], bb);
                }
            }
        }
    }
}

// The K loop over nkb super-blocks, the pointer tables already in shared memory.
__device__ __forceinline__ void rf_mainloop(u8* smem, int nkb, float acc[2][8][4]) {
    int t = threadIdx.x, w = t >> 5, lane = t & 31;
    RfCopies cp = rf_copies(smem, t);
    #pragma unroll
    for (int mt = 0; mt < 2; mt++)
        #pragma unroll
        for (int nt = 0; nt < 8; nt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;
    #pragma unroll
    for (int s = 0; s < RF_STAGES - 1; s++) {
        if (s < nkb) rf_load(smem + RF_STAGE_BYTES * s, cp, s, t);
        cp_async_commit();
    }
    for (int kb = 0; kb < nkb; kb++) {
        // Stage kb has landed (all but the newest group are complete) and every warp is
        // done with stage kb - 1, which the next load overwrites.
        cp_async_wait<RF_STAGES - 2>();
        __syncthreads();
        int nx = kb + RF_STAGES - 1;
        if (nx < nkb) rf_load(smem + RF_STAGE_BYTES * (nx % RF_STAGES), cp, nx, t);
        cp_async_commit();
        const u8* st = smem + RF_STAGE_BYTES * (kb % RF_STAGES);
        // The warp's scale table is its own: its lanes finished reading the previous
        // super-block's before the barrier above.
        rf_scales(st, smem + RF_SC, w, lane);
        __syncwarp();
        rf_compute(st, smem + RF_SC, acc, w, lane);
    }
}

// Accumulator element (mt, nt, e) of this thread: warp row 16 mt + g + 8 (e / 2), token
// 8 nt + 2 q + e % 2.
__device__ __forceinline__ int rf_row(int mt, int e) { return 16 * mt + ((threadIdx.x & 31) >> 2) + 8 * (e >> 1); }
__device__ __forceinline__ int rf_tok(int nt, int e) { return 8 * nt + 2 * (threadIdx.x & 3) + (e & 1); }

// out[t, r] = x[t] . W[r], W Q4_K with cols % 256 == 0. Grid (ceil(rows / 256), ceil(n / 64)),
// block 256, RF_SMEM_BYTES of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(RF_THREADS, 1)
    gemm_rf_q4_K(const u8* __restrict__ W, u64 row_bytes, const unsigned short* __restrict__ x,
                 float* __restrict__ out, int rows, int cols, int n) {
    extern __shared__ __align__(16) u8 smem[];
    int r0 = blockIdx.x * RF_BM, t0 = blockIdx.y * RF_BN, t = threadIdx.x;
    ((const u8**)(smem + RF_TABLES))[t] = W + (size_t)min(r0 + t, rows - 1) * row_bytes;
    if (t < RF_BN)
        ((const unsigned short**)(smem + RF_TABLES + 8 * RF_BM))[t] = x + (size_t)min(t0 + t, n - 1) * cols;
    __syncthreads();
    float acc[2][8][4];
    rf_mainloop(smem, cols / 256, acc);
    int rw = r0 + 32 * (t >> 5);
    #pragma unroll
    for (int mt = 0; mt < 2; mt++)
        #pragma unroll
        for (int nt = 0; nt < 8; nt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = rw + rf_row(mt, e), tk = t0 + rf_tok(nt, e);
                if (r < rows && tk < n) out[(size_t)tk * rows + r] = acc[mt][nt][e];
            }
}

// Grouped gate/up with SwiGLU over a tile of up to 64 pairs from moe_group (gemm.cu's
// gemm_gate_up contract): a block takes 128 rows of the expert's gate and the same rows of its
// up; warp w's m16 tile 0 holds gate rows r0 + 16 w .. + 16 and tile 1 the same up rows, so a
// thread holds gate and up at the same (row, pair) positions. act[p, r] = silu(gate) * up,
// rounded to f16. Grid (ceil(I / 128), max_tiles).
extern "C" __global__ void __launch_bounds__(RF_THREADS, 1)
    gemm_gate_up_rf_q4_K(const u8* __restrict__ Wg, const u8* __restrict__ Wu, u64 expert_bytes, u64 row_bytes,
                         const unsigned short* __restrict__ x, const u32* __restrict__ sorted,
                         const u32* __restrict__ tiles, unsigned short* __restrict__ act, int I, int H, int K) {
    extern __shared__ __align__(16) u8 smem[];
    const u32* tl = tiles + 3 * blockIdx.y;
    int cnt = (int)tl[2];
    if (cnt == 0) return;
    u32 e = tl[0], first = tl[1];
    int r0 = blockIdx.x * (RF_BM / 2), t = threadIdx.x;
    {
        int w = t >> 5, mt = (t >> 4) & 1, r = r0 + 16 * w + (t & 15);
        const u8* mat = mt ? Wu : Wg;
        ((const u8**)(smem + RF_TABLES))[t] = mat + (size_t)e * expert_bytes + (size_t)min(r, I - 1) * row_bytes;
    }
    if (t < RF_BN)
        ((const unsigned short**)(smem + RF_TABLES + 8 * RF_BM))[t] =
            x + (size_t)(sorted[first + min(t, cnt - 1)] / K) * H;
    __syncthreads();
    float acc[2][8][4];
    rf_mainloop(smem, H / 256, acc);
    int rw = r0 + 16 * (t >> 5);
    #pragma unroll
    for (int nt = 0; nt < 8; nt++)
        #pragma unroll
        for (int e2 = 0; e2 < 4; e2++) {
            int r = rw + rf_row(0, e2), tk = rf_tok(nt, e2);
            if (r < I && tk < cnt)
                act[(size_t)sorted[first + tk] * I + r] = __half_as_ushort(
                    __float2half_rn(f16_range(silu_f(acc[0][nt][e2]) * acc[1][nt][e2])));
        }
}

// Grouped down: ys[p, r] = act[p] . Wd_e[r] for the tile's sorted pairs p. Grid
// (ceil(H / 256), max_tiles).
extern "C" __global__ void __launch_bounds__(RF_THREADS, 1)
    gemm_down_rf_q4_K(const u8* __restrict__ Wd, u64 expert_bytes, u64 row_bytes,
                      const unsigned short* __restrict__ act, const u32* __restrict__ sorted,
                      const u32* __restrict__ tiles, float* __restrict__ ys, int H, int I) {
    extern __shared__ __align__(16) u8 smem[];
    const u32* tl = tiles + 3 * blockIdx.y;
    int cnt = (int)tl[2];
    if (cnt == 0) return;
    u32 e = tl[0], first = tl[1];
    int r0 = blockIdx.x * RF_BM, t = threadIdx.x;
    ((const u8**)(smem + RF_TABLES))[t] = Wd + (size_t)e * expert_bytes + (size_t)min(r0 + t, H - 1) * row_bytes;
    if (t < RF_BN)
        ((const unsigned short**)(smem + RF_TABLES + 8 * RF_BM))[t] = act + (size_t)sorted[first + min(t, cnt - 1)] * I;
    __syncthreads();
    float acc[2][8][4];
    rf_mainloop(smem, I / 256, acc);
    int rw = r0 + 32 * (t >> 5);
    #pragma unroll
    for (int mt = 0; mt < 2; mt++)
        #pragma unroll
        for (int nt = 0; nt < 8; nt++)
            #pragma unroll
            for (int e2 = 0; e2 < 4; e2++) {
                int r = rw + rf_row(mt, e2), tk = rf_tok(nt, e2);
                if (r < H && tk < cnt) ys[(size_t)sorted[first + tk] * H + r] = acc[mt][nt][e2];
            }
}
