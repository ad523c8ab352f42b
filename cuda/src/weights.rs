//! Model weights on the device: one allocation holding every matrix in its stored encoding
//! (quantised blocks are copied as they are) where a kernel decodes it, 4-bit and 8-bit
//! compressed-tensors matrices repacked into 32-element blocks (`WType::Ct4`, `WType::Ct8`),
//! and decoded to f32 where no kernel reads the encoding yet (FP8 and other
//! compressed-tensors kinds, the other IQ and K types). Experts of a layer
//! are stacked: expert `e` starts `e · expert_bytes` after the first.

use std::borrow::Cow;

use cudarc::driver::{CudaSlice, DevicePtr};
use lagoon_core::dtype::GgmlType;
use lagoon_core::graph::{LayerWeight as L, Weight};
use lagoon_core::laguna::weights::{Ffn, ModelWeights};
use lagoon_core::weights::{Encoding, MatRef};

use crate::device::Device;
use crate::error::{CudaError, DriverContext};
use crate::manifest::WType;

/// A matrix on the device.
#[derive(Clone, Copy, Debug)]
pub struct DMat {
    pub ptr: u64,
    pub ty: WType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: u64,
    /// Bytes of one expert's matrix (stacks), else of the matrix.
    pub expert_bytes: u64,
}

/// An f32 vector on the device.
#[derive(Clone, Copy, Debug)]
pub struct DVec {
    pub ptr: u64,
    pub len: usize,
}

/// The feed-forward half of a layer on the device.
// One per layer, built once: the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum DFfn {
    Dense([DMat; 3]),
    Moe {
        router: DMat,
        bias: DVec,
        gate: DMat,
        up: DMat,
        down: DMat,
        shared: Option<[DMat; 3]>,
    },
}

/// One decoder layer on the device.
#[derive(Debug)]
pub struct DLayer {
    pub attn_norm: DVec,
    pub q: DMat,
    pub k: DMat,
    pub v: DMat,
    pub q_norm: DVec,
    pub k_norm: DVec,
    pub gate: Option<DMat>,
    pub o: DMat,
    pub ffn_norm: DVec,
    pub ffn: DFfn,
}

/// Every weight of a model, on one device.
#[derive(Debug)]
pub struct DeviceWeights {
    _buf: CudaSlice<u8>,
    pub token_embd: DMat,
    pub output_norm: DVec,
    pub output: DMat,
    pub layers: Vec<DLayer>,
    /// Bytes on the device.
    pub n_bytes: usize,
    /// Matrices decoded to f32 at upload because no kernel reads their encoding.
    pub n_decoded: usize,
}

/// The device kernel type of a ggml type, if a kernel decodes it, leaving out the grid IQ
/// types (see [`wtype_grid`]).
pub fn wtype(ty: GgmlType) -> Option<WType> {
    wtype_grid(ty, false)
}

/// [`wtype`], with the grid IQ types (IQ3_XXS, IQ2_XXS, IQ2_S: `quant.cuh`'s codebook
/// decoders) when `grid_iq` ([`crate::CudaSessionOptions::grid_iq`], on by default;
/// otherwise they are decoded to f32 at upload).
pub fn wtype_grid(ty: GgmlType, grid_iq: bool) -> Option<WType> {
    Some(match ty {
        GgmlType::IQ3XXS if grid_iq => WType::Iq3Xxs,
        GgmlType::IQ2XXS if grid_iq => WType::Iq2Xxs,
        GgmlType::IQ2S if grid_iq => WType::Iq2S,
        GgmlType::F32 => WType::F32,
        GgmlType::F16 => WType::F16,
        GgmlType::BF16 => WType::Bf16,
        GgmlType::Q8_0 => WType::Q8_0,
        GgmlType::Q4K => WType::Q4K,
        GgmlType::Q6K => WType::Q6K,
        GgmlType::Q5K => WType::Q5K,
        GgmlType::IQ4XS => WType::Iq4Xs,
        _ => return None,
    })
}

/// Bytes of one 32-element block of [`WType::Ct4`] (`block_ct4` in `blocks.cuh`): the scale's
/// 16-bit pattern, the zero point as `i8`, the scale dtype (`WT_F16` / `WT_BF16`), then the
/// 32 unsigned codes, two per byte, low nibble first.
pub const CT4_BLOCK_BYTES: usize = 20;

/// Whether `m` is a 4-bit compressed-tensors matrix [`ct4_blocks`] can repack: whole
/// 32-column scale runs in f16/bf16 and zero points that fit an `i8`.
fn ct4_fits(m: &MatRef<'_>) -> bool {
    matches!(m.enc, Encoding::Ct(ct) if ct.int4_chunked().is_some() && ct.int4_zeros_fit_i8())
}

/// Bytes of one 32-element block of [`WType::Ct8`] (`block_ct8` in `blocks.cuh`): the
/// scale's 16-bit pattern, the zero point as `i8`, the scale dtype, then the 32 signed codes.
pub const CT8_BLOCK_BYTES: usize = 36;

/// Whether `m` is an 8-bit compressed-tensors matrix [`ct8_blocks`] can repack: whole
/// 32-column scale runs in f16/bf16 and zero points that fit an `i8`.
fn ct8_fits(m: &MatRef<'_>) -> bool {
    matches!(m.enc, Encoding::Ct(ct) if ct.int8_chunked().is_some() && ct.int8_zeros_fit_i8())
}

/// An 8-bit compressed-tensors matrix (W8A16 pack-quantized or W8A8 int-quantized) repacked
/// into [`WType::Ct8`] blocks, or `None` where its layout has no such form.
pub fn ct8_blocks(m: &MatRef<'_>) -> Option<Vec<u8>> {
    let Encoding::Ct(ct) = m.enc else {
        return None;
    };
    if !ct8_fits(m) {
        return None;
    }
    let dtype = ct_dtype_byte(ct.int8_chunked()?);
    Some(ct_blocks(m, CT8_BLOCK_BYTES, |r, c, b| {
        // ct8_fits checked that z is an integer in i8's range.
        let (q, s_bits, z) = ct.int8_chunk(r, c);
        for (o, v) in b[4..].iter_mut().zip(q) {
            *o = v as u8;
        }
        (s_bits, z, dtype)
    }))
}

/// The header's dtype byte of a CT4/CT8 block: 1 for f16 scales, 2 for bf16 (the chunked
/// forms take no others).
fn ct_dtype_byte(sd: lagoon_core::quant::ct::ScaleDtype) -> u8 {
    match sd {
        lagoon_core::quant::ct::ScaleDtype::F16 => 1,
        _ => 2,
    }
}

/// The block rows of a compressed-tensors matrix: `fill(r, c, block)` writes chunk `c` of
/// row `r`'s codes from byte 4 on and returns its scale bits, zero point and dtype byte,
/// which go into the block's 4-byte header (`block_ct4` / `block_ct8`).
fn ct_blocks(
    m: &MatRef<'_>,
    block_bytes: usize,
    mut fill: impl FnMut(usize, usize, &mut [u8]) -> (u16, f32, u8),
) -> Vec<u8> {
    let row_bytes = m.cols / 32 * block_bytes;
    let mut out = vec![0u8; m.rows * row_bytes];
    for (r, row) in out.chunks_exact_mut(row_bytes).enumerate() {
        for (c, b) in row.chunks_exact_mut(block_bytes).enumerate() {
            let (s_bits, z, dtype) = fill(r, c, b);
            b[..2].copy_from_slice(&s_bits.to_le_bytes());
            b[2] = z as i8 as u8;
            b[3] = dtype;
        }
    }
    out
}

/// A 4-bit compressed-tensors matrix repacked into [`WType::Ct4`] blocks, or `None` where
/// its layout has no such form (other widths, 3-D blocks, f32 scales, scale runs that are
/// not whole 32-column chunks, or a zero point outside `i8`).
pub fn ct4_blocks(m: &MatRef<'_>) -> Option<Vec<u8>> {
    let Encoding::Ct(ct) = m.enc else {
        return None;
    };
    if !ct4_fits(m) {
        return None;
    }
    let dtype = ct_dtype_byte(ct.int4_chunked()?);
    Some(ct_blocks(m, CT4_BLOCK_BYTES, |r, c, b| {
        // ct4_fits checked that z is an integer in i8's range.
        let (s_bits, z) = ct.int4_chunk_scale_zero(r, c);
        b[4..].copy_from_slice(ct.int4_chunk_codes(r, c));
        (s_bits, z, dtype)
    }))
}

/// Where a piece of the weight buffer comes from. Repacked and decoded matrices are only
/// described when the layout is planned and made one at a time during the upload, so the
/// host never holds more than one of them (a full-size W4A16 checkpoint's repacked experts
/// are ~80 GB: held together next to the mapped files, they had the host killed for memory).
enum Piece<'a> {
    /// Bytes copied as they are: a stored encoding a kernel reads, or a small vector.
    Bytes(Cow<'a, [u8]>),
    /// A 4-bit compressed-tensors matrix, repacked by [`ct4_blocks`] at upload.
    Ct4(MatRef<'a>),
    /// An 8-bit compressed-tensors matrix, repacked by [`ct8_blocks`] at upload.
    Ct8(MatRef<'a>),
    /// A matrix no kernel reads, decoded to f32 rows at upload.
    F32(MatRef<'a>),
}

impl Piece<'_> {
    fn len(&self) -> usize {
        match self {
            Piece::Bytes(b) => b.len(),
            Piece::Ct4(m) => m.rows * m.cols / 32 * CT4_BLOCK_BYTES,
            Piece::Ct8(m) => m.rows * m.cols / 32 * CT8_BLOCK_BYTES,
            Piece::F32(m) => m.rows * m.cols * 4,
        }
    }

    /// The piece's bytes as the kernels read them.
    fn bytes(&self) -> Cow<'_, [u8]> {
        match self {
            Piece::Bytes(b) => Cow::Borrowed(b.as_ref()),
            Piece::Ct4(m) => Cow::Owned(ct4_blocks(m).expect("planned only where ct4_fits holds")),
            Piece::Ct8(m) => Cow::Owned(ct8_blocks(m).expect("planned only where ct8_fits holds")),
            Piece::F32(m) => {
                let mut row = vec![0.0f32; m.cols];
                let mut out = Vec::with_capacity(m.rows * m.cols * 4);
                for r in 0..m.rows {
                    m.dequant_row(r, &mut row);
                    out.extend(row.iter().flat_map(|v| v.to_le_bytes()));
                }
                Cow::Owned(out)
            }
        }
    }
}

/// Bytes of made (repacked or decoded) pieces that may wait for the upload at a time.
const MADE_BYTES_MAX: usize = 4 << 30;

/// Hands every piece's bytes to `sink` with its offset, all on the calling thread: stored
/// bytes as they are, and the pieces to be made (repacked, decoded) made on up to `threads`
/// workers, any order, with at most `budget` bytes of them made and not yet handed over (a
/// piece larger than that alone). A full-size W4A16 model has ~37,000 expert matrices to
/// repack; made one after another on one thread they had the upload wait on the host. The
/// first error of `sink` stops the workers and is returned.
fn for_each_piece<E>(
    items: &[(usize, Piece<'_>)],
    threads: usize,
    budget: usize,
    mut sink: impl FnMut(usize, &[u8]) -> Result<(), E>,
) -> Result<(), E> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    use std::sync::{Condvar, Mutex, mpsc};
    let made: Vec<&(usize, Piece<'_>)> = items
        .iter()
        .filter(|(_, p)| !matches!(p, Piece::Bytes(_)))
        .collect();
    let budget = budget.max(1);
    // Bytes of the budget still free, and the condition workers wait on for more.
    let free = (Mutex::new(budget), Condvar::new());
    let take = |n: usize| n.min(budget);
    let give_back = |n: usize| {
        *free.0.lock().unwrap_or_else(|e| e.into_inner()) += take(n);
        free.1.notify_all();
    };
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let (tx, rx) = mpsc::channel::<(usize, Vec<u8>)>();
        for _ in 0..threads.clamp(1, made.len().max(1)) {
            let tx = tx.clone();
            let (made, next, stop, free) = (&made, &next, &stop, &free);
            sc.spawn(move || {
                while let Some((off, p)) = made.get(next.fetch_add(1, Relaxed)) {
                    let n = take(p.len());
                    let mut left = free.0.lock().unwrap_or_else(|e| e.into_inner());
                    while *left < n && !stop.load(Relaxed) {
                        left = free.1.wait(left).unwrap_or_else(|e| e.into_inner());
                    }
                    if stop.load(Relaxed) {
                        return;
                    }
                    *left -= n;
                    drop(left);
                    if tx.send((*off, p.bytes().into_owned())).is_err() {
                        return;
                    }
                }
            });
        }
        drop(tx);
        let mut run = || {
            for (off, b) in rx.iter() {
                sink(off, &b)?;
                give_back(b.len());
            }
            for (off, p) in items {
                if let Piece::Bytes(b) = p {
                    sink(*off, b)?;
                }
            }
            Ok(())
        };
        let r = run();
        if r.is_err() {
            // Wake and stop the workers (those sending find the receiver gone once this
            // closure returns).
            stop.store(true, Relaxed);
            give_back(budget);
        }
        r
    })
}

/// The matrix's device type and where its bytes come from.
fn device_piece<'a>(m: &MatRef<'a>, force_f32: bool, grid_iq: bool) -> (WType, Piece<'a>) {
    if let Encoding::Ggml { ty, data } = m.enc
        && let Some(wt) = wtype_grid(ty, grid_iq)
        && !force_f32
    {
        return (wt, Piece::Bytes(Cow::Borrowed(data)));
    }
    if !force_f32 && ct4_fits(m) {
        return (WType::Ct4, Piece::Ct4(*m));
    }
    if !force_f32 && ct8_fits(m) {
        return (WType::Ct8, Piece::Ct8(*m));
    }
    (WType::F32, Piece::F32(*m))
}

fn row_bytes(ty: WType, cols: usize) -> u64 {
    let b = match ty {
        WType::F32 => cols * 4,
        WType::F16 | WType::Bf16 => cols * 2,
        WType::Q8_0 => cols / 32 * 34,
        WType::Q4K => cols / 256 * 144,
        WType::Q6K => cols / 256 * 210,
        WType::Q5K => cols / 256 * 176,
        WType::Iq4Xs => cols / 256 * 136,
        WType::Iq3Xxs => cols / 256 * 98,
        WType::Iq2Xxs => cols / 256 * 66,
        WType::Iq2S => cols / 256 * 82,
        WType::Ct4 => cols / 32 * CT4_BLOCK_BYTES,
        WType::Ct8 => cols / 32 * CT8_BLOCK_BYTES,
    };
    b as u64
}

/// An f32 matrix as stored (not decoded to f32 for the device).
fn is_f32(m: &MatRef<'_>) -> bool {
    matches!(
        m.enc,
        Encoding::Ggml {
            ty: GgmlType::F32,
            ..
        }
    )
}

/// Pieces to upload at their offsets in the one weight buffer. Until the buffer exists, the
/// `ptr` of every `DMat`/`DVec` holds its byte offset; `upload` adds the base address.
struct Layout<'a> {
    items: Vec<(usize, Piece<'a>)>,
    len: usize,
    n_decoded: usize,
    /// Keep the grid IQ types quantised ([`wtype_grid`]).
    grid_iq: bool,
    /// Bytes of the matrices decoded to f32, and their stored type names (once each), for
    /// the out-of-memory hint.
    decoded_bytes: u64,
    decoded_types: Vec<String>,
}

/// Alignment of every matrix and vector in the weight buffer (the kernels' wide loads rely
/// on rows starting at least 16-byte aligned).
const ALIGN: usize = 256;

impl<'a> Layout<'a> {
    fn place(&mut self, piece: Piece<'a>, align: bool) -> usize {
        if align {
            self.len = self.len.next_multiple_of(ALIGN);
        }
        let off = self.len;
        self.len += piece.len();
        self.items.push((off, piece));
        off
    }

    /// Counts `m` as decoded to f32 (`bytes` on the device).
    fn decoded(&mut self, m: &MatRef<'_>, bytes: u64) {
        self.n_decoded += 1;
        self.decoded_bytes += bytes;
        let name = m.type_name().to_string();
        if !self.decoded_types.contains(&name) {
            self.decoded_types.push(name);
        }
    }

    fn mat(&mut self, m: &MatRef<'a>) -> DMat {
        let (ty, piece) = device_piece(m, false, self.grid_iq);
        if ty == WType::F32 && !is_f32(m) {
            self.decoded(m, piece.len() as u64);
        }
        let n = piece.len() as u64;
        let ptr = self.place(piece, true) as u64;
        DMat {
            ptr,
            ty,
            rows: m.rows,
            cols: m.cols,
            row_bytes: row_bytes(ty, m.cols),
            expert_bytes: n,
        }
    }

    /// Experts stacked back to back, all in one type (f32 unless every expert has the same
    /// kernel-readable type, and `force_f32` is off).
    fn stack(&mut self, parts: &[MatRef<'a>], force_f32: bool) -> DMat {
        let mut pieces: Vec<(WType, Piece<'a>)> = parts
            .iter()
            .map(|p| device_piece(p, force_f32, self.grid_iq))
            .collect();
        let ty = pieces[0].0;
        if pieces.iter().any(|(t, _)| *t != ty) {
            pieces = parts.iter().map(|p| device_piece(p, true, false)).collect();
        }
        let ty = pieces[0].0;
        if ty == WType::F32 {
            for (p, (_, piece)) in parts.iter().zip(&pieces) {
                if !is_f32(p) {
                    self.decoded(p, piece.len() as u64);
                }
            }
        }
        let mut base = 0;
        let mut eb = 0;
        for (e, (_, p)) in pieces.into_iter().enumerate() {
            eb = p.len() as u64;
            let off = self.place(p, e == 0);
            if e == 0 {
                base = off;
            }
        }
        DMat {
            ptr: base as u64,
            ty,
            rows: parts[0].rows,
            cols: parts[0].cols,
            row_bytes: row_bytes(ty, parts[0].cols),
            expert_bytes: eb,
        }
    }

    fn vector(&mut self, v: &[f32]) -> DVec {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        DVec {
            ptr: self.place(Piece::Bytes(Cow::Owned(bytes)), true) as u64,
            len: v.len(),
        }
    }
}

/// What makes the weights smaller: the matrices decoded to f32 at upload (`n` of them,
/// `bytes` on the device, stored as `types`), and the grid IQ option when it is off and
/// such types are among them.
fn oom_hint(n: usize, bytes: u64, types: &[String], grid_iq: bool) -> String {
    if n == 0 {
        return "every weight is kept in its stored encoding already: a smaller quantisation \
                or a device with more memory is needed (this backend keeps all weights on \
                the device)"
            .to_string();
    }
    let mut h = format!(
        "{n} matrices ({}) are decoded to f32 at upload, {:.2} GiB of it, because no kernel \
         reads their encoding",
        types.join(", "),
        bytes as f64 / (1u64 << 30) as f64
    );
    let grid = ["iq3_xxs", "iq2_xxs", "iq2_s"];
    if !grid_iq
        && types
            .iter()
            .any(|t| grid.contains(&t.to_ascii_lowercase().as_str()))
    {
        h.push_str(
            "; CudaSessionOptions::grid_iq (the default; LAGOON_CUDA_GRID_IQ=0 had turned it \
             off) keeps IQ3_XXS, IQ2_XXS and IQ2_S quantised",
        );
    }
    h
}

impl DeviceWeights {
    /// Copies every weight to the device (`grid_iq`: keep the grid IQ types quantised, see
    /// [`wtype_grid`]).
    pub fn upload(
        dev: &Device,
        w: &ModelWeights<'_>,
        grid_iq: bool,
    ) -> Result<DeviceWeights, CudaError> {
        let mut lay = Layout {
            items: Vec::new(),
            len: 0,
            n_decoded: 0,
            grid_iq,
            decoded_bytes: 0,
            decoded_types: Vec::new(),
        };
        let token_embd = lay.mat(&w.token_embd);
        let output_norm = lay.vector(&w.output_norm);
        let output = lay.mat(&w.output);
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            let ffn = match &l.ffn {
                Ffn::Dense(m) => DFfn::Dense([lay.mat(&m.gate), lay.mat(&m.up), lay.mat(&m.down)]),
                Ffn::Moe {
                    router,
                    bias,
                    gate,
                    up,
                    down,
                    shared,
                } => {
                    // Gate and up are read by one kernel: they share a type.
                    let mark = (lay.items.len(), lay.len, lay.n_decoded, lay.decoded_bytes);
                    let mut gate_d = lay.stack(gate, false);
                    let mut up_d = lay.stack(up, false);
                    if up_d.ty != gate_d.ty {
                        lay.items.truncate(mark.0);
                        (lay.len, lay.n_decoded, lay.decoded_bytes) = (mark.1, mark.2, mark.3);
                        gate_d = lay.stack(gate, true);
                        up_d = lay.stack(up, true);
                    }
                    DFfn::Moe {
                        router: lay.mat(router),
                        bias: lay.vector(bias),
                        gate: gate_d,
                        up: up_d,
                        down: lay.stack(down, false),
                        shared: shared
                            .as_ref()
                            .map(|m| [lay.mat(&m.gate), lay.mat(&m.up), lay.mat(&m.down)]),
                    }
                }
            };
            layers.push(DLayer {
                attn_norm: lay.vector(&l.attn_norm),
                q: lay.mat(&l.q),
                k: lay.mat(&l.k),
                v: lay.mat(&l.v),
                q_norm: lay.vector(&l.q_norm),
                k_norm: lay.vector(&l.k_norm),
                gate: l.gate.as_ref().map(|g| lay.mat(g)),
                o: lay.mat(&l.o),
                ffn_norm: lay.vector(&l.ffn_norm),
                ffn,
            });
        }
        // Slack past the last matrix: the Q8_0 loader reads up to 2 bytes past a block.
        let len = lay.len + ALIGN;
        // Checked before allocating, so a model that cannot fit says why and what to change.
        let (free, total) = dev
            .ctx
            .mem_get_info()
            .during("reading the device's free memory")?;
        if len > free {
            return Err(CudaError::OutOfMemory {
                what: "the weights",
                need: len as u64,
                free: free as u64,
                total: total as u64,
                hint: oom_hint(
                    lay.n_decoded,
                    lay.decoded_bytes,
                    &lay.decoded_types,
                    lay.grid_iq,
                ),
            });
        }
        let mut buf = dev
            .stream
            .alloc_zeros::<u8>(len)
            .during("allocating device memory for the weights")?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        for_each_piece(&lay.items, threads, MADE_BYTES_MAX, |off, bytes| {
            let mut dst = buf.slice_mut(off..off + bytes.len());
            dev.stream
                .memcpy_htod(bytes, &mut dst)
                .during("copying weights to the device")
        })?;
        dev.stream
            .synchronize()
            .during("waiting for the weight upload")?;
        let base = buf.device_ptr(&dev.stream).0;
        let fix = |m: &mut DMat| m.ptr += base;
        let fixv = |v: &mut DVec| v.ptr += base;
        let mut dw = DeviceWeights {
            _buf: buf,
            token_embd,
            output_norm,
            output,
            layers,
            n_bytes: len,
            n_decoded: lay.n_decoded,
        };
        fix(&mut dw.token_embd);
        fix(&mut dw.output);
        fixv(&mut dw.output_norm);
        for l in &mut dw.layers {
            for m in [&mut l.q, &mut l.k, &mut l.v, &mut l.o] {
                fix(m);
            }
            if let Some(g) = &mut l.gate {
                fix(g);
            }
            for v in [
                &mut l.attn_norm,
                &mut l.q_norm,
                &mut l.k_norm,
                &mut l.ffn_norm,
            ] {
                fixv(v);
            }
            match &mut l.ffn {
                DFfn::Dense(m) => m.iter_mut().for_each(fix),
                DFfn::Moe {
                    router,
                    bias,
                    gate,
                    up,
                    down,
                    shared,
                } => {
                    for m in [router, gate, up, down] {
                        fix(m);
                    }
                    fixv(bias);
                    if let Some(s) = shared {
                        s.iter_mut().for_each(fix);
                    }
                }
            }
        }
        Ok(dw)
    }

    /// The matrix the graph names `id`.
    pub fn mat(&self, id: Weight) -> DMat {
        match id {
            Weight::TokenEmbd => self.token_embd,
            Weight::Output => self.output,
            Weight::Layer(l, lw) => {
                let layer = &self.layers[l];
                match (lw, &layer.ffn) {
                    (L::Q, _) => layer.q,
                    (L::K, _) => layer.k,
                    (L::V, _) => layer.v,
                    (L::O, _) => layer.o,
                    (L::Gate, _) => layer
                        .gate
                        .expect("graph uses a gate only when the layer has one"),
                    (L::FfnGate, DFfn::Dense(m)) => m[0],
                    (L::FfnUp, DFfn::Dense(m)) => m[1],
                    (L::FfnDown, DFfn::Dense(m)) => m[2],
                    (L::Router, DFfn::Moe { router, .. }) => *router,
                    (
                        L::GateShexp,
                        DFfn::Moe {
                            shared: Some(s), ..
                        },
                    ) => s[0],
                    (
                        L::UpShexp,
                        DFfn::Moe {
                            shared: Some(s), ..
                        },
                    ) => s[1],
                    (
                        L::DownShexp,
                        DFfn::Moe {
                            shared: Some(s), ..
                        },
                    ) => s[2],
                    _ => unreachable!("graph asked for {id:?} as a matrix"),
                }
            }
            Weight::OutputNorm => unreachable!("output norm is a vector"),
        }
    }

    /// The vector the graph names `id`.
    pub fn vector(&self, id: Weight) -> DVec {
        match id {
            Weight::OutputNorm => self.output_norm,
            Weight::Layer(l, L::AttnNorm) => self.layers[l].attn_norm,
            Weight::Layer(l, L::FfnNorm) => self.layers[l].ffn_norm,
            Weight::Layer(l, L::QNorm) => self.layers[l].q_norm,
            Weight::Layer(l, L::KNorm) => self.layers[l].k_norm,
            _ => unreachable!("graph asked for {id:?} as a vector"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The out-of-memory hint names the decoded matrices and, only where it would help, the
    /// grid IQ option.
    #[test]
    fn oom_hint_names_decoded_types_and_the_grid_option() {
        let t = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let h = oom_hint(96, 40 << 30, &t(&["iq3_xxs", "q2_K"]), false);
        assert!(h.contains("96 matrices (iq3_xxs, q2_K)"), "{h}");
        assert!(h.contains("40.00 GiB"), "{h}");
        assert!(h.contains("grid_iq"), "{h}");
        assert!(!oom_hint(96, 1 << 30, &t(&["iq3_xxs"]), true).contains("grid_iq"));
        assert!(!oom_hint(3, 1 << 30, &t(&["q2_K"]), false).contains("grid_iq"));
        assert!(oom_hint(0, 0, &[], false).contains("smaller quantisation"));
        let e = CudaError::OutOfMemory {
            what: "the weights",
            need: 3 << 30,
            free: 1 << 30,
            total: 2 << 30,
            hint: "x".into(),
        };
        assert_eq!(
            e.to_string(),
            "the weights need 3.00 GiB of device memory but only 1.00 GiB of 2.00 GiB are free; x"
        );
    }
    use lagoon_core::quant::ct::{
        CtKind, CtLayout, CtMatrix, CtStrategy, PackOrder, ScaleDtype, ZeroPoint, ZpDtype,
    };

    struct Rng(u64);
    impl Rng {
        fn byte(&mut self) -> u8 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 24) as u8
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.byte()).collect()
        }
    }

    /// A compressed-tensors matrix's buffers: weight, scale, zero.
    type CtBufs = (Vec<u8>, Vec<u8>, Vec<u8>);

    /// A random 4-bit group-32 matrix's buffers for `layout`, scales finite and positive in
    /// the scale dtype.
    fn ct_buffers(rng: &mut Rng, layout: &CtLayout) -> CtBufs {
        let weight = rng.bytes(layout.weight_bytes());
        let scale = (0..layout.scale_bytes() / 2)
            .flat_map(|_| {
                let v = 0.001 + f32::from(rng.byte()) * 1e-4;
                match layout.scale_dtype {
                    ScaleDtype::F16 => half::f16::from_f32(v).to_le_bytes(),
                    _ => half::bf16::from_f32(v).to_le_bytes(),
                }
            })
            .collect();
        let zero = match layout.zero {
            // Plain u8 zero points in 0..16, as an asymmetric int4 checkpoint stores them.
            Some(ZeroPoint::Plain(_)) => {
                (0..layout.zero_bytes()).map(|_| rng.byte() & 15).collect()
            }
            _ => rng.bytes(layout.zero_bytes()),
        };
        (weight, scale, zero)
    }

    fn layout(rows: usize, cols: usize, sd: ScaleDtype, zero: Option<ZeroPoint>) -> CtLayout {
        CtLayout {
            kind: CtKind::packed_int(4, CtStrategy::Group(32), zero.is_none(), PackOrder::Dense),
            rows,
            cols,
            scale_dtype: sd,
            zero,
        }
    }

    /// Every CT4 block holds its chunk's scale bits, zero point, scale dtype and codes as
    /// `CtMatrix::int4_chunk` gives them (the decoding core checks against `dequant_row`).
    /// Every block of a matrix carries the matrix's dtype: `gemm_rf.cu`'s `rf_loop` reads it
    /// from a tile's first block and decodes the whole tile by it.
    #[test]
    fn ct4_blocks_hold_each_chunks_scale_zero_and_codes() {
        let mut rng = Rng(0x5eed_c7a4);
        for (sd, zero) in [
            (ScaleDtype::Bf16, None),
            (ScaleDtype::F16, Some(ZeroPoint::Packed)),
            (ScaleDtype::Bf16, Some(ZeroPoint::Plain(ZpDtype::U8))),
        ] {
            let (rows, cols) = (24, 96);
            let l = layout(rows, cols, sd, zero);
            let (w, s, z) = ct_buffers(&mut rng, &l);
            let ct = CtMatrix::new(l, &w, &s, &z).unwrap();
            let m = MatRef {
                rows,
                cols,
                enc: Encoding::Ct(ct),
            };
            let blocks = ct4_blocks(&m).expect("a CT4-repackable matrix");
            assert_eq!(blocks.len(), rows * cols / 32 * CT4_BLOCK_BYTES);
            let want_dtype = if sd == ScaleDtype::F16 { 1 } else { 2 };
            let mut q = [0u8; 32];
            for r in 0..rows {
                for c in 0..cols / 32 {
                    let (s_bits, zp) = ct.int4_chunk(r, c, &mut q);
                    let b = &blocks[(r * cols / 32 + c) * CT4_BLOCK_BYTES..][..CT4_BLOCK_BYTES];
                    assert_eq!(u16::from_le_bytes([b[0], b[1]]), s_bits, "{sd:?} r{r} c{c}");
                    assert_eq!(b[2] as i8 as f32, zp, "{sd:?} r{r} c{c}");
                    assert_eq!(b[3], want_dtype);
                    for k in 0..16 {
                        assert_eq!(b[4 + k], q[2 * k] | (q[2 * k + 1] << 4), "{sd:?} r{r} c{c}");
                    }
                }
            }
        }
        // A plain zero point past i8's range: no CT4 form (the matrix decodes to f32).
        let l = layout(2, 64, ScaleDtype::Bf16, Some(ZeroPoint::Plain(ZpDtype::U8)));
        let (w, s, mut z) = ct_buffers(&mut Rng(3), &l);
        z[1] = 200;
        let m = MatRef {
            rows: 2,
            cols: 64,
            enc: Encoding::Ct(CtMatrix::new(l, &w, &s, &z).unwrap()),
        };
        assert!(ct4_blocks(&m).is_none());
        assert_eq!(device_piece(&m, false, false).0, WType::F32);
    }

    /// CT8 blocks, decoded the way `quant.cuh` decodes them (rnd(rnd(q − z) · s) in the
    /// scale dtype from the block's bytes), give `dequant_row`'s values bit for bit: W8A16
    /// (pack-quantized 8-bit, group 64 with packed zero points) and W8A8 (int-quantized I8,
    /// channel); FP8 and 4-bit matrices have no CT8 form.
    #[test]
    fn ct8_blocks_decode_as_dequant_row() {
        let mut rng = Rng(0x5eed_c7a8);
        let (rows, cols) = (24usize, 128usize);
        for (kind, sd, zero) in [
            (
                CtKind::packed_int(8, CtStrategy::Group(64), false, PackOrder::Dense),
                ScaleDtype::F16,
                Some(ZeroPoint::Packed),
            ),
            (
                CtKind::Int8 {
                    symmetric: true,
                    strategy: CtStrategy::Channel,
                },
                ScaleDtype::Bf16,
                None,
            ),
        ] {
            let l = CtLayout {
                kind,
                rows,
                cols,
                scale_dtype: sd,
                zero,
            };
            let (w, s, z) = ct_buffers(&mut rng, &l);
            let m = MatRef {
                rows,
                cols,
                enc: Encoding::Ct(CtMatrix::new(l, &w, &s, &z).unwrap()),
            };
            assert_eq!(device_piece(&m, false, false).0, WType::Ct8, "{kind}");
            let blocks = ct8_blocks(&m).expect("a CT8-repackable matrix");
            assert_eq!(blocks.len(), rows * cols / 32 * CT8_BLOCK_BYTES);
            let Encoding::Ct(ct) = m.enc else {
                unreachable!()
            };
            let mut want = vec![0.0f32; cols];
            for r in 0..rows {
                ct.dequant_row(r, &mut want);
                for c in 0..cols / 32 {
                    let b = &blocks[(r * cols / 32 + c) * CT8_BLOCK_BYTES..][..CT8_BLOCK_BYTES];
                    let bits = u16::from_le_bytes([b[0], b[1]]);
                    let bf = match b[3] {
                        2 => true,
                        1 => false,
                        d => panic!("scale dtype byte {d}"),
                    };
                    let (scale, round): (f32, fn(f32) -> f32) = if bf {
                        (half::bf16::from_bits(bits).to_f32(), |v| {
                            half::bf16::from_f32(v).to_f32()
                        })
                    } else {
                        (half::f16::from_bits(bits).to_f32(), |v| {
                            half::f16::from_f32(v).to_f32()
                        })
                    };
                    let zp = b[2] as i8 as f32;
                    for i in 0..32 {
                        let q = b[4 + i] as i8 as f32;
                        let got = round(round(q - zp) * scale);
                        assert_eq!(
                            got.to_bits(),
                            want[32 * c + i].to_bits(),
                            "{kind} r{r} c{c} i{i}"
                        );
                    }
                }
            }
        }
        let l4 = layout(2, 64, ScaleDtype::Bf16, None);
        let (w, s, z) = ct_buffers(&mut rng, &l4);
        let m4 = MatRef {
            rows: 2,
            cols: 64,
            enc: Encoding::Ct(CtMatrix::new(l4, &w, &s, &z).unwrap()),
        };
        assert!(ct8_blocks(&m4).is_none());
    }

    /// The parallel upload hands each piece over once, whole, at its offset, whatever the
    /// worker count and byte budget, and stops at the sink's first error.
    #[test]
    fn every_piece_reaches_the_sink_whole_at_its_offset() {
        let mut rng = Rng(0x0b1e_c7ed);
        let bufs: Vec<(CtLayout, CtBufs)> = (0..5)
            .map(|i| {
                let l = layout(8 + i, 64, ScaleDtype::Bf16, None);
                let b = ct_buffers(&mut rng, &l);
                (l, b)
            })
            .collect();
        // Q4_0 has no kernel here: decoded to f32 at upload.
        let q4_0 = rng.bytes(6 * 18 * 2);
        let stored = rng.bytes(1000);
        let mut pieces: Vec<Piece<'_>> = bufs
            .iter()
            .map(|(l, (w, s, z))| {
                Piece::Ct4(MatRef {
                    rows: l.rows,
                    cols: l.cols,
                    enc: Encoding::Ct(CtMatrix::new(*l, w, s, z).unwrap()),
                })
            })
            .collect();
        pieces.insert(
            2,
            Piece::F32(MatRef {
                rows: 6,
                cols: 64,
                enc: Encoding::Ggml {
                    ty: GgmlType::Q4_0,
                    data: &q4_0,
                },
            }),
        );
        pieces.insert(0, Piece::Bytes(Cow::Borrowed(&stored)));
        pieces.insert(4, Piece::Bytes(Cow::Owned(vec![7u8; 33])));
        let mut items = Vec::new();
        let mut len = 0usize;
        for p in pieces {
            len = len.next_multiple_of(ALIGN);
            let n = p.len();
            items.push((len, p));
            len += n;
        }
        let mut want = vec![0u8; len];
        for (off, p) in &items {
            let b = p.bytes();
            assert_eq!(b.len(), p.len());
            want[*off..*off + b.len()].copy_from_slice(&b);
        }
        for (threads, budget) in [(1, usize::MAX), (3, 1), (3, 700), (8, 1 << 20)] {
            let mut got = vec![0u8; len];
            let mut seen = Vec::new();
            for_each_piece(&items, threads, budget, |off, b| {
                got[off..off + b.len()].copy_from_slice(b);
                seen.push(off);
                Ok::<(), ()>(())
            })
            .unwrap();
            seen.sort_unstable();
            let offs: Vec<usize> = items.iter().map(|(o, _)| *o).collect();
            assert_eq!(seen, offs, "threads {threads}, budget {budget}");
            assert!(got == want, "threads {threads}, budget {budget}");
        }
        // The sink's error stops the upload (and the workers: the test would hang).
        let mut calls = 0;
        let r = for_each_piece(&items, 3, 1, |_, _| {
            calls += 1;
            if calls == 2 { Err("full") } else { Ok(()) }
        });
        assert_eq!(r, Err("full"));
        assert_eq!(calls, 2);
    }
}
