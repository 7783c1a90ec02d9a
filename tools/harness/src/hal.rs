//! The in-process HAL: the guest driver's `Mmio` / `Dma` / `Platform` traits on any device the
//! harness drives inside this process.
//!
//! [`InProcessHal`] is generic over an [`InProcessDevice`] — "a device with BARs": byte-level
//! BAR reads and writes, a poll that lets it make progress, and the time of its next event. Two
//! devices exist: [`BareGpu`], the physical (simulated) GPU with no virtualization in between
//! ([`crate::native::NativeHal`]), and `Arc<Vgpu>`, a VM's virtual GPU
//! ([`crate::virt::VirtHal`]). What the HAL adds is the same for both:
//!
//! - every BAR access is counted ([`MmioCounts`]); a 64-bit access is two 32-bit bus cycles on
//!   BAR0 (two counted accesses) and one 8-byte access on BAR1/BAR3 ([`split64_read`] /
//!   [`split64_write`], which the trace recorder uses too);
//! - DMA is guest RAM (`vm-memory`) at bus address == GPA; accesses outside it are counted as
//!   DMA errors and read all-ones;
//! - `delay_ns` lets the clock pass and polls the device; `wait_for_interrupt` polls and checks
//!   the interrupt line, and with a simulated clock jumps straight to the device's next event
//!   (or the deadline, [`sim_wait_step`]), so interrupt-driven waits cost no wall time and stay
//!   deterministic.

use std::sync::Arc;

use gpuvm_guest::hal::{Bar, Dma, Mmio, Platform};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use gpuvm::clock::Clock;
use gpuvm::irq::{IrqFlag, IrqLine};
use gpuvm::phys::PhysicalGpu;
use gpuvm::vgpu::Vgpu;

/// BAR access counters of an [`InProcessHal`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MmioCounts {
    /// BAR reads (any BAR, any width).
    pub reads: u64,
    /// BAR writes (any BAR, any width).
    pub writes: u64,
}

/// A device with BARs that the in-process harness drives.
pub trait InProcessDevice {
    /// Reads `data.len()` bytes (4 on BAR0; 4 or 8 on BAR1/BAR3) at `offset` of `bar`.
    fn bar_read(&self, bar: Bar, offset: u64, data: &mut [u8]);
    /// Writes `data` at `offset` of `bar` (widths as for [`InProcessDevice::bar_read`]).
    fn bar_write(&self, bar: Bar, offset: u64, data: &[u8]);
    /// Lets the device make progress and deliver what it finished.
    fn poll(&self);
    /// When something next happens without anyone touching the device (`None`: nothing pending).
    fn next_event_ns(&self) -> Option<u64>;
    /// Connects the device's interrupt line.
    fn set_irq_line(&self, line: Arc<dyn IrqLine>);
}

/// The physical GPU itself as an [`InProcessDevice`]: BAR0 through its registers (offsets
/// beyond 32 bits read [`gf100::BAD_REGISTER`] and drop writes), BAR1/BAR3 through its
/// apertures.
pub struct BareGpu(pub Arc<dyn PhysicalGpu>);

impl InProcessDevice for BareGpu {
    fn bar_read(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        match bar {
            Bar::Bar0 => {
                for (i, c) in data.chunks_mut(4).enumerate() {
                    let v = match u32::try_from(offset + 4 * i as u64) {
                        Ok(off) => self.0.read_reg(off),
                        Err(_) => gf100::BAD_REGISTER,
                    };
                    c.copy_from_slice(&v.to_le_bytes()[..c.len()]);
                }
            }
            Bar::Bar1 | Bar::Bar3 => self.0.read_aperture(bar, offset, data),
        }
    }

    fn bar_write(&self, bar: Bar, offset: u64, data: &[u8]) {
        match bar {
            Bar::Bar0 => {
                for (i, c) in data.chunks(4).enumerate() {
                    let mut b = [0u8; 4];
                    b[..c.len()].copy_from_slice(c);
                    if let Ok(off) = u32::try_from(offset + 4 * i as u64) {
                        self.0.write_reg(off, u32::from_le_bytes(b));
                    }
                }
            }
            Bar::Bar1 | Bar::Bar3 => self.0.write_aperture(bar, offset, data),
        }
    }

    fn poll(&self) {
        self.0.poll();
    }

    fn next_event_ns(&self) -> Option<u64> {
        self.0.next_event_ns()
    }

    fn set_irq_line(&self, line: Arc<dyn IrqLine>) {
        self.0.set_irq_line(line);
    }
}

/// A VM's virtual GPU: BAR accesses are exits into the device model; the next event includes
/// the end of the scheduler's deliberate wait ([`Vgpu::next_event_ns`]).
impl InProcessDevice for Arc<Vgpu> {
    fn bar_read(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        Vgpu::bar_read(self, bar, offset, data);
    }

    fn bar_write(&self, bar: Bar, offset: u64, data: &[u8]) {
        Vgpu::bar_write(self, bar, offset, data);
    }

    fn poll(&self) {
        Vgpu::poll(self);
    }

    fn next_event_ns(&self) -> Option<u64> {
        Vgpu::next_event_ns(self)
    }

    fn set_irq_line(&self, line: Arc<dyn IrqLine>) {
        Vgpu::set_irq_line(self, line);
    }
}

/// A 64-bit read as the bus sees it: on BAR0 two 32-bit cycles (low word first), on BAR1/BAR3
/// one 8-byte access. `read(offset, width)` performs one access.
pub(crate) fn split64_read(bar: Bar, offset: u64, mut read: impl FnMut(u64, u8) -> u64) -> u64 {
    if bar == Bar::Bar0 {
        let lo = read(offset, 4) & 0xffff_ffff;
        let hi = read(offset + 4, 4) & 0xffff_ffff;
        hi << 32 | lo
    } else {
        read(offset, 8)
    }
}

/// A 64-bit write as the bus sees it (see [`split64_read`]). `write(offset, width, value)`
/// performs one access.
pub(crate) fn split64_write(
    bar: Bar,
    offset: u64,
    value: u64,
    mut write: impl FnMut(u64, u8, u64),
) {
    if bar == Bar::Bar0 {
        write(offset, 4, value & 0xffff_ffff);
        write(offset + 4, 4, value >> 32);
    } else {
        write(offset, 8, value)
    }
}

/// How far a simulated clock at `now` moves while waiting for an interrupt until `deadline`:
/// to the device's next event (nothing can change before it), or to the deadline, and at least
/// 1 ns.
pub(crate) fn sim_wait_step(now: u64, deadline: u64, next_event: Option<u64>) -> u64 {
    next_event.unwrap_or(deadline).clamp(now + 1, deadline) - now
}

/// The driver's hardware abstraction on an in-process device `D`.
pub struct InProcessHal<D> {
    dev: D,
    clock: Arc<dyn Clock>,
    mem: GuestMemoryMmap,
    dma_base: u64,
    dma_size: u64,
    irq: Arc<IrqFlag>,
    counts: MmioCounts,
    dma_errors: u64,
    /// Host time spent in the driver's waits (`Platform::delay_ns`, `wait_for_interrupt`),
    /// polls included, ns.
    waited_ns: u64,
}

impl<D: InProcessDevice> InProcessHal<D> {
    /// Wraps `dev`, which runs on `clock`, with guest RAM `mem` of which `[dma_base, dma_base +
    /// dma_size)` is handed to the driver for DMA, and connects the device's interrupt line to a
    /// flag this HAL waits on.
    pub fn with_device(
        dev: D,
        clock: Arc<dyn Clock>,
        mem: GuestMemoryMmap,
        dma_base: u64,
        dma_size: u64,
    ) -> Self {
        let irq = Arc::new(IrqFlag::new());
        dev.set_irq_line(irq.clone());
        InProcessHal {
            dev,
            clock,
            mem,
            dma_base,
            dma_size,
            irq,
            waited_ns: 0,
            counts: MmioCounts::default(),
            dma_errors: 0,
        }
    }
}

impl<D> InProcessHal<D> {
    /// The device underneath.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// BAR accesses so far.
    pub fn counts(&self) -> MmioCounts {
        self.counts
    }

    /// Guest-RAM accesses by the driver that fell outside guest RAM (a driver bug if nonzero).
    pub fn dma_errors(&self) -> u64 {
        self.dma_errors
    }

    /// Host time the driver has spent waiting so far — for its fences, flush slots and other
    /// bounded polls, the polls of the device between included — ns.
    pub fn waited_ns(&self) -> u64 {
        self.waited_ns
    }

    /// The interrupt line the device drives.
    pub fn irq(&self) -> &Arc<IrqFlag> {
        &self.irq
    }
}

impl<D: InProcessDevice> InProcessHal<D> {
    fn access_read(&mut self, bar: Bar, offset: u64, width: u8) -> u64 {
        self.counts.reads += 1;
        let mut b = [0u8; 8];
        self.dev.bar_read(bar, offset, &mut b[..width as usize]);
        u64::from_le_bytes(b)
    }

    fn access_write(&mut self, bar: Bar, offset: u64, width: u8, value: u64) {
        self.counts.writes += 1;
        self.dev
            .bar_write(bar, offset, &value.to_le_bytes()[..width as usize]);
    }
}

impl<D: InProcessDevice> Mmio for InProcessHal<D> {
    fn read32(&mut self, bar: Bar, offset: u64) -> u32 {
        self.access_read(bar, offset, 4) as u32
    }

    fn write32(&mut self, bar: Bar, offset: u64, value: u32) {
        self.access_write(bar, offset, 4, value as u64)
    }

    fn read64(&mut self, bar: Bar, offset: u64) -> u64 {
        split64_read(bar, offset, |off, w| self.access_read(bar, off, w))
    }

    fn write64(&mut self, bar: Bar, offset: u64, value: u64) {
        split64_write(bar, offset, value, |off, w, v| {
            self.access_write(bar, off, w, v)
        })
    }
}

impl<D> Dma for InProcessHal<D> {
    fn base(&self) -> u64 {
        self.dma_base
    }

    fn size(&self) -> u64 {
        self.dma_size
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) {
        if self.mem.read_slice(buf, GuestAddress(addr)).is_err() {
            self.dma_errors += 1;
            buf.fill(0xff);
        }
    }

    fn write(&mut self, addr: u64, data: &[u8]) {
        if self.mem.write_slice(data, GuestAddress(addr)).is_err() {
            self.dma_errors += 1;
        }
    }
}

impl<D: InProcessDevice> Platform for InProcessHal<D> {
    fn delay_ns(&mut self, ns: u64) {
        let t = std::time::Instant::now();
        self.clock.wait_ns(ns);
        self.dev.poll();
        self.waited_ns += t.elapsed().as_nanos() as u64;
    }

    fn wait_for_interrupt(&mut self, timeout_ns: u64) -> bool {
        let t = std::time::Instant::now();
        let r = self.wait_for_interrupt_inner(timeout_ns);
        self.waited_ns += t.elapsed().as_nanos() as u64;
        r
    }

    fn has_interrupts(&self) -> bool {
        true
    }
}

impl<D: InProcessDevice> InProcessHal<D> {
    fn wait_for_interrupt_inner(&mut self, timeout_ns: u64) -> bool {
        let deadline = self.clock.now_ns().saturating_add(timeout_ns);
        loop {
            self.dev.poll();
            if self.irq.is_asserted() {
                return true;
            }
            let now = self.clock.now_ns();
            if now >= deadline {
                return false;
            }
            if self.clock.is_simulated() {
                // With several VMs, other threads share the clock and may move it too; that only
                // shortens the wait.
                let step = sim_wait_step(now, deadline, self.dev.next_event_ns());
                self.clock.wait_ns(step);
            } else {
                std::thread::yield_now();
            }
        }
    }
}
