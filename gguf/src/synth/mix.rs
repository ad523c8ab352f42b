//! Tensor roles and the type mixes that assign a ggml type to each role, modelled on what
//! llama.cpp's `llama-quant.cpp` and unsloth's "UD" recipes produce (spec/formats.md §2.3,
//! §5).

use lagoon_core::dtype::GgmlType;

/// What a tensor is in the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    TokenEmbd,
    Output,
    OutputNorm,
    AttnNorm,
    Q,
    K,
    V,
    QNorm,
    KNorm,
    AttnGate,
    O,
    FfnNorm,
    DenseGate,
    DenseUp,
    DenseDown,
    Router,
    RouterBias,
    ExpGate,
    ExpUp,
    ExpDown,
    ShGate,
    ShUp,
    ShDown,
}

impl Role {
    /// A 1-D vector (norm gain or bias): always F32 in GGUF, never quantised.
    pub fn is_vector(self) -> bool {
        matches!(
            self,
            Role::OutputNorm
                | Role::AttnNorm
                | Role::QNorm
                | Role::KNorm
                | Role::FfnNorm
                | Role::RouterBias
        )
    }

    /// A stacked routed-expert tensor `[E, out, in]`.
    pub fn is_routed_expert(self) -> bool {
        matches!(self, Role::ExpGate | Role::ExpUp | Role::ExpDown)
    }
}

/// A checkpoint's type mix (`--types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypeMix {
    /// llama.cpp Q4_K_M: Q4_K, with Q6_K for `output`, and for `attn_v` and the FFN down
    /// projections on the `use_more_bits` layers.
    Q4KM,
    /// llama.cpp Q5_K_M: Q4_K_M's recipe one step up, Q5_K with Q6_K for `output` and for
    /// `attn_v` and the FFN down projections on the `use_more_bits` layers.
    Q5KM,
    /// llama.cpp Q3_K_M: Q3_K, with Q6_K for `output`, Q4_K for `attn_output`, `attn_v` Q5_K
    /// on the first two layers and Q4_K elsewhere, the FFN down projections Q5_K on the first
    /// sixteenth of the layers and Q4_K elsewhere (`llama_tensor_get_type`).
    Q3KM,
    /// llama.cpp Q2_K: Q2_K, with Q6_K for `output` and Q3_K for `attn_v`, `attn_output`
    /// and the FFN down projections.
    Q2K,
    /// llama.cpp Q4_0: Q4_0 for every matrix but `output` (Q6_K).
    Q4_0,
    /// Q8_0 for every matrix.
    Q8_0,
    /// unsloth UD-Q3_K_M-like: routed experts IQ3_XXS (down Q4_K on `use_more_bits`
    /// layers), attention, dense and shared expert Q8_0, embeddings Q4_K, output Q6_K.
    UdQ3KM,
    /// UD-IQ2_M-like: expert gate/up IQ2_XXS, down IQ2_S (one step up), attention,
    /// dense and shared expert Q4_K, embeddings Q4_K, output Q5_K.
    Iq2M,
    /// UD-IQ1_M-like: expert gate/up IQ1_M, down IQ2_XXS, the rest as [`TypeMix::Iq2M`].
    Iq1M,
    /// UD-IQ1_S-like: expert gate/up IQ1_S, down IQ2_XXS, the rest as [`TypeMix::Iq2M`].
    Iq1S,
    /// llama.cpp IQ4_XS: IQ4_XS, with Q6_K for `output` and Q5_K for `attn_v` (llama.cpp's
    /// `llama_tensor_get_type` gives the value projection Q5_K under IQ4_XS when the GQA
    /// group is 4 or more, as Laguna's 6 and 9 are).
    Iq4Xs,
    /// llama.cpp IQ4_NL: IQ4_XS's recipe with IQ4_NL (32-element blocks, one f16 scale each):
    /// Q6_K `output`, Q5_K `attn_v`. (Both recipes as quantised with an importance matrix,
    /// as published files are; without one llama.cpp also gives the first eighth of the
    /// layers' FFN down projections Q5_K.)
    Iq4Nl,
    /// llama.cpp MXFP4_MOE: the routed experts MXFP4, every other matrix Q8_0 (`output`
    /// included).
    Mxfp4Moe,
    /// BF16 matrices (an unquantised conversion).
    Bf16,
    /// compressed-tensors W4A16 group 32 directory (poolside's INT4 release layout).
    Int4G32,
    /// compressed-tensors INT8 W8A8 directory (llm-compressor's `W8A8` scheme: int-quantized
    /// `I8` routed experts, one bf16 scale per output channel, dynamic per-token int8
    /// activations), everything else as in the INT4 layout.
    Int8,
}

impl TypeMix {
    pub const ALL: [TypeMix; 16] = [
        TypeMix::Q4KM,
        TypeMix::Q5KM,
        TypeMix::Q3KM,
        TypeMix::Q2K,
        TypeMix::Q4_0,
        TypeMix::Q8_0,
        TypeMix::UdQ3KM,
        TypeMix::Iq2M,
        TypeMix::Iq1M,
        TypeMix::Iq1S,
        TypeMix::Iq4Xs,
        TypeMix::Iq4Nl,
        TypeMix::Mxfp4Moe,
        TypeMix::Bf16,
        TypeMix::Int4G32,
        TypeMix::Int8,
    ];

    /// The CLI spelling.
    pub fn name(self) -> &'static str {
        match self {
            TypeMix::Q4KM => "q4_k_m",
            TypeMix::Q5KM => "q5_k_m",
            TypeMix::Q3KM => "q3_k_m",
            TypeMix::Q2K => "q2_k",
            TypeMix::Q4_0 => "q4_0",
            TypeMix::Q8_0 => "q8_0",
            TypeMix::UdQ3KM => "ud-q3_k_m",
            TypeMix::Iq2M => "iq2_m",
            TypeMix::Iq1M => "iq1_m",
            TypeMix::Iq1S => "iq1_s",
            TypeMix::Iq4Xs => "iq4_xs",
            TypeMix::Iq4Nl => "iq4_nl",
            TypeMix::Mxfp4Moe => "mxfp4_moe",
            TypeMix::Bf16 => "bf16",
            TypeMix::Int4G32 => "int4-g32",
            TypeMix::Int8 => "int8",
        }
    }

    pub fn parse(s: &str) -> Option<TypeMix> {
        TypeMix::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
    }

    /// `general.file_type` (a `llama_ftype`), or `None` for the directory format.
    pub fn file_type(self) -> Option<u32> {
        match self {
            TypeMix::Q4KM => Some(15),
            TypeMix::Q5KM => Some(17),
            TypeMix::Q3KM => Some(12),
            TypeMix::Q2K => Some(10),
            TypeMix::Q4_0 => Some(2),
            TypeMix::Q8_0 => Some(7),
            TypeMix::UdQ3KM => Some(12),
            TypeMix::Iq2M => Some(29),
            TypeMix::Iq1M => Some(31),
            TypeMix::Iq1S => Some(24),
            TypeMix::Iq4Xs => Some(30),
            TypeMix::Iq4Nl => Some(25),
            TypeMix::Mxfp4Moe => Some(38),
            TypeMix::Bf16 => Some(32),
            TypeMix::Int4G32 | TypeMix::Int8 => None,
        }
    }

    /// The GGUF type of a tensor with this role in layer `layer` of `n_layers`, before
    /// the block-size fallback of [`fit_block`].
    pub fn ggml_type(self, role: Role, layer: usize, n_layers: usize) -> GgmlType {
        use GgmlType::*;
        use Role::*;
        if role.is_vector() || role == Router {
            return F32;
        }
        let more = use_more_bits(layer, n_layers);
        match self {
            TypeMix::Q8_0 => Q8_0,
            TypeMix::Q4_0 => match role {
                Output => Q6K,
                _ => Q4_0,
            },
            TypeMix::Bf16 | TypeMix::Int4G32 | TypeMix::Int8 => BF16,
            TypeMix::Q4KM => match role {
                Output => Q6K,
                V | DenseDown | ExpDown | ShDown if more => Q6K,
                _ => Q4K,
            },
            TypeMix::Q5KM => match role {
                Output => Q6K,
                V | DenseDown | ExpDown | ShDown if more => Q6K,
                _ => Q5K,
            },
            TypeMix::Q3KM => match role {
                Output => Q6K,
                V if layer < 2 => Q5K,
                V | O => Q4K,
                DenseDown | ExpDown | ShDown if layer < n_layers / 16 => Q5K,
                DenseDown | ExpDown | ShDown => Q4K,
                _ => Q3K,
            },
            TypeMix::Q2K => match role {
                Output => Q6K,
                V | O | DenseDown | ExpDown | ShDown => Q3K,
                _ => Q2K,
            },
            TypeMix::UdQ3KM => match role {
                TokenEmbd => Q4K,
                Output => Q6K,
                ExpGate | ExpUp => IQ3XXS,
                ExpDown if more => Q4K,
                ExpDown => IQ3XXS,
                _ => Q8_0,
            },
            TypeMix::Iq2M => match role {
                Output => Q5K,
                ExpGate | ExpUp => IQ2XXS,
                ExpDown => IQ2S,
                _ => Q4K,
            },
            TypeMix::Iq1M | TypeMix::Iq1S => match role {
                Output => Q5K,
                ExpGate | ExpUp if self == TypeMix::Iq1M => IQ1M,
                ExpGate | ExpUp => IQ1S,
                ExpDown => IQ2XXS,
                _ => Q4K,
            },
            TypeMix::Iq4Xs => match role {
                Output => Q6K,
                V => Q5K,
                _ => IQ4XS,
            },
            TypeMix::Mxfp4Moe => match role {
                ExpGate | ExpUp | ExpDown => MXFP4,
                _ => Q8_0,
            },
            TypeMix::Iq4Nl => match role {
                Output => Q6K,
                V => Q5K,
                _ => IQ4NL,
            },
        }
    }
}

/// llama.cpp's `use_more_bits(i_layer, n_layers)`: the first and last eighth of the
/// layers and every third layer in between get the larger type.
pub fn use_more_bits(l: usize, n: usize) -> bool {
    l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2
}

/// llama.cpp's fallback when a row (`ne[0]`) is not a whole number of blocks: 256-element
/// types fall back to Q8_0, and anything not a multiple of 32 to BF16.
pub fn fit_block(ty: GgmlType, ne0: u64) -> GgmlType {
    if ne0.is_multiple_of(ty.block().0 as u64) {
        ty
    } else if ne0.is_multiple_of(32) {
        GgmlType::Q8_0
    } else {
        GgmlType::BF16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for m in TypeMix::ALL {
            assert_eq!(TypeMix::parse(m.name()), Some(m));
        }
    }

    #[test]
    fn use_more_bits_matches_llama_cpp_for_40_layers() {
        // n/8 = 5, 7n/8 = 35: layers 0-4, 35-39, and 7, 10, ..., 34.
        let got: Vec<usize> = (0..40).filter(|&l| use_more_bits(l, 40)).collect();
        let mut want: Vec<usize> = (0..5).collect();
        want.extend((7..35).step_by(3));
        want.extend(35..40);
        assert_eq!(got, want);
    }

    #[test]
    fn q4_k_m_bumps_down_projections_on_more_bits_layers() {
        let m = TypeMix::Q4KM;
        assert_eq!(m.ggml_type(Role::ExpDown, 0, 40), GgmlType::Q6K);
        assert_eq!(m.ggml_type(Role::ExpDown, 5, 40), GgmlType::Q4K);
        assert_eq!(m.ggml_type(Role::ExpGate, 0, 40), GgmlType::Q4K);
        assert_eq!(m.ggml_type(Role::Output, 3, 40), GgmlType::Q6K);
        assert_eq!(m.ggml_type(Role::Router, 3, 40), GgmlType::F32);
    }

    #[test]
    fn fallback_keeps_whole_blocks() {
        assert_eq!(fit_block(GgmlType::Q4K, 512), GgmlType::Q4K);
        assert_eq!(fit_block(GgmlType::Q4K, 96), GgmlType::Q8_0);
        assert_eq!(fit_block(GgmlType::IQ2S, 100), GgmlType::BF16);
    }
}
