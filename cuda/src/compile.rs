//! NVRTC compilation of the kernel sources in `cuda/kernels/`, with an on-disk PTX cache.
//!
//! The sources are embedded in the binary (so a shipped binary needs no source tree); local
//! `#include "x.cuh"` lines are resolved here from the embedded headers, system headers
//! (`<cuda_fp16.h>`) come from the CUDA include directory: `LAGOON_CUDA_INCLUDE`, else
//! `/usr/local/cuda/include`. PTX is cached under `LAGOON_CUDA_CACHE`, else
//! `$XDG_CACHE_HOME/lagoon/cuda`, else `~/.cache/lagoon/cuda`, keyed by a hash of the
//! resolved source, the architecture, the NVRTC version and the options.

use std::path::PathBuf;

use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};

use crate::error::CudaError;

/// Every kernel source file (`cuda/kernels/*.cu`), by file name.
pub const SOURCES: &[(&str, &str)] = &[
    ("act.cu", include_str!("../kernels/act.cu")),
    ("attention.cu", include_str!("../kernels/attention.cu")),
    ("elementwise.cu", include_str!("../kernels/elementwise.cu")),
    ("flash.cu", include_str!("../kernels/flash.cu")),
    ("fused.cu", include_str!("../kernels/fused.cu")),
    ("gemm.cu", include_str!("../kernels/gemm.cu")),
    ("gemm_h.cu", include_str!("../kernels/gemm_h.cu")),
    ("gemm_rf.cu", include_str!("../kernels/gemm_rf.cu")),
    ("lab.cu", include_str!("../kernels/lab.cu")),
    ("matmul.cu", include_str!("../kernels/matmul.cu")),
    ("mmvq.cu", include_str!("../kernels/mmvq.cu")),
    ("moe.cu", include_str!("../kernels/moe.cu")),
    ("norm.cu", include_str!("../kernels/norm.cu")),
    ("sample.cu", include_str!("../kernels/sample.cu")),
];

/// The shared headers the sources include with `#include "..."`.
pub const HEADERS: &[(&str, &str)] = &[
    ("act.cuh", include_str!("../kernels/act.cuh")),
    ("blocks.cuh", include_str!("../kernels/blocks.cuh")),
    ("common.cuh", include_str!("../kernels/common.cuh")),
    ("iq_grids.cuh", include_str!("../kernels/iq_grids.cuh")),
    ("merge.cuh", include_str!("../kernels/merge.cuh")),
    ("mmvq.cuh", include_str!("../kernels/mmvq.cuh")),
    ("qk_rope.cuh", include_str!("../kernels/qk_rope.cuh")),
    ("quant.cuh", include_str!("../kernels/quant.cuh")),
    ("rf_formats.cuh", include_str!("../kernels/rf_formats.cuh")),
    ("tc.cuh", include_str!("../kernels/tc.cuh")),
    ("unpack_h16.cuh", include_str!("../kernels/unpack_h16.cuh")),
    ("wgmma.cuh", include_str!("../kernels/wgmma.cuh")),
];

/// Options every kernel is compiled with. No fast math: the kernels are held to the CPU
/// reference's f32 numerics.
const OPTIONS: &[&str] = &["--std=c++20", "-default-device"];

/// The CUDA include directory (`LAGOON_CUDA_INCLUDE`, default `/usr/local/cuda/include`).
pub fn include_dir() -> PathBuf {
    std::env::var_os("LAGOON_CUDA_INCLUDE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/cuda/include"))
}

/// The PTX cache directory, if a home or cache directory is known.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("LAGOON_CUDA_CACHE") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("lagoon").join("cuda"))
}

/// `src` with every local `#include "name"` replaced by the header's text (each header once,
/// as `#pragma once` would).
pub fn resolve_includes(src: &str) -> String {
    fn go(src: &str, seen: &mut Vec<&'static str>, out: &mut String) {
        for line in src.lines() {
            let t = line.trim();
            if t == "#pragma once" {
                continue;
            }
            if let Some(rest) = t.strip_prefix("#include \"")
                && let Some(name) = rest.strip_suffix('"')
                && let Some(&(hname, htext)) = HEADERS.iter().find(|(n, _)| *n == name)
            {
                if !seen.contains(&hname) {
                    seen.push(hname);
                    go(htext, seen, out);
                }
                continue;
            }
            out.push_str(line);
            out.push('\n');
        }
    }
    let mut out = String::new();
    go(src, &mut Vec::new(), &mut out);
    out
}

/// NVRTC's version, `(major, minor)`. The caller has checked that NVRTC is present.
pub fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (checked by the caller); both pointers are valid for writes.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (major, minor)
}

/// `-D` options from `LAGOON_CUDA_DEFINES` (`NAME=VALUE` or `NAME`, separated by commas or
/// semicolons): a
/// kernel-lab switch, so one binary can time a kernel's compile-time variants (a batch size,
/// a path) in one device call; part of the PTX cache key. Items that are not C identifiers
/// (optionally `=` a value of letters, digits, `_`, `.`, `-`) are ignored, so the variable
/// cannot smuggle in other compiler options.
pub fn lab_defines() -> Vec<String> {
    defines_from(
        std::env::var("LAGOON_CUDA_DEFINES")
            .ok()
            .as_deref()
            .unwrap_or(""),
    )
}

/// The value `LAGOON_CUDA_DEFINES` gives `name` (`NAME=VALUE`), if any: for the switches the
/// host must agree on with the kernels (a launch grid that depends on a kernel's define).
pub fn lab_define(name: &str) -> Option<String> {
    let prefix = format!("-D{name}=");
    lab_defines()
        .iter()
        .find_map(|d| d.strip_prefix(&prefix).map(str::to_owned))
}

fn defines_from(spec: &str) -> Vec<String> {
    let ident = |s: &str| {
        s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let value = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    };
    spec.split([',', ';'])
        .map(str::trim)
        .filter(|d| match d.split_once('=') {
            Some((n, v)) => ident(n) && value(v),
            None => ident(d),
        })
        .map(|d| format!("-D{d}"))
        .collect()
}

/// 64-bit FNV-1a: a stable hash for the cache key (std's hasher may change between
/// releases).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for &b in p.iter().chain(&[0xffu8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The target one source is compiled for on a device of `arch`: `gemm_rf.cu` holds wgmma
/// kernels, which exist only for the arch-specific `sm_90a`, so on an sm_90 device it is
/// compiled for that (everything else in it is plain sm_90 code; on other devices its wgmma
/// wrappers compile to traps and the session never launches them).
pub fn target(file: &str, arch: &str) -> String {
    if file == "gemm_rf.cu" && arch == "sm_90" {
        "sm_90a".to_string()
    } else {
        arch.to_string()
    }
}

/// Compiles one source file for a device of `arch` (`"sm_90"`; the PTX targets
/// [`target`]`(file, arch)`), through the PTX cache in `cache` (the backend passes
/// [`cache_dir`]) when given.
/// The caller has checked that NVRTC is present ([`crate::probe_nvrtc`]).
pub fn compile(
    file: &'static str,
    src: &str,
    arch: &str,
    cache: Option<&std::path::Path>,
) -> Result<Ptx, CudaError> {
    let target = target(file, arch);
    let arch = target.as_str();
    let full = resolve_includes(src);
    let include = include_dir();
    let (major, minor) = nvrtc_version();
    let version = format!("{major}.{minor}");
    // Only the defines this source mentions, so a lab switch recompiles (and re-keys) only
    // the files it concerns.
    let defines: Vec<String> = lab_defines()
        .into_iter()
        .filter(|d| {
            let name = d[2..].split('=').next().unwrap_or("");
            full.contains(name)
        })
        .collect();
    let key = fnv1a(&[
        full.as_bytes(),
        arch.as_bytes(),
        version.as_bytes(),
        OPTIONS.join(" ").as_bytes(),
        defines.join(" ").as_bytes(),
    ]);
    let stem = file.trim_end_matches(".cu");
    let cached = cache.map(|d| d.join(format!("{stem}-{arch}-{key:016x}.ptx")));
    if let Some(p) = &cached
        && let Ok(text) = std::fs::read_to_string(p)
    {
        return Ok(Ptx::from_src(text));
    }
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    options.extend(defines);
    let opts = CompileOptions {
        include_paths: vec![include.display().to_string()],
        options,
        name: Some(file.to_string()),
        ..Default::default()
    };
    let ptx =
        cudarc::nvrtc::compile_ptx_with_opts(&full, opts).map_err(|e| CudaError::Compile {
            file,
            arch: arch.to_string(),
            log: match e {
                CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
                other => format!("{other:?}"),
            },
        })?;
    if let Some(p) = cached {
        // A cache that cannot be written only costs the next start a compile.
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        let ok = p
            .parent()
            .is_some_and(|d| std::fs::create_dir_all(d).is_ok())
            && std::fs::write(&tmp, ptx.to_src()).is_ok()
            && std::fs::rename(&tmp, &p).is_ok();
        if !ok {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(ptx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn includes_are_inlined_once() {
        let s = resolve_includes("#include \"quant.cuh\"\n#include \"common.cuh\"\nint x;\n");
        assert_eq!(s.matches("struct block_q4_K {").count(), 1);
        assert_eq!(s.matches("warp_sum(float v)").count(), 1);
        assert!(!s.contains("#include \"common.cuh\""));
        assert!(s.contains("#include <cuda_fp16.h>"));
        assert!(s.ends_with("int x;\n"));
    }

    #[test]
    fn lab_defines_take_only_names_and_plain_values() {
        assert_eq!(
            defines_from("DOWN_Q6K_BATCH=4, FOO ,x=-1.5;Y=2"),
            ["-DDOWN_Q6K_BATCH=4", "-DFOO", "-Dx=-1.5", "-DY=2"]
        );
        assert!(defines_from("").is_empty());
        assert!(defines_from("A=1 --use_fast_math,2X,B=,C=a b,D=$(x)").is_empty());
    }

    #[test]
    fn cache_key_depends_on_every_part() {
        let a = fnv1a(&[b"src", b"sm_90", b"13.0"]);
        assert_ne!(a, fnv1a(&[b"src", b"sm_89", b"13.0"]));
        assert_ne!(a, fnv1a(&[b"src", b"sm_90", b"13.1"]));
        assert_ne!(a, fnv1a(&[b"sr", b"csm_90", b"13.0"]));
    }
}
