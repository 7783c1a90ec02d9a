//! CREDIT: Xen-style credit scheduling of GPU time (Gdev's `gdev_vsched_credit.c`, GPUvm's
//! `a3::credit_scheduler`), the run-list machinery of [`super::list`] with two rules:
//!
//! - **demotion**: when a submission of VM `u` completes and `u`'s credit is `<= 0`, `u` moves to
//!   the tail of the run list (Gdev: `gdev_time_lez(&gdev->credit_com)`);
//! - **no time buffer**: the next VM with queued work gets the GPU at once.
//!
//! Credits are replenished every period by `period x share` and bounded to `±credit_limit`
//! ([`super::SchedParams`]). Why it fails for GPUs: work is not preemptive, so a VM whose
//! kernels are long overdraws its credit by a whole kernel each time, and a VM with short
//! kernels that re-submits only after each completion has nothing queued at the moment the
//! decision is made — the GPU goes to the long-kernel VM whatever the credits say.
//! `docs/scheduling.md` has the measurements.

use super::list::{list_scheduler, ListSched, Rules, VmView};
use super::SchedParams;

/// The CREDIT rules.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CreditRules;

impl Rules for CreditRules {
    const NAME: &'static str = "credit";
    const BUFFERS: bool = false;

    fn demote(&self, u: &VmView) -> bool {
        u.credit_ns <= 0
    }

    fn buffer_before(&self, _next: &VmView) -> bool {
        false
    }

    fn yield_on_arrival(&self, _v: &VmView, _p: &SchedParams) -> bool {
        false
    }
}

/// Xen-style credit scheduler.
#[derive(Debug)]
pub struct CreditScheduler(ListSched<CreditRules>);

impl CreditScheduler {
    /// A CREDIT scheduler with these parameters (`wait_ns`, `wait_chances` and
    /// `arrival_yield` are not used). Panics if they do not [`SchedParams::validate`].
    pub fn new(params: SchedParams) -> CreditScheduler {
        CreditScheduler(ListSched::new(CreditRules, params))
    }

    /// The parameters.
    pub fn params(&self) -> &SchedParams {
        self.0.params()
    }
}

list_scheduler!(CreditScheduler, CreditRules);
