//! Walking page tables: reading the guest's (GXEN `shadow_page_table.cc`, whose scan reads the
//! 64 KiB page directory and then every table a PDE names) and resolving a VA through the
//! shadow ones (GXEN `software_page_table.cc::resolve`, the same order as `gpuvm_sim::mmu`:
//! small-page table first, then the large-page table).
//!
//! Guest tables are always read in one piece — a whole page directory, or the part of a table
//! the PDE's PT_SIZE makes valid — through [`GuestMem`], so a table that is not entirely inside
//! the VM's memory is refused as a whole.

use gf100::mmu::{self, Pde, PtSize, Pte};
use gf100::Target;

use super::track::Mem;
use super::ShadowTranslation;
use crate::addr::HostVram;
use crate::guest_mem::{GuestMem, Violation};
use crate::phys::PhysicalGpu;

/// Which table of a PDE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum PtKind {
    /// The small-page (4 KiB) table, PDE high word.
    Small,
    /// The large-page (128 KiB) table, PDE low word.
    Large,
}

impl PtKind {
    /// Size of the pages the table maps.
    pub(crate) fn page_size(self) -> u64 {
        match self {
            PtKind::Small => mmu::SMALL_PAGE_SIZE,
            PtKind::Large => mmu::LARGE_PAGE_SIZE,
        }
    }

    /// Entries valid under a PDE with PT_SIZE `size` (32768 >> n small, 1024 >> n large).
    pub(crate) fn entries(self, size: PtSize) -> u64 {
        size.coverage() / self.page_size()
    }
}

/// A guest page table as a PDE names it: where it lives and how many of its entries the PDE's
/// PT_SIZE makes valid (only those are read, shadowed and tracked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GuestTable {
    /// Memory target of the table.
    pub target: Target,
    /// Guest address of the table.
    pub addr: u64,
    /// Valid entries.
    pub entries: u64,
}

impl GuestTable {
    /// The `kind` table of `pde`, if present.
    pub(crate) fn of(pde: &Pde, kind: PtKind) -> Option<GuestTable> {
        let r = match kind {
            PtKind::Small => pde.small,
            PtKind::Large => pde.large,
        }?;
        Some(GuestTable {
            target: r.target,
            addr: r.addr,
            entries: kind.entries(pde.size),
        })
    }

    /// Bytes of the valid part.
    pub(crate) fn bytes(&self) -> u64 {
        self.entries * mmu::ENTRY_SIZE
    }

    /// The memory it lives in.
    pub(crate) fn mem(&self) -> Mem {
        Mem::of(self.target)
    }

    /// True if `other` is the same table (same memory, address and extent; the two system
    /// memory targets count as the same memory).
    pub(crate) fn same(&self, other: &GuestTable) -> bool {
        self.mem() == other.mem() && self.addr == other.addr && self.entries == other.entries
    }

    /// The entries of this table written by a guest write of `[addr, end)`: `(first, count)`.
    pub(crate) fn written(&self, addr: u64, end: u64) -> Option<(u64, u64)> {
        written_entries(self.addr, self.entries, addr, end)
    }
}

/// The entries of a table of `entries` entries at `table` touched by a write of `[addr, end)`,
/// as `(first, count)`.
pub(crate) fn written_entries(table: u64, entries: u64, addr: u64, end: u64) -> Option<(u64, u64)> {
    let table_end = table.checked_add(entries.checked_mul(mmu::ENTRY_SIZE)?)?;
    let lo = addr.max(table);
    let hi = end.min(table_end);
    if lo >= hi {
        return None;
    }
    let first = (lo - table) / mmu::ENTRY_SIZE;
    let last = (hi - 1 - table) / mmu::ENTRY_SIZE;
    Some((first, last - first + 1))
}

/// Reads `count` entries from entry `first` of the guest table at `table` in `target`, in one
/// read, into `buf` (resized to `count * 8` bytes). `count` comes from the callers (at most a
/// page directory or a full small-page table), never from guest data; larger counts are refused.
pub(crate) fn read_entries(
    mem: &GuestMem,
    target: Target,
    table: u64,
    first: u64,
    count: u64,
    buf: &mut Vec<u8>,
) -> Result<(), Violation> {
    if count > mmu::SPT_ENTRIES.max(mmu::PD_ENTRIES) {
        return Err(Violation::InvalidTarget);
    }
    // An overflowing start saturates, and `GuestMem` refuses a range that wraps.
    let start = table.saturating_add(first.saturating_mul(mmu::ENTRY_SIZE));
    buf.clear();
    buf.resize((count * mmu::ENTRY_SIZE) as usize, 0);
    mem.read(target, start, buf)
}

/// The little-endian u64 entries of `buf` (whose length is a multiple of 8).
pub(crate) fn entries(buf: &[u8]) -> impl Iterator<Item = u64> + '_ {
    buf.chunks_exact(8).map(le64)
}

/// A little-endian u64 from an 8-byte chunk.
pub(crate) fn le64(c: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&c[..8]);
    u64::from_le_bytes(b)
}

/// Reads a u64 of physical VRAM.
fn vram_u64(phys: &dyn PhysicalGpu, addr: u64) -> u64 {
    let mut b = [0u8; 8];
    phys.read_vram(HostVram(addr), &mut b);
    u64::from_le_bytes(b)
}

/// A present PTE of a shadow table (which lives in VRAM), `Err` for an undecodable one.
fn shadow_pte(phys: &dyn PhysicalGpu, table: mmu::PtRef, index: u64) -> Result<Option<Pte>, ()> {
    if table.target != Target::Vram {
        return Ok(None);
    }
    let raw = vram_u64(phys, table.addr + index * mmu::ENTRY_SIZE);
    Pte::decode(raw).map_err(|_| ())
}

/// Where `va` leads through the shadow page directory at `pd` in physical VRAM, walked exactly
/// as the MMU does (`gpuvm_sim::mmu::Core::walk`): no tables or beyond PT_SIZE → none; the
/// small-page PTE if present, else the large-page PTE.
pub(crate) fn resolve(phys: &dyn PhysicalGpu, pd: u64, va: u64) -> Option<ShadowTranslation> {
    if va >= mmu::VA_LIMIT {
        return None;
    }
    let pde = Pde::decode(vram_u64(phys, pd + mmu::pde_index(va) * mmu::ENTRY_SIZE));
    if va & (mmu::PDE_COVERAGE - 1) >= pde.size.coverage() {
        return None;
    }
    if let Some(spt) = pde.small {
        if let Some(pte) = shadow_pte(phys, spt, mmu::spt_index(va)).ok()? {
            return Some(ShadowTranslation {
                target: pte.target,
                addr: pte.addr + (va & (mmu::SMALL_PAGE_SIZE - 1)),
                read_only: pte.read_only,
                supervisor: pte.supervisor,
            });
        }
    }
    if let Some(lpt) = pde.large {
        if let Some(pte) = shadow_pte(phys, lpt, mmu::lpt_index(va)).ok()? {
            return Some(ShadowTranslation {
                target: pte.target,
                addr: pte.addr + (va & (mmu::LARGE_PAGE_SIZE - 1)),
                read_only: pte.read_only,
                supervisor: pte.supervisor,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_entries_clip_to_the_table() {
        assert_eq!(written_entries(0x1000, 4, 0x1000, 0x1008), Some((0, 1)));
        assert_eq!(
            written_entries(0x1000, 4, 0x1004, 0x100c),
            Some((0, 2)),
            "half entries count"
        );
        assert_eq!(written_entries(0x1000, 4, 0x0, 0x10_0000), Some((0, 4)));
        assert_eq!(written_entries(0x1000, 4, 0x1020, 0x1028), None);
        assert_eq!(written_entries(0x1000, 4, 0x0, 0x1000), None);
        assert_eq!(written_entries(u64::MAX - 8, 4, 0, u64::MAX), None);
    }

    #[test]
    fn entry_counts_follow_pt_size() {
        assert_eq!(PtKind::Small.entries(PtSize::Full), mmu::SPT_ENTRIES);
        assert_eq!(PtKind::Large.entries(PtSize::Full), mmu::LPT_ENTRIES);
        assert_eq!(PtKind::Small.entries(PtSize::Eighth), 4096);
        assert_eq!(PtKind::Large.entries(PtSize::Half), 512);
    }
}
