//! The GF100 MMU: virtual address spaces (a page directory plus a limit, read from an instance
//! block), the two-level page walk, the TLB, and memory access through GPU virtual addresses.
//!
//! Walk (`gf100::mmu`): PDE at `pd + pde_index(va) * 8`; a PDE with neither table faults
//! PT_NOT_PRESENT; an offset beyond the PDE's PT_SIZE coverage faults PT_TOO_SHORT; the small-page
//! table is tried first, then the large-page table (GPUvm's resolver order); no present PTE faults
//! PAGE_NOT_PRESENT; a PTE with target value 1 faults INVALID_STORAGE_TYPE (the model's choice:
//! hardware's reaction to that encoding is undocumented); a write to a read-only page faults
//! PAGE_READ_ONLY; a VA above the instance block's limit faults VM_LIMIT_EXCEEDED. A page-table
//! read that reaches no memory counts as an absent table (PT_NOT_PRESENT for the PDE,
//! PAGE_NOT_PRESENT for a PTE). Supervisor-only pages and compression are not modelled.
//!
//! The TLB caches successful translations per (page directory, 4 KiB virtual page) until a flush
//! (PFFB 0x100cbc or host method MEM_OP_B), so rewriting a PTE without a flush keeps using the
//! stale translation, as on hardware. It holds at most [`TLB_CAPACITY`] entries and is emptied
//! when full.

use std::collections::HashMap;

use gf100::mmu::{self, Pde, PtRef, Pte};
use gf100::{fault, inst, Target};

use super::mem::Memory;
use super::Core;

/// Most translations the TLB holds before it is emptied.
pub(crate) const TLB_CAPACITY: usize = 1 << 16;

/// A GPU virtual address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Vspace {
    /// Page directory, `None` if the instance block's PDB has the invalid target.
    pub pd: Option<(u64, Target)>,
    /// Highest valid virtual address.
    pub limit: u64,
}

impl Vspace {
    /// Reads the PDB (inst + 0x200) and limit (inst + 0x208) of the instance block at `inst`.
    pub(crate) fn load(mem: &mut Memory, inst: u64, target: Target) -> Vspace {
        let pdb = mem.read_u64(target, inst + inst::PDB_LO);
        let limit = mem.read_u64(target, inst + inst::LIMIT_LO).unwrap_or(0);
        Vspace {
            pd: pdb.and_then(inst::pdb_decode),
            limit,
        }
    }
}

/// A failed translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VaFault {
    /// The faulting virtual address.
    pub va: u64,
    /// `gf100::fault::REASON_*`.
    pub reason: u32,
    /// The access was a write.
    pub write: bool,
}

/// A cached translation of one 4 KiB virtual page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TlbEntry {
    page: u64,
    target: Target,
    read_only: bool,
    supervisor: bool,
}

/// TLB key: page directory (address, is system memory) and 4 KiB virtual page number.
type TlbKey = (u64, bool, u64);

/// A page directory's translations, by virtual page number.
type PdPages = HashMap<u64, TlbEntry, ahash::RandomState>;

/// The translation cache, one for the whole GPU. Hashed with aHash, not the default SipHash:
/// every engine piece and BAR access translates, and hashing was nearly all of a hit's cost
/// (callgrind: 660 K of the engine worker's 711 K instructions in `translate_as` over an
/// `exp scale --vms 1` run). Its keys are random per table ([`Tlb::default`]), as SipHash's
/// are, so a guest choosing page numbers cannot make its entries collide and slow every VM's
/// lookups.
///
/// Kept per page directory, so that flushing one directory (what a VM's TLB flush becomes)
/// drops its translations without looking at any other's: one table of every directory's
/// entries made each such flush a pass over all VMs' translations, 4.4 µs under the simulator's
/// lock with 16 VMs on the 16-core machine, the longest hold any caller made of that lock
/// (docs/benchmarks.md, fourteenth round).
#[derive(Debug)]
pub(crate) struct Tlb {
    pds: HashMap<(u64, bool), PdPages, ahash::RandomState>,
    /// Translations held, all directories together.
    len: usize,
    hasher: ahash::RandomState,
    /// Emptied directory maps kept for the next directory cached ([`SPARE_MAPS`] at most, none
    /// larger than [`SPARE_MAP_CAPACITY`]): a VM's TLB flush empties its directory's map and
    /// the next engine piece fills it again, so a map dropped at each flush is allocated and
    /// grown (rehashed) anew each time — 1.5-2 % of a 16 KiB copy's run in `perf`.
    spare: Vec<PdPages>,
}

/// Emptied directory maps the TLB keeps for reuse.
const SPARE_MAPS: usize = 8;

/// Largest map (in translations it can hold without growing) kept for reuse: bounds what the
/// spares hold to a few hundred KiB whatever directories came and went.
const SPARE_MAP_CAPACITY: usize = 1024;

impl Default for Tlb {
    /// An empty TLB whose aHash keys come from the standard library's random per-process keys
    /// (aHash's own source of them would bring `getrandom` and its platform crates).
    fn default() -> Tlb {
        use std::hash::{BuildHasher, RandomState};
        let std_keys = RandomState::new();
        let key = |i: u64| std_keys.hash_one(i);
        let hasher = ahash::RandomState::with_seeds(key(0), key(1), key(2), key(3));
        Tlb {
            pds: HashMap::with_hasher(hasher.clone()),
            len: 0,
            hasher,
            spare: Vec::new(),
        }
    }
}

impl Tlb {
    fn key(pd: (u64, Target), va: u64) -> TlbKey {
        (pd.0, pd.1.is_sysram(), va >> mmu::SMALL_PAGE_SHIFT)
    }

    fn get(&self, (pd, sys, vpn): TlbKey) -> Option<&TlbEntry> {
        self.pds.get(&(pd, sys))?.get(&vpn)
    }

    fn insert(&mut self, (pd, sys, vpn): TlbKey, e: TlbEntry) {
        if self.len >= TLB_CAPACITY {
            self.flush_all();
        }
        let (hasher, spare) = (&self.hasher, &mut self.spare);
        let pages = self.pds.entry((pd, sys)).or_insert_with(|| {
            spare
                .pop()
                .unwrap_or_else(|| HashMap::with_hasher(hasher.clone()))
        });
        if pages.insert(vpn, e).is_none() {
            self.len += 1;
        }
    }

    /// Drops every translation.
    pub(crate) fn flush_all(&mut self) {
        for (_, pages) in self.pds.drain() {
            Tlb::keep_spare(&mut self.spare, pages);
        }
        self.len = 0;
    }

    /// Keeps an emptied directory map for reuse, within the spares' bounds; drops it otherwise.
    fn keep_spare(spare: &mut Vec<PdPages>, mut pages: PdPages) {
        if spare.len() < SPARE_MAPS && pages.capacity() <= SPARE_MAP_CAPACITY {
            pages.clear();
            spare.push(pages);
        }
    }

    /// Drops the translations of the page directory at `pd` (VRAM vs. system memory as in
    /// TLB_FLUSH_VSPACE: both system-memory targets match).
    pub(crate) fn flush_pd(&mut self, pd: u64, target: Target) {
        if let Some(pages) = self.pds.remove(&(pd, target.is_sysram())) {
            self.len -= pages.len();
            Tlb::keep_spare(&mut self.spare, pages);
        }
    }

    /// Drops the translation of one virtual page of one page directory; the directory's map
    /// leaves the table with its last translation (to the spares, or dropped), so no empty map
    /// stays in it, whatever directories come and go.
    pub(crate) fn flush_page(&mut self, pd: u64, target: Target, va: u64) {
        let (pd, sys, vpn) = Tlb::key((pd, target), va);
        if let Some(pages) = self.pds.get_mut(&(pd, sys)) {
            self.len -= usize::from(pages.remove(&vpn).is_some());
            if pages.is_empty() {
                if let Some(pages) = self.pds.remove(&(pd, sys)) {
                    Tlb::keep_spare(&mut self.spare, pages);
                }
            }
        }
    }

    /// Drops the translations of one virtual page in every page directory (and the maps of
    /// directories left empty).
    pub(crate) fn flush_va(&mut self, va: u64) {
        let vpn = va >> mmu::SMALL_PAGE_SHIFT;
        let (len, spare, hasher) = (&mut self.len, &mut self.spare, &self.hasher);
        self.pds.retain(|_, pages| {
            *len -= usize::from(pages.remove(&vpn).is_some());
            if pages.is_empty() {
                // An empty map allocates nothing: the swap only moves the emptied one out.
                let empty = HashMap::with_hasher(hasher.clone());
                Tlb::keep_spare(spare, std::mem::replace(pages, empty));
                return false;
            }
            true
        });
    }

    /// Number of cached translations.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Core {
    /// Translates `va` in `vs` for a read or write access by the host interface (BAR1/BAR3):
    /// (physical address, target). Supervisor-only pages are reachable (the BARs are the
    /// host's, not a channel's); channel clients go through [`Core::read_va`] /
    /// [`Core::write_va`], which refuse them.
    pub(crate) fn translate(
        &mut self,
        vs: &Vspace,
        va: u64,
        write: bool,
    ) -> Result<(u64, Target), VaFault> {
        self.translate_as(vs, va, write, true)
    }

    /// [`Core::translate`] for a client that is `privileged` or not: an unprivileged one
    /// (every channel's engines and PBDMA: the simulator has no FECS and no privileged
    /// channels) faults with reason 5 on a supervisor-only page — the PTE bit that keeps a
    /// VM's channels out of the GR contexts the host maps for them (`shadow_pt::hyp`).
    fn translate_as(
        &mut self,
        vs: &Vspace,
        va: u64,
        write: bool,
        privileged: bool,
    ) -> Result<(u64, Target), VaFault> {
        let fail = |reason| VaFault { va, reason, write };
        if va > vs.limit || va >= mmu::VA_LIMIT {
            return Err(fail(fault::REASON_VM_LIMIT_EXCEEDED));
        }
        let pd = vs.pd.ok_or(fail(fault::REASON_PT_NOT_PRESENT))?;
        let key = Tlb::key(pd, va);
        let entry = match self.tlb.get(key) {
            Some(&e) => {
                self.stats.tlb_hits += 1;
                e
            }
            None => {
                self.stats.tlb_misses += 1;
                let e = self.walk(pd, va).map_err(fail)?;
                self.tlb.insert(key, e);
                e
            }
        };
        if entry.supervisor && !privileged {
            return Err(fail(fault::REASON_PAGE_SYSTEM_ONLY));
        }
        if write && entry.read_only {
            return Err(fail(fault::REASON_PAGE_READ_ONLY));
        }
        Ok((entry.page + (va & (mmu::SMALL_PAGE_SIZE - 1)), entry.target))
    }

    /// The memory target `va` translates to in `vs`, without filling the TLB or counting
    /// anything (an engine operation's launch-time scan, `engine`); `None` if it would fault.
    pub(crate) fn peek_target(&mut self, vs: &Vspace, va: u64) -> Option<Target> {
        if va > vs.limit || va >= mmu::VA_LIMIT {
            return None;
        }
        let pd = vs.pd?;
        if let Some(e) = self.tlb.get(Tlb::key(pd, va)) {
            return Some(e.target);
        }
        let errors = self.mem.errors;
        let e = self.walk(pd, va).ok();
        self.mem.errors = errors;
        e.map(|e| e.target)
    }

    /// Walks the page tables for `va`; returns the 4 KiB page's translation or a fault reason.
    fn walk(&mut self, pd: (u64, Target), va: u64) -> Result<TlbEntry, u32> {
        let raw = self
            .mem
            .read_u64(
                pd.1,
                pd.0.wrapping_add(mmu::pde_index(va) * mmu::ENTRY_SIZE),
            )
            .ok_or(fault::REASON_PT_NOT_PRESENT)?;
        let pde = Pde::decode(raw);
        if pde.small.is_none() && pde.large.is_none() {
            return Err(fault::REASON_PT_NOT_PRESENT);
        }
        if va & (mmu::PDE_COVERAGE - 1) >= pde.size.coverage() {
            return Err(fault::REASON_PT_TOO_SHORT);
        }
        if let Some(spt) = pde.small {
            if let Some(pte) = self.read_pte(spt, mmu::spt_index(va))? {
                return Ok(TlbEntry {
                    page: pte.addr,
                    target: pte.target,
                    read_only: pte.read_only,
                    supervisor: pte.supervisor,
                });
            }
        }
        if let Some(lpt) = pde.large {
            if let Some(pte) = self.read_pte(lpt, mmu::lpt_index(va))? {
                let sub = va & (mmu::LARGE_PAGE_SIZE - 1) & !(mmu::SMALL_PAGE_SIZE - 1);
                return Ok(TlbEntry {
                    page: pte.addr.wrapping_add(sub),
                    target: pte.target,
                    read_only: pte.read_only,
                    supervisor: pte.supervisor,
                });
            }
        }
        Err(fault::REASON_PAGE_NOT_PRESENT)
    }

    fn read_pte(&mut self, pt: PtRef, index: u64) -> Result<Option<Pte>, u32> {
        let raw = self
            .mem
            .read_u64(pt.target, pt.addr.wrapping_add(index * mmu::ENTRY_SIZE))
            .ok_or(fault::REASON_PAGE_NOT_PRESENT)?;
        Pte::decode(raw).map_err(|_| fault::REASON_INVALID_STORAGE_TYPE)
    }

    /// Reads `buf.len()` bytes at `va` for a channel (an unprivileged client), page by page.
    /// Stops at the first fault (the bytes before it have been read).
    pub(crate) fn read_va(&mut self, vs: &Vspace, va: u64, buf: &mut [u8]) -> Result<(), VaFault> {
        let mut done = 0usize;
        while done < buf.len() {
            let a = va.wrapping_add(done as u64);
            let (pa, target) = self.translate_as(vs, a, false, false)?;
            let n = page_piece(a, buf.len() - done);
            self.mem.read(target, pa, &mut buf[done..done + n]);
            done += n;
        }
        Ok(())
    }

    /// Writes `data` at `va`, page by page. Stops at the first fault (the bytes before it have
    /// been written).
    pub(crate) fn write_va(&mut self, vs: &Vspace, va: u64, data: &[u8]) -> Result<(), VaFault> {
        let mut done = 0usize;
        while done < data.len() {
            let a = va.wrapping_add(done as u64);
            let (pa, target) = self.translate_as(vs, a, true, false)?;
            let n = page_piece(a, data.len() - done);
            self.mem.write(target, pa, &data[done..done + n]);
            done += n;
        }
        Ok(())
    }

    /// Copies `n` bytes from `src` to `dst` in `vs` for a channel, with the effect of
    /// [`Core::read_va`] of the source into a staging buffer and then [`Core::write_va`] of it
    /// to the destination — the same translations in the same order, the same fault (a source
    /// fault writes nothing; a destination fault stops the copy there), the same traffic — but
    /// memory to memory where it can ([`Memory::copy_direct`]): every page of both sides
    /// reachable in place and no page of the source overlapping one of the destination.
    /// Otherwise it goes through `scratch.stage` as the two calls would.
    pub(crate) fn copy_va(
        &mut self,
        vs: &Vspace,
        src: u64,
        dst: u64,
        n: usize,
        scratch: &mut CopyScratch,
    ) -> Result<(), VaFault> {
        let CopyScratch { stage, from, to } = scratch;
        let runs = |core: &mut Core, va: u64, write: bool, out: &mut Vec<Run>| {
            out.clear();
            let mut done = 0usize;
            while done < n {
                let a = va.wrapping_add(done as u64);
                let (addr, target) = core.translate_as(vs, a, write, false)?;
                let len = page_piece(a, n - done);
                out.push(Run { addr, target, len });
                done += len;
            }
            Ok(())
        };
        let read_all = |core: &mut Core, from: &[Run], stage: &mut Vec<u8>| {
            stage.resize(from.iter().map(|r| r.len).sum(), 0);
            let mut at = 0;
            for r in from {
                core.mem.read(r.target, r.addr, &mut stage[at..at + r.len]);
                at += r.len;
            }
        };
        if let Err(f) = runs(self, src, false, from) {
            // What `read_va` did before the fault: the pages before it read.
            read_all(self, from, stage);
            return Err(f);
        }
        let fault = runs(self, dst, true, to).err();
        let mem = &self.mem;
        let in_place = from
            .iter()
            .all(|r| mem.in_place(r.target, r.addr, r.len, false))
            && to
                .iter()
                .all(|r| mem.in_place(r.target, r.addr, r.len, true))
            && !from.iter().any(|a| to.iter().any(|b| a.overlaps(b)));
        if in_place {
            // Both sides run by run, a piece at a time up to the nearer run end.
            let (mut i, mut j, mut ai, mut bj) = (0, 0, 0, 0);
            while i < from.len() && j < to.len() {
                let (a, b) = (from[i], to[j]);
                let len = (a.len - ai).min(b.len - bj);
                let (from_at, to_at) = (a.addr + ai as u64, b.addr + bj as u64);
                if !self
                    .mem
                    .copy_direct((a.target, from_at), (b.target, to_at), len)
                {
                    // In place a moment ago, no longer: a VRAM chunk scrubbed beside the
                    // simulator's lock (`Vram::fill`) reads through `pread` again. This piece
                    // through the staging.
                    stage.resize(len, 0);
                    self.mem.read(a.target, from_at, &mut stage[..len]);
                    self.mem.write(b.target, to_at, &stage[..len]);
                }
                ai += len;
                bj += len;
                if ai == a.len {
                    (i, ai) = (i + 1, 0);
                }
                if bj == b.len {
                    (j, bj) = (j + 1, 0);
                }
            }
            // A destination that faulted: the staged copy had read the rest of the source too.
            for (k, r) in from.iter().enumerate().skip(i) {
                let left = if k == i { r.len - ai } else { r.len };
                self.mem.count_read(r.target, left);
            }
        } else {
            read_all(self, from, stage);
            let mut at = 0;
            for r in to.iter() {
                self.mem.write(r.target, r.addr, &stage[at..at + r.len]);
                at += r.len;
            }
        }
        fault.map_or(Ok(()), Err)
    }

    /// Reads a u32 at `va`.
    pub(crate) fn read_va_u32(&mut self, vs: &Vspace, va: u64) -> Result<u32, VaFault> {
        let mut b = [0u8; 4];
        self.read_va(vs, va, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
}

/// What a copy works in, kept between its pieces ([`Core::copy_va`]).
#[derive(Debug, Default)]
pub(crate) struct CopyScratch {
    /// Bytes read before they are written, where the copy cannot move them in place. Reused,
    /// not zeroed: it holds the last copy's bytes, possibly another VM's, and every use reads
    /// the whole source into it first.
    stage: Vec<u8>,
    /// The source's pages as translated.
    from: Vec<Run>,
    /// The destination's pages as translated, up to its first fault.
    to: Vec<Run>,
}

/// A piece of a copy's source or destination within one page: where it is in memory.
#[derive(Debug, Clone, Copy)]
struct Run {
    addr: u64,
    target: Target,
    len: usize,
}

impl Run {
    /// Whether the two share bytes of memory. Two DMA windows may map the same guest RAM, so
    /// system-memory runs count as overlapping each other ([`Memory::copy_direct`] refuses
    /// such a pair anyway).
    fn overlaps(&self, other: &Run) -> bool {
        if self.target.is_sysram() && other.target.is_sysram() {
            return true;
        }
        self.target == other.target
            && self.addr < other.addr.saturating_add(other.len as u64)
            && other.addr < self.addr.saturating_add(self.len as u64)
    }
}

/// Bytes from `va` to the end of its 4 KiB page, at most `rest`.
pub(crate) fn page_piece(va: u64, rest: usize) -> usize {
    let in_page = (mmu::SMALL_PAGE_SIZE - (va & (mmu::SMALL_PAGE_SIZE - 1))) as usize;
    in_page.min(rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::CostModel;
    use gf100::mmu::PtSize;

    const PD: u64 = 0x10_0000;
    const SPT: u64 = 0x20_0000;
    const LPT: u64 = 0x30_0000;

    fn core() -> Core {
        Core::new(64 << 20, CostModel::instant())
    }

    fn vs() -> Vspace {
        Vspace {
            pd: Some((PD, Target::Vram)),
            limit: mmu::VA_LIMIT - 1,
        }
    }

    fn put(c: &mut Core, addr: u64, v: u64) {
        assert!(c.mem.write(Target::Vram, addr, &v.to_le_bytes()));
    }

    fn pde(c: &mut Core, index: u64, small: Option<u64>, large: Option<u64>, size: PtSize) {
        let r = |a| PtRef {
            addr: a,
            target: Target::Vram,
            vol: false,
        };
        put(
            c,
            PD + index * 8,
            Pde {
                small: small.map(r),
                large: large.map(r),
                size,
            }
            .encode(),
        );
    }

    #[test]
    fn small_pages_translate_and_are_cached_until_flushed() {
        let mut c = core();
        pde(&mut c, 0, Some(SPT), None, PtSize::Full);
        put(&mut c, SPT + 8, Pte::new(0x40_0000, Target::Vram).encode());
        assert_eq!(
            c.translate(&vs(), 0x1234, false),
            Ok((0x40_0234, Target::Vram))
        );
        put(&mut c, SPT + 8, Pte::new(0x50_0000, Target::Vram).encode());
        assert_eq!(
            c.translate(&vs(), 0x1238, false),
            Ok((0x40_0238, Target::Vram)),
            "stale until flushed"
        );
        assert_eq!((c.stats.tlb_hits, c.stats.tlb_misses), (1, 1));
        c.tlb.flush_pd(PD, Target::Vram);
        assert_eq!(
            c.translate(&vs(), 0x1238, false),
            Ok((0x50_0238, Target::Vram))
        );
    }

    #[test]
    fn flush_of_another_pd_or_page_keeps_the_entry() {
        let mut c = core();
        pde(&mut c, 0, Some(SPT), None, PtSize::Full);
        put(&mut c, SPT + 8, Pte::new(0x40_0000, Target::Vram).encode());
        assert!(c.translate(&vs(), 0x1000, false).is_ok());
        c.tlb.flush_pd(PD + 0x1000, Target::Vram);
        c.tlb.flush_pd(PD, Target::SysCoherent);
        c.tlb.flush_page(PD, Target::Vram, 0x2000);
        assert_eq!(c.tlb.len(), 1);
        c.tlb.flush_page(PD, Target::Vram, 0x1000);
        assert_eq!(c.tlb.len(), 0);
    }

    /// A writable, unprivileged VRAM translation to `page`.
    fn e(page: u64) -> TlbEntry {
        TlbEntry {
            page,
            target: Target::Vram,
            read_only: false,
            supervisor: false,
        }
    }

    /// A flushed directory's map is reused by the next directory cached — no allocation and no
    /// growth again — and the spares stay within their bounds: a map grown past
    /// `SPARE_MAP_CAPACITY` is dropped, never more than `SPARE_MAPS` are kept.
    #[test]
    fn flushed_directory_maps_are_reused_within_bounds() {
        let mut t = Tlb::default();
        let a = (PD, Target::Vram);
        for vpn in 0..100u64 {
            t.insert(Tlb::key(a, vpn << 12), e(vpn));
        }
        let grown = t.pds.values().next().map(HashMap::capacity).unwrap();
        t.flush_pd(a.0, a.1);
        assert_eq!((t.len(), t.spare.len()), (0, 1));
        let other = (PD + 0x2_0000, Target::SysCoherent);
        t.insert(Tlb::key(other, 0x5000), e(5));
        assert!(t.spare.is_empty(), "the spare map was taken");
        assert_eq!(t.pds.values().next().map(HashMap::capacity), Some(grown));
        assert_eq!(t.get(Tlb::key(other, 0x5000)).map(|x| x.page), Some(5));
        // The reused map holds nothing of the directory it served: a's page 1 is no
        // translation of the new directory's (a stale entry would be another VM's page).
        assert!(
            (0..100u64).all(|vpn| vpn == 5 || t.get(Tlb::key(other, vpn << 12)).is_none()),
            "nothing of the old directory"
        );
        assert_eq!(t.len(), 1);
        // Bounds: many directories flushed keep at most SPARE_MAPS maps; a large one none.
        for d in 0..3 * SPARE_MAPS as u64 {
            t.insert(Tlb::key((PD + (d << 16), Target::Vram), 0), e(d));
        }
        t.flush_all();
        assert_eq!(t.spare.len(), SPARE_MAPS);
        t.spare.clear();
        for vpn in 0..2 * SPARE_MAP_CAPACITY as u64 {
            t.insert(Tlb::key(a, vpn << 12), e(vpn));
        }
        t.flush_pd(a.0, a.1);
        assert!(t.spare.is_empty(), "a map grown past the bound is dropped");
    }

    #[test]
    fn each_flush_drops_exactly_its_translations_and_the_count_follows() {
        let mut t = Tlb::default();
        let (a, b) = ((PD, Target::Vram), (PD + 0x1_0000, Target::Vram));
        for vpn in 0..4u64 {
            t.insert(Tlb::key(a, vpn << 12), e(vpn));
            t.insert(Tlb::key(b, vpn << 12), e(vpn + 16));
        }
        t.insert(Tlb::key(a, 0), e(0)); // again: still one translation
        assert_eq!(t.len(), 8);
        t.flush_va(0x2000);
        assert_eq!(t.len(), 6);
        assert!(t.get(Tlb::key(a, 0x2000)).is_none() && t.get(Tlb::key(b, 0x2000)).is_none());
        t.flush_pd(a.0, a.1);
        assert_eq!(t.len(), 3, "the other directory keeps its own");
        assert_eq!(t.get(Tlb::key(b, 0x3000)).map(|x| x.page), Some(19));
        assert!(t.get(Tlb::key(a, 0x3000)).is_none());
        t.flush_page(b.0, b.1, 0x1000);
        t.flush_page(b.0, b.1, 0x1000);
        assert_eq!(t.len(), 2);
        // A directory whose last translation goes leaves no empty map behind.
        t.flush_page(b.0, b.1, 0x0000);
        t.flush_va(0x3000);
        assert_eq!(t.len(), 0);
        assert!(t.pds.is_empty(), "no empty directory maps kept");
        assert!(t.spare.len() <= SPARE_MAPS && t.spare.iter().all(HashMap::is_empty));
        t.insert(Tlb::key(b, 0x1000), e(17));
        t.insert(Tlb::key(b, 0x3000), e(19));
        // Full: emptied before the next translation is cached.
        t.flush_all();
        assert_eq!(t.len(), 0);
        for vpn in 0..TLB_CAPACITY as u64 {
            t.insert(Tlb::key(a, vpn << 12), e(vpn));
        }
        assert_eq!(t.len(), TLB_CAPACITY);
        t.insert(Tlb::key(b, 0x7000), e(7));
        assert_eq!(t.len(), 1);
        assert!(t.get(Tlb::key(a, 0)).is_none());
    }

    #[test]
    fn large_pages_are_used_when_the_small_pte_is_absent() {
        let mut c = core();
        pde(&mut c, 1, Some(SPT), Some(LPT), PtSize::Full);
        let va = mmu::PDE_COVERAGE + 3 * mmu::LARGE_PAGE_SIZE + 0x5678;
        put(
            &mut c,
            LPT + 3 * 8,
            Pte::new(0x80_0000, Target::Vram).encode(),
        );
        assert_eq!(c.translate(&vs(), va, false), Ok((0x80_5678, Target::Vram)));
    }

    #[test]
    fn fault_reasons() {
        let mut c = core();
        let r = |c: &mut Core, va, w| c.translate(&vs(), va, w).map_err(|f| f.reason);
        assert_eq!(r(&mut c, 0, false), Err(fault::REASON_PT_NOT_PRESENT));
        pde(&mut c, 0, Some(SPT), None, PtSize::Eighth);
        assert_eq!(r(&mut c, 16 << 20, false), Err(fault::REASON_PT_TOO_SHORT));
        assert_eq!(
            r(&mut c, 0x3000, false),
            Err(fault::REASON_PAGE_NOT_PRESENT)
        );
        let mut ro = Pte::new(0x40_0000, Target::Vram);
        ro.read_only = true;
        put(&mut c, SPT + 8, ro.encode());
        assert_eq!(r(&mut c, 0x1000, false), Ok((0x40_0000, Target::Vram)));
        assert_eq!(r(&mut c, 0x1000, true), Err(fault::REASON_PAGE_READ_ONLY));
        // A supervisor-only page: the host's BARs reach it, a channel faults with reason 5.
        let mut sup = Pte::new(0x40_0000, Target::Vram);
        sup.supervisor = true;
        put(&mut c, SPT + 8, sup.encode());
        c.tlb = Tlb::default();
        assert_eq!(r(&mut c, 0x1000, true), Ok((0x40_0000, Target::Vram)));
        let mut b = [0u8; 4];
        assert_eq!(
            c.read_va(&vs(), 0x1000, &mut b).map_err(|f| f.reason),
            Err(fault::REASON_PAGE_SYSTEM_ONLY)
        );
        assert_eq!(
            c.write_va(&vs(), 0x1000, &b).map_err(|f| f.reason),
            Err(fault::REASON_PAGE_SYSTEM_ONLY)
        );
        put(&mut c, SPT + 8, ro.encode());
        c.tlb = Tlb::default();
        put(
            &mut c,
            SPT + 16,
            Pte::new(0x40_0000, Target::Vram).encode() | 1 << 33,
        );
        assert_eq!(
            r(&mut c, 0x2000, false),
            Err(fault::REASON_INVALID_STORAGE_TYPE)
        );
        let limited = Vspace {
            pd: Some((PD, Target::Vram)),
            limit: 0xfff,
        };
        assert_eq!(
            c.translate(&limited, 0x1000, false).map_err(|f| f.reason),
            Err(fault::REASON_VM_LIMIT_EXCEEDED)
        );
        assert_eq!(
            r(&mut c, mmu::VA_LIMIT, false),
            Err(fault::REASON_VM_LIMIT_EXCEEDED)
        );
        let nopd = Vspace {
            pd: None,
            limit: u64::MAX,
        };
        assert_eq!(
            c.translate(&nopd, 0, false).map_err(|f| f.reason),
            Err(fault::REASON_PT_NOT_PRESENT)
        );
    }

    #[test]
    fn va_accesses_cross_pages_and_stop_at_the_first_fault() {
        let mut c = core();
        pde(&mut c, 0, Some(SPT), None, PtSize::Full);
        put(&mut c, SPT, Pte::new(0x40_0000, Target::Vram).encode());
        put(&mut c, SPT + 8, Pte::new(0x60_0000, Target::Vram).encode());
        assert_eq!(c.write_va(&vs(), 0xffe, &[1, 2, 3, 4]), Ok(()));
        let mut b = [0u8; 2];
        assert!(c.mem.read(Target::Vram, 0x60_0000, &mut b));
        assert_eq!(b, [3, 4]);
        let mut big = vec![0u8; 0x3000];
        let err = c.read_va(&vs(), 0, &mut big);
        assert_eq!(
            err,
            Err(VaFault {
                va: 0x2000,
                reason: fault::REASON_PAGE_NOT_PRESENT,
                write: false
            })
        );
        assert_eq!(&big[0xffe..0x1002], &[1, 2, 3, 4]);
    }

    /// Where the copy tests' virtual pages point.
    #[derive(Debug, Clone, Copy)]
    enum Page {
        Absent,
        /// VRAM data page `k` (`DATA + k * 4 KiB`), read-only or not.
        Vram(u64, bool),
        /// System page `k` (IOVA `SYS + k * 4 KiB`; the window holds 16 of them, beyond is a miss).
        Sys(u64, bool),
    }

    const DATA: u64 = 0x40_0000;
    const SYS: u64 = 0x1000_0000;
    const DATA_PAGES: u64 = 40;
    const SYS_PAGES: u64 = 16;

    /// A core whose VA pages 0.. point as `pages` says, with `written` of its VRAM data pages
    /// filled (the others never written: their chunks read through `pread`) and a DMA window of
    /// 16 pages, all filled from `seed`.
    fn copy_core(pages: &[Page], written: &[bool], seed: u8) -> Core {
        use gpuvm_phys::addr::{Gpa, Iova};
        use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
        let mut c = core();
        pde(&mut c, 0, Some(SPT), None, PtSize::Full);
        for (i, p) in pages.iter().enumerate() {
            let pte = match *p {
                Page::Absent => continue,
                Page::Vram(k, ro) => Pte {
                    read_only: ro,
                    ..Pte::new(DATA + k * 4096, Target::Vram)
                },
                Page::Sys(k, ro) => Pte {
                    read_only: ro,
                    ..Pte::new(SYS + k * 4096, Target::SysCoherent)
                },
            };
            put(&mut c, SPT + i as u64 * 8, pte.encode());
        }
        let fill = |k: u64| -> Vec<u8> {
            (0..4096u64)
                .map(|b| (b.wrapping_mul(31) ^ k.wrapping_mul(131) ^ u64::from(seed)) as u8)
                .collect()
        };
        for (k, &w) in written.iter().enumerate() {
            if w {
                assert!(c
                    .mem
                    .write(Target::Vram, DATA + k as u64 * 4096, &fill(k as u64)));
            }
        }
        let ram =
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0x10000), (SYS_PAGES * 4096) as usize)])
                .unwrap();
        for k in 0..SYS_PAGES {
            ram.write_slice(&fill(1000 + k), GuestAddress(0x10000 + k * 4096))
                .unwrap();
        }
        c.mem
            .dma
            .map(Iova(SYS), SYS_PAGES * 4096, ram, Gpa(0x10000))
            .unwrap();
        c.mem.take_traffic();
        c
    }

    /// Everything a copy can have changed or counted.
    fn observe(c: &mut Core) -> (Vec<u8>, Vec<u8>, u64, u64, u64, super::super::mem::Traffic) {
        let mut vram = vec![0; (DATA_PAGES * 4096) as usize];
        c.mem.read_raw(Target::Vram, DATA, &mut vram);
        let mut sys = vec![0; (SYS_PAGES * 4096) as usize];
        c.mem.read_raw(Target::SysCoherent, SYS, &mut sys);
        (
            vram,
            sys,
            c.stats.tlb_hits,
            c.stats.tlb_misses,
            c.mem.errors,
            c.mem.take_traffic(),
        )
    }

    fn page() -> impl proptest::strategy::Strategy<Value = Page> {
        use proptest::prelude::*;
        prop_oneof![
            1 => Just(Page::Absent),
            6 => (0..DATA_PAGES, proptest::bool::weighted(0.1)).prop_map(|(k, ro)| Page::Vram(k, ro)),
            3 => (0..SYS_PAGES + 2, proptest::bool::weighted(0.1)).prop_map(|(k, ro)| Page::Sys(k, ro)),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// `copy_va` (memory to memory where it can) has exactly the effect and the counts of the
        /// staged copy it replaces (`read_va` into a buffer, then `write_va`): pages in VRAM,
        /// system memory and nowhere, read-only ones, chunks never written, windows missed, and
        /// sources overlapping destinations (the same VRAM pages mapped twice).
        #[test]
        fn a_copy_in_place_does_what_the_staged_copy_does(
            pages in proptest::collection::vec(page(), 24),
            written in proptest::collection::vec(proptest::bool::weighted(0.7), DATA_PAGES as usize),
            src in 0u64..20 * 4096,
            dst in 0u64..20 * 4096,
            n in 1usize..4 * 4096,
            seed in 0u8..=255,
        ) {
            let mut a = copy_core(&pages, &written, seed);
            let mut b = copy_core(&pages, &written, seed);
            let mut scratch = CopyScratch { stage: vec![0xab; 3], ..CopyScratch::default() };
            let got = a.copy_va(&vs(), src, dst, n, &mut scratch);
            let mut buf = vec![0u8; n];
            let want = b
                .read_va(&vs(), src, &mut buf)
                .and_then(|()| b.write_va(&vs(), dst, &buf));
            proptest::prop_assert_eq!(got, want);
            proptest::prop_assert!(observe(&mut a) == observe(&mut b));
        }
    }

    #[test]
    fn a_copy_between_pages_reachable_in_place_leaves_the_staging_alone() {
        // VRAM to VRAM, VRAM to system memory and back, apart: no byte goes through the staging;
        // the same VRAM page as source and destination does.
        let pages = [
            Page::Vram(0, false),
            Page::Vram(1, false),
            Page::Sys(0, false),
            Page::Vram(0, false),
        ];
        let mut c = copy_core(&pages, &[true, true], 7);
        let mut scratch = CopyScratch::default();
        for (src, dst) in [(0, 0x1000), (0x10, 0x2000), (0x2000, 0x1000)] {
            let mut want = vec![0; 0x800];
            c.read_va(&vs(), src, &mut want).unwrap();
            c.copy_va(&vs(), src, dst, 0x800, &mut scratch).unwrap();
            let mut got = vec![0; 0x800];
            c.read_va(&vs(), dst, &mut got).unwrap();
            assert_eq!(got, want);
            assert!(
                scratch.stage.is_empty(),
                "{src:#x} -> {dst:#x} went through the staging"
            );
        }
        c.copy_va(&vs(), 0, 0x3000, 0x800, &mut scratch).unwrap();
        assert_eq!(
            scratch.stage.len(),
            0x800,
            "page 0 onto itself (VA 3 maps it too): staged"
        );
    }
}
