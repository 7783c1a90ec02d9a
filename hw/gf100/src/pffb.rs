//! PFFB VM block: MMU configuration and TLB invalidation (0x100c80-0x100cff).
//!
//! Sources: ENVY `memory/gf100_pffb.xml`; NV-VMM `gf100_vmm_invalidate` (identical in the old
//! `gf100_vm_flush` and in GXEN `channel.cc`). envytools calls 0x100c80 CFG, nouveau polls it as a
//! flush status; the model implements both (research notes, open question 1).

/// Sysmem flush page address >> 8 (nouveau `gf100_fb_sysmem_flush_page_init`).
pub const SYSMEM_FLUSH_PAGE: u32 = 0x100c10;
/// VM.CFG / flush status. Bit 0: large page size (0 = 128 KiB, 1 = 64 KiB). Bits 16-23 read as
/// free flush slots (nonzero when a flush may be queued); bit 15 reads 1 once a flush was queued.
pub const VM_CFG: u32 = 0x100c80;
/// TLB_FLUSH_PAGE: bits 4-31 virtual address >> 12 (ENVY; single-page flush; unused by nouveau).
pub const TLB_FLUSH_PAGE: u32 = 0x100cb4;
/// TLB_FLUSH_VSPACE: bits 4-31 page-directory address >> 12, bits 0-1 target as nouveau writes
/// it (NV-VMM `gf100_vmm_invalidate`: `((pd >> 12) << 4) | 0/2/3`). ENVY
/// `memory/gf100_pffb.xml` only names bit 1 TARGET (0 VRAM, 1 SYSRAM, "matches both SNOOP and
/// NOSNOOP"), consistent with nouveau's 2/3.
pub const TLB_FLUSH_VSPACE: u32 = 0x100cb8;
/// TLB_FLUSH_TRIGGER: bit 0 all pages, bit 1 all page directories, bit 2 hub only, bit 31 trigger
/// (ENVY PAGE / VSPACE / SET / TRIGGER; NV-VMM writes `0x80000000 | type`).
pub const TLB_FLUSH_TRIGGER: u32 = 0x100cbc;

/// VM_CFG bit 0: large page size is 64 KiB (0 = 128 KiB, the GF100 default) (ENVY
/// LARGE_PAGE_SIZE; NV-FB `gf100_fb_init_page`).
pub const VM_CFG_LARGE_PAGE_64K: u32 = 1 << 0;
/// VM_CFG bits 16-23: free flush slots, polled by nouveau before a flush (NV-VMM: "Looks like
/// maybe a 'free flush slots' counter"; **(UNCERTAIN)**, ENVY does not name these bits).
pub const VM_CFG_FLUSH_SLOTS_MASK: u32 = 0x00ff_0000;
/// VM_CFG bit 15: flush queued, polled by nouveau after a flush (NV-VMM: "Wait for flush to be
/// queued?"; **(UNCERTAIN)**).
pub const VM_CFG_FLUSH_QUEUED: u32 = 1 << 15;

/// Trigger type bit: flush all pages (nouveau `PAGE_ALL`).
pub const FLUSH_PAGE_ALL: u32 = 1 << 0;
/// Trigger type bit: flush every page directory, ignoring TLB_FLUSH_VSPACE (`ALL_PDB`).
pub const FLUSH_ALL_PDB: u32 = 1 << 1;
/// Trigger type bit: hub only (used for BAR VMs).
pub const FLUSH_HUB_ONLY: u32 = 1 << 2;
/// Trigger bit.
pub const FLUSH_TRIGGER: u32 = 1 << 31;

/// Encodes TLB_FLUSH_VSPACE for a page directory at `pd` in `target` (as nouveau:
/// `((pd >> 12) << 4) | target`).
pub const fn vspace_encode(pd: u64, target: crate::Target) -> u32 {
    (((pd >> 12) as u32) << 4) | target.bits()
}

/// Decodes TLB_FLUSH_VSPACE into (page-directory address, target); `None` for target 1.
pub const fn vspace_decode(value: u32) -> Option<(u64, crate::Target)> {
    match crate::Target::from_bits(value) {
        Some(t) => Some((((value >> 4) as u64) << 12, t)),
        None => None,
    }
}
