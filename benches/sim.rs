//! Benchmarks of the simulated GF100, driven like `tests/sim.rs` purely through its hardware
//! interface (BAR0 registers, the BAR1 aperture, the VRAM backdoor), with the shared test rig.
//!
//! Groups:
//! * `mmio`: BAR0 register access (`read_reg` / `write_reg`), including the bad-register path.
//! * `mmu_bar1`: 4-byte BAR1 aperture reads with a TLB hit (`tlb_hit`) and after a HUB_ONLY TLB
//!   flush of the BAR1 VM (`tlb_miss_walk`: flush + miss + page walk). `flush_other_vm_then_hit`
//!   does the same two flush register writes for an unrelated page directory, so the read still
//!   hits: `tlb_miss_walk - flush_other_vm_then_hit` is the cost of the walk (and TLB refill).
//!   Round-robin over more pages than the TLB holds is not possible here: the sim's TLB holds
//!   65,536 translations (`mmu::TLB_CAPACITY`), more than BAR1 (128 MiB = 32,768 pages) has.
//!   4 KiB aperture reads and 4-byte / 4 KiB `read_vram` (backdoor, no MMU) are references.
//! * `codec`: `gf100::method::Header::decode` and `gf100::gpfifo::GpEntry::decode` over 64 KiB
//!   of realistic pushbuffer words / GPFIFO entries.
//! * `gpfifo_e2e`: one GPFIFO entry of N host methods, submitted by a GP_PUT doorbell through
//!   BAR1 and run to completion (GP_GET == GP_PUT) with `CostModel::instant()`. `nop_incr` and
//!   `set_reference` use one incrementing header per method (2 dwords a method, as nouveau emits
//!   host methods), `nop_non_incr` one non-incrementing header for all N (1 dword a method);
//!   `nop_incr/1` is the fixed cost of a submission.
//!
//! Run: `cargo bench --bench sim -- --warm-up-time 1 --measurement-time 2`. Under
//! `cargo test --all-targets` criterion runs every benchmark once, so setup is kept cheap
//! (256 MiB of lazily allocated VRAM).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpuvm::addr::HostVram;
use gpuvm::gf100::compute::Kernel;
use gpuvm::gf100::gpfifo::GpEntry;
use gpuvm::gf100::method::{self, Header};
use gpuvm::gf100::{self as hw, host, pffb, pmc, ptimer, Target};
use gpuvm::phys::{Bar, PhysicalGpu};
use gpuvm_sim::{CostModel, SimConfig, SimGpu};

#[path = "../tests/support/mod.rs"]
mod support;

use support::sim_rig::*;

/// VRAM of every benchmarked GPU (allocated lazily in 64 KiB chunks).
const VRAM: u64 = 256 << 20;

// ------------------------------------------------------------------------------------------------
// Registers
// ------------------------------------------------------------------------------------------------

/// A register in a block the model does not implement (PGRAPH): the bad-register path.
const UNKNOWN_REG: u32 = 0x40_0000;

fn mmio(c: &mut Criterion) {
    let g = SimGpu::new(SimConfig {
        vram_size: VRAM,
        ..SimConfig::default()
    });
    assert_eq!(g.read_reg(pmc::BOOT_0), pmc::BOOT_0_QUADRO_6000);
    assert_eq!(g.read_reg(UNKNOWN_REG), hw::BAD_REGISTER);

    let mut group = c.benchmark_group("mmio");
    group.bench_function("read_pmc_boot_0", |b| {
        b.iter(|| g.read_reg(black_box(pmc::BOOT_0)))
    });
    group.bench_function("read_ptimer_time_low", |b| {
        b.iter(|| g.read_reg(black_box(ptimer::TIME_LOW)))
    });
    group.bench_function("write_pmc_intr_en_host", |b| {
        b.iter(|| g.write_reg(black_box(pmc::INTR_EN_HOST), pmc::INTR_EN_HARDWARE))
    });
    group.bench_function("read_unknown_register", |b| {
        b.iter(|| g.read_reg(black_box(UNKNOWN_REG)))
    });
    group.finish();
}

// ------------------------------------------------------------------------------------------------
// MMU: BAR1 reads with and without a TLB hit
// ------------------------------------------------------------------------------------------------

/// BAR1 VA of the benchmarked page (the rig maps the USERD area at BAR1 VA 0).
const BAR1_PAGE_VA: u64 = 0x10_0000;

/// A rig whose BAR1 VM maps [`BAR1_PAGE_VA`] onto a written VRAM page; returns the rig, the
/// page's VRAM address and an unrelated (empty) page directory for baseline flushes.
fn bar1_rig() -> (Rig, u64, u64) {
    let mut r = Rig::with_config(CostModel::instant(), VRAM);
    let page = r.alloc(0x1000, 0x1000);
    let data: Vec<u8> = (0..0x1000u32).map(|i| i as u8).collect();
    r.gpu.write_vram(HostVram(page), &data);
    let vm = r.bar1.clone();
    r.bar1 = r.map_range(&vm, BAR1_PAGE_VA, page, 0x1000, Target::Vram);
    let other = r.vm();
    (r, page, other.pd)
}

/// nouveau's TLB flush of a BAR VM: VSPACE, then trigger PAGE_ALL | HUB_ONLY.
fn flush_hub(r: &Rig, pd: u64) {
    r.gpu.write_reg(
        pffb::TLB_FLUSH_VSPACE,
        pffb::vspace_encode(pd, Target::Vram),
    );
    r.gpu.write_reg(
        pffb::TLB_FLUSH_TRIGGER,
        pffb::FLUSH_TRIGGER | pffb::FLUSH_PAGE_ALL | pffb::FLUSH_HUB_ONLY,
    );
}

fn bar1_read4(r: &Rig) -> u32 {
    let mut b = [0u8; 4];
    r.gpu
        .read_aperture(Bar::Bar1, black_box(BAR1_PAGE_VA + 0x10), &mut b);
    u32::from_le_bytes(b)
}

/// Runs `op` once and checks the TLB hits / misses / flushes it caused.
fn expect_tlb(r: &Rig, op: impl FnOnce(), hits: u64, misses: u64, flushes: u64) {
    let s0 = r.gpu.stats();
    op();
    let s1 = r.gpu.stats();
    assert_eq!(
        (
            s1.tlb_hits - s0.tlb_hits,
            s1.tlb_misses - s0.tlb_misses,
            s1.tlb_flushes - s0.tlb_flushes
        ),
        (hits, misses, flushes),
        "TLB (hits, misses, flushes)"
    );
}

fn mmu_bar1(c: &mut Criterion) {
    let (r, page, other_pd) = bar1_rig();
    let bar1_pd = r.bar1.pd;
    let want = 0x1312_1110;
    assert_eq!(bar1_read4(&r), want);
    // The benchmarks measure what they claim to.
    expect_tlb(&r, || assert_eq!(bar1_read4(&r), want), 1, 0, 0);
    expect_tlb(
        &r,
        || {
            flush_hub(&r, bar1_pd);
            assert_eq!(bar1_read4(&r), want);
        },
        0,
        1,
        1,
    );
    expect_tlb(
        &r,
        || {
            flush_hub(&r, other_pd);
            assert_eq!(bar1_read4(&r), want);
        },
        1,
        0,
        1,
    );

    let mut group = c.benchmark_group("mmu_bar1");
    group.throughput(Throughput::Bytes(4));
    group.bench_function("tlb_hit", |b| b.iter(|| bar1_read4(&r)));
    group.bench_function("tlb_miss_walk", |b| {
        b.iter(|| {
            flush_hub(&r, bar1_pd);
            bar1_read4(&r)
        })
    });
    group.bench_function("flush_other_vm_then_hit", |b| {
        b.iter(|| {
            flush_hub(&r, other_pd);
            bar1_read4(&r)
        })
    });
    group.bench_function("read_vram_4b", |b| {
        b.iter(|| {
            let mut buf = [0u8; 4];
            r.gpu.read_vram(HostVram(black_box(page + 0x10)), &mut buf);
            u32::from_le_bytes(buf)
        })
    });

    group.throughput(Throughput::Bytes(0x1000));
    let mut buf = vec![0u8; 0x1000];
    group.bench_function("aperture_4k_tlb_hit", |b| {
        b.iter(|| {
            r.gpu
                .read_aperture(Bar::Bar1, black_box(BAR1_PAGE_VA), &mut buf);
            buf[0x10]
        })
    });
    group.bench_function("read_vram_4k", |b| {
        b.iter(|| {
            r.gpu.read_vram(HostVram(black_box(page)), &mut buf);
            buf[0x10]
        })
    });
    group.finish();
}

// ------------------------------------------------------------------------------------------------
// Codecs: pushbuffer headers and GPFIFO entries
// ------------------------------------------------------------------------------------------------

/// 64 KiB of codec input.
const CODEC_BYTES: usize = 64 << 10;

/// 64 KiB of pushbuffer words as the driver emits them: object binds, copies, kernel launches,
/// semaphore releases, reference updates, non-incrementing NOP runs and immediates, repeated,
/// padded with immediate NOPs. Method boundaries are kept, so the stream can be walked.
fn realistic_pushbuffer() -> Vec<u32> {
    let units: Vec<Vec<u32>> = vec![
        bind_copy(),
        bind_compute(),
        copy(DATA_VA, DATA_VA + 0x10_0000, 0x1000, 0x1000, 0x1000, 16, 0),
        launch_kernel(&Kernel::Memset {
            dst: DATA_VA,
            bytes: 0x1000,
            value: 0,
        }),
        launch_kernel(&Kernel::Madd {
            a: DATA_VA,
            b: DATA_VA + 0x1000,
            c: DATA_VA + 0x2000,
            n: 1024,
        }),
        release4(DATA_VA + 0x20_0000, 7),
        mthd(0, host::SET_REFERENCE, &[42]),
        [
            vec![method::non_incr(0, host::NOP, 8)],
            vec![0; 8],
            vec![method::immediate(0, host::NON_STALL_INTERRUPT, 0)],
        ]
        .concat(),
    ];
    let n = CODEC_BYTES / 4;
    let mut words = Vec::with_capacity(n);
    'fill: loop {
        for u in &units {
            if words.len() + u.len() > n {
                break 'fill;
            }
            words.extend_from_slice(u);
        }
    }
    words.resize(n, method::immediate(0, host::NOP, 0));
    words
}

/// 64 KiB of GPFIFO entries: consecutive segments of varied length in a pushbuffer at a 40-bit
/// VA, some with NO_CONTEXT_SWITCH or SYNC set.
fn realistic_gpfifo() -> Vec<u64> {
    let lengths = [2u32, 6, 14, 30, 64, 5, 1024, 9, 2048, 3];
    let mut va = 0x12_0000_0000u64;
    (0..CODEC_BYTES / 8)
        .map(|i| {
            let mut e = GpEntry::new(va, lengths[i % lengths.len()]);
            e.no_context_switch = i % 7 == 0;
            e.sync_wait = i % 13 == 0;
            va += e.length_dwords as u64 * 4;
            e.encode()
        })
        .collect()
}

/// Walks a pushbuffer as the PBDMA does: decode a header, skip its data words.
fn walk_pushbuffer(words: &[u32]) -> u64 {
    let (mut i, mut acc) = (0usize, 0u64);
    while i < words.len() {
        match Header::decode(words[i]) {
            Ok(h) => {
                if let Header::Methods { method, .. } | Header::Immediate { method, .. } = h {
                    acc = acc.wrapping_add(method as u64);
                }
                i += 1 + h.data_words() as usize;
            }
            Err(_) => i += 1,
        }
    }
    acc
}

fn codec(c: &mut Criterion) {
    let pb = realistic_pushbuffer();
    let ib = realistic_gpfifo();
    assert_eq!((pb.len() * 4, ib.len() * 8), (CODEC_BYTES, CODEC_BYTES));
    assert!(pb.iter().all(|&w| Header::decode(w).is_ok()));
    assert!(ib.iter().all(|&e| GpEntry::decode(e).is_ok()));

    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Bytes(CODEC_BYTES as u64));
    group.bench_function("header_decode_stream_64k", |b| {
        b.iter(|| walk_pushbuffer(black_box(&pb)))
    });
    group.bench_function("header_decode_every_word_64k", |b| {
        b.iter(|| {
            black_box(&pb)
                .iter()
                .fold(0u32, |acc, &w| match Header::decode(w) {
                    Ok(h) => acc.wrapping_add(h.data_words()),
                    Err(_) => acc.wrapping_add(1),
                })
        })
    });
    group.bench_function("gp_entry_decode_64k", |b| {
        b.iter(|| {
            black_box(&ib)
                .iter()
                .fold(0u64, |acc, &raw| match GpEntry::decode(raw) {
                    Ok(e) => acc.wrapping_add(e.va ^ e.length_dwords as u64),
                    Err(_) => acc.wrapping_add(1),
                })
        })
    });
    group.finish();
}

// ------------------------------------------------------------------------------------------------
// GPFIFO end to end: doorbell, fetch, decode, execute
// ------------------------------------------------------------------------------------------------

/// Methods in the large entries.
const E2E_METHODS: u32 = 4096;

/// A channel (chid 0, in the runlist) whose pushbuffer holds `words` and whose whole GPFIFO ring
/// points at it, so every doorbell that advances GP_PUT by one runs `words` once.
fn e2e_channel(words: &[u32]) -> (Rig, Chan) {
    assert!(words.len() as u64 * 4 <= PB_SIZE);
    let mut r = Rig::with_config(CostModel::instant(), VRAM);
    let c = r.channel(0);
    r.runlist(&[0]);
    r.gpu.write_vram(HostVram(c.pb_pa), &words_le(words));
    let entry = GpEntry::new(PB_VA, words.len() as u32).encode();
    let ring: Vec<u8> = (0..IB_ENTRIES).flat_map(|_| entry.to_le_bytes()).collect();
    r.gpu.write_vram(HostVram(c.ib_pa), &ring);
    (r, c)
}

/// Submits the next ring entry with a GP_PUT doorbell and runs the GPU until GP_GET catches up.
fn run_entry(r: &Rig, c: &mut Chan) {
    c.put = (c.put + 1) % IB_ENTRIES;
    r.doorbell(c);
    r.settle();
    assert_eq!(r.gp_get(c), c.put, "the entry completed");
}

fn gpfifo_e2e(c: &mut Criterion) {
    let n = E2E_METHODS;
    let one_per_header =
        |m: u32, data: u32| -> Vec<u32> { (0..n).flat_map(|_| mthd(0, m, &[data])).collect() };
    let cases: Vec<(&str, u32, Vec<u32>)> = vec![
        ("nop_incr", 1, mthd(0, host::NOP, &[0])),
        ("nop_incr", n, one_per_header(host::NOP, 0)),
        (
            "nop_non_incr",
            n,
            [vec![method::non_incr(0, host::NOP, n)], vec![0; n as usize]].concat(),
        ),
        ("set_reference", n, one_per_header(host::SET_REFERENCE, 7)),
    ];

    let mut group = c.benchmark_group("gpfifo_e2e");
    for (name, methods, words) in cases {
        let (r, mut ch) = e2e_channel(&words);
        let before = r.gpu.stats();
        run_entry(&r, &mut ch);
        let after = r.gpu.stats();
        assert_eq!(after.methods - before.methods, methods as u64, "{name}");
        assert_eq!(after.gpfifo_entries - before.gpfifo_entries, 1);
        assert!(r.runnable(&ch));

        group.throughput(Throughput::Elements(methods as u64));
        group.bench_function(BenchmarkId::new(name, methods), |b| {
            b.iter(|| run_entry(&r, &mut ch))
        });
        assert_eq!(r.gpu.stats().pbdma_errors, 0);
    }
    group.finish();
}

criterion_group!(benches, mmio, mmu_bar1, codec, gpfifo_e2e);
criterion_main!(benches);
