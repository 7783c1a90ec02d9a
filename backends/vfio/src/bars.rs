//! BAR access of the real GF100: BAR0 (registers), BAR1 and BAR3 (VRAM apertures), each either
//! mmap()ed into this process and accessed with volatile loads and stores of the access's width,
//! or, when VFIO does not allow mapping the region, read and written through the device fd.
//!
//! Every access is bounds-checked against the region's size: an access outside it reads as
//! all-ones and a write is dropped, like a PCI master abort.

use gpuvm_phys::Bar;

use super::device::{DeviceAccess, RegionInfo};

/// A BAR region mapped into this process. Unmapped when dropped.
#[derive(Debug)]
pub struct MappedBar {
    addr: usize,
    len: usize,
}

impl MappedBar {
    /// Takes ownership of the mapping `[addr, addr + len)`.
    ///
    /// # Safety
    ///
    /// `addr` must be the page-aligned start of a shared mapping of `len` bytes, readable and
    /// writable, made by `mmap` and not unmapped elsewhere; this value unmaps it when dropped.
    pub unsafe fn from_raw(addr: *mut u8, len: usize) -> MappedBar {
        MappedBar {
            addr: addr as usize,
            len,
        }
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    /// Length of the mapping.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads `data.len()` bytes at `offset` (already bounds-checked) with one volatile access
    /// of that width when it is 1, 2, 4 or 8 bytes and naturally aligned, else byte by byte.
    fn read(&self, offset: usize, data: &mut [u8]) {
        let p = self.addr + offset;
        // SAFETY: `offset + data.len() <= self.len` (checked by `BarIo`), the mapping lives as
        // long as `self`, and each access is aligned for its type. Volatile: device memory.
        unsafe {
            match data.len() {
                1 => data[0] = std::ptr::read_volatile(p as *const u8),
                2 if p % 2 == 0 => {
                    data.copy_from_slice(&std::ptr::read_volatile(p as *const u16).to_le_bytes())
                }
                4 if p % 4 == 0 => {
                    data.copy_from_slice(&std::ptr::read_volatile(p as *const u32).to_le_bytes())
                }
                8 if p % 8 == 0 => {
                    data.copy_from_slice(&std::ptr::read_volatile(p as *const u64).to_le_bytes())
                }
                _ => {
                    for (i, b) in data.iter_mut().enumerate() {
                        *b = std::ptr::read_volatile((p + i) as *const u8);
                    }
                }
            }
        }
    }

    /// Writes `data` at `offset` (already bounds-checked); see [`MappedBar::read`].
    fn write(&self, offset: usize, data: &[u8]) {
        let p = self.addr + offset;
        // SAFETY: as in `read`.
        unsafe {
            match data.len() {
                1 => std::ptr::write_volatile(p as *mut u8, data[0]),
                2 if p % 2 == 0 => std::ptr::write_volatile(
                    p as *mut u16,
                    u16::from_le_bytes(data.try_into().unwrap_or_default()),
                ),
                4 if p % 4 == 0 => std::ptr::write_volatile(
                    p as *mut u32,
                    u32::from_le_bytes(data.try_into().unwrap_or_default()),
                ),
                8 if p % 8 == 0 => std::ptr::write_volatile(
                    p as *mut u64,
                    u64::from_le_bytes(data.try_into().unwrap_or_default()),
                ),
                _ => {
                    for (i, &b) in data.iter().enumerate() {
                        std::ptr::write_volatile((p + i) as *mut u8, b);
                    }
                }
            }
        }
    }
}

impl Drop for MappedBar {
    fn drop(&mut self) {
        // SAFETY: `from_raw`'s contract: this value owns the mapping.
        let r = unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
        if r != 0 {
            log::warn!(
                "munmap of a BAR mapping failed: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

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
