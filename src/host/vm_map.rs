//! The VMs' state, each behind a lock of its own (`HostState::vms`).
//!
//! Two ways in, one rule that makes them safe together:
//! - **Holding the host lock for writing** (every management call, every access with host-level
//!   effects, every service of the GPU) gives `&mut HostState`, so [`VmMap::get_mut`] and
//!   [`VmMap::values_mut`] reach a VM's state through `Mutex::get_mut`: no locking at all, since
//!   nobody else can hold any VM's lock while the host lock is held for writing.
//! - **Holding it for reading** (the fast path of `host::local`: a guest register access that
//!   touches only its own VM) gives `&HostState`, and [`VmMap::lock`] takes that one VM's lock.
//!   Many VMs' accesses run side by side this way; two accesses of one VM take turns.
//!
//! Lock order: host lock, then one VM lock. Nothing holds a VM lock while it waits for the host
//! lock, and no path holds two VM locks at once ([`VmMap::get`] and [`VmMap::values`] lock too:
//! use them with `&HostState` only where the host lock is held, and drop each guard before the
//! next). `tests/lock_stress.rs` exercises every path at once.

use std::collections::BTreeMap;

use parking_lot::{Mutex, MutexGuard};

use crate::sched::VmId;
use crate::vgpu::VmState;

/// The VMs by id, each behind its own lock.
#[derive(Default)]
pub(crate) struct VmMap(BTreeMap<VmId, Mutex<VmState>>);

impl VmMap {
    /// VM `id`'s state (host lock held for writing: no lock taken).
    pub(crate) fn get_mut(&mut self, id: &VmId) -> Option<&mut VmState> {
        self.0.get_mut(id).map(Mutex::get_mut)
    }

    /// Every VM's state, by id (host lock held for writing: no lock taken).
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut VmState> {
        self.0.values_mut().map(Mutex::get_mut)
    }

    /// VM `id`'s state, locked.
    pub(crate) fn get(&self, id: &VmId) -> Option<MutexGuard<'_, VmState>> {
        self.0.get(id).map(Mutex::lock)
    }

    /// VM `id`'s state, locked (the fast path, under the host lock held for reading).
    pub(crate) fn lock(&self, id: &VmId) -> Option<MutexGuard<'_, VmState>> {
        self.get(id)
    }

    /// Every VM's state by id, each locked in turn (drop each guard before taking the next).
    pub(crate) fn values(&self) -> impl Iterator<Item = MutexGuard<'_, VmState>> {
        self.0.values().map(Mutex::lock)
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

    pub(crate) fn insert(&mut self, id: VmId, vm: VmState) {
        self.0.insert(id, Mutex::new(vm));
    }

    pub(crate) fn remove(&mut self, id: &VmId) -> Option<VmState> {
        self.0.remove(id).map(Mutex::into_inner)
    }
}
