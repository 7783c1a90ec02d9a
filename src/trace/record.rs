//! Recording: [`RecordingHal`] wraps a VM's driver HAL (today [`VirtHal`]) and logs every
//! access the driver makes — BAR reads and writes, guest-RAM reads and writes, and every step of
//! its waiting (clock movements, device-model polls, interrupt-line checks) — with one global
//! sequence number per [`Session`].
//!
//! **Why the waits are recorded.** On the simulated clock a run is a pure function of the order
//! of the calls into the device model and of the clock value at each; the driver's `Platform`
//! calls move the clock and poll the host, so they are part of that order. The wrapper therefore
//! implements `Platform` itself (the same loop as [`VirtHal`]'s) so that each poll and each
//! clock jump is recorded at its place. A session-wide lock is held across each recorded call,
//! so with several VMs (threads) the sequence numbers are the order the device model saw.

use std::sync::{Arc, Mutex, MutexGuard};

use gpuvm_guest::hal::{Bar, Dma, Mmio, Platform};

use crate::clock::{Clock, SimClock};
use crate::harness::hal::{sim_wait_step, split64_read, split64_write};
use crate::harness::VirtHal;
use crate::host::HostConfig;
use crate::irq::IrqFlag;
use crate::phys::PhysicalGpu;
use crate::vgpu::Vgpu;

use super::format::{self, Event, Header, Op, Trace, DMA_CHUNK};

/// A recording session: the VMs recorded together share its sequence counter and lock.
#[derive(Debug)]
pub struct Session {
    id: String,
    vms: u32,
    phys_vram: u64,
    host: HostConfig,
    note: String,
    seq: Mutex<u64>,
    traces: Mutex<Vec<Trace>>,
}

impl Session {
    /// A session for `vms` VMs on a GPU with `phys_vram` bytes and host settings `host`;
    /// `note` (no spaces) says how the traces were made.
    pub fn new(vms: u32, phys_vram: u64, host: &HostConfig, note: &str) -> Arc<Session> {
        let id = format!(
            "{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
                ^ (std::process::id() as u64) << 40
        );
        Arc::new(Session {
            id,
            vms,
            phys_vram,
            host: host.clone(),
            note: note.replace(char::is_whitespace, "_"),
            seq: Mutex::new(0),
            traces: Mutex::new(Vec::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, u64> {
        self.seq.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The traces of the VMs whose HALs were dropped, ordered by VM.
    pub fn traces(&self) -> Vec<Trace> {
        let mut t = self
            .traces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        t.sort_by_key(|t| t.header.vm);
        t
    }

    /// Writes one file per VM into `dir` (`vm<N>.mmiotrace`, plus `.gz` if `gzip`); returns
    /// the paths.
    pub fn write_dir(
        &self,
        dir: &std::path::Path,
        gzip: bool,
    ) -> std::io::Result<Vec<std::path::PathBuf>> {
        std::fs::create_dir_all(dir)?;
        let mut out = Vec::new();
        for t in self.traces() {
            let name = format!(
                "vm{}.mmiotrace{}",
                t.header.vm,
                if gzip { ".gz" } else { "" }
            );
            let p = dir.join(name);
            let mut text = Vec::new();
            format::write(&t, &mut text)?;
            super::compress::write(&p, &text)?;
            out.push(p);
        }
        Ok(out)
    }
}

/// The driver's HAL with every access recorded. Dropping it hands the trace to the session.
pub struct RecordingHal<H> {
    inner: H,
    session: Arc<Session>,
    vgpu: Arc<Vgpu>,
    irq: Arc<IrqFlag>,
    clock: Arc<dyn Clock>,
    phys: Arc<dyn PhysicalGpu>,
    header: Header,
    events: Vec<Event>,
}

impl RecordingHal<VirtHal> {
    /// Records `hal` (a VM's HAL, running on `clock`) into `session`; `vm` is the VM's index in
    /// the session.
    pub fn new(hal: VirtHal, clock: Arc<dyn Clock>, session: Arc<Session>, vm: u32) -> Self {
        let vgpu = hal.vgpu().clone();
        let irq = hal.irq().clone();
        let header = Header {
            vm,
            vms: session.vms,
            session: session.id.clone(),
            profile: vgpu.profile().clone(),
            guest_ram: hal.base() + hal.size(),
            phys_vram: session.phys_vram,
            hypervisor_vram: session.host.hypervisor_vram,
            iova_window: session.host.iova_window,
            max_inflight: session.host.max_inflight,
            note: session.note.clone(),
        };
        RecordingHal {
            phys: vgpu.phys().clone(),
            inner: hal,
            session,
            vgpu,
            irq,
            clock,
            header,
            events: Vec::with_capacity(1 << 16),
        }
    }
}

impl<H> RecordingHal<H> {
    /// The wrapped HAL.
    pub fn inner(&self) -> &H {
        &self.inner
    }

    /// Adds an informational marker (a phase name) to the trace.
    pub fn mark(&mut self, text: &str) {
        let time_ns = self.clock.now_ns();
        self.events.push(Event {
            line: 0,
            seq: 0,
            time_ns,
            op: Op::Mark(text.to_string()),
        });
    }

    fn push(&mut self, seq: &mut MutexGuard<'_, u64>, op: Op) {
        **seq += 1;
        self.events.push(Event {
            line: 0,
            seq: **seq,
            time_ns: self.clock.now_ns(),
            op,
        });
    }
}

impl<H> Drop for RecordingHal<H> {
    fn drop(&mut self) {
        let trace = Trace {
            header: self.header.clone(),
            events: std::mem::take(&mut self.events),
        };
        self.session
            .traces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(trace);
    }
}

impl<H: Mmio> RecordingHal<H> {
    fn read(&mut self, bar: Bar, offset: u64, width: u8) -> u64 {
        let session = self.session.clone();
        let mut g = session.lock();
        let value = match width {
            4 => self.inner.read32(bar, offset) as u64,
            _ => self.inner.read64(bar, offset),
        };
        self.push(
            &mut g,
            Op::Read {
                bar,
                offset,
                width,
                value,
            },
        );
        value
    }

    fn write(&mut self, bar: Bar, offset: u64, width: u8, value: u64) {
        let session = self.session.clone();
        let mut g = session.lock();
        match width {
            4 => self.inner.write32(bar, offset, value as u32),
            _ => self.inner.write64(bar, offset, value),
        }
        self.push(
            &mut g,
            Op::Write {
                bar,
                offset,
                width,
                value,
            },
        );
        drop(g);
        if bar == Bar::Bar1 && offset & 0xfff == gf100::userd::GP_PUT {
            self.mark("submit");
        }
    }
}

impl<H: Mmio> Mmio for RecordingHal<H> {
    fn read32(&mut self, bar: Bar, offset: u64) -> u32 {
        self.read(bar, offset, 4) as u32
    }

    fn write32(&mut self, bar: Bar, offset: u64, value: u32) {
        self.write(bar, offset, 4, value as u64)
    }

    // 8-byte accesses: on BAR0 two 32-bit bus cycles (recorded as two lines, as the device saw
    // them), on BAR1/BAR3 one 8-byte access (as `VirtHal` does).
    fn read64(&mut self, bar: Bar, offset: u64) -> u64 {
        split64_read(bar, offset, |off, width| self.read(bar, off, width))
    }

    fn write64(&mut self, bar: Bar, offset: u64, value: u64) {
        split64_write(bar, offset, value, |off, width, v| {
            self.write(bar, off, width, v)
        })
    }
}

impl<H: Dma> Dma for RecordingHal<H> {
    fn base(&self) -> u64 {
        self.inner.base()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) {
        let session = self.session.clone();
        let mut g = session.lock();
        self.inner.read(addr, buf);
        for (i, c) in buf.chunks(DMA_CHUNK).enumerate() {
            let gpa = addr + (i * DMA_CHUNK) as u64;
            self.push(
                &mut g,
                Op::DmaRead {
                    gpa,
                    data: c.to_vec(),
                },
            );
        }
    }

    fn write(&mut self, addr: u64, data: &[u8]) {
        let session = self.session.clone();
        let mut g = session.lock();
        self.inner.write(addr, data);
        for (i, c) in data.chunks(DMA_CHUNK).enumerate() {
            let gpa = addr + (i * DMA_CHUNK) as u64;
            self.push(
                &mut g,
                Op::DmaWrite {
                    gpa,
                    data: c.to_vec(),
                },
            );
        }
    }
}

/// `Platform` as [`VirtHal`] implements it, with every poll, clock movement and look at the
/// interrupt line recorded.
impl<H> Platform for RecordingHal<H> {
    fn delay_ns(&mut self, ns: u64) {
        let session = self.session.clone();
        let mut g = session.lock();
        self.clock.wait_ns(ns);
        let now = self.clock.now_ns();
        self.push(&mut g, Op::Clock { ns: now });
        self.vgpu.poll();
        self.push(&mut g, Op::Poll);
    }

    fn wait_for_interrupt(&mut self, timeout_ns: u64) -> bool {
        self.mark("fence-wait");
        let deadline = self.clock.now_ns().saturating_add(timeout_ns);
        let session = self.session.clone();
        loop {
            let mut g = session.lock();
            self.vgpu.poll();
            self.push(&mut g, Op::Poll);
            let asserted = self.irq.is_asserted();
            self.push(&mut g, Op::Irq { asserted });
            if asserted {
                return true;
            }
            let now = self.clock.now_ns();
            if now >= deadline {
                return false;
            }
            if self.clock.is_simulated() {
                let step = sim_wait_step(now, deadline, self.phys.next_event_ns());
                self.clock.wait_ns(step);
                let now = self.clock.now_ns();
                self.push(&mut g, Op::Clock { ns: now });
            } else {
                drop(g);
                std::thread::yield_now();
            }
        }
    }

    fn has_interrupts(&self) -> bool {
        true
    }
}

/// Records one VM's accesses as a VMM's exits deliver them (installed as the vGPU's
/// [`crate::vgpu::AccessTap`]), for VMMs whose guest driver runs in a real VM (the KVM VMM's
/// `run --kvm --record`).
///
/// **Determinism.** The host must run on a [`SimClock`] that only this session moves: before
/// each access the recorder steps it to the wall time elapsed since `epoch` and records the
/// step as a `Clock` record, so the device model sees the same clock values in replay. Guest
/// RAM that the device may read (pushbuffers, GPFIFO entries, copy sources) changes without
/// exits; the VMM reports what the guest wrote with [`TapRecorder::guest_wrote`] before the
/// access that follows (the KVM VMM finds it with KVM's dirty-page log), and it becomes
/// `gpuvm-dmaw` side records. Nothing else may poll the host while recording (no sampler
/// thread), because a poll outside every VM's trace could not be replayed.
pub struct TapRecorder {
    session: Arc<Session>,
    clock: Arc<SimClock>,
    epoch: std::time::Instant,
    header: Header,
    events: Mutex<Vec<Event>>,
}

impl TapRecorder {
    /// A recorder for VM `vm` of `session` (its vGPU `vgpu`, `guest_ram` bytes of RAM at GPA
    /// 0), stepping `clock` to the time elapsed since `epoch`.
    pub fn new(
        session: Arc<Session>,
        vgpu: &Vgpu,
        vm: u32,
        guest_ram: u64,
        clock: Arc<SimClock>,
        epoch: std::time::Instant,
    ) -> Arc<TapRecorder> {
        let header = Header {
            vm,
            vms: session.vms,
            session: session.id.clone(),
            profile: vgpu.profile().clone(),
            guest_ram,
            phys_vram: session.phys_vram,
            hypervisor_vram: session.host.hypervisor_vram,
            iova_window: session.host.iova_window,
            max_inflight: session.host.max_inflight,
            note: session.note.clone(),
        };
        Arc::new(TapRecorder {
            session,
            clock,
            epoch,
            header,
            events: Mutex::new(Vec::with_capacity(1 << 16)),
        })
    }

    fn events(&self) -> MutexGuard<'_, Vec<Event>> {
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves the clock to the elapsed wall time (never backwards) and records the step.
    fn step_clock(&self, seq: &mut MutexGuard<'_, u64>, ev: &mut Vec<Event>) {
        let wall = self.epoch.elapsed().as_nanos() as u64;
        if wall > self.clock.now_ns() {
            self.clock.advance_to(wall);
            push(seq, ev, wall, Op::Clock { ns: wall });
        }
    }

    /// Records bytes the guest wrote to its RAM at `gpa` since the last call (before the
    /// access that may make the device read them).
    pub fn guest_wrote(&self, gpa: u64, data: &[u8]) {
        let mut g = self.session.lock();
        let mut ev = self.events();
        let now = self.clock.now_ns();
        for (i, c) in data.chunks(DMA_CHUNK).enumerate() {
            let op = Op::DmaWrite {
                gpa: gpa + (i * DMA_CHUNK) as u64,
                data: c.to_vec(),
            };
            push(&mut g, &mut ev, now, op);
        }
    }

    /// Destroys the VM's vGPU with `perform` (the VMM's `GpuHost::destroy_vgpu`) as a recorded
    /// step, in order with every VM's accesses.
    pub fn destroy(&self, perform: impl FnOnce()) {
        let mut g = self.session.lock();
        let mut ev = self.events();
        self.step_clock(&mut g, &mut ev);
        perform();
        push(&mut g, &mut ev, self.clock.now_ns(), Op::Destroy);
    }

    /// Adds an informational marker (a phase name) to the trace.
    pub fn mark(&self, text: &str) {
        let now = self.clock.now_ns();
        self.events().push(Event {
            line: 0,
            seq: 0,
            time_ns: now,
            op: Op::Mark(text.to_string()),
        });
    }

    /// Hands the trace recorded so far to the session (call once, when the VM is done).
    pub fn finish(&self) {
        let trace = Trace {
            header: self.header.clone(),
            events: std::mem::take(&mut *self.events()),
        };
        self.session
            .traces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(trace);
    }
}

fn push(seq: &mut MutexGuard<'_, u64>, ev: &mut Vec<Event>, time_ns: u64, op: Op) {
    **seq += 1;
    ev.push(Event {
        line: 0,
        seq: **seq,
        time_ns,
        op,
    });
}

fn le_value(data: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = data.len().min(8);
    b[..n].copy_from_slice(&data[..n]);
    u64::from_le_bytes(b)
}

impl crate::vgpu::AccessTap for TapRecorder {
    fn read(&self, bar: Bar, offset: u64, data: &mut [u8], perform: &mut dyn FnMut(&mut [u8])) {
        let mut g = self.session.lock();
        let mut ev = self.events();
        self.step_clock(&mut g, &mut ev);
        perform(data);
        let op = Op::Read {
            bar,
            offset,
            width: data.len() as u8,
            value: le_value(data),
        };
        push(&mut g, &mut ev, self.clock.now_ns(), op);
    }

    fn write(&self, bar: Bar, offset: u64, data: &[u8], perform: &mut dyn FnMut(&[u8])) {
        let mut g = self.session.lock();
        let mut ev = self.events();
        self.step_clock(&mut g, &mut ev);
        perform(data);
        let now = self.clock.now_ns();
        let op = Op::Write {
            bar,
            offset,
            width: data.len() as u8,
            value: le_value(data),
        };
        push(&mut g, &mut ev, now, op);
        if bar == Bar::Bar1 && offset & 0xfff == gf100::userd::GP_PUT {
            ev.push(Event {
                line: 0,
                seq: 0,
                time_ns: now,
                op: Op::Mark("submit".into()),
            });
        }
    }
}
