//! Compiles every kernel source with NVRTC for sm_90 — no GPU needed, only `libnvrtc.so.13`
//! on the loader path and the CUDA headers in `LAGOON_CUDA_INCLUDE` (CI installs the pip
//! wheels `nvidia-cuda-nvrtc==13.0.88` and `nvidia-cuda-runtime==13.0.96`, see `.ci/run`).
//! Without NVRTC the tests print that they were skipped.

use lagoon_cuda::compile::{self, SOURCES};
use lagoon_cuda::manifest::MANIFEST;

fn nvrtc_present() -> bool {
    match lagoon_cuda::probe_nvrtc() {
        Ok(()) => true,
        Err(e) => {
            println!("SKIPPED: {e}");
            false
        }
    }
}

#[test]
fn every_kernel_source_compiles_for_sm_90() {
    if !nvrtc_present() {
        return;
    }
    // Compiled in parallel, as the device init does.
    let ptxs: Vec<String> = std::thread::scope(|sc| {
        let handles: Vec<_> = SOURCES
            .iter()
            .map(|&(file, src)| {
                sc.spawn(move || {
                    compile::compile(file, src, "sm_90", None)
                        .unwrap_or_else(|e| panic!("{e}"))
                        .to_src()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (&(file, _), text) in SOURCES.iter().zip(&ptxs) {
        // Every manifest kernel of this file is an entry point of its PTX.
        for &(_, f, name) in MANIFEST.iter().filter(|(_, f, _)| *f == file) {
            assert!(
                text.contains(&format!(".entry {name}(")),
                "{f}: no kernel `{name}` in the PTX"
            );
        }
        if file == "gemm_rf.cu" {
            // Its wgmma kernels need the arch-specific target (compile::target).
            assert!(
                text.contains(".target sm_90a"),
                "gemm_rf.cu not compiled for sm_90a"
            );
            assert!(
                text.contains("wgmma.mma_async"),
                "gemm_rf.cu: no wgmma in the PTX"
            );
        }
        println!("{file}: {} bytes of PTX", text.len());
        assemble(file, text);
    }
}

/// Assembles `ptx` for sm_90 with `ptxas` when `LAGOON_PTXAS` names one (CI installs the
/// `nvidia-cuda-nvcc` wheel for it): NVRTC emits PTX without assembling it, so an instruction
/// the assembler rejects (a wrong operand, an sm_90-only form) would otherwise surface only
/// when the driver JIT-compiles it on a GPU.
fn assemble(file: &str, ptx: &str) {
    let Some(ptxas) = std::env::var_os("LAGOON_PTXAS") else {
        println!("{file}: ptxas not run (LAGOON_PTXAS unset)");
        return;
    };
    // LAGOON_PTXAS_KEEP=DIR keeps the PTX and the cubin there (for `cuobjdump -sass`).
    let keep = std::env::var_os("LAGOON_PTXAS_KEEP").map(std::path::PathBuf::from);
    let dir = keep.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("lagoon-ptxas-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{file}.ptx"));
    std::fs::write(&src, ptx).unwrap();
    // LAGOON_PTXAS_VERBOSE=1 prints ptxas's per-kernel registers and spills (run with
    // --nocapture): a kernel's register budget without a GPU.
    let verbose = std::env::var_os("LAGOON_PTXAS_VERBOSE").is_some_and(|v| v == "1");
    // The PTX's own target (`sm_90a` for gemm_rf.cu's wgmma kernels, see compile::target).
    let target = ptx
        .lines()
        .find_map(|l| l.trim().strip_prefix(".target "))
        .map(|t| t.split(',').next().unwrap_or(t).trim().to_string())
        .unwrap_or_else(|| "sm_90".to_string());
    let out = std::process::Command::new(&ptxas)
        .arg(format!("-arch={target}"))
        .args(verbose.then_some("-v"))
        .arg("-o")
        .arg(dir.join(format!("{file}.cubin")))
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", ptxas.to_string_lossy()));
    assert!(
        out.status.success(),
        "ptxas rejected {file}'s PTX:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if verbose {
        println!("{}", String::from_utf8_lossy(&out.stderr));
    }
    if keep.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn sources_list_matches_the_kernels_directory() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cu"))
        .collect();
    on_disk.sort();
    let listed: Vec<&str> = SOURCES.iter().map(|(f, _)| *f).collect();
    assert_eq!(
        on_disk, listed,
        "compile::SOURCES must list every cuda/kernels/*.cu"
    );
    for &(f, src) in SOURCES {
        let disk = std::fs::read_to_string(format!("{dir}/{f}")).unwrap();
        assert_eq!(disk, src, "{f}");
    }
}

/// The CUDA block structs of `blocks.cuh` have the Rust structs' layout: the same total size,
/// the same field sizes and the same field order (checked with C++20 designated
/// initialisers, which must follow declaration order) — hence the same offsets, with no
/// padding. The static_asserts are generated from `size_of` / `offset_of!`.
#[test]
fn block_layouts_agree_with_rust() {
    use core::mem::{offset_of, size_of};
    use lagoon_core::quant::{BlockIQ4XS, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8_0};
    if !nvrtc_present() {
        return;
    }
    /// A CUDA struct name, the Rust size, and the fields with their Rust offsets.
    type Layout = (&'static str, usize, Vec<(&'static str, usize)>);
    let structs: [Layout; 5] = [
        (
            "block_q8_0",
            size_of::<BlockQ8_0>(),
            vec![
                ("d", offset_of!(BlockQ8_0, d)),
                ("qs", offset_of!(BlockQ8_0, qs)),
            ],
        ),
        (
            "block_q4_K",
            size_of::<BlockQ4K>(),
            vec![
                ("d", offset_of!(BlockQ4K, d)),
                ("dmin", offset_of!(BlockQ4K, dmin)),
                ("scales", offset_of!(BlockQ4K, scales)),
                ("qs", offset_of!(BlockQ4K, qs)),
            ],
        ),
        (
            "block_q6_K",
            size_of::<BlockQ6K>(),
            vec![
                ("ql", offset_of!(BlockQ6K, ql)),
                ("qh", offset_of!(BlockQ6K, qh)),
                ("scales", offset_of!(BlockQ6K, scales)),
                ("d", offset_of!(BlockQ6K, d)),
            ],
        ),
        (
            "block_q5_K",
            size_of::<BlockQ5K>(),
            vec![
                ("d", offset_of!(BlockQ5K, d)),
                ("dmin", offset_of!(BlockQ5K, dmin)),
                ("scales", offset_of!(BlockQ5K, scales)),
                ("qh", offset_of!(BlockQ5K, qh)),
                ("qs", offset_of!(BlockQ5K, qs)),
            ],
        ),
        (
            "block_iq4_xs",
            size_of::<BlockIQ4XS>(),
            vec![
                ("d", offset_of!(BlockIQ4XS, d)),
                ("scales_h", offset_of!(BlockIQ4XS, scales_h)),
                ("scales_l", offset_of!(BlockIQ4XS, scales_l)),
                ("qs", offset_of!(BlockIQ4XS, qs)),
            ],
        ),
    ];
    let mut src = String::from("#include \"blocks.cuh\"\n");
    for (name, size, mut fields) in structs {
        fields.sort_by_key(|f| f.1);
        src.push_str(&format!(
            "static_assert(sizeof({name}) == {size}, \"{name}: size\");\n"
        ));
        for (i, &(f, off)) in fields.iter().enumerate() {
            let end = fields.get(i + 1).map_or(size, |g| g.1);
            let n = end - off;
            src.push_str(&format!(
                "static_assert(sizeof({name}::{f}) == {n}, \"{name}.{f}: size\");\n"
            ));
        }
        let init: Vec<String> = fields.iter().map(|(f, _)| format!(".{f} = {{}}")).collect();
        src.push_str(&format!(
            "constexpr {name} order_{name} = {{{}}};\n",
            init.join(", ")
        ));
    }
    src.push_str("extern \"C\" __global__ void layouts() {}\n");
    compile::compile("layouts.cu", &src, "sm_90", None).unwrap_or_else(|e| panic!("{e}\n{src}"));
    // The checks can fail: a wrong size and a wrong field order are both rejected.
    let bad_size = "#include \"blocks.cuh\"\nstatic_assert(sizeof(block_q4_K) == 145, \"x\");\n";
    assert!(compile::compile("bad.cu", bad_size, "sm_90", None).is_err());
    let bad_order = "#include \"blocks.cuh\"\nconstexpr block_q6_K o = {.d = {}, .ql = {}, .qh = {}, .scales = {}};\n";
    assert!(compile::compile("bad.cu", bad_order, "sm_90", None).is_err());
}

/// The PTX cache: a first compile writes `<stem>-<arch>-<hash>.ptx`, a second returns the
/// cached text, and a changed source gets a new entry.
#[test]
fn ptx_cache_round_trips() {
    if !nvrtc_present() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("lagoon-ptx-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let src = "extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }\n";
    let a = compile::compile("k.cu", src, "sm_90", Some(&dir))
        .unwrap()
        .to_src();
    let files = |d: &std::path::Path| std::fs::read_dir(d).unwrap().count();
    assert_eq!(files(&dir), 1, "one cache entry after the first compile");
    let b = compile::compile("k.cu", src, "sm_90", Some(&dir))
        .unwrap()
        .to_src();
    assert_eq!(a, b);
    assert_eq!(files(&dir), 1, "a hit writes nothing");
    let src2 = src.replace("1.0f", "2.0f");
    compile::compile("k.cu", &src2, "sm_90", Some(&dir)).unwrap();
    assert_eq!(files(&dir), 2, "a changed source is a new entry");
    // A cache entry is what gets loaded: a planted entry is returned as is.
    let entry = std::fs::read_dir(&dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(&entry, "// planted").unwrap();
    let hit_a = compile::compile("k.cu", src, "sm_90", Some(&dir))
        .unwrap()
        .to_src();
    let hit_b = compile::compile("k.cu", &src2, "sm_90", Some(&dir))
        .unwrap()
        .to_src();
    assert!(hit_a == "// planted" || hit_b == "// planted");
    let _ = std::fs::remove_dir_all(&dir);
}
