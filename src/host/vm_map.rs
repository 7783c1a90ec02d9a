//! The VMs' state by id, each behind a lock of its own (`HostState::vms`).
//!
//! Two ways in:
//! - **With the host lock** (every management call, every access with host-level effects,
//!   every service of the GPU): [`VmMap::get_mut`], [`VmMap::values_mut`], [`VmMap::get`] and
//!   [`VmMap::values`] lock the VMs they return, one guard each.
//! - **Without it** (the fast path of `host::local`: a guest access that involves only its own
//!   VM): the vGPU holds its [`VmCell`] and locks just that. Many VMs' accesses run side by
//!   side this way; an access and the host's work on the same VM take turns on its lock.
//!
//! The lock order is in `crate::vgpu::cell`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::sched::VmId;
use crate::vgpu::cell::{LineDirty, VmCell, VmGuard};
use crate::vgpu::VmState;

/// The VMs by id, each behind its own lock, and the VMs whose interrupt line may have to
/// change.
#[derive(Default)]
pub(crate) struct VmMap(BTreeMap<VmId, Arc<VmCell>>, Arc<LineDirty>);

impl VmMap {
    /// VM `id`, locked (`&mut self`: the borrow checker keeps a second guard of the map from
    /// being taken while this one lives).
    pub(crate) fn get_mut(&mut self, id: &VmId) -> Option<VmGuard<'_>> {
        self.0.get(id).map(|c| c.lock())
    }

    /// Every VM, each locked as the iterator reaches it, in id order.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = VmGuard<'_>> {
        self.0.values().map(|c| c.lock())
    }

    /// VM `id`, locked. Drop the guard before locking the same VM again.
    pub(crate) fn get(&self, id: &VmId) -> Option<VmGuard<'_>> {
        self.0.get(id).map(|c| c.lock())
    }

    /// Every VM, each locked as the iterator reaches it, in id order (drop each guard before
    /// the next is taken, or collect: the order is the lock order).
    pub(crate) fn values(&self) -> impl Iterator<Item = VmGuard<'_>> {
        self.0.values().map(|c| c.lock())
    }

    /// The cells, for counters read without locking the VMs.
    pub(crate) fn cells(&self) -> impl Iterator<Item = &Arc<VmCell>> {
        self.0.values()
    }

    pub(crate) fn contains_key(&self, id: &VmId) -> bool {
        self.0.contains_key(id)
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds VM `id`; returns its cell (for its vGPU).
    pub(crate) fn insert(&mut self, id: VmId, vm: VmState) -> Arc<VmCell> {
        let cell = Arc::new(VmCell::new(id, vm, self.1.clone()));
        // A VM that starts with its line to raise (a restored one) is recorded as any change.
        drop(cell.lock());
        self.0.insert(id, cell.clone());
        cell
    }

    /// The VMs whose interrupt line may differ from the level last applied (each was
    /// unlocked with its registers' level differing from it), taken.
    pub(crate) fn take_line_dirty(&self) -> Vec<VmId> {
        self.1.take()
    }

    /// Removes VM `id` from the map; its vGPU may still hold the cell (marked gone by the
    /// caller).
    pub(crate) fn remove(&mut self, id: &VmId) -> Option<Arc<VmCell>> {
        self.0.remove(id)
    }
}
