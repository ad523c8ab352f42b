//! compressed-tensors decoders against compressed-tensors itself: the fixtures under
//! `tests/fixtures/hf/ct_*` were written by compressed-tensors 0.20.0's own compressors
//! (`tools/reference/ct_fixtures.py`), and `reference.safetensors` holds what its
//! `decompress_model` returns for every quantised module. Each row must match bit for bit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use lagoon_core::quant::ct::{CtKind, CtStrategy, ScaleDtype, fp8_e4m3_to_f32};
use lagoon_core::weights::{Encoding, TypeName};
use lagoon_gguf::checkpoint::PartRecord;
use lagoon_gguf::hf::safetensors::{self, Dtype};
use lagoon_gguf::hf::{self, HfTensors};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

fn open(name: &str) -> HfTensors {
    let dir = fixture(name);
    let cfg = hf::read_config(&dir).unwrap();
    hf::open_tensors(&dir, &cfg, None).unwrap()
}

/// The same directory read without its `quantization_config`: tensors alone must suffice.
fn open_tensor_driven(name: &str) -> HfTensors {
    hf::open_tensors(&fixture(name), &serde_json::json!({}), None).unwrap()
}

/// `name → (shape, values as f32)` of a reference file with BF16/F16/F32 tensors.
fn reference(name: &str) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(fixture(name).join("reference.safetensors")).unwrap();
    let h = safetensors::parse("reference.safetensors", &bytes).unwrap();
    h.tensors
        .into_iter()
        .map(|t| {
            let b = &bytes[t.start..t.start + t.len];
            let v: Vec<f32> = match t.dtype {
                Dtype::F32 => b
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                Dtype::BF16 => b
                    .chunks_exact(2)
                    .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                    .collect(),
                Dtype::F16 => b
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                d => panic!("reference dtype {d}"),
            };
            (t.name, (t.shape, v))
        })
        .collect()
}

/// Decodes every quantised module and compares with the reference bit for bit. Returns the
/// kinds found, by module.
fn check_fixture(name: &str, scale: ScaleDtype) -> BTreeMap<String, CtKind> {
    check(name, scale, open(name))
}

fn check(name: &str, scale: ScaleDtype, t: HfTensors) -> BTreeMap<String, CtKind> {
    let refs = reference(name);
    assert!(!refs.is_empty());
    let mut kinds = BTreeMap::new();
    for (tensor, (shape, want)) in &refs {
        let rec = t
            .record(tensor)
            .unwrap_or_else(|| panic!("{name}: no record {tensor}"));
        assert_eq!(&rec.shape, shape, "{tensor}");
        let parts = t.parts(rec);
        assert_eq!(parts.len(), 1);
        let m = &parts[0];
        let Encoding::Ct(ct) = m.enc else {
            panic!("{tensor} is not compressed-tensors: {:?}", m.type_name())
        };
        assert_eq!(ct.layout.scale_dtype, scale, "{tensor}");
        assert!(m.n_bytes() < rec.rows * rec.cols * 4);
        let mut row = vec![f32::NAN; rec.cols];
        let mut nonzero = 0;
        for r in 0..rec.rows {
            m.dequant_row(r, &mut row);
            for c in 0..rec.cols {
                let (got, exp) = (row[c], want[r * rec.cols + c]);
                assert_eq!(
                    got.to_bits(),
                    exp.to_bits(),
                    "{name} {tensor} [{r}, {c}] ({}): got {got:e}, compressed-tensors {exp:e}",
                    ct.kind()
                );
                nonzero += (exp != 0.0) as usize;
            }
        }
        // The fixture is not degenerate.
        assert!(nonzero > rec.rows * rec.cols / 2, "{tensor}");
        kinds.insert(tensor.clone(), ct.kind());
    }
    kinds
}

#[test]
fn bf16_scales_int4_int3_int8_fp8_block() {
    let kinds = check_fixture("ct_mixed_bf16", ScaleDtype::Bf16);
    let k = |n: &str| kinds[&format!("layers.{n}.weight")].to_string();
    assert_eq!(k("int4_sym_a"), "ct-int4-g32");
    assert_eq!(k("int4_sym_b"), "ct-int4-g32");
    assert_eq!(k("int4_asym_a"), "ct-int4-g32-asym");
    assert_eq!(k("int4_asym_b"), "ct-int4-g32-asym");
    assert_eq!(k("int3_sym"), "ct-int3-g32");
    assert_eq!(k("int8_ch"), "ct-int8-ch");
    assert_eq!(k("fp8_block_a"), "ct-fp8-b128x128");
    assert_eq!(k("fp8_block_b"), "ct-fp8-b128x128");
    assert_eq!(kinds.len(), 8);
    // The ignored module stays a plain BF16 tensor.
    let t = open("ct_mixed_bf16");
    let skipped = t.record("layers.skipped.weight").unwrap();
    assert!(matches!(
        t.parts(skipped)[0].type_name(),
        TypeName::Ggml(lagoon_core::dtype::GgmlType::BF16)
    ));
    // Companion tensors are consumed, not listed.
    assert!(t.records.iter().all(|r| !r.name.contains("weight_")));
}

#[test]
fn f16_scales_asymmetric_channel_and_group_fp8_channel() {
    let kinds = check_fixture("ct_mixed_f16", ScaleDtype::F16);
    let k = |n: &str| kinds[&format!("layers.{n}.weight")];
    assert_eq!(k("int8_asym_ch").to_string(), "ct-int8-ch-asym");
    assert_eq!(k("int4_asym_ch").to_string(), "ct-int4-ch-asym");
    assert_eq!(k("int4_asym_g").to_string(), "ct-int4-g16-asym");
    assert_eq!(
        k("fp8_ch"),
        CtKind::Fp8 {
            strategy: CtStrategy::Channel
        }
    );
}

#[test]
fn f32_scales_w8a8_int8_and_fp8_tensor() {
    let kinds = check_fixture("ct_w8a8_f32", ScaleDtype::F32);
    let k = |n: &str| kinds[&format!("layers.{n}.weight")].to_string();
    assert_eq!(k("int8_ch"), "ct-i8-ch");
    assert_eq!(k("int8_tensor_asym"), "ct-i8-t-asym");
    assert_eq!(k("fp8_tensor"), "ct-fp8-t");
    // The static input scale is not part of the weight: it stays as an extra F32 tensor.
    let t = open("ct_w8a8_f32");
    assert!(t.record("layers.fp8_tensor.input_scale").is_some());
}

#[test]
fn tensor_driven_without_quantization_config() {
    for (name, scale) in [
        ("ct_mixed_bf16", ScaleDtype::Bf16),
        ("ct_mixed_f16", ScaleDtype::F16),
        ("ct_w8a8_f32", ScaleDtype::F32),
    ] {
        let with = check_fixture(name, scale);
        let without = check(name, scale, open_tensor_driven(name));
        for (tensor, k) in &with {
            let w = without[tensor];
            // A single 128×128 block covering the whole matrix reads as one tensor scale.
            if tensor == "layers.fp8_block_a.weight" {
                assert_eq!(
                    w,
                    CtKind::Fp8 {
                        strategy: CtStrategy::Tensor
                    }
                );
            } else {
                assert_eq!(&w, k, "{name} {tensor}");
            }
        }
    }
}

#[test]
fn fp8_e4m3_matches_torch_for_all_codes() {
    let bytes = std::fs::read(fixture("fp8_e4m3_table.safetensors")).unwrap();
    let h = safetensors::parse("fp8_e4m3_table.safetensors", &bytes).unwrap();
    let get = |n: &str| {
        let t = h.tensors.iter().find(|t| t.name == n).unwrap();
        &bytes[t.start..t.start + t.len]
    };
    let codes = get("codes");
    let values: Vec<f32> = get("values")
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(codes.len(), 256);
    for (&code, &v) in codes.iter().zip(&values) {
        let got = fp8_e4m3_to_f32(code);
        if v.is_nan() {
            assert!(got.is_nan(), "code {code:#04x}");
            assert!(code & 0x7f == 0x7f);
        } else {
            assert_eq!(got.to_bits(), v.to_bits(), "code {code:#04x}");
        }
    }
}

#[test]
fn records_keep_spans_of_the_mapped_files() {
    let t = open("ct_mixed_bf16");
    for r in &t.records {
        for p in &r.parts {
            for s in p.spans() {
                assert!(s.start + s.len <= t.maps[s.file as usize].len());
            }
            if let PartRecord::Ct(c) = p {
                c.check().unwrap();
            }
        }
    }
}
