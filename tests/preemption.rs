//! The scheduler governs all GPU time (issue "caps, shares and the watchdog hold for every
//! route by which work reaches an engine"). A tenant gets work onto an engine without a fresh
//! doorbell — resumed from a semaphore acquire, re-enabled, put back on its runlist — and the
//! tests check that the scheduler still decided it, charged it, capped it and bounded how long
//! it held the GPU. Each first shows it reached the condition it attacks (the acquire parked,
//! the release landed, the cap spent, the channel disabled mid-work).

use gpuvm::clock::Clock;
use gpuvm::gf100::compute::Kernel;
use gpuvm::gf100::{pfifo, userd};
use gpuvm::host::HostConfig;
use gpuvm::phys::{Bar, PhysicalGpu};
use gpuvm::profile::ShadowMode;
use gpuvm::sched::Policy;
use gpuvm_guest::hal::Mmio;
use gpuvm_guest::{MemLocation, PushBuf};
use gpuvm_harness::exp_isolation::{run_isolation, Adversary, IsolationOptions, KernelKind};

mod support;
use support::vgpu_rig::{loop_iterations_for, pass, world as rig_world, Vm, World};

const MS: u64 = 1_000_000;

fn phys_state(w: &World, vm: &Vm, g: u32) -> u32 {
    w.gpu
        .read_reg(pfifo::chan_state(vm.vgpu.phys_channels().start + g))
}

/// Finding 1 and its class: a tenant whose work resumes from semaphore acquires is held to its
/// cap under every policy — the cap is paid while the work runs and enforced by preemption.
#[test]
fn parked_work_is_held_to_its_cap_under_every_policy() {
    let opts = IsolationOptions {
        policies: vec![
            Policy::Band,
            Policy::Credit,
            Policy::Fifo,
            Policy::FixedShare,
        ],
        duration_ns: 6_000 * MS,
        adversary: Some(Adversary::Parked),
        caps: vec![(1, 100_000)],
        ..IsolationOptions::default()
    };
    let r = run_isolation(&opts, &mut |_| {}).expect("experiment");
    for p in &r.policies {
        let attacker = &p.vms[1];
        assert_eq!(attacker.plan.kind, KernelKind::Parked);
        // It reached the condition: its kernels left the scheduler parked and came back.
        assert!(attacker.resumes > 100, "{}: {attacker:?}", p.policy);
        assert!(attacker.preemptions > 0, "{}: cap never spent", p.policy);
        assert!(
            attacker.busy_fraction <= 0.11,
            "{}: the capped attacker ran {:.3} of the GPU",
            p.policy,
            attacker.busy_fraction
        );
        assert!(
            attacker.busy_fraction >= 0.08,
            "{}: far below its cap: {:.3}",
            p.policy,
            attacker.busy_fraction
        );
        assert_eq!(attacker.watchdog_kills, 0, "{}", p.policy);
        let a = p.accounting;
        assert_eq!(
            a.accounted_ns, a.channel_busy_ns,
            "{}: accounting",
            p.policy
        );
    }
}

/// Finding 2: under BAND with equal weights the tenant whose work resumes from acquires gets
/// its share and no more, and the victim's worst wait stays bounded by time slices.
#[test]
fn parked_work_gets_its_band_share_and_the_victim_waits_slices_not_seconds() {
    let opts = IsolationOptions {
        policies: vec![Policy::Band],
        duration_ns: 30_000 * MS,
        adversary: Some(Adversary::Parked),
        ..IsolationOptions::default()
    };
    let r = run_isolation(&opts, &mut |_| {}).expect("experiment");
    let p = &r.policies[0];
    let (victim, attacker) = (&p.vms[0], &p.vms[1]);
    assert!(attacker.resumes > 1000, "{attacker:?}");
    assert!(
        p.mean_error <= 0.02,
        "BAND's mean share error {:.4} under the parked adversary",
        p.mean_error
    );
    // A slice of the attacker's plus the kernel in flight at most, catch-up included.
    assert!(
        victim.worst_wait_all_ns <= 2 * opts.timeslice_ns,
        "victim waited {} ns over the whole run",
        victim.worst_wait_all_ns
    );
    assert!(
        victim.worst_wait_ns <= 2 * opts.timeslice_ns,
        "victim waited {} ns",
        victim.worst_wait_ns
    );
    let a = p.accounting;
    assert_eq!(a.accounted_ns, a.channel_busy_ns);
}

/// Finding 3: many parked channels releasing long kernels at once cannot multiply the
/// watchdog's bound into a victim's wait: the attacker's time slice ends by preemption after
/// the kernel in flight, and the victim runs.
#[test]
fn many_parked_channels_cannot_multiply_the_watchdog() {
    const WATCHDOG_NS: u64 = 100 * MS;
    const KERNEL_NS: u64 = 80 * MS;
    let cfg = HostConfig {
        watchdog_ns: WATCHDOG_NS,
        ..HostConfig::default()
    };
    let slice = cfg.timeslice_ns;
    let w = rig_world(cfg);
    let mut victim = w.vm_with("victim", ShadowMode::Lazy, 100 * WATCHDOG_NS);
    let mut attacker = w.vm_with("attacker", ShadowMode::Lazy, 100 * WATCHDOG_NS);
    let mut lanes = Vec::new();
    for _ in 0..12 {
        let mut ch = attacker.drv.channel_new().unwrap();
        let sem = attacker
            .drv
            .buffer_new(ch.vm_mut(), 4096, MemLocation::Vram, true)
            .unwrap();
        let out = attacker
            .drv
            .buffer_new(ch.vm_mut(), 4096, MemLocation::Vram, true)
            .unwrap();
        attacker.drv.buffer_wr32(&sem, 0, 0).unwrap();
        let mut pb = PushBuf::new();
        pb.semaphore_acquire_geq(sem.va(), 1);
        pb.kernel(&Kernel::Loop {
            dst: out.va(),
            iterations: loop_iterations_for(KERNEL_NS),
            seed: 3,
        });
        let f = attacker.drv.submit(&mut ch, &pb).unwrap();
        lanes.push((ch, sem, f));
    }
    pass(&w, 5 * MS);
    for (ch, _, _) in &lanes {
        assert_ne!(
            phys_state(&w, &attacker, ch.chid()) & pfifo::STATE_ACQUIRE_PENDING,
            0,
            "every attacker channel parked on its acquire"
        );
    }
    assert_eq!(w.host.stats().inflight, 0, "parked work left the GPU");
    for (_, sem, _) in &lanes {
        attacker.drv.buffer_wr32(sem, 0, 1).unwrap();
    }
    // The releases land: the attacker's kernels start.
    pass(&w, 2 * MS);
    assert!(
        w.host.stats().inflight > 0,
        "released work was queued again"
    );
    let mut vch = victim.drv.channel_new().unwrap();
    let vbuf = victim
        .drv
        .buffer_new(vch.vm_mut(), 4096, MemLocation::Vram, true)
        .unwrap();
    let mut vpb = PushBuf::new();
    vpb.kernel(&Kernel::Loop {
        dst: vbuf.va(),
        iterations: loop_iterations_for(MS),
        seed: 4,
    });
    let t0 = w.clock.now_ns();
    let vf = victim.drv.submit(&mut vch, &vpb).unwrap();
    victim.drv.fence_wait(&mut vch, vf).unwrap();
    let waited = w.clock.now_ns() - t0;
    assert!(
        waited <= slice + KERNEL_NS + 3 * MS,
        "the victim's 1 ms kernel took {waited} ns behind 12 parked channels"
    );
    for (mut ch, _, f) in lanes {
        attacker.drv.fence_wait(&mut ch, f).unwrap();
    }
    assert_eq!(victim.vgpu.stats().watchdog_kills, 0);
    assert_eq!(attacker.vgpu.stats().watchdog_kills, 0);
    let s = attacker.vgpu.stats();
    assert!(s.resumes >= 12, "{s:?}");
    assert!(s.preemptions >= 1, "{s:?}");
}

/// The other routes of the class: a channel disabled mid-work and enabled again, and one
/// taken off the runlist and listed again, run the rest of their work only when the scheduler
/// dispatches it (counted as a resume), never on the guest's write alone.
#[test]
fn reenabled_and_relisted_channels_wait_for_the_scheduler() {
    let w = rig_world(HostConfig::default());
    let mut vm = w.vm_with("tenant", ShadowMode::Lazy, 10_000 * MS);
    let mut ch = vm.drv.channel_new().unwrap();
    let out = vm
        .drv
        .buffer_new(ch.vm_mut(), 4096, MemLocation::Vram, true)
        .unwrap();
    let g = ch.chid();
    // Three 20 ms kernels, each its own GPFIFO entry of one submission.
    let mut fences = Vec::new();
    for seed in 0..3 {
        let mut pb = PushBuf::new();
        pb.kernel(&Kernel::Loop {
            dst: out.va(),
            iterations: loop_iterations_for(20 * MS),
            seed,
        });
        fences.push(vm.drv.submit(&mut ch, &pb).unwrap());
    }
    pass(&w, 5 * MS);
    assert_eq!(w.host.stats().inflight, 1, "the work is running");
    // Route 1: the guest disables its channel mid-work.
    vm.drv
        .hal_mut()
        .write32(Bar::Bar0, u64::from(pfifo::chan_state(g)), 0);
    assert_eq!(phys_state(&w, &vm, g) & pfifo::STATE_RUNNABLE, 0);
    pass(&w, 100 * MS);
    assert_eq!(
        w.host.stats().inflight,
        0,
        "the disabled channel left the GPU"
    );
    let resumes = vm.vgpu.stats().resumes;
    let busy_then = w.gpu.channel_busy_ns(vm.vgpu.phys_channels().start + g);
    pass(&w, 50 * MS);
    assert_eq!(
        w.gpu.channel_busy_ns(vm.vgpu.phys_channels().start + g),
        busy_then,
        "nothing of it runs while disabled"
    );
    vm.drv.hal_mut().write32(
        Bar::Bar0,
        u64::from(pfifo::chan_state(g)),
        pfifo::STATE_RUNNABLE,
    );
    pass(&w, 5 * MS);
    assert!(
        vm.vgpu.stats().resumes > resumes,
        "resumed by the scheduler"
    );
    // Route 2: the guest takes the channel off its runlist mid-work.
    let state = w.host.stats();
    assert_eq!(state.inflight, 1, "running again");
    let (base, len) = (
        vm.drv
            .hal_mut()
            .read32(Bar::Bar0, u64::from(pfifo::RUNLIST_BASE)),
        vm.drv
            .hal_mut()
            .read32(Bar::Bar0, u64::from(pfifo::RUNLIST_SUBMIT)),
    );
    vm.drv
        .hal_mut()
        .write32(Bar::Bar0, u64::from(pfifo::RUNLIST_BASE), base);
    vm.drv.hal_mut().write32(
        Bar::Bar0,
        u64::from(pfifo::RUNLIST_SUBMIT),
        len & !pfifo::RUNLIST_LEN_MASK,
    );
    pass(&w, 60 * MS);
    assert_eq!(
        w.host.stats().inflight,
        0,
        "the unlisted channel left the GPU"
    );
    let resumes = vm.vgpu.stats().resumes;
    vm.drv
        .hal_mut()
        .write32(Bar::Bar0, u64::from(pfifo::RUNLIST_SUBMIT), len);
    for f in fences {
        vm.drv.fence_wait(&mut ch, f).unwrap();
    }
    assert!(
        vm.vgpu.stats().resumes > resumes,
        "relisted: resumed by the scheduler"
    );
    assert_eq!(vm.vgpu.stats().watchdog_kills, 0);
}

/// Findings 5 and 6: writes the model drops are counted, and a fill beyond a BAR is clipped
/// before it is walked (a 64 GiB fill from BAR1's end returns at once).
#[test]
fn dropped_writes_are_counted_and_fills_are_clipped_to_the_bar() {
    let w = rig_world(HostConfig::default());
    let mut vm = w.vm_with("tenant", ShadowMode::Lazy, 1_000 * MS);
    let ch = vm.drv.channel_new().unwrap();
    let poll = vm
        .drv
        .hal_mut()
        .read32(Bar::Bar0, u64::from(pfifo::USERD_POLL_BASE));
    let page =
        pfifo::userd_poll_decode(poll).expect("poll area set") + u64::from(ch.chid()) * userd::SIZE;
    let before = vm.vgpu.stats().violations.dropped_writes;
    vm.drv
        .hal_mut()
        .write32(Bar::Bar1, page + userd::GP_GET, 0x1234);
    vm.drv
        .hal_mut()
        .write32(Bar::Bar1, page + userd::REFERENCE, 0x1234);
    assert_eq!(vm.vgpu.stats().violations.dropped_writes, before + 2);
    vm.vgpu
        .bar_fill(Bar::Bar1, Bar::Bar1.size(), 64 << 30, 0xab);
    vm.vgpu
        .bar_fill(Bar::Bar1, Bar::Bar1.size() - 8, 64 << 30, 0);
    assert_eq!(vm.vgpu.stats().violations.dropped_writes, before + 4);
    // A bind with POLL_ENABLE is refused and counted before the poll area is set; this VM's
    // driver set it, so a fresh VM shows it.
    let mut fresh = w.vm_with("fresh", ShadowMode::Lazy, 1_000 * MS);
    fresh
        .drv
        .hal_mut()
        .write32(Bar::Bar0, u64::from(pfifo::USERD_POLL_BASE), 0);
    fresh.drv.hal_mut().write32(
        Bar::Bar0,
        u64::from(pfifo::chan_table(5)),
        pfifo::CHAN_VALID | pfifo::CHAN_POLL_ENABLE | 0x100,
    );
    assert_eq!(fresh.vgpu.stats().violations.refused_binds, 1);
}

/// Finding 4: one TLB flush of a full page directory under eager shadowing is rebuilt in
/// budgeted steps, not in one hold of the host lock: the guest sees no free flush slot until the
/// rebuild is done, each of its polls does one step, and its work still verifies afterwards.
#[test]
fn an_eager_flush_of_a_full_directory_is_rebuilt_in_budgeted_steps() {
    use gpuvm::gf100::mmu::{Pde, PtRef, PtSize};
    use gpuvm::gf100::{pbus, Target};
    let w = rig_world(HostConfig::default());
    let mut vm = w.vm_with("eager", ShadowMode::Eager, 1_000 * MS);
    let mut ch = vm.drv.channel_new().unwrap();
    let pd = ch.vm_mut().pd_addr();
    let slice = vm.vgpu.vram_slice().size;
    let tables = [slice - (1 << 20), slice - (512 << 10)];
    let mut saved = Vec::new();
    // The driver keeps its own PRAMIN window: put it back afterwards.
    let pmem = vm.drv.hal_mut().read32(Bar::Bar0, u64::from(pbus::PMEM));
    for i in 0..2048u64 {
        let value = Pde {
            small: Some(PtRef {
                addr: tables[i as usize % 2],
                target: Target::Vram,
                vol: false,
            }),
            large: None,
            size: PtSize::Full,
        }
        .encode();
        saved.push(swap_vram_u64(&mut vm, pd + 8 * (64 + i), value));
    }
    let polls = flush_and_wait(&mut vm, pd);
    // 2048 entries with tables, two per step: the flush took many exits, each bounded.
    assert!(polls >= 100, "rebuilt in {polls} polls");
    // The entries are back to what the driver maps; its work verifies.
    for (i, old) in saved.into_iter().enumerate() {
        swap_vram_u64(&mut vm, pd + 8 * (64 + i as u64), old);
    }
    vm.drv
        .hal_mut()
        .write32(Bar::Bar0, u64::from(pbus::PMEM), pmem);
    // Flushed again, the 2048 entries' shadow tables are given back (they would otherwise hold
    // the VM's shadow budget).
    flush_and_wait(&mut vm, pd);
    drop(ch);
    support::vgpu_rig::run_suite(&mut vm);
    assert_eq!(vm.vgpu.stats().violations.total, 0);
}

/// Flushes the TLB for page directory `pd` as a driver does and polls VM_CFG until a flush
/// slot is free again (the shadow rebuild done); returns the polls it took.
fn flush_and_wait(vm: &mut Vm, pd: u64) -> u32 {
    use gpuvm::gf100::{pffb, Target};
    let hal = vm.drv.hal_mut();
    hal.write32(
        Bar::Bar0,
        u64::from(pffb::TLB_FLUSH_VSPACE),
        pffb::vspace_encode(pd, Target::Vram),
    );
    hal.write32(
        Bar::Bar0,
        u64::from(pffb::TLB_FLUSH_TRIGGER),
        pffb::FLUSH_TRIGGER | pffb::FLUSH_PAGE_ALL,
    );
    let mut polls = 0u32;
    while vm.drv.hal_mut().read32(Bar::Bar0, u64::from(pffb::VM_CFG))
        & pffb::VM_CFG_FLUSH_SLOTS_MASK
        == 0
    {
        polls += 1;
        assert!(polls < 100_000, "the rebuild never finished");
    }
    polls
}

/// Writes the 64-bit word at VRAM address `a` through the PRAMIN window (moving it there) and
/// returns what was there.
fn swap_vram_u64(vm: &mut Vm, a: u64, value: u64) -> u64 {
    use gpuvm::gf100::{pbus, Target};
    let hal = vm.drv.hal_mut();
    hal.write32(
        Bar::Bar0,
        u64::from(pbus::PMEM),
        pbus::pmem_encode(a, Target::Vram),
    );
    let win = u64::from(pbus::PRAMIN_BASE) + (a & 0xffff);
    let old =
        u64::from(hal.read32(Bar::Bar0, win)) | u64::from(hal.read32(Bar::Bar0, win + 4)) << 32;
    hal.write32(Bar::Bar0, win, value as u32);
    hal.write32(Bar::Bar0, win + 4, (value >> 32) as u32);
    old
}

/// The GPU stops a channel at an illegal method (the 3D class, which the model does not
/// execute, bound on a subchannel) and the guest rings the doorbell again: no route restarts
/// the channel behind the guest's back — not the new submission, not the fence release behind
/// the binding. The error reaches the guest, the channel reads stopped, and the rest runs only
/// once the guest has acknowledged the error and enabled the channel (the simulated PBDMA also
/// stalls on its pending interrupt, as hardware does: `tests/sim_m2mf.rs`).
#[test]
fn work_after_a_refused_method_waits_for_the_guest() {
    let w = rig_world(HostConfig::default());
    let mut vm = w.vm_with("tenant", ShadowMode::Lazy, 10_000 * MS);
    let mut ch = vm.drv.channel_new().unwrap();
    let g = ch.chid();
    let mut bind_3d = PushBuf::new();
    bind_3d.method(3, gpuvm::gf100::host::SET_OBJECT, &[0x9097]);
    let first = vm.drv.submit(&mut ch, &bind_3d).unwrap();
    w.clock.advance(MS);
    let second = vm.drv.submit(&mut ch, &PushBuf::new()).unwrap();
    pass(&w, 20 * MS);
    let intr = vm
        .drv
        .hal_mut()
        .read32(Bar::Bar0, u64::from(pfifo::pbdma(0, pfifo::PBDMA_INTR)));
    assert_ne!(
        intr & pfifo::PBDMA_INTR_ILLEGAL_MTHD,
        0,
        "the guest sees the illegal method (PBDMA INTR {intr:#x})"
    );
    assert_eq!(vm.vgpu.stats().pbdma_errors_delivered, 1);
    assert!(
        !vm.drv.fence_done(&ch, first).unwrap() && !vm.drv.fence_done(&ch, second).unwrap(),
        "nothing after the illegal method ran (fence {:#x})",
        vm.drv.fence_value(&ch).unwrap()
    );
    let state = vm
        .drv
        .hal_mut()
        .read32(Bar::Bar0, u64::from(pfifo::chan_state(g)));
    assert_eq!(
        state & pfifo::STATE_RUNNABLE,
        0,
        "the guest reads it stopped"
    );
    assert_eq!(phys_state(&w, &vm, g) & pfifo::STATE_RUNNABLE, 0);
    // The guest acknowledges the error and enables the channel: the rest runs (the illegal
    // method is skipped, as after nouveau's METHOD0 rewrite to a NOP).
    ack_and_enable(&mut vm, intr, g);
    vm.drv.fence_wait(&mut ch, second).unwrap();
}

/// The GPU stops a channel on an error, and before the host has serviced the interrupt the
/// channel's RUNNABLE is set again (what a submission dispatched in that window does). The
/// host's acknowledgement of the error lets the PBDMA go on, so the host takes RUNNABLE off
/// first: nothing after the error runs until the guest, having seen it, enables the channel.
#[test]
fn an_error_acknowledged_by_the_host_does_not_restart_a_channel_set_runnable_meanwhile() {
    let w = rig_world(HostConfig::default());
    let mut vm = w.vm_with("tenant", ShadowMode::Lazy, 10_000 * MS);
    let mut ch = vm.drv.channel_new().unwrap();
    let g = ch.chid();
    let p = vm.vgpu.phys_channels().start + g;
    let mut bind_3d = PushBuf::new();
    bind_3d.method(3, gpuvm::gf100::host::SET_OBJECT, &[0x9097]);
    let fence = vm.drv.submit(&mut ch, &bind_3d).unwrap();
    // The GPU runs the entry with no call into the host: it stops the channel on the error.
    w.clock.advance(MS);
    w.gpu.poll();
    assert_ne!(
        w.gpu.read_reg(pfifo::pbdma(0, pfifo::PBDMA_INTR)) & pfifo::PBDMA_INTR_ILLEGAL_MTHD,
        0,
        "the error is pending, not yet serviced"
    );
    assert_eq!(phys_state(&w, &vm, g) & pfifo::STATE_RUNNABLE, 0);
    // RUNNABLE set again behind the host's back, as a dispatch in that window would.
    let state = w.gpu.read_reg(pfifo::chan_state(p));
    w.gpu
        .write_reg(pfifo::chan_state(p), state | pfifo::STATE_RUNNABLE);
    pass(&w, 20 * MS);
    assert!(
        !vm.drv.fence_done(&ch, fence).unwrap(),
        "the release after the error ran"
    );
    assert_eq!(phys_state(&w, &vm, g) & pfifo::STATE_RUNNABLE, 0);
    assert_eq!(vm.vgpu.stats().pbdma_errors_delivered, 1);
    // The guest acknowledges and enables: the rest runs, through the scheduler.
    let intr = vm
        .drv
        .hal_mut()
        .read32(Bar::Bar0, u64::from(pfifo::pbdma(0, pfifo::PBDMA_INTR)));
    ack_and_enable(&mut vm, intr, g);
    vm.drv.fence_wait(&mut ch, fence).unwrap();
}

/// The guest's answer to a PBDMA error, as nouveau gives it: acknowledges `intr` on PBDMA 0 and
/// enables its channel `g` again.
fn ack_and_enable(vm: &mut Vm, intr: u32, g: u32) {
    vm.drv.hal_mut().write32(
        Bar::Bar0,
        u64::from(pfifo::pbdma(0, pfifo::PBDMA_INTR)),
        intr,
    );
    vm.drv.hal_mut().write32(
        Bar::Bar0,
        u64::from(pfifo::chan_state(g)),
        pfifo::STATE_RUNNABLE,
    );
}
