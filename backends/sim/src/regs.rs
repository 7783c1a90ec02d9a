//! The simple BAR0 registers of the simulated GF100: PMC identity and enables, PTIMER, the
//! memory-controller registers nouveau sizes VRAM with (PFB), the PFFB VM configuration and TLB
//! flush registers, and the PFLUSH BAR write flush. (Interrupt registers live in `intr`, PBUS
//! windows in `bar`, PFIFO in `pfifo`.)
//!
//! PTIMER reads the simulator's clock: `TIME_HIGH:TIME_LOW` is the clock's nanoseconds with the
//! low 5 bits cleared, as on hardware (31.25 MHz tick). Writes to the time registers are accepted
//! and ignored, so the counter stays monotonic. The ALARM interrupt is not modelled.

use gf100::{pbus, pfb, pffb, pmc, ptimer, Target};

/// A TLB flush requested through TLB_FLUSH_TRIGGER (0x100cbc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlbFlush {
    /// Every translation of every page directory.
    All,
    /// Every translation of one page directory.
    Pd {
        /// Page-directory address.
        pd: u64,
        /// VRAM or system memory (both system targets match).
        target: Target,
    },
    /// One virtual page of one page directory.
    Page {
        /// Page-directory address.
        pd: u64,
        /// VRAM or system memory.
        target: Target,
        /// The virtual address.
        va: u64,
    },
    /// One virtual page in every page directory.
    PageAllPd {
        /// The virtual address.
        va: u64,
    },
}

/// What a register write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegWrite {
    /// The register is not one of these.
    Unknown,
    /// Stored (or accepted and ignored).
    Done,
    /// Stored, and a TLB flush must be performed.
    Flush(TlbFlush),
}

/// Storage of the simple registers.
#[derive(Debug)]
pub(crate) struct Regs {
    enable: u32,
    spoon_enable: u32,
    timer_intr_en: u32,
    clock_div: u32,
    clock_mul: u32,
    alarm: u32,
    fbp_mib: [u32; pfb::MAX_FBP as usize],
    vm_cfg: u32,
    flush_queued: bool,
    sysmem_flush_page: u32,
    tlb_flush_page: u32,
    tlb_flush_vspace: u32,
}

impl Regs {
    /// Reset values for a GPU with `vram_size` bytes (a multiple of 1 MiB) of VRAM.
    pub(crate) fn new(vram_size: u64) -> Regs {
        Regs {
            enable: pmc::ENABLE_ALL,
            spoon_enable: (1 << gf100::pfifo::PBDMAS) - 1,
            timer_intr_en: 0,
            clock_div: 0,
            clock_mul: 0,
            alarm: 0,
            fbp_mib: split_vram(vram_size),
            vm_cfg: 0,
            flush_queued: false,
            sysmem_flush_page: 0,
            tlb_flush_page: 0,
            tlb_flush_vspace: 0,
        }
    }

    /// Reads a register; `None` if `offset` is not one of these. `now_ns` is the clock.
    pub(crate) fn read(&self, offset: u32, now_ns: u64) -> Option<u32> {
        if is_ptimer_time(offset) {
            return Some(ptimer_time(offset, now_ns));
        }
        let time = now_ns & !(ptimer::TIME_LOW_ZERO_BITS as u64);
        Some(match offset {
            pmc::BOOT_0 => pmc::BOOT_0_QUADRO_6000,
            pmc::ENDIAN => 0,
            pmc::ENABLE => self.enable,
            pmc::SPOON_ENABLE => self.spoon_enable,
            pmc::MSI_REARM => 0,
            ptimer::INTR => 0,
            ptimer::INTR_EN => self.timer_intr_en,
            ptimer::CLOCK_DIV => self.clock_div,
            ptimer::CLOCK_MUL => self.clock_mul,
            ptimer::TIME_LOW | gf100::pfifo::TIME_LOW => time as u32,
            ptimer::TIME_HIGH | gf100::pfifo::TIME_HIGH => (time >> 32) as u32,
            ptimer::ALARM => self.alarm,
            pfb::FBP_COUNT => pfb::MAX_FBP,
            pfb::FBP_DISABLE_MASK => 0,
            pffb::SYSMEM_FLUSH_PAGE => self.sysmem_flush_page,
            pffb::VM_CFG => self.vm_cfg_read(),
            pffb::TLB_FLUSH_PAGE => self.tlb_flush_page,
            pffb::TLB_FLUSH_VSPACE => self.tlb_flush_vspace,
            pffb::TLB_FLUSH_TRIGGER => 0,
            pbus::PFLUSH => 0,
            o => self.fbp_mib[fbpa_index(o)?],
        })
    }

    /// Writes a register.
    pub(crate) fn write(&mut self, offset: u32, value: u32) -> RegWrite {
        match offset {
            pmc::ENABLE => self.enable = value,
            pmc::SPOON_ENABLE => self.spoon_enable = value & ((1 << gf100::pfifo::PBDMAS) - 1),
            pmc::BOOT_0 | pmc::ENDIAN | pmc::MSI_REARM => {}
            ptimer::INTR | ptimer::TIME_LOW | ptimer::TIME_HIGH => {}
            ptimer::INTR_EN => self.timer_intr_en = value & 1,
            ptimer::CLOCK_DIV => self.clock_div = value & 0xffff,
            ptimer::CLOCK_MUL => self.clock_mul = value & 0xffff,
            ptimer::ALARM => self.alarm = value,
            pffb::SYSMEM_FLUSH_PAGE => self.sysmem_flush_page = value,
            pffb::VM_CFG => self.vm_cfg = value & pffb::VM_CFG_LARGE_PAGE_64K,
            pffb::TLB_FLUSH_PAGE => self.tlb_flush_page = value,
            pffb::TLB_FLUSH_VSPACE => self.tlb_flush_vspace = value,
            pffb::TLB_FLUSH_TRIGGER => return self.trigger(value),
            pbus::PFLUSH => {}
            pfb::FBP_COUNT | pfb::FBP_DISABLE_MASK => {}
            o if fbpa_index(o).is_some() => {}
            _ => return RegWrite::Unknown,
        }
        RegWrite::Done
    }

    fn vm_cfg_read(&self) -> u32 {
        let queued = if self.flush_queued {
            pffb::VM_CFG_FLUSH_QUEUED
        } else {
            0
        };
        self.vm_cfg | pffb::VM_CFG_FLUSH_SLOTS_MASK | queued
    }

    /// Decodes a TLB_FLUSH_TRIGGER write against the stored VSPACE and PAGE registers.
    fn trigger(&mut self, value: u32) -> RegWrite {
        if value & pffb::FLUSH_TRIGGER == 0 {
            return RegWrite::Done;
        }
        self.flush_queued = true;
        // TLB_FLUSH_VSPACE: bits 4-31 PD >> 12; ENVY: bit 1 TARGET (0 VRAM, 1 either sysmem).
        let pd = ((self.tlb_flush_vspace >> 4) as u64) << 12;
        let target = if self.tlb_flush_vspace & 2 != 0 {
            Target::SysCoherent
        } else {
            Target::Vram
        };
        let va = ((self.tlb_flush_page >> 4) as u64) << 12;
        let all_pages = value & pffb::FLUSH_PAGE_ALL != 0;
        let all_pd = value & pffb::FLUSH_ALL_PDB != 0;
        RegWrite::Flush(match (all_pd, all_pages) {
            (true, true) => TlbFlush::All,
            (true, false) => TlbFlush::PageAllPd { va },
            (false, true) => TlbFlush::Pd { pd, target },
            (false, false) => TlbFlush::Page { pd, target, va },
        })
    }
}

/// Splits `vram_size` bytes over the six FBPs, in MiB, so that the per-FBP amounts sum to exactly
/// the configured size (the remainder goes to the first partitions).
fn split_vram(vram_size: u64) -> [u32; pfb::MAX_FBP as usize] {
    let n = pfb::MAX_FBP as u64;
    let mib = vram_size >> 20;
    let mut out = [0u32; pfb::MAX_FBP as usize];
    for (i, v) in out.iter_mut().enumerate() {
        let share = mib / n + u64::from((i as u64) < mib % n);
        *v = u32::try_from(share).unwrap_or(u32::MAX);
    }
    out
}

/// FBP index of a per-FBP amount register.
fn fbpa_index(offset: u32) -> Option<usize> {
    let rel = offset.checked_sub(pfb::FBPA_AMOUNT)?;
    (rel % pfb::FBPA_STRIDE == 0 && rel / pfb::FBPA_STRIDE < pfb::MAX_FBP)
        .then_some((rel / pfb::FBPA_STRIDE) as usize)
}

/// True for the PTIMER time registers (and their PFIFO mirrors): read from the clock alone.
pub(crate) fn is_ptimer_time(offset: u32) -> bool {
    matches!(
        offset,
        ptimer::TIME_LOW | ptimer::TIME_HIGH | gf100::pfifo::TIME_LOW | gf100::pfifo::TIME_HIGH
    )
}

/// The value of PTIMER time register `offset` at clock time `now_ns` (the low bits GF100 keeps
/// zero are zero).
pub(crate) fn ptimer_time(offset: u32, now_ns: u64) -> u32 {
    let time = now_ns & !(ptimer::TIME_LOW_ZERO_BITS as u64);
    match offset {
        ptimer::TIME_HIGH | gf100::pfifo::TIME_HIGH => (time >> 32) as u32,
        _ => time as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vram_from_regs(r: &Regs) -> u64 {
        let count = r.read(pfb::FBP_COUNT, 0).unwrap_or(0);
        let mask = r.read(pfb::FBP_DISABLE_MASK, 0).unwrap_or(0);
        (0..count)
            .filter(|i| mask & (1 << i) == 0)
            .map(|i| r.read(pfb::fbpa_amount(i), 0).unwrap_or(0) as u64)
            .sum::<u64>()
            << 20
    }

    #[test]
    fn vram_sizing_registers_sum_to_the_configured_size() {
        for size in [6u64 << 30, 1 << 30, 7 << 20, 1 << 20, 3 << 30] {
            assert_eq!(vram_from_regs(&Regs::new(size)), size, "{size:#x}");
        }
        assert_eq!(Regs::new(6 << 30).read(pfb::fbpa_amount(0), 0), Some(1024));
        assert_eq!(Regs::new(6 << 30).read(pfb::fbpa_amount(6), 0), None);
    }

    #[test]
    fn ptimer_reads_the_clock_in_32ns_steps() {
        let r = Regs::new(1 << 20);
        let t = 0x1_2345_6789u64;
        assert_eq!(r.read(ptimer::TIME_LOW, t), Some(0x2345_6780));
        assert_eq!(r.read(ptimer::TIME_HIGH, t), Some(1));
        assert_eq!(r.read(gf100::pfifo::TIME_LOW, t), Some(0x2345_6780));
    }

    #[test]
    fn tlb_flush_trigger_decodes_scope_and_sets_queued() {
        let mut r = Regs::new(1 << 20);
        let slots = |r: &Regs| r.read(pffb::VM_CFG, 0).unwrap_or(0);
        assert_ne!(slots(&r) & pffb::VM_CFG_FLUSH_SLOTS_MASK, 0);
        assert_eq!(slots(&r) & pffb::VM_CFG_FLUSH_QUEUED, 0);
        r.write(
            pffb::TLB_FLUSH_VSPACE,
            pffb::vspace_encode(0x12_3000, Target::SysNonCoherent),
        );
        let f = r.write(
            pffb::TLB_FLUSH_TRIGGER,
            pffb::FLUSH_TRIGGER | pffb::FLUSH_PAGE_ALL,
        );
        assert_eq!(
            f,
            RegWrite::Flush(TlbFlush::Pd {
                pd: 0x12_3000,
                target: Target::SysCoherent
            })
        );
        assert_ne!(slots(&r) & pffb::VM_CFG_FLUSH_QUEUED, 0);
        let f = r.write(
            pffb::TLB_FLUSH_TRIGGER,
            pffb::FLUSH_TRIGGER | pffb::FLUSH_ALL_PDB | pffb::FLUSH_PAGE_ALL,
        );
        assert_eq!(f, RegWrite::Flush(TlbFlush::All));
        r.write(pffb::TLB_FLUSH_PAGE, 0x5 << 4);
        let f = r.write(pffb::TLB_FLUSH_TRIGGER, pffb::FLUSH_TRIGGER);
        assert_eq!(
            f,
            RegWrite::Flush(TlbFlush::Page {
                pd: 0x12_3000,
                target: Target::SysCoherent,
                va: 0x5000
            })
        );
        assert_eq!(
            r.write(pffb::TLB_FLUSH_TRIGGER, pffb::FLUSH_PAGE_ALL),
            RegWrite::Done,
            "no trigger bit"
        );
    }

    #[test]
    fn unknown_offsets_are_reported() {
        let mut r = Regs::new(1 << 20);
        assert_eq!(r.read(0x123458, 0), None);
        assert_eq!(r.write(0x123458, 1), RegWrite::Unknown);
        assert_eq!(r.read(pmc::BOOT_0, 0), Some(0x0c0c_00a3));
        r.write(pmc::SPOON_ENABLE, u32::MAX);
        assert_eq!(r.read(pmc::SPOON_ENABLE, 0).map(u32::count_ones), Some(3));
    }
}
