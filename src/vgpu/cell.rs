//! One VM's state behind its own lock ([`VmCell`]), shared by the host's map of VMs and the
//! VM's [`super::Vgpu`], and the lock order of the whole device model ([`order`]).
//!
//! **Lock order**: the host lock (`crate::host`), then VM locks in `VmId` order, then the
//! physical TLB flush's lock (`HostLayout::tlb_flush`, held across one flush's registers), then
//! the physical GPU's own lock (the simulator's). Nothing waits for the host lock while holding a
//! VM lock, and no path locks a VM it already holds. In debug builds both are checked: a
//! violation panics with the lock named instead of deadlocking; `tests/lock_stress.rs` runs
//! every path at once under that check.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use super::VmState;
use crate::sched::VmId;

/// One VM's state and lock, shared by the host's map and the VM's vGPU.
///
/// Aligned to 128 bytes (two cache lines, what adjacent-line prefetch pairs): every access of
/// a VM writes its lock word and its `fast_accesses` counter, and two VMs' cells allocated one
/// after the other must not share a line — measured on 2 cores (`gpuvm exp traps --vms 1,2`),
/// a layout where they did held two VMs to 1.14-1.37x one VM's access rate.
#[repr(align(128))]
pub(crate) struct VmCell {
    pub id: VmId,
    state: Mutex<VmState>,
    /// Accesses done on the fast path (`host::local`).
    pub fast_accesses: AtomicU64,
    /// Where a guard that leaves the VM's interrupt line differing from the level last
    /// applied records the VM (shared by every cell of one host: [`LineDirty`]).
    dirty: Arc<LineDirty>,
}

/// The VMs whose interrupt line may have to change: every guard dropped with the virtual
/// registers' level differing from the level last applied adds its VM. The host takes the list
/// at the end of each hold and recomputes those VMs' lines only (`HostState::line_changes`),
/// instead of locking every VM after every access.
#[derive(Default)]
pub(crate) struct LineDirty(Mutex<Vec<VmId>>);

impl LineDirty {
    /// The VMs recorded since the last call, in id order (the lock order).
    pub(crate) fn take(&self) -> Vec<VmId> {
        let mut v = std::mem::take(&mut *self.0.lock());
        v.sort_unstable();
        v
    }

    /// Records `id` once (a VM whose level differs is recorded by each of its guards until
    /// the next hold takes the list: the list stays one entry per VM).
    fn add(&self, id: VmId) {
        let mut v = self.0.lock();
        if !v.contains(&id) {
            v.push(id);
        }
    }
}

impl VmCell {
    /// A cell holding `vm`, recording line changes in `dirty`.
    pub(crate) fn new(id: VmId, vm: VmState, dirty: Arc<LineDirty>) -> VmCell {
        VmCell {
            id,
            state: Mutex::new(vm),
            fast_accesses: AtomicU64::new(0),
            dirty,
        }
    }

    /// Locks the VM (checked against the lock order in debug builds).
    pub(crate) fn lock(&self) -> VmGuard<'_> {
        order::acquiring_vm(self.id);
        VmGuard {
            guard: self.state.lock(),
            id: self.id,
            dirty: &self.dirty,
        }
    }
}

/// A VM's state, locked.
pub(crate) struct VmGuard<'a> {
    guard: MutexGuard<'a, VmState>,
    id: VmId,
    dirty: &'a LineDirty,
}

impl std::ops::Deref for VmGuard<'_> {
    type Target = VmState;
    fn deref(&self) -> &VmState {
        &self.guard
    }
}

impl std::ops::DerefMut for VmGuard<'_> {
    fn deref_mut(&mut self) -> &mut VmState {
        &mut self.guard
    }
}

impl Drop for VmGuard<'_> {
    fn drop(&mut self) {
        if self.guard.regs.line_level() != self.guard.line_level {
            self.dirty.add(self.id);
        }
        order::released_vm(self.id);
    }
}

/// The lock-order check of debug builds: which VM locks this thread holds, and whether it
/// holds the host lock. Release builds compile it to nothing.
pub(crate) mod order {
    use crate::sched::VmId;

    #[cfg(debug_assertions)]
    thread_local! {
        static HELD: std::cell::RefCell<Vec<VmId>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// About to lock VM `id`: it must not be held by this thread already.
    pub(crate) fn acquiring_vm(id: VmId) {
        #[cfg(debug_assertions)]
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            assert!(
                !h.contains(&id),
                "lock order: {id}'s lock taken twice by one thread (would deadlock)"
            );
            h.push(id);
        });
        #[cfg(not(debug_assertions))]
        let _ = id;
    }

    /// VM `id`'s lock released.
    pub(crate) fn released_vm(id: VmId) {
        #[cfg(debug_assertions)]
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().rposition(|&v| v == id) {
                h.remove(i);
            }
        });
        #[cfg(not(debug_assertions))]
        let _ = id;
    }

    /// About to wait for the host lock: no VM lock may be held (the order is host, then VM).
    pub(crate) fn acquiring_host() {
        #[cfg(debug_assertions)]
        HELD.with(|h| {
            let h = h.borrow();
            assert!(
                h.is_empty(),
                "lock order: the host lock waited for while holding the lock of {:?}",
                *h
            );
        });
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::order;
    use crate::sched::VmId;

    #[test]
    #[should_panic(expected = "taken twice")]
    fn a_vm_lock_taken_twice_by_one_thread_panics_instead_of_deadlocking() {
        order::acquiring_vm(VmId(7));
        order::acquiring_vm(VmId(7));
    }

    #[test]
    #[should_panic(expected = "host lock waited for while holding")]
    fn the_host_lock_after_a_vm_lock_panics() {
        order::acquiring_vm(VmId(3));
        order::acquiring_host();
    }

    #[test]
    fn the_order_host_then_vms_is_fine() {
        order::acquiring_host();
        order::acquiring_vm(VmId(1));
        order::acquiring_vm(VmId(2));
        order::released_vm(VmId(2));
        order::released_vm(VmId(1));
        order::acquiring_host();
    }
}
