//! BAND: Gdev's bandwidth-aware non-preemptive device scheduler (Kato et al., "Gdev:
//! First-Class GPU Resource Management in the Operating System", ATC'12, §scheduling;
//! `gdev_vsched_band.c`), as GPUvm used it. The run-list machinery of [`super::list`] with
//! Xen-style credits, and the two rules that make it work for non-preemptive GPU work:
//!
//! 1. **Demotion only when over budget *and* over share**: when a submission of VM `u`
//!    completes, `u` moves to the tail of the run list only if its credit is `< 0` **and** its
//!    utilisation (GPU time over the utilisation window, measured every period) is above its
//!    share. A VM with short kernels overdraws its credit too — by a kernel at most — without
//!    taking more than its share; plain CREDIT would demote it anyway. (Paper: `bgt < 0 && utl >
//!    bw`; Gdev's code tests `credit <= 0`.)
//! 2. **Time buffer**: when the next VM in the run list is not the one that just completed and
//!    is over its share, the GPU is held idle for `wait` (500 µs) so that a VM with short
//!    kernels, which re-submits right after each completion, can arrive and take it first; if
//!    nobody arrives the selected VM gets the GPU ("one chance", `GDEV_VSCHED_BAND_SELECT_
//!    CHANCES`). This is the only time the GPU is idle while work is queued.
//!
//! **Adaptive time buffer** (this crate's deviation, on by default,
//! [`SchedParams::adaptive_wait`] and [`SchedParams::util_of_busy`]; `Policy::BandGdev` turns
//! both off): guests that need longer than 500 µs to react after a completion (KVM guests
//! here: 0.6-2 ms) defeat Gdev's buffer — the over-share VM's own re-submission takes it, and
//! none is held when nobody has work queued. The buffer after a completion of a VM under its
//! share then lasts that VM's observed reaction time (x 150 %, 500 µs to 10 ms), only a VM not
//! over its share can take it, it is held also when nobody has work, and "over its share" is
//! measured against the GPU's busy time. It pays for isolation with idle time
//! (`docs/scheduling.md` §5 "Guests that react slowly").
//!
//! Optional (off by default, [`SchedParams::arrival_yield`]): Gdev's code also yields on
//! arrival — a VM that holds the GPU, has credit `<= 0` and is over its share, and submits more
//! while another VM exists, gives the others one time buffer first.
//!
//! Parameters and their sources: [`SchedParams`]; differences from Gdev: `docs/scheduling.md`.

use super::list::{list_scheduler, ListSched, Rules, VmView};
use super::{SchedParams, VmId};

/// The BAND rules.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BandRules;

impl Rules for BandRules {
    const NAME: &'static str = "band";
    const BUFFERS: bool = true;

    fn name(&self, p: &SchedParams) -> &'static str {
        if p.adaptive_wait || p.util_of_busy {
            Self::NAME
        } else {
            "band-gdev"
        }
    }

    fn demote(&self, u: &VmView) -> bool {
        u.credit_ns < 0 && u.over_share()
    }

    fn buffer_before(&self, next: &VmView) -> bool {
        next.over_share()
    }

    fn yield_on_arrival(&self, v: &VmView, _p: &SchedParams) -> bool {
        v.credit_ns <= 0 && v.over_share()
    }
}

/// Gdev's BAND scheduler.
#[derive(Debug)]
pub struct BandScheduler(ListSched<BandRules>);

impl BandScheduler {
    /// A BAND scheduler with these parameters. Panics if they do not
    /// [`SchedParams::validate`].
    pub fn new(params: SchedParams) -> BandScheduler {
        BandScheduler(ListSched::new(BandRules, params))
    }

    /// The parameters.
    pub fn params(&self) -> &SchedParams {
        self.0.params()
    }

    /// Tells BAND that a capping policy holds `vm`'s work back (see
    /// `ListSched::set_throttled`): no time buffer is held for it meanwhile.
    pub fn set_throttled(&mut self, vm: VmId, throttled: bool) {
        self.0.set_throttled(vm, throttled)
    }
}

list_scheduler!(BandScheduler, BandRules);
