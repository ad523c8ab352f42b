// Sampling on the device: greedy decoding without a host round trip per token.
//
// `argmax_feed` closes a captured decode graph (session.rs `decode_greedy`): it picks the
// step's token from the logits as `lagoon_core::sample::argmax` does -- the first position
// of the largest value, NaN never chosen over a number, 0 when every logit is NaN -- and
// feeds it to the next step by writing it where the step reads its token (params[2]) and
// advancing the position (params[0] += 1), so the host can queue graph replays back to
// back and read the tokens once at the end. It also appends the token to out (out[0]
// counts, out[1 + i] is the i-th token).
//
// Each (value, position) is one 64-bit key that orders as the pair does: the float's bits
// mapped so unsigned order is float order (negatives inverted, the sign bit set on the
// rest; -0 taken as +0), then the position complemented so the first one wins a tie; NaN
// is key 0, below every number. Each block reduces its stretch of the logits to its best
// key and atomicMax-es it into state[0]; the last block to finish (state[1] counts them,
// after a fence) reads the winner, writes the token and resets both words for the next
// launch. Grid ceil(n / ARGMAX_SPAN) blocks of ARGMAX_THREADS.
#include "common.cuh"

#define ARGMAX_THREADS 256
#define ARGMAX_SPAN 4096

__device__ __forceinline__ unsigned long long argmax_key(float v, unsigned i) {
    if (isnan(v)) return 0ull;
    u32 b = v == 0.0f ? 0u : __float_as_uint(v);
    u32 o = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((unsigned long long)o << 32) | (unsigned long long)(0xFFFFFFFFu - i);
}

__device__ __forceinline__ unsigned long long max_key(unsigned long long a, unsigned long long b) {
    return a > b ? a : b;
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_feed(const float* __restrict__ logits, int n, unsigned long long* state, u32* params, u32* out) {
    PDL_ENTRY();
    __shared__ unsigned long long best[ARGMAX_THREADS / 32];
    __shared__ bool last;
    int lo = blockIdx.x * ARGMAX_SPAN, hi = min(n, lo + ARGMAX_SPAN);
    unsigned long long k = 0;
    for (int i = lo + threadIdx.x; i < hi; i += ARGMAX_THREADS) k = max_key(k, argmax_key(logits[i], (unsigned)i));
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) k = max_key(k, __shfl_xor_sync(0xffffffffu, k, o));
    if ((threadIdx.x & 31) == 0) best[threadIdx.x >> 5] = k;
    __syncthreads();
    if (threadIdx.x == 0) {
        #pragma unroll
        for (int w = 1; w < ARGMAX_THREADS / 32; w++) k = max_key(k, best[w]);
        atomicMax(state, k);
        __threadfence();
        last = atomicAdd((unsigned*)(state + 1), 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x != 0) return;
    __threadfence();
    unsigned long long w = atomicMax(state, 0ull);
    u32 token = w == 0ull ? 0u : 0xFFFFFFFFu - (u32)(w & 0xFFFFFFFFu);
    params[2] = token;
    params[0] += 1;
    u32 c = out[0];
    out[1 + c] = token;
    out[0] = c + 1;
    state[0] = 0ull;
    state[1] = 0ull;
}
