//! The input of `vgpu_mmio`: the operations of VM 0 ([`FuzzOp`]) and the bytes they decode
//! from and encode to. Apart from the target so that `seeds` can encode recorded traces as
//! inputs, and the target can start from `seeds`' checkpoints, without either naming the other.

use gpuvm::mmio::regions::BAR0_REGIONS;
use gpuvm::phys::Bar;

use crate::Input;

/// Accesses per input at most (keeps one execution bounded; trace seeds use a few thousand).
pub const MAX_OPS: usize = 16384;

/// One decoded operation of VM 0. The input is a stream of these; [`FuzzOp::encode`] writes
/// the bytes that decode back to the same operation (used to seed the corpus from recorded
/// traces, `crate::seeds`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FuzzOp {
    /// A BAR access of `width` bytes (1, 2, 4 or 8) at `offset` in `bar`.
    Bar {
        /// Which BAR.
        bar: Bar,
        /// Offset in the BAR (already reduced into the BAR and aligned as the input asked).
        offset: u64,
        /// 1, 2, 4 or 8.
        width: u8,
        /// Write (else read).
        write: bool,
        /// The value written (little-endian, low `width` bytes).
        value: u64,
    },
    /// A config-space access of at most 4 bytes.
    Config {
        /// Offset in config space.
        offset: u16,
        /// 1, 2 or 4.
        width: u8,
        /// Write (else read).
        write: bool,
        /// The value written.
        value: u32,
    },
    /// Advance the clock by `us` microseconds and poll the host.
    Advance {
        /// Microseconds.
        us: u16,
    },
    /// Write 8 bytes of VM 0's guest RAM at `gpa` (reduced into its RAM), as its driver does
    /// before a doorbell.
    RamWrite {
        /// Guest-physical address.
        gpa: u32,
        /// The bytes.
        value: u64,
    },
    /// `Vgpu::poll` of VM 0.
    Poll,
    /// Destroy VM 0 (once; later operations hit a destroyed vGPU).
    Destroy,
}

/// Tag byte layout: bits 0-3 the kind, bits 4-5 log2 of the width, bit 6 write.
const TAG_CONFIG: u8 = 12;
const TAG_ADVANCE: u8 = 14;
const TAG_OTHER: u8 = 15;
/// A `TAG_OTHER` tag with these bits set (0x7f) is a guest RAM write; 0xff destroys VM 0;
/// every other `TAG_OTHER` tag polls.
const TAG_RAM_WRITE: u8 = 0x7f;
const TAG_DESTROY: u8 = 0xff;
/// Offset selectors that take the raw offset modulo the BAR size (no region bias), aligned.
const SEL_RAW_BAR0: u8 = 0xe0;
const SEL_RAW_APERTURE: u8 = 0xc0;

fn bar0_offset(inp: &mut Input, width: u64) -> u64 {
    let sel = inp.u8();
    let raw = u64::from(inp.u32());
    let off = if sel < SEL_RAW_BAR0 {
        let r = &BAR0_REGIONS[sel as usize % BAR0_REGIONS.len()];
        u64::from(r.offset) + raw % u64::from(r.size.max(1))
    } else {
        raw % Bar::Bar0.size()
    };
    if sel & 1 == 0 {
        off & !(width - 1)
    } else {
        off
    }
}

fn aperture_offset(inp: &mut Input, bar: Bar, width: u64) -> u64 {
    let sel = inp.u8();
    let raw = u64::from(inp.u32());
    // Mostly the first 16 MiB, where a driver maps things; sometimes anywhere.
    let off = if sel < SEL_RAW_APERTURE {
        raw % (16 << 20)
    } else {
        raw % bar.size()
    };
    (off & !(width - 1)).min(bar.size() - width)
}

impl FuzzOp {
    /// Decodes the next operation, or `None` at the end of the input.
    pub fn decode(inp: &mut Input) -> Option<FuzzOp> {
        if inp.is_empty() {
            return None;
        }
        let tag = inp.u8();
        let width = 1u64 << ((tag >> 4) & 3);
        let write = tag & 0x40 != 0;
        let value = inp.u64();
        let bar_op = |bar, offset| FuzzOp::Bar {
            bar,
            offset,
            width: width as u8,
            write,
            value,
        };
        Some(match tag & 0x0f {
            0..=6 => bar_op(Bar::Bar0, bar0_offset(inp, width)),
            7..=9 => bar_op(Bar::Bar1, aperture_offset(inp, Bar::Bar1, width)),
            10..=11 => bar_op(Bar::Bar3, aperture_offset(inp, Bar::Bar3, width)),
            12..=13 => {
                let raw = inp.u16();
                let offset = if raw & 0x8000 == 0 {
                    raw % 0x100
                } else {
                    raw % 0x1000
                };
                FuzzOp::Config {
                    offset,
                    width: width.min(4) as u8,
                    write,
                    value: value as u32,
                }
            }
            TAG_ADVANCE => FuzzOp::Advance { us: inp.u16() },
            _ => match tag {
                TAG_DESTROY => FuzzOp::Destroy,
                TAG_RAM_WRITE => FuzzOp::RamWrite {
                    gpa: inp.u32(),
                    value,
                },
                _ => FuzzOp::Poll,
            },
        })
    }

    /// Appends the bytes that [`FuzzOp::decode`] turns back into this operation. BAR offsets
    /// use the raw (unbiased, aligned) selector, so an offset must be aligned to its width.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let tag = |kind: u8, width: u8, write: bool| -> u8 {
            kind | ((width.trailing_zeros() as u8) << 4) | if write { 0x40 } else { 0 }
        };
        match *self {
            FuzzOp::Bar {
                bar,
                offset,
                width,
                write,
                value,
            } => {
                let (kind, sel) = match bar {
                    Bar::Bar0 => (0, SEL_RAW_BAR0),
                    Bar::Bar1 => (7, SEL_RAW_APERTURE),
                    Bar::Bar3 => (10, SEL_RAW_APERTURE),
                };
                out.push(tag(kind, width, write));
                out.extend_from_slice(&value.to_le_bytes());
                out.push(sel);
                out.extend_from_slice(&(offset as u32).to_le_bytes());
            }
            FuzzOp::Config {
                offset,
                width,
                write,
                value,
            } => {
                out.push(tag(TAG_CONFIG, width, write));
                out.extend_from_slice(&u64::from(value).to_le_bytes());
                out.extend_from_slice(&(offset | 0x8000).to_le_bytes());
            }
            FuzzOp::Advance { us } => {
                out.push(TAG_ADVANCE);
                out.extend_from_slice(&[0; 8]);
                out.extend_from_slice(&us.to_le_bytes());
            }
            FuzzOp::RamWrite { gpa, value } => {
                out.push(TAG_RAM_WRITE);
                out.extend_from_slice(&value.to_le_bytes());
                out.extend_from_slice(&gpa.to_le_bytes());
            }
            FuzzOp::Poll => {
                out.push(TAG_OTHER);
                out.extend_from_slice(&[0; 8]);
            }
            FuzzOp::Destroy => {
                out.push(TAG_DESTROY);
                out.extend_from_slice(&[0; 8]);
            }
        }
    }
}
