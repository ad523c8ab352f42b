//! compressed-tensors quantised Linears (spec/formats.md §7): pack-quantized int4/int8 (group
//! and channel, symmetric and asymmetric), int-quantized int8, float-quantized FP8 E4M3.

/// Which compressed-tensors encoding a matrix uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CtKind {
    PackedInt {
        bits: u8,
        group: u32,
        symmetric: bool,
    },
    Fp8,
}

impl core::fmt::Display for CtKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CtKind::PackedInt {
                bits,
                group,
                symmetric,
            } => {
                write!(
                    f,
                    "ct-int{bits}-g{group}{}",
                    if *symmetric { "" } else { "-asym" }
                )
            }
            CtKind::Fp8 => f.write_str("ct-fp8"),
        }
    }
}

/// A compressed-tensors matrix (placeholder until the decoders land).
#[derive(Clone, Copy, Debug)]
pub struct CtMatrix<'a> {
    pub kind: CtKind,
    pub data: &'a [u8],
}

impl CtMatrix<'_> {
    pub fn kind(&self) -> CtKind {
        self.kind
    }
    pub fn n_bytes(&self) -> usize {
        self.data.len()
    }
    pub fn dequant_row(&self, _r: usize, out: &mut [f32]) {
        out.fill(f32::NAN);
    }
}
