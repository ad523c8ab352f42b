// The decode path's quantised mat-vec kernels: weights in their stored encoding, the
// activation quantised once per input (act.cu), integer dots (mmvq.cuh). Used for steps of
// at most MVQ_MAX_TOKENS tokens when the session runs with quantised activations; the f32
// kernels of matmul.cu / moe.cu remain the exact (reference-numerics) path.
#include "act.cuh"
#include "mmvq.cuh"
#include "tc.cuh"

#define MV_WARPS 4
#define MV_MATS 4

// Lab switches (LAGOON_CUDA_DEFINES=NAME=N): the least blocks per SM the one-token mat-vecs
// (MV_LB), the expert gate/up (GATE_UP_LB) and the expert down kernels (DOWN_LB) are compiled
// for, __launch_bounds__'s second argument, which caps their registers. Unset: no cap.
#if defined(MV_MIN_BLOCKS) && MV_MIN_BLOCKS > 1
#define MV_LB __launch_bounds__(32 * MV_WARPS, MV_MIN_BLOCKS)
#else
#define MV_LB __launch_bounds__(32 * MV_WARPS)
#endif
#if defined(GATE_UP_MIN_BLOCKS) && GATE_UP_MIN_BLOCKS > 1
#define GATE_UP_LB __launch_bounds__(32 * MV_WARPS, GATE_UP_MIN_BLOCKS)
#else
#define GATE_UP_LB __launch_bounds__(32 * MV_WARPS)
#endif
#if defined(DOWN_MIN_BLOCKS) && DOWN_MIN_BLOCKS > 1
#define DOWN_LB __launch_bounds__(32 * MV_WARPS, DOWN_MIN_BLOCKS)
#else
#define DOWN_LB __launch_bounds__(32 * MV_WARPS)
#endif
// moe_down_q's bounds per type (DOWN_LB_<name>): DOWN_LB, except that Q4_K's is compiled for
// six blocks per SM unless DOWN_MIN_BLOCKS is given. Uncapped it took 126 registers (four
// blocks, 16 warps per SM: S 2.1's 3,072 rows in 1.45 waves); for six it takes 80 and spilled
// 76 bytes (one wave; no spill since the four-lane pieces, moe_down_pairs). Measured on the H200, S 2.1 Q4_K_M tg64 interleaved in one call:
// 263.9 / 266.0 t/s uncapped, 275.7 / 280.9 capped (+5%); capping the gate/up kernel too (116
// -> 90 registers, five blocks) gave 269.0 / 270.5 alone and 274.0 with the down cap.
#if defined(DOWN_MIN_BLOCKS)
#define DOWN_LB_q4_K DOWN_LB
#else
#define DOWN_LB_q4_K __launch_bounds__(32 * MV_WARPS, 6)
#endif
#define DOWN_LB_q8_0 DOWN_LB
#define DOWN_LB_q6_K DOWN_LB
#define DOWN_LB_ct4 DOWN_LB
#define DOWN_LB_iq3_xxs DOWN_LB
#define DOWN_LB_iq2_xxs DOWN_LB
#define DOWN_LB_iq2_s DOWN_LB
#define DOWN_LB_q5_K DOWN_LB
#define DOWN_LB_iq4_xs DOWN_LB
#define DOWN_LB_ct8 DOWN_LB

// Up to MV_MATS products of one input: out_m[r] = W_m[r] . a (+ res_m[r] when res_m is not
// null: a residual add fused in, as `res + y`). The matrices' rows are laid end to end over
// the grid: ceil(sum rows / MV_WARPS) blocks of 32 * MV_WARPS, one warp per row.
struct MvMats {
    const u8* W[MV_MATS];
    u64 row_bytes[MV_MATS];
    float* out[MV_MATS];
    const float* res[MV_MATS];
    int rows[MV_MATS];
};

// The warp's row of a multi-matrix mat-vec launch: which matrix i the block-row index falls
// in (returned) and the row r within it, with the table read by constant index only (a loop
// over m.rows[i] put MvMats in local memory: a 144-byte stack frame); mv_at reads an entry
// the same way. r >= mv_at(m.rows, i): past the last matrix's rows.
__device__ __forceinline__ int mv_row(const MvMats& m, int n_mats, int* row) {
    int r = blockIdx.x * MV_WARPS + threadIdx.x / 32;
    int i = 0;
    if (n_mats > 1 && r >= m.rows[0]) {
        r -= m.rows[0];
        i = 1;
        if (n_mats > 2 && r >= m.rows[1]) {
            r -= m.rows[1];
            i = 2;
            if (n_mats > 3 && r >= m.rows[2]) {
                r -= m.rows[2];
                i = 3;
            }
        }
    }
    *row = r;
    return i;
}
// (The element type is Elem, not a one-letter name: a lab define such as X=0 would replace it.)
template <class Elem>
__device__ __forceinline__ Elem mv_at(const Elem (&a)[MV_MATS], int i) {
    return i == 0 ? a[0] : i == 1 ? a[1] : i == 2 ? a[2] : a[3];
}

// H_ROWS=2 (lab switch read by the host, manifest.rs mv_rows_per_warp; default 1, not yet
// measured): the one-token float mat-vecs `mv_bf16` / `mv_f16` (mv_multi) and the Q/K/V/gate
// `mv_rinv_bf16` / `mv_rinv_f16` (mv_rinv_multi) give each warp two consecutive rows r, r + 1
// of one matrix instead of one row (lane_parts_h with R = 2, H_ROWS_BATCH pieces a row in
// flight, 3 by default: as many loads as H_BATCH's 6 for one row), so each piece's f32
// activation (two float4s from L1 per 8 weights) is read once for both rows. Why: these
// products are bound by their per-element L1 work, not by their weight bytes (MV_NORM_FUSE
// below); with H_MEMONLY=1 (the activation reads and FMAs dropped, the weight loads kept) S
// 2.1 W4A16 tg64 ran 286.71 / 286.65 t/s against 270.83 / 270.85 (session 43, H200), and
// this halves the activation reads. Pairs are counted per matrix, (rows + 1) / 2 of them, so
// a pair never straddles two matrices; an odd matrix's last pair has one row (its warp loads
// that row twice and writes one output). Grid ceil(sum of the pairs / MV_WARPS). Each row's
// sum has the one-row kernel's terms in its order (lane pieces lane, lane + 32, ... against
// one accumulator, then warp_sum), so the outputs are H_ROWS=1's bit for bit. The O
// projection (mv_stage), mv_norm_* and the other float loops keep one row a warp.
#ifndef H_ROWS
#define H_ROWS 1
#endif
#if H_ROWS != 1 && H_ROWS != 2
#error "H_ROWS must be 1 or 2"
#endif
#ifndef H_ROWS_BATCH
#define H_ROWS_BATCH 3
#endif

#if H_ROWS > 1
// mv_row for H_ROWS = 2: which matrix i the warp's row pair falls in (returned) and the
// pair's first row r within it, the pairs counted per matrix ((rows + 1) / 2 each). r >=
// mv_at(m.rows, i): past the last matrix's rows; r + 1 == mv_at(m.rows, i): a pair of one row.
__device__ __forceinline__ int mv_row_pair(const MvMats& m, int n_mats, int* row) {
    int q = blockIdx.x * MV_WARPS + threadIdx.x / 32;
    int i = 0;
    int p = (m.rows[0] + 1) / 2;
    if (n_mats > 1 && q >= p) {
        q -= p;
        i = 1;
        p = (m.rows[1] + 1) / 2;
        if (n_mats > 2 && q >= p) {
            q -= p;
            i = 2;
            p = (m.rows[2] + 1) / 2;
            if (n_mats > 3 && q >= p) {
                q -= p;
                i = 3;
            }
        }
    }
    *row = 2 * q;
    return i;
}

// The lane's shares of rows r and r + 1 of matrix i (a lone row r twice when r + 1 is past
// the matrix), its first loads issued before the kernel's pdl_wait (lane_part_waiting's).
template <int T>
__device__ __forceinline__ void mv_pair_parts(const MvMats& m, int i, int r, bool two, const u8* __restrict__ a,
                                              int cols, float acc[2], AfterWait* aw) {
    const u8* W = mv_at(m.W, i);
    u64 rb = mv_at(m.row_bytes, i);
    const u8* rows[2] = {W + (size_t)r * rb, W + (size_t)(two ? r + 1 : r) * rb};
    lane_parts_h<T, 2, 1, H_ROWS_BATCH, true>(rows, a, cols, 0, acc, aw);
}

// mv_multi of float weights under H_ROWS = 2. The residuals: lane 0 reads row r's, lane 1
// row r + 1's (warp_sum leaves every lane the same bits), each writing its row.
template <int T>
__device__ void mv_multi_pair(const MvMats& m, int n_mats, const u8* __restrict__ a, int cols) {
    pdl_trigger();
    int r;
    int i = mv_row_pair(m, n_mats, &r);
    int n = mv_at(m.rows, i);
    if (r >= n) return;
    int lane = threadIdx.x & 31;
    bool two = r + 1 < n;
    float* out = mv_at(m.out, i);
    const float* res = mv_at(m.res, i);
    AfterWait aw = {res && (lane == 0 || (lane == 1 && two)) ? res + r + lane : nullptr, 0.0f};
    float acc[2];
    mv_pair_parts<T>(m, i, r, two, a, cols, acc, &aw);
    float y0 = warp_sum(acc[0]), y1 = warp_sum(acc[1]);
    if (lane == 0) out[r] = res ? __fadd_rn(aw.v, y0) : y0;
    if (lane == 1 && two) out[r + 1] = res ? __fadd_rn(aw.v, y1) : y1;
}
#endif

// U != T (mv2_*): the first n_t products are of type T, the rest of type U (both paired with
// the same activation format), so a run such as Q4_K_M's Q4_K Q/K/gate with its Q6_K value
// projection is one launch instead of two: the short V product (~2.6 MB on S 2.1) had a whole
// kernel's ramp and tail to itself (~5 µs, its bytes ~0.6 µs of the read floor). Each warp's
// row is of one type, so the branch is warp-uniform, and each row's terms are those of the
// single-type kernel (bitwise the same outputs).
template <int T, int U = T>
__device__ void mv_multi(const MvMats& m, int n_mats, const u8* __restrict__ aq, int cols, int n_t = MV_MATS) {
#if H_ROWS > 1
    if constexpr (T == U && (T == WT_BF16 || T == WT_F16)) {
        mv_multi_pair<T>(m, n_mats, aq, cols);
        return;
    }
#endif
    pdl_trigger();
    int r;
    int i = mv_row(m, n_mats, &r);
    if (r >= mv_at(m.rows, i)) return;
    const u8* W = mv_at(m.W, i);
    u64 rb = mv_at(m.row_bytes, i);
    // No L2 prefetch of the row before pdl_wait (measured on the full S 2.1 decode with it,
    // 194.6 t/s against 196.2 without, interleaved runs); the lane's first weight loads are
    // issued before it instead (lane_part_waiting).
    float* out = mv_at(m.out, i);
    const float* res = mv_at(m.res, i);
    // The residual is read as soon as the wait is over (AfterWait), not after the reduction.
    AfterWait aw = {res && (threadIdx.x & 31) == 0 ? res + r : nullptr, 0.0f};
    float part;
    if constexpr (T == U) part = lane_part_waiting<T>(W + (size_t)r * rb, aq, cols, &aw);
    else part = i < n_t ? lane_part_waiting<T>(W + (size_t)r * rb, aq, cols, &aw)
                        : lane_part_waiting<U>(W + (size_t)r * rb, aq, cols, &aw);
    float y = warp_sum(part);
    if ((threadIdx.x & 31) == 0) out[r] = res ? __fadd_rn(aw.v, y) : y;
}

// The staged float mat-vec's ring (mv_stage): MV_STAGE_GROUPS groups of MV_STAGE_GROUP
// pieces a lane in shared memory, 512 bytes a piece a warp, four warps a block (2 x 2: 8 KiB
// a block). Measured on the H200 (S 2.1 W4A16 tg64, session 30; the plain mv_bf16 248.9
// t/s): 2 x 2 259.8-259.9 (four runs), 4 x 2 257.9, 2 x 4 256.3, 4 x 4 253.1, 1 x 2 / 1 x 3 /
// 1 x 4 249.8-251.0, and a first form without the ring (16 pieces copied before the wait,
// the rest in batches of H_BATCH) 251.4. The likely reason larger rings lose (not
// measured): their shared memory is carved from the SM's L1, which the activation row (36
// KiB at 9216 wide, read twice per weight byte by every warp) then no longer fits.
#ifndef MV_STAGE_GROUP
#define MV_STAGE_GROUP 2
#endif
#ifndef MV_STAGE_GROUPS
#define MV_STAGE_GROUPS 2
#endif
// Least blocks per SM mv_stage is compiled for (its register cap): uncapped it took 96
// registers, five blocks per SM, 660 resident blocks for the O projection's 768 (capped: 80).
#ifndef MV_STAGE_BLOCKS
#define MV_STAGE_BLOCKS 6
#endif

// mv_multi for float weights with more of each row requested before pdl_wait and the rest
// streamed through a ring in shared memory: the lane's first H_BATCH pieces into registers
// (as lane_parts_h) and the next MV_STAGE_GROUPS groups of MV_STAGE_GROUP pieces into the
// ring by cp.async, all before the wait; after it, each group as it lands is added and its
// slot refilled with the group MV_STAGE_GROUPS further on, so the lane always has the ring's
// pieces in flight where lane_parts_h waits a whole round trip per batch of H_BATCH. Why: HBM
// idles through the attention kernels, and the O projection (rows of 9216: 36 pieces a lane,
// 4.5 such round trips) then streamed its 56.6 MB at ~3.7 TB/s on the critical path
// (BENCHMARKS.md, "Session 28"). The lane adds its pieces in lane_parts_h's order (registers,
// then the ring's groups in row order, one accumulator), so the outputs are mv_multi's bit
// for bit. Each lane reads back only the pieces it copied, so its own cp.async waits order
// them (an empty group is still committed, keeping the count the waits rely on). Grid and
// arguments as mv_multi's; rows 16-byte aligned, cols % 8 == 0.
template <int T>
__device__ void mv_stage(const MvMats& m, int n_mats, const float* __restrict__ x, int cols) {
    constexpr int G = MV_STAGE_GROUP, NG = MV_STAGE_GROUPS;
    __shared__ uint4 st[MV_WARPS][NG * G][32];
    pdl_trigger();
    int r;
    int i = mv_row(m, n_mats, &r);
    if (r >= mv_at(m.rows, i)) return;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint4* w4 = (const uint4*)(mv_at(m.W, i) + (size_t)r * mv_at(m.row_bytes, i));
    float* out = mv_at(m.out, i);
    const float* res = mv_at(m.res, i);
    const float4* x4 = (const float4*)x;
    int n8 = cols / 8;
    uint4 wv[H_BATCH];
    #pragma unroll
    for (int u = 0; u < H_BATCH; u++) {
        int k = lane + 32 * u;
        if (k < n8) wv[u] = ldw4(w4 + k);
    }
    // Group g holds pieces lane + 32 (H_BATCH + G g + j), j < G, in slot g % NG.
    auto issue = [&](int g) {
        #pragma unroll
        for (int j = 0; j < G; j++) {
            int k = lane + 32 * (H_BATCH + G * g + j);
            if (k < n8) cp_async16(&st[warp][G * (g % NG) + j][lane], w4 + k);
        }
        cp_async_commit();
    };
    #pragma unroll
    for (int g = 0; g < NG; g++) issue(g);
    AfterWait aw = {res && lane == 0 ? res + r : nullptr, 0.0f};
    warp_pdl_wait(&aw);
    float acc = 0.0f;
    #pragma unroll
    for (int u = 0; u < H_BATCH; u++) {
        int k = lane + 32 * u;
        if (k < n8) acc = h_dot8<T>(wv[u], x4[2 * k], x4[2 * k + 1], acc);
    }
    for (int g = 0; lane + 32 * (H_BATCH + G * g) < n8; g++) {
        cp_async_wait<NG - 1>();
        #pragma unroll
        for (int j = 0; j < G; j++) {
            int k = lane + 32 * (H_BATCH + G * g + j);
            if (k < n8) acc = h_dot8<T>(st[warp][G * (g % NG) + j][lane], x4[2 * k], x4[2 * k + 1], acc);
        }
        issue(g + NG);
    }
    float y = warp_sum(acc);
    if (lane == 0) out[r] = res ? __fadd_rn(aw.v, y) : y;
}

// MV_NORM_FUSE (lab switch read by the host, fused.rs; off: measured 8% slower): a run of float
// products whose input is an RMSNorm's output read by nothing else (a W4A16 checkpoint's
// bf16 Q/K/V/gate after the attention norm) takes the norm's input x and gain g instead, and
// each warp computes its row as (1 / rms(x)) · (W[r] . (g ∘ x)), the sum of squares taken
// from the x pieces it reads anyway: the one-block norm launch (rms_norm_row) goes. Why: on
// the replayed W4A16 step that launch holds 5.7-5.9 µs of the critical path (BENCHMARKS.md,
// "Session 28"), against ~2 µs of its own work in the lab (session 25). Measured (session 29,
// S 2.1 W4A16 tg64, alternating, two rounds): 228.10 / 228.19 t/s against 248.74 / 248.77,
// ~7.6 µs a layer slower although a 5.7 µs launch went: every row's warp now also reads g and
// does two more operations per element, and these products are bound by their per-element
// work from L1, not by their weight bytes, so ~13 µs were added to them. The rounding differs
// from the norm then the product (g·(x·r) rounded per element there): within the float
// path's bounds, not bitwise. Grid and arguments as mv_multi's, then g and eps.
template <int T>
__device__ void mv_norm_multi(const MvMats& m, int n_mats, const float* __restrict__ x, int cols,
                              const float* __restrict__ g, float eps) {
    pdl_trigger();
    int r;
    int i = mv_row(m, n_mats, &r);
    if (r >= mv_at(m.rows, i)) return;
    const u8* rows[1] = {mv_at(m.W, i) + (size_t)r * mv_at(m.row_bytes, i)};
    float acc[1], sq;
    lane_parts_h<T, 1, 1, H_BATCH, true, true>(rows, (const u8*)x, cols, 0, acc, nullptr, g, &sq);
    float y = warp_sum(acc[0]);
    float ss = warp_sum(sq);
    if ((threadIdx.x & 31) == 0) mv_at(m.out, i)[r] = y * (1.0f / sqrtf(ss / (float)cols + eps));
}

// NORM_EPI (CudaSessionOptions::norm_epilogue, LAGOON_CUDA_NORM_EPI): the RMSNorm before a run of float
// products (a W4A16 checkpoint's bf16 Q/K/V/gate after the attention norm) split between
// the launch that wrote its input and the products, so the one-block norm launch
// (rms_norm_row, ~6 µs of a W4A16 layer's critical path in session 29's timeline) goes
// without adding per-element work to the products (what sank mv_norm_multi above): the
// expert down kernel that writes the residual x also writes gx = g ∘ x and, per block, the
// sum of its rows' x² (moe_down_q's epilogue); here the products read gx as their input,
// and each block adds the down kernel's n_part partial sums (its warps a quarter each, in a
// fixed order, so every block gets the same total) into r = 1 / sqrt(ss / cols + eps):
// out[r] = (W[r] . gx) · r, where the unfused path rounds g·(x·r) per element before the
// dot: within the float path's bounds, not bitwise. The partial sums are requested right
// after the wait (AfterWait's q) and added at the end. n_part <= 4 · 64 · MV_WARPS and
// n_part % (4 · MV_WARPS) == 0 (the host checks). Grid and arguments as mv_multi's, then
// part, n_part and eps; no warp leaves before the block's barrier. Measured on the H200 (S
// 2.1 W4A16 tg64, session 33, alternating, two rounds): 261.96 / 261.96 t/s against 260.62 /
// 260.54 with the launch (+0.5%, ~0.4 µs a layer of the ~6 µs the timeline gave the launch:
// the products' early weight loads kept the memory busy through most of it).
template <int T>
__device__ void mv_rinv_multi(const MvMats& m, int n_mats, const u8* __restrict__ gx, int cols,
                              const float* __restrict__ part, int n_part, float eps) {
    pdl_trigger();
    int r;
#if H_ROWS > 1
    // H_ROWS = 2: the warp's row pair (mv_multi_pair); lane 1 writes row r + 1.
    int i = mv_row_pair(m, n_mats, &r);
#else
    int i = mv_row(m, n_mats, &r);
#endif
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int slice = n_part / MV_WARPS;
    AfterWait aw = {nullptr, 0.0f, (const float4*)(part + warp * slice), slice / 4};
    bool live = r < mv_at(m.rows, i);
    float y = 0.0f;
#if H_ROWS > 1
    bool two = r + 1 < mv_at(m.rows, i);
    float y1 = 0.0f;
    if (live) {
        float acc[2];
        mv_pair_parts<T>(m, i, r, two, gx, cols, acc, &aw);
        y = warp_sum(acc[0]);
        y1 = warp_sum(acc[1]);
    } else {
        warp_pdl_wait(&aw);
    }
#else
    if (live) {
        const u8* W = mv_at(m.W, i);
        u64 rb = mv_at(m.row_bytes, i);
        y = warp_sum(lane_part_waiting<T>(W + (size_t)r * rb, gx, cols, &aw));
    } else {
        warp_pdl_wait(&aw);
    }
#endif
    float s = ((aw.q0.x + aw.q0.y) + (aw.q0.z + aw.q0.w)) + ((aw.q1.x + aw.q1.y) + (aw.q1.z + aw.q1.w));
    s = warp_sum(s);
    __shared__ float ws[MV_WARPS];
    if (lane == 0) ws[warp] = s;
    __syncthreads();
    float ss = 0.0f;
    #pragma unroll
    for (int k = 0; k < MV_WARPS; k++) ss += ws[k];
    float rinv = 1.0f / sqrtf(ss / (float)cols + eps);
    if (live && lane == 0) mv_at(m.out, i)[r] = y * rinv;
#if H_ROWS > 1
    if (two && lane == 1) mv_at(m.out, i)[r + 1] = y1 * rinv;
#endif
}

// act[r] = silu(Wg[r] . a) * (Wu[r] . a): a SwiGLU MLP's gate and up with the activation
// fused (dense layers, the shared expert). Grid ceil(rows / MV_WARPS).
template <int T>
__device__ void mv_swiglu(const u8* __restrict__ Wg, const u8* __restrict__ Wu, u64 row_bytes,
                          const u8* __restrict__ aq, float* __restrict__ act, int rows, int cols) {
    pdl_trigger();
    int r = blockIdx.x * MV_WARPS + threadIdx.x / 32;
    if (r >= rows) return;
    if ((threadIdx.x & 31) == 0) {
        prefetch_l2(Wg + (size_t)r * row_bytes, row_bytes);
        prefetch_l2(Wu + (size_t)r * row_bytes, row_bytes);
    }
    pdl_wait();
    float2 gu = warp_dot2_q<T>(Wg + (size_t)r * row_bytes, Wu + (size_t)r * row_bytes, aq, cols);
    if ((threadIdx.x & 31) == 0) act[r] = silu_f(gu.x) * gu.y;
}

// mv_swiglu for float weights with the row split over the block's MV_WARPS warps
// (warp_parts2_h). Grid rows (one block per row).
template <int T>
__device__ void mv_swiglu_split(const u8* __restrict__ Wg, const u8* __restrict__ Wu, u64 row_bytes,
                                const u8* __restrict__ aq, float* __restrict__ act, int rows, int cols) {
    pdl_trigger();
    int r = blockIdx.x;
    if (r >= rows) return;
    // pdl_wait after the first weight loads (lane_part_waiting's reason).
    float2 gu = warp_parts2_h<T, MV_WARPS, true>(Wg + (size_t)r * row_bytes, Wu + (size_t)r * row_bytes, aq, cols,
                                                 threadIdx.x >> 5);
    __shared__ float2 part[MV_WARPS];
    int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) part[warp] = gu;
    __syncthreads();
    if (threadIdx.x == 0) {
        float g = 0.0f, u = 0.0f;
        #pragma unroll
        for (int k = 0; k < MV_WARPS; k++) {
            g += part[k].x;
            u += part[k].y;
        }
        act[r] = silu_f(g) * u;
    }
}

// out[r] = W[r] . x for a short float matrix: one block per row, its MV_WARPS warps each
// taking a strided quarter of the row (lane_part_h_split), the warps' sums added in shared
// memory. For matrices of too few rows to fill the device one warp per row (S 2.1's router,
// 256 × 3072 bf16: mv_bf16 gave 64 blocks for 132 SMs and took 4.05 µs, two dependent rounds
// of loads per warp; BENCHMARKS.md "Session 13 on the H200"). Grid rows.
template <int T>
__device__ void mv_split(const u8* __restrict__ W, u64 row_bytes, const float* __restrict__ x,
                         float* __restrict__ out, int rows, int cols) {
    pdl_trigger();
    int r = blockIdx.x;
    if (r >= rows) return;
    int warp = threadIdx.x >> 5;
    float y = warp_sum(lane_part_h_split<T, MV_WARPS, true>(W + (size_t)r * row_bytes, (const u8*)x, cols, warp));
    __shared__ float part[MV_WARPS];
    if ((threadIdx.x & 31) == 0) part[warp] = y;
    __syncthreads();
    if (threadIdx.x == 0) {
        float v = 0.0f;
        #pragma unroll
        for (int k = 0; k < MV_WARPS; k++) v += part[k];
        out[r] = v;
    }
}

// act[k, r] = silu(gate_e[r] . x) * (up_e[r] . x) for slot k < K of the (single) token,
// e = ids[k]; slot K, when the grid has K + 1 rows of blocks, is the shared expert (Sg, Su).
// Grid (ceil(I / MV_WARPS), K or K + 1). The first block of slot 0 copies ids and weights to
// route_copy[0 .. 2K) for moe_down_q, and the slots in (id, slot) order to [2K, 3K): their
// arena slots may be reused by the values the down kernel writes. (Asking L2 here for the slots' down rows, for moe_down_q to find them
// there, was measured on the H200 and dropped: this kernel then moved 68 MB instead of 39 at
// 65% of DRAM bandwidth while the down kernel, its reads all L2 hits, stayed latency-bound;
// S 2.1 decode 166.7 -> 171.8 t/s without it, interleaved runs.)
// S != T (moe_gate_up_mixed): the shared expert's gate and up are float matrices of si rows
// (srow bytes each) read against the f32 input xf, slot K's blocks taking warp_parts2_h's
// loop; the grid then covers max(I, si) rows.
// The shared expert is grid row 0, so its blocks are scheduled first. early != 0: the host
// launched this kernel right after one that waits before it triggers (route_block, a
// PDL_ENTRY kernel), so when this kernel starts everything before that kernel has finished
// -- among it the norm that wrote x -- and the shared expert's blocks do their whole work
// before pdl_wait, while the routing still runs (only the routed slots need ids).
// The Q4_K expert gate/up on warp_gate_up_q4k_rows (rows of at most 4 · Q4K_BATCH
// super-blocks): each warp's activation pieces requested together into registers before its
// row pair is computed. Measured on the H200 (session 27): lab (kernel_lab, S 2.1 shape)
// 14.7 µs against 15.8 for warp_dot2_q's pair loop (which re-reads the pieces per row as it
// computes), the same output bits; S 2.1 Q4_K_M tg64 alternating, two rounds: 313.44 /
// 313.20 t/s against 308.57 / 308.52 (+1.5%). Lab switches: GU_Q4K_ROWS=0 keeps warp_dot2_q; GU_Q4K_RPW=N gives each warp N row
// pairs (the host reads it too, manifest::gate_up_blocks); GU_Q4K_PIPE=1 requests a warp's
// next pair's weights before computing the current one. Lab: RPW 2 / 4 16.6 / 20.6 µs,
// piped 15.4 / 19.1 (fewer warps for the same occupancy); S 2.1 Q4_K_M tg64 (alternating,
// two rounds, RPW 1 on warp_dot2_q 307.3 / 307.4 t/s): RPW 2 301.6 / 301.3, RPW 4 285.9 /
// 285.8, RPW 2 piped 309.9 / 309.6, RPW 4 piped 289.8 / 290.0.
#ifndef GU_Q4K_ROWS
#define GU_Q4K_ROWS 1
#endif
#ifndef GU_Q4K_RPW
#define GU_Q4K_RPW 1
#endif
#ifndef GU_Q4K_PIPE
#define GU_Q4K_PIPE 0
#endif
// QOUT (moe_gate_up_mixed_q8_*, clusters of GU_CLUSTER blocks along x): the routed slots'
// activations are also written Q8_0-quantised to actq (row k at k · astride, act.cuh's
// layout), so no quantiser launch sits between this kernel and the down kernel. A cluster's
// GU_CLUSTER · MV_WARPS warps hold one 32-row group of one slot (the host checks I % 32 == 0,
// so a cluster's rows are all below I or all past it); after the cluster's barrier, the first
// warp of its first block quantises the group as quantize_q8_0 does (the same bits). The
// shared expert's slot stays f32 (its down reads it so) and takes no barrier (its clusters
// are grid row 0 only). Correct (the same bits as the quantiser launch) but not faster, so
// opt-in (CudaSessionOptions::gate_up_q8). Measured on the H200 (session 37, S 2.1 W4A16
// tg64, alternating in one call, two rounds): 260.18 / 260.18 t/s against 261.14 / 260.94
// with the quantiser launch. The replayed step's trace puts this kernel at 20.6 µs of the
// critical path a layer against 16.5 for moe_gate_up_mixed: the quantiser's ~6 µs goes, but
// the clustered grid and its last warps (barrier, L2 read, quantise) give back most of it,
// and the late down kernel loses its early loads and computes the shared term after its wait.
// Lab switch GU_ARRIVE_ONLY=0: every warp of the cluster waits at the barrier (257.63 /
// 257.70 t/s); by default only the quantising warp waits and the others arrive and exit.
#define GU_CLUSTER 8
#ifndef GU_ARRIVE_ONLY
#define GU_ARRIVE_ONLY 1
#endif
template <int T, int S = T, bool QOUT = false>
__device__ void moe_gate_up_q(const u8* __restrict__ Wg, const u8* __restrict__ Wu, u64 expert_bytes,
                              u64 row_bytes, const u8* __restrict__ Sg, const u8* __restrict__ Su,
                              const u8* __restrict__ xq, const float* __restrict__ ids,
                              const float* __restrict__ weights, float* __restrict__ route_copy,
                              float* __restrict__ act, int I, int H, int K, int early, u64 srow = 0,
                              const float* __restrict__ xf = nullptr, int si = 0, u8* __restrict__ actq = nullptr,
                              u64 astride = 0) {
    static_assert(!QOUT || GU_CLUSTER * MV_WARPS == QK, "a cluster's rows are one Q8_0 group");
    pdl_trigger();
    // Q4_K rows of at most 4 · Q4K_BATCH super-blocks: GU_Q4K_RPW row pairs per warp
    // (warp_gate_up_q4k_rows), the host's grid divided by it (gate_up_rows_per_warp).
    constexpr bool ROWS = T == WT_Q4_K && S == T && GU_Q4K_ROWS;
    bool rows_path = ROWS && H <= 4 * Q4K_BATCH * QK_K;
    int r = (blockIdx.x * MV_WARPS + threadIdx.x / 32) * (rows_path ? GU_Q4K_RPW : 1);
    int k = gridDim.y > (unsigned)K ? (blockIdx.y == 0 ? K : (int)blockIdx.y - 1) : (int)blockIdx.y;
    if (k == K) {
        u64 sb = S == T ? row_bytes : srow;
        int rows = S != T ? si : I;
        if (!early) {
            if (r < rows && (threadIdx.x & 31) == 0) {
                prefetch_l2(Sg + (size_t)r * sb, sb);
                prefetch_l2(Su + (size_t)r * sb, sb);
            }
            pdl_wait();
        }
        if (r >= rows) return;
        if constexpr (ROWS) {
            if (rows_path) {
                warp_gate_up_q4k_rows<GU_Q4K_RPW, GU_Q4K_PIPE>(Sg, Su, row_bytes, r, I, xq, H, act + (size_t)K * I);
                return;
            }
        }
        float2 gu;
        if constexpr (S != T) gu = warp_parts2_h<S, 1>(Sg + (size_t)r * srow, Su + (size_t)r * srow, (const u8*)xf, H, 0);
        else gu = warp_dot2_q<T>(Sg + (size_t)r * row_bytes, Su + (size_t)r * row_bytes, xq, H);
        if ((threadIdx.x & 31) == 0) act[(size_t)K * I + r] = silu_f(gu.x) * gu.y;
        return;
    }
    pdl_wait();
    if (blockIdx.x == 0 && k == 0 && threadIdx.x < K) {
        int t = threadIdx.x;
        route_copy[t] = ids[t];
        route_copy[K + t] = weights[t];
        // The slots in ascending (id, slot) order (moe_combine's), for the down kernels:
        // slot t at its rank, route_copy[2K + rank]. (Ranked here once per token instead of
        // by every warp of the down kernel: a K-step loop of loads and K ballots each.)
        u32 mine = __float_as_uint(ids[t]);
        int rank = 0;
        for (int j = 0; j < K; j++) {
            u32 o = __float_as_uint(ids[j]);
            rank += (o < mine || (o == mine && j < t)) ? 1 : 0;
        }
        route_copy[2 * K + rank] = __int_as_float(t);
    }
    if (r >= I) return;
    if constexpr (ROWS) {
        if (rows_path) {
            size_t e = (size_t)__float_as_uint(ids[k]) * expert_bytes;
            warp_gate_up_q4k_rows<GU_Q4K_RPW, GU_Q4K_PIPE>(Wg + e, Wu + e, row_bytes, r, I, xq, H, act + (size_t)k * I);
            return;
        }
    }
    size_t off = (size_t)__float_as_uint(ids[k]) * expert_bytes + (size_t)r * row_bytes;
    float2 gu = warp_dot2_q<T>(Wg + off, Wu + off, xq, H);
    if ((threadIdx.x & 31) == 0) act[(size_t)k * I + r] = silu_f(gu.x) * gu.y;
    if constexpr (QOUT) {
        // The quantising warp: the first of the cluster's first block.
        bool q = blockIdx.x % GU_CLUSTER == 0 && threadIdx.x < 32;
        if (GU_ARRIVE_ONLY) {
            // Only it waits; the rest arrive and leave (the wait counts the cluster's threads
            // that have not exited).
            cluster_arrive();
            if (!q) return;
            cluster_wait();
        } else {
            cluster_sync();
        }
        if (q) {
            int b = r / QK;
            group_quantize_q8_0<true>(act + (size_t)k * I + (size_t)b * QK, actq + (size_t)k * astride, I, b,
                                      threadIdx.x < 8);
        }
    }
}

// moe_down_q's rows when each lane has at most one piece of an expert row (S 2.1's experts,
// I <= 1024): the pieces of DOWN_BATCH experts' rows (and the shared expert's, fetched first)
// are loaded before any is computed, so a warp has ~3.5 KB in flight instead of one row's
// few hundred bytes. Same terms in the same order as the generic loop. F is the format's
// lane piece (DownQ4k: eight lanes per 144-byte super-block, one super-block each;
// DownCt4: one 20-byte block per lane): on (the lane has a piece), load, part (its term).
// Lab switch. DOWN_BATCH=10 (S 2.1's ten routed rows in one round) measured slower on the
// H200 (session 26, W4A16 tg64 alternating: 224.3 / 224.4 t/s against 245.6 / 245.6): 88
// registers for the CT4 kernel instead of 64, five blocks per SM, so the 768 blocks take
// 1.16 waves instead of 0.73; capped at six blocks (DOWN_MIN_BLOCKS=6, 80 registers and a
// small spill) 242.8 / 242.8. Session 39 (S 2.1 W4A16 tg64, alternating, two rounds in one
// call, H_BATCH 6 in both): 4 (three rounds for ten routed rows, 72 registers) 268.16 / 268.23
// against 6 (two rounds, 68 registers) 263.55 / 263.31 (+1.8%; a sweep in the call before
// found 8 slower, 259.3 against 260.7). Same occupancy (seven blocks per SM), so not the
// registers. Session 40 (same bench, alternating, two rounds in each of three calls on one
// machine, floor ~4,600 GB/s): 2 (five rounds) 270.83 / 270.81 and 271.01 / 270.81 against 4's
// 268.32 / 268.35 and 268.32 / 268.40 (+0.9%); 3 268.9-269.0 (+0.2%); 1 266.6-266.7 (-0.6%);
// DOWN_EARLY=0 265.1-265.2 (-1.2%); ptxas gives the CT4 down 72 registers at every size from
// 1 to 4 (68 at 6; seven blocks per SM at all), so the gain is the schedule, not occupancy.
// A lab with a first round of its own size (DOWN_BATCH0; the loop peeled): 2 then 4s 269.1
// against 4 then 4s 266.2 (the peeled form itself -0.8% against the loop), so a smaller batch
// before the wait does help, as session 39 guessed, but the later rounds want small batches
// too (2 then 3s 266.7, 2 then 8s 261.4): not kept. Q4_K_M's down takes moe_down_pairs, not
// this batch (DOWN_Q4K_PAIR_BATCH).
#ifndef DOWN_BATCH
#define DOWN_BATCH 2
#endif
// moe_down_q's short-row paths issue their first batch of routed weight loads before
// pdl_wait (see moe_down_q); DOWN_EARLY=0 (LAGOON_CUDA_DEFINES) waits first. Measured on the
// H200, S 2.1 tg64, alternating in one call (session 25): Q4_K_M 297.58 / 297.60 t/s against
// 296.71 / 296.84 (+0.3%), W4A16 238.90 / 238.80 against 238.81 / 238.68 (the same within
// noise). Predicted ~2.5% (the quantiser's 2-4 µs window before the wait): the first batch
// is a small part of a row's loads, so most of the window goes unused.
#ifndef DOWN_EARLY
#define DOWN_EARLY 1
#endif
// The same for Q6_K rows (DownQ6k), or 0 (the default) for the generic loop (lane_part_q).
// Measured slower on the H200 (S 2.1 Q4_K_M tg64, interleaved in one call: the loop 264.8 /
// 266.4 t/s; batches of 2, 4, 6 at 258.0, 257.6 / 256.1, 257.0; 128-168 registers against
// the loop's 80, so 16 or fewer warps per SM instead of 24). A lab switch:
// LAGOON_CUDA_DEFINES=DOWN_Q6K_BATCH=N.
#ifndef DOWN_Q6K_BATCH
#define DOWN_Q6K_BATCH 0
#endif
// Pieces of a float shared expert's down row held from before the wait (moe_down_q): S 2.1's
// 1024-wide bf16 row is four per lane.
#define DOWN_SHARED_BATCH 4
struct DownQ4k {
    Q4kLoad l;
    static __device__ __forceinline__ bool on(int lane, int I) { return (lane >> 3) < I / QK_K; }
    static __device__ __forceinline__ int blocks(int I) { return I / QK_K; }
    __device__ __forceinline__ void load(const u8* __restrict__ row, int lane) {
        l = q4k_load(row + (size_t)(lane >> 3) * 144, lane & 7);
    }
    __device__ __forceinline__ float part(const u8* __restrict__ a, int lane, int I, int) const {
        int b = lane >> 3;
        return q4k_acc(0.0f, l, lane & 7, a + (size_t)b * QK_K, q8k_bsums(a, I) + 16 * b, q8k_d(a, I)[b]);
    }
};
struct DownCt4 {
    u32 w[5];
    static __device__ __forceinline__ bool on(int lane, int I) { return lane < I / QK; }
    static __device__ __forceinline__ int blocks(int I) { return I / QK; }
    __device__ __forceinline__ void load(const u8* __restrict__ row, int lane) {
        ct_fetch<5>(row, lane, w);
    }
    __device__ __forceinline__ float part(const u8* __restrict__ a, int lane, int I, int nb) const {
        return __fadd_rn(0.0f, ct4_block_dot(w, a + (size_t)lane * QK, q8_0_d(a, I)[lane], q8_0_d(a, I)[nb + lane]));
    }
};

// DownQ6k: a Q6_K expert row's lane piece when each lane has at most one (I <= 4 QK_K):
// q6k_part's ql and qh windows (five aligned words each, funnel-shifted in part) and its two
// scale bytes, fetched before any piece is computed.
struct DownQ6k {
    u32 ql[5], qh[5];
    u32 shl, shh;
    int s0, s1;
    float d;
    static __device__ __forceinline__ bool on(int lane, int I) { return (lane >> 3) < I / QK_K; }
    static __device__ __forceinline__ int blocks(int I) { return I / QK_K; }
    __device__ __forceinline__ void load(const u8* __restrict__ row, int lane) {
        const u8* blk = row + (size_t)(lane >> 3) * 210;
        int p = lane & 7, n = p >> 2, e = (p >> 1) & 1, h = p & 1;
        const u8* pl = blk + 64 * n + 32 * e + 16 * h;
        const u8* ph = blk + 128 + 32 * n + 16 * h;
        const u32* wl = (const u32*)((size_t)pl & ~(size_t)3);
        const u32* wh = (const u32*)((size_t)ph & ~(size_t)3);
        shl = 8u * (u32)((size_t)pl & 3);
        shh = 8u * (u32)((size_t)ph & 3);
        #pragma unroll
        for (int k = 0; k < 5; k++) {
            ql[k] = __ldg(wl + k);
            qh[k] = __ldg(wh + k);
        }
        int jlo = 8 * n + 2 * e + h;
        const signed char* sc = (const signed char*)(blk + 192);
        s0 = (int)__ldg(sc + jlo);
        s1 = (int)__ldg(sc + jlo + 4);
        d = f16_to_f32(__ldg((const unsigned short*)(blk + 208)));
    }
    // lane_part_q6k's term for this piece: (d_a·d)·sumi.
    __device__ __forceinline__ float part(const u8* __restrict__ a, int lane, int I, int) const {
        int b = lane >> 3, p = lane & 7, n = p >> 2, e = (p >> 1) & 1, h = p & 1;
        const u8* aq = a + (size_t)b * QK_K;
        const short* bs = q8k_bsums(a, I) + 16 * b;
        u32 lo[4], hi[4];
        #pragma unroll
        for (int k = 0; k < 4; k++) {
            u32 l = __funnelshift_r(ql[k], ql[k + 1], shl), q = __funnelshift_r(qh[k], qh[k + 1], shh);
            lo[k] = (l & 0x0F0F0F0Fu) | (((q >> (2 * e)) & 0x03030303u) << 4);
            hi[k] = ((l >> 4) & 0x0F0F0F0Fu) | (((q >> (2 * e + 4)) & 0x03030303u) << 4);
        }
        int jlo = 8 * n + 2 * e + h, jhi = jlo + 4;
        int4 alo = *(const int4*)(aq + 16 * jlo);
        int4 ahi = *(const int4*)(aq + 16 * jhi);
        int dlo = dp4a4(lo, alo, 0) - 32 * (int)bs[jlo];
        int dhi = dp4a4(hi, ahi, 0) - 32 * (int)bs[jhi];
        int sumi = s0 * dlo + s1 * dhi;
        return __fmul_rn(__fmul_rn(q8k_d(a, I)[b], d), (float)sumi);
    }
};

// The lane's share: scale · Σ_k weights[k] · part_k, plus the shared expert's part (Sd, its
// activation in row K of actq) when Sd is given.
// DOWN_ACT_STAGE=1 (lab switch, measured slower, off): the down paths of moe_down_q
// (moe_down_short, moe_down_pairs, the generic loop) copy the activation rows they read (K routed, and the
// shared one when it is of the kernel's type) into shared memory once per block right after
// their wait, so each entry's activation reads are shared-memory loads. Why: the SASS of
// moe_down_q_q4_K and moe_down_mixed_ct4_bf16 (cuda/dev/sass.sh) issues each entry's
// activation loads (16-byte windows of quants, d, and for CT4 d·Σq; L2 hits, the quantiser
// having just written them) just before that entry's dot: one dependent L2 round trip per
// entry, up to ten a row, in kernels ncu finds latency-bound (session 26: 0.73 waves, 62%
// of cycles without an eligible warp, W4A16). The gate/up's version of the same fix
// (warp_gate_up_q4k_rows) gained 7% in the lab (session 27). Rows of up to DOWN_ACT_SMEM
// bytes in all, 16-byte aligned (S 2.1: 11 × 1,168 bytes Q8_K, 10 × 1,280 Q8_0);
// otherwise the rows are read where they are.
// Measured on the H200 (session 28; device tests expert_down, quant_type_models, tiny_models,
// decode_graph_replay pass with it): S 2.1 tg64 alternating, two rounds, Q4_K_M 303.51 /
// 303.58 t/s against 312.42 / 312.80 (-2.9%), W4A16 244.81 / 244.74 against 248.44 / 248.41
// (-1.5%). Every warp of a block now waits at the barrier for the block's whole copy, where
// before each warp's first entry needed only its own activation loads, and the copy's
// round trip sits between the wait and the first dot either way.
#ifndef DOWN_ACT_STAGE
#define DOWN_ACT_STAGE 0
#endif
#define DOWN_ACT_SMEM 16384

// The block's copy of the `bytes` of activation rows at a: the live warps of a
// ceil(H / MV_WARPS) grid's block (rows below H; the others have returned) copy them with
// 16-byte cp.async and meet at a named barrier of their own (every live warp of the block
// takes the same path, the path depending only on the launch's T, I and K). Returns the
// copy, or a itself when the rows do not fit or are not 16-byte aligned (the same answer for
// every warp of the launch).
__device__ __forceinline__ const u8* stage_act_rows(const u8* __restrict__ a, u32 bytes, int H) {
    __shared__ __align__(16) u8 buf[DOWN_ACT_SMEM];
    if (bytes > DOWN_ACT_SMEM || (bytes & 15) || ((size_t)a & 15)) return a;
    u32 n = 32u * (u32)min(MV_WARPS, H - (int)blockIdx.x * MV_WARPS);
    for (u32 o = 16u * threadIdx.x; o < bytes; o += 16u * n) cp_async16(buf + o, a + o);
    cp_async_commit();
    cp_async_wait<0>();
    asm volatile("bar.sync 1, %0;" ::"r"(n) : "memory");
    return buf;
}

template <class F, int B = DOWN_BATCH, bool WAIT = false>
__device__ __forceinline__ float moe_down_short(const u8* __restrict__ Wd, u64 expert_bytes, u64 row_bytes,
                                                const u8* __restrict__ Sd, const u8* __restrict__ actq, u64 astride,
                                                const u32* __restrict__ id, const float* __restrict__ weights, int r,
                                                int I, int K, float scale, int order, int H) {
    int lane = threadIdx.x & 31;
    int nb = F::blocks(I);
    bool on = F::on(lane, I);
    F ls;
    if (Sd && on) ls.load(Sd + (size_t)r * row_bytes, lane);
    float acc = 0.0f;
    for (int s0 = 0; s0 < K; s0 += B) {
        F l[B];
        int ks[B];
        #pragma unroll
        for (int u = 0; u < B; u++) {
            if (s0 + u < K) {
                int k = __shfl_sync(0xffffffffu, order, s0 + u);
                ks[u] = k;
                if (on) l[u].load(Wd + (size_t)id[k] * expert_bytes + (size_t)r * row_bytes, lane);
            }
        }
        // WAIT (DOWN_EARLY): the kernel's wait, after the first batch's weight loads.
        if (WAIT && s0 == 0) warp_pdl_wait();
        if (DOWN_ACT_STAGE && s0 == 0) actq = stage_act_rows(actq, (u32)(K + (Sd ? 1 : 0)) * (u32)astride, H);
        #pragma unroll
        for (int u = 0; u < B; u++) {
            if (s0 + u < K) {
                int k = ks[u];
                float part = on ? l[u].part(actq + (size_t)k * astride, lane, I, nb) : 0.0f;
                acc = __fadd_rn(acc, __fmul_rn(part, weights[k]));
            }
        }
    }
    float v = __fmul_rn(acc, scale);
    if (Sd) v = __fadd_rn(v, on ? ls.part(actq + (size_t)K * astride, lane, I, nb) : 0.0f);
    return v;
}

// Down rows of at most 4 QK_K (S 2.1's I = 1024) of Q4_K or Q6_K with four lanes per
// super-block, so a half warp covers one expert's row and the two halves take two experts at
// once: lane (h, b, g) = (lane / 16, (lane / 4) % 4, lane % 4) takes 64 weights of
// super-block b of entry 2j + h in round j. The entries are the shared expert's row (first,
// when there is one) and the routed rows in route_copy's order. Why: with eight lanes per
// super-block a lane's piece was 32 weights for ~109 SASS instructions (Q4_K; sass.sh: 64-bit
// addresses, the scales unpacked per 32 weights, the activation's addresses per piece), and
// ncu found the kernel issue-bound (0.47 warp instructions per scheduler cycle with every read
// an L2 hit). Here a Q4_K piece is 64 weights for ~114 (the one-token mat-vec's q4k_load4 /
// q4k_acc4). Each lane adds its weighted pieces in entry order and the warp is reduced once,
// so the rounding differs from the eight-lane paths' by a few ulp.
// Measured on the H200 (session 20; ncu on an 8-layer S 2.1 Q4_K_M, tg64 on the full one):
// - Q4_K: 12.8-12.9 µs per launch against 14.5-14.8 (3.15 M instructions against 5.02 M);
//   tg64 281.8-283.4 t/s against 276.4-279.6 in the same calls. On by default.
// - Q6_K: 23.1 µs against 16.8 (4.20 M instructions against 6.65 M): at 96 registers five
//   blocks per SM instead of six, and its three unaligned windows per piece are fifteen word
//   loads; capped at six blocks it was still slower end to end. Off by default
//   (DOWN_Q6K_PAIRS=1 turns it on; it passed the device tests while it was the default).
// - Not kept: an L2 bulk prefetch of the later ranks' rows at the start (13.8-14.2 µs), and
//   the Q4_K pieces staged in shared memory by per-lane cp.async with 2, 4 or 6 rounds in
//   flight (16.2, 19.0, 20.2 µs: the more in flight, the slower).
// DOWN_Q4K_PAIRS=0 (LAGOON_CUDA_DEFINES) keeps the eight-lane Q4_K path.
#ifndef DOWN_Q4K_PAIRS
#define DOWN_Q4K_PAIRS 1
#endif
#ifndef DOWN_Q6K_PAIRS
#define DOWN_Q6K_PAIRS 0
#endif
// Rounds (two entries each) whose pieces are loaded before any is computed.
#ifndef DOWN_Q6K_PAIR_BATCH
#define DOWN_Q6K_PAIR_BATCH 2
#endif
// Entries per half warp fetched per round by the Q4_K pair path (lab switch): 2 takes S 2.1's
// 11 entries in three rounds, 3 in two with 36 registers of pieces. 6 (one round) spills under
// the six-block cap (ptxas: 212 bytes of spill stores) and takes 126 registers uncapped.
// Session 40 (S 2.1 Q4_K_M tg64, alternating, two rounds, one call): 2 317.52 / 317.29 t/s
// against 3's 313.22 / 313.03 (+1.4%; 317.35 / 317.23 again in the next call), 1 317.03 /
// 316.84; 80 registers for moe_down_q_q4_K at 2 and 3 alike. As DOWN_BATCH above: smaller
// rounds, the same bits (each lane adds its pieces in entry order either way).
#ifndef DOWN_Q4K_PAIR_BATCH
#define DOWN_Q4K_PAIR_BATCH 2
#endif

// A piece's activation offsets within an activation row (act.cu's Q8_K layout), constant per
// lane: the quants, the super-block's d, its bsums.
struct PairOffs {
    u32 q, d, bs;
};

struct PairQ4k {
    static constexpr int BLOCK = 144;
    static constexpr int BATCH = DOWN_Q4K_PAIR_BATCH;
    Q4kLoad4 l;
    static __device__ __forceinline__ PairOffs offs(int b, int g, int I) {
        return {(u32)(b * QK_K), (u32)(I + 4 * b), (u32)(I + 4 * (I / QK_K) + 32 * b)};
    }
    __device__ __forceinline__ void load(const u8* __restrict__ blk, int g) { l = q4k_load4(blk, g); }
    __device__ __forceinline__ float part(const u8* __restrict__ a, const PairOffs& o, int g) const {
        return q4k_acc4(0.0f, l, g, a + o.q, (const short*)(a + o.bs), *(const float*)(a + o.d));
    }
};

// Q6_K piece g = (n, t) = (g / 2, g % 2) of a super-block: elements 128n + 32G + 16t + [0, 16)
// for G = 0..3 (ggml's dequantize_row_q6_K: ql byte 64n + 16t + l holds groups 0 (low nibble)
// and 2 (high), byte 64n + 32 + 16t + l groups 1 and 3; qh byte 32n + 16t + l their top two
// bits at shifts 2G), with scale bytes 8n + 2G + t. Super-blocks are 210 bytes, so the three
// 16-byte runs are read as five-word windows (one shift for all three) and the scales byte by
// byte. sumi = Σ_G sc_G (Σ u·a − 32 bsum_G); the piece's term is (d_a·d)·sumi.
struct PairQ6k {
    static constexpr int BLOCK = 210;
    static constexpr int BATCH = DOWN_Q6K_PAIR_BATCH;
    u32 wa[5], wb[5], wh[5];
    u32 sh;
    int sc[4];
    unsigned short d;
    static __device__ __forceinline__ PairOffs offs(int b, int g, int I) {
        int n = g >> 1, t = g & 1;
        return {(u32)(b * QK_K + 128 * n + 16 * t), (u32)(I + 4 * b), (u32)(I + 4 * (I / QK_K) + 32 * b + 16 * n)};
    }
    __device__ __forceinline__ void load(const u8* __restrict__ blk, int g) {
        int n = g >> 1, t = g & 1;
        const u8* pa = blk + 64 * n + 16 * t;
        const u32* w = (const u32*)((size_t)pa & ~(size_t)3);
        sh = 8u * (u32)((size_t)pa & 3);
        // pa + 32 and blk + 128 + 32n + 16t are pa plus multiples of 4: the same shift.
        const u32* wq = w + 8;
        const u32* wq2 = (const u32*)((size_t)(blk + 128 + 32 * n + 16 * t) & ~(size_t)3);
        #pragma unroll
        for (int k = 0; k < 5; k++) {
            wa[k] = __ldg(w + k);
            wb[k] = __ldg(wq + k);
            wh[k] = __ldg(wq2 + k);
        }
        const signed char* s = (const signed char*)(blk + 192 + 8 * n + t);
        #pragma unroll
        for (int G = 0; G < 4; G++) sc[G] = (int)__ldg(s + 2 * G);
        d = __ldg((const unsigned short*)(blk + 208));
    }
    __device__ __forceinline__ float part(const u8* __restrict__ a, const PairOffs& o, int g) const {
        int t = g & 1;
        const int4* aq = (const int4*)(a + o.q);
        // bsums 8n .. 8n + 8 of the super-block as words (4-byte aligned for any I: the
        // bsums start at I + 4 I / QK_K).
        const u32* bp = (const u32*)(a + o.bs);
        u32 bw[4] = {bp[0], bp[1], bp[2], bp[3]};
        int sumi = 0;
        #pragma unroll
        for (int G = 0; G < 4; G++) {
            u32 w[4];
            #pragma unroll
            for (int k = 0; k < 4; k++) {
                u32 l = __funnelshift_r((G & 1) ? wb[k] : wa[k], (G & 1) ? wb[k + 1] : wa[k + 1], sh);
                u32 q = __funnelshift_r(wh[k], wh[k + 1], sh);
                u32 nib = (G & 2) ? (l >> 4) & 0x0F0F0F0Fu : l & 0x0F0F0F0Fu;
                w[k] = nib | (((q >> (2 * G)) & 0x03030303u) << 4);
            }
            int bsum = t ? ((int)bw[G] >> 16) : (int)(short)(bw[G] & 0xFFFF);
            sumi += sc[G] * (dp4a4(w, aq[2 * G], 0) - 32 * bsum);
        }
        return __fmul_rn(__fmul_rn(*(const float*)(a + o.d), f16_to_f32(d)), (float)sumi);
    }
};

template <class F, bool WAIT = false>
__device__ __forceinline__ float moe_down_pairs(const u8* __restrict__ Wd, u64 expert_bytes, u64 row_bytes,
                                                const u8* __restrict__ St, const u8* __restrict__ actq, u64 astride,
                                                const u32* __restrict__ id, const float* __restrict__ weights, int r,
                                                int I, int K, float scale, int order, int H) {
    constexpr int B = F::BATCH;
    int lane = threadIdx.x & 31;
    int h = lane >> 4, b = (lane >> 2) & 3, g = lane & 3;
    bool on = b < I / QK_K;
    int s0 = St ? 1 : 0;
    int n = K + s0;
    size_t roff = (size_t)r * row_bytes + (size_t)b * F::BLOCK;
    PairOffs o = F::offs(b, g, I);
    float acc = 0.0f, accs = 0.0f;
    for (int e0 = 0; e0 < n; e0 += 2 * B) {
        F l[B];
        int ks[B];
        #pragma unroll
        for (int u = 0; u < B; u++) {
            int e = e0 + 2 * u + h;
            // Every lane shuffles (the source lane is the entry's rank, any value when e is
            // the shared entry or past the end).
            int k = __shfl_sync(0xffffffffu, order, (e - s0) & 31);
            ks[u] = e < s0 ? K : k;
            if (on && e < n) l[u].load((e < s0 ? St : Wd + (size_t)id[k] * expert_bytes) + roff, g);
        }
        // WAIT (DOWN_EARLY): the kernel's wait, after the first batch's weight loads.
        if (WAIT && e0 == 0) warp_pdl_wait();
        if (DOWN_ACT_STAGE && e0 == 0) actq = stage_act_rows(actq, (u32)(K + s0) * (u32)astride, H);
        #pragma unroll
        for (int u = 0; u < B; u++) {
            int e = e0 + 2 * u + h;
            if (on && e < n) {
                int k = ks[u];
                // 32-bit row offset: the K + 1 activation rows are a few KB.
                float p = l[u].part(actq + (u32)k * (u32)astride, o, g);
                if (e < s0) accs = p;
                else acc = __fadd_rn(acc, __fmul_rn(p, weights[k]));
            }
        }
    }
    return __fadd_rn(__fmul_rn(acc, scale), accs);
}

// out[r] = scale * sum_k weights[k] * (down_{ids[k]}[r] . act[k]), the experts taken in
// ascending (id, slot) order as moe_combine does: ids is route_copy, whose [2K, 3K) holds
// the slots in that order (moe_gate_up_q writes it). With Sd (the shared expert's down, its
// activation in row K of actq) the shared output is added, and with res the residual:
// out = res + (routed + shared), the graph's two adds. One warp per output row. Each lane
// adds its shares of every expert's product, weighted, and the warp is reduced once at the
// end (one reduction instead of one per expert: five dependent shuffles each); the float
// rounding differs from per-expert sums by a few ulp. Grid ceil(H / MV_WARPS).
// S != T (moe_down_mixed): the shared expert's down is a float matrix (rows of si elements,
// srow bytes) against its f32 activation sact (slot K of the gate/up kernel's output), its
// lane shares added to the routed ones as a T-typed shared expert's are.
// LATE (moe_down_mixed_late_*: launched right after moe_gate_up_q's QOUT form, which
// triggers at its start): nothing the gate/up kernel writes -- route_copy, actq, sact -- is
// read before the wait, so the routed rows' early loads (DOWN_EARLY) are off and a float
// shared expert's term is computed right after the wait (its weights still requested before).
template <int T, int S = T, bool LATE = false>
__device__ void moe_down_q(const u8* __restrict__ Wd, u64 expert_bytes, u64 row_bytes,
                           const u8* __restrict__ Sd, const u8* __restrict__ actq, u64 astride,
                           const float* __restrict__ ids, const float* __restrict__ weights,
                           const float* __restrict__ res, float* __restrict__ out, int H, int I, int K,
                           float scale, u64 srow = 0, const float* __restrict__ sact = nullptr, int si = 0,
                           const float* __restrict__ gn = nullptr, float* __restrict__ gx = nullptr,
                           float* __restrict__ part = nullptr) {
    pdl_trigger();
    int r = blockIdx.x * MV_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (r >= H) return;
    // NORM_EPI (mv_rinv_multi): the next norm's gain, a weight, read before the wait.
    float gv = gx && lane == 0 ? __ldg(gn + r) : 0.0f;
    u64 sb = S == T ? row_bytes : srow;
    // A float shared expert's row: its first pieces are requested before the wait (weights
    // only), so they arrive with the routed rows' instead of in a round trip of their own
    // after them. A T-typed shared row is asked of L2 instead.
    HRowPart<S == T ? WT_BF16 : S, DOWN_SHARED_BATCH> sp;
    float shared = 0.0f;
    if constexpr (S != T) {
        // The host launches this kernel right after the routed activations' quantiser, which
        // waits before it triggers (PDL_ENTRY), so the gate/up kernel that wrote sact has
        // finished when this one starts: the shared expert's term is added up before the wait
        // (LATE: only its weights are requested here).
        sp.load(Sd + (size_t)r * srow, si);
        if (!LATE) shared = sp.finish(Sd + (size_t)r * srow, (const u8*)sact, si);
    } else if (Sd && lane == 0) {
        prefetch_l2(Sd + (size_t)r * sb, sb);
    }
    // The residual: the host launches this kernel right after the routed activations'
    // quantiser, which waits before it triggers, so res (the output projection's sum, made
    // several launches before) is final here; read now instead of after the row's reduction.
    float rv = res && lane == 0 ? res[r] : 0.0f;
    // The T-typed kernels below take the shared expert only when it is of type T.
    const u8* St = S == T ? Sd : nullptr;
    const u32* id = (const u32*)ids;
    // DOWN_EARLY: the short-row paths issue their first batch of routed weight loads before
    // the wait. The host launches this kernel right after a kernel that waits before it
    // triggers (the routed activations' quantiser), so the gate/up kernel that wrote
    // route_copy (ids, weights, order) has finished when this one starts; only actq, the
    // quantiser's output, needs the wait.
    constexpr bool EARLY = DOWN_EARLY != 0;
    bool early = !LATE && EARLY && ((T == WT_CT4 && I <= 32 * QK) || (T == WT_Q4_K && I <= 4 * QK_K) ||
                           (T == WT_Q6_K && DOWN_Q6K_PAIRS && I <= 4 * QK_K));
    if (!early) pdl_wait();
    // LATE: the shared expert's term, its activation row (the gate/up kernel's slot K) final
    // only now.
    if constexpr (S != T && LATE) shared = sp.finish(Sd + (size_t)r * srow, (const u8*)sact, si);
    // Lane s holds the slot of rank s (route_copy's order, see moe_gate_up_q), so the loop
    // below reads it with a shuffle and its iterations (independent loads) can overlap.
    int order = lane < K ? __float_as_int(ids[2 * K + lane]) : 0;
    float v;
    if (T == WT_CT4 && I <= 32 * QK) {
        v = moe_down_short<DownCt4, DOWN_BATCH, EARLY>(Wd, expert_bytes, row_bytes, St, actq, astride, id, weights, r,
                                                       I, K, scale, order, H);
    } else if (T == WT_Q4_K && DOWN_Q4K_PAIRS && I <= 4 * QK_K) {
        v = moe_down_pairs<PairQ4k, EARLY>(Wd, expert_bytes, row_bytes, St, actq, astride, id, weights, r, I, K, scale,
                                           order, H);
    } else if (T == WT_Q6_K && DOWN_Q6K_PAIRS && I <= 4 * QK_K) {
        v = moe_down_pairs<PairQ6k, EARLY>(Wd, expert_bytes, row_bytes, St, actq, astride, id, weights, r, I, K, scale,
                                           order, H);
    } else if (T == WT_Q4_K && I <= 4 * QK_K) {
        v = moe_down_short<DownQ4k, DOWN_BATCH, EARLY>(Wd, expert_bytes, row_bytes, St, actq, astride, id, weights, r,
                                                       I, K, scale, order, H);
    } else if (T == WT_Q6_K && DOWN_Q6K_BATCH > 0 && I <= 4 * QK_K) {
        v = moe_down_short<DownQ6k, (DOWN_Q6K_BATCH > 0 ? DOWN_Q6K_BATCH : 1)>(Wd, expert_bytes, row_bytes, St, actq,
                                                                               astride, id, weights, r, I, K, scale, order, H);
    } else {
        // (The wait was above: this path is never early.)
        if (DOWN_ACT_STAGE) actq = stage_act_rows(actq, (u32)(K + (St ? 1 : 0)) * (u32)astride, H);
        float acc = 0.0f;
        #pragma unroll 4
        for (int s = 0; s < K; s++) {
            int k = __shfl_sync(0xffffffffu, order, s);
            u32 e = id[k];
            float part = lane_part_q<T>(Wd + (size_t)e * expert_bytes + (size_t)r * row_bytes,
                                        actq + (size_t)k * astride, I);
            acc = __fadd_rn(acc, __fmul_rn(part, weights[k]));
        }
        v = __fmul_rn(acc, scale);
        if (St) v = __fadd_rn(v, lane_part_q<T>(St + (size_t)r * row_bytes, actq + (size_t)K * astride, I));
    }
    if constexpr (S != T) v = __fadd_rn(v, shared);
    float y = warp_sum(v);
    if (res) y = __fadd_rn(rv, y);
    if (lane == 0) out[r] = y;
    if (gx) {
        // NORM_EPI: g ∘ x and the block's sum of x² for the products after the next norm
        // (mv_rinv_multi). Every warp of the block has a row (the host checks H % MV_WARPS).
        __shared__ float sq[MV_WARPS];
        if (lane == 0) {
            gx[r] = __fmul_rn(gv, y);
            sq[threadIdx.x >> 5] = __fmul_rn(y, y);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float t = 0.0f;
            #pragma unroll
            for (int k = 0; k < MV_WARPS; k++) t = __fadd_rn(t, sq[k]);
            part[blockIdx.x] = t;
        }
    }
}

// Experts per warp in moe_down_rows (at most; the host picks how many warps share K).
#define DOWN_ROW_EXPERTS 2
// Warps of a moe_down_rows block at most (routed + shared; the host keeps K within it).
#define DOWN_ROW_MAX_WARPS 12

// The routed pieces of one warp (slots ks[0 .. n)) for short rows (one piece per lane), all
// loaded before any is computed: Σ_u weights[k_u]·part_u, in u order.
template <class F>
__device__ __forceinline__ float down_rows_short(const u8* __restrict__ Wd, u64 expert_bytes, u64 row_bytes,
                                                 const u8* __restrict__ actq, u64 astride, const u32* __restrict__ id,
                                                 const float* __restrict__ weights, int r, int I,
                                                 const int (&ks)[DOWN_ROW_EXPERTS], int n) {
    int lane = threadIdx.x & 31;
    int nb = F::blocks(I);
    bool on = F::on(lane, I);
    F l[DOWN_ROW_EXPERTS];
    #pragma unroll
    for (int u = 0; u < DOWN_ROW_EXPERTS; u++)
        if (u < n && on) l[u].load(Wd + (size_t)id[ks[u]] * expert_bytes + (size_t)r * row_bytes, lane);
    float acc = 0.0f;
    #pragma unroll
    for (int u = 0; u < DOWN_ROW_EXPERTS; u++) {
        if (u < n) {
            float part = on ? l[u].part(actq + (size_t)ks[u] * astride, lane, I, nb) : 0.0f;
            acc = __fadd_rn(acc, __fmul_rn(part, weights[ks[u]]));
        }
    }
    return acc;
}

// moe_down_q's output with each output row's experts spread over one block's warps, so a
// warp reads one or two expert rows instead of all K: grid H (one block per output row) of
// G routed warps (+ one for the shared expert when there is one), warp g taking the slots of
// ranks [e·g, e·g + e), e = ceil(K / G) <= DOWN_ROW_EXPERTS, ranked by (id, slot) as
// moe_combine orders them (route_copy's order, as moe_down_q). The warps' sums are added in
// warp order in shared memory: out = res + (scale · Σ_g warp_g + shared). Why: moe_down_q's one warp per output row read all
// ~11 expert rows in two or three rounds of loads with every warp of the grid resident at
// once, so the rounds' load and compute phases alternated across the whole device (S 2.1:
// 16.4 µs for Q4_K's 17.7 MB, 24.6 for Q6_K's 25.8 MB, ncu session 17); here the grid is
// several waves of short warps and the block scheduler overlaps them. The float rounding
// differs from moe_down_q's by a few ulp (partial sums per warp). Measured slower, so
// opt-in (LAGOON_CUDA_DOWN_ROWS=1|2): S 2.1 Q4_K_M tg64 with two experts per warp 240-241
// t/s and with one 205-208, against moe_down_q's 253-254 in the same call; after the slot
// order moved to the gate/up kernel, two per warp 253-255 against 269 (H200, session 18).
// Not profiled; candidates: the block barrier and thread 0's serial sum, a prologue per
// warp, fewer resident warps (108 registers for Q6_K).
template <int T, int S = T>
__device__ void moe_down_rows(const u8* __restrict__ Wd, u64 expert_bytes, u64 row_bytes,
                              const u8* __restrict__ Sd, const u8* __restrict__ actq, u64 astride,
                              const float* __restrict__ ids, const float* __restrict__ weights,
                              const float* __restrict__ res, float* __restrict__ out, int H, int I, int K,
                              float scale, u64 srow = 0, const float* __restrict__ sact = nullptr, int si = 0) {
    pdl_trigger();
    int r = blockIdx.x;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    bool has_shared = S != T || Sd != nullptr;
    int G = (int)(blockDim.x >> 5) - (has_shared ? 1 : 0);
    __shared__ float part[DOWN_ROW_MAX_WARPS];
    float v = 0.0f;
    if (warp == G) {
        // The shared expert. A float one reads sact, written by the gate/up kernel, which
        // has finished when this kernel starts (moe_down_q's reason), so it needs no wait; a
        // T-typed one reads row K of actq, the quantiser's output, after the wait.
        if constexpr (S != T) {
            HRowPart<S, DOWN_SHARED_BATCH> sp;
            sp.load(Sd + (size_t)r * srow, si);
            v = sp.finish(Sd + (size_t)r * srow, (const u8*)sact, si);
        } else {
            v = lane_part_waiting<T>(Sd + (size_t)r * row_bytes, actq + (size_t)K * astride, I);
        }
    } else {
        pdl_wait();
        const u32* id = (const u32*)ids;
        int e = (K + G - 1) / G;
        int s0 = warp * e;
        int n = min(e, K - s0);
        // The slots of ranks s0 .. s0 + n (route_copy's order, as moe_down_q).
        int ks[DOWN_ROW_EXPERTS];
        #pragma unroll
        for (int u = 0; u < DOWN_ROW_EXPERTS; u++) ks[u] = u < n ? __float_as_int(ids[2 * K + s0 + u]) : 0;
        if (T == WT_CT4 && I <= 32 * QK) {
            v = down_rows_short<DownCt4>(Wd, expert_bytes, row_bytes, actq, astride, id, weights, r, I, ks, n);
        } else if (T == WT_Q4_K && I <= 4 * QK_K) {
            v = down_rows_short<DownQ4k>(Wd, expert_bytes, row_bytes, actq, astride, id, weights, r, I, ks, n);
        } else if (T == WT_Q6_K && I <= 4 * QK_K) {
            v = down_rows_short<DownQ6k>(Wd, expert_bytes, row_bytes, actq, astride, id, weights, r, I, ks, n);
        } else {
            #pragma unroll
            for (int u = 0; u < DOWN_ROW_EXPERTS; u++) {
                if (u < n) {
                    int k = ks[u];
                    float p = lane_part_q<T>(Wd + (size_t)id[k] * expert_bytes + (size_t)r * row_bytes,
                                             actq + (size_t)k * astride, I);
                    v = __fadd_rn(v, __fmul_rn(p, weights[k]));
                }
            }
        }
    }
    float y = warp_sum(v);
    if (lane == 0) part[warp] = y;
    __syncthreads();
    if (threadIdx.x == 0) {
        float acc = 0.0f;
        for (int g = 0; g < G; g++) acc = __fadd_rn(acc, part[g]);
        float o = __fmul_rn(acc, scale);
        if (has_shared) o = __fadd_rn(o, part[G]);
        if (res) o = __fadd_rn(res[r], o);
        out[r] = o;
    }
}

// out[r] = W[r] . x for f32 weights (the router) at batch 1: one block of MVF_WARPS warps
// per row, warp w taking the w-th quarter of the row's float4s with MVF_BATCH of them per
// lane loaded before any is used, then the warps' sums added in shared memory. (One warp
// per row, two loads in flight per lane, ran 5.8 us for S 2.1's 256×3072 router: 64 blocks
// for 132 SMs, latency-bound.) Rows start 16-byte aligned and cols % 4 == 0. Grid rows.
#define MVF_WARPS 4
#define MVF_BATCH 8
extern "C" __global__ void __launch_bounds__(32 * MVF_WARPS)
mv_f32(const float* __restrict__ W, u64 row_bytes, const float* __restrict__ x, float* __restrict__ out,
       int rows, int cols) {
    pdl_trigger();
    int r = blockIdx.x;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float4* w4 = (const float4*)((const u8*)W + (size_t)r * row_bytes);
    const float4* x4 = (const float4*)x;
    int n4 = cols / 4;
    int per = (n4 + MVF_WARPS - 1) / MVF_WARPS;
    int lo = warp * per, hi = min(n4, lo + per);
    // The weights are never written by a kernel: the first batch is requested before waiting.
    float4 w[MVF_BATCH];
    #pragma unroll
    for (int u = 0; u < MVF_BATCH; u++) {
        int i = lo + lane + 32 * u;
        if (i < hi) w[u] = ldw4f(w4 + i);
    }
    pdl_wait();
    float acc = 0.0f;
    for (int i0 = lo + lane; i0 < hi; i0 += 32 * MVF_BATCH) {
        if (i0 != lo + lane) {
            #pragma unroll
            for (int u = 0; u < MVF_BATCH; u++) {
                int i = i0 + 32 * u;
                if (i < hi) w[u] = ldw4f(w4 + i);
            }
        }
        #pragma unroll
        for (int u = 0; u < MVF_BATCH; u++) {
            int i = i0 + 32 * u;
            if (i < hi) {
                float4 v = x4[i];
                acc += w[u].x * v.x + w[u].y * v.y + w[u].z * v.z + w[u].w * v.w;
            }
        }
    }
    acc = warp_sum(acc);
    __shared__ float part[MVF_WARPS];
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float y = 0.0f;
        #pragma unroll
        for (int k = 0; k < MVF_WARPS; k++) y += part[k];
        out[r] = y;
    }
}

#define MVQ_TYPES(X) X(q8_0, WT_Q8_0) X(q4_K, WT_Q4_K) X(q6_K, WT_Q6_K) X(ct4, WT_CT4) X(iq3_xxs, WT_IQ3_XXS) \
    X(iq2_xxs, WT_IQ2_XXS) X(iq2_s, WT_IQ2_S) X(q5_K, WT_Q5_K) X(iq4_xs, WT_IQ4_XS) X(ct8, WT_CT8)

// The products of an mv_* launch as kernel parameters (after the input, its width and n_mats:
// device.rs mv_launch's order), and the MvMats the kernel builds from them.
#define MV_MATS_PARAMS                                                                             \
    const u8* W0, u64 rb0, float* o0, const float* r0, int n0, const u8* W1, u64 rb1, float* o1,   \
        const float* r1, int n1, const u8* W2, u64 rb2, float* o2, const float* r2, int n2,         \
        const u8* W3, u64 rb3, float* o3, const float* r3, int n3
#define MV_MATS_M                                                                                  \
    MvMats m = {{W0, W1, W2, W3}, {rb0, rb1, rb2, rb3}, {o0, o1, o2, o3}, {r0, r1, r2, r3},        \
                {n0, n1, n2, n3}}

// The mat-vec kernels every batch-1 type has: up to MV_MATS products of one input, and a
// SwiGLU MLP's gate and up (SWIGLU: mv_swiglu, or mv_swiglu_split for float weights).
#define DEFINE_MV(name, T, SWIGLU)                                                                 \
    extern "C" __global__ void MV_LB mv_##name(                                                    \
        const u8* aq, int cols, int n_mats, MV_MATS_PARAMS) {                                      \
        MV_MATS_M;                                                                                 \
        mv_multi<T>(m, n_mats, aq, cols);                                                          \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS) mv_swiglu_##name(                 \
        const u8* Wg, const u8* Wu, u64 row_bytes, const u8* aq, float* act, int rows, int cols) { \
        SWIGLU<T>(Wg, Wu, row_bytes, aq, act, rows, cols);                                         \
    }

#define DEFINE_MVQ(name, T)                                                                        \
    DEFINE_MV(name, T, mv_swiglu)                                                                  \
    extern "C" __global__ void GATE_UP_LB moe_gate_up_q_##name(             \
        const u8* Wg, const u8* Wu, u64 expert_bytes, u64 row_bytes, const u8* Sg, const u8* Su,   \
        const u8* xq, const float* ids, const float* weights, float* route_copy, float* act, int I, \
        int H, int K, int early) {                                                                 \
        moe_gate_up_q<T>(Wg, Wu, expert_bytes, row_bytes, Sg, Su, xq, ids, weights, route_copy, act, \
                         I, H, K, early);                                                          \
    }                                                                                              \
    extern "C" __global__ void DOWN_LB_##name moe_down_q_##name(                \
        const u8* Wd, u64 expert_bytes, u64 row_bytes, const u8* Sd, const u8* actq, u64 astride,  \
        const float* ids, const float* weights, const float* res, float* out, int H, int I, int K, \
        float scale) {                                                                             \
        moe_down_q<T>(Wd, expert_bytes, row_bytes, Sd, actq, astride, ids, weights, res, out, H, I, \
                      K, scale);                                                                   \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * DOWN_ROW_MAX_WARPS) moe_down_r_##name(      \
        const u8* Wd, u64 expert_bytes, u64 row_bytes, const u8* Sd, const u8* actq, u64 astride,  \
        const float* ids, const float* weights, const float* res, float* out, int H, int I, int K, \
        float scale) {                                                                             \
        moe_down_rows<T>(Wd, expert_bytes, row_bytes, Sd, actq, astride, ids, weights, res, out, H, \
                         I, K, scale);                                                             \
    }
MVQ_TYPES(DEFINE_MVQ)

// Two-type runs of one input (mv_multi with U != T): the first n_t products of type T, the
// rest of type U. The pairs are the attention mixes of llama.cpp's K-quant recipes: Q4_K_M
// and Q5_K_M (Q6_K attn_v on the use_more_bits layers), IQ4_XS (Q5_K attn_v).
#define MV2_PAIRS(X) X(q4_K_q6_K, WT_Q4_K, WT_Q6_K) X(q5_K_q6_K, WT_Q5_K, WT_Q6_K) X(iq4_xs_q5_K, WT_IQ4_XS, WT_Q5_K)
#define DEFINE_MV2(name, T, U)                                                                     \
    extern "C" __global__ void MV_LB mv2_##name(                                                   \
        const u8* aq, int cols, int n_mats, MV_MATS_PARAMS, int n_t) {                             \
        MV_MATS_M;                                                                                 \
        mv_multi<T, U>(m, n_mats, aq, cols, n_t);                                                  \
    }
MV2_PAIRS(DEFINE_MV2)

// Float weights at batch 1 (attention and shared-expert matrices of W4A16 checkpoints, bf16
// models): the same mat-vec and SwiGLU kernels, `aq` being the f32 input row itself.
#define MVH_TYPES(X) X(bf16, WT_BF16) X(f16, WT_F16)

#define DEFINE_MVH(name, T)                                                                        \
    DEFINE_MV(name, T, mv_swiglu_split)                                                            \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS) mv_split_##name(                  \
        const u8* W, u64 row_bytes, const float* x, float* out, int rows, int cols) {              \
        mv_split<T>(W, row_bytes, x, out, rows, cols);                                             \
    }                                                                                              \
    extern "C" __global__ void MV_LB mv_norm_##name(                                               \
        const float* x, int cols, int n_mats, MV_MATS_PARAMS, const float* g, float eps) {         \
        MV_MATS_M;                                                                                 \
        mv_norm_multi<T>(m, n_mats, x, cols, g, eps);                                              \
    }                                                                                              \
    extern "C" __global__ void MV_LB mv_rinv_##name(                                               \
        const u8* gx, int cols, int n_mats, MV_MATS_PARAMS, const float* part, int n_part,        \
        float eps) {                                                                               \
        MV_MATS_M;                                                                                 \
        mv_rinv_multi<T>(m, n_mats, gx, cols, part, n_part, eps);                                  \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, MV_STAGE_BLOCKS) mv_stage_##name(  \
        const u8* aq, int cols, int n_mats, MV_MATS_PARAMS) {                                      \
        MV_MATS_M;                                                                                 \
        mv_stage<T>(m, n_mats, (const float*)aq, cols);                                            \
    }
MVH_TYPES(DEFINE_MVH)

// The routed experts on T's integer kernels with a float shared expert (W4A16 checkpoints:
// CT4 experts, a bf16 shared expert) taken in the same two launches: its gate/up as slot K
// of moe_gate_up_q against the f32 input xf, its down in moe_down_q's output-row warps
// against its f32 SwiGLU activations (act from element K·I), so the shared expert's three
// products and the add after them need no launches of their own. si: the shared expert's
// width, which may differ from the routed experts' I.
#define MOE_MIXED(name, T, S)                                                                      \
    extern "C" __global__ void GATE_UP_LB moe_gate_up_mixed_##name(         \
        const u8* Wg, const u8* Wu, u64 expert_bytes, u64 row_bytes, const u8* Sg, const u8* Su,   \
        const u8* xq, const float* ids, const float* weights, float* route_copy, float* act, int I, \
        int H, int K, int early, u64 srow, const float* xf, int si) {                              \
        moe_gate_up_q<T, S>(Wg, Wu, expert_bytes, row_bytes, Sg, Su, xq, ids, weights, route_copy, \
                            act, I, H, K, early, srow, xf, si);                                    \
    }                                                                                              \
    extern "C" __global__ void DOWN_LB moe_down_mixed_##name(            \
        const u8* Wd, u64 expert_bytes, u64 row_bytes, const u8* Sd, const u8* actq, u64 astride,  \
        const float* ids, const float* weights, const float* res, float* out, int H, int I, int K, \
        float scale, u64 srow, const float* sact, int si, const float* gn, float* gx, float* part) { \
        moe_down_q<T, S>(Wd, expert_bytes, row_bytes, Sd, actq, astride, ids, weights, res, out, H, \
                         I, K, scale, srow, sact, si, gn, gx, part);                               \
    }                                                                                              \
    extern "C" __global__ void __cluster_dims__(GU_CLUSTER, 1, 1) GATE_UP_LB moe_gate_up_mixed_q8_##name( \
        const u8* Wg, const u8* Wu, u64 expert_bytes, u64 row_bytes, const u8* Sg, const u8* Su,   \
        const u8* xq, const float* ids, const float* weights, float* route_copy, float* act, int I, \
        int H, int K, int early, u64 srow, const float* xf, int si, u8* actq, u64 astride) {       \
        moe_gate_up_q<T, S, true>(Wg, Wu, expert_bytes, row_bytes, Sg, Su, xq, ids, weights,       \
                                  route_copy, act, I, H, K, early, srow, xf, si, actq, astride);    \
    }                                                                                              \
    extern "C" __global__ void DOWN_LB moe_down_mixed_late_##name(                                 \
        const u8* Wd, u64 expert_bytes, u64 row_bytes, const u8* Sd, const u8* actq, u64 astride,  \
        const float* ids, const float* weights, const float* res, float* out, int H, int I, int K, \
        float scale, u64 srow, const float* sact, int si, const float* gn, float* gx, float* part) { \
        moe_down_q<T, S, true>(Wd, expert_bytes, row_bytes, Sd, actq, astride, ids, weights, res,  \
                               out, H, I, K, scale, srow, sact, si, gn, gx, part);                 \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * DOWN_ROW_MAX_WARPS) moe_down_mixed_r_##name( \
        const u8* Wd, u64 expert_bytes, u64 row_bytes, const u8* Sd, const u8* actq, u64 astride,  \
        const float* ids, const float* weights, const float* res, float* out, int H, int I, int K, \
        float scale, u64 srow, const float* sact, int si) {                                        \
        moe_down_rows<T, S>(Wd, expert_bytes, row_bytes, Sd, actq, astride, ids, weights, res, out, \
                            H, I, K, scale, srow, sact, si);                                       \
    }
MOE_MIXED(ct4_bf16, WT_CT4, WT_BF16)
MOE_MIXED(ct4_f16, WT_CT4, WT_F16)
MOE_MIXED(ct8_bf16, WT_CT8, WT_BF16)
MOE_MIXED(ct8_f16, WT_CT8, WT_F16)
