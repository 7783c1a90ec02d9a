//! The vGPU's interrupt line as UML virt-pci interrupt messages.
//!
//! UML posts empty buffers on the interrupt queue (queue 1); on each rising edge of the
//! vGPU's level-triggered line the backend fills one with an INT message, or an MSI message
//! carrying the MSI data the guest programmed when MSI is enabled, returns it and signals the
//! queue. An edge with no buffer posted is kept pending and delivered when UML posts one.
//! The line is called from inside the device model, so it never calls back into the vGPU:
//! the MSI state is a snapshot the backend refreshes after every config-space write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use gpuvm::irq::IrqLine;
use vhost_user_backend::{VringRwLock, VringT};
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};

use crate::wire;

/// The guest memory the queues live in.
pub type Mem = GuestMemoryAtomic<GuestMemoryMmap>;

#[derive(Default)]
struct Inner {
    vring: Option<VringRwLock<Mem>>,
    mem: Option<Mem>,
    level: bool,
    pending: u64,
    msi: Option<u16>,
}

/// The interrupt line of one VM's vGPU towards UML.
#[derive(Default)]
pub struct UmlIrq {
    inner: Mutex<Inner>,
    edges: AtomicU64,
    delivered: AtomicU64,
    failed: AtomicU64,
}

impl std::fmt::Debug for UmlIrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UmlIrq")
            .field("edges", &self.edges())
            .field("delivered", &self.delivered())
            .finish()
    }
}

impl UmlIrq {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connects the interrupt queue and the memory it lives in (each new connection).
    pub fn attach(&self, vring: VringRwLock<Mem>, mem: Mem) {
        let mut g = self.lock();
        g.vring = Some(vring);
        g.mem = Some(mem);
        self.deliver(&mut g);
    }

    /// Forgets the queue, the level, pending edges and the MSI state (disconnect, new vGPU).
    pub fn reset(&self) {
        *self.lock() = Inner::default();
    }

    /// The MSI data to send with, or `None` for INTx.
    pub fn set_msi(&self, msi: Option<u16>) {
        self.lock().msi = msi;
    }

    /// UML posted buffers on the interrupt queue: deliver pending edges.
    pub fn kick(&self) {
        let mut g = self.lock();
        self.deliver(&mut g);
    }

    /// Rising edges seen.
    pub fn edges(&self) -> u64 {
        self.edges.load(Ordering::SeqCst)
    }

    /// Interrupt messages delivered to UML.
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::SeqCst)
    }

    /// Interrupt buffers UML posted that could not be written (too small, bad address).
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::SeqCst)
    }

    fn deliver(&self, g: &mut Inner) {
        let (Some(vring), Some(mem)) = (g.vring.clone(), g.mem.clone()) else {
            return;
        };
        let mut signalled = false;
        while g.pending > 0 {
            let msg = wire::irq_message(g.msi);
            let m = mem.memory();
            let chain = vring
                .get_mut()
                .get_queue_mut()
                .pop_descriptor_chain(m.clone());
            let Some(chain) = chain else { break };
            let head = chain.head_index();
            let mut written = 0usize;
            for d in chain.clone() {
                if !d.is_write_only() || written == msg.len() {
                    continue;
                }
                let n = (d.len() as usize).min(msg.len() - written);
                if m.write_slice(&msg[written..written + n], d.addr()).is_err() {
                    break;
                }
                written += n;
            }
            let ok = written == msg.len();
            if ok {
                g.pending -= 1;
                self.delivered.fetch_add(1, Ordering::SeqCst);
            } else {
                // The buffer was the guest's to get right; it is returned empty.
                self.failed.fetch_add(1, Ordering::SeqCst);
            }
            let _ = vring.add_used(head, if ok { written as u32 } else { 0 });
            signalled = true;
        }
        if signalled {
            let _ = vring.signal_used_queue();
        }
    }
}

impl IrqLine for UmlIrq {
    fn set_level(&self, asserted: bool) {
        let mut g = self.lock();
        if asserted && !g.level {
            self.edges.fetch_add(1, Ordering::SeqCst);
            g.pending = (g.pending + 1).min(64);
            self.deliver(&mut g);
        }
        g.level = asserted;
    }
}
