//! The step timeline probe: where a graph-replayed decode step's time goes, kernel by kernel.
//!
//! ncu times each kernel alone (serialised, its launch and ramp included) and the session's
//! event profiler puts an event between launches, which ends programmatic launch's overlap;
//! neither shows the replayed step. With `LAGOON_CUDA_DEFINES=LAGOON_TRACE` and
//! `LAGOON_CUDA_TRACE=PATH`, thread 0 of every kernel's first block records the global timer
//! at its trigger and around its `pdl_wait` (`common.cuh`'s `trace_mark`), tagged with the
//! launch's `%gridid` and grid, into a buffer every module's `lagoon_trace` points at; when
//! the device is dropped the records are written to PATH (`gridid ns kind gx gy block`, one
//! a line) and the launches the host made, with their grids, to PATH.names
//! (`cuda/dev/trace-summary.py` turns both into a per-kernel table of the critical path).
//! The default build has no hooks at all.

use std::cell::RefCell;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::error::{CudaError, DriverContext};
use crate::manifest::{K, Kernels};

/// Records the buffer holds (`LAGOON_TRACE_CAP` in `common.cuh`).
const CAP: usize = 1 << 20;

/// A launch the host made: kernel, grid, block size.
type Launch = (&'static str, (u32, u32, u32), u32);

/// The trace buffer and the launches made while it records.
#[derive(Debug)]
pub struct Trace {
    buf: CudaSlice<u64>,
    out: PathBuf,
    names: RefCell<Vec<Launch>>,
}

impl Trace {
    /// A trace when both `LAGOON_CUDA_TRACE` (the output path) and the `LAGOON_TRACE` define
    /// are set: allocates the buffer and points every module's `lagoon_trace` at it. (The
    /// variable alone, without the define, would record nothing: that is an error here.)
    pub fn attach(stream: &Arc<CudaStream>, kernels: &Kernels) -> Result<Option<Trace>, CudaError> {
        let Some(out) = std::env::var_os("LAGOON_CUDA_TRACE").map(PathBuf::from) else {
            return Ok(None);
        };
        if !crate::compile::lab_defines()
            .iter()
            .any(|d| d == "-DLAGOON_TRACE")
        {
            return Err(CudaError::Unsupported {
                what: "LAGOON_CUDA_TRACE without trace hooks in the kernels (add LAGOON_TRACE \
                       to LAGOON_CUDA_DEFINES)"
                    .into(),
            });
        }
        let buf = stream
            .alloc_zeros::<u64>(1 + 4 * CAP)
            .during("allocating the trace buffer")?;
        let ptr = buf.device_ptr(stream).0;
        for (_, module) in &kernels.modules {
            // A module without common.cuh has no hook and no global.
            if let Ok(mut g) = module.get_global("lagoon_trace", stream) {
                stream
                    .memcpy_htod(&ptr.to_le_bytes(), &mut g)
                    .during("pointing a module at the trace buffer")?;
            }
        }
        Ok(Some(Trace {
            buf,
            out,
            names: RefCell::new(Vec::new()),
        }))
    }

    /// Notes a launch (kernel, grid, block) in launch order.
    pub fn note(&self, k: K, grid: (u32, u32, u32), block: u32) {
        self.names.borrow_mut().push((k.name(), grid, block));
    }

    /// Writes the records and the launches out (see the module docs); the error says what
    /// failed.
    pub fn dump(&self, stream: &Arc<CudaStream>) -> Result<(), String> {
        let words = stream
            .synchronize()
            .and_then(|()| stream.clone_dtoh(&self.buf))
            .map_err(|e| format!("reading the trace buffer: {e}"))?;
        let n = (words[0] as usize).min(CAP);
        let io = |e: std::io::Error| format!("writing the trace to {}: {e}", self.out.display());
        let mut f = std::io::BufWriter::new(std::fs::File::create(&self.out).map_err(io)?);
        for r in words[1..1 + 4 * n].chunks_exact(4) {
            writeln!(
                f,
                "{} {} {} {} {} {}",
                r[0],
                r[1] >> 2,
                r[1] & 3,
                r[2] & 0xFF_FFFF,
                (r[2] >> 24) & 0xFF_FFFF,
                r[2] >> 48
            )
            .map_err(io)?;
        }
        f.flush().map_err(io)?;
        let mut path = self.out.clone().into_os_string();
        path.push(".names");
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).map_err(io)?);
        for (name, g, b) in self.names.borrow().iter() {
            writeln!(f, "{name} {} {} {b}", g.0, g.1).map_err(io)?;
        }
        f.flush().map_err(io)?;
        if words[0] as usize > CAP {
            eprintln!("trace: {} records, the first {CAP} kept", words[0]);
        }
        Ok(())
    }
}
