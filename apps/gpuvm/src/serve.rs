//! `gpuvm serve`: the vfio-user daemon (GPUvm's "A3" aggregator). One process owns the
//! simulated GF100, the `GpuHost` and its scheduler, and serves one vfio-user socket per VM;
//! each VM's VMM is its own process (`gpuvm run --kvm --vfio-user SOCKET`, or any vfio-user
//! client such as Cloud Hypervisor) and reaches only its own vGPU. The server itself is the
//! `gpuvm-vfio-user` crate; this file is its command line, its lock on the socket directory,
//! the control socket (`control.rs`), the metrics endpoint (`metrics.rs`) and signal handling
//! (SIGTERM/SIGINT drain in-flight work, then stop; `docs/serve.md`).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use gpuvm::clock::ClockKind;
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::sched::{Policy, SchedParams};
use gpuvm_sim::{SimConfig, SimGpu};
use gpuvm_vfio_user::say::say;
use gpuvm_vfio_user::{Daemon, DaemonConfig, DmaWindows, SocketAccess, VmSpec};

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
    /// vram_mib, channels, weight, shadow, cap_pct; see docs/serve.md §2). Repeat for each VM.
    #[arg(long, value_name = "NAME:PROFILE")]
    vm: Vec<String>,
    /// Scheduling policy of the shared GPU: fifo, credit, band, band-gdev, equal-share (every
    /// VM the same, ignoring weights) or fixed-share (caps that hold even on an idle GPU; a
    /// VM's cap is its profile's cap_pct, `gpuvm ctl cap`, or else its weight's share).
    #[arg(long, default_value = "band", value_parser = parse_policy)]
    sched: Policy,
    /// Serve Prometheus metrics over HTTP at ADDR/metrics (default 127.0.0.1:9464 when the
    /// flag has no value; port 0 picks a free port, printed at start). Off without the flag.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:9464")]
    metrics: Option<String>,
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
    /// A fixed IOVA (DMA) window for every VM, MiB: a power of two from 1 to 262144, at least
    /// the end of the guest RAM a client maps. Without it each VM's window is sized from the
    /// RAM its client maps (the next power of two of where the RAM ends, grown at the client's
    /// DMA_MAPs before the guest uses the GPU), so 64 VMs of a few GiB fit the 2^40-byte IOVA
    /// space; with it the space holds 2^20 / N windows (31 of 32768). A client whose RAM does
    /// not fit gets its DMA_MAP refused.
    #[arg(long, value_name = "MIB", conflicts_with = "dma_window_max_mib")]
    dma_window_mib: Option<u64>,
    /// Without --dma-window-mib: the largest window a VM's RAM may make it grow to, MiB (a
    /// power of two from 1 to 524288). It bounds the IOVA space one client can claim; a
    /// client mapping RAM that ends beyond it gets its DMA_MAP refused.
    #[arg(long, value_name = "MIB", default_value_t = gpuvm_vfio_user::DEFAULT_MAX_WINDOW >> 20)]
    dma_window_max_mib: u64,
    /// Accept DMA map files that are not sealed against shrinking (F_SEAL_SHRINK), as Cloud
    /// Hypervisor's guest memory is. Unsafe against a hostile VMM: one that truncates a mapped
    /// file makes this daemon die of SIGBUS on its next access, taking every VM's vGPU with it.
    #[arg(long)]
    allow_unsealed_dma: bool,
    /// Permission bits of the VM sockets, octal (e.g. 0660 to let a group's VMMs connect;
    /// connecting needs write permission). Default: as the umask leaves them (0755 with the
    /// usual 022: only this user can connect).
    #[arg(long, value_name = "MODE", value_parser = parse_mode)]
    socket_mode: Option<u32>,
    /// Group of the VM sockets (a name or a number), e.g. the group the VMMs run as.
    #[arg(long, value_name = "GROUP", value_parser = parse_group)]
    socket_group: Option<u32>,
}

fn parse_mode(s: &str) -> Result<u32, String> {
    let m = u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|_| format!("'{s}' is not an octal mode such as 0660"))?;
    if m > 0o777 {
        return Err(format!("mode {s} has bits beyond 0777"));
    }
    Ok(m)
}

fn parse_group(s: &str) -> Result<u32, String> {
    if let Ok(gid) = s.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(s) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(format!("no group named '{s}'")),
        Err(e) => Err(format!("looking up group '{s}': {e}")),
    }
}

fn parse_policy(s: &str) -> Result<Policy, String> {
    s.parse::<Policy>()
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
                cap_ppm: None,
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
            let (profile, cap_ppm) =
                profile_from_toml(&text).with_context(|| format!("--vm '{v}'"))?;
            Ok(VmSpec {
                name: name.to_string(),
                profile,
                cap_ppm,
            })
        })
        .collect()
}

/// A vGPU profile from TOML, with the daemon's own optional field `cap_pct` (percent of GPU
/// time; a ceiling every policy honours). Errors name every field the file may have, once.
pub fn profile_from_toml(text: &str) -> anyhow::Result<(VgpuProfile, Option<u32>)> {
    const FIELDS: &str = "name, vram_mib, channels, weight, shadow, cap_pct";
    let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        let line = e
            .span()
            .map(|r| text[..r.start.min(text.len())].matches('\n').count() + 1);
        match line {
            Some(l) => anyhow::anyhow!("invalid profile: line {l}: {}", e.message()),
            None => anyhow::anyhow!("invalid profile: {}", e.message()),
        }
    })?;
    let cap = match table.remove("cap_pct") {
        None => None,
        Some(v) => {
            let p = v
                .as_float()
                .or_else(|| v.as_integer().map(|i| i as f64))
                .ok_or_else(|| anyhow::anyhow!("invalid profile: cap_pct must be a number"))?;
            anyhow::ensure!(
                p > 0.0 && p <= 100.0,
                "invalid profile: cap_pct {p} must be in (0, 100]"
            );
            Some((p * 10_000.0) as u32)
        }
    };
    let profile: VgpuProfile = table.try_into().map_err(|e: toml::de::Error| {
        let msg = e.message().to_string();
        match msg.split_once(", expected") {
            // serde names only VgpuProfile's fields; the file may also have cap_pct.
            Some((head, _)) => anyhow::anyhow!("invalid profile: {head} (the fields are {FIELDS})"),
            None => anyhow::anyhow!("invalid profile: {msg}"),
        }
    })?;
    profile.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((profile, cap))
}

/// `DIR/serve.lock`, held (flock) for the daemon's life and removed when it stops.
struct DirLock {
    _file: std::fs::File,
    path: PathBuf,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Removed while still locked, so a daemon starting now either failed to lock this
        // file or will create and lock a fresh one.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes a file when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Holds `DIR/serve.lock` (flock) for the daemon's life: a second daemon on the same directory
/// is refused with the first one's pid.
fn lock_dir(dir: &std::path::Path) -> anyhow::Result<DirLock> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("serve.lock");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut pid = String::new();
        let _ = f.read_to_string(&mut pid);
        anyhow::bail!(
            "another gpuvm serve (pid {}) already serves {}; stop it first (gpuvm ctl --socket-dir {} stop)",
            pid.trim(),
            dir.display(),
            dir.display()
        );
    }
    f.set_len(0)?;
    f.rewind()?;
    write!(f, "{}", std::process::id())?;
    Ok(DirLock { _file: f, path })
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
    let _lock = lock_dir(&args.socket_dir)?;
    let (control_listener, control_path) =
        crate::control_socket::bind(&args.socket_dir).context("binding the control socket")?;
    // Removed however `run` ends (a failed start too), before the lock goes.
    let _control_sock = RemoveOnDrop(control_path.clone());
    let signals = block_signals();
    let clock = ClockKind::Real.create();
    let sim = Arc::new(SimGpu::new(SimConfig {
        vram_size: args.phys_vram_mib << 20,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let phys: Arc<dyn PhysicalGpu> = sim;
    // Enough hypervisor VRAM for the VMs given at start (each reserves its shadow tables);
    // VMs added later over the control socket are refused with a clear error if it runs out.
    let (iova_window, windows) = match args.dma_window_mib {
        Some(mib) => (mib.saturating_mul(1 << 20), DmaWindows::Fixed),
        None => (
            HostConfig::default().iova_window,
            DmaWindows::FromRam {
                max: args.dma_window_max_mib.saturating_mul(1 << 20),
            },
        ),
    };
    let host_cfg = gpuvm_harness::virt::host_config_for(
        &HostConfig {
            iova_window,
            ..HostConfig::default()
        },
        vms.len(),
    );
    let host = Arc::new(GpuHost::new(phys, host_cfg).context("bringing up the GPU host")?);
    host.set_scheduler(args.sched.create(&SchedParams::default()))
        .context("setting the scheduler")?;
    host.set_clock(clock.clone());
    let daemon = Daemon::start_with(
        host.clone(),
        clock,
        DaemonConfig {
            socket_dir: args.socket_dir.clone(),
            vms,
            require_sealed_dma: !args.allow_unsealed_dma,
        },
        SocketAccess {
            mode: args.socket_mode,
            gid: args.socket_group,
        },
        windows,
    )
    .context("starting the vfio-user server")?;
    let daemon = Arc::new(daemon);
    let ctl = Arc::new(crate::control::Control::new(daemon.clone()));
    {
        let ctl = ctl.clone();
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || crate::control_socket::serve(ctl, control_listener))?;
    }
    if let Some(addr) = &args.metrics {
        let bound = crate::metrics::serve(ctl.clone(), addr)?;
        if !bound.ip().is_loopback() {
            log::warn!("metrics served on {bound}, which is not a loopback address");
        }
        say(format_args!("metrics on http://{bound}/metrics"));
    }
    let n = daemon.devices().len();
    say(format_args!(
        "ready: {n} VM{} on the simulated GF100, {} scheduler, sockets in {}{}, control {}, DMA windows {}{}",
        if n == 1 { "" } else { "s" },
        args.sched.name(),
        args.socket_dir.display(),
        match (args.socket_mode, args.socket_group) {
            (None, None) => String::new(),
            (m, g) => format!(
                " (mode {}, group {})",
                m.map_or("as created".into(), |m| format!("{m:04o}")),
                g.map_or("unchanged".into(), |g| g.to_string())
            ),
        },
        control_path.display(),
        match args.dma_window_mib {
            Some(mib) => format!("fixed at {mib} MiB"),
            None => format!(
                "sized from each VM's RAM (at most {} MiB)",
                args.dma_window_max_mib
            ),
        },
        if args.allow_unsealed_dma {
            ", unsealed DMA maps accepted"
        } else {
            ""
        }
    ));
    let sig = wait_for_signal(&signals);
    say(format_args!("signal {sig}: draining in-flight work"));
    // Drain: nothing new is admitted once the vGPUs go, but work already on the GPU finishes
    // first (the poller keeps serving completions), for at most 10 s.
    let t0 = std::time::Instant::now();
    while host.stats().inflight > 0 && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let left = host.stats().inflight;
    say(format_args!(
        "drained in {:.1} ms ({left} submissions still in flight); shutting down",
        t0.elapsed().as_secs_f64() * 1e3
    ));
    let summary: Vec<String> = daemon
        .devices()
        .iter()
        .map(|d| {
            let (life, _) = d.totals();
            format!(
                "[{}] {} connections, {} vGPU teardowns, {} requests refused; over its life {} submissions, {} of GPU time, {} exits, {} bytes moved",
                d.name(),
                d.connections(),
                d.teardowns(),
                d.rejected(),
                life.submissions,
                crate::table::ns(life.gpu_busy_ns),
                life.exits,
                d.bytes_moved().0
            )
        })
        .collect();
    daemon.shutdown();
    let stats = host.stats();
    for s in summary {
        say(s);
    }
    say(format_args!(
        "stopped: sockets and lock removed, {} vGPUs left, {} submissions dispatched, {} completed, {} aborted",
        stats.vms, stats.dispatched, stats.completed, stats.aborted
    ));
    Ok(true)
}
