//! A BAR region mmap()ed into this process ([`MappedBar`]): volatile loads and stores of the
//! access's width, bounds-checked, unmapped when dropped. The kernel side (`sys`, and the tests'
//! `fake`) makes one; `bars` reaches a BAR through it when VFIO allows mapping the region.

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
    pub(super) fn read(&self, offset: usize, data: &mut [u8]) {
        let p = self.addr + offset;
        // SAFETY: `offset + data.len() <= self.len` (checked by `BarIo`), the mapping lives as
        // long as `self`, and each access is aligned for its type. Volatile: device memory.
        unsafe {
            match data.len() {
                1 => data[0] = std::ptr::read_volatile(p as *const u8),
                2 if p.is_multiple_of(2) => {
                    data.copy_from_slice(&std::ptr::read_volatile(p as *const u16).to_le_bytes())
                }
                4 if p.is_multiple_of(4) => {
                    data.copy_from_slice(&std::ptr::read_volatile(p as *const u32).to_le_bytes())
                }
                8 if p.is_multiple_of(8) => {
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
    pub(super) fn write(&self, offset: usize, data: &[u8]) {
        let p = self.addr + offset;
        // SAFETY: as in `read`.
        unsafe {
            match data.len() {
                1 => std::ptr::write_volatile(p as *mut u8, data[0]),
                2 if p.is_multiple_of(2) => std::ptr::write_volatile(
                    p as *mut u16,
                    u16::from_le_bytes(data.try_into().unwrap_or_default()),
                ),
                4 if p.is_multiple_of(4) => std::ptr::write_volatile(
                    p as *mut u32,
                    u32::from_le_bytes(data.try_into().unwrap_or_default()),
                ),
                8 if p.is_multiple_of(8) => std::ptr::write_volatile(
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
