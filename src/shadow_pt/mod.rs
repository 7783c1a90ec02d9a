//! Shadow GPU page tables (GPUvm §"GPU shadow page table"): for every guest page directory a
//! channel uses, the device model keeps a shadow copy in hypervisor VRAM whose entries are the
//! guest's entries translated and validated — VRAM pages moved into the VM's slice, system pages
//! moved into the VM's DMA window, anything else dropped. The physical GPU only ever walks shadows.
//!
//! Four modes keep shadows up to date (all producing identical shadow contents):
//! `eager` rebuilds on every guest TLB flush; `lazy` marks dirty and rebuilds before the next
//! submission; `incremental` write-tracks the guest's table pages and updates one shadow entry
//! per guest entry write; `pv` applies batches of entry writes sent through the para-virtual
//! interface (`gf100::pv`). In every mode [`ShadowPt::attach`] builds a shadow fully on first use.
//!
//! Parts (each names the piece of GPUvm's GXEN prototype it models):
//! - `walk` — reading guest tables, resolving VAs through shadows (`shadow_page_table.cc`,
//!   `software_page_table.cc::resolve`);
//! - `translate` — validating and translating one entry (`context::guest_to_host`);
//! - `build` — allocating and writing shadow tables (`shadow_page_table.cc`);
//! - `track` — write tracking of table pages (`barrier.h`);
//! - `pv` — para-virtual batches (`context_bar4.cc`).
//!
//! Decisions (see also each part):
//! - **Validation.** A present guest PTE is shadowed only if its whole page (4 KiB or 128 KiB)
//!   is inside the VM's VRAM slice, or inside one region of its RAM for system memory (GPUvm
//!   left that unchecked). Rejected entries become not-present and count one violation each
//!   time they are shadowed — so an eager VM recounts a bad entry at every rebuild, an
//!   incremental one once per write; the counter measures work refused, not distinct entries.
//!   A table or directory not entirely inside the VM's memory is treated as absent. Violations
//!   are logged with `log::warn!`, rate-limited by count (no clock involved).
//! - **Compression tags are cleared** in every shadow PTE (comptag lines are a GPU-wide resource
//!   the model does not partition); kinds and the other flags are kept.
//! - **Incremental mode sees CPU writes only.** Writes the GPU itself makes into guest tables
//!   (a copy engine or kernel targeting a table page) do not pass through
//!   [`ShadowPt::guest_wrote`] and are not shadowed until the PDE naming the table changes (a
//!   rewrite with the same value keeps the shadow table) or [`ShadowPt::resync`] is called. The same holds for tables in guest RAM: the CPU writes them
//!   without an exit unless the VMM write-protects the pages [`ShadowPt::is_tracked`] reports
//!   (eager and lazy modes have neither limit: they re-read everything at flush time).
//! - **PV mode is incremental mode plus batches**: [`ShadowPt::pv_apply`] writes each entry into
//!   the guest's own table and updates the shadow through the same path a tracked write takes,
//!   and [`ShadowPt::guest_wrote`] behaves as in incremental mode, so a PV guest that also
//!   writes its tables directly stays coherent.
//! - **Hypervisor VRAM is limited per VM** ([`ShadowPt::set_shadow_limit`], default
//!   [`DEFAULT_SHADOW_LIMIT`]); a table that does not fit is left absent and counted.

mod build;
pub mod hyp;
mod pv;

pub use pv::WALK_BUDGET;
mod track;
mod translate;
mod walk;

use std::collections::BTreeMap;

use gf100::{mmu, Target};

use crate::addr::HostVram;
use crate::guest_mem::GuestMem;
use crate::profile::ShadowMode;
use crate::vram_alloc::HypVram;

use build::{Books, Space};
use track::{Mem, RoleList, TableKind};
use walk::PtKind;

/// The page tables one guest write lands in, looked up by [`ShadowPt::local_write`] before the
/// write and applied by [`ShadowPt::guest_wrote_tables`] after it.
#[derive(Debug)]
pub(crate) struct TablesHit(RoleList);

/// Default of [`ShadowPt::set_shadow_limit`]: 256 MiB of hypervisor VRAM per VM (a VM mapping
/// its whole 6 GiB in small pages through one directory needs about 12 MiB).
pub const DEFAULT_SHADOW_LIMIT: u64 = 256 << 20;

/// A guest page directory as named by a guest instance block (PDB) or a TLB flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GuestPdb {
    /// Guest address of the page directory (guest VRAM address or GPA).
    pub addr: u64,
    /// Where it lives.
    pub target: Target,
}

/// What the shadow manager needs for one operation: the VM's memory (guest tables are read from
/// it, shadow tables written to physical VRAM through it) and the hypervisor VRAM allocator.
pub struct ShadowCtx<'a> {
    /// The VM's memory and the physical GPU.
    pub mem: GuestMem<'a>,
    /// Hypervisor-owned VRAM for shadow tables.
    pub hyp: &'a mut HypVram,
}

/// Where the physical GPU ends up for a VA, according to the shadow tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShadowTranslation {
    /// Physical VRAM or system memory (IOVA).
    pub target: Target,
    /// Physical VRAM address or IOVA of the byte at the VA.
    pub addr: u64,
    /// The page is read-only.
    pub read_only: bool,
    /// The page is supervisor-only (channels fault on it; the host's own mappings).
    pub supervisor: bool,
}

/// Counters of one VM's shadow page tables.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ShadowStats {
    /// Full rebuilds of a shadow address space.
    pub rebuilds: u64,
    /// Shadow PTEs written by whole-table walks: full rebuilds, and (incremental, PV) the walk
    /// of a table a changed PDE newly names.
    pub ptes_shadowed: u64,
    /// Single shadow entries (PDEs or PTEs) updated by incremental writes and PV ops.
    pub entry_updates: u64,
    /// Guest entries rejected (outside the slice or guest RAM, invalid target, a table at the
    /// hypervisor's PDE).
    pub violations: u64,
    /// Of those: guest tables named at the hypervisor's reserved PDE (`hyp::HYP_PDE`), never
    /// shadowed.
    pub hyp_pde_refused: u64,
    /// PV batches applied.
    pub pv_batches: u64,
    /// Guest pages currently write-tracked.
    pub tracked_pages: u64,
    /// Hypervisor VRAM used by shadow tables, bytes.
    pub shadow_bytes: u64,
    /// Shadow tables or directories that could not be allocated (hypervisor VRAM exhausted or
    /// the VM's limit reached); such a table is left absent.
    pub alloc_failures: u64,
}

/// Why a shadow could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShadowError {
    /// The page directory is not in the VM's memory.
    #[error("page directory {0:?} is outside the VM's memory")]
    BadPageDirectory(GuestPdb),
    /// Hypervisor VRAM is exhausted.
    #[error("out of hypervisor VRAM for shadow page tables")]
    OutOfMemory,
}

/// Result of a PV batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PvOutcome {
    /// Ops applied.
    pub applied: u32,
    /// Error code of the first rejected op (`gf100::pv::ERR_*`), 0 if none.
    pub error: u32,
    /// Shadow page directories whose physical TLB must be flushed now.
    pub flush: Vec<HostVram>,
}

/// One VM's shadow page tables.
#[derive(Debug)]
pub struct ShadowPt {
    mode: ShadowMode,
    spaces: BTreeMap<GuestPdb, Space>,
    books: Books,
}

impl ShadowPt {
    /// An empty set of shadows in `mode`.
    pub fn new(mode: ShadowMode) -> ShadowPt {
        let tracking = matches!(mode, ShadowMode::Incremental | ShadowMode::Pv);
        ShadowPt {
            mode,
            spaces: BTreeMap::new(),
            books: Books::new(tracking, DEFAULT_SHADOW_LIMIT),
        }
    }

    /// The mode.
    pub fn mode(&self) -> ShadowMode {
        self.mode
    }

    /// Limits the hypervisor VRAM this VM's shadows may use (directories and tables). Shadows
    /// already allocated are kept; later allocations beyond the limit fail.
    pub fn set_shadow_limit(&mut self, bytes: u64) {
        self.books.limit = bytes;
    }

    /// The hypervisor VRAM limit.
    pub fn shadow_limit(&self) -> u64 {
        self.books.limit
    }

    /// The shadow page directory (physical VRAM) for `pdb`, created and built on first use;
    /// reference-counted per call (pair with [`ShadowPt::detach`]).
    ///
    /// The guest directory must be 4 KiB aligned (a PDB cannot name anything else) and lie
    /// entirely (64 KiB) inside the VM's memory.
    pub fn attach(&mut self, cx: &mut ShadowCtx, pdb: GuestPdb) -> Result<HostVram, ShadowError> {
        if let Some(s) = self.spaces.get_mut(&pdb) {
            s.refs = s.refs.saturating_add(1);
            return Ok(HostVram(s.pd));
        }
        if !pdb.addr.is_multiple_of(gf100::PAGE_SIZE)
            || cx.mem.to_phys(pdb.target, pdb.addr, mmu::PD_SIZE).is_err()
        {
            return Err(ShadowError::BadPageDirectory(pdb));
        }
        let space = build::create(cx, &mut self.books, pdb).ok_or(ShadowError::OutOfMemory)?;
        let pd = space.pd;
        self.spaces.insert(pdb, space);
        Ok(HostVram(pd))
    }

    /// Drops one reference to the shadow of `pdb`; frees it with the last one.
    pub fn detach(&mut self, cx: &mut ShadowCtx, pdb: GuestPdb) {
        let Some(s) = self.spaces.get_mut(&pdb) else {
            log::debug!("shadow_pt: detach of {pdb:?}, which is not attached");
            return;
        };
        s.refs = s.refs.saturating_sub(1);
        if s.refs == 0 {
            if let Some(space) = self.spaces.remove(&pdb) {
                build::teardown(cx, &mut self.books, pdb, space);
            }
        }
    }

    /// The attached spaces a flush naming `pdb` applies to: same address, same memory (the
    /// TLB_FLUSH_VSPACE target bit "matches both SNOOP and NOSNOOP"); all of them for `None`.
    fn matching(&self, pdb: Option<GuestPdb>) -> Vec<GuestPdb> {
        self.spaces
            .keys()
            .filter(|k| names(pdb, k))
            .copied()
            .collect()
    }

    /// Starts (or restarts) the rebuild of the shadows of `pdbs` and does one budgeted step of
    /// each; returns the directories finished (for a physical TLB flush). The rest is done by
    /// [`ShadowPt::step`], one budget per call, before the VM's next submission of work that
    /// uses them (`crate::host::dispatch`).
    fn rebuild_budgeted(&mut self, cx: &mut ShadowCtx, pdbs: &[GuestPdb]) -> Vec<HostVram> {
        let mut out = Vec::new();
        for pdb in pdbs {
            if let Some(space) = self.spaces.get_mut(pdb) {
                space.dirty = false;
                build::set_rebuild_at(&mut self.books, space, Some(0));
                if build::rebuild_step(cx, &mut self.books, *pdb, space, build::REBUILD_BUDGET_PDES)
                {
                    out.push(HostVram(space.pd));
                }
            }
        }
        out
    }

    /// True while a rebuild of `pdb`'s shadow is in progress (its work must not run yet).
    pub fn pending(&self, pdb: GuestPdb) -> bool {
        self.spaces
            .get(&pdb)
            .is_some_and(|s| s.rebuild_at.is_some())
    }

    /// True while any rebuild is in progress.
    pub fn rebuilding(&self) -> bool {
        debug_assert_eq!(
            self.books.rebuilding,
            self.spaces
                .values()
                .filter(|s| s.rebuild_at.is_some())
                .count()
        );
        self.books.rebuilding > 0
    }

    /// One budgeted step of the first rebuild in progress; returns the directory if it
    /// finished (for a physical TLB flush).
    pub fn step(&mut self, cx: &mut ShadowCtx) -> Vec<HostVram> {
        let Some((pdb, space)) = self.spaces.iter_mut().find(|(_, s)| s.rebuild_at.is_some())
        else {
            return Vec::new();
        };
        if build::rebuild_step(cx, &mut self.books, *pdb, space, build::REBUILD_BUDGET_PDES) {
            vec![HostVram(space.pd)]
        } else {
            Vec::new()
        }
    }

    /// Rebuilds the shadows of `pdbs` fully and returns their directories.
    fn rebuild_all(&mut self, cx: &mut ShadowCtx, pdbs: &[GuestPdb]) -> Vec<HostVram> {
        let mut out = Vec::with_capacity(pdbs.len());
        for pdb in pdbs {
            if let Some(space) = self.spaces.get_mut(pdb) {
                build::rebuild(cx, &mut self.books, *pdb, space);
                space.dirty = false;
                out.push(HostVram(space.pd));
            }
        }
        out
    }

    /// A guest TLB flush (register 0x100cbc or MEM_OP in a pushbuffer); `None` = all of the VM's
    /// address spaces. Returns the shadow PDs whose physical TLB entries must be flushed now.
    ///
    /// Eager: rebuilds the named shadows — one budget of
    /// `REBUILD_BUDGET_PDES` entries now, the rest in later steps — and returns those
    /// finished. Lazy: marks them dirty and returns nothing ([`ShadowPt::before_submit`]
    /// rebuilds, with the same budget). Incremental and PV: the shadows are
    /// already current; returns them for the physical flush.
    pub fn tlb_flush(&mut self, cx: &mut ShadowCtx, pdb: Option<GuestPdb>) -> Vec<HostVram> {
        let pdbs = self.matching(pdb);
        match self.mode {
            ShadowMode::Eager => self.rebuild_budgeted(cx, &pdbs),
            ShadowMode::Lazy => {
                for p in &pdbs {
                    if let Some(s) = self.spaces.get_mut(p) {
                        s.dirty = true;
                    }
                }
                Vec::new()
            }
            ShadowMode::Incremental | ShadowMode::Pv => {
                self.tlb_flush_in_place(pdb).unwrap_or_default()
            }
        }
    }

    /// [`ShadowPt::tlb_flush`] where nothing is rebuilt: in incremental and PV modes, whose
    /// shadows are already current, the shadow page directories to flush physically; `None`
    /// in eager and lazy modes.
    pub fn tlb_flush_in_place(&self, pdb: Option<GuestPdb>) -> Option<Vec<HostVram>> {
        // One pass, one allocation: this runs at every guest TLB flush.
        matches!(self.mode, ShadowMode::Incremental | ShadowMode::Pv).then(|| {
            self.spaces
                .iter()
                .filter(|(k, _)| names(pdb, k))
                .map(|(_, s)| HostVram(s.pd))
                .collect()
        })
    }

    /// Called before work of a channel using `pdb` reaches the GPU (lazy mode rebuilds here).
    /// Returns the shadow PDs whose physical TLB entries must be flushed now.
    pub fn before_submit(&mut self, cx: &mut ShadowCtx, pdb: GuestPdb) -> Vec<HostVram> {
        match self.spaces.get(&pdb) {
            Some(s) if self.mode == ShadowMode::Lazy && s.dirty => {
                self.rebuild_budgeted(cx, &[pdb])
            }
            Some(s) if s.rebuild_at.is_some() => self.step(cx),
            _ => Vec::new(),
        }
    }

    /// Rebuilds the named shadows (all for `None`) fully now, whatever the mode, and returns
    /// them for a physical flush. For incremental and PV modes this re-synchronizes tables the
    /// guest changed without the device model seeing it (writes by the GPU itself).
    pub fn resync(&mut self, cx: &mut ShadowCtx, pdb: Option<GuestPdb>) -> Vec<HostVram> {
        let pdbs = self.matching(pdb);
        self.rebuild_all(cx, &pdbs)
    }

    /// A guest write of `len` bytes at `addr` in `target` has just landed in guest memory
    /// (through PRAMIN, BAR1 or BAR3). In incremental mode, entries of tracked tables are
    /// re-shadowed at once.
    ///
    /// Incremental and PV modes: exactly the entries the write touched are re-shadowed (a
    /// partial write re-reads the whole entry); a changed PDE re-walks the tables it newly
    /// names. Eager and lazy modes: nothing (the next rebuild reads everything).
    pub fn guest_wrote(&mut self, cx: &mut ShadowCtx, target: Target, addr: u64, len: u64) {
        if !self.books.tracking || len == 0 {
            return;
        }
        let end = addr.saturating_add(len);
        let roles = self.books.tracker.roles_list(Mem::of(target), addr, end);
        for role in roles {
            let Some(space) = self.spaces.get_mut(&role.pdb) else {
                continue;
            };
            let books = &mut self.books;
            match role.kind {
                TableKind::Pd => build::rewrite_pdes(cx, books, role.pdb, space, addr, end),
                TableKind::Small(i) => build::rewrite_ptes(
                    &cx.mem,
                    books,
                    role.pdb,
                    space,
                    i,
                    PtKind::Small,
                    addr,
                    end,
                    None,
                ),
                TableKind::Large(i) => build::rewrite_ptes(
                    &cx.mem,
                    books,
                    role.pdb,
                    space,
                    i,
                    PtKind::Large,
                    addr,
                    end,
                    None,
                ),
            }
        }
    }

    /// Looks up, once, the tables a guest write of `len` bytes at `addr` lands in, for the fast
    /// path: `None` if it reaches one of the VM's shadowed page directories — their shadow
    /// tables come and go with their PDEs, allocated from the hypervisor VRAM the host shares
    /// out, so only [`ShadowPt::guest_wrote`] (with the host lock) may apply such a write —,
    /// else the page tables, for [`ShadowPt::guest_wrote_tables`] once the write has landed.
    pub(crate) fn local_write(&self, target: Target, addr: u64, len: u64) -> Option<TablesHit> {
        if !self.books.tracking || len == 0 {
            return Some(TablesHit(RoleList::One(None)));
        }
        let roles = self
            .books
            .tracker
            .roles_list(Mem::of(target), addr, addr.saturating_add(len));
        let directory = match &roles {
            RoleList::One(r) => r.is_some_and(|r| r.kind == TableKind::Pd),
            RoleList::Many(it) => it.as_slice().iter().any(|r| r.kind == TableKind::Pd),
        };
        (!directory).then_some(TablesHit(roles))
    }

    /// [`ShadowPt::guest_wrote`] for a write that reaches no page directory (`hit`, from
    /// [`ShadowPt::local_write`] for the same write): the shadow entries of the page tables it
    /// covers are rewritten in place, which needs the VM's memory and the GPU only — no
    /// hypervisor VRAM is allocated or freed — so the VM's lock alone is enough (the fast path's
    /// page-table writes, `host::local`).
    /// `data` is what the write put at `addr`.
    pub(crate) fn guest_wrote_tables(
        &mut self,
        mem: &GuestMem,
        hit: TablesHit,
        addr: u64,
        data: &[u8],
    ) {
        let end = addr.saturating_add(data.len() as u64);
        for role in hit.0 {
            let Some(space) = self.spaces.get_mut(&role.pdb) else {
                continue;
            };
            let (i, kind) = match role.kind {
                TableKind::Small(i) => (i, PtKind::Small),
                TableKind::Large(i) => (i, PtKind::Large),
                TableKind::Pd => {
                    debug_assert!(false, "a page directory write on the local path");
                    continue;
                }
            };
            build::rewrite_ptes(
                mem,
                &mut self.books,
                role.pdb,
                space,
                i,
                kind,
                addr,
                end,
                Some(data),
            );
        }
    }

    /// True if the guest page at `page` (4 KiB aligned) holds one of the VM's page directories
    /// or tables (writes to it must be seen by the device model).
    ///
    /// Only incremental and PV modes track pages; eager and lazy modes answer false (they
    /// need to see no writes).
    pub fn is_tracked(&self, target: Target, page: u64) -> bool {
        self.books.tracker.is_tracked(Mem::of(target), page)
    }

    /// A number that changes whenever the set of pages [`ShadowPt::is_tracked`] reports changes
    /// (monotonic), so a VMM that write-protects tracked pages knows when to look again.
    pub fn tracking_version(&self) -> u64 {
        self.books.tracker.version()
    }

    /// Applies a batch of para-virtual ops.
    ///
    /// PV mode only (any other mode answers `ERR_NOT_AVAILABLE` and applies nothing). See the
    /// `pv` part for the rules.
    pub fn pv_apply(&mut self, cx: &mut ShadowCtx, ops: &[gf100::pv::Op]) -> PvOutcome {
        pv::apply(self, cx, ops)
    }

    /// Where `va` leads through the shadow of `pdb` (for tests and checks).
    pub fn translate(&self, cx: &ShadowCtx, pdb: GuestPdb, va: u64) -> Option<ShadowTranslation> {
        let space = self.spaces.get(&pdb)?;
        walk::resolve(cx.mem.phys, space.pd, va)
    }

    /// True when the shadow of `pdb` may not match the guest's tables yet (lazy mode between a
    /// guest TLB flush and the rebuild before the next submission, or a rebuild in progress).
    pub fn is_stale(&self, pdb: GuestPdb) -> bool {
        self.spaces
            .get(&pdb)
            .is_some_and(|s| (self.mode == ShadowMode::Lazy && s.dirty) || s.rebuild_at.is_some())
    }

    /// The shadow page directory of `pdb`, if attached.
    pub fn shadow_pd(&self, pdb: GuestPdb) -> Option<HostVram> {
        self.spaces.get(&pdb).map(|s| HostVram(s.pd))
    }

    /// Counters.
    pub fn stats(&self) -> ShadowStats {
        ShadowStats {
            tracked_pages: self.books.tracker.len(),
            ..self.books.stats
        }
    }

    /// Frees every shadow table (VM teardown).
    pub fn destroy(&mut self, cx: &mut ShadowCtx) {
        for (pdb, space) in std::mem::take(&mut self.spaces) {
            build::teardown(cx, &mut self.books, pdb, space);
        }
        if let Some(t) = self.books.hyp.lpt.take() {
            self.books.free(cx, t, mmu::LPT_SIZE);
        }
        self.books.tracker.clear();
    }
}

/// Whether a flush naming `pdb` (all of the VM's address spaces for `None`) covers the shadowed
/// address space `k`: the same directory address, with both system-memory targets alike (as
/// TLB_FLUSH_VSPACE matches them).
fn names(pdb: Option<GuestPdb>, k: &GuestPdb) -> bool {
    pdb.is_none_or(|p| k.addr == p.addr && Mem::of(k.target) == Mem::of(p.target))
}

#[cfg(test)]
mod tests;
