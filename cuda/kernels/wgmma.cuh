// Hopper warpgroup MMA (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate
// Instructions": wgmma.mma_async, sm_90a only) with A in registers and B in shared memory, for
// gemm_rf.cu's wgmma mainloop. The four warps of a warpgroup issue each wgmma together; warp
// i of the group holds rows 16 i .. 16 i + 16 of the m64 tile, its A fragment and accumulators
// laid out as for mma.sync m16n8k16 (one m16n8 accumulator tile per 8 columns of n).
//
// B is "K-major" (each of the n columns, here a token, has its k values contiguous) in the
// 128-byte swizzled layout: atoms of 8 columns x 128 bytes (64 f16 of k), 1024-byte aligned,
// the 16-byte chunk c of column r of an atom stored at chunk c ^ r; atoms of the next 8
// columns 1024 bytes on (the descriptor's stride). A k16 step at k offset 16 s inside the
// 128-byte row is the atom's descriptor plus 32 s bytes. (Layout and descriptor fields as in
// CUTLASS cute/arch/mma_sm90_desc.hpp and its GMMA K-major SW128 atoms.)
//
// Compiled for plain sm_90 (or any other target) the wrappers trap: the session only takes
// the wgmma kernels on a device that NVRTC compiled gemm_rf.cu for as sm_90a.
#pragma once
#include "common.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LG_WGMMA 1
#endif

// The shared-memory descriptor of a K-major, 128-byte-swizzled B operand starting at shared
// address `saddr` (an atom's first byte, or 32 s bytes past it for k16 step s): start address
// >> 4 in bits 0..13, leading byte offset (unused by swizzled K-major layouts; 16 bytes, >> 4 =
// 1) in bits 16..29, stride byte offset (1024 >> 4) in bits 32..45, base offset 0 (atoms are
// 1024-byte aligned), layout type 1 (128-byte swizzle) in bits 62..63.
__device__ __forceinline__ u64 wg_desc(u32 saddr) {
    return (u64)((saddr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

// Orders this thread's earlier register writes (A fragments, zeroed accumulators) before the
// warpgroup's next wgmma reads them.
__device__ __forceinline__ void wg_fence() {
#ifdef LG_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}
// Closes the group of wgmmas issued since the last commit.
__device__ __forceinline__ void wg_commit() {
#ifdef LG_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed groups are still in flight (their A registers and
// accumulators are then free).
template <int N>
__device__ __forceinline__ void wg_wait() {
#ifdef LG_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Makes this thread's shared-memory writes (cp.async included) visible to the async proxy the
// wgmma operand reads go through; then a barrier, then the wgmma.
__device__ __forceinline__ void wg_proxy_fence() {
#ifdef LG_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// D (m64 x n64, f32) += A (m64 x k16, f16, registers) B (k16 x n64, f16, shared memory at
// descriptor `b`, K-major; scale-d 1: accumulate); d is this thread's 32 accumulators in the m16n8 tiles' order.
__device__ __forceinline__ void wgmma_m64n64(float* d, const u32 a[4], u64 b) {
#ifdef LG_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
        "}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
#else
    __trap();
#endif
}

// D (m64 x n128, f32) += A (m64 x k16, f16, registers) B (k16 x n128, f16, shared memory at
// descriptor `b`, K-major; scale-d 1: accumulate); d is this thread's 64 accumulators in the m16n8 tiles' order.
__device__ __forceinline__ void wgmma_m64n128(float* d, const u32 a[4], u64 b) {
#ifdef LG_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
        "}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
#else
    __trap();
#endif
}

// D (m64 x n96, f32) += A (m64 x k16, f16, registers) B (k16 x n96, f16, shared memory at
// descriptor `b`, K-major; scale-d 1: accumulate); d is this thread's 48 accumulators in the m16n8 tiles' order.
__device__ __forceinline__ void wgmma_m64n96(float* d, const u32 a[4], u64 b) {
#ifdef LG_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%48, %49, %50, %51}, %52, p, 1, 1, 0;\n"
        "}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
#else
    __trap();
#endif
}
