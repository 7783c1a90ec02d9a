//! Recording sessions and the VMM-side recorder. A [`Session`] holds the traces of VMs recorded
//! together; [`TapRecorder`] records one VM's accesses as a VMM's exits deliver them. The
//! in-process recorder, `RecordingHal` in `gpuvm-harness`, wraps a VM's driver HAL and logs every
//! access the driver makes — BAR reads and writes, guest-RAM reads and writes, and every step of
//! its waiting (clock movements, device-model polls, interrupt-line checks) — with one global
//! sequence number per [`Session`].
//!
//! **Why the waits are recorded.** On the simulated clock a run is a pure function of the order
//! of the calls into the device model and of the clock value at each; the driver's `Platform`
//! calls move the clock and poll the host, so they are part of that order. The wrapper therefore
//! implements `Platform` itself (the same loop as `VirtHal`'s) so that each poll and each
//! clock jump is recorded at its place. A session-wide lock is held across each recorded call,
//! so with several VMs (threads) the sequence numbers are the order the device model saw.

use std::sync::{Arc, Mutex, MutexGuard};

use gpuvm::clock::{Clock, SimClock};
use gpuvm::host::HostConfig;
use gpuvm::phys::Bar;
use gpuvm::vgpu::Vgpu;

use crate::format::{self, Event, Header, Op, Trace, DMA_CHUNK};
use gpuvm::profile::VgpuProfile;

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

    /// The session's sequence counter, locked: a recorder holds it across each recorded call,
    /// so that with several VMs the sequence numbers are the order the device model saw.
    pub fn lock(&self) -> MutexGuard<'_, u64> {
        self.seq.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The trace header of VM `vm` of this session, whose vGPU has `profile` and whose guest
    /// RAM ends at `guest_ram`.
    pub fn header(&self, vm: u32, profile: &VgpuProfile, guest_ram: u64) -> Header {
        Header {
            vm,
            vms: self.vms,
            session: self.id.clone(),
            profile: profile.clone(),
            guest_ram,
            phys_vram: self.phys_vram,
            hypervisor_vram: self.host.hypervisor_vram,
            iova_window: self.host.iova_window,
            max_inflight: self.host.max_inflight,
            note: self.note.clone(),
        }
    }

    /// Hands a finished trace to the session.
    pub fn submit(&self, trace: Trace) {
        self.traces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(trace);
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
            crate::compress::write(&p, &text)?;
            out.push(p);
        }
        Ok(out)
    }
}

/// Records one VM's accesses as a VMM's exits deliver them (installed as the vGPU's
/// [`gpuvm::vgpu::AccessTap`]), for VMMs whose guest driver runs in a real VM (the KVM VMM's
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
        let header = session.header(vm, vgpu.profile(), guest_ram);
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

impl gpuvm::vgpu::AccessTap for TapRecorder {
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
