//! Guest-RAM allocation: a page-granular allocator over the DMA region `Dma::base()..base()+size()`
//! (the role of nouveau's TTM system-memory pool for GART buffers). The GPU reaches these pages at
//! the same bus address, through SYSRAM PTEs.

use crate::error::DriverError;
use crate::range::{align_up, RangeAllocator};

/// Page size of guest-RAM allocations.
pub const PAGE: u64 = gf100::PAGE_SIZE;

/// A run of guest RAM pages. Not `Clone`: freeing consumes it.
#[derive(Debug, PartialEq, Eq)]
pub struct DmaAlloc {
    addr: u64,
    size: u64,
}

impl DmaAlloc {
    /// Guest-physical (= bus) address of the first page.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Size in bytes (whole pages).
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// Allocator over the page-aligned part of the DMA region.
#[derive(Debug, Clone)]
pub struct DmaAllocator {
    range: RangeAllocator,
}

impl DmaAllocator {
    /// An allocator over `[base, base + size)`, shrunk to whole pages.
    pub fn new(base: u64, size: u64) -> DmaAllocator {
        let start = align_up(base, PAGE).unwrap_or(u64::MAX);
        let end = base.saturating_add(size) & !(PAGE - 1);
        DmaAllocator {
            range: RangeAllocator::new(start, end.max(start)),
        }
    }

    /// Allocates `size` bytes (whole pages) aligned to `align` (at least a page).
    pub fn alloc(&mut self, size: u64, align: u64) -> Result<DmaAlloc, DriverError> {
        let rounded = align_up(size, PAGE)
            .filter(|&s| s != 0)
            .ok_or(DriverError::OutOfDma { size })?;
        let align = align.max(PAGE);
        if !align.is_power_of_two() {
            return Err(DriverError::InvalidArgument {
                what: "DMA alignment is not a power of two",
            });
        }
        let addr = self
            .range
            .alloc(rounded, align)
            .ok_or(DriverError::OutOfDma { size })?;
        Ok(DmaAlloc {
            addr,
            size: rounded,
        })
    }

    /// Returns pages.
    pub fn free(&mut self, a: DmaAlloc) -> Result<(), DriverError> {
        self.range
            .free(a.addr, a.size)
            .map_err(|_| DriverError::Internal {
                what: "DMA double free",
            })
    }

    /// Bytes free.
    pub fn free_bytes(&self) -> u64 {
        self.range.free_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_is_shrunk_to_whole_pages() {
        let mut d = DmaAllocator::new(0x1234, 0x5000);
        // [0x1234, 0x6234) holds the whole pages [0x2000, 0x6000).
        assert_eq!(d.free_bytes(), 0x4000);
        let a = d.alloc(10, 0).unwrap();
        assert_eq!((a.addr(), a.size()), (0x2000, 0x1000));
        let b = d.alloc(0x3000, 0).unwrap();
        assert_eq!(b.addr(), 0x3000);
        assert!(d.alloc(1, 0).is_err());
        d.free(a).unwrap();
        d.free(b).unwrap();
        assert_eq!(d.free_bytes(), 0x4000);
    }

    #[test]
    fn degenerate_regions() {
        let mut d = DmaAllocator::new(u64::MAX - 10, 100);
        assert!(d.alloc(1, 0).is_err());
        let mut d = DmaAllocator::new(0x1001, 0x10);
        assert!(d.alloc(1, 0).is_err());
    }
}
