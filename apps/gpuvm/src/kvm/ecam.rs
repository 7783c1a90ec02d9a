//! PCI Express enhanced configuration access (ECAM, "MMCONFIG"): the configuration space of bus
//! 0 as a memory-mapped window at [`abi::ECAM_BASE`], 4 KiB per function (offset = device << 15
//! | function << 12 | register), as a q35-style chipset decodes it. An access there is an MMIO
//! exit the VMM routes to the same functions as configuration mechanism 1
//! ([`PciBus::function_read`] / [`PciBus::function_write`]): the host bridge at 00:00.0 and
//! the vGPU at 00:01.0. The window covers bus 0 only (1 MiB); it is decoded before the vGPU's
//! BARs, so a BAR a guest places over it is shadowed there. Accesses must be 1, 2 or 4 bytes
//! within one dword; others read all-ones and are dropped, like accesses to absent functions.

use super::abi;
use super::pci::PciBus;

/// The function and register of an access of `len` bytes at `addr`, if it is in the window.
fn decode(addr: u64, len: usize) -> Option<Option<(u8, u8, u16)>> {
    let off = addr.checked_sub(abi::ECAM_BASE)?;
    if off >= abi::ECAM_SIZE {
        return None;
    }
    let reg = (off & 0xfff) as u16;
    let ok = matches!(len, 1 | 2 | 4) && (reg as usize & 3) + len <= 4;
    Some(ok.then_some(((off >> 15) as u8 & 0x1f, (off >> 12) as u8 & 7, reg)))
}

/// Serves an MMIO read in the ECAM window; false if `addr` is not in it.
pub fn read(pci: &PciBus, addr: u64, data: &mut [u8]) -> bool {
    match decode(addr, data.len()) {
        None => false,
        Some(Some((dev, func, reg))) => {
            pci.function_read(dev, func, reg, data);
            true
        }
        Some(None) => {
            data.fill(0xff);
            true
        }
    }
}

/// Serves an MMIO write in the ECAM window; false if `addr` is not in it.
pub fn write(pci: &mut PciBus, addr: u64, data: &[u8]) -> bool {
    match decode(addr, data.len()) {
        None => false,
        Some(Some((dev, func, reg))) => {
            pci.function_write(dev, func, reg, data);
            true
        }
        Some(None) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_name_device_function_and_register() {
        let b = abi::ECAM_BASE;
        assert_eq!(decode(b - 4, 4), None);
        assert_eq!(decode(b + abi::ECAM_SIZE, 4), None);
        assert_eq!(decode(b, 4), Some(Some((0, 0, 0))));
        assert_eq!(decode(b + (1 << 15) + 0x10, 4), Some(Some((1, 0, 0x10))));
        assert_eq!(
            decode(b + (1 << 15) + (3 << 12) + 0x102, 2),
            Some(Some((1, 3, 0x102)))
        );
        assert_eq!(
            decode(b + (31 << 15) + (7 << 12) + 0xffc, 4),
            Some(Some((31, 7, 0xffc)))
        );
        // Within the window but not a dword-contained 1/2/4-byte access.
        assert_eq!(decode(b + 2, 4), Some(None));
        assert_eq!(decode(b, 8), Some(None));
    }
}
