//! The vCPU loop: runs one VM's vCPU until the guest ends, answers its exits (MMIO to the
//! vGPU's BARs and the ECAM window, port I/O for PCI configuration, the serial port and the
//! guest's markers), and at the asked exit count pauses it for a snapshot or a live migration.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use gpuvm::phys::PhysicalGpu;
use kvm_ioctls::{IoEventAddress, Kvm, VcpuExit, VcpuFd, VmFd};
use vmm_sys_util::eventfd::EventFd;

use super::device::VgpuDevice;
use super::mmio::BarWindows;
use super::options::{KvmOptions, Outgoing};
use super::pci::PciBus;
use super::report::{calibration, ExitCounts, KvmVmInfo};
use super::{
    abi, cpu, ecam, kick, migrate, pci, record, remap, serial, shared_ram, snapshot, vcpu_state, vm,
};
use super::{
    capture_machine, pvh_setup, ram_layout, restore_machine, vm_workloads, vmm_state,
    write_boot_params, Handoff, Mark, RunCtx, GUEST_ELF, IRQ_GSI, IRQ_VECTOR,
};

#[allow(clippy::too_many_arguments)]
pub(super) fn run_vcpu(
    kvm: &Kvm,
    index: usize,
    vgpu: &Arc<dyn VgpuDevice>,
    ctx: &RunCtx,
    opts: &KvmOptions,
    info: &mut KvmVmInfo,
    marks: &mut Vec<Mark>,
    ram_out: &mut Option<vm::GuestVm>,
) -> anyhow::Result<()> {
    let name = format!("vm{index}");
    let sim = ctx.sim;
    let setup = opts.setups.get(index).cloned().unwrap_or_default();
    let fence_irq = setup.fence_irq.unwrap_or(opts.fence_irq);
    let workloads = vm_workloads(opts, index);
    if workloads.len() > abi::MAX_WORKLOADS {
        anyhow::bail!("at most {} workloads per VM", abi::MAX_WORKLOADS);
    }
    let (ram, heap, _) = ram_layout(opts);
    let gvm = if vgpu.needs_shared_ram() {
        vm::GuestVm::with_memory(kvm, shared_ram::memfd_ram(ram)?)?
    } else {
        vm::GuestVm::new(kvm, ram)?
    };
    let mut vcpu = gvm.create_vcpu()?;
    let incoming = match index {
        0 => ctx
            .incoming
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(),
        _ => None,
    };
    let mut restored = match incoming {
        None => {
            let entry = gvm.load_elf(GUEST_ELF)?;
            if opts.pvh {
                pvh_setup(kvm, &vcpu, &gvm, opts, index, ram, fence_irq)?;
            } else {
                cpu::write_system_tables(&gvm.mem)?;
                cpu::setup(kvm, &vcpu, entry, fence_irq)?;
                write_boot_params(&gvm, &vcpu, opts, index, fence_irq)?;
            }
            None
        }
        Some(inc) => Some(restore_machine(&gvm, &vcpu, inc)?),
    };
    if let Some(r) = restored.as_mut() {
        // The vGPU once RAM is back (its state names guest RAM: page tables, rings, the DMA
        // windows), before the vCPU runs.
        let res = vgpu
            .snapshot()
            .context("this vGPU has no snapshot support")
            .and_then(|seam| {
                snapshot::restore_device(seam, &r.machine.vgpu, &r.vgpu_bytes, &gvm.mem)
            });
        if let (Some(m), Err(e)) = (r.migration.as_mut(), &res) {
            m.refuse(e);
        }
        res.context("restoring the vGPU")?;
        r.vgpu_bytes = Vec::new();
    }

    vgpu.attach_ram(&gvm.mem)
        .context("attaching guest RAM to the vGPU")?;
    // With `record`: the guest's writes to its DMA region, found in KVM's dirty log.
    let mut ram_log = match ctx.recorders.get(index) {
        Some(rec) => Some((
            record::RamLog::start(&gvm, abi::HEAP_BASE + heap..ram, rec)?,
            rec.clone(),
        )),
        None => None,
    };
    let mut sync_ram = |gvm: &vm::GuestVm| -> Result<(), String> {
        match &mut ram_log {
            Some((log, rec)) => log
                .sync(gvm, rec)
                .map_err(|e| format!("{name}: recording guest RAM: {e:#}: VM stopped")),
            None => Ok(()),
        }
    };

    if fence_irq {
        let evt = EventFd::new(0).context("eventfd")?;
        gvm.fd.register_irqfd(&evt, IRQ_GSI).context("KVM_IRQFD")?;
        vgpu.connect_irq(evt)?;
    }

    let mut pci = PciBus::new(vgpu.clone());
    let mut uart = serial::uart(&name, opts.echo_console);
    let mut windows = BarWindows::default();
    let mut ex = ExitCounts::default();
    let mut start = Instant::now();
    if let Some(r) = restored.as_mut() {
        let v = &r.machine.vmm;
        pci.set_address(v.pci_address);
        uart = serial::restored_uart(
            &name,
            opts.echo_console,
            &v.serial.state(),
            &v.console_partial,
            &v.console,
        )?;
        ex = v.exits;
        start = start
            .checked_sub(Duration::from_nanos(v.elapsed_ns))
            .unwrap_or(start);
        *marks = v
            .marks
            .iter()
            .map(|m| Mark {
                phase: m.phase,
                at: start + Duration::from_nanos(m.at_ns),
                busy_ns: m.busy_ns,
                reads: m.reads,
                writes: m.writes,
            })
            .collect();
        info.origin = Some(start);
        let mut report = std::mem::take(&mut r.report);
        if let Some(m) = r.migration.as_mut() {
            report.migration = Some(m.loaded()?);
        }
        report.load_ns = r.t0.elapsed().as_nanos() as u64;
        if !report.notes.msrs_refused.is_empty() || report.notes.tsc_khz.is_some() {
            eprintln!(
                "gpuvm: {name}: restored with differences: {:?}",
                report.notes
            );
        }
        eprintln!(
            "gpuvm: {name}: restored from {} in {:.1} ms; the guest continues",
            report.from,
            report.load_ns as f64 / 1e6
        );
        info.restored = Some(report);
    }
    let timeout = setup.timeout.unwrap_or(opts.timeout);
    let deadline = Instant::now() + timeout;
    // Declared after `vcpu`, so dropped (disarmed) before it.
    let kicker = kick::Kicker::arm(&mut vcpu, deadline, setup.stall)?;
    let mut at_gate = false;
    let mark = |phase: u32, ex: &ExitCounts| Mark {
        phase,
        at: Instant::now(),
        busy_ns: vgpu.busy_ns(),
        reads: ex.mmio_reads,
        writes: ex.mmio_writes,
    };
    let mut zones: Vec<(u64, u64)> = Vec::new();
    let mut remap = opts
        .scheme
        .filter(|s| s.remaps())
        .and_then(|_| sim.and_then(|s| s.vram_backing()))
        .map(|vram| remap::Remap::new(kvm, vram));
    if opts.coalesce {
        vcpu.map_coalesced_mmio_ring()
            .context("mapping the coalesced MMIO ring")?;
    }
    // How the loop ended.
    enum End {
        Exit(u32),
        Stop(String),
        /// Snapshot written or migrated: the guest goes on elsewhere.
        HandedOff,
    }
    // Exits in this process (what `--snapshot-after-exits`/`--migrate-after-exits` count).
    let mut exits_here = 0u64;
    let mut handoff_tried = false;
    let mut source: Option<migrate::Source> = None;
    let spec = match &opts.outgoing {
        Some(_) => Some(snapshot::GuestSpec::of(opts)?),
        None => None,
    };
    let stop: End = loop {
        // A kick (timeout, or the migration asking for the stop) sets `immediate_exit`; it has
        // done its work once the checks below see why it was sent (each sender sets its
        // reason before it signals).
        vcpu.set_kvm_immediate_exit(0);
        if let (Some(out), Some(spec)) = (&opts.outgoing, &spec) {
            // A migration that failed before asking for the stop: the guest goes on here.
            if source
                .as_ref()
                .is_some_and(|s| !s.wants_stop() && s.finished())
            {
                if let Some(mut s) = source.take() {
                    let e = s.join().err().map_or_else(
                        || "the migration thread ended without a stop".to_string(),
                        |e| format!("{e:#}"),
                    );
                    handoff_failed(info, &gvm, &name, "migration", e);
                }
            }
            let due = !handoff_tried && exits_here >= out.after_exits();
            if let (Outgoing::Migrate { socket, .. }, true) = (out, due) {
                handoff_tried = true;
                let live = vgpu
                    .snapshot()
                    .context("this vGPU cannot be migrated live")
                    .and_then(|s| s.live());
                match live.and_then(|live| {
                    gvm.set_dirty_log(true)?;
                    migrate::Source::start(kvm, &gvm, socket, spec.clone(), live)
                }) {
                    Ok(s) => {
                        eprintln!(
                            "gpuvm: {name}: migrating to {} after {exits_here} exits (pre-copy)",
                            socket.display()
                        );
                        source = Some(s);
                    }
                    Err(e) => handoff_failed(info, &gvm, &name, "migration", format!("{e:#}")),
                }
            }
            let pause = match out {
                Outgoing::Snapshot { .. } => due,
                Outgoing::Migrate { .. } => source.as_ref().is_some_and(|s| s.wants_stop()),
            };
            if pause {
                handoff_tried = true;
                let paused = Instant::now();
                // Finish the pending exit, replay queued writes, then capture.
                let captured = vcpu_state::complete_pending_io(&mut vcpu)
                    .and_then(|()| {
                        if opts.coalesce {
                            drain_coalesced(
                                &mut vcpu,
                                &windows,
                                &**vgpu,
                                &mut ex,
                                remap.as_mut(),
                                &name,
                            )
                            .map_err(|e| anyhow::anyhow!(e))?;
                        }
                        Ok(())
                    })
                    .and_then(|()| {
                        let vmm = vmm_state(&uart, &pci, &ex, marks, start);
                        let with_vgpu = matches!(out, Outgoing::Snapshot { .. });
                        capture_machine(kvm, &gvm, &vcpu, &**vgpu, vmm, with_vgpu)
                    });
                match out {
                    Outgoing::Snapshot { dir, after_exits } => {
                        let written = captured.and_then(|(machine, bytes)| {
                            snapshot::write_dir(
                                dir,
                                spec.clone(),
                                format!("--snapshot-after-exits {after_exits}"),
                                machine,
                                &bytes,
                                &gvm.mem,
                            )
                        });
                        match written {
                            Ok(w) => {
                                eprintln!(
                                    "gpuvm: {name}: snapshot written to {} after {exits_here} exits ({} of {} RAM pages non-zero, {:.1} ms)",
                                    dir.display(),
                                    w.data_pages,
                                    w.ram_bytes / snapshot::PAGE,
                                    w.write_ns as f64 / 1e6
                                );
                                info.handoff = Some(Handoff::Snapshot(w));
                                break End::HandedOff;
                            }
                            Err(e) => {
                                if let Some(seam) = vgpu.snapshot() {
                                    seam.resume();
                                }
                                handoff_failed(
                                    info,
                                    &gvm,
                                    &name,
                                    "snapshot",
                                    format!("to {}: {e:#}", dir.display()),
                                )
                            }
                        }
                    }
                    Outgoing::Migrate { .. } => {
                        if let Some(mut s) = source.take() {
                            match s.hand_over(captured.map_err(|e| format!("{e:#}"))) {
                                Ok(mut st) => {
                                    st.downtime_ns = paused.elapsed().as_nanos() as u64;
                                    eprintln!(
                                        "gpuvm: {name}: migrated to {}: {} rounds, {} bytes, {:.1} ms in all, downtime {:.1} ms",
                                        st.socket.display(),
                                        st.rounds.len(),
                                        st.bytes,
                                        st.total_ns as f64 / 1e6,
                                        st.downtime_ns as f64 / 1e6
                                    );
                                    info.handoff = Some(Handoff::Migration(st));
                                    break End::HandedOff;
                                }
                                Err(e) => {
                                    handoff_failed(info, &gvm, &name, "migration", format!("{e:#}"))
                                }
                            }
                        }
                    }
                }
            }
        }
        if let Err(msg) = sync_ram(&gvm) {
            break End::Stop(msg);
        }
        if opts.coalesce {
            if let Err(msg) =
                drain_coalesced(&mut vcpu, &windows, &**vgpu, &mut ex, remap.as_mut(), &name)
            {
                break End::Stop(msg);
            }
        }
        if pci.take_dirty() {
            let new = BarWindows::from_config(&pci);
            if new != windows {
                windows = new;
                if opts.coalesce {
                    set_zones(&gvm.fd, &mut zones, windows.coalesce_zones(remap.is_some()));
                }
            }
        }
        if let (Some(r), Some(v)) = (remap.as_mut(), vgpu.vgpu()) {
            r.update(&gvm.fd, v, &windows);
        }
        if let Some(msg) = vgpu.failure() {
            break End::Stop(msg);
        }
        if let Some(stall) = setup
            .stall
            .filter(|&s| kicker.fired() && kicker.since_exit() > s)
        {
            break End::Stop(format!(
                "{name}: no exit for {stall:?} (kicked out of KVM_RUN: it was spinning without exits): VM stopped"
            ));
        }
        if Instant::now() > deadline {
            break End::Stop(format!(
                "{name}: still running after {:?}{}: VM stopped",
                timeout,
                match kicker.since_exit() {
                    // Only the kick brought it back: it was spinning without exits.
                    quiet if kicker.fired() && quiet >= Duration::from_millis(50) => format!(
                        " (kicked out of KVM_RUN: no exit for {} ms)",
                        quiet.as_millis()
                    ),
                    _ => String::new(),
                }
            ));
        }
        // What to do after the exit, once the vCPU's borrow has ended.
        enum After {
            Go,
            Exit(u32),
            Stop(String),
            Fault(&'static str),
            /// An MMIO read of `len` bytes at the address.
            Read(u64, usize),
            /// An MMIO write of the first `len` bytes.
            Write(u64, [u8; 8], usize),
        }
        let run = vcpu.run();
        if !matches!(&run, Err(e) if e.errno() == libc::EINTR) {
            // A kick's EINTR is not the guest's progress.
            kicker.exited();
            exits_here += 1;
        }
        let mut ram_err = match &run {
            Ok(VcpuExit::MmioRead(..)) | Ok(VcpuExit::MmioWrite(..)) => sync_ram(&gvm).err(),
            _ => None,
        };
        let after = match run {
            Ok(VcpuExit::IoOut(port, data)) => {
                ex.pio += 1;
                match port {
                    p if serial::PORTS.contains(&p) => {
                        let _ = uart.write((p - serial::PORT_BASE) as u8, data[0]);
                        After::Go
                    }
                    pci::PORT_ADDR..=0xcff => {
                        pci.io_write(port, data);
                        After::Go
                    }
                    abi::PORT_EXIT => After::Exit(le_u32(data)),
                    abi::PORT_PHASE => {
                        marks.push(mark(le_u32(data), &ex));
                        After::Go
                    }
                    _ => After::Go,
                }
            }
            Ok(VcpuExit::IoIn(port, data)) => {
                ex.pio += 1;
                match port {
                    p if serial::PORTS.contains(&p) => {
                        data[0] = uart.read((p - serial::PORT_BASE) as u8);
                    }
                    pci::PORT_ADDR..=0xcff => pci.io_read(port, data),
                    abi::PORT_GATE => {
                        data.fill(0);
                        data[0] = ctx.gate.poll(&mut at_gate) as u8;
                    }
                    _ => data.fill(0xff),
                }
                After::Go
            }
            // With `record`, the guest's RAM writes go into the trace before the access.
            _ if ram_err.is_some() => After::Stop(ram_err.take().unwrap_or_default()),
            // Handled below, once the vCPU's borrow has ended and the coalesced ring is drained.
            Ok(VcpuExit::MmioRead(addr, data)) => After::Read(addr, data.len().min(8)),
            Ok(VcpuExit::MmioWrite(addr, data)) => {
                let mut b = [0u8; 8];
                let n = data.len().min(8);
                b[..n].copy_from_slice(&data[..n]);
                After::Write(addr, b, n)
            }
            Ok(VcpuExit::Shutdown) => After::Fault("the guest faulted (KVM_EXIT_SHUTDOWN: an exception it cannot handle in ring 3)"),
            Ok(VcpuExit::Hlt) => After::Fault("the guest halted"),
            Ok(VcpuExit::InternalError) => After::Fault("KVM internal error (an instruction the hypervisor cannot emulate)"),
            Ok(VcpuExit::FailEntry(reason, _)) => After::Stop(format!(
                "{name}: KVM could not enter the guest (hardware entry failure {reason:#x}): VM stopped"
            )),
            Ok(VcpuExit::Intr) => {
                ex.other += 1;
                After::Go
            }
            Ok(other) => After::Stop(format!("{name}: unexpected exit {other:?}: VM stopped")),
            Err(e) if e.errno() == 4 || e.errno() == 11 => {
                ex.other += 1;
                After::Go
            }
            Err(e) => After::Stop(format!("{name}: KVM_RUN failed: {e}: VM stopped")),
        };
        // KVM queues coalesced writes without exiting: those in the ring now are stores the
        // guest made before this access, so they reach the device first (QEMU flushes the ring
        // before handling any MMIO exit for the same reason).
        if opts.coalesce && matches!(after, After::Read(..) | After::Write(..)) {
            if let Err(msg) =
                drain_coalesced(&mut vcpu, &windows, &**vgpu, &mut ex, remap.as_mut(), &name)
            {
                break End::Stop(msg);
            }
        }
        match after {
            After::Go => {}
            After::Read(addr, len) => {
                let mut buf = [0u8; 8];
                let data = &mut buf[..len];
                let done = if ecam::read(&pci, addr, data) {
                    ex.ecam += 1;
                    true
                } else if windows.read(&**vgpu, addr, data) {
                    ex.mmio_reads += 1;
                    true
                } else if addr & !0xfff == abi::NULL_MMIO {
                    ex.other += 1;
                    data.fill(0);
                    true
                } else {
                    false
                };
                if !done {
                    break End::Stop(format!(
                        "{name}: guest read {len} bytes at {addr:#x}, outside the vGPU's BARs ({}): VM stopped",
                        windows.describe()
                    ));
                }
                complete_mmio_read(&mut vcpu, data);
            }
            After::Write(addr, buf, len) => {
                let data = &buf[..len];
                if ecam::write(&mut pci, addr, data) {
                    ex.ecam += 1;
                } else if windows.write(&**vgpu, addr, data) {
                    ex.mmio_writes += 1;
                    if let Some(r) = remap.as_mut() {
                        r.note_write(addr);
                    }
                } else if addr & !0xfff == abi::NULL_MMIO {
                    ex.other += 1;
                } else {
                    break End::Stop(format!(
                        "{name}: guest wrote {len} bytes at {addr:#x}, outside the vGPU's BARs ({}): VM stopped",
                        windows.describe()
                    ));
                }
            }
            After::Exit(code) => break End::Exit(code),
            After::Stop(msg) => break End::Stop(msg),
            After::Fault(what) => {
                let rip = vcpu.get_regs().map(|r| r.rip).unwrap_or(0);
                log::debug!("{name}: regs {:?}", vcpu.get_regs());
                log::debug!("{name}: sregs {:?}", vcpu.get_sregs());
                break End::Stop(format!("{name}: {what} at rip {rip:#x}: VM stopped"));
            }
        }
    };
    if opts.coalesce {
        if let Err(msg) =
            drain_coalesced(&mut vcpu, &windows, &**vgpu, &mut ex, remap.as_mut(), &name)
        {
            log::warn!("{msg}");
        }
    }
    let wall = start.elapsed();
    info.kicked = kicker.fired();
    drop(kicker);
    ctx.gate.leave(&mut at_gate);
    if let Some(mut r) = remap {
        r.clear(&gvm.fd);
        info.remap = Some(r.stats);
    }
    let regs = vcpu.get_regs().ok();
    info.final_rip = regs.map(|r| r.rip);
    info.final_rsp = regs.map(|r| r.rsp);
    if fence_irq {
        info.final_rflags = regs.map_or(0, |r| r.rflags);
        if let Ok(lapic) = vcpu.get_lapic() {
            let reg = |off: usize| -> u32 {
                let b: Vec<u8> = lapic.regs[off..off + 4].iter().map(|&c| c as u8).collect();
                u32::from_le_bytes([b[0], b[1], b[2], b[3]])
            };
            let v = IRQ_VECTOR as usize;
            let bit = 1u32 << (v % 32);
            info.final_lapic = format!(
                "SVR {:#x}, ISR[{v:#x}] {}, IRR[{v:#x}] {}",
                reg(0xf0),
                reg(0x100 + (v / 32) * 0x10) & bit != 0,
                reg(0x200 + (v / 32) * 0x10) & bit != 0
            );
        }
    }
    uart.writer_mut().finish();
    if let Some(mut s) = source.take() {
        // The guest ended (or was stopped) while pre-copy ran.
        let e = match s.join() {
            Ok(_) => "the guest ended before the migration stopped it".to_string(),
            Err(e) => format!("{e:#}"),
        };
        handoff_failed(info, &gvm, &name, "migration", e);
    }
    let handed_off = matches!(stop, End::HandedOff);
    match stop {
        End::Exit(code) => info.exit_code = Some(code),
        End::Stop(msg) => {
            eprintln!("gpuvm: {msg}");
            info.stopped = Some(msg);
        }
        End::HandedOff => {}
    }
    if !handed_off && marks.last().is_none_or(|m| m.phase != abi::PHASE_DONE) {
        marks.push(mark(abi::PHASE_DONE, &ex));
    }
    info.wall_ns = wall.as_nanos() as u64;
    info.exits = ex;
    let mmio = ex.mmio_reads + ex.mmio_writes;
    info.ns_per_mmio_exit = info.wall_ns.checked_div(mmio).unwrap_or(0);
    info.fence_irq = gvm.read_u32(abi::RESULTS_HEADER + abi::H_FENCE_IRQ) == 1;
    info.irqs_seen = gvm.read_u64(abi::RESULTS_HEADER + abi::H_IRQS);
    info.kernels = gvm.read_u64(abi::RESULTS_HEADER + abi::H_KERNELS);
    info.kernels_submitted = gvm.read_u64(abi::RESULTS_HEADER + abi::H_SUBMITTED);
    info.irqs_raised = vgpu.irqs_raised();
    info.calibration = calibration(marks, opts.calibrate);
    info.console = std::mem::take(&mut uart.writer_mut().lines);
    *ram_out = Some(gvm);
    Ok(())
}

/// Records a snapshot or migration that failed; the guest goes on in this process.
pub(super) fn handoff_failed(
    info: &mut KvmVmInfo,
    gvm: &vm::GuestVm,
    name: &str,
    what: &str,
    e: String,
) {
    if what == "migration" {
        if let Err(e) = gvm.set_dirty_log(false) {
            log::warn!("{name}: turning dirty logging off: {e:#}");
        }
    }
    let msg = format!("{name}: {what} failed: {e}; the guest goes on here");
    eprintln!("gpuvm: {msg}");
    info.handoff_error = Some(msg);
}

/// Answers an MMIO read exit after the exit's borrow of the vCPU ended (the coalesced ring had
/// to be drained first): the value goes where KVM_RUN returns it to the guest.
pub(super) fn complete_mmio_read(vcpu: &mut VcpuFd, data: &[u8]) {
    let run = vcpu.get_kvm_run();
    // SAFETY: the last KVM_RUN returned KVM_EXIT_MMIO for a read (this is only called then), so
    // `mmio` is the active member of the exit union; `data` is at most 8 bytes, its array's size.
    let mmio = unsafe { &mut run.__bindgen_anon_1.mmio };
    let n = data.len().min(mmio.data.len());
    mmio.data[..n].copy_from_slice(&data[..n]);
}

/// Replays the writes KVM queued in the coalesced MMIO ring, in order, before anything else
/// the vCPU did is handled.
pub(super) fn drain_coalesced(
    vcpu: &mut VcpuFd,
    windows: &BarWindows,
    vgpu: &dyn VgpuDevice,
    ex: &mut ExitCounts,
    mut remap: Option<&mut remap::Remap>,
    name: &str,
) -> Result<(), String> {
    loop {
        match vcpu.coalesced_mmio_read() {
            Ok(Some(e)) => {
                let len = (e.len as usize).min(e.data.len());
                if !windows.write(vgpu, e.phys_addr, &e.data[..len]) {
                    return Err(format!(
                        "{name}: guest wrote {len} bytes at {:#x}, outside the vGPU's BARs ({}): VM stopped",
                        e.phys_addr,
                        windows.describe()
                    ));
                }
                ex.mmio_writes += 1;
                ex.coalesced_writes += 1;
                if let Some(r) = remap.as_deref_mut() {
                    r.note_write(e.phys_addr);
                }
            }
            Ok(None) => return Ok(()),
            Err(e) => return Err(format!("{name}: reading the coalesced MMIO ring: {e}")),
        }
    }
}

/// Replaces the registered coalesced-MMIO zones with `new`.
pub(super) fn set_zones(vm: &VmFd, zones: &mut Vec<(u64, u64)>, new: Vec<(u64, u64)>) {
    for &(addr, size) in zones.iter() {
        if let Err(e) = vm.unregister_coalesced_mmio(IoEventAddress::Mmio(addr), size as u32) {
            log::warn!("KVM_UNREGISTER_COALESCED_MMIO {addr:#x}+{size:#x}: {e}");
        }
    }
    zones.clear();
    for (addr, size) in new {
        match vm.register_coalesced_mmio(IoEventAddress::Mmio(addr), size as u32) {
            Ok(()) => zones.push((addr, size)),
            Err(e) => log::warn!("KVM_REGISTER_COALESCED_MMIO {addr:#x}+{size:#x}: {e}"),
        }
    }
}

pub(super) fn le_u32(data: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    for (d, s) in b.iter_mut().zip(data) {
        *d = *s;
    }
    u32::from_le_bytes(b)
}
