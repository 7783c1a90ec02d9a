//! The vGPU as vfio-user regions and interrupts.
//!
//! VFIO numbers a PCI device's regions BAR0..BAR5 = 0..5, expansion ROM = 6, configuration
//! space = 7, VGA = 8. The Quadro 6000 (gf100's `pci` module) has BAR0 (32 MiB registers),
//! BAR1 (128 MiB VRAM aperture, 64-bit, so slot 2 is its upper half), BAR3 (64 MiB instance
//! aperture, slot 4 its upper half) and BAR5 (a 128-byte I/O window); no ROM, no VGA region.
//! Every region is trapped: none has a sparse mmap area (see `docs/vfio-user.md`: BAR1/BAR3
//! translate through the guest's shadowed GPU page tables, BAR0 is emulated register by
//! register). Two interrupts, each delivered through an eventfd: INTx (index 0) and MSI
//! (index 1, one vector), because the configuration space shows an MSI capability: a client
//! such as Cloud Hypervisor only emulates MSI for a device that announces it, and a guest that
//! enables the capability of a device announcing none would never get an interrupt.
//!
//! [`check`] says whether an access is one the device takes; the backend answers the ones it
//! does not by content (all-ones read, dropped write), never with an error reply: Cloud
//! Hypervisor ignores the error flag and waits for a full reply, so an error would block the
//! guest's vCPU forever (`docs/cloud-hypervisor.md`).

use std::io;

use gpuvm::gf100::pci as id;
use gpuvm::mmio::pci::CONFIG_SPACE_SIZE;
use gpuvm::phys::Bar;
use vfio_bindings::bindings::vfio::{
    vfio_region_info, VFIO_IRQ_INFO_EVENTFD, VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_INTX_IRQ_INDEX,
    VFIO_PCI_MSI_IRQ_INDEX, VFIO_PCI_NUM_IRQS, VFIO_PCI_NUM_REGIONS, VFIO_REGION_INFO_FLAG_READ,
    VFIO_REGION_INFO_FLAG_WRITE,
};
use vfio_user::{IrqInfo, ServerRegion};

/// Region index of the configuration space.
pub const CONFIG: u32 = VFIO_PCI_CONFIG_REGION_INDEX;
/// Region index of BAR5 (the I/O window).
pub const BAR5: u32 = 5;
/// Interrupt index of INTx.
pub const INTX: u32 = VFIO_PCI_INTX_IRQ_INDEX;
/// Interrupt index of MSI.
pub const MSI: u32 = VFIO_PCI_MSI_IRQ_INDEX;

/// What a region access reaches, once checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Configuration space at this offset.
    Config(u16),
    /// A memory BAR at this offset.
    Bar(Bar, u64),
    /// BAR5, the I/O window: the device model does not emulate it (reads all-ones, writes are
    /// dropped), as the in-process KVM VMM treats the ports.
    IoBar,
}

/// Size of region `index` (0 for the absent ones).
pub fn region_size(index: u32) -> u64 {
    match index {
        0 => Bar::Bar0.size(),
        1 => Bar::Bar1.size(),
        3 => Bar::Bar3.size(),
        BAR5 => id::BAR5_SIZE,
        CONFIG => CONFIG_SPACE_SIZE as u64,
        _ => 0,
    }
}

/// The regions the server announces, by index.
pub fn server_regions() -> Vec<ServerRegion> {
    (0..VFIO_PCI_NUM_REGIONS)
        .map(|index| {
            let size = region_size(index);
            ServerRegion {
                region_info: vfio_region_info {
                    argsz: std::mem::size_of::<vfio_region_info>() as u32,
                    flags: if size == 0 {
                        0
                    } else {
                        VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE
                    },
                    index,
                    cap_offset: 0,
                    size,
                    offset: 0,
                },
                sparse_areas: Vec::new(),
                mmap_fd: None,
            }
        })
        .collect()
}

/// The interrupts the server announces: INTx and MSI with one eventfd each (the MSI
/// capability offers one vector), no MSI-X, error or request interrupts.
pub fn irqs() -> Vec<IrqInfo> {
    (0..VFIO_PCI_NUM_IRQS)
        .map(|index| {
            let on = index == INTX || index == MSI;
            IrqInfo {
                index,
                flags: if on { VFIO_IRQ_INFO_EVENTFD } else { 0 },
                count: u32::from(on),
            }
        })
        .collect()
}

fn einval(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

/// Checks an access of `len` bytes at `offset` of region `region` and says what it reaches:
/// the region must exist, the access must lie inside it, and its size must be one the device
/// takes (1, 2, 4 or 8 bytes naturally aligned in a memory BAR; 1, 2 or 4 aligned, or whole
/// dwords, in configuration space; 1, 2 or 4 in BAR5).
pub fn check(region: u32, offset: u64, len: usize) -> io::Result<Target> {
    let size = region_size(region);
    if size == 0 {
        return Err(einval(format!("region {region} does not exist")));
    }
    let end = offset.checked_add(len as u64);
    if len == 0 || end.is_none_or(|e| e > size) {
        return Err(einval(format!(
            "{len} bytes at {offset:#x} are outside region {region} ({size:#x} bytes)"
        )));
    }
    let natural = |sizes: &[usize]| sizes.contains(&len) && offset.is_multiple_of(len as u64);
    match region {
        CONFIG => {
            if natural(&[1, 2, 4]) || (len.is_multiple_of(4) && offset.is_multiple_of(4)) {
                Ok(Target::Config(offset as u16))
            } else {
                Err(einval(format!(
                    "configuration access of {len} bytes at {offset:#x}: 1, 2 or 4 bytes aligned, or whole dwords"
                )))
            }
        }
        BAR5 if natural(&[1, 2, 4]) => Ok(Target::IoBar),
        0 | 1 | 3 if natural(&[1, 2, 4, 8]) => {
            let bar = match region {
                0 => Bar::Bar0,
                1 => Bar::Bar1,
                _ => Bar::Bar3,
            };
            Ok(Target::Bar(bar, offset))
        }
        _ => Err(einval(format!(
            "BAR{region} access of {len} bytes at {offset:#x}: 1, 2, 4 or 8 bytes, naturally aligned"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_follow_the_vfio_pci_indices() {
        let r = server_regions();
        assert_eq!(r.len(), 9);
        assert_eq!(r[0].region_info.size, 32 << 20);
        assert_eq!(r[1].region_info.size, 128 << 20);
        assert_eq!(r[2].region_info.size, 0);
        assert_eq!(r[3].region_info.size, 64 << 20);
        assert_eq!(r[5].region_info.size, 0x80);
        assert_eq!(r[6].region_info.size, 0, "no ROM");
        assert_eq!(r[7].region_info.size, 4096);
        for (i, region) in r.iter().enumerate() {
            assert_eq!(region.region_info.index, i as u32);
            assert!(region.sparse_areas.is_empty(), "every region is trapped");
            assert!(region.mmap_fd.is_none());
        }
        let irqs = irqs();
        assert_eq!((irqs[0].count, irqs[1].count), (1, 1), "INTx and MSI");
        assert!(irqs[2..].iter().all(|i| i.count == 0));
    }

    #[test]
    fn accesses_are_checked() {
        assert_eq!(check(0, 0, 4).unwrap(), Target::Bar(Bar::Bar0, 0));
        assert_eq!(
            check(1, (128 << 20) - 8, 8).unwrap(),
            Target::Bar(Bar::Bar1, (128 << 20) - 8)
        );
        assert_eq!(check(7, 0x10, 4).unwrap(), Target::Config(0x10));
        assert_eq!(check(7, 0, 4096).unwrap(), Target::Config(0));
        assert_eq!(check(5, 0, 4).unwrap(), Target::IoBar);
        for (region, offset, len) in [
            (2, 0, 4),            // upper half of BAR1
            (6, 0, 4),            // no ROM
            (9, 0, 4),            // no such region
            (u32::MAX, 0, 4),     // no such region
            (0, 32 << 20, 4),     // past BAR0
            (0, u64::MAX - 1, 4), // wraps
            (0, 0, 0),            // empty
            (0, 2, 4),            // misaligned
            (0, 0, 3),            // odd size
            (0, 0, 16),           // too wide for a register
            (1, 0, 1 << 20),      // huge
            (7, 4094, 4),         // past config space
            (7, 1, 4),            // misaligned config
            (7, 0, 6),            // partial dword
            (5, 0x80, 1),         // past BAR5
        ] {
            assert!(
                check(region, offset, len).is_err(),
                "region {region} offset {offset:#x} len {len}"
            );
        }
    }
}
