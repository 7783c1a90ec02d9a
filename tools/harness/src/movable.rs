//! A VM's vGPU that can move: [`MovableVgpu`] is the in-process harness's stand-in for a VMM
//! that pauses a guest's vCPUs and later points its exits at another device. Every BAR access
//! of the guest driver goes through it; [`MovableVgpu::pause`] waits until no access is in
//! progress and holds new ones back; [`MovableVgpu::switch_to`] points it at the vGPU a
//! migration restored (moving the interrupt line there) and lets the guest go on;
//! [`MovableVgpu::unpause`] lets it go on where it was (a failed migration).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use gpuvm::irq::IrqLine;
use gpuvm::vgpu::Vgpu;
use gpuvm_guest::hal::Bar;

use crate::hal::InProcessDevice;

struct Slot {
    vgpu: Arc<Vgpu>,
    paused: bool,
    line: Option<Arc<dyn IrqLine>>,
    /// Switches to another vGPU so far.
    moves: u64,
}

/// A vGPU handle the harness can pause and repoint (cheap to clone; clones share the slot).
#[derive(Clone)]
pub struct MovableVgpu {
    slot: Arc<(Mutex<Slot>, Condvar)>,
}

impl MovableVgpu {
    /// A handle on `vgpu`.
    pub fn new(vgpu: Arc<Vgpu>) -> MovableVgpu {
        MovableVgpu {
            slot: Arc::new((
                Mutex::new(Slot {
                    vgpu,
                    paused: false,
                    line: None,
                    moves: 0,
                }),
                Condvar::new(),
            )),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The slot, once it is not paused (an access holds it for its whole duration).
    fn running(&self) -> MutexGuard<'_, Slot> {
        let mut g = self.lock();
        while g.paused {
            g = self.slot.1.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        g
    }

    /// The vGPU accesses go to now.
    pub fn current(&self) -> Arc<Vgpu> {
        self.lock().vgpu.clone()
    }

    /// Waits for the access in progress (if any) and holds back new ones.
    pub fn pause(&self) {
        self.running().paused = true;
    }

    /// Lets accesses go on to the same vGPU.
    pub fn unpause(&self) {
        self.lock().paused = false;
        self.slot.1.notify_all();
    }

    /// Points accesses at `vgpu` (its interrupt line connected) and lets them go on.
    pub fn switch_to(&self, vgpu: Arc<Vgpu>) {
        let mut g = self.lock();
        if let Some(line) = &g.line {
            vgpu.set_irq_line(line.clone());
        }
        g.vgpu = vgpu;
        g.moves += 1;
        g.paused = false;
        drop(g);
        self.slot.1.notify_all();
    }

    /// How many times the handle was switched to another vGPU.
    pub fn moves(&self) -> u64 {
        self.lock().moves
    }
}

impl InProcessDevice for MovableVgpu {
    fn bar_read(&self, bar: Bar, offset: u64, data: &mut [u8]) {
        self.running().vgpu.bar_read(bar, offset, data);
    }

    fn bar_write(&self, bar: Bar, offset: u64, data: &[u8]) {
        self.running().vgpu.bar_write(bar, offset, data);
    }

    fn poll(&self) {
        self.running().vgpu.poll();
    }

    fn next_event_ns(&self) -> Option<u64> {
        self.running().vgpu.next_event_ns()
    }

    fn set_irq_line(&self, line: Arc<dyn IrqLine>) {
        let mut g = self.lock();
        g.vgpu.set_irq_line(line.clone());
        g.line = Some(line);
    }
}
