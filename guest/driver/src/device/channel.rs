//! GPFIFO channels: creation, submission and teardown. Mirrors nouveau's 4.x-era
//! `engine/fifo/gpfifogf100.c` (`gf100_fifo_gpfifo_new`: USERD clear, RAMFC; `_init`: bind,
//! runlist insert, start; `_fini`: stop, runlist remove, unbind) and the submission path of
//! `nouveau_dma.c` (`nv50_dma_push`: pushbuffer words, then the IB entry, a read-back of the
//! pushbuffer to flush, then GP_PUT in USERD; `nv50_dma_push_wait`: GPFIFO space from GP_GET).
//!
//! ```text
//! create: USERD page cleared; RAMFC: 0x08/0x0c = USERD VRAM address, 0x48/0x4c = IB VA and
//!         log2(entries) << 16, nouveau defaults; 0x200/0x208 = PDB and limit (VM join)
//!         wr 0x3000 + chid*8 = 0xc0000000 | inst >> 12      bind
//!         runlist insert; wr 0x3004 + chid*8 = 0x001f0001; runlist commit
//!         SET_OBJECT 0x490b5 (copy, PCOPY0) on subchannel 4, 0x90c0 (compute, PGRAPH) on 1
//! submit: words -> pushbuffer ring, IB entry -> GPFIFO ring, read back, BAR1 USERD+0x8c = put
//! free:   runlist remove; mask 0x3004 + chid*8 bit 0 off; runlist commit;
//!         wr 0x2634 = chid, wait bit 20 clear (preempt); wr 0x3000 + chid*8 = 0
//! ```
//!
//! Channel VM layout: the pushbuffer ring and the GPFIFO ring share one buffer (nouveau puts the
//! IB after 64 KiB of pushbuffer in the same object); a 4 KiB semaphore page holds the channel
//! fence (offset 0) and timestamp query slots (16 bytes each from offset 0x10).

use alloc::collections::VecDeque;

use gf100::gpfifo::{self, GpEntry};
use gf100::{compute, copy, host, inst, pfifo, userd, Target};

use crate::buffer::Buffer;
use crate::config::{FenceMode, ReleaseSize};
use crate::device::Gpu;
use crate::error::DriverError;
use crate::hal::Bar;
use crate::instmem::InstObj;
use crate::push::{PushBuf, SUBC_COMPUTE, SUBC_COPY};
use crate::vm::AddressSpace;
use crate::wait::Backoff;
use crate::Hal;

pub(crate) use crate::fifo::Fifo;

/// Bytes of the semaphore page.
pub const SEMAPHORE_BYTES: u64 = gf100::PAGE_SIZE;
/// Offset of the channel fence in the semaphore page (16-byte release: sequence, 0, timestamp).
pub const FENCE_OFFSET: u64 = 0;
/// Offset of the first timestamp query slot.
pub const QUERY_BASE: u64 = 0x10;
/// Bytes per query slot (one 16-byte release).
pub const QUERY_STRIDE: u64 = 0x10;
/// Number of query slots.
pub const QUERY_SLOTS: u32 = ((SEMAPHORE_BYTES - QUERY_BASE) / QUERY_STRIDE) as u32;

/// A submission's completion marker: the channel fence reaches `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub(crate) chid: u32,
    pub(crate) seq: u32,
}

impl Fence {
    /// The sequence number.
    pub fn seq(&self) -> u32 {
        self.seq
    }
}

#[derive(Debug, Clone, Copy)]
struct Segment {
    seq: u32,
    start: u64,
    end: u64,
}

/// A GPFIFO channel with its address space.
#[derive(Debug)]
pub struct Channel {
    pub(crate) chid: u32,
    pub(crate) vm: AddressSpace,
    pub(crate) inst: InstObj,
    pub(crate) push: Buffer,
    pub(crate) sem: Buffer,
    pb_size: u64,
    ib_entries: u32,
    ib_put: u32,
    ib_free: u32,
    pb_put: u64,
    inflight: VecDeque<Segment>,
    pub(crate) seq: u32,
    /// Set when the hardware reported an error for this channel; it should be freed.
    pub(crate) broken: bool,
}

impl Channel {
    /// Hardware channel id.
    pub fn chid(&self) -> u32 {
        self.chid
    }
    /// The channel's address space (for [`Gpu::buffer_new`]).
    pub fn vm_mut(&mut self) -> &mut AddressSpace {
        &mut self.vm
    }
    /// True once the hardware reported an error for this channel.
    pub fn is_broken(&self) -> bool {
        self.broken
    }
    /// GPU VA of the channel fence.
    pub fn fence_va(&self) -> u64 {
        self.sem.va() + FENCE_OFFSET
    }
    /// GPU VA of timestamp query slot `slot` (wraps modulo [`QUERY_SLOTS`]).
    pub fn query_va(&self, slot: u32) -> u64 {
        self.sem.va() + QUERY_BASE + (slot % QUERY_SLOTS) as u64 * QUERY_STRIDE
    }
    /// Appends a 16-byte semaphore release to query slot `slot` (GPU timestamp when the work
    /// before it has finished).
    pub fn push_timestamp(&self, pb: &mut PushBuf, slot: u32) {
        pb.semaphore_release(self.query_va(slot), slot, true, false);
    }
    /// Releases of channel fences still in flight.
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// Forgets the in-flight segments up to and including sequence `seq`.
    pub(crate) fn retire_upto(&mut self, seq: u32) {
        while self
            .inflight
            .front()
            .is_some_and(|s| seq_reached(seq, s.seq))
        {
            self.inflight.pop_front();
        }
    }
}

/// True if fence value `cur` has reached `seq` (wrapping comparison).
pub(crate) fn seq_reached(cur: u32, seq: u32) -> bool {
    (cur.wrapping_sub(seq) as i32) >= 0
}

impl<H: Hal> Gpu<H> {
    /// Creates a channel: VM, instance block, pushbuffer + GPFIFO ring, semaphore page, bound,
    /// on the runlist, started, with the copy and compute classes bound.
    pub fn channel_new(&mut self) -> Result<Channel, DriverError> {
        let chid = self.chid_alloc()?;
        let mut vm = match self.vm_new() {
            Ok(vm) => vm,
            Err(e) => {
                let _ = self.chid_free(chid);
                return Err(e);
            }
        };
        let parts = self.channel_parts(&mut vm);
        let (inst_blk, push, sem) = match parts {
            Ok(p) => p,
            Err(e) => {
                let _ = self.vm_free(vm);
                let _ = self.chid_free(chid);
                return Err(e);
            }
        };
        let entries = self.cfg.gpfifo_entries;
        let mut ch = Channel {
            chid,
            vm,
            inst: inst_blk,
            push,
            sem,
            pb_size: self.cfg.pushbuf_bytes,
            ib_entries: entries,
            ib_put: 0,
            ib_free: entries - 1,
            pb_put: 0,
            inflight: VecDeque::new(),
            seq: 0,
            broken: false,
        };
        if let Err(e) = self.channel_start(&mut ch) {
            ch.broken = true;
            let _ = self.channel_free(ch);
            return Err(e);
        }
        Ok(ch)
    }

    fn channel_parts(
        &mut self,
        vm: &mut AddressSpace,
    ) -> Result<(InstObj, Buffer, Buffer), DriverError> {
        let inst_blk = self.inst_new(inst::SIZE, inst::SIZE)?;
        let ring = self.cfg.pushbuf_bytes + self.cfg.gpfifo_entries as u64 * gpfifo::ENTRY_SIZE;
        let push = match self.buffer_new(vm, ring, self.cfg.pushbuf_mem, true) {
            Ok(b) => b,
            Err(e) => {
                let _ = self.inst_free(inst_blk);
                return Err(e);
            }
        };
        let sem = match self.buffer_new(vm, SEMAPHORE_BYTES, self.cfg.semaphore_mem, true) {
            Ok(b) => b,
            Err(e) => {
                let _ = self.buffer_free(vm, push);
                let _ = self.inst_free(inst_blk);
                return Err(e);
            }
        };
        Ok((inst_blk, push, sem))
    }

    fn channel_start(&mut self, ch: &mut Channel) -> Result<(), DriverError> {
        let chid = ch.chid;
        self.buffer_fill(&ch.sem, 0, SEMAPHORE_BYTES, 0)?;
        self.userd_clear(chid)?;

        // RAMFC (gf100_fifo_gpfifo_new) and the VM join.
        let userd_addr = self.userd_vram(chid)?;
        let userd_ptr = inst::userd_encode(userd_addr, Target::Vram);
        let ib_va = ch.push.va() + ch.pb_size;
        self.inst_wr32(&ch.inst, inst::RAMFC_USERD_LO, userd_ptr as u32);
        self.inst_wr32(&ch.inst, inst::RAMFC_USERD_HI, (userd_ptr >> 32) as u32);
        self.inst_wr32(&ch.inst, inst::RAMFC_IB_BASE_LO, ib_va as u32);
        self.inst_wr32(
            &ch.inst,
            inst::RAMFC_IB_CONFIG,
            inst::ib_config_encode(ib_va, ch.ib_entries),
        );
        for (off, v) in inst::RAMFC_NOUVEAU_DEFAULTS {
            self.inst_wr32(&ch.inst, off, v);
        }
        self.vm_join(&ch.vm, &ch.inst);
        self.inst_done()?;

        // gf100_fifo_gpfifo_init: bind, runlist insert, start, commit.
        self.channel_bind(chid, &ch.inst, &mut ch.vm);
        self.runlist_update(chid, true)?;
        self.wr32(pfifo::chan_state(chid), pfifo::STATE_START);
        self.runlist_commit()?;

        // Bind the classes the workloads use, each on its own subchannel.
        let mut pb = PushBuf::new();
        pb.set_object(SUBC_COPY, copy::CLASS, host::ENGINE_PCOPY0);
        pb.set_object(SUBC_COMPUTE, compute::CLASS, host::ENGINE_PGRAPH);
        let f = self.submit(ch, &pb)?;
        self.fence_wait(ch, f)
    }

    /// Stops, unbinds and frees a channel and everything it owns. Outstanding work of a healthy
    /// channel is waited for first.
    pub fn channel_free(&mut self, mut ch: Channel) -> Result<(), DriverError> {
        let mut first_err = None;
        if !ch.broken && !ch.inflight.is_empty() {
            let last = Fence {
                chid: ch.chid,
                seq: ch.seq,
            };
            if let Err(e) = self.fence_wait(&mut ch, last) {
                first_err.get_or_insert(e);
            }
        }
        let chid = ch.chid;
        // gf100_fifo_gpfifo_fini: runlist remove, stop, commit; preempt; unbind.
        let r = (|| {
            self.runlist_update(chid, false)?;
            self.mask32(pfifo::chan_state(chid), pfifo::STATE_RUNNABLE, 0);
            self.runlist_commit()?;
            self.wr32(pfifo::KICK, chid);
            self.wait_reg(pfifo::KICK, "channel preempt (0x2634)", |v| {
                v & pfifo::KICK_PENDING == 0
            })?;
            Ok(())
        })();
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
        self.channel_unbind(chid, &mut ch.vm);
        let Channel {
            mut vm,
            inst: inst_blk,
            push,
            sem,
            ..
        } = ch;
        for r in [
            self.buffer_free(&mut vm, push),
            self.buffer_free(&mut vm, sem),
            self.inst_free(inst_blk),
            self.vm_free(vm),
            self.chid_free(chid),
        ] {
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Binds channel `chid` to its instance block (`wr 0x3000 + chid*8 = 0xc0000000 | inst >>
    /// 12`). From here the device model knows `vm`'s page directory, so para-virtual ops may name
    /// it.
    pub(crate) fn channel_bind(&mut self, chid: u32, inst_blk: &InstObj, vm: &mut AddressSpace) {
        self.wr32(
            pfifo::chan_table(chid),
            pfifo::chan_encode(inst_blk.addr(), Target::Vram),
        );
        vm.pv_bound = true;
    }

    /// Unbinds channel `chid` (`wr 0x3000 + chid*8 = 0`); `vm` is written directly from here.
    pub(crate) fn channel_unbind(&mut self, chid: u32, vm: &mut AddressSpace) {
        vm.pv_bound = false;
        self.wr32(pfifo::chan_table(chid), 0);
    }

    /// Where channel `ch`'s doorbell is and what it holds now: the BAR1 offset of its USERD
    /// GP_PUT word and the GP_PUT value last written (writing it again announces no new work:
    /// a trapped write the host must still handle, which `gpuvm exp traps` hammers).
    pub fn doorbell(&mut self, ch: &Channel) -> Result<(u64, u32), DriverError> {
        Ok((self.userd_bar1(ch.chid)? + userd::GP_PUT, ch.ib_put))
    }

    /// Submits a pushbuffer segment followed by a release of the channel fence (and, in
    /// interrupt mode, a non-stall interrupt); returns the fence.
    pub fn submit(&mut self, ch: &mut Channel, pb: &PushBuf) -> Result<Fence, DriverError> {
        if ch.broken {
            return Err(DriverError::InvalidArgument {
                what: "submission to a broken channel",
            });
        }
        let seq = ch.seq.wrapping_add(1);
        let mut tail = PushBuf::new();
        tail.semaphore_release(
            ch.fence_va(),
            seq,
            self.cfg.fence_release == ReleaseSize::Long,
            self.fence_mode == FenceMode::Interrupt,
        );
        let dwords = pb.len() + tail.len();
        let len = dwords as u64 * 4;
        if len > ch.pb_size || dwords as u64 > gpfifo::MAX_LENGTH_DWORDS as u64 {
            return Err(DriverError::InvalidArgument {
                what: "pushbuffer segment larger than the ring",
            });
        }
        let start = self.pb_reserve(ch, len)?;
        let push = &ch.push;
        self.buffer_write_words(push, start, pb.words())?;
        self.buffer_write_words(push, start + pb.len() as u64 * 4, tail.words())?;

        self.ib_wait(ch)?;
        let entry = GpEntry::new(ch.push.va() + start, dwords as u32).encode_words();
        let slot = ch.pb_size + ch.ib_put as u64 * gpfifo::ENTRY_SIZE;
        self.buffer_write_words(&ch.push, slot, &[entry.0, entry.1])?;
        ch.ib_put = (ch.ib_put + 1) % ch.ib_entries;
        ch.ib_free -= 1;
        // Flush the writes before the doorbell, as nv50_dma_push does.
        let _ = self.buffer_rd32(&ch.push, 0)?;
        let userd = self.userd_bar1(ch.chid)?;
        self.hal
            .write32(Bar::Bar1, userd + userd::GP_PUT, ch.ib_put);

        ch.seq = seq;
        ch.pb_put = start + len;
        ch.inflight.push_back(Segment {
            seq,
            start,
            end: start + len,
        });
        Ok(Fence { chid: ch.chid, seq })
    }

    /// Finds room for `len` bytes in the pushbuffer ring, waiting for the fences of segments
    /// still in the way.
    fn pb_reserve(&mut self, ch: &mut Channel, len: u64) -> Result<u64, DriverError> {
        let pos = if ch.pb_put + len > ch.pb_size {
            0
        } else {
            ch.pb_put
        };
        loop {
            self.fence_retire(ch)?;
            let blocking = ch
                .inflight
                .iter()
                .filter(|s| s.start < pos + len && pos < s.end)
                .map(|s| s.seq)
                .next_back();
            match blocking {
                None => return Ok(pos),
                Some(seq) => self.fence_wait(ch, Fence { chid: ch.chid, seq })?,
            }
        }
    }

    /// Drops the segments the current fence value shows complete. A value beyond the last
    /// emitted sequence is garbage and retires nothing.
    pub(crate) fn fence_retire(&mut self, ch: &mut Channel) -> Result<(), DriverError> {
        if ch.inflight.is_empty() {
            return Ok(());
        }
        let cur = self.fence_value(ch)?;
        if seq_reached(ch.seq, cur) {
            ch.retire_upto(cur);
        }
        Ok(())
    }

    /// Waits for a free GPFIFO entry, re-reading GP_GET only when the cached count runs out
    /// (`nv50_dma_push_wait`).
    fn ib_wait(&mut self, ch: &mut Channel) -> Result<(), DriverError> {
        let mut b = Backoff::new(self.cfg.timeout_ns);
        let userd = self.userd_bar1(ch.chid)?;
        while ch.ib_free == 0 {
            let get = self.hal.read32(Bar::Bar1, userd + userd::GP_GET);
            if get >= ch.ib_entries {
                ch.broken = true;
                return Err(DriverError::BadHardwareValue {
                    what: "GP_GET",
                    value: get as u64,
                });
            }
            ch.ib_free = (get + ch.ib_entries - ch.ib_put - 1) % ch.ib_entries;
            if ch.ib_free > 0 {
                break;
            }
            if let Err(e) = self.check_fifo_errors() {
                ch.broken = true;
                return Err(e);
            }
            if !b.delay(&mut self.hal) {
                return Err(DriverError::Timeout {
                    what: "GPFIFO space (GP_GET)",
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_sequence_comparison() {
        assert!(seq_reached(5, 5));
        assert!(seq_reached(6, 5));
        assert!(!seq_reached(4, 5));
        assert!(seq_reached(2, u32::MAX - 1));
        assert!(!seq_reached(u32::MAX - 1, 2));
    }

    #[test]
    fn semaphore_page_layout() {
        assert_eq!(QUERY_SLOTS, 255);
        const { assert!(QUERY_BASE >= FENCE_OFFSET + 16) };
    }
}
