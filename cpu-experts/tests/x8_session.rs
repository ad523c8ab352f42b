//! The repacked 8-row Q4_K kernels inside a session (on by default where the copy fits;
//! `LAGOON_CPU_X8=0|1`, which `Session::new` reads: this binary holds one test, so no other
//! test sees the setting).

#[allow(dead_code)] // (this binary uses the config and raw buffers only)
mod common;

use lagoon_core::dtype::GgmlType;
use lagoon_core::laguna::ModelWeights;

/// Random IQ4_XS rows (random codes and scale bits; small f16 `d`).
fn iq4xs(rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    let mut next = move || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    let mut w = vec![0u8; rows * cols / 256 * 136];
    for blk in w.chunks_exact_mut(136) {
        for b in blk.iter_mut() {
            *b = next() as u8;
        }
        let d = half::f16::from_f32(2e-4 + (next() % 100) as f32 * 1e-6);
        blk[0..2].copy_from_slice(&d.to_le_bytes());
    }
    w
}

/// Random Q6_K rows (random quants and scales; small f16 `d`).
fn q6k(rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    let mut next = move || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    let mut w = vec![0u8; rows * cols / 256 * 210];
    for blk in w.chunks_exact_mut(210) {
        for b in blk.iter_mut() {
            *b = next() as u8;
        }
        let d = half::f16::from_f32(2e-5 + (next() % 100) as f32 * 1e-7);
        blk[208..210].copy_from_slice(&d.to_le_bytes());
    }
    w
}

fn logits(
    c: &lagoon_core::config::ModelConfig,
    w: &ModelWeights<'_>,
    toks: &[u32],
    ubatch: usize,
) -> Vec<f32> {
    common::session_logits(c, w, toks, ubatch, 2)
}

/// A model whose attention Q/K/V/gate and MLP matrices are Q4_K, IQ4_XS and Q6_K with 256-wide rows, run with
/// the repacked kernels and without: close (the repacked products are the scalar reference's,
/// a SIMD table's differ from it by f32 rounding) but not the same bits (the setting took
/// effect), or the same bits when the table is the scalar one (`LAGOON_FORCE_SCALAR=1`);
/// one-shot prefill, chunks and decode agree with the repacked kernels as they do without.
#[test]
fn repacked_q4k_products_in_a_session() {
    let mut c = common::config();
    c.hidden_size = 256;
    c.dense_ffn = 256;
    c.expert_ffn = 256;
    c.shared_ffn = 256;
    let store = common::Store::new(&c, Some(3));
    let mut seed = 0x5eed_0008u64;
    // Q4_K, IQ4_XS and Q6_K (all repacked), in turn over the names in sorted order.
    let mut q = common::Overrides::default();
    let mut names: Vec<&String> = store.bufs.keys().collect();
    names.sort();
    for name in names {
        let parts = &store.bufs[name];
        if parts.iter().all(|(r, cc, _)| r % 8 == 0 && cc % 256 == 0) {
            let ty = [GgmlType::Q4K, GgmlType::IQ4XS, GgmlType::Q6K][q.len() % 3];
            let make = match ty {
                GgmlType::Q4K => common::q4k,
                GgmlType::IQ4XS => iq4xs,
                _ => q6k,
            };
            q.insert(
                name.clone(),
                (
                    ty,
                    parts
                        .iter()
                        .map(|(r, cc, _)| make(*r, *cc, &mut seed))
                        .collect(),
                ),
            );
        }
    }
    assert!(q.len() >= 9, "Q4_K / IQ4_XS / Q6_K matrices: {}", q.len());
    let w = store.weights_with(&c, &q);
    let toks: Vec<u32> = (0..19)
        .map(|i| (i * 37 + 5) % c.vocab_size as u32)
        .collect();
    // SAFETY: this binary's only test; set before the sessions below read them. (`=1`: every
    // Q6_K matrix, the output too.)
    unsafe { std::env::set_var("LAGOON_CPU_X8_Q6K", "1") };
    // SAFETY: as above.
    unsafe { std::env::set_var("LAGOON_CPU_X8", "0") };
    let plain = logits(&c, &w, &toks, toks.len());
    // SAFETY: as above.
    unsafe { std::env::remove_var("LAGOON_CPU_X8") };
    // The default: repacked where the copy fits (it does: a few hundred KB) and the CPU is
    // not one where the one-row kernels decode faster.
    let auto = logits(&c, &w, &toks, toks.len());
    // SAFETY: as above.
    unsafe { std::env::set_var("LAGOON_CPU_X8", "1") };
    let one = logits(&c, &w, &toks, toks.len());
    let by_default = lagoon_cpu::kernels::x8::repack_by_default();
    assert_eq!(
        auto.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        if by_default { &one } else { &plain }
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>(),
        "the default did not follow repack_by_default() = {by_default}"
    );
    assert!(one.iter().all(|v| v.is_finite()));
    let e = common::rel_l2(&one, &plain);
    let table = lagoon_cpu::kernels::Kernels::detect();
    // Per token: a near-tie in a token's expert scores can flip its top-k under another
    // rounding, and every later token with it (seen here: ~3e-7 up to token 16, then 1.5e-2),
    // so the closeness check takes the median token.
    let v = c.vocab_size;
    let mut per: Vec<f64> = (0..toks.len())
        .map(|t| common::rel_l2(&one[t * v..(t + 1) * v], &plain[t * v..(t + 1) * v]))
        .collect();
    per.sort_by(f64::total_cmp);
    let median = per[per.len() / 2];
    println!(
        "repacked vs {} table kernels: rel L2 {e:.3e}, per-token median {median:.3e}",
        table.name()
    );
    if table.name() == "scalar" {
        // LAGOON_FORCE_SCALAR=1: the table is the scalar reference, whose bits the repacked
        // kernels give.
        assert_eq!(e, 0.0, "repacked vs scalar table: rel L2 {e:.3e}");
    } else {
        assert!(e > 0.0, "LAGOON_CPU_X8=1 changed nothing against =0");
        assert!(
            median < 1e-5,
            "repacked vs table kernels: per-token median {median:.3e}"
        );
    }
    for ubatch in [1, 4] {
        let other = logits(&c, &w, &toks, ubatch);
        let e = common::rel_l2(&other, &one);
        println!("repacked, ubatch {ubatch} vs one-shot: rel L2 {e:.3e}");
        assert!(e < 1e-5, "ubatch {ubatch}: rel L2 {e:.3e}");
    }
    // SAFETY: as above; no session reads it after this.
    unsafe { std::env::remove_var("LAGOON_CPU_X8") };
    // The option decides without the variable.
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let off = common::session_logits_repack(&c, &w, &toks, toks.len(), 2, Some(false));
    let on = common::session_logits_repack(&c, &w, &toks, toks.len(), 2, Some(true));
    assert_eq!(bits(&off), bits(&plain), "repack: Some(false)");
    assert_eq!(bits(&on), bits(&one), "repack: Some(true)");
}
