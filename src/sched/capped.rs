//! Caps, and the policies operators know from NVIDIA vGPU and HAMi:
//!
//! - [`CapLayer`]: the layer every policy made by [`super::Policy::create`] runs under. A VM
//!   with a cap ([`Scheduler::set_cap`]: a profile's `cap_pct`, or `gpuvm ctl cap` at run
//!   time) never gets more GPU time than its cap, whatever the policy, even when the GPU would
//!   otherwise be idle (NVIDIA's fixed share, HAMi's core limit).
//! - [`EqualShareScheduler`] (`equal-share`): every VM present gets the same share, whatever
//!   its weight — BAND's rules with every weight 1. Work-conserving: an idle VM's time goes to
//!   the others.
//! - `fixed-share` ([`CapLayer::fixed_share`]): BAND's rules, and every VM is capped: by the
//!   cap set for it or else by its weight's share (`weight / sum of weights` over the VMs
//!   present).
//!
//! **How a cap is held.** Each capped VM has a token bucket of GPU time: it earns `cap x
//! elapsed` and pays the GPU time its work **runs**, while it runs ([`Scheduler::charge`], told
//! by the host as it measures it) and the rest at completion; the bucket holds at most `cap x
//! period` (one period's worth, so a VM that was idle can burst that much and no more). When the
//! bucket empties while the VM's work runs, [`Scheduler::over_cap`] says so and the host
//! preempts that work (`crate::host::dispatch`); the VM is let back once its bucket holds half
//! a burst again, so that it runs long enough to pay for its resume's context switch: it stops at the next method boundary, after
//! the engine operation it is in (Fermi cannot preempt inside a kernel). While the bucket is
//! empty (<= 0) the VM's submissions — including work the preempt took off the GPU and work
//! resumed from a semaphore acquire — are held back here and the inner policy never sees
//! them; when it refills they are handed over. The bucket goes negative by at most the engine
//! operation that was running at the preempt; that debt is repaid before the VM runs again.
//! When only held VMs have work the layer answers [`Decision::WaitUntil`] the time the
//! earliest bucket refills, so the host's timer wakes it (no polling).

use std::collections::BTreeMap;

use super::{
    share_ppm, BandScheduler, Decision, PolicySnapshot, SchedParams, Scheduler, Submission, VmId,
};

/// `equal-share`: BAND with every VM's weight taken as 1.
#[derive(Debug)]
pub struct EqualShareScheduler(BandScheduler);

impl EqualShareScheduler {
    /// An equal-share scheduler with BAND's parameters.
    pub fn new(params: SchedParams) -> EqualShareScheduler {
        EqualShareScheduler(BandScheduler::new(params))
    }
}

impl Scheduler for EqualShareScheduler {
    fn name(&self) -> &'static str {
        "equal-share"
    }
    fn add_vm(&mut self, vm: VmId, _weight: u32, now_ns: u64) {
        self.0.add_vm(vm, 1, now_ns)
    }
    fn remove_vm(&mut self, vm: VmId) -> usize {
        self.0.remove_vm(vm)
    }
    fn submit(&mut self, s: Submission, now_ns: u64) {
        self.0.submit(s, now_ns)
    }
    fn remove_channel(&mut self, vm: VmId, guest_chid: u32) -> usize {
        self.0.remove_channel(vm, guest_chid)
    }
    fn complete(&mut self, s: &Submission, now_ns: u64, gpu_ns: u64) {
        self.0.complete(s, now_ns, gpu_ns)
    }
    fn tick(&mut self, now_ns: u64) {
        self.0.tick(now_ns)
    }
    fn next_tick_ns(&self) -> Option<u64> {
        self.0.next_tick_ns()
    }
    fn decide(&mut self, inflight: &[Submission], max_inflight: usize, now_ns: u64) -> Decision {
        self.0.decide(inflight, max_inflight, now_ns)
    }
    fn queued(&self) -> usize {
        self.0.queued()
    }
    fn snapshot(&self) -> PolicySnapshot {
        self.0.snapshot()
    }
    fn charge(&mut self, vm: VmId, gpu_ns: u64, now_ns: u64) {
        self.0.charge(vm, gpu_ns, now_ns)
    }
    fn others_waiting(&self, vm: VmId) -> bool {
        self.0.others_waiting(vm)
    }
    fn slice_expired(&mut self, vm: VmId, now_ns: u64) {
        self.0.slice_expired(vm, now_ns)
    }
    fn set_throttled(&mut self, vm: VmId, throttled: bool) {
        self.0.set_throttled(vm, throttled)
    }
}

/// One VM's cap and bucket.
#[derive(Debug, Clone)]
struct Capped {
    weight: u32,
    /// An explicit cap (ppm); `None`: the weight's share under `fixed-share`, else no cap.
    cap: Option<u32>,
    /// GPU time the VM may still use (ns); negative = debt.
    tokens: i64,
    /// Time up to which `tokens` has been refilled.
    last_ns: u64,
    /// The bucket ran empty and the VM waits until it holds half a burst again (so that a VM
    /// let back in runs long enough to pay for the context switch of its resume, instead of
    /// being preempted again at once).
    refilling: bool,
    /// Submissions held back while the bucket is empty, one per channel (coalesced).
    held: BTreeMap<u32, Submission>,
    /// Submissions handed to the inner policy and not dispatched yet, one per channel.
    passed: BTreeMap<u32, Submission>,
}

/// Caps over any policy (see the module documentation).
pub struct CapLayer {
    inner: Box<dyn Scheduler>,
    /// `fixed-share`: every VM without a cap of its own is capped at its weight's share.
    fixed_share: bool,
    period_ns: u64,
    vms: BTreeMap<VmId, Capped>,
    total_weight: u64,
}

impl std::fmt::Debug for CapLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapLayer")
            .field("inner", &self.inner.name())
            .field("fixed_share", &self.fixed_share)
            .field("vms", &self.vms)
            .finish_non_exhaustive()
    }
}

/// `fixed-share`: BAND with a cap on every VM (the name it had before caps held for every
/// policy).
pub type FixedShareScheduler = CapLayer;

impl CapLayer {
    /// Caps over `inner`; a VM has a cap only once one is set for it. The burst a bucket holds
    /// is one `params.period_ns` of the VM's cap.
    pub fn over(inner: Box<dyn Scheduler>, params: &SchedParams) -> CapLayer {
        CapLayer {
            inner,
            fixed_share: false,
            period_ns: params.period_ns,
            vms: BTreeMap::new(),
            total_weight: 0,
        }
    }

    /// `fixed-share`: BAND with BAND's parameters, every VM capped.
    pub fn fixed_share(params: SchedParams) -> CapLayer {
        CapLayer {
            fixed_share: true,
            ..CapLayer::over(Box::new(BandScheduler::new(params.clone())), &params)
        }
    }

    /// The `fixed-share` scheduler (BAND, every VM capped) with BAND's parameters.
    pub fn new(params: SchedParams) -> CapLayer {
        CapLayer::fixed_share(params)
    }

    fn cap_of(&self, c: &Capped) -> Option<u32> {
        c.cap
            .or_else(|| {
                self.fixed_share
                    .then(|| share_ppm(c.weight, self.total_weight))
            })
            .map(|cap| cap.max(1))
    }

    fn burst(&self, cap: u32) -> i64 {
        (u128::from(self.period_ns) * u128::from(cap) / 1_000_000) as i64
    }

    /// Refills every capped VM's bucket up to `now`; hands the held work of VMs whose bucket
    /// is positive again to the inner policy, and takes back the queued work of VMs whose
    /// bucket is empty.
    fn refill(&mut self, now: u64) {
        // Without a capped VM (the common case: it runs at every decision) nothing to refill,
        // and no list of them to allocate.
        if self.vms.values().all(|c| self.cap_of(c).is_none()) {
            return;
        }
        let ids: Vec<VmId> = self.vms.keys().copied().collect();
        for vm in ids {
            let c = &self.vms[&vm];
            let Some(cap) = self.cap_of(c) else {
                continue;
            };
            let c = c.clone();
            let burst = self.burst(cap);
            let dt = now.saturating_sub(c.last_ns);
            let earned = (u128::from(dt) * u128::from(cap) / 1_000_000).min(i64::MAX as u128);
            let tokens = c.tokens.saturating_add(earned as i64).min(burst.max(1));
            let e = self.vms.get_mut(&vm).expect("present");
            e.tokens = tokens;
            e.last_ns = now.max(c.last_ns);
            if tokens <= 0 {
                e.refilling = true;
            } else if tokens >= (burst / 2).max(1) {
                e.refilling = false;
            }
            let blocked = e.refilling;
            // An empty bucket: the policy must not hold the GPU idle for this VM.
            self.inner.set_throttled(vm, blocked);
            if !blocked {
                for (_, s) in std::mem::take(&mut e.held) {
                    e.passed.insert(s.guest_chid, s);
                    self.inner.submit(s, now);
                }
            } else {
                let passed = std::mem::take(&mut e.passed);
                for (ch, s) in passed {
                    self.inner.remove_channel(vm, ch);
                    e.held.insert(ch, s);
                }
            }
        }
    }

    /// When the earliest refilling bucket with held work holds half a burst again.
    fn next_refill(&self, now: u64) -> Option<u64> {
        self.vms
            .values()
            .filter(|c| !c.held.is_empty() && c.refilling)
            .filter_map(|c| {
                let cap = self.cap_of(c)?;
                let want = (self.burst(cap) / 2).max(1);
                let cap = u128::from(cap);
                let need = want.saturating_sub(c.tokens).max(1) as u128;
                Some(
                    now + need
                        .saturating_mul(1_000_000)
                        .div_ceil(cap)
                        .min(u64::MAX as u128 / 2) as u64,
                )
            })
            .min()
    }

    /// Pays `gpu_ns` from `vm`'s bucket, if it has a cap.
    fn pay(&mut self, vm: VmId, gpu_ns: u64) {
        let capped = self.vms.get(&vm).and_then(|c| self.cap_of(c)).is_some();
        if let Some(c) = self.vms.get_mut(&vm).filter(|_| capped) {
            c.tokens = c
                .tokens
                .saturating_sub(i64::try_from(gpu_ns).unwrap_or(i64::MAX));
            c.refilling |= c.tokens <= 0;
            // Before the policy selects the next VM: no buffer for a VM that cannot run.
            self.inner.set_throttled(vm, c.refilling);
        }
    }
}

impl Scheduler for CapLayer {
    fn name(&self) -> &'static str {
        if self.fixed_share {
            "fixed-share"
        } else {
            self.inner.name()
        }
    }

    fn add_vm(&mut self, vm: VmId, weight: u32, now_ns: u64) {
        self.inner.add_vm(vm, weight, now_ns);
        if self.vms.contains_key(&vm) {
            return;
        }
        self.total_weight += u64::from(weight);
        let c = Capped {
            weight,
            cap: None,
            tokens: 0,
            last_ns: now_ns,
            refilling: false,
            held: BTreeMap::new(),
            passed: BTreeMap::new(),
        };
        // A new VM starts with one period's burst, as BAND gives it one replenishment.
        let tokens = self.cap_of(&c).map_or(0, |cap| self.burst(cap).max(1));
        self.vms.insert(vm, Capped { tokens, ..c });
    }

    fn remove_vm(&mut self, vm: VmId) -> usize {
        let held = self.vms.remove(&vm).map_or(0, |c| {
            self.total_weight -= u64::from(c.weight);
            c.held.len()
        });
        held + self.inner.remove_vm(vm)
    }

    fn set_weight(&mut self, vm: VmId, weight: u32, now_ns: u64) -> bool {
        self.refill(now_ns);
        if !self.vms.contains_key(&vm) || !self.inner.set_weight(vm, weight, now_ns) {
            return false;
        }
        let c = self.vms.get_mut(&vm).expect("present");
        self.total_weight = self.total_weight - u64::from(c.weight) + u64::from(weight);
        c.weight = weight;
        true
    }

    fn set_cap(&mut self, vm: VmId, cap_ppm: Option<u32>, now_ns: u64) -> Result<(), String> {
        if let Some(c) = cap_ppm {
            if c == 0 || c > 1_000_000 {
                return Err(format!("cap {c} ppm must be 1..=1000000"));
            }
        }
        self.refill(now_ns);
        let Some(c) = self.vms.get(&vm) else {
            return Err(format!("no such VM {vm}"));
        };
        let was_capped = self.cap_of(c).is_some();
        let c = self.vms.get_mut(&vm).expect("present");
        c.cap = cap_ppm;
        c.last_ns = now_ns;
        let now_capped = self.vms.get(&vm).and_then(|c| self.cap_of(c));
        match now_capped {
            // A fresh bucket holds one period's burst.
            Some(cap) if !was_capped => {
                let burst = self.burst(cap).max(1);
                self.vms.get_mut(&vm).expect("present").tokens = burst;
            }
            Some(_) => {}
            None => {
                // No cap any more: what was held back goes to the policy.
                let c = self.vms.get_mut(&vm).expect("present");
                c.tokens = 0;
                c.refilling = false;
                for (_, s) in std::mem::take(&mut c.held) {
                    c.passed.insert(s.guest_chid, s);
                    self.inner.submit(s, now_ns);
                }
                self.inner.set_throttled(vm, false);
            }
        }
        self.refill(now_ns);
        Ok(())
    }

    fn cap_ppm(&self, vm: VmId) -> Option<u32> {
        self.vms.get(&vm).and_then(|c| self.cap_of(c))
    }

    fn throttled(&self, vm: VmId) -> bool {
        self.vms.get(&vm).is_some_and(|c| !c.held.is_empty())
    }

    fn submit(&mut self, s: Submission, now_ns: u64) {
        self.refill(now_ns);
        let capped = self.vms.get(&s.vm).and_then(|c| self.cap_of(c)).is_some();
        let Some(c) = self.vms.get_mut(&s.vm) else {
            // Unknown VM: let the policy decide what to do with it (it ignores it too).
            self.inner.submit(s, now_ns);
            return;
        };
        if !capped || !c.refilling {
            c.passed.insert(s.guest_chid, s);
            self.inner.submit(s, now_ns);
        } else {
            c.held.insert(s.guest_chid, s);
        }
    }

    fn remove_channel(&mut self, vm: VmId, guest_chid: u32) -> usize {
        let held = self.vms.get_mut(&vm).map_or(0, |c| {
            c.passed.remove(&guest_chid);
            usize::from(c.held.remove(&guest_chid).is_some())
        });
        held + self.inner.remove_channel(vm, guest_chid)
    }

    fn complete(&mut self, s: &Submission, now_ns: u64, gpu_ns: u64) {
        self.refill(now_ns);
        self.pay(s.vm, gpu_ns);
        self.inner.complete(s, now_ns, gpu_ns);
        // Take back what an emptied bucket may no longer run.
        self.refill(now_ns);
    }

    fn charge(&mut self, vm: VmId, gpu_ns: u64, now_ns: u64) {
        self.pay(vm, gpu_ns);
        self.inner.charge(vm, gpu_ns, now_ns);
    }

    fn over_cap(&mut self, vm: VmId, now_ns: u64) -> bool {
        let capped = self.vms.get(&vm).and_then(|c| self.cap_of(c)).is_some();
        if !capped {
            return false;
        }
        self.refill(now_ns);
        self.vms.get(&vm).is_some_and(|c| c.refilling)
    }

    fn cap_runs_out(&self, vm: VmId, now_ns: u64) -> Option<u64> {
        let c = self.vms.get(&vm)?;
        let cap = self.cap_of(c)?;
        if cap >= 1_000_000 {
            return None;
        }
        // Tokens as of `now` (what was earned since the last refill), drained at 1 - cap.
        let earned = u128::from(now_ns.saturating_sub(c.last_ns)) * u128::from(cap) / 1_000_000;
        let tokens = (i128::from(c.tokens) + earned as i128).max(0) as u128;
        let ns = tokens * 1_000_000 / u128::from(1_000_000 - cap);
        Some(now_ns.saturating_add(ns.min(u128::from(u64::MAX / 2)) as u64))
    }

    fn others_waiting(&self, vm: VmId) -> bool {
        self.inner.others_waiting(vm)
    }

    fn slice_expired(&mut self, vm: VmId, now_ns: u64) {
        self.inner.slice_expired(vm, now_ns)
    }

    fn set_throttled(&mut self, vm: VmId, throttled: bool) {
        self.inner.set_throttled(vm, throttled)
    }

    fn tick(&mut self, now_ns: u64) {
        self.inner.tick(now_ns);
    }

    fn next_tick_ns(&self) -> Option<u64> {
        self.inner.next_tick_ns()
    }

    fn decide(&mut self, inflight: &[Submission], max_inflight: usize, now_ns: u64) -> Decision {
        self.refill(now_ns);
        let d = self.inner.decide(inflight, max_inflight, now_ns);
        if let Decision::Dispatch(s) = d {
            if let Some(c) = self.vms.get_mut(&s.vm) {
                if c.passed.get(&s.guest_chid).is_some_and(|p| p.put <= s.put) {
                    c.passed.remove(&s.guest_chid);
                }
            }
            return d;
        }
        let refill = self.next_refill(now_ns);
        match (d, refill) {
            (Decision::WaitUntil(t), Some(r)) => Decision::WaitUntil(t.min(r)),
            (Decision::Idle, Some(r)) => Decision::WaitUntil(r),
            (d, _) => d,
        }
    }

    fn queued(&self) -> usize {
        self.inner.queued() + self.vms.values().map(|c| c.held.len()).sum::<usize>()
    }

    fn snapshot(&self) -> PolicySnapshot {
        let mut snap = self.inner.snapshot();
        for v in &mut snap.vms {
            if let Some(c) = self.vms.get(&v.vm) {
                v.queued += c.held.len();
            }
        }
        snap
    }
}
