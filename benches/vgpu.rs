//! Benchmarks of the virtual GPU's trap paths (`gpuvm::vgpu`), each next to the same access on
//! the bare simulated GF100 so the cost of the device model is the ratio of the two.
//!
//! One host (`GpuHost`, FIFO scheduler, `CostModel::instant()`) with one VM in eager shadow mode,
//! brought up by the real guest driver through `VirtHal` (PMC, PFIFO, BAR1/BAR3, one channel
//! bound, on the runlist and running). "bare" accesses go straight to the host's physical GPU
//! (`PhysicalGpu::write_reg` / `read_reg` / `write_aperture`), i.e. the same simulated GPU in
//! the same state, without the device model; the values written are the ones already there,
//! so the host is not disturbed.
//!
//! Groups:
//! * `vgpu_bar0`: one 4-byte BAR0 register access. `trapped` = `Vgpu::bar_write` / `bar_read`:
//!   the host lock, the region-table lookup, the handler, the exit counters, the host's
//!   after-access service (no interrupt pending, nothing queued) and the interrupt-line
//!   recomputation. Registers: `write_pmc_intr_en_host` (virtual: per-VM state only),
//!   `write_pffb_tlb_flush_vspace` (a stored TLB-flush argument; the region table classes it
//!   virtual, the flush itself happens on the trigger write), `write_pfifo_chan_state`
//!   (shadowed: guest channel -> physical channel, masked, written to the GPU) and
//!   `read_pmc_boot_0` (virtual). `bare` = the same register on the physical GPU (for CHAN_STATE,
//!   the physical channel the guest's channel maps to). `local` = the same access once the host
//!   has its clock (`GpuHost::set_clock`, as in every experiment), so that it takes the fast
//!   path (`host::local`: the VM's lock alone, no service; the two virtual writes and the read).
//! * `vgpu_bar1`: a 4-byte read of a buffer through the guest's BAR1 page tables (`trapped`,
//!   and `local` on the fast path) against the same word read from VRAM (`bare`).
//! * `vgpu_doorbell`: the guest's GP_PUT write into its USERD page in BAR1.
//!   - `same_put/trapped`: GP_PUT rewritten with the value it has (no new work): trap, BAR1 poll
//!     area lookup, USERD emulation, doorbell effect that finds nothing to submit.
//!   - `nop_entry/trapped`: **doorbell to dispatch**. Every entry of the channel's GPFIFO ring
//!     names the same 2-dword segment (one NOP host method); one iteration advances GP_PUT by
//!     one with `Vgpu::bar_write(Bar1, ..)` and times exactly that call: the trap, the USERD
//!     emulation (virtual GP_PUT recorded), the `Submission` handed to the FIFO scheduler, the
//!     scheduler's pick, the dispatch (`before_submit` — nothing to rebuild in eager mode —, the
//!     MEM_OP scan of the one new entry and its segment through the shadow translation and guest
//!     RAM, the physical GP_PUT written through the physical BAR1, the channel-state read),
//!     and — because the simulator runs due work inside every call and the cost model is
//!     instant — the simulated GPU fetching and executing the entry. Outside the timed part the
//!     iteration polls the host (which retires the completed submission, so every timed call
//!     starts with nothing in flight) and checks GP_GET.
//!   - `nop_entry/bare`: the same entry on the same GPU without the device model: the physical
//!     GP_PUT write through the physical BAR1 plus one `poll` (the GPU fetches and executes the
//!     entry); the host's USERD page and ring of that physical channel are the ones the trapped
//!     case dispatches to. GP_GET is checked outside the timed part.
//!
//! Run: `cargo bench --bench vgpu -- --warm-up-time 1 --measurement-time 2`. Under
//! `cargo test --all-targets` criterion runs every benchmark once; setup is one driver bring-up
//! and one channel per group, on 512 MiB of lazily allocated VRAM.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpuvm::clock::{Clock, SimClock};
use gpuvm::gf100::gpfifo::GpEntry;
use gpuvm::gf100::mmu::{self, Pde, Pte};
use gpuvm::gf100::{host as hm, inst, method, pffb, pfifo, pmc, userd, Target};
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::phys::{Bar, PhysicalGpu};
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::vgpu::Vgpu;
use gpuvm_guest::{Channel, DriverConfig, Gpu};
use gpuvm_harness::VirtHal;
use gpuvm_sim::{CostModel, SimConfig, SimGpu};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const RAM: u64 = 16 << 20;
/// Offset in the channel's pushbuffer ring of the benchmarks' NOP segment (the driver used only
/// the first few dozen bytes for its class bindings).
const NOP_SEG: u64 = 0x8000;

/// The host, the VM and its driver with one channel, and what the benchmarks need to know about
/// that channel.
struct Setup {
    host: GpuHost,
    /// The simulated clock, given to the host only by [`Setup::fast_path`].
    clock: Arc<dyn Clock>,
    vgpu: Arc<Vgpu>,
    drv: Gpu<VirtHal>,
    _ram: GuestMemoryMmap,
    ch: Channel,
    /// Physical channel of the driver's channel.
    phys_chid: u32,
    /// BAR1 offset of the channel's GP_PUT in the guest's USERD poll area.
    guest_gp_put: u64,
    /// GPFIFO ring entries, and the current GP_PUT.
    entries: u32,
    put: u32,
}

fn rd(v: &Vgpu, off: u32) -> u32 {
    let mut b = [0u8; 4];
    v.bar_read(Bar::Bar0, u64::from(off), &mut b);
    u32::from_le_bytes(b)
}

fn setup() -> Setup {
    let clock = Arc::new(SimClock::new());
    let gpu = Arc::new(SimGpu::new(SimConfig {
        vram_size: 512 << 20,
        clock: clock.clone(),
        cost: CostModel::instant(),
        ..SimConfig::default()
    }));
    let host = GpuHost::new(
        gpu,
        HostConfig {
            hypervisor_vram: 32 << 20,
            ..HostConfig::default()
        },
    )
    .unwrap();
    let vgpu = host
        .create_vgpu(&VgpuProfile {
            name: "bench".into(),
            vram_mib: 64,
            channels: 8,
            weight: 1,
            shadow: ShadowMode::Eager,
        })
        .unwrap();
    let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap();
    vgpu.attach_guest_memory(ram.clone()).unwrap();
    let clock: Arc<dyn Clock> = clock;
    let hal = VirtHal::new(vgpu.clone(), clock.clone(), ram.clone(), 0, RAM);
    let mut drv = Gpu::init(hal, DriverConfig::default()).expect("driver init");
    let mut ch = drv.channel_new().expect("channel");

    // Find the channel's rings as the driver laid them out: instance block from the channel
    // table, GPFIFO ring VA from RAMFC, the pushbuffer ring right before it; guest RAM behind
    // them from the channel's page tables (all read through PRAMIN).
    let g = ch.chid();
    let (inst_addr, _) = pfifo::chan_decode(rd(&vgpu, pfifo::chan_table(g))).unwrap();
    let ib_lo = drv.pramin_rd32(inst_addr + inst::RAMFC_IB_BASE_LO);
    let ib_cfg = drv.pramin_rd32(inst_addr + inst::RAMFC_IB_CONFIG);
    let (ib_va, order) = inst::ib_config_decode(ib_lo, ib_cfg);
    let push_va = ib_va - drv.config().pushbuf_bytes;
    let pd = ch.vm_mut().pd_addr();
    let gpa = |drv: &mut Gpu<VirtHal>, va: u64| -> u64 {
        let rd64 = |drv: &mut Gpu<VirtHal>, a: u64| {
            u64::from(drv.pramin_rd32(a)) | u64::from(drv.pramin_rd32(a + 4)) << 32
        };
        let pde = Pde::decode(rd64(drv, pd + mmu::pde_index(va) * mmu::ENTRY_SIZE));
        let spt = pde.small.expect("small-page table").addr;
        let pte = Pte::decode(rd64(drv, spt + mmu::spt_index(va) * mmu::ENTRY_SIZE))
            .unwrap()
            .expect("mapped");
        assert_eq!(pte.target, Target::SysCoherent);
        pte.addr + va % mmu::SMALL_PAGE_SIZE
    };

    // One NOP segment; every ring entry points at it.
    let seg = [method::incr(0, hm::NOP, 1), 0];
    let seg_bytes: Vec<u8> = seg.iter().flat_map(|w| w.to_le_bytes()).collect();
    let seg_gpa = gpa(&mut drv, push_va + NOP_SEG);
    ram.write_slice(&seg_bytes, GuestAddress(seg_gpa)).unwrap();
    let entries = 1u32 << order;
    let entry = GpEntry::new(push_va + NOP_SEG, seg.len() as u32).encode();
    for i in 0..u64::from(entries) {
        let at = gpa(&mut drv, ib_va + i * 8);
        ram.write_obj(entry, GuestAddress(at)).unwrap();
    }

    let poll = pfifo::userd_poll_decode(rd(&vgpu, pfifo::USERD_POLL_BASE)).unwrap();
    let guest_userd = poll + u64::from(g) * userd::SIZE;
    let mut b = [0u8; 4];
    vgpu.bar_read(Bar::Bar1, guest_userd + userd::GP_PUT, &mut b);
    let put = u32::from_le_bytes(b);
    let phys_chid = vgpu.phys_channels().start + g;
    let s = Setup {
        host,
        clock,
        vgpu,
        drv,
        _ram: ram,
        ch,
        phys_chid,
        guest_gp_put: guest_userd + userd::GP_PUT,
        entries,
        put,
    };
    assert_eq!(s.gp_get(), put, "the driver's work is done");
    s
}

impl Setup {
    /// Gives the host its clock: from now on accesses that involve only the VM take the fast
    /// path (`host::local`: the VM's lock alone) while nothing is due, as in every experiment.
    fn fast_path(&self) {
        self.host.set_clock(self.clock.clone());
    }

    fn phys(&self) -> &dyn PhysicalGpu {
        &**self.host.phys()
    }

    /// GP_GET as the guest sees it (the physical progress).
    fn gp_get(&self) -> u32 {
        let mut b = [0u8; 4];
        self.vgpu.bar_read(
            Bar::Bar1,
            self.guest_gp_put - userd::GP_PUT + userd::GP_GET,
            &mut b,
        );
        u32::from_le_bytes(b)
    }

    fn next_put(&mut self) -> [u8; 4] {
        self.put = (self.put + 1) % self.entries;
        self.put.to_le_bytes()
    }
}

fn bar0(c: &mut Criterion) {
    let s = setup();
    let v = &*s.vgpu;
    let phys = s.phys();
    let g = s.ch.chid();
    let state = rd(v, pfifo::chan_state(g));
    assert_ne!(state & pfifo::STATE_RUNNABLE, 0);
    let vspace = pffb::vspace_encode(0x20_0000, Target::Vram);
    let cases: [(&str, u32, u32, u32); 3] = [
        (
            "write_pmc_intr_en_host",
            pmc::INTR_EN_HOST,
            pmc::INTR_EN_HOST,
            pmc::INTR_EN_HARDWARE,
        ),
        (
            "write_pffb_tlb_flush_vspace",
            pffb::TLB_FLUSH_VSPACE,
            pffb::TLB_FLUSH_VSPACE,
            vspace,
        ),
        (
            "write_pfifo_chan_state",
            pfifo::chan_state(g),
            pfifo::chan_state(s.phys_chid),
            state,
        ),
    ];
    let before = v.stats();
    let mut group = c.benchmark_group("vgpu_bar0");
    for (name, guest_reg, phys_reg, value) in cases {
        let bytes = value.to_le_bytes();
        group.bench_function(BenchmarkId::new(name, "bare"), |b| {
            b.iter(|| phys.write_reg(black_box(phys_reg), black_box(value)))
        });
        group.bench_function(BenchmarkId::new(name, "trapped"), |b| {
            b.iter(|| v.bar_write(Bar::Bar0, black_box(u64::from(guest_reg)), &bytes))
        });
    }
    group.bench_function(BenchmarkId::new("read_pmc_boot_0", "bare"), |b| {
        b.iter(|| phys.read_reg(black_box(pmc::BOOT_0)))
    });
    group.bench_function(BenchmarkId::new("read_pmc_boot_0", "trapped"), |b| {
        b.iter(|| {
            let mut d = [0u8; 4];
            v.bar_read(Bar::Bar0, black_box(u64::from(pmc::BOOT_0)), &mut d);
            d
        })
    });
    // The same with the host's clock set: the fast path.
    s.fast_path();
    let fast_before = s.host.stats().fast_path_accesses;
    for (name, guest_reg, _, value) in &cases[..2] {
        let bytes = value.to_le_bytes();
        group.bench_function(BenchmarkId::new(*name, "local"), |b| {
            b.iter(|| v.bar_write(Bar::Bar0, black_box(u64::from(*guest_reg)), &bytes))
        });
    }
    group.bench_function(BenchmarkId::new("read_pmc_boot_0", "local"), |b| {
        b.iter(|| {
            let mut d = [0u8; 4];
            v.bar_read(Bar::Bar0, black_box(u64::from(pmc::BOOT_0)), &mut d);
            d
        })
    });
    group.finish();
    assert!(
        s.host.stats().fast_path_accesses > fast_before,
        "the local cases took the fast path"
    );

    // The accesses did what they should and nothing else.
    assert_eq!(rd(v, pmc::BOOT_0), pmc::BOOT_0_QUADRO_6000);
    assert_eq!(rd(v, pmc::INTR_EN_HOST), pmc::INTR_EN_HARDWARE);
    assert_eq!(rd(v, pffb::TLB_FLUSH_VSPACE), vspace);
    assert_eq!(rd(v, pfifo::chan_state(g)), state);
    assert_eq!(phys.read_reg(pmc::INTR_EN_HOST), pmc::INTR_EN_HARDWARE);
    let st = v.stats();
    assert_eq!(st.violations.total, 0, "{:?}", st.violations);
    assert_eq!(st.by_class.unknown, before.by_class.unknown);
    assert!(st.by_class.shadowed.writes > before.by_class.shadowed.writes);
}

fn doorbell(c: &mut Criterion) {
    let mut s = setup();
    let mut group = c.benchmark_group("vgpu_doorbell");

    let same = s.put.to_le_bytes();
    let before = s.vgpu.stats();
    group.bench_function(BenchmarkId::new("same_put", "trapped"), |b| {
        b.iter(|| {
            s.vgpu
                .bar_write(Bar::Bar1, black_box(s.guest_gp_put), &same)
        })
    });
    let after = s.vgpu.stats();
    assert_eq!(after.submissions, before.submissions, "no new work");
    assert!(after.doorbells > before.doorbells);

    let before = s.vgpu.stats();
    let mut n = 0u64;
    group.bench_function(BenchmarkId::new("nop_entry", "trapped"), |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                let put = s.next_put();
                let t = Instant::now();
                s.vgpu.bar_write(Bar::Bar1, black_box(s.guest_gp_put), &put);
                timed += t.elapsed();
                s.vgpu.poll();
                assert_eq!(s.gp_get(), s.put, "the entry ran");
            }
            n += iters;
            timed
        })
    });
    let after = s.vgpu.stats();
    assert_eq!(after.submissions - before.submissions, n);
    assert_eq!(after.completions - before.completions, n);
    assert_eq!(after.violations.total, 0);

    // The same entries, doorbell written by the host itself onto its USERD page of the physical
    // channel (what a dispatch writes), without the device model.
    let phys = s.host.phys().clone();
    let userd_phys_gp_put = {
        // The host maps its USERD pages at physical BAR1 VA 0, one page per physical channel.
        u64::from(s.phys_chid) * userd::SIZE + userd::GP_PUT
    };
    let before = phys.stats().gpfifo_entries;
    let mut m = 0u64;
    // Without the device model nobody enables the channel per submission (its RUNNABLE is the
    // host's, set only while a submission is in flight): the bare path enables it once.
    let state = phys.read_reg(pfifo::chan_state(s.phys_chid));
    phys.write_reg(
        pfifo::chan_state(s.phys_chid),
        state | pfifo::STATE_RUNNABLE,
    );
    group.bench_function(BenchmarkId::new("nop_entry", "bare"), |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                let put = s.next_put();
                let t = Instant::now();
                phys.write_aperture(Bar::Bar1, black_box(userd_phys_gp_put), &put);
                phys.poll();
                timed += t.elapsed();
                assert_eq!(s.gp_get(), s.put, "the entry ran");
            }
            m += iters;
            timed
        })
    });
    assert_eq!(phys.stats().gpfifo_entries - before, m);
    group.finish();

    // Hand the channel back in a state the device model agrees with (its virtual GP_PUT), so
    // the driver can tear it down.
    let put = s.put.to_le_bytes();
    s.vgpu.bar_write(Bar::Bar1, s.guest_gp_put, &put);
    s.vgpu.poll();
    let Setup { mut drv, ch, .. } = s;
    drv.channel_free(ch).unwrap();
}

/// `vgpu_bar1/read_aperture`: a 4-byte read of a VRAM buffer the driver mapped into BAR1 for
/// CPU access. `trapped` = `Vgpu::bar_read(Bar1, ..)`: the lock, the aperture walk through the
/// guest's BAR1 page tables (its software TLB after the first access) into the VM's slice, the
/// counters and the after-access service. `bare` = `PhysicalGpu::read_vram` of the same word
/// of the slice.
fn bar1(c: &mut Criterion) {
    let mut s = setup();
    let buf = s
        .drv
        .buffer_new(s.ch.vm_mut(), 1 << 20, gpuvm_guest::MemLocation::Vram, true)
        .expect("a CPU-visible VRAM buffer");
    let words: Vec<u32> = (0..64).map(|i| 0x5eed_0000 + i).collect();
    s.drv
        .buffer_write_words(&buf, 0, &words)
        .expect("write through BAR1");
    let bva = buf.bar1().expect("mapped into BAR1") + 4 * 7;
    let host_addr = s.vgpu.vram_slice().base.offset(buf.phys() + 4 * 7);
    let phys = s.host.phys().clone();
    let v = s.vgpu.clone();
    let before = v.stats();
    let mut group = c.benchmark_group("vgpu_bar1");
    group.bench_function(BenchmarkId::new("read_aperture", "bare"), |b| {
        b.iter(|| {
            let mut d = [0u8; 4];
            phys.read_vram(black_box(host_addr), &mut d);
            d
        })
    });
    group.bench_function(BenchmarkId::new("read_aperture", "trapped"), |b| {
        b.iter(|| {
            let mut d = [0u8; 4];
            v.bar_read(Bar::Bar1, black_box(bva), &mut d);
            d
        })
    });
    s.fast_path();
    let fast_before = s.host.stats().fast_path_accesses;
    group.bench_function(BenchmarkId::new("read_aperture", "local"), |b| {
        b.iter(|| {
            let mut d = [0u8; 4];
            v.bar_read(Bar::Bar1, black_box(bva), &mut d);
            d
        })
    });
    group.finish();
    assert!(
        s.host.stats().fast_path_accesses > fast_before,
        "the local case took the fast path"
    );
    let mut d = [0u8; 4];
    v.bar_read(Bar::Bar1, bva, &mut d);
    assert_eq!(
        u32::from_le_bytes(d),
        words[7],
        "the read went to the buffer"
    );
    let mut d = [0u8; 4];
    phys.read_vram(host_addr, &mut d);
    assert_eq!(
        u32::from_le_bytes(d),
        words[7],
        "the bare read names the same word"
    );
    let st = v.stats();
    assert_eq!(st.violations.total, before.violations.total);
    assert!(st.exits.bar1.reads > before.exits.bar1.reads);
}

criterion_group!(benches, bar0, doorbell, bar1);
criterion_main!(benches);
