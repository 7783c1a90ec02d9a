//! End to end through the device model: the unchanged guest driver in N VMs (one thread each),
//! each on its own `Vgpu` with its own guest RAM, all sharing one simulated GF100 through a
//! `GpuHost`. Every workload (size 32) must verify with 1, 2, 4 and 8 VMs in every shadow mode,
//! with no violation, no physical fault or error, every doorbell dispatched and completed, and
//! nothing left allocated once the VMs are destroyed.

use gpuvm::clock::ClockKind;
use gpuvm::profile::ShadowMode;
use gpuvm_guest::workloads::Workload;
use gpuvm_guest::FenceMode;
use gpuvm_harness::{run_vms, VirtOptions, VirtReport};

fn run(shadow: ShadowMode, vms: usize, clock: ClockKind, fence_mode: FenceMode) -> VirtReport {
    let r = run_vms(&VirtOptions {
        vms,
        size: 32,
        shadow,
        clock,
        fence_mode,
        ..VirtOptions::default()
    })
    .unwrap_or_else(|e| panic!("{shadow} x{vms}: {e}"));
    check(&r, shadow, vms);
    r
}

fn check(r: &VirtReport, shadow: ShadowMode, vms: usize) {
    let what = format!("{shadow} x{vms}");
    assert_eq!(r.vms.len(), vms, "{what}");
    for vm in &r.vms {
        assert!(
            vm.init.verified,
            "{what} vm{}: init {:?}",
            vm.vm, vm.init.error
        );
        let names: Vec<&str> = vm.workloads.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, Workload::ALL.map(|w| w.name()), "{what}");
        for w in &vm.workloads {
            assert!(w.verified, "{what} vm{} {}: {:?}", vm.vm, w.name, w.error);
            assert!(w.gpu_ns > 0, "{what} vm{} {}: no GPU time", vm.vm, w.name);
        }
        let s = &vm.stats;
        assert_eq!(
            s.violations.total, 0,
            "{what} vm{}: {:?}",
            vm.vm, s.violations
        );
        assert_eq!(s.by_class.denied.total(), 0, "{what}");
        assert_eq!(
            s.faults_delivered + s.bar_faults + s.pbdma_errors_delivered,
            0
        );
        // One channel for the whole suite: its setup submission plus one per workload.
        assert_eq!(s.channel_binds, 1, "{what} vm{}", vm.vm);
        assert_eq!(s.doorbells, 1 + Workload::ALL.len() as u64, "{what}");
        assert_eq!(s.submissions, s.doorbells, "{what}");
        assert_eq!(s.completions, s.submissions, "{what}: {s:?}");
        assert_eq!(s.aborted, 0, "{what}");
        assert!(s.exits.bar0.writes > 0 && s.exits.bar3.writes > 0, "{what}");
        assert!(s.by_class.userd.writes >= s.doorbells, "{what}");
        match shadow {
            ShadowMode::Eager | ShadowMode::Lazy => {
                assert!(s.shadow.rebuilds > 0, "{what}: {:?}", s.shadow)
            }
            ShadowMode::Incremental => assert!(s.shadow.entry_updates > 0, "{what}"),
            ShadowMode::Pv => {
                assert!(s.pv_batches > 0, "{what}: the driver used the PV interface");
                assert_eq!(s.pv_batches, s.shadow.pv_batches, "{what}");
            }
        }
        if shadow != ShadowMode::Pv {
            // The driver probed the PV interface once and found nothing.
            assert_eq!(s.by_class.unknown.reads, 1, "{what}");
        }
    }
    let h = &r.host;
    assert_eq!(h.vms, 0, "{what}");
    assert_eq!(h.vram_free, h.vram_assignable, "{what}: VRAM leaked");
    assert_eq!(h.channels_free, 128, "{what}: channels leaked");
    assert_eq!(
        h.hypervisor_vram_used, h.hypervisor_vram_host,
        "{what}: shadow structures leaked"
    );
    assert_eq!((h.queued, h.inflight), (0, 0), "{what}");
    assert_eq!(h.completed, h.dispatched, "{what}");
    assert_eq!(h.aborted, 0, "{what}");
    assert_eq!(h.unrouted + h.phys_fifo_errors + h.phys_faults, 0, "{what}");
    let g = &h.gpu;
    assert_eq!(
        (g.mmu_faults, g.pbdma_errors, g.sched_errors, g.dma_errors),
        (0, 0, 0, 0),
        "{what}"
    );
    assert_eq!(g.bad_register_reads + g.bad_register_writes, 0, "{what}");
}

fn scale(shadow: ShadowMode) {
    for vms in [1, 2, 4, 8] {
        run(shadow, vms, ClockKind::Sim, FenceMode::Poll);
    }
}

#[test]
fn eager_with_1_2_4_8_vms() {
    scale(ShadowMode::Eager);
}

#[test]
fn lazy_with_1_2_4_8_vms() {
    scale(ShadowMode::Lazy);
}

#[test]
fn incremental_with_1_2_4_8_vms() {
    scale(ShadowMode::Incremental);
}

#[test]
fn pv_with_1_2_4_8_vms() {
    scale(ShadowMode::Pv);
}

#[test]
fn interrupt_fences_in_every_mode() {
    for shadow in ShadowMode::ALL {
        let r = run(shadow, 3, ClockKind::Sim, FenceMode::Interrupt);
        for vm in &r.vms {
            assert!(
                vm.stats.nonstall_delivered > 0,
                "{shadow}: completions reached vm{} as non-stall interrupts",
                vm.vm
            );
        }
        assert!(r.host.phys_nonstall > 0);
        // A simulated clock is the callers' to move: nothing reports from the GPU's side.
        assert_eq!(r.host.gpu_events, 0, "{shadow}");
    }
}

#[test]
fn real_clock() {
    for (shadow, fences) in [
        (ShadowMode::Lazy, FenceMode::Interrupt),
        (ShadowMode::Incremental, FenceMode::Poll),
    ] {
        let r = run(shadow, 2, ClockKind::Real, fences);
        // The engine worker reported the work it finished (the host's service became due at
        // once instead of at the next event it had been told).
        assert!(r.host.gpu_events > 0, "{shadow} {fences:?}");
    }
}

#[test]
fn every_mode_gives_the_same_results_and_exits() {
    // Same driver, same work: the modes differ in how shadows are kept, not in what the guest
    // does (its writes are identical; the number of fence polls depends on timing).
    let runs: Vec<VirtReport> = [ShadowMode::Eager, ShadowMode::Lazy, ShadowMode::Incremental]
        .into_iter()
        .map(|m| run(m, 2, ClockKind::Sim, FenceMode::Poll))
        .collect();
    let exits = |r: &VirtReport| {
        let e = r.vms[0].stats.exits;
        (e.bar0.writes, e.bar1.writes, e.bar3.writes)
    };
    assert_eq!(exits(&runs[0]), exits(&runs[1]));
    assert_eq!(exits(&runs[1]), exits(&runs[2]));
    let gpu_ns = |r: &VirtReport| -> Vec<u64> {
        r.vms[0].workloads.iter().map(|w| w.fence_gpu_ns).collect()
    };
    assert_eq!(gpu_ns(&runs[0]), gpu_ns(&runs[2]));
}

#[test]
fn polls_that_find_nothing_due_change_nothing_but_the_lock() {
    // One VM on the simulated clock is deterministic: with the fast path (a poll while the host
    // has nothing due returns under the VM's lock alone) and without it (every poll takes the
    // host lock and services the GPU), the guest must see the same GPU times and make the same
    // accesses.
    for fence_mode in [FenceMode::Poll, FenceMode::Interrupt] {
        same_with_and_without_idle_polls(fence_mode);
    }
}

fn same_with_and_without_idle_polls(fence_mode: FenceMode) {
    let run = |fast: bool| {
        let r = run_vms(&VirtOptions {
            vms: 1,
            size: 48,
            shadow: ShadowMode::Incremental,
            fence_mode,
            host: gpuvm::host::HostConfig {
                local_fast_path: fast,
                ..gpuvm::host::HostConfig::default()
            },
            ..VirtOptions::default()
        })
        .expect("run");
        check(&r, ShadowMode::Incremental, 1);
        r.vms.into_iter().next().expect("one VM")
    };
    let (fast, slow) = (run(true), run(false));
    assert!(
        fast.stats.idle_polls > 0,
        "{fence_mode:?}: no poll found the host idle"
    );
    assert_eq!(slow.stats.idle_polls, 0);
    let seen = |vm: &gpuvm_harness::VmReport| -> Vec<(u64, u64, u64, u64)> {
        vm.workloads
            .iter()
            .map(|w| (w.gpu_ns, w.fence_gpu_ns, w.mmio_reads, w.mmio_writes))
            .collect()
    };
    assert_eq!(seen(&fast), seen(&slow), "{fence_mode:?}");
    assert_eq!(fast.stats.exits, slow.stats.exits, "{fence_mode:?}");
    assert_eq!(fast.stats.completions, slow.stats.completions);
    assert_eq!(fast.stats.nonstall_delivered, slow.stats.nonstall_delivered);
}
