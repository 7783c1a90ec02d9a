//! The hang watchdog (issue 6: "the watchdog recovers from a hung engine without touching other
//! VMs' work"). Two VMs run the real guest driver on one simulated GF100. VM 0 launches a loop
//! kernel of 2^60 iterations (modeled years of PGRAPH time); the host's watchdog resets the
//! engine and kills VM 0's channel, VM 0's driver sees PFIFO SCHED_ERROR 0x0a CTXSW_TIMEOUT and
//! its channel no longer runnable, while VM 1's memory stays bit-identical and its workloads —
//! queued behind the hung kernel — all complete and verify. Teardown gives everything back.

use gpuvm::clock::Clock;
use gpuvm::gf100::compute::Kernel;
use gpuvm::gf100::{host as hm, pfifo};
use gpuvm::host::{HostConfig, DEFAULT_WATCHDOG_NS};
use gpuvm::phys::{Bar, PhysicalGpu};
use gpuvm::profile::ShadowMode;
use gpuvm_guest::hal::Mmio;
use gpuvm_guest::{Channel, DriverError, MemLocation, PushBuf};

mod support;
use support::vgpu_rig::{run_suite, world as rig_world, Vm, World};

/// The watchdog of these tests: 200 ms of GPU time.
const WATCHDOG_NS: u64 = 200_000_000;
/// Iterations of the hung kernel.
const HUNG_ITERATIONS: u64 = 1 << 60;

fn world(watchdog_ns: u64) -> World {
    rig_world(HostConfig {
        watchdog_ns,
        ..HostConfig::default()
    })
}

impl World {
    fn vm(&self, name: &str) -> Vm {
        // Longer than the watchdog: the drivers must see the kill, not time out.
        self.vm_with(name, ShadowMode::Eager, 20 * WATCHDOG_NS)
    }
}

/// Opens a channel and launches the hung kernel on it (without waiting).
fn launch_hung(vm: &mut Vm) -> (Channel, gpuvm_guest::Fence) {
    let mut ch = vm.drv.channel_new().expect("channel");
    let out = vm
        .drv
        .buffer_new(ch.vm_mut(), 4096, MemLocation::Vram, true)
        .expect("buffer");
    let mut pb = PushBuf::new();
    pb.kernel(&Kernel::Loop {
        dst: out.va(),
        iterations: HUNG_ITERATIONS,
        seed: 7,
    });
    let f = vm.drv.submit(&mut ch, &pb).expect("submit");
    (ch, f)
}

/// Every engine's ENG_STATE, read register by register: what `PhysicalGpu::engine_states`
/// (the host's watchdog asks it at every service) must answer in one call.
fn eng_states_by_register(gpu: &dyn PhysicalGpu) -> [u32; pfifo::ENGINES as usize] {
    std::array::from_fn(|e| gpu.read_reg(pfifo::eng_state(e as u32)))
}

fn expect_ctxsw_timeout(r: Result<(), DriverError>) {
    match r {
        Err(DriverError::ChannelError { code, .. }) if code == pfifo::SCHED_ERR_CTXSW_TIMEOUT => {}
        other => panic!("expected SCHED_ERROR CTXSW_TIMEOUT, got {other:?}"),
    }
}

fn state_of(vm: &mut Vm, ch: &Channel) -> u32 {
    vm.drv
        .hal_mut()
        .read32(Bar::Bar0, u64::from(pfifo::chan_state(ch.chid())))
}

#[test]
fn default_watchdog_is_two_seconds() {
    assert_eq!(HostConfig::default().watchdog_ns, DEFAULT_WATCHDOG_NS);
    assert_eq!(DEFAULT_WATCHDOG_NS, 2_000_000_000);
}

#[test]
fn watchdog_kills_only_the_hung_channel() {
    let w = world(WATCHDOG_NS);
    let mut vm0 = w.vm("hung");
    let mut vm1 = w.vm("innocent");
    run_suite(&mut vm1);
    w.settle();
    let fp1 = w.fingerprint(&vm1);
    let t0 = w.clock.now_ns();

    // 1. The hung kernel occupies PGRAPH; the host's next event is the watchdog's deadline.
    let (mut ch, f) = launch_hung(&mut vm0);
    // Past the command fetch, into the kernel.
    w.clock.advance(1_000_000);
    vm0.vgpu.poll();
    let p = vm0.vgpu.phys_channels().start + ch.chid();
    let eng = w.gpu.read_reg(pfifo::eng_state(hm::ENGINE_PGRAPH));
    assert_eq!(eng, pfifo::ENG_STATE_BUSY | p, "PGRAPH runs VM 0's channel");
    assert_eq!(w.gpu.engine_states(), eng_states_by_register(&*w.gpu));
    assert_eq!(w.host.stats().inflight, 1);
    let next = w.host.next_event_ns().expect("a deadline");
    assert!(
        next <= w.clock.now_ns() + WATCHDOG_NS + 32,
        "next event {next} is the watchdog, not the kernel's end"
    );

    // 2. VM 0's driver waits; the watchdog kills the channel; the driver sees CTXSW_TIMEOUT.
    expect_ctxsw_timeout(vm0.drv.fence_wait(&mut ch, f));
    assert!(w.clock.now_ns() - t0 >= WATCHDOG_NS);
    assert!(w.clock.now_ns() - t0 < 2 * WATCHDOG_NS);
    assert_eq!(state_of(&mut vm0, &ch) & pfifo::STATE_RUNNABLE, 0);
    // The guest cannot make it runnable again (only unbinding and rebinding does).
    vm0.drv.hal_mut().write32(
        Bar::Bar0,
        u64::from(pfifo::chan_state(ch.chid())),
        pfifo::STATE_RUNNABLE,
    );
    assert_eq!(state_of(&mut vm0, &ch) & pfifo::STATE_RUNNABLE, 0);
    assert_eq!(w.gpu.read_reg(pfifo::eng_state(hm::ENGINE_PGRAPH)), 0);
    assert_eq!(w.gpu.engine_states(), eng_states_by_register(&*w.gpu));
    let s0 = vm0.vgpu.stats();
    assert_eq!(s0.watchdog_kills, 1);
    assert_eq!(s0.aborted, 1);
    let hs = w.host.stats();
    assert_eq!(hs.watchdog_kills, 1);
    assert_eq!(hs.gpu.engine_aborts, 1);
    assert_eq!(hs.phys_fifo_errors, 0);
    assert_eq!((hs.inflight, hs.queued), (0, 0));
    // The hung time is VM 0's.
    let sched = w.host.sched_stats();
    let gpu0 = sched.vms.iter().find(|v| v.vm == vm0.vgpu.id()).unwrap();
    assert!(gpu0.busy_ns >= WATCHDOG_NS, "{sched:?}");
    assert_eq!(w.fingerprint(&vm1), fp1, "VM 1's memory changed");

    // 3. Again, with VM 1's work queued behind the hung kernel: it all completes and verifies.
    let (ch2, _f2) = launch_hung(&mut vm0);
    let busy1 = w.gpu.channel_busy_ns(vm1.vgpu.phys_channels().start);
    let c1 = vm1.vgpu.stats().completions;
    run_suite(&mut vm1);
    let s1 = vm1.vgpu.stats();
    assert!(s1.completions > c1);
    assert_eq!(s1.watchdog_kills, 0);
    assert_eq!(s1.aborted, 0);
    assert_eq!(s1.violations.total, 0);
    assert_eq!(
        s1.faults_delivered + s1.bar_faults + s1.pbdma_errors_delivered,
        0
    );
    assert!(w.gpu.channel_busy_ns(vm1.vgpu.phys_channels().start) >= busy1);
    assert_eq!(w.host.stats().watchdog_kills, 2);
    assert_eq!(vm0.vgpu.stats().watchdog_kills, 2);
    assert!(w.host.stats().gpu.busy_ns > 0);

    // 4. Teardown: the killed channels free normally, and nothing leaks.
    vm0.drv.channel_free(ch).ok();
    vm0.drv.channel_free(ch2).ok();
    w.settle();
    w.host.destroy_vgpu(&vm0.vgpu).unwrap();
    w.host.destroy_vgpu(&vm1.vgpu).unwrap();
    let hs = w.host.stats();
    assert_eq!(hs.vms, 0);
    assert_eq!(hs.channels_free, 128);
    assert_eq!(hs.vram_free, hs.vram_assignable);
    assert_eq!(hs.hypervisor_vram_used, hs.hypervisor_vram_host);
    assert_eq!((hs.inflight, hs.queued), (0, 0));
    assert_eq!(hs.gpu.engine_aborts, 2);
}

#[test]
fn watchdog_off_leaves_the_kernel_running() {
    let w = world(0);
    let mut vm0 = w.vm("hung");
    let (_ch, _f) = launch_hung(&mut vm0);
    vm0.vgpu.poll();
    w.clock.advance(10 * DEFAULT_WATCHDOG_NS);
    w.host.poll();
    let hs = w.host.stats();
    assert_eq!(hs.watchdog_kills, 0);
    assert_eq!(hs.inflight, 1);
    assert!(w.host.next_event_ns().unwrap() > w.clock.now_ns() + 1_000_000_000);
}

/// Launches a loop kernel of `ns` of modeled GPU time on `ch` (without waiting).
fn launch_for(vm: &mut Vm, ch: &mut Channel, out: u64, ns: u64) -> gpuvm_guest::Fence {
    let cost = gpuvm_sim::CostModel::default();
    let iterations = (ns - cost.kernel_launch_ns) * 1000 / cost.loop_iteration_ps;
    let mut pb = PushBuf::new();
    pb.kernel(&Kernel::Loop {
        dst: out,
        iterations,
        seed: 3,
    });
    vm.drv.submit(ch, &pb).expect("submit")
}

#[test]
fn kernels_rung_back_to_back_are_no_hang_however_long_together() {
    // Six kernels of 0.4 watchdog each, rung one after another on one channel: the last five
    // merge into one dispatch (a doorbell rung while the channel is busy joins its queued
    // submission) that runs 2 watchdogs, no kernel near one. Once that dispatch has run half a
    // watchdog the host asks the channel off the GPU; the kernel running ends well within half
    // a watchdog of the ask and the rest is queued again: all complete, nothing is killed.
    let w = world(WATCHDOG_NS);
    let mut vm = w.vm("back-to-back");
    let mut ch = vm.drv.channel_new().expect("channel");
    let out = vm
        .drv
        .buffer_new(ch.vm_mut(), 4096, MemLocation::Vram, true)
        .expect("buffer")
        .va();
    let t0 = w.clock.now_ns();
    let f: Vec<_> = (0..6)
        .map(|_| launch_for(&mut vm, &mut ch, out, WATCHDOG_NS * 4 / 10))
        .collect();
    vm.drv.fence_wait(&mut ch, f[5]).expect("all six complete");
    assert!(w.clock.now_ns() - t0 >= WATCHDOG_NS * 24 / 10);
    assert_eq!(vm.vgpu.stats().watchdog_kills, 0);
    assert_eq!(w.host.stats().watchdog_kills, 0);

    // A hung kernel behind a short one, rung together: still killed, a watchdog after its
    // dispatch (asked off at half a watchdog, it never leaves). The short kernel is dispatched
    // at once; the hung one, queued behind it, when it completes 0.25 watchdog later — so the
    // kill comes 1.25 watchdogs after the two were rung, plus the launches' and the fence
    // polls' few ms (simulated clock: the same every run).
    let t1 = w.clock.now_ns();
    launch_for(&mut vm, &mut ch, out, WATCHDOG_NS / 4);
    let mut pb = PushBuf::new();
    pb.kernel(&Kernel::Loop {
        dst: out,
        iterations: HUNG_ITERATIONS,
        seed: 7,
    });
    let hung = vm.drv.submit(&mut ch, &pb).expect("submit");
    expect_ctxsw_timeout(vm.drv.fence_wait(&mut ch, hung));
    let waited = w.clock.now_ns() - t1;
    assert!(
        (WATCHDOG_NS * 5 / 4..=WATCHDOG_NS * 5 / 4 + WATCHDOG_NS / 20).contains(&waited),
        "killed {waited} ns after the two were rung"
    );
    assert_eq!(vm.vgpu.stats().watchdog_kills, 1);
}
