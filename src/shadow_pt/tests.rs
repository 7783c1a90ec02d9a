//! Unit tests of the shadow page tables: translation rules, structure, modes, PV ops, tracking
//! and freeing. The cross-mode equivalence property test is `tests/shadow_modes.rs`.

use gf100::mmu::{self, Pde, PtRef, PtSize, Pte};
use gf100::pv::{self, Op};
use gf100::Target;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::*;
use crate::addr::{HostVram, Iova};
use crate::guest_mem::{GuestRam, VramSlice};
use gpuvm_sim::{SimConfig, SimGpu};

const VRAM: u64 = 64 << 20;
const BASE: u64 = 16 << 20;
const SLICE: u64 = 16 << 20;
const HYP_BASE: u64 = 40 << 20;
const HYP_SIZE: u64 = 24 << 20;
const IOVA: u64 = 1 << 32;
/// Guest RAM: [0, 4 MiB) and [8 MiB, 12 MiB).
const RAM: [(u64, u64); 2] = [(0, 4 << 20), (8 << 20, 4 << 20)];

const PD: u64 = 0;
const SPT: u64 = 0x10_0000;
const LPT: u64 = 0x14_0000;
const SPT2: u64 = 0x18_0000;

const V: Target = Target::Vram;
const S: Target = Target::SysCoherent;
const N: Target = Target::SysNonCoherent;

struct Rig {
    gpu: SimGpu,
    ram: GuestRam,
    hyp: HypVram,
    with_ram: bool,
}

impl Rig {
    fn new() -> Rig {
        let ranges: Vec<_> = RAM
            .iter()
            .map(|&(a, l)| (GuestAddress(a), l as usize))
            .collect();
        Rig {
            gpu: SimGpu::new(SimConfig {
                vram_size: VRAM,
                ..SimConfig::default()
            }),
            ram: GuestRam {
                mem: GuestMemoryMmap::<()>::from_ranges(&ranges).unwrap(),
                iova_base: Iova(IOVA),
            },
            hyp: HypVram::immediate(HYP_BASE, HYP_SIZE),
            with_ram: true,
        }
    }

    fn cx(&mut self) -> ShadowCtx<'_> {
        ShadowCtx {
            mem: GuestMem {
                phys: &self.gpu,
                slice: VramSlice {
                    base: HostVram(BASE),
                    size: SLICE,
                },
                ram: self.with_ram.then_some(&self.ram),
                log: None,
            },
            hyp: &mut self.hyp,
        }
    }
}

fn pdb(addr: u64, target: Target) -> GuestPdb {
    GuestPdb { addr, target }
}

fn put(cx: &ShadowCtx, target: Target, addr: u64, v: u64) {
    cx.mem.write(target, addr, &v.to_le_bytes()).unwrap();
}

fn pde(small: Option<(u64, Target)>, large: Option<(u64, Target)>, size: PtSize) -> u64 {
    let r = |(addr, target)| PtRef {
        addr,
        target,
        vol: target.is_sysram(),
    };
    Pde {
        small: small.map(r),
        large: large.map(r),
        size,
    }
    .encode()
}

fn pte(addr: u64, target: Target) -> u64 {
    Pte::new(addr, target).encode()
}

fn tr(target: Target, addr: u64) -> Option<ShadowTranslation> {
    Some(ShadowTranslation {
        target,
        addr,
        read_only: false,
        supervisor: false,
    })
}

/// VA of small page `i` under PDE `p`.
fn sva(p: u64, i: u64) -> u64 {
    p * mmu::PDE_COVERAGE + i * mmu::SMALL_PAGE_SIZE
}

/// VA of large page `i` under PDE `p`.
fn lva(p: u64, i: u64) -> u64 {
    p * mmu::PDE_COVERAGE + i * mmu::LARGE_PAGE_SIZE
}

fn vram_u64(cx: &ShadowCtx, addr: u64) -> u64 {
    let mut b = [0u8; 8];
    cx.mem.phys.read_vram(HostVram(addr), &mut b);
    u64::from_le_bytes(b)
}

/// The raw shadow PTE for small page `i` of PDE `p`.
fn shadow_spte(sp: &ShadowPt, cx: &ShadowCtx, space: GuestPdb, p: u64, i: u64) -> u64 {
    let pd = sp.shadow_pd(space).unwrap().raw();
    let d = Pde::decode(vram_u64(cx, pd + p * 8));
    vram_u64(cx, d.small.unwrap().addr + i * 8)
}

#[test]
fn small_and_large_pages_with_both_tables_on_one_pde() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    put(
        &cx,
        V,
        PD + 8,
        pde(Some((SPT, V)), Some((LPT, V)), PtSize::Full),
    );
    put(&cx, V, SPT + 5 * 8, pte(0x20_0000, V));
    put(&cx, V, SPT, pte(0x30_0000, V));
    put(&cx, V, LPT, pte(0x40_0000, V));
    put(&cx, V, LPT + 3 * 8, pte(0x60_0000, V));
    let mut sp = ShadowPt::new(ShadowMode::Eager);
    let pd = sp.attach(&mut cx, space).unwrap();
    assert_eq!(pd.raw() % 0x1000, 0);
    assert!(pd.raw() >= HYP_BASE && pd.raw() < HYP_BASE + HYP_SIZE);
    assert_eq!(
        sp.translate(&cx, space, sva(1, 5) + 0x123),
        tr(V, BASE + 0x20_0123)
    );
    // Small first: entry 0 of both tables is mapped; the SPT wins.
    assert_eq!(
        sp.translate(&cx, space, sva(1, 0) + 8),
        tr(V, BASE + 0x30_0008)
    );
    // Where the SPT is empty the LPT answers, with the offset inside the 128 KiB page.
    assert_eq!(
        sp.translate(&cx, space, lva(1, 3) + 0x1_5678),
        tr(V, BASE + 0x61_5678)
    );
    assert_eq!(sp.translate(&cx, space, lva(1, 4)), None);
    assert_eq!(sp.translate(&cx, space, sva(0, 5)), None, "PDE 0 is empty");
    assert_eq!(sp.translate(&cx, space, mmu::VA_LIMIT + sva(1, 5)), None);
    let st = sp.stats();
    assert_eq!(st.rebuilds, 1);
    assert_eq!(st.ptes_shadowed, mmu::SPT_ENTRIES + mmu::LPT_ENTRIES);
    assert_eq!(
        st.shadow_bytes,
        mmu::PD_SIZE + mmu::SPT_SIZE + mmu::LPT_SIZE
    );
    assert_eq!(st.violations, 0);
    // The shadow PDE points at VRAM tables, with the guest's PT_SIZE.
    let d = Pde::decode(vram_u64(&cx, pd.raw() + 8));
    assert_eq!(d.small.unwrap().target, V);
    assert_eq!(d.large.unwrap().target, V);
    assert!(!d.small.unwrap().vol);
    sp.destroy(&mut cx);
}

#[test]
fn pt_size_quarter_hides_entries_beyond_coverage() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    put(
        &cx,
        V,
        PD,
        pde(Some((SPT, V)), Some((LPT, V)), PtSize::Quarter),
    );
    put(&cx, V, LPT + 100 * 8, pte(0x80_0000, V));
    put(&cx, V, LPT + 300 * 8, pte(0x80_0000, V)); // a quarter: 256 entries valid
    let mut sp = ShadowPt::new(ShadowMode::Lazy);
    sp.attach(&mut cx, space).unwrap();
    assert_eq!(
        sp.translate(&cx, space, lva(0, 100)),
        tr(V, BASE + 0x80_0000)
    );
    assert_eq!(sp.translate(&cx, space, lva(0, 300)), None);
    assert_eq!(sp.stats().ptes_shadowed, 8192 + 256);
    sp.destroy(&mut cx);
}

#[test]
fn the_simulated_mmu_walks_the_shadow() {
    // Bind the shadow directory as the BAR1 VM of the simulated GF100 and read guest data
    // through the aperture: the hardware walk (not our resolver) follows the shadow tables.
    use gf100::{inst, pbus, pci::Bar, pmc};
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    put(
        &cx,
        V,
        PD,
        pde(Some((SPT, V)), Some((LPT, V)), PtSize::Full),
    );
    put(&cx, V, SPT + 8, pte(0x50_0000, V));
    put(&cx, V, SPT + 16, pte(0x2000, S));
    put(&cx, V, LPT + 2 * 8, pte(0x60_0000, V));
    put(&cx, V, 0x50_0010, 0x1111_2222_3333_4444);
    put(&cx, V, 0x61_2340, 0x5555_6666_7777_8888);
    let mut sp = ShadowPt::new(ShadowMode::Incremental);
    let pd = sp.attach(&mut cx, space).unwrap();
    let g = cx.mem.phys;
    let inst_addr = 0x10_0000; // physical VRAM below the slice, ours
    g.write_vram(
        HostVram(inst_addr + inst::PDB_LO),
        &inst::pdb_encode(pd.raw(), V).to_le_bytes(),
    );
    g.write_vram(
        HostVram(inst_addr + inst::LIMIT_LO),
        &(Bar::Bar1.size() - 1).to_le_bytes(),
    );
    g.write_reg(pmc::ENABLE, pmc::ENABLE_ALL);
    g.write_reg(pbus::BAR1_INST, pbus::bar_inst_encode(inst_addr, V));
    let read = |va: u64| {
        let mut b = [0u8; 8];
        g.read_aperture(Bar::Bar1, va, &mut b);
        u64::from_le_bytes(b)
    };
    assert_eq!(read(sva(0, 1) + 0x10), 0x1111_2222_3333_4444);
    assert_eq!(read(lva(0, 2) + 0x1_2340), 0x5555_6666_7777_8888);
    let faults = g.stats().mmu_faults;
    assert_eq!(read(sva(0, 3)), u64::MAX, "unmapped: faults");
    assert_eq!(g.stats().mmu_faults, faults + 1);
    assert_eq!(
        sp.translate(&cx, space, sva(0, 2)),
        tr(S, IOVA + 0x2000),
        "an IOVA (no DMA window registered here, so not read through BAR1)"
    );
    sp.destroy(&mut cx);
}

#[test]
fn pt_size_limits_coverage_and_shadow_size() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    put(
        &cx,
        V,
        PD + 2 * 8,
        pde(Some((SPT, V)), Some((LPT, V)), PtSize::Eighth),
    );
    put(&cx, V, SPT + 4095 * 8, pte(0x1000, V));
    put(&cx, V, SPT + 4096 * 8, pte(0x2000, V));
    put(&cx, V, LPT + 127 * 8, pte(0x20_0000, V));
    put(&cx, V, LPT + 128 * 8, pte(0x40_0000, V));
    let mut sp = ShadowPt::new(ShadowMode::Eager);
    let pd = sp.attach(&mut cx, space).unwrap();
    assert_eq!(sp.translate(&cx, space, sva(2, 4095)), tr(V, BASE + 0x1000));
    assert_eq!(sp.translate(&cx, space, sva(2, 4096)), None);
    assert_eq!(
        sp.translate(&cx, space, lva(2, 127) + 0x1000),
        tr(V, BASE + 0x20_1000),
        "SPT entry 4065 is empty: the LPT answers"
    );
    assert_eq!(sp.translate(&cx, space, lva(2, 128)), None);
    let d = Pde::decode(vram_u64(&cx, pd.raw() + 2 * 8));
    assert_eq!(d.size, PtSize::Eighth);
    // 4096 small entries = 32 KiB; 128 large entries = 1 KiB, rounded up to 4 KiB.
    assert_eq!(sp.stats().shadow_bytes, mmu::PD_SIZE + 0x8000 + 0x1000);
    assert_eq!(sp.stats().ptes_shadowed, 4096 + 128);
    sp.destroy(&mut cx);
}

#[test]
fn large_page_at_the_end_of_coverage_resolves_through_the_lpt() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    put(
        &cx,
        V,
        PD + 2 * 8,
        pde(None, Some((LPT, V)), PtSize::Eighth),
    );
    put(&cx, V, LPT + 127 * 8, pte(0x20_0000, V));
    let mut sp = ShadowPt::new(ShadowMode::Eager);
    sp.attach(&mut cx, space).unwrap();
    assert_eq!(
        sp.translate(&cx, space, lva(2, 127) + 0x1_f00f),
        tr(V, BASE + 0x21_f00f)
    );
    sp.destroy(&mut cx);
}

#[test]
fn tables_and_pages_in_guest_ram() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(0x1_0000, S);
    put(
        &cx,
        S,
        0x1_0000 + 3 * 8,
        pde(Some((0x10_0000, N)), Some((0x20_0000, S)), PtSize::Full),
    );
    put(&cx, N, 0x10_0000 + 7 * 8, pte(0x3000, N));
    put(&cx, N, 0x10_0000 + 8 * 8, pte(0x5000, V));
    put(&cx, S, 0x20_0000 + 8, pte(0x90_0000, S)); // in RAM region 2
    let mut sp = ShadowPt::new(ShadowMode::Incremental);
    sp.attach(&mut cx, space).unwrap();
    assert_eq!(
        sp.translate(&cx, space, sva(3, 7) + 4),
        tr(N, IOVA + 0x3004)
    );
    assert_eq!(sp.translate(&cx, space, sva(3, 8)), tr(V, BASE + 0x5000));
    assert_eq!(
        sp.translate(&cx, space, lva(3, 1) + 0x10),
        tr(S, IOVA + 0x90_0010)
    );
    assert!(sp.is_tracked(S, 0x1_0000));
    assert!(
        sp.is_tracked(N, 0x1_f000),
        "either sysram target names the same GPA"
    );
    assert!(!sp.is_tracked(V, 0x1_0000), "not in VRAM");
    assert!(sp.is_tracked(S, 0x13_f000));
    assert!(sp.is_tracked(S, 0x20_1000));
    assert!(!sp.is_tracked(S, 0x20_2000), "an LPT is 8 KiB");
    // A write in RAM, reported by the VMM, is shadowed at once.
    put(&cx, N, 0x10_0000 + 7 * 8, pte(0x4000, N));
    sp.guest_wrote(&mut cx, S, 0x10_0000 + 7 * 8, 8);
    assert_eq!(sp.translate(&cx, space, sva(3, 7)), tr(N, IOVA + 0x4000));
    sp.destroy(&mut cx);
}

#[test]
fn every_violation_kind_is_counted_and_dropped() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    put(
        &cx,
        V,
        PD,
        pde(Some((SPT, V)), Some((LPT, V)), PtSize::Full),
    );
    // PDE 1: small table outside the slice, large table straddling the end of RAM region 1.
    put(
        &cx,
        V,
        PD + 8,
        pde(
            Some((SLICE, V)),
            Some(((4 << 20) - 0x1000, S)),
            PtSize::Full,
        ),
    );
    // PDE 2: a small table in the RAM hole.
    put(&cx, V, PD + 16, pde(Some((6 << 20, S)), None, PtSize::Full));
    put(&cx, V, SPT, pte(SLICE, V)); // out of slice
    put(&cx, V, SPT + 8, pte(SLICE - 0x1000, V)); // last page: fine
    put(&cx, V, SPT + 16, pte(5 << 20, S)); // RAM hole
    put(&cx, V, SPT + 24, pte(0x1000, V) | 1 << 33); // invalid target 1
    put(&cx, V, SPT + 32, pte(0x3000, N)); // fine
    put(&cx, V, SPT + 40, pte((4 << 20) - 0x1000, S)); // fine (4 KiB page)
    put(&cx, V, LPT, pte(SLICE - 0x1000, V)); // large page straddles the slice end
    put(&cx, V, LPT + 8, pte((4 << 20) - 0x1000, S)); // large page straddles RAM region end
    put(&cx, V, LPT + 16, pte(SLICE - 0x2_0000, V)); // last large page: fine
    let mut sp = ShadowPt::new(ShadowMode::Eager);
    sp.attach(&mut cx, space).unwrap();
    // 3 PTEs in the SPT, 2 in the LPT, 3 tables.
    assert_eq!(sp.stats().violations, 3 + 2 + 3);
    assert_eq!(sp.translate(&cx, space, sva(0, 0)), None);
    assert_eq!(
        sp.translate(&cx, space, sva(0, 1)),
        tr(V, BASE + SLICE - 0x1000)
    );
    assert_eq!(sp.translate(&cx, space, sva(0, 2)), None);
    assert_eq!(sp.translate(&cx, space, sva(0, 3)), None);
    assert_eq!(sp.translate(&cx, space, sva(0, 4)), tr(N, IOVA + 0x3000));
    assert_eq!(
        sp.translate(&cx, space, sva(0, 5)),
        tr(S, IOVA + (4 << 20) - 0x1000)
    );
    assert_eq!(sp.translate(&cx, space, lva(0, 0) + 0x1_0000), None);
    assert_eq!(sp.translate(&cx, space, lva(0, 1) + 0x1_0000), None);
    assert_eq!(
        sp.translate(&cx, space, lva(0, 2) + 0x1_0000),
        tr(V, BASE + SLICE - 0x1_0000)
    );
    assert_eq!(sp.translate(&cx, space, sva(1, 0)), None);
    assert_eq!(sp.translate(&cx, space, sva(2, 0)), None);
    // PDEs 1 and 2 have no shadow tables at all.
    let pd = sp.shadow_pd(space).unwrap().raw();
    assert_eq!(vram_u64(&cx, pd + 8), 0);
    assert_eq!(vram_u64(&cx, pd + 16), 0);
    // Eager recounts at every rebuild (done in budgeted steps: PDEs 0 and 1 in the flush's,
    // PDE 2 in the next).
    sp.tlb_flush(&mut cx, Some(space));
    while sp.rebuilding() {
        sp.step(&mut cx);
    }
    assert_eq!(sp.stats().violations, 16);
    sp.destroy(&mut cx);
}

#[test]
fn system_memory_without_guest_ram_is_a_violation() {
    let mut rig = Rig::new();
    rig.with_ram = false;
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    put(
        &cx,
        V,
        PD,
        pde(Some((SPT, V)), Some((0x1000, S)), PtSize::Full),
    );
    put(&cx, V, SPT, pte(0x1000, S));
    put(&cx, V, SPT + 8, pte(0x1000, V));
    let mut sp = ShadowPt::new(ShadowMode::Lazy);
    sp.attach(&mut cx, space).unwrap();
    assert_eq!(sp.stats().violations, 2, "the PTE and the LPT in RAM");
    assert_eq!(sp.translate(&cx, space, sva(0, 0)), None);
    assert_eq!(sp.translate(&cx, space, sva(0, 1)), tr(V, BASE + 0x1000));
    assert_eq!(
        sp.attach(&mut cx, pdb(0, S)),
        Err(ShadowError::BadPageDirectory(pdb(0, S)))
    );
    sp.destroy(&mut cx);
}

#[test]
fn flags_are_kept_and_comptags_cleared() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    put(&cx, V, PD, pde(Some((SPT, V)), None, PtSize::Full));
    let guest = Pte {
        supervisor: true,
        read_only: true,
        kind: 0xdb,
        comptag: 0x1_2345,
        vol: true,
        ..Pte::new(0x7000, V)
    };
    put(&cx, V, SPT + 9 * 8, guest.encode() | 1 << 35);
    let mut sp = ShadowPt::new(ShadowMode::Eager);
    sp.attach(&mut cx, space).unwrap();
    let raw = shadow_spte(&sp, &cx, space, 0, 9);
    assert_eq!(
        Pte::decode(raw).unwrap().unwrap(),
        Pte {
            addr: BASE + 0x7000,
            comptag: 0,
            ..guest
        }
    );
    assert_eq!(raw >> 44, 0, "no tag bits survive");
    assert_eq!(
        sp.translate(&cx, space, sva(0, 9)),
        Some(ShadowTranslation {
            target: V,
            addr: BASE + 0x7000,
            read_only: true,
            supervisor: guest.supervisor,
        })
    );
    sp.destroy(&mut cx);
}

#[test]
fn attach_is_reference_counted_and_detach_frees() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    put(&cx, V, PD, pde(Some((SPT, V)), None, PtSize::Full));
    put(&cx, V, SPT, pte(0x1000, V));
    let mut sp = ShadowPt::new(ShadowMode::Incremental);
    let a = sp.attach(&mut cx, space).unwrap();
    let b = sp.attach(&mut cx, space).unwrap();
    assert_eq!(a, b);
    assert_eq!(sp.stats().rebuilds, 1, "built once");
    sp.detach(&mut cx, space);
    assert_eq!(sp.translate(&cx, space, sva(0, 0)), tr(V, BASE + 0x1000));
    assert!(sp.stats().tracked_pages > 0);
    sp.detach(&mut cx, space);
    assert_eq!(sp.translate(&cx, space, sva(0, 0)), None);
    assert_eq!(sp.stats().shadow_bytes, 0);
    assert_eq!(sp.stats().tracked_pages, 0);
    assert_eq!(cx.hyp.used(), 0);
    sp.detach(&mut cx, space); // harmless
    assert_eq!(sp.shadow_pd(space), None);
}

#[test]
fn attach_refuses_bad_directories_and_reports_exhaustion() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let mut sp = ShadowPt::new(ShadowMode::Eager);
    for bad in [
        pdb(0x800, V),
        pdb(SLICE - 0x1000, V),
        pdb(!0xfff, V),
        pdb((4 << 20) - 0x8000, S),
    ] {
        assert_eq!(
            sp.attach(&mut cx, bad),
            Err(ShadowError::BadPageDirectory(bad))
        );
    }
    sp.set_shadow_limit(0x8000);
    assert_eq!(sp.shadow_limit(), 0x8000);
    assert_eq!(
        sp.attach(&mut cx, pdb(PD, V)),
        Err(ShadowError::OutOfMemory)
    );
    assert_eq!(sp.stats().alloc_failures, 1);
    assert_eq!(cx.hyp.used(), 0);
}

#[test]
fn tables_beyond_the_limit_stay_absent() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    // Every PDE points at the same SPT: without a limit that would be 2 GiB of shadows.
    let mut dir = Vec::new();
    for _ in 0..mmu::PD_ENTRIES {
        dir.extend_from_slice(&pde(Some((SPT, V)), None, PtSize::Full).to_le_bytes());
    }
    cx.mem.write(V, PD, &dir).unwrap();
    put(&cx, V, SPT, pte(0x1000, V));
    let mut sp = ShadowPt::new(ShadowMode::Incremental);
    sp.set_shadow_limit(mmu::PD_SIZE + 3 * mmu::SPT_SIZE);
    sp.attach(&mut cx, space).unwrap();
    let st = sp.stats();
    assert_eq!(st.shadow_bytes, mmu::PD_SIZE + 3 * mmu::SPT_SIZE);
    // Every PDE but the hypervisor's (`hyp::HYP_PDE`, never shadowed) wants a table.
    assert_eq!(st.alloc_failures, mmu::PD_ENTRIES - 1 - 3);
    assert_eq!(st.hyp_pde_refused, 1);
    assert_eq!(sp.translate(&cx, space, sva(2, 0)), tr(V, BASE + 0x1000));
    assert_eq!(sp.translate(&cx, space, sva(3, 0)), None);
    sp.destroy(&mut cx);
    assert_eq!(cx.hyp.used(), 0);
}

#[test]
fn eager_rebuilds_on_flush() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    put(&cx, V, PD, pde(Some((SPT, V)), None, PtSize::Full));
    let mut sp = ShadowPt::new(ShadowMode::Eager);
    let pd = sp.attach(&mut cx, space).unwrap();
    put(&cx, V, SPT, pte(0x1000, V));
    sp.guest_wrote(&mut cx, V, SPT, 8);
    assert_eq!(sp.translate(&cx, space, 0), None, "not before the flush");
    assert!(!sp.is_tracked(V, SPT), "eager mode tracks nothing");
    assert_eq!(sp.tlb_flush(&mut cx, Some(space)), vec![pd]);
    assert_eq!(sp.translate(&cx, space, 0), tr(V, BASE + 0x1000));
    assert!(sp.before_submit(&mut cx, space).is_empty());
    assert_eq!(sp.stats().rebuilds, 2);
    // A flush naming another directory rebuilds nothing; None rebuilds all.
    assert!(sp.tlb_flush(&mut cx, Some(pdb(0x1_0000, V))).is_empty());
    assert_eq!(sp.tlb_flush(&mut cx, None), vec![pd]);
    assert_eq!(sp.stats().rebuilds, 3);
    // Unmapping the table frees its shadow on the next rebuild.
    put(&cx, V, PD, 0);
    sp.tlb_flush(&mut cx, None);
    assert_eq!(sp.stats().shadow_bytes, mmu::PD_SIZE);
    assert_eq!(sp.translate(&cx, space, 0), None);
    sp.destroy(&mut cx);
    assert_eq!(cx.hyp.used(), 0);
}

#[test]
fn lazy_rebuilds_before_the_next_submission() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    put(&cx, V, PD, pde(Some((SPT, V)), None, PtSize::Full));
    let mut sp = ShadowPt::new(ShadowMode::Lazy);
    let pd = sp.attach(&mut cx, space).unwrap();
    assert!(sp.before_submit(&mut cx, space).is_empty(), "clean");
    put(&cx, V, SPT, pte(0x1000, V));
    assert!(sp.tlb_flush(&mut cx, Some(space)).is_empty());
    assert_eq!(sp.translate(&cx, space, 0), None, "still the old shadow");
    assert_eq!(sp.before_submit(&mut cx, space), vec![pd]);
    assert_eq!(sp.translate(&cx, space, 0), tr(V, BASE + 0x1000));
    assert!(sp.before_submit(&mut cx, space).is_empty(), "clean again");
    assert_eq!(sp.stats().rebuilds, 2);
    // A flush through the other sysram target name does not match a VRAM directory.
    sp.tlb_flush(&mut cx, Some(pdb(PD, S)));
    assert!(sp.before_submit(&mut cx, space).is_empty());
    sp.destroy(&mut cx);
}

#[test]
fn incremental_updates_exactly_the_written_entries() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    put(&cx, V, PD, pde(Some((SPT, V)), None, PtSize::Full));
    let mut sp = ShadowPt::new(ShadowMode::Incremental);
    let pd = sp.attach(&mut cx, space).unwrap();
    let base = sp.stats();
    put(&cx, V, SPT + 8, pte(0x2000, V));
    sp.guest_wrote(&mut cx, V, SPT + 8, 8);
    assert_eq!(sp.translate(&cx, space, sva(0, 1)), tr(V, BASE + 0x2000));
    let st = sp.stats();
    assert_eq!(st.entry_updates, base.entry_updates + 1);
    assert_eq!(st.ptes_shadowed, base.ptes_shadowed, "no table walk");
    assert_eq!(st.rebuilds, base.rebuilds);
    // A 4-byte write of the high word re-reads the whole entry.
    let ro = Pte {
        read_only: true,
        ..Pte::new(0x2000, V)
    }
    .encode();
    put(&cx, V, SPT + 8, ro);
    sp.guest_wrote(&mut cx, V, SPT + 8, 4);
    assert!(sp.translate(&cx, space, sva(0, 1)).unwrap().read_only);
    // Many entries in one write.
    let mut block = Vec::new();
    for i in 0..16u64 {
        block.extend_from_slice(&pte(0x10_0000 + i * 0x1000, V).to_le_bytes());
    }
    cx.mem.write(V, SPT + 100 * 8, &block).unwrap();
    sp.guest_wrote(&mut cx, V, SPT + 100 * 8, block.len() as u64);
    for i in 0..16 {
        assert_eq!(
            sp.translate(&cx, space, sva(0, 100 + i)),
            tr(V, BASE + 0x10_0000 + i * 0x1000)
        );
    }
    assert_eq!(sp.stats().entry_updates, base.entry_updates + 2 + 16);
    // A write to untracked memory does nothing; a huge length is harmless.
    sp.guest_wrote(&mut cx, V, 0x80_0000, 8);
    sp.guest_wrote(&mut cx, V, 0, u64::MAX);
    assert_eq!(
        sp.translate(&cx, space, sva(0, 1)).map(|t| t.addr),
        Some(BASE + 0x2000)
    );
    // The flush only asks for a physical flush.
    assert_eq!(sp.tlb_flush(&mut cx, None), vec![pd]);
    assert_eq!(sp.stats().rebuilds, base.rebuilds);
    sp.destroy(&mut cx);
}

#[test]
fn tracked_pages_follow_pde_changes() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    let mut sp = ShadowPt::new(ShadowMode::Incremental);
    sp.attach(&mut cx, space).unwrap();
    let pd_pages = mmu::PD_SIZE / 0x1000;
    assert_eq!(sp.stats().tracked_pages, pd_pages);
    assert!(sp.is_tracked(V, PD + 0xf000));
    assert!(!sp.is_tracked(V, SPT));
    put(&cx, V, SPT + 8, pte(0x5000, V));
    // Link an SPT and an LPT at PDE 4.
    put(
        &cx,
        V,
        PD + 4 * 8,
        pde(Some((SPT, V)), Some((LPT, V)), PtSize::Full),
    );
    sp.guest_wrote(&mut cx, V, PD + 4 * 8, 8);
    assert_eq!(sp.stats().tracked_pages, pd_pages + 64 + 2);
    assert!(sp.is_tracked(V, SPT + 0x3f000));
    assert!(sp.is_tracked(V, LPT + 0x1000));
    assert_eq!(
        sp.translate(&cx, space, sva(4, 1)),
        tr(V, BASE + 0x5000),
        "table walked"
    );
    // Shrink PT_SIZE: fewer pages of the tables are in use.
    put(
        &cx,
        V,
        PD + 4 * 8,
        pde(Some((SPT, V)), Some((LPT, V)), PtSize::Eighth),
    );
    sp.guest_wrote(&mut cx, V, PD + 4 * 8, 8);
    assert_eq!(sp.stats().tracked_pages, pd_pages + 8 + 1);
    assert!(!sp.is_tracked(V, SPT + 0x8000));
    // Move the small table elsewhere: old pages untracked, new tracked.
    put(
        &cx,
        V,
        PD + 4 * 8,
        pde(Some((SPT2, V)), Some((LPT, V)), PtSize::Eighth),
    );
    sp.guest_wrote(&mut cx, V, PD + 4 * 8 + 4, 4);
    assert!(!sp.is_tracked(V, SPT));
    assert!(sp.is_tracked(V, SPT2));
    assert_eq!(sp.translate(&cx, space, sva(4, 1)), None);
    // Remove both tables.
    put(&cx, V, PD + 4 * 8, 0);
    sp.guest_wrote(&mut cx, V, PD + 4 * 8, 8);
    assert_eq!(sp.stats().tracked_pages, pd_pages);
    assert_eq!(sp.stats().shadow_bytes, mmu::PD_SIZE);
    // Two PDEs sharing one table: one write updates both shadows.
    put(&cx, V, PD + 5 * 8, pde(Some((SPT, V)), None, PtSize::Full));
    put(&cx, V, PD + 6 * 8, pde(Some((SPT, V)), None, PtSize::Full));
    sp.guest_wrote(&mut cx, V, PD + 5 * 8, 16);
    assert_eq!(sp.stats().tracked_pages, pd_pages + 64);
    put(&cx, V, SPT + 2 * 8, pte(0x9000, V));
    sp.guest_wrote(&mut cx, V, SPT + 2 * 8, 8);
    assert_eq!(sp.translate(&cx, space, sva(5, 2)), tr(V, BASE + 0x9000));
    assert_eq!(sp.translate(&cx, space, sva(6, 2)), tr(V, BASE + 0x9000));
    sp.destroy(&mut cx);
    assert_eq!(sp.stats().tracked_pages, 0);
    assert_eq!(sp.stats().shadow_bytes, 0);
    assert_eq!(cx.hyp.used(), 0);
}

#[test]
fn a_table_on_the_directory_page_is_handled_in_one_write() {
    // The LPT sits inside the directory's own pages: one write changes a PDE and the table.
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    let mut sp = ShadowPt::new(ShadowMode::Incremental);
    sp.attach(&mut cx, space).unwrap();
    let lpt = PD + 0x8000; // PDEs 4096.. are unused here
    let mut w = Vec::new();
    w.extend_from_slice(&pte(0x40_0000, V).to_le_bytes()); // LPT entry 0 == PDE 4096
    cx.mem.write(V, lpt, &w).unwrap();
    put(&cx, V, PD, pde(None, Some((lpt, V)), PtSize::Full));
    sp.guest_wrote(&mut cx, V, PD, 0x8008);
    assert_eq!(sp.translate(&cx, space, lva(0, 0)), tr(V, BASE + 0x40_0000));
    // PDE 4096 now holds a PTE value, whose "tables" are garbage: shadowed like any PDE.
    assert_eq!(sp.stats().violations, 0);
    sp.destroy(&mut cx);
    assert_eq!(cx.hyp.used(), 0);
}

#[test]
fn pv_ops_write_guest_tables_and_shadows() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    let mut sp = ShadowPt::new(ShadowMode::Pv);
    let pd = sp.attach(&mut cx, space).unwrap();
    let op = |op, target: Target, table, index, value| Op {
        op,
        target: target.bits(),
        table,
        index,
        value,
    };
    let ops = [
        op(
            pv::OP_WRITE_PDE,
            V,
            PD,
            7,
            pde(Some((SPT, V)), None, PtSize::Full),
        ),
        op(pv::OP_WRITE_PTE, V, SPT, 3, pte(0x6000, V)),
        op(pv::OP_WRITE_PTE, V, SPT, 4, pte(SLICE, V)),
        op(pv::OP_FLUSH, V, PD, 0, 0),
    ];
    let out = sp.pv_apply(&mut cx, &ops);
    assert_eq!(
        out,
        PvOutcome {
            applied: 4,
            error: 0,
            flush: vec![pd]
        }
    );
    assert_eq!(sp.translate(&cx, space, sva(7, 3)), tr(V, BASE + 0x6000));
    assert_eq!(sp.translate(&cx, space, sva(7, 4)), None);
    assert_eq!(sp.stats().violations, 1);
    assert_eq!(
        cx.mem.read_u64(V, SPT + 3 * 8).unwrap(),
        pte(0x6000, V),
        "guest table written"
    );
    assert!(sp.is_tracked(V, SPT));
    // Direct writes by a PV guest stay coherent.
    put(&cx, V, SPT + 3 * 8, 0);
    sp.guest_wrote(&mut cx, V, SPT + 3 * 8, 8);
    assert_eq!(sp.translate(&cx, space, sva(7, 3)), None);
    // Errors: the batch stops at the first bad op.
    let cases = [
        (op(9, V, PD, 0, 0), pv::ERR_BAD_OP),
        (op(pv::OP_WRITE_PTE, V, SPT2, 0, 0), pv::ERR_BAD_TABLE),
        (op(pv::OP_WRITE_PTE, V, SLICE, 0, 0), pv::ERR_BAD_TABLE),
        (op(pv::OP_WRITE_PTE, V, SPT + 8, 0, 0), pv::ERR_BAD_TABLE),
        (op(pv::OP_WRITE_PTE, S, SPT, 0, 0), pv::ERR_BAD_TABLE),
        (
            Op {
                target: 1,
                ..op(pv::OP_WRITE_PTE, V, SPT, 0, 0)
            },
            pv::ERR_BAD_TABLE,
        ),
        (
            Op {
                target: 4,
                ..op(pv::OP_WRITE_PTE, V, SPT, 0, 0)
            },
            pv::ERR_BAD_TABLE,
        ),
        (op(pv::OP_WRITE_PDE, V, SPT, 0, 0), pv::ERR_BAD_TABLE),
        (op(pv::OP_WRITE_PTE, V, PD, 0, 0), pv::ERR_BAD_TABLE),
        (op(pv::OP_FLUSH, V, SPT, 0, 0), pv::ERR_BAD_TABLE),
        (
            op(pv::OP_WRITE_PTE, V, SPT, mmu::SPT_ENTRIES, 0),
            pv::ERR_BAD_INDEX,
        ),
        (op(pv::OP_WRITE_PTE, V, SPT, u64::MAX, 0), pv::ERR_BAD_INDEX),
        (
            op(pv::OP_WRITE_PDE, V, PD, mmu::PD_ENTRIES, 0),
            pv::ERR_BAD_INDEX,
        ),
    ];
    for (bad, err) in cases {
        let ops = [
            op(pv::OP_WRITE_PTE, V, SPT, 5, pte(0x7000, V)),
            bad,
            op(pv::OP_WRITE_PTE, V, SPT, 6, pte(0x8000, V)),
        ];
        put(&cx, V, SPT + 6 * 8, 0);
        sp.guest_wrote(&mut cx, V, SPT + 6 * 8, 8);
        let out = sp.pv_apply(&mut cx, &ops);
        assert_eq!((out.applied, out.error), (1, err), "{bad:?}");
        assert!(out.flush.is_empty());
        assert_eq!(sp.translate(&cx, space, sva(7, 5)), tr(V, BASE + 0x7000));
        assert_eq!(
            sp.translate(&cx, space, sva(7, 6)),
            None,
            "not applied after the error"
        );
    }
    // PT_SIZE bounds the index.
    let out = sp.pv_apply(
        &mut cx,
        &[
            op(
                pv::OP_WRITE_PDE,
                V,
                PD,
                7,
                pde(Some((SPT, V)), None, PtSize::Half),
            ),
            op(pv::OP_WRITE_PTE, V, SPT, mmu::SPT_ENTRIES / 2, 0),
        ],
    );
    assert_eq!((out.applied, out.error), (1, pv::ERR_BAD_INDEX));
    let too_many = vec![op(pv::OP_FLUSH, V, PD, 0, 0); pv::MAX_BATCH as usize + 1];
    assert_eq!(sp.pv_apply(&mut cx, &too_many).error, pv::ERR_BAD_BATCH);
    let batches = sp.stats().pv_batches;
    assert_eq!(batches, 2 + cases.len() as u64 + 1);
    sp.destroy(&mut cx);
    assert_eq!(cx.hyp.used(), 0);
}

#[test]
fn pv_is_refused_in_other_modes() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    for mode in [ShadowMode::Eager, ShadowMode::Lazy, ShadowMode::Incremental] {
        let mut sp = ShadowPt::new(mode);
        sp.attach(&mut cx, pdb(PD, V)).unwrap();
        let out = sp.pv_apply(
            &mut cx,
            &[Op {
                op: pv::OP_FLUSH,
                target: 0,
                table: PD,
                index: 0,
                value: 0,
            }],
        );
        assert_eq!((out.applied, out.error), (0, pv::ERR_NOT_AVAILABLE));
        sp.destroy(&mut cx);
    }
}

#[test]
fn destroy_frees_everything_in_every_mode() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    for mode in ShadowMode::ALL {
        let mut sp = ShadowPt::new(mode);
        for (i, target) in [(0u64, V), (1, V), (2, S)] {
            let dir = 0x4_0000 * (i + 1);
            put(
                &cx,
                target,
                dir,
                pde(Some((SPT, V)), Some((LPT, N)), PtSize::Full),
            );
            put(
                &cx,
                target,
                dir + 8,
                pde(Some((0x20_0000, S)), None, PtSize::Half),
            );
            sp.attach(&mut cx, pdb(dir, target)).unwrap();
            sp.attach(&mut cx, pdb(dir, target)).unwrap();
        }
        let st = sp.stats();
        assert_eq!(
            st.shadow_bytes,
            3 * (mmu::PD_SIZE + mmu::SPT_SIZE + mmu::LPT_SIZE + mmu::SPT_SIZE / 2)
        );
        assert_eq!(cx.hyp.used(), st.shadow_bytes);
        assert_eq!(st.tracked_pages > 0, sp.books.tracking, "{mode}");
        sp.tlb_flush(&mut cx, None);
        sp.destroy(&mut cx);
        let st = sp.stats();
        assert_eq!((st.shadow_bytes, st.tracked_pages), (0, 0), "{mode}");
        assert_eq!(cx.hyp.used(), 0, "{mode}");
        assert_eq!(sp.translate(&cx, pdb(0x4_0000, V), 0), None);
        assert!(sp.tlb_flush(&mut cx, None).is_empty());
    }
}

#[test]
fn thousands_of_pdes_sharing_one_table_stay_linear() {
    // A hostile directory: all 8192 PDEs name the same 1 KiB LPT. Each PDE gets its own 4 KiB
    // shadow until the hypervisor area (24 MiB) runs out; one write to the table then updates
    // every shadow, and teardown frees them all.
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    let mut dir = Vec::new();
    for _ in 0..mmu::PD_ENTRIES {
        dir.extend_from_slice(&pde(None, Some((LPT, V)), PtSize::Eighth).to_le_bytes());
    }
    cx.mem.write(V, PD, &dir).unwrap();
    let mut sp = ShadowPt::new(ShadowMode::Incremental);
    sp.attach(&mut cx, space).unwrap();
    let st = sp.stats();
    let shadows = (HYP_SIZE - mmu::PD_SIZE) / 0x1000;
    assert_eq!(st.shadow_bytes, mmu::PD_SIZE + shadows * 0x1000);
    // The hypervisor's PDE (`hyp::HYP_PDE`) is never shadowed.
    assert_eq!(st.alloc_failures, mmu::PD_ENTRIES - 1 - shadows);
    assert_eq!(st.tracked_pages, 16 + 1);
    put(&cx, V, LPT + 8, pte(0x2_0000, V));
    sp.guest_wrote(&mut cx, V, LPT + 8, 8);
    assert_eq!(sp.stats().entry_updates, shadows);
    let last = shadows - 1;
    assert_eq!(
        sp.translate(&cx, space, lva(last, 1)),
        tr(V, BASE + 0x2_0000)
    );
    assert_eq!(
        sp.translate(&cx, space, lva(last + 1, 1)),
        None,
        "no shadow left"
    );
    sp.destroy(&mut cx);
    assert_eq!(cx.hyp.used(), 0);
    assert_eq!(sp.stats().tracked_pages, 0);
}

/// The isolation review's finding 9: PDE ops that switch a directory entry between two full
/// tables re-walk a whole table each; a batch stops at the walk budget with ERR_BUSY (after at
/// least one op), and resubmitting the rest finishes it with the same result as one batch.
#[test]
fn pv_batches_stop_at_the_walk_budget_and_resume() {
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    let mut sp = ShadowPt::new(ShadowMode::Pv);
    sp.attach(&mut cx, space).unwrap();
    let op = |table: u64| Op {
        op: pv::OP_WRITE_PDE,
        target: V.bits(),
        table: PD,
        index: 7,
        value: pde(Some((table, V)), None, PtSize::Full),
    };
    // 2048 ops alternating between two full small-page tables.
    let ops: Vec<Op> = (0..pv::MAX_BATCH as usize)
        .map(|i| op(if i % 2 == 0 { SPT } else { SPT2 }))
        .collect();
    let per_op = mmu::SPT_ENTRIES;
    let mut done = 0usize;
    let mut rounds = 0;
    while done < ops.len() {
        let before = sp.stats().ptes_shadowed;
        let out = sp.pv_apply(&mut cx, &ops[done..]);
        let walked = sp.stats().ptes_shadowed - before;
        assert!(out.applied >= 1, "every round makes progress");
        done += out.applied as usize;
        rounds += 1;
        if done < ops.len() {
            assert_eq!(out.error, pv::ERR_BUSY);
            assert!(
                walked >= WALK_BUDGET,
                "stopped only at the budget ({walked})"
            );
            assert!(
                walked < WALK_BUDGET + per_op,
                "the budget bounds each round to one op past it ({walked})"
            );
        } else {
            assert_eq!(out.error, pv::ERR_NONE);
        }
    }
    assert!(rounds > 1, "a 2048-op batch of table switches is split");
    // The last op pointed PDE 7 at SPT2: the shadow follows it.
    put(&cx, V, SPT2 + 3 * 8, pte(0x6000, V));
    sp.guest_wrote(&mut cx, V, SPT2 + 3 * 8, 8);
    assert_eq!(sp.translate(&cx, space, sva(7, 3)), tr(V, BASE + 0x6000));
    sp.destroy(&mut cx);
    assert_eq!(cx.hyp.used(), 0);
}

#[test]
fn entries_at_the_edges_of_zero_blocks_are_shadowed() {
    // The builder skips eight zero entries at a time (`build::ZERO_BLOCK`); entries right
    // before and after a block boundary, in the directory and in a table, must still count,
    // and so must a rejected entry in an otherwise zero block.
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    let space = pdb(PD, V);
    put(&cx, V, PD + 7 * 8, pde(Some((SPT, V)), None, PtSize::Full));
    put(&cx, V, PD + 8 * 8, pde(Some((SPT2, V)), None, PtSize::Full));
    for (i, page) in [(7, 1), (8, 2), (63, 3), (64, 4)] {
        put(&cx, V, SPT + i * 8, pte(page << 12, V));
    }
    put(&cx, V, SPT2, pte(0x5000, V));
    put(&cx, V, SPT2 + 9 * 8, pte(SLICE, V)); // out of the slice: rejected
    let mut sp = ShadowPt::new(ShadowMode::Eager);
    sp.attach(&mut cx, space).unwrap();
    for (i, page) in [(7, 1), (8, 2), (63, 3), (64, 4)] {
        assert_eq!(
            sp.translate(&cx, space, sva(7, i)),
            tr(V, BASE + (page << 12))
        );
    }
    for i in [0, 6, 9, 62, 65, 1023] {
        assert_eq!(sp.translate(&cx, space, sva(7, i)), None, "SPT entry {i}");
    }
    assert_eq!(sp.translate(&cx, space, sva(8, 0)), tr(V, BASE + 0x5000));
    assert_eq!(sp.translate(&cx, space, sva(8, 9)), None);
    assert_eq!(sp.translate(&cx, space, sva(6, 0)), None, "PDE 6 is empty");
    assert_eq!(sp.translate(&cx, space, sva(9, 0)), None, "PDE 9 is empty");
    assert_eq!(sp.stats().violations, 1);
    // A later write at a block's first entry goes through the partial path as well.
    put(&cx, V, SPT + 16 * 8, pte(0x6000, V));
    sp.guest_wrote(&mut cx, V, SPT + 16 * 8, 8);
    sp.tlb_flush(&mut cx, Some(space));
    assert_eq!(sp.translate(&cx, space, sva(7, 16)), tr(V, BASE + 0x6000));
    assert_eq!(sp.translate(&cx, space, sva(7, 7)), tr(V, BASE + 0x1000));
    sp.destroy(&mut cx);
}

#[test]
fn a_fresh_table_over_stale_hypervisor_vram_holds_only_the_guests_entries() {
    // A fresh shadow table gets only its non-zero entries written after a zero fill: whatever
    // the allocation held before (here: every byte of the hypervisor area set) must be gone.
    let mut rig = Rig::new();
    let mut cx = rig.cx();
    cx.mem.phys.fill_vram(HostVram(HYP_BASE), HYP_SIZE, 0xa5);
    let space = pdb(PD, V);
    put(&cx, V, PD, pde(Some((SPT, V)), None, PtSize::Full));
    put(&cx, V, SPT + 8 * 5000, pte(0x3000, V));
    let mut sp = ShadowPt::new(ShadowMode::Incremental);
    sp.attach(&mut cx, space).unwrap();
    assert_eq!(sp.translate(&cx, space, sva(0, 5000)), tr(V, BASE + 0x3000));
    let pd = sp.shadow_pd(space).unwrap().raw();
    let table = Pde::decode(vram_u64(&cx, pd)).small.unwrap().addr;
    let mut bytes = vec![0u8; mmu::SPT_SIZE as usize];
    cx.mem.phys.read_vram(HostVram(table), &mut bytes);
    let nonzero: Vec<usize> = bytes
        .chunks_exact(8)
        .enumerate()
        .filter(|(_, e)| e.iter().any(|&b| b != 0))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        nonzero,
        vec![5000],
        "only the guest's one entry, no stale byte"
    );
    // Unused PDEs of the shadow directory read as zero too (no stale PDE).
    assert_eq!(vram_u64(&cx, pd + 8), 0);
    sp.destroy(&mut cx);
}
