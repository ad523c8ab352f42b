//! The kernel manifest: every kernel the backend launches, by enum, with its source file and
//! symbol. Loaded once at device init into a table indexed by the enum, so the hot path never
//! looks a kernel up by name.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};

use crate::compile;
use crate::error::CudaError;

macro_rules! manifest {
    ($($v:ident => $file:literal, $name:literal;)*) => {
        /// A kernel of the manifest.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum K { $($v),* }

        /// `(kernel, source file, symbol)` for every kernel, in enum order.
        pub const MANIFEST: &[(K, &str, &str)] = &[$((K::$v, $file, $name)),*];
    };
}

manifest! {
    MatmulF32 => "matmul.cu", "matmul_f32";
    MatmulF16 => "matmul.cu", "matmul_f16";
    MatmulBf16 => "matmul.cu", "matmul_bf16";
    MatmulQ8_0 => "matmul.cu", "matmul_q8_0";
    MatmulQ4K => "matmul.cu", "matmul_q4_K";
    MatmulQ6K => "matmul.cu", "matmul_q6_K";
    MatmulCt4 => "matmul.cu", "matmul_ct4";
    MatmulQ5K => "matmul.cu", "matmul_q5_K";
    MatmulIq4Xs => "matmul.cu", "matmul_iq4_xs";
    MatmulIq3Xxs => "matmul.cu", "matmul_iq3_xxs";
    MatmulIq2Xxs => "matmul.cu", "matmul_iq2_xxs";
    MatmulIq2S => "matmul.cu", "matmul_iq2_s";
    MatmulCt8 => "matmul.cu", "matmul_ct8";
    EmbedF32 => "matmul.cu", "embed_f32";
    EmbedF16 => "matmul.cu", "embed_f16";
    EmbedBf16 => "matmul.cu", "embed_bf16";
    EmbedQ8_0 => "matmul.cu", "embed_q8_0";
    EmbedQ4K => "matmul.cu", "embed_q4_K";
    EmbedQ6K => "matmul.cu", "embed_q6_K";
    EmbedCt4 => "matmul.cu", "embed_ct4";
    EmbedQ5K => "matmul.cu", "embed_q5_K";
    EmbedIq4Xs => "matmul.cu", "embed_iq4_xs";
    EmbedIq3Xxs => "matmul.cu", "embed_iq3_xxs";
    EmbedIq2Xxs => "matmul.cu", "embed_iq2_xxs";
    EmbedIq2S => "matmul.cu", "embed_iq2_s";
    EmbedCt8 => "matmul.cu", "embed_ct8";
    GateUpF32 => "moe.cu", "moe_gate_up_f32";
    GateUpF16 => "moe.cu", "moe_gate_up_f16";
    GateUpBf16 => "moe.cu", "moe_gate_up_bf16";
    GateUpQ8_0 => "moe.cu", "moe_gate_up_q8_0";
    GateUpQ4K => "moe.cu", "moe_gate_up_q4_K";
    GateUpQ6K => "moe.cu", "moe_gate_up_q6_K";
    GateUpCt4 => "moe.cu", "moe_gate_up_ct4";
    GateUpQ5K => "moe.cu", "moe_gate_up_q5_K";
    GateUpIq4Xs => "moe.cu", "moe_gate_up_iq4_xs";
    GateUpIq3Xxs => "moe.cu", "moe_gate_up_iq3_xxs";
    GateUpIq2Xxs => "moe.cu", "moe_gate_up_iq2_xxs";
    GateUpIq2S => "moe.cu", "moe_gate_up_iq2_s";
    GateUpCt8 => "moe.cu", "moe_gate_up_ct8";
    DownF32 => "moe.cu", "moe_down_f32";
    DownF16 => "moe.cu", "moe_down_f16";
    DownBf16 => "moe.cu", "moe_down_bf16";
    DownQ8_0 => "moe.cu", "moe_down_q8_0";
    DownQ4K => "moe.cu", "moe_down_q4_K";
    DownQ6K => "moe.cu", "moe_down_q6_K";
    DownCt4 => "moe.cu", "moe_down_ct4";
    DownQ5K => "moe.cu", "moe_down_q5_K";
    DownIq4Xs => "moe.cu", "moe_down_iq4_xs";
    DownIq3Xxs => "moe.cu", "moe_down_iq3_xxs";
    DownIq2Xxs => "moe.cu", "moe_down_iq2_xxs";
    DownIq2S => "moe.cu", "moe_down_iq2_s";
    DownCt8 => "moe.cu", "moe_down_ct8";
    GateUpGroupedF32 => "moe.cu", "moe_gate_up_grouped_f32";
    GateUpGroupedF16 => "moe.cu", "moe_gate_up_grouped_f16";
    GateUpGroupedBf16 => "moe.cu", "moe_gate_up_grouped_bf16";
    GateUpGroupedQ8_0 => "moe.cu", "moe_gate_up_grouped_q8_0";
    GateUpGroupedQ4K => "moe.cu", "moe_gate_up_grouped_q4_K";
    GateUpGroupedQ6K => "moe.cu", "moe_gate_up_grouped_q6_K";
    GateUpGroupedCt4 => "moe.cu", "moe_gate_up_grouped_ct4";
    GateUpGroupedQ5K => "moe.cu", "moe_gate_up_grouped_q5_K";
    GateUpGroupedIq4Xs => "moe.cu", "moe_gate_up_grouped_iq4_xs";
    GateUpGroupedIq3Xxs => "moe.cu", "moe_gate_up_grouped_iq3_xxs";
    GateUpGroupedIq2Xxs => "moe.cu", "moe_gate_up_grouped_iq2_xxs";
    GateUpGroupedIq2S => "moe.cu", "moe_gate_up_grouped_iq2_s";
    GateUpGroupedCt8 => "moe.cu", "moe_gate_up_grouped_ct8";
    DownGroupedF32 => "moe.cu", "moe_down_grouped_f32";
    DownGroupedF16 => "moe.cu", "moe_down_grouped_f16";
    DownGroupedBf16 => "moe.cu", "moe_down_grouped_bf16";
    DownGroupedQ8_0 => "moe.cu", "moe_down_grouped_q8_0";
    DownGroupedQ4K => "moe.cu", "moe_down_grouped_q4_K";
    DownGroupedQ6K => "moe.cu", "moe_down_grouped_q6_K";
    DownGroupedCt4 => "moe.cu", "moe_down_grouped_ct4";
    DownGroupedQ5K => "moe.cu", "moe_down_grouped_q5_K";
    DownGroupedIq4Xs => "moe.cu", "moe_down_grouped_iq4_xs";
    DownGroupedIq3Xxs => "moe.cu", "moe_down_grouped_iq3_xxs";
    DownGroupedIq2Xxs => "moe.cu", "moe_down_grouped_iq2_xxs";
    DownGroupedIq2S => "moe.cu", "moe_down_grouped_iq2_s";
    DownGroupedCt8 => "moe.cu", "moe_down_grouped_ct8";
    MoeGroup => "moe.cu", "moe_group";
    Route => "moe.cu", "route";
    RouteBlock => "moe.cu", "route_block";
    MvF32 => "mmvq.cu", "mv_f32";
    MoeCombine => "moe.cu", "moe_combine";
    RmsNorm => "norm.cu", "rms_norm";
    RmsNormH => "norm.cu", "rms_norm_h";
    Rope => "norm.cu", "rope";
    Add => "elementwise.cu", "add";
    SwiGlu => "elementwise.cu", "swiglu";
    GateMul => "elementwise.cu", "gate_mul";
    Copy => "elementwise.cu", "copy_f32";
    ArgmaxFeed => "sample.cu", "argmax_feed";
    KvStore => "attention.cu", "kv_store";
    KvStoreF16 => "attention.cu", "kv_store_f16";
    Attention => "attention.cu", "attention";
    AttentionF16 => "attention.cu", "attention_f16";
    AttentionMerge => "attention.cu", "attention_merge";
    AttentionDecode => "attention.cu", "attention_decode";
    AttentionDecodeF16 => "attention.cu", "attention_decode_f16";
    AttentionDecodeQk => "attention.cu", "attention_decode_qk";
    AttentionDecodeQkF16 => "attention.cu", "attention_decode_qk_f16";
    AttentionPrefill => "flash.cu", "attention_prefill";
    AttentionPrefillF16 => "flash.cu", "attention_prefill_f16";
    AttentionDecodeGqa => "flash.cu", "attention_decode_gqa";
    AttentionDecodeGqaF16 => "flash.cu", "attention_decode_gqa_f16";
    AttentionDecodeGqaQkF16 => "flash.cu", "attention_decode_gqa_qk_f16";
    KvStoreBf16 => "attention.cu", "kv_store_bf16";
    AttentionBf16 => "attention.cu", "attention_bf16";
    AttentionDecodeBf16 => "attention.cu", "attention_decode_bf16";
    AttentionDecodeQkBf16 => "attention.cu", "attention_decode_qk_bf16";
    QkNormRopeStoreBf16 => "fused.cu", "qk_norm_rope_store_bf16";
    AttentionPrefillBf16 => "flash.cu", "attention_prefill_bf16";
    AttentionDecodeGqaBf16 => "flash.cu", "attention_decode_gqa_bf16";
    KvStoreQ8_0 => "attention.cu", "kv_store_q8_0";
    QkNormRopeStoreQ8_0 => "fused.cu", "qk_norm_rope_store_q8_0";
    AttentionPrefillQ8_0 => "flash.cu", "attention_prefill_q8_0";
    AttentionDecodeGqaQ8_0 => "flash.cu", "attention_decode_gqa_q8_0";
    Spin => "elementwise.cu", "spin";
    ReadStream => "elementwise.cu", "read_stream";
    QuantizeQ8K => "act.cu", "quantize_q8_K";
    QuantizeQ8_0 => "act.cu", "quantize_q8_0";
    MvQ8_0 => "mmvq.cu", "mv_q8_0";
    MvQ4K => "mmvq.cu", "mv_q4_K";
    MvQ6K => "mmvq.cu", "mv_q6_K";
    MvSwigluQ8_0 => "mmvq.cu", "mv_swiglu_q8_0";
    MvSwigluQ4K => "mmvq.cu", "mv_swiglu_q4_K";
    MvSwigluQ6K => "mmvq.cu", "mv_swiglu_q6_K";
    MvCt4 => "mmvq.cu", "mv_ct4";
    MvSwigluCt4 => "mmvq.cu", "mv_swiglu_ct4";
    MvBf16 => "mmvq.cu", "mv_bf16";
    MvF16 => "mmvq.cu", "mv_f16";
    MvSplitBf16 => "mmvq.cu", "mv_split_bf16";
    MvSplitF16 => "mmvq.cu", "mv_split_f16";
    MvNormBf16 => "mmvq.cu", "mv_norm_bf16";
    MvNormF16 => "mmvq.cu", "mv_norm_f16";
    MvRinvBf16 => "mmvq.cu", "mv_rinv_bf16";
    MvRinvF16 => "mmvq.cu", "mv_rinv_f16";
    MvStageBf16 => "mmvq.cu", "mv_stage_bf16";
    MvStageF16 => "mmvq.cu", "mv_stage_f16";
    MvSwigluBf16 => "mmvq.cu", "mv_swiglu_bf16";
    MoeGateUpMixedCt4Bf16 => "mmvq.cu", "moe_gate_up_mixed_ct4_bf16";
    MoeDownMixedCt4Bf16 => "mmvq.cu", "moe_down_mixed_ct4_bf16";
    MoeGateUpMixedCt4F16 => "mmvq.cu", "moe_gate_up_mixed_ct4_f16";
    MoeDownMixedCt4F16 => "mmvq.cu", "moe_down_mixed_ct4_f16";
    MoeGateUpMixedCt8Bf16 => "mmvq.cu", "moe_gate_up_mixed_ct8_bf16";
    MoeDownMixedCt8Bf16 => "mmvq.cu", "moe_down_mixed_ct8_bf16";
    MoeGateUpMixedCt8F16 => "mmvq.cu", "moe_gate_up_mixed_ct8_f16";
    MoeDownMixedCt8F16 => "mmvq.cu", "moe_down_mixed_ct8_f16";
    MvSwigluF16 => "mmvq.cu", "mv_swiglu_f16";
    LabMvsQ4K => "lab.cu", "mvs_q4_K";
    LabMvsMemOnlyQ4K => "lab.cu", "mvs_memonly_q4_K";
    LabMvhQ4K => "lab.cu", "mvh_q4_K";
    LabMvwQ4K => "lab.cu", "mvw_q4_K";
    LabMvwpQ4K => "lab.cu", "mvwp_q4_K";
    LabMvwQ6K => "lab.cu", "mvw_q6_K";
    LabGateUpSQ4K => "lab.cu", "moe_gate_up_s_q4_K";
    LabGateUpHQ4K => "lab.cu", "moe_gate_up_h_q4_K";
    LabGateUpG4Q4K => "lab.cu", "moe_gate_up_g4_q4_K";
    LabGateUpR1Q4K => "lab.cu", "moe_gate_up_r1_q4_K";
    LabGateUpR2Q4K => "lab.cu", "moe_gate_up_r2_q4_K";
    LabGateUpR4Q4K => "lab.cu", "moe_gate_up_r4_q4_K";
    LabGateUpR2pQ4K => "lab.cu", "moe_gate_up_r2p_q4_K";
    LabGateUpR4pQ4K => "lab.cu", "moe_gate_up_r4p_q4_K";
    LabGateUpT4Q4K => "lab.cu", "moe_gate_up_t4_q4_K";
    LabGateUpT4mQ4K => "lab.cu", "moe_gate_up_t4m_q4_K";
    LabGateUpT2Q4K => "lab.cu", "moe_gate_up_t2_q4_K";
    LabGateUpT2mQ4K => "lab.cu", "moe_gate_up_t2m_q4_K";
    LabMvw2Bf16 => "lab.cu", "mvw2_bf16";
    LabMvxBf16 => "lab.cu", "mvx_bf16";
    LabEmpty => "lab.cu", "lab_empty";
    LabHop => "lab.cu", "lab_hop";
    LabBarrier => "lab.cu", "lab_barrier";
    LabWide => "lab.cu", "lab_wide";
    LabTail => "lab.cu", "lab_tail";
    LabMvb4Bf16 => "lab.cu", "mvb4_bf16";
    LabMvb16Bf16 => "lab.cu", "mvb16_bf16";
    LabMvb8csBf16 => "lab.cu", "mvb8cs_bf16";
    LabMvkBf16 => "lab.cu", "mvk_bf16";
    RmsNormQ8K => "fused.cu", "rms_norm_q8_K";
    RmsNormQ8_0 => "fused.cu", "rms_norm_q8_0";
    RmsNormRow => "fused.cu", "rms_norm_row";
    QkNormRopeStore => "fused.cu", "qk_norm_rope_store";
    QkNormRopeStoreF16 => "fused.cu", "qk_norm_rope_store_f16";
    AttentionMergeGate => "fused.cu", "attention_merge_gate";
    AttentionMergeGateQ8K => "fused.cu", "attention_merge_gate_q8_K";
    AttentionMergeGateQ8_0 => "fused.cu", "attention_merge_gate_q8_0";
    GateUpQQ8_0 => "mmvq.cu", "moe_gate_up_q_q8_0";
    GateUpQQ4K => "mmvq.cu", "moe_gate_up_q_q4_K";
    GateUpQQ6K => "mmvq.cu", "moe_gate_up_q_q6_K";
    DownQQ8_0 => "mmvq.cu", "moe_down_q_q8_0";
    DownQQ4K => "mmvq.cu", "moe_down_q_q4_K";
    DownQQ6K => "mmvq.cu", "moe_down_q_q6_K";
    GateUpQCt4 => "mmvq.cu", "moe_gate_up_q_ct4";
    DownQCt4 => "mmvq.cu", "moe_down_q_ct4";
    MvIq3Xxs => "mmvq.cu", "mv_iq3_xxs";
    MvSwigluIq3Xxs => "mmvq.cu", "mv_swiglu_iq3_xxs";
    GateUpQIq3Xxs => "mmvq.cu", "moe_gate_up_q_iq3_xxs";
    DownQIq3Xxs => "mmvq.cu", "moe_down_q_iq3_xxs";
    MvIq2Xxs => "mmvq.cu", "mv_iq2_xxs";
    MvSwigluIq2Xxs => "mmvq.cu", "mv_swiglu_iq2_xxs";
    GateUpQIq2Xxs => "mmvq.cu", "moe_gate_up_q_iq2_xxs";
    DownQIq2Xxs => "mmvq.cu", "moe_down_q_iq2_xxs";
    MvIq2S => "mmvq.cu", "mv_iq2_s";
    MvCt8 => "mmvq.cu", "mv_ct8";
    MvSwigluIq2S => "mmvq.cu", "mv_swiglu_iq2_s";
    MvSwigluCt8 => "mmvq.cu", "mv_swiglu_ct8";
    GateUpQIq2S => "mmvq.cu", "moe_gate_up_q_iq2_s";
    GateUpQCt8 => "mmvq.cu", "moe_gate_up_q_ct8";
    DownQIq2S => "mmvq.cu", "moe_down_q_iq2_s";
    DownQCt8 => "mmvq.cu", "moe_down_q_ct8";
    MvQ5K => "mmvq.cu", "mv_q5_K";
    MvSwigluQ5K => "mmvq.cu", "mv_swiglu_q5_K";
    GateUpQQ5K => "mmvq.cu", "moe_gate_up_q_q5_K";
    DownQQ5K => "mmvq.cu", "moe_down_q_q5_K";
    MvIq4Xs => "mmvq.cu", "mv_iq4_xs";
    MvSwigluIq4Xs => "mmvq.cu", "mv_swiglu_iq4_xs";
    GateUpQIq4Xs => "mmvq.cu", "moe_gate_up_q_iq4_xs";
    DownQIq4Xs => "mmvq.cu", "moe_down_q_iq4_xs";
    DownRQ8_0 => "mmvq.cu", "moe_down_r_q8_0";
    DownRQ4K => "mmvq.cu", "moe_down_r_q4_K";
    DownRQ6K => "mmvq.cu", "moe_down_r_q6_K";
    DownRCt4 => "mmvq.cu", "moe_down_r_ct4";
    DownRIq3Xxs => "mmvq.cu", "moe_down_r_iq3_xxs";
    DownRIq2Xxs => "mmvq.cu", "moe_down_r_iq2_xxs";
    DownRIq2S => "mmvq.cu", "moe_down_r_iq2_s";
    DownRQ5K => "mmvq.cu", "moe_down_r_q5_K";
    DownRIq4Xs => "mmvq.cu", "moe_down_r_iq4_xs";
    DownRCt8 => "mmvq.cu", "moe_down_r_ct8";
    MoeDownMixedRCt4Bf16 => "mmvq.cu", "moe_down_mixed_r_ct4_bf16";
    MoeDownMixedRCt4F16 => "mmvq.cu", "moe_down_mixed_r_ct4_f16";
    MoeDownMixedRCt8Bf16 => "mmvq.cu", "moe_down_mixed_r_ct8_bf16";
    MoeDownMixedRCt8F16 => "mmvq.cu", "moe_down_mixed_r_ct8_f16";
    MoeGateUpMixedQ8Ct4Bf16 => "mmvq.cu", "moe_gate_up_mixed_q8_ct4_bf16";
    MoeDownMixedLateCt4Bf16 => "mmvq.cu", "moe_down_mixed_late_ct4_bf16";
    MoeGateUpMixedQ8Ct4F16 => "mmvq.cu", "moe_gate_up_mixed_q8_ct4_f16";
    MoeDownMixedLateCt4F16 => "mmvq.cu", "moe_down_mixed_late_ct4_f16";
    MoeGateUpMixedQ8Ct8Bf16 => "mmvq.cu", "moe_gate_up_mixed_q8_ct8_bf16";
    MoeDownMixedLateCt8Bf16 => "mmvq.cu", "moe_down_mixed_late_ct8_bf16";
    MoeGateUpMixedQ8Ct8F16 => "mmvq.cu", "moe_gate_up_mixed_q8_ct8_f16";
    MoeDownMixedLateCt8F16 => "mmvq.cu", "moe_down_mixed_late_ct8_f16";
    Mv2Q4KQ6K => "mmvq.cu", "mv2_q4_K_q6_K";
    Mv2Q5KQ6K => "mmvq.cu", "mv2_q5_K_q6_K";
    Mv2Iq4XsQ5K => "mmvq.cu", "mv2_iq4_xs_q5_K";
    GemmF32 => "gemm.cu", "gemm_f32";
    GemmF16 => "gemm.cu", "gemm_f16";
    GemmBf16 => "gemm.cu", "gemm_bf16";
    GemmQ8_0 => "gemm.cu", "gemm_q8_0";
    GemmQ4K => "gemm.cu", "gemm_q4_K";
    GemmQ6K => "gemm.cu", "gemm_q6_K";
    GemmCt4 => "gemm.cu", "gemm_ct4";
    GemmQ5K => "gemm.cu", "gemm_q5_K";
    GemmIq4Xs => "gemm.cu", "gemm_iq4_xs";
    GemmIq3Xxs => "gemm.cu", "gemm_iq3_xxs";
    GemmIq2Xxs => "gemm.cu", "gemm_iq2_xxs";
    GemmIq2S => "gemm.cu", "gemm_iq2_s";
    GemmCt8 => "gemm.cu", "gemm_ct8";
    GemmGateUpF32 => "gemm.cu", "gemm_gate_up_f32";
    GemmGateUpF16 => "gemm.cu", "gemm_gate_up_f16";
    GemmGateUpBf16 => "gemm.cu", "gemm_gate_up_bf16";
    GemmGateUpQ8_0 => "gemm.cu", "gemm_gate_up_q8_0";
    GemmGateUpQ4K => "gemm.cu", "gemm_gate_up_q4_K";
    GemmGateUpQ6K => "gemm.cu", "gemm_gate_up_q6_K";
    GemmGateUpCt4 => "gemm.cu", "gemm_gate_up_ct4";
    GemmGateUpQ5K => "gemm.cu", "gemm_gate_up_q5_K";
    GemmGateUpIq4Xs => "gemm.cu", "gemm_gate_up_iq4_xs";
    GemmGateUpIq3Xxs => "gemm.cu", "gemm_gate_up_iq3_xxs";
    GemmGateUpIq2Xxs => "gemm.cu", "gemm_gate_up_iq2_xxs";
    GemmGateUpIq2S => "gemm.cu", "gemm_gate_up_iq2_s";
    GemmGateUpCt8 => "gemm.cu", "gemm_gate_up_ct8";
    GemmDownF32 => "gemm.cu", "gemm_down_f32";
    GemmDownF16 => "gemm.cu", "gemm_down_f16";
    GemmDownBf16 => "gemm.cu", "gemm_down_bf16";
    GemmDownQ8_0 => "gemm.cu", "gemm_down_q8_0";
    GemmDownQ4K => "gemm.cu", "gemm_down_q4_K";
    GemmDownQ6K => "gemm.cu", "gemm_down_q6_K";
    GemmDownCt4 => "gemm.cu", "gemm_down_ct4";
    GemmDownQ5K => "gemm.cu", "gemm_down_q5_K";
    GemmDownIq4Xs => "gemm.cu", "gemm_down_iq4_xs";
    GemmDownIq3Xxs => "gemm.cu", "gemm_down_iq3_xxs";
    GemmDownIq2Xxs => "gemm.cu", "gemm_down_iq2_xxs";
    GemmDownIq2S => "gemm.cu", "gemm_down_iq2_s";
    GemmDownCt8 => "gemm.cu", "gemm_down_ct8";
    ToF16 => "gemm.cu", "to_f16";
    Gemm32F32 => "gemm.cu", "gemm32_f32";
    Gemm32F16 => "gemm.cu", "gemm32_f16";
    Gemm32Bf16 => "gemm.cu", "gemm32_bf16";
    Gemm32Q8_0 => "gemm.cu", "gemm32_q8_0";
    Gemm32Q4K => "gemm.cu", "gemm32_q4_K";
    Gemm32Q6K => "gemm.cu", "gemm32_q6_K";
    Gemm32Ct4 => "gemm.cu", "gemm32_ct4";
    Gemm32Q5K => "gemm.cu", "gemm32_q5_K";
    Gemm32Iq4Xs => "gemm.cu", "gemm32_iq4_xs";
    Gemm32Iq3Xxs => "gemm.cu", "gemm32_iq3_xxs";
    Gemm32Iq2Xxs => "gemm.cu", "gemm32_iq2_xxs";
    Gemm32Iq2S => "gemm.cu", "gemm32_iq2_s";
    Gemm32Ct8 => "gemm.cu", "gemm32_ct8";
    GemmGateUp32F32 => "gemm.cu", "gemm_gate_up32_f32";
    GemmGateUp32F16 => "gemm.cu", "gemm_gate_up32_f16";
    GemmGateUp32Bf16 => "gemm.cu", "gemm_gate_up32_bf16";
    GemmGateUp32Q8_0 => "gemm.cu", "gemm_gate_up32_q8_0";
    GemmGateUp32Q4K => "gemm.cu", "gemm_gate_up32_q4_K";
    GemmGateUp32Q6K => "gemm.cu", "gemm_gate_up32_q6_K";
    GemmGateUp32Ct4 => "gemm.cu", "gemm_gate_up32_ct4";
    GemmGateUp32Q5K => "gemm.cu", "gemm_gate_up32_q5_K";
    GemmGateUp32Iq4Xs => "gemm.cu", "gemm_gate_up32_iq4_xs";
    GemmGateUp32Iq3Xxs => "gemm.cu", "gemm_gate_up32_iq3_xxs";
    GemmGateUp32Iq2Xxs => "gemm.cu", "gemm_gate_up32_iq2_xxs";
    GemmGateUp32Iq2S => "gemm.cu", "gemm_gate_up32_iq2_s";
    GemmGateUp32Ct8 => "gemm.cu", "gemm_gate_up32_ct8";
    GemmDown32F32 => "gemm.cu", "gemm_down32_f32";
    GemmDown32F16 => "gemm.cu", "gemm_down32_f16";
    GemmDown32Bf16 => "gemm.cu", "gemm_down32_bf16";
    GemmDown32Q8_0 => "gemm.cu", "gemm_down32_q8_0";
    GemmDown32Q4K => "gemm.cu", "gemm_down32_q4_K";
    GemmDown32Q6K => "gemm.cu", "gemm_down32_q6_K";
    GemmDown32Ct4 => "gemm.cu", "gemm_down32_ct4";
    GemmDown32Q5K => "gemm.cu", "gemm_down32_q5_K";
    GemmDown32Iq4Xs => "gemm.cu", "gemm_down32_iq4_xs";
    GemmDown32Iq3Xxs => "gemm.cu", "gemm_down32_iq3_xxs";
    GemmDown32Iq2Xxs => "gemm.cu", "gemm_down32_iq2_xxs";
    GemmDown32Iq2S => "gemm.cu", "gemm_down32_iq2_s";
    GemmDown32Ct8 => "gemm.cu", "gemm_down32_ct8";
    GemmRfQ4K => "gemm_rf.cu", "gemm_rf_q4_K";
    GemmGateUpRfQ4K => "gemm_rf.cu", "gemm_gate_up_rf_q4_K";
    GemmDownRfQ4K => "gemm_rf.cu", "gemm_down_rf_q4_K";
    GemmRfQ6K => "gemm_rf.cu", "gemm_rf_q6_K";
    GemmGateUpRfQ6K => "gemm_rf.cu", "gemm_gate_up_rf_q6_K";
    GemmDownRfQ6K => "gemm_rf.cu", "gemm_down_rf_q6_K";
    GemmGateUpRf96Q6K => "gemm_rf.cu", "gemm_gate_up_rf96_q6_K";
    GemmDownRf96Q6K => "gemm_rf.cu", "gemm_down_rf96_q6_K";
    GemmRf128Q4K => "gemm_rf.cu", "gemm_rf128_q4_K";
    GemmGateUpRf128Q4K => "gemm_rf.cu", "gemm_gate_up_rf128_q4_K";
    GemmDownRf128Q4K => "gemm_rf.cu", "gemm_down_rf128_q4_K";
    GemmRfCt4 => "gemm_rf.cu", "gemm_rf_ct4";
    GemmGateUpRfCt4 => "gemm_rf.cu", "gemm_gate_up_rf_ct4";
    GemmDownRfCt4 => "gemm_rf.cu", "gemm_down_rf_ct4";
    GemmRfCt8 => "gemm_rf.cu", "gemm_rf_ct8";
    GemmGateUpRfCt8 => "gemm_rf.cu", "gemm_gate_up_rf_ct8";
    GemmDownRfCt8 => "gemm_rf.cu", "gemm_down_rf_ct8";
    GemmRf128Ct4 => "gemm_rf.cu", "gemm_rf128_ct4";
    GemmGateUpRf128Ct4 => "gemm_rf.cu", "gemm_gate_up_rf128_ct4";
    GemmDownRf128Ct4 => "gemm_rf.cu", "gemm_down_rf128_ct4";
    GemmWgQ4K => "gemm_rf.cu", "gemm_wg_q4_K";
    GemmGateUpWgQ4K => "gemm_rf.cu", "gemm_gate_up_wg_q4_K";
    GemmDownWgQ4K => "gemm_rf.cu", "gemm_down_wg_q4_K";
    GemmWg128Q4K => "gemm_rf.cu", "gemm_wg128_q4_K";
    GemmGateUpWg128Q4K => "gemm_rf.cu", "gemm_gate_up_wg128_q4_K";
    GemmDownWg128Q4K => "gemm_rf.cu", "gemm_down_wg128_q4_K";
    GemmH16 => "gemm_h.cu", "gemm_h16";
    DequantF16F32 => "gemm_h.cu", "dequant_f16_f32";
    DequantF16F16 => "gemm_h.cu", "dequant_f16_f16";
    DequantF16Bf16 => "gemm_h.cu", "dequant_f16_bf16";
    DequantF16Q8_0 => "gemm_h.cu", "dequant_f16_q8_0";
    DequantF16Q4K => "gemm_h.cu", "dequant_f16_q4_K";
    DequantF16Q6K => "gemm_h.cu", "dequant_f16_q6_K";
    DequantF16Ct4 => "gemm_h.cu", "dequant_f16_ct4";
    DequantF16Q5K => "gemm_h.cu", "dequant_f16_q5_K";
    DequantF16Iq4Xs => "gemm_h.cu", "dequant_f16_iq4_xs";
    DequantF16Iq3Xxs => "gemm_h.cu", "dequant_f16_iq3_xxs";
    DequantF16Iq2Xxs => "gemm_h.cu", "dequant_f16_iq2_xxs";
    DequantF16Iq2S => "gemm_h.cu", "dequant_f16_iq2_s";
    DequantF16Ct8 => "gemm_h.cu", "dequant_f16_ct8";
}

impl K {
    /// The kernel's symbol (for error messages).
    pub fn name(self) -> &'static str {
        MANIFEST[self as usize].2
    }

    /// Whether the kernel may be launched with programmatic serialisation: it reads and
    /// writes nothing an earlier kernel touches before `pdl_wait` (`PDL_ENTRY` or an explicit
    /// wait after its weight prefetch). The prefill GEMMs and attention, `to_f16` and the
    /// timing kernels have no wait and always launch in stream order.
    pub fn pdl(self) -> bool {
        let file = MANIFEST[self as usize].1;
        !matches!(file, "gemm.cu" | "gemm_rf.cu" | "gemm_h.cu" | "flash.cu")
            && !matches!(self, K::Spin | K::ReadStream | K::LabBarrier)
    }

    /// The one-block-per-output-row form of a batch-1 expert down kernel (`mmvq.cu`'s
    /// `moe_down_rows`: each row's experts spread over the block's warps), or `None`.
    pub fn down_rows(self) -> Option<K> {
        use K::*;
        Some(match self {
            DownQQ8_0 => DownRQ8_0,
            DownQQ4K => DownRQ4K,
            DownQQ6K => DownRQ6K,
            DownQCt4 => DownRCt4,
            DownQIq3Xxs => DownRIq3Xxs,
            DownQIq2Xxs => DownRIq2Xxs,
            DownQIq2S => DownRIq2S,
            DownQQ5K => DownRQ5K,
            DownQIq4Xs => DownRIq4Xs,
            DownQCt8 => DownRCt8,
            MoeDownMixedCt4Bf16 => MoeDownMixedRCt4Bf16,
            MoeDownMixedCt4F16 => MoeDownMixedRCt4F16,
            MoeDownMixedCt8Bf16 => MoeDownMixedRCt8Bf16,
            MoeDownMixedCt8F16 => MoeDownMixedRCt8F16,
            _ => return None,
        })
    }

    /// Whether the kernel starts with `PDL_ENTRY` (`common.cuh`): it waits for the kernel
    /// before it and only then lets the next one be scheduled, so a kernel launched right
    /// after it starts, under programmatic launch, when everything before it has finished
    /// (each kernel waits for its predecessor before it ends). `moe_gate_up_q` (after
    /// `route_block`) and `moe_down_mixed_*` (after the quantiser) use that to do the shared
    /// expert's work before their own wait, `attention_decode_gqa` (after
    /// `qk_norm_rope_store`) to read the position and the gate before its own.
    pub fn waits_then_triggers(self) -> bool {
        matches!(
            self,
            K::RouteBlock
                | K::QuantizeQ8K
                | K::QuantizeQ8_0
                | K::QkNormRopeStore
                | K::QkNormRopeStoreF16
                | K::QkNormRopeStoreBf16
                | K::QkNormRopeStoreQ8_0
        )
    }

    /// Dynamic shared memory the kernel is launched with (bytes; 0 for all but the
    /// `gemm_rf.cu` products, whose cp.async ring is larger than the 48 KiB a static
    /// allocation may take, and `flash.cu`'s tile buffers).
    pub fn dyn_smem(self) -> u32 {
        match self {
            K::GemmRfQ4K | K::GemmGateUpRfQ4K | K::GemmDownRfQ4K => GEMM_RF_SMEM_Q4K,
            K::GemmRfQ6K | K::GemmGateUpRfQ6K | K::GemmDownRfQ6K => GEMM_RF_SMEM_Q6K,
            K::GemmGateUpRf96Q6K | K::GemmDownRf96Q6K => GEMM_RF_SMEM_Q6K_96,
            K::GemmRf128Q4K | K::GemmGateUpRf128Q4K | K::GemmDownRf128Q4K => GEMM_RF_SMEM_Q4K_128,
            K::GemmRfCt4 | K::GemmGateUpRfCt4 | K::GemmDownRfCt4 => GEMM_RF_SMEM_CT4,
            K::GemmRf128Ct4 | K::GemmGateUpRf128Ct4 | K::GemmDownRf128Ct4 => GEMM_RF_SMEM_CT4_128,
            K::GemmRfCt8 | K::GemmGateUpRfCt8 | K::GemmDownRfCt8 => GEMM_RF_SMEM_CT8,
            K::GemmH16 => GEMM_H16_SMEM,
            // The lab's activation row in shared memory (LAB_MVX_MAX_COLS f32).
            K::LabMvxBf16 => 4 * 9216,
            // The lab's bulk-copied gate/up: PPW stages of four gate and four up rows of at
            // most GUT_ROW (1,728) bytes, then PPW 8-byte barriers.
            K::LabGateUpT4Q4K | K::LabGateUpT4mQ4K => 4 * (8 * 1728 + 8),
            K::LabGateUpT2Q4K | K::LabGateUpT2mQ4K => 2 * (8 * 1728 + 8),
            K::AttentionPrefill | K::AttentionDecodeGqa => FLASH_SMEM,
            K::AttentionPrefillF16
            | K::AttentionDecodeGqaF16
            | K::AttentionDecodeGqaQkF16
            | K::AttentionPrefillBf16
            | K::AttentionDecodeGqaBf16 => 2 * FLASH_SMEM,
            K::AttentionPrefillQ8_0 | K::AttentionDecodeGqaQ8_0 => FLASH_SMEM_Q8,
            // The wgmma kernels align their layout to 1024 bytes inside the allocation.
            K::GemmWgQ4K | K::GemmGateUpWgQ4K | K::GemmDownWgQ4K => GEMM_RF_SMEM_Q4K + 1024,
            K::GemmWg128Q4K | K::GemmGateUpWg128Q4K | K::GemmDownWg128Q4K => {
                GEMM_RF_SMEM_Q4K_128 + 1024
            }
            _ => 0,
        }
    }
}

/// Weight encodings with device kernels (the `WT_*` numbering of `blocks.cuh`). Other
/// encodings are decoded to f32 at upload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum WType {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4K,
    Q6K,
    /// A 4-bit compressed-tensors matrix in 32-element blocks (`block_ct4`).
    Ct4,
    Q5K,
    Iq4Xs,
    /// The grid IQ types (ggml's codebook quants), decoded by the f32 and tensor-core
    /// kernels; no integer mat-vec yet.
    Iq3Xxs,
    Iq2Xxs,
    Iq2S,
    /// An 8-bit compressed-tensors matrix (W8A16 pack-quantized, W8A8 int-quantized) in
    /// 32-element blocks (`block_ct8`).
    Ct8,
}

impl WType {
    /// `gemm_h.cu`'s decoder of this type into an f16 copy of the matrix.
    pub fn dequant_f16(self) -> K {
        [
            K::DequantF16F32,
            K::DequantF16F16,
            K::DequantF16Bf16,
            K::DequantF16Q8_0,
            K::DequantF16Q4K,
            K::DequantF16Q6K,
            K::DequantF16Ct4,
            K::DequantF16Q5K,
            K::DequantF16Iq4Xs,
            K::DequantF16Iq3Xxs,
            K::DequantF16Iq2Xxs,
            K::DequantF16Iq2S,
            K::DequantF16Ct8,
        ][self as usize]
    }
    pub fn matmul(self) -> K {
        [
            K::MatmulF32,
            K::MatmulF16,
            K::MatmulBf16,
            K::MatmulQ8_0,
            K::MatmulQ4K,
            K::MatmulQ6K,
            K::MatmulCt4,
            K::MatmulQ5K,
            K::MatmulIq4Xs,
            K::MatmulIq3Xxs,
            K::MatmulIq2Xxs,
            K::MatmulIq2S,
            K::MatmulCt8,
        ][self as usize]
    }
    pub fn embed(self) -> K {
        [
            K::EmbedF32,
            K::EmbedF16,
            K::EmbedBf16,
            K::EmbedQ8_0,
            K::EmbedQ4K,
            K::EmbedQ6K,
            K::EmbedCt4,
            K::EmbedQ5K,
            K::EmbedIq4Xs,
            K::EmbedIq3Xxs,
            K::EmbedIq2Xxs,
            K::EmbedIq2S,
            K::EmbedCt8,
        ][self as usize]
    }
    pub fn gate_up(self) -> K {
        [
            K::GateUpF32,
            K::GateUpF16,
            K::GateUpBf16,
            K::GateUpQ8_0,
            K::GateUpQ4K,
            K::GateUpQ6K,
            K::GateUpCt4,
            K::GateUpQ5K,
            K::GateUpIq4Xs,
            K::GateUpIq3Xxs,
            K::GateUpIq2Xxs,
            K::GateUpIq2S,
            K::GateUpCt8,
        ][self as usize]
    }
    pub fn gate_up_grouped(self) -> K {
        [
            K::GateUpGroupedF32,
            K::GateUpGroupedF16,
            K::GateUpGroupedBf16,
            K::GateUpGroupedQ8_0,
            K::GateUpGroupedQ4K,
            K::GateUpGroupedQ6K,
            K::GateUpGroupedCt4,
            K::GateUpGroupedQ5K,
            K::GateUpGroupedIq4Xs,
            K::GateUpGroupedIq3Xxs,
            K::GateUpGroupedIq2Xxs,
            K::GateUpGroupedIq2S,
            K::GateUpGroupedCt8,
        ][self as usize]
    }
    pub fn down_grouped(self) -> K {
        [
            K::DownGroupedF32,
            K::DownGroupedF16,
            K::DownGroupedBf16,
            K::DownGroupedQ8_0,
            K::DownGroupedQ4K,
            K::DownGroupedQ6K,
            K::DownGroupedCt4,
            K::DownGroupedQ5K,
            K::DownGroupedIq4Xs,
            K::DownGroupedIq3Xxs,
            K::DownGroupedIq2Xxs,
            K::DownGroupedIq2S,
            K::DownGroupedCt8,
        ][self as usize]
    }
    /// The activation format of the quantised mat-vec path, `None` for float weights (see
    /// [`WType::mvh`]) and for the types that keep the f32 kernels at decode. CT4 pairs with
    /// Q8_0 as on the CPU (`cpu-experts/src/kernels/ct.rs`).
    pub fn act(self) -> Option<ActQ> {
        match self {
            WType::F32 | WType::F16 | WType::Bf16 => None,
            WType::Q8_0 | WType::Ct4 | WType::Ct8 => Some(ActQ::Q8_0),
            // (The grid IQ types, Q5_K and IQ4_XS only where the session takes their integer
            // kernels: `CudaSessionOptions::grid_iq_mvq`, `::q5k_iq4xs_mvq`.)
            WType::Q4K
            | WType::Q6K
            | WType::Q5K
            | WType::Iq4Xs
            | WType::Iq3Xxs
            | WType::Iq2Xxs
            | WType::Iq2S => Some(ActQ::Q8K),
        }
    }
    /// Quantised-activation kernels (for types with [`WType::act`]).
    pub fn mvq(self) -> Option<MvqKernels> {
        let k = |mv, swiglu, gate_up, down| MvqKernels {
            mv,
            swiglu,
            gate_up,
            down,
        };
        // Exactly the types with an activation format ([`WType::act`]).
        self.act()?;
        match self {
            WType::Q8_0 => Some(k(K::MvQ8_0, K::MvSwigluQ8_0, K::GateUpQQ8_0, K::DownQQ8_0)),
            WType::Ct4 => Some(k(K::MvCt4, K::MvSwigluCt4, K::GateUpQCt4, K::DownQCt4)),
            WType::Ct8 => Some(k(K::MvCt8, K::MvSwigluCt8, K::GateUpQCt8, K::DownQCt8)),
            WType::Q4K => Some(k(K::MvQ4K, K::MvSwigluQ4K, K::GateUpQQ4K, K::DownQQ4K)),
            WType::Q6K => Some(k(K::MvQ6K, K::MvSwigluQ6K, K::GateUpQQ6K, K::DownQQ6K)),
            WType::Iq3Xxs => Some(k(
                K::MvIq3Xxs,
                K::MvSwigluIq3Xxs,
                K::GateUpQIq3Xxs,
                K::DownQIq3Xxs,
            )),
            WType::Iq2Xxs => Some(k(
                K::MvIq2Xxs,
                K::MvSwigluIq2Xxs,
                K::GateUpQIq2Xxs,
                K::DownQIq2Xxs,
            )),
            WType::Iq2S => Some(k(K::MvIq2S, K::MvSwigluIq2S, K::GateUpQIq2S, K::DownQIq2S)),
            WType::Q5K => Some(k(K::MvQ5K, K::MvSwigluQ5K, K::GateUpQQ5K, K::DownQQ5K)),
            WType::Iq4Xs => Some(k(
                K::MvIq4Xs,
                K::MvSwigluIq4Xs,
                K::GateUpQIq4Xs,
                K::DownQIq4Xs,
            )),
            _ => None,
        }
    }
    /// The batch-1 kernel for a run of products of one input whose first matrices are of this
    /// type and the rest of type `other` (`mmvq.cu`'s `mv2_*`: Q4_K or Q5_K attention with a
    /// Q6_K value projection, IQ4_XS with Q5_K), or `None` for pairs without one.
    pub fn mv_pair(self, other: WType) -> Option<K> {
        match (self, other) {
            (WType::Q4K, WType::Q6K) => Some(K::Mv2Q4KQ6K),
            (WType::Q5K, WType::Q6K) => Some(K::Mv2Q5KQ6K),
            (WType::Iq4Xs, WType::Q5K) => Some(K::Mv2Iq4XsQ5K),
            _ => None,
        }
    }
    /// Batch-1 kernels of float weights, `(mv, swiglu)` (`mmvq.cu`'s `mv_bf16`, ...): they
    /// read the f32 input itself, so the decode fusions run them with no quantiser.
    pub fn mvh(self) -> Option<(K, K)> {
        match self {
            WType::Bf16 => Some((K::MvBf16, K::MvSwigluBf16)),
            WType::F16 => Some((K::MvF16, K::MvSwigluF16)),
            _ => None,
        }
    }
    /// The batch-1 float kernel that requests more of each row before its wait
    /// (`mmvq.cu`'s `mv_stage_*`, lab switch `MV_STAGE`): same arguments and outputs as
    /// [`WType::mvh`]'s mat-vec.
    pub fn mvh_stage(self) -> Option<K> {
        match self {
            WType::Bf16 => Some(K::MvStageBf16),
            WType::F16 => Some(K::MvStageF16),
            _ => None,
        }
    }
    /// The batch-1 float kernel that takes an RMSNorm's input and gain instead of its output
    /// (`mmvq.cu`'s `mv_norm_*`, lab switch `MV_NORM_FUSE`).
    pub fn mvh_norm(self) -> Option<K> {
        match self {
            WType::Bf16 => Some(K::MvNormBf16),
            WType::F16 => Some(K::MvNormF16),
            _ => None,
        }
    }
    /// The batch-1 float kernel that reads `g ∘ x` written by the expert down kernel and
    /// scales its products by the norm's 1 / rms from that kernel's partial sums
    /// (`mmvq.cu`'s `mv_rinv_*`, lab switch `NORM_EPI`).
    pub fn mvh_rinv(self) -> Option<K> {
        match self {
            WType::Bf16 => Some(K::MvRinvBf16),
            WType::F16 => Some(K::MvRinvF16),
            _ => None,
        }
    }
    /// The batch-1 float kernel with one block per row (`mmvq.cu`'s `mv_split_*`), for
    /// matrices too short to fill the device one warp per row.
    pub fn mvh_split(self) -> Option<K> {
        match self {
            WType::Bf16 => Some(K::MvSplitBf16),
            WType::F16 => Some(K::MvSplitF16),
            _ => None,
        }
    }
    /// Batch-1 expert kernels `(gate_up, down)` for routed experts of this type with a shared
    /// expert of float type `shared` (`mmvq.cu`'s `moe_gate_up_mixed_*`, `moe_down_mixed_*`:
    /// W4A16's CT4 experts with a bf16 or f16 shared expert, all in two launches).
    pub fn moe_mixed(self, shared: WType) -> Option<(K, K)> {
        match (self, shared) {
            (WType::Ct4, WType::Bf16) => Some((K::MoeGateUpMixedCt4Bf16, K::MoeDownMixedCt4Bf16)),
            (WType::Ct4, WType::F16) => Some((K::MoeGateUpMixedCt4F16, K::MoeDownMixedCt4F16)),
            (WType::Ct8, WType::Bf16) => Some((K::MoeGateUpMixedCt8Bf16, K::MoeDownMixedCt8Bf16)),
            (WType::Ct8, WType::F16) => Some((K::MoeGateUpMixedCt8F16, K::MoeDownMixedCt8F16)),
            _ => None,
        }
    }
    /// [`WType::moe_mixed`]'s pair with the routed activations quantised inside the gate/up
    /// kernel (`moe_gate_up_mixed_q8_*`: clusters of [`GATE_UP_CLUSTER`] blocks, one Q8_0
    /// group each) and the down kernel that reads nothing of it before its wait
    /// (`moe_down_mixed_late_*`): no quantiser launch between them.
    pub fn moe_mixed_q8(self, shared: WType) -> Option<(K, K)> {
        match (self, shared) {
            (WType::Ct4, WType::Bf16) => {
                Some((K::MoeGateUpMixedQ8Ct4Bf16, K::MoeDownMixedLateCt4Bf16))
            }
            (WType::Ct4, WType::F16) => {
                Some((K::MoeGateUpMixedQ8Ct4F16, K::MoeDownMixedLateCt4F16))
            }
            (WType::Ct8, WType::Bf16) => {
                Some((K::MoeGateUpMixedQ8Ct8Bf16, K::MoeDownMixedLateCt8Bf16))
            }
            (WType::Ct8, WType::F16) => {
                Some((K::MoeGateUpMixedQ8Ct8F16, K::MoeDownMixedLateCt8F16))
            }
            _ => None,
        }
    }
    /// Tensor-core prefill kernels (`gemm.cu`) for token tiles of `tile` (64 or 32).
    pub fn gemm(self, tile: usize) -> GemmKernels {
        let k = |dense, gate_up, down| GemmKernels {
            dense,
            gate_up,
            down,
        };
        use K::*;
        match (self, tile == 32) {
            (WType::F32, false) => k(GemmF32, GemmGateUpF32, GemmDownF32),
            (WType::F16, false) => k(GemmF16, GemmGateUpF16, GemmDownF16),
            (WType::Bf16, false) => k(GemmBf16, GemmGateUpBf16, GemmDownBf16),
            (WType::Q8_0, false) => k(GemmQ8_0, GemmGateUpQ8_0, GemmDownQ8_0),
            (WType::Q4K, false) => k(GemmQ4K, GemmGateUpQ4K, GemmDownQ4K),
            (WType::Q6K, false) => k(GemmQ6K, GemmGateUpQ6K, GemmDownQ6K),
            (WType::Ct4, false) => k(GemmCt4, GemmGateUpCt4, GemmDownCt4),
            (WType::Q5K, false) => k(GemmQ5K, GemmGateUpQ5K, GemmDownQ5K),
            (WType::Iq4Xs, false) => k(GemmIq4Xs, GemmGateUpIq4Xs, GemmDownIq4Xs),
            (WType::Iq3Xxs, false) => k(GemmIq3Xxs, GemmGateUpIq3Xxs, GemmDownIq3Xxs),
            (WType::Iq2Xxs, false) => k(GemmIq2Xxs, GemmGateUpIq2Xxs, GemmDownIq2Xxs),
            (WType::Iq2S, false) => k(GemmIq2S, GemmGateUpIq2S, GemmDownIq2S),
            (WType::Ct8, false) => k(GemmCt8, GemmGateUpCt8, GemmDownCt8),
            (WType::F32, true) => k(Gemm32F32, GemmGateUp32F32, GemmDown32F32),
            (WType::F16, true) => k(Gemm32F16, GemmGateUp32F16, GemmDown32F16),
            (WType::Bf16, true) => k(Gemm32Bf16, GemmGateUp32Bf16, GemmDown32Bf16),
            (WType::Q8_0, true) => k(Gemm32Q8_0, GemmGateUp32Q8_0, GemmDown32Q8_0),
            (WType::Q4K, true) => k(Gemm32Q4K, GemmGateUp32Q4K, GemmDown32Q4K),
            (WType::Q6K, true) => k(Gemm32Q6K, GemmGateUp32Q6K, GemmDown32Q6K),
            (WType::Ct4, true) => k(Gemm32Ct4, GemmGateUp32Ct4, GemmDown32Ct4),
            (WType::Q5K, true) => k(Gemm32Q5K, GemmGateUp32Q5K, GemmDown32Q5K),
            (WType::Iq4Xs, true) => k(Gemm32Iq4Xs, GemmGateUp32Iq4Xs, GemmDown32Iq4Xs),
            (WType::Iq3Xxs, true) => k(Gemm32Iq3Xxs, GemmGateUp32Iq3Xxs, GemmDown32Iq3Xxs),
            (WType::Iq2Xxs, true) => k(Gemm32Iq2Xxs, GemmGateUp32Iq2Xxs, GemmDown32Iq2Xxs),
            (WType::Iq2S, true) => k(Gemm32Iq2S, GemmGateUp32Iq2S, GemmDown32Iq2S),
            (WType::Ct8, true) => k(Gemm32Ct8, GemmGateUp32Ct8, GemmDown32Ct8),
        }
    }
    pub fn down(self) -> K {
        [
            K::DownF32,
            K::DownF16,
            K::DownBf16,
            K::DownQ8_0,
            K::DownQ4K,
            K::DownQ6K,
            K::DownCt4,
            K::DownQ5K,
            K::DownIq4Xs,
            K::DownIq3Xxs,
            K::DownIq2Xxs,
            K::DownIq2S,
            K::DownCt8,
        ][self as usize]
    }
}

/// The tensor-core prefill kernels of one weight type and token tile (`gemm.cu`): weights
/// decoded to f16 in shared memory, f16 activations, f32 accumulation.
#[derive(Clone, Copy, Debug)]
pub struct GemmKernels {
    /// `out = x W^T` over a tile of [`GEMM_TILE_ROWS`] rows × the tile's tokens.
    pub dense: K,
    /// Expert-grouped gate/up with SwiGLU (tiles of the tile's pairs, 64 rows).
    pub gate_up: K,
    /// Expert-grouped down.
    pub down: K,
}

/// Weight rows per block of the `gemm.cu` kernels (`GM_BM`).
pub const GEMM_TILE_ROWS: usize = 256;
/// Tokens (or expert pairs) per block of the `gemm.cu` kernels; the `*32` kernels take
/// tiles of half this.
pub const GEMM_TILE_TOKENS: usize = 64;
/// Threads per block of the `gemm.cu` kernels (`GM_THREADS`); the `gemm_rf.cu` kernels take
/// the same grid and block for the same tile.
pub const GEMM_THREADS: u32 = 256;
/// Dynamic shared memory of a `gemm_h16` block (`GH_SMEM`): four stages of 128 rows' and 128
/// tokens' 32 f16.
pub const GEMM_H16_SMEM: u32 = 65_536;
/// Rows and tokens per `gemm_h16` block.
pub const GEMM_H16_TILE: usize = 128;
/// Dynamic shared memory of one `flash.cu` tile buffer (`FA_TILE_HALVES` f16: 64 keys' K and
/// V rows of 136 halves); the 16-bit-cache (f16, bf16) kernels double-buffer.
pub const FLASH_SMEM: u32 = 2 * 64 * 136 * 2;
/// Dynamic shared memory of the q8_0-cache `flash.cu` kernels: one f16 tile buffer, then two
/// raw stages (`FA_Q8_STAGE`: 64 keys' K and V quants in rows of 144 bytes, their f16 scales).
pub const FLASH_SMEM_Q8: u32 = FLASH_SMEM + 2 * (2 * 64 * 144 + 2 * 64 * 4 * 2);
/// Dynamic shared memory of a Q4_K `gemm_rf.cu` block (`RF_SMEM_Q4_K`): a three-stage ring
/// of 256 rows' super-blocks and 64 tokens' activations, the rows' decoded sub-block scales,
/// and the pointer tables.
pub const GEMM_RF_SMEM_Q4K: u32 = 229_888;
/// Q4_K on 128-token tiles (`RF_SMEM_Q4_K_128`: two stages).
pub const GEMM_RF_SMEM_Q4K_128: u32 = 226_304;
/// The same for Q6_K (`RF_SMEM_Q6_K`: two stages of 216-byte row slots).
pub const GEMM_RF_SMEM_Q6K: u32 = 199_168;
/// Q6_K's grouped products on 96-pair passes (`RF_SMEM_Q6_K_96`: two stages; 256 bytes under
/// the 227 KiB a block may take).
pub const GEMM_RF_SMEM_Q6K_96: u32 = 232_192;
/// CT4 (`RF_SMEM_CT4`: three stages of 160-byte row slots, no scale table).
pub const GEMM_RF_SMEM_CT4: u32 = 223_744;
/// CT4 on 128-token tiles (`RF_SMEM_CT4_128`: two stages).
pub const GEMM_RF_SMEM_CT4_128: u32 = 216_064;
/// CT8 (`RF_SMEM_CT8`: two stages of 288-byte row slots, 64-token tiles only).
pub const GEMM_RF_SMEM_CT8: u32 = 215_552;

/// Blocks a cluster of `moe_gate_up_mixed_q8_*` holds along x (`mmvq.cu`'s `GU_CLUSTER`):
/// with four warps a block, one row pair a warp, a cluster's rows are one 32-row Q8_0 group.
pub const GATE_UP_CLUSTER: u32 = 8;

/// Rows a warp of an `mv_*` launch takes ([`crate::device::Device::mv`]'s grid): 2 for the
/// float kernels `mv_bf16`, `mv_f16`, `mv_rinv_bf16` and `mv_rinv_f16` under `H_ROWS=2` (a
/// lab switch in `LAGOON_CUDA_DEFINES`, read once; `mmvq.cu`'s `mv_multi_pair`: the pairs
/// counted per matrix, `(rows + 1) / 2` each), else 1.
pub fn mv_rows_per_warp(kernel: K) -> usize {
    static H_ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    if matches!(kernel, K::MvBf16 | K::MvF16 | K::MvRinvBf16 | K::MvRinvF16) {
        *H_ROWS.get_or_init(|| {
            // (The kernel refuses to compile with any other value.)
            match crate::compile::lab_define("H_ROWS").map(|v| v.parse::<usize>()) {
                Some(Ok(2)) => 2,
                _ => 1,
            }
        })
    } else {
        1
    }
}

/// Blocks along x of an expert gate/up kernel of the `mvq` set (`moe_gate_up_q` /
/// `moe_gate_up_mixed`, four warps a block) for `rows` rows of `h` columns: one row pair a
/// warp, except the Q4_K kernel's `GU_Q4K_RPW` pairs a warp (a lab switch in
/// `LAGOON_CUDA_DEFINES`, 1 unless given there, as in the kernel; ignored under
/// `GU_Q4K_ROWS=0`) on rows of at most `4 · Q4K_BATCH` = 12 super-blocks.
pub fn gate_up_blocks(kernel: K, rows: usize, h: usize) -> u32 {
    static RPW: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let rpw = if kernel == K::GateUpQQ4K && h <= 3 * 4 * 256 {
        *RPW.get_or_init(|| {
            if crate::compile::lab_define("GU_Q4K_ROWS").as_deref() == Some("0") {
                return 1;
            }
            crate::compile::lab_define("GU_Q4K_RPW")
                .and_then(|v| v.parse().ok())
                .filter(|&n| n >= 1)
                .unwrap_or(1)
        })
    } else {
        1
    };
    crate::device::blocks(rows, 4 * rpw)
}

/// The `gemm_rf.cu` kernels for weights of type `ty` whose rows are `cols` long, for token
/// tiles (dense) or expert tiles (grouped) of `tile` pairs (64 or 128), where that path takes
/// them: Q4_K, Q6_K rows of a multiple of four super-blocks (each stage's copy needs
/// 8-byte-aligned rows), and CT4 and CT8 rows of a multiple of 256 columns. Q4_K and CT4 have
/// kernels for both tiles. The 128-token rings of Q6_K and CT8 would not fit in shared
/// memory: Q6_K's grouped kernels for 128-pair expert tiles take passes of 96 pairs, CT8's
/// are the 64-pair kernels (two passes), and the dense products of both stay on 64-token
/// tiles (the 128-tile set's `dense` is the 64-token kernel; only Q4_K's dense products take
/// 128-token tiles).
pub fn gemm_rf(ty: WType, cols: usize, tile: usize) -> Option<GemmKernels> {
    let k = |dense, gate_up, down| GemmKernels {
        dense,
        gate_up,
        down,
    };
    match (ty, tile) {
        (WType::Q4K, 64) => Some(k(K::GemmRfQ4K, K::GemmGateUpRfQ4K, K::GemmDownRfQ4K)),
        (WType::Q4K, 128) => Some(k(
            K::GemmRf128Q4K,
            K::GemmGateUpRf128Q4K,
            K::GemmDownRf128Q4K,
        )),
        (WType::Q6K, 64) if cols.is_multiple_of(1024) => {
            Some(k(K::GemmRfQ6K, K::GemmGateUpRfQ6K, K::GemmDownRfQ6K))
        }
        (WType::Q6K, 128) if cols.is_multiple_of(1024) => {
            Some(k(K::GemmRfQ6K, K::GemmGateUpRf96Q6K, K::GemmDownRf96Q6K))
        }
        (WType::Ct4, 64) if cols.is_multiple_of(256) => {
            Some(k(K::GemmRfCt4, K::GemmGateUpRfCt4, K::GemmDownRfCt4))
        }
        (WType::Ct4, 128) if cols.is_multiple_of(256) => Some(k(
            K::GemmRf128Ct4,
            K::GemmGateUpRf128Ct4,
            K::GemmDownRf128Ct4,
        )),
        (WType::Ct8, 64 | 128) if cols.is_multiple_of(256) => {
            Some(k(K::GemmRfCt8, K::GemmGateUpRfCt8, K::GemmDownRfCt8))
        }
        _ => None,
    }
}

/// The `gemm_rf.cu` kernels whose products run on Hopper's warpgroup MMA (`wgmma`, sm_90a
/// only: the caller checks the device) for weights of type `ty`, on token or expert tiles of
/// `tile` (64 or 128): Q4_K so far; other types return `None` and keep [`gemm_rf`]'s.
pub fn gemm_wg(ty: WType, tile: usize) -> Option<GemmKernels> {
    let k = |dense, gate_up, down| GemmKernels {
        dense,
        gate_up,
        down,
    };
    match (ty, tile) {
        (WType::Q4K, 64) => Some(k(K::GemmWgQ4K, K::GemmGateUpWgQ4K, K::GemmDownWgQ4K)),
        (WType::Q4K, 128) => Some(k(
            K::GemmWg128Q4K,
            K::GemmGateUpWg128Q4K,
            K::GemmDownWg128Q4K,
        )),
        _ => None,
    }
}

/// The quantised-activation kernels of one weight type (`mmvq.cu`).
#[derive(Clone, Copy, Debug)]
pub struct MvqKernels {
    /// Up to four products of one input (`mv_*`).
    pub mv: K,
    /// Gate and up with SwiGLU fused (`mv_swiglu_*`).
    pub swiglu: K,
    /// Routed (and shared) experts' gate/up (`moe_gate_up_q_*`).
    pub gate_up: K,
    /// Experts' down with the weighted sum, shared expert and residual (`moe_down_q_*`).
    pub down: K,
}

/// An activation format of the quantised mat-vec path (`act.cu`): ggml's Q8_K or Q8_0
/// values, the CPU's struct-of-arrays layout, rows padded to [`ACT_ROW_ALIGN`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActQ {
    Q8K,
    Q8_0,
}

/// Alignment of every quantised activation row (the kernels load the quants 16 bytes at a
/// time).
pub const ACT_ROW_ALIGN: usize = 16;

impl ActQ {
    /// Elements per block (the row length must be a multiple).
    pub fn block(self) -> usize {
        match self {
            ActQ::Q8K => 256,
            ActQ::Q8_0 => 32,
        }
    }
    /// Bytes between consecutive rows of `cols` elements.
    pub fn row_stride(self, cols: usize) -> usize {
        let nb = cols / self.block();
        let b = match self {
            ActQ::Q8K => cols + 4 * nb + 32 * nb,
            ActQ::Q8_0 => cols + 8 * nb,
        };
        b.next_multiple_of(ACT_ROW_ALIGN)
    }
    /// The quantiser kernel.
    pub fn kernel(self) -> K {
        match self {
            ActQ::Q8K => K::QuantizeQ8K,
            ActQ::Q8_0 => K::QuantizeQ8_0,
        }
    }
    /// RMSNorm of one row with this quantisation fused (`fused.cu`).
    pub fn norm_kernel(self) -> K {
        match self {
            ActQ::Q8K => K::RmsNormQ8K,
            ActQ::Q8_0 => K::RmsNormQ8_0,
        }
    }
    /// The merge of split-K attention states with the output gate and this quantisation
    /// fused (`fused.cu`).
    pub fn merge_gate_kernel(self) -> K {
        match self {
            ActQ::Q8K => K::AttentionMergeGateQ8K,
            ActQ::Q8_0 => K::AttentionMergeGateQ8_0,
        }
    }
    /// Heads per block of [`Self::merge_gate_kernel`] for head_dim `d` (the fewest whose
    /// values fill whole blocks), if that block fits the kernel (`MGQ_MAX` values, 32 heads).
    pub fn merge_heads(self, d: usize) -> Option<usize> {
        let (mut a, mut b) = (d, self.block());
        while b != 0 {
            (a, b) = (b, a % b);
        }
        let g = self.block() / a;
        (d > 0 && g <= MERGE_QUANT_HEADS && g * d <= MERGE_QUANT_MAX).then_some(g)
    }
}

/// Values per block of the fused merge + quantise kernels (`MGQ_MAX`).
pub const MERGE_QUANT_MAX: usize = 1024;
/// Heads per block those kernels hold statistics for (`MGQ_MAX / 32`).
pub const MERGE_QUANT_HEADS: usize = 32;
/// Threads per block of those kernels (`MGQ_THREADS`).
pub const MERGE_QUANT_THREADS: u32 = 128;

/// The loaded kernels, indexed by [`K`].
#[derive(Debug)]
pub struct Kernels {
    funcs: Vec<CudaFunction>,
    /// The loaded modules by source file (their globals: `trace.rs`).
    pub modules: Vec<(&'static str, Arc<cudarc::driver::CudaModule>)>,
}

impl Kernels {
    /// Compiles (or takes from the cache) every source for `arch` and resolves every
    /// manifest entry once.
    pub fn load(ctx: &Arc<CudaContext>, arch: &str) -> Result<Kernels, CudaError> {
        // One NVRTC program per source, compiled in parallel (NVRTC is thread-safe across
        // programs); a cache hit returns at once.
        let cache = compile::cache_dir();
        let cache = cache.as_deref();
        let ptxs: Vec<Result<_, CudaError>> = std::thread::scope(|sc| {
            let handles: Vec<_> = compile::SOURCES
                .iter()
                .map(|&(file, src)| sc.spawn(move || compile::compile(file, src, arch, cache)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("NVRTC compile thread panicked"))
                .collect()
        });
        let mut modules = Vec::new();
        for (&(file, _), ptx) in compile::SOURCES.iter().zip(ptxs) {
            let module = ctx.load_module(ptx?).map_err(|source| CudaError::Driver {
                what: "loading a compiled kernel module",
                source,
            })?;
            modules.push((file, module));
        }
        let mut funcs = Vec::with_capacity(MANIFEST.len());
        for (i, &(k, file, name)) in MANIFEST.iter().enumerate() {
            debug_assert_eq!(k as usize, i);
            let (_, module) = modules
                .iter()
                .find(|(f, _)| *f == file)
                .expect("every manifest file is in SOURCES (unit-tested)");
            let f = module
                .load_function(name)
                .map_err(|source| CudaError::MissingKernel {
                    file,
                    kernel: name,
                    source,
                })?;
            let smem = k.dyn_smem();
            if smem > 0 {
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
                .map_err(|source| CudaError::Driver {
                    what: "allowing a kernel its dynamic shared memory",
                    source,
                })?;
            }
            funcs.push(f);
        }
        Ok(Kernels { funcs, modules })
    }

    pub fn get(&self, k: K) -> &CudaFunction {
        &self.funcs[k as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of kernel source `file` (`compile::SOURCES`).
    fn source(file: &str) -> &'static str {
        compile::SOURCES
            .iter()
            .find(|(f, _)| *f == file)
            .unwrap_or_else(|| panic!("no kernel source {file}"))
            .1
    }

    #[test]
    fn manifest_is_in_enum_order_and_files_exist() {
        for (i, &(k, file, name)) in MANIFEST.iter().enumerate() {
            assert_eq!(k as usize, i, "{name}");
            assert!(compile::SOURCES.iter().any(|(f, _)| *f == file), "{file}");
        }
    }

    #[test]
    fn gemm_h16_shared_memory_matches_the_kernel_source() {
        let src = source("gemm_h.cu");
        assert!(src.contains(&format!("#define GH_SMEM {GEMM_H16_SMEM}\n")));
        assert!(src.contains(&format!("#define GH_BM {GEMM_H16_TILE}\n")));
        assert!(src.contains(&format!("#define GH_BN {GEMM_H16_TILE}\n")));
    }

    #[test]
    fn flash_shared_memory_matches_the_kernel_source() {
        let src = source("flash.cu");
        // FLASH_SMEM = FA_TILE_HALVES (2 FA_BK FA_KLD) halves.
        for def in [
            "#define FA_D 128\n",
            "#define FA_BK 64\n",
            "#define FA_KLD (FA_D + 8)\n",
            "#define FA_TILE_HALVES (2 * FA_BK * FA_KLD)\n",
            "#define FA_Q8_LD (FA_D + 16)\n",
            "#define FA_Q8_STAGE (2 * FA_BK * FA_Q8_LD + 2 * FA_BK * (FA_D / 32) * 2)\n",
        ] {
            assert!(src.contains(def), "flash.cu lost `{}`", def.trim());
        }
        assert_eq!(FLASH_SMEM, 2 * 64 * (128 + 8) * 2);
        // The q8_0 kernels: the f16 buffer, then two FA_Q8_STAGE bytes; three blocks per SM
        // must still fit the H200's 227 KiB (plus 1 KiB reserved per block).
        assert_eq!(
            FLASH_SMEM_Q8,
            FLASH_SMEM + 2 * (2 * 64 * (128 + 16) + 2 * 64 * (128 / 32) * 2)
        );
        const { assert!(3 * (FLASH_SMEM_Q8 + 1024) <= 228 * 1024) };
    }

    #[test]
    fn merge_quantise_constants_match_the_kernel_source() {
        let src = source("fused.cu");
        for def in [
            format!("#define MGQ_THREADS {MERGE_QUANT_THREADS}\n"),
            format!("#define MGQ_MAX {MERGE_QUANT_MAX}\n"),
            format!("hm[MGQ_MAX / {}]", MERGE_QUANT_MAX / MERGE_QUANT_HEADS),
        ] {
            assert!(src.contains(&def), "fused.cu lost `{}`", def.trim());
        }
        // The merges' shared scratch: MAX_SPLITS splits of MERGE_QUANT_HEADS heads.
        let merge = compile::HEADERS
            .iter()
            .find(|(f, _)| *f == "merge.cuh")
            .unwrap()
            .1;
        for def in [
            format!("#define MERGE_SPLITS_MAX {}\n", crate::session::MAX_SPLITS),
            format!("#define MERGE_MAX ({MERGE_QUANT_HEADS} * MERGE_SPLITS_MAX)\n"),
        ] {
            assert!(merge.contains(&def), "merge.cuh lost `{}`", def.trim());
        }
    }

    #[test]
    fn merge_heads_fill_whole_quantiser_blocks() {
        // head_dim 128 (S 2.1): two heads per Q8_K block, one per Q8_0 block; the tiny
        // fixtures' 16: 16 and 2; 96: 8 heads (768 values); blocks past the kernel's limits
        // (64 heads of 4, or no head dim) have no fused kernel.
        for (fmt, d, want) in [
            (ActQ::Q8K, 128, Some(2)),
            (ActQ::Q8_0, 128, Some(1)),
            (ActQ::Q8K, 16, Some(16)),
            (ActQ::Q8_0, 16, Some(2)),
            (ActQ::Q8K, 96, Some(8)),
            (ActQ::Q8K, 4, None),
            (ActQ::Q8K, 0, None),
        ] {
            assert_eq!(fmt.merge_heads(d), want, "{fmt:?} d {d}");
            if let Some(g) = want {
                assert!((g * d).is_multiple_of(fmt.block()) && g * d <= MERGE_QUANT_MAX);
            }
        }
    }

    #[test]
    fn gemm_rf_ct8_takes_whole_eight_block_units_on_64_token_kernels() {
        // CT8's ring holds 64-token tiles only: a 128-pair expert tile runs the same kernels
        // (two passes), and rows must be whole 288-byte units (256 columns) for the copies.
        for tile in [64, 128] {
            let k = gemm_rf(WType::Ct8, 768, tile).expect("gemm_rf takes CT8 rows of 768");
            assert_eq!(
                (k.dense, k.gate_up, k.down),
                (K::GemmRfCt8, K::GemmGateUpRfCt8, K::GemmDownRfCt8),
                "tile {tile}"
            );
            assert_eq!(k.gate_up.dyn_smem(), GEMM_RF_SMEM_CT8);
        }
        assert!(
            gemm_rf(WType::Ct8, 544, 64).is_none(),
            "544 columns is not whole units"
        );
    }

    /// The clustered gate/up's cluster width (`GATE_UP_CLUSTER`, which the host's grid must
    /// be a multiple of) is mmvq.cu's `GU_CLUSTER`, and each `moe_mixed_q8` pair names the
    /// kernels its `moe_mixed` pair's quantising and late forms.
    #[test]
    fn gate_up_cluster_matches_the_kernel_source() {
        let src = source("mmvq.cu");
        assert!(
            src.contains(&format!("#define GU_CLUSTER {GATE_UP_CLUSTER}\n")),
            "GATE_UP_CLUSTER differs from mmvq.cu's GU_CLUSTER"
        );
        for gate in [WType::Ct4, WType::Ct8] {
            for shared in [WType::Bf16, WType::F16] {
                let (gu, down) = gate.moe_mixed(shared).unwrap();
                let (gq, late) = gate.moe_mixed_q8(shared).unwrap();
                assert_eq!(
                    gq.name()
                        .replace("moe_gate_up_mixed_q8_", "moe_gate_up_mixed_"),
                    gu.name()
                );
                assert_eq!(
                    late.name()
                        .replace("moe_down_mixed_late_", "moe_down_mixed_"),
                    down.name()
                );
            }
        }
        assert_eq!(WType::Q4K.moe_mixed_q8(WType::Bf16), None);
    }

    #[test]
    fn gemm_rf_shared_memory_matches_the_kernel_source() {
        let src = source("gemm_rf.cu");
        for (name, v) in [
            ("Q4_K", GEMM_RF_SMEM_Q4K),
            ("Q4_K_128", GEMM_RF_SMEM_Q4K_128),
            ("Q6_K", GEMM_RF_SMEM_Q6K),
            ("Q6_K_96", GEMM_RF_SMEM_Q6K_96),
            ("CT4", GEMM_RF_SMEM_CT4),
            ("CT4_128", GEMM_RF_SMEM_CT4_128),
            ("CT8", GEMM_RF_SMEM_CT8),
        ] {
            assert!(
                src.contains(&format!("#define RF_SMEM_{name} {v}\n")),
                "GEMM_RF_SMEM for {name} differs from gemm_rf.cu's RF_SMEM_{name}"
            );
        }
    }
}
