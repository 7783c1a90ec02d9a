//! `gpuvm exp isolation --kvm`: the performance-isolation experiment (GPUvm ATC'14, after Gdev
//! ATC'12) with real KVM guests on the real clock.
//!
//! The mix is the in-process one (`gpuvm_harness::exp_isolation::plan`): VMs with short `loop`
//! kernels (0.5 ms of modeled GPU time, one outstanding) against VMs with long ones (10 ms, two
//! outstanding), weights 1 (vm2 weight 2 with 4 or more VMs), the long VMs starting later. Each
//! VM is a KVM guest in `MODE_STREAM` (`guest-bin/src/stream.rs`): driver bring-up, a channel,
//! the start gate (all VMs start together although bring-up takes a different time in each),
//! its start delay, then kernels submitted without blocking until `duration` after the gate. The
//! simulated GPU runs on the real clock, so a 10 ms kernel takes 10 ms.
//!
//! Measured from the VMM side: the sampler (`setup::Sampler`, every 2 ms) records each VM's GPU
//! time as the simulator's busy time of the VM's physical channels. Shares are computed over the
//! interval in which every VM submits (the last start to the end), with the in-process
//! definitions (target = weight / sum of weights, achieved = its GPU time over all VMs' GPU time,
//! error = |achieved - target|, Jain's index, utilisation), and the report has the in-process
//! shape ([`IsolationReport`]) plus a `kvm` section per policy.

use std::time::Duration;

use gpuvm::clock::ClockKind;
use gpuvm::sched::Policy;
use gpuvm_harness::exp_isolation::{
    plan, AccountingCheck, IsolationOptions, IsolationReport, PolicyResult, Series, VmPlan,
    VmResult,
};
use serde::Serialize;

use crate::kvm::setup::{Sample, StreamPlan, VmSetup};
use crate::kvm::{run_kvm, KvmOptions, KvmReport};

/// How often the sampler samples, and services the host.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(2);

/// KVM facts of one policy's run.
#[derive(Debug, Clone, Serialize)]
pub struct KvmPolicyInfo {
    /// The policy.
    pub policy: Policy,
    /// Every VM's stream completed and its last kernel's result verified.
    pub verified: bool,
    /// Per VM: kernels completed.
    pub kernels: Vec<u64>,
    /// Per VM: MMIO exits (reads + writes, coalesced included) of the whole run.
    pub mmio_exits: Vec<u64>,
    /// Per VM: MMIO exits while it submitted (its stream, from its first submission until it
    /// stopped submitting): over `kernels`, what one kernel costs the guest in exits.
    pub stream_exits: Vec<u64>,
    /// Per VM: why it was stopped, if it was.
    pub stopped: Vec<Option<String>>,
    /// Per VM: the guest's last console line (its stream's summary or error).
    pub console: Vec<String>,
    /// The gate opened this long after the VMs started (driver bring-up), ns.
    pub bring_up_ns: u64,
    /// Samples taken in the measured run.
    pub samples: usize,
}

/// The report: the in-process shape plus KVM facts.
#[derive(Debug, Clone, Serialize)]
pub struct KvmIsolationReport {
    /// "kvm".
    pub backend: &'static str,
    /// As in-process.
    #[serde(flatten)]
    pub report: IsolationReport,
    /// Per policy.
    pub kvm: Vec<KvmPolicyInfo>,
}

impl KvmIsolationReport {
    /// Every VM verified under every policy.
    pub fn all_verified(&self) -> bool {
        self.kvm.iter().all(|k| k.verified)
    }
}

/// Runs the experiment: one KVM run per policy. `progress(policy index)` is called as each
/// policy starts.
pub fn run(
    opts: &IsolationOptions,
    size: u32,
    progress: &mut dyn FnMut(usize),
) -> anyhow::Result<KvmIsolationReport> {
    if !(2..=16).contains(&opts.vms) {
        anyhow::bail!("vms = {} must be 2..=16", opts.vms);
    }
    if opts.duration_ns < 6 * opts.window_ns || opts.window_ns == 0 {
        anyhow::bail!("the duration must be at least six sampling windows");
    }
    let plans = plan(opts);
    let mut policies = Vec::new();
    let mut kvm = Vec::new();
    for (i, &policy) in opts.policies.iter().enumerate() {
        progress(i);
        let ko = KvmOptions {
            vms: opts.vms,
            size,
            workloads: Vec::new(),
            echo_console: false,
            sched: Some(policy),
            sched_params: opts.params.clone(),
            setups: plans
                .iter()
                .map(|p| VmSetup {
                    weight: p.weight,
                    stream: Some(StreamPlan {
                        iterations: p.iterations,
                        outstanding: p.outstanding as u32,
                        start_ms: (p.start_ns / 1_000_000) as u32,
                        run_ms: (opts.duration_ns / 1_000_000) as u32,
                        count: 0,
                    }),
                    ..VmSetup::default()
                })
                .collect(),
            sample_every: Some(SAMPLE_EVERY),
            timeout: Duration::from_nanos(opts.duration_ns) + Duration::from_secs(300),
            ..KvmOptions::default()
        };
        let r = run_kvm(&ko)?;
        let (p, k) = summarise(policy, &plans, opts, &r)?;
        policies.push(p);
        kvm.push(k);
    }
    Ok(KvmIsolationReport {
        backend: "kvm",
        report: IsolationReport {
            vms: opts.vms,
            duration_ns: opts.duration_ns,
            clock: ClockKind::Real,
            window_ns: opts.window_ns,
            params: opts.params.clone(),
            policies,
            adversary: None,
        },
        kvm,
    })
}

/// The last sample at or before `t`, else the first.
fn at(samples: &[Sample], t: u64) -> &Sample {
    samples
        .iter()
        .rev()
        .find(|s| s.t_ns <= t)
        .unwrap_or(&samples[0])
}

fn summarise(
    policy: Policy,
    plans: &[VmPlan],
    opts: &IsolationOptions,
    r: &KvmReport,
) -> anyhow::Result<(PolicyResult, KvmPolicyInfo)> {
    let n = plans.len();
    let info = KvmPolicyInfo {
        policy,
        verified: r.all_verified(),
        kernels: r.vms.iter().map(|v| v.kvm.kernels).collect(),
        mmio_exits: r
            .vms
            .iter()
            .map(|v| v.kvm.exits.mmio_reads + v.kvm.exits.mmio_writes)
            .collect(),
        stream_exits: r
            .vms
            .iter()
            .map(|v| {
                v.workloads
                    .first()
                    .map_or(0, |w| w.mmio_reads + w.mmio_writes)
            })
            .collect(),
        stopped: r.vms.iter().map(|v| v.kvm.stopped.clone()).collect(),
        console: r
            .vms
            .iter()
            .map(|v| {
                let c = &v.kvm.console;
                c.iter()
                    .rev()
                    .find(|l| l.starts_with("stream:"))
                    .or(c.last())
                    .cloned()
                    .unwrap_or_default()
            })
            .collect(),
        bring_up_ns: r.gate_open_ns.unwrap_or(0),
        samples: r.samples.len(),
    };
    let (Some(t0), false) = (r.gate_open_ns, r.samples.is_empty()) else {
        anyhow::bail!(
            "{policy}: the VMs never all reached the start gate: {:?}",
            info.stopped
        );
    };
    let end = t0 + opts.duration_ns;
    let from = plans.iter().map(|p| p.start_ns).max().unwrap_or(0);
    let first = at(&r.samples, t0 + from);
    let last = at(&r.samples, end);
    let gpu: Vec<u64> = (0..n)
        .map(|i| last.channel_busy_ns[i].saturating_sub(first.channel_busy_ns[i]))
        .collect();
    let total: u64 = gpu.iter().sum();
    let span = last.t_ns.saturating_sub(first.t_ns).max(1);
    let wsum: u64 = plans.iter().map(|p| u64::from(p.weight)).sum();
    let start = at(&r.samples, t0);
    let vms: Vec<VmResult> = plans
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let target = f64::from(p.weight) / wsum as f64;
            let achieved = if total == 0 {
                0.0
            } else {
                gpu[i] as f64 / total as f64
            };
            VmResult {
                plan: p.clone(),
                target_share: target,
                achieved_share: achieved,
                error: (achieved - target).abs(),
                gpu_ns: gpu[i],
                total_gpu_ns: last.channel_busy_ns[i].saturating_sub(start.channel_busy_ns[i]),
                kernels: r.vms[i].kvm.kernels,
                // --cap is not applied to KVM runs (docs/serve.md).
                cap: None,
                busy_fraction: gpu[i] as f64 / span as f64,
                // Waits, preemptions and resumes are measured in-process only.
                worst_wait_ns: 0,
                worst_wait_all_ns: 0,
                preemptions: 0,
                resumes: 0,
                watchdog_kills: 0,
            }
        })
        .collect();
    let mean_error = vms.iter().map(|v| v.error).sum::<f64>() / n as f64;
    let max_error = vms.iter().map(|v| v.error).fold(0.0, f64::max);
    let x: Vec<f64> = vms
        .iter()
        .map(|v| v.achieved_share / v.target_share)
        .collect();
    let (sx, sx2) = (x.iter().sum::<f64>(), x.iter().map(|v| v * v).sum::<f64>());
    let jain_index = if sx2 == 0.0 {
        0.0
    } else {
        sx * sx / (n as f64 * sx2)
    };
    // Windows from the gate to the end.
    let mut series = Series {
        t_ns: Vec::new(),
        shares: vec![Vec::new(); n],
    };
    let mut prev = start;
    let mut t = opts.window_ns;
    while t <= opts.duration_ns {
        let s = at(&r.samples, t0 + t);
        let dt = s.t_ns.saturating_sub(prev.t_ns).max(1) as f64;
        series.t_ns.push(t);
        for (i, sh) in series.shares.iter_mut().enumerate() {
            sh.push(s.channel_busy_ns[i].saturating_sub(prev.channel_busy_ns[i]) as f64 / dt);
        }
        prev = s;
        t += opts.window_ns;
    }
    // From the gate until the VMs drained (the last sample, after every VM ended).
    let done = r.samples.last().expect("samples");
    let sum = |s: &Sample, f: fn(&Sample) -> &Vec<u64>| f(s).iter().sum::<u64>();
    let accounting = AccountingCheck {
        accounted_ns: sum(done, |s| &s.accounted_ns)
            .saturating_sub(sum(start, |s| &s.accounted_ns)),
        channel_busy_ns: sum(done, |s| &s.channel_busy_ns)
            .saturating_sub(sum(start, |s| &s.channel_busy_ns)),
        gpu_busy_ns: done.gpu_busy_ns.saturating_sub(start.gpu_busy_ns),
    };
    let sched = &r.host.sched;
    Ok((
        PolicyResult {
            policy,
            vms,
            measured_from_ns: first.t_ns.saturating_sub(t0),
            mean_error,
            max_error,
            jain_index,
            utilization: total as f64 / span as f64,
            waits: sched.waits,
            waits_taken: sched.waits_taken,
            demotions: sched.demotions,
            dispatched: r.host.dispatched,
            accounting,
            series,
            timeslice_ns: 0,
        },
        info,
    ))
}
