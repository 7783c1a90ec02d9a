//! `gpuvm exp lockhold`: how long one VM can make another VM's exits wait. Every guest access
//! takes the host lock (`gpuvm::host`); the isolation review measured a victim's register read
//! held 5.6-6 s behind a neighbour's two 1024x1024 matrix multiplies (the simulator ran them
//! inside whichever call advanced it) and 210 ms behind one para-virtual batch of 2048 page
//! table switches. Both are bounded now (the simulator's per-call work budget, the PV walk
//! budget); this experiment measures the hold times a victim sees next to each neighbour:
//!
//! - `alone`: the victim runs its workloads with no neighbour;
//! - `mmul`: a neighbour submits 1024x1024 (by default) matrix multiplies back to back;
//! - `pv-switch`: a neighbour in PV mode submits 2048-op batches, each op pointing one page
//!   directory entry at another full small-page table (every op re-walks a whole table).
//! - `eager-flush`: a neighbour in eager mode fills 2048 entries of its page directory (each
//!   naming a full small-page table) and flushes its TLB over and over: every flush rebuilds
//!   the whole shadow, which the host does in budgeted steps (`gpuvm::shadow_pt`, the
//!   isolation review's finding 4: 48-85 ms in one hold before).
//!
//! - `baseline`: no GPU and no device model — a plain lock timed as the host lock is
//!   ([`gpuvm::host::TimedMutex`]), taken at the `mmul` scenario's measured rate of holds and
//!   for its mean hold (busy work) by two threads that sleep between holds, beside a CPU-bound
//!   thread under the engine worker's scheduling policy, for as long as that scenario ran. Its
//!   longest hold is what the host's scheduler alone does to such holds (lock-holder
//!   preemption, a woken thread queued behind another): the floor under the other rows on the
//!   same machine.
//!
//! Each scenario is a fresh host on the simulated GF100. With the real clock (the default, what
//! `serve` and the KVM VMM run) the engines' work runs on the simulator's engine worker, beside
//! the host lock (`gpuvm_sim::Executor`); with the simulated clock it runs inline in the host's
//! calls within their work budget (the deterministic executor; the victim's waits jump the clock
//! to the GPU's next event, so the neighbour's work falls due in large pieces: the worst case
//! for the per-call bound). Hold times are wall-clock, from
//! [`gpuvm::host::LockHolds`]. Reported per scenario: holds, p50/p99 bucket bounds, the longest
//! hold, and whether every victim workload verified.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use gf100::compute::Kernel;
use gf100::mmu::{Pde, PtRef, PtSize};
use gf100::{pv, Target};
use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, Gpu, MemLocation, PushBuf};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::VirtHal;
use gpuvm::clock::{Clock, ClockKind};
use gpuvm::host::{GpuHost, HostConfig, LockHolds};
use gpuvm::phys::Bar;
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::vgpu::Vgpu;
use gpuvm_sim::{SimConfig, SimGpu, WorkerPolicy};

/// What to run.
#[derive(Debug, Clone)]
pub struct LockholdOptions {
    /// Rounds of the victim's workloads (each round: every workload once).
    pub rounds: u32,
    /// Workload size.
    pub size: u32,
    /// Matrix dimension of the `mmul` neighbour.
    pub mmul_n: u32,
    /// The clock (and with it who runs the engines: the worker with `Real`, the host's calls
    /// with `Sim`).
    pub clock: ClockKind,
    /// The engine worker's host scheduling policy (with `Real`).
    pub worker_policy: WorkerPolicy,
    /// Whether every hold reads its thread's CPU clock and schedstat (about 1-2 us a hold,
    /// which the hold times then include), so the report can say why the longest was long.
    pub thread_usage: bool,
}

impl Default for LockholdOptions {
    fn default() -> Self {
        LockholdOptions {
            rounds: 2,
            size: 64,
            mmul_n: 1024,
            clock: ClockKind::Real,
            worker_policy: WorkerPolicy::default(),
            thread_usage: false,
        }
    }
}

/// One scenario's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LockholdScenario {
    /// `alone`, `mmul`, `pv-switch`, `eager-flush` or `baseline`.
    pub name: String,
    /// Victim workloads run and verified.
    pub workloads: u32,
    /// Of those, verified.
    pub verified: u32,
    /// What the neighbour got done (kernels or PV batches).
    pub neighbour_ops: u64,
    /// Lock holds during the scenario.
    pub holds: u64,
    /// Their total, ns (the time some thread held the lock).
    pub held_ns: u64,
    /// Half the holds were at most this long (log2 bucket bound), ns.
    pub p50_bound_ns: u64,
    /// 99 % of the holds were at most this long (log2 bucket bound), ns.
    pub p99_bound_ns: u64,
    /// The longest hold, ns.
    pub max_ns: u64,
    /// Where the longest hold took the lock (the host's source file and line).
    pub max_at: Option<String>,
    /// Where the longest hold's time went for its holder (on a CPU, runnable without one,
    /// asleep), where the kernel keeps schedstat.
    pub max_usage: Option<gpuvm::host::HoldUsage>,
    /// The most CPU time any one hold took, ns (0 where the kernel keeps no schedstat): the
    /// device model's longest work under the lock.
    pub max_on_cpu_ns: u64,
    /// The longest any access (the victim's or the neighbour's) waited for the lock, ns
    /// (`LockHolds::max_wait_ns`): what an exit met. The longest hold does not bound it — a
    /// wait can span several holds and the waiter's own wake-up.
    pub max_wait_ns: u64,
    /// Wall time of the scenario, ms.
    pub wall_ms: f64,
    /// CPU time over the scenario's wall time: the whole process's (every thread: the victim's,
    /// the neighbour's, the engine worker's) and the engine worker's own, ns. Their ratio to
    /// `wall_ms` is how many CPUs the scenario kept busy — the load its holds met.
    pub cpu: crate::cpu::SpanCpu,
    /// For the baseline (no GPU, no device model): the scenario whose rate of holds, mean hold
    /// and wall time it copied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_of: Option<String>,
}

/// The report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LockholdReport {
    /// Options used.
    pub rounds: u32,
    /// Workload size.
    pub size: u32,
    /// Matrix dimension.
    pub mmul_n: u32,
    /// `real` or `sim`.
    pub clock: ClockKind,
    /// Who ran the engines' work: `worker` (beside the host lock) or `inline` (in the host's
    /// calls).
    pub engines: String,
    /// The worker's host scheduling policy asked for: `batch`, `normal` or `idle` (the
    /// baseline's CPU-bound thread asks for it too).
    pub worker_policy: String,
    /// Per scenario.
    pub scenarios: Vec<LockholdScenario>,
}

const SLICE_MIB: u64 = 128;
const RAM: u64 = 24 << 20;

struct Vm {
    vgpu: Arc<Vgpu>,
    ram: GuestMemoryMmap,
    drv: Gpu<VirtHal>,
}

fn new_vm(host: &GpuHost, clock: &Arc<dyn Clock>, name: &str, shadow: ShadowMode) -> Vm {
    let vgpu = host
        .create_vgpu(&VgpuProfile {
            name: name.into(),
            vram_mib: SLICE_MIB,
            channels: 8,
            weight: 1,
            shadow,
        })
        .expect("vGPU");
    let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap();
    vgpu.attach_guest_memory(ram.clone()).unwrap();
    let hal = VirtHal::new(vgpu.clone(), clock.clone(), ram.clone(), 0, RAM);
    let drv = Gpu::init(hal, DriverConfig::default()).expect("driver init");
    Vm { vgpu, ram, drv }
}

/// The neighbours.
#[derive(Debug, Clone, Copy)]
enum Neighbour {
    None,
    Mmul,
    PvSwitch,
    EagerFlush,
}

fn scenario(opts: &LockholdOptions, n: Neighbour) -> LockholdScenario {
    let clock = opts.clock.create();
    let gpu = Arc::new(SimGpu::new(SimConfig {
        vram_size: 1 << 30,
        clock: clock.clone(),
        worker_policy: opts.worker_policy,
        ..SimConfig::default()
    }));
    let host = GpuHost::new(gpu, HostConfig::default()).expect("host");
    // Every hold reads its thread's figures, so the report can say why the longest was long.
    host.measure_hold_thread_usage(opts.thread_usage);
    host.set_clock(clock.clone());
    let mut victim = new_vm(&host, &clock, "victim", ShadowMode::Lazy);
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let neighbour = match n {
        Neighbour::None => None,
        Neighbour::Mmul => Some(new_vm(&host, &clock, "mmul", ShadowMode::Lazy)),
        Neighbour::PvSwitch => Some(new_vm(&host, &clock, "pv", ShadowMode::Pv)),
        Neighbour::EagerFlush => Some(new_vm(&host, &clock, "eager", ShadowMode::Eager)),
    };
    let ready = Arc::new(AtomicBool::new(neighbour.is_none()));
    let worker = neighbour.map(|mut vm| {
        let (stop, ops, mmul_n, ready) = (stop.clone(), ops.clone(), opts.mmul_n, ready.clone());
        std::thread::spawn(move || {
            let flags = Flags {
                ready: &ready,
                stop: &stop,
                ops: &ops,
            };
            match n {
                Neighbour::Mmul => mmul_loop(&mut vm, mmul_n, &flags),
                Neighbour::PvSwitch => pv_loop(&mut vm, &flags),
                Neighbour::EagerFlush => eager_flush_loop(&mut vm, &flags),
                Neighbour::None => {}
            }
            // Set up or not, the victim must not wait for it any longer.
            ready.store(true, Ordering::Relaxed);
            stop.store(true, Ordering::Relaxed);
            vm
        })
    });
    // The victim starts once the neighbour is set up (or gave up), and runs its rounds and at
    // least until the neighbour has done a few of its operations (bounded).
    for _ in 0..100_000 {
        if ready.load(Ordering::Relaxed) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    host.reset_lock_hold_max();
    let before = host.lock_holds();
    let cpu0 = crate::cpu::SpanCpu::now();
    let t0 = Instant::now();
    let (mut runs, mut verified) = (0, 0);
    for round in 0..MAX_ROUNDS {
        let neighbour_done = matches!(n, Neighbour::None) || ops.load(Ordering::Relaxed) >= 3;
        if round >= opts.rounds && (neighbour_done || worker_gone(&stop)) {
            break;
        }
        for w in Workload::ALL {
            runs += 1;
            if workloads::run(&mut victim.drv, w, opts.size).is_ok_and(|r| r.verified) {
                verified += 1;
            }
        }
    }
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    let cpu = crate::cpu::SpanCpu::now().since(&cpu0);
    let holds: LockHolds = host.lock_holds().since(&before);
    stop.store(true, Ordering::Relaxed);
    if let Some(h) = worker {
        let _ = h.join();
    }
    let _ = &victim.vgpu;
    LockholdScenario {
        name: match n {
            Neighbour::None => "alone",
            Neighbour::Mmul => "mmul",
            Neighbour::PvSwitch => "pv-switch",
            Neighbour::EagerFlush => "eager-flush",
        }
        .into(),
        workloads: runs,
        verified,
        neighbour_ops: ops.load(Ordering::Relaxed),
        holds: holds.count,
        held_ns: holds.total_ns,
        p50_bound_ns: holds.quantile_bound_ns(0.5),
        p99_bound_ns: holds.quantile_bound_ns(0.99),
        max_ns: holds.max_ns,
        max_at: holds.max_at,
        max_usage: holds.max_usage,
        max_on_cpu_ns: holds.max_on_cpu_ns,
        max_wait_ns: holds.max_wait_ns,
        wall_ms,
        cpu,
        baseline_of: None,
    }
}

/// Most victim rounds a scenario runs while waiting for the neighbour.
const MAX_ROUNDS: u32 = 200;

/// Whether the neighbour stopped on its own (it sets `stop` when it ends).
fn worker_gone(stop: &AtomicBool) -> bool {
    stop.load(Ordering::Relaxed)
}

/// What the neighbour thread shares with the victim's.
struct Flags<'a> {
    /// Set up: the victim may start.
    ready: &'a AtomicBool,
    /// The victim is done (or the neighbour gave up).
    stop: &'a AtomicBool,
    /// Operations the neighbour completed.
    ops: &'a AtomicU64,
}

/// Back-to-back n x n matrix multiplies until told to stop.
fn mmul_loop(vm: &mut Vm, n: u32, f: &Flags) {
    let (stop, ops) = (f.stop, f.ops);
    let Ok(mut ch) = vm.drv.channel_new() else {
        return;
    };
    let bytes = u64::from(n) * u64::from(n) * 4;
    let mut buf = || {
        vm.drv
            .buffer_new(ch.vm_mut(), bytes, MemLocation::Vram, false)
            .ok()
    };
    let (Some(a), Some(b), Some(c)) = (buf(), buf(), buf()) else {
        return;
    };
    f.ready.store(true, Ordering::Relaxed);
    while !stop.load(Ordering::Relaxed) {
        let mut pb = PushBuf::new();
        pb.kernel(&Kernel::Mmul {
            a: a.va(),
            b: b.va(),
            c: c.va(),
            n,
        });
        let Ok(fence) = vm.drv.submit(&mut ch, &pb) else {
            return;
        };
        if vm.drv.fence_wait(&mut ch, fence).is_err() {
            return;
        }
        ops.fetch_add(1, Ordering::Relaxed);
    }
}

/// 2048-op PV batches switching one PDE between two full small-page tables, until told to stop
/// or refused.
fn pv_loop(vm: &mut Vm, f: &Flags) {
    let (stop, ops) = (f.stop, f.ops);
    let Ok(ch) = vm.drv.channel_new() else {
        return;
    };
    let mut ch = ch;
    let pd = ch.vm_mut().pd_addr();
    let slice = SLICE_MIB << 20;
    let tables = [slice - (1 << 20), slice - (512 << 10)];
    let batch_gpa = RAM - (128 << 10);
    let mut bytes = Vec::with_capacity(pv::MAX_BATCH as usize * pv::OP_SIZE as usize);
    for i in 0..pv::MAX_BATCH as usize {
        let table = tables[i % 2];
        let value = Pde {
            small: Some(PtRef {
                addr: table,
                target: Target::Vram,
                vol: false,
            }),
            large: None,
            size: PtSize::Full,
        }
        .encode();
        let op = pv::Op {
            op: pv::OP_WRITE_PDE,
            target: Target::Vram.bits(),
            table: pd,
            index: 200,
            value,
        };
        bytes.extend_from_slice(&op.to_bytes());
    }
    if vm.ram.write_slice(&bytes, GuestAddress(batch_gpa)).is_err() {
        return;
    }
    let wr =
        |vgpu: &Vgpu, off: u32, v: u32| vgpu.bar_write(Bar::Bar0, u64::from(off), &v.to_le_bytes());
    f.ready.store(true, Ordering::Relaxed);
    while !stop.load(Ordering::Relaxed) {
        wr(&vm.vgpu, pv::BATCH_LO, batch_gpa as u32);
        wr(&vm.vgpu, pv::BATCH_HI, (batch_gpa >> 32) as u32);
        wr(&vm.vgpu, pv::BATCH_COUNT, pv::MAX_BATCH);
        wr(&vm.vgpu, pv::SUBMIT, 1);
        let mut st = [0u8; 4];
        vm.vgpu.bar_read(Bar::Bar0, u64::from(pv::ERROR), &mut st);
        let err = u32::from_le_bytes(st);
        if err != pv::ERR_NONE && err != pv::ERR_BUSY {
            return;
        }
        ops.fetch_add(1, Ordering::Relaxed);
    }
}

/// Eager mode: 2048 directory entries naming two full small-page tables, then TLB flushes of
/// the whole directory back to back (each waits for a free flush slot, as a driver does).
fn eager_flush_loop(vm: &mut Vm, f: &Flags) {
    let (stop, ops) = (f.stop, f.ops);
    let Ok(mut ch) = vm.drv.channel_new() else {
        return;
    };
    let pd = ch.vm_mut().pd_addr();
    let slice = SLICE_MIB << 20;
    let tables = [slice - (1 << 20), slice - (512 << 10)];
    let wr =
        |vgpu: &Vgpu, off: u32, v: u32| vgpu.bar_write(Bar::Bar0, u64::from(off), &v.to_le_bytes());
    let rd = |vgpu: &Vgpu, off: u32| {
        let mut b = [0u8; 4];
        vgpu.bar_read(Bar::Bar0, u64::from(off), &mut b);
        u32::from_le_bytes(b)
    };
    for i in 0..2048u64 {
        let value = Pde {
            small: Some(PtRef {
                addr: tables[i as usize % 2],
                target: Target::Vram,
                vol: false,
            }),
            large: None,
            size: PtSize::Full,
        }
        .encode();
        let a = pd + 8 * (64 + i);
        wr(
            &vm.vgpu,
            gf100::pbus::PMEM,
            gf100::pbus::pmem_encode(a, Target::Vram),
        );
        let win = gf100::pbus::PRAMIN_BASE + (a & 0xffff) as u32;
        wr(&vm.vgpu, win, value as u32);
        wr(&vm.vgpu, win + 4, (value >> 32) as u32);
    }
    f.ready.store(true, Ordering::Relaxed);
    while !stop.load(Ordering::Relaxed) {
        let mut polls = 0;
        while rd(&vm.vgpu, gf100::pffb::VM_CFG) & gf100::pffb::VM_CFG_FLUSH_SLOTS_MASK == 0 {
            polls += 1;
            if polls > 1_000_000 || stop.load(Ordering::Relaxed) {
                return;
            }
        }
        wr(
            &vm.vgpu,
            gf100::pffb::TLB_FLUSH_VSPACE,
            gf100::pffb::vspace_encode(pd, Target::Vram),
        );
        wr(
            &vm.vgpu,
            gf100::pffb::TLB_FLUSH_TRIGGER,
            gf100::pffb::FLUSH_TRIGGER | gf100::pffb::FLUSH_PAGE_ALL,
        );
        ops.fetch_add(1, Ordering::Relaxed);
    }
}

/// Threads of the baseline that take its lock (the victim's and the neighbour's roles).
const BASELINE_TAKERS: u32 = 2;
/// The baseline's engine-worker thread: one block of work, ns (a matrix block).
const BASELINE_HOG_BLOCK_NS: u64 = 100_000;
/// The shortest pause the baseline's block thread takes to keep to its duty.
const BASELINE_MIN_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// The baseline's threads, in words (for reports).
pub fn baseline_shape() -> String {
    format!(
        "no GPU and no device model: a plain lock timed the same way, for as long as the mmul \
         row ran, taken by {BASELINE_TAKERS} threads at the mmul row's rate of holds and for its \
         mean hold (busy work), beside a thread computing {} us blocks under the worker's \
         policy; the takers work between holds and the block thread pauses between blocks so \
         that each role uses the CPU the row's threads used (the engine worker's share, and the \
         rest of the process's) — what the host's scheduler alone does to such holds under the \
         row's load",
        BASELINE_HOG_BLOCK_NS / 1000
    )
}

/// Busy work for `ns` of wall time.
fn work_for(ns: u64) {
    let t = Instant::now();
    let mut x = 1u64;
    while t.elapsed().as_nanos() < u128::from(ns) {
        for _ in 0..64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

/// How the baseline's threads copy a scenario's load.
#[derive(Debug, Clone, Copy, PartialEq)]
struct BaselineLoad {
    /// The block thread's duty (0-1]: the engine worker's CPUs over the scenario.
    hog_duty: f64,
    /// Each taker's share of the time between its holds spent in busy work (0-1): the rest of
    /// the process's CPU (the victim's and the neighbour's threads), less the holds', over the
    /// takers.
    taker_duty: f64,
}

impl BaselineLoad {
    /// The load of `like`; without a CPU reading (no `/proc`), a block thread busy all along
    /// and takers that only sleep between holds.
    fn of(like: &LockholdScenario) -> BaselineLoad {
        let wall_ns = like.wall_ms * 1e6;
        if like.cpu.process_ns == 0 || wall_ns <= 0.0 {
            return BaselineLoad {
                hog_duty: 1.0,
                taker_duty: 0.0,
            };
        }
        let worker = like.cpu.engine_worker_ns as f64 / wall_ns;
        let others = (like
            .cpu
            .process_ns
            .saturating_sub(like.cpu.engine_worker_ns) as f64
            - like.held_ns as f64)
            / wall_ns;
        BaselineLoad {
            hog_duty: worker.clamp(0.05, 1.0),
            taker_duty: (others / f64::from(BASELINE_TAKERS)).clamp(0.0, 1.0),
        }
    }
}

/// The `baseline` scenario: a plain timed lock, taken at the rate and for the mean length of
/// `like`'s holds, under `like`'s CPU load, for as long as `like` ran (see the module's doc).
fn baseline(opts: &LockholdOptions, like: &LockholdScenario) -> LockholdScenario {
    let lock = Arc::new(gpuvm::host::TimedMutex::new(0u64, opts.thread_usage));
    let stop = Arc::new(AtomicBool::new(false));
    let mean_hold_ns = like.held_ns / like.holds.max(1);
    // Each taker's share of the holds, spread evenly over the run.
    let gap_ns = (like.wall_ms * 1e6 * f64::from(BASELINE_TAKERS) / like.holds.max(1) as f64)
        .max(mean_hold_ns as f64) as u64
        - mean_hold_ns;
    let load = BaselineLoad::of(like);
    let busy_ns = (gap_ns as f64 * load.taker_duty) as u64;
    let policy = opts.worker_policy;
    let hog = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // Refused: the thread runs under the default policy, as the worker would.
            let _ = policy.apply_to_this_thread();
            // Blocks back to back, pausing whenever the work done is more than a pause ahead
            // of its duty: a sleep lasts a timer slack longer than asked (~60 us here), so
            // pausing after every block would keep it well under its share.
            let (t0, mut busy_ns) = (Instant::now(), 0u64);
            while !stop.load(Ordering::Relaxed) {
                work_for(BASELINE_HOG_BLOCK_NS);
                busy_ns += BASELINE_HOG_BLOCK_NS;
                let due = std::time::Duration::from_nanos((busy_ns as f64 / load.hog_duty) as u64);
                let ahead = due.saturating_sub(t0.elapsed());
                if ahead >= BASELINE_MIN_PAUSE {
                    std::thread::sleep(ahead);
                }
            }
        })
    };
    let takers: Vec<_> = (0..BASELINE_TAKERS)
        .map(|_| {
            let (lock, stop) = (lock.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    work_for(busy_ns);
                    std::thread::sleep(std::time::Duration::from_nanos(gap_ns - busy_ns));
                    lock.with(|n| {
                        work_for(mean_hold_ns);
                        *n += 1;
                    });
                }
            })
        })
        .collect();
    let cpu0 = crate::cpu::SpanCpu::now();
    let t0 = Instant::now();
    std::thread::sleep(std::time::Duration::from_secs_f64(like.wall_ms / 1e3));
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    let cpu = crate::cpu::SpanCpu::now().since(&cpu0);
    let holds = lock.holds();
    stop.store(true, Ordering::Relaxed);
    let _ = hog.join();
    for t in takers {
        let _ = t.join();
    }
    LockholdScenario {
        name: "baseline".into(),
        workloads: 0,
        verified: 0,
        neighbour_ops: 0,
        holds: holds.count,
        held_ns: holds.total_ns,
        p50_bound_ns: holds.quantile_bound_ns(0.5),
        p99_bound_ns: holds.quantile_bound_ns(0.99),
        max_ns: holds.max_ns,
        max_at: None,
        max_usage: holds.max_usage,
        max_on_cpu_ns: holds.max_on_cpu_ns,
        max_wait_ns: holds.max_wait_ns,
        wall_ms,
        cpu,
        baseline_of: Some(like.name.clone()),
    }
}

/// Runs the four scenarios, and the baseline like the `mmul` scenario.
pub fn run_lockhold(opts: &LockholdOptions) -> LockholdReport {
    LockholdReport {
        rounds: opts.rounds,
        size: opts.size,
        mmul_n: opts.mmul_n,
        clock: opts.clock,
        engines: match opts.clock {
            ClockKind::Real => "worker",
            ClockKind::Sim => "inline",
        }
        .into(),
        worker_policy: opts.worker_policy.name().into(),
        scenarios: {
            let mut v: Vec<LockholdScenario> = [
                Neighbour::None,
                Neighbour::Mmul,
                Neighbour::PvSwitch,
                Neighbour::EagerFlush,
            ]
            .into_iter()
            .map(|n| scenario(opts, n))
            .collect();
            let floor = v
                .iter()
                .find(|s| s.name == "mmul")
                .map(|m| baseline(opts, m));
            v.extend(floor);
            v
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `mmul` row with these holds, wall time and CPU use (the rest zero).
    fn mmul_row(
        holds: u64,
        held_ns: u64,
        wall_ms: f64,
        cpu: crate::cpu::SpanCpu,
    ) -> LockholdScenario {
        LockholdScenario {
            name: "mmul".into(),
            workloads: 0,
            verified: 0,
            neighbour_ops: 0,
            holds,
            held_ns,
            p50_bound_ns: 0,
            p99_bound_ns: 0,
            max_ns: 0,
            max_at: None,
            max_usage: None,
            max_on_cpu_ns: 0,
            max_wait_ns: 0,
            wall_ms,
            cpu,
            baseline_of: None,
        }
    }

    #[test]
    fn the_baseline_takes_a_plain_lock_like_the_scenario_it_copies() {
        let like = mmul_row(40, 40 * 20_000, 40.0, Default::default());
        let b = baseline(&LockholdOptions::default(), &like);
        assert_eq!(b.name, "baseline");
        assert_eq!(b.baseline_of.as_deref(), Some("mmul"));
        assert!(
            b.wall_ms >= like.wall_ms,
            "it runs as long as the scenario did"
        );
        assert!(b.holds > 0 && b.holds <= 4 * like.holds, "{b:?}");
        // Every hold does the scenario's mean hold of busy work.
        assert!(b.max_ns >= 20_000 && b.held_ns >= b.holds * 20_000, "{b:?}");
        assert!(b.max_at.is_none() && b.workloads == 0);
    }

    #[test]
    fn the_baseline_copies_each_roles_cpu_use() {
        let cpu = crate::cpu::SpanCpu {
            process_ns: 1_710_000_000,
            engine_worker_ns: 900_000_000,
        };
        let mut like = mmul_row(100, 10_000_000, 1000.0, cpu);
        // The worker kept 0.9 of a CPU busy; the other threads 0.81, of which 0.01 holds: each
        // of the two takers works 0.4 of the time between its holds.
        let l = BaselineLoad::of(&like);
        assert!((l.hog_duty - 0.9).abs() < 1e-9, "{l:?}");
        assert!((l.taker_duty - 0.4).abs() < 1e-9, "{l:?}");
        // More than a CPU per taker, or a worker busier than a CPU, is capped; no reading (no
        // `/proc`) keeps a block thread busy all along beside takers that only sleep.
        like.cpu.process_ns = 9_000_000_000;
        like.cpu.engine_worker_ns = 1_500_000_000;
        assert_eq!(
            BaselineLoad::of(&like),
            BaselineLoad {
                hog_duty: 1.0,
                taker_duty: 1.0
            }
        );
        like.cpu = Default::default();
        assert_eq!(
            BaselineLoad::of(&like),
            BaselineLoad {
                hog_duty: 1.0,
                taker_duty: 0.0
            }
        );
    }
}
