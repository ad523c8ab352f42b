//! compressed-tensors records: where a quantised Linear's weight, scale and zero-point bytes
//! lie, with the layout that decodes them (`lagoon_core::quant::ct`). Built by the HF loader
//! (`hf::quant`), which checked every span's length against the layout.

use lagoon_core::quant::ct::{CtLayout, CtMatrix};

use crate::checkpoint::Span;

/// Spans and parameters of one compressed-tensors Linear.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtRecord {
    pub layout: CtLayout,
    /// `weight_packed` (pack-quantized) or `weight` (int8 / FP8), row-major.
    pub weight: Span,
    /// `weight_scale` (or HF fp8's `weight_scale_inv`).
    pub scale: Span,
    /// `weight_zero_point`, asymmetric schemes only.
    pub zero: Option<Span>,
}

impl CtRecord {
    /// Resolves the spans to a borrowed matrix.
    pub fn resolve<'a>(&self, bytes: impl Fn(Span) -> &'a [u8]) -> CtMatrix<'a> {
        CtMatrix {
            layout: self.layout,
            weight: bytes(self.weight),
            scale: bytes(self.scale),
            zero: self.zero.map_or(&[][..], &bytes),
        }
    }

    /// Every byte range this record reads.
    pub fn spans(&self) -> Vec<Span> {
        let mut v = vec![self.weight, self.scale];
        v.extend(self.zero);
        v
    }

    /// Checks the layout and that each span has exactly the length the layout implies.
    pub fn check(&self) -> Result<(), lagoon_core::quant::ct::CtError> {
        self.layout.check()?;
        for (buffer, expected, got) in [
            ("weight", self.layout.weight_bytes(), self.weight.len),
            ("weight_scale", self.layout.scale_bytes(), self.scale.len),
            (
                "weight_zero_point",
                self.layout.zero_bytes(),
                self.zero.map_or(0, |s| s.len),
            ),
        ] {
            if expected != got {
                return Err(lagoon_core::quant::ct::CtError::Size {
                    buffer,
                    expected,
                    got,
                });
            }
        }
        Ok(())
    }
}
