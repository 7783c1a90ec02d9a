//! `gpuvm exp` and `gpuvm soak`: the commands of the experiments of GPUvm (ATC'14) that the
//! product reproduces, one file per experiment named after its subcommand (`gpuvm exp X` is
//! `exp/X.rs`): its arguments, tables and plots. What an experiment measures in-process lives
//! in `gpuvm_harness` (`exp_X`, `soak`); with `--kvm` it runs on the KVM VMM (`crate::kvm`).
//! Numbers and how to read them: `docs/experiments.md`.

use clap::{Args, Subcommand};

pub mod isolation;
pub mod isolation_kvm;
pub mod lockhold;
pub mod migrate;
pub mod overhead;
pub mod plot;
pub mod scale;
pub mod soak;
pub mod traps;

/// Options of `gpuvm exp`.
#[derive(Args, Debug)]
pub struct ExpArgs {
    #[command(subcommand)]
    which: ExpCommand,
}

#[derive(Subcommand, Debug)]
enum ExpCommand {
    /// Performance isolation: VMs with short kernels against VMs with long kernels, under
    /// FIFO, CREDIT and BAND (GPUvm ATC'14, Gdev ATC'12).
    ///
    /// Every VM runs the real guest driver through its own virtual GPU and submits `loop`
    /// kernels without blocking: short ones (0.5 ms of modeled GPU time, one at a time, as
    /// Gdev's LUD) or long ones (10 ms, two outstanding, as heartwall). With 2 VMs, vm0 is
    /// short and vm1 long and starts at 1/6 of the run; with 4 or 8 VMs even VMs are short,
    /// odd ones long, starts are staggered over the first sixth, and vm2 has weight 2. Shares
    /// are measured over the time all VMs run: target = weight / sum of weights, achieved =
    /// the VM's GPU time over all VMs' GPU time. The table shows per VM the target, achieved
    /// share and error, and per policy the mean and largest error, Jain's index and the GPU's
    /// utilisation. `--json` prints one object with a `policies` array (per policy: `vms`,
    /// `mean_error`, `max_error`, `jain_index`, `utilization`, the `series` of shares per
    /// window and an accounting cross-check); `--svg FILE` plots each VM's share over time,
    /// one panel per policy. With `--clock sim` (the default) the output is identical from
    /// run to run.
    Isolation(isolation::IsolationArgs),
    /// Overhead by scheme (GPUvm's overhead figure): every workload under native, fv-naive
    /// (eager shadowing), fv-lazy, fv (incremental shadowing) and pv; wall time and modeled
    /// time (wall + exits x exit cost) relative to native, exits and shadow work per workload.
    /// In-process by default (wall time is host CPU time; no real exits); `--kvm` runs
    /// native (GPU passed through), fv-naive, fv (BAR remap + lazy) and pv in real KVM guests,
    /// side by side. `--json` prints a `results` array (`workload`,
    /// `scheme`, `wall_ns`, `relative_to_native`, `modeled_ns`, `exits`, `shadow`,
    /// `verified`, ...); `--svg FILE` writes grouped bars.
    Overhead(overhead::OverheadArgs),
    /// Scale (GPUvm's scale figure): the same workload in 1, 2, 4, ... VMs at once; per VM
    /// count the per-VM and aggregate time, GPU utilisation, exits, and whether everything
    /// verified. `--json` prints a `points` array; `--svg FILE` plots time against VMs.
    Scale(scale::ScaleArgs),
    /// Host-lock hold times next to hostile neighbours (the isolation review's findings 8 and
    /// 9): a victim runs its workloads alone, next to back-to-back 1024x1024 matrix
    /// multiplies, and next to 2048-op para-virtual page-directory switch batches; per
    /// scenario the number of lock holds, p50/p99 bucket bounds and the longest hold
    /// (wall-clock). `--json` prints a `scenarios` array; `--svg FILE` draws the bars.
    Lockhold(lockhold::LockholdArgs),
    /// Trapped-access throughput against VMs (the engines-and-locks issue): per VM count,
    /// threads hammer their VM's registers (reads, and one doorbell in 8) for a while, first
    /// with the GPU idle, then with every VM's driver running work; accesses per second, the
    /// speedup over one VM and the linear ideal, p50/p99/max latency, the share done on the
    /// host's fast path. `--json` prints a `points` array; `--svg FILE` plots throughput
    /// against VMs.
    Traps(traps::TrapsArgs),
    /// Live migration of a vGPU (docs/migration.md): N VMs run their workloads on one
    /// simulated GPU, M on another; mid-stream one VM is moved live to the second GPU (VRAM
    /// pre-copy rounds while it runs, a short stop-and-copy) over a Unix socket, the
    /// destination restoring while the source writes. Its workloads verify on both sides; the
    /// table shows rounds, pages and bytes per round, total time, downtime and every VM's
    /// results. Several `--slice-mib` values make it a downtime study (with `--touch-pct` the
    /// moved VM's memcpy buffer grows with its slice). `--json` prints a `points` array;
    /// `--out FILE` plots the moved VM's progress (and, for several sizes, time against size).
    Migrate(migrate::MigrateArgs),
}

/// Runs `gpuvm exp ...`.
pub fn run(args: &ExpArgs) -> anyhow::Result<bool> {
    match &args.which {
        ExpCommand::Isolation(a) => isolation::run(a),
        ExpCommand::Overhead(a) => overhead::run(a),
        ExpCommand::Scale(a) => scale::run(a),
        ExpCommand::Lockhold(a) => lockhold::run(a),
        ExpCommand::Traps(a) => traps::run(a),
        ExpCommand::Migrate(a) => migrate::run(a),
    }
}

/// Workload names (or `all`) to workloads.
pub(crate) fn workload_list(
    names: &[String],
) -> anyhow::Result<Vec<gpuvm_guest::workloads::Workload>> {
    use gpuvm_guest::workloads::Workload;
    if names.is_empty() || names.iter().any(|n| n == "all") {
        return Ok(Workload::ALL.to_vec());
    }
    names
        .iter()
        .map(|n| {
            n.parse::<Workload>()
                .map_err(|e| anyhow::anyhow!("'{n}': {e}"))
        })
        .collect()
}
