//! Benchmarks of the shadow page tables (`gpuvm::shadow_pt`) over the simulated GF100.
//!
//! Every benchmark uses one address space with [`MAPPED`] bytes mapped in 4 KiB pages (1 GiB:
//! 8 small-page tables, 262,144 PTEs, all present, in guest VRAM).
//!
//! Groups:
//! * `shadow_build`: a full shadow build, in PTEs/s. `attach` creates the shadow from nothing
//!   (allocation, one read of the directory and of each table, translation, one write per
//!   table) and `detach`es it again; `eager_rebuild` is an eager-mode TLB flush of an existing
//!   shadow (allocations reused).
//! * `shadow_update_one_pte`: the guest changes one PTE and the change reaches the shadow, per
//!   mode: `eager` = guest write + `tlb_flush` (full rebuild); `lazy` = guest write +
//!   `tlb_flush` + `before_submit` (full rebuild); `incremental` = guest write + `guest_wrote`;
//!   `pv` = a one-op `pv_apply` batch (which writes the guest entry itself).
//! * `shadow_pv_batch`: `pv_apply` of 128 and 2048 `OP_WRITE_PTE`s (GPUvm's two batch sizes),
//!   in ops/s.
//!
//! Run: `cargo bench --bench shadow -- --warm-up-time 1 --measurement-time 3`. Under
//! `cargo test --all-targets` criterion runs every benchmark once; in that (debug-assertion)
//! build the mapping shrinks to 128 MiB so setup stays quick.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpuvm::addr::HostVram;
use gpuvm::gf100::mmu::{self, Pde, PtRef, PtSize, Pte};
use gpuvm::gf100::pv::{self, Op};
use gpuvm::gf100::Target;
use gpuvm::guest_mem::{GuestMem, VramSlice};
use gpuvm::profile::ShadowMode;
use gpuvm::shadow_pt::{GuestPdb, ShadowCtx, ShadowPt};
use gpuvm::vram_alloc::HypVram;
use gpuvm_sim::{SimConfig, SimGpu};

/// Bytes of VA mapped in small pages.
const MAPPED: u64 = if cfg!(debug_assertions) {
    128 << 20
} else {
    1 << 30
};
/// Small-page PTEs mapped.
const PTES: u64 = MAPPED / mmu::SMALL_PAGE_SIZE;
/// Small-page tables (one per PDE).
const TABLES: u64 = MAPPED / mmu::PDE_COVERAGE;

const VRAM: u64 = 2 << 30;
const SLICE: u64 = 1536 << 20;
const PD: u64 = 0;
/// Guest VRAM of the first small-page table (the others follow).
const SPT0: u64 = 0x10_0000;
/// Guest VRAM the mapping points at (pages are never touched, so never allocated).
const DATA: u64 = 0x400_0000;

const PDB: GuestPdb = GuestPdb {
    addr: PD,
    target: Target::Vram,
};

/// One VM with the mapping written in guest memory, and its shadows in `mode`.
struct Vm {
    gpu: SimGpu,
    hyp: HypVram,
    sp: ShadowPt,
}

impl Vm {
    fn new(mode: ShadowMode) -> Vm {
        let mut vm = Vm {
            gpu: SimGpu::new(SimConfig {
                vram_size: VRAM,
                ..SimConfig::default()
            }),
            hyp: HypVram::immediate(SLICE, VRAM - SLICE),
            sp: ShadowPt::new(mode),
        };
        vm.with(|_, cx| {
            let mut pd = vec![0u8; mmu::PD_SIZE as usize];
            for t in 0..TABLES {
                let spt = SPT0 + t * mmu::SPT_SIZE;
                let pde = Pde {
                    small: Some(PtRef {
                        addr: spt,
                        target: Target::Vram,
                        vol: false,
                    }),
                    large: None,
                    size: PtSize::Full,
                };
                let at = (t * 8) as usize;
                pd[at..at + 8].copy_from_slice(&pde.encode().to_le_bytes());
                let mut table = Vec::with_capacity(mmu::SPT_SIZE as usize);
                for i in 0..mmu::SPT_ENTRIES {
                    let page = DATA + (t * mmu::SPT_ENTRIES + i) * mmu::SMALL_PAGE_SIZE;
                    table.extend_from_slice(&Pte::new(page, Target::Vram).encode().to_le_bytes());
                }
                cx.mem.write(Target::Vram, spt, &table).unwrap();
            }
            cx.mem.write(Target::Vram, PD, &pd).unwrap();
        });
        vm
    }

    fn with<R>(&mut self, f: impl FnOnce(&mut ShadowPt, &mut ShadowCtx) -> R) -> R {
        let mut cx = ShadowCtx {
            mem: GuestMem {
                phys: &self.gpu,
                slice: VramSlice {
                    base: HostVram(0),
                    size: SLICE,
                },
                ram: None,
                log: None,
            },
            hyp: &mut self.hyp,
        };
        f(&mut self.sp, &mut cx)
    }

    fn attached(mode: ShadowMode) -> Vm {
        let mut vm = Vm::new(mode);
        vm.with(|sp, cx| sp.attach(cx, PDB).unwrap());
        assert_eq!(vm.sp.stats().violations, 0);
        vm
    }
}

/// Guest address of PTE `n` of the mapping.
fn pte_addr(n: u64) -> u64 {
    SPT0 + n * mmu::ENTRY_SIZE
}

/// A PTE value for PTE `n`, alternating between two pages with `flip`.
fn pte_value(n: u64, flip: bool) -> u64 {
    let page = DATA + n * mmu::SMALL_PAGE_SIZE + if flip { mmu::SMALL_PAGE_SIZE } else { 0 };
    Pte::new(page, Target::Vram).encode()
}

fn write_pte_op(n: u64, flip: bool) -> Op {
    Op {
        op: pv::OP_WRITE_PTE,
        target: Target::Vram.bits(),
        table: SPT0 + (n / mmu::SPT_ENTRIES) * mmu::SPT_SIZE,
        index: n % mmu::SPT_ENTRIES,
        value: pte_value(n, flip),
    }
}

fn build(c: &mut Criterion) {
    let mut g = c.benchmark_group("shadow_build");
    g.throughput(Throughput::Elements(PTES));
    g.sample_size(10);
    let mut vm = Vm::new(ShadowMode::Eager);
    g.bench_function("attach", |b| {
        b.iter(|| {
            vm.with(|sp, cx| {
                let pd = sp.attach(cx, PDB).unwrap();
                sp.detach(cx, PDB);
                black_box(pd)
            })
        })
    });
    assert_eq!(vm.sp.stats().shadow_bytes, 0);
    let mut vm = Vm::attached(ShadowMode::Eager);
    g.bench_function("eager_rebuild", |b| {
        // The whole rebuild: the flush's first step and the steps the host does in later lock
        // holds.
        b.iter(|| {
            vm.with(|sp, cx| {
                let mut pds = sp.tlb_flush(cx, Some(PDB));
                while sp.pending(PDB) {
                    pds.extend(sp.step(cx));
                }
                black_box(pds)
            })
        })
    });
    g.finish();
}

fn update_one_pte(c: &mut Criterion) {
    let mut g = c.benchmark_group("shadow_update_one_pte");
    g.throughput(Throughput::Elements(1));
    let n = PTES / 2 + 7;
    for mode in ShadowMode::ALL {
        if matches!(mode, ShadowMode::Eager | ShadowMode::Lazy) {
            g.sample_size(10);
        } else {
            g.sample_size(100);
        }
        let mut vm = Vm::attached(mode);
        let mut flip = false;
        g.bench_function(BenchmarkId::from_parameter(mode), |b| {
            b.iter(|| {
                flip = !flip;
                vm.with(|sp, cx| match mode {
                    ShadowMode::Pv => {
                        let out = sp.pv_apply(cx, &[write_pte_op(n, flip)]);
                        black_box(out.applied);
                    }
                    _ => {
                        let v = pte_value(n, flip).to_le_bytes();
                        cx.mem.write(Target::Vram, pte_addr(n), &v).unwrap();
                        match mode {
                            ShadowMode::Eager => {
                                black_box(sp.tlb_flush(cx, Some(PDB)));
                            }
                            ShadowMode::Lazy => {
                                black_box(sp.tlb_flush(cx, Some(PDB)));
                                black_box(sp.before_submit(cx, PDB));
                            }
                            _ => sp.guest_wrote(cx, Target::Vram, pte_addr(n), 8),
                        }
                    }
                })
            })
        });
        // The change really reached the shadow.
        let va = n * mmu::SMALL_PAGE_SIZE;
        let want = DATA + n * mmu::SMALL_PAGE_SIZE + if flip { mmu::SMALL_PAGE_SIZE } else { 0 };
        let got = vm.with(|sp, cx| sp.translate(cx, PDB, va)).map(|t| t.addr);
        assert_eq!(got, Some(want), "{mode}");
    }
    g.finish();
}

fn pv_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("shadow_pv_batch");
    let mut vm = Vm::attached(ShadowMode::Pv);
    for size in [128u64, pv::MAX_BATCH as u64] {
        let batches: [Vec<Op>; 2] =
            [false, true].map(|flip| (0..size).map(|i| write_pte_op(i * 5, flip)).collect());
        let mut k = 0;
        g.throughput(Throughput::Elements(size));
        g.bench_function(BenchmarkId::from_parameter(size), |b| {
            b.iter(|| {
                k ^= 1;
                let out = vm.with(|sp, cx| sp.pv_apply(cx, &batches[k]));
                assert_eq!(out.error, 0);
                black_box(out.applied)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, build, update_one_pte, pv_batch);
criterion_main!(benches);
