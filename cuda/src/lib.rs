//! lagoon-cuda: the CUDA backend (issue #6).
//!
//! Kernels are `.cu` sources in `cuda/kernels/`, compiled by NVRTC at device init for the
//! device's compute capability and cached on disk ([`compile`]); a manifest resolves every
//! kernel once ([`manifest`]). [`CudaSession`] walks the same Laguna graph as the CPU
//! backend with one launch per node over a planner-sized device arena. cudarc loads
//! `libcuda`/`libnvrtc` at run time, so this crate builds without CUDA; [`probe`] turns
//! their absence into an error instead of cudarc's panic.

pub mod compile;
pub mod device;
pub mod error;
pub mod manifest;
pub mod session;
pub mod trace;
pub mod weights;

/// The driver bindings the kernels are launched through (for tools such as the kernel lab).
pub use cudarc;
pub use error::CudaError;
pub use session::{CudaSession, CudaSessionOptions, KvCache};

/// Why no CUDA device can be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaUnavailable {
    /// `libcuda.so` could not be loaded (no NVIDIA driver on this machine).
    NoDriver,
    /// `libnvrtc.so` could not be loaded (install the CUDA 13.0 NVRTC runtime).
    NoNvrtc,
}

impl std::fmt::Display for CudaUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CudaUnavailable::NoDriver => {
                f.write_str("no CUDA driver (libcuda) found on this machine")
            }
            CudaUnavailable::NoNvrtc => f.write_str(
                "no NVRTC (libnvrtc.so.13) found; install the CUDA 13.0 runtime or put its lib directory on LD_LIBRARY_PATH",
            ),
        }
    }
}

impl std::error::Error for CudaUnavailable {}

/// Checks that the CUDA driver and NVRTC libraries can be loaded, without touching a device.
pub fn probe() -> Result<(), CudaUnavailable> {
    // SAFETY: `is_culib_present` dlopens the NVIDIA driver library, which runs its
    // initialisers; the driver supports being loaded into any process, and cudarc caches
    // the handle so later calls reuse it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaUnavailable::NoDriver);
    }
    probe_nvrtc()
}

/// Checks that NVRTC alone can be loaded (compiling needs no GPU).
pub fn probe_nvrtc() -> Result<(), CudaUnavailable> {
    // SAFETY: as in `probe`, for the NVRTC library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaUnavailable::NoNvrtc);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn probe_never_panics() {
        // On a machine without CUDA this must be an error, not cudarc's panic.
        let _ = super::probe();
    }
}
