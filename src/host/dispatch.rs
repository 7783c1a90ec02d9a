//! The submission path (GPUvm `context_bar1.cc` "fire" + the A3 scheduler loop): doorbell ->
//! scheduler -> dispatch -> completion.
//!
//! A doorbell (the guest wrote GP_PUT in its emulated USERD page) of a bound channel becomes a
//! [`Submission`] handed to the host's [`crate::sched::Scheduler`]. Whenever the scheduler picks
//! one (after every access and every poll), it is **dispatched**:
//!
//! 1. the channel's shadow page tables are brought up to date (`before_submit`; lazy mode
//!    rebuilds here);
//! 2. the new GPFIFO entries and their pushbuffer segments are scanned for TLB invalidates
//!    (`crate::channels::cmdscan`), read through the shadow translation — all bounded, an
//!    unmapped entry stops the scan; each one found is applied as a guest TLB flush and the
//!    shadow made current again;
//! 3. the physical TLB is flushed for every shadow page directory that changed;
//! 4. the physical GP_PUT is written through the physical BAR1 aperture onto the hypervisor's
//!    USERD page of the physical channel — the physical doorbell.
//!
//! The scheduler is asked after every guest access and every poll (`progress`): first the
//! period ticks due and the completions are delivered, then it decides — dispatch, nothing, or
//! hold the GPU idle until a time (BAND's wait; the host keeps that time as its timer, see
//! [`crate::host::GpuHost::next_event_ns`]). Each submission leaving the GPU is charged the
//! GPU time since the previous mark of its VM (`crate::sched::account`), and the scheduler is
//! told that time with the completion.
//!
//! A submission is complete when the physical GP_GET (in that USERD page) equals its GP_PUT. It
//! also ends, without completing, when the channel stops (an MMU fault or PBDMA error clears
//! STATE RUNNABLE), is unbound, or parks on a semaphore acquire — otherwise one guest could hold
//! the GPU for ever. A submission to a channel that is not runnable or not on the VM's runlist
//! is written to the GPU (it runs when the guest enables the channel, as on hardware) but not
//! counted in flight. Work of a parked or disabled channel that later resumes runs outside the
//! scheduler's accounting (the GPU is not preemptive).
//!
//! **Watchdog.** A submission still running `HostConfig::watchdog_ns` after dispatch (or an
//! engine busy that long with a channel with nothing in flight) is hung: the host resets the
//! engine (PMC ENABLE toggle, found through ENG_STATE), kills the guest channel (STATE RUNNABLE
//! cleared and kept clear until unbound; SCHED_ERROR CTXSW_TIMEOUT to the guest), drops its
//! work, charges the VM and goes on with the others.

use gf100::{pfifo, ptimer, userd, Target};
use vm_memory::{Bytes, GuestAddress};

use crate::addr::HostVram;
use crate::channels::cmdscan::{self, Budget, Ring};
use crate::host::HostState;
use crate::phys::{Bar, PhysicalGpu};
use crate::sched::{dispatchable, Decision, Submission, VmId};
use crate::shadow_pt::GuestPdb;
use crate::vgpu::VmCx;

/// A submission on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InFlight {
    pub sub: Submission,
    /// GPU time of dispatch (restarted when the watchdog killed a submission ahead of it): the
    /// watchdog's reference where the backend cannot measure per-channel time.
    pub start_ns: u64,
    /// What the channel had run when the submission was dispatched (measured mode): the
    /// watchdog's reference — a submission is hung when its channel has *run* `watchdog_ns`
    /// since, however long it waited behind others.
    pub ran_at: Option<u64>,
}

impl InFlight {
    /// GPU time the submission's channel has run since dispatch (measured mode).
    fn ran(&self, st: &HostState, phys: &dyn PhysicalGpu) -> Option<u64> {
        let at = self.ran_at?;
        let now = st.runtime.ran(phys, self.sub.phys_chid)?;
        Some(now.saturating_sub(at))
    }
}

/// The GPU's time (PTIMER, read high-low-high as nouveau does).
pub(crate) fn gpu_now(phys: &dyn PhysicalGpu) -> u64 {
    for _ in 0..4 {
        let hi = phys.read_reg(ptimer::TIME_HIGH);
        let lo = phys.read_reg(ptimer::TIME_LOW);
        if phys.read_reg(ptimer::TIME_HIGH) == hi {
            return u64::from(hi) << 32 | u64::from(lo);
        }
    }
    0
}

/// The guest rang the doorbell of its channel `g`: queue a submission.
pub(crate) fn doorbell(st: &mut HostState, phys: &dyn PhysicalGpu, id: VmId, g: u32) {
    // A quiescing VM's work waits in its ring; resuming rings it again (`host/migrate.rs`).
    if st.frozen.contains(&id) {
        return;
    }
    let Some(vm) = st.vms.get(&id) else {
        return;
    };
    let Some(ch) = vm.chans.get(g as usize) else {
        return;
    };
    if ch.bound.is_none() || ch.killed {
        return;
    }
    let busy = st
        .inflight
        .iter()
        .any(|f| f.sub.vm == id && f.sub.guest_chid == g);
    if ch.gp_put == ch.phys_put && !busy {
        return;
    }
    let s = Submission {
        vm: id,
        guest_chid: g,
        phys_chid: vm.phys_chid(g),
        put: ch.gp_put,
    };
    let now = st.now(phys);
    st.sched.submit(s, now);
}

/// Delivers period ticks, retires finished submissions and does what the scheduler decides.
pub(crate) fn progress(
    st: &mut HostState,
    phys: &dyn PhysicalGpu,
    max_inflight: usize,
    watchdog_ns: u64,
) {
    let now = st.now(phys);
    st.sched.tick(now);
    check_completions(st, phys, now);
    watchdog(st, phys, now, watchdog_ns);
    st.sched_timer = None;
    loop {
        let inflight: Vec<Submission> = st.inflight.iter().map(|f| f.sub).collect();
        let s = match st.sched.decide(&inflight, max_inflight, now) {
            Decision::Dispatch(s) => s,
            Decision::Idle => break,
            Decision::WaitUntil(t) => {
                st.sched_timer = Some(t);
                break;
            }
        };
        if !dispatchable(&s, &inflight, max_inflight) {
            log::error!(
                "scheduler '{}' picked {s:?}, which may not run now; dropped",
                st.sched.name()
            );
            st.counters.aborted += 1;
            break;
        }
        dispatch(st, phys, s, now);
    }
}

/// Granularity of watchdog deadlines: PTIMER's resolution on GF100 (its low 5 bits read 0), so
/// that a host timed by PTIMER reads the deadline exactly when the clock reaches it.
const WATCHDOG_GRANULE_NS: u64 = 32;

/// When the watchdog next fires: `watchdog_ns` after the dispatch of the oldest submission in
/// flight (rounded up to PTIMER's 32 ns); `None` when off or nothing is in flight.
pub(crate) fn watchdog_deadline(
    st: &HostState,
    phys: &dyn PhysicalGpu,
    watchdog_ns: u64,
) -> Option<u64> {
    if watchdog_ns == 0 {
        return None;
    }
    if st.runtime.measured() {
        // The earliest time a channel could have run `watchdog_ns` (each runs at most as fast
        // as the clock): the host looks again then, and kills only what really ran that long.
        let now = st.now(phys);
        let ran = st
            .inflight
            .iter()
            .filter_map(|f| f.ran(st, phys))
            .chain(
                st.engine_watch
                    .and_then(|(p, mark)| st.runtime.ran(phys, p).map(|r| r.saturating_sub(mark))),
            )
            .max()?;
        return Some(
            now.saturating_add(watchdog_ns.saturating_sub(ran))
                .next_multiple_of(WATCHDOG_GRANULE_NS),
        );
    }
    st.inflight
        .iter()
        .map(|f| f.start_ns)
        .chain(st.engine_watch.map(|(_, since)| since))
        .map(|t| {
            t.saturating_add(watchdog_ns)
                .next_multiple_of(WATCHDOG_GRANULE_NS)
        })
        .min()
}

/// The hang watchdog (MxGPU-style hang detection, nouveau-style recovery): every submission
/// still running `watchdog_ns` after its dispatch has its channel killed.
fn watchdog(st: &mut HostState, phys: &dyn PhysicalGpu, now: u64, watchdog_ns: u64) {
    if watchdog_ns == 0 {
        st.engine_watch = None;
        return;
    }
    // While an engine runs a channel with nothing in flight, the submissions in flight are
    // waiting behind that work on the single GPU timeline, not hung themselves: their deadlines
    // do not fire, the engine side of the watchdog deals with the culprit (and restarts them).
    // The engines are scanned once per call (this runs on every exit while work is in flight),
    // and again only if a kill changed what they run.
    if st.runtime.measured() {
        watchdog_measured(st, phys, now, watchdog_ns);
        return;
    }
    let mut unaccounted = unaccounted_busy_channel(st, phys);
    if unaccounted.is_none() {
        let mut killed = false;
        while let Some(f) = st.inflight.iter().copied().min_by_key(|f| f.start_ns) {
            let d = f
                .start_ns
                .saturating_add(watchdog_ns)
                .next_multiple_of(WATCHDOG_GRANULE_NS);
            if d > now {
                break;
            }
            kill(st, phys, f.sub.vm, f.sub.guest_chid, f.start_ns, now);
            killed = true;
        }
        if killed {
            unaccounted = unaccounted_busy_channel(st, phys);
        }
    }
    watch_engines(st, phys, now, watchdog_ns, unaccounted);
}

/// The watchdog where per-channel GPU time is measured: a submission whose channel has run
/// `watchdog_ns` since its dispatch is hung, and so is a channel that ran that long on an
/// engine with nothing in flight (work started outside the scheduler). Waiting behind others
/// costs nothing, so no deadline needs restarting.
fn watchdog_measured(st: &mut HostState, phys: &dyn PhysicalGpu, now: u64, watchdog_ns: u64) {
    let hung: Vec<InFlight> = st
        .inflight
        .iter()
        .copied()
        .filter(|f| f.ran(st, phys).is_some_and(|r| r >= watchdog_ns))
        .collect();
    for f in hung {
        kill(st, phys, f.sub.vm, f.sub.guest_chid, f.start_ns, now);
    }
    let Some(p) = unaccounted_busy_channel(st, phys) else {
        st.engine_watch = None;
        return;
    };
    let Some(ran) = st.runtime.ran(phys, p) else {
        return;
    };
    match st.engine_watch {
        Some((q, mark)) if q == p => {
            if ran.saturating_sub(mark) < watchdog_ns {
                return;
            }
            st.engine_watch = None;
            kill_channel(st, phys, p, now, now);
        }
        _ => st.engine_watch = Some((p, ran)),
    }
}

/// The physical channel an engine is busy with while no submission of it is in flight (work the
/// scheduler does not account), if any.
fn unaccounted_busy_channel(st: &HostState, phys: &dyn PhysicalGpu) -> Option<u32> {
    let busy = (0..pfifo::ENGINES).find_map(|e| {
        let s = phys.read_reg(pfifo::eng_state(e));
        (s & pfifo::ENG_STATE_BUSY != 0).then_some(s & pfifo::ENG_STATE_CHID_MASK)
    });
    busy.filter(|&p| !st.inflight.iter().any(|f| f.sub.phys_chid == p))
}

/// The engine side of the watchdog, for work the scheduler does not account (a channel the
/// guest enabled after its submission, see the module comment): an engine seen busy with the
/// same channel, which has no submission in flight, from one service to another for
/// `watchdog_ns` gets that channel killed the same way.
fn watch_engines(
    st: &mut HostState,
    phys: &dyn PhysicalGpu,
    now: u64,
    watchdog_ns: u64,
    unaccounted: Option<u32>,
) {
    let Some(p) = unaccounted else {
        st.engine_watch = None;
        return;
    };
    match st.engine_watch {
        Some((q, since)) if q == p => {
            if since.saturating_add(watchdog_ns) > now {
                return;
            }
            st.engine_watch = None;
            if !kill_channel(st, phys, p, since, now) {
                // The submissions in flight waited behind it: their watchdog starts again
                // (`kill` does this itself for an owned channel).
                for o in &mut st.inflight {
                    o.start_ns = o.start_ns.max(now);
                }
            }
        }
        _ => st.engine_watch = Some((p, now)),
    }
}

/// Kills physical channel `p`, hung on an engine since `since`: through its owner's guest
/// channel if a VM owns it (returns true), else by stopping it and resetting its engines (a
/// destroyed VM's operation: nobody to tell).
fn kill_channel(st: &mut HostState, phys: &dyn PhysicalGpu, p: u32, since: u64, now: u64) -> bool {
    let owner = st.part.owner.get(p as usize).copied().flatten();
    if let Some((id, g)) = owner.and_then(|id| st.vms.get(&id).map(|vm| (id, p - vm.chan_base))) {
        kill(st, phys, id, g, since, now);
        return true;
    }
    phys.write_reg(pfifo::chan_state(p), 0);
    let reset = crate::channels::preempt::reset_engines_of(phys, p);
    st.counters.watchdog_kills += 1;
    log::warn!("watchdog: engines {reset:?} hung by unowned channel {p}; reset");
    false
}

/// Kills the channel of the hung submission `f` at `now`: stops the physical channel, resets the
/// engine running it (which aborts the operation, see `docs/registers.md`), marks the guest
/// channel killed and reports SCHED_ERROR CTXSW_TIMEOUT to the guest, drops the channel's work
/// (charged to the VM) and restarts the watchdog for the submissions still in flight (they were
/// waiting behind the hung one on the single GPU timeline).
fn kill(st: &mut HostState, phys: &dyn PhysicalGpu, id: VmId, g: u32, start: u64, now: u64) {
    let Some(p) = st.vms.get(&id).map(|vm| vm.phys_chid(g)) else {
        return;
    };
    // 1. Disable the channel so that PFIFO does not pick it again.
    phys.write_reg(pfifo::chan_state(p), 0);
    // 2. Reset the engine that runs it (nouveau `gf100_fifo_intr_sched_ctxsw` + engine recovery:
    //    PMC ENABLE bit off and on). Only the engine whose ENG_STATE names this channel.
    let reset = crate::channels::preempt::reset_engines_of(phys, p);
    // 3. The guest sees what nouveau would: a CTXSW timeout and its channel no longer runnable.
    let elapsed = now.saturating_sub(start);
    if let Some(vm) = st.vms.get_mut(&id) {
        if let Some(ch) = vm.chans.get_mut(g as usize) {
            ch.killed = true;
        }
        vm.regs.sched_error(pfifo::SCHED_ERR_CTXSW_TIMEOUT);
        vm.stats.watchdog_kills += 1;
        log::warn!(
            "{id} ('{}'): watchdog: channel {g} (physical {p}) still running {elapsed} ns after dispatch; \
             killed (engines reset: {reset:?})",
            vm.profile.name
        );
    }
    st.counters.watchdog_kills += 1;
    // 4. Its work goes; the time it took is the VM's.
    st.drop_channel_work(phys, id, g, now);
    // 5. The others waited behind it: their watchdog starts again.
    for o in &mut st.inflight {
        o.start_ns = o.start_ns.max(now);
    }
}

/// How a submission in flight stands.
enum Status {
    Running,
    Done,
    Ended,
}

fn status(phys: &dyn PhysicalGpu, st: &HostState, f: &InFlight) -> Status {
    let p = f.sub.phys_chid;
    let mut b = [0u8; 4];
    phys.read_vram(st.layout.userd_page(p).offset(userd::GP_GET), &mut b);
    if u32::from_le_bytes(b) == f.sub.put {
        return Status::Done;
    }
    let chan = phys.read_reg(pfifo::chan_table(p));
    let state = phys.read_reg(pfifo::chan_state(p));
    if chan & pfifo::CHAN_VALID == 0
        || state & pfifo::STATE_RUNNABLE == 0
        || state & pfifo::STATE_ACQUIRE_PENDING != 0
    {
        Status::Ended
    } else {
        Status::Running
    }
}

fn check_completions(st: &mut HostState, phys: &dyn PhysicalGpu, now: u64) {
    let mut i = 0;
    while i < st.inflight.len() {
        let f = st.inflight[i];
        let done = match status(phys, st, &f) {
            Status::Running => {
                i += 1;
                continue;
            }
            Status::Done => true,
            Status::Ended => false,
        };
        st.inflight.remove(i);
        let more = st.inflight.iter().any(|o| o.sub.vm == f.sub.vm);
        let wall = st.acct.retired(f.sub.vm, now, more);
        let gpu_ns = st.charge_ran(phys, f.sub.vm, now).unwrap_or(wall);
        st.sched.complete(&f.sub, now, gpu_ns);
        let vm = st.vms.get_mut(&f.sub.vm);
        if done {
            st.counters.completed += 1;
            if let Some(vm) = vm {
                vm.stats.completions += 1;
            }
        } else {
            st.counters.aborted += 1;
            if let Some(vm) = vm {
                vm.stats.aborted += 1;
            }
        }
    }
}

/// Dispatches `s`: shadows current, pushbuffer scan, physical TLB flushes, physical doorbell.
fn dispatch(st: &mut HostState, phys: &dyn PhysicalGpu, s: Submission, now: u64) {
    let Some(vm) = st.vms.get_mut(&s.vm) else {
        st.counters.aborted += 1;
        return;
    };
    let g = s.guest_chid as usize;
    let Some((pdb, ring, from, mut scan)) = vm.chans.get(g).and_then(|c| {
        c.bound.as_ref().map(|b| {
            (
                b.pdb,
                Ring {
                    base: b.ib_base,
                    order: b.ib_order,
                },
                c.phys_put,
                b.scan,
            )
        })
    }) else {
        st.counters.aborted += 1;
        return;
    };
    // A channel that is not runnable or not on the runlist gets no physical GP_PUT: the GPU
    // would run the work whenever the guest enables the channel, outside the scheduler's
    // accounting and the watchdog's view. The submission is held and queued again when the
    // guest enables the channel or lists it (`channels`).
    let in_runlist = vm.runlist.contains(&s.guest_chid);
    let runnable = phys.read_reg(pfifo::chan_state(s.phys_chid)) & pfifo::STATE_RUNNABLE != 0;
    if !(in_runlist && runnable) {
        vm.chans[g].held = true;
        vm.stats.held_submissions += 1;
        return;
    }
    let mut cx = VmCx::new(phys, &mut st.hyp, &st.layout, vm);
    let mut pds = Vec::new();
    if let Some(pdb) = pdb {
        pds = {
            let (sh, mut scx) = cx.shadow();
            sh.before_submit(&mut scx, pdb)
        };
        let flushes = scan_for_invalidates(&mut cx, pdb, ring, from, s.put, &mut scan);
        if !flushes.is_empty() {
            cx.vm.stats.mem_op_flushes += flushes.len() as u64;
            let (sh, mut scx) = cx.shadow();
            for f in flushes {
                let target = f.map(|(addr, target)| GuestPdb { addr, target });
                pds.extend(sh.tlb_flush(&mut scx, target));
            }
            pds.extend(sh.before_submit(&mut scx, pdb));
        }
    }
    pds.sort();
    pds.dedup();
    cx.phys_tlb_flush(&pds);
    if let Some(b) = cx.vm.chans[g].bound.as_mut() {
        b.scan = scan;
    }
    cx.vm.chans[g].phys_put = s.put;
    cx.vm.stats.submissions += 1;
    let p = s.phys_chid;
    phys.write_aperture(
        Bar::Bar1,
        cx.layout.userd_bar1(p) + userd::GP_PUT,
        &s.put.to_le_bytes(),
    );
    st.counters.dispatched += 1;
    let runnable = phys.read_reg(pfifo::chan_state(p)) & pfifo::STATE_RUNNABLE != 0;
    if runnable {
        let ran_at = st.runtime.ran(phys, p);
        st.inflight.push(InFlight {
            sub: s,
            start_ns: now,
            ran_at,
        });
        st.acct.dispatched(s.vm, now);
        st.nonstall.insert(s.vm);
    } else {
        st.counters.aborted += 1;
        if let Some(vm) = st.vms.get_mut(&s.vm) {
            vm.stats.aborted += 1;
        }
    }
}

/// Scans GPFIFO entries `[from, to)` of the channel for MEM_OP TLB invalidates, reading through
/// the shadow translation of `pdb`.
fn scan_for_invalidates(
    cx: &mut VmCx,
    pdb: GuestPdb,
    ring: Ring,
    from: u32,
    to: u32,
    scan: &mut cmdscan::ScanState,
) -> Vec<Option<(u64, Target)>> {
    let (sh, scx) = cx.shadow();
    let sh = &*sh;
    let slice = scx.mem.slice;
    let mut reader = |va: u64, buf: &mut [u8]| -> bool {
        let Some(t) = sh.translate(&scx, pdb, va) else {
            return false;
        };
        match t.target {
            Target::Vram => {
                let end = t.addr.saturating_add(buf.len() as u64 - 1);
                if slice.to_guest(HostVram(t.addr)).is_none()
                    || slice.to_guest(HostVram(end)).is_none()
                {
                    return false;
                }
                scx.mem.phys.read_vram(HostVram(t.addr), buf);
                true
            }
            Target::SysCoherent | Target::SysNonCoherent => {
                let Some(ram) = scx.mem.ram else {
                    return false;
                };
                match t.addr.checked_sub(ram.iova_base.raw()) {
                    Some(gpa) => ram.mem.read_slice(buf, GuestAddress(gpa)).is_ok(),
                    None => false,
                }
            }
        }
    };
    let out = cmdscan::scan(&mut reader, ring, from, to, scan, Budget::DEFAULT);
    if out.stop == cmdscan::Stop::Budget {
        log::debug!("pushbuffer scan budget exhausted ({out:?})");
    }
    out.flushes
}
