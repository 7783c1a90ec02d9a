//! UML's PCI-over-virtio wire format (`include/uapi/linux/virtio_pcidev.h`), parsed and checked.
//!
//! Every command the guest puts on the command queue starts with a 16-byte header
//! `{ u8 op; u8 bar; u16 reserved; u32 size; u64 addr; }` followed, for writes, by `size` data
//! bytes (a memset carries one byte). Interrupts go back on the second queue as the same header
//! with op INT or MSI (MSI data in the payload). Nothing here trusts the guest: every field is
//! checked before the device model sees an access.
//!
//! **UML 6.12 sends BAR memsets as config writes.** `um_pci_bar_set` (`memset_io` on a BAR,
//! arch/um/drivers/virt-pci.c) fills its header with `VIRTIO_PCIDEV_OP_CFG_WRITE`, not
//! `OP_MMIO_MEMSET`, with `bar` = the BAR index, `size` = the memset length and one data byte
//! (padded to 8 by the struct's alignment). nouveau zeroes objects with `memset_io` through
//! BAR1/BAR3 (e.g. 640 KiB at 0x163000 while creating its first channel), so these arrived as
//! "config accesses" of hundreds of KiB and were refused. A config write as UML really sends
//! one has `bar` = 0 and a size of 1, 2, 4 or 8 inside the 4 KiB space; a CFG_WRITE with a
//! non-zero `bar` or any other size is therefore parsed as that memset ([`Command::MmioMemset`],
//! with the same BAR checks). Left ambiguous, and taken as the config write the protocol says:
//! a memset on BAR0 of 1, 2, 4 or 8 bytes below 4 KiB (nouveau does none).

use thiserror::Error;

/// Header size (`struct virtio_pcidev_msg` without its data).
pub const HDR_LEN: usize = 16;
/// Config space read.
pub const OP_CFG_READ: u8 = 1;
/// Config space write.
pub const OP_CFG_WRITE: u8 = 2;
/// BAR read (any length: `memcpy_fromio` too).
pub const OP_MMIO_READ: u8 = 3;
/// BAR write (any length).
pub const OP_MMIO_WRITE: u8 = 4;
/// BAR memset: one data byte repeated `size` times.
pub const OP_MMIO_MEMSET: u8 = 5;
/// Legacy interrupt (device to driver).
pub const OP_INT: u8 = 6;
/// MSI (device to driver): the payload is the MSI data.
pub const OP_MSI: u8 = 7;

/// The largest BAR access one command may ask for (a `memcpy_fromio`/`memset_io` of a page
/// table is 4 KiB; nothing nouveau does is near this). Larger ones are refused.
pub const MAX_ACCESS: u32 = 1 << 20;
/// Configuration space size.
pub const CONFIG_SIZE: u64 = 4096;

/// A checked command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Read `size` (1, 2, 4 or 8) bytes of config space at `offset`.
    CfgRead { offset: u16, size: usize },
    /// Write config space.
    CfgWrite { offset: u16, data: Vec<u8> },
    /// Read `size` bytes of BAR `bar` at `offset`.
    MmioRead { bar: u8, offset: u64, size: usize },
    /// Write BAR `bar` at `offset`.
    MmioWrite { bar: u8, offset: u64, data: Vec<u8> },
    /// Fill `size` bytes of BAR `bar` at `offset` with `value`.
    MmioMemset {
        bar: u8,
        offset: u64,
        size: usize,
        value: u8,
    },
}

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// Fewer than 16 bytes.
    #[error("command of {0} bytes is shorter than its header")]
    Short(usize),
    /// Unknown or device-to-driver op.
    #[error("unknown command op {0}")]
    Op(u8),
    /// Config access size other than 1, 2, 4, 8, or outside the 4 KiB space.
    #[error("config access of {size} bytes at {offset:#x} is not a valid one")]
    Config { offset: u64, size: u32 },
    /// BAR access of 0 bytes, too long, or wrapping.
    #[error("BAR access of {size} bytes at {offset:#x} is not a valid one")]
    Size { offset: u64, size: u32 },
    /// The data carried does not match the size announced.
    #[error("command announces {want} data bytes but carries {got}")]
    Payload { want: usize, got: usize },
}

/// Parses one command from the readable part of a descriptor chain.
pub fn parse(buf: &[u8]) -> Result<Command, WireError> {
    if buf.len() < HDR_LEN {
        return Err(WireError::Short(buf.len()));
    }
    let op = buf[0];
    let bar = buf[1];
    let size = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let addr = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
    let data = &buf[HDR_LEN..];
    let config_ok = matches!(size, 1 | 2 | 4 | 8)
        && addr < CONFIG_SIZE
        && addr + u64::from(size) <= CONFIG_SIZE;
    let bar_ok = size > 0 && size <= MAX_ACCESS && addr.checked_add(u64::from(size)).is_some();
    // UML 6.12's `um_pci_bar_set` (see the module documentation).
    let uml_memset = op == OP_CFG_WRITE && (bar != 0 || !config_ok);
    match op {
        OP_CFG_WRITE if uml_memset && !bar_ok => Err(WireError::Size { offset: addr, size }),
        OP_CFG_WRITE if uml_memset => {
            let v = payload(data, 1, true)?;
            Ok(Command::MmioMemset {
                bar,
                offset: addr,
                size: size as usize,
                value: v[0],
            })
        }
        OP_CFG_READ | OP_CFG_WRITE if !config_ok => Err(WireError::Config { offset: addr, size }),
        OP_CFG_READ => Ok(Command::CfgRead {
            offset: addr as u16,
            size: size as usize,
        }),
        OP_CFG_WRITE => {
            // UML sends the 8-byte data buffer whatever the size: at least `size` bytes.
            let data = payload(data, size as usize, true)?;
            Ok(Command::CfgWrite {
                offset: addr as u16,
                data,
            })
        }
        OP_MMIO_READ | OP_MMIO_WRITE | OP_MMIO_MEMSET if !bar_ok => {
            Err(WireError::Size { offset: addr, size })
        }
        OP_MMIO_READ => Ok(Command::MmioRead {
            bar,
            offset: addr,
            size: size as usize,
        }),
        OP_MMIO_WRITE => Ok(Command::MmioWrite {
            bar,
            offset: addr,
            data: payload(data, size as usize, false)?,
        }),
        OP_MMIO_MEMSET => {
            let v = payload(data, 1, true)?;
            Ok(Command::MmioMemset {
                bar,
                offset: addr,
                size: size as usize,
                value: v[0],
            })
        }
        other => Err(WireError::Op(other)),
    }
}

/// The first `want` data bytes; with `at_least`, extra bytes are allowed (UML pads small
/// writes to its 8-byte buffer), otherwise the length must match.
fn payload(data: &[u8], want: usize, at_least: bool) -> Result<Vec<u8>, WireError> {
    if data.len() < want || (!at_least && data.len() != want) {
        return Err(WireError::Payload {
            want,
            got: data.len(),
        });
    }
    Ok(data[..want].to_vec())
}

/// Splits a BAR access of `len` bytes at `offset` into naturally aligned pieces of 8, 4, 2 or
/// 1 bytes (what `Vgpu::bar_read/bar_write` take), largest first.
pub fn split(offset: u64, len: usize) -> impl Iterator<Item = (u64, usize)> {
    let mut off = offset;
    let end = offset + len as u64;
    std::iter::from_fn(move || {
        if off >= end {
            return None;
        }
        let left = end - off;
        let size = [8u64, 4, 2, 1]
            .into_iter()
            .find(|&s| off.is_multiple_of(s) && s <= left)
            .unwrap_or(1);
        let piece = (off, size as usize);
        off += size;
        Some(piece)
    })
}

/// An interrupt message for the interrupt queue: INTx, or MSI with its data word.
pub fn irq_message(msi_data: Option<u16>) -> Vec<u8> {
    let mut m = vec![0u8; HDR_LEN];
    match msi_data {
        None => m[0] = OP_INT,
        Some(d) => {
            m[0] = OP_MSI;
            m[4..8].copy_from_slice(&2u32.to_le_bytes());
            m.extend_from_slice(&d.to_le_bytes());
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(op: u8, bar: u8, size: u32, addr: u64, data: &[u8]) -> Vec<u8> {
        let mut v = vec![op, bar, 0, 0];
        v.extend_from_slice(&size.to_le_bytes());
        v.extend_from_slice(&addr.to_le_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn well_formed_commands_parse() {
        assert_eq!(
            parse(&cmd(OP_CFG_READ, 0, 4, 0x10, &[])),
            Ok(Command::CfgRead {
                offset: 0x10,
                size: 4
            })
        );
        assert_eq!(
            parse(&cmd(OP_CFG_WRITE, 0, 2, 4, &[6, 0, 0, 0, 0, 0, 0, 0])),
            Ok(Command::CfgWrite {
                offset: 4,
                data: vec![6, 0]
            })
        );
        assert_eq!(
            parse(&cmd(OP_MMIO_WRITE, 0, 4, 0x1700, &[1, 2, 3, 4])),
            Ok(Command::MmioWrite {
                bar: 0,
                offset: 0x1700,
                data: vec![1, 2, 3, 4]
            })
        );
        assert_eq!(
            parse(&cmd(OP_MMIO_MEMSET, 1, 4096, 0x2000, &[0xab])),
            Ok(Command::MmioMemset {
                bar: 1,
                offset: 0x2000,
                size: 4096,
                value: 0xab
            })
        );
    }

    #[test]
    fn malformed_commands_are_refused() {
        assert_eq!(parse(&[1, 2, 3]), Err(WireError::Short(3)));
        assert_eq!(parse(&cmd(0, 0, 4, 0, &[])), Err(WireError::Op(0)));
        // Device-to-driver ops are not commands.
        assert_eq!(
            parse(&cmd(OP_MSI, 0, 4, 0, &[])),
            Err(WireError::Op(OP_MSI))
        );
        assert_eq!(parse(&cmd(99, 0, 4, 0, &[])), Err(WireError::Op(99)));
        // Config: bad size, past the end, straddling the end.
        assert!(matches!(
            parse(&cmd(OP_CFG_READ, 0, 3, 0, &[])),
            Err(WireError::Config { .. })
        ));
        assert!(matches!(
            parse(&cmd(OP_CFG_READ, 0, 4, 4096, &[])),
            Err(WireError::Config { .. })
        ));
        assert!(matches!(
            parse(&cmd(OP_CFG_READ, 0, 8, 4092, &[])),
            Err(WireError::Config { .. })
        ));
        // Write announcing more than it carries.
        assert_eq!(
            parse(&cmd(OP_CFG_WRITE, 0, 4, 0, &[1])),
            Err(WireError::Payload { want: 4, got: 1 })
        );
        assert_eq!(
            parse(&cmd(OP_MMIO_WRITE, 0, 8, 0, &[1, 2, 3, 4])),
            Err(WireError::Payload { want: 8, got: 4 })
        );
        // BAR: zero, huge, wrapping.
        for (size, addr) in [(0, 0), (MAX_ACCESS + 1, 0), (8, u64::MAX - 3)] {
            assert!(
                matches!(
                    parse(&cmd(OP_MMIO_READ, 0, size, addr, &[])),
                    Err(WireError::Size { .. })
                ),
                "size {size} at {addr:#x}"
            );
        }
        // Memset without its byte.
        assert_eq!(
            parse(&cmd(OP_MMIO_MEMSET, 0, 16, 0, &[])),
            Err(WireError::Payload { want: 1, got: 0 })
        );
    }

    /// UML 6.12's `um_pci_bar_set` message: op CFG_WRITE, the BAR index, the memset length,
    /// one data byte padded to 8.
    #[test]
    fn uml_memsets_sent_as_config_writes_are_memsets() {
        let mut byte = [0u8; 8];
        byte[0] = 0xab;
        assert_eq!(
            parse(&cmd(OP_CFG_WRITE, 3, 655_360, 0x16_3000, &byte)),
            Ok(Command::MmioMemset {
                bar: 3,
                offset: 0x16_3000,
                size: 655_360,
                value: 0xab
            })
        );
        // Any size on a non-zero BAR, even one a config write could have.
        assert_eq!(
            parse(&cmd(OP_CFG_WRITE, 1, 4, 0x10, &byte)),
            Ok(Command::MmioMemset {
                bar: 1,
                offset: 0x10,
                size: 4,
                value: 0xab
            })
        );
        // BAR0, larger than a config access.
        assert!(matches!(
            parse(&cmd(OP_CFG_WRITE, 0, 4096, 0, &byte)),
            Ok(Command::MmioMemset {
                bar: 0,
                size: 4096,
                ..
            })
        ));
        // The same BAR checks as OP_MMIO_MEMSET: zero, huge, wrapping, no byte.
        for (size, addr) in [(0, 0x10_000), (MAX_ACCESS + 1, 0), (16, u64::MAX - 3)] {
            assert!(
                matches!(
                    parse(&cmd(OP_CFG_WRITE, 1, size, addr, &byte)),
                    Err(WireError::Size { .. })
                ),
                "size {size} at {addr:#x}"
            );
        }
        assert_eq!(
            parse(&cmd(OP_CFG_WRITE, 1, 64, 0, &[])),
            Err(WireError::Payload { want: 1, got: 0 })
        );
        // A real config write (BAR field 0, size 1/2/4/8 inside 4 KiB) stays one.
        assert_eq!(
            parse(&cmd(OP_CFG_WRITE, 0, 4, 0x30, &[1, 0, 0, 0, 0, 0, 0, 0])),
            Ok(Command::CfgWrite {
                offset: 0x30,
                data: vec![1, 0, 0, 0]
            })
        );
    }

    #[test]
    fn split_is_naturally_aligned_and_covers_the_access() {
        let pieces: Vec<_> = split(0x1001, 13).collect();
        assert_eq!(
            pieces,
            vec![
                (0x1001, 1),
                (0x1002, 2),
                (0x1004, 4),
                (0x1008, 4),
                (0x100c, 2)
            ]
        );
        // At 0x1008 six bytes are left: 4 (8 does not fit), then 2.
        let total: usize = pieces.iter().map(|p| p.1).sum();
        assert_eq!(total, 13);
        for (off, size) in split(3, 4096) {
            assert_eq!(off % size as u64, 0);
        }
        assert_eq!(split(0, 16).collect::<Vec<_>>(), vec![(0, 8), (8, 8)]);
    }

    #[test]
    fn irq_messages() {
        assert_eq!(irq_message(None), {
            let mut m = vec![0; 16];
            m[0] = OP_INT;
            m
        });
        let m = irq_message(Some(0x4021));
        assert_eq!(m[0], OP_MSI);
        assert_eq!(u32::from_le_bytes(m[4..8].try_into().unwrap()), 2);
        assert_eq!(&m[16..], &[0x21, 0x40]);
    }
}
