//! Getting a physical channel off the GPU: the first half of the in-flight-work protocol
//! (docs/isolation.md, "Work in flight").
//!
//! A channel in the middle of a GPFIFO entry uses the page directory and USERD it loaded at
//! the start of the entry, and an engine operation it launched (a copy, a kernel) keeps reading
//! and writing through that address space until it ends — on a real GF100 and on the
//! simulator. Nothing the channel may still use can be freed, re-pointed or handed to another
//! VM until the channel is **off the GPU**: preempted (its context saved, so that it reloads
//! the instance block before it runs again) and with no engine operation in flight.
//!
//! - [`stop`] is the synchronous form, for teardown (unbind, destroy): disable the channel
//!   (STATE 0, so PFIFO does not pick it again), preempt it (KICK, nouveau
//!   `gf100_fifo_gpfifo_fini`), and if the preempt stays pending because an engine is still
//!   running an operation of the channel, reset that engine (PMC ENABLE off and on, nouveau's
//!   recovery), which aborts the operation: what it had not yet written never lands.
//! - [`is_off`] is the non-intrusive check used to release quarantined hypervisor VRAM
//!   (`crate::vram_alloc::HypVram`): an unbound channel is off when no engine is busy with it;
//!   a bound one is preempted (which lets it go on afterwards, reloading its context) and is
//!   off when the preempt is not pending.

use gf100::{host, pfifo, pmc};

use crate::phys::PhysicalGpu;

/// How often a preempt is re-read before the engine is reset (the simulator answers at once;
/// a real GF100 within microseconds unless an engine operation is still running).
const PREEMPT_POLLS: usize = 100;

/// What [`stop`] had to do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Stopped {
    /// Engines reset because they were still running an operation of the channel.
    pub reset: Vec<u32>,
    /// The channel is off the GPU (false only if the preempt stayed pending after the reset:
    /// the GPU is not doing what it should, and what the channel used must not be reused).
    pub off: bool,
}

/// Preempts physical channel `p` (KICK) and waits a bounded time for it; true when the preempt
/// is no longer pending.
fn preempt(phys: &dyn PhysicalGpu, p: u32) -> bool {
    phys.write_reg(pfifo::KICK, p);
    (0..PREEMPT_POLLS).any(|_| phys.read_reg(pfifo::KICK) & pfifo::KICK_PENDING == 0)
}

/// Disables, preempts and (if an engine still runs its work) resets the engines of physical
/// channel `p`, so that nothing of it is left running on the GPU.
pub(crate) fn stop(phys: &dyn PhysicalGpu, p: u32) -> Stopped {
    phys.write_reg(pfifo::chan_state(p), 0);
    if preempt(phys, p) {
        return Stopped {
            reset: Vec::new(),
            off: true,
        };
    }
    let reset = reset_engines_of(phys, p);
    let off = preempt(phys, p);
    if !off {
        log::error!("channel {p}: preempt still pending after resetting engines {reset:?}");
    }
    Stopped { reset, off }
}

/// True if physical channel `p` holds nothing on the GPU any more: no engine operation of it in
/// flight and (if bound) not resident in the middle of an entry. May preempt `p`.
pub(crate) fn is_off(phys: &dyn PhysicalGpu, p: u32, busy: &[Option<u32>]) -> bool {
    if busy.contains(&Some(p)) {
        return false;
    }
    if phys.read_reg(pfifo::chan_table(p)) & pfifo::CHAN_VALID == 0 {
        return true;
    }
    phys.write_reg(pfifo::KICK, p);
    phys.read_reg(pfifo::KICK) & pfifo::KICK_PENDING == 0
}

/// The physical channel each engine is running an operation of (ENG_STATE).
pub(crate) fn busy_channels(phys: &dyn PhysicalGpu) -> Vec<Option<u32>> {
    phys.engine_states()
        .into_iter()
        .map(|s| (s & pfifo::ENG_STATE_BUSY != 0).then_some(s & pfifo::ENG_STATE_CHID_MASK))
        .collect()
}

/// Resets (PMC ENABLE bit off and on) every engine whose ENG_STATE shows it busy with physical
/// channel `p`, which aborts the operation; returns the engines.
pub(crate) fn reset_engines_of(phys: &dyn PhysicalGpu, p: u32) -> Vec<u32> {
    let mut reset = Vec::new();
    for (e, busy) in busy_channels(phys).into_iter().enumerate() {
        if busy != Some(p) {
            continue;
        }
        let e = e as u32;
        let bit = match e {
            host::ENGINE_PGRAPH => pmc::ENABLE_PGRAPH,
            host::ENGINE_PCOPY0 => pmc::ENABLE_PCOPY0,
            host::ENGINE_PCOPY1 => pmc::ENABLE_PCOPY1,
            _ => continue,
        };
        let enable = phys.read_reg(pmc::ENABLE);
        phys.write_reg(pmc::ENABLE, enable & !bit);
        phys.write_reg(pmc::ENABLE, enable | bit);
        reset.push(e);
    }
    reset
}
