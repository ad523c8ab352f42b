//! A borrowed 2-D weight matrix in whatever encoding the checkpoint stores it, and the
//! reference decoder of one row. Rows run along the input (contraction) dimension, as in
//! PyTorch's `[out_features, in_features]` and GGUF's `ne = [in, out]`.

use crate::dtype::GgmlType;
use crate::quant;
use crate::quant::ct::CtMatrix;

/// How a matrix's bytes encode its values.
#[derive(Clone, Copy, Debug)]
pub enum Encoding<'a> {
    /// Rows of ggml blocks, back to back, no padding between rows (F32/F16/BF16 included,
    /// which is also how safetensors stores them).
    Ggml { ty: GgmlType, data: &'a [u8] },
    /// A compressed-tensors quantised Linear (pack-quantized int, int8, FP8).
    Ct(CtMatrix<'a>),
}

/// A `rows × cols` matrix view. Row `r` is output channel `r`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub rows: usize,
    pub cols: usize,
    pub enc: Encoding<'a>,
}

impl<'a> MatRef<'a> {
    /// Decodes row `r` into `out[..cols]` with the scalar reference decoder.
    ///
    /// Loading validated the sizes; here they are only debug-asserted.
    pub fn dequant_row(&self, r: usize, out: &mut [f32]) {
        debug_assert!(r < self.rows && out.len() >= self.cols);
        match &self.enc {
            Encoding::Ggml { ty, data } => {
                let rb = ty.row_bytes(self.cols as u64).unwrap_or(0) as usize;
                quant::dequantize_row(*ty, &data[r * rb..(r + 1) * rb], &mut out[..self.cols]);
            }
            Encoding::Ct(m) => m.dequant_row(r, &mut out[..self.cols]),
        }
    }

    /// The element type name, for printing (`q4_K`, `ct-int4-g32`, ...).
    pub fn type_name(&self) -> TypeName {
        match &self.enc {
            Encoding::Ggml { ty, .. } => TypeName::Ggml(*ty),
            Encoding::Ct(m) => TypeName::Ct(m.kind()),
        }
    }

    /// Bytes the encoded matrix occupies (scales included).
    pub fn n_bytes(&self) -> usize {
        match &self.enc {
            Encoding::Ggml { data, .. } => data.len(),
            Encoding::Ct(m) => m.n_bytes(),
        }
    }
}

/// A printable weight type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TypeName {
    Ggml(GgmlType),
    Ct(quant::ct::CtKind),
}

impl core::fmt::Display for TypeName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TypeName::Ggml(t) => write!(f, "{t}"),
            TypeName::Ct(k) => write!(f, "{k}"),
        }
    }
}
