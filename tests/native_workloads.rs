//! End to end: the guest driver (`gpuvm-guest`) straight on the simulated GF100 through
//! `gpuvm_harness::native::NativeHal`. Every workload at sizes 32 and 64, with the simulated and
//! the real clock, with polled and interrupt-driven fences, must verify against its CPU
//! reference, without MMU faults, PBDMA or scheduling errors, or stray DMA. Further tests cover
//! the driver's other configurations and its error path (an MMU fault is reported, not hung on).

use std::sync::Arc;

use gpuvm::addr::{Gpa, Iova};
use gpuvm::clock::{Clock, ClockKind};
use gpuvm::phys::PhysicalGpu;
use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{
    DriverConfig, DriverError, FenceMode, Gpu, InstAccess, MemLocation, PushBuf, ReleaseSize,
};
use gpuvm_harness::native;
use gpuvm_sim::{SimConfig, SimGpu};
use native::NativeHal;
use vm_memory::{GuestAddress, GuestMemoryMmap};

const VRAM: u64 = 1 << 30;
const GUEST_RAM: u64 = 64 << 20;

/// A fresh simulated GPU with guest RAM mapped for DMA at IOVA == GPA, and the HAL over it.
fn platform(clock: ClockKind) -> (Arc<dyn PhysicalGpu>, NativeHal) {
    let clock: Arc<dyn Clock> = clock.create();
    let gpu: Arc<dyn PhysicalGpu> = Arc::new(SimGpu::new(SimConfig {
        vram_size: VRAM,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), GUEST_RAM as usize)])
        .expect("guest RAM");
    gpu.map_dma(Iova(0), GUEST_RAM, mem.clone(), Gpa(0))
        .expect("DMA window");
    let hal = NativeHal::new(gpu.clone(), clock, mem, 0, GUEST_RAM);
    (gpu, hal)
}

fn config(fence_mode: FenceMode) -> DriverConfig {
    DriverConfig {
        fence_mode,
        timeout_ns: 5_000_000_000,
        ..DriverConfig::default()
    }
}

/// Runs every workload at sizes 32 and 64 on one driver instance and checks everything.
fn suite(clock: ClockKind, cfg: DriverConfig) {
    let (gpu, hal) = platform(clock);
    let mode = cfg.fence_mode;
    let mut drv = Gpu::init(hal, cfg).unwrap_or_else(|e| panic!("init ({clock:?}, {mode:?}): {e}"));
    assert_eq!(drv.vram_size(), VRAM);
    assert_eq!(drv.fence_mode(), mode, "NativeHal has interrupts");
    let vram_free = drv.vram_free();
    let dma_free = drv.dma_free();
    for size in [32u32, 64] {
        for w in Workload::ALL {
            let r = workloads::run(&mut drv, w, size)
                .unwrap_or_else(|e| panic!("{} size {size} ({clock:?}, {mode:?}): {e}", w.name()));
            assert_eq!(r.workload, w);
            assert!(
                r.verified,
                "{} size {size} ({clock:?}, {mode:?}) did not verify",
                w.name()
            );
            assert!(
                r.gpu_ns > 0,
                "{} size {size}: no GPU time between the timestamps",
                w.name()
            );
            let n = size as u64 * size as u64 * 4;
            let want = match w {
                Workload::MemcpyHtod | Workload::MemcpyDtoh => n,
                Workload::Loop => 4,
                _ => 3 * n,
            };
            assert_eq!(r.bytes, want, "{}", w.name());
        }
    }
    // Everything a workload allocated was returned (the channel stays for reuse).
    workloads::release_channel(&mut drv).expect("channel teardown");
    assert_eq!(drv.vram_free(), vram_free, "VRAM leaked");
    assert_eq!(drv.dma_free(), dma_free, "guest RAM leaked");
    let stats = gpu.stats();
    assert_eq!(stats.mmu_faults, 0, "{stats:?}");
    assert_eq!(stats.pbdma_errors, 0, "{stats:?}");
    assert_eq!(stats.sched_errors, 0, "{stats:?}");
    assert_eq!(stats.dma_errors, 0, "{stats:?}");
    assert_eq!(drv.hal().dma_errors(), 0);
    // Interrupt fences really slept on the interrupt line; polling never raised it.
    let edges = drv.hal().irq().rising_edges();
    match mode {
        FenceMode::Interrupt => assert!(edges > 0, "no interrupt was delivered"),
        FenceMode::Poll => assert_eq!(edges, 0, "a polling driver leaves the line masked"),
    }
    assert!(stats.engine_ops > 0 && stats.gpfifo_entries > 0);
}

#[test]
fn all_workloads_sim_clock_polling() {
    suite(ClockKind::Sim, config(FenceMode::Poll));
}

#[test]
fn all_workloads_sim_clock_interrupts() {
    suite(ClockKind::Sim, config(FenceMode::Interrupt));
}

#[test]
fn all_workloads_real_clock_polling() {
    suite(ClockKind::Real, config(FenceMode::Poll));
}

#[test]
fn all_workloads_real_clock_interrupts() {
    suite(ClockKind::Real, config(FenceMode::Interrupt));
}

/// Size 256 puts every VRAM buffer at 256 KiB, so it is mapped with 128 KiB large pages
/// (large-page tables in the channel VM); the check must still pass for every workload.
#[test]
fn large_pages_at_size_256() {
    let (gpu, hal) = platform(ClockKind::Sim);
    let mut drv = Gpu::init(hal, config(FenceMode::Poll)).expect("init");
    for w in Workload::ALL {
        let r = workloads::run(&mut drv, w, 256).unwrap_or_else(|e| panic!("{}: {e}", w.name()));
        assert!(r.verified, "{}", w.name());
    }
    let s = gpu.stats();
    assert_eq!(
        (s.mmu_faults, s.pbdma_errors, s.sched_errors),
        (0, 0, 0),
        "{s:?}"
    );
}

/// The non-default placements: PRAMIN-only instance memory, 4-byte fences, semaphores in guest
/// RAM, pushbuffers in VRAM (written through BAR1), small pages only, a tiny GPFIFO ring and
/// pushbuffer so both wrap many times.
#[test]
fn alternate_driver_configurations() {
    for fence_mode in [FenceMode::Poll, FenceMode::Interrupt] {
        let cfg = DriverConfig {
            fence_mode,
            timeout_ns: 5_000_000_000,
            semaphore_mem: MemLocation::Sysram,
            pushbuf_mem: MemLocation::Vram,
            inst_access: InstAccess::Pramin,
            fence_release: ReleaseSize::Short,
            large_pages: false,
            gpfifo_entries: 4,
            pushbuf_bytes: 0x2000,
            paravirt: gpuvm_guest::Paravirt::Auto,
        };
        let (gpu, hal) = platform(ClockKind::Sim);
        let mut drv = Gpu::init(hal, cfg).expect("init");
        for _ in 0..3 {
            for w in Workload::ALL {
                let r =
                    workloads::run(&mut drv, w, 32).unwrap_or_else(|e| panic!("{}: {e}", w.name()));
                assert!(r.verified, "{}", w.name());
            }
        }
        // Many submissions of ~1.2 KiB: the 4-entry GPFIFO and the 8 KiB pushbuffer wrap many
        // times; each submission leaves its own mark, so an overwritten segment would show.
        let mut ch = drv.channel_new().expect("channel");
        let mut last = None;
        for i in 0..64u32 {
            let mut pb = PushBuf::new();
            pb.method_ni(0, gpuvm::gf100::host::NOP, &[0; 300]);
            pb.semaphore_release(ch.query_va(i), 1000 + i, false, false);
            pb.non_stall_interrupt();
            last = Some(drv.submit(&mut ch, &pb).expect("submit"));
        }
        drv.fence_wait(&mut ch, last.expect("fence")).expect("wait");
        for i in 0..64u32 {
            assert_eq!(drv.query_value(&ch, i).expect("read"), 1000 + i);
        }
        drv.channel_free(ch).expect("free");
        let s = gpu.stats();
        assert_eq!(
            (s.mmu_faults, s.pbdma_errors, s.sched_errors),
            (0, 0, 0),
            "{s:?}"
        );
    }
}

/// A copy from an unmapped VA is reported as an MMU fault naming the VA (not a hang), the
/// workload channel is replaced, and the next workloads still run.
#[test]
fn mmu_faults_are_reported_not_hung_on() {
    for fence_mode in [FenceMode::Poll, FenceMode::Interrupt] {
        let (_gpu, hal) = platform(ClockKind::Sim);
        let mut drv = Gpu::init(hal, config(fence_mode)).expect("init");
        let mut ch = drv.channel_new().expect("channel");
        let dst = drv
            .buffer_new(ch.vm_mut(), 0x1000, MemLocation::Vram, false)
            .expect("buffer");
        let bad = 0x33_0000_0000u64;
        let mut pb = PushBuf::new();
        pb.copy(bad, dst.va(), 0x1000);
        let f = drv.submit(&mut ch, &pb).expect("submit");
        match drv.fence_wait(&mut ch, f) {
            Err(DriverError::MmuFault { va, reason, .. }) => {
                assert_eq!(va & !0xfff, bad, "{fence_mode:?}");
                assert_eq!(reason, gpuvm::gf100::fault::REASON_PT_NOT_PRESENT);
            }
            other => panic!("{fence_mode:?}: expected an MMU fault, got {other:?}"),
        }
        assert!(ch.is_broken());
        assert!(
            drv.submit(&mut ch, &PushBuf::new()).is_err(),
            "a broken channel takes no work"
        );
        drv.buffer_free(ch.vm_mut(), dst).expect("free buffer");
        drv.channel_free(ch).expect("free channel");

        // A method on a subchannel with no object is a PBDMA error naming the channel.
        let mut ch = drv.channel_new().expect("channel");
        let mut pb = PushBuf::new();
        pb.method(7, 0x400, &[1]);
        let f = drv.submit(&mut ch, &pb).expect("submit");
        match drv.fence_wait(&mut ch, f) {
            Err(DriverError::PbdmaError { intr, chid, .. }) => {
                assert_ne!(intr & gpuvm::gf100::pfifo::PBDMA_INTR_ILLEGAL_MTHD, 0);
                assert_eq!(chid, ch.chid());
            }
            other => panic!("{fence_mode:?}: expected a PBDMA error, got {other:?}"),
        }
        drv.channel_free(ch).expect("free channel");
        for w in [Workload::Madd, Workload::Loop] {
            let r = workloads::run(&mut drv, w, 32).expect("workload after a fault");
            assert!(r.verified);
        }
    }
}

/// `run_native`, the harness entry point the CLI uses, verifies every workload too.
#[test]
fn run_native_verifies() {
    use native::{run_native, NativeOptions};
    let report = run_native(&NativeOptions {
        size: 32,
        ..NativeOptions::default()
    })
    .expect("native run");
    assert!(report.all_verified(), "{:?}", report.workloads);
    assert_eq!(report.workloads.len(), Workload::ALL.len());
}
