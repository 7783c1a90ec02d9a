//! The engine worker ([`super::Executor::Worker`]): a thread of the GPU's own that performs the
//! copy and compute engines' pieces of work as the clock reaches them, so that no
//! [`gpuvm_phys::PhysicalGpu`] call computes — as on hardware, where the engines run beside the
//! driver and only register access meets the GPU.
//!
//! The worker takes the simulator's lock for one batch of due work ([`BATCH_UNITS`]: a few
//! pieces, tens of microseconds) and hands it back fairly (`unlock_fair`: a waiting caller gets
//! it before the worker takes it again). While a call waits for the lock the batch ends after
//! the piece it is at, and the worker hands the lock over and waits for the callers (up to
//! [`HAND_OVER_WAIT`]) before taking it back, so a caller waits about one piece; a caller
//! inside its own hold spins for it meanwhile instead of sleeping (`SimGpu::lock`). The other
//! way round, a call that ends when the worker has waited for the lock [`HANDOFF_AFTER_NS`]
//! hands it to the worker (`Shared::worker_wants`), so callers that poll in a loop cannot
//! starve the engines. Between
//! batches it waits for the next piece's due time: by yielding when that is close
//! ([`SPIN_NS`]; a timed wait would oversleep by the kernel's timer slack), on the condition
//! variable otherwise; with no engine operation in flight it sleeps until a call launches one
//! (`SimGpu::with_state` wakes it).
//!
//! What takes host CPU time beyond moving memory — a block of a matrix product — is computed
//! with the lock released: under it the worker only reads the block's operands and, after,
//! writes its results (if the operation is still in flight at that piece: an engine reset or a
//! fault meanwhile drops them, as the hardware's aborted operation writes nothing more). With a
//! real clock it gathers the due blocks after it too ([`AHEAD_BLOCKS`]) and computes the run
//! with one release of the lock, when the kernel's `c` does not overlap its `a` by address —
//! memory then ends as one block at a time leaves it. A context that maps `c` onto `a`'s pages
//! through other addresses gets rows of `a` read before or after earlier blocks wrote them,
//! depending on timing, as on hardware, where a kernel's blocks run side by side; only its own
//! memory is involved. With a simulated clock there is no gathering ahead (runs stay
//! deterministic).
//!
//! When a batch finishes timed work (an engine operation, a fetch) and leaves nothing in
//! flight, and the clock is real, the worker calls the GPU's event waker
//! ([`gpuvm_phys::PhysicalGpu::set_event_waker`]) once it has released the lock: a worker
//! behind the clock finishes work later than the next event the callers were told, and a caller
//! treating the GPU as quiet until then learns of it at once — the interrupt a driver takes
//! instead of waiting for its next poll (measured: `gpuvm exp scale --vms 1`,
//! docs/benchmarks.md).
//!
//! The worker asks the host's scheduler for `SCHED_BATCH` ([`crate::WorkerPolicy`]): it is the
//! simulated GPU's compute, which should not take a core from a vCPU thread in the middle of a
//! device-model critical section. For the same reason, while a caller holds its own lock (a
//! batch begun and not ended, [`gpuvm_phys::PhysicalGpu::begin_batch`] / `end_batch`: a host-lock
//! hold) it yields its CPU after each matrix block it computes ([`give_way`]).
//!
//! The worker's wall time is metered by activity (`crate::worker_time`, [`crate::WorkerTimes`]):
//! computing, under the lock, waiting for it, ahead of the modeled clock, idle.
//!
//! Modeled time is unchanged by who runs the pieces: due times, durations and busy accounting
//! are fixed at launch (`crate::engine`). A worker that falls behind the clock completes work
//! late in host time but stamps it with its modeled end, as an inline caller does.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::MutexGuard;

use super::worker_time::{Activity, Meter};
use super::{Shared, State, WorkerPolicy};

/// Units of engine work the worker does per hold of the lock (64 Ki units: 256 KiB copied or
/// 64 Ki multiply-adds, tens of microseconds; MODEL choice).
pub(crate) const BATCH_UNITS: u64 = 64 * 1024;

/// Matrix blocks the worker gathers beyond the one it is at, to compute with the lock released
/// once (MODEL choice: 7 more blocks of 64 Ki multiply-adds, ~0.1 ms of host CPU, during which
/// callers have the lock; 8 lock round trips saved of every 8 blocks).
const AHEAD_BLOCKS: usize = 7;

/// How long the worker waits for the lock before a call that ends hands it over.
pub(crate) const HANDOFF_AFTER_NS: u64 = 50_000;

/// Longest the worker waits, with the lock released, for calls that wait for it to take it.
const HAND_OVER_WAIT: Duration = Duration::from_micros(50);

/// Below this wait the worker yields instead of sleeping.
const SPIN_NS: u64 = 200_000;

/// Longest sleep with nothing to do, a safety net (a launch wakes the worker).
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// Longest timed wait for a due time (a simulated clock can jump past it meanwhile; its calls
/// wake the worker too).
const MAX_WAIT_NS: u64 = 1_000_000;

/// Starts the worker of `shared`, under `policy`: returns once the thread runs under it.
pub(crate) fn spawn(shared: Arc<Shared>, policy: WorkerPolicy) -> std::thread::JoinHandle<()> {
    let (ready, policy_set) = std::sync::mpsc::sync_channel(1);
    let handle = std::thread::Builder::new()
        .name(crate::ENGINE_THREAD_NAME.into())
        .spawn(move || {
            if let Err(e) = policy.apply_to_this_thread() {
                log::info!(
                    "simulated GPU: the engine worker stays under the default scheduling \
                     policy ({} refused: {e})",
                    policy.name()
                );
            }
            let _ = ready.send(());
            run(&shared)
        })
        .expect("spawning the simulated GPU's engine worker");
    // Nothing the GPU does waits for this; a thread that died before it sends nothing.
    let _ = policy_set.recv();
    handle
}

fn run(shared: &Shared) {
    let wants = |on: bool| {
        let since = if on { shared.clock.now_ns() + 1 } else { 0 };
        shared.worker_wants.store(since, Ordering::Relaxed);
    };
    let mut m = Meter::new(&shared.worker_times, Activity::LockWait);
    let mut guard = shared.state.lock();
    m.to(Activity::Locked);
    let mut seen = guard.fifo.finished;
    // True when work finished since the last look and the GPU has nothing more in flight
    // (never with a simulated clock: its callers date every event themselves, and runs on it
    // stay deterministic). Work that goes on within the GPU needs nobody's attention.
    let mut finished = |s: &State| {
        let moved = s.fifo.finished != seen;
        seen = s.fifo.finished;
        moved && !s.fifo.busy() && !shared.simulated
    };
    let notify = |change: Option<(u64, bool)>, woke: bool| {
        if let Some((seq, level)) = change {
            shared.apply_line(seq, level);
        }
        if woke {
            shared.wake_event();
        }
        wants(true);
    };
    loop {
        wants(false);
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let now = shared.clock.now_ns();
        let (change, next) = batch(&mut guard, now);
        shared.publish_next_event(&mut guard, now);
        if let Some(o) = guard.fifo.take_offload() {
            // A matrix block, and with a real clock the due blocks after it: computed without
            // the lock, written under it in order.
            let more = if shared.simulated {
                Vec::new()
            } else {
                let s = &mut *guard;
                s.fifo.gather_ahead(&mut s.core, now, o.piece, AHEAD_BLOCKS)
            };
            let data = MutexGuard::unlocked_fair(&mut guard, || {
                m.to(Activity::Computing);
                let data: Vec<_> = std::iter::once(&o)
                    .chain(&more)
                    .map(|o| {
                        let r = o.block.compute();
                        give_way(shared);
                        r
                    })
                    .collect();
                wants(true);
                m.to(Activity::LockWait);
                data
            });
            m.to(Activity::Locked);
            let s = &mut *guard;
            for (o, data) in std::iter::once(o).chain(more).zip(&data) {
                s.fifo.commit_offload(&mut s.core, o, data);
            }
            shared.publish_next_event(s, shared.clock.now_ns());
            let woke = finished(&guard);
            if change.is_some() || woke {
                MutexGuard::unlocked_fair(&mut guard, || {
                    m.to(Activity::Notifying);
                    notify(change, woke);
                    m.to(Activity::LockWait);
                });
                m.to(Activity::Locked);
            }
            continue;
        }
        let woke = finished(&guard);
        if change.is_some() || woke {
            MutexGuard::unlocked_fair(&mut guard, || {
                m.to(Activity::Notifying);
                notify(change, woke);
                m.to(Activity::LockWait);
            });
            m.to(Activity::Locked);
            continue;
        }
        match next {
            Some(t) if t <= now => {
                wants(true);
                m.to(Activity::LockWait);
                if shared.callers_waiting.load(Ordering::Relaxed) > 0 {
                    // A call waits (the batch ended early for it): hand the lock over and let
                    // it finish before taking the lock back.
                    MutexGuard::unlocked_fair(&mut guard, || {
                        let t0 = std::time::Instant::now();
                        while shared.callers_waiting.load(Ordering::Relaxed) > 0
                            && t0.elapsed() < HAND_OVER_WAIT
                        {
                            std::hint::spin_loop();
                        }
                    });
                } else {
                    MutexGuard::bump(&mut guard);
                }
            }
            Some(t) if t - now < SPIN_NS => {
                m.to(Activity::DueWait);
                MutexGuard::unlocked_fair(&mut guard, || {
                    std::thread::yield_now();
                    wants(true);
                });
            }
            Some(t) => {
                m.to(Activity::DueWait);
                let wait = Duration::from_nanos((t - now).min(MAX_WAIT_NS));
                let _ = shared.wake.wait_for(&mut guard, wait);
            }
            None => {
                m.to(Activity::Idle);
                guard.worker_idle = true;
                let _ = shared.wake.wait_for(&mut guard, IDLE_WAIT);
                guard.worker_idle = false;
            }
        }
        m.to(Activity::Locked);
    }
}

/// Yields the CPU while a caller holds its own lock (`Shared::batches_open`): on a machine with
/// fewer cores than busy threads, a lock holder the worker displaced would otherwise wait for
/// the worker's time slice to end (a tick, 4 ms at 250 Hz) with every other VM waiting behind
/// it. With nobody else runnable on this CPU the yield returns at once.
fn give_way(shared: &Shared) {
    if shared.batches_open.load(Ordering::Relaxed) > 0 {
        std::thread::yield_now();
    }
}

/// One batch of due work at `now`: the interrupt line's change, if any, and when engine work is
/// next due (`None`: no engine operation in flight).
fn batch(s: &mut State, now: u64) -> (Option<(u64, bool)>, Option<u64>) {
    s.fifo.budget.new_worker_batch(BATCH_UNITS);
    s.fifo.advance(&mut s.core, now, true);
    let next = s.fifo.engine_due(now);
    (s.line_change(), next)
}
