//! Recording in-process: [`RecordingHal`] wraps a VM's driver HAL (today [`crate::VirtHal`])
//! and logs every access the driver makes — BAR reads and writes, guest-RAM reads and writes, and every
//! step of its waiting (clock movements, device-model polls, interrupt-line checks) — into a
//! `gpuvm_trace::Session`, with one sequence number per session (why the waits are recorded:
//! `gpuvm_trace::record`).

use std::sync::{Arc, MutexGuard};

use gpuvm_guest::hal::{Bar, Dma, Mmio, Platform};

use gpuvm::clock::Clock;
use gpuvm::irq::IrqFlag;
use gpuvm::phys::PhysicalGpu;
use gpuvm::vgpu::Vgpu;
use gpuvm_trace::format::{Event, Header, Op, Trace, DMA_CHUNK};
use gpuvm_trace::Session;

use crate::hal::{sim_wait_step, split64_read, split64_write, InProcessHal};

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

impl RecordingHal<InProcessHal<Arc<Vgpu>>> {
    /// Records `hal` (a VM's HAL, a [`crate::VirtHal`], running on `clock`) into `session`; `vm`
    /// is the VM's index in the session.
    pub fn new(
        hal: InProcessHal<Arc<Vgpu>>,
        clock: Arc<dyn Clock>,
        session: Arc<Session>,
        vm: u32,
    ) -> Self {
        let vgpu = hal.device().clone();
        let irq = hal.irq().clone();
        let header = session.header(vm, vgpu.profile(), hal.base() + hal.size());
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
        self.session.submit(trace);
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

/// `Platform` as [`crate::VirtHal`] implements it, with every poll, clock movement and look at the
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
