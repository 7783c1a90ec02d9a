//! A deterministic stand-in for the host and the GPU, for testing policies without the device
//! model: one timeline on which dispatched submissions run back to back in dispatch order, the
//! host's service loop (completions, ticks, decisions, the wait timer) and scripted guests that
//! push kernels of given durations and ring doorbells.

use std::collections::{BTreeMap, VecDeque};

use super::{Accounting, Decision, Scheduler, Submission, VmId};

/// What happened, for exact-sequence assertions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ev {
    /// A submission was written to the GPU at `t`.
    Dispatch { t: u64, vm: u32, ch: u32, put: u32 },
    /// A submission completed at `t`.
    Complete { t: u64, vm: u32, ch: u32, put: u32 },
    /// The policy held the GPU idle at `t` until `until`.
    Wait { t: u64, until: u64 },
}

#[derive(Debug, Default, Clone)]
struct Chan {
    /// Kernel durations pushed, by GPFIFO index.
    kernels: Vec<u64>,
    /// GP_PUT the GPU was given.
    dispatched: u32,
    /// GP_PUT completed.
    completed: u32,
    /// When each completed put finished (for the guests' think time).
    completed_at: u64,
}

/// A guest that keeps `depth` kernels outstanding on each of its channels.
#[derive(Debug, Clone)]
pub(crate) struct Guest {
    pub vm: u32,
    pub channels: u32,
    pub depth: u32,
    /// Kernel durations, used in turn.
    pub kernels: Vec<u64>,
    pub start: u64,
    /// Delay between seeing a completion and pushing the next kernel.
    pub think: u64,
    next: usize,
}

impl Guest {
    pub fn new(vm: u32, channels: u32, depth: u32, kernels: Vec<u64>, start: u64) -> Guest {
        Guest {
            vm,
            channels,
            depth,
            kernels,
            start,
            think: 0,
            next: 0,
        }
    }
}

/// The mock host + GPU.
pub(crate) struct MockGpu {
    pub sched: Box<dyn Scheduler>,
    pub acct: Accounting,
    pub max_inflight: usize,
    pub now: u64,
    inflight: VecDeque<(Submission, u64)>,
    free_at: u64,
    chans: BTreeMap<(u32, u32), Chan>,
    pub log: Vec<Ev>,
    /// Sum of the durations the GPU executed.
    pub gpu_busy: u64,
    timer: Option<u64>,
    logged_wait: Option<u64>,
    /// Time the GPU was idle with work queued and no deliberate wait (must stay 0).
    pub idle_with_work: u64,
    /// Time the GPU was idle with work queued during a deliberate wait.
    pub wait_idle: u64,
    /// Per VM: the longest time a submission of it stayed queued.
    pub max_queue_delay: BTreeMap<u32, u64>,
    /// Oldest push not yet dispatched (per (vm, channel)).
    queued_since: BTreeMap<(u32, u32), u64>,
    /// Dispatch order as (vm, channel, put) for FIFO checks.
    pub dispatches: Vec<(u32, u32, u32)>,
    /// Doorbell order of first arrival per queued submission.
    pub arrivals: Vec<(u32, u32)>,
}

pub(crate) fn sub(vm: u32, ch: u32, put: u32) -> Submission {
    Submission {
        vm: VmId(vm),
        guest_chid: ch,
        phys_chid: vm * 64 + ch,
        put,
    }
}

impl MockGpu {
    pub fn new(sched: Box<dyn Scheduler>, max_inflight: usize) -> MockGpu {
        MockGpu {
            sched,
            acct: Accounting::default(),
            max_inflight,
            now: 0,
            inflight: VecDeque::new(),
            free_at: 0,
            chans: BTreeMap::new(),
            log: Vec::new(),
            gpu_busy: 0,
            timer: None,
            logged_wait: None,
            idle_with_work: 0,
            wait_idle: 0,
            max_queue_delay: BTreeMap::new(),
            queued_since: BTreeMap::new(),
            dispatches: Vec::new(),
            arrivals: Vec::new(),
        }
    }

    pub fn add_vm(&mut self, vm: u32, weight: u32) {
        self.sched.add_vm(VmId(vm), weight, self.now);
        self.acct.add_vm(VmId(vm), weight, self.now);
    }

    /// The guest of `vm` pushes a kernel of `ns` on channel `ch` and rings the doorbell.
    pub fn push(&mut self, vm: u32, ch: u32, ns: u64) {
        let c = self.chans.entry((vm, ch)).or_default();
        c.kernels.push(ns);
        let put = c.kernels.len() as u32;
        if c.dispatched + 1 == put {
            // Nothing of this channel was waiting: a new submission (FIFO order).
            self.arrivals.push((vm, ch));
        }
        self.queued_since.entry((vm, ch)).or_insert(self.now);
        self.sched.submit(sub(vm, ch, put), self.now);
        self.service();
    }

    /// Kernels of `vm` on `ch` pushed and not yet completed.
    pub fn outstanding(&self, vm: u32, ch: u32) -> u32 {
        self.chans
            .get(&(vm, ch))
            .map_or(0, |c| c.kernels.len() as u32 - c.completed)
    }

    /// The host's service: completions due, ticks, then decisions.
    pub fn service(&mut self) {
        while let Some(&(s, end)) = self.inflight.front() {
            if end > self.now {
                break;
            }
            self.inflight.pop_front();
            let more = self.inflight.iter().any(|(f, _)| f.vm == s.vm);
            let gpu_ns = self.acct.retired(s.vm, self.now, more);
            let c = self.chans.get_mut(&(s.vm.0, s.guest_chid)).expect("chan");
            c.completed = s.put;
            c.completed_at = self.now;
            self.log.push(Ev::Complete {
                t: self.now,
                vm: s.vm.0,
                ch: s.guest_chid,
                put: s.put,
            });
            self.sched.complete(&s, self.now, gpu_ns);
        }
        self.sched.tick(self.now);
        self.timer = None;
        loop {
            let inflight: Vec<Submission> = self.inflight.iter().map(|f| f.0).collect();
            match self.sched.decide(&inflight, self.max_inflight, self.now) {
                Decision::Dispatch(s) => {
                    assert!(
                        super::dispatchable(&s, &inflight, self.max_inflight),
                        "{s:?} is not dispatchable with {inflight:?}"
                    );
                    let c = self.chans.get_mut(&(s.vm.0, s.guest_chid)).expect("chan");
                    assert!(s.put > c.dispatched, "put goes forward");
                    let dur: u64 = c.kernels[c.dispatched as usize..s.put as usize]
                        .iter()
                        .sum();
                    c.dispatched = s.put;
                    let start = self.now.max(self.free_at);
                    let end = start + dur;
                    self.free_at = end;
                    self.gpu_busy += dur;
                    self.acct.dispatched(s.vm, self.now);
                    self.inflight.push_back((s, end));
                    if let Some(t0) = self.queued_since.remove(&(s.vm.0, s.guest_chid)) {
                        let d = self.max_queue_delay.entry(s.vm.0).or_default();
                        *d = (*d).max(self.now - t0);
                    }
                    self.dispatches.push((s.vm.0, s.guest_chid, s.put));
                    self.log.push(Ev::Dispatch {
                        t: self.now,
                        vm: s.vm.0,
                        ch: s.guest_chid,
                        put: s.put,
                    });
                }
                Decision::Idle => break,
                Decision::WaitUntil(t) => {
                    assert!(t > self.now, "a wait ends in the future");
                    if self.logged_wait != Some(t) {
                        self.log.push(Ev::Wait {
                            t: self.now,
                            until: t,
                        });
                        self.logged_wait = Some(t);
                    }
                    self.timer = Some(t);
                    break;
                }
            }
        }
    }

    /// The next time something happens on its own.
    pub fn next_event(&self) -> Option<u64> {
        let gpu = self.inflight.front().map(|f| f.1);
        match (gpu, self.timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Moves time to `t`, recording idle time with queued work.
    pub fn advance_to(&mut self, t: u64) {
        assert!(t >= self.now);
        if self.inflight.is_empty() && self.sched.queued() > 0 {
            if self.timer.is_some() {
                self.wait_idle += t - self.now;
            } else {
                self.idle_with_work += t - self.now;
            }
        }
        self.now = t;
        self.service();
    }

    /// Runs closed-loop guests until `end`, then lets the GPU drain.
    pub fn run(&mut self, guests: &mut [Guest], end: u64) {
        loop {
            // Guests top up, in a fixed order.
            let mut wake: Option<u64> = None;
            for g in guests.iter_mut() {
                if self.now < g.start || self.now >= end {
                    if self.now < g.start {
                        wake = Some(wake.map_or(g.start, |w: u64| w.min(g.start)));
                    }
                    continue;
                }
                for ch in 0..g.channels {
                    loop {
                        let c = self.chans.get(&(g.vm, ch));
                        let ready = c.map_or(0, |c| c.completed_at + g.think);
                        if self.outstanding(g.vm, ch) >= g.depth {
                            break;
                        }
                        if ready > self.now && c.is_some_and(|c| c.completed > 0) {
                            wake = Some(wake.map_or(ready, |w: u64| w.min(ready)));
                            break;
                        }
                        let ns = g.kernels[g.next % g.kernels.len()];
                        g.next += 1;
                        self.push(g.vm, ch, ns);
                    }
                }
            }
            let next = [self.next_event(), wake, (self.now < end).then_some(end)]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t > self.now => self.advance_to(t),
                Some(_) => self.service(),
                None => break,
            }
            if self.now >= end && self.inflight.is_empty() && self.timer.is_none() {
                if self.sched.queued() == 0 {
                    break;
                }
                // Queued work with nothing in flight and no timer: the policy is stuck.
                self.service();
                if self.inflight.is_empty() && self.timer.is_none() {
                    panic!("policy idle with {} queued", self.sched.queued());
                }
            }
        }
    }

    /// GPU time per VM as accounted.
    pub fn busy(&self, vm: u32) -> u64 {
        self.acct.busy_ns(VmId(vm), self.now)
    }
}
