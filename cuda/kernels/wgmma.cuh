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

// D (m64 x nN, f32) += A (m64 x k16, f16, registers) B (k16 x nN, f16, shared memory at
// descriptor `b`, K-major; scale-d 1: accumulate), for N = 64, 96, 128: wgmma_m64nN(d, a, b)
// with d this thread's N / 2 accumulators in the m16n8 tiles' order. WGMMA_RS(N, operands,
// accumulator placeholders, A placeholders, descriptor, scale-d source) declares one.
#define WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
    "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_D32 WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
#define WG_D48 WG_D32, WG_D8(32), WG_D8(40)
#define WG_D64 WG_D48, WG_D8(48), WG_D8(56)
#ifdef LG_WGMMA
#define WGMMA_RS(N, OPS, DREGS, AREGS, DESC, PRED)                                                   \
    __device__ __forceinline__ void wgmma_m64n##N(float* d, const u32 a[4], u64 b) {                 \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                               \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.f16.f16 {" DREGS "}, {" AREGS "}, " \
                     DESC ", p, 1, 1, 0;\n"                                                           \
                     "}\n"                                                                            \
                     : OPS                                                                            \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                   \
    }
#else
#define WGMMA_RS(N, OPS, DREGS, AREGS, DESC, PRED)                                                   \
    __device__ __forceinline__ void wgmma_m64n##N(float*, const u32*, u64) { __trap(); }
#endif
WGMMA_RS(64, WG_D32,
         "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31",
         "%32, %33, %34, %35", "%36", "%37")
WGMMA_RS(96, WG_D48,
         "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47",
         "%48, %49, %50, %51", "%52", "%53")
WGMMA_RS(128, WG_D64,
         "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63",
         "%64, %65, %66, %67", "%68", "%69")
