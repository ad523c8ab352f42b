// Tensor-core Q4_K, Q6_K, CT4 (W4A16) and CT8 (W8A16, W8A8) products for prefill with the weights decoded straight into mma
// fragments ("register fragments"): the dense product out[t, r] = x[t] . W[r] and the
// expert-grouped gate/up (+ SwiGLU) and down products, for tiles of 64 tokens (both types),
// 128 (Q4_K) or 96 (Q6_K's grouped products, whose 128-token ring would not fit in shared
// memory: a 128-pair expert tile of fewer than 97 pairs then takes one pass, not two).
//
// Numerics: gemm.cu's. Each weight is decoded exactly as the CPU decodes it (Q4_K
// fsub(fmul(d·sc, q), dmin·m), Q6_K fmul(d·sc, q - 32); no contraction that changes a value)
// and rounded to f16; the activations are to_f16's f16 rows; the tensor cores accumulate in
// f32. Only the order of the f32 sums differs from gemm.cu.
//
// Why: gemm.cu decodes each stage's weights into an f16 tile in shared memory and reads it
// back with ldmatrix, with the stage's global loads not in flight during the mma loop (ncu:
// tensor pipe active 19% of cycles, L1/shared at 77%). Here
// - a cp.async ring brings, per stage, one super-block of each of the block's 256 rows and
//   256 f16 activations of each of its tokens, so the next stages' loads are in flight while
//   a stage computes (three stages for Q4_K on 64-token tiles, two otherwise);
// - each warp owns 32 weight rows (two m16 tiles) and all the tile's tokens (NT = 8 or 16 n8
//   tiles), and each lane decodes the weights of its own mma fragments from the raw bytes:
//   no f16 weight tile, no ldmatrix for A, each weight decoded once per block as before.
//
// The k order inside a k16 step is permuted (a dot product does not care, as long as the
// weights and the activations use the same permutation). For the 64 weights of a Q4_K group
// (32 bytes of nibbles: low nibbles are sub-block 2i, high nibbles 2i + 1), lane (g, q) = (lane
// / 4, lane % 4) reads bytes 8q .. 8q + 8 of each of its rows; k16 step s of the group maps the
// fragment's logical columns {2q, 2q + 1, 2q + 8, 2q + 9} to the weights at sub-block 2i + s / 2,
// positions 8q + 4 (s % 2) + {0, 1, 2, 3}: the four nibbles of one byte-aligned word. The
// matching B fragment (logical k rows {2q, 2q + 1} and {2q + 8, 2q + 9} of token g) is then the
// four consecutive activations at the same positions: one 8-byte half of a 16-byte shared load
// that serves two steps. Q6_K's 32-weight groups (ql nibbles plus two qh bits) take the same
// lane split, one group per two steps. (Fragment layouts: PTX ISA, "Matrix fragments for
// mma.m16n8k16 with floating point type"; the multi-stage cp.async ring as in CUTLASS's sm80
// mainloops and llama.cpp's ggml-cuda/mma.cuh users; the direct-to-register dequantisation
// as in Marlin (IST-DASLab/marlin), here without a repacked layout.)
#include "rf_formats.cuh"
#include "wgmma.cuh"

// Dynamic shared memory per block (manifest.rs GEMM_RF_SMEM_* say the same; a unit test
// checks): Q4_K with 64-token and 128-token tiles, Q6_K with 64-token tiles.
#define RF_SMEM_Q4_K 229888
#define RF_SMEM_Q4_K_128 226304
#define RF_SMEM_Q6_K 199168
#define RF_SMEM_Q6_K_96 232192
#define RF_SMEM_CT4 223744
#define RF_SMEM_CT4_128 216064
#define RF_SMEM_CT8 215552

static_assert(RfLayout<RfQ4K, 8>::SMEM == RF_SMEM_Q4_K, "RF_SMEM_Q4_K");
static_assert(RfLayout<RfQ4K, 16>::SMEM == RF_SMEM_Q4_K_128, "RF_SMEM_Q4_K_128");
static_assert(RfLayout<RfQ6K, 8>::SMEM == RF_SMEM_Q6_K, "RF_SMEM_Q6_K");
static_assert(RfLayout<RfQ6K, 12>::SMEM == RF_SMEM_Q6_K_96, "RF_SMEM_Q6_K_96");
static_assert(RfLayout<RfCt4, 8>::SMEM == RF_SMEM_CT4, "RF_SMEM_CT4");
static_assert(RfLayout<RfCt4, 16>::SMEM == RF_SMEM_CT4_128, "RF_SMEM_CT4_128");
static_assert(RfLayout<RfCt8, 8>::SMEM == RF_SMEM_CT8, "RF_SMEM_CT8");
static_assert(RF_SMEM_Q6_K_96 <= 232448, "Q6_K 96-token ring over the 227 KiB block limit");

// acc += the warp's 32 rows x BN tokens over the stage's super-block: per unit, the A
// fragments of both steps, then per eight n8 tiles (the last group of NT = 12 has four) the
// 16-byte activation loads (two steps' B fragments each) and the mma. n8 tiles at or past
// ntv (the tile's live tokens / 8, rounded up; warp-uniform) are skipped.
template <typename F, int NT>
__device__ __forceinline__ void rf_compute(const u8* st, const u8* sc, float acc[2][NT][4], int w, int lane, int kb,
                                           int ntv) {
    int g = lane >> 2, q = lane & 3;
    const u8* sb = st + RfLayout<F, NT>::A_BYTES;
    RfRows rw(w, g);
    #pragma unroll
    for (int u = 0; u < 8; u++) {
        u32 a[2][2][4];
        F::frags(st, sc, rw, q, kb, u, a);
        int chunk = (4 * u + q) ^ ((g & 1) << 2);
        #pragma unroll
        for (int nh = 0; nh < (NT + 7) / 8; nh++) {
            if (8 * nh >= ntv) break;
            uint4 b[8];
            #pragma unroll
            for (int j = 0; j < 8; j++)
                if (8 * nh + j < NT) b[j] = *(const uint4*)(sb + 512 * (64 * nh + 8 * j + g) + 16 * chunk);
            #pragma unroll
            for (int s2 = 0; s2 < 2; s2++)
                #pragma unroll
                for (int j = 0; j < 8; j++) {
                    int nt = 8 * nh + j;
                    if (nt < NT && nt < ntv) {
                        u32 bb[2] = {s2 ? b[j].z : b[j].x, s2 ? b[j].w : b[j].y};
                        mma_16816(acc[0][nt], a[s2][0], bb);
                        mma_16816(acc[1][nt], a[s2][1], bb);
                    }
                }
        }
    }
}

// Zeroes the accumulators and issues the copies of the ring's first STAGES - 1 stages
// (load(slot, kb)), one commit group each (empty past nkb), as both mainloops start.
template <int NT, int STAGES, typename Load>
__device__ __forceinline__ void rf_start(float acc[2][NT][4], int nkb, Load load) {
    #pragma unroll
    for (int mt = 0; mt < 2; mt++)
        #pragma unroll
        for (int nt = 0; nt < NT; nt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;
    #pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nkb) load(s, s);
        cp_async_commit();
    }
}

// One iteration's start in both mainloops: wait until stage kb has landed (and, for the
// wgmma loop, make it visible to the async proxy) and every warp is done with the slot the
// next copies overwrite (one barrier), issue the copies of stage kb + STAGES - 1, decode the
// warp's scales of stage kb into its table. Returns stage kb's slot.
template <typename F, int NT, bool WG, typename Load>
__device__ __forceinline__ const u8* rf_stage(u8* smem, int kb, int nkb, Load load, int w, int lane) {
    using L = RfLayout<F, NT>;
    cp_async_wait<L::STAGES - 2>();
    if constexpr (WG) wg_proxy_fence();
    __syncthreads();
    int nx = kb + L::STAGES - 1;
    if (nx < nkb) load(nx % L::STAGES, nx);
    cp_async_commit();
    const u8* st = smem + L::STAGE * (kb % L::STAGES);
    F::scales(st, smem + L::SC, w, lane, kb);
    __syncwarp();
    return st;
}

// The K loop over nkb super-blocks for a tile of `live` tokens, the pointer tables already in
// shared memory. Each stage: wait until it has landed and every warp is done with the stage
// the next copies overwrite (one barrier), issue the copies of super-block kb + STAGES - 1,
// decode the warp's scales into its own table (its lanes finished reading the previous ones
// before the barrier), compute. Rows past the matrix and tokens past the tile point at a valid
// row or token (the tables clamp them): what they load only reaches outputs that are never
// stored (an mma output row depends on its A row alone, a column on its B column alone).
template <typename F, int NT>
__device__ __forceinline__ void rf_mainloop(u8* smem, int nkb, int live, float acc[2][NT][4]) {
    using L = RfLayout<F, NT>;
    int t = threadIdx.x, w = t >> 5, lane = t & 31;
    int ntv = min(NT, (live + 7) / 8);
    typename F::Copies ca = F::copies((const u8* const*)(smem + L::TABLES), t);
    // This thread's activation copies: token t / 32 + 8 j, 16 bytes at chunk t % 32 (stored
    // swizzled by the token's parity, t / 32 % 2).
    // Held in registers (2 NT of them) where they fit; Q6_K's 96-token tiles read them from
    // the table per copy instead, as the wgmma loop does (held, they spill).
    constexpr bool HOLD = NT != 12;
    const u8* const* xrows = (const u8* const*)(smem + L::TABLES + 8 * RF_BM);
    const u8* xs[HOLD ? NT : 1];
    if constexpr (HOLD) {
        #pragma unroll
        for (int j = 0; j < NT; j++) xs[j] = xrows[(t >> 5) + 8 * j] + 16 * (t & 31);
    }
    int xoff = L::A_BYTES + 16 * ((t & 31) ^ (((t >> 5) & 1) << 2)) + 512 * (t >> 5);
    auto load = [&](int s, int kb) {
        u8* st = smem + L::STAGE * s;
        F::load(st, ca, kb, t);
        #pragma unroll
        for (int j = 0; j < NT; j++) {
            const u8* src = HOLD ? xs[HOLD ? j : 0] : xrows[(t >> 5) + 8 * j] + 16 * (t & 31);
            cp_async16(st + xoff + 512 * 8 * j, src + 512 * (size_t)kb);
        }
    };
    rf_start<NT, L::STAGES>(acc, nkb, load);
    for (int kb = 0; kb < nkb; kb++) {
        const u8* st = rf_stage<F, NT, false>(smem, kb, nkb, load, w, lane);
        rf_compute<F, NT>(st, smem + L::SC, acc, w, lane, kb, ntv);
    }
    // Every warp is done with the ring and the tables before a caller refills them.
    __syncthreads();
}

// ---- wgmma mainloop (sm_90a) ----

template <int N>
__device__ __forceinline__ void wg_mma(float* d, const u32 a[4], u64 desc) {
    if constexpr (N == 128) wgmma_m64n128(d, a, desc);
    else if constexpr (N == 96) wgmma_m64n96(d, a, desc);
    else wgmma_m64n64(d, a, desc);
}
//
// The same ring and stages as rf_mainloop, with each warpgroup's products issued as
// wgmma.mma_async (A from the lanes' decoded registers, B straight from shared memory): per
// k16 step a warp decodes its two m16 tiles' fragments while the previous step's wgmmas run
// (a group of four steps per commit, two groups' A buffers), and the tensor cores
// read the activations without LDS or B registers. The activations are staged in wgmma.cuh's
// 128-byte swizzled K-major layout, in the k order of the format's wg_frags: region G (one
// per 64-weight group) holds the BN tokens' 128 bytes of it, and the group's physical
// 16-byte chunk c8 (k 8 c8 .. 8 c8 + 8) goes to logical chunk 2 (c8 % 4) + c8 / 4 (step c8 % 4,
// low or high half). Shared memory is laid out as RfLayout from a 1024-byte aligned base.
// N: the wgmma width, BN or (a 128-token tile with fewer live tokens) 64 or 96; one width per
// call, so that ptxas sees every wgmma on the accumulators with the same shape.
template <typename F, int NT, int N>
__device__ __forceinline__ void wg_compute(const u8* st, const u8* sc, float acc[2][NT][4], int w, int lane,
                                           u32 bsh) {
    constexpr int BN = 8 * NT;
    int g = lane >> 2, q = lane & 3;
    RfRows rw(w, g);
    // A fragments of SPC k16 steps per buffer (a whole group of four on 64-token tiles; two on
    // 128-token tiles, whose accumulators leave no registers for more): the batch's decode has
    // SPC steps' independent chains to interleave, its wgmmas go out under one fence and one
    // commit, and the next batch decodes while they run (wait_group 1 frees the buffer two
    // batches back).
    constexpr int SPC = NT == 16 ? 2 : 4;
    u32 a[2][SPC][2][4];
    #pragma unroll
    for (int G = 0; G < 4; G++) {
        typename F::WgGroup gr;
        F::wg_group(st, sc, rw, G, gr);
        #pragma unroll
        for (int j0 = 0; j0 < 4; j0 += SPC) {
            int b = ((4 * G + j0) / SPC) & 1;
            #pragma unroll
            for (int j = 0; j < SPC; j++) F::wg_frags(st, rw, gr, q, G, j0 + j, a[b][j]);
            wg_fence();
            #pragma unroll
            for (int j = 0; j < SPC; j++) {
                u64 desc = wg_desc(bsh + G * BN * 128 + 32 * (j0 + j));
                wg_mma<N>(&acc[0][0][0], a[b][j][0], desc);
                wg_mma<N>(&acc[1][0][0], a[b][j][1], desc);
            }
            wg_commit();
            wg_wait<1>();
        }
    }
}

template <typename F, int NT>
__device__ __forceinline__ void wg_mainloop(u8* smem, int nkb, int live, float acc[2][NT][4]) {
    using L = RfLayout<F, NT>;
    constexpr int BN = 8 * NT;
    int t = threadIdx.x, w = t >> 5, lane = t & 31;
    // 128-token tiles with at most 64 (96) live tokens take n64 (n96) wgmmas: the other
    // accumulators stay zero and are never stored.
    int wn = NT == 16 ? (live <= 64 ? 64 : live <= 96 ? 96 : 128) : 64;
    typename F::Copies ca = F::copies((const u8* const*)(smem + L::TABLES), t);
    // The token pointers are read from the table per copy (held in registers they would take
    // 2 NT of them from the accumulators).
    const u8* const* xrows = (const u8* const*)(smem + L::TABLES + 8 * RF_BM);
    // Token r8 + 8 j (r8 = t / 32), physical chunk c = t % 32 of the super-block's 32: region
    // c / 8, logical chunk s, swizzled by the token's row in its atom (r8).
    int r8 = t >> 5, c = t & 31, c8 = c & 7, s = 2 * (c8 & 3) + (c8 >> 2);
    int xoff = L::A_BYTES + (c >> 3) * BN * 128 + 128 * r8 + 16 * (s ^ r8);
    auto load = [&](int st, int kb) {
        u8* sp = smem + L::STAGE * st;
        F::load(sp, ca, kb, t);
        #pragma unroll
        for (int j = 0; j < NT; j++) cp_async16(sp + xoff + 1024 * j, xrows[(t >> 5) + 8 * j] + 16 * (t & 31) + 512 * (size_t)kb);
    };
    rf_start<NT, L::STAGES>(acc, nkb, load);
    u32 base = (u32)__cvta_generic_to_shared(smem);
    for (int kb = 0; kb < nkb; kb++) {
        const u8* st = rf_stage<F, NT, true>(smem, kb, nkb, load, w, lane);
        u32 bsh = base + L::STAGE * (kb % L::STAGES) + L::A_BYTES;
        if (NT == 16 && wn == 128) wg_compute<F, NT, 8 * NT>(st, smem + L::SC, acc, w, lane, bsh);
        else if (NT == 16 && wn == 96) wg_compute<F, NT, (NT == 16 ? 96 : 64)>(st, smem + L::SC, acc, w, lane, bsh);
        else wg_compute<F, NT, 64>(st, smem + L::SC, acc, w, lane, bsh);
        // The stage's wgmmas read its activations until they complete; the next iteration
        // refills the stage before this one.
        wg_wait<0>();
    }
    __syncthreads();
}

// The block's shared memory: RfLayout from the dynamic allocation's first 1024-byte aligned
// byte when WG (wgmma.cuh's swizzled atoms need it; the launch adds 1024 bytes), else as is.
template <bool WG>
__device__ __forceinline__ u8* rf_smem(u8* raw) {
    if constexpr (WG) {
        u32 a = (u32)__cvta_generic_to_shared(raw);
        return raw + ((1024 - (a & 1023)) & 1023);
    } else {
        return raw;
    }
}

// A format decoded by the matrix's scale dtype (F::BY_DTYPE: RfCt4, RfCt8) reads the dtype from the
// header of the tile's first block (row table entry 0, which every caller fills before its
// barrier) and runs the mainloop of that dtype's form, F::ByDtype<T>: the tile's rows are one
// matrix's.
template <typename F, int NT, bool WG>
__device__ __forceinline__ void rf_loop(u8* smem, int nkb, int live, float acc[2][NT][4]) {
    if constexpr (F::BY_DTYPE) {
        static_assert(!WG, "the formats decoded by dtype have no wgmma mainloop");
        const u8* first = ((const u8* const*)(smem + RfLayout<F, NT>::TABLES))[0];
        if (first[3] == WT_BF16) rf_mainloop<typename F::template ByDtype<WT_BF16>, NT>(smem, nkb, live, acc);
        else rf_mainloop<typename F::template ByDtype<WT_F16>, NT>(smem, nkb, live, acc);
    } else if constexpr (WG) {
        wg_mainloop<F, NT>(smem, nkb, live, acc);
    } else {
        rf_mainloop<F, NT>(smem, nkb, live, acc);
    }
}

// Accumulator element (mt, nt, e) of this thread: warp row 16 mt + g + 8 (e / 2), token
// 8 nt + 2 q + e % 2.
__device__ __forceinline__ int rf_row(int mt, int e) { return 16 * mt + ((threadIdx.x & 31) >> 2) + 8 * (e >> 1); }
__device__ __forceinline__ int rf_tok(int nt, int e) { return 8 * nt + 2 * (threadIdx.x & 3) + (e & 1); }

// Calls store(row, token, value) for each of this thread's accumulators: row relative to the
// warp's first (rf_row), token relative to the pass's first (rf_tok).
template <int NT, typename Store>
__device__ __forceinline__ void rf_store(const float acc[2][NT][4], Store store) {
    #pragma unroll
    for (int mt = 0; mt < 2; mt++)
        #pragma unroll
        for (int nt = 0; nt < NT; nt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) store(rf_row(mt, e), rf_tok(nt, e), acc[mt][nt][e]);
}

// This block's expert tile from moe_group's list (blockIdx.y): expert, first sorted pair,
// pair count (0: an unused slot).
struct RfTile {
    int cnt;
    u32 e, first;
};
__device__ __forceinline__ RfTile rf_tile(const u32* __restrict__ tiles) {
    const u32* tl = tiles + 3 * blockIdx.y;
    return RfTile{(int)tl[2], tl[0], tl[1]};
}

template <typename F, int NT>
__device__ __forceinline__ const u8** rf_arows(u8* smem) {
    return (const u8**)(smem + RfLayout<F, NT>::TABLES);
}
template <typename F, int NT>
__device__ __forceinline__ const unsigned short** rf_xrows(u8* smem) {
    return (const unsigned short**)(smem + RfLayout<F, NT>::TABLES + 8 * RF_BM);
}

// out[t, r] = x[t] . W[r] (cols % 256 == 0). Grid (ceil(rows / 256), ceil(n / BN)), block 256,
// RfLayout<F, NT>::SMEM bytes of dynamic shared memory.
template <typename F, int NT, bool WG>
__device__ __forceinline__ void rf_dense(const u8* __restrict__ W, u64 row_bytes, const unsigned short* __restrict__ x,
                                         float* __restrict__ out, int rows, int cols, int n) {
    extern __shared__ __align__(16) u8 rf_raw[];
    u8* smem = rf_smem<WG>(rf_raw);
    constexpr int BN = 8 * NT;
    int r0 = blockIdx.x * RF_BM, t0 = blockIdx.y * BN, t = threadIdx.x;
    rf_arows<F, NT>(smem)[t] = W + (size_t)min(r0 + t, rows - 1) * row_bytes;
    if (t < BN) rf_xrows<F, NT>(smem)[t] = x + (size_t)min(t0 + t, n - 1) * cols;
    __syncthreads();
    float acc[2][NT][4];
    rf_loop<F, NT, WG>(smem, cols / 256, n - t0, acc);
    int rw = r0 + 32 * (t >> 5);
    rf_store<NT>(acc, [&](int r, int tk, float v) {
        r += rw;
        tk += t0;
        if (r < rows && tk < n) out[(size_t)tk * rows + r] = v;
    });
}

// Grouped gate/up with SwiGLU over a tile of pairs from moe_group (gemm.cu's gemm_gate_up
// contract), BN pairs per pass (a tile of more pairs takes several): a block takes 128 rows of
// the expert's gate and the same rows of its up; warp w's m16 tile 0 holds gate rows
// r0 + 16 w .. + 16 and tile 1 the same up rows, so a thread holds gate and up at the same
// (row, pair) positions. act[p, r] = silu(gate) * up, rounded to f16. Grid (ceil(I / 128),
// max_tiles).
template <typename F, int NT, bool WG>
__device__ __forceinline__ void rf_gate_up(const u8* __restrict__ Wg, const u8* __restrict__ Wu, u64 expert_bytes,
                                           u64 row_bytes, const unsigned short* __restrict__ x,
                                           const u32* __restrict__ sorted, const u32* __restrict__ tiles,
                                           unsigned short* __restrict__ act, int I, int H, int K) {
    extern __shared__ __align__(16) u8 rf_raw[];
    u8* smem = rf_smem<WG>(rf_raw);
    constexpr int BN = 8 * NT;
    RfTile tile = rf_tile(tiles);
    if (tile.cnt == 0) return;
    int cnt = tile.cnt;
    u32 e = tile.e, first = tile.first;
    int r0 = blockIdx.x * (RF_BM / 2), t = threadIdx.x;
    {
        int w = t >> 5, mt = (t >> 4) & 1, r = r0 + 16 * w + (t & 15);
        const u8* mat = mt ? Wu : Wg;
        rf_arows<F, NT>(smem)[t] = mat + (size_t)e * expert_bytes + (size_t)min(r, I - 1) * row_bytes;
    }
    for (int p0 = 0; p0 < cnt; p0 += BN) {
        if (t < BN) rf_xrows<F, NT>(smem)[t] = x + (size_t)(sorted[first + min(p0 + t, cnt - 1)] / K) * H;
        __syncthreads();
        float acc[2][NT][4];
        rf_loop<F, NT, WG>(smem, H / 256, cnt - p0, acc);
        int rw = r0 + 16 * (t >> 5);
        #pragma unroll
        for (int nt = 0; nt < NT; nt++)
            #pragma unroll
            for (int e2 = 0; e2 < 4; e2++) {
                int r = rw + rf_row(0, e2), tk = p0 + rf_tok(nt, e2);
                if (r < I && tk < cnt)
                    act[(size_t)sorted[first + tk] * I + r] = __half_as_ushort(
                        __float2half_rn(f16_range(silu_f(acc[0][nt][e2]) * acc[1][nt][e2])));
            }
    }
}

// Grouped down: ys[p, r] = act[p] . Wd_e[r] for the tile's sorted pairs p, BN per pass. Grid
// (ceil(H / 256), max_tiles).
template <typename F, int NT, bool WG>
__device__ __forceinline__ void rf_down(const u8* __restrict__ Wd, u64 expert_bytes, u64 row_bytes,
                                        const unsigned short* __restrict__ act, const u32* __restrict__ sorted,
                                        const u32* __restrict__ tiles, float* __restrict__ ys, int H, int I) {
    extern __shared__ __align__(16) u8 rf_raw[];
    u8* smem = rf_smem<WG>(rf_raw);
    constexpr int BN = 8 * NT;
    RfTile tile = rf_tile(tiles);
    if (tile.cnt == 0) return;
    int cnt = tile.cnt;
    u32 e = tile.e, first = tile.first;
    int r0 = blockIdx.x * RF_BM, t = threadIdx.x;
    rf_arows<F, NT>(smem)[t] = Wd + (size_t)e * expert_bytes + (size_t)min(r0 + t, H - 1) * row_bytes;
    for (int p0 = 0; p0 < cnt; p0 += BN) {
        if (t < BN) rf_xrows<F, NT>(smem)[t] = act + (size_t)sorted[first + min(p0 + t, cnt - 1)] * I;
        __syncthreads();
        float acc[2][NT][4];
        rf_loop<F, NT, WG>(smem, I / 256, cnt - p0, acc);
        int rw = r0 + 32 * (t >> 5);
        rf_store<NT>(acc, [&](int r, int tk, float v) {
            r += rw;
            tk += p0;
            if (r < H && tk < cnt) ys[(size_t)sorted[first + tk] * H + r] = v;
        });
    }
}

// The kernels of one format, tile and mainloop: gemm_{sfx}_* (RF_KERNELS only),
// gemm_gate_up_{sfx}_*, gemm_down_{sfx}_* (gemm.cu's argument lists and block; grids by the
// tile).
#define RF_KERNELS(name, F, NT, WG, sfx)                                                               \
    extern "C" __global__ void __launch_bounds__(RF_THREADS, 1) gemm_##sfx##_##name(             \
        const u8* W, u64 row_bytes, const unsigned short* x, float* out, int rows, int cols, int n) { \
        rf_dense<F, NT, WG>(W, row_bytes, x, out, rows, cols, n);                                      \
    }                                                                                              \
    RF_GROUPED(name, F, NT, WG, sfx)
#define RF_GROUPED(name, F, NT, WG, sfx)                                                               \
    extern "C" __global__ void __launch_bounds__(RF_THREADS, 1) gemm_gate_up_##sfx##_##name(     \
        const u8* Wg, const u8* Wu, u64 expert_bytes, u64 row_bytes, const unsigned short* x,      \
        const u32* sorted, const u32* tiles, unsigned short* act, int I, int H, int K) {           \
        rf_gate_up<F, NT, WG>(Wg, Wu, expert_bytes, row_bytes, x, sorted, tiles, act, I, H, K);        \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(RF_THREADS, 1) gemm_down_##sfx##_##name(        \
        const u8* Wd, u64 expert_bytes, u64 row_bytes, const unsigned short* act, const u32* sorted,\
        const u32* tiles, float* ys, int H, int I) {                                               \
        rf_down<F, NT, WG>(Wd, expert_bytes, row_bytes, act, sorted, tiles, ys, H, I);                 \
    }
RF_KERNELS(q4_K, RfQ4K, 8, false, rf)
RF_KERNELS(q4_K, RfQ4K, 16, false, rf128)
RF_KERNELS(q6_K, RfQ6K, 8, false, rf)
RF_GROUPED(q6_K, RfQ6K, 12, false, rf96)
RF_KERNELS(ct4, RfCt4, 8, false, rf)
RF_KERNELS(ct4, RfCt4, 16, false, rf128)
RF_KERNELS(ct8, RfCt8, 8, false, rf)
// wgmma (sm_90a; gemm_rf.cu is compiled for it on sm_90 devices).
RF_KERNELS(q4_K, RfQ4K, 8, true, wg)
RF_KERNELS(q4_K, RfQ4K, 16, true, wg128)
