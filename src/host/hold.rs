//! How long the host lock is held: every guest access, poll and management call takes the one
//! host-wide lock (`crate::host`), so the longest hold is the longest any other VM's exit can be
//! made to wait. The isolation review found holds of seconds (another VM's kernels simulated
//! inside a victim's register read) and of 210 ms (a PV batch of table switches); the bounds
//! that fixed them are measured here, not assumed: a log2 histogram of hold times, kept with
//! atomics (recording costs two clock reads per hold) and read through `HostStats::lock_holds`.
//!
//! Why a hold was long is measured too, on request ([`HoldTimes::set_thread_usage`]; two reads
//! of the holder's CPU clock and `/proc/thread-self/schedstat` a hold, about a microsecond
//! each, so experiments only): the longest hold's time on a CPU, runnable without one (preempted —
//! lock-holder preemption on a machine with more busy threads than cores — or woken and not
//! yet run) and asleep (waiting for another lock, such as the simulator's).

use std::panic::Location;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// Buckets of the histogram: bucket `i` counts holds of `[2^i, 2^(i+1))` ns (bucket 0 also
/// counts 0 ns); the last one everything longer.
pub const HOLD_BUCKETS: usize = 40;

/// The histogram, shared by every holder.
#[derive(Debug)]
pub(crate) struct HoldTimes {
    count: AtomicU64,
    total_ns: AtomicU64,
    max_ns: AtomicU64,
    /// Where the longest hold's lock was taken (`#[track_caller]` up to the host's API).
    max_at: parking_lot::Mutex<Option<&'static Location<'static>>>,
    /// Whether holds read their thread's usage ([`HoldTimes::set_thread_usage`]).
    thread_usage: AtomicBool,
    /// The longest hold's thread usage, when it was read.
    max_usage: parking_lot::Mutex<Option<HoldUsage>>,
    /// The most CPU time one hold took, ns (holds that read their thread's usage).
    max_on_cpu_ns: AtomicU64,
    buckets: [AtomicU64; HOLD_BUCKETS],
    waits: AtomicU64,
    waited_ns: AtomicU64,
    fast_waits: AtomicU64,
    fast_waited_ns: AtomicU64,
    /// The longest single wait, a taker's or a fast-path access's, ns.
    max_wait_ns: AtomicU64,
}

impl Default for HoldTimes {
    fn default() -> Self {
        HoldTimes {
            count: AtomicU64::new(0),
            total_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
            max_at: parking_lot::Mutex::new(None),
            thread_usage: AtomicBool::new(false),
            max_usage: parking_lot::Mutex::new(None),
            max_on_cpu_ns: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            waits: AtomicU64::new(0),
            waited_ns: AtomicU64::new(0),
            fast_waits: AtomicU64::new(0),
            fast_waited_ns: AtomicU64::new(0),
            max_wait_ns: AtomicU64::new(0),
        }
    }
}

impl HoldTimes {
    /// Whether holds should read their thread's usage (see the module's doc).
    pub(crate) fn set_thread_usage(&self, on: bool) {
        self.thread_usage.store(on, Ordering::Relaxed);
    }

    /// The calling thread's usage now, if holds read it.
    pub(crate) fn usage_now(&self) -> Option<ThreadUsage> {
        self.thread_usage
            .load(Ordering::Relaxed)
            .then(ThreadUsage::now)
            .flatten()
    }

    /// Records one hold that started at `since` (with the holder's usage `before`, if read),
    /// its lock taken at `at`; returns its length, ns.
    pub(crate) fn record(
        &self,
        since: Instant,
        before: Option<ThreadUsage>,
        at: &'static Location<'static>,
    ) -> u64 {
        // The holder's figures first: a preemption after them would not belong to the hold.
        let after = before.and_then(|_| ThreadUsage::now());
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.total_ns.fetch_add(ns, Ordering::Relaxed);
        let usage = before.zip(after).map(|(b, a)| a.since(&b, ns));
        if let Some(u) = usage {
            self.max_on_cpu_ns.fetch_max(u.on_cpu_ns, Ordering::Relaxed);
        }
        if self.max_ns.fetch_max(ns, Ordering::Relaxed) < ns {
            // A new maximum (rare): where it was taken, and what its thread did meanwhile.
            *self.max_at.lock() = Some(at);
            *self.max_usage.lock() = usage;
        }
        let b = (63 - ns.max(1).leading_zeros() as usize).min(HOLD_BUCKETS - 1);
        self.buckets[b].fetch_add(1, Ordering::Relaxed);
        ns
    }

    /// Takes a lock timed by these figures: `try_take` first, and if it is held, `take`
    /// (waiting, counted as a wait). Returns the guard, the instant the hold starts (its
    /// acquisition: everything after keeps the lock from the others) and the holder's usage
    /// then, if holds read it — what [`HoldTimes::record`] takes when the hold ends.
    pub(crate) fn acquire<G>(
        &self,
        try_take: impl FnOnce() -> Option<G>,
        take: impl FnOnce() -> G,
    ) -> (G, Instant, Option<ThreadUsage>) {
        let guard = try_take().unwrap_or_else(|| {
            let t = Instant::now();
            let g = take();
            self.record_wait(t);
            g
        });
        (guard, Instant::now(), self.usage_now())
    }

    /// Records that a taker found the lock held and waited for it since `since`.
    pub(crate) fn record_wait(&self, since: Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.waited_ns.fetch_add(ns, Ordering::Relaxed);
        self.max_wait_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// Records that a fast-path access found a hold in progress and waited since `since` for it
    /// to end (`host/local.rs`: it then looks again, and may take the usual path).
    pub(crate) fn record_fast_wait(&self, since: Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.fast_waits.fetch_add(1, Ordering::Relaxed);
        self.fast_waited_ns.fetch_add(ns, Ordering::Relaxed);
        self.max_wait_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// Starts a new maximum (the histogram goes on).
    pub(crate) fn reset_max(&self) {
        self.max_ns.store(0, Ordering::Relaxed);
        *self.max_at.lock() = None;
        *self.max_usage.lock() = None;
        self.max_on_cpu_ns.store(0, Ordering::Relaxed);
        self.max_wait_ns.store(0, Ordering::Relaxed);
    }

    /// A snapshot.
    pub(crate) fn snapshot(&self) -> LockHolds {
        LockHolds {
            count: self.count.load(Ordering::Relaxed),
            total_ns: self.total_ns.load(Ordering::Relaxed),
            max_ns: self.max_ns.load(Ordering::Relaxed),
            max_at: self
                .max_at
                .lock()
                .map(|l| format!("{}:{}", l.file(), l.line())),
            max_usage: *self.max_usage.lock(),
            max_on_cpu_ns: self.max_on_cpu_ns.load(Ordering::Relaxed),
            buckets: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            waits: self.waits.load(Ordering::Relaxed),
            waited_ns: self.waited_ns.load(Ordering::Relaxed),
            fast_waits: self.fast_waits.load(Ordering::Relaxed),
            fast_waited_ns: self.fast_waited_ns.load(Ordering::Relaxed),
            max_wait_ns: self.max_wait_ns.load(Ordering::Relaxed),
        }
    }
}

/// A mutex whose holds are timed exactly as the host lock's are (from the acquisition to the
/// release, the holder's thread usage read on request): the instrument of
/// [`crate::host::GpuHost`]'s [`LockHolds`], for a lock of anyone's. `gpuvm exp lockhold`'s
/// `baseline` times a plain lock with it under the same threads' pressure, without a device
/// model: what the host's scheduler alone does to short critical sections.
#[derive(Debug, Default)]
pub struct TimedMutex<T> {
    lock: parking_lot::Mutex<T>,
    times: HoldTimes,
}

impl<T> TimedMutex<T> {
    /// A lock holding `value`; `thread_usage`: every hold also reads its thread's CPU clock and
    /// schedstat (as `GpuHost::measure_hold_thread_usage`).
    pub fn new(value: T, thread_usage: bool) -> TimedMutex<T> {
        let t = TimedMutex {
            lock: parking_lot::Mutex::new(value),
            times: HoldTimes::default(),
        };
        t.times.set_thread_usage(thread_usage);
        t
    }

    /// Runs `f` holding the lock: one timed hold, recorded as taken at the caller.
    #[track_caller]
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let at = Location::caller();
        let (mut guard, since, usage) = self
            .times
            .acquire(|| self.lock.try_lock(), || self.lock.lock());
        let r = f(&mut guard);
        self.times.record(since, usage, at);
        r
    }

    /// The holds so far.
    pub fn holds(&self) -> LockHolds {
        self.times.snapshot()
    }
}

/// Hold times of the host lock so far (wall-clock time, whatever clock the GPU runs on).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LockHolds {
    /// Holds recorded.
    pub count: u64,
    /// Their total, ns.
    pub total_ns: u64,
    /// The longest, ns.
    pub max_ns: u64,
    /// Where the longest hold's lock was taken (source file and line of the host API call
    /// that took it), if any.
    pub max_at: Option<String>,
    /// What the longest hold's thread did during it, when holds read their thread's usage
    /// (`GpuHost::measure_hold_thread_usage`).
    pub max_usage: Option<HoldUsage>,
    /// The most time on a CPU any one hold took (of those that read their thread's usage),
    /// ns: the longest the device model itself works under the lock, whatever the scheduler
    /// added to a hold's wall time.
    pub max_on_cpu_ns: u64,
    /// `buckets[i]`: holds of `[2^i, 2^(i+1))` ns ([`HOLD_BUCKETS`] of them).
    pub buckets: Vec<u64>,
    /// Takers (write holds) that found the lock held and waited.
    pub waits: u64,
    /// How long they waited in all, ns.
    pub waited_ns: u64,
    /// Fast-path accesses (`host/local.rs`) that found a hold in progress and waited for it to
    /// end (not holds: they then run beside other VMs or take the usual path, counted above).
    pub fast_waits: u64,
    /// How long they waited in all, ns.
    pub fast_waited_ns: u64,
    /// The longest any one of those waits (a taker's or a fast-path access's) lasted, ns: how
    /// long an exit was actually kept from the lock, where `max_ns` is how long the lock was
    /// held — a holder switched out while nobody wants the lock makes a long hold and no long
    /// wait. Like `max_ns`, the maximum since the host's last `GpuHost::reset_lock_hold_max`.
    pub max_wait_ns: u64,
}

impl LockHolds {
    /// The holds recorded since `earlier` (a snapshot of the same host); `max_ns` is the
    /// maximum since the host's last `GpuHost::reset_lock_hold_max`.
    pub fn since(&self, earlier: &LockHolds) -> LockHolds {
        LockHolds {
            count: self.count - earlier.count.min(self.count),
            total_ns: self.total_ns.saturating_sub(earlier.total_ns),
            max_ns: self.max_ns,
            max_at: self.max_at.clone(),
            max_usage: self.max_usage,
            max_on_cpu_ns: self.max_on_cpu_ns,
            buckets: self
                .buckets
                .iter()
                .zip(earlier.buckets.iter().chain(std::iter::repeat(&0)))
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
            waits: self.waits.saturating_sub(earlier.waits),
            waited_ns: self.waited_ns.saturating_sub(earlier.waited_ns),
            fast_waits: self.fast_waits.saturating_sub(earlier.fast_waits),
            fast_waited_ns: self.fast_waited_ns.saturating_sub(earlier.fast_waited_ns),
            max_wait_ns: self.max_wait_ns,
        }
    }

    /// The smallest bucket bound (2^(i+1) ns) at or below which a fraction `q` of the holds
    /// fall; 0 without holds.
    pub fn quantile_bound_ns(&self, q: f64) -> u64 {
        let want = (self.count as f64 * q).ceil() as u64;
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if want > 0 && seen >= want {
                return 1u64 << (i + 1).min(63);
            }
        }
        0
    }
}

/// A thread's cumulative time on a CPU (`CLOCK_THREAD_CPUTIME_ID`, current to the
/// nanosecond) and waiting on a run queue (`/proc/thread-self/schedstat`'s second figure,
/// added when the thread gets a CPU again; its first figure lags while the thread runs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ThreadUsage {
    on_cpu_ns: u64,
    run_delay_ns: u64,
}

thread_local! {
    /// This thread's schedstat file, opened at its first read (`None` inside: not there).
    static SCHEDSTAT: std::cell::OnceCell<Option<std::fs::File>> =
        const { std::cell::OnceCell::new() };
}

impl ThreadUsage {
    /// The calling thread's figures; `None` where the kernel does not keep them (no
    /// `CONFIG_SCHED_INFO`).
    fn now() -> Option<ThreadUsage> {
        use std::os::unix::fs::FileExt;
        SCHEDSTAT.with(|f| {
            let file = f
                .get_or_init(|| std::fs::File::open("/proc/thread-self/schedstat").ok())
                .as_ref()?;
            let mut buf = [0u8; 96];
            let n = file.read_at(&mut buf, 0).ok()?;
            let text = std::str::from_utf8(&buf[..n]).ok()?;
            let run_delay_ns = text.split_ascii_whitespace().nth(1)?.parse().ok()?;
            let cpu = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).ok()?;
            let on_cpu_ns = u64::try_from(cpu.tv_sec()).ok()? * 1_000_000_000
                + u64::try_from(cpu.tv_nsec()).ok()?;
            Some(ThreadUsage {
                on_cpu_ns,
                run_delay_ns,
            })
        })
    }

    fn since(&self, before: &ThreadUsage, wall_ns: u64) -> HoldUsage {
        let on_cpu_ns = self.on_cpu_ns.saturating_sub(before.on_cpu_ns);
        // The run-queue figure, read at the hold's edges, was seen to exceed the hold's wall
        // time now and then (2-core, PVM): capped at what the hold leaves.
        let runnable_ns = (self.run_delay_ns.saturating_sub(before.run_delay_ns))
            .min(wall_ns.saturating_sub(on_cpu_ns));
        HoldUsage {
            on_cpu_ns,
            runnable_ns,
            asleep_ns: wall_ns.saturating_sub(on_cpu_ns + runnable_ns),
        }
    }
}

/// Where a hold's wall time went, for its holder's thread (the kernel's schedstat).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct HoldUsage {
    /// On a CPU, ns.
    pub on_cpu_ns: u64,
    /// Runnable but not running — preempted, or woken and waiting for a CPU — ns.
    pub runnable_ns: u64,
    /// The rest of the hold: asleep (waiting for another lock, say), ns.
    pub asleep_ns: u64,
}

/// For tests of waits: runs `f` on a new thread and returns once that thread is asleep (it
/// tried something, found it taken, and parked), so that a wait is certain rather than a matter
/// of timing. Reads the thread's state in `/proc` (the project runs on Linux only); without it
/// the test fails here rather than guess with a sleep.
#[cfg(test)]
pub(crate) fn spawn_until_asleep<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        // `/proc/thread-self` links to `PID/task/TID`.
        let me = std::fs::read_link("/proc/thread-self").ok();
        // The receiver waits for this message below.
        let _ = tid_tx.send(me.and_then(|p| p.file_name().map(|t| t.to_owned())));
        f()
    });
    let tid = tid_rx
        .recv()
        .ok()
        .flatten()
        .expect("/proc/thread-self names the new thread");
    let stat = std::path::Path::new("/proc/self/task")
        .join(tid)
        .join("stat");
    let asleep = || {
        let s = std::fs::read_to_string(&stat).expect("the thread's /proc stat");
        // The state follows the command name's closing parenthesis.
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('S'))
    };
    while !asleep() {
        std::thread::yield_now();
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_holds_thread_usage_is_read_on_request() {
        let h = HoldTimes::default();
        h.set_thread_usage(true);
        let since = Instant::now();
        let before = h.usage_now();
        if before.is_none() {
            eprintln!("SKIP: this kernel keeps no /proc/thread-self/schedstat (CONFIG_SCHED_INFO)");
            return;
        }
        // Busy on the CPU, then asleep: both must show, and the parts add up to the hold.
        while since.elapsed() < std::time::Duration::from_millis(3) {
            std::hint::black_box(0u64);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        h.record(since, before, Location::caller());
        let s = h.snapshot();
        let u = s.max_usage.expect("read on request");
        assert!(u.on_cpu_ns > 0, "{u:?}");
        assert!(
            u.asleep_ns >= 10_000_000,
            "the 20 ms sleep is asleep: {u:?}"
        );
        assert!(
            u.on_cpu_ns + u.runnable_ns + u.asleep_ns <= s.max_ns,
            "{u:?} of {}",
            s.max_ns
        );
        assert_eq!(
            s.max_on_cpu_ns, u.on_cpu_ns,
            "one hold: its CPU time is the most"
        );
        h.reset_max();
        assert_eq!(
            h.snapshot().max_usage,
            None,
            "a new maximum starts without usage"
        );
        assert_eq!(h.snapshot().max_on_cpu_ns, 0);
    }

    #[test]
    fn a_timed_mutex_times_each_hold_and_waits_for_a_holder() {
        let m = std::sync::Arc::new(TimedMutex::new(0u32, false));
        // The hold covers the closure: at least as long as the closure measured itself.
        let (r, inner_ns) = m.with(|v| {
            let t = Instant::now();
            for _ in 0..1000 {
                *v = std::hint::black_box(*v + 1);
            }
            *v = 1;
            (
                *v,
                u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX),
            )
        });
        assert_eq!(r, 1, "the closure's value comes back");
        let h = m.holds();
        assert_eq!(h.count, 1);
        assert!(h.max_ns >= inner_ns, "the hold lasts the closure: {h:?}");
        assert!(h.max_at.is_some_and(|a| a.contains("hold.rs")));
        assert_eq!(h.max_usage, None, "usage is read only on request");
        // A second thread takes the lock while this one holds it: it waits, and is counted.
        // The hold lasts until that thread is asleep on the lock (it tried, found it held, and
        // parked), so the wait is certain, not a matter of timing.
        let other = m.clone();
        let t = m.with(|_| spawn_until_asleep(move || other.with(|v| *v += 1)));
        t.join().unwrap();
        let h = m.holds();
        assert_eq!(h.count, 3);
        assert_eq!(h.waits, 1, "{h:?}");
        assert!(h.waited_ns > 0);
        // One wait: the longest is that one.
        assert_eq!(h.max_wait_ns, h.waited_ns, "{h:?}");
        m.times.reset_max();
        assert_eq!(m.holds().max_wait_ns, 0, "a new maximum starts");
        assert_eq!(m.with(|v| *v), 2);
    }

    #[test]
    fn holds_land_in_log2_buckets() {
        let h = HoldTimes::default();
        h.record(Instant::now(), h.usage_now(), Location::caller());
        let s = h.snapshot();
        assert_eq!(s.count, 1);
        assert!(s.max_at.is_some_and(|a| a.contains("hold.rs")));
        assert_eq!(s.max_usage, None, "usage is read only on request");
        assert_eq!(s.buckets.iter().sum::<u64>(), 1);
        assert!(s.max_ns >= s.total_ns);
        let mut l = LockHolds {
            count: 4,
            total_ns: 0,
            max_ns: 9,
            max_at: None,
            buckets: vec![0; HOLD_BUCKETS],
            ..LockHolds::default()
        };
        l.buckets[1] = 3; // [2, 4) ns
        l.buckets[3] = 1; // [8, 16) ns
        assert_eq!(l.quantile_bound_ns(0.5), 4);
        assert_eq!(l.quantile_bound_ns(1.0), 16);
        let d = l.since(&LockHolds {
            count: 1,
            buckets: {
                let mut b = vec![0; HOLD_BUCKETS];
                b[1] = 1;
                b
            },
            ..LockHolds::default()
        });
        assert_eq!((d.count, d.buckets[1], d.buckets[3]), (3, 2, 1));
        let before = h.snapshot();
        h.record_wait(Instant::now());
        let w = h.snapshot().since(&before);
        assert_eq!((w.count, w.waits, w.fast_waits), (0, 1, 0));
        h.record_fast_wait(Instant::now());
        let w = h.snapshot().since(&before);
        assert_eq!((w.count, w.waits, w.fast_waits), (0, 1, 1));
    }
}
