//! A first-fit allocator of address ranges, used for VRAM slices and for the hypervisor's own
//! VRAM (shadow page tables, shadow instance blocks, the physical runlist).

use std::collections::BTreeMap;

/// Hands out aligned, non-overlapping ranges of `[base, base + size)`.
#[derive(Debug, Clone)]
pub struct RangeAllocator {
    base: u64,
    size: u64,
    /// Free ranges: start -> length, coalesced.
    free: BTreeMap<u64, u64>,
    used: u64,
}

impl RangeAllocator {
    /// An allocator over `[base, base + size)`, all free.
    pub fn new(base: u64, size: u64) -> RangeAllocator {
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(base, size);
        }
        RangeAllocator {
            base,
            size,
            free,
            used: 0,
        }
    }

    /// Allocates `size` bytes aligned to `align` (a power of two); `None` if no range fits.
    pub fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        if size == 0 || !align.is_power_of_two() {
            return None;
        }
        let (start, len, at) = self.free.iter().find_map(|(&start, &len)| {
            let at = start.checked_next_multiple_of(align)?;
            (at.checked_add(size)? <= start + len).then_some((start, len, at))
        })?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        let end = at + size;
        if end < start + len {
            self.free.insert(end, start + len - end);
        }
        self.used += size;
        Some(at)
    }

    /// Returns `[addr, addr + size)`, which must have been allocated (a range that overlaps free
    /// space or lies outside the allocator is refused and `false` is returned).
    pub fn free(&mut self, addr: u64, size: u64) -> bool {
        let Some(end) = addr.checked_add(size) else {
            return false;
        };
        if size == 0 || addr < self.base || end > self.base + self.size {
            return false;
        }
        let prev = self.free.range(..=addr).next_back().map(|(&s, &l)| (s, l));
        if prev.is_some_and(|(s, l)| s + l > addr) {
            return false;
        }
        let next = self.free.range(addr..).next().map(|(&s, &l)| (s, l));
        if next.is_some_and(|(s, _)| s < end) {
            return false;
        }
        let (mut start, mut len) = (addr, size);
        if let Some((s, l)) = prev.filter(|(s, l)| s + l == addr) {
            self.free.remove(&s);
            start = s;
            len += l;
        }
        if let Some((s, l)) = next.filter(|(s, _)| *s == end) {
            self.free.remove(&s);
            len += l;
        }
        self.free.insert(start, len);
        self.used -= size;
        true
    }

    /// Bytes currently allocated.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Bytes in the allocator.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// First address managed.
    pub fn base(&self) -> u64 {
        self.base
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn allocates_aligned_and_coalesces_on_free() {
        let mut a = RangeAllocator::new(0x1000, 0x10000);
        let x = a.alloc(0x100, 0x1000).unwrap();
        assert_eq!(x, 0x1000);
        let y = a.alloc(0x2000, 0x4000).unwrap();
        assert_eq!(y % 0x4000, 0);
        assert!(a.alloc(0x20000, 1).is_none());
        assert!(a.free(x, 0x100));
        assert!(!a.free(x, 0x100), "double free is refused");
        assert!(a.free(y, 0x2000));
        assert_eq!(a.used(), 0);
        assert_eq!(
            a.alloc(0x10000, 0x1000),
            Some(0x1000),
            "everything coalesced back"
        );
    }

    proptest! {
        #[test]
        fn allocations_never_overlap(ops in proptest::collection::vec((1u64..0x3000, 0u32..4, any::<bool>()), 1..80)) {
            let mut a = RangeAllocator::new(0, 0x40000);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (size, align_log, free_one) in ops {
                if free_one && !live.is_empty() {
                    let (addr, size) = live.swap_remove(0);
                    prop_assert!(a.free(addr, size));
                } else if let Some(addr) = a.alloc(size, 1 << (align_log * 4)) {
                    prop_assert_eq!(addr % (1 << (align_log * 4)), 0);
                    prop_assert!(addr + size <= 0x40000);
                    for &(b, s) in &live {
                        prop_assert!(addr + size <= b || b + s <= addr);
                    }
                    live.push((addr, size));
                }
            }
            prop_assert_eq!(a.used(), live.iter().map(|l| l.1).sum::<u64>());
        }
    }
}
