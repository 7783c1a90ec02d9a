//! A simulated GF100 (Quadro 6000): the embedded default [`PhysicalGpu`], used by every test.
//!
//! It speaks the register interface nouveau speaks (see `docs/registers.md` for every register
//! it implements and how) and really executes work: PFIFO fetches GPFIFO entries and pushbuffers
//! through the channel's page tables, the copy engine and the compute class's fixed kernels move
//! and compute data through GPU virtual addresses, faults and errors are reported the way the
//! hardware reports them. Each operation takes modeled time ([`CostModel`],
//! `docs/sim-cost-model.md`) on one GPU timeline, driven by a [`Clock`].
//!
//! Modules, one per mechanism: `vram` sparse VRAM, `dma` system memory windows, `mem`
//! physical memory by target, `mmu` page walk and TLB, `bar` PRAMIN / BAR1 / BAR3, `regs` PMC /
//! PTIMER / PFB / PFFB, `intr` interrupt sources and the interrupt line, `pfifo` channel table /
//! runlist / doorbell / scheduler, `channel` per-channel state, `pbdma` command processing,
//! `copy` and `compute` the engines, `cost` the cost model.
//!
//! Locking: one mutex around the whole state. Every [`PhysicalGpu`] method takes it, first lets
//! the GPU catch up with the clock (a comparison when nothing is due), does its work, lets newly
//! submitted work start, and finally updates the interrupt line outside the lock.
//!
//! **Who runs the engines** ([`Executor`], `worker`): with a real clock the copy and compute
//! engines' pieces run on a worker thread of the GPU's own, as a real GPU computes beside its
//! driver: a [`PhysicalGpu`] call never performs engine work, it waits at most for the one piece
//! (≤ 64 KiB moved or ~64 Ki multiply-adds) the worker is doing. With a simulated clock the
//! caller runs them inline, within its call's budget ([`WORK_BUDGET`]), so that runs stay
//! deterministic.

mod bar;
mod budget;
mod channel;
mod completion;
mod compute;
mod copy;
mod cost;
mod dma;
mod engine;
mod intr;
mod m2mf;
mod mem;
mod mmu;
mod pbdma;
mod pfifo;
mod regs;
mod vram;
mod worker;
mod worker_time;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard};

use vm_memory::GuestMemoryMmap;

use gpuvm_phys::addr::{Gpa, HostVram, Iova};
use gpuvm_phys::clock::{Clock, SimClock};
use gpuvm_phys::irq::IrqLine;
use gpuvm_phys::{Bar, ChannelStateError, DmaError, GpuStats, PhysicalGpu};

pub use budget::{EngineWorkStats, WORK_BUDGET};
pub use cost::CostModel;
pub use engine::EngineWrites;
pub use worker_time::WorkerTimes;

/// Name of the engine worker's thread (`Executor::Worker`), as profilers and `/proc` show it.
pub const ENGINE_THREAD_NAME: &str = "gpuvm-sim-engines";

/// How long a call made while a caller's hold is open spins for the simulator's lock before it
/// sleeps ([`SimGpu::lock`]): a few of the engine worker's pieces, which it ends its batch
/// after when a call waits (MODEL choice).
const HOLDER_SPIN_NS: u64 = 300_000;

use bar::Bars;
use intr::Interrupts;
use mem::Memory;
use mmu::Tlb;
use pfifo::{Fifo, NextEvent};
use regs::{RegWrite, Regs, TlbFlush};

/// Configuration of a simulated GPU.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// VRAM size in bytes (default 6 GiB, a Quadro 6000). Rounded down to a whole MiB, at least
    /// 1 MiB, because the sizing registers report MiB per partition. Allocated lazily.
    pub vram_size: u64,
    /// The clock the GPU models time against (default: a new [`SimClock`]).
    pub clock: Arc<dyn Clock>,
    /// Durations of the GPU's operations (default: [`CostModel::quadro_6000`]).
    pub cost: CostModel,
    /// When engine operations read and write memory (default: progressively over their
    /// modeled duration, [`EngineWrites::OverDuration`]).
    pub engine_writes: EngineWrites,
    /// Who performs the engines' work (default [`Executor::Auto`]).
    pub executor: Executor,
    /// How the engine worker, if any, asks the host's scheduler to treat it (default
    /// [`WorkerPolicy::Batch`]).
    pub worker_policy: WorkerPolicy,
}

/// The host scheduling policy of the engine worker's thread.
///
/// The worker is the simulated GPU's compute: throughput work whose timing is modeled, not
/// taken from the host, and which on hardware would not compete with the vCPUs for a core at
/// all. Where busy threads outnumber cores, a worker that competes as an equal takes the CPU
/// from vCPU threads in the middle of their device-model critical sections (lock-holder
/// preemption: `gpuvm exp lockhold` on 2 cores measured host-lock holds of 3-7 ms with 11-65 us
/// of them on a CPU, docs/benchmarks.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkerPolicy {
    /// `SCHED_BATCH`: Linux's policy for CPU-bound threads that are not interactive — same
    /// nice level and share of the CPU, but the thread does not preempt others when it wakes.
    /// Asked for by the worker itself, needing no privilege; if refused, the worker runs as
    /// `Normal` (logged).
    #[default]
    Batch,
    /// The process's default policy, as any thread.
    Normal,
    /// `SCHED_IDLE`: the worker runs only on a core no other thread of the host wants — a
    /// vCPU thread that wakes takes the core from it at once, as a GPU's engines take no core
    /// from the CPU at all. Asked for by the worker itself, needing no privilege; if refused,
    /// the worker runs as `Normal` (logged).
    Idle,
}

impl WorkerPolicy {
    /// Puts the calling thread under this policy (its nice level kept; `Normal` changes
    /// nothing): what the engine worker does when it starts, and what an experiment does to
    /// give a thread of its own the worker's standing with the host's scheduler.
    pub fn apply_to_this_thread(self) -> std::io::Result<()> {
        let policy = match self {
            WorkerPolicy::Batch => libc::SCHED_BATCH,
            WorkerPolicy::Idle => libc::SCHED_IDLE,
            WorkerPolicy::Normal => return Ok(()),
        };
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `sched_setscheduler` with pid 0 changes only the calling thread's policy and
        // reads `param`, a valid `sched_param` that outlives the call.
        if unsafe { libc::sched_setscheduler(0, policy, &param) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// The policy's name on a command line and in reports: `batch`, `normal` or `idle`.
    pub fn name(self) -> &'static str {
        match self {
            WorkerPolicy::Batch => "batch",
            WorkerPolicy::Normal => "normal",
            WorkerPolicy::Idle => "idle",
        }
    }
}

impl std::str::FromStr for WorkerPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            WorkerPolicy::Batch,
            WorkerPolicy::Normal,
            WorkerPolicy::Idle,
        ]
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| format!("`{s}`: expected `batch`, `normal` or `idle`"))
    }
}

/// Who performs the copy and compute engines' pieces of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Executor {
    /// A worker thread with a real clock, the caller with a simulated one.
    #[default]
    Auto,
    /// The thread of the [`PhysicalGpu`] call that finds work due, within the call's budget:
    /// deterministic, and the only choice that is with a simulated clock (nothing else moves it).
    Inline,
    /// A worker thread of the GPU's own: calls never perform engine work.
    Worker,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            vram_size: 6 << 30,
            clock: Arc::new(SimClock::new()),
            cost: CostModel::default(),
            engine_writes: EngineWrites::default(),
            executor: Executor::default(),
            worker_policy: WorkerPolicy::default(),
        }
    }
}

/// The parts of the GPU every mechanism touches: memory, TLB, interrupts, counters, costs.
#[derive(Debug)]
pub(crate) struct Core {
    pub mem: Memory,
    pub tlb: Tlb,
    pub intr: Interrupts,
    pub stats: GpuStats,
    pub cost: CostModel,
    /// Incremented by every TLB flush (BAR bindings reload their VM when it changes).
    pub flush_epoch: u64,
    /// The staging a matrix kernel loads its `b` operand into (`engine`), handed back when the
    /// kernel completes and reused by the next one: its pages stay mapped. A fresh 4 MiB
    /// allocation per kernel faulted each of its 1,024 pages in under the simulator's lock
    /// (1-15 us a fault on this project's 2-core host: holds of up to 0.5 ms per 64 KiB load,
    /// `gpuvm exp lockhold`).
    pub matmul_stage: Vec<u32>,
    /// What a copy's piece works in (`Core::copy_va`), kept between pieces: no allocation or
    /// zeroing per piece.
    pub copy_scratch: mmu::CopyScratch,
}

impl Core {
    pub(crate) fn new(vram_size: u64, cost: CostModel) -> Core {
        Core {
            mem: Memory::new(vram_size),
            tlb: Tlb::default(),
            intr: Interrupts::default(),
            stats: GpuStats::default(),
            cost,
            flush_epoch: 0,
            matmul_stage: Vec::new(),
            copy_scratch: Default::default(),
        }
    }

    /// Performs a TLB flush (register or MEM_OP) and counts it.
    pub(crate) fn flush_tlb(&mut self, f: TlbFlush) {
        match f {
            TlbFlush::All => self.tlb.flush_all(),
            TlbFlush::Pd { pd, target } => self.tlb.flush_pd(pd, target),
            TlbFlush::Page { pd, target, va } => self.tlb.flush_page(pd, target, va),
            TlbFlush::PageAllPd { va } => self.tlb.flush_va(va),
        }
        self.stats.tlb_flushes += 1;
        self.flush_epoch += 1;
    }
}

/// Everything behind the lock.
struct State {
    core: Core,
    regs: Regs,
    bars: Bars,
    fifo: Fifo,
    /// Interrupt line level last computed, and a sequence number of its changes.
    line: bool,
    line_seq: u64,
    /// The batch (`Shared::batch`) whose engine-work budget the calls are using; 0 while no
    /// batch was ever begun (the budget is then per call).
    batch_seen: u64,
    /// Calls perform due engine work themselves ([`Executor::Inline`]).
    engines_inline: bool,
    /// The worker waits for engine work to be launched.
    worker_idle: bool,
}

impl State {
    fn read_reg(&mut self, offset: u32, now: u64) -> u32 {
        let pramin = gf100::pbus::PRAMIN_BASE..gf100::pbus::PRAMIN_BASE + gf100::pbus::PRAMIN_SIZE;
        let known = if offset & 3 != 0 {
            None
        } else if pramin.contains(&offset) {
            Some(self.bars.pramin_read(&mut self.core, offset - pramin.start))
        } else {
            self.regs
                .read(offset, now)
                .or_else(|| self.core.intr.read(offset))
                .or_else(|| self.bars.read_reg(offset))
                .or_else(|| self.fifo.read_reg(offset))
        };
        known.unwrap_or_else(|| {
            self.core.stats.bad_register_reads += 1;
            gf100::BAD_REGISTER
        })
    }

    fn write_reg(&mut self, offset: u32, value: u32, now: u64) {
        if offset == gf100::pmc::ENABLE {
            let before = self.regs.read(offset, now).unwrap_or(0);
            self.fifo
                .reset_engines(&mut self.core, before & !value, now);
        }
        let pramin = gf100::pbus::PRAMIN_BASE..gf100::pbus::PRAMIN_BASE + gf100::pbus::PRAMIN_SIZE;
        let known = if offset & 3 != 0 {
            false
        } else if pramin.contains(&offset) {
            if let Some(w) = self
                .bars
                .pramin_write(&mut self.core, offset - pramin.start, value)
            {
                self.fifo.snoop(w);
            }
            true
        } else {
            match self.regs.write(offset, value) {
                RegWrite::Done => true,
                RegWrite::Flush(f) => {
                    self.core.flush_tlb(f);
                    true
                }
                RegWrite::Unknown => {
                    let intr = self.core.intr.write(offset, value);
                    if intr && Interrupts::is_pbdma_intr(offset) && !self.core.intr.pbdma_pending()
                    {
                        // The PBDMA's interrupt is cleared: it goes on.
                        self.fifo.release_halted();
                    }
                    intr || self.bars.write_reg(&mut self.core, offset, value)
                        || self.fifo.write_reg(&mut self.core, offset, value, now)
                }
            }
        };
        if !known {
            self.core.stats.bad_register_writes += 1;
        }
    }

    /// Recomputes the interrupt line; returns `(sequence, level)` if it changed.
    fn line_change(&mut self) -> Option<(u64, bool)> {
        let level = self.core.intr.line_level();
        if level == self.line {
            return None;
        }
        self.line = level;
        self.line_seq += 1;
        Some((self.line_seq, level))
    }
}

/// The interrupt line and the sequence number of the last level applied to it.
#[derive(Default)]
struct LineOut {
    line: Option<Arc<dyn IrqLine>>,
    applied: u64,
    /// [`PhysicalGpu::set_event_waker`]'s waker.
    waker: Option<Arc<dyn Fn() + Send + Sync>>,
}

/// What the GPU's callers and its engine worker share.
struct Shared {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    line: Mutex<LineOut>,
    /// Wakes the engine worker (`worker`).
    wake: Condvar,
    /// Ends the engine worker.
    stop: AtomicBool,
    /// Since when (clock ns + 1; 0: not) the engine worker waits for the lock: a call that ends
    /// after it has waited [`worker::HANDOFF_AFTER_NS`] hands it over (`unlock_fair`) instead
    /// of letting a polling caller take it straight back, so that pollers cannot starve the
    /// engines; sooner, the lock is released as usual (a hand-off at every call would queue
    /// every caller behind a thread wake-up).
    worker_wants: AtomicU64,
    /// The clock is simulated.
    simulated: bool,
    /// Calls that found the lock taken, and how long they waited for it, ns
    /// ([`SimGpu::lock_waits`]).
    waits: AtomicU64,
    waited_ns: AtomicU64,
    /// The caller's batches begun (`PhysicalGpu::begin_batch`): the engine-work budget is per
    /// batch instead of per call once one has begun. A count rather than a flag under the
    /// lock, so that beginning a batch — at the start of every host-lock hold — does not wait
    /// for the simulator's lock (held by the engine worker, possibly preempted): the first
    /// call of a new batch renews the budget instead.
    batch: AtomicU64,
    /// Batches begun and not yet ended: callers holding their own lock (the host's), whom the
    /// engine worker gives way to between matrix blocks.
    batches_open: AtomicU64,
    /// Calls waiting for the lock ([`SimGpu::lock`]); the engine worker's budget reads it too,
    /// and ends a batch after the piece it is at while a call waits.
    callers_waiting: Arc<AtomicU32>,
    /// The GPU's next event as of the end of the last hold of the state's lock that could change
    /// it, with the engine worker (`NEXT_*` encoding; 0: not known): lets
    /// [`PhysicalGpu::next_event_ns`] answer without the lock when the answer is in the future
    /// (a locked call would have done nothing then).
    next_event: AtomicU64,
    /// Where the engine worker's time went ([`SimGpu::worker_times`]).
    worker_times: worker_time::Totals,
}

/// [`Shared::next_event`]: nothing in flight.
const NEXT_IDLE: u64 = u64::MAX;
/// [`Shared::next_event`]: the worker is behind an engine operation's end.
const NEXT_WORKER_BEHIND: u64 = u64::MAX - 1;

impl Shared {
    /// Records the next event of `s` at `now` (with the engine worker only; the caller holds the
    /// state's lock and has advanced it to `now`).
    fn publish_next_event(&self, s: &mut State, now: u64) {
        if s.engines_inline {
            return;
        }
        let v = match s.fifo.next_event_kind(now, false) {
            NextEvent::Idle => NEXT_IDLE,
            NextEvent::WorkerBehind => NEXT_WORKER_BEHIND,
            NextEvent::At(t) => t.clamp(1, NEXT_WORKER_BEHIND - 1),
        };
        self.next_event.store(v, Ordering::Release);
    }

    /// The next event as published, if it says a locked call would find nothing to do at `now`.
    fn next_event_unlocked(&self, now: u64) -> Option<Option<u64>> {
        match self.next_event.load(Ordering::Acquire) {
            NEXT_IDLE => Some(None),
            NEXT_WORKER_BEHIND => Some(Some(now.saturating_add(pfifo::WORKER_LAG_POLL_NS))),
            0 => None,
            t if t > now => Some(Some(t)),
            _ => None,
        }
    }

    fn apply_line(&self, seq: u64, level: bool) {
        let mut out = self.line.lock();
        if seq > out.applied {
            out.applied = seq;
            if let Some(line) = &out.line {
                line.set_level(level);
            }
        }
    }

    /// Calls the event waker, if one is connected (the engine worker, after it finished work
    /// with a real clock: `worker`).
    fn wake_event(&self) {
        let waker = self.line.lock().waker.clone();
        if let Some(w) = waker {
            w();
        }
    }
}

/// A simulated GF100.
pub struct SimGpu {
    vram_size: u64,
    /// The VRAM, also reachable without the state's lock (`read_vram`, `write_vram`,
    /// `fill_vram` with the engine worker: [`SimGpu::vram_beside_lock`]).
    vram: Arc<vram::Vram>,
    shared: Arc<Shared>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl SimGpu {
    /// A GPU in its reset state.
    pub fn new(config: SimConfig) -> SimGpu {
        let vram_size = (config.vram_size & !((1 << 20) - 1)).max(1 << 20);
        let mut fifo = Fifo::default();
        fifo.mode = config.engine_writes;
        let worker = match config.executor {
            Executor::Auto => !config.clock.is_simulated(),
            Executor::Inline => false,
            Executor::Worker => true,
        };
        let state = State {
            core: Core::new(vram_size, config.cost),
            regs: Regs::new(vram_size),
            bars: Bars::default(),
            fifo,
            line: false,
            line_seq: 0,
            batch_seen: 0,
            engines_inline: !worker,
            worker_idle: false,
        };
        let shared = Arc::new(Shared {
            simulated: config.clock.is_simulated(),
            clock: config.clock,
            state: Mutex::new(state),
            line: Mutex::new(LineOut::default()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            worker_wants: AtomicU64::new(0),
            worker_times: worker_time::Totals::default(),
            waits: AtomicU64::new(0),
            waited_ns: AtomicU64::new(0),
            batch: AtomicU64::new(0),
            batches_open: AtomicU64::new(0),
            next_event: AtomicU64::new(0),
            callers_waiting: Arc::new(AtomicU32::new(0)),
        });
        let waiting = shared.callers_waiting.clone();
        shared.state.lock().fifo.budget.callers_waiting = waiting;
        let worker = worker.then(|| worker::spawn(shared.clone(), config.worker_policy));
        let vram = shared.state.lock().core.mem.vram.clone();
        SimGpu {
            vram_size,
            vram,
            shared,
            worker,
        }
    }

    /// True when the engines' work runs on the GPU's worker thread.
    pub fn has_engine_worker(&self) -> bool {
        self.worker.is_some()
    }

    /// The clock the GPU runs against.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.shared.clock.clone()
    }

    /// Modeled GPU time channel `chid` has occupied so far (command fetch and engine work), in
    /// ns, including the elapsed part of its work in flight; `None` for `chid >= 128`.
    pub fn channel_busy_ns(&self, chid: u32) -> Option<u64> {
        self.with_state(|s, now| s.fifo.channel_busy_ns(chid as usize, now))
    }

    /// Counters of the engine work done in pieces (how much per call), for tests of the
    /// per-call bound ([`WORK_BUDGET`]); they say nothing about modeled time.
    pub fn engine_work(&self) -> EngineWorkStats {
        self.with_state(|s, _| s.fifo.budget.stats)
    }

    /// Bytes of host memory the VRAM currently occupies (VRAM is allocated lazily in 64 KiB
    /// chunks).
    pub fn vram_resident_bytes(&self) -> u64 {
        self.with_state(|s, _| s.core.mem.vram.allocated_chunks() as u64 * 64 * 1024)
    }

    /// Calls into the GPU that found its lock taken (by the engine worker or another caller)
    /// and the total time they waited for it, ns: what a caller — the host, under its own lock —
    /// pays for the engines and the other callers.
    pub fn lock_waits(&self) -> (u64, u64) {
        (
            self.shared.waits.load(Ordering::Relaxed),
            self.shared.waited_ns.load(Ordering::Relaxed),
        )
    }

    /// Where the engine worker's wall time went since the GPU was created, by activity (all
    /// zero without a worker): whether the engines bound a run or wait for work.
    pub fn worker_times(&self) -> WorkerTimes {
        self.shared.worker_times.read()
    }

    /// The simulator's lock, for a call. A call that finds it taken is counted in
    /// [`Shared::callers_waiting`] while it waits (the engine worker ends its batch after the
    /// piece it is at, and hands the lock over); while a caller's hold is open ([`Shared::
    /// batches_open`]: a host-lock hold, which every other VM waits for — the waiting call is
    /// then most often the holder's, and a call on the fast path beside it spins too) it spins
    /// for it up to [`HOLDER_SPIN_NS`] before it sleeps. A holder that slept is woken by the worker's
    /// hand-off and then waits for a CPU: on a machine with fewer cores than busy threads, for
    /// the rest of a time slice (2-core `gpuvm exp lockhold`: the `mmul` row's longest hold
    /// under 2 ms in 15 of 25 runs sleeping, 23 of 25 spinning; docs/benchmarks.md).
    fn lock(&self) -> MutexGuard<'_, State> {
        if let Some(g) = self.shared.state.try_lock() {
            return g;
        }
        let t = std::time::Instant::now();
        self.shared.callers_waiting.fetch_add(1, Ordering::AcqRel);
        let spun = (self.shared.batches_open.load(Ordering::Relaxed) > 0)
            .then(|| {
                while t.elapsed().as_nanos() < u128::from(HOLDER_SPIN_NS) {
                    for _ in 0..64 {
                        std::hint::spin_loop();
                    }
                    if let Some(g) = self.shared.state.try_lock() {
                        return Some(g);
                    }
                }
                None
            })
            .flatten();
        let g = spun.unwrap_or_else(|| self.shared.state.lock());
        self.shared.callers_waiting.fetch_sub(1, Ordering::AcqRel);
        self.shared.waits.fetch_add(1, Ordering::Relaxed);
        self.shared
            .waited_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        g
    }

    /// Runs `f` on the state after letting the GPU catch up with the clock, then lets new work
    /// start and updates the interrupt line.
    fn with_state<R>(&self, f: impl FnOnce(&mut State, u64) -> R) -> R {
        let now = self.shared.clock.now_ns();
        let (r, change, wake) = {
            let mut guard = self.lock();
            let s = &mut *guard;
            let batch = self.shared.batch.load(Ordering::Acquire);
            if batch == 0 || batch != s.batch_seen {
                s.batch_seen = batch;
                s.fifo.budget.new_call();
            }
            let inline = s.engines_inline;
            s.fifo.advance(&mut s.core, now, inline);
            let r = f(s, now);
            s.fifo.advance(&mut s.core, now, inline);
            // A simulated clock moves only with calls: the worker is woken by each.
            let wake = (s.worker_idle || self.shared.simulated) && s.fifo.engine_in_flight();
            if wake {
                s.worker_idle = false;
            }
            let change = s.line_change();
            self.shared.publish_next_event(s, now);
            let since = self.shared.worker_wants.load(Ordering::Relaxed);
            if since != 0 && now.saturating_sub(since - 1) >= worker::HANDOFF_AFTER_NS {
                MutexGuard::unlock_fair(guard);
            } else {
                drop(guard);
            }
            (r, change, wake)
        };
        if wake {
            self.shared.wake.notify_one();
        }
        if let Some((seq, level)) = change {
            self.shared.apply_line(seq, level);
        }
        r
    }
}

impl SimGpu {
    /// Runs the memory access `f` on the state: while the GPU has nothing in flight, queued or
    /// blocked (`Fifo::idle`) under the lock alone — catching up with the clock would only move
    /// the GPU's idle time, and a memory access changes no interrupt and no next event —,
    /// otherwise as every call does ([`SimGpu::with_state`]: the GPU advanced first, so that
    /// the access lands after the engine work due by now).
    fn with_memory<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        {
            let mut guard = self.lock();
            if guard.fifo.idle() {
                return f(&mut guard);
            }
        }
        self.with_state(|s, _| f(s))
    }

    /// True when VRAM is read and written without the state's lock: with the engine worker and
    /// a real clock, where nothing needs the GPU advanced before a memory access (the worker
    /// advances it; a simulated clock moves only with calls, which must then advance it).
    fn vram_beside_lock(&self) -> bool {
        self.worker.is_some() && !self.shared.simulated
    }

    /// With a simulated clock and the engine worker: waits (in host time) until the worker has
    /// done the engine work due at the clock's time, since a simulated clock only moves when a
    /// caller moves it and the next event is only known once that work is done.
    fn wait_for_worker(&self) {
        loop {
            let now = self.shared.clock.now_ns();
            let mut guard = self.lock();
            let behind = guard.fifo.engine_due(now).is_some_and(|t| t <= now);
            if !behind {
                return;
            }
            guard.worker_idle = false;
            self.shared.wake.notify_one();
            MutexGuard::unlock_fair(guard);
            std::thread::yield_now();
        }
    }
}

impl Drop for SimGpu {
    fn drop(&mut self) {
        if let Some(w) = self.worker.take() {
            self.shared.stop.store(true, Ordering::SeqCst);
            {
                // Under the lock, so that the worker is either waiting (and woken) or will see
                // the flag before it waits.
                let _s = self.lock();
                self.shared.wake.notify_all();
            }
            let _ = w.join();
        }
    }
}

impl Default for SimGpu {
    fn default() -> Self {
        SimGpu::new(SimConfig::default())
    }
}

impl std::fmt::Debug for SimGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimGpu")
            .field("vram_size", &self.vram_size)
            .field("clock", &self.shared.clock)
            .field("engine_worker", &self.worker.is_some())
            .finish_non_exhaustive()
    }
}

impl PhysicalGpu for SimGpu {
    fn read_reg(&self, offset: u32) -> u32 {
        if self.worker.is_some() && regs::is_ptimer_time(offset) {
            // The clock, without the lock: the worker keeps the GPU up to date by itself, so a
            // driver polling the timer does not queue behind everyone else's GPU calls. Not
            // counted in `GpuStats::mmio_reads` (a counter all callers write would be the
            // shared cache line the lock was).
            return regs::ptimer_time(offset, self.shared.clock.now_ns());
        }
        self.with_state(|s, now| {
            s.core.stats.mmio_reads += 1;
            s.read_reg(offset, now)
        })
    }

    fn write_reg(&self, offset: u32, value: u32) {
        self.with_state(|s, now| {
            s.core.stats.mmio_writes += 1;
            s.write_reg(offset, value, now);
        })
    }

    fn read_aperture(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        self.with_state(|s, _| {
            s.core.stats.aperture_reads += 1;
            s.bars.sync(&mut s.core);
            s.bars.aperture_read(&mut s.core, bar, offset, data);
        })
    }

    fn write_aperture(&self, bar: Bar, offset: u64, data: &[u8]) {
        self.with_state(|s, _| {
            s.core.stats.aperture_writes += 1;
            s.bars.sync(&mut s.core);
            let fifo = &mut s.fifo;
            s.bars
                .aperture_write(&mut s.core, bar, offset, data, &mut |w| fifo.snoop(w));
        })
    }

    fn vram_size(&self) -> u64 {
        self.vram_size
    }

    fn read_vram(&self, addr: HostVram, data: &mut [u8]) {
        // As `write_vram`: with the engine worker, straight from the memory. The read sees the
        // GPU as of its last advance (the worker's batch or a call), not advanced to "now"
        // first: what is due later is announced by `next_event_ns`, whose locked call advances
        // it. Fence and GP_GET polls then no longer queue with the worker for the lock.
        if self.vram_beside_lock() {
            self.vram.read(addr.raw(), data);
            return;
        }
        self.with_memory(|s| {
            s.core.mem.vram.read(addr.raw(), data);
        })
    }

    fn write_vram(&self, addr: HostVram, data: &[u8]) {
        // With the engine worker the GPU need not be advanced first (the worker does that), so
        // the write goes straight to the memory, without the lock the host's calls and the
        // worker take: a VMM writing VRAM meets the engines only in memory, as through a BAR.
        // Nothing the simulator keeps depends on VRAM contents outside the lock's holds: its
        // TLB is flushed by register, the doorbell is not rung by this backdoor.
        if self.vram_beside_lock() {
            self.vram.write(addr.raw(), data);
            return;
        }
        self.with_memory(|s| {
            s.core.mem.vram.write(addr.raw(), data);
        })
    }

    fn vram_backing(&self) -> Option<gpuvm_phys::VramBacking> {
        let b = self.with_state(|s, _| s.core.mem.vram.backing());
        Some(gpuvm_phys::VramBacking {
            file: Some(b.file),
            file_offset: 0,
            host_addr: b.host_addr,
            len: b.len,
        })
    }

    fn vram_resident_bytes(&self, addr: HostVram, len: u64) -> Option<u64> {
        // A pure read of the backing file's extents: the GPU is not advanced.
        Some(self.lock().core.mem.vram.resident_bytes(addr.raw(), len))
    }

    fn vram_resident_ranges(&self, addr: HostVram, len: u64) -> Option<Vec<(u64, u64)>> {
        Some(self.lock().core.mem.vram.resident_ranges(addr.raw(), len))
    }

    fn channel_acquire(&self, chid: u32) -> gpuvm_phys::AcquireState {
        self.with_state(|s, _| s.fifo.channel_acquire(chid))
    }

    fn save_channel(&self, chid: u32) -> Result<Vec<u8>, ChannelStateError> {
        self.with_state(|s, _| s.fifo.save_channel(chid))
    }

    fn restore_channel(&self, chid: u32, state: &[u8]) -> Result<(), ChannelStateError> {
        self.with_state(|s, _| s.fifo.restore_channel(chid, state))
    }

    fn fill_vram(&self, addr: HostVram, len: u64, byte: u8) {
        // As `write_vram`: with the engine worker, without the lock (a scrub's hole punch is a
        // syscall that walks the mapping, which no engine or caller should wait for).
        if self.vram_beside_lock() {
            self.vram.fill(addr.raw(), len, byte);
            return;
        }
        self.with_state(|s, _| s.core.mem.vram.fill(addr.raw(), len, byte));
    }

    fn map_dma(
        &self,
        iova: Iova,
        len: u64,
        mem: GuestMemoryMmap,
        gpa: Gpa,
    ) -> Result<(), DmaError> {
        self.with_state(|s, _| s.core.mem.dma.map(iova, len, mem, gpa))
    }

    fn unmap_dma(&self, iova: Iova) -> Result<(), DmaError> {
        self.with_state(|s, _| s.core.mem.dma.unmap(iova))
    }

    fn set_irq_line(&self, line: Arc<dyn IrqLine>) {
        self.shared.line.lock().line = Some(line);
        // Re-send the current level under a new sequence number; a concurrent change gets a
        // later number and wins.
        let (seq, level) = self.with_state(|s, _| {
            s.line_seq += 1;
            (s.line_seq, s.line)
        });
        self.shared.apply_line(seq, level);
    }

    fn set_event_waker(&self, waker: Arc<dyn Fn() + Send + Sync>) {
        self.shared.line.lock().waker = Some(waker);
    }

    fn poll(&self) {
        self.with_state(|_, _| ());
    }

    fn next_event_ns(&self) -> Option<u64> {
        if self.worker.is_some() && self.shared.simulated {
            self.wait_for_worker();
        } else if self.worker.is_some() {
            if let Some(next) = self.shared.next_event_unlocked(self.shared.clock.now_ns()) {
                return next;
            }
        }
        self.with_state(|s, now| s.fifo.next_event(now, s.engines_inline))
    }

    fn channel_busy_ns(&self, chid: u32) -> Option<u64> {
        SimGpu::channel_busy_ns(self, chid)
    }

    fn tlb_flush(&self, vspace: u32, trigger: u32, polls: u32) -> (bool, bool) {
        use gf100::pffb;
        self.with_state(|s, now| {
            // The same register accesses as the sequence, under one hold: a free slot and the
            // acknowledgement are answered at once here.
            let poll = |s: &mut State, mask: u32| {
                (0..polls).any(|_| {
                    s.core.stats.mmio_reads += 1;
                    s.read_reg(pffb::VM_CFG, now) & mask != 0
                })
            };
            let slot = poll(s, pffb::VM_CFG_FLUSH_SLOTS_MASK);
            s.core.stats.mmio_writes += 2;
            s.write_reg(pffb::TLB_FLUSH_VSPACE, vspace, now);
            s.write_reg(pffb::TLB_FLUSH_TRIGGER, trigger, now);
            (slot, poll(s, pffb::VM_CFG_FLUSH_QUEUED))
        })
    }

    fn engine_states(&self) -> [u32; gf100::pfifo::ENGINES as usize] {
        self.with_state(|s, _| {
            s.core.stats.mmio_reads += u64::from(gf100::pfifo::ENGINES);
            // What `read_reg` of each ENG_STATE answers (only PFIFO decodes those offsets),
            // without its walk through every register block: the host asks at every service.
            std::array::from_fn(|e| s.fifo.eng_state(e as u32))
        })
    }

    fn channels_busy_ns(&self, chids: std::ops::Range<u32>) -> Option<Vec<u64>> {
        self.with_state(|s, now| {
            chids
                .map(|c| s.fifo.channel_busy_ns(c as usize, now))
                .collect()
        })
    }

    fn begin_batch(&self) {
        self.shared.batch.fetch_add(1, Ordering::AcqRel);
        self.shared.batches_open.fetch_add(1, Ordering::Relaxed);
    }

    fn end_batch(&self) {
        let _ = self
            .shared
            .batches_open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    fn stats(&self) -> GpuStats {
        self.with_state(|s, _| GpuStats {
            dma_errors: s.core.mem.errors,
            ..s.core.stats.clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gf100::{pfifo, pmc};
    use gpuvm_phys::irq::IrqFlag;

    fn gpu() -> SimGpu {
        SimGpu::new(SimConfig::default())
    }

    #[test]
    fn worker_policies_parse_from_their_names_and_nothing_else() {
        for p in [
            WorkerPolicy::Batch,
            WorkerPolicy::Normal,
            WorkerPolicy::Idle,
        ] {
            assert_eq!(p.name().parse::<WorkerPolicy>(), Ok(p));
        }
        assert!("Batch".parse::<WorkerPolicy>().is_err());
        assert!("".parse::<WorkerPolicy>().is_err());
    }

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<SimGpu>();
    }

    #[test]
    fn reset_values_and_unknown_registers() {
        let g = gpu();
        assert_eq!(g.read_reg(pmc::BOOT_0), 0x0c0c_00a3);
        assert_eq!(g.read_reg(0x123450), gf100::BAD_REGISTER);
        assert_eq!(
            g.read_reg(pmc::BOOT_0 + 1),
            gf100::BAD_REGISTER,
            "unaligned"
        );
        g.write_reg(0x123450, 1);
        let st = g.stats();
        assert_eq!((st.bad_register_reads, st.bad_register_writes), (2, 1));
        assert_eq!((st.mmio_reads, st.mmio_writes), (3, 1));
        assert_eq!(g.vram_size(), 6 << 30);
        assert_eq!(g.vram_resident_bytes(), 0);
    }

    #[test]
    fn irq_line_follows_pmc() {
        let g = gpu();
        let flag = Arc::new(IrqFlag::new());
        g.set_irq_line(flag.clone());
        assert!(!flag.is_asserted());
        g.write_reg(pfifo::INTR_EN, u32::MAX);
        g.write_reg(pfifo::RUNLIST_SUBMIT, 0);
        assert!(!flag.is_asserted(), "PMC INTR_EN still off");
        g.write_reg(pmc::INTR_EN_HOST, pmc::INTR_EN_HARDWARE);
        assert!(flag.is_asserted());
        assert_eq!(g.read_reg(pmc::INTR_HOST), pmc::INTR_PFIFO);
        g.write_reg(pfifo::INTR_RUNLIST, pfifo::INTR_RUNLIST_EVENT);
        assert!(!flag.is_asserted());
        assert_eq!(flag.rising_edges(), 1);
    }

    #[test]
    fn vram_size_is_rounded_to_mib() {
        let g = SimGpu::new(SimConfig {
            vram_size: (3 << 20) + 5,
            ..SimConfig::default()
        });
        assert_eq!(g.vram_size(), 3 << 20);
        let g = SimGpu::new(SimConfig {
            vram_size: 0,
            ..SimConfig::default()
        });
        assert_eq!(g.vram_size(), 1 << 20);
    }
}
