//! Shadow GPU page tables (GPUvm §"GPU shadow page table"): for every guest page directory a
//! channel uses, the device model keeps a shadow copy in hypervisor VRAM whose entries are the
//! guest's entries translated and validated — VRAM pages moved into the VM's slice, system pages
//! moved into the VM's DMA window, anything else dropped. The physical GPU only ever walks shadows.
//!
//! Four modes keep shadows up to date (all producing identical shadow contents):
//! `eager` rebuilds on every guest TLB flush; `lazy` marks dirty and rebuilds before the next
//! submission; `incremental` write-tracks the guest's table pages and updates one shadow entry
//! per guest entry write; `pv` applies batches of entry writes sent through the para-virtual
//! interface (`gf100::pv`).
//!
//! PLACEHOLDER API — being implemented; every body below is replaced by the real mechanism.

use gf100::Target;

use crate::addr::HostVram;
use crate::guest_mem::GuestMem;
use crate::profile::ShadowMode;
use crate::vram_alloc::RangeAllocator;

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
    pub hyp: &'a mut RangeAllocator,
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
}

/// Counters of one VM's shadow page tables.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ShadowStats {
    /// Full rebuilds of a shadow address space.
    pub rebuilds: u64,
    /// Shadow PTEs written by rebuilds.
    pub ptes_shadowed: u64,
    /// Single shadow entries updated (incremental writes, PV ops).
    pub entry_updates: u64,
    /// Guest entries rejected (outside the slice or guest RAM, invalid target).
    pub violations: u64,
    /// PV batches applied.
    pub pv_batches: u64,
    /// Guest pages currently write-tracked.
    pub tracked_pages: u64,
    /// Hypervisor VRAM used by shadow tables, bytes.
    pub shadow_bytes: u64,
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
}

impl ShadowPt {
    /// An empty set of shadows in `mode`.
    pub fn new(mode: ShadowMode) -> ShadowPt {
        ShadowPt { mode }
    }

    /// The mode.
    pub fn mode(&self) -> ShadowMode {
        self.mode
    }

    /// The shadow page directory (physical VRAM) for `pdb`, created and built on first use;
    /// reference-counted per call (pair with [`ShadowPt::detach`]).
    pub fn attach(&mut self, _cx: &mut ShadowCtx, _pdb: GuestPdb) -> Result<HostVram, ShadowError> {
        todo!("shadow_pt::attach")
    }

    /// Drops one reference to the shadow of `pdb`; frees it with the last one.
    pub fn detach(&mut self, _cx: &mut ShadowCtx, _pdb: GuestPdb) {
        todo!("shadow_pt::detach")
    }

    /// A guest TLB flush (register 0x100cbc or MEM_OP in a pushbuffer); `None` = all of the VM's
    /// address spaces. Returns the shadow PDs whose physical TLB entries must be flushed now.
    pub fn tlb_flush(&mut self, _cx: &mut ShadowCtx, _pdb: Option<GuestPdb>) -> Vec<HostVram> {
        todo!("shadow_pt::tlb_flush")
    }

    /// Called before work of a channel using `pdb` reaches the GPU (lazy mode rebuilds here).
    /// Returns the shadow PDs whose physical TLB entries must be flushed now.
    pub fn before_submit(&mut self, _cx: &mut ShadowCtx, _pdb: GuestPdb) -> Vec<HostVram> {
        todo!("shadow_pt::before_submit")
    }

    /// A guest write of `len` bytes at `addr` in `target` has just landed in guest memory
    /// (through PRAMIN, BAR1 or BAR3). In incremental mode, entries of tracked tables are
    /// re-shadowed at once.
    pub fn guest_wrote(&mut self, _cx: &mut ShadowCtx, _target: Target, _addr: u64, _len: u64) {
        todo!("shadow_pt::guest_wrote")
    }

    /// True if the guest page at `page` (4 KiB aligned) holds one of the VM's page directories
    /// or tables (writes to it must be seen by the device model).
    pub fn is_tracked(&self, _target: Target, _page: u64) -> bool {
        todo!("shadow_pt::is_tracked")
    }

    /// Applies a batch of para-virtual ops.
    pub fn pv_apply(&mut self, _cx: &mut ShadowCtx, _ops: &[gf100::pv::Op]) -> PvOutcome {
        todo!("shadow_pt::pv_apply")
    }

    /// Where `va` leads through the shadow of `pdb` (for tests and checks).
    pub fn translate(
        &self,
        _cx: &ShadowCtx,
        _pdb: GuestPdb,
        _va: u64,
    ) -> Option<ShadowTranslation> {
        todo!("shadow_pt::translate")
    }

    /// Counters.
    pub fn stats(&self) -> ShadowStats {
        ShadowStats::default()
    }

    /// Frees every shadow table (VM teardown).
    pub fn destroy(&mut self, _cx: &mut ShadowCtx) {
        todo!("shadow_pt::destroy")
    }
}
