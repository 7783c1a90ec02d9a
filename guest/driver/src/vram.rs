//! The VRAM allocator (nouveau `nvkm_ram_get` over `nvkm_mm`): alignment-aware, frees supported,
//! and a handle type that cannot be copied, so the same VRAM is never handed out twice.

use crate::error::DriverError;
use crate::range::{align_up, RangeAllocator};

/// Allocation granule: every allocation is a whole number of 4 KiB pages.
pub const GRANULE: u64 = gf100::PAGE_SIZE;

/// VRAM the driver keeps for itself at the bottom (nouveau also keeps low VRAM out of its heap;
/// keeping address 0 unused makes a stray null pointer visible as a fault).
pub const RESERVED_LOW: u64 = 0x10_0000;

/// A block of VRAM. Not `Clone`: freeing consumes it.
#[derive(Debug, PartialEq, Eq)]
pub struct VramAlloc {
    addr: u64,
    size: u64,
}

impl VramAlloc {
    /// VRAM address of the block.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Size of the block in bytes (a multiple of [`GRANULE`]).
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// Allocator over `[RESERVED_LOW, vram_size)`.
#[derive(Debug, Clone)]
pub struct VramAllocator {
    range: RangeAllocator,
}

impl VramAllocator {
    /// An allocator for a GPU with `vram_size` bytes of VRAM.
    pub fn new(vram_size: u64) -> VramAllocator {
        VramAllocator {
            range: RangeAllocator::new(RESERVED_LOW, vram_size & !(GRANULE - 1)),
        }
    }

    /// Allocates `size` bytes (rounded up to the granule) aligned to `align` (at least the
    /// granule).
    pub fn alloc(&mut self, size: u64, align: u64) -> Result<VramAlloc, DriverError> {
        let rounded = align_up(size, GRANULE)
            .filter(|&s| s != 0)
            .ok_or(DriverError::OutOfVram { size })?;
        let align = align.max(GRANULE);
        if !align.is_power_of_two() {
            return Err(DriverError::InvalidArgument {
                what: "VRAM alignment is not a power of two",
            });
        }
        let addr = self
            .range
            .alloc(rounded, align)
            .ok_or(DriverError::OutOfVram { size })?;
        Ok(VramAlloc {
            addr,
            size: rounded,
        })
    }

    /// Returns a block.
    pub fn free(&mut self, a: VramAlloc) -> Result<(), DriverError> {
        self.range
            .free(a.addr, a.size)
            .map_err(|_| DriverError::Internal {
                what: "VRAM double free",
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
    fn allocations_are_granular_aligned_and_distinct() {
        let mut v = VramAllocator::new(16 << 20);
        let a = v.alloc(1, 0).unwrap();
        assert_eq!(a.size(), GRANULE);
        assert_eq!(a.addr(), RESERVED_LOW);
        let b = v.alloc(0x20000, 0x20000).unwrap();
        assert_eq!(b.addr() % 0x20000, 0);
        assert!(b.addr() >= a.addr() + a.size());
        assert!(v.alloc(0, 0).is_err());
        assert!(v.alloc(64 << 20, 0).is_err());
        let before = v.free_bytes();
        v.free(a).unwrap();
        assert_eq!(v.free_bytes(), before + GRANULE);
        v.free(b).unwrap();
        assert_eq!(v.free_bytes(), (16 << 20) - RESERVED_LOW);
    }

    #[test]
    fn tiny_vram_allocates_nothing() {
        let mut v = VramAllocator::new(RESERVED_LOW / 2);
        assert!(matches!(
            v.alloc(4096, 0),
            Err(DriverError::OutOfVram { .. })
        ));
    }
}
