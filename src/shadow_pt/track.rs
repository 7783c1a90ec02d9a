//! Write tracking of guest page-table pages — this project's version of GPUvm's "barrier" table
//! (GXEN `barrier.h` / `context_barrier.cc`: a refcounted two-level table of 4 KiB guest pages
//! whose accesses through PRAMIN/BAR1/BAR3 must be seen by the hypervisor). GPUvm registered
//! only instance blocks there; incremental and PV shadowing register every page holding a page
//! directory or a page table one of the VM's shadows uses, in the memory it lives in.
//!
//! The map is keyed by (memory, 4 KiB page) and holds, for each page, the *roles* of the tables
//! on it: "the page directory of address space P" or "the small/large table of PDE i of P". A
//! guest write is mapped to roles by looking up each written page (a hash map: every page-table
//! entry a guest writes through the fast path asks it once), or — for a write spanning more pages
//! than are tracked — by one pass over the tracked pages, so the cost of a write is
//! O(min(pages written, tracked) + roles hit), whatever length the caller passes.

use std::collections::{BTreeSet, HashMap};

use gf100::Target;

use super::GuestPdb;

/// The roles [`Tracker::roles_list`] found, in [`Tracker::roles_in`]'s order: none or one held
/// inline, or a list.
#[derive(Debug)]
pub(crate) enum RoleList {
    /// None or one role (one page holding at most one table).
    One(Option<Role>),
    /// Any number.
    Many(std::vec::IntoIter<Role>),
}

impl Iterator for RoleList {
    type Item = Role;

    fn next(&mut self) -> Option<Role> {
        match self {
            RoleList::One(r) => r.take(),
            RoleList::Many(it) => it.next(),
        }
    }
}

/// 4 KiB: the tracking granularity.
const PAGE: u64 = gf100::PAGE_SIZE;

/// The memory a guest address names. Both system-memory targets (snooped and non-snooped)
/// reach the same guest-physical address, so they are one memory here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Mem {
    /// Guest VRAM.
    Vram,
    /// Guest RAM (GPA).
    Ram,
}

impl Mem {
    /// The memory `target` names.
    pub(crate) fn of(target: Target) -> Mem {
        if target.is_sysram() {
            Mem::Ram
        } else {
            Mem::Vram
        }
    }
}

/// Which table of an address space a tracked page holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum TableKind {
    /// The page directory.
    Pd,
    /// The small-page table of PDE `n`.
    Small(u16),
    /// The large-page table of PDE `n`.
    Large(u16),
}

/// One table of one address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Role {
    /// The address space.
    pub pdb: GuestPdb,
    /// The table in it.
    pub kind: TableKind,
}

/// The tracked pages. Roles are kept in ordered sets so that many tables on one page (a guest
/// pointing thousands of PDEs at one table) cost O(log n) per change, not O(n). The pages are
/// hashed with aHash under random keys, as the simulator's TLB is: a guest choosing where its
/// tables live cannot make their pages collide.
#[derive(Debug)]
pub(crate) struct Tracker {
    pages: HashMap<(Mem, u64), BTreeSet<Role>, ahash::RandomState>,
    /// Bumped whenever the set of tracked pages changes (a VMM that write-protects them
    /// re-reads the set when this moves).
    version: u64,
}

impl Default for Tracker {
    /// No page tracked; the hash keys from the standard library's random per-process keys.
    fn default() -> Tracker {
        use std::hash::{BuildHasher, RandomState};
        let std_keys = RandomState::new();
        let key = |i: u64| std_keys.hash_one(i);
        Tracker {
            pages: HashMap::with_hasher(ahash::RandomState::with_seeds(
                key(0),
                key(1),
                key(2),
                key(3),
            )),
            version: 0,
        }
    }
}

/// The 4 KiB pages overlapping `[addr, addr + len)` (empty for `len == 0`).
fn pages(addr: u64, len: u64) -> impl Iterator<Item = u64> {
    let first = addr & !(PAGE - 1);
    let last = addr.saturating_add(len.max(1) - 1) & !(PAGE - 1);
    let count = if len == 0 {
        0
    } else {
        (last - first) / PAGE + 1
    };
    (0..count).map(move |i| first + i * PAGE)
}

impl Tracker {
    /// Records that `[addr, addr + len)` in `mem` holds the table `role` (idempotent).
    pub(crate) fn track(&mut self, mem: Mem, addr: u64, len: u64, role: Role) {
        for page in pages(addr, len) {
            let roles = self.pages.entry((mem, page)).or_default();
            if roles.is_empty() {
                self.version += 1;
            }
            roles.insert(role);
        }
    }

    /// Forgets that `[addr, addr + len)` in `mem` holds the table `role`.
    pub(crate) fn untrack(&mut self, mem: Mem, addr: u64, len: u64, role: Role) {
        for page in pages(addr, len) {
            if let Some(roles) = self.pages.get_mut(&(mem, page)) {
                roles.remove(&role);
                if roles.is_empty() {
                    self.pages.remove(&(mem, page));
                    self.version += 1;
                }
            }
        }
    }

    /// True if the page holding `addr` in `mem` holds any table.
    pub(crate) fn is_tracked(&self, mem: Mem, addr: u64) -> bool {
        self.pages.contains_key(&(mem, addr & !(PAGE - 1)))
    }

    /// [`Tracker::roles_in`] without allocating when the range lies on one page holding at
    /// most one table (a page-table entry written: the common case on every write path).
    pub(crate) fn roles_list(&self, mem: Mem, addr: u64, end: u64) -> RoleList {
        if end > addr && addr & !(PAGE - 1) == (end - 1) & !(PAGE - 1) {
            match self.pages.get(&(mem, addr & !(PAGE - 1))) {
                None => return RoleList::One(None),
                Some(r) if r.len() == 1 => return RoleList::One(r.first().copied()),
                Some(_) => {}
            }
        }
        RoleList::Many(self.roles_in(mem, addr, end).into_iter())
    }

    /// The roles of every table on a page overlapping `[addr, end)` in `mem`, each once, in a
    /// stable order (page directories first, so a write that changes a PDE and lands in one of
    /// its tables re-walks the table before touching single entries of it).
    pub(crate) fn roles_in(&self, mem: Mem, addr: u64, end: u64) -> Vec<Role> {
        if end <= addr {
            return Vec::new();
        }
        let first = addr & !(PAGE - 1);
        let last = (end - 1) & !(PAGE - 1);
        let key = |r: &Role| (r.kind != TableKind::Pd, *r);
        if first == last {
            // One page (a page-table entry written): its set is already distinct, so no set
            // to merge into; only the directories-first order is left to make.
            let mut out: Vec<Role> = self
                .pages
                .get(&(mem, first))
                .map(|r| r.iter().copied().collect())
                .unwrap_or_default();
            out.sort_by_key(key);
            return out;
        }
        let mut out: BTreeSet<Role> = BTreeSet::new();
        let span = (last - first) / PAGE + 1;
        if span <= self.pages.len() as u64 {
            for page in (0..span).map(|i| first + i * PAGE) {
                if let Some(roles) = self.pages.get(&(mem, page)) {
                    out.extend(roles.iter().copied());
                }
            }
        } else {
            // More pages written than tracked: one pass over the tracked ones.
            for (_, roles) in self
                .pages
                .iter()
                .filter(|((m, p), _)| *m == mem && (first..=last).contains(p))
            {
                out.extend(roles.iter().copied());
            }
        }
        let mut out: Vec<Role> = out.into_iter().collect();
        out.sort_by_key(key);
        out
    }

    /// The roles of the tables on the page holding `addr` in `mem`.
    pub(crate) fn roles_at(&self, mem: Mem, addr: u64) -> impl Iterator<Item = &Role> {
        self.pages
            .get(&(mem, addr & !(PAGE - 1)))
            .into_iter()
            .flat_map(|r| r.iter())
    }

    /// Number of tracked pages.
    pub(crate) fn len(&self) -> u64 {
        self.pages.len() as u64
    }

    /// Forgets everything.
    pub(crate) fn clear(&mut self) {
        if !self.pages.is_empty() {
            self.version += 1;
        }
        self.pages.clear();
    }

    /// Changes so far to the set of tracked pages.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(kind: TableKind) -> Role {
        Role {
            pdb: GuestPdb {
                addr: 0,
                target: Target::Vram,
            },
            kind,
        }
    }

    #[test]
    fn pages_cover_partial_pages_and_nothing_for_empty_ranges() {
        assert_eq!(
            pages(0x1ff8, 0x10).collect::<Vec<_>>(),
            vec![0x1000, 0x2000]
        );
        assert_eq!(pages(0x1000, 0x1000).collect::<Vec<_>>(), vec![0x1000]);
        assert_eq!(pages(0x1000, 0).count(), 0);
        assert_eq!(
            pages(u64::MAX - 3, 100).count(),
            1,
            "saturates, no overflow"
        );
    }

    /// A write's roles are the same whether the tracker looks its pages up one by one (the
    /// write spans no more pages than are tracked) or passes over the tracked pages (it spans
    /// more), for writes over every part of the tracked range, in both memories, up to the end
    /// of the address space.
    #[test]
    fn roles_of_long_and_short_writes_agree_with_the_pages_tracked() {
        let mut t = Tracker::default();
        let (a, b, c) = (
            role(TableKind::Small(1)),
            role(TableKind::Large(2)),
            role(TableKind::Pd),
        );
        t.track(Mem::Vram, 0x20000, 0x1000, a);
        t.track(Mem::Vram, 0x23000, 0x2000, b);
        t.track(Mem::Ram, 0x21000, 0x1000, c);
        assert_eq!(t.len(), 4);
        // Expected: every role on a tracked page of `mem` the range overlaps, directories first.
        let expect = |mem: Mem, lo: u64, hi: u64| {
            let mut v: Vec<Role> = [
                (Mem::Vram, 0x20000, a),
                (Mem::Vram, 0x23000, b),
                (Mem::Vram, 0x24000, b),
                (Mem::Ram, 0x21000, c),
            ]
            .into_iter()
            .filter(|&(m, p, _)| m == mem && p < hi && lo < p + PAGE)
            .map(|(_, _, r)| r)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
            v.sort_by_key(|r| (r.kind != TableKind::Pd, *r));
            v
        };
        for mem in [Mem::Vram, Mem::Ram] {
            for (lo, hi) in [
                (0x20ff8, 0x21008), // two pages: looked up
                (0x22ff8, 0x24008), // three pages: looked up
                (0x1f000, 0x26000), // seven pages: more than tracked, one pass
                (0x0, u64::MAX),    // the whole space
                (0x24ff8, 0x25000),
                (0x25000, 0x40000),
            ] {
                assert_eq!(
                    t.roles_in(mem, lo, hi),
                    expect(mem, lo, hi),
                    "{mem:?} {lo:#x}..{hi:#x}"
                );
                assert_eq!(
                    t.roles_list(mem, lo, hi).collect::<Vec<_>>(),
                    expect(mem, lo, hi),
                    "{mem:?} {lo:#x}..{hi:#x}"
                );
            }
        }
    }

    #[test]
    fn tracking_is_per_role_and_per_memory() {
        let mut t = Tracker::default();
        let a = role(TableKind::Small(3));
        let b = role(TableKind::Pd);
        t.track(Mem::Vram, 0x10000, 0x2000, a);
        t.track(Mem::Vram, 0x11000, 0x1000, b);
        t.track(Mem::Vram, 0x10000, 0x2000, a);
        assert_eq!(t.len(), 2);
        assert!(t.is_tracked(Mem::Vram, 0x11234));
        assert!(!t.is_tracked(Mem::Ram, 0x11234));
        assert_eq!(t.roles_in(Mem::Vram, 0x10ff8, 0x11008), vec![b, a]);
        assert_eq!(
            t.roles_at(Mem::Vram, 0x11000).copied().collect::<Vec<_>>(),
            vec![b, a]
        );
        // The non-allocating form agrees with `roles_in`, on one page and across pages.
        for (lo, hi) in [
            (0x10ff8, 0x11008),
            (0x10000, 0x10008),
            (0x11000, 0x11008),
            (0x12000, 0x12008),
            (5, 5),
        ] {
            assert_eq!(
                t.roles_list(Mem::Vram, lo, hi).collect::<Vec<_>>(),
                t.roles_in(Mem::Vram, lo, hi),
                "{lo:#x}..{hi:#x}"
            );
        }
        assert!(
            matches!(t.roles_list(Mem::Vram, 0x10000, 0x10008), RoleList::One(Some(r)) if r == a)
        );
        assert!(matches!(
            t.roles_list(Mem::Vram, 0x11000, 0x11008),
            RoleList::Many(_)
        ));
        t.untrack(Mem::Vram, 0x10000, 0x2000, a);
        assert_eq!(t.len(), 1);
        assert_eq!(t.roles_in(Mem::Vram, 0, u64::MAX), vec![b]);
        assert!(t.roles_in(Mem::Vram, 5, 5).is_empty());
        t.clear();
        assert_eq!(t.len(), 0);
    }
}
