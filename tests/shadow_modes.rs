//! All four shadow modes give the same shadows, and the shadows are what the validation rules
//! say they must be.
//!
//! A random sequence of guest operations on one address space — map a VRAM page (sometimes
//! outside the slice), map a system page (sometimes outside RAM), write an invalid or
//! not-present entry, unmap, change a PDE (add, move or remove tables, change PT_SIZE), flush —
//! is applied to four VMs with identical memory, one per mode. Eager, lazy and incremental see
//! guest memory writes (`GuestMem::write` + `guest_wrote`) and, at each flush, `tlb_flush` +
//! `before_submit`; PV sees the same writes as `pv_apply` batches ending in `OP_FLUSH`. After
//! every flush, `translate` must agree across the modes and with a reference model computed
//! from the *intended* mappings (not from the bits written) and the validation rules, for every
//! VA the sequence touched plus random ones. At the end, incremental and PV must track exactly
//! the pages of the directory and of the tables in use, and `destroy` must free everything.

use std::collections::{BTreeSet, HashMap};

use gpuvm::addr::{HostVram, Iova};
use gpuvm::gf100::mmu::{self, Pde, PtRef, PtSize, Pte};
use gpuvm::gf100::pv::{self, Op};
use gpuvm::gf100::Target;
use gpuvm::guest_mem::{GuestMem, GuestRam, VramSlice};
use gpuvm::profile::ShadowMode;
use gpuvm::shadow_pt::{GuestPdb, ShadowCtx, ShadowPt, ShadowTranslation};
use gpuvm::vram_alloc::HypVram;
use gpuvm_sim::{SimConfig, SimGpu};
use proptest::prelude::*;
use vm_memory::{GuestAddress, GuestMemoryMmap};

const VRAM: u64 = 64 << 20;
const BASE: u64 = 16 << 20;
const SLICE: u64 = 16 << 20;
const HYP: (u64, u64) = (40 << 20, 24 << 20);
const IOVA: u64 = 1 << 32;
const MIB: u64 = 1 << 20;
/// Guest RAM regions (GPA, length): a hole at [4 MiB, 8 MiB).
const RAM: [(u64, u64); 2] = [(0, 4 * MIB), (8 * MIB, 4 * MIB)];

const V: Target = Target::Vram;
const S: Target = Target::SysCoherent;
const N: Target = Target::SysNonCoherent;

/// Where the guest keeps its page directory (one per case).
const PDS: [(u64, Target); 2] = [(0, V), (0x1_0000, S)];
/// The PDEs the sequences use (VA 0, 128 MiB, 256 MiB and the highest one a guest may use).
// The last guest-usable PDE is 8190: 8191 is the hypervisor's in every shadow directory
// (`gpuvm::shadow_pt::hyp::HYP_PDE`, never shadowed from the guest; `src/vgpu/tests/grctx.rs`).
const PDES: [u64; 4] = [0, 1, 2, gpuvm::shadow_pt::hyp::HYP_PDE as u64 - 1];
/// Small-page table slots; none overlaps another slot or a directory. Slot 3 fits in the slice
/// only with PT_SIZE 1/8, slot 4 in RAM only with 1/4 or 1/8, slot 5 is in the RAM hole.
const SPTS: [(u64, Target); 6] = [
    (0x10_0000, V),
    (0x14_0000, V),
    (0x20_0000, S),
    (SLICE - 0x8000, V),
    (4 * MIB - 0x1_0000, N),
    (5 * MIB, S),
];
/// Large-page table slots. Slot 2 fits in RAM for every PT_SIZE but full; slot 3 is in the hole.
const LPTS: [(u64, Target); 4] = [
    (0x18_0000, V),
    (0x30_0000, N),
    (12 * MIB - 0x1000, S),
    (6 * MIB, S),
];

const SIZES: [PtSize; 4] = [PtSize::Full, PtSize::Half, PtSize::Quarter, PtSize::Eighth];

fn ram_contains(gpa: u64, len: u64) -> bool {
    RAM.iter().any(|&(a, l)| gpa >= a && gpa + len <= a + l)
}

fn mem_contains(target: Target, addr: u64, len: u64) -> bool {
    match target {
        Target::Vram => addr + len <= SLICE,
        _ => ram_contains(addr, len),
    }
}

fn page_size(large: bool) -> u64 {
    if large {
        mmu::LARGE_PAGE_SIZE
    } else {
        mmu::SMALL_PAGE_SIZE
    }
}

// ------------------------------------------------------------------------------------------------
// Guest operations and the reference model
// ------------------------------------------------------------------------------------------------

/// What a guest entry is meant to be.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Intent {
    Vram {
        page: u64,
        ro: bool,
    },
    Sys {
        gpa: u64,
        target: Target,
        ro: bool,
    },
    /// Present with the invalid target 1.
    InvalidTarget,
    /// Present bit clear, other bits set.
    Junk,
}

impl Intent {
    /// The guest entry, with flags that must not change the translation (kind, comptag,
    /// supervisor, vol) set from `noise`.
    fn encode(self, noise: u64) -> u64 {
        let with = |addr, target, ro| {
            Pte {
                read_only: ro,
                supervisor: noise & 1 != 0,
                vol: noise & 2 != 0,
                kind: (noise >> 8) as u8,
                comptag: (noise >> 16) as u32 & 0x1ffff,
                ..Pte::new(addr, target)
            }
            .encode()
        };
        match self {
            Intent::Vram { page, ro } => with(page, V, ro),
            Intent::Sys { gpa, target, ro } => with(gpa, target, ro),
            Intent::InvalidTarget => with(0x1000, V, false) | 1 << 33,
            Intent::Junk => with(0x1000, V, false) & !mmu::PTE_PRESENT,
        }
    }

    /// What the shadow must make of it for the byte `off` into a page of `size` bytes, the
    /// entry written with `noise` (its supervisor bit is kept).
    fn expect(self, size: u64, off: u64, noise: u64) -> Option<ShadowTranslation> {
        let supervisor = noise & 1 != 0;
        match self {
            Intent::Vram { page, ro } if mem_contains(V, page, size) => Some(ShadowTranslation {
                target: V,
                addr: BASE + page + off,
                read_only: ro,
                supervisor,
            }),
            Intent::Sys { gpa, target, ro } if ram_contains(gpa, size) => Some(ShadowTranslation {
                target,
                addr: IOVA + gpa + off,
                read_only: ro,
                supervisor,
            }),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
enum GuestOp {
    /// Write an entry of the table PDE `pde` has of kind `large` (skipped if it has none in the
    /// VM's memory); the index is `idx % entries`.
    Entry {
        pde: usize,
        large: bool,
        idx: u64,
        what: Option<Intent>,
        noise: u64,
    },
    /// Rewrite PDE `pde`.
    SetPde {
        pde: usize,
        small: Option<usize>,
        large: Option<usize>,
        size: usize,
    },
    Flush,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct PdeIntent {
    small: Option<usize>,
    large: Option<usize>,
    size: PtSize,
}

impl PdeIntent {
    fn encode(&self) -> u64 {
        let r = |(addr, target): (u64, Target)| PtRef {
            addr,
            target,
            vol: target.is_sysram(),
        };
        Pde {
            small: self.small.map(|s| r(SPTS[s])),
            large: self.large.map(|l| r(LPTS[l])),
            size: self.size,
        }
        .encode()
    }

    /// The slot of kind `large`, if it lies in the VM's memory for this PT_SIZE.
    fn valid(&self, large: bool) -> Option<(usize, u64)> {
        let (slot, (addr, target), entries) = if large {
            let s = self.large?;
            (s, LPTS[s], self.size.coverage() / mmu::LARGE_PAGE_SIZE)
        } else {
            let s = self.small?;
            (s, SPTS[s], self.size.coverage() / mmu::SMALL_PAGE_SIZE)
        };
        mem_contains(target, addr, entries * 8).then_some((slot, entries))
    }
}

/// The guest's intent: its directory and the content of every table slot.
#[derive(Debug, Default)]
struct Model {
    pdes: HashMap<usize, PdeIntent>,
    /// (large, slot, index) -> entry.
    /// Each written entry with the noise its flags were drawn from.
    entries: HashMap<(bool, usize, u64), (Intent, u64)>,
}

/// A guest memory write the op turns into: (target, address, value), and the PV op.
struct Write {
    target: Target,
    addr: u64,
    value: u64,
    op: Op,
}

impl Model {
    /// Applies `op` to the model; returns the guest write it means, if any, and adds the VAs
    /// whose translation it may change to `vas`.
    fn apply(&mut self, op: &GuestOp, pd: (u64, Target), vas: &mut BTreeSet<u64>) -> Option<Write> {
        match *op {
            GuestOp::Flush => None,
            GuestOp::SetPde {
                pde,
                small,
                large,
                size,
            } => {
                let p = PdeIntent {
                    small,
                    large,
                    size: SIZES[size],
                };
                self.pdes.insert(pde, p);
                let index = PDES[pde];
                let value = p.encode();
                Some(Write {
                    target: pd.1,
                    addr: pd.0 + index * 8,
                    value,
                    op: Op {
                        op: pv::OP_WRITE_PDE,
                        target: pd.1.bits(),
                        table: pd.0,
                        index,
                        value,
                    },
                })
            }
            GuestOp::Entry {
                pde,
                large,
                idx,
                what,
                noise,
            } => {
                let (slot, _) = self.pdes.get(&pde)?.valid(large)?;
                // Valid indices: the most any PDE using this table makes valid (PV's rule).
                let entries = self
                    .pdes
                    .values()
                    .filter_map(|p| p.valid(large))
                    .filter(|(s, _)| *s == slot)
                    .map(|(_, e)| e)
                    .max()?;
                let index = idx % entries;
                let size = page_size(large);
                for (p, _) in self
                    .pdes
                    .iter()
                    .filter(|(_, p)| p.valid(large).is_some_and(|(s, _)| s == slot))
                {
                    let va = PDES[*p] * mmu::PDE_COVERAGE + index * size;
                    vas.insert(va);
                    vas.insert(va + noise % size);
                }
                match what {
                    Some(w) => self.entries.insert((large, slot, index), (w, noise)),
                    None => self.entries.remove(&(large, slot, index)),
                };
                let value = what.map_or(0, |w| w.encode(noise));
                let (table, target) = if large { LPTS[slot] } else { SPTS[slot] };
                Some(Write {
                    target,
                    addr: table + index * 8,
                    value,
                    op: Op {
                        op: pv::OP_WRITE_PTE,
                        target: target.bits(),
                        table,
                        index,
                        value,
                    },
                })
            }
        }
    }

    /// Where `va` must lead.
    fn expect(&self, va: u64) -> Option<ShadowTranslation> {
        if va >= mmu::VA_LIMIT {
            return None;
        }
        let pi = mmu::pde_index(va);
        let p = PDES.iter().position(|&x| x == pi)?;
        let pde = self.pdes.get(&p)?;
        if va & (mmu::PDE_COVERAGE - 1) >= pde.size.coverage() {
            return None;
        }
        for large in [false, true] {
            let Some((slot, _)) = pde.valid(large) else {
                continue;
            };
            let (index, off) = if large {
                (mmu::lpt_index(va), va & (mmu::LARGE_PAGE_SIZE - 1))
            } else {
                (mmu::spt_index(va), va & (mmu::SMALL_PAGE_SIZE - 1))
            };
            if let Some(t) = self
                .entries
                .get(&(large, slot, index))
                .and_then(|&(e, noise)| e.expect(page_size(large), off, noise))
            {
                return Some(t);
            }
        }
        None
    }

    /// The 4 KiB pages incremental and PV modes must track.
    fn tracked(&self, pd: (u64, Target)) -> BTreeSet<(bool, u64)> {
        let mut out = BTreeSet::new();
        let mut add = |target: Target, addr: u64, len: u64| {
            let mut a = addr & !0xfff;
            while a < addr + len {
                out.insert((target.is_sysram(), a));
                a += 0x1000;
            }
        };
        add(pd.1, pd.0, mmu::PD_SIZE);
        for p in self.pdes.values() {
            for large in [false, true] {
                if let Some((slot, entries)) = p.valid(large) {
                    let (addr, target) = if large { LPTS[slot] } else { SPTS[slot] };
                    add(target, addr, entries * 8);
                }
            }
        }
        out
    }
}

// ------------------------------------------------------------------------------------------------
// One VM per mode
// ------------------------------------------------------------------------------------------------

struct Vm {
    gpu: SimGpu,
    ram: GuestRam,
    hyp: HypVram,
    sp: ShadowPt,
    batch: Vec<Op>,
}

impl Vm {
    fn new(mode: ShadowMode) -> Vm {
        let ranges: Vec<_> = RAM
            .iter()
            .map(|&(a, l)| (GuestAddress(a), l as usize))
            .collect();
        Vm {
            gpu: SimGpu::new(SimConfig {
                vram_size: VRAM,
                ..SimConfig::default()
            }),
            ram: GuestRam {
                mem: GuestMemoryMmap::<()>::from_ranges(&ranges).unwrap(),
                iova_base: Iova(IOVA),
            },
            hyp: HypVram::immediate(HYP.0, HYP.1),
            sp: ShadowPt::new(mode),
            batch: Vec::new(),
        }
    }

    fn with<R>(&mut self, f: impl FnOnce(&mut ShadowPt, &mut ShadowCtx, &mut Vec<Op>) -> R) -> R {
        let mut cx = ShadowCtx {
            mem: GuestMem {
                phys: &self.gpu,
                slice: VramSlice {
                    base: HostVram(BASE),
                    size: SLICE,
                },
                ram: Some(&self.ram),
                log: None,
            },
            hyp: &mut self.hyp,
        };
        f(&mut self.sp, &mut cx, &mut self.batch)
    }

    /// A guest write before the shadow exists.
    fn poke(&mut self, w: &Write) {
        self.with(|_, cx, _| {
            cx.mem
                .write(w.target, w.addr, &w.value.to_le_bytes())
                .unwrap()
        });
    }

    /// A guest write while shadowed, as the mode sees it.
    fn write(&mut self, w: Write) {
        self.with(|sp, cx, batch| {
            if sp.mode() == ShadowMode::Pv {
                batch.push(w.op);
            } else {
                cx.mem
                    .write(w.target, w.addr, &w.value.to_le_bytes())
                    .unwrap();
                sp.guest_wrote(cx, w.target, w.addr, 8);
            }
        });
    }

    /// A guest TLB flush and the next submission; returns the PDs to flush physically.
    fn flush(&mut self, pdb: GuestPdb) -> Vec<HostVram> {
        self.with(|sp, cx, batch| {
            if sp.mode() == ShadowMode::Pv {
                batch.push(Op {
                    op: pv::OP_FLUSH,
                    target: pdb.target.bits(),
                    table: pdb.addr,
                    index: 0,
                    value: 0,
                });
                let ops = std::mem::take(batch);
                // A batch that walked its budget stops with ERR_BUSY after at least one op; the
                // guest sends the rest again (as the guest driver does).
                let mut rest = &ops[..];
                let mut pds = Vec::new();
                loop {
                    let out = sp.pv_apply(cx, rest);
                    pds.extend(out.flush);
                    if out.error == pv::ERR_BUSY {
                        assert!(out.applied > 0 && (out.applied as usize) < rest.len());
                        rest = &rest[out.applied as usize..];
                        continue;
                    }
                    assert_eq!((out.applied as usize, out.error), (rest.len(), 0));
                    break;
                }
                pds.extend(sp.before_submit(cx, pdb));
                pds
            } else {
                let mut pds = sp.tlb_flush(cx, Some(pdb));
                pds.extend(sp.before_submit(cx, pdb));
                // A rebuild goes in budgeted steps (one per host lock hold); the host finishes
                // it before the work that uses the directory runs.
                while sp.pending(pdb) {
                    pds.extend(sp.step(cx));
                }
                pds
            }
        })
    }

    fn translate(&mut self, pdb: GuestPdb, va: u64) -> Option<ShadowTranslation> {
        self.with(|sp, cx, _| sp.translate(cx, pdb, va))
    }
}

// ------------------------------------------------------------------------------------------------
// Strategies
// ------------------------------------------------------------------------------------------------

fn intent() -> impl Strategy<Value = Intent> {
    let page = prop_oneof![
        (0..SLICE / 0x1000).prop_map(|p| p * 0x1000),
        (SLICE / 0x1000 - 40..SLICE / 0x1000 + 8).prop_map(|p| p * 0x1000),
    ];
    let gpa = prop_oneof![
        (0..14 * MIB / 0x1000).prop_map(|p| p * 0x1000),
        (0..8u64, 0..2usize)
            .prop_map(|(k, r)| RAM[r].0 + RAM[r].1 - k * 0x1_0000 + 0x1000 * (k % 3)),
    ];
    prop_oneof![
        5 => (page, any::<bool>()).prop_map(|(page, ro)| Intent::Vram { page, ro }),
        4 => (gpa, any::<bool>(), any::<bool>()).prop_map(|(gpa, c, ro)| Intent::Sys {
            gpa,
            target: if c { S } else { N },
            ro
        }),
        1 => Just(Intent::InvalidTarget),
        1 => Just(Intent::Junk),
    ]
}

fn guest_op() -> impl Strategy<Value = GuestOp> {
    let idx = prop_oneof![0..4u64, any::<u64>()];
    let size = prop_oneof![4 => Just(0usize), 1 => 1..4usize];
    prop_oneof![
        8 => (0..PDES.len(), any::<bool>(), idx, prop::option::weighted(0.85, intent()), any::<u64>())
            .prop_map(|(pde, large, idx, what, noise)| GuestOp::Entry { pde, large, idx, what, noise }),
        3 => (
            0..PDES.len(),
            prop::option::weighted(0.7, 0..SPTS.len()),
            prop::option::weighted(0.6, 0..LPTS.len()),
            size
        )
            .prop_map(|(pde, small, large, size)| GuestOp::SetPde { pde, small, large, size }),
        2 => Just(GuestOp::Flush),
    ]
}

/// VAs to compare beyond the touched ones: (PDE slot, offset) and anywhere.
fn probes() -> impl Strategy<Value = (Vec<(usize, u64)>, Vec<u64>)> {
    (
        prop::collection::vec((0..PDES.len(), 0..mmu::PDE_COVERAGE), 16),
        prop::collection::vec(0..mmu::VA_LIMIT + 0x1000, 4),
    )
}

// ------------------------------------------------------------------------------------------------
// The property
// ------------------------------------------------------------------------------------------------

fn check_all(
    vms: &mut [Vm],
    model: &Model,
    pdb: GuestPdb,
    vas: &BTreeSet<u64>,
) -> Result<(), TestCaseError> {
    for &va in vas {
        let want = model.expect(va);
        for vm in vms.iter_mut() {
            let got = vm.translate(pdb, va);
            prop_assert_eq!(got, want, "mode {} va {:#x}", vm.sp.mode(), va);
        }
    }
    Ok(())
}

fn run(
    pd_at: usize,
    pre: Vec<GuestOp>,
    ops: Vec<GuestOp>,
    probes: (Vec<(usize, u64)>, Vec<u64>),
) -> Result<(), TestCaseError> {
    let pd = PDS[pd_at];
    let pdb = GuestPdb {
        addr: pd.0,
        target: pd.1,
    };
    let mut vms: Vec<Vm> = ShadowMode::ALL.into_iter().map(Vm::new).collect();
    let mut model = Model::default();
    let mut vas: BTreeSet<u64> = probes
        .0
        .iter()
        .map(|&(p, off)| PDES[p] * mmu::PDE_COVERAGE + off)
        .chain(probes.1.iter().copied())
        .collect();
    // Memory as the guest left it before the first channel used the address space.
    for op in &pre {
        if let Some(w) = model.apply(op, pd, &mut vas) {
            for vm in vms.iter_mut() {
                vm.poke(&w);
            }
        }
    }
    for vm in vms.iter_mut() {
        let shadow_pd = vm.with(|sp, cx, _| sp.attach(cx, pdb)).unwrap();
        prop_assert_eq!(shadow_pd.raw() % 0x1000, 0);
    }
    check_all(&mut vms, &model, pdb, &vas)?;

    for op in ops.iter().chain(std::iter::once(&GuestOp::Flush)) {
        if let GuestOp::Flush = op {
            for vm in vms.iter_mut() {
                let want = vm.with(|sp, _, _| sp.shadow_pd(pdb));
                let pds = vm.flush(pdb);
                // Every mode names the shadow for a physical flush at this point (eager and
                // incremental at the flush, lazy at the submission, PV in the batch).
                prop_assert_eq!(pds.len(), 1, "mode {}", vm.sp.mode());
                prop_assert_eq!(Some(pds[0]), want);
            }
            check_all(&mut vms, &model, pdb, &vas)?;
        } else if let Some(w) = model.apply(op, pd, &mut vas) {
            for vm in vms.iter_mut() {
                vm.write(Write {
                    target: w.target,
                    addr: w.addr,
                    value: w.value,
                    op: w.op,
                });
            }
        }
    }

    // Tracking: exactly the directory and the tables in use (checked page by page over every
    // slot and the directory), in the modes that track.
    let want = model.tracked(pd);
    let mut candidates: BTreeSet<(bool, u64)> = want.clone();
    for &(addr, target) in SPTS.iter().chain(LPTS.iter()).chain(PDS.iter()) {
        for k in 0..(mmu::SPT_SIZE / 0x1000) {
            candidates.insert((target.is_sysram(), addr + k * 0x1000));
        }
    }
    for vm in vms.iter_mut() {
        let tracking = matches!(vm.sp.mode(), ShadowMode::Incremental | ShadowMode::Pv);
        for &(sys, page) in &candidates {
            let target = if sys { S } else { V };
            let expect = tracking && want.contains(&(sys, page));
            prop_assert_eq!(
                vm.sp.is_tracked(target, page),
                expect,
                "mode {} page {:?}",
                vm.sp.mode(),
                (sys, page)
            );
        }
        if tracking {
            prop_assert_eq!(vm.sp.stats().tracked_pages, want.len() as u64);
        }
        let used = vm.hyp.used();
        prop_assert_eq!(vm.sp.stats().shadow_bytes, used);
        vm.with(|sp, cx, _| sp.destroy(cx));
        prop_assert_eq!(vm.sp.stats().shadow_bytes, 0);
        prop_assert_eq!(vm.sp.stats().tracked_pages, 0);
        prop_assert_eq!(vm.hyp.used(), 0);
    }
    Ok(())
}

proptest! {
    // 48 cases keep CI quick; set PROPTEST_CASES for a longer soak.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
        ..ProptestConfig::default()
    })]

    #[test]
    fn all_modes_agree_with_the_model(
        pd_at in 0..PDS.len(),
        pre in prop::collection::vec(guest_op(), 0..12),
        ops in prop::collection::vec(guest_op(), 1..48),
        probes in probes(),
    ) {
        run(pd_at, pre, ops, probes)?;
    }
}

/// A fixed sequence through the interesting edges, so they are covered whatever proptest draws.
#[test]
fn fixed_sequence_through_the_edges() {
    let e = |pde, large, idx, what| GuestOp::Entry {
        pde,
        large,
        idx,
        what,
        noise: 0xffff_ffff_ffff_ff00,
    };
    let set = |pde, small, large, size| GuestOp::SetPde {
        pde,
        small,
        large,
        size,
    };
    let vram = |page, ro| Some(Intent::Vram { page, ro });
    let sys = |gpa, target| {
        Some(Intent::Sys {
            gpa,
            target,
            ro: false,
        })
    };
    let pre = vec![
        set(0, Some(0), Some(0), 0),
        e(0, false, 1, vram(0x5000, true)),
        e(0, true, 2, vram(SLICE - 0x2_0000, false)),
    ];
    let ops = vec![
        GuestOp::Flush,
        e(0, true, 3, vram(SLICE - 0x1_0000, false)), // straddles the slice end
        e(0, false, 5, vram(SLICE, false)),           // outside
        e(0, false, 6, sys(5 * MIB, S)),              // RAM hole
        e(0, false, 7, sys(4 * MIB - 0x1000, N)),     // last page of region 1
        e(0, true, 8, sys(4 * MIB - 0x1000, N)),      // large: straddles the hole
        e(0, false, 9, Some(Intent::InvalidTarget)),
        e(0, false, 10, Some(Intent::Junk)),
        GuestOp::Flush,
        set(1, Some(3), Some(2), 0), // both tables partly outside: absent
        e(1, false, 0, vram(0x1000, false)), // skipped: no valid table
        GuestOp::Flush,
        set(1, Some(3), Some(2), 3), // 1/8: both fit
        e(1, false, 4095, vram(0x1000, false)),
        e(1, true, 127, sys(0x8_0000, S)),
        set(2, Some(0), None, 1), // PDE 2 shares PDE 0's SPT with half coverage
        e(2, false, 1, vram(0x9000, false)),
        GuestOp::Flush,
        set(0, None, Some(1), 0), // PDE 0 drops its SPT, moves its LPT into RAM
        e(0, true, 0, vram(0x2_0000, false)),
        set(3, Some(2), Some(3), 0), // PDE 8191: SPT in RAM, LPT in the hole
        e(3, false, 32767, sys(0x1000, N)),
        GuestOp::Flush,
        set(2, None, None, 0),
        e(0, false, 1, None),
    ];
    let probes = (
        vec![(0, 0x1008), (1, 0xfff_f000), (2, 0x1234), (3, 0x7fff_f123)],
        vec![mmu::VA_LIMIT - 1, mmu::VA_LIMIT],
    );
    for pd_at in 0..PDS.len() {
        run(pd_at, pre.clone(), ops.clone(), probes.clone()).unwrap();
    }
}
