//! Guest RAM from a vfio-user client's DMA_MAP messages.
//!
//! A client (the VMM) shares each region of guest RAM as a file descriptor plus an offset; the
//! server maps it `MAP_SHARED` (vm-memory's `MmapRegion::from_file`) and gives the vGPU the
//! whole set as one `GuestMemoryMmap`, whose GPA `g` the vGPU's DMA window puts at IOVA
//! `window base + g`. Every map is checked first: a file descriptor must come with it, address,
//! offset and size are page-aligned and non-zero and do not wrap, the region ends at or below
//! the limit ([`DmaWindows`]: the largest window a VM may have, or the fixed window), overlaps
//! no earlier map, stays below a count limit, lies inside the file and (by default) the file is
//! sealed against shrinking: a client that truncated a mapped file would otherwise make the
//! server's next access to it raise SIGBUS and kill every VM's vGPU.
//!
//! **Windows sized from the RAM** ([`DmaWindows::FromRam`], the default): a VM's vGPU starts
//! with the smallest window (1 MiB), or the one the maps already need (a device reset keeps
//! them); a map that ends beyond the current window grows it to the next power of two of the
//! maps' end (`GpuHost::resize_dma_window`), which the host allows only while nothing can hold
//! an address in the old window (no channel bound: a VMM maps the guest's RAM before the guest
//! boots). Otherwise, or when the IOVA space has no room, the map is refused naming the limit
//! and the VM keeps its window and its earlier maps.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use vm_memory::{
    FileOffset, GuestAddress, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap, MmapRegion,
};

/// Most DMA maps one client may hold.
pub const MAX_MAPS: usize = 64;

fn einval(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.into())
}

fn page_size() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// True if `file` is sealed against shrinking (`F_SEAL_SHRINK`, as a memfd can be).
fn sealed_against_shrink(file: &File) -> bool {
    // SAFETY: F_GET_SEALS only reads the seals of a descriptor we own; on a file that cannot be
    // sealed it fails with EINVAL.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
}

/// The largest DMA window a VM gets by default when windows are sized from its RAM: 32 GiB,
/// the fixed window every VM had before (`gpuvm serve --dma-window-max-mib` changes it). It
/// bounds the IOVA space one client can claim by mapping a page at a high address.
pub const DEFAULT_MAX_WINDOW: u64 = 32 << 30;

/// How a daemon sizes each VM's DMA (IOVA) window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DmaWindows {
    /// From the guest RAM the client maps (see the module doc), up to `max` bytes (a power of
    /// two from 1 MiB to `gpuvm::host::MAX_DMA_WINDOW`).
    FromRam {
        /// The largest window a VM may grow to.
        max: u64,
    },
    /// Every vGPU gets the host's `HostConfig::iova_window` at creation, whatever its RAM
    /// (`gpuvm serve --dma-window-mib`).
    Fixed,
}

impl Default for DmaWindows {
    fn default() -> Self {
        DmaWindows::FromRam {
            max: DEFAULT_MAX_WINDOW,
        }
    }
}

/// The client's DMA maps: GPA start -> (size, mapping).
#[derive(Default)]
pub struct DmaMaps {
    maps: BTreeMap<u64, Arc<GuestRegionMmap>>,
    /// GPAs must end at or below this (the largest or the fixed DMA window).
    limit: u64,
    /// What to change to map beyond `limit` (part of the refusal).
    fix: &'static str,
    /// Refuse files that are not sealed against shrinking.
    require_sealed: bool,
}

impl std::fmt::Debug for DmaMaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.maps.iter().map(|(a, r)| (a, r.len())))
            .finish()
    }
}

impl DmaMaps {
    /// No maps; GPAs up to `limit`.
    pub fn new(limit: u64, require_sealed: bool) -> DmaMaps {
        DmaMaps::with_fix(limit, require_sealed, "")
    }

    /// No maps; GPAs up to `limit`; a map beyond it is refused with `fix` (what to change).
    pub fn with_fix(limit: u64, require_sealed: bool, fix: &'static str) -> DmaMaps {
        DmaMaps {
            maps: BTreeMap::new(),
            limit,
            fix,
            require_sealed,
        }
    }

    /// One past the highest GPA mapped (0 without maps): where the guest's RAM ends.
    pub fn end(&self) -> u64 {
        self.maps
            .iter()
            .next_back()
            .map_or(0, |(&a, r)| a + r.len())
    }

    /// Number of maps.
    pub fn len(&self) -> usize {
        self.maps.len()
    }

    /// True if nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// Checks and maps `size` bytes of `file` from `offset` at GPA `address`.
    pub fn map(
        &mut self,
        offset: u64,
        address: u64,
        size: u64,
        file: Option<File>,
    ) -> io::Result<()> {
        let file = file.ok_or_else(|| {
            einval("DMA map without a file descriptor (DMA_READ/DMA_WRITE are not supported)")
        })?;
        let page = page_size();
        if size == 0
            || !size.is_multiple_of(page)
            || !address.is_multiple_of(page)
            || !offset.is_multiple_of(page)
        {
            return Err(einval(format!(
                "DMA map {address:#x}+{size:#x} (file offset {offset:#x}) is empty or not page-aligned"
            )));
        }
        let end = address
            .checked_add(size)
            .filter(|&e| e <= self.limit)
            .ok_or_else(|| {
                einval(format!(
                    "DMA map {address:#x}+{size:#x} ends beyond {:#x} bytes, the largest DMA window this VM may have (the guest's RAM must end inside it){}",
                    self.limit, self.fix
                ))
            })?;
        offset
            .checked_add(size)
            .ok_or_else(|| einval(format!("file offset {offset:#x}+{size:#x} wraps")))?;
        let len = usize::try_from(size).map_err(|_| einval("DMA map too large"))?;
        if self.maps.len() >= MAX_MAPS {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("more than {MAX_MAPS} DMA maps"),
            ));
        }
        if let Some((&a, r)) = self.maps.range(..end).next_back() {
            if a + r.len() > address {
                return Err(einval(format!(
                    "DMA map {address:#x}+{size:#x} overlaps the map at {a:#x}+{:#x}",
                    r.len()
                )));
            }
        }
        if self.require_sealed && !sealed_against_shrink(&file) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "DMA map file is not sealed against shrinking (F_SEAL_SHRINK): a memfd with that seal is required",
            ));
        }
        // MAP_SHARED, read/write; vm-memory refuses a range past the end of the file.
        let mapping = MmapRegion::from_file(FileOffset::new(file, offset), len)
            .map_err(|e| einval(format!("mapping DMA region {address:#x}+{size:#x}: {e}")))?;
        let region = GuestRegionMmap::new(mapping, GuestAddress(address))
            .map_err(|e| einval(format!("DMA region {address:#x}+{size:#x}: {e}")))?;
        self.maps.insert(address, Arc::new(region));
        Ok(())
    }

    /// Removes the map that starts at `address` and is `size` bytes long (a partial or unknown
    /// range is refused), or every map with `all`.
    pub fn unmap(&mut self, address: u64, size: u64, all: bool) -> io::Result<()> {
        if all {
            self.maps.clear();
            return Ok(());
        }
        match self.maps.get(&address) {
            Some(r) if r.len() == size => {
                self.maps.remove(&address);
                Ok(())
            }
            _ => Err(einval(format!(
                "DMA unmap {address:#x}+{size:#x} matches no map"
            ))),
        }
    }

    /// Every map as one guest memory, `None` if there are none.
    pub fn guest_memory(&self) -> Option<GuestMemoryMmap> {
        if self.maps.is_empty() {
            return None;
        }
        // Sorted by address and non-overlapping by construction.
        GuestMemoryMmap::from_arc_regions(self.maps.values().cloned().collect()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A sealed memfd of `len` bytes.
    pub(crate) fn memfd(len: u64, seal: bool) -> File {
        // SAFETY: memfd_create with a valid NUL-terminated name returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(c"dma-test".as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(fd >= 0);
        // SAFETY: fd is a fresh descriptor we own.
        let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        if seal {
            // SAFETY: adds a seal to a descriptor we own.
            assert_eq!(
                unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) },
                0
            );
        }
        f
    }

    #[test]
    fn maps_are_checked() {
        let mut d = DmaMaps::new(1 << 30, true);
        let f = || Some(memfd(1 << 20, true));
        d.map(0, 0, 1 << 20, f()).unwrap();
        d.map(0, 4 << 20, 1 << 20, f()).unwrap();
        for (what, offset, address, size, file) in [
            ("no fd", 0, 8 << 20, 4096, None),
            ("empty", 0, 8 << 20, 0, f()),
            ("unaligned address", 0, (8 << 20) + 1, 4096, f()),
            ("unaligned size", 0, 8 << 20, 4097, f()),
            ("unaligned offset", 1, 8 << 20, 4096, f()),
            ("overlaps the first", 0, 4096, 4096, f()),
            ("overlaps the second from below", 0, 3 << 20, 2 << 20, f()),
            ("past the window", 0, 1 << 30, 4096, f()),
            ("wraps", 0, u64::MAX - 4095, 8192, f()),
            ("offset wraps", u64::MAX - 4095, 8 << 20, 8192, f()),
            ("past the end of the file", 0, 8 << 20, 2 << 20, f()),
            ("not sealed", 0, 8 << 20, 4096, Some(memfd(4096, false))),
            ("huge", 0, 8 << 20, 1 << 62, f()),
        ] {
            assert!(d.map(offset, address, size, file).is_err(), "{what}");
        }
        assert_eq!(d.len(), 2);
        assert!(d.unmap(0, 4096, false).is_err(), "partial unmap");
        assert!(d.unmap(12345, 4096, false).is_err(), "unknown unmap");
        // The memory is the file's: a write through the map shows in the file.
        let mem = d.guest_memory().unwrap();
        vm_memory::Bytes::write_obj(&mem, 0xabcdu32, GuestAddress(0x10)).unwrap();
        d.unmap(0, 1 << 20, false).unwrap();
        assert_eq!(d.len(), 1);
        d.unmap(0, 0, true).unwrap();
        assert!(d.guest_memory().is_none());
        let mut unsealed = DmaMaps::new(1 << 30, false);
        let mut f = memfd(4096, false);
        f.write_all(b"x").unwrap();
        unsealed.map(0, 0, 4096, Some(f)).unwrap();
    }

    #[test]
    fn too_many_maps_are_refused() {
        let mut d = DmaMaps::new(1 << 30, true);
        for i in 0..MAX_MAPS as u64 {
            d.map(0, i << 20, 4096, Some(memfd(4096, true))).unwrap();
        }
        assert!(d.map(0, 999 << 20, 4096, Some(memfd(4096, true))).is_err());
    }
}
