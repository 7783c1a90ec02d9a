//! BAR access of the real GF100: BAR0 (registers), BAR1 and BAR3 (VRAM apertures), each either
//! mmap()ed into this process and accessed with volatile loads and stores of the access's width,
//! or, when VFIO does not allow mapping the region, read and written through the device fd.
//!
//! Every access is bounds-checked against the region's size: an access outside it reads as
//! all-ones and a write is dropped, like a PCI master abort.

use gpuvm_phys::Bar;

use super::device::{DeviceAccess, RegionInfo};
use super::mapped::MappedBar;

/// How one BAR is reached.
#[derive(Debug)]
enum Path {
    Mapped(MappedBar),
    Region,
}

/// One BAR of the device.
#[derive(Debug)]
pub(super) struct BarIo {
    bar: Bar,
    size: u64,
    path: Path,
}

impl BarIo {
    /// Sets up access to `bar`: mapped if VFIO allows it and the mapping works, else through the
    /// device fd.
    pub(super) fn new(dev: &dyn DeviceAccess, bar: Bar, info: RegionInfo) -> BarIo {
        let mapped = if info.mappable {
            dev.map_region(bar).filter(|m| m.len() as u64 >= info.size)
        } else {
            None
        };
        if info.mappable && mapped.is_none() {
            log::warn!(
                "BAR{} is mappable but mmap failed: using pread/pwrite",
                bar.index()
            );
        }
        BarIo {
            bar,
            size: info.size,
            path: mapped.map_or(Path::Region, Path::Mapped),
        }
    }

    /// Whether accesses go through a mapping (true) or the device fd (false).
    pub(super) fn is_mapped(&self) -> bool {
        matches!(self.path, Path::Mapped(_))
    }

    fn in_bounds(&self, offset: u64, len: usize) -> Option<usize> {
        let end = offset.checked_add(len as u64)?;
        (end <= self.size).then_some(offset as usize)
    }

    /// Reads `data` at `offset`; false (and all-ones bytes) if outside the BAR.
    pub(super) fn read(&self, dev: &dyn DeviceAccess, offset: u64, data: &mut [u8]) -> bool {
        let Some(off) = self.in_bounds(offset, data.len()) else {
            data.fill(0xff);
            return false;
        };
        match &self.path {
            Path::Mapped(m) => m.read(off, data),
            Path::Region => dev.region_read(self.bar, offset, data),
        }
        true
    }

    /// Writes `data` at `offset`; false (dropped) if outside the BAR.
    pub(super) fn write(&self, dev: &dyn DeviceAccess, offset: u64, data: &[u8]) -> bool {
        let Some(off) = self.in_bounds(offset, data.len()) else {
            return false;
        };
        match &self.path {
            Path::Mapped(m) => m.write(off, data),
            Path::Region => dev.region_write(self.bar, offset, data),
        }
        true
    }

    /// Reads the 32-bit register at `offset`.
    pub(super) fn read32(&self, dev: &dyn DeviceAccess, offset: u32) -> u32 {
        let mut b = [0u8; 4];
        self.read(dev, u64::from(offset), &mut b);
        u32::from_le_bytes(b)
    }

    /// Writes the 32-bit register at `offset`.
    pub(super) fn write32(&self, dev: &dyn DeviceAccess, offset: u32, value: u32) {
        self.write(dev, u64::from(offset), &value.to_le_bytes());
    }
}
