//! The machinery CREDIT and BAND share (Gdev's `gdev_sched.c` + `gdev_vsched_*.c`, one
//! physical GPU, compute queue only): a **run list** of VMs, a FIFO queue of submissions per VM,
//! a credit and a measured utilisation per VM, and the VM that currently holds the GPU.
//!
//! Events, each at its time `now` (ticks due before `now` are processed first, each at its own
//! time, so the state never depends on when the host got round to delivering a tick):
//!
//! - **tick** (every `period`, Gdev's `gcreditc` thread): each VM's utilisation becomes its GPU
//!   time since its window started over the time elapsed (capped at 100 %), and the window
//!   restarts once it is `util_window` long; then `credit += period x share`, bounded to
//!   `±credit_limit` ([`CreditBound`]).
//! - **arrival** of a submission of VM `v` (Gdev `schedule_compute`): it joins `v`'s queue. If
//!   the GPU is not held (no VM selected) `v` takes it; if a time buffer is running, `v` takes
//!   it and the buffer ends ("a short-running VM gets in first"), and with
//!   `requeue_on_lost_wait` the VM the buffer was held for goes to the tail of the run list;
//!   otherwise it waits. (With `arrival_yield`, a VM over its share that holds the GPU starts a
//!   time buffer instead.)
//! - **completion** of a submission of VM `u` (Gdev `select_next_compute`): `credit -= gpu time`,
//!   utilisation window `+= gpu time`; then *selection*: if the policy's demotion rule holds for
//!   `u` it moves to the tail of the run list; the next VM is the first in the list with queued
//!   work; if the policy's time-buffer rule holds for it (BAND: it is not `u` and is over its
//!   share) the GPU is held idle for `wait` (one chance), else it is selected.
//!
//! Gdev decides only at a context's *last* outstanding completion; here every completion is a
//! decision point, because a VM may keep several submissions in flight on several channels and
//! would otherwise never give the GPU up. While the selected VM differs from the VM whose work
//! is on the GPU, that work drains first (no overlap); the selected VM's queue is then
//! dispatched, up to `max_inflight`, and tops up as long as it stays selected.

use std::collections::{BTreeMap, VecDeque};

use super::{
    dispatchable, share_ppm, CreditBound, Decision, PolicySnapshot, PolicyVm, SchedParams,
    Submission, VmId,
};

/// What a rule sees of a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VmView {
    /// Credit, ns.
    pub credit_ns: i64,
    /// Utilisation as last measured at a tick, ppm.
    pub util_ppm: u32,
    /// Share, ppm.
    pub share_ppm: u32,
}

impl VmView {
    /// Gdev's "over its bandwidth": `bw_used > bw`.
    pub fn over_share(&self) -> bool {
        self.util_ppm > self.share_ppm
    }
}

/// The rules that tell one credit-based policy from another.
pub(crate) trait Rules: Send + std::fmt::Debug {
    /// Policy name.
    const NAME: &'static str;
    /// Does the policy ever hold the GPU idle (a time buffer)?
    const BUFFERS: bool;
    /// The name it reports with these parameters.
    fn name(&self, _p: &SchedParams) -> &'static str {
        Self::NAME
    }
    /// Does VM `u`, whose submission just completed, go to the tail of the run list?
    fn demote(&self, u: &VmView) -> bool;
    /// Is the GPU held idle for a time buffer before it goes to `next`, which is not the VM
    /// that just completed?
    fn buffer_before(&self, next: &VmView) -> bool;
    /// Does an arrival of the VM holding the GPU start a time buffer (Gdev's arrival yield)?
    fn yield_on_arrival(&self, v: &VmView, p: &SchedParams) -> bool;
}

#[derive(Debug)]
struct Entry {
    weight: u32,
    queue: VecDeque<Submission>,
    credit: i64,
    /// GPU time since the utilisation window started.
    com_time: u64,
    window_start: u64,
    util_ppm: u32,
    /// Its utilisation over the utilisation of all VMs (its share of the GPU's busy time),
    /// ppm, as of the last tick (`util_of_busy`).
    busy_ppm: u32,
    /// Its reaction time as observed (completion with nothing queued to its next doorbell): a
    /// decayed maximum, ns (`adaptive_wait`).
    reaction_ns: u64,
    /// When a completion of it left nothing queued, until its next doorbell.
    idle_since: Option<u64>,
    /// Its last gap was longer than `wait_max_ns`: it is not waited for until it comes back
    /// within that.
    away: bool,
    /// A capping policy holds its work back (its cap is used up): the GPU is never held idle
    /// for it, since it could not take it (`set_throttled`).
    throttled: bool,
    /// GPU time per completion, moving average (1/8), ns.
    gpu_per_completion_ns: u64,
}

/// A running time buffer.
#[derive(Debug, Clone, Copy)]
struct Buffer {
    until: u64,
    /// Who gets the GPU when it expires unclaimed. `None` for an adaptive buffer started when
    /// nobody had work queued (nobody is held yet; the first VM over its share that arrives
    /// is).
    then: Option<VmId>,
    /// The VM whose completion started it (selection is re-run for it on a retry).
    prev: VmId,
    /// Chances left including this one.
    chances: u32,
    /// An adaptive buffer (`adaptive_wait`): only a VM not over its share (or `prev`) takes
    /// it. Otherwise Gdev's: any arrival takes it.
    guarded: bool,
}

/// A run-list scheduler with rules `R`.
#[derive(Debug)]
pub(crate) struct ListSched<R: Rules> {
    pub(crate) rules: R,
    p: SchedParams,
    vms: BTreeMap<VmId, Entry>,
    order: Vec<VmId>,
    total_weight: u64,
    current: Option<VmId>,
    buffer: Option<Buffer>,
    next_tick: Option<u64>,
    queued: usize,
    waits: u64,
    waits_taken: u64,
    demotions: u64,
    ticks: u64,
    buffers_cancelled: u64,
}

impl<R: Rules> ListSched<R> {
    pub fn new(rules: R, p: SchedParams) -> ListSched<R> {
        if let Err(e) = p.validate() {
            panic!("invalid scheduler parameters: {e}");
        }
        ListSched {
            rules,
            p,
            vms: BTreeMap::new(),
            order: Vec::new(),
            total_weight: 0,
            current: None,
            buffer: None,
            next_tick: None,
            queued: 0,
            waits: 0,
            waits_taken: 0,
            demotions: 0,
            ticks: 0,
            buffers_cancelled: 0,
        }
    }

    pub fn params(&self) -> &SchedParams {
        &self.p
    }

    fn view(&self, vm: VmId) -> Option<VmView> {
        self.vms.get(&vm).map(|e| VmView {
            credit_ns: e.credit,
            util_ppm: if self.p.util_of_busy {
                e.busy_ppm
            } else {
                e.util_ppm
            },
            share_ppm: share_ppm(e.weight, self.total_weight),
        })
    }

    /// `period x share` of a VM, ns.
    fn replenishment(&self, weight: u32) -> i64 {
        if self.total_weight == 0 {
            return 0;
        }
        (u128::from(self.p.period_ns) * u128::from(weight) / u128::from(self.total_weight)) as i64
    }

    fn bound(&self, credit: i64) -> i64 {
        let limit = self.p.credit_limit_ns as i64;
        if credit > limit {
            match self.p.credit_bound {
                CreditBound::Clamp => limit,
                CreditBound::Zero => 0,
            }
        } else if credit < -limit {
            match self.p.credit_bound {
                CreditBound::Clamp => -limit,
                CreditBound::Zero => 0,
            }
        } else {
            credit
        }
    }

    /// Processes every period boundary up to `now`.
    pub fn catch_up(&mut self, now: u64) {
        while let Some(t) = self.next_tick.filter(|&t| t <= now) {
            self.tick_at(t);
            self.next_tick = Some(t + self.p.period_ns);
        }
    }

    fn tick_at(&mut self, t: u64) {
        self.ticks += 1;
        let window = self.p.util_window_ns;
        let adds: Vec<(VmId, i64)> = self
            .vms
            .iter()
            .map(|(&vm, e)| (vm, self.replenishment(e.weight)))
            .collect();
        for (vm, add) in adds {
            let credit = {
                let e = self.vms.get_mut(&vm).expect("present");
                // __gdev_credit_com_thread: bw_used = com_time * 100 / elapsed (capped); the
                // window restarts once it is GDEV_UPDATE_INTERVAL long.
                let elapsed = t.saturating_sub(e.window_start);
                if elapsed > 0 {
                    e.util_ppm = (u128::from(e.com_time) * 1_000_000 / u128::from(elapsed))
                        .min(1_000_000) as u32;
                }
                if elapsed >= window {
                    e.com_time = 0;
                    e.window_start = t;
                }
                // replenish_compute: credit += period x share, then the bound.
                e.credit.saturating_add(add)
            };
            let bounded = self.bound(credit);
            self.vms.get_mut(&vm).expect("present").credit = bounded;
        }
        // Each VM's part of the GPU's busy time (`util_of_busy`).
        let total: u64 = self.vms.values().map(|e| u64::from(e.util_ppm)).sum();
        for e in self.vms.values_mut() {
            e.busy_ppm = (u64::from(e.util_ppm) * 1_000_000)
                .checked_div(total)
                .unwrap_or(0) as u32;
        }
    }

    pub fn next_tick_ns(&self) -> Option<u64> {
        self.next_tick
    }

    pub fn add_vm(&mut self, vm: VmId, weight: u32, now: u64) {
        self.catch_up(now);
        if self.vms.contains_key(&vm) {
            return;
        }
        self.total_weight += u64::from(weight);
        self.vms.insert(
            vm,
            Entry {
                weight,
                queue: VecDeque::new(),
                credit: 0,
                com_time: 0,
                window_start: now,
                util_ppm: 0,
                busy_ppm: 0,
                reaction_ns: 0,
                idle_since: None,
                away: false,
                throttled: false,
                gpu_per_completion_ns: 0,
            },
        );
        // gdev_init_scheduler: a new vGPU starts with one replenishment.
        let c = self.replenishment(weight);
        let c = self.bound(c);
        self.vms.get_mut(&vm).expect("present").credit = c;
        self.order.push(vm);
        if self.next_tick.is_none() {
            self.next_tick = Some(now + self.p.period_ns);
        }
    }

    /// Changes a VM's weight from `now` on (its share is recomputed with the others'; credit
    /// already earned is kept). False for an unknown VM.
    pub fn set_weight(&mut self, vm: VmId, weight: u32, now: u64) -> bool {
        self.catch_up(now);
        let Some(e) = self.vms.get_mut(&vm) else {
            return false;
        };
        self.total_weight = self.total_weight - u64::from(e.weight) + u64::from(weight);
        e.weight = weight;
        true
    }

    pub fn remove_vm(&mut self, vm: VmId) -> usize {
        let Some(e) = self.vms.remove(&vm) else {
            return 0;
        };
        self.total_weight -= u64::from(e.weight);
        self.order.retain(|&v| v != vm);
        self.queued -= e.queue.len();
        if self.current == Some(vm) {
            self.current = None;
        }
        if self
            .buffer
            .is_some_and(|b| b.then == Some(vm) || b.prev == vm)
        {
            self.buffer = None;
        }
        e.queue.len()
    }

    pub fn remove_channel(&mut self, vm: VmId, guest_chid: u32) -> usize {
        let Some(e) = self.vms.get_mut(&vm) else {
            return 0;
        };
        let before = e.queue.len();
        e.queue.retain(|s| s.guest_chid != guest_chid);
        let n = before - e.queue.len();
        self.queued -= n;
        n
    }

    pub fn queued(&self) -> usize {
        self.queued
    }

    fn has_work(&self, vm: VmId) -> bool {
        self.vms.get(&vm).is_some_and(|e| !e.queue.is_empty())
    }

    fn first_with_work(&self) -> Option<VmId> {
        self.order.iter().copied().find(|&v| self.has_work(v))
    }

    pub fn submit(&mut self, s: Submission, now: u64) {
        self.catch_up(now);
        let Some(e) = self.vms.get_mut(&s.vm) else {
            log::warn!("{}: submission of unknown {}; dropped", R::NAME, s.vm);
            return;
        };
        if let Some(t) = e.idle_since.take() {
            // Its reaction time: a decayed maximum (up at once, down by 1/8 of the difference
            // per sample). A gap longer than `wait_max` is not a reaction a buffer could cover
            // (the guest paused, or its vCPU did not run): it is not counted, and the VM is not
            // waited for until it comes back within `wait_max` again.
            let g = now.saturating_sub(t);
            e.away = g > self.p.wait_max_ns;
            if !e.away {
                e.reaction_ns = if g >= e.reaction_ns {
                    g
                } else {
                    e.reaction_ns - (e.reaction_ns - g) / 8
                };
            }
        }
        match e.queue.iter_mut().find(|q| q.phys_chid == s.phys_chid) {
            Some(q) => q.put = s.put,
            None => {
                e.queue.push_back(s);
                self.queued += 1;
            }
        }
        let v = s.vm;
        if self
            .buffer
            .is_some_and(|b| b.then.is_none() && now >= b.until)
        {
            // An adaptive buffer nobody was held by (so no timer) is over.
            self.buffer = None;
        }
        if let Some(b) = self.buffer {
            let view = self.view(v).expect("present");
            if b.guarded && v != b.prev && self.rules.buffer_before(&view) {
                // A VM over its share cannot end an adaptive buffer: it is held with the
                // others (the first one to arrive is selected when the buffer ends).
                if b.then.is_none() {
                    self.waits += 1;
                    self.buffer = Some(Buffer { then: Some(v), ..b });
                }
                return;
            }
            // Whoever arrives while the GPU is held free takes it (Gdev: current == NULL).
            self.buffer = None;
            self.current = Some(v);
            if let Some(then) = b.then {
                self.waits_taken += 1;
                if self.p.requeue_on_lost_wait && then != v {
                    // The VM waited for is over its share and lost its turn: it goes behind
                    // the others, so that it cannot block the run list (see `SchedParams`).
                    self.move_to_tail(then);
                }
            }
            return;
        }
        match self.current {
            None => self.current = Some(v),
            Some(c) if c == v => {
                let others = self.vms.len() > 1;
                let view = self.view(v).expect("present");
                if self.p.arrival_yield && others && self.rules.yield_on_arrival(&view, &self.p) {
                    self.start_buffer(now, v, v, 1, self.p.wait_ns, false);
                }
            }
            Some(_) => {}
        }
    }

    fn start_buffer(
        &mut self,
        now: u64,
        then: VmId,
        prev: VmId,
        chances: u32,
        wait: u64,
        guarded: bool,
    ) {
        self.current = None;
        self.waits += 1;
        self.buffer = Some(Buffer {
            until: now.saturating_add(wait),
            then: Some(then),
            prev,
            chances,
            guarded,
        });
    }

    /// The adaptive buffer held after a completion of `u` (`adaptive_wait`): `u`'s reaction
    /// estimate times the margin, at least `wait_ns`; `None` if adaptive buffers are off, `u`
    /// is over its share (the buffer is for VMs under it), slower than `wait_max_ns`, or
    /// slower than `wait_max_ratio` times its GPU time per completion.
    fn adaptive_wait_for(&self, u: VmId) -> Option<u64> {
        if !self.p.adaptive_wait || self.vms.len() < 2 {
            return None;
        }
        let view = self.view(u)?;
        if view.over_share() {
            return None;
        }
        let e = self.vms.get(&u)?;
        let r = e.reaction_ns;
        if e.away
            || e.throttled
            || r > e
                .gpu_per_completion_ns
                .saturating_mul(u64::from(self.p.wait_max_ratio))
        {
            return None;
        }
        let w = (u128::from(r) * u128::from(self.p.wait_margin_pct) / 100) as u64;
        (w <= self.p.wait_max_ns).then(|| w.max(self.p.wait_ns))
    }

    pub fn complete(&mut self, s: &Submission, now: u64, gpu_ns: u64) {
        self.catch_up(now);
        let u = s.vm;
        let Some(e) = self.vms.get_mut(&u) else {
            return;
        };
        // gdev_select_next_compute: credit -= exec; com_time += exec.
        e.credit = e.credit.saturating_sub(gpu_ns.min(i64::MAX as u64) as i64);
        e.com_time = e.com_time.saturating_add(gpu_ns);
        e.idle_since = e.queue.is_empty().then_some(now);
        e.gpu_per_completion_ns = if e.gpu_per_completion_ns == 0 {
            gpu_ns
        } else {
            e.gpu_per_completion_ns - e.gpu_per_completion_ns / 8 + gpu_ns / 8
        };
        if self.buffer.is_some() {
            // A buffer is running (started by an earlier completion of `u`, which still had
            // work in flight): the list order is updated, the buffer stands.
            self.demote_if(u);
            return;
        }
        self.select_next(u, now, self.p.wait_chances);
    }

    fn demote_if(&mut self, u: VmId) {
        let Some(view) = self.view(u) else {
            return;
        };
        if self.rules.demote(&view) {
            self.move_to_tail(u);
        }
    }

    fn move_to_tail(&mut self, u: VmId) {
        if self.order.contains(&u) {
            self.order.retain(|&v| v != u);
            self.order.push(u);
            self.demotions += 1;
        }
    }

    /// Marks a VM whose work a capping policy holds back (or no longer does). While it is
    /// throttled no time buffer is held for it — it could not take the GPU when the buffer
    /// ends — and a buffer already held for it ends now: the GPU goes to the VM it was held
    /// from (or the first with work). Without this a capped VM under its BAND share keeps
    /// the GPU idle for a buffer after each of its completions while its bucket is empty.
    pub fn set_throttled(&mut self, vm: VmId, throttled: bool) {
        let Some(e) = self.vms.get_mut(&vm) else {
            return;
        };
        if e.throttled == throttled {
            return;
        }
        e.throttled = throttled;
        if !throttled {
            return;
        }
        if let Some(b) = self.buffer.filter(|b| b.prev == vm) {
            self.buffer = None;
            self.buffers_cancelled += 1;
            self.current = b.then.or_else(|| self.first_with_work());
        }
    }

    /// `vm` ran `gpu_ns` and is still running: its credit and utilisation pay it now.
    pub fn charge(&mut self, vm: VmId, gpu_ns: u64, now: u64) {
        self.catch_up(now);
        if let Some(e) = self.vms.get_mut(&vm) {
            e.credit = e.credit.saturating_sub(gpu_ns.min(i64::MAX as u64) as i64);
            e.com_time = e.com_time.saturating_add(gpu_ns);
        }
    }

    /// `vm`'s time slice ended while others waited: it goes to the tail of the run list.
    pub fn slice_expired(&mut self, vm: VmId, now: u64) {
        self.catch_up(now);
        self.move_to_tail(vm);
    }

    /// Another VM than `vm` has queued work and is not held back by a cap.
    pub fn others_waiting(&self, vm: VmId) -> bool {
        self.vms
            .iter()
            .any(|(&v, e)| v != vm && !e.queue.is_empty() && !e.throttled)
    }

    /// Is a VM held by a running time buffer (it has work queued, the GPU is kept idle for
    /// another VM)?
    fn held_by_buffer(&self, vm: VmId) -> bool {
        self.buffer
            .is_some_and(|b| b.prev != vm && self.has_work(vm))
    }

    /// Selection after a completion of `u` (or a buffer retry).
    fn select_next(&mut self, u: VmId, now: u64, chances: u32) {
        self.demote_if(u);
        let throttled = self.vms.get(&u).is_some_and(|e| e.throttled);
        let buffers = R::BUFFERS && self.p.wait_ns > 0 && !throttled;
        match self.first_with_work() {
            None => {
                self.current = None;
                // Adaptive: nobody has work, but `u` (under its share) is expected back; a VM
                // over its share that arrives first is held until then.
                if let Some(w) = self.adaptive_wait_for(u).filter(|_| buffers) {
                    self.buffer = Some(Buffer {
                        until: now.saturating_add(w),
                        then: None,
                        prev: u,
                        chances: 1,
                        guarded: true,
                    });
                }
            }
            Some(next) => {
                let view = self.view(next).expect("present");
                if next != u && buffers && self.rules.buffer_before(&view) {
                    let chances = chances.max(1);
                    match self.adaptive_wait_for(u) {
                        Some(w) => self.start_buffer(now, next, u, chances, w, true),
                        None => self.start_buffer(now, next, u, chances, self.p.wait_ns, false),
                    }
                } else {
                    self.current = Some(next);
                }
            }
        }
    }

    pub fn decide(&mut self, inflight: &[Submission], max_inflight: usize, now: u64) -> Decision {
        self.catch_up(now);
        if self.buffer.is_some_and(|b| b.then.is_some()) && self.queued == 0 {
            // Nobody is left to wait for.
            self.buffer = None;
            self.current = None;
        }
        if let Some(b) = self.buffer.filter(|b| b.then.is_none() && self.queued > 0) {
            // (Cannot happen: arrivals during an adaptive buffer take it or are held by it.)
            self.waits += 1;
            self.buffer = Some(Buffer {
                then: self.first_with_work(),
                ..b
            });
        }
        if let Some(b) = self.buffer {
            if now < b.until {
                return match b.then {
                    Some(_) => Decision::WaitUntil(b.until),
                    // Nobody held, nothing queued: nothing to wake up for.
                    None => Decision::Idle,
                };
            }
            self.buffer = None;
            if b.chances > 1 && self.vms.contains_key(&b.prev) {
                self.select_next(b.prev, now, b.chances - 1);
                if let Some(b) = self.buffer {
                    return match b.then {
                        Some(_) => Decision::WaitUntil(b.until),
                        None => Decision::Idle,
                    };
                }
            } else {
                self.current = b.then;
            }
        }
        // The selected VM lost its work (channel or VM removed) while the GPU is free: the
        // first VM with work gets it.
        if inflight.is_empty() && !self.current.is_some_and(|c| self.has_work(c)) {
            self.current = self.first_with_work();
        }
        let Some(c) = self.current else {
            return Decision::Idle;
        };
        if inflight.iter().any(|f| f.vm != c) {
            // Another VM's work drains first.
            return Decision::Idle;
        }
        let Some(e) = self.vms.get_mut(&c) else {
            return Decision::Idle;
        };
        let Some(i) = e
            .queue
            .iter()
            .position(|s| dispatchable(s, inflight, max_inflight))
        else {
            return Decision::Idle;
        };
        let s = e.queue.remove(i).expect("index from position");
        self.queued -= 1;
        Decision::Dispatch(s)
    }

    pub fn snapshot(&self) -> PolicySnapshot {
        PolicySnapshot {
            vms: self
                .vms
                .iter()
                .map(|(&vm, e)| PolicyVm {
                    vm,
                    weight: e.weight,
                    share_ppm: share_ppm(e.weight, self.total_weight),
                    queued: e.queue.len(),
                    credit_ns: Some(e.credit),
                    util_ppm: Some(e.util_ppm),
                    position: self.order.iter().position(|&v| v == vm),
                    held_by_buffer: self.held_by_buffer(vm),
                })
                .collect(),
            waits: self.waits,
            waits_taken: self.waits_taken,
            demotions: self.demotions,
            ticks: self.ticks,
            buffers_cancelled: self.buffers_cancelled,
        }
    }
}

/// Implements [`super::Scheduler`] for a newtype around a [`ListSched`] with rules `$rules`.
macro_rules! list_scheduler {
    ($ty:ty, $rules:ty) => {
        impl $crate::sched::Scheduler for $ty {
            fn name(&self) -> &'static str {
                $crate::sched::list::Rules::name(&self.0.rules, self.0.params())
            }
            fn add_vm(&mut self, vm: $crate::sched::VmId, weight: u32, now_ns: u64) {
                self.0.add_vm(vm, weight, now_ns)
            }
            fn remove_vm(&mut self, vm: $crate::sched::VmId) -> usize {
                self.0.remove_vm(vm)
            }
            fn set_weight(&mut self, vm: $crate::sched::VmId, weight: u32, now_ns: u64) -> bool {
                self.0.set_weight(vm, weight, now_ns)
            }
            fn submit(&mut self, s: $crate::sched::Submission, now_ns: u64) {
                self.0.submit(s, now_ns)
            }
            fn remove_channel(&mut self, vm: $crate::sched::VmId, guest_chid: u32) -> usize {
                self.0.remove_channel(vm, guest_chid)
            }
            fn complete(&mut self, s: &$crate::sched::Submission, now_ns: u64, gpu_ns: u64) {
                self.0.complete(s, now_ns, gpu_ns)
            }
            fn tick(&mut self, now_ns: u64) {
                self.0.catch_up(now_ns)
            }
            fn next_tick_ns(&self) -> Option<u64> {
                self.0.next_tick_ns()
            }
            fn decide(
                &mut self,
                inflight: &[$crate::sched::Submission],
                max_inflight: usize,
                now_ns: u64,
            ) -> $crate::sched::Decision {
                self.0.decide(inflight, max_inflight, now_ns)
            }
            fn queued(&self) -> usize {
                self.0.queued()
            }
            fn snapshot(&self) -> $crate::sched::PolicySnapshot {
                self.0.snapshot()
            }
            fn charge(&mut self, vm: $crate::sched::VmId, gpu_ns: u64, now_ns: u64) {
                self.0.charge(vm, gpu_ns, now_ns)
            }
            fn others_waiting(&self, vm: $crate::sched::VmId) -> bool {
                self.0.others_waiting(vm)
            }
            fn slice_expired(&mut self, vm: $crate::sched::VmId, now_ns: u64) {
                self.0.slice_expired(vm, now_ns)
            }
            fn set_throttled(&mut self, vm: $crate::sched::VmId, throttled: bool) {
                self.0.set_throttled(vm, throttled)
            }
        }
    };
}
pub(crate) use list_scheduler;
