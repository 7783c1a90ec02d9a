//! The standalone KVM VMM behind `gpuvm run --kvm`: N KVM VMs in one process, one thread and one
//! vCPU each, all sharing one simulated GF100 through one `GpuHost`.
//!
//! Each VM runs the bare-metal guest program of `guest/bin` (built by this
//! crate's build script and embedded here), which finds the vGPU on PCI, places its BARs and
//! drives it with the `gpuvm-guest` driver; every BAR access is a real MMIO exit that
//! [`mmio::BarWindows`] hands to the VM's `Vgpu`. The guest starts in 64-bit ring 3 (see
//! [`cpu`] and `docs/kvm.md`: on this machine KVM is PVM, where ring-0 guest code is
//! interpreted). Guest and VMM talk through the boot-parameter and results blocks and the ports
//! of [`abi`]: the guest reports each workload's result in the results block and marks phase
//! boundaries on a port, so wall time, GPU busy time and MMIO exits per phase are measured
//! here, on the VMM side.

#[path = "../../../../guest/bin/src/abi.rs"]
pub mod abi;
pub mod cli;
pub mod cpu;
pub mod device;
pub mod device_seam;
pub mod ecam;
pub mod kick;
pub mod migratable;
pub mod migrate;
pub mod mmio;
pub mod options;
pub mod passthrough;
pub mod pci;
pub mod pvh_boot;
#[cfg(test)]
mod pvh_note;
pub mod record;
pub mod remap;
pub mod remote;
pub mod report;
pub mod scheme;
pub mod serial;
pub mod setup;
pub mod shared_ram;
pub mod snapshot;
pub mod vcpu_loop;
pub mod vcpu_state;
pub mod vm;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use gpuvm::clock::{Clock, ClockKind, SimClock};
use gpuvm::host::{GpuHost, HostConfig, HostStats};
use gpuvm::irq::IrqLine;
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::VgpuProfile;
use gpuvm::vgpu::Vgpu;
use gpuvm_guest::workloads::Workload;
use gpuvm_sim::{SimConfig, SimGpu};
use gpuvm_trace::record::TapRecorder;
use kvm_ioctls::{Kvm, VcpuFd};
use serde::Serialize;
use vm_memory::Bytes;
use vmm_sys_util::eventfd::EventFd;

use device::{LocalVgpu, VgpuDevice};
pub use options::{KvmOptions, Outgoing};
use passthrough::Passthrough;
use pci::PciBus;
use report::collect_results;
pub use report::{ExitCounts, KvmReport, KvmVmInfo, KvmVmReport, PhaseMark};
use setup::{Gate, Sampler};
use vcpu_loop::run_vcpu;

/// The guest program (an ELF64 executable linked at [`abi::LOAD_ADDR`]).
pub static GUEST_ELF: &[u8] = include_bytes!(env!("GPUVM_GUEST_ELF"));

/// IOAPIC pin the vGPU's interrupt is wired to (irqfd GSI).
pub const IRQ_GSI: u32 = 16;
/// IDT vector the guest assigns to it.
pub const IRQ_VECTOR: u32 = 0x40;

/// True if `/dev/kvm` is served by PVM (no VT-x/AMD-V; guest ring 0 is interpreted).
pub fn is_pvm() -> bool {
    Path::new("/sys/module/kvm_pvm").exists()
}

/// Opens `/dev/kvm`, or says plainly why it cannot be used.
pub fn open_kvm() -> anyhow::Result<Kvm> {
    if !Path::new("/dev/kvm").exists() {
        anyhow::bail!(
            "/dev/kvm not available: this host has no KVM (load kvm_intel, kvm_amd or kvm_pvm)"
        );
    }
    let kvm = Kvm::new().map_err(|e| {
        anyhow::anyhow!(
            "/dev/kvm is present but unusable: {e} (permissions? the user needs read/write access)"
        )
    })?;
    let v = kvm.get_api_version();
    if v != 12 {
        anyhow::bail!("/dev/kvm speaks KVM API version {v}, expected 12");
    }
    Ok(kvm)
}

/// Where a guest that did not boot here came from.
#[derive(Debug)]
pub enum Incoming {
    /// A snapshot directory, manifest checked.
    Restore(Box<snapshot::Loaded>),
    /// A migration stream, HELLO checked.
    Migration(Box<migrate::Incoming>),
}

/// How the guest left this process.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Handoff {
    /// Written into a snapshot directory.
    Snapshot(snapshot::Written),
    /// Migrated to another VMM.
    Migration(migrate::SourceStats),
}

/// How the guest came into this process.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Restored {
    /// "snapshot DIR" or "migration SOCKET".
    pub from: String,
    /// From the first byte read to the guest ready to run, ns.
    pub load_ns: u64,
    /// What could not be put back exactly.
    pub notes: vcpu_state::RestoreNotes,
    /// The migration as the destination saw it.
    pub migration: Option<migrate::DestStats>,
}

/// Guest RAM layout of one VM: heap and DMA region sizes.
fn ram_layout(opts: &KvmOptions) -> (u64, u64, u64) {
    let matrix = (opts.size as u64).pow(2) * 4;
    if opts.guest_ram != 0 {
        let ram = opts.guest_ram.next_multiple_of(2 << 20).max(32 << 20);
        let heap = (ram - abi::HEAP_BASE) / 2;
        return (ram, heap, ram - abi::HEAP_BASE - heap);
    }
    let heap = (8 * matrix + (16 << 20)).next_multiple_of(2 << 20);
    let dma = (8 * matrix + (16 << 20)).next_multiple_of(2 << 20);
    (abi::HEAP_BASE + heap + dma, heap, dma)
}

/// Runs the workloads in `opts.vms` KVM VMs at once on one simulated GPU.
pub fn run_kvm(opts: &KvmOptions) -> anyhow::Result<KvmReport> {
    run_kvm_with(opts, None)
}

/// [`run_kvm`], VM 0 starting from `incoming` (a snapshot or a migration) instead of booting.
pub fn run_kvm_with(opts: &KvmOptions, incoming: Option<Incoming>) -> anyhow::Result<KvmReport> {
    let kvm = open_kvm()?;
    let handoff = incoming.is_some() || opts.outgoing.is_some();
    if handoff {
        snapshot::check_supported(opts)?;
    }
    if let Some(Outgoing::Snapshot { dir, .. }) = &opts.outgoing {
        // Said now rather than after the guest has run up to the snapshot.
        if let Ok(mut entries) = std::fs::read_dir(dir) {
            anyhow::ensure!(
                entries.next().is_none(),
                "--snapshot-to {}: the directory is not empty",
                dir.display()
            );
        }
    }
    if opts.vms == 0 || opts.vms > 64 {
        anyhow::bail!("vms = {} must be 1..=64", opts.vms);
    }
    if opts.workloads.len() > abi::MAX_WORKLOADS {
        anyhow::bail!("at most {} workloads per run", abi::MAX_WORKLOADS);
    }
    if opts.record.is_some() {
        anyhow::ensure!(
            opts.sample_every.is_none(),
            "--record cannot be combined with the GPU-time sampler (its host polls belong to no VM's trace)"
        );
        anyhow::ensure!(
            matches!(opts.sched, None | Some(gpuvm::sched::Policy::Fifo)),
            "--record needs the host's default scheduler (FIFO): `gpuvm trace replay` runs it"
        );
        anyhow::ensure!(
            !opts.scheme.is_some_and(|s| s.remaps()),
            "--record needs every BAR access to exit (BAR remap lets the guest write VRAM without the device model seeing it): use --scheme fv-naive or no --scheme"
        );
    }
    // Recording: a simulated clock that the recorders step to wall time at each access.
    let stepped = opts.record.as_ref().map(|_| Arc::new(SimClock::new()));
    let clock: Arc<dyn Clock> = match &stepped {
        Some(c) => c.clone(),
        None => ClockKind::Real.create(),
    };
    let sim = Arc::new(SimGpu::new(SimConfig {
        vram_size: opts.phys_vram,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    if opts.scheme == Some(scheme::KvmScheme::Native) {
        return run_native(&kvm, opts, sim);
    }
    let phys: Arc<dyn PhysicalGpu> = sim.clone();
    // Enough hypervisor VRAM for every VM's shadow reservation (64 VMs: 528 MiB), as the
    // in-process runs have.
    let hcfg = gpuvm_harness::virt::host_config_for(&HostConfig::default(), opts.vms);
    let hyp = hcfg.hypervisor_vram >> 20;
    let host = Arc::new(GpuHost::new(phys, hcfg).context("bringing up the GPU host")?);
    // VM 0 of a restore gets its vGPU from the snapshot or the migration stream.
    let restoring = incoming.is_some();
    if let Some(p) = opts.sched {
        host.set_scheduler(p.create(&opts.sched_params))
            .context("setting the scheduler")?;
    }
    let vram_mib = if opts.vram_mib == 0 {
        (((opts.phys_vram >> 20).saturating_sub(hyp)) / opts.vms as u64).min(1024)
    } else {
        opts.vram_mib
    };
    let channels = (128 / opts.vms as u32).min(16);
    let mut vgpus = Vec::new();
    let mut devs: Vec<Arc<dyn VgpuDevice>> = Vec::new();
    for i in 0..opts.vms {
        let p = VgpuProfile {
            name: format!("vm{i}"),
            vram_mib,
            channels,
            weight: opts.setups.get(i).map_or(1, |s| s.weight.max(1)),
            shadow: opts.shadow_mode(),
        };
        if restoring && i == 0 {
            devs.push(Arc::new(migratable::MigratableVgpu::to_restore(
                host.clone(),
                sim.clone(),
            )));
            continue;
        }
        // The DMA window sized from the guest's RAM (not the host's default 32 GiB), so that
        // 64 guests of tens of MiB fit in the 2^40-byte IOVA space.
        let v = host
            .create_vgpu_for_ram(&p, ram_layout(opts).0)
            .with_context(|| format!("creating the vGPU of vm{i}"))?;
        devs.push(if handoff {
            // The snapshot seam (see `migratable::MigratableVgpu`).
            Arc::new(migratable::MigratableVgpu::new(
                host.clone(),
                sim.clone(),
                v.clone(),
            ))
        } else {
            Arc::new(LocalVgpu::new(v.clone(), sim.clone()))
        });
        vgpus.push(v);
    }
    let gated = (0..opts.vms)
        .filter(|&i| {
            let mode = opts.modes.get(i).copied().unwrap_or(abi::MODE_NORMAL);
            opts.setups
                .get(i)
                .is_some_and(|s| s.gate || (mode == abi::MODE_NORMAL && s.stream.is_some()))
        })
        .count();
    let session = opts.record.as_ref().map(|_| {
        let note = format!(
            "kvm;workloads={};size={};fence={};vms={}",
            opts.workloads
                .iter()
                .map(|w| w.name())
                .collect::<Vec<_>>()
                .join(","),
            opts.size,
            if opts.fence_irq { "Interrupt" } else { "Poll" },
            opts.vms
        );
        gpuvm_trace::record::Session::new(opts.vms as u32, opts.phys_vram, host.config(), &note)
    });
    let start = Instant::now();
    let mut recorders = Vec::new();
    if let (Some(session), Some(clock)) = (&session, &stepped) {
        let guest_ram = ram_layout(opts).0;
        for (i, v) in vgpus.iter().enumerate() {
            let rec = TapRecorder::new(
                session.clone(),
                v,
                i as u32,
                guest_ram,
                clock.clone(),
                start,
            );
            if v.set_access_tap(rec.clone()).is_err() {
                anyhow::bail!("vm{i}: the vGPU already has an access tap");
            }
            recorders.push(rec);
        }
    }
    let ctx = RunCtx {
        host: Some(&*host),
        sim: Some(&sim),
        gate: Gate::new(gated),
        start,
        recorders,
        incoming: std::sync::Mutex::new(incoming),
    };
    let sampler = Sampler::new();
    let reports: Vec<KvmVmReport> = std::thread::scope(|s| {
        if let Some(every) = opts.sample_every {
            let (sampler, ctx, vgpus, host, sim) = (&sampler, &ctx, &vgpus, &host, &*sim);
            std::thread::Builder::new()
                .name("sampler".into())
                .spawn_scoped(s, move || sampler.run(every, ctx.start, host, sim, vgpus))
                .expect("spawning the sampler thread");
        }
        let handles: Vec<_> = devs
            .iter()
            .enumerate()
            .map(|(i, dev)| {
                let (kvm, ctx, dev) = (&kvm, &ctx, dev.clone());
                std::thread::Builder::new()
                    .name(format!("vm{i}"))
                    .spawn_scoped(s, move || run_vm(kvm, i, dev, ctx, opts))
                    .expect("spawning a VM thread")
            })
            .collect();
        let reports = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a VM thread panicked")))
            .collect();
        sampler.stop();
        reports
    });
    if opts.sample_every.is_some() {
        sampler.sample(ctx.start, &host, &sim, &vgpus);
    }
    for (d, r) in devs.iter().zip(&reports) {
        if let (None, Some(v)) = (r.kvm.destroyed_in_flight, d.vgpu()) {
            host.destroy_vgpu(v).context("destroying a vGPU")?;
        }
    }
    let recorded = match (&session, &opts.record) {
        (Some(s), Some(dir)) => s
            .write_dir(dir, false)
            .with_context(|| format!("writing traces to {}", dir.display()))?,
        _ => Vec::new(),
    };
    drop(vgpus);
    drop(devs);
    Ok(KvmReport {
        backend: "kvm",
        pvm: is_pvm(),
        guest_ring: 3,
        clock: ClockKind::Real,
        size: opts.size,
        shadow: opts.shadow_mode(),
        scheme: opts.scheme,
        vms: reports,
        host: host.stats(),
        gate_open_ns: ctx
            .gate
            .opened()
            .map(|t| t.saturating_duration_since(ctx.start).as_nanos() as u64),
        samples: sampler.take(),
        recorded,
    })
}

/// What the threads of one run share.
struct RunCtx<'a> {
    /// The shared host (`None` for the `native` scheme: the GPU is passed through).
    host: Option<&'a GpuHost>,
    /// The simulated GPU under the host (`None` when the device is elsewhere).
    sim: Option<&'a SimGpu>,
    gate: Gate,
    /// The origin of every VM's phase times and of the samples.
    start: Instant,
    /// One trace recorder per VM (with `record`; empty otherwise).
    recorders: Vec<Arc<TapRecorder>>,
    /// Where VM 0 comes from, if it does not boot (taken by its thread).
    incoming: std::sync::Mutex<Option<Incoming>>,
}

impl RunCtx<'_> {
    /// A context of one VM with no shared host in this process (`--scheme native`,
    /// `--vfio-user`): no gate, no recorders.
    fn detached() -> RunCtx<'static> {
        RunCtx {
            host: None,
            sim: None,
            gate: Gate::new(0),
            start: Instant::now(),
            recorders: Vec::new(),
            incoming: std::sync::Mutex::new(None),
        }
    }
}

/// The `native` scheme: one VM with the simulated GPU passed through ([`passthrough`]): no
/// host, no device model, no scheduler.
fn run_native(kvm: &Kvm, opts: &KvmOptions, sim: Arc<SimGpu>) -> anyhow::Result<KvmReport> {
    anyhow::ensure!(
        opts.vms == 1,
        "--scheme native runs exactly one VM (the GPU is passed through to it), not {}",
        opts.vms
    );
    anyhow::ensure!(
        opts.record.is_none(),
        "--record records the device model's accesses; --scheme native has none"
    );
    let dev: Arc<dyn VgpuDevice> = Arc::new(Passthrough::new(sim.clone()));
    let ctx = RunCtx::detached();
    let report = run_vm(kvm, 0, dev, &ctx, opts);
    Ok(KvmReport {
        backend: "kvm",
        pvm: is_pvm(),
        guest_ring: 3,
        clock: ClockKind::Real,
        size: opts.size,
        shadow: opts.shadow_mode(),
        scheme: opts.scheme,
        vms: vec![report],
        host: HostStats {
            vms: 1,
            gpu: sim.stats(),
            ..HostStats::default()
        },
        gate_open_ns: None,
        samples: Vec::new(),
        recorded: Vec::new(),
    })
}

/// The vGPU's interrupt line as an irqfd: a rising edge signals the eventfd, which KVM turns
/// into an edge on IOAPIC pin [`IRQ_GSI`].
struct IrqfdLine {
    evt: EventFd,
    level: AtomicBool,
    raised: AtomicU64,
}

impl IrqLine for IrqfdLine {
    fn set_level(&self, asserted: bool) {
        let was = self.level.swap(asserted, Ordering::SeqCst);
        if asserted && !was {
            self.raised.fetch_add(1, Ordering::SeqCst);
            if let Err(e) = self.evt.write(1) {
                log::warn!("irqfd write failed: {e}");
            }
        }
    }
}

/// A phase marker: phase id, when, GPU busy so far, MMIO exits so far.
#[derive(Debug, Clone, Copy)]
struct Mark {
    phase: u32,
    at: Instant,
    busy_ns: u64,
    reads: u64,
    writes: u64,
}

/// One VM's thread: set up, run the vCPU until the guest reports through the exit port or is
/// stopped, collect the results.
fn run_vm(
    kvm: &Kvm,
    index: usize,
    dev: Arc<dyn VgpuDevice>,
    ctx: &RunCtx,
    opts: &KvmOptions,
) -> KvmVmReport {
    let name = format!("vm{index}");
    let mut info = KvmVmInfo {
        weight: dev.vgpu().map_or(1, |v| v.profile().weight),
        ..KvmVmInfo::default()
    };
    let mut marks = Vec::new();
    let mut ram = None;
    match run_vcpu(kvm, index, &dev, ctx, opts, &mut info, &mut marks, &mut ram) {
        Ok(()) => {}
        Err(e) => {
            let msg = format!("{name}: VM setup failed: {e:#}");
            eprintln!("gpuvm: {msg}");
            info.stopped = Some(msg);
        }
    }
    let stats = dev.stats();
    if let (true, Some(host), Some(v)) = (info.stopped.is_some(), ctx.host, dev.vgpu()) {
        // Contain it now, while the others run: its work in flight is dropped with it.
        info.destroyed_in_flight = Some(match ctx.recorders.get(index) {
            Some(rec) => {
                let mut n = 0;
                rec.destroy(|| n = destroy_stopped(host, v, &name));
                n
            }
            None => destroy_stopped(host, v, &name),
        });
    }
    if let Some(rec) = ctx.recorders.get(index) {
        rec.finish();
    }
    let names: Vec<&str> = match vm_mode(opts, index) {
        abi::MODE_STREAM => vec!["stream"],
        abi::MODE_STOP_FAULT | abi::MODE_STOP_SPIN => vec!["long kernel"],
        _ => vm_workloads(opts, index).iter().map(|w| w.name()).collect(),
    };
    let (init, workloads) = collect_results(ram.as_ref(), &marks, &names, &info);
    let origin = info.origin.unwrap_or(ctx.start);
    info.phases = marks
        .iter()
        .map(|m| PhaseMark {
            phase: m.phase,
            at_ns: m.at.saturating_duration_since(origin).as_nanos() as u64,
        })
        .collect();
    KvmVmReport {
        vm: dev.vm_id().unwrap_or(index as u32),
        init,
        workloads,
        stats,
        kvm: info,
    }
}

/// Destroys the vGPU of a VM the VMM stopped; returns how many of its submissions were still
/// queued or on the GPU.
fn destroy_stopped(host: &GpuHost, vgpu: &Vgpu, name: &str) -> u64 {
    let in_flight = host
        .sched_stats()
        .vms
        .iter()
        .find(|v| v.vm == vgpu.id())
        .map_or(0, |v| {
            v.dispatched.saturating_sub(v.retired) + v.queued as u64
        });
    match host.destroy_vgpu(vgpu) {
        Ok(()) => eprintln!(
            "gpuvm: {name}: vGPU destroyed with {in_flight} submission(s) in flight; the other VMs go on"
        ),
        Err(e) => eprintln!("gpuvm: {name}: destroying the vGPU failed: {e}"),
    }
    in_flight
}

/// The guest mode of VM `index`.
fn vm_mode(opts: &KvmOptions, index: usize) -> u32 {
    match opts.modes.get(index).copied().unwrap_or(abi::MODE_NORMAL) {
        abi::MODE_NORMAL if opts.setups.get(index).is_some_and(|s| s.stream.is_some()) => {
            abi::MODE_STREAM
        }
        m => m,
    }
}

/// Writes the boot-parameter block of the VMM's direct ring-3 start.
fn write_boot_params(
    gvm: &vm::GuestVm,
    vcpu: &VcpuFd,
    opts: &KvmOptions,
    index: usize,
    fence_irq: bool,
) -> anyhow::Result<()> {
    let setup = opts.setups.get(index).cloned().unwrap_or_default();
    let workloads = vm_workloads(opts, index);
    let (_, heap, dma) = ram_layout(opts);
    let tsc_khz = vcpu.get_tsc_khz().unwrap_or(0);
    let bp = |off: u64| abi::BOOT_PARAMS + off;
    gvm.write_u64(bp(abi::BP_MAGIC), abi::MAGIC)?;
    gvm.write_u32(bp(abi::BP_MODE), vm_mode(opts, index))?;
    gvm.write_u32(bp(abi::BP_SIZE), opts.size)?;
    gvm.write_u32(bp(abi::BP_FENCE_MODE), fence_irq as u32)?;
    gvm.write_u32(bp(abi::BP_NWORKLOADS), workloads.len() as u32)?;
    gvm.write_u32(bp(abi::BP_GATE), setup.gate as u32)?;
    gvm.write_u64(bp(abi::BP_ECAM), if opts.ecam { abi::ECAM_BASE } else { 0 })?;
    gvm.write_u32(bp(abi::BP_IRQ_NEST), opts.irq_nest as u32)?;
    if let Some(st) = setup.stream {
        gvm.write_u64(bp(abi::BP_STREAM_ITERS), st.iterations)?;
        gvm.write_u32(bp(abi::BP_STREAM_OUTSTANDING), st.outstanding)?;
        gvm.write_u32(bp(abi::BP_STREAM_START_MS), st.start_ms)?;
        gvm.write_u32(bp(abi::BP_STREAM_MS), st.run_ms)?;
        gvm.write_u32(bp(abi::BP_STREAM_COUNT), st.count)?;
    }
    gvm.write_u64(bp(abi::BP_TSC_KHZ), tsc_khz as u64)?;
    gvm.write_u64(bp(abi::BP_HEAP_BASE), abi::HEAP_BASE)?;
    gvm.write_u64(bp(abi::BP_HEAP_SIZE), heap)?;
    gvm.write_u64(bp(abi::BP_DMA_BASE), abi::HEAP_BASE + heap)?;
    gvm.write_u64(bp(abi::BP_DMA_SIZE), dma)?;
    gvm.write_u64(bp(abi::BP_MMIO_BASE), abi::MMIO_HOLE)?;
    gvm.write_u32(bp(abi::BP_IRQ_VECTOR), IRQ_VECTOR)?;
    gvm.write_u32(bp(abi::BP_IRQ_GSI), IRQ_GSI)?;
    gvm.write_u32(bp(abi::BP_CALIBRATE), opts.calibrate)?;
    for (i, w) in workloads.iter().enumerate() {
        let idx = Workload::ALL.iter().position(|x| x == w).unwrap_or(0xff) as u32;
        gvm.mem
            .write_obj(
                idx as u8,
                vm_memory::GuestAddress(bp(abi::BP_WORKLOADS) + i as u64),
            )
            .context("writing boot parameters")?;
    }
    Ok(())
}

/// The PVH start ([`pvh_boot`]): the start info with a command line saying what the boot
/// parameters would (size, workloads, interrupt pin), the vCPU at the PVH entry.
fn pvh_setup(
    kvm: &Kvm,
    vcpu: &VcpuFd,
    gvm: &vm::GuestVm,
    opts: &KvmOptions,
    index: usize,
    ram: u64,
    fence_irq: bool,
) -> anyhow::Result<()> {
    let setup = opts.setups.get(index).cloned().unwrap_or_default();
    anyhow::ensure!(
        vm_mode(opts, index) == abi::MODE_NORMAL
            && setup.stream.is_none()
            && !setup.gate
            && opts.calibrate == 0
            && !opts.ecam,
        "--pvh runs the workloads only: no hostile modes, streams, gate, calibration or ECAM"
    );
    let names: Vec<&str> = vm_workloads(opts, index).iter().map(|w| w.name()).collect();
    let irq = if fence_irq {
        format!("intx:{IRQ_GSI}")
    } else {
        "poll".to_string()
    };
    let cmdline = format!(
        "size={} workloads={} irq={irq} tsc_khz={}",
        opts.size,
        names.join(","),
        vcpu.get_tsc_khz().unwrap_or(0)
    );
    pvh_boot::write_start_info(&gvm.mem, ram, &cmdline)?;
    pvh_boot::setup_vcpu(kvm, vcpu, pvh_boot::entry(GUEST_ELF)?)
}

/// The workloads of VM `index`.
fn vm_workloads(opts: &KvmOptions, index: usize) -> &[Workload] {
    opts.setups
        .get(index)
        .and_then(|s| s.workloads.as_deref())
        .unwrap_or(&opts.workloads)
}

/// A guest's state, read from where it came from and put into the new VM: everything but the
/// vGPU, which is restored once RAM and its interrupt are attached.
struct RestoredState {
    machine: snapshot::MachineState,
    vgpu_bytes: Vec<u8>,
    migration: Option<Box<migrate::Incoming>>,
    report: Restored,
    t0: Instant,
}

/// Loads RAM and puts the VM's and the vCPU's state back (a migration: receives the pre-copy
/// rounds and the state first; on failure the source is told why, so it resumes the guest).
fn restore_machine(
    gvm: &vm::GuestVm,
    vcpu: &VcpuFd,
    inc: Incoming,
) -> anyhow::Result<RestoredState> {
    let t0 = Instant::now();
    let put = |machine: &snapshot::MachineState| -> anyhow::Result<vcpu_state::RestoreNotes> {
        let state = machine.vcpus.first().context("the state has no vCPU")?;
        vcpu_state::restore_vm(&gvm.fd, &machine.vm)?;
        vcpu_state::restore_vcpu(&gvm.fd, vcpu, state)
    };
    match inc {
        Incoming::Restore(l) => {
            let l = *l;
            l.load_ram(&gvm.mem)?;
            let vgpu_bytes = l.vgpu_bytes()?;
            let notes = put(&l.manifest.machine)?;
            Ok(RestoredState {
                report: Restored {
                    from: format!("snapshot {}", l.dir.display()),
                    notes,
                    ..Restored::default()
                },
                machine: l.manifest.machine,
                vgpu_bytes,
                migration: None,
                t0,
            })
        }
        Incoming::Migration(m) => {
            let mut m = *m;
            let r = m
                .receive(&gvm.mem)
                .and_then(|(machine, vb)| Ok((put(&machine)?, machine, vb)));
            match r {
                Err(e) => {
                    m.refuse(&e);
                    Err(e)
                }
                Ok((notes, machine, vgpu_bytes)) => Ok(RestoredState {
                    report: Restored {
                        from: format!("migration {}", m.socket().display()),
                        notes,
                        ..Restored::default()
                    },
                    machine,
                    vgpu_bytes,
                    migration: Some(Box::new(m)),
                    t0,
                }),
            }
        }
    }
}

/// What the VMM keeps about the guest, for a snapshot.
fn vmm_state(
    uart: &serial::Uart,
    pci: &PciBus,
    ex: &ExitCounts,
    marks: &[Mark],
    start: Instant,
) -> snapshot::VmmState {
    snapshot::VmmState {
        serial: snapshot::SerialRegs::of(&uart.state()),
        console_partial: uart.writer().partial().to_vec(),
        console: uart.writer().lines.clone(),
        pci_address: pci.address(),
        exits: *ex,
        marks: marks
            .iter()
            .map(|m| snapshot::MarkState {
                phase: m.phase,
                at_ns: m.at.saturating_duration_since(start).as_nanos() as u64,
                busy_ns: m.busy_ns,
                reads: m.reads,
                writes: m.writes,
            })
            .collect(),
        elapsed_ns: start.elapsed().as_nanos() as u64,
    }
}

/// Captures everything but RAM; the vGPU first (it quiesces), unless `with_vgpu` is false (a
/// live migration: the migration thread sends the vGPU's stream and fills in its part). If
/// the rest fails after the vGPU was saved, the vGPU is resumed.
fn capture_machine(
    kvm: &Kvm,
    gvm: &vm::GuestVm,
    vcpu: &VcpuFd,
    vgpu: &dyn VgpuDevice,
    vmm: snapshot::VmmState,
    with_vgpu: bool,
) -> anyhow::Result<(snapshot::MachineState, Vec<u8>)> {
    let seam = vgpu
        .snapshot()
        .context("this vGPU has no snapshot support")?;
    let bytes = match with_vgpu {
        true => seam.save().context("the vGPU")?,
        false => Vec::new(),
    };
    let rest = vcpu_state::capture_vcpu(kvm, &gvm.fd, vcpu)
        .and_then(|c| Ok((vec![c], vcpu_state::capture_vm(&gvm.fd)?)));
    let (vcpus, vm) = match rest {
        Ok(x) => x,
        Err(e) => {
            seam.resume();
            return Err(e);
        }
    };
    Ok((
        snapshot::MachineState {
            vm,
            vcpus,
            vmm,
            vgpu: snapshot::device_info(seam, &bytes),
        },
        bytes,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_program_is_embedded() {
        assert_eq!(&GUEST_ELF[..4], b"\x7fELF");
    }

    #[test]
    fn ram_layout_fits_below_the_mmio_hole() {
        let (ram, heap, dma) = ram_layout(&KvmOptions {
            size: 1024,
            ..KvmOptions::default()
        });
        assert_eq!(ram, abi::HEAP_BASE + heap + dma);
        assert!(ram < abi::MMIO_HOLE);
        let (ram, heap, dma) = ram_layout(&KvmOptions {
            guest_ram: 100 << 20,
            ..KvmOptions::default()
        });
        assert_eq!(ram, abi::HEAP_BASE + heap + dma);
    }

    // The ABI blocks do not overlap.
    const _: () = {
        assert!(abi::BP_CALIBRATE >= abi::BP_WORKLOADS + abi::MAX_WORKLOADS as u64);
        assert!(abi::RESULTS_HEADER + abi::H_SUBMITTED + 8 <= abi::PML4_ADDR);
        assert!(
            abi::ECAM_BASE >= abi::MMIO_HOLE && abi::ECAM_BASE + abi::ECAM_SIZE <= abi::NULL_MMIO
        );
        assert!(abi::BOOT_PARAMS + 0x1000 <= abi::RESULTS);
    };
}
