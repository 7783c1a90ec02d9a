//! Isolation while GPU work is in flight (issue 11, "GPU work must never outlive what it was
//! checked against"). An attacker VM starts a long copy or kernel and then, while the engine is
//! still running it, tears down or re-points what the work was validated against: it unbinds the
//! channel, points the instance block at another page directory, is destroyed, or starts work
//! outside the scheduler. A victim VM (and a newcomer that inherits the attacker's slice and
//! channels) must stay bit-identical, verify every workload, never see the attacker's faults and
//! never be killed or charged for the attacker's work. Each test first proves it reached the
//! racy state (the engine busy with the attacker's channel at the moment of the attack).
//!
//! The simulated GF100 lands engine writes over the operation's modeled duration
//! (`EngineWrites::OverDuration`, its default), so a copy or kernel that kept running after the
//! attack would still be writing when the clock passes its end.

use gpuvm::gf100::compute::Kernel;
use gpuvm::gf100::{host as hm, inst, pbus, pfifo, Target};
use gpuvm::host::HostConfig;
use gpuvm::phys::{Bar, PhysicalGpu};
use gpuvm::profile::ShadowMode;
use gpuvm_guest::hal::Mmio;
use gpuvm_guest::{Buffer, Channel, Fence, MemLocation, PushBuf};

mod support;
use support::vgpu_rig::{loop_iterations_for, pass, run_suite, world as rig_world, Vm, World};

const MODES: [ShadowMode; 4] = [
    ShadowMode::Eager,
    ShadowMode::Lazy,
    ShadowMode::Incremental,
    ShadowMode::Pv,
];

/// Bytes of the attacker's copy (VRAM to VRAM: about 0.1 ms of modeled copy-engine time).
const COPY_BYTES: u64 = 8 << 20;
/// Modeled PGRAPH time of the attacker's loop kernel.
const KERNEL_NS: u64 = 100_000_000;

fn world() -> World {
    rig_world(HostConfig {
        // Far away: these tests are about teardown, not hangs (except where set).
        watchdog_ns: 60_000_000_000,
        ..HostConfig::default()
    })
}

fn vm(w: &World, name: &str, mode: ShadowMode) -> Vm {
    w.vm_with(name, mode, 120_000_000_000)
}

/// The long operation an attacker leaves running.
#[derive(Debug, Clone, Copy)]
enum Op {
    Copy,
    Kernel,
}

impl Op {
    fn engine(self) -> u32 {
        match self {
            Op::Copy => hm::ENGINE_PCOPY0,
            Op::Kernel => hm::ENGINE_PGRAPH,
        }
    }
}

/// Opens a channel on `vm` and submits `op` followed by the driver's fence release, without
/// waiting; returns the channel, the fence and the destination buffer.
fn launch(vm: &mut Vm, op: Op) -> (Channel, Fence, Buffer) {
    let mut ch = vm.drv.channel_new().expect("channel");
    let dst = vm
        .drv
        .buffer_new(ch.vm_mut(), COPY_BYTES, MemLocation::Vram, false)
        .expect("dst");
    let mut pb = PushBuf::new();
    match op {
        Op::Copy => {
            let src = vm
                .drv
                .buffer_new(ch.vm_mut(), COPY_BYTES, MemLocation::Vram, false)
                .expect("src");
            pb.copy(src.va(), dst.va(), COPY_BYTES);
        }
        Op::Kernel => pb.kernel(&Kernel::Loop {
            dst: dst.va(),
            iterations: loop_iterations_for(KERNEL_NS),
            seed: 9,
        }),
    }
    let f = vm.drv.submit(&mut ch, &pb).expect("submit");
    (ch, f, dst)
}

fn phys_chid(vm: &Vm, ch: &Channel) -> u32 {
    vm.vgpu.phys_channels().start + ch.chid()
}

/// Advances the clock in small steps until `engine` runs physical channel `p` (bounded).
fn until_running(w: &World, engine: u32, p: u32) {
    for _ in 0..10_000 {
        if w.gpu.read_reg(pfifo::eng_state(engine)) == pfifo::ENG_STATE_BUSY | p {
            return;
        }
        w.clock.advance(2_000);
        w.host.poll();
    }
    panic!("engine {engine} never ran channel {p}");
}

fn bar0_write(vm: &mut Vm, off: u32, v: u32) {
    vm.drv.hal_mut().write32(Bar::Bar0, u64::from(off), v);
}

fn bar0_read(vm: &mut Vm, off: u32) -> u32 {
    vm.drv.hal_mut().read32(Bar::Bar0, u64::from(off))
}

/// Findings 3-5: a VM destroyed with a copy or a kernel in flight leaves nothing behind — its
/// slice reads zeros however long the clock runs on, a newcomer on the same slice and channels
/// verifies, sees no fault and is not killed, and the victim is bit-identical.
#[test]
fn destroy_with_work_in_flight_leaves_no_residue() {
    for mode in MODES {
        for op in [Op::Copy, Op::Kernel] {
            let w = world();
            let mut victim = vm(&w, "victim", mode);
            let mut attacker = vm(&w, "attacker", mode);
            run_suite(&mut victim);
            w.settle();
            let fp = w.fingerprint(&victim);
            let (ch, _f, _dst) = launch(&mut attacker, op);
            let p = phys_chid(&attacker, &ch);
            until_running(&w, op.engine(), p);
            let slice = attacker.vgpu.vram_slice();
            let chans = attacker.vgpu.phys_channels();
            w.host.destroy_vgpu(&attacker.vgpu).unwrap();
            drop(attacker);
            let hs = w.host.stats();
            assert_eq!(
                hs.gpu.engine_aborts, 1,
                "{mode} {op:?}: the operation was aborted"
            );
            assert_eq!(hs.withheld_partitions, 0);
            assert_eq!(w.gpu.read_reg(pfifo::eng_state(op.engine())), 0);
            // Long past the operation's end: nothing of it lands anywhere.
            pass(&w, 200_000_000);
            let mut buf = vec![0u8; slice.size as usize];
            w.gpu.read_vram(slice.base, &mut buf);
            assert!(
                buf.iter().all(|&b| b == 0),
                "{mode} {op:?}: the dead VM's slice was written after destroy"
            );
            assert_eq!(w.fingerprint(&victim), fp, "{mode} {op:?}: victim changed");
            let mut next = vm(&w, "next", mode);
            assert_eq!(
                next.vgpu.vram_slice(),
                slice,
                "the newcomer inherits the slice"
            );
            assert_eq!(next.vgpu.phys_channels(), chans, "and the channels");
            run_suite(&mut next);
            run_suite(&mut victim);
            for v in [&next, &victim] {
                let s = v.vgpu.stats();
                assert_eq!(s.faults_delivered, 0, "{mode} {op:?}");
                assert_eq!(s.watchdog_kills, 0, "{mode} {op:?}");
            }
            let hs = w.host.stats();
            assert_eq!((hs.unrouted, hs.phys_fifo_errors), (0, 0), "{mode} {op:?}");
            assert_eq!(hs.hypervisor_vram_quarantined, 0);
        }
    }
}

/// Finding 1: the attacker unbinds its channel with a copy or kernel in flight; the victim then
/// opens channels (taking whatever hypervisor VRAM was freed) and works. Nothing of the
/// attacker's operation — data or completion semaphore — lands in the victim's memory.
#[test]
fn unbind_with_work_in_flight_never_reaches_the_next_channel() {
    for mode in MODES {
        for op in [Op::Copy, Op::Kernel] {
            let w = world();
            let mut victim = vm(&w, "victim", mode);
            let mut attacker = vm(&w, "attacker", mode);
            let (ch, _f, _dst) = launch(&mut attacker, op);
            let p = phys_chid(&attacker, &ch);
            until_running(&w, op.engine(), p);
            // The guest unbinds the channel under the running operation.
            bar0_write(&mut attacker, pfifo::chan_table(ch.chid()), 0);
            assert_eq!(attacker.vgpu.stats().inflight_aborts, 1, "{mode} {op:?}");
            assert_eq!(w.gpu.read_reg(pfifo::eng_state(op.engine())), 0);
            // The victim takes fresh channels (shadow instance blocks, shadow page tables).
            let mut vch = victim.drv.channel_new().expect("victim channel");
            let _b = victim
                .drv
                .buffer_new(vch.vm_mut(), 1 << 20, MemLocation::Vram, true)
                .expect("victim buffer");
            let f = victim.drv.submit(&mut vch, &PushBuf::new()).unwrap();
            victim.drv.fence_wait(&mut vch, f).unwrap();
            w.settle();
            let fp = w.fingerprint(&victim);
            pass(&w, 200_000_000);
            assert_eq!(w.fingerprint(&victim), fp, "{mode} {op:?}: victim written");
            run_suite(&mut victim);
            assert_eq!(victim.vgpu.stats().faults_delivered, 0);
            let hs = w.host.stats();
            assert_eq!(hs.unrouted, 0);
            assert_eq!(
                hs.hypervisor_vram_quarantined, 0,
                "released once off the GPU"
            );
        }
    }
}

/// Finding 2: during a long kernel the attacker points its instance block at another page
/// directory. The old shadow stays alive (quarantined, never handed out) while the kernel —
/// and the rest of its GPFIFO entry, the fence release — runs on it; the victim, which
/// allocates shadows meanwhile, is untouched, and the old shadow is released once the channel
/// has left the GPU.
#[test]
fn repointing_a_running_channel_keeps_its_old_shadow_until_it_leaves() {
    // Without time slices the kernel and the rest of its entry run on the kept shadow. With
    // them, the victim's arrival ends the attacker's slice: the preempt waits for the kernel,
    // and the channel reloads its context — the new, empty directory — before the rest of the
    // entry, which then faults for the attacker alone (as on a GPU that preempts). The victim is
    // untouched either way.
    for (mode, slice) in MODES
        .into_iter()
        .flat_map(|m| [(m, 0), (m, HostConfig::default().timeslice_ns)])
    {
        let w = rig_world(HostConfig {
            watchdog_ns: 60_000_000_000,
            timeslice_ns: slice,
            ..HostConfig::default()
        });
        let mut victim = vm(&w, "victim", mode);
        let mut attacker = vm(&w, "attacker", mode);
        let (ch, _f, _dst) = launch(&mut attacker, Op::Kernel);
        let p = phys_chid(&attacker, &ch);
        until_running(&w, hm::ENGINE_PGRAPH, p);
        repoint_to_an_empty_directory(&mut attacker, &ch);
        assert_eq!(
            w.gpu.read_reg(pfifo::eng_state(hm::ENGINE_PGRAPH)),
            pfifo::ENG_STATE_BUSY | p,
            "{mode}: the kernel still runs on the old page directory"
        );
        assert!(
            w.host.stats().hypervisor_vram_quarantined > 0,
            "{mode}: the old shadow is retired, not freed"
        );
        let mut vch = victim.drv.channel_new().expect("victim channel");
        let _b = victim
            .drv
            .buffer_new(vch.vm_mut(), 1 << 20, MemLocation::Vram, true)
            .expect("victim buffer");
        // (The victim's channel was bound — its shadow instance block allocated — while the
        // kernel still ran: its driver's first wait is what moves the clock past the kernel.)
        w.settle();
        let fp = w.fingerprint(&victim);
        pass(&w, 400_000_000);
        assert_eq!(w.fingerprint(&victim), fp, "{mode}: victim written");
        let a = attacker.vgpu.stats();
        let expect = if slice == 0 { (2, 0) } else { (1, 1) };
        assert_eq!(
            (a.completions, a.faults_delivered),
            expect,
            "{mode} (slice {slice}): the rest of the entry (the fence) ran on the kept shadow, or (preempted) faulted in the attacker's new directory"
        );
        run_suite(&mut victim);
        let vs = victim.vgpu.stats();
        assert_eq!(vs.faults_delivered, 0, "{mode}");
        let hs = w.host.stats();
        assert_eq!(hs.unrouted, 0, "{mode}");
        assert_eq!(hs.hypervisor_vram_quarantined, 0, "{mode}: released");
    }
}

/// The guest's instance block of `ch` (named by its CHAN word), rewritten through PRAMIN: the
/// PDB now names an empty page directory in the VM's own slice (its last 64 KiB, never used).
fn repoint_to_an_empty_directory(vm: &mut Vm, ch: &Channel) {
    let word = bar0_read(vm, pfifo::chan_table(ch.chid()));
    let (iaddr, target) = pfifo::chan_decode(word | pfifo::CHAN_VALID).unwrap();
    assert_eq!(target, Target::Vram);
    let empty_pd = vm.vgpu.vram_slice().size - (64 << 10);
    let pdb = inst::pdb_encode(empty_pd, Target::Vram);
    let at = iaddr + inst::PDB_LO;
    bar0_write(vm, pbus::PMEM, pbus::pmem_encode(at, Target::Vram));
    let win = pbus::PRAMIN_BASE + (at & 0xffff) as u32;
    bar0_write(vm, win + 4, (pdb >> 32) as u32);
    bar0_write(vm, win, pdb as u32);
}

/// A variant found while searching for more of finding 2's kind: a channel parked on a
/// semaphore acquire holds the context it loaded (its page directory) with no engine busy.
/// The attacker re-points it, lets the victim take the freed shadow memory, then releases the
/// semaphore: the acquire is checked again and the rest of the entry (a release to the same VA)
/// runs. Preempting a parked channel drops its context, so the re-check reads through the new
/// (empty) directory and faults for the attacker; the victim is untouched. (Without that rule
/// the re-check walked the released, reused memory as a page directory; in this layout that
/// walk also faulted — the breach depends on where the victim's tables land — so this test
/// shows the safe outcome, not that the unfixed model would have been breached.)
#[test]
fn repointing_a_channel_parked_on_an_acquire_reaches_only_its_new_directory() {
    for mode in MODES {
        let w = world();
        let mut victim = vm(&w, "victim", mode);
        let mut attacker = vm(&w, "attacker", mode);
        let mut ch = attacker.drv.channel_new().unwrap();
        let sem = attacker
            .drv
            .buffer_new(ch.vm_mut(), 4096, MemLocation::Vram, true)
            .unwrap();
        let mut pb = PushBuf::new();
        pb.semaphore_acquire_geq(sem.va(), 1);
        pb.semaphore_release(sem.va() + 64, 0xdead, false, false);
        let _f = attacker.drv.submit(&mut ch, &pb).unwrap();
        pass(&w, 1_000_000);
        let p = phys_chid(&attacker, &ch);
        assert_ne!(
            w.gpu.read_reg(pfifo::chan_state(p)) & pfifo::STATE_ACQUIRE_PENDING,
            0,
            "{mode}: parked on the acquire"
        );
        repoint_to_an_empty_directory(&mut attacker, &ch);
        // The victim's first channel and buffer: with the same driver, the same VA as the
        // attacker's semaphore; a value that would satisfy the attacker's acquire if it were
        // read through the victim's tables.
        let mut vch = victim.drv.channel_new().expect("victim channel");
        let vbuf = victim
            .drv
            .buffer_new(vch.vm_mut(), 4096, MemLocation::Vram, true)
            .expect("victim buffer");
        assert_eq!(vbuf.va(), sem.va(), "{mode}: same VA in both VMs");
        victim.drv.buffer_wr32(&vbuf, 0, 7).unwrap();
        w.settle();
        let fp = w.fingerprint(&victim);
        attacker.drv.buffer_wr32(&sem, 0, 1).unwrap();
        pass(&w, 10_000_000);
        assert_eq!(w.fingerprint(&victim), fp, "{mode}: victim written");
        assert!(
            attacker.vgpu.stats().faults_delivered >= 1,
            "{mode}: the re-checked acquire faulted in the new, empty directory"
        );
        run_suite(&mut victim);
        assert_eq!(victim.vgpu.stats().faults_delivered, 0, "{mode}");
        let hs = w.host.stats();
        assert_eq!(
            (hs.unrouted, hs.hypervisor_vram_quarantined),
            (0, 0),
            "{mode}"
        );
    }
}

/// Findings 6 and 7: work that starts outside the scheduler (a channel parked on a semaphore
/// acquire, released by the guest later) runs a kernel close to the watchdog limit while the
/// victim's submission waits behind it. The victim is neither killed nor charged for it; the
/// attacker is charged its kernel. A doorbell on a disabled channel is held, not written.
#[test]
fn work_outside_the_scheduler_is_charged_and_timed_as_its_own() {
    const WATCHDOG_NS: u64 = 100_000_000;
    let w = rig_world(HostConfig {
        watchdog_ns: WATCHDOG_NS,
        ..HostConfig::default()
    });
    let mut victim = w.vm_with("victim", ShadowMode::Lazy, 20 * WATCHDOG_NS);
    let mut attacker = w.vm_with("attacker", ShadowMode::Lazy, 20 * WATCHDOG_NS);

    // A doorbell on a disabled channel is held: nothing reaches the GPU.
    let mut held = attacker.drv.channel_new().unwrap();
    bar0_write(&mut attacker, pfifo::chan_state(held.chid()), 0);
    let f = attacker.drv.submit(&mut held, &PushBuf::new()).unwrap();
    pass(&w, 1_000_000);
    assert_eq!(attacker.vgpu.stats().held_submissions, 1);
    assert_eq!(w.host.stats().inflight, 0);
    bar0_write(
        &mut attacker,
        pfifo::chan_state(held.chid()),
        pfifo::STATE_RUNNABLE,
    );
    attacker.drv.fence_wait(&mut held, f).unwrap();

    // The attacker parks on an acquire, then runs a kernel of ~80 % of the watchdog limit.
    let mut ch = attacker.drv.channel_new().unwrap();
    let sem = attacker
        .drv
        .buffer_new(ch.vm_mut(), 4096, MemLocation::Vram, true)
        .unwrap();
    let out = attacker
        .drv
        .buffer_new(ch.vm_mut(), 4096, MemLocation::Vram, true)
        .unwrap();
    let mut pb = PushBuf::new();
    pb.semaphore_acquire_geq(sem.va(), 1);
    // Loop iterations for 80 ms of PGRAPH time (the cost model's loop rate).
    pb.kernel(&Kernel::Loop {
        dst: out.va(),
        iterations: loop_iterations_for(80_000_000),
        seed: 1,
    });
    let af = attacker.drv.submit(&mut ch, &pb).unwrap();
    pass(&w, 1_000_000);
    assert_eq!(
        w.host.stats().inflight,
        0,
        "the parked submission left the GPU"
    );
    // The victim submits; the attacker releases its semaphore at once.
    let mut vch = victim.drv.channel_new().unwrap();
    let vbuf = victim
        .drv
        .buffer_new(vch.vm_mut(), 4096, MemLocation::Vram, true)
        .unwrap();
    let mut vpb = PushBuf::new();
    vpb.kernel(&Kernel::Memset {
        dst: vbuf.va(),
        bytes: 4096,
        value: 5,
    });
    attacker.drv.buffer_wr32(&sem, 0, 1).unwrap();
    let p = phys_chid(&attacker, &ch);
    until_running(&w, hm::ENGINE_PGRAPH, p);
    let vf = victim.drv.submit(&mut vch, &vpb).unwrap();
    // The victim waits behind 80 ms of attacker work, then 80 ms more elapse on the clock.
    victim.drv.fence_wait(&mut vch, vf).unwrap();
    attacker.drv.fence_wait(&mut ch, af).unwrap();
    pass(&w, 2 * WATCHDOG_NS);
    assert_eq!(victim.vgpu.stats().watchdog_kills, 0);
    assert_eq!(
        attacker.vgpu.stats().watchdog_kills,
        0,
        "80 ms is under the limit"
    );
    assert_eq!(victim.drv.buffer_rd32(&vbuf, 0).unwrap(), 5);
    let s = w.host.sched_stats();
    let busy = |vm: &Vm| {
        s.vms
            .iter()
            .find(|v| v.vm == vm.vgpu.id())
            .map(|v| v.busy_ns)
            .unwrap()
    };
    assert!(
        busy(&attacker) >= 75_000_000,
        "the attacker is charged its kernel: {s:?}"
    );
    assert!(
        busy(&victim) < 10_000_000,
        "the victim is charged only its own work: {s:?}"
    );
}
