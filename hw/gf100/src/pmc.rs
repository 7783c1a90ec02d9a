//! PMC, the master control block at BAR0 0x000000: identity, engine enables, interrupt aggregation.
//!
//! Sources: ENVY `bus/pmc.xml`, `docs/hw/bus/pmc.rst`; NV-MC `nvkm/subdev/mc/gf100.c`, `nv50.c`.
//! The INTR bits below were checked against nouveau's `gf100_mc_intr` table (0x20 CE0, 0x40 CE1,
//! 0x100 FIFO, 0x1000 GR, 0x100000 TIMER, 0x10000000 BUS, 0x80000000 SW) and
//! `gf100_mc_msi_rearm` (`wr32(0x088704, 0)`).

/// BOOT_0 / ID: chip identity.
pub const BOOT_0: u32 = 0x000000;
/// Reset value of BOOT_0 on a Quadro 6000 (GXEN `nvc0.h` `NVC0_REG0`, read off the real card).
pub const BOOT_0_QUADRO_6000: u32 = 0x0c0c_00a3;
/// ENDIAN: reads 0 on a little-endian setup; writing with bit 24 set flips it.
pub const ENDIAN: u32 = 0x000004;
/// INTR_HOST: pending interrupts, one bit per unit (bits 0-30 read-only, bit 31 SOFTWARE r/w).
pub const INTR_HOST: u32 = 0x000100;
/// INTR_NRHOST: non-redirectable host interrupts.
pub const INTR_NRHOST: u32 = 0x000104;
/// INTR_EN_HOST: bit 0 enables hardware interrupts, bit 1 the software one.
pub const INTR_EN_HOST: u32 = 0x000140;
/// INTR_EN_NRHOST: same layout as INTR_EN_HOST.
pub const INTR_EN_NRHOST: u32 = 0x000144;
/// ENABLE: per-engine master enable (nouveau init writes 0xffffffff).
pub const ENABLE: u32 = 0x000200;
/// SPOON_ENABLE: PBDMA enables, bit i = PBDMA i.
pub const SPOON_ENABLE: u32 = 0x000204;
/// INTR_MASK_HOST (GT215+): a 0 bit masks that bit of INTR_HOST.
pub const INTR_MASK_HOST: u32 = 0x000640;
/// MSI re-arm register (old nouveau `mc/nvc0.c` writes 0 here after handling an interrupt).
pub const MSI_REARM: u32 = 0x088704;

/// INTR_EN bit 0: hardware interrupts enabled.
pub const INTR_EN_HARDWARE: u32 = 1 << 0;
/// INTR_EN bit 1: the software interrupt enabled.
pub const INTR_EN_SOFTWARE: u32 = 1 << 1;

/// INTR bit 5: PCOPY0.
pub const INTR_PCOPY0: u32 = 1 << 5;
/// INTR bit 6: PCOPY1.
pub const INTR_PCOPY1: u32 = 1 << 6;
/// INTR bit 8: PFIFO.
pub const INTR_PFIFO: u32 = 1 << 8;
/// INTR bit 12: PGRAPH.
pub const INTR_PGRAPH: u32 = 1 << 12;
/// INTR bit 20: PTIMER.
pub const INTR_PTIMER: u32 = 1 << 20;
/// INTR bit 28: PBUS.
pub const INTR_PBUS: u32 = 1 << 28;
/// INTR bit 31: SOFTWARE (read/write).
pub const INTR_SOFTWARE: u32 = 1 << 31;

/// ENABLE bit 6: PCOPY0.
pub const ENABLE_PCOPY0: u32 = 1 << 6;
/// ENABLE bit 7: PCOPY1.
pub const ENABLE_PCOPY1: u32 = 1 << 7;
/// ENABLE bit 8: PFIFO.
pub const ENABLE_PFIFO: u32 = 1 << 8;
/// ENABLE bit 12: PGRAPH.
pub const ENABLE_PGRAPH: u32 = 1 << 12;
/// ENABLE bit 16: PTIMER.
pub const ENABLE_PTIMER: u32 = 1 << 16;
/// ENABLE bit 29: PFFB (memory interface / MMU).
pub const ENABLE_PFFB: u32 = 1 << 29;
/// What nouveau writes to ENABLE at init ("everything on", `nv50_mc_init`).
pub const ENABLE_ALL: u32 = 0xffff_ffff;

/// Decodes the chipset field of BOOT_0 (bits 20-28), as nouveau's `nvkm_device_ctor` does.
pub const fn boot0_chipset(boot0: u32) -> u32 {
    (boot0 & 0x1ff0_0000) >> 20
}

/// Decodes the stepping field of BOOT_0 (bits 0-7).
pub const fn boot0_stepping(boot0: u32) -> u32 {
    boot0 & 0xff
}

/// True if BOOT_0 names a Fermi (chipset 0xc0..0xcf), the test nouveau applies.
pub const fn boot0_is_fermi(boot0: u32) -> bool {
    boot0 & 0x1f00_0000 != 0 && boot0_chipset(boot0) & 0x1f0 == 0x0c0
}

/// PMC INTR_HOST as read at 0x100 on a GPU whose only modeled interrupt source is PFIFO: bit 8
/// while PFIFO INTR & INTR_EN is nonzero, bit 31 when software-raised, then masked by
/// INTR_MASK_HOST (NV-MC `gf100_mc_intr`).
pub const fn intr_host(pfifo_intr: u32, pfifo_intr_en: u32, software: bool, mask: u32) -> u32 {
    let mut v = 0;
    if pfifo_intr & pfifo_intr_en != 0 {
        v |= INTR_PFIFO;
    }
    if software {
        v |= INTR_SOFTWARE;
    }
    v & mask
}

/// Whether the interrupt line is asserted for an INTR_HOST value and INTR_EN_HOST: hardware
/// bits need INTR_EN bit 0, the software bit needs bit 1.
pub const fn line_asserted(intr_host: u32, intr_en_host: u32) -> bool {
    let hw = intr_host & !INTR_SOFTWARE != 0 && intr_en_host & INTR_EN_HARDWARE != 0;
    let sw = intr_host & INTR_SOFTWARE != 0 && intr_en_host & INTR_EN_SOFTWARE != 0;
    hw || sw
}
