//! A first-fit range allocator over `[start, end)`, alignment-aware, with coalescing frees and
//! double-free detection. It is the engine behind the VRAM allocator (nouveau's `nvkm_mm`), the
//! guest-RAM allocator and the GPU virtual-address allocators (nouveau's `nvkm_vmm_get`).

use alloc::vec::Vec;

/// Why a free was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeError {
    /// The range is empty, wraps, or lies (partly) outside the allocator.
    OutOfBounds,
    /// Part of the range is already free (a double free).
    NotAllocated,
}

/// First-fit allocator of address ranges. Free ranges are kept sorted and coalesced.
#[derive(Debug, Clone)]
pub struct RangeAllocator {
    start: u64,
    end: u64,
    /// Sorted, non-overlapping, non-adjacent free ranges `(start, end)`.
    free: Vec<(u64, u64)>,
}

impl RangeAllocator {
    /// An allocator whose whole range `[start, end)` is free. An empty or inverted range gives an
    /// allocator that never allocates.
    pub fn new(start: u64, end: u64) -> RangeAllocator {
        let mut free = Vec::new();
        if end > start {
            free.push((start, end));
        }
        RangeAllocator { start, end, free }
    }

    /// First address managed.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// One past the last address managed.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Bytes currently free.
    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(|(s, e)| e - s).sum()
    }

    /// Allocates `size` bytes aligned to `align` (a power of two; 0 or 1 = unaligned). Returns the
    /// start address, or `None` if no free range fits.
    pub fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        if size == 0 {
            return None;
        }
        let align = align.max(1);
        if !align.is_power_of_two() {
            return None;
        }
        for i in 0..self.free.len() {
            let (s, e) = self.free[i];
            let Some(a) = s.checked_add(align - 1).map(|v| v & !(align - 1)) else {
                continue;
            };
            let Some(a_end) = a.checked_add(size) else {
                continue;
            };
            if a_end > e {
                continue;
            }
            // Split [s, e) into [s, a) + allocated + [a_end, e).
            let head = (s, a);
            let tail = (a_end, e);
            self.free.remove(i);
            let mut at = i;
            if head.1 > head.0 {
                self.free.insert(at, head);
                at += 1;
            }
            if tail.1 > tail.0 {
                self.free.insert(at, tail);
            }
            return Some(a);
        }
        None
    }

    /// Takes exactly `[addr, addr + size)` out of the free ranges (it must be entirely free).
    pub fn reserve(&mut self, addr: u64, size: u64) -> Result<(), RangeError> {
        let end = self.check_bounds(addr, size)?;
        let i = self
            .free
            .iter()
            .position(|&(s, e)| s <= addr && end <= e)
            .ok_or(RangeError::NotAllocated)?;
        let (s, e) = self.free.remove(i);
        let mut at = i;
        if addr > s {
            self.free.insert(at, (s, addr));
            at += 1;
        }
        if e > end {
            self.free.insert(at, (end, e));
        }
        Ok(())
    }

    /// Returns `[addr, addr + size)` to the free ranges. Refuses ranges outside the allocator and
    /// ranges that overlap free space (double frees), leaving the allocator unchanged.
    pub fn free(&mut self, addr: u64, size: u64) -> Result<(), RangeError> {
        let end = self.check_bounds(addr, size)?;
        // Index of the first free range starting after addr.
        let i = self.free.partition_point(|&(s, _)| s <= addr);
        if i > 0 && self.free[i - 1].1 > addr {
            return Err(RangeError::NotAllocated);
        }
        if i < self.free.len() && self.free[i].0 < end {
            return Err(RangeError::NotAllocated);
        }
        let merge_prev = i > 0 && self.free[i - 1].1 == addr;
        let merge_next = i < self.free.len() && self.free[i].0 == end;
        match (merge_prev, merge_next) {
            (true, true) => {
                self.free[i - 1].1 = self.free[i].1;
                self.free.remove(i);
            }
            (true, false) => self.free[i - 1].1 = end,
            (false, true) => self.free[i].0 = addr,
            (false, false) => self.free.insert(i, (addr, end)),
        }
        Ok(())
    }

    fn check_bounds(&self, addr: u64, size: u64) -> Result<u64, RangeError> {
        let end = addr.checked_add(size).ok_or(RangeError::OutOfBounds)?;
        if size == 0 || addr < self.start || end > self.end {
            return Err(RangeError::OutOfBounds);
        }
        Ok(end)
    }
}

/// Rounds `v` up to a multiple of `align` (a power of two), `None` on overflow.
pub fn align_up(v: u64, align: u64) -> Option<u64> {
    let align = align.max(1);
    Some(v.checked_add(align - 1)? & !(align - 1))
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn alloc_respects_alignment_and_bounds() {
        let mut r = RangeAllocator::new(0x1000, 0x10000);
        let a = r.alloc(0x100, 0x1000).unwrap();
        assert_eq!(a, 0x1000);
        let b = r.alloc(0x100, 0x4000).unwrap();
        assert_eq!(b, 0x4000);
        let c = r.alloc(0x100, 1).unwrap();
        assert_eq!(c, 0x1100);
        assert!(r.alloc(0x10000, 1).is_none());
        assert!(r.alloc(0, 1).is_none());
        assert!(r.alloc(1, 3).is_none());
    }

    #[test]
    fn free_coalesces_and_detects_double_free() {
        let mut r = RangeAllocator::new(0, 0x3000);
        let a = r.alloc(0x1000, 0x1000).unwrap();
        let b = r.alloc(0x1000, 0x1000).unwrap();
        let c = r.alloc(0x1000, 0x1000).unwrap();
        assert!(r.alloc(1, 1).is_none());
        r.free(b, 0x1000).unwrap();
        assert_eq!(r.free(b, 0x1000), Err(RangeError::NotAllocated));
        r.free(a, 0x1000).unwrap();
        r.free(c, 0x1000).unwrap();
        assert_eq!(r.free_bytes(), 0x3000);
        assert_eq!(r.alloc(0x3000, 0x1000), Some(0));
        assert_eq!(r.free(0x2800, 0x1000), Err(RangeError::OutOfBounds));
        assert_eq!(r.free(u64::MAX, 2), Err(RangeError::OutOfBounds));
    }

    #[test]
    fn reserve_takes_exact_range() {
        let mut r = RangeAllocator::new(0, 0x10000);
        r.reserve(0x2000, 0x1000).unwrap();
        assert_eq!(r.reserve(0x2800, 0x1000), Err(RangeError::NotAllocated));
        assert_eq!(r.alloc(0x2000, 0x1000), Some(0));
        assert_eq!(r.alloc(0x1000, 0x1000), Some(0x3000));
    }

    /// Random alloc/free sequences never hand out overlapping ranges and always restore the
    /// full free size.
    #[test]
    fn random_sequences_never_overlap() {
        let mut seed = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..50 {
            let mut r = RangeAllocator::new(0x1000, 0x100000);
            let mut live: std::vec::Vec<(u64, u64)> = std::vec::Vec::new();
            for _ in 0..400 {
                if next() % 3 != 0 || live.is_empty() {
                    let size = (next() % 0x4000) + 1;
                    let align = 1u64 << (next() % 14);
                    if let Some(a) = r.alloc(size, align) {
                        assert_eq!(a % align, 0);
                        assert!(a >= 0x1000 && a + size <= 0x100000);
                        for &(s, l) in &live {
                            assert!(a + size <= s || s + l <= a, "overlap");
                        }
                        live.push((a, size));
                    }
                } else {
                    let i = (next() as usize) % live.len();
                    let (s, l) = live.swap_remove(i);
                    r.free(s, l).unwrap();
                }
            }
            for (s, l) in live.drain(..) {
                r.free(s, l).unwrap();
            }
            assert_eq!(r.free_bytes(), 0x100000 - 0x1000);
            let set: BTreeSet<_> = r.free.iter().collect();
            assert_eq!(set.len(), 1);
        }
    }
}
