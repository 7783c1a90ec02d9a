//! Allocating and writing shadow tables — GPUvm's shadow builder (GXEN `shadow_page_table.cc`:
//! shadow directory and tables allocated from the hypervisor's own VRAM area, the guest
//! directory scanned PDE by PDE, each table translated entry by entry).
//!
//! An address space's shadow mirrors the guest's structure: one 64 KiB shadow page directory,
//! and for each guest PDE that names a small and/or large table inside the VM's memory, a shadow
//! table of the size the PDE's PT_SIZE makes valid (at most 256 KiB / 8 KiB, rounded up to
//! 4 KiB, 4 KiB aligned). Tables are not shared between PDEs even when the guest shares them:
//! each PDE's shadow is independent, which keeps updates local.
//!
//! Reads and writes are batched in bounded pieces: a rebuild reads the guest directory a 4 KiB
//! page at a time and writes each re-shadowed PDE; a table is read, translated and written
//! 16 KiB at a time ([`build_table`]), a fresh one zero-filled first and given only its
//! non-zero entries; eight PDEs with no tables (and no previous shadow) cost one test.
//! The incremental paths ([`rewrite_pdes`], [`rewrite_ptes`]) read and write only the entries a
//! guest write touched; a changed PDE re-walks only the tables that changed.
//!
//! Hypervisor VRAM is charged against a per-VM limit so one VM cannot take the whole
//! hypervisor area by pointing all 8192 PDEs of many directories at (the same) tables. A table
//! that cannot be allocated is left absent (its VAs fault) and counted in
//! `ShadowStats::alloc_failures`.

use std::collections::BTreeMap;
use std::fmt;

use gf100::mmu::{self, PtSize, PTE_PRESENT};

use super::hyp;
use super::track::{Mem, Role, TableKind, Tracker};
use super::translate::{self, PHYS_LIMIT};
use super::walk::{self, GuestTable, PtKind};
use super::{GuestPdb, ShadowCtx, ShadowStats};
use crate::addr::HostVram;
use crate::guest_mem::GuestMem;
use crate::phys::PhysicalGpu;

/// PDE bits that name tables (LPT target 1:0, SPT target 33:32).
pub(crate) const PDE_TABLE_BITS: u64 = 0x3 | 0x3 << 32;

/// Alignment and granule of shadow allocations.
const SHADOW_ALIGN: u64 = gf100::PAGE_SIZE;

/// Violations logged before the log is thinned out to powers of two.
const WARN_FIRST: u64 = 16;

/// One shadow table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TableShadow {
    /// The guest table it shadows.
    pub guest: GuestTable,
    /// Where the shadow lives in physical VRAM.
    pub host: u64,
    /// Bytes allocated.
    pub bytes: u64,
}

/// The shadow of one PDE that has at least one shadow table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PdeShadow {
    /// The guest's PT_SIZE.
    pub size: PtSize,
    /// Small-page table.
    pub small: Option<TableShadow>,
    /// Large-page table.
    pub large: Option<TableShadow>,
}

impl PdeShadow {
    /// The `kind` table.
    pub(crate) fn table(&self, kind: PtKind) -> Option<&TableShadow> {
        match kind {
            PtKind::Small => self.small.as_ref(),
            PtKind::Large => self.large.as_ref(),
        }
    }

    /// The shadow PDE value.
    pub(crate) fn encode(&self) -> u64 {
        translate::shadow_pde(
            self.size,
            self.small.map(|t| t.host),
            self.large.map(|t| t.host),
        )
    }
}

/// One shadow address space.
#[derive(Debug)]
pub(crate) struct Space {
    /// Attach count.
    pub refs: u64,
    /// Shadow page directory in physical VRAM.
    pub pd: u64,
    /// Lazy mode: a flush arrived since the last rebuild.
    pub dirty: bool,
    /// A rebuild in progress, done in budgeted steps ([`rebuild_step`]): the next PDE of the
    /// directory to re-shadow. Changed only by [`set_rebuild_at`], which keeps
    /// [`Books::rebuilding`] right.
    pub rebuild_at: Option<usize>,
    /// Shadows of the PDEs that have at least one shadow table.
    pub pdes: BTreeMap<u16, PdeShadow>,
}

/// A reusable buffer (its `Debug` shows only the length).
#[derive(Default)]
pub(crate) struct Scratch(pub Vec<u8>);

impl fmt::Debug for Scratch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scratch({} bytes)", self.0.len())
    }
}

/// Everything besides the spaces: counters, the allocation limit, write tracking, buffers.
#[derive(Debug)]
pub(crate) struct Books {
    /// Counters (`tracked_pages` is filled in when read).
    pub stats: ShadowStats,
    /// Most hypervisor VRAM the VM's shadows may use.
    pub limit: u64,
    /// Keep [`Books::tracker`] up to date (incremental and PV modes).
    pub tracking: bool,
    /// Tracked guest pages.
    pub tracker: Tracker,
    /// The hypervisor's table at the reserved PDE (`super::hyp`).
    pub hyp: hyp::HypTable,
    /// Guest entries read.
    pub input: Scratch,
    /// Shadow entries to write.
    pub output: Scratch,
    /// Spaces with a rebuild in progress (`Space::rebuild_at` set): asked on every fast-path
    /// access, so kept as a count instead of a walk over the spaces.
    pub rebuilding: usize,
}

/// Sets `space.rebuild_at`, keeping [`Books::rebuilding`] in step.
pub(crate) fn set_rebuild_at(books: &mut Books, space: &mut Space, at: Option<usize>) {
    books.rebuilding =
        books.rebuilding + usize::from(at.is_some()) - usize::from(space.rebuild_at.is_some());
    space.rebuild_at = at;
}

/// Bytes allocated for a shadow of `bytes` bytes.
fn alloc_size(bytes: u64) -> u64 {
    bytes.max(1).next_multiple_of(SHADOW_ALIGN)
}

impl Books {
    /// Fresh books.
    pub(crate) fn new(tracking: bool, limit: u64) -> Books {
        Books {
            stats: ShadowStats::default(),
            limit,
            tracking,
            tracker: Tracker::default(),
            hyp: Default::default(),
            input: Scratch::default(),
            output: Scratch::default(),
            rebuilding: 0,
        }
    }

    /// Allocates `bytes` (a multiple of 4 KiB) of hypervisor VRAM within the VM's limit.
    pub(crate) fn alloc(&mut self, cx: &mut ShadowCtx, bytes: u64) -> Option<u64> {
        self.alloc_aligned(cx, bytes, SHADOW_ALIGN)
    }

    /// [`Books::alloc`] with an alignment of `align` (a power of two, at least 4 KiB).
    pub(crate) fn alloc_aligned(
        &mut self,
        cx: &mut ShadowCtx,
        bytes: u64,
        align: u64,
    ) -> Option<u64> {
        let fits = self
            .stats
            .shadow_bytes
            .checked_add(cx.hyp.held_by_owner())
            .and_then(|b| b.checked_add(bytes))
            .is_some_and(|total| total <= self.limit);
        let addr = if fits {
            cx.hyp.alloc(bytes, align.max(SHADOW_ALIGN))
        } else {
            None
        };
        match addr {
            Some(a) if a.checked_add(bytes).is_some_and(|end| end <= PHYS_LIMIT) => {
                self.stats.shadow_bytes += bytes;
                Some(a)
            }
            Some(a) => {
                // Shadow tables must be addressable by a PDE (40 bits).
                cx.hyp.free(a, bytes);
                None
            }
            None => None,
        }
    }

    /// Counts and logs a failed allocation.
    pub(crate) fn alloc_failed(&mut self, pdb: GuestPdb, bytes: u64) {
        self.stats.alloc_failures += 1;
        let n = self.stats.alloc_failures;
        if n <= WARN_FIRST || n.is_power_of_two() {
            log::warn!(
                "shadow_pt: no hypervisor VRAM for a {bytes:#x}-byte shadow table of {pdb:?} \
                 (used {:#x} of {:#x}; failure #{n}); the table is left absent",
                self.stats.shadow_bytes,
                self.limit
            );
        }
    }

    /// Returns a shadow allocation.
    pub(crate) fn free(&mut self, cx: &mut ShadowCtx, addr: u64, bytes: u64) {
        if !cx.hyp.free(addr, bytes) {
            log::error!("shadow_pt: hypervisor VRAM {addr:#x}+{bytes:#x} was not allocated");
        }
        self.stats.shadow_bytes = self.stats.shadow_bytes.saturating_sub(bytes);
    }

    /// Counts a rejected guest entry or table and logs it, rate-limited (the first
    /// [`WARN_FIRST`], then every power of two) so a hostile guest cannot flood the log.
    pub(crate) fn violation(&mut self, pdb: GuestPdb, what: fmt::Arguments) {
        self.stats.violations += 1;
        let n = self.stats.violations;
        if n <= WARN_FIRST || n.is_power_of_two() {
            log::warn!("shadow_pt: {pdb:?}: {what} (violation #{n})");
        }
    }

    /// Starts tracking the guest table of `role`.
    pub(crate) fn track(&mut self, role: Role, mem: Mem, addr: u64, bytes: u64) {
        if self.tracking {
            self.tracker.track(mem, addr, bytes, role);
        }
    }

    /// Stops tracking the guest table of `role`.
    pub(crate) fn untrack(&mut self, role: Role, mem: Mem, addr: u64, bytes: u64) {
        if self.tracking {
            self.tracker.untrack(mem, addr, bytes, role);
        }
    }
}

/// The tracking role of table `kind` of PDE `idx`.
fn role(pdb: GuestPdb, idx: u16, kind: PtKind) -> Role {
    Role {
        pdb,
        kind: match kind {
            PtKind::Small => TableKind::Small(idx),
            PtKind::Large => TableKind::Large(idx),
        },
    }
}

/// Translates the guest entries in `input` (entries `first..` of the `kind` table of PDE `idx`)
/// into shadow entries appended to `out`; rejected entries become 0 and count a violation.
#[allow(clippy::too_many_arguments)]
fn translate_entries(
    mem: &GuestMem,
    books: &mut Books,
    pdb: GuestPdb,
    idx: u16,
    kind: PtKind,
    first: u64,
    input: &[u8],
    out: &mut Vec<u8>,
) {
    let page = kind.page_size();
    // One entry, translated (rejected: 0 and a violation).
    let mut one = |raw: u64, at: u64| {
        if raw & PTE_PRESENT == 0 {
            return 0;
        }
        translate::shadow_pte(mem, raw, page).unwrap_or_else(|why| {
            books.violation(
                pdb,
                format_args!(
                    "PDE {idx} {kind:?} PTE {} = {raw:#018x} rejected: {why:?}",
                    first + at
                ),
            );
            0
        })
    };
    out.clear();
    // A single entry — what every page-table entry a guest writes through a BAR is — goes
    // straight to its translation.
    if let Ok(entry) = <[u8; 8]>::try_from(input) {
        out.extend_from_slice(&one(u64::from_le_bytes(entry), 0).to_le_bytes());
        return;
    }
    out.reserve(input.len());
    // Guest tables are mostly zero (fresh VRAM, sparse mappings), and a zero entry shadows to
    // zero: a whole block of zeros is found with one comparison and copied as zeros, so the
    // per-entry translation below runs only where the guest wrote something.
    let mut at = 0;
    for block in input.chunks(ZERO_BLOCK.len()) {
        if all_zero(block) {
            out.extend_from_slice(block);
            at += block.len() as u64 / 8;
            continue;
        }
        for raw in walk::entries(block) {
            out.extend_from_slice(&one(raw, at).to_le_bytes());
            at += 1;
        }
    }
}

/// Eight entries of zeros: the unit in which [`translate_entries`] and [`rebuild`] skip what
/// the guest never wrote.
const ZERO_BLOCK: &[u8] = &[0; 64];

/// True if every byte of `b` is zero: an OR over the bytes, which the compiler vectorizes (a
/// slice comparison with [`ZERO_BLOCK`] calls `memcmp` for each block: ~25 ns a block, most of a
/// fresh 32,768-entry table's translation and write scan).
fn all_zero(b: &[u8]) -> bool {
    b.iter().fold(0u8, |acc, &x| acc | x) == 0
}

/// Bytes of a guest table [`build_table`] reads, translates and writes at a time (2,048
/// entries): bounds its scratch buffers, so a VM's first table does not fault in 2 x 256 KiB
/// of fresh host memory under the host lock (measured: ~0.3 of a 0.9 ms channel bind on the
/// project's 2-core machine, `gpuvm exp lockhold`).
const PIECE_BYTES: u64 = 16 * 1024;

/// Shadows the whole guest table `guest` (the `kind` table of PDE `idx`): read, translated and
/// written [`PIECE_BYTES`] at a time. Reuses `reuse`'s allocation when the size matches and
/// frees it otherwise; allocates before reading, so a table beyond the VM's limit costs no
/// read. A table in a fresh allocation is zero-filled first (the simulator punches a hole: no
/// host page is touched) and then gets only its non-zero entries written, so the entries the
/// guest never wrote cost neither a write nor a page of host memory; a reused table, which a
/// channel may be walking, is overwritten in place, entry by entry, as before. `None` if no
/// VRAM is left or the table is not inside the VM's memory (a violation).
fn build_table(
    cx: &mut ShadowCtx,
    books: &mut Books,
    pdb: GuestPdb,
    idx: u16,
    kind: PtKind,
    guest: GuestTable,
    reuse: Option<TableShadow>,
) -> Option<TableShadow> {
    let bytes = alloc_size(guest.bytes());
    let (host, fresh) = match reuse {
        Some(o) if o.bytes == bytes => (o.host, false),
        reuse => {
            if let Some(o) = reuse {
                books.free(cx, o.host, o.bytes);
            }
            let Some(host) = books.alloc(cx, bytes) else {
                books.alloc_failed(pdb, bytes);
                return None;
            };
            (host, true)
        }
    };
    if fresh {
        cx.mem.phys.fill_vram(HostVram(host), bytes, 0);
    }
    let mut input = std::mem::take(&mut books.input.0);
    let mut out = std::mem::take(&mut books.output.0);
    let per_piece = PIECE_BYTES / mmu::ENTRY_SIZE;
    let mut first = 0;
    let mut read = Ok(());
    while first < guest.entries && read.is_ok() {
        let count = per_piece.min(guest.entries - first);
        read = walk::read_entries(&cx.mem, guest.target, guest.addr, first, count, &mut input);
        if read.is_ok() {
            translate_entries(&cx.mem, books, pdb, idx, kind, first, &input, &mut out);
            let at = host + first * mmu::ENTRY_SIZE;
            if fresh {
                write_nonzero(cx.mem.phys, at, &out);
            } else {
                cx.mem.phys.write_vram(HostVram(at), &out);
            }
        }
        first += count;
    }
    books.input.0 = input;
    books.output.0 = out;
    match read {
        Ok(()) => {
            books.stats.ptes_shadowed += guest.entries;
            Some(TableShadow { guest, host, bytes })
        }
        Err(why) => {
            books.violation(
                pdb,
                format_args!(
                    "PDE {idx} {kind:?} table at {:?} {:#x} (+{:#x}) is outside the VM: {why}",
                    guest.target,
                    guest.addr,
                    guest.bytes()
                ),
            );
            books.free(cx, host, bytes);
            None
        }
    }
}

/// Writes the runs of `data` that are not all zero (in [`ZERO_BLOCK`]s) to VRAM at `at`, whose
/// bytes are zero already.
fn write_nonzero(phys: &dyn PhysicalGpu, at: u64, data: &[u8]) {
    let block = ZERO_BLOCK.len();
    let mut run: Option<usize> = None;
    for (i, b) in data.chunks(block).enumerate() {
        match (all_zero(b), run) {
            (false, None) => run = Some(i * block),
            (true, Some(start)) => {
                phys.write_vram(HostVram(at + start as u64), &data[start..i * block]);
                run = None;
            }
            _ => {}
        }
    }
    if let Some(start) = run {
        phys.write_vram(HostVram(at + start as u64), &data[start..]);
    }
}

/// Brings the `kind` table of PDE `idx` from `old` to the guest's `new`: frees, keeps (when the
/// guest table is unchanged and `rewalk` is false) or (re)builds it, and moves its tracking.
#[allow(clippy::too_many_arguments)]
fn update_table(
    cx: &mut ShadowCtx,
    books: &mut Books,
    pdb: GuestPdb,
    idx: u16,
    kind: PtKind,
    new: Option<GuestTable>,
    old: Option<TableShadow>,
    rewalk: bool,
) -> Option<TableShadow> {
    let role = role(pdb, idx, kind);
    if let Some(o) = &old {
        if let Some(n) = new.filter(|n| !rewalk && n.same(&o.guest)) {
            return Some(TableShadow { guest: n, ..*o });
        }
        books.untrack(role, o.guest.mem(), o.guest.addr, o.guest.bytes());
    }
    let Some(n) = new else {
        if let Some(o) = old {
            books.free(cx, o.host, o.bytes);
        }
        return None;
    };
    let t = build_table(cx, books, pdb, idx, kind, n, old)?;
    books.track(role, n.mem(), n.addr, n.bytes());
    Some(t)
}

/// Re-shadows PDE `idx` of `space` from the guest value `raw` and returns the shadow PDE (the
/// caller writes it). With `rewalk`, tables are re-read even if the PDE still names them.
pub(crate) fn set_pde(
    cx: &mut ShadowCtx,
    books: &mut Books,
    pdb: GuestPdb,
    space: &mut Space,
    idx: u16,
    raw: u64,
    rewalk: bool,
) -> u64 {
    if let Some(host) = hyp_reserved(books, pdb, idx, raw) {
        return host;
    }
    let new = mmu::Pde::decode(raw);
    let (old_small, old_large) = match space.pdes.remove(&idx) {
        Some(p) => (p.small, p.large),
        None => (None, None),
    };
    let small = GuestTable::of(&new, PtKind::Small);
    let small = update_table(cx, books, pdb, idx, PtKind::Small, small, old_small, rewalk);
    let large = GuestTable::of(&new, PtKind::Large);
    let large = update_table(cx, books, pdb, idx, PtKind::Large, large, old_large, rewalk);
    let shadow = PdeShadow {
        size: new.size,
        small,
        large,
    };
    if small.is_some() || large.is_some() {
        space.pdes.insert(idx, shadow);
    }
    shadow.encode()
}

/// Page-directory entries with tables one [`rebuild_step`] may re-shadow. Each re-walks its
/// small-page and large-page tables: a full small-page table is 32,768 entries, half of a PV
/// batch's `WALK_BUDGET` (host policy, not hardware; the isolation review's
/// finding 4 measured 48-85 ms of host lock for one unbounded rebuild of a full directory).
/// One, not two as before: `gpuvm exp lockhold`'s eager-flush neighbour (2,048 PDEs naming
/// full tables) made a two-entry step a 0.8-1.1 ms hold on the 16-core machine, the longest of
/// any scenario; a rebuild now takes one exit of its VM per PDE with tables.
pub const REBUILD_BUDGET_PDES: usize = 1;

/// Bytes of the guest page directory [`rebuild_step`] reads at once (a host page; the
/// directory, 64 KiB and 4 KiB aligned, is 16 of them).
const PD_READ_BYTES: usize = 4096;

/// Rebuilds the whole shadow of `pdb` from the guest's tables now (no budget).
pub(crate) fn rebuild(cx: &mut ShadowCtx, books: &mut Books, pdb: GuestPdb, space: &mut Space) {
    set_rebuild_at(books, space, Some(0));
    while !rebuild_step(cx, books, pdb, space, usize::MAX) {}
}

/// Continues the rebuild of `pdb`'s shadow (started by setting `rebuild_at`, a PDE index) for
/// at most `budget` page-directory entries with tables, writing each re-shadowed entry as it
/// goes; true when the directory is done. The cursor is a PDE, so a step stops where its
/// budget ends, inside a block of eight if need be. Each step re-reads the guest's blocks, so a
/// guest write between steps is seen by the entries still to come (and a flush restarts it).
pub(crate) fn rebuild_step(
    cx: &mut ShadowCtx,
    books: &mut Books,
    pdb: GuestPdb,
    space: &mut Space,
    budget: usize,
) -> bool {
    let Some(mut i) = space.rebuild_at else {
        return true;
    };
    let per_block = ZERO_BLOCK.len() / 8;
    let entries = mmu::PD_SIZE as usize / 8;
    let mut spent = 0usize;
    // The guest directory is read a host page at a time (64 blocks of eight PDEs), the blocks
    // taken from it: one guest memory read per 512 PDEs instead of per 8.
    let mut page = [0u8; PD_READ_BYTES];
    let mut page_at: Option<usize> = None;
    // The budget is checked where work is: entries that need none are passed over even once it
    // is spent, so a step that re-shadows the last table of a directory also finishes it.
    'scan: while i < entries {
        let block = i / per_block;
        let at = pdb.addr + (block * ZERO_BLOCK.len()) as u64;
        let first = block * ZERO_BLOCK.len() / PD_READ_BYTES * PD_READ_BYTES;
        if page_at != Some(first) {
            if let Err(why) = cx.mem.read(pdb.target, pdb.addr + first as u64, &mut page) {
                if first == 0 {
                    books.violation(pdb, format_args!("page directory unreadable: {why}"));
                }
                page.fill(0);
            }
            page_at = Some(first);
        }
        let o = block * ZERO_BLOCK.len() - first;
        let gb = &page[o..o + ZERO_BLOCK.len()];
        let base = (block * per_block) as u16;
        let ids = base..base + per_block as u16;
        // Eight zero PDEs that had no tables and hold no hypervisor PDE: nothing to do for any
        // of them (the per-entry test below would skip each one), found with one comparison.
        if i % per_block == 0
            && all_zero(gb)
            && space.pdes.range(ids.clone()).next().is_none()
            && !ids.contains(&hyp::HYP_PDE)
        {
            i += per_block;
            continue;
        }
        while i < (block + 1) * per_block {
            let idx = i as u16;
            let j = i % per_block;
            let raw = walk::le64(&gb[j * 8..j * 8 + 8]);
            if raw & PDE_TABLE_BITS == 0 && !space.pdes.contains_key(&idx) && idx != hyp::HYP_PDE {
                i += 1;
                continue;
            }
            // The hypervisor's PDE walks no guest table: it costs no budget.
            if idx != hyp::HYP_PDE {
                if spent >= budget {
                    break 'scan;
                }
                spent += 1;
            }
            i += 1;
            let v = set_pde(cx, books, pdb, space, idx, raw, true);
            cx.mem.phys.write_vram(
                HostVram(space.pd + j as u64 * 8 + (at - pdb.addr)),
                &v.to_le_bytes(),
            );
        }
    }
    if i >= entries {
        set_rebuild_at(books, space, None);
        books.stats.rebuilds += 1;
        return true;
    }
    set_rebuild_at(books, space, Some(i));
    false
}

/// Creates the shadow of `pdb` (a directory already validated to lie in the VM's memory) and
/// builds it fully. `None` if no VRAM is left for the directory.
pub(crate) fn create(cx: &mut ShadowCtx, books: &mut Books, pdb: GuestPdb) -> Option<Space> {
    let Some(pd) = books.alloc(cx, mmu::PD_SIZE) else {
        books.alloc_failed(pdb, mmu::PD_SIZE);
        return None;
    };
    // Only the entries with tables are written below: the rest must read as zero whatever the
    // allocation held (hypervisor VRAM comes back scrubbed; this does not rely on it).
    cx.mem.phys.fill_vram(HostVram(pd), mmu::PD_SIZE, 0);
    let mut space = Space {
        refs: 1,
        pd,
        dirty: false,
        rebuild_at: None,
        pdes: BTreeMap::new(),
    };
    let role = Role {
        pdb,
        kind: TableKind::Pd,
    };
    books.track(role, Mem::of(pdb.target), pdb.addr, mmu::PD_SIZE);
    rebuild(cx, books, pdb, &mut space);
    Some(space)
}

/// Frees every table and the directory of `space` and drops their tracking.
pub(crate) fn teardown(cx: &mut ShadowCtx, books: &mut Books, pdb: GuestPdb, mut space: Space) {
    set_rebuild_at(books, &mut space, None);
    for (idx, p) in space.pdes {
        for (kind, t) in [(PtKind::Small, p.small), (PtKind::Large, p.large)] {
            if let Some(t) = t {
                let r = role(pdb, idx, kind);
                books.untrack(r, t.guest.mem(), t.guest.addr, t.guest.bytes());
                books.free(cx, t.host, t.bytes);
            }
        }
    }
    let role = Role {
        pdb,
        kind: TableKind::Pd,
    };
    books.untrack(role, Mem::of(pdb.target), pdb.addr, mmu::PD_SIZE);
    books.free(cx, space.pd, mmu::PD_SIZE);
}

/// A guest write of `[addr, end)` landed in the page directory of `pdb`: re-shadows exactly the
/// PDEs it touched (re-walking only tables that changed) and writes them to the shadow
/// directory in one piece.
pub(crate) fn rewrite_pdes(
    cx: &mut ShadowCtx,
    books: &mut Books,
    pdb: GuestPdb,
    space: &mut Space,
    addr: u64,
    end: u64,
) {
    let Some((first, count)) = walk::written_entries(pdb.addr, mmu::PD_ENTRIES, addr, end) else {
        return;
    };
    let mut guest = Vec::new();
    if let Err(why) = walk::read_entries(&cx.mem, pdb.target, pdb.addr, first, count, &mut guest) {
        books.violation(pdb, format_args!("page directory unreadable: {why}"));
        return;
    }
    let mut shadow = Vec::with_capacity(guest.len());
    for (i, raw) in walk::entries(&guest).enumerate() {
        let idx = (first + i as u64) as u16;
        let v = set_pde(cx, books, pdb, space, idx, raw, false);
        shadow.extend_from_slice(&v.to_le_bytes());
    }
    cx.mem.phys.write_vram(
        HostVram(space.pd + first * mmu::ENTRY_SIZE),
        shadow.as_slice(),
    );
    books.stats.entry_updates += count;
}

/// A guest write of `[addr, end)` landed in the `kind` table of PDE `idx` of `pdb`: re-shadows
/// exactly the entries it touched, with one read and one VRAM write — no read when `written`
/// (the bytes the write put at `addr`) covers those entries exactly.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rewrite_ptes(
    mem: &GuestMem,
    books: &mut Books,
    pdb: GuestPdb,
    space: &Space,
    idx: u16,
    kind: PtKind,
    addr: u64,
    end: u64,
    written: Option<&[u8]>,
) {
    let Some(t) = space.pdes.get(&idx).and_then(|p| p.table(kind)).copied() else {
        return;
    };
    let Some((first, count)) = t.guest.written(addr, end) else {
        return;
    };
    let mut input = std::mem::take(&mut books.input.0);
    let whole = t.guest.addr.checked_add(first * mmu::ENTRY_SIZE) == Some(addr)
        && end - addr == count * mmu::ENTRY_SIZE;
    let read = match written {
        Some(data) if whole && data.len() as u64 == end - addr => {
            input.clear();
            input.extend_from_slice(data);
            Ok(())
        }
        _ => walk::read_entries(mem, t.guest.target, t.guest.addr, first, count, &mut input),
    };
    match read {
        Ok(()) => {
            let mut out = std::mem::take(&mut books.output.0);
            translate_entries(mem, books, pdb, idx, kind, first, &input, &mut out);
            mem.phys
                .write_vram(HostVram(t.host + first * mmu::ENTRY_SIZE), &out);
            books.stats.entry_updates += count;
            books.output.0 = out;
        }
        Err(why) => books.violation(
            pdb,
            format_args!("PDE {idx} {kind:?} table became unreadable: {why}"),
        ),
    }
    books.input.0 = input;
}

/// The shadow value of PDE `idx` if the host owns it (`hyp::HYP_PDE`): the host's PDE, and a
/// violation counted if the guest put a table there.
fn hyp_reserved(books: &mut Books, pdb: GuestPdb, idx: u16, guest_raw: u64) -> Option<u64> {
    if idx != hyp::HYP_PDE {
        return None;
    }
    if guest_raw & PDE_TABLE_BITS != 0 {
        books.stats.hyp_pde_refused += 1;
        books.violation(
            pdb,
            format_args!("PDE {idx} ({guest_raw:#x}) is the hypervisor's; not shadowed"),
        );
    }
    Some(books.hyp.pde())
}
