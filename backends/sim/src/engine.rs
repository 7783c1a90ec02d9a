//! Engine operations in flight: a copy (class 0x90b5) or a compute kernel (class 0x90c0) that
//! reads and writes memory piece by piece while the clock passes through its modeled duration.
//!
//! A launch only validates its arguments and builds an [`EngineOp`] that captures the address
//! space ([`Vspace`]) and instance word of the context that launched it; every later access goes
//! through that captured context, as the hardware keeps using the context it loaded until the
//! engine idles or is reset. The operation is cut into pieces ([`Job`]): 64 KiB of one line of a
//! copy, 64 KiB of a memset, 16 Ki elements of an element-wise kernel, 64 KiB of a matrix
//! kernel's `b` operand loaded, then a block of about 64 Ki multiply-adds of one result row (a
//! row of a 1024x1024 product is 16 pieces), the single result word of `loop`. Small pieces
//! bound how long one piece holds the simulator's lock (`crate::worker`).
//!
//! **Duration.** The cost model charges memory traffic by target (VRAM or PCIe), so before the
//! first piece runs the operation is *scanned*: every piece's address ranges are translated
//! (through the TLB when it holds the page, else by a walk that is neither cached nor counted)
//! and the bytes tallied per target, exactly the traffic the pieces will cause when nothing
//! changes under them. Duration = `CostModel::copy` / `kernel` / `loop_kernel` of that, the same
//! number the simulator computed when it did all the work at launch. A page that does not
//! translate at scan time is tallied as VRAM (MODEL); the fault itself is raised when its piece is
//! reached.
//!
//! **Pieces over time.** With [`EngineWrites::OverDuration`] piece `i` of `n` is due at
//! `start + duration * (i + 1) / n` (the last one at the end); with [`EngineWrites::AtLaunch`] all
//! are due at `start` (the old behaviour, kept for comparison). A piece runs at the first
//! simulator call at or after its due time.
//!
//! **Budget.** Every [`super::SimGpu`] method call may do at most [`WORK_BUDGET`] units of engine
//! work (scanning included); what is due beyond that is done by later calls, and
//! `next_event_ns()` says "now" meanwhile. The budget changes no modeled time: due times,
//! durations and busy accounting are fixed at launch.

use std::sync::Arc;

use zerocopy::IntoBytes;

use gf100::compute::{self as cc, Kernel};
use gf100::{fault, host, Target};

use super::budget::{Budget, WORK_BUDGET};
use super::completion::CopyDone;
use super::mem::Traffic;
use super::mmu::{page_piece, VaFault, Vspace};
use super::Core;

/// How engine operations perform their memory accesses over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineWrites {
    /// Pieces land progressively as the clock passes through the operation's duration; all are
    /// done by its end (the default; how hardware behaves).
    #[default]
    OverDuration,
    /// Every piece is due at launch (the simulator's earlier behaviour); still bounded per call.
    AtLaunch,
}

/// Fixed units charged per piece (bounds the number of tiny pieces per call).
const PIECE_UNITS: u64 = 64;
/// Units charged per page translated while scanning an operation.
const SCAN_PAGE_UNITS: u64 = 64;

/// Bytes per piece of a copy line or a memset.
pub(crate) const STAGE: u64 = 64 * 1024;
/// Elements per piece of the element-wise kernels.
const ELEMS: u64 = 16 * 1024;

/// A pitch copy of `lines` lines of `len` bytes, as launched (copy engine or M2MF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CopyPlan {
    pub src: u64,
    pub dst: u64,
    pub pitch_in: u64,
    pub pitch_out: u64,
    pub len: u64,
    pub lines: u64,
}

impl CopyPlan {
    /// Bytes the transfer moves.
    pub(crate) fn bytes(&self) -> u64 {
        self.len * self.lines
    }

    /// The engine job that performs it. Lines that follow each other on both sides (each
    /// pitch equal to the length) and whose source and destination ranges do not overlap are
    /// one line: it moves in [`STAGE`]-byte pieces instead of a piece per line (a driver copies
    /// whole pages as page-long lines — nouveau and gpuvm's own driver — and a piece each cost
    /// the engine more than the bytes did). Overlapping ranges keep their lines, each read
    /// before it is written as before. The bytes moved and the modeled duration do not change;
    /// only how finely the copy lands over that duration.
    pub(crate) fn job(self) -> Job {
        let total = self.len.saturating_mul(self.lines);
        // Neither range wraps around the address space, and one ends before the other starts.
        let apart = match (self.src.checked_add(total), self.dst.checked_add(total)) {
            (Some(src_end), Some(dst_end)) => src_end <= self.dst || dst_end <= self.src,
            _ => false,
        };
        let contiguous = self.pitch_in == self.len && self.pitch_out == self.len;
        if self.lines > 1 && contiguous && apart {
            return Job::Copy(CopyPlan {
                pitch_in: total,
                pitch_out: total,
                len: total,
                lines: 1,
                ..self
            });
        }
        Job::Copy(self)
    }
}

/// What an operation does, cut into pieces.
#[derive(Debug)]
pub(crate) enum Job {
    /// A pitch copy ([`CopyPlan::job`]).
    Copy(CopyPlan),
    /// `bytes` bytes of the repeated `value` at `dst`.
    Memset { dst: u64, bytes: u64, value: u32 },
    /// `c[i] = op(a[i], b[i])` for `n` words; `float` selects f32 add over wrapping u32 add.
    Elementwise { abc: [u64; 3], n: u64, float: bool },
    /// `c = a x b` for `n`x`n` matrices: first `b` is loaded (kept) in pieces of 64 KiB, then each result row is computed in blocks of columns; a row of `a` is read by
    /// its row's first block and kept for the others.
    Matmul {
        abc: [u64; 3],
        n: u64,
        float: bool,
        b: Arc<Vec<u32>>,
        row_a: Arc<Vec<u32>>,
    },
    /// The closed-form result of `loop` written at `dst`.
    Loop { dst: u64, value: u32 },
}

impl Job {
    /// The job of a compute kernel.
    pub(crate) fn kernel(k: &Kernel) -> Job {
        match *k {
            Kernel::Memset { dst, bytes, value } => Job::Memset {
                dst,
                bytes: bytes as u64,
                value,
            },
            Kernel::Madd { a, b, c, n } | Kernel::Fmadd { a, b, c, n } => Job::Elementwise {
                abc: [a, b, c],
                n: n as u64,
                float: matches!(k, Kernel::Fmadd { .. }),
            },
            Kernel::Mmul { a, b, c, n } | Kernel::Fmmul { a, b, c, n } => Job::Matmul {
                abc: [a, b, c],
                n: n as u64,
                float: matches!(k, Kernel::Fmmul { .. }),
                b: Arc::default(),
                row_a: Arc::default(),
            },
            Kernel::Loop {
                dst,
                iterations,
                seed,
            } => Job::Loop {
                dst,
                value: cc::loop_result(seed, iterations),
            },
        }
    }

    /// Number of pieces.
    fn pieces(&self) -> u64 {
        match *self {
            Job::Copy(CopyPlan { len, lines, .. }) => lines * len.div_ceil(STAGE),
            Job::Memset { bytes, .. } => bytes.div_ceil(STAGE),
            Job::Elementwise { n, .. } => n.div_ceil(ELEMS),
            Job::Matmul { n, .. } => {
                let m = MatmulPieces::new(n);
                m.loads + n.div_ceil(m.rows_per_block) * m.blocks
            }
            Job::Loop { .. } => 1,
        }
    }

    /// The (va, bytes) ranges piece `i` reads or writes, in access order.
    fn ranges(&self, i: u64, out: &mut Vec<(u64, u64)>) {
        out.clear();
        match *self {
            Job::Copy(CopyPlan {
                src,
                dst,
                pitch_in,
                pitch_out,
                len,
                ..
            }) => {
                let per_line = len.div_ceil(STAGE);
                let (line, off) = (i / per_line, i % per_line * STAGE);
                let n = (len - off).min(STAGE);
                out.push((src.wrapping_add(line * pitch_in).wrapping_add(off), n));
                out.push((dst.wrapping_add(line * pitch_out).wrapping_add(off), n));
            }
            Job::Memset { dst, bytes, .. } => {
                let off = i * STAGE;
                out.push((dst.wrapping_add(off), (bytes - off).min(STAGE)));
            }
            Job::Elementwise { abc, n, .. } => {
                let (off, m) = (i * ELEMS, (n - i * ELEMS).min(ELEMS));
                for base in abc {
                    out.push((base.wrapping_add(off * 4), m * 4));
                }
            }
            Job::Matmul {
                abc: [a, b, c], n, ..
            } => {
                let row = n * 4;
                match MatmulPieces::new(n).piece(i) {
                    MatmulPiece::Load { rows } => out.push((
                        b.wrapping_add(rows.start * row),
                        (rows.end - rows.start) * row,
                    )),
                    MatmulPiece::Block { rows, cols } => {
                        let count = rows.end - rows.start;
                        if cols.start == 0 {
                            out.push((a.wrapping_add(rows.start * row), count * row));
                        }
                        // Several rows only when a block spans whole rows: one contiguous
                        // range of `c`.
                        out.push((
                            c.wrapping_add(rows.start * row + cols.start * 4),
                            (count - 1) * row + (cols.end - cols.start) * 4,
                        ));
                    }
                }
            }
            Job::Loop { dst, .. } => out.push((dst, 4)),
        }
    }

    /// Units of work of piece `i`.
    fn units(&self, i: u64) -> u64 {
        PIECE_UNITS
            + match *self {
                Job::Copy(CopyPlan { len, .. }) => {
                    (len - i % len.div_ceil(STAGE) * STAGE).min(STAGE) / 4
                }
                Job::Memset { bytes, .. } => (bytes - i * STAGE).min(STAGE) / 4,
                Job::Elementwise { n, .. } => (n - i * ELEMS).min(ELEMS),
                // A load: its words; a block: n multiply-adds per column of each of its rows
                // (the rows' first block also reads the rows of `a`).
                Job::Matmul { n, .. } => match MatmulPieces::new(n).piece(i) {
                    MatmulPiece::Load { rows } => (rows.end - rows.start) * n,
                    MatmulPiece::Block { rows, cols } => {
                        (rows.end - rows.start)
                            * ((cols.end - cols.start) * n + if cols.start == 0 { n } else { 0 })
                    }
                },
                Job::Loop { .. } => 1,
            }
    }

    /// Performs piece `i` in `vs`. A fault stops the piece where it happened.
    fn run(&mut self, i: u64, core: &mut Core, vs: &Vspace) -> Result<(), VaFault> {
        let mut r = Vec::with_capacity(3);
        self.ranges(i, &mut r);
        match self {
            Job::Copy(_) => {
                let (src, n) = r[0];
                // The scratch's staging holds the last copy's bytes, possibly another VM's;
                // `copy_va` reads the whole source into it before writing any of it (memory,
                // or zeros or all-ones where nothing answers), and a source fault writes
                // nothing.
                let mut scratch = std::mem::take(&mut core.copy_scratch);
                let copied = core.copy_va(vs, src, r[1].0, n as usize, &mut scratch);
                core.copy_scratch = scratch;
                copied
            }
            Job::Memset { value, .. } => {
                let (dst, n) = r[0];
                // Whole words: a memset's size is a multiple of four (`Kernel::decode`), and so
                // is every piece of it.
                let data = value.to_le_bytes().repeat(n as usize / 4);
                core.write_va(vs, dst, &data)
            }
            Job::Elementwise { float, .. } => {
                let x = read_words(core, vs, r[0].0, r[0].1 as usize / 4)?;
                let y = read_words(core, vs, r[1].0, r[1].1 as usize / 4)?;
                let mut out = vec![0u8; x.len().min(y.len()) * 4];
                for ((o, &x), &y) in out.chunks_exact_mut(4).zip(&x).zip(&y) {
                    let w = if *float {
                        (f32::from_bits(x) + f32::from_bits(y)).to_bits()
                    } else {
                        x.wrapping_add(y)
                    };
                    o.copy_from_slice(&w.to_le_bytes());
                }
                core.write_va(vs, r[2].0, &out)
            }
            Job::Matmul { .. } => match self.gather(i, core, vs)? {
                Some(block) => core.write_va(vs, block.dst, &block.compute()),
                None => Ok(()),
            },
            Job::Loop { dst, value } => core.write_va(vs, *dst, &value.to_le_bytes()),
        }
    }

    /// The memory reads of piece `i` of a matrix kernel: a load of `b` is done entirely; a
    /// block of a result row reads its row of `a` (if first in its row) and returns what is left
    /// to do, a computation on data already read (`None` for a load or another job).
    fn gather(
        &mut self,
        i: u64,
        core: &mut Core,
        vs: &Vspace,
    ) -> Result<Option<MatmulBlock>, VaFault> {
        let mut r = Vec::with_capacity(3);
        self.ranges(i, &mut r);
        let Job::Matmul {
            n, float, b, row_a, ..
        } = self
        else {
            return Ok(None);
        };
        let n64 = *n;
        let n = n64 as usize;
        match MatmulPieces::new(n64).piece(i) {
            MatmulPiece::Load { rows } => {
                // `b` kept as it is in memory, row by row: a block then walks rows of it
                // contiguously (no transposition: each load touches only its own rows).
                if rows.start == 0 {
                    let mut stage = std::mem::take(&mut core.matmul_stage);
                    stage.clear();
                    stage.reserve(n * n);
                    *b = Arc::new(stage);
                }
                read_words_into(core, vs, r[0].0, r[0].1 as usize / 4, Arc::make_mut(b))?;
                Ok(None)
            }
            MatmulPiece::Block { rows, cols } => {
                if cols.start == 0 {
                    let count = (rows.end - rows.start) as usize;
                    *row_a = Arc::new(read_words(core, vs, r[0].0, count * n)?);
                }
                Ok(Some(MatmulBlock {
                    n,
                    float: *float,
                    b: b.clone(),
                    row_a: row_a.clone(),
                    cols: cols.start as usize..cols.end as usize,
                    dst: r[r.len() - 1].0,
                }))
            }
        }
    }

    /// Modeled duration of the whole job given the traffic it causes.
    fn duration(&self, core: &Core, traffic: Traffic) -> u64 {
        let cost = &core.cost;
        match *self {
            Job::Copy(_) => cost.copy(traffic),
            Job::Memset { .. } => cost.kernel(traffic, 0, 0),
            Job::Elementwise { n, float, .. } => {
                let ops = n as u128;
                cost.kernel(
                    traffic,
                    if float { ops } else { 0 },
                    if float { 0 } else { ops },
                )
            }
            Job::Matmul { n, float, .. } => {
                let ops = 2 * (n as u128).pow(3);
                cost.kernel(
                    traffic,
                    if float { ops } else { 0 },
                    if float { 0 } else { ops },
                )
            }
            Job::Loop { .. } => 0,
        }
    }
}

/// Multiply-adds in one block of a matrix kernel's result row (MODEL choice: ~50 us of host
/// CPU, so that one piece never holds the simulator's lock long).
const MATMUL_BLOCK_MACS: u64 = 64 * 1024;

/// A block of a matrix kernel's result row, its operands read: pure computation, which the
/// engine worker does outside the simulator's lock (`crate::worker`).
#[derive(Debug)]
pub(crate) struct MatmulBlock {
    n: usize,
    float: bool,
    b: Arc<Vec<u32>>,
    row_a: Arc<Vec<u32>>,
    cols: std::ops::Range<usize>,
    /// Where the block's results go (GPU VA).
    dst: u64,
}

impl MatmulBlock {
    /// The block's results, as little-endian words in memory. Each result sums `k` in increasing
    /// order with a separate multiply and add (`fmmul` results are bit-exact and reproducible).
    pub(crate) fn compute(&self) -> BlockResults {
        let (c0, c1) = (self.cols.start, self.cols.end);
        let n = self.n.max(1);
        let mut words = vec![0u32; self.row_a.len() / n * c1.saturating_sub(c0)];
        // Every load of `b` precedes the kernel's blocks and a fault in one ends the kernel, so
        // `b` is whole and the columns lie within a row; were it otherwise the block would
        // give zeros rather than index out of bounds on the GPU's thread.
        let (Some(b), true) = (self.b.get(..n * n), c0 <= c1 && c1 <= n) else {
            return BlockResults::new(words);
        };
        if self.float {
            matmul_block_f32(n, b, &self.row_a, c0, c1, &mut words);
        } else {
            matmul_block_u32(n, b, &self.row_a, c0, c1, &mut words);
        }
        BlockResults::new(words)
    }
}

/// A block's results as GPU memory holds them: little-endian words, whose bytes
/// ([`std::ops::Deref`]) are written as they are — no copy into a byte buffer.
#[derive(Debug)]
pub(crate) struct BlockResults(Vec<u32>);

impl BlockResults {
    /// `words` (host order) made little-endian in place (nothing to do on a little-endian host).
    fn new(mut words: Vec<u32>) -> BlockResults {
        for w in &mut words {
            *w = w.to_le();
        }
        BlockResults(words)
    }
}

impl std::ops::Deref for BlockResults {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

// The loops below are compiled for the host's vector units too and picked at run time
// (`multiversion`: AVX2 has an 8-lane 32-bit multiply, the x86-64 baseline none); the result
// is the same bits either way (each sum in the same order, no fused multiply-add), except which
// NaN a NaN result is (not specified for `f32`; vector code may commute an add's operands).

/// Columns `c0..c1` of the rows `row_a` (each `n` words) times the `n`x`n` matrix `b`
/// (row-major), wrapping `u32`, into `out` (row-major, `c1 - c0` words a row).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512cd+avx512dq+avx512vl",
    "x86_64+avx2",
    "x86_64+sse4.1"
))]
fn matmul_block_u32(n: usize, b: &[u32], row_a: &[u32], c0: usize, c1: usize, out: &mut [u32]) {
    matmul_block(
        Operands { n, b, row_a },
        c0..c1,
        out,
        0u32,
        |acc: u32, a: u32, b: u32| acc.wrapping_add(a.wrapping_mul(b)),
        |v| v,
    );
}

/// [`matmul_block_u32`] for `f32` bit patterns: a separate multiply and add per term, `k` in
/// increasing order.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512cd+avx512dq+avx512vl",
    "x86_64+avx2",
    "x86_64+sse4.1"
))]
fn matmul_block_f32(n: usize, b: &[u32], row_a: &[u32], c0: usize, c1: usize, out: &mut [u32]) {
    matmul_block(
        Operands { n, b, row_a },
        c0..c1,
        out,
        0f32,
        |acc: f32, a: u32, b: u32| acc + f32::from_bits(a) * f32::from_bits(b),
        f32::to_bits,
    );
}

/// A block's operands: rows of `a` (`n` words each) and the whole `b`.
#[derive(Clone, Copy)]
struct Operands<'a> {
    n: usize,
    b: &'a [u32],
    row_a: &'a [u32],
}

impl Operands<'_> {
    fn row(&self, r: usize) -> &[u32] {
        &self.row_a[r * self.n..(r + 1) * self.n]
    }
}

/// Result columns a tile spans: with `TILE_ROWS` rows, its sums fill the vector registers of
/// AVX-512 (16 of 32) and are never stored until the tile ends.
const TILE_COLS: usize = 64;
/// Result rows a tile spans: each loaded vector of `b` serves this many rows.
const TILE_ROWS: usize = 4;

/// The block's results by tiles of [`TILE_ROWS`] x [`TILE_COLS`] (inlined into each
/// `multiversion` target, so compiled for its vector units); rows and columns left over are
/// summed one row at a time. `mac(acc, a, b)` is one term; every result sums `k` in increasing
/// order whichever path computes it.
#[inline(always)]
fn matmul_block<T: Copy>(
    ops: Operands<'_>,
    cols: std::ops::Range<usize>,
    out: &mut [u32],
    zero: T,
    mac: impl Fn(T, u32, u32) -> T + Copy,
    bits: impl Fn(T) -> u32 + Copy,
) {
    let n = ops.n;
    let width = cols.end - cols.start;
    let rows = ops.row_a.len() / n;
    let mut r = 0;
    while r < rows {
        let take = if rows - r >= TILE_ROWS { TILE_ROWS } else { 1 };
        let mut c = cols.start;
        while cols.end - c >= TILE_COLS {
            let at = r * width + (c - cols.start);
            if take == TILE_ROWS {
                let tile: [&[u32]; TILE_ROWS] = std::array::from_fn(|i| ops.row(r + i));
                matmul_tile(ops, tile, c, zero, mac, bits, &mut out[at..], width);
            } else {
                matmul_tile(ops, [ops.row(r)], c, zero, mac, bits, &mut out[at..], width);
            }
            c += TILE_COLS;
        }
        if c < cols.end {
            for i in 0..take {
                let mut acc = [zero; TILE_COLS];
                let acc = &mut acc[..cols.end - c];
                for (k, &a) in ops.row(r + i).iter().enumerate() {
                    let brow = &ops.b[k * n + c..k * n + cols.end];
                    for (o, &bv) in acc.iter_mut().zip(brow) {
                        *o = mac(*o, a, bv);
                    }
                }
                let at = (r + i) * width + (c - cols.start);
                for (o, &v) in out[at..at + acc.len()].iter_mut().zip(acc.iter()) {
                    *o = bits(v);
                }
            }
        }
        r += take;
    }
}

/// Columns `c..c + TILE_COLS` of the `R` rows `rows`, written at `out[i * stride + j]`: the
/// sums live in registers across the whole `k` loop, each row of `b` loaded once for all `R`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn matmul_tile<const R: usize, T: Copy>(
    ops: Operands<'_>,
    rows: [&[u32]; R],
    c: usize,
    zero: T,
    mac: impl Fn(T, u32, u32) -> T,
    bits: impl Fn(T) -> u32,
    out: &mut [u32],
    stride: usize,
) {
    let n = ops.n;
    let mut acc = [[zero; TILE_COLS]; R];
    for k in 0..n {
        let Ok(brow) = <&[u32; TILE_COLS]>::try_from(&ops.b[k * n + c..k * n + c + TILE_COLS])
        else {
            unreachable!("a slice of TILE_COLS words");
        };
        for (acc, row) in acc.iter_mut().zip(rows) {
            let a = row[k];
            for (o, &bv) in acc.iter_mut().zip(brow) {
                *o = mac(*o, a, bv);
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        for (o, &v) in out[i * stride..i * stride + TILE_COLS].iter_mut().zip(acc) {
            *o = bits(v);
        }
    }
}

/// A piece's computation taken out of the simulator's lock by the engine worker: the block,
/// and which operation and piece it belongs to (its results are written only if that
/// operation is still in flight at that piece).
#[derive(Debug)]
pub(crate) struct Offload {
    pub serial: u64,
    pub piece: u64,
    /// When the piece was due.
    pub due: u64,
    pub block: MatmulBlock,
}

/// How a matrix kernel of order `n` is cut: `loads` pieces loading `b`, then `blocks` pieces
/// per result row.
#[derive(Debug, Clone, Copy)]
struct MatmulPieces {
    n: u64,
    rows_per_load: u64,
    loads: u64,
    cols_per_block: u64,
    blocks: u64,
    /// Result rows per block: more than one only when a block spans whole rows (small `n`),
    /// so that a block is still about [`MATMUL_BLOCK_MACS`] of work.
    rows_per_block: u64,
}

/// One piece of a matrix kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MatmulPiece {
    /// Load rows `rows` of `b`.
    Load { rows: std::ops::Range<u64> },
    /// Compute columns `cols` of result rows `rows` (several rows only with every column).
    Block {
        rows: std::ops::Range<u64>,
        cols: std::ops::Range<u64>,
    },
}

impl MatmulPieces {
    fn new(n: u64) -> MatmulPieces {
        let n1 = n.max(1);
        let rows_per_load = (STAGE / (n1 * 4)).max(1);
        let cols_per_block = (MATMUL_BLOCK_MACS / n1).clamp(1, n1);
        let rows_per_block = if cols_per_block == n1 {
            (MATMUL_BLOCK_MACS / (n1 * n1)).clamp(1, n1)
        } else {
            1
        };
        MatmulPieces {
            rows_per_block,
            n,
            rows_per_load,
            loads: n.div_ceil(rows_per_load),
            cols_per_block,
            blocks: n.div_ceil(cols_per_block),
        }
    }

    fn piece(&self, i: u64) -> MatmulPiece {
        if i < self.loads {
            let start = i * self.rows_per_load;
            return MatmulPiece::Load {
                rows: start..(start + self.rows_per_load).min(self.n),
            };
        }
        let k = i - self.loads;
        let (group, blk) = (k / self.blocks, k % self.blocks);
        let (row, start) = (group * self.rows_per_block, blk * self.cols_per_block);
        MatmulPiece::Block {
            rows: row..(row + self.rows_per_block).min(self.n),
            cols: start..(start + self.cols_per_block).min(self.n),
        }
    }
}

fn read_words(core: &mut Core, vs: &Vspace, va: u64, count: usize) -> Result<Vec<u32>, VaFault> {
    let mut words = Vec::with_capacity(count);
    read_words_into(core, vs, va, count, &mut words)?;
    Ok(words)
}

/// Appends the `count` little-endian words at `va` to `out`, read straight into `out`'s new
/// (zeroed) words. Nothing is appended on a fault.
fn read_words_into(
    core: &mut Core,
    vs: &Vspace,
    va: u64,
    count: usize,
    out: &mut Vec<u32>,
) -> Result<(), VaFault> {
    let start = out.len();
    out.resize(start + count, 0);
    let read = core.read_va(vs, va, out[start..].as_mut_bytes());
    match read {
        Ok(()) => {
            // Little-endian in memory: nothing to do on a little-endian host.
            for w in &mut out[start..] {
                *w = u32::from_le(*w);
            }
        }
        Err(_) => out.truncate(start),
    }
    read
}

/// Where an operation stands after a call to [`EngineOp::progress`].
#[derive(Debug)]
pub(crate) enum Step {
    /// Every piece is done.
    Complete,
    /// The next piece is not due yet.
    Waiting,
    /// Work is due but this call's budget is used up.
    Deferred,
    /// The piece due at `at` faulted; the operation ends there.
    Fault { at: u64, fault: VaFault },
    /// The next piece's computation is for the caller to do outside the lock, then
    /// [`EngineOp::commit`] (the engine worker's matrix blocks).
    Offload(Offload),
}

/// An engine operation in flight.
#[derive(Debug)]
pub(crate) struct EngineOp {
    /// PFIFO engine index (`host::ENGINE_PCOPY0` or `host::ENGINE_PGRAPH`).
    pub engine: u32,
    /// The address space of the context that launched it.
    pub vspace: Vspace,
    /// The instance word (CHAN word, low 30 bits) of that context, for fault reports.
    pub inst_word: u32,
    /// The channel's binding generation at launch.
    pub epoch: u64,
    /// Which launch this is (set by PFIFO when it starts the operation).
    pub serial: u64,
    /// A copy's completion actions.
    pub done: Option<CopyDone>,
    /// Extra fixed duration (the `loop` kernel's closed-form time).
    fixed: Option<u64>,
    job: Job,
    pieces: u64,
    next: u64,
    scanned: u64,
    traffic: Traffic,
    duration: Option<u64>,
    /// (next piece, time by which one budget's worth of work is due) as last computed.
    horizon: Option<(u64, u64)>,
}

impl EngineOp {
    /// An operation of `job` run by `engine` in the captured context.
    pub(crate) fn new(
        engine: u32,
        job: Job,
        vspace: Vspace,
        inst_word: u32,
        epoch: u64,
        done: Option<CopyDone>,
    ) -> EngineOp {
        EngineOp {
            engine,
            vspace,
            inst_word,
            epoch,
            serial: 0,
            done,
            fixed: None,
            pieces: job.pieces(),
            job,
            next: 0,
            scanned: 0,
            traffic: Traffic::default(),
            duration: None,
            horizon: None,
        }
    }

    /// A compute kernel.
    pub(crate) fn kernel(
        core: &Core,
        k: &Kernel,
        vspace: Vspace,
        inst_word: u32,
        epoch: u64,
    ) -> EngineOp {
        let mut op = EngineOp::new(
            host::ENGINE_PGRAPH,
            Job::kernel(k),
            vspace,
            inst_word,
            epoch,
            None,
        );
        if let Kernel::Loop { iterations, .. } = *k {
            op.fixed = Some(core.cost.loop_kernel(iterations));
        }
        op
    }

    /// The modeled duration, once the scan is done.
    pub(crate) fn duration(&self) -> Option<u64> {
        self.duration
    }

    /// The traffic the launch-time scan predicted.
    #[cfg(test)]
    pub(crate) fn scanned_traffic(&self) -> Traffic {
        self.traffic
    }

    /// MMU fault unit, client and hub flag of this engine.
    pub(crate) fn fault_source(&self) -> (u32, u32, bool) {
        if self.engine == host::ENGINE_PCOPY0 {
            (fault::UNIT_PCOPY0, fault::HUB_CLIENT_PCOPY0, true)
        } else {
            (fault::UNIT_PGRAPH, fault::GPC_CLIENT_CTXCTL, false)
        }
    }

    /// When piece `i` is due.
    fn due(&self, i: u64, start: u64, mode: EngineWrites) -> u64 {
        let d = self.duration.unwrap_or(0);
        match mode {
            EngineWrites::AtLaunch => start,
            EngineWrites::OverDuration => {
                let part = (d as u128 * (i as u128 + 1)) / self.pieces.max(1) as u128;
                start.saturating_add(part as u64)
            }
        }
    }

    /// Scans what is left to scan within the budget; true when the duration is known.
    fn scan(&mut self, core: &mut Core, budget: &mut Budget) -> bool {
        let mut ranges = Vec::with_capacity(3);
        while self.scanned < self.pieces {
            self.job.ranges(self.scanned, &mut ranges);
            let pages: u64 = ranges
                .iter()
                .map(|&(va, len)| (va % 4096 + len).div_ceil(4096))
                .sum();
            if !budget.take(pages * SCAN_PAGE_UNITS) {
                return false;
            }
            for &(va, len) in &ranges {
                let mut done = 0u64;
                while done < len {
                    let a = va.wrapping_add(done);
                    let n = page_piece(a, (len - done) as usize) as u64;
                    match core.peek_target(&self.vspace, a) {
                        Some(t) if t != Target::Vram => self.traffic.sys += n,
                        _ => self.traffic.vram += n,
                    }
                    done += n;
                }
            }
            self.scanned += 1;
        }
        self.duration = Some(
            self.fixed
                .unwrap_or_else(|| self.job.duration(core, self.traffic)),
        );
        true
    }

    /// Runs the pieces due at `now` (the operation started at `start`) within the budget.
    pub(crate) fn progress(
        &mut self,
        core: &mut Core,
        start: u64,
        now: u64,
        mode: EngineWrites,
        budget: &mut Budget,
    ) -> Step {
        if self.duration.is_none() && !self.scan(core, budget) {
            return Step::Deferred;
        }
        while self.next < self.pieces {
            let at = self.due(self.next, start, mode);
            if at > now {
                return Step::Waiting;
            }
            if !budget.take(self.job.units(self.next)) {
                return Step::Deferred;
            }
            let i = self.next;
            if budget.worker && matches!(self.job, Job::Matmul { .. }) {
                match self.job.gather(i, core, &self.vspace) {
                    Err(fault) => {
                        self.next += 1;
                        return Step::Fault { at, fault };
                    }
                    Ok(Some(block)) => {
                        return Step::Offload(Offload {
                            serial: self.serial,
                            piece: i,
                            due: at,
                            block,
                        })
                    }
                    Ok(None) => {
                        self.next += 1;
                        budget.count_piece();
                        continue;
                    }
                }
            }
            self.next += 1;
            budget.count_piece();
            if let Err(fault) = self.job.run(i, core, &self.vspace) {
                return Step::Fault { at, fault };
            }
        }
        Step::Complete
    }

    /// Writes the results of an offloaded piece (computed outside the lock), if this operation
    /// is still at that piece.
    pub(crate) fn commit(
        &mut self,
        core: &mut Core,
        o: &Offload,
        data: &[u8],
        budget: &mut Budget,
    ) -> Result<(), VaFault> {
        if o.serial != self.serial || o.piece != self.next {
            return Ok(());
        }
        self.next += 1;
        budget.count_piece();
        core.write_va(&self.vspace, o.block.dst, data)
    }

    /// Gathers up to `max` more blocks of a matrix kernel after `after` (a piece just handed
    /// out as an [`Offload`], not yet committed), so that the engine worker computes a run of
    /// blocks with the lock released once: only blocks due by `now`, and only when `c` and `a`
    /// do not overlap — a block's row of `a` is read when it is gathered, so it must be one no
    /// block before it writes (`b` is read into the staging before the first block). Commits
    /// land in piece order ([`EngineOp::commit`]), so memory ends up as one block at a time
    /// leaves it. Stops at the first block that would fault: that one faults when it is reached
    /// in order.
    pub(crate) fn gather_ahead(
        &mut self,
        core: &mut Core,
        start: u64,
        now: u64,
        mode: EngineWrites,
        after: u64,
        max: usize,
    ) -> Vec<Offload> {
        let mut out = Vec::new();
        let Job::Matmul {
            abc: [a, _, c], n, ..
        } = self.job
        else {
            return out;
        };
        let bytes = n.saturating_mul(n).saturating_mul(4);
        let apart = a.checked_add(bytes).is_some_and(|end| end <= c)
            || c.checked_add(bytes).is_some_and(|end| end <= a);
        if !apart || after + 1 < self.next {
            return out;
        }
        let mut i = after + 1;
        while out.len() < max && i < self.pieces {
            let at = self.due(i, start, mode);
            if at > now {
                break;
            }
            match self.job.gather(i, core, &self.vspace) {
                Ok(Some(block)) => out.push(Offload {
                    serial: self.serial,
                    piece: i,
                    due: at,
                    block,
                }),
                Ok(None) | Err(_) => break,
            }
            i += 1;
        }
        out
    }

    /// Hands a completed matrix kernel's `b` staging back to `core` for the next kernel
    /// (`Core::matmul_stage`); nothing when a block still shares it or the staging kept is
    /// larger.
    pub(crate) fn recycle(&mut self, core: &mut Core) {
        if let Job::Matmul { b, .. } = &mut self.job {
            if let Some(v) = Arc::get_mut(b) {
                if v.capacity() > core.matmul_stage.capacity() {
                    core.matmul_stage = std::mem::take(v);
                }
            }
        }
    }

    /// When the next piece is due (the end once every piece is done; `start` while scanning).
    pub(crate) fn next_due(&self, start: u64, mode: EngineWrites) -> u64 {
        if self.duration.is_none() {
            return start;
        }
        if self.next < self.pieces {
            self.due(self.next, start, mode)
        } else {
            start.saturating_add(self.duration.unwrap_or(0))
        }
    }

    /// The time by which one budget's worth of the remaining work is due (a poller that comes
    /// back then finds no more work than one call may do); the end if all of it fits.
    pub(crate) fn horizon(&mut self, start: u64, mode: EngineWrites) -> u64 {
        let end = start.saturating_add(self.duration.unwrap_or(0));
        if let Some((next, t)) = self.horizon {
            if next == self.next {
                return t;
            }
        }
        let mut units = 0u64;
        let mut t = end;
        for i in self.next..self.pieces {
            units += self.job.units(i);
            if units > WORK_BUDGET {
                t = if i > self.next {
                    self.due(i - 1, start, mode)
                } else {
                    self.due(i, start, mode)
                };
                break;
            }
        }
        self.horizon = Some((self.next, t));
        t
    }
}

/// Runs `op` to its end at once (unit tests of the engines): its duration, or its fault.
#[cfg(test)]
pub(crate) fn run_to_end(core: &mut Core, op: &mut EngineOp) -> Result<u64, VaFault> {
    loop {
        let mut b = Budget::default();
        match op.progress(core, 0, u64::MAX, EngineWrites::OverDuration, &mut b) {
            Step::Complete => return Ok(op.duration.unwrap_or(0)),
            Step::Fault { fault, .. } => return Err(fault),
            Step::Offload(o) => op.commit(core, &o, &o.block.compute(), &mut b)?,
            Step::Waiting | Step::Deferred => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One result at a time, one term at a time, `k` in order: the definition the vector
    /// loops must match bit for bit.
    fn reference(block: &MatmulBlock) -> Vec<u8> {
        let n = block.n;
        let mut out = Vec::new();
        for row in block.row_a.chunks_exact(n) {
            for j in block.cols.clone() {
                let v = if block.float {
                    let mut s = 0f32;
                    for (k, &x) in row.iter().enumerate() {
                        s += f32::from_bits(x) * f32::from_bits(block.b[k * n + j]);
                    }
                    s.to_bits()
                } else {
                    (0..n).fold(0u32, |s, k| {
                        s.wrapping_add(row[k].wrapping_mul(block.b[k * n + j]))
                    })
                };
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    #[test]
    fn vector_loops_give_the_bits_of_one_term_at_a_time() {
        // Values that make float sums order-sensitive: signed zeros, infinities, NaN,
        // subnormals, large and small magnitudes.
        let specials = [
            0.0f32,
            -0.0,
            1.0,
            -3.5,
            f32::INFINITY,
            f32::NAN,
            1e-40,
            3e38,
            -7e-3,
        ];
        let mut x = 0x2545_f491u32;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        // One row and several; widths that fill whole vectors and partial ones.
        for (n, rows, cols) in [
            (3, 2, 0..3),
            (40, 9, 0..40),
            (50, 6, 7..50),
            (130, 1, 17..99),
            // Whole tiles, tiles and a tail, rows left over from the tiles.
            (128, 4, 0..128),
            (70, 5, 3..70),
            (130, 6, 0..130),
        ] {
            for float in [false, true] {
                let word = |next: &mut dyn FnMut() -> u32| {
                    let r = next();
                    if float && r.is_multiple_of(5) {
                        specials[(r / 5) as usize % specials.len()].to_bits()
                    } else if float {
                        (((r % 2001) as f32 - 1000.0) / 7.0).to_bits()
                    } else {
                        r
                    }
                };
                let block = MatmulBlock {
                    n,
                    float,
                    b: Arc::new((0..n * n).map(|_| word(&mut next)).collect()),
                    row_a: Arc::new((0..rows * n).map(|_| word(&mut next)).collect()),
                    cols: cols.clone(),
                    dst: 0,
                };
                // Bit for bit, except that any NaN matches any NaN: which NaN an operation
                // returns is not specified (Rust's `f32` docs), and vector code may commute
                // the operands of an add.
                let words = |bytes: Vec<u8>| -> Vec<u32> {
                    bytes
                        .chunks_exact(4)
                        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .map(|w| {
                            if float && f32::from_bits(w).is_nan() {
                                u32::MAX
                            } else {
                                w
                            }
                        })
                        .collect()
                };
                assert_eq!(
                    words(block.compute().to_vec()),
                    words(reference(&block)),
                    "n {n} rows {rows} cols {cols:?} float {float}"
                );
            }
        }
    }
}
