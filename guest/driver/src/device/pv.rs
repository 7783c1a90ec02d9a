//! Para-virtual page tables: on a vGPU that offers the `gf100::pv` interface (GPUvm's BAR4
//! "multicall", GXEN `context_bar4.cc` `MAP_BATCH`/`VM_FLUSH`), the page-directory and
//! page-table entries of channel address spaces are not written to instance memory one MMIO
//! access at a time; they are queued as 32-byte [`Op`]s in a batch buffer in guest RAM and handed
//! to the device model in one exit, which writes each entry into the guest's table *and* updates
//! its shadow, so it never has to scan the guest's tables. A TLB invalidate becomes an
//! `OP_FLUSH` op at the end of the batch.
//!
//! ```text
//! init:    rd 0x1f00000 (ID) == 0x47505631 ("GPV1")        Paravirt::Auto / Required
//! submit:  ops [0, n) at guest-physical A (32 bytes each, n <= 2048)
//!          wr 0x1f00004 = A & 0xffffffff                   BATCH_LO
//!          wr 0x1f00008 = A >> 32                          BATCH_HI
//!          wr 0x1f0000c = n                                BATCH_COUNT
//!          wr 0x1f00010 = 1                                SUBMIT
//!          rd 0x1f00014 == n                               STATUS (ops applied)
//!          rd 0x1f00018 == 0                               ERROR (ERR_NONE)
//! ```
//!
//! A batch is submitted when it is full (`MAX_BATCH` ops) and at every TLB-flush point of a
//! channel address space; after any `vm_*` call returns, no op is pending. Only address spaces a
//! bound channel uses take this path (the device model accepts ops only for page directories it
//! learnt from a channel binding; see [`crate::vm`]). The BAR1 and BAR3 VMs never do: the device
//! model walks them in software from guest memory.

use gf100::pv::{self as iface, Op};
use gf100::Target;

use crate::config::Paravirt;
use crate::device::Gpu;
use crate::error::DriverError;
use crate::hal::{Bar, Dma, Mmio};
use crate::instmem::InstObj;
use crate::sysmem::DmaAlloc;
use crate::Hal;

/// Value written to `SUBMIT` to apply a batch.
const SUBMIT_GO: u32 = 1;

/// Counters of the para-virtual path (all zero when it is not active).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PvStats {
    /// Batches submitted (written to SUBMIT).
    pub batches: u64,
    /// Ops submitted, flush ops included.
    pub ops: u64,
    /// `OP_WRITE_PDE` ops submitted.
    pub pde_ops: u64,
    /// `OP_WRITE_PTE` ops submitted.
    pub pte_ops: u64,
    /// `OP_FLUSH` ops submitted (one per TLB-flush point).
    pub flushes: u64,
    /// Batches submitted because they were full (before a flush point).
    pub full_batches: u64,
    /// Batches the device did not apply completely.
    pub failed_batches: u64,
}

/// The batch buffer: room for [`iface::MAX_BATCH`] ops in guest RAM, `len` of them queued.
#[derive(Debug)]
pub(crate) struct PvQueue {
    buf: DmaAlloc,
    len: u32,
}

impl PvQueue {
    /// Bytes of guest RAM a full batch needs.
    pub(crate) const BYTES: u64 = iface::MAX_BATCH as u64 * iface::OP_SIZE;

    /// A queue over `buf` (at least [`PvQueue::BYTES`] long).
    pub(crate) fn new(buf: DmaAlloc) -> PvQueue {
        PvQueue { buf, len: 0 }
    }

    /// Ops queued.
    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    /// True when another op does not fit.
    pub(crate) fn is_full(&self) -> bool {
        self.len >= iface::MAX_BATCH
    }

    /// Guest-physical address of the op array.
    pub(crate) fn addr(&self) -> u64 {
        self.buf.addr()
    }

    /// Writes `op` into slot `len` of the buffer; false (nothing written) if the batch is full.
    pub(crate) fn push<D: Dma>(&mut self, dma: &mut D, op: &Op) -> bool {
        if self.is_full() {
            return false;
        }
        dma.write(
            self.buf.addr() + u64::from(self.len) * iface::OP_SIZE,
            &op.to_bytes(),
        );
        self.len += 1;
        true
    }

    /// Empties the queue; returns the number of ops it held.
    pub(crate) fn take(&mut self) -> u32 {
        core::mem::replace(&mut self.len, 0)
    }
}

/// Decides at init whether the para-virtual path is used: reads the ID register unless `mode` is
/// [`Paravirt::Off`]. Fails only for [`Paravirt::Required`] without the interface.
pub(crate) fn probe<H: Mmio>(hal: &mut H, mode: Paravirt) -> Result<bool, DriverError> {
    if mode == Paravirt::Off {
        return Ok(false);
    }
    let id = hal.read32(Bar::Bar0, u64::from(iface::ID));
    match (id == iface::MAGIC, mode) {
        (true, _) => Ok(true),
        (false, Paravirt::Required) => Err(DriverError::ParavirtUnavailable { id }),
        (false, _) => Ok(false),
    }
}

impl<H> Gpu<H> {
    /// True if channel address spaces are updated through the para-virtual interface.
    pub fn paravirt_active(&self) -> bool {
        self.pv.is_some()
    }

    /// Counters of the para-virtual path.
    pub fn pv_stats(&self) -> PvStats {
        self.pv_stats
    }
}

impl<H: Hal> Gpu<H> {
    /// Allocates the batch buffer (after [`probe`] said yes).
    pub(crate) fn pv_init(&mut self) -> Result<(), DriverError> {
        let buf = self.dma.alloc(PvQueue::BYTES, gf100::PAGE_SIZE)?;
        self.pv = Some(PvQueue::new(buf));
        Ok(())
    }

    /// Queues a PDE (`pde == true`) or PTE write of entry `index` of `table`; submits the batch
    /// first if it is full.
    pub(crate) fn pv_entry(
        &mut self,
        pde: bool,
        table: &InstObj,
        index: u64,
        value: u64,
    ) -> Result<(), DriverError> {
        let op = if pde {
            iface::OP_WRITE_PDE
        } else {
            iface::OP_WRITE_PTE
        };
        self.pv_push(Op {
            op,
            target: Target::Vram.bits(),
            table: table.addr(),
            index,
            value,
        })
    }

    /// A TLB flush of the address space whose page directory is `pd`: `OP_FLUSH` at the end of
    /// the batch, then the submission.
    pub(crate) fn pv_flush(&mut self, pd: &InstObj) -> Result<(), DriverError> {
        self.pv_push(Op {
            op: iface::OP_FLUSH,
            target: Target::Vram.bits(),
            table: pd.addr(),
            index: 0,
            value: 0,
        })?;
        self.pv_submit()
    }

    fn pv_push(&mut self, op: Op) -> Result<(), DriverError> {
        if self.pv.as_ref().is_some_and(PvQueue::is_full) {
            self.pv_stats.full_batches += 1;
            self.pv_submit()?;
        }
        let Some(q) = self.pv.as_mut() else {
            return Err(DriverError::Internal {
                what: "para-virtual op without the interface",
            });
        };
        if !q.push(&mut self.hal, &op) {
            return Err(DriverError::Internal {
                what: "para-virtual batch overflow",
            });
        }
        match op.op {
            iface::OP_WRITE_PDE => self.pv_stats.pde_ops += 1,
            iface::OP_WRITE_PTE => self.pv_stats.pte_ops += 1,
            _ => self.pv_stats.flushes += 1,
        }
        Ok(())
    }

    /// Submits the queued ops (nothing if none) and checks that the device applied them all.
    /// The queue is empty afterwards, whatever the outcome.
    pub(crate) fn pv_submit(&mut self) -> Result<(), DriverError> {
        let Some(q) = self.pv.as_mut() else {
            return Ok(());
        };
        let addr = q.addr();
        let count = q.take();
        if count == 0 {
            return Ok(());
        }
        self.pv_stats.ops += u64::from(count);
        // The device may stop a long batch at its work budget (ERR_BUSY) after applying some
        // ops: submit the rest again, as long as each round makes progress.
        let mut done = 0;
        let (status, error) = loop {
            let at = addr + u64::from(done) * iface::OP_SIZE;
            self.wr32(iface::BATCH_LO, at as u32);
            self.wr32(iface::BATCH_HI, (at >> 32) as u32);
            self.wr32(iface::BATCH_COUNT, count - done);
            self.wr32(iface::SUBMIT, SUBMIT_GO);
            let status = self.rd32(iface::STATUS);
            let error = self.rd32(iface::ERROR);
            self.pv_stats.batches += 1;
            // Only a busy answer that applied part of what was left is resubmitted; anything
            // else (garbage included) is judged as the device's final word.
            if error == iface::ERR_BUSY && status > 0 && status < count - done {
                done += status;
                continue;
            }
            break (done.saturating_add(status), error);
        };
        if status == count && error == iface::ERR_NONE {
            return Ok(());
        }
        self.pv_stats.failed_batches += 1;
        // Name the op that was not applied (read back from our own batch buffer).
        let op = (status < count).then(|| {
            let mut b = [0u8; 4];
            self.hal
                .read(addr + u64::from(status) * iface::OP_SIZE, &mut b);
            u32::from_le_bytes(b)
        });
        Err(DriverError::ParavirtBatch {
            error,
            op_index: status,
            op,
            count,
        })
    }

    /// After a failed `vm_*` step: hands the ops already queued to the device (no flush), so that
    /// the guest's tables match the driver's bookkeeping as they would without the interface,
    /// and returns the original error.
    pub(crate) fn pv_settle<T>(&mut self, r: Result<T, DriverError>) -> Result<T, DriverError> {
        if r.is_err() && self.pv.as_ref().is_some_and(|q| q.len() > 0) {
            let _ = self.pv_submit();
        }
        r
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec;
    use std::vec::Vec;

    use super::*;
    use crate::sysmem::DmaAllocator;

    struct Ram {
        base: u64,
        bytes: Vec<u8>,
    }

    impl Dma for Ram {
        fn base(&self) -> u64 {
            self.base
        }
        fn size(&self) -> u64 {
            self.bytes.len() as u64
        }
        fn read(&mut self, addr: u64, buf: &mut [u8]) {
            let o = (addr - self.base) as usize;
            buf.copy_from_slice(&self.bytes[o..o + buf.len()]);
        }
        fn write(&mut self, addr: u64, data: &[u8]) {
            let o = (addr - self.base) as usize;
            self.bytes[o..o + data.len()].copy_from_slice(data);
        }
    }

    fn ops(n: u32) -> Vec<Op> {
        (0..n)
            .map(|i| Op {
                op: [iface::OP_WRITE_PDE, iface::OP_WRITE_PTE, iface::OP_FLUSH][i as usize % 3],
                target: Target::Vram.bits(),
                table: 0x12_3456_7000 + u64::from(i) * 0x1000,
                index: u64::from(i) * 7 + 1,
                value: 0xdead_beef_0000_0001 ^ (u64::from(i) << 20),
            })
            .collect()
    }

    #[test]
    fn queued_ops_round_trip_through_guest_ram() {
        let base = 0x10_0000;
        let mut ram = Ram {
            base,
            bytes: vec![0xa5; 0x20000],
        };
        let mut alloc = DmaAllocator::new(base, 0x20000);
        let _pad = alloc.alloc(0x1000, 0).unwrap();
        let mut q = PvQueue::new(alloc.alloc(PvQueue::BYTES, 0).unwrap());
        assert_eq!(q.addr(), base + 0x1000);
        let want = ops(iface::MAX_BATCH);
        for (i, op) in want.iter().enumerate() {
            assert!(!q.is_full());
            assert!(q.push(&mut ram, op));
            assert_eq!(q.len() as usize, i + 1);
        }
        assert!(q.is_full());
        assert!(
            !q.push(&mut ram, &want[0]),
            "a full batch takes no more ops"
        );
        for (i, op) in want.iter().enumerate() {
            let mut b = [0u8; iface::OP_SIZE as usize];
            ram.read(q.addr() + i as u64 * iface::OP_SIZE, &mut b);
            assert_eq!(Op::from_bytes(&b), *op, "op {i}");
        }
        // Nothing outside the buffer was touched.
        assert!(ram.bytes[..0x1000].iter().all(|&b| b == 0xa5));
        assert!(ram.bytes[0x1000 + PvQueue::BYTES as usize..]
            .iter()
            .all(|&b| b == 0xa5));
        assert_eq!(q.take(), iface::MAX_BATCH);
        assert_eq!(q.len(), 0);
        assert!(q.push(&mut ram, &want[1]));
        let mut b = [0u8; iface::OP_SIZE as usize];
        ram.read(q.addr(), &mut b);
        assert_eq!(Op::from_bytes(&b), want[1], "a new batch starts at slot 0");
    }

    #[test]
    fn op_layout_is_the_documented_one() {
        let op = Op {
            op: iface::OP_WRITE_PTE,
            target: Target::Vram.bits(),
            table: 0x0000_0001_0002_0000,
            index: 0x3fff,
            value: 0x0000_0002_0000_1231,
        };
        let b = op.to_bytes();
        assert_eq!(&b[0..4], &2u32.to_le_bytes());
        assert_eq!(&b[4..8], &0u32.to_le_bytes());
        assert_eq!(&b[8..16], &0x0000_0001_0002_0000u64.to_le_bytes());
        assert_eq!(&b[16..24], &0x3fffu64.to_le_bytes());
        assert_eq!(&b[24..32], &0x0000_0002_0000_1231u64.to_le_bytes());
    }
}
