//! `shadow_walk`: fuzzer-chosen guest page directories and tables (PDEs and PTEs in guest VRAM
//! and guest RAM, biased toward well-formed entries with arbitrary addresses and targets) are
//! shadowed with `gpuvm::shadow_pt::ShadowPt` in every mode, then some entries are rewritten
//! (reported with `guest_wrote`, sent as PV ops in PV mode) and the guest flushes.
//! Invariants: nothing panics; every `translate` result lies inside the VM's VRAM slice (VRAM
//! target) or inside its guest RAM as seen through its IOVA window (system targets); shadow
//! tables live in hypervisor VRAM only; Eager, Lazy and Incremental agree after the flush.

use gf100::mmu::{self, Pde, PtRef, PtSize, Pte};
use gf100::Target;
use gpuvm::addr::{HostVram, Iova};
use gpuvm::guest_mem::{GuestMem, GuestRam, VramSlice};
use gpuvm::profile::ShadowMode;
use gpuvm::shadow_pt::{GuestPdb, ShadowCtx, ShadowPt, ShadowTranslation};
use gpuvm::vram_alloc::HypVram;
use gpuvm_sim::{SimConfig, SimGpu};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::Input;

const VRAM: u64 = 64 << 20;
const BASE: u64 = 16 << 20;
const SLICE: u64 = 16 << 20;
const HYP_BASE: u64 = 40 << 20;
const HYP_SIZE: u64 = 24 << 20;
const IOVA: u64 = 1 << 32;
/// Guest RAM: [0, 2 MiB) and [4 MiB, 6 MiB).
const RAM: [(u64, u64); 2] = [(0, 2 << 20), (4 << 20, 2 << 20)];
const MAX_WRITES: usize = 256;

struct Env {
    gpu: SimGpu,
    ram: GuestRam,
}

impl Env {
    fn new() -> Env {
        let ranges: Vec<_> = RAM
            .iter()
            .map(|&(a, l)| (GuestAddress(a), l as usize))
            .collect();
        Env {
            gpu: SimGpu::new(SimConfig {
                vram_size: VRAM,
                ..SimConfig::default()
            }),
            ram: GuestRam {
                mem: GuestMemoryMmap::<()>::from_ranges(&ranges).unwrap(),
                iova_base: Iova(IOVA),
            },
        }
    }

    fn mem(&self) -> GuestMem<'_> {
        GuestMem {
            phys: &self.gpu,
            slice: VramSlice {
                base: HostVram(BASE),
                size: SLICE,
            },
            ram: Some(&self.ram),
            log: None,
        }
    }
}

fn target(b: u8) -> Target {
    match b % 4 {
        0 | 3 => Target::Vram,
        1 => Target::SysCoherent,
        _ => Target::SysNonCoherent,
    }
}

/// A guest address in `target`'s memory, biased to land inside it (page-aligned mostly).
fn addr(inp: &mut Input, target: Target) -> u64 {
    let sel = inp.u8();
    let raw = u64::from(inp.u32());
    let a = match (sel % 8, target) {
        (0, _) => raw << 12, // anywhere, possibly far out
        (_, Target::Vram) => raw % SLICE,
        (n, _) => {
            let (b, l) = RAM[n as usize % 2];
            b + raw % l
        }
    };
    if sel & 0x80 == 0 {
        a & !0xfff
    } else {
        a
    }
}

/// One guest entry write: where (target, address), and what (raw or a built PDE/PTE).
struct Write {
    target: Target,
    addr: u64,
    value: u64,
    /// For PV: the op code, table and index naming the same entry.
    pv: (u32, u64, u64),
}

fn entry_value(inp: &mut Input) -> u64 {
    let kind = inp.u8();
    match kind % 4 {
        0 => inp.u64(),
        1 => {
            let t = target(inp.u8());
            let a = addr(inp, t);
            let mut p = Pte::new(a & !0xfff, t);
            p.read_only = kind & 0x10 != 0;
            p.encode()
        }
        _ => {
            let r = |inp: &mut Input| {
                let t = target(inp.u8());
                let a = addr(inp, t);
                PtRef {
                    addr: a & !0xfff,
                    target: t,
                    vol: t.is_sysram(),
                }
            };
            let small = (kind & 0x10 != 0).then(|| r(inp));
            let large = (kind & 0x20 != 0).then(|| r(inp));
            let size = match (kind >> 6) & 3 {
                0 => PtSize::Full,
                1 => PtSize::Half,
                2 => PtSize::Quarter,
                _ => PtSize::Eighth,
            };
            Pde { small, large, size }.encode()
        }
    }
}

fn write_at(inp: &mut Input, pd: (Target, u64), tables: &[(Target, u64)]) -> Write {
    let sel = inp.u8();
    let (target, addr, pv) = match sel % 4 {
        // An entry of the page directory.
        0 | 1 => {
            let i = u64::from(inp.u16()) % mmu::PD_ENTRIES;
            (pd.0, pd.1 + i * 8, (gf100::pv::OP_WRITE_PDE, pd.1, i))
        }
        // An entry of a table some earlier PDE named.
        2 if !tables.is_empty() => {
            let (t, a) = tables[inp.u8() as usize % tables.len()];
            let i = u64::from(inp.u16()) % mmu::SPT_ENTRIES;
            (t, a + i * 8, (gf100::pv::OP_WRITE_PTE, a, i))
        }
        _ => {
            let t = target(inp.u8());
            let a = addr(inp, t) & !7;
            (t, a, (gf100::pv::OP_WRITE_PTE, a & !0xfff, (a & 0xfff) / 8))
        }
    };
    let value = entry_value(inp);
    Write {
        target,
        addr,
        value,
        pv,
    }
}

fn apply(mem: &GuestMem, w: &Write, tables: &mut Vec<(Target, u64)>) {
    // Writes outside the VM's memory are dropped, as the guest cannot make them either.
    let _ = mem.write(w.target, w.addr, &w.value.to_le_bytes());
    let pde = Pde::decode(w.value);
    for r in [pde.small, pde.large].into_iter().flatten() {
        if tables.len() < 64 {
            tables.push((r.target, r.addr));
        }
    }
}

fn check(t: &ShadowTranslation, va: u64, mode: ShadowMode) {
    match t.target {
        Target::Vram => assert!(
            t.addr >= BASE && t.addr < BASE + SLICE,
            "{mode:?}: VA {va:#x} -> VRAM {:#x}, outside the slice",
            t.addr
        ),
        _ => {
            let gpa = t.addr.checked_sub(IOVA).unwrap_or_else(|| {
                panic!(
                    "{mode:?}: VA {va:#x} -> IOVA {:#x}, below the window",
                    t.addr
                )
            });
            assert!(
                RAM.iter().any(|&(b, l)| gpa >= b && gpa < b + l),
                "{mode:?}: VA {va:#x} -> IOVA {:#x} (GPA {gpa:#x}), outside guest RAM",
                t.addr
            );
        }
    }
}

fn vas<'a>(
    inp: &mut Input,
    writes: impl Iterator<Item = &'a Write>,
    pd: (Target, u64),
) -> Vec<u64> {
    let mut v = Vec::new();
    // The VAs covered by every PDE written: first, middle and last small and large pages.
    for w in writes {
        if w.target == pd.0 && w.addr >= pd.1 && w.addr < pd.1 + mmu::PD_SIZE {
            let base = (w.addr - pd.1) / 8 * mmu::PDE_COVERAGE;
            for off in [
                0,
                0x1000,
                0x2_0000,
                mmu::PDE_COVERAGE / 2,
                mmu::PDE_COVERAGE - 1,
            ] {
                v.push(base + off);
            }
        }
    }
    for _ in 0..16 {
        v.push(inp.u64() % mmu::VA_LIMIT);
    }
    v.truncate(256);
    v
}

pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let pd_sel = inp.u8();
    let pd_target = if pd_sel & 1 == 0 {
        Target::Vram
    } else {
        Target::SysCoherent
    };
    let pd_addr = match pd_target {
        Target::Vram => (u64::from(inp.u16()) << 12) % (SLICE - mmu::PD_SIZE + 0x1000),
        _ => {
            let (b, l) = RAM[(pd_sel >> 1) as usize % 2];
            b + (u64::from(inp.u16()) << 12) % (l - mmu::PD_SIZE + 0x1000)
        }
    };
    let pd = (pd_target, pd_addr);
    let nw = inp.u8() as usize % MAX_WRITES;
    let mut tables = Vec::new();
    let mut first = Vec::new();
    for _ in 0..nw {
        first.push(write_at(&mut inp, pd, &tables));
        let w = first.last().unwrap();
        let pde = Pde::decode(w.value);
        for r in [pde.small, pde.large].into_iter().flatten() {
            if tables.len() < 64 {
                tables.push((r.target, r.addr));
            }
        }
    }
    let n2 = inp.u8() as usize % 32;
    let second: Vec<Write> = (0..n2).map(|_| write_at(&mut inp, pd, &tables)).collect();
    let probe = vas(&mut inp, first.iter().chain(&second), pd);
    let pdb = GuestPdb {
        addr: pd.1,
        target: pd.0,
    };

    let mut results: Vec<(ShadowMode, Vec<Option<ShadowTranslation>>)> = Vec::new();
    for mode in ShadowMode::ALL {
        let env = Env::new();
        let mut hyp = HypVram::immediate(HYP_BASE, HYP_SIZE);
        let mut sp = ShadowPt::new(mode);
        sp.set_shadow_limit(4 << 20);
        let mut t2 = Vec::new();
        for w in &first {
            apply(&env.mem(), w, &mut t2);
        }
        let mut cx = ShadowCtx {
            mem: env.mem(),
            hyp: &mut hyp,
        };
        let Ok(spd) = sp.attach(&mut cx, pdb) else {
            continue;
        };
        assert!(
            spd.raw() >= HYP_BASE && spd.raw() < HYP_BASE + HYP_SIZE,
            "{mode:?}: shadow directory {spd:?} outside hypervisor VRAM"
        );
        for &va in &probe {
            if let Some(t) = sp.translate(&cx, pdb, va) {
                check(&t, va, mode);
            }
        }
        // Rewrites, reported the way each mode learns of them.
        for w in &second {
            apply(&cx.mem, w, &mut t2);
            if mode == ShadowMode::Pv {
                let op = gf100::pv::Op {
                    op: w.pv.0,
                    target: w.target.bits(),
                    table: w.pv.1,
                    index: w.pv.2,
                    value: w.value,
                };
                let flush = sp.pv_apply(&mut cx, &[op]).flush;
                for f in flush {
                    assert!(f.raw() >= HYP_BASE && f.raw() < HYP_BASE + HYP_SIZE);
                }
            } else {
                sp.guest_wrote(&mut cx, w.target, w.addr, 8);
            }
        }
        let _ = sp.tlb_flush(&mut cx, Some(pdb));
        let _ = sp.before_submit(&mut cx, pdb);
        let mut res = Vec::new();
        for &va in &probe {
            let t = sp.translate(&cx, pdb, va);
            if let Some(t) = &t {
                check(t, va, mode);
            }
            res.push(t);
        }
        results.push((mode, res));
        sp.destroy(&mut cx);
        assert_eq!(
            hyp.used(),
            0,
            "{mode:?}: shadow memory leaked after destroy"
        );
    }
    let full: Vec<_> = results
        .iter()
        .filter(|(m, _)| *m != ShadowMode::Pv)
        .collect();
    for w in full.windows(2) {
        assert_eq!(
            w[0].1, w[1].1,
            "{:?} and {:?} disagree after a flush",
            w[0].0, w[1].0
        );
    }
}
