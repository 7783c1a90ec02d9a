//! Snapshot, restore and live migration of a vGPU between two simulated GPUs in one process,
//! with the unmodified guest driver running its workloads before and after the move.

use std::sync::Arc;

use gpuvm::clock::{Clock, SimClock};
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::migrate::{self, LiveOptions};
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, Gpu};
use gpuvm_harness::hal::InProcessHal;
use gpuvm_harness::MovableVgpu;
use gpuvm_sim::{SimConfig, SimGpu};
use vm_memory::{GuestAddress, GuestMemoryMmap};

const RAM: usize = 32 << 20;

fn host(clock: &Arc<SimClock>) -> GpuHost {
    let gpu: Arc<dyn PhysicalGpu> = Arc::new(SimGpu::new(SimConfig {
        vram_size: 1 << 30,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let h = GpuHost::new(gpu, HostConfig::default()).unwrap();
    h.set_clock(clock.clone());
    h
}

fn profile(shadow: ShadowMode) -> VgpuProfile {
    VgpuProfile {
        name: "mover".into(),
        vram_mib: 128,
        channels: 8,
        weight: 1,
        shadow,
    }
}

type Drv = Gpu<InProcessHal<MovableVgpu>>;

fn run_all(drv: &mut Drv) {
    for w in [
        Workload::Madd,
        Workload::MemcpyHtod,
        Workload::MemcpyDtoh,
        Workload::Fmadd,
    ] {
        let r = workloads::run(drv, w, 32).unwrap();
        assert!(r.verified, "{w:?}");
    }
}

#[test]
fn a_snapshot_restored_on_another_gpu_goes_on_verifying() {
    for mode in [ShadowMode::Lazy, ShadowMode::Eager, ShadowMode::Pv] {
        let clock = Arc::new(SimClock::new());
        let (a, b) = (host(&clock), host(&clock));
        // Another VM on the destination first: the mover gets another slice and other
        // physical channels there.
        let _other = b.create_vgpu(&profile(mode)).unwrap();
        let v = a.create_vgpu(&profile(mode)).unwrap();
        let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM)]).unwrap();
        v.attach_guest_memory(ram.clone()).unwrap();
        let dev = MovableVgpu::new(v.clone());
        let c: Arc<dyn Clock> = clock.clone();
        let hal = InProcessHal::with_device(dev.clone(), c, ram.clone(), 0, RAM as u64);
        let mut drv = Gpu::init(hal, DriverConfig::default()).unwrap();
        run_all(&mut drv);

        dev.pause();
        let mut buf = Vec::new();
        let st = migrate::snapshot(&a, &v, &*clock, 1_000_000_000, &mut buf).unwrap();
        assert!(st.pages > 0);
        let v2 = migrate::restore(&b, &buf[..], Some(ram.clone())).unwrap();
        assert_ne!(v2.vram_slice().base, v.vram_slice().base, "{mode:?}");
        assert_ne!(v2.phys_channels(), v.phys_channels(), "{mode:?}");
        dev.switch_to(v2.clone());
        a.destroy_vgpu(&v).unwrap();
        run_all(&mut drv);
        assert_eq!(v2.stats().violations.total, 0, "{mode:?}");
    }
}

#[test]
fn live_migration_moves_a_running_vm() {
    let clock = Arc::new(SimClock::new());
    let (a, b) = (host(&clock), host(&clock));
    let v = a.create_vgpu(&profile(ShadowMode::Lazy)).unwrap();
    let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM)]).unwrap();
    v.attach_guest_memory(ram.clone()).unwrap();
    let dev = MovableVgpu::new(v.clone());
    let c: Arc<dyn Clock> = clock.clone();
    let hal = InProcessHal::with_device(dev.clone(), c, ram.clone(), 0, RAM as u64);
    let guest = std::thread::spawn(move || {
        let mut drv = Gpu::init(hal, DriverConfig::default()).unwrap();
        let mut done = 0;
        for i in 0..40 {
            let w = Workload::ALL[i % Workload::ALL.len()];
            let r = workloads::run(&mut drv, w, 32).unwrap();
            assert!(r.verified, "{w:?} run {i}");
            done += 1;
        }
        done
    });
    // Let the guest get going (the migration then finds work in flight).
    while v.stats().submissions < 5 {
        std::thread::yield_now();
    }
    let mut buf = Vec::new();
    let (p, u) = (dev.clone(), dev.clone());
    let stats = migrate::migrate_live(
        &a,
        &v,
        &*clock,
        LiveOptions::default(),
        &mut buf,
        &mut || p.pause(),
        &mut || u.unpause(),
    )
    .unwrap();
    assert!(stats.rounds.len() >= 2, "{stats:?}");
    let v2 = migrate::restore(&b, &buf[..], Some(ram.clone())).unwrap();
    dev.switch_to(v2.clone());
    a.destroy_vgpu(&v).unwrap();
    assert_eq!(guest.join().unwrap(), 40);
    assert!(
        v2.stats().submissions > 0,
        "the guest went on on the destination"
    );
    assert_eq!(v2.stats().violations.total, 0);
}
