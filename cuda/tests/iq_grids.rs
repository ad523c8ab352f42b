//! `cuda/kernels/iq_grids.cuh` holds ggml's codebook tables for the IQ2_XXS, IQ2_S and IQ3_XXS
//! decoders (`quant.cuh`) as CUDA arrays. It is generated from `lagoon_core::quant::tables`
//! (whose values are checked against ggml's by hash in that crate), and this test keeps the
//! two equal: it renders the header from the Rust tables and compares it with the committed
//! file byte for byte. After a table change, `LAGOON_BLESS=1 cargo test -p lagoon-cuda --test
//! iq_grids` rewrites the file.

use lagoon_core::quant::tables::{IQ2S_GRID, IQ2XXS_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use std::fmt::Write;
use std::path::PathBuf;

fn array<T: Copy>(
    out: &mut String,
    ty: &str,
    name: &str,
    v: &[T],
    per_line: usize,
    fmt: impl Fn(T) -> String,
) {
    writeln!(out, "__device__ const {ty} {name}[{}] = {{", v.len()).unwrap();
    for line in v.chunks(per_line) {
        let items: Vec<String> = line.iter().map(|&x| fmt(x)).collect();
        writeln!(out, "    {},", items.join(", ")).unwrap();
    }
    out.push_str("};\n");
}

fn render() -> String {
    let mut s = String::new();
    s.push_str(
        "// Generated from lagoon_core::quant::tables by cuda/tests/iq_grids.rs (which checks that\n\
         // this file is what the tables render to; LAGOON_BLESS=1 rewrites it). ggml's codebooks:\n\
         // the sign patterns of 7-bit indices (KSIGNS_IQ2XS, even parity) and the grid points of\n\
         // IQ2_XXS (8 magnitudes per u64), IQ2_S (u64) and IQ3_XXS (4 magnitudes per u32), bytes\n\
         // little-endian. Read through L1 with divergent indices, so global, not __constant__.\n\
         #pragma once\n\n",
    );
    array(
        &mut s,
        "unsigned char",
        "ksigns_iq2xs",
        &KSIGNS_IQ2XS,
        16,
        |x| format!("{x:3}"),
    );
    s.push('\n');
    array(
        &mut s,
        "unsigned long long",
        "iq2xxs_grid",
        &IQ2XXS_GRID,
        4,
        |x| format!("0x{x:016x}ull"),
    );
    s.push('\n');
    array(
        &mut s,
        "unsigned long long",
        "iq2s_grid",
        &IQ2S_GRID,
        4,
        |x| format!("0x{x:016x}ull"),
    );
    s.push('\n');
    array(
        &mut s,
        "unsigned int",
        "iq3xxs_grid",
        &IQ3XXS_GRID,
        8,
        |x| format!("0x{x:08x}u"),
    );
    s
}

#[test]
fn iq_grid_header_matches_the_core_tables() {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/kernels/iq_grids.cuh"));
    let want = render();
    if std::env::var_os("LAGOON_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} differs from lagoon_core's tables: run LAGOON_BLESS=1 cargo test -p lagoon-cuda --test iq_grids",
        path.display()
    );
}
