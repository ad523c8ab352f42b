//! compressed-tensors quantised Linears (spec/formats.md §7): pack-quantized int1..int8
//! (group, channel, tensor and block scales, symmetric and asymmetric), int-quantized /
//! naive-quantized int8 (`I8` weights), float-quantized FP8 E4M3.
//!
//! A [`CtLayout`] says how the bytes are laid out; a [`CtMatrix`] is a layout plus the borrowed
//! weight, scale and zero-point bytes. [`CtMatrix::dequant_row`] is the reference decoder: it
//! reproduces compressed-tensors' `dequantize` bit for bit, which computes
//! `(q − z) · s` **in the scale's dtype**: the integer code and zero point are cast to the
//! scale dtype, subtracted, multiplied by the scale, each step rounded to that dtype (the
//! products are exact in f32, so "f32 then round to nearest even" is the same thing).

/// Which weights share one scale (and zero point).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CtStrategy {
    /// One scale for the whole matrix (scale shape `[1]`).
    Tensor,
    /// One scale per output row (`[out, 1]`).
    Channel,
    /// One scale per `n` consecutive input columns of a row (`[out, ceil(in / n)]`).
    Group(u32),
    /// One scale per `rows × cols` tile (`[ceil(out / rows), ceil(in / cols)]`); tiles at the
    /// bottom and right edges are partial.
    Block { rows: u32, cols: u32 },
}

/// Bit order of pack-quantized int32 words. The two agree for 1, 2, 4 and 8 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PackOrder {
    /// compressed-tensors ≥ 0.20: element `c` of a row starts at bit `c·b` of the row's
    /// little-endian word stream and may straddle two words (low bits in the earlier word).
    Dense,
    /// The short-lived 0.19 layout for 3/5/6/7 bits: `floor(32 / b)` elements per word,
    /// element `c` in word `c / (32/b)` at bit `b·(c mod 32/b)`, high bits unused.
    PerWord,
}

/// Which compressed-tensors encoding a matrix uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CtKind {
    /// `pack-quantized`: `b`-bit signed codes stored `+ 2^(b−1)` in int32 words along each row
    /// (`P.weight_packed`, `P.weight_scale`, `P.weight_shape`, `P.weight_zero_point`).
    PackedInt {
        bits: u8,
        /// Columns per scale for the group strategy; 0 for the other strategies.
        group: u32,
        symmetric: bool,
        strategy: CtStrategy,
        order: PackOrder,
    },
    /// `int-quantized` / `naive-quantized` int8: one signed `i8` per weight, not offset.
    Int8 {
        symmetric: bool,
        strategy: CtStrategy,
    },
    /// `float-quantized` FP8 E4M3 weights, no zero point.
    Fp8 { strategy: CtStrategy },
}

impl CtKind {
    /// A pack-quantized kind with `group` derived from the strategy, and the bit order
    /// normalised to [`PackOrder::Dense`] where both orders agree.
    pub fn packed_int(bits: u8, strategy: CtStrategy, symmetric: bool, order: PackOrder) -> Self {
        let group = match strategy {
            CtStrategy::Group(g) => g,
            _ => 0,
        };
        let order = if 32 % bits.max(1) as u32 == 0 {
            PackOrder::Dense
        } else {
            order
        };
        CtKind::PackedInt {
            bits,
            group,
            symmetric,
            strategy,
            order,
        }
    }

    /// The scale grouping.
    pub fn strategy(&self) -> CtStrategy {
        match *self {
            CtKind::PackedInt { strategy, .. }
            | CtKind::Int8 { strategy, .. }
            | CtKind::Fp8 { strategy } => strategy,
        }
    }

    /// Whether zero points are stored.
    pub fn symmetric(&self) -> bool {
        match *self {
            CtKind::PackedInt { symmetric, .. } | CtKind::Int8 { symmetric, .. } => symmetric,
            CtKind::Fp8 { .. } => true,
        }
    }
}

impl core::fmt::Display for CtStrategy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CtStrategy::Tensor => f.write_str("t"),
            CtStrategy::Channel => f.write_str("ch"),
            CtStrategy::Group(g) => write!(f, "g{g}"),
            CtStrategy::Block { rows, cols } => write!(f, "b{rows}x{cols}"),
        }
    }
}

impl core::fmt::Display for CtKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let asym = |s: bool| if s { "" } else { "-asym" };
        match self {
            CtKind::PackedInt {
                bits,
                symmetric,
                strategy,
                order,
                ..
            } => {
                write!(f, "ct-int{bits}-{strategy}{}", asym(*symmetric))?;
                if *order == PackOrder::PerWord {
                    f.write_str("-perword")?;
                }
                Ok(())
            }
            CtKind::Int8 {
                symmetric,
                strategy,
            } => write!(f, "ct-i8-{strategy}{}", asym(*symmetric)),
            CtKind::Fp8 { strategy } => write!(f, "ct-fp8-{strategy}"),
        }
    }
}

/// The dtype scales are stored in, and in which the dequantised value is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleDtype {
    Bf16,
    F16,
    F32,
}

impl ScaleDtype {
    /// Bytes per scale.
    pub const fn size(self) -> usize {
        match self {
            ScaleDtype::Bf16 | ScaleDtype::F16 => 2,
            ScaleDtype::F32 => 4,
        }
    }

    /// Rounds an f32 to this dtype (round to nearest even) and back.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            ScaleDtype::Bf16 => half::bf16::from_f32(x).to_f32(),
            ScaleDtype::F16 => half::f16::from_f32(x).to_f32(),
            ScaleDtype::F32 => x,
        }
    }

    /// Reads element `i` (little-endian) of a buffer of this dtype.
    #[inline]
    fn load(self, b: &[u8], i: usize) -> f32 {
        match self {
            ScaleDtype::Bf16 => bf16_le(b, i),
            ScaleDtype::F16 => half::f16::from_bits(u16_le(b, i)).to_f32(),
            ScaleDtype::F32 => f32_le(b, i),
        }
    }
}

/// How zero points are stored (asymmetric schemes only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZeroPoint {
    /// pack-quantized group/channel: `b`-bit codes `+ 2^(b−1)` packed along the **output**
    /// dimension into int32 words, shape `[words(out), grid_cols]`: the zero point of row `r`,
    /// scale column `g` is element `r` of column `g`'s word stream (same [`PackOrder`] as the
    /// weights).
    Packed,
    /// One value per scale, same grid as the scales, in this dtype.
    Plain(ZpDtype),
}

/// Element type of unpacked zero points.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZpDtype {
    I8,
    U8,
    I32,
    I64,
    Bf16,
    F16,
    F32,
}

impl ZpDtype {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            ZpDtype::I8 | ZpDtype::U8 => 1,
            ZpDtype::Bf16 | ZpDtype::F16 => 2,
            ZpDtype::I32 | ZpDtype::F32 => 4,
            ZpDtype::I64 => 8,
        }
    }

    #[inline]
    fn load(self, b: &[u8], i: usize) -> f32 {
        match self {
            ZpDtype::I8 => b[i] as i8 as f32,
            ZpDtype::U8 => b[i] as f32,
            ZpDtype::I32 => u32_le(b, i) as i32 as f32,
            ZpDtype::I64 => {
                let mut w = [0u8; 8];
                w.copy_from_slice(&b[8 * i..8 * i + 8]);
                i64::from_le_bytes(w) as f32
            }
            ZpDtype::Bf16 => bf16_le(b, i),
            ZpDtype::F16 => half::f16::from_bits(u16_le(b, i)).to_f32(),
            ZpDtype::F32 => f32_le(b, i),
        }
    }
}

/// A layout or buffer that cannot be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtError {
    /// pack-quantized bit width outside 1..=8.
    Bits { bits: u8 },
    /// A group or block size of 0, or zero points where the kind has none.
    Geometry { detail: &'static str },
    /// A buffer of the wrong length.
    Size {
        buffer: &'static str,
        expected: usize,
        got: usize,
    },
}

impl core::fmt::Display for CtError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CtError::Bits { bits } => write!(f, "pack-quantized width {bits} is not in 1..=8"),
            CtError::Geometry { detail } => f.write_str(detail),
            CtError::Size {
                buffer,
                expected,
                got,
            } => write!(f, "{buffer} holds {got} bytes, expected {expected}"),
        }
    }
}

/// Everything about a compressed-tensors matrix except its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CtLayout {
    pub kind: CtKind,
    /// Output features.
    pub rows: usize,
    /// Input features (the true width, from `weight_shape` for packed weights).
    pub cols: usize,
    pub scale_dtype: ScaleDtype,
    /// `Some` exactly when the kind is asymmetric.
    pub zero: Option<ZeroPoint>,
}

impl CtLayout {
    /// Checks the kind's parameters and that zero points are present iff asymmetric.
    pub fn check(&self) -> Result<(), CtError> {
        if let CtKind::PackedInt { bits, .. } = self.kind
            && !(1..=8).contains(&bits)
        {
            return Err(CtError::Bits { bits });
        }
        match self.kind.strategy() {
            CtStrategy::Group(0) => {
                return Err(CtError::Geometry {
                    detail: "group size is 0",
                });
            }
            CtStrategy::Block { rows, cols } if rows == 0 || cols == 0 => {
                return Err(CtError::Geometry {
                    detail: "block size is 0",
                });
            }
            _ => {}
        }
        match (self.kind.symmetric(), self.zero) {
            (true, Some(_)) => Err(CtError::Geometry {
                detail: "zero points given for a symmetric scheme",
            }),
            (false, None) => Err(CtError::Geometry {
                detail: "asymmetric scheme without zero points",
            }),
            (false, Some(ZeroPoint::Packed))
                if !matches!(self.kind, CtKind::PackedInt { .. })
                    || !matches!(
                        self.kind.strategy(),
                        CtStrategy::Group(_) | CtStrategy::Channel
                    ) =>
            {
                Err(CtError::Geometry {
                    detail: "packed zero points exist only for pack-quantized group/channel schemes",
                })
            }
            _ => Ok(()),
        }
    }

    /// `(rows, cols)` of the scale grid (also of unpacked zero points).
    pub fn scale_grid(&self) -> (usize, usize) {
        match self.kind.strategy() {
            CtStrategy::Tensor => (1, 1),
            CtStrategy::Channel => (self.rows, 1),
            CtStrategy::Group(g) => (self.rows, self.cols.div_ceil(g.max(1) as usize)),
            CtStrategy::Block { rows, cols } => (
                self.rows.div_ceil(rows.max(1) as usize),
                self.cols.div_ceil(cols.max(1) as usize),
            ),
        }
    }

    /// Bytes of one stored weight row.
    pub fn weight_row_bytes(&self) -> usize {
        match self.kind {
            CtKind::PackedInt { bits, order, .. } => 4 * packed_words(self.cols, bits, order),
            CtKind::Int8 { .. } | CtKind::Fp8 { .. } => self.cols,
        }
    }

    /// Bytes of the weight buffer.
    pub fn weight_bytes(&self) -> usize {
        self.rows * self.weight_row_bytes()
    }

    /// Bytes of the scale buffer.
    pub fn scale_bytes(&self) -> usize {
        let (r, c) = self.scale_grid();
        r * c * self.scale_dtype.size()
    }

    /// Shape `[rows, cols]` of the zero-point tensor as stored (packed words for
    /// [`ZeroPoint::Packed`]); `None` when symmetric.
    pub fn zero_shape(&self) -> Option<(usize, usize)> {
        let (gr, gc) = self.scale_grid();
        match (self.zero?, self.kind) {
            (ZeroPoint::Packed, CtKind::PackedInt { bits, order, .. }) => {
                Some((packed_words(self.rows, bits, order), gc))
            }
            _ => Some((gr, gc)),
        }
    }

    /// Bytes of the zero-point buffer (0 when symmetric).
    pub fn zero_bytes(&self) -> usize {
        let Some((r, c)) = self.zero_shape() else {
            return 0;
        };
        let size = match self.zero {
            Some(ZeroPoint::Plain(t)) => t.size(),
            _ => 4,
        };
        r * c * size
    }
}

/// int32 words holding `n` packed `bits`-bit values.
pub fn packed_words(n: usize, bits: u8, order: PackOrder) -> usize {
    let b = bits.max(1) as usize;
    match order {
        PackOrder::Dense => (n * b).div_ceil(32),
        PackOrder::PerWord => n.div_ceil(32 / b),
    }
}

/// A borrowed compressed-tensors matrix.
#[derive(Clone, Copy, Debug)]
pub struct CtMatrix<'a> {
    pub layout: CtLayout,
    /// Row-major weight bytes (`weight_packed` words, `i8`s or FP8 bytes).
    pub weight: &'a [u8],
    /// Row-major scale grid, little-endian in `layout.scale_dtype`.
    pub scale: &'a [u8],
    /// Zero points (empty when symmetric).
    pub zero: &'a [u8],
}

impl<'a> CtMatrix<'a> {
    /// Checks the layout and that every buffer has exactly the length the layout implies.
    pub fn new(
        layout: CtLayout,
        weight: &'a [u8],
        scale: &'a [u8],
        zero: &'a [u8],
    ) -> Result<Self, CtError> {
        layout.check()?;
        for (buffer, expected, got) in [
            ("weight", layout.weight_bytes(), weight.len()),
            ("weight_scale", layout.scale_bytes(), scale.len()),
            ("weight_zero_point", layout.zero_bytes(), zero.len()),
        ] {
            if expected != got {
                return Err(CtError::Size {
                    buffer,
                    expected,
                    got,
                });
            }
        }
        Ok(CtMatrix {
            layout,
            weight,
            scale,
            zero,
        })
    }

    /// The encoding.
    pub fn kind(&self) -> CtKind {
        self.layout.kind
    }

    /// Bytes the encoded matrix occupies (weights, scales and zero points).
    pub fn n_bytes(&self) -> usize {
        self.weight.len() + self.scale.len() + self.zero.len()
    }

    /// Decodes row `r` into `out[..cols]`, bit-exact with compressed-tensors' `dequantize`.
    ///
    /// Buffers were validated by [`CtMatrix::new`] (or by the loader); here only debug-asserted.
    pub fn dequant_row(&self, r: usize, out: &mut [f32]) {
        let l = &self.layout;
        debug_assert!(r < l.rows && out.len() >= l.cols);
        let out = &mut out[..l.cols];
        let rb = l.weight_row_bytes();
        let row = &self.weight[r * rb..(r + 1) * rb];
        let sd = l.scale_dtype;
        // Columns sharing one scale: the run [c0, c1) uses grid cell (gr, gc).
        let (_, grid_cols) = l.scale_grid();
        let (run, grid_row) = match l.kind.strategy() {
            CtStrategy::Tensor => (l.cols, 0),
            CtStrategy::Channel => (l.cols, r),
            CtStrategy::Group(g) => (g as usize, r),
            CtStrategy::Block { rows, cols } => (cols as usize, r / rows as usize),
        };
        let mut c0 = 0;
        let mut gc = 0;
        while c0 < l.cols {
            let c1 = (c0 + run).min(l.cols);
            let cell = grid_row * grid_cols + gc;
            let s = match l.kind.strategy() {
                CtStrategy::Tensor => sd.load(self.scale, 0),
                _ => sd.load(self.scale, cell),
            };
            // The zero point cast to the scale dtype, as `zero_point.to(scale.dtype)`.
            let z = sd.round(self.zero_point(r, gc, cell));
            let dst = &mut out[c0..c1];
            match l.kind {
                CtKind::PackedInt { bits, order, .. } => {
                    let off = 1i32 << (bits - 1);
                    for (i, o) in dst.iter_mut().enumerate() {
                        let q = unpack(row, c0 + i, bits, order) as i32 - off;
                        *o = sd.round(sd.round(q as f32 - z) * s);
                    }
                }
                CtKind::Int8 { .. } => {
                    for (o, &b) in dst.iter_mut().zip(&row[c0..c1]) {
                        *o = sd.round(sd.round(b as i8 as f32 - z) * s);
                    }
                }
                CtKind::Fp8 { .. } => {
                    for (o, &b) in dst.iter_mut().zip(&row[c0..c1]) {
                        // fp8 → scale dtype is exact (4 significant bits).
                        *o = sd.round(fp8_e4m3_to_f32(b) * s);
                    }
                }
            }
            c0 = c1;
            gc += 1;
        }
    }

    /// The 16-bit scale dtype of a 4-bit pack-quantized matrix whose scale runs cover whole
    /// 32-column chunks (group a multiple of 32, or one scale per row or tensor with a
    /// multiple of 32 columns), else `None`: the matrices [`CtMatrix::int4_chunk`] serves (the
    /// CUDA backend keeps them packed).
    pub fn int4_chunked(&self) -> Option<ScaleDtype> {
        let l = &self.layout;
        let CtKind::PackedInt { bits: 4, .. } = l.kind else {
            return None;
        };
        let whole = match l.kind.strategy() {
            CtStrategy::Group(g) => g.is_multiple_of(32) && l.cols.is_multiple_of(32),
            CtStrategy::Channel | CtStrategy::Tensor => l.cols.is_multiple_of(32),
            CtStrategy::Block { .. } => false,
        };
        match l.scale_dtype {
            ScaleDtype::Bf16 | ScaleDtype::F16 if whole => Some(l.scale_dtype),
            _ => None,
        }
    }

    /// Chunk `c` (columns `32c .. 32c + 32`) of row `r` of an [`CtMatrix::int4_chunked`]
    /// matrix: the unsigned codes into `q`, and the chunk's raw scale bits (in the scale dtype)
    /// and rounded zero point, so that element `i` is `sd.round(sd.round((q[i] − 8) − z) · s)`,
    /// exactly as [`CtMatrix::dequant_row`] decodes it.
    pub fn int4_chunk(&self, r: usize, c: usize, q: &mut [u8; 32]) -> (u16, f32) {
        for (k, &b) in self.int4_chunk_codes(r, c).iter().enumerate() {
            q[2 * k] = b & 0xF;
            q[2 * k + 1] = b >> 4;
        }
        self.int4_chunk_scale_zero(r, c)
    }

    /// The 16 packed bytes of chunk `c` of row `r` of an [`CtMatrix::int4_chunked`] matrix:
    /// element `32c + 2k` in the low nibble of byte `k`, `32c + 2k + 1` in its high nibble. At
    /// 4 bits both pack orders put element `i` at bit `4i` of the row's little-endian word
    /// stream (eight per word, none straddling), so these are the row's bytes `16c .. 16c + 16`.
    pub fn int4_chunk_codes(&self, r: usize, c: usize) -> &'a [u8] {
        let l = &self.layout;
        debug_assert!(self.int4_chunked().is_some() && r < l.rows && 32 * c < l.cols);
        let rb = l.weight_row_bytes();
        &self.weight[r * rb + 16 * c..r * rb + 16 * c + 16]
    }

    /// The raw scale bits (in the scale dtype) and rounded zero point of chunk `c` of row `r`
    /// of an [`CtMatrix::int4_chunked`] matrix.
    pub fn int4_chunk_scale_zero(&self, r: usize, c: usize) -> (u16, f32) {
        let (gc, cell) = self.int4_cell(r, c);
        let z = self.layout.scale_dtype.round(self.zero_point(r, gc, cell));
        (u16_le(self.scale, cell), z)
    }

    /// Whether every chunk's rounded zero point of an [`CtMatrix::int4_chunked`] matrix is an
    /// integer in `i8`'s range (what a packed form with an `i8` zero can hold). Symmetric and
    /// packed 4-bit zero points always are; plain (float) ones are checked one by one.
    pub fn int4_zeros_fit_i8(&self) -> bool {
        let l = &self.layout;
        if !matches!(l.zero, Some(ZeroPoint::Plain(_))) {
            return true;
        }
        (0..l.rows).all(|r| {
            (0..l.cols / 32).all(|c| {
                let (gc, cell) = self.int4_cell(r, c);
                let z = l.scale_dtype.round(self.zero_point(r, gc, cell));
                (-128.0..=127.0).contains(&z) && z == z as i8 as f32
            })
        })
    }

    /// The 16-bit scale dtype of an 8-bit integer matrix (pack-quantized 8-bit, W8A16; or
    /// int-quantized `I8`, W8A8) whose scale runs cover whole 32-column chunks (group a
    /// multiple of 32, one scale per row or tensor, or blocks a multiple of 32 columns wide,
    /// with a multiple of 32 columns), else `None`: the matrices [`CtMatrix::int8_chunk`]
    /// serves (the CUDA backend keeps them as 32-element blocks).
    pub fn int8_chunked(&self) -> Option<ScaleDtype> {
        let l = &self.layout;
        if !matches!(
            l.kind,
            CtKind::PackedInt { bits: 8, .. } | CtKind::Int8 { .. }
        ) {
            return None;
        }
        let whole = l.cols.is_multiple_of(32)
            && match l.kind.strategy() {
                CtStrategy::Group(g) => g.is_multiple_of(32),
                CtStrategy::Channel | CtStrategy::Tensor => true,
                CtStrategy::Block { cols, .. } => cols.is_multiple_of(32),
            };
        match l.scale_dtype {
            ScaleDtype::Bf16 | ScaleDtype::F16 if whole => Some(l.scale_dtype),
            _ => None,
        }
    }

    /// Chunk `c` (columns `32c .. 32c + 32`) of row `r` of an [`CtMatrix::int8_chunked`]
    /// matrix: the signed codes `q` (pack-quantized bytes less 128; `I8` bytes as they are),
    /// the chunk's raw scale bits (in the scale dtype) and its rounded zero point, so that
    /// element `i` is `sd.round(sd.round(q[i] − z) · s)`, exactly as
    /// [`CtMatrix::dequant_row`] decodes it.
    pub fn int8_chunk(&self, r: usize, c: usize) -> ([i8; 32], u16, f32) {
        let l = &self.layout;
        debug_assert!(self.int8_chunked().is_some() && r < l.rows && 32 * c < l.cols);
        let rb = l.weight_row_bytes();
        let bytes = &self.weight[r * rb + 32 * c..r * rb + 32 * c + 32];
        // Pack-quantized 8-bit: column c is byte c of the row's little-endian words, stored
        // + 128 (spec/formats.md §7.3).
        let off = if matches!(l.kind, CtKind::PackedInt { .. }) {
            0x80
        } else {
            0
        };
        let q = core::array::from_fn(|i| (bytes[i] ^ off) as i8);
        let (gc, cell) = self.chunk_cell(r, c);
        let z = l.scale_dtype.round(self.zero_point(r, gc, cell));
        (q, u16_le(self.scale, cell), z)
    }

    /// Whether every chunk's rounded zero point of an [`CtMatrix::int8_chunked`] matrix is an
    /// integer in `i8`'s range. Symmetric and packed 8-bit zero points always are (stored
    /// + 128 in a byte); plain (float) ones are checked one by one.
    pub fn int8_zeros_fit_i8(&self) -> bool {
        let l = &self.layout;
        if !matches!(l.zero, Some(ZeroPoint::Plain(_))) {
            return true;
        }
        (0..l.rows).all(|r| {
            (0..l.cols / 32).all(|c| {
                let (gc, cell) = self.chunk_cell(r, c);
                let z = l.scale_dtype.round(self.zero_point(r, gc, cell));
                (-128.0..=127.0).contains(&z) && z == z as i8 as f32
            })
        })
    }

    /// The scale column and grid cell of chunk `c` of row `r` for every strategy whose scale
    /// runs are whole chunks (the `int8_chunked` ones; blocks included).
    fn chunk_cell(&self, r: usize, c: usize) -> (usize, usize) {
        let l = &self.layout;
        let (_, grid_cols) = l.scale_grid();
        let (gc, grid_row) = match l.kind.strategy() {
            CtStrategy::Group(g) => (32 * c / g as usize, r),
            CtStrategy::Channel => (0, r),
            CtStrategy::Tensor => (0, 0),
            CtStrategy::Block { rows, cols } => (32 * c / cols as usize, r / rows as usize),
        };
        (gc, grid_row * grid_cols + gc)
    }

    /// The scale column and grid cell of chunk `c` of row `r` (an `int4_chunked` matrix).
    fn int4_cell(&self, r: usize, c: usize) -> (usize, usize) {
        let l = &self.layout;
        let (_, grid_cols) = l.scale_grid();
        let (gc, grid_row) = match l.kind.strategy() {
            CtStrategy::Group(g) => (32 * c / g as usize, r),
            CtStrategy::Channel => (0, r),
            _ => (0, 0),
        };
        (gc, grid_row * grid_cols + gc)
    }

    /// Signed zero point of row `r`, scale column `gc` (grid cell `cell`); 0 if symmetric.
    fn zero_point(&self, r: usize, gc: usize, cell: usize) -> f32 {
        let l = &self.layout;
        match (l.zero, l.kind) {
            (None, _) => 0.0,
            (Some(ZeroPoint::Plain(t)), _) => {
                let cell = if l.kind.strategy() == CtStrategy::Tensor {
                    0
                } else {
                    cell
                };
                t.load(self.zero, cell)
            }
            (Some(ZeroPoint::Packed), CtKind::PackedInt { bits, order, .. }) => {
                let (_, grid_cols) = l.scale_grid();
                (unpack_strided(self.zero, gc, grid_cols, r, bits, order) as i32
                    - (1i32 << (bits - 1))) as f32
            }
            (Some(ZeroPoint::Packed), _) => 0.0,
        }
    }
}

/// Unsigned code of element `c` of a packed row (little-endian int32 words).
#[inline]
fn unpack(row: &[u8], c: usize, bits: u8, order: PackOrder) -> u32 {
    unpack_strided(row, 0, 1, c, bits, order)
}

/// Unsigned code of element `i` of the packed stream whose word `k` is the int32 at index
/// `k·stride + col` of `words` (stride 1 for a weight row; the zero-point tensor's column).
#[inline]
fn unpack_strided(
    words: &[u8],
    col: usize,
    stride: usize,
    i: usize,
    bits: u8,
    order: PackOrder,
) -> u32 {
    let b = bits as usize;
    let mask = (1u64 << b) - 1;
    let word = |k: usize| u32_le(words, k * stride + col) as u64;
    match order {
        PackOrder::Dense => {
            let bit = i * b;
            let (k, sh) = (bit / 32, bit % 32);
            let mut v = word(k) >> sh;
            if sh + b > 32 {
                v |= word(k + 1) << (32 - sh);
            }
            (v & mask) as u32
        }
        PackOrder::PerWord => {
            let per = 32 / b;
            ((word(i / per) >> (b * (i % per))) & mask) as u32
        }
    }
}

/// Decodes an FP8 E4M3 (`torch.float8_e4m3fn`) byte exactly: sign, 4 exponent bits (bias 7),
/// 3 mantissa bits; exponent 0 is subnormal (`M·2⁻⁹`); `S.1111.111` (0x7F, 0xFF) is NaN; no
/// infinities (max ±448).
#[inline]
pub fn fp8_e4m3_to_f32(b: u8) -> f32 {
    let sign = ((b & 0x80) as u32) << 24;
    let e = ((b >> 3) & 0xF) as u32;
    let m = (b & 7) as u32;
    if e == 0xF && m == 7 {
        return f32::from_bits(sign | 0x7FC0_0000);
    }
    if e == 0 {
        // m · 2^-9, exact in f32.
        let v = m as f32 * (1.0 / 512.0);
        return f32::from_bits(sign | v.to_bits());
    }
    // (1 + m/8) · 2^(e−7): f32 exponent field e − 7 + 127, mantissa m in its top 3 bits.
    f32::from_bits(sign | ((e + 120) << 23) | (m << 20))
}

#[inline]
fn u16_le(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[2 * i], b[2 * i + 1]])
}

#[inline]
fn u32_le(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

#[inline]
fn f32_le(b: &[u8], i: usize) -> f32 {
    f32::from_bits(u32_le(b, i))
}

#[inline]
fn bf16_le(b: &[u8], i: usize) -> f32 {
    f32::from_bits((u16_le(b, i) as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_known_values() {
        assert_eq!(fp8_e4m3_to_f32(0x00), 0.0);
        assert!(fp8_e4m3_to_f32(0x80).is_sign_negative());
        assert_eq!(fp8_e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(fp8_e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(fp8_e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(fp8_e4m3_to_f32(0x38), 1.0);
        assert_eq!(fp8_e4m3_to_f32(0x7E), 448.0);
        assert_eq!(fp8_e4m3_to_f32(0xFE), -448.0);
        assert!(fp8_e4m3_to_f32(0x7F).is_nan());
        assert!(fp8_e4m3_to_f32(0xFF).is_nan());
        assert_eq!(fp8_e4m3_to_f32(0x78), 256.0);
    }

    #[test]
    fn dense_and_perword_agree_for_divisors_of_32() {
        let words: [u8; 8] = [0x21, 0x43, 0x65, 0x87, 0xA9, 0xCB, 0xED, 0x0F];
        for bits in [1u8, 2, 4, 8] {
            for c in 0..(64 / bits as usize) {
                assert_eq!(
                    unpack(&words, c, bits, PackOrder::Dense),
                    unpack(&words, c, bits, PackOrder::PerWord)
                );
            }
        }
        // 4-bit: column c is nibble c of the little-endian byte stream, low nibble first.
        assert_eq!(unpack(&words, 0, 4, PackOrder::Dense), 1);
        assert_eq!(unpack(&words, 1, 4, PackOrder::Dense), 2);
        assert_eq!(unpack(&words, 15, 4, PackOrder::Dense), 0);
        assert_eq!(unpack(&words, 14, 4, PackOrder::Dense), 0xF);
    }

    /// Scales near 0.01 in the layout's scale dtype (f16 or bf16 bits).
    #[cfg(feature = "alloc")]
    fn test_scales(layout: &CtLayout) -> alloc::vec::Vec<u8> {
        (0..layout.scale_bytes() / 2)
            .flat_map(|i| {
                let v = 0.004 + 0.001 * (i % 13) as f32;
                match layout.scale_dtype {
                    ScaleDtype::F16 => half::f16::from_f32(v).to_bits().to_le_bytes(),
                    _ => half::bf16::from_f32(v).to_bits().to_le_bytes(),
                }
            })
            .collect()
    }

    /// The value of 16-bit scale bits `sb` in `sd`.
    #[cfg(feature = "alloc")]
    fn scale_value(sd: ScaleDtype, sb: u16) -> f32 {
        match sd {
            ScaleDtype::F16 => half::f16::from_bits(sb).to_f32(),
            _ => half::bf16::from_bits(sb).to_f32(),
        }
    }

    #[cfg(feature = "alloc")]
    /// `int4_chunk` reproduces `dequant_row` element for element (group 64 and channel,
    /// symmetric and with packed zero points, bf16 and f16 scales).
    #[test]
    fn int4_chunks_decode_as_dequant_row() {
        let (rows, cols) = (16usize, 128usize);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut byte = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        };
        for (strategy, symmetric, sd) in [
            (CtStrategy::Group(64), true, ScaleDtype::Bf16),
            (CtStrategy::Group(64), false, ScaleDtype::F16),
            (CtStrategy::Channel, false, ScaleDtype::Bf16),
        ] {
            let layout = CtLayout {
                kind: CtKind::packed_int(4, strategy, symmetric, PackOrder::Dense),
                rows,
                cols,
                scale_dtype: sd,
                zero: (!symmetric).then_some(ZeroPoint::Packed),
            };
            let weight: alloc::vec::Vec<u8> = (0..layout.weight_bytes()).map(|_| byte()).collect();
            let scale = test_scales(&layout);
            let zero: alloc::vec::Vec<u8> = (0..layout.zero_bytes()).map(|_| byte()).collect();
            let m = CtMatrix::new(layout, &weight, &scale, &zero).unwrap();
            assert_eq!(m.int4_chunked(), Some(sd));
            let mut row = [0.0f32; 128];
            let mut q = [0u8; 32];
            for r in 0..rows {
                m.dequant_row(r, &mut row);
                for c in 0..cols / 32 {
                    let (sb, z) = m.int4_chunk(r, c, &mut q);
                    let s = scale_value(sd, sb);
                    for i in 0..32 {
                        let want = sd.round(sd.round((q[i] as i32 - 8) as f32 - z) * s);
                        assert_eq!(
                            want.to_bits(),
                            row[32 * c + i].to_bits(),
                            "{strategy:?} r{r} c{c} i{i}"
                        );
                    }
                }
            }
        }
    }

    #[cfg(feature = "alloc")]
    /// `int8_chunk` reproduces `dequant_row` element for element: pack-quantized 8-bit (W8A16,
    /// group 64 and channel, packed zero points) and int-quantized `I8` (W8A8: channel,
    /// tensor, 64×64 blocks, plain zero points), bf16 and f16 scales.
    #[test]
    fn int8_chunks_decode_as_dequant_row() {
        let (rows, cols) = (80usize, 128usize);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut byte = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        };
        let packed = |st, sym| CtKind::packed_int(8, st, sym, PackOrder::Dense);
        let i8k = |strategy, symmetric| CtKind::Int8 {
            symmetric,
            strategy,
        };
        for (kind, sd, zero) in [
            (packed(CtStrategy::Group(64), true), ScaleDtype::Bf16, None),
            (
                packed(CtStrategy::Group(64), false),
                ScaleDtype::F16,
                Some(ZeroPoint::Packed),
            ),
            (packed(CtStrategy::Channel, true), ScaleDtype::Bf16, None),
            (i8k(CtStrategy::Channel, true), ScaleDtype::Bf16, None),
            (i8k(CtStrategy::Tensor, true), ScaleDtype::F16, None),
            (
                i8k(CtStrategy::Block { rows: 64, cols: 64 }, true),
                ScaleDtype::Bf16,
                None,
            ),
            (
                i8k(CtStrategy::Channel, false),
                ScaleDtype::Bf16,
                Some(ZeroPoint::Plain(ZpDtype::I8)),
            ),
        ] {
            let layout = CtLayout {
                kind,
                rows,
                cols,
                scale_dtype: sd,
                zero,
            };
            let weight: alloc::vec::Vec<u8> = (0..layout.weight_bytes()).map(|_| byte()).collect();
            let scale = test_scales(&layout);
            let zero: alloc::vec::Vec<u8> = (0..layout.zero_bytes()).map(|_| byte()).collect();
            let m = CtMatrix::new(layout, &weight, &scale, &zero).unwrap();
            assert_eq!(m.int8_chunked(), Some(sd), "{kind}");
            assert_eq!(m.int4_chunked(), None);
            assert!(m.int8_zeros_fit_i8(), "{kind}");
            let mut row = [0.0f32; 128];
            for r in 0..rows {
                m.dequant_row(r, &mut row);
                for c in 0..cols / 32 {
                    let (q, sb, z) = m.int8_chunk(r, c);
                    let s = scale_value(sd, sb);
                    for i in 0..32 {
                        let want = sd.round(sd.round(q[i] as f32 - z) * s);
                        assert_eq!(
                            want.to_bits(),
                            row[32 * c + i].to_bits(),
                            "{kind} r{r} c{c} i{i}"
                        );
                    }
                }
            }
        }
        // Not chunked: 4-bit, FP8, f32 scales, groups that are not whole chunks.
        let not = |kind, sd| CtLayout {
            kind,
            rows: 2,
            cols: 64,
            scale_dtype: sd,
            zero: None,
        };
        for l in [
            not(
                CtKind::packed_int(4, CtStrategy::Group(32), true, PackOrder::Dense),
                ScaleDtype::Bf16,
            ),
            not(
                CtKind::Fp8 {
                    strategy: CtStrategy::Channel,
                },
                ScaleDtype::Bf16,
            ),
            not(i8k(CtStrategy::Channel, true), ScaleDtype::F32),
            not(i8k(CtStrategy::Group(16), true), ScaleDtype::Bf16),
        ] {
            let (w, s) = (
                alloc::vec![0u8; l.weight_bytes()],
                alloc::vec![0u8; l.scale_bytes()],
            );
            assert_eq!(
                CtMatrix::new(l, &w, &s, &[]).unwrap().int8_chunked(),
                None,
                "{}",
                l.kind
            );
        }
    }

    #[test]
    fn int4_zeros_fit_i8_checks_plain_zero_points() {
        // Group 32, asymmetric, plain u8 zero points: 2 rows × 2 chunks.
        let layout = CtLayout {
            kind: CtKind::packed_int(4, CtStrategy::Group(32), false, PackOrder::Dense),
            rows: 2,
            cols: 64,
            scale_dtype: ScaleDtype::Bf16,
            zero: Some(ZeroPoint::Plain(ZpDtype::U8)),
        };
        let weight = alloc::vec![0u8; layout.weight_bytes()];
        let scale = alloc::vec![0u8; layout.scale_bytes()];
        let mut zero = alloc::vec![5u8; layout.zero_bytes()];
        let m = CtMatrix::new(layout, &weight, &scale, &zero).unwrap();
        assert!(m.int4_zeros_fit_i8());
        // One chunk's zero point past i8's range.
        *zero.last_mut().unwrap() = 200;
        let m = CtMatrix::new(layout, &weight, &scale, &zero).unwrap();
        assert!(!m.int4_zeros_fit_i8());
        // Packed and absent zero points always fit.
        let mut sym = layout;
        sym.kind = CtKind::packed_int(4, CtStrategy::Group(32), true, PackOrder::Dense);
        sym.zero = None;
        assert!(
            CtMatrix::new(sym, &weight, &scale, &[])
                .unwrap()
                .int4_zeros_fit_i8()
        );
    }

    #[test]
    fn dense_3bit_straddles_words() {
        // Element 10 of a 3-bit stream occupies bits 30..33: two bits in word 0, one in word 1.
        let w0: u32 = 0b10 << 30;
        let w1: u32 = 0b1;
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&w0.to_le_bytes());
        b[4..].copy_from_slice(&w1.to_le_bytes());
        assert_eq!(unpack(&b, 10, 3, PackOrder::Dense), 0b110);
        assert_eq!(unpack(&b, 10, 3, PackOrder::PerWord), 0b001);
    }

    #[test]
    fn layout_checks() {
        let mut l = CtLayout {
            kind: CtKind::packed_int(4, CtStrategy::Group(32), true, PackOrder::Dense),
            rows: 16,
            cols: 64,
            scale_dtype: ScaleDtype::Bf16,
            zero: None,
        };
        assert_eq!(l.check(), Ok(()));
        assert_eq!(l.weight_bytes(), 16 * 8 * 4);
        assert_eq!(l.scale_bytes(), 16 * 2 * 2);
        l.zero = Some(ZeroPoint::Packed);
        assert!(l.check().is_err());
        l.kind = CtKind::packed_int(4, CtStrategy::Group(32), false, PackOrder::Dense);
        assert_eq!(l.check(), Ok(()));
        assert_eq!(l.zero_shape(), Some((2, 2)));
        l.kind = CtKind::packed_int(9, CtStrategy::Channel, false, PackOrder::Dense);
        assert_eq!(l.check(), Err(CtError::Bits { bits: 9 }));
    }

    #[cfg(feature = "alloc")]
    #[test]
    fn kind_names() {
        let k = CtKind::packed_int(4, CtStrategy::Group(32), true, PackOrder::PerWord);
        assert_eq!(alloc::format!("{k}"), "ct-int4-g32");
        let k = CtKind::Fp8 {
            strategy: CtStrategy::Block {
                rows: 128,
                cols: 128,
            },
        };
        assert_eq!(alloc::format!("{k}"), "ct-fp8-b128x128");
        let k = CtKind::Int8 {
            symmetric: false,
            strategy: CtStrategy::Tensor,
        };
        assert_eq!(alloc::format!("{k}"), "ct-i8-t-asym");
    }
}
