//! Density and churn: 64 VMs on one simulated GF100 at once (DMA windows sized from their
//! RAM, channels and VRAM split 64 ways), and a short soak — lives created, run, destroyed,
//! recreated and killed mid-run — whose end checks must all pass. Timings are not asserted
//! (the long runs and their numbers are in docs/experiments.md).

use std::time::Duration;

use gpuvm::clock::ClockKind;
use gpuvm::profile::ShadowMode;
use gpuvm_guest::workloads::Workload;
use gpuvm_harness::soak::{run_soak, SoakOptions, SoakRig};
use gpuvm_harness::{run_vms, VirtOptions};

#[test]
fn sixty_four_vms_share_one_gpu_and_each_verifies() {
    let r = run_vms(&VirtOptions {
        vms: 64,
        size: 16,
        shadow: ShadowMode::Incremental,
        clock: ClockKind::Sim,
        workloads: vec![Workload::Madd, Workload::MemcpyDtoh],
        guest_ram: 4 << 20,
        ..VirtOptions::default()
    })
    .unwrap_or_else(|e| panic!("64 VMs: {e}"));
    assert_eq!(r.vms.len(), 64);
    for vm in &r.vms {
        assert!(vm.init.verified, "vm{}: init {:?}", vm.vm, vm.init.error);
        assert_eq!(vm.workloads.len(), 2);
        for w in &vm.workloads {
            assert!(w.verified, "vm{} {}: {:?}", vm.vm, w.name, w.error);
        }
        assert_eq!(vm.stats.violations.total, 0, "vm{}", vm.vm);
    }
    // Every VM had its own channels and slice; all of it came back.
    assert_eq!(r.host.vms, 0);
    assert_eq!(r.host.channels_free, 128);
    assert_eq!(r.host.vram_free, r.host.vram_assignable);
    assert_eq!(r.host.iova_free, (1u64 << 40) - (1 << 20));
    assert_eq!(r.host.phys_fifo_errors + r.host.unrouted, 0);
}

#[test]
fn a_short_soak_with_kills_passes_every_check() {
    let rig = SoakRig::new(3, ClockKind::Sim).unwrap();
    let opts = SoakOptions {
        slots: 3,
        duration: Duration::from_secs(6),
        workloads: vec![Workload::Madd, Workload::MemcpyHtod, Workload::Mmul],
        size: 32,
        kill_one_in: 3,
        sample_every: Duration::from_millis(200),
        // Few lives in a short run: a slot is starved only below a quarter of the mean.
        min_share: 0.25,
        guest_ram: 4 << 20,
        ..SoakOptions::default()
    };
    let r = run_soak(&rig, &opts, &|_| {}, &|_, _, _, _| {}).unwrap();
    for (name, ok) in &r.checks {
        assert!(
            ok,
            "check failed: {name}; unexpected: {:?}; report: {r:#?}",
            r.unexpected
        );
    }
    let lives: u64 = r.slots.iter().map(|s| s.lives).sum();
    let killed: u64 = r.slots.iter().map(|s| s.killed).sum();
    assert!(lives > 3, "VMs were recreated: {lives} lives");
    assert!(killed > 0, "some lives were killed mid-run: {r:#?}");
    assert_eq!(r.end, r.baseline);
    assert!(r.samples.len() >= 2);
}
