//! The guest driver's para-virtual page-table path (`gpuvm_guest::Paravirt`, `gf100::pv`) end to
//! end.
//!
//! In a VM whose profile uses `shadow = "pv"` (through `gpuvm_harness::virt::VirtHal`), every
//! workload runs with `Paravirt::Required` and verifies; the driver's batches are exactly the ones
//! the vGPU applied, nothing is rejected, and the shadows are never rebuilt by scanning: the only
//! full build of a shadow is the one when a channel binding first names the page directory.
//! In any other profile the interface is not offered, and without a vGPU in between (straight on
//! the simulated GF100 through `gpuvm_harness::native::NativeHal`) neither: `Paravirt::Auto`
//! must stay native without a trace, and `Paravirt::Required` must fail at init with a clear
//! error.

use std::sync::Arc;

use gpuvm::addr::{Gpa, Iova};
use gpuvm::clock::{Clock, ClockKind};
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::vgpu::{Vgpu, VgpuStats};
use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, DriverError, FenceMode, Gpu, Paravirt, PvStats};
use gpuvm_harness::native::NativeHal;
use gpuvm_harness::virt::{run_vms, VirtHal, VirtOptions};
use gpuvm_sim::{SimConfig, SimGpu};
use vm_memory::{GuestAddress, GuestMemoryMmap};

const VRAM: u64 = 1 << 30;
const GUEST_RAM: u64 = 64 << 20;

fn native_hal() -> NativeHal {
    let clock: Arc<dyn Clock> = ClockKind::Sim.create();
    let gpu: Arc<dyn PhysicalGpu> = Arc::new(SimGpu::new(SimConfig {
        vram_size: VRAM,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), GUEST_RAM as usize)])
        .expect("guest RAM");
    gpu.map_dma(Iova(0), GUEST_RAM, mem.clone(), Gpa(0))
        .expect("DMA window");
    NativeHal::new(gpu, clock, mem, 0, GUEST_RAM)
}

fn config(paravirt: Paravirt) -> DriverConfig {
    DriverConfig {
        paravirt,
        timeout_ns: 5_000_000_000,
        ..DriverConfig::default()
    }
}

#[test]
fn native_auto_stays_native() {
    let mut off = Gpu::init(native_hal(), config(Paravirt::Off)).expect("init (Off)");
    let mut auto = Gpu::init(native_hal(), config(Paravirt::Auto)).expect("init (Auto)");
    assert!(
        !auto.paravirt_active(),
        "the simulator offers no PV interface"
    );
    assert!(!off.paravirt_active());
    // No batch buffer, and exactly one extra BAR access: the ID read.
    assert_eq!(auto.dma_free(), off.dma_free());
    let (a, o) = (auto.hal().counts(), off.hal().counts());
    assert_eq!((a.reads, a.writes), (o.reads + 1, o.writes));
    for w in Workload::ALL {
        let r = workloads::run(&mut auto, w, 32).unwrap_or_else(|e| panic!("{}: {e}", w.name()));
        assert!(r.verified, "{}", w.name());
        let r = workloads::run(&mut off, w, 32).unwrap_or_else(|e| panic!("{}: {e}", w.name()));
        assert!(r.verified, "{}", w.name());
    }
    assert_eq!(auto.pv_stats(), PvStats::default());
    // From there on, the same traffic as with the interface off.
    let (a2, o2) = (auto.hal().counts(), off.hal().counts());
    assert_eq!(
        (a2.reads - a.reads, a2.writes - a.writes),
        (o2.reads - o.reads, o2.writes - o.writes)
    );
    assert_eq!(auto.hal().dma_errors(), 0);
}

#[test]
fn native_required_fails_clearly() {
    match Gpu::init(native_hal(), config(Paravirt::Required)) {
        Err(e @ DriverError::ParavirtUnavailable { id }) => {
            assert_eq!(id, gpuvm::gf100::BAD_REGISTER);
            let msg = e.to_string();
            assert!(
                msg.contains("not offered") && msg.contains("0x1f00000"),
                "{msg}"
            );
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("Paravirt::Required must fail without a vGPU offering it"),
    }
}

/// One VM with `shadow` mode on a fresh simulated GPU, and the driver brought up in it.
struct Vm {
    host: GpuHost,
    vgpu: Arc<Vgpu>,
    drv: Result<Gpu<VirtHal>, DriverError>,
}

fn vm(shadow: ShadowMode, paravirt: Paravirt, fence_mode: FenceMode) -> Vm {
    let clock: Arc<dyn Clock> = ClockKind::Sim.create();
    let sim: Arc<dyn PhysicalGpu> = Arc::new(SimGpu::new(SimConfig {
        vram_size: 2 << 30,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let host = GpuHost::new(sim, HostConfig::default()).expect("host");
    let vgpu = host
        .create_vgpu(&VgpuProfile {
            name: format!("{shadow}"),
            vram_mib: 512,
            channels: 8,
            weight: 1,
            shadow,
        })
        .expect("vGPU");
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), GUEST_RAM as usize)])
        .expect("guest RAM");
    vgpu.attach_guest_memory(mem.clone())
        .expect("attach guest RAM");
    let hal = VirtHal::new(vgpu.clone(), clock, mem, 0, GUEST_RAM);
    let drv = Gpu::init(
        hal,
        DriverConfig {
            fence_mode,
            ..config(paravirt)
        },
    );
    Vm { host, vgpu, drv }
}

/// The vGPU applied the PV batches and never rebuilt a shadow by scanning: its only full builds
/// are the initial ones when a channel binding names a page directory.
fn assert_pv_only(what: &str, s: &VgpuStats) {
    assert!(s.pv_batches > 0, "{what}: no PV batches: {s:?}");
    assert_eq!(s.shadow.pv_batches, s.pv_batches, "{what}");
    assert!(s.shadow.entry_updates > 0, "{what}: {s:?}");
    assert!(
        s.shadow.rebuilds <= s.channel_binds,
        "{what}: {} shadow rebuilds for {} channel binds: {s:?}",
        s.shadow.rebuilds,
        s.channel_binds
    );
    assert_eq!(s.violations.total, 0, "{what}: {:?}", s.violations);
    assert_eq!(s.shadow.violations, 0, "{what}");
    assert_eq!(s.aborted, 0, "{what}");
}

#[test]
fn every_workload_in_a_pv_vm() {
    for fence_mode in [FenceMode::Poll, FenceMode::Interrupt] {
        let Vm { host, vgpu, drv } = vm(ShadowMode::Pv, Paravirt::Required, fence_mode);
        let mut drv = drv.unwrap_or_else(|e| panic!("init ({fence_mode:?}): {e}"));
        assert!(drv.paravirt_active());
        for size in [32u32, 64] {
            for w in Workload::ALL {
                let r = workloads::run(&mut drv, w, size)
                    .unwrap_or_else(|e| panic!("{} size {size} ({fence_mode:?}): {e}", w.name()));
                assert!(r.verified, "{} size {size} ({fence_mode:?})", w.name());
            }
        }
        workloads::release_channel(&mut drv).expect("channel teardown");
        let p = drv.pv_stats();
        let s = vgpu.stats();
        assert_pv_only(&format!("{fence_mode:?}"), &s);
        // Every batch the driver sent was applied, in full.
        assert_eq!(p.failed_batches, 0);
        assert_eq!(p.batches, s.pv_batches, "{p:?} {s:?}");
        assert!(p.pte_ops > 0 && p.flushes > 0, "{p:?}");
        assert_eq!(p.ops, p.pde_ops + p.pte_ops + p.flushes);
        assert_eq!(drv.hal().dma_errors(), 0);
        host.destroy_vgpu(&vgpu).expect("destroy");
    }
}

#[test]
fn pv_vms_side_by_side() {
    let opts = |shadow, paravirt| VirtOptions {
        vms: 2,
        size: 32,
        shadow,
        phys_vram: 2 << 30,
        driver: config(paravirt),
        ..VirtOptions::default()
    };
    let r = run_vms(&opts(ShadowMode::Pv, Paravirt::Required)).expect("run");
    assert_eq!(r.vms.len(), 2);
    for vm in &r.vms {
        assert!(vm.all_verified(), "{vm:?}");
        assert_pv_only(&format!("vm{}", vm.vm), &vm.stats);
    }
    // The same run with lazy shadows (no interface: Auto stays native) rebuilds by scanning,
    // so the check above means something.
    let r = run_vms(&opts(ShadowMode::Lazy, Paravirt::Auto)).expect("run");
    for vm in &r.vms {
        assert!(vm.all_verified(), "{vm:?}");
        assert_eq!(vm.stats.pv_batches, 0);
        assert!(
            vm.stats.shadow.rebuilds > vm.stats.channel_binds,
            "{:?}",
            vm.stats
        );
    }
}

#[test]
fn the_interface_follows_the_profile() {
    // Auto uses it where offered.
    let v = vm(ShadowMode::Pv, Paravirt::Auto, FenceMode::Poll);
    assert!(v.drv.as_ref().expect("init").paravirt_active());
    // Other profiles do not offer it: Auto stays native, Required fails at init.
    for shadow in [ShadowMode::Eager, ShadowMode::Lazy, ShadowMode::Incremental] {
        let Vm { vgpu, drv, .. } = vm(shadow, Paravirt::Auto, FenceMode::Poll);
        let mut drv = drv.unwrap_or_else(|e| panic!("init ({shadow}): {e}"));
        assert!(!drv.paravirt_active(), "{shadow}");
        let r = workloads::run(&mut drv, Workload::Madd, 32).expect("madd");
        assert!(r.verified, "{shadow}");
        assert_eq!(drv.pv_stats(), PvStats::default());
        assert_eq!(vgpu.stats().pv_batches, 0);
        match vm(shadow, Paravirt::Required, FenceMode::Poll).drv {
            Err(DriverError::ParavirtUnavailable { id }) => {
                assert_eq!(id, gpuvm::gf100::BAD_REGISTER, "{shadow}")
            }
            Err(e) => panic!("{shadow}: unexpected error {e}"),
            Ok(_) => panic!("{shadow}: Required must fail without the interface"),
        }
    }
}
