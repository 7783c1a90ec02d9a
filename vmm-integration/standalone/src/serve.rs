//! `gpuvm serve`: the vfio-user daemon (GPUvm's "A3" aggregator). One process owns the
//! simulated GF100, the `GpuHost` and its scheduler, and serves one vfio-user socket per VM;
//! each VM's VMM is its own process (`gpuvm run --kvm --vfio-user SOCKET`, or any vfio-user
//! client such as Cloud Hypervisor) and reaches only its own vGPU. The server itself is the
//! `gpuvm-vfio-user` crate; this file is its command line and its signal handling.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use gpuvm::clock::ClockKind;
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::phys::sim::{SimConfig, SimGpu};
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::sched::{Policy, SchedParams};
use gpuvm_vfio_user::{Daemon, DaemonConfig, VmSpec};

/// Options of `gpuvm serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Directory for the sockets (created if missing): VM NAME is served on `DIR/NAME.sock`.
    #[arg(long, value_name = "DIR")]
    socket_dir: PathBuf,
    /// Serve N VMs named vm0..vmN-1, each with the profile given by --vram-mib, --channels,
    /// --weight and --shadow.
    #[arg(long, value_name = "N", conflicts_with = "vm",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    vms: Option<u32>,
    /// Serve one VM named NAME with the vGPU profile in the TOML file PROFILE (fields name,
    /// vram_mib, channels, weight, shadow; see src/profile.rs). Repeat for each VM.
    #[arg(long, value_name = "NAME:PROFILE")]
    vm: Vec<String>,
    /// Scheduling policy of the shared GPU: fifo, credit or band.
    #[arg(long, default_value = "band", value_parser = parse_policy)]
    sched: Policy,
    /// With --vms: VRAM slice of each VM, MiB.
    #[arg(long, default_value_t = 512)]
    vram_mib: u64,
    /// With --vms: hardware channels of each VM.
    #[arg(long, default_value_t = 16)]
    channels: u32,
    /// With --vms: scheduling weight of each VM (1-100).
    #[arg(long, default_value_t = 1)]
    weight: u32,
    /// With --vms: how each VM's GPU page tables are shadowed (eager, lazy, incremental, pv).
    #[arg(long, default_value = "lazy")]
    shadow: ShadowMode,
    /// VRAM of the simulated GPU, MiB.
    #[arg(long, default_value_t = 6144)]
    phys_vram_mib: u64,
    /// Accept DMA map files that are not sealed against shrinking (F_SEAL_SHRINK), as Cloud
    /// Hypervisor's guest memory is. Unsafe against a hostile VMM: one that truncates a mapped
    /// file makes this daemon die of SIGBUS on its next access, taking every VM's vGPU with it.
    #[arg(long)]
    allow_unsealed_dma: bool,
}

fn parse_policy(s: &str) -> Result<Policy, String> {
    Policy::ALL
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| format!("unknown policy '{s}' (expected fifo, credit or band)"))
}

/// The VMs to serve, from `--vms` or the `--vm NAME:PROFILE` list.
fn specs(args: &ServeArgs) -> anyhow::Result<Vec<VmSpec>> {
    if let Some(n) = args.vms {
        return Ok((0..n)
            .map(|i| VmSpec {
                name: format!("vm{i}"),
                profile: VgpuProfile {
                    name: format!("vm{i}"),
                    vram_mib: args.vram_mib,
                    channels: args.channels,
                    weight: args.weight,
                    shadow: args.shadow,
                },
            })
            .collect());
    }
    anyhow::ensure!(
        !args.vm.is_empty(),
        "give --vms N or one --vm NAME:PROFILE per VM"
    );
    args.vm
        .iter()
        .map(|v| {
            let (name, file) = v
                .split_once(':')
                .ok_or_else(|| anyhow::anyhow!("--vm '{v}': expected NAME:PROFILE"))?;
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("--vm '{v}': reading {file}"))?;
            let profile = VgpuProfile::from_toml(&text).with_context(|| format!("--vm '{v}'"))?;
            Ok(VmSpec {
                name: name.to_string(),
                profile,
            })
        })
        .collect()
}

/// Blocks SIGTERM and SIGINT in this thread and every thread it starts afterwards, so that
/// [`wait_for_signal`] receives them.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise a local sigset_t; pthread_sigmask only changes
    // this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Waits for SIGTERM or SIGINT.
fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: `set` was initialised by block_signals; `sig` is a valid out-pointer.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}

/// Runs the daemon until SIGTERM or SIGINT.
pub fn run(args: &ServeArgs) -> anyhow::Result<bool> {
    let vms = specs(args)?;
    let signals = block_signals();
    let clock = ClockKind::Real.create();
    let sim = Arc::new(SimGpu::new(SimConfig {
        vram_size: args.phys_vram_mib << 20,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let phys: Arc<dyn PhysicalGpu> = sim;
    let host =
        Arc::new(GpuHost::new(phys, HostConfig::default()).context("bringing up the GPU host")?);
    host.set_scheduler(args.sched.create(&SchedParams::default()))
        .context("setting the scheduler")?;
    host.set_clock(clock.clone());
    let daemon = Daemon::start(
        host.clone(),
        clock,
        DaemonConfig {
            socket_dir: args.socket_dir.clone(),
            vms,
            require_sealed_dma: !args.allow_unsealed_dma,
        },
    )
    .context("starting the vfio-user server")?;
    eprintln!(
        "gpuvm serve: ready: {} VMs on the simulated GF100, {} scheduler, sockets in {}",
        daemon.devices().len(),
        args.sched.name(),
        args.socket_dir.display()
    );
    let sig = wait_for_signal(&signals);
    eprintln!("gpuvm serve: signal {sig}: shutting down");
    let summary: Vec<String> = daemon
        .devices()
        .iter()
        .map(|d| {
            format!(
                "[{}] {} connections, {} vGPU teardowns, {} requests refused",
                d.name(),
                d.connections(),
                d.teardowns(),
                d.rejected()
            )
        })
        .collect();
    daemon.shutdown();
    let stats = host.stats();
    for s in summary {
        eprintln!("gpuvm serve: {s}");
    }
    eprintln!(
        "gpuvm serve: stopped: sockets removed, {} vGPUs left, {} submissions dispatched, {} completed, {} aborted",
        stats.vms, stats.dispatched, stats.completed, stats.aborted
    );
    Ok(true)
}
