//! x86-64 kernels: AVX2+FMA+F16C today (AVX-512 VNNI/BF16 variants later, measured on a
//! host that has them).

mod avx2;

use super::super::Table;

/// The best table this CPU supports, or `None` for the scalar one.
pub(crate) fn best_table() -> Option<Table> {
    avx2::Avx2Fma::detect().map(avx2::table)
}
