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
//! **The scheduler owns the engines.** A physical channel is RUNNABLE only while a submission
//! of it is in flight: dispatch sets the bit after writing GP_PUT, and the host clears it when
//! the submission leaves the GPU (`crate::channels` keeps the guest's RUNNABLE virtually). A
//! submission is complete when the physical GP_GET (in that USERD page) equals its GP_PUT. It
//! ends without completing when the channel stops (an MMU fault or PBDMA error clears
//! RUNNABLE), is disabled or taken off the runlist by the guest, is unbound, parks on a
//! semaphore acquire, or is **preempted**: at the end of its VM's time slice
//! (`HostConfig::timeslice_ns` of GPU time holding the GPU while another VM has work the policy
//! could run) or as soon as its VM's cap is used up (`Scheduler::over_cap`). An ending
//! submission's channel is disabled and switched out (KICK: GF100's channel preempt, which
//! waits for the engine operation in flight — Fermi cannot preempt inside a kernel — and saves
//! the PBDMA state), and it stays in flight, holding the GPU for its VM, until no engine runs it
//! any more. A channel that left with work left is **parked**; the host queues it to the
//! scheduler again when it may run — at once after a preempt, when the semaphore it waits on
//! would satisfy its acquire (`PhysicalGpu::channel_acquire`, read through the VM's shadow
//! translation), when the guest enables or lists it again — so resumed work is decided,
//! charged and watched like any other. While its work runs the VM is charged what its
//! channels ran (`Scheduler::charge`), so budgets and caps are paid while running, not at
//! completions that may come late.
//!
//! **Watchdog.** A submission that has run half of `HostConfig::watchdog_ns` since dispatch is
//! asked off the GPU, as a time slice asks (the engine operation in flight ends, the rest of
//! its work is queued again with a fresh deadline); one still on the GPU a whole watchdog after
//! dispatch and half a watchdog after it was asked off — a context switch not honoured, the
//! hardware's own test — is hung, and so is an engine busy a watchdog with a channel with
//! nothing in flight: the host resets the
//! engine (PMC ENABLE toggle, found through ENG_STATE), kills the guest channel (STATE RUNNABLE
//! cleared and kept clear until unbound; SCHED_ERROR CTXSW_TIMEOUT to the guest), drops its
//! work, charges the VM and goes on with the others. A dispatch may hold many kernels (doorbells
//! rung while the channel is busy merge), so its length says nothing about a hang; whether its
//! operation in flight ends does.

use gf100::{pfifo, ptimer, userd, Target};
use vm_memory::{Bytes, GuestAddress};

use crate::addr::HostVram;
use crate::channels::cmdscan::{self, Budget, Ring};
use crate::host::{HostConfig, HostState};
use crate::phys::AcquireState;
use crate::phys::{Bar, PhysicalGpu};
use crate::sched::{dispatchable, Decision, Submission, VmId};
use crate::shadow_pt::{GuestPdb, ShadowCtx, ShadowPt};
use crate::vgpu::VmCx;

/// A submission on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InFlight {
    pub sub: Submission,
    /// GPU time of dispatch (restarted when the watchdog killed a submission ahead of it): the
    /// watchdog's reference where the backend cannot measure per-channel time.
    pub start_ns: u64,
    /// What the channel had run when the submission was dispatched (measured mode): the
    /// watchdog's reference — what counts is what its channel has *run* since, however long
    /// it waited behind others ([`watch`]).
    pub ran_at: Option<u64>,
    /// Clock time of dispatch, never restarted: a channel runs at most as fast as the clock, so
    /// by clock time `t` it cannot have run more than `t - dispatched_ns` since `ran_at` was
    /// read — the watchdog asks the GPU what it ran only once that could be `watchdog_ns`.
    pub dispatched_ns: u64,
    /// The host is taking it off the GPU (its channel is disabled and switched out); it leaves
    /// once no engine runs it.
    pub preempting: bool,
    /// When the host first asked it off the GPU (a time slice, a cap, or the watchdog at half
    /// a watchdog of running): it is hung only if still on the GPU half a watchdog after that
    /// ([`watch`]).
    pub asked_off_ns: Option<u64>,
}

impl InFlight {
    /// GPU time the submission's channel has run since dispatch (measured mode).
    fn ran(&self, st: &HostState, phys: &dyn PhysicalGpu) -> Option<u64> {
        let at = self.ran_at?;
        let now = st.runtime.ran(phys, self.sub.phys_chid)?;
        Some(now.saturating_sub(at))
    }

    /// True if the channel may have run `ns` since dispatch by clock time `now` (measured
    /// mode): false is certain, true means "ask the GPU" ([`InFlight::ran`]).
    fn may_have_run(&self, now: u64, ns: u64) -> bool {
        self.ran_at.is_some() && now.saturating_sub(self.dispatched_ns) >= ns
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
    // Nothing new, nothing in flight, nothing left of earlier work (GP_GET short of the
    // physical GP_PUT: a parked or restored channel): nothing to run.
    if ch.gp_put == ch.phys_put && !busy && gp_get(st, phys, vm.phys_chid(g)) == ch.phys_put {
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

/// Physical channel `p`'s GP_GET, from its USERD page.
fn gp_get(st: &HostState, phys: &dyn PhysicalGpu, p: u32) -> u32 {
    let mut b = [0u8; 4];
    phys.read_vram(st.layout.userd_page(p).offset(userd::GP_GET), &mut b);
    u32::from_le_bytes(b)
}

/// Delivers period ticks, retires finished submissions, charges and preempts running work,
/// queues parked channels that may run again, and does what the scheduler decides.
pub(crate) fn progress(st: &mut HostState, phys: &dyn PhysicalGpu, cfg: &HostConfig) {
    let now = st.now(phys);
    st.sched.tick(now);
    check_completions(st, phys, now);
    watchdog(st, phys, now, cfg.watchdog_ns);
    charge_running(st, phys, now);
    end_slice(st, phys, now, cfg.timeslice_ns);
    wake_parked(st, phys, now, cfg.timeslice_ns);
    st.sched_timer = None;
    if st.inflight.iter().any(|f| f.preempting) {
        // The GPU is being handed over: nothing new until the preempted work is off.
        check_completions(st, phys, now);
        if st.inflight.iter().any(|f| f.preempting) {
            return;
        }
    }
    let max_inflight = cfg.max_inflight;
    // The submissions in flight, as the scheduler sees them: a buffer of the host's, reused
    // (this runs at every service of the GPU).
    let mut inflight = std::mem::take(&mut st.decide_buf);
    loop {
        inflight.clear();
        inflight.extend(st.inflight.iter().map(|f| f.sub));
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
    st.decide_buf = inflight;
}

/// Granularity of watchdog deadlines: PTIMER's resolution on GF100 (its low 5 bits read 0), so
/// that a host timed by PTIMER reads the deadline exactly when the clock reaches it.
const WATCHDOG_GRANULE_NS: u64 = 32;

/// Half the watchdog: a submission that has run this long since its dispatch is asked off the
/// GPU (unless a time slice or a cap already did), and one asked off is hung only if it is still
/// on the GPU this long after it was asked and a whole watchdog after its dispatch. The
/// operation in flight ends, the rest of the work is queued again with a fresh deadline: work
/// made of operations of up to half a watchdog is never taken for a hang, however much of it
/// one dispatch holds (doorbells rung while the channel is busy merge into one queued
/// submission, `sched/list.rs`), while a hung operation is killed a watchdog after its
/// dispatch, as before.
fn watchdog_half(watchdog_ns: u64) -> u64 {
    watchdog_ns / 2
}

impl InFlight {
    /// When the watchdog must look at it next, `to_half` and `to_whole` being when it will have
    /// run half and all of a watchdog: to ask it off, or once asked, to see whether it left.
    fn next_look(&self, to_half: u64, to_whole: u64, watchdog_ns: u64) -> u64 {
        match self.asked_off_ns {
            Some(t) => to_whole.max(t.saturating_add(watchdog_half(watchdog_ns))),
            None => to_half,
        }
    }
}

/// When the watchdog next looks (rounded up to PTIMER's 32 ns): when the oldest submission in
/// flight will have run half a watchdog (to ask it off the GPU), or for one asked off, when it
/// may be killed; `None` when off or nothing is in flight.
pub(crate) fn watchdog_deadline(
    st: &HostState,
    phys: &dyn PhysicalGpu,
    watchdog_ns: u64,
) -> Option<u64> {
    if watchdog_ns == 0 {
        return None;
    }
    let half = watchdog_half(watchdog_ns);
    let granule = |t: u64| t.next_multiple_of(WATCHDOG_GRANULE_NS);
    if st.runtime.measured() {
        // The earliest time a channel could have run half a watchdog (each runs at most as
        // fast as the clock): the host looks again then, and acts only on what really ran.
        let now = st.now(phys);
        // Without asking the GPU: none can before half a watchdog after its dispatch. A
        // per-channel read is a call into the GPU for every submission in flight, at every
        // service and quiet-date computation; only past that bound is it needed. The bound is
        // never later than the exact time with the host's clock (`GpuHost::set_clock`); a host
        // that reads PTIMER instead sees time in 32 ns steps and may look that late.
        let bound = st
            .inflight
            .iter()
            .filter(|f| f.ran_at.is_some())
            .map(|f| f.dispatched_ns.saturating_add(half))
            .min();
        if st.engine_watch.is_none() && bound.is_some_and(|t| t > now) {
            return bound.map(granule);
        }
        let after = |ran: u64, ns: u64| now.saturating_add(ns.saturating_sub(ran));
        return st
            .inflight
            .iter()
            .filter_map(|f| {
                f.ran(st, phys)
                    .map(|r| f.next_look(after(r, half), after(r, watchdog_ns), watchdog_ns))
            })
            .chain(
                st.engine_watch
                    .and_then(|(p, mark)| st.runtime.ran(phys, p).map(|r| r.saturating_sub(mark)))
                    .map(|r| after(r, watchdog_ns)),
            )
            .min()
            .map(granule);
    }
    st.inflight
        .iter()
        .map(|f| {
            f.next_look(
                f.start_ns.saturating_add(half),
                f.start_ns.saturating_add(watchdog_ns),
                watchdog_ns,
            )
        })
        .chain(
            st.engine_watch
                .map(|(_, since)| since.saturating_add(watchdog_ns)),
        )
        .map(granule)
        .min()
}

/// Submission `f` has run `ran` since its dispatch (its channel's time, or the clock's where
/// that is not measured) at `now`: hung (true) if it has run a whole watchdog and was asked
/// off the GPU at least half a watchdog ago; asked off now if it has run half a watchdog and
/// nobody asked yet — its engine operation ends, the rest of its work is queued again. A hung
/// kernel never leaves and is killed a watchdog after its dispatch; work of many operations
/// leaves at the next one's end. GP_GET plays no part: a guest can make it move behind a hung
/// kernel (semaphore acquires it releases from its CPU).
fn watch(
    st: &mut HostState,
    phys: &dyn PhysicalGpu,
    f: &InFlight,
    ran: u64,
    now: u64,
    watchdog_ns: u64,
) -> bool {
    let half = watchdog_half(watchdog_ns);
    if ran < half {
        return false;
    }
    if let Some(t) = f.asked_off_ns {
        let left_by = t.saturating_add(half).next_multiple_of(WATCHDOG_GRANULE_NS);
        return ran >= watchdog_ns && left_by <= now;
    }
    if let Some(i) = st.inflight.iter().position(|o| o.sub == f.sub) {
        log::debug!(
            "{}: channel {} ran half the watchdog in one dispatch: asked off the GPU",
            f.sub.vm,
            f.sub.guest_chid
        );
        switch_out(st, phys, i, now);
    }
    false
}

/// The hang watchdog (MxGPU-style hang detection, nouveau-style recovery): every submission
/// that has run half of `watchdog_ns` since its dispatch is asked off the GPU, and has its
/// channel killed if it is still on it a whole `watchdog_ns` after dispatch and half of one
/// after it was asked ([`watch`]).
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
        // What each ran, by the clock (the looks come at times rounded up to PTIMER's 32 ns,
        // never earlier than these thresholds).
        let ran = |f: &InFlight| now.saturating_sub(f.start_ns);
        let mut due: Vec<InFlight> = st
            .inflight
            .iter()
            .copied()
            .filter(|f| ran(f) >= watchdog_half(watchdog_ns))
            .collect();
        due.sort_by_key(|f| f.start_ns);
        for f in due {
            // A kill restarts the timers of the others (they waited behind it): each is taken
            // as it stands now.
            let Some(f) = st.inflight.iter().copied().find(|o| o.sub == f.sub) else {
                continue;
            };
            if watch(st, phys, &f, ran(&f), now, watchdog_ns) {
                kill(st, phys, f.sub.vm, f.sub.guest_chid, f.start_ns, now);
                killed = true;
            }
        }
        if killed {
            unaccounted = unaccounted_busy_channel(st, phys);
        }
    }
    watch_engines(st, phys, now, watchdog_ns, unaccounted);
}

/// The watchdog where per-channel GPU time is measured: a submission whose channel has run
/// half of `watchdog_ns` since its dispatch is asked off the GPU and, still on it once it has
/// run a whole one and half a one has passed since the ask, is hung ([`watch`]); so is a
/// channel that ran a watchdog on an engine with nothing in flight (work started outside the
/// scheduler). Waiting behind others costs nothing, so no deadline needs restarting.
fn watchdog_measured(st: &mut HostState, phys: &dyn PhysicalGpu, now: u64, watchdog_ns: u64) {
    let half = watchdog_half(watchdog_ns);
    let due: Vec<(InFlight, u64)> = st
        .inflight
        .iter()
        .copied()
        .filter(|f| f.may_have_run(now, half))
        .filter_map(|f| f.ran(st, phys).map(|r| (f, r)))
        .filter(|&(_, r)| r >= half)
        .collect();
    for (f, ran) in due {
        if watch(st, phys, &f, ran, now, watchdog_ns) {
            kill(st, phys, f.sub.vm, f.sub.guest_chid, f.start_ns, now);
        }
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
    let busy = phys
        .engine_states()
        .into_iter()
        .find_map(|s| (s & pfifo::ENG_STATE_BUSY != 0).then_some(s & pfifo::ENG_STATE_CHID_MASK));
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
    if let Some(mut vm) = st.vms.get_mut(&id) {
        if let Some(ch) = vm.chans.get_mut(g as usize) {
            ch.killed = true;
            ch.enabled = false;
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
    if gp_get(st, phys, p) == f.sub.put {
        return Status::Done;
    }
    if f.preempting {
        return Status::Ended;
    }
    let chan = phys.read_reg(pfifo::chan_table(p));
    let state = phys.read_reg(pfifo::chan_state(p));
    let listed = st
        .vms
        .get(&f.sub.vm)
        .is_some_and(|vm| vm.runlist.contains(&f.sub.guest_chid));
    if chan & pfifo::CHAN_VALID == 0
        || state & pfifo::STATE_RUNNABLE == 0
        || state & pfifo::STATE_ACQUIRE_PENDING != 0
        || !listed
    {
        Status::Ended
    } else {
        Status::Running
    }
}

/// Takes the channel of in-flight submission `i` off the GPU: disabled (the host's RUNNABLE
/// off; the engine field stays) and switched out (KICK: the preempt completes when its engine
/// operation ends, and the channel reloads its context from the shadow instance block before
/// it runs again). If the GPU had stopped the channel itself (a fault or PBDMA error cleared
/// RUNNABLE), the guest sees it stopped too.
fn switch_out(st: &mut HostState, phys: &dyn PhysicalGpu, i: usize, now: u64) {
    let f = st.inflight[i];
    let p = f.sub.phys_chid;
    let state = phys.read_reg(pfifo::chan_state(p));
    if !f.preempting && state & pfifo::STATE_RUNNABLE == 0 {
        if let Some(mut vm) = st.vms.get_mut(&f.sub.vm) {
            if let Some(ch) = vm.chans.get_mut(f.sub.guest_chid as usize) {
                ch.enabled = false;
            }
        }
    }
    phys.write_reg(pfifo::chan_state(p), state & pfifo::STATE_ENGINE_MASK);
    phys.write_reg(pfifo::KICK, p);
    st.inflight[i].preempting = true;
    st.inflight[i].asked_off_ns.get_or_insert(now);
}

/// The host's RUNNABLE of physical channel `p` off (the engine field stays): the channel may not
/// run until the host dispatches to it again.
pub(crate) fn runnable_off(phys: &dyn PhysicalGpu, p: u32) {
    let state = phys.read_reg(pfifo::chan_state(p));
    phys.write_reg(pfifo::chan_state(p), state & pfifo::STATE_ENGINE_MASK);
}

/// True when no engine runs an operation of physical channel `p`.
fn off_engines(phys: &dyn PhysicalGpu, p: u32) -> bool {
    !crate::channels::preempt::busy_channels(phys).contains(&Some(p))
}

fn check_completions(st: &mut HostState, phys: &dyn PhysicalGpu, now: u64) {
    let mut i = 0;
    while i < st.inflight.len() {
        let done = match status(phys, st, &st.inflight[i]) {
            Status::Running => {
                i += 1;
                continue;
            }
            Status::Done => {
                // Nothing left to run: the host's RUNNABLE goes off.
                runnable_off(phys, st.inflight[i].sub.phys_chid);
                true
            }
            Status::Ended => {
                if !st.inflight[i].preempting {
                    switch_out(st, phys, i, now);
                }
                if !off_engines(phys, st.inflight[i].sub.phys_chid) {
                    // Still on an engine: it holds the GPU for its VM until it is off.
                    i += 1;
                    continue;
                }
                false
            }
        };
        let f = st.inflight.remove(i);
        let more = st.inflight.iter().any(|o| o.sub.vm == f.sub.vm);
        let wall = st.acct.retired(f.sub.vm, now, more);
        let gpu_ns = st.charge_ran(phys, f.sub.vm, now).unwrap_or(wall);
        st.sched.complete(&f.sub, now, gpu_ns);
        if !more {
            st.slice = None;
        }
        let left = !done && gp_get(st, phys, f.sub.phys_chid) != f.sub.put;
        let Some(mut vm) = st.vms.get_mut(&f.sub.vm) else {
            st.counters.aborted += u64::from(!done);
            continue;
        };
        if done {
            st.counters.completed += 1;
            vm.stats.completions += 1;
            if let Some(ch) = vm.chans.get_mut(f.sub.guest_chid as usize) {
                ch.done_put = Some(f.sub.put);
            }
            continue;
        }
        st.counters.aborted += 1;
        vm.stats.aborted += 1;
        let g = f.sub.guest_chid;
        let Some(ch) = vm.chans.get_mut(g as usize) else {
            continue;
        };
        if left && ch.bound.is_some() && !ch.killed {
            // Work left: queued again when it may run (`wake_parked`).
            ch.parked = true;
            ch.retry_at = 0;
            st.parked.insert((f.sub.vm, g));
        }
    }
}

/// Measured mode: the VM whose work runs is charged what its channels ran so far, and its
/// policy pays it now (credit, utilisation, cap), not only at completion.
fn charge_running(st: &mut HostState, phys: &dyn PhysicalGpu, now: u64) {
    let Some(vm) = st.inflight.first().map(|f| f.sub.vm) else {
        return;
    };
    if !st.runtime.measured() {
        return;
    }
    // Only channels with a submission in flight can run (their RUNNABLE is the host's), so
    // reading just theirs is exact and keeps this per-exit step to one counter read per
    // channel (both cursors charged from it, as a completion does); the completion charges the
    // VM's whole range as before.
    let (mut acct, mut sched) = (0u64, 0u64);
    for i in 0..st.inflight.len() {
        let p = st.inflight[i].sub.phys_chid;
        let (a, s) = st.runtime.take_both(phys, p..p + 1).unwrap_or((0, 0));
        acct += a;
        sched += s;
    }
    if acct > 0 {
        st.acct.charge_measured(vm, acct, now);
    }
    if sched > 0 {
        st.sched.charge(vm, sched, now);
    }
}

/// Ends the time slice of the VM whose work is on the GPU by preempting it, when its cap is
/// used up, or when it has held the GPU `timeslice_ns` while another VM has work the policy
/// could run. The slice starts when the VM's first submission reaches an idle GPU.
fn end_slice(st: &mut HostState, phys: &dyn PhysicalGpu, now: u64, timeslice_ns: u64) {
    let Some(vm) = st.inflight.first().map(|f| f.sub.vm) else {
        st.slice = None;
        return;
    };
    if st.inflight.iter().any(|f| f.preempting) {
        return;
    }
    let since = match st.slice {
        Some((v, t)) if v == vm => t,
        _ => {
            st.slice = Some((vm, now));
            now
        }
    };
    let over_cap = st.sched.over_cap(vm, now);
    let slice_over = timeslice_ns > 0
        && now.saturating_sub(since) >= timeslice_ns
        && st.sched.others_waiting(vm);
    if !(over_cap || slice_over) {
        return;
    }
    if slice_over && !over_cap {
        st.sched.slice_expired(vm, now);
    }
    let n = st.inflight.len();
    for i in 0..n {
        switch_out(st, phys, i, now);
    }
    st.counters.preemptions += n as u64;
    if let Some(mut v) = st.vms.get_mut(&vm) {
        v.stats.preemptions += n as u64;
    }
    st.slice = None;
    log::debug!(
        "{vm}: {n} submission(s) preempted ({})",
        if over_cap {
            "cap used up"
        } else {
            "end of time slice"
        }
    );
    check_completions(st, phys, now);
}

/// When the VM whose work holds the GPU must next be looked at: the end of its time slice, or
/// the time its cap runs out, whichever comes first (`None` when nothing runs or a preempt is
/// already under way). A simulated-clock driver advances to it, so slices and caps end on time.
pub(crate) fn slice_deadline(
    st: &HostState,
    phys: &dyn PhysicalGpu,
    timeslice_ns: u64,
) -> Option<u64> {
    let (vm, since) = st.slice?;
    if st.inflight.is_empty() || st.inflight.iter().any(|f| f.preempting) {
        return None;
    }
    let now = st.now(phys);
    // A slice that ended with nobody waiting is looked at again at the next arrival (an
    // event of its own), not polled.
    let end = (timeslice_ns > 0)
        .then(|| since.saturating_add(timeslice_ns))
        .filter(|&t| t > now);
    let cap = st.sched.cap_runs_out(vm, now).filter(|&t| t > now);
    [end, cap].into_iter().flatten().min()
}

/// Queues the parked channels that may run again: bound, not killed, enabled and listed by
/// the guest, and not waiting on an acquire that would still fail. With a backend that cannot
/// tell what a channel waits on, a parked channel is retried once per time slice.
fn wake_parked(st: &mut HostState, phys: &dyn PhysicalGpu, now: u64, timeslice_ns: u64) {
    if st.parked.is_empty() {
        return;
    }
    let parked: Vec<(VmId, u32)> = st.parked.iter().copied().collect();
    for (id, g) in parked {
        let frozen = st.frozen.contains(&id);
        let Some(mut vm) = st.vms.get_mut(&id) else {
            st.parked.remove(&(id, g));
            continue;
        };
        let listed = vm.runlist.contains(&g);
        let p = vm.phys_chid(g);
        let Some(ch) = vm.chans.get_mut(g as usize) else {
            st.parked.remove(&(id, g));
            continue;
        };
        if !ch.parked || ch.bound.is_none() || ch.killed {
            ch.parked = false;
            st.parked.remove(&(id, g));
            continue;
        }
        if !ch.enabled || !listed || frozen {
            continue;
        }
        let rebuilding = ch
            .bound
            .as_ref()
            .and_then(|b| b.pdb)
            .is_some_and(|pdb| vm.shadow.pending(pdb));
        drop(vm);
        if rebuilding {
            continue;
        }
        let ready = match phys.channel_acquire(p) {
            AcquireState::None => true,
            AcquireState::Waiting(a) => acquire_would_pass(st, phys, id, g, a),
            AcquireState::Unknown => {
                let ch = &mut st.vms.get_mut(&id).expect("present").chans[g as usize];
                let due = now >= ch.retry_at;
                if due {
                    ch.retry_at = now.saturating_add(timeslice_ns.max(1));
                }
                due
            }
        };
        if !ready {
            continue;
        }
        if let Some(mut vm) = st.vms.get_mut(&id) {
            vm.chans[g as usize].parked = false;
            vm.stats.resumes += 1;
        }
        st.parked.remove(&(id, g));
        doorbell(st, phys, id, g);
    }
}

/// Would acquire `a` of VM `id`'s channel `g` succeed now? The semaphore is read as the GPU
/// would read it: through the channel's shadow translation. When that translation is stale
/// (lazy mode before its rebuild) or leads nowhere, the GPU decides: the channel is queued,
/// and it parks again or faults on its own memory.
fn acquire_would_pass(
    st: &mut HostState,
    phys: &dyn PhysicalGpu,
    id: VmId,
    g: u32,
    a: crate::phys::SemAcquire,
) -> bool {
    let Some(mut vm) = st.vms.get_mut(&id) else {
        return false;
    };
    let Some(pdb) = vm.chans[g as usize].bound.as_ref().and_then(|b| b.pdb) else {
        return true;
    };
    let mut cx = VmCx::new(phys, &mut st.hyp, &st.layout, &mut vm);
    if cx.shadow().0.is_stale(pdb) {
        return true;
    }
    let mut b = [0u8; 4];
    if !read_va(&mut cx, pdb, a.va, &mut b) {
        return true;
    }
    gf100::host::acquire_satisfied(a.op, a.payload, u32::from_le_bytes(b))
}

/// Reads `buf.len()` bytes at GPU VA `va` of `pdb` through the VM's shadow translation, only
/// from the VM's own VRAM slice or RAM; false if it leads elsewhere or nowhere.
fn read_va(cx: &mut VmCx, pdb: GuestPdb, va: u64, buf: &mut [u8]) -> bool {
    let (sh, scx) = cx.shadow();
    read_shadowed(sh, &scx, pdb, va, buf)
}

/// [`read_va`] on a borrowed shadow and its context (the pushbuffer scan reads many times).
fn read_shadowed(sh: &ShadowPt, scx: &ShadowCtx, pdb: GuestPdb, va: u64, buf: &mut [u8]) -> bool {
    let Some(t) = sh.translate(scx, pdb, va) else {
        return false;
    };
    match t.target {
        Target::Vram => {
            let slice = scx.mem.slice;
            let end = t.addr.saturating_add(buf.len() as u64 - 1);
            if slice.to_guest(HostVram(t.addr)).is_none() || slice.to_guest(HostVram(end)).is_none()
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
}

/// Dispatches `s`: shadows current, pushbuffer scan, physical TLB flushes, physical doorbell.
fn dispatch(st: &mut HostState, phys: &dyn PhysicalGpu, s: Submission, now: u64) {
    let Some(mut vm) = st.vms.get_mut(&s.vm) else {
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
    let runnable = vm.chans[g].enabled && !vm.chans[g].killed;
    if !(in_runlist && runnable) {
        vm.chans[g].held = true;
        vm.stats.held_submissions += 1;
        return;
    }
    let mut cx = VmCx::new(phys, &mut st.hyp, &st.layout, &mut vm);
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
    if pdb.is_some_and(|p| cx.vm.shadow.pending(p)) {
        // Its shadow is still being rebuilt (one budget per lock hold): GP_PUT is written (its
        // entries are scanned) but the channel stays disabled; the work is parked and queued
        // again once the rebuild is done.
        cx.vm.chans[g].parked = true;
        cx.vm.stats.held_submissions += 1;
        st.parked.insert((s.vm, s.guest_chid));
        return;
    }
    // The scheduler's decision: the channel may run (until its submission leaves the GPU).
    let state = phys.read_reg(pfifo::chan_state(p));
    phys.write_reg(pfifo::chan_state(p), state | pfifo::STATE_RUNNABLE);
    st.counters.dispatched += 1;
    let runnable = phys.read_reg(pfifo::chan_state(p)) & pfifo::STATE_RUNNABLE != 0;
    if runnable {
        let ran_at = st.runtime.ran(phys, p);
        if st.inflight.is_empty() {
            st.slice = Some((s.vm, now));
        }
        st.inflight.push(InFlight {
            sub: s,
            start_ns: now,
            ran_at,
            dispatched_ns: now,
            preempting: false,
            asked_off_ns: None,
        });
        st.acct.dispatched(s.vm, now);
        st.nonstall.insert(s.vm);
    } else {
        st.counters.aborted += 1;
        cx.vm.stats.aborted += 1;
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
    let mut reader = |va: u64, buf: &mut [u8]| read_shadowed(sh, &scx, pdb, va, buf);
    let out = cmdscan::scan(&mut reader, ring, from, to, scan, Budget::DEFAULT);
    if out.stop == cmdscan::Stop::Budget {
        log::debug!("pushbuffer scan budget exhausted ({out:?})");
    }
    out.flushes
}
