//! What differs between the VMs of one KVM run, and what their threads share.
//!
//! * [`VmSetup`]: per-VM workloads, weight (the scheduler's share), fence mode and, for the
//!   performance-isolation experiment, a stream of `loop` kernels ([`StreamPlan`], the guest's
//!   `MODE_STREAM`).
//! * [`Gate`]: the start gate behind `abi::PORT_GATE`, a barrier across VMs so that streams (and
//!   the measured part of `gpuvm exp scale --kvm`) start together although driver bring-up
//!   takes a different time in each VM. A VM that ends without reaching the gate leaves it, so
//!   the others never wait for a dead VM.
//! * [`Sampler`]: a thread that every few milliseconds services the host (the simulated GPU has
//!   no interrupt thread of its own: completions are otherwise only seen at the next guest
//!   access) and samples each VM's GPU busy time from the VMM side — the simulator's busy time
//!   of the VM's physical channels and the scheduler's accounting.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use gpuvm::host::GpuHost;
use gpuvm::vgpu::Vgpu;
use gpuvm_guest::workloads::Workload;
use gpuvm_sim::SimGpu;
use serde::Serialize;

/// A stream of `loop` kernels (the guest's `MODE_STREAM`), or the long kernel a hostile
/// stop-mid-submission guest leaves in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StreamPlan {
    /// Loop iterations per kernel.
    pub iterations: u64,
    /// Kernels kept outstanding.
    pub outstanding: u32,
    /// Delay after the start gate before the first submission, ms.
    pub start_ms: u32,
    /// Submit until this long after the gate, ms (0: no time limit).
    pub run_ms: u32,
    /// Submit at most this many kernels (0: no count limit).
    pub count: u32,
}

/// One VM's differences from the run's defaults.
#[derive(Debug, Clone, Default)]
pub struct VmSetup {
    /// Its workloads (`None`: the run's list).
    pub workloads: Option<Vec<Workload>>,
    /// Scheduler weight (0 counts as 1).
    pub weight: u32,
    /// Wait for fences by interrupt (`None`: the run's `fence_irq`).
    pub fence_irq: Option<bool>,
    /// Run a kernel stream instead of the workloads (`MODE_STREAM`), or the kernel of a
    /// stop-mid-submission mode.
    pub stream: Option<StreamPlan>,
    /// Wait at the start gate after the first workload.
    pub gate: bool,
    /// Stop it after this long (`None`: the run's timeout).
    pub timeout: Option<Duration>,
    /// Stop it when it has not exited for this long (a wedged guest; `None`: never).
    pub stall: Option<Duration>,
}

/// The start gate (see the module doc).
#[derive(Debug)]
pub struct Gate {
    expected: usize,
    arrived: AtomicUsize,
    opened: OnceLock<Instant>,
}

impl Gate {
    /// A gate for `expected` VMs.
    pub fn new(expected: usize) -> Gate {
        Gate {
            expected,
            arrived: AtomicUsize::new(0),
            opened: OnceLock::new(),
        }
    }

    /// A VM reads the gate port: the first read registers it; true once all are there.
    pub fn poll(&self, registered: &mut bool) -> bool {
        if !*registered {
            *registered = true;
            self.arrived.fetch_add(1, Ordering::SeqCst);
        }
        self.is_open()
    }

    /// A VM that will never read the gate again (it ended) stops holding the others.
    pub fn leave(&self, registered: &mut bool) {
        self.poll(registered);
    }

    /// True once every VM arrived (or left).
    pub fn is_open(&self) -> bool {
        if self.arrived.load(Ordering::SeqCst) >= self.expected {
            self.opened.get_or_init(Instant::now);
            true
        } else {
            false
        }
    }

    /// When it opened.
    pub fn opened(&self) -> Option<Instant> {
        self.opened.get().copied()
    }
}

/// One sample of every VM's GPU time.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Time since the run started, ns.
    pub t_ns: u64,
    /// Per VM: the simulator's busy time of its physical channels, ns.
    pub channel_busy_ns: Vec<u64>,
    /// Per VM: the GPU time the scheduler charged it, ns.
    pub accounted_ns: Vec<u64>,
    /// The simulated GPU's total busy time, ns.
    pub gpu_busy_ns: u64,
}

/// Samples GPU time per VM and services the host (see the module doc).
pub struct Sampler {
    /// The samples so far.
    pub samples: Mutex<Vec<Sample>>,
    stop: AtomicBool,
}

impl Sampler {
    /// A sampler with no samples.
    pub fn new() -> Sampler {
        Sampler {
            samples: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        }
    }

    /// Takes one sample now.
    pub fn sample(&self, start: Instant, host: &GpuHost, sim: &SimGpu, vgpus: &[Arc<Vgpu>]) {
        host.poll();
        let sched = host.sched_stats();
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let prev = samples.last().cloned();
        let accounted = vgpus
            .iter()
            .enumerate()
            .map(|(i, v)| {
                sched
                    .vms
                    .iter()
                    .find(|s| s.vm == v.id())
                    .map(|s| s.busy_ns)
                    // A destroyed VM keeps what it was charged.
                    .unwrap_or_else(|| prev.as_ref().map_or(0, |p| p.accounted_ns[i]))
            })
            .collect();
        samples.push(Sample {
            t_ns: start.elapsed().as_nanos() as u64,
            channel_busy_ns: vgpus
                .iter()
                .map(|v| {
                    v.phys_channels()
                        .filter_map(|c| sim.channel_busy_ns(c))
                        .sum()
                })
                .collect(),
            accounted_ns: accounted,
            gpu_busy_ns: host.phys().stats().busy_ns,
        });
    }

    /// Samples every `every` until [`Sampler::stop`].
    pub fn run(
        &self,
        every: Duration,
        start: Instant,
        host: &GpuHost,
        sim: &SimGpu,
        vgpus: &[Arc<Vgpu>],
    ) {
        while !self.stop.load(Ordering::SeqCst) {
            self.sample(start, host, sim, vgpus);
            std::thread::sleep(every);
        }
    }

    /// Ends [`Sampler::run`].
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// The samples taken.
    pub fn take(&self) -> Vec<Sample> {
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler::new()
    }
}
