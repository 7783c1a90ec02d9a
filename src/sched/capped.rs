//! The policies operators know from NVIDIA vGPU and HAMi, on top of BAND:
//!
//! - [`EqualShareScheduler`] (`equal-share`): every VM present gets the same share, whatever
//!   its weight — BAND's rules with every weight 1. Work-conserving: an idle VM's time goes to
//!   the others.
//! - [`FixedShareScheduler`] (`fixed-share`): BAND's rules, and every VM is **capped**: it never
//!   gets more GPU time than its cap, even when the GPU would otherwise be idle (NVIDIA's fixed
//!   share, HAMi's core limit). A VM's cap is the one set for it ([`Scheduler::set_cap`]: a
//!   profile's `cap_pct`, or `gpuvm ctl cap` at run time) or else its weight's share
//!   (`weight / sum of weights` over the VMs present).
//!
//! **How a cap is held.** GPU work is not preemptive, so a cap can only be held by admission.
//! Each capped VM has a token bucket of GPU time: it earns `cap x elapsed` and pays the GPU
//! time charged at each completion; the bucket holds at most `cap x period` (one period's
//! worth, so a VM that was idle can burst that much and no more). While the bucket is empty
//! (<= 0) the VM's submissions are held back here and the inner BAND never sees them; when it
//! refills they are handed over. A submission already in flight runs to its end, so the bucket
//! can go negative by up to the work of `max_inflight` submissions; that debt is repaid before
//! the VM runs again, so over any run the VM's GPU time is at most `cap x elapsed + burst`.
//! When only held VMs have work the policy answers [`Decision::WaitUntil`] the time the
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
}

/// One VM's cap and bucket.
#[derive(Debug, Clone)]
struct Capped {
    weight: u32,
    /// An explicit cap (ppm); `None`: the weight's share.
    cap: Option<u32>,
    /// GPU time the VM may still use (ns); negative = debt.
    tokens: i64,
    /// Time up to which `tokens` has been refilled.
    last_ns: u64,
    /// Submissions held back while the bucket is empty, one per channel (coalesced).
    held: BTreeMap<u32, Submission>,
    /// Submissions handed to BAND and not dispatched yet, one per channel.
    passed: BTreeMap<u32, Submission>,
}

/// `fixed-share`: BAND with a cap per VM (see the module documentation).
#[derive(Debug)]
pub struct FixedShareScheduler {
    inner: BandScheduler,
    period_ns: u64,
    vms: BTreeMap<VmId, Capped>,
    total_weight: u64,
}

impl FixedShareScheduler {
    /// A fixed-share scheduler with BAND's parameters; the burst a bucket holds is one
    /// `period_ns` of the VM's cap.
    pub fn new(params: SchedParams) -> FixedShareScheduler {
        FixedShareScheduler {
            period_ns: params.period_ns,
            inner: BandScheduler::new(params),
            vms: BTreeMap::new(),
            total_weight: 0,
        }
    }

    fn cap_of(&self, c: &Capped) -> u32 {
        c.cap
            .unwrap_or_else(|| share_ppm(c.weight, self.total_weight))
            .max(1)
    }

    fn burst(&self, cap: u32) -> i64 {
        (u128::from(self.period_ns) * u128::from(cap) / 1_000_000) as i64
    }

    /// Refills every bucket up to `now`; hands the held work of VMs whose bucket is positive
    /// again to BAND, and takes back the queued work of VMs whose bucket is empty.
    fn refill(&mut self, now: u64) {
        let ids: Vec<VmId> = self.vms.keys().copied().collect();
        for vm in ids {
            let (cap, c) = {
                let c = &self.vms[&vm];
                (self.cap_of(c), c.clone())
            };
            let burst = self.burst(cap);
            let dt = now.saturating_sub(c.last_ns);
            let earned = (u128::from(dt) * u128::from(cap) / 1_000_000).min(i64::MAX as u128);
            let tokens = c.tokens.saturating_add(earned as i64).min(burst.max(1));
            let e = self.vms.get_mut(&vm).expect("present");
            e.tokens = tokens;
            e.last_ns = now.max(c.last_ns);
            // An empty bucket: BAND must not hold the GPU idle for this VM.
            self.inner.set_throttled(vm, tokens <= 0);
            if tokens > 0 {
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

    /// When the earliest empty bucket with held work becomes positive.
    fn next_refill(&self, now: u64) -> Option<u64> {
        self.vms
            .values()
            .filter(|c| !c.held.is_empty() && c.tokens <= 0)
            .map(|c| {
                let cap = u128::from(self.cap_of(c));
                let need = (1 - c.tokens) as u128; // tokens <= 0: need > 0
                now + need
                    .saturating_mul(1_000_000)
                    .div_ceil(cap)
                    .min(u64::MAX as u128 / 2) as u64
            })
            .min()
    }
}

impl Scheduler for FixedShareScheduler {
    fn name(&self) -> &'static str {
        "fixed-share"
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
            held: BTreeMap::new(),
            passed: BTreeMap::new(),
        };
        // A new VM starts with one period's burst, as BAND gives it one replenishment.
        let tokens = self.burst(self.cap_of(&c)).max(1);
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
        let Some(c) = self.vms.get_mut(&vm) else {
            return false;
        };
        self.total_weight = self.total_weight - u64::from(c.weight) + u64::from(weight);
        c.weight = weight;
        self.inner.set_weight(vm, weight, now_ns)
    }

    fn set_cap(&mut self, vm: VmId, cap_ppm: Option<u32>, now_ns: u64) -> Result<(), String> {
        if let Some(c) = cap_ppm {
            if c == 0 || c > 1_000_000 {
                return Err(format!("cap {c} ppm must be 1..=1000000"));
            }
        }
        self.refill(now_ns);
        let Some(c) = self.vms.get_mut(&vm) else {
            return Err(format!("no such VM {vm}"));
        };
        c.cap = cap_ppm;
        Ok(())
    }

    fn cap_ppm(&self, vm: VmId) -> Option<u32> {
        self.vms.get(&vm).map(|c| self.cap_of(c))
    }

    fn throttled(&self, vm: VmId) -> bool {
        self.vms.get(&vm).is_some_and(|c| !c.held.is_empty())
    }

    fn submit(&mut self, s: Submission, now_ns: u64) {
        self.refill(now_ns);
        let Some(c) = self.vms.get_mut(&s.vm) else {
            // Unknown VM: let BAND decide what to do with it (it ignores it too).
            self.inner.submit(s, now_ns);
            return;
        };
        if c.tokens > 0 {
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
        if let Some(c) = self.vms.get_mut(&s.vm) {
            c.tokens = c
                .tokens
                .saturating_sub(i64::try_from(gpu_ns).unwrap_or(i64::MAX));
            // Before BAND selects the next VM: no buffer for a VM that cannot run.
            self.inner.set_throttled(s.vm, c.tokens <= 0);
        }
        self.inner.complete(s, now_ns, gpu_ns);
        // Take back what an emptied bucket may no longer run.
        self.refill(now_ns);
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
