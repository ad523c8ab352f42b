//! One CUDA device: context, stream, the loaded kernels and the launch helper.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, LaunchConfig, PushKernelArg};

use crate::error::{CudaError, DriverContext};
use crate::manifest::{K, Kernels};

/// A kernel argument, by the C type the kernel declares: a device pointer or `u64` (`P`), an
/// `int` (`I`) or a `float` (`F`).
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    P(u64),
    I(i32),
    F(f32),
}

/// A device with its stream and kernels.
#[derive(Debug)]
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub kernels: Kernels,
    /// `sm_XY` of the device.
    pub arch: String,
}

impl Device {
    /// Opens device `ordinal`: checks that the driver and NVRTC exist, creates the context
    /// (event tracking off, so streams can be captured into CUDA graphs) and a stream, and
    /// compiles and loads every kernel for the device's compute capability.
    pub fn new(ordinal: usize) -> Result<Device, CudaError> {
        crate::probe()?;
        let ctx = CudaContext::new(ordinal).during("creating the CUDA context")?;
        // SAFETY: called right after context creation, before any allocation or stream
        // exists, as cudarc requires; this crate orders its one stream itself.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().during("creating a CUDA stream")?;
        let (major, minor) = ctx
            .compute_capability()
            .during("reading the compute capability")?;
        let arch = format!("sm_{major}{minor}");
        let kernels = Kernels::load(&ctx, &arch)?;
        Ok(Device {
            ctx,
            stream,
            kernels,
            arch,
        })
    }

    /// Launches kernel `k` on the stream with `grid` blocks of `block` threads.
    ///
    /// `args` must match the kernel's C parameter list in number and type (the callers in
    /// this crate are written next to each kernel's signature); every pointer must be a live
    /// device allocation of this context large enough for what the kernel touches.
    pub fn launch(
        &self,
        k: K,
        grid: (u32, u32),
        block: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        self.launch3(k, (grid.0, grid.1, 1), block, args)
    }

    /// [`Device::launch`] with a three-dimensional grid (same contract).
    pub fn launch3(
        &self,
        k: K,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        let mut b = self.stream.launch_builder(self.kernels.get(k));
        for a in args {
            match a {
                Arg::P(v) => b.arg(v),
                Arg::I(v) => b.arg(v),
                Arg::F(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: (grid.0.max(1), grid.1.max(1), grid.2.max(1)),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the argument list matches the kernel's signature and every pointer is a
        // live allocation sized for the launch (this function's contract, upheld by the
        // callers in `session.rs`, which size every buffer from the planned graph).
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|source| CudaError::Launch {
                kernel: k.name(),
                source,
            })
    }
}

/// Blocks of `per` for `n` items.
pub fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per) as u32
}
