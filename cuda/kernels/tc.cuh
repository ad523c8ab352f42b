// Tensor-core and asynchronous-copy helpers shared by the prefill products (gemm.cu,
// gemm_rf.cu) and the kernel lab: f16 packing, the m16n8k16 mma, ldmatrix, and cp.async
// (16-byte global-to-shared copies in commit groups; PTX ISA "cp.async").
#pragma once
#include "common.cuh"

__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *(u32*)&h;
}

// Two f32 rounded to bf16 (round to nearest even; PTX cvt.rn.bf16x2.f32, sm_80): `lo` in the
// low half.
__device__ __forceinline__ u32 cvt_bf16x2(float lo, float hi) {
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
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

// Four 8x8 f16 matrices from shared memory (ldmatrix.x4): lane l gives the address of row
// l % 8 of matrix l / 8 and receives, of each matrix i, row l / 4, columns 2 (l % 4) .. + 2 in
// r[i] -- the mma fragment layout.
__device__ __forceinline__ void ldmatrix_x4(u32 r[4], const unsigned short* p) {
    u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// A 16-byte copy from global to shared memory that completes asynchronously (L2 only: .cg).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    u32 s = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}
// An 8-byte copy (src and dst 8-byte aligned; through L1: .ca, the only kind for 8 bytes).
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
    u32 s = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
