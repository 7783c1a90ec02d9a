//! Interrupt state and its registers: PFIFO's interrupt sources (channel-table and scheduling
//! errors, MMU faults, PBDMA errors, runlist completion, non-stall engine interrupts) and their
//! aggregation into PMC INTR_HOST and the PCI interrupt line.
//!
//! Fermi chain modelled here: a source register (VM_FAULT_SOURCE 0x259c, SUBFIFO_INTR_SOURCE
//! 0x25a0, ENGINE_INTR_SOURCE 0x25a4, INTR_RUNLIST 0x2a00) drives a *level* bit of PFIFO INTR
//! (28, 29, 31, 30); CHAN_TABLE_ERROR and SCHED_ERROR latch bits 0 and 8 (write 1 to clear).
//! `PFIFO INTR & INTR_EN != 0` is PMC INTR_HOST bit 8, and the line is asserted while
//! `INTR_HOST` has an enabled bit (INTR_EN_HOST bit 0 for hardware bits, bit 1 for bit 31).

use gf100::fault::FaultFlags;
use gf100::{pfifo, pmc};

use super::Core;

const PBDMAS: usize = pfifo::PBDMAS as usize;
const ENGINES: usize = pfifo::ENGINES as usize;
const UNITS: usize = pfifo::VM_FAULT_UNITS as usize;

/// The register file of one PBDMA.
#[derive(Debug, Default, Clone, Copy)]
struct PbdmaRegs {
    intr: u32,
    intr_en: u32,
    halt_mask: u32,
    chid: u32,
    method: u32,
    data: u32,
}

/// A PBDMA error to report.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PbdmaError {
    /// The PBDMA INTR bit (`pfifo::PBDMA_INTR_*`).
    pub bit: u32,
    /// The channel.
    pub chid: u32,
    /// Subchannel and method byte offset of the offending method (0 for fetch errors).
    pub subchannel: u32,
    /// Method byte offset.
    pub method: u32,
    /// Method data.
    pub data: u32,
}

/// An MMU fault to report.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FaultReport {
    /// Fault unit (`gf100::fault::UNIT_*`).
    pub unit: u32,
    /// Instance block of the faulting context, encoded like a channel-table word (addr >> 12 |
    /// target << 28).
    pub inst: u32,
    /// Faulting virtual address.
    pub va: u64,
    /// Flags word (reason, client, write).
    pub flags: FaultFlags,
}

/// All interrupt-related registers.
#[derive(Debug)]
pub(crate) struct Interrupts {
    pmc_en_host: u32,
    pmc_en_nrhost: u32,
    pmc_software: bool,
    pmc_mask: u32,
    fifo_latched: u32,
    fifo_en: u32,
    chan_table_error: u32,
    sched_error: u32,
    vm_fault_source: u32,
    vm_fault: [[u32; 4]; UNITS],
    pbdma: [PbdmaRegs; PBDMAS],
    engine_intr: [u32; ENGINES],
    engine_intr_enable: u32,
    runlist_intr: u32,
}

impl Default for Interrupts {
    fn default() -> Self {
        Interrupts {
            pmc_en_host: 0,
            pmc_en_nrhost: 0,
            pmc_software: false,
            pmc_mask: u32::MAX,
            fifo_latched: 0,
            fifo_en: 0,
            chan_table_error: 0,
            sched_error: 0,
            vm_fault_source: 0,
            vm_fault: [[0; 4]; UNITS],
            pbdma: [PbdmaRegs::default(); PBDMAS],
            engine_intr: [0; ENGINES],
            engine_intr_enable: 0,
            runlist_intr: 0,
        }
    }
}

impl Interrupts {
    /// PFIFO INTR as read at 0x2100: latched bits plus the level bits of the source registers.
    pub(crate) fn pfifo_intr(&self) -> u32 {
        pfifo::intr_status(
            self.fifo_latched,
            self.vm_fault_source,
            self.subfifo_source(),
            self.runlist_intr,
            self.engine_source(),
        )
    }

    /// PMC INTR_HOST as read at 0x100.
    pub(crate) fn pmc_intr(&self) -> u32 {
        pmc::intr_host(
            self.pfifo_intr(),
            self.fifo_en,
            self.pmc_software,
            self.pmc_mask,
        )
    }

    /// The level of the PCI interrupt line.
    pub(crate) fn line_level(&self) -> bool {
        pmc::line_asserted(self.pmc_intr(), self.pmc_en_host)
    }

    /// True while a PBDMA has an error interrupt pending (it stalls until it is cleared).
    pub(crate) fn pbdma_pending(&self) -> bool {
        self.pbdma.iter().any(|p| p.intr != 0)
    }

    /// True if `offset` is a PBDMA's INTR register (writing it acknowledges errors).
    pub(crate) fn is_pbdma_intr(offset: u32) -> bool {
        pbdma_index(offset).is_some_and(|(_, reg)| reg == pfifo::PBDMA_INTR)
    }

    fn subfifo_source(&self) -> u32 {
        pfifo::source_mask(self.pbdma.iter().map(|p| p.intr))
    }

    fn engine_source(&self) -> u32 {
        pfifo::source_mask(self.engine_intr.iter().copied())
    }

    /// Records an MMU fault. VM_FAULT[unit] keeps the first fault until it is acknowledged.
    pub(crate) fn fault(&mut self, f: &FaultReport) {
        let unit = (f.unit as usize) % UNITS;
        if self.vm_fault_source & (1 << unit) != 0 {
            return;
        }
        self.vm_fault_source |= 1 << unit;
        self.vm_fault[unit] = [f.inst, f.va as u32, (f.va >> 32) as u32, f.flags.encode()];
    }

    /// Records a PBDMA error on PBDMA 0 (the model runs every channel on PBDMA 0).
    pub(crate) fn pbdma_error(&mut self, e: &PbdmaError) {
        let p = &mut self.pbdma[0];
        p.intr |= e.bit;
        p.chid = (e.chid & 0x7f) | pfifo::PBDMA_CHID_ACTIVE;
        p.method = (e.subchannel & 7) << 16 | (e.method & 0x3ffc);
        p.data = e.data;
    }

    /// Raises the non-stall interrupt (NOTIFY) of PFIFO engine `engine`.
    pub(crate) fn non_stall(&mut self, engine: u32) {
        if let Some(v) = self.engine_intr.get_mut(engine as usize) {
            *v |= pfifo::ENGINE_INTR_NOTIFY;
        }
    }

    /// Latches a scheduling error (PFIFO INTR bit 8).
    pub(crate) fn sched_error(&mut self, code: u32) {
        self.sched_error = code;
        self.fifo_latched |= pfifo::INTR_SCHED_ERROR;
    }

    /// Latches a channel-table error (PFIFO INTR bit 0).
    pub(crate) fn chan_table_error(&mut self, code: u32) {
        self.chan_table_error = code;
        self.fifo_latched |= pfifo::INTR_CHAN_TABLE_ERROR;
    }

    /// Signals that a runlist update completed (INTR_RUNLIST bit 28, PFIFO INTR bit 30).
    pub(crate) fn runlist_done(&mut self) {
        self.runlist_intr |= pfifo::INTR_RUNLIST_EVENT;
    }

    /// Reads an interrupt register; `None` if `offset` is not one.
    pub(crate) fn read(&self, offset: u32) -> Option<u32> {
        Some(match offset {
            pmc::INTR_HOST => self.pmc_intr(),
            pmc::INTR_NRHOST => 0,
            pmc::INTR_EN_HOST => self.pmc_en_host,
            pmc::INTR_EN_NRHOST => self.pmc_en_nrhost,
            pmc::INTR_MASK_HOST => self.pmc_mask,
            pfifo::INTR => self.pfifo_intr(),
            pfifo::INTR_EN => self.fifo_en,
            pfifo::CHAN_TABLE_ERROR => self.chan_table_error,
            pfifo::SCHED_ERROR => self.sched_error,
            pfifo::VM_FAULT_SOURCE => self.vm_fault_source,
            pfifo::SUBFIFO_INTR_SOURCE => self.subfifo_source(),
            pfifo::ENGINE_INTR_SOURCE => self.engine_source(),
            pfifo::ENGINE_INTR_ENABLE => self.engine_intr_enable,
            pfifo::INTR_RUNLIST => self.runlist_intr,
            o if engine_index(o).is_some() => self.engine_intr[engine_index(o)?],
            o if vm_fault_index(o).is_some() => {
                let (u, r) = vm_fault_index(o)?;
                self.vm_fault[u][r]
            }
            o => {
                let (i, reg) = pbdma_index(o)?;
                let p = &self.pbdma[i];
                match reg {
                    pfifo::PBDMA_INTR => p.intr,
                    pfifo::PBDMA_INTR_EN => p.intr_en,
                    pfifo::PBDMA_INTR_HALT_MASK => p.halt_mask,
                    pfifo::PBDMA_CHID => p.chid,
                    pfifo::PBDMA_METHOD0 => p.method,
                    pfifo::PBDMA_DATA0 => p.data,
                    _ => return None,
                }
            }
        })
    }

    /// Writes an interrupt register; false if `offset` is not one.
    pub(crate) fn write(&mut self, offset: u32, value: u32) -> bool {
        match offset {
            pmc::INTR_HOST => self.pmc_software = value & pmc::INTR_SOFTWARE != 0,
            pmc::INTR_NRHOST => {}
            pmc::INTR_EN_HOST => {
                self.pmc_en_host = value & (pmc::INTR_EN_HARDWARE | pmc::INTR_EN_SOFTWARE)
            }
            pmc::INTR_EN_NRHOST => {
                self.pmc_en_nrhost = value & (pmc::INTR_EN_HARDWARE | pmc::INTR_EN_SOFTWARE)
            }
            pmc::INTR_MASK_HOST => self.pmc_mask = value,
            pfifo::INTR => self.fifo_latched &= !value,
            pfifo::INTR_EN => self.fifo_en = value,
            pfifo::CHAN_TABLE_ERROR
            | pfifo::SCHED_ERROR
            | pfifo::SUBFIFO_INTR_SOURCE
            | pfifo::ENGINE_INTR_SOURCE => {}
            pfifo::VM_FAULT_SOURCE => self.vm_fault_source &= !value,
            pfifo::ENGINE_INTR_ENABLE => self.engine_intr_enable = value,
            pfifo::INTR_RUNLIST => self.runlist_intr &= !value,
            o if engine_index(o).is_some() => {
                if let Some(e) = engine_index(o) {
                    self.engine_intr[e] &= !value;
                }
            }
            o if vm_fault_index(o).is_some() => {}
            o => return self.write_pbdma(o, value),
        }
        true
    }

    fn write_pbdma(&mut self, offset: u32, value: u32) -> bool {
        let Some((i, reg)) = pbdma_index(offset) else {
            return false;
        };
        let p = &mut self.pbdma[i];
        match reg {
            pfifo::PBDMA_INTR => p.intr &= !value,
            pfifo::PBDMA_INTR_EN => p.intr_en = value,
            pfifo::PBDMA_INTR_HALT_MASK => p.halt_mask = value,
            pfifo::PBDMA_METHOD0 => p.method = value,
            pfifo::PBDMA_DATA0 => p.data = value,
            pfifo::PBDMA_CHID => {}
            _ => return false,
        }
        true
    }
}

/// ENGINE_INTR index of `offset`, if it is one.
fn engine_index(offset: u32) -> Option<usize> {
    let rel = offset.checked_sub(pfifo::ENGINE_INTR)?;
    (rel % 4 == 0 && rel / 4 < pfifo::ENGINES).then_some((rel / 4) as usize)
}

/// (unit, word) of a VM_FAULT register.
fn vm_fault_index(offset: u32) -> Option<(usize, usize)> {
    let rel = offset.checked_sub(pfifo::VM_FAULT)?;
    let unit = rel / pfifo::VM_FAULT_STRIDE;
    (rel % 4 == 0 && unit < pfifo::VM_FAULT_UNITS)
        .then_some((unit as usize, ((rel % pfifo::VM_FAULT_STRIDE) / 4) as usize))
}

/// (PBDMA index, register offset within the block) of a PBDMA register.
fn pbdma_index(offset: u32) -> Option<(usize, u32)> {
    let rel = offset.checked_sub(pfifo::PBDMA_BASE)?;
    let i = rel / pfifo::PBDMA_STRIDE;
    (i < pfifo::PBDMAS).then_some((i as usize, rel % pfifo::PBDMA_STRIDE))
}

impl Core {
    /// Reports an MMU fault: VM_FAULT registers, PFIFO INTR bit 28, counted.
    pub(crate) fn report_fault(&mut self, f: FaultReport) {
        self.stats.mmu_faults += 1;
        log::debug!(
            "sim: MMU fault unit {:#x} va {:#x} flags {:?}",
            f.unit,
            f.va,
            f.flags
        );
        self.intr.fault(&f);
    }

    /// Reports a PBDMA error: PBDMA INTR, PFIFO INTR bit 29, counted.
    pub(crate) fn report_pbdma_error(&mut self, e: PbdmaError) {
        self.stats.pbdma_errors += 1;
        log::debug!(
            "sim: PBDMA error {:#x} on channel {} (mthd {:#x} data {:#x})",
            e.bit,
            e.chid,
            e.method,
            e.data
        );
        self.intr.pbdma_error(&e);
    }

    /// Reports a scheduling error (PFIFO INTR bit 8), counted.
    pub(crate) fn report_sched_error(&mut self, code: u32) {
        self.stats.sched_errors += 1;
        self.intr.sched_error(code);
    }

    /// Reports a channel-table error (PFIFO INTR bit 0), counted with the scheduling errors.
    pub(crate) fn report_chan_table_error(&mut self, code: u32) {
        self.stats.sched_errors += 1;
        self.intr.chan_table_error(code);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gf100::fault;

    fn enabled() -> Interrupts {
        let mut i = Interrupts::default();
        assert!(i.write(pmc::INTR_EN_HOST, pmc::INTR_EN_HARDWARE));
        assert!(i.write(pfifo::INTR_EN, u32::MAX));
        i
    }

    #[test]
    fn vm_fault_is_a_level_until_acknowledged() {
        let mut i = enabled();
        let flags = FaultFlags {
            reason: fault::REASON_PAGE_NOT_PRESENT,
            hub: true,
            write: false,
            client: 6,
            gpc: 0,
        };
        i.fault(&FaultReport {
            unit: fault::UNIT_PFIFO,
            inst: 0x123,
            va: 0x12_3456_7000,
            flags,
        });
        assert_eq!(i.read(pfifo::VM_FAULT_SOURCE), Some(1 << fault::UNIT_PFIFO));
        assert_eq!(i.read(pfifo::vm_fault(fault::UNIT_PFIFO, 0)), Some(0x123));
        assert_eq!(
            i.read(pfifo::vm_fault(fault::UNIT_PFIFO, 4)),
            Some(0x3456_7000)
        );
        assert_eq!(i.read(pfifo::vm_fault(fault::UNIT_PFIFO, 8)), Some(0x12));
        assert_eq!(
            i.read(pfifo::vm_fault(fault::UNIT_PFIFO, 0xc)),
            Some(flags.encode())
        );
        assert_ne!(i.pfifo_intr() & pfifo::INTR_VM_FAULT, 0);
        assert!(i.line_level());
        i.write(pfifo::INTR, pfifo::INTR_VM_FAULT);
        assert!(i.line_level(), "level bits cannot be cleared in INTR");
        i.write(pfifo::VM_FAULT_SOURCE, 1 << fault::UNIT_PFIFO);
        assert!(!i.line_level());
    }

    #[test]
    fn latched_errors_clear_by_writing_one() {
        let mut i = enabled();
        i.sched_error(pfifo::SCHED_ERR_INACTIVE_CHANNEL);
        assert_eq!(i.read(pfifo::SCHED_ERROR), Some(1));
        assert_eq!(i.read(pmc::INTR_HOST), Some(pmc::INTR_PFIFO));
        i.write(pfifo::INTR, pfifo::INTR_SCHED_ERROR);
        assert_eq!(i.read(pmc::INTR_HOST), Some(0));
    }

    #[test]
    fn non_stall_is_acked_by_writing_engine_intr_back() {
        let mut i = enabled();
        i.write(pfifo::INTR_EN, pfifo::INTR_EN_DEFAULT);
        i.non_stall(4);
        assert_eq!(i.read(pfifo::ENGINE_INTR_SOURCE), Some(1 << 4));
        assert!(
            !i.line_level(),
            "bit 31 is not in nouveau's default INTR_EN"
        );
        i.write(pfifo::INTR_EN, u32::MAX);
        assert!(i.line_level());
        let v = i.read(pfifo::ENGINE_INTR + 16).unwrap_or(0);
        assert_eq!(v, pfifo::ENGINE_INTR_NOTIFY);
        i.write(pfifo::ENGINE_INTR + 16, v);
        assert_eq!(i.read(pfifo::ENGINE_INTR_SOURCE), Some(0));
        assert!(!i.line_level());
    }

    #[test]
    fn pbdma_error_records_the_method_and_is_w1c() {
        let mut i = enabled();
        i.pbdma_error(&PbdmaError {
            bit: pfifo::PBDMA_INTR_ILLEGAL_MTHD,
            chid: 5,
            subchannel: 3,
            method: 0x1234,
            data: 9,
        });
        assert_eq!(i.read(pfifo::SUBFIFO_INTR_SOURCE), Some(1));
        assert_eq!(
            i.read(pfifo::pbdma(0, pfifo::PBDMA_CHID)),
            Some(5 | pfifo::PBDMA_CHID_ACTIVE)
        );
        assert_eq!(
            i.read(pfifo::pbdma(0, pfifo::PBDMA_METHOD0)),
            Some(3 << 16 | 0x1234)
        );
        assert_eq!(i.read(pfifo::pbdma(0, pfifo::PBDMA_DATA0)), Some(9));
        assert!(i.line_level());
        i.write(pfifo::pbdma(0, pfifo::PBDMA_INTR), u32::MAX);
        assert!(!i.line_level());
        assert_eq!(i.read(pfifo::pbdma(3, pfifo::PBDMA_INTR)), None);
    }

    #[test]
    fn software_interrupt_needs_its_own_enable() {
        let mut i = Interrupts::default();
        i.write(pmc::INTR_HOST, pmc::INTR_SOFTWARE);
        assert_eq!(i.read(pmc::INTR_HOST), Some(pmc::INTR_SOFTWARE));
        i.write(pmc::INTR_EN_HOST, pmc::INTR_EN_HARDWARE);
        assert!(!i.line_level());
        i.write(pmc::INTR_EN_HOST, pmc::INTR_EN_SOFTWARE);
        assert!(i.line_level());
    }
}
