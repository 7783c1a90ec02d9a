//! The per-VM virtual register file: every BAR0 register a guest may read back, kept per VM the
//! way GPUvm's QEMU device model keeps a shadow of the GF100's MMIO state. The interrupt chain is
//! the Fermi one, per VM: source registers (VM_FAULT_SOURCE, the PBDMA INTR words, INTR_RUNLIST,
//! ENGINE_INTR) drive *level* bits of the virtual PFIFO INTR (28, 29, 30, 31); CHAN_TABLE_ERROR
//! and SCHED_ERROR latch bits 0 and 8; `PFIFO INTR & INTR_EN` is PMC INTR_HOST bit 8; the VM's
//! interrupt line is asserted while INTR_HOST has an enabled bit (INTR_EN_HOST bit 0 for the
//! hardware bits, bit 1 for SOFTWARE). Nothing here touches the physical GPU.

use gf100::fault::FaultFlags;
use gf100::{pfifo, pmc};

const PBDMAS: usize = pfifo::PBDMAS as usize;
const ENGINES: usize = pfifo::ENGINES as usize;
const UNITS: usize = pfifo::VM_FAULT_UNITS as usize;

/// One virtual PBDMA's registers.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct VPbdma {
    pub intr: u32,
    pub intr_en: u32,
    pub halt_mask: u32,
    pub chid: u32,
    pub method: u32,
    pub data: u32,
}

/// The para-virtual interface registers.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct VPv {
    pub batch_lo: u32,
    pub batch_hi: u32,
    pub count: u32,
    pub status: u32,
    pub error: u32,
}

/// A fault to show the guest in VM_FAULT[unit].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VFault {
    pub unit: u32,
    /// The guest's instance word (address >> 12 | target << 28).
    pub inst: u32,
    pub va: u64,
    pub flags: FaultFlags,
}

/// All per-VM registers that are not channel-table words.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct VRegs {
    pub pmc_enable: u32,
    pub spoon_enable: u32,
    pub pmc_intr_en_host: u32,
    pub pmc_intr_en_nrhost: u32,
    pub pmc_software: bool,
    pub pmc_mask: u32,
    pub pmem: u32,
    pub bar1_inst: u32,
    pub bar3_inst: u32,
    pub sysmem_flush_page: u32,
    pub vm_cfg: u32,
    pub flush_queued: bool,
    pub tlb_flush_page: u32,
    pub tlb_flush_vspace: u32,
    pub timer_intr_en: u32,
    pub clock_div: u32,
    pub clock_mul: u32,
    pub alarm: u32,
    pub fifo_latched: u32,
    pub fifo_en: u32,
    pub ctrl: u32,
    pub subfifo_enable: u32,
    pub eng_subfifo_mask: [u32; ENGINES],
    pub engine_intr_enable: u32,
    pub poll_base: u32,
    pub runlist_base: u32,
    pub runlist_len: u32,
    pub runlist_rd_base: u32,
    pub runlist_intr: u32,
    pub chan_table_error: u32,
    pub sched_error: u32,
    pub vm_fault_source: u32,
    pub vm_fault: [[u32; 4]; UNITS],
    pub pbdma: [VPbdma; PBDMAS],
    pub engine_intr: [u32; ENGINES],
    pub kick: u32,
    pub pv: VPv,
    /// Board registers, the PMU and PGRAPH stand-ins, the VBIOS (`super::vboard`).
    pub board: Box<crate::mmio::vboard::VBoard>,
}

impl Default for VRegs {
    fn default() -> Self {
        VRegs {
            pmc_enable: pmc::ENABLE_ALL,
            spoon_enable: (1 << pfifo::PBDMAS) - 1,
            pmc_intr_en_host: 0,
            pmc_intr_en_nrhost: 0,
            pmc_software: false,
            pmc_mask: u32::MAX,
            pmem: 0,
            bar1_inst: 0,
            bar3_inst: 0,
            sysmem_flush_page: 0,
            vm_cfg: 0,
            flush_queued: false,
            tlb_flush_page: 0,
            tlb_flush_vspace: 0,
            timer_intr_en: 0,
            clock_div: 0,
            clock_mul: 0,
            alarm: 0,
            fifo_latched: 0,
            fifo_en: 0,
            ctrl: 0,
            subfifo_enable: 0,
            eng_subfifo_mask: [0; ENGINES],
            engine_intr_enable: 0,
            poll_base: 0,
            runlist_base: 0,
            runlist_len: 0,
            runlist_rd_base: 0,
            runlist_intr: 0,
            chan_table_error: 0,
            sched_error: 0,
            vm_fault_source: 0,
            vm_fault: [[0; 4]; UNITS],
            pbdma: [VPbdma::default(); PBDMAS],
            engine_intr: [0; ENGINES],
            kick: 0,
            pv: VPv::default(),
            board: Box::default(),
        }
    }
}

impl VRegs {
    /// SUBFIFO_INTR_SOURCE: bit i = virtual PBDMA i has a pending interrupt.
    pub(crate) fn subfifo_source(&self) -> u32 {
        pfifo::source_mask(self.pbdma.iter().map(|p| p.intr))
    }

    /// ENGINE_INTR_SOURCE: bit e = engine e has a pending non-stall interrupt.
    pub(crate) fn engine_source(&self) -> u32 {
        pfifo::source_mask(self.engine_intr.iter().copied())
    }

    /// Virtual PFIFO INTR: latched bits plus the level bits of the source registers.
    pub(crate) fn pfifo_intr(&self) -> u32 {
        pfifo::intr_status(
            self.fifo_latched,
            self.vm_fault_source,
            self.subfifo_source(),
            self.runlist_intr,
            self.engine_source(),
        )
    }

    /// Virtual PMC INTR_HOST.
    pub(crate) fn pmc_intr(&self) -> u32 {
        pmc::intr_host(
            self.pfifo_intr(),
            self.fifo_en,
            self.pmc_software,
            self.pmc_mask,
        )
    }

    /// The level of the VM's interrupt line.
    pub(crate) fn line_level(&self) -> bool {
        // Both enables off (a driver that polls): low whatever is pending, without aggregating
        // the sources — asked after every access (`vgpu::cell::VmGuard`).
        if self.pmc_intr_en_host & (pmc::INTR_EN_HARDWARE | pmc::INTR_EN_SOFTWARE) == 0 {
            return false;
        }
        pmc::line_asserted(self.pmc_intr(), self.pmc_intr_en_host)
    }

    /// Latches a channel-table error (PFIFO INTR bit 0).
    pub(crate) fn chan_table_error(&mut self, code: u32) {
        self.chan_table_error = code;
        self.fifo_latched |= pfifo::INTR_CHAN_TABLE_ERROR;
    }

    /// Latches a scheduling error (PFIFO INTR bit 8).
    pub(crate) fn sched_error(&mut self, code: u32) {
        self.sched_error = code;
        self.fifo_latched |= pfifo::INTR_SCHED_ERROR;
    }

    /// Reports an MMU fault; like the hardware, a unit keeps its first fault until the guest
    /// acknowledges it. Returns false if the unit was already pending (the fault is dropped).
    pub(crate) fn report_fault(&mut self, f: VFault) -> bool {
        let Some(regs) = self.vm_fault.get_mut(f.unit as usize) else {
            return false;
        };
        let bit = 1u32 << f.unit;
        if self.vm_fault_source & bit != 0 {
            return false;
        }
        *regs = [f.inst, f.va as u32, (f.va >> 32) as u32, f.flags.encode()];
        self.vm_fault_source |= bit;
        true
    }

    /// The poll area (BAR1 VA of the guest's USERD pages), if enabled.
    pub(crate) fn poll_area(&self) -> Option<u64> {
        pfifo::userd_poll_decode(self.poll_base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interrupt_chain_per_vm() {
        let mut r = VRegs::default();
        assert!(!r.line_level());
        r.runlist_intr = pfifo::INTR_RUNLIST_EVENT;
        assert_eq!(r.pfifo_intr(), pfifo::INTR_RUNLIST_DONE);
        assert_eq!(r.pmc_intr(), 0, "PFIFO INTR_EN gates PMC");
        r.fifo_en = pfifo::INTR_EN_DEFAULT;
        assert_eq!(r.pmc_intr(), pmc::INTR_PFIFO);
        assert!(!r.line_level(), "PMC INTR_EN off");
        r.pmc_intr_en_host = pmc::INTR_EN_HARDWARE;
        assert!(r.line_level());
        r.pmc_mask = 0;
        assert!(!r.line_level());
        r.pmc_mask = u32::MAX;
        r.runlist_intr = 0;
        r.engine_intr[4] = pfifo::ENGINE_INTR_NOTIFY;
        assert_eq!(r.engine_source(), 1 << 4);
        assert!(!r.line_level(), "non-stall needs INTR_EN bit 31");
        r.fifo_en |= pfifo::INTR_NON_STALL;
        assert!(r.line_level());
        r.engine_intr[4] = 0;
        r.pbdma[2].intr = pfifo::PBDMA_INTR_ILLEGAL_MTHD;
        assert_eq!(r.subfifo_source(), 1 << 2);
        assert_ne!(r.pfifo_intr() & pfifo::INTR_PBDMA, 0);
        r.pbdma[2].intr = 0;
        r.pmc_software = true;
        assert!(!r.line_level(), "software interrupt needs INTR_EN bit 1");
        r.pmc_intr_en_host |= pmc::INTR_EN_SOFTWARE;
        assert!(r.line_level());
        // The short cut for both enables off gives what the whole chain gives, for every
        // combination of enables and pending sources.
        for en in 0..8u32 {
            for (sw, runlist) in [
                (false, 0),
                (true, 0),
                (false, pfifo::INTR_RUNLIST_EVENT),
                (true, pfifo::INTR_RUNLIST_EVENT),
            ] {
                r.pmc_intr_en_host = en;
                r.pmc_software = sw;
                r.runlist_intr = runlist;
                assert_eq!(
                    r.line_level(),
                    pmc::line_asserted(r.pmc_intr(), en),
                    "{en} {sw} {runlist}"
                );
            }
        }
    }

    #[test]
    fn faults_keep_the_first_until_acknowledged() {
        let mut r = VRegs::default();
        let f = |va| VFault {
            unit: gf100::fault::UNIT_BAR1,
            inst: 0x1234,
            va,
            flags: FaultFlags::decode(0x42),
        };
        assert!(r.report_fault(f(0x1_0000_2000)));
        assert!(!r.report_fault(f(0x3000)));
        let u = gf100::fault::UNIT_BAR1 as usize;
        assert_eq!(r.vm_fault[u], [0x1234, 0x2000, 1, 0x42]);
        assert_eq!(r.pfifo_intr(), pfifo::INTR_VM_FAULT);
        assert!(!r.report_fault(VFault { unit: 99, ..f(0) }));
        r.chan_table_error(pfifo::CHAN_ERR_NO_POLL);
        r.sched_error(pfifo::SCHED_ERR_INACTIVE_CHANNEL);
        assert_eq!(
            r.pfifo_intr() & (pfifo::INTR_CHAN_TABLE_ERROR | pfifo::INTR_SCHED_ERROR),
            pfifo::INTR_CHAN_TABLE_ERROR | pfifo::INTR_SCHED_ERROR
        );
    }
}
