//! Deterministic replay: a fresh [`GpuHost`] on a simulated GF100 and a [`SimClock`], one
//! [`Vgpu`] per trace (profile and host settings from the trace headers), and the recorded calls
//! issued again in the recorded global order — BAR reads and writes, the driver's guest-RAM
//! writes, device-model polls and clock movements.
//!
//! On the simulated clock a run is a function of exactly those calls, so replaying **all traces
//! of a session** reproduces every read bit for bit, PTIMER included ([`Role::Exact`]).
//! Replaying a subset, or traces next to a mutated one, changes when the GPU finishes work;
//! then [`Role::Sync`] applies (documented in `docs/trace-format.md`, "Replay"):
//!
//! * PTIMER / PFIFO TIME reads and BAR1 reads of the GPU-time words of a 16-byte semaphore
//!   release (offsets 8 and 12 modulo 16) are compared loosely (never a divergence: they
//!   measure time);
//! * a read that differs is retried while the simulated clock jumps to the GPU's next event
//!   and the host is polled (the VM "keeps polling", as its driver did), until it returns the
//!   recorded value;
//! * a value that a *later* read of the same location returned in the recording is accepted
//!   (the VM is ahead: its work finished earlier than when it was recorded);
//! * a read that can reach neither is "unsynced" — a lost or corrupted result.
//!
//! [`Role::Guilty`] reads are not compared (the trace was mutated; its VM's view diverges).

use std::collections::BTreeMap;
use std::sync::Arc;

use gf100::pci::Bar;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use gpuvm::addr::HostVram;
use gpuvm::clock::{Clock, SimClock};
use gpuvm::host::{GpuHost, HostConfig, HostStats};
use gpuvm::irq::IrqFlag;
use gpuvm::phys::PhysicalGpu;
use gpuvm::vgpu::{Vgpu, VgpuStats};
use gpuvm_sim::{SimConfig, SimGpu};

use crate::format::{Op, Trace};

/// How a trace's reads are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Every read must return the recorded value.
    Exact,
    /// Reads are synchronized with the recording (see the module documentation).
    Sync,
    /// Reads are issued but not compared.
    Guilty,
}

/// A read that returned something else than recorded.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Divergence {
    /// The VM (trace header `vm`).
    pub vm: u32,
    /// Line in the trace file.
    pub line: usize,
    /// Global sequence number.
    pub seq: u64,
    /// The phase (last `gpuvm-phase` mark) it happened in.
    pub phase: String,
    /// The register or memory location.
    pub what: String,
    /// The recorded value.
    pub expected: String,
    /// What the replay returned.
    pub got: String,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "vm{} line {} ({}): {}: recorded {}, replay {}",
            self.vm, self.line, self.phase, self.what, self.expected, self.got
        )
    }
}

/// Per-VM replay counters.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct VmReplay {
    /// The VM (trace header `vm`).
    pub vm: u32,
    /// Events issued.
    pub events: u64,
    /// BAR and guest-RAM reads compared.
    pub reads: u64,
    /// Reads that differed ([`Role::Exact`]) or could not be synchronized ([`Role::Sync`]).
    pub mismatches: u64,
    /// [`Role::Sync`]: reads that matched only after waiting for the GPU.
    pub synced: u64,
    /// [`Role::Sync`]: reads that returned a later recorded state.
    pub ahead: u64,
    /// Time-register reads compared loosely.
    pub loose: u64,
    /// True if the trace destroyed its VM.
    pub destroyed: bool,
    /// The vGPU's counters at the end of the replay (before teardown).
    pub stats: Option<VgpuStats>,
}

/// The result of a replay.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplayReport {
    /// One entry per trace.
    pub vms: Vec<VmReplay>,
    /// The first divergences (at most [`MAX_DIVERGENCES`]).
    pub divergences: Vec<Divergence>,
    /// All divergences.
    pub total_divergences: u64,
    /// Host counters after every VM was destroyed.
    pub host: HostStats,
    /// Resources not returned after teardown (empty: nothing leaked).
    pub leaks: Vec<String>,
}

/// Most divergences a report lists.
pub const MAX_DIVERGENCES: usize = 20;
/// Most GPU events a synchronizing read waits for.
const MAX_SYNC: u32 = 4096;

/// The name of a BAR location, for reports.
pub fn location_name(bar: Bar, offset: u64) -> String {
    match bar {
        Bar::Bar0 => {
            let name = u32::try_from(offset)
                .ok()
                .and_then(gpuvm::mmio::regions::lookup)
                .map(|r| {
                    if r.size > 4 {
                        format!("{}+{:#x}", r.name, offset - r.offset as u64)
                    } else {
                        r.name.to_string()
                    }
                })
                .unwrap_or_else(|| "unknown register".into());
            format!("BAR0 {offset:#08x} {name}")
        }
        Bar::Bar1 => {
            let o = offset & 0xfff;
            let f = match o {
                gf100::userd::GP_PUT => " (USERD GP_PUT?)",
                gf100::userd::GP_GET => " (USERD GP_GET?)",
                _ => "",
            };
            format!("BAR1 {offset:#x}{f}")
        }
        Bar::Bar3 => format!("BAR3 {offset:#x} (instance memory)"),
    }
}

fn is_time_register(bar: Bar, offset: u64) -> bool {
    use gf100::{pfifo, ptimer};
    bar == Bar::Bar0
        && [
            ptimer::TIME_LOW,
            ptimer::TIME_HIGH,
            pfifo::TIME_LOW,
            pfifo::TIME_HIGH,
        ]
        .iter()
        .any(|&r| offset / 4 == r as u64 / 4)
}

/// The GPU-time half of a 16-byte semaphore release (words 2 and 3) read through BAR1: what
/// the driver's timestamp queries read back.
fn is_release_timestamp(bar: Bar, offset: u64) -> bool {
    bar == Bar::Bar1 && matches!(offset % 16, 8 | 12)
}

struct Slot {
    trace: Arc<Trace>,
    role: Role,
    vgpu: Option<Arc<Vgpu>>,
    mem: GuestMemoryMmap,
    irq: Arc<IrqFlag>,
    rep: VmReplay,
    phase: String,
}

/// A replay in progress: the host, the VMs and the traces.
pub struct Replayer {
    clock: Arc<SimClock>,
    sim: Arc<SimGpu>,
    host: GpuHost,
    slots: Vec<Slot>,
    /// VMs of the session without a trace (created so that placement is as recorded).
    placeholders: Vec<Arc<Vgpu>>,
    initial: HostStats,
    offset_ns: u64,
    divergences: Vec<Divergence>,
    total_divergences: u64,
}

fn guest_ram(size: u64) -> Result<GuestMemoryMmap, String> {
    let len = usize::try_from(size).map_err(|e| e.to_string())?;
    GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), len)])
        .map_err(|e| format!("guest RAM of {size} bytes: {e}"))
}

impl Replayer {
    /// Builds the host and the VMs for `traces` (each with its role). All traces must describe
    /// the same host. `offset_ns` shifts every recorded clock value (used to find
    /// time-dependent memory).
    pub fn new(traces: Vec<(Arc<Trace>, Role)>, offset_ns: u64) -> Result<Replayer, String> {
        let Some((first, _)) = traces.first() else {
            return Err("no traces".into());
        };
        let h = first.header.clone();
        for (t, _) in &traces {
            let o = &t.header;
            if (
                o.phys_vram,
                o.hypervisor_vram,
                o.iova_window,
                o.max_inflight,
            ) != (
                h.phys_vram,
                h.hypervisor_vram,
                h.iova_window,
                h.max_inflight,
            ) {
                return Err(format!(
                    "traces of vm{} and vm{} describe different hosts",
                    h.vm, o.vm
                ));
            }
        }
        let mut by_vm = BTreeMap::new();
        for (t, r) in traces {
            let vm = t.header.vm;
            if by_vm.insert(vm, (t, r)).is_some() {
                return Err(format!("two traces for vm{vm}"));
            }
        }
        let n = by_vm
            .keys()
            .next_back()
            .map_or(0, |&v| v + 1)
            .max(by_vm.values().map(|(t, _)| t.header.vms).max().unwrap_or(0));
        let clock = Arc::new(SimClock::new());
        let sim = Arc::new(SimGpu::new(SimConfig {
            vram_size: h.phys_vram,
            clock: clock.clone(),
            ..SimConfig::default()
        }));
        let host = GpuHost::new(
            sim.clone(),
            HostConfig {
                hypervisor_vram: h.hypervisor_vram,
                iova_window: h.iova_window,
                max_inflight: h.max_inflight,
                // Not recorded in the header: traces are replayed with the default reservation.
                ..HostConfig::default()
            },
        )
        .map_err(|e| format!("host: {e}"))?;
        let initial = host.stats();
        let mut slots = Vec::new();
        let mut placeholders = Vec::new();
        for i in 0..n {
            match by_vm.remove(&i) {
                Some((trace, role)) => {
                    let vgpu = host
                        .create_vgpu(&trace.header.profile)
                        .map_err(|e| format!("vm{i}: {e}"))?;
                    let mem = guest_ram(trace.header.guest_ram)?;
                    vgpu.attach_guest_memory(mem.clone())
                        .map_err(|e| format!("vm{i}: {e}"))?;
                    let irq = Arc::new(IrqFlag::new());
                    vgpu.set_irq_line(irq.clone());
                    slots.push(Slot {
                        rep: VmReplay {
                            vm: i,
                            ..VmReplay::default()
                        },
                        trace,
                        role,
                        vgpu: Some(vgpu),
                        mem,
                        irq,
                        phase: "start".into(),
                    });
                }
                None => {
                    let mut p = h.profile.clone();
                    p.name = format!("placeholder{i}");
                    let vgpu = host.create_vgpu(&p).map_err(|e| format!("vm{i}: {e}"))?;
                    vgpu.attach_guest_memory(guest_ram(h.guest_ram)?)
                        .map_err(|e| format!("vm{i}: {e}"))?;
                    placeholders.push(vgpu);
                }
            }
        }
        Ok(Replayer {
            clock,
            sim,
            host,
            slots,
            placeholders,
            initial,
            offset_ns,
            divergences: Vec::new(),
            total_divergences: 0,
        })
    }

    /// The host.
    pub fn host(&self) -> &GpuHost {
        &self.host
    }

    /// The simulated GPU.
    pub fn sim(&self) -> &Arc<SimGpu> {
        &self.sim
    }

    /// The vGPU of the `i`-th trace (in VM order), if not destroyed.
    pub fn vgpu(&self, i: usize) -> Option<&Arc<Vgpu>> {
        self.slots.get(i).and_then(|s| s.vgpu.as_ref())
    }

    /// Issues every event of every trace in global sequence order (a merge of the traces,
    /// each of which is in sequence order; ties go to the lower VM).
    pub fn run(&mut self) {
        let traces: Vec<Arc<Trace>> = self.slots.iter().map(|s| s.trace.clone()).collect();
        let mut cur = vec![0usize; traces.len()];
        loop {
            let mut best: Option<(u64, usize)> = None;
            for (s, t) in traces.iter().enumerate() {
                let ev = &t.events;
                while cur[s] < ev.len() && ev[cur[s]].seq == 0 {
                    if let Op::Mark(m) = &ev[cur[s]].op {
                        self.slots[s].phase = m.clone();
                    }
                    cur[s] += 1;
                }
                if let Some(e) = ev.get(cur[s]) {
                    if best.is_none_or(|(q, _)| e.seq < q) {
                        best = Some((e.seq, s));
                    }
                }
            }
            let Some((_, s)) = best else { break };
            self.step(s, cur[s]);
            cur[s] += 1;
        }
        for s in &mut self.slots {
            s.rep.stats = s.vgpu.as_ref().map(|v| v.stats());
        }
    }

    fn diverge(&mut self, s: usize, line: usize, seq: u64, what: String, exp: String, got: String) {
        self.total_divergences += 1;
        self.slots[s].rep.mismatches += 1;
        if self.divergences.len() < MAX_DIVERGENCES {
            let slot = &self.slots[s];
            self.divergences.push(Divergence {
                vm: slot.rep.vm,
                line,
                seq,
                phase: slot.phase.clone(),
                what,
                expected: exp,
                got,
            });
        }
    }

    /// Lets the GPU reach its next event (for synchronizing reads); false if it has none.
    fn wait_gpu(&self) -> bool {
        // The host's next event: the GPU's, the scheduler's timer or the hang watchdog's deadline.
        match self.host.next_event_ns() {
            Some(t) => {
                let now = self.clock.now_ns();
                self.clock.advance_to(t.max(now + 1));
                self.host.poll();
                true
            }
            None => false,
        }
    }

    fn step(&mut self, s: usize, i: usize) {
        let slot = &self.slots[s];
        let Some(vgpu) = slot.vgpu.clone() else {
            return;
        };
        let role = slot.role;
        let ev = &slot.trace.events[i];
        let (line, seq) = (ev.line, ev.seq);
        let op = ev.op.clone();
        self.slots[s].rep.events += 1;
        match op {
            Op::Clock { ns } => self.clock.advance_to(ns + self.offset_ns),
            Op::Poll => vgpu.poll(),
            Op::Write {
                bar,
                offset,
                width,
                value,
            } => vgpu.bar_write(bar, offset, &value.to_le_bytes()[..width as usize]),
            Op::DmaWrite { gpa, data } => {
                let _ = self.slots[s].mem.write_slice(&data, GuestAddress(gpa));
            }
            Op::Destroy => {
                let _ = self.host.destroy_vgpu(&vgpu);
                self.slots[s].rep.stats = Some(vgpu.stats());
                self.slots[s].rep.destroyed = true;
                self.slots[s].vgpu = None;
            }
            Op::Mark(_) => {}
            Op::Irq { asserted } => {
                let got = self.slots[s].irq.is_asserted();
                if role == Role::Exact && got != asserted {
                    self.diverge(
                        s,
                        line,
                        seq,
                        "the VM's interrupt line".into(),
                        (asserted as u8).to_string(),
                        (got as u8).to_string(),
                    );
                }
            }
            Op::Read {
                bar,
                offset,
                width,
                value,
            } => {
                let read = |v: &Vgpu| {
                    let mut b = [0u8; 8];
                    v.bar_read(bar, offset, &mut b[..width as usize]);
                    u64::from_le_bytes(b)
                };
                let got = read(&vgpu);
                self.slots[s].rep.reads += 1;
                if role == Role::Guilty || got == value {
                    return;
                }
                if role == Role::Sync
                    && (is_time_register(bar, offset) || is_release_timestamp(bar, offset))
                {
                    self.slots[s].rep.loose += 1;
                    return;
                }
                if role == Role::Exact {
                    self.diverge(
                        s,
                        line,
                        seq,
                        location_name(bar, offset),
                        format!("{value:#x}"),
                        format!("{got:#x}"),
                    );
                    return;
                }
                let later = |v: u64| {
                    self.slots[s].trace.events[i + 1..].iter().any(|e| {
                        matches!(e.op, Op::Read { bar: b, offset: o, width: w, value: x }
                            if b == bar && o == offset && w == width && x == v)
                    })
                };
                let mut cur = got;
                let mut waited = false;
                for _ in 0..MAX_SYNC {
                    if cur == value {
                        self.slots[s].rep.synced += 1;
                        return;
                    }
                    if later(cur) {
                        self.slots[s].rep.ahead += 1;
                        return;
                    }
                    if !self.wait_gpu() {
                        break;
                    }
                    waited = true;
                    cur = read(&vgpu);
                }
                let _ = waited;
                self.diverge(
                    s,
                    line,
                    seq,
                    location_name(bar, offset),
                    format!("{value:#x}"),
                    format!("{cur:#x}"),
                );
            }
            Op::DmaRead { gpa, data } => {
                let mut buf = vec![0u8; data.len()];
                let read = |mem: &GuestMemoryMmap, buf: &mut [u8]| {
                    if mem.read_slice(buf, GuestAddress(gpa)).is_err() {
                        buf.fill(0xff);
                    }
                };
                read(&self.slots[s].mem, &mut buf);
                self.slots[s].rep.reads += 1;
                if role == Role::Guilty || buf == data {
                    return;
                }
                if role == Role::Sync {
                    let later = |b: &[u8]| {
                        self.slots[s].trace.events[i + 1..].iter().any(|e| {
                            matches!(&e.op, Op::DmaRead { gpa: g, data: d } if *g == gpa && d == b)
                        })
                    };
                    for _ in 0..MAX_SYNC {
                        if buf == data {
                            self.slots[s].rep.synced += 1;
                            return;
                        }
                        if later(&buf) {
                            self.slots[s].rep.ahead += 1;
                            return;
                        }
                        if !self.wait_gpu() {
                            break;
                        }
                        read(&self.slots[s].mem, &mut buf);
                    }
                }
                let first = buf.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(0);
                let show = |d: &[u8]| {
                    d[first..(first + 8).min(d.len())]
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                };
                self.diverge(
                    s,
                    line,
                    seq,
                    format!(
                        "guest RAM {:#x} (read of {} bytes)",
                        gpa + first as u64,
                        data.len()
                    ),
                    show(&data),
                    show(&buf),
                );
            }
        }
    }

    /// Lets the GPU finish everything queued (jumping the clock from event to event).
    pub fn settle(&self) {
        self.host.poll();
        for _ in 0..100_000 {
            if !self.wait_gpu() {
                break;
            }
        }
    }

    /// Calls `f(is_vram, offset, bytes)` for the `i`-th trace's VM's VRAM slice and guest RAM,
    /// 1 MiB at a time; false if the VM was destroyed.
    pub fn for_each_chunk(&self, i: usize, mut f: impl FnMut(bool, u64, &[u8])) -> bool {
        let Some(slot) = self.slots.get(i) else {
            return false;
        };
        let Some(v) = slot.vgpu.as_ref() else {
            return false;
        };
        let slice = v.vram_slice();
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0;
        while off < slice.size {
            let n = (slice.size - off).min(buf.len() as u64) as usize;
            self.sim
                .read_vram(HostVram(slice.base.raw() + off), &mut buf[..n]);
            f(true, off, &buf[..n]);
            off += n as u64;
        }
        off = 0;
        while off < slot.trace.header.guest_ram {
            let n = (slot.trace.header.guest_ram - off).min(buf.len() as u64) as usize;
            if slot
                .mem
                .read_slice(&mut buf[..n], GuestAddress(off))
                .is_err()
            {
                buf[..n].fill(0xff);
            }
            f(false, off, &buf[..n]);
            off += n as u64;
        }
        true
    }

    /// A copy of the `i`-th trace's VM's VRAM slice and guest RAM (`None` if destroyed).
    pub fn snapshot(&self, i: usize) -> Option<(Vec<u8>, Vec<u8>)> {
        let slot = self.slots.get(i)?;
        let v = slot.vgpu.as_ref()?;
        let slice = v.vram_slice();
        let mut vram = vec![0u8; slice.size as usize];
        self.sim.read_vram(HostVram(slice.base.raw()), &mut vram);
        let mut ram = vec![0u8; slot.trace.header.guest_ram as usize];
        let _ = slot.mem.read_slice(&mut ram, GuestAddress(0));
        Some((vram, ram))
    }

    /// Destroys every VM, lets the GPU settle and checks that everything was given back.
    pub fn finish(mut self) -> ReplayReport {
        self.settle();
        for s in &mut self.slots {
            if let Some(v) = s.vgpu.take() {
                let _ = self.host.destroy_vgpu(&v);
            }
        }
        for p in self.placeholders.drain(..) {
            let _ = self.host.destroy_vgpu(&p);
        }
        self.settle();
        let host = self.host.stats();
        let leaks = leaks(&self.initial, &host);
        ReplayReport {
            vms: self.slots.into_iter().map(|s| s.rep).collect(),
            divergences: self.divergences,
            total_divergences: self.total_divergences,
            host,
            leaks,
        }
    }
}

/// What `after` (no VM alive) holds that `before` (a fresh host) did not.
pub fn leaks(before: &HostStats, after: &HostStats) -> Vec<String> {
    let mut l = Vec::new();
    let mut check = |what: &str, a: u64, b: u64| {
        if a != b {
            l.push(format!("{what}: {b} after teardown, {a} on a fresh host"));
        }
    };
    check("VMs", before.vms as u64, after.vms as u64);
    check("free VRAM", before.vram_free, after.vram_free);
    check(
        "hypervisor VRAM in use (shadow pages, shadow instance blocks)",
        before.hypervisor_vram_used,
        after.hypervisor_vram_used,
    );
    check(
        "free channels",
        before.channels_free as u64,
        after.channels_free as u64,
    );
    check(
        "free DMA windows",
        before.dma_windows_free as u64,
        after.dma_windows_free as u64,
    );
    check("queued submissions", 0, after.queued as u64);
    check("submissions in flight", 0, after.inflight as u64);
    l
}

/// Replays `traces` (a whole session: [`Role::Exact`]; a subset: [`Role::Sync`]) and returns
/// the report.
pub fn replay(traces: Vec<Trace>, check: bool) -> Result<ReplayReport, String> {
    let whole = traces
        .first()
        .map(|t| {
            let n = t.header.vms as usize;
            traces.len() == n && traces.iter().all(|x| x.header.session == t.header.session)
        })
        .unwrap_or(false);
    let role = if check && whole {
        Role::Exact
    } else if check {
        Role::Sync
    } else {
        Role::Guilty
    };
    let mut r = Replayer::new(traces.into_iter().map(|t| (Arc::new(t), role)).collect(), 0)?;
    r.run();
    Ok(r.finish())
}
