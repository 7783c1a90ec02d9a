//! Interrupt output: the small trait through which a device raises its interrupt line, in the
//! style of vm-superio's `Trigger`. A VMM implements it (for example backed by an `EventFd` for
//! KVM irqfd); tests use [`IrqFlag`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A level-triggered interrupt line.
pub trait IrqLine: Send + Sync {
    /// Sets the line's level: `true` asserted, `false` deasserted. Called on every change.
    fn set_level(&self, asserted: bool);
}

/// An interrupt line that remembers its level and counts rising edges.
#[derive(Debug, Default)]
pub struct IrqFlag {
    level: AtomicBool,
    edges: AtomicU64,
}

impl IrqFlag {
    /// A deasserted line.
    pub fn new() -> IrqFlag {
        IrqFlag::default()
    }

    /// The current level.
    pub fn is_asserted(&self) -> bool {
        self.level.load(Ordering::SeqCst)
    }

    /// How many times the line went from deasserted to asserted.
    pub fn rising_edges(&self) -> u64 {
        self.edges.load(Ordering::SeqCst)
    }
}

impl IrqLine for IrqFlag {
    fn set_level(&self, asserted: bool) {
        let was = self.level.swap(asserted, Ordering::SeqCst);
        if asserted && !was {
            self.edges.fetch_add(1, Ordering::SeqCst);
        }
    }
}
