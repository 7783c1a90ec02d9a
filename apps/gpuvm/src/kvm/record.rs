//! `gpuvm run --kvm --record DIR`: MMIO traces of real KVM guests, replayable exactly with
//! `gpuvm trace replay --check` (format: docs/trace-format.md).
//!
//! The vGPU's accesses are recorded by the library's [`TapRecorder`], installed as each vGPU's
//! access tap, on a simulated clock that the recorder steps to wall time before each access (so
//! the device sees the same clock values in replay). What the tap cannot see is guest RAM: the
//! guest writes its pushbuffers, GPFIFO entries and copy sources without exits. [`RamLog`] finds
//! those writes with KVM's dirty-page log on the RAM slot and records the bytes that changed in
//! the guest's DMA region before every MMIO exit is handled (the access that may make the
//! device read them).

use std::ops::Range;

use anyhow::Context;
use gpuvm_trace::record::TapRecorder;
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryRegion};

use super::vm::{GuestVm, PAGE};

/// Changed bytes are recorded in blocks of this size (a smaller block records fewer unchanged
/// bytes; a larger one fewer records).
const BLOCK: usize = 64;

/// The dirty-page log of a VM's RAM slot, restricted to the guest's DMA region, with a copy of
/// that region as last recorded.
pub struct RamLog {
    region: Range<u64>,
    ram: u64,
    copy: Vec<u8>,
    /// Bytes recorded as guest writes.
    pub recorded_bytes: u64,
}

impl RamLog {
    /// Turns on dirty-page logging for the VM's RAM (slot 0, GPA 0..`gvm.mem` size) and
    /// records what `region` already holds that differs from fresh (zero) RAM, as replay
    /// starts from fresh RAM.
    pub fn start(gvm: &GuestVm, region: Range<u64>, rec: &TapRecorder) -> anyhow::Result<RamLog> {
        let r = gvm.mem.iter().next().context("the VM has no RAM")?;
        let ram = r.len();
        anyhow::ensure!(
            region.start < region.end && region.end <= ram,
            "DMA region {region:#x?} is not inside guest RAM (0..{ram:#x})"
        );
        gvm.set_dirty_log(true)?;
        let mut log = RamLog {
            copy: vec![0u8; (region.end - region.start) as usize],
            region,
            ram,
            recorded_bytes: 0,
        };
        let all = (log.region.start / PAGE..log.region.end.div_ceil(PAGE)).collect::<Vec<_>>();
        log.record_pages(gvm, rec, all)?;
        Ok(log)
    }

    /// Records the bytes of the DMA region the guest changed since the last call (pages KVM
    /// logged as dirty, compared with the copy in blocks of [`BLOCK`] bytes).
    pub fn sync(&mut self, gvm: &GuestVm, rec: &TapRecorder) -> anyhow::Result<()> {
        let (first, last) = (self.region.start / PAGE, self.region.end.div_ceil(PAGE));
        let pages = super::vm::dirty_pages(&gvm.fd, self.ram)?
            .into_iter()
            .filter(|p| (first..last).contains(p))
            .collect();
        self.record_pages(gvm, rec, pages)
    }

    fn record_pages(
        &mut self,
        gvm: &GuestVm,
        rec: &TapRecorder,
        pages: Vec<u64>,
    ) -> anyhow::Result<()> {
        let mut buf = [0u8; PAGE as usize];
        for page in pages {
            let lo = (page * PAGE).max(self.region.start);
            let hi = ((page + 1) * PAGE).min(self.region.end);
            let now = &mut buf[..(hi - lo) as usize];
            gvm.mem
                .read_slice(now, GuestAddress(lo))
                .context("reading guest RAM")?;
            let off = (lo - self.region.start) as usize;
            let old = &mut self.copy[off..off + now.len()];
            // Runs of changed blocks, each recorded as one write.
            let mut i = 0;
            while i < now.len() {
                let end = (i + BLOCK).min(now.len());
                if now[i..end] == old[i..end] {
                    i = end;
                    continue;
                }
                let start = i;
                while i < now.len() {
                    let e = (i + BLOCK).min(now.len());
                    if now[i..e] == old[i..e] {
                        break;
                    }
                    i = e;
                }
                rec.guest_wrote(lo + start as u64, &now[start..i]);
                old[start..i].copy_from_slice(&now[start..i]);
                self.recorded_bytes += (i - start) as u64;
            }
        }
        Ok(())
    }
}
