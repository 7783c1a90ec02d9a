//! `gpuvm run`: the workload suite in N VMs at once, each with its own virtual GPU, all sharing
//! one simulated GF100 through the device model (in-process: one thread per VM).

use anyhow::Context;
use clap::Args;
use gpuvm::clock::ClockKind;
use gpuvm::profile::ShadowMode;
use gpuvm_guest::workloads::Workload;
use gpuvm_guest::FenceMode;
use gpuvm_harness::{run_vms, VirtOptions, VirtReport};

use crate::table::{self, Table};

/// Options of `gpuvm run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Number of VMs, each running the guest driver against its own virtual GPU.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    vms: u32,
    /// Workload to run in every VM (repeatable), or `all`: madd, mmul, fmadd, fmmul,
    /// memcpy_htod, memcpy_dtoh, loop.
    #[arg(long = "workload", value_name = "W", default_value = "all")]
    workloads: Vec<String>,
    /// How the VMs' GPU page tables are shadowed: eager, lazy, incremental or pv.
    #[arg(long, default_value = "lazy")]
    shadow: ShadowMode,
    /// Print one JSON object (with a `vms` array) instead of the tables.
    #[arg(long)]
    json: bool,
    /// Problem size N: matrices are N x N (madd, mmul, fmadd, fmmul), memcpy moves N*N*4 bytes,
    /// loop runs N*N*64 iterations.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
    size: u32,
    /// Time base: `sim` is deterministic simulated time (fast), `real` follows the host clock.
    #[arg(long, default_value = "sim")]
    clock: ClockKind,
    /// Wait for fences by interrupt (non-stall interrupt) instead of polling the semaphore.
    #[arg(long)]
    irq: bool,
    /// VRAM slice of each VM in MiB (0: an equal share, at most 1024).
    #[arg(long, default_value_t = 0)]
    vram_mib: u64,
    /// Record each VM's MMIO trace (Linux mmiotrace text with gpuvm side records, see
    /// docs/trace-format.md) into DIR as `vm<N>.mmiotrace` (`.gz` with `--record-gzip`); with
    /// `--kvm` too (the host then runs on a clock stepped to wall time; FIFO only).
    #[arg(long, value_name = "DIR")]
    record: Option<std::path::PathBuf>,
    /// Compress recorded traces with gzip.
    #[arg(long, requires = "record")]
    record_gzip: bool,
    /// Guest RAM per VM in MiB (0: derived from the size).
    #[arg(long, default_value_t = 0)]
    guest_ram_mib: u64,
    /// Real KVM guests instead of in-process VMs (see docs/kvm.md).
    #[command(flatten)]
    kvm: crate::kvm::cli::KvmArgs,
}

fn workloads(names: &[String]) -> anyhow::Result<Vec<Workload>> {
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

/// Runs the command; `Ok(false)` if a workload did not verify.
pub fn run(args: &RunArgs) -> anyhow::Result<bool> {
    if args.kvm.kvm {
        anyhow::ensure!(
            !args.record_gzip,
            "--record-gzip is not supported with --kvm (compress the files afterwards)"
        );
        let mut opts = args.kvm.options(
            args.vms as usize,
            args.size,
            args.shadow,
            workloads(&args.workloads)?,
            args.irq,
            args.vram_mib,
            args.guest_ram_mib << 20,
        )?;
        opts.record = args.record.clone();
        return crate::kvm::cli::run(&opts, args.json);
    }
    let mut opts = VirtOptions {
        vms: args.vms as usize,
        size: args.size,
        clock: args.clock,
        shadow: args.shadow,
        workloads: workloads(&args.workloads)?,
        fence_mode: if args.irq {
            FenceMode::Interrupt
        } else {
            FenceMode::Poll
        },
        vram_mib: args.vram_mib,
        guest_ram: args.guest_ram_mib << 20,
        ..VirtOptions::default()
    };
    if args.record.is_some() {
        opts.record = Some(crate::trace::session_for(&opts, &args.workloads));
    }
    let report = run_vms(&opts).context("virtual run")?;
    if let (Some(dir), Some(s)) = (&args.record, &opts.record) {
        let files = s
            .write_dir(dir, args.record_gzip)
            .with_context(|| format!("writing traces to {}", dir.display()))?;
        for f in files {
            eprintln!("gpuvm: recorded {}", f.display());
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(report.all_verified())
}

fn render(r: &VirtReport) -> String {
    let mut out = format!(
        "gpuvm run: {} VMs sharing the simulated GF100 (Quadro 6000), shadow page tables {}, size {}, {} clock\n",
        r.vms.len(),
        r.shadow,
        r.size,
        match r.clock {
            ClockKind::Sim => "simulated",
            ClockKind::Real => "real",
        },
    );
    for vm in &r.vms {
        out += &format!(
            "\nvm{}\n{}",
            vm.vm,
            table::workload_table(std::iter::once(&vm.init).chain(&vm.workloads))
        );
    }
    let mut t = Table::new([
        "vm",
        "verified",
        "BAR0 exits",
        "BAR1 exits",
        "BAR3 exits",
        "virtual",
        "shadowed",
        "forwarded",
        "aperture",
        "userd",
        "unknown",
        "denied",
        "doorbells",
        "rebuilds",
        "PTEs shadowed",
        "faults",
        "violations",
    ]);
    for vm in &r.vms {
        let s = &vm.stats;
        let ok = vm.workloads.iter().filter(|w| w.verified).count();
        let c = &s.by_class;
        t.row([
            format!("vm{}", vm.vm),
            format!("{ok}/{}", vm.workloads.len()),
            s.exits.bar0.total().to_string(),
            s.exits.bar1.total().to_string(),
            s.exits.bar3.total().to_string(),
            c.virtual_.total().to_string(),
            c.shadowed.total().to_string(),
            c.forwarded.total().to_string(),
            c.aperture.total().to_string(),
            c.userd.total().to_string(),
            c.unknown.total().to_string(),
            c.denied.total().to_string(),
            s.doorbells.to_string(),
            s.shadow.rebuilds.to_string(),
            s.shadow.ptes_shadowed.to_string(),
            (s.faults_delivered + s.bar_faults).to_string(),
            s.violations.total.to_string(),
        ]);
    }
    let total: usize = r.vms.iter().map(|v| v.workloads.len()).sum();
    let ok: usize = r
        .vms
        .iter()
        .map(|v| v.workloads.iter().filter(|w| w.verified).count())
        .sum();
    out += &format!(
        "\ndevice model, per VM (exits by BAR and by trap class)\n{}\n{ok}/{total} workloads verified; GPU busy {} in total; {} submissions dispatched ({} scheduler), {} physical MMU faults\n",
        t.render(),
        table::ns(r.host.gpu.busy_ns),
        r.host.dispatched,
        r.host.scheduler,
        r.host.gpu.mmu_faults,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_names() {
        assert_eq!(workloads(&[]).unwrap().len(), 7);
        assert_eq!(workloads(&["all".into()]).unwrap().len(), 7);
        assert_eq!(
            workloads(&["mmul".into(), "loop".into()]).unwrap(),
            vec![Workload::Mmul, Workload::Loop]
        );
        assert!(workloads(&["nosuch".into()])
            .unwrap_err()
            .to_string()
            .contains("nosuch"));
    }
}
