//! Lookup tables of the IQ and FP4 types (spec/formats.md §3.0, §3.12): data generated from
//! ggml's `ggml-common.h` by `tools/reference/gen_iq_tables.py`, cross-checked there against
//! gguf-py, and checked here by SHA-256 of their little-endian bytes
//! (`core/tests/quant_ggml.rs`).
//!
//! A grid entry is an integer whose little-endian bytes are the element values: byte 0 (the
//! LSB) is element 0, so `IQ2XXS_GRID[1] = 0x080808080808082b` is `[43, 8, 8, 8, 8, 8, 8, 8]`.
//! Decoders read the points with `to_le_bytes()`, which is right on any host.

mod iq1;
mod iq2;
mod iq3;
mod kvalues;

pub use iq1::IQ1S_GRID;
pub use iq2::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KMASK_IQ2XS, KSIGNS_IQ2XS};
pub use iq3::{IQ3S_GRID, IQ3XXS_GRID};
pub use kvalues::{KVALUES_FP4, KVALUES_IQ4NL};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_bytes_are_elements_in_order() {
        // spec/formats.md §3.12 worked example.
        assert_eq!(IQ2XXS_GRID[1].to_le_bytes(), [43, 8, 8, 8, 8, 8, 8, 8]);
        // iq1s points are int8 bytes; the first one is all -1.
        assert_eq!(IQ1S_GRID[0].to_le_bytes().map(|b| b as i8), [-1; 8]);
    }

    /// `ksigns[i]` is `i` with bit 7 set when `i` has an odd number of ones, so every sign
    /// byte has an even number of set bits (spec §3.12).
    #[test]
    fn ksigns_follow_the_parity_rule() {
        for (i, &s) in KSIGNS_IQ2XS.iter().enumerate() {
            assert_eq!(usize::from(s & 0x7F), i);
            assert_eq!(s.count_ones() % 2, 0, "ksigns[{i}] = {s:#04x}");
        }
        assert_eq!(KMASK_IQ2XS, core::array::from_fn(|j| 1u8 << j));
    }
}
