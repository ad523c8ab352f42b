// Decode mat-vec versions the kernel lab (examples/kernel_lab.rs) times against the ones the
// backend runs, kept because each answers a question the production kernels raise. Measured
// on the H200 (BENCHMARKS.md, "Decode mat-vec lab"):
//
// - mvs_q4_K: each warp streams its rows' weights into its own ring of shared-memory stages
//   with cp.async and computes a stage while the next ones load. Faster than the old eight-
//   lane register kernel (Q projection 18.1 -> 11.1 us) but not than four lanes per
//   super-block in registers (9.5 us): ncu shows it issue-bound (0.75 warp instructions per
//   scheduler cycle at 57% of DRAM bandwidth).
// - mvs_memonly_q4_K: the same stream with the arithmetic replaced by a checksum, the ceiling
//   of this copy pattern: 80-89% of the read floor on the lm_head shape.
// - mvh_q4_K: half-warp rows (two rows per warp, four lanes per super-block); slower than
//   whole-warp rows on 9216 rows (12.7 against 9.5 us; its 1,152 blocks make ~1.1 waves
//   at the 8 resident per SM its 64 registers allow, a likely cause not yet checked).
// - moe_gate_up_s_q4_K / moe_gate_up_h_q4_K: the routed gate/up streamed (22.4 us) and with
//   half warps (19.6 us), both slower than moe_gate_up_q_q4_K (17.1 us).
// - moe_gate_up_g4_q4_K: the half-warp form on rows regrouped at load (g4_part_q4k), so its
//   loads cover contiguous bytes; the question session 26's ncu left (the half-warp form
//   L1-bound at 76%). Session 27: 17.8-18.0 µs against the half-warp kernel's 18.0-18.2
//   (bit-equal), both slower than the eight-lane kernel (15.8-16.5): the contiguous loads
//   were not what the half-warp form lacked.
// - moe_gate_up_r{1,2,4}[p]_q4_K: warp_gate_up_q4k_rows (mmvq.cuh) with 1, 2, 4 row pairs
//   per warp, p: the next pair's weights requested before the current is computed. r1 (the
//   production kernel since session 27) 14.7 µs; r2 16.6, r4 20.6, r2p 15.4, r4p 19.1 (ncu:
//   r2 0.40 and r4 0.33 warp instructions issued per scheduler cycle against ~0.5, 60-67% of
//   cycles without an eligible warp: fewer warps, each waiting on its own chain).
// - moe_gate_up_t{4,2}[m]_q4_K: the gate/up's weights bulk-copied into shared memory
//   (cp.async.bulk on an mbarrier), 16 or 8 rows a block, all issued at the block's start;
//   m: loads only (session 29, after GU_MEMONLY found the register-staged loads alone at
//   56-59% of the read floor). Session 29: t4 16.3 µs, t2 14.7, against r1 (the production
//   loop) 14.8 and moe_gate_up_q_q4_K 15.3, all bit-equal; loads only t4m 13.9 (62.5% of the
//   floor), t2m 12.9 (67.3%). So shared-memory staging does not beat registers here, and
//   more bytes in flight a block made the stream slower, not faster (ncu t4: DRAM 46.6%,
//   20% achieved occupancy, 4 blocks an SM by registers and by shared memory alike).
//
// The copy pattern (per-thread 16-byte cp.async into a multi-stage ring, wait_group N - 1
// then a barrier before reading) is the one CUTLASS's multistage mainloops and llama.cpp's
// mma kernels use (ggml/src/ggml-cuda/cp-async.cuh); restated here for one warp. Terms and
// their order in the streamed kernels are warp_dot_q4k_rows's (mmvq.cuh): a stage is MVS_CH
// super-blocks, a multiple of the four lane groups, so their results are that loop's bit
// for bit.
#include "mmvq.cuh"
#include "tc.cuh"

#define MVS_WARPS 4
#define MVS_CH 12
#define MVS_STAGES 4
#define MVS_STAGE_BYTES (MVS_CH * 144)

// One warp's copy of `bytes` (a multiple of 16, both ends 16-byte aligned) into dst.
__device__ __forceinline__ void warp_copy(u8* dst, const u8* src, int bytes, int lane) {
    for (int o = 16 * lane; o < bytes; o += 512) cp_async16(dst + o, src + o);
}

// acc += this lane's terms of stage `st` (super-blocks b0 .. b0 + n of a row).
__device__ __forceinline__ float mvs_stage_acc(float acc, const u8* st, int n, int b0, const u8* __restrict__ a,
                                               const float* __restrict__ ad, const short* __restrict__ bs,
                                               int lane) {
    int p = lane & 7;
    for (int j = lane >> 3; j < n; j += 4) {
        const u8* blk = st + j * 144;
        Q4kLoad l;
        l.hd = *(const uint4*)blk;
        l.qs = *(const uint4*)(blk + 16 + 16 * p);
        int b = b0 + j;
        acc = q4k_acc(acc, l, p, a + (size_t)b * QK_K, bs + 16 * b, ad[b]);
    }
    return acc;
}

// out[r] = W[r] . a (+ res[r]) for Q4_K rows of `cols` (a multiple of 256): warp w of the
// grid takes rows [w·rpw, (w + 1)·rpw), one stage of MVS_CH super-blocks at a time, with S
// stages in its ring. (COMPUTE false: the kernel lab's memory-only twin, which streams the
// same bytes and only folds them into a checksum.) Grid ceil(rows / (rpw · MVS_WARPS)).
template <int S, bool COMPUTE>
__device__ __forceinline__ void mvs_dense(const u8* __restrict__ W, u64 row_bytes, const u8* __restrict__ aq,
                                          int cols, float* __restrict__ out, const float* __restrict__ res,
                                          int rows, int rpw) {
    __shared__ __align__(16) u8 ring[MVS_WARPS][S][MVS_STAGE_BYTES];
    pdl_trigger();
    int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    int r0 = (blockIdx.x * MVS_WARPS + wi) * rpw;
    int nr = min(rpw, rows - r0);
    if (nr <= 0) return;
    int nb = cols / QK_K;
    int spr = (nb + MVS_CH - 1) / MVS_CH;  // stages per row
    int n = nr * spr;
    u8(*buf)[MVS_STAGE_BYTES] = ring[wi];
    auto issue = [&](int i) {
        int r = r0 + i / spr, c = i % spr;
        int b0 = c * MVS_CH, m = min(MVS_CH, nb - b0);
        warp_copy(buf[i % S], W + (size_t)r * row_bytes + (size_t)b0 * 144, m * 144, lane);
    };
    #pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < n) issue(s);
        cp_async_commit();
    }
    pdl_wait();
    const float* ad = q8k_d(aq, cols);
    const short* bs = q8k_bsums(aq, cols);
    float acc = 0.0f;
    for (int i = 0; i < n; i++) {
        if (i + S - 1 < n) issue(i + S - 1);
        cp_async_commit();
        cp_async_wait<S - 1>();
        __syncwarp();
        int c = i % spr, b0 = c * MVS_CH;
        if constexpr (COMPUTE) {
            acc = mvs_stage_acc(acc, buf[i % S], min(MVS_CH, nb - b0), b0, aq, ad, bs, lane);
        } else {
            const u8* st = buf[i % S];
            for (int j = lane >> 3; j < min(MVS_CH, nb - b0); j += 4) {
                uint4 v = *(const uint4*)(st + j * 144 + 16 + 16 * (lane & 7));
                acc += (float)((v.x ^ v.y ^ v.z ^ v.w) & 0xFF);
            }
        }
        __syncwarp();
        if (c == spr - 1) {
            int r = r0 + i / spr;
            float y = warp_sum(acc);
            if (lane == 0) out[r] = res ? __fadd_rn(res[r], y) : y;
            acc = 0.0f;
        }
    }
}

#define MVS_DENSE_ARGS                                                                                     \
    const u8 *__restrict__ W, u64 row_bytes, const u8 *__restrict__ aq, int cols, float *__restrict__ out, \
        const float *__restrict__ res, int rows, int rpw
extern "C" __global__ void __launch_bounds__(32 * MVS_WARPS) mvs_q4_K(MVS_DENSE_ARGS) {
    mvs_dense<MVS_STAGES, true>(W, row_bytes, aq, cols, out, res, rows, rpw);
}
extern "C" __global__ void __launch_bounds__(32 * MVS_WARPS) mvs_memonly_q4_K(MVS_DENSE_ARGS) {
    mvs_dense<MVS_STAGES, false>(W, row_bytes, aq, cols, out, res, rows, rpw);
}

// Half-warp rows: lanes 0-15 take row r, 16-31 row r + 1, four lanes per super-block
// (group_dot_q4k<4>). Grid ceil(rows / (2 · MVS_WARPS)).
extern "C" __global__ void __launch_bounds__(32 * MVS_WARPS) mvh_q4_K(MVS_DENSE_ARGS) {
    pdl_trigger();
    int r = 2 * (blockIdx.x * MVS_WARPS + (threadIdx.x >> 5)) + ((threadIdx.x >> 4) & 1);
    bool on = r < rows;
    int rr = on ? r : rows - 1;
    pdl_wait();
    float y = group_dot_q4k<4>(W + (size_t)rr * row_bytes, aq, cols);
    if (on && (threadIdx.x & 15) == 0) out[r] = res ? __fadd_rn(res[r], y) : y;
}

// Whole-warp rows, four lanes per super-block (group_dot_q4k<8>), with lane 0 asking L2 for
// the row first when PREFETCH (cp.async.bulk.prefetch, as the production mat-vec did).
// Grid ceil(rows / MVS_WARPS).
template <bool PREFETCH>
__device__ __forceinline__ void mvw(MVS_DENSE_ARGS) {
    pdl_trigger();
    int r = blockIdx.x * MVS_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    if (PREFETCH && (threadIdx.x & 31) == 0) prefetch_l2(W + (size_t)r * row_bytes, row_bytes);
    pdl_wait();
    float y = group_dot_q4k<8>(W + (size_t)r * row_bytes, aq, cols);
    if ((threadIdx.x & 31) == 0) out[r] = res ? __fadd_rn(res[r], y) : y;
}
extern "C" __global__ void __launch_bounds__(32 * MVS_WARPS) mvw_q4_K(MVS_DENSE_ARGS) {
    mvw<false>(W, row_bytes, aq, cols, out, res, rows, rpw);
}
extern "C" __global__ void __launch_bounds__(32 * MVS_WARPS) mvwp_q4_K(MVS_DENSE_ARGS) {
    mvw<true>(W, row_bytes, aq, cols, out, res, rows, rpw);
}

// ---- Q6_K, four lanes per super-block (not yet timed) ----
// Lane part g (0..3) takes half n = g / 2, columns 16 (g % 2) .. + 16 of both 32-column
// groups e = 0, 1 of that half: q6k_part's parts (n, e, h) for e = 0 and 1, whose high bits
// share the same 16 qh bytes, so a lane loads ql twice and qh once (three 16-byte windows
// against the eight-lane loop's four per 64 weights) and scales by d once per 64 weights.
// Its integer sum is the two parts' sum exactly; the float steps differ from the eight-lane
// loop's by the grouping.
__device__ __forceinline__ int q6k_part4(const u8* __restrict__ blk, int g, const u8* __restrict__ aq,
                                         const short* __restrict__ bs) {
    int n = g >> 1, h = g & 1;
    u32 ql[2][4], qh[4];
    load16_a2(blk + 64 * n + 16 * h, ql[0]);
    load16_a2(blk + 64 * n + 32 + 16 * h, ql[1]);
    load16_a2(blk + 128 + 32 * n + 16 * h, qh);
    const signed char* sc = (const signed char*)(blk + 192);
    int sum = 0;
    #pragma unroll
    for (int e = 0; e < 2; e++) {
        u32 lo[4], hi[4];
        #pragma unroll
        for (int k = 0; k < 4; k++) {
            lo[k] = (ql[e][k] & 0x0F0F0F0Fu) | (((qh[k] >> (2 * e)) & 0x03030303u) << 4);
            hi[k] = ((ql[e][k] >> 4) & 0x0F0F0F0Fu) | (((qh[k] >> (2 * e + 4)) & 0x03030303u) << 4);
        }
        int jlo = 8 * n + 2 * e + h, jhi = jlo + 4;
        int dlo = dp4a4(lo, *(const int4*)(aq + 16 * jlo), 0) - 32 * (int)bs[jlo];
        int dhi = dp4a4(hi, *(const int4*)(aq + 16 * jhi), 0) - 32 * (int)bs[jhi];
        sum += (int)sc[jlo] * dlo + (int)sc[jhi] * dhi;
    }
    return sum;
}

// One Q6_K row by the whole warp in groups of four lanes: group j (lanes 4j .. 4j + 3) takes
// super-blocks j, j + 8, ... Grid ceil(rows / MVS_WARPS).
extern "C" __global__ void __launch_bounds__(32 * MVS_WARPS) mvw_q6_K(MVS_DENSE_ARGS) {
    pdl_trigger();
    int r = blockIdx.x * MVS_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    pdl_wait();
    int lane = threadIdx.x & 31, g = lane & 3;
    int nb = cols / QK_K;
    const float* ad = q8k_d(aq, cols);
    const short* bs = q8k_bsums(aq, cols);
    const u8* row = W + (size_t)r * row_bytes;
    float acc = 0.0f;
    #pragma unroll 2
    for (int b = lane >> 2; b < nb; b += 8) {
        const u8* blk = row + (size_t)b * 210;
        int sumi = q6k_part4(blk, g, aq + (size_t)b * QK_K, bs + 16 * b);
        float d = f16_to_f32(__ldg((const unsigned short*)(blk + 208)));
        acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(ad[b], d), (float)sumi));
    }
    float y = warp_sum(acc);
    if (lane == 0) out[r] = res ? __fadd_rn(res[r], y) : y;
}

// Q4_K rows regrouped for four-lane loads (the "g4" layout, kernel_lab repacks on the host):
// each run of four super-blocks (576 bytes) holds its four 16-byte headers, then the first
// 16 bytes of every (super-block j, quarter g) piece in (j, g) order, then their second 16
// bytes: piece (j, g) is q4k_load4's q0 / q1 for super-block j and part g. A half warp's
// lane (j, g) then reads its header, q0 and q1 with three instructions whose 16 lanes cover
// 64, 256 and 256 contiguous bytes, where the plain layout's four-lane loads spread each
// instruction over eight super-blocks (~10 L1 lines for 512 bytes; session 26: 76% L1/TEX
// throughput, slower than the eight-lane pair loop). The terms and their order are
// group_part_q4k<4>'s, so the result is moe_gate_up_h_q4_K's bit for bit. Rows must be a
// multiple of four super-blocks.
__device__ __forceinline__ float g4_part_q4k(const u8* __restrict__ row, const u8* __restrict__ a, int cols) {
    int lane = threadIdx.x & 15;
    int j = lane >> 2, g = lane & 3;
    int nr = cols / (4 * QK_K);
    const float* ad = q8k_d(a, cols);
    const short* bs = q8k_bsums(a, cols);
    Q4kLoad4 l[Q4K_BATCH];
    float acc = 0.0f;
    for (int r0 = 0; r0 < nr; r0 += Q4K_BATCH) {
        #pragma unroll
        for (int u = 0; u < Q4K_BATCH; u++) {
            if (r0 + u < nr) {
                const u8* grp = row + (size_t)(r0 + u) * 576;
                l[u].hd = ldw4(grp + 16 * j);
                l[u].q0 = ldw4(grp + 64 + 16 * lane);
                l[u].q1 = ldw4(grp + 320 + 16 * lane);
            }
        }
        #pragma unroll
        for (int u = 0; u < Q4K_BATCH; u++) {
            int b = 4 * (r0 + u) + j;
            if (r0 + u < nr) acc = q4k_acc4(acc, l[u], g, a + (size_t)b * QK_K, bs + 16 * b, ad[b]);
        }
    }
    return acc;
}

// The routing copy moe_down_q reads (ids then weights, K each), written by the first block's
// first K threads (`first`: this block is that block), as moe_gate_up_q does; every lab
// gate/up kernel does it after its wait.
__device__ __forceinline__ void lab_route_copy(bool first, const float* __restrict__ ids,
                                               const float* __restrict__ weights, float* __restrict__ route_copy,
                                               int K) {
    if (first && threadIdx.x < K) {
        route_copy[threadIdx.x] = ids[threadIdx.x];
        route_copy[K + threadIdx.x] = weights[threadIdx.x];
    }
}

// moe_gate_up_q with half warps: lanes 0-15 the gate row, 16-31 the up row, four lanes per
// super-block; G4: the experts in the g4 layout (Wg, Wu, Sg, Su regrouped; row_bytes and
// expert_bytes unchanged, the layout permutes bytes within each 576-byte run).
template <bool G4>
__device__ void gate_up_halves(const u8* __restrict__ Wg, const u8* __restrict__ Wu, u64 expert_bytes, u64 row_bytes,
                               const u8* __restrict__ Sg, const u8* __restrict__ Su, const u8* __restrict__ xq,
                               const float* __restrict__ ids, const float* __restrict__ weights,
                               float* __restrict__ route_copy, float* __restrict__ act, int I, int H, int K) {
    pdl_trigger();
    int r = blockIdx.x * MVS_WARPS + threadIdx.x / 32;
    int k = blockIdx.y;
    bool up = (threadIdx.x >> 4) & 1;
    if (k == K && r < I && (threadIdx.x & 15) == 0) prefetch_l2((up ? Su : Sg) + (size_t)r * row_bytes, row_bytes);
    pdl_wait();
    lab_route_copy(blockIdx.x == 0 && blockIdx.y == 0, ids, weights, route_copy, K);
    if (r >= I) return;
    const u8* w;
    if (k < K) w = (up ? Wu : Wg) + (size_t)__float_as_uint(ids[k]) * expert_bytes + (size_t)r * row_bytes;
    else w = (up ? Su : Sg) + (size_t)r * row_bytes;
    float y = group_sum<4>(G4 ? g4_part_q4k(w, xq, H) : group_part_q4k<4>(w, xq, H));
    float u = __shfl_sync(0xffffffffu, y, 16);
    if ((threadIdx.x & 31) == 0) act[(size_t)k * I + r] = silu_f(y) * u;
}

#define GATE_UP_HALVES(name, G4)                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * MVS_WARPS) name(                             \
        const u8* Wg, const u8* Wu, u64 expert_bytes, u64 row_bytes, const u8* Sg, const u8* Su,   \
        const u8* xq, const float* ids, const float* weights, float* route_copy, float* act, int I, \
        int H, int K) {                                                                            \
        gate_up_halves<G4>(Wg, Wu, expert_bytes, row_bytes, Sg, Su, xq, ids, weights, route_copy,  \
                           act, I, H, K);                                                          \
    }
GATE_UP_HALVES(moe_gate_up_h_q4_K, false)
GATE_UP_HALVES(moe_gate_up_g4_q4_K, true)

// moe_gate_up_q with warp_gate_up_q4k_rows<RPW, PIPE> (mmvq.cuh): RPW row pairs per warp,
// the activation pieces in registers. Grid (ceil(I / (RPW · MVS_WARPS)), K + 1), the shared
// expert as slot K; rows of at most 4 · Q4K_BATCH super-blocks.
template <int RPW, bool PIPE>
__device__ void gate_up_rows_q4k(const u8* __restrict__ Wg, const u8* __restrict__ Wu, u64 expert_bytes,
                                 u64 row_bytes, const u8* __restrict__ Sg, const u8* __restrict__ Su,
                                 const u8* __restrict__ xq, const float* __restrict__ ids,
                                 const float* __restrict__ weights, float* __restrict__ route_copy,
                                 float* __restrict__ act, int I, int H, int K) {
    pdl_trigger();
    int r0 = (blockIdx.x * MVS_WARPS + (threadIdx.x >> 5)) * RPW;
    int k = blockIdx.y;
    pdl_wait();
    lab_route_copy(blockIdx.x == 0 && blockIdx.y == 0, ids, weights, route_copy, K);
    if (r0 >= I) return;
    size_t e = k < K ? (size_t)__float_as_uint(ids[k]) * expert_bytes : 0;
    warp_gate_up_q4k_rows<RPW, PIPE>(k < K ? Wg + e : Sg, k < K ? Wu + e : Su, row_bytes, r0, I, xq, H,
                                     act + (size_t)k * I);
}

// One lab gate/up kernel: moe_gate_up_q's arguments handed to the device function given
// after the name (a template instance, hence variadic), at MINB blocks an SM.
#define GATE_UP_LAB(name, MINB, ...)                                                               \
    extern "C" __global__ void __launch_bounds__(32 * MVS_WARPS, MINB) name(                       \
        const u8* Wg, const u8* Wu, u64 expert_bytes, u64 row_bytes, const u8* Sg, const u8* Su,   \
        const u8* xq, const float* ids, const float* weights, float* route_copy, float* act, int I, \
        int H, int K) {                                                                            \
        __VA_ARGS__(Wg, Wu, expert_bytes, row_bytes, Sg, Su, xq, ids, weights, route_copy, act, I, \
                    H, K);                                                                         \
    }
#define GATE_UP_ROWS(name, RPW, PIPE) GATE_UP_LAB(name, 1, gate_up_rows_q4k<RPW, PIPE>)
GATE_UP_ROWS(moe_gate_up_r1_q4_K, 1, false)
GATE_UP_ROWS(moe_gate_up_r2_q4_K, 2, false)
GATE_UP_ROWS(moe_gate_up_r4_q4_K, 4, false)
GATE_UP_ROWS(moe_gate_up_r2p_q4_K, 2, true)
GATE_UP_ROWS(moe_gate_up_r4p_q4_K, 4, true)

// sm_90 bulk copies into shared memory, their completion counted on an mbarrier: the
// sequence CUTLASS's TMA pipelines use (cutlass/arch/barrier.h: init, arrive.expect_tx,
// cp.async.bulk with complete_tx, try_wait.parity), restated for gate_up_tma_q4k's one-shot
// blocks.
__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(u64* bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_to_smem(void* dst, const void* src, u32 bytes, u64* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
    asm volatile(
        "{\n"
        ".reg .pred P1;\n"
        "LAB_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        "@P1 bra DONE;\n"
        "bra LAB_WAIT;\n"
        "DONE:\n"
        "}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
}

// moe_gate_up_q's Q4_K product with its weights brought into shared memory by bulk copies
// (sm_90 cp.async.bulk, completion counted on an mbarrier), so a block's loads in flight are
// bounded by shared memory, not by the registers a warp holds them in. Session 29 found the
// register-staged gate/up's loads alone stream at 56-59% of the read floor (GU_MEMONLY): each
// warp holds one row pair (3.4 KB) in registers, ~55 KB per SM in flight. Here a block of
// four warps takes 4 · PPW consecutive rows of one slot; thread 0 issues, for each of PPW
// stages, one copy of the stage's four gate rows and one of its four up rows (each 4 ·
// row_bytes contiguous bytes), all at the block's start; warp w computes row 4s + w of stage
// s once that stage's barrier completes. PPW = 4: 55 KB a block, four blocks (221 KB) an SM.
// The terms and their order are warp_gate_up_q4k_rows<1>'s, so the output is moe_gate_up_q's
// bit for bit (kernel_lab checks). MEMONLY: the arithmetic replaced by a checksum of the words
// read from shared memory (GU_MEMONLY's question for this stream). Rows of at most
// 4 · Q4K_BATCH super-blocks (GUT_ROW bytes). Measured: bit-equal and not faster (the list at
// the top of this file).
#define GUT_ROW (4 * Q4K_BATCH * 144)
template <int PPW, bool MEMONLY>
__device__ void gate_up_tma_q4k(const u8* __restrict__ Wg, const u8* __restrict__ Wu, u64 expert_bytes,
                                u64 row_bytes, const u8* __restrict__ Sg, const u8* __restrict__ Su,
                                const u8* __restrict__ xq, const float* __restrict__ ids,
                                const float* __restrict__ weights, float* __restrict__ route_copy,
                                float* __restrict__ act, int I, int H, int K) {
    extern __shared__ __align__(128) u8 gut_sm[];
    constexpr int STAGE = 2 * 4 * GUT_ROW;
    u64* bar = (u64*)(gut_sm + PPW * STAGE);
    pdl_trigger();
    int k = blockIdx.y, r0 = blockIdx.x * 4 * PPW;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, p = lane & 7, j = lane >> 3;
    if (threadIdx.x == 0) {
        #pragma unroll
        for (int s = 0; s < PPW; s++) mbar_init(&bar[s], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    // The shared expert's rows are known before the wait; a routed slot's after it.
    if (k < K) pdl_wait();
    const u8* g = k < K ? Wg + (size_t)__float_as_uint(ids[k]) * expert_bytes : Sg;
    const u8* u = k < K ? Wu + (size_t)__float_as_uint(ids[k]) * expert_bytes : Su;
    if (threadIdx.x == 0) {
        #pragma unroll
        for (int s = 0; s < PPW; s++) {
            int r = r0 + 4 * s, n = min(4, I - r);
            if (n <= 0) break;
            u32 bytes = (u32)(n * row_bytes);
            mbar_expect_tx(&bar[s], 2 * bytes);
            bulk_to_smem(gut_sm + s * STAGE, g + (size_t)r * row_bytes, bytes, &bar[s]);
            bulk_to_smem(gut_sm + s * STAGE + 4 * GUT_ROW, u + (size_t)r * row_bytes, bytes, &bar[s]);
        }
    }
    if (k == K) pdl_wait();
    lab_route_copy(blockIdx.x == 0 && k == 0, ids, weights, route_copy, K);
    int nb = H / QK_K;
    Q8kPiece ap[Q4K_BATCH];
    q8k_lane_pieces<MEMONLY>(ap, xq, H, j, p);
    #pragma unroll
    for (int s = 0; s < PPW; s++) {
        int r = r0 + 4 * s + warp;
        if (r >= I) break;
        mbar_wait(&bar[s], 0);
        const u8* rows[2] = {gut_sm + s * STAGE + warp * row_bytes, gut_sm + s * STAGE + 4 * GUT_ROW + warp * row_bytes};
        Q4kLoad l[2][Q4K_BATCH];
        #pragma unroll
        for (int v = 0; v < Q4K_BATCH; v++) {
            int b = j + 4 * v;
            if (b < nb) {
                #pragma unroll
                for (int m = 0; m < 2; m++) {
                    const u8* blk = rows[m] + (size_t)b * 144;
                    l[m][v].hd = *(const uint4*)blk;
                    l[m][v].qs = *(const uint4*)(blk + 16 + 16 * p);
                }
            }
        }
        q4k_pair_swiglu<MEMONLY>(l, ap, j, nb, p, act + (size_t)k * I + r);
    }
}

#define GATE_UP_TMA(name, PPW, MEMONLY) GATE_UP_LAB(name, 4, gate_up_tma_q4k<PPW, MEMONLY>)
GATE_UP_TMA(moe_gate_up_t4_q4_K, 4, false)
GATE_UP_TMA(moe_gate_up_t4m_q4_K, 4, true)
GATE_UP_TMA(moe_gate_up_t2_q4_K, 2, false)
GATE_UP_TMA(moe_gate_up_t2m_q4_K, 2, true)

// moe_gate_up_q's product (mmvq.cu) streamed: act[k, r] = silu(gate_e[r] . x) · (up_e[r] . x)
// for slot k < K (e = ids[k]) and the shared expert as slot K (Sg, Su). The (K + 1)·I
// (slot, row) pairs are dealt out in runs of ppw to the grid's warps; a pair is its gate
// row's stages then its up row's. Block 0 copies ids and weights to route_copy as
// moe_gate_up_q does. Grid ceil((K + 1)·I / (ppw · MVS_WARPS)).
extern "C" __global__ void __launch_bounds__(32 * MVS_WARPS)
moe_gate_up_s_q4_K(const u8* __restrict__ Wg, const u8* __restrict__ Wu, u64 expert_bytes, u64 row_bytes,
                   const u8* __restrict__ Sg, const u8* __restrict__ Su, const u8* __restrict__ xq,
                   const float* __restrict__ ids, const float* __restrict__ weights, float* __restrict__ route_copy,
                   float* __restrict__ act, int I, int H, int K, int ppw) {
    __shared__ __align__(16) u8 ring[MVS_WARPS][MVS_STAGES][MVS_STAGE_BYTES];
    pdl_trigger();
    int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    int q0 = (blockIdx.x * MVS_WARPS + wi) * ppw;
    int nq = min(ppw, (K + 1) * I - q0);
    int nb = H / QK_K;
    int spr = (nb + MVS_CH - 1) / MVS_CH;
    int n = 2 * nq * spr;
    u8(*buf)[MVS_STAGE_BYTES] = ring[wi];
    // Stage i: pair q0 + i / (2 spr), its gate (h = 0) or up (h = 1) row, stage c.
    auto src = [&](int i, bool routed_ok) -> const u8* {
        int q = q0 + i / (2 * spr), h = (i / spr) & 1, c = i % spr;
        int k = q / I, r = q % I;
        size_t off = (size_t)r * row_bytes + (size_t)c * MVS_CH * 144;
        if (k == K) return (h ? Su : Sg) + off;
        if (!routed_ok) return nullptr;
        return (h ? Wu : Wg) + (size_t)__float_as_uint(ids[k]) * expert_bytes + off;
    };
    auto issue = [&](int i, const u8* s) {
        int c = i % spr, m = min(MVS_CH, nb - c * MVS_CH);
        warp_copy(buf[i % MVS_STAGES], s, m * 144, lane);
    };
    // Before pdl_wait only the shared expert's rows are known (ids come from the router).
    int pre = 0;
    if (nq > 0) {
        for (; pre < MVS_STAGES - 1 && pre < n; pre++) {
            const u8* s = src(pre, false);
            if (!s) break;
            issue(pre, s);
            cp_async_commit();
        }
    }
    pdl_wait();
    lab_route_copy(blockIdx.x == 0, ids, weights, route_copy, K);
    if (nq <= 0) return;
    for (int s = pre; s < MVS_STAGES - 1; s++) {
        if (s < n) issue(s, src(s, true));
        cp_async_commit();
    }
    const float* ad = q8k_d(xq, H);
    const short* bs = q8k_bsums(xq, H);
    float acc = 0.0f, g = 0.0f;
    for (int i = 0; i < n; i++) {
        if (i + MVS_STAGES - 1 < n) issue(i + MVS_STAGES - 1, src(i + MVS_STAGES - 1, true));
        cp_async_commit();
        cp_async_wait<MVS_STAGES - 1>();
        __syncwarp();
        int c = i % spr, b0 = c * MVS_CH;
        acc = mvs_stage_acc(acc, buf[i % MVS_STAGES], min(MVS_CH, nb - b0), b0, xq, ad, bs, lane);
        __syncwarp();
        if (c == spr - 1) {
            float y = warp_sum(acc);
            acc = 0.0f;
            if (((i / spr) & 1) == 0) {
                g = y;
            } else {
                int q = q0 + i / (2 * spr);
                if (lane == 0) act[q] = silu_f(g) * y;
            }
        }
    }
}

// ---- Float weights (W4A16's bf16 attention) ----
// Two questions about mv_bf16 (one warp per row, mmvq.cuh's lane_part_h, at ~2.3 TB/s on S
// 2.1's W4A16 decode, not yet profiled):
// - mvw2_bf16: two rows per warp (warp_parts2_h<WT_BF16, 1>), each pair of activation
//   float4s loaded once for both rows: do the f32 activation reads (twice the weight bytes,
//   through L1) limit it? Grid ceil(rows / 8).
// - mvx_bf16: the activation row staged in shared memory once per block, the warps reading it
//   there instead of through L1. Grid ceil(rows / 4), dynamic shared memory 4 · cols bytes
//   (LAB_MVX_MAX_COLS at most).
#define LAB_MVX_MAX_COLS 9216
extern "C" __global__ void __launch_bounds__(128) mvw2_bf16(const u8* W, u64 row_bytes, const float* x,
                                                             float* out, int rows, int cols) { PDL_ENTRY();
    int r0 = 2 * (blockIdx.x * 4 + threadIdx.x / 32);
    if (r0 >= rows) return;
    int r1 = min(r0 + 1, rows - 1);
    float2 y = warp_parts2_h<WT_BF16, 1>(W + (size_t)r0 * row_bytes, W + (size_t)r1 * row_bytes, (const u8*)x,
                                         cols, 0);
    if ((threadIdx.x & 31) == 0) {
        out[r0] = y.x;
        if (r0 + 1 < rows) out[r1] = y.y;
    }
}

extern "C" __global__ void __launch_bounds__(128) mvx_bf16(const u8* W, u64 row_bytes, const float* x,
                                                            float* out, int rows, int cols) { PDL_ENTRY();
    extern __shared__ __align__(16) float xs[];
    for (int i = 4 * threadIdx.x; i < cols; i += 4 * 128) *(float4*)(xs + i) = *(const float4*)(x + i);
    __syncthreads();
    int r = blockIdx.x * 4 + threadIdx.x / 32;
    if (r >= rows) return;
    float y = warp_sum(lane_part_h<WT_BF16>(W + (size_t)r * row_bytes, (const u8*)xs, cols));
    if ((threadIdx.x & 31) == 0) out[r] = y;
}

// Two more questions about mv_bf16's loop (lab_part_bf16: lane_part_h with the batch B and the
// piece stride as parameters; CS: weights loaded with the evict-first hint, ld.global.cs):
// - mvb{4,16}_bf16, mvb8cs_bf16: one warp per row as mv_bf16 (B = 8), with 4 or 16 pieces in
//   flight per lane, or 8 streamed past L1: do a warp's bytes in flight limit it?
// - mvk_bf16: one block per row, the row's pieces dealt over the block's four warps: more
//   warps per row, fewer rows in flight. Grid rows.
template <int B, bool CS>
__device__ __forceinline__ float lab_part_bf16(const u8* __restrict__ row, const float* __restrict__ x, int cols,
                                               int first, int step) {
    const uint4* w4 = (const uint4*)row;
    const float4* x4 = (const float4*)x;
    int n8 = cols / 8;
    float acc = 0.0f;
    for (int i0 = first; i0 < n8; i0 += step * B) {
        uint4 w[B];
        #pragma unroll
        for (int u = 0; u < B; u++) {
            int i = i0 + step * u;
            if (i < n8) w[u] = CS ? __ldcs(w4 + i) : __ldg(w4 + i);
        }
        #pragma unroll
        for (int u = 0; u < B; u++) {
            int i = i0 + step * u;
            if (i < n8) acc = h_dot8<WT_BF16>(w[u], x4[2 * i], x4[2 * i + 1], acc);
        }
    }
    return acc;
}

#define LAB_MVB(name, B, CS)                                                                              \
    extern "C" __global__ void __launch_bounds__(128) name(const u8* W, u64 row_bytes, const float* x,    \
                                                           float* out, int rows, int cols) { PDL_ENTRY(); \
        int r = blockIdx.x * 4 + threadIdx.x / 32;                                                        \
        if (r >= rows) return;                                                                            \
        float y = warp_sum(lab_part_bf16<B, CS>(W + (size_t)r * row_bytes, x, cols, threadIdx.x & 31, 32)); \
        if ((threadIdx.x & 31) == 0) out[r] = y;                                                          \
    }
LAB_MVB(mvb4_bf16, 4, false)
LAB_MVB(mvb16_bf16, 16, false)
LAB_MVB(mvb8cs_bf16, 8, true)

extern "C" __global__ void __launch_bounds__(128) mvk_bf16(const u8* W, u64 row_bytes, const float* x,
                                                            float* out, int rows, int cols) { PDL_ENTRY();
    int r = blockIdx.x;
    if (r >= rows) return;
    float y = warp_sum(lab_part_bf16<8, false>(W + (size_t)r * row_bytes, x, cols, threadIdx.x, 128));
    __shared__ float part[4];
    if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = y;
    __syncthreads();
    if (threadIdx.x == 0) out[r] = (part[0] + part[1]) + (part[2] + part[3]);
}

// ---- What a step's chain of dependent launches costs (kernel_lab --sync) ----
// The replayed decode step (BENCHMARKS.md, session 24's timeline) spends ~29 µs a layer in
// eight small launches, each waiting for the one before. Before building a persistent
// per-layer kernel, three costs to know on the H200:
// - lab_empty: a launch that only waits and triggers (PDL_ENTRY), chained in a CUDA graph
//   under programmatic launch: the bare cost of one dependent launch;
// - lab_hop: the same with a norm's work on one block (read 3,072 floats the launch before
//   wrote, reduce their squares, write them scaled): a small kernel's hop;
// - lab_barrier: one resident block per SM passing `rounds` grid barriers (an arrival
//   counter and a generation word), with `hop` != 0 one block doing lab_hop's work between
//   two barriers: what a persistent kernel would pay instead;
// - lab_wide: a wide launch (many blocks, each reading one float and writing it back), the
//   stand-in for a product kernel; chained as lab_wide -> lab_hop it is a product followed by
//   a small one-block launch;
// - lab_tail: lab_wide whose last block to finish (an arrival counter after a fence, the
//   counter reset by that block for the next launch) does lab_hop's work itself: the small
//   launch folded into the tail of the one before it.
extern "C" __global__ void __launch_bounds__(128) lab_empty() { PDL_ENTRY(); }

__device__ __forceinline__ void lab_norm_hop(const float* __restrict__ in, float* __restrict__ out, int n) {
    __shared__ float part[32];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += in[i] * in[i];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += part[w];
    float s = rsqrtf(t / (float)n + 1e-6f);
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i] * s;
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(1024) lab_hop(const float* in, float* out, int n) {
    PDL_ENTRY();
    lab_norm_hop(in, out, n);
}

extern "C" __global__ void __launch_bounds__(128) lab_wide(float* buf, int n) {
    PDL_ENTRY();
    if (threadIdx.x == 0) buf[blockIdx.x % n] += 1.0f;
}

extern "C" __global__ void __launch_bounds__(128) lab_tail(unsigned* count, float* buf, int n) {
    PDL_ENTRY();
    __shared__ unsigned last;
    if (threadIdx.x == 0) {
        buf[2 * n + blockIdx.x % n] += 1.0f;
        __threadfence();
        last = atomicAdd(count, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    lab_norm_hop(buf, buf + n, n);
    if (threadIdx.x == 0) *count = 0u;
}

// bar: [0] arrivals, [1] generation (zeroed by the host before a launch).
extern "C" __global__ void __launch_bounds__(1024) lab_barrier(unsigned* bar, float* buf, int n, int rounds, int hop) {
    __shared__ unsigned gen;
    if (threadIdx.x == 0) gen = *(volatile unsigned*)(bar + 1);
    __syncthreads();
    for (int r = 0; r < rounds; r++) {
        if (hop && blockIdx.x == (unsigned)r % gridDim.x)
            lab_norm_hop(buf + (size_t)(r & 1) * n, buf + (size_t)((r + 1) & 1) * n, n);
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned g = gen;
            __threadfence();
            if (atomicAdd(bar, 1u) == gridDim.x - 1) {
                *(volatile unsigned*)bar = 0u;
                __threadfence();
                atomicExch(bar + 1, g + 1);
            } else {
                while (*(volatile unsigned*)(bar + 1) == g) {
                }
            }
            __threadfence();
            gen = g + 1;
        }
        __syncthreads();
    }
}
