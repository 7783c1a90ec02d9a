//! PBUS host-memory registers: the PRAMIN ("PMEM") window and the BAR1/BAR3 VM bindings, and the
//! PFLUSH BAR write flush.
//!
//! Sources: ENVY `bus/pbus.xml` (`HOST_MEM` at 0x1700, variant GF100-); NV-IMEM `instmem/nv50.c`;
//! NV-BAR `bar/gf100.c`, `bar/g84.c`.

/// PMEM: base of the 1 MiB PRAMIN window. Bits 0-23: address >> 16; bits 24-25: target (ENVY
/// `bus/pbus.xml` HOST_MEM.PMEM, variant NVC0-: OFFSET `shr=16`, TARGET; NV-IMEM writes
/// `base >> 16` with the window kept 1 MiB aligned).
pub const PMEM: u32 = 0x001700;
/// BAR1 binding: bits 0-27 instance block address >> 12, bits 28-29 target, bit 30 unknown,
/// bit 31 MODE 0 VRAM / 1 VM (ENVY `bus/pbus.xml` HOST_MEM.BAR1, variant NVC0-; NV-BAR
/// `gf100_bar_bar1_init`: `0x80000000 | inst >> 12`).
pub const BAR1_INST: u32 = 0x001704;
/// BAR3 binding: same layout as [`BAR1_INST`] (ENVY HOST_MEM.BAR3). Bit 30 (ENVY `UNK30`):
/// current nouveau sets it only with the `NvBar2Halve` option (`gf100_bar_bar2_init`), while
/// nouveau 4.x always wrote `0xc0000000 | inst >> 12` here — its meaning is **(UNCERTAIN)**;
/// decoders ignore it.
pub const BAR3_INST: u32 = 0x001714;

/// First BAR0 offset of the PRAMIN window (ENVY `mmio.rst`: 0x700000 PMEM; NV-IMEM accesses
/// `0x700000 + off`).
pub const PRAMIN_BASE: u32 = 0x700000;
/// Size of the PRAMIN window (1 MiB; ENVY pbus.xml: "the 1MB PMEM window at 0x700000").
pub const PRAMIN_SIZE: u32 = 0x100000;

/// BAR binding bit 31: translate through the VM of the bound instance block (0 = direct VRAM;
/// ENVY MODE 0 VRAM / 1 VM; nouveau's fini clears only this bit).
pub const BAR_INST_VM_MODE: u32 = 1 << 31;

/// PFLUSH trigger/status register (NV-BAR `g84_bar_flush`): write 1 to flush BAR writes; bit 1
/// reads 1 while the flush is in progress.
pub const PFLUSH: u32 = 0x070000;
/// PFLUSH: write this to trigger (NV-BAR `g84_bar_flush`: `wr32(0x070000, 0x00000001)`).
pub const PFLUSH_TRIGGER: u32 = 1;
/// PFLUSH: busy bit (NV-BAR `g84_bar_flush` polls until `!(rd32(0x070000) & 0x00000002)`).
pub const PFLUSH_BUSY: u32 = 1 << 1;

/// Encodes a PMEM register value for a window starting at `addr` (64 KiB granularity).
pub const fn pmem_encode(addr: u64, target: crate::Target) -> u32 {
    ((addr >> 16) as u32 & 0x00ff_ffff) | (target.bits() << 24)
}

/// Decodes a PMEM register value into (window base address, target); `None` for target 1.
pub const fn pmem_decode(value: u32) -> Option<(u64, crate::Target)> {
    match crate::Target::from_bits(value >> 24) {
        Some(t) => Some((((value & 0x00ff_ffff) as u64) << 16, t)),
        None => None,
    }
}

/// Encodes a BAR1/BAR3 binding in VM mode for an instance block at `inst` in `target`.
pub const fn bar_inst_encode(inst: u64, target: crate::Target) -> u32 {
    BAR_INST_VM_MODE | ((inst >> 12) as u32 & 0x0fff_ffff) | (target.bits() << 28)
}

/// Decodes a BAR1/BAR3 binding: `Some((instance address, target))` when VM mode is on and the
/// target is valid, `None` otherwise (direct mode or invalid target).
pub const fn bar_inst_decode(value: u32) -> Option<(u64, crate::Target)> {
    if value & BAR_INST_VM_MODE == 0 {
        return None;
    }
    match crate::Target::from_bits(value >> 28) {
        Some(t) => Some((((value & 0x0fff_ffff) as u64) << 12, t)),
        None => None,
    }
}

/// BAR binding bit 30 (ENVY `UNK30`; see [`BAR3_INST`]). With [`BAR_INST_VM_MODE`] it is the part
/// of a binding word that is not the instance pointer: an MMU fault of a BAR reports the binding
/// word without these two bits as its instance (the layout of a channel-table instance word).
pub const BAR_INST_UNK30: u32 = 1 << 30;
