//! Interrupt and error handling. Mirrors nouveau's `nvkm_mc_intr` (unarm PMC, read PMC INTR,
//! dispatch, rearm) and `gf100_fifo_intr` with its handlers: `_intr_engine` (non-stall: read
//! 0x25a4, write each 0x25a8 + e*4 back), `_intr_mmu_fault` (0x259c sources, 0x2800 + u*0x10
//! registers, ack by writing the source bit), `_intr_pbdma` (0x25a0 sources, PBDMA INTR written
//! back), `_intr_bind` (0x252c) and `_intr_sched` (0x254c), `_intr_runlist` (0x2a00).
//!
//! Unlike nouveau, which logs and recovers, the driver turns every error it finds into a
//! [`DriverError`] naming the faulting VA, reason, unit or channel, so a caller waiting on the
//! GPU gets a clear error instead of a hang.

use gf100::fault::FaultFlags;
use gf100::{pfifo, pmc};

use crate::device::Gpu;
use crate::error::DriverError;
use crate::Hal;

impl<H: Hal> Gpu<H> {
    /// Services a pending interrupt (`nvkm_mc_intr`): returns the first error found.
    pub(crate) fn handle_interrupt(&mut self) -> Result<(), DriverError> {
        self.wr32(pmc::INTR_EN_HOST, 0);
        let _ = self.rd32(pmc::INTR_EN_HOST);
        let stat = self.rd32(pmc::INTR_HOST);
        let r = if stat & pmc::INTR_PFIFO != 0 {
            self.fifo_intr(true)
        } else {
            Ok(())
        };
        self.wr32(pmc::INTR_EN_HOST, pmc::INTR_EN_HARDWARE);
        r
    }

    /// Looks for PFIFO errors without an interrupt (the polling driver's check while waiting).
    pub(crate) fn check_fifo_errors(&mut self) -> Result<(), DriverError> {
        self.fifo_intr(false)
    }

    /// `gf100_fifo_intr`: acknowledges what is pending, returns the first error.
    fn fifo_intr(&mut self, masked: bool) -> Result<(), DriverError> {
        let mut stat = self.rd32(pfifo::INTR);
        if masked {
            stat &= self.rd32(pfifo::INTR_EN);
        }
        if stat == 0 {
            return Ok(());
        }
        let mut err: Option<DriverError> = None;
        if stat & pfifo::INTR_CHAN_TABLE_ERROR != 0 {
            let code = self.rd32(pfifo::CHAN_TABLE_ERROR) & pfifo::ERROR_CODE_MASK;
            self.wr32(pfifo::INTR, pfifo::INTR_CHAN_TABLE_ERROR);
            err.get_or_insert(DriverError::ChannelError {
                kind: "channel table",
                code,
            });
        }
        if stat & pfifo::INTR_SCHED_ERROR != 0 {
            let code = self.rd32(pfifo::SCHED_ERROR) & pfifo::ERROR_CODE_MASK;
            self.wr32(pfifo::INTR, pfifo::INTR_SCHED_ERROR);
            err.get_or_insert(DriverError::ChannelError {
                kind: "scheduler",
                code,
            });
        }
        if stat & pfifo::INTR_VM_FAULT != 0 {
            if let Some(e) = self.mmu_fault_intr() {
                err.get_or_insert(e);
            }
        }
        if stat & pfifo::INTR_PBDMA != 0 {
            if let Some(e) = self.pbdma_intr() {
                err.get_or_insert(e);
            }
        }
        if stat & pfifo::INTR_RUNLIST_DONE != 0 {
            let v = self.rd32(pfifo::INTR_RUNLIST);
            self.wr32(pfifo::INTR_RUNLIST, v);
        }
        if stat & pfifo::INTR_NON_STALL != 0 {
            self.engine_intr();
        }
        let handled = pfifo::INTR_CHAN_TABLE_ERROR
            | pfifo::INTR_SCHED_ERROR
            | pfifo::INTR_VM_FAULT
            | pfifo::INTR_PBDMA
            | pfifo::INTR_RUNLIST_DONE
            | pfifo::INTR_NON_STALL;
        if stat & !handled != 0 {
            self.wr32(pfifo::INTR, stat & !handled);
        }
        err.map_or(Ok(()), Err)
    }

    /// `gf100_fifo_intr_engine`: acknowledges non-stall interrupts by writing each engine's
    /// ENGINE_INTR back.
    fn engine_intr(&mut self) {
        let mask = self.rd32(pfifo::ENGINE_INTR_SOURCE);
        for e in 0..pfifo::ENGINES {
            if mask & (1 << e) != 0 {
                let reg = pfifo::ENGINE_INTR + e * 4;
                let v = self.rd32(reg);
                self.wr32(reg, v);
            }
        }
    }

    /// `gf100_fifo_intr_mmu_fault`: reads and acknowledges every pending fault unit; returns the
    /// first as an error.
    fn mmu_fault_intr(&mut self) -> Option<DriverError> {
        let mask = self.rd32(pfifo::VM_FAULT_SOURCE);
        let mut first = None;
        for unit in 0..pfifo::VM_FAULT_UNITS {
            if mask & (1 << unit) == 0 {
                continue;
            }
            let inst = self.rd32(pfifo::vm_fault(unit, pfifo::VM_FAULT_INST)) as u64;
            let lo = self.rd32(pfifo::vm_fault(unit, pfifo::VM_FAULT_ADDR_LO)) as u64;
            let hi = self.rd32(pfifo::vm_fault(unit, pfifo::VM_FAULT_ADDR_HI)) as u64;
            let flags = FaultFlags::decode(self.rd32(pfifo::vm_fault(unit, pfifo::VM_FAULT_FLAGS)));
            self.wr32(pfifo::VM_FAULT_SOURCE, 1 << unit);
            first.get_or_insert(DriverError::MmuFault {
                va: hi << 32 | lo,
                reason: flags.reason,
                unit,
                client: flags.client,
                hub: flags.hub,
                write: flags.write,
                inst: inst << gf100::PAGE_SHIFT,
            });
        }
        first.or(Some(DriverError::BadHardwareValue {
            what: "VM_FAULT_SOURCE (MMU fault pending without a source)",
            value: mask as u64,
        }))
    }

    /// `gf100_fifo_intr_pbdma`: reads and acknowledges every PBDMA with a pending interrupt.
    fn pbdma_intr(&mut self) -> Option<DriverError> {
        let mask = self.rd32(pfifo::SUBFIFO_INTR_SOURCE);
        let mut first = None;
        for unit in 0..pfifo::PBDMAS {
            if mask & (1 << unit) == 0 {
                continue;
            }
            let intr = self.rd32(pfifo::pbdma(unit, pfifo::PBDMA_INTR));
            let chid = self.rd32(pfifo::pbdma(unit, pfifo::PBDMA_CHID)) & pfifo::PBDMA_CHID_MASK;
            self.wr32(pfifo::pbdma(unit, pfifo::PBDMA_INTR), intr);
            self.wr32(pfifo::SUBFIFO_INTR_SOURCE, 1 << unit);
            if intr != 0 {
                first.get_or_insert(DriverError::PbdmaError {
                    pbdma: unit,
                    intr,
                    chid,
                });
            }
        }
        first
    }
}
