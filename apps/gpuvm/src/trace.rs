//! `gpuvm trace`: replay recorded MMIO traces against a fresh device model (`replay`) and run
//! fault-injection campaigns on them (`inject`). Recording is `gpuvm run --record DIR`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use gpuvm_harness::VirtOptions;
use gpuvm_trace::inject::{self, CampaignOptions, FaultClass};
use gpuvm_trace::{format, replay, Session};

use crate::table::Table;

/// Options of `gpuvm trace`.
#[derive(Args, Debug)]
pub struct TraceArgs {
    #[command(subcommand)]
    command: TraceCommand,
}

#[derive(Subcommand, Debug)]
enum TraceCommand {
    /// Replay traces (all VMs of one recording, or a subset) against a fresh GpuHost on the
    /// simulated clock. With `--check` every read must return what was recorded; the first
    /// divergences are printed with line, register and both values (exit status 1).
    Replay(ReplayArgs),
    /// Fault injection: replay mutated copies of one VM's trace next to the other VMs' clean
    /// traces and check the invariants after each injection (no host panic, other VMs'
    /// memory untouched, their work completes, the violation counted, nothing leaks).
    Inject(InjectArgs),
}

/// Options of `gpuvm trace replay`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Trace files (`.mmiotrace`, or `.gz`).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Compare every read with the recording.
    #[arg(long)]
    check: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Options of `gpuvm trace inject`.
#[derive(Args, Debug)]
pub struct InjectArgs {
    /// Trace files of one recording session (at least two VMs: one is made guilty per
    /// injection, in turn; the others stay innocent).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Fault class (repeatable) or `all`.
    #[arg(long = "fault", default_value = "all")]
    faults: Vec<String>,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Injections per class.
    #[arg(long, default_value_t = 10)]
    count: u32,
    /// Worker threads (0: one per CPU).
    #[arg(long, default_value_t = 0)]
    jobs: usize,
    /// Print one JSON object (per class: injected, contained, host_panics, isolation_breaches,
    /// lost_completions, leaks).
    #[arg(long)]
    json: bool,
}

/// A recording session for `gpuvm run --record`.
pub fn session_for(opts: &VirtOptions, workloads: &[String]) -> Arc<Session> {
    let note = format!(
        "workloads={};size={};fence={:?};vms={}",
        if workloads.is_empty() {
            "all".to_string()
        } else {
            workloads.join(",")
        },
        opts.size,
        opts.fence_mode,
        opts.vms
    );
    Session::new(opts.vms as u32, opts.phys_vram, &opts.host, &note)
}

fn load(files: &[PathBuf]) -> anyhow::Result<Vec<gpuvm_trace::Trace>> {
    files
        .iter()
        .map(|f| format::read_file(f).map_err(anyhow::Error::msg))
        .collect()
}

/// Runs the command; `Ok(false)` on a divergence or a failed invariant.
pub fn run(args: &TraceArgs) -> anyhow::Result<bool> {
    match &args.command {
        TraceCommand::Replay(a) => run_replay(a),
        TraceCommand::Inject(a) => run_inject(a),
    }
}

fn run_replay(a: &ReplayArgs) -> anyhow::Result<bool> {
    let traces = load(&a.files)?;
    let n = traces.len();
    let whole = traces.first().is_some_and(|t| {
        t.header.vms as usize == n && traces.iter().all(|x| x.header.session == t.header.session)
    });
    let r = replay::replay(traces, a.check).map_err(anyhow::Error::msg)?;
    let ok = r.total_divergences == 0 && r.leaks.is_empty();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(ok);
    }
    println!(
        "gpuvm trace replay: {n} trace(s){}, {}",
        if whole {
            " (a whole session: exact)"
        } else {
            " (a subset of a session: synchronized)"
        },
        if a.check { "checked" } else { "not checked" }
    );
    let mut t = Table::new([
        "vm",
        "events",
        "reads",
        "mismatches",
        "synced",
        "ahead",
        "loose",
        "violations",
        "completions",
    ]);
    for v in &r.vms {
        let s = v.stats.as_ref();
        t.row([
            format!("vm{}", v.vm),
            v.events.to_string(),
            v.reads.to_string(),
            v.mismatches.to_string(),
            v.synced.to_string(),
            v.ahead.to_string(),
            v.loose.to_string(),
            s.map_or("-".into(), |s| s.violations.total.to_string()),
            s.map_or("-".into(), |s| s.completions.to_string()),
        ]);
    }
    print!("{}", t.render());
    for d in &r.divergences {
        println!("DIVERGENCE {d}");
    }
    if r.total_divergences as usize > r.divergences.len() {
        println!("... {} divergences in total", r.total_divergences);
    }
    for l in &r.leaks {
        println!("LEAK {l}");
    }
    println!(
        "{}",
        if ok {
            if a.check {
                "replay reproduced the recording"
            } else {
                "replay done"
            }
        } else {
            "replay DIVERGED"
        }
    );
    Ok(ok)
}

fn run_inject(a: &InjectArgs) -> anyhow::Result<bool> {
    let traces = load(&a.files)?;
    if traces.len() < 2 {
        bail!("fault injection needs the traces of at least two VMs of one recording");
    }
    let classes = if a.faults.iter().any(|f| f == "all") {
        FaultClass::ALL.to_vec()
    } else {
        a.faults
            .iter()
            .map(|f| f.parse::<FaultClass>().map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    let opts = CampaignOptions {
        classes,
        seed: a.seed,
        count: a.count,
        jobs: a.jobs,
    };
    let summary = inject::campaign(&traces, &opts)
        .map_err(anyhow::Error::msg)
        .context("fault injection")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary.json())?);
    } else {
        print!("{}", summary.table());
        for f in summary.failures.iter().take(20) {
            println!("FAILED {f}");
        }
    }
    Ok(summary.all_contained())
}
