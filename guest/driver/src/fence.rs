//! Fences: sequence numbers released by the GPU into the channel's semaphore page, and GPU
//! timestamps. Mirrors nouveau's `nvc0_fence.c` (`nvc0_fence_emit32`: SEMAPHORE_A..D with
//! WRITE_LONG, then NON_STALL_INTERRUPT) and `nouveau_fence.c` (`nouveau_fence_wait`: busy-wait
//! by reading the sequence, or sleep until the non-stall "uevent" interrupt).
//!
//! The release is emitted by [`Gpu::submit`] after every segment. Waiting reads the sequence at
//! offset 0 of the semaphore page (through BAR1 for a VRAM page, directly for a guest-RAM page),
//! and, between reads, either delays with back-off (poll mode; PFIFO INTR is checked for MMU
//! faults and PBDMA errors on each round) or sleeps in `Platform::wait_for_interrupt` and then
//! services the interrupt as nouveau does (interrupt mode). Every wait is bounded by the
//! configured timeout.

use crate::channel::{
    seq_reached, Channel, Fence, FENCE_OFFSET, QUERY_BASE, QUERY_SLOTS, QUERY_STRIDE,
};
use crate::config::FenceMode;
use crate::device::Gpu;
use crate::error::DriverError;
use crate::wait::Backoff;
use crate::Hal;

/// Longest single sleep in interrupt mode; bounds the cost of a lost interrupt.
pub const INTERRUPT_SLICE_NS: u64 = 10_000_000;

/// Offset of the timestamp within a 16-byte semaphore release.
const TIMESTAMP_OFFSET: u64 = 8;

impl<H: Hal> Gpu<H> {
    /// The channel's fence value as last released by the GPU.
    pub fn fence_value(&mut self, ch: &Channel) -> Result<u32, DriverError> {
        self.buffer_rd32(&ch.sem, FENCE_OFFSET)
    }

    /// True if `f` has signalled.
    pub fn fence_done(&mut self, ch: &Channel, f: Fence) -> Result<bool, DriverError> {
        Ok(seq_reached(self.fence_value(ch)?, f.seq))
    }

    /// Waits until `f` signals, an error is reported, or the timeout passes.
    pub fn fence_wait(&mut self, ch: &mut Channel, f: Fence) -> Result<(), DriverError> {
        if f.chid != ch.chid || !seq_reached(ch.seq, f.seq) {
            return Err(DriverError::InvalidArgument {
                what: "fence of another channel or not yet emitted",
            });
        }
        let r = self.fence_wait_inner(ch, f);
        match r {
            Ok(()) => {
                ch.retire_upto(f.seq);
                Ok(())
            }
            Err(e) => {
                ch.broken = true;
                Err(e)
            }
        }
    }

    fn fence_wait_inner(&mut self, ch: &mut Channel, f: Fence) -> Result<(), DriverError> {
        let mut b = Backoff::new(self.cfg.timeout_ns);
        loop {
            if self.fence_done(ch, f)? {
                return Ok(());
            }
            match self.fence_mode {
                FenceMode::Poll => {
                    self.check_fifo_errors()?;
                    if !b.delay(&mut self.hal) {
                        return Err(DriverError::Timeout {
                            what: "fence (semaphore release)",
                        });
                    }
                }
                FenceMode::Interrupt => {
                    if b.expired() {
                        return Err(DriverError::Timeout {
                            what: "fence (non-stall interrupt)",
                        });
                    }
                    let slice = b.remaining().min(INTERRUPT_SLICE_NS);
                    if self.hal.wait_for_interrupt(slice) {
                        // Charged like a poll delay, so an interrupt storm still ends.
                        b.charge(b.next_delay().max(Backoff::IRQ_CHARGE_NS));
                        self.handle_interrupt()?;
                    } else {
                        b.charge(slice);
                        // No interrupt in a whole slice: look for errors the line did not show.
                        self.check_fifo_errors()?;
                    }
                }
            }
        }
    }

    /// The GPU timestamp (ns) of the 16-byte release in query slot `slot`.
    pub fn query_timestamp(&mut self, ch: &Channel, slot: u32) -> Result<u64, DriverError> {
        let off = QUERY_BASE + (slot % QUERY_SLOTS) as u64 * QUERY_STRIDE + TIMESTAMP_OFFSET;
        self.buffer_rd64(&ch.sem, off)
    }

    /// The payload last released into query slot `slot`.
    pub fn query_value(&mut self, ch: &Channel, slot: u32) -> Result<u32, DriverError> {
        let off = QUERY_BASE + (slot % QUERY_SLOTS) as u64 * QUERY_STRIDE;
        self.buffer_rd32(&ch.sem, off)
    }

    /// The GPU timestamp of the channel fence's last 16-byte release.
    pub fn fence_timestamp(&mut self, ch: &Channel) -> Result<u64, DriverError> {
        self.buffer_rd64(&ch.sem, FENCE_OFFSET + TIMESTAMP_OFFSET)
    }
}
