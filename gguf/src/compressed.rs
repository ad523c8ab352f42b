//! compressed-tensors records: spans of a quantised Linear's tensors. Placeholder.

use lagoon_core::quant::ct::{CtKind, CtMatrix};

use crate::checkpoint::Span;

/// Spans and parameters of one compressed-tensors Linear.
#[derive(Clone, Debug)]
pub struct CtRecord {
    pub kind: CtKind,
    pub data: Span,
}

impl CtRecord {
    /// Resolves the spans to a borrowed matrix.
    pub fn resolve<'a>(&self, bytes: impl Fn(Span) -> &'a [u8]) -> CtMatrix<'a> {
        CtMatrix {
            kind: self.kind,
            data: bytes(self.data),
        }
    }

    /// Every byte range this record reads.
    pub fn spans(&self) -> Vec<Span> {
        vec![self.data]
    }
}
