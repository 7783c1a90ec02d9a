//! A first-fit allocator of address ranges, used for VRAM slices and for the hypervisor's own
//! VRAM (shadow page tables, shadow instance blocks, the physical runlist), and [`HypVram`],
//! the hypervisor VRAM allocator whose frees go through a quarantine.
//!
//! **Why a quarantine.** The GPU may still be using hypervisor VRAM after the device model has
//! let go of it: a channel in the middle of a GPFIFO entry uses the page directory it loaded at
//! the start of the entry, and an engine operation (a copy, a kernel) keeps reading and writing
//! through the address space it was launched in until it ends. A shadow page directory, table or
//! instance block that is freed and handed out again at once can therefore be written through by
//! the old channel while it already serves another VM (docs/isolation.md, "in-flight work").
//! [`HypVram`] never hands out freed memory immediately: each free is *retired* with the set of
//! physical channels that may still reach it (the owner's channels, see
//! [`HypVram::set_owner`]); the host removes each channel from the set once it has seen the
//! channel off the GPU (preempted, no operation in flight: `crate::host::reclaim`), and only then
//! is the range scrubbed and returned to the allocator. Quarantined bytes stay charged to their
//! owner ([`HypVram::held_by_owner`]), so a VM cannot grow past its shadow reservation by
//! retiring memory faster than the GPU lets it go.

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

    /// How many more ranges of `size` bytes aligned to `size` (a power of two) would fit, as
    /// repeated [`RangeAllocator::alloc`]`(size, size)` calls would find them.
    pub fn aligned_fits(&self, size: u64) -> usize {
        if !size.is_power_of_two() {
            return 0;
        }
        self.free
            .iter()
            .map(|(&start, &len)| {
                let end = start + len;
                match start.checked_next_multiple_of(size) {
                    Some(at) if at < end => ((end - at) / size) as usize,
                    _ => 0,
                }
            })
            .sum()
    }

    /// Bytes currently allocated.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// True if `[addr, addr + size)` is entirely allocated (overlaps no free range).
    pub fn is_allocated(&self, addr: u64, size: u64) -> bool {
        let Some(end) = addr.checked_add(size) else {
            return false;
        };
        if size == 0 || addr < self.base || end > self.base + self.size {
            return false;
        }
        let prev = self.free.range(..=addr).next_back();
        if prev.is_some_and(|(&s, &l)| s + l > addr) {
            return false;
        }
        !self.free.range(addr..end).any(|_| true)
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

/// A range of hypervisor VRAM waiting for the GPU to let go of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retired {
    /// Start of the range.
    pub addr: u64,
    /// Its size.
    pub size: u64,
    /// The owner tag it was charged to when freed (a VM id), if any.
    pub owner: Option<u32>,
    /// Physical channels that may still use it; the range is released when this is empty.
    pub chans: Vec<u32>,
}

/// The hypervisor VRAM allocator: a [`RangeAllocator`] whose frees are quarantined until the GPU
/// can no longer reach the memory (see the module documentation). [`HypVram::immediate`] frees
/// at once, for users with no GPU behind them (unit tests of the shadow tables, benchmarks).
#[derive(Debug, Clone)]
pub struct HypVram {
    alloc: RangeAllocator,
    deferred: bool,
    /// Who frees now: (owner tag, its physical channels).
    owner: Option<(u32, std::ops::Range<u32>)>,
    retired: Vec<Retired>,
    retired_bytes: u64,
}

impl HypVram {
    /// An allocator over `[base, base + size)` whose frees are quarantined.
    pub fn quarantined(base: u64, size: u64) -> HypVram {
        HypVram {
            alloc: RangeAllocator::new(base, size),
            deferred: true,
            owner: None,
            retired: Vec::new(),
            retired_bytes: 0,
        }
    }

    /// An allocator over `[base, base + size)` whose frees take effect at once.
    pub fn immediate(base: u64, size: u64) -> HypVram {
        HypVram {
            deferred: false,
            ..HypVram::quarantined(base, size)
        }
    }

    /// Sets who the following frees are charged to and which physical channels may still use
    /// what they free (`None`: the host itself, every channel).
    pub fn set_owner(&mut self, owner: Option<(u32, std::ops::Range<u32>)>) {
        self.owner = owner;
    }

    /// Allocates `size` bytes aligned to `align`.
    pub fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        self.alloc.alloc(size, align)
    }

    /// Frees `[addr, addr + size)`: at once, or into the quarantine. Returns false (and changes
    /// nothing) for a range that is not allocated or already retired.
    pub fn free(&mut self, addr: u64, size: u64) -> bool {
        if !self.deferred {
            return self.alloc.free(addr, size);
        }
        let Some(end) = addr.checked_add(size) else {
            return false;
        };
        let overlaps = self
            .retired
            .iter()
            .any(|r| r.addr < end && addr < r.addr + r.size);
        if size == 0 || overlaps || !self.alloc.is_allocated(addr, size) {
            return false;
        }
        let (owner, chans) = match &self.owner {
            Some((o, range)) => (Some(*o), range.clone().collect()),
            None => (None, (0..gf100::pfifo::CHANNELS).collect()),
        };
        self.retired.push(Retired {
            addr,
            size,
            owner,
            chans,
        });
        self.retired_bytes += size;
        true
    }

    /// The ranges in quarantine.
    pub fn retired(&self) -> &[Retired] {
        &self.retired
    }

    /// Physical channel `chid` was seen off the GPU: it no longer uses anything retired before
    /// now, so it is struck from every quarantined range. Releases nothing: a range no channel
    /// can reach any more is returned by [`HypVram::release_unreachable`] (the caller scrubs it
    /// before anything else can allocate: it holds `&mut self`).
    pub fn strike(&mut self, chid: u32) {
        for r in &mut self.retired {
            r.chans.retain(|&c| c != chid);
        }
    }

    /// True if some quarantined range is reachable by no channel (waiting for its release).
    pub fn has_unreachable(&self) -> bool {
        self.retired.iter().any(|r| r.chans.is_empty())
    }

    /// Returns ranges no channel can reach to the allocator, about `budget` bytes of them (at
    /// least one range if there is any; the rest stays quarantined for a later call); lists
    /// them.
    pub fn release_unreachable(&mut self, budget: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut taken = 0u64;
        let mut i = 0;
        while i < self.retired.len() {
            if taken >= budget && !out.is_empty() {
                break;
            }
            if self.retired[i].chans.is_empty() {
                taken = taken.saturating_add(self.retired[i].size);
                let r = self.retired.swap_remove(i);
                self.retired_bytes -= r.size;
                if self.alloc.free(r.addr, r.size) {
                    out.push((r.addr, r.size));
                }
            } else {
                i += 1;
            }
        }
        out
    }

    /// Bytes in quarantine charged to `owner`.
    pub fn held_by(&self, owner: u32) -> u64 {
        self.retired
            .iter()
            .filter(|r| r.owner == Some(owner))
            .map(|r| r.size)
            .sum()
    }

    /// Bytes in quarantine charged to the current owner ([`HypVram::set_owner`]).
    pub fn held_by_owner(&self) -> u64 {
        self.owner.as_ref().map_or(0, |(o, _)| self.held_by(*o))
    }

    /// Bytes in quarantine.
    pub fn retired_bytes(&self) -> u64 {
        self.retired_bytes
    }

    /// Bytes allocated, quarantined ones included (they are not free yet).
    pub fn used(&self) -> u64 {
        self.alloc.used()
    }

    /// Bytes in the allocator.
    pub fn size(&self) -> u64 {
        self.alloc.size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Channel `c` seen off the GPU, everything unreachable released at once.
    fn channel_off(h: &mut HypVram, c: u32) -> Vec<(u64, u64)> {
        h.strike(c);
        h.release_unreachable(u64::MAX)
    }

    #[test]
    fn aligned_fits_counts_what_repeated_allocs_find() {
        let mut a = RangeAllocator::new(1 << 20, (1 << 30) - (1 << 20));
        // Aligned 256 MiB blocks at 256, 512 and 768 MiB (the first 256 MiB start at 1 MiB).
        assert_eq!(a.aligned_fits(256 << 20), 3);
        let x = a.alloc(1 << 20, 1 << 20).unwrap();
        assert_eq!(a.aligned_fits(1 << 20), 1022);
        let mut n = 0;
        while a.alloc(256 << 20, 256 << 20).is_some() {
            n += 1;
        }
        assert_eq!(n, 3);
        assert_eq!(a.aligned_fits(256 << 20), 0);
        assert_eq!(a.aligned_fits(3), 0, "not a power of two");
        assert!(a.free(x, 1 << 20));
    }

    #[test]
    fn quarantined_frees_wait_for_every_channel() {
        let mut h = HypVram::quarantined(0, 0x10000);
        h.set_owner(Some((7, 4..6)));
        let a = h.alloc(0x1000, 0x1000).unwrap();
        assert!(h.free(a, 0x1000));
        assert!(
            !h.free(a, 0x1000),
            "a retired range cannot be retired twice"
        );
        assert_eq!(h.held_by(7), 0x1000);
        assert_eq!(h.held_by_owner(), 0x1000);
        assert_ne!(
            h.alloc(0x1000, 0x1000),
            Some(a),
            "not handed out while retired"
        );
        assert!(
            channel_off(&mut h, 4).is_empty(),
            "channel 5 may still use it"
        );
        assert_eq!(channel_off(&mut h, 5), vec![(a, 0x1000)]);
        assert_eq!(h.held_by(7), 0);
        assert_eq!(h.retired_bytes(), 0);
        assert_eq!(h.used(), 0x1000, "only the other allocation is left");
    }

    #[test]
    fn releases_are_bounded_per_call_and_the_rest_waits_for_the_next() {
        let mut h = HypVram::quarantined(0, 0x10_0000);
        h.set_owner(Some((1, 3..4)));
        let ranges: Vec<u64> = (0..10).map(|_| h.alloc(0x4000, 0x1000).unwrap()).collect();
        for &a in &ranges {
            assert!(h.free(a, 0x4000));
        }
        assert!(!h.has_unreachable(), "channel 3 may still use them");
        h.strike(3);
        assert!(h.has_unreachable());
        // 3 ranges' worth of budget (the range that crosses it is the last one taken).
        let first = h.release_unreachable(0x9000);
        assert_eq!(first.len(), 3);
        assert_eq!(h.retired_bytes(), 7 * 0x4000, "the rest stays quarantined");
        assert_eq!(h.used(), 7 * 0x4000, "released ranges are free again");
        let one = h.release_unreachable(0);
        assert_eq!(one.len(), 1, "at least one per call");
        let rest = h.release_unreachable(u64::MAX);
        assert_eq!(rest.len(), 6);
        assert!(!h.has_unreachable());
        assert_eq!(h.retired_bytes(), 0);
        let mut all: Vec<u64> = first.iter().chain(&one).chain(&rest).map(|r| r.0).collect();
        all.sort_unstable();
        assert_eq!(all, ranges, "each range released once");
    }

    #[test]
    fn host_frees_wait_for_all_channels_and_immediate_frees_do_not_wait() {
        let mut h = HypVram::quarantined(0, 0x10000);
        let a = h.alloc(0x1000, 0x1000).unwrap();
        assert!(h.free(a, 0x1000));
        for c in 0..gf100::pfifo::CHANNELS - 1 {
            assert!(channel_off(&mut h, c).is_empty());
        }
        assert_eq!(channel_off(&mut h, gf100::pfifo::CHANNELS - 1).len(), 1);
        let mut i = HypVram::immediate(0, 0x10000);
        let b = i.alloc(0x1000, 0x1000).unwrap();
        assert!(i.free(b, 0x1000));
        assert_eq!(i.used(), 0);
        assert!(!i.free(b, 0x1000));
    }

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
