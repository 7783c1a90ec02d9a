//! Pushbuffer method headers (GF100 "new" formats plus the legacy NV4-style ones).
//!
//! Sources: OGD `cl906f.h` "dma method formats"; ENVY `docs/hw/fifo/dma-pusher.rst`
//! ("GF100 commands"); nouveau `BEGIN_NVC0` / `BEGIN_IMC0`. Checked against the text of
//! `cl906f.h`: SEC_OP 31:29, COUNT/IMMD_DATA 28:16, SUBCHANNEL 15:13, ADDRESS 11:0, TERT_OP 17:16;
//! legacy `NV906F_DMA_ADDRESS` 12:2, `DMA_COUNT` 28:18, `DMA_OPCODE` 0 METHOD / 2 NONINC_METHOD;
//! and nouveau `nouveau_dma.h` (`BEGIN_NVC0` = `0x20000000 | size << 16 | subc << 13 |
//! mthd >> 2`, `BEGIN_NIC0` 0x60000000, `BEGIN_IMC0` 0x80000000, `BEGIN_NV04` legacy
//! `size << 18 | subc << 13 | mthd`, `BEGIN_NI04` 0x40000000).
//!
//! **(UNCERTAIN)** what hardware does with a SEC_OP 0 / TERT_OP 1-3 header whose bits 28:18 are
//! nonzero (cl906f.h defines those as a 16-bit opcode in 31:16); the decoder accepts it as a
//! sub-device mask operation.
//!
//! New format: bits 31:29 SEC_OP, 28:16 COUNT (or 13-bit immediate data), 15:13 SUBCHANNEL,
//! 11:0 METHOD ADDRESS in dwords. SEC_OP 1 incrementing, 3 non-incrementing, 4 immediate,
//! 5 increment-once, 7 end of segment, 6 reserved (illegal). SEC_OP 0 and 2 use TERT_OP (bits
//! 17:16): SEC_OP 0 / TERT 0 is the legacy incrementing format (method byte address in 12:2,
//! count in 28:18), TERT 1-3 are sub-device mask operations; SEC_OP 2 / TERT 0 is the legacy
//! non-incrementing format. A header of 0 is a NOP (legacy incrementing, count 0).

/// Number of subchannels.
pub const SUBCHANNELS: u32 = 8;
/// Largest COUNT of a new-format header (13 bits).
pub const MAX_COUNT: u32 = (1 << 13) - 1;
/// Largest immediate data value (13 bits).
pub const MAX_IMMEDIATE: u32 = (1 << 13) - 1;
/// Largest method byte offset addressable by a header (12-bit dword address).
pub const MAX_METHOD: u32 = 0xfff << 2;

/// How the data words after a header are assigned to methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Word i goes to method + 4*i.
    Incrementing,
    /// Every word goes to the same method.
    NonIncrementing,
    /// The first word goes to method, the rest to method + 4.
    IncrementOnce,
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// `count` data words follow, assigned per `mode` starting at byte method `method`.
    Methods {
        /// Assignment mode.
        mode: Mode,
        /// Subchannel 0..8.
        subchannel: u32,
        /// Method byte offset (multiple of 4).
        method: u32,
        /// Number of data words that follow.
        count: u32,
    },
    /// One method with a 13-bit value carried in the header itself.
    Immediate {
        /// Subchannel 0..8.
        subchannel: u32,
        /// Method byte offset.
        method: u32,
        /// The value.
        data: u32,
    },
    /// A sub-device mask operation (SLI); no data words; ignored on a single GPU.
    SubDeviceMask,
    /// End of the pushbuffer segment.
    EndSegment,
}

/// Why [`Header::decode`] rejected a header (PBDMA ILLEGAL_CMD).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// SEC_OP 6 (RESERVED6).
    ReservedOpcode,
    /// SEC_OP 2 with a nonzero TERT_OP.
    ReservedTertiary,
}

impl Header {
    /// Decodes a header word.
    pub const fn decode(word: u32) -> Result<Header, HeaderError> {
        let sec_op = word >> 29;
        let subchannel = (word >> 13) & 7;
        let method = (word & 0xfff) << 2;
        let count = (word >> 16) & MAX_COUNT;
        match sec_op {
            0 => match (word >> 16) & 3 {
                0 => Ok(Header::Methods {
                    mode: Mode::Incrementing,
                    subchannel,
                    method: word & 0x1ffc,
                    count: (word >> 18) & 0x7ff,
                }),
                _ => Ok(Header::SubDeviceMask),
            },
            1 => Ok(Header::Methods {
                mode: Mode::Incrementing,
                subchannel,
                method,
                count,
            }),
            2 => match (word >> 16) & 3 {
                0 => Ok(Header::Methods {
                    mode: Mode::NonIncrementing,
                    subchannel,
                    method: word & 0x1ffc,
                    count: (word >> 18) & 0x7ff,
                }),
                _ => Err(HeaderError::ReservedTertiary),
            },
            3 => Ok(Header::Methods {
                mode: Mode::NonIncrementing,
                subchannel,
                method,
                count,
            }),
            4 => Ok(Header::Immediate {
                subchannel,
                method,
                data: count,
            }),
            5 => Ok(Header::Methods {
                mode: Mode::IncrementOnce,
                subchannel,
                method,
                count,
            }),
            6 => Err(HeaderError::ReservedOpcode),
            _ => Ok(Header::EndSegment),
        }
    }

    /// Encodes a header in the new format. Fields are masked to their widths; the legacy
    /// format is never produced. `SubDeviceMask` encodes as SET_SUB_DEV_MASK with mask 0.
    pub const fn encode(&self) -> u32 {
        match *self {
            Header::Methods {
                mode,
                subchannel,
                method,
                count,
            } => {
                let op = match mode {
                    Mode::Incrementing => 1,
                    Mode::NonIncrementing => 3,
                    Mode::IncrementOnce => 5,
                };
                op << 29
                    | (count & MAX_COUNT) << 16
                    | (subchannel & 7) << 13
                    | ((method >> 2) & 0xfff)
            }
            Header::Immediate {
                subchannel,
                method,
                data,
            } => {
                4 << 29
                    | (data & MAX_IMMEDIATE) << 16
                    | (subchannel & 7) << 13
                    | ((method >> 2) & 0xfff)
            }
            Header::SubDeviceMask => 1 << 16,
            Header::EndSegment => 7 << 29,
        }
    }

    /// Number of data words following this header in the pushbuffer.
    pub const fn data_words(&self) -> u32 {
        match *self {
            Header::Methods { count, .. } => count,
            _ => 0,
        }
    }
}

/// Incrementing header for `count` words from `method` on `subchannel` (nouveau `BEGIN_NVC0`).
pub const fn incr(subchannel: u32, method: u32, count: u32) -> u32 {
    Header::Methods {
        mode: Mode::Incrementing,
        subchannel,
        method,
        count,
    }
    .encode()
}

/// Non-incrementing header (nouveau `BEGIN_NIC0`).
pub const fn non_incr(subchannel: u32, method: u32, count: u32) -> u32 {
    Header::Methods {
        mode: Mode::NonIncrementing,
        subchannel,
        method,
        count,
    }
    .encode()
}

/// Immediate header (nouveau `BEGIN_IMC0`).
pub const fn immediate(subchannel: u32, method: u32, data: u32) -> u32 {
    Header::Immediate {
        subchannel,
        method,
        data,
    }
    .encode()
}
