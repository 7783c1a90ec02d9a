//! GPFIFO ("IB") entries: the 8-byte ring entries that point PFIFO at pushbuffer segments.
//!
//! Sources: OGD `cl906f.h` `NV906F_GP_ENTRY0/1`; ENVY `docs/hw/fifo/dma-pusher.rst` ("IB mode").
//! Field positions checked against the text of `cl906f.h` (FETCH 0:0, NO_CONTEXT_SWITCH 1:1,
//! GET 31:2; GET_HI 7:0, PRIV 8:8, LEVEL 9:9, LENGTH 30:10, SYNC 31:31, OPCODE 7:0 for LENGTH 0)
//! and NV-DMA `nv50_dma_push` (`hi = upper_32_bits(va) | length_bytes << 8`).
//!
//! word0: bit 0 FETCH (conditional), bit 1 NO_CONTEXT_SWITCH, bits 31:2 pushbuffer VA bits 31:2.
//! word1: bits 7:0 VA bits 39:32, bit 8 PRIV, bit 9 LEVEL (subroutine), bits 30:10 LENGTH in
//! dwords, bit 31 SYNC (wait). LENGTH 0 marks a control entry; the model does not implement
//! control entries and treats every length-0 entry as invalid, as envytools documents for the
//! pre-GF100 IB_EMPTY error (PBDMA INTR IB_ENTRY_INVALID).

/// Size of one entry in bytes.
pub const ENTRY_SIZE: u64 = 8;
/// Largest LENGTH value (21 bits).
pub const MAX_LENGTH_DWORDS: u32 = (1 << 21) - 1;

/// A decoded GPFIFO entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpEntry {
    /// GPU VA of the pushbuffer segment (4-byte aligned, 40 bits).
    pub va: u64,
    /// Length of the segment in dwords (1..=[`MAX_LENGTH_DWORDS`]).
    pub length_dwords: u32,
    /// Conditional fetch.
    pub fetch_conditional: bool,
    /// Do not context switch while this segment runs.
    pub no_context_switch: bool,
    /// Privileged (kernel) segment.
    pub privileged: bool,
    /// Subroutine level (not main).
    pub subroutine: bool,
    /// Wait for the previous segment's completion before fetching.
    pub sync_wait: bool,
}

/// Why [`GpEntry::decode`] rejected an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpEntryError {
    /// LENGTH is 0 (a control entry, or a corrupt one).
    ZeroLength,
}

impl GpEntry {
    /// A plain main-level entry for `length_dwords` dwords at `va`.
    pub const fn new(va: u64, length_dwords: u32) -> GpEntry {
        GpEntry {
            va,
            length_dwords,
            fetch_conditional: false,
            no_context_switch: false,
            privileged: false,
            subroutine: false,
            sync_wait: false,
        }
    }

    /// Encodes the entry as (word0, word1).
    pub const fn encode_words(&self) -> (u32, u32) {
        let mut w0 = (self.va as u32) & !3;
        if self.fetch_conditional {
            w0 |= 1;
        }
        if self.no_context_switch {
            w0 |= 2;
        }
        let mut w1 =
            ((self.va >> 32) as u32 & 0xff) | ((self.length_dwords & MAX_LENGTH_DWORDS) << 10);
        if self.privileged {
            w1 |= 1 << 8;
        }
        if self.subroutine {
            w1 |= 1 << 9;
        }
        if self.sync_wait {
            w1 |= 1 << 31;
        }
        (w0, w1)
    }

    /// Encodes the entry as the little-endian u64 stored in the ring (word0 in the low half).
    pub const fn encode(&self) -> u64 {
        let (w0, w1) = self.encode_words();
        (w1 as u64) << 32 | w0 as u64
    }

    /// Decodes a stored entry.
    pub const fn decode(raw: u64) -> Result<GpEntry, GpEntryError> {
        let w0 = raw as u32;
        let w1 = (raw >> 32) as u32;
        let length_dwords = (w1 >> 10) & MAX_LENGTH_DWORDS;
        if length_dwords == 0 {
            return Err(GpEntryError::ZeroLength);
        }
        Ok(GpEntry {
            va: ((w1 & 0xff) as u64) << 32 | (w0 & !3) as u64,
            length_dwords,
            fetch_conditional: w0 & 1 != 0,
            no_context_switch: w0 & 2 != 0,
            privileged: w1 & (1 << 8) != 0,
            subroutine: w1 & (1 << 9) != 0,
            sync_wait: w1 & (1 << 31) != 0,
        })
    }
}
