//! One CUDA device: context, stream, the loaded kernels and the launch helper.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, LaunchConfig, PushKernelArg, sys};

use crate::error::{CudaError, DriverContext};
use crate::manifest::{ActQ, K, Kernels};

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
    /// When set, an event is recorded after every launch ([`Profiler`]).
    pub profiler: RefCell<Option<Profiler>>,
    /// Launch the kernels that allow it ([`K::pdl`]) with programmatic stream serialisation
    /// (Hopper's programmatic dependent launch): each may be scheduled while the kernel before
    /// it still runs, prefetch its weights, and wait in `pdl_wait` (`common.cuh`) for that
    /// kernel's results. The session turns it on for decode steps.
    pub pdl: Cell<bool>,
    /// The kernel launched last on the stream ([`Device::last_launch`]).
    last: Cell<Option<K>>,
    /// The step timeline probe, when asked for (`trace.rs`).
    pub trace: Option<crate::trace::Trace>,
}

impl Drop for Device {
    fn drop(&mut self) {
        if let Some(t) = &self.trace
            && let Err(e) = t.dump(&self.stream)
        {
            eprintln!("trace: {e}");
        }
    }
}

/// Per-launch GPU timing: an event after each launch, so the time between consecutive
/// events is one kernel's (when the launches were queued ahead of the GPU, which the session
/// ensures by starting the step behind a spin kernel). Events are created on first use and
/// reused by later steps.
#[derive(Debug, Default)]
pub struct Profiler {
    events: Vec<CudaEvent>,
    names: Vec<&'static str>,
    next: usize,
}

/// Time spent in one kernel over the profiled steps.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    pub kernel: &'static str,
    pub launches: usize,
    pub ms: f64,
}

impl Profiler {
    /// Records the next event on `stream`, attributed to `name` (the kernel just launched;
    /// the first mark of a step is the start, `""`).
    pub fn mark(
        &mut self,
        name: &'static str,
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
    ) -> Result<(), CudaError> {
        if self.next == self.events.len() {
            let e = ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .during("creating a profiling event")?;
            self.events.push(e);
            self.names.push("");
        }
        self.events[self.next]
            .record(stream)
            .during("recording a profiling event")?;
        self.names[self.next] = name;
        self.next += 1;
        Ok(())
    }

    /// Adds the marked intervals of the finished step to `acc` and starts over.
    pub fn collect(&mut self, acc: &mut Vec<KernelTime>) -> Result<(), CudaError> {
        for i in 1..self.next {
            let ms = self.events[i - 1]
                .elapsed_ms(&self.events[i])
                .during("reading a profiling event")? as f64;
            let name = self.names[i];
            match acc.iter_mut().find(|k| k.kernel == name) {
                Some(k) => {
                    k.launches += 1;
                    k.ms += ms;
                }
                None => acc.push(KernelTime {
                    kernel: name,
                    launches: 1,
                    ms,
                }),
            }
        }
        self.next = 0;
        Ok(())
    }
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
        let trace = crate::trace::Trace::attach(&stream, &kernels)?;
        Ok(Device {
            ctx,
            stream,
            kernels,
            arch,
            profiler: RefCell::new(None),
            pdl: Cell::new(false),
            last: Cell::new(None),
            trace,
        })
    }

    /// The kernel of the last launch (`None` before the first). A kernel launched right
    /// after one that waits before it triggers ([`K::waits_then_triggers`]) starts, under
    /// programmatic launch, only once every kernel before that one has finished.
    pub fn last_launch(&self) -> Option<K> {
        self.last.get()
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
        self.last.set(Some(k));
        if let Some(t) = &self.trace {
            t.note(k, grid, block);
        }
        if self.pdl.get() && k.pdl() && self.profiler.borrow().is_none() {
            return self.launch_pdl(k, grid, block, args);
        }
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
            shared_mem_bytes: k.dyn_smem(),
        };
        // SAFETY: the argument list matches the kernel's signature and every pointer is a
        // live allocation sized for the launch (this function's contract, upheld by the
        // callers in `session.rs`, which size every buffer from the planned graph).
        unsafe { b.launch(cfg) }.map_err(|source| CudaError::Launch {
            kernel: k.name(),
            source,
        })?;
        if let Some(p) = self.profiler.borrow_mut().as_mut() {
            p.mark(k.name(), &self.ctx, &self.stream)?;
        }
        Ok(())
    }
}

impl Device {
    /// [`Device::launch3`] through `cuLaunchKernelEx` with the programmatic-stream-
    /// serialisation attribute (cudarc's builder has no launch attributes). Same contract;
    /// `k` must start with `pdl_wait` before touching what earlier kernels write.
    fn launch_pdl(
        &self,
        k: K,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        const MAX_ARGS: usize = 32;
        assert!(
            args.len() <= MAX_ARGS,
            "{} takes at most {MAX_ARGS} arguments here",
            k.name()
        );
        // Each argument in its own 8-byte cell: `int` and `float` in the low four bytes
        // (little-endian), which is where the driver reads a 4-byte parameter from.
        let mut cells = [0u64; MAX_ARGS];
        for (c, a) in cells.iter_mut().zip(args) {
            *c = match *a {
                Arg::P(v) => v,
                Arg::I(v) => v as u32 as u64,
                Arg::F(v) => v.to_bits() as u64,
            };
        }
        let mut ptrs = [std::ptr::null_mut::<std::ffi::c_void>(); MAX_ARGS];
        for (p, c) in ptrs.iter_mut().zip(cells.iter_mut()) {
            *p = (c as *mut u64).cast();
        }
        // SAFETY: a plain C struct of integers and a union; zero is a valid value of each.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: grid.0.max(1),
            gridDimY: grid.1.max(1),
            gridDimZ: grid.2.max(1),
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: k.dyn_smem(),
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        self.ctx
            .bind_to_thread()
            .map_err(|source| CudaError::Launch {
                kernel: k.name(),
                source,
            })?;
        // SAFETY: `ptrs[..args.len()]` point at the argument cells, which live until the call
        // returns (the driver copies them); the argument list matches the kernel's signature
        // and every pointer in it is live device memory sized for the launch (the caller's
        // contract, as for `launch3`).
        let r = unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                self.kernels.get(k).cu_function(),
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        r.result().map_err(|source| CudaError::Launch {
            kernel: k.name(),
            source,
        })
    }
}

/// One product of an `mv_*` launch ([`Device::mv`]): the matrix rows at `w` (`row_bytes`
/// apart), the output, and the residual added to it (0: none).
#[derive(Clone, Copy, Debug)]
pub struct MvMat {
    pub w: u64,
    pub row_bytes: u64,
    pub rows: usize,
    pub out: u64,
    pub res: u64,
}

/// Products one `mv_*` launch takes (`MV_MATS` in `mmvq.cu`).
pub const MV_MATS: usize = 4;

impl Device {
    /// Launches the activation quantiser of `fmt` on `rows` f32 rows of `cols` at `src`,
    /// writing rows `stride` bytes apart at `dst` (`act.cu`: a warp per Q8_K block, a thread
    /// per Q8_0 block).
    pub fn quantize_act(
        &self,
        fmt: ActQ,
        src: u64,
        dst: u64,
        cols: usize,
        stride: usize,
        rows: usize,
    ) -> Result<(), CudaError> {
        let nb = rows * cols / fmt.block();
        let grid = match fmt {
            ActQ::Q8K => blocks(nb, 4),
            ActQ::Q8_0 => blocks(nb, 16),
        };
        self.launch(
            fmt.kernel(),
            (grid, 1),
            128,
            &[
                Arg::P(src),
                Arg::P(dst),
                Arg::I(cols as i32),
                Arg::P(stride as u64),
                Arg::I(rows as i32),
            ],
        )
    }

    /// Launches `kernel` (an `mv_*`) for up to [`MV_MATS`] products of the quantised
    /// activation row at `aq` (`cols` wide), one warp per row over all products' rows (a row
    /// pair for the float kernels under `H_ROWS=2`: [`crate::manifest::mv_rows_per_warp`]).
    pub fn mv(&self, kernel: K, aq: u64, cols: usize, mats: &[MvMat]) -> Result<(), CudaError> {
        self.mv_launch(kernel, aq, cols, mats, &[])
    }

    /// [`Device::mv`] for a norm-taking float kernel (an `mv_norm_*`,
    /// [`crate::manifest::WType::mvh_norm`]): `x` is the RMSNorm's f32 input, `gain` its
    /// weight, `eps` its epsilon.
    pub fn mv_norm(
        &self,
        kernel: K,
        x: u64,
        cols: usize,
        mats: &[MvMat],
        gain: u64,
        eps: f32,
    ) -> Result<(), CudaError> {
        self.mv_launch(kernel, x, cols, mats, &[Arg::P(gain), Arg::F(eps)])
    }

    /// [`Device::mv`] for a kernel reading `g ∘ x` and the expert down kernel's `n_part`
    /// partial sums of x² at `part` (an `mv_rinv_*`, [`crate::manifest::WType::mvh_rinv`]).
    #[allow(clippy::too_many_arguments)]
    pub fn mv_rinv(
        &self,
        kernel: K,
        gx: u64,
        cols: usize,
        mats: &[MvMat],
        part: u64,
        n_part: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        let extra = [Arg::P(part), Arg::I(n_part as i32), Arg::F(eps)];
        self.mv_launch(kernel, gx, cols, mats, &extra)
    }

    /// [`Device::mv`] for a two-type kernel (an `mv2_*`, [`crate::manifest::WType::mv_pair`]):
    /// the first `n_first` of `mats` are of its first type, the rest of its second.
    pub fn mv2(
        &self,
        kernel: K,
        aq: u64,
        cols: usize,
        mats: &[MvMat],
        n_first: usize,
    ) -> Result<(), CudaError> {
        self.mv_launch(kernel, aq, cols, mats, &[Arg::I(n_first as i32)])
    }

    /// The `mv_*` launch: the activation, its width, the products, then `extra` (at most three
    /// arguments: `mv2_*`'s type split, `mv_norm_*`'s gain and epsilon, `mv_rinv_*`'s partial
    /// sums).
    fn mv_launch(
        &self,
        kernel: K,
        aq: u64,
        cols: usize,
        mats: &[MvMat],
        extra: &[Arg],
    ) -> Result<(), CudaError> {
        // One warp a row, or a row pair under `H_ROWS=2` (pairs counted per matrix).
        let per_warp = crate::manifest::mv_rows_per_warp(kernel);
        let warps: usize = mats.iter().map(|m| m.rows.div_ceil(per_warp)).sum();
        let mut args = [Arg::I(0); 6 + 5 * MV_MATS];
        args[0] = Arg::P(aq);
        args[1] = Arg::I(cols as i32);
        args[2] = Arg::I(mats.len().min(MV_MATS) as i32);
        for j in 0..MV_MATS {
            let (w, row_bytes, out, res, n) = mats.get(j).map_or((0, 0, 0, 0, 0), |m| {
                (m.w, m.row_bytes, m.out, m.res, m.rows)
            });
            args[3 + 5 * j..8 + 5 * j].copy_from_slice(&[
                Arg::P(w),
                Arg::P(row_bytes),
                Arg::P(out),
                Arg::P(res),
                Arg::I(n as i32),
            ]);
        }
        let extra = &extra[..extra.len().min(3)];
        let n_args = 3 + 5 * MV_MATS + extra.len();
        args[3 + 5 * MV_MATS..n_args].copy_from_slice(extra);
        self.launch(kernel, (blocks(warps, 4), 1), 128, &args[..n_args])
    }
}

impl Device {
    /// The device's streaming-read bandwidth in GB/s (10⁹ bytes/s): a kernel reading a
    /// `bytes`-long buffer (well past the L2 cache), best of five timed passes after one
    /// warm-up. The decode floor: a bandwidth-bound step cannot beat bytes / this.
    pub fn read_bandwidth(&self, bytes: usize) -> Result<f64, CudaError> {
        use cudarc::driver::DevicePtr;
        let s = &self.stream;
        let words = (bytes / 16).max(1);
        let buf = s
            .alloc_zeros::<u8>(16 * words)
            .during("allocating the bandwidth probe")?;
        let blocks_n = 4 * self.sm_count()?;
        let out = s
            .alloc_zeros::<u32>(blocks_n as usize)
            .during("allocating the bandwidth probe")?;
        let (p, o) = (buf.device_ptr(s).0, out.device_ptr(s).0);
        let e0 = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .during("creating a timing event")?;
        let e1 = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .during("creating a timing event")?;
        let mut best = f64::INFINITY;
        for pass in 0..6 {
            e0.record(s).during("recording a timing event")?;
            self.launch(
                K::ReadStream,
                (blocks_n, 1),
                512,
                &[Arg::P(p), Arg::P(words as u64), Arg::P(o)],
            )?;
            e1.record(s).during("recording a timing event")?;
            let ms = e0.elapsed_ms(&e1).during("reading a timing event")? as f64;
            if pass > 0 {
                best = best.min(ms);
            }
        }
        Ok(16.0 * words as f64 / (best * 1e-3) / 1e9)
    }

    /// Streaming multiprocessors on the device.
    pub fn sm_count(&self) -> Result<u32, CudaError> {
        let n = self
            .ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .during("reading the multiprocessor count")?;
        Ok(n as u32)
    }
}

/// Blocks of `per` for `n` items.
pub fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per) as u32
}
