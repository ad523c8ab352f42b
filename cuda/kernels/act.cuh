// Activation quantisers for the integer mat-vec path (mmvq.cu): one f32 row in, one
// quantised row out, with the values of the CPU's quantisers (cpu-experts/src/kernels/act.rs,
// ggml's quantize_row_q8_K_ref / quantize_row_q8_0_ref) and the same struct-of-arrays layout,
// except that each row is padded to a multiple of 16 bytes (ACT_ROW_ALIGN) so every row's
// quants are 16-byte aligned:
//
//   Q8_K row (cols = 256 nb): qs:i8[cols] | d:f32[nb] | bsums:i16[16 nb] | pad
//   Q8_0 row (cols = 32 nb):  qs:i8[cols] | d:f32[nb] | ds:f32[nb] | pad
//
// A block holding a NaN gets d = NaN (as on the CPU), so the NaN reaches every dot.
#pragma once
#include "common.cuh"

// ggml's nearest_int: round to nearest, ties to even, through the f32 adder. The multiply
// before it is rounded on its own (__fmul_rn) so no FMA contraction changes a quant. A NaN
// gives 0 (the CPU's x86 result; the block's d is NaN anyway).
__device__ __forceinline__ int nearest_int(float v) {
    if (isnan(v)) return 0;
    int bits = __float_as_int(__fadd_rn(v, 12582912.0f));
    return (bits & 0x007FFFFF) - 0x00400000;
}

// Quantises 256-block b of a row (cols wide) into the Q8_K row `row`, from the block's
// values at xb (16-byte aligned): the calling warp does the whole block, lane l elements
// 8l .. 8l + 8.
__device__ __forceinline__ void warp_quantize_q8K(const float* __restrict__ xb, u8* __restrict__ row, int cols,
                                                  int b) {
    int lane = threadIdx.x & 31;
    int nb = cols / QK_K;
    xb += 8 * lane;
    float4 v0 = *(const float4*)xb, v1 = *(const float4*)(xb + 4);
    float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    // The first element of largest magnitude, with its sign; NaN never wins.
    float amax = 0.0f, mx = 0.0f;
    bool nan = false;
    #pragma unroll
    for (int j = 0; j < 8; j++) {
        nan |= isnan(v[j]);
        if (fabsf(v[j]) > amax) { amax = fabsf(v[j]); mx = v[j]; }
    }
    int first = lane;
    for (int o = 1; o < 32; o <<= 1) {
        float oa = __shfl_xor_sync(0xffffffffu, amax, o);
        float om = __shfl_xor_sync(0xffffffffu, mx, o);
        int of = __shfl_xor_sync(0xffffffffu, first, o);
        if (oa > amax || (oa == amax && of < first)) { amax = oa; mx = om; first = of; }
    }
    nan = __any_sync(0xffffffffu, nan);
    int q[8];
    float d;
    if (amax == 0.0f) {
        #pragma unroll
        for (int j = 0; j < 8; j++) q[j] = 0;
        d = 0.0f;
    } else {
        float iscale = __fdiv_rn(-127.0f, mx);
        #pragma unroll
        for (int j = 0; j < 8; j++) q[j] = min(127, nearest_int(__fmul_rn(iscale, v[j])));
        d = __fdiv_rn(1.0f, iscale);
    }
    if (nan) d = __int_as_float(0x7fc00000);
    u32 lo = 0, hi = 0;
    #pragma unroll
    for (int j = 0; j < 4; j++) {
        lo |= ((u32)q[j] & 0xFF) << (8 * j);
        hi |= ((u32)q[j + 4] & 0xFF) << (8 * j);
    }
    *(uint2*)(row + (size_t)b * QK_K + 8 * lane) = make_uint2(lo, hi);
    // Group j of 16 = lanes 2j and 2j + 1.
    int s = 0;
    #pragma unroll
    for (int j = 0; j < 8; j++) s += q[j];
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    if (lane == 0) ((float*)(row + cols))[b] = d;
    if ((lane & 1) == 0) ((short*)(row + cols + 4 * nb))[16 * b + lane / 2] = (short)s;
}

// Quantises 32-block b of a row into the Q8_0 row `row` from the block's values at xb (16-byte
// aligned), by the eight lanes of an aligned group (lanes 8j .. 8j + 7 of the warp), lane g
// taking elements 4g .. 4g + 4. Every lane of the warp calls it (the shuffles span the whole
// warp); a group with live false (past the end) reads and writes nothing. d = fp16(amax /
// 127) widened back to f32, q = roundf(x * id) (ties away from zero) with id = 1 / d taken
// before the fp16 rounding, ds = d * sum q.
// amax is ggml's fold amax = amax > |x| ? amax : |x| in element order, NaN included: a NaN
// replaces amax and the element after it replaces the NaN, so the fold ends at the largest
// magnitude after the block's last NaN (NaN when the NaN is the block's last element), and
// without NaN at the largest magnitude. Computed that way here, so the quants equal the
// CPU's (quantize_block_q8_0) even for a block holding NaN.
// Why eight lanes and not one thread per block: with one thread per block each thread's 32
// elements were a serial chain, and the W4A16 decode step's routed quantiser (320 blocks)
// showed 6.7 µs on the replayed step's critical path against 3.0 for Q8_K's warp-wide one.
// Measured on the H200 (session 28): tg64 248.97 / 249.03 t/s against 248.31 / 248.06
// (+0.3%); traced, the FFN norm's Q8_0 copy (rms_norm_q8_0) 3.17 -> 2.69 µs, but the routed
// quantiser still 6.7: that launch's share of the critical path is not its own work (the
// down kernel's weight loads, issued before its wait, are in flight through it).
// CG: the group is read from L2 (ld.global.cg), for values other blocks of a cluster wrote
// (moe_gate_up_q's QOUT).
template <bool CG = false>
__device__ __forceinline__ void group_quantize_q8_0(const float* __restrict__ xb, u8* __restrict__ row, int cols,
                                                    int b, bool live) {
    int g = threadIdx.x & 7;
    int nb = cols / QK;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (live) {
        float4 t = CG ? __ldcg((const float4*)(xb + 4 * g)) : *(const float4*)(xb + 4 * g);
        v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    }
    int last = -1;
    #pragma unroll
    for (int j = 0; j < 4; j++)
        if (isnan(v[j])) last = 4 * g + j;
    #pragma unroll
    for (int o = 1; o < 8; o <<= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
    float amax = 0.0f;
    #pragma unroll
    for (int j = 0; j < 4; j++)
        if (4 * g + j > last) amax = fmaxf(amax, fabsf(v[j]));
    #pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (last == QK - 1) amax = __int_as_float(0x7fc00000);
    float d = __fdiv_rn(amax, 127.0f);
    float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    int sum = 0;
    u32 wv = 0;
    #pragma unroll
    for (int j = 0; j < 4; j++) {
        float t = __fmul_rn(v[j], id);
        int q = isnan(t) ? 0 : (int)roundf(t);
        q = max(-128, min(127, q));
        sum += q;
        wv |= ((u32)q & 0xFF) << (8 * j);
    }
    #pragma unroll
    for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (!live) return;
    ((u32*)(row + (size_t)b * QK))[g] = wv;
    if (g == 0) {
        float dh = __half2float(__float2half_rn(d));
        if (last >= 0) dh = __int_as_float(0x7fc00000);
        ((float*)(row + cols))[b] = dh;
        ((float*)(row + cols + 4 * nb))[b] = __fmul_rn(dh, (float)sum);
    }
}
