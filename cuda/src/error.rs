//! The backend's one error type: every failure names what was being done (the kernel, the
//! buffer, the source file) and carries the CUDA or NVRTC error.

use cudarc::driver::DriverError;

use crate::CudaUnavailable;

/// Why the CUDA backend could not do what was asked.
#[derive(Debug)]
pub enum CudaError {
    /// No driver or no NVRTC on this machine.
    Unavailable(CudaUnavailable),
    /// A driver call failed (`what`: context creation, an allocation, a copy ...).
    Driver {
        what: &'static str,
        source: DriverError,
    },
    /// A kernel launch failed.
    Launch {
        kernel: &'static str,
        source: DriverError,
    },
    /// NVRTC rejected a kernel source; `log` is its compile log.
    Compile {
        file: &'static str,
        arch: String,
        log: String,
    },
    /// A compiled module lacks a kernel the manifest names.
    MissingKernel {
        file: &'static str,
        kernel: &'static str,
        source: DriverError,
    },
    /// The model has a shape the kernels do not handle.
    Unsupported { what: String },
    /// More tokens than the session's ubatch, or none.
    BadBatch { n_tokens: usize, ubatch: usize },
    /// The tokens would run past the context.
    ContextFull {
        n_past: usize,
        n_tokens: usize,
        n_ctx: usize,
    },
    /// A token id outside the vocabulary.
    BadToken { token: u32, vocab: usize },
    /// A buffer larger than the device's free memory, found before allocating it (`what`:
    /// the buffer; `hint`: what makes it smaller, or empty).
    OutOfMemory {
        what: &'static str,
        need: u64,
        free: u64,
        total: u64,
        hint: String,
    },
}

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CudaError::Unavailable(u) => write!(f, "{u}"),
            CudaError::Driver { what, source } => write!(f, "CUDA error during {what}: {source}"),
            CudaError::Launch { kernel, source } => {
                write!(f, "launching CUDA kernel `{kernel}` failed: {source}")
            }
            CudaError::Compile { file, arch, log } => write!(
                f,
                "NVRTC could not compile `cuda/kernels/{file}` for {arch} (is LAGOON_CUDA_INCLUDE the CUDA include dir?):\n{log}"
            ),
            CudaError::MissingKernel {
                file,
                kernel,
                source,
            } => write!(
                f,
                "kernel `{kernel}` not found in the module compiled from `{file}`: {source}"
            ),
            CudaError::Unsupported { what } => {
                write!(f, "the CUDA backend does not support {what}")
            }
            CudaError::BadBatch { n_tokens, ubatch } => write!(
                f,
                "a step takes 1..={ubatch} tokens, got {n_tokens}; split the input with `prefill`"
            ),
            CudaError::ContextFull {
                n_past,
                n_tokens,
                n_ctx,
            } => write!(
                f,
                "{n_tokens} more tokens after {n_past} would exceed the context of {n_ctx}; create the session with a larger n_ctx"
            ),
            CudaError::BadToken { token, vocab } => {
                write!(
                    f,
                    "token id {token} is outside the vocabulary (size {vocab})"
                )
            }
            CudaError::OutOfMemory {
                what,
                need,
                free,
                total,
                hint,
            } => {
                let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
                write!(
                    f,
                    "{what} need {:.2} GiB of device memory but only {:.2} GiB of {:.2} GiB are free",
                    gib(*need),
                    gib(*free),
                    gib(*total)
                )?;
                if !hint.is_empty() {
                    write!(f, "; {hint}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for CudaError {
    // Every message already ends with its cause (`Display` above), so no `source`: a
    // reporter that walks the chain (anyhow's `Caused by:`) would print it twice.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        None
    }
}

impl From<CudaUnavailable> for CudaError {
    fn from(u: CudaUnavailable) -> Self {
        CudaError::Unavailable(u)
    }
}

/// Tags a driver result with what was being done.
pub(crate) trait DriverContext<T> {
    fn during(self, what: &'static str) -> Result<T, CudaError>;
}

impl<T> DriverContext<T> for Result<T, DriverError> {
    fn during(self, what: &'static str) -> Result<T, CudaError> {
        self.map_err(|source| CudaError::Driver { what, source })
    }
}
