// Helpers shared by every kernel: fp16/bf16 loads, warp reductions, the step parameters.
#pragma once
#include <cuda_fp16.h>
#include "blocks.cuh"

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

// The step parameters live in device memory (written once per step before any launch), so a
// captured CUDA graph replays with the new position: p[0] = first position, p[1] = number
// of tokens, p[2..2 + n] = token ids.
#define P_POS0 0
#define P_NTOK 1
#define P_TOKENS 2

// +infinity without <math_constants.h>.
#define LG_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float f16_to_f32(unsigned short bits) {
    return __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ float bf16_to_f32(unsigned short bits) {
    return __uint_as_float(((u32)bits) << 16);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// torch's softplus with threshold 20 (lagoon_core::ops::softplus).
__device__ __forceinline__ float softplus_f(float z) { return z > 20.0f ? z : log1pf(expf(z)); }

// 1 / (1 + exp(-z)), as lagoon_core::ops::sigmoid.
__device__ __forceinline__ float sigmoid_f(float z) { return 1.0f / (1.0f + expf(-z)); }

// z * sigmoid(z) written as z / (1 + exp(-z)), as lagoon_core::ops::silu.
__device__ __forceinline__ float silu_f(float z) { return z / (1.0f + expf(-z)); }

// x with finite values beyond f16's range saturated to +-65504 (so that rounding to f16 gives
// the largest finite f16, not infinity); infinities and NaN pass through.
__device__ __forceinline__ float f16_sat(float v) {
    float a = fabsf(v);
    return a > 65504.0f && a < LG_INF ? copysignf(65504.0f, v) : v;
}

// An element of the KV cache: f32 (`float`), f16 bits (`unsigned short`) or bf16 bits
// (`kv_bf16`; the session's `KvCache` option). f16 stores round to nearest from f16_sat(v), as
// the tensor-core kernels round their operands, so an f16 cache holds exactly the values
// flash.cu computed with; bf16 stores round to nearest even (NaN stays NaN). F16: the
// elements are f16, which flash.cu's staging copies as they are (the others convert).
template <typename KV> struct Kv;
struct kv_bf16 {
    unsigned short bits;
};
__device__ __forceinline__ unsigned short f32_to_bf16_rn(float v) {
    u32 u = __float_as_uint(v);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
// F16: the cache holds f16 values (flash.cu stages them as they are); BF16: it holds bf16
// values (flash.cu copies them as they are and converts them in shared memory); Q8: q8_0
// blocks (kv_q8 below; only the store kernels and flash.cu take it).
template <> struct Kv<float> {
    static constexpr bool F16 = false;
    static constexpr bool BF16 = false;
    static constexpr bool Q8 = false;
    static __device__ __forceinline__ float ld(const float* p) { return *p; }
    static __device__ __forceinline__ void st(float* p, float v) { *p = v; }
    // What ld returns after st(v).
    static __device__ __forceinline__ float round(float v) { return v; }
    // Four consecutive values (p 16-byte aligned).
    static __device__ __forceinline__ float4 ld4(const float* p) { return *(const float4*)p; }
    // Two consecutive values (p 8-byte aligned).
    static __device__ __forceinline__ float2 ld2(const float* p) { return *(const float2*)p; }
};
template <> struct Kv<unsigned short> {
    static constexpr bool F16 = true;
    static constexpr bool BF16 = false;
    static constexpr bool Q8 = false;
    static __device__ __forceinline__ float ld(const unsigned short* p) { return f16_to_f32(*p); }
    static __device__ __forceinline__ void st(unsigned short* p, float v) {
        *p = __half_as_ushort(__float2half_rn(f16_sat(v)));
    }
    static __device__ __forceinline__ float round(float v) {
        return f16_to_f32(__half_as_ushort(__float2half_rn(f16_sat(v))));
    }
    // Four consecutive values (p 8-byte aligned).
    static __device__ __forceinline__ float4 ld4(const unsigned short* p) {
        uint2 u = *(const uint2*)p;
        return make_float4(f16_to_f32((unsigned short)(u.x & 0xFFFF)), f16_to_f32((unsigned short)(u.x >> 16)),
                           f16_to_f32((unsigned short)(u.y & 0xFFFF)), f16_to_f32((unsigned short)(u.y >> 16)));
    }
    // Two consecutive values (p 4-byte aligned).
    static __device__ __forceinline__ float2 ld2(const unsigned short* p) {
        u32 u = *(const u32*)p;
        return make_float2(f16_to_f32((unsigned short)(u & 0xFFFF)), f16_to_f32((unsigned short)(u >> 16)));
    }
};
template <> struct Kv<kv_bf16> {
    static constexpr bool F16 = false;
    static constexpr bool BF16 = true;
    static constexpr bool Q8 = false;
    static __device__ __forceinline__ float ld(const kv_bf16* p) { return bf16_to_f32(p->bits); }
    static __device__ __forceinline__ void st(kv_bf16* p, float v) { p->bits = f32_to_bf16_rn(v); }
    static __device__ __forceinline__ float round(float v) { return bf16_to_f32(f32_to_bf16_rn(v)); }
    // Four consecutive values (p 8-byte aligned).
    static __device__ __forceinline__ float4 ld4(const kv_bf16* p) {
        uint2 u = *(const uint2*)p;
        return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xFFFF0000u),
                           __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xFFFF0000u));
    }
    // Two consecutive values (p 4-byte aligned).
    static __device__ __forceinline__ float2 ld2(const kv_bf16* p) {
        u32 u = *(const u32*)p;
        return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xFFFF0000u));
    }
};

// The q8_0 KV cache (session.rs KvCache::Q8_0): a layer's K (or V) ring is a plane of cap
// rows of `row` int8 quants, followed by the plane's f16 scales, one per 32 consecutive
// elements of a row (element e of the plane: quant plane[e], scale scales[e / 32]; the scales
// start at byte cap * row, row a multiple of 32). Each block of 32 is quantised as ggml's
// quantize_row_q8_0_ref quantises (ggml-quants.c; restated): d = amax / 127, q = roundf(x / d)
// through id = 1 / d (0 when d is 0), d stored rounded to f16 — the Q8_0 activation
// quantiser's arithmetic (act.cuh group_quantize_q8_0). A value reads back as f16(d) * q.
struct kv_q8 {
    signed char q;
};
template <> struct Kv<kv_q8> {
    static constexpr bool F16 = false;
    static constexpr bool BF16 = false;
    static constexpr bool Q8 = true;
};
__device__ __forceinline__ unsigned short* kvq8_scales(kv_q8* plane, int cap, int row) {
    return (unsigned short*)((unsigned char*)plane + (size_t)cap * row);
}
__device__ __forceinline__ const unsigned short* kvq8_scales(const kv_q8* plane, int cap, int row) {
    return (const unsigned short*)((const unsigned char*)plane + (size_t)cap * row);
}
// Warp-wide: lane l's value x is element e0 + l of the plane (e0 a multiple of 32; all 32
// lanes take part). A NaN in the block stores a NaN scale (every value reads back NaN).
__device__ __forceinline__ void kvq8_store_warp(kv_q8* plane, int cap, int row, size_t e0, float x) {
    int lane = threadIdx.x & 31;
    bool nan = __any_sync(0xffffffffu, isnan(x));
    float amax = warp_max(fabsf(x));
    float d = __fdiv_rn(amax, 127.0f);
    float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    float t = __fmul_rn(x, id);
    int q = isnan(t) ? 0 : (int)roundf(t);
    plane[e0 + lane].q = (signed char)max(-128, min(127, q));
    if (lane == 0) kvq8_scales(plane, cap, row)[e0 / 32] = nan ? (unsigned short)0x7E00 : __half_as_ushort(__float2half_rn(d));
}

// Programmatic dependent launch (sm_90; see device.rs): a kernel launched with the
// programmatic-serialization attribute may start while the kernel before it in the stream
// is still running. pdl_wait blocks until that kernel has finished and its writes are
// visible (so it must come before the first read of anything an earlier kernel wrote, and
// before the first write of anything an earlier kernel reads); pdl_trigger lets the next
// kernel be scheduled. Both are no-ops in a launch without the attribute.
//
// LAGOON_TRACE (a kernel-lab define, with LAGOON_CUDA_TRACE naming the output file; trace.rs):
// thread 0 of block (0, 0, 0) appends a record at each of these points -- the trigger, the
// start and the end of the wait -- to the buffer the host points `lagoon_trace` at (one such
// global per module): word 0 counts the records, record i is the four words from 1 + 4i:
// the launch's %gridid, the %globaltimer nanoseconds shifted left by two with the point's
// kind (0 trigger, 1 wait start, 2 wait end) below, the grid's x and y and the block size
// (x | y << 24 | block << 48), and 0. Off (no define), the hooks compile to nothing.
#ifdef LAGOON_TRACE
#define LAGOON_TRACE_CAP (1u << 20)
extern "C" {
__device__ unsigned long long* lagoon_trace = nullptr;
}
__device__ __forceinline__ void trace_mark(unsigned kind) {
    if ((threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) != 0) return;
    unsigned long long* b = lagoon_trace;
    if (b == nullptr) return;
    unsigned long long t, g;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
    unsigned long long i = atomicAdd(b, 1ull);
    if (i >= LAGOON_TRACE_CAP) return;
    unsigned long long* r = b + 1 + 4 * i;
    r[0] = g;
    r[1] = (t << 2) | kind;
    r[2] = (unsigned long long)gridDim.x | ((unsigned long long)gridDim.y << 24) |
           ((unsigned long long)blockDim.x << 48);
    r[3] = 0;
}
#else
__device__ __forceinline__ void trace_mark(unsigned) {}
#endif
__device__ __forceinline__ void pdl_wait() {
    trace_mark(1);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    trace_mark(2);
}
__device__ __forceinline__ void pdl_trigger() {
    trace_mark(0);
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Every thread of every block of the thread-block cluster (sm_90) arrives, then waits for
// the rest: the writes (global memory included) each made before its arrive are visible to
// every thread of the cluster after its wait (release / acquire at cluster scope). Every
// thread of the cluster must reach it: no thread may have returned before.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The two halves, for a thread that arrives and leaves without waiting (a wait counts the
// cluster's threads that have not exited). Whole warps (aligned).
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The start of every kernel that may run under programmatic launch and reads nothing before
// it: wait for the kernel before, then let the next one be scheduled (its blocks take their
// places and wait, so its start costs no launch gap).
// (Lab switch PDL_LATE: no trigger, so the next kernel is scheduled only as this one's
// blocks exit -- for measuring what the next kernel's early weight loads cost a small
// kernel's own loads.)
#ifdef PDL_LATE
#define PDL_ENTRY() pdl_wait()
#else
#define PDL_ENTRY()   \
    do {              \
        pdl_wait();   \
        pdl_trigger(); \
    } while (0)
#endif

// Asks for bytes [p, p + n) of global memory to be brought into L2 (Hopper's bulk prefetch:
// nothing is returned and nothing waits for it). Only whole 16-byte units inside the range
// are named, so the range must simply lie inside one allocation. For weights, which no
// kernel writes: a kernel may prefetch its weights before pdl_wait.
__device__ __forceinline__ void prefetch_l2(const void* p, u64 n) {
    u64 a = (u64)__cvta_generic_to_global(p);
    u64 lo = (a + 15) & ~15ull, hi = (a + n) & ~15ull;
    if (hi > lo)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(lo), "r"((u32)(hi - lo)) : "memory");
}
