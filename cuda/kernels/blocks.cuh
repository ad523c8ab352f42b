// Quant block structs, mirroring lagoon-core's `#[repr(C)]` blocks (core/src/quant/*.rs)
// field by field. Scales are kept as raw fp16 bits (`unsigned short`) so the structs need no
// header and have the Rust layout: alignment 2, no padding. The Rust test
// `cuda/tests/nvrtc_compile.rs::block_layouts_agree` compiles static_asserts generated from
// `size_of`/`offset_of!` of the Rust structs against this header.
#pragma once

#define QK 32
#define QK_K 256

// ggml block_q8_0 (34 B): y[j] = d * qs[j].
struct block_q8_0 {
    unsigned short d;
    signed char qs[QK];
};

// ggml block_q4_K (144 B): 8 sub-blocks of 32, y = (d * sc) * q - dmin * m.
struct block_q4_K {
    unsigned short d;
    unsigned short dmin;
    unsigned char scales[12];
    unsigned char qs[QK_K / 2];
};

// ggml block_q6_K (210 B): 16 sub-blocks of 16, y = d * scales[i / 16] * (q - 32).
struct block_q6_K {
    unsigned char ql[QK_K / 2];
    unsigned char qh[QK_K / 4];
    signed char scales[QK_K / 16];
    unsigned short d;
};

// ggml block_q5_K (176 B): Q4_K plus a 5th bit per weight; element 32j + l of sub-block j
// takes bit j of qh[l]; y = (d * sc) * q - dmin * m with q = nibble + 16 * bit.
struct block_q5_K {
    unsigned short d;
    unsigned short dmin;
    unsigned char scales[12];
    unsigned char qh[QK_K / 8];
    unsigned char qs[QK_K / 2];
};

// ggml block_iq4_xs (136 B): 8 sub-blocks of 32 with 6-bit scales biased by 32 (low 4 bits in
// scales_l, high 2 in scales_h), codebook indices split by half-sub-block as in IQ4_NL;
// y = (d * (ls - 32)) * kvalues_iq4nl[q].
struct block_iq4_xs {
    unsigned short d;
    unsigned short scales_h;
    unsigned char scales_l[QK_K / 64];
    unsigned char qs[QK_K / 2];
};

// The device form of a 4-bit compressed-tensors (W4A16) matrix, repacked at upload
// (lagoon_cuda::weights::CT4_BLOCK_BYTES): 32 elements sharing one scale and zero point,
// y = rnd(rnd((q - 8) - z) * s) with rnd the scale dtype's rounding (compressed-tensors'
// dequantize in the scale dtype). No Rust struct mirrors it: the upload writes the bytes.
struct block_ct4 {
    unsigned short s;     // scale bits in the scale dtype
    signed char z;        // zero point (0 when symmetric)
    unsigned char dtype;  // WT_F16 or WT_BF16
    unsigned char q[16];  // codes 0..15, element 2i in the low nibble of q[i]
};

// The device form of an 8-bit compressed-tensors matrix (W8A16: pack-quantized 8-bit; W8A8:
// int-quantized I8), repacked at upload (lagoon_cuda::weights::CT8_BLOCK_BYTES): 32 elements
// sharing one scale and zero point, y = rnd(rnd(q - z) * s) with rnd the scale dtype's
// rounding, q the signed code (lagoon_core CtMatrix::int8_chunk).
struct block_ct8 {
    unsigned short s;     // scale bits in the scale dtype
    signed char z;        // zero point (0 when symmetric)
    unsigned char dtype;  // WT_F16 or WT_BF16
    signed char q[32];    // signed codes, element i in q[i]
};

static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");
static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");
static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");
static_assert(sizeof(block_ct4) == 20, "block_ct4 size");
static_assert(sizeof(block_ct8) == 36, "block_ct8 size");
static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");
static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs size");

// Weight encodings the kernels decode; the numbering is `lagoon_cuda::WType`'s.
#define WT_F32 0
#define WT_F16 1
#define WT_BF16 2
#define WT_Q8_0 3
#define WT_Q4_K 4
#define WT_Q6_K 5
#define WT_CT4 6
#define WT_Q5_K 7
#define WT_IQ4_XS 8
#define WT_IQ3_XXS 9
#define WT_IQ2_XXS 10
#define WT_IQ2_S 11
#define WT_CT8 12
