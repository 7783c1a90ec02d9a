//! Scheduling of GPU work between VMs (GPUvm §"GPU scheduling"; DESIGN §5 "Scheduling"; the
//! rules and their sources are in `docs/scheduling.md`). A guest's doorbell (GP_PUT write) does
//! not reach the physical GPU directly. The device model turns it into a [`Submission`] —
//! "channel c of VM v advanced GP_PUT to p" — and hands it to a [`Scheduler`], which alone
//! decides when it is written to the physical GPU.
//!
//! The trait is **event-driven**, like Gdev's `on_arrival` / `on_completion` plus its credit
//! thread: [`Scheduler::submit`] when a doorbell arrives, [`Scheduler::complete`] when the GPU
//! has finished a submission (with the GPU time it took), [`Scheduler::tick`] for period
//! boundaries, and [`Scheduler::decide`] whenever the GPU could take more work. A decision is
//! "dispatch this", "nothing now" ([`Decision::Idle`]) or "hold the GPU idle until `t`"
//! ([`Decision::WaitUntil`], BAND's deliberate short wait); every call carries the time of a
//! [`crate::clock::Clock`] (the GPU's timeline), so a policy never reads a clock itself and
//! runs identically under simulated and real time.
//!
//! The device model enforces the rules every policy shares ([`dispatchable`]): work of two
//! different VMs never overlaps on the GPU (GPU work is not preemptive, so fairness comes from
//! what is let in), at most `max_inflight` submissions are in flight, one per channel.
//!
//! Policies: [`fifo::FifoScheduler`] (arrival order), [`credit::CreditScheduler`] (Xen-style
//! credit) and [`band::BandScheduler`] (Gdev's BAND), selected by [`Policy`] (`fifo`, `credit`,
//! `band`) with [`SchedParams`]. [`account::Accounting`] measures GPU time per VM.

pub mod account;
pub mod band;
pub mod capped;
pub mod credit;
pub mod fifo;
mod list;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

pub use account::{Accounting, SchedStats, VmSchedStats};
pub use band::BandScheduler;
pub use capped::{CapLayer, EqualShareScheduler, FixedShareScheduler};
pub use credit::CreditScheduler;
pub use fifo::FifoScheduler;

/// Identity of a VM on a [`crate::host::GpuHost`]; never reused while the host lives.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct VmId(pub u32);

impl std::fmt::Display for VmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "vm{}", self.0)
    }
}

/// One unit of work: the guest advanced GP_PUT of one of its channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submission {
    /// The VM.
    pub vm: VmId,
    /// The guest's channel id.
    pub guest_chid: u32,
    /// The physical channel it is bound to.
    pub phys_chid: u32,
    /// The new GP_PUT (GPFIFO ring index).
    pub put: u32,
}

/// What the GPU should do next, as a policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Write this submission to the GPU now. It is [`dispatchable`].
    Dispatch(Submission),
    /// Nothing to dispatch now: no work is queued, or the queued work may not run yet (the GPU
    /// still holds another VM's work, `max_inflight` is reached, or its channel is busy). The
    /// next arrival or completion is the next chance.
    Idle,
    /// Keep the GPU idle on purpose until this time (BAND's time buffer), even though work is
    /// queued; ask again then, or earlier when a submission arrives.
    WaitUntil(u64),
}

/// One VM as a policy sees it (for statistics and tests).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyVm {
    /// The VM.
    pub vm: VmId,
    /// Its weight.
    pub weight: u32,
    /// Its share of GPU time, parts per million (`weight / sum of weights`).
    pub share_ppm: u32,
    /// Submissions it has queued.
    pub queued: usize,
    /// Its credit (ns), for credit-based policies.
    pub credit_ns: Option<i64>,
    /// Its utilisation as the policy last measured it (parts per million), if it keeps one.
    pub util_ppm: Option<u32>,
    /// Its position in the policy's run list (0 = head), if it keeps one.
    pub position: Option<usize>,
    /// It has work queued and the GPU is held idle for another VM (BAND's time buffer).
    pub held_by_buffer: bool,
}

/// A policy's state and counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PolicySnapshot {
    /// Per VM, in VM order.
    pub vms: Vec<PolicyVm>,
    /// Deliberate waits started (BAND's time buffer).
    pub waits: u64,
    /// Of those, the ones cut short by an arrival that took the GPU.
    pub waits_taken: u64,
    /// Moves of a VM to the tail of the run list.
    pub demotions: u64,
    /// Period boundaries processed.
    pub ticks: u64,
    /// Time buffers ended early because the VM they were held for became throttled by its
    /// cap (`fixed-share`).
    pub buffers_cancelled: u64,
}

/// A scheduling policy. Implementations keep their own queues; the device model calls these on
/// the events named (always with non-decreasing times) and never dispatches anything the policy
/// did not pick.
pub trait Scheduler: Send + Sync {
    /// Short name for reports (`fifo`, `credit`, `band`).
    fn name(&self) -> &'static str;

    /// A VM was created at `now_ns` with this share weight (1-100); shares are the weights
    /// normalised over the VMs present (`share_i = w_i / sum w`).
    fn add_vm(&mut self, vm: VmId, weight: u32, now_ns: u64);

    /// A VM was destroyed: forget it and drop its queued submissions; returns how many.
    fn remove_vm(&mut self, vm: VmId) -> usize;

    /// A doorbell arrived at `now_ns` (the *arrival* event). A policy may coalesce it with a
    /// queued submission of the same channel (a later GP_PUT covers an earlier one).
    fn submit(&mut self, s: Submission, now_ns: u64);

    /// Drops the queued submissions of one channel (it was unbound); returns how many.
    fn remove_channel(&mut self, vm: VmId, guest_chid: u32) -> usize;

    /// The GPU finished `s` at `now_ns` (the *completion* event); `gpu_ns` is the GPU time
    /// charged to it: the part of its VM's busy time on the GPU since the previous completion
    /// or its dispatch (see [`account::Accounting`]).
    fn complete(&mut self, s: &Submission, now_ns: u64, gpu_ns: u64);

    /// The *period tick*: processes every period boundary up to `now_ns`, each at its own time.
    /// The device model calls this on every service; policies also catch up on their own at
    /// every other event, so a late call changes nothing.
    fn tick(&mut self, _now_ns: u64) {}

    /// The next period boundary, if the policy has periods.
    fn next_tick_ns(&self) -> Option<u64> {
        None
    }

    /// What to do now, given the submissions in flight. The device model calls this after
    /// every event and repeatedly while it returns [`Decision::Dispatch`]; a dispatched
    /// submission must be [`dispatchable`] with `inflight` and `max_inflight`.
    fn decide(&mut self, inflight: &[Submission], max_inflight: usize, now_ns: u64) -> Decision;

    /// [`Scheduler::decide`], keeping only "dispatch this".
    fn pick(
        &mut self,
        inflight: &[Submission],
        max_inflight: usize,
        now_ns: u64,
    ) -> Option<Submission> {
        match self.decide(inflight, max_inflight, now_ns) {
            Decision::Dispatch(s) => Some(s),
            Decision::Idle | Decision::WaitUntil(_) => None,
        }
    }

    /// Changes a VM's weight at run time (its share is recomputed with the others'). False
    /// when the policy has no weights (FIFO, equal share) or does not know the VM.
    fn set_weight(&mut self, _vm: VmId, _weight: u32, _now_ns: u64) -> bool {
        false
    }

    /// Sets (parts per million of GPU time) or clears a VM's cap. The cap layer every
    /// [`Policy::create`] scheduler has takes one; a bare policy does not.
    fn set_cap(&mut self, _vm: VmId, _cap_ppm: Option<u32>, _now_ns: u64) -> Result<(), String> {
        Err(format!(
            "the {} policy has no caps (run the daemon with --sched fixed-share)",
            self.name()
        ))
    }

    /// The cap in force for a VM (ppm), if the policy caps it.
    fn cap_ppm(&self, _vm: VmId) -> Option<u32> {
        None
    }

    /// True while a VM's work is held back by its cap.
    fn throttled(&self, _vm: VmId) -> bool {
        false
    }

    /// `vm`'s work has run `gpu_ns` on the GPU since its last charge and is still running: the
    /// policy pays it now (credit, utilisation, a cap's bucket), so that what it decides on is
    /// time actually run, not time reported at completions that may come late or never. The
    /// completion later carries only the rest. Default: nothing (FIFO keeps no budget).
    fn charge(&mut self, _vm: VmId, _gpu_ns: u64, _now_ns: u64) {}

    /// True if a VM other than `vm` has queued work the policy could run now (not held back
    /// by a cap): the host then ends `vm`'s time slice by preemption. The default asks
    /// [`Scheduler::snapshot`].
    fn others_waiting(&self, vm: VmId) -> bool {
        self.snapshot()
            .vms
            .iter()
            .any(|v| v.vm != vm && v.queued > 0 && !self.throttled(v.vm))
    }

    /// True if `vm` has used up its cap at `now_ns` (its bucket is empty): the host preempts
    /// its work at once. Only a policy with caps says so.
    fn over_cap(&mut self, _vm: VmId, _now_ns: u64) -> bool {
        false
    }

    /// `vm` was preempted at the end of its time slice because another VM had work waiting:
    /// a policy with a run list moves it behind the others (as a credit scheduler does with a
    /// vCPU whose slice expired), so the waiting VMs get the GPU before it runs again. The
    /// completions of its preempted submissions follow.
    fn slice_expired(&mut self, _vm: VmId, _now_ns: u64) {}

    /// While `vm`'s work runs: the GPU time at which its cap would be used up (its bucket
    /// drains at the rate its work runs minus what the cap earns), if it has one. The host
    /// looks again then, so that a cap is enforced on time and not at the next event.
    fn cap_runs_out(&self, _vm: VmId, _now_ns: u64) -> Option<u64> {
        None
    }

    /// A capping layer above the policy holds `vm`'s work back (or no longer does): a policy
    /// that holds the GPU idle for a VM (BAND's time buffer) must not do it for this one.
    fn set_throttled(&mut self, _vm: VmId, _throttled: bool) {}

    /// Submissions waiting.
    fn queued(&self) -> usize;

    /// The policy's per-VM state and counters.
    fn snapshot(&self) -> PolicySnapshot;
}

/// The rules every policy obeys: nothing beyond `max_inflight`; no overlap of two VMs' work; at
/// most one submission per channel in flight (so completion is exactly "GP_GET reached PUT").
pub fn dispatchable(s: &Submission, inflight: &[Submission], max_inflight: usize) -> bool {
    inflight.len() < max_inflight
        && inflight
            .iter()
            .all(|f| f.vm == s.vm && f.phys_chid != s.phys_chid)
}

/// The scheduling policies, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// First come, first served ([`FifoScheduler`]).
    Fifo,
    /// Xen-style credit ([`CreditScheduler`]).
    Credit,
    /// Gdev's bandwidth-aware non-preemptive scheduler ([`BandScheduler`]), with this crate's
    /// deviations that are on by default ([`SchedParams`]).
    Band,
    /// BAND with Gdev's fixed time buffer and utilisation over elapsed time: [`Policy::Band`]
    /// with [`SchedParams::adaptive_wait`] and [`SchedParams::util_of_busy`] off, for side by
    /// side comparisons (`docs/scheduling.md` §5).
    #[serde(rename = "band-gdev")]
    BandGdev,
    /// Every VM the same share, whatever its weight ([`EqualShareScheduler`]).
    #[serde(rename = "equal-share")]
    EqualShare,
    /// BAND with a cap per VM that holds even when the GPU is otherwise idle
    /// ([`FixedShareScheduler`]).
    #[serde(rename = "fixed-share")]
    FixedShare,
}

impl Policy {
    /// The policies experiments run by default, in the order they report them.
    pub const ALL: [Policy; 3] = [Policy::Fifo, Policy::Credit, Policy::Band];

    /// Every policy, including variants.
    pub const EVERY: [Policy; 6] = [
        Policy::Fifo,
        Policy::Credit,
        Policy::BandGdev,
        Policy::Band,
        Policy::EqualShare,
        Policy::FixedShare,
    ];

    /// The policy's name as written on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Fifo => "fifo",
            Policy::Credit => "credit",
            Policy::Band => "band",
            Policy::BandGdev => "band-gdev",
            Policy::EqualShare => "equal-share",
            Policy::FixedShare => "fixed-share",
        }
    }

    /// Does the policy hold the GPU idle on purpose (BAND's time buffer)?
    pub fn waits(self) -> bool {
        matches!(
            self,
            Policy::Band | Policy::BandGdev | Policy::EqualShare | Policy::FixedShare
        )
    }

    /// A scheduler of this policy with these parameters, under the cap layer
    /// ([`capped::CapLayer`]) every policy has: a cap set for a VM is a ceiling whatever the
    /// policy; `fixed-share` also caps every VM without one at its weight's share.
    pub fn create(self, params: &SchedParams) -> Box<dyn Scheduler> {
        match self {
            Policy::FixedShare => Box::new(capped::CapLayer::fixed_share(params.clone())),
            p => Box::new(capped::CapLayer::over(p.create_bare(params), params)),
        }
    }

    /// The policy alone, without the cap layer (`fixed-share` is BAND here).
    fn create_bare(self, params: &SchedParams) -> Box<dyn Scheduler> {
        match self {
            Policy::Fifo => Box::new(FifoScheduler::new()),
            Policy::Credit => Box::new(CreditScheduler::new(params.clone())),
            Policy::Band => Box::new(BandScheduler::new(params.clone())),
            Policy::BandGdev => Box::new(BandScheduler::new(SchedParams {
                adaptive_wait: false,
                util_of_busy: false,
                ..params.clone()
            })),
            Policy::EqualShare => Box::new(EqualShareScheduler::new(params.clone())),
            Policy::FixedShare => Box::new(BandScheduler::new(params.clone())),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::EVERY
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown scheduler '{s}' (expected fifo, credit, band, band-gdev, equal-share or fixed-share)"
                )
            })
    }
}

/// What happens to a credit beyond `±credit_limit_ns` at a replenishment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CreditBound {
    /// Clamp to the bound (DESIGN §5, issue 4: "clamped to ±period"). Default.
    #[default]
    Clamp,
    /// Set to zero (Gdev's code: `gdev_vsched_band_replenish_compute` zeroes a credit above
    /// `GDEV_CREDIT_INACTIVE_THRESHOLD` — "all credits taken away" — and one below its
    /// negative).
    Zero,
}

/// Parameters of the credit-based policies (FIFO has none). Every default is the value of
/// Gdev's BAND as published and coded; `docs/scheduling.md` explains each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedParams {
    /// Budget period: every period each VM's credit grows by `period x share`.
    /// Default 30 ms: Gdev `GDEV_PERIOD_DEFAULT` (30000 µs); Gdev ATC'12 §scheduling: "budget
    /// period 30 ms ... we respect Xen's default setup"; GPUvm's 2015 `scheduler` branch uses
    /// the same.
    pub period_ns: u64,
    /// Bound of a credit after replenishment, `±credit_limit_ns`. Default 30 ms (one period):
    /// Gdev `GDEV_CREDIT_INACTIVE_THRESHOLD` (30000 µs).
    pub credit_limit_ns: u64,
    /// What happens beyond the bound. Default [`CreditBound::Clamp`] (the issue); Gdev zeroes.
    pub credit_bound: CreditBound,
    /// Utilisation window: a VM's utilisation is its GPU time since the window started over the
    /// time elapsed, recomputed at every period tick; the window restarts once it is this long.
    /// Default 1 s: Gdev `GDEV_UPDATE_INTERVAL` (1,000,000 µs, `__gdev_credit_com_thread`).
    pub util_window_ns: u64,
    /// BAND's time buffer: how long the GPU is held idle, before it goes to a VM over its share,
    /// so that a short-running VM can get in first. Default 500 µs: Gdev
    /// `__gdev_vsched_band_yield_chance` and ATC'12 "waiting time 500 µs"; GPUvm's A3 BAND uses
    /// the same busy-yield.
    pub wait_ns: u64,
    /// How many time buffers one selection may spend. Default 1: Gdev
    /// `GDEV_VSCHED_BAND_SELECT_CHANCES`.
    pub wait_chances: u32,
    /// BAND also yields on arrival: a VM that holds the GPU and is over its share (credit <= 0
    /// and utilisation > share) and submits more while another VM exists gives the others one
    /// time buffer first (Gdev's `gdev_vsched_band_schedule_compute`; not in the paper's
    /// algorithm). Default off.
    pub arrival_yield: bool,
    /// When a time buffer held for VM `n` (over its share) is taken by another VM's arrival,
    /// `n` goes to the tail of the run list. Gdev leaves it in place, and then a VM over its
    /// share whose credit is not negative can stay ahead of a waiting VM for ever: it is never
    /// demoted because it only completes work when it runs, and it does not run while others
    /// keep taking its buffers (found by this crate's property tests; `docs/scheduling.md`).
    /// Default on; off is Gdev's exact behaviour.
    pub requeue_on_lost_wait: bool,
    /// BAND's time buffer adapts to each VM's reaction time (this crate's deviation from Gdev,
    /// `docs/scheduling.md` §5 "Guests that react slowly"): the buffer after a completion of a
    /// VM under its share lasts that VM's observed reaction time (completion to its next
    /// doorbell, a decayed maximum) times `wait_margin_pct`, between `wait_ns` and
    /// `wait_max_ns`; only a VM not over its share can take it (the VM it is held against
    /// cannot end it by re-submitting); and it is also held when nobody has work queued, so
    /// that a VM over its share that arrives first waits for it. A VM slower than `wait_max_ns`
    /// is not waited for. Default on; off is Gdev's fixed buffer.
    pub adaptive_wait: bool,
    /// Longest adaptive buffer. Default 10 ms: one long kernel of the isolation experiment, a
    /// third of a period; covers the 0.6-2 ms reactions of KVM guests on this machine
    /// (`docs/experiments.md`) with room, and bounds the idle time one selection can cost.
    pub wait_max_ns: u64,
    /// The adaptive buffer is the VM's reaction estimate times this percentage. Default 150:
    /// the estimate is already a decayed maximum; the margin covers jitter above it. A larger
    /// margin costs idle time only when the VM does not come back.
    pub wait_margin_pct: u32,
    /// A VM whose reaction estimate is more than this many times its GPU time per completion
    /// is not waited for adaptively (it gets Gdev's fixed buffer): each wait for it idles the
    /// GPU for its reaction time to give it one submission's GPU time, so this bounds the idle
    /// time paid for a VM to this multiple of the GPU time it gets that way. Default 5: covers
    /// 0.5 ms kernels with the 0.6-2.5 ms reactions of KVM guests here; a VM with 10 µs kernels
    /// and a 2 ms reaction (200x) is not waited for.
    pub wait_max_ratio: u32,
    /// "Over its share" compares a VM's share of the GPU's *busy* time (its utilisation over
    /// the sum of all VMs' utilisations) with its share, instead of Gdev's utilisation over
    /// elapsed time. When the GPU idles — guests that react slowly, adaptive buffers — Gdev's
    /// measure finds every VM under its share and stops buffering although one VM gets far
    /// more GPU time than another (`docs/scheduling.md` §5). With the GPU always busy the two
    /// are the same. Default on; off is Gdev's.
    pub util_of_busy: bool,
}

impl Default for SchedParams {
    fn default() -> Self {
        SchedParams {
            period_ns: 30_000_000,
            credit_limit_ns: 30_000_000,
            credit_bound: CreditBound::Clamp,
            util_window_ns: 1_000_000_000,
            wait_ns: 500_000,
            wait_chances: 1,
            arrival_yield: false,
            requeue_on_lost_wait: true,
            adaptive_wait: true,
            wait_max_ns: 10_000_000,
            wait_margin_pct: 150,
            wait_max_ratio: 5,
            util_of_busy: true,
        }
    }
}

impl SchedParams {
    /// Checks the values; returns what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.period_ns == 0 {
            return Err("period_ns must be positive".into());
        }
        if self.util_window_ns == 0 {
            return Err("util_window_ns must be positive".into());
        }
        if self.credit_limit_ns > i64::MAX as u64 / 4 {
            return Err("credit_limit_ns is too large".into());
        }
        if self.wait_chances == 0 && self.wait_ns > 0 {
            return Err("wait_chances must be at least 1 when wait_ns is set".into());
        }
        if self.adaptive_wait && self.wait_max_ns < self.wait_ns {
            return Err("wait_max_ns must be at least wait_ns".into());
        }
        if self.wait_max_ns > 1_000_000_000 {
            return Err("wait_max_ns must be at most 1 s".into());
        }
        if self.wait_max_ratio == 0 {
            return Err("wait_max_ratio must be at least 1".into());
        }
        if !(100..=1000).contains(&self.wait_margin_pct) {
            return Err("wait_margin_pct must be 100..=1000".into());
        }
        Ok(())
    }
}

/// Creates a scheduler by name (`fifo`, `credit`, `band`, `band-gdev`, `equal-share`,
/// `fixed-share`) with default parameters; `None` for an unknown name.
pub fn by_name(name: &str) -> Option<Box<dyn Scheduler>> {
    name.parse::<Policy>()
        .ok()
        .map(|p| p.create(&SchedParams::default()))
}

/// `weight / total` in parts per million (0 when `total` is 0).
pub fn share_ppm(weight: u32, total: u64) -> u32 {
    (u64::from(weight) * 1_000_000)
        .checked_div(total)
        .map_or(0, |v| v as u32)
}
